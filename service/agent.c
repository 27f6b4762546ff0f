/* agent.c - the control plane's agent-facing calls: registration (a new worker needs a join
 * token, of which it consumes a use, and is rate-limited; taking over an existing worker id needs
 * its credential and certificate; bans, distinct certificates and approval; a fresh credential
 * each time), heartbeats (which carry new assignments and stop orders back, or that the worker
 * waits for approval), what agents report about the ranks they run ("all my ranks started" or
 * could not start, rank exits) and the check that a worker reports only for ranks kilnd assigned
 * to it. Reports drive the job from STARTING to RUNNING and from RUNNING (or STOPPING) to its
 * end; a report about an older attempt than the job's current one is recorded (its slots are
 * freed) but never changes the job. Logs and metrics are ingest.c's. */
#include "service/svc_int.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "rank/rank.h"
#include "spec/spec.h"

/* The worker a call acts for: the one its credential belongs to; a message naming another is
 * refused. With authentication off there is no credential and the message's id is taken. */
static int agent_worker(const char *authenticated, const char *claimed, const char **out, kiln_err_t *err)
{
    if (authenticated && *authenticated) {
        if (claimed && *claimed && strcmp(claimed, authenticated) != 0) {
            kiln_err_set(err, KILN_EPERM, "worker_id", "this credential belongs to worker %s, not \"%.64s\"",
                         authenticated, claimed);
            return KILN_EPERM;
        }
        *out = authenticated;
        return 0;
    }
    if (!claimed || !*claimed)
        return kiln_err_set(err, KILN_EINVAL, "worker_id", "report without a worker id");
    *out = claimed;
    return 0;
}

int svc_agent_check_report(const char *authenticated, const char *claimed, const char *job_id,
                           const char **wid, kiln_err_t *err)
{
    int rc = agent_worker(authenticated, claimed, wid, err);
    if (rc)
        return rc;
    if (!job_id || !store_is_uuid(job_id)) {
        kiln_err_set(err, KILN_ENOTFOUND, "job_id", "job \"%.80s\" not found", job_id ? job_id : "");
        return KILN_ENOTFOUND;
    }
    return 0;
}

int svc_agent_watch(const char *authenticated, const Kiln__WatchWorkRequest *req, const char **wid,
                    kiln_err_t *err)
{
    int rc = agent_worker(authenticated, req->worker_id, wid, err);
    if (rc == 0 && strlen(*wid) >= STORE_WORKER_ID_LEN)
        rc = kiln_err_set(err, KILN_EINVAL, "worker_id", "worker id is longer than %d characters",
                          STORE_WORKER_ID_LEN - 1);
    return rc;
}

int svc_agent_owns(svc_t *s, const char *worker_id, const char *job_id, int attempt, const int *ranks,
                   size_t n, kiln_err_t *err)
{
    svc_jobent_t *e = svc_jobent_get(s, job_id);
    if (!e)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    int owned[256], nowned = -1;
    /* An assignment's ranks never change once it exists: cache them per job. */
    pthread_mutex_lock(&e->own_mu);
    for (int i = 0; i < SVC_OWN_SLOTS && nowned < 0; i++) {
        if (e->own[i].ranks && e->own[i].attempt == attempt && !strcmp(e->own[i].worker, worker_id)) {
            nowned = e->own[i].n;
            memcpy(owned, e->own[i].ranks, sizeof(int) * (size_t)nowned);
        }
    }
    pthread_mutex_unlock(&e->own_mu);
    int rc = 0;
    if (nowned < 0) {
        store_conn_t *c = NULL;
        rc = store_conn_get(s->store, &c, err);
        if (rc == 0) {
            rc = store_assign_ranks_of(c, job_id, attempt, worker_id, owned, &nowned, err);
            store_conn_put(s->store, c);
        }
        if (rc == 0 && nowned > 0) {
            int *copy = malloc(sizeof(int) * (size_t)nowned);
            pthread_mutex_lock(&e->own_mu);
            int slot = e->own_next++ % SVC_OWN_SLOTS;
            free(e->own[slot].ranks);
            e->own[slot].ranks = copy;
            if (copy) {
                memcpy(copy, owned, sizeof(int) * (size_t)nowned);
                e->own[slot].n = nowned;
                e->own[slot].attempt = attempt;
                kiln_strlcpy(e->own[slot].worker, worker_id, sizeof(e->own[slot].worker));
            }
            pthread_mutex_unlock(&e->own_mu);
        }
    }
    svc_jobent_put(s, e);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        bool ok = false;
        for (int k = 0; k < nowned && !ok; k++)
            ok = owned[k] == ranks[i];
        if (!ok) {
            log_warn("worker %s: refused a report for rank %d of attempt %d of job %s, which kilnd did "
                     "not assign to it", worker_id, ranks[i], attempt, job_id);
            kiln_err_set(err, KILN_EPERM, "rank", "worker %s has no assignment for rank %d of attempt %d of job %s",
                         worker_id, ranks[i], attempt, job_id);
            return KILN_EPERM;
        }
    }
    if (nowned <= 0 && n == 0) {
        kiln_err_set(err, KILN_EPERM, "job_id", "worker %s has no assignment for attempt %d of job %s",
                     worker_id, attempt, job_id);
        return KILN_EPERM;
    }
    return 0;
}

/* A start report's checks before any database work: the worker (*wid), that kilnd assigned it
 * part of the attempt, the port. */
static int status_check(svc_t *s, const char *worker_id, const Kiln__RankStatus *req, const char **wid,
                        kiln_err_t *err)
{
    int rc = svc_agent_check_report(worker_id, req->worker_id, req->job_id, wid, err);
    if (rc == 0)
        rc = svc_agent_owns(s, *wid, req->job_id, req->attempt, NULL, 0, err);
    if (rc == 0 && req->started && req->master_port != 0)
        rc = svc_check_range("master_port", req->master_port, 1, 65535, err);
    return rc;
}

/* A start report inside tx, with the job's row *job read FOR UPDATE (updated when the job
 * changes; *moved says the row may no longer be what the database holds: read it again). */
