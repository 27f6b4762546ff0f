/* test_authz.c - who may do what over REST: the authorization matrix, built from kilnd's own
 * route table (every route must have a row here, so a new route without one fails), run against
 * the real server and database for nine callers: no token, a malformed token, an expired one, a
 * revoked one, a viewer, an editor, the admin of another project, the project's admin and a
 * cluster admin. Also CORS, JSON-only bodies and the token lifecycle. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "code/code.h"
#include "tests/api/api_test.h"

TestSuite(authz, .init = at_setup, .fini = at_teardown, .timeout = 120);

enum { C_NONE, C_BAD, C_EXPIRED, C_REVOKED, C_VIEWER, C_EDITOR, C_OTHER_ADMIN, C_PROJECT_ADMIN, C_CLUSTER_ADMIN,
       C_COUNT };
static const char *const k_callers[C_COUNT] = {"no token", "bad token", "expired", "revoked", "viewer",
                                               "editor", "admin of another project", "project admin",
                                               "cluster admin"};
static char tokens[C_COUNT][128];

/* A request as cluster admin; asserts the status. Returns the reply (caller decrefs). */
static json_t *admin(const char *method, const char *path, const char *body, long want)
{
    return at_req_want(method, path, body, want);
}

/* Creates a user and a token for it (expires_in_s 0: never); copies the secret into out. */
static void user_with_token(const char *name, long expires_in_s, char *out, size_t n)
{
    char body[128], path[128];
    snprintf(body, sizeof body, "{\"name\": \"%s\"}", name);
    json_decref(admin("POST", "/v1/users", body, 201));
    snprintf(path, sizeof path, "/v1/users/%s/tokens", name);
    snprintf(body, sizeof body, "{\"expires_in_s\": %ld}", expires_in_s);
    json_t *t = admin("POST", path, expires_in_s ? body : "{}", 201);
    const char *secret = json_string_value(json_object_get(t, "token"));
    cr_assert(secret && !strncmp(secret, "kiln_", 5), "a token comes back once");
    kiln_strlcpy(out, secret, n);
    json_decref(t);
}

static void member(const char *project, const char *user, const char *role)
{
    char body[64], path[160];
    snprintf(body, sizeof body, "{\"role\": \"%s\"}", role);
    snprintf(path, sizeof path, "/v1/projects/%s/members/%s", project, user);
    json_decref(admin("PUT", path, body, 200));
}

static char job_id[64], victim_token_id[64];

/* Project "p" with a job, project "q"; one user per role; a victim user with a token. */
static void world(void)
{
    json_decref(admin("POST", "/v1/projects", "{\"name\": \"p\"}", 201));
    json_decref(admin("POST", "/v1/projects", "{\"name\": \"q\"}", 201));
    kiln_strlcpy(tokens[C_CLUSTER_ADMIN], at_admin_token, sizeof tokens[0]);
    kiln_strlcpy(tokens[C_BAD], "kiln_never-issued", sizeof tokens[0]);
    user_with_token("viewer", 0, tokens[C_VIEWER], sizeof tokens[0]);
    user_with_token("editor", 0, tokens[C_EDITOR], sizeof tokens[0]);
    user_with_token("qadmin", 0, tokens[C_OTHER_ADMIN], sizeof tokens[0]);
    user_with_token("padmin", 0, tokens[C_PROJECT_ADMIN], sizeof tokens[0]);
    user_with_token("lapsed", 1, tokens[C_EXPIRED], sizeof tokens[0]);
    user_with_token("gone", 0, tokens[C_REVOKED], sizeof tokens[0]);
    member("p", "viewer", "viewer");
    member("p", "editor", "editor");
    member("q", "qadmin", "admin");
    member("p", "padmin", "admin");
    member("p", "gone", "admin");
    member("p", "lapsed", "admin");
    /* the revoked token: its owner revokes it */
    long st;
    char auth[200], *raw = NULL;
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", tokens[C_REVOKED]);
    const char *hdrs[] = {auth, NULL};
    json_t *who = at_req("GET", "/v1/whoami", NULL, hdrs, &st, &raw);
    cr_assert_eq(st, 200, "%s", raw);
    char path[128];
    snprintf(path, sizeof path, "/v1/tokens/%s", json_string_value(json_object_get(who, "token_id")));
    free(raw);
    json_decref(at_req("DELETE", path, NULL, hdrs, &st, &raw));
    cr_assert_eq(st, 200, "a user revokes its own token: %s", raw);
    free(raw);
    json_decref(who);
    /* the victim: a user none of the callers is, with a token */
    char secret[128];
    user_with_token("victim", 0, secret, sizeof secret);
    json_t *list = admin("GET", "/v1/users/victim/tokens", NULL, 200);
    kiln_strlcpy(victim_token_id, json_string_value(json_object_get(json_array_get(json_object_get(list, "tokens"), 0), "id")),
                 sizeof victim_token_id);
    json_decref(list);
    member("p", "victim", "viewer");
    sleep(1); /* the 1-second token has expired */
}

static char *job_spec(const char *project)
{
    static char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"name\": \"m\", \"project\": \"%s\", \"model\": {\"type\": \"mlp\", \"hidden\": [8], \"n_inputs\": 4,"
             " \"n_classes\": 2}, \"data\": {\"train\": \"synthetic\"}}",
             project);
    return buf;
}

static void new_job(void)
{
    /* nothing runs it (the fixture's worker is driven by hand), so it stays stoppable */
    json_t *j = admin("POST", "/v1/jobs", job_spec("p"), 201);
    kiln_strlcpy(job_id, json_string_value(json_object_get(j, "id")), sizeof job_id);
    json_decref(j);
}

/* One row per route: how to make its request (path and body, after any set-up as cluster admin)
 * and the status each caller gets. */
typedef struct row {
    const char *method, *pattern;
    void (*prepare)(int caller, char *path, size_t n, const char **body);
    long want[C_COUNT];
} row_t;

#define UNAUTH 401, 401, 401, 401
/* viewer, editor, other-project admin, project admin, cluster admin */
#define EVERYONE(s) UNAUTH, s, s, s, s, s
#define CLUSTER_ONLY(denied, ok) UNAUTH, denied, denied, denied, denied, ok
#define OPEN(s) s, s, s, s, s, s, s, s, s

