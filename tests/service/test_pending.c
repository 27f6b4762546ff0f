/* test_pending.c - the pending reason (sched_pending) as a pure function over one admission pass:
 * positions count a queue's waiting jobs, a head waiting for free slots says how many workers
 * have them, its blocking jobs are those whose ends it needs (in the order they are predicted to
 * end) and its estimated start the last of those ends; a job in the way with no predicted end
 * makes the estimate unknown, and so does waiting behind another job, which names that job and
 * what it waits for. The admission event's text (sched_admission_text) names borrowing. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "service/service.h"

#define U SCHED_UNLIMITED
#define W(id_, total_, free_) {.id = id_, .slot_type = "cpu", .slots = total_, .slots_free = free_}

static sched_job_t job(const char *id, int q, int nodes, int spn)
{
    sched_job_t j = {.id = id, .queue = q, .project = -1, .nodes = nodes, .slots_per_node = spn, .type = 0};
    return j;
}

Test(pending, slots_estimate_from_the_ends_it_needs)
{
    /* two workers of 4; r1 (ends in 50 s) holds 2 on w0, r2 (ends in 20 s) 2 on w1, r3 (end
     * unknown) 2 on w0, r4 (ends in 5 s) 2 on w1 */
    sched_worker_t w[] = {W("w0", 4, 0), W("w1", 4, 0)};
    sched_queue_t q[] = {{.name = "default", .quota = {U, U}, .borrowing_limit = {U, U}, .lending_limit = {U, U},
                          .weight = 1}};
    sched_job_t j[] = {job("big", 0, 2, 3), job("small", 0, 1, 1)};
    int w0[] = {0}, w1[] = {1};
    sched_running_t run[] = {
        {.id = "r1", .queue = 0, .type = 0, .nodes = 1, .slots_per_node = 2, .worker = w0, .end_s = 50},
        {.id = "r2", .queue = 0, .type = 0, .nodes = 1, .slots_per_node = 2, .worker = w1, .end_s = 20},
        {.id = "r3", .queue = 0, .type = 0, .nodes = 1, .slots_per_node = 2, .worker = w0, .end_s = -1},
        {.id = "r4", .queue = 0, .type = 0, .nodes = 1, .slots_per_node = 2, .worker = w1, .end_s = 5},
    };
    sched_snapshot_t s = {.workers = w, .nworkers = 2, .queues = q, .nqueues = 1, .jobs = j, .njobs = 2};
    sched_decision_t dec[2];
    int order[2], n = -1;
    cr_assert_eq(sched_admit(&s, dec, order, &n), 0);
    cr_assert_eq(dec[0].outcome, SCHED_WAIT_SLOTS);
    cr_assert_eq(dec[1].outcome, SCHED_WAIT_BEHIND);
    sched_pending_t p[2];
    /* big needs 3 free on both workers: w1 frees all 4 at 20 s (r4, r2), w0 needs r1 (50 s) and r3
     * (unknown): the estimate is unknown; it waits for all four */
    cr_assert_eq(sched_pending(&s, dec, run, 4, p), 0);
    cr_assert_eq(p[0].position, 1);
    cr_assert_str_eq(p[0].missing, "needs 2 worker(s) with 3 free cpu slot(s) each; 0 such worker(s) have them free "
                                   "now");
    cr_assert_eq(p[0].nblocking, 4);
    cr_assert_str_eq(p[0].blocking[0], "r4");
    cr_assert_str_eq(p[0].blocking[1], "r2");
    cr_assert_str_eq(p[0].blocking[2], "r1");
    cr_assert_str_eq(p[0].blocking[3], "r3");
    cr_assert_lt(p[0].start_s, 0, "r3's end is unknown");
    /* with r3's end known (80 s), the estimate is the last end it needs */
    run[2].end_s = 80;
    cr_assert_eq(sched_pending(&s, dec, run, 4, p), 0);
    cr_assert_float_eq(p[0].start_s, 80, 1e-9);
    /* a gang of 2 x 2 fits once r1 ends (w0: 2 free, w1: 4): r3's unknown end is not needed */
    run[2].end_s = -1;
    j[0].slots_per_node = 2;
    cr_assert_eq(sched_admit(&s, dec, order, &n), 0);
    cr_assert_eq(sched_pending(&s, dec, run, 4, p), 0);
    cr_assert_float_eq(p[0].start_s, 50, 1e-9, "r1's end, not r3's unknown one: %g", p[0].start_s);
    /* r4 (5 s) frees the 2 it needs on w1, so r2 (20 s), released before r1, is not named */
    cr_assert_eq(p[0].nblocking, 2);
    cr_assert_str_eq(p[0].blocking[0], "r4");
    cr_assert_str_eq(p[0].blocking[1], "r1");
    /* the job behind it: position 2, names big and what big waits for, no estimate */
    cr_assert_eq(p[1].position, 2);
    cr_assert(strstr(p[1].missing, "its turn: job big is ahead of it in queue default and waits (needs 2 worker(s)"),
              "%s", p[1].missing);
    cr_assert_str_eq(p[1].blocking[0], "big");
    cr_assert_eq(p[1].nblocking, 1 + p[0].nblocking);
    cr_assert_lt(p[1].start_s, 0);
    /* ends are on the snapshot's clock, the estimate counts from now */
    s.now_s = 1000;
    for (int k = 0; k < 4; k++)
        run[k].end_s += run[k].end_s < 0 ? 0 : 1000;
    cr_assert_eq(sched_pending(&s, dec, run, 4, p), 0);
    cr_assert_float_eq(p[0].start_s, 50, 1e-9, "50 s from now: %g", p[0].start_s);
}

