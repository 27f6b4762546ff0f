/* http_sse.c - GET /v1/jobs/{id}/logs?follow=true as Server-Sent Events: the stored history
 * first, then live lines from a service follower, then `event: end` (with id "end", so that a
 * reconnect after it is answered 204 and EventSource stops). MHD pulls data only when
 * the socket can take more, so a slow reader slows only its own stream (the follower refills
 * itself from the database); when nothing is ready the connection is suspended and the
 * follower's wake callback resumes it. Not the follower itself (service/). */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/http_int.h"

#define SSE_HISTORY_PAGE 1000
#define SSE_READ_MAX 1000          /* lines per svc_follow_read (one database page when refilling) */
#define SSE_BLOCK 8192             /* what MHD asks the reader for at a time (its buffer per stream) */
#define SSE_TRIM_QUIET_US 1000000  /* memory is given back once streams have stopped ending for this long */
#define SSE_TRIM_EVERY_US 10000000 /* or this long after streams began ending, if they keep ending */

typedef enum { SSE_HISTORY, SSE_LIVE, SSE_DONE } sse_phase_t;

struct http_stream {
    api_http_t *h;
    struct MHD_Connection *conn;
    svc_follow_t *follow;
    char job_id[64];
    int rank;
    int64_t since_us;
    int64_t last_seq;            /* highest seq sent: later copies of a line are skipped */
    sse_phase_t phase;
    json_t *lines;               /* scratch array for svc_follow_read */
    char *buf;                   /* bytes not yet handed to MHD: buf[off..len) */
    size_t len, off, cap;
    /* shared with the wake callback and the keep-alive thread, under lock */
    pthread_mutex_t lock;
    bool suspended;
    bool wake_pending;
    bool ping_due;
    int64_t last_write_us;       /* monotonic */
    http_stream_t *next, *prev;  /* in h->streams, under h->streams_lock */
};

/* ---- output buffer ------------------------------------------------------------------------- */

static bool sse_append(http_stream_t *s, const char *data, size_t n)
{
    if (s->len + n > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->len + n)
            cap *= 2;
        char *nb = realloc(s->buf, cap);
        if (!nb)
            return false;
        s->buf = nb;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, data, n);
    s->len += n;
    return true;
}

static void sse_event(http_stream_t *s, const char *event, const char *id, json_t *data)
{
    char *text = json_dumps(data, HTTP_JSON_FLAGS);
    if (!text)
        return;
    char head[96];
    int n = id ? snprintf(head, sizeof head, "id: %s\nevent: %s\ndata: ", id, event)
               : snprintf(head, sizeof head, "event: %s\ndata: ", event);
    sse_append(s, head, (size_t)n);
    sse_append(s, text, strlen(text));
    sse_append(s, "\n\n", 2);
    free(text);
}

/* Appends the lines of `arr` not yet sent, as `event: log`. */
static void sse_lines(http_stream_t *s, json_t *arr, bool live)
{
    size_t i;
    json_t *line;
    json_array_foreach(arr, i, line) {
        int64_t seq = json_integer_value(json_object_get(line, "seq"));
        if (seq && seq <= s->last_seq)
            continue;
        if (live && s->since_us) {
            int64_t t;
            const char *ts = json_string_value(json_object_get(line, "time"));
            if (ts && kiln_time_parse(ts, &t) == 0 && t < s->since_us)
                continue;
        }
        char id[32];
        snprintf(id, sizeof id, "%lld", (long long)seq);
        sse_event(s, "log", id, line);
        if (seq > s->last_seq)
            s->last_seq = seq;
    }
}

/* Reads one page of stored history after last_seq; moves to LIVE after the last page. */
static void sse_fill_history(http_stream_t *s)
{
    svc_log_query_t q = {.rank = s->rank, .since_us = s->since_us, .after_seq = s->last_seq,
                         .limit = SSE_HISTORY_PAGE};
    json_t *out = NULL;
    kiln_err_t err;
    kiln_err_clear(&err);
    /* The caller's access was checked when the stream opened (svc_follow_open). */
    int rc = svc_job_logs(s->h->svc, svc_caller_kilnd(), s->job_id, &q, &out, &err);
    if (rc) {
        json_t *e = json_pack("{s:s, s:s}", "code", kiln_status_code(err.status ? err.status : rc),
                              "message", err.message[0] ? err.message : kiln_strerror(rc));
        sse_event(s, "error", NULL, e);
        json_decref(e);
        log_warn("http: log stream for job %s: %s", s->job_id, err.message);
        s->phase = SSE_DONE;
        return;
    }
    json_t *lines = json_object_get(out, "lines");
    sse_lines(s, lines, false);
    if (json_array_size(lines) < SSE_HISTORY_PAGE)
        s->phase = SSE_LIVE;
    json_decref(out);
}

/* ---- MHD callbacks --------------------------------------------------------------------------- */

