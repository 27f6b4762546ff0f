/* test_ingest.c - ingest is exactly-once: a numbered batch (stream_id, batch_seq) that an agent
 * sends again after losing kilnd's reply is acknowledged and stored once; the next number of the
 * same stream, or the same number of another stream, is stored. Real service, real database. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/service/fixture.h"

static void send_logs(const char *wid, const char *job, uint64_t stream, uint64_t seq, int first, int n)
{
    push_logs_seq(wid, job, 1, 0, first, n, stream, seq);
}

static void send_metrics(const char *wid, const char *job, uint64_t stream, uint64_t seq, int step0, int n)
{
    Kiln__MetricPoint *pts = calloc((size_t)n, sizeof(*pts));
    Kiln__MetricPoint **ptrs = calloc((size_t)n, sizeof(*ptrs));
    for (int i = 0; i < n; i++) {
        kiln__metric_point__init(&pts[i]);
        pts[i].name = "train_loss";
        pts[i].step = step0 + i;
        pts[i].value = 3.0 - 0.01 * i;
        pts[i].time_us = kiln_now_us();
        ptrs[i] = &pts[i];
    }
    Kiln__MetricBatch b = KILN__METRIC_BATCH__INIT;
    b.worker_id = (char *)wid;
    b.job_id = (char *)job;
    b.attempt = 1;
    b.points = ptrs;
    b.n_points = (size_t)n;
    b.stream_id = stream;
    b.batch_seq = seq;
    cr_assert_eq(svc_agent_metrics(svc, wid, &b, &err), 0, "metrics: %s", err.message);
    free(pts);
    free(ptrs);
}

static size_t stored_lines(const char *job)
{
    svc_log_query_t q = {.rank = -1, .limit = 10000};
    json_t *out = NULL;
    cr_assert_eq(svc_job_logs(svc, svc_caller_kilnd(), job, &q, &out, &err), 0, "%s", err.message);
    size_t n = json_array_size(json_object_get(out, "lines"));
    json_decref(out);
    return n;
}

/* Points of train_loss per step (steps 1..99 counted into count[]). */
static size_t stored_points(const char *job, int count[100])
{
    svc_metrics_query_t q = {.name = "train_loss", .max_points = 100000, .max_points_set = true, .attempt = 0};
    json_t *out = NULL;
    cr_assert_eq(svc_job_metrics(svc, svc_caller_kilnd(), job, &q, &out, &err), 0, "%s", err.message);
    json_t *pts = json_object_get(json_array_get(json_object_get(out, "metrics"), 0), "points");
    memset(count, 0, 100 * sizeof(int));
    size_t i;
    json_t *p;
    json_array_foreach(pts, i, p) {
        json_int_t step = json_integer_value(json_object_get(p, "step"));
        cr_assert(step >= 1 && step < 100, "step %lld", (long long)step);
        count[step]++;
        cr_assert_eq(json_integer_value(json_object_get(p, "attempt")), 1, "every point carries its attempt");
    }
    size_t n = json_array_size(pts);
    json_decref(out);
    return n;
}

Test(ingest, a_batch_sent_again_is_stored_once, .init = setup, .fini = teardown)
{
    char wids[1][64], job[40];
    run_job(1, 1, wids, job);
    size_t before = stored_lines(job); /* lines kilnd itself may have written */

    send_logs(wids[0], job, 7, 1, 0, 5);
    send_logs(wids[0], job, 7, 1, 0, 5); /* the reply was lost: the agent sends it again */
    cr_assert_eq(stored_lines(job), before + 5, "a log batch sent twice is stored once");
    send_logs(wids[0], job, 7, 2, 5, 3);
    send_logs(wids[0], job, 8, 1, 8, 2); /* another stream (a restarted agent's) has its own numbers */
    send_logs(wids[0], job, 7, 2, 5, 3);
    cr_assert_eq(stored_lines(job), before + 10, "the next batch and another stream's are stored, once");

    int count[100];
    send_metrics(wids[0], job, 9, 1, 1, 20);
    send_metrics(wids[0], job, 9, 1, 1, 20);
    cr_assert_eq(stored_points(job, count), 20, "a metric batch sent twice is stored once");
    send_metrics(wids[0], job, 9, 2, 21, 10);
    send_metrics(wids[0], job, 9, 2, 21, 10);
    send_metrics(wids[0], job, 9, 1, 1, 20); /* a late copy of an older batch */
    cr_assert_eq(stored_points(job, count), 30);
    for (int s = 1; s <= 30; s++)
        cr_assert_eq(count[s], 1, "step %d stored %d times", s, count[s]);
}

