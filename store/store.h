/* store.h - kiln's PostgreSQL access: a small connection pool, the migrations runner, and every
 * SQL statement kiln runs (jobs, events, workers, assignments, rank exits, bulk log and metric
 * ingest with COPY, and the reads that serve the API). It knows tables and rows, not policy:
 * which state follows which is service/'s business.
 * A store_conn_t is used by one thread at a time; take it with store_conn_get(), give it back with
 * store_conn_put(). Functions taking a store_conn_t run inside whatever transaction is open on it
 * (store_begin/store_commit), or autocommit when none is. Errors: KILN_EDB (database failure,
 * err says which statement and why), KILN_ENOTFOUND, KILN_EEXIST, KILN_EINVAL as noted. */
#ifndef KILN_STORE_H
#define KILN_STORE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"
#include "proto/kiln.pb-c.h"
#include "query/query.h"

typedef struct store store_t;
typedef struct store_conn store_conn_t;

#define STORE_ID_LEN 37      /* a UUID as text plus its NUL */
#define STORE_WORKER_ID_LEN 64
#define STORE_HASH_LEN 32    /* BLAKE2b-256 of a token or credential */

/* ---- pool and transactions -------------------------------------------------------------------- */

/* Opens pool_size (>= 1) connections to url. Caller owns *out; free with store_close().
 * Returns 0 or KILN_EDB. Thread-safe afterwards. */
int store_open(const char *url, int pool_size, store_t **out, kiln_err_t *err);
/* Closes every connection. All connections must have been given back. Accepts NULL. */
void store_close(store_t *st);
/* Takes a connection, waiting (up to 30 s) for one to be free; reconnects a broken one. The
 * caller owns it until store_conn_put(). Returns 0, KILN_EDB (database unreachable) or
 * KILN_EUNAVAIL (no connection came free in time). */
int store_conn_get(store_t *st, store_conn_t **out, kiln_err_t *err);
/* Gives a connection back. What its user left on it is undone for the next: a transaction (also
 * one a statement opened) is rolled back, deferred statements dropped; a session that cannot be
 * brought back (left in pipeline mode) is closed, to be reopened when next taken. Accepts NULL c. */
void store_conn_put(store_t *st, store_conn_t *c);
/* The process id of the PostgreSQL backend serving c (0 when not connected): for a benchmark that
 * accounts for the database's CPU time per call, when the database runs on the same machine. */
int store_conn_backend_pid(store_conn_t *c);

int store_begin(store_conn_t *c, kiln_err_t *err);
int store_commit(store_conn_t *c, kiln_err_t *err);
void store_rollback(store_conn_t *c);   /* no-op when no transaction is open */
/* Within the transaction open on c: each later statement of it that runs longer than ms is
 * cancelled and fails with KILN_ETIMEDOUT. */
int store_tx_statement_timeout(store_conn_t *c, int ms, kiln_err_t *err);
/* SELECT 1: 0 or KILN_EDB. */
int store_ping(store_conn_t *c, kiln_err_t *err);

/* ---- migrations ------------------------------------------------------------------------------- */

/* Applies, in file-name order, every migration not yet recorded in schema_migrations; each in its
 * own transaction, all under a PostgreSQL advisory lock so concurrent callers (several kilnd) wait
 * for one another instead of conflicting. dir NULL uses the migrations embedded at build time,
 * otherwise every "*.sql" file in dir. *applied (OUT, may be NULL) = how many were applied now.
 * Returns 0, KILN_EIO (dir unreadable), KILN_EDB (a migration failed; err names it). */
int store_migrate(store_conn_t *c, const char *dir, int *applied, kiln_err_t *err);
/* *pending (OUT) = migrations known to this binary (dir as above) that are not recorded. */
int store_migrations_pending(store_conn_t *c, const char *dir, int *pending, kiln_err_t *err);

/* ---- jobs --------------------------------------------------------------------------------------- */

typedef struct store_job_new {
    const char *name, *project, *queue, *slot_type;
    const char *spec_json;        /* normalised spec */
    const char *tags_json;        /* JSON object of string tags */
    const char *idempotency_key;  /* or NULL */
    const char *reason;           /* reason of the first (QUEUED) event */
    const char *submitted_by;     /* the submitting user (the first event's actor), or NULL */
    const char *paths_json;       /* JSON array of the paths it reads and checkpoints to */
    const uint8_t *request_hash;  /* STORE_HASH_LEN bytes identifying the request (its normalised
                                     spec as sent, before the project's default queue fills in
                                     "queue"), which store_job_key_get compares when the
                                     idempotency key is reused; or NULL (no key) */
    const char *hparams_json;     /* JSON object of the numbers search indexes as hp.NAME
                                     (spec_hparams_flat); NULL: the spec's numeric hyperparameters */
    int priority, nodes, slots_per_node, world_size, max_attempts;
    int64_t total_steps;
} store_job_new_t;

/* Inserts a QUEUED job, its first event and its numeric hyperparameters (job_hparams) in one
 * statement; *created = true. With an idempotency key that a job of its project already holds (a
 * key is its project's: another project may hold the same one), inserts nothing, sets
 * *created = false, id_out the job holding the key, and returns KILN_EREUSED (field
 * "idempotency_key"): whether that job answers this request is the caller's to decide
 * (store_job_key_get, which callers ask first). KILN_ENOTFOUND (field "project") when the job's
 * project does not exist, KILN_EINVAL (field "queue") when its queue does not exist or does not
 * let the project in (both checked in the same statement, which locks the queue's row FOR KEY
 * SHARE: a change of the queue's projects waits for it, or it for the change).
 * id_out has STORE_ID_LEN. With out_json non-NULL, *out_json = the new job as store_job_get_json
 * shows it (new reference). */
int store_job_insert(store_conn_t *c, const store_job_new_t *j, char *id_out, bool *created,
                     json_t **out_json, kiln_err_t *err);

/* The job holding an idempotency key, as store_job_key_get finds it. */
typedef struct store_job_key {
    bool found;
    bool same;                   /* made from a request with the same request_hash (or either has none) */
    char id[STORE_ID_LEN];
} store_job_key_t;
/* Looks project's idempotency key up (one read through its unique index): *out, found false when
 * no job of the project holds it. request_hash as store_job_new_t's (NULL: not compared). KILN_EDB. */
int store_job_key_get(store_conn_t *c, const char *project, const char *key, const uint8_t *request_hash,
                      store_job_key_t *out, kiln_err_t *err);

/* The state-machine and scheduling view of a job. */
typedef struct store_job_row {
    char id[STORE_ID_LEN];
    char state[16];
    char slot_type[8];
    int attempt, max_attempts, priority, nodes, slots_per_node, world_size;
    bool stop_requested;
    bool ckpt_flat_dir;       /* checkpoints in <checkpoint.path>/<job id>, not its project's area:
                                 a job that had not ended when migration 0014 ran */
    int64_t total_steps;
    char queue[64];
    char project[64];
    int preemptions;          /* times it was preempted (those attempts do not count against max_attempts) */
    char preempted_by[STORE_ID_LEN]; /* while it stops for a preemption: the job it makes room for, else "" */
    char last_preempted_by[STORE_ID_LEN]; /* the last job that preempted it, or "" */
    int fresh_attempt;        /* the attempt that trains from step 0 (store_job_restart_set), or 0 */
} store_job_row_t;

/* Sets (by a job id: also last_preempted_by) or clears (by NULL) what job `id` stops to make room
 * for (preempted_by). */
int store_job_set_preempted_by(store_conn_t *c, const char *id, const char *by, kiln_err_t *err);

/* A job that holds slots (SCHEDULED, STARTING, RUNNING, STOPPING), for preemption and backfill.
 * Times are seconds relative to the database's clock now. */
typedef struct store_holding {
    char id[STORE_ID_LEN];
    char state[16];
    char queue[64];
    char slot_type[8];
    int attempt, priority, nodes, slots_per_node, preemptions;
    int64_t steps_lost;       /* progress step less the metric checkpoint_step (0 when none was written) */
    double age_s;             /* since it was submitted */
    double end_in_s;          /* predicted end: measured step time x steps left, or when
                                 stopping.max_runtime_s stops it (the sooner); -1: no prediction */
    bool backfilled;
    double backfill_end_in_s; /* the end predicted when it was backfilled (negative: past) */
    char workers[2048];       /* its current attempt's unreleased assignments' workers by node rank,
                                 comma-separated */
    char project[64];
} store_holding_t;
/* Every job holding slots now. Caller frees *out. */
int store_job_holding(store_conn_t *c, store_holding_t **out, int *n, kiln_err_t *err);
/* Where a predicted run time comes from (STORE_PREDICT_MODEL and STORE_PREDICT_DEFAULT are
 * estimates: nothing of the job's model at its resources has run yet). */
