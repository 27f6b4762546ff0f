/* test_flow.c - the service with a real PostgreSQL (a fresh database per test) and its own
 * scheduler and liveness threads, the agent's part played by fixture.c: submission (queued,
 * idempotent, invalid, larger than the workers, lists), the whole life of a job to COMPLETED with logs and metrics,
 * a failing rank, stop requests, re-delivery, a restarted service, max runtime, priorities, two
 * services on one database, data roots and project areas. */
#include <criterion/criterion.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "query/query.h"
#include "tests/service/fixture.h"

/* ---- submission ----------------------------------------------------------------------------- */

TestSuite(submit, .init = setup, .fini = teardown, .timeout = 60);

Test(submit, queued_with_event_and_waiting_reason)
{
    char id[40];
    bool created = false;
    submit(spec(1, 1, "cpu", 0, 1), NULL, id, &created);
    cr_assert(created);
    json_t *j = get(id);
    cr_assert_str_eq(state_of(j), "QUEUED");
    cr_assert(strstr(json_string_value(json_object_get(j, "reason")), "waiting for workers"));
    json_t *sp = json_object_get(j, "spec");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(sp, "resources"), "slot_type")), "cpu");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(sp, "retry"), "max_attempts")), 1);
    json_decref(j);
    char ev[256];
    events_str(id, ev, sizeof(ev));
    cr_assert_str_eq(ev, "QUEUED");
}

Test(submit, idempotent_create_returns_the_same_job)
{
    char a[40], b[40];
    bool ca = false, cb = true;
    submit(spec(1, 1, "cpu", 0, 1), "retry-me", a, &ca);
    submit(spec(1, 1, "cpu", 0, 1), "retry-me", b, &cb);
    cr_assert(ca);
    cr_assert_not(cb);
    cr_assert_str_eq(a, b);
    json_t *list = NULL;
    svc_job_filter_t f = {0};
    cr_assert_eq(svc_job_list(svc, svc_caller_kilnd(), &f, &list, &err), 0);
    cr_assert_eq(json_array_size(json_object_get(list, "jobs")), 1);
    json_decref(list);
}

typedef struct racer {
    char id[40];
    bool created;
    int rc;
} racer_t;

static void *race_create(void *p)
{
    racer_t *r = p;
    json_t *sp = spec(1, 1, "cpu", 0, 1), *job = NULL;
    kiln_err_t e;
    r->rc = svc_job_create(svc, svc_caller_kilnd(), sp, "same-key", &job, &r->created, &e);
    if (r->rc == 0)
        kiln_strlcpy(r->id, json_string_value(json_object_get(job, "id")), sizeof(r->id));
    json_decref(job);
    json_decref(sp);
    return NULL;
}

Test(submit, concurrent_retries_with_one_key_create_one_job)
{
    enum { N = 8 };
    pthread_t t[N];
    racer_t r[N];
    memset(r, 0, sizeof(r));
    for (int i = 0; i < N; i++)
        pthread_create(&t[i], NULL, race_create, &r[i]);
    int created = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        cr_assert_eq(r[i].rc, 0);
        created += r[i].created;
        cr_assert_str_eq(r[i].id, r[0].id);
    }
    cr_assert_eq(created, 1);
}

Test(submit, invalid_spec_names_the_field)
{
    json_t *sp = spec(1, 1, "cpu", 0, 1);
    json_object_set_new(json_object_get(sp, "hyperparameters"), "lr", json_real(-1.0));
    json_t *job = NULL;
    bool created = true;
    int rc = svc_job_create(svc, svc_caller_kilnd(), sp, NULL, &job, &created, &err);
    json_decref(sp);
    cr_assert_eq(rc, KILN_EINVAL);
    cr_assert_null(job);
    cr_assert_str_eq(err.field, "hyperparameters.lr");
}

/* A job larger than the alive workers is not invalid (workers come and go): it is accepted, says
 * what it waits for, and runs once a worker it fits on registers. */
Test(submit, a_job_larger_than_the_workers_waits_for_them)
{
    char w[64];
    reg(NULL, 2, "cpu", w);
    char big[40], gpu[40];
    submit(spec(1, 4, "cpu", 0, 1), NULL, big, NULL);
    submit(spec(1, 1, "gpu", 0, 1), NULL, gpu, NULL);
    json_t *j = get(big);
    cr_assert_str_eq(state_of(j), "QUEUED");
    const char *why = json_string_value(json_object_get(j, "reason"));
    cr_assert(strstr(why, "waiting for workers: needs 1 worker(s) with 4 cpu slot(s) each") &&
              strstr(why, "has 2"), "%s", why);
    json_decref(j);
    /* a job that fits runs meanwhile: the big one blocks nobody */
    char small[40];
    submit(spec(1, 2, "cpu", 0, 1), NULL, small, NULL);
    json_decref(wait_state(small, "SCHEDULED", 10000));
    char w2[64];
    reg(NULL, 4, "cpu", w2);
    json_decref(wait_state(big, "SCHEDULED", 10000));
    j = get(gpu);
    cr_assert_str_eq(state_of(j), "QUEUED");
    why = json_string_value(json_object_get(j, "reason"));
    cr_assert(strstr(why, "waiting for workers") && strstr(why, "gpu"), "%s", why);
    json_decref(j);
}

Test(submit, unknown_jobs_are_not_found)
{
    const char *nope = "00000000-0000-0000-0000-000000000001";
    json_t *out = NULL;
    svc_log_query_t q = {.rank = -1};
    cr_assert_eq(svc_job_get(svc, svc_caller_kilnd(), nope, &out, &err), KILN_ENOTFOUND);
    cr_assert_eq(svc_job_get(svc, svc_caller_kilnd(), "garbage", &out, &err), KILN_ENOTFOUND);
    cr_assert_eq(svc_job_stop(svc, svc_caller_kilnd(), nope, NULL, &out, &err), KILN_ENOTFOUND);
    cr_assert_eq(svc_job_events(svc, svc_caller_kilnd(), nope, &out, &err), KILN_ENOTFOUND);
    cr_assert_eq(svc_job_logs(svc, svc_caller_kilnd(), nope, &q, &out, &err), KILN_ENOTFOUND);
    cr_assert_eq(svc_job_metrics(svc, svc_caller_kilnd(), nope, &(svc_metrics_query_t){.name = NULL}, &out, &err), KILN_ENOTFOUND);
    Kiln__LogLine l = KILN__LOG_LINE__INIT, *lp = &l;
    l.line = "x";
    Kiln__LogBatch lb = KILN__LOG_BATCH__INIT;
    lb.worker_id = "w";
    lb.job_id = (char *)nope;
    lb.lines = &lp;
    lb.n_lines = 1;
    cr_assert_eq(svc_agent_logs(svc, "w", &lb, &err), KILN_EPERM, "no assignment: refused");
    cr_assert(strstr(err.message, nope));
    Kiln__MetricPoint m = KILN__METRIC_POINT__INIT, *mp = &m;
    m.name = "x";
    Kiln__MetricBatch mb = KILN__METRIC_BATCH__INIT;
    mb.worker_id = "w";
    mb.job_id = (char *)nope;
    mb.points = &mp;
    mb.n_points = 1;
    cr_assert_eq(svc_agent_metrics(svc, "w", &mb, &err), KILN_EPERM);
    Kiln__RankExit e = KILN__RANK_EXIT__INIT;
    e.worker_id = "w";
    e.job_id = (char *)nope;
    cr_assert_eq(svc_agent_rank_exit(svc, "w", &e, &err), KILN_EPERM);
    svc_follow_t *f = NULL;
    cr_assert_eq(svc_follow_open(svc, svc_caller_kilnd(), nope, -1, 0, NULL, NULL, &f, &err), KILN_ENOTFOUND);
    cr_assert_eq(svc_ready(svc, &err), 0);
}