static ssize_t sse_read(void *cls, uint64_t pos, char *out, size_t max)
{
    http_stream_t *s = cls;
    (void)pos;
    for (;;) {
        if (s->off < s->len) {
            size_t n = KILN_MIN(max, s->len - s->off);
            memcpy(out, s->buf + s->off, n);
            s->off += n;
            pthread_mutex_lock(&s->lock);
            s->last_write_us = kiln_mono_us();
            pthread_mutex_unlock(&s->lock);
            return (ssize_t)n;
        }
        s->off = s->len = 0;
        if (s->phase == SSE_DONE || atomic_load(&s->h->stopping))
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (s->phase == SSE_HISTORY) {
            sse_fill_history(s);
            continue;
        }
        pthread_mutex_lock(&s->lock);
        bool ping = s->ping_due;
        s->ping_due = false;
        s->wake_pending = false;
        pthread_mutex_unlock(&s->lock);

        bool ended = false;
        json_t *end = NULL;
        json_array_clear(s->lines);
        svc_follow_read(s->follow, s->lines, SSE_READ_MAX, &ended, &end);
        sse_lines(s, s->lines, true);
        if (ended) {
            /* id "end": an EventSource that reconnects anyway sends it back as Last-Event-ID and
             * is answered 204, which makes it stop (http_job_logs) */
            sse_event(s, "end", "end", end ? end : json_object());
            json_decref(end);
            s->phase = SSE_DONE;
        }
        if (s->len == 0 && ping)
            sse_append(s, ": ping\n\n", 8);
        if (s->len)
            continue;

        /* Nothing to send: sleep until the follower or the keep-alive thread wakes us, without
         * the buffer (a stream waits far longer than it writes). The check and the suspension
         * happen under the lock the wakers take, so no wake is lost. */
        free(s->buf);
        s->buf = NULL;
        s->cap = 0;
        pthread_mutex_lock(&s->lock);
        if (s->wake_pending || s->ping_due || atomic_load(&s->h->stopping)) {
            pthread_mutex_unlock(&s->lock);
            continue;
        }
        s->suspended = true;
        MHD_suspend_connection(s->conn);
        pthread_mutex_unlock(&s->lock);
        return 0;
    }
}

static void sse_resume_locked(http_stream_t *s)
{
    if (s->suspended) {
        s->suspended = false;
        MHD_resume_connection(s->conn);
    }
}

/* svc_follow_wake_fn: new lines or the end are ready. Runs on an ingesting thread. */
static void sse_wake(void *ud)
{
    http_stream_t *s = ud;
    pthread_mutex_lock(&s->lock);
    s->wake_pending = true;
    sse_resume_locked(s);
    pthread_mutex_unlock(&s->lock);
}

