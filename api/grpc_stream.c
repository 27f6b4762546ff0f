/* grpc_stream.c - TrainingService's server streams: StreamLogs (LogLine messages, history first
 * and then, with follow, live lines until the job ends), DownloadArtifact and DownloadCode (an
 * artifact's or a code archive's bytes in ArtifactData messages, read from the file as they are
 * sent). One thread per stream writes
 * one message at a time (the core allows one outstanding SEND_MESSAGE per call) and waits for
 * each send to complete; completions arrive on the server's queue and wake it. Not the REST SSE
 * stream. */
#include "api/grpc_int.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define STREAM_PAGE 1000
#define STREAM_ARTIFACT_PIECE (1 << 20)

typedef struct gstream gstream_t;

typedef struct stag {                /* a completion the stream thread waits for */
    api_grpc_tag_t hdr;
    gstream_t *st;
    bool pending, ok;
} stag_t;

struct gstream {
    api_grpc_t *g;
    grpc_call *call;
    ProtobufCMessage *req;           /* the method's request message */
    void (*run)(gstream_t *st);      /* what the stream sends */
    const char *method;              /* its path, for kiln_grpc_requests_total */
    arena_t *arena;                  /* holds who */
    const svc_caller_t *who;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    stag_t op;                       /* the current send */
    stag_t close;                    /* RECV_CLOSE_ON_SERVER: the call is over */
    int cancelled;
    bool woken;                      /* new lines for the follower */
    bool md_sent;                    /* initial metadata went out */
    bool status_sent;
    int64_t last_seq;                /* highest seq sent */
};

static void stag_done(api_grpc_tag_t *t, bool ok)
{
    stag_t *s = (stag_t *)t;
    gstream_t *st = s->st;
    pthread_mutex_lock(&st->mu);
    s->pending = false;
    s->ok = ok;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
}

static void follow_wake(void *ud)
{
    gstream_t *st = ud;
    pthread_mutex_lock(&st->mu);
    st->woken = true;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
}

/* Starts a batch on the op tag and waits for it. False when the call is gone. */
static bool stream_batch(gstream_t *st, grpc_op *ops, size_t n)
{
    pthread_mutex_lock(&st->mu);
    st->op.pending = true;
    pthread_mutex_unlock(&st->mu);
    if (grpc_call_start_batch(st->call, ops, n, &st->op, NULL) != GRPC_CALL_OK) {
        pthread_mutex_lock(&st->mu);
        st->op.pending = false;
        pthread_mutex_unlock(&st->mu);
        return false;
    }
    pthread_mutex_lock(&st->mu);
    while (st->op.pending)
        pthread_cond_wait(&st->cv, &st->mu);
    bool ok = st->op.ok;
    pthread_mutex_unlock(&st->mu);
    return ok;
}

static bool stream_send_msg(gstream_t *st, const ProtobufCMessage *m)
{
    size_t len = protobuf_c_message_get_packed_size(m);
    grpc_slice s = grpc_slice_malloc(len);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = bb;
    bool ok = stream_batch(st, &op, 1);
    grpc_byte_buffer_destroy(bb);
    return ok;
}

static bool stream_send_line(gstream_t *st, const json_t *line)
{
    arena_t arena;
    arena_init(&arena, 4096);
    ProtobufCMessage *m = api_grpc_json_to_msg(line, &kiln__log_line__descriptor, &arena);
    bool ok = stream_send_msg(st, m);
    arena_deinit(&arena);
    return ok;
}

/* Sends the lines of arr with seq above last_seq. False when the call is gone. */
static bool stream_send_lines(gstream_t *st, const json_t *arr)
{
    size_t i;
    json_t *line;
    json_array_foreach(arr, i, line) {
        int64_t seq = (int64_t)json_integer_value(json_object_get(line, "seq"));
        if (seq && seq <= st->last_seq)
            continue; /* history and the follower overlap by design */
        if (!stream_send_line(st, line))
            return false;
        if (seq)
            st->last_seq = seq;
    }
    return true;
}