typedef enum store_predict {
    STORE_PREDICT_NONE = 0,
    STORE_PREDICT_OWN,         /* its own measured step time x the steps it has left */
    STORE_PREDICT_MAX_RUNTIME, /* what stopping.max_runtime_s leaves it */
    STORE_PREDICT_SHAPE,       /* other jobs' mean step time at the same model and resources x its steps */
    STORE_PREDICT_MODEL,       /* other jobs' mean step time of the same model at other resources x its steps */
    STORE_PREDICT_DEFAULT,     /* the scheduler's configured default (never set by the store) */
} store_predict_t;
/* The predicted run time (seconds, once started) of each job ids[i] into runtime_s[i], -1 when
 * there is none, and where it comes from into source[i] (NULL: not wanted): its measured step time
 * x the steps it has left, else what stopping.max_runtime_s leaves it, else the mean measured step
 * time of other jobs with the same model and resources x its steps, else that of other jobs of the
 * same model at any resources x its steps. */
int store_job_predictions(store_conn_t *c, const char *const *ids, int n, double *runtime_s, store_predict_t *source,
                          kiln_err_t *err);

/* Reads and locks (FOR UPDATE, in id order: inside a transaction) the rows of jobs ids[0..n) into
 * out[i] (n entries), with the seconds since each one's last state change in age_s[i]; found[i]
 * says whether job ids[i] exists (ids need not be valid UUIDs; a malformed one is not found). */
int store_job_rows_lock(store_conn_t *c, const char *const *ids, int n, store_job_row_t *out, double *age_s,
                        bool *found, kiln_err_t *err);
/* Reads a job's row; with lock, SELECT ... FOR UPDATE (inside a transaction). KILN_ENOTFOUND when
 * there is no such job (id need not be a valid UUID: a malformed id is simply not found). */
int store_job_row(store_conn_t *c, const char *id, bool lock, store_job_row_t *out, kiln_err_t *err);
/* Sets the job's stopping.max_steps to pause_at (0: removes it, so it runs to its end) and gives
 * it one attempt more (the resumed attempt keeps the retries its spec asked for). */
int store_job_pause_set(store_conn_t *c, const char *id, int64_t pause_at, kiln_err_t *err);
/* Makes attempt fresh_attempt of the job (its next) train from step 0 rather than resume (the
 * assignment's fresh_start): the steps it had trained move from progress_step to retrained_steps,
 * so that the two summed count every step it trains (kilnd's --tune-promoted-restart), and the
 * step it had reached is kept (restart_step): its checkpoints up to there stay in its directories,
 * so a new attempt after that one ended (lost, preempted) before it trained back to that step
 * trains from step 0 again, its steps moved the same way (store_job_transition's new attempt),
 * rather than resume from one of them; one that got there resumes as any attempt does. */
int store_job_restart_set(store_conn_t *c, const char *id, int fresh_attempt, kiln_err_t *err);

enum {
    STORE_TR_STARTED = 1 << 0,   /* set started_at (first time only) */
    STORE_TR_ENDED = 1 << 1,     /* set ended_at */
    STORE_TR_STOP_REQ = 1 << 2,  /* set stop_requested */
    STORE_TR_NEW_ATTEMPT = 1 << 3, /* a new attempt starts: clear eta, preempted_by and backfill_end
                                      (started_at stays the first attempt's start) */
    STORE_TR_PREEMPTED = 1 << 4    /* count one more preemption */
};
/* Moves a job from state `from` to `to` with reason, sets its attempt, and appends the event row
 * (next per-job seq, clock time, actor: the user whose request caused it, NULL or "" for kilnd
 * itself). KILN_ESTATE when the job is no longer in `from` (a concurrent change won). Legality
 * of the transition is the caller's business. */
int store_job_transition(store_conn_t *c, const char *id, const char *from, const char *to,
                         const char *reason, int attempt, int flags, const char *actor,
                         kiln_err_t *err);
/* One job's move for store_job_transition_many. */
typedef struct store_transition {
    const char *id, *from, *reason;
    int attempt;
    double backfill_s; /* >= 0: the job starts by backfill, predicted to end this many seconds from now
                          (its backfill_end); < 0: not */
    bool done;         /* OUT: moved (false: it was no longer in `from`, or there is no such job) */
} store_transition_t;
/* store_job_transition for t[0..n) in one statement, all to `to` with the same flags and actor:
 * each job in its t[k].from moves, with its own reason and attempt, and gets its event row;
 * t[k].done says which did (the others are left as they were). The ids must be distinct. */
int store_job_transition_many(store_conn_t *c, store_transition_t *t, int n, const char *to, int flags,
                              const char *actor, kiln_err_t *err);

/* Appends an event row to job id without moving it (from_state and to_state are both `state`):
 * something the scheduler did for the job that its state does not show (a waiting job preempting
 * others for its slots). Changes nothing else of the job: not its reason, not updated_at (how
 * long it has waited), nothing the scheduler's pass reads. *done (OUT) = false, nothing written,
 * when the job is no longer in `state`. */
int store_job_note(store_conn_t *c, const char *id, const char *state, const char *reason, const char *actor,
                   bool *done, kiln_err_t *err);

/* *out = the job as contracts.md shows it (new reference). KILN_ENOTFOUND. */
int store_job_get_json(store_conn_t *c, const char *id, json_t **out, kiln_err_t *err);

/* A search (store/search.c compiles it to one parameterised SELECT per phase). */
typedef struct store_search {
    const query_node_t *filter;   /* NULL: every job */
    const query_order_t *order;   /* NULL or n == 0: newest first (created desc) */
    const char *const *projects;  /* only jobs of these projects, nprojects of them; NULL: every
                                     project (the caller is a cluster admin) */
    int nprojects;
    int limit;                    /* >= 1 */
    const json_t *after;          /* the cursor *next gave for the previous page, or NULL */
    int64_t now_us;               /* `duration` of a running job runs to this time */
} store_search_t;
/* *out = array of jobs as store_job_get_json shows them, in the search's order (ties broken by
 * id, in the direction of the first key; jobs without a value for a key come after those with
 * one). *next (OUT) = the cursor of the last job returned when more follow, else NULL (caller
 * owns; pass it back as `after`). KILN_EINVAL (err->field "page_token") when after does not fit
 * the order. */
int store_job_search_json(store_conn_t *c, const store_search_t *q, json_t **out, json_t **next,
                          kiln_err_t *err);
/* The order a search uses (search_cursor.c): o, or when o is NULL or empty the default (created
 * desc), written into dflt (caller's storage) and returned. */
const query_order_t *store_search_order(const query_order_t *o, query_order_t *dflt);
/* Whether cur (untrusted: it comes back inside a page token) is a cursor store_job_search_json
 * can continue o from (NULL or empty: the default order): {"p": 1 or 2 (2 only when the first key
 * may be missing), "k": one value per key of the key's type (null only where the key may be
 * missing; the first key's is null exactly in phase 2), "id": a UUID}. Pure; thread-safe. */
bool store_search_cursor_ok(const query_order_t *o, const json_t *cur);
/* *out = {job id: {metric name: {count, min, max, last, min_step, max_step, last_step, rank,
 * attempt}}} for the n jobs ids (those with summaries), only the metrics names[0..nnames) unless
 * names is NULL. Caller owns *out. */
int store_job_summaries_json(store_conn_t *c, const char *const *ids, int n, const char *const *names,
                             int nnames, json_t **out, kiln_err_t *err);
/* *out = array of the job's events, oldest first. KILN_ENOTFOUND for an unknown job. */
int store_job_events_json(store_conn_t *c, const char *id, json_t **out, kiln_err_t *err);
/* Jobs waiting to be placed (QUEUED, RESTARTING, PREEMPTED): priority high to low, then oldest
 * first, then id; store_job_pending_all's read without its snapshot. *out is malloc'd (caller
 * frees), *n rows, at most limit. */
int store_job_pending(store_conn_t *c, int limit, store_job_row_t **out, int *n, kiln_err_t *err);
/* A job as the scheduler's kept view of the queue holds it (store_job_pending_all and _changes):
 * its row, its place in the order (priority high to low, then created_us, then id) and whether it
 * waits (QUEUED, RESTARTING, PREEMPTED) as of the read's snapshot. */
typedef struct store_pending {
    store_job_row_t row;
    int64_t created_us;       /* created_at, microseconds since the epoch */
    bool waiting;
    uint64_t group;           /* the scheduler's: its (queue, project, slot type)'s number in its view (0: not yet) */
} store_pending_t;
/* Orders two store_pending_t as store_job_pending does (priority high to low, then oldest, then
 * id): <0, 0 or >0 as a sorts before, with or after b. Pure. */
int store_pending_cmp(const void *a, const void *b);
/* The first limit waiting jobs in the order above (all waiting, *n rows, caller frees *out), and
 * into *snap (caller frees) the database snapshot they were read in (pg_current_snapshot's text),
 * both from one statement. */
