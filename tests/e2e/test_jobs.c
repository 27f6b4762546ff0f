/* test_jobs.c - end to end over REST, with a real kilnd, PostgreSQL and two real agents running
 * real kiln-train ranks: a good job to COMPLETED (events, logs, metrics, progress), a bad one
 * rejected, one spanning both agents, one stopped mid-run, and an agent SIGKILLed mid-job. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "tests/e2e/e2e.h"

#define GOOD_STEPS 30

Test(e2e, good_job_completes, .init = e2e_setup, .fini = e2e_teardown, .timeout = 240)
{
    char *spec = e2e_spec("e2e-good", GOOD_STEPS, 1, 1, 4);
    json_t *job = e2e_submit(spec);
    free(spec);
    char id[64];
    snprintf(id, sizeof id, "%s", e2e_jstr(job, "id"));
    cr_assert_eq(strlen(id), 36, "job id: %s", e2e_dump(job));
    cr_assert_str_eq(e2e_jstr(job, "state"), "QUEUED");
    cr_assert_str_eq(e2e_jstr(job, "name"), "e2e-good");
    /* The stored spec is normalised: defaults filled in. */
    cr_assert_eq(e2e_jint(json_object_get(json_object_get(job, "spec"), "hyperparameters"), "max_steps"), GOOD_STEPS);
    json_decref(job);

    job = e2e_wait_state(id, TH_JOB_ENDED, 180000);
    cr_assert_str_eq(e2e_jstr(job, "state"), "COMPLETED", "job ended %s: %s", e2e_jstr(job, "state"), e2e_jstr(job, "reason"));
    json_t *progress = json_object_get(job, "progress");
    cr_assert_eq(e2e_jint(progress, "step"), GOOD_STEPS, "progress: %s", e2e_dump(progress));
    cr_assert_eq(e2e_jint(progress, "total_steps"), GOOD_STEPS, "progress: %s", e2e_dump(progress));
    cr_assert(*e2e_jstr(job, "started_at") && *e2e_jstr(job, "ended_at"), "times: %s", e2e_dump(job));
    json_t *workers = json_object_get(job, "workers");
    cr_assert_eq(json_array_size(workers), 1, "workers: %s", e2e_dump(workers));
    const char *w = json_string_value(json_array_get(workers, 0));
    cr_assert(w && (!strcmp(w, e2e_cl->worker_id[0]) || !strcmp(w, e2e_cl->worker_id[1])), "worker %s", w);
    double latest = json_number_value(json_object_get(json_object_get(job, "metrics"), "train_loss"));
    cr_assert(json_is_number(json_object_get(json_object_get(job, "metrics"), "train_loss")),
              "no latest train_loss on the job: %s", e2e_dump(json_object_get(job, "metrics")));

    /* Events: exactly the happy path, each from the previous state, with times and reasons. */
    json_t *ev = e2e_events(id);
    char states[512];
    cr_assert_str_eq(e2e_event_states(ev, states, sizeof states), "QUEUED,SCHEDULED,STARTING,RUNNING,COMPLETED",
                     "events: %s", e2e_dump(ev));
    size_t i;
    json_t *e;
    const char *prev = NULL;
    json_array_foreach(json_object_get(ev, "events"), i, e) {
        json_t *from = json_object_get(e, "from_state");
        if (i == 0)
            cr_assert(json_is_null(from) || !from, "first event has a from_state: %s", e2e_dump(e));
        else
            cr_assert_str_eq(json_string_value(from), prev, "event %zu: %s", i, e2e_dump(e));
        cr_assert(*e2e_jstr(e, "time"), "event without time: %s", e2e_dump(e));
        prev = e2e_jstr(e, "to_state");
    }
    json_decref(ev);

    /* Logs: lines from rank 0 only, in seq order; rank filter. */
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s/logs", id);
    json_t *logs = e2e_get(path);
    json_t *lines = json_object_get(logs, "lines");
    cr_assert_gt(json_array_size(lines), 0, "no log lines: %s", e2e_dump(logs));
    json_int_t last_seq = 0;
    json_array_foreach(lines, i, e) {
        cr_assert_eq(e2e_jint(e, "rank"), 0, "line from another rank: %s", e2e_dump(e));
        cr_assert_gt(e2e_jint(e, "seq"), last_seq, "seq not increasing: %s", e2e_dump(e));
        last_seq = e2e_jint(e, "seq");
    }
    json_decref(logs);
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?rank=1", id);
    logs = e2e_get(path);
    cr_assert_eq(json_array_size(json_object_get(logs, "lines")), 0, "rank 1 has lines: %s", e2e_dump(logs));
    json_decref(logs);

    /* Metrics: the train_loss history reaches the last step and falls. */
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?name=train_loss", id);
    json_t *m = e2e_get(path);
    json_t *series = json_object_get(m, "metrics");
    cr_assert_eq(json_array_size(series), 1, "series: %s", e2e_dump(m));
    cr_assert_str_eq(e2e_jstr(json_array_get(series, 0), "name"), "train_loss");
    json_t *pts = json_object_get(json_array_get(series, 0), "points");
    size_t n = json_array_size(pts);
    cr_assert_geq(n, 5, "train_loss points: %s", e2e_dump(m));
    cr_assert_eq(e2e_jint(json_array_get(pts, n - 1), "step"), GOOD_STEPS);
    double head = 0, tail = 0;
    for (size_t k = 0; k < 3; k++) {
        head += json_number_value(json_object_get(json_array_get(pts, k), "value")) / 3;
        tail += json_number_value(json_object_get(json_array_get(pts, n - 1 - k), "value")) / 3;
    }
    cr_assert_lt(tail, head, "train_loss did not fall: first %.4f, last %.4f", head, tail);
    double last_value = json_number_value(json_object_get(json_array_get(pts, n - 1), "value"));
    cr_assert_float_eq(latest, last_value, 1e-4, "job's latest train_loss %f vs history %f", latest, last_value);
    json_decref(m);
    /* Every metric of the job, including throughput. */
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics", id);
    m = e2e_get(path);
    cr_assert_geq(json_array_size(json_object_get(m, "metrics")), 2, "metrics: %s", e2e_dump(m));
    json_decref(m);

    /* Listing by state finds it. */
    json_t *list = e2e_get("/v1/jobs?status=COMPLETED");
    bool found = false;
    json_array_foreach(json_object_get(list, "jobs"), i, e) found |= !strcmp(e2e_jstr(e, "id"), id);
    cr_assert(found, "COMPLETED listing lacks the job: %s", e2e_dump(list));
    json_decref(list);
    json_decref(job);
    e2e_pass();
}

