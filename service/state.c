/* state.c - the job state machine: state names, the table of legal transitions, and the one
 * function that changes a job's state (svc_job_set_state), which checks the transition, writes
 * the event row and logs "from -> to". Also the two shared endings: a STOPPING job whose ranks
 * are all gone becomes STOPPED, and a job that lost an attempt (a worker died, or a rank) restarts
 * or fails.
 *
 *   QUEUED -> SCHEDULED -> STARTING -> RUNNING -> COMPLETED | FAILED
 *   any non-terminal -> STOPPING (running) or STOPPED (not started) on a stop request
 *   SCHEDULED | STARTING | RUNNING -> RESTARTING (a worker or a rank was lost, attempts left)
 *                                    -> SCHEDULED
 *   STARTING | RUNNING -> PAUSED (every rank exited 0 at stopping.max_steps, below max_steps)
 *                      -> RESTARTING (resumed) | COMPLETED | STOPPED
 *   STARTING | RUNNING -> STOPPING -> PREEMPTED (stopped to make room for another job, svc_job_preempt)
 *                                  -> SCHEDULED (resumes from its checkpoint) */
#include "service/svc_int.h"

#include <stdio.h>
#include <string.h>

static const char *const NAMES[] = {
    [JOB_STATE_NONE] = "",
#define STATE_NAME_(name, num, kind) [JOB_STATE_##name] = #name,
    KILN_JOB_STATES(STATE_NAME_)
#undef STATE_NAME_
};

static const bool ENDED[JOB_STATE_COUNT_] = {
#define STATE_ENDED_(name, num, kind) [JOB_STATE_##name] = KILN_JOB_KIND_##kind == KILN_JOB_KIND_ENDED,
    KILN_JOB_STATES(STATE_ENDED_)
#undef STATE_ENDED_
};

_Static_assert(KILN_ARRAY_LEN(NAMES) == JOB_STATE_COUNT_, "a name for every state");

const char *svc_state_name(svc_job_state_t st)
{
    if ((int)st < 0 || (size_t)st >= KILN_ARRAY_LEN(NAMES))
        return "";
    return NAMES[st];
}

svc_job_state_t svc_state_parse(const char *name)
{
    if (!name || !*name)
        return JOB_STATE_NONE;
    for (size_t i = 1; i < KILN_ARRAY_LEN(NAMES); i++)
        if (strcmp(NAMES[i], name) == 0)
            return (svc_job_state_t)i;
    return JOB_STATE_NONE;
}

bool svc_state_terminal(svc_job_state_t st)
{
    return (int)st > JOB_STATE_NONE && st < JOB_STATE_COUNT_ && ENDED[st];
}

#define B(s) (1u << (s))
/* LEGAL[from] = the set of states `from` may move to. */
static const unsigned LEGAL[JOB_STATE_COUNT_] = {
    [JOB_STATE_NONE] = B(JOB_STATE_QUEUED),
    [JOB_STATE_QUEUED] = B(JOB_STATE_SCHEDULED) | B(JOB_STATE_STOPPED) | B(JOB_STATE_FAILED),
    [JOB_STATE_SCHEDULED] = B(JOB_STATE_STARTING) | B(JOB_STATE_STOPPED) | B(JOB_STATE_RESTARTING)
                            | B(JOB_STATE_FAILED),
    [JOB_STATE_STARTING] = B(JOB_STATE_RUNNING) | B(JOB_STATE_STOPPING) | B(JOB_STATE_RESTARTING)
                           | B(JOB_STATE_FAILED) | B(JOB_STATE_COMPLETED) | B(JOB_STATE_STOPPED)
                           | B(JOB_STATE_PAUSED),
    [JOB_STATE_RUNNING] = B(JOB_STATE_COMPLETED) | B(JOB_STATE_FAILED) | B(JOB_STATE_STOPPING)
                          | B(JOB_STATE_RESTARTING) | B(JOB_STATE_PAUSED),
    [JOB_STATE_STOPPING] = B(JOB_STATE_STOPPED) | B(JOB_STATE_FAILED) | B(JOB_STATE_PREEMPTED),
    [JOB_STATE_RESTARTING] = B(JOB_STATE_SCHEDULED) | B(JOB_STATE_STOPPED) | B(JOB_STATE_FAILED),
    /* resumed (a new attempt from its checkpoint), ended by its tuning job, or stopped */
    [JOB_STATE_PAUSED] = B(JOB_STATE_RESTARTING) | B(JOB_STATE_COMPLETED) | B(JOB_STATE_STOPPED),
    [JOB_STATE_COMPLETED] = 0,
    [JOB_STATE_FAILED] = 0,
    [JOB_STATE_STOPPED] = 0,
    [JOB_STATE_PREEMPTED] = B(JOB_STATE_SCHEDULED) | B(JOB_STATE_STOPPED) | B(JOB_STATE_FAILED),
};
#undef B