int store_job_pending_all(store_conn_t *c, int limit, store_pending_t **out, int *n, char **snap, kiln_err_t *err);
/* Every job whose scheduling columns (migration 0023's trigger list) were written by a transaction
 * that the snapshot since (from an earlier read) did not see, waiting or not, as this statement's
 * snapshot (into *snap, caller frees) sees it (*n rows, caller frees *out); *forget = true when
 * jobs were deleted since then (the rows say nothing of those: read everything again). Every
 * waiting job this snapshot sees is either unchanged since `since` or among the rows, whatever
 * order the writers committed in. KILN_EINVAL for a malformed since. */
int store_job_pending_changes(store_conn_t *c, const char *since, store_pending_t **out, int *n, char **snap,
                              bool *forget, kiln_err_t *err);
/* The data_paths of each of the n jobs ids, into out[i] as a JSON array (new references; an
 * empty array for a job without paths or not found). */
int store_job_paths(store_conn_t *c, const char *const *ids, int n, json_t **out, kiln_err_t *err);
/* store_job_paths of path_ids[0..np) and store_job_predictions of pred_ids[0..nr) (either may be
 * empty), sent together and answered in one round trip. Returns 0 when the paths were read, with
 * *predicted false (and err set) when the predictions could not be (runtime_s then all -1). */
int store_job_facts(store_conn_t *c, const char *const *path_ids, int np, json_t **paths, const char *const *pred_ids,
                    int nr, double *runtime_s, store_predict_t *source, bool *predicted, kiln_err_t *err);
/* Sets the reason of jobs still QUEUED (no event: the state does not change), only where it
 * differs, in one statement. ids are job ids; reasons the matching texts. */
int store_job_queue_reasons(store_conn_t *c, const char *const *ids, const char *const *reasons, int n,
                            kiln_err_t *err);
/* Sets the pending reason (a JSON object text, migration 0020) of the n jobs ids that still wait,
 * only where it differs, in one statement. */
int store_job_pending_set(store_conn_t *c, const char *const *ids, const char *const *pending_json, int n,
                          kiln_err_t *err);
/* Jobs that have run longer than their spec's stopping.max_runtime_s (counted from their first
 * start). *out malloc'd, at most 100. */
int store_job_overdue(store_conn_t *c, store_job_row_t **out, int *n, kiln_err_t *err);
/* Highest log seq handed out for a job (0 when none); every line up to it is committed once the
 * caller's snapshot sees it. KILN_ENOTFOUND when the job does not exist. */
int store_job_log_seq(store_conn_t *c, const char *id, int64_t *out, kiln_err_t *err);
/* Folds a batch's metrics into the job row when attempt is the job's current attempt: latest
 * values (latest_json, a JSON object) merged into jobs.metrics, progress_step raised to max_step,
 * eta from steps_per_s (<= 0: unknown). *found (OUT) = whether the job exists. */
int store_job_metrics_update(store_conn_t *c, const char *id, int attempt, const char *latest_json,
                             int64_t max_step, double steps_per_s, bool *found, kiln_err_t *err);
/* Seconds since the job's last state change (how long it has been in its state). KILN_ENOTFOUND. */
int store_job_state_age(store_conn_t *c, const char *id, double *seconds, kiln_err_t *err);
/* The job's project, into project (size n). KILN_ENOTFOUND. */
int store_job_project(store_conn_t *c, const char *id, char *project, size_t n, kiln_err_t *err);
/* Job ids from lo to hi (UUIDs, both included) in id order, at most max of them, in projects
 * (a PostgreSQL text[] literal such as {"a","b"}; NULL for every project): the ids of a prefix,
 * found through the primary key's index. ids[i] has room for 37 bytes; *n (OUT) how many. */
int store_job_ids_between(store_conn_t *c, const char *lo, const char *hi, const char *projects, int max,
                          char (*ids)[37], int *n, kiln_err_t *err);
/* Terminal state and reason of a job: *state "" and KILN_ENOTFOUND when unknown. */
int store_job_state(store_conn_t *c, const char *id, char *state, size_t state_n, char *reason,
                    size_t reason_n, kiln_err_t *err);

/* Releases the scheduler's lock (store_sched_pass_read) on the connection that took it; a session
 * that cannot (its transaction failed) is closed instead, which releases it (see store_unlock). */
void store_sched_unlock(store_conn_t *c);

/* ---- workers ----------------------------------------------------------------------------------- */

#define STORE_CERT_HEX 65     /* SHA-256 of a certificate as lower-case hex, plus its NUL */

typedef struct store_worker_reg {
    const char *id, *hostname, *address, *slot_type, *gpus_json, *version;
    const char *data_roots_json;          /* JSON array of the directories jobs may read */
    const uint8_t *credential_hash;       /* STORE_HASH_LEN bytes: the credential issued now */
    const char *join_token;               /* the join token's id ("file", "" to keep the old one) */
    const char *cert_sha256;              /* the client certificate it is bound to; NULL or "": none */
    const char *registered_from;          /* the registration's source address */
    bool pending;                         /* a new worker starts PENDING (waits for approval) */
    int slots, cpu_cores;
} store_worker_reg_t;
/* Inserts the worker or, when its id exists, updates it and makes it ALIVE again (keeping its
 * approval); either way it holds the new credential hash and certificate from now on.
 * *was_alive (OUT, may be NULL) = it existed and was ALIVE (the agent restarted unseen);
 * *pending (OUT, may be NULL) = it is PENDING after the registration. */
int store_worker_upsert(store_conn_t *c, const store_worker_reg_t *w, bool *was_alive, bool *pending,
                        kiln_err_t *err);
/* Heartbeat: last_heartbeat = now() for an ALIVE worker, and with draining (its agent is shutting
 * down) the worker takes no new placements until it registers again; *began_draining (OUT, may be
 * NULL) = this heartbeat set that; *pending (OUT, may be NULL) = it waits for approval.
 * KILN_ENOTFOUND when the worker is unknown, KILN_ESTATE when it is DEAD (it must register again). */
int store_worker_touch(store_conn_t *c, const char *id, bool draining, bool *began_draining, bool *pending,
                       kiln_err_t *err);
/* Marks a worker draining (no new placements); *changed = it was not before. */
int store_worker_set_draining(store_conn_t *c, const char *id, bool *changed, kiln_err_t *err);
/* Marks DEAD the ALIVE workers that have been silent for longer than timeout_ms of the time the
 * caller watched: silence is counted from their last heartbeat or from watched_since_us (Unix
 * microseconds on the database's clock, store_now_us), whichever is later, so that a time kilnd
 * itself was paused, down or not leading never counts against a worker. *n (OUT) = how many. */
int store_workers_expire(store_conn_t *c, int timeout_ms, int64_t watched_since_us, int *n, kiln_err_t *err);
/* The database's clock (clock_timestamp()) in Unix microseconds. */
int store_now_us(store_conn_t *c, int64_t *out, kiln_err_t *err);
/* *out = array of workers as contracts.md shows them (removed workers left out). */
int store_workers_list_json(store_conn_t *c, json_t **out, kiln_err_t *err);
/* *out = one worker as the list shows it. KILN_ENOTFOUND (also for a removed worker). */
int store_worker_get_json(store_conn_t *c, const char *id, json_t **out, kiln_err_t *err);
/* Counts for monitoring, *out = {"jobs": {STATE: n}, "queues": {QUEUE: n of QUEUED jobs},
 * "workers": {"ALIVE": n, "DEAD": n, "draining": n}, "slots": {SLOT_TYPE: {"total": n, "used": n}}}
 * (slots of ALIVE workers). Caller owns *out. */
int store_stats_json(store_conn_t *c, json_t **out, kiln_err_t *err);
/* The pool's size and the connections handed out now. Thread-safe. */
void store_pool_usage(store_t *st, int *size, int *in_use);

#define STORE_MAX_ROOTS 32
typedef struct store_worker_cap {
    char id[STORE_WORKER_ID_LEN];
    char hostname[256];
    char address[256];
    char slot_type[8];
    int slots, slots_free;
    /* The worker's data roots: root i is the string at roots_buf + roots_off[i] (offsets, so
     * the struct can be copied). */
    uint16_t roots_off[STORE_MAX_ROOTS];
    int nroots;
    char roots_buf[2048];
} store_worker_cap_t;
/* ALIVE, approved workers with their free slots (slots minus unreleased assignments; none while
 * draining, so nothing is placed there, though the slots still count for what the cluster can
 * ever run), ordered by id.
 * *out is malloc'd (caller frees). */
int store_workers_capacity(store_conn_t *c, store_worker_cap_t **out, int *n, kiln_err_t *err);

/* ---- queues (queue.c) ------------------------------------------------------------------------
 * A queue is JSON shaped as GET /v1/queues shows it: {"name", "cohort" (null for none), "quota"
 * (null for no limit), "borrowing_limit", "lending_limit", "weight", "projects", "fair_sharing",
 * "preemption": {"within_queue", "reclaim_within_cohort"} (migration 0027), "usage": {"cpu", "gpu"} (slots its SCHEDULED to STOPPING jobs hold), "pending" (its QUEUED and
 * RESTARTING jobs), "created_at", "created_by", "updated_at"}. */