static int status_in_tx(svc_tx_t *tx, const char *wid, const Kiln__RankStatus *req, store_job_row_t *job_row,
                        bool *moved, kiln_err_t *err)
{
    store_job_row_t job = *job_row;
    char reason[700];
    int rc = 0;
    *moved = false;
    if (req->attempt != job.attempt) {
        log_info("job %s: ignoring rank status from worker %s for attempt %d (current attempt %d)",
                 job.id, wid, req->attempt, job.attempt);
        if (!req->started)
            rc = store_assign_release(tx->c, job.id, req->attempt, wid, err);
        return rc;
    }
    /* svc_job_set_state keeps *job current; the other moves of a failed start may not */
    *moved = !req->started;
    svc_job_state_t st = svc_state_parse(job.state);
    if (req->started) {
        bool found = false, set = false;
        rc = store_assign_set_started(tx->c, job.id, job.attempt, wid, req->master_port, &found, &set, err);
        if (rc)
            goto out;
        if (set) /* the other nodes' assignments can go out now: nudge their agents (a job of one node
                  * has none: its own agent, which reports this, needs no nudge) */
            log_info("job %s: attempt %d's rendezvous is port %d on worker %s", job.id, job.attempt,
                     req->master_port, wid);
        if (set && job.nodes > 1) {
            rc = store_assign_notify_workers(tx->c, SVC_CH_WORK, (const char *const[]){job.id},
                                             (const int[]){job.attempt}, 1, err);
            if (rc)
                goto out;
        }
        if (!found) {
            /* the report again (its reply was lost) after the ranks it reported have exited: a
             * repeat, nothing to do; an assignment never started is not this worker's to start */
            store_assign_t *as = NULL;
            int n = 0;
            bool repeat = false;
            rc = store_assign_list(tx->c, job.id, job.attempt, &as, &n, err);
            for (int i = 0; rc == 0 && i < n; i++)
                repeat |= as[i].started && as[i].released && !strcmp(as[i].worker_id, wid);
            free(as);
            if (rc == 0 && !repeat)
                rc = kiln_err_set(err, KILN_ENOTFOUND, "worker_id", "worker \"%s\" has no live assignment "
                                  "for attempt %d of job %s", wid, job.attempt, job.id);
            goto out;
        }
        if (st == JOB_STATE_STARTING) {
            /* a job of one node has one assignment: this one, just marked started */
            int n = 1, started = 1;
            if (job.nodes > 1) {
                store_assign_t *as = NULL;
                rc = store_assign_list(tx->c, job.id, job.attempt, &as, &n, err);
                if (rc)
                    goto out;
                started = 0;
                for (int i = 0; i < n; i++)
                    started += as[i].started && !as[i].released;
                free(as);
            }
            if (n > 0 && started == n) {
                snprintf(reason, sizeof(reason), "all %d rank(s) started", job.world_size);
                rc = svc_job_set_state(tx, &job, JOB_STATE_RUNNING, job.attempt, STORE_TR_STARTED,
                                       reason, err);
                if (rc)
                    goto out;
            }
        }
    } else {
        /* Nothing runs for this worker's part: free its slots, fail the attempt. */
        rc = store_assign_release(tx->c, job.id, job.attempt, wid, err);
        if (rc)
            goto out;
        if (req->worker_shutdown) {
            /* The agent refused because it is shutting down: the attempt goes back to the
             * queue (a lost attempt, as when a worker dies), and the worker takes nothing new. */
            bool changed = false;
            rc = store_worker_set_draining(tx->c, wid, &changed, err);
            snprintf(reason, sizeof(reason), "worker %s is shutting down and did not start its ranks",
                     wid);
            if (rc == 0)
                rc = svc_job_lose_attempt(tx, &job, job.attempt, wid, reason, err);
        } else if (req->host_fault &&
                   (st == JOB_STATE_SCHEDULED || st == JOB_STATE_STARTING || st == JOB_STATE_RUNNING)) {
            /* Its host could not start the ranks (its sandbox, processes, ports), not the job's
             * spec or code: a lost attempt, re-queued while attempts are left. */
            kiln_text_fmt(reason, sizeof(reason), "worker %s could not start its ranks (a fault of that host, not of "
                          "the job): %s", wid, req->reason && *req->reason ? req->reason : "no reason given");
            rc = svc_job_lose_attempt(tx, &job, job.attempt, wid, reason, err);
        } else if (st == JOB_STATE_SCHEDULED || st == JOB_STATE_STARTING || st == JOB_STATE_RUNNING) {
            kiln_text_fmt(reason, sizeof(reason), "worker %s could not start its ranks: %s", wid,
                          req->reason && *req->reason ? req->reason : "no reason given");
            rc = store_assign_stop(tx->c, job.id, job.attempt, reason, NULL, err);
            if (rc == 0)
                rc = svc_job_set_state(tx, &job, JOB_STATE_FAILED, job.attempt, 0, reason, err);
        } else if (st == JOB_STATE_STOPPING) {
            rc = svc_job_finish_stopping(tx, &job, err);
        }
    }
out:
    *job_row = job;
    return rc;
}


/* A rank exit's checks before any database work: the worker (*wid), the rank, that kilnd
 * assigned the rank to the worker. */
static int exit_check(svc_t *s, const char *worker_id, const Kiln__RankExit *req, const char **wid, kiln_err_t *err)
{
    int rc = svc_agent_check_report(worker_id, req->worker_id, req->job_id, wid, err);
    if (rc)
        return rc;
    if (req->rank < 0)
        return kiln_err_set(err, KILN_EINVAL, "rank", "rank must be >= 0, got %d", req->rank);
    int rank = req->rank;
    return svc_agent_owns(s, *wid, req->job_id, req->attempt, &rank, 1, err);
}

