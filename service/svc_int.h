/* svc_int.h - internals shared by the service module's files: the svc struct, transactions that
 * notify after commit, the per-job in-memory entries (log seq, metric rate, live followers), and
 * the entry points of the background threads. Nothing outside service/ includes it. */
#ifndef KILN_SVC_INT_H
#define KILN_SVC_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "service/service.h"
#include "spec/spec.h"
#include "store/store.h"

#define SVC_JOBENT_BUCKETS 1024
#define SVC_STALE_SLOTS 256
#define SVC_OWN_SLOTS 8

typedef struct svc_jobent svc_jobent_t;
typedef struct svc_auth_entry svc_auth_entry_t;

/* One cached agent credential (auth.c): the worker, the certificate it is bound to, whether it
 * waits for approval. */
typedef struct svc_agent_entry {
    bool used;
    uint8_t hash[STORE_HASH_LEN];
    uint64_t gen;
    int64_t fetched_us;
    char worker_id[STORE_WORKER_ID_LEN];
    char cert_sha256[STORE_CERT_HEX];
    bool pending;
} svc_agent_entry_t;

/* A token bucket of the registration rate limits (join.c): one per source address, one for all. */
#define SVC_REG_BUCKETS 512
/* The half-life of a project's recent usage that fair-sharing queues order their jobs by. */
#define SVC_FAIR_HALF_LIFE_S 3600.0
typedef struct svc_reg_bucket {
    char addr[64];                   /* "" for a free slot */
    double tokens;
    int64_t at_us;                   /* monotonic: when tokens was last brought up to date */
} svc_reg_bucket_t;

/* The user the first start against an empty database creates (--bootstrap-token-file). */
#define SVC_BOOTSTRAP_USER "admin"

/* What kilnd tell each other through the database (notify.c). */
#define SVC_CH_LOGS "kiln_logs"        /* "<job id> <seq>": the job's lines up to seq are stored */
#define SVC_CH_JOB_END "kiln_job_end"  /* "<job id>": the job reached a terminal state (sent by the
                                          transaction that moved it there) */
#define SVC_CH_SCHED "kiln_sched"      /* "": the scheduler has work (for the leader) */
#define SVC_CH_WORK "kiln_work"        /* "<worker id>": an assignment or a stop order for the worker
                                          was committed (sent by that transaction; svc_on_work) */
/* The session advisory lock the leader holds ("kilnlead"); migrations and the scheduler's pass
 * use others (store/). */
#define SVC_LEADER_KEY INT64_C(0x6b696c6e6c656164)

/* A job whose followers elsewhere should hear of lines up to seq. */
typedef struct svc_note {
    char job_id[STORE_ID_LEN];
    int64_t seq;
} svc_note_t;

struct svc {
    svc_config_t cfg;
    char *database_url;
    char *migrations_dir;
    store_t *store;

    pthread_mutex_t mu;          /* guards the fields below and wakes both threads */
    pthread_cond_t cv;
    bool stopping;
    bool sched_wake;
    pthread_t sched_thread, live_thread, notify_thread;
    bool sched_started, live_started, notify_started;
    int64_t sched_full_us;       /* the scheduler thread's: when a pass last read the whole queue */
    bool sched_fair_seen;        /* the scheduler thread's: its last pass had jobs of a fair queue */
    int64_t sched_reasons_us;    /* the scheduler thread's: when a pass last wrote a long queue's */
    int64_t sched_reasons_took_us; /* reasons, and how long that took */
    struct sched_known *known;   /* the scheduler thread's: what it read of the jobs of its last
                                    pass (sched.c), by id */
    int nknown;
    struct sched_view *view;     /* the scheduler thread's: its kept view of the waiting jobs (sched.c) */
    svc_sched_pass_t *pass_rec;  /* svc_sched_record's buffer (NULL: passes are not recorded) */
    int pass_rec_cap, pass_rec_n;

    /* Several kilnd on one database (notify.c): news to send, and who leads. */
    pthread_mutex_t note_mu;
    svc_note_t *notes;           /* log news to send, one per job (highest seq) */
    int nnotes, capnotes;
    bool note_sched;             /* tell the leader's scheduler it has work */
    int notify_efd;              /* eventfd that wakes the notify thread */
    svc_work_fn work_fn;         /* svc_on_work's hook (under note_mu) */
    void *work_ud;
    atomic_bool leader;          /* this kilnd holds the leader lock: it schedules and judges liveness */
    atomic_uint_fast64_t leader_epoch; /* counts the times it took the lock */