/* Sends one point of each of names[0..n) at step; returns svc_agent_metrics' status. */
static int send_names(const char *wid, const char *job, uint64_t seq, char (*names)[16], size_t n, int step)
{
    Kiln__MetricPoint *pts = calloc(n, sizeof(*pts));
    Kiln__MetricPoint **ptrs = calloc(n, sizeof(*ptrs));
    for (size_t i = 0; i < n; i++) {
        kiln__metric_point__init(&pts[i]);
        pts[i].name = names[i];
        pts[i].step = step;
        pts[i].value = (double)i;
        ptrs[i] = &pts[i];
    }
    Kiln__MetricBatch b = KILN__METRIC_BATCH__INIT;
    b.worker_id = (char *)wid;
    b.job_id = (char *)job;
    b.attempt = 1;
    b.points = ptrs;
    b.n_points = n;
    b.stream_id = 11;
    b.batch_seq = seq;
    int rc = svc_agent_metrics(svc, wid, &b, &err);
    free(pts);
    free(ptrs);
    return rc;
}

/* A metric's name is shown in others' terminals and pages: a batch naming one with an escape
 * sequence or a bidirectional override is refused whole (kiln's agent never sends one: its parser
 * leaves such entries out and says so in the job's log), and nothing of it is stored. */
Test(ingest, metric_names_with_control_characters_are_refused, .init = setup, .fini = teardown)
{
    char wids[1][64], job[40];
    run_job(1, 1, wids, job);
    char *wid = wids[0];
    static const char *const names[] = {"loss\x1b]0;owned\x07", "acc\xe2\x80\xae", "a\tb", "c1\xc2\x9b"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        Kiln__MetricPoint ok = KILN__METRIC_POINT__INIT, bad = KILN__METRIC_POINT__INIT;
        ok.name = "train_loss";
        ok.step = 1;
        ok.value = 1.0;
        bad.name = (char *)names[i];
        bad.step = 1;
        bad.value = 2.0;
        Kiln__MetricPoint *ptrs[] = {&ok, &bad};
        Kiln__MetricBatch b = KILN__METRIC_BATCH__INIT;
        b.worker_id = wid;
        b.job_id = job;
        b.attempt = 1;
        b.points = ptrs;
        b.n_points = 2;
        b.stream_id = 7;
        b.batch_seq = i + 1;
        cr_assert_eq(svc_agent_metrics(svc, wid, &b, &err), KILN_EINVAL, "name %zu accepted", i);
        cr_assert_str_eq(err.field, "points.name");
        cr_assert(strstr(err.message, "control character"), "%s", err.message);
    }
    /* nor a step below 0 (the metric history's ranges start at 0) */
    char neg[1][16] = {"train_loss"};
    cr_assert_eq(send_names(wid, job, 50, neg, 1, -1), KILN_EINVAL);
    cr_assert_str_eq(err.field, "points.step");
    int count[100];
    cr_assert_eq(stored_points(job, count), 0);
}

/* The points job has of metric name (0 when it has no such series). */
static size_t points_of(const char *job, const char *name)
{
    json_t *out = NULL;
    svc_metrics_query_t q = {.name = name, .max_points = 10000, .max_points_set = true};
    cr_assert_eq(svc_job_metrics(svc, svc_caller_kilnd(), job, &q, &out, &err), 0, "%s", err.message);
    size_t n = json_array_size(json_object_get(json_array_get(json_object_get(out, "metrics"), 0), "points"));
    json_decref(out);
    return n;
}

