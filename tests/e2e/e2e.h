/* e2e.h - helpers of the end-to-end suite: a real kilnd on a fresh database plus two real
 * kiln-agent processes per test (own ports, own work dirs), REST calls returning JSON, waits,
 * job specs for the tiny GPT, and running the `kiln` CLI or the Python SDK tests against them.
 * Private to tests/e2e; every process started here is killed by e2e_cluster_stop(). */
#ifndef KILN_TESTS_E2E_H
#define KILN_TESTS_E2E_H

#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <sys/types.h>

#include "tests/common/harness.h"

#define E2E_AGENTS 2

typedef struct e2e_cluster {
    char *db_url;                 /* heap */
    char dir[128];                /* temporary directory: logs and agent work dirs */
    int http_port, grpc_port;     /* replica 0's */
    char url[64];                 /* https://127.0.0.1:PORT of the replica the REST helpers call */
    pid_t kilnd;                  /* replica 0 */
    /* A second kilnd on the same database (e2e_setup_replicas), its log kilnd1.log. */
    int nkilnd;
    pid_t kilnd1;
    int http_port1, grpc_port1;
    char url0[64], url1[64];      /* each replica's REST URL */
    char own_pg[128];             /* the cluster's own PostgreSQL directory (e2e_setup_chaos), or "" */
    pid_t agents[E2E_AGENTS];
    int agent_slots[E2E_AGENTS];
    int metrics_port[E2E_AGENTS]; /* each agent's --metrics-addr port (/metrics, /healthz) */
    char work_dir[E2E_AGENTS][160];
    char worker_id[E2E_AGENTS][128]; /* filled by e2e_cluster_start from GET /v1/workers */
    int heartbeat_timeout_ms;     /* what kilnd was told (or its default) */
    char tls_dir[256];            /* th_tls_dir(): ca.pem, server.pem/.key, agent.pem/.key */
    char admin_token[128];        /* the bootstrap cluster admin's (th_http sends it) */
    char join_file[300];
    bool passed;                  /* set by the test at its end; otherwise log tails are printed */
} e2e_cluster_t;

/* The cluster of the running test (each Criterion test runs in its own process). */
extern e2e_cluster_t *e2e_cl;

/* Criterion hooks: .init = e2e_setup starts kilnd + 2 agents and waits until both workers are
 * ALIVE (failing the test with the logs if not); .fini = e2e_teardown stops everything. */
void e2e_setup(void);
/* Like e2e_setup, with kilnd told a short heartbeat timeout when it has the flag. */
void e2e_setup_fast_heartbeat(void);
/* Like e2e_setup, with the agents' collective watchdog (--comm-watchdog-s, the ranks'
 * KILN_COMM_WATCHDOG_S) at E2E_WATCHDOG_S seconds. */
#define E2E_WATCHDOG_S 3
void e2e_setup_short_watchdog(void);
/* Like e2e_setup, with agents that upload artifacts in 4 KiB chunks and pause 150 ms after each
 * (KILN_AGENT_UPLOAD_CHUNK_KB, KILN_AGENT_UPLOAD_DELAY_MS): an upload long enough to cut. kilnd
 * keeps artifacts in <dir>/artifacts in every set-up. */
void e2e_setup_slow_uploads(void);
/* Like e2e_setup, with kilnd --agent-approval: both workers register PENDING (ALIVE, but given no
 * work until a cluster admin approves them). */
void e2e_setup_approval(void);
/* Like e2e_setup, with kilnd taking 11 registrations a minute from one address, one at a time:
 * the second agent is refused at first and gets in after backing off. */
void e2e_setup_register_limit(void);
/* Like e2e_setup, with kilnd --tune-promoted-restart: a promoted hyperband trial trains again from
 * step 0 instead of resuming. */
void e2e_setup_promoted_restart(void);
/* Like e2e_setup (and e2e_setup_replicas), with kilnd telling agents to heartbeat only every
 * E2E_SLOW_HEARTBEAT_MS (heartbeat timeout 300 s): work that arrives sooner was pushed. */
#define E2E_SLOW_HEARTBEAT_MS "60000"
void e2e_setup_slow_heartbeat(void);
void e2e_setup_replicas_slow_heartbeat(void);
void e2e_teardown(void);
/* (Re)starts kilnd on the cluster's database and ports and waits for /readyz; SIGKILLs it. */
void e2e_kilnd_start(void);
void e2e_kilnd_kill(void);
/* Two kilnd replicas on one database (heartbeat timeout 3 s) and two agents that know both
 * (--server A,B); the REST helpers call replica 0. */
void e2e_setup_replicas(void);
/* Replica i (0 or 1): (re)start it and wait for /readyz; send it a signal (SIGKILL also reaps it). */
void e2e_replica_start(int i);
void e2e_replica_signal(int i, int sig);
pid_t e2e_replica_pid(int i);
/* The REST helpers (e2e_http and those built on it) call replica i from now on. */
void e2e_use_replica(int i);
/* The replica whose /healthz says it leads, waiting up to timeout_ms for one to; -1 if none. */
int e2e_leader(long timeout_ms);
/* The replicas that say they lead right now, as a bit mask (bit i: replica i). */
int e2e_leaders(void);
/* SIGKILLs agent i (its ranks die with it) and starts it again with the same arguments and work
 * dir, as a supervisor restarting it would. */
void e2e_agent_restart(int i);
/* e2e_agent_restart with --server naming replica `replica` (0 or 1) alone, from now on. */
void e2e_agent_restart_on(int i, int replica);
/* e2e_setup_replicas on a PostgreSQL of the test's own (scripts/pg.sh), so that it can crash
 * without harming other tests; e2e_pg_crash stops it as a crash would, e2e_pg_resume starts it. */
