/* ingest.c - logs and metrics from agents: one transaction per batch that first records the
 * batch's number (a copy re-sent after a lost reply is acknowledged and stored no second time,
 * so it reaches neither the rows nor the summaries), takes the job's next log seqs from the
 * database (batches of one job commit in seq order, whichever kilnd stores them) and COPYs the
 * rows; after the commit every kilnd's followers hear of the new lines (notify.c). Per metric
 * batch one job-row UPDATE (latest values, progress, ETA) and the upsert of the job's metric
 * summaries, in the COPY's transaction. Also the table of per-job in-memory entries these share. */
#include "service/svc_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- per-job entries ---------------------------------------------------------------------- */

static unsigned bucket_of(const char *id)
{
    uint32_t h = 2166136261u;
    for (const char *p = id; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    return h % SVC_JOBENT_BUCKETS;
}

svc_jobent_t *svc_jobent_get(svc_t *s, const char *job_id)
{
    unsigned b = bucket_of(job_id);
    pthread_mutex_lock(&s->jobs_mu);
    svc_jobent_t *e = s->jobs[b];
    while (e && strcmp(e->id, job_id) != 0)
        e = e->next;
    if (!e) {
        e = calloc(1, sizeof(*e));
        if (!e) {
            pthread_mutex_unlock(&s->jobs_mu);
            return NULL;
        }
        kiln_strlcpy(e->id, job_id, sizeof(e->id));
        pthread_mutex_init(&e->pub_mu, NULL);
        pthread_mutex_init(&e->fmu, NULL);
        pthread_mutex_init(&e->own_mu, NULL);
        e->rate_attempt = -1;
        e->next = s->jobs[b];
        s->jobs[b] = e;
    }
    e->refs++;
    e->last_used_us = kiln_mono_us();
    pthread_mutex_unlock(&s->jobs_mu);
    return e;
}

svc_jobent_t *svc_jobent_find(svc_t *s, const char *job_id)
{
    unsigned b = bucket_of(job_id);
    pthread_mutex_lock(&s->jobs_mu);
    svc_jobent_t *e = s->jobs[b];
    while (e && strcmp(e->id, job_id) != 0)
        e = e->next;
    if (e)
        e->refs++;
    pthread_mutex_unlock(&s->jobs_mu);
    return e;
}

void svc_jobent_put(svc_t *s, svc_jobent_t *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&s->jobs_mu);
    if (e->refs <= 0) {
        log_error("service: job entry %s released too often", e->id);
        abort();
    }
    e->refs--;
    e->last_used_us = kiln_mono_us();
    pthread_mutex_unlock(&s->jobs_mu);
}

static void jobent_free(svc_jobent_t *e)
{
    for (int i = 0; i < SVC_OWN_SLOTS; i++)
        free(e->own[i].ranks);
    pthread_mutex_destroy(&e->own_mu);
    pthread_mutex_destroy(&e->pub_mu);
    pthread_mutex_destroy(&e->fmu);
    free(e);
}

void svc_jobent_sweep(svc_t *s, int64_t idle_us)
{
    int64_t now = kiln_mono_us();
    pthread_mutex_lock(&s->jobs_mu);
    for (int b = 0; b < SVC_JOBENT_BUCKETS; b++) {
        svc_jobent_t **pp = &s->jobs[b];
        while (*pp) {
            svc_jobent_t *e = *pp;
            /* Followers hold a reference, so refs == 0 means none. */
            if (e->refs == 0 && now - e->last_used_us > idle_us) {
                *pp = e->next;
                jobent_free(e);
            } else {
                pp = &e->next;
            }
        }
    }
    pthread_mutex_unlock(&s->jobs_mu);
}

void svc_jobents_free(svc_t *s)
{
    for (int b = 0; b < SVC_JOBENT_BUCKETS; b++) {
        svc_jobent_t *e = s->jobs[b];
        while (e) {
            svc_jobent_t *next = e->next;
            if (e->refs > 0)
                log_warn("service: job entry %s still referenced at shutdown", e->id);
            jobent_free(e);
            e = next;
        }
        s->jobs[b] = NULL;
    }
}

/* ---- logs ---------------------------------------------------------------------------------- */

/* The batch's worker (its credential's, see agent.c) must own every rank the batch carries:
 * ranks[0..n) hold them, possibly repeated. */
