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
    /* Authentication. */
    const char *bootstrap_token_file; /* first start on an empty database: the admin's token */
    const char *join_token_file;   /* the token agents register with (created when missing) */
    bool auth_disabled;            /* --no-auth: every caller is a cluster admin, agents need
                                      no token (benchmarks and trusted single-user machines) */
} svc_config_t;

/* Connects to PostgreSQL, applies migrations, starts the scheduler and liveness threads.
 * Caller owns *out; free with svc_destroy(). Returns 0, KILN_EDB (err says why). */
int svc_create(const svc_config_t *cfg, svc_t **out, kiln_err_t *err);
/* Stops background threads, closes connections. Accepts NULL. */
void svc_destroy(svc_t *s);

/* ---- callers --------------------------------------------------------------------------------
 * Every client-facing operation takes the caller (who): a user authenticated by an API token,
 * with its project roles. Projects are the tenant boundary: a job in a project the caller has no
 * role in does not exist for it (KILN_ENOTFOUND, never KILN_EPERM), and lists leave it out. */
typedef enum svc_role {
    SVC_ROLE_NONE = 0,
    SVC_ROLE_VIEWER = 1,   /* read jobs, events, logs, metrics, artifacts, members */
    SVC_ROLE_EDITOR = 2,   /* also submit and stop jobs */
    SVC_ROLE_ADMIN = 3,    /* also manage the project's members */
} svc_role_t;

typedef struct svc_project_role {
    const char *project;
    svc_role_t role;
} svc_project_role_t;

typedef struct svc_caller {
    const char *user;               /* "" for kilnd itself */
    const char *token_id;           /* the token the request carried ("" without one) */
    int64_t token_expires_us;       /* 0: never */
    bool cluster_admin;             /* manages users, projects, workers; admin of every project */
    const svc_project_role_t *roles;/* the projects the user is a member of, sorted by name */
    int nroles;
} svc_caller_t;

/* "viewer" | "editor" | "admin" ("" for none); parse gives SVC_ROLE_NONE for anything else. */
const char *svc_role_name(svc_role_t r);
svc_role_t svc_role_parse(const char *s);
/* The caller's role in project (SVC_ROLE_ADMIN for cluster admins). */
svc_role_t svc_caller_role(const svc_caller_t *who, const char *project);
/* kilnd acting on its own (the liveness checker stopping an overdue job): allowed everything,
 * recorded with no actor. Static storage. */
const svc_caller_t *svc_caller_kilnd(void);

/* Authenticates a bearer token. On success *out is the caller, its strings and roles allocated
 * from arena. KILN_EUNAUTH (missing, unknown, expired or revoked token; err says which and how
 * to get one) or KILN_EDB. Answers are cached for two seconds; a revocation or role change on
 * this kilnd applies at once, on other kilnd within those seconds. */
int svc_auth_user(svc_t *s, const char *token, arena_t *arena, svc_caller_t *out, kiln_err_t *err);
/* Whether token is the cluster's join token (constant-time). */
bool svc_auth_join(svc_t *s, const char *token);
/* Authenticates an agent's credential: the worker it belongs to, into worker_id (size n; "" with
 * authentication off). KILN_EUNAUTH or KILN_EDB. */
int svc_auth_agent(svc_t *s, const char *credential, char *worker_id, size_t n, kiln_err_t *err);

/* ---- identity and tenancy (identity.c) --------------------------------------------------------
 * Results are JSON shaped as docs/contracts.md shows; caller owns *out. Cluster admins manage
 * users and projects; a user manages its own tokens; a project admin manages its members. */

/* {"user", "cluster_admin", "projects": [{"project", "role"}], "token_id", "token_expires_at"} */
int svc_whoami(svc_t *s, const svc_caller_t *who, json_t **out, kiln_err_t *err);
/* Cluster admins only. *out = the user. KILN_EEXIST when the name is taken. */
int svc_user_create(svc_t *s, const svc_caller_t *who, const char *name, bool cluster_admin,
                    json_t **out, kiln_err_t *err);
/* Cluster admins only. *out = {"users": [...]}. */
int svc_users_list(svc_t *s, const svc_caller_t *who, json_t **out, kiln_err_t *err);
/* A new token for user (the caller itself, or anyone for a cluster admin). expires_in_s 0: never
 * expires. *out = {"id", "token", "expires_at"}: the only time the secret is shown. */