    /* Alive workers' capacity as of the last read: submission's "can it ever fit" check. */
    pthread_mutex_t cap_mu;
    store_worker_cap_t *cap;
    int ncap;
    uint64_t cap_gen;            /* bumped by every replacement */

    pthread_mutex_t jobs_mu;
    svc_jobent_t *jobs[SVC_JOBENT_BUCKETS];

    /* Authentication (auth.c): cached answers for token and credential hashes, dropped when
     * auth_gen moves (a revocation, a role change, a new registration) or after a few seconds. */
    pthread_mutex_t auth_mu;
    uint64_t auth_gen;
    svc_auth_entry_t *auth_cache;    /* AUTH_CACHE_SLOTS */
    svc_agent_entry_t *agent_cache;  /* AUTH_CACHE_SLOTS */
    bool has_join;
    uint8_t join_hash[STORE_HASH_LEN];
    /* Registration rate limits (join.c). */
    pthread_mutex_t reg_mu;
    svc_reg_bucket_t reg_all;
    svc_reg_bucket_t reg_addr[SVC_REG_BUCKETS];

    /* The artifact store (artifact.c): its directory, resolved ("" without one), and its id. */
    char artifact_dir[3000];
    char store_id[64];
    pthread_t janitor_thread;
    bool janitor_started;

    /* When a stop order for ranks that run without an assignment ("stale") was last sent, per
     * worker, job and attempt, so a heartbeat does not repeat it every second. */
    pthread_mutex_t stale_mu;
    struct {
        char key[STORE_WORKER_ID_LEN + STORE_ID_LEN + 16];
        int64_t at_us;
    } stale_sent[SVC_STALE_SLOTS];
};

/* A database transaction that remembers what to announce once it has committed: whether the
 * scheduler should run, and how many jobs it ended in each terminal state (counted in
 * kiln_jobs_finished_total). (A job's end is announced to followers by the transaction itself:
 * svc_job_set_state sends SVC_CH_JOB_END, which the database delivers only if it commits.) */
typedef struct svc_tx {
    svc_t *s;
    store_conn_t *c;
    bool wake_sched;
    int ended[JOB_STATE_COUNT_]; /* by svc_job_state_t */
    const char *actor;           /* the user whose request this is (events record it), or NULL */
} svc_tx_t;

int svc_tx_begin(svc_t *s, svc_tx_t *tx, kiln_err_t *err);
/* Commits, gives the connection back, then announces. On failure rolls back. */
int svc_tx_commit(svc_tx_t *tx, kiln_err_t *err);
/* Rolls back and gives the connection back. Accepts a tx that never began. */
void svc_tx_abort(svc_tx_t *tx);

/* Moves a job (locked in tx by the caller, row in *job) to `to`: checks the transition is legal
 * (KILN_ESTATE otherwise), writes the event, logs "job ID: FROM -> TO (reason)", and updates
 * *job. flags are STORE_TR_*; ENDED is added for terminal states. attempt: the attempt the job
 * has after the change. */
int svc_job_set_state(svc_tx_t *tx, store_job_row_t *job, svc_job_state_t to, int attempt,
                      int flags, const char *reason, kiln_err_t *err);
/* svc_job_set_state for the jobs t[0..n) (each in its t[k].from, with its own reason, attempt and
 * backfill end), all to `to`, in one statement, with one nudge statement for all their workers
 * when `to` places or stops them (their assignments written before): t[k].done says which moved
 * (one no longer in its from state is left as it is). KILN_ESTATE, nothing written, when a move is
 * not legal. The ids must be distinct. */
int svc_jobs_set_state(svc_tx_t *tx, store_transition_t *t, int n, svc_job_state_t to, int flags, kiln_err_t *err);
/* When a STOPPING job has no ranks left (no unreleased assignments), it becomes STOPPED, or
 * PREEMPTED when it stops for a preemption (job->preempted_by) nobody turned into a stop request. */