Test(submit, list_filters_and_pages)
{
    char ids[5][40];
    for (int i = 0; i < 5; i++)
        submit(spec(1, 1, "cpu", 0, 1), NULL, ids[i], NULL);
    json_t *out = NULL;
    cr_assert_eq(svc_job_stop(svc, svc_caller_kilnd(), ids[2], "not needed", &out, &err), 0);
    cr_assert_str_eq(state_of(out), "STOPPED");
    json_decref(out);
    svc_job_filter_t f = {.page_size = 2};
    int seen = 0;
    char tok[512] = "";
    for (int page = 0; page < 5; page++) {
        f.page_token = tok[0] ? tok : NULL;
        cr_assert_eq(svc_job_list(svc, svc_caller_kilnd(), &f, &out, &err), 0, "%s", err.message);
        seen += (int)json_array_size(json_object_get(out, "jobs"));
        kiln_strlcpy(tok, json_string_value(json_object_get(out, "next_page_token")), sizeof(tok));
        json_decref(out);
        if (!tok[0])
            break;
    }
    cr_assert_eq(seen, 5);
    svc_job_filter_t fs = {.status = "STOPPED,RUNNING"};
    cr_assert_eq(svc_job_list(svc, svc_caller_kilnd(), &fs, &out, &err), 0);
    cr_assert_eq(json_array_size(json_object_get(out, "jobs")), 1);
    json_decref(out);
    svc_job_filter_t ft = {.tag = "team:t"};
    cr_assert_eq(svc_job_list(svc, svc_caller_kilnd(), &ft, &out, &err), 0);
    cr_assert_eq(json_array_size(json_object_get(out, "jobs")), 5);
    json_decref(out);
    svc_job_filter_t fb = {.status = "NOPE"};
    cr_assert_eq(svc_job_list(svc, svc_caller_kilnd(), &fb, &out, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "status");
    svc_job_filter_t fp = {.page_token = "garbage"};
    cr_assert_eq(svc_job_list(svc, svc_caller_kilnd(), &fp, &out, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "page_token");
}

/* 32 comparisons on hyperparameters, the most a filter may hold: PostgreSQL plans each as a join
 * of its own, which takes it tens of milliseconds however few jobs there are */
static void hp_filter_32(char *buf, size_t n)
{
    size_t at = 0;
    for (int i = 0; i < QUERY_MAX_TABLE_TERMS; i++)
        at += (size_t)snprintf(buf + at, n - at, "%shp.p%d > %d", i ? " AND " : "", i, i);
    cr_assert_lt(at, n);
}

Test(submit, a_costly_filter_runs_under_the_default_search_timeout)
{
    char filter[1024];
    hp_filter_32(filter, sizeof filter);
    json_t *out = NULL;
    svc_job_filter_t f = {.filter = filter};
    cr_assert_eq(svc_job_list(svc, svc_caller_kilnd(), &f, &out, &err), 0, "%s", err.message);
    cr_assert_eq(json_array_size(json_object_get(out, "jobs")), 0);
    json_decref(out);
}

TestSuite(search_timeout, .init = setup_search_timeout_1ms, .fini = teardown, .timeout = 60);

Test(search_timeout, a_search_that_runs_too_long_is_refused_and_its_connection_serves_on)
{
    char id[40], filter[1024];
    submit(spec(1, 1, "cpu", 0, 1), NULL, id, NULL);
    hp_filter_32(filter, sizeof filter);
    json_t *out = NULL;
    svc_job_filter_t f = {.filter = filter};
    cr_assert_eq(svc_job_list(svc, svc_caller_kilnd(), &f, &out, &err), KILN_EINVAL, "%s", err.message);
    cr_assert_null(out);
    cr_assert_str_eq(err.field, "filter");
    cr_assert(strstr(err.message, "longer than the 1 ms"), "%s", err.message);
    cr_assert(strstr(err.hint, "--search-timeout-ms"), "%s", err.hint);
    /* the pool's connections are whole again: the timeout was the search's transaction's alone */
    for (int i = 0; i < 8; i++) {
        cr_assert_eq(svc_job_get(svc, svc_caller_kilnd(), id, &out, &err), 0, "%s", err.message);
        json_decref(out);
    }
}

/* ---- lifecycle --------------------------------------------------------------------------------- */

TestSuite(life, .init = setup, .fini = teardown, .timeout = 60);

Test(life, two_node_job_runs_to_completed)
{
    char w1[64], w2[64], id[40];
    reg(NULL, 1, "cpu", w1);
    reg(NULL, 2, "cpu", w2);
    submit(spec(2, 1, "cpu", 0, 1), NULL, id, NULL);
    json_t *j = wait_state(id, "SCHEDULED", 5000);
    cr_assert_eq(json_integer_value(json_object_get(j, "attempt")), 1);
    cr_assert_eq(json_array_size(json_object_get(j, "workers")), 2);
    json_decref(j);

    Kiln__HeartbeatResponse *r1 = hb(w1, NULL, 0);
    cr_assert_eq(r1->n_assignments, 1);
    Kiln__Assignment *a = r1->assignments[0];
    cr_assert_str_eq(a->job_id, id);
    cr_assert_eq(a->attempt, 1);
    cr_assert_eq(a->world_size, 2);
    cr_assert_eq(a->nodes, 2);
    cr_assert_eq(a->n_ranks, 1);
    cr_assert_eq(a->node_rank, 0, "best fit: the 1-slot worker is node 0");
    cr_assert_eq(a->ranks[0], 0);
    cr_assert_str_eq(a->master_addr, "127.0.0.1");
    cr_assert_eq(a->master_port, 0, "node 0's agent picks the rendezvous port");
    json_t *sj = json_loads(a->spec_json, 0, NULL);
    cr_assert_not_null(sj);
    cr_assert_str_eq(json_string_value(json_object_get(sj, "name")), "flow");
    json_decref(sj);
    j = get(id);
    cr_assert_str_eq(state_of(j), "STARTING");
    json_decref(j);
    cr_assert_eq(hb(w1, id, 1)->n_assignments, 0, "delivered once");
    cr_assert_eq(hb(w2, NULL, 0)->n_assignments, 0, "node 1 waits for node 0's port");

    status_port(w1, id, 1, 29777); /* started, with the port it picked */
    Kiln__HeartbeatResponse *r2 = hb(w2, NULL, 0);
    cr_assert_eq(r2->n_assignments, 1);
    cr_assert_eq(r2->assignments[0]->ranks[0], 1);
    cr_assert_eq(r2->assignments[0]->master_port, 29777, "node 1 rendezvous at node 0's port");

    j = get(id);
    cr_assert_str_eq(state_of(j), "STARTING", "waits for every worker");
    json_decref(j);
    status(w2, id, 1, true, NULL);
    j = get(id);
    cr_assert_str_eq(state_of(j), "RUNNING");
    cr_assert_str_eq(json_string_value(json_object_get(j, "reason")), "all 2 rank(s) started");
    cr_assert(json_is_string(json_object_get(j, "started_at")));
    json_decref(j);

    push_logs(w1, id, 1, 0, 0, 10);
    push_logs(w2, id, 1, 1, 10, 5);
    push_metrics(w1, id, 1, 1, 40);
    push_metrics(w1, id, 1, 41, 10);
    j = get(id);
    json_t *prog = json_object_get(j, "progress");
    cr_assert_eq(json_integer_value(json_object_get(prog, "step")), 50);
    cr_assert_eq(json_integer_value(json_object_get(prog, "total_steps")), 100);
    cr_assert(json_is_real(json_object_get(prog, "eta_s")), "an ETA from the step rate");
    cr_assert_float_eq(json_real_value(json_object_get(prog, "eta_s")), 0.5, 0.2);
    cr_assert_float_eq(json_real_value(json_object_get(json_object_get(j, "metrics"), "train_loss")), 2.5, 1e-9);
    cr_assert_float_eq(json_real_value(json_object_get(json_object_get(j, "metrics"), "tokens_per_s")), 1000.0, 1e-9);
    json_decref(j);

    json_t *logs = NULL;
    svc_log_query_t q = {.rank = 1};
    cr_assert_eq(svc_job_logs(svc, svc_caller_kilnd(), id, &q, &logs, &err), 0);
    json_t *lines = json_object_get(logs, "lines");
    cr_assert_eq(json_array_size(lines), 5);
    svc_log_query_t old = {.rank = -1, .since_us = -62135596800000000LL}; /* 0001-01-01 */
    json_t *none = NULL;
    cr_assert_eq(svc_job_logs(svc, svc_caller_kilnd(), id, &old, &none, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "since");
    cr_assert_str_eq(err.message, "since must be a time from 1970 to the end of 9999");
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(lines, 0), "seq")), 11);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(lines, 0), "line")), "line 10");
    cr_assert_eq(json_integer_value(json_object_get(logs, "next_since_seq")), 15);
    json_decref(logs);
    json_t *met = NULL;
    cr_assert_eq(svc_job_metrics(svc, svc_caller_kilnd(), id, &(svc_metrics_query_t){.name = "train_loss", .max_points = 10, .max_points_set = true}, &met, &err), 0);
    json_t *pts = json_object_get(json_array_get(json_object_get(met, "metrics"), 0), "points");
    cr_assert_leq(json_array_size(pts), 10);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(pts, json_array_size(pts) - 1), "step")), 50);
    json_decref(met);

    rank_exit(w1, id, 1, 0, 0, NULL);
    j = get(id);
    cr_assert_str_eq(state_of(j), "RUNNING", "one rank still runs");
    json_decref(j);
    rank_exit(w2, id, 1, 1, 0, NULL);
    j = get(id);
    cr_assert_str_eq(state_of(j), "COMPLETED");
    cr_assert(json_is_string(json_object_get(j, "ended_at")));
    json_decref(j);
    char ev[256];
    events_str(id, ev, sizeof(ev));
    cr_assert_str_eq(ev, "QUEUED SCHEDULED STARTING RUNNING COMPLETED");

    slots_all_free(); /* slots are free again */
    /* Stopping a finished job is refused. */
    json_t *out = NULL;
    cr_assert_eq(svc_job_stop(svc, svc_caller_kilnd(), id, NULL, &out, &err), KILN_ESTATE);
}

Test(life, failing_rank_fails_the_job_and_stops_the_others)
{
    char w[2][64], id[40];
    run_job(2, 1, w, id);
    rank_exit(w[1], id, 1, 1, 3, "RuntimeError: loss is NaN");
    json_t *j = get(id);
    cr_assert_str_eq(state_of(j), "FAILED");
    char reason[512];
    kiln_strlcpy(reason, json_string_value(json_object_get(j, "reason")), sizeof(reason));
    cr_assert(strstr(reason, "rank 1"), "%s", reason);
    cr_assert(strstr(reason, w[1]), "%s", reason);
    cr_assert(strstr(reason, "code 3"), "%s", reason);
    cr_assert(strstr(reason, "loss is NaN"), "%s", reason);
    json_decref(j);
    Kiln__HeartbeatResponse *r = hb(w[0], id, 1);
    cr_assert_eq(r->n_stops, 1);
    cr_assert_str_eq(r->stops[0]->job_id, id);
    cr_assert_eq(r->stops[0]->attempt, 1);
    cr_assert_eq(r->stops[0]->grace_ms, 500);
    /* The stopped rank's exit does not change the outcome. */
    rank_exit(w[0], id, 1, 0, 143, "stopped");
    j = get(id);
    cr_assert_str_eq(state_of(j), "FAILED");
    cr_assert_str_eq(json_string_value(json_object_get(j, "reason")), reason);
    json_decref(j);
}

/* The reason of job id's last move to state to, from its events (a copy; caller frees): what the
 * live reason said then, before a later move (the next attempt's admission) replaced it. */
static char *event_reason(const char *id, const char *to)
{
    json_t *ev = NULL;
    cr_assert_eq(svc_job_events(svc, svc_caller_kilnd(), id, &ev, &err), 0);
    const char *reason = NULL;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(ev, "events"), i, e)
        if (!strcmp(json_string_value(json_object_get(e, "to_state")), to))
            reason = json_string_value(json_object_get(e, "reason"));
    cr_assert_not_null(reason, "no %s event", to);
    char *copy = strdup(reason);
    json_decref(ev);
    return copy;
}

/* Waits until the job's attempt is `attempt` and the workers got its assignments (heartbeats
 * from both), then reports them started. As in run_job, node 0's agent reports the rendezvous
 * port it picked as soon as it has its assignment: node 1's waits for that port. */
static void place_again(char w[2][64], const char *id, int attempt)
{
    bool got[2] = {false, false}, leader[2] = {false, false};
    for (int t = 0; t < 10000 && !(got[0] && got[1]); t += 50) {
        for (int k = 0; k < 2; k++) {
            if (got[k])
                continue;
            Kiln__HeartbeatResponse *r = hb(w[k], NULL, 0);
            got[k] = r->n_assignments == 1;
            if (got[k] && r->assignments[0]->node_rank == 0) {
                leader[k] = true;
                status_port(w[k], id, attempt, 29500);
            }
        }
        if (!(got[0] && got[1])) {
            struct timespec ts = {0, 50 * 1000000};
            nanosleep(&ts, NULL);
        }
    }
    cr_assert(got[0] && got[1], "attempt %d was not placed on both workers again", attempt);
    json_t *j = get(id);
    cr_assert_eq(json_integer_value(json_object_get(j, "attempt")), attempt);
    json_decref(j);
    for (int k = 0; k < 2; k++)
        if (!leader[k])
            status(w[k], id, attempt, true, NULL);
    json_decref(wait_state(id, "RUNNING", 2000));
}

/* A signal's own name is said once (kilnd's "killed by signal 9 (Killed)"); what else the agent
 * knows of the death (the memory limit, a script's failure file) reaches the job's reason. */
Test(life, a_rank_killed_by_the_memory_limit_says_so_in_the_reason)
{
    char w[2][64], id[40];
    run_job(2, 1, w, id);
    rank_killed(w[1], id, 1, 1, 9, "out of memory (limit 64 MiB)");
    json_t *j = get(id);
    const char *reason = json_string_value(json_object_get(j, "reason"));
    cr_assert(reason && strstr(reason, "signal 9") && strstr(reason, "out of memory (limit 64 MiB)"), "%s",
              reason ? reason : "(none)");
    json_decref(j);
}

