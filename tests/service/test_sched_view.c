/* test_sched_view.c - the scheduler's kept view of the waiting jobs (svc_sched_view_read) against a
 * fresh full read (store_job_pending) after every pass, on a real PostgreSQL: a seeded stream of
 * submissions, cancels, priority and queue changes, admissions, preemptions and deletions from two
 * store connections, with transactions left open across passes and committed out of order. */
#include <criterion/criterion.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/svc_int.h"
#include "store/store.h"
#include "tests/common/harness.h"

static char *vurl;
static store_t *vst;
static store_conn_t *reader, *w[2]; /* the pass's connection, and two writers */
static PGconn *raw;                 /* a third writer, for what the store has no function for */
static kiln_err_t verr;

static void vsetup(void)
{
    vurl = th_pg_create_db("schedview");
    cr_assert_not_null(vurl, "no test database (run with tests/run.sh)");
    cr_assert_eq(store_open(vurl, 4, &vst, &verr), 0, "%s", verr.message);
    cr_assert_eq(store_conn_get(vst, &reader, &verr), 0, "%s", verr.message);
    cr_assert_eq(store_migrate(reader, NULL, NULL, &verr), 0, "%s", verr.message);
    cr_assert_eq(store_project_insert(reader, "p", NULL, "test", &verr), 0, "%s", verr.message);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(store_conn_get(vst, &w[i], &verr), 0, "%s", verr.message);
    raw = PQconnectdb(vurl);
    cr_assert_eq(PQstatus(raw), CONNECTION_OK, "%s", PQerrorMessage(raw));
    /* the queues the tests submit to besides "default": a job's queue must let its project in */
    PGresult *r = PQexec(raw, "INSERT INTO queues (name, quota, projects) VALUES ('a', NULL, '[\"*\"]'),"
                              " ('b', NULL, '[\"*\"]')");
    cr_assert_eq(PQresultStatus(r), PGRES_COMMAND_OK, "%s", PQerrorMessage(raw));
    PQclear(r);
}

static void vteardown(void)
{
    PQfinish(raw);
    for (int i = 0; i < 2; i++)
        store_conn_put(vst, w[i]);
    store_conn_put(vst, reader);
    store_close(vst);
    free(vurl);
}

TestSuite(sched_view, .init = vsetup, .fini = vteardown, .timeout = 120);

static void sql(const char *q)
{
    PGresult *r = PQexec(raw, q);
    cr_assert(PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK, "%s: %s", q,
              PQerrorMessage(raw));
    PQclear(r);
}

static void submit_as(store_conn_t *c, int priority, const char *queue, const char *project, const char *slot_type,
                      char *id)
{
    store_job_new_t j = {.name = "v", .project = project, .queue = queue, .slot_type = slot_type,
                         .spec_json = "{\"name\": \"v\"}", .tags_json = "{}", .reason = "submitted",
                         .priority = priority, .nodes = 1, .slots_per_node = 1, .world_size = 1,
                         .max_attempts = 1, .total_steps = 10};
    bool created = false;
    cr_assert_eq(store_job_insert(c, &j, id, &created, NULL, &verr), 0, "%s", verr.message);
    cr_assert(created);
}

static void submit_on(store_conn_t *c, int priority, const char *queue, char *id)
{
    submit_as(c, priority, queue, "p", "cpu", id);
}

/* The job ids the test made, and what it believes each is in (only to pick legal moves). */
#define MAXJ 400
static char ids[MAXJ][STORE_ID_LEN];
static char states[MAXJ][16];
static bool touched[MAXJ]; /* written by writer 1's open transaction: the others leave it alone */
static int nids;
static bool w1_open;

/* A job the test believes in state, that writer `by` may write without waiting on a lock (-1:
 * none). */
static int pick(const char *state, unsigned *seed, store_conn_t *by)
{
    int cand[MAXJ], n = 0;
    for (int i = 0; i < nids; i++)
        if (!strcmp(states[i], state) && (by == w[1] || !touched[i]))
            cand[n++] = i;
    return n ? cand[rand_r(seed) % (unsigned)n] : -1;
}

/* Moves job i from its state to `to` on connection c; a move the job's state no longer allows
 * (another writer's open transaction may hold a different belief) changes nothing. */
