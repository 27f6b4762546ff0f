/* test_pool.c - the failure paths of the store's pool against a real PostgreSQL (a fresh database
 * per test): statements sent together (store_qp_pipeline) failing first, in the middle or last,
 * the lazy BEGIN and deferred statements (store_q_later) failing before COMMIT, ROLLBACK or a read,
 * prepared statements a failed pipeline never made or a DISCARD dropped, connections killed
 * mid-pipeline, connections given back dirty, and the scheduler's lock after its first read fails
 * or from a failed transaction. */
#include <criterion/criterion.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/store.h"
#include "store/store_int.h" /* the statement helpers, and c->pg to look at the session itself */
#include "tests/common/harness.h"

static char *url;
static store_t *st;
static store_conn_t *c;
static kiln_err_t err;

static const char ins[] = "INSERT INTO projects (name) VALUES ($1)";

static void setup(void)
{
    url = th_pg_create_db("pool");
    cr_assert_not_null(url, "no test database (run with tests/run.sh)");
    cr_assert_eq(store_open(url, 2, &st, &err), 0, "%s", err.message);
    cr_assert_eq(store_conn_get(st, &c, &err), 0, "%s", err.message);
    cr_assert_eq(store_migrate(c, NULL, NULL, &err), 0, "%s", err.message);
}

static void teardown(void)
{
    store_conn_put(st, c);
    store_close(st);
    free(url);
}

/* A connection of the test's own, outside the pool. */
static PGconn *admin(void)
{
    PGconn *pg = PQconnectdb(url);
    cr_assert_eq(PQstatus(pg), CONNECTION_OK, "%s", PQerrorMessage(pg));
    return pg;
}

static void admin_ok(PGconn *pg, const char *sql)
{
    PGresult *r = PQexec(pg, sql);
    ExecStatusType s = PQresultStatus(r);
    cr_assert(s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK, "%s: %s", sql, PQerrorMessage(pg));
    PQclear(r);
}

/* Waits until backend pid is gone (its locks released, its socket closed); terminate: ends it
 * first. */
static void end_backend(int pid, bool terminate)
{
    char where[64];
    snprintf(where, sizeof where, "pid = %d", pid);
    cr_assert(th_pg_end_backends(where, terminate, 30000), "backend %d did not exit", pid);
}

static long count_rows(const char *sql)
{
    return (long)th_pg_value(url, sql);
}

static long projects_named(const char *name)
{
    char sql[160];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM projects WHERE name = '%s'", name);
    return count_rows(sql);
}

/* x's session as a new user of the pool must find it: connected, outside any transaction and
 * pipeline, nothing deferred, and answering (line: the caller's, in the failure's message). */
static void assert_clean_at(store_conn_t *x, int line)
{
    cr_assert_eq(PQstatus(x->pg), CONNECTION_OK, "line %d: not connected", line);
    cr_assert_eq(PQpipelineStatus(x->pg), PQ_PIPELINE_OFF, "line %d: still in pipeline mode", line);
    cr_assert_eq(PQtransactionStatus(x->pg), PQTRANS_IDLE, "line %d: inside a transaction (status %d)", line,
                 (int)PQtransactionStatus(x->pg));
    cr_assert_not(x->in_tx || x->begin_pending || x->nlater, "line %d: the last user's transaction is still on it",
                  line);
    cr_assert_eq(store_ping(x, &err), 0, "line %d: %s", line, err.message);
    cr_assert_eq(PQtransactionStatus(x->pg), PQTRANS_IDLE, "line %d: a statement opened a transaction nobody asked for",
                 line);
}
#define assert_clean(x) assert_clean_at((x), __LINE__)

/* Gives c back and takes a connection again: with one caller, the same slot (the pool hands out
 * the last one given back). */
static void put_and_get(void)
{
    store_conn_t *was = c;
    store_conn_put(st, c);
    cr_assert_eq(store_conn_get(st, &c, &err), 0, "%s", err.message);
    cr_assert_eq(c, was);
}

