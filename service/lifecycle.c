/* lifecycle.c - the end of a job's life: deleting an ended job with everything it left (rows,
 * then its artifact files), and the clean-up thread: the artifact store's trash and the log
 * retention (logs of jobs ended more than --log-retention-days ago are dropped in bounded
 * batches, by one kilnd at a time). */
#include "service/svc_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define JANITOR_DEFAULT_MS (3600 * 1000)
#define RETENTION_JOBS 50            /* jobs read per query */
#define RETENTION_BATCH 5000         /* log lines per DELETE */
#define RETENTION_PAUSE_US 5000      /* between batches, so the database serves others meanwhile */

int svc_job_delete(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err)
{
    svc_tx_t tx;
    store_job_row_t job;
    store_artifact_t *arts = NULL;
    store_ckpt_blob_t *blobs = NULL;
    json_t *removed = NULL;
    char *projects = NULL;
    int narts = 0, nblobs = 0;
    *out = NULL;
    JOB_RESOLVE(s, who, id, err);
    int rc = svc_tx_begin(s, &tx, err);
    if (rc)
        return rc;
    tx.actor = who->user;
    rc = svc_job_access(tx.c, who, id, SVC_ROLE_EDITOR, err);
    if (rc == 0)
        rc = store_job_row(tx.c, id, true, &job, err);
    if (rc)
        goto fail;
    if (!svc_state_terminal(svc_state_parse(job.state))) {
        rc = kiln_err_set(err, KILN_ESTATE, NULL, "job %s is %s: only a job that has ended (%s) can be deleted", id,
                          job.state, KILN_JOB_STATE_ENDED_LIST);
        kiln_err_hint(err, "stop it first (kiln stop %s), then delete it", id);
        goto fail;
    }
    /* a job that needs its model, named only to a caller who may read it (one it may read
     * first, when there are several) */
    char by[STORE_ID_LEN], by_project[64], name[SCHED_JOB_NAME_LEN];
    rc = svc_caller_projects(who, &projects, err);
    if (rc == 0)
        rc = store_job_init_dependent(tx.c, id, projects, by, by_project, err);
    if (rc == 0 && by[0]) {
        rc = kiln_err_set(err, KILN_ESTATE, NULL, "%s starts from this job's model (model.init_from) and has not "
                          "ended", svc_job_name(who, by, by_project, name, sizeof name));
        if (svc_caller_role(who, by_project) != SVC_ROLE_NONE)
            kiln_err_hint(err, "delete this job once job %s has ended", by);
        else
            kiln_err_hint(err, "delete this job once that job has ended; its project's members can stop it");
    }
    if (rc == 0)
        rc = store_artifacts_of(tx.c, id, true, &arts, &narts, err);
    if (rc == 0)
        rc = store_ckpt_blobs(tx.c, id, &blobs, &nblobs, err);
    if (rc)
        goto fail;
    /* the bytes of its artifacts and of its synced checkpoint directory's contents; the job's
     * directory in every store holding any of them goes */
    int64_t bytes = 0;
    for (int i = 0; i < narts + nblobs && rc == 0; i++) {
        const char *sid = i < narts ? arts[i].store_id : blobs[i - narts].store_id;
        bytes += i < narts ? (arts[i].complete ? arts[i].size : arts[i].received) : blobs[i - narts].received;
        bool seen = false;
        for (int k = 0; k < i && !seen; k++)
            seen = !strcmp(k < narts ? arts[k].store_id : blobs[k - narts].store_id, sid);
        if (!seen)
            rc = store_artifact_trash_add(tx.c, sid, id, 0, err);
    }
    /* This store may hold files without a row (an upload never announced twice, a partial file):
     * its job directory goes too. */
    if (rc == 0 && s->store_id[0])
        rc = store_artifact_trash_add(tx.c, s->store_id, id, 0, err);
    if (rc == 0)
        rc = store_job_delete(tx.c, id, &removed, err);
    if (rc)
        goto fail;
    rc = svc_tx_commit(&tx, err);
    if (rc)
        goto done;
    svc_prom_job_deleted();
    log_info("job %s: deleted by %s (%d artifact(s), %d checkpoint content(s), %lld bytes)", id,
             who->user[0] ? who->user : "kilnd", narts, nblobs, (long long)bytes);
    store_conn_t *c = NULL;
    kiln_err_t e2;
    if (s->store_id[0] && store_conn_get(s->store, &c, &e2) == 0) {
        svc_artifact_sweep(s, c, 100);
        store_conn_put(s->store, c);
    }
    *out = json_pack("{s:s, s:O, s:I}", "id", id, "removed", removed, "artifact_bytes", (json_int_t)bytes);
    goto done;
fail:
    svc_tx_abort(&tx);
done:
    json_decref(removed);
    free(projects);
    free(arts);
    free(blobs);
    return rc;
}