/* n metric names m000000, m000001, ... numbered modulo distinct (caller frees). */
static char (*numbered_names(size_t n, size_t distinct))[16]
{
    char (*names)[16] = calloc(n, sizeof(*names));
    for (size_t i = 0; i < n; i++)
        snprintf(names[i], sizeof(names[0]), "m%06u", (unsigned)(i % distinct));
    return names;
}

/* A script makes metric names without end (m000000, m000001, ...): each is a summary row, a key
 * of the job's reply and of search's. A job may have SVC_METRIC_NAMES_MAX; a batch that would
 * give it more is refused whole, naming the limit, and one of names it has is still taken. */
Test(ingest, a_job_has_at_most_so_many_metric_names, .init = setup, .fini = teardown)
{
    char wids[1][64], job[40];
    run_job(1, 1, wids, job);
    char (*names)[16] = numbered_names(SVC_METRIC_NAMES_MAX + 1, SVC_METRIC_NAMES_MAX + 1);
    /* up to the limit, in batches of 100 */
    for (size_t i = 0; i < SVC_METRIC_NAMES_MAX; i += 100)
        cr_assert_eq(send_names(wids[0], job, i / 100 + 1, names + i, 100, 1), 0, "%s", err.message);
    /* one more name, with one the job has */
    cr_assert_eq(send_names(wids[0], job, 100, names + SVC_METRIC_NAMES_MAX - 1, 2, 2), KILN_EINVAL);
    cr_assert_str_eq(err.field, "points.name");
    cr_assert(strstr(err.message, "at most 1000"), "%s", err.message);
    /* the names it has are still taken */
    cr_assert_eq(send_names(wids[0], job, 101, names, 50, 3), 0, "%s", err.message);
    cr_assert_eq(points_of(job, "m000000"), 2, "steps 1 and 3");
    cr_assert_eq(points_of(job, names[SVC_METRIC_NAMES_MAX]), 0, "the refused name has no series");
    free(names);
}

/* A batch is refused before any work when it is larger than kiln-agent sends
 * (KILN_METRIC_BATCH_POINTS) or names more metrics than a job may have: grouping a batch's points
 * by name grew with the square of its names. Nothing of either is stored. */
Test(ingest, a_batch_too_large_or_naming_too_many_metrics_is_refused_whole, .init = setup, .fini = teardown)
{
    char wids[1][64], job[40];
    run_job(1, 1, wids, job);
    size_t n = KILN_METRIC_BATCH_POINTS + 1;
    char (*names)[16] = numbered_names(n, SVC_METRIC_NAMES_MAX + 1);
    cr_assert_eq(send_names(wids[0], job, 1, names, n, 1), KILN_EINVAL);
    cr_assert_str_eq(err.field, "points");
    cr_assert(strstr(err.message, "at most 5000 points"), "%s", err.message);
    /* 1,001 names in 5,000 points: the names' limit, though the job has none yet */
    cr_assert_eq(send_names(wids[0], job, 2, names, KILN_METRIC_BATCH_POINTS, 1), KILN_EINVAL);
    cr_assert_str_eq(err.field, "points.name");
    cr_assert(strstr(err.message, "1001 metric names or more; a job may have at most 1000"), "%s", err.message);
    /* 1,000 names in 5,000 points are taken */
    free(names);
    names = numbered_names(KILN_METRIC_BATCH_POINTS, SVC_METRIC_NAMES_MAX);
    cr_assert_eq(send_names(wids[0], job, 3, names, KILN_METRIC_BATCH_POINTS, 2), 0, "%s", err.message);
    cr_assert_eq(points_of(job, "m000000"), 5, "step 2's five points only: the refused batches stored nothing");
    free(names);
}

