/* http_int.h - internals shared by the REST front end's files (http.c: daemon, dispatch and
 * replies; http_routes.c: one handler per route; http_range.c: the Range header; http_frame.c:
 * a request's body framing; http_sse.c: live log streams; http_conn.c: connection limits and
 * deadlines). Nothing outside api/http*.c includes this header (but the fuzz targets
 * fuzz/http_range.c and fuzz/http_frame.c, for the pure functions of those two files). */
#ifndef KILN_API_HTTP_INT_H
#define KILN_API_HTTP_INT_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "api/api.h"
#include "api/net_int.h"
#include "spec/spec.h"

#define HTTP_MAX_BODY (1024 * 1024)      /* bigger request bodies get 413 */
#define HTTP_JSON_FLAGS (JSON_COMPACT | SPEC_JSON_REALS)

typedef struct http_req http_req_t;

/* The route table (http_routes.c): one row per method and path pattern. A pattern's "{name}"
 * matches one path segment without '/' or ':' ("/v1/jobs/{id}:stop"); GET rows answer HEAD too.
 * Every row needs a valid API token unless flagged HTTP_OPEN (HTTP_PROM: open unless kilnd runs
 * with --metrics-auth).
 * HTTP_STREAM rows take a body of bytes (application/gzip or application/octet-stream), not
 * JSON, of any size the route allows, through the callbacks http_stream_routes gives their
 * handle.
 * args names the query parameters the route takes (NULL-terminated; NULL: none). The router
 * refuses any other with a 400 naming it, after authentication and before the handler, so no
 * route ignores a parameter it does not read. HTTP_PAGE rows (the web UI's pages, which a browser
 * opens from links that may carry parameters of their own, such as a campaign's) take any and read
 * none: the UI routes by the URL's fragment. */
enum { HTTP_OPEN = 1 << 0, HTTP_PROM = 1 << 1, HTTP_STREAM = 1 << 2, HTTP_PAGE = 1 << 3 };
typedef struct http_route {
    const char *method;
    const char *pattern;
    enum MHD_Result (*handle)(http_req_t *r);
    int flags;
    const char *const *args;
} http_route_t;
/* A streamed body's callbacks: body() is called once before any of it arrives (data NULL), after
 * the request passed every check of a JSON route and authentication, and then for each piece as
 * it arrives; a refusal before the body is answered at once (the body is never read), one during
 * the body when it has ended. handle() answers once the whole body is in; done() runs when the
 * request ends, answered or not (it releases what body() holds in r->stream). */
typedef struct http_stream_route {
    enum MHD_Result (*handle)(http_req_t *r);
    int (*body)(http_req_t *r, const char *data, size_t n, kiln_err_t *err);
    void (*done)(http_req_t *r);
} http_stream_route_t;
extern const http_stream_route_t http_stream_routes[];
extern const size_t http_stream_route_count;
extern const http_route_t http_routes[];
extern const size_t http_route_count;
#define HTTP_MAX_PARAMS 4

typedef struct http_stream http_stream_t;
typedef struct http_conn http_conn_t;

struct api_http {
    struct MHD_Daemon *daemon;
    svc_t *svc;                      /* borrowed */
    char addr[128];
    bool tls;
    bool metrics_auth;
    int ping_ms;                     /* SSE keep-alive comment interval */
    char **cors;                     /* allowed browser origins (heap copies), ncors of them */
    int ncors;
    char *tls_cert, *tls_key;        /* PEM held for the daemon's lifetime */
    atomic_bool stopping;
    /* live SSE streams, for keep-alive pings and shutdown */
    pthread_mutex_t streams_lock;
    http_stream_t *streams;          /* doubly linked through http_stream.next/prev */
    int nstreams;
    int streams_closed;              /* since the memory was last given back (http_sse.c) */
    int64_t last_close_us, last_trim_us;
    pthread_t ping_thread;
    bool ping_started;
    pthread_mutex_t ping_lock;
    pthread_cond_t ping_cond;
    /* connections (http_conn.c): limits, each one's record and the counts per client address
     * (under http_conn.c's lock), and the thread that cuts those past their deadlines */
    api_net_limits_t limits;         /* defaults filled in */
    int max_connections;
    http_conn_t *conns;
    api_addr_counts_t addrs;
    bool conn_init;
    pthread_t reaper;
    bool reaper_started;
    pthread_mutex_t reaper_lock;
    pthread_cond_t reaper_cond;
};

/* One request's state, from MHD's first call to its completion notice. Allocated on the heap,
 * everything it points to comes from its arena. */
