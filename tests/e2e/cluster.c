/* cluster.c - the end-to-end suite's fixture: a real kilnd (fresh database, free ports) and two
 * real kiln-agent processes per test, REST helpers, waits, and child-process runners for the
 * `kiln` CLI and the Python SDK tests. Everything started here dies with the test. */
#include "tests/e2e/e2e.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <ctype.h>
#include <dirent.h>
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
#include <time.h>
#include <unistd.h>

#include "tests/common/harness.h"

e2e_cluster_t *e2e_cl;

/* LeakSanitizer hook (used only in SAN=1 builds): Criterion's runner itself loses 48 bytes when
 * parallel tests end in some orders (seen with libcriterion 2.4 here); that is not kiln's leak,
 * so it must not fail the sanitizer run. Leaks in our own code are still reported. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libcriterion.so\n";
}

const char *e2e_jstr(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

json_int_t e2e_jint(const json_t *o, const char *key)
{
    return json_integer_value(json_object_get(o, key));
}

char *e2e_dump(const json_t *j)
{
    static char buf[4096];
    char *s = json_dumps(j, JSON_COMPACT);
    snprintf(buf, sizeof buf, "%.4000s", s ? s : "(null)");
    free(s);
    return buf;
}
static e2e_cluster_t e2e_storage;

const char *e2e_root(void)
{
    static char root[PATH_MAX];
    if (!root[0]) {
        const char *r = getenv("KILN_ROOT");
        if (r && *r)
            snprintf(root, sizeof root, "%s", r);
        else if (!getcwd(root, sizeof root))
            snprintf(root, sizeof root, ".");
    }
    return root;
}

const char *e2e_data_path(void)
{
    static char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/data/tinyshakespeare.txt", e2e_root());
    return path;
}

static char *e2e_bin(const char *name)
{
    static char path[4][PATH_MAX];
    static int next;
    char *p = path[next++ % 4];
    const char *dir = th_bin_dir();
    if (dir[0] == '/')
        snprintf(p, PATH_MAX, "%s/%s", dir, name);
    else
        snprintf(p, PATH_MAX, "%s/%s/%s", e2e_root(), dir, name);
    return p;
}

/* fork + exec with the child in its own process group, killed if the test process dies, its
 * output appended to log_path and stdin from /dev/null. */
static pid_t e2e_spawn(char *const argv[], char *const env[], const char *log_path, const char *out_path)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        for (size_t i = 0; env && env[i]; i++)
            putenv(env[i]);
        /* Relative paths (job files, data) mean the repository root, as in tests/run.sh. */
        if (chdir(e2e_root()) != 0)
            _exit(126);
        int in = open("/dev/null", O_RDONLY);
        if (in >= 0) {
            dup2(in, 0);
            close(in);
        }
        int fd = open(out_path ? out_path : log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        int fe = out_path ? open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644) : dup(fd);
        if (fd >= 0 && fe >= 0) {
            dup2(fd, 1);
            dup2(fe, 2);
            close(fd);
            close(fe);
        }
        execv(argv[0], argv);
        fprintf(stderr, "e2e: could not exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid);
    return pid;
}

/* SIGTERM (then SIGKILL after timeout_ms) to the process group; reaps the leader. */
static int e2e_stop(pid_t pid, int timeout_ms)
{
    if (pid <= 0)
        return -1;
    return th_stop(pid, SIGTERM, timeout_ms);
}

/* Pids (at most max, into out) of the processes whose environment holds needle, such as
 * "=DIR/" for anything pointed into DIR or "KILN_JOB_ID=ID" for a job's ranks. Returns the count. */
static int e2e_procs_env(const char *needle, pid_t *out, int max)
{
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    size_t nl = strlen(needle);
    int found = 0;
    struct dirent *de;
    while (found < max && (de = readdir(d))) {
        if (!isdigit((unsigned char)de->d_name[0]))
            continue;
        pid_t pid = (pid_t)atoi(de->d_name);
        if (pid == getpid())
            continue;
        char path[64], buf[65536];
        snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            continue;
        ssize_t n = read(fd, buf, sizeof buf);
        close(fd);
        if (n > 0 && memmem(buf, (size_t)n, needle, nl))
            out[found++] = pid;
    }
    closedir(d);
    return found;
}

/* Kills ranks (kiln-train) left behind by a killed agent: any process whose environment points
 * into this test's directory. */
static void e2e_kill_strays(const char *dir)
{
    char needle[300];
    snprintf(needle, sizeof needle, "=%s/", dir);
    pid_t pids[64];
    int n = e2e_procs_env(needle, pids, 64);
    for (int i = 0; i < n; i++)
        kill(pids[i], SIGKILL);
}

static void e2e_tail(const char *title, const char *path, int lines)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "---- %s (%s): missing\n", title, path);
        return;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    long start = size > 16384 ? size - 16384 : 0;
    fseek(f, start, SEEK_SET);
    char *buf = calloc(1, 16385);
    size_t n = fread(buf, 1, 16384, f);
    fclose(f);
    buf[n] = '\0';
    char *p = buf + n;
    int seen = 0;
    while (p > buf && seen <= lines)
        if (*--p == '\n')
            seen++;
    fprintf(stderr, "---- %s (%s), last lines:\n%s\n", title, path, p == buf ? p : p + 1);
    free(buf);
}

/* Sanitizer reports of the processes we started (SAN=1 builds) are copied to this test's
 * stderr, where tests/run.sh looks for them. */
