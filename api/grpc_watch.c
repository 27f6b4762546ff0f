/* grpc_watch.c - AgentService's WatchWork: each agent holds one server stream open and kilnd
 * writes a WorkNudge to it when work for that worker is committed (svc_on_work: any replica's
 * commit reaches every kilnd through the database), so the agent heartbeats at once instead of
 * at its next interval. A held watch costs no thread: it is a parked call with a
 * RECV_CLOSE_ON_SERVER batch and at most one send in flight, both completed on the server's
 * queue; its memory is this struct and the core's call. At most one watch per worker (a newer
 * one replaces the older) and WATCH_MAX in all. A worker's watch gets at most one nudge each
 * NUDGE_GAP_US: a burst of work for it (one notification per commit) comes as one nudge at once
 * and, if more came within the gap, one more at its end, sent by the table's pacing thread. A
 * watch that ends is counted in kiln_grpc_requests_total with the status it ended with; the
 * watches held are the gauge kiln_grpc_work_watches, the nudges sent kiln_grpc_work_nudges_total. */
#include "api/grpc_int.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WATCH_MAX 4096               /* held watches per kilnd; more are refused (heartbeats go on) */
#define WATCH_BUCKETS 256
/* Between two nudges of one watch, at least: an agent's heartbeat after a nudge takes all the
 * work committed by then, so nudges closer than this would only repeat it. */
#define NUDGE_GAP_US 50000
#define WATCH_METHOD "/kiln.AgentService/WatchWork"

typedef struct watch watch_t;

typedef struct wtag {
    api_grpc_tag_t hdr;
    watch_t *w;
} wtag_t;

struct watch {
    api_grpc_watches_t *ws;
    grpc_call *call;
    char worker_id[64];
    wtag_t send, close;
    grpc_byte_buffer *bb;            /* the message in flight */
    bool sending;                    /* a send batch is in flight */
    bool again;                      /* nudged while sending: send once more when it completes */
    bool due;                        /* nudged within NUDGE_GAP_US of the last: the pacer sends it */
    int64_t last_us;                 /* when the last nudge was sent (kiln_mono_us) */
    bool md_sent, closed, listed;
    int cancelled;
    int status;                      /* the status kilnd ended the call with; -1: none (it was not kilnd) */
    watch_t *next;                   /* in its bucket */
};

struct api_grpc_watches {
    api_grpc_t *g;
    pthread_mutex_t mu;              /* the table and every watch's flags */
    watch_t *bucket[WATCH_BUCKETS];
    int n;
    int n_due;                       /* listed watches with due set */
    pthread_cond_t cv;               /* the pacer's: a watch became due, or stop */
    pthread_t pacer;
    bool pacer_on, stop;
};

static prom_family_t prom_watches = PROM_FAMILY("kiln_grpc_work_watches",
                                                 "WatchWork streams this kilnd holds (one per watching agent).",
                                                 PROM_GAUGE);
static prom_family_t prom_nudges = PROM_FAMILY(
    "kiln_grpc_work_nudges_total", "WorkNudges sent to watching agents (at most one per worker each 50 ms).",
    PROM_COUNTER);

static watch_t **bucket_of(api_grpc_watches_t *ws, const char *worker_id)
{
    uint32_t h = 2166136261u;
    for (const char *p = worker_id; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    return &ws->bucket[h % WATCH_BUCKETS];
}

static void unlist(api_grpc_watches_t *ws, watch_t *w)
{
    if (!w->listed)
        return;
    for (watch_t **p = bucket_of(ws, w->worker_id); *p; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            break;
        }
    w->listed = false;
    ws->n--;
    prom_add(&prom_watches, "", -1);
    if (w->due) {
        w->due = false;
        ws->n_due--;
    }
}

static void watch_free(watch_t *w)
{
    api_grpc_t *g = w->ws->g;
    grpc_call_unref(w->call);
    free(w);
    api_grpc_stream_leave(g);
}

/* Sends a WorkNudge, or asks for one more after the send in flight. Under ws->mu. */
static void watch_send(watch_t *w)
{
    if (w->closed)
        return;
    if (w->sending) {
        w->again = true;
        return;
    }
    Kiln__WorkNudge m = KILN__WORK_NUDGE__INIT;
    m.first = !w->md_sent;
    uint8_t buf[16];
    size_t len = kiln__work_nudge__pack(&m, buf);
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)buf, len);
    w->bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof(ops));
    if (!w->md_sent)
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = w->bb;
    if (grpc_call_start_batch(w->call, ops, n, &w->send, NULL) != GRPC_CALL_OK) {
        grpc_byte_buffer_destroy(w->bb);
        w->bb = NULL;
        return; /* the call is ending: its close frees it */
    }
    w->sending = true;
    w->md_sent = true;
    w->last_us = kiln_mono_us();
    prom_add(&prom_nudges, "", 1);
}