Test(life, a_dead_rank_loses_the_attempt_and_the_next_resumes_on_the_same_workers)
{
    char w[2][64], id[40];
    run_job(2, 3, w, id);
    rank_killed(w[1], id, 1, 1, 9, "Killed");
    json_t *j = get(id);
    cr_assert(!strcmp(state_of(j), "RESTARTING") || !strcmp(state_of(j), "SCHEDULED"), "%s", state_of(j));
    json_decref(j);
    char *reason = event_reason(id, "RESTARTING");
    cr_assert(strstr(reason, "rank 1") && strstr(reason, w[1]) && strstr(reason, "signal 9"), "%s", reason);
    cr_assert(strstr(reason, "attempt 1 of 3 lost"), "%s", reason);
    free(reason);
    /* The other rank is told to stop; once it exits, both slots are free and attempt 2 goes onto
     * the same two workers (the only ones there are). */
    Kiln__HeartbeatResponse *r = hb(w[0], id, 1);
    cr_assert_eq(r->n_stops, 1);
    cr_assert_eq(r->stops[0]->attempt, 1);
    rank_exit(w[0], id, 1, 0, 1, "kiln-train: rank 1 (host h) disconnected");
    place_again(w, id, 2);
    char evs[256];
    events_str(id, evs, sizeof(evs));
    cr_assert(strstr(evs, "RUNNING RESTARTING SCHEDULED STARTING RUNNING"), "%s", evs);
    /* A late report from attempt 1 changes nothing; attempt 2 completes. */
    rank_exit(w[1], id, 1, 1, 1, "late");
    rank_exit(w[0], id, 2, 0, 0, NULL);
    rank_exit(w[1], id, 2, 1, 0, NULL);
    j = wait_state(id, "COMPLETED", 2000);
    cr_assert_eq(json_integer_value(json_object_get(j, "attempt")), 2);
    json_decref(j);
}

Test(life, a_rank_failing_in_the_last_attempt_fails_the_job_naming_it)
{
    char w[2][64], id[40];
    run_job(2, 2, w, id);
    rank_exit(w[0], id, 1, 0, 1, "kiln-train: rank 1 (host h) disconnected");
    json_decref(wait_state(id, "RESTARTING", 2000));
    rank_killed(w[1], id, 1, 1, 15, "Terminated");
    place_again(w, id, 2);
    const char *why = "kiln-train: no progress for 3 s in an all-reduce: waiting on rank 1 (host h)";
    rank_exit(w[0], id, 2, 0, 1, why);
    json_t *j = get(id);
    cr_assert_str_eq(state_of(j), "FAILED");
    const char *reason = json_string_value(json_object_get(j, "reason"));
    cr_assert(strstr(reason, "rank 0") && strstr(reason, w[0]) && strstr(reason, "code 1") && strstr(reason, why),
              "%s", reason);
    json_decref(j);
}

/* The agent's reason for a rank (up to a script's failure file: 1,024 characters, 2 to 4 bytes
 * each) in the reasons kilnd writes of it, which have less room: cut on a character, never inside
 * one, whatever the cut's parity (one job each), so the report is recorded and the job moves on
 * (an exit or start report whose reason came out cut inside an é was refused as not UTF-8, and
 * the job stayed RUNNING for good). A stop's reason of 200 characters of 4 bytes likewise (the
 * stop was refused, "invalid byte sequence"). */
Test(life, a_long_reason_is_cut_between_characters)
{
    char w[64], id[40], why[2100];
    reg(NULL, 1, "cpu", w);
    for (int k = 0; k < 4; k++) {
        bool pad = k % 2, started = k < 2; /* a rank exit, then a start report, of each parity */
        size_t o = (size_t)snprintf(why, sizeof why, "%s", pad ? "x" : "");
        for (int c = 0; c < 1024; c++)
            o += (size_t)snprintf(why + o, sizeof why - o, "\xc3\xa9"); /* é */
        submit(spec(1, 1, "cpu", 0, 1), NULL, id, NULL);
        json_decref(wait_state(id, "SCHEDULED", 5000));
        cr_assert_eq(hb(w, NULL, 0)->n_assignments, 1);
        if (started) {
            status(w, id, 1, true, NULL);
            rank_exit(w, id, 1, 0, 1, why);
        } else {
            status(w, id, 1, false, why);
        }
        json_t *j = get(id);
        cr_assert_str_eq(state_of(j), "FAILED", "case %d", k);
        const char *reason = json_string_value(json_object_get(j, "reason"));
        char said[64];
        snprintf(said, sizeof said, "%s: %s\xc3\xa9\xc3\xa9", started ? "exited with code 1" : "could not start its ranks",
                 pad ? "x" : "");
        cr_assert(reason && strstr(reason, said), "%s", reason);
        json_decref(j);
    }
    size_t o = 0;
    for (int c = 0; c < 200; c++)
        o += (size_t)snprintf(why + o, sizeof why - o, "\xf0\x9f\x98\x80"); /* U+1F600 */
    submit(spec(1, 1, "cpu", 0, 1), NULL, id, NULL);
    json_t *out = NULL;
    cr_assert_eq(svc_job_stop(svc, svc_caller_kilnd(), id, why, &out, &err), 0, "stop: %s", err.message);
    json_decref(out);
    char *reason = event_reason(id, "STOPPED");
    cr_assert(strstr(reason, "stop requested: \xf0\x9f\x98\x80"), "%s", reason);
    cr_assert_eq(kiln_utf8_check(reason, strlen(reason)), strlen(reason));
    free(reason);
}

Test(life, a_rank_exiting_with_code_2_fails_the_job_at_once)
{
    char w[2][64], id[40];
    run_job(2, 3, w, id);
    rank_exit(w[1], id, 1, 1, 2, "kiln-train: data.train: no such file");
    json_t *j = get(id);
    cr_assert_str_eq(state_of(j), "FAILED", "a bad spec or data is not retried");
    const char *reason = json_string_value(json_object_get(j, "reason"));
    cr_assert(strstr(reason, "rank 1") && strstr(reason, "code 2 (bad spec or data)") && strstr(reason, "no such file"),
              "%s", reason);
    cr_assert_eq(json_integer_value(json_object_get(j, "attempt")), 1);
    json_decref(j);
    char evs[256];
    events_str(id, evs, sizeof(evs));
    cr_assert_str_eq(evs, "QUEUED SCHEDULED STARTING RUNNING FAILED");
    cr_assert_eq(hb(w[0], id, 1)->n_stops, 1, "the other rank is stopped");
}

Test(life, an_assignment_the_agent_never_got_is_delivered_again)
{
    char w[64], id[40];
    reg(NULL, 1, "cpu", w);
    submit(spec(1, 1, "cpu", 0, 1), NULL, id, NULL);
    json_decref(wait_state(id, "SCHEDULED", 5000));
    /* kilnd delivers it again 1 s after it went out without word from the agent: a heartbeat
     * that ends within 1 s of the first one's start came before that, so it gets nothing */
    int64_t sent = kiln_mono_us();
    cr_assert_eq(hb(w, NULL, 0)->n_assignments, 1);  /* this reply is "lost" */
    size_t again = hb(w, NULL, 0)->n_assignments;
    if (kiln_mono_us() - sent < 1000000)
        cr_assert_eq(again, 0, "not again right away");
    else
        cr_log_warn("two heartbeats took over 1 s here: not checking that the second got nothing");
    struct timespec ts = {1, 200 * 1000000};
    nanosleep(&ts, NULL);
    Kiln__HeartbeatResponse *r = hb(w, NULL, 0);
    cr_assert_eq(r->n_assignments, 1, "delivered again: the agent never reported it running");
    cr_assert_str_eq(r->assignments[0]->job_id, id);
    /* Once the agent reports the ranks running it is not sent again. */
    nanosleep(&ts, NULL);
    cr_assert_eq(hb(w, id, 1)->n_assignments, 0);
    status(w, id, 1, true, NULL);
    json_decref(wait_state(id, "RUNNING", 1000));
    nanosleep(&ts, NULL);
    cr_assert_eq(hb(w, NULL, 0)->n_assignments, 0, "a started assignment is never re-sent");
}

Test(life, one_heartbeat_delivers_every_waiting_assignment_of_its_worker)
{
    char w[64], id[3][40];
    reg(NULL, 3, "cpu", w);
    for (int k = 0; k < 3; k++)
        submit(spec(1, 1, "cpu", 0, 1), NULL, id[k], NULL);
    for (int k = 0; k < 3; k++)
        json_decref(wait_state(id[k], "SCHEDULED", 5000));
    json_t *out = NULL;
    cr_assert_eq(svc_job_stop(svc, svc_caller_kilnd(), id[1], NULL, &out, &err), 0); /* its part is released */
    json_decref(out);
    Kiln__HeartbeatResponse *r = hb(w, NULL, 0);
    cr_assert_eq(r->n_assignments, 2, "the two waiting assignments, in one heartbeat");
    bool seen[3] = {false, false, false};
    for (size_t i = 0; i < r->n_assignments; i++)
        for (int k = 0; k < 3; k++)
            if (strcmp(r->assignments[i]->job_id, id[k]) == 0) {
                cr_assert_not(seen[k], "job %d delivered twice", k);
                seen[k] = true;
                cr_assert_eq(r->assignments[i]->attempt, 1);
                cr_assert_eq(r->assignments[i]->n_ranks, 1);
                cr_assert_not_null(strstr(r->assignments[i]->spec_json, "mlp"), "each with its own spec");
            }
    cr_assert(seen[0] && seen[2] && !seen[1]);
    for (int k = 0; k < 3; k += 2) {
        json_t *j = get(id[k]);
        cr_assert_str_eq(state_of(j), "STARTING");
        json_decref(j);
        char ev[256];
        events_str(id[k], ev, sizeof ev);
        cr_assert_not_null(strstr(ev, "SCHEDULED STARTING"), "job %d's events: %s", k, ev);
    }
    cr_assert_eq(hb(w, id[0], 1)->n_assignments, 0, "each is delivered once");
    /* both run to the end: started, then their one rank exits with code 0 */
    for (int k = 0; k < 3; k += 2) {
        status_port(w, id[k], 1, 29500 + k);
        json_decref(wait_state(id[k], "RUNNING", 5000));
        rank_exit(w, id[k], 1, 0, 0, NULL);
        rank_exit(w, id[k], 1, 0, 0, NULL); /* resent: its reply was lost */
        json_decref(wait_state(id[k], "COMPLETED", 5000));
    }
}

Test(life, ranks_that_cannot_start_fail_the_job)
{
    char w[64], id[40];
    reg(NULL, 1, "cpu", w);
    submit(spec(1, 1, "cpu", 0, 1), NULL, id, NULL);
    json_decref(wait_state(id, "SCHEDULED", 5000));
    cr_assert_eq(hb(w, NULL, 0)->n_assignments, 1);
    status(w, id, 1, false, "kiln-train: not found");
    json_t *j = get(id);
    cr_assert_str_eq(state_of(j), "FAILED");
    cr_assert(strstr(json_string_value(json_object_get(j, "reason")), "kiln-train: not found"));
    json_decref(j);
}

