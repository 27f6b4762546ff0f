/* test_queues.c - a project's choice of a default queue and a change of that queue's projects,
 * run at the same time on a real PostgreSQL, cannot both pass: whichever holds the queue's row
 * first makes the other wait, and the other then sees what it did (the REST and gRPC answers are
 * in tests/api/test_queues.c and tests/grpc/test_grpc.c). */
#include <criterion/criterion.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "service/svc_int.h"
#include "tests/service/fixture.h"

TestSuite(queues, .init = setup, .fini = teardown, .timeout = 60);

/* One call on its own thread: a queue change or a project's new default queue. */
typedef struct call {
    const char *queue, *project;
    json_t *patch;
    json_t *out;
    int rc;
    kiln_err_t err;
} call_t;

static void *update_queue(void *arg)
{
    call_t *c = arg;
    c->rc = svc_queue_update(svc, svc_caller_kilnd(), c->queue, c->patch, &c->out, &c->err);
    return NULL;
}

static void *update_project(void *arg)
{
    call_t *c = arg;
    c->rc = svc_project_update(svc, svc_caller_kilnd(), c->project, c->patch, &c->out, &c->err);
    return NULL;
}

/* Waits (up to 10 s) until a backend of the test's database waits for a queue's row lock. pg is
 * outside any transaction (in one, pg_stat_activity would answer from one snapshot). */
static void wait_for_a_lock_wait(PGconn *pg)
{
    for (int i = 0; i < 1000; i++) {
        PGresult *r = PQexec(pg, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                 " AND wait_event_type = 'Lock' AND query LIKE '%FROM queues WHERE name = $1 FOR %'");
        cr_assert_eq(PQresultStatus(r), PGRES_TUPLES_OK, "%s", PQerrorMessage(pg));
        int n = atoi(PQgetvalue(r, 0, 0));
        PQclear(r);
        if (n > 0)
            return;
        usleep(10000);
    }
    cr_assert_fail("nothing waited for the queue's row");
}

static void exec_ok(PGconn *pg, const char *sql)
{
    PGresult *r = PQexec(pg, sql);
    cr_assert(PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK, "%s: %s", sql,
              PQerrorMessage(pg));
    PQclear(r);
}

Test(queues, a_projects_default_queue_and_a_change_of_the_queues_projects_cannot_both_pass)
{
    json_t *out = NULL;
    cr_assert_eq(svc_project_create(svc, svc_caller_kilnd(), "a", NULL, &out, &err), 0, "%s", err.message);
    json_decref(out);
    json_t *q = json_pack("{s:s, s:{s:i}, s:[s, s]}", "name", "team", "quota", "cpu", 4, "projects", "default", "a");
    cr_assert_eq(svc_queue_create(svc, svc_caller_kilnd(), q, &out, &err), 0, "%s", err.message);
    json_decref(out);
    json_decref(q);
    PGconn *pg = PQconnectdb(url), *holder = PQconnectdb(url);
    cr_assert_eq(PQstatus(pg), CONNECTION_OK, "%s", PQerrorMessage(pg));
    cr_assert_eq(PQstatus(holder), CONNECTION_OK, "%s", PQerrorMessage(holder));

    /* a takes team as its default queue, in a transaction not committed yet; meanwhile a cluster
     * admin leaves a out of team: the change waits for that transaction, then sees a's choice */
    svc_tx_t tx;
    cr_assert_eq(svc_tx_begin(svc, &tx, &err), 0, "%s", err.message);
    cr_assert_eq(svc_queue_check_default(tx.c, "team", "a", &err), 0, "%s", err.message);
    cr_assert_eq(store_project_set_default_queue(tx.c, "a", "team", &err), 0, "%s", err.message);
    call_t qc = {.queue = "team", .patch = json_pack("{s:[s]}", "projects", "default")};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, update_queue, &qc), 0);
    wait_for_a_lock_wait(pg);
    cr_assert_eq(svc_tx_commit(&tx, &err), 0, "%s", err.message);
    pthread_join(t, NULL);
    cr_assert_eq(qc.rc, KILN_ESTATE, "the change that shuts a out is refused: %d %s", qc.rc, qc.err.message);
    cr_assert(strstr(qc.err.message, "queue \"team\" is the default queue of project \"a\""), "%s", qc.err.message);
    json_decref(qc.patch);

    /* the other way round: a change of team's projects holds its row (as svc_queue_update's
     * transaction does) and leaves b out; b's choice of team waits for it, then is refused */
    cr_assert_eq(svc_project_create(svc, svc_caller_kilnd(), "b", NULL, &out, &err), 0, "%s", err.message);
    json_decref(out);
    exec_ok(pg, "UPDATE queues SET projects = '[\"default\", \"a\", \"b\"]' WHERE name = 'team'");
    exec_ok(holder, "BEGIN");
    exec_ok(holder, "SELECT 1 FROM queues WHERE name = 'team' FOR UPDATE");
    exec_ok(holder, "UPDATE queues SET projects = '[\"default\", \"a\"]' WHERE name = 'team'");
    call_t pc = {.project = "b", .patch = json_pack("{s:s}", "default_queue", "team")};
    cr_assert_eq(pthread_create(&t, NULL, update_project, &pc), 0);
    wait_for_a_lock_wait(pg);
    exec_ok(holder, "COMMIT");
    pthread_join(t, NULL);
    cr_assert_eq(pc.rc, KILN_EINVAL, "b may no longer use team: %d %s", pc.rc, pc.err.message);
    cr_assert(strstr(pc.err.message, "project \"b\" may not use queue \"team\""), "%s", pc.err.message);
    json_decref(pc.patch);
    json_decref(pc.out);
    PQfinish(holder);
    PQfinish(pg);
}
