/* test_cli.c - the kiln CLI's formatting, SSE parsing and error handling on canned API replies,
 * and its exit statuses for usage errors and an unreachable server. The end-to-end suite runs
 * the same binary against a real kilnd. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <math.h>
#include <limits.h>
#include <stdio.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/api_names.h"
#include "cli/cli.h"
#include "cli/cli_int.h"
#include "tests/common/harness.h"

typedef void (*print_fn)(FILE *, const json_t *, int64_t);

/* Runs fn into a memory stream and returns what it printed (caller frees). The stream's buffer
 * pointers live on the heap so the compiler does not see them escape a stack frame. */
static char *capture(print_fn fn, const json_t *j, int64_t now)
{
    struct mem {
        char *text;
        size_t len;
    } *m = calloc(1, sizeof(*m));
    FILE *f = open_memstream(&m->text, &m->len);
    fn(f, j, now);
    fclose(f);
    char *out = m->text;
    free(m);
    return out;
}

static void print_jobs(FILE *f, const json_t *j, int64_t now) { cli_print_jobs(f, j, now, false); }
static void print_workers(FILE *f, const json_t *j, int64_t now) { cli_print_workers(f, j, now, false); }
static void print_workers_wide(FILE *f, const json_t *j, int64_t now) { cli_print_workers(f, j, now, true); }
static void print_log_line(FILE *f, const json_t *j, int64_t now) { (void)now; cli_print_log_line(f, j); }
static void print_raw(FILE *f, const json_t *j, int64_t now) { (void)now; cli_print_metrics_raw(f, j); }

static json_t *load(const char *s)
{
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    cr_assert_not_null(j, "bad fixture: %s", e.text);
    return j;
}

static const char *JOB_RUNNING =
    "{\"id\": \"0b6c1f2e-1234-4abc-8def-0123456789ab\", \"name\": \"gpt-tiny\", \"state\": \"RUNNING\","
    " \"reason\": \"all 2 ranks started\", \"attempt\": 1, \"submitted_by\": \"alice\", \"created_at\": \"2026-11-21T06:00:00.000Z\","
    " \"updated_at\": \"2026-11-21T06:01:00Z\", \"started_at\": \"2026-11-21T06:00:10Z\", \"ended_at\": null,"
    " \"progress\": {\"step\": 120, \"total_steps\": 2000, \"eta_s\": 310.5},"
    " \"metrics\": {\"train_loss\": 2.41234, \"tokens_per_s\": 51234.0}, \"workers\": [\"w-1\", \"w-2\"],"
    " \"spec\": {\"resources\": {\"nodes\": 2, \"slots_per_node\": 1, \"slot_type\": \"cpu\"}}}";

static int64_t at(const char *t)
{
    int64_t us = 0;
    cr_assert_eq(kiln_time_parse(t, &us), 0);
    return us;
}

Test(cli_format, durations)
{
    char b[32];
    cr_assert_str_eq(cli_fmt_duration(0, b, sizeof b), "0s");
    cr_assert_str_eq(cli_fmt_duration(-5, b, sizeof b), "0s");
    cr_assert_str_eq(cli_fmt_duration(59.4, b, sizeof b), "59s");
    cr_assert_str_eq(cli_fmt_duration(192, b, sizeof b), "3m12s");
    cr_assert_str_eq(cli_fmt_duration(7500, b, sizeof b), "2h05m");
    cr_assert_str_eq(cli_fmt_duration(3 * 86400 + 4 * 3600, b, sizeof b), "3d04h");
}

Test(cli_format, values_and_short_ids)
{
    char b[32];
    cr_assert_str_eq(cli_fmt_value(2.41234, b, sizeof b), "2.412");
    cr_assert_str_eq(cli_fmt_value(0.0003, b, sizeof b), "0.0003");
    cr_assert_str_eq(cli_fmt_value(51234.4, b, sizeof b), "51234");
    cr_assert_str_eq(cli_fmt_value(1e-6, b, sizeof b), "1.000e-06");
    cr_assert_str_eq(cli_fmt_value(0.0 / 0.0, b, sizeof b), "-");
    cr_assert_str_eq(cli_short_id("0b6c1f2e-1234", b, sizeof b), "0b6c1f2e");
    cr_assert_str_eq(cli_short_id("abc", b, sizeof b), "abc");
}