static int counter;

static void p_fixed(int caller, char *path, size_t n, const char **body, const char *p, const char *b)
{
    (void)caller;
    snprintf(path, n, "%s", p);
    *body = b;
}
static void p_jobs(int c, char *path, size_t n, const char **body) { p_fixed(c, path, n, body, "/v1/jobs", NULL); }
static void p_search(int c, char *path, size_t n, const char **body)
{
    p_fixed(c, path, n, body, "/v1/jobs:search", "{\"filter\": \"state = QUEUED OR hp.lr > 0\", \"columns\": [\"hp.lr\"]}");
}
static void p_submit(int c, char *path, size_t n, const char **body) { p_fixed(c, path, n, body, "/v1/jobs", job_spec("p")); }
static void p_job(int c, char *path, size_t n, const char **body)
{
    (void)c;
    snprintf(path, n, "/v1/jobs/%s", job_id);
    *body = NULL;
}
static void p_stop(int c, char *path, size_t n, const char **body)
{
    (void)c;
    new_job();
    snprintf(path, n, "/v1/jobs/%s:stop", job_id);
    *body = "{}";
}
static void p_events(int c, char *path, size_t n, const char **body)
{
    (void)c;
    snprintf(path, n, "/v1/jobs/%s/events", job_id);
    *body = NULL;
}
static void p_logs(int c, char *path, size_t n, const char **body)
{
    (void)c;
    snprintf(path, n, "/v1/jobs/%s/logs", job_id);
    *body = NULL;
}
static void p_metrics(int c, char *path, size_t n, const char **body)
{
    (void)c;
    snprintf(path, n, "/v1/jobs/%s/metrics", job_id);
    *body = NULL;
}
static void p_delete(int c, char *path, size_t n, const char **body)
{
    (void)c;
    new_job();
    long st;
    char stop[160];
    snprintf(stop, sizeof stop, "/v1/jobs/%s:stop", job_id); /* a queued job stops at once: it has ended */
    json_decref(at_req("POST", stop, "{}", NULL, &st, NULL));
    cr_assert_eq(st, 200);
    snprintf(path, n, "/v1/jobs/%s", job_id);
    *body = NULL;
}
static void p_artifacts(int c, char *path, size_t n, const char **body)
{
    (void)c;
    snprintf(path, n, "/v1/jobs/%s/artifacts", job_id);
    *body = NULL;
}
static void p_checkpoints(int c, char *path, size_t n, const char **body)
{
    (void)c;
    snprintf(path, n, "/v1/jobs/%s/checkpoints", job_id);
    *body = NULL;
}
/* A job of project p that has run and left an artifact (made once). */
static void p_artifact(int c, char *path, size_t n, const char **body)
{
    (void)c;
    static char with_artifact[64];
    if (!with_artifact[0]) {
        json_t *j = admin("POST", "/v1/jobs", job_spec("p"), 201);
        kiln_strlcpy(with_artifact, json_string_value(json_object_get(j, "id")), sizeof with_artifact);
        json_decref(j);
        int attempt = at_run_job(with_artifact);
        kiln_err_t err;
        cr_assert_eq(at_upload(at_svc, at_worker, with_artifact, attempt, "samples.txt", "hello", 5, 4, &err), 0,
                     "%s", err.message);
    }
    snprintf(path, n, "/v1/jobs/%s/artifacts/samples.txt", with_artifact);
    *body = NULL;
}
static void p_workers(int c, char *path, size_t n, const char **body) { p_fixed(c, path, n, body, "/v1/workers", NULL); }
static void p_whoami(int c, char *path, size_t n, const char **body) { p_fixed(c, path, n, body, "/v1/whoami", NULL); }
static void p_users(int c, char *path, size_t n, const char **body) { p_fixed(c, path, n, body, "/v1/users", NULL); }
static void p_user_create(int c, char *path, size_t n, const char **body)
{
    static char b[64];
    snprintf(b, sizeof b, "{\"name\": \"made-%d-%d\"}", c, counter++);
    p_fixed(c, path, n, body, "/v1/users", b);
}
static void p_tokens(int c, char *path, size_t n, const char **body)
{
    p_fixed(c, path, n, body, "/v1/users/victim/tokens", NULL);
}
static void p_token_create(int c, char *path, size_t n, const char **body)
{
    p_fixed(c, path, n, body, "/v1/users/victim/tokens", "{\"description\": \"matrix\"}");
}
static void p_token_revoke(int c, char *path, size_t n, const char **body)
{
    (void)c;
    snprintf(path, n, "/v1/tokens/%s", victim_token_id);
    *body = NULL;
}
static void p_projects(int c, char *path, size_t n, const char **body) { p_fixed(c, path, n, body, "/v1/projects", NULL); }
static void p_project_create(int c, char *path, size_t n, const char **body)
{
    static char b[64];
    snprintf(b, sizeof b, "{\"name\": \"made-%d-%d\"}", c, counter++);
    p_fixed(c, path, n, body, "/v1/projects", b);
}
static void p_project_update(int c, char *path, size_t n, const char **body)
{
    p_fixed(c, path, n, body, "/v1/projects/p", "{\"default_queue\": \"default\"}");
}
static void p_queues(int c, char *path, size_t n, const char **body) { p_fixed(c, path, n, body, "/v1/queues", NULL); }
static void p_queue(int c, char *path, size_t n, const char **body) { p_fixed(c, path, n, body, "/v1/queues/default", NULL); }
static void p_queue_create(int c, char *path, size_t n, const char **body)
{
    static char b[160];
    snprintf(b, sizeof b, "{\"name\": \"q-%d-%d\", \"quota\": {\"cpu\": 2}}", c, counter++);
    p_fixed(c, path, n, body, "/v1/queues", b);
}
/* A queue made by the cluster admin for the caller to change or delete. */
static void p_queue_made(int c, char *path, size_t n, const char **body, const char *b)
{
    char make[160];
    int k = counter++;
    snprintf(make, sizeof make, "{\"name\": \"made-q-%d-%d\", \"quota\": {\"cpu\": 2}}", c, k);
    json_decref(admin("POST", "/v1/queues", make, 201));
    snprintf(path, n, "/v1/queues/made-q-%d-%d", c, k);
    *body = b;
}
static void p_queue_update(int c, char *path, size_t n, const char **body)
{
    p_queue_made(c, path, n, body, "{\"weight\": 2}");
}
static void p_queue_delete(int c, char *path, size_t n, const char **body) { p_queue_made(c, path, n, body, NULL); }
static void p_members(int c, char *path, size_t n, const char **body)
{
    p_fixed(c, path, n, body, "/v1/projects/p/members", NULL);
}
static void p_member_set(int c, char *path, size_t n, const char **body)
{
    p_fixed(c, path, n, body, "/v1/projects/p/members/victim", "{\"role\": \"viewer\"}");
}
static void p_member_remove(int c, char *path, size_t n, const char **body)
{
    member("p", "victim", "viewer"); /* there is always someone to remove */
    p_fixed(c, path, n, body, "/v1/projects/p/members/victim", NULL);
}
/* What agents are trusted with: cluster admins only, each given something real to act on. */
static void p_join_tokens(int c, char *path, size_t n, const char **body)
{
    p_fixed(c, path, n, body, "/v1/join-tokens", NULL);
}
static void p_join_create(int c, char *path, size_t n, const char **body)
{
    p_fixed(c, path, n, body, "/v1/join-tokens", "{\"uses\": 3, \"expires_in\": \"1h\", \"description\": \"matrix\"}");
}
static void p_join_revoke(int c, char *path, size_t n, const char **body)
{
    json_t *t = admin("POST", "/v1/join-tokens", "{}", 201);
    snprintf(path, n, "/v1/join-tokens/%s", json_string_value(json_object_get(t, "id")));
    json_decref(t);
    (void)c;
    *body = NULL;
}
/* A worker of its own per caller (no slots: nothing is placed on it). */
static void bare_worker(int c, char *id, size_t n)
{
    snprintf(id, n, "w-matrix-%d-%d", c, counter++);
    kiln_err_t err;
    arena_t a;
    arena_init(&a, 0);
    Kiln__RegisterRequest req = KILN__REGISTER_REQUEST__INIT;
    Kiln__RegisterResponse reg = KILN__REGISTER_RESPONSE__INIT;
    req.worker_id = id;
    req.hostname = "bare";
    req.slot_type = "cpu";
    cr_assert_eq(svc_agent_register(at_svc, &req, NULL, &a, &reg, &err), 0, "%s", err.message);
    arena_deinit(&a);
}
static void p_worker_approve(int c, char *path, size_t n, const char **body)
{
    char id[64];
    bare_worker(c, id, sizeof id);
    snprintf(path, n, "/v1/workers/%s:approve", id);
    *body = "{}";
}
static void p_worker_remove(int c, char *path, size_t n, const char **body)
{
    char id[64];
    bare_worker(c, id, sizeof id);
    snprintf(path, n, "/v1/workers/%s?ban=true&reason=matrix", id);
    *body = NULL;
}
static void p_bans(int c, char *path, size_t n, const char **body) { p_fixed(c, path, n, body, "/v1/worker-bans", NULL); }
static void p_unban(int c, char *path, size_t n, const char **body)
{
    char id[64], rm[128];
    bare_worker(c, id, sizeof id);
    snprintf(rm, sizeof rm, "/v1/workers/%s?ban=true", id);
    json_t *out = admin("DELETE", rm, NULL, 200);
    snprintf(path, n, "/v1/worker-bans/%lld",
             (long long)json_integer_value(json_object_get(json_object_get(out, "ban"), "id")));
    json_decref(out);
    *body = NULL;
}
static void p_healthz(int c, char *path, size_t n, const char **body) { p_fixed(c, path, n, body, "/healthz", NULL); }
static void p_readyz(int c, char *path, size_t n, const char **body) { p_fixed(c, path, n, body, "/readyz", NULL); }
static void p_prom(int c, char *path, size_t n, const char **body) { p_fixed(c, path, n, body, "/metrics", NULL); }