/* Runs sql prepared (store_qp) and checks its one value. */
static void assert_qp_value(const char *sql, const char *param, const char *want)
{
    PGresult *r = NULL;
    const char *p[1] = {param};
    cr_assert_eq(store_qp(c, "probe", sql, 1, p, &r, &err), 0, "%s: %s", sql, err.message);
    cr_assert_str_eq(PQgetvalue(r, 0, 0), want);
    PQclear(r);
}

static long session_prepared(void)
{
    PGresult *r = NULL;
    cr_assert_eq(store_q(c, "count prepared", "SELECT count(*) FROM pg_prepared_statements", 0, NULL, &r, &err), 0,
                 "%s", err.message);
    long n = atol(PQgetvalue(r, 0, 0));
    PQclear(r);
    return n;
}

TestSuite(pool, .init = setup, .fini = teardown);

/* ---- statements sent together -------------------------------------------------------------- */

/* An error in the first, a middle or the last statement: the error names that statement, the
 * statements before it hand over their results, none after it ran, and the session is clean. */
Test(pool, a_pipelines_error_names_its_statement_wherever_it_is)
{
    for (int bad = 0; bad < 3; bad++) {
        store_stmt_t s[3];
        const char *what[3] = {"first", "second", "third"};
        for (int i = 0; i < 3; i++)
            s[i] = (store_stmt_t){.what = what[i], .sql = i == bad ? "SELECT 1 / 0" : "SELECT 7"};
        cr_assert_eq(store_qp_pipeline(c, s, 3, &err), KILN_EINVAL, "bad %d", bad);
        cr_assert(strstr(err.message, what[bad]), "%s", err.message);
        for (int i = 0; i < 3; i++) {
            cr_assert_eq(s[i].r != NULL, i < bad, "statement %d of a pipeline failing at %d", i, bad);
            PQclear(s[i].r);
        }
        assert_clean(c);
        /* each statement, prepared or not, runs again */
        assert_qp_value("SELECT $1::int * 7", "1", "7");
    }
    /* the same in a transaction whose BEGIN goes with it: the transaction fails whole */
    cr_assert_eq(store_begin(c, &err), 0);
    store_stmt_t s[2] = {{.what = "add", .sql = ins, .nparams = 1, .params = (const char *[]){"pipe-a"}},
                         {.what = "fail", .sql = "SELECT 1 / 0"}};
    cr_assert_neq(store_qp_pipeline(c, s, 2, &err), 0);
    PQclear(s[0].r);
    store_rollback(c);
    cr_assert_eq(projects_named("pipe-a"), 0);
    assert_clean(c);
}

/* A statement prepared in a pipeline after the statement that failed was never prepared (the
 * server skips everything up to the sync): the session must not take it for prepared. */
Test(pool, a_statement_a_failed_pipeline_skipped_is_prepared_again)
{
    static const char probe[] = "SELECT $1::int + 1";
    cr_assert_eq(store_qp(c, "add a project", ins, 1, (const char *[]){"dup"}, NULL, &err), 0, "%s", err.message);
    /* a deferred insert fails; the probe's PREPARE went in the same round trip, after it */
    cr_assert_eq(store_begin(c, &err), 0);
    cr_assert_eq(store_q_later(c, "add a project", ins, 1, (const char *[]){"dup"}, &err), 0);
    PGresult *r = NULL;
    cr_assert_eq(store_qp(c, "probe", probe, 1, (const char *[]){"1"}, &r, &err), KILN_EEXIST);
    cr_assert_null(r);
    store_rollback(c);
    assert_qp_value(probe, "1", "2");
    /* the same outside a transaction, with the statement that fails first in the pipeline, and
     * a PREPARE that fails itself: each statement after it runs next time */
    store_stmt_t s[3] = {{.what = "fail", .sql = "SELECT 1 / $1::int", .nparams = 1, .params = (const char *[]){"0"}},
                         {.what = "second", .sql = "SELECT $1::int + 2", .nparams = 1, .params = (const char *[]){"1"}},
                         {.what = "third", .sql = "SELECT $1::int + 3", .nparams = 1, .params = (const char *[]){"1"}}};
    cr_assert_eq(store_qp_pipeline(c, s, 3, &err), KILN_EINVAL);
    store_stmt_t bad[2] = {{.what = "broken", .sql = "SELEC $1::int"},
                           {.what = "fourth", .sql = "SELECT $1::int + 4", .nparams = 1, .params = (const char *[]){"1"}}};
    cr_assert_eq(store_qp_pipeline(c, bad, 2, &err), KILN_EDB);
    cr_assert(strstr(err.message, "broken"), "%s", err.message);
    assert_qp_value("SELECT 1 / $1::int", "1", "1");
    assert_qp_value("SELECT $1::int + 2", "1", "3");
    assert_qp_value("SELECT $1::int + 3", "1", "4");
    assert_qp_value("SELECT $1::int + 4", "1", "5");
    /* and what failed uses no name for good: the session holds as many statements as it was
     * told of, each one runs prepared */
    cr_assert_eq(session_prepared(), c->nprepared);
    for (int i = 0; i < 100; i++) {
        store_stmt_t again[2] = {{.what = "fail", .sql = "SELECT 1 / 0"},
                                 {.what = "fifth", .sql = "SELECT $1::int + 5", .nparams = 1,
                                  .params = (const char *[]){"1"}}};
        cr_assert_neq(store_qp_pipeline(c, again, 2, &err), 0);
    }
    cr_assert_lt(c->nprepared, 10, "failed pipelines used up %d names", c->nprepared);
    assert_qp_value("SELECT $1::int + 5", "1", "6");
    cr_assert_eq(session_prepared(), c->nprepared);
}

