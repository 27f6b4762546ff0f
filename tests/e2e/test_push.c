/* test_push.c - end to end: work reaches an agent without waiting for its next heartbeat. kilnd
 * tells the agents to heartbeat only once a minute; a two-node job still reaches RUNNING, and
 * stops when asked, within seconds (kilnd nudges the agents through WatchWork when the
 * assignments, the rendezvous port and the stop orders commit), with one kilnd and with two
 * replicas, the agents watching on the one that does not lead (the leader schedules and commits;
 * the other hears of it through the database). A burst of work notifications for one worker
 * comes to its agent as one or two nudges, and a watch that ends is counted in
 * kiln_grpc_requests_total. */
#include <criterion/criterion.h>
#include <libpq-fe.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "tests/common/harness.h"
#include "tests/e2e/e2e.h"

/* What the push tests wait, at least: far above what a push takes on a loaded machine. */
#define PUSH_DEADLINE_MS 20000

/* How long work may take to reach the agents and still be known to have been pushed: an agent
 * heartbeats on its own only E2E_SLOW_HEARTBEAT_MS after its last heartbeat (a nudge's included),
 * so until the earliest of the workers' last heartbeats plus that interval, less 5 s for the
 * heartbeat call itself, nothing but a push can bring the work. At least PUSH_DEADLINE_MS. */