static bool stream_gone(gstream_t *st)
{
    pthread_mutex_lock(&st->mu);
    bool gone = !st->close.pending || st->cancelled;
    pthread_mutex_unlock(&st->mu);
    return gone || api_grpc_stopping(st->g);
}

/* Sends the initial metadata, once, before the first message or the status. */
static bool stream_start_md(gstream_t *st)
{
    if (st->md_sent)
        return true;
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_SEND_INITIAL_METADATA;
    st->md_sent = stream_batch(st, &op, 1);
    return st->md_sent;
}

/* Ends the call: OK (err NULL) or the error, with its field and hint in the trailing metadata
 * as unary replies carry them. The status goes out at once, with the initial metadata when that
 * was not sent yet (a status alone, before it, is never delivered). */
static void stream_finish(gstream_t *st, const kiln_err_t *err)
{
    int rc = err ? (err->status ? err->status : KILN_EINTERNAL) : 0;
    char msg[1400] = "";
    api_grpc_err_md_t md = {0};
    if (err)
        api_grpc_err_text("a server stream", rc, err, msg, sizeof(msg), &md);
    grpc_slice details = grpc_slice_from_copied_string(msg);
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof(ops));
    if (!st->md_sent)
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)kiln_status_grpc(rc);
    ops[n].data.send_status_from_server.status_details = &details;
    ops[n].data.send_status_from_server.trailing_metadata_count = md.n;
    ops[n++].data.send_status_from_server.trailing_metadata = md.n ? md.md : NULL;
    st->status_sent = stream_batch(st, ops, n);
    st->md_sent = true;
    grpc_slice_unref(details);
    api_grpc_err_md_free(&md);
    api_grpc_count(st->method, (int)kiln_status_grpc(rc), -1);
}

/* A service error as the stream's status: "field: message" with the field and hint in the
 * trailing metadata, as unary calls give it. */
static void stream_finish_err(gstream_t *st, kiln_err_t *err)
{
    if (!err->status)
        err->status = KILN_EINTERNAL;
    stream_finish(st, err);
}

/* History, then (with follow) live lines until the job ends or the client goes away. */
static void logs_run(gstream_t *st)
{
    svc_t *s = api_grpc_svc(st->g);
    const Kiln__StreamLogsRequest *r = (const Kiln__StreamLogsRequest *)st->req;
    kiln_err_t err;
    kiln_err_clear(&err);
    svc_follow_t *f = NULL;
    json_t *page = NULL;
    int rank = r->has_rank ? r->rank : -1;
    int64_t since_us = 0;
    if (svc_check_time_text("since", r->since, &since_us, &err)) {
        stream_finish(st, &err);
        return;
    }
    /* A prefix is resolved once, not on every page. */
    char id[SVC_JOB_ID_SIZE];
    if (svc_job_resolve(s, st->who, r->id, id, &err) != 0) {
        stream_finish_err(st, &err);
        return;
    }
    /* Open the follower first: every line after this point reaches it, everything before is
     * in the history read below, and seq numbers remove the overlap. */
    int rc = r->follow ? svc_follow_open(s, st->who, id, rank, 0, follow_wake, st, &f, &err) : 0;
    if (rc) {
        if (!err.status)
            err.status = rc;
        stream_finish(st, &err);
        return;
    }
    for (;;) {
        svc_log_query_t q = {.rank = rank, .since_us = since_us, .after_seq = st->last_seq, .limit = STREAM_PAGE};
        rc = svc_job_logs(s, st->who, id, &q, &page, &err);
        if (rc) {
            if (!err.status)
                err.status = rc;
            stream_finish(st, &err);
            goto done;
        }
        if (!stream_start_md(st))
            goto done;
        json_t *lines = json_object_get(page, "lines");
        size_t n = json_array_size(lines);
        if (!stream_send_lines(st, lines))
            goto done;
        json_decref(page);
        page = NULL;
        if (n < STREAM_PAGE)
            break;
    }
    while (f && !stream_gone(st)) {
        json_t *arr = json_array();
        bool ended = false;
        json_t *end_info = NULL;
        pthread_mutex_lock(&st->mu);
        st->woken = false;
        pthread_mutex_unlock(&st->mu);
        int n = svc_follow_read(f, arr, STREAM_PAGE, &ended, &end_info);
        bool ok = stream_send_lines(st, arr);
        json_decref(arr);
        json_decref(end_info);
        if (!ok)
            goto done;
        if (ended)
            break;
        if (n > 0)
            continue;
        /* Nothing pending: sleep until woken, the client leaves, or a second passes. */
        struct timespec ts;
        kiln_deadline_in(&ts, 1000);
        pthread_mutex_lock(&st->mu);
        while (!st->woken && st->close.pending && !api_grpc_stopping(st->g))
            if (pthread_cond_timedwait(&st->cv, &st->mu, &ts) != 0)
                break;
        pthread_mutex_unlock(&st->mu);
    }
    if (!stream_gone(st))
        stream_finish(st, NULL);
done:
    json_decref(page);
    svc_follow_close(f);
}