static void move(store_conn_t *c, int i, const char *to, int flags)
{
    kiln_err_clear(&verr);
    int rc = store_job_transition(c, ids[i], states[i], to, "test", 0, flags, "test", &verr);
    cr_assert(rc == 0 || rc == KILN_ESTATE, "%s", verr.message);
    if (rc == 0)
        kiln_strlcpy(states[i], to, sizeof states[i]);
    if (c == w[1] && w1_open)
        touched[i] = true;
}

/* Reads through the view and through a full read; fails the test where they differ. */
static bool same_as_full(sched_view_t **view, int limit, int keep, bool must)
{
    store_job_row_t *a = NULL, *b = NULL;
    int na = 0, nb = 0;
    cr_assert_eq(svc_sched_view_read(view, reader, limit, keep, &a, &na, &verr), 0, "%s", verr.message);
    cr_assert_eq(store_job_pending(reader, limit, &b, &nb, &verr), 0, "%s", verr.message);
    bool same = na == nb;
    for (int i = 0; same && i < na; i++)
        same = memcmp(&a[i], &b[i], sizeof a[i]) == 0;
    if (must) {
        cr_assert_eq(na, nb, "the view has %d jobs, a full read %d", na, nb);
        for (int i = 0; i < na; i++)
            cr_assert(memcmp(&a[i], &b[i], sizeof a[i]) == 0,
                      "row %d: the view has %s (%s, priority %d, queue %s), a full read %s (%s, priority %d, queue %s)",
                      i, a[i].id, a[i].state, a[i].priority, a[i].queue, b[i].id, b[i].state, b[i].priority, b[i].queue);
    }
    free(a);
    free(b);
    return same;
}

static void run_stream(unsigned seed, int limit, int keep)
{
    sched_view_t *view = NULL;
    nids = 0;
    memset(touched, 0, sizeof touched);
    int fulls = 0;
    const char *qs[] = {"default", "a", "b"};
    const char *waiting[] = {"QUEUED", "PREEMPTED", "RESTARTING"};
    for (int pass = 0; pass < 150; pass++) {
        /* a transaction on writer 1 left open across the pass, committed after writer 0's later ones */
        bool open = rand_r(&seed) % 3 == 0;
        if (open)
            cr_assert_eq(store_begin(w[1], &verr), 0, "%s", verr.message);
        w1_open = open;
        int nops = 1 + (int)(rand_r(&seed) % 8);
        for (int k = 0; k < nops; k++) {
            store_conn_t *c = w[open ? 1 - (k % 2) : (int)(rand_r(&seed) % 2)];
            int op = (int)(rand_r(&seed) % 10), i;
            if ((op <= 2 || nids < 20) && nids < MAXJ) { /* a submission */
                submit_on(c, 10 * (int)(rand_r(&seed) % 4), qs[rand_r(&seed) % 3], ids[nids]);
                touched[nids] = c == w[1] && open;
                kiln_strlcpy(states[nids++], "QUEUED", sizeof states[0]);
            } else if (op == 3 && (i = pick(waiting[rand_r(&seed) % 3], &seed, c)) >= 0) {
                move(c, i, "STOPPED", STORE_TR_ENDED); /* a cancel */
            } else if (op == 4 && (i = pick("QUEUED", &seed, c)) >= 0) {
                move(c, i, "SCHEDULED", 0); /* an admission */
            } else if (op == 5 && (i = pick("SCHEDULED", &seed, c)) >= 0) {
                move(c, i, rand_r(&seed) % 2 ? "PREEMPTED" : "RESTARTING", 0); /* back to waiting */
            } else if (op == 6 && (i = pick("SCHEDULED", &seed, c)) >= 0) {
                move(c, i, "RUNNING", STORE_TR_STARTED);
            } else if (op == 7 && nids > 0 && !touched[i = (int)(rand_r(&seed) % (unsigned)nids)]) {
                char q[200]; /* a priority or queue change (raw: its own transaction) */
                if (rand_r(&seed) % 2)
                    snprintf(q, sizeof q, "UPDATE jobs SET priority = %d WHERE id = '%s'",
                             10 * (int)(rand_r(&seed) % 4), ids[i]);
                else
                    snprintf(q, sizeof q, "UPDATE jobs SET queue = '%s' WHERE id = '%s'", qs[rand_r(&seed) % 3], ids[i]);
                sql(q);
            } else if (op == 8 && (i = pick("STOPPED", &seed, c)) >= 0 && c == w[0] && !open) {
                json_t *removed = NULL; /* a deletion of an ended job */
                cr_assert_eq(store_job_delete(c, ids[i], &removed, &verr), 0, "%s", verr.message);
                json_decref(removed);
                kiln_strlcpy(states[i], "DELETED", sizeof states[i]);
            } else if (op == 9 && (i = pick("RUNNING", &seed, c)) >= 0) {
                move(c, i, "RESTARTING", 0);
            }
        }
        same_as_full(&view, limit, keep, true);
        fulls += svc_sched_view_was_full(view);
        if (open)
            cr_assert_eq(store_commit(w[1], &verr), 0, "%s", verr.message);
        w1_open = false;
        memset(touched, 0, sizeof touched);
        same_as_full(&view, limit, keep, true);
        fulls += svc_sched_view_was_full(view);
    }
    /* most passes read only the changes */
    cr_assert_lt(fulls, 100, "%d of 300 reads were full ones", fulls);
    svc_sched_view_drop(&view);
}

