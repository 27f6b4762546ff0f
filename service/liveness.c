/* liveness.c - the liveness thread: declares workers that stopped heartbeating DEAD and takes
 * their jobs out of RUNNING (re-queued as RESTARTING, or FAILED with the reason), stops jobs past
 * their maximum runtime, and sweeps idle per-job entries. What agents report is agent.c's. */
#include "service/svc_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- liveness ------------------------------------------------------------------------------- */

static void live_tick(svc_t *s)
{
    kiln_err_t err;
    store_conn_t *c = NULL;
    store_lost_t *lost = NULL;
    int nexp = 0, nlost = 0;
    if (store_conn_get(s->store, &c, &err))
        return;
    if (store_workers_expire(c, s->cfg.heartbeat_timeout_ms, &nexp, &err)
        || store_assign_lost(c, &lost, &nlost, &err)) {
        log_warn("liveness: %s", err.message);
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
    int interval = KILN_MAX(50, KILN_MIN(1000, s->cfg.heartbeat_timeout_ms / 4));
    int64_t last_sweep = kiln_mono_us();
    for (;;) {
        /* The condition variable is shared with the scheduler's wake-ups: wait out the full
         * interval, only stopping early for shutdown. */
        struct timespec ts;
        kiln_deadline_in(&ts, interval);
        pthread_mutex_lock(&s->mu);
        while (!s->stopping && pthread_cond_timedwait(&s->cv, &s->mu, &ts) == 0)
            ;
        bool stop = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (stop)
            break;
        live_tick(s);
        if (kiln_mono_us() - last_sweep > 10 * 1000000) {
            svc_jobent_sweep(s, 60 * 1000000LL);
            last_sweep = kiln_mono_us();
        }
    }
    return NULL;
}
