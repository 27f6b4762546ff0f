/* http.c - kilnd's REST front end: the libmicrohttpd daemon (TLS through GnuTLS), request
 * collection (bodies arrive over several calls), routing by the route table's patterns, what
 * every request goes through before its handler (CORS preflights, JSON-only bodies, the bearer
 * token), JSON and error replies, request logging. The handlers and the table live in
 * http_routes.c, live log streams in http_sse.c; no business logic here. */
#include <arpa/inet.h>
#include <ctype.h>
#include <dlfcn.h>
#include <gnutls/gnutls.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "api/http_int.h"

/* ---- replies ------------------------------------------------------------------------------ */

/* What GET /metrics reports of REST: requests by route and status, their latency by route. */
static prom_family_t http_requests = PROM_FAMILY("kiln_http_requests_total",
                                                 "REST requests answered, by route and HTTP status.", PROM_COUNTER);
static prom_family_t http_duration = PROM_HISTOGRAM_FAMILY(
    "kiln_http_request_duration_seconds", "Time from a REST request's headers to its completion, by route "
    "(a live log stream counts until it ends).", prom_latency_buckets);

/* route="GET /v1/jobs" (the table's pattern; "unknown" for paths no route has) into out. */
static char *http_route_label(const http_req_t *r, char *out, size_t n)
{
    char route[160];
    if (r->route >= 0)
        snprintf(route, sizeof route, "%s %s", http_routes[r->route].method, http_routes[r->route].pattern);
    else
        snprintf(route, sizeof route, "unknown");
    return prom_label(out, n, "route", route);
}

static void http_count(http_req_t *r, int status)
{
    r->status = status;
    r->answered = true;
    char labels[256], code[16];
    http_route_label(r, labels, sizeof labels - 32);
    snprintf(code, sizeof code, "%d", status);
    size_t l = strlen(labels);
    labels[l++] = ',';
    prom_label(labels + l, sizeof labels - l, "status", code);
    prom_add(&http_requests, labels, 1);
}

#define HTTP_CORS_EXPOSE "Content-Type, WWW-Authenticate, Allow, ETag, Content-Range, Content-Disposition, Accept-Ranges"

/* ---- libmicrohttpd's own error pages -------------------------------------------------------
 * libmicrohttpd answers some requests itself, before any handler runs: a malformed request line
 * or header (400), a URL or header block larger than its buffer (414, 431), a Content-Length it
 * cannot read or take (400, 413), a chunk size it cannot read (400, 413), an HTTP version it does
 * not speak (505). Version 0.9.75 sends HTML pages compiled into it and has no option or callback
 * to change or prevent them (the access handler is not called for these requests), but it queues
 * them through its exported MHD_queue_response. kilnd defines MHD_queue_response here, so the
 * dynamic linker sends those calls to it: a response kilnd built itself (http_reply_raw marks its
 * own call) passes through, and the library's own error pages are replaced by kiln's JSON error.
 * Statically linked, the two definitions collide at link time; a libmicrohttpd without the
 * symbol stops kilnd at the first call (http_real_queue).
 *
 * A Content-Length libmicrohttpd cannot read is found after the headers, and 0.9.75 then builds
 * the status line and headers of its answer twice (its state machine moves on from
 * HEADERS_RECEIVED as if no answer had been queued, reaches START_REPLY and builds them again):
 * the client would read two header blocks, then the body. That answer is written here instead,
 * in one piece, and libmicrohttpd closes the connection (http_reply_direct). */

typedef enum MHD_Result (*http_queue_fn)(struct MHD_Connection *, unsigned int, struct MHD_Response *);
static _Thread_local bool http_own_queue;

static http_queue_fn http_real_queue(void)
{
    static _Atomic(http_queue_fn) real;
    http_queue_fn f = atomic_load(&real);
    if (!f) {
        *(void **)&f = dlsym(RTLD_NEXT, "MHD_queue_response");
        if (!f) {
            log_error("http: libmicrohttpd's MHD_queue_response is not found: %s", dlerror());
            abort();
        }
        atomic_store(&real, f);
    }
    return f;
}

static json_t *http_err_json(const char *code, const char *message, const char *detail,
                             const char *hint, const char *field);

/* Writes a whole response (status, JSON text) to the connection's socket, through its TLS
 * session when it has one, for a connection libmicrohttpd closes right after. Runs on the
 * connection's libmicrohttpd thread, between its reads and writes. false when it could not. */
