/* test_starve.c - one job cannot starve the agent: a job whose 16 metric definitions backtrack
 * catastrophically on every line its rank prints runs beside a bystander job. The heartbeat's
 * view of the ranks (agent_launcher_list) and stop orders answer at once throughout, the
 * bystander's lines and metric points keep flowing, and the greedy job's definitions are
 * switched off with a line in its log saying so. Real child processes. */
#include "tests/agent/launch_fixture.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TestSuite(starve, .init = lf_setup, .fini = lf_teardown, .timeout = 120);

/* Nested quantifiers with no literal PCRE2 could use to give up early: on a line of digits it
 * tries every way of splitting them before failing. */
#define CATASTROPHIC "(\\d+\\d+)+\\D"

typedef struct watch {
    agent_launcher_t *l;
    volatile bool stop;
    int64_t max_list_us, max_stop_us;
    int64_t max_late_us; /* the longest the watcher's own 5 ms pause overran: the machine's stalls */
    int calls;
} watch_t;

/* What the heartbeat thread does, every 5 ms: list the ranks, and deliver a stop order (for a
 * job that is not there, so nothing is stopped). It also measures how late its own pauses end,
 * which is what a loaded machine adds to any call's time without the launcher holding it up. */
static void *watcher(void *arg)
{
    watch_t *w = arg;
    agent_rank_info_t info[8];
    while (!w->stop) {
        int64_t t0 = kiln_mono_us();
        agent_launcher_list(w->l, info, 8);
        int64_t t1 = kiln_mono_us();
        agent_launcher_stop(w->l, "no-such-job", 0, 1000);
        int64_t t2 = kiln_mono_us();
        w->max_list_us = KILN_MAX(w->max_list_us, t1 - t0);
        w->max_stop_us = KILN_MAX(w->max_stop_us, t2 - t1);
        w->calls++;
        usleep(5000);
        w->max_late_us = KILN_MAX(w->max_late_us, kiln_mono_us() - t2 - 5000);
    }
    return NULL;
}

Test(starve, a_backtracking_job_neither_blocks_heartbeats_nor_its_neighbour)
{
    /* one program for both jobs: it runs the part named by the job (a rank sees only its program) */
    char *bin = lf_script("rank.sh",
                          "case $KILN_JOB_ID in\n"
                          "greedy) i=0\n"
                          "  while [ $i -lt 3000 ]; do echo 1111111111111111111111111111111111111111; i=$((i+1)); done\n"
                          "  echo greedy-done;;\n"
                          "bystander) i=1\n"
                          "  while [ $i -le 100 ]; do echo \"tick $i\"; i=$((i+1)); sleep 0.03; done;;\n"
                          "esac\n");
    agent_launcher_t *l = lf_launcher(bin, 2, false, 2, NULL, 0);

    watch_t w = {.l = l};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, watcher, &w), 0);

    int32_t r0[] = {0}, r1[] = {0};
    Kiln__MetricDefinition slow[AGENT_MAX_METRIC_DEFS], *slowp[AGENT_MAX_METRIC_DEFS];
    for (int i = 0; i < AGENT_MAX_METRIC_DEFS; i++) {
        kiln__metric_definition__init(&slow[i]);
        slow[i].name = (char *)"slow";
        slow[i].regex = (char *)CATASTROPHIC;
        slowp[i] = &slow[i];
    }
    Kiln__Assignment a = lf_assignment("greedy", 1, r0, 1, "{}");
    a.metric_definitions = slowp;
    a.n_metric_definitions = AGENT_MAX_METRIC_DEFS;
    Kiln__MetricDefinition tick = KILN__METRIC_DEFINITION__INIT, *tickp[] = {&tick};
    tick.name = (char *)"tick";
    tick.regex = (char *)"tick ([0-9]+)";
    Kiln__Assignment b = lf_assignment("bystander", 1, r1, 1, "{}");
    b.metric_definitions = tickp;
    b.n_metric_definitions = 1;
    kiln_err_t err;
    cr_assert_eq(agent_launcher_start(l, &a, &err), 0, "%s", err.message);
    cr_assert_eq(agent_launcher_start(l, &b, &err), 0, "%s", err.message);
    bool ended = lf_wait_exits(2, 90000);
    w.stop = true;
    pthread_join(th, NULL);
    cr_assert(ended, "both jobs end");

    /* the heartbeat's calls never waited for the greedy job's matching: 300 ms, and what the
     * machine itself held the watcher up by (its pauses' worst overrun) */
    cr_assert_gt(w.calls, 10);
    int64_t bound = 300000 + w.max_late_us;
    cr_assert_lt(w.max_list_us, bound, "listing the ranks took %lld ms (the machine stalled the watcher %lld ms)",
                 (long long)(w.max_list_us / 1000), (long long)(w.max_late_us / 1000));
    cr_assert_lt(w.max_stop_us, bound, "a stop order took %lld ms (the machine stalled the watcher %lld ms)",
                 (long long)(w.max_stop_us / 1000), (long long)(w.max_late_us / 1000));

    /* the bystander's lines kept flowing: all of them, without a long silence, and its metric */
    int ticks = 0, greedy_lines = 0;
    int64_t last = 0, max_gap = 0;
    bool switched_off = false;
    pthread_mutex_lock(&R.mu);
    for (int i = 0; i < R.nlines; i++) {
        const ev_line_t *e = &R.lines[i];
        if (!strcmp(e->job, "bystander") && !strncmp(e->text, "tick ", 5)) {
            if (last)
                max_gap = KILN_MAX(max_gap, e->at_us - last);
            last = e->at_us;
            ticks++;
        } else if (!strcmp(e->job, "greedy")) {
            greedy_lines++;
            switched_off |= strstr(e->text, "[kiln-agent] metric definitions switched off") != NULL;
        }
    }
    int tick_points = 0, slow_points = 0;
    for (size_t i = 0; i < R.points.n; i++) {
        tick_points += !strcmp(R.points.v[i].name, "tick");
        slow_points += !strcmp(R.points.v[i].name, "slow");
    }
    pthread_mutex_unlock(&R.mu);
    cr_assert_eq(ticks, 100);
    cr_assert_lt(max_gap, 1000000 + w.max_late_us, "the bystander's lines stalled for %lld ms (the machine stalled "
                 "the watcher %lld ms)", (long long)(max_gap / 1000), (long long)(w.max_late_us / 1000));
    cr_assert_eq(tick_points, 100, "the bystander's metric definition kept matching");
    cr_assert(switched_off, "the greedy job's log says its definitions were switched off");
    cr_assert_eq(slow_points, 0);
    cr_assert_eq(greedy_lines, 3000 + 2, "every line of the greedy job is still forwarded");
    agent_launcher_destroy(l);
}
