/* store_int.h - internals shared by the store module's files: the pool and connection structs,
 * statement helpers, and the embedded migrations. Nothing outside store/ includes it. */
#ifndef KILN_STORE_INT_H
#define KILN_STORE_INT_H

#include <libpq-fe.h>
#include <pthread.h>

#include "store/store.h"

#define STORE_PREPARED_MAX 64

/* A statement deferred in a transaction (store_q_later): sent with the next one that must answer. */
typedef struct store_later {
    const char *what, *sql; /* sql: a literal, as every statement's text is */
    int nparams;
    char **params;          /* owned copies */
    bool unprepared;
} store_later_t;

struct store_conn {
    PGconn *pg;
    bool in_tx;
    bool begin_pending;         /* in_tx, and its BEGIN not sent yet: it goes with the next statement */
    store_later_t *later;       /* statements deferred in the transaction, in order; owned */
    int nlater, later_cap;
    int index;                  /* slot in the pool */
    char *prepared[STORE_PREPARED_MAX]; /* SQL of statement "k<i>" prepared on this session; owned */
    int nprepared;
    bool prepared_lost;         /* the session lost statements of prepared[] (a DISCARD): they are
                                 * deallocated and forgotten when the connection is given back */
};

struct store {
    char *url;
    int size;
    store_conn_t *conns;        /* size of them */
    int *free_stack;            /* indexes of free connections */
    int nfree;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

typedef struct store_migration {
    const char *version;        /* file name without ".sql" */
    const char *sql;
} store_migration_t;

/* Generated at build time from the migrations directory (migrations/embed.sh). */
extern const store_migration_t store_migrations_embedded[];
extern const int store_migrations_embedded_count;

/* Runs sql with text parameters (NULL entries are SQL NULL). On success *out (may be NULL to
 * discard) holds the result (PQclear it). what names the operation for error messages
 * ("insert job"). Maps SQLSTATEs: unique violation -> KILN_EEXIST, data exceptions (22xxx),
 * program limits (54xxx) and other integrity violations (23xxx) -> KILN_EINVAL,
 * anything else -> KILN_EDB. */
int store_q(store_conn_t *c, const char *what, const char *sql, int nparams,
            const char *const *params, PGresult **out, kiln_err_t *err);
/* Runs sql, several statements separated by semicolons (a migration), with the simple query
 * protocol: no parameters, no result kept. In a transaction it goes after the BEGIN and the
 * deferred statements, as store_q's statement would. Errors as store_q. */
int store_q_script(store_conn_t *c, const char *what, const char *sql, kiln_err_t *err);
/* Same as store_q, for hot statements whose text never changes: the statement is parsed and
 * planned once per connection (PQprepare, remembered by its text) and then only executed.
 * Falls back to store_q when the connection's cache is full or preparing fails. */
int store_qp(store_conn_t *c, const char *what, const char *sql, int nparams,
             const char *const *params, PGresult **out, kiln_err_t *err);
/* Runs sql (as store_q) and turns each result row into one element of a new array: elements
 * are elem_size bytes, zeroed, then filled by fill(result, row, element). Caller owns *out
 * (free()); *out is NULL when there are no rows. */
typedef void (*store_row_fn)(const PGresult *r, int row, void *elem);
int store_q_rows(store_conn_t *c, const char *what, const char *sql, int nparams,
                 const char *const *params, size_t elem_size, store_row_fn fill, void **out, int *n,
                 kiln_err_t *err);
/* One statement of a pipeline (store_qp_pipeline): its text, parameters (as store_q takes them)
 * and, once run, its result (PQclear it). */
typedef struct store_stmt {
    const char *what;
    const char *sql;
    int nparams;
    const char *const *params;
    PGresult *r;
    bool unprepared;   /* run as store_q runs it (planned each time) */
    const char *p[2];  /* room for params, and for short parameter texts, filled in place */
    char buf[2][32];
} store_stmt_t;
/* Runs st[0..n) as store_qp (or with unprepared, store_q) would run each, sent together and answered in one round trip to the
 * server (libpq's pipeline mode). Outside a transaction they run in one implicit transaction, each
 * statement with its own snapshot (READ COMMITTED) as when run one by one. Returns 0 with every
 * st[i].r set, or the first failing statement's error with st[i].r set for those that ran before
 * it (their effects rolled back, but for what a transaction does not undo, such as a session's
 * advisory lock). The caller PQclears every st[i].r either way. Meant for a few small statements
 * (their texts and parameters are sent before any result is read). */
int store_qp_pipeline(store_conn_t *c, store_stmt_t *st, int n, kiln_err_t *err);
/* s's result, handed over (s keeps none): caller owns it (PQclear). */
PGresult *store_stmt_take(store_stmt_t *s);
/* The rows of s's result as store_q_rows makes them (s's what names the read in errors). Takes
 * the result (s keeps none). */
int store_stmt_rows(store_stmt_t *s, size_t elem_size, store_row_fn fill, void **out, int *n, kiln_err_t *err);
/* Reads split in two, so that store_sched_pass_read sends them together: *_stmt fills a statement
 * (in place: it may point into itself), *_take turns its result, once run, into what the
 * one-statement function of the same name gives (taking the result, as store_stmt_take). */
void store_workers_capacity_stmt(store_stmt_t *s);
int store_workers_capacity_take(store_stmt_t *s, store_worker_cap_t **out, int *n, kiln_err_t *err);
void store_queue_defs_stmt(store_stmt_t *s);
int store_queue_defs_take(store_stmt_t *s, json_t **out, kiln_err_t *err);
void store_queue_project_usage_stmt(store_stmt_t *s, double half_life_s);
int store_queue_project_usage_take(store_stmt_t *s, json_t **out, kiln_err_t *err);
/* In a transaction, defers a statement whose result nobody needs (a write, a notification): it
 * is sent with the transaction's next statement that must answer (at the latest its COMMIT), in
 * the same round trip, and fails the transaction then if it fails; a rollback drops it. sql must
 * be a literal (it is kept, the parameters are copied). Outside a transaction it runs now, as
 * store_qp. */
int store_q_later(store_conn_t *c, const char *what, const char *sql, int nparams, const char *const *params,
                  kiln_err_t *err);
/* Same as store_q_rows, for hot statements (as store_qp). */
int store_qp_rows(store_conn_t *c, const char *what, const char *sql, int nparams,
                  const char *const *params, size_t elem_size, store_row_fn fill, void **out, int *n,
                  kiln_err_t *err);
/* Releases the session advisory lock key (a bigint's text) held by c's session. A session that
 * cannot run the statement (its transaction failed, it is in pipeline mode, its server is gone) is
 * closed instead, which releases every lock it held: c's statements then fail until it is given
 * back, and the pool opens a new session when it is next taken. */
void store_unlock(store_conn_t *c, const char *key);
/* Turns a failed result into a status + message. Consumes nothing. */
int store_pg_fail(store_conn_t *c, PGresult *r, const char *what, kiln_err_t *err);

/* Column helpers for a result row. */
int64_t store_get_i64(const PGresult *r, int row, int col);   /* NULL -> 0 */
int store_get_int(const PGresult *r, int row, int col);
double store_get_double(const PGresult *r, int row, int col);
bool store_get_bool(const PGresult *r, int row, int col);
const char *store_get_str(const PGresult *r, int row, int col); /* NULL -> "" ; borrowed */
bool store_is_null(const PGresult *r, int row, int col);
/* Sets key to the RFC 3339 time of a microseconds column, or JSON null when it is NULL. */
void store_json_set_time(json_t *obj, const char *key, const PGresult *r, int row, int col);
/* Parses a JSON text column; NULL/invalid gives fallback (new reference; a new empty object when
 * fallback is NULL). */
json_t *store_get_json(const PGresult *r, int row, int col, json_t *fallback);

/* Microseconds since the epoch of a timestamptz expression, as SQL. */
#define STORE_US(expr) "(floor(extract(epoch from " expr ") * 1000000))::bigint"

/* The job states of each kind in base/job_states.h, as SQL (string literals, so that queries stay
 * constants; tests/service/test_state.c checks each is its kind's states). WAITING: a job waits to
 * be placed; its pending reason (jobs.pending) is kept only in these. */
#define STORE_WAITING_NAMES "'QUEUED', 'RESTARTING', 'PREEMPTED'"
#define STORE_WAITING "(" STORE_WAITING_NAMES ")"
/* HOLDING: a job holds its slots (admitted, not yet released). */
#define STORE_HOLDING_NAMES "'SCHEDULED', 'STARTING', 'RUNNING', 'STOPPING'"
#define STORE_HOLDING "(" STORE_HOLDING_NAMES ")"
/* PARKED: a job neither waits nor holds slots but is not done: a hyperband trial PAUSED at a
 * rung, which the tuner may promote (back to RESTARTING, in its queue). */
#define STORE_PARKED_NAMES "'PAUSED'"
/* ENDED: the terminal states. */
#define STORE_ENDED_NAMES "'COMPLETED', 'FAILED', 'STOPPED'"
#define STORE_ENDED "(" STORE_ENDED_NAMES ")"
/* A tuning job's ACTIVE states in base/tuning_states.h, as SQL (checked there too). */
#define STORE_TUNING_ACTIVE_NAMES "'RUNNING', 'STOPPING'"
/* One state as an SQL literal, for the queries that name a single one: STORE_STATE(FAILED) is
 * "'FAILED'", a job state of base/job_states.h; STORE_TUNING_STATE(RUNNING) is "'RUNNING'", a tuning
 * job's state of base/tuning_states.h. A literal cannot check its name, so test_state reads every
 * use in store/ and checks its name is in its list, and that store/ quotes no state by hand. */
#define STORE_STATE(name) "'" #name "'"
#define STORE_TUNING_STATE(name) "'" #name "'"

/* The columns of a job as the API shows it, from "jobs j", and the JSON of one result row whose
 * first columns are these (job.c). */
#define STORE_JOB_COLS                                                                                  \
    "j.id::text, j.name, j.state, j.reason, j.attempt, " STORE_US("j.created_at") ", "            \
    STORE_US("j.updated_at") ", " STORE_US("j.started_at") ", " STORE_US("j.ended_at") ", "       \
    "j.progress_step, j.total_steps, j.eta_s, j.metrics::text, j.spec::text, "                    \
    "array_to_json(ARRAY(SELECT a.worker_id FROM assignments a WHERE a.job_id = j.id"             \
    " AND a.attempt = j.attempt AND j.attempt > 0 ORDER BY a.node_rank))::text, "                 \
    "j.priority, j.queue, j.project, j.tags::text, j.world_size, j.submitted_by, j.pending::text"
#define STORE_JOB_NCOLS 22
json_t *store_job_json(const PGresult *r, int row);

/* Why an insert of a job or a tuning job (of project, whose statement checks that the project
 * exists and that its queue lets it in, that queue's row locked FOR KEY SHARE) took nothing:
 * store_insert_no_project: KILN_ENOTFOUND (field "project") when the project does not exist; 0
 * when it exists now (made after the insert's snapshot was taken: the caller tries again).
 * store_insert_no_queue, once the project exists: KILN_EINVAL (field "queue") when the queue does
 * not exist or does not let the project in (a change of its projects committed since the service
 * checked them), else 0. */
int store_insert_no_project(store_conn_t *c, const char *project, kiln_err_t *err);
int store_insert_no_queue(store_conn_t *c, const char *project, const char *queue, kiln_err_t *err);

/* Growable byte buffer for building COPY data. */
typedef struct store_buf {
    char *p;
    size_t len, cap;
} store_buf_t;
void store_buf_reserve(store_buf_t *b, size_t extra);
void store_buf_put(store_buf_t *b, const char *s, size_t n);
void store_buf_putc(store_buf_t *b, char ch);
void store_buf_i64(store_buf_t *b, int64_t v);
void store_buf_double(store_buf_t *b, double v);
/* Sets err to KILN_EDB "could not <what>: <the connection's last error, its first line>" and
 * returns KILN_EDB. */
int store_pg_conn_fail(PGconn *pg, const char *what, kiln_err_t *err);
/* hash as the text of a bytea parameter ("\\x" and hex) in buf (2 * STORE_HASH_LEN + 3 bytes);
 * returns buf. */
const char *store_hash_param(const uint8_t hash[STORE_HASH_LEN], char *buf);
/* Appends s as an element of a PostgreSQL array literal: quoted, with " and \ escaped; NULL as
 * the unquoted NULL. */
void store_buf_array_text(store_buf_t *b, const char *s);
/* Array literals ({a,b,...}) for array parameters, an element at a time: store_buf_elem before
 * element i (i = 0, 1, ...: '{' before the first, ',' before the others), then the element, and
 * store_buf_array_end after the last, n being how many were written ("{}" for none); it
 * NUL-terminates the literal. The plural forms do the same for ncols column buffers at once (one
 * array per column, a row at a time). */
void store_buf_elem(store_buf_t *b, int i);
void store_buf_array_end(store_buf_t *b, int n);
void store_buf_elems(store_buf_t *cols, int ncols, int i);
void store_buf_arrays_end(store_buf_t *cols, int ncols, int n);
/* Whole array literals of v[0..n), NUL-terminated: texts quoted (NULL elements as NULL), UUIDs
 * (known well-formed) as they are, integers. */
void store_buf_text_array(store_buf_t *b, const char *const *v, int n);
void store_buf_uuid_array(store_buf_t *b, const char *const *v, int n);
void store_buf_i64_array(store_buf_t *b, const int64_t *v, int n);
void store_buf_free(store_buf_t *b);
/* Sends the buffer as one COPY ... FROM STDIN (text format) and drains the results. */
int store_copy(store_conn_t *c, const char *what, const char *copy_sql, const store_buf_t *b,
               kiln_err_t *err);

#endif /* KILN_STORE_INT_H */
