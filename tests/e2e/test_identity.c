/* test_identity.c - users, tokens, projects and roles through the clients, against a real kilnd
 * over TLS with its bootstrap admin: `kiln login` and its 0600 profile, a viewer who sees only
 * its project's jobs and cannot submit, revoked and expired tokens, and the Python SDK's identity
 * methods (tests/sdk/test_sdk.py). kilnd runs alone: jobs stay QUEUED, which is all these tests
 * need, so they do not depend on agents. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/common/harness.h"
#include "tests/e2e/e2e.h"

static e2e_cluster_t id_cluster;
static char id_ca[PATH_MAX], id_cfg[PATH_MAX];

/* Starts kilnd with TLS and a bootstrap token file; false when it exited during start-up (a port
 * taken by a parallel test between th_free_port() and its bind). The child dies with this
 * process. */
static bool id_kilnd_try_start(void)
{
    e2e_cluster_t *c = e2e_cl;
    char http_addr[64], grpc_addr[64], cert[PATH_MAX], key[PATH_MAX], boot[PATH_MAX], log[PATH_MAX];
    c->http_port = th_free_port();
    c->grpc_port = th_free_port();
    snprintf(c->url, sizeof c->url, "https://127.0.0.1:%d", c->http_port);
    snprintf(http_addr, sizeof http_addr, "127.0.0.1:%d", c->http_port);
    snprintf(grpc_addr, sizeof grpc_addr, "127.0.0.1:%d", c->grpc_port);
    snprintf(cert, sizeof cert, "%s/server.pem", c->tls_dir);
    snprintf(key, sizeof key, "%s/server.key", c->tls_dir);
    snprintf(boot, sizeof boot, "%s/admin.token", c->dir);
    snprintf(log, sizeof log, "%s/kilnd.log", c->dir);
    char bin[PATH_MAX];
    const char *dir = th_bin_dir();
    snprintf(bin, sizeof bin, "%s%s%s/kilnd", dir[0] == '/' ? "" : e2e_root(), dir[0] == '/' ? "" : "/", dir);
    char *argv[] = {bin, "--database-url", c->db_url, "--http-addr", http_addr, "--grpc-addr", grpc_addr,
                    "--tls-cert", cert, "--tls-key", key, "--bootstrap-token-file", boot,
                    "--join-token-file", c->join_file, NULL};
    pid_t parent = getpid();
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    setpgid(pid, pid);
    c->kilnd = pid;
    char url[PATH_MAX];
    snprintf(url, sizeof url, "%s/readyz", c->url);
    for (int i = 0; i < 300; i++) {
        long st = 0;
        char *body = NULL;
        bool ok = th_http("GET", url, NULL, NULL, &st, &body, 2000) == 0 && st == 200;
        free(body);
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            c->kilnd = 0;
            return false;
        }
        if (ok) {
            char *tok = e2e_slurp(boot);
            tok[strcspn(tok, "\n")] = '\0';
            snprintf(c->admin_token, sizeof c->admin_token, "%s", tok);
            free(tok);
            cr_assert(c->admin_token[0], "kilnd wrote no bootstrap token");
            th_http_set_token(c->admin_token);
            return true;
        }
        usleep(100000);
    }
    e2e_dump_logs();
    cr_assert_fail("kilnd did not become ready at %s", url);
    return false;
}

