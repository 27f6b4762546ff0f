/* test_httpc.c - kiln's HTTP client (httpc/) against peers it did not write: a raw socket that
 * records what arrives and answers a canned reply (redirects, statuses, a stalled reply), and
 * `openssl s_server` for TLS. Checks: the token reaches the URL asked for and a redirect is not
 * followed, so it never reaches another; an upload is read from its stream; a 200 reply goes to
 * the sink, another status's body is collected; a sink stops the request; a refused connection
 * and a timeout say so; https is verified against the CA given and refused without it unless
 * verification is off. The CLI's and kilnd --health's own tests run the same client against
 * kilnd. */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "httpc/httpc.h"
#include "tests/common/harness.h"

TestSuite(httpc, .timeout = 60);

/* A one-connection HTTP peer on 127.0.0.1: accepts, reads the request head, answers `reply`
 * (after delay_ms), closes. What it read is in `got`. */
typedef struct peer {
    int fd, port, delay_ms;
    const char *reply;
    char got[4096];
    int connections;
    pthread_t t;
} peer_t;

static void *peer_main(void *arg)
{
    peer_t *p = arg;
    int c = accept(p->fd, NULL, NULL);
    if (c < 0)
        return NULL;
    p->connections++;
    size_t n = 0;
    while (n < sizeof p->got - 1 && !strstr(p->got, "\r\n\r\n")) {
        ssize_t k = read(c, p->got + n, sizeof p->got - 1 - n);
        if (k <= 0)
            break;
        n += (size_t)k;
        p->got[n] = 0;
    }
    /* then the body its Content-Length announces, as far as got holds */
    const char *cl = strstr(p->got, "Content-Length: "), *end = strstr(p->got, "\r\n\r\n");
    size_t want = cl && end ? (size_t)(end + 4 - p->got) + strtoul(cl + 16, NULL, 10) : 0;
    while (n < want && n < sizeof p->got - 1) {
        ssize_t k = read(c, p->got + n, sizeof p->got - 1 - n);
        if (k <= 0)
            break;
        n += (size_t)k;
        p->got[n] = 0;
    }
    if (p->delay_ms)
        usleep((useconds_t)p->delay_ms * 1000);
    if (write(c, p->reply, strlen(p->reply)) < 0)
        p->got[0] = 0;
    close(c);
    return NULL;
}

