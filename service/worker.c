/* worker.c - the agent side of worker management: registration, heartbeats (which carry new
 * assignments and stop orders back), and the liveness thread that declares silent workers DEAD
 * and takes their jobs out of RUNNING (re-queued as RESTARTING, or FAILED with the reason). */
#include "service/svc_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

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

int svc_agent_register(svc_t *s, const Kiln__RegisterRequest *req, arena_t *arena,
                       Kiln__RegisterResponse *out, kiln_err_t *err)
{
    char id[STORE_WORKER_ID_LEN];
    const char *slot_type = req->slot_type && *req->slot_type ? req->slot_type : "cpu";
    if (strcmp(slot_type, "cpu") != 0 && strcmp(slot_type, "gpu") != 0)
        return kiln_err_set(err, KILN_EINVAL, "slot_type", "slot type must be \"cpu\" or \"gpu\", got \"%.32s\"",
                            slot_type);
    if (req->slots < 0 || req->slots > 4096)
        return kiln_err_set(err, KILN_EINVAL, "slots", "slots must be between 0 and 4096, got %d", req->slots);
    if (req->worker_id && *req->worker_id) {
        if (strlen(req->worker_id) >= sizeof(id))
            return kiln_err_set(err, KILN_EINVAL, "worker_id", "worker id is longer than %zu characters",
                                sizeof(id) - 1);
        kiln_strlcpy(id, req->worker_id, sizeof(id));
    } else {
        new_worker_id(id, sizeof(id));
    }
    json_t *gpus = json_array();
    for (size_t i = 0; i < req->n_gpus; i++)
        json_array_append_new(gpus, json_string(req->gpus[i] ? req->gpus[i] : ""));
    char *gpus_text = json_dumps(gpus, JSON_COMPACT);
    json_decref(gpus);
    const char *host = req->hostname ? req->hostname : "";
    store_worker_reg_t w = {.id = id, .hostname = host,
                            .address = req->address && *req->address ? req->address : host,
                            .slot_type = slot_type, .gpus_json = gpus_text ? gpus_text : "[]",
                            .version = req->version, .slots = req->slots, .cpu_cores = req->cpu_cores};
    store_conn_t *c = NULL;
    store_lost_t *lost = NULL;
    int nlost = 0;
    bool was_alive = false;
    int rc = store_conn_get(s->store, &c, err);
    if (rc)
        goto out;
    rc = store_worker_upsert(c, &w, &was_alive, err);
    if (rc)
        goto out;
    /* A (re-)registration means a fresh agent: whatever it had been given and started is gone. */
    rc = store_assign_delivered_on(c, id, &lost, &nlost, err);
    if (rc)
        goto out;
    store_conn_put(s->store, c);
    c = NULL;
    log_info("worker %s (%s, %s) registered: %d %s slot(s)%s", id, host, w.address, req->slots,
             slot_type, was_alive ? " (it was alive: its agent restarted)" : "");
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
    out->worker_id = svc_astr(arena, id);
    out->heartbeat_interval_ms = s->cfg.heartbeat_interval_ms;
    out->heartbeat_timeout_ms = s->cfg.heartbeat_timeout_ms;
    svc_sched_wake(s);
out:
    if (c)
        store_conn_put(s->store, c);
    free(lost);
    free(gpus_text);
    return rc;
}

/* Delivers one assignment: marks it delivered and moves its job SCHEDULED -> STARTING.
 * Returns 1 when *msg was filled, 0 when the assignment is no longer wanted. */
static int deliver(svc_t *s, const store_assign_t *a, arena_t *arena, Kiln__Assignment *msg,
                   kiln_err_t *err)
{
    svc_tx_t tx;
    store_job_row_t job;
    char *spec = NULL;
    int rc = svc_tx_begin(s, &tx, err);
    if (rc)
        return rc;
    rc = store_job_row(tx.c, a->job_id, true, &job, err);
    if (rc)
        goto fail;
    svc_job_state_t st = svc_state_parse(job.state);
    if (job.attempt != a->attempt || (st != JOB_STATE_SCHEDULED && st != JOB_STATE_STARTING)) {
        /* The attempt moved on (stopped, failed, restarted): nothing to start. */
        rc = store_assign_release(tx.c, a->job_id, a->attempt, a->worker_id, err);
        if (rc)
            goto fail;
        rc = svc_tx_commit(&tx, err);
        return rc ? rc : 0;
    }
    rc = store_assign_deliver(tx.c, a->id, &spec, err);
    if (rc)
        goto fail;
    if (st == JOB_STATE_SCHEDULED) {
        char reason[256];
        snprintf(reason, sizeof(reason), "assignment delivered to worker %s", a->worker_id);
        rc = svc_job_set_state(&tx, &job, JOB_STATE_STARTING, job.attempt, 0, reason, err);
        if (rc)
            goto fail;
    }
    rc = svc_tx_commit(&tx, err);
    if (rc) {
        free(spec);
        return rc;
    }
    kiln__assignment__init(msg);
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
    kiln_err_t ferr;
    if (svc_assignment_fill(arena, a->job_id, spec, msg, &ferr) != 0)
        log_warn("job %s: its spec no longer parses (%s); the assignment carries only its text", a->job_id,
                 ferr.message);
    free(spec);
    log_info("job %s: attempt %d assignment (ranks %d..%d of %d) delivered to worker %s", a->job_id,
             a->attempt, a->nranks ? a->ranks[0] : 0, a->nranks ? a->ranks[a->nranks - 1] : 0,
             a->world_size, a->worker_id);
    return 1;
fail:
    svc_tx_abort(&tx);
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
    m->grace_ms = s->cfg.stop_grace_ms;
    return m;
}

int svc_agent_heartbeat(svc_t *s, const Kiln__HeartbeatRequest *req, arena_t *arena,
                        Kiln__HeartbeatResponse *out, kiln_err_t *err)
{
    if (!req->worker_id || !*req->worker_id)
        return kiln_err_set(err, KILN_EINVAL, "worker_id", "heartbeat without a worker id");
    const char *wid = req->worker_id;
    store_conn_t *c = NULL;
    store_stop_order_t *stale = NULL, *reaped = NULL, *stops = NULL;
    store_assign_t *und = NULL;
    int nstale = 0, nreaped = 0, nstops = 0, nund = 0;
    kiln_err_t e2;
    int rc = store_conn_get(s->store, &c, err);
    if (rc)
        return rc;
    bool began_draining = false;
    rc = store_worker_touch(c, wid, req->draining, &began_draining, &e2);
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

    if (nund > 0) {
        out->assignments = arena_alloc(arena, sizeof(Kiln__Assignment *) * (size_t)nund);
        for (int i = 0; i < nund; i++) {
            Kiln__Assignment *m = arena_alloc(arena, sizeof(*m));
            int d = deliver(s, &und[i], arena, m, err);
            if (d < 0) {
                rc = d;
                goto out;
            }
            if (d == 1)
                out->assignments[out->n_assignments++] = m;
        }
    }
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
        if (svc_job_stop(s, over[i].id, "maximum runtime (stopping.max_runtime_s) exceeded", &job, &err))
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