/* A rank exit inside tx, with the job's row *job read FOR UPDATE (as status_in_tx). */
static int exit_in_tx(svc_tx_t *tx, const char *wid, const Kiln__RankExit *req, store_job_row_t *job_row,
                      bool *moved, kiln_err_t *err)
{
    store_job_row_t job = *job_row;
    char reason[4600];           /* a script's failure file: 1,024 characters of UTF-8, and the rank's place */
    int rc = 0;
    *moved = false;
    /* one statement: the exit, the assignment's release with its last rank, the attempt's counts */
    store_rank_exit_t rec;
    Kiln__RankExit ex = *req;
    ex.worker_id = (char *)wid;
    rc = store_rank_exit_record(tx->c, &ex, &rec, err);
    /* a step counted from matches is no step to compare the pause with */
    bool steps_known = rec.pause_at > 0 && !spec_metric_steps_counted(rec.metric_defs);
    json_decref(rec.metric_defs);
    if (rc)
        return rc;
    if (rec.released)
        tx->wake_sched = true;
    bool failed = req->exit_code != 0 || req->signal != 0;
    char ended[128];
    rank_end_describe(req->exit_code, req->signal, ended, sizeof(ended));
    log_info("job %s: rank %d (attempt %d) on worker %s %s%s%s", job.id, req->rank, req->attempt, wid, ended,
             failed && !req->signal && req->reason && *req->reason ? ": " : "",
             failed && !req->signal && req->reason ? req->reason : "");
    if (!rec.inserted || req->attempt != job.attempt)
        return 0;   /* a repeat, or an old attempt: nothing changes */
    svc_job_state_t st = svc_state_parse(job.state);
    /* svc_job_set_state keeps *job current; losing the attempt or finishing a stop may not */
    *moved = failed || st == JOB_STATE_STOPPING;

    if (failed && req->worker_shutdown && (st == JOB_STATE_STARTING || st == JOB_STATE_RUNNING)) {
        /* Its agent stopped the rank to shut down (preemption, maintenance): the attempt is lost,
         * as when a worker dies, and the worker takes nothing new. */
        bool changed = false; /* the scheduler reads capacity afresh on its next pass */
        rc = store_worker_set_draining(tx->c, wid, &changed, err);
        snprintf(reason, sizeof(reason), "worker %s is shutting down; it stopped rank %d", wid,
                 req->rank);
        if (rc == 0)
            rc = svc_job_lose_attempt(tx, &job, job.attempt, wid, reason, err);
    } else if (st == JOB_STATE_STARTING || st == JOB_STATE_RUNNING) {
        if (failed) {
            /* "rank 1 on worker w-.. was killed by signal 9 (Killed)", "... exited with code 1
             * (...): <the rank's last stderr line>" */
            char how[128];
            rank_end_describe(req->exit_code, req->signal, how, sizeof(how));
            const char *said = req->reason && *req->reason ? req->reason : "";
            if (req->signal != 0 && strstr(how, said))
                said = ""; /* the signal's name, already in how; anything else (out of memory, a
                            * script's failure file) is the agent's to say */
            kiln_text_fmt(reason, sizeof(reason), "rank %d on worker %s %s%s%s", req->rank, wid, how, *said ? ": " : "",
                          said);
            if (rank_end_of(req->exit_code, req->signal) == RANK_END_BAD_INPUT) {
                /* The spec or its data cannot work: another attempt would fail the same way. */
                rc = store_assign_stop(tx->c, job.id, job.attempt, reason, NULL, err);
                /* A rank that exited had started, even if the agent's "started" report is late. */
                if (rc == 0)
                    rc = svc_job_set_state(tx, &job, JOB_STATE_FAILED, job.attempt, STORE_TR_STARTED,
                                           reason, err);
            } else {
                /* A rank died (a signal, a crash, a peer or device failure, the watchdog): the
                 * attempt is lost as when a worker dies, and the next resumes from the newest
                 * checkpoint; with no attempt left the job fails with this reason. */
                rc = svc_job_lose_attempt(tx, &job, job.attempt, wid, reason, err);
            }
        } else {
            int64_t pause_at = rec.pause_at, max_steps = rec.max_steps;
            if (rec.n_ok >= job.world_size && pause_at > 0 && pause_at < max_steps && steps_known &&
                rec.progress_step > pause_at) {
                /* a script that trained on past the step it was told to pause at: what it reported
                 * is not its result at the pause (a hyperband rung), so it is not paused */
                snprintf(reason, sizeof(reason), "reported step %lld, past stopping.max_steps %lld: a script must "
                         "stop at KILN_PAUSE_AT_STEP (write its checkpoint, report that step's metrics and exit 0 "
                         "on every rank) to pause there", (long long)rec.progress_step, (long long)pause_at);
                rc = svc_job_set_state(tx, &job, JOB_STATE_FAILED, job.attempt, STORE_TR_STARTED, reason, err);
            } else if (rec.n_ok >= job.world_size && pause_at > 0 && pause_at < max_steps && steps_known &&
                       rec.progress_step > 0 && rec.progress_step < pause_at - 1) {
                /* a script that ended before the step it was told to pause at: what it reported is
                 * not its result at the pause either (a hyperband rung would rank a shorter run's
                 * value), so it is not paused. A script that numbers its steps from 0 ends its
                 * pause_at steps at step pause_at - 1: that is its pause. (One that reported no
                 * step at all is taken as paused: a tuning job then ends at its first rung naming
                 * the metric it never saw.) */
                snprintf(reason, sizeof(reason), "all %d rank(s) exited with code 0 at step %lld, before stopping.max_steps "
                         "%lld: a script must train to KILN_PAUSE_AT_STEP (then write its checkpoint, report that "
                         "step's metrics and exit 0 on every rank) to pause there", job.world_size,
                         (long long)rec.progress_step, (long long)pause_at);
                rc = svc_job_set_state(tx, &job, JOB_STATE_FAILED, job.attempt, STORE_TR_STARTED, reason, err);
            } else if (rec.n_ok >= job.world_size && pause_at > 0 && pause_at < max_steps) {
                /* stopped at stopping.max_steps with a checkpoint: paused, its slots free (a
                 * script whose metric_definitions count their steps is taken at its word) */
                snprintf(reason, sizeof(reason), "paused at step %lld of %lld (stopping.max_steps): all %d rank(s) "
                         "exited with code 0, checkpoint kept", (long long)pause_at, (long long)max_steps,
                         job.world_size);
                rc = svc_job_set_state(tx, &job, JOB_STATE_PAUSED, job.attempt, STORE_TR_STARTED, reason, err);
            } else if (rec.n_ok >= job.world_size) {
                snprintf(reason, sizeof(reason), "all %d rank(s) exited with code 0", job.world_size);
                rc = svc_job_set_state(tx, &job, JOB_STATE_COMPLETED, job.attempt, STORE_TR_STARTED,
                                       reason, err);
            }
        }
    } else if (st == JOB_STATE_STOPPING) {
        rc = svc_job_finish_stopping(tx, &job, err);
    }
    *job_row = job;
    return rc;
}


/* A start report (st) or a rank exit (ex) in its own transaction: ReportRankStatus and
 * ReportRankExit, and a batch's reports when they cannot share one. */
static int report_alone(svc_t *s, const char *worker_id, const Kiln__RankStatus *st, const Kiln__RankExit *ex,
                        kiln_err_t *err)
{
    svc_tx_t tx;
    store_job_row_t job;
    const char *wid = NULL;
    bool moved = false;
    int rc = st ? status_check(s, worker_id, st, &wid, err) : exit_check(s, worker_id, ex, &wid, err);
    if (rc)
        return rc;   /* refused before any database work */
    rc = svc_tx_begin(s, &tx, err);
    if (rc)
        return rc;
    rc = store_job_row(tx.c, st ? st->job_id : ex->job_id, true, &job, err);
    if (rc == 0)
        rc = st ? status_in_tx(&tx, wid, st, &job, &moved, err) : exit_in_tx(&tx, wid, ex, &job, &moved, err);
    if (rc) {
        svc_tx_abort(&tx);
        return rc;
    }
    return svc_tx_commit(&tx, err);
}

int svc_agent_rank_status(svc_t *s, const char *worker_id, const Kiln__RankStatus *req, kiln_err_t *err)
{
    return report_alone(s, worker_id, req, NULL, err);
}

int svc_agent_rank_exit(svc_t *s, const char *worker_id, const Kiln__RankExit *req, kiln_err_t *err)
{
    return report_alone(s, worker_id, NULL, req, err);
}

/* ---- several reports in one call (ReportBatch) ---------------------------------------------- */

static void report_result(arena_t *arena, Kiln__ReportResult *r, int rc, const kiln_err_t *err)
{
    r->code = rc ? kiln_status_grpc(rc) : 0;
    r->message = rc ? arena_strdup(arena, err->message) : (char *)"";
}

static int job_id_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The batch's reports i in at[0..n), all checked, in one transaction: every job's row locked
 * first (one statement, in id order, as a heartbeat's deliveries lock them), then each report in
 * order on its job's row, one commit. Nonzero (nothing written) when any report fails: the
 * caller handles them one at a time instead. */
static int batch_in_one_tx(svc_t *s, const char *wid, Kiln__Report *const *reps, const int *at, int n,
                           kiln_err_t *err)
{
    const char **ids = calloc((size_t)n, sizeof(*ids));
    store_job_row_t *rows = calloc((size_t)n, sizeof(*rows));
    double *age = calloc((size_t)n, sizeof(*age));
    bool *found = calloc((size_t)n, sizeof(*found)), *stale = calloc((size_t)n, sizeof(*stale));
    int nids = 0, rc = 0;
    svc_tx_t tx;
    bool began = false;
    if (!ids || !rows || !age || !found || !stale) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto done;
    }
    for (int k = 0; k < n; k++) {
        const Kiln__Report *r = reps[at[k]];
        ids[nids++] = r->kind_case == KILN__REPORT__KIND_STATUS ? r->status->job_id : r->exit->job_id;
    }
    qsort(ids, (size_t)nids, sizeof(*ids), job_id_cmp);
    int m = 0;
    for (int k = 0; k < nids; k++)
        if (m == 0 || strcmp(ids[m - 1], ids[k]) != 0)
            ids[m++] = ids[k];
    nids = m;
    rc = svc_tx_begin(s, &tx, err);
    if (rc)
        goto done;
    began = true;
    rc = store_job_rows_lock(tx.c, ids, nids, rows, age, found, err);
    for (int k = 0; rc == 0 && k < n; k++) {
        const Kiln__Report *r = reps[at[k]];
        const char *job_id = r->kind_case == KILN__REPORT__KIND_STATUS ? r->status->job_id : r->exit->job_id;
        const char **hit = bsearch(&job_id, ids, (size_t)nids, sizeof(*ids), job_id_cmp);
        int j = (int)(hit - ids);
        if (!found[j]) {
            rc = kiln_err_set(err, KILN_ENOTFOUND, "job_id", "job \"%.80s\" not found", job_id);
            break;
        }
        if (stale[j])
            rc = store_job_row(tx.c, job_id, true, &rows[j], err);
        bool moved = false;
        if (rc == 0 && r->kind_case == KILN__REPORT__KIND_STATUS)
            rc = status_in_tx(&tx, wid, r->status, &rows[j], &moved, err);
        else if (rc == 0)
            rc = exit_in_tx(&tx, wid, r->exit, &rows[j], &moved, err);
        stale[j] = moved;
    }
    if (rc == 0) {
        began = false;
        rc = svc_tx_commit(&tx, err);
    }
done:
    if (began)
        svc_tx_abort(&tx);
    free(ids);
    free(rows);
    free(age);
    free(found);
    free(stale);
    return rc;
}