/* A new session (the old one killed) has none of the old one's prepared statements: each is
 * prepared again on it, alone or in a pipeline. */
Test(pool, a_reconnected_session_prepares_its_statements_again)
{
    assert_qp_value("SELECT $1::int + 10", "1", "11");
    cr_assert_eq(store_qp(c, "add a project", ins, 1, (const char *[]){"re-1"}, NULL, &err), 0, "%s", err.message);
    /* the session kills itself: the statement fails, and the connection taken again is new */
    cr_assert_eq(store_q(c, "kill", "SELECT pg_terminate_backend(pg_backend_pid())", 0, NULL, NULL, &err), KILN_EDB);
    put_and_get();
    assert_qp_value("SELECT $1::int + 10", "1", "11");
    cr_assert_eq(store_begin(c, &err), 0);
    cr_assert_eq(store_q_later(c, "add a project", ins, 1, (const char *[]){"re-2"}, &err), 0);
    cr_assert_eq(store_commit(c, &err), 0, "%s", err.message);
    cr_assert_eq(projects_named("re-2"), 1);
    cr_assert_eq(session_prepared(), c->nprepared);
}

/* ---- connections lost ------------------------------------------------------------------------ */

/* The backend dies in the middle of a pipeline (the second statement kills it): an error, no
 * hang, and the connection taken again is a new, clean session. */
Test(pool, a_connection_lost_mid_pipeline_fails_it_and_is_replaced)
{
    assert_qp_value("SELECT $1::int + 20", "1", "21");
    for (int in_tx = 0; in_tx < 2; in_tx++) {
        if (in_tx)
            cr_assert_eq(store_begin(c, &err), 0);
        store_stmt_t s[3] = {{.what = "first", .sql = "SELECT 1"},
                             {.what = "kill", .sql = "SELECT pg_terminate_backend(pg_backend_pid())"},
                             {.what = "third", .sql = "SELECT $1::int + 20", .nparams = 1,
                              .params = (const char *[]){"1"}}};
        cr_assert_eq(store_qp_pipeline(c, s, 3, &err), KILN_EDB);
        for (int i = 0; i < 3; i++)
            PQclear(s[i].r);
        store_rollback(c);
        put_and_get();
        assert_clean(c);
        assert_qp_value("SELECT $1::int + 20", "1", "21");
    }
}

/* The backend dies with deferred statements queued: the COMMIT fails (nothing is acknowledged
 * that was not written) and the connection taken again is clean. */