Test(e2e, bad_job_rejected, .init = e2e_setup, .fini = e2e_teardown, .timeout = 120)
{
    long st = 0;
    /* A bad value: 400 naming the field. */
    char *spec = e2e_spec("e2e-bad", 10, 1, 1, 4);
    json_t *j = json_loads(spec, 0, NULL);
    free(spec);
    json_object_set_new(json_object_get(j, "hyperparameters"), "lr", json_real(-1));
    char *bad = json_dumps(j, JSON_COMPACT);
    json_t *r = e2e_http("POST", "/v1/jobs", bad, NULL, &st);
    cr_assert_eq(st, 400, "reply: %s", e2e_dump(r));
    cr_assert_str_eq(e2e_jstr(r, "code"), "invalid_argument");
    cr_assert_str_eq(e2e_jstr(r, "field"), "hyperparameters.lr", "reply: %s", e2e_dump(r));
    cr_assert(*e2e_jstr(r, "message"), "no message: %s", e2e_dump(r));
    json_decref(r);
    free(bad);

    /* An unknown key: a typo must not be silently ignored. */
    json_object_del(json_object_get(j, "hyperparameters"), "lr");
    json_object_set_new(json_object_get(j, "hyperparameters"), "learning_rate", json_real(0.1));
    bad = json_dumps(j, JSON_COMPACT);
    r = e2e_http("POST", "/v1/jobs", bad, NULL, &st);
    cr_assert_eq(st, 400, "reply: %s", e2e_dump(r));
    cr_assert(strstr(e2e_jstr(r, "field"), "learning_rate") || strstr(e2e_jstr(r, "message"), "learning_rate"),
              "the unknown key is not named: %s", e2e_dump(r));
    json_decref(r);
    free(bad);
    json_decref(j);

    /* Not JSON at all. */
    r = e2e_http("POST", "/v1/jobs", "{\"name\": ", NULL, &st);
    cr_assert_eq(st, 400, "reply: %s", e2e_dump(r));
    cr_assert(*e2e_jstr(r, "message"), "no message: %s", e2e_dump(r));
    json_decref(r);

    /* Nothing invalid was stored. */
    json_t *list = e2e_get("/v1/jobs");
    cr_assert_eq(json_array_size(json_object_get(list, "jobs")), 0, "stored: %s", e2e_dump(list));
    json_decref(list);

    /* More ranks than the alive workers have is not invalid (workers come and go): accepted, it
     * waits and says what for. */
    spec = e2e_spec("e2e-too-big", 10, 3, 1, 6);
    r = e2e_http("POST", "/v1/jobs", spec, NULL, &st);
    cr_assert_eq(st, 201, "a job needing 3 nodes of 2 (HTTP %ld): %s", st, e2e_dump(r));
    cr_assert_str_eq(e2e_jstr(r, "state"), "QUEUED");
    cr_assert(strstr(e2e_jstr(r, "reason"), "waiting for workers: needs 3 worker(s)"), "%s", e2e_dump(r));
    json_decref(r);
    free(spec);
    e2e_pass();
}

