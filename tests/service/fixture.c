/* fixture.c - shared set-up for the service suites: a service on a fresh database with its own
 * scheduler and liveness threads, and helpers that play the agent's part by calling the
 * agent-facing functions the gRPC server calls (register, heartbeat, rank status, exits, logs,
 * metrics). Test-only code. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/service/fixture.h"

svc_t *svc;
char *url;
kiln_err_t err;
arena_t arena;

void start(int hb_timeout_ms)
{
    url = th_pg_create_db("svc");
    cr_assert_not_null(url, "no test database (run with tests/run.sh)");
    svc_config_t cfg = {.database_url = url, .heartbeat_interval_ms = 100,
                        .heartbeat_timeout_ms = hb_timeout_ms, .sched_interval_ms = 50,
                        .db_pool_size = 4, .stop_grace_ms = 500, .preempt_protect_after = fixture_protect_after,
                        .sched_default_runtime_s = fixture_default_runtime_s,
                        .search_timeout_ms = fixture_search_timeout_ms};
    kiln_err_clear(&err);
    cr_assert_eq(svc_create(&cfg, &svc, &err), 0, "%s", err.message);
    arena_init(&arena, 0);
}

int fixture_protect_after;
int fixture_default_runtime_s;
int fixture_search_timeout_ms;

void setup(void) { start(10000); }
void setup_protect_after_1(void)
{
    fixture_protect_after = 1;
    start(10000);
}
void setup_default_runtime_1(void)
{
    fixture_default_runtime_s = 1;
    start(10000);
}
void setup_short_timeout(void) { start(1500); }
void setup_search_timeout_1ms(void)
{
    fixture_search_timeout_ms = 1;
    start(10000);
}

void teardown(void)
{
    svc_destroy(svc);
    arena_deinit(&arena);
    free(url);
}

json_t *spec(int nodes, int slots_per_node, const char *slot_type, int priority, int attempts)
{
    json_t *s = json_pack("{s:s, s:{s:s, s:[i], s:i, s:i}, s:{s:s}, s:{s:f, s:i, s:I},"
                          " s:{s:i, s:i, s:s}, s:i, s:{s:i}, s:{s:s}}",
                          "name", "flow",
                          "model", "type", "mlp", "hidden", 8, "n_inputs", 4, "n_classes", 2,
                          "data", "train", "synthetic",
                          "hyperparameters", "lr", 0.01, "global_batch_size", 8, "max_steps", (json_int_t)100,
                          "resources", "nodes", nodes, "slots_per_node", slots_per_node, "slot_type", slot_type,
                          "priority", priority, "retry", "max_attempts", attempts, "tags", "team", "t");
    cr_assert_not_null(s);
    return s;
}

/* Submits a job; returns its id (static storage, NUM per call site). */
void submit(json_t *sp, const char *key, char *id_out, bool *created)
{
    json_t *job = NULL;
    bool cr = false;
    kiln_err_clear(&err);
    int rc = svc_job_create(svc, svc_caller_kilnd(), sp, key, &job, &cr, &err);
    json_decref(sp);
    cr_assert_eq(rc, 0, "create: %s (field %s)", err.message, err.field);
    kiln_strlcpy(id_out, json_string_value(json_object_get(job, "id")), 40);
    if (created)
        *created = cr;
    json_decref(job);
}

/* The credential each registration answered, so that a worker can register again under its id
 * as a restarted agent does. */
static struct {
    char id[64];
    char credential[128];
} creds[32];

void reg(const char *want_id, int slots, const char *type, char *id_out)
{
    Kiln__RegisterRequest rq = KILN__REGISTER_REQUEST__INIT;
    Kiln__RegisterResponse rs = KILN__REGISTER_RESPONSE__INIT;
    rq.worker_id = (char *)(want_id ? want_id : "");
    rq.hostname = "host";
    rq.address = "127.0.0.1";
    rq.slots = slots;
    rq.slot_type = (char *)type;
    const char *cred = NULL;
    int slot = -1;
    for (int i = 0; i < 32 && want_id; i++)
        if (!strcmp(creds[i].id, want_id)) {
            cred = creds[i].credential;
            slot = i;
        }
    cr_assert_eq(svc_agent_register(svc, &rq, cred, &arena, &rs, &err), 0, "register: %s", err.message);
    cr_assert_eq(rs.heartbeat_interval_ms, 100);
    cr_assert(rs.credential && !strncmp(rs.credential, "kiln_agent_", 11), "a credential comes back");
    kiln_strlcpy(id_out, rs.worker_id, 64);
    for (int i = 0; slot < 0 && i < 32; i++)
        if (!creds[i].id[0])
            slot = i;
    cr_assert(slot >= 0);
    kiln_strlcpy(creds[slot].id, rs.worker_id, sizeof creds[slot].id);
    kiln_strlcpy(creds[slot].credential, rs.credential, sizeof creds[slot].credential);
}

