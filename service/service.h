/* service.h - kiln's control-plane logic: job submission and validation, the job state machine,
 * the scheduler, worker liveness, and ingestion of logs and metrics from agents. No I/O framework
 * here: api/ decodes requests and calls these functions; store/ does the database work.
 * All functions are thread-safe unless noted (api threads call them concurrently). */
#ifndef KILN_SERVICE_H
#define KILN_SERVICE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/api_names.h"
#include "base/base.h"
#include "base/job_states.h"
#include "proto/kiln.pb-c.h"
#include "spec/spec.h"

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
    int preempt_protect_after;     /* a job preempted this often is no longer preempted by jobs of
                                      its priority or lower (default 3) */
    int sched_default_runtime_s;   /* a waiting job's estimated run time when nothing of its model
                                      has run (0: none; such a job is never backfilled) */
    /* Authentication. */
    const char *bootstrap_token_file; /* first start on an empty database: the admin's token */
    const char *join_token_file;   /* the token agents register with (created when missing) */
    bool auth_disabled;            /* --no-auth: every caller is a cluster admin, agents need
                                      no token (benchmarks and trusted single-user machines) */
    /* Artifacts and the end of a job's life. */
    const char *artifact_dir;      /* --artifact-dir: where uploaded artifacts are kept (created
                                      0700); NULL: this kilnd keeps none and refuses uploads */
    int64_t artifact_max_job_bytes;/* a job's artifacts in all (0: 10 GiB) */
    int log_retention_days;        /* drop the logs of jobs ended longer ago (0: keep them) */
    int janitor_interval_ms;       /* how often the clean-up pass runs (0: one hour) */
    int64_t code_max_bytes;        /* --code-max-mb: an uploaded code archive, compressed (0: 100 MiB) */
    /* What agents are trusted with (join.c, trust.c; docs/security.md). */
    bool agent_approval;           /* --agent-approval: a new worker gets no work until a cluster
                                      admin approves it */
    bool agent_distinct_certs;     /* --agent-distinct-certs: a client certificate another live
                                      worker is bound to cannot register a second one */
    int register_per_min_addr;     /* registrations a minute from one source address, in bursts of
                                      up to a sixth of it (0: no limit) */
    int register_per_min;          /* registrations a minute on this kilnd in all (0: no limit) */
    bool tune_promoted_restart;    /* --tune-promoted-restart: a promoted hyperband trial trains
                                      again from step 0 instead of resuming (a benchmark's baseline) */
    int search_timeout_ms;         /* --search-timeout-ms: the longest any one statement of a job
                                      search may run (0: SVC_SEARCH_TIMEOUT_MS) */
} svc_config_t;

/* A search's statements are cut off after this long by default: the filter language bounds what
 * a filter may hold, but not what PostgreSQL may need to plan or run it at some table size. */
#define SVC_SEARCH_TIMEOUT_MS 10000

/* Connects to PostgreSQL, applies migrations, starts the scheduler and liveness threads.
 * Caller owns *out; free with svc_destroy(). Returns 0, KILN_EDB (err says why). */
int svc_create(const svc_config_t *cfg, svc_t **out, kiln_err_t *err);
/* Stops background threads, closes connections. Accepts NULL. */
void svc_destroy(svc_t *s);

/* The most metric names one job may have: a batch that would give it more is refused (kilnd's
 * summaries, a job's reply and search grow with them; a script can make names without end). */
#define SVC_METRIC_NAMES_MAX 1000
/* The longest log line kilnd stores, in bytes: kiln-agent cuts its ranks' lines at 16 KiB, which
 * its UTF-8 repair may make up to 48 KiB; a batch with a longer line is refused (a line is a row
 * that every follower of the job's log reads). */
#define SVC_LOG_LINE_MAX 65536

/* ---- the validator (check.c) -----------------------------------------------------------------
 * One set of checks for what clients send, used by REST (query parameters, path segments,
 * headers), gRPC (request fields) and the service functions below, so both front ends refuse the
 * same input with the same answer. Each returns 0 or KILN_EINVAL with err naming field, saying
 * what is wrong (quoting the bad input safely) and with a hint. */

/* s[0..len) must be valid UTF-8 without NUL bytes, and at most max_chars characters (0: no
 * limit). Pass the length as received, so that an embedded NUL is seen. s NULL passes. */
int svc_check_text(const char *field, const char *s, size_t len, size_t max_chars, kiln_err_t *err);
/* svc_check_text for a NUL-terminated string. */
int svc_check_str(const char *field, const char *s, size_t max_chars, kiln_err_t *err);
/* svc_check_str, and no terminal control character (kiln_text_control: C0 controls, tab and
 * newline included, DEL, C1 controls, bidirectional overrides): for names and one-line texts that
 * others see (a reason, a description, a tag, a metric's or a worker's name), which may not rewrite
 * what their terminals show. Free text (log lines) is kept as sent; the CLI escapes it. */
int svc_check_line(const char *field, const char *s, size_t max_chars, kiln_err_t *err);
/* text must be a whole decimal integer in [lo, hi]: digits with an optional '-', nothing else
 * (no '+', spaces, fraction or exponent). *out (OUT) on success. */
int svc_check_int_text(const char *field, const char *text, int64_t lo, int64_t hi, int64_t *out,
                       kiln_err_t *err);
/* text, when not empty, must be a time (RFC 3339 or Unix seconds): *out_us (OUT), 0 when empty. */
int svc_check_time_text(const char *field, const char *text, int64_t *out_us, kiln_err_t *err);
/* v must lie in [lo, hi]. */
int svc_check_range(const char *field, int64_t v, int64_t lo, int64_t hi, kiln_err_t *err);
/* v must be a finite number (not NaN, not +-Infinity). */
int svc_check_finite(const char *field, double v, kiln_err_t *err);
/* text NULL (absent: false), "" (a bare flag: true), true|1|false|0. *out (OUT). */
int svc_check_bool_text(const char *field, const char *text, bool *out, kiln_err_t *err);

/* ---- callers --------------------------------------------------------------------------------
 * Every client-facing operation takes the caller (who): a user authenticated by an API token,
 * with its project roles. Projects are the tenant boundary: a job in a project the caller has no
 * role in does not exist for it (KILN_ENOTFOUND, never KILN_EPERM), and lists leave it out. */
/* The roles of base/api_names.h's KILN_PROJECT_ROLES, from 1 in its order (each allows more):
 * SVC_ROLE_VIEWER reads jobs, events, logs, metrics, artifacts, members; SVC_ROLE_EDITOR also
 * submits and stops jobs; SVC_ROLE_ADMIN also manages the project's members. */
typedef enum svc_role {
    SVC_ROLE_NONE = 0,
#define SVC_ROLE_ENUM_(id, name) SVC_ROLE_##id,
    KILN_PROJECT_ROLES(SVC_ROLE_ENUM_, SVC_ROLE_ENUM_)
#undef SVC_ROLE_ENUM_
} svc_role_t;

typedef struct svc_project_role {
    const char *project;
    svc_role_t role;
} svc_project_role_t;

typedef struct svc_caller {
    const char *user;               /* "" for kilnd itself */
    const char *token_id;           /* the token the request carried ("" without one) */
    int64_t token_expires_us;       /* 0: never */
    bool token_session;             /* a web UI session token (login link): it makes no tokens */
    bool cluster_admin;             /* manages users, projects, workers; admin of every project */
    const svc_project_role_t *roles;/* the projects the user is a member of, sorted by name */
    int nroles;
} svc_caller_t;

/* "viewer" | "editor" | "admin" (KILN_PROJECT_ROLES; "" for none); parse gives SVC_ROLE_NONE for
 * anything else. */
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
/* Authenticates an agent's call: its credential names the worker (into worker_id, size n; ""
 * with authentication off), and the call must present the client certificate the worker
 * registered with (cert_sha256, the SHA-256 hex of svc_cert_sha256, NULL or "" for none; the
 * worker's binding is "" when it registered without one). A worker waiting for approval may make
 * only the calls that allow_pending says (its heartbeats): KILN_ESTATE otherwise. KILN_EUNAUTH
 * (no, unknown or retired credential, another certificate), KILN_EDB. */
int svc_auth_agent(svc_t *s, const char *credential, const char *cert_sha256, bool allow_pending,
                   char *worker_id, size_t n, kiln_err_t *err);
/* The SHA-256 of a PEM certificate's DER bytes as 64 lower-case hex digits into out (65 bytes),
 * what `openssl x509 -noout -fingerprint -sha256` shows. KILN_EINVAL when pem[0..len) holds no
 * certificate. */
#define SVC_CERT_HEX 65
int svc_cert_sha256(const char *pem, size_t len, char out[SVC_CERT_HEX], kiln_err_t *err);

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
/* A new token for user (the caller itself, or anyone for a cluster admin), made with the
 * caller's token (its parent, recorded with the caller as created_by): it never outlives that
 * token and is revoked with it. expires_in_s 0: none of its own, so it never expires, or expires
 * with the caller's token when that one does ("expires_with_parent": true); an expires_in_s
 * ending after the caller's token is KILN_EINVAL, a web UI session token KILN_EPERM, a caller's
 * token revoked meanwhile KILN_EUNAUTH. *out = {"id", "token", "expires_at", "user",
 * "created_by", "parent_id", "expires_with_parent"}: the only time the secret is shown. */