Test(pending, quota_names_the_numbers_and_the_queues_jobs)
{
    sched_worker_t w[] = {W("w0", 8, 6)};
    sched_queue_t q[] = {{.name = "nlp", .quota = {2, 0}, .borrowing_limit = {U, U}, .lending_limit = {U, U},
                          .weight = 1, .usage = {2, 0}},
                         {.name = "cv", .quota = {U, U}, .borrowing_limit = {U, U}, .lending_limit = {U, U},
                          .weight = 1}};
    sched_job_t j[] = {job("a", 0, 1, 2), job("b", 1, 1, 1), job("c", 0, 1, 1)};
    int w0[] = {0};
    sched_running_t run[] = {
        {.id = "mine", .queue = 0, .type = 0, .nodes = 1, .slots_per_node = 2, .worker = w0, .end_s = 30},
    };
    sched_snapshot_t s = {.workers = w, .nworkers = 1, .queues = q, .nqueues = 2, .jobs = j, .njobs = 3};
    sched_decision_t dec[3];
    int order[3], n = -1;
    cr_assert_eq(sched_admit(&s, dec, order, &n), 0);
    cr_assert_eq(n, 1, "cv's job b goes");
    sched_pending_t p[3];
    cr_assert_eq(sched_pending(&s, dec, run, 1, p), 0);
    cr_assert_eq(p[1].position, 0, "admitted: no pending");
    cr_assert_eq(p[0].position, 1);
    cr_assert_eq(p[2].position, 2, "positions count the queue's own waiting jobs only");
    cr_assert_str_eq(p[0].missing, "needs 2 cpu slot(s) on 1 worker(s); queue nlp: quota 2, used 2, no cohort to "
                                   "borrow from");
    cr_assert_eq(p[0].nblocking, 1);
    cr_assert_str_eq(p[0].blocking[0], "mine");
    cr_assert_float_eq(p[0].start_s, 30, 1e-9);
    char text[300];
    sched_admission_text(&s, 1, &dec[1], NULL, text, sizeof text);
    cr_assert_str_eq(text, "admitted from queue cv (no quota limit)");
}

/* A job waiting for its queue's quota waits for its own queue's jobs: another queue's jobs that
 * end sooner free slots, but not the quota, and are not named among its blocking jobs. */
