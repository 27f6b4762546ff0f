/* grpc_server.c - kilnd's gRPC front end over the gRPC C core: method paths registered by hand
 * (protoc-c makes messages only), TLS (and client certificates for agents) through the core's SSL
 * credentials, requests armed ahead on one completion queue served by a few threads, the caller
 * established from the call's metadata (a user's bearer token, the join token, or a worker's
 * credential), protobuf-c decode -> service/ -> encode, kiln statuses mapped to gRPC statuses.
 * Unknown methods get UNIMPLEMENTED. The TrainingService conversions live in grpc_training.c. */
#include "api/api.h"
#include "api/grpc_int.h"
#include "api/net_int.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define GRPC_THREADS 2
#define GRPC_ARMED 8                 /* requests kept armed per method */
#define GRPC_MAX_MESSAGE (16 << 20)

enum { STAGE_REQUEST = 0, STAGE_REPLY = 1 };

typedef struct gcall {
    api_grpc_tag_t tag;              /* kind API_GRPC_TAG_CALL; first, so the tag is the call */
    api_grpc_t *g;
    int method;                      /* index into k_methods, -1 for the generic (unknown) request */
    int stage;
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_call_details details;       /* generic requests only */
    grpc_byte_buffer *payload;
    grpc_byte_buffer *reply;
    grpc_slice status_details;
    bool has_details;
    api_grpc_err_md_t err_md;        /* trailing metadata of an error reply */
    int cancelled;
    int64_t start_us;                /* when the request arrived (kiln_mono_us) */
} gcall_t;

struct api_grpc {
    svc_t *svc;
    grpc_server *server;
    grpc_completion_queue *cq;
    void **rm;                       /* registered method handles, per k_methods entry */
    pthread_t threads[GRPC_THREADS];
    int nthreads;
    atomic_bool shutting_down;
    bool started;
    int shutdown_tag;
    pthread_mutex_t mu;              /* arming, shutdown_done, busy */
    pthread_cond_t cv;
    bool shutdown_done;
    int busy;                        /* threads handling a request (they may still start a batch) */
    int streams;                     /* live server streams (grpc_stream.c) */
    bool tls;
    bool agent_certs;                /* mutual TLS: AgentService calls need a verified client certificate */
    grpc_gate_t *gate;               /* kilnd's listening socket (NULL when gRPC listens itself) */
    api_grpc_watches_t *watches;     /* WatchWork's held streams (grpc_watch.c) */
    void *gate_handler;              /* filled by the core: its handler of the "external:" port */
};

/* ---- AgentService handlers ------------------------------------------------------------------ */

static Kiln__Ack *ack_new(arena_t *arena)
{
    Kiln__Ack *ack = arena_alloc(arena, sizeof(*ack));
    kiln__ack__init(ack);
    ack->ok = true;
    return ack;
}

static int h_register(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *arena,
                      ProtobufCMessage **resp, kiln_err_t *err)
{
    Kiln__RegisterResponse *out = arena_alloc(arena, sizeof(*out));
    kiln__register_response__init(out);
    *resp = &out->base;
    return svc_agent_register_as(ctx->svc, (const Kiln__RegisterRequest *)req, ctx->peer, arena, out, err);
}

static int h_heartbeat(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *arena,
                       ProtobufCMessage **resp, kiln_err_t *err)
{
    Kiln__HeartbeatResponse *out = arena_alloc(arena, sizeof(*out));
    kiln__heartbeat_response__init(out);
    *resp = &out->base;
    return svc_agent_heartbeat(ctx->svc, ctx->worker_id, (const Kiln__HeartbeatRequest *)req, arena, out, err);
}

static int h_status(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *arena,
                    ProtobufCMessage **resp, kiln_err_t *err)
{
    *resp = &ack_new(arena)->base;
    return svc_agent_rank_status(ctx->svc, ctx->worker_id, (const Kiln__RankStatus *)req, err);
}

static int h_logs(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *arena,
                  ProtobufCMessage **resp, kiln_err_t *err)
{
    *resp = &ack_new(arena)->base;
    return svc_agent_logs(ctx->svc, ctx->worker_id, (const Kiln__LogBatch *)req, err);
}

static int h_metrics(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *arena,
                     ProtobufCMessage **resp, kiln_err_t *err)
{
    *resp = &ack_new(arena)->base;
    return svc_agent_metrics(ctx->svc, ctx->worker_id, (const Kiln__MetricBatch *)req, err);
}

static int h_exit(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *arena,
                  ProtobufCMessage **resp, kiln_err_t *err)
{
    *resp = &ack_new(arena)->base;
    return svc_agent_rank_exit(ctx->svc, ctx->worker_id, (const Kiln__RankExit *)req, err);
}