/* *out = array of every queue by name, or with name non-NULL of that one (KILN_ENOTFOUND, err
 * naming it, when there is none). */
int store_queues_json(store_conn_t *c, const char *name, json_t **out, kiln_err_t *err);
/* *out = array of every queue by name with its fields only (no "usage", "pending", "admitted"; it
 * reads no job): what a scheduling pass (which counts each queue's usage from the jobs holding
 * slots it reads anyway) needs; with cohort_of non-NULL, only that queue and the others of its
 * cohort (none when it has no cohort, or does not exist): what checking a submission to it needs. */
int store_queue_defs_json(store_conn_t *c, const char *cohort_of, json_t **out, kiln_err_t *err);
/* Inserts q (validated fields: name, cohort, quota, borrowing_limit, lending_limit, weight,
 * projects, fair_sharing, preemption with both its values). KILN_EEXIST (field "name") when the name is taken. */
int store_queue_insert(store_conn_t *c, const json_t *q, const char *created_by, kiln_err_t *err);
/* Replaces every field of the queue q names with q's. KILN_ENOTFOUND. */
int store_queue_update(store_conn_t *c, const json_t *q, kiln_err_t *err);
/* Locks the row of the queue called name until the caller's transaction ends: FOR SHARE (a
 * project that takes it as its default queue), or with exclusive FOR UPDATE (a change of its
 * projects), so a change of the queue's projects and a project's choice of it as its default
 * never both pass their checks. No row (a queue that does not exist) is not an error. */
int store_queue_lock(store_conn_t *c, const char *name, bool exclusive, kiln_err_t *err);
/* *out = array of the names of the projects whose default queue is name, by name. */
int store_queue_default_of(store_conn_t *c, const char *name, json_t **out, kiln_err_t *err);
/* *out = [{"project", "waiting", "running", "paused", "tuning"}] by project: the jobs of the queue
 * called name that wait (QUEUED, RESTARTING, PREEMPTED), hold slots (SCHEDULED to STOPPING) or are
 * PAUSED, and its running tuning jobs (whose next trials go to it), of each project that projects
 * (a queue's "projects" array) does not let in. */
int store_queue_jobs_left_out(store_conn_t *c, const char *name, const json_t *projects, json_t **out,
                              kiln_err_t *err);
/* Deletes a queue none of whose jobs waits, runs or is PAUSED (a paused hyperband trial goes
 * back to its queue when promoted): KILN_ESTATE (how many do, and how many of them are paused)
 * otherwise; KILN_ENOTFOUND. Paused jobs hold no slots and wait for no admission, so a queue's
 * usage and pending do not count them. A queue that is a project's default queue stays too:
 * KILN_ESTATE naming the project (the first by name, "and others" when there are more). So does
 * one a running tuning job submits its next trials to: KILN_ESTATE counting them. The caller
 * locks the row first (store_queue_lock, exclusive, in the same transaction), so that a job or
 * tuning job whose insert holds it is counted. */
int store_queue_delete(store_conn_t *c, const char *name, kiln_err_t *err);
/* *out = {"queue": {"project": usage}} for the queues with fair_sharing: each project's slots
 * held now plus its jobs' slot-time decayed with half_life_s, divided by the decay constant. */
int store_queue_project_usage(store_conn_t *c, double half_life_s, json_t **out, kiln_err_t *err);

/* ---- identity and tenancy (auth.c) ----------------------------------------------------------- */

/* Creates a user. KILN_EEXIST when the name is taken (err names the field). */
int store_user_insert(store_conn_t *c, const char *name, bool cluster_admin, const char *created_by,
                      kiln_err_t *err);
/* Whether the user exists (KILN_ENOTFOUND otherwise) and is a cluster admin (OUT, may be NULL). */
int store_user_get(store_conn_t *c, const char *name, bool *cluster_admin, kiln_err_t *err);
int store_users_count(store_conn_t *c, int64_t *n, kiln_err_t *err);
/* {name, cluster_admin, created_at, created_by}; KILN_ENOTFOUND. */
int store_user_get_json(store_conn_t *c, const char *name, json_t **out, kiln_err_t *err);
/* Array of users by name. */
int store_users_list_json(store_conn_t *c, json_t **out, kiln_err_t *err);

/* A token to store (migration 0012 for its lineage). Borrowed strings. */
typedef struct store_token_new {
    const char *id;
    const char *user;
    const uint8_t *hash;         /* STORE_HASH_LEN bytes: only the hash is stored, never the secret */
    const char *description;
    int64_t expires_us;          /* 0: none asked for (never, or the parent's expiry) */
    const char *created_by;      /* the user whose token makes it ("" for none) */
    const char *parent_id;       /* the token that makes it; NULL for none (bootstrap, kilnd) */
} store_token_new_t;
/* Stores an API token (kind "api"; session tokens come from store_login_link_redeem). With a
 * parent it is stored only while the parent is valid (neither it nor a token it was made with
 * revoked, not expired) and if it does not outlive the parent: with expires_us 0 it expires
 * when the parent does. *stored says whether it was; *expires_us the expiry it got (0: never).
 * Without a parent it is always stored. */
int store_token_insert(store_conn_t *c, const store_token_new_t *t, bool *stored, int64_t *expires_us,
                       kiln_err_t *err);
typedef struct store_token_auth {
    char token_id[32];
    char user[64];
    bool cluster_admin;
    int64_t expires_us;          /* 0: never */
    bool revoked, expired;       /* revoked: it, or a token it was made with */
    bool session;                /* a web UI session token: it makes no tokens */
    json_t *roles;               /* {"project": "viewer"|"editor"|"admin", ...}; caller owns */
} store_token_auth_t;
/* The token with this hash, its user and the user's project roles; records the use (at most
 * once a minute). KILN_ENOTFOUND when no token has the hash. On success the caller owns
 * out->roles (json_decref). */
int store_token_auth(store_conn_t *c, const uint8_t hash[STORE_HASH_LEN], store_token_auth_t *out,
                     kiln_err_t *err);
/* Arrays / objects of tokens as the API shows them (no secrets, no hashes): id, user,
 * description, kind ("api" | "session"), created_by and parent_id ("" for none), and the times
 * created_at, expires_at, revoked_at (also when a token it was made with was revoked before
 * it expired), last_used_at (null for none). */
int store_tokens_list_json(store_conn_t *c, const char *user, json_t **out, kiln_err_t *err);
int store_token_get_json(store_conn_t *c, const char *id, json_t **out, kiln_err_t *err);
/* Revokes the token and every token made with it, directly or through others, in one
 * statement: sets revoked_at where it is not set yet (descendants that have expired stay
 * expired). *descendants (may be NULL): how many of those made with it were valid and are
 * revoked now. KILN_ENOTFOUND. */
int store_token_revoke(store_conn_t *c, const char *id, int64_t *descendants, kiln_err_t *err);

/* Inserts project name whose jobs that name no queue go to default_queue (NULL or "": the queue
 * "default"); the service has checked that the queue exists and lets the project use it.
 * KILN_EEXIST (field "name"). */
int store_project_insert(store_conn_t *c, const char *name, const char *default_queue, const char *created_by,
                         kiln_err_t *err);
int store_project_exists(store_conn_t *c, const char *name, bool *exists, kiln_err_t *err);
/* Sets the project's default queue (NULL or "": "default"). KILN_ENOTFOUND (field "project"). */
int store_project_set_default_queue(store_conn_t *c, const char *name, const char *queue, kiln_err_t *err);
/* The project's default queue into out ("default" when the project does not exist: the job's
 * insert reports that). */
int store_project_default_queue(store_conn_t *c, const char *name, char out[64], kiln_err_t *err);
/* Array of {name, created_at, created_by, role, default_queue}: every project (role "") when
 * member is NULL, else the projects member belongs to, with its role. */
int store_projects_list_json(store_conn_t *c, const char *member, json_t **out, kiln_err_t *err);
/* Array of {project, user, role}. */
int store_members_list_json(store_conn_t *c, const char *project, json_t **out, kiln_err_t *err);
/* Adds the user to the project with role, or changes its role. KILN_EINVAL when the project or
 * user does not exist (a foreign key). */
int store_member_set(store_conn_t *c, const char *project, const char *user, const char *role,
                     kiln_err_t *err);
int store_member_remove(store_conn_t *c, const char *project, const char *user, bool *removed,
                        kiln_err_t *err);

/* A one-time login link (migration 0010): the hash of its code, the user and the token that
 * asked for it, when the link expires and when the token it is redeemed for will. */
int store_login_link_insert(store_conn_t *c, const uint8_t hash[STORE_HASH_LEN], const char *user,
                            const char *token_id, int64_t expires_us, int64_t session_expires_us,
                            kiln_err_t *err);