Test(pool, a_connection_lost_with_deferred_statements_fails_the_commit)
{
    cr_assert_eq(store_qp(c, "add a project", ins, 1, (const char *[]){"lost-0"}, NULL, &err), 0, "%s", err.message);
    for (int sent = 0; sent < 2; sent++) {
        cr_assert_eq(store_begin(c, &err), 0);
        if (sent) /* the BEGIN already went, with a statement */
            cr_assert_eq(store_ping(c, &err), 0, "%s", err.message);
        cr_assert_eq(store_q_later(c, "add a project", ins, 1, (const char *[]){"lost-1"}, &err), 0);
        end_backend(store_conn_backend_pid(c), true);
        cr_assert_eq(store_commit(c, &err), KILN_EDB, "a commit on a dead connection succeeded");
        cr_assert_eq(projects_named("lost-1"), 0);
        put_and_get();
        assert_clean(c);
    }
    cr_assert_eq(store_qp(c, "add a project", ins, 1, (const char *[]){"lost-2"}, NULL, &err), 0, "%s", err.message);
}

/* ---- a transaction that failed -------------------------------------------------------------- */

/* PostgreSQL answers the COMMIT of a failed transaction with ROLLBACK, not an error: the caller
 * that went on to commit after a failure (a deferred statement's, or a read's it let pass) must be
 * told nothing was written. */
Test(pool, a_commit_after_a_failure_in_its_transaction_fails)
{
    cr_assert_eq(store_qp(c, "add a project", ins, 1, (const char *[]){"dup"}, NULL, &err), 0, "%s", err.message);
    /* a statement's failure the caller let pass */
    cr_assert_eq(store_begin(c, &err), 0);
    cr_assert_eq(store_qp(c, "add a project", ins, 1, (const char *[]){"fail-1"}, NULL, &err), 0, "%s", err.message);
    cr_assert_neq(store_q(c, "divide", "SELECT 1 / 0", 0, NULL, NULL, &err), 0);
    cr_assert_eq(store_commit(c, &err), KILN_EDB, "the commit of a rolled-back transaction succeeded");
    cr_assert(strstr(err.message, "commit"), "%s", err.message);
    cr_assert_eq(projects_named("fail-1"), 0);
    assert_clean(c);
    /* a deferred statement's failure, reported by a read, then the COMMIT */
    cr_assert_eq(store_begin(c, &err), 0);
    cr_assert_eq(store_q_later(c, "add a project", ins, 1, (const char *[]){"fail-2"}, &err), 0);
    cr_assert_eq(store_q_later(c, "add a project", ins, 1, (const char *[]){"dup"}, &err), 0);
    cr_assert_eq(store_ping(c, &err), KILN_EEXIST);
    cr_assert_eq(store_commit(c, &err), KILN_EDB, "the commit of a rolled-back transaction succeeded");
    cr_assert_eq(projects_named("fail-2"), 0);
    assert_clean(c);
    /* ...then another read, then the COMMIT */
    cr_assert_eq(store_begin(c, &err), 0);
    cr_assert_eq(store_q_later(c, "add a project", ins, 1, (const char *[]){"fail-3"}, &err), 0);
    cr_assert_eq(store_q_later(c, "add a project", ins, 1, (const char *[]){"dup"}, &err), 0);
    cr_assert_eq(store_ping(c, &err), KILN_EEXIST);
    cr_assert_eq(store_ping(c, &err), KILN_EDB, "a read in a failed transaction");
    cr_assert_eq(store_commit(c, &err), KILN_EDB);
    cr_assert_eq(projects_named("fail-3"), 0);
    assert_clean(c);
    /* ...or a ROLLBACK: as good as new */
    cr_assert_eq(store_begin(c, &err), 0);
    cr_assert_eq(store_q_later(c, "add a project", ins, 1, (const char *[]){"dup"}, &err), 0);
    cr_assert_eq(store_ping(c, &err), KILN_EEXIST);
    store_rollback(c);
    assert_clean(c);
    /* and a transaction that failed nowhere commits */
    cr_assert_eq(store_begin(c, &err), 0);
    cr_assert_eq(store_q_later(c, "add a project", ins, 1, (const char *[]){"fail-4"}, &err), 0);
    cr_assert_eq(store_ping(c, &err), 0, "%s", err.message);
    cr_assert_eq(store_commit(c, &err), 0, "%s", err.message);
    cr_assert_eq(projects_named("fail-4"), 1);
}

/* ---- connections given back ------------------------------------------------------------------- */