int svc_agent_report_batch(svc_t *s, const char *worker_id, const Kiln__ReportBatchRequest *req, arena_t *arena,
                           Kiln__ReportBatchReply *out, kiln_err_t *err)
{
    const char *wid = NULL;
    int rc = agent_worker(worker_id, req->worker_id, &wid, err);
    if (rc)
        return rc;
    if (req->n_reports > SVC_REPORT_BATCH_MAX) {
        kiln_err_set(err, KILN_EINVAL, "reports", "a report batch holds at most %d reports, got %zu",
                     SVC_REPORT_BATCH_MAX, req->n_reports);
        kiln_err_hint(err, "send the rest in another batch");
        return KILN_EINVAL;
    }
    size_t bytes = protobuf_c_message_get_packed_size(&req->base);
    if (bytes > SVC_REPORT_BATCH_BYTES) {
        kiln_err_set(err, KILN_EINVAL, "reports", "a report batch is at most %d bytes, got %zu",
                     SVC_REPORT_BATCH_BYTES, bytes);
        kiln_err_hint(err, "send fewer reports in one batch");
        return KILN_EINVAL;
    }
    int n = (int)req->n_reports;
    out->n_results = req->n_reports;
    out->results = arena_alloc(arena, sizeof(*out->results) * (size_t)(n ? n : 1));
    Kiln__ReportResult *res = arena_alloc(arena, sizeof(*res) * (size_t)(n ? n : 1));
    /* each report as its own call would have it: the batch's worker id unless it names one */
    Kiln__Report **reps = arena_alloc(arena, sizeof(*reps) * (size_t)(n ? n : 1));
    int *at = arena_alloc(arena, sizeof(*at) * (size_t)(n ? n : 1));
    if (!out->results || !res || !reps || !at)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    int nat = 0, stop = n; /* reports from stop on are not handled: one before them was not */
    for (int i = 0; i < n; i++) {
        kiln__report_result__init(&res[i]);
        out->results[i] = &res[i];
        const Kiln__Report *r = req->reports[i];
        reps[i] = arena_alloc(arena, sizeof(Kiln__Report));
        Kiln__RankStatus *st = arena_alloc(arena, sizeof(*st));
        Kiln__RankExit *ex = arena_alloc(arena, sizeof(*ex));
        if (!reps[i] || !st || !ex)
            return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        *reps[i] = *r;
        kiln_err_t e;
        const char *w = NULL;
        if (i >= stop)
            continue;
        if (r->kind_case == KILN__REPORT__KIND_STATUS && r->status) {
            *st = *r->status;
            if (!st->worker_id || !*st->worker_id)
                st->worker_id = (char *)wid;
            reps[i]->status = st;
            rc = status_check(s, wid, st, &w, &e);
        } else if (r->kind_case == KILN__REPORT__KIND_EXIT && r->exit) {
            *ex = *r->exit;
            if (!ex->worker_id || !*ex->worker_id)
                ex->worker_id = (char *)wid;
            reps[i]->exit = ex;
            rc = exit_check(s, wid, ex, &w, &e);
        } else {
            rc = kiln_err_set(&e, KILN_EINVAL, "reports", "report %d of the batch carries neither a status "
                              "nor an exit", i);
        }
        report_result(arena, &res[i], rc, &e);
        if (rc && kiln_grpc_retryable(res[i].code))
            stop = i + 1;
        else if (rc == 0)
            at[nat++] = i;
    }
    /* One transaction for all; should any report fail in it, each on its own, in order, up to the
     * first that could not be handled (every report is a harmless repeat of itself). */
    kiln_err_t e;
    if (nat > 0 && batch_in_one_tx(s, wid, reps, at, nat, &e) != 0) {
        log_info("worker %s: a batch of %d report(s) is handled one report at a time: %s", wid, nat, e.message);
        for (int k = 0; k < nat && at[k] < stop; k++) {
            int i = at[k];
            bool is_status = reps[i]->kind_case == KILN__REPORT__KIND_STATUS;
            rc = report_alone(s, wid, is_status ? reps[i]->status : NULL, is_status ? NULL : reps[i]->exit, &e);
            report_result(arena, &res[i], rc, &e);
            if (rc && kiln_grpc_retryable(res[i].code))
                stop = i + 1;
        }
    }
    for (int i = stop; i < n; i++) {
        res[i].code = 14;
        res[i].message = arena_sprintf(arena, "not handled: report %d of this batch failed first; send it again",
                                       stop - 1);
    }
    return 0;
}

/* ---- registration and heartbeats ------------------------------------------------------------ */

static void new_worker_id(char *out, size_t n)
{
    uint8_t b[8];
    if (getrandom(b, sizeof(b), 0) != (ssize_t)sizeof(b)) {
        uint64_t t = (uint64_t)kiln_now_us() ^ (uint64_t)kiln_mono_us() << 17;
        memcpy(b, &t, sizeof(b));
    }
    snprintf(out, n, "w-%02x%02x%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3], b[4], b[5],
             b[6], b[7]);
}

/* The data roots an agent reports, as a JSON array of absolute paths (at most STORE_MAX_ROOTS). */
static int roots_json(const Kiln__RegisterRequest *req, char **out, kiln_err_t *err)
{
    *out = NULL;
    if (req->n_data_roots > STORE_MAX_ROOTS)
        return kiln_err_set(err, KILN_EINVAL, "data_roots", "at most %d data roots, got %zu", STORE_MAX_ROOTS,
                            req->n_data_roots);
    json_t *roots = json_array();
    for (size_t i = 0; i < req->n_data_roots; i++) {
        const char *r = req->data_roots[i];
        /* json_string refuses text that is not UTF-8 */
        json_t *js = r && r[0] == '/' && strlen(r) <= 1000 ? json_string(r) : NULL;
        if (!js) {
            json_decref(roots);
            return kiln_err_set(err, KILN_EINVAL, "data_roots", "data root %zu is not an absolute path", i);
        }
        json_array_append_new(roots, js);
    }
    *out = json_dumps(roots, JSON_COMPACT);
    json_decref(roots);
    return *out ? 0 : kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
}

/* Checks what a registration declares; fills the worker id (the one asked for, or a new one),
 * the slot type and the data roots (heap JSON, *roots) and GPUs (heap JSON, *gpus). */