Test(sched_view, equals_a_full_read_after_every_pass)
{
    run_stream(28, 1000, 20000);
}

Test(sched_view, bounded_view_equals_a_full_read)
{
    run_stream(2028, 8, 24); /* the view keeps 24 jobs, a pass reads 8: it runs short and is read again */
}

/* Two writers commit out of their transactions' order: the one that began first (the smaller
 * transaction id) commits after the pass saw the later one. */
Test(sched_view, sees_a_transaction_that_commits_after_a_later_one)
{
    sched_view_t *view = NULL;
    char a[STORE_ID_LEN], b[STORE_ID_LEN];
    same_as_full(&view, 100, 1000, true);
    cr_assert_eq(store_begin(w[0], &verr), 0, "%s", verr.message);
    submit_on(w[0], 5, "default", a); /* the older transaction */
    submit_on(w[1], 5, "default", b); /* a newer one, committed at once */
    same_as_full(&view, 100, 1000, true);
    cr_assert_eq(store_commit(w[0], &verr), 0, "%s", verr.message);
    store_job_row_t *rows = NULL;
    int n = 0;
    cr_assert_eq(svc_sched_view_read(&view, reader, 100, 1000, &rows, &n, &verr), 0, "%s", verr.message);
    cr_assert_not(svc_sched_view_was_full(view), "read through the changes");
    cr_assert_eq(n, 2, "both jobs are in the view");
    free(rows);
    svc_sched_view_drop(&view);
}

/* The comparison can fail: a change the trigger does not mark is one the view misses. */
Test(sched_view, a_missed_change_is_caught)
{
    sched_view_t *view = NULL;
    char a[STORE_ID_LEN], q[200];
    submit_on(w[0], 5, "default", a);
    same_as_full(&view, 100, 1000, true);
    sql("ALTER TABLE jobs DISABLE TRIGGER jobs_sched_touch");
    snprintf(q, sizeof q, "UPDATE jobs SET priority = 7 WHERE id = '%s'", a);
    sql(q);
    cr_assert_not(same_as_full(&view, 100, 1000, false), "a change not marked is missed, and seen missed");
    sql("ALTER TABLE jobs ENABLE TRIGGER jobs_sched_touch");
    svc_sched_view_drop(&view);
    same_as_full(&view, 100, 1000, true);
    svc_sched_view_drop(&view);
}

/* A waiting job cancelled and deleted between two passes leaves no row to read as changed: the
 * deletion makes the next read a full one. */
