/* http.c - kilnd's REST front end: the libmicrohttpd daemon, request collection (bodies arrive
 * over several calls), routing by path and method, JSON and error replies, request logging.
 * The handlers live in http_routes.c, live log streams in http_sse.c; no business logic here. */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "api/http_int.h"

/* ---- replies ------------------------------------------------------------------------------ */

static void http_count(http_req_t *r, int status)
{
    r->status = status;
    r->answered = true;
    if (status >= 100 && status < 600)
        atomic_fetch_add_explicit(&r->h->requests[r->route][status], 1, memory_order_relaxed);
}

enum MHD_Result http_reply_raw(http_req_t *r, int status, struct MHD_Response *resp)
{
    http_count(r, status);
    return MHD_queue_response(r->conn, (unsigned)status, resp);
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
 * which jansson refuses, so such bytes become '?'. */
static json_t *http_json_text(const char *s)
{
    json_t *j = json_string(s);
    if (j)
        return j;
    char buf[1024];
    size_t i = 0;
    for (; s[i] && i < sizeof buf - 1; i++)
        buf[i] = (unsigned char)s[i] < 0x80 ? s[i] : '?';
    buf[i] = '\0';
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
    int st = err->status ? err->status : KILN_EINTERNAL;
    int http = kiln_status_http(st);
    json_t *o;
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
    return http_reply_json(r, http, o);
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

/* ---- routing ------------------------------------------------------------------------------- */

/* Splits the path into a route and, for job routes, the id (copied into the arena). */
static http_route_t http_route_match(http_req_t *r, const char *path)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--; /* "/v1/jobs/" is "/v1/jobs" */
    if (n == 8 && memcmp(path, "/v1/jobs", 8) == 0)
        return HTTP_ROUTE_JOBS;
    if (n == 11 && memcmp(path, "/v1/workers", 11) == 0)
        return HTTP_ROUTE_WORKERS;
    if (n == 8 && memcmp(path, "/healthz", 8) == 0)
        return HTTP_ROUTE_HEALTHZ;
    if (n == 7 && memcmp(path, "/readyz", 7) == 0)
        return HTTP_ROUTE_READYZ;
    if (n == 8 && memcmp(path, "/metrics", 8) == 0)
        return HTTP_ROUTE_PROM;
    if (n > 9 && memcmp(path, "/v1/jobs/", 9) == 0) {
        const char *id = path + 9, *end = path + n;
        const char *slash = memchr(id, '/', (size_t)(end - id));
        const char *idend = slash ? slash : end;
        http_route_t route = HTTP_ROUTE_JOB;
        if (slash) {
            size_t rest = (size_t)(end - slash);
            if (rest == 7 && memcmp(slash, "/events", 7) == 0)
                route = HTTP_ROUTE_JOB_EVENTS;
            else if (rest == 5 && memcmp(slash, "/logs", 5) == 0)
                route = HTTP_ROUTE_JOB_LOGS;
            else if (rest == 8 && memcmp(slash, "/metrics", 8) == 0)
                route = HTTP_ROUTE_JOB_METRICS;
            else
                return HTTP_ROUTE_NONE;
        } else if (idend - id > 5 && memcmp(idend - 5, ":stop", 5) == 0) {
            route = HTTP_ROUTE_JOB_STOP;
            idend -= 5;
        }
        if (idend == id)
            return HTTP_ROUTE_NONE;
        r->id = arena_strndup(&r->arena, id, (size_t)(idend - id));
        return route;
    }
    return HTTP_ROUTE_NONE;
}

/* The methods a route accepts, as an Allow header value. */
static const char *http_route_allow(http_route_t route)
{
    switch (route) {
    case HTTP_ROUTE_JOBS: return "GET, HEAD, POST";
    case HTTP_ROUTE_JOB_STOP: return "POST";
    default: return "GET, HEAD";
    }
}

static bool http_method_allowed(const char *allow, const char *method)
{
    size_t n = strlen(method);
    for (const char *p = allow; (p = strstr(p, method)) != NULL; p += n)
        if ((p == allow || p[-1] == ' ') && (p[n] == ',' || p[n] == '\0'))
            return true;
    return false;
}

static enum MHD_Result http_dispatch(http_req_t *r)
{
    if (r->route == HTTP_ROUTE_NONE)
        return http_reply_errf(r, KILN_ENOTFOUND, NULL,
                               "the API paths are under /v1/ (see api/openapi.yaml)",
                               "no such path: %s %s", r->method, r->path);
    const char *allow = http_route_allow(r->route);
    if (!http_method_allowed(allow, r->method)) {
        kiln_err_t err;
        kiln_err_clear(&err);
        err.status = KILN_EINVAL;
        snprintf(err.message, sizeof err.message, "method %s is not allowed on %s", r->method,
                 r->path);
        snprintf(err.hint, sizeof err.hint, "use %s", allow);
        json_t *o = http_err_json("method_not_allowed", err.message, "", err.hint, NULL);
        char *text = json_dumps(o, HTTP_JSON_FLAGS);
        json_decref(o);
        if (!text)
            return MHD_NO;
        struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(text), text,
                                                                    MHD_RESPMEM_MUST_FREE);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
        enum MHD_Result ret = http_reply_raw(r, MHD_HTTP_METHOD_NOT_ALLOWED, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    if (r->body_too_big)
        return http_reply_errf(r, KILN_ETOOBIG, NULL, "send at most 1 MiB",
                               "request body is larger than %d bytes", HTTP_MAX_BODY);
    return http_route_handle(r);
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
         * set up the request and answer on a later call. */
        r = calloc(1, sizeof *r);
        if (!r)
            return MHD_NO;
        arena_init(&r->arena, 4096);
        r->h = h;
        r->conn = conn;
        r->method = method;
        r->path = url;
        r->start_us = kiln_mono_us();
        r->route = http_route_match(r, url);
        *con_cls = r;
        return MHD_YES;
    }
    if (*upload_data_size) {
        http_body_append(r, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (r->answered)
        return MHD_YES;
    return http_dispatch(r);
}

static void http_on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                              enum MHD_RequestTerminationCode toe)
{
    api_http_t *h = cls;
    (void)conn;
    http_req_t *r = *con_cls;
    if (!r)
        return;
    int64_t us = kiln_mono_us() - r->start_us;
    atomic_fetch_add_explicit(&h->latency_us[r->route], (unsigned long long)us,
                              memory_order_relaxed);
    log_debug("http: %s %s -> %d (%.3f ms)%s", r->method, r->path, r->status, us / 1000.0,
              toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection ended early)");
    arena_deinit(&r->arena);
    free(r);
    *con_cls = NULL;
}

/* ---- lifecycle ----------------------------------------------------------------------------- */

/* Parses "host:port", "[v6]:port" or ":port" into a socket address. */
static int http_parse_addr(const char *addr, struct sockaddr_storage *ss, kiln_err_t *err)
{
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    if (!colon || !colon[1])
        goto bad;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535)
        goto bad;
    char host[96];
    size_t hl = (size_t)(colon - addr);
    if (hl >= sizeof host)
        goto bad;
    memcpy(host, addr, hl);
    host[hl] = '\0';
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    if (!host[0])
        strcpy(host, "0.0.0.0");
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, host, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)port);
        return 0;
    }
    if (inet_pton(AF_INET6, host, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)port);
        return 0;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, NULL, &hints, &ai) == 0 && ai) {
        memcpy(ss, ai->ai_addr, ai->ai_addrlen);
        if (ss->ss_family == AF_INET)
            s4->sin_port = htons((uint16_t)port);
        else
            s6->sin6_port = htons((uint16_t)port);
        freeaddrinfo(ai);
        return 0;
    }
