/* test_dp_kilnd.c - data parallelism through the whole service: a real kilnd (on the test
 * PostgreSQL cluster) and two real agents with one CPU slot each; a two-node job trains with one
 * rank on each agent, and when one rank is killed mid-run the job FAILs quickly with a reason
 * that names the dead rank; a job that completes shows one loss curve (rank 0's, one point per
 * step) and both ranks' logs. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "tests/common/harness.h"

typedef struct cluster {
    char dir[128], url[96];
    pid_t kilnd, agents[2];
} cluster_t;

static cluster_t g_cl;

static json_t *http_json(const char *method, const char *path, const char *body, long *status)
{
    char url[512];
    snprintf(url, sizeof url, "%s%s", g_cl.url, path);
    char *out = NULL;
    long st = 0;
    const char *hdr[] = {"Content-Type: application/json", NULL};
    if (th_http(method, url, body, hdr, &st, &out, 10000) != 0) return NULL;
    if (status) *status = st;
    json_t *j = json_loads(out ? out : "", 0, NULL);
    free(out);
    return j;
}

static const char *jstr(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static void setup(void)
{
    prctl(PR_SET_CHILD_SUBREAPER, 1); /* ranks of a stopped agent are ours to reap */
    snprintf(g_cl.dir, sizeof g_cl.dir, "/tmp/kdp.XXXXXX");
    cr_assert_not_null(mkdtemp(g_cl.dir));
    char *db = th_pg_create_db("dp");
    cr_assert_not_null(db, "no test database (run through tests/run.sh)");
    int hp = th_free_port(), gp = th_free_port();
    while (gp == hp) gp = th_free_port();
    char http[64], grpc[64], bin[512], log[256];
    snprintf(http, sizeof http, "127.0.0.1:%d", hp);
    snprintf(grpc, sizeof grpc, "127.0.0.1:%d", gp);
    snprintf(g_cl.url, sizeof g_cl.url, "http://%s", http);
    snprintf(bin, sizeof bin, "%s/kilnd", th_bin_dir());
    snprintf(log, sizeof log, "%s/kilnd.log", g_cl.dir);
    char *kargv[] = {bin, "--database-url", db, "--http-addr", http, "--grpc-addr", grpc, NULL};
    /* Plain text without tokens: this suite is about data parallelism (e2e covers security). */
    char *kenv[] = {"KILN_INSECURE=1", "KILN_NO_AUTH=1", NULL};
    g_cl.kilnd = th_spawn(kargv, kenv, log);
    cr_assert_gt(g_cl.kilnd, 0);
    cr_assert(th_wait_port(hp, 20000), "kilnd did not listen");
    free(db);
    char abin[512];
    snprintf(abin, sizeof abin, "%s/kiln-agent", th_bin_dir());
    for (int i = 0; i < 2; i++) {
        char wd[256];
        snprintf(wd, sizeof wd, "%s/w%d", g_cl.dir, i);
        mkdir(wd, 0755);
        snprintf(log, sizeof log, "%s/agent%d.log", g_cl.dir, i);
        char data_root[PATH_MAX];
        snprintf(data_root, sizeof data_root, "%s/data", getenv("KILN_ROOT") ? getenv("KILN_ROOT") : ".");
        char *aargv[] = {abin, "--server", grpc, "--slots", "1", "--slot-type", "cpu",
                         "--work-dir", wd, "--cores", "1", "--insecure", "--data-root", data_root, NULL};
        g_cl.agents[i] = th_spawn(aargv, NULL, log);
        cr_assert_gt(g_cl.agents[i], 0);
    }
    for (int i = 0;; i++) {
        json_t *w = http_json("GET", "/v1/workers", NULL, NULL);
        size_t k, alive = 0;
        json_t *x;
        json_array_foreach(json_object_get(w, "workers"), k, x) alive += !strcmp(jstr(x, "state"), "ALIVE");
        json_decref(w);
        if (alive == 2) break;
        cr_assert_lt(i, 300, "agents did not register");
        usleep(100000);
    }
}

static void teardown(void)
{
    for (int i = 0; i < 2; i++)
        if (g_cl.agents[i] > 0) th_stop(g_cl.agents[i], SIGTERM, 5000);
    if (g_cl.kilnd > 0) th_stop(g_cl.kilnd, SIGTERM, 5000);
    for (int i = 0; i < 100 && waitpid(-1, NULL, WNOHANG) >= 0; i++) usleep(20000);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_cl.dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_cl.dir);
}

