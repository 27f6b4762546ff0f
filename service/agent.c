/* agent.c - what agents report about the ranks they run: "all my ranks started" (or could not
 * start), and rank exits. These drive the job from STARTING to RUNNING and from RUNNING (or
 * STOPPING) to its end. A report about an older attempt than the job's current one is recorded
 * (its slots are freed) but never changes the job. */
#include "service/svc_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_report(const char *worker_id, const char *job_id, kiln_err_t *err)
{
    if (!worker_id || !*worker_id)
        return kiln_err_set(err, KILN_EINVAL, "worker_id", "report without a worker id");
    if (!job_id || !store_is_uuid(job_id)) {
        kiln_err_set(err, KILN_ENOTFOUND, "job_id", "job \"%.80s\" not found", job_id ? job_id : "");
        return KILN_ENOTFOUND;
    }
    return 0;
}

int svc_agent_rank_status(svc_t *s, const Kiln__RankStatus *req, kiln_err_t *err)
{
    svc_tx_t tx;
    store_job_row_t job;
    char reason[700];
    int rc = check_report(req->worker_id, req->job_id, err);
    if (rc)
        return rc;
    rc = svc_tx_begin(s, &tx, err);
    if (rc)
        return rc;
    rc = store_job_row(tx.c, req->job_id, true, &job, err);
    if (rc)
        goto fail;
    if (req->attempt != job.attempt) {
        log_info("job %s: ignoring rank status from worker %s for attempt %d (current attempt %d)",
                 job.id, req->worker_id, req->attempt, job.attempt);
        if (!req->started)
            rc = store_assign_release(tx.c, job.id, req->attempt, req->worker_id, err);
        if (rc)
            goto fail;
        return svc_tx_commit(&tx, err);
    }
    svc_job_state_t st = svc_state_parse(job.state);
    if (req->started) {
        bool found = false;
        rc = store_assign_set_started(tx.c, job.id, job.attempt, req->worker_id, &found, err);
        if (rc)
            goto fail;
        if (!found) {
            rc = kiln_err_set(err, KILN_ENOTFOUND, "worker_id", "worker \"%s\" has no live assignment "
                              "for attempt %d of job %s", req->worker_id, job.attempt, job.id);
            goto fail;
        }
        if (st == JOB_STATE_STARTING) {
            store_assign_t *as = NULL;
            int n = 0, started = 0;
            rc = store_assign_list(tx.c, job.id, job.attempt, &as, &n, err);
            if (rc)
                goto fail;
            for (int i = 0; i < n; i++)
                started += as[i].started && !as[i].released;
            free(as);
            if (n > 0 && started == n) {
                snprintf(reason, sizeof(reason), "all %d rank(s) started", job.world_size);
                rc = svc_job_set_state(&tx, &job, JOB_STATE_RUNNING, job.attempt, STORE_TR_STARTED,
                                       reason, err);
                if (rc)
                    goto fail;
            }
        }
    } else {
        /* Nothing runs for this worker's part: free its slots, fail the attempt. */
        rc = store_assign_release(tx.c, job.id, job.attempt, req->worker_id, err);
        if (rc)
            goto fail;
        if (req->worker_shutdown) {
            /* The agent refused because it is shutting down: the attempt goes back to the
             * queue (a lost attempt, as when a worker dies), and the worker takes nothing new. */
            bool changed = false;
            rc = store_worker_set_draining(tx.c, req->worker_id, &changed, err);
            snprintf(reason, sizeof(reason), "worker %s is shutting down and did not start its ranks",
                     req->worker_id);
            if (rc == 0)
                rc = svc_job_lose_attempt(&tx, &job, job.attempt, req->worker_id, reason, err);
        } else if (st == JOB_STATE_SCHEDULED || st == JOB_STATE_STARTING || st == JOB_STATE_RUNNING) {
            snprintf(reason, sizeof(reason), "worker %s could not start its ranks: %s", req->worker_id,
                     req->reason && *req->reason ? req->reason : "no reason given");
            rc = store_assign_stop(tx.c, job.id, job.attempt, reason, NULL, err);
            if (rc == 0)
                rc = svc_job_set_state(&tx, &job, JOB_STATE_FAILED, job.attempt, 0, reason, err);
        } else if (st == JOB_STATE_STOPPING) {
            rc = svc_job_finish_stopping(&tx, &job, err);
        }
        if (rc)
            goto fail;
    }
    return svc_tx_commit(&tx, err);
fail:
    svc_tx_abort(&tx);
    return rc;
}

