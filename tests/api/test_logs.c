/* test_logs.c - GET /v1/jobs/{id}/logs: history with rank/since/after_seq/limit, and
 * follow=true as Server-Sent Events (history then live lines, `event: end` when the job ends,
 * resumption with Last-Event-ID, keep-alive pings, a slow reader that loses nothing). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/api/api_test.h"

TestSuite(logs, .init = at_setup, .fini = at_teardown, .timeout = 90);

/* Counts `id:` lines (one per `event: log` record) and checks the ids increase by one from the
 * first. Walks the text line by line: ASan's strstr measures the whole haystack on every call. */
static int count_events(const char *text, long long *first_seq, bool *contiguous)
{
    int n = 0;
    long long prev = -1;
    *contiguous = true;
    for (const char *p = text; *p;) {
        if (p[0] == 'i' && p[1] == 'd' && p[2] == ':' && p[3] == ' ' && strncmp(p + 4, "end\n", 4) != 0) {
            long long seq = atoll(p + 4);
            if (n == 0 && first_seq)
                *first_seq = seq;
            if (prev >= 0 && seq != prev + 1)
                *contiguous = false;
            prev = seq;
            n++;
        }
        const char *nl = strchr(p, '\n');
        if (!nl)
            break;
        p = nl + 1;
    }
    return n;
}

Test(logs, history_and_filters)
{
    char *id = at_create_job("logs", NULL, NULL);
    int attempt = at_run_job(id);
    at_push_logs(id, attempt, "hello", 1, 5);
    char path[256];
    long st;
    char *raw;
    snprintf(path, sizeof path, "/v1/jobs/%s/logs", id);
    json_t *j = at_req("GET", path, NULL, NULL, &st, &raw);
    cr_assert_eq(st, 200, "%s", raw);
    json_t *lines = json_object_get(j, "lines");
    cr_assert_eq(json_array_size(lines), 5, "%s", raw);
    json_t *l0 = json_array_get(lines, 0);
    cr_assert_str_eq(json_string_value(json_object_get(l0, "line")), "hello 1");
    cr_assert_str_eq(json_string_value(json_object_get(l0, "stream")), "stdout");
    cr_assert_eq(json_integer_value(json_object_get(l0, "rank")), 0);
    cr_assert(json_is_string(json_object_get(l0, "time")), "%s", raw);
    long long seq2 = json_integer_value(json_object_get(json_array_get(lines, 1), "seq"));
    json_decref(j);
    free(raw);

    snprintf(path, sizeof path, "/v1/jobs/%s/logs?after_seq=%lld&limit=2", id, seq2);
    j = at_req("GET", path, NULL, NULL, &st, &raw);
    cr_assert_eq(st, 200, "%s", raw);
    lines = json_object_get(j, "lines");
    cr_assert_eq(json_array_size(lines), 2, "%s", raw);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(lines, 0), "line")), "hello 3");
    json_decref(j);
    free(raw);

    snprintf(path, sizeof path, "/v1/jobs/%s/logs?rank=1", id);
    j = at_req("GET", path, NULL, NULL, &st, &raw);
    cr_assert_eq(json_array_size(json_object_get(j, "lines")), 0, "no lines from rank 1: %s", raw);
    json_decref(j);
    free(raw);

    /* since in the future (Unix seconds and RFC 3339) selects nothing; in the past, everything */
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?since=%lld", id, (long long)(kiln_now_us() / 1000000 + 3600));
    j = at_req("GET", path, NULL, NULL, &st, &raw);
    cr_assert_eq(st, 200, "%s", raw);
    cr_assert_eq(json_array_size(json_object_get(j, "lines")), 0, "%s", raw);
    json_decref(j);
    free(raw);
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?since=2020-01-01T00:00:00Z", id);
    j = at_req("GET", path, NULL, NULL, &st, &raw);
    cr_assert_eq(json_array_size(json_object_get(j, "lines")), 5, "%s", raw);
    json_decref(j);
    free(raw);

    static const char *const bad[][2] = {{"since=yesterday", "since"}, {"rank=-3", "rank"},
                                         {"limit=0", "limit"}, {"follow=maybe", "follow"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(path, sizeof path, "/v1/jobs/%s/logs?%s", id, bad[i][0]);
        j = at_req("GET", path, NULL, NULL, &st, &raw);
        cr_assert_eq(st, 400, "%s: %s", bad[i][0], raw);
        cr_assert_str_eq(json_string_value(json_object_get(j, "field")), bad[i][1], "%s", raw);
        json_decref(j);
        free(raw);
    }
    free(id);
}