int svc_job_finish_stopping(svc_tx_t *tx, store_job_row_t *job, kiln_err_t *err);
/* Inside tx, with *job (STARTING or RUNNING) read FOR UPDATE: preempts it for job `by` of project
 * by_project — its ranks get the stop order (SIGTERM: they checkpoint and exit), it goes STOPPING
 * with the reason "preempted by job BY: why" (BY named as sched_job_name names it to job's project:
 * "a job of another project" unless it is of job's) and, once every rank has exited, PREEMPTED (a
 * waiting state the scheduler admits from; its next attempt resumes from the checkpoint and does
 * not count against retry.max_attempts). KILN_ESTATE in any other state. */
int svc_job_preempt(svc_tx_t *tx, store_job_row_t *job, const char *by, const char *by_project, const char *why,
                    kiln_err_t *err);
/* Inside tx, with *job read FOR UPDATE: when attempt is the job's current one and it is
 * SCHEDULED, STARTING or RUNNING, stops its ranks and moves it to RESTARTING (attempts left) or
 * FAILED with why (which names what was lost: the worker, or the rank and how it ended); a
 * STOPPING job becomes STOPPED when nothing is left. Used for lost workers, workers shutting
 * down and ranks that died. */
int svc_job_lose_attempt(svc_tx_t *tx, store_job_row_t *job, int attempt, const char *worker_id,
                         const char *why, kiln_err_t *err);
/* A job lost the ranks it had on a worker (the worker died or its agent restarted unseen):
 * releases them, stops the job's other ranks, and moves the job to RESTARTING (attempts left) or
 * FAILED with why. Runs its own transaction. */
int svc_job_lost(svc_t *s, const char *job_id, int attempt, const char *worker_id,
                 const char *why, kiln_err_t *err);

/* The files a job reads (data.train unless synthetic, data.val, model.init_from; a script job's
 * data.channels, its source when that is a directory, its python) and, last, its
 * checkpoint.path: the non-empty ones, into out (room for SVC_SPEC_PATHS). Paths are borrowed
 * from sp. */
#define SVC_SPEC_PATHS (6 + SPEC_MAX_CHANNELS)
typedef struct svc_spec_path {
    char field[96];              /* the spec field: "data.train", "data.channels.train", ... */
    const char *path;
    bool read;                   /* false for checkpoint.path (written, not read) */
} svc_spec_path_t;
struct spec;
int svc_spec_paths(const struct spec *sp, svc_spec_path_t *out);
/* What a job spec (spec_parse'd, its project's editor role checked) must pass at submission besides
 * spec_parse, asking the workers and the database: its files lie in data roots and outside other
 * projects' areas, its queue (resolved into sp->queue in place) takes it, the job its model starts
 * from (model.init_from "job:<id>") is one who can read with a model of its shape, and its code
 * archive is its project's. svc_job_create runs it on each job, svc_tuning_create on a tuning
 * job's base job and on its trials' (where svc_job_submit_same says they differ), for the
 * submitter: the controller submits trials later as kilnd. c: the caller's connection. 0, or
 * KILN_EINVAL naming the spec's field (KILN_EUNFIT for a queue's limits), or a database error. */
int svc_job_submit_check(svc_t *s, store_conn_t *c, const svc_caller_t *who, struct spec *sp, kiln_err_t *err);
/* Whether svc_job_submit_check asks the same of a and b (their project, queue, size, files, model
 * source and code), so the answer for one is the other's. */
bool svc_job_submit_same(const struct spec *a, const struct spec *b);
/* Whether path (absolute, normalised) lies inside one of the worker's data roots. */
bool svc_worker_holds(const store_worker_cap_t *w, const char *path);

/* 0 when the caller's role in project is at least need; KILN_EPERM saying which role it has
 * and which is needed otherwise. */
int svc_project_need(const svc_caller_t *who, const char *project, svc_role_t need, kiln_err_t *err);

/* The job access check: a job in a project the caller has no role in is not found (its
 * existence does not leak: KILN_ENOTFOUND, as for a job that does not exist); one it can see but
 * not act on is KILN_EPERM. c is the caller's connection. */
int svc_job_access(store_conn_t *c, const svc_caller_t *who, const char *id, svc_role_t need,
                   kiln_err_t *err);
