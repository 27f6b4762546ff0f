/* pool.c - the store's connection pool (a PGconn is not thread-safe, so each thread borrows one),
 * transactions, the statement helper that maps PostgreSQL errors to kiln statuses, result column
 * helpers and COPY. No SQL about kiln's tables lives here. */
#include "store/store_int.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STORE_POOL_WAIT_S 30

static void notice_cb(void *arg, const char *message)
{
    (void)arg;
    /* Notices ("relation ... already exists, skipping") are not errors: keep them at debug. */
    size_t n = strlen(message);
    while (n > 0 && (message[n - 1] == '\n' || message[n - 1] == ' '))
        n--;
    log_debug("postgres: %.*s", (int)n, message);
}

/* A new or reset session has no prepared statements. */
static void conn_forget_prepared(store_conn_t *c)
{
    for (int i = 0; i < c->nprepared; i++) {
        free(c->prepared[i]);
        c->prepared[i] = NULL;
    }
    c->nprepared = 0;
    c->prepared_lost = false;
}

static int conn_open(store_t *st, store_conn_t *c, kiln_err_t *err)
{
    conn_forget_prepared(c);
    c->pg = PQconnectdb(st->url);
    if (PQstatus(c->pg) != CONNECTION_OK) {
        store_pg_conn_fail(c->pg, "connect to the database", err);
        PQfinish(c->pg);
        c->pg = NULL;
        kiln_err_hint(err, "check --database-url / KILN_DATABASE_URL and that PostgreSQL is running");
        return KILN_EDB;
    }
    PQsetNoticeProcessor(c->pg, notice_cb, NULL);
    c->in_tx = false;
    return 0;
}

int store_open(const char *url, int pool_size, store_t **out, kiln_err_t *err)
{
    *out = NULL;
    if (!url || !*url)
        return kiln_err_set(err, KILN_EINVAL, "database-url", "no database URL given");
    if (pool_size < 1)
        pool_size = 1;
    store_t *st = calloc(1, sizeof(*st));
    if (!st)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    st->url = strdup(url);
    st->size = pool_size;
    st->conns = calloc((size_t)pool_size, sizeof(store_conn_t));
    st->free_stack = calloc((size_t)pool_size, sizeof(int));
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, NULL);
    if (!st->url || !st->conns || !st->free_stack) {
        store_close(st);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    for (int i = 0; i < pool_size; i++) {
        st->conns[i].index = i;
        int rc = conn_open(st, &st->conns[i], err);
        if (rc) {
            store_close(st);
            return rc;
        }
        st->free_stack[st->nfree++] = i;
    }
    *out = st;
    return 0;
}

static void later_free(store_conn_t *c)
{
    for (int i = 0; i < c->nlater; i++) {
        for (int k = 0; k < c->later[i].nparams; k++)
            free(c->later[i].params[k]);
        free(c->later[i].params);
    }
    c->nlater = 0;
}

void store_close(store_t *st)
{
    if (!st)
        return;
    if (st->conns)
        for (int i = 0; i < st->size; i++) {
            if (st->conns[i].pg)
                PQfinish(st->conns[i].pg);
            conn_forget_prepared(&st->conns[i]);
            later_free(&st->conns[i]);
            free(st->conns[i].later);
        }
    pthread_mutex_destroy(&st->mu);
    pthread_cond_destroy(&st->cv);
    free(st->conns);
    free(st->free_stack);
    free(st->url);
    free(st);
}

int store_conn_backend_pid(store_conn_t *c)
{
    return c && c->pg ? PQbackendPID(c->pg) : 0;
}