static int check_batch(svc_t *s, const char *worker_id, const char *claimed, const char *job_id,
                       int attempt, const int *ranks, size_t n, kiln_err_t *err)
{
    if (!job_id || !store_is_uuid(job_id)) {
        kiln_err_set(err, KILN_ENOTFOUND, "job_id", "job \"%.80s\" not found", job_id ? job_id : "");
        kiln_err_hint(err, "job ids are UUIDs, as the assignment carried them");
        return KILN_ENOTFOUND;
    }
    const char *wid = worker_id && *worker_id ? worker_id : claimed;
    if (worker_id && *worker_id && claimed && *claimed && strcmp(claimed, worker_id) != 0) {
        kiln_err_set(err, KILN_EPERM, "worker_id", "this credential belongs to worker %s, not \"%.64s\"",
                     worker_id, claimed);
        return KILN_EPERM;
    }
    if (!wid || !*wid)
        return kiln_err_set(err, KILN_EINVAL, "worker_id", "batch without a worker id");
    int distinct[64];
    size_t nd = 0;
    for (size_t i = 0; i < n; i++) {
        bool seen = false;
        for (size_t k = 0; k < nd && !seen; k++)
            seen = distinct[k] == ranks[i];
        if (seen)
            continue;
        if (nd == KILN_ARRAY_LEN(distinct)) {
            int rc = svc_agent_owns(s, wid, job_id, attempt, distinct, nd, err);
            if (rc)
                return rc;
            nd = 0;
        }
        distinct[nd++] = ranks[i];
    }
    return svc_agent_owns(s, wid, job_id, attempt, distinct, nd, err);
}

int svc_agent_logs(svc_t *s, const char *worker_id, const Kiln__LogBatch *batch, kiln_err_t *err)
{
    if (batch->n_lines > KILN_LOG_BATCH_LINES) { /* each line costs a check and a row: bounded work per call */
        kiln_err_set(err, KILN_EINVAL, "lines", "a log batch holds at most %d lines; this one has %zu",
                     KILN_LOG_BATCH_LINES, batch->n_lines);
        kiln_err_hint(err, "send the lines in several batches, as kiln-agent does");
        return KILN_EINVAL;
    }
    int *ranks = malloc(sizeof(int) * (batch->n_lines + 1));
    if (!ranks)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    for (size_t i = 0; i < batch->n_lines; i++)
        ranks[i] = batch->lines[i] ? batch->lines[i]->rank : -1;
    int rc = check_batch(s, worker_id, batch->worker_id, batch->job_id, batch->attempt, ranks,
                         batch->n_lines, err);
    free(ranks);
    if (rc)
        return rc;
    for (size_t i = 0; i < batch->n_lines; i++) {
        size_t len = batch->lines[i] && batch->lines[i]->line ? strlen(batch->lines[i]->line) : 0;
        if (len > SVC_LOG_LINE_MAX)
            return kiln_err_set(err, KILN_EINVAL, "lines.line",
                                "line %zu of the log batch is %zu bytes; kilnd stores lines of at most %d bytes "
                                "(kiln-agent cuts its ranks' lines at 16 KiB)", i, len, SVC_LOG_LINE_MAX);
    }
    if (batch->n_lines == 0)
        return 0;
    store_conn_t *c = NULL;
    bool fresh = true;
    int64_t first = 0, n = (int64_t)batch->n_lines;
    rc = store_conn_get(s->store, &c, err);
    if (rc == 0)
        rc = store_begin(c, err);
    if (rc == 0)
        rc = store_ingest_claim(c, batch->job_id, batch->stream_id, "logs", batch->batch_seq, &fresh, err);
    if (rc || !fresh)
        goto out;
    rc = store_log_seq_take(c, batch->job_id, n, &first, err);
    if (rc == 0)
        rc = store_logs_copy(c, batch->job_id, batch->attempt, batch->lines, batch->n_lines, first, kiln_now_us(),
                             err);
    if (rc == 0)
        rc = store_commit(c, err);
out:
    if (c) {
        if (!fresh) {
            store_rollback(c);
            log_debug("job %s: log batch %llu of stream %llx was stored before; acknowledged again", batch->job_id,
                      (unsigned long long)batch->batch_seq, (unsigned long long)batch->stream_id);
        }
        store_conn_put(s->store, c);
    }
    if (rc == 0 && fresh) {
        prom_add(&svc_prom_lines, "", (double)batch->n_lines);
        svc_notify_logs(s, batch->job_id, first + n - 1);
    }
    return rc;
}

/* ---- metrics ------------------------------------------------------------------------------- */

