/* search_gen.c - the experiment-search benchmark's data: a kiln database (every migration
 * applied, as kilnd applies them) filled with N jobs that look like a busy team's year of work -
 * a normalised spec of about 1.5 kB each with 30 hyperparameters (kiln's 18 and 12 more a team
 * might log: dropout, label smoothing, ...), tags, states and times - and M metrics per job with P
 * points each, stored as ingestion stores them (one metric_chunks row per job and metric) with
 * the summaries ingestion keeps (computed here with the same definition; --check compares a
 * sample with metric_summary_rebuild). Rows go in with COPY; the hyperparameter rows the job
 * insert would write, too. Deterministic for a seed. Not a test: it asserts nothing.
 *
 * usage: search_gen --database-url URL [--jobs 100000] [--metrics 10] [--points 100] [--seed 1]
 *                   [--check 200]
 * The database must exist and be empty. */
#include <libpq-fe.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "service/service.h"
#include "store/store.h"

static int64_t njobs = 100000, nmetrics = 10, npoints = 100, seed = 1, ncheck = 200;
static const char *url;

/* xorshift64*: fast, deterministic for a seed */
static uint64_t rng_state;
static uint64_t rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}
static double unif(void) { return (double)(rnd() >> 11) / 9007199254740992.0; }
static int pick(int n) { return (int)(rnd() % (uint64_t)n); }
static double normal(void)
{
    double u = unif() + 1e-12, v = unif();
    return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}

static const char *const k_metrics[] = {"train_loss", "val_loss", "lr", "grad_norm", "step_time_ms", "tokens_per_s",
                                        "mfu", "peak_mem_mb", "val_ppl", "train_acc"};
static const char *const k_words[] = {"gpt", "mlp", "shakespeare", "wiki", "code", "sweep", "ablation", "baseline",
                                      "tiny", "small", "medium", "bpe", "bytes", "lr", "warmup", "moe",
                                      "distill", "finetune", "pretrain", "eval"};
static const char *const k_teams[] = {"nlp", "vision", "speech", "rl", "infra"};
static const char *const k_datasets[] = {"tinyshakespeare", "openwebtext", "wikitext103", "c4", "pile",
                                         "bookcorpus", "arxiv", "github", "stackexchange", "mnist"};

typedef struct buf {
    char *p;
    size_t len, cap;
} buf_t;

static void bput(buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bput(buf_t *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        b->cap = b->cap * 2 + (size_t)n + 1024;
        b->p = realloc(b->p, b->cap);
        if (!b->p) {
            fprintf(stderr, "search_gen: out of memory\n");
            exit(1);
        }
    }
}

static void ts(char *out, size_t n, int64_t us)
{
    time_t t = (time_t)(us / 1000000);
    struct tm tm;
    gmtime_r(&t, &tm);
    char d[32];
    strftime(d, sizeof d, "%Y-%m-%d %H:%M:%S", &tm);
    snprintf(out, n, "%.19s.%06lld+00", d, (long long)(us % 1000000));
}

static void die(PGconn *pg, const char *what)
{
    fprintf(stderr, "search_gen: %s: %s", what, PQerrorMessage(pg));
    exit(1);
}

static void exec(PGconn *pg, const char *q)
{
    PGresult *r = PQexec(pg, q);
    if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
        die(pg, q);
    PQclear(r);
}

static void copy_begin(PGconn *pg, const char *q)
{
    PGresult *r = PQexec(pg, q);
    if (PQresultStatus(r) != PGRES_COPY_IN)
        die(pg, q);
    PQclear(r);
}

static void copy_send(PGconn *pg, buf_t *b, bool force)
{
    if (!force && b->len < (4u << 20))
        return;
    if (b->len && PQputCopyData(pg, b->p, (int)b->len) != 1)
        die(pg, "COPY data");
    b->len = 0;
}

static void copy_end(PGconn *pg, buf_t *b)
{
    copy_send(pg, b, true);
    if (PQputCopyEnd(pg, NULL) != 1)
        die(pg, "COPY end");
    PGresult *r;
    while ((r = PQgetResult(pg))) {
        if (PQresultStatus(r) != PGRES_COMMAND_OK)
            die(pg, "COPY");
        PQclear(r);
    }
}