Test(e2e, job_spans_both_agents, .init = e2e_setup, .fini = e2e_teardown, .timeout = 240)
{
    char *spec = e2e_spec("e2e-two-nodes", 20, 2, 1, 4);
    json_t *job = e2e_submit(spec);
    free(spec);
    char id[64];
    snprintf(id, sizeof id, "%s", e2e_jstr(job, "id"));
    json_decref(job);
    job = e2e_wait_state(id, TH_JOB_ENDED, 180000);
    const char *state = e2e_jstr(job, "state");

    /* Gang placement: one rank on each agent, never partly. */
    json_t *workers = json_object_get(job, "workers");
    cr_assert_eq(json_array_size(workers), 2, "workers: %s", e2e_dump(job));
    cr_assert_str_neq(json_string_value(json_array_get(workers, 0)), json_string_value(json_array_get(workers, 1)));
    cr_assert(e2e_agent_of_job(id) >= 0, "no agent has a directory for the job");
    json_t *ev = e2e_events(id);
    char states[512];
    e2e_event_states(ev, states, sizeof states);
    cr_assert(strstr(states, "QUEUED,SCHEDULED,STARTING"), "events: %s", e2e_dump(ev));
    json_decref(ev);

    /* Data parallel over the two agents: both ranks train to the end and log, tagged. */
    cr_assert_str_eq(state, "COMPLETED", "two-node job ended %s: %s", state, e2e_jstr(job, "reason"));
    cr_assert(strstr(states, "RUNNING,COMPLETED"), "events: %s", states);
    char path[256];
    for (int rank = 0; rank < 2; rank++) {
        snprintf(path, sizeof path, "/v1/jobs/%s/logs?rank=%d", id, rank);
        json_t *logs = e2e_get(path);
        json_t *lines = json_object_get(logs, "lines");
        cr_assert_gt(json_array_size(lines), 0, "no lines from rank %d", rank);
        size_t i;
        json_t *l;
        json_array_foreach(lines, i, l) cr_assert_eq(e2e_jint(l, "rank"), rank, "%s", e2e_dump(l));
        json_decref(logs);
    }
    cr_assert_eq(e2e_jint(json_object_get(job, "progress"), "step"), 20, "%s", e2e_dump(job));
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?name=train_loss", id);
    json_t *m = e2e_get(path);
    json_t *pts = json_object_get(json_array_get(json_object_get(m, "metrics"), 0), "points");
    size_t n = json_array_size(pts);
    cr_assert_geq(n, 2, "%s", e2e_dump(m));
    cr_assert_lt(json_number_value(json_object_get(json_array_get(pts, n - 1), "value")),
                 json_number_value(json_object_get(json_array_get(pts, 0), "value")), "loss did not fall: %s", e2e_dump(m));
    json_decref(m);
    json_decref(job);
    e2e_pass();
}

