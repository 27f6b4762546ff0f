/* test_liveness.c - workers that stop heartbeating: their jobs leave RUNNING (FAILED, or
 * RESTARTING and placed again as a new attempt), and reports from the lost attempt change
 * nothing. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/service/fixture.h"

/* ---- liveness ------------------------------------------------------------------------------ */

TestSuite(liveness, .init = setup_short_timeout, .fini = teardown, .timeout = 60);

Test(liveness, silent_worker_fails_its_job)
{
    char w[1][64], id[40];
    run_job(1, 1, w, id);
    /* No more heartbeats: within the timeout (1.5 s) plus a liveness tick the job must leave
     * RUNNING. */
    json_t *j = wait_state(id, "FAILED", 10000);
    const char *reason = json_string_value(json_object_get(j, "reason"));
    cr_assert(strstr(reason, "stopped heartbeating"), "%s", reason);
    cr_assert(strstr(reason, w[0]), "%s", reason);
    json_decref(j);
    json_t *ws = NULL;
    cr_assert_eq(svc_workers_list(svc, svc_caller_kilnd(), &ws, &err), 0);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(ws, "workers"), 0), "state")),
                     "DEAD");
    json_decref(ws);
    /* The dead worker is told to register again; with its old id it is ALIVE, and the ranks it
     * still reports are stopped. */
    Kiln__HeartbeatResponse *r = hb(w[0], id, 1);
    cr_assert(r->reregister);
    char again[64];
    reg(w[0], 1, "cpu", again);
    r = hb(w[0], id, 1);
    cr_assert_not(r->reregister);
    cr_assert_eq(r->n_stops, 1);
}

Test(liveness, lost_attempt_restarts_elsewhere_and_stale_reports_are_ignored)
{
    char w[2][64], spare[64], id[40];
    run_job(2, 2, w, id);
    reg(NULL, 1, "cpu", spare);
    /* w[0] and the spare keep heartbeating; w[1] goes silent. */
    json_t *j = NULL;
    bool stop_seen = false;
    for (int t = 0; t < 10000; t += 100) {
        stop_seen |= hb(w[0], id, 1)->n_stops == 1;
        hb(spare, NULL, 0);
        j = get(id);
        if (strcmp(state_of(j), "RESTARTING") == 0 || strcmp(state_of(j), "SCHEDULED") == 0)
            break;
        json_decref(j);
        j = NULL;
        struct timespec ts = {0, 100 * 1000000};
        nanosleep(&ts, NULL);
    }
    cr_assert_not_null(j, "the job never left RUNNING");
    json_decref(j);
    char ev[256];
    events_str(id, ev, sizeof(ev));
    cr_assert(strstr(ev, "RUNNING RESTARTING"), "%s", ev);
    /* w[0] is told to stop its rank of attempt 1; once it exits the slots free up and attempt 2
     * is placed on w[0] and the spare. */
    stop_seen |= hb(w[0], id, 1)->n_stops == 1;
    rank_exit(w[0], id, 1, 0, 143, "stopped");
    for (int t = 0; t < 10000; t += 50) {
        hb(w[0], NULL, 0);
        hb(spare, NULL, 0);
        j = get(id);
        if (json_integer_value(json_object_get(j, "attempt")) == 2)
            break;
        json_decref(j);
        j = NULL;
        struct timespec ts = {0, 50 * 1000000};
        nanosleep(&ts, NULL);
    }
    cr_assert_not_null(j, "attempt 2 was never placed");
    char st2[16];
    kiln_strlcpy(st2, state_of(j), sizeof(st2));
    cr_assert(!strcmp(st2, "SCHEDULED") || !strcmp(st2, "STARTING"), "%s", st2);
    json_decref(j);
    cr_assert(stop_seen, "the surviving worker was told to stop attempt 1");
    /* A late report from attempt 1 changes nothing. */
    rank_exit(w[1], id, 1, 1, 1, "late failure from the old attempt");
    status(w[1], id, 1, true, NULL);
    j = get(id);
    cr_assert_str_eq(state_of(j), st2);
    cr_assert_eq(json_integer_value(json_object_get(j, "attempt")), 2);
    json_decref(j);
}