/* A log line is at most SVC_LOG_LINE_MAX bytes: kiln-agent's longest (16 KiB cut, its UTF-8
 * repair tripling it) is stored; a longer one makes the whole batch refused, naming the limit,
 * and nothing of it is stored. */
Test(ingest, a_log_line_is_at_most_so_many_bytes, .init = setup, .fini = teardown)
{
    char wids[1][64], job[40];
    run_job(1, 1, wids, job);
    size_t before = stored_lines(job);
    char *longest = malloc(3 * 16384 + 1), *over = malloc(SVC_LOG_LINE_MAX + 2);
    memset(longest, 'x', 3 * 16384);
    longest[3 * 16384] = '\0';
    memset(over, 'y', SVC_LOG_LINE_MAX + 1);
    over[SVC_LOG_LINE_MAX + 1] = '\0';
    Kiln__LogLine a = KILN__LOG_LINE__INIT, b = KILN__LOG_LINE__INIT;
    a.stream = b.stream = "stdout";
    a.line = longest;
    b.line = over;
    Kiln__LogLine *lines[] = {&a, &b};
    Kiln__LogBatch batch = KILN__LOG_BATCH__INIT;
    batch.worker_id = wids[0];
    batch.job_id = job;
    batch.attempt = 1;
    batch.lines = lines;
    batch.n_lines = 2;
    batch.stream_id = 5;
    batch.batch_seq = 1;
    cr_assert_eq(svc_agent_logs(svc, wids[0], &batch, &err), KILN_EINVAL, "a line of %d bytes taken",
                 SVC_LOG_LINE_MAX + 1);
    cr_assert_str_eq(err.field, "lines.line");
    cr_assert(strstr(err.message, "line 1 of the log batch is 65537 bytes") && strstr(err.message, "at most 65536"),
              "%s", err.message);
    cr_assert_eq(stored_lines(job), before, "nothing of a refused batch is stored");
    batch.n_lines = 1;
    batch.batch_seq = 2;
    cr_assert_eq(svc_agent_logs(svc, wids[0], &batch, &err), 0, "%s", err.message);
    cr_assert_eq(stored_lines(job), before + 1);
    free(longest);
    free(over);
}

/* A log batch of more lines than KILN_LOG_BATCH_LINES is refused before any work (each line is a
 * check and a row: 300,000 empty lines held a gRPC thread for 3 s, and a 16 MiB message carries
 * millions); one of exactly that many is stored whole. */
Test(ingest, a_log_batch_of_too_many_lines_is_refused_whole, .init = setup, .fini = teardown)
{
    char wids[1][64], job[40];
    run_job(1, 1, wids, job);
    size_t before = stored_lines(job), n = KILN_LOG_BATCH_LINES + 1;
    Kiln__LogLine *l = calloc(n, sizeof *l);
    Kiln__LogLine **lines = calloc(n, sizeof *lines);
    for (size_t i = 0; i < n; i++) {
        kiln__log_line__init(&l[i]);
        l[i].stream = "stdout";
        l[i].line = "";
        lines[i] = &l[i];
    }
    Kiln__LogBatch batch = KILN__LOG_BATCH__INIT;
    batch.worker_id = wids[0];
    batch.job_id = job;
    batch.attempt = 1;
    batch.lines = lines;
    batch.n_lines = n;
    batch.stream_id = 6;
    batch.batch_seq = 1;
    cr_assert_eq(svc_agent_logs(svc, wids[0], &batch, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "lines");
    cr_assert(strstr(err.message, "at most 10000 lines; this one has 10001"), "%s", err.message);
    cr_assert_eq(stored_lines(job), before, "nothing of a refused batch is stored");
    batch.n_lines = n - 1;
    batch.batch_seq = 2;
    cr_assert_eq(svc_agent_logs(svc, wids[0], &batch, &err), 0, "%s", err.message);
    cr_assert_eq(stored_lines(job), before + n - 1);
    free(l);
    free(lines);
}
