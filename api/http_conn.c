/* http_conn.c - the REST front end's connections: the per-address limit (checked when
 * libmicrohttpd accepts, counted from its connection notices) and the deadlines a connection must
 * meet whatever it sends: the TLS handshake, a request's headers (from its first byte), a
 * request's body (from the end of its headers, a second more for each KiB that arrived, so a big
 * upload at a steady pace is never late). A reaper thread cuts a connection past its
 * deadline (shutdown(2) of the socket; libmicrohttpd then closes it), so a client that drips a
 * byte now and then cannot hold one, unless bytes it sent wait unread (then kilnd is the slow
 * one); an idle connection is libmicrohttpd's own timeout. Not the requests themselves (http.c). */
#include <gnutls/gnutls.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>

#include "api/http_int.h"

#define REAPER_TICK_MS 250
#define WAIT_CHECK_TICKS 4           /* kept-alive connections are looked at once a second */
#define BODY_MIN_RATE 1024           /* bytes a second: each KiB of a body received buys a second more */

typedef enum {
    CONN_HANDSHAKE,  /* TLS: connected, handshake not finished */
    CONN_HEADERS,    /* a request's headers are due (since its first byte, or since the connection opened) */
    CONN_BODY,       /* headers in, the body is due */
    CONN_BUSY,       /* the request is being answered (a stream may last hours) */
    CONN_WAIT,       /* between requests of a kept-alive connection */
    CONN_CUT,        /* shut down by the reaper or refused; libmicrohttpd closes it */
} conn_phase_t;

struct http_conn {
    int fd;
    api_addr_key_t key;
    bool counted;                    /* holds one of its address's connections in h->addrs */
    conn_phase_t phase;
    int64_t since_us;                /* when the phase began (monotonic) */
    uint64_t bytes_mark;             /* bytes received when the last request ended (CONN_WAIT) or its
                                        headers were in (CONN_BODY) */
    http_conn_t *next, *prev;        /* in h->conns */
};

/* Every REST connection of the process by socket, for GnuTLS's hook (which knows only the
 * session, and the session its socket); one lock for them, each server's list and counts. */
static pthread_mutex_t conns_lock = PTHREAD_MUTEX_INITIALIZER;
static http_conn_t **by_fd;
static int nfd;

/* ---- the table (conns_lock held) --------------------------------------------------------------- */

static void conn_index(http_conn_t *c, http_conn_t *value)
{
    if (c->fd < 0)
        return;
    if (c->fd >= nfd) {
        if (!value)
            return;
        int n = KILN_MAX(c->fd + 1, KILN_MAX(1024, nfd * 2));
        http_conn_t **nb = realloc(by_fd, (size_t)n * sizeof *nb);
        if (!nb)
            return; /* then the handshake's end goes unseen and its deadline cuts the connection */
        memset(nb + nfd, 0, (size_t)(n - nfd) * sizeof *nb);
        by_fd = nb;
        nfd = n;
    }
    by_fd[c->fd] = value;
}

/* Whether the client is the one behind: bytes it sent that kilnd has not read yet mean kilnd is
 * (its threads busy with other requests), and the connection is not cut for it. */
static bool conn_client_late(const http_conn_t *c)
{
    int unread = 0;
    return c->fd >= 0 && (ioctl(c->fd, FIONREAD, &unread) != 0 || unread == 0);
}

static void conn_cut(http_conn_t *c, api_net_reason_t why)
{
    c->phase = CONN_CUT;
    /* Counted before the client can see the end: whoever saw it cut off reads it in /metrics. */
    api_net_refused("rest", why);
    /* Not close(): the socket stays libmicrohttpd's, which sees the end and closes it (its
     * connection notice removes the record, under conns_lock, before it does). */
    shutdown(c->fd, SHUT_RDWR);
    char who[64];
    log_debug("http: cut off a connection from %s: %s", api_addr_key_str(&c->key, who, sizeof who),
              api_net_reason_name(why));
}

/* ---- libmicrohttpd's callbacks ------------------------------------------------------------------ */