int svc_agent_rank_exit(svc_t *s, const Kiln__RankExit *req, kiln_err_t *err)
{
    svc_tx_t tx;
    store_job_row_t job;
    char reason[900];
    int rc = check_report(req->worker_id, req->job_id, err);
    if (rc)
        return rc;
    if (req->rank < 0)
        return kiln_err_set(err, KILN_EINVAL, "rank", "rank must be >= 0, got %d", req->rank);
    rc = svc_tx_begin(s, &tx, err);
    if (rc)
        return rc;
    rc = store_job_row(tx.c, req->job_id, true, &job, err);
    if (rc)
        goto fail;
    bool inserted = false, released = false;
    rc = store_rank_exit_insert(tx.c, req, &inserted, &released, err);
    if (rc)
        goto fail;
    if (released)
        tx.wake_sched = true;
    bool failed = req->exit_code != 0 || req->signal != 0;
    log_info("job %s: rank %d (attempt %d) on worker %s exited with code %d%s%s", job.id, req->rank,
             req->attempt, req->worker_id, req->exit_code, failed && req->reason && *req->reason ? ": " : "",
             failed && req->reason ? req->reason : "");
    if (!inserted || req->attempt != job.attempt)
        return svc_tx_commit(&tx, err);   /* a repeat, or an old attempt: nothing changes */

    svc_job_state_t st = svc_state_parse(job.state);
    if (failed && req->worker_shutdown && (st == JOB_STATE_STARTING || st == JOB_STATE_RUNNING)) {
        /* Its agent stopped the rank to shut down (preemption, maintenance): the attempt is lost,
         * as when a worker dies, and the worker takes nothing new. */
        bool changed = false; /* the scheduler reads capacity afresh on its next pass */
        rc = store_worker_set_draining(tx.c, req->worker_id, &changed, err);
        snprintf(reason, sizeof(reason), "worker %s is shutting down; it stopped rank %d", req->worker_id,
                 req->rank);
        if (rc == 0)
            rc = svc_job_lose_attempt(&tx, &job, job.attempt, req->worker_id, reason, err);
    } else if (st == JOB_STATE_STARTING || st == JOB_STATE_RUNNING) {
        if (failed) {
            if (req->signal != 0)
                snprintf(reason, sizeof(reason), "rank %d on worker %s was killed by signal %d%s%s",
                         req->rank, req->worker_id, req->signal, req->reason && *req->reason ? ": " : "",
                         req->reason ? req->reason : "");
            else
                snprintf(reason, sizeof(reason), "rank %d on worker %s exited with code %d: %s",
                         req->rank, req->worker_id, req->exit_code,
                         req->reason && *req->reason ? req->reason : "no reason given");
            rc = store_assign_stop(tx.c, job.id, job.attempt, reason, NULL, err);
            /* A rank that exited had started, even if the agent's "started" report is late. */
            if (rc == 0)
                rc = svc_job_set_state(&tx, &job, JOB_STATE_FAILED, job.attempt, STORE_TR_STARTED,
                                       reason, err);
        } else {
            int n_exited = 0, n_ok = 0;
            rc = store_rank_exit_counts(tx.c, job.id, job.attempt, &n_exited, &n_ok, err);
            if (rc == 0 && n_ok >= job.world_size) {
                snprintf(reason, sizeof(reason), "all %d rank(s) exited with code 0", job.world_size);
                rc = svc_job_set_state(&tx, &job, JOB_STATE_COMPLETED, job.attempt, STORE_TR_STARTED,
                                       reason, err);
            }
        }
    } else if (st == JOB_STATE_STOPPING) {
        rc = svc_job_finish_stopping(&tx, &job, err);
    }
    if (rc)
        goto fail;
    return svc_tx_commit(&tx, err);
fail:
    svc_tx_abort(&tx);
    return rc;
}