bool svc_state_legal(svc_job_state_t from, svc_job_state_t to)
{
    if ((int)from < 0 || (size_t)from >= KILN_ARRAY_LEN(LEGAL) || (int)to <= 0
        || (size_t)to >= KILN_ARRAY_LEN(NAMES))
        return false;
    return (LEGAL[from] >> to) & 1u;
}

int svc_jobs_set_state(svc_tx_t *tx, store_transition_t *t, int n, svc_job_state_t to, int flags, kiln_err_t *err)
{
    for (int k = 0; k < n; k++) {
        t[k].done = false;
        if (!svc_state_legal(svc_state_parse(t[k].from), to)) {
            log_error("job %s: illegal transition %s -> %s refused (%s)", t[k].id, t[k].from, svc_state_name(to),
                      t[k].reason ? t[k].reason : "");
            return kiln_err_set(err, KILN_ESTATE, NULL, "job \"%s\" cannot go from %s to %s", t[k].id, t[k].from,
                                svc_state_name(to));
        }
    }
    if (svc_state_terminal(to))
        flags |= STORE_TR_ENDED;
    int rc = store_job_transition_many(tx->c, t, n, svc_state_name(to), flags, tx->actor, err);
    if (rc)
        return rc;
    const char **ids = calloc((size_t)KILN_MAX(n, 1), sizeof(*ids));
    int *atts = calloc((size_t)KILN_MAX(n, 1), sizeof(*atts));
    if (!ids || !atts) {
        free(ids);
        free(atts);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    int moved = 0;
    for (int k = 0; rc == 0 && k < n; k++) {
        if (!t[k].done)
            continue;
        log_info("job %s: %s -> %s (attempt %d): %s", t[k].id, t[k].from, svc_state_name(to), t[k].attempt,
                 t[k].reason ? t[k].reason : "");
        ids[moved] = t[k].id;
        atts[moved++] = t[k].attempt;
        /* Followers on every kilnd hear of the end when (and only if) this transaction commits. */
        if (svc_state_terminal(to) && (rc = store_notify(tx->c, SVC_CH_JOB_END, t[k].id, err)) == 0)
            tx->ended[to]++;
    }
    /* The agents of placed or stopping attempts hear of them when this commits (WatchWork). */
    if (rc == 0 && (to == JOB_STATE_SCHEDULED || to == JOB_STATE_STOPPING))
        rc = store_assign_notify_workers(tx->c, SVC_CH_WORK, ids, atts, moved, err);
    free(ids);
    free(atts);
    /* Anything that ends or re-queues a job may free slots or add work for the scheduler. */
    if (moved > 0 && (svc_state_terminal(to) || to == JOB_STATE_RESTARTING || to == JOB_STATE_STOPPED ||
                      to == JOB_STATE_PAUSED || to == JOB_STATE_PREEMPTED))
        tx->wake_sched = true;
    return rc;
}

int svc_job_set_state(svc_tx_t *tx, store_job_row_t *job, svc_job_state_t to, int attempt,
                      int flags, const char *reason, kiln_err_t *err)
{
    store_transition_t t = {.id = job->id, .from = job->state, .reason = reason, .attempt = attempt, .backfill_s = -1};
    int rc = svc_jobs_set_state(tx, &t, 1, to, flags, err);
    if (rc == 0 && !t.done)
        rc = kiln_err_set(err, KILN_ESTATE, NULL, "job \"%s\" is no longer %s", job->id, job->state);
    if (rc)
        return rc;
    kiln_strlcpy(job->state, svc_state_name(to), sizeof(job->state));
    job->attempt = attempt;
    if (flags & STORE_TR_STOP_REQ)
        job->stop_requested = true;
    return 0;
}

int svc_job_finish_stopping(svc_tx_t *tx, store_job_row_t *job, kiln_err_t *err)
{
    if (svc_state_parse(job->state) != JOB_STATE_STOPPING)
        return 0;
    int n = 0;
    int rc = store_assign_unreleased(tx->c, job->id, job->attempt, &n, err);
    if (rc || n > 0)
        return rc;
    if (job->preempted_by[0] && !job->stop_requested) {
        /* the preemptor, named as the job's project may read it (a job gone since: not theirs) */
        char reason[300], by[sizeof(job->project)], name[SCHED_JOB_NAME_LEN];
        rc = store_job_project(tx->c, job->preempted_by, by, sizeof by, err);
        if (rc && rc != KILN_ENOTFOUND)
            return rc;
        if (rc)
            kiln_err_clear(err);
        sched_job_name(job->project, job->preempted_by, rc ? NULL : by, name, sizeof name);
        snprintf(reason, sizeof(reason), "preempted by %s: every rank has exited; it waits in queue %s and "
                 "resumes from its newest checkpoint (step 0 if it wrote none) when admitted again", name, job->queue);
        return svc_job_set_state(tx, job, JOB_STATE_PREEMPTED, job->attempt, STORE_TR_PREEMPTED, reason, err);
    }
    return svc_job_set_state(tx, job, JOB_STATE_STOPPED, job->attempt, 0,
                             "stopped on request: every rank has exited", err);
}

int svc_job_preempt(svc_tx_t *tx, store_job_row_t *job, const char *by, const char *by_project, const char *why,
                    kiln_err_t *err)
{
    svc_job_state_t st = svc_state_parse(job->state);
    if (st != JOB_STATE_STARTING && st != JOB_STATE_RUNNING)
        return kiln_err_set(err, KILN_ESTATE, NULL, "job %s is %s: only a started job is preempted", job->id,
                            job->state);
    char reason[700], name[SCHED_JOB_NAME_LEN];
    kiln_text_fmt(reason, sizeof(reason), "preempted by %s: %s",
                  sched_job_name(job->project, by, by_project, name, sizeof name), why);
    int rc = store_job_set_preempted_by(tx->c, job->id, by, err);
    if (rc == 0)
        rc = store_assign_stop(tx->c, job->id, job->attempt, reason, NULL, err);
    if (rc == 0)
        rc = svc_job_set_state(tx, job, JOB_STATE_STOPPING, job->attempt, 0, reason, err);
    if (rc == 0) {
        kiln_strlcpy(job->preempted_by, by, sizeof(job->preempted_by));
        rc = svc_job_finish_stopping(tx, job, err);
    }
    return rc;
}

int svc_job_lose_attempt(svc_tx_t *tx, store_job_row_t *job, int attempt, const char *worker_id,
                         const char *why, kiln_err_t *err)
{
    char reason[1400];
    int rc = 0;
    (void)worker_id; /* every why names the worker (and the rank, when one died) */
    if (job->attempt != attempt)
        return 0;
    svc_job_state_t st = svc_state_parse(job->state);
    if (st == JOB_STATE_SCHEDULED || st == JOB_STATE_STARTING || st == JOB_STATE_RUNNING) {
        kiln_text_fmt(reason, sizeof(reason), "attempt %d lost: %s", attempt, why);
        rc = store_assign_stop(tx->c, job->id, attempt, reason, NULL, err);
        if (rc)
            return rc;
        /* Attempts ended by preemption do not count against retry.max_attempts. */
        if (attempt - job->preemptions < job->max_attempts) {
            kiln_text_fmt(reason, sizeof(reason), "%s; attempt %d of %d lost, re-queued (the next "
                          "attempt resumes from the newest checkpoint its worker can read: "
                          "checkpoint.path on shared storage, or the same worker's)", why, attempt - job->preemptions,
                          job->max_attempts);
            rc = svc_job_set_state(tx, job, JOB_STATE_RESTARTING, attempt, 0, reason, err);
        } else {
            kiln_text_fmt(reason, sizeof(reason), "%s", why);
            rc = svc_job_set_state(tx, job, JOB_STATE_FAILED, attempt, 0, reason, err);
        }
    } else if (st == JOB_STATE_STOPPING) {
        rc = svc_job_finish_stopping(tx, job, err);
    }
    tx->wake_sched = true;
    return rc;
}

int svc_job_lost(svc_t *s, const char *job_id, int attempt, const char *worker_id,
                 const char *why, kiln_err_t *err)
{
    svc_tx_t tx;
    store_job_row_t job;
    int rc = svc_tx_begin(s, &tx, err);
    if (rc)
        return rc;
    rc = store_job_row(tx.c, job_id, true, &job, err);
    /* The lost worker's ranks are gone: free its slots whatever the job's state. */
    if (rc == 0)
        rc = store_assign_release(tx.c, job_id, attempt, worker_id, err);
    if (rc == 0)
        rc = svc_job_lose_attempt(&tx, &job, attempt, worker_id, why, err);
    if (rc) {
        svc_tx_abort(&tx);
        return rc;
    }
    tx.wake_sched = true;
    return svc_tx_commit(&tx, err);
}