static bool http_reply_direct(struct MHD_Connection *conn, unsigned status, const char *text)
{
    char head[256];
    const char *phrase = MHD_get_reason_phrase_for(status);
    int hn = snprintf(head, sizeof head,
                      "HTTP/1.1 %u %s\r\nConnection: close\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\n\r\n",
                      status, phrase && *phrase ? phrase : "Error", strlen(text));
    size_t n = (size_t)hn + strlen(text);
    char *buf = malloc(n);
    if (!buf)
        return false;
    memcpy(buf, head, (size_t)hn);
    memcpy(buf + hn, text, strlen(text));
    bool ok = false;
    const union MHD_ConnectionInfo *tls = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    const union MHD_ConnectionInfo *sock = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (tls && tls->tls_session) {
        /* nothing of this request was answered yet: the session is between records */
        ok = gnutls_record_send((gnutls_session_t)tls->tls_session, buf, n) == (ssize_t)n;
    } else if (sock) {
        ok = send(sock->connect_fd, buf, n, MSG_NOSIGNAL) == (ssize_t)n;
    }
    free(buf);
    return ok;
}

enum MHD_Result MHD_queue_response(struct MHD_Connection *conn, unsigned int status, struct MHD_Response *resp);
enum MHD_Result MHD_queue_response(struct MHD_Connection *conn, unsigned int status, struct MHD_Response *resp)
{
    http_queue_fn real = http_real_queue();
    if (http_own_queue || status < 400)
        return real(conn, status, resp);
    const char *code = "bad_format", *msg = "malformed HTTP request", *hint = "send a well-formed HTTP/1.1 request";
    const char *clen = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    bool bad_length = clen && !MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING) &&
                      !http_length_ok(clen);
    switch (status) {
    case MHD_HTTP_URI_TOO_LONG:
        code = "payload_too_large";
        msg = "the request URL is too long";
        hint = "keep the URL under 16 KiB";
        break;
    case MHD_HTTP_REQUEST_HEADER_FIELDS_TOO_LARGE:
        code = "payload_too_large";
        msg = "the request headers are too large";
        hint = "keep the request line and headers under 16 KiB";
        break;
    case MHD_HTTP_CONTENT_TOO_LARGE:
        code = "payload_too_large";
        msg = bad_length ? "the request's Content-Length is too large" : "the request body is too large";
        hint = "send at most 1 MiB";
        break;
    case MHD_HTTP_HTTP_VERSION_NOT_SUPPORTED:
        code = "unimplemented";
        msg = "HTTP version not supported";
        hint = "use HTTP/1.1";
        break;
    case MHD_HTTP_BAD_REQUEST:
        if (bad_length) {
            msg = "the request's Content-Length is not a number of bytes";
            hint = "send one Content-Length header holding a decimal number, or Transfer-Encoding: chunked";
        }
        break;
    default:
        if (status >= 500) {
            code = "internal";
            msg = "internal error";
            hint = "retry shortly; if it persists, check kilnd's log";
        }
        break;
    }
    json_t *o = http_err_json(code, msg, "", hint, bad_length ? "Content-Length" : NULL);
    char *text = json_dumps(o, HTTP_JSON_FLAGS);
    json_decref(o);
    if (bad_length && (status == MHD_HTTP_BAD_REQUEST || status == MHD_HTTP_CONTENT_TOO_LARGE)) {
        /* MHD_NO: libmicrohttpd closes the connection without answering itself */
        if (!text || !http_reply_direct(conn, status, text))
            log_debug("http: could not answer a request with a malformed Content-Length");
        free(text);
        return MHD_NO;
    }
    struct MHD_Response *json = text ? MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE) : NULL;
    if (!json) {
        free(text);
        return real(conn, status, resp);
    }
    MHD_add_response_header(json, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    log_debug("http: libmicrohttpd refused a request with %u; answered with the JSON error", status);
    enum MHD_Result ret = real(conn, status, json);
    MHD_destroy_response(json);
    return ret;
}

enum MHD_Result http_reply_raw(http_req_t *r, int status, struct MHD_Response *resp)
{
    http_count(r, status);
    if (r->cors_origin) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", r->cors_origin);
        MHD_add_response_header(resp, "Access-Control-Expose-Headers", HTTP_CORS_EXPOSE);
        MHD_add_response_header(resp, "Vary", "Origin");
    }
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"kiln\"");
    http_own_queue = true;
    enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)status, resp);
    http_own_queue = false;
    return ret;
}