Test(life, ranks_that_a_faulty_host_cannot_start_lose_the_attempt_not_the_job)
{
    char w[64], id[40];
    reg(NULL, 1, "cpu", w);
    submit(spec(1, 1, "cpu", 0, 2), NULL, id, NULL);
    Kiln__RankStatus rq = KILN__RANK_STATUS__INIT;
    rq.worker_id = w;
    rq.job_id = id;
    rq.started = false;
    rq.host_fault = true;
    rq.reason = (char *)"could not build the sandbox: join the box's cgroup: No such device";
    for (int attempt = 1; attempt <= 2; attempt++) {
        char want[16];
        snprintf(want, sizeof want, "%d", attempt);
        json_t *j = wait_state(id, "SCHEDULED", 5000);
        cr_assert_eq(json_integer_value(json_object_get(j, "attempt")), attempt);
        json_decref(j);
        cr_assert_eq(hb(w, NULL, 0)->n_assignments, 1);
        rq.attempt = attempt;
        cr_assert_eq(svc_agent_rank_status(svc, w, &rq, &err), 0, "rank status: %s", err.message);
        j = get(id);
        if (attempt == 1)
            cr_assert(strcmp(state_of(j), "FAILED"), "a host's fault is retried: %s", state_of(j));
        else
            cr_assert_str_eq(state_of(j), "FAILED", "retry.max_attempts still bounds it");
        json_decref(j);
        /* the move's own reason, from its event: the scheduler may already have placed the next
         * attempt (a newer reason) by the time the job is read */
        char *reason = event_reason(id, attempt == 1 ? "RESTARTING" : "FAILED");
        cr_assert(strstr(reason, "a fault of that host") && strstr(reason, "No such device"), "%s", reason);
        free(reason);
    }
}

Test(life, stop_mid_run_goes_through_stopping)
{
    char w[2][64], id[40];
    run_job(2, 1, w, id);
    json_t *out = NULL;
    cr_assert_eq(svc_job_stop(svc, svc_caller_kilnd(), id, "user asked", &out, &err), 0, "%s", err.message);
    cr_assert_str_eq(state_of(out), "STOPPING");
    json_decref(out);
    cr_assert_eq(svc_job_stop(svc, svc_caller_kilnd(), id, NULL, &out, &err), 0, "asking twice is fine");
    json_decref(out);
    for (int k = 0; k < 2; k++) {
        Kiln__HeartbeatResponse *r = hb(w[k], id, 1);
        cr_assert_eq(r->n_stops, 1);
        cr_assert(strstr(r->stops[0]->reason, "user asked"));
    }
    rank_exit(w[0], id, 1, 0, 143, "stopped on SIGTERM");
    json_t *j = get(id);
    cr_assert_str_eq(state_of(j), "STOPPING");
    json_decref(j);
    rank_exit(w[1], id, 1, 1, 143, "stopped on SIGTERM");
    j = get(id);
    cr_assert_str_eq(state_of(j), "STOPPED");
    json_decref(j);
    char ev[256];
    events_str(id, ev, sizeof(ev));
    cr_assert_str_eq(ev, "QUEUED SCHEDULED STARTING RUNNING STOPPING STOPPED");
}

Test(life, a_restarted_kilnd_carries_on)
{
    char w[1][64], id[40];
    run_job(1, 1, w, id);
    push_logs(w[0], id, 1, 0, 0, 5);
    /* Restart the service on the same database: nothing is lost, the worker is still alive, the
     * log seq continues. */
    svc_destroy(svc);
    svc = NULL;
    svc_config_t cfg = {.database_url = url, .heartbeat_interval_ms = 100, .heartbeat_timeout_ms = 10000,
                        .sched_interval_ms = 50, .db_pool_size = 4, .stop_grace_ms = 500};
    cr_assert_eq(svc_create(&cfg, &svc, &err), 0, "%s", err.message);
    json_t *j = get(id);
    cr_assert_str_eq(state_of(j), "RUNNING");
    json_decref(j);
    Kiln__HeartbeatResponse *r = hb(w[0], id, 1);
    cr_assert_not(r->reregister);
    cr_assert_eq(r->n_stops, 0);
    push_logs(w[0], id, 1, 0, 5, 5);
    json_t *logs = NULL;
    svc_log_query_t q = {.rank = -1};
    cr_assert_eq(svc_job_logs(svc, svc_caller_kilnd(), id, &q, &logs, &err), 0);
    cr_assert_eq(json_array_size(json_object_get(logs, "lines")), 10);
    cr_assert_eq(json_integer_value(json_object_get(logs, "next_since_seq")), 10);
    json_decref(logs);
    rank_exit(w[0], id, 1, 0, 0, NULL);
    j = get(id);
    cr_assert_str_eq(state_of(j), "COMPLETED");
    json_decref(j);
}

Test(life, max_runtime_stops_the_job)
{
    char w[64], id[40];
    reg(NULL, 1, "cpu", w);
    json_t *sp = spec(1, 1, "cpu", 0, 1);
    json_object_set_new(sp, "stopping", json_pack("{s:i}", "max_runtime_s", 1));
    submit(sp, NULL, id, NULL);
    json_decref(wait_state(id, "SCHEDULED", 5000));
    cr_assert_eq(hb(w, NULL, 0)->n_assignments, 1);
    status(w, id, 1, true, NULL);
    json_t *j = wait_state(id, "STOPPING", 5000);
    cr_assert(strstr(json_string_value(json_object_get(j, "reason")), "max_runtime_s"));
    json_decref(j);
    cr_assert_eq(hb(w, id, 1)->n_stops, 1);
    rank_exit(w, id, 1, 0, 143, "stopped on SIGTERM");
    json_decref(wait_state(id, "STOPPED", 1000));
}

Test(life, stop_before_start_is_immediate)
{
    char w[64], a[40], b[40];
    submit(spec(1, 1, "cpu", 0, 1), NULL, a, NULL);
    json_t *out = NULL;
    cr_assert_eq(svc_job_stop(svc, svc_caller_kilnd(), a, NULL, &out, &err), 0);
    cr_assert_str_eq(state_of(out), "STOPPED");
    json_decref(out);
    /* SCHEDULED but not yet delivered: also at once, and the assignment is never delivered. */
    reg(NULL, 1, "cpu", w);
    submit(spec(1, 1, "cpu", 0, 1), NULL, b, NULL);
    json_decref(wait_state(b, "SCHEDULED", 5000));
    cr_assert_eq(svc_job_stop(svc, svc_caller_kilnd(), b, NULL, &out, &err), 0);
    cr_assert_str_eq(state_of(out), "STOPPED");
    json_decref(out);
    Kiln__HeartbeatResponse *r = hb(w, NULL, 0);
    cr_assert_eq(r->n_assignments, 0);
    cr_assert_eq(r->n_stops, 0);
}

Test(life, priority_then_fifo)
{
    char w[64], busy[40], low[40], high[40], low2[40];
    reg(NULL, 1, "cpu", w);
    submit(spec(1, 1, "cpu", 0, 1), NULL, busy, NULL);
    json_decref(wait_state(busy, "SCHEDULED", 5000));
    submit(spec(1, 1, "cpu", 0, 1), NULL, low, NULL);
    submit(spec(1, 1, "cpu", 5, 1), NULL, high, NULL);
    submit(spec(1, 1, "cpu", 0, 1), NULL, low2, NULL);
    /* Queued jobs say why they wait. */
    json_t *out = NULL;
    for (int t = 0; t < 5000; t += 50) {
        out = get(low);
        if (strstr(json_string_value(json_object_get(out, "reason")), "behind"))
            break;
        json_decref(out);
        out = NULL;
        struct timespec ts = {0, 50 * 1000000};
        nanosleep(&ts, NULL);
    }
    cr_assert_not_null(out, "the queued job never said why it waits");
    cr_assert(strstr(json_string_value(json_object_get(out, "reason")), high));
    json_decref(out);
    out = get(high);
    cr_assert(strstr(json_string_value(json_object_get(out, "reason")), "waiting for free slots"),
              "%s", json_string_value(json_object_get(out, "reason")));
    json_decref(out);
    char ev[128];
    events_str(low, ev, sizeof(ev));
    cr_assert_str_eq(ev, "QUEUED", "a reason update is not a state change");
    cr_assert_eq(svc_job_stop(svc, svc_caller_kilnd(), busy, NULL, &out, &err), 0);
    json_decref(out);
    json_decref(wait_state(high, "SCHEDULED", 5000));
    json_t *j = get(low);
    cr_assert_str_eq(state_of(j), "QUEUED");
    json_decref(j);
    cr_assert_eq(svc_job_stop(svc, svc_caller_kilnd(), high, NULL, &out, &err), 0);
    json_decref(out);
    json_decref(wait_state(low, "SCHEDULED", 5000));
    j = get(low2);
    cr_assert_str_eq(state_of(j), "QUEUED");
    json_decref(j);
}

/* Inserts a finished job of project that held `slots` slots from h0 to h1 hours ago: its
 * project's recent usage, as the fair share between projects reads it (SVC_FAIR_HALF_LIFE_S:
 * a half-life of 1 h). */
#define HALF_LIFE_S 3600.0
static void past_run(const char *project, int slots, double h0, double h1)
{
    char sql[1024];
    snprintf(sql, sizeof sql,
             "INSERT INTO jobs (id, name, project, spec, state, nodes, slots_per_node, slot_type, world_size,"
             " max_attempts, total_steps, started_at, ended_at) VALUES (gen_random_uuid(), 'past', '%s', '{}',"
             " 'COMPLETED', 1, %d, 'cpu', %d, 1, 10, now() - make_interval(secs => %f),"
             " now() - make_interval(secs => %f))",
             project, slots, slots, h0 * HALF_LIFE_S, h1 * HALF_LIFE_S);
    PGconn *pg = PQconnectdb(url);
    PGresult *r = PQexec(pg, sql);
    cr_assert_eq(PQresultStatus(r), PGRES_COMMAND_OK, "%s", PQerrorMessage(pg));
    PQclear(r);
    PQfinish(pg);
}