static int h_report_batch(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *arena,
                          ProtobufCMessage **resp, kiln_err_t *err)
{
    Kiln__ReportBatchReply *out = arena_alloc(arena, sizeof(*out));
    kiln__report_batch_reply__init(out);
    *resp = &out->base;
    return svc_agent_report_batch(ctx->svc, ctx->worker_id, (const Kiln__ReportBatchRequest *)req, arena, out, err);
}

static int h_artifacts_begin(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *arena,
                             ProtobufCMessage **resp, kiln_err_t *err)
{
    Kiln__ArtifactManifestReply *out = arena_alloc(arena, sizeof(*out));
    kiln__artifact_manifest_reply__init(out);
    *resp = &out->base;
    return svc_agent_artifacts_begin(ctx->svc, ctx->worker_id, (const Kiln__ArtifactManifest *)req, arena, out, err);
}

static int h_artifact_chunk(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *arena,
                            ProtobufCMessage **resp, kiln_err_t *err)
{
    Kiln__ArtifactChunkReply *out = arena_alloc(arena, sizeof(*out));
    kiln__artifact_chunk_reply__init(out);
    *resp = &out->base;
    return svc_agent_artifact_chunk(ctx->svc, ctx->worker_id, (const Kiln__ArtifactChunk *)req, out, err);
}

static int h_init_model(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *arena,
                        ProtobufCMessage **resp, kiln_err_t *err)
{
    Kiln__InitModelChunk *out = arena_alloc(arena, sizeof(*out));
    kiln__init_model_chunk__init(out);
    *resp = &out->base;
    return svc_agent_init_model(ctx->svc, ctx->worker_id, (const Kiln__InitModelRequest *)req, arena, out, err);
}

static int h_checkpoint_fetch(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *arena,
                              ProtobufCMessage **resp, kiln_err_t *err)
{
    Kiln__CheckpointChunk *out = arena_alloc(arena, sizeof(*out));
    kiln__checkpoint_chunk__init(out);
    *resp = &out->base;
    return svc_agent_checkpoint_fetch(ctx->svc, ctx->worker_id, (const Kiln__CheckpointRequest *)req, arena, out,
                                      err);
}

static const api_grpc_method_t k_agent_methods[] = {
    {"/kiln.AgentService/RegisterWorker", &kiln__register_request__descriptor, h_register, NULL, API_GRPC_JOIN},
    {"/kiln.AgentService/Heartbeat", &kiln__heartbeat_request__descriptor, h_heartbeat, NULL, API_GRPC_HEARTBEAT},
    {"/kiln.AgentService/ReportRankStatus", &kiln__rank_status__descriptor, h_status, NULL, API_GRPC_AGENT},
    {"/kiln.AgentService/PushLogs", &kiln__log_batch__descriptor, h_logs, NULL, API_GRPC_AGENT},
    {"/kiln.AgentService/PushMetrics", &kiln__metric_batch__descriptor, h_metrics, NULL, API_GRPC_AGENT},
    {"/kiln.AgentService/ReportRankExit", &kiln__rank_exit__descriptor, h_exit, NULL, API_GRPC_AGENT},
    {"/kiln.AgentService/ReportBatch", &kiln__report_batch_request__descriptor, h_report_batch, NULL, API_GRPC_AGENT},
    {"/kiln.AgentService/BeginArtifacts", &kiln__artifact_manifest__descriptor, h_artifacts_begin, NULL, API_GRPC_AGENT},
    {"/kiln.AgentService/PutArtifactChunk", &kiln__artifact_chunk__descriptor, h_artifact_chunk, NULL, API_GRPC_AGENT},
    {"/kiln.AgentService/FetchInitModel", &kiln__init_model_request__descriptor, h_init_model, NULL, API_GRPC_AGENT},
    {"/kiln.AgentService/FetchCode", &kiln__code_request__descriptor, api_grpc_fetch_code, NULL, API_GRPC_AGENT},
    {"/kiln.AgentService/FetchCheckpoint", &kiln__checkpoint_request__descriptor, h_checkpoint_fetch, NULL,
     API_GRPC_AGENT},
    {"/kiln.AgentService/WatchWork", &kiln__watch_work_request__descriptor, api_grpc_watch_check, api_grpc_watch,
     API_GRPC_AGENT},
};

/* Every method the server answers: AgentService, then TrainingService (grpc_training.c). */
static const api_grpc_method_t *method_at(size_t i)
{
    if (i < KILN_ARRAY_LEN(k_agent_methods))
        return &k_agent_methods[i];
    return &api_grpc_training_methods[i - KILN_ARRAY_LEN(k_agent_methods)];
}