Test(sched_view, a_job_ended_and_deleted_between_passes_leaves_it)
{
    sched_view_t *view = NULL;
    nids = 0;
    submit_on(w[0], 5, "default", ids[0]);
    submit_on(w[0], 5, "default", ids[1]);
    kiln_strlcpy(states[0], "QUEUED", sizeof states[0]);
    nids = 1;
    same_as_full(&view, 100, 1000, true);
    move(w[0], 0, "STOPPED", STORE_TR_ENDED);
    json_t *removed = NULL;
    cr_assert_eq(store_begin(w[0], &verr), 0, "%s", verr.message);
    cr_assert_eq(store_job_delete(w[0], ids[0], &removed, &verr), 0, "%s", verr.message);
    cr_assert_eq(store_commit(w[0], &verr), 0, "%s", verr.message);
    json_decref(removed);
    same_as_full(&view, 100, 1000, true);
    cr_assert(svc_sched_view_was_full(view));
    svc_sched_view_drop(&view);
}

/* The heads a pass reads beyond its window (svc_sched_view_heads) are, after every pass of a
 * seeded stream, what SQL's window functions say: the first `per` waiting jobs of each (queue,
 * project, slot type) with none among the first `limit`, in the queue's order, at most `max`. */
Test(sched_view, heads_beyond_the_window_are_each_groups_first)
{
    enum { LIMIT = 20, PER = 2, MAX = 10 };
    cr_assert_eq(store_project_insert(reader, "q", NULL, "test", &verr), 0, "%s", verr.message);
    const char *qs[] = {"default", "a", "b"}, *ps[] = {"p", "q"}, *ts[] = {"cpu", "gpu"};
    unsigned seed = 29;
    sched_view_t *view = NULL;
    int nonempty = 0;
    nids = 0;
    for (int pass = 0; pass < 40; pass++) {
        for (int k = 0; k < 6 && nids < MAXJ; k++) { /* the first queue's cpu jobs come first, mostly */
            bool crowd = rand_r(&seed) % 3 != 0;
            submit_as(w[0], crowd ? 30 : 10 * (int)(rand_r(&seed) % 3), crowd ? "default" : qs[rand_r(&seed) % 3],
                      crowd ? "p" : ps[rand_r(&seed) % 2], crowd ? "cpu" : ts[rand_r(&seed) % 2], ids[nids]);
            kiln_strlcpy(states[nids++], "QUEUED", sizeof states[0]);
        }
        for (int k = 0; k < 3; k++) { /* admissions and priority changes move the window */
            int i = pick("QUEUED", &seed, w[0]);
            if (i >= 0 && rand_r(&seed) % 2)
                move(w[0], i, "SCHEDULED", 0);
            else if (i >= 0) {
                char q[200];
                snprintf(q, sizeof q, "UPDATE jobs SET priority = %d WHERE id = '%s'", 10 * (int)(rand_r(&seed) % 4),
                         ids[i]);
                sql(q);
            }
        }
        store_job_row_t *rows = NULL, *heads = NULL;
        int n = 0, nh = 0;
        cr_assert_eq(svc_sched_view_read(&view, reader, LIMIT, 1000, &rows, &n, &verr), 0, "%s", verr.message);
        cr_assert_eq(svc_sched_view_heads(view, n, PER, MAX, &heads, &nh), 0);
        PGresult *r = PQexec(raw, "WITH w AS (SELECT id, queue, project, slot_type,"
                                  "  row_number() OVER (ORDER BY priority DESC, created_at, id) AS pos"
                                  "  FROM jobs WHERE state IN ('QUEUED', 'RESTARTING', 'PREEMPTED')),"
                                  " g AS (SELECT id, pos, row_number() OVER (PARTITION BY queue, project, slot_type"
                                  "  ORDER BY pos) AS k, min(pos) OVER (PARTITION BY queue, project, slot_type) AS first"
                                  "  FROM w)"
                                  " SELECT id::text FROM g WHERE first > 20 AND k <= 2 ORDER BY pos LIMIT 10");
        cr_assert_eq(PQresultStatus(r), PGRES_TUPLES_OK, "%s", PQerrorMessage(raw));
        cr_assert_eq(nh, PQntuples(r), "pass %d: %d heads beyond the window, SQL says %d", pass, nh, PQntuples(r));
        for (int i = 0; i < nh; i++)
            cr_assert_str_eq(heads[i].id, PQgetvalue(r, i, 0), "pass %d, head %d", pass, i);
        nonempty += nh > 0;
        PQclear(r);
        free(rows);
        free(heads);
    }
    cr_assert_gt(nonempty, 20, "only %d passes had groups beyond the window", nonempty);
    svc_sched_view_drop(&view);
}