/* One heartbeat; running lists (job, attempt) pairs the worker claims to run. */
Kiln__HeartbeatResponse *hb(const char *wid, const char *job, int attempt)
{
    Kiln__HeartbeatRequest rq = KILN__HEARTBEAT_REQUEST__INIT;
    Kiln__HeartbeatResponse *rs = arena_alloc(&arena, sizeof(*rs));
    Kiln__RunningRank rr = KILN__RUNNING_RANK__INIT;
    Kiln__RunningRank *rrp = &rr;
    kiln__heartbeat_response__init(rs);
    rq.worker_id = (char *)wid;
    if (job) {
        rr.job_id = (char *)job;
        rr.attempt = attempt;
        rq.running = &rrp;
        rq.n_running = 1;
    }
    cr_assert_eq(svc_agent_heartbeat(svc, wid, &rq, &arena, rs, &err), 0, "heartbeat: %s", err.message);
    return rs;
}

json_t *get(const char *id)
{
    json_t *j = NULL;
    cr_assert_eq(svc_job_get(svc, svc_caller_kilnd(), id, &j, &err), 0, "get: %s", err.message);
    return j;
}

const char *state_of(json_t *j) { return json_string_value(json_object_get(j, "state")); }

/* Polls until the job is in `state`; returns the job (caller decrefs). */
json_t *wait_state(const char *id, const char *state, int timeout_ms)
{
    int64_t until = kiln_mono_us() + (int64_t)KILN_MAX(timeout_ms, WAIT_MIN_MS) * 1000;
    for (;;) {
        json_t *j = get(id);
        if (strcmp(state_of(j), state) == 0)
            return j;
        if (kiln_mono_us() >= until)
            cr_assert_fail("job %s is %s (%s), wanted %s", id, state_of(j),
                           json_string_value(json_object_get(j, "reason")), state);
        json_decref(j);
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
    }
}

/* Polls until the job is in `state` with a reason that holds one of needles[0..n) (a waiting job's
 * reason is written after the pass that placed the others commits); returns the job. */
json_t *wait_reason(const char *id, const char *state, const char *const *needles, int n, int timeout_ms)
{
    int64_t until = kiln_mono_us() + (int64_t)KILN_MAX(timeout_ms, WAIT_MIN_MS) * 1000;
    for (;;) {
        json_t *j = get(id);
        const char *reason = json_string_value(json_object_get(j, "reason"));
        bool found = false;
        for (int k = 0; k < n && reason && !found; k++)
            found = strstr(reason, needles[k]) != NULL;
        if (strcmp(state_of(j), state) == 0 && found)
            return j;
        if (kiln_mono_us() >= until)
            cr_assert_fail("job %s is %s (%s), wanted %s with a reason naming \"%s\"%s", id, state_of(j),
                           reason, state, needles[0], n > 1 ? " or another" : "");
        json_decref(j);
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
    }
}

void status(const char *wid, const char *job, int attempt, bool started, const char *reason)
{
    Kiln__RankStatus rq = KILN__RANK_STATUS__INIT;
    rq.worker_id = (char *)wid;
    rq.job_id = (char *)job;
    rq.attempt = attempt;
    rq.started = started;
    rq.reason = (char *)(reason ? reason : "");
    cr_assert_eq(svc_agent_rank_status(svc, wid, &rq, &err), 0, "rank status: %s", err.message);
}

void status_port(const char *wid, const char *job, int attempt, int port)
{
    Kiln__RankStatus rq = KILN__RANK_STATUS__INIT;
    rq.worker_id = (char *)wid;
    rq.job_id = (char *)job;
    rq.attempt = attempt;
    rq.started = true;
    rq.reason = (char *)"";
    rq.master_port = port;
    cr_assert_eq(svc_agent_rank_status(svc, wid, &rq, &err), 0, "rank status: %s", err.message);
}

void rank_exit(const char *wid, const char *job, int attempt, int rank, int code, const char *reason)
{
    Kiln__RankExit rq = KILN__RANK_EXIT__INIT;
    rq.worker_id = (char *)wid;
    rq.job_id = (char *)job;
    rq.attempt = attempt;
    rq.rank = rank;
    rq.exit_code = code;
    rq.reason = (char *)(reason ? reason : "");
    cr_assert_eq(svc_agent_rank_exit(svc, wid, &rq, &err), 0, "rank exit: %s", err.message);
}

void rank_killed(const char *wid, const char *job, int attempt, int rank, int sig, const char *reason)
{
    Kiln__RankExit rq = KILN__RANK_EXIT__INIT;
    rq.worker_id = (char *)wid;
    rq.job_id = (char *)job;
    rq.attempt = attempt;
    rq.rank = rank;
    rq.exit_code = -1;
    rq.signal = sig;
    rq.reason = (char *)(reason ? reason : "");
    cr_assert_eq(svc_agent_rank_exit(svc, wid, &rq, &err), 0, "rank exit: %s", err.message);
}

void push_logs(const char *wid, const char *job, int attempt, int rank, int first, int n)
{
    push_logs_seq(wid, job, attempt, rank, first, n, 0, 0);
}