static void peer_start(peer_t *p, const char *reply, int delay_ms)
{
    memset(p->got, 0, sizeof p->got);
    p->delay_ms = delay_ms;
    p->reply = reply;
    p->connections = 0;
    p->fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(p->fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(p->fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t al = sizeof a;
    cr_assert_eq(getsockname(p->fd, (struct sockaddr *)&a, &al), 0);
    p->port = ntohs(a.sin_port);
    cr_assert_eq(listen(p->fd, 4), 0);
    cr_assert_eq(pthread_create(&p->t, NULL, peer_main, p), 0);
}

/* Stops the peer (a connection that never came ends its accept) and joins it. */
static void peer_stop(peer_t *p)
{
    shutdown(p->fd, SHUT_RDWR);
    pthread_join(p->t, NULL);
    close(p->fd);
}

Test(httpc, the_token_goes_to_the_url_asked_and_no_redirect_is_followed)
{
    peer_t other, p;
    peer_start(&other, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok", 0);
    char reply[256], url[64];
    snprintf(reply, sizeof reply,
             "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:%d/steal\r\nContent-Length: 5\r\n"
             "Connection: close\r\n\r\nmoved", other.port);
    peer_start(&p, reply, 0);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/jobs?x=1", p.port);
    const char *hdrs[] = {"Accept: application/json", NULL};
    httpc_req_t req = {.url = url, .headers = hdrs, .token = "s3cret-token", .timeout_ms = 10000};
    httpc_res_t res;
    cr_assert_eq(httpc_perform(&req, &res), HTTPC_OK, "%s", res.error);
    peer_stop(&p);
    peer_stop(&other);
    cr_assert_eq(res.status, 302);
    cr_assert_str_eq(res.body, "moved");
    cr_assert(strstr(p.got, "GET /v1/jobs?x=1 HTTP/1.1\r\n"), "%s", p.got);
    cr_assert(strstr(p.got, "\r\nAuthorization: Bearer s3cret-token\r\n"), "%s", p.got);
    cr_assert(strstr(p.got, "\r\nAccept: application/json\r\n"), "%s", p.got);
    cr_assert_eq(other.connections, 0, "the redirect was followed: %s", other.got);
    httpc_res_deinit(&res);

    /* no token: no Authorization line; a POST without a body sends an empty one */
    peer_start(&p, "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n", 0);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/x", p.port);
    httpc_req_t post = {.method = "POST", .url = url, .timeout_ms = 10000};
    cr_assert_eq(httpc_perform(&post, &res), HTTPC_OK, "%s", res.error);
    peer_stop(&p);
    cr_assert_eq(res.status, 204);
    cr_assert_null(res.body);
    cr_assert(strstr(p.got, "POST /x HTTP/1.1\r\n") && strstr(p.got, "Content-Length: 0\r\n"), "%s", p.got);
    cr_assert_null(strstr(p.got, "Authorization"), "%s", p.got);
    httpc_res_deinit(&res);
}

Test(httpc, an_upload_is_read_from_its_stream_as_the_body)
{
    /* under 1 KiB, so libcurl sends it without waiting on "Expect: 100-continue" */
    char data[700];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (char)('a' + i % 26);
    FILE *f = tmpfile();
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(data, 1, sizeof data, f), sizeof data);
    rewind(f);
    peer_t p;
    peer_start(&p, "HTTP/1.1 201 Created\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}", 0);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/code", p.port);
    const char *hdrs[] = {"Content-Type: application/gzip", NULL};
    httpc_req_t req = {.method = "POST", .url = url, .headers = hdrs, .upload = f, .upload_len = sizeof data,
                       .low_speed_s = 60};
    httpc_res_t res;
    cr_assert_eq(httpc_perform(&req, &res), HTTPC_OK, "%s", res.error);
    peer_stop(&p);
    fclose(f);
    cr_assert_eq(res.status, 201);
    cr_assert_str_eq(res.body, "{}");
    cr_assert(strstr(p.got, "POST /v1/code HTTP/1.1\r\n"), "%s", p.got);
    cr_assert(strstr(p.got, "\r\nContent-Length: 700\r\n"), "%s", p.got);
    cr_assert(strstr(p.got, "\r\nContent-Type: application/gzip\r\n"), "%s", p.got);
    const char *body = strstr(p.got, "\r\n\r\n");
    cr_assert(body && strlen(body + 4) == sizeof data && !memcmp(body + 4, data, sizeof data), "%s", p.got);
    httpc_res_deinit(&res);
}

typedef struct sunk {
    char text[256];
    size_t n;
    int calls, stop_after;
} sunk_t;

static int sink(void *ud, const char *data, size_t n)
{
    sunk_t *s = ud;
    if (s->n + n < sizeof s->text) {
        memcpy(s->text + s->n, data, n);
        s->n += n;
    }
    return ++s->calls == s->stop_after;
}

static void header(void *ud, const char *line, size_t n)
{
    (void)n;
    if (!strncmp(line, "ETag:", 5))
        ((sunk_t *)ud)->stop_after = 0;
}

Test(httpc, a_200_goes_to_the_sink_and_another_status_is_collected)
{
    peer_t p;
    char url[64];
    peer_start(&p, "HTTP/1.1 200 OK\r\nETag: \"abc\"\r\nContent-Length: 11\r\nConnection: close\r\n\r\nhello world", 0);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/a", p.port);
    sunk_t s = {.stop_after = -1};
    httpc_req_t req = {.url = url, .sink = sink, .on_header = header, .ud = &s, .timeout_ms = 10000};
    httpc_res_t res;
    cr_assert_eq(httpc_perform(&req, &res), HTTPC_OK, "%s", res.error);
    peer_stop(&p);
    cr_assert_eq(res.status, 200);
    cr_assert_null(res.body, "a 200 body was also collected");
    cr_assert_eq(s.n, 11);
    cr_assert_eq(memcmp(s.text, "hello world", 11), 0);
    cr_assert_eq(s.stop_after, 0, "the ETag header line never reached on_header");
    httpc_res_deinit(&res);

    peer_start(&p, "HTTP/1.1 404 Not Found\r\nContent-Length: 17\r\nConnection: close\r\n\r\n{\"code\":\"nope\"}\r\n", 0);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/b", p.port);
    sunk_t s2 = {.stop_after = -1};
    req.ud = &s2;
    cr_assert_eq(httpc_perform(&req, &res), HTTPC_OK, "%s", res.error);
    peer_stop(&p);
    cr_assert_eq(res.status, 404);
    cr_assert_eq(s2.calls, 0, "a 404's body went to the sink");
    cr_assert_str_eq(res.body, "{\"code\":\"nope\"}\r\n");
    httpc_res_deinit(&res);

    /* a sink that stops after its first chunk ends the request */
    peer_start(&p, "HTTP/1.1 200 OK\r\nContent-Length: 11\r\nConnection: close\r\n\r\nhello world", 0);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/c", p.port);
    sunk_t s3 = {.stop_after = 1};
    req.ud = &s3;
    req.on_header = NULL;
    cr_assert_eq(httpc_perform(&req, &res), HTTPC_STOPPED);
    peer_stop(&p);
    cr_assert_eq(s3.calls, 1);
    httpc_res_deinit(&res);
}

Test(httpc, refused_and_timed_out_requests_say_so)
{
    char url[64];
    int port = th_free_port();
    snprintf(url, sizeof url, "http://127.0.0.1:%d/", port);
    httpc_req_t req = {.url = url, .timeout_ms = 10000};
    httpc_res_t res;
    cr_assert_eq(httpc_perform(&req, &res), HTTPC_CONNECT);
    cr_assert_eq(res.status, 0);
    cr_assert(res.error[0], "no reason given");
    httpc_res_deinit(&res);

    peer_t p;
    peer_start(&p, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok", 3000);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/slow", p.port);
    req.timeout_ms = 300;
    double t0 = kiln_mono_s();
    cr_assert_eq(httpc_perform(&req, &res), HTTPC_TIMEOUT, "%s", res.error);
    cr_assert_lt(kiln_mono_s() - t0, 2.5);
    peer_stop(&p);
    httpc_res_deinit(&res);

    /* only http and https */
    httpc_req_t file = {.url = "file:///etc/passwd", .timeout_ms = 1000};
    cr_assert_neq(httpc_perform(&file, &res), HTTPC_OK);
    cr_assert_null(res.body);
    httpc_res_deinit(&res);
}

/* https against `openssl s_server -www` with the test CA's server certificate. */
Test(httpc, https_is_verified_against_the_ca_given)
{
    const char *tls = th_tls_dir();
    cr_assert_not_null(tls);
    int port = th_free_port();
    char cert[600], key[600], ca[600], accept_arg[32], url[64];
    snprintf(cert, sizeof cert, "%s/server.pem", tls);
    snprintf(key, sizeof key, "%s/server.key", tls);
    snprintf(ca, sizeof ca, "%s/ca.pem", tls);
    snprintf(accept_arg, sizeof accept_arg, "%d", port);
    char *argv[] = {"/usr/bin/openssl", "s_server", "-quiet", "-accept", accept_arg, "-cert", cert, "-key", key, "-www", NULL};
    pid_t pid = th_spawn(argv, NULL, "/dev/null");
    cr_assert_gt(pid, 0);
    cr_assert(th_wait_port(port, 20000), "openssl s_server did not listen");
    snprintf(url, sizeof url, "https://127.0.0.1:%d/", port);
    httpc_res_t res;
    httpc_req_t req = {.url = url, .ca_file = ca, .timeout_ms = 10000};
    httpc_end_t end = httpc_perform(&req, &res);
    cr_assert_eq(end, HTTPC_OK, "with the CA: %s", res.error);
    cr_assert_eq(res.status, 200);
    httpc_res_deinit(&res);
    /* the system's CAs do not know the test CA */
    httpc_req_t sys = {.url = url, .timeout_ms = 10000};
    cr_assert_eq(httpc_perform(&sys, &res), HTTPC_CONNECT, "an unknown CA was accepted");
    cr_assert(strstr(res.error, "certificate") || strstr(res.error, "SSL"), "%s", res.error);
    httpc_res_deinit(&res);
    httpc_req_t probe = {.url = url, .no_verify = true, .timeout_ms = 10000};
    cr_assert_eq(httpc_perform(&probe, &res), HTTPC_OK, "unverified: %s", res.error);
    httpc_res_deinit(&res);
    th_stop(pid, SIGTERM, 5000);
}