int svc_token_create(svc_t *s, const svc_caller_t *who, const char *user, int64_t expires_in_s,
                     const char *description, json_t **out, kiln_err_t *err);
/* *out = {"tokens": [...]} (no secrets). */
int svc_tokens_list(svc_t *s, const svc_caller_t *who, const char *user, json_t **out, kiln_err_t *err);
/* Revokes a token of the caller's own (any token for a cluster admin) and every token made with
 * it, directly or through others, whoever they belong to; *out = the token, with
 * "descendants_revoked": how many of those were valid until now. */
int svc_token_revoke(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err);
/* Cluster admins only. Jobs of the project that name no queue go to default_queue (NULL: the
 * queue "default"), which must exist and let the project use it (KILN_EINVAL, field
 * "default_queue"; "" names no queue and is KILN_EINVAL too). *out = the project. */
int svc_project_create(svc_t *s, const svc_caller_t *who, const char *name, const char *default_queue, json_t **out,
                       kiln_err_t *err);
/* Changes what patch names of a project ({"default_queue": name, or null for "default"; "" and
 * other fields are KILN_EINVAL): the project's admins and cluster admins. The queue is checked as
 * on create. *out = the project as svc_projects_list shows it. */
int svc_project_update(svc_t *s, const svc_caller_t *who, const char *project, const json_t *patch, json_t **out,
                       kiln_err_t *err);
/* *out = {"projects": [{"name", "created_at", "created_by", "role", "default_queue"}]}: every
 * project for a cluster admin, else those the caller is a member of. */
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
 * shown). KILN_ESTATE without authentication, KILN_EPERM with a session token. redeem: anyone
 * holding the code; marks it used and creates a session token (it makes no tokens) for the
 * link's user, made with the token that asked for the link: it expires within 12 hours and never
 * after that token, and is revoked with it; *out = {"id", "token", "expires_at", "user"}. A link that is not
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

/* What a RegisterWorker call came with, from its metadata and its TLS session. */
typedef struct svc_agent_peer {
    const char *join_token;        /* the bearer token, or NULL */
    const char *credential;        /* "kiln-worker-credential": the worker's own, or NULL */
    const char *cert_sha256;       /* the client certificate (svc_cert_sha256), NULL without one */
    const char *address;           /* the source address, for the rate limits and the record */
} svc_agent_peer_t;
/* Registers (or re-registers) a worker; fills worker_id, heartbeat timings and a new credential
 * in *out. A new worker needs a join token that can register now: kilnd's --join-token-file's,
 * or an active one of svc_join_token_create, of which it consumes a use (KILN_EUNAUTH saying
 * why otherwise); such registrations are rate-limited per source address and in all
 * (KILN_ELIMIT with when to retry). Registering again under the id of an existing worker needs
 * that worker's current credential instead (KILN_EPERM when a join token came without it) and
 * the certificate it is bound to (KILN_EUNAUTH). A banned worker id or certificate is KILN_EPERM,
 * and so is, with agent_distinct_certs, a certificate another live worker is bound to. With
 * agent_approval a new worker is PENDING: registered, but given no work until approved. */
int svc_agent_register_as(svc_t *s, const Kiln__RegisterRequest *req, const svc_agent_peer_t *peer,
                          arena_t *arena, Kiln__RegisterResponse *out, kiln_err_t *err);
/* svc_agent_register_as for a caller inside kilnd that vouches for the join token itself (tests,
 * benchmarks): no join token is checked or consumed and no rate limit applies. */
int svc_agent_register(svc_t *s, const Kiln__RegisterRequest *req, const char *presented_credential,
                       arena_t *arena, Kiln__RegisterResponse *out, kiln_err_t *err);
/* WatchWork: the worker a watch is for, the one the credential belongs to (*wid points into
 * authenticated or req). KILN_EPERM when the request names another worker; KILN_EINVAL when
 * there is no credential and the request names no usable worker id. */
int svc_agent_watch(const char *authenticated, const Kiln__WatchWorkRequest *req, const char **wid,
                    kiln_err_t *err);
/* Work for agents: fn(ud, worker_id) runs on the notify thread whenever any kilnd on the database
 * commits an assignment or a stop order for that worker (after the commit, so a heartbeat then
 * finds it). fn must not block. One hook per svc_t; svc_on_work(s, NULL, NULL) removes it, and
 * when that returns fn is not running and will not run again. */
typedef void (*svc_work_fn)(void *ud, const char *worker_id);
void svc_on_work(svc_t *s, svc_work_fn fn, void *ud);
/* Records liveness; returns assignments not yet delivered to this worker and stop orders for
 * ranks it runs that should stop. Sets out->reregister when the worker id is unknown, and
 * out->waiting_for_approval (with a message, and nothing else) while the worker is PENDING. */
int svc_agent_heartbeat(svc_t *s, const char *worker_id, const Kiln__HeartbeatRequest *req,
                        arena_t *arena, Kiln__HeartbeatResponse *out, kiln_err_t *err);
/* An agent started (or could not start) all ranks of its assignment. */
int svc_agent_rank_status(svc_t *s, const char *worker_id, const Kiln__RankStatus *req, kiln_err_t *err);
/* Appends log lines (batched COPY) and fans them out to live followers. */
int svc_agent_logs(svc_t *s, const char *worker_id, const Kiln__LogBatch *batch, kiln_err_t *err);
/* Appends metric points (batched COPY), updates the job's latest metrics and progress. */
int svc_agent_metrics(svc_t *s, const char *worker_id, const Kiln__MetricBatch *batch, kiln_err_t *err);
/* Artifact upload, for the worker that ran rank 0 of the attempt. begin: checks the manifest
 * (names, at most 256 files, SHA-256s, the job's total against artifact_max_job_bytes:
 * KILN_ETOOBIG), records it, and answers per file the offset this store holds durably, so an
 * interrupted upload continues there; a newer attempt's upload replaces an older one's artifacts,
 * an older attempt's is KILN_ESTATE. chunk: appends bytes at exactly the durable offset
 * (KILN_ESTATE otherwise), refusing data whose SHA-256 is not the chunk's (KILN_ECHECKSUM, nothing
 * written); bytes are fsynced before the offset is recorded; the last chunk's file is checked
 * against the manifest's SHA-256 (KILN_ECHECKSUM and dropped when it differs) and renamed into
 * place. Without an artifact store: KILN_EUNSUPP. A manifest and chunks of kind CHECKPOINT sync
 * the job's checkpoint directory instead (checkpoint.c; proto/kiln.proto ArtifactKind): the
 * latest attempt only (KILN_ESTATE otherwise), a job without checkpoint.path only (KILN_EINVAL),
 * the reply's committed set once the manifest is the job's synced state. */
int svc_agent_artifacts_begin(svc_t *s, const char *worker_id, const Kiln__ArtifactManifest *m, arena_t *arena,
                              Kiln__ArtifactManifestReply *out, kiln_err_t *err);
int svc_agent_artifact_chunk(svc_t *s, const char *worker_id, const Kiln__ArtifactChunk *c,
                             Kiln__ArtifactChunkReply *out, kiln_err_t *err);
/* Bytes of the model the assigned job starts from (its spec's model.init_from "job:<id>"): the
 * worker must hold part of the attempt; the source is read from the assigned job's stored spec.
 * out->data is allocated from arena. */
int svc_agent_init_model(svc_t *s, const char *worker_id, const Kiln__InitModelRequest *req, arena_t *arena,
                         Kiln__InitModelChunk *out, kiln_err_t *err);
/* A rank exited; decides the job's next state when all ranks of the attempt are accounted for
 * (all 0 -> COMPLETED; a stop was requested -> STOPPED; any failure -> FAILED with the rank and
 * reason, after stopping the other ranks). */
int svc_agent_rank_exit(svc_t *s, const char *worker_id, const Kiln__RankExit *req, kiln_err_t *err);
/* Several start reports and rank exits (proto/kiln.proto ReportBatch), handled in their order:
 * each checked and authorised as svc_agent_rank_status / svc_agent_rank_exit check it (a report
 * without a worker id is the batch's worker's), then all that pass in one transaction (their jobs'
 * rows locked in id order, one commit); should one fail there, nothing of it is kept and each is
 * handled on its own transaction, in order, as its single call would be. out->results (from
 * arena) holds one result per report: 0, or the gRPC status and message its call would have
 * had; after a report not handled for a retryable reason (UNAVAILABLE, INTERNAL, ...) no later
 * one is handled (each carries UNAVAILABLE, "not handled"). Returns KILN_EINVAL, nothing handled,
 * for more than SVC_REPORT_BATCH_MAX reports or a message over SVC_REPORT_BATCH_BYTES, and
 * KILN_EPERM / KILN_EINVAL for the batch's worker id as a single report's. */