static void e2e_echo_sanitizer(const char *who, const char *text)
{
    const char *p = text ? strstr(text, "ERROR: AddressSanitizer") : NULL;
    if (!p && text)
        p = strstr(text, "ERROR: LeakSanitizer");
    if (!p && text)
        p = strstr(text, "runtime error:");
    if (p)
        fprintf(stderr, "e2e: sanitizer report from %s:\n%.6000s\n", who, p);
}

/* A secret kilnd hands out ("kiln_", "kiln_join_" or "kiln_agent_" and 43 base64url
 * characters) anywhere in text: the start of the first one, or NULL. */
static const char *e2e_find_secret(const char *text)
{
    for (const char *p = text ? strstr(text, "kiln_") : NULL; p; p = strstr(p + 1, "kiln_")) {
        const char *q = p + 5;
        if (!strncmp(q, "join_", 5))
            q += 5;
        else if (!strncmp(q, "agent_", 6))
            q += 6;
        size_t n = strspn(q, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_");
        if (n >= 43)
            return p;
    }
    return NULL;
}

void e2e_dump_logs(void)
{
    e2e_cluster_t *c = e2e_cl;
    if (!c)
        return;
    char path[400];
    snprintf(path, sizeof path, "%s/kilnd.log", c->dir);
    e2e_tail("kilnd", path, 40);
    if (c->nkilnd > 1) {
        snprintf(path, sizeof path, "%s/kilnd1.log", c->dir);
        e2e_tail("kilnd replica 1", path, 40);
    }
    for (int i = 0; i < E2E_AGENTS; i++) {
        char title[32];
        snprintf(path, sizeof path, "%s/agent%d.log", c->dir, i);
        snprintf(title, sizeof title, "agent %d", i);
        e2e_tail(title, path, 25);
    }
}

static bool e2e_alive(pid_t pid)
{
    int st;
    return pid > 0 && waitpid(pid, &st, WNOHANG) == 0;
}

/* Runs `bin --help` and says whether its text mentions flag. */
static bool e2e_has_flag(const char *bin, const char *flag)
{
    char *out = NULL, *err = NULL;
    char *argv[] = {(char *)bin, "--help", NULL};
    e2e_run(argv, NULL, &out, &err, 5000);
    bool yes = (out && strstr(out, flag)) || (err && strstr(err, flag));
    free(out);
    free(err);
    return yes;
}

static void e2e_fail_setup(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    e2e_dump_logs();
    cr_assert_fail("e2e setup: %s", msg);
}

/* Starts kilnd and waits for /readyz. Returns true when it is up, false when it exited during
 * start-up (its log says why: typically a port another test took between th_free_port() and
 * kilnd's bind). Fails the test when it neither dies nor becomes ready within 30 s. */
static const char *const *e2e_kilnd_flags; /* more kilnd flags for the test's set-up, or NULL */

static bool e2e_kilnd_try_start_i(int r)
{
    e2e_cluster_t *c = e2e_cl;
    char http_addr[64], grpc_addr[64], hb[32], log[PATH_MAX];
    pid_t *pid = r ? &c->kilnd1 : &c->kilnd;
    const char *base = r ? c->url1 : c->url0;
    snprintf(http_addr, sizeof http_addr, "127.0.0.1:%d", r ? c->http_port1 : c->http_port);
    snprintf(grpc_addr, sizeof grpc_addr, "127.0.0.1:%d", r ? c->grpc_port1 : c->grpc_port);
    char *argv[32] = {e2e_bin("kilnd"), "--database-url", c->db_url, "--http-addr", http_addr,
                      "--grpc-addr", grpc_addr};
    int argc = 7;
    /* TLS on both APIs, mutual TLS for agents, the first admin's token and the join token. */
    static char cert[PATH_MAX], key[PATH_MAX], ca[PATH_MAX], boot[PATH_MAX], arts[PATH_MAX];
    snprintf(cert, sizeof cert, "%.255s/server.pem", c->tls_dir);
    snprintf(key, sizeof key, "%.255s/server.key", c->tls_dir);
    snprintf(ca, sizeof ca, "%.255s/ca.pem", c->tls_dir);
    snprintf(boot, sizeof boot, "%.127s/admin.token", c->dir);
    snprintf(arts, sizeof arts, "%.127s/artifacts", c->dir);
    char *more[] = {"--tls-cert", cert, "--tls-key", key, "--tls-ca", ca, "--bootstrap-token-file", boot,
                    "--join-token-file", c->join_file, "--artifact-dir", arts};
    for (size_t i = 0; i < (sizeof more / sizeof more[0]); i++)
        argv[argc++] = more[i];
    if (c->heartbeat_timeout_ms > 0) {
        snprintf(hb, sizeof hb, "%d", c->heartbeat_timeout_ms);
        argv[argc++] = "--heartbeat-timeout-ms";
        argv[argc++] = hb;
    }
    for (int i = 0; e2e_kilnd_flags && e2e_kilnd_flags[i] && argc < 31; i++)
        argv[argc++] = (char *)e2e_kilnd_flags[i];
    argv[argc] = NULL;
    snprintf(log, sizeof log, r ? "%s/kilnd1.log" : "%s/kilnd.log", c->dir);
    *pid = e2e_spawn(argv, NULL, log, NULL);
    cr_assert(*pid > 0, "could not start kilnd");

    /* kilnd is ready when /readyz answers 200 (database reachable, migrations applied) and it is
     * still alive (so the answer did not come from another test's kilnd on the same port). */
    char url[PATH_MAX];
    snprintf(url, sizeof url, "%s/readyz", base);
    for (int i = 0; i < 300; i++) {
        long st = 0;
        char *body = NULL;
        bool ok = th_http("GET", url, NULL, NULL, &st, &body, 2000) == 0 && st == 200;
        free(body);
        if (!e2e_alive(*pid)) {
            *pid = 0;
            return false;
        }
        if (ok && !c->admin_token[0]) {
            /* kilnd wrote the first admin's token when it created the database */
            char *tok = e2e_slurp(boot);
            tok[strcspn(tok, "\n")] = '\0';
            snprintf(c->admin_token, sizeof c->admin_token, "%s", tok);
            free(tok);
            th_http_set_token(c->admin_token);
        }
        if (ok)
            return true;
        usleep(100000);
    }
    e2e_fail_setup("kilnd did not become ready at %s within 30 s", url);
    return false;
}

static bool e2e_kilnd_try_start(void)
{
    return e2e_kilnd_try_start_i(0);
}

void e2e_kilnd_start(void)
{
    if (!e2e_kilnd_try_start())
        e2e_fail_setup("kilnd exited during start-up");
}

void e2e_replica_start(int i)
{
    if (!e2e_kilnd_try_start_i(i))
        e2e_fail_setup("kilnd replica %d exited during start-up", i);
}

pid_t e2e_replica_pid(int i)
{
    return i ? e2e_cl->kilnd1 : e2e_cl->kilnd;
}

void e2e_replica_signal(int i, int sig)
{
    pid_t *pid = i ? &e2e_cl->kilnd1 : &e2e_cl->kilnd;
    if (*pid <= 0)
        return;
    kill(*pid, sig);
    if (sig == SIGKILL) {
        kill(-*pid, SIGKILL);
        int st;
        waitpid(*pid, &st, 0);
        *pid = 0;
    }
}

void e2e_use_replica(int i)
{
    snprintf(e2e_cl->url, sizeof e2e_cl->url, "%s", i ? e2e_cl->url1 : e2e_cl->url0);
}

/* Whether replica i is up and says on /healthz that it leads. */
static bool replica_leads(int i)
{
    if (e2e_replica_pid(i) <= 0)
        return false;
    char url[128];
    snprintf(url, sizeof url, "%s/healthz", i ? e2e_cl->url1 : e2e_cl->url0);
    long st = 0;
    char *body = NULL;
    bool lead = false;
    if (th_http("GET", url, NULL, NULL, &st, &body, 2000) == 0 && st == 200) {
        json_t *j = json_loads(body, 0, NULL);
        lead = json_is_true(json_object_get(j, "leader"));
        json_decref(j);
    }
    free(body);
    return lead;
}

int e2e_leader(long timeout_ms)
{
    for (long waited = 0;; waited += 100) {
        for (int i = 0; i < e2e_cl->nkilnd; i++)
            if (replica_leads(i))
                return i;
        if (waited >= timeout_ms)
            return -1;
        usleep(100000);
    }
}

int e2e_leaders(void)
{
    int mask = 0;
    for (int i = 0; i < e2e_cl->nkilnd; i++)
        if (replica_leads(i))
            mask |= 1 << i;
    return mask;
}

void e2e_kilnd_kill(void)
{
    e2e_cluster_t *c = e2e_cl;
    if (c->kilnd > 0) {
        kill(-c->kilnd, SIGKILL);
        int st;
        waitpid(c->kilnd, &st, 0);
        c->kilnd = 0;
    }
}

/* Each agent's command line and environment (NULL: the test's own), kept for e2e_agent_restart
 * (heap strings; the environment is the caller's static array). */
static char *e2e_agent_argv[E2E_AGENTS][40];
static char *const *e2e_agent_envp;

/* A cluster of kilnd replicas (1 or 2) on the shared test PostgreSQL or, with own_pg, on the
 * test's own (its socket directory); agents pass --comm-watchdog-s comm_watchdog_s when above 0
 * and run with agent_env (NULL: this process's environment). */
static void e2e_start(int heartbeat_timeout_ms, int replicas, const char *own_pg, int comm_watchdog_s,
                      char *const *agent_env)
{
    e2e_cluster_t *c = &e2e_storage;
    memset(c, 0, sizeof *c);
    e2e_cl = c;
    e2e_agent_envp = agent_env;
    if (own_pg)
        snprintf(c->own_pg, sizeof c->own_pg, "%s", own_pg);
    /* Ranks orphaned by a killed agent are reparented to this test process (and reaped in
     * teardown) rather than to the test runner, which does not expect them. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    snprintf(c->dir, sizeof c->dir, "/tmp/ke2e.XXXXXX");
    cr_assert_not_null(mkdtemp(c->dir), "mkdtemp: %s", strerror(errno));
    if (own_pg) {
        char url[256];
        snprintf(url, sizeof url, "host=%s port=5432 user=postgres dbname=chaos", own_pg);
        c->db_url = strdup(url);
    } else {
        c->db_url = th_pg_create_db("e2e");
    }
    cr_assert_not_null(c->db_url, "no test database (run through tests/run.sh)");
    c->heartbeat_timeout_ms = heartbeat_timeout_ms > 0 && e2e_has_flag(e2e_bin("kilnd"), "heartbeat-timeout-ms")
                                  ? heartbeat_timeout_ms : 0;
    const char *tls = th_tls_dir();
    cr_assert_not_null(tls, "no test certificates");
    snprintf(c->tls_dir, sizeof c->tls_dir, "%s", tls);
    snprintf(c->join_file, sizeof c->join_file, "%.127s/join.token", c->dir);
    char ca[PATH_MAX];
    snprintf(ca, sizeof ca, "%.255s/ca.pem", c->tls_dir);
    th_http_set_ca(ca);
    /* Free ports can be taken by a parallel test before kilnd binds them: then try others. */
    bool up = false;
    for (int attempt = 0; attempt < 3 && !up; attempt++) {
        c->http_port = th_free_port();
        c->grpc_port = th_free_port();
        while (c->grpc_port == c->http_port)
            c->grpc_port = th_free_port();
        snprintf(c->url, sizeof c->url, "https://127.0.0.1:%d", c->http_port);
        snprintf(c->url0, sizeof c->url0, "https://127.0.0.1:%d", c->http_port);
        up = e2e_kilnd_try_start();
    }
    if (!up)
        e2e_fail_setup("kilnd exited during start-up (3 tries)");
    c->nkilnd = 1;
    /* agents know every replica: --server A,B */
    char grpc_addr[160], log[PATH_MAX];
    snprintf(grpc_addr, sizeof grpc_addr, "127.0.0.1:%d", c->grpc_port);
    if (replicas > 1) {
        up = false;
        for (int attempt = 0; attempt < 3 && !up; attempt++) {
            do
                c->http_port1 = th_free_port();
            while (c->http_port1 == c->http_port || c->http_port1 == c->grpc_port);
            do
                c->grpc_port1 = th_free_port();
            while (c->grpc_port1 == c->http_port1 || c->grpc_port1 == c->http_port || c->grpc_port1 == c->grpc_port);
            snprintf(c->url1, sizeof c->url1, "https://127.0.0.1:%d", c->http_port1);
            up = e2e_kilnd_try_start_i(1);
        }
        if (!up)
            e2e_fail_setup("kilnd replica 1 exited during start-up (3 tries)");
        c->nkilnd = 2;
        snprintf(grpc_addr, sizeof grpc_addr, "127.0.0.1:%d,127.0.0.1:%d", c->grpc_port, c->grpc_port1);
    }
    if (c->heartbeat_timeout_ms == 0)
        c->heartbeat_timeout_ms = 10000; /* kilnd's default */

    const char *agent = e2e_bin("kiln-agent");
    bool has_cores = e2e_has_flag(agent, "--cores");
    bool has_ports = e2e_has_flag(agent, "--rendezvous-ports");
    bool has_python = e2e_has_flag(agent, "--python");
    char watchdog[16];
    snprintf(watchdog, sizeof watchdog, "%d", comm_watchdog_s);
    if (comm_watchdog_s > 0)
        cr_assert(e2e_has_flag(agent, "--comm-watchdog-s"), "kiln-agent has no --comm-watchdog-s");
    /* What jobs may read: the repository's data; where both agents may keep checkpoints: a
     * directory beside (not above) their work dirs. */
    char data_root[PATH_MAX + 8], shared_root[PATH_MAX];
    snprintf(data_root, sizeof data_root, "%s/data", e2e_root());
    snprintf(shared_root, sizeof shared_root, "%.200s/shared-checkpoints", c->dir);
    mkdir(shared_root, 0755);
    for (int i = 0; i < E2E_AGENTS; i++) {
        char slots[8];
        c->agent_slots[i] = i == 0 ? 2 : 1;
        snprintf(slots, sizeof slots, "%d", c->agent_slots[i]);
        snprintf(c->work_dir[i], sizeof c->work_dir[i], "%.127s/w%d", c->dir, i);
        mkdir(c->work_dir[i], 0755);
        char *aargv[40] = {(char *)agent, "--server", grpc_addr, "--slots", slots, "--slot-type", "cpu",
                           "--work-dir", c->work_dir[i], "--data-root", data_root, "--data-root", shared_root};
        int an = 13;
        static char ca[PATH_MAX], cert[PATH_MAX], key[PATH_MAX];
        /* Mutual TLS and the join token, as agents on a shared cluster run. */
        snprintf(ca, sizeof ca, "%.255s/ca.pem", c->tls_dir);
        snprintf(cert, sizeof cert, "%.255s/agent.pem", c->tls_dir);
        snprintf(key, sizeof key, "%.255s/agent.key", c->tls_dir);
        char *more[] = {"--join-token-file", c->join_file, "--tls-ca", ca, "--tls-cert", cert, "--tls-key", key};
        for (size_t k = 0; k < (sizeof more / sizeof more[0]); k++)
            aargv[an++] = more[k];
        if (has_cores) {
            /* The machine has 2 cores shared by every test: one thread per rank. */
            aargv[an++] = "--cores";
            aargv[an++] = slots;
        }
        if (comm_watchdog_s > 0) {
            aargv[an++] = "--comm-watchdog-s";
            aargv[an++] = watchdog;
        }
        /* Clusters of tests running side by side share this host: each agent of each cluster
         * gets rendezvous ports of its own (below the ephemeral range), so two agents never
         * hand the same free port to ranks of different jobs that rendezvous at once. */
        char ports[32];
        if (has_ports) {
            int base = 20000 + (int)(getpid() % 500) * 16 + i * 8;
            snprintf(ports, sizeof ports, "%d-%d", base, base + 7);
            aargv[an++] = "--rendezvous-ports";
            aargv[an++] = ports;
        }
        /* Script jobs' Python: Debian's, the one python3-torch installs for */
        if (has_python) {
            aargv[an++] = "--python";
            aargv[an++] = "/usr/bin/python3";
        }
        static char maddr[E2E_AGENTS][32];
        c->metrics_port[i] = th_free_port();
        snprintf(maddr[i], sizeof maddr[i], "127.0.0.1:%d", c->metrics_port[i]);
        aargv[an++] = "--metrics-addr";
        aargv[an++] = maddr[i];
        aargv[an] = NULL;
        for (int k = 0; k < an; k++)
            e2e_agent_argv[i][k] = strdup(aargv[k]);
        e2e_agent_argv[i][an] = NULL;
        snprintf(log, sizeof log, "%s/agent%d.log", c->dir, i);
        c->agents[i] = e2e_spawn(e2e_agent_argv[i], agent_env, log, NULL);
        cr_assert(c->agents[i] > 0, "could not start kiln-agent %d", i);
    }

    /* Both workers ALIVE. */
    char url[PATH_MAX];
    int alive = 0;
    json_t *w = NULL;
    for (int i = 0; i < 300; i++) {
        long st = 0;
        char *body = NULL;
        snprintf(url, sizeof url, "%s/v1/workers", c->url);
        alive = 0;
        if (th_http("GET", url, NULL, NULL, &st, &body, 2000) == 0 && st == 200) {
            json_decref(w);
            w = json_loads(body, 0, NULL);
            size_t k;
            json_t *x;
            json_array_foreach(json_object_get(w, "workers"), k, x)
                if (!strcmp(e2e_jstr(x, "state"), "ALIVE"))
                    alive++;
        }
        free(body);
        if (alive == E2E_AGENTS)
            break;
        for (int a = 0; a < E2E_AGENTS; a++)
            if (!e2e_alive(c->agents[a])) {
                c->agents[a] = 0;
                json_decref(w);
                e2e_fail_setup("kiln-agent %d exited during start-up", a);
            }
        usleep(100000);
    }
    if (alive != E2E_AGENTS) {
        char *s = w ? json_dumps(w, JSON_COMPACT) : NULL;
        fprintf(stderr, "e2e: last /v1/workers reply: %s\n", s ? s : "(none)");
        free(s);
        json_decref(w);
        e2e_fail_setup("%d of %d workers ALIVE after 30 s", alive, E2E_AGENTS);
    }
    size_t k;
    json_t *x;
    json_array_foreach(json_object_get(w, "workers"), k, x)
        if (k < E2E_AGENTS)
            snprintf(c->worker_id[k], sizeof c->worker_id[k], "%s", e2e_jstr(x, "id"));
    json_decref(w);
}

void e2e_setup(void)
{
    e2e_start(0, 1, NULL, 0, NULL);
}

void e2e_setup_fast_heartbeat(void)
{
    e2e_start(3000, 1, NULL, 0, NULL);
}

void e2e_setup_replicas(void)
{
    e2e_start(3000, 2, NULL, 0, NULL);
}

/* Runs a pg.sh function for the test's own cluster (dir "" to make one); returns its output. */
static char *e2e_pg_sh(const char *dir, const char *commands)
{
    char script[1200];
    snprintf(script, sizeof script, "source '%s/scripts/pg.sh' && export KILN_PG_PORT=5432 KILN_PG_DIR='%s' && %s",
             e2e_root(), dir, commands);
    char *argv[] = {"/bin/bash", "-c", script, NULL};
    char *out = NULL, *err = NULL;
    int st = e2e_run(argv, NULL, &out, &err, 60000);
    cr_assert_eq(st, 0, "pg.sh: %s failed: %s%s", commands, out ? out : "", err ? err : "");
    free(err);
    return out;
}

void e2e_setup_chaos(void)
{
    char *out = e2e_pg_sh("", "pg_start && pg_createdb chaos >/dev/null && printf '%s' \"$KILN_PG_DIR\"");
    cr_assert(out && out[0] == '/', "no PostgreSQL of the test's own: %s", out ? out : "");
    e2e_start(3000, 2, out, 0, NULL);
    free(out);
}

void e2e_pg_crash(void)
{
    free(e2e_pg_sh(e2e_cl->own_pg, "pg_crash"));
}

void e2e_pg_resume(void)
{
    free(e2e_pg_sh(e2e_cl->own_pg, "pg_resume"));
}

void e2e_agent_signal(int i, int sig)
{
    e2e_cluster_t *c = e2e_cl;
    if (c->agents[i] <= 0)
        return;
    kill(c->agents[i], sig);
    if (sig == SIGKILL) {
        int st;
        waitpid(c->agents[i], &st, 0);
        c->agents[i] = 0;
    }
}

void e2e_agent_restart(int i)
{
    e2e_cluster_t *c = e2e_cl;
    if (c->agents[i] > 0) {
        kill(c->agents[i], SIGKILL);
        int st;
        waitpid(c->agents[i], &st, 0);
    }
    char log[PATH_MAX];
    snprintf(log, sizeof log, "%s/agent%d.log", c->dir, i);
    c->agents[i] = e2e_spawn(e2e_agent_argv[i], e2e_agent_envp, log, NULL);
    cr_assert(c->agents[i] > 0, "could not start kiln-agent %d again", i);
}

void e2e_agent_restart_on(int i, int replica)
{
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", replica ? e2e_cl->grpc_port1 : e2e_cl->grpc_port);
    for (int k = 0; k + 1 < 40 && e2e_agent_argv[i][k + 1]; k++)
        if (!strcmp(e2e_agent_argv[i][k], "--server")) {
            free(e2e_agent_argv[i][k + 1]);
            e2e_agent_argv[i][k + 1] = strdup(addr);
            cr_assert(e2e_agent_argv[i][k + 1], "out of memory");
            break;
        }
    e2e_agent_restart(i);
}

void e2e_setup_short_watchdog(void)
{
    e2e_start(0, 1, NULL, E2E_WATCHDOG_S, NULL);
}

void e2e_setup_approval(void)
{
    static const char *const flags[] = {"--agent-approval", NULL};
    e2e_kilnd_flags = flags;
    e2e_start(0, 1, NULL, 0, NULL);
}

void e2e_setup_slow_heartbeat(void)
{
    static const char *const flags[] = {"--heartbeat-interval-ms", E2E_SLOW_HEARTBEAT_MS, NULL};
    e2e_kilnd_flags = flags;
    e2e_start(300000, 1, NULL, 0, NULL);
}

void e2e_setup_replicas_slow_heartbeat(void)
{
    static const char *const flags[] = {"--heartbeat-interval-ms", E2E_SLOW_HEARTBEAT_MS, NULL};
    e2e_kilnd_flags = flags;
    e2e_start(300000, 2, NULL, 0, NULL);
}

void e2e_setup_register_limit(void)
{
    static const char *const flags[] = {"--register-per-min-per-addr", "11", NULL};
    e2e_kilnd_flags = flags;
    e2e_start(0, 1, NULL, 0, NULL);
}

void e2e_setup_promoted_restart(void)
{
    static const char *const flags[] = {"--tune-promoted-restart", NULL};
    e2e_kilnd_flags = flags;
    e2e_start(0, 1, NULL, 0, NULL);
}

void e2e_setup_slow_uploads(void)
{
    static char *env[] = {"KILN_AGENT_UPLOAD_CHUNK_KB=4", "KILN_AGENT_UPLOAD_DELAY_MS=150", NULL};
    e2e_start(0, 1, NULL, 0, env);
}

void e2e_teardown(void)
{
    e2e_cluster_t *c = e2e_cl;
    if (!c)
        return;
    if (!c->passed) {
        fprintf(stderr, "e2e: test did not pass; logs and work dirs kept in %s\n", c->dir);
        e2e_dump_logs();
    }
    for (int i = 0; i < E2E_AGENTS; i++)
        e2e_stop(c->agents[i], 5000);
    e2e_stop(c->kilnd, 5000);
    e2e_stop(c->kilnd1, 5000);
    for (int i = 0; i < E2E_AGENTS; i++)
        for (int k = 0; k < 40 && e2e_agent_argv[i][k]; k++) {
            free(e2e_agent_argv[i][k]);
            e2e_agent_argv[i][k] = NULL;
        }
    e2e_kill_strays(c->dir);
    static const char *const logs[] = {"kilnd.log", "kilnd1.log", "agent0.log", "agent1.log"};
    for (size_t i = 0; i < sizeof logs / sizeof logs[0]; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", c->dir, logs[i]);
        char *text = e2e_slurp(path);
        e2e_echo_sanitizer(logs[i], text);
        /* No token, join token or credential is ever written to a log (tests/run.sh fails the
         * run on this line; the secret itself is not repeated here). */
        const char *secret = e2e_find_secret(text);
        if (secret)
            fprintf(stderr, "e2e: SECRET IN LOG: %s has a token at byte %ld\n", logs[i], (long)(secret - text));
        free(text);
    }
    /* Reap everything that ended up ours (see PR_SET_CHILD_SUBREAPER in e2e_start). */
    for (int i = 0; i < 100; i++) {
        pid_t r = waitpid(-1, NULL, WNOHANG);
        if (r < 0)
            break; /* no children left */
        if (r == 0)
            usleep(20000);
    }
    if (c->own_pg[0])
        free(e2e_pg_sh(c->own_pg, "pg_stop"));
    if (c->passed && getenv("KILN_E2E_KEEP"))
        fprintf(stderr, "e2e: KILN_E2E_KEEP is set: logs and work dirs kept in %s\n", c->dir);
    else if (c->passed) {
        char *argv[] = {"/bin/rm", "-rf", c->dir, NULL};
        e2e_run(argv, NULL, NULL, NULL, 10000);
    }
    free(c->db_url);
    e2e_cl = NULL;
}

void e2e_pass(void)
{
    if (e2e_cl)
        e2e_cl->passed = true;
}

/* ---- REST ----------------------------------------------------------------------------------- */

json_t *e2e_http(const char *method, const char *path, const char *body, const char *header, long *status)
{
    char url[512];
    snprintf(url, sizeof url, "%s%s", e2e_cl->url, path);
    const char *hdrs[2] = {header, NULL};
    char *out = NULL;
    long st = 0;
    int rc = th_http(method, url, body, header ? hdrs : NULL, &st, &out, 30000);
    cr_assert_eq(rc, 0, "%s %s: kilnd did not answer", method, url);
    json_t *j = json_loads(out, 0, NULL);
    free(out);
    if (status)
        *status = st;
    return j ? j : json_object();
}

json_t *e2e_get(const char *path)
{
    long st = 0;
    json_t *j = e2e_http("GET", path, NULL, NULL, &st);
    if (st != 200) {
        char *s = json_dumps(j, JSON_COMPACT);
        cr_assert_fail("GET %s: HTTP %ld: %s", path, st, s);
    }
    return j;
}

json_t *e2e_grpc(const char *method, json_t *request)
{
    char plan_path[PATH_MAX], proto_dir[PATH_MAX], ca[PATH_MAX];
    snprintf(proto_dir, sizeof proto_dir, "%s/proto-py", e2e_cl->dir);
    cr_assert_eq(th_protoc_python(proto_dir), 0);
    snprintf(ca, sizeof ca, "%s/ca.pem", e2e_cl->tls_dir);
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", e2e_cl->grpc_port);
    json_t *plan = json_pack("{s:s, s:s, s:s, s:[{s:s, s:o, s:s, s:b}]}", "target", target, "proto_dir", proto_dir,
                             "ca", ca, "calls", "method", method, "request", request, "token",
                             e2e_cl->admin_token, "client_cert", 0);
    snprintf(plan_path, sizeof plan_path, "%s/grpc-plan.json", e2e_cl->dir);
    char said[4096];
    json_t *ans = th_grpc_client(plan, plan_path, said, sizeof said);
    cr_assert_not_null(ans, "grpc_client.py: %s", said);
    json_t *out = json_incref(json_array_get(ans, 0));
    json_decref(ans);
    cr_assert_not_null(out, "grpc_client.py gave no answer");
    return out;
}

json_t *e2e_submit(const char *spec)
{
    long st = 0;
    json_t *j = e2e_http("POST", "/v1/jobs", spec, NULL, &st);
    if (st != 201) {
        char *s = json_dumps(j, JSON_COMPACT);
        cr_assert_fail("POST /v1/jobs: HTTP %ld (want 201): %s", st, s);
    }
    return j;
}

json_t *e2e_wait_state(const char *job_id, const char *states, long timeout_ms)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", job_id);
    json_t *j = NULL;
    for (long waited = 0;; waited += 100) {
        json_decref(j);
        j = e2e_get(path);
        const char *s = json_string_value(json_object_get(j, "state"));
        if (th_state_in(s, states))
            return j;
        if (waited >= timeout_ms)
            break;
        usleep(100000);
    }
    char *s = json_dumps(j, JSON_COMPACT);
    cr_assert_fail("job %s not in %s after %ld ms; last: %.1500s", job_id, states, timeout_ms, s);
    return NULL;
}