Test(e2e, job_stopped_mid_run, .init = e2e_setup, .fini = e2e_teardown, .timeout = 240)
{
    char *spec = e2e_spec("e2e-stop", 1000000, 1, 1, 4);
    json_t *job = e2e_submit(spec);
    free(spec);
    char id[64];
    snprintf(id, sizeof id, "%s", e2e_jstr(job, "id"));
    json_decref(job);
    /* Really training: a few steps done. */
    job = e2e_wait_step(id, 3, 120000);
    json_decref(job);
    int agent = e2e_agent_of_job(id);
    cr_assert_geq(agent, 0, "no agent has a directory for the job");

    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s:stop", id);
    long st = 0;
    json_t *r = e2e_http("POST", path, "{\"reason\": \"e2e stop test\"}", NULL, &st);
    cr_assert_eq(st, 200, "stop: HTTP %ld %s", st, e2e_dump(r));
    cr_assert(!strcmp(e2e_jstr(r, "state"), "STOPPING") || !strcmp(e2e_jstr(r, "state"), "STOPPED"), "%s", e2e_dump(r));
    json_decref(r);

    job = e2e_wait_state(id, TH_JOB_ENDED, 60000);
    cr_assert_str_eq(e2e_jstr(job, "state"), "STOPPED", "ended %s: %s", e2e_jstr(job, "state"), e2e_jstr(job, "reason"));
    json_int_t step = e2e_jint(json_object_get(job, "progress"), "step");
    cr_assert(step >= 3 && step < 1000000, "progress %lld", (long long)step);
    json_decref(job);
    json_t *ev = e2e_events(id);
    char states[512];
    e2e_event_states(ev, states, sizeof states);
    cr_assert(strstr(states, "RUNNING,STOPPING,STOPPED"), "events: %s", e2e_dump(ev));
    cr_assert(strstr(e2e_dump(ev), "e2e stop test"), "the stop reason is not in the events: %s", e2e_dump(ev));
    json_decref(ev);

    /* The rank got SIGTERM and wrote a checkpoint before exiting (status 143). */
    char ckpt[600];
    snprintf(ckpt, sizeof ckpt, "%s/jobs/%s/checkpoints", e2e_cl->work_dir[agent], id);
    cr_assert_gt(e2e_count_files(ckpt), 0, "no checkpoint in %s", ckpt);
    char log[600];
    snprintf(log, sizeof log, "%s/agent%d.log", e2e_cl->dir, agent);
    char *agent_log = e2e_slurp(log);
    cr_assert(strstr(agent_log, "143"), "the agent did not see the rank exit with 143:\n%s", agent_log);
    free(agent_log);

    /* Stopping again is refused: the job has ended. */
    r = e2e_http("POST", path, NULL, NULL, &st);
    cr_assert_eq(st, 409, "second stop: HTTP %ld %s", st, e2e_dump(r));
    json_decref(r);
    e2e_pass();
}

Test(e2e, agent_killed_mid_job, .init = e2e_setup_fast_heartbeat, .fini = e2e_teardown, .timeout = 240)
{
    char *spec = e2e_spec("e2e-agent-dies", 1000000, 1, 1, 4);
    json_t *job = e2e_submit(spec);
    free(spec);
    char id[64];
    snprintf(id, sizeof id, "%s", e2e_jstr(job, "id"));
    json_decref(job);
    job = e2e_wait_step(id, 2, 120000);
    char worker[128];
    snprintf(worker, sizeof worker, "%s", json_string_value(json_array_get(json_object_get(job, "workers"), 0)));
    json_decref(job);
    int agent = e2e_agent_of_job(id);
    cr_assert_geq(agent, 0, "no agent has a directory for the job");

    /* The machine's agent dies without a word. */
    cr_assert_eq(kill(e2e_cl->agents[agent], SIGKILL), 0);
    int status;
    waitpid(e2e_cl->agents[agent], &status, 0);
    e2e_cl->agents[agent] = 0;
    double t0 = (double)time(NULL);

    /* Within the heartbeat timeout (plus the liveness check's period) the job leaves RUNNING:
     * RESTARTING (re-queued for another attempt) or FAILED, with a reason naming the worker. */
    long limit_ms = e2e_cl->heartbeat_timeout_ms + 15000;
    json_t *left = NULL;
    for (long waited = 0; waited <= limit_ms && !left; waited += 200) {
        json_t *ev = e2e_events(id);
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(ev, "events"), i, e) {
            const char *from = json_string_value(json_object_get(e, "from_state"));
            const char *to = e2e_jstr(e, "to_state");
            if (from && !strcmp(from, "RUNNING") && (!strcmp(to, "RESTARTING") || !strcmp(to, "FAILED"))) {
                left = json_incref(e);
                break;
            }
        }
        json_decref(ev);
        if (!left)
            usleep(200000);
    }
    cr_assert_not_null(left, "job still RUNNING %.0f s after its agent died (heartbeat timeout %d ms): %s",
                       (double)time(NULL) - t0, e2e_cl->heartbeat_timeout_ms, e2e_dump(e2e_events(id)));
    cr_assert(strstr(e2e_jstr(left, "reason"), worker), "reason does not name worker %s: %s", worker, e2e_dump(left));
    json_decref(left);

    /* The worker is DEAD, and the job never sits RUNNING on it. */
    json_t *ws = e2e_get("/v1/workers");
    size_t i;
    json_t *w;
    bool dead = false;
    json_array_foreach(json_object_get(ws, "workers"), i, w)
        if (!strcmp(e2e_jstr(w, "id"), worker))
            dead = !strcmp(e2e_jstr(w, "state"), "DEAD");
    cr_assert(dead, "worker %s not DEAD: %s", worker, e2e_dump(ws));
    json_decref(ws);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    job = e2e_get(path);
    const char *state = e2e_jstr(job, "state");
    json_t *jw = json_object_get(job, "workers");
    if (!strcmp(state, "RUNNING"))
        cr_assert_str_neq(json_string_value(json_array_get(jw, 0)), worker, "RUNNING on the dead worker: %s",
                          e2e_dump(job));
    json_decref(job);
    e2e_pass();
}