typedef struct store_login_redeemed {
    bool redeemed;               /* the link was unused and valid: token (token_id) now exists */
    char user[64];               /* when redeemed */
    int64_t expires_us;          /* the new token's expiry, when redeemed */
    bool known, used, expired, token_gone; /* when not redeemed: why not */
} store_login_redeemed_t;
/* Redeems the link with this code hash, once: marks it used and creates the token (token_id,
 * token_hash, description) for the link's user, expiring when the link says, in one statement.
 * The token is a session token (kind "session") whose parent is the link's asking token.
 * A link that is unknown, used, expired, or whose asking token was revoked or expired is not
 * redeemed (out says which). Returns 0 either way, or KILN_EDB. */
int store_login_link_redeem(store_conn_t *c, const uint8_t hash[STORE_HASH_LEN], const char *token_id,
                            const uint8_t token_hash[STORE_HASH_LEN], const char *description,
                            store_login_redeemed_t *out, kiln_err_t *err);

/* On a database without users: creates `user` as a cluster admin holding the token (id, hash)
 * and sets *created. With users already there, changes nothing. One transaction under an
 * advisory lock, so concurrent kilnd agree on one admin. */
int store_bootstrap_admin(store_conn_t *c, const char *user, const char *token_id,
                          const uint8_t hash[STORE_HASH_LEN], bool *created, kiln_err_t *err);

/* What a registration under an existing worker id claims: whether the worker exists, whether its
 * credential hash equals the presented one (NULL: never equal), and the certificate it is bound to. */
typedef struct store_worker_claim {
    bool exists, match;
    char cert_sha256[STORE_CERT_HEX];   /* "" when bound to none */
} store_worker_claim_t;
int store_worker_check_credential(store_conn_t *c, const char *id, const uint8_t hash[STORE_HASH_LEN],
                                  store_worker_claim_t *out, kiln_err_t *err);
/* What a worker credential stands for. */
typedef struct store_worker_auth {
    char id[STORE_WORKER_ID_LEN];
    char cert_sha256[STORE_CERT_HEX];   /* the certificate every call must present; "" for none */
    bool pending;                       /* waits for approval */
} store_worker_auth_t;
/* The worker holding the credential with this hash. KILN_ENOTFOUND. */
int store_worker_by_credential(store_conn_t *c, const uint8_t hash[STORE_HASH_LEN], store_worker_auth_t *out,
                               kiln_err_t *err);

/* ---- agent trust (trust.c): join tokens, approval, removal and bans --------------------------- */

/* A new join token (hash of its secret; uses >= 1; expires_us: Unix microseconds). *out = the
 * token as the API shows it: {id, description, uses, uses_left, registrations, created_at,
 * created_by, expires_at, revoked_at, last_used_at, state}. */
int store_join_token_insert(store_conn_t *c, const char *id, const uint8_t hash[STORE_HASH_LEN],
                            const char *description, int uses, int64_t expires_us, const char *created_by,
                            json_t **out, kiln_err_t *err);
/* Array of every join token (no secrets), oldest first. */
int store_join_tokens_list_json(store_conn_t *c, json_t **out, kiln_err_t *err);
/* Sets revoked_at (kept when already set); *out = the token. KILN_ENOTFOUND. */
int store_join_token_revoke(store_conn_t *c, const char *id, json_t **out, kiln_err_t *err);
typedef struct store_join {
    char id[32];
    char state[16];              /* "active" | "used_up" | "expired" | "revoked" */
} store_join_t;
/* The join token with this hash and its state now. KILN_ENOTFOUND. */
int store_join_token_find(store_conn_t *c, const uint8_t hash[STORE_HASH_LEN], store_join_t *out, kiln_err_t *err);
/* Consumes one use of an active token in one UPDATE (uses_left > 0, not expired, not revoked),
 * so concurrent registrations on any replica never take more than it has. *consumed (OUT). */
int store_join_token_consume(store_conn_t *c, const char *id, bool *consumed, kiln_err_t *err);

/* PENDING -> APPROVED by `by`; *changed = it was PENDING. KILN_ENOTFOUND (also when removed). */
int store_worker_approve(store_conn_t *c, const char *id, const char *by, bool *changed, kiln_err_t *err);
typedef struct store_worker_removed {
    char cert_sha256[STORE_CERT_HEX];   /* the certificate it was bound to, "" for none */
    char hostname[256];
    char removed_by[64];
    int64_t removed_us;
    bool already;                       /* it had been removed before (nothing changed) */
} store_worker_removed_t;
/* Removes a worker: DEAD, no credential, not listed any more (its unreleased assignments are the
 * caller's to hand to the lost-attempt path). KILN_ENOTFOUND. */
int store_worker_remove(store_conn_t *c, const char *id, const char *by, store_worker_removed_t *out,
                        kiln_err_t *err);
/* Bans a worker id and/or a certificate (at least one not empty); *out = the ban as the API
 * shows it: {id, worker_id, cert_sha256, reason, banned_by, banned_at}. */
int store_ban_insert(store_conn_t *c, const char *worker_id, const char *cert_sha256, const char *reason,
                     const char *by, json_t **out, kiln_err_t *err);
int store_bans_list_json(store_conn_t *c, json_t **out, kiln_err_t *err);
/* Lifts a ban; *out = it. KILN_ENOTFOUND. */
int store_ban_delete(store_conn_t *c, int64_t id, json_t **out, kiln_err_t *err);
/* The first ban on worker_id or cert_sha256 (either may be NULL or ""): *ban_id (0: none) and
 * whether it names the certificate. */
int store_ban_find(store_conn_t *c, const char *worker_id, const char *cert_sha256, int64_t *ban_id,
                   bool *by_cert, kiln_err_t *err);
/* Inside a transaction: takes the certificate's advisory lock (held until commit) and finds a live
 * worker other than except_id bound to it, into holder (size n; "" when none). */
int store_worker_cert_holder(store_conn_t *c, const char *cert_sha256, const char *except_id, char *holder,
                             size_t n, kiln_err_t *err);

/* ---- assignments (placements) and rank exits --------------------------------------------------- */

typedef struct store_assign {
    int64_t id;
    char job_id[STORE_ID_LEN];
    int attempt;
    char worker_id[STORE_WORKER_ID_LEN];
    char worker_host[256];        /* filled by reads */
    int node_rank, nodes, world_size;
    int ranks[256];               /* global ranks in local-rank order */
    int nranks;
    char master_addr[256];
    int master_port;
    bool delivered, started, stop, stop_sent, released;
    char stop_reason[256];
} store_assign_t;

int store_assign_insert(store_conn_t *c, const store_assign_t *a, kiln_err_t *err);
/* Inserts a[0..n) in one statement (in a transaction, sent with its next statement that must
 * answer: a failure fails that one). */
int store_assign_insert_many(store_conn_t *c, const store_assign_t *a, int n, kiln_err_t *err);
/* Assignments of one attempt of a job, by node rank. *out malloc'd (caller frees). */
int store_assign_list(store_conn_t *c, const char *job_id, int attempt, store_assign_t **out,
                      int *n, kiln_err_t *err);
/* Undelivered, unreleased, not stopped assignments of a worker: node 0's at once, the others'
 * once node 0's agent has reported the rendezvous port (store_assign_set_started). */
int store_assign_undelivered(store_conn_t *c, const char *worker_id, store_assign_t **out, int *n,
                             kiln_err_t *err);
/* Sends a notification on channel, with a worker's id as its payload, once for every worker holding
 * an assignment of any of the attempts (job_ids[k], attempts[k]), k < n, in one statement;
 * delivered only if the transaction commits (WatchWork's nudges); in a transaction, sent with its
 * next statement that must answer, at the latest its COMMIT. */
int store_assign_notify_workers(store_conn_t *c, const char *channel, const char *const *job_ids, const int *attempts,
                                int n, kiln_err_t *err);
/* Marks the assignments ids[0..n) delivered, in one statement; spec_json[i] (OUT, malloc'd, caller
 * frees) = the spec of assignment ids[i]'s job, or NULL when it was delivered already (by another
 * heartbeat of the same worker) or is gone. */
int store_assign_deliver_many(store_conn_t *c, const int64_t *ids, int n, char **spec_json, kiln_err_t *err);
/* A JSON value's text as PostgreSQL gives it back (a jsonb column as text): PostgreSQL writes a
 * number without an exponent, so a whole number past an int64 (1e20 comes back as
 * 100000000000000000000), which jansson refuses as an integer, is read as the real it is. NULL
 * (logged, without the text) when it does not parse. The one reader of stored JSON text. */
json_t *store_json_parse(const char *text);
/* A worker's "started" report, in one statement: marks its live (unreleased) assignment of the
 * attempt started (*found OUT: it has one) and, when port > 0 and that assignment is node 0's, sets
 * the rendezvous port node 0's agent picked on every assignment of the attempt that has none yet
 * (*port_set OUT: some row got it). */
int store_assign_set_started(store_conn_t *c, const char *job_id, int attempt, const char *worker_id, int port,
                             bool *found, bool *port_set, kiln_err_t *err);
/* Asks every unreleased assignment of the attempt (except on except_worker, may be NULL) to stop;
 * undelivered ones are released at once since nothing runs for them. */