/* How a text for the caller names job id of project `project`, a job other than the one it asked
 * about: "job <id>" when it may read that job (a role in its project, as svc_job_access
 * decides), else "a job of another project", the words of sched_job_name (which names jobs to a
 * project's readers). Into buf (n at least SCHED_JOB_NAME_LEN); returns buf. */
const char *svc_job_name(const svc_caller_t *who, const char *id, const char *project, char *buf, size_t n);
/* A connection for reading job id's rows as a viewer: taken from the pool once the caller may
 * view the job (svc_job_access) and the job exists; the caller puts it back. */
int svc_job_view_conn(svc_t *s, const svc_caller_t *who, const char *id, store_conn_t **c, kiln_err_t *err);

/* Wakes the scheduler: this kilnd's when it leads, else the leader's through the database. */
void svc_sched_wake(svc_t *s);
/* Frees what the scheduler keeps of the jobs of its last pass and its view of the queue (sched.c);
 * svc_destroy's. */
void svc_sched_known_free(svc_t *s);

/* The scheduler's kept view of the waiting jobs: every waiting job up to a bound in the queue's
 * order, as of one database snapshot, brought up to date each pass with only the jobs written
 * since (store_job_pending_changes). Opaque; NULL is an empty view (the next read is a full one). */
typedef struct sched_view sched_view_t;
/* Into *out (caller frees) the first limit waiting jobs in store_job_pending's order, exactly what
 * store_job_pending(c, limit) would read now: from *view brought up to date, or read whole (at most
 * keep jobs kept) when there is none, jobs were deleted since its snapshot, or fewer than limit
 * remain of a bounded view. *view is kept on success and dropped (NULL) on any error. */
int svc_sched_view_read(sched_view_t **view, store_conn_t *c, int limit, int keep, store_job_row_t **out, int *n,
                        kiln_err_t *err);
/* svc_sched_view_read in two halves, for a pass that reads the queue with its other reads
 * (store_sched_pass_read): the snapshot to read the changes since (NULL: read the first keep
 * waiting jobs instead), then the view brought up to date with what that read gave (rows[0..nrows),
 * snap and forget as store_job_pending_changes or store_job_pending_all give them; taken, freed
 * here), reading the queue whole on c when the changes cannot serve. */
const char *svc_sched_view_since(const sched_view_t *view);
int svc_sched_view_update(sched_view_t **view, store_conn_t *c, store_pending_t *rows, int nrows, char *snap,
                          bool forget, int limit, int keep, store_job_row_t **out, int *n, kiln_err_t *err);
/* Into *out (caller frees; NULL when none) the first per_group waiting jobs, in the queue's order,
 * of each (queue, project, slot type) that has none among the view's first limit, at most max of
 * them (the groups first seen first): what a pass reads beside the first limit so that no queue,
 * project or slot type waits unseen behind the others' jobs. Only of the jobs the view holds (every
 * waiting job, up to the keep it was read with). 0, or KILN_ENOMEM. */
int svc_sched_view_heads(sched_view_t *view, int limit, int per_group, int max, store_job_row_t **out, int *n);
/* How the last svc_sched_view_read of the view got its rows: true when read whole. */
bool svc_sched_view_was_full(const sched_view_t *view);
void svc_sched_view_drop(sched_view_t **view);
void *svc_sched_main(void *arg);
void *svc_live_main(void *arg);

/* ---- several kilnd (notify.c) ------------------------------------------------------------- */
/* How many times this kilnd has taken the leader lock (svc_is_leader in service.h says whether
 * it holds it now): a new value means it took the lead again and has not watched the workers
 * meanwhile. */
uint64_t svc_leader_epoch(svc_t *s);
/* After an ingest committed: tells every kilnd's followers of the job that its lines up to
 * last_seq are stored (coalesced; sent by the notify thread). */
void svc_notify_logs(svc_t *s, const char *job_id, int64_t last_seq);
void *svc_notify_main(void *arg);
int svc_notify_init(svc_t *s, kiln_err_t *err);
void svc_notify_free(svc_t *s);
void svc_notify_wake(svc_t *s);
/* The cache's generation: read it before reading capacity from the database. */
uint64_t svc_cap_gen(svc_t *s);
/* Replaces the cached capacity with cap (taking ownership) unless it was replaced since gen
 * was read (then cap, possibly older than the cache, is freed). Returns whether it replaced. */