Test(cli_format, sparkline)
{
    char b[200];
    double up[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    cr_assert_str_eq(cli_sparkline(up, 8, 32, b, sizeof b), "▁▂▃▄▅▆▇█");
    double flat[3] = {2, 2, 2};
    cr_assert_str_eq(cli_sparkline(flat, 3, 32, b, sizeof b), "▄▄▄");
    /* 100 falling values into 10 cells: first cell highest, last lowest, 10 cells wide. */
    double down[100];
    for (int i = 0; i < 100; i++)
        down[i] = 100 - i;
    cli_sparkline(down, 100, 10, b, sizeof b);
    cr_assert_eq(strlen(b), 30);
    cr_assert(!strncmp(b, "█", 3) && !strcmp(b + 27, "▁"), "got %s", b);
    cr_assert_str_eq(cli_sparkline(up, 0, 10, b, sizeof b), "");
    /* A too-small buffer clips instead of overflowing. */
    char small[10];
    cli_sparkline(up, 8, 32, small, sizeof small);
    cr_assert_eq(strlen(small), 9);
}

Test(cli_format, jobs_table)
{
    json_t *j1 = load(JOB_RUNNING);
    json_t *jobs = json_pack("[O{s:s,s:s,s:s,s:s,s:s}]", j1, "id", "77777777-0000-4000-8000-000000000000",
                             "name", "queued-one", "state", "QUEUED", "created_at", "2026-11-21T06:04:00Z",
                             "started_at", "");
    char *out = capture(print_jobs, jobs,
                        at("2026-11-21T06:05:00Z"));
    /* Header, then one line per job, columns aligned under the header. */
    char *l1 = strchr(out, '\n') + 1, *l2 = strchr(l1, '\n') + 1;
    cr_assert(!strncmp(out, "ID        NAME        STATE", 26), "header: %s", out);
    cr_assert(strstr(out, " WALL-TIME\n"), "the column says it is wall time: %s", out);
    cr_assert(strstr(l1, "0b6c1f2e  gpt-tiny    RUNNING") == l1, "row 1: %s", l1);
    cr_assert(strstr(l1, "120/2000") && strstr(l1, "2.4123") && strstr(l1, "5m00s") && strstr(l1, "4m50s"),
              "row 1: %s", l1);
    cr_assert(strstr(l2, "77777777  queued-one  QUEUED") == l2, "row 2: %s", l2);
    /* Right-aligned columns end at the same offset on every line. */
    cr_assert_eq(strchr(l1, '\n') - l1, strchr(l2, '\n') - l2, "%s", out);
    cr_assert_eq(strchr(out, '\n') - out, strchr(l1, '\n') - l1, "%s", out);
    free(out);
    json_t *none = json_array();
    out = capture(print_jobs, none, 0);
    cr_assert_str_eq(out, "no jobs\n");
    free(out);
    json_decref(none);
    json_decref(jobs);
    json_decref(j1);
}

static void print_job_with_events(FILE *f, const json_t *job, int64_t now)
{
    json_t *ev = load("{\"events\": ["
                      "{\"seq\": 1, \"from_state\": null, \"to_state\": \"QUEUED\", \"reason\": \"submitted\","
                      " \"time\": \"2026-11-21T06:00:00Z\", \"attempt\": 0, \"actor\": \"alice\"},"
                      "{\"seq\": 2, \"from_state\": \"QUEUED\", \"to_state\": \"SCHEDULED\", \"reason\": "
                      "\"placed on w-1, w-2\", \"time\": \"2026-11-21T06:00:01Z\", \"attempt\": 1},"
                      "{\"seq\": 3, \"from_state\": \"QUEUED\", \"to_state\": \"QUEUED\", \"reason\": "
                      "\"preempting job x\", \"time\": \"2026-11-21T06:00:02Z\", \"attempt\": 1}]}");
    cli_print_job(f, job, ev, now);
    json_decref(ev);
}

Test(cli_format, describe)
{
    json_t *job = load(JOB_RUNNING);
    char *out = capture(print_job_with_events, job,
                        at("2026-11-21T06:05:00Z"));
    cr_assert(strstr(out, "ID:           0b6c1f2e-1234-4abc-8def-0123456789ab\n"), "%s", out);
    cr_assert(strstr(out, "State:        RUNNING  all 2 ranks started\n"), "%s", out);
    cr_assert(strstr(out, "\nSubmitted by: alice\n"), "a space after every label: %s", out);
    cr_assert(strstr(out, "Progress:     120/2000 steps") && strstr(out, "6.0%  ETA 5m11s"), "%s", out);
    cr_assert(strstr(out, "Workers:      w-1, w-2\n"), "%s", out);
    cr_assert(strstr(out, "Resources:    2 nodes x 1 cpu slot\n"), "%s", out);
    cr_assert(strstr(out, "  train_loss       2.412\n"), "%s", out);
    cr_assert(strstr(out, "2026-11-21 06:00:00       -  →  QUEUED     alice  submitted\n"), "%s", out);
    cr_assert(strstr(out, "2026-11-21 06:00:01  QUEUED  →  SCHEDULED  kilnd  placed on w-1, w-2\n"), "%s", out);
    /* an event that leaves the job where it is names its state once, with no arrow */
    cr_assert(strstr(out, "2026-11-21 06:00:02             QUEUED     kilnd  preempting job x\n"), "%s", out);
    cr_assert(strstr(out, "\nWall time:    4m50s since its first start\n"), "%s", out);
    free(out);
    json_decref(job);
}

/* A preempted job's wall time keeps counting while it waits, and describe says so: from its first
 * start, the waits between attempts included; once it ended, first start to end. */
Test(cli_format, describe_says_the_wall_time_counts_the_waits)
{
    json_t *job = load(JOB_RUNNING);
    json_object_set_new(job, "state", json_string("PREEMPTED"));
    json_object_set_new(job, "reason", json_string("preempted by job x: every rank has exited"));
    char *out = capture(print_job_with_events, job, at("2026-11-21T06:05:00Z"));
    cr_assert(strstr(out, "\nWall time:    4m50s since its first start, waits between attempts included (it waits "
                          "now)\n"), "%s", out);
    free(out);
    json_object_set_new(job, "state", json_string("COMPLETED"));
    json_object_set_new(job, "attempt", json_integer(2));
    json_object_set_new(job, "ended_at", json_string("2026-11-21T06:20:10Z"));
    out = capture(print_job_with_events, job, at("2026-11-21T07:00:00Z"));
    cr_assert(strstr(out, "\nWall time:    20m00s from its first start to its end, waits between attempts "
                          "included\n"), "%s", out);
    free(out);
    json_object_set_new(job, "started_at", json_null());
    json_object_set_new(job, "state", json_string("QUEUED"));
    json_object_set_new(job, "ended_at", json_null());
    out = capture(print_job_with_events, job, at("2026-11-21T07:00:00Z"));
    cr_assert(strstr(out, "\nWall time:    -\n"), "%s", out);
    free(out);
    json_decref(job);
}

Test(cli_format, describe_shows_a_waiting_jobs_pending_block)
{
    /* position, what is missing, the jobs it waits for and the estimated start, as REST gives them */
    json_t *job = load("{\"id\": \"11111111-2222-4333-8444-555555555555\", \"name\": \"waits\", \"state\": \"QUEUED\","
                       " \"reason\": \"waiting for quota: needs 2 cpu slot(s); queue nlp: quota 8, used 8\","
                       " \"queue\": \"nlp\", \"priority\": 5, \"created_at\": \"2026-11-21T06:00:00Z\","
                       " \"pending\": {\"position\": 3, \"missing\": \"needs 2 cpu slot(s) on 2 worker(s); queue nlp:"
                       " quota 8, used 8, may borrow 0 more\", \"blocking_jobs\": [\"aaaaaaaa-0000-4000-8000-000000000001\","
                       " \"bbbbbbbb-0000-4000-8000-000000000002\"], \"estimated_start\": \"2026-11-21T06:10:30Z\"}}");
    char *out = capture(print_job_with_events, job, at("2026-11-21T06:05:00Z"));
    /* the State line says what it waits for; the details are the pending block's, not said twice */
    cr_assert(strstr(out, "Queue:        nlp (priority 5)\nState:        QUEUED  waiting for quota\n"
                          "Position:     3 in queue nlp\n"), "the queue and priority it waits with: %s", out);
    cr_assert(strstr(out, "Missing:      needs 2 cpu slot(s) on 2 worker(s); queue nlp: quota 8, used 8, may borrow 0 "
                          "more\n"), "%s", out);
    cr_assert(strstr(out, "Waits for:    aaaaaaaa-0000-4000-8000-000000000001, bbbbbbbb-0000-4000-8000-000000000002\n"),
              "%s", out);
    cr_assert(strstr(out, "Est. start:   2026-11-21 06:10:30 (in 5m30s)\n"), "%s", out);
    free(out);
    /* a preempted job's progress has no ETA: it is not running, and its Est. start says when it may */
    json_object_set_new(job, "state", json_string("PREEMPTED"));
    json_object_set_new(job, "progress", json_pack("{s:i, s:i, s:f}", "step", 68, "total_steps", 1000, "eta_s", 310.5));
    out = capture(print_job_with_events, job, at("2026-11-21T06:05:00Z"));
    cr_assert(strstr(out, "Progress:     68/1000 steps") && !strstr(out, "ETA"), "%s", out);
    json_object_set_new(job, "state", json_string("QUEUED"));
    free(out);
    /* no estimate: it says why; no blocking jobs: no line for them */
    json_object_del(json_object_get(job, "pending"), "estimated_start");
    json_array_clear(json_object_get(json_object_get(job, "pending"), "blocking_jobs"));
    out = capture(print_job_with_events, job, at("2026-11-21T06:05:00Z"));
    cr_assert(strstr(out, "Est. start:   unknown (what it waits for has no predicted end yet)\n"), "%s", out);
    cr_assert(!strstr(out, "Waits for:"), "%s", out);
    free(out);
    /* a job that does not wait has no block, and its reason is whole */
    json_object_del(job, "pending");
    json_object_set_new(job, "state", json_string("RUNNING"));
    json_object_set_new(job, "reason", json_string("all 2 ranks started: on w-1, w-2"));
    out = capture(print_job_with_events, job, at("2026-11-21T06:05:00Z"));
    cr_assert(!strstr(out, "Position:") && !strstr(out, "Est. start:"), "%s", out);
    cr_assert(strstr(out, "State:        RUNNING  all 2 ranks started: on w-1, w-2\n"), "%s", out);
    free(out);
    json_decref(job);
}

Test(cli_format, describe_shows_a_script_jobs_hyperparameters_as_written)
{
    /* 0.1 is printed as 0.1, not as the nearest double's 17 digits */
    json_t *job = load("{\"id\": \"11111111-2222-4333-8444-555555555555\", \"name\": \"toy\", \"state\": \"QUEUED\","
                       " \"queue\": \"default\", \"priority\": 0, \"created_at\": \"2026-11-21T06:00:00Z\","
                       " \"spec\": {\"entry_point\": \"train.py\", \"source\": \"/data/code\","
                       " \"hyperparameters\": {\"lr\": 0.1, \"epochs\": 3, \"decay\": 1e-5},"
                       " \"data\": {\"channels\": {\"train\": \"/data/t.txt\", \"validation\": \"/data/v\"}}}}");
    char *out = capture(print_job_with_events, job, at("2026-11-21T06:05:00Z"));
    /* a label longer than the column keeps a space before its value */
    cr_assert(strstr(out, "Channel train: /data/t.txt\n"), "%s", out);
    cr_assert(strstr(out, "Channel validation: /data/v\n"), "%s", out);
    cr_assert(strstr(out, "Hyperparams:  {\"decay\":1.0000000000000001e-05,") == NULL, "%s", out);
    cr_assert(strstr(out, "Hyperparams:  {\"decay\":1e-5,\"epochs\":3,\"lr\":0.1}\n"), "%s", out);
    cr_assert(strstr(out, "Queue:        default (priority 0)\n"), "%s", out);
    free(out);
    json_decref(job);
}

static void print_metrics32(FILE *f, const json_t *r, int64_t now)
{
    (void)now;
    cli_print_metrics(f, r, 32);
}

Test(cli_format, metrics_summary_and_raw)
{
    json_t *r = load("{\"metrics\": [{\"name\": \"train_loss\", \"points\": ["
                     "{\"step\": 1, \"value\": 5.5}, {\"step\": 2, \"value\": 4.0}, {\"step\": 3, \"value\": 3.25}]},"
                     "{\"name\": \"lr\", \"points\": []}]}");
    char *out = capture(print_metrics32, r, 0);
    cr_assert(strstr(out, "NAME        POINTS  STEPS  LAST   MIN  MAX  TREND\n") == out, "%s", out);
    cr_assert(strstr(out, "train_loss       3    1-3  3.25  3.25  5.5  █▃▁\n"), "%s", out);
    cr_assert(strstr(out, "lr               0      -     -     -    -  -\n"), "%s", out);
    free(out);
    json_array_remove(json_object_get(r, "metrics"), 1);
    char *raw = capture(print_raw, r, 0);
    cr_assert_str_eq(raw, "step,value\n1,5.5\n2,4\n3,3.25\n");
    free(raw);
    json_decref(r);
}

/* Steps are integers and print as the integers the JSON holds: INT64_MAX rounded through a double
 * read 9223372036854775808, which is no step at all. */
Test(cli_format, steps_print_as_the_integers_they_are)
{
    json_t *r = load("{\"metrics\": [{\"name\": \"loss\", \"points\": ["
                     "{\"step\": 9223372036854775806, \"value\": 2}, {\"step\": 9223372036854775807, \"value\": 1}]}]}");
    char *out = capture(print_metrics32, r, 0);
    cr_assert(strstr(out, " 9223372036854775806-9223372036854775807 "), "%s", out);
    free(out);
    char *raw = capture(print_raw, r, 0);
    cr_assert_str_eq(raw, "step,value\n9223372036854775806,2\n9223372036854775807,1\n");
    free(raw);
    json_decref(r);

    json_t *job = load(JOB_RUNNING);
    json_object_set_new(job, "progress", json_pack("{s:I,s:I}", "step", (json_int_t)INT64_MAX - 1,
                                                   "total_steps", (json_int_t)INT64_MAX));
    json_t *jobs = json_pack("[O]", job);
    out = capture(print_jobs, jobs, at("2026-11-21T06:05:00Z"));
    cr_assert(strstr(out, " 9223372036854775806/9223372036854775807 "), "%s", out);
    free(out);
    out = capture(print_job_with_events, job, at("2026-11-21T06:05:00Z"));
    cr_assert(strstr(out, "Progress:     9223372036854775806/9223372036854775807 steps"), "%s", out);
    free(out);
    json_decref(jobs);
    json_decref(job);
}

Test(cli_format, log_lines_and_workers)
{
    json_t *l = load("{\"seq\": 3, \"rank\": 1, \"stream\": \"stdout\", \"line\": \"step 1 loss 5.5\"}");
    char *out = capture(print_log_line, l, 0);
    cr_assert_str_eq(out, "[rank 1] step 1 loss 5.5\n");
    free(out);
    json_decref(l);
    l = load("{\"seq\": 9, \"rank\": 0, \"attempt\": 2, \"line\": \"resumed at step 40\"}");
    out = capture(print_log_line, l, 0);
    cr_assert_str_eq(out, "[rank 0, attempt 2] resumed at step 40\n");
    free(out);
    json_decref(l);
    json_t *w = load("{\"workers\": [{\"id\": \"w-1\", \"hostname\": \"h\", \"address\": \"127.0.0.1\","
                     " \"slots\": 2, \"slots_free\": 1, \"slot_type\": \"cpu\", \"state\": \"ALIVE\","
                     " \"last_heartbeat\": \"2026-11-21T06:04:58Z\", \"registered_at\": \"2026-11-21T06:00:00Z\","
                     " \"join_token\": \"file\", \"approval\": \"APPROVED\"},"
                     " {\"id\": \"w-2\", \"hostname\": \"h\", \"address\": \"127.0.0.1\", \"slots\": 2,"
                     " \"slots_free\": 2, \"slot_type\": \"cpu\", \"state\": \"ALIVE\", \"draining\": true,"
                     " \"last_heartbeat\": \"2026-11-21T06:04:59Z\", \"registered_at\": \"2026-11-21T06:04:00Z\","
                     " \"join_token\": \"jt_00112233aabbccdd\", \"approval\": \"APPROVED\"},"
                     " {\"id\": \"w-3\", \"hostname\": \"x\", \"address\": \"10.0.0.9\", \"slots\": 8,"
                     " \"slots_free\": 8, \"slot_type\": \"gpu\", \"state\": \"ALIVE\", \"approval\": \"PENDING\","
                     " \"last_heartbeat\": \"2026-11-21T06:04:59Z\", \"registered_at\": \"2026-11-21T06:04:50Z\","
                     " \"join_token\": \"jt_00112233aabbccdd\", \"registered_from\": \"10.0.0.9\", \"cert_sha256\":"
                     " \"af576245b461f53c83a6574236760363b03a9b1cf3479e4809e0fecd45940afd\"}]}");
    out = capture(print_workers, w, at("2026-11-21T06:05:00Z"));
    cr_assert(strstr(out, "w-1  h     127.0.0.1  cpu       2     1  ALIVE        2s ago   5m00s ago  file\n"), "%s", out);
    cr_assert(strstr(out, "w-2  h     127.0.0.1  cpu       2     2  DRAINING     1s ago   1m00s ago  jt_00112233aabbccdd\n"),
              "%s", out);
    cr_assert(strstr(out, "w-3  x     10.0.0.9   gpu       8     8  PENDING      1s ago     10s ago  jt_00112233aabbccdd\n"),
              "a worker that waits for approval says so: %s", out);
    free(out);
    /* -o wide: where it registered from and the certificate it is bound to */
    out = capture(print_workers_wide, w, at("2026-11-21T06:05:00Z"));
    cr_assert(strstr(out, "JOIN-TOKEN           FROM      CERT-SHA256"), "%s", out);
    cr_assert(strstr(out, "jt_00112233aabbccdd  10.0.0.9  af576245b461f53c"), "%s", out);
    free(out);
    json_decref(w);
}

static void print_join_tokens(FILE *f, const json_t *j, int64_t now) { cli_print_join_tokens(f, j, now); }
static void print_bans(FILE *f, const json_t *j, int64_t now) { (void)now; cli_print_worker_bans(f, j); }

Test(cli_format, join_tokens_and_bans)
{
    json_t *j = load("{\"join_tokens\": [{\"id\": \"jt_00112233aabbccdd\", \"description\": \"rack 4\", \"uses\": 3,"
                     " \"uses_left\": 1, \"registrations\": 2, \"created_at\": \"2026-11-21T05:00:00Z\","
                     " \"created_by\": \"admin\", \"expires_at\": \"2026-11-21T07:05:00Z\", \"revoked_at\": null,"
                     " \"last_used_at\": null, \"state\": \"active\"},"
                     " {\"id\": \"jt_99\", \"description\": \"\", \"uses\": 1, \"uses_left\": 1, \"registrations\": 0,"
                     " \"created_at\": \"2026-11-20T05:00:00Z\", \"created_by\": \"admin\","
                     " \"expires_at\": \"2026-11-20T06:00:00Z\", \"state\": \"expired\"}]}");
    char *out = capture(print_join_tokens, j, at("2026-11-21T06:05:00Z"));
    cr_assert(strstr(out, "ID                   STATE    USES  LEFT  REGISTERED  EXPIRES              CREATED-BY  "
                          "DESCRIPTION\n"), "%s", out);
    cr_assert(strstr(out, "jt_00112233aabbccdd  active      3     1           2  in 1h00m             admin       rack 4\n"),
              "%s", out);
    cr_assert(strstr(out, "jt_99                expired     1     1           0  2026-11-20 06:00:00  admin       -\n"),
              "%s", out);
    free(out);
    json_decref(j);
    j = load("{\"join_tokens\": []}");
    out = capture(print_join_tokens, j, 0);
    cr_assert(strstr(out, "no join tokens"), "%s", out);
    free(out);
    json_decref(j);
    j = load("{\"bans\": [{\"id\": 7, \"worker_id\": \"w-1\", \"cert_sha256\": "
             "\"af576245b461f53c83a6574236760363b03a9b1cf3479e4809e0fecd45940afd\", \"reason\": \"stolen\","
             " \"banned_by\": \"admin\", \"banned_at\": \"2026-11-21T06:00:00Z\"}]}");
    out = capture(print_bans, j, 0);
    cr_assert(strstr(out, "  7  w-1     af576245b461f53c  2026-11-21 06:00:00  admin  stolen\n"), "%s", out);
    free(out);
    json_decref(j);
}

static void print_err(FILE *f, const json_t *e, int64_t now)
{
    (void)now;
    cli_print_error(f, (const kiln_err_t *)(const void *)e);
}

Test(cli_errors, api_error_reply)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    int st = cli_error_from_reply(400, "{\"code\": \"invalid_argument\", \"message\": \"must be positive (got -1)\","
                                       " \"field\": \"hyperparameters.lr\", \"hint\": \"try 3e-4\"}", &err);
    cr_assert_eq(st, KILN_EINVAL);
    cr_assert_str_eq(err.field, "hyperparameters.lr");
    char *text = capture(print_err, (const json_t *)&err, 0);
    cr_assert_str_eq(text, "error: hyperparameters.lr: must be positive (got -1)\nhint: try 3e-4\n");
    free(text);

    /* A message that already names the field does not repeat it. */
    kiln_err_clear(&err);
    cli_error_from_reply(400, "{\"code\": \"invalid_argument\", \"field\": \"hyperparameters.lr\","
                              " \"message\": \"hyperparameters.lr must be greater than 0 (got -1)\"}", &err);
    text = capture(print_err, (const json_t *)&err, 0);
    cr_assert_str_eq(text, "error: hyperparameters.lr: must be greater than 0 (got -1)\n");
    free(text);

    kiln_err_clear(&err);
    cr_assert_eq(cli_error_from_reply(404, "{\"code\": \"not_found\", \"message\": \"job not found\"}", &err),
                 KILN_ENOTFOUND);
    kiln_err_clear(&err);
    cr_assert_eq(cli_error_from_reply(502, "<html>Bad gateway</html>\nmore", &err), KILN_ECOMM, "a proxy's: unreachable");
    cr_assert_eq(cli_exit_code(KILN_ECOMM), CLI_EXIT_UNAVAILABLE);
    cr_assert_str_eq(err.message, "kilnd answered HTTP 502: <html>Bad gateway</html>");
    kiln_err_clear(&err);
    cr_assert_eq(cli_error_from_reply(409, NULL, &err), KILN_ESTATE);
}