enum MHD_Result http_conn_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    api_http_t *h = cls;
    (void)addrlen;
    if (h->limits.per_address < 0)
        return MHD_YES;
    api_addr_key_t k;
    api_addr_key(addr, &k);
    pthread_mutex_lock(&conns_lock);
    bool full = api_addr_held(&h->addrs, &k) >= h->limits.per_address;
    pthread_mutex_unlock(&conns_lock);
    if (full) {
        api_net_refused("rest", API_NET_PER_ADDRESS_LIMIT);
        return MHD_NO; /* libmicrohttpd closes the socket at once */
    }
    return MHD_YES;
}

/* GnuTLS's hook after a Finished message: the client's ends the handshake. */
static int http_conn_tls_done(gnutls_session_t session, unsigned htype, unsigned when, unsigned incoming,
                              const gnutls_datum_t *msg)
{
    (void)htype;
    (void)when;
    (void)msg;
    if (!incoming)
        return 0;
    int fd = gnutls_transport_get_int(session);
    pthread_mutex_lock(&conns_lock);
    http_conn_t *c = fd >= 0 && fd < nfd ? by_fd[fd] : NULL;
    if (c && c->phase == CONN_HANDSHAKE) {
        c->phase = CONN_HEADERS; /* the first request is due right after the handshake */
        c->since_us = kiln_mono_us();
    }
    pthread_mutex_unlock(&conns_lock);
    return 0;
}

void http_conn_notify(void *cls, struct MHD_Connection *mc, void **socket_context,
                      enum MHD_ConnectionNotificationCode code)
{
    api_http_t *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        http_conn_t *c = calloc(1, sizeof *c);
        if (!c)
            return; /* unlimited and without deadlines: only when memory is gone anyway */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        c->fd = ci ? ci->connect_fd : -1;
        ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        api_addr_key(ci ? ci->client_addr : NULL, &c->key);
        c->since_us = kiln_mono_us();
        c->phase = h->tls ? CONN_HANDSHAKE : CONN_HEADERS;
        if (h->tls) {
            ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_GNUTLS_SESSION);
            if (ci && ci->tls_session)
                gnutls_handshake_set_hook_function((gnutls_session_t)ci->tls_session, GNUTLS_HANDSHAKE_FINISHED,
                                                   GNUTLS_HOOK_POST, http_conn_tls_done);
        }
        pthread_mutex_lock(&conns_lock);
        c->counted = api_addr_take(&h->addrs, &c->key, h->limits.per_address);
        c->next = h->conns;
        if (h->conns)
            h->conns->prev = c;
        h->conns = c;
        conn_index(c, c);
        if (!c->counted && h->limits.per_address >= 0 && c->fd >= 0)
            conn_cut(c, API_NET_PER_ADDRESS_LIMIT); /* another thread accepted its last one first */
        pthread_mutex_unlock(&conns_lock);
        *socket_context = c;
        return;
    }
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        http_conn_t *c = *socket_context;
        if (!c)
            return;
        pthread_mutex_lock(&conns_lock);
        if (c->counted)
            api_addr_give(&h->addrs, &c->key);
        if (c->prev)
            c->prev->next = c->next;
        else
            h->conns = c->next;
        if (c->next)
            c->next->prev = c->prev;
        if (c->fd >= 0 && c->fd < nfd && by_fd[c->fd] == c)
            conn_index(c, NULL);
        pthread_mutex_unlock(&conns_lock);
        free(c);
        *socket_context = NULL;
    }
}

void http_conn_request(struct MHD_Connection *mc, http_conn_event_t ev)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    http_conn_t *c = ci ? ci->socket_context : NULL;
    if (!c)
        return;
    int64_t now = kiln_mono_us();
    uint64_t mark = ev != HTTP_CONN_BODY && c->fd >= 0 ? api_net_bytes_received(c->fd) : 0;
    pthread_mutex_lock(&conns_lock);
    if (c->phase != CONN_CUT) {
        switch (ev) {
        case HTTP_CONN_HEADERS:
            c->phase = CONN_BODY;
            c->bytes_mark = mark;
            break;
        case HTTP_CONN_BODY:
            c->phase = CONN_BUSY;
            break;
        case HTTP_CONN_DONE:
            c->phase = CONN_WAIT;
            c->bytes_mark = mark;
            break;
        }
        c->since_us = now;
    }
    pthread_mutex_unlock(&conns_lock);
}