/* Whatever state a user leaves its connection in, the next user gets a clean session, and what
 * the last user did not commit is not written. */
Test(pool, a_connection_given_back_dirty_is_clean_for_the_next_user)
{
    /* deferred statements never sent */
    cr_assert_eq(store_begin(c, &err), 0);
    cr_assert_eq(store_q_later(c, "add a project", ins, 1, (const char *[]){"put-1"}, &err), 0);
    put_and_get();
    assert_clean(c);
    cr_assert_eq(projects_named("put-1"), 0);
    /* deferred after the transaction began on the server */
    cr_assert_eq(store_begin(c, &err), 0);
    cr_assert_eq(store_ping(c, &err), 0);
    cr_assert_eq(store_q_later(c, "add a project", ins, 1, (const char *[]){"put-2"}, &err), 0);
    put_and_get();
    assert_clean(c);
    cr_assert_eq(projects_named("put-2"), 0);
    /* in a transaction that failed */
    cr_assert_eq(store_begin(c, &err), 0);
    cr_assert_neq(store_q(c, "divide", "SELECT 1 / 0", 0, NULL, NULL, &err), 0);
    put_and_get();
    assert_clean(c);
    /* in pipeline mode */
    cr_assert_eq(PQenterPipelineMode(c->pg), 1);
    put_and_get();
    assert_clean(c);
    /* in a transaction opened behind the pool's back (a BEGIN sent as a statement) */
    cr_assert_eq(store_q(c, "begin", "BEGIN", 0, NULL, NULL, &err), 0);
    cr_assert_eq(store_qp(c, "add a project", ins, 1, (const char *[]){"put-3"}, NULL, &err), 0, "%s", err.message);
    put_and_get();
    assert_clean(c);
    cr_assert_eq(projects_named("put-3"), 0);
}

/* ---- the scheduler's lock -------------------------------------------------------------------- */

typedef struct pass_arg {
    store_conn_t *c;
    int rc;
    bool locked;
} pass_arg_t;

static void *pass_read(void *arg)
{
    pass_arg_t *a = arg;
    store_pass_read_t pr = {.keep = 10, .usage = true, .half_life_s = 60};
    kiln_err_t e;
    a->rc = store_sched_pass_read(a->c, &pr, &e);
    a->locked = pr.locked;
    if (a->rc == 0 && pr.locked)
        store_sched_unlock(a->c);
    store_pass_read_clear(&pr);
    return NULL;
}

/* Whether a pass on another connection gets the lock now. */
static bool lock_is_free(void)
{
    store_conn_t *c2 = NULL;
    cr_assert_eq(store_conn_get(st, &c2, &err), 0, "%s", err.message);
    pass_arg_t a = {.c = c2};
    pass_read(&a);
    cr_assert_eq(a.rc, 0);
    store_conn_put(st, c2);
    return a.locked;
}

/* Waits until the backend pid waits on a lock (the pass blocked behind a LOCK TABLE), watched as
 * end_backend() watches. */
static void wait_blocked(int pid)
{
    PGconn *pg = admin();
    char sql[160];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM pg_stat_activity WHERE pid = %d AND wait_event_type = 'Lock'", pid);
    for (int i = 0; i < 3000; i++) {
        PGresult *r = PQexec(pg, sql);
        bool blocked = PQresultStatus(r) == PGRES_TUPLES_OK && atol(PQgetvalue(r, 0, 0)) == 1;
        PQclear(r);
        if (blocked) {
            PQfinish(pg);
            return;
        }
        usleep(10000);
    }
    cr_assert_fail("the pass never blocked on the table lock");
}

/* The pass's first read fails after the lock was granted (a statement behind it times out on a
 * table lock, is cancelled, or its backend is killed): the lock is released either way. */
