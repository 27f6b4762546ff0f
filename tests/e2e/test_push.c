/* test_push.c - end to end: work reaches an agent without waiting for its next heartbeat. kilnd
 * tells the agents to heartbeat only once a minute; a two-node job still reaches RUNNING, and
 * stops when asked, within seconds (kilnd nudges the agents through WatchWork when the
 * assignments, the rendezvous port and the stop orders commit), with one kilnd and with two
 * replicas (the leader schedules; an agent may watch on the other one). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "tests/e2e/e2e.h"

/* Far below the minute the next heartbeat is away (the set-up registered the agents, each with a
 * heartbeat, seconds ago), far above what a push takes on a loaded machine. */
#define PUSH_DEADLINE_MS 20000

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void job_runs_and_stops_before_a_heartbeat(void)
{
    char *spec = e2e_spec("e2e-push", 1000000, 2, 1, 4);
    double t0 = now_s();
    json_t *job = e2e_submit(spec);
    free(spec);
    char id[64];
    snprintf(id, sizeof id, "%s", e2e_jstr(job, "id"));
    json_decref(job);
    job = e2e_wait_state(id, "RUNNING|FAILED|STOPPED|COMPLETED", PUSH_DEADLINE_MS);
    double ran = now_s() - t0;
    cr_assert_str_eq(e2e_jstr(job, "state"), "RUNNING", "%.1f s after submission the job is %s (%s): the "
                     "agents heartbeat every %s ms, so work was not pushed to them", ran, e2e_jstr(job, "state"),
                     e2e_jstr(job, "reason"), E2E_SLOW_HEARTBEAT_MS);
    json_decref(job);
    cr_log_info("submitted -> RUNNING on two agents in %.2f s (heartbeats every %s ms)", ran, E2E_SLOW_HEARTBEAT_MS);

    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s:stop", id);
    long st = 0;
    double t1 = now_s();
    json_t *r = e2e_http("POST", path, "{\"reason\": \"e2e push test\"}", NULL, &st);
    cr_assert_eq(st, 200, "stop: HTTP %ld %s", st, e2e_dump(r));
    json_decref(r);
    job = e2e_wait_state(id, "STOPPED|FAILED|COMPLETED", PUSH_DEADLINE_MS);
    double stopped = now_s() - t1;
    cr_assert_str_eq(e2e_jstr(job, "state"), "STOPPED", "%.1f s after the stop the job is %s (%s): the stop "
                     "orders were not pushed", stopped, e2e_jstr(job, "state"), e2e_jstr(job, "reason"));
    json_decref(job);
    cr_log_info("stop -> STOPPED in %.2f s", stopped);
}

Test(e2e_push, work_arrives_before_the_next_heartbeat, .init = e2e_setup_slow_heartbeat, .fini = e2e_teardown,
     .timeout = 180)
{
    job_runs_and_stops_before_a_heartbeat();
    e2e_pass();
}

Test(e2e_push, work_arrives_through_either_replica, .init = e2e_setup_replicas_slow_heartbeat,
     .fini = e2e_teardown, .timeout = 180)
{
    cr_assert_geq(e2e_leader(30000), 0, "no replica leads");
    job_runs_and_stops_before_a_heartbeat();
    e2e_pass();
}
