/* grpc_int.h - internals shared by the gRPC server's files (grpc_server.c, grpc_training.c,
 * grpc_stream.c, grpc_codec.c, grpc_gate.c): the method table entry, streams, errors, the request
 * codec, the listening gate. Nothing outside api/grpc_*.c includes this (but the fuzz target
 * fuzz/spec_grpc.c, for the codec). */
#ifndef KILN_API_GRPC_INT_H
#define KILN_API_GRPC_INT_H

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>

#include "api/api.h"
#include "base/base.h"
#include "service/service.h"

/* Who a call comes from, as the server established it before the handler runs. */
typedef struct api_grpc_ctx {
    svc_t *svc;
    const svc_caller_t *who;          /* TrainingService: the user of the bearer token */
    const char *worker_id;            /* AgentService: the worker of the credential ("" without auth) */
    const svc_agent_peer_t *peer;     /* RegisterWorker: its join token, credential, certificate, address */
} api_grpc_ctx_t;

/* Handles one decoded request: fills *resp (allocated from arena, or NULL on error) and returns
 * 0 or a kiln status with err filled. Runs on a gRPC completion-queue thread. */
typedef int (*api_grpc_handler_fn)(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *arena,
                                   ProtobufCMessage **resp, kiln_err_t *err);

typedef struct api_grpc api_grpc_t;

/* A server-streaming method: takes ownership of call (unref it when done), req (free with
 * protobuf_c_message_free_unpacked) and arena (heap; arena_deinit and free it), which holds what
 * ctx points to (the authenticated caller; ctx itself does not outlive the call). Runs on a
 * completion-queue thread: must not block; start a thread for the stream, or park the call. */
typedef void (*api_grpc_stream_fn)(api_grpc_t *g, grpc_call *call, ProtobufCMessage *req, arena_t *arena,
                                   const api_grpc_ctx_t *ctx);

/* What a method needs from its caller: a user's bearer token, a join token or a worker's own
 * credential (RegisterWorker, the service checks which), or a worker's credential: of an
 * approved worker (the rest of AgentService) or of any registered one (Heartbeat, which tells a
 * worker that waits for approval so). */
typedef enum { API_GRPC_USER = 0, API_GRPC_JOIN, API_GRPC_AGENT, API_GRPC_HEARTBEAT } api_grpc_auth_t;

typedef struct api_grpc_method {
    const char *path;                            /* "/kiln.AgentService/Heartbeat" */
    const ProtobufCMessageDescriptor *req_desc;  /* request message type */
    api_grpc_handler_fn handle;                  /* unary methods; for a stream, its checks (no reply) */
    api_grpc_stream_fn stream;                   /* server-streaming methods */
    api_grpc_auth_t auth;
} api_grpc_method_t;

/* Every tag given to the server's completion queue starts with this. Tags of kind
 * API_GRPC_TAG_FN have done() called on a completion-queue thread; it must not block. */
enum { API_GRPC_TAG_CALL = 0, API_GRPC_TAG_FN = 1 };
typedef struct api_grpc_tag {
    int kind;
    void (*done)(struct api_grpc_tag *t, bool ok);
} api_grpc_tag_t;

/* TrainingService's methods (grpc_training.c, grpc_stream.c). */
extern const api_grpc_method_t api_grpc_training_methods[];
extern const size_t api_grpc_training_method_count;

/* For streams (grpc_server.c): the service, and the count of live streams api_grpc_stop()
 * waits for. api_grpc_stream_enter() returns false once the server is stopping. */
svc_t *api_grpc_svc(api_grpc_t *g);
bool api_grpc_stream_enter(api_grpc_t *g);
void api_grpc_stream_leave(api_grpc_t *g);
bool api_grpc_stopping(api_grpc_t *g);

/* The server-streaming StreamLogs, DownloadArtifact and DownloadCode (grpc_stream.c). */
void api_grpc_stream_logs(api_grpc_t *g, grpc_call *call, ProtobufCMessage *req, arena_t *arena,
                          const api_grpc_ctx_t *ctx);
void api_grpc_stream_artifact(api_grpc_t *g, grpc_call *call, ProtobufCMessage *req, arena_t *arena,
                              const api_grpc_ctx_t *ctx);
void api_grpc_stream_code(api_grpc_t *g, grpc_call *call, ProtobufCMessage *req, arena_t *arena,
                          const api_grpc_ctx_t *ctx);

/* WatchWork (grpc_watch.c): the agents' held streams, nudged when work for their worker is
 * committed. _create makes the table and hooks it to the service (svc_on_work); _unhook removes
 * the hook (before the server stops: no nudge after it returns); _free frees the table once the
 * server has stopped (every watch's close has completed). api_grpc_watches(g) is the server's. */