static void sse_destroy(http_stream_t *s)
{
    if (!s)
        return;
    svc_follow_close(s->follow); /* no wake after this returns */
    json_decref(s->lines);
    free(s->buf);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* MHD is done with the response (stream ended or client gone). */
static void sse_free(void *cls)
{
    http_stream_t *s = cls;
    api_http_t *h = s->h;
    pthread_mutex_lock(&h->streams_lock);
    if (s->prev)
        s->prev->next = s->next;
    else
        h->streams = s->next;
    if (s->next)
        s->next->prev = s->prev;
    h->nstreams--;
    h->streams_closed++;
    h->last_close_us = kiln_mono_us();
    pthread_mutex_unlock(&h->streams_lock);
    log_debug("http: log stream for job %s closed (last seq %lld)", s->job_id,
              (long long)s->last_seq);
    sse_destroy(s);
}

enum MHD_Result http_sse_start(http_req_t *r, int rank, int64_t after_seq, int64_t since_us)
{
    api_http_t *h = r->h;
    kiln_err_t err;
    kiln_err_clear(&err);
    if (atomic_load(&h->stopping))
        return http_reply_errf(r, KILN_EUNAVAIL, NULL, "retry against another kilnd",
                               "server is shutting down");
    http_stream_t *s = calloc(1, sizeof *s);
    if (!s)
        return MHD_NO;
    pthread_mutex_init(&s->lock, NULL);
    s->h = h;
    s->conn = r->conn;
    s->rank = rank;
    s->since_us = since_us;
    s->last_seq = after_seq;
    s->phase = SSE_HISTORY;
    s->last_write_us = kiln_mono_us();
    kiln_strlcpy(s->job_id, r->id, sizeof s->job_id);
    s->lines = json_array();
    /* Follower first, then history: a line landing in between is in one of them (or both,
     * and last_seq drops the copy). */
    int rc = svc_follow_open(h->svc, &r->who, r->id, rank, after_seq, sse_wake, s, &s->follow, &err);
    if (rc) {
        sse_destroy(s);
        if (!err.status)
            err.status = rc;
        return http_reply_err(r, &err);
    }
    /* The first history page here, so an unknown job is a plain 404 rather than a stream. */
    svc_log_query_t q = {.rank = rank, .since_us = since_us, .after_seq = after_seq,
                         .limit = SSE_HISTORY_PAGE};
    json_t *out = NULL;
    rc = svc_job_logs(h->svc, &r->who, r->id, &q, &out, &err);
    if (rc) {
        sse_destroy(s);
        if (!err.status)
            err.status = rc;
        return http_reply_err(r, &err);
    }
    sse_append(s, "retry: 2000\n\n", 13);
    json_t *lines = json_object_get(out, "lines");
    sse_lines(s, lines, false);
    if (json_array_size(lines) < SSE_HISTORY_PAGE)
        s->phase = SSE_LIVE;
    json_decref(out);

    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK, sse_read,
                                                                  s, sse_free);
    if (!resp) {
        sse_destroy(s);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    pthread_mutex_lock(&h->streams_lock);
    s->next = h->streams;
    if (h->streams)
        h->streams->prev = s;
    h->streams = s;
    h->nstreams++;
    pthread_mutex_unlock(&h->streams_lock);
    log_debug("http: log stream for job %s opened (rank %d, after seq %lld)", s->job_id, rank,
              (long long)after_seq);
    enum MHD_Result ret = http_reply_raw(r, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp); /* the connection holds its own reference; sse_free runs later */
    return ret;
}

/* ---- keep-alive and shutdown ------------------------------------------------------------------ */

/* Gives the memory streams freed back to the system, once they have stopped ending for a moment
 * (or every SSE_TRIM_EVERY_US while they keep ending). What a stream holds (its TLS session, its
 * connection's pool, its buffers and follower) is freed when it ends, but glibc keeps freed memory
 * in the arena of the thread that used it, and each of libmicrohttpd's threads has its own: after
 * many followers, hundreds of MB would stay resident, free but never reused by the others. */
static void sse_trim(api_http_t *h, int64_t now)
{
    pthread_mutex_lock(&h->streams_lock);
    bool due = h->streams_closed > 0 &&
               (now - h->last_close_us >= SSE_TRIM_QUIET_US || now - h->last_trim_us >= SSE_TRIM_EVERY_US);
    int closed = h->streams_closed;
    if (due) {
        h->streams_closed = 0;
        h->last_trim_us = now;
    }
    pthread_mutex_unlock(&h->streams_lock);
    if (!due)
        return;
#ifdef __GLIBC__
    int64_t t0 = kiln_mono_us();
    malloc_trim(0);
    log_debug("http: %d log stream(s) ended; gave freed memory back in %.1f ms", closed,
              (double)(kiln_mono_us() - t0) / 1000.0);
#else
    (void)closed;
#endif
}

/* Every second, marks streams silent for the ping interval and wakes the suspended ones, so
 * each sends `: ping` (and a vanished client is noticed when the write fails); gives memory back
 * after streams end. */
static void *sse_ping_main(void *arg)
{
    api_http_t *h = arg;
    int64_t ping_us = (int64_t)h->ping_ms * 1000;
    int64_t tick_ms = KILN_MIN(1000, KILN_MAX(10, ping_us / 1000 / 4));
    h->last_trim_us = kiln_mono_us();
    pthread_mutex_lock(&h->ping_lock);
    while (!atomic_load(&h->stopping)) {
        struct timespec ts;
        kiln_deadline_in(&ts, tick_ms);
        pthread_cond_timedwait(&h->ping_cond, &h->ping_lock, &ts);
        if (atomic_load(&h->stopping))
            break;
        int64_t now = kiln_mono_us();
        pthread_mutex_lock(&h->streams_lock);
        for (http_stream_t *s = h->streams; s; s = s->next) {
            pthread_mutex_lock(&s->lock);
            if (now - s->last_write_us >= ping_us) {
                s->ping_due = true;
                s->last_write_us = now; /* one ping per interval even if the socket is full */
                sse_resume_locked(s);
            }
            pthread_mutex_unlock(&s->lock);
        }
        pthread_mutex_unlock(&h->streams_lock);
        sse_trim(h, now);
    }
    pthread_mutex_unlock(&h->ping_lock);
    return NULL;
}

int http_sse_init(api_http_t *h, kiln_err_t *err)
{
    if (pthread_create(&h->ping_thread, NULL, sse_ping_main, h) != 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not start the log stream keep-alive thread");
    h->ping_started = true;
    return 0;
}

void http_sse_shutdown(api_http_t *h)
{
    if (h->ping_started) {
        pthread_mutex_lock(&h->ping_lock);
        pthread_cond_broadcast(&h->ping_cond);
        pthread_mutex_unlock(&h->ping_lock);
        pthread_join(h->ping_thread, NULL);
        h->ping_started = false;
    }
    /* With stopping set, a resumed stream ends at its next read and none suspends again. */
    pthread_mutex_lock(&h->streams_lock);
    for (http_stream_t *s = h->streams; s; s = s->next) {
        pthread_mutex_lock(&s->lock);
        sse_resume_locked(s);
        pthread_mutex_unlock(&s->lock);
    }
    pthread_mutex_unlock(&h->streams_lock);
    /* Give the streams a moment to finish their chunked replies, so clients see a clean end
     * (and reconnect with Last-Event-ID) instead of a cut connection. A client that does not
     * read is cut by MHD_stop_daemon after this. */
    for (int waited = 0; waited < 2000; waited += 10) {
        pthread_mutex_lock(&h->streams_lock);
        int n = h->nstreams;
        pthread_mutex_unlock(&h->streams_lock);
        if (n == 0)
            break;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}