enum MHD_Result http_reply_json(http_req_t *r, int status, json_t *body)
{
    char *text = json_dumps(body ? body : json_object(), HTTP_JSON_FLAGS | JSON_ENCODE_ANY);
    json_decref(body);
    if (!text)
        return MHD_NO; /* out of memory: let MHD drop the connection */
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(text), text,
                                                                MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    enum MHD_Result ret = http_reply_raw(r, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* A JSON string for s; messages quote request text (paths, arguments) that may not be UTF-8,
 * which jansson refuses, so such bytes are escaped (kiln_text_escape). */
static json_t *http_json_text(const char *s)
{
    json_t *j = json_string(s);
    if (j)
        return j;
    char buf[1024];
    kiln_text_escape(buf, sizeof(buf), s, strlen(s), 0);
    return json_string(buf);
}

static json_t *http_err_json(const char *code, const char *message, const char *detail,
                             const char *hint, const char *field)
{
    json_t *o = json_object();
    json_object_set_new(o, "code", json_string(code));
    json_object_set_new(o, "message", http_json_text(message));
    json_object_set_new(o, "detail", http_json_text(detail));
    json_object_set_new(o, "hint", http_json_text(hint));
    if (field && field[0])
        json_object_set_new(o, "field", http_json_text(field));
    return o;
}

enum MHD_Result http_reply_err(http_req_t *r, const kiln_err_t *err)
{
    return http_reply_err_header(r, err, NULL, NULL);
}

enum MHD_Result http_reply_err_header(http_req_t *r, const kiln_err_t *err, const char *header, const char *value)
{
    int st = err->status ? err->status : KILN_EINTERNAL;
    int http = kiln_status_http(st);
    json_t *o;
    /* REST carries the idempotency key in a header (checked under that name before the service
     * sees it): a key reused with another body is named as the client wrote it, too */
    if (!strcmp(err->field, "idempotency_key")) {
        kiln_err_t e2 = *err;
        kiln_strlcpy(e2.field, "Idempotency-Key", sizeof e2.field);
        return http_reply_err(r, &e2);
    }
    if (st == KILN_EDB || st == KILN_EINTERNAL) {
        /* The database's own text names hosts, sockets and SQL: it goes to kilnd's log, and the
         * client gets a message that says what failed without the internals. */
        o = http_err_json(kiln_status_code(st),
                          st == KILN_EDB ? "the database is unavailable" : "internal error",
                          "the server's log has the details", "retry shortly; if it persists, check kilnd's log",
                          NULL);
    } else {
        o = http_err_json(kiln_status_code(st), err->message[0] ? err->message : kiln_strerror(st),
                          err->detail, err->hint, err->field);
    }
    if (http >= 500)
        log_warn("http: %s %s -> %d %s: %s", r->method, r->path, http, kiln_status_code(st),
                 err->message);
    if (!header)
        return http_reply_json(r, http, o);
    char *text = json_dumps(o, HTTP_JSON_FLAGS);
    json_decref(o);
    struct MHD_Response *resp = text ? MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE) : NULL;
    if (!resp) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(resp, header, value);
    enum MHD_Result ret = http_reply_raw(r, http, resp);
    MHD_destroy_response(resp);
    return ret;
}

enum MHD_Result http_reply_errf(http_req_t *r, int status, const char *field, const char *hint,
                                const char *fmt, ...)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    err.status = status;
    if (field)
        kiln_strlcpy(err.field, field, sizeof err.field);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err.message, sizeof err.message, fmt, ap);
    va_end(ap);
    if (hint)
        kiln_strlcpy(err.hint, hint, sizeof err.hint);
    return http_reply_err(r, &err);
}

const char *http_arg(http_req_t *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, name);
}

