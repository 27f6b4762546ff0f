/* rest_bench.c - load generator for kilnd's REST job creation (POST /v1/jobs): keep-alive
 * HTTP/1.1 over plain sockets or TLS (OpenSSL, with an API token), one epoll thread, every
 * latency recorded.
 *   throughput: C connections send back to back for D seconds (closed loop) -> jobs/s.
 *   latency:    open loop at a fixed rate; each request's latency is measured from the time
 *               it was due, so a stalled server cannot hide queueing (no coordinated omission).
 * Not a general HTTP client: it understands Content-Length replies only (what kilnd sends). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/base.h"

typedef struct bench_conn {
    int fd;
    SSL *ssl;                /* NULL over plain sockets */
    bool handshaken;
    bool busy;
    int64_t due_us;          /* when the request in flight was due (open loop) or sent */
    bool measured;           /* not a warm-up request */
    char out[4096];
    size_t out_len, out_off;
    char in[65536];
    size_t in_len;
} bench_conn_t;

typedef struct bench {
    struct sockaddr_in addr;
    const char *host;
    int nconns;
    bench_conn_t *conns;
    int ep;
    SSL_CTX *tls;            /* NULL: plain text */
    char auth[640];          /* "Authorization: Bearer ...\r\n", or "" */
    bool idempotency;
    long seq;                /* requests built */
    /* results */
    int64_t *lat;            /* microseconds, measured requests */
    size_t nlat, cap;
    long ok, errors, status_other;
    int last_bad_status;
    char last_bad_body[256];
} bench_t;

static const char bench_spec[] =
    "{\"name\":\"bench-%ld\",\"model\":{\"type\":\"gpt\",\"n_layer\":1,\"n_head\":2,\"n_embd\":16,"
    "\"seq_len\":8},\"data\":{\"train\":\"file:///tmp/bench.txt\"},"
    "\"hyperparameters\":{\"lr\":0.001,\"global_batch_size\":2,\"max_steps\":5},"
    "\"resources\":{\"nodes\":1,\"slots_per_node\":1,\"slot_type\":\"cpu\"},"
    "\"tags\":{\"bench\":\"rest\"}}";

static int bench_connect(bench_t *b, bench_conn_t *c)
{
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (c->fd < 0)
        return -1;
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c->fd, (struct sockaddr *)&b->addr, sizeof b->addr) < 0 && errno != EINPROGRESS) {
        close(c->fd);
        c->fd = -1;
        return -1;
    }
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
    epoll_ctl(b->ep, EPOLL_CTL_ADD, c->fd, &ev);
    c->busy = false;
    c->in_len = 0;
    c->handshaken = b->tls == NULL;
    if (b->tls) {
        c->ssl = SSL_new(b->tls);
        SSL_set_fd(c->ssl, c->fd);
        SSL_set_tlsext_host_name(c->ssl, "localhost");
        SSL_set1_host(c->ssl, "localhost");
        SSL_set_connect_state(c->ssl);
    }
    return 0;
}

/* The connection's byte streams, plain or TLS: > 0 bytes, 0 would block, -1 failed. */
static ssize_t conn_write(bench_conn_t *c, const char *p, size_t n)
{
    if (!c->ssl) {
        ssize_t w = write(c->fd, p, n);
        return w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOTCONN) ? 0 : w;
    }
    int w = SSL_write(c->ssl, p, (int)n);
    if (w > 0)
        return w;
    int e = SSL_get_error(c->ssl, w);
    return e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ ? 0 : -1;
}

static ssize_t conn_read(bench_conn_t *c, char *p, size_t n)
{
    if (!c->ssl) {
        ssize_t r = read(c->fd, p, n);
        return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : r == 0 ? -1 : r;
    }
    int r = SSL_read(c->ssl, p, (int)n);
    if (r > 0)
        return r;
    int e = SSL_get_error(c->ssl, r);
    return e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ? 0 : -1;
}