Test(life, the_default_queue_admits_the_project_with_the_least_recent_usage_first)
{
    json_t *out = NULL;
    cr_assert_eq(svc_project_create(svc, svc_caller_kilnd(), "a", NULL, &out, &err), 0, "%s", err.message);
    json_decref(out);
    cr_assert_eq(svc_project_create(svc, svc_caller_kilnd(), "b", NULL, &out, &err), 0, "%s", err.message);
    json_decref(out);
    /* a used 8 slot-hours, but 5 to 6 hours ago: decayed, 8 x (2^-5 - 2^-6) = 0.125; b used 1
     * slot-hour that ended just now: 1 x (1 - 2^-1) = 0.5. a has used less recently. */
    past_run("a", 8, 6, 5);
    past_run("b", 1, 1, 0);
    /* b's job first, a's after it, at one priority, then one slot for them */
    char jb[40], ja[40], w[64];
    json_t *sb = spec(1, 1, "cpu", 0, 1), *sa = spec(1, 1, "cpu", 0, 1);
    json_object_set_new(sb, "project", json_string("b"));
    json_object_set_new(sa, "project", json_string("a"));
    submit(sb, NULL, jb, NULL);
    submit(sa, NULL, ja, NULL);
    reg(NULL, 1, "cpu", w);
    /* the fair share goes by the decayed usage (not age, not slot-hours): a's job goes first */
    json_decref(wait_state(ja, "SCHEDULED", 5000));
    json_t *j = get(jb);
    cr_assert_str_eq(state_of(j), "QUEUED", "b's older job waits: %s", json_string_value(json_object_get(j, "reason")));
    json_decref(j);
    cr_assert_eq(svc_job_stop(svc, svc_caller_kilnd(), ja, NULL, &out, &err), 0, "%s", err.message);
    json_decref(out);
    json_decref(wait_state(jb, "SCHEDULED", 5000));
    cr_assert_eq(svc_job_stop(svc, svc_caller_kilnd(), jb, NULL, &out, &err), 0, "%s", err.message);
    json_decref(out);
    /* the same runs the other way round (a used 1 x (1 - 2^-1) = 0.5 just now, b 8 x (2^-5 -
     * 2^-6) = 0.125 long ago): now b goes first, though a's job is the older */
    PGconn *pg = PQconnectdb(url);
    PGresult *r = PQexec(pg, "UPDATE jobs SET project = CASE project WHEN 'a' THEN 'b' ELSE 'a' END WHERE name = 'past'");
    cr_assert_eq(PQresultStatus(r), PGRES_COMMAND_OK, "%s", PQerrorMessage(pg));
    PQclear(r);
    PQfinish(pg);
    char busy[40];
    submit(spec(1, 1, "cpu", 0, 1), NULL, busy, NULL); /* holds the slot while both are submitted */
    json_decref(wait_state(busy, "SCHEDULED", 5000));
    sa = spec(1, 1, "cpu", 0, 1);
    sb = spec(1, 1, "cpu", 0, 1);
    json_object_set_new(sa, "project", json_string("a"));
    json_object_set_new(sb, "project", json_string("b"));
    submit(sa, NULL, ja, NULL);
    submit(sb, NULL, jb, NULL);
    cr_assert_eq(svc_job_stop(svc, svc_caller_kilnd(), busy, NULL, &out, &err), 0, "%s", err.message);
    json_decref(out);
    json_decref(wait_state(jb, "SCHEDULED", 5000));
    j = get(ja);
    cr_assert_str_eq(state_of(j), "QUEUED", "%s", json_string_value(json_object_get(j, "reason")));
    json_decref(j);
}
#undef HALF_LIFE_S

Test(life, reregistration_and_unknown_workers)
{
    char w[64], again[64];
    reg("w-fixed", 2, "cpu", w);
    cr_assert_str_eq(w, "w-fixed");
    reg("w-fixed", 3, "cpu", again);
    cr_assert_str_eq(again, "w-fixed");
    Kiln__HeartbeatResponse *r = hb("w-never-registered", NULL, 0);
    cr_assert(r->reregister);
    r = hb("w-fixed", NULL, 0);
    cr_assert_not(r->reregister);
    /* Ranks of a job the worker has no assignment for are told to stop. */
    int64_t told = kiln_mono_us();
    r = hb("w-fixed", "11111111-2222-3333-4444-555555555555", 1);
    cr_assert_eq(r->n_stops, 1);
    r = hb("w-fixed", "11111111-2222-3333-4444-555555555555", 1);
    /* repeated after the grace: a heartbeat within it (both heartbeats inside 500 ms) gets none */
    if (kiln_mono_us() - told < 500000)
        cr_assert_eq(r->n_stops, 0, "not repeated on every heartbeat");
    else
        cr_log_warn("two heartbeats took over 500 ms here: not checking that the second got no stop order");
    struct timespec grace = {0, 600 * 1000000};  /* stop_grace_ms is 500 here */
    nanosleep(&grace, NULL);
    r = hb("w-fixed", "11111111-2222-3333-4444-555555555555", 1);
    cr_assert_eq(r->n_stops, 1, "repeated once the grace period has passed");
    json_t *ws = NULL;
    cr_assert_eq(svc_workers_list(svc, svc_caller_kilnd(), &ws, &err), 0);
    cr_assert_eq(json_array_size(json_object_get(ws, "workers")), 1);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(json_object_get(ws, "workers"), 0), "slots")), 3);
    json_decref(ws);
    Kiln__RegisterRequest rq = KILN__REGISTER_REQUEST__INIT;
    Kiln__RegisterResponse rs = KILN__REGISTER_RESPONSE__INIT;
    rq.slots = 1;
    rq.slot_type = "tpu";
    cr_assert_eq(svc_agent_register(svc, &rq, NULL, &arena, &rs, &err), KILN_EINVAL);
}

Test(life, two_services_on_one_database_never_double_book)
{
    /* A second kilnd on the same database: both schedulers run, neither may give a slot that
     * the other just gave away. */
    svc_t *other = NULL;
    svc_config_t cfg = {.database_url = url, .heartbeat_interval_ms = 100, .heartbeat_timeout_ms = 10000,
                        .sched_interval_ms = 5, .db_pool_size = 4, .stop_grace_ms = 500};
    cr_assert_eq(svc_create(&cfg, &other, &err), 0, "%s", err.message);
    char w[4][64];
    for (int k = 0; k < 4; k++)
        reg(NULL, 1, "cpu", w[k]);
    char ids[24][40];
    for (int i = 0; i < 24; i++) {
        json_t *job = NULL, *sp = spec(1, 1, "cpu", 0, 1);
        bool created;
        cr_assert_eq(svc_job_create(i % 2 ? other : svc, svc_caller_kilnd(), sp, NULL, &job, &created, &err), 0, "%s", err.message);
        kiln_strlcpy(ids[i], json_string_value(json_object_get(job, "id")), 40);
        json_decref(job);
        json_decref(sp);
    }
    /* until the four slots are given, then ten more passes of whichever scheduler leads: a slot
     * given twice would show as a fifth job placed or a worker with slots_free below 0 */
    int placed = 0;
    for (int64_t end = kiln_mono_us() + WAIT_MIN_MS * 1000LL; placed < 4 && kiln_mono_us() < end;) {
        placed = 0;
        for (int i = 0; i < 24; i++) {
            json_t *j = get(ids[i]);
            placed += strcmp(state_of(j), "SCHEDULED") == 0;
            json_decref(j);
        }
        if (placed < 4) {
            struct timespec ts = {0, 20 * 1000000};
            nanosleep(&ts, NULL);
        }
    }
    svc_sched_pass_t rec[2][16];
    svc_sched_record(svc, rec[0], 16);
    svc_sched_record(other, rec[1], 16);
    for (int64_t end = kiln_mono_us() + WAIT_MIN_MS * 1000LL;
         svc_sched_recorded(svc) + svc_sched_recorded(other) < 10 && kiln_mono_us() < end;) {
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
    }
    int passes = svc_sched_recorded(svc) + svc_sched_recorded(other);
    svc_sched_record(svc, NULL, 0);
    svc_sched_record(other, NULL, 0);
    cr_assert_geq(passes, 10, "the schedulers made %d passes after the slots were given", passes);
    json_t *ws = NULL;
    cr_assert_eq(svc_workers_list(other, svc_caller_kilnd(), &ws, &err), 0);
    json_t *arr = json_object_get(ws, "workers");
    for (size_t i = 0; i < json_array_size(arr); i++)
        cr_assert_geq(json_integer_value(json_object_get(json_array_get(arr, i), "slots_free")), 0,
                      "a worker's slot was given twice");
    json_decref(ws);
    placed = 0;
    for (int i = 0; i < 24; i++) {
        json_t *j = get(ids[i]);
        placed += strcmp(state_of(j), "SCHEDULED") == 0;
        json_decref(j);
    }
    cr_assert_eq(placed, 4, "exactly one job per slot");
    svc_destroy(other);
}


/* ---- data roots: where a job may read, and where it runs ------------------------------------ */

/* Registers worker "w-<host>" (ids order the workers, so w-ha comes first) with data roots. */
static void reg_roots(const char *host, const char *const *roots, size_t n, char *id_out)
{
    Kiln__RegisterRequest rq = KILN__REGISTER_REQUEST__INIT;
    Kiln__RegisterResponse rs = KILN__REGISTER_RESPONSE__INIT;
    char id[64];
    snprintf(id, sizeof id, "w-%s", host);
    rq.worker_id = id;
    rq.hostname = (char *)host;
    rq.address = "127.0.0.1";
    rq.slots = 1;
    rq.slot_type = "cpu";
    rq.data_roots = (char **)roots;
    rq.n_data_roots = n;
    cr_assert_eq(svc_agent_register(svc, &rq, NULL, &arena, &rs, &err), 0, "register: %s", err.message);
    kiln_strlcpy(id_out, rs.worker_id, 64);
}

static json_t *gpt_spec(const char *train, const char *ckpt)
{
    json_t *s = json_pack("{s:s, s:{s:s, s:i, s:i, s:i, s:i}, s:{s:s}, s:{s:i, s:I}}", "name", "roots",
                          "model", "type", "gpt", "n_layer", 1, "n_head", 2, "n_embd", 16, "seq_len", 8,
                          "data", "train", train, "hyperparameters", "global_batch_size", 2, "max_steps",
                          (json_int_t)5);
    if (ckpt)
        json_object_set_new(s, "checkpoint", json_pack("{s:s}", "path", ckpt));
    return s;
}

TestSuite(roots, .init = setup, .fini = teardown, .timeout = 60);