static int register_check(const Kiln__RegisterRequest *req, char id[STORE_WORKER_ID_LEN], const char **slot_type,
                          char **roots, char **gpus, kiln_err_t *err)
{
    *roots = *gpus = NULL;
    *slot_type = req->slot_type && *req->slot_type ? req->slot_type : "cpu";
    if (strcmp(*slot_type, "cpu") != 0 && strcmp(*slot_type, "gpu") != 0)
        return kiln_err_set(err, KILN_EINVAL, "slot_type", "slot type must be \"cpu\" or \"gpu\", got \"%.32s\"",
                            *slot_type);
    if (req->slots < 0 || req->slots > 4096)
        return kiln_err_set(err, KILN_EINVAL, "slots", "slots must be between 0 and 4096, got %d", req->slots);
    int crc = 0;
    if ((crc = svc_check_line("worker_id", req->worker_id, 63, err)) ||
        (crc = svc_check_line("hostname", req->hostname, 255, err)) ||
        (crc = svc_check_line("address", req->address, 255, err)) ||
        (crc = svc_check_line("version", req->version, 128, err)) ||
        (crc = req->n_gpus > 64 ? kiln_err_set(err, KILN_EINVAL, "gpus", "a worker may list at most 64 GPUs, "
                                               "got %zu", req->n_gpus) : 0))
        return crc;
    for (size_t i = 0; i < req->n_gpus; i++)
        if ((crc = svc_check_line("gpus", req->gpus[i], 256, err)))
            return crc;
    if (req->worker_id && *req->worker_id) {
        /* 63 characters (checked above) may still be more bytes than a worker id holds */
        if (strlen(req->worker_id) >= STORE_WORKER_ID_LEN)
            return kiln_err_set(err, KILN_EINVAL, "worker_id", "worker id is longer than %d bytes",
                                STORE_WORKER_ID_LEN - 1);
        kiln_strlcpy(id, req->worker_id, STORE_WORKER_ID_LEN);
    } else {
        new_worker_id(id, STORE_WORKER_ID_LEN);
    }
    int rc = roots_json(req, roots, err);
    if (rc)
        return rc;
    json_t *g = json_array();
    for (size_t i = 0; i < req->n_gpus; i++)
        json_array_append_new(g, json_string(req->gpus[i] ? req->gpus[i] : ""));
    *gpus = json_dumps(g, JSON_COMPACT);
    json_decref(g);
    return 0;
}

static int join_refused(const svc_join_t *join, const char *from, kiln_err_t *err)
{
    log_warn("auth: refused a worker registration from %.64s: %s", from, join->why);
    kiln_err_set(err, KILN_EUNAUTH, NULL, "%s", join->why);
    kiln_err_hint(err, "start kiln-agent with --join-token-file naming a file that holds a join token: kilnd's "
                       "--join-token-file, or one from `kiln join-tokens create`");
    return KILN_EUNAUTH;
}

/* Whether the worker id or the certificate is banned. */
static int register_banned(store_conn_t *c, const char *id, const char *cert, const char *from, kiln_err_t *err)
{
    int64_t ban = 0;
    bool by_cert = false;
    int rc = store_ban_find(c, id, cert, &ban, &by_cert, err);
    if (rc)
        return rc;
    if (ban) {
        if (by_cert)
            kiln_err_set(err, KILN_EPERM, NULL, "this agent's client certificate is banned (ban %lld)", (long long)ban);
        else
            kiln_err_set(err, KILN_EPERM, "worker_id", "worker %s is banned (ban %lld)", id, (long long)ban);
        kiln_err_hint(err, "a cluster admin lists bans with `kiln workers bans` and lifts one with `kiln workers "
                           "unban %lld`", (long long)ban);
        log_warn("worker %s: refused a registration from %.64s: banned (ban %lld)", id, from, (long long)ban);
        return KILN_EPERM;
    }
    return 0;
}

/* With agent_distinct_certs: whether another live worker is bound to the certificate. Inside the
 * registration's transaction (the check holds the certificate's lock until it ends). */
static int register_distinct(svc_t *s, store_conn_t *c, const char *id, const char *cert, const char *from,
                             kiln_err_t *err)
{
    if (!s->cfg.agent_distinct_certs || !cert)
        return 0;
    char holder[STORE_WORKER_ID_LEN];
    int rc = store_worker_cert_holder(c, cert, id, holder, sizeof(holder), err);
    if (rc == 0 && holder[0]) {
        kiln_err_set(err, KILN_EPERM, NULL, "the client certificate (SHA-256 %.16s...) is bound to worker %s, which "
                     "is alive: each worker needs a certificate of its own", cert, holder);
        kiln_err_hint(err, "give this agent its own certificate, or wait until %s is declared dead (or a cluster "
                           "admin removes it: kiln workers remove %s)", holder, holder);
        log_warn("worker %s: refused a registration from %.64s with worker %s's certificate", id, from, holder);
        return KILN_EPERM;
    }
    return rc;
}