const char *http_header(http_req_t *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

/* ---- routing -------------------------------------------------------------------------------- */

/* Matches path against pattern; on success the parameters are copied into the request. */
static bool http_pattern_match(http_req_t *r, const char *pattern, const char *path, size_t n)
{
    const char *p = pattern, *q = path, *end = path + n;
    const char *names[HTTP_MAX_PARAMS], *vals[HTTP_MAX_PARAMS];
    size_t lens[HTTP_MAX_PARAMS];
    int np = 0;
    while (*p) {
        if (*p == '{') {
            const char *close = strchr(p, '}');
            if (!close || np == HTTP_MAX_PARAMS)
                return false;
            const char *start = q;
            while (q < end && *q != '/' && *q != ':')
                q++;
            if (q == start)
                return false;
            names[np] = p + 1;
            lens[np] = (size_t)(close - p - 1);
            vals[np] = start;
            np++;
            /* the value's length is q - start; remember it through the next loop */
            lens[np - 1] |= (size_t)(q - start) << 16;
            p = close + 1;
            continue;
        }
        if (q >= end || *q != *p)
            return false;
        p++;
        q++;
    }
    if (q != end)
        return false;
    r->nparams = np;
    for (int i = 0; i < np; i++) {
        size_t nl = lens[i] & 0xffff, vl = lens[i] >> 16;
        r->param_names[i] = arena_strndup(&r->arena, names[i], nl);
        r->param_values[i] = arena_strndup(&r->arena, vals[i], vl);
        if (!strcmp(r->param_names[i], "id"))
            r->id = r->param_values[i];
    }
    return true;
}

const char *http_param(http_req_t *r, const char *name)
{
    for (int i = 0; i < r->nparams; i++)
        if (!strcmp(r->param_names[i], name))
            return r->param_values[i];
    return NULL;
}

/* Finds the route for the request's path and method. When the path matches only under other
 * methods, route stays -1 and r->allow lists them. */
static void http_route_find(http_req_t *r, const char *path)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--; /* "/v1/jobs/" is "/v1/jobs" */
    bool head = !strcmp(r->method, "HEAD");
    r->route = -1;
    r->allow[0] = '\0';
    for (size_t i = 0; i < http_route_count; i++) {
        const http_route_t *rt = &http_routes[i];
        if (!http_pattern_match(r, rt->pattern, path, n))
            continue;
        if (!strcmp(rt->method, r->method) || (head && !strcmp(rt->method, "GET"))) {
            r->route = (int)i;
            return;
        }
        size_t al = strlen(r->allow);
        snprintf(r->allow + al, sizeof(r->allow) - al, "%s%s%s", al ? ", " : "", rt->method,
                 !strcmp(rt->method, "GET") ? ", HEAD" : "");
    }
    if (r->allow[0]) {
        size_t al = strlen(r->allow);
        snprintf(r->allow + al, sizeof(r->allow) - al, ", OPTIONS");
    }
}

size_t api_http_routes(api_route_info_t *out, size_t max)
{
    for (size_t i = 0; i < http_route_count && i < max; i++) {
        out[i].method = http_routes[i].method;
        out[i].path = http_routes[i].pattern;
        out[i].open = (http_routes[i].flags & HTTP_OPEN) != 0;
        out[i].agent = false;
        out[i].page = (http_routes[i].flags & HTTP_PAGE) != 0;
    }
    return http_route_count;
}