bool svc_cap_set(svc_t *s, store_worker_cap_t *cap, int n, uint64_t gen);
/* Re-reads capacity from the database into the cache. */
int svc_cap_refresh(svc_t *s, store_conn_t *c, kiln_err_t *err);

/* ---- per-job entries: log seq, metric rate, followers (ingest.c, follow.c) --------------------- */

typedef struct svc_follow_item {
    int64_t seq;
    json_t *line;                /* owned reference */
} svc_follow_item_t;

struct svc_follow {
    svc_t *s;
    svc_jobent_t *ent;           /* referenced */
    int rank;
    svc_follow_wake_fn wake;
    void *ud;
    struct svc_follow *next;     /* in ent->followers, under ent->fmu */

    pthread_mutex_t mu;          /* guards the queue and end fields */
    svc_follow_item_t *q;
    int qcap, qhead, qlen;
    bool overflow;               /* lines were dropped: refill from the database */
    bool ended;
    char end_state[16];
    char end_reason[256];

    /* reader's own */
    int64_t last_seq;
    bool need_db;
    bool final_checked;
};

struct svc_jobent {
    char id[STORE_ID_LEN];
    int refs;                    /* under s->jobs_mu */
    int64_t last_used_us;
    svc_jobent_t *next;

    pthread_mutex_t pub_mu;      /* what the followers were handed: lines up to pub_seq */
    bool pub_loaded;
    int64_t pub_seq;

    /* The ranks of this job kilnd assigned to a worker, per (attempt, worker): the check behind
     * every report (agent.c), so a batch costs no query once its assignment was seen. */
    pthread_mutex_t own_mu;
    struct {
        int attempt;
        char worker[STORE_WORKER_ID_LEN];
        int *ranks;              /* heap, NULL for an empty slot */
        int n;
    } own[SVC_OWN_SLOTS];
    int own_next;

    pthread_mutex_t fmu;         /* followers list, rate state, metric names */
    svc_follow_t *followers;
    int rate_attempt;
    int64_t rate_step0, rate_t0_us;
    bool metric_names_known;     /* metric_names_hi was counted in the database */
    int64_t metric_names_hi;     /* the job has at most this many metric names (ingest.c) */
};

/* Finds or creates the entry of a job; the caller holds a reference until svc_jobent_put. */
svc_jobent_t *svc_jobent_get(svc_t *s, const char *job_id);
void svc_jobent_put(svc_t *s, svc_jobent_t *e);
/* Like svc_jobent_get but never creates: NULL when the job has no entry. */
svc_jobent_t *svc_jobent_find(svc_t *s, const char *job_id);
/* Drops entries unused for idle_us with no followers. */
void svc_jobent_sweep(svc_t *s, int64_t idle_us);
void svc_jobents_free(svc_t *s);
/* 0 when kilnd assigned every one of ranks[0..n) of the attempt to worker_id (with n == 0:
 * when it assigned the worker any part of the attempt); KILN_EPERM otherwise, logged. */
int svc_agent_owns(svc_t *s, const char *worker_id, const char *job_id, int attempt, const int *ranks,
                   size_t n, kiln_err_t *err);
/* Tells the job's followers (if any) that it ended. */
void svc_follow_end(svc_t *s, const char *job_id, const char *state, const char *reason);
/* Reads the job's lines stored after what its followers were handed, up to seq (or all of them
 * with seq <= 0), and hands them out in seq order. Nothing when the job has no follower here. */
void svc_follow_catch_up(svc_t *s, svc_jobent_t *e, int64_t seq);
/* svc_follow_catch_up for every followed job, and the end notice for those that ended: after
 * notifications may have been missed. */
void svc_follow_catch_up_all(svc_t *s);

/* ---- authentication (auth.c) ---------------------------------------------------------------- */

/* BLAKE2b-256 of a secret. */
void svc_secret_hash(const char *secret, uint8_t hash[STORE_HASH_LEN]);
/* A new random secret "<prefix><43 base64url characters>" into out (size n >= 64 + prefix) and,
 * when hash is not NULL, its hash. */
