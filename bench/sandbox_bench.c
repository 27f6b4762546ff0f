/* sandbox_bench.c - what the ranks' sandbox costs a kiln-train job: one job started through the
 * agent's launcher (agent/launch.c) with the sandbox on or off, its step times read from rank 0's
 * metric records (step_time_ms), and the time from the start call to the first step. One run per
 * call; bench/sandbox_bench.sh interleaves them.
 *   sandbox_bench --train-bin build/bin/kiln-train --data data/tinyshakespeare.txt --sandbox on|off
 *                 [--ranks 1] [--steps 40] [--warmup 5]
 * Prints one line: sandbox=on ranks=1 steps=35 median_ms=... mean_ms=... min_ms=... start_ms=...
 * With --starts N it instead starts N one-rank jobs of --train-bin (/bin/true) one after the other
 * and prints how long agent_launcher_start took (directories, the box, the spawn) and the time to
 * the exit: sandbox=on starts=N start_call_ms median=... exit_ms median=... */
#include "agent/agent.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct bench {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    double *ms;                  /* rank 0's step times, by step */
    int nms, cap;
    int64_t first_us;            /* when the first step time arrived */
    int exits, failed;
    char reason[256];
} bench_t;

static bench_t B = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void on_started(void *ud, const char *job, int attempt, bool ok, bool host_fault, const char *reason, int port)
{
    (void)ud, (void)job, (void)attempt, (void)host_fault, (void)port;
    if (!ok)
        fprintf(stderr, "sandbox_bench: not started: %s\n", reason);
}

static void on_line(void *ud, const char *job, int attempt, int rank, int stream, int64_t t, const char *line,
                    size_t len)
{
    (void)ud, (void)job, (void)attempt, (void)t;
    if (stream == AGENT_STREAM_STDERR && getenv("BENCH_VERBOSE"))
        fprintf(stderr, "rank %d: %.*s\n", rank, (int)len, line);
}

static void on_points(void *ud, const char *job, int attempt, const agent_point_t *pts, size_t n)
{
    (void)ud, (void)job, (void)attempt;
    pthread_mutex_lock(&B.mu);
    for (size_t i = 0; i < n; i++) {
        if (pts[i].rank != 0 || strcmp(pts[i].name, "step_time_ms") != 0)
            continue;
        if (!B.first_us)
            B.first_us = kiln_mono_us();
        if (B.nms == B.cap) {
            B.cap = B.cap ? 2 * B.cap : 64;
            B.ms = realloc(B.ms, (size_t)B.cap * sizeof(double));
        }
        B.ms[B.nms++] = pts[i].value;
    }
    pthread_mutex_unlock(&B.mu);
}