/* The pid of the kiln-train process of job `id` with rank `rank`, or -1. */
static pid_t find_rank(const char *id, int rank)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    pid_t found = -1;
    char want_job[128], want_rank[32];
    snprintf(want_job, sizeof want_job, "KILN_JOB_ID=%s", id);
    snprintf(want_rank, sizeof want_rank, "KILN_RANK=%d", rank);
    while (d && (e = readdir(d)) && found < 0) {
        char path[300], buf[16384];
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%s/environ", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        bool job = false, rk = false;
        for (size_t i = 0; i < n; i += strlen(buf + i) + 1) {
            buf[n] = 0;
            if (!strcmp(buf + i, want_job)) job = true;
            if (!strcmp(buf + i, want_rank)) rk = true;
        }
        if (job && rk) found = atoi(e->d_name);
    }
    if (d) closedir(d);
    return found;
}

/* Submits a 2-node GPT job; extra: more top-level fields (", \"distribution\": {...}") or "". */
static void submit_with(const char *name, int max_steps, const char *extra, char *id, size_t idn)
{
    char spec[2048];
    snprintf(spec, sizeof spec,
             "{\"name\": \"%s\", \"model\": {\"type\": \"gpt\", \"n_layer\": 2, \"n_head\": 2, "
             "\"n_embd\": 32, \"seq_len\": 32, \"vocab\": \"bytes\"}, \"data\": {\"train\": "
             "\"%s/data/tinyshakespeare.txt\"}, \"hyperparameters\": {\"global_batch_size\": 4, "
             "\"max_steps\": %d, \"eval_every\": 0, \"sample_every\": 0}, \"resources\": "
             "{\"nodes\": 2, \"slots_per_node\": 1, \"slot_type\": \"cpu\"}, \"checkpoint\": "
             "{\"every_steps\": 0}, \"retry\": {\"max_attempts\": 1}%s}",
             name, getenv("KILN_ROOT") ? getenv("KILN_ROOT") : ".", max_steps, extra);
    long st = 0;
    json_t *job = http_json("POST", "/v1/jobs", spec, &st);
    cr_assert_eq(st, 201, "submit: HTTP %ld", st);
    snprintf(id, idn, "%s", jstr(job, "id"));
    json_decref(job);
}

static void submit(const char *name, int max_steps, char *id, size_t idn)
{
    submit_with(name, max_steps, "", id, idn);
}

/* Whether rank's log lines (the first 1,000) include needle. */
static bool rank_logged(const char *id, int rank, const char *needle)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?rank=%d&limit=1000", id, rank);
    json_t *logs = http_json("GET", path, NULL, NULL);
    size_t k;
    json_t *l;
    bool found = false;
    json_array_foreach(json_object_get(logs, "lines"), k, l) {
        cr_assert_eq(json_integer_value(json_object_get(l, "rank")), rank);
        if (strstr(jstr(l, "line"), needle)) found = true;
    }
    json_decref(logs);
    return found;
}

Test(dp_kilnd, two_node_job_completes_with_one_loss_curve, .init = setup, .fini = teardown,
     .timeout = 180)
{
    char id[64], path[256], url[512];
    submit("dp-curve", 20, id, sizeof id);
    snprintf(url, sizeof url, "%s/v1/jobs/%s", g_cl.url, id);
    char *body = th_wait_json_state(url, TH_JOB_ENDED, 150000);
    cr_assert_not_null(body, "the job did not end");
    json_t *job = json_loads(body, 0, NULL);
    free(body);
    cr_assert_str_eq(jstr(job, "state"), "COMPLETED", "%s: %s", jstr(job, "state"), jstr(job, "reason"));
    json_decref(job);
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?name=train_loss&max_points=1000", id);
    json_t *m = http_json("GET", path, NULL, NULL);
    json_t *pts = json_object_get(json_array_get(json_object_get(m, "metrics"), 0), "points");
    cr_assert_eq(json_array_size(pts), 20, "expected one point per step from rank 0 only");
    for (size_t i = 0; i < 20; i++)
        cr_assert_eq(json_integer_value(json_object_get(json_array_get(pts, i), "step")), (json_int_t)i + 1);
    json_decref(m);
    for (int rank = 0; rank < 2; rank++) {
        char want[32];
        snprintf(want, sizeof want, "dp: rank %d/2 over ", rank);
        cr_assert(rank_logged(id, rank, want), "rank %d never logged \"%s\"", rank, want);
    }
}