typedef struct sse_log {
    char text[2048];
    int n;
    int stop_at; /* stop after this many events (0: never) */
} sse_log_t;

static int sse_cb(void *ud, const char *event, const char *data, const char *id)
{
    sse_log_t *l = ud;
    size_t off = strlen(l->text);
    snprintf(l->text + off, sizeof(l->text) - off, "[%s|%s|%s]", event, data, id);
    l->n++;
    return l->stop_at && l->n >= l->stop_at ? 7 : 0;
}

Test(cli_sse, parses_any_split)
{
    const char *stream = ": ping\r\n\r\n"
                         "id: 1\nevent: log\ndata: {\"seq\": 1}\n\n"
                         "data: first\r\ndata:second\r\n\r\n"
                         "event: end\ndata: {\"state\": \"COMPLETED\"}\n\n"
                         "event: never\ndata: x\n"; /* no blank line yet: not dispatched */
    const char *want = "[log|{\"seq\": 1}|1][message|first\nsecond|1][end|{\"state\": \"COMPLETED\"}|1]";
    for (size_t chunk = 1; chunk <= strlen(stream); chunk++) {
        sse_log_t l = {0};
        cli_sse_t p;
        cli_sse_init(&p, sse_cb, &l);
        for (size_t i = 0; i < strlen(stream); i += chunk)
            cr_assert_eq(cli_sse_feed(&p, stream + i, KILN_MIN(chunk, strlen(stream) - i)), 0);
        cr_assert_str_eq(l.text, want, "chunk %zu", chunk);
        cli_sse_deinit(&p);
    }
}