Test(logs, follow_streams_history_then_live_then_end)
{
    char *id = at_create_job("follow", NULL, NULL);
    int attempt = at_run_job(id);
    at_push_logs(id, attempt, "early", 1, 3);

    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?follow=true", id);
    at_sse_t s;
    at_sse_open(&s, path, NULL);
    cr_assert(at_sse_wait(&s, "early 3", 5000), "history arrives: %s", s.buf);
    at_push_logs(id, attempt, "live", 1, 3);
    cr_assert(at_sse_wait(&s, "live 3", 5000), "live lines arrive: %s", s.buf);
    cr_assert(!s.done, "the stream stays open while the job runs");
    at_push_logs(id, attempt, "more", 1, 2);
    at_rank_exit(id, attempt, 0);
    cr_assert(at_sse_wait(&s, "event: end", 10000), "the end arrives: %s", s.buf);
    cr_assert(at_sse_join(&s, 5000), "the stream closes after the end");
    cr_assert_eq(s.status, 200);
    cr_assert(strstr(s.buf, "COMPLETED"), "%s", s.buf);
    cr_assert(strstr(s.buf, "event: log\ndata: {"), "%s", s.buf);
    long long first = 0;
    bool contiguous;
    cr_assert_eq(count_events(s.buf, &first, &contiguous), 8, "%s", s.buf);
    cr_assert(contiguous, "every line once, in order: %s", s.buf);
    cr_assert(strstr(s.buf, "more 2") < strstr(s.buf, "event: end"), "%s", s.buf);

    /* Reconnect with Last-Event-ID: only the lines after it, then the end. */
    char last[32];
    snprintf(last, sizeof last, "%lld", first + 4);
    at_sse_t r;
    at_sse_open(&r, path, last);
    cr_assert(at_sse_join(&r, 10000), "a finished job's stream ends: %s", r.buf);
    cr_assert_eq(count_events(r.buf, NULL, &contiguous), 3, "%s", r.buf);
    cr_assert(strstr(r.buf, "event: end"), "%s", r.buf);
    cr_assert(!strstr(r.buf, "live 1\""), "%s", r.buf);
    at_sse_free(&r);

    /* The end event's id is "end"; an EventSource reconnecting after it sends that back and is
     * answered 204 No Content, which makes it stop instead of reconnecting forever. */
    cr_assert(strstr(s.buf, "id: end\nevent: end\n"), "%s", s.buf);
    at_sse_t again;
    at_sse_open(&again, path, "end");
    cr_assert(at_sse_join(&again, 5000), "the reconnect is answered at once");
    cr_assert_eq(again.status, 204, "%ld: %s", again.status, again.buf);
    cr_assert_eq(again.len, 0, "no body: %s", again.buf);
    at_sse_free(&again);
    /* a follow of the ended job without Last-Event-ID: the history and the end again */
    at_sse_t fresh;
    at_sse_open(&fresh, path, NULL);
    cr_assert(at_sse_join(&fresh, 10000), "%s", fresh.buf);
    cr_assert_eq(fresh.status, 200);
    cr_assert_eq(count_events(fresh.buf, NULL, &contiguous), 8, "%s", fresh.buf);
    cr_assert(strstr(fresh.buf, "id: end\nevent: end\n"), "%s", fresh.buf);
    at_sse_free(&fresh);
    at_sse_free(&s);

    /* follow on an unknown job is a plain JSON 404 */
    long st;
    char *raw;
    json_t *j = at_req("GET", "/v1/jobs/00000000-0000-4000-8000-000000000000/logs?follow=true", NULL, NULL, &st, &raw);
    cr_assert_eq(st, 404, "%s", raw);
    json_decref(j);
    free(raw);
    const char *h_end[] = {"Last-Event-ID: end", NULL};
    j = at_req("GET", "/v1/jobs/00000000-0000-4000-8000-000000000000/logs?follow=true", NULL, h_end, &st, &raw);
    cr_assert_eq(st, 404, "an unknown job is not found, even after an end: %s", raw);
    json_decref(j);
    free(raw);
    free(id);
}