enum MHD_Result http_reply_status(http_req_t *r, int status)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    enum MHD_Result ret = http_reply_raw(r, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result http_reply_empty(http_req_t *r, int status, const char *allow)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    if (allow)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    enum MHD_Result ret = http_reply_raw(r, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result http_reply_405(http_req_t *r)
{
    char msg[256], hint[128];
    snprintf(msg, sizeof msg, "method %s is not allowed on %s", r->method, r->path);
    snprintf(hint, sizeof hint, "use %s", r->allow);
    json_t *o = http_err_json("method_not_allowed", msg, "", hint, NULL);
    char *text = json_dumps(o, HTTP_JSON_FLAGS);
    json_decref(o);
    if (!text)
        return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, r->allow);
    enum MHD_Result ret = http_reply_raw(r, MHD_HTTP_METHOD_NOT_ALLOWED, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* The request's Origin when the operator allowed it (--cors-origin), else NULL. */
static const char *http_cors_origin(http_req_t *r)
{
    const char *origin = http_header(r, "Origin");
    if (!origin)
        return NULL;
    for (int i = 0; i < r->h->ncors; i++)
        if (!strcmp(origin, r->h->cors[i]))
            return origin;
    return NULL;
}

/* OPTIONS: a CORS preflight from an allowed origin gets the headers the browser needs; other
 * origins are refused; without an Origin it is a plain question about the path's methods. */
static enum MHD_Result http_options(http_req_t *r)
{
    const char *origin = http_header(r, "Origin");
    char allow[96];
    if (r->route >= 0) {
        const char *m = http_routes[r->route].method;
        snprintf(allow, sizeof allow, "%s%s, OPTIONS", m, !strcmp(m, "GET") ? ", HEAD" : "");
    } else {
        kiln_strlcpy(allow, r->allow, sizeof allow);
    }
    if (!allow[0])
        return http_reply_errf(r, KILN_ENOTFOUND, NULL, "the API paths are under /v1/ (see api/openapi.yaml)",
                               "no such path: %s", r->path);
    if (!origin)
        return http_reply_empty(r, MHD_HTTP_NO_CONTENT, allow);
    if (!r->cors_origin)
        return http_reply_errf(r, KILN_EPERM, "Origin", "kilnd's operator allows browser origins with --cors-origin",
                               "origin %.200s may not call this API", origin);
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    MHD_add_response_header(resp, "Access-Control-Allow-Methods", allow);
    MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                            "Authorization, Content-Type, Idempotency-Key, Last-Event-ID, Range, If-Range, "
                            "If-None-Match");
    MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
    enum MHD_Result ret = http_reply_raw(r, MHD_HTTP_NO_CONTENT, resp);
    MHD_destroy_response(resp);
    return ret;
}

static bool http_media_is(const char *ct, const char *type)
{
    size_t n = strlen(type);
    return strncasecmp(ct, type, n) == 0 && (ct[n] == '\0' || ct[n] == ';' || ct[n] == ' ');
}

/* POST, PUT and PATCH bodies are JSON and say so: anything else (a form, text/plain) is what a
 * cross-site page could send without a preflight. A streamed body (HTTP_STREAM) is an archive:
 * application/gzip (or application/x-gzip, application/octet-stream), none of which a page can
 * send without a preflight either. */
static bool http_content_type_ok(http_req_t *r)
{
    if (strcmp(r->method, "POST") != 0 && strcmp(r->method, "PUT") != 0 && strcmp(r->method, "PATCH") != 0)
        return true;
    const char *ct = http_header(r, MHD_HTTP_HEADER_CONTENT_TYPE);
    if (r->route >= 0 && (http_routes[r->route].flags & HTTP_STREAM))
        return ct && (http_media_is(ct, "application/gzip") || http_media_is(ct, "application/x-gzip") ||
                      http_media_is(ct, "application/octet-stream"));
    if (!ct)
        return r->body_len == 0;
    return http_media_is(ct, "application/json");
}

/* The bearer token of the Authorization header, or NULL. */
static const char *http_bearer(http_req_t *r)
{
    const char *a = http_header(r, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!a || strncasecmp(a, "Bearer ", 7) != 0)
        return NULL;
    a += 7;
    while (*a == ' ')
        a++;
    return a;
}

/* MHD_KeyValueIterator over the query parameters: the first that is not text stops the walk
 * with err (cls) set. */
static enum MHD_Result http_check_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    kiln_err_t *err = cls;
    (void)kind;
    if (svc_check_str("query parameter", key, 0, err) || svc_check_str(key, value, 0, err))
        return MHD_NO;
    return MHD_YES;
}

/* The callbacks of an HTTP_STREAM route, or NULL for any other request. */
static const http_stream_route_t *http_stream_of(const http_req_t *r)
{
    if (r->route < 0 || !(http_routes[r->route].flags & HTTP_STREAM))
        return NULL;
    for (size_t i = 0; i < http_stream_route_count; i++)
        if (http_stream_routes[i].handle == http_routes[r->route].handle)
            return &http_stream_routes[i];
    return NULL;
}

static enum MHD_Result http_dispatch(http_req_t *r)
{
    r->cors_origin = http_cors_origin(r);
    if (!strcmp(r->method, "OPTIONS"))
        return http_options(r);
    if (r->route < 0 && !r->allow[0])
        return http_reply_errf(r, KILN_ENOTFOUND, NULL,
                               "the API paths are under /v1/ (see api/openapi.yaml)",
                               "no such path: %s %s", r->method, r->path);
    if (r->route < 0)
        return http_reply_405(r);
    const http_route_t *rt = &http_routes[r->route];
    /* Every path segment and query parameter is text: valid UTF-8 without NUL (%00) bytes. */
    kiln_err_t cerr;
    kiln_err_clear(&cerr);
    for (int i = 0; i < r->nparams; i++)
        if (svc_check_str(r->param_names[i], r->param_values[i], 0, &cerr))
            return http_reply_err(r, &cerr);
    MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, http_check_arg, &cerr);
    if (cerr.status)
        return http_reply_err(r, &cerr);
    if (!http_content_type_ok(r)) {
        if (rt->flags & HTTP_STREAM)
            return http_reply_errf(r, KILN_EMEDIA, "Content-Type", "send the archive with Content-Type: application/gzip",
                                   "this request's body must be application/gzip");
        return http_reply_errf(r, KILN_EMEDIA, "Content-Type", "send the body as JSON with Content-Type: application/json",
                               "request bodies must be application/json");
    }
    if (r->body_too_big)
        return http_reply_errf(r, KILN_ETOOBIG, NULL, "send at most 1 MiB",
                               "request body is larger than %d bytes", HTTP_MAX_BODY);
    bool open = (rt->flags & HTTP_OPEN) || ((rt->flags & HTTP_PROM) && !r->h->metrics_auth);
    if (!open) {
        kiln_err_t err;
        kiln_err_clear(&err);
        if (svc_auth_user(r->h->svc, http_bearer(r), &r->arena, &r->who, &err) != 0)
            return http_reply_err(r, &err);
    }
    static const char *const none[] = {NULL};
    kiln_err_t aerr;
    kiln_err_clear(&aerr);
    if (!(rt->flags & HTTP_PAGE) && http_args_known(r, rt->args ? rt->args : none, &aerr))
        return http_reply_err(r, &aerr);
    const http_stream_route_t *sr = http_stream_of(r);
    if (sr) {
        /* before the body: the route opens what takes it, or refuses (answered now) */
        kiln_err_t err;
        kiln_err_clear(&err);
        int rc = sr->body(r, NULL, 0, &err);
        if (rc) {
            if (!err.status)
                err.status = rc;
            return http_reply_err(r, &err);
        }
        r->stream_open = true;
        return MHD_YES;
    }
    return rt->handle(r);
}