int svc_token_create(svc_t *s, const svc_caller_t *who, const char *user, int64_t expires_in_s,
                     const char *description, json_t **out, kiln_err_t *err);
/* *out = {"tokens": [...]} (no secrets). */
int svc_tokens_list(svc_t *s, const svc_caller_t *who, const char *user, json_t **out, kiln_err_t *err);
/* Revokes a token of the caller's own (any token for a cluster admin); *out = the token. */
int svc_token_revoke(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err);
/* Cluster admins only. *out = the project. */
int svc_project_create(svc_t *s, const svc_caller_t *who, const char *name, json_t **out, kiln_err_t *err);
/* *out = {"projects": [{"name", "created_at", "created_by", "role"}]}: every project for a cluster
 * admin, else those the caller is a member of. */
int svc_projects_list(svc_t *s, const svc_caller_t *who, json_t **out, kiln_err_t *err);
/* Members can list the project's members. *out = {"members": [...]}. */
int svc_members_list(svc_t *s, const svc_caller_t *who, const char *project, json_t **out, kiln_err_t *err);
/* Project admins and cluster admins. *out = {"project", "user", "role"}. */
int svc_member_set(svc_t *s, const svc_caller_t *who, const char *project, const char *user,
                   const char *role, json_t **out, kiln_err_t *err);
int svc_member_remove(svc_t *s, const svc_caller_t *who, const char *project, const char *user,
                      kiln_err_t *err);

/* One-time login links for the web UI (`kiln ui`). create: for the caller's own user, valid 120
 * s and once; *out = {"code", "expires_at", "session_expires_at"} (the only time the code is
 * shown). KILN_ESTATE without authentication. redeem: anyone holding the code; marks it used and
 * creates a token for the link's user that expires within 12 hours and never after the token
 * that asked for the link; *out = {"id", "token", "expires_at", "user"}. A link that is not
 * valid, used, expired, or whose asking token was revoked or expired is KILN_EUNAUTH saying which. */
int svc_login_link_create(svc_t *s, const svc_caller_t *who, json_t **out, kiln_err_t *err);
int svc_login_link_redeem(svc_t *s, const char *code, json_t **out, kiln_err_t *err);

/* ---- agent-facing operations (called by api/'s AgentService gRPC server) -------------------
 * `worker_id` is the worker the call's credential belongs to (svc_auth_agent; "" with
 * authentication off, when the message's own worker_id is used); a message naming another worker
 * is KILN_EPERM, and a worker may report only for ranks kilnd assigned to it.
 * Output messages are initialised by the caller with their KILN__..._INIT macro; everything the
 * service puts in them (strings, repeated fields, nested messages) is allocated from `arena`
 * and lives until the caller resets it. Errors: KILN_EINVAL (bad request), KILN_ENOTFOUND
 * (unknown worker or job), KILN_EDB (database unavailable). */

/* Registers (or re-registers) a worker; fills worker_id, heartbeat timings and a new credential
 * in *out. The caller has checked the join token. Registering under the id of an existing worker
 * needs that worker's current credential (presented_credential; KILN_EPERM otherwise). */
int svc_agent_register(svc_t *s, const Kiln__RegisterRequest *req, const char *presented_credential,
                       arena_t *arena, Kiln__RegisterResponse *out, kiln_err_t *err);
/* Records liveness; returns assignments not yet delivered to this worker and stop orders for
 * ranks it runs that should stop. Sets out->reregister when the worker id is unknown. */
int svc_agent_heartbeat(svc_t *s, const char *worker_id, const Kiln__HeartbeatRequest *req,
                        arena_t *arena, Kiln__HeartbeatResponse *out, kiln_err_t *err);
/* An agent started (or could not start) all ranks of its assignment. */
int svc_agent_rank_status(svc_t *s, const char *worker_id, const Kiln__RankStatus *req, kiln_err_t *err);
/* Appends log lines (batched COPY) and fans them out to live followers. */
int svc_agent_logs(svc_t *s, const char *worker_id, const Kiln__LogBatch *batch, kiln_err_t *err);
/* Appends metric points (batched COPY), updates the job's latest metrics and progress. */
int svc_agent_metrics(svc_t *s, const char *worker_id, const Kiln__MetricBatch *batch, kiln_err_t *err);
/* A rank exited; decides the job's next state when all ranks of the attempt are accounted for
 * (all 0 -> COMPLETED; a stop was requested -> STOPPED; any failure -> FAILED with the rank and
 * reason, after stopping the other ranks). */