Test(roots, a_path_no_agent_holds_is_refused_at_submission)
{
    char a[64], b[64];
    const char *ra[] = {"/data/a"}, *rb[] = {"/data/b", "/mnt/ckpt"};
    reg_roots("ha", ra, 1, a);
    reg_roots("hb", rb, 2, b);
    const struct { const char *train, *ckpt, *field; } bad[] = {
        {"/etc/shadow", NULL, "data.train"},
        {"/data/ab/x.txt", NULL, "data.train"},     /* a prefix of a root's name is not inside it */
        {"relative/x.txt", NULL, "data.train"},
        {"/data/a/x.txt", "/var/tmp", "checkpoint.path"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *job = NULL, *sp = gpt_spec(bad[i].train, bad[i].ckpt);
        bool created = false;
        kiln_err_clear(&err);
        cr_assert_eq(svc_job_create(svc, svc_caller_kilnd(), sp, NULL, &job, &created, &err), KILN_EINVAL,
                     "%s", bad[i].train);
        cr_assert_str_eq(err.field, bad[i].field, "%s: %s", bad[i].train, err.message);
        if (bad[i].train[0] == '/' && !bad[i].ckpt)
            cr_assert(strstr(err.detail, "/data/a") && strstr(err.detail, "/data/b"),
                      "the error names the allowed roots: %s", err.detail);
        json_decref(sp);
    }
}

Test(roots, a_job_runs_only_where_its_files_are)
{
    char a[64], b[64], id[40];
    const char *ra[] = {"/data/a"}, *rb[] = {"/data/b"};
    reg_roots("ha", ra, 1, a);
    reg_roots("hb", rb, 1, b);
    submit(gpt_spec("/data/b/corpus.txt", NULL), NULL, id, NULL);
    json_t *j = wait_state(id, "SCHEDULED", 5000);
    json_t *ws = json_object_get(j, "workers");
    cr_assert_eq(json_array_size(ws), 1);
    /* w-ha comes first and fits as well: only its data roots keep the job off it */
    cr_assert_str_eq(json_string_value(json_array_get(ws, 0)), b, "placed on the worker that holds /data/b");
    json_decref(j);
    /* the assignment carries the typed paths the agent checks */
    Kiln__HeartbeatResponse *r = hb(b, NULL, 0);
    cr_assert_eq(r->n_assignments, 1);
    const Kiln__Assignment *as = r->assignments[0];
    cr_assert_eq(as->n_read_paths, 1);
    cr_assert_str_eq(as->read_paths[0]->field, "data.train");
    cr_assert_str_eq(as->read_paths[0]->path, "/data/b/corpus.txt");
    cr_assert_str_eq(as->checkpoint_dir, "");
}

/* Project areas (KILN_AREA_DIR): a job may not read another project's, whether the file exists
 * or not (kilnd sees only the text), and checkpoint.path may not lie in one. */
Test(roots, another_projects_area_is_refused_at_submission)
{
    char a[64];
    const char *ra[] = {"/data/a"};
    reg_roots("ha", ra, 1, a);
    const struct { const char *field, *path; } bad[] = {
        {"data.train", "/data/a/ck/" KILN_AREA_DIR "/proj-a/0b6c2f0e-1d3a-4c55-9d7e-2f1e9a7b5c11/ckpt_00000010.bin"},
        {"data.val", "/data/a/ck/" KILN_AREA_DIR "/proj-a/x/../y.txt"},
        {"model.init_from", "/data/a/" KILN_AREA_DIR "/proj-a/model.bin"},
        {"data.train", "/data/a/" KILN_AREA_DIR},
        {"data.train", "/data/a/" KILN_AREA_DIR "/default-x/y.txt"}, /* a prefix of the project's name */
    };
    char first[512] = "";
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
        json_t *sp = gpt_spec(!strcmp(bad[i].field, "data.train") ? bad[i].path : "/data/a/corpus.txt", NULL);
        if (!strcmp(bad[i].field, "data.val"))
            json_object_set_new(json_object_get(sp, "data"), "val", json_string(bad[i].path));
        if (!strcmp(bad[i].field, "model.init_from"))
            json_object_set_new(json_object_get(sp, "model"), "init_from", json_string(bad[i].path));
        json_t *job = NULL;
        bool created = false;
        kiln_err_clear(&err);
        cr_assert_eq(svc_job_create(svc, svc_caller_kilnd(), sp, NULL, &job, &created, &err), KILN_EPERM, "%s",
                     bad[i].path);
        cr_assert_str_eq(err.field, bad[i].field, "%s: %s", bad[i].path, err.message);
        cr_assert(strstr(err.message, "another project") && strstr(err.message, "\"default\""), "%s", err.message);
        cr_assert_null(strstr(err.message, "exist"), "%s", err.message);
        if (i == 0)
            snprintf(first, sizeof first, "%s", err.detail);
        cr_assert_str_eq(err.detail, first);
        json_decref(sp);
    }
    /* a script job's channels, source directory and python, the same way */
    static const char area[] = "/data/a/ck/" KILN_AREA_DIR "/proj-a/0b6c2f0e-1d3a-4c55-9d7e-2f1e9a7b5c11";
    const char *fields[] = {"data.channels.train", "source", "python"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(fields); i++) {
        json_t *sp = json_pack("{s:s, s:s, s:{s:{s:s}}}", "entry_point", "train.py", "source",
                               i == 1 ? area : "/data/a/code", "data", "channels", "train",
                               i == 0 ? area : "/data/a/corpus");
        if (i == 2)
            json_object_set_new(sp, "python", json_string(area));
        json_t *job = NULL;
        bool created = false;
        kiln_err_clear(&err);
        cr_assert_eq(svc_job_create(svc, svc_caller_kilnd(), sp, NULL, &job, &created, &err), KILN_EPERM, "%s: %s",
                     fields[i], err.message);
        cr_assert_str_eq(err.field, fields[i], "%s", err.message);
        cr_assert(strstr(err.message, "another project"), "%s", err.message);
        json_decref(sp);
    }
    /* checkpoint.path inside any area: kiln adds .kiln/<project>/<job id> itself */
    json_t *job = NULL, *sp = gpt_spec("/data/a/corpus.txt", "/data/a/ck/" KILN_AREA_DIR "/default");
    bool created = false;
    cr_assert_eq(svc_job_create(svc, svc_caller_kilnd(), sp, NULL, &job, &created, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "checkpoint.path", "%s", err.message);
    json_decref(sp);
    /* the project's own area, and the rest of the root, are readable */
    char id[40];
    submit(gpt_spec("/data/a/ck/" KILN_AREA_DIR "/default/notes.txt", NULL), NULL, id, NULL);
    submit(gpt_spec("/data/a/kiln/x.txt", "/data/a/ck"), NULL, id, NULL);
}

/* The assignment names the job's project and its checkpoint directory in the project's area; a
 * job marked ckpt_flat_dir (one that had not ended when migration 0014 ran) keeps
 * <checkpoint.path>/<job id>. */
Test(roots, checkpoints_go_to_the_projects_area_and_a_flat_job_keeps_its_directory)
{
    char a[64], id[40], flat[40];
    const char *ra[] = {"/data/a"};
    reg_roots("ha", ra, 1, a);
    submit(gpt_spec("/data/a/corpus.txt", "/data/a/ck"), NULL, id, NULL);
    json_decref(wait_state(id, "SCHEDULED", 5000));
    Kiln__HeartbeatResponse *r = hb(a, NULL, 0);
    cr_assert_eq(r->n_assignments, 1);
    char want[200];
    snprintf(want, sizeof want, "/data/a/ck/" KILN_AREA_DIR "/default/%s", id);
    cr_assert_str_eq(r->assignments[0]->checkpoint_dir, want);
    cr_assert_str_eq(r->assignments[0]->project, "default");

    char b[64];
    reg_roots("hb", ra, 1, b); /* a free worker for the second job */
    submit(gpt_spec("/data/a/corpus.txt", "/data/a/ck"), NULL, flat, NULL);
    json_decref(wait_state(flat, "SCHEDULED", 5000));
    PGconn *pg = PQconnectdb(url);
    const char *p[1] = {flat};
    PGresult *res = PQexecParams(pg, "UPDATE jobs SET ckpt_flat_dir = true WHERE id = $1::uuid", 1, NULL, p, NULL,
                                 NULL, 0);
    cr_assert_eq(PQresultStatus(res), PGRES_COMMAND_OK, "%s", PQerrorMessage(pg));
    PQclear(res);
    PQfinish(pg);
    r = hb(b, NULL, 0);
    cr_assert_eq(r->n_assignments, 1);
    snprintf(want, sizeof want, "/data/a/ck/%s", flat);
    cr_assert_str_eq(r->assignments[0]->checkpoint_dir, want);
}

/* Heartbeats w until it gets an assignment of job (at most 5 s) and reports it started. */
static void start_on(const char *w, const char *job, int attempt)
{
    for (int t = 0; t < 5000; t += 50) {
        Kiln__HeartbeatResponse *r = hb(w, NULL, 0);
        if (r->n_assignments == 1) {
            cr_assert_str_eq(r->assignments[0]->job_id, job);
            cr_assert_eq(r->assignments[0]->attempt, attempt);
            status_port(w, job, attempt, 29500);
            json_decref(wait_state(job, "RUNNING", 2000));
            return;
        }
        struct timespec ts = {0, 50 * 1000000};
        nanosleep(&ts, NULL);
    }
    cr_assert_fail("job %s attempt %d was never assigned to %s", job, attempt, w);
}

/* The value of the series line (its name and labels exactly) in this process's exposition, or -1
 * when there is no such line. */
static double prom_value(const char *line)
{
    prom_buf_t b = {0};
    prom_write(&b, "kilnd");
    cr_assert(!b.oom);
    double v = -1;
    size_t n = strlen(line);
    for (const char *p = b.data; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, line, n) && p[n] == ' ')
            v = strtod(p + n + 1, NULL);
    free(b.data);
    return v;
}