/* Bytes of a refused streamed body kilnd reads (and drops) to answer; past them the connection
 * is closed without an answer. */
#define HTTP_STREAM_DROP_MAX ((int64_t)64 << 20)

/* A piece of an HTTP_STREAM body. */
static enum MHD_Result http_stream_piece(http_req_t *r, const char *data, size_t n)
{
    if (r->stream_failed) {
        r->stream_dropped += (int64_t)n;
        return r->stream_dropped > HTTP_STREAM_DROP_MAX ? MHD_NO : MHD_YES;
    }
    kiln_err_clear(&r->stream_err);
    int rc = http_stream_of(r)->body(r, data, n, &r->stream_err);
    if (rc) {
        if (!r->stream_err.status)
            r->stream_err.status = rc;
        r->stream_failed = true; /* answered once the body has ended (libmicrohttpd queues no
                                  * answer in the middle of a body) */
    }
    return MHD_YES;
}

/* Appends an upload chunk to the request body (in the arena, doubling). */
static void http_body_append(http_req_t *r, const char *data, size_t n)
{
    if (r->body_too_big)
        return;
    if (r->body_len + n > HTTP_MAX_BODY) {
        r->body_too_big = true;
        return;
    }
    if (r->body_len + n + 1 > r->body_cap) {
        size_t cap = r->body_cap ? r->body_cap : 4096;
        while (cap < r->body_len + n + 1)
            cap *= 2;
        char *nb = arena_alloc(&r->arena, cap);
        if (r->body_len)
            memcpy(nb, r->body, r->body_len);
        r->body = nb;
        r->body_cap = cap;
    }
    memcpy(r->body + r->body_len, data, n);
    r->body_len += n;
    r->body[r->body_len] = '\0';
}

/* MHD_KeyValueIterator over the request headers: gathers the framing lines (cls: http_frame_t). */
static enum MHD_Result http_framing_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    http_frame_header(cls, key, value);
    return MHD_YES;
}

/* How the request says its body is framed, checked before the body is read: where the framing
 * cannot be trusted (two lengths, a length beside chunked, an encoding libmicrohttpd does not
 * decode, which it would read to the end of the connection) the request gets its error and the
 * connection is closed; a declared body over the limit is refused before it is read. */
static enum MHD_Result http_framing_check(http_req_t *r)
{
    http_frame_t f = {0};
    MHD_get_connection_values(r->conn, MHD_HEADER_KIND, http_framing_header, &f);
    kiln_err_t err;
    kiln_err_clear(&err);
    /* (a streamed body, such as a code archive, has its own limit, checked by its route) */
    if (http_frame_check(&f, http_stream_of(r) ? UINT64_MAX : HTTP_MAX_BODY, &err) == 0)
        return MHD_YES;
    /* Answered now, before the body: libmicrohttpd then reads no body and, with Connection:
     * close, ends the connection after the answer. */
    r->answered = true;
    return http_reply_err_header(r, &err, MHD_HTTP_HEADER_CONNECTION, "close");
}