bad:
    kiln_err_set(err, KILN_EINVAL, "http-addr", "bad listen address \"%s\"", addr ? addr : "");
    kiln_err_hint(err, "use HOST:PORT, for example 127.0.0.1:8080");
    return KILN_EINVAL;
}

static void http_on_panic(void *cls, const char *file, unsigned line, const char *reason)
{
    (void)cls;
    log_error("http: libmicrohttpd failed at %s:%u: %s", file, line, reason ? reason : "");
    abort();
}

int api_http_start(svc_t *svc, const char *addr, api_http_t **out, kiln_err_t *err)
{
    *out = NULL;
    struct sockaddr_storage ss;
    int rc = http_parse_addr(addr, &ss, err);
    if (rc)
        return rc;
    api_http_t *h = calloc(1, sizeof *h);
    if (!h)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    h->svc = svc;
    kiln_strlcpy(h->addr, addr, sizeof h->addr);
    pthread_mutex_init(&h->streams_lock, NULL);
    pthread_mutex_init(&h->ping_lock, NULL);
    pthread_cond_init(&h->ping_cond, NULL);
    /* Handlers block on the database (a commit waits for the WAL flush), so several threads
     * keep one slow call from holding up the others and let commits group: 8 gave 1.2-1.6x the
     * job creation rate of 4 on 2 cores (bench/RESULTS.md). KILN_HTTP_THREADS overrides. */
    unsigned threads = 8;
    const char *t = getenv("KILN_HTTP_THREADS");
    if (t && atoi(t) > 0 && atoi(t) <= 64)
        threads = (unsigned)atoi(t);
    MHD_set_panic_func(http_on_panic, NULL);
    h->daemon = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
            (ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0),
        0, NULL, NULL, http_on_request, h,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_THREAD_POOL_SIZE, threads,
        MHD_OPTION_NOTIFY_COMPLETED, http_on_completed, h,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024,
        /* every open log stream holds a connection; MHD's default (about 1,000) is low */
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)8192,
        MHD_OPTION_END);
    if (!h->daemon) {
        rc = kiln_err_set(err, KILN_EIO, "http-addr", "could not listen on %s", addr);
        kiln_err_hint(err, "is another process using the port?");
        goto fail;
    }
    rc = http_sse_init(h, err);
    if (rc)
        goto fail;
    log_info("http: listening on %s (%u threads)", addr, threads);
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
    if (h->daemon)
        MHD_stop_daemon(h->daemon);
    pthread_cond_destroy(&h->ping_cond);
    pthread_mutex_destroy(&h->ping_lock);
    pthread_mutex_destroy(&h->streams_lock);
    free(h);
}