struct http_req {
    api_http_t *h;
    struct MHD_Connection *conn;
    arena_t arena;                   /* request-scoped memory */
    const char *method;
    const char *path;                /* the URL path without the query (borrowed from MHD) */
    int route;                       /* index into http_routes, -1 when nothing matched */
    char allow[64];                  /* methods the path has, when route is -1 but a pattern matched */
    const char *param_names[HTTP_MAX_PARAMS];
    const char *param_values[HTTP_MAX_PARAMS]; /* in arena */
    int nparams;
    const char *id;                  /* the "id" parameter, or NULL */
    const char *cors_origin;         /* the request's Origin when it is allowed (borrowed), or NULL */
    svc_caller_t who;                /* the authenticated caller (strings in arena) */
    char *body;                      /* upload, in arena, NUL-terminated */
    size_t body_len, body_cap;
    bool body_too_big;
    void *stream;                    /* HTTP_STREAM: what the route's body() holds */
    bool stream_open;                /* HTTP_STREAM: body() accepted the request */
    bool stream_failed;              /* ... and then refused a piece: stream_err, answered at the end */
    kiln_err_t stream_err;
    int64_t stream_dropped;          /* bytes dropped after the refusal */
    bool answered;
    int status;                      /* HTTP status queued */
    int64_t start_us;
};

/* ---- replies (http.c). Each returns what the MHD access handler must return. ---- */
/* Queues `body` (stolen; may be NULL for an empty object) as JSON with `status`. */
enum MHD_Result http_reply_json(http_req_t *r, int status, json_t *body);
/* Queues the error JSON {code, message, detail, hint, field?} for err (status from its table). */
enum MHD_Result http_reply_err(http_req_t *r, const kiln_err_t *err);
/* The same with one more response header (a 416's Content-Range). */
enum MHD_Result http_reply_err_header(http_req_t *r, const kiln_err_t *err, const char *header, const char *value);
/* Shorthand: an error built from status, field (may be NULL) and a formatted message. */
enum MHD_Result http_reply_errf(http_req_t *r, int status, const char *field, const char *hint,
                                const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Queues a response without a body (204 No Content). */
enum MHD_Result http_reply_status(http_req_t *r, int status);
/* Queues an arbitrary response (not stolen: the caller destroys it) and records the status. */
enum MHD_Result http_reply_raw(http_req_t *r, int status, struct MHD_Response *resp);
/* A query-string argument, or NULL. Borrowed from MHD for the request's lifetime. */
const char *http_arg(http_req_t *r, const char *name);
/* A request header, or NULL. */
const char *http_header(http_req_t *r, const char *name);

/* A path parameter ("{name}" of the route's pattern), or NULL. Borrowed from the request. */
const char *http_param(http_req_t *r, const char *name);

/* ---- routes (http_routes.c) ---- */
/* Serves an open file (f->fd, which the reply takes over) as a download: its SHA-256 as the
 * ETag, If-None-Match (304), a single byte Range (206, or 416), content_type, and f->name as the
 * attachment's file name. */
enum MHD_Result http_reply_file(http_req_t *r, svc_artifact_file_t *f, const char *content_type);

/* ---- code archives (http_code.c) ---- */
/* POST /v1/code?project=P (HTTP_STREAM): body() streams the archive into the project's upload,
 * http_code_upload answers its source (201; 200 when the project had uploaded those bytes),
 * http_code_done drops an upload the request did not finish. GET /v1/code/{digest}?project=P:
 * the archive (members). */
int http_code_body(http_req_t *r, const char *data, size_t n, kiln_err_t *err);
enum MHD_Result http_code_upload(http_req_t *r);
void http_code_done(http_req_t *r);
enum MHD_Result http_code_get(http_req_t *r);
/* Parses a decimal integer argument in [lo, hi]; 0 and *out set, or KILN_EINVAL into err. */
int http_arg_int(http_req_t *r, const char *name, int64_t lo, int64_t hi, int64_t *out,
                 bool *present, kiln_err_t *err);

/* One byte range of a representation of size bytes (http_range.c), from a Range header h:
 * "bytes=first-last", "bytes=first-" or "bytes=-suffix". Returns 1 with [*first, *last] (OUT)
 * for a satisfiable range (0 <= first <= last < size), 0 when the header is to be ignored (not
 * a single byte range: the whole file is sent), -1 when it is unsatisfiable (416). Pure. */
int http_range_parse(const char *h, int64_t size, int64_t *first, int64_t *last);

/* A request's body framing (http_frame.c), gathered from its header lines before the body is read:
 * how many Content-Length and Transfer-Encoding lines it has, the first of each, and whether its
 * Content-Length lines disagree. Zero it, then http_frame_header each line (key, value). */
typedef struct http_frame {
    int nlength, nencoding;
    const char *length, *encoding;  /* the first line's value (borrowed) */
    bool lengths_differ;
} http_frame_t;
void http_frame_header(http_frame_t *f, const char *key, const char *value);
/* Whether the framing can be trusted: 0; KILN_EFORMAT (err->field "Content-Length" or
 * "Transfer-Encoding") for lengths that disagree, a length beside an encoding, two encodings or
 * one other than chunked; KILN_ETOOBIG for a length past max_body. A length that is not a number
 * (http_length_ok) is left to libmicrohttpd, which refuses it itself. Pure. */
int http_frame_check(const http_frame_t *f, uint64_t max_body, kiln_err_t *err);
/* Whether s is a Content-Length libmicrohttpd reads: decimal digits only, below 2^64. Pure. */
bool http_length_ok(const char *s);

/* 0 when every query argument is one of names (NULL-terminated), each given once; else
 * KILN_EINVAL naming the first given twice, or the first unknown one (err->field) with the
 * nearest known name as a hint. */
int http_args_known(http_req_t *r, const char *const *names, kiln_err_t *err);
/* ---- the web UI (http_ui.c; the assets are generated at build time by ui/build.mjs) ---- */
typedef struct http_ui_asset {
    const char *name;                /* "index.html", "app-1a2b3c4d.js" */
    const char *content_type;
    const char *etag;                /* "\"<sha-256 prefix of the bytes>\"" */
    const unsigned char *data;
    size_t len;
    const unsigned char *gz;         /* the same bytes gzipped, or NULL when that is not smaller */
    size_t gz_len;
    bool immutable;                  /* the name carries a hash of the content: cache it for a year */
} http_ui_asset_t;
extern const http_ui_asset_t http_ui_assets[];
extern const size_t http_ui_asset_count;
/* GET / and /ui: index.html. GET /ui/{asset}: one asset. Open (the page asks for a token). */
enum MHD_Result http_ui_index(http_req_t *r);
enum MHD_Result http_ui_asset(http_req_t *r);

/* ---- connections (http_conn.c) ---- */
/* libmicrohttpd's accept policy (cls: the api_http_t): refuses a client address that holds its
 * limit already. */
enum MHD_Result http_conn_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen);
/* MHD_OPTION_NOTIFY_CONNECTION (cls: the api_http_t): records a connection when it opens (and
 * cuts it when its address is over the limit), forgets it when it closes. */