json_t *e2e_wait_step(const char *job_id, long step, long timeout_ms)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", job_id);
    json_t *j = NULL;
    for (long waited = 0;; waited += 100) {
        json_decref(j);
        j = e2e_get(path);
        const char *s = e2e_jstr(j, "state");
        json_int_t got = json_integer_value(json_object_get(json_object_get(j, "progress"), "step"));
        if (!strcmp(s, "RUNNING") && got >= step)
            return j;
        if (th_state_in(s, TH_JOB_ENDED) || waited >= timeout_ms)
            break;
        usleep(100000);
    }
    char *s = json_dumps(j, JSON_COMPACT);
    cr_assert_fail("job %s did not reach step %ld while RUNNING; last: %.1500s", job_id, step, s);
    return NULL;
}

/* The job's progress.step as kilnd reports it, once it has stopped changing (two equal reads
 * 150 ms apart): what the frozen ranks sent has arrived. Sets *state (static storage). */
static json_int_t e2e_settled_step(const char *path, const char **state)
{
    static char st[32];
    json_int_t last = -1;
    for (int i = 0; i < 50; i++) {
        json_t *j = e2e_get(path);
        json_int_t step = json_integer_value(json_object_get(json_object_get(j, "progress"), "step"));
        snprintf(st, sizeof st, "%s", e2e_jstr(j, "state"));
        json_decref(j);
        if (step == last)
            break;
        last = step;
        usleep(150000);
    }
    *state = st;
    return last;
}