Test(cli_sse, callback_stops_the_stream)
{
    sse_log_t l = {.stop_at = 1};
    cli_sse_t p;
    cli_sse_init(&p, sse_cb, &l);
    const char *s = "data: a\n\ndata: b\n\n";
    cr_assert_eq(cli_sse_feed(&p, s, strlen(s)), 7);
    cr_assert_eq(cli_sse_feed(&p, s, strlen(s)), 7);
    cr_assert_eq(l.n, 1);
    cli_sse_deinit(&p);
}

static int run_cli(int argc, const char **argv)
{
    /* Not the config file of whoever runs the tests (kiln login's saved profiles). */
    setenv("XDG_CONFIG_HOME", "/nonexistent/kiln-cli-test", 1);
    unsetenv("KILN_PROFILE");
    return cli_main(argc, (char **)argv);
}

Test(cli_main, usage_errors_exit_2, .init = cr_redirect_stderr)
{
    cr_assert_eq(run_cli(1, (const char *[]){"kiln", NULL}), 2);
    cr_assert_eq(run_cli(2, (const char *[]){"kiln", "frobnicate", NULL}), 2);
    cr_assert_eq(run_cli(2, (const char *[]){"kiln", "describe", NULL}), 2);
    cr_assert_eq(run_cli(3, (const char *[]){"kiln", "jobs", "--limit", NULL}), 2);
    cr_assert_eq(run_cli(4, (const char *[]){"kiln", "jobs", "--limit", "-3", NULL}), 2);
    cr_assert_eq(run_cli(4, (const char *[]){"kiln", "logs", "--rank", "x", NULL}), 2);
    cr_assert_eq(run_cli(2, (const char *[]){"kiln", "submit", NULL}), 2);
    /* an update that changes nothing is a mistake, not a silent success */
    cr_assert_eq(run_cli(4, (const char *[]){"kiln", "queues", "update", "nlp", NULL}), 2);
    cr_assert_eq(run_cli(4, (const char *[]){"kiln", "queues", "create", "nlp", NULL}), 2);
    fflush(stderr);
    cr_assert_stderr_neq_str("");
}

/* kiln queues create|update take the preemption policy's flags: a flag without its value is a
 * usage error (2); with one, the request goes out (here to no kilnd: 6), the values kilnd's to
 * judge. */
Test(cli_main, queues_take_the_preemption_flags, .init = cr_redirect_stderr)
{
    int port = th_free_port();
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    cr_assert_eq(run_cli(7, (const char *[]){"kiln", "--url", url, "queues", "update", "q", "--preempt-within-queue",
                                             NULL}), CLI_EXIT_USAGE);
    cr_assert_eq(run_cli(7, (const char *[]){"kiln", "--url", url, "queues", "update", "q", "--reclaim-within-cohort",
                                             NULL}), CLI_EXIT_USAGE);
    cr_assert_eq(run_cli(9, (const char *[]){"kiln", "--url", url, "queues", "update", "q", "--preempt-within-queue",
                                             "never", "--reclaim-within-cohort=lower_priority", NULL}),
                 CLI_EXIT_UNAVAILABLE, "the flags alone are a change to send");
    cr_assert_eq(run_cli(10, (const char *[]){"kiln", "--url", url, "queues", "create", "q", "--quota", "cpu=1",
                                              "--reclaim-within-cohort", "never", NULL}), CLI_EXIT_UNAVAILABLE);
    fflush(stderr);
    FILE *f = cr_get_redirected_stderr();
    char buf[2048] = "";
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    cr_assert(strstr(buf, "--preempt-within-queue needs a value"), "%s", buf);
    cr_assert(!strstr(buf, "unknown option"), "%s", buf);
}

Test(cli_main, help_exits_0, .init = cr_redirect_stdout)
{
    cr_assert_eq(run_cli(2, (const char *[]){"kiln", "help", NULL}), 0);
    cr_assert_eq(run_cli(3, (const char *[]){"kiln", "logs", "--help", NULL}), 0);
    fflush(stdout);
}

/* Joins names with "|" into buf: the help's list of an option's values, made here by a loop. */
static const char *bar_list(const char *const names[], size_t n, char *buf, size_t len)
{
    buf[0] = '\0';
    for (size_t i = 0; i < n; i++)
        snprintf(buf + strlen(buf), len - strlen(buf), "%s%s", i ? "|" : "", names[i]);
    return buf;
}