#define SVC_REPORT_BATCH_MAX 256
#define SVC_REPORT_BATCH_BYTES (1 << 20)
int svc_agent_report_batch(svc_t *s, const char *worker_id, const Kiln__ReportBatchRequest *req, arena_t *arena,
                           Kiln__ReportBatchReply *out, kiln_err_t *err);


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
 * With a non-NULL idempotency_key (1 to 200 characters of UTF-8), a second call with the same
 * key and the same normalised spec returns the job the first call created and sets
 * *out_created = false; the same key with a different spec is KILN_EREUSED (HTTP 422). Errors:
 * KILN_EINVAL (bad spec or key, err->field names it), KILN_EPERM (not an editor of the project),
 * KILN_EUNFIT (can never fit), KILN_EREUSED, KILN_EDB. */
int svc_job_create(svc_t *s, const svc_caller_t *who, const json_t *spec, const char *idempotency_key,
                   json_t **out, bool *out_created, kiln_err_t *err);
/* Every operation on one job (get, stop, delete, events, logs, metrics, artifacts, follow; REST and gRPC alike)
 * takes its id or a unique prefix of it (at least SVC_JOB_PREFIX_MIN characters, as `kiln jobs`
 * shows them), resolved here through the primary key among the jobs the caller can see. */
#define SVC_JOB_PREFIX_MIN 4
#define SVC_JOB_ID_SIZE 37
/* The full id of ref (an id or a prefix) into out. KILN_ENOTFOUND (nothing visible matches, or
 * ref cannot be part of an id), KILN_EINVAL (a prefix too short, or one that matches several:
 * the message lists them), KILN_EDB. */
int svc_job_resolve(svc_t *s, const svc_caller_t *who, const char *ref, char out[SVC_JOB_ID_SIZE],
                    kiln_err_t *err);
/* *out = the job with "summaries": {metric: {count, min, max, last, min_step, max_step,
 * last_step, rank, attempt}} of every metric it reported. */
int svc_job_get(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err);

/* A listing is a search (service/search.c): the filter language (query/query.h) with the legacy
 * status and tag parameters ANDed in. */
typedef struct svc_job_filter {
    const char *status;      /* comma-separated states ("RUNNING,QUEUED", any case) or NULL */
    const char *tag;         /* "key:value" or "key", or NULL */
    const char *filter;      /* a filter, or NULL: every job */
    const char *order_by;    /* "FIELD [asc|desc], ...", or NULL: newest first */
    const char *columns;     /* comma-separated hp.NAME, hp.*, metrics.NAME[.AGG], metrics.*, or NULL */
    int page_size;           /* 1 to KILN_PAGE_SIZE_MAX when page_size_set; otherwise 0: 50, more: the max */
    bool page_size_set;      /* a caller gave page_size (then 0 or 501 is refused, not defaulted) */
    const char *page_token;  /* opaque, from a previous page of the same search, or NULL */
} svc_job_filter_t;
/* *out = {"jobs": [...], "next_page_token": "..." ("" on the last page)}: only jobs of projects
 * the caller can see, in the order asked (ties broken by id; jobs lacking a sort key's value
 * after those that have it). With columns, each job also carries "columns" ({"hp.lr": 0.001,
 * "metrics.val_loss.min": 1.52, ...}: every column asked, null where the job has no value; a
 * whole summary, metrics.NAME, gives its .min, .max, .last and .count) and "summaries"
 * ({metric: {count, min, max, last, min_step, max_step, last_step, rank, attempt}}) of the
 * metrics the columns name. Every field is checked first (check.c: UTF-8 without NUL, lengths,
 * the page size's range). Errors: KILN_EINVAL with err->field "filter", "order_by", "columns",
 * "status", "tag", "page_size" or "page_token" (query.h describes the messages). */
int svc_job_list(svc_t *s, const svc_caller_t *who, const svc_job_filter_t *f, json_t **out,
                 kiln_err_t *err);
/* Page tokens (page_token.c; pure, thread-safe). The fingerprint of what a token's cursor
 * depends on: f's filter, order_by, status and tag (a token from another search is refused
 * rather than misapplied). */
uint64_t svc_search_fingerprint(const svc_job_filter_t *f);
/* The fingerprint of the tokens of another paged list, named by list ("tuning-jobs"): never a
 * search's, so neither takes the other's tokens. */
uint64_t svc_list_fingerprint(const char *list);
/* The token of cursor (borrowed) for the search of fingerprint fp. Caller frees the result;
 * NULL when out of memory. */
char *svc_page_token_encode(const json_t *cursor, uint64_t fp);
/* The cursor inside tok (untrusted text, NUL-terminated) after checking it is a token of the
 * search of fingerprint fp: *cursor (OUT) is a JSON object (caller owns; json_decref), not yet
 * checked against the order (store_search_cursor_ok does that). Returns 0, or KILN_EINVAL with
 * err->field "page_token" (too long, not base64url, not a token, another search's token) or
 * KILN_ENOMEM; *cursor is NULL then. */
int svc_page_token_decode(const char *tok, uint64_t fp, json_t **cursor, kiln_err_t *err);
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
typedef struct svc_metrics_query {
    const char *name;        /* one metric, or NULL for every metric */
    int max_points;          /* points per series (2 to 100000) when max_points_set, else 1000 */
    bool max_points_set;
    int attempt;             /* only this attempt's points (>= 1), 0: every attempt, -1: per step
                                the latest attempt's point (what a chart of the run shows) */
    int64_t start_step, end_step; /* steps in [start_step, end_step] only (0: no bound on that
                                     side), so a zoomed chart gets max_points within its range */
} svc_metrics_query_t;
/* *out = {"metrics": [{"name": ..., "points": [{step, value, time, time_us, rank, attempt}]}]},
 * each series ordered by step and then attempt, so a step a retried attempt trained again has
 * its earlier attempt's point beside the later one. A series longer than max_points keeps its
 * first and last point and the lowest and highest point of each of (max_points - 2) / 2 buckets
 * (store_metrics_query_json). q may be NULL (every metric, every attempt, 1000 points). id may be
 * a prefix of the job's id (svc_job_resolve). */
int svc_job_metrics(svc_t *s, const svc_caller_t *who, const char *id, const svc_metrics_query_t *q,
                    json_t **out, kiln_err_t *err);
/* *out = {"workers": [...]}: any authenticated caller. */
int svc_workers_list(svc_t *s, const svc_caller_t *who, json_t **out, kiln_err_t *err);

/* ---- what agents are trusted with (join.c, trust.c; cluster admins only: KILN_EPERM) ---------- */

/* A new join token: uses (NULL: 1; 1 to 1000000), expires_in a duration ("90s", "30m", "12h",
 * "7d"; NULL or "": 24h; at most 365 days), a description (200 characters). *out = the token as
 * svc_join_tokens_list shows it plus "token", the secret, shown this once. */
int svc_join_token_create(svc_t *s, const svc_caller_t *who, const int64_t *uses, const char *expires_in,
                          const char *description, json_t **out, kiln_err_t *err);
/* *out = {"join_tokens": [{id, description, uses, uses_left, registrations, created_at, created_by,
 * expires_at, revoked_at, last_used_at, state}]}, oldest first. */
int svc_join_tokens_list(svc_t *s, const svc_caller_t *who, json_t **out, kiln_err_t *err);
/* Revokes a join token (workers it registered keep their credentials); *out = the token. */
int svc_join_token_revoke(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err);
/* A PENDING worker becomes APPROVED (an approved one stays so); *out = the worker. */
int svc_worker_approve(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err);
/* Removes a worker: it is DEAD at once, its credential stops working, it leaves the list, and
 * the attempts it ran are lost as when a worker dies (re-queued while attempts are left). With
 * ban, its worker id and its certificate may not register again (reason recorded). *out =
 * {"id", "removed_at", "removed_by", "lost_attempts", "ban": the ban or null}. Removing a removed
 * worker again only adds the ban. */
int svc_worker_remove(svc_t *s, const svc_caller_t *who, const char *id, bool ban, const char *reason,
                      json_t **out, kiln_err_t *err);
/* *out = {"bans": [{id, worker_id, cert_sha256, reason, banned_by, banned_at}]}. */
int svc_worker_bans_list(svc_t *s, const svc_caller_t *who, json_t **out, kiln_err_t *err);
/* Lifts a ban (id as text, as a path carries it: one that is not a ban's id is KILN_ENOTFOUND);
 * *out = the ban. */
int svc_worker_ban_delete(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err);
/* 0 when the database answers and every migration is applied; KILN_EUNAVAIL otherwise. */
int svc_ready(svc_t *s, kiln_err_t *err);
/* Whether this kilnd leads (of the kilnd replicas on its database, the one that runs the
 * scheduler and the liveness checker). */
bool svc_is_leader(svc_t *s);
/* Appends the control plane's gauges to a Prometheus exposition: whether this kilnd leads, the
 * connection pool's use, and jobs by state, queue lengths, workers and slots by state (from the
 * database). The service's counters and histograms are in the process registry (prom_write).
 * KILN_EDB/KILN_EUNAVAIL when the database cannot answer (the leader and pool gauges are written
 * regardless). */