static size_t method_count(void)
{
    return KILN_ARRAY_LEN(k_agent_methods) + api_grpc_training_method_count;
}

size_t api_grpc_methods(api_route_info_t *out, size_t max)
{
    size_t n = method_count();
    for (size_t i = 0; i < n && i < max; i++) {
        const api_grpc_method_t *m = method_at(i);
        out[i].method = NULL;
        out[i].path = m->path;
        out[i].open = m->auth == API_GRPC_JOIN;
        out[i].agent = m->auth != API_GRPC_USER;
    }
    return n;
}

/* ---- calls -------------------------------------------------------------------------------- */

static void gcall_free(gcall_t *c)
{
    if (!c)
        return;
    if (c->call)
        grpc_call_unref(c->call);
    grpc_metadata_array_destroy(&c->md);
    if (c->method < 0)
        grpc_call_details_destroy(&c->details);
    if (c->payload)
        grpc_byte_buffer_destroy(c->payload);
    if (c->reply)
        grpc_byte_buffer_destroy(c->reply);
    if (c->has_details)
        grpc_slice_unref(c->status_details);
    api_grpc_err_md_free(&c->err_md);
    free(c);
}

/* Asks the server for the next call of a method (or any unknown method for -1). */
static void grpc_arm(api_grpc_t *g, int method)
{
    gcall_t *c = calloc(1, sizeof(*c));
    if (!c) {
        log_error("grpc: out of memory arming a request");
        return;
    }
    c->g = g;
    c->method = method;
    c->stage = STAGE_REQUEST;
    grpc_metadata_array_init(&c->md);
    grpc_call_error e;
    /* Under the lock, so no request is armed once api_grpc_stop() has begun (the server may be
     * destroyed right after). */
    pthread_mutex_lock(&g->mu);
    if (atomic_load(&g->shutting_down)) {
        pthread_mutex_unlock(&g->mu);
        gcall_free(c);
        return;
    }
    if (method >= 0) {
        e = grpc_server_request_registered_call(g->server, g->rm[method], &c->call, &c->deadline, &c->md,
                                                &c->payload, g->cq, g->cq, c);
    } else {
        grpc_call_details_init(&c->details);
        e = grpc_server_request_call(g->server, &c->call, &c->details, &c->md, g->cq, g->cq, c);
    }
    pthread_mutex_unlock(&g->mu);
    if (e != GRPC_CALL_OK) {
        if (!atomic_load(&g->shutting_down))
            log_error("grpc: could not arm a request: %s", grpc_call_error_to_string(e));
        gcall_free(c);
    }
}

/* Sends the reply (message when status is OK) and the status; the call is freed when the batch
 * completes. */
static void grpc_reply(gcall_t *c, grpc_status_code status, const char *message)
{
    grpc_op ops[4];
    size_t n = 0;
    memset(ops, 0, sizeof(ops));
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (status == GRPC_STATUS_OK && c->reply) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = c->reply;
    }
    c->status_details = grpc_slice_from_copied_string(message ? message : "");
    c->has_details = true;
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = status;
    ops[n].data.send_status_from_server.trailing_metadata_count = c->err_md.n;
    ops[n].data.send_status_from_server.trailing_metadata = c->err_md.n ? c->err_md.md : NULL;
    ops[n++].data.send_status_from_server.status_details = &c->status_details;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
    c->stage = STAGE_REPLY;
    api_grpc_count(c->method >= 0 ? method_at((size_t)c->method)->path : "unknown", (int)status,
                   (double)(kiln_mono_us() - c->start_us) / 1e6);
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, c, NULL);
    if (e != GRPC_CALL_OK) {
        log_error("grpc: could not send a reply: %s", grpc_call_error_to_string(e));
        gcall_free(c);
    }
}

static void grpc_reply_err(gcall_t *c, const api_grpc_method_t *m, int rc, const kiln_err_t *err);

static prom_family_t grpc_requests = PROM_FAMILY("kiln_grpc_requests_total",
                                                 "gRPC calls answered, by method and status code.", PROM_COUNTER);
static prom_family_t grpc_duration = PROM_HISTOGRAM_FAMILY(
    "kiln_grpc_request_duration_seconds", "Time from a unary gRPC call's arrival to its reply, by method.",
    prom_latency_buckets);