static long push_deadline_ms(void)
{
    json_t *w = e2e_get("/v1/workers");
    int64_t earliest = 0;
    size_t k;
    json_t *x;
    json_array_foreach(json_object_get(w, "workers"), k, x) {
        if (strcmp(e2e_jstr(x, "state"), "ALIVE"))
            continue;
        int64_t at = 0;
        cr_assert_eq(kiln_time_parse(e2e_jstr(x, "last_heartbeat"), &at), 0, "%s", e2e_dump(x));
        if (!earliest || at < earliest)
            earliest = at;
    }
    json_decref(w);
    long left = (long)((earliest - kiln_now_us()) / 1000) + atol(E2E_SLOW_HEARTBEAT_MS) - 5000;
    return KILN_MAX(left, PUSH_DEADLINE_MS);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void job_runs_and_stops_before_a_heartbeat(void)
{
    char *spec = e2e_spec("e2e-push", 1000000, 2, 1, 4);
    long deadline = push_deadline_ms();
    double t0 = now_s();
    json_t *job = e2e_submit(spec);
    free(spec);
    char id[64];
    snprintf(id, sizeof id, "%s", e2e_jstr(job, "id"));
    json_decref(job);
    job = e2e_wait_state(id, "RUNNING" TH_OR_ENDED, deadline);
    double ran = now_s() - t0;
    cr_assert_str_eq(e2e_jstr(job, "state"), "RUNNING", "%.1f s after submission the job is %s (%s): the "
                     "agents heartbeat every %s ms, so work was not pushed to them", ran, e2e_jstr(job, "state"),
                     e2e_jstr(job, "reason"), E2E_SLOW_HEARTBEAT_MS);
    json_decref(job);
    cr_log_info("submitted -> RUNNING on two agents in %.2f s (heartbeats every %s ms)", ran, E2E_SLOW_HEARTBEAT_MS);

    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s:stop", id);
    long st = 0;
    deadline = push_deadline_ms();
    double t1 = now_s();
    json_t *r = e2e_http("POST", path, "{\"reason\": \"e2e push test\"}", NULL, &st);
    cr_assert_eq(st, 200, "stop: HTTP %ld %s", st, e2e_dump(r));
    json_decref(r);
    job = e2e_wait_state(id, TH_JOB_ENDED, deadline);
    double stopped = now_s() - t1;
    cr_assert_str_eq(e2e_jstr(job, "state"), "STOPPED", "%.1f s after the stop the job is %s (%s): the stop "
                     "orders were not pushed", stopped, e2e_jstr(job, "state"), e2e_jstr(job, "reason"));
    json_decref(job);
    cr_log_info("stop -> STOPPED in %.2f s", stopped);
}

/* The value of the sample line name (with its labels, as written) in replica i's /metrics, or -1
 * when it has none. */
static double metric(int replica, const char *name)
{
    char url[160];
    snprintf(url, sizeof url, "%s/metrics", replica ? e2e_cl->url1 : e2e_cl->url0);
    const char *hdrs[] = {"Authorization:", NULL};
    long st = 0;
    char *text = NULL;
    cr_assert_eq(th_http("GET", url, NULL, hdrs, &st, &text, 10000), 0, "GET %s failed", url);
    cr_assert_eq(st, 200, "GET %s: %ld", url, st);
    double v = -1;
    size_t n = strlen(name);
    for (const char *p = text; p && *p;) {
        if (!strncmp(p, name, n) && p[n] == ' ') {
            v = atof(p + n + 1);
            break;
        }
        p = strchr(p, '\n');
        p = p ? p + 1 : NULL;
    }
    free(text);
    return v;
}

/* Waits up to timeout_ms until replica i's sample name has the value want; returns the last value. */
static double metric_wait(int replica, const char *name, double want, long timeout_ms)
{
    double v = -1;
    for (long waited = 0; waited <= timeout_ms; waited += 100) {
        if ((v = metric(replica, name)) == want)
            break;
        usleep(100000);
    }
    return v;
}

#define WATCHES "kiln_grpc_work_watches"
#define NUDGES "kiln_grpc_work_nudges_total"
#define WATCH_ENDED "kiln_grpc_requests_total{method=\"/kiln.AgentService/WatchWork\",code=\"cancelled\"}"

Test(e2e_push, work_arrives_before_the_next_heartbeat, .init = e2e_setup_slow_heartbeat, .fini = e2e_teardown,
     .timeout = 180)
{
    job_runs_and_stops_before_a_heartbeat();
    e2e_pass();
}

/* The agents are restarted knowing only the replica that does not lead, and the test waits until
 * that replica holds both their watches and the other none: the job's work is then committed by
 * the leader and reaches the agents only through the other replica's notification listener. */
Test(e2e_push, work_arrives_through_the_replica_that_does_not_lead, .init = e2e_setup_replicas_slow_heartbeat,
     .fini = e2e_teardown, .timeout = 240)
{
    int leader = e2e_leader(30000);
    cr_assert_geq(leader, 0, "no replica leads");
    int other = 1 - leader;
    for (int i = 0; i < E2E_AGENTS; i++)
        e2e_agent_restart_on(i, other);
    double w = metric_wait(other, WATCHES, E2E_AGENTS, 30000);
    cr_assert_eq(w, E2E_AGENTS, "replica %d (not leading) holds %.0f work watches, not the agents' %d", other, w,
                 E2E_AGENTS);
    w = metric_wait(leader, WATCHES, 0, 30000);
    cr_assert_eq(w, 0, "replica %d (leading) still holds %.0f work watches", leader, w);
    cr_assert_eq(e2e_leaders(), 1 << leader, "replica %d alone should lead (leaders mask %d)", leader, e2e_leaders());
    job_runs_and_stops_before_a_heartbeat();
    cr_assert_eq(e2e_leaders(), 1 << leader, "the lead moved during the test (leaders mask %d)", e2e_leaders());
    cr_assert_eq(metric(other, WATCHES), E2E_AGENTS, "the agents' watches left replica %d during the test", other);
    e2e_pass();
}

/* 200 notifications of work for worker 0, each its own transaction, the last 199 as fast as the
 * database takes them: kilnd sends its agent one nudge at once and at most one more each 50 ms, not one each. A
 * watch the agent's end cuts off is counted as a cancelled WatchWork call. */
Test(e2e_push, a_burst_of_work_is_one_nudge_and_an_ended_watch_is_counted, .init = e2e_setup_slow_heartbeat,
     .fini = e2e_teardown, .timeout = 180)
{
    cr_assert_eq(metric_wait(0, WATCHES, E2E_AGENTS, 30000), E2E_AGENTS, "the agents hold no watches");
    PGconn *db = PQconnectdb(e2e_cl->db_url);
    cr_assert_eq(PQstatus(db), CONNECTION_OK, "%s", PQerrorMessage(db));
    char q[256];
    snprintf(q, sizeof q, "NOTIFY kiln_work, '%s'", e2e_cl->worker_id[0]);
    double before = metric(0, NUDGES);
    cr_assert_geq(before, E2E_AGENTS, "each watch's first nudge is counted (%.0f)", before);
    double t0 = now_s();
    for (int i = 0; i < 200; i++) {
        PGresult *r = PQexec(db, q);
        cr_assert_eq(PQresultStatus(r), PGRES_COMMAND_OK, "%s", PQerrorMessage(db));
        PQclear(r);
        /* the first notification's nudge goes out at once: once it is counted, the other 199
         * come after it, so they are at least one more nudge however kilnd batches its reads */
        if (i == 0)
            cr_assert_eq(metric_wait(0, NUDGES, before + 1, 30000), before + 1,
                         "one notification was not one nudge at once");
    }
    double burst_ms = (now_s() - t0) * 1000;
    PQfinish(db);
    /* the last nudge goes out within 50 ms of the burst's end as kilnd hears it (its notify thread
     * reads notifications in batches, on a loaded machine late): wait until the count settles,
     * keeping when its last value was first seen, by which time every nudge had been sent */
    double after = metric(0, NUDGES), prev = -1, seen = now_s();
    for (int i = 0; i < 100 && after != prev; i++) {
        usleep(300000);
        prev = after;
        after = metric(0, NUDGES);
        if (after != prev)
            seen = now_s();
    }
    /* one at once, then at most one each 50 ms until the last was sent */
    double span_ms = (seen - t0) * 1000, sent = after - before, most = span_ms / 50 + 2;
    cr_log_info("200 notifications in %.0f ms: %.0f nudges within %.0f ms (at most %.0f)", burst_ms, sent, span_ms,
                most);
    cr_assert_geq(sent, 2, "a burst longer than an instant is a nudge at once and one at its end (%.0f)", sent);
    cr_assert_leq(sent, most, "200 notifications in %.0f ms became %.0f nudges within %.0f ms: at most one each 50 ms, "
                  "so %.0f", burst_ms, sent, span_ms, most);
    double ended = metric(0, WATCH_ENDED);
    e2e_agent_signal(0, SIGKILL);
    double now_ended = metric_wait(0, WATCH_ENDED, (ended < 0 ? 0 : ended) + 1, 30000);
    cr_assert_eq(now_ended, (ended < 0 ? 0 : ended) + 1, "the killed agent's watch was not counted as a cancelled "
                 "WatchWork call (%.0f before, %.0f now)", ended, now_ended);
    cr_assert_eq(metric_wait(0, WATCHES, E2E_AGENTS - 1, 30000), E2E_AGENTS - 1, "the killed agent's watch is held");
    e2e_pass();
}