/* The help lists each value base/api_names.h's lists have (the ones kilnd's validators take) and
 * each policy's default, its first value: adding a value there shows it here. */
Test(cli_main, help_lists_the_values_of_base_api_names, .init = cr_redirect_stdout)
{
#define NAME_(id, name) name,
    static const char *const within[] = {KILN_WITHIN_QUEUE_POLICIES(NAME_, NAME_)};
    static const char *const reclaim[] = {KILN_RECLAIM_WITHIN_COHORT_POLICIES(NAME_, NAME_)};
    static const char *const roles[] = {KILN_PROJECT_ROLES(NAME_, NAME_)};
#undef NAME_
    cr_assert_eq(run_cli(3, (const char *[]){"kiln", "help", "queues", NULL}), 0);
    cr_assert_eq(run_cli(3, (const char *[]){"kiln", "help", "projects", NULL}), 0);
    fflush(stdout);
    char buf[32768], list[256], want[512];
    size_t n = fread(buf, 1, sizeof buf - 1, cr_get_redirected_stdout());
    buf[n] = '\0';
    snprintf(want, sizeof want, "  --preempt-within-queue %s\n", bar_list(within, KILN_ARRAY_LEN(within), list, sizeof list));
    cr_assert(strstr(buf, want), "help lacks \"%s\":\n%s", want, buf);
    snprintf(want, sizeof want, "(default: %s)", within[0]);
    cr_assert(strstr(strstr(buf, "--preempt-within-queue"), want), "help lacks \"%s\":\n%s", want, buf);
    snprintf(want, sizeof want, "  --reclaim-within-cohort %s\n", bar_list(reclaim, KILN_ARRAY_LEN(reclaim), list, sizeof list));
    cr_assert(strstr(buf, want), "help lacks \"%s\":\n%s", want, buf);
    snprintf(want, sizeof want, "(default: %s)", reclaim[0]);
    cr_assert(strstr(strstr(buf, "--reclaim-within-cohort"), want), "help lacks \"%s\":\n%s", want, buf);
    snprintf(want, sizeof want, "kiln projects add-member PROJECT USER %s\n",
             bar_list(roles, KILN_ARRAY_LEN(roles), list, sizeof list));
    cr_assert(strstr(buf, want), "help lacks \"%s\":\n%s", want, buf);
}

/* --page-size takes 1 to base/api_names.h's KILN_PAGE_SIZE_MAX, kilnd's largest page, in kiln jobs,
 * search and tune list: one more is a usage error naming the range; the largest goes out (here to no
 * kilnd: 6). */
Test(cli_main, page_size_is_one_to_the_largest_page, .init = cr_redirect_stderr)
{
    int port = th_free_port();
    char url[64], max[16], over[16];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    snprintf(max, sizeof max, "%d", KILN_PAGE_SIZE_MAX);
    snprintf(over, sizeof over, "%d", KILN_PAGE_SIZE_MAX + 1);
    cr_assert_eq(run_cli(6, (const char *[]){"kiln", "--url", url, "jobs", "--page-size", over, NULL}), CLI_EXIT_USAGE);
    cr_assert_eq(run_cli(6, (const char *[]){"kiln", "--url", url, "search", "--page-size", "0", NULL}), CLI_EXIT_USAGE);
    cr_assert_eq(run_cli(7, (const char *[]){"kiln", "--url", url, "tune", "list", "--page-size", over, NULL}),
                 CLI_EXIT_USAGE);
    cr_assert_eq(run_cli(6, (const char *[]){"kiln", "--url", url, "jobs", "--page-size", max, NULL}),
                 CLI_EXIT_UNAVAILABLE);
    cr_assert_eq(run_cli(7, (const char *[]){"kiln", "--url", url, "tune", "list", "--page-size", max, NULL}),
                 CLI_EXIT_UNAVAILABLE);
    fflush(stderr);
    char buf[4096] = "", want[128];
    size_t n = fread(buf, 1, sizeof buf - 1, cr_get_redirected_stderr());
    buf[n] = '\0';
    snprintf(want, sizeof want, "--page-size must be between 1 and %d (got \"%s\")", KILN_PAGE_SIZE_MAX, over);
    cr_assert(strstr(buf, want), "lacks \"%s\": %s", want, buf);
    snprintf(want, sizeof want, "--page-size must be between 1 and %d (got \"0\")", KILN_PAGE_SIZE_MAX);
    cr_assert(strstr(buf, want), "lacks \"%s\": %s", want, buf);
}

/* --limit takes 1 to 100000000: a number past it (still positive) is a usage error naming the range,
 * as --page-size's does, in kiln jobs, search and logs; the largest goes out (here to no kilnd: 6). */
Test(cli_main, limit_names_its_range, .init = cr_redirect_stderr)
{
    int port = th_free_port();
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    cr_assert_eq(run_cli(6, (const char *[]){"kiln", "--url", url, "jobs", "--limit", "99999999999", NULL}),
                 CLI_EXIT_USAGE);
    cr_assert_eq(run_cli(6, (const char *[]){"kiln", "--url", url, "search", "-n", "0", NULL}), CLI_EXIT_USAGE);
    cr_assert_eq(run_cli(7, (const char *[]){"kiln", "--url", url, "logs", "j", "--limit", "100000001", NULL}),
                 CLI_EXIT_USAGE);
    cr_assert_eq(run_cli(6, (const char *[]){"kiln", "--url", url, "jobs", "--limit", "100000000", NULL}),
                 CLI_EXIT_UNAVAILABLE);
    fflush(stderr);
    char buf[4096] = "";
    size_t n = fread(buf, 1, sizeof buf - 1, cr_get_redirected_stderr());
    buf[n] = '\0';
    static const char *const want[] = {"--limit must be between 1 and 100000000 (got \"99999999999\")",
                                       "--limit must be between 1 and 100000000 (got \"0\")",
                                       "--limit must be between 1 and 100000000 (got \"100000001\")"};
    for (size_t i = 0; i < 3; i++)
        cr_assert(strstr(buf, want[i]), "lacks \"%s\": %s", want[i], buf);
    cr_assert(!strstr(buf, "positive"), "%s", buf);
}

/* The help of each list command gives the same range and default. */
Test(cli_main, help_gives_the_largest_page, .init = cr_redirect_stdout)
{
    cr_assert_eq(run_cli(3, (const char *[]){"kiln", "help", "jobs", NULL}), 0);
    cr_assert_eq(run_cli(3, (const char *[]){"kiln", "help", "search", NULL}), 0);
    cr_assert_eq(run_cli(3, (const char *[]){"kiln", "help", "tune", NULL}), 0);
    fflush(stdout);
    char buf[32768], want[64];
    size_t n = fread(buf, 1, sizeof buf - 1, cr_get_redirected_stdout());
    buf[n] = '\0';
    snprintf(want, sizeof want, "per request (1-%d, default %d)\n", KILN_PAGE_SIZE_MAX, KILN_PAGE_SIZE_MAX);
    int seen = 0;
    for (const char *p = strstr(buf, want); p; p = strstr(p + 1, want))
        seen++;
    cr_assert_eq(seen, 3, "\"%s\" %d times, not once per command:\n%s", want, seen, buf);
}

Test(cli_main, unreachable_server_exits_6, .init = cr_redirect_stderr)
{
    int port = th_free_port();
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    cr_assert_eq(run_cli(4, (const char *[]){"kiln", "--url", url, "jobs", NULL}), CLI_EXIT_UNAVAILABLE);
    fflush(stderr);
    char want[160];
    snprintf(want, sizeof want, "error: could not connect to kilnd at %s: ", url);
    FILE *f = cr_get_redirected_stderr();
    char buf[1024] = "";
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    cr_assert(strstr(buf, want) == buf, "%s", buf);
    cr_assert(strstr(buf, "(is kilnd running? set KILN_URL)\n"), "%s", buf);
}