int store_conn_get(store_t *st, store_conn_t **out, kiln_err_t *err)
{
    *out = NULL;
    /* Connections come back quickly (no caller holds one across a wait on something else); if
     * none does within 30 s the database is stuck and the caller should say so, not hang. */
    struct timespec deadline;
    kiln_deadline_in(&deadline, STORE_POOL_WAIT_S * 1000);
    pthread_mutex_lock(&st->mu);
    while (st->nfree == 0) {
        if (pthread_cond_timedwait(&st->cv, &st->mu, &deadline) == ETIMEDOUT && st->nfree == 0) {
            pthread_mutex_unlock(&st->mu);
            kiln_err_set(err, KILN_EUNAVAIL, NULL, "no database connection became free within %d s",
                         STORE_POOL_WAIT_S);
            kiln_err_hint(err, "the database may be stuck; raise --db-pool-size if the load is real");
            return KILN_EUNAVAIL;
        }
    }
    store_conn_t *c = &st->conns[st->free_stack[--st->nfree]];
    pthread_mutex_unlock(&st->mu);

    /* An idle connection whose server went away (a restart, pg_terminate_backend) still says
     * CONNECTION_OK until it is used; its socket is readable with the server's goodbye, so read
     * that now and reconnect here rather than fail the caller's first query. */
    for (int i = 0; i < 4 && c->pg && !c->in_tx && PQstatus(c->pg) == CONNECTION_OK; i++) {
        struct pollfd pf = {.fd = PQsocket(c->pg), .events = POLLIN};
        if (pf.fd < 0 || poll(&pf, 1, 0) <= 0 || !PQconsumeInput(c->pg))
            break; /* nothing waiting (the usual case), or the connection is now marked bad */
    }
    if (!c->pg || PQstatus(c->pg) != CONNECTION_OK) {
        if (c->pg) {
            PQreset(c->pg);
            conn_forget_prepared(c);
            if (PQstatus(c->pg) == CONNECTION_OK) {
                PQsetNoticeProcessor(c->pg, notice_cb, NULL);
                c->in_tx = false;
                goto ok;
            }
            PQfinish(c->pg);
            c->pg = NULL;
        }
        int rc = conn_open(st, c, err);
        if (rc) {
            store_conn_put(st, c);
            return rc;
        }
    }
ok:
    *out = c;
    return 0;
}

/* Leaves c's session as a new user must find it, whatever its last user did: no transaction (the
 * pool's, or one a statement opened), nothing deferred, not in pipeline mode, its prepared
 * statements those c->prepared names. A session that
 * cannot be brought back is closed (and with it whatever it held, such as an advisory lock), for
 * store_conn_get to open anew. */
static void conn_clean(store_conn_t *c)
{
    store_rollback(c);
    later_free(c);
    c->in_tx = c->begin_pending = false;
    if (!c->pg || PQstatus(c->pg) != CONNECTION_OK)
        return; /* store_conn_get reconnects it */
    if (PQpipelineStatus(c->pg) == PQ_PIPELINE_OFF && PQtransactionStatus(c->pg) != PQTRANS_IDLE)
        PQclear(PQexec(c->pg, "ROLLBACK"));
    bool lost = false;
    if (c->prepared_lost) { /* the others too, so that every name is free to prepare again */
        PGresult *r = PQexec(c->pg, "DEALLOCATE ALL");
        lost = PQresultStatus(r) != PGRES_COMMAND_OK;
        PQclear(r);
        conn_forget_prepared(c);
    }
    if (lost || PQpipelineStatus(c->pg) != PQ_PIPELINE_OFF || PQtransactionStatus(c->pg) != PQTRANS_IDLE) {
        PQfinish(c->pg);
        c->pg = NULL;
        conn_forget_prepared(c);
    }
}

void store_conn_put(store_t *st, store_conn_t *c)
{
    if (!c)
        return;
    conn_clean(c);
    pthread_mutex_lock(&st->mu);
    st->free_stack[st->nfree++] = c->index;
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
}

void store_unlock(store_conn_t *c, const char *key)
{
    const char *p[1] = {key};
    PGresult *r = PQexecParams(c->pg, "SELECT pg_advisory_unlock($1::bigint)", 1, NULL, p, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK && c->pg) {
        /* the session cannot run it (a failed transaction, pipeline mode, a lost server): ended,
         * it holds nothing; the pool opens a new one when c is next taken */
        char msg[256];
        kiln_strlcpy(msg, r ? PQresultErrorMessage(r) : PQerrorMessage(c->pg), sizeof(msg));
        msg[strcspn(msg, "\n")] = '\0';
        log_warn("store: could not release lock %s: %s; closing the session instead", key, msg);
        PQfinish(c->pg);
        c->pg = NULL;
        conn_forget_prepared(c);
    }
    PQclear(r);
}

