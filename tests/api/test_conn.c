/* test_conn.c - the REST front end's connections over raw sockets against an in-process server:
 * every request whose framing is broken (Content-Length values libmicrohttpd cannot read, lengths
 * that disagree, Transfer-Encoding beside Content-Length or unknown, bad chunk sizes) gets exactly
 * one HTTP response with a JSON error and then the connection closes; clients too slow with their
 * headers or body are cut off at the deadline while an idle kept-alive connection is not; the
 * per-address limit refuses one address's extra connections and not another's. */
#include <criterion/criterion.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tests/api/api_test.h"

TestSuite(conn, .init = at_setup, .fini = at_teardown, .timeout = 60);

static int at_port(void)
{
    return atoi(strrchr(at_base, ':') + 1);
}

/* One response, a JSON error with status `status`, and the connection closed after it. */
static void assert_one_json_error(const char *what, const char *resp, size_t len, bool closed, int status)
{
    cr_assert(closed, "%s: the connection stays open after:\n%s", what, resp);
    cr_assert(len > 12 && !strncmp(resp, "HTTP/1.1 ", 9), "%s: no status line:\n%s", what, resp);
    int got = atoi(resp + 9);
    cr_assert_eq(got, status, "%s: status %d, want %d:\n%s", what, got, status, resp);
    int lines = 0;
    for (const char *p = resp; (p = strstr(p, "HTTP/1.")); p++)
        if (p == resp || p[-1] == '\n')
            lines++;
    cr_assert_eq(lines, 1, "%s: %d status lines, want one response:\n%s", what, lines, resp);
    const char *end = strstr(resp, "\r\n\r\n");
    cr_assert(end, "%s: headers do not end:\n%s", what, resp);
    const char *body = end + 4;
    const char *cl = strcasestr(resp, "\r\nContent-Length:");
    cr_assert(cl && cl < end, "%s: no Content-Length:\n%s", what, resp);
    size_t n = strtoul(cl + 17, NULL, 10);
    cr_assert_eq(n, len - (size_t)(body - resp), "%s: the body is not Content-Length long:\n%s", what, resp);
    const char *ct = strcasestr(resp, "\r\nContent-Type: application/json");
    cr_assert(ct && ct < end, "%s: not JSON:\n%s", what, resp);
    json_error_t jerr;
    json_t *j = json_loads(body, 0, &jerr);
    cr_assert(j, "%s: the body is not JSON (%s):\n%s", what, jerr.text, resp);
    cr_assert(json_is_string(json_object_get(j, "code")) && json_is_string(json_object_get(j, "message")),
              "%s: not an error object: %s", what, body);
    cr_assert(strlen(json_string_value(json_object_get(j, "message"))) > 0, "%s: empty message", what);
    json_decref(j);
}

static void exchange_expect(const char *what, const char *req, int status)
{
    char *resp = NULL;
    size_t len = 0;
    bool closed = false;
    cr_assert_eq(th_raw_exchange(at_port(), req, strlen(req), 5000, &resp, &len, &closed), 0, "%s: no connection", what);
    assert_one_json_error(what, resp, len, closed, status);
    free(resp);
}

Test(conn, malformed_content_length_gets_one_json_error_and_a_close)
{
    /* Values libmicrohttpd cannot read: 0.9.75 queues its answer and then builds the status line
     * and headers a second time. */
    static const struct {
        const char *value;
        int status;
    } corpus[] = {
        {"abc", 400}, {"-5", 400}, {"5, 5", 400}, {"+5", 400}, {"5 5", 400}, {"0x10", 400}, {"1e3", 400},
        {"5;", 400}, {"", 400}, {" ", 400}, {"99999999999999999999999", 413}, {"18446744073709551616", 413},
        /* read, but over the body limit: refused before the body */
        {"18446744073709551615", 413}, {"1048577", 413},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(corpus); i++) {
        char req[512], what[96];
        snprintf(req, sizeof req,
                 "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %s\r\n\r\n{}",
                 corpus[i].value);
        snprintf(what, sizeof what, "Content-Length \"%s\"", corpus[i].value);
        exchange_expect(what, req, corpus[i].status);
    }
}