Test(cli_main, bad_spec_file_exits_1, .init = cr_redirect_stderr)
{
    char path[] = "/tmp/kiln-cli-test-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, "{\"name\": ", 9), 9);
    close(fd);
    cr_assert_eq(run_cli(5, (const char *[]){"kiln", "--url", "http://127.0.0.1:1", "submit", path, NULL}), 1);
    cr_assert_eq(run_cli(3, (const char *[]){"kiln", "submit", "/nonexistent/job.json", NULL}), CLI_EXIT_NOT_FOUND);
    unlink(path);
}

/* A relative data path that exists here is sent absolute: an engine job's data.train and data.val
 * and a script job's data.channels alike (the SDK's Estimator does the same); absolute paths,
 * URLs and paths that do not exist here are left as they are. */
Test(cli_main, relative_data_paths_that_exist_here_are_sent_absolute)
{
    char dir[] = "/tmp/kiln-cli-abs-XXXXXX", cwd[PATH_MAX], want[PATH_MAX + 32];
    cr_assert(mkdtemp(dir) && getcwd(cwd, sizeof cwd));
    snprintf(want, sizeof want, "%s/corpus.txt", dir);
    FILE *f = fopen(want, "w");
    cr_assert(f);
    fclose(f);
    cr_assert_eq(chdir(dir), 0);
    json_t *spec = json_loads("{\"data\": {\"train\": \"corpus.txt\", \"val\": \"missing.txt\","
                              " \"channels\": {\"train\": \"corpus.txt\", \"validation\": \"./corpus.txt\","
                              " \"extra\": \"/abs/x\", \"gone\": \"nope/\"}}}", 0, NULL);
    cr_assert(spec);
    cli_absolutize_data(spec);
    cr_assert_eq(chdir(cwd), 0);
    char real[PATH_MAX];
    cr_assert(realpath(want, real));
    json_t *data = json_object_get(spec, "data"), *ch = json_object_get(data, "channels");
    cr_assert_str_eq(json_string_value(json_object_get(data, "train")), real);
    cr_assert_str_eq(json_string_value(json_object_get(data, "val")), "missing.txt");
    cr_assert_str_eq(json_string_value(json_object_get(ch, "train")), real);
    cr_assert_str_eq(json_string_value(json_object_get(ch, "validation")), real);
    cr_assert_str_eq(json_string_value(json_object_get(ch, "extra")), "/abs/x");
    cr_assert_str_eq(json_string_value(json_object_get(ch, "gone")), "nope/");
    json_decref(spec);
    unlink(want);
    rmdir(dir);
}

/* kiln tune submit reads its request as kiln submit reads a job spec: bad JSON exit 1, a missing
 * file exit 3, and what it cannot use (--source-dir without a base job) is refused before any
 * request; `-o name` applies to tune list as to the other lists. */
Test(cli_main, tune_submit_reads_its_file_as_submit_does, .init = cr_redirect_stderr)
{
    char path[] = "/tmp/kiln-cli-test-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, "{\"name\": ", 9), 9);
    close(fd);
    const char *url = "http://127.0.0.1:1";
    cr_assert_eq(run_cli(6, (const char *[]){"kiln", "--url", url, "tune", "submit", path, NULL}), 1);
    cr_assert_eq(run_cli(6, (const char *[]){"kiln", "--url", url, "tune", "submit", "/nonexistent/tune.json", NULL}),
                 CLI_EXIT_NOT_FOUND);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("{\"name\": \"no-base-job\"}", f);
    fclose(f);
    cr_assert_eq(run_cli(8, (const char *[]){"kiln", "--url", url, "tune", "submit", path, "--source-dir", "/tmp",
                                             NULL}), 1);
    cr_assert_eq(run_cli(7, (const char *[]){"kiln", "--url", url, "tune", "submit", path, "--frobnicate", NULL}),
                 CLI_EXIT_USAGE);
    /* a key given twice is refused here as kilnd refuses it, not sent on with the last one */
    f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("{\"name\": \"a\", \"max_jobs\": 4, \"max_jobs\": 40}", f);
    fclose(f);
    cr_assert_eq(run_cli(6, (const char *[]){"kiln", "--url", url, "tune", "submit", path, NULL}), 1);
    cr_assert_eq(run_cli(5, (const char *[]){"kiln", "--url", url, "submit", path, NULL}), 1);
    cr_assert_eq(run_cli(7, (const char *[]){"kiln", "--url", url, "-o", "name", "tune", "list", NULL}),
                 CLI_EXIT_UNAVAILABLE, "-o name is a list's: tune list is one");
    cr_assert_eq(run_cli(6, (const char *[]){"kiln", "--url", url, "-o", "name", "whoami", NULL}), CLI_EXIT_USAGE);
    unlink(path);
    fflush(stderr);
    f = cr_get_redirected_stderr();
    char buf[8192] = "";
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    cr_assert(strstr(buf, "error: could not open file \"/nonexistent/tune.json\""), "%s", buf);
    cr_assert(strstr(buf, "error: --source-dir: is the base job's code, and the request has no \"job\""), "%s", buf);
    cr_assert(strstr(buf, "duplicate object key"), "%s", buf);
}

static void print_artifacts(FILE *f, const json_t *j, int64_t now) { (void)now; cli_print_artifacts(f, j, false); }
static void print_artifacts_wide(FILE *f, const json_t *j, int64_t now) { (void)now; cli_print_artifacts(f, j, true); }

Test(cli_format, artifacts_table_and_sizes)
{
    char b[24];
    cr_assert_str_eq(cli_fmt_bytes(0, b, sizeof b), "0 B");
    cr_assert_str_eq(cli_fmt_bytes(1023, b, sizeof b), "1023 B");
    cr_assert_str_eq(cli_fmt_bytes(1536, b, sizeof b), "1.5 KiB");
    cr_assert_str_eq(cli_fmt_bytes(139776, b, sizeof b), "136 KiB");
    cr_assert_str_eq(cli_fmt_bytes(497759232.0, b, sizeof b), "475 MiB");
    cr_assert_str_eq(cli_fmt_bytes(3.0 * (1 << 30), b, sizeof b), "3.0 GiB");
    json_t *a = load("{\"artifacts\": [{\"name\": \"model_llmc.bin\", \"size\": 139776, \"sha256\": "
                     "\"af576245b461f53c83a6574236760363b03a9b1cf3479e4809e0fecd45940afd\", \"created_at\": "
                     "\"2026-11-24T19:00:39.318Z\", \"attempt\": 1, \"worker_id\": \"w-0011\"}, {\"name\": \"samples.txt\", \"size\": 300, "
                     "\"sha256\": \"a8464d4f5692f9c770d8d315c0285bfdcdf30c69b6c7560994006bdb3de78087\", "
                     "\"created_at\": \"2026-11-24T19:00:39.320Z\", \"attempt\": 2}]}");
    char *out = capture(print_artifacts, a, 0);
    cr_assert(strstr(out, "NAME               SIZE  SHA256            ATTEMPT  CREATED\n"), "%s", out);
    cr_assert(strstr(out, "model_llmc.bin  136 KiB  af576245b461f53c        1  2026-11-24 19:00:39\n"), "%s", out);
    cr_assert(strstr(out, "samples.txt       300 B  a8464d4f5692f9c7        2  2026-11-24 19:00:39\n"), "%s", out);
    free(out);
    /* -o wide: the exact size and the whole SHA-256 */
    out = capture(print_artifacts_wide, a, 0);
    cr_assert(strstr(out, "NAME               SIZE   BYTES  SHA256"), "%s", out);
    cr_assert(strstr(out, "model_llmc.bin  136 KiB  139776  af576245b461f53c83a6574236760363b03a9b1cf3479e4809e0fecd45940afd"),
              "%s", out);
    /* and the worker that uploaded it (provenance) */
    cr_assert(strstr(out, "ATTEMPT  CREATED              WORKER\n"), "%s", out);
    cr_assert(strstr(out, "2026-11-24 19:00:39  w-0011\n"), "%s", out);
    free(out);
    json_decref(a);
    a = load("{\"artifacts\": []}");
    out = capture(print_artifacts, a, 0);
    cr_assert(strstr(out, "no artifacts"), "%s", out);
    free(out);
    json_decref(a);
}

/* ---- search and compare ---------------------------------------------------------------------- */

