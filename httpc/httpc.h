/* httpc.h - kiln's HTTP client (libcurl): one request to one URL, its reply collected or handed
 * to a sink chunk by chunk, with TLS verified against a given CA, an optional bearer token and
 * timeouts. The CLI (cli/http.c) and the daemons' --health probe (cmd/daemon.c) use it. It knows
 * nothing of kilnd's routes or error replies; it is not the REST server (api/). */
#ifndef KILN_HTTPC_H
#define KILN_HTTPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* How a request ended on the wire (the HTTP status is separate). */
typedef enum httpc_end {
    HTTPC_OK = 0,      /* a whole reply came back, whatever its status */
    HTTPC_NOMEM,       /* out of memory before or during the request */
    HTTPC_CONNECT,     /* no connection (refused, unknown host, TLS handshake or verification) */
    HTTPC_TIMEOUT,     /* timeout_ms passed, or low_speed_s below a byte a second */
    HTTPC_STOPPED,     /* the sink asked to stop */
    HTTPC_BROKEN,      /* the connection failed after it was made */
} httpc_end_t;

/* Receives a 200 reply's body, chunk by chunk; returns 0 to go on, anything else to stop the
 * request (HTTPC_STOPPED). */
typedef int (*httpc_sink_fn)(void *ud, const char *data, size_t n);
/* Receives each reply header line ("Name: value\r\n", not NUL-terminated). */
typedef void (*httpc_header_fn)(void *ud, const char *line, size_t n);

typedef struct httpc_req {
    const char *method;          /* NULL: GET */
    const char *url;             /* http:// or https:// only; redirects are never followed, so
                                  * the token goes to this URL and no other */
    const char *const *headers;  /* NULL-terminated "Name: value" lines, or NULL */
    const char *body;            /* request body (body_len bytes), or NULL; a POST without one
                                  * sends an empty body */
    size_t body_len;
    FILE *upload;                /* instead of body: upload_len bytes read from this stream as a
                                  * POST's body, as they are sent (borrowed) */
    long long upload_len;
    const char *token;           /* sent as "Authorization: Bearer <token>"; NULL or "": none */
    const char *ca_file;         /* https: the server is verified against this CA; NULL or "":
                                  * the system's CAs */
    bool no_verify;              /* https: not verified at all (only for a probe of this host's
                                  * own port that sends nothing secret) */
    const char *user_agent;      /* NULL: libcurl's */
    long timeout_ms;             /* the whole request; 0: no limit */
    long connect_timeout_ms;     /* 0: libcurl's */
    long low_speed_s;            /* > 0: give up after this long below a byte a second */
    httpc_sink_fn sink;          /* NULL: the body is collected into res->body */
    httpc_header_fn on_header;
    void *ud;                    /* for sink and on_header */
} httpc_req_t;

typedef struct httpc_res {
    long status;                 /* the reply's HTTP status; 0: none came */
    char *body;                  /* the body collected, NUL-terminated (a non-200 reply's when a
                                  * sink is given), or NULL when empty; owned: httpc_res_deinit */
    size_t len;
    char error[256];             /* libcurl's words when not HTTPC_OK */
} httpc_res_t;

/* Runs req (borrowed) and fills *res (OUT; httpc_res_deinit it whatever the result). Returns how
 * it ended. Thread-safe: each call has its own handle (libcurl's global set-up runs once). */
httpc_end_t httpc_perform(const httpc_req_t *req, httpc_res_t *res);
/* Frees what *res holds. */
void httpc_res_deinit(httpc_res_t *res);
/* s percent-encoded for a URL's path segment or query value; caller frees with free(). NULL when
 * out of memory. */
char *httpc_escape(const char *s);

#endif