/* A registration: vouched (kilnd's own caller: no join token, no limit) or from a peer. */
static int agent_register(svc_t *s, const Kiln__RegisterRequest *req, const svc_agent_peer_t *peer, bool vouched,
                          arena_t *arena, Kiln__RegisterResponse *out, kiln_err_t *err)
{
    char id[STORE_WORKER_ID_LEN];
    char *roots = NULL, *gpus_text = NULL;
    const char *slot_type = "cpu";
    const char *presented = peer->credential && *peer->credential ? peer->credential : NULL;
    const char *cert = peer->cert_sha256 && *peer->cert_sha256 ? peer->cert_sha256 : NULL;
    const char *from = peer->address ? peer->address : "";
    /* A worker registering again under its id, with its credential: neither rate-limited nor in
     * need of a join token (a single-use token has done its work). */
    bool claims = presented && req->worker_id && *req->worker_id && !s->cfg.auth_disabled;
    bool admitted = false, takeover = false, was_alive = false, pending = false;
    svc_join_t join = {.ok = true};
    store_conn_t *c = NULL;
    store_lost_t *lost = NULL;
    int nlost = 0;
    char credential[128] = "";
    int rc = 0;
    if (!vouched && !claims) {
        if ((rc = svc_register_admit(s, from, err)))
            return rc;
        admitted = true;
    }
    rc = store_conn_get(s->store, &c, err);
    if (rc)
        return rc;
    if (!vouched) {
        rc = svc_join_check(s, c, peer->join_token, &join, err);
        if (rc == 0 && !join.ok && !claims)
            rc = join_refused(&join, from, err);
        if (rc)
            goto out;
    }
    rc = register_check(req, id, &slot_type, &roots, &gpus_text, err);
    if (rc)
        goto out;
    const char *host = req->hostname ? req->hostname : "";
    if (!s->cfg.auth_disabled) {
        /* Taking over an existing worker's id needs that worker's credential and certificate:
         * without them, anyone holding a join token could fail a worker's jobs and rewrite its
         * address. */
        uint8_t hash[STORE_HASH_LEN];
        store_worker_claim_t claim;
        if (presented)
            svc_secret_hash(presented, hash);
        rc = store_worker_check_credential(c, id, presented ? hash : NULL, &claim, err);
        if (rc)
            goto out;
        if (claim.exists && claim.match) {
            takeover = true;
            if (strcmp(claim.cert_sha256, cert ? cert : "") != 0) {
                rc = kiln_err_set(err, KILN_EUNAUTH, NULL, "worker %s is bound to the client certificate it "
                                  "registered with (SHA-256 %.16s...); this registration presented %s%.16s%s", id,
                                  claim.cert_sha256[0] ? claim.cert_sha256 : "none", cert ? "another (SHA-256 " : "none",
                                  cert ? cert : "", cert ? "...)" : "");
                kiln_err_hint(err, "an agent with a new certificate registers as a new worker (without its old "
                                   "worker id)");
                log_warn("worker %s: refused a registration with its credential from another certificate (from "
                         "%.64s)", id, from);
                goto out;
            }
        } else {
            if (claims && !admitted && (rc = svc_register_admit(s, from, err)))
                goto out;
            if (!join.ok) {
                rc = join_refused(&join, from, err);
                goto out;
            }
            /* authenticated by its join token: now it may hear that it is banned */
            if ((rc = register_banned(c, id, cert, from, err)))
                goto out;
            if (claim.exists) {
                rc = kiln_err_set(err, KILN_EPERM, "worker_id", "worker \"%s\" is registered; registering again "
                                  "under its id needs its credential", id);
                kiln_err_hint(err, "an agent keeps its credential in <work dir>/agent-credential; without it, "
                                   "register without a worker id to get a new one");
                log_warn("worker %s: refused a registration that did not carry its credential (from host \"%.64s\", "
                         "%.64s)", id, host, from);
                goto out;
            }
        }
    }
    if ((takeover || s->cfg.auth_disabled) && (rc = register_banned(c, id, cert, from, err)))
        goto out;
    /* A fresh credential for every registration: the previous one stops working. (With
     * authentication off there is nothing to prove, and none is issued.) */
    uint8_t cred_hash[STORE_HASH_LEN];
    if (!s->cfg.auth_disabled)
        svc_secret_new("kiln_agent_", credential, sizeof(credential), cred_hash);
    store_worker_reg_t w = {.id = id, .hostname = host,
                            .address = req->address && *req->address ? req->address : host,
                            .slot_type = slot_type, .gpus_json = gpus_text ? gpus_text : "[]",
                            .version = req->version, .slots = req->slots, .cpu_cores = req->cpu_cores,
                            .data_roots_json = roots,
                            .credential_hash = s->cfg.auth_disabled ? NULL : cred_hash,
                            .join_token = takeover ? "" : join.id, .cert_sha256 = cert, .registered_from = from,
                            .pending = s->cfg.agent_approval};
    rc = store_begin(c, err);
    if (rc)
        goto out;
    rc = register_distinct(s, c, id, cert, from, err);
    if (rc == 0 && !vouched && !takeover && join.id[0] && strcmp(join.id, "file") != 0) {
        /* the check above read the token before this transaction: take the use now, atomically */
        bool consumed = false;
        rc = store_join_token_consume(c, join.id, &consumed, err);
        if (rc == 0 && !consumed) {
            snprintf(join.why, sizeof(join.why), "the join token %s was used up, expired or revoked", join.id);
            rc = join_refused(&join, from, err);
        }
    }
    if (rc == 0)
        rc = store_worker_upsert(c, &w, &was_alive, &pending, err);
    if (rc == 0)
        rc = store_commit(c, err);
    if (rc) {
        store_rollback(c);
        goto out;
    }
    /* A (re-)registration means a fresh agent: whatever it had been given and started is gone. */
    rc = store_assign_delivered_on(c, id, &lost, &nlost, err);
    if (rc)
        goto out;
    store_conn_put(s->store, c);
    c = NULL;
    log_info("worker %s (%s, %s) registered%s%s from %.64s: %d %s slot(s)%s%s", id, host, w.address,
             join.id[0] && !takeover ? " with join token " : "", takeover ? "" : join.id, from, req->slots, slot_type,
             was_alive ? " (it was alive: its agent restarted)" : "",
             pending ? "; it waits for approval (kiln workers approve)" : "");
    for (int i = 0; i < nlost; i++) {
        char why[512];
        kiln_err_t e2;
        snprintf(why, sizeof(why), "worker %s (%s) registered again: its agent restarted and its "
                 "ranks are gone", id, host);
        if (svc_job_lost(s, lost[i].job_id, lost[i].attempt, id, why, &e2))
            log_warn("worker %s: could not handle job %s: %s", id, lost[i].job_id, e2.message);
    }
    rc = store_conn_get(s->store, &c, err);
    if (rc == 0)
        rc = svc_cap_refresh(s, c, err);
    if (rc)
        goto out;
    svc_auth_invalidate(s); /* the worker's previous credential is gone */
    out->worker_id = svc_astr(arena, id);
    out->heartbeat_interval_ms = s->cfg.heartbeat_interval_ms;
    out->heartbeat_timeout_ms = s->cfg.heartbeat_timeout_ms;
    out->credential = svc_astr(arena, credential);
    svc_sched_wake(s);
out:
    if (c)
        store_conn_put(s->store, c);
    free(lost);
    free(gpus_text);
    free(roots);
    sodium_memzero(credential, sizeof(credential));
    return rc;
}

int svc_agent_register_as(svc_t *s, const Kiln__RegisterRequest *req, const svc_agent_peer_t *peer,
                          arena_t *arena, Kiln__RegisterResponse *out, kiln_err_t *err)
{
    return agent_register(s, req, peer, false, arena, out, err);
}

int svc_agent_register(svc_t *s, const Kiln__RegisterRequest *req, const char *presented_credential,
                       arena_t *arena, Kiln__RegisterResponse *out, kiln_err_t *err)
{
    svc_agent_peer_t peer = {.credential = presented_credential, .address = "kilnd"};
    return agent_register(s, req, &peer, true, arena, out, err);
}

/* The typed copies of what the agent needs from the normalised spec (threads, project, checkpoint
 * directory, metric definitions, the files the ranks read, a script job's fields), so that it
 * never parses the spec. The checkpoint directory is <checkpoint.path>/.kiln/<project>/<job id>,
 * the project's area (KILN_AREA_DIR), or <checkpoint.path>/<job id> for a job flat_dir marks (one
 * that had not ended when kilnd moved to project areas keeps the directory its checkpoints are in). */