void push_logs_seq(const char *wid, const char *job, int attempt, int rank, int first, int n, uint64_t stream,
                   uint64_t seq)
{
    Kiln__LogLine *lines = calloc((size_t)n, sizeof(*lines));
    Kiln__LogLine **ptrs = calloc((size_t)n, sizeof(*ptrs));
    char (*text)[48] = calloc((size_t)n, 48);
    for (int i = 0; i < n; i++) {
        kiln__log_line__init(&lines[i]);
        lines[i].rank = rank;
        lines[i].stream = "stdout";
        snprintf(text[i], 48, "line %d", first + i);
        lines[i].line = text[i];
        ptrs[i] = &lines[i];
    }
    Kiln__LogBatch b = KILN__LOG_BATCH__INIT;
    b.worker_id = (char *)wid;
    b.job_id = (char *)job;
    b.attempt = attempt;
    b.lines = ptrs;
    b.n_lines = (size_t)n;
    b.stream_id = stream;
    b.batch_seq = seq;
    cr_assert_eq(svc_agent_logs(svc, wid, &b, &err), 0, "logs: %s", err.message);
    free(lines);
    free(ptrs);
    free(text);
}

void push_metrics(const char *wid, const char *job, int attempt, int step0, int nsteps)
{
    int n = 2 * nsteps;
    Kiln__MetricPoint *pts = calloc((size_t)n, sizeof(*pts));
    Kiln__MetricPoint **ptrs = calloc((size_t)n, sizeof(*ptrs));
    static int64_t t0;
    if (!t0)
        t0 = kiln_now_us() - 1000000;
    for (int i = 0; i < n; i++) {
        kiln__metric_point__init(&pts[i]);
        pts[i].name = i % 2 ? "tokens_per_s" : "train_loss";
        pts[i].step = step0 + i / 2;
        pts[i].value = i % 2 ? 1000.0 : 3.0 - 0.01 * (step0 + i / 2);
        pts[i].time_us = t0 + (int64_t)(step0 + i / 2) * 10000; /* 100 steps/s */
        ptrs[i] = &pts[i];
    }
    Kiln__MetricBatch b = KILN__METRIC_BATCH__INIT;
    b.worker_id = (char *)wid;
    b.job_id = (char *)job;
    b.attempt = attempt;
    b.points = ptrs;
    b.n_points = (size_t)n;
    cr_assert_eq(svc_agent_metrics(svc, wid, &b, &err), 0, "metrics: %s", err.message);
    free(pts);
    free(ptrs);
}

/* Events of a job as "FROM>TO" strings joined by spaces. */
void events_str(const char *id, char *out, size_t n)
{
    json_t *ev = NULL;
    cr_assert_eq(svc_job_events(svc, svc_caller_kilnd(), id, &ev, &err), 0);
    size_t len = 0;
    out[0] = '\0';
    json_t *arr = json_object_get(ev, "events");
    for (size_t i = 0; i < json_array_size(arr); i++)
        len += (size_t)snprintf(out + len, n - len, "%s%s", i ? " " : "",
                                json_string_value(json_object_get(json_array_get(arr, i), "to_state")));
    json_decref(ev);
}

/* Registers workers and runs a job to RUNNING. */
void run_job(int nodes, int attempts, char wids[][64], char *job)
{
    for (int k = 0; k < nodes; k++)
        reg(NULL, 1, "cpu", wids[k]);
    submit(spec(nodes, 1, "cpu", 0, attempts), NULL, job, NULL);
    json_decref(wait_state(job, "SCHEDULED", 5000));
    /* Node 0's agent gets its assignment first and reports the port it picked; then the others. */
    bool got[64] = {false};
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < nodes; k++) {
            if (got[k])
                continue;
            Kiln__HeartbeatResponse *r = hb(wids[k], NULL, 0);
            if (r->n_assignments != 1)
                continue;
            got[k] = true;
            if (r->assignments[0]->node_rank == 0)
                status_port(wids[k], job, 1, 29500);
            else
                status(wids[k], job, 1, true, NULL);
        }
    for (int k = 0; k < nodes; k++)
        cr_assert(got[k], "worker %s got no assignment", wids[k]);
    /* Return the workers in node-rank order: wids[k] runs rank k. */
    json_t *j = wait_state(job, "RUNNING", 1000);
    json_t *ws = json_object_get(j, "workers");
    cr_assert_eq(json_array_size(ws), (size_t)nodes);
    for (int k = 0; k < nodes; k++)
        kiln_strlcpy(wids[k], json_string_value(json_array_get(ws, (size_t)k)), 64);
    json_decref(j);
}

void slots_all_free(void)
{
    json_t *ws = NULL;
    cr_assert_eq(svc_workers_list(svc, svc_caller_kilnd(), &ws, &err), 0);
    json_t *arr = json_object_get(ws, "workers");
    for (size_t i = 0; i < json_array_size(arr); i++)
        cr_assert_eq(json_integer_value(json_object_get(json_array_get(arr, i), "slots_free")),
                     json_integer_value(json_object_get(json_array_get(arr, i), "slots")));
    json_decref(ws);
}