/* Drives the TLS handshake; true once it is done. */
static bool conn_handshake(bench_t *b, bench_conn_t *c)
{
    if (c->handshaken)
        return true;
    int r = SSL_do_handshake(c->ssl);
    if (r == 1) {
        c->handshaken = true;
        return true;
    }
    int e = SSL_get_error(c->ssl, r);
    if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
        fprintf(stderr, "rest_bench: TLS handshake failed: %s\n", ERR_error_string(ERR_get_error(), NULL));
        exit(1);
    }
    (void)b;
    return false;
}

static void bench_reconnect(bench_t *b, bench_conn_t *c)
{
    if (c->fd >= 0) {
        epoll_ctl(b->ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    if (c->ssl)
        SSL_free(c->ssl);
    c->ssl = NULL;
    c->fd = -1;
    bench_connect(b, c);
}

static void bench_flush(bench_t *b, bench_conn_t *c)
{
    if (!conn_handshake(b, c))
        return;
    while (c->out_off < c->out_len) {
        ssize_t n = conn_write(c, c->out + c->out_off, c->out_len - c->out_off);
        if (n > 0) {
            c->out_off += (size_t)n;
            continue;
        }
        if (n == 0) {
            struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
            epoll_ctl(b->ep, EPOLL_CTL_MOD, c->fd, &ev);
            return;
        }
        b->errors++;
        bench_reconnect(b, c);
        return;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    epoll_ctl(b->ep, EPOLL_CTL_MOD, c->fd, &ev);
}

static void bench_send(bench_t *b, bench_conn_t *c, int64_t due_us, bool measured)
{
    char body[1024], key[96] = "";
    long id = b->seq++;
    int bl = snprintf(body, sizeof body, bench_spec, id);
    if (b->idempotency)
        snprintf(key, sizeof key, "Idempotency-Key: bench-%d-%ld\r\n", (int)getpid(), id);
    c->out_len = (size_t)snprintf(c->out, sizeof c->out,
                                  "POST /v1/jobs HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                                  "%s%sContent-Length: %d\r\n\r\n%s",
                                  b->host, b->auth, key, bl, body);
    c->out_off = 0;
    c->busy = true;
    c->due_us = due_us;
    c->measured = measured;
    bench_flush(b, c);
}

static void bench_record(bench_t *b, int64_t us)
{
    if (b->nlat == b->cap) {
        b->cap = b->cap ? b->cap * 2 : 65536;
        b->lat = realloc(b->lat, b->cap * sizeof *b->lat);
    }
    b->lat[b->nlat++] = us;
}

/* Reads what arrived; completes the reply when its body is in. */
static void bench_read(bench_t *b, bench_conn_t *c)
{
    if (!conn_handshake(b, c))
        return;
    for (;;) {
        ssize_t n = conn_read(c, c->in + c->in_len, sizeof c->in - c->in_len - 1);
        if (n > 0) {
            c->in_len += (size_t)n;
            if (c->in_len >= sizeof c->in - 1)
                break;
            continue;
        }
        if (n == 0)
            break;
        /* closed or failed: the request in flight is an error */
        if (c->busy)
            b->errors++;
        bench_reconnect(b, c);
        return;
    }
    c->in[c->in_len] = '\0';
    char *hend = strstr(c->in, "\r\n\r\n");
    if (!hend)
        return;
    size_t hlen = (size_t)(hend - c->in) + 4;
    long clen = 0;
    bool close_after = false;
    for (char *p = c->in; p < hend; p = strstr(p, "\r\n") + 2) {
        if (!strncasecmp(p, "Content-Length:", 15))
            clen = atol(p + 15);
        if (!strncasecmp(p, "Connection: close", 17))
            close_after = true;
    }
    if (c->in_len < hlen + (size_t)clen)
        return;
    int status = atoi(c->in + 9);
    int64_t now = kiln_mono_us();
    if (c->busy && c->measured) {
        bench_record(b, now - c->due_us);
        if (status == 201 || status == 200) {
            b->ok++;
        } else {
            b->status_other++;
            b->last_bad_status = status;
            snprintf(b->last_bad_body, sizeof b->last_bad_body, "%.*s", (int)KILN_MIN((long)200, clen), c->in + hlen);
        }
    }
    c->busy = false;
    size_t used = hlen + (size_t)clen;
    memmove(c->in, c->in + used, c->in_len - used);
    c->in_len -= used;
    if (close_after)
        bench_reconnect(b, c);
}

static int bench_cmp(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static double bench_pct(bench_t *b, double p)
{
    if (!b->nlat)
        return 0;
    size_t i = (size_t)(p / 100.0 * (double)(b->nlat - 1) + 0.5);
    return b->lat[i] / 1000.0;
}

static bench_conn_t *bench_idle(bench_t *b)
{
    for (int i = 0; i < b->nconns; i++)
        if (!b->conns[i].busy && b->conns[i].fd >= 0 && b->conns[i].handshaken)
            return &b->conns[i];
    return NULL;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: rest_bench --url http[s]://127.0.0.1:8080 [--mode throughput|latency]\n"
            "                  [--connections C] [--duration S] [--warmup S] [--rate R]\n"
            "                  [--idempotency] [--ca CA.pem] [--token-file FILE]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *url = NULL, *mode = "throughput", *ca = NULL, *token_file = NULL;
    int nconns = 32;
    double duration = 10, warmup = 1, rate = 200;
    bench_t b = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--idempotency")) { b.idempotency = true; continue; }
        if (!v) usage();
        if (!strcmp(a, "--url")) url = v;
        else if (!strcmp(a, "--mode")) mode = v;
        else if (!strcmp(a, "--connections")) nconns = atoi(v);
        else if (!strcmp(a, "--duration")) duration = atof(v);
        else if (!strcmp(a, "--warmup")) warmup = atof(v);
        else if (!strcmp(a, "--rate")) rate = atof(v);
        else if (!strcmp(a, "--ca")) ca = v;
        else if (!strcmp(a, "--token-file")) token_file = v;
        else usage();
        i++;
    }
    bool open_loop = !strcmp(mode, "latency");
    bool https = url && !strncmp(url, "https://", 8);
    if (!url || (strncmp(url, "http://", 7) && !https) || nconns < 1 || duration <= 0 || rate <= 0 ||
        (!open_loop && strcmp(mode, "throughput")))
        usage();
    if (https) {
        b.tls = SSL_CTX_new(TLS_client_method());
        SSL_CTX_set_verify(b.tls, SSL_VERIFY_PEER, NULL);
        if (!ca || SSL_CTX_load_verify_locations(b.tls, ca, NULL) != 1) {
            fprintf(stderr, "rest_bench: https needs --ca with the CA that signed kilnd's certificate\n");
            return 2;
        }
    }
    if (token_file) {
        char *tok = NULL;
        kiln_err_t err;
        if (kiln_file_read(token_file, &tok, NULL, &err)) {
            fprintf(stderr, "rest_bench: %s\n", err.message);
            return 2;
        }
        tok[strcspn(tok, "\r\n")] = '\0';
        snprintf(b.auth, sizeof b.auth, "Authorization: Bearer %s\r\n", tok);
        free(tok);
    }
    char host[128];
    kiln_strlcpy(host, url + (https ? 8 : 7), sizeof host);
    char *slash = strchr(host, '/');
    if (slash)
        *slash = '\0';
    char *colon = strrchr(host, ':');
    int port = colon ? atoi(colon + 1) : https ? 443 : 80;
    b.host = strdup(host);
    if (colon)
        *colon = '\0';
    b.addr.sin_family = AF_INET;
    b.addr.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &b.addr.sin_addr) != 1) {
        fprintf(stderr, "rest_bench: host must be an IPv4 address: %s\n", host);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    b.ep = epoll_create1(0);
    b.nconns = nconns;
    b.conns = calloc((size_t)nconns, sizeof *b.conns);
    for (int i = 0; i < nconns; i++) {
        b.conns[i].fd = -1;
        if (bench_connect(&b, &b.conns[i])) {
            fprintf(stderr, "rest_bench: could not connect to %s\n", url);
            return 1;
        }
    }

    /* open loop: requests become due every 1/rate s; due ones wait here for a connection */
    size_t qcap = (size_t)((duration + warmup) * rate) + 16, qhead = 0, qtail = 0;
    int64_t *queue = open_loop ? calloc(qcap, sizeof *queue) : NULL;
    long due_count = 0;
    int64_t t0 = kiln_mono_us();
    int64_t t_measure = t0 + (int64_t)(warmup * 1e6);
    int64_t t_end = t_measure + (int64_t)(duration * 1e6);
    int64_t t_last_done = t_measure;
    struct epoll_event evs[256];
    for (;;) {
        int64_t now = kiln_mono_us();
        bool sending = now < t_end;
        if (open_loop) {
            while (sending) {
                int64_t due = t0 + (int64_t)((double)due_count * 1e6 / rate);
                if (due > now || qtail == qcap)
                    break;
                queue[qtail++] = due;
                due_count++;
            }
            bench_conn_t *c;
            while (qhead < qtail && (c = bench_idle(&b)) != NULL) {
                int64_t due = queue[qhead++];
                bench_send(&b, c, due, due >= t_measure);
            }
        } else if (sending) {
            bench_conn_t *c;
            while ((c = bench_idle(&b)) != NULL)
                bench_send(&b, c, now, now >= t_measure);
        }
        bool inflight = false;
        for (int i = 0; i < nconns; i++)
            inflight = inflight || b.conns[i].busy;
        if (!sending && !inflight && qhead == qtail)
            break;
        if (now > t_end + 30 * 1000000LL) {
            fprintf(stderr, "rest_bench: replies still missing 30 s after the end\n");
            break;
        }
        int timeout_ms = 1;
        if (!open_loop)
            timeout_ms = 100;
        int n = epoll_wait(b.ep, evs, 256, timeout_ms);
        for (int i = 0; i < n; i++) {
            bench_conn_t *c = evs[i].data.ptr;
            if (evs[i].events & EPOLLOUT)
                bench_flush(&b, c);
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
                bench_read(&b, c);
        }
        if (b.nlat)
            t_last_done = kiln_mono_us();
    }
    /* closed loop: requests sent before the end complete after it; count the time they took */
    double secs = open_loop ? duration : KILN_MAX(duration, (t_last_done - t_measure) / 1e6);
    qsort(b.lat, b.nlat, sizeof *b.lat, bench_cmp);
    char when[40];
    kiln_time_format(kiln_now_us(), when, sizeof when);
    printf("rest_bench mode=%s connections=%d duration=%.1fs warmup=%.1fs%s%s%s (%s)\n", mode, nconns,
           duration, warmup, b.idempotency ? " idempotency-key=on" : "", b.tls ? " tls=on" : "",
           b.auth[0] ? " token=on" : "", when);
    if (open_loop)
        printf("  offered rate: %.0f req/s\n", rate);
    printf("  measured requests: %zu  ok (201/200): %ld  other status: %ld  connection errors: %ld\n",
           b.nlat, b.ok, b.status_other, b.errors);
    printf("  throughput: %.1f jobs/s\n", (double)b.ok / secs);
    printf("  requests sent, warm-up included: %ld\n", b.seq);
    printf("  latency ms: p50 %.2f  p90 %.2f  p99 %.2f  p99.9 %.2f  max %.2f\n", bench_pct(&b, 50),
           bench_pct(&b, 90), bench_pct(&b, 99), bench_pct(&b, 99.9),
           b.nlat ? b.lat[b.nlat - 1] / 1000.0 : 0.0);
    if (b.status_other)
        printf("  last unexpected status %d: %s\n", b.last_bad_status, b.last_bad_body);
    return b.ok > 0 && b.status_other == 0 ? 0 : 1;
}