Test(conn, untrustworthy_framing_gets_one_json_error_and_a_close)
{
    static const struct {
        const char *what, *req;
        int status;
    } corpus[] = {
        {"two Content-Length values",
         "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
         "Content-Length: 12\r\n\r\n{}GET / HTTP/1.1\r\n\r\n", 400},
        {"Transfer-Encoding and Content-Length",
         "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 7\r\n"
         "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 400},
        {"Content-Length and Transfer-Encoding",
         "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
         "Content-Length: 7\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 400},
        {"two Transfer-Encoding headers",
         "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
         "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 400},
        {"an unknown Transfer-Encoding",
         "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: gzip\r\n\r\n{}",
         400},
        {"a Transfer-Encoding list",
         "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: gzip, chunked\r\n"
         "\r\n2\r\n{}\r\n0\r\n\r\n", 400},
        {"a chunk size that is not hex",
         "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
         "zz\r\n{}\r\n0\r\n\r\n", 400},
        {"a negative chunk size",
         "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
         "-2\r\n{}\r\n0\r\n\r\n", 400},
        {"a chunk size past 2^64",
         "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
         "fffffffffffffffffffff\r\n{}\r\n0\r\n\r\n", 413},
        {"a chunk longer than its size",
         "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
         "2\r\n{}xx\r\n0\r\n\r\n", 400},
        /* broken before the body: answered by libmicrohttpd itself, in kiln's JSON */
        {"a header line without a colon", "GET /healthz HTTP/1.1\r\nHost: x\r\nNo colon here\r\n\r\n", 400},
        {"a request line without a version", "GET /healthz\r\nHost: x\r\n\r\n", 400},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(corpus); i++)
        exchange_expect(corpus[i].what, corpus[i].req, corpus[i].status);
}

Test(conn, a_good_request_after_those_still_works)
{
    exchange_expect("Content-Length \"abc\"",
                    "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}", 400);
    long st = 0;
    json_t *j = at_req("GET", "/healthz", NULL, NULL, &st, NULL);
    cr_assert_eq(st, 200);
    json_decref(j);
}

/* ---- deadlines: a server whose deadlines are short ---------------------------------------------- */

static void setup_short_deadlines(void)
{
    api_http_config_t cfg = {.limits = {.header_ms = 700, .body_ms = 700, .handshake_ms = 700}};
    at_setup_with(&cfg);
}

TestSuite(conn_deadlines, .init = setup_short_deadlines, .fini = at_teardown, .timeout = 60);

/* Sends text one byte every 100 ms; returns how many it sent before the server closed the
 * connection (all of them when it never did). */
static size_t drip(int fd, const char *text)
{
    size_t n = strlen(text);
    for (size_t i = 0; i < n; i++) {
        if (send(fd, text + i, 1, MSG_NOSIGNAL) != 1 || th_tcp_closed_within(fd, 100))
            return i;
    }
    return n;
}

static double metric(const char *reason)
{
    long st = 0;
    char *raw = NULL;
    json_decref(at_req("GET", "/metrics", NULL, NULL, &st, &raw));
    char needle[128];
    snprintf(needle, sizeof needle, "kiln_connections_refused_total{port=\"rest\",reason=\"%s\"} ", reason);
    const char *p = strstr(raw, needle);
    double v = p ? atof(p + strlen(needle)) : 0;
    free(raw);
    return v;
}

Test(conn_deadlines, headers_dripped_slower_than_the_deadline_are_cut_off)
{
    int fd = th_tcp_connect(NULL, at_port(), false);
    cr_assert(fd >= 0);
    /* 60 bytes at 10/s would take 6 s: far past the 0.7 s deadline, and each byte is activity
     * that an idle timeout alone would count */
    const char *req = "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    size_t sent = drip(fd, req);
    close(fd);
    cr_assert(sent < strlen(req), "a client dripping its headers was never cut off");
    cr_assert_eq(metric("header_deadline"), 1.0);
}

Test(conn_deadlines, a_body_dripped_slower_than_the_deadline_is_cut_off)
{
    int fd = th_tcp_connect(NULL, at_port(), false);
    cr_assert(fd >= 0);
    const char *head = "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 60\r\n\r\n";
    cr_assert_eq(send(fd, head, strlen(head), MSG_NOSIGNAL), (ssize_t)strlen(head));
    const char *body = "{\"name\": \"slow\", \"tags\": {\"a\": \"bbbbbbbbbbbbbbbbbbbbbbbbbbbb\"}}";
    size_t sent = drip(fd, body);
    close(fd);
    cr_assert(sent < strlen(body), "a client dripping its body was never cut off");
    cr_assert_eq(metric("body_deadline"), 1.0);
}

Test(conn_deadlines, a_body_arriving_at_a_steady_pace_is_not_cut_off)
{
    /* 30,000 bytes at 10 KB/s take 3 s, past the 0.7 s deadline, but each KiB buys a second */
    int fd = th_tcp_connect(NULL, at_port(), false);
    cr_assert(fd >= 0);
    char body[30001];
    memset(body, ' ', sizeof body - 1);
    body[0] = '{';
    body[sizeof body - 2] = '}';
    body[sizeof body - 1] = '\0';
    char head[256];
    snprintf(head, sizeof head,
             "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
             strlen(body));
    cr_assert_eq(send(fd, head, strlen(head), MSG_NOSIGNAL), (ssize_t)strlen(head));
    for (size_t off = 0; off < strlen(body); off += 1000) {
        size_t n = KILN_MIN(1000, strlen(body) - off);
        cr_assert_eq(send(fd, body + off, n, MSG_NOSIGNAL), (ssize_t)n, "cut off after %zu body bytes", off);
        cr_assert(!th_tcp_closed_within(fd, 100), "cut off after %zu body bytes", off + n);
    }
    char buf[512] = {0};
    struct pollfd p = {.fd = fd, .events = POLLIN};
    cr_assert(poll(&p, 1, 10000) == 1, "no answer");
    cr_assert(recv(fd, buf, sizeof buf - 1, 0) > 12 && !strncmp(buf, "HTTP/1.1 4", 10), "%s", buf);
    close(fd);
    cr_assert_eq(metric("body_deadline"), 0.0);
}

Test(conn_deadlines, a_silent_connection_is_cut_off_and_an_idle_kept_alive_one_is_not)
{
    int silent = th_tcp_connect(NULL, at_port(), false);
    cr_assert(silent >= 0);
    cr_assert(th_tcp_closed_within(silent, 5000), "a connection that never sends a request stays open");
    close(silent);

    /* A kept-alive connection between requests waits for the idle timeout (120 s), not the
     * header deadline: a second request 1.5 s later, on the same connection, is answered. */
    int fd = th_tcp_connect(NULL, at_port(), false);
    cr_assert(fd >= 0);
    const char *req = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    char buf[2048] = {0};
    for (int round = 0; round < 2; round++) {
        cr_assert_eq(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req), "round %d", round);
        size_t n = 0;
        while (n < sizeof buf - 1 && !strstr(buf, "\"status\"")) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            cr_assert(poll(&p, 1, 5000) == 1, "round %d: no answer", round);
            ssize_t r = recv(fd, buf + n, sizeof buf - 1 - n, 0);
            cr_assert(r > 0, "round %d: the connection was closed", round);
            n += (size_t)r;
            buf[n] = '\0';
        }
        cr_assert(!strncmp(buf, "HTTP/1.1 200", 12), "round %d: %s", round, buf);
        memset(buf, 0, sizeof buf);
        if (round == 0)
            cr_assert(!th_tcp_closed_within(fd, 1500), "the idle kept-alive connection was cut off");
    }
    close(fd);
}

/* ---- the per-address limit ------------------------------------------------------------------------ */

static void setup_small_limit(void)
{
    api_http_config_t cfg = {.limits = {.per_address = 4}};
    at_setup_with(&cfg);
}

TestSuite(conn_limit, .init = setup_small_limit, .fini = at_teardown, .timeout = 60);

Test(conn_limit, one_address_past_its_limit_is_refused_and_others_are_not)
{
    th_flood_t f;
    cr_assert_eq(th_flood(&f, "127.0.0.2", at_port(), 40, 4, 10000), 0,
                 "127.0.0.2 should hold 4 connections and have 36 refused: held %d, refused %d, failed %d", f.held,
                 f.refused, f.failed);
    int extra = th_tcp_connect("127.0.0.2", at_port(), false);
    cr_assert(extra >= 0);
    cr_assert(th_tcp_closed_within(extra, 2000), "a fifth connection from 127.0.0.2 was not refused at once");
    close(extra);
    long st = 0;
    json_t *j = at_req("GET", "/healthz", NULL, NULL, &st, NULL);
    cr_assert_eq(st, 200, "127.0.0.1 is served while 127.0.0.2 holds its limit");
    json_decref(j);
    cr_assert_eq(metric("per_address_limit"), 37.0);
    /* a connection given back is a connection 127.0.0.2 may open again */
    for (int i = 0; i < f.n; i++)
        if (f.fds[i] >= 0) {
            close(f.fds[i]);
            f.fds[i] = -1;
            break;
        }
    int again = -1; /* until the server has seen the close: bounded by time, not tries (a refusal is quick) */
    for (int64_t end = kiln_mono_us() + 20000000; kiln_mono_us() < end;) {
        again = th_tcp_connect("127.0.0.2", at_port(), false);
        cr_assert(again >= 0);
        if (!th_tcp_closed_within(again, 300))
            break;
        close(again); /* the server had not seen the close yet */
        again = -1;
    }
    cr_assert(again >= 0, "127.0.0.2 could not open a connection after closing one of its four");
    close(again);
    th_flood_end(&f);
}