/* ---- an attempt lost with its agent, resumed elsewhere from a shared checkpoint ------------- */

#define RETRY_STEPS 2000

typedef struct retry_job {
    char id[64], worker[128], ckpt_dir[400];
    int agent;                  /* index of the agent attempt 1 ran on */
    pid_t ranks[E2E_MAX_RANKS]; /* attempt 1's ranks, stopped (SIGSTOP) */
    int n_ranks;
} retry_job_t;

/* Submits a job with 2 attempts that checkpoints every 10 steps into a directory both agents can
 * read (checkpoint.path), and freezes attempt 1 past the checkpoint of step 10. The tiny model
 * trains thousands of steps a second: frozen, it cannot finish before the test acts. */
static void retry_job_start(retry_job_t *rj, const char *name)
{
    char *text = e2e_spec(name, RETRY_STEPS, 1, 1, 4);
    json_t *spec = json_loads(text, 0, NULL);
    free(text);
    json_object_set_new(spec, "retry", json_pack("{s:i}", "max_attempts", 2));
    char shared[300];
    snprintf(shared, sizeof shared, "%s/shared-checkpoints", e2e_cl->dir);
    json_object_set_new(spec, "checkpoint", json_pack("{s:i, s:s}", "every_steps", 10, "path", shared));
    text = json_dumps(spec, JSON_COMPACT);
    json_decref(spec);
    json_t *job = e2e_submit(text);
    free(text);
    snprintf(rj->id, sizeof rj->id, "%s", e2e_jstr(job, "id"));
    json_decref(job);
    job = e2e_freeze_at_step(rj->id, 15, 120000, rj->ranks, &rj->n_ranks);
    snprintf(rj->worker, sizeof rj->worker, "%s",
             json_string_value(json_array_get(json_object_get(job, "workers"), 0)));
    json_decref(job);
    rj->agent = e2e_agent_of_job(rj->id);
    cr_assert_geq(rj->agent, 0, "no agent has a directory for the job");
    /* the job's project area (KILN_AREA_DIR), where both agents find it */
    snprintf(rj->ckpt_dir, sizeof rj->ckpt_dir, "%s/" KILN_AREA_DIR "/default/%s", shared, rj->id);
    cr_assert_gt(e2e_count_files(rj->ckpt_dir), 0, "attempt 1 wrote no checkpoint into %s", rj->ckpt_dir);
}

/* The job ends COMPLETED as attempt 2 on the other worker, through RESTARTING (whose reason names
 * the lost worker and contains why), and attempt 2 logged that it resumed from the shared
 * checkpoint directory; both attempts' lines are kept, tagged with their attempt. */