static void p_link(int c, char *path, size_t n, const char **body) { p_fixed(c, path, n, body, "/v1/login-links", "{}"); }
/* A fresh link of the cluster admin per caller: the code is the credential, whoever sends it. */
static void p_redeem(int c, char *path, size_t n, const char **body)
{
    static char b[200];
    json_t *l = admin("POST", "/v1/login-links", "{}", 201);
    snprintf(b, sizeof b, "{\"code\": \"%s\"}", json_string_value(json_object_get(l, "code")));
    json_decref(l);
    p_fixed(c, path, n, body, "/v1/login-links:redeem", b);
}
static void p_ui(int c, char *path, size_t n, const char **body) { p_fixed(c, path, n, body, "/", NULL); }
static void p_ui_alias(int c, char *path, size_t n, const char **body) { p_fixed(c, path, n, body, "/ui", NULL); }
/* The script the page names. */
static void p_ui_asset(int c, char *path, size_t n, const char **body)
{
    long st;
    char *raw = NULL;
    json_decref(at_req("GET", "/", NULL, NULL, &st, &raw));
    const char *s = raw ? strstr(raw, "src=\"/ui/") : NULL;
    cr_assert(s, "the page names its script: %s", raw ? raw : "");
    s += strlen("src=\"");
    size_t len = strcspn(s, "\"");
    snprintf(path, n, "%.*s", (int)len, s);
    free(raw);
    (void)c;
    *body = NULL;
}

