/* ingest_bench.c - metric ingestion from agents into PostgreSQL through the service
 * (svc_agent_metrics: one COPY, one job-row UPDATE and the upsert of the job's metric summaries
 * per batch), as kiln-agent sends it: several agents pushing batches of points for running jobs,
 * sustained for a fixed time. Prints points/s, batches/s, batch latency percentiles, and whether
 * every point sent was stored and counted by the summaries. Not a test: it asserts nothing.
 *
 * usage: ingest_bench [--database-url URL] [--seconds 12] [--batch 2000] [--agents 2] [--jobs 4]
 * The database URL defaults to KILN_DATABASE_URL, then KILN_PG_URL (scripts/pg.sh); a fresh
 * database is created in that cluster for the run and dropped afterwards. */
#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "service/service.h"

static svc_t *svc;
static int64_t batch_size = 2000, seconds = 12, nagents = 2, njobs = 4;
static const char *kind = "metrics";
static char job_ids[64][40];
static char worker_id[64];   /* the worker every job runs on: kilnd checks each batch against it */
static atomic_llong points_done, batches_done, errors, points_sent;
static atomic_bool stop_flag;
static int64_t t_start_us, t_end_us;

typedef struct agent {
    int index;
    double *lat_ms;
    size_t nlat, caplat;
} agent_t;

static const char *const NAMES[] = {"train_loss", "lr", "grad_norm", "step_time_ms", "tokens_per_s", "mfu",
                                    "peak_mem_mb", "val_loss"};

/* Log lines instead of metric points: ~80-character lines, as a training loop prints them. */
/* Counts one sent batch of n items that took [t0, t1] (us); its latency counts when it ended
 * inside the measured window. */
static void record_batch(agent_t *a, size_t n, int64_t t0, int64_t t1, int rc, const kiln_err_t *err)
{
    if (rc) {
        atomic_fetch_add(&errors, 1);
        fprintf(stderr, "ingest_bench: batch failed: %s\n", err->message);
        return;
    }
    atomic_fetch_add(&points_sent, (long long)n);
    if (t1 < t_start_us || t1 > t_end_us)
        return;
    atomic_fetch_add(&points_done, (long long)n);
    atomic_fetch_add(&batches_done, 1);
    if (a->nlat == a->caplat) {
        size_t cap = a->caplat ? 2 * a->caplat : 1024;
        double *grown = realloc(a->lat_ms, cap * sizeof(double));
        if (!grown)
            return; /* out of memory: the batch counts, its latency is not sampled */
        a->lat_ms = grown;
        a->caplat = cap;
    }
    a->lat_ms[a->nlat++] = (double)(t1 - t0) / 1000.0;
}

static void *agent_logs_main(void *p)
{
    agent_t *a = p;
    size_t n = (size_t)batch_size;
    Kiln__LogLine *lines = calloc(n, sizeof(*lines));
    Kiln__LogLine **ptrs = calloc(n, sizeof(*ptrs));
    char (*text)[96] = calloc(n, 96);
    char *wid = worker_id;
    int64_t step = 1;
    for (size_t i = 0; i < n; i++) {
        kiln__log_line__init(&lines[i]);
        lines[i].stream = "stdout";
        lines[i].line = text[i];
        ptrs[i] = &lines[i];
    }
    for (int64_t b = 0; !atomic_load(&stop_flag); b++) {
        const char *job = job_ids[(a->index + b * nagents) % njobs];
        int64_t now = kiln_now_us();
        for (size_t i = 0; i < n; i++, step++) {
            lines[i].rank = (int)(i % 4);
            lines[i].time_us = now;
            snprintf(text[i], 96, "step %6lld | loss 2.%06lld | lr 3.0e-04 | 412.0 ms | 9943 tok/s | mfu 41.0%%",
                     (long long)step, (long long)(step * 7919 % 1000000));
        }
        Kiln__LogBatch lb = KILN__LOG_BATCH__INIT;
        lb.worker_id = wid;
        lb.job_id = (char *)job;
        lb.attempt = 1;
        lb.lines = ptrs;
        lb.n_lines = n;
        kiln_err_t err;
        int64_t t0 = kiln_mono_us();
        int rc = svc_agent_logs(svc, wid, &lb, &err);
        record_batch(a, n, t0, kiln_mono_us(), rc, &err);
    }
    free(lines);
    free(ptrs);
    free(text);
    return NULL;
}