/* An open file's bytes (f->fd, closed here) from offset, at most length (0: to the end), a piece
 * at a time; what names the file in messages ("artifact \"x\"", "code archive <digest>"). */
static void file_send(gstream_t *st, svc_artifact_file_t *f, int64_t offset, int64_t length, const char *what)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    uint8_t *buf = NULL;
    if (offset < 0 || offset > f->size || length < 0) {
        kiln_err_set(&err, length < 0 ? KILN_EINVAL : KILN_ERANGE, length < 0 ? "length" : "offset",
                     "offset must be 0 to %lld and length 0 or more (%s has %lld bytes)", (long long)f->size, what,
                     (long long)f->size);
        stream_finish_err(st, &err);
        goto done;
    }
    int64_t end = length > 0 && length < f->size - offset ? offset + length : f->size;
    if (!stream_start_md(st) || !(buf = malloc(STREAM_ARTIFACT_PIECE)))
        goto done;
    for (int64_t off = offset; off < end && !stream_gone(st);) {
        size_t want = (size_t)KILN_MIN((int64_t)STREAM_ARTIFACT_PIECE, end - off);
        ssize_t n = pread(f->fd, buf, want, (off_t)off);
        if (n <= 0) {
            kiln_err_set(&err, KILN_EIO, NULL, "could not read %s", what);
            stream_finish_err(st, &err);
            goto done;
        }
        Kiln__ArtifactData d = KILN__ARTIFACT_DATA__INIT;
        d.offset = off;
        d.data.data = buf;
        d.data.len = (size_t)n;
        d.size = f->size;
        d.sha256 = f->sha256;
        if (!stream_send_msg(st, &d.base))
            goto done;
        svc_artifact_served("grpc", n);
        off += n;
    }
    if (!stream_gone(st))
        stream_finish(st, NULL);
done:
    free(buf);
    close(f->fd);
}

/* The artifact's bytes from the request's offset, at most its length. */
static void artifact_run(gstream_t *st)
{
    const Kiln__DownloadArtifactRequest *r = (const Kiln__DownloadArtifactRequest *)st->req;
    svc_artifact_file_t f;
    kiln_err_t err;
    kiln_err_clear(&err);
    if (svc_job_artifact_open(api_grpc_svc(st->g), st->who, r->id, r->name, &f, &err) != 0) {
        stream_finish_err(st, &err);
        return;
    }
    char what[KILN_ARTIFACT_NAME_MAX + 16];
    snprintf(what, sizeof(what), "artifact \"%s\"", f.name);
    file_send(st, &f, r->offset, r->length, what);
}

/* A code archive's bytes (DownloadCode). */
static void code_run(gstream_t *st)
{
    const Kiln__DownloadCodeRequest *r = (const Kiln__DownloadCodeRequest *)st->req;
    svc_artifact_file_t f;
    kiln_err_t err;
    kiln_err_clear(&err);
    if (svc_code_open(api_grpc_svc(st->g), st->who, r->project, r->digest, &f, &err) != 0) {
        stream_finish_err(st, &err);
        return;
    }
    char what[96];
    snprintf(what, sizeof(what), "code archive %s", f.sha256);
    file_send(st, &f, r->offset, r->length, what);
}