int svc_prom_write(svc_t *s, prom_buf_t *b, kiln_err_t *err);

/* ---- artifacts and deletion (artifact.c, lifecycle.c) ----------------------------------------
 * A job's artifacts are the files rank 0 left at the top of its output directory, uploaded by its
 * agent when the attempt ended (svc_agent_artifacts_begin / svc_agent_artifact_chunk) into this
 * kilnd's artifact store, a directory (--artifact-dir). Each store has an id (the file
 * .kiln-store-id in it) recorded with every artifact: replicas given the same directory (shared
 * storage) serve each other's artifacts; a replica whose directory is another store answers
 * KILN_EUNAVAIL for an artifact it does not hold, naming the store that does. */

/* *out = {"artifacts": [{"name", "size", "sha256", "created_at", "attempt", "worker_id" (the
 * worker whose credential uploaded it)}]}: the complete
 * ones, by name (viewers). */
int svc_job_artifacts(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err);
/* *out = {"files": [{"name", "size", "sha256", "attempt" (whose content it is), "worker_id" (the
 * worker whose credential synced it)}], "synced_at" (RFC 3339; "" when nothing was synced),
 * "attempt" (the latest attempt whose content the state holds; 0: none)}: the job's checkpoint
 * directory as kilnd last synced it, by name (viewers; checkpoint.c). */
int svc_job_checkpoints(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err);
/* FetchCheckpoint: a piece of a file of the assigned job's synced checkpoint state, by name.
 * Allocated from arena. KILN_EPERM when the worker is not assigned the attempt, KILN_ENOTFOUND
 * when the state has no such file, KILN_EUNAVAIL when another store holds its bytes. */
int svc_agent_checkpoint_fetch(svc_t *s, const char *worker_id, const Kiln__CheckpointRequest *req, arena_t *arena,
                               Kiln__CheckpointChunk *out, kiln_err_t *err);

/* An artifact opened for reading. */
typedef struct svc_artifact_file {
    int fd;                      /* read-only; the caller owns it (close it, or hand it on) */
    int64_t size;
    char sha256[KILN_SHA256_HEX];
    char name[KILN_ARTIFACT_NAME_MAX + 1];
    int64_t created_us;
    int attempt;
} svc_artifact_file_t;
/* Counts n bytes of an artifact sent to a client through api ("rest" or "grpc") in kilnd's
 * Prometheus registry (kiln_artifact_bytes_total{direction="served"}). */
void svc_artifact_served(const char *api, int64_t n);
/* Opens a complete artifact of the job for the caller (viewers). Errors: KILN_EINVAL (a name no
 * artifact can have: '/', "..", too long), KILN_ENOTFOUND (no such job for the caller, no such
 * artifact, or still uploading), KILN_EUNAVAIL (another store holds it, or the store lost the
 * file), KILN_EDB. On success out->fd is open. */
int svc_job_artifact_open(svc_t *s, const svc_caller_t *who, const char *id, const char *name,
                          svc_artifact_file_t *out, kiln_err_t *err);

/* ---- code archives (code.c) --------------------------------------------------------------------
 * Script jobs' code: gzip'd tar archives that project editors upload, checked entry by entry
 * (code/code.h) when they are whole, kept once per SHA-256 in the artifact store
 * (DIR/code/<digest>.tgz, beside the jobs' artifacts) and visible only to the projects that
 * uploaded them: to any other caller an archive that does not exist. Uploads arrive in pieces
 * (REST: one streamed body; gRPC: a call per piece, resumable), gathering in DIR/code/uploads. */
typedef struct svc_code_upload svc_code_upload_t;

/* Starts an upload into project (editors; "" or NULL: "default"), or continues the caller's
 * upload upload_id into that project, of which kilnd must hold exactly offset bytes
 * (KILN_ESTATE naming what it holds otherwise). expect_bytes (-1: unknown) is what the caller
 * announces in all: past --code-max-mb it is KILN_ETOOBIG at once. Caller owns *out: finish it
 * with svc_code_upload_finish, or release it with svc_code_upload_close. Errors: KILN_EINVAL,
 * KILN_EPERM (not an editor of project), KILN_ENOTFOUND (no such upload of the caller's),
 * KILN_ESTATE, KILN_ETOOBIG, KILN_EUNSUPP (no --artifact-dir), KILN_EIO. */
int svc_code_upload_open(svc_t *s, const svc_caller_t *who, const char *project, const char *upload_id,
                         int64_t offset, int64_t expect_bytes, svc_code_upload_t **out, kiln_err_t *err);
/* The upload's id (32 hex digits) and the bytes kilnd holds of it. Borrowed from u. */
const char *svc_code_upload_id(const svc_code_upload_t *u);
int64_t svc_code_upload_offset(const svc_code_upload_t *u);
/* Appends n bytes. KILN_ETOOBIG past --code-max-mb (the message names the limit), KILN_EIO. */
int svc_code_upload_write(svc_code_upload_t *u, const void *data, size_t n, kiln_err_t *err);
/* The upload is whole: checks its archive (KILN_EINVAL, field "archive", naming the entry at
 * fault), keeps its bytes once per digest (an archive kilnd holds already is not written again)
 * and records it for the project. *out = {"source": "code:sha256:<digest>", "digest", "size",
 * "files", "project", "created"} (created false: the project had uploaded these bytes before).
 * Frees u whatever the outcome; the partial bytes are removed. */
int svc_code_upload_finish(svc_code_upload_t *u, json_t **out, kiln_err_t *err);
/* Releases u. keep: its bytes stay for a later svc_code_upload_open (gRPC's next call); else they
 * are removed (an abandoned REST request). Accepts NULL. */
void svc_code_upload_close(svc_code_upload_t *u, bool keep);
/* Opens the archive digest (64 hex digits, or "code:sha256:<hex>") of project ("" or NULL:
 * "default") for reading (viewers): out->fd, size, sha256 (the digest), name ("<digest>.tgz").
 * KILN_ENOTFOUND when the caller cannot read project or project has no such archive (the same
 * answer), KILN_EINVAL for a malformed digest, KILN_EUNAVAIL when this kilnd's store does not
 * hold the bytes. */
int svc_code_open(svc_t *s, const svc_caller_t *who, const char *project, const char *digest,
                  svc_artifact_file_t *out, kiln_err_t *err);
/* FetchCode: a piece of the archive the assigned job's spec names as its source (kilnd reads the
 * job's own spec, never the request, to find it). Allocated from arena. KILN_EPERM when the worker
 * is not assigned the attempt, KILN_EINVAL when the job runs no archive. */
int svc_agent_code(svc_t *s, const char *worker_id, const Kiln__CodeRequest *req, arena_t *arena,
                   Kiln__CodeChunk *out, kiln_err_t *err);

/* Deletes an ended job (editors): its events, logs, metrics, assignments, rank exits, artifact
 * rows and whatever else holds its id, then the job; its artifact files are removed after the
 * commit (by the replica whose store holds them). *out = {"id", "removed": {"<table>": rows},
 * "artifact_bytes": N}. KILN_ESTATE when the job has not ended, or a job that has not ended starts
 * from its model (model.init_from). */
int svc_job_delete(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err);

/* One pass of the clean-up the background thread runs every janitor_interval_ms: removes the
 * artifact directories of deleted jobs this kilnd's store holds, then (log_retention_days > 0,
 * and no other kilnd is doing it) drops the logs of jobs that ended longer ago than that, in
 * batches. *dropped (OUT, may be NULL) = log lines dropped. */
int svc_janitor_pass(svc_t *s, int64_t *dropped, kiln_err_t *err);

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

/* ---- queues (queue.c) --------------------------------------------------------------------------
 * A queue is JSON shaped as GET /v1/queues shows it (store.h, queues). Cluster admins create,
 * change and delete queues; every user reads them. One validator behind REST and gRPC: name
 * (required on create, never changed), quota (required on create: {"cpu": n, "gpu": n}, a missing
 * slot type 0; null: no limit), cohort (null: none), borrowing_limit and lending_limit (slot
 * counts; a missing slot type unlimited; only within a cohort), weight (> 0, default 1), projects
 * (existing project names or "*", default ["*"]), fair_sharing (default false), preemption
 * ({"within_queue": sched_within_names, "reclaim_within_cohort": sched_reclaim_names}; a field
 * left out keeps its value, null or new its default: lower_priority and any). KILN_EINVAL
 * naming the field ("preemption.within_queue", with the values it takes), KILN_EPERM, KILN_EEXIST, KILN_ENOTFOUND. */
int svc_queues_list(svc_t *s, const svc_caller_t *who, json_t **out, kiln_err_t *err); /* {"queues": [...]} */
int svc_queue_get(svc_t *s, const svc_caller_t *who, const char *name, json_t **out, kiln_err_t *err);
/* *out = the queue as stored. */
int svc_queue_create(svc_t *s, const svc_caller_t *who, const json_t *body, json_t **out, kiln_err_t *err);
/* patch: the fields to change (null clears cohort or a limit, and makes quota unlimited).
 * KILN_ESTATE (field "projects") when the new projects leave out a project whose default queue
 * this is (the message names them). */