void e2e_setup_chaos(void);
void e2e_pg_crash(void);
void e2e_pg_resume(void);
/* Sends sig to agent i (SIGKILL also reaps it; start it again with e2e_agent_restart). */
void e2e_agent_signal(int i, int sig);

/* Marks the test as passed (call last): teardown then removes the temporary directory. */
void e2e_pass(void);

/* REST: method on path ("/v1/jobs"), body text or NULL, optional header line. Returns the parsed
 * reply (caller owns; an empty JSON object when the body is not JSON) and sets *status. Fails
 * the test when kilnd does not answer. */
json_t *e2e_http(const char *method, const char *path, const char *body, const char *header, long *status);
/* GET path expecting 200; fails the test otherwise. Caller owns the result. */
json_t *e2e_get(const char *path);

/* gRPC: one call of method ("/kiln.TrainingService/GetJob") with request (proto JSON; stolen) as
 * the admin, over TLS, by tests/grpc/grpc_client.py (Python's grpcio). Returns {code, details,
 * response} (a server stream's messages: "response" is their list); caller owns. */
json_t *e2e_grpc(const char *method, json_t *request);

/* Submits spec text, expects 201; returns the job (caller owns). */
json_t *e2e_submit(const char *spec);
/* Polls the job until its state is one of states (a set as tests/common/harness.h's th_state_in
 * takes: "RUNNING", TH_JOB_ENDED); returns it (caller owns) or fails the test after timeout_ms,
 * printing the last reply. */
json_t *e2e_wait_state(const char *job_id, const char *states, long timeout_ms);
/* Polls until the job's progress.step >= step (and it is RUNNING); fails after timeout_ms. */
json_t *e2e_wait_step(const char *job_id, long step, long timeout_ms);
/* Makes "the job is still running" certain rather than a race the tiny model (thousands of
 * steps a second) can win: stops the job's rank processes (SIGSTOP), waits until kilnd's view
 * of them settles, and lets them run 20 ms at a time until kilnd reports the job RUNNING at
 * progress.step >= step. Returns the job (caller owns) with the ranks still stopped, their pids
 * in ranks[] (room for E2E_MAX_RANKS) and *n_ranks; e2e_thaw() continues them. Fails the test
 * after timeout_ms, or when the job ends first. */
#define E2E_MAX_RANKS 16
json_t *e2e_freeze_at_step(const char *job_id, long step, long timeout_ms, pid_t *ranks, int *n_ranks);
void e2e_thaw(const pid_t *ranks, int n_ranks);
/* The pid of the job's kiln-train process with KILN_RANK=rank (from /proc), or -1. */
pid_t e2e_rank_pid(const char *job_id, int rank);
/* Whether pid no longer runs (no such process, or a zombie). */
bool e2e_pid_gone(pid_t pid);
/* The job's events array (caller owns the {"events": [...]} object). */
json_t *e2e_events(const char *job_id);
/* "QUEUED,SCHEDULED,..." of an events reply, into buf. */
char *e2e_event_states(const json_t *events, char *buf, size_t n);

/* Absolute path of data/tinyshakespeare.txt (KILN_ROOT, else the current directory). */
const char *e2e_data_path(void);
/* Repository root (KILN_ROOT, else the current directory). */
const char *e2e_root(void);
/* A JSON object's string member ("" when missing), integer member (0 when missing), and the
 * value as compact text for assertion messages (a static buffer, cut at 4,000 bytes). */
const char *e2e_jstr(const json_t *o, const char *key);
json_int_t e2e_jint(const json_t *o, const char *key);
char *e2e_dump(const json_t *j);
/* A tiny GPT job spec as JSON text (caller frees): name, max_steps, nodes x slots_per_node,
 * and the global batch size. */
char *e2e_spec(const char *name, int max_steps, int nodes, int slots_per_node, int batch);

/* Runs a program (argv[0] a path) with extra environment entries, waits at most timeout_ms;
 * returns its exit status (-1 when it did not exit normally) with stdout and stderr in *out
 * and *err (caller frees; may be NULL to discard). */
int e2e_run(char *const argv[], char *const env[], char **out, char **err, long timeout_ms);
/* The environment a client of the cluster needs: KILN_URL, KILN_TOKEN (the admin's) and
 * KILN_TLS_CA, as a NULL-terminated list with room for `extra` more entries after them (static
 * storage, rebuilt by each call). */
char **e2e_client_env(int extra);
/* Runs build/bin/kiln with e2e_client_env(); args after "kiln", NULL-terminated. */
int e2e_kiln(char **out, char **err, ...) __attribute__((sentinel));
/* Starts build/bin/kiln in the background, stdout to out_path and stderr to err_path; returns
 * its pid. e2e_wait_exit() waits for it (at most timeout_ms, then kills it) and returns its exit
 * status, or -1. */
pid_t e2e_kiln_bg(const char *out_path, const char *err_path, ...) __attribute__((sentinel));
int e2e_wait_exit(pid_t pid, long timeout_ms);
/* Reads a whole file (caller frees; "" when missing). */
char *e2e_slurp(const char *path);

/* Index of the agent whose work dir holds the job (-1 when none). */
int e2e_agent_of_job(const char *job_id);
/* Number of regular files under dir (recursively). */
int e2e_count_files(const char *dir);

/* Prints the tails of kilnd's and the agents' logs to stderr. */
void e2e_dump_logs(void);

#endif