int store_assign_stop(store_conn_t *c, const char *job_id, int attempt, const char *reason,
                      const char *except_worker, kiln_err_t *err);
/* Releases (frees the slots of) assignments of the attempt: one worker's, or all with worker NULL. */
int store_assign_release(store_conn_t *c, const char *job_id, int attempt, const char *worker_id,
                         kiln_err_t *err);
/* Number of unreleased assignments of the attempt. */
int store_assign_unreleased(store_conn_t *c, const char *job_id, int attempt, int *n,
                            kiln_err_t *err);

typedef struct store_stop_order {
    char job_id[STORE_ID_LEN];
    int attempt;
    char reason[256];
    int grace_s;                 /* store_assign_take_stops: the job's stopping.grace_period_s (0: none) */
} store_stop_order_t;
/* Stop orders for a worker: those not yet sent, and those sent more than resend_ms ago (or than
 * the job's own grace period, when that is longer) whose assignment is still not released (the
 * reply carrying them may have been lost). Marks them sent now. *out malloc'd. */
int store_assign_take_stops(store_conn_t *c, const char *worker_id, int resend_ms,
                            store_stop_order_t **out, int *n, kiln_err_t *err);
/* Of the (job, attempt) pairs a worker says it runs, those it should not run (no live, unstopped
 * assignment); *out malloc'd, reason filled. */
int store_assign_stale(store_conn_t *c, const char *worker_id, const char *const *job_ids,
                       const int *attempts, int n, store_stop_order_t **out, int *nout,
                       kiln_err_t *err);
/* Releases this worker's assignments whose stop was sent more than grace_ms ago and none of whose
 * ranks the worker still reports (job_ids/attempts as above). *released (OUT) = the jobs touched
 * (malloc'd, job_id/attempt filled). */
int store_assign_reap(store_conn_t *c, const char *worker_id, const char *const *job_ids,
                      const int *attempts, int n, int grace_ms, store_stop_order_t **released,
                      int *nreleased, kiln_err_t *err);

/* Delivered assignments of this worker that it has neither started (no "started" report, no rank
 * exit) nor reports running after_ms after delivery: the reply that carried them was probably
 * lost. Marks them undelivered so the next delivery sends them again (agents ignore a repeat of
 * an attempt they already run). *nredeliver (OUT) = how many. */
int store_assign_redeliver(store_conn_t *c, const char *worker_id, const char *const *job_ids,
                           const int *attempts, int n, int after_ms, int *nredeliver, kiln_err_t *err);

typedef struct store_lost {
    char job_id[STORE_ID_LEN];
    int attempt;
    char worker_id[STORE_WORKER_ID_LEN];
    char hostname[256];
} store_lost_t;
/* Unreleased assignments on DEAD workers (jobs that lost ranks). *out malloc'd. */
int store_assign_lost(store_conn_t *c, store_lost_t **out, int *n, kiln_err_t *err);
/* Unreleased assignments of a worker, delivered or not (used when an admin removes it). */
int store_assign_held_by(store_conn_t *c, const char *worker_id, store_lost_t **out, int *n, kiln_err_t *err);
/* Delivered, unreleased assignments of a worker (used when an agent restarts unseen). */
int store_assign_delivered_on(store_conn_t *c, const char *worker_id, store_lost_t **out, int *n,
                              kiln_err_t *err);

/* The global ranks kilnd assigned to worker_id for the attempt (released or not), into ranks
 * (room for 256); *n = 0 when the worker never had a part of that attempt. */
int store_assign_ranks_of(store_conn_t *c, const char *job_id, int attempt, const char *worker_id,
                          int *ranks, int *n, kiln_err_t *err);

/* What store_rank_exit_record found. */
typedef struct store_rank_exit {
    bool inserted;          /* false when this rank's exit was already recorded (a resend) */
    bool released;          /* the worker's assignment was released: all its ranks have exited */
    int n_exited, n_ok;     /* the attempt's exits recorded, this one included; n_ok: code 0, no signal */
    int64_t pause_at;       /* the job's stopping.max_steps (0: none) */
    int64_t max_steps;      /* its hyperparameters.max_steps (0: none) */
    int64_t progress_step;  /* the highest step its ranks reported (jobs.progress_step) */
    json_t *metric_defs;    /* its spec's metric_definitions when it has stopping.max_steps (else
                               NULL); the caller json_decrefs */
} store_rank_exit_t;
/* Records a rank exit, releases the worker's assignment when all its ranks have exited, and
 * counts the attempt's exits, in one statement. The caller holds the job's row lock
 * (store_job_row with lock), so that concurrent exits of the attempt count each other. */
int store_rank_exit_record(store_conn_t *c, const Kiln__RankExit *e, store_rank_exit_t *out, kiln_err_t *err);

/* ---- logs and metrics ----------------------------------------------------------------------- */

/* Exactly-once ingestion, inside the batch's transaction: records that batch batch_seq of the
 * agent's stream (job_id, stream_id, kind "logs" | "metrics") is being stored. *fresh (OUT) =
 * false when a batch with that number or a later one was already stored (a re-sent copy: store
 * nothing). stream_id or batch_seq 0: nothing to record, *fresh = true. Locks the stream's row
 * until the transaction ends, so a copy sent to another kilnd at the same time waits and then
 * sees this one. */
int store_ingest_claim(store_conn_t *c, const char *job_id, uint64_t stream_id, const char *kind,
                       uint64_t batch_seq, bool *fresh, kiln_err_t *err);
/* Takes n (>= 1) log sequence numbers of a job, *first (OUT) to *first + n - 1, inside the
 * batch's transaction: the job's counter row stays locked until it ends, so the batches of one
 * job commit in seq order. */
int store_log_seq_take(store_conn_t *c, const char *job_id, int64_t n, int64_t *first, kiln_err_t *err);
/* Forgets the batch numbers of streams silent for older_than_s; *n (OUT) = rows removed. */
int store_ingest_prune(store_conn_t *c, int older_than_s, int *n, kiln_err_t *err);
/* Appends n log lines with one COPY; line i gets seq first_seq + i (taken with
 * store_log_seq_take); a line with time_us 0 gets now_us. Runs in the current transaction, or its
 * own. */
int store_logs_copy(store_conn_t *c, const char *job_id, int attempt, Kiln__LogLine *const *lines,
                    size_t n, int64_t first_seq, int64_t now_us, kiln_err_t *err);
/* What one batch says about one metric, for its summary (migration 0005 defines summaries):
 * the batch's points of the lowest rank that carried the metric, one value per step (the
 * batch's later point wins), non-finite values counted only in lo_step and hi_step. */
typedef struct store_metric_sum {
    const char *name;            /* borrowed from the batch */
    int rank;
    int64_t n;                   /* finite values; the next six are meaningless when 0 */
    double min, max, last;
    int64_t min_step, max_step, last_step;
    int64_t lo_step, hi_step;    /* every step of the group */
} store_metric_sum_t;

/* Appends n metric points with one COPY (time_us 0 -> now_us). With sums non-NULL, *sums
 * (malloc'd, caller frees) and *nsums receive one summary per metric name of the batch. */
int store_metrics_copy(store_conn_t *c, const char *job_id, int attempt,
                       Kiln__MetricPoint *const *pts, size_t n, int64_t now_us,
                       store_metric_sum_t **sums, size_t *nsums, kiln_err_t *err);
/* Folds a batch's summaries (from store_metrics_copy, same transaction, after the COPY) into the
 * job's metric_summaries: merged in place when the batch's steps are new to the row, rebuilt
 * from the chunks when they overlap it (a retried attempt, or batches out of order). */
int store_metric_summaries_update(store_conn_t *c, const char *job_id, int attempt,
                                  const store_metric_sum_t *sums, size_t n, kiln_err_t *err);
/* *n (OUT) = how many metric names job_id has (its metric_summaries rows), as this transaction
 * sees them. */
int store_metric_names_count(store_conn_t *c, const char *job_id, int64_t *n, kiln_err_t *err);

typedef struct store_log_query {
    int rank;                /* -1: every rank */
    int64_t since_us;        /* 0: no time bound */
    int64_t after_seq;
    int limit;               /* >= 1 */
} store_log_query_t;
/* *out = array of log lines ({seq, rank, stream, time, line}) by seq; *last_seq (OUT) = the seq of
 * the last line returned, or q->after_seq when none. */
int store_logs_query_json(store_conn_t *c, const char *job_id, const store_log_query_t *q,
                          json_t **out, int64_t *last_seq, kiln_err_t *err);
typedef struct store_metrics_query {
    const char *name;        /* NULL: every metric */
    int max_points;          /* >= 2 */
    int attempt;             /* > 0: that attempt's points; 0: all; -1: per step the latest attempt's */
    int64_t start_step, end_step; /* steps in [start_step, end_step] only; 0: no bound on that side */
} store_metrics_query_t;
/* *out = array of {name, points: [{step, value, time, time_us, rank, attempt}]} by name, each
 * series ordered by step, then attempt (attempt -1: per rank and step only the latest attempt's
 * points). A series longer than max_points keeps its first and last point and the lowest and
 * highest of each of (max_points - 2) / 2 buckets of consecutive points; with a step range (a
 * chart's zoomed range) the thinning is within it. */
