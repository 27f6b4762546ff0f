/* progress.c - the communication thread. It owns the fabric endpoint: takes submitted operations
 * in order (collectives start in submission order, up to COMM_COLL_INFLIGHT at once on disjoint
 * buffers; point-to-point ones are posted at once), drives the transport's progress, watches the
 * control connections for dead peers, and completes requests.
 * It is not the algorithms (ring.c) nor the public API (comm.c). */
#include "engine/comm/comm_int.h"

#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#define CTL_EVERY_US 2000        /* control connections are polled this often while busy */
#define FAIL_GRACE_US 2000000    /* after a fabric error, wait this long for a named death */

void comm_op_finish(comm_engine_t *e, comm_req_t *op, int status, const char *msg)
{
    e->progress_us = kiln_mono_us();
    for (comm_req_t **pp = &e->active; *pp; pp = &(*pp)->anext)
        if (*pp == op) {
            *pp = op->anext;
            break;
        }
    comm_req_t *prev = NULL;
    for (comm_req_t *q = e->coll_head; q; prev = q, q = q->next)
        if (q == op) {
            if (prev)
                prev->next = op->next;
            else
                e->coll_head = op->next;
            if (e->coll_tail == op)
                e->coll_tail = prev;
            break;
        }
    pthread_mutex_lock(&e->mu);
    op->status = status;
    if (msg)
        kiln_strlcpy(op->msg, msg, sizeof(op->msg));
    op->done = true; /* the waiter may free op from here on */
    pthread_cond_broadcast(&e->cv_done);
    pthread_mutex_unlock(&e->mu);
}

static const char *op_name(comm_op_kind_t k)
{
    switch (k) {
    case COMM_OP_ALLREDUCE: return "an all-reduce";
    case COMM_OP_REDUCE_SCATTER: return "a reduce-scatter";
    case COMM_OP_ALLGATHER: return "an all-gather";
    case COMM_OP_BCAST: return "a broadcast";
    case COMM_OP_SEND: return "a send";
    case COMM_OP_RECV: return "a receive";
    case COMM_OP_SHUTDOWN: return "the teardown";
    }
    return "an operation";
}

void comm_watchdog_fail_locked(comm_engine_t *e, const comm_req_t *op, double secs)
{
    if (e->failed)
        return;
    int peer = -1;
    if (op && (op->kind == COMM_OP_SEND || op->kind == COMM_OP_RECV))
        peer = op->grp->members[op->peer];
    else if (op && op->started)
        peer = comm_ring_waiting_on(op);
    if (peer >= 0)
        snprintf(e->failmsg, sizeof(e->failmsg),
                 "no progress for %.0f s in %s: waiting on rank %d (host %s) (KILN_COMM_WATCHDOG_S=%.0f)",
                 secs, op_name(op->kind), peer, e->hosts[peer][0] ? e->hosts[peer] : "?",
                 e->watchdog_us / 1e6);
    else
        snprintf(e->failmsg, sizeof(e->failmsg),
                 "no progress for %.0f s in %s (KILN_COMM_WATCHDOG_S=%.0f)", secs,
                 op ? op_name(op->kind) : "an operation", e->watchdog_us / 1e6);
    e->failed = KILN_ETIMEDOUT;
    log_error("comm: %s", e->failmsg);
    pthread_cond_broadcast(&e->cv_submit);
    pthread_cond_broadcast(&e->cv_done);
}

/* The oldest started operation, whose stall the watchdog reports. Progress thread. */
static const comm_req_t *oldest_active(const comm_engine_t *e)
{
    const comm_req_t *best = NULL;
    for (const comm_req_t *op = e->active; op; op = op->anext)
        if (!best || op->started_us < best->started_us)
            best = op;
    return best;
}

void comm_engine_fail(comm_engine_t *e, const char *fmt, ...)
{
    pthread_mutex_lock(&e->mu);
    if (!e->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->failmsg, sizeof(e->failmsg), fmt, ap);
        va_end(ap);
        e->failed = KILN_ECOMM;
        log_error("comm: %s", e->failmsg);
    }
    pthread_cond_broadcast(&e->cv_submit);
    pthread_mutex_unlock(&e->mu);
}

/* Fault injection: e->test_stall_after = N makes the thread stop for good when it starts its
 * (N+1)th collective, as a thread stuck inside the provider would (COMM_STUCK_US). */
