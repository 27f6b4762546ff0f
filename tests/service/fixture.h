/* fixture.h - shared set-up and agent-side helpers for the service suites (fixture.c). */
#ifndef KILN_TESTS_SERVICE_FIXTURE_H
#define KILN_TESTS_SERVICE_FIXTURE_H

#include "service/service.h"
#include "tests/common/harness.h"

extern svc_t *svc;        /* the service under test */
extern char *url;         /* its database */
extern kiln_err_t err;
extern arena_t arena;     /* for heartbeat/register replies */

void start(int hb_timeout_ms);
void setup(void);                 /* heartbeat timeout 10 s */
void setup_short_timeout(void);   /* heartbeat timeout 1.5 s */
/* --preempt-protect-after of the service start() makes (0: the default, 3) */
extern int fixture_protect_after;
void setup_protect_after_1(void); /* setup, with jobs protected after 1 preemption */
/* --sched-default-runtime-s of the service start() makes (0: none) */
extern int fixture_default_runtime_s;
void setup_default_runtime_1(void); /* setup, with a default run time of 1 s */
extern int fixture_search_timeout_ms;
void setup_search_timeout_1ms(void); /* setup, with a search's statements cut off after 1 ms */
void teardown(void);

/* A valid mlp spec (new reference). */
json_t *spec(int nodes, int slots_per_node, const char *slot_type, int priority, int attempts);
/* Submits (consumes sp); id_out has 40 bytes. */
void submit(json_t *sp, const char *key, char *id_out, bool *created);
/* Registers a worker (want_id NULL: a new id); id_out has 64 bytes. */
void reg(const char *want_id, int slots, const char *type, char *id_out);
/* One heartbeat; job/attempt: the one (job, attempt) the worker reports running, or NULL. */
Kiln__HeartbeatResponse *hb(const char *wid, const char *job, int attempt);
json_t *get(const char *id);
const char *state_of(json_t *j);
/* Polls until the job is in state; returns it (caller decrefs); fails the test on timeout.
 * timeout_ms is what a quiet machine needs; the wait goes on for at least WAIT_MIN_MS of wall
 * time, what a loaded machine running the sanitizer build may need (a passing test is no slower). */
#define WAIT_MIN_MS 30000
json_t *wait_state(const char *id, const char *state, int timeout_ms);
json_t *wait_reason(const char *id, const char *state, const char *const *needles, int n, int timeout_ms);
void status(const char *wid, const char *job, int attempt, bool started, const char *reason);
/* Started, with the rendezvous port the agent picked (as node 0 reports it). */
void status_port(const char *wid, const char *job, int attempt, int port);
void rank_exit(const char *wid, const char *job, int attempt, int rank, int code, const char *reason);
/* The agent reports that a rank was killed by signal sig (exit code -1). */
void rank_killed(const char *wid, const char *job, int attempt, int rank, int sig, const char *reason);
void push_logs(const char *wid, const char *job, int attempt, int rank, int first, int n);
/* push_logs as a numbered batch (stream_id, batch_seq), as agents send them */
void push_logs_seq(const char *wid, const char *job, int attempt, int rank, int first, int n, uint64_t stream,
                   uint64_t seq);
void push_metrics(const char *wid, const char *job, int attempt, int step0, int nsteps);
/* The job's events as "STATE STATE ..." (to_state of each, oldest first). */
void events_str(const char *id, char *out, size_t n);
/* Asserts every worker's slots are free. */
void slots_all_free(void);
/* Registers `nodes` 1-slot workers and runs a job on them to RUNNING; wids[k] runs rank k. */
void run_job(int nodes, int attempts, char wids[][64], char *job);

#endif