static void print_search(FILE *f, const json_t *j, int64_t now) { cli_print_search(f, j, now, false); }
static void print_search_wide(FILE *f, const json_t *j, int64_t now) { cli_print_search(f, j, now, true); }
static void print_compare(FILE *f, const json_t *j, int64_t now)
{
    (void)now;
    const char *m[] = {"val_loss"};
    cli_print_compare(f, j, m, 1);
}

Test(cli_format, search_table_shows_the_columns)
{
    json_t *jobs = load(
        "[{\"id\": \"0b6c1f2e-1234-4abc-8def-0123456789ab\", \"name\": \"a\", \"state\": \"COMPLETED\","
        "  \"created_at\": \"2026-11-21T06:00:00Z\", \"columns\": {\"hp.lr\": 0.0003, \"metrics.val_loss.min\": 1.52}},"
        " {\"id\": \"77777777-0000-4000-8000-000000000000\", \"name\": \"b\", \"state\": \"FAILED\","
        "  \"created_at\": \"2026-11-21T05:00:00Z\", \"columns\": {\"hp.lr\": 0.001, \"metrics.val_loss.min\": null,"
        "  \"hp.seed\": 7}}]");
    char *out = capture(print_search, jobs, at("2026-11-21T07:00:00Z"));
    char *l1 = strchr(out, '\n') + 1, *l2 = strchr(l1, '\n') + 1;
    cr_assert(strstr(out, "ID        NAME  STATE") == out && strstr(out, "hp.lr  metrics.val_loss.min  hp.seed\n"), "%s",
              out);
    cr_assert(strstr(l1, "0b6c1f2e  a     COMPLETED") == l1 && strstr(l1, "0.0003") && strstr(l1, "1.52"), "%s", out);
    /* b has no val_loss: "-" */
    cr_assert(strstr(l2, "0.001  ") && strstr(l2, "  -  ") && strstr(l2, "  7\n"), "%s", out);
    free(out);
    /* -o wide: whole ids, project, queue and submitter before the columns */
    out = capture(print_search_wide, jobs, at("2026-11-21T07:00:00Z"));
    cr_assert(strstr(out, "PROJECT  QUEUE  BY   hp.lr"), "%s", out);
    cr_assert(strstr(out, "0b6c1f2e-1234-4abc-8def-0123456789ab  a     COMPLETED"), "%s", out);
    free(out);
    json_decref(jobs);
    json_t *none = json_array();
    out = capture(print_search, none, 0);
    cr_assert_str_eq(out, "no jobs match\n");
    free(out);
    json_decref(none);
}

Test(cli_format, compare_marks_what_differs)
{
    json_t *jobs = load(
        "[{\"id\": \"0b6c1f2e-1234-4abc-8def-0123456789ab\", \"name\": \"a\", \"state\": \"COMPLETED\","
        "  \"project\": \"default\", \"spec\": {\"hyperparameters\": {\"lr\": 0.0003, \"max_steps\": 100},"
        "  \"model\": {\"type\": \"gpt\", \"n_layer\": 2}},"
        "  \"summaries\": {\"val_loss\": {\"count\": 10, \"min\": 1.5, \"min_step\": 80, \"max\": 4.0, \"max_step\": 1,"
        "  \"last\": 1.6, \"last_step\": 100}}},"
        " {\"id\": \"77777777-0000-4000-8000-000000000000\", \"name\": \"b\", \"state\": \"COMPLETED\","
        "  \"project\": \"default\", \"spec\": {\"hyperparameters\": {\"lr\": 0.001, \"max_steps\": 100},"
        "  \"model\": {\"type\": \"gpt\", \"n_layer\": 2}}, \"summaries\": {}}]");
    char *out = capture(print_compare, jobs, 0);
    cr_assert(strstr(out, "1 0b6c1f2e") && strstr(out, "2 77777777"), "%s", out);
    cr_assert(strstr(out, "*  hp.lr "), "lr differs: %s", out);
    cr_assert(strstr(out, "   hp.max_steps "), "max_steps does not: %s", out);
    cr_assert(strstr(out, "   model.n_layer "), "%s", out);
    cr_assert(strstr(out, "*  name "), "%s", out);
    cr_assert(strstr(out, "   state "), "%s", out);
    cr_assert(strstr(out, "*  metrics.val_loss.min") && strstr(out, "1.5 @80"), "%s", out);
    free(out);
    json_decref(jobs);
}

Test(cli_format, chart_draws_series_on_shared_axes)
{
    double x[5] = {1, 2, 3, 4, 5}, y1[5] = {4, 3, 2, 1.5, 1}, y2[5] = {4, 3.5, 3, NAN, 2.5};
    cli_series_t s[2] = {{x, y1, 5}, {x, y2, 5}};
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cli_print_chart(f, "val_loss", s, 2, 20, 4);
    fclose(f);
    /* 4 rows between "4" and "1", the first points of both series coincide */
    cr_assert(!strncmp(text, "val_loss\n4 |*", 13), "%s", text);
    cr_assert(strstr(text, "\n1 |") && strstr(text, "  1    ") && strstr(text, "5 (step)"), "%s", text);
    cr_assert(strchr(text, '2') && strchr(text, '1'), "%s", text);
    int ones = 0, twos = 0;
    for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        const char *bar = strchr(line, '|'), *end = strchr(line, '\n');
        for (const char *p = bar && bar < end ? bar : end; p < end; p++) {
            ones += *p == '1';
            twos += *p == '2';
        }
    }
    cr_assert_eq(ones, 4, "%s", text);
    cr_assert_eq(twos, 3, "one point is NaN: %s", text);
    free(text);
}

Test(cli_main, version_exits_6_when_kilnd_is_unreachable, .init = cr_redirect_stderr)
{
    int port = th_free_port();
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    cr_assert_eq(run_cli(4, (const char *[]){"kiln", "--url", url, "version", NULL}), 6);
    cr_assert_eq(run_cli(5, (const char *[]){"kiln", "--url", url, "version", "-ojson", NULL}), 6);
    fflush(stderr);
    FILE *f = cr_get_redirected_stderr();
    char buf[2048] = "";
    buf[fread(buf, 1, sizeof buf - 1, f)] = '\0';
    cr_assert(strstr(buf, "unreachable") && strstr(buf, "could not connect"), "%s", buf);
}

/* The kiln binary's completion script for shell, run by that shell with the script loaded:
 * returns what it printed (caller frees). */
static char *complete_with(const char *shell_cmd)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s 2>&1", shell_cmd);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "%s", cmd);
    char *buf = calloc(1, 65536);
    size_t n = fread(buf, 1, 65535, p);
    buf[n] = '\0';
    int rc = pclose(p);
    cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "%s: %s", shell_cmd, buf);
    return buf;
}

Test(cli_completion, bash_zsh_and_fish_scripts_complete_commands_options_and_formats)
{
    char kiln[PATH_MAX], cmd[PATH_MAX * 2 + 512];
    snprintf(kiln, sizeof kiln, "%s/kiln", th_bin_dir());
    /* bash: load the script and ask its function, as bash does at a Tab */
    snprintf(cmd, sizeof cmd,
             "bash -c 'source <(%s completion bash) && "
             "COMP_WORDS=(kiln jo); COMP_CWORD=1; _kiln; echo \"1:${COMPREPLY[*]}\"; "
             "COMP_WORDS=(kiln --url http://x jobs --st); COMP_CWORD=4; _kiln; echo \"2:${COMPREPLY[*]}\"; "
             "COMP_WORDS=(kiln tokens \"\"); COMP_CWORD=2; _kiln; echo \"3:${COMPREPLY[*]}\"; "
             "COMP_WORDS=(kiln jobs -o \"\"); COMP_CWORD=3; _kiln; echo \"4:${COMPREPLY[*]}\"; "
             "COMP_WORDS=(kiln completion \"\"); COMP_CWORD=2; _kiln; echo \"5:${COMPREPLY[*]}\"; "
             /* a tuning job's id: the script asks the kiln it completes for (here a function that
              * answers only the listing kiln tune list -o name) */
             "k() { test \"$*\" = \"tune list -o name\" && echo 5f0c1d2e-tj; }; "
             "COMP_WORDS=(k tune describe \"\"); COMP_CWORD=3; _kiln; echo \"6:${COMPREPLY[*]}\"; "
             "COMP_WORDS=(k tune stop 5f); COMP_CWORD=3; _kiln; echo \"7:${COMPREPLY[*]}\"'",
             kiln);
    char *out = complete_with(cmd);
    cr_assert(strstr(out, "1:jobs join-tokens\n") && strstr(out, "2:--status\n") && strstr(out, "3:list create revoke\n") &&
                  strstr(out, "4:table wide json yaml name\n") && strstr(out, "5:bash zsh fish\n") &&
                  strstr(out, "6:5f0c1d2e-tj\n") && strstr(out, "7:5f0c1d2e-tj\n"),
              "%s", out);
    free(out);
    /* zsh and fish: the scripts parse, and fish completes from its own */
    snprintf(cmd, sizeof cmd, "%s completion zsh > /tmp/kiln-zsh-$$ && zsh -n /tmp/kiln-zsh-$$; rc=$?; rm -f /tmp/kiln-zsh-$$; exit $rc",
             kiln);
    free(complete_with(cmd));
    snprintf(cmd, sizeof cmd,
             "%s completion fish > /tmp/kiln-fish-$$ && fish --no-execute /tmp/kiln-fish-$$ && "
             "fish -c \"source /tmp/kiln-fish-$$; complete -C 'kiln st'; complete -C 'kiln -o '\"; rc=$?; "
             "rm -f /tmp/kiln-fish-$$; exit $rc",
             kiln);
    out = complete_with(cmd);
    cr_assert(strstr(out, "stop\t") && strstr(out, "yaml\t"), "%s", out);
    free(out);
    cr_assert_eq(run_cli(3, (const char *[]){"kiln", "completion", "tcsh", NULL}), 2);
}