/* Refuses a batch of nnames metric names (distinct, stored in this transaction) that gave job_id
 * more than SVC_METRIC_NAMES_MAX. The database is counted only when the job's entry cannot
 * vouch for it: it adds each accepted batch's names to an upper bound, exact after each count,
 * so a job that reports the same few metrics is counted once every thousand-odd names. Batches
 * through another kilnd replica escape this bound until its next count, so a job may pass the
 * limit by what the replicas take in between, never without end. */
static int metric_names_check(svc_t *s, store_conn_t *c, const char *job_id, size_t nnames, kiln_err_t *err)
{
    svc_jobent_t *e = svc_jobent_get(s, job_id);
    bool within = false;
    if (e) {
        pthread_mutex_lock(&e->fmu);
        within = e->metric_names_known && e->metric_names_hi + (int64_t)nnames <= SVC_METRIC_NAMES_MAX;
        if (within)
            e->metric_names_hi += (int64_t)nnames;
        pthread_mutex_unlock(&e->fmu);
    }
    int64_t n = 0;
    int rc = within ? 0 : store_metric_names_count(c, job_id, &n, err);
    if (rc == 0 && !within && n > SVC_METRIC_NAMES_MAX) {
        kiln_err_set(err, KILN_EINVAL, "points.name", "job %s would have %lld metric names; a job may have at most %d",
                     job_id, (long long)n, SVC_METRIC_NAMES_MAX);
        kiln_err_hint(err, "log fewer distinct metric names (write per-layer or per-class values to a file in the "
                           "job's output instead)");
        rc = KILN_EINVAL;
    } else if (rc == 0 && !within && e) {
        pthread_mutex_lock(&e->fmu);
        e->metric_names_known = true;
        e->metric_names_hi = n;
        pthread_mutex_unlock(&e->fmu);
    }
    if (e)
        svc_jobent_put(s, e);
    return rc;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A batch naming more metrics than a job may have is refused before any work: grouping its
 * points by name and merging their summaries grows with the square of its names (40,000 names
 * took 15 s of a gRPC thread before this, and the batch's size is checked first). */
static int metric_batch_names_check(const Kiln__MetricBatch *batch, kiln_err_t *err)
{
    if (batch->n_points <= SVC_METRIC_NAMES_MAX)
        return 0;
    const char **names = malloc(batch->n_points * sizeof *names);
    if (!names)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    for (size_t i = 0; i < batch->n_points; i++)
        names[i] = batch->points[i]->name;
    qsort(names, batch->n_points, sizeof *names, cmp_name);
    size_t distinct = 1;
    for (size_t i = 1; i < batch->n_points; i++)
        distinct += strcmp(names[i - 1], names[i]) != 0;
    free(names);
    if (distinct <= SVC_METRIC_NAMES_MAX)
        return 0;
    kiln_err_set(err, KILN_EINVAL, "points.name", "job %s would have %zu metric names or more; a job may have at most %d",
                 batch->job_id, distinct, SVC_METRIC_NAMES_MAX);
    kiln_err_hint(err, "log fewer distinct metric names (write per-layer or per-class values to a file in the job's "
                       "output instead)");
    return KILN_EINVAL;
}

typedef struct latest {
    const char *name;
    int64_t step;
    double value;
} latest_t;

int svc_agent_metrics(svc_t *s, const char *worker_id, const Kiln__MetricBatch *batch, kiln_err_t *err)
{
    if (batch->n_points > KILN_METRIC_BATCH_POINTS) {
        kiln_err_set(err, KILN_EINVAL, "points", "a metric batch holds at most %d points; this one has %zu",
                     KILN_METRIC_BATCH_POINTS, batch->n_points);
        kiln_err_hint(err, "send the points in several batches, as kiln-agent does");
        return KILN_EINVAL;
    }
    for (size_t i = 0; i < batch->n_points; i++) {
        if (!batch->points[i] || !batch->points[i]->name || !batch->points[i]->name[0])
            return kiln_err_set(err, KILN_EINVAL, "points", "metric point %zu has no name", i);
        int crc = svc_check_line("points.name", batch->points[i]->name, 127, err);
        if (crc)
            return crc;
        if (batch->points[i]->step < 0)
            return kiln_err_set(err, KILN_EINVAL, "points.step", "metric point %zu has step %lld; steps are 0 or more",
                                i, (long long)batch->points[i]->step);
    }
    int rc = metric_batch_names_check(batch, err);
    if (rc)
        return rc;
    int *ranks = malloc(sizeof(int) * (batch->n_points + 1));
    if (!ranks)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    for (size_t i = 0; i < batch->n_points; i++)
        ranks[i] = batch->points[i]->rank;
    rc = check_batch(s, worker_id, batch->worker_id, batch->job_id, batch->attempt, ranks, batch->n_points, err);
    free(ranks);
    if (rc)
        return rc;
    if (batch->n_points == 0)
        return 0;

    /* The latest value of each metric in the batch (highest step wins; a later point wins a tie)
     * and the highest step with its time, for progress and the step rate. */
    latest_t lat[64];
    int nlat = 0;
    int64_t max_step = 0, max_step_t = 0, now = kiln_now_us();
    for (size_t i = 0; i < batch->n_points; i++) {
        const Kiln__MetricPoint *p = batch->points[i];
        if (p->step > max_step || max_step_t == 0) {
            if (p->step >= max_step) {
                max_step = p->step;
                max_step_t = p->time_us > 0 ? p->time_us : now;
            }
        }
        if (!isfinite(p->value))
            continue;
        int k = 0;
        while (k < nlat && strcmp(lat[k].name, p->name) != 0)
            k++;
        if (k == nlat) {
            if (nlat == (int)KILN_ARRAY_LEN(lat))
                continue;
            lat[nlat].name = p->name;
            lat[nlat].step = p->step;
            lat[nlat].value = p->value;
            nlat++;
        } else if (p->step >= lat[k].step) {
            lat[k].step = p->step;
            lat[k].value = p->value;
        }
    }
    json_t *lj = json_object();
    for (int k = 0; k < nlat; k++)
        json_object_set_new(lj, lat[k].name, json_real(lat[k].value));
    char *latest_text = json_dumps(lj, JSON_COMPACT | SPEC_JSON_REALS);
    json_decref(lj);

    double rate = 0;
    store_conn_t *c = NULL;
    store_metric_sum_t *sums = NULL;
    size_t nsums = 0;
    bool found = false, fresh = true;
    rc = store_conn_get(s->store, &c, err);
    if (rc)
        goto out;
    rc = store_begin(c, err);
    if (rc == 0)
        rc = store_ingest_claim(c, batch->job_id, batch->stream_id, "metrics", batch->batch_seq, &fresh, err);
    if (rc == 0 && !fresh) {
        log_debug("job %s: metric batch %llu of stream %llx was stored before; acknowledged again", batch->job_id,
                  (unsigned long long)batch->batch_seq, (unsigned long long)batch->stream_id);
        store_rollback(c);
        goto out;
    }
    /* Step rate of the attempt, from the first batch seen to this one (a batch sent again,
     * acknowledged above, does not move it). */
    svc_jobent_t *e = rc == 0 ? svc_jobent_get(s, batch->job_id) : NULL;
    if (e) {
        pthread_mutex_lock(&e->fmu);
        if (e->rate_attempt != batch->attempt || max_step < e->rate_step0) {
            e->rate_attempt = batch->attempt;
            e->rate_step0 = max_step;
            e->rate_t0_us = max_step_t;
        } else if (max_step > e->rate_step0 && max_step_t > e->rate_t0_us) {
            rate = (double)(max_step - e->rate_step0) / ((double)(max_step_t - e->rate_t0_us) / 1e6);
        }
        pthread_mutex_unlock(&e->fmu);
        svc_jobent_put(s, e);
    }
    if (rc == 0)
        rc = store_metrics_copy(c, batch->job_id, batch->attempt, batch->points, batch->n_points, now, &sums,
                                &nsums, err);
    if (rc == 0)
        rc = store_job_metrics_update(c, batch->job_id, batch->attempt,
                                      latest_text ? latest_text : "{}", max_step, rate, &found, err);
    if (rc == 0 && !found) {
        kiln_err_set(err, KILN_ENOTFOUND, "job_id", "job \"%s\" not found", batch->job_id);
        rc = KILN_ENOTFOUND;
    }
    /* After the job row's update: its lock orders concurrent batches of one job. */
    if (rc == 0)
        rc = store_metric_summaries_update(c, batch->job_id, batch->attempt, sums, nsums, err);
    if (rc == 0)
        rc = metric_names_check(s, c, batch->job_id, nsums, err);
    if (rc) {
        store_rollback(c);
        goto out;
    }
    rc = store_commit(c, err);
    if (rc == 0)
        prom_add(&svc_prom_points, "", (double)batch->n_points);
out:
    if (c)
        store_conn_put(s->store, c);
    free(sums);
    free(latest_text);
    return rc;
}