static void *agent_main(void *p)
{
    agent_t *a = p;
    size_t n = (size_t)batch_size;
    Kiln__MetricPoint *pts = calloc(n, sizeof(*pts));
    Kiln__MetricPoint **ptrs = calloc(n, sizeof(*ptrs));
    char *wid = worker_id;
    int64_t step = 1;
    int names = (int)KILN_ARRAY_LEN(NAMES);
    for (size_t i = 0; i < n; i++) {
        kiln__metric_point__init(&pts[i]);
        pts[i].name = (char *)NAMES[i % (size_t)names];
        ptrs[i] = &pts[i];
    }
    for (int64_t b = 0; !atomic_load(&stop_flag); b++) {
        /* Each agent feeds its own jobs in turn; a batch holds consecutive steps of all metrics. */
        const char *job = job_ids[(a->index + b * nagents) % njobs];
        int64_t now = kiln_now_us();
        for (size_t i = 0; i < n; i++) {
            pts[i].step = step + (int64_t)(i / (size_t)names);
            pts[i].value = 1.0 / (double)(pts[i].step + (int64_t)i % 7);
            pts[i].time_us = now;
        }
        step += (int64_t)(n / (size_t)names) + 1;
        Kiln__MetricBatch mb = KILN__METRIC_BATCH__INIT;
        mb.worker_id = wid;
        mb.job_id = (char *)job;
        mb.attempt = 1;
        mb.points = ptrs;
        mb.n_points = n;
        kiln_err_t err;
        int64_t t0 = kiln_mono_us();
        int rc = svc_agent_metrics(svc, wid, &mb, &err);
        record_batch(a, n, t0, kiln_mono_us(), rc, &err);
    }
    free(pts);
    free(ptrs);
    return NULL;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static int admin_sql(const char *url, const char *sql)
{
    PGconn *c = PQconnectdb(url);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "ingest_bench: could not connect: %s", PQerrorMessage(c));
        PQfinish(c);
        return -1;
    }
    PGresult *r = PQexec(c, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok)
        fprintf(stderr, "ingest_bench: %s: %s", sql, PQerrorMessage(c));
    PQclear(r);
    PQfinish(c);
    return ok ? 0 : -1;
}