static void retry_job_check(const retry_job_t *rj, const char *why)
{
    json_t *job = e2e_wait_state(rj->id, TH_JOB_ENDED, e2e_cl->heartbeat_timeout_ms + 120000);
    cr_assert_str_eq(e2e_jstr(job, "state"), "COMPLETED", "ended %s: %s", e2e_jstr(job, "state"), e2e_jstr(job, "reason"));
    cr_assert_eq(e2e_jint(job, "attempt"), 2, "%s", e2e_dump(job));
    json_t *workers = json_object_get(job, "workers");
    cr_assert_eq(json_array_size(workers), 1, "%s", e2e_dump(job));
    cr_assert_str_neq(json_string_value(json_array_get(workers, 0)), rj->worker, "attempt 2 ran on the lost worker");
    cr_assert_eq(e2e_jint(json_object_get(job, "progress"), "step"), RETRY_STEPS, "%s", e2e_dump(job));
    json_decref(job);

    json_t *ev = e2e_events(rj->id);
    char states[512];
    e2e_event_states(ev, states, sizeof states);
    cr_assert(strstr(states, "RUNNING,RESTARTING,SCHEDULED,STARTING,RUNNING,COMPLETED"), "events: %s", e2e_dump(ev));
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(ev, "events"), i, e)
        if (!strcmp(e2e_jstr(e, "to_state"), "RESTARTING"))
            cr_assert(strstr(e2e_jstr(e, "reason"), rj->worker) && strstr(e2e_jstr(e, "reason"), why),
                      "RESTARTING reason lacks %s or \"%s\": %s", rj->worker, why, e2e_dump(e));
    json_decref(ev);

    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?limit=10000", rj->id);
    json_t *logs = e2e_get(path);
    bool a1 = false, a2 = false, resumed = false;
    char resumed_from[450];
    snprintf(resumed_from, sizeof resumed_from, "resumed from %s/ckpt_", rj->ckpt_dir);
    json_array_foreach(json_object_get(logs, "lines"), i, e) {
        a1 |= e2e_jint(e, "attempt") == 1;
        a2 |= e2e_jint(e, "attempt") == 2;
        resumed |= e2e_jint(e, "attempt") == 2 && strstr(e2e_jstr(e, "line"), resumed_from);
    }
    cr_assert(a1 && a2, "lines of attempt 1: %d, of attempt 2: %d", a1, a2);
    cr_assert(resumed, "attempt 2 did not log \"%s...\"", resumed_from);
    json_decref(logs);
    char *out = NULL, *err = NULL;
    cr_assert_eq(e2e_kiln(&out, &err, "logs", rj->id, NULL), 0, "%s", err);
    cr_assert(strstr(out, "[rank 0] ") && strstr(out, "[rank 0, attempt 2] "), "%.2000s", out);
    free(out);
    free(err);
}

/* The machine dies: its agent is SIGKILLed, and its (stopped) ranks die with it of
 * PR_SET_PDEATHSIG. kilnd notices the silence, re-queues the job, and attempt 2 resumes on the
 * surviving agent. */
Test(e2e, agent_killed_job_restarts_elsewhere, .init = e2e_setup_fast_heartbeat, .fini = e2e_teardown,
     .timeout = 240)
{
    retry_job_t rj;
    retry_job_start(&rj, "e2e-agent-dies-retry");
    cr_assert_eq(kill(e2e_cl->agents[rj.agent], SIGKILL), 0);
    int status;
    waitpid(e2e_cl->agents[rj.agent], &status, 0);
    e2e_cl->agents[rj.agent] = 0;
    retry_job_check(&rj, "stopped heartbeating");
    e2e_pass();
}

/* Preemption or maintenance: the agent gets SIGTERM. It tells kilnd it is draining, stops its
 * ranks (each checkpoints and exits 143), and reports them stopped by the shutdown: the attempt
 * is lost, not failed, so the job is re-queued at once (no heartbeat timeout) and resumes on the
 * other agent, never on the one shutting down. */
Test(e2e, agent_shutdown_job_resumes_elsewhere, .init = e2e_setup, .fini = e2e_teardown, .timeout = 240)
{
    retry_job_t rj;
    retry_job_start(&rj, "e2e-agent-drains");
    pid_t agent = e2e_cl->agents[rj.agent];
    cr_assert_eq(kill(agent, SIGTERM), 0);
    e2e_thaw(rj.ranks, rj.n_ranks); /* so that the ranks can act on the SIGTERM the agent sends */
    int status;
    cr_assert_eq(waitpid(agent, &status, 0), agent);
    e2e_cl->agents[rj.agent] = 0;
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the agent did not shut down cleanly (status %d)",
              status);
    retry_job_check(&rj, "is shutting down");

    /* The drained worker is marked so (or already DEAD), and kilnd never failed the attempt. */
    json_t *ws = e2e_get("/v1/workers");
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(ws, "workers"), i, w)
        if (!strcmp(e2e_jstr(w, "id"), rj.worker))
            cr_assert(json_is_true(json_object_get(w, "draining")) || !strcmp(e2e_jstr(w, "state"), "DEAD"),
                      "worker %s: %s", rj.worker, e2e_dump(w));
    json_decref(ws);
    json_t *ev = e2e_events(rj.id);
    cr_assert_null(strstr(e2e_dump(ev), "\"FAILED\""), "events: %s", e2e_dump(ev));
    json_decref(ev);
    e2e_pass();
}
