/* service.h - kiln's control-plane logic: job submission and validation, the job state machine,
 * the scheduler, worker liveness, and ingestion of logs and metrics from agents. No I/O framework
 * here: api/ decodes requests and calls these functions; store/ does the database work.
 * All functions are thread-safe unless noted (api threads call them concurrently). */
#ifndef KILN_SERVICE_H
#define KILN_SERVICE_H

#include "base/base.h"
#include "proto/kiln.pb-c.h"

typedef struct svc svc_t;

typedef struct svc_config {
    const char *database_url;      /* libpq connection string */
    int heartbeat_interval_ms;     /* told to agents (default 1000) */
    int heartbeat_timeout_ms;      /* silence after which a worker is DEAD (default 10000) */
    int sched_interval_ms;         /* scheduler tick when nothing wakes it (default 500) */
    int db_pool_size;              /* database connections (default 8) */
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

#endif /* KILN_SERVICE_H */