int main(int argc, char **argv)
{
    const char *url = getenv("KILN_DATABASE_URL");
    if (!url)
        url = getenv("KILN_PG_URL");
    config_flag_t flags[] = {
        {"database-url", NULL, CONFIG_STR, &url, CONFIG_ANY, "libpq connection string of a cluster to create the bench database in"},
        {"seconds", NULL, CONFIG_INT, &seconds, CONFIG_ANY, "measured duration"},
        {"batch", NULL, CONFIG_INT, &batch_size, CONFIG_ANY, "points per batch (agents send 1000-5000)"},
        {"agents", NULL, CONFIG_INT, &nagents, CONFIG_ANY, "concurrent agents (threads)"},
        {"jobs", NULL, CONFIG_INT, &njobs, CONFIG_ANY, "running jobs the points belong to"},
        {"kind", NULL, CONFIG_STR, &kind, CONFIG_ANY, "metrics | logs (log lines instead of metric points)"},
    };
    kiln_err_t err;
    log_init("ingest_bench");
    log_set_level(LOG_WARN);
    int rc = config_parse(argc, argv, flags, KILN_ARRAY_LEN(flags), "ingest_bench [flags]", NULL, &err);
    if (rc == 1)
        return 0;
    bool logs = kind && strcmp(kind, "logs") == 0;
    if (rc || !url || batch_size < 1 || nagents < 1 || nagents > 64 || njobs < 1 || njobs > 64) {
        fprintf(stderr, "ingest_bench: %s\n", rc ? err.message : "need --database-url (or KILN_PG_URL), sane sizes");
        return 2;
    }
    char dbname[64], sql[128], bench_url[2048];
    snprintf(dbname, sizeof(dbname), "ingest_bench_%d", (int)getpid());
    snprintf(sql, sizeof(sql), "CREATE DATABASE %s", dbname);
    if (admin_sql(url, sql))
        return 1;
    snprintf(bench_url, sizeof(bench_url), "%s dbname=%s", url, dbname);

    svc_config_t cfg = {.database_url = bench_url, .db_pool_size = (int)nagents + 2};
    if (svc_create(&cfg, &svc, &err)) {
        fprintf(stderr, "ingest_bench: %s\n", err.message);
        return 1;
    }
    /* One worker runs every job (4 ranks each), as kilnd placed them: ingestion checks that each
     * batch comes from the worker that runs its ranks, as it does for real agents. */
    arena_t arena;
    arena_init(&arena, 0);
    Kiln__RegisterRequest reg = KILN__REGISTER_REQUEST__INIT;
    Kiln__RegisterResponse regd = KILN__REGISTER_RESPONSE__INIT;
    reg.hostname = "bench";
    reg.address = "127.0.0.1";
    reg.slots = (int32_t)(4 * njobs);
    reg.slot_type = "cpu";
    if (svc_agent_register(svc, &reg, NULL, &arena, &regd, &err)) {
        fprintf(stderr, "ingest_bench: register: %s\n", err.message);
        return 1;
    }
    kiln_strlcpy(worker_id, regd.worker_id, sizeof(worker_id));
    arena_deinit(&arena);
    json_t *spec = json_loads("{\"name\": \"bench\", \"model\": {\"type\": \"mlp\", \"hidden\": [8], \"n_inputs\": 4,"
                              " \"n_classes\": 2}, \"data\": {\"train\": \"synthetic\"},"
                              " \"resources\": {\"slots_per_node\": 4},"
                              " \"hyperparameters\": {\"global_batch_size\": 8, \"max_steps\": 100000000}}", 0, NULL);
    for (int j = 0; j < njobs; j++) {
        json_t *job = NULL;
        bool created;
        if (svc_job_create(svc, svc_caller_kilnd(), spec, NULL, &job, &created, &err)) {
            fprintf(stderr, "ingest_bench: could not create a job: %s\n", err.message);
            return 1;
        }
        kiln_strlcpy(job_ids[j], json_string_value(json_object_get(job, "id")), sizeof(job_ids[j]));
        json_decref(job);
    }
    json_decref(spec);
    for (int j = 0; j < njobs; j++) {
        bool placed = false;
        for (int tries = 0; tries < 200 && !placed; tries++) {
            json_t *job = NULL;
            if (svc_job_get(svc, svc_caller_kilnd(), job_ids[j], &job, &err) == 0)
                placed = json_integer_value(json_object_get(job, "attempt")) == 1;
            json_decref(job);
            if (!placed)
                usleep(50000);
        }
        if (!placed) {
            fprintf(stderr, "ingest_bench: job %s was not placed on the bench worker\n", job_ids[j]);
            return 1;
        }
    }

    /* One second of warm-up, then the measured window. */
    t_start_us = kiln_mono_us() + 1000000;
    t_end_us = t_start_us + seconds * 1000000;
    pthread_t th[64];
    agent_t agents[64];
    memset(agents, 0, sizeof(agents));
    for (int i = 0; i < nagents; i++) {
        agents[i].index = i;
        pthread_create(&th[i], NULL, logs ? agent_logs_main : agent_main, &agents[i]);
    }
    while (kiln_mono_us() < t_end_us)
        usleep(50000);
    atomic_store(&stop_flag, true);
    size_t nlat = 0;
    for (int i = 0; i < nagents; i++) {
        pthread_join(th[i], NULL);
        nlat += agents[i].nlat;
    }
    double *lat = malloc((nlat + 1) * sizeof(double));
    size_t k = 0;
    for (int i = 0; i < nagents; i++) {
        memcpy(lat + k, agents[i].lat_ms, agents[i].nlat * sizeof(double));
        k += agents[i].nlat;
        free(agents[i].lat_ms);
    }
    qsort(lat, nlat, sizeof(double), cmp_double);
    double secs = (double)(t_end_us - t_start_us) / 1e6;
    long long pts = atomic_load(&points_done), bat = atomic_load(&batches_done);

    /* Every point sent must have landed. */
    long long stored = -1;
    PGconn *pc = PQconnectdb(bench_url);
    PGresult *pr = PQexec(pc, logs ? "SELECT count(*) FROM logs" : "SELECT coalesce(sum(n), 0) FROM metric_chunks");
    if (PQresultStatus(pr) == PGRES_TUPLES_OK)
        stored = atoll(PQgetvalue(pr, 0, 0));
    PQclear(pr);
    /* Each agent's steps only grow, so every point is a new step of its job and metric: the
     * summaries kept during ingestion must count every stored point. */
    long long summarised = -1, summaries = 0;
    if (!logs) {
        pr = PQexec(pc, "SELECT coalesce(sum(n), 0), count(*) FROM metric_summaries");
        if (PQresultStatus(pr) == PGRES_TUPLES_OK) {
            summarised = atoll(PQgetvalue(pr, 0, 0));
            summaries = atoll(PQgetvalue(pr, 0, 1));
        }
        PQclear(pr);
    }
    PQfinish(pc);

    const char *unit = logs ? "log lines" : "points";
    printf("ingest_bench: %lld %s in %.1f s = %.0f %s/s (%lld batches of %lld, %.1f batches/s, "
           "%lld agents, %lld jobs, %lld errors)\n",
           pts, unit, secs, (double)pts / secs, unit, bat, (long long)batch_size, (double)bat / secs, (long long)nagents,
           (long long)njobs, (long long)atomic_load(&errors));
    printf("ingest_bench: %lld sent in all (with warm-up and drain), %lld stored%s\n",
           (long long)atomic_load(&points_sent), stored,
           stored == atomic_load(&points_sent) ? "" : " (MISMATCH)");
    if (!logs)
        printf("ingest_bench: %lld metric summaries kept, counting %lld points%s\n", summaries, summarised,
               summarised == stored ? "" : " (MISMATCH)");
    if (nlat > 0)
        printf("ingest_bench: batch latency p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms\n",
               lat[nlat / 2], lat[nlat * 9 / 10], lat[nlat * 99 / 100], lat[nlat - 1]);
    free(lat);
    svc_destroy(svc);
    snprintf(sql, sizeof(sql), "DROP DATABASE %s", dbname);
    admin_sql(url, sql);
    return atomic_load(&errors) ? 1 : 0;
}