Test(pool, a_pass_read_that_fails_after_the_lock_releases_it)
{
    PGconn *pg = admin();
    /* a lock timeout */
    admin_ok(pg, "BEGIN");
    admin_ok(pg, "LOCK TABLE queues IN ACCESS EXCLUSIVE MODE");
    cr_assert_eq(store_q(c, "set", "SET lock_timeout = '50ms'", 0, NULL, NULL, &err), 0);
    pass_arg_t a = {.c = c};
    pass_read(&a);
    cr_assert_neq(a.rc, 0, "the read went through a locked table");
    cr_assert_not(a.locked);
    cr_assert_eq(store_q(c, "reset", "RESET lock_timeout", 0, NULL, NULL, &err), 0, "%s", err.message);
    admin_ok(pg, "COMMIT");
    cr_assert(lock_is_free(), "the failed read left the scheduler's lock held");
    assert_clean(c);
    /* cancelled, then killed, while blocked */
    for (int kill = 0; kill < 2; kill++) {
        admin_ok(pg, "BEGIN");
        admin_ok(pg, "LOCK TABLE queues IN ACCESS EXCLUSIVE MODE");
        int pid = store_conn_backend_pid(c);
        pass_arg_t b = {.c = c};
        pthread_t t;
        cr_assert_eq(pthread_create(&t, NULL, pass_read, &b), 0);
        wait_blocked(pid);
        if (kill) {
            end_backend(pid, true);
        } else {
            char sql[64];
            snprintf(sql, sizeof sql, "SELECT pg_cancel_backend(%d)", pid);
            admin_ok(pg, sql);
        }
        pthread_join(t, NULL);
        cr_assert_neq(b.rc, 0);
        admin_ok(pg, "COMMIT");
        cr_assert(lock_is_free(), "the %s read left the scheduler's lock held", kill ? "killed" : "cancelled");
        put_and_get();
        assert_clean(c);
    }
    PQfinish(pg);
}

/* The lock is released even from a session that cannot run the unlock (its transaction failed):
 * that session is closed, and the connection taken again is a new one. */
Test(pool, the_scheduler_lock_is_released_from_a_failed_transaction)
{
    store_pass_read_t pr = {.keep = 10, .half_life_s = 60};
    cr_assert_eq(store_sched_pass_read(c, &pr, &err), 0, "%s", err.message);
    cr_assert(pr.locked);
    store_pass_read_clear(&pr);
    cr_assert_eq(store_begin(c, &err), 0);
    cr_assert_neq(store_q(c, "divide", "SELECT 1 / 0", 0, NULL, NULL, &err), 0);
    int pid = store_conn_backend_pid(c);
    store_sched_unlock(c);
    cr_assert_eq(store_conn_backend_pid(c), 0, "the session that held the lock is still open");
    end_backend(pid, false); /* the server releases its locks as its backend exits */
    cr_assert(lock_is_free(), "the lock stayed with the session whose transaction failed");
    store_rollback(c);
    put_and_get();
    assert_clean(c);
}

/* A session that lost its prepared statements other than by reconnecting (a DISCARD ALL, or one
 * DEALLOCATE) fails the statement that finds one gone, once: given back, the connection prepares
 * each again. */
Test(pool, a_session_that_lost_its_prepared_statements_prepares_them_again)
{
    static const char *discard[] = {"DISCARD ALL", "DEALLOCATE k1"};
    for (int i = 0; i < 2; i++) {
        assert_qp_value("SELECT $1::int + 30", "1", "31");
        assert_qp_value("SELECT $1::int + 31", "1", "32");
        cr_assert_eq(store_q(c, "forget", discard[i], 0, NULL, NULL, &err), 0, "%s", err.message);
        PGresult *r = NULL;
        cr_assert_eq(store_qp(c, "probe", "SELECT $1::int + 31", 1, (const char *[]){"1"}, &r, &err), KILN_EDB);
        put_and_get();
        assert_clean(c);
        assert_qp_value("SELECT $1::int + 30", "1", "31");
        assert_qp_value("SELECT $1::int + 31", "1", "32");
        /* and in a pipeline, with a deferred statement */
        cr_assert_eq(store_begin(c, &err), 0);
        cr_assert_eq(store_q_later(c, "add a project", ins, 1, (const char *[]){i ? "dis-2" : "dis-1"}, &err), 0);
        assert_qp_value("SELECT $1::int + 30", "1", "31");
        cr_assert_eq(store_commit(c, &err), 0, "%s", err.message);
        cr_assert_eq(session_prepared(), c->nprepared);
    }
}