static int assignment_typed(svc_t *s, const char *spec_json, const char *job_id, bool flat_dir, arena_t *arena,
                            Kiln__Assignment *msg, kiln_err_t *err)
{
    kiln_err_t e2;
    spec_t *sp = calloc(1, sizeof(*sp)); /* a spec is tens of KiB: not for the stack */
    if (!sp)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    json_t *sj = store_json_parse(spec_json);
    int prc = sj ? spec_parse(sj, sp, &e2) : kiln_err_set(&e2, KILN_EINVAL, NULL, "it is not JSON");
    json_decref(sj);
    if (prc != 0) {
        free(sp);
        /* the stored spec passed the same parser when it was submitted */
        kiln_err_set(err, KILN_EINTERNAL, NULL, "job %s: its stored spec no longer parses: %s", job_id, e2.message);
        return KILN_EINTERNAL;
    }
    msg->threads_per_rank = sp->res.threads_per_rank;
    msg->project = svc_astr(arena, sp->project);
    if (!sp->ckpt_path[0])
        msg->checkpoint_dir = svc_astr(arena, "");
    else if (flat_dir)
        msg->checkpoint_dir = arena_sprintf(arena, "%s/%s", sp->ckpt_path, job_id);
    else
        msg->checkpoint_dir = arena_sprintf(arena, "%s/" KILN_AREA_DIR "/%s/%s", sp->ckpt_path, sp->project, job_id);
    msg->n_metric_definitions = (size_t)sp->n_metric_defs;
    msg->metric_definitions = arena_alloc(arena, sizeof(*msg->metric_definitions) *
                                                     (size_t)KILN_MAX(sp->n_metric_defs, 1));
    for (int i = 0; i < sp->n_metric_defs; i++) {
        Kiln__MetricDefinition *d = arena_alloc(arena, sizeof(*d));
        kiln__metric_definition__init(d);
        d->name = svc_astr(arena, sp->metric_defs[i].name);
        d->regex = svc_astr(arena, sp->metric_defs[i].regex);
        msg->metric_definitions[i] = d;
    }
    svc_spec_path_t paths[SVC_SPEC_PATHS];
    int np = svc_spec_paths(sp, paths);
    msg->read_paths = arena_alloc(arena, sizeof(*msg->read_paths) * SVC_SPEC_PATHS);
    for (int i = 0; i < np; i++) {
        if (!paths[i].read)
            continue;
        Kiln__JobPath *jp = arena_alloc(arena, sizeof(*jp));
        kiln__job_path__init(jp);
        jp->field = svc_astr(arena, paths[i].field);
        jp->path = svc_astr(arena, paths[i].path);
        msg->read_paths[msg->n_read_paths++] = jp;
    }
    msg->init_from_job = svc_astr(arena, "");
    msg->init_from_sha256 = svc_astr(arena, "");
    const char *src = svc_init_from_job(sp->model.init_from);
    if (src) {
        /* What the agent checks the fetched model against. Should the model be gone (its job
         * deleted since), the fetch says so and the attempt fails with that reason. */
        char sha[KILN_SHA256_HEX] = "";
        int64_t size = 0;
        store_conn_t *c = NULL;
        if (store_conn_get(s->store, &c, &e2) == 0) {
            if (svc_artifact_model(c, src, &size, sha, &e2) != 0)
                log_warn("job %s: the model it starts from (job %s) is not available: %s", job_id, src, e2.message);
            store_conn_put(s->store, c);
        }
        msg->init_from_job = svc_astr(arena, src);
        msg->init_from_size = size;
        msg->init_from_sha256 = svc_astr(arena, sha);
    }
    svc_assignment_script(s, sp, arena, msg);
    if (!sp->ckpt_path[0])
        svc_assignment_checkpoints(s, job_id, arena, msg);
    spec_deinit(sp);
    free(sp);
    return 0;
}

/* The message for assignment a, delivered with its job's spec (row: the job's locked row). */
static int assignment_msg(svc_t *s, const store_assign_t *a, const store_job_row_t *row, const char *spec,
                          arena_t *arena, Kiln__Assignment *msg, kiln_err_t *err)
{
    kiln__assignment__init(msg);
    int rc = assignment_typed(s, spec, a->job_id, row->ckpt_flat_dir, arena, msg, err);
    if (rc)
        return rc;
    msg->job_id = svc_astr(arena, a->job_id);
    msg->attempt = a->attempt;
    msg->spec_json = svc_astr(arena, spec);
    msg->world_size = a->world_size;
    msg->n_ranks = (size_t)a->nranks;
    msg->ranks = arena_alloc(arena, sizeof(int32_t) * (size_t)KILN_MAX(a->nranks, 1));
    for (int i = 0; i < a->nranks; i++)
        msg->ranks[i] = a->ranks[i];
    msg->node_rank = a->node_rank;
    msg->nodes = a->nodes;
    msg->master_addr = svc_astr(arena, a->master_addr);
    msg->master_port = a->master_port;
    msg->resume_from = svc_astr(arena, "");
    /* a tuning trial promoted under --tune-promoted-restart trains that attempt from step 0 */
    msg->fresh_start = row->fresh_attempt == a->attempt;
    log_info("job %s: attempt %d assignment (ranks %d..%d of %d) delivered to worker %s", a->job_id,
             a->attempt, a->nranks ? a->ranks[0] : 0, a->nranks ? a->ranks[a->nranks - 1] : 0,
             a->world_size, a->worker_id);
    return 0;
}

/* Delivers a worker's undelivered assignments a[0..n) in one transaction: locks their jobs' rows
 * one by one in id order (as a pass locks its jobs; each lock and state change a prepared one-row
 * statement), releases those whose attempt moved on (stopped, failed, restarted: nothing to
 * start), marks the others delivered in one statement and moves their jobs SCHEDULED -> STARTING.
 * One that a heartbeat of the same worker delivered meanwhile is left out. Appends a message to
 * out->assignments for each delivered one. */
static int deliver_all(svc_t *s, const store_assign_t *a, int n, arena_t *arena, Kiln__HeartbeatResponse *out,
                       kiln_err_t *err)
{
    svc_tx_t tx;
    int *order = calloc((size_t)n, sizeof(*order));
    store_job_row_t *row = calloc((size_t)n, sizeof(*row));
    int64_t *aid = calloc((size_t)n, sizeof(*aid));
    int *want = calloc((size_t)n, sizeof(*want));
    char **spec = calloc((size_t)n, sizeof(*spec));
    int rc = 0, nwant = 0;
    if (!order || !row || !aid || !want || !spec) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) { /* by job id (a worker holds a few assignments: insertion sort) */
        int k = i;
        while (k > 0 && strcmp(a[order[k - 1]].job_id, a[i].job_id) > 0) {
            order[k] = order[k - 1];
            k--;
        }
        order[k] = i;
    }
    rc = svc_tx_begin(s, &tx, err);
    if (rc)
        goto out;
    for (int k = 0; rc == 0 && k < n; k++) {
        int i = order[k];
        bool again = k > 0 && strcmp(a[order[k - 1]].job_id, a[i].job_id) == 0;
        if (again) /* locked already (and moved, if it was to move) */
            row[i] = row[order[k - 1]];
        else if ((rc = store_job_row(tx.c, a[i].job_id, true, &row[i], err)) == KILN_ENOTFOUND) {
            rc = 0; /* deleted: nothing to start */
            continue;
        }
        if (rc)
            break;
        svc_job_state_t st = svc_state_parse(row[i].state);
        if (row[i].attempt != a[i].attempt || (st != JOB_STATE_SCHEDULED && st != JOB_STATE_STARTING)) {
            rc = store_assign_release(tx.c, a[i].job_id, a[i].attempt, a[i].worker_id, err);
            continue;
        }
        aid[nwant] = a[i].id;
        want[nwant++] = i;
    }
    if (rc == 0)
        rc = store_assign_deliver_many(tx.c, aid, nwant, spec, err);
    for (int k = 0; rc == 0 && k < nwant; k++) {
        int i = want[k];
        if (!spec[k] || svc_state_parse(row[i].state) != JOB_STATE_SCHEDULED)
            continue;
        char reason[256];
        snprintf(reason, sizeof(reason), "assignment delivered to worker %s", a[i].worker_id);
        rc = svc_job_set_state(&tx, &row[i], JOB_STATE_STARTING, row[i].attempt, 0, reason, err);
        for (int m = k + 1; rc == 0 && m < nwant; m++) /* another part of the same job: moved now */
            if (strcmp(a[want[m]].job_id, a[i].job_id) == 0)
                row[want[m]] = row[i];
    }
    if (rc) {
        svc_tx_abort(&tx);
        goto out;
    }
    rc = svc_tx_commit(&tx, err);
    if (rc)
        goto out;
    out->assignments = arena_alloc(arena, sizeof(Kiln__Assignment *) * (size_t)KILN_MAX(nwant, 1));
    for (int k = 0; rc == 0 && k < nwant; k++) {
        if (!spec[k])
            continue;
        Kiln__Assignment *m = arena_alloc(arena, sizeof(*m));
        rc = assignment_msg(s, &a[want[k]], &row[want[k]], spec[k], arena, m, err);
        if (rc == 0)
            out->assignments[out->n_assignments++] = m;
    }