int svc_queue_update(svc_t *s, const svc_caller_t *who, const char *name, const json_t *patch, json_t **out,
                     kiln_err_t *err);
/* KILN_ESTATE for "default" and for a queue with jobs waiting or running. */
int svc_queue_delete(svc_t *s, const svc_caller_t *who, const char *name, kiln_err_t *err);

/* ---- job states ----------------------------------------------------------------------------
 * The job state machine (service/state.c). The states are base/job_states.h's list; values match
 * proto's JobState numbers. */
typedef enum svc_job_state {
    JOB_STATE_NONE = 0,          /* before the job exists (the first event has no from_state) */
#define SVC_STATE_ENUM_(name, num, kind) JOB_STATE_##name = num,
    KILN_JOB_STATES(SVC_STATE_ENUM_)
#undef SVC_STATE_ENUM_
    JOB_STATE_COUNT_             /* one past the last state */
} svc_job_state_t;

/* "QUEUED" ... ; "" for JOB_STATE_NONE or an unknown value. Static storage. */
const char *svc_state_name(svc_job_state_t st);
/* Parses a state name (case-sensitive, as in the API); JOB_STATE_NONE when unknown. */
svc_job_state_t svc_state_parse(const char *name);
/* Whether the state machine allows from -> to. */
bool svc_state_legal(svc_job_state_t from, svc_job_state_t to);
/* Whether st is terminal: its kind in base/job_states.h is ENDED. */
bool svc_state_terminal(svc_job_state_t st);

/* ---- scheduling passes, as a benchmark sees them ---------------------------------------------
 * Each pass of the leader's scheduler: when it began (kiln_mono_us), how long it took (from the
 * read that takes the pass lock to its release, as kiln_scheduler_pass_seconds counts it), the pending jobs it read and how many it
 * admitted. svc_sched_record() has the passes from now on appended to buf (at most cap; later ones
 * are not recorded); buf must outlive the recording, which svc_sched_record(s, NULL, 0) ends.
 * svc_sched_recorded() is how many are in buf so far. */
enum {
    SVC_SCHED_STEP_READ,  /* the pass lock, the workers' capacity, the waiting jobs written since the
                           * last pass, the queues, the jobs holding slots (and projects' usage when
                           * the last pass needed it): one round trip (store_sched_pass_read) */
    SVC_SCHED_STEP_VIEW,  /* the kept view of the waiting jobs brought up to date (a round trip only
                           * when it must be read whole again) and the groups' heads */
    SVC_SCHED_STEP_FACTS, /* new jobs' data paths and predictions */
    SVC_SCHED_STEP_BUILD, /* the snapshot built from them (no round trip) */
    SVC_SCHED_STEPS
};
typedef struct svc_sched_pass {
    int64_t at_us, took_us;
    int jobs, admitted;
    /* where took_us went: reading the snapshot, deciding (sched_admit), committing the admissions
     * and preemptions, writing the waiting jobs' reasons (0 in a pass that does not) */
    int64_t read_us, decide_us, commit_us, reasons_us;
    bool full_read; /* it read every waiting job (else only those written since the last pass) */
    int facts_read; /* the jobs whose data paths or run-time prediction it read (not kept from before) */
    /* the read's wall time by step: SVC_SCHED_STEP_* */
    int64_t step_us[SVC_SCHED_STEPS];
    /* Work and waiting, for read, decide and commit (index 0-2): the scheduler thread's own CPU time
     * (CLOCK_THREAD_CPUTIME_ID) and its time runnable but waiting for a CPU (the kernel's run-queue
     * delay, /proc/thread-self/schedstat); the same two for the database backend serving the read
     * and the commit, when it runs on this machine (/proc/<backend pid>/schedstat; else 0). Wall
     * time less these four is the rest: the backend blocked (I/O, fsync, locks) and the socket. */
    int64_t cpu_us[3], cpu_wait_us[3], db_cpu_us[3], db_wait_us[3];
} svc_sched_pass_t;
void svc_sched_record(svc_t *s, svc_sched_pass_t *buf, int cap);
int svc_sched_recorded(svc_t *s);

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

/* ---- admission (service/admit.c), a pure function over a snapshot, for tests -------------------
 * Queues have a nominal quota per slot type; a queue in a cohort may borrow the unused quota its
 * cohort lends, up to its borrowing limit, and lends its own unused quota except what its lending
 * limit keeps back. The cohort's pool of a slot type is what its queues lend: a queue's usage
 * above what it keeps (guaranteed = quota - lendable) comes from the pool, so no queue's
 * borrowing ever reaches what another queue keeps.
 *
 * One pass: every (queue, slot type) offers its head job: highest priority, then (when the queue
 * shares fairly between projects) the project with the least recent usage, then the oldest. Among
 * the heads, a job that stays within its queue's nominal quota goes before one that borrows, then
 * the queue with the lowest weighted dominant share (max over slot types of usage / the cluster's
 * slots of that type, divided by the weight; DRF), then higher priority, then the older job. A
 * head is admitted whole (sched_place) or not at all. A head that waits for quota or for free
 * slots blocks the jobs behind it in its queue and slot type (a big job is never starved by small
 * ones behind it: they start before it only by backfill, below), and a head within its nominal
 * quota that waits for free slots also stops its cohort's borrowing of that slot type for the
 * pass, so borrowers do not take the slots it waits for. A job that can never fit (the workers,
 * its data roots, or the most quota its queue could get) blocks nothing.
 *
 * Preemption. A head that cannot start may preempt running jobs as its queue's preemption policy
 * (below) allows: by default lower-priority jobs of its own queue while that queue is not
 * borrowing (its usage not above its nominal quota, also when its own jobs fill it; what it may
 * use after them is the quota check) and,
 * for a head within its queue's nominal quota, jobs of queues of its cohort that use more than
 * their nominal quota (reclaim). A head its policy keeps from victims the default policy would
 * take says so in its reason ("; queue Q's preemption.within_queue (never) keeps it from
 * preempting its lower-priority jobs"). Any head may
 * preempt a job started by backfill that ran past the end predicted for it, whatever the policy
 * (it started on that condition). A job never preempts the job that last preempted it, and one preempted
 * protect_after times is never a victim of a job of its
 * priority or lower. Slots being freed (jobs STOPPING, victims chosen earlier in the pass) count
 * first: a head they would let start waits for them and preempts nothing. Otherwise, among the
 * sets of candidates whose slots and quota let the head start, the one chosen loses the least work:
 * fewest steps since each victim's last checkpoint in all, then fewest jobs, then the lowest
 * priorities, then the newest (exactly among the SCHED_PREEMPT_EXACT candidates that lose least,
 * else the first that suffice in that order, less any not needed). The head waits
 * (SCHED_PREEMPTING) while its victims stop.
 *
 * Backfill. When the head of a queue and slot type waits for free slots or for quota, its earliest
 * start is when enough of the jobs holding slots have ended by their predicted ends (end_s) for its
 * quota check to pass and its gang to fit, and it then takes the slots where it would be placed at
 * that time (reserved). Blocked heads reserve in turn, in the order they blocked: the heads before
 * one take their reservations at their earliest starts and give them back after their predicted run
 * times (runtime_s; never without one, unless that would keep the later head from ever starting).
 * Jobs behind a head start now, if their quota allows (backfilled), in free slots and quota that no
 * such head of their slot type needs: for each head whose earliest start comes before the job's
 * predicted end (now + runtime_s), only slots that head (and the heads holding slots then) leave
 * unreserved then, and only if the head's quota check still passes then with the job's usage. With
 * no prediction for what the head waits for, or for the job, nothing is backfilled behind it, so
 * with exact predictions backfill never delays a head's earliest start. */
#define SCHED_NTYPES 2        /* slot types: 0 "cpu", 1 "gpu" */
#define SCHED_UNLIMITED (-1)  /* a quota or limit with no bound */
/* 0 for "cpu", 1 for "gpu", -1 for anything else. */
int sched_slot_type(const char *name);
/* "cpu", "gpu" ("?" out of range). Static storage. */
const char *sched_slot_type_name(int type);

/* A queue's preemption policy (Kueue's ClusterQueue spec.preemption), which the preemptor's queue
 * decides. within: which jobs of its own queue a head may preempt (withinClusterQueue):
 * lower-priority ones, or none. reclaim: which jobs of the queues of its cohort that borrow beyond
 * their nominal quota it may preempt (reclaimWithinCohort): any, lower-priority ones, or none.
 * Value 0 of each is the default, the rule of a queue that sets none. The values and their names
 * (the API's, "lower_priority", ...) are base/api_names.h's KILN_WITHIN_QUEUE_POLICIES and
 * KILN_RECLAIM_WITHIN_COHORT_POLICIES, the one list the enums below, sched_within_names[] and
 * sched_reclaim_names[] (indexed by value and ended by NULL: what the validator and the texts
 * read) and the CLI's help are made from. */