void svc_secret_new(const char *prefix, char *out, size_t n, uint8_t hash[STORE_HASH_LEN]);
/* A new public token id "tok_<16 hex>". */
void svc_token_id_new(char *out, size_t n);
/* Drops every cached token and credential answer (after a revocation or role change). */
void svc_auth_invalidate(svc_t *s);
/* At start-up: reads or creates the join token file, and on an empty database creates the
 * cluster admin with the bootstrap file's token. */
int svc_auth_setup(svc_t *s, store_conn_t *c, kiln_err_t *err);
/* Sets up the caches (and libsodium); svc_auth_free releases them. */
int svc_auth_init(svc_t *s, kiln_err_t *err);
void svc_auth_free(svc_t *s);

/* ---- join tokens and registration limits (join.c) -------------------------------------------- */

/* What a join token presented at registration is worth now. */
typedef struct svc_join {
    bool ok;                         /* it can register a new worker now */
    char id[32];                     /* "file", a managed token's id, or "" (auth off, or unknown) */
    char why[160];                   /* when not ok: why, for KILN_EUNAUTH */
} svc_join_t;
/* Looks token up (kilnd's --join-token-file first, in constant time, then the managed tokens)
 * without consuming anything. KILN_EDB only; an unknown or spent token is out->ok false. */
int svc_join_check(svc_t *s, store_conn_t *c, const char *token, svc_join_t *out, kiln_err_t *err);
/* Takes one registration from the source address's bucket and the global one: KILN_ELIMIT with
 * when to retry when either is empty (nothing is taken then). */
int svc_register_admit(svc_t *s, const char *address, kiln_err_t *err);
/* KILN_EPERM unless who is a cluster admin; what names the operation ("managing join tokens"). */
int svc_trust_need_admin(const svc_caller_t *who, const char *what, kiln_err_t *err);
/* For a cluster admin (what names the operation): *out = {key: the array list reads}. */
typedef int (*svc_trust_list_fn)(store_conn_t *c, json_t **out, kiln_err_t *err);
int svc_trust_list(svc_t *s, const svc_caller_t *who, const char *what, svc_trust_list_fn list, const char *key,
                   json_t **out, kiln_err_t *err);

/* ---- agents' reports (agent.c) ------------------------------------------------------------------ */

/* The worker a report acts for (its credential's; a message naming another is KILN_EPERM) into
 * *wid, and KILN_ENOTFOUND unless job_id is a UUID. */
int svc_agent_check_report(const char *authenticated, const char *claimed, const char *job_id, const char **wid,
                           kiln_err_t *err);

/* ---- artifacts (artifact.c) and clean-up (lifecycle.c) -------------------------------------------- */

#define SVC_ARTIFACT_MAX_FILES 256
#define SVC_ARTIFACT_CHUNK_MAX (4 << 20)
#define SVC_ARTIFACT_DEFAULT_MAX_JOB_BYTES ((int64_t)10 << 30)

/* Opens (creating when missing) the store of cfg.artifact_dir: the directory, mode 0700, and its
 * id file. Nothing to do without one. */
int svc_artifacts_init(svc_t *s, kiln_err_t *err);
/* The model artifact of job source_id, when complete: *size and sha256 (KILN_SHA256_HEX bytes).
 * KILN_ENOTFOUND otherwise. c is the caller's connection. */
int svc_artifact_model(store_conn_t *c, const char *source_id, int64_t *size, char *sha256, kiln_err_t *err);
/* "job:<uuid>" -> the uuid (borrowed from ref), or NULL when ref does not name a job. */
const char *svc_init_from_job(const char *ref);
/* What every fetch by an agent (FetchInitModel, FetchCode) checks first: the worker reports for
 * itself (claimed), offset is not negative, max_bytes is 0 to SVC_ARTIFACT_CHUNK_MAX, and kilnd
 * assigned it the job's attempt; then *c (a connection: the caller puts it back) and *job (the
 * assigned job's JSON, whose own spec says what it may fetch; caller decrefs). */
int svc_agent_fetch_begin(svc_t *s, const char *worker_id, const char *claimed, const char *job_id, int attempt,
                          int64_t offset, int max_bytes, store_conn_t **c, json_t **job, kiln_err_t *err);