int main(int argc, char **argv)
{
    config_flag_t flags[] = {
        {"database-url", "KILN_DATABASE_URL", CONFIG_STR, &url, CONFIG_ANY, "libpq connection string of an empty database"},
        {"jobs", NULL, CONFIG_INT, &njobs, CONFIG_ANY, "jobs"},
        {"metrics", NULL, CONFIG_INT, &nmetrics, CONFIG_ANY, "metrics per job (at most 10)"},
        {"points", NULL, CONFIG_INT, &npoints, CONFIG_ANY, "points per metric and job"},
        {"seed", NULL, CONFIG_INT, &seed, CONFIG_ANY, "random seed"},
        {"check", NULL, CONFIG_INT, &ncheck, CONFIG_ANY, "summaries to compare with metric_summary_rebuild"},
    };
    kiln_err_t err;
    log_init("search_gen");
    log_set_level(LOG_WARN);
    int rc = config_parse(argc, argv, flags, KILN_ARRAY_LEN(flags), "search_gen [flags]", NULL, &err);
    if (rc == 1)
        return 0;
    if (rc || !url || njobs < 1 || nmetrics < 1 || nmetrics > 10 || npoints < 1) {
        fprintf(stderr, "search_gen: %s\n", rc ? err.message : "need --database-url and sane sizes");
        return 2;
    }
    rng_state = 0x9e3779b97f4a7c15ull ^ (uint64_t)seed;
    double t0 = kiln_mono_s();
    store_t *st = NULL;
    store_conn_t *sc = NULL;
    if (store_open(url, 1, &st, &err) || store_conn_get(st, &sc, &err) || store_migrate(sc, NULL, NULL, &err)) {
        fprintf(stderr, "search_gen: %s\n", err.message);
        return 1;
    }
    store_conn_put(st, sc);
    store_close(st);

    PGconn *pg = PQconnectdb(url);
    if (PQstatus(pg) != CONNECTION_OK)
        die(pg, "connect");
    exec(pg, "SET synchronous_commit = off");
    for (int p = 0; p < 10; p++) {
        char q[128];
        snprintf(q, sizeof q, "INSERT INTO projects (name, created_by) VALUES ('proj-%d', 'bench') ON CONFLICT DO NOTHING", p);
        exec(pg, q);
    }

    int64_t now_us = 1795219200000000LL; /* 2026-11-21, fixed so that runs compare */
    char (*ids)[37] = calloc((size_t)njobs, 37);
    buf_t jb = {0};
    exec(pg, "BEGIN");
    /* jobs, their first events and their hyperparameter rows */
    copy_begin(pg, "COPY jobs (id, name, project, spec, state, reason, attempt, max_attempts, priority, queue, nodes,"
                   " slots_per_node, slot_type, world_size, tags, created_at, updated_at, started_at, ended_at,"
                   " progress_step, total_steps, metrics, event_seq, submitted_by) FROM STDIN");
    PGconn *pg2 = PQconnectdb(url), *pg3 = PQconnectdb(url);
    if (PQstatus(pg2) != CONNECTION_OK || PQstatus(pg3) != CONNECTION_OK)
        die(pg2, "connect");
    exec(pg2, "SET synchronous_commit = off");
    exec(pg3, "SET synchronous_commit = off");
    /* hyperparameters and events are written after the jobs (foreign keys) from saved text */
    buf_t hsave = {0}, esave = {0};
    static const svc_job_state_t states[] = {JOB_STATE_COMPLETED, JOB_STATE_FAILED, JOB_STATE_STOPPED,
                                             JOB_STATE_RUNNING, JOB_STATE_QUEUED};
    static const int state_pct[] = {70, 15, 5, 5, 5};
    for (int64_t i = 0; i < njobs; i++) {
        uint64_t a = rnd(), b = rnd();
        snprintf(ids[i], 37, "%08x-%04x-4%03x-%04x-%012llx", (unsigned)(a >> 32), (unsigned)(a >> 16) & 0xffff,
                 (unsigned)a & 0xfff, (unsigned)(0x8000 | ((b >> 48) & 0x3fff)), (unsigned long long)(b & 0xffffffffffffull));
        char name[96];
        snprintf(name, sizeof name, "%s-%s-%s-%lld", k_words[pick(20)], k_words[pick(20)], k_words[pick(20)], (long long)i);
        int project = pick(10);
        int s = pick(100), st_i = 0;
        for (int acc = state_pct[0]; s >= acc && st_i < 4; acc += state_pct[++st_i])
            ;
        const char *state = svc_state_name(states[st_i]);
        /* jobs are stored as they are created: oldest first, over 180 days */
        int64_t created = now_us - 180 * 86400000000LL + (int64_t)((double)i * 180 * 86400e6 / (double)njobs) +
                          (int64_t)(unif() * 60e6);
        int64_t started = st_i == 4 ? 0 : created + (int64_t)(unif() * 600e6);
        int64_t ended = st_i <= 2 ? started + (int64_t)((600 + unif() * 36000) * 1e6) : 0;
        static const int gbs[] = {8, 16, 32, 64, 128, 256};
        static const int steps[] = {1000, 2000, 5000, 10000};
        int max_steps = steps[pick(4)];
        int64_t progress = st_i <= 1 || st_i == 2 ? (st_i == 0 ? max_steps : pick(max_steps)) : st_i == 3 ? pick(max_steps) : 0;
        double lr = pow(10, -5 + 3 * unif());
        int n_layer = 2 + pick(11), n_head = 2 << pick(3), n_embd = n_head * 64;
        buf_t hp = {0};
        bput(&hp, "{\"lr\":%.6g,\"global_batch_size\":%d,\"micro_batch_size\":0,\"max_steps\":%d,\"warmup_steps\":%d,"
                  "\"weight_decay\":%s,\"grad_clip\":%s,\"seed\":%d,\"beta1\":0.9,\"beta2\":%s,\"eps\":1e-08,"
                  "\"min_lr_fraction\":0.1,\"eval_every\":%d,\"eval_batches\":8,\"sample_every\":0,"
                  "\"sample_tokens\":256,\"temperature\":1.0,\"top_k\":40,"
                  "\"dropout\":%.2f,\"label_smoothing\":%.2f,\"ema_decay\":%s,\"warmup_ratio\":%.3f,"
                  "\"adam_amsgrad\":%d,\"layerwise_decay\":%.2f,\"mixup_alpha\":%.1f,\"cutmix_alpha\":%.1f,"
                  "\"stochastic_depth\":%.2f,\"rope_theta\":%d,\"attn_dropout\":%.2f,\"init_std\":%.3f}",
             lr, gbs[pick(6)], max_steps, (int)(100 * pick(6)), pick(3) == 0 ? "0" : pick(2) ? "0.01" : "0.1",
             pick(2) ? "1.0" : "0.5", (int)(rnd() % 100000), pick(2) ? "0.95" : "0.99", 100 * (1 + pick(5)),
             0.05 * pick(5), 0.05 * pick(3), pick(2) ? "0.999" : "0.9999", 0.01 * pick(10), pick(2),
             0.5 + 0.05 * pick(10), 0.2 * pick(5), 0.2 * pick(5), 0.05 * pick(4), 10000 << pick(3), 0.05 * pick(3),
             0.01 + 0.005 * pick(4));
        char tags[256];
        const char *team = k_teams[pick(5)], *ds = k_datasets[pick(10)];
        snprintf(tags, sizeof tags, "{\"team\":\"%s\",\"owner\":\"user%d\",\"dataset\":\"%s\"}", team, pick(50), ds);
        buf_t spec = {0};
        bput(&spec,
             "{\"name\":\"%s\",\"project\":\"proj-%d\",\"model\":{\"type\":\"gpt\",\"n_layer\":%d,\"n_head\":%d,"
             "\"n_embd\":%d,\"seq_len\":256,\"vocab\":\"bytes\",\"vocab_size\":256},\"data\":{\"train\":"
             "\"/data/%s/train.bin\",\"val_fraction\":0.1,\"format\":\"tokens\"},\"hyperparameters\":%s,"
             "\"resources\":{\"nodes\":%d,\"slots_per_node\":%d,\"slot_type\":\"%s\",\"device\":\"auto\","
             "\"threads_per_rank\":0,\"memory_limit_mb\":0},\"distribution\":{\"data_parallel\":{\"enabled\":true,"
             "\"bucket_mb\":25.0,\"shard_optimizer_state\":false},\"model_parallel\":{\"partitions\":1,"
             "\"microbatches\":1,\"pipeline\":\"interleaved\",\"optimize\":\"speed\",\"auto_partition\":true},"
             "\"mixed_precision\":\"bf16\",\"activation_checkpointing\":false},\"checkpoint\":{\"every_steps\":200,"
             "\"keep_last\":3},\"metric_definitions\":[],\"stopping\":{\"max_runtime_s\":0},\"retry\":"
             "{\"max_attempts\":%d},\"priority\":%d,\"queue\":\"default\",\"tags\":%s}",
             name, project, n_layer, n_head, n_embd, ds, hp.p, 1 + pick(4), 1 << pick(4), pick(4) ? "gpu" : "cpu",
             1 + pick(3), pick(5) - 2, tags);
        json_t *spj = json_loads(spec.p, 0, NULL);
        int nodes = (int)json_integer_value(json_object_get(json_object_get(spj, "resources"), "nodes"));
        int spn = (int)json_integer_value(json_object_get(json_object_get(spj, "resources"), "slots_per_node"));
        const char *slot = json_string_value(json_object_get(json_object_get(spj, "resources"), "slot_type"));
        int prio = (int)json_integer_value(json_object_get(spj, "priority"));
        int max_att = (int)json_integer_value(json_object_get(json_object_get(spj, "retry"), "max_attempts"));
        char c1[40], c2[40], c3[40], c4[40];
        ts(c1, sizeof c1, created);
        ts(c2, sizeof c2, ended ? ended : started ? started : created);
        if (started)
            ts(c3, sizeof c3, started);
        else
            snprintf(c3, sizeof c3, "\\N");
        if (ended)
            ts(c4, sizeof c4, ended);
        else
            snprintf(c4, sizeof c4, "\\N");
        /* spec text has no tabs, newlines or backslashes */
        bput(&jb, "%s\t%s\tproj-%d\t%s\t%s\t%s\t%d\t%d\t%d\tdefault\t%d\t%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%lld\t%d\t{}\t1\tuser%d\n",
             ids[i], name, project, spec.p, state, st_i == 1 ? "rank 0 exited with code 1" : "submitted",
             st_i == 4 ? 0 : 1, max_att, prio, nodes, spn, slot, nodes * spn, tags, c1, c2, c3, c4,
             (long long)progress, max_steps, pick(50));
        copy_send(pg, &jb, false);
        const char *key;
        json_t *v;
        json_object_foreach(json_object_get(spj, "hyperparameters"), key, v)
            if (json_is_number(v))
                bput(&hsave, "%s\t%s\t%.17g\n", ids[i], key, json_number_value(v));
        bput(&esave, "%s\t1\t\\N\tQUEUED\tsubmitted\t0\t%s\tuser0\n", ids[i], c1);
        json_decref(spj);
        free(hp.p);
        free(spec.p);
    }
    copy_end(pg, &jb);
    exec(pg, "COMMIT");
    fprintf(stderr, "search_gen: %lld jobs in %.1f s\n", (long long)njobs, kiln_mono_s() - t0);
    copy_begin(pg, "COPY job_hparams (job_id, key, num) FROM STDIN");
    size_t off = 0;
    while (off < hsave.len) {
        size_t n = KILN_MIN(hsave.len - off, (size_t)(4u << 20));
        if (PQputCopyData(pg, hsave.p + off, (int)n) != 1)
            die(pg, "COPY hparams");
        off += n;
    }
    hsave.len = 0;
    copy_end(pg, &hsave);
    copy_begin(pg, "COPY job_events (job_id, seq, from_state, to_state, reason, attempt, time, actor) FROM STDIN");
    off = 0;
    while (off < esave.len) {
        size_t n = KILN_MIN(esave.len - off, (size_t)(4u << 20));
        if (PQputCopyData(pg, esave.p + off, (int)n) != 1)
            die(pg, "COPY events");
        off += n;
    }
    esave.len = 0;
    copy_end(pg, &esave);
    fprintf(stderr, "search_gen: hyperparameters and events in %.1f s\n", kiln_mono_s() - t0);

    /* metrics: one chunk of P points per job and metric, and its summary */
    buf_t cb = {0}, sb = {0};
    copy_begin(pg, "COPY metric_chunks (job_id, name, rank, attempt, first_step, last_step, n, steps, vals, times_us)"
                   " FROM STDIN");
    copy_begin(pg2, "COPY metric_summaries (job_id, name, rank, n, min, max, last, min_step, max_step, last_step,"
                    " lo_step, hi_step, attempt) FROM STDIN");
    double *vals = malloc(sizeof(double) * (size_t)npoints);
    long long points = 0;
    for (int64_t i = 0; i < njobs; i++) {
        double quality = normal(); /* good runs are good on every metric */
        for (int m = 0; m < nmetrics; m++) {
            double start = 4.0 + 0.5 * normal(), end = 1.6 + 0.25 * quality + 0.05 * normal();
            for (int64_t k = 0; k < npoints; k++) {
                double x = (double)(k + 1) / (double)npoints;
                double base = end + (start - end) * exp(-5 * x);
                if (m == 2)
                    base = 3e-4 * (x < 0.1 ? x / 0.1 : 0.5 * (1 + cos(M_PI * (x - 0.1) / 0.9)));
                else if (m >= 4 && m <= 7)
                    base = (m + 1) * 100.0 * (1 + 0.1 * normal());
                else if (m == 8)
                    base = exp(base);
                else if (m == 9)
                    base = 1.0 / base;
                vals[k] = base * (1 + 0.01 * normal());
            }
            int64_t step0 = 10, dstep = 10;
            bput(&cb, "%s\t%s\t0\t1\t%lld\t%lld\t%lld\t{", ids[i], k_metrics[m], (long long)step0,
                 (long long)(step0 + dstep * (npoints - 1)), (long long)npoints);
            for (int64_t k = 0; k < npoints; k++)
                bput(&cb, "%s%lld", k ? "," : "", (long long)(step0 + dstep * k));
            bput(&cb, "}\t{");
            double mn = 0, mx = 0;
            int64_t mns = 0, mxs = 0;
            for (int64_t k = 0; k < npoints; k++) {
                bput(&cb, "%s%.17g", k ? "," : "", vals[k]);
                if (k == 0 || vals[k] < mn) {
                    mn = vals[k];
                    mns = step0 + dstep * k;
                }
                if (k == 0 || vals[k] > mx) {
                    mx = vals[k];
                    mxs = step0 + dstep * k;
                }
            }
            bput(&cb, "}\t{");
            for (int64_t k = 0; k < npoints; k++)
                bput(&cb, "%s%lld", k ? "," : "", (long long)(now_us - 86400000000LL + k * 1000000));
            bput(&cb, "}\n");
            int64_t last_step = step0 + dstep * (npoints - 1);
            bput(&sb, "%s\t%s\t0\t%lld\t%.17g\t%.17g\t%.17g\t%lld\t%lld\t%lld\t%lld\t%lld\t1\n", ids[i], k_metrics[m],
                 (long long)npoints, mn, mx, vals[npoints - 1], (long long)mns, (long long)mxs, (long long)last_step,
                 (long long)step0, (long long)last_step);
            points += npoints;
            copy_send(pg, &cb, false);
            copy_send(pg2, &sb, false);
        }
    }
    copy_end(pg, &cb);
    copy_end(pg2, &sb);
    fprintf(stderr, "search_gen: %lld metric points in %.1f s\n", points, kiln_mono_s() - t0);
    exec(pg, "VACUUM ANALYZE");
    fprintf(stderr, "search_gen: vacuumed and analysed at %.1f s\n", kiln_mono_s() - t0);

    /* The summaries written here must be what kiln's own definition gives. */
    int mismatches = 0;
    for (int64_t k = 0; k < ncheck; k++) {
        const char *id = ids[pick((int)njobs)];
        const char *name = k_metrics[pick((int)nmetrics)];
        const char *p[2] = {id, name};
        PGresult *r = PQexecParams(pg, "SELECT n, min, max, last, min_step, max_step, last_step FROM metric_summaries"
                                       " WHERE job_id = $1::uuid AND name = $2", 2, NULL, p, NULL, NULL, 0);
        PGresult *r2 = NULL;
        if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
            PGresult *x = PQexecParams(pg3, "SELECT metric_summary_rebuild($1::uuid, $2)", 2, NULL, p, NULL, NULL, 0);
            PQclear(x);
            r2 = PQexecParams(pg, "SELECT n, min, max, last, min_step, max_step, last_step FROM metric_summaries"
                                  " WHERE job_id = $1::uuid AND name = $2", 2, NULL, p, NULL, NULL, 0);
        }
        bool same = r2 && PQntuples(r2) == 1;
        for (int col = 0; same && col < 7; col++)
            same = col >= 1 && col <= 3 ? atof(PQgetvalue(r, 0, col)) == atof(PQgetvalue(r2, 0, col))
                                        : !strcmp(PQgetvalue(r, 0, col), PQgetvalue(r2, 0, col));
        if (!same) {
            mismatches++;
            fprintf(stderr, "search_gen: summary of %s %s differs from metric_summary_rebuild\n", id, name);
        }
        PQclear(r);
        PQclear(r2);
    }
    printf("search_gen: %lld jobs, %lld hyperparameters each (18 of kiln's, 12 more), %lld metrics, %lld points;"
           " %lld summaries checked against metric_summary_rebuild, %d different; %.1f s\n",
           (long long)njobs, 30LL, (long long)nmetrics, points, (long long)ncheck, mismatches, kiln_mono_s() - t0);
    free(vals);
    free(ids);
    free(jb.p);
    free(hsave.p);
    free(esave.p);
    free(cb.p);
    free(sb.p);
    PQfinish(pg);
    PQfinish(pg2);
    PQfinish(pg3);
    return mismatches ? 1 : 0;
}