static enum MHD_Result http_on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                       const char *method, const char *version,
                                       const char *upload_data, size_t *upload_data_size,
                                       void **con_cls)
{
    api_http_t *h = cls;
    (void)version;
    http_req_t *r = *con_cls;
    if (!r) {
        /* First call: headers only. Answering now would make MHD close the connection, so just
         * set up the request and answer on a later call (unless its framing is broken, when
         * closing is the point). */
        r = calloc(1, sizeof *r);
        if (!r)
            return MHD_NO;
        arena_init(&r->arena, 4096);
        r->h = h;
        r->conn = conn;
        r->method = method;
        r->path = url;
        r->start_us = kiln_mono_us();
        http_route_find(r, url);
        *con_cls = r;
        http_conn_request(conn, HTTP_CONN_HEADERS);
        enum MHD_Result framed = http_framing_check(r);
        if (r->answered)
            return framed;
        /* a streamed body is checked before any of it is read: a refusal goes out at once */
        if (http_stream_of(r) && strcmp(method, "OPTIONS") != 0)
            return http_dispatch(r);
        return MHD_YES;
    }
    if (*upload_data_size) {
        enum MHD_Result ret = MHD_YES;
        if (r->stream_open)
            ret = http_stream_piece(r, upload_data, *upload_data_size);
        else if (!r->answered)
            http_body_append(r, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return ret;
    }
    if (r->answered)
        return MHD_YES;
    http_conn_request(conn, HTTP_CONN_BODY);
    if (r->stream_open)
        return r->stream_failed ? http_reply_err(r, &r->stream_err) : http_routes[r->route].handle(r);
    return http_dispatch(r);
}

static void http_on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                              enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    http_conn_request(conn, HTTP_CONN_DONE);
    http_req_t *r = *con_cls;
    if (!r)
        return;
    int64_t us = kiln_mono_us() - r->start_us;
    char labels[192];
    prom_observe(&http_duration, http_route_label(r, labels, sizeof labels), (double)us / 1e6);
    log_debug("http: %s %s -> %d (%.3f ms)%s", r->method, r->path, r->status, us / 1000.0,
              toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection ended early)");
    const http_stream_route_t *sr = http_stream_of(r);
    if (sr && sr->done)
        sr->done(r);
    arena_deinit(&r->arena);
    free(r);
    *con_cls = NULL;
}

/* ---- lifecycle ----------------------------------------------------------------------------- */

/* MHD_OPTION_UNESCAPE_CALLBACK: decodes %HH in the path and query parameters in place, as
 * libmicrohttpd would, except that %00 becomes the overlong (invalid) UTF-8 pair C0 80: a NUL
 * would end the C string there and "/v1/jobs/ID%00junk" would name job ID, while C0 80 keeps
 * the value whole and makes the text check refuse it (svc_check_text names it a NUL byte). */
static size_t http_unescape(void *cls, struct MHD_Connection *conn, char *s)
{
    (void)cls;
    (void)conn;
    char *w = s;
    for (const char *p = s; *p;) {
        if (p[0] == '%' && isxdigit((unsigned char)p[1]) && isxdigit((unsigned char)p[2])) {
            char hex[3] = {p[1], p[2], '\0'};
            unsigned v = (unsigned)strtoul(hex, NULL, 16);
            if (v == 0) {
                *w++ = (char)0xC0;
                *w++ = (char)0x80;
            } else {
                *w++ = (char)v;
            }
            p += 3;
        } else {
            *w++ = *p++;
        }
    }
    *w = '\0';
    return (size_t)(w - s);
}

static void http_on_panic(void *cls, const char *file, unsigned line, const char *reason)
{
    (void)cls;
    log_error("http: libmicrohttpd failed at %s:%u: %s", file, line, reason ? reason : "");
    abort();
}