void http_conn_notify(void *cls, struct MHD_Connection *mc, void **socket_context,
                      enum MHD_ConnectionNotificationCode code);
/* Where a connection's request is, which sets the deadline it must meet next: its headers are
 * in (the body is due), its body is in (it is being answered, no deadline), it is done (the
 * connection waits for the next request). Called on the connection's libmicrohttpd thread. */
typedef enum { HTTP_CONN_HEADERS, HTTP_CONN_BODY, HTTP_CONN_DONE } http_conn_event_t;
void http_conn_request(struct MHD_Connection *mc, http_conn_event_t ev);
/* Sets up the counts and starts the reaper (h->limits set): 0, KILN_ENOMEM or KILN_EIO. */
int http_conn_init(api_http_t *h, kiln_err_t *err);
/* Stops the reaper (h->stopping set); _deinit frees the counts after MHD_stop_daemon. */
void http_conn_stop(api_http_t *h);
void http_conn_deinit(api_http_t *h);

/* ---- live log streams (http_sse.c) ---- */
/* GET /v1/jobs/{id}/logs?follow=true: opens a follower and queues a Server-Sent Events reply.
 * rank -1 for every rank; after_seq from after_seq / Last-Event-ID; since_us 0 for no bound. */
enum MHD_Result http_sse_start(http_req_t *r, int rank, int64_t after_seq, int64_t since_us);
/* Starts the keep-alive thread. Returns 0 or KILN_EIO. */
int http_sse_init(api_http_t *h, kiln_err_t *err);
/* Sets every stream to end and resumes the suspended ones (before MHD_stop_daemon); joins the
 * keep-alive thread. Call with h->stopping set. */
void http_sse_shutdown(api_http_t *h);

#endif /* KILN_API_HTTP_INT_H */