Test(logs, slow_reader_loses_nothing_and_blocks_no_one)
{
    char *id = at_create_job("slow", NULL, NULL);
    int attempt = at_run_job(id);
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?follow=true", id);
    at_sse_t s;
    at_sse_open(&s, path, NULL);
    at_push_logs(id, attempt, "first", 1, 1);
    cr_assert(at_sse_wait(&s, "first 1", 5000), "%s", s.buf);
    s.stall = true; /* the client stops reading; socket buffers fill */
    int64_t t0 = kiln_mono_us();
    const int batches = 50, per = 2000; /* ~15 MB of events: more than socket buffers and the follower queue hold */
    for (int b = 0; b < batches; b++)
        at_push_logs(id, attempt, "bulk", b * per, per);
    double secs = (kiln_mono_us() - t0) / 1e6;
    cr_assert_lt(secs, 20.0, "producers are not held up by a stalled reader (%.1f s)", secs);
    at_rank_exit(id, attempt, 0);
    s.stall = false;
    cr_assert(at_sse_wait(&s, "event: end", 30000), "the reader catches up (%zu bytes)", s.len);
    cr_assert(at_sse_join(&s, 5000));
    bool contiguous;
    int n = count_events(s.buf, NULL, &contiguous);
    cr_assert_eq(n, 1 + batches * per, "every line delivered once");
    cr_assert(contiguous, "no gaps, no duplicates");
    char last[32];
    snprintf(last, sizeof last, "bulk %d\"", batches * per - 1);
    cr_assert(memmem(s.buf, s.len, last, strlen(last)));
    at_sse_free(&s);
    free(id);
}

Test(logs, keepalive_pings_and_failed_job_end)
{
    at_teardown();
    at_setup_with(&(api_http_config_t){.ping_ms = 200}); /* kilnd's --http-ping-ms */
    char *id = at_create_job("pings", NULL, NULL);
    int attempt = at_run_job(id);
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?follow=true&rank=0", id);
    at_sse_t s;
    at_sse_open(&s, path, NULL);
    cr_assert(at_sse_wait(&s, ": ping", 3000), "an idle stream sends keep-alive comments: %s", s.buf);
    at_rank_exit(id, attempt, 3);
    cr_assert(at_sse_wait(&s, "event: end", 10000), "%s", s.buf);
    cr_assert(strstr(s.buf, "FAILED"), "%s", s.buf);
    cr_assert(at_sse_join(&s, 5000));
    at_sse_free(&s);
    free(id);
}

Test(logs, server_stop_ends_open_streams)
{
    char *id = at_create_job("shutdown", NULL, NULL);
    at_run_job(id);
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?follow=true", id);
    at_sse_t s[3];
    for (int i = 0; i < 3; i++)
        at_sse_open(&s[i], path, NULL);
    for (int i = 0; i < 3; i++)
        cr_assert(at_sse_wait(&s[i], "retry:", 5000), "%s", s[i].buf);
    usleep(100000); /* let each suspend */
    int64_t t0 = kiln_mono_us();
    at_teardown(); /* api_http_stop with three suspended streams */
    cr_assert_lt((kiln_mono_us() - t0) / 1e6, 5.0, "stop does not hang on suspended streams");
    for (int i = 0; i < 3; i++) {
        cr_assert(at_sse_join(&s[i], 5000), "stream %d ends when the server stops", i);
        at_sse_free(&s[i]);
    }
    at_setup(); /* for .fini */
    free(id);
}

/* The value of an unlabelled Prometheus gauge in GET /metrics, or -1. */
static long prom_gauge(const char *name)
{
    long st;
    char *raw;
    json_t *j = at_req("GET", "/metrics", NULL, NULL, &st, &raw);
    json_decref(j);
    long v = -1;
    char needle[128];
    snprintf(needle, sizeof needle, "\n%s ", name);
    const char *p = strstr(raw, needle);
    if (p)
        v = atol(p + strlen(needle));
    free(raw);
    return v;
}

Test(logs, vanished_client_is_noticed_by_the_keepalive)
{
    at_teardown();
    at_setup_with(&(api_http_config_t){.ping_ms = 200});
    char *id = at_create_job("vanish", NULL, NULL);
    at_run_job(id);
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?follow=true", id);
    at_sse_t s;
    at_sse_open(&s, path, NULL);
    cr_assert(at_sse_wait(&s, ": ping", 3000), "%s", s.buf);
    cr_assert_eq(prom_gauge("kiln_http_log_streams"), 1);
    s.abort = true; /* the client goes away while its stream is suspended */
    cr_assert(at_sse_join(&s, 5000));
    long n = -1;
    for (int i = 0; i < 50 && (n = prom_gauge("kiln_http_log_streams")) != 0; i++)
        usleep(100000);
    cr_assert_eq(n, 0, "the server closed the stream of the vanished client");
    at_sse_free(&s);

    /* a bad Last-Event-ID is a plain 400 */
    const char *hdr[] = {"Last-Event-ID: seventeen", NULL};
    long st;
    char *raw;
    json_t *j = at_req("GET", path, NULL, hdr, &st, &raw);
    cr_assert_eq(st, 400, "%s", raw);
    cr_assert_str_eq(json_string_value(json_object_get(j, "field")), "Last-Event-ID", "%s", raw);
    json_decref(j);
    free(raw);
    free(id);
}
