/* service.h - kiln's control-plane logic: job submission and validation, the job state machine,
 * the scheduler, worker liveness, and ingestion of logs and metrics from agents. No I/O framework
 * here: api/ decodes requests and calls these functions; store/ does the database work.
 * All functions are thread-safe unless noted (api threads call them concurrently). */
#ifndef KILN_SERVICE_H
#define KILN_SERVICE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"
#include "proto/kiln.pb-c.h"

typedef struct svc svc_t;

typedef struct svc_config {
    const char *database_url;      /* libpq connection string */
    int heartbeat_interval_ms;     /* told to agents (default 1000) */
    int heartbeat_timeout_ms;      /* silence after which a worker is DEAD (default 10000) */
    int sched_interval_ms;         /* scheduler tick when nothing wakes it (default 500) */
    int db_pool_size;              /* database connections (default 16) */
    /* Added by the control-plane implementation (zero means the default): */
    const char *migrations_dir;    /* NULL: the migrations embedded in the binary */
    int stop_grace_ms;             /* SIGTERM -> SIGKILL grace told in stop orders (default 10000) */
} svc_config_t;

/* Connects to PostgreSQL, applies migrations, starts the scheduler and liveness threads.
 * Caller owns *out; free with svc_destroy(). Returns 0, KILN_EDB (err says why). */
int svc_create(const svc_config_t *cfg, svc_t **out, kiln_err_t *err);
/* Stops background threads, closes connections. Accepts NULL. */
void svc_destroy(svc_t *s);

/* ---- agent-facing operations (called by api/'s AgentService gRPC server) -------------------
 * Output messages are initialised by the caller with their KILN__..._INIT macro; everything the
 * service puts in them (strings, repeated fields, nested messages) is allocated from `arena`
 * and lives until the caller resets it. Errors: KILN_EINVAL (bad request), KILN_ENOTFOUND
 * (unknown worker or job), KILN_EDB (database unavailable). */

/* Registers (or re-registers) a worker; fills worker_id and heartbeat timings in *out. */
int svc_agent_register(svc_t *s, const Kiln__RegisterRequest *req, arena_t *arena,
                       Kiln__RegisterResponse *out, kiln_err_t *err);
/* Records liveness; returns assignments not yet delivered to this worker and stop orders for
 * ranks it runs that should stop. Sets out->reregister when the worker id is unknown. */
int svc_agent_heartbeat(svc_t *s, const Kiln__HeartbeatRequest *req, arena_t *arena,
                        Kiln__HeartbeatResponse *out, kiln_err_t *err);
/* An agent started (or could not start) all ranks of its assignment. */
int svc_agent_rank_status(svc_t *s, const Kiln__RankStatus *req, kiln_err_t *err);
/* Appends log lines (batched COPY) and fans them out to live followers. */
int svc_agent_logs(svc_t *s, const Kiln__LogBatch *batch, kiln_err_t *err);
/* Appends metric points (batched COPY), updates the job's latest metrics and progress. */
int svc_agent_metrics(svc_t *s, const Kiln__MetricBatch *batch, kiln_err_t *err);
/* A rank exited; decides the job's next state when all ranks of the attempt are accounted for
 * (all 0 -> COMPLETED; a stop was requested -> STOPPED; any failure -> FAILED with the rank and
 * reason, after stopping the other ranks). */
int svc_agent_rank_exit(svc_t *s, const Kiln__RankExit *req, kiln_err_t *err);


/* ---- client-facing operations (REST, and gRPC TrainingService) --------------------------------
 * Jobs, events, log lines, metric series and workers travel as jansson objects shaped exactly as
 * docs/contracts.md shows, so REST passes them through and gRPC converts them. Results are new
 * references: caller owns *out and releases it with json_decref(). On error *out is NULL and err
 * carries status, message, field and hint. */

/* Validates spec (spec/spec.h), checks it can ever fit the registered cluster, stores the job as
 * QUEUED and wakes the scheduler. "Can ever fit" is judged against the ALIVE workers' total slots;
 * with no alive worker at all the job is accepted and queued with the reason "waiting for
 * workers" (agents may simply not have started yet). With a non-NULL idempotency_key, a second
 * call with the same key returns the job the first call created and sets *out_created = false.
 * Errors: KILN_EINVAL (bad spec, err->field names it), KILN_EUNFIT (can never fit), KILN_EDB. */
int svc_job_create(svc_t *s, const json_t *spec, const char *idempotency_key, json_t **out,
                   bool *out_created, kiln_err_t *err);
int svc_job_get(svc_t *s, const char *id, json_t **out, kiln_err_t *err);

typedef struct svc_job_filter {
    const char *status;      /* comma-separated states ("RUNNING,QUEUED") or NULL */
    const char *tag;         /* "key:value" or "key", or NULL */
    int page_size;           /* 0: 50; at most 500 */
    const char *page_token;  /* opaque, from a previous page, or NULL */
} svc_job_filter_t;
/* *out = {"jobs": [...], "next_page_token": "..."}, newest first. */
int svc_job_list(svc_t *s, const svc_job_filter_t *f, json_t **out, kiln_err_t *err);
/* Requests a stop: QUEUED/SCHEDULED jobs become STOPPED at once, running ones STOPPING (agents
 * get stop orders). Stopping a finished job is KILN_ESTATE. *out is the job after the change. */