out:
    for (int k = 0; spec && k < n; k++)
        free(spec[k]);
    free(order);
    free(row);
    free(aid);
    free(want);
    free(spec);
    return rc;
}

static void finish_if_stopping(svc_t *s, const char *job_id, int attempt)
{
    svc_tx_t tx;
    store_job_row_t job;
    kiln_err_t err;
    if (svc_tx_begin(s, &tx, &err))
        return;
    if (store_job_row(tx.c, job_id, true, &job, &err) == 0 && job.attempt == attempt
        && svc_job_finish_stopping(&tx, &job, &err) == 0) {
        tx.wake_sched = true;
        svc_tx_commit(&tx, &err);
        return;
    }
    svc_tx_abort(&tx);
}

/* Whether a stale stop order for (worker, job, attempt) is due: never sent, or sent longer ago
 * than the grace period (by then the agent has had time to SIGKILL). Records the send. */
static bool stale_due(svc_t *s, const char *wid, const char *job_id, int attempt)
{
    char key[sizeof(s->stale_sent[0].key)];
    snprintf(key, sizeof(key), "%s|%s|%d", wid, job_id, attempt);
    int64_t now = kiln_mono_us(), period = (int64_t)s->cfg.stop_grace_ms * 1000;
    bool due = true;
    pthread_mutex_lock(&s->stale_mu);
    int slot = -1, oldest = 0;
    for (int i = 0; i < SVC_STALE_SLOTS; i++) {
        if (strcmp(s->stale_sent[i].key, key) == 0) {
            slot = i;
            break;
        }
        if (s->stale_sent[i].at_us < s->stale_sent[oldest].at_us)
            oldest = i;
    }
    if (slot >= 0 && now - s->stale_sent[slot].at_us < period)
        due = false;
    if (due) {
        if (slot < 0) {
            slot = oldest;
            kiln_strlcpy(s->stale_sent[slot].key, key, sizeof(s->stale_sent[slot].key));
        }
        s->stale_sent[slot].at_us = now;
    }
    pthread_mutex_unlock(&s->stale_mu);
    return due;
}

static Kiln__StopOrder *stop_msg(svc_t *s, arena_t *arena, const store_stop_order_t *o)
{
    Kiln__StopOrder *m = arena_alloc(arena, sizeof(*m));
    kiln__stop_order__init(m);
    m->job_id = svc_astr(arena, o->job_id);
    m->attempt = o->attempt;
    m->reason = svc_astr(arena, o->reason[0] ? o->reason : "stop requested");
    /* the job's own stopping.grace_period_s, else kilnd's --stop-grace-ms */
    m->grace_ms = o->grace_s > 0 ? o->grace_s * 1000 : s->cfg.stop_grace_ms;
    return m;
}

int svc_agent_heartbeat(svc_t *s, const char *worker_id, const Kiln__HeartbeatRequest *req,
                        arena_t *arena, Kiln__HeartbeatResponse *out, kiln_err_t *err)
{
    const char *wid = NULL;
    int rc = agent_worker(worker_id, req->worker_id, &wid, err);
    if (rc)
        return rc;
    store_conn_t *c = NULL;
    store_stop_order_t *stale = NULL, *reaped = NULL, *stops = NULL;
    store_assign_t *und = NULL;
    int nstale = 0, nreaped = 0, nstops = 0, nund = 0;
    kiln_err_t e2;
    rc = store_conn_get(s->store, &c, err);
    if (rc)
        return rc;
    bool began_draining = false, pending = false;
    rc = store_worker_touch(c, wid, req->draining, &began_draining, &pending, &e2);
    if (rc == 0 && began_draining) {
        log_info("worker %s is shutting down: no new placements on it", wid);
        if (svc_cap_refresh(s, c, &e2))
            log_warn("worker %s: could not refresh capacity: %s", wid, e2.message);
    }
    if (rc == KILN_ENOTFOUND || rc == KILN_ESTATE) {
        out->reregister = true;
        store_conn_put(s->store, c);
        log_info("worker %s: %s; asked to register again", wid, e2.message);
        return 0;
    }
    if (rc) {
        *err = e2;
        goto out;
    }
    if (pending) {
        /* registered, but trusted with nothing yet: no work, no stop orders to act on */
        out->waiting_for_approval = true;
        out->message = arena_sprintf(arena, "worker %s is waiting for approval: a cluster admin runs `kiln workers "
                                     "approve %s` (it gets no work until then)", wid, wid);
        goto out;
    }

    /* The distinct (job, attempt) pairs the agent says it runs. */
    size_t nr = req->n_running;
    const char **ids = arena_alloc(arena, sizeof(char *) * (nr + 1));
    int *atts = arena_alloc(arena, sizeof(int) * (nr + 1));
    int np = 0;
    for (size_t i = 0; i < nr; i++) {
        const Kiln__RunningRank *rr = req->running[i];
        if (!rr || !rr->job_id)
            continue;
        bool dup = false;
        for (int k = 0; k < np && !dup; k++)
            dup = atts[k] == rr->attempt && strcmp(ids[k], rr->job_id) == 0;
        if (!dup) {
            ids[np] = rr->job_id;
            atts[np] = rr->attempt;
            np++;
        }
    }
    rc = store_assign_stale(c, wid, ids, atts, np, &stale, &nstale, err);
    /* After the grace period plus a few heartbeats, a stopped assignment whose ranks are no longer
     * reported is released; one whose ranks still run gets its stop order again (the reply that
     * carried it may have been lost). */
    int patience_ms = s->cfg.stop_grace_ms + 3 * s->cfg.heartbeat_interval_ms;
    if (rc == 0)
        rc = store_assign_reap(c, wid, ids, atts, np, patience_ms, &reaped, &nreaped, err);
    if (rc == 0)
        rc = store_assign_take_stops(c, wid, patience_ms, &stops, &nstops, err);
    int nredo = 0;
    if (rc == 0)
        rc = store_assign_redeliver(c, wid, ids, atts, np,
                                    KILN_MAX(1000, 5 * s->cfg.heartbeat_interval_ms), &nredo, err);
    if (rc == 0)
        rc = store_assign_undelivered(c, wid, &und, &nund, err);
    store_conn_put(s->store, c);
    c = NULL;
    if (rc)
        goto out;

    for (int i = 0; i < nreaped; i++)
        finish_if_stopping(s, reaped[i].job_id, reaped[i].attempt);

    if (nund > 0 && (rc = deliver_all(s, und, nund, arena, out, err)))
        goto out;
    if (nstale + nstops > 0) {
        out->stops = arena_alloc(arena, sizeof(Kiln__StopOrder *) * (size_t)(nstale + nstops));
        for (int i = 0; i < nstops; i++)
            out->stops[out->n_stops++] = stop_msg(s, arena, &stops[i]);
        for (int i = 0; i < nstale; i++) {
            if (!stale_due(s, wid, stale[i].job_id, stale[i].attempt))
                continue;
            snprintf(stale[i].reason, sizeof(stale[i].reason),
                     "attempt %d of job %s is not active on this worker", stale[i].attempt,
                     stale[i].job_id);
            out->stops[out->n_stops++] = stop_msg(s, arena, &stale[i]);
        }
        for (size_t i = 0; i < out->n_stops; i++)
            log_info("job %s: stop order for attempt %d sent to worker %s: %s", out->stops[i]->job_id,
                     out->stops[i]->attempt, wid, out->stops[i]->reason);
    }
out:
    if (c)
        store_conn_put(s->store, c);
    free(stale);
    free(reaped);
    free(stops);
    free(und);
    return rc;
}