/* ---- the clean-up thread ------------------------------------------------------------------------ */

static bool janitor_stopping(svc_t *s)
{
    pthread_mutex_lock(&s->mu);
    bool stop = s->stopping;
    pthread_mutex_unlock(&s->mu);
    return stop;
}

/* Drops the logs of jobs ended more than days ago: a job at a time, RETENTION_BATCH lines per
 * statement, each its own transaction. */
static int retention_pass(svc_t *s, store_conn_t *c, int days, int64_t *dropped, int *jobs, kiln_err_t *err)
{
    for (;;) {
        store_job_ref_t *ids = NULL;
        int n = 0;
        int rc = store_logs_expired_jobs(c, days, RETENTION_JOBS, &ids, &n, err);
        if (rc)
            return rc;
        for (int i = 0; i < n; i++) {
            int64_t got = RETENTION_BATCH;
            while (got == RETENTION_BATCH) {
                if (janitor_stopping(s)) {
                    free(ids);
                    return 0;
                }
                rc = store_logs_delete_batch(c, ids[i].id, RETENTION_BATCH, &got, err);
                if (rc) {
                    free(ids);
                    return rc;
                }
                *dropped += got;
                if (got == RETENTION_BATCH)
                    usleep(RETENTION_PAUSE_US);
            }
            rc = store_job_logs_expired(c, ids[i].id, err);
            if (rc) {
                free(ids);
                return rc;
            }
            (*jobs)++;
        }
        free(ids);
        if (n < RETENTION_JOBS)
            return 0;
    }
}

int svc_janitor_pass(svc_t *s, int64_t *dropped, kiln_err_t *err)
{
    int64_t lines = 0;
    int jobs = 0;
    if (dropped)
        *dropped = 0;
    store_conn_t *c = NULL;
    int rc = store_conn_get(s->store, &c, err);
    if (rc)
        return rc;
    if (s->store_id[0])
        while (svc_artifact_sweep(s, c, 100) == 100 && !janitor_stopping(s))
            ;
    int days = s->cfg.log_retention_days;
    if (days > 0) {
        bool got = false;
        rc = store_janitor_lock(c, &got, err);
        if (rc == 0 && got) {
            rc = retention_pass(s, c, days, &lines, &jobs, err);
            store_janitor_unlock(c);
        }
    }
    store_conn_put(s->store, c);
    if (jobs > 0)
        log_info("log retention: dropped %lld log line(s) of %d job(s) that ended more than %d day(s) ago",
                 (long long)lines, jobs, days);
    if (dropped)
        *dropped = lines;
    return rc;
}

static void *janitor_main(void *arg)
{
    svc_t *s = arg;
    int interval = s->cfg.janitor_interval_ms > 0 ? s->cfg.janitor_interval_ms : JANITOR_DEFAULT_MS;
    /* The first pass soon after start, then one per interval. */
    int wait_ms = KILN_MIN(interval, 1000);
    for (;;) {
        struct timespec ts;
        kiln_deadline_in(&ts, wait_ms);
        pthread_mutex_lock(&s->mu);
        while (!s->stopping)
            if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) != 0)
                break;
        bool stop = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (stop)
            break;
        kiln_err_t err;
        if (svc_janitor_pass(s, NULL, &err) != 0)
            log_warn("clean-up pass: %s", err.message);
        wait_ms = interval;
    }
    return NULL;
}

int svc_janitor_start(svc_t *s, kiln_err_t *err)
{
    if (s->cfg.log_retention_days <= 0 && !s->store_id[0])
        return 0; /* nothing to clean */
    if (pthread_create(&s->janitor_thread, NULL, janitor_main, s) != 0)
        return kiln_err_set(err, KILN_EINTERNAL, NULL, "could not start the clean-up thread");
    s->janitor_started = true;
    if (s->cfg.log_retention_days > 0)
        log_info("log retention: logs of jobs that ended more than %d day(s) ago are dropped", s->cfg.log_retention_days);
    return 0;
}

void svc_janitor_stop(svc_t *s)
{
    if (!s->janitor_started)
        return;
    pthread_join(s->janitor_thread, NULL);
    s->janitor_started = false;
}
