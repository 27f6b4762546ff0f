/* test_start.c - what kiln-agent checks and keeps when it starts: its data roots (resolved; a
 * missing one, a file, or one holding the agent's own secrets refuses the start), the CPUs it
 * shares among its slots (--cpus), its TLS settings, its join token (never in a log, never left
 * in its environment), and the credential file it keeps in its work dir. The program itself
 * runs where it matters. */
#include "agent/agent.h"
#include "tests/common/harness.h"

#include <criterion/criterion.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char tdir[128];

static void setup(void)
{
    snprintf(tdir, sizeof(tdir), "/tmp/kiln-start.XXXXXX");
    cr_assert_not_null(mkdtemp(tdir));
}

static void teardown(void)
{
    cr_assert(th_rm_tree(tdir), "could not remove %s", tdir);
}

TestSuite(start, .init = setup, .fini = teardown, .timeout = 60);

static const char *t(const char *name)
{
    static char buf[8][256];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", tdir, name);
    return buf[k];
}

static void mkd(const char *name)
{
    cr_assert_eq(mkdir(t(name), 0755), 0, "%s", name);
}

Test(start, the_credential_file_is_private_and_round_trips)
{
    kiln_err_t err;
    cr_assert_eq(agent_credential_save(tdir, "w-7", "cred-abc.def", &err), 0, "%s", err.message);
    struct stat st;
    cr_assert_eq(stat(t(AGENT_CREDENTIAL_FILE), &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0600);
    char *text = NULL;
    cr_assert_eq(kiln_file_read(t(AGENT_CREDENTIAL_FILE), &text, NULL, NULL), 0);
    cr_assert_str_eq(text, "worker_id w-7\ncredential cred-abc.def\n");
    free(text);
    char id[128], cred[512];
    cr_assert_eq(agent_credential_load(tdir, id, sizeof(id), cred, sizeof(cred), &err), 0, "%s", err.message);
    cr_assert_str_eq(id, "w-7");
    cr_assert_str_eq(cred, "cred-abc.def");
    cr_assert_eq(agent_credential_save(tdir, "w-7", "cred-new", &err), 0);
    cr_assert_eq(agent_credential_load(tdir, id, sizeof(id), cred, sizeof(cred), &err), 0);
    cr_assert_str_eq(cred, "cred-new", "replaced whole");

    FILE *f = fopen(t(AGENT_CREDENTIAL_FILE), "w");
    fputs("credential only-a-secret-here\n", f);
    fclose(f);
    cr_assert_eq(agent_credential_load(tdir, id, sizeof(id), cred, sizeof(cred), &err), KILN_EFORMAT);
    cr_assert_null(strstr(err.message, "only-a-secret"), "%s", err.message);
    cr_assert_str_eq(cred, "");
    unlink(t(AGENT_CREDENTIAL_FILE));
    cr_assert_eq(agent_credential_load(tdir, id, sizeof(id), cred, sizeof(cred), &err), KILN_ENOTFOUND);
}

Test(start, data_roots_are_resolved_and_must_be_directories)
{
    mkd("data");
    mkd("more");
    cr_assert_eq(symlink(t("data"), t("link")), 0);
    FILE *f = fopen(t("file"), "w");
    fclose(f);
    char *out[8];
    size_t n = 0;
    kiln_err_t err;
    const char *ok[] = {t("data"), t("link"), t("more/../more")};
    cr_assert_eq(agent_data_roots_resolve(ok, 3, out, 8, &n, &err), 0, "%s", err.message);
    cr_assert_eq(n, 2, "the link is the same root");
    char want[PATH_MAX];
    cr_assert_not_null(realpath(t("data"), want));
    cr_assert_str_eq(out[0], want);
    for (size_t i = 0; i < n; i++)
        free(out[i]);
    const char *missing[] = {t("data"), t("nope")};
    cr_assert_eq(agent_data_roots_resolve(missing, 2, out, 8, &n, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "does not exist") && strstr(err.message, "nope"), "%s", err.message);
    cr_assert_eq(n, 0);
    const char *file[] = {t("file")};
    cr_assert_eq(agent_data_roots_resolve(file, 1, out, 8, &n, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "not a directory"), "%s", err.message);
    mkd("a,b");
    const char *comma[] = {t("a,b")};
    cr_assert_eq(agent_data_roots_resolve(comma, 1, out, 8, &n, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "comma"), "%s", err.message);
}

/* Runs kiln-agent with args (and env "K=V" entries, NULL-terminated, may be NULL) until it exits
 * or 10 s pass; returns its exit status and its output in out. */
static int agent_run(char *const args[], char *const env[], char *out, size_t n)
{
    char bin[PATH_MAX], *argv[32];
    snprintf(bin, sizeof(bin), "%s/kiln-agent", th_bin_dir());
    cr_assert_eq(access(bin, X_OK), 0, "%s not built (set KILN_BIN_DIR)", bin);
    int k = 0;
    argv[k++] = bin;
    for (int i = 0; args[i] && k < 31; i++)
        argv[k++] = args[i];
    argv[k] = NULL;
    const char *log = t("agent.log");
    unlink(log);
    pid_t pid = th_spawn(argv, env, log);
    cr_assert_gt(pid, 0);
    int st = -1;
    for (int i = 0; i < 200; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid)
            break;
        usleep(50000);
        st = -1;
    }
    if (st == -1)
        st = th_stop(pid, SIGKILL, 2000);
    char *text = NULL;
    out[0] = '\0';
    if (kiln_file_read(log, &text, NULL, NULL) == 0) {
        snprintf(out, n, "%s", text);
        free(text);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

Test(start, kiln_agent_refuses_roots_it_cannot_use_or_that_hold_its_secrets)
{
    mkd("data");
    mkd("work");
    char out[8192];
    char *missing[] = {"--server", "127.0.0.1:1", "--insecure", "--work-dir", (char *)t("work"), "--data-root",
                       (char *)t("nope"), NULL};
    cr_assert_eq(agent_run(missing, NULL, out, sizeof(out)), 1, "%s", out);
    cr_assert(strstr(out, "does not exist"), "%s", out);
    char *over[] = {"--server", "127.0.0.1:1", "--insecure", "--work-dir", (char *)t("data/work"), "--data-root",
                    (char *)t("data"), NULL};
    cr_assert_eq(agent_run(over, NULL, out, sizeof(out)), 1, "%s", out);
    cr_assert(strstr(out, "work dir") && strstr(out, "secrets"), "%s", out);
    FILE *f = fopen(t("data/join"), "w");
    fputs("tok-in-the-root\n", f);
    fclose(f);
    chmod(t("data/join"), 0600);
    char *tok[] = {"--server", "127.0.0.1:1", "--insecure", "--work-dir", (char *)t("work"), "--data-root",
                   (char *)t("data"), "--join-token-file", (char *)t("data/join"), NULL};
    cr_assert_eq(agent_run(tok, NULL, out, sizeof(out)), 2, "%s", out);
    cr_assert(strstr(out, "--data-root"), "%s", out);
    cr_assert_null(strstr(out, "tok-in-the-root"));
}

/* --cpus (or KILN_AGENT_CPUS) must name CPUs the agent may run on, one a slot at least. */
Test(start, kiln_agent_refuses_cpus_it_cannot_give_its_slots)
{
    mkd("work");
    char out[8192];
    char *far[] = {"--server", "127.0.0.1:1", "--insecure", "--work-dir", (char *)t("work"), "--cpus", "1000", NULL};
    cr_assert_eq(agent_run(far, NULL, out, sizeof(out)), 1, "%s", out);
    cr_assert(strstr(out, "--cpus names CPU(s) 1000, which this process may not run on"), "%s", out);
    char env_cpus[] = "KILN_AGENT_CPUS=0-x";
    char *env[] = {env_cpus, NULL};
    char *bad[] = {"--server", "127.0.0.1:1", "--insecure", "--work-dir", (char *)t("work"), NULL};
    cr_assert_eq(agent_run(bad, env, out, sizeof(out)), 1, "%s", out);
    cr_assert(strstr(out, "\"0-3,8\""), "%s", out);
}

Test(start, kiln_agent_refuses_conflicting_security_settings)
{
    mkd("work");
    FILE *f = fopen(t("ca.pem"), "w");
    fputs("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n", f);
    fclose(f);
    char out[8192];
    char *both[] = {"--server", "127.0.0.1:1", "--work-dir", (char *)t("work"), "--insecure", "--tls-ca",
                    (char *)t("ca.pem"), NULL};
    cr_assert_eq(agent_run(both, NULL, out, sizeof(out)), 1, "%s", out);
    cr_assert(strstr(out, "--insecure"), "%s", out);
    f = fopen(t("join"), "w");
    fputs("tok-file\n", f);
    fclose(f);
    char env_tok[] = "KILN_JOIN_TOKEN=tok-env";
    char *env[] = {env_tok, NULL};
    char *twice[] = {"--server", "127.0.0.1:1", "--insecure", "--work-dir", (char *)t("work"), "--join-token-file",
                     (char *)t("join"), NULL};
    cr_assert_eq(agent_run(twice, env, out, sizeof(out)), 2, "%s", out);
    cr_assert(strstr(out, "give it once"), "%s", out);
    cr_assert_null(strstr(out, "tok-file"));
    cr_assert_null(strstr(out, "tok-env"));
}

/* The join token never shows: not in the agent's log (nor when it cannot reach kilnd and says
 * so), not in /proc/<agent>/environ (the block other processes of the user can read). */
Test(start, the_join_token_is_neither_logged_nor_left_in_the_environment)
{
    mkd("work");
    char bin[PATH_MAX], server[64];
    snprintf(bin, sizeof(bin), "%s/kiln-agent", th_bin_dir());
    snprintf(server, sizeof(server), "127.0.0.1:%d", th_free_port()); /* nothing listens */
    char env_tok[] = "KILN_JOIN_TOKEN=tok-Zq81-secret";
    char *env[] = {env_tok, NULL};
    char *argv[] = {bin, "--server", server, "--insecure", "--work-dir", (char *)t("work"), NULL};
    pid_t pid = th_spawn(argv, env, t("agent.log"));
    cr_assert_gt(pid, 0);
    char path[64], *text = NULL;
    size_t len = 0;
    bool logged_retry = false;
    for (int64_t until = kiln_mono_us() + 30000000; !logged_retry && kiln_mono_us() < until;) {
        usleep(50000);
        free(text);
        text = NULL;
        if (kiln_file_read(t("agent.log"), &text, NULL, NULL) == 0)
            logged_retry = strstr(text, "could not register") != NULL;
    }
    free(text);
    text = NULL;
    snprintf(path, sizeof(path), "/proc/%d/environ", (int)pid);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    char envbuf[65536];
    len = fread(envbuf, 1, sizeof(envbuf) - 1, f);
    fclose(f);
    bool in_environ = memmem(envbuf, len, "tok-Zq81", 8) != NULL;
    th_stop(pid, SIGTERM, 5000);
    cr_assert_eq(kiln_file_read(t("agent.log"), &text, NULL, NULL), 0);
    cr_assert(logged_retry, "the agent said it could not register: %s", text);
    cr_assert_null(strstr(text, "tok-Zq81"), "the token is in the log:\n%s", text);
    cr_assert_not(in_environ, "the token is still in /proc/%d/environ", (int)pid);
    free(text);
}