static void id_setup(void)
{
    e2e_cluster_t *c = &id_cluster;
    memset(c, 0, sizeof *c);
    e2e_cl = c;
    /* Nothing of the environment the tests run in may reach kilnd or the clients: kilnd would
     * take KILN_TLS_CA as its own --tls-ca, kiln a KILN_TOKEN as the caller's. */
    static const char *const vars[] = {"KILN_URL", "KILN_TOKEN", "KILN_TLS_CA", "KILN_PROFILE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
    snprintf(c->dir, sizeof c->dir, "/tmp/kid.XXXXXX");
    cr_assert_not_null(mkdtemp(c->dir), "mkdtemp: %s", strerror(errno));
    /* kiln's saved logins live here, not in the home directory of whoever runs the tests */
    snprintf(id_cfg, sizeof id_cfg, "%s/cfg", c->dir);
    setenv("XDG_CONFIG_HOME", id_cfg, 1);
    c->db_url = th_pg_create_db("ident");
    cr_assert_not_null(c->db_url, "no test database (run through tests/run.sh)");
    const char *tls = th_tls_dir();
    cr_assert_not_null(tls, "no test certificates");
    snprintf(c->tls_dir, sizeof c->tls_dir, "%s", tls);
    snprintf(c->join_file, sizeof c->join_file, "%.127s/join.token", c->dir);
    snprintf(id_ca, sizeof id_ca, "%s/ca.pem", c->tls_dir);
    th_http_set_ca(id_ca);
    bool up = false;
    for (int attempt = 0; attempt < 3 && !up; attempt++)
        up = id_kilnd_try_start();
    if (!up) {
        e2e_dump_logs();
        cr_assert_fail("kilnd exited during start-up (3 tries)");
    }
}

/* ---- running kiln --------------------------------------------------------------------------------- */

/* Runs build/bin/kiln with args (NULL-terminated), the environment entries env (NULL-terminated)
 * added to this process's, and stdin from stdin_path (NULL: /dev/null). */
static int kiln_v(char *const env[], const char *stdin_path, char **out, char **err, va_list ap)
{
    char bin[PATH_MAX];
    const char *dir = th_bin_dir();
    snprintf(bin, sizeof bin, "%s%s%s/kiln", dir[0] == '/' ? "" : e2e_root(), dir[0] == '/' ? "" : "/", dir);
    char *argv[40];
    int n = 0;
    if (stdin_path) {
        /* e2e_run gives its children /dev/null as stdin: a shell puts the file there instead. */
        argv[n++] = "/bin/sh";
        argv[n++] = "-c";
        argv[n++] = "f=$1; shift; exec \"$@\" < \"$f\"";
        argv[n++] = "sh";
        argv[n++] = (char *)stdin_path;
    }
    argv[n++] = bin;
    for (char *a; n < 39 && (a = va_arg(ap, char *));)
        argv[n++] = a;
    argv[n] = NULL;
    return e2e_run(argv, env, out, err, 60000);
}

/* The environment of a client: kilnd's URL and CA, and token when not NULL. Static storage. */
static char **client_env(const char *token)
{
    static char url[128], ca[PATH_MAX + 16], tok[300];
    static char *env[4];
    int n = 0;
    snprintf(url, sizeof url, "KILN_URL=%s", e2e_cl->url);
    snprintf(ca, sizeof ca, "KILN_TLS_CA=%s", id_ca);
    env[n++] = url;
    env[n++] = ca;
    if (token) {
        snprintf(tok, sizeof tok, "KILN_TOKEN=%s", token);
        env[n++] = tok;
    }
    env[n] = NULL;
    return env;
}

/* kiln as the holder of token (NULL: none; URL and CA from the environment). */
static int kiln_as(const char *token, char **out, char **err, ...) __attribute__((sentinel));
static int kiln_as(const char *token, char **out, char **err, ...)
{
    va_list ap;
    va_start(ap, err);
    int rc = kiln_v(client_env(token), NULL, out, err, ap);
    va_end(ap);
    return rc;
}

/* kiln with only env (NULL-terminated, may be NULL) in the environment, and stdin from a file. */
static int kiln_env(char *const env[], const char *stdin_path, char **out, char **err, ...) __attribute__((sentinel));
static int kiln_env(char *const env[], const char *stdin_path, char **out, char **err, ...)
{
    va_list ap;
    va_start(ap, err);
    int rc = kiln_v(env, stdin_path, out, err, ap);
    va_end(ap);
    return rc;
}

#define ADMIN (e2e_cl->admin_token)

/* Runs kiln as the admin and expects exit 0; returns stdout (caller frees). */
static char *admin_ok(const char *a, const char *b, const char *c, const char *d, const char *e)
{
    char *out = NULL, *err = NULL;
    int rc = kiln_as(ADMIN, &out, &err, a, b, c, d, e, NULL);
    cr_assert_eq(rc, 0, "kiln %s %s %s %s: rc %d: %s", a, b ? b : "", c ? c : "", d ? d : "", rc, err);
    free(err);
    return out;
}

/* Creates user name as the admin and writes a new token of it into buf; returns buf. */
static const char *new_user_token(const char *name, char *buf, size_t n)
{
    free(admin_ok("users", "create", name, NULL, NULL));
    char *out = NULL, *err = NULL;
    cr_assert_eq(kiln_as(ADMIN, &out, &err, "tokens", "create", name, "--description", "e2e", NULL), 0, "%s", err);
    /* the token alone on stdout, the rest on stderr */
    /* (failure messages here never print the secret itself) */
    cr_assert(!strncmp(out, "kiln_", 5) && strchr(out, '\n') == out + strlen(out) - 1,
              "stdout is not one token line (%zu bytes)", strlen(out));
    cr_assert(strstr(err, "cannot be shown again"), "%s", err);
    cr_assert_null(strstr(err, "kiln_"), "the token went to stderr too: %s", err);
    snprintf(buf, n, "%.*s", (int)strcspn(out, "\n"), out);
    free(out);
    free(err);
    return buf;
}

static char *job_spec(const char *name, const char *project)
{
    static char spec[1024];
    snprintf(spec, sizeof spec,
             "{\"name\": \"%s\", \"project\": \"%s\", \"model\": {\"type\": \"mlp\", \"hidden\": [8], \"n_inputs\": 4,"
             " \"n_classes\": 2}, \"data\": {\"train\": \"synthetic\"}, \"hyperparameters\": {\"lr\": 0.01,"
             " \"global_batch_size\": 8, \"max_steps\": 5, \"seed\": 1}, \"resources\": {\"nodes\": 1,"
             " \"slots_per_node\": 1, \"slot_type\": \"cpu\"}, \"checkpoint\": {\"every_steps\": 0}}",
             name, project);
    return spec;
}

/* REST as the holder of token: the HTTP status. */
static long status_as(const char *token, const char *method, const char *path, const char *body)
{
    char hdr[320];
    snprintf(hdr, sizeof hdr, "Authorization: Bearer %s", token);
    long st = 0;
    json_decref(e2e_http(method, path, body, hdr, &st));
    return st;
}

static void assert_no_secret(const char *text, const char *secret, const char *where)
{
    cr_assert_null(strstr(text, secret), "%s holds a token's secret", where);
}

/* ---- login and profiles -------------------------------------------------------------------------------- */

Test(e2e_identity, login_saves_a_private_profile, .init = id_setup, .fini = e2e_teardown, .timeout = 180)
{
    char *out = NULL, *err = NULL;
    char url_env[128], ca_env[PATH_MAX + 16];
    snprintf(url_env, sizeof url_env, "KILN_URL=%s", e2e_cl->url);
    snprintf(ca_env, sizeof ca_env, "KILN_TLS_CA=%s", id_ca);
    char *where[] = {url_env, ca_env, NULL};

    /* No token anywhere: 401, the server's message and hint, and the way to log in. */
    cr_assert_eq(kiln_env(where, NULL, &out, &err, "whoami", NULL), 4);
    cr_assert(strstr(err, "error: this request needs an API token"), "%s", err);
    cr_assert(strstr(err, "hint: send \"Authorization: Bearer <token>\""), "%s", err);
    cr_assert(strstr(err, "note: kiln sent no token"), "%s", err);
    char want[2 * PATH_MAX];
    snprintf(want, sizeof want, "kiln login --url %s --tls-ca %s", e2e_cl->url, id_ca);
    cr_assert(strstr(err, want), "%s", err);
    free(out);
    free(err);

    /* kiln login < admin.token */
    char boot[PATH_MAX];
    snprintf(boot, sizeof boot, "%s/admin.token", e2e_cl->dir);
    cr_assert_eq(kiln_env(where, boot, &out, &err, "login", NULL), 0, "login: %s", err);
    snprintf(want, sizeof want, "logged in to %s as admin\n", e2e_cl->url);
    cr_assert(strstr(out, want) && strstr(out, "(cluster admin)"), "%s", out);
    assert_no_secret(out, ADMIN, "login's stdout");
    assert_no_secret(err, ADMIN, "login's stderr");
    free(out);
    free(err);

    char path[PATH_MAX + 32], kdir[PATH_MAX + 16];
    snprintf(kdir, sizeof kdir, "%s/kiln", id_cfg);
    snprintf(path, sizeof path, "%s/config.json", kdir);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "no config file at %s", path);
    cr_assert_eq(st.st_mode & 07777, 0600, "config file mode %o", st.st_mode & 07777);
    cr_assert_eq(stat(kdir, &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0700, "config directory mode %o", st.st_mode & 07777);
    json_error_t jerr;
    json_t *cfg = json_load_file(path, 0, &jerr);
    cr_assert_not_null(cfg, "%s", jerr.text);
    json_t *prof = json_object_get(json_object_get(cfg, "profiles"), "default");
    cr_assert_str_eq(json_string_value(json_object_get(cfg, "current")), "default");
    cr_assert_str_eq(json_string_value(json_object_get(prof, "url")), e2e_cl->url);
    cr_assert_str_eq(json_string_value(json_object_get(prof, "token")), ADMIN);
    char ca_real[PATH_MAX];
    cr_assert_not_null(realpath(id_ca, ca_real));
    cr_assert_str_eq(json_string_value(json_object_get(prof, "ca")), ca_real);
    json_decref(cfg);

    /* Later commands need nothing else: no KILN_URL, KILN_TOKEN or KILN_TLS_CA. */
    cr_assert_eq(kiln_env(NULL, NULL, &out, &err, "whoami", NULL), 0, "%s", err);
    cr_assert(strstr(out, "User:         admin (cluster admin)\n"), "%s", out);
    cr_assert(strstr(out, "Login:        profile \"default\""), "%s", out);
    free(out);
    free(err);
    /* ... and the Python SDK reads the same profile: one login serves both. */
    char sdk[PATH_MAX + 16];
    snprintf(sdk, sizeof sdk, "%s/sdk/python", e2e_root());
    char *py[] = {"/usr/bin/python3", "-c",
                  "import sys; sys.path.insert(0, sys.argv[1]); import kiln; c = kiln.Client();"
                  " print(c.profile, c.url, c.whoami()['user'])",
                  sdk, NULL};
    cr_assert_eq(e2e_run(py, NULL, &out, &err, 30000), 0, "%s", err);
    snprintf(want, sizeof want, "default %s admin\n", e2e_cl->url);
    cr_assert_str_eq(out, want);
    free(out);
    free(err);
    free(admin_ok("projects", "create", "ml", NULL, NULL));
    cr_assert_eq(kiln_env(NULL, NULL, &out, &err, "projects", NULL), 0, "%s", err);
    cr_assert(strstr(out, "\nml  ") && strstr(out, "(cluster admin)"), "%s", out);
    free(out);
    free(err);

    /* A second profile, from --token-file, becomes the current one; the first stays usable. */
    char tok[200], tokfile[PATH_MAX];
    new_user_token("carol", tok, sizeof tok);
    snprintf(tokfile, sizeof tokfile, "%s/carol.token", e2e_cl->dir);
    FILE *f = fopen(tokfile, "w");
    fprintf(f, "%s\n", tok);
    fclose(f);
    cr_assert_eq(kiln_env(where, NULL, &out, &err, "login", "--profile", "carol", "--token-file", tokfile, NULL), 0,
                 "%s", err);
    cr_assert(strstr(out, "as carol\n"), "%s", out);
    free(out);
    free(err);
    cr_assert_eq(kiln_env(NULL, NULL, &out, &err, "whoami", NULL), 0, "%s", err);
    cr_assert(strstr(out, "User:         carol\n"), "%s", out);
    free(out);
    free(err);
    char *admin_profile[] = {"KILN_PROFILE=default", NULL};
    cr_assert_eq(kiln_env(admin_profile, NULL, &out, &err, "whoami", NULL), 0, "%s", err);
    cr_assert(strstr(out, "User:         admin"), "%s", out);
    free(out);
    free(err);
    cr_assert_eq(kiln_env(admin_profile, NULL, &out, &err, "--profile", "carol", "whoami", NULL), 0, "%s", err);
    cr_assert(strstr(out, "User:         carol"), "--profile must beat KILN_PROFILE: %s", out);
    free(out);
    free(err);
    /* KILN_TOKEN beats the profile. */
    cr_assert_eq(kiln_as(ADMIN, &out, &err, "whoami", NULL), 0, "%s", err);
    cr_assert(strstr(out, "User:         admin") && strstr(out, "Login:        KILN_TOKEN"), "%s", out);
    free(out);
    free(err);

    /* The same kilnd under another URL is another URL: the profile's token is not sent there. */
    char other[128], other_env[160];
    snprintf(other, sizeof other, "https://localhost:%d", e2e_cl->http_port);
    snprintf(other_env, sizeof other_env, "KILN_URL=%s", other);
    char *elsewhere[] = {other_env, ca_env, NULL};
    cr_assert_eq(kiln_env(elsewhere, NULL, &out, &err, "whoami", NULL), 4);
    snprintf(want, sizeof want, "profile \"carol\" holds the login for %s, not for %s", e2e_cl->url, other);
    cr_assert(strstr(err, "this request needs an API token") && strstr(err, want), "%s", err);
    free(out);
    free(err);

    /* A config file others may read is refused, with the fix. */
    cr_assert_eq(chmod(path, 0644), 0);
    cr_assert_eq(kiln_env(NULL, NULL, &out, &err, "whoami", NULL), 1);
    snprintf(want, sizeof want, "hint: chmod 600 %s", path);
    cr_assert(strstr(err, want), "%s", err);
    assert_no_secret(err, ADMIN, "the refusal");
    free(out);
    free(err);
    cr_assert_eq(chmod(path, 0600), 0);

    /* logout: carol's token leaves the file; the next command is a 401 that says to log in. */
    cr_assert_eq(kiln_env(NULL, NULL, &out, &err, "logout", NULL), 0, "%s", err);
    cr_assert(strstr(out, "removed the token of profile \"carol\""), "%s", out);
    free(out);
    free(err);
    char *text = e2e_slurp(path);
    assert_no_secret(text, tok, "the config file after logout");
    cr_assert(strstr(text, ADMIN), "logout removed the other profile's token");
    free(text);
    cr_assert_eq(kiln_env(NULL, NULL, &out, &err, "whoami", NULL), 4);
    cr_assert(strstr(err, "this request needs an API token") && strstr(err, "kiln login"), "%s", err);
    free(out);
    free(err);

    /* logout --revoke also revokes it on kilnd, and carol's token, which it made, with it. */
    cr_assert_eq(kiln_env(NULL, NULL, &out, &err, "--profile", "default", "logout", "--revoke", NULL), 0, "%s", err);
    cr_assert(strstr(out, "revoked token tok_") && strstr(out, "\nalso revoked 1 token made with it\n"), "%s", out);
    free(out);
    free(err);
    cr_assert_eq(status_as(ADMIN, "GET", "/v1/whoami", NULL), 401);
    cr_assert_eq(status_as(tok, "GET", "/v1/whoami", NULL), 401);
    e2e_pass();
}

/* ---- roles ------------------------------------------------------------------------------------------------ */

static const char *job_id_of(const json_t *job)
{
    return json_string_value(json_object_get(job, "id"));
}

Test(e2e_identity, a_viewer_sees_only_its_project, .init = id_setup, .fini = e2e_teardown, .timeout = 180)
{
    char *out = NULL, *err = NULL;
    free(admin_ok("projects", "create", "ml", NULL, NULL));
    free(admin_ok("projects", "create", "secret", NULL, NULL));
    json_t *mine = e2e_submit(job_spec("ml-job", "ml"));
    json_t *theirs = e2e_submit(job_spec("secret-job", "secret"));
    char mine_id[64], theirs_id[64], mine_short[9], theirs_short[9], path[128];
    snprintf(mine_id, sizeof mine_id, "%s", job_id_of(mine));
    snprintf(theirs_id, sizeof theirs_id, "%s", job_id_of(theirs));
    snprintf(mine_short, sizeof mine_short, "%.8s", mine_id);
    snprintf(theirs_short, sizeof theirs_short, "%.8s", theirs_id);
    json_decref(mine);
    json_decref(theirs);

    char alice[200];
    new_user_token("alice", alice, sizeof alice);
    /* A user in no project sees no jobs. */
    cr_assert_eq(kiln_as(alice, &out, &err, "jobs", NULL), 0, "%s", err);
    cr_assert_str_eq(out, "no jobs\n");
    free(out);
    free(err);

    out = admin_ok("projects", "add-member", "ml", "alice", "viewer");
    cr_assert_str_eq(out, "alice is now viewer of project ml\n");
    free(out);
    out = admin_ok("projects", "members", "ml", NULL, NULL);
    cr_assert(strstr(out, "USER   ROLE\nalice  viewer\n"), "%s", out);
    free(out);

    cr_assert_eq(kiln_as(alice, &out, &err, "whoami", NULL), 0, "%s", err);
    cr_assert(strstr(out, "User:         alice\n") && strstr(out, "  ml       viewer\n"), "%s", out);
    free(out);
    free(err);
    cr_assert_eq(kiln_as(alice, &out, &err, "projects", NULL), 0, "%s", err);
    cr_assert(strstr(out, "\nml    viewer  ") && !strstr(out, "secret"), "%s", out);
    free(out);
    free(err);

    /* Only the project's jobs, by table and by JSON. */
    cr_assert_eq(kiln_as(alice, &out, &err, "jobs", NULL), 0, "%s", err);
    cr_assert(strstr(out, mine_short) && !strstr(out, theirs_short), "%s", out);
    free(out);
    free(err);
    cr_assert_eq(kiln_as(alice, &out, &err, "--json", "jobs", NULL), 0, "%s", err);
    json_t *listed = json_loads(out, 0, NULL);
    cr_assert_eq(json_array_size(json_object_get(listed, "jobs")), 1, "%s", out);
    json_decref(listed);
    free(out);
    free(err);

    /* Another project's job does not exist for her: 404, never 403. */
    cr_assert_eq(kiln_as(alice, &out, &err, "describe", theirs_id, NULL), 3);
    cr_assert(strstr(err, "not found"), "%s", err);
    free(out);
    free(err);
    snprintf(path, sizeof path, "/v1/jobs/%s", theirs_id);
    cr_assert_eq(status_as(alice, "GET", path, NULL), 404);
    snprintf(path, sizeof path, "/v1/jobs/%s/logs", theirs_id);
    cr_assert_eq(status_as(alice, "GET", path, NULL), 404);
    snprintf(path, sizeof path, "/v1/jobs/%s", mine_id);
    cr_assert_eq(status_as(alice, "GET", path, NULL), 200);
    cr_assert_eq(kiln_as(alice, &out, &err, "describe", mine_short, NULL), 0, "%s", err);
    cr_assert(strstr(out, mine_id), "%s", out);
    free(out);
    free(err);

    /* A viewer cannot submit or stop: 403 with the role it needs. */
    char spec_path[PATH_MAX];
    snprintf(spec_path, sizeof spec_path, "%s/ml.json", e2e_cl->dir);
    FILE *f = fopen(spec_path, "w");
    fputs(job_spec("by-alice", "ml"), f);
    fclose(f);
    cr_assert_eq(kiln_as(alice, &out, &err, "submit", spec_path, NULL), 4);
    cr_assert(strstr(err, "you are a viewer of project \"ml\"") && strstr(err, "editor"), "%s", err);
    cr_assert_str_eq(out, "");
    free(out);
    free(err);
    cr_assert_eq(status_as(alice, "POST", "/v1/jobs", job_spec("by-alice", "ml")), 403);
    cr_assert_eq(kiln_as(alice, &out, &err, "stop", mine_id, NULL), 4);
    cr_assert(strstr(err, "viewer"), "%s", err);
    free(out);
    free(err);
    /* nor manage users or members */
    cr_assert_eq(kiln_as(alice, &out, &err, "users", NULL), 4);
    cr_assert(strstr(err, "needs a cluster admin"), "%s", err);
    free(out);
    free(err);
    cr_assert_eq(kiln_as(alice, &out, &err, "projects", "add-member", "ml", "alice", "admin", NULL), 4);
    free(out);
    free(err);

    /* As an editor she submits into her project, not into the other. */
    free(admin_ok("projects", "add-member", "ml", "alice", "editor"));
    cr_assert_eq(kiln_as(alice, &out, &err, "submit", spec_path, NULL), 0, "%s", err);
    cr_assert_eq(strlen(out), 37, "%s", out);
    free(out);
    free(err);
    cr_assert_eq(status_as(alice, "POST", "/v1/jobs", job_spec("by-alice", "secret")), 403);

    /* Out of the project, its jobs are gone for her. */
    out = admin_ok("projects", "remove-member", "ml", "alice", NULL);
    cr_assert_str_eq(out, "removed alice from project ml\n");
    free(out);
    cr_assert_eq(kiln_as(alice, &out, &err, "jobs", NULL), 0, "%s", err);
    cr_assert_str_eq(out, "no jobs\n");
    free(out);
    free(err);
    snprintf(path, sizeof path, "/v1/jobs/%s", mine_id);
    cr_assert_eq(status_as(alice, "GET", path, NULL), 404);
    e2e_pass();
}

/* ---- revoked and expired tokens ------------------------------------------------------------------------ */

/* The id of the token of user whose description is desc, from `kiln --json tokens --user`. */
static void token_id(const char *user, const char *desc, char *out, size_t n)
{
    char *text = admin_ok("--json", "tokens", "--user", user, NULL);
    json_t *j = json_loads(text, 0, NULL);
    free(text);
    size_t i;
    json_t *t;
    out[0] = '\0';
    json_array_foreach(json_object_get(j, "tokens"), i, t)
        if (!strcmp(json_string_value(json_object_get(t, "description")), desc))
            snprintf(out, n, "%s", json_string_value(json_object_get(t, "id")));
    json_decref(j);
    cr_assert(out[0], "no token \"%s\" of %s", desc, user);
}

Test(e2e_identity, revoked_and_expired_tokens_are_refused, .init = id_setup, .fini = e2e_teardown, .timeout = 180)
{
    char *out = NULL, *err = NULL;
    char bob[200], brief[200], week[200], laptop[200], id[64], week_id[64];
    new_user_token("bob", bob, sizeof bob);
    cr_assert_eq(kiln_as(bob, &out, &err, "whoami", NULL), 0, "%s", err);
    cr_assert(strstr(out, "User:         bob\n") && strstr(out, "does not expire"), "%s", out);
    free(out);
    free(err);

    /* bob makes his own tokens: one for a week, one for a second. */
    cr_assert_eq(kiln_as(bob, &out, &err, "tokens", "create", "--expires-in", "7d", "--description", "week", NULL), 0,
                 "%s", err);
    snprintf(week, sizeof week, "%.*s", (int)strcspn(out, "\n"), out);
    cr_assert(strstr(err, "for user bob, valid until "), "%s", err);
    free(out);
    free(err);
    cr_assert_eq(kiln_as(week, &out, &err, "whoami", NULL), 0, "%s", err);
    cr_assert(strstr(out, ", expires "), "%s", out);
    free(out);
    free(err);
    cr_assert_eq(kiln_as(bob, &out, &err, "tokens", "create", "--expires-in", "1s", "--description", "brief", NULL),
                 0, "%s", err);
    snprintf(brief, sizeof brief, "%.*s", (int)strcspn(out, "\n"), out);
    free(out);
    free(err);

    /* Expired: after its second, the token is refused as expired. */
    sleep(2);
    cr_assert_eq(kiln_as(brief, &out, &err, "jobs", NULL), 4);
    cr_assert(strstr(err, "was expired") && strstr(err, "kiln login"), "%s", err);
    free(out);
    free(err);
    cr_assert_eq(status_as(brief, "GET", "/v1/whoami", NULL), 401);

    /* Revoked by the admin: the very next call is a 401 that names the token and says what to do.
     * The week's token, made with it, goes with it; the expired one stays expired. */
    token_id("bob", "e2e", id, sizeof id);
    token_id("bob", "week", week_id, sizeof week_id);
    out = admin_ok("tokens", "revoke", id, NULL, NULL);
    char want[200];
    snprintf(want, sizeof want, "revoked token %s of user bob\nalso revoked 1 token made with it\n", id);
    cr_assert_str_eq(out, want);
    free(out);
    cr_assert_eq(kiln_as(bob, &out, &err, "whoami", NULL), 4);
    snprintf(want, sizeof want, "error: the token %s was revoked", id);
    cr_assert(strstr(err, want), "%s", err);
    cr_assert(strstr(err, "note: kiln sent the token of KILN_TOKEN") && strstr(err, "kiln login"), "%s", err);
    assert_no_secret(err, bob, "the 401 message");
    free(out);
    free(err);
    cr_assert_eq(status_as(bob, "GET", "/v1/jobs", NULL), 401);
    cr_assert_eq(kiln_as(week, &out, &err, "whoami", NULL), 4);
    snprintf(want, sizeof want, "error: the token %s was revoked", week_id);
    cr_assert(strstr(err, want), "%s", err);
    free(out);
    free(err);

    /* A new token from the admin for bob's laptop. */
    cr_assert_eq(kiln_as(ADMIN, &out, &err, "tokens", "create", "bob", "--description", "laptop", NULL), 0, "%s", err);
    snprintf(laptop, sizeof laptop, "%.*s", (int)strcspn(out, "\n"), out);
    free(out);
    free(err);

    /* bob's list: one of each state; no secret in any listing. */
    cr_assert_eq(kiln_as(laptop, &out, &err, "tokens", NULL), 0, "%s", err);
    cr_assert(strstr(out, "revoked") && strstr(out, "expired") && strstr(out, "active"), "%s", out);
    cr_assert(strstr(out, "week") && strstr(out, "brief"), "%s", out);
    free(out);
    free(err);
    const char *secrets[] = {bob, brief, week, laptop, ADMIN};
    char *json_out[3];
    json_out[0] = admin_ok("--json", "tokens", "--user", "bob", NULL);
    json_out[1] = admin_ok("--json", "whoami", NULL, NULL, NULL);
    cr_assert_eq(kiln_as(laptop, &json_out[2], &err, "--json", "tokens", NULL), 0, "%s", err);
    free(err);
    for (int k = 0; k < 3; k++) {
        for (size_t s = 0; s < sizeof secrets / sizeof secrets[0]; s++)
            assert_no_secret(json_out[k], secrets[s], "a --json listing");
        free(json_out[k]);
    }
    /* bob revokes his own token; someone else's does not exist for him. */
    token_id("bob", "laptop", id, sizeof id);
    char admin_id[64];
    token_id("admin", "bootstrap token (--bootstrap-token-file)", admin_id, sizeof admin_id);
    cr_assert_eq(kiln_as(laptop, &out, &err, "tokens", "revoke", admin_id, NULL), 3);
    cr_assert(strstr(err, "not found"), "%s", err);
    free(out);
    free(err);
    cr_assert_eq(kiln_as(laptop, &out, &err, "tokens", "revoke", id, NULL), 0, "%s", err);
    free(out);
    free(err);
    cr_assert_eq(status_as(laptop, "GET", "/v1/whoami", NULL), 401);

    /* kilnd logged none of the secrets. */
    char log[PATH_MAX];
    snprintf(log, sizeof log, "%s/kilnd.log", e2e_cl->dir);
    char *text = e2e_slurp(log);
    cr_assert(strstr(text, "revoked by admin"), "kilnd's log is not where it was expected");
    for (size_t s = 0; s < sizeof secrets / sizeof secrets[0]; s++)
        assert_no_secret(text, secrets[s], "kilnd's log");
    free(text);
    e2e_pass();
}

/* ---- token lineage ------------------------------------------------------------------------------------- */

Test(e2e_identity, tokens_never_outlive_the_token_that_makes_them, .init = id_setup, .fini = e2e_teardown,
     .timeout = 180)
{
    char *out = NULL, *err = NULL;
    char hour[200], hour_id[64], child[200], child_id[64], admin_id[64], session[200];
    free(admin_ok("users", "create", "carol", NULL, NULL));
    cr_assert_eq(kiln_as(ADMIN, &out, &err, "tokens", "create", "carol", "--expires-in", "1h", "--description", "hour",
                         NULL), 0, "%s", err);
    snprintf(hour, sizeof hour, "%.*s", (int)strcspn(out, "\n"), out);
    free(out);
    free(err);
    token_id("carol", "hour", hour_id, sizeof hour_id);
    token_id("admin", "bootstrap token (--bootstrap-token-file)", admin_id, sizeof admin_id);

    /* No --expires-in: the new token expires with carol's hour, and kiln says so. */
    cr_assert_eq(kiln_as(hour, &out, &err, "tokens", "create", "--description", "child", NULL), 0, "%s", err);
    snprintf(child, sizeof child, "%.*s", (int)strcspn(out, "\n"), out);
    char want[300];
    snprintf(want, sizeof want, "note: it expires with token %s, which made it", hour_id);
    cr_assert(strstr(err, want) && !strstr(err, "valid until revoked"), "%s", err);
    free(out);
    free(err);
    token_id("carol", "child", child_id, sizeof child_id);
    /* Longer than the hour: refused, with the hour's end and what to do. */
    cr_assert_eq(kiln_as(hour, &out, &err, "tokens", "create", "--expires-in", "30d", NULL), 1);
    cr_assert(strstr(err, "cannot outlive the token that makes it") && strstr(err, hour_id) &&
              strstr(err, "leave expires_in_s out"), "%s", err);
    free(out);
    free(err);

    /* The list says who made each token, with which token: the table, -o wide and --json. */
    const char *tables[][2] = {{"-o", "table"}, {"-o", "wide"}};
    for (size_t k = 0; k < 2; k++) {
        cr_assert_eq(kiln_as(hour, &out, &err, tables[k][0], tables[k][1], "tokens", NULL), 0, "%s", err);
        cr_assert(strstr(out, "CREATED-BY") && strstr(out, "PARENT"), "%s", out);
        const char *row = strstr(out, child_id), *hrow = strstr(out, hour_id);
        cr_assert(row && hrow, "%s", out);
        char line[400];
        snprintf(line, sizeof line, "%.*s", (int)strcspn(row, "\n"), row);
        cr_assert(strstr(line, " carol ") && strstr(line, hour_id) && strstr(line, " api "), "%s", line);
        snprintf(line, sizeof line, "%.*s", (int)strcspn(hrow, "\n"), hrow);
        cr_assert(strstr(line, " admin ") && strstr(line, admin_id), "%s", line);
        free(out);
        free(err);
    }
    cr_assert_eq(kiln_as(hour, &out, &err, "--json", "tokens", NULL), 0, "%s", err);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert_not_null(j, "%s", out);
    size_t i;
    json_t *t;
    int seen = 0;
    json_array_foreach(json_object_get(j, "tokens"), i, t)
        if (!strcmp(json_string_value(json_object_get(t, "id")), child_id)) {
            seen++;
            cr_assert_str_eq(json_string_value(json_object_get(t, "parent_id")), hour_id);
            cr_assert_str_eq(json_string_value(json_object_get(t, "created_by")), "carol");
        }
    cr_assert_eq(seen, 1, "%s", out);
    json_decref(j);
    free(out);
    free(err);

    /* The web UI's session token (a login link of carol's, redeemed) makes no tokens. */
    char hdr[320];
    snprintf(hdr, sizeof hdr, "Authorization: Bearer %s", hour);
    long st = 0;
    json_t *link = e2e_http("POST", "/v1/login-links", "{}", hdr, &st);
    cr_assert_eq(st, 201);
    char body[200];
    snprintf(body, sizeof body, "{\"code\": \"%s\"}", json_string_value(json_object_get(link, "code")));
    json_decref(link);
    json_t *tok = e2e_http("POST", "/v1/login-links:redeem", body, NULL, &st);
    cr_assert_eq(st, 200);
    snprintf(session, sizeof session, "%s", json_string_value(json_object_get(tok, "token")));
    json_decref(tok);
    cr_assert_eq(kiln_as(session, &out, &err, "tokens", "create", NULL), 4);
    cr_assert(strstr(err, "a web UI session token cannot create tokens") && strstr(err, "kiln tokens create"), "%s",
              err);
    assert_no_secret(err, session, "the 403 message");
    free(out);
    free(err);

    /* Revoking the hour revokes the child and the session with it. */
    out = admin_ok("tokens", "revoke", hour_id, NULL, NULL);
    cr_assert(strstr(out, "also revoked 2 tokens made with it"), "%s", out);
    free(out);
    cr_assert_eq(kiln_as(child, &out, &err, "whoami", NULL), 4);
    snprintf(want, sizeof want, "error: the token %s was revoked", child_id);
    cr_assert(strstr(err, want), "%s", err);
    free(out);
    free(err);
    cr_assert_eq(status_as(session, "GET", "/v1/whoami", NULL), 401);
    e2e_pass();
}

/* ---- the Python SDK ------------------------------------------------------------------------------------- */

Test(e2e_identity, python_sdk, .init = id_setup, .fini = e2e_teardown, .timeout = 240)
{
    if (access("/usr/bin/python3", X_OK) != 0)
        cr_assert_fail("/usr/bin/python3 is missing");
    char script[PATH_MAX + 32];
    snprintf(script, sizeof script, "%s/tests/sdk/test_sdk.py", e2e_root());
    /* The identity cases against this kilnd (with tokens), the offline ones (config files) too;
     * the job cases need agents and run in test_clients.c. */
    char *argv[] = {"/usr/bin/python3", script, "-v", "Identity", "Offline", "Config", NULL};
    static char root[PATH_MAX + 16];
    snprintf(root, sizeof root, "KILN_ROOT=%s", e2e_root());
    char **base = client_env(ADMIN);
    char *env[10];
    int n = 0;
    while (base[n])
        env[n] = base[n], n++;
    env[n++] = root;
    env[n++] = "KILN_SDK_REQUIRE_SERVER=1";
    env[n++] = "PYTHONDONTWRITEBYTECODE=1";
    env[n] = NULL;
    char *out = NULL, *err = NULL;
    int rc = e2e_run(argv, env, &out, &err, 200000);
    if (rc != 0 || getenv("KILN_E2E_VERBOSE"))
        fprintf(stderr, "---- python SDK identity tests (rc %d):\n%s%s\n", rc, out, err);
    cr_assert_eq(rc, 0, "python SDK identity tests failed");
    cr_assert(strstr(err, "\nOK") && !strstr(err, "skipped"), "%s", err);
    cr_assert(strstr(err, "test_viewer_sees_only_its_project"), "the identity cases did not run: %s", err);
    free(out);
    free(err);
    e2e_pass();
}