static void test_stall(comm_engine_t *e)
{
    if (e->test_stall_after < 0 || e->collectives_started++ < e->test_stall_after)
        return;
    log_warn("comm: the communication thread stops here, as asked (rank %d)", e->rank);
    for (;;)
        pause();
}

static void start_op(comm_engine_t *e, comm_req_t *op)
{
    char msg[COMM_MSG_MAX] = "";
    if (op->kind != COMM_OP_SEND && op->kind != COMM_OP_RECV && op->kind != COMM_OP_SHUTDOWN)
        test_stall(e);
    op->started = true;
    op->started_us = e->progress_us = kiln_mono_us();
    if (op->kind == COMM_OP_SHUTDOWN) {
        comm_ctl_bye(e);
        return;
    }
    /* oldest first: the transport advances older operations before newer ones */
    comm_req_t **pp = &e->active;
    while (*pp)
        pp = &(*pp)->anext;
    op->anext = NULL;
    *pp = op;
    int rc = e->tp->start(e, op, msg);
    if (rc != 0) {
        comm_ring_free(op);
        comm_op_finish(e, op, rc, msg);
    }
}

static bool overlaps(const comm_req_t *a, const comm_req_t *b)
{
    const char *pa = a->buf, *pb = b->buf;
    size_t na = a->n * a->esize, nb = b->n * b->esize;
    return na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
}

/* Starts the collectives that may run now: in submission order, while fewer than
 * COMM_COLL_INFLIGHT run and the next one's buffer is disjoint from every earlier unfinished
 * one's (a caller may queue two operations on one buffer and rely on their order). The teardown
 * starts only when it is the last operation left. Every rank starts a group's collectives in
 * the same order; tags carry the sequence number, so ones running at once never mix, and the
 * oldest unfinished collective of any rank has always started on every rank. */
static void start_colls(comm_engine_t *e, int64_t *shutdown_deadline)
{
    for (;;) {
        int running = 0;
        comm_req_t *next = NULL;
        for (comm_req_t *op = e->coll_head; op; op = op->next) {
            if (op->started) {
                running++;
                continue;
            }
            next = op;
            break;
        }
        if (!next || running >= COMM_COLL_INFLIGHT)
            return;
        if (next->kind == COMM_OP_SHUTDOWN && next != e->coll_head)
            return;
        for (const comm_req_t *q = e->coll_head; q != next; q = q->next)
            if (overlaps(q, next))
                return;
        if (next->kind == COMM_OP_SHUTDOWN)
            *shutdown_deadline = kiln_mono_us() + (int64_t)(e->timeout_s * 1e6);
        start_op(e, next); /* on an error it finishes (and unlinks) next: look again */
    }
}

/* After a failure: every started and queued op ends with the engine's error; teardown ends. */
static void fail_all(comm_engine_t *e, int status, const char *msg)
{
    while (e->active)
        comm_op_finish(e, e->active, status, msg);
    while (e->coll_head)
        comm_op_finish(e, e->coll_head, e->coll_head->kind == COMM_OP_SHUTDOWN ? 0 : status, msg);
}