Test(pending, waiting_for_quota_names_only_the_ends_it_needs)
{
    sched_worker_t w[] = {W("w0", 2, 0), W("w1", 2, 0)};
    sched_queue_t q[] = {{.name = "prod", .quota = {U, U}, .borrowing_limit = {U, U}, .lending_limit = {U, U},
                          .weight = 1, .usage = {2, 0}},
                         {.name = "never", .quota = {2, 0}, .borrowing_limit = {U, U}, .lending_limit = {U, U},
                          .weight = 1, .usage = {2, 0}}};
    sched_job_t j[] = {job("hi", 1, 1, 1)};
    int w0[] = {0}, w1[] = {1};
    sched_running_t run[] = {
        {.id = "p1", .queue = 0, .type = 0, .nodes = 1, .slots_per_node = 1, .worker = w0, .end_s = 10},
        {.id = "p2", .queue = 0, .type = 0, .nodes = 1, .slots_per_node = 1, .worker = w0, .end_s = 20},
        {.id = "n1", .queue = 1, .type = 0, .nodes = 1, .slots_per_node = 1, .worker = w1, .end_s = 30},
        {.id = "n2", .queue = 1, .type = 0, .nodes = 1, .slots_per_node = 1, .worker = w1, .end_s = 40},
    };
    sched_snapshot_t s = {.workers = w, .nworkers = 2, .queues = q, .nqueues = 2, .jobs = j, .njobs = 1};
    sched_decision_t dec[1];
    int order[1], n = -1;
    cr_assert_eq(sched_admit(&s, dec, order, &n), 0);
    cr_assert_eq(dec[0].outcome, SCHED_WAIT_QUOTA);
    sched_pending_t p[1];
    cr_assert_eq(sched_pending(&s, dec, run, 4, p), 0);
    cr_assert_float_eq(p[0].start_s, 30, 1e-9, "n1's end frees a slot and the quota: %g", p[0].start_s);
    cr_assert_eq(p[0].nblocking, 1, "p1 and p2 (queue prod) were named too: %d", p[0].nblocking);
    cr_assert_str_eq(p[0].blocking[0], "n1");
    /* before its queue's jobs have predicted ends (just started): no estimate, the same one job */
    run[2].end_s = run[3].end_s = -1;
    cr_assert_eq(sched_pending(&s, dec, run, 4, p), 0);
    cr_assert_lt(p[0].start_s, 0);
    cr_assert_eq(p[0].nblocking, 1, "%d", p[0].nblocking);
    cr_assert_str_eq(p[0].blocking[0], "n1");
}

Test(pending, borrowing_admission_text)
{
    sched_worker_t w[] = {W("w0", 8, 8)};
    sched_queue_t q[] = {{.name = "nlp", .cohort = "research", .quota = {2, 0}, .borrowing_limit = {U, U},
                          .lending_limit = {U, U}, .weight = 1},
                         {.name = "cv", .cohort = "research", .quota = {4, 0}, .borrowing_limit = {U, U},
                          .lending_limit = {U, U}, .weight = 1}};
    sched_job_t j[] = {job("a", 0, 1, 3)};
    sched_snapshot_t s = {.workers = w, .nworkers = 1, .queues = q, .nqueues = 2, .jobs = j, .njobs = 1};
    sched_decision_t dec[1];
    int order[1], n = -1;
    cr_assert_eq(sched_admit(&s, dec, order, &n), 0);
    cr_assert_eq(n, 1);
    cr_assert(dec[0].borrowed);
    char text[300];
    sched_admission_text(&s, 0, &dec[0], NULL, text, sizeof text);
    cr_assert_str_eq(text, "admitted from queue nlp borrowing 1 cpu slot(s) from cohort research (quota 2, in use 3 "
                           "with this job)");
}

/* A job waiting behind the head whose run time is an estimate (nothing of its model at its
 * resources has run) says so, with the estimate; one with a prediction proper does not. */
Test(pending, an_estimated_run_time_is_labelled)
{
    sched_worker_t w[] = {W("w0", 4, 0)};
    sched_queue_t q[] = {{.name = "default", .quota = {U, U}, .borrowing_limit = {U, U}, .lending_limit = {U, U},
                          .weight = 1}};
    sched_job_t j[] = {job("big", 0, 1, 4), job("guess", 0, 1, 1), job("known", 0, 1, 1)};
    j[1].runtime_s = 120;
    j[1].runtime_estimate = "an estimate from the step time of its model at other resources";
    j[2].runtime_s = 60;
    int w0[] = {0};
    sched_running_t run[] = {{.id = "r1", .queue = 0, .type = 0, .nodes = 1, .slots_per_node = 4, .worker = w0,
                              .end_s = -1}};
    sched_snapshot_t s = {.workers = w, .nworkers = 1, .queues = q, .nqueues = 1, .jobs = j, .njobs = 3,
                          .running = run, .nrunning = 1};
    sched_decision_t dec[3];
    int order[3], n = -1;
    cr_assert_eq(sched_admit(&s, dec, order, &n), 0);
    cr_assert_eq(dec[1].outcome, SCHED_WAIT_BEHIND);
    sched_pending_t p[3];
    cr_assert_eq(sched_pending(&s, dec, run, 1, p), 0);
    cr_assert(strstr(p[1].missing, "; its run time, 120 s, is an estimate from the step time of its model"), "%s",
              p[1].missing);
    cr_assert_null(strstr(p[2].missing, "estimate"), "%s", p[2].missing);
}