int api_http_start(svc_t *svc, const api_http_config_t *cfg, api_http_t **out, kiln_err_t *err)
{
    *out = NULL;
    const char *addr = cfg->addr;
    struct sockaddr_storage ss;
    int rc = api_net_parse_addr(addr, "http-addr", &ss, NULL, err);
    if (rc)
        return rc;
    prom_register(&http_requests);
    prom_register(&http_duration);
    api_net_init();
    api_http_t *h = calloc(1, sizeof *h);
    if (!h)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    h->svc = svc;
    pthread_mutex_init(&h->streams_lock, NULL);
    pthread_mutex_init(&h->ping_lock, NULL);
    pthread_cond_init(&h->ping_cond, NULL);
    kiln_strlcpy(h->addr, addr, sizeof h->addr);
    h->metrics_auth = cfg->metrics_auth;
    h->ping_ms = cfg->ping_ms > 0 ? cfg->ping_ms : API_HTTP_PING_MS;
    if (cfg->ncors > 0) {
        h->cors = calloc((size_t)cfg->ncors, sizeof(char *));
        for (int i = 0; h->cors && i < cfg->ncors; i++)
            if ((h->cors[i] = strdup(cfg->cors_origins[i])))
                h->ncors++;
    }
    h->tls = cfg->tls && cfg->tls->cert_pem && cfg->tls->key_pem;
    if (h->tls) {
        if (!MHD_is_feature_supported(MHD_FEATURE_TLS)) {
            rc = kiln_err_set(err, KILN_EUNSUPP, "tls-cert", "this libmicrohttpd was built without TLS");
            goto fail;
        }
        h->tls_cert = strdup(cfg->tls->cert_pem);
        h->tls_key = strdup(cfg->tls->key_pem);
        if (!h->tls_cert || !h->tls_key) {
            rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
            goto fail;
        }
    }
    /* Handlers block on the database (a commit waits for the WAL flush), so several threads
     * keep one slow call from holding up the others and let commits group: 8 gave 1.2-1.6x the
     * job creation rate of 4 on 2 cores (bench/RESULTS.md); kilnd's --http-threads overrides. */
    unsigned threads = cfg->threads > 0 ? (unsigned)cfg->threads : API_HTTP_THREADS;
    MHD_set_panic_func(http_on_panic, NULL);
    /* Connections: the per-address limit, the deadlines (http_conn.c) and, below them, the
     * total a process's file descriptors allow. One address may hold at most an eighth of the
     * total, so that it cannot starve the others when the descriptors are few. */
    h->limits = api_net_limits_or_default(&cfg->limits);
    h->max_connections = api_net_max_connections();
    if (h->limits.per_address > h->max_connections / 8) {
        log_warn("http: %d connections per client address is more than an eighth of the %d this process's "
                 "file descriptor limit allows; using %d (raise the limit with ulimit -n or LimitNOFILE=)",
                 h->limits.per_address, h->max_connections, KILN_MAX(1, h->max_connections / 8));
        h->limits.per_address = KILN_MAX(1, h->max_connections / 8);
    }
    rc = http_conn_init(h, err);
    if (rc)
        goto fail;
    /* The TLS options go first in the list, or are skipped with MHD_OPTION_ARRAY of nothing. */
    const api_tls_min_t tls_min = cfg->tls ? cfg->tls->min_version : API_TLS_1_2;
    struct MHD_OptionItem tls_opts[] = {
        {MHD_OPTION_HTTPS_MEM_KEY, 0, h->tls_key},
        {MHD_OPTION_HTTPS_MEM_CERT, 0, h->tls_cert},
        {MHD_OPTION_HTTPS_PRIORITIES, 0, (void *)api_tls_gnutls_priorities(tls_min)},
        {MHD_OPTION_END, 0, NULL},
    };
    struct MHD_OptionItem no_opts[] = {{MHD_OPTION_END, 0, NULL}};
    h->daemon = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
            (ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0) | (h->tls ? MHD_USE_TLS : 0),
        0, http_conn_accept, h, http_on_request, h,
        MHD_OPTION_ARRAY, h->tls ? tls_opts : no_opts,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_THREAD_POOL_SIZE, threads,
        MHD_OPTION_NOTIFY_COMPLETED, http_on_completed, h,
        MHD_OPTION_NOTIFY_CONNECTION, http_conn_notify, h,
        MHD_OPTION_UNESCAPE_CALLBACK, http_unescape, NULL,
        /* a connection with nothing in flight; those in the middle of a request have the
         * handshake, header and body deadlines of http_conn.c */
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)KILN_MAX(1, (h->limits.idle_ms + 999) / 1000),
        MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024,
        /* every open log stream holds a connection; MHD's default (about 1,000) is low */
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)h->max_connections,
        MHD_OPTION_END);
    if (!h->daemon) {
        rc = kiln_err_set(err, KILN_EIO, "http-addr", "could not listen on %s%s", addr,
                          h->tls ? " with TLS" : "");
        kiln_err_hint(err, h->tls ? "is another process using the port, and do --tls-cert and --tls-key hold a "
                                    "matching PEM certificate and key?"
                                  : "is another process using the port?");
        goto fail;
    }
    rc = http_sse_init(h, err);
    if (rc)
        goto fail;
    log_info("http: listening on %s (%s, %u threads, at most %d connections, %d per client address)", addr,
             !h->tls ? "plain text" : tls_min == API_TLS_1_3 ? "TLS 1.3" : "TLS 1.2 and 1.3", threads,
             h->max_connections, h->limits.per_address);
    *out = h;
    return 0;
fail:
    api_http_stop(h);
    return rc;
}

void api_http_stop(api_http_t *h)
{
    if (!h)
        return;
    atomic_store(&h->stopping, true);
    http_sse_shutdown(h); /* every suspended stream resumed and told to end */
    http_conn_stop(h);
    if (h->daemon)
        MHD_stop_daemon(h->daemon);
    http_conn_deinit(h);
    pthread_cond_destroy(&h->ping_cond);
    pthread_mutex_destroy(&h->ping_lock);
    pthread_mutex_destroy(&h->streams_lock);
    for (int i = 0; i < h->ncors; i++)
        free(h->cors[i]);
    free(h->cors);
    free(h->tls_cert);
    if (h->tls_key) {
        memset(h->tls_key, 0, strlen(h->tls_key));
        free(h->tls_key);
    }
    free(h);
}