json_t *e2e_freeze_at_step(const char *job_id, long step, long timeout_ms, pid_t *ranks, int *n_ranks)
{
    char path[128], needle[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", job_id);
    snprintf(needle, sizeof needle, "KILN_JOB_ID=%s", job_id);
    const char *state = "";
    json_int_t got = 0;
    int n = 0; /* the ranks found and running (not frozen) */
    int64_t deadline = (int64_t)time(NULL) + timeout_ms / 1000 + 1;
    while ((int64_t)time(NULL) < deadline) {
        /* the ranks of the last look stopped first, then /proc scanned for the job's ranks (a
         * rank that started since is stopped too): the scan, slow on a busy machine, is no
         * longer time the ranks train in */
        for (int i = 0; i < n; i++)
            kill(ranks[i], SIGSTOP);
        n = e2e_procs_env(needle, ranks, E2E_MAX_RANKS);
        for (int i = 0; i < n; i++)
            kill(ranks[i], SIGSTOP);
        if (n == 0) { /* not started yet, or already gone */
            json_t *j = e2e_get(path);
            bool ended = th_state_in(e2e_jstr(j, "state"), TH_JOB_ENDED);
            json_decref(j);
            cr_assert(!ended, "job %s ended before it could be frozen at step %ld", job_id, step);
            usleep(5000);
            continue;
        }
        got = e2e_settled_step(path, &state);
        if (!strcmp(state, "RUNNING") && got >= step) {
            *n_ranks = n;
            return e2e_get(path);
        }
        /* Let them run a little: 20 ms is a dozen steps of the tiny model, far fewer than any
         * test job has, so the job cannot end between two looks. */
        for (int i = 0; i < n; i++)
            kill(ranks[i], SIGCONT);
        usleep(20000);
    }
    cr_assert_fail("job %s did not reach step %ld while RUNNING (last: %s at step %lld)", job_id, step, state,
                   (long long)got);
    return NULL;
}

pid_t e2e_rank_pid(const char *job_id, int rank)
{
    char want_job[128], want_rank[32];
    snprintf(want_job, sizeof want_job, "KILN_JOB_ID=%s", job_id);
    snprintf(want_rank, sizeof want_rank, "KILN_RANK=%d", rank);
    pid_t pids[E2E_MAX_RANKS];
    int n = e2e_procs_env(want_job, pids, E2E_MAX_RANKS);
    for (int i = 0; i < n; i++) {
        char path[64], buf[65536];
        snprintf(path, sizeof path, "/proc/%d/environ", (int)pids[i]);
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            continue;
        ssize_t len = read(fd, buf, sizeof buf - 1);
        close(fd);
        /* entries are NUL-separated: compare whole entries */
        for (ssize_t k = 0; len > 0 && k < len; k += (ssize_t)strlen(buf + k) + 1) {
            buf[len] = '\0';
            if (!strcmp(buf + k, want_rank))
                return pids[i];
        }
    }
    return -1;
}

bool e2e_pid_gone(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return true;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return true;
    buf[n] = '\0';
    /* "pid (comm) S ...": a zombie (Z) or dead (X) process is gone too */
    const char *p = strrchr(buf, ')');
    return !p || p[1] != ' ' || p[2] == 'Z' || p[2] == 'X';
}

void e2e_thaw(const pid_t *ranks, int n_ranks)
{
    for (int i = 0; i < n_ranks; i++)
        kill(ranks[i], SIGCONT);
}

json_t *e2e_events(const char *job_id)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/events", job_id);
    return e2e_get(path);
}