int store_metrics_query_json(store_conn_t *c, const char *job_id, const store_metrics_query_t *q,
                             json_t **out, kiln_err_t *err);

/* ---- artifacts (artifact.c) -------------------------------------------------------------------- */

/* A row of a job's artifact: its name, what the agent declared (size, SHA-256), how many bytes
 * the store holds durably, and which store holds them. */
typedef struct store_artifact {
    char name[KILN_ARTIFACT_NAME_MAX + 1];
    int attempt;
    char worker_id[STORE_WORKER_ID_LEN];
    int64_t size, received;
    char sha256[KILN_SHA256_HEX];
    bool complete;               /* state COMPLETE: the whole file is in place and verified */
    char store_id[64];
    int64_t created_us, completed_us; /* completed_us 0 while uploading */
} store_artifact_t;

/* Every artifact row of a job (any state) by name; with lock, FOR UPDATE (in a transaction).
 * *out malloc'd (caller frees; NULL when none). */
int store_artifacts_of(store_conn_t *c, const char *job_id, bool lock, store_artifact_t **out, int *n,
                       kiln_err_t *err);
/* One artifact row. KILN_ENOTFOUND when there is none. */
int store_artifact_get(store_conn_t *c, const char *job_id, const char *name, bool lock, store_artifact_t *out,
                       kiln_err_t *err);
/* Inserts the row (job_id, a->name) or replaces every field of it; created_at is now, and
 * completed_at now when a->complete. */
int store_artifact_put(store_conn_t *c, const char *job_id, const store_artifact_t *a, kiln_err_t *err);
int store_artifact_delete(store_conn_t *c, const char *job_id, const char *name, kiln_err_t *err);
/* received := the bytes held durably; complete moves it to COMPLETE (completed_at now). */
int store_artifact_progress(store_conn_t *c, const char *job_id, const char *name, int64_t received, bool complete,
                            kiln_err_t *err);

/* Directories of a store waiting to be removed: a job's (attempt 0: the whole job) or one
 * attempt's. */
typedef struct store_trash {
    char job_id[STORE_ID_LEN];
    int attempt;
} store_trash_t;
int store_artifact_trash_add(store_conn_t *c, const char *store_id, const char *job_id, int attempt, kiln_err_t *err);
/* At most limit entries of store_id, oldest first. *out malloc'd. */
int store_artifact_trash_list(store_conn_t *c, const char *store_id, int limit, store_trash_t **out, int *n,
                              kiln_err_t *err);
int store_artifact_trash_done(store_conn_t *c, const char *store_id, const store_trash_t *t, kiln_err_t *err);

/* ---- synced checkpoint directories (checkpoint.c) ----------------------------------------------- */

/* A content of a job's checkpoint directory the store holds or is receiving, by SHA-256. */
typedef struct store_ckpt_blob {
    char sha256[KILN_SHA256_HEX];
    int64_t size, received;      /* received: bytes held durably */
    bool complete;               /* whole, verified, in place */
    char store_id[64];           /* the artifact store holding the bytes */
} store_ckpt_blob_t;

/* A file of a job's checkpoint directory: its name and content, the attempt and worker that
 * synced that content, and when the state holding it became the synced one. */
typedef struct store_ckpt_file {
    char name[KILN_ARTIFACT_PATH_MAX + 1]; /* its path in the tree (kiln_artifact_path_ok) */
    char sha256[KILN_SHA256_HEX];
    int64_t size;
    int attempt;
    char worker_id[STORE_WORKER_ID_LEN];
    int64_t synced_us;
} store_ckpt_file_t;

/* The files of the job's SYNCED state (synced) or of its PENDING one, by name. *out malloc'd
 * (caller frees; NULL when none). */
int store_ckpt_files(store_conn_t *c, const char *job_id, bool synced, store_ckpt_file_t **out, int *n,
                     kiln_err_t *err);
/* One file of the SYNCED state (synced), or of the PENDING one. KILN_ENOTFOUND when there is none. */
int store_ckpt_file_get(store_conn_t *c, const char *job_id, const char *name, bool synced, store_ckpt_file_t *out,
                        kiln_err_t *err);
/* Replaces the job's PENDING state with files[0..n) (name, sha256, size), written by attempt on
 * worker_id, and records each content not yet known as a blob of store_id with nothing
 * received (an empty one complete). Run it inside a transaction. */
int store_ckpt_pending_set(store_conn_t *c, const char *job_id, int attempt, const char *worker_id,
                           const store_ckpt_file_t *files, int n, const char *store_id, kiln_err_t *err);
/* One content; with lock, FOR UPDATE (in a transaction). KILN_ENOTFOUND when there is none. */
int store_ckpt_blob_get(store_conn_t *c, const char *job_id, const char *sha256, bool lock, store_ckpt_blob_t *out,
                        kiln_err_t *err);
/* received := the bytes store_id holds durably; complete when the content is whole. */
int store_ckpt_blob_progress(store_conn_t *c, const char *job_id, const char *sha256, int64_t received,
                             bool complete, const char *store_id, kiln_err_t *err);
/* The PENDING state becomes the SYNCED one (synced_at now; a file whose content did not change
 * keeps its attempt and worker). Run it inside a transaction, after checking every content of
 * the PENDING state is complete. */
int store_ckpt_commit(store_conn_t *c, const char *job_id, kiln_err_t *err);
/* Deletes the job's contents no file names any more; *out (malloc'd, caller frees) the rows
 * deleted, so that their bytes can go. */
int store_ckpt_blobs_prune(store_conn_t *c, const char *job_id, store_ckpt_blob_t **out, int *n, kiln_err_t *err);
/* Every content the store holds or is receiving for the job, by SHA-256; *out malloc'd (caller
 * frees; NULL when none). */
int store_ckpt_blobs(store_conn_t *c, const char *job_id, store_ckpt_blob_t **out, int *n, kiln_err_t *err);

/* ---- code archives (code.c) -------------------------------------------------------------------- */

/* An uploaded code archive, as a project sees it: its digest (SHA-256 of the bytes, lower-case
 * hex), size, files, which artifact store holds the bytes, and when the project uploaded it. */
typedef struct store_code {
    char digest[65];
    int64_t size;
    int files;
    char store_id[64];
    char uploaded_by[64];
    int64_t created_us;          /* when the project uploaded it */
} store_code_t;

/* Records that project uploaded the archive digest (size bytes, files files, kept in store_id):
 * the blob row once for all projects (a blob already recorded keeps its row), the project's row
 * once per project. *created (OUT, may be NULL): the project had no row before. */
int store_code_put(store_conn_t *c, const char *project, const char *digest, int64_t size, int files,
                   const char *store_id, const char *uploaded_by, bool *created, kiln_err_t *err);
/* The archive digest as project sees it. KILN_ENOTFOUND (field "digest") when project has not
 * uploaded it, whether or not another project has. */
int store_code_get(store_conn_t *c, const char *project, const char *digest, store_code_t *out, kiln_err_t *err);
/* The blob of digest whichever project uploaded it (for an agent fetching what a job names: the
 * job's project was checked at submission). KILN_ENOTFOUND when there is none. */
int store_code_blob(store_conn_t *c, const char *digest, store_code_t *out, kiln_err_t *err);

/* ---- lifecycle (lifecycle.c) ------------------------------------------------------------------- */

/* Deletes the job and every row that belongs to it: the rows of every table with a job_id uuid
 * column (events, logs, metric chunks, assignments, rank exits, artifacts, and whatever tables
 * later migrations add, such as metric summaries), child tables before the tables their foreign
 * keys point at, then the job itself. Run it inside a transaction. *removed (OUT, new reference)
 * = {"<table>": rows removed, ...} for the tables that had rows. KILN_ENOTFOUND. */
int store_job_delete(store_conn_t *c, const char *job_id, json_t **removed, kiln_err_t *err);
/* A job that has not ended and names job_id in model.init_from ("job:<id>"): its id into by
 * (STORE_ID_LEN) and its project into by_project (64 bytes), or both "" when there is none. One
 * of projects (a PostgreSQL text[] literal as store_job_ids_between takes; NULL: any) comes
 * first when there are several. */
int store_job_init_dependent(store_conn_t *c, const char *job_id, const char *projects, char *by, char *by_project,
                             kiln_err_t *err);

/* A job named by its id alone. */
typedef struct store_job_ref {
    char id[STORE_ID_LEN];
} store_job_ref_t;
/* Log retention: up to limit jobs that ended (COMPLETED, FAILED, STOPPED) more than days days ago
 * and still have their logs, oldest end first. *out malloc'd. */