typedef enum sched_within {
#define SCHED_WITHIN_ENUM_(id, name) SCHED_WITHIN_##id,
    KILN_WITHIN_QUEUE_POLICIES(SCHED_WITHIN_ENUM_, SCHED_WITHIN_ENUM_)
#undef SCHED_WITHIN_ENUM_
} sched_within_t;
typedef enum sched_reclaim {
#define SCHED_RECLAIM_ENUM_(id, name) SCHED_RECLAIM_##id,
    KILN_RECLAIM_WITHIN_COHORT_POLICIES(SCHED_RECLAIM_ENUM_, SCHED_RECLAIM_ENUM_)
#undef SCHED_RECLAIM_ENUM_
} sched_reclaim_t;
extern const char *const sched_within_names[];
extern const char *const sched_reclaim_names[];
/* The value called name in names (sched_within_names or sched_reclaim_names), or -1. */
int sched_policy_parse(const char *const names[], const char *name);

typedef struct sched_queue {
    const char *name;
    const char *cohort;                 /* NULL or "": none (no borrowing, no lending) */
    int quota[SCHED_NTYPES];            /* nominal; SCHED_UNLIMITED: no limit (the default queue) */
    int borrowing_limit[SCHED_NTYPES];  /* SCHED_UNLIMITED: as much as the cohort lends */
    int lending_limit[SCHED_NTYPES];    /* SCHED_UNLIMITED: lends all its unused quota */
    double weight;                      /* > 0; fair-sharing weight between queues */
    bool fair_projects;                 /* order its jobs by their project's recent usage */
    sched_within_t within;              /* preemption within the queue (0: lower_priority) */
    sched_reclaim_t reclaim;            /* reclaim within the cohort (0: any) */
    int usage[SCHED_NTYPES];            /* slots its placed, unfinished jobs hold now */
} sched_queue_t;

typedef struct sched_job {
    const char *id;
    int queue;              /* index into the snapshot's queues */
    int project;            /* index into project_usage: one index per (queue, project) */
    int priority;
    int nodes, slots_per_node;
    int type;               /* slot type index */
    double runtime_s;       /* predicted run time once started; < 0: no prediction (never backfilled) */
    const char *runtime_estimate; /* NULL, or how runtime_s was estimated (nothing of its model at its
                                     resources has run yet): its pending reason says so */
    const char *preempted_by; /* NULL, or the job that preempted it last: it never preempts that one back */
    const char *project_name; /* its project, for what its texts may name (sched_job_name); NULL: none */
} sched_job_t;

/* A job that holds slots now: placed, starting, running, or stopping (freeing them). */
typedef struct sched_running {
    const char *id;
    int queue;              /* index into the snapshot's queues; -1: unknown (never a victim) */
    int type;               /* slot type index */
    int priority;
    int nodes, slots_per_node;
    const int *worker;      /* [nodes]: index into workers of each node's slots */
    bool preemptible;       /* RUNNING (placed or starting jobs are not preempted) */
    bool freeing;           /* STOPPING: its slots come back soon */
    int64_t steps_lost;     /* steps since its last checkpoint: the work preempting it loses */
    int preemptions;        /* times it was preempted before */
    double start_s;         /* when its attempt started (clock of now_s); newer is larger */
    double end_s;           /* predicted end (clock of now_s); < 0: no prediction */
    bool backfilled;        /* started by backfill, predicted to end by backfill_end_s */
    double backfill_end_s;
    const char *project_name; /* its project, for what its texts may name (sched_job_name); NULL: none */
} sched_running_t;

typedef struct sched_snapshot {
    const sched_worker_t *workers;  /* their slots_free counts every placed job */
    int nworkers;
    const sched_queue_t *queues;
    int nqueues;
    const sched_job_t *jobs;        /* pending jobs in priority order, then oldest first */
    int njobs;
    const double *project_usage;    /* each project's recent usage in its queue, in slots (held
                                       now plus the decayed past); may be NULL when nprojects 0 */
    int nprojects;
    /* NULL, or whether job j may run on worker w (its data roots hold the files it reads). */
    bool (*eligible)(void *ctx, int job, int worker);
    void *ctx;
    const sched_running_t *running; /* the jobs holding slots (may be NULL when nrunning is 0) */
    int nrunning;
    double now_s;                   /* the clock of the predictions (seconds) */
    int protect_after;              /* preemptions after which a job is protected (0: 3) */
} sched_snapshot_t;

typedef enum sched_outcome {
    SCHED_ADMITTED = 1,
    SCHED_WAIT_BEHIND,    /* behind its queue's blocked head of the same slot type */
    SCHED_WAIT_SLOTS,     /* fits, but not the free slots now (blocks its queue's slot type) */
    SCHED_WAIT_QUOTA,     /* its queue's quota, borrowing limit or cohort is used up now */
    SCHED_WAIT_WORKERS,   /* more than the alive workers (of its data roots) could ever hold */
    SCHED_WAIT_NEVER_QUOTA, /* more than any quota its queue could ever get */
    SCHED_PREEMPTING,     /* waits while victims[] stop to make room for it (blocks like WAIT_SLOTS) */
} sched_outcome_t;

#define SCHED_PREEMPT_EXACT 12  /* candidates searched exhaustively for the least lost work */
#define SCHED_MAX_VICTIMS 32

typedef struct sched_decision {
    sched_outcome_t outcome;
    bool borrowed;             /* admitted above its queue's nominal quota */
    sched_placement_t pl;      /* when admitted */
    char reason[300];          /* why it waits, as the job shows it ("" when admitted) */
    bool backfilled;           /* admitted by backfill ahead of job behind_head, to end by end_s */
    int behind_head;
    double end_s;
    double head_start_s;       /* backfilled: behind_head's earliest start, which it does not delay;
                                  a blocked head that reserves (waits for free slots or quota with a
                                  known earliest start): its own earliest start; else 0 */
    int nvictims;              /* SCHED_PREEMPTING: the running jobs (indices) to preempt for it */
    int victims[SCHED_MAX_VICTIMS];
} sched_decision_t;

/* How job id of project `project` is named in a text that the members of project `reader` read
 * (a job's reason, its events, its pending reason): "job <id>" when it is a job of their project,
 * else "a job of another project" (DESIGN.md: what a caller cannot see does not exist for it).
 * NULL is a project of its own, equal only to NULL (a snapshot without projects). Into buf (n at
 * least SCHED_JOB_NAME_LEN); returns buf. Every scheduler text that names another job names it so. */
#define SCHED_JOB_NAME_LEN 48
const char *sched_job_name(const char *reader, const char *id, const char *project, char *buf, size_t n);

/* Decides one pass: out[j] for each of snap->njobs jobs; order[0..*nadmitted) = the admitted jobs
 * in the order they were admitted (their placements assume that order). Does not modify the
 * snapshot. Returns 0, or KILN_ENOMEM. */
int sched_admit(const sched_snapshot_t *snap, sched_decision_t *out, int *order, int *nadmitted);

/* Why running job r is preempted for pending job j (a decision's victim), for r's reason after
 * "preempted by job J: " (svc_job_preempt names J there, as r's project may read it; this text
 * names no job): the rule that allowed it, then what the stop does ("it needs this job's slots
 * and has the higher priority in queue Q (5, this job 0); allowed by queue Q's
 * preemption.within_queue (lower_priority); this job's ranks get SIGTERM, checkpoint and exit, and
 * it resumes from that checkpoint when admitted again; if that checkpoint fails (or a script does
 * not checkpoint on SIGTERM), the 16 step(s) since its last checkpoint are lost"; "its queue Q
 * reclaims the quota queue R borrows, which this job holds; allowed by queue Q's
 * preemption.reclaim_within_cohort (any); ..."; "it needs the slots this job holds in queue R:
 * this job was backfilled ahead of it and ran past its predicted end ...; ..."). Returns the
 * preemption's kind for the per-queue counter: "priority", "reclaim" or "backfill_overrun"
 * (SVC_PREEMPT_REASONS). */
const char *sched_victim_reason(const sched_snapshot_t *snap, int j, int r, char *buf, size_t n);
/* The event of pending job j that preempts running jobs victims[0..nv) (those its decision's stop
 * orders reached), in words its project may read (victims named by sched_job_name): "preempting
 * job A, job B for 4 cpu slot(s) on workers w1, w2: lower priority in queue Q, allowed by queue
 * Q's preemption.within_queue (lower_priority); it starts once they have stopped", each rule that
 * allowed one of them once ("queue Q reclaims the quota queue R borrows, allowed by queue Q's
 * preemption.reclaim_within_cohort (any)", "backfilled ahead of it and past their predicted end
 * ..."). Into buf (n bytes); returns buf. */
const char *sched_preemptor_reason(const sched_snapshot_t *snap, int j, const int *victims, int nv, char *buf,
                                   size_t n);