static void send_done(api_grpc_tag_t *t, bool ok)
{
    watch_t *w = ((wtag_t *)t)->w;
    api_grpc_watches_t *ws = w->ws;
    pthread_mutex_lock(&ws->mu);
    grpc_byte_buffer_destroy(w->bb);
    w->bb = NULL;
    w->sending = false;
    if (ok && w->again) {
        w->again = false;
        watch_send(w);
    }
    bool gone = w->closed && !w->sending;
    pthread_mutex_unlock(&ws->mu);
    if (gone)
        watch_free(w);
}

/* Ends the call with status (counted when it closes). Under ws->mu, or before the watch is shared. */
static void watch_end(watch_t *w, grpc_status_code status, const char *message)
{
    if (w->status < 0)
        w->status = (int)status;
    grpc_call_cancel_with_status(w->call, status, message, NULL);
}

/* The call is over: the agent went away or its deadline passed, it was replaced, or kilnd stops. */
static void close_done(api_grpc_tag_t *t, bool ok)
{
    (void)ok;
    watch_t *w = ((wtag_t *)t)->w;
    api_grpc_watches_t *ws = w->ws;
    pthread_mutex_lock(&ws->mu);
    w->closed = true;
    unlist(ws, w);
    bool gone = !w->sending;
    int status = w->status >= 0 ? w->status : (int)GRPC_STATUS_CANCELLED;
    pthread_mutex_unlock(&ws->mu);
    api_grpc_count(WATCH_METHOD, status, -1);
    if (gone)
        watch_free(w);
}

/* svc_on_work's hook (the notify thread): nudges the worker's watch on this kilnd, if it has one,
 * at once unless it was nudged within NUDGE_GAP_US; then the pacer sends it at the gap's end. */
static void watch_nudge(void *ud, const char *worker_id)
{
    api_grpc_watches_t *ws = ud;
    pthread_mutex_lock(&ws->mu);
    for (watch_t *w = *bucket_of(ws, worker_id); w; w = w->next)
        if (!strcmp(w->worker_id, worker_id)) {
            if (w->due)
                break;
            if (kiln_mono_us() - w->last_us >= NUDGE_GAP_US) {
                watch_send(w);
            } else {
                w->due = true;
                if (ws->n_due++ == 0)
                    pthread_cond_signal(&ws->cv);
            }
            break;
        }
    pthread_mutex_unlock(&ws->mu);
}

/* The pacer: sends each due watch its nudge once NUDGE_GAP_US has passed since its last, until
 * stop. Sleeps while none is due. */
static void *pacer_main(void *arg)
{
    api_grpc_watches_t *ws = arg;
    pthread_mutex_lock(&ws->mu);
    while (!ws->stop) {
        if (ws->n_due == 0) {
            pthread_cond_wait(&ws->cv, &ws->mu);
            continue;
        }
        int64_t now = kiln_mono_us(), next = INT64_MAX;
        for (size_t i = 0; i < WATCH_BUCKETS && ws->n_due > 0; i++)
            for (watch_t *w = ws->bucket[i]; w; w = w->next) {
                if (!w->due)
                    continue;
                if (now - w->last_us >= NUDGE_GAP_US) {
                    w->due = false;
                    ws->n_due--;
                    watch_send(w);
                } else if (w->last_us + NUDGE_GAP_US < next) {
                    next = w->last_us + NUDGE_GAP_US;
                }
            }
        if (ws->n_due > 0 && next != INT64_MAX) {
            struct timespec ts;
            kiln_deadline_in(&ts, (next - now + 999) / 1000);
            pthread_cond_timedwait(&ws->cv, &ws->mu, &ts);
        }
    }
    pthread_mutex_unlock(&ws->mu);
    return NULL;
}

int api_grpc_watch_check(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *arena,
                         ProtobufCMessage **resp, kiln_err_t *err)
{
    (void)arena;
    *resp = NULL;
    const char *wid = NULL;
    return svc_agent_watch(ctx->worker_id, (const Kiln__WatchWorkRequest *)req, &wid, err);
}

