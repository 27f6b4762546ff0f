/* test_follow.c - live log followers: lines after open, the end notice, a job that has already
 * ended, and a follower that falls far behind its buffer still gets every line once, in order.
 * Lines reach followers through the database's notifications (notify.c), a moment after the
 * ingest commits: reads wait for them. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/service/fixture.h"

/* ---- followers ------------------------------------------------------------------------------- */

TestSuite(follow, .init = setup, .fini = teardown, .timeout = 60);

static int wakes;
static void on_wake(void *ud)
{
    (void)ud;
    __atomic_add_fetch(&wakes, 1, __ATOMIC_SEQ_CST);
}

/* Reads until want lines have arrived (or the end, when want is 0) or 10 s pass; returns how many
 * were read. */
static int read_wait(svc_follow_t *f, json_t *lines, int want, int max, bool *ended, json_t **end)
{
    int n = 0;
    for (int i = 0; i < 1000; i++) {
        n += svc_follow_read(f, lines, max, ended, end);
        if ((want > 0 && n >= want) || (want == 0 && *ended))
            break;
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
    }
    return n;
}

Test(follow, live_lines_then_end)
{
    char w[1][64], id[40];
    run_job(1, 1, w, id);
    push_logs(w[0], id, 1, 0, 0, 3);  /* history, before the follower */
    svc_follow_t *f = NULL;
    cr_assert_eq(svc_follow_open(svc, svc_caller_kilnd(), id, -1, 3, on_wake, NULL, &f, &err), 0, "%s", err.message);
    json_t *lines = json_array();
    bool ended = false;
    json_t *end = NULL;
    cr_assert_eq(svc_follow_read(f, lines, 100, &ended, &end), 0);
    cr_assert_not(ended);
    push_logs(w[0], id, 1, 0, 3, 4);
    cr_assert_eq(read_wait(f, lines, 4, 100, &ended, &end), 4);
    cr_assert_gt(wakes, 0, "the follower was woken");
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(lines, 0), "seq")), 4);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(lines, 3), "line")), "line 6");
    rank_exit(w[0], id, 1, 0, 0, NULL);
    json_array_clear(lines);
    int n = read_wait(f, lines, 0, 100, &ended, &end);
    cr_assert_eq(n, 0);
    cr_assert(ended);
    cr_assert_str_eq(json_string_value(json_object_get(end, "state")), "COMPLETED");
    json_decref(end);
    json_decref(lines);
    svc_follow_close(f);

    /* Following a job that has already ended: the end at once. */
    cr_assert_eq(svc_follow_open(svc, svc_caller_kilnd(), id, -1, 7, NULL, NULL, &f, &err), 0);
    lines = json_array();
    cr_assert_eq(svc_follow_read(f, lines, 100, &ended, &end), 0);
    cr_assert(ended);
    json_decref(end);
    json_decref(lines);
    svc_follow_close(f);
}

Test(follow, a_follower_that_falls_behind_gets_every_line)
{
    char w[2][64], id[40];
    run_job(2, 1, w, id); /* rank k runs on w[k], which may push only its own lines */
    svc_follow_t *f = NULL, *f1 = NULL;
    cr_assert_eq(svc_follow_open(svc, svc_caller_kilnd(), id, -1, 0, NULL, NULL, &f, &err), 0);
    cr_assert_eq(svc_follow_open(svc, svc_caller_kilnd(), id, 1, 0, NULL, NULL, &f1, &err), 0);
    /* Far more than the follower buffers, without reading. */
    enum { BATCH = 1000, BATCHES = 12 };
    for (int b = 0; b < BATCHES; b++)
        push_logs(w[b % 2], id, 1, b % 2, b * BATCH, BATCH);
    json_t *lines = json_array();
    bool ended = false;
    json_t *end = NULL;
    int64_t expect = 1;
    bool pushed_more = false;
    for (int guard = 0; guard < 3000 && expect < BATCH * BATCHES + 2; guard++) {
        json_array_clear(lines);
        int n = svc_follow_read(f, lines, 500, &ended, &end);
        for (int i = 0; i < n; i++) {
            json_t *l = json_array_get(lines, (size_t)i);
            cr_assert_eq(json_integer_value(json_object_get(l, "seq")), expect, "no gap, no duplicate");
            expect++;
        }
        if (expect == BATCH * BATCHES + 1 && !pushed_more) {
            push_logs(w[0], id, 1, 0, 99999, 1); /* live again after catching up */
            pushed_more = true;
        }
        if (n == 0) {
            struct timespec ts = {0, 10 * 1000000};
            nanosleep(&ts, NULL);
        }
    }
    cr_assert_eq(expect, BATCH * BATCHES + 2);
    /* The rank-1 follower saw only rank 1's lines, all of them, and nothing more arrives. */
    int total = 0;
    for (int guard = 0; guard < 3000 && total < BATCH * BATCHES / 2; guard++) {
        json_array_clear(lines);
        int n = svc_follow_read(f1, lines, 700, &ended, &end);
        for (int i = 0; i < n; i++)
            cr_assert_eq(json_integer_value(json_object_get(json_array_get(lines, (size_t)i), "rank")), 1);
        total += n;
        if (n == 0) {
            struct timespec ts = {0, 10 * 1000000};
            nanosleep(&ts, NULL);
        }
    }
    json_array_clear(lines);
    total += svc_follow_read(f1, lines, 700, &ended, &end);
    cr_assert_eq(total, BATCH * BATCHES / 2);
    json_decref(lines);
    svc_follow_close(f);
    svc_follow_close(f1);
}