/* gradient_dtype travels from the submitted spec through kilnd and the agents to the ranks. */
Test(dp_kilnd, bf16_gradients_reach_both_ranks, .init = setup, .fini = teardown, .timeout = 180)
{
    char id[64], url[512];
    submit_with("dp-bf16", 10, ", \"distribution\": {\"data_parallel\": {\"gradient_dtype\": \"bf16\"}}", id,
                sizeof id);
    snprintf(url, sizeof url, "%s/v1/jobs/%s", g_cl.url, id);
    char *body = th_wait_json_state(url, TH_JOB_ENDED, 150000);
    cr_assert_not_null(body, "the job did not end");
    json_t *job = json_loads(body, 0, NULL);
    free(body);
    cr_assert_str_eq(jstr(job, "state"), "COMPLETED", "%s: %s", jstr(job, "state"), jstr(job, "reason"));
    json_t *dp = json_object_get(json_object_get(json_object_get(job, "spec"), "distribution"), "data_parallel");
    cr_assert_str_eq(jstr(dp, "gradient_dtype"), "bf16");
    json_decref(job);
    for (int rank = 0; rank < 2; rank++)
        cr_assert(rank_logged(id, rank, "all-reduced as bf16 during backward"),
                  "rank %d did not reduce its gradients as bf16", rank);
}

Test(dp_kilnd, killed_rank_fails_the_job_naming_it, .init = setup, .fini = teardown, .timeout = 180)
{
    char id[64], path[256];
    json_t *job;
    submit("dp-kill", 1000000, id, sizeof id);
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    /* both ranks train: a few steps done */
    for (int i = 0;; i++) {
        job = http_json("GET", path, NULL, NULL);
        json_int_t step = json_integer_value(json_object_get(json_object_get(job, "progress"), "step"));
        cr_assert(!th_state_in(jstr(job, "state"), TH_JOB_ENDED),
                  "job ended early: %s: %s", jstr(job, "state"), jstr(job, "reason"));
        json_decref(job);
        if (step >= 3) break;
        cr_assert_lt(i, 1200, "the job never reached step 3");
        usleep(100000);
    }
    pid_t victim = find_rank(id, 1);
    cr_assert_gt(victim, 0, "no kiln-train process with KILN_RANK=1 for the job");
    double t0 = kiln_mono_s();
    long killed_at = (long)time(NULL);
    cr_assert_eq(kill(victim, SIGKILL), 0, "kill: %s", strerror(errno));
    char url[512];
    snprintf(url, sizeof url, "%s%s", g_cl.url, path);
    char *body = th_wait_json_state(url, "RESTARTING" TH_OR_ENDED, 60000);
    double took = kiln_mono_s() - t0;
    cr_assert_not_null(body, "the job did not end within 60 s of the kill");
    job = json_loads(body, 0, NULL);
    free(body);
    fprintf(stderr, "dp_kilnd: job %s after %.1f s: %s\n", jstr(job, "state"), took, jstr(job, "reason"));
    cr_assert_str_eq(jstr(job, "state"), "FAILED", "%s: %s", jstr(job, "state"), jstr(job, "reason"));
    cr_assert(strstr(jstr(job, "reason"), "rank 1"), "the reason does not name rank 1: %s",
              jstr(job, "reason"));
    json_decref(job);
    /* and rank 0 said why it stopped: its peer, by rank (its lines since the kill, page by page:
     * a step of this model takes under a millisecond, so thousands of step lines come first) */
    bool named = false;
    long long after = 0;
    for (int i = 0; i < 100 && !named; i++) {
        snprintf(path, sizeof path, "/v1/jobs/%s/logs?rank=0&since=%ld&after_seq=%lld&limit=10000", id,
                 killed_at - 1, after);
        json_t *logs = http_json("GET", path, NULL, NULL);
        json_t *lines = json_object_get(logs, "lines");
        size_t k, n = json_array_size(lines);
        json_t *l;
        json_array_foreach(lines, k, l) {
            const char *line = jstr(l, "line");
            if (strstr(line, "kiln-train: ") && strstr(line, "rank 1") && strstr(line, "disconnected"))
                named = true;
        }
        if (n) after = (long long)json_integer_value(json_object_get(logs, "next_since_seq"));
        json_decref(logs);
        if (!named && !n) usleep(100000); /* caught up: wait for more */
    }
    cr_assert(named, "rank 0 never logged that rank 1 disconnected");
}