/* ---- the reaper ---------------------------------------------------------------------------------- */

static void *http_conn_reaper(void *arg)
{
    api_http_t *h = arg;
    const int64_t handshake_us = (int64_t)h->limits.handshake_ms * 1000;
    const int64_t header_us = (int64_t)h->limits.header_ms * 1000;
    const int64_t body_us = (int64_t)h->limits.body_ms * 1000;
    unsigned tick = 0;
    pthread_mutex_lock(&h->reaper_lock);
    while (!atomic_load(&h->stopping)) {
        struct timespec ts;
        kiln_deadline_in(&ts, REAPER_TICK_MS);
        pthread_cond_timedwait(&h->reaper_cond, &h->reaper_lock, &ts);
        if (atomic_load(&h->stopping))
            break;
        tick++;
        int64_t now = kiln_mono_us();
        pthread_mutex_lock(&conns_lock);
        for (http_conn_t *c = h->conns; c; c = c->next) {
            int64_t age = now - c->since_us;
            switch (c->phase) {
            case CONN_HANDSHAKE:
                if (age > handshake_us && conn_client_late(c))
                    conn_cut(c, API_NET_HANDSHAKE_DEADLINE);
                break;
            case CONN_HEADERS:
                if (age > header_us && conn_client_late(c))
                    conn_cut(c, API_NET_HEADER_DEADLINE);
                break;
            case CONN_BODY:
                /* a body that keeps coming at BODY_MIN_RATE or faster is never late; one that
                 * drips is cut at the deadline */
                if (age > body_us && conn_client_late(c)) {
                    uint64_t in = c->fd >= 0 ? api_net_bytes_received(c->fd) : 0;
                    uint64_t got = in > c->bytes_mark ? in - c->bytes_mark : 0;
                    if (age > body_us + (int64_t)(got * 1000000 / BODY_MIN_RATE))
                        conn_cut(c, API_NET_BODY_DEADLINE);
                }
                break;
            case CONN_WAIT:
                /* A new request has begun when bytes arrived since the last one ended: its
                 * headers are due from now. */
                if (tick % WAIT_CHECK_TICKS == 0 && c->fd >= 0 && api_net_bytes_received(c->fd) > c->bytes_mark) {
                    c->phase = CONN_HEADERS;
                    c->since_us = now;
                }
                break;
            case CONN_BUSY:
            case CONN_CUT:
                break;
            }
        }
        pthread_mutex_unlock(&conns_lock);
    }
    pthread_mutex_unlock(&h->reaper_lock);
    return NULL;
}

int http_conn_init(api_http_t *h, kiln_err_t *err)
{
    pthread_mutex_init(&h->reaper_lock, NULL);
    pthread_cond_init(&h->reaper_cond, NULL);
    h->conn_init = true;
    if (api_addr_counts_init(&h->addrs) != 0)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    if (pthread_create(&h->reaper, NULL, http_conn_reaper, h) != 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not start the REST connection reaper");
    h->reaper_started = true;
    return 0;
}

void http_conn_stop(api_http_t *h)
{
    if (h->reaper_started) {
        pthread_mutex_lock(&h->reaper_lock);
        pthread_cond_broadcast(&h->reaper_cond);
        pthread_mutex_unlock(&h->reaper_lock);
        pthread_join(h->reaper, NULL);
        h->reaper_started = false;
    }
}

void http_conn_deinit(api_http_t *h)
{
    if (!h->conn_init)
        return;
    /* libmicrohttpd has closed every connection (and removed its record) by now */
    api_addr_counts_deinit(&h->addrs);
    pthread_cond_destroy(&h->reaper_cond);
    pthread_mutex_destroy(&h->reaper_lock);
    h->conn_init = false;
}