int svc_agent_rank_exit(svc_t *s, const char *worker_id, const Kiln__RankExit *req, kiln_err_t *err);


/* ---- client-facing operations (REST, and gRPC TrainingService) --------------------------------
 * Jobs, events, log lines, metric series and workers travel as jansson objects shaped exactly as
 * docs/contracts.md shows, so REST passes them through and gRPC converts them. Results are new
 * references: caller owns *out and releases it with json_decref(). On error *out is NULL and err
 * carries status, message, field and hint. */

/* Validates spec (spec/spec.h), checks the caller is an editor of its project, that it can ever
 * fit the registered cluster and that some alive worker's data roots hold every file it reads,
 * stores the job as QUEUED (submitted_by the caller) and wakes the scheduler. "Can ever fit" is
 * judged against the ALIVE workers' total slots; with no alive worker at all the job is accepted
 * and queued with the reason "waiting for workers" (agents may simply not have started yet).
 * With a non-NULL idempotency_key, a second call with the same key returns the job the first
 * call created and sets *out_created = false. Errors: KILN_EINVAL (bad spec, err->field names
 * it), KILN_EPERM (not an editor of the project), KILN_EUNFIT (can never fit), KILN_EDB. */
int svc_job_create(svc_t *s, const svc_caller_t *who, const json_t *spec, const char *idempotency_key,
                   json_t **out, bool *out_created, kiln_err_t *err);
int svc_job_get(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err);

typedef struct svc_job_filter {
    const char *status;      /* comma-separated states ("RUNNING,QUEUED") or NULL */
    const char *tag;         /* "key:value" or "key", or NULL */
    int page_size;           /* 0: 50; at most 500 */
    const char *page_token;  /* opaque, from a previous page, or NULL */
} svc_job_filter_t;
/* *out = {"jobs": [...], "next_page_token": "..."}, newest first; only jobs of projects the caller
 * can see. */
int svc_job_list(svc_t *s, const svc_caller_t *who, const svc_job_filter_t *f, json_t **out,
                 kiln_err_t *err);
/* Requests a stop (editors): QUEUED/SCHEDULED jobs become STOPPED at once, running ones STOPPING
 * (agents get stop orders). Stopping a finished job is KILN_ESTATE. *out is the job after the
 * change; the events record the caller. */
int svc_job_stop(svc_t *s, const svc_caller_t *who, const char *id, const char *reason, json_t **out,
                 kiln_err_t *err);
/* *out = {"events": [...]}, oldest first. */
int svc_job_events(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err);

typedef struct svc_log_query {
    int rank;                /* -1: every rank */
    int64_t since_us;        /* only lines at or after this Unix time (0: from the start) */
    int64_t after_seq;       /* only lines with seq > after_seq (0: from the start) */
    int limit;               /* 0: 1000; at most 10000 */
} svc_log_query_t;
/* *out = {"lines": [...], "next_since_seq": N}. */
int svc_job_logs(svc_t *s, const svc_caller_t *who, const char *id, const svc_log_query_t *q,
                 json_t **out, kiln_err_t *err);
/* *out = {"metrics": [{"name": ..., "points": [...]}]}; name NULL means every metric;
 * max_points 0 means 1000 (each series downsampled, first and last point kept). */
int svc_job_metrics(svc_t *s, const svc_caller_t *who, const char *id, const char *name,
                    int max_points, json_t **out, kiln_err_t *err);
/* The same for steps in [start_step, end_step] (0: unbounded on that side), so a zoomed chart
 * gets max_points within its range. */
int svc_job_metrics_range(svc_t *s, const svc_caller_t *who, const char *id, const char *name,
                          int64_t start_step, int64_t end_step, int max_points, json_t **out,
                          kiln_err_t *err);
/* *out = {"workers": [...]}: any authenticated caller. */
int svc_workers_list(svc_t *s, const svc_caller_t *who, json_t **out, kiln_err_t *err);
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
 * last seq the caller already has). The caller must be able to see the job. Caller owns *out;
 * close with svc_follow_close(). */
int svc_follow_open(svc_t *s, const svc_caller_t *who, const char *job_id, int rank,
                    int64_t after_seq, svc_follow_wake_fn wake, void *ud, svc_follow_t **out,
                    kiln_err_t *err);
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