/* The piece of an open file of size bytes from offset, at most max_bytes (0: 1 MiB), read into
 * arena (*data, *len). KILN_ERANGE past the end, KILN_EIO; what names the file in messages. */
int svc_read_piece(int fd, int64_t size, int64_t offset, int max_bytes, const char *what, arena_t *arena,
                   uint8_t **data, size_t *len, kiln_err_t *err);
/* The store's files, for artifacts and checkpoint contents alike. svc_store_durable: what the
 * store holds of an upload whose partial file is partial and whose recorded progress is received:
 * received when the file has at least that much (anything past it was written but never
 * recorded, and goes), else 0. */
int64_t svc_store_durable(const char *partial, int64_t received);
/* What a chunk goes into: the paths of the file's directory, its partial and its final file, and
 * the row's record (the store holding it, declared size and SHA-256, bytes received); job_id,
 * what ("artifact") and name name it in messages. */
typedef struct svc_store_target {
    const char *dir, *partial, *final;
    const char *job_id, *what, *name;
    const char *store_id;
    int64_t size, received;
    const char *sha256;
} svc_store_target_t;
/* Takes a chunk of t at offset: KILN_ESTATE when another store holds the upload or offset is not
 * what it holds, KILN_EINVAL past the declared size; otherwise writes it durably and, with the
 * last byte, checks the whole file against the declared SHA-256 (KILN_ECHECKSUM: the bytes were
 * dropped; the caller records 0 received) and puts it in place. *received and *complete (OUT)
 * what to record. */
int svc_store_chunk(svc_t *s, const svc_store_target_t *t, int64_t offset, const uint8_t *data, size_t len,
                    int64_t *received, bool *complete, kiln_err_t *err);
/* Opens the file of a complete content this store holds (path, store_id as recorded, size as
 * recorded); KILN_EUNAVAIL naming the store that does, or when the file is missing or damaged.
 * what names it in messages ("artifact \"x\" of job J"). */
int svc_store_open(svc_t *s, const char *path, const char *store_id, int64_t size, const char *what, int *fd_out,
                   kiln_err_t *err);
/* KILN_EUNSUPP: this kilnd keeps no artifacts (no --artifact-dir), with a hint. */
int svc_artifact_no_store(kiln_err_t *err);
/* fsync(2) of a directory, after a file in it was created or renamed (errors ignored). */
void svc_fsync_dir(const char *dir);
/* Removes the directories of this store's trash entries (at most limit); returns how many. */
int svc_artifact_sweep(svc_t *s, store_conn_t *c, int limit);
/* Starts and stops the clean-up thread (lifecycle.c). */
int svc_janitor_start(svc_t *s, kiln_err_t *err);
void svc_janitor_stop(svc_t *s);

/* The typed fields of an assignment that both kinds of job share beyond the engine's (memory
 * limit, grace, attempts) and a script job's (entry point, source and its archive's digest and
 * size, python, hyperparameters, channels, environment, torch_distributed), from sp; allocated
 * from arena (code.c). */
void svc_assignment_script(svc_t *s, const spec_t *sp, arena_t *arena, Kiln__Assignment *msg);
/* The job's synced checkpoint state into msg->checkpoint_files (allocated from arena; none when
 * it cannot be read, logged). For a job whose checkpoint_dir is "" (checkpoint.c). */
void svc_assignment_checkpoints(svc_t *s, const char *job_id, arena_t *arena, Kiln__Assignment *msg);
/* svc_agent_artifacts_begin and svc_agent_artifact_chunk for kind CHECKPOINT, once the worker
 * (wid) is known to hold rank 0 of the attempt and the manifest passed its checks. */
int svc_agent_checkpoint_begin(svc_t *s, const char *wid, const Kiln__ArtifactManifest *m, arena_t *arena,
                               Kiln__ArtifactManifestReply *out, kiln_err_t *err);
int svc_agent_checkpoint_chunk(svc_t *s, const char *wid, const Kiln__ArtifactChunk *ch, Kiln__ArtifactChunkReply *out,
                               kiln_err_t *err);

/* Copies a string into the arena ("" for NULL). */
char *svc_astr(arena_t *a, const char *s);