/* A code archive: a fresh one per call (so every allowed upload creates one). */
static char archive_path[300];
static void make_archive(void)
{
    char dir[256], f[300];
    snprintf(dir, sizeof dir, "%s/code-%d", at_dir_path(), counter++);
    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(f, sizeof f, "%s/train.py", dir);
    FILE *fp = fopen(f, "w");
    fprintf(fp, "print(%d)\n", counter);
    fclose(fp);
    snprintf(archive_path, sizeof archive_path, "%s.tgz", dir);
    int fd = open(archive_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    kiln_err_t err;
    cr_assert_eq(code_pack_dir(dir, fd, NULL, 0, NULL, &err), 0, "%s", err.message);
    close(fd);
}
static void p_code_upload(int c, char *path, size_t n, const char **body)
{
    make_archive();
    p_fixed(c, path, n, body, "/v1/code?project=p", NULL);
}
/* An archive of project p (uploaded once). */
static void p_code_get(int c, char *path, size_t n, const char **body)
{
    static char digest[KILN_SHA256_HEX];
    if (!digest[0]) {
        make_archive();
        char *data = NULL;
        size_t len = 0;
        kiln_err_t err;
        cr_assert_eq(kiln_file_read(archive_path, &data, &len, &err), 0);
        kiln_sha256_hex(data, len, digest);
        char url[200], auth[200], *out = NULL;
        snprintf(url, sizeof url, "%s/v1/code?project=p", at_base);
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", at_admin_token);
        const char *hdrs[] = {"Content-Type: application/gzip", auth, NULL};
        long st = 0;
        cr_assert_eq(th_http_send("POST", url, data, len, hdrs, &st, &out, NULL, 10000), 0);
        cr_assert_eq(st, 201, "%s", out);
        free(out);
        free(data);
    }
    (void)c;
    snprintf(path, n, "/v1/code/%s?project=p", digest);
    *body = NULL;
}

/* Tuning jobs: project p's (or another project's), one made as cluster admin for the callers to
 * read or stop. */
static char *tuning_body_in(const char *project)
{
    static char b[1400];
    snprintf(b, sizeof b, "{\"name\": \"t\", \"job\": %s, \"parameters\": {\"lr\": {\"type\": \"continuous\","
             " \"min\": 0.0001, \"max\": 0.01}}, \"objective\": {\"metric\": \"val_loss\"}, \"max_jobs\": 1}",
             job_spec(project));
    return b;
}
static char *tuning_body(void) { return tuning_body_in("p"); }
static void p_tunings(int c, char *path, size_t n, const char **body) { p_fixed(c, path, n, body, "/v1/tuning-jobs", NULL); }
static void p_tuning_create(int c, char *path, size_t n, const char **body)
{
    p_fixed(c, path, n, body, "/v1/tuning-jobs", tuning_body());
}
static void p_tuning_made(int c, char *path, size_t n, const char **body, const char *suffix, const char *b)
{
    json_t *t = admin("POST", "/v1/tuning-jobs", tuning_body(), 201);
    snprintf(path, n, "/v1/tuning-jobs/%s%s", json_string_value(json_object_get(t, "id")), suffix);
    json_decref(t);
    (void)c;
    *body = b;
}
static void p_tuning(int c, char *path, size_t n, const char **body) { p_tuning_made(c, path, n, body, "", NULL); }
static void p_tuning_stop(int c, char *path, size_t n, const char **body) { p_tuning_made(c, path, n, body, ":stop", "{}"); }

static const row_t k_rows[] = {
    {"POST", "/v1/code", p_code_upload, {UNAUTH, 403, 201, 403, 201, 201}},
    {"GET", "/v1/code/{digest}", p_code_get, {UNAUTH, 200, 200, 404, 200, 200}},
    {"GET", "/v1/jobs", p_jobs, {EVERYONE(200)}},
    {"POST", "/v1/jobs", p_submit, {UNAUTH, 403, 201, 403, 201, 201}},
    {"POST", "/v1/jobs:search", p_search, {EVERYONE(200)}},
    {"GET", "/v1/jobs/{id}", p_job, {UNAUTH, 200, 200, 404, 200, 200}},
    {"DELETE", "/v1/jobs/{id}", p_delete, {UNAUTH, 403, 200, 404, 200, 200}},
    {"GET", "/v1/jobs/{id}/artifacts", p_artifacts, {UNAUTH, 200, 200, 404, 200, 200}},
    {"GET", "/v1/jobs/{id}/artifacts/{name}", p_artifact, {UNAUTH, 200, 200, 404, 200, 200}},
    {"GET", "/v1/jobs/{id}/checkpoints", p_checkpoints, {UNAUTH, 200, 200, 404, 200, 200}},
    {"POST", "/v1/jobs/{id}:stop", p_stop, {UNAUTH, 403, 200, 404, 200, 200}},
    {"GET", "/v1/jobs/{id}/events", p_events, {UNAUTH, 200, 200, 404, 200, 200}},
    {"GET", "/v1/jobs/{id}/logs", p_logs, {UNAUTH, 200, 200, 404, 200, 200}},
    {"GET", "/v1/jobs/{id}/metrics", p_metrics, {UNAUTH, 200, 200, 404, 200, 200}},
    {"GET", "/v1/workers", p_workers, {EVERYONE(200)}},
    {"POST", "/v1/workers/{id}:approve", p_worker_approve, {CLUSTER_ONLY(403, 200)}},
    {"DELETE", "/v1/workers/{id}", p_worker_remove, {CLUSTER_ONLY(403, 200)}},
    {"GET", "/v1/worker-bans", p_bans, {CLUSTER_ONLY(403, 200)}},
    {"DELETE", "/v1/worker-bans/{id}", p_unban, {CLUSTER_ONLY(403, 200)}},
    {"GET", "/v1/join-tokens", p_join_tokens, {CLUSTER_ONLY(403, 200)}},
    {"POST", "/v1/join-tokens", p_join_create, {CLUSTER_ONLY(403, 201)}},
    {"DELETE", "/v1/join-tokens/{id}", p_join_revoke, {CLUSTER_ONLY(403, 200)}},
    {"GET", "/v1/whoami", p_whoami, {EVERYONE(200)}},
    {"GET", "/v1/users", p_users, {CLUSTER_ONLY(403, 200)}},
    {"POST", "/v1/users", p_user_create, {CLUSTER_ONLY(403, 201)}},
    {"GET", "/v1/users/{name}/tokens", p_tokens, {CLUSTER_ONLY(403, 200)}},
    {"POST", "/v1/users/{name}/tokens", p_token_create, {CLUSTER_ONLY(403, 201)}},
    {"DELETE", "/v1/tokens/{id}", p_token_revoke, {CLUSTER_ONLY(404, 200)}},
    {"GET", "/v1/projects", p_projects, {EVERYONE(200)}},
    {"POST", "/v1/projects", p_project_create, {CLUSTER_ONLY(403, 201)}},
    {"PATCH", "/v1/projects/{project}", p_project_update, {UNAUTH, 403, 403, 404, 200, 200}},
    {"GET", "/v1/queues", p_queues, {EVERYONE(200)}},
    {"GET", "/v1/queues/{name}", p_queue, {EVERYONE(200)}},
    {"POST", "/v1/queues", p_queue_create, {CLUSTER_ONLY(403, 201)}},
    {"PATCH", "/v1/queues/{name}", p_queue_update, {CLUSTER_ONLY(403, 200)}},
    {"DELETE", "/v1/queues/{name}", p_queue_delete, {CLUSTER_ONLY(403, 200)}},
    {"GET", "/v1/tuning-jobs", p_tunings, {EVERYONE(200)}},
    {"POST", "/v1/tuning-jobs", p_tuning_create, {UNAUTH, 403, 201, 403, 201, 201}},
    {"GET", "/v1/tuning-jobs/{id}", p_tuning, {UNAUTH, 200, 200, 404, 200, 200}},
    {"POST", "/v1/tuning-jobs/{id}:stop", p_tuning_stop, {UNAUTH, 403, 200, 404, 200, 200}},
    {"GET", "/v1/projects/{project}/members", p_members, {UNAUTH, 200, 200, 404, 200, 200}},
    {"PUT", "/v1/projects/{project}/members/{user}", p_member_set, {UNAUTH, 403, 403, 404, 200, 200}},
    {"DELETE", "/v1/projects/{project}/members/{user}", p_member_remove, {UNAUTH, 403, 403, 404, 200, 200}},
    {"POST", "/v1/login-links", p_link, {EVERYONE(201)}},
    {"POST", "/v1/login-links:redeem", p_redeem, {OPEN(200)}},
    {"GET", "/", p_ui, {OPEN(200)}},
    {"GET", "/ui", p_ui_alias, {OPEN(200)}},
    {"GET", "/ui/{asset}", p_ui_asset, {OPEN(200)}},
    {"GET", "/healthz", p_healthz, {OPEN(200)}},
    {"GET", "/readyz", p_readyz, {OPEN(200)}},
    {"GET", "/metrics", p_prom, {OPEN(200)}},
};

static const row_t *row_of(const char *method, const char *pattern)
{
    for (size_t i = 0; i < sizeof k_rows / sizeof k_rows[0]; i++)
        if (!strcmp(k_rows[i].method, method) && !strcmp(k_rows[i].pattern, pattern))
            return &k_rows[i];
    return NULL;
}

Test(authz, every_route_has_a_row)
{
    api_route_info_t routes[128];
    size_t n = api_http_routes(routes, 128);
    cr_assert_lt(n, 128);
    for (size_t i = 0; i < n; i++)
        cr_assert_not_null(row_of(routes[i].method, routes[i].path),
                           "route %s %s has no row in the authorization matrix (tests/api/test_authz.c)",
                           routes[i].method, routes[i].path);
    for (size_t i = 0; i < sizeof k_rows / sizeof k_rows[0]; i++) {
        bool served = false;
        for (size_t k = 0; k < n && !served; k++)
            served = !strcmp(routes[k].method, k_rows[i].method) && !strcmp(routes[k].path, k_rows[i].pattern);
        cr_assert(served, "the matrix has a row for %s %s, which kilnd does not serve", k_rows[i].method,
                  k_rows[i].pattern);
    }
}

Test(authz, every_route_times_every_caller)
{
    world();
    new_job();
    {
        /* the job with an artifact runs first, while the worker's slots are free */
        char p[256];
        const char *b;
        p_artifact(C_CLUSTER_ADMIN, p, sizeof p, &b);
    }
    api_route_info_t routes[128];
    size_t n = api_http_routes(routes, 128);
    int cells = 0;
    for (size_t i = 0; i < n; i++) {
        const row_t *row = row_of(routes[i].method, routes[i].path);
        cr_assert_not_null(row);
        for (int c = 0; c < C_COUNT; c++) {
            char path[256], auth[200];
            const char *body = NULL;
            row->prepare(c, path, sizeof path, &body);
            const char *hdrs[] = {auth, NULL};
            if (c == C_NONE)
                snprintf(auth, sizeof auth, "Authorization:"); /* no header at all */
            else
                snprintf(auth, sizeof auth, "Authorization: Bearer %s", tokens[c]);
            long st;
            char *raw = NULL;
            json_t *j;
            if (row->prepare == p_code_upload) {
                /* the body is an archive, not JSON */
                char *data = NULL, url[400];
                size_t len = 0;
                kiln_err_t err;
                cr_assert_eq(kiln_file_read(archive_path, &data, &len, &err), 0);
                snprintf(url, sizeof url, "%s%s", at_base, path);
                const char *gz[] = {"Content-Type: application/gzip", auth, NULL};
                cr_assert_eq(th_http_send("POST", url, data, len, gz, &st, &raw, NULL, 10000), 0);
                free(data);
                j = json_loads(raw, 0, NULL);
            } else {
                j = at_req(row->method, path, body, hdrs, &st, &raw);
            }
            cr_assert_eq(st, row->want[c], "%s %s as %s: want %ld, got %ld: %s", row->method, path,
                         k_callers[c], row->want[c], st, raw);
            if (st == 401) {
                cr_assert_str_eq(json_string_value(json_object_get(j, "code")), "unauthenticated");
                cr_assert(strstr(json_string_value(json_object_get(j, "hint")), "kiln login"),
                          "a 401 says how to get a token: %s", raw);
            }
            json_decref(j);
            free(raw);
            cells++;
        }
    }
    cr_assert_eq(cells, (int)n * C_COUNT);
}

Test(authz, lists_show_only_what_the_caller_may_see)
{
    world();
    json_decref(admin("POST", "/v1/jobs", job_spec("p"), 201));
    json_decref(admin("POST", "/v1/jobs", job_spec("q"), 201));
    json_decref(admin("POST", "/v1/jobs", job_spec("q"), 201));
    struct { int caller; int jobs; const char *projects; } cases[] = {
        {C_VIEWER, 1, "p"}, {C_OTHER_ADMIN, 2, "q"}, {C_CLUSTER_ADMIN, 3, "default,p,q"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char auth[200];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", tokens[cases[i].caller]);
        const char *hdrs[] = {auth, NULL};
        long st;
        json_t *j = at_req("GET", "/v1/jobs", NULL, hdrs, &st, NULL);
        cr_assert_eq(st, 200);
        json_t *jobs = json_object_get(j, "jobs");
        cr_assert_eq((int)json_array_size(jobs), cases[i].jobs, "%s sees %d jobs", k_callers[cases[i].caller],
                     cases[i].jobs);
        size_t k;
        json_t *x;
        json_array_foreach(jobs, k, x)
            cr_assert(strstr(cases[i].projects, json_string_value(json_object_get(x, "project"))));
        json_decref(j);
        /* a search sees the same jobs, however wide its filter */
        j = at_req("POST", "/v1/jobs:search", "{\"filter\": \"project = q OR project = p OR NOT project = p\"}", hdrs,
                   &st, NULL);
        cr_assert_eq(st, 200);
        cr_assert_eq((int)json_array_size(json_object_get(j, "jobs")), cases[i].jobs, "%s searches",
                     k_callers[cases[i].caller]);
        json_decref(j);
        j = at_req("GET", "/v1/projects", NULL, hdrs, &st, NULL);
        cr_assert_eq(st, 200);
        char got[128] = "";
        json_array_foreach(json_object_get(j, "projects"), k, x)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", k ? "," : "",
                     json_string_value(json_object_get(x, "name")));
        cr_assert_str_eq(got, cases[i].projects, "%s", k_callers[cases[i].caller]);
        json_decref(j);
    }
}

/* The tuning jobs' list is project-scoped as the jobs' is: a caller sees only its projects', on
 * one page or page by page. */
Test(authz, tuning_lists_show_only_what_the_caller_may_see)
{
    world();
    json_decref(admin("POST", "/v1/tuning-jobs", tuning_body_in("p"), 201));
    json_decref(admin("POST", "/v1/tuning-jobs", tuning_body_in("q"), 201));
    struct { int caller; int n; const char *projects; } cases[] = {
        {C_VIEWER, 1, "p"}, {C_OTHER_ADMIN, 1, "q"}, {C_CLUSTER_ADMIN, 2, "p,q"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char auth[200];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", tokens[cases[i].caller]);
        const char *hdrs[] = {auth, NULL};
        long st;
        json_t *j = at_req("GET", "/v1/tuning-jobs", NULL, hdrs, &st, NULL);
        cr_assert_eq(st, 200);
        json_t *list = json_object_get(j, "tuning_jobs");
        cr_assert_eq((int)json_array_size(list), cases[i].n, "%s sees %zu tuning jobs", k_callers[cases[i].caller],
                     json_array_size(list));
        size_t k;
        json_t *x;
        json_array_foreach(list, k, x)
            cr_assert(strstr(cases[i].projects, json_string_value(json_object_get(x, "project"))), "%s sees project %s's",
                      k_callers[cases[i].caller], json_string_value(json_object_get(x, "project")));
        json_decref(j);
    }
    /* page by page (page_size 2): the same jobs in the same order, each once; three more in p and
     * two more in q made in one statement share created_at, so the id breaks their tie */
    cr_assert_eq(at_sql_int("WITH i AS (INSERT INTO tuning_jobs (id, name, project, spec, state)"
                            " SELECT gen_random_uuid(), 'bulk', pr, '{\"strategy\": \"random\", \"objective\":"
                            " {\"metric\": \"val_loss\"}, \"max_jobs\": 1}', 'COMPLETED'"
                            " FROM (VALUES ('p'), ('p'), ('p'), ('q'), ('q')) v(pr) RETURNING 1)"
                            " SELECT count(*) FROM i"),
                 5);
    struct { int caller; size_t n; } paged[] = {{C_VIEWER, 4}, {C_OTHER_ADMIN, 3}, {C_CLUSTER_ADMIN, 7}};
    for (size_t i = 0; i < sizeof paged / sizeof paged[0]; i++) {
        char auth[200];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", tokens[paged[i].caller]);
        const char *hdrs[] = {auth, NULL};
        long st;
        json_t *whole = at_req("GET", "/v1/tuning-jobs", NULL, hdrs, &st, NULL);
        cr_assert_eq(st, 200);
        json_t *want = json_object_get(whole, "tuning_jobs");
        cr_assert_eq(json_array_size(want), paged[i].n, "%s", k_callers[paged[i].caller]);
        cr_assert_str_eq(json_string_value(json_object_get(whole, "next_page_token")), "", "one page holds them");
        char token[1024] = "";
        size_t got = 0;
        int pages = 0;
        do {
            char path[1200];
            snprintf(path, sizeof path, "/v1/tuning-jobs?page_size=2%s%s", token[0] ? "&page_token=" : "", token);
            char *raw = NULL;
            json_t *j = at_req("GET", path, NULL, hdrs, &st, &raw);
            cr_assert_eq(st, 200, "%s", raw);
            free(raw);
            size_t k;
            json_t *x;
            json_array_foreach(json_object_get(j, "tuning_jobs"), k, x) {
                cr_assert_lt(got, paged[i].n, "%s: more than there are", k_callers[paged[i].caller]);
                cr_assert_str_eq(json_string_value(json_object_get(x, "id")),
                                 json_string_value(json_object_get(json_array_get(want, got), "id")),
                                 "%s: item %zu, in the order of the whole list", k_callers[paged[i].caller], got);
                got++;
            }
            snprintf(token, sizeof token, "%s", json_string_value(json_object_get(j, "next_page_token")));
            json_decref(j);
            cr_assert_lt(++pages, 10);
        } while (token[0]);
        cr_assert_eq(got, paged[i].n, "%s sees every one once", k_callers[paged[i].caller]);
        cr_assert_eq(pages, (int)(paged[i].n + 1) / 2, "no empty last page");
        json_decref(whole);
    }
}

Test(authz, events_record_who_submitted_and_who_stopped)
{
    world();
    char auth[200];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", tokens[C_EDITOR]);
    const char *hdrs[] = {auth, NULL};
    long st;
    char *raw = NULL;
    json_t *j = at_req("POST", "/v1/jobs", job_spec("p"), hdrs, &st, &raw);
    cr_assert_eq(st, 201, "%s", raw);
    free(raw);
    cr_assert_str_eq(json_string_value(json_object_get(j, "submitted_by")), "editor");
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s:stop", json_string_value(json_object_get(j, "id")));
    json_t *s = admin("POST", path, "{\"reason\": \"enough\"}", 200);
    json_decref(s);
    snprintf(path, sizeof path, "/v1/jobs/%s/events", json_string_value(json_object_get(j, "id")));
    json_t *ev = admin("GET", path, NULL, 200);
    json_t *arr = json_object_get(ev, "events");
    /* QUEUED (submitted by the editor), maybe SCHEDULED (kilnd's own), STOPPED (by the admin) */
    size_t n = json_array_size(arr);
    cr_assert(n == 2 || n == 3);
    json_t *first = json_array_get(arr, 0), *last = json_array_get(arr, n - 1);
    cr_assert_str_eq(json_string_value(json_object_get(first, "actor")), "editor");
    cr_assert_str_eq(json_string_value(json_object_get(last, "to_state")), "STOPPED");
    cr_assert_str_eq(json_string_value(json_object_get(last, "actor")), "admin");
    cr_assert(strstr(json_string_value(json_object_get(last, "reason")), "by admin"));
    if (n == 3)
        cr_assert_str_eq(json_string_value(json_object_get(json_array_get(arr, 1), "actor")), "",
                         "the scheduler's placement is kilnd's own doing");
    json_decref(ev);
    json_decref(j);
}

Test(authz, revocation_and_role_changes_apply_to_the_next_request)
{
    world();
    char auth[200];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", tokens[C_EDITOR]);
    const char *hdrs[] = {auth, NULL};
    long st;
    json_decref(at_req("POST", "/v1/jobs", job_spec("p"), hdrs, &st, NULL));
    cr_assert_eq(st, 201);
    member("p", "editor", "viewer");
    json_decref(at_req("POST", "/v1/jobs", job_spec("p"), hdrs, &st, NULL));
    cr_assert_eq(st, 403, "demoted to viewer: no more submissions");
    json_decref(admin("DELETE", "/v1/projects/p/members/editor", NULL, 200));
    json_decref(at_req("GET", "/v1/projects/p/members", NULL, hdrs, &st, NULL));
    cr_assert_eq(st, 404, "removed: the project is gone for it");
    json_t *who = at_req("GET", "/v1/whoami", NULL, hdrs, &st, NULL);
    char path[128];
    snprintf(path, sizeof path, "/v1/tokens/%s", json_string_value(json_object_get(who, "token_id")));
    json_decref(who);
    json_decref(admin("DELETE", path, NULL, 200));
    char *raw = NULL;
    json_t *j = at_req("GET", "/v1/whoami", NULL, hdrs, &st, &raw);
    cr_assert_eq(st, 401, "revoked: %s", raw);
    cr_assert(strstr(json_string_value(json_object_get(j, "message")), "revoked"), "%s", raw);
    json_decref(j);
    free(raw);
}

Test(authz, tokens_are_shown_once_and_listed_without_secrets)
{
    world();
    char auth[200];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", tokens[C_VIEWER]);
    const char *hdrs[] = {auth, NULL};
    long st;
    char *raw = NULL;
    json_t *t = at_req("POST", "/v1/users/viewer/tokens", "{\"expires_in_s\": 3600, \"description\": \"laptop\"}",
                       hdrs, &st, &raw);
    cr_assert_eq(st, 201, "a user makes its own tokens: %s", raw);
    free(raw);
    const char *secret = json_string_value(json_object_get(t, "token"));
    cr_assert(json_string_value(json_object_get(t, "expires_at"))[0]);
    json_decref(at_req("GET", "/v1/users/viewer/tokens", NULL, hdrs, &st, &raw));
    cr_assert_eq(st, 200);
    cr_assert(!strstr(raw, secret), "listing never shows a secret");
    cr_assert(!strstr(raw, tokens[C_VIEWER]));
    cr_assert(strstr(raw, "laptop"));
    free(raw);
    json_decref(at_req("POST", "/v1/users/viewer/tokens", "{\"expires_in_s\": -5}", hdrs, &st, &raw));
    cr_assert_eq(st, 400, "%s", raw);
    free(raw);
    json_decref(at_req("POST", "/v1/users/viewer/tokens", "{\"expires_in\": 5}", hdrs, &st, &raw));
    cr_assert_eq(st, 400, "unknown fields are refused: %s", raw);
    cr_assert(strstr(raw, "expires_in"), "%s", raw);
    free(raw);
    json_decref(t);
}

Test(authz, bodies_must_be_json)
{
    long st;
    char *raw = NULL;
    const char *plain[] = {"Content-Type: text/plain", NULL};
    json_t *j = at_req("POST", "/v1/jobs", at_good_spec(), plain, &st, &raw);
    cr_assert_eq(st, 415, "a text/plain body (what a cross-site form sends) is refused: %s", raw);
    cr_assert_str_eq(json_string_value(json_object_get(j, "code")), "unsupported_media_type");
    json_decref(j);
    free(raw);
    const char *form[] = {"Content-Type: application/x-www-form-urlencoded", NULL};
    json_decref(at_req("POST", "/v1/users", "name=x", form, &st, NULL));
    cr_assert_eq(st, 415);
    const char *charset[] = {"Content-Type: application/json; charset=utf-8", NULL};
    json_decref(at_req("POST", "/v1/jobs", at_good_spec(), charset, &st, &raw));
    cr_assert_eq(st, 201, "%s", raw);
    free(raw);
}

static void cors_setup(void)
{
    static const char *const origins[] = {"https://ui.example.com"};
    api_http_config_t cfg = {.cors_origins = origins, .ncors = 1};
    at_setup_with(&cfg);
}

/* The response headers of a request without a token, as text (caller frees). */
static char *headers_of(const char *method, const char *path, const char *const extra[])
{
    char url[256];
    snprintf(url, sizeof url, "%s%s", at_base, path);
    const char *hdrs[8] = {"Authorization:"};
    for (int i = 0; extra && extra[i] && i < 6; i++)
        hdrs[i + 1] = extra[i];
    long st = 0;
    char *body = NULL, *head = NULL;
    cr_assert_eq(th_http_headers(method, url, NULL, hdrs, &st, &body, &head, 10000), 0);
    free(body);
    return head;
}

Test(authz, cors_for_configured_origins_only, .init = cors_setup)
{
    const char *good[] = {"Origin: https://ui.example.com", "Access-Control-Request-Method: POST"};
    const char *good_hdrs[] = {good[0], good[1], NULL};
    char *h = headers_of("OPTIONS", "/v1/jobs", good_hdrs);
    cr_assert(strstr(h, "HTTP/1.1 204"), "%s", h);
    cr_assert(strstr(h, "Access-Control-Allow-Origin: https://ui.example.com"), "%s", h);
    cr_assert(strstr(h, "Access-Control-Allow-Headers: Authorization, Content-Type"), "%s", h);
    cr_assert(strstr(h, "Access-Control-Allow-Methods: GET, HEAD, POST"), "%s", h);
    free(h);
    const char *evil_hdrs[] = {"Origin: https://evil.example.com", "Access-Control-Request-Method: POST", NULL};
    h = headers_of("OPTIONS", "/v1/jobs", evil_hdrs);
    cr_assert(strstr(h, "HTTP/1.1 403"), "%s", h);
    cr_assert(!strstr(h, "Access-Control-Allow-Origin"), "%s", h);
    free(h);
    const char *get_hdrs[] = {"Origin: https://ui.example.com", NULL};
    h = headers_of("GET", "/healthz", get_hdrs);
    cr_assert(strstr(h, "Access-Control-Allow-Origin: https://ui.example.com"), "%s", h);
    free(h);
    const char *get_evil[] = {"Origin: https://evil.example.com", NULL};
    h = headers_of("GET", "/healthz", get_evil);
    cr_assert(!strstr(h, "Access-Control-Allow-Origin"), "other origins get no CORS headers: %s", h);
    free(h);
}

static void metrics_auth_setup(void)
{
    api_http_config_t cfg = {.metrics_auth = true};
    at_setup_with(&cfg);
}

Test(authz, metrics_behind_a_token_when_asked, .init = metrics_auth_setup)
{
    long st;
    const char *none[] = {"Authorization:", NULL};
    json_decref(at_req("GET", "/metrics", NULL, none, &st, NULL));
    cr_assert_eq(st, 401);
    json_decref(at_req("GET", "/metrics", NULL, NULL, &st, NULL));
    cr_assert_eq(st, 200);
    json_decref(at_req("GET", "/healthz", NULL, none, &st, NULL));
    cr_assert_eq(st, 200, "health stays open");
}

/* A cluster admin may name any project, so the insert itself checks that it exists: a missing
 * one is a 400 on the field, with or without an Idempotency-Key, and the key stays free for the
 * request that comes once the project exists. */
Test(authz, a_job_in_a_project_that_does_not_exist_is_refused)
{
    world();
    const char *key_hdr[] = {"Idempotency-Key: nowhere-1", NULL};
    for (int with_key = 0; with_key < 2; with_key++) {
        long st;
        char *raw = NULL;
        json_t *j = at_req("POST", "/v1/jobs", job_spec("nowhere"), with_key ? key_hdr : NULL, &st, &raw);
        cr_assert_eq(st, 400, "%s", raw);
        cr_assert_str_eq(json_string_value(json_object_get(j, "field")), "project", "%s", raw);
        cr_assert(strstr(json_string_value(json_object_get(j, "message")), "\"nowhere\" does not exist"), "%s", raw);
        cr_assert(strstr(json_string_value(json_object_get(j, "hint")), "kiln projects create nowhere"), "%s", raw);
        json_decref(j);
        free(raw);
    }
    json_decref(admin("POST", "/v1/projects", "{\"name\": \"nowhere\"}", 201));
    long st;
    json_t *j = at_req("POST", "/v1/jobs", job_spec("nowhere"), key_hdr, &st, NULL);
    cr_assert_eq(st, 201);
    cr_assert_str_eq(json_string_value(json_object_get(j, "project")), "nowhere");
    json_decref(j);
}

/* An idempotency key is its project's: a key another project's job holds makes a job of this
 * project, and tells nothing of the other; the first job's project gets its own job back. */
Test(authz, a_key_another_projects_job_holds_is_this_projects_to_use)
{
    world();
    char auth_p[200], auth_q[200];
    snprintf(auth_p, sizeof auth_p, "Authorization: Bearer %s", tokens[C_EDITOR]);
    snprintf(auth_q, sizeof auth_q, "Authorization: Bearer %s", tokens[C_OTHER_ADMIN]);
    const char *as_p[] = {auth_p, "Idempotency-Key: shared-key", NULL};
    const char *as_q[] = {auth_q, "Idempotency-Key: shared-key", NULL};
    long st;
    char *raw = NULL;
    json_t *j = at_req("POST", "/v1/jobs", job_spec("p"), as_p, &st, &raw);
    cr_assert_eq(st, 201, "%s", raw);
    char held[64];
    kiln_strlcpy(held, json_string_value(json_object_get(j, "id")), sizeof held);
    json_decref(j);
    free(raw);
    j = at_req("POST", "/v1/jobs", job_spec("q"), as_q, &st, &raw);
    cr_assert_eq(st, 201, "%s", raw);
    cr_assert(!strstr(raw, held), "the other project's job is not named: %s", raw);
    json_decref(j);
    free(raw);
    cr_assert_eq(at_sql_int("SELECT count(*) FROM jobs WHERE project = 'q'"), 1);
    /* its own project's retry gets it, and another request there is told which job holds the key */
    j = at_req("POST", "/v1/jobs", job_spec("p"), as_p, &st, &raw);
    cr_assert_eq(st, 200, "%s", raw);
    cr_assert_str_eq(json_string_value(json_object_get(j, "id")), held);
    json_decref(j);
    free(raw);
    char other[1024];
    snprintf(other, sizeof other, "%s", job_spec("p"));
    memcpy(strstr(other, "\"m\""), "\"n\"", 3);
    j = at_req("POST", "/v1/jobs", other, as_p, &st, &raw);
    cr_assert_eq(st, 422, "%s", raw);
    cr_assert(strstr(json_string_value(json_object_get(j, "message")), held), "%s", raw);
    json_decref(j);
    free(raw);
}