char *e2e_event_states(const json_t *events, char *buf, size_t n)
{
    size_t off = 0, i;
    json_t *e;
    buf[0] = '\0';
    json_array_foreach(json_object_get(events, "events"), i, e) {
        if (off < n)
            off += (size_t)snprintf(buf + off, n - off, "%s%s", i ? "," : "",
                                    e2e_jstr(e, "to_state"));
    }
    return buf;
}

char *e2e_spec(const char *name, int max_steps, int nodes, int slots_per_node, int batch)
{
    json_t *j = json_pack("{s:s, s:{s:s, s:i, s:i, s:i, s:i, s:s},"
                          " s:{s:s, s:f},"
                          " s:{s:f, s:i, s:i, s:i, s:i, s:i, s:i},"
                          " s:{s:i, s:i, s:s},"
                          " s:{s:s}}",
                          "name", name,
                          "model", "type", "gpt", "n_layer", 2, "n_head", 2, "n_embd", 32, "seq_len", 32,
                          "vocab", "bytes",
                          "data", "train", e2e_data_path(), "val_fraction", 0.1,
                          "hyperparameters", "lr", 3e-3, "global_batch_size", batch, "max_steps", max_steps,
                          "warmup_steps", 2, "seed", 7, "eval_every", 0, "sample_every", 0,
                          "resources", "nodes", nodes, "slots_per_node", slots_per_node, "slot_type", "cpu",
                          "tags", "suite", "e2e");
    cr_assert_not_null(j, "could not build the job spec");
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

/* ---- child programs ------------------------------------------------------------------------ */

char *e2e_slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = calloc(1, (size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    buf[got] = '\0';
    fclose(f);
    return buf;
}

int e2e_run(char *const argv[], char *const env[], char **out, char **err, long timeout_ms)
{
    static int counter;
    char opath[PATH_MAX], epath[PATH_MAX];
    const char *dir = e2e_cl ? e2e_cl->dir : "/tmp";
    snprintf(opath, sizeof opath, "%s/run.%d.%d.out", dir, (int)getpid(), counter);
    snprintf(epath, sizeof epath, "%s/run.%d.%d.err", dir, (int)getpid(), counter++);
    unlink(opath);
    unlink(epath);
    pid_t pid = e2e_spawn(argv, env, epath, opath);
    int rc = e2e_wait_exit(pid, timeout_ms);
    if (rc == -1)
        fprintf(stderr, "e2e: %s did not finish within %ld ms (or was killed)\n", argv[0], timeout_ms);
    char *errtext = e2e_slurp(epath);
    e2e_echo_sanitizer(argv[0], errtext);
    if (out)
        *out = e2e_slurp(opath);
    if (err)
        *err = errtext;
    else
        free(errtext);
    unlink(opath);
    unlink(epath);
    return rc;
}

int e2e_wait_exit(pid_t pid, long timeout_ms)
{
    int status = 0;
    if (pid <= 0)
        return -1;
    for (long waited = 0; waited <= timeout_ms; waited += 20) {
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        usleep(20000);
    }
    kill(-pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

pid_t e2e_kiln_bg(const char *out_path, const char *err_path, ...)
{
    char *argv[32];
    int n = 0;
    argv[n++] = e2e_bin("kiln");
    va_list ap;
    va_start(ap, err_path);
    for (char *a; n < 31 && (a = va_arg(ap, char *));)
        argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    return e2e_spawn(argv, e2e_client_env(0), err_path, out_path);
}

char **e2e_client_env(int extra)
{
    static char url[128], token[200], ca[320];
    static char *env[16];
    int n = 0;
    snprintf(url, sizeof url, "KILN_URL=%s", e2e_cl->url);
    env[n++] = url;
    snprintf(token, sizeof token, "KILN_TOKEN=%s", e2e_cl->admin_token);
    snprintf(ca, sizeof ca, "KILN_TLS_CA=%.255s/ca.pem", e2e_cl->tls_dir);
    env[n++] = token;
    env[n++] = ca;
    for (int i = 0; i <= extra && n < 16; i++)
        env[n++] = NULL;
    return env;
}

int e2e_kiln(char **out, char **err, ...)
{
    char *argv[32];
    int n = 0;
    argv[n++] = e2e_bin("kiln");
    va_list ap;
    va_start(ap, err);
    for (char *a; n < 31 && (a = va_arg(ap, char *));)
        argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    return e2e_run(argv, e2e_client_env(0), out, err, 120000);
}

int e2e_agent_of_job(const char *job_id)
{
    for (int i = 0; i < E2E_AGENTS; i++) {
        char path[PATH_MAX];
        struct stat st;
        snprintf(path, sizeof path, "%s/jobs/%s", e2e_cl->work_dir[i], job_id);
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
            return i;
    }
    return -1;
}

int e2e_count_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        char path[PATH_MAX];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (stat(path, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode))
            n += e2e_count_files(path);
        else if (S_ISREG(st.st_mode))
            n++;
    }
    closedir(d);
    return n;
}