static void *progress_main(void *arg)
{
    comm_engine_t *e = arg;
    bool aborted = false;
    int idle = 0;
    int64_t shutdown_deadline = 0;
    char msg[COMM_MSG_MAX], failmsg[COMM_MSG_MAX];

    for (;;) {
        pthread_mutex_lock(&e->mu);
        e->ticks++;
        if (!e->active && !e->coll_head && !e->q_head) {
            if (e->stop) {
                pthread_mutex_unlock(&e->mu);
                break;
            }
            struct timespec ts;
            kiln_deadline_in(&ts, 10);
            pthread_cond_timedwait(&e->cv_submit, &e->mu, &ts);
        }
        comm_req_t *taken = e->q_head;
        e->q_head = e->q_tail = NULL;
        int failed = e->failed;
        if (failed)
            kiln_strlcpy(failmsg, e->failmsg, sizeof(failmsg));
        pthread_mutex_unlock(&e->mu);

        while (taken) {
            comm_req_t *op = taken;
            taken = op->next;
            op->next = NULL;
            if (op->kind == COMM_OP_SEND || op->kind == COMM_OP_RECV) {
                if (!failed)
                    start_op(e, op);
                else
                    comm_op_finish(e, op, failed, failmsg);
                continue;
            }
            if (e->coll_tail)
                e->coll_tail->next = op;
            else
                e->coll_head = op;
            e->coll_tail = op;
        }

        if (failed) {
            if (!aborted) {
                e->tp->abort(e);
                aborted = true;
            }
            fail_all(e, failed, failmsg);
            pthread_mutex_lock(&e->ctl_mu);
            comm_ctl_poll(e);
            pthread_mutex_unlock(&e->ctl_mu);
            continue;
        }

        start_colls(e, &shutdown_deadline);

        int events = 0;
        bool sleepy = idle > e->spin_yields && e->tp->can_wait(e);
        if (e->active && !e->pending_fail_us) {
            int rc = e->tp->progress(e, sleepy ? 1 : 0, &events, msg);
            if (rc != 0) {
                /* Usually a peer died: give the control connections a moment to name it. */
                e->pending_fail_us = kiln_mono_us() + FAIL_GRACE_US;
                kiln_strlcpy(e->pending_fail, msg, sizeof(e->pending_fail));
            }
        }

        int64_t now = kiln_mono_us();
        if (events > 0 || !e->active)
            e->progress_us = now;
        else if (!e->pending_fail_us && now - e->progress_us >= e->watchdog_us) {
            pthread_mutex_lock(&e->mu);
            comm_watchdog_fail_locked(e, oldest_active(e), (now - e->progress_us) / 1e6);
            pthread_mutex_unlock(&e->mu);
        }
        if (now - e->last_ctl_us >= CTL_EVERY_US || !e->active) {
            pthread_mutex_lock(&e->ctl_mu);
            comm_ctl_poll(e);
            pthread_mutex_unlock(&e->ctl_mu);
            e->last_ctl_us = now;
        }
        if (e->pending_fail_us && now >= e->pending_fail_us)
            comm_engine_fail(e, "%s", e->pending_fail);
        comm_req_t *head = e->coll_head;
        if (head && head->kind == COMM_OP_SHUTDOWN && head->started) {
            if (e->allbye)
                comm_op_finish(e, head, 0, NULL);
            else if (now > shutdown_deadline)
                comm_op_finish(e, head, KILN_ETIMEDOUT, "timed out waiting for the other ranks to finish");
        }

        /* Spin while data moves; back off while waiting (the cores are shared with compute):
         * yield, then nap as the transport says (e->nap_us: 200 us over tcp, where a nap costs
         * one wakeup where yielding or 20 us naps cost hundreds per millisecond of transfer,
         * for the same rate; 20 us over shm, whose copies this thread makes), then, after
         * ~1000 rounds without a completion (a slow peer), sleep in the transport's wait where
         * it has one or take 200 us naps. */
        if (events > 0) {
            idle = 0;
        } else if (e->active || e->coll_head) {
            idle++;
            if (idle <= e->spin_yields) {
                sched_yield();
            } else if (!sleepy || !e->active) {
                long us = idle < 1000 ? e->nap_us : 200;
                struct timespec ts = {0, us * 1000};
                nanosleep(&ts, NULL);
            }
        }
    }
    pthread_mutex_lock(&e->mu);
    e->thread_done = true;
    pthread_cond_broadcast(&e->cv_done);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

int comm_progress_start(comm_engine_t *e, kiln_err_t *err)
{
    if (pthread_create(&e->thread, NULL, progress_main, e) != 0)
        return kiln_err_set(err, KILN_EINTERNAL, NULL, "could not start the communication thread");
    e->thread_started = true;
    return 0;
}

void comm_progress_stop(comm_engine_t *e)
{
    if (!e->thread_started)
        return;
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    pthread_cond_broadcast(&e->cv_submit);
    /* After a failure the thread may be stuck in the provider for good (COMM_STUCK_US): give it
     * a moment, then leave it behind rather than hang the caller's exit. */
    int64_t deadline = kiln_mono_us() + COMM_STUCK_US;
    while (e->failed && !e->thread_done && kiln_mono_us() < deadline) {
        struct timespec ts;
        kiln_deadline_in(&ts, 100);
        pthread_cond_timedwait(&e->cv_done, &e->mu, &ts);
    }
    bool stuck = e->failed && !e->thread_done;
    pthread_mutex_unlock(&e->mu);
    if (stuck) {
        pthread_detach(e->thread);
        e->thread_stuck = true;
        log_warn("comm: the communication thread is stuck in the fabric provider after the failure; leaving it");
    } else {
        pthread_join(e->thread, NULL);
    }
    e->thread_started = false;
}