int store_pg_fail(store_conn_t *c, PGresult *r, const char *what, kiln_err_t *err)
{
    const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    const char *primary = r ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY) : NULL;
    char msg[256];
    kiln_strlcpy(msg, primary ? primary : (c && c->pg ? PQerrorMessage(c->pg) : "no connection"),
                 sizeof(msg));
    msg[strcspn(msg, "\n")] = '\0';
    int status = KILN_EDB;
    /* What a request's values make the database refuse is the request's fault, never an outage:
     * class 22 (data exceptions: invalid text encoding, numbers or times out of range), 54
     * (program limits: a value too large to index) and integrity violations other than a
     * duplicate key (a check, a missing row a foreign key names). */
    /* a statement this session prepared is gone from it (a DISCARD, DEALLOCATE): every name is
     * suspect, so the pool makes them again once the connection is given back */
    if (state && strcmp(state, "26000") == 0 && c)
        c->prepared_lost = true;
    if (state && strcmp(state, "23505") == 0)
        status = KILN_EEXIST;
    else if (state && strcmp(state, "57014") == 0) /* query_canceled: a statement_timeout the caller set, or a cancel */
        status = KILN_ETIMEDOUT;
    else if (state && (!strncmp(state, "22", 2) || !strncmp(state, "54", 2) || !strncmp(state, "23", 2)))
        status = KILN_EINVAL;
    kiln_err_set(err, status, NULL, "could not %s: %s", what, msg);
    if (status == KILN_EINVAL)
        kiln_err_hint(err, "a value in the request is not one kiln can store or compare; check its encoding "
                           "(UTF-8), length and range");
    /* Logged also when refused as the request's fault: a class-22/23/54 error from kiln's own
     * SQL (a NULL where none belongs, a division by zero) would otherwise pass unseen. */
    if (status != KILN_EEXIST)
        log_warn("store: could not %s: %s (sqlstate %s)", what, msg, state ? state : "-");
    return status;
}

/* Hands a statement's result to the caller (out may be NULL to discard) or turns it into an
 * error. Consumes r. */
static int q_result(store_conn_t *c, PGresult *r, const char *what, PGresult **out, kiln_err_t *err)
{
    if (out)
        *out = NULL;
    ExecStatusType s = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
    if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) {
        int rc = store_pg_fail(c, r, what, err);
        PQclear(r);
        return rc;
    }
    if (out)
        *out = r;
    else
        PQclear(r);
    return 0;
}

/* Runs one statement in a pipeline after the BEGIN that store_begin left to send and the
 * statements deferred since, its result as q_result hands it over. */
static int q_with_begin(store_conn_t *c, bool unprepared, const char *what, const char *sql, int nparams,
                        const char *const *params, PGresult **out, kiln_err_t *err)
{
    store_stmt_t s = {.what = what, .sql = sql, .nparams = nparams, .params = params, .unprepared = unprepared};
    int rc = store_qp_pipeline(c, &s, 1, err);
    if (out)
        *out = rc ? NULL : s.r;
    if (rc || !out)
        PQclear(s.r);
    return rc;
}

int store_q(store_conn_t *c, const char *what, const char *sql, int nparams,
            const char *const *params, PGresult **out, kiln_err_t *err)
{
    if (c->begin_pending || c->nlater)
        return q_with_begin(c, true, what, sql, nparams, params, out, err);
    return q_result(c, PQexecParams(c->pg, sql, nparams, NULL, params, NULL, NULL, 0), what, out, err);
}

/* The index of sql among the statements prepared on c's session (c->nprepared: not yet). */
static int prepared_index(const store_conn_t *c, const char *sql)
{
    int i = 0;
    while (i < c->nprepared && strcmp(c->prepared[i], sql) != 0)
        i++;
    return i;
}

int store_qp(store_conn_t *c, const char *what, const char *sql, int nparams,
             const char *const *params, PGresult **out, kiln_err_t *err)
{
    if (c->begin_pending || c->nlater)
        return q_with_begin(c, false, what, sql, nparams, params, out, err);
    int i = prepared_index(c, sql);
    char name[16];
    snprintf(name, sizeof(name), "k%d", i);
    if (i == c->nprepared) {
        if (i == STORE_PREPARED_MAX)
            return store_q(c, what, sql, nparams, params, out, err);
        PGresult *pr = PQprepare(c->pg, name, sql, nparams, NULL);
        bool ok = pr && PQresultStatus(pr) == PGRES_COMMAND_OK;
        PQclear(pr);
        char *copy = ok ? strdup(sql) : NULL;
        if (!copy)
            return store_q(c, what, sql, nparams, params, out, err);
        c->prepared[c->nprepared++] = copy;
    }
    return q_result(c, PQexecPrepared(c->pg, name, nparams, params, NULL, NULL, 0), what, out, err);
}