typedef struct api_grpc_watches api_grpc_watches_t;
int api_grpc_watches_create(api_grpc_t *g, api_grpc_watches_t **out);
void api_grpc_watches_unhook(api_grpc_watches_t *ws);
void api_grpc_watches_free(api_grpc_watches_t *ws);
api_grpc_watches_t *api_grpc_watches(api_grpc_t *g);
/* WatchWork's checks, before the call is parked: the worker is the credential's (svc_agent_watch). */
int api_grpc_watch_check(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *arena,
                         ProtobufCMessage **resp, kiln_err_t *err);
/* Parks a WatchWork call (it sends the first WorkNudge at once). */
void api_grpc_watch(api_grpc_t *g, grpc_call *call, ProtobufCMessage *req, arena_t *arena,
                    const api_grpc_ctx_t *ctx);
/* UploadCode (grpc_code.c): one piece of an upload; the last (finish) answers the source. */
int api_grpc_upload_code(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *arena,
                         ProtobufCMessage **resp, kiln_err_t *err);
/* FetchCode (grpc_code.c): a piece of the code archive an agent's assigned job names. */
int api_grpc_fetch_code(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *arena,
                        ProtobufCMessage **resp, kiln_err_t *err);

/* The trailing metadata of an error reply (grpc_server.c): kiln-code, kiln-field, kiln-hint and
 * kiln-detail, those that are not empty (proto/kiln.proto documents them). Caller's storage,
 * zero-initialised; _free releases the slices (and may be called on an empty one). */
typedef struct api_grpc_err_md {
    grpc_metadata md[4];
    size_t n;
} api_grpc_err_md_t;
void api_grpc_err_md_init(api_grpc_err_md_t *md, int rc, const kiln_err_t *err);
void api_grpc_err_md_free(api_grpc_err_md_t *md);
/* The status text of an error reply, unary or streaming: "field: message", then the detail and
 * the hint on lines of their own; logged (a warning for internal, database and I/O errors);
 * database and internal errors are replaced by a line that points to kilnd's log, and the
 * others get their trailing metadata in md. what names the call in the log. */
void api_grpc_err_text(const char *what, int rc, const kiln_err_t *err, char *full, size_t n,
                       api_grpc_err_md_t *md);

/* ---- the request codec (grpc_codec.c): pure functions, no gRPC calls ---- */
/* Checks every string field of an encoded message of type d (nested messages and map entries
 * included) before it is decoded: valid UTF-8 without NUL bytes, or KILN_EINVAL naming the
 * field by its dotted path. With known_only, a field number d's type does not declare is
 * KILN_EINVAL too, named by its path and number ("spec.200"): what kilnd would not read is
 * refused, as REST refuses unknown keys (TrainingService; agents' messages stay forward
 * compatible). A message that is not well-formed passes (the decoder refuses it). */
int api_grpc_wire_check(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len, bool known_only,
                        kiln_err_t *err);

/* JSON shaped like the REST API -> a message of type d, allocated from arena.
 * Keys are proto field names; "time" (RFC 3339) fills a missing time_us. */
ProtobufCMessage *api_grpc_json_to_msg(const json_t *j, const ProtobufCMessageDescriptor *d, arena_t *a);

/* A decoded request message -> the JSON the service takes (what the client set: proto3 scalars
 * and strings when they differ from their default, wrapper fields when present, partition_plan
 * text as the JSON it holds). *out (OUT): caller owns (json_decref), NULL on error. Returns 0, or
 * KILN_EINVAL when a value cannot be carried as the client meant it (NaN, Infinity, text that is
 * not UTF-8, an unsigned number past int64), err->field naming it by its dotted path under
 * prefix ("spec" gives "spec.hyperparameters.lr"). Thread-safe. */
int api_grpc_msg_to_json(const ProtobufCMessage *m, const char *prefix, json_t **out, kiln_err_t *err);

/* Counts a finished call for GET /metrics: kiln_grpc_requests_total{method,code} and, for
 * unary calls (seconds >= 0), kiln_grpc_request_duration_seconds{method}. */
void api_grpc_count(const char *method, int code, double seconds);

/* The gRPC port's listening socket, owned by kilnd (grpc_gate.c). _open binds and listens on addr
 * (KILN_EIO when it cannot; the port is taken now, so errors come before gRPC starts); _start
 * begins accepting and handing connections to fd_handler, the gRPC core's handler of its
 * "external:" port, once the server has started; _close stops accepting (before the gRPC server
 * shuts down: the handler dies with it), closes the sockets not yet handed over, frees the gate.
 * Accepts NULL. limits has its defaults filled in; tls (may be NULL) says whether clients speak
 * TLS and the oldest version to let through. */
typedef struct grpc_gate grpc_gate_t;
int grpc_gate_open(const char *addr, const api_net_limits_t *limits, const api_tls_t *tls, grpc_gate_t **out,
                   kiln_err_t *err);
int grpc_gate_start(grpc_gate_t *g, void *fd_handler, kiln_err_t *err);
void grpc_gate_close(grpc_gate_t *g);

#endif /* KILN_API_GRPC_INT_H */