void api_grpc_watch(api_grpc_t *g, grpc_call *call, ProtobufCMessage *req, arena_t *arena,
                    const api_grpc_ctx_t *ctx)
{
    api_grpc_watches_t *ws = api_grpc_watches(g);
    const char *wid = NULL;
    kiln_err_t err;
    watch_t *w = NULL;
    bool entered = api_grpc_stream_enter(g);
    if (!entered || !ws || svc_agent_watch(ctx->worker_id, (const Kiln__WatchWorkRequest *)req, &wid, &err) != 0 ||
        !(w = calloc(1, sizeof(*w))))
        goto fail;
    w->ws = ws;
    w->call = call;
    w->status = -1;
    kiln_strlcpy(w->worker_id, wid, sizeof(w->worker_id));
    w->send = (wtag_t){.hdr = {API_GRPC_TAG_FN, send_done}, .w = w};
    w->close = (wtag_t){.hdr = {API_GRPC_TAG_FN, close_done}, .w = w};
    protobuf_c_message_free_unpacked(req, NULL);
    req = NULL;
    arena_deinit(arena);
    free(arena);
    arena = NULL;
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &w->cancelled;
    if (grpc_call_start_batch(call, &op, 1, &w->close, NULL) != GRPC_CALL_OK) {
        free(w);
        w = NULL;
        goto fail;
    }
    /* From here the close frees the watch, however the call ends. */
    pthread_mutex_lock(&ws->mu);
    watch_t **b = bucket_of(ws, w->worker_id);
    for (watch_t *o = *b; o; o = o->next)
        if (!strcmp(o->worker_id, w->worker_id)) {
            unlist(ws, o);
            watch_end(o, GRPC_STATUS_ABORTED, "another WatchWork call of this worker replaced this one");
            break;
        }
    if (ws->n >= WATCH_MAX) {
        pthread_mutex_unlock(&ws->mu);
        log_warn("grpc: %d agents watch for work already; worker %s gets its work on heartbeats", WATCH_MAX,
                 w->worker_id);
        watch_end(w, GRPC_STATUS_RESOURCE_EXHAUSTED,
                  "kilnd holds as many work watches as it may; heartbeats still bring work");
        return;
    }
    w->next = *b;
    *b = w;
    w->listed = true;
    ws->n++;
    prom_add(&prom_watches, "", 1);
    watch_send(w); /* first: the agent heartbeats for whatever came before the watch */
    pthread_mutex_unlock(&ws->mu);
    return;
fail:
    grpc_call_cancel_with_status(call, GRPC_STATUS_UNAVAILABLE, "kilnd could not hold the watch", NULL);
    api_grpc_count(WATCH_METHOD, GRPC_STATUS_UNAVAILABLE, -1);
    grpc_call_unref(call);
    if (req)
        protobuf_c_message_free_unpacked(req, NULL);
    if (arena) {
        arena_deinit(arena);
        free(arena);
    }
    if (entered)
        api_grpc_stream_leave(g);
}

int api_grpc_watches_create(api_grpc_t *g, api_grpc_watches_t **out)
{
    api_grpc_watches_t *ws = calloc(1, sizeof(*ws));
    *out = ws;
    if (!ws)
        return KILN_ENOMEM;
    ws->g = g;
    prom_add(&prom_watches, "", 0); /* both written from the start, at 0 */
    prom_add(&prom_nudges, "", 0);
    pthread_mutex_init(&ws->mu, NULL);
    pthread_cond_init(&ws->cv, NULL);
    if (pthread_create(&ws->pacer, NULL, pacer_main, ws) != 0) {
        pthread_cond_destroy(&ws->cv);
        pthread_mutex_destroy(&ws->mu);
        free(ws);
        *out = NULL;
        return KILN_ENOMEM;
    }
    ws->pacer_on = true;
    svc_on_work(api_grpc_svc(g), watch_nudge, ws);
    return 0;
}

/* Stops and joins the pacer (once): no nudge is sent after it returns. */
static void pacer_stop(api_grpc_watches_t *ws)
{
    if (!ws->pacer_on)
        return;
    pthread_mutex_lock(&ws->mu);
    ws->stop = true;
    pthread_cond_signal(&ws->cv);
    pthread_mutex_unlock(&ws->mu);
    pthread_join(ws->pacer, NULL);
    ws->pacer_on = false;
}

void api_grpc_watches_unhook(api_grpc_watches_t *ws)
{
    if (!ws)
        return;
    svc_on_work(api_grpc_svc(ws->g), NULL, NULL);
    pacer_stop(ws);
}

void api_grpc_watches_free(api_grpc_watches_t *ws)
{
    if (!ws)
        return;
    pacer_stop(ws);
    pthread_cond_destroy(&ws->cv);
    pthread_mutex_destroy(&ws->mu);
    free(ws);
}