/* What one pipeline sends: the BEGIN store_begin left pending, the statements deferred since
 * (store_q_later), then the caller's; r: where a statement's result goes (NULL: dropped). */
typedef struct pipe_item {
    const char *what, *sql;
    int nparams;
    const char *const *params;
    bool unprepared;
    PGresult **r;
} pipe_item_t;

/* One command queued in a pipeline: item's execution, or (slot >= 0) the PREPARE that makes
 * statement "k<slot>" for it. */
typedef struct pipe_cmd {
    int item, slot;
} pipe_cmd_t;

int store_qp_pipeline(store_conn_t *c, store_stmt_t *st, int n, kiln_err_t *err)
{
    for (int i = 0; i < n; i++)
        st[i].r = NULL;
    if (n == 1 && !c->begin_pending && c->nlater == 0)
        return st->unprepared ? store_q(c, st->what, st->sql, st->nparams, st->params, &st->r, err)
                              : store_qp(c, st->what, st->sql, st->nparams, st->params, &st->r, err);
    int nitem = 0, total = c->begin_pending + c->nlater + n;
    pipe_item_t *item = malloc((size_t)KILN_MAX(total, 1) * sizeof(*item));
    pipe_cmd_t *cmd = malloc((size_t)KILN_MAX(2 * total, 1) * sizeof(*cmd)); /* the commands queued, in order */
    if (!item || !cmd) {
        free(item);
        free(cmd);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    if (c->begin_pending)
        item[nitem++] = (pipe_item_t){.what = "begin a transaction", .sql = "BEGIN", .unprepared = true};
    for (int i = 0; i < c->nlater; i++)
        item[nitem++] = (pipe_item_t){.what = c->later[i].what, .sql = c->later[i].sql,
                                      .nparams = c->later[i].nparams,
                                      .params = (const char *const *)c->later[i].params,
                                      .unprepared = c->later[i].unprepared};
    for (int i = 0; i < n; i++)
        item[nitem++] = (pipe_item_t){.what = st[i].what, .sql = st[i].sql, .nparams = st[i].nparams,
                                      .params = st[i].params, .unprepared = st[i].unprepared, .r = &st[i].r};
    /* sent now: whatever becomes of them, a failure leaves the transaction for the caller to roll
     * back, and the deferred statements' parameters are freed once sent */
    c->begin_pending = false;
    int rc = 0, ncmd = 0;
    if (PQenterPipelineMode(c->pg) != 1)
        rc = store_pg_conn_fail(c->pg, "send statements together", err);
    /* Each statement as store_qp runs it: prepared on the session the first time (the PREPARE
     * goes in the pipeline just before it), by name after; or as store_q does. The statements and
     * their parameters are small: sent whole before any result is read, they fit the socket's
     * buffers, so blocking mode cannot deadlock with the server's output. */
    for (int i = 0; rc == 0 && i < nitem; i++) {
        const pipe_item_t *s = &item[i];
        int k = s->unprepared ? STORE_PREPARED_MAX : prepared_index(c, s->sql);
        char name[16];
        snprintf(name, sizeof(name), "k%d", k);
        bool named = k < c->nprepared;
        if (!named && k < STORE_PREPARED_MAX && (c->prepared[k] = strdup(s->sql))) {
            if (PQsendPrepare(c->pg, name, s->sql, s->nparams, NULL) != 1) {
                free(c->prepared[k]);
                c->prepared[k] = NULL;
                rc = store_pg_conn_fail(c->pg, s->what, err);
                break;
            }
            c->nprepared++;
            cmd[ncmd++] = (pipe_cmd_t){.item = i, .slot = k};
            named = true;
        }
        if (named ? PQsendQueryPrepared(c->pg, name, s->nparams, s->params, NULL, NULL, 0) != 1
                  : PQsendQueryParams(c->pg, s->sql, s->nparams, NULL, s->params, NULL, NULL, 0) != 1)
            rc = store_pg_conn_fail(c->pg, s->what, err);
        else
            cmd[ncmd++] = (pipe_cmd_t){.item = i, .slot = -1};
    }
    bool piped = PQpipelineStatus(c->pg) != PQ_PIPELINE_OFF;
    /* the sync even after a failed send: the server answers only what a sync ends */
    if (piped && PQpipelineSync(c->pg) != 1 && rc == 0)
        rc = store_pg_conn_fail(c->pg, "send statements together", err);
    /* every command's results in order, each ended by a NULL; after a failure the rest come back
     * aborted, and the first failure is the error. The server skips every command after a failed
     * one up to the sync, so the PREPAREs that did not make their statement (failed, skipped, or
     * lost with the connection) are the last this pipeline sent: the slots from the first of
     * them on (unmade) are free again. */
    int unmade = c->nprepared;
    for (int q = 0; q < ncmd; q++) {
        const pipe_item_t *s = &item[cmd[q].item];
        bool made = false;
        PGresult *r;
        while ((r = PQgetResult(c->pg)) != NULL) {
            ExecStatusType rs = PQresultStatus(r);
            made = made || rs == PGRES_COMMAND_OK;
            if (rs == PGRES_FATAL_ERROR && rc == 0)
                rc = store_pg_fail(c, r, s->what, err);
            if (cmd[q].slot < 0 && s->r && (rs == PGRES_TUPLES_OK || rs == PGRES_COMMAND_OK) && !*s->r)
                *s->r = r;
            else
                PQclear(r);
        }
        if (cmd[q].slot >= 0 && !made)
            unmade = KILN_MIN(unmade, cmd[q].slot);
    }
    while (c->nprepared > unmade) {
        c->nprepared--;
        free(c->prepared[c->nprepared]);
        c->prepared[c->nprepared] = NULL;
    }
    later_free(c);
    free(item);
    free(cmd);
    /* the sync's result, then out of pipeline mode (a connection that cannot leave it is closed
     * when it is given back) */
    if (piped) {
        PGresult *r = PQgetResult(c->pg);
        if (rc == 0 && (!r || PQresultStatus(r) != PGRES_PIPELINE_SYNC))
            rc = store_pg_fail(c, r, "send statements together", err);
        PQclear(r);
        if (PQexitPipelineMode(c->pg) != 1 && rc == 0)
            rc = store_pg_conn_fail(c->pg, "send statements together", err);
    }
    return rc;
}

int store_q_later(store_conn_t *c, const char *what, const char *sql, int nparams, const char *const *params,
                  kiln_err_t *err)
{
    store_later_t *l = NULL;
    if (c->in_tx && c->nlater < c->later_cap)
        l = &c->later[c->nlater];
    else if (c->in_tx) {
        int cap = KILN_MAX(2 * c->later_cap, 8);
        store_later_t *more = realloc(c->later, (size_t)cap * sizeof(*more));
        if (more) {
            c->later = more;
            c->later_cap = cap;
            l = &c->later[c->nlater];
        }
    }
    char **own = l ? calloc((size_t)KILN_MAX(nparams, 1), sizeof(*own)) : NULL;
    bool ok = own != NULL;
    for (int k = 0; ok && k < nparams; k++)
        ok = !params[k] || (own[k] = strdup(params[k]));
    if (!ok) { /* outside a transaction, or out of memory: now */
        for (int k = 0; own && k < nparams; k++)
            free(own[k]);
        free(own);
        return store_qp(c, what, sql, nparams, params, NULL, err);
    }
    *l = (store_later_t){.what = what, .sql = sql, .nparams = nparams, .params = own};
    c->nlater++;
    return 0;
}

static int q_rows(store_conn_t *c, bool prepared, const char *what, const char *sql, int nparams,
                  const char *const *params, size_t elem_size, store_row_fn fill, void **out, int *n,
                  kiln_err_t *err)
{
    *out = NULL;
    *n = 0;
    store_stmt_t s = {.what = what, .sql = sql, .nparams = nparams, .params = params, .unprepared = !prepared};
    int rc = store_qp_pipeline(c, &s, 1, err);
    return rc ? rc : store_stmt_rows(&s, elem_size, fill, out, n, err);
}

PGresult *store_stmt_take(store_stmt_t *s)
{
    PGresult *r = s->r;
    s->r = NULL;
    return r;
}

int store_stmt_rows(store_stmt_t *s, size_t elem_size, store_row_fn fill, void **out, int *n, kiln_err_t *err)
{
    *out = NULL;
    *n = 0;
    PGresult *r = store_stmt_take(s);
    int rows = PQntuples(r);
    char *arr = NULL;
    if (rows > 0 && !(arr = calloc((size_t)rows, elem_size))) {
        PQclear(r);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory reading %d rows to %s", rows, s->what);
    }
    for (int i = 0; i < rows; i++)
        fill(r, i, arr + (size_t)i * elem_size);
    PQclear(r);
    *out = arr;
    *n = rows;
    return 0;
}

int store_q_rows(store_conn_t *c, const char *what, const char *sql, int nparams,
                 const char *const *params, size_t elem_size, store_row_fn fill, void **out, int *n,
                 kiln_err_t *err)
{
    return q_rows(c, false, what, sql, nparams, params, elem_size, fill, out, n, err);
}

int store_qp_rows(store_conn_t *c, const char *what, const char *sql, int nparams,
                  const char *const *params, size_t elem_size, store_row_fn fill, void **out, int *n,
                  kiln_err_t *err)
{
    return q_rows(c, true, what, sql, nparams, params, elem_size, fill, out, n, err);
}

int store_begin(store_conn_t *c, kiln_err_t *err)
{
    (void)err;
    /* Sent with the transaction's first statement, in one round trip: nothing happens on the
     * connection in between, and a READ COMMITTED transaction's first statement takes its first
     * snapshot either way. */
    c->in_tx = true;
    c->begin_pending = true;
    return 0;
}

/* Sends the BEGIN store_begin left pending and the statements deferred since, before what cannot
 * go in a pipeline (COPY). */
static int begin_now(store_conn_t *c, kiln_err_t *err)
{
    return c->begin_pending || c->nlater ? store_qp_pipeline(c, NULL, 0, err) : 0;
}

int store_commit(store_conn_t *c, kiln_err_t *err)
{
    c->in_tx = false;
    if (c->begin_pending && c->nlater == 0) { /* nothing was sent: nothing to commit */
        c->begin_pending = false;
        return 0;
    }
    PGresult *r = NULL;
    int rc = store_q(c, "commit a transaction", "COMMIT", 0, NULL, &r, err); /* with what was deferred */
    /* PostgreSQL ends a transaction in which a statement failed (its caller went on regardless)
     * with a rollback, and answers its COMMIT with the tag ROLLBACK, not an error */
    if (rc == 0 && (!r || strcmp(PQcmdStatus(r), "COMMIT") != 0))
        rc = kiln_err_set(err, KILN_EDB, NULL,
                          "could not commit a transaction: a statement in it failed, and it was rolled back");
    PQclear(r);
    /* not sent (out of memory): dropped with the transaction */
    later_free(c);
    c->begin_pending = false;
    /* a deferred statement that failed left the COMMIT unrun and the transaction open, aborted */
    if (rc && PQtransactionStatus(c->pg) != PQTRANS_IDLE)
        PQclear(PQexec(c->pg, "ROLLBACK"));
    return rc;
}

void store_rollback(store_conn_t *c)
{
    if (!c || !c->in_tx)
        return;
    c->in_tx = false;
    later_free(c); /* never sent */
    if (c->begin_pending) {
        c->begin_pending = false;
        return;
    }
    PGresult *r = PQexec(c->pg, "ROLLBACK");
    PQclear(r);
}

int store_tx_statement_timeout(store_conn_t *c, int ms, kiln_err_t *err)
{
    char text[24];
    snprintf(text, sizeof text, "%d", ms);
    const char *p[] = {text};
    return store_q(c, "set the statement timeout", "SELECT set_config('statement_timeout', $1, true)", 1, p, NULL, err);
}

int store_q_script(store_conn_t *c, const char *what, const char *sql, kiln_err_t *err)
{
    int rc = begin_now(c, err);
    return rc ? rc : q_result(c, PQexec(c->pg, sql), what, NULL, err);
}

int store_ping(store_conn_t *c, kiln_err_t *err)
{
    return store_q(c, "reach the database", "SELECT 1", 0, NULL, NULL, err);
}

/* ---- result helpers ---------------------------------------------------------------------- */

int64_t store_get_i64(const PGresult *r, int row, int col)
{
    if (PQgetisnull(r, row, col))
        return 0;
    return strtoll(PQgetvalue(r, row, col), NULL, 10);
}

int store_get_int(const PGresult *r, int row, int col) { return (int)store_get_i64(r, row, col); }

double store_get_double(const PGresult *r, int row, int col)
{
    if (PQgetisnull(r, row, col))
        return 0;
    return strtod(PQgetvalue(r, row, col), NULL);
}

bool store_get_bool(const PGresult *r, int row, int col)
{
    return !PQgetisnull(r, row, col) && PQgetvalue(r, row, col)[0] == 't';
}

const char *store_get_str(const PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? "" : PQgetvalue(r, row, col);
}

bool store_is_null(const PGresult *r, int row, int col) { return PQgetisnull(r, row, col); }

void store_json_set_time(json_t *obj, const char *key, const PGresult *r, int row, int col)
{
    if (PQgetisnull(r, row, col)) {
        json_object_set_new(obj, key, json_null());
        return;
    }
    char buf[40];
    kiln_time_format(store_get_i64(r, row, col), buf, sizeof(buf));
    json_object_set_new(obj, key, json_string(buf));
}

/* jsonb text with each whole number that does not fit an int64 written as a real ("1e+20" is
 * stored as numeric and comes back as 100000000000000000000, which jansson refuses as an integer
 * but reads as the same double with ".0" after it). NULL when out of memory. */
static char *big_integers_as_reals(const char *s)
{
    size_t n = strlen(s);
    char *out = malloc(n + 2 * (n / 19) + 1), *o = out;
    if (!out)
        return NULL;
    bool in_str = false;
    for (size_t i = 0; i < n;) {
        char ch = s[i];
        if (in_str || ch == '"') {
            if (in_str && ch == '\\' && i + 1 < n) {
                *o++ = s[i++];
            } else if (ch == '"') {
                in_str = !in_str;
            }
            *o++ = s[i++];
            continue;
        }
        if (ch != '-' && !(ch >= '0' && ch <= '9')) { /* outside strings, digits are numbers' */
            *o++ = s[i++];
            continue;
        }
        size_t k = i + (ch == '-');
        while (k < n && s[k] >= '0' && s[k] <= '9')
            k++;
        bool whole = k == n || !strchr(".eE", s[k]);
        memcpy(o, s + i, k - i);
        o += k - i;
        if (whole) {
            errno = 0;
            (void)strtoll(s + i, NULL, 10);
            if (errno == ERANGE) {
                memcpy(o, ".0", 2);
                o += 2;
            }
        }
        i = k;
    }
    *o = '\0';
    return out;
}

json_t *store_json_parse(const char *text)
{
    json_error_t e;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &e);
    if (!j && json_error_code(&e) == json_error_numeric_overflow) {
        char *t = big_integers_as_reals(text);
        j = t ? json_loads(t, JSON_DECODE_ANY, &e) : NULL;
        free(t);
    }
    if (!j) /* the position and kind only: the text is a job's, not the log's */
        log_error("store: a stored JSON value does not parse at byte %d: error %d", e.position,
                  (int)json_error_code(&e));
    return j;
}