/* An argument that names something but cannot be a path segment (too long, empty, "." or "..")
 * is a usage error before any request: the server here is unreachable, so a request would exit
 * 6, and `kiln tune stop <5000 characters>` once sent POST /v1/tuning-jobs/:stop. */
Test(cli_main, an_id_that_cannot_be_a_path_segment_is_a_usage_error, .init = cr_redirect_stderr)
{
    int port = th_free_port();
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    static char huge[5001];
    memset(huge, 'a', sizeof huge - 1);
    const char *const cases[][5] = {
        {"tune", "stop", huge},           {"tune", "describe", ""},          {"queues", "describe", ".."},
        {"queues", "delete", huge},       {"queues", "update", huge, "--weight", "2"},
        {"workers", "approve", huge},     {"workers", "remove", "."},        {"workers", "unban", huge},
        {"join-tokens", "revoke", huge},  {"tokens", "revoke", huge},        {"tokens", "list", "--user", huge},
        {"projects", "members", huge},    {"projects", "remove-member", "p", huge},
        {"projects", "update", huge, "--default-queue", "q"},               {"code", "get", huge},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *argv[10] = {"kiln", "--url", url};
        int argc = 3;
        for (int k = 0; k < 5 && cases[i][k]; k++)
            argv[argc++] = cases[i][k];
        argv[argc] = NULL;
        cr_assert_eq(run_cli(argc, argv), CLI_EXIT_USAGE, "kiln %s %s: a usage error, before any request",
                     cases[i][0], cases[i][1]);
    }
    fflush(stderr);
    FILE *f = cr_get_redirected_stderr();
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    cr_assert(!strstr(buf, "could not connect"), "%s", buf);
    cr_assert(strstr(buf, "kiln tune: an argument of 5000 characters is too long to name anything\n"), "%s", buf);
    cr_assert(strstr(buf, "kiln tune: an empty argument names nothing\n"), "%s", buf);
    cr_assert(strstr(buf, "kiln queues: \"..\" names nothing\n"), "%s", buf);
    cr_assert(strstr(buf, "(kiln help tune for more)"), "the usage lines follow: %s", buf);
}

/* ---- what reaches a terminal ---------------------------------------------------------------- */

/* Writes each piece to a cli_term_open stream over a memory stream (flushing after each, so a
 * character may arrive cut in two writes) and returns what came out (caller frees). */
static char *through_term(const char *const *pieces, size_t n)
{
    struct mem {
        char *text;
        size_t len;
    } *m = calloc(1, sizeof(*m));
    FILE *dst = open_memstream(&m->text, &m->len);
    FILE *t = cli_term_open(dst, _IOFBF);
    cr_assert_not_null(t);
    for (size_t i = 0; i < n; i++) {
        fputs(pieces[i], t);
        fflush(t);
    }
    fclose(t);
    fclose(dst);
    char *out = m->text;
    free(m);
    return out;
}

/* A job's reason, tag, metric name or log line is someone else's text: no ESC [ / ESC ] sequence,
 * BEL, CR overwrite, 8-bit CSI or bidirectional override in it may act on the terminal (clear it,
 * set its title, write the clipboard with OSC 52, reorder a line); each shows as \uXXXX. */
Test(term, escapes_what_would_act_on_a_terminal)
{
    const char *in[] = {"job \x1b]0;owned\x07 \x1b]52;c;ZXZpbA==\x07 \x1b[2J\rfake \xc2\x9b" "31m \xe2\x80\xae"
                        "gpj.exe\tcaf\xc3\xa9 \x7f end\n"};
    char *out = through_term(in, 1);
    cr_assert_str_eq(out, "job \\u001b]0;owned\\u0007 \\u001b]52;c;ZXZpbA==\\u0007 \\u001b[2J\\u000dfake \\u009b31m "
                          "\\u202egpj.exe\tcaf\xc3\xa9 \\u007f end\n");
    free(out);
    /* a character split between two writes is still one character: passed whole, or escaped whole */
    const char *split[] = {"caf\xc3", "\xa9 \xe2", "\x80", "\xae", "x \xc2", "\x9b", " \xff!\n"};
    out = through_term(split, sizeof split / sizeof split[0]);
    cr_assert_str_eq(out, "caf\xc3\xa9 \\u202ex \\u009b \\xff!\n");
    free(out);
    /* a run of plain text longer than the stream's buffers (a log line of 10,000 bytes) */
    char *longline = malloc(20002);
    memset(longline, 'a', 20000);
    longline[0] = '\x1b';
    longline[20000] = '\n';
    longline[20001] = '\0';
    const char *lng[] = {longline};
    out = through_term(lng, 1);
    cr_assert_eq(strlen(out), 20006);
    cr_assert(!strncmp(out, "\\u001baaa", 9) && out[20004] == 'a' && out[20005] == '\n');
    free(out);
    free(longline);
    /* a stream that ends inside a character shows the bytes it had */
    const char *cut[] = {"ok \xe2\x80"};
    out = through_term(cut, 1);
    cr_assert_str_eq(out, "ok \\xe2\\x80");
    free(out);
}

/* -o json and yaml go through the same stream: JSON escapes C0 itself, and DEL, C1 and the
 * overrides it leaves raw become \uXXXX escapes, the same JSON. */
Test(term, json_stays_the_same_json)
{
    json_t *j = json_pack("{s:s, s:s}", "reason", "a\x1b[31m\x7f\xc2\x85\xe2\x80\xae\xe2\x81\xa9 z", "tag", "caf\xc3\xa9");
    char *text = json_dumps(j, JSON_COMPACT);
    const char *in[] = {text};
    char *out = through_term(in, 1);
    cr_assert_null(strchr(out, 0x1b));
    cr_assert_null(strstr(out, "\xe2\x80\xae"));
    json_error_t e;
    json_t *back = json_loads(out, 0, &e);
    cr_assert_not_null(back, "%s: %s", e.text, out);
    cr_assert(json_equal(j, back), "%s", out);
    json_decref(back);
    json_decref(j);
    free(out);
    free(text);
}

/* Everything kiln prints goes through it: a usage error that quotes its argument back. */
Test(cli_main, what_it_prints_is_escaped_for_the_terminal, .init = cr_redirect_stderr)
{
    cr_assert_eq(run_cli(2, (const char *[]){"kiln", "x\x1b]0;owned\x07\x1b[2J", NULL}), CLI_EXIT_USAGE);
    fflush(stderr);
    char buf[4096] = "";
    size_t n = fread(buf, 1, sizeof buf - 1, cr_get_redirected_stderr());
    buf[n] = '\0';
    cr_assert(strstr(buf, "unknown command \"x\\u001b]0;owned\\u0007\\u001b[2J\""), "%s", buf);
    cr_assert_null(strchr(buf, 0x1b), "%s", buf);
}