void api_grpc_count(const char *method, int code, double seconds)
{
    static const char *const names[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                                        "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                        "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
                                        "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
    char labels[256];
    prom_label(labels, sizeof labels - 48, "method", method);
    size_t l = strlen(labels);
    labels[l++] = ',';
    prom_label_lower(labels + l, sizeof labels - l, "code",
                     code >= 0 && code < (int)KILN_ARRAY_LEN(names) ? names[code] : "UNKNOWN");
    prom_add(&grpc_requests, labels, 1);
    if (seconds >= 0) {
        prom_label(labels, sizeof labels, "method", method);
        prom_observe(&grpc_duration, labels, seconds);
    }
}

/* The value of a metadata key (lower case), or NULL; *len its length. Borrowed from the call. */
static const char *md_get(const grpc_metadata_array *md, const char *key, size_t *len)
{
    size_t kl = strlen(key);
    for (size_t i = 0; i < md->count; i++) {
        const grpc_slice *k = &md->metadata[i].key;
        if (GRPC_SLICE_LENGTH(*k) == kl && !memcmp(GRPC_SLICE_START_PTR(*k), key, kl)) {
            *len = GRPC_SLICE_LENGTH(md->metadata[i].value);
            return (const char *)GRPC_SLICE_START_PTR(md->metadata[i].value);
        }
    }
    return NULL;
}

/* A metadata value as a string in arena (NULL when absent); "authorization" loses its "Bearer ". */
static const char *md_str(const grpc_metadata_array *md, const char *key, arena_t *arena)
{
    size_t len = 0;
    const char *v = md_get(md, key, &len);
    if (!v)
        return NULL;
    if (!strcmp(key, "authorization")) {
        if (len < 7 || strncasecmp(v, "Bearer ", 7) != 0)
            return NULL;
        v += 7;
        len -= 7;
    }
    if (len > 512)
        len = 512; /* longer than any secret kilnd hands out: it fails the check */
    return arena_strndup(arena, v, len);
}

/* The SHA-256 of the client certificate the call's TLS session presented, allocated from arena
 * (NULL without one); under mutual TLS an agent's calls must present one. */
static int grpc_peer_cert(api_grpc_t *g, gcall_t *c, arena_t *arena, const char **out, kiln_err_t *err)
{
    *out = NULL;
    grpc_auth_context *ac = grpc_call_auth_context(c->call);
    int ok = ac && grpc_auth_context_peer_is_authenticated(ac);
    const grpc_auth_property *pem = NULL;
    if (ok) {
        grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(ac, GRPC_X509_PEM_CERT_PROPERTY_NAME);
        pem = grpc_auth_property_iterator_next(&it);
    }
    int rc = 0;
    if (pem && pem->value) {
        char *hex = arena_alloc(arena, SVC_CERT_HEX);
        rc = svc_cert_sha256(pem->value, pem->value_length, hex, err);
        *out = rc ? NULL : hex;
    }
    grpc_auth_context_release(ac);
    if (rc == 0 && g->agent_certs && !*out) {
        kiln_err_set(err, KILN_EUNAUTH, NULL, "agents must present a client certificate signed by kilnd's --tls-ca");
        kiln_err_hint(err, "start kiln-agent with --tls-cert and --tls-key");
        return KILN_EUNAUTH;
    }
    return rc ? KILN_EUNAUTH : 0;
}

/* The caller's address without its port ("127.0.0.1", "::1"), from arena. */
static const char *grpc_peer_address(gcall_t *c, arena_t *arena)
{
    char *peer = grpc_call_get_peer(c->call);
    const char *p = peer ? peer : "";
    if (!strncmp(p, "ipv4:", 5) || !strncmp(p, "ipv6:", 5))
        p += 5;
    size_t len = strlen(p);
    if (*p == '[' || !strncasecmp(p, "%5B", 3)) {
        /* "[::1]:port", or URI-escaped "%5B::1%5D:port" */
        size_t open = *p == '[' ? 1 : 3;
        const char *close = open == 1 ? strchr(p, ']') : strcasestr(p, "%5D");
        len = close ? (size_t)(close - p) - open : len - open;
        p += open;
    } else if (strchr(p, ':') == strrchr(p, ':') && strchr(p, ':')) {
        len = (size_t)(strrchr(p, ':') - p); /* host:port */
    }
    const char *out = arena_strndup(arena, p, KILN_MIN(len, 63));
    gpr_free(peer);
    return out;
}

/* Establishes the caller of a call from its metadata (and, for agents, its client certificate
 * under mutual TLS: a worker is bound to the one it registered with). */
static int grpc_authenticate(api_grpc_t *g, gcall_t *c, const api_grpc_method_t *m, arena_t *arena,
                             api_grpc_ctx_t *ctx, kiln_err_t *err)
{
    const char *bearer = md_str(&c->md, "authorization", arena);
    const char *cert = NULL;
    if (m->auth != API_GRPC_USER) {
        int rc = grpc_peer_cert(g, c, arena, &cert, err);
        if (rc)
            return rc;
    }
    switch (m->auth) {
    case API_GRPC_USER: {
        svc_caller_t *who = arena_alloc(arena, sizeof(*who));
        int rc = svc_auth_user(g->svc, bearer, arena, who, err);
        ctx->who = who;
        return rc;
    }
    case API_GRPC_JOIN: {
        /* which of the join token and the worker's credential counts is the service's call */
        svc_agent_peer_t *peer = arena_alloc(arena, sizeof(*peer));
        *peer = (svc_agent_peer_t){.join_token = bearer, .credential = md_str(&c->md, "kiln-worker-credential", arena),
                                   .cert_sha256 = cert, .address = grpc_peer_address(c, arena)};
        ctx->peer = peer;
        return 0;
    }
    case API_GRPC_AGENT:
    case API_GRPC_HEARTBEAT: {
        char *wid = arena_alloc(arena, 64); /* worker ids are shorter (store's limit) */
        int rc = svc_auth_agent(g->svc, bearer, cert, m->auth == API_GRPC_HEARTBEAT, wid, 64, err);
        ctx->worker_id = wid;
        return rc;
    }
    }
    return KILN_EINTERNAL;
}

static void grpc_handle(api_grpc_t *g, gcall_t *c)
{
    if (c->method < 0) {
        char msg[300];
        size_t ml = GRPC_SLICE_LENGTH(c->details.method);
        snprintf(msg, sizeof(msg), "unknown method %.*s", (int)KILN_MIN(ml, 200),
                 (const char *)GRPC_SLICE_START_PTR(c->details.method));
        log_debug("grpc: %s", msg);
        grpc_reply(c, GRPC_STATUS_UNIMPLEMENTED, msg);
        return;
    }
    const api_grpc_method_t *m = method_at((size_t)c->method);
    if (!c->payload) {
        grpc_reply(c, GRPC_STATUS_INVALID_ARGUMENT, "request message is missing");
        return;
    }
    /* Who is calling, before the request is even decoded. */
    arena_t *arena = malloc(sizeof(*arena));
    if (!arena) {
        grpc_reply(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    arena_init(arena, 0);
    kiln_err_t err;
    kiln_err_clear(&err);
    api_grpc_ctx_t ctx = {.svc = g->svc, .worker_id = ""};
    int rc = grpc_authenticate(g, c, m, arena, &ctx, &err);
    if (rc) {
        arena_deinit(arena);
        free(arena);
        grpc_reply_err(c, m, rc, &err);
        return;
    }
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, c->payload)) {
        grpc_reply(c, GRPC_STATUS_INVALID_ARGUMENT, "request message could not be read");
        return;
    }
    grpc_slice in = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    /* Text fields are checked on the wire, where an embedded NUL is still visible. */
    rc = api_grpc_wire_check(m->req_desc, GRPC_SLICE_START_PTR(in), GRPC_SLICE_LENGTH(in), m->auth == API_GRPC_USER,
                             &err);
    if (rc) {
        grpc_slice_unref(in);
        arena_deinit(arena);
        free(arena);
        grpc_reply_err(c, m, rc, &err);
        return;
    }
    ProtobufCMessage *req = protobuf_c_message_unpack(m->req_desc, NULL, GRPC_SLICE_LENGTH(in),
                                                      GRPC_SLICE_START_PTR(in));
    grpc_slice_unref(in);
    if (!req) {
        char msg[200];
        snprintf(msg, sizeof(msg), "request is not a valid %s message", m->req_desc->name);
        arena_deinit(arena);
        free(arena);
        grpc_reply(c, GRPC_STATUS_INVALID_ARGUMENT, msg);
        return;
    }
    ProtobufCMessage *resp = NULL;
    if (m->stream) {
        rc = m->handle ? m->handle(&ctx, req, arena, &resp, &err) : 0;
        if (rc) {
            protobuf_c_message_free_unpacked(req, NULL);
            arena_deinit(arena);
            free(arena);
            grpc_reply_err(c, m, rc, &err);
            return;
        }
        /* the stream owns the call, the request and the arena (with the caller) from here */
        grpc_call *call = c->call;
        c->call = NULL;
        gcall_free(c);
        m->stream(g, call, req, arena, &ctx);
        return;
    }
    rc = m->handle(&ctx, req, arena, &resp, &err);
    protobuf_c_message_free_unpacked(req, NULL);
    if (rc == 0 && resp) {
        size_t len = protobuf_c_message_get_packed_size(resp);
        grpc_slice out = grpc_slice_malloc(len);
        protobuf_c_message_pack(resp, GRPC_SLICE_START_PTR(out));
        c->reply = grpc_raw_byte_buffer_create(&out, 1);
        grpc_slice_unref(out);
        arena_deinit(arena);
        free(arena);
        grpc_reply(c, GRPC_STATUS_OK, "");
        return;
    }
    arena_deinit(arena);
    free(arena);
    if (rc == 0)
        rc = kiln_err_set(&err, KILN_EINTERNAL, NULL, "%s produced no reply", m->path);
    grpc_reply_err(c, m, rc, &err);
}

void api_grpc_err_text(const char *what, int rc, const kiln_err_t *err, char *full, size_t n,
                       api_grpc_err_md_t *md)
{
    const char *msg = err->message[0] ? err->message : kiln_strerror(rc);
    if (err->field[0] && strncmp(msg, err->field, strlen(err->field)) != 0)
        snprintf(full, n, "%s: %s", err->field, msg);
    else
        snprintf(full, n, "%s", msg);
    /* gRPC has one message: the detail (a filter's caret drawing) and the hint follow it on
     * lines of their own. */
    if (err->detail[0])
        snprintf(full + strlen(full), n - strlen(full), "\n%s", err->detail);
    if (err->hint[0])
        snprintf(full + strlen(full), n - strlen(full), "\nhint: %s", err->hint);
    if (rc == KILN_EINTERNAL || rc == KILN_EDB || rc == KILN_EIO)
        log_warn("grpc: %s failed: %s", what, full);
    else
        log_debug("grpc: %s: %s", what, full);
    /* As on REST: the database's own text and internal errors stay in kilnd's log. */
    if (rc == KILN_EDB)
        snprintf(full, n, "the database is unavailable; kilnd's log has the details");
    else if (rc == KILN_EINTERNAL)
        snprintf(full, n, "internal error; kilnd's log has the details");
    else
        api_grpc_err_md_init(md, rc, err);
}

/* Sends a kiln error as the call's status (api_grpc_err_text). */
static void grpc_reply_err(gcall_t *c, const api_grpc_method_t *m, int rc, const kiln_err_t *err)
{
    char full[1400];
    api_grpc_err_text(m->path, rc, err, full, sizeof(full), &c->err_md);
    grpc_reply(c, (grpc_status_code)kiln_status_grpc(rc), full);
}

static void *grpc_thread_main(void *arg)
{
    api_grpc_t *g = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(g->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        if (ev.tag == &g->shutdown_tag) {
            pthread_mutex_lock(&g->mu);
            g->shutdown_done = true;
            pthread_cond_broadcast(&g->cv);
            pthread_mutex_unlock(&g->mu);
            continue;
        }
        if (((api_grpc_tag_t *)ev.tag)->kind == API_GRPC_TAG_FN) {
            api_grpc_tag_t *t = ev.tag;
            t->done(t, ev.success != 0);
            continue;
        }
        gcall_t *c = ev.tag;
        if (c->stage == STAGE_REPLY) {
            gcall_free(c);
            continue;
        }
        if (!ev.success) {
            /* the server is shutting down and gave the armed request back */
            gcall_free(c);
            continue;
        }
        pthread_mutex_lock(&g->mu);
        g->busy++;
        pthread_mutex_unlock(&g->mu);
        grpc_arm(g, c->method); /* keep the method armed before doing the work */
        c->start_us = kiln_mono_us();
        grpc_handle(g, c);
        pthread_mutex_lock(&g->mu);
        if (--g->busy == 0)
            pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
    }
    return NULL;
}

/* ---- error details ------------------------------------------------------------------------- */

/* A metadata value: printable ASCII (what non-binary metadata may hold), other characters
 * escaped (KILN_TEXT_ASCII). */
static grpc_slice md_value(const char *s)
{
    char buf[600];
    kiln_text_escape(buf, sizeof(buf), s, strlen(s), KILN_TEXT_ASCII);
    return grpc_slice_from_copied_string(buf);
}

void api_grpc_err_md_init(api_grpc_err_md_t *md, int rc, const kiln_err_t *err)
{
    api_grpc_err_md_free(md);
    const char *keys[] = {"kiln-code", "kiln-field", "kiln-hint", "kiln-detail"};
    const char *vals[] = {kiln_status_code(rc), err->field, err->hint, err->detail};
    for (size_t i = 0; i < KILN_ARRAY_LEN(keys); i++) {
        if (!vals[i] || !vals[i][0])
            continue;
        md->md[md->n].key = grpc_slice_from_static_string(keys[i]);
        md->md[md->n].value = md_value(vals[i]);
        md->n++;
    }
}

void api_grpc_err_md_free(api_grpc_err_md_t *md)
{
    for (size_t i = 0; i < md->n; i++) {
        grpc_slice_unref(md->md[i].key);
        grpc_slice_unref(md->md[i].value);
    }
    md->n = 0;
}

/* ---- streams ------------------------------------------------------------------------------ */

svc_t *api_grpc_svc(api_grpc_t *g) { return g->svc; }

bool api_grpc_stopping(api_grpc_t *g) { return atomic_load(&g->shutting_down); }

api_grpc_watches_t *api_grpc_watches(api_grpc_t *g) { return g->watches; }

bool api_grpc_stream_enter(api_grpc_t *g)
{
    pthread_mutex_lock(&g->mu);
    bool ok = !atomic_load(&g->shutting_down);
    if (ok)
        g->streams++;
    pthread_mutex_unlock(&g->mu);
    return ok;
}

void api_grpc_stream_leave(api_grpc_t *g)
{
    pthread_mutex_lock(&g->mu);
    if (--g->streams == 0)
        pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

/* The server argument through which the core hands kilnd its handler of the "external:" port
 * (grpc_gate.c): a pointer to where it writes it, copied as is. */
#define GATE_PORT "external:kiln-gate"
static void *gate_arg_copy(void *p) { return p; }
static void gate_arg_destroy(void *p) { (void)p; }
static int gate_arg_cmp(void *p, void *q) { return p < q ? -1 : p > q; }
static const grpc_arg_pointer_vtable gate_arg_vtable = {gate_arg_copy, gate_arg_destroy, gate_arg_cmp};

int api_grpc_start(svc_t *svc, const char *addr, const api_tls_t *tls, api_grpc_t **out, kiln_err_t *err)
{
    api_grpc_config_t cfg = {.addr = addr, .tls = tls};
    return api_grpc_start_with(svc, &cfg, out, err);
}

int api_grpc_start_with(svc_t *svc, const api_grpc_config_t *cfg, api_grpc_t **out, kiln_err_t *err)
{
    prom_register(&grpc_requests);
    prom_register(&grpc_duration);
    api_net_init();
    *out = NULL;
    const char *addr = cfg->addr ? cfg->addr : "";
    const api_tls_t *tls = cfg->tls;
    api_net_limits_t limits = api_net_limits_or_default(&cfg->limits);
    api_grpc_t *g = calloc(1, sizeof(*g));
    if (!g)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    g->svc = svc;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    atomic_init(&g->shutting_down, false);
    g->tls = tls && tls->cert_pem && tls->key_pem;
    /* The port is kilnd's (grpc_gate.c) unless it is a unix socket: taken first, so that a busy
     * port fails before gRPC starts. */
    bool gated = !cfg->gate_off && strncmp(addr, "unix:", 5) != 0 && strncmp(addr, "unix-abstract:", 14) != 0;
    if (gated && grpc_gate_open(addr, &limits, tls, &g->gate, err) != 0) {
        pthread_cond_destroy(&g->cv);
        pthread_mutex_destroy(&g->mu);
        free(g);
        return KILN_EIO;
    }
    /* The TLS policy's TLS 1.2 suites (net.c), read by the core once, when it first makes TLS
     * credentials; TLS 1.3 suites are OpenSSL's, all AEAD. */
    if (g->tls)
        setenv("GRPC_SSL_CIPHER_SUITES", api_tls_openssl_ciphers(), 1);
    grpc_init();
    size_t nm = method_count();
    g->rm = calloc(nm, sizeof(void *));
    grpc_arg args[] = {
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, .value.integer = GRPC_MAX_MESSAGE},
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, .value.integer = GRPC_MAX_MESSAGE},
        /* a second kilnd on the same port must fail, not share it silently */
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_ALLOW_REUSEPORT, .value.integer = 0},
        /* the TLS handshake's deadline (the gate waited for the ClientHello within the same) */
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, .value.integer = limits.handshake_ms},
        /* a connection without calls is closed after the idle timeout; one whose client stopped
         * answering (a stream to a vanished host) is found by a ping */
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_MAX_CONNECTION_IDLE_MS, .value.integer = limits.idle_ms},
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_KEEPALIVE_TIME_MS, .value.integer = limits.idle_ms},
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_KEEPALIVE_TIMEOUT_MS, .value.integer = 20000},
        {.type = GRPC_ARG_POINTER, .key = (char *)GATE_PORT,
         .value.pointer = {.p = &g->gate_handler, .vtable = &gate_arg_vtable}},
    };
    grpc_channel_args ca = {.num_args = KILN_ARRAY_LEN(args) - (gated ? 0 : 1), .args = args};
    g->server = grpc_server_create(&ca, NULL);
    g->cq = grpc_completion_queue_create_for_next(NULL);
    if (!g->rm || !g->server || !g->cq) {
        kiln_err_set(err, KILN_EIO, NULL, "could not create the gRPC server");
        goto fail;
    }
    grpc_server_register_completion_queue(g->server, g->cq, NULL);
    if (api_grpc_watches_create(g, &g->watches) != 0) {
        kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < nm; i++) {
        g->rm[i] = grpc_server_register_method(g->server, method_at(i)->path, NULL,
                                               GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
        if (!g->rm[i]) {
            kiln_err_set(err, KILN_EINTERNAL, NULL, "could not register gRPC method %s", method_at(i)->path);
            goto fail;
        }
    }
    grpc_server_credentials *creds = NULL;
    if (g->tls) {
        grpc_ssl_pem_key_cert_pair pair = {.private_key = tls->key_pem, .cert_chain = tls->cert_pem};
        g->agent_certs = tls->ca_pem != NULL;
        /* With a CA, every client is asked for a certificate and one that is sent must verify;
         * agents must send one (checked per call), other clients need not. */
        creds = grpc_ssl_server_credentials_create_ex(
            tls->ca_pem, &pair, 1,
            g->agent_certs ? GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            NULL);
    } else {
        creds = grpc_insecure_server_credentials_create();
    }
    /* Gated, the core's port is "external:": it returns no port number, and its handler in
     * gate_handler says it was made. */
    int port = creds ? grpc_server_add_http2_port(g->server, gated ? GATE_PORT : addr, creds) : 0;
    if (creds)
        grpc_server_credentials_release(creds);
    if (gated ? !g->gate_handler : port <= 0) {
        kiln_err_set(err, KILN_EIO, NULL, "could not listen for gRPC on %s%s", addr, g->tls ? " with TLS" : "");
        kiln_err_hint(err, gated ? "do --tls-cert, --tls-key (and --tls-ca) hold valid PEM?"
                          : g->tls ? "is the address valid and the port free, and do --tls-cert, --tls-key "
                                     "(and --tls-ca) hold valid PEM?"
                                   : "is the address valid and the port free? (--grpc-addr)");
        goto fail;
    }
    grpc_server_start(g->server);
    g->started = true;
    for (size_t i = 0; i < nm; i++)
        for (int k = 0; k < GRPC_ARMED; k++)
            grpc_arm(g, (int)i);
    for (int k = 0; k < 2; k++)
        grpc_arm(g, -1);
    for (int t = 0; t < GRPC_THREADS; t++) {
        if (pthread_create(&g->threads[t], NULL, grpc_thread_main, g) != 0) {
            kiln_err_set(err, KILN_EIO, NULL, "could not start gRPC threads");
            goto fail;
        }
        g->nthreads++;
    }
    if (g->gate && grpc_gate_start(g->gate, g->gate_handler, err) != 0)
        goto fail;
    log_info("gRPC listening on %s (%s, %zu methods%s)", addr,
             !g->tls ? "plain text" : g->agent_certs ? "TLS, agents need client certificates" : "TLS", nm,
             g->gate ? "" : ", no per-address limit");
    *out = g;
    return 0;
fail:
    api_grpc_stop(g);
    return err ? err->status : KILN_EIO;
}