int store_logs_expired_jobs(store_conn_t *c, int days, int limit, store_job_ref_t **out, int *n, kiln_err_t *err);
/* Deletes at most limit log lines of the job (one bounded statement); *deleted (OUT) how many. */
int store_logs_delete_batch(store_conn_t *c, const char *job_id, int limit, int64_t *deleted, kiln_err_t *err);
/* Records that the job's logs are gone (jobs.logs_expired_at). */
int store_job_logs_expired(store_conn_t *c, const char *job_id, kiln_err_t *err);
/* Session advisory lock that lets one kilnd of several run the clean-up pass at a time; *got
 * false when another holds it. Release with store_janitor_unlock on the same connection. */
int store_janitor_lock(store_conn_t *c, bool *got, kiln_err_t *err);
void store_janitor_unlock(store_conn_t *c);

/* ---- notifications and leadership (listen.c) ------------------------------------------------ */

/* A dedicated session (not from the pool) that LISTENs on some channels, sends notifications and
 * can hold a session advisory lock; all of it ends with the session. Used by one thread. */
typedef struct store_listener store_listener_t;
typedef void (*store_notify_fn)(void *ud, const char *channel, const char *payload);
/* Connects (with TCP keepalives, asynchronous commit) and LISTENs on channels[0..n). Caller owns
 * *out; close with store_listener_close(). KILN_EDB when the database cannot be reached. */
int store_listener_open(const char *url, const char *const *channels, size_t n, store_listener_t **out,
                        kiln_err_t *err);
/* Ends the session: its LISTENs and its advisory locks go with it. Accepts NULL. */
void store_listener_close(store_listener_t *l);
/* The socket to poll for readability. */
int store_listener_fd(store_listener_t *l);
/* Reads what the socket holds and calls fn for every notification that arrived (payload "" when
 * none). Non-blocking. KILN_EDB when the session is gone (then close it and open another). */
int store_listener_drain(store_listener_t *l, store_notify_fn fn, void *ud, kiln_err_t *err);
/* Sends n notifications (channels[i] with payloads[i]) in one statement and one asynchronous
 * commit. KILN_EDB. */
int store_listener_notify(store_listener_t *l, const char *const *channels, const char *const *payloads, size_t n,
                          kiln_err_t *err);
/* pg_try_advisory_lock(key) on the listener's session: *got (OUT) whether it holds the lock now
 * (also when it already held it). KILN_EDB. */
int store_listener_try_lock(store_listener_t *l, int64_t key, bool *got, kiln_err_t *err);
/* pg_notify(channel, payload) on c: inside a transaction it is sent with the transaction's next
 * statement that must answer (at the latest its COMMIT) and delivered when (and only if) the
 * transaction commits. */
int store_notify(store_conn_t *c, const char *channel, const char *payload, kiln_err_t *err);

/* ---- helpers ---------------------------------------------------------------------------------- */

/* true when s is a UUID in canonical text form (36 characters). */
bool store_is_uuid(const char *s);


/* ---- tuning jobs (tune.c) ----------------------------------------------------------------------
 * A tuning job as JSON: {"id", "name", "project", "state", "reason", "spec" (the normalised
 * request), "next_trial", "submitted_by", "created_at", "updated_at", "ended_at" (RFC 3339 or
 * null)}. States RUNNING, STOPPING, COMPLETED, FAILED, STOPPED; each change is an event. */

/* Inserts a RUNNING tuning job (and its first event); *out = it. KILN_ENOTFOUND (field
 * "project") when the project does not exist; KILN_EINVAL (field "queue") when the queue its
 * trials go to (spec's job.queue) does not let the project in, checked with that queue's row
 * locked as store_job_insert checks a job's. */
int store_tuning_insert(store_conn_t *c, const char *name, const char *project, const char *spec_json,
                        const char *submitted_by, const char *reason, json_t **out, kiln_err_t *err);
/* *out = the tuning job (for_update: its row locked until the transaction ends). KILN_ENOTFOUND. */
int store_tuning_get_json(store_conn_t *c, const char *id, bool for_update, json_t **out, kiln_err_t *err);
/* *out = its trials, by number: [{"trial", "job_id", "parameters", "rung", "rung_objectives",
 * "job_state", "job_reason", "steps", "total_steps", "metrics" (the job's latest values),
 * "attempt", "stop_reason" (why the controller stopped it early, or null)}]. */
int store_tuning_trials_json(store_conn_t *c, const char *id, json_t **out, kiln_err_t *err);
/* *out = its events, oldest first: [{"seq", "time", "from_state", "to_state", "reason", "actor"}]. */
int store_tuning_events_json(store_conn_t *c, const char *id, json_t **out, kiln_err_t *err);
/* *out = a page of the tuning jobs of projects (a text[] literal; NULL: every project), newest
 * first (created_at, then id, descending: a keyset the indexes of migrations 0019 and 0028 walk),
 * at most limit (>= 1) after the cursor `after` (borrowed; NULL: from the newest), each with
 * "trial_count", "trials_done" (jobs ended COMPLETED, FAILED or STOPPED), "trials_running" (jobs
 * not ended nor PAUSED at a rung) and "best" ({"job_id", "objective"}: the best objective of a
 * trial that did not fail, its warm start parents' trials included; null when none), all in one
 * query. *next (OUT) = the cursor of the last one returned when more follow, else NULL (caller
 * owns; pass it back as `after`). KILN_EINVAL (err->field "page_token") when after is not a
 * cursor store_tuning_cursor_ok accepts. */
int store_tuning_list_json(store_conn_t *c, const char *projects, int limit, const json_t *after, json_t **out,
                           json_t **next, kiln_err_t *err);
/* Whether cur (untrusted: it comes back inside a page token) is a cursor of the tuning job list
 * (search_cursor.c): {"t": created_at in microseconds since the epoch, within +-2^53, "id": a
 * UUID}, nothing else. Pure; thread-safe. */
bool store_tuning_cursor_ok(const json_t *cur);
/* The RUNNING and STOPPING tuning jobs, oldest first. Caller frees *ids. */
int store_tuning_active(store_conn_t *c, char (**ids)[STORE_ID_LEN], int *n, kiln_err_t *err);
/* Moves a tuning job from `from` to `to` with an event (actor NULL: kilnd); ended sets ended_at.
 * KILN_ESTATE when it is no longer in `from`. */
int store_tuning_set_state(store_conn_t *c, const char *id, const char *from, const char *to, const char *reason,
                           const char *actor, bool ended, kiln_err_t *err);
/* Records trial number trial as job job_id with its parameters (JSON text) and rung; the tuning
 * job's next_trial moves past it. KILN_EEXIST when the number is taken. */
int store_tuning_trial_insert(store_conn_t *c, const char *tuning_id, int trial, const char *job_id,
                              const char *params_json, int rung, kiln_err_t *err);
/* *out = {"<trial>": {"steps": [...], "values": [...]}}: metric by step, steps ascending, of the
 * trials whose jobs did not fail, stop or start stopping (the median stopping rule's history and candidates); at
 * each step the lowest rank's value of the job's latest attempt that has one, finite values only. */
int store_tuning_curves_json(store_conn_t *c, const char *id, const char *metric, json_t **out, kiln_err_t *err);
/* Records why the tuning controller stopped a trial early (its stop_reason). */
int store_tuning_trial_stopped(store_conn_t *c, const char *tuning_id, int trial, const char *reason, kiln_err_t *err);
/* Sets a trial's rung and, when rung_objectives_json is not NULL, its objectives per rung. */
int store_tuning_trial_rung(store_conn_t *c, const char *tuning_id, int trial, int rung,
                            const char *rung_objectives_json, kiln_err_t *err);

/* ---- a scheduling pass's first reads ------------------------------------------------------ */
/* What a scheduling pass reads first, sent together and answered in one round trip: the session
 * advisory lock that makes one scheduler (of several kilnd on one database) place jobs at a time,
 * then the workers' capacity (store_workers_capacity), the waiting jobs (written since `since`, as
 * store_job_pending_changes reads them, or with since NULL the first `keep`, as
 * store_job_pending_all), the queues (store_queue_defs_json), with usage projects' recent usage in
 * fair queues (store_queue_project_usage, with half_life_s; else project_usage stays NULL) and the
 * jobs holding slots (store_job_holding).
 * locked false: another session holds the lock, and nothing else is kept. Release the lock with
 * store_sched_unlock (above) on the same connection; free what was read with
 * store_pass_read_clear. */
typedef struct store_pass_read {
    const char *since;
    int keep;
    bool usage;
    double half_life_s;
    bool locked;
    store_worker_cap_t *cap;
    int ncap;
    store_pending_t *pending;
    int npending;
    char *snap;
    bool forget;
    json_t *queues, *project_usage;
    store_holding_t *hold;
    int nhold;
} store_pass_read_t;
int store_sched_pass_read(store_conn_t *c, store_pass_read_t *pr, kiln_err_t *err);
void store_pass_read_clear(store_pass_read_t *pr);

#endif /* KILN_STORE_H */
