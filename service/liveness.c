/* liveness.c - the liveness thread: on the leader, declares workers that stopped heartbeating
 * DEAD and takes their jobs out of RUNNING (re-queued as RESTARTING, or FAILED with the reason),
 * stops jobs past their maximum runtime and forgets old batch numbers; on every kilnd it sweeps
 * idle per-job entries (and, when not leading, keeps the capacity used at submission fresh).
 * What agents report is agent.c's.
 *
 * Fairness: a worker is declared dead only for silence this kilnd watched. The watch starts when
 * it takes the lead, and starts again after any tick that came late (kilnd itself was paused:
 * SIGSTOP, a stalled VM, a debugger) or failed (the database was unreachable, so the agents'
 * heartbeats failed too): silence is counted from the later of a worker's last heartbeat and the
 * start of the watch, on the database's clock, so kilnd's own pauses never kill a worker. */
#include "service/svc_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PRUNE_EVERY_US (3600LL * 1000000)   /* forget batch numbers of streams silent a week */
#define PRUNE_AGE_S (7 * 24 * 3600)

typedef struct live_state {
    int interval_ms;
    bool watching;               /* watched_since_us is valid */
    int64_t watched_since_us;    /* database clock: when the current watch started */
    uint64_t epoch;              /* leadership the watch belongs to */
    int64_t last_tick_us;        /* monotonic */
    int64_t last_prune_us;       /* monotonic */
} live_state_t;

/* Starts or continues the watch; returns false when workers may not be judged this tick. */
static bool live_watch(svc_t *s, live_state_t *st, store_conn_t *c)
{
    kiln_err_t err;
    int64_t now = kiln_mono_us();
    int64_t gap_ms = st->last_tick_us ? (now - st->last_tick_us) / 1000 : 0;
    uint64_t epoch = svc_leader_epoch(s);
    const char *why = NULL;
    if (!st->watching)
        why = epoch != st->epoch ? "took the lead" : "the database answers again";
    else if (epoch != st->epoch)
        why = "took the lead again";
    else if (gap_ms > 2 * st->interval_ms + 1000)
        why = "its own ticks stopped";
    st->last_tick_us = now;
    if (!why)
        return true;
    int64_t db_now = 0;
    if (store_now_us(c, &db_now, &err) != 0) {
        st->watching = false;
        return false;
    }
    if (st->watching && gap_ms > 2 * st->interval_ms + 1000)
        log_warn("liveness: kilnd did not run for %.1f s (paused?); workers' silence is counted from now",
                 gap_ms / 1000.0);
    else
        log_info("liveness: watching the workers from now (%s): none is declared dead before %d ms of silence",
                 why, s->cfg.heartbeat_timeout_ms);
    st->watching = true;
    st->watched_since_us = db_now;
    st->epoch = epoch;
    return true;
}

static void live_tick(svc_t *s, live_state_t *st)
{
    kiln_err_t err;
    store_conn_t *c = NULL;
    store_lost_t *lost = NULL;
    int nexp = 0, nlost = 0;
    if (store_conn_get(s->store, &c, &err)) {
        st->watching = false;
        return;
    }
    if (!live_watch(s, st, c))
        goto out;
    if (store_workers_expire(c, s->cfg.heartbeat_timeout_ms, st->watched_since_us, &nexp, &err)
        || store_assign_lost(c, &lost, &nlost, &err)) {
        log_warn("liveness: %s", err.message);
        st->watching = false;
        goto out;
    }
    if (nexp > 0)
        svc_cap_refresh(s, c, &err);
    store_conn_put(s->store, c);
    c = NULL;
    for (int i = 0; i < nlost; i++) {
        char why[512];
        snprintf(why, sizeof(why), "worker %s (%s) stopped heartbeating", lost[i].worker_id,
                 lost[i].hostname);
        if (svc_job_lost(s, lost[i].job_id, lost[i].attempt, lost[i].worker_id, why, &err))
            log_warn("liveness: could not handle job %s: %s", lost[i].job_id, err.message);
    }
    if (nexp > 0 || nlost > 0)
        svc_sched_wake(s);

    /* stopping.max_runtime_s: a job past it is stopped like a user stop (STOPPING, then
     * STOPPED once its ranks have exited). */
    store_job_row_t *over = NULL;
    int nover = 0;
    if (store_conn_get(s->store, &c, &err) == 0) {
        if (store_job_overdue(c, &over, &nover, &err))
            log_warn("liveness: %s", err.message);
        if (kiln_mono_us() - st->last_prune_us > PRUNE_EVERY_US) {
            int pruned = 0;
            if (store_ingest_prune(c, PRUNE_AGE_S, &pruned, &err))
                log_warn("liveness: %s", err.message);
            else if (pruned > 0)
                log_info("liveness: forgot the batch numbers of %d stream(s) silent for a week", pruned);
            st->last_prune_us = kiln_mono_us();
        }
        store_conn_put(s->store, c);
        c = NULL;
    }
    for (int i = 0; i < nover; i++) {
        json_t *job = NULL;
        if (svc_job_stop(s, svc_caller_kilnd(), over[i].id, "maximum runtime (stopping.max_runtime_s) exceeded", &job, &err))
            log_warn("liveness: could not stop job %s: %s", over[i].id, err.message);
        json_decref(job);
    }
    free(over);
out:
    if (c)
        store_conn_put(s->store, c);
    free(lost);
}

void *svc_live_main(void *arg)
{
    svc_t *s = arg;
    live_state_t st = {.interval_ms = KILN_MAX(50, KILN_MIN(1000, s->cfg.heartbeat_timeout_ms / 4)),
                       .last_prune_us = kiln_mono_us()};
    int64_t last_sweep = kiln_mono_us();
    for (;;) {
        /* The condition variable is shared with the scheduler's wake-ups: wait out the full
         * interval, only stopping early for shutdown. */
        struct timespec ts;
        kiln_deadline_in(&ts, st.interval_ms);
        pthread_mutex_lock(&s->mu);
        while (!s->stopping && pthread_cond_timedwait(&s->cv, &s->mu, &ts) == 0)
            ;
        bool stop = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (stop)
            break;
        if (svc_is_leader(s)) {
            live_tick(s, &st);
        } else {
            /* another kilnd judges; when this one leads again it starts a new watch */
            st.watching = false;
            st.last_tick_us = 0;
            /* the leader's scheduler keeps its own cache fresh; here, submissions check against
             * this copy */
            kiln_err_t err;
            store_conn_t *c = NULL;
            if (store_conn_get(s->store, &c, &err) == 0) {
                svc_cap_refresh(s, c, &err);
                store_conn_put(s->store, c);
            }
        }
        if (kiln_mono_us() - last_sweep > 10 * 1000000) {
            svc_jobent_sweep(s, 60 * 1000000LL);
            last_sweep = kiln_mono_us();
        }
    }
    return NULL;
}