void api_grpc_stop(api_grpc_t *g)
{
    if (!g)
        return;
    api_grpc_watches_unhook(g->watches); /* no nudge from here on */
    grpc_gate_close(g->gate); /* no connection is handed to the core from here on */
    g->gate = NULL;
    pthread_mutex_lock(&g->mu);
    atomic_store(&g->shutting_down, true);
    pthread_mutex_unlock(&g->mu);
    if (g->server && !g->started) {
        grpc_server_destroy(g->server);
    } else if (g->server) {
        grpc_server_shutdown_and_notify(g->server, g->cq, &g->shutdown_tag);
        grpc_server_cancel_all_calls(g->server);
        if (g->nthreads > 0) {
            /* and until no thread is between taking a request and starting its reply batch:
             * that batch needs the completion queue alive */
            pthread_mutex_lock(&g->mu);
            while (!g->shutdown_done || g->busy > 0 || g->streams > 0)
                pthread_cond_wait(&g->cv, &g->mu);
            pthread_mutex_unlock(&g->mu);
        } else {
            /* no thread to see the tag: drain it here */
            for (;;) {
                grpc_event ev = grpc_completion_queue_next(g->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
                if (ev.type != GRPC_OP_COMPLETE || ev.tag == &g->shutdown_tag)
                    break;
                gcall_free(ev.tag);
            }
        }
        grpc_server_destroy(g->server);
    }
    if (g->cq) {
        grpc_completion_queue_shutdown(g->cq);
        for (int t = 0; t < g->nthreads; t++)
            pthread_join(g->threads[t], NULL);
        if (g->nthreads == 0)
            while (grpc_completion_queue_next(g->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN)
                ;
        grpc_completion_queue_destroy(g->cq);
    }
    api_grpc_watches_free(g->watches);
    free(g->rm);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
    grpc_shutdown();
}