int svc_job_stop(svc_t *s, const char *id, const char *reason, json_t **out, kiln_err_t *err);
/* *out = {"events": [...]}, oldest first. */
int svc_job_events(svc_t *s, const char *id, json_t **out, kiln_err_t *err);

typedef struct svc_log_query {
    int rank;                /* -1: every rank */
    int64_t since_us;        /* only lines at or after this Unix time (0: from the start) */
    int64_t after_seq;       /* only lines with seq > after_seq (0: from the start) */
    int limit;               /* 0: 1000; at most 10000 */
} svc_log_query_t;
/* *out = {"lines": [...], "next_since_seq": N}. */
int svc_job_logs(svc_t *s, const char *id, const svc_log_query_t *q, json_t **out, kiln_err_t *err);
/* *out = {"metrics": [{"name": ..., "points": [...]}]}; name NULL means every metric;
 * max_points 0 means 1000 (each series downsampled, first and last point kept). */
int svc_job_metrics(svc_t *s, const char *id, const char *name, int max_points, json_t **out,
                    kiln_err_t *err);
/* *out = {"workers": [...]}. */
int svc_workers_list(svc_t *s, json_t **out, kiln_err_t *err);
/* 0 when the database answers and every migration is applied; KILN_EUNAVAIL otherwise. */
int svc_ready(svc_t *s, kiln_err_t *err);

/* ---- live log following ------------------------------------------------------------------------
 * A follower sees every line ingested for its job after svc_follow_open() returned (history is
 * read first with svc_job_logs), then an end notice once the job is in a terminal state. Lines
 * are never lost: a follower that falls behind its in-memory buffer is refilled from the
 * database. Producers never block on followers. */
typedef struct svc_follow svc_follow_t;
/* Called from an ingesting thread when new lines or the end are ready; must not block. */
typedef void (*svc_follow_wake_fn)(void *ud);

/* rank -1 follows every rank. after_seq: lines with seq <= after_seq are not delivered (pass the
 * last seq the caller already has). Caller owns *out; close with svc_follow_close(). */
int svc_follow_open(svc_t *s, const char *job_id, int rank, int64_t after_seq,
                    svc_follow_wake_fn wake, void *ud, svc_follow_t **out, kiln_err_t *err);
/* Non-blocking. Appends up to max pending lines (JSON objects) to the array `lines` and returns
 * how many. When the job has ended and nothing is pending, sets *ended = true and *end_info to
 * {"state": ..., "reason": ...} (caller owns it). Not thread-safe per follower. */
int svc_follow_read(svc_follow_t *f, json_t *lines, int max, bool *ended, json_t **end_info);
/* Accepts NULL. Safe to call while producers run. */
void svc_follow_close(svc_follow_t *f);

/* ---- job states ----------------------------------------------------------------------------
 * The job state machine (service/state.c). Values match proto's JobState numbers. */
typedef enum svc_job_state {
    JOB_STATE_NONE = 0,          /* before the job exists (the first event has no from_state) */
    JOB_STATE_QUEUED = 1,
    JOB_STATE_SCHEDULED = 2,
    JOB_STATE_STARTING = 3,
    JOB_STATE_RUNNING = 4,
    JOB_STATE_STOPPING = 5,
    JOB_STATE_RESTARTING = 6,
    JOB_STATE_COMPLETED = 7,
    JOB_STATE_FAILED = 8,
    JOB_STATE_STOPPED = 9,
} svc_job_state_t;

/* "QUEUED" ... ; "" for JOB_STATE_NONE or an unknown value. Static storage. */
const char *svc_state_name(svc_job_state_t st);
/* Parses a state name (case-sensitive, as in the API); JOB_STATE_NONE when unknown. */
svc_job_state_t svc_state_parse(const char *name);
/* Whether the state machine allows from -> to. */
bool svc_state_legal(svc_job_state_t from, svc_job_state_t to);
/* COMPLETED, FAILED, STOPPED. */
bool svc_state_terminal(svc_job_state_t st);

/* ---- gang placement (service/sched.c), a pure function for tests --------------------------------
 * A job needs `nodes` distinct workers of its slot type, each with `slots_per_node` free slots,
 * all at once. Among the workers that fit, the ones with the fewest free slots are chosen (best
 * fit), so big holes stay free for big jobs; ties go to the lower index. */
#define SCHED_MAX_NODES 256
typedef struct sched_worker {
    const char *id;
    const char *slot_type;   /* "cpu" | "gpu" */
    int slots;               /* total */
    int slots_free;
} sched_worker_t;
typedef struct sched_request {
    int nodes, slots_per_node;
    const char *slot_type;
} sched_request_t;
typedef struct sched_placement {
    int nodes;
    int worker[SCHED_MAX_NODES]; /* index into the workers array of node rank i */
} sched_placement_t;
/* Returns true and fills *out when the whole gang fits the free slots now; false (out->nodes = 0)
 * otherwise. Never a partial placement. */
bool sched_place(const sched_worker_t *workers, int n, const sched_request_t *req,
                 sched_placement_t *out);
/* Whether the request could ever fit these workers (their total slots, all free). */
bool sched_fits(const sched_worker_t *workers, int n, const sched_request_t *req);

#endif /* KILN_SERVICE_H */