Test(life, a_higher_priority_job_preempts_and_the_victim_resumes_without_using_an_attempt)
{
    static const char preemptions[] = "kiln_queue_preemptions_total{queue=\"default\",reason=\"priority\"}";
    char w[64], low[40], high[40];
    reg(NULL, 1, "cpu", w);
    submit(spec(1, 1, "cpu", 0, 2), NULL, low, NULL);
    json_decref(wait_state(low, "SCHEDULED", 5000));
    start_on(w, low, 1);
    /* a pass has seen the queue: its preemption series is there, at 0 */
    cr_assert_eq(prom_value(preemptions), 0, "%s before any preemption: %g", preemptions, prom_value(preemptions));
    submit(spec(1, 1, "cpu", 5, 1), NULL, high, NULL);
    /* the scheduler preempts low: its rank gets the stop order naming high */
    json_t *j = wait_state(low, "STOPPING", 5000);
    cr_assert(strstr(json_string_value(json_object_get(j, "reason")), high), "%s",
              json_string_value(json_object_get(j, "reason")));
    json_decref(j);
    Kiln__HeartbeatResponse *r = hb(w, low, 1);
    cr_assert_eq(r->n_stops, 1);
    cr_assert(strstr(r->stops[0]->reason, "preempted by job"), "%s", r->stops[0]->reason);
    /* high waits for the slot being freed, and says so */
    json_decref(wait_reason(high, "QUEUED", (const char *const[]){"freeing", "preempted"}, 2, 5000));
    rank_exit(w, low, 1, 0, 143, "stopped on SIGTERM");
    j = wait_state(low, "PREEMPTED", 2000);
    cr_assert(strstr(json_string_value(json_object_get(j, "reason")), high));
    json_decref(j);
    /* one preemption for priority in queue default, counted once (not per pass while it stops) */
    cr_assert_eq(prom_value(preemptions), 1, "%s: %g", preemptions, prom_value(preemptions));
    cr_assert_eq(prom_value("kiln_queue_preemptions_total{queue=\"default\",reason=\"reclaim\"}"), 0);
    /* high got one event for it too, naming its victim, where and the rule (once: not per pass
     * while low stopped), leaving it QUEUED; a pass may have scheduled it since low ended */
    char ev[512], want[400];
    events_str(high, ev, sizeof(ev));
    cr_assert(!strcmp(ev, "QUEUED QUEUED") || !strcmp(ev, "QUEUED QUEUED SCHEDULED"), "%s", ev);
    snprintf(want, sizeof want, "preempting job %s for 1 cpu slot(s) on worker %s: lower priority in queue default, "
             "allowed by queue default's preemption.within_queue (lower_priority); it starts once they have stopped",
             low, w);
    char *why = event_reason(high, "QUEUED");
    cr_assert_str_eq(why, want);
    free(why);
    /* the victim's reason names high once */
    why = event_reason(low, "STOPPING");
    cr_assert(strstr(why, high) && !strstr(strstr(why, high) + 1, high), "%s", why);
    free(why);
    /* high runs and completes; low resumes as attempt 2 */
    json_decref(wait_state(high, "SCHEDULED", 5000));
    start_on(w, high, 1);
    rank_exit(w, high, 1, 0, 0, NULL);
    json_decref(wait_state(high, "COMPLETED", 2000));
    json_decref(wait_state(low, "SCHEDULED", 5000));
    start_on(w, low, 2);
    why = event_reason(low, "SCHEDULED");
    cr_assert(strstr(why, "; resumes from its checkpoint after preemption"), "%s", why);
    free(why);
    why = event_reason(high, "SCHEDULED");
    cr_assert_null(strstr(why, "resumes from its checkpoint"), "%s", why);
    free(why);
    events_str(low, ev, sizeof(ev));
    cr_assert_str_eq(ev, "QUEUED SCHEDULED STARTING RUNNING STOPPING PREEMPTED SCHEDULED STARTING RUNNING");
    events_str(high, ev, sizeof(ev));
    cr_assert_str_eq(ev, "QUEUED QUEUED SCHEDULED STARTING RUNNING COMPLETED");
    /* retry.max_attempts 2: the preemption used none, so losing attempt 2 still restarts it */
    rank_killed(w, low, 2, 0, 9, "Killed");
    j = get(low);
    cr_assert(!strcmp(state_of(j), "RESTARTING") || !strcmp(state_of(j), "SCHEDULED"), "%s: %s", state_of(j),
              json_string_value(json_object_get(j, "reason")));
    json_decref(j);
    /* a stop while it waits: STOPPED */
    json_t *out = NULL;
    cr_assert_eq(svc_job_stop(svc, svc_caller_kilnd(), low, NULL, &out, &err), 0, "%s", err.message);
    json_decref(out);
}

/* A job of queue name, priority 0, one cpu slot: submitted, and started on worker w. */
static void run_in_queue(const char *queue, const char *w, char *id)
{
    json_t *sp = spec(1, 1, "cpu", 0, 2);
    json_object_set_new(sp, "queue", json_string(queue));
    submit(sp, NULL, id, NULL);
    json_decref(wait_state(id, "SCHEDULED", 5000));
    start_on(w, id, 1);
}

/* The real scheduler hands admission each running job's preemptions and the configured k
 * (--preempt-protect-after, 1 here): queue b's two jobs borrow a's quota; a's first job reclaims
 * the newer (b2); when b2 runs again, a's second job reclaims b1, although b2 is again the
 * newer, because b2 was preempted k times by a job of its priority. */
Test(life, a_job_preempted_k_times_is_protected_from_a_reclaim_at_its_priority, .init = setup_protect_after_1)
{
    for (const char *const *q = (const char *const[]){"a", "b", NULL}; *q; q++) {
        char body[160];
        snprintf(body, sizeof body, "{\"name\": \"%s\", \"cohort\": \"c\", \"quota\": {\"cpu\": 1}}", *q);
        json_t *in = json_loads(body, 0, NULL), *out = NULL;
        cr_assert_eq(svc_queue_create(svc, svc_caller_kilnd(), in, &out, &err), 0, "%s", err.message);
        json_decref(in);
        json_decref(out);
    }
    char w1[64], w2[64], b1[40], b2[40], a1[40], a2[40];
    reg(NULL, 1, "cpu", w1);
    run_in_queue("b", w1, b1);
    reg(NULL, 1, "cpu", w2);
    run_in_queue("b", w2, b2);
    /* a1 reclaims the newer borrower */
    json_t *sp = spec(1, 1, "cpu", 0, 1);
    json_object_set_new(sp, "queue", json_string("a"));
    submit(sp, NULL, a1, NULL);
    json_decref(wait_state(b2, "STOPPING", 5000));
    rank_exit(w2, b2, 1, 0, 143, "stopped on SIGTERM");
    json_decref(wait_state(b2, "PREEMPTED", 2000));
    json_decref(wait_state(a1, "SCHEDULED", 5000));
    start_on(w2, a1, 1);
    rank_exit(w2, a1, 1, 0, 0, NULL);
    json_decref(wait_state(a1, "COMPLETED", 2000));
    /* b2 borrows again, and is the newer once more */
    json_decref(wait_state(b2, "SCHEDULED", 5000));
    start_on(w2, b2, 2);
    sp = spec(1, 1, "cpu", 0, 1);
    json_object_set_new(sp, "queue", json_string("a"));
    submit(sp, NULL, a2, NULL);
    json_t *j = wait_state(b1, "STOPPING", 5000);
    cr_assert(strstr(json_string_value(json_object_get(j, "reason")), a2), "%s",
              json_string_value(json_object_get(j, "reason")));
    json_decref(j);
    j = get(b2);
    cr_assert_str_eq(state_of(j), "RUNNING", "b2, preempted once (k = 1), is protected: %s",
                     json_string_value(json_object_get(j, "reason")));
    json_decref(j);
}

/* A job of queue name, one node of `slots` cpu slots, priority 0: submitted, and started on
 * worker w (its placement there is asserted). */
static void run_sized_in_queue(const char *queue, int slots, const char *w, char *id)
{
    json_t *sp = spec(1, slots, "cpu", 0, 2);
    json_object_set_new(sp, "queue", json_string(queue));
    submit(sp, NULL, id, NULL);
    json_decref(wait_state(id, "SCHEDULED", 5000));
    start_on(w, id, 1);
}

/* Waits until the scheduler has run n whole passes from now (the decisions of each are written). */
static void wait_passes(int n)
{
    svc_sched_pass_t rec[64];
    cr_assert(n > 0 && n <= 64);
    svc_sched_record(svc, rec, n);
    int64_t until = kiln_mono_us() + WAIT_MIN_MS * 1000LL;
    while (svc_sched_recorded(svc) < n && kiln_mono_us() < until) {
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
    }
    int got = svc_sched_recorded(svc);
    svc_sched_record(svc, NULL, 0);
    cr_assert_geq(got, n, "%d scheduler pass(es) in %d s, wanted %d", got, WAIT_MIN_MS / 1000, n);
}

/* The real scheduler hands admission the job that preempted a waiting job last: a job never
 * preempts back the job that preempted it. Queues a and b (cohort c) have a quota of 2 cpu slots
 * each; a's 2-slot job a2 borrows the slots of the 2-slot worker until b's b1 reclaims them. Then
 * b borrows in turn (b2, on a new 1-slot worker), and a's other job a1 ends: a2 is within a's
 * quota, and b1 is the only borrower whose slots it could use; it waits for them and does not
 * preempt b1 back. */
Test(life, a_job_never_preempts_back_the_job_that_preempted_it)
{
    for (const char *const *q = (const char *const[]){"a", "b", NULL}; *q; q++) {
        char body[160];
        snprintf(body, sizeof body, "{\"name\": \"%s\", \"cohort\": \"c\", \"quota\": {\"cpu\": 2}}", *q);
        json_t *in = json_loads(body, 0, NULL), *out = NULL;
        cr_assert_eq(svc_queue_create(svc, svc_caller_kilnd(), in, &out, &err), 0, "%s", err.message);
        json_decref(in);
        json_decref(out);
    }
    char small[64], big[64], spare[64], a1[40], a2[40], b1[40], b2[40];
    reg(NULL, 1, "cpu", small);
    reg(NULL, 2, "cpu", big);
    run_sized_in_queue("a", 1, small, a1); /* best fit: the 1-slot worker */
    run_sized_in_queue("a", 2, big, a2);   /* a now borrows one of b's slots */
    /* b1 reclaims: a2 is the only borrower whose slots it can use */
    json_t *sp = spec(1, 2, "cpu", 0, 1);
    json_object_set_new(sp, "queue", json_string("b"));
    submit(sp, NULL, b1, NULL);
    json_t *j = wait_state(a2, "STOPPING", 5000);
    cr_assert(strstr(json_string_value(json_object_get(j, "reason")), b1), "%s",
              json_string_value(json_object_get(j, "reason")));
    json_decref(j);
    rank_exit(big, a2, 1, 0, 143, "stopped on SIGTERM");
    rank_exit(big, a2, 1, 1, 143, "stopped on SIGTERM");
    json_decref(wait_state(a2, "PREEMPTED", 2000));
    json_decref(wait_state(b1, "SCHEDULED", 5000));
    start_on(big, b1, 1);
    /* b borrows a new worker's slot (a2, beyond a's quota while a1 runs, does not keep it from
     * borrowing): b1 is now a borrower's job */
    reg(NULL, 1, "cpu", spare);
    run_sized_in_queue("b", 1, spare, b2);
    /* a1 ends: a2 is within a's quota, and does not fit the free worker */
    rank_exit(small, a1, 1, 0, 0, NULL);
    json_decref(wait_state(a1, "COMPLETED", 2000));
    wait_passes(3);
    j = get(b1);
    cr_assert_str_eq(state_of(j), "RUNNING", "b1 was preempted back by the job it preempted: %s",
                     json_string_value(json_object_get(j, "reason")));
    json_decref(j);
    /* a2 waits PREEMPTED, its reason still naming b1 (the passes write its pending reason, not that) */
    j = get(a2);
    cr_assert_str_eq(state_of(j), "PREEMPTED", "%s", json_string_value(json_object_get(j, "reason")));
    cr_assert(strstr(json_string_value(json_object_get(j, "reason")), b1), "%s",
              json_string_value(json_object_get(j, "reason")));
    json_decref(j);
    j = get(b2);
    cr_assert_str_eq(state_of(j), "RUNNING");
    json_decref(j);
}

/* The real scheduler hands admission whether a running job was backfilled: one that runs past its
 * predicted end is preempted for the head it was backfilled ahead of, although the queue's
 * policy preempts no job of the head's priority. Here nothing of the model has run, so the
 * backfilled job's prediction is --sched-default-runtime-s (1 s; 4 s with the start allowance). */