static void *stream_main(void *arg)
{
    gstream_t *st = arg;
    st->run(st);
    /* A stream that ended without a status (client gone, server stopping) is cancelled; either
     * way the close completes once the call is over. */
    if (!st->status_sent)
        grpc_call_cancel(st->call, NULL);
    pthread_mutex_lock(&st->mu);
    while (st->close.pending)
        pthread_cond_wait(&st->cv, &st->mu);
    pthread_mutex_unlock(&st->mu);
    grpc_call_unref(st->call);
    protobuf_c_message_free_unpacked(st->req, NULL);
    arena_deinit(st->arena);
    free(st->arena);
    api_grpc_t *g = st->g;
    pthread_mutex_destroy(&st->mu);
    pthread_cond_destroy(&st->cv);
    free(st);
    api_grpc_stream_leave(g);
    return NULL;
}

static void stream_start(api_grpc_t *g, grpc_call *call, ProtobufCMessage *req, arena_t *arena,
                         const svc_caller_t *who, const char *method, void (*run)(gstream_t *st))
{
    gstream_t *st = NULL;
    if (!api_grpc_stream_enter(g)) {
        grpc_call_cancel(call, NULL);
        grpc_call_unref(call);
        protobuf_c_message_free_unpacked(req, NULL);
        arena_deinit(arena);
        free(arena);
        return;
    }
    st = calloc(1, sizeof(*st));
    if (!st)
        goto fail;
    st->g = g;
    st->call = call;
    st->req = req;
    st->run = run;
    st->method = method;
    st->arena = arena;
    st->who = who;
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, NULL);
    st->op = (stag_t){.hdr = {API_GRPC_TAG_FN, stag_done}, .st = st};
    st->close = (stag_t){.hdr = {API_GRPC_TAG_FN, stag_done}, .st = st, .pending = true};
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &st->cancelled;
    if (grpc_call_start_batch(call, &op, 1, &st->close, NULL) != GRPC_CALL_OK) {
        pthread_mutex_destroy(&st->mu);
        pthread_cond_destroy(&st->cv);
        goto fail;
    }
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, stream_main, st);
    pthread_attr_destroy(&attr);
    if (rc == 0)
        return;
    /* No thread: cancel and let the close tag complete before freeing. That needs waiting on a
     * completion-queue thread, which we are; leak the small stream rather than block. */
    log_error("grpc: could not start a stream thread");
    grpc_call_cancel(call, NULL);
    api_grpc_stream_leave(g);
    return;
fail:
    log_error("grpc: could not start a stream");
    free(st);
    grpc_call_cancel(call, NULL);
    grpc_call_unref(call);
    protobuf_c_message_free_unpacked(req, NULL);
    arena_deinit(arena);
    free(arena);
    api_grpc_stream_leave(g);
}

void api_grpc_stream_logs(api_grpc_t *g, grpc_call *call, ProtobufCMessage *req, arena_t *arena,
                          const api_grpc_ctx_t *ctx)
{
    stream_start(g, call, req, arena, ctx->who, "/kiln.TrainingService/StreamLogs", logs_run);
}

void api_grpc_stream_artifact(api_grpc_t *g, grpc_call *call, ProtobufCMessage *req, arena_t *arena,
                              const api_grpc_ctx_t *ctx)
{
    stream_start(g, call, req, arena, ctx->who, "/kiln.TrainingService/DownloadArtifact", artifact_run);
}

void api_grpc_stream_code(api_grpc_t *g, grpc_call *call, ProtobufCMessage *req, arena_t *arena,
                          const api_grpc_ctx_t *ctx)
{
    stream_start(g, call, req, arena, ctx->who, "/kiln.TrainingService/DownloadCode", code_run);
}