/* The most slots of its slot type a job of queue q could ever hold under the queues' quotas and
 * limits (its nominal quota plus what it may borrow from what its cohort lends), or
 * SCHED_UNLIMITED; *which (OUT, may be NULL) = what bounds it: "quota", "borrowing_limit" or
 * "lending_limit" (the cohort lends no more). */
int sched_quota_max(const sched_queue_t *queues, int nqueues, int q, int type, const char **which);
/* sched_quota_max, and what bounds it in words for a person ("its quota (8) plus its
 * borrowing_limit (4) allow at most 12", "at most 10, its quota (8) plus the 2 the other queues of
 * cohort \"research\" lend", "its quota allows at most 8"), written to words (n bytes). */
int sched_quota_bound(const sched_queue_t *queues, int nqueues, int q, int type, const char **which, char *words,
                      size_t n);

/* ---- pending reasons (service/pending.c), a pure function over a pass, for tests -------------
 * What a person reads about a waiting job: its position in its queue, what it needs and what is
 * missing, the jobs it waits for, and when it should start. The estimate releases the slots of
 * the jobs holding them in the order they are predicted to end (their measured step time times
 * steps remaining, or what stopping.max_runtime_s leaves them) until the job fits the workers it
 * may use and, when it waits for quota, its queue's nominal quota; it is unknown when a job whose
 * end is unknown stands in the way, when nothing would make it fit, and for a job waiting behind
 * another (that job's run time is not known before it runs). */
#define SCHED_PENDING_MAX_BLOCKING 10
typedef struct sched_pending {
    int position;           /* 1-based, among its queue's waiting jobs in the snapshot's order */
    char missing[400];      /* "needs 2 cpu slot(s) on 2 worker(s); queue nlp: quota 8, used 8, ..." */
    int nblocking;
    const char *blocking[SCHED_PENDING_MAX_BLOCKING]; /* job ids (borrowed from snap and running) */
    double start_s;         /* seconds from now to its estimated start; < 0 when unknown */
} sched_pending_t;

/* Fills out[j] for each job of the snapshot that sched_admit did not admit (dec and order are
 * its results for snap); admitted jobs get position 0. running: every job holding slots after
 * the pass, those it admitted included (their slots are the snapshot's slots_free less the
 * admitted placements); only their id, queue, type, nodes, slots_per_node, worker (-1: not in
 * the snapshot) and end_s (on the clock of snap->now_s) are read. Does not modify its inputs.
 * Returns 0, or KILN_ENOMEM. */
int sched_pending(const sched_snapshot_t *snap, const sched_decision_t *dec, const sched_running_t *running,
                  int nrunning, sched_pending_t *out);

/* What the event of job j's admission says (its queue; within quota, or borrowing how many slots
 * from which cohort; the quota and the usage with the job) into out (size n). usage: its queue's
 * slots in use per type just before this admission (NULL: the snapshot's). */
void sched_admission_text(const sched_snapshot_t *snap, int j, const sched_decision_t *d, const int *usage,
                          char *out, size_t n);
/* ---- tuning jobs (tune.c) ----------------------------------------------------------------------
 * A tuning job (issue 29) searches a base job spec's parameters toward an objective metric; its
 * trials are ordinary jobs in the base job's project and queue, tagged tuning_job = its id and
 * tuning_trial = their number. Editors of the project create and stop tuning jobs, viewers read
 * them; a tuning job of a project the caller has no role in does not exist for it. As JSON:
 * {"id", "name", "project", "state" (RUNNING, STOPPING, COMPLETED, FAILED, STOPPED), "reason",
 * "strategy", "objective": {"metric", "goal"}, "max_jobs", "max_parallel_jobs", "seed", "spec"
 * (the normalised request), "trials": [{"trial", "job_id", "parameters", "objective" (the
 * trial's latest value, or null), "steps", "rung", "state", "reason", "rungs": [{"rung", "steps",
 * "objective"}] (hyperband: the rungs it finished, its last too when it completed there)}, then a
 * warm start's parents' trials, each with "parent": its tuning job's id], "best": {"job_id",
 * "objective", "parameters", "parent" (null: its own)} or null, "warm_start" ({"parents", "type"}
 * or null), "events", "submitted_by", "created_at", "updated_at", "ended_at"}. */

/* Validates body (spec_tuning_parse: KILN_EINVAL naming the field), checks the caller is an
 * editor of the base job's project, that a warm start's parents suit it (KILN_EINVAL naming
 * warm_start.parents[i] or warm_start.type) and that its queue takes the job, draws a seed when
 * none is given, and stores the tuning job RUNNING; the leader's controller starts its trials. */
int svc_tuning_create(svc_t *s, const svc_caller_t *who, const json_t *body, json_t **out, kiln_err_t *err);
/* A page of a list that takes only a page size and token (REST's page_size and page_token, gRPC's
 * alike). */
typedef struct svc_page {
    int page_size;           /* 1 to KILN_PAGE_SIZE_MAX when page_size_set; otherwise the list's default */
    bool page_size_set;      /* a caller gave page_size (then 0 or 501 is refused, not defaulted) */
    const char *page_token;  /* opaque, the next_page_token of the previous page, or NULL */
} svc_page_t;
/* *out = {"tuning_jobs": [...], "next_page_token": "..." ("" on the last page)}: a page (500 when
 * no page size is given) of those of the projects the caller can see, newest first (created_at,
 * then id), each without trials and spec, with "trial_count", "trials_done", "trials_running" and
 * "best" ({"job_id", "objective"} or null), from one query (store_tuning_list_json). Errors:
 * KILN_EINVAL with err->field "page_size" (not 1 to 500) or "page_token" (not a token of this
 * list: the messages of svc_page_token_decode), KILN_EDB. */
int svc_tuning_list(svc_t *s, const svc_caller_t *who, const svc_page_t *page, json_t **out, kiln_err_t *err);
int svc_tuning_get(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err);
/* A RUNNING tuning job becomes STOPPING (editors): the controller stops its trials, then it is
 * STOPPED. KILN_ESTATE when it is not RUNNING. *out = the tuning job. */
int svc_tuning_stop(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err);

/* ---- tuning search (service/tune_search.c), pure functions for tests and benchmarks ------------
 * A tuning job's trials are numbered from 0. Trial n's parameter values depend only on the
 * request and n: random and hyperband draw each parameter from the seed, n and the parameter's
 * place (the same seed gives the same trials, on any kilnd, after any restart); grid takes the
 * n-th point of the grid (the last parameter varying fastest). TPE (bayesian, and hyperband's
 * sampler tpe) adds the history: trial n's values from the seed, n and the ended trials' results
 * (tune_next_values below). */

/* A number in [0, 1) from (seed, trial, param): stateless and the same everywhere. */
double tune_uniform(uint64_t seed, int trial, int param);
/* p's value for the uniform draw u in [0, 1): linear, log (log-uniform) or reverse_log (1 - v
 * log-uniform) over [min, max], integers rounded to the nearest and each integer given its cell's
 * share of the scale, categorical values with equal chances. Caller owns the result. */
json_t *tune_param_value(const spec_tune_param_t *p, double u);
/* The grid's points (the product of the categorical parameters' values and the integer
 * parameters' ranges); -1 when a parameter is continuous or the product is past 2^40. */
int64_t tune_grid_size(const spec_tuning_t *t);
/* Trial n's values, an object by parameter name. Caller owns it; NULL past the grid's end (or
 * when out of memory). */
json_t *tune_trial_values(const spec_tuning_t *t, int trial);
/* Hyperband's rungs: the steps each rung trains to (min_resource, x eta, ..., max_resource)
 * into steps (SPEC_TUNE_MAX_RUNGS), returning how many; 0 for the other strategies. */
int tune_rungs(const spec_tuning_t *t, int64_t *steps);
/* Hyperband's brackets (hyperband.brackets, at most one a rung; 0 for the other strategies).
 * Bracket b's trials start at rung b and are promoted by rank among their bracket only; the
 * brackets get about equal budgets of steps, as in Hyperband (Li et al., JMLR 2018), so the
 * more aggressive a bracket, the more trials it gets. */
int tune_brackets(const spec_tuning_t *t);
/* Trial n's bracket: a function of the request and n only (0 with one bracket; trial 0 is in
 * bracket 0). */
int tune_trial_bracket(const spec_tuning_t *t, int trial);
/* Trial n's own rungs: the steps of the rungs of its bracket (tune_rungs from its bracket's
 * first), into steps (SPEC_TUNE_MAX_RUNGS), returning how many; its rung k is the k-th of these.
 * 0 for the other strategies. */
int tune_trial_rungs(const spec_tuning_t *t, int trial, int64_t *steps);

/* What a trial is, as the controller sees it. */
typedef enum tune_trial_state {
    TUNE_TRIAL_ACTIVE = 1,   /* its job waits or runs */
    TUNE_TRIAL_PAUSED,       /* hyperband: it finished a rung below the top and waits for promotion */
    TUNE_TRIAL_COMPLETED,    /* its job ended COMPLETED (at the top rung, for hyperband) */
    TUNE_TRIAL_FAILED,       /* its job ended FAILED (after its own retries) */
    TUNE_TRIAL_STOPPED,      /* its job was stopped */
} tune_trial_state_t;