Test(life, a_backfilled_job_that_overruns_is_preempted_for_its_head, .init = setup_default_runtime_1)
{
    char w[64], first[40], head[40], small[40];
    reg(NULL, 2, "cpu", w);
    json_t *sp = spec(1, 1, "cpu", 0, 1); /* predicted to end in 10 min: its max_runtime_s */
    json_object_set_new(sp, "stopping", json_pack("{s:i}", "max_runtime_s", 600));
    submit(sp, NULL, first, NULL);
    json_decref(wait_state(first, "SCHEDULED", 5000));
    start_on(w, first, 1);
    submit(spec(1, 2, "cpu", 0, 1), NULL, head, NULL);
    submit(spec(1, 1, "cpu", 0, 1), NULL, small, NULL);
    json_t *j = wait_state(small, "SCHEDULED", 5000);
    cr_assert(strstr(json_string_value(json_object_get(j, "reason")), "backfilled ahead of"), "%s",
              json_string_value(json_object_get(j, "reason")));
    cr_assert(strstr(json_string_value(json_object_get(j, "reason")), "before that job can start"), "%s",
              json_string_value(json_object_get(j, "reason")));
    json_decref(j);
    start_on(w, small, 1);
    /* the first job ends early: the head could start but for the backfilled job, which overruns */
    rank_exit(w, first, 1, 0, 0, NULL);
    json_decref(wait_state(first, "COMPLETED", 2000));
    j = wait_state(small, "STOPPING", 15000);
    cr_assert(strstr(json_string_value(json_object_get(j, "reason")), "ran past its predicted end"), "%s",
              json_string_value(json_object_get(j, "reason")));
    cr_assert(strstr(json_string_value(json_object_get(j, "reason")), head), "%s",
              json_string_value(json_object_get(j, "reason")));
    json_decref(j);
    rank_exit(w, small, 1, 0, 143, "stopped on SIGTERM");
    json_decref(wait_state(head, "SCHEDULED", 5000));
}

/* The real scheduler hands admission each running job's priority: a waiting job preempts only a
 * job of lower priority than its own (here priority 3 waits behind a running 5, and 7 preempts it). */
Test(life, a_job_preempts_only_a_running_job_of_lower_priority)
{
    char w[64], top[40], mid[40], over[40];
    reg(NULL, 1, "cpu", w);
    submit(spec(1, 1, "cpu", 5, 1), NULL, top, NULL);
    json_decref(wait_state(top, "SCHEDULED", 5000));
    start_on(w, top, 1);
    submit(spec(1, 1, "cpu", 3, 1), NULL, mid, NULL);
    wait_passes(3);
    json_t *j = get(top);
    cr_assert_str_eq(state_of(j), "RUNNING", "a priority-3 job preempted a priority-5 one: %s",
                     json_string_value(json_object_get(j, "reason")));
    json_decref(j);
    j = get(mid);
    cr_assert_str_eq(state_of(j), "QUEUED");
    json_decref(j);
    submit(spec(1, 1, "cpu", 7, 1), NULL, over, NULL);
    j = wait_state(top, "STOPPING", 5000);
    cr_assert(strstr(json_string_value(json_object_get(j, "reason")), over), "%s",
              json_string_value(json_object_get(j, "reason")));
    json_decref(j);
}

/* The real scheduler hands admission which jobs are stopping: their slots are coming back, so a
 * head that preempted one job waits for it and preempts no second one while it stops. */
Test(life, a_head_waits_for_its_stopping_victim_and_preempts_no_other)
{
    char w1[64], w2[64], l1[40], l2[40], high[40];
    reg(NULL, 1, "cpu", w1);
    submit(spec(1, 1, "cpu", 0, 1), NULL, l1, NULL);
    json_decref(wait_state(l1, "SCHEDULED", 5000));
    start_on(w1, l1, 1);
    reg(NULL, 1, "cpu", w2);
    submit(spec(1, 1, "cpu", 0, 1), NULL, l2, NULL);
    json_decref(wait_state(l2, "SCHEDULED", 5000));
    start_on(w2, l2, 1);
    submit(spec(1, 1, "cpu", 5, 1), NULL, high, NULL);
    /* one of them stops for it (its agent has not ended it yet) */
    const char *victim = NULL, *other = NULL;
    for (int64_t until = kiln_mono_us() + WAIT_MIN_MS * 1000LL; !victim && kiln_mono_us() < until;) {
        json_t *a = get(l1), *b = get(l2);
        if (!strcmp(state_of(a), "STOPPING"))
            victim = l1, other = l2;
        else if (!strcmp(state_of(b), "STOPPING"))
            victim = l2, other = l1;
        json_decref(a);
        json_decref(b);
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
    }
    cr_assert_not_null(victim, "no job was preempted for %s", high);
    wait_passes(3);
    json_t *j = get(other);
    cr_assert_str_eq(state_of(j), "RUNNING", "a second job was preempted while the first stopped: %s",
                     json_string_value(json_object_get(j, "reason")));
    json_decref(j);
    json_decref(wait_reason(high, "QUEUED", (const char *const[]){"freeing"}, 1, 5000));
    /* one event of the preemption on high, naming the one victim, after those passes */
    char ev[128];
    events_str(high, ev, sizeof(ev));
    cr_assert_str_eq(ev, "QUEUED QUEUED");
    char *why = event_reason(high, "QUEUED");
    cr_assert(!strncmp(why, "preempting job ", 15) && strstr(why, victim) && !strstr(why, other), "%s", why);
    free(why);
}

Test(life, a_stop_during_a_preemption_ends_the_job_stopped)
{
    char w[64], low[40], high[40];
    reg(NULL, 1, "cpu", w);
    submit(spec(1, 1, "cpu", 0, 1), NULL, low, NULL);
    json_decref(wait_state(low, "SCHEDULED", 5000));
    start_on(w, low, 1);
    submit(spec(1, 1, "cpu", 5, 1), NULL, high, NULL);
    json_decref(wait_state(low, "STOPPING", 5000));
    json_t *out = NULL;
    cr_assert_eq(svc_job_stop(svc, svc_caller_kilnd(), low, "no longer needed", &out, &err), 0, "%s", err.message);
    json_decref(out);
    rank_exit(w, low, 1, 0, 143, "stopped on SIGTERM");
    json_decref(wait_state(low, "STOPPED", 2000));
    json_decref(wait_state(high, "SCHEDULED", 5000));
}

/* The nudges (svc_on_work: what WatchWork sends) each of two workers got. */
static pthread_mutex_t nudge_mu = PTHREAD_MUTEX_INITIALIZER;
static char nudge_w[2][64];
static int nudge_n[2];

static void count_nudge(void *ud, const char *wid)
{
    (void)ud;
    pthread_mutex_lock(&nudge_mu);
    for (int i = 0; i < 2; i++)
        nudge_n[i] += strcmp(nudge_w[i], wid) == 0;
    pthread_mutex_unlock(&nudge_mu);
}

static int nudges(int i)
{
    pthread_mutex_lock(&nudge_mu);
    int n = nudge_n[i];
    pthread_mutex_unlock(&nudge_mu);
    return n;
}

static void watch_worker(int i, const char *wid)
{
    pthread_mutex_lock(&nudge_mu);
    kiln_strlcpy(nudge_w[i], wid, sizeof nudge_w[i]);
    nudge_n[i] = 0;
    pthread_mutex_unlock(&nudge_mu);
}

static void wait_nudges(int i, int n)
{
    for (int64_t end = kiln_mono_us() + WAIT_MIN_MS * 1000LL; nudges(i) < n;) {
        cr_assert_lt(kiln_mono_us(), end, "worker %s got %d nudge(s), wanted %d", nudge_w[i], nudges(i), n);
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
    }
}

Test(life, the_start_of_a_one_node_job_nudges_no_agent)
{
    char w1[64], w2[64], a[40], b[40];
    reg(NULL, 1, "cpu", w1);
    watch_worker(0, w1);
    svc_on_work(svc, count_nudge, NULL);
    submit(spec(1, 1, "cpu", 0, 1), NULL, a, NULL);
    wait_nudges(0, 1); /* its placement */
    start_on(w1, a, 1); /* reported started with its rendezvous port */
    /* A job placed on a second worker after that report: its nudge comes after any the report sent
     * (notifications arrive in commit order). */
    reg(NULL, 1, "cpu", w2);
    watch_worker(1, w2);
    submit(spec(1, 1, "cpu", 0, 1), NULL, b, NULL);
    wait_nudges(1, 1);
    svc_on_work(svc, NULL, NULL);
    cr_assert_eq(nudges(0), 1, "the agent that reported the start was nudged again for nothing");
}

/* With every slot taken the scheduler reads only the head of the queue, and the whole queue every
 * 2 s; the whole-queue pass after head-only ones reads no job's data paths again (what it knew of
 * the jobs behind the head was kept). */
Test(life, a_pass_over_the_head_keeps_what_it_knew_of_the_jobs_behind)
{
    char w[64], busy[40], id[40];
    reg(NULL, 1, "cpu", w);
    submit(spec(1, 1, "cpu", 10, 1), NULL, busy, NULL);
    json_decref(wait_state(busy, "SCHEDULED", 5000));
    for (int i = 0; i < 30; i++)
        submit(spec(1, 1, "cpu", 0, 1), NULL, id, NULL);
    enum { CAP = 2000 };
    svc_sched_pass_t *rec = calloc(CAP, sizeof(*rec));
    cr_assert_not_null(rec);
    svc_sched_record(svc, rec, CAP);
    /* a pass over all 30, then one over the head (20), then one over all 30 again */
    int stage = 0, seen = 0, at = -1;
    for (int64_t end = kiln_mono_us() + WAIT_MIN_MS * 1000LL; stage < 3 && kiln_mono_us() < end;) {
        int n = svc_sched_recorded(svc);
        for (; seen < n && stage < 3; seen++) {
            int want = stage == 1 ? 20 : 30;
            if (rec[seen].jobs == want && (stage++, true))
                at = seen;
        }
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
    }
    svc_sched_record(svc, NULL, 0);
    cr_assert_eq(stage, 3, "no whole-queue pass after a head-only one within %d s (%d passes)", WAIT_MIN_MS / 1000,
                 seen);
    cr_assert_eq(rec[at].facts_read, 0, "the whole-queue pass read %d jobs' facts again", rec[at].facts_read);
    free(rec);
}

/* A queue whose jobs all wait behind the first 1,000 of another queue (the jobs a pass reads in
 * the queue's order) still has its first jobs considered: its job here takes at once the slot
 * that none of the 1,000 can use. */
Test(life, a_queue_behind_a_thousand_jobs_of_another_is_still_seen)
{
    char w[64], id[40], bid[40];
    reg(NULL, 1, "cpu", w);
    json_t *q = json_pack("{s:s, s:{s:i, s:i}, s:[s]}", "name", "b", "quota", "cpu", 1, "gpu", 0, "projects", "default");
    json_t *out = NULL;
    cr_assert_eq(svc_queue_create(svc, svc_caller_kilnd(), q, &out, &err), 0, "%s", err.message);
    json_decref(q);
    json_decref(out);
    for (int i = 0; i < 1000; i++) /* two slots a job: none fits the one worker */
        submit(spec(1, 2, "cpu", 0, 1), NULL, id, NULL);
    json_t *sp = spec(1, 1, "cpu", 0, 1);
    json_object_set_new(sp, "queue", json_string("b"));
    submit(sp, NULL, bid, NULL);
    json_decref(wait_state(bid, "SCHEDULED", 15000));
}