static void on_exit_cb(void *ud, const char *job, int attempt, int rank, pid_t pid, int code, int sig,
                       const char *reason)
{
    (void)ud, (void)job, (void)attempt, (void)pid;
    pthread_mutex_lock(&B.mu);
    B.exits++;
    if (code != 0) {
        B.failed++;
        snprintf(B.reason, sizeof(B.reason), "rank %d: code %d signal %d: %s", rank, code, sig, reason);
    }
    pthread_cond_broadcast(&B.cv);
    pthread_mutex_unlock(&B.mu);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* n one-rank jobs of the launcher's program, one after the other. */
static int launch_times(agent_launcher_t *l, int n, const char *mode)
{
    double *call = calloc((size_t)n, sizeof(double)), *done = calloc((size_t)n, sizeof(double));
    int rc = 1;
    for (int i = 0; i < n && call && done; i++) {
        char id[32];
        snprintf(id, sizeof(id), "start-%d", i);
        int32_t rk[] = {0};
        Kiln__Assignment a = KILN__ASSIGNMENT__INIT;
        a.job_id = id;
        a.attempt = 1;
        a.spec_json = (char *)"{}";
        a.world_size = 1;
        a.ranks = rk;
        a.n_ranks = 1;
        a.nodes = 1;
        kiln_err_t err;
        int before = B.exits;
        int64_t t0 = kiln_mono_us();
        if (agent_launcher_start(l, &a, &err) != 0) {
            fprintf(stderr, "sandbox_bench: %s\n", err.message);
            goto out;
        }
        int64_t t1 = kiln_mono_us();
        pthread_mutex_lock(&B.mu);
        while (B.exits == before)
            pthread_cond_wait(&B.cv, &B.mu);
        pthread_mutex_unlock(&B.mu);
        agent_launcher_wait_idle(l, 10000); /* the box is gone too */
        call[i] = (double)(t1 - t0) / 1000.0;
        done[i] = (double)(kiln_mono_us() - t0) / 1000.0;
    }
    if (B.failed) {
        fprintf(stderr, "sandbox_bench: %s\n", B.reason);
        goto out;
    }
    printf("sandbox=%s starts=%d start_call_ms median=%.2f exit_ms median=%.2f\n", mode, n, median_of(call, n),
           median_of(done, n));
    rc = 0;
out:
    free(call);
    free(done);
    return rc;
}

int main(int argc, char **argv)
{
    const char *train = NULL, *data = NULL, *mode = "on";
    int ranks = 1, steps = 40, warmup = 5, starts = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--train-bin"))
            train = argv[i + 1];
        else if (!strcmp(argv[i], "--data"))
            data = argv[i + 1];
        else if (!strcmp(argv[i], "--sandbox"))
            mode = argv[i + 1];
        else if (!strcmp(argv[i], "--ranks"))
            ranks = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup"))
            warmup = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--starts"))
            starts = atoi(argv[i + 1]);
    }
    char data_real[PATH_MAX], root[PATH_MAX];
    if (!train || !data || !realpath(data, data_real) || ranks < 1 || ranks > 16 || steps <= warmup || starts < 0) {
        fprintf(stderr, "usage: sandbox_bench --train-bin BIN --data FILE --sandbox on|off [--ranks N] "
                        "[--steps N] [--warmup N]\n");
        return 2;
    }
    log_init("sandbox_bench");
    snprintf(root, sizeof(root), "%s", data_real);
    *strrchr(root, '/') = '\0';
    char work[] = "/tmp/kiln-sbbench.XXXXXX";
    if (!mkdtemp(work))
        return 1;
    const char *roots[] = {root};
    agent_launcher_config_t cfg = {.train_bin = train, .work_dir = work, .slots = ranks, .cores = 0,
                                   .data_roots = roots, .n_data_roots = 1,
                                   .sandbox = {.off = !strcmp(mode, "off")}};
    agent_launch_cbs_t cbs = {on_started, on_line, on_points, on_exit_cb, NULL};
    agent_launcher_t *l = NULL;
    kiln_err_t err;
    int rc = 1;
    if (agent_launcher_create(&cfg, &cbs, &l, &err) != 0) {
        fprintf(stderr, "sandbox_bench: %s\n", err.message);
        goto done;
    }
    if (starts > 0) {
        rc = launch_times(l, starts, mode);
        goto done;
    }
    char spec[8192];
    if (snprintf(spec, sizeof(spec),
             "{\"name\": \"sandbox-bench\", \"model\": {\"type\": \"gpt\", \"n_layer\": 2, \"n_head\": 4, "
             "\"n_embd\": 128, \"seq_len\": 64, \"vocab\": \"bytes\"}, \"data\": {\"train\": \"%s\"}, "
             "\"hyperparameters\": {\"lr\": 0.001, \"global_batch_size\": %d, \"max_steps\": %d, \"eval_every\": 0, "
             "\"sample_every\": 0}, \"resources\": {\"nodes\": 1, \"slots_per_node\": %d, \"slot_type\": \"cpu\"}, "
             "\"checkpoint\": {\"every_steps\": 0}}", data_real, 8 * ranks, steps, ranks) >= (int)sizeof(spec))
        goto done;
    int32_t rk[16];
    for (int i = 0; i < ranks; i++)
        rk[i] = i;
    Kiln__Assignment a = KILN__ASSIGNMENT__INIT;
    Kiln__JobPath jp = KILN__JOB_PATH__INIT, *jps[] = {&jp};
    jp.field = (char *)"data.train";
    jp.path = data_real;
    a.job_id = (char *)"sandbox-bench";
    a.attempt = 1;
    a.spec_json = spec;
    a.world_size = ranks;
    a.ranks = rk;
    a.n_ranks = (size_t)ranks;
    a.nodes = 1;
    a.master_addr = (char *)"127.0.0.1";
    a.read_paths = jps;
    a.n_read_paths = 1;
    int64_t t0 = kiln_mono_us();
    if (agent_launcher_start(l, &a, &err) != 0) {
        fprintf(stderr, "sandbox_bench: %s\n", err.message);
        goto done;
    }
    pthread_mutex_lock(&B.mu);
    while (B.exits < ranks)
        pthread_cond_wait(&B.cv, &B.mu);
    pthread_mutex_unlock(&B.mu);
    if (B.failed || B.nms <= warmup) {
        fprintf(stderr, "sandbox_bench: the job failed (%d step times): %s\n", B.nms, B.reason);
        goto done;
    }
    int n = B.nms - warmup;
    double *v = B.ms + warmup, sum = 0;
    for (int i = 0; i < n; i++)
        sum += v[i];
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    printf("sandbox=%s ranks=%d steps=%d median_ms=%.2f mean_ms=%.2f min_ms=%.2f start_ms=%.0f\n", mode, ranks, n,
           n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, sum / n, v[0], (double)(B.first_us - t0) / 1000.0);
    rc = 0;
done:
    agent_launcher_destroy(l);
    char cmd[64];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", work);
    if (system(cmd) != 0)
        fprintf(stderr, "sandbox_bench: could not remove %s\n", work);
    free(B.ms);
    return rc;
}