/* ---- Prometheus (monitor.c) ---- */
extern prom_family_t svc_prom_finished, svc_prom_queue_wait, svc_prom_sched_pass, svc_prom_lines, svc_prom_points;
/* Counts artifact bytes written to the store, and a deleted job (monitor.c). */
void svc_prom_artifact_bytes_stored(int64_t n);
void svc_prom_job_deleted(void);
/* The reasons a job is preempted, as kiln_queue_preemptions_total{queue,reason} counts them. */
#define SVC_PREEMPT_REASONS "priority", "reclaim", "backfill_overrun"
/* Counts an admission from queue (borrowing: above its nominal quota) and, when waited_s >= 0
 * (the job was QUEUED or PREEMPTED), observes its wait in kiln_queue_admission_wait_seconds. */
void svc_prom_queue_admitted(const char *queue, bool borrowing, double waited_s);
/* Counts a preemption of a job of queue; reason is one of SVC_PREEMPT_REASONS. */
void svc_prom_queue_preempted(const char *queue, const char *reason);
/* Makes the per-queue counters of these queues read 0 before their first event (each pass). */
void svc_prom_queues_seen(const sched_queue_t *queues, int n);
/* Registers the service's families (svc_create). */
void svc_prom_init(void);

/* Replaces `id` (a parameter) by the full id it names, or returns the error. */
/* The caller's projects as a PostgreSQL text[] literal (names are [a-z0-9._-]) into *out (caller
 * frees); NULL for a cluster admin, who sees every project. KILN_ENOMEM. */
int svc_caller_projects(const svc_caller_t *who, char **out, kiln_err_t *err);
/* The tuning controller's pass (tune.c), run by the leader's scheduler thread before each
 * scheduling pass: starts, promotes and stops trials and ends tuning jobs. */
void svc_tune_pass(svc_t *s);

#define JOB_RESOLVE(s, who, id, err)                                                              \
    char id##_full[SVC_JOB_ID_SIZE];                                                              \
    do {                                                                                          \
        int resolve_rc = svc_job_resolve((s), (who), (id), id##_full, (err));                      \
        if (resolve_rc)                                                                           \
            return resolve_rc;                                                                    \
        (id) = id##_full;                                                                         \
    } while (0)

/* ---- queues (queue.c) ---------------------------------------------------------------------- */
/* The admission core's queues from the stored ones (store_queue_defs_json's array, which must
 * outlive *out: names are borrowed), each with no usage (a pass counts it from the jobs holding
 * slots). *out is malloc'd. KILN_ENOMEM. */
int svc_queues_to_sched(const json_t *queues, sched_queue_t **out, int *n);
/* The one place that decides a submitted job's queue: queue is the spec's ("" when it names none:
 * then the project's default queue is written into it). KILN_EINVAL (field "queue") when the
 * queue does not exist or the project may not use it, KILN_EUNFIT when slots of slot_type are
 * more than any quota the queue could ever get (err says which limit). */
int svc_queue_resolve_job(store_conn_t *c, char queue[64], const char *project, const char *slot_type, int slots,
                          kiln_err_t *err);
/* Whether queue may be project's default queue: KILN_EINVAL (field "default_queue") when it does
 * not exist or the project may not use it. Run it in the transaction that then stores the
 * choice: it locks the queue's row (FOR SHARE) first, so a change of the queue's projects
 * (svc_queue_update, which refuses to shut out a project whose default queue it is) waits for
 * that transaction, or this waits for the change and checks the queue as changed. */
int svc_queue_check_default(store_conn_t *c, const char *queue, const char *project, kiln_err_t *err);

/* ---- pending reasons (pending.c) ----------------------------------------------------------- */
/* After a pass: computes the pending reason of every job of snap that dec (sched_admit's result)
 * did not admit (sched_pending, with the jobs holding slots: snap's running, and those dec admits
 * where it placed them), names in it only the jobs of the waiting job's project (sched_job_name)
 * and writes it onto those of jobs[] (the rows snap was made from) that still wait, where it
 * changed. Reads nothing from c. */
int svc_sched_pending_write(store_conn_t *c, const sched_snapshot_t *snap, const sched_decision_t *dec,
                            const store_job_row_t *jobs, kiln_err_t *err);

#endif /* KILN_SVC_INT_H */