json_t *store_get_json(const PGresult *r, int row, int col, json_t *fallback)
{
    json_t *j = PQgetisnull(r, row, col) ? NULL : store_json_parse(PQgetvalue(r, row, col));
    if (j) {
        json_decref(fallback);
        return j;
    }
    return fallback ? fallback : json_object();
}

bool store_is_uuid(const char *s)
{
    if (!s || strlen(s) != 36)
        return false;
    for (int i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (s[i] != '-')
                return false;
        } else if (!isxdigit((unsigned char)s[i])) {
            return false;
        }
    }
    return true;
}

/* ---- COPY ---------------------------------------------------------------------------------- */

void store_buf_reserve(store_buf_t *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        log_error("store: out of memory building a COPY buffer of %zu bytes", cap);
        abort();
    }
    b->p = p;
    b->cap = cap;
}

void store_buf_put(store_buf_t *b, const char *s, size_t n)
{
    store_buf_reserve(b, n);
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

void store_buf_putc(store_buf_t *b, char ch)
{
    store_buf_reserve(b, 1);
    b->p[b->len++] = ch;
}

void store_buf_i64(store_buf_t *b, int64_t v)
{
    char tmp[24];
    int i = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do {
        tmp[i++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    store_buf_reserve(b, (size_t)i + 1);
    if (v < 0)
        b->p[b->len++] = '-';
    while (i)
        b->p[b->len++] = tmp[--i];
}

void store_buf_double(store_buf_t *b, double v)
{
    store_buf_reserve(b, 32);
    if (v != v) {
        store_buf_put(b, "NaN", 3);
        return;
    }
    if (v == 1.0 / 0.0) {
        store_buf_put(b, "Infinity", 8);
        return;
    }
    if (v == -1.0 / 0.0) {
        store_buf_put(b, "-Infinity", 9);
        return;
    }
    /* Integral values (steps, counts) print fast and exactly. */
    if (v == (double)(int64_t)v && v > -1e15 && v < 1e15) {
        store_buf_i64(b, (int64_t)v);
        return;
    }
    int n = snprintf(b->p + b->len, 32, "%.17g", v);
    b->len += (size_t)n;
}

int store_pg_conn_fail(PGconn *pg, const char *what, kiln_err_t *err)
{
    char msg[256];
    kiln_strlcpy(msg, pg ? PQerrorMessage(pg) : "no connection", sizeof(msg));
    msg[strcspn(msg, "\n")] = '\0';
    return kiln_err_set(err, KILN_EDB, NULL, "could not %s: %s", what, msg);
}

const char *store_hash_param(const uint8_t hash[STORE_HASH_LEN], char *buf)
{
    static const char hex[] = "0123456789abcdef";
    buf[0] = '\\';
    buf[1] = 'x';
    for (int i = 0; i < STORE_HASH_LEN; i++) {
        buf[2 + 2 * i] = hex[hash[i] >> 4];
        buf[3 + 2 * i] = hex[hash[i] & 15];
    }
    buf[2 + 2 * STORE_HASH_LEN] = '\0';
    return buf;
}

void store_buf_array_text(store_buf_t *b, const char *s)
{
    if (!s) {
        store_buf_put(b, "NULL", 4);
        return;
    }
    store_buf_putc(b, '"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            store_buf_putc(b, '\\');
        store_buf_putc(b, *s);
    }
    store_buf_putc(b, '"');
}

void store_buf_elem(store_buf_t *b, int i)
{
    store_buf_putc(b, i ? ',' : '{');
}

void store_buf_array_end(store_buf_t *b, int n)
{
    if (n <= 0)
        store_buf_putc(b, '{');
    store_buf_putc(b, '}');
    store_buf_putc(b, '\0');
}

void store_buf_elems(store_buf_t *cols, int ncols, int i)
{
    for (int k = 0; k < ncols; k++)
        store_buf_elem(&cols[k], i);
}

void store_buf_arrays_end(store_buf_t *cols, int ncols, int n)
{
    for (int k = 0; k < ncols; k++)
        store_buf_array_end(&cols[k], n);
}

void store_buf_text_array(store_buf_t *b, const char *const *v, int n)
{
    for (int i = 0; i < n; i++) {
        store_buf_elem(b, i);
        store_buf_array_text(b, v[i]);
    }
    store_buf_array_end(b, n);
}

void store_buf_uuid_array(store_buf_t *b, const char *const *v, int n)
{
    for (int i = 0; i < n; i++) {
        store_buf_elem(b, i);
        store_buf_put(b, v[i], strlen(v[i]));
    }
    store_buf_array_end(b, n);
}

void store_buf_i64_array(store_buf_t *b, const int64_t *v, int n)
{
    for (int i = 0; i < n; i++) {
        store_buf_elem(b, i);
        store_buf_i64(b, v[i]);
    }
    store_buf_array_end(b, n);
}

void store_buf_free(store_buf_t *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

int store_copy(store_conn_t *c, const char *what, const char *copy_sql, const store_buf_t *b,
               kiln_err_t *err)
{
    int brc = begin_now(c, err);
    if (brc)
        return brc;
    PGresult *r = PQexec(c->pg, copy_sql);
    if (!r || PQresultStatus(r) != PGRES_COPY_IN) {
        int rc = store_pg_fail(c, r, what, err);
        PQclear(r);
        /* Drain anything left so the connection stays usable. */
        while ((r = PQgetResult(c->pg)) != NULL)
            PQclear(r);
        return rc;
    }
    PQclear(r);
    int ok = 1;
    if (b->len > 0)
        ok = PQputCopyData(c->pg, b->p, (int)b->len);
    int end = PQputCopyEnd(c->pg, ok == 1 ? NULL : "client could not send data");
    int rc = 0;
    while ((r = PQgetResult(c->pg)) != NULL) {
        if (rc == 0 && PQresultStatus(r) != PGRES_COMMAND_OK)
            rc = store_pg_fail(c, r, what, err);
        PQclear(r);
    }
    if (rc == 0 && (ok != 1 || end != 1))
        rc = store_pg_fail(c, NULL, what, err);
    return rc;
}

void store_pool_usage(store_t *st, int *size, int *in_use)
{
    pthread_mutex_lock(&st->mu);
    *size = st->size;
    *in_use = st->size - st->nfree;
    pthread_mutex_unlock(&st->mu);
}