/* A trial's objective by step: steps ascending, one value each (the lowest rank's, its latest
 * attempt's); n = 0 when none was loaded. */
typedef struct tune_curve {
    const int64_t *steps;
    const double *values;
    int n;
} tune_curve_t;

typedef struct tune_trial {
    int trial;                        /* its number */
    const char *job_id;               /* borrowed, for reasons */
    tune_trial_state_t state;
    bool has_objective;               /* it reported the objective metric */
    double objective;                 /* its latest value */
    const char *reported;             /* the metrics it reported, comma-separated (borrowed) */
    int nrungs;                       /* hyperband: rungs it finished (of its own, tune_trial_rungs) */
    double rung_objective[SPEC_TUNE_MAX_RUNGS]; /* the objective at the end of each */
    int bracket;                      /* hyperband: tune_trial_bracket of its number */
    tune_curve_t curve;               /* early_stopping "auto": the objective by step (borrowed) */
    int64_t total_steps;              /* the steps it trains in all (0: unknown) */
    const json_t *values;             /* its parameter values, an object by name (borrowed; NULL:
                                       * unknown, and TPE does not learn from it) */
    const char *parent;               /* warm start: the parent tuning job's id when the trial is one of
                                       * its (history: never started, stopped, promoted or counted as
                                       * this job's); NULL for this job's own trials (borrowed) */
} tune_trial_t;

typedef struct tune_view {
    const spec_tuning_t *t;
    const tune_trial_t *trials;       /* by trial number */
    int ntrials;
    int next_trial;                   /* trials drawn so far */
    const char *last_failure;         /* the last failed trial's reason, or NULL */
    const json_t *tried;              /* warm start: the parents' configurations (tune_tried_t's
                                       * source, an array of objects by parameter name), or NULL */
} tune_view_t;

#define TUNE_PLAN_MAX 64
/* The median stopping rule (early_stopping "auto", random and grid; Golovin et al., Google
 * Vizier, KDD 2017): a running trial is stopped at step s, its latest step with the objective,
 * when its best objective up to s is worse than the median of the completed trials' running
 * averages of the objective up to s (each over its values at steps <= s). It is judged only once
 * TUNE_MEDIAN_MIN_TRIALS completed trials have values up to s and s reaches 1/TUNE_MEDIAN_MIN_PART
 * of its total steps (when known). */
#define TUNE_MEDIAN_MIN_TRIALS 3
#define TUNE_MEDIAN_MIN_PART 10
typedef struct tune_stop {
    int index;                        /* into the view's trials */
    int64_t step;                     /* the step it was judged at */
    double best;                      /* its best objective up to step */
    double median;                    /* the completed trials' median running average up to step */
    int history;                      /* how many completed trials that median is over */
} tune_stop_t;
typedef enum { TUNE_END_NONE = 0, TUNE_END_COMPLETED, TUNE_END_FAILED } tune_end_t;
typedef struct tune_plan {
    int nnew;                         /* trials to start now: next_trial .. next_trial + nnew - 1 */
    int promote[TUNE_PLAN_MAX];       /* indexes into trials of paused trials to continue a rung up */
    int npromote;
    tune_stop_t stop[TUNE_PLAN_MAX];  /* running trials the median stopping rule stops now */
    int nstop;
    int best;                         /* index of the best trial so far, -1 when none */
    tune_end_t end;                   /* the search ends now, with reason */
    char reason[400];
} tune_plan_t;

/* ---- warm start: the parents' trials as history ------------------------------------------------
 * A warm-started tuning job's view holds its parents' trials after its own (parent set, state
 * COMPLETED, STOPPED or FAILED), and tried, every configuration a parent ran. tune_decide counts
 * only its own trials for max_parallel_jobs, max_jobs and max_failed_trials, and never starts,
 * stops or promotes a parent's trial; the parents' trials count for the best (a parent's best
 * stays best until a trial beats it: a tie does not), completion.target_objective, the bar
 * no_improvement_trials measures against (the count itself is of this job's trials, so a search
 * whose parents stagnated still runs), the median stopping rule's completed trials and
 * hyperband's rung rankings. A new trial never repeats a configuration a parent tried. */

/* Trial n's values when the configurations in tried (an array of objects by parameter name, NULL
 * or empty: none) must not repeat. Grid takes the n-th grid point not in tried. Random and
 * hyperband draw as tune_trial_values does and, while the draw is in tried, draw again from the
 * next stream (the seed mixed with the redraw's number; TUNE_REDRAWS at most); a space of integer
 * and categorical parameters then takes the first untried grid point from a drawn offset. Caller
 * owns the result; NULL when nothing is left untried (or out of memory). */
#define TUNE_REDRAWS 64
json_t *tune_trial_values_new(const spec_tuning_t *t, int trial, const json_t *tried);
/* How many points of t's space tried leaves: the grid's points not in tried (for any strategy
 * whose parameters are all integer or categorical); -1 when a parameter is continuous or the
 * space is past 2^40 points. */
int64_t tune_space_left(const spec_tuning_t *t, const json_t *tried);
/* The index into v's trials of the best trial so far (the best objective of a trial that did not
 * fail; on a tie a parent's, else the earlier in v's order), -1 when none. */
int tune_best(const tune_view_t *v);

/* ---- TPE (strategy "bayesian", and hyperband's sampler "tpe") -----------------------------------
 * The Tree-structured Parzen Estimator (Bergstra et al., NeurIPS 2011) as Optuna's TPESampler does
 * it by default (univariate, tune_search.c says how). Until TUNE_TPE_STARTUP observations exist a
 * trial takes random search's draw (so the first trials equal random's); after that, trial n's
 * values are a pure function of the request, n and the observations (random numbers from (seed,
 * n), apart from random's). Only ended trials are observations: with trials still running
 * (max_parallel_jobs > 1), TPE learns from the finished ones only. */
#define TUNE_TPE_STARTUP 10
#define TUNE_TPE_CANDIDATES 24
typedef struct tune_obs {
    const json_t *values;             /* by parameter name (borrowed) */
    double objective;                 /* better as t's goal says */
    bool partial;                     /* stopped before its end: ranked after every full one */
    int rung;                         /* hyperband: the (global) rung its objective is from; among
                                       * partial ones the higher rung ranks first (0 for bayesian) */
} tune_obs_t;
/* Trial n's values by TPE over the nobs observations obs (in age order, oldest first: the
 * older ones weigh less past 25). Each parameter learns from the observations that have a value
 * of it in its range; one with fewer than TUNE_TPE_STARTUP takes random's draw. Caller owns the
 * result; NULL when out of memory. */
json_t *tune_tpe_values(const spec_tuning_t *t, int trial, const tune_obs_t *obs, int nobs);
/* TPE's observations in v into out (room for v->ntrials), returning how many; 0 when t does not
 * use TPE. bayesian: every trial (a parent's too) that ended COMPLETED with the objective (its
 * final value), and those STOPPED with one (partial: stopped early by the median rule, or a
 * parent's left unfinished). hyperband with sampler "tpe" (as Optuna's TPE under its Hyperband
 * pruner, not BOHB's one rung): every trial but a failed one with a result, COMPLETED ones at
 * their final objective, the rest (paused, running on, stopped) partial at their highest finished
 * rung's objective and ranked by that rung (tune_rungs' index), higher first, then by objective;
 * so TPE starts once TUNE_TPE_STARTUP trials have finished a rung. */
int tune_tpe_history(const tune_view_t *v, tune_obs_t *out);
/* The values of new trial n of v: TPE over tune_tpe_history when t uses it and there are at least
 * TUNE_TPE_STARTUP observations, else (and when TPE's pick is a configuration in v->tried)
 * tune_trial_values_new(t, n, v->tried). Caller owns it; NULL as tune_trial_values_new. */
json_t *tune_next_values(const tune_view_t *v, int trial);

/* The median stopping rule for running trial i of v (see TUNE_MEDIAN_MIN_TRIALS): true when it is
 * stopped now, with *out filled; false when it goes on or cannot be judged yet. */
bool tune_median_stop(const tune_view_t *v, int i, tune_stop_t *out);

/* One controller decision over a snapshot: in this order, the search FAILS when a trial finished
 * a rung or ended COMPLETED without the objective metric (the reason names the metric and those
 * it reported) or when max_failed_trials trials failed; it COMPLETES when the best objective
 * reaches completion.target_objective, when no_improvement_trials completed trials in a row did
 * not improve on the best (trials stopped early count, in trial order), or when every trial is
 * drawn and none runs or can be promoted. Otherwise running trials the median stopping rule
 * judges worse are stopped (early_stopping "auto"), paused trials in the top 1/eta of their rung
 * so far among their bracket are promoted (top rungs first) and new trials fill what max_parallel_jobs leaves.
 * Returns 0. */
int tune_decide(const tune_view_t *v, tune_plan_t *out);

#endif /* KILN_SERVICE_H */
