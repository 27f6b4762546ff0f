/* test_store.c - the store module against a real PostgreSQL (the cluster tests/run.sh starts; a
 * fresh database per test): migrations (once, recorded, idempotent, concurrent appliers, from a
 * directory, 0014 on jobs that ran before it), jobs (insert, idempotency, transitions and events, list with filters and paging),
 * COPY ingest of logs and metrics and their reads, workers and assignments. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <libpq-fe.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/store.h"
#include "store/store_int.h" /* the statement helpers a transaction runs on (store_q, store_q_later) */
#include "tests/common/harness.h"

static char *url;
static store_t *st;
static store_conn_t *c;
static kiln_err_t err;

static void setup(void)
{
    url = th_pg_create_db("store");
    cr_assert_not_null(url, "no test database (run with tests/run.sh)");
    cr_assert_eq(store_open(url, 2, &st, &err), 0, "%s", err.message);
    cr_assert_eq(store_conn_get(st, &c, &err), 0, "%s", err.message);
}

static void setup_migrated(void)
{
    setup();
    cr_assert_eq(store_migrate(c, NULL, NULL, &err), 0, "%s", err.message);
    /* the project the jobs below are in (a job's project must exist: store_job_insert checks) */
    cr_assert_eq(store_project_insert(c, "p", NULL, "test", &err), 0, "%s", err.message);
}

static void teardown(void)
{
    store_conn_put(st, c);
    store_close(st);
    free(url);
}

static long count_rows(const char *sql)
{
    return (long)th_pg_value(url, sql);
}

/* ---- migrations ------------------------------------------------------------------------------ */

TestSuite(migrate, .init = setup, .fini = teardown);

Test(migrate, applies_once_and_records)
{
    int applied = -1, pending = -1;
    cr_assert_eq(store_migrations_pending(c, NULL, &pending, &err), KILN_EDB); /* no table yet */
    cr_assert_gt(pending, 0);
    cr_assert_eq(store_migrate(c, NULL, &applied, &err), 0, "%s", err.message);
    cr_assert_geq(applied, 1);
    long recorded = count_rows("SELECT count(*) FROM schema_migrations");
    cr_assert_eq(recorded, applied);
    cr_assert_eq(count_rows("SELECT count(*) FROM schema_migrations WHERE version = '0001_init'"), 1);
    cr_assert_eq(store_migrations_pending(c, NULL, &pending, &err), 0);
    cr_assert_eq(pending, 0);
    /* Running again is a no-op. */
    cr_assert_eq(store_migrate(c, NULL, &applied, &err), 0, "%s", err.message);
    cr_assert_eq(applied, 0);
    cr_assert_eq(count_rows("SELECT count(*) FROM schema_migrations"), recorded);
}

Test(migrate, from_directory_matches_embedded)
{
    const char *root = getenv("KILN_ROOT");
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/migrations", root ? root : ".");
    int applied = 0, pending = -1;
    cr_assert_eq(store_migrate(c, dir, &applied, &err), 0, "%s", err.message);
    cr_assert_geq(applied, 1);
    /* The embedded copy knows exactly the same versions. */
    cr_assert_eq(store_migrations_pending(c, NULL, &pending, &err), 0);
    cr_assert_eq(pending, 0);
    cr_assert_eq(store_migrate(c, NULL, &applied, &err), 0);
    cr_assert_eq(applied, 0);
    cr_assert_eq(store_migrate(c, "/nonexistent-kiln-dir", &applied, &err), KILN_EIO);
}

/* A migration and the row that records it are written by one transaction (same xmin): a crash
 * between them cannot leave a migration applied but unrecorded, to be applied again. */
Test(migrate, a_migration_and_its_record_commit_together)
{
    char dir[] = "/tmp/kiln-mig.XXXXXX", path[256];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/0001_probe.sql", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("CREATE TABLE probe (x int);\nINSERT INTO probe VALUES (1);\n", f);
    fclose(f);
    int applied = 0;
    cr_assert_eq(store_migrate(c, dir, &applied, &err), 0, "%s", err.message);
    cr_assert_eq(applied, 1);
    unlink(path);
    rmdir(dir);
    cr_assert_eq(count_rows("SELECT count(*) FROM probe p JOIN schema_migrations m ON m.xmin = p.xmin"
                            " WHERE m.version = '0001_probe'"), 1,
                 "the migration and its record were committed apart");
}

typedef struct mig_arg {
    int applied, rc;
} mig_arg_t;

static void *mig_thread(void *p)
{
    mig_arg_t *a = p;
    store_t *s2 = NULL;
    store_conn_t *c2 = NULL;
    kiln_err_t e;
    a->rc = store_open(url, 1, &s2, &e);
    if (a->rc == 0)
        a->rc = store_conn_get(s2, &c2, &e);
    if (a->rc == 0)
        a->rc = store_migrate(c2, NULL, &a->applied, &e);
    store_conn_put(s2, c2);
    store_close(s2);
    return NULL;
}

Test(migrate, concurrent_appliers_do_not_conflict)
{
    enum { N = 6 };
    pthread_t t[N];
    mig_arg_t a[N];
    memset(a, 0, sizeof(a));
    for (int i = 0; i < N; i++)
        pthread_create(&t[i], NULL, mig_thread, &a[i]);
    int total = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        cr_assert_eq(a[i].rc, 0, "applier %d failed", i);
        total += a[i].applied;
    }
    long recorded = count_rows("SELECT count(*) FROM schema_migrations");
    cr_assert_eq(total, recorded, "each migration applied exactly once (%d applied, %ld recorded)",
                 total, recorded);
    cr_assert_eq(count_rows("SELECT count(*) FROM pg_tables WHERE tablename = 'jobs'"), 1);
}

/* ---- jobs -------------------------------------------------------------------------------------- */

TestSuite(jobs, .init = setup_migrated, .fini = teardown);

static void insert_job(const char *name, int priority, const char *tags, const char *key,
                       char *id, bool *created)
{
    store_job_new_t j = {.name = name, .project = "p", .queue = "default", .slot_type = "cpu",
                         .spec_json = "{\"name\": \"x\"}", .tags_json = tags, .idempotency_key = key,
                         .reason = "submitted", .priority = priority, .nodes = 2, .slots_per_node = 1,
                         .world_size = 2, .max_attempts = 2, .total_steps = 100};
    bool cr = false;
    json_t *jj = NULL;
    cr_assert_eq(store_job_insert(c, &j, id, &cr, &jj, &err), 0, "%s", err.message);
    cr_assert_not_null(jj);
    cr_assert_str_eq(json_string_value(json_object_get(jj, "id")), id);
    cr_assert_str_eq(json_string_value(json_object_get(jj, "state")), "QUEUED");
    json_decref(jj);
    if (created)
        *created = cr;
}

/* Migration 0014 moves checkpoints to project areas for new jobs only: a job with a
 * checkpoint.path that has not ended keeps <checkpoint.path>/<job id> (ckpt_flat_dir). */
Test(migrate, jobs_that_had_not_ended_keep_their_flat_checkpoint_dir)
{
    const char *root = getenv("KILN_ROOT");
    char src[1024], tmp[] = "/tmp/kiln-mig.XXXXXX", from[1400], to[1400];
    snprintf(src, sizeof src, "%s/migrations", root ? root : ".");
    cr_assert_not_null(mkdtemp(tmp));
    /* the migrations before 0014, from the repository's directory */
    DIR *d = opendir(src);
    cr_assert_not_null(d, "%s", src);
    struct dirent *e;
    while ((e = readdir(d)))
        if (strlen(e->d_name) > 4 && !strcmp(e->d_name + strlen(e->d_name) - 4, ".sql") &&
            strcmp(e->d_name, "0014") < 0) {
            snprintf(from, sizeof from, "%s/%s", src, e->d_name);
            snprintf(to, sizeof to, "%s/%s", tmp, e->d_name);
            cr_assert_eq(symlink(from, to), 0);
        }
    closedir(d);
    int applied = 0;
    cr_assert_eq(store_migrate(c, tmp, &applied, &err), 0, "%s", err.message);
    cr_assert_geq(applied, 9);
    snprintf(from, sizeof from, "rm -rf '%s'", tmp);
    cr_assert_eq(system(from), 0);
    /* the project too, by hand: today's store_project_insert writes a column 0024 adds */
    {
        PGconn *pg = PQconnectdb(url);
        PGresult *r = PQexec(pg, "INSERT INTO projects (name, created_by) VALUES ('p', 'test')");
        cr_assert_eq(PQresultStatus(r), PGRES_COMMAND_OK, "%s", PQerrorMessage(pg));
        PQclear(r);
        PQfinish(pg);
    }
    static const struct { const char *state, *spec; bool flat; } jobs[] = {
        {"RUNNING", "{\"checkpoint\": {\"path\": \"/data/ck\"}}", true},
        {"RESTARTING", "{\"checkpoint\": {\"path\": \"/data/ck\"}}", true},
        {"QUEUED", "{\"checkpoint\": {\"path\": \"/data/ck\"}}", true},
        {"COMPLETED", "{\"checkpoint\": {\"path\": \"/data/ck\"}}", false},
        {"RUNNING", "{\"checkpoint\": {\"every_steps\": 5}}", false},
    };
    char ids[KILN_ARRAY_LEN(jobs)][STORE_ID_LEN];
    /* rows of the schema before 0014, written by hand: today's store_job_insert reads columns
     * later migrations add */
    PGconn *pg = PQconnectdb(url);
    for (size_t i = 0; i < KILN_ARRAY_LEN(jobs); i++) {
        const char *p[2] = {jobs[i].spec, jobs[i].state};
        PGresult *r = PQexecParams(pg, "INSERT INTO jobs (id, name, project, spec, state, nodes, slots_per_node,"
                                       " slot_type, world_size, max_attempts, total_steps) VALUES (gen_random_uuid(),"
                                       " 'm', 'p', $1::jsonb, $2, 1, 1, 'cpu', 1, 2, 10) RETURNING id::text",
                                   2, NULL, p, NULL, NULL, 0);
        cr_assert_eq(PQresultStatus(r), PGRES_TUPLES_OK, "%s", PQerrorMessage(pg));
        kiln_strlcpy(ids[i], PQgetvalue(r, 0, 0), sizeof ids[i]);
        PQclear(r);
    }
    PQfinish(pg);
    cr_assert_eq(store_migrate(c, NULL, &applied, &err), 0, "%s", err.message);
    cr_assert_geq(applied, 1);
    for (size_t i = 0; i < KILN_ARRAY_LEN(jobs); i++) {
        store_job_row_t row;
        cr_assert_eq(store_job_row(c, ids[i], false, &row, &err), 0, "%s", err.message);
        cr_assert_eq(row.ckpt_flat_dir, jobs[i].flat, "a %s job with %s", jobs[i].state, jobs[i].spec);
    }
    store_job_new_t j = {.name = "new", .project = "p", .queue = "default", .slot_type = "cpu",
                         .spec_json = jobs[0].spec, .tags_json = "{}", .reason = "submitted", .nodes = 1,
                         .slots_per_node = 1, .world_size = 1, .max_attempts = 2, .total_steps = 10};
    char id[STORE_ID_LEN];
    bool created = false;
    cr_assert_eq(store_job_insert(c, &j, id, &created, NULL, &err), 0, "%s", err.message);
    store_job_row_t row;
    cr_assert_eq(store_job_row(c, id, false, &row, &err), 0, "%s", err.message);
    cr_assert_not(row.ckpt_flat_dir, "a job submitted afterwards checkpoints in its project's area");
}

Test(jobs, insert_get_and_first_event)
{
    char id[STORE_ID_LEN];
    bool created = false;
    insert_job("first", 3, "{\"team\": \"nlp\"}", NULL, id, &created);
    cr_assert(created);
    cr_assert(store_is_uuid(id));
    json_t *j = NULL;
    cr_assert_eq(store_job_get_json(c, id, &j, &err), 0, "%s", err.message);
    cr_assert_str_eq(json_string_value(json_object_get(j, "state")), "QUEUED");
    cr_assert_str_eq(json_string_value(json_object_get(j, "name")), "first");
    cr_assert_eq(json_integer_value(json_object_get(j, "attempt")), 0);
    cr_assert(json_is_null(json_object_get(j, "started_at")));
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(j, "progress"), "total_steps")), 100);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "spec"), "name")), "x");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "tags"), "team")), "nlp");
    json_decref(j);

    json_t *ev = NULL;
    cr_assert_eq(store_job_events_json(c, id, &ev, &err), 0);
    cr_assert_eq(json_array_size(ev), 1);
    json_t *e0 = json_array_get(ev, 0);
    cr_assert(json_is_null(json_object_get(e0, "from_state")));
    cr_assert_str_eq(json_string_value(json_object_get(e0, "to_state")), "QUEUED");
    cr_assert_str_eq(json_string_value(json_object_get(e0, "reason")), "submitted");
    cr_assert_eq(json_integer_value(json_object_get(e0, "seq")), 1);
    json_decref(ev);

    cr_assert_eq(store_job_get_json(c, "00000000-0000-0000-0000-000000000000", &j, &err), KILN_ENOTFOUND);
    cr_assert_eq(store_job_get_json(c, "not-a-uuid", &j, &err), KILN_ENOTFOUND);
    cr_assert_eq(store_job_events_json(c, "00000000-0000-0000-0000-000000000000", &ev, &err), KILN_ENOTFOUND);
}

Test(jobs, idempotency_key_is_unique_in_its_project)
{
    char a[STORE_ID_LEN], b[STORE_ID_LEN] = "", d[STORE_ID_LEN];
    bool ca = false, cb = true, cd = false;
    uint8_t h1[STORE_HASH_LEN], h2[STORE_HASH_LEN];
    memset(h1, 1, sizeof h1);
    memset(h2, 2, sizeof h2);
    store_job_new_t j = {.name = "one", .project = "p", .queue = "default", .slot_type = "cpu",
                         .spec_json = "{\"name\": \"x\"}", .tags_json = "{}", .idempotency_key = "key-1",
                         .reason = "submitted", .nodes = 2, .slots_per_node = 1, .world_size = 2,
                         .max_attempts = 2, .total_steps = 100, .request_hash = h1};
    cr_assert_eq(store_job_insert(c, &j, a, &ca, NULL, &err), 0, "%s", err.message);
    /* a taken key inserts nothing and says which job holds it, whatever the request */
    j.name = "two";
    json_t *jj = NULL;
    cr_assert_eq(store_job_insert(c, &j, b, &cb, &jj, &err), KILN_EREUSED);
    cr_assert_str_eq(err.field, "idempotency_key");
    cr_assert_null(jj);
    insert_job("three", 0, "{}", "key-2", d, &cd);
    cr_assert(ca);
    cr_assert_not(cb, "a reused key must not create a job");
    cr_assert_str_eq(a, b);
    cr_assert(cd);
    cr_assert_str_neq(a, d);
    cr_assert_eq(count_rows("SELECT count(*) FROM jobs"), 2);
    cr_assert_eq(count_rows("SELECT count(*) FROM job_events"), 2);
    /* the look-up: the job, and whether it came from the same request */
    store_job_key_t k;
    cr_assert_eq(store_job_key_get(c, "p", "key-1", h1, &k, &err), 0, "%s", err.message);
    cr_assert(k.found && k.same);
    cr_assert_str_eq(k.id, a);
    cr_assert_eq(store_job_key_get(c, "p", "key-1", h2, &k, &err), 0, "%s", err.message);
    cr_assert(k.found && !k.same);
    cr_assert_eq(store_job_key_get(c, "p", "key-2", h2, &k, &err), 0, "%s", err.message);
    cr_assert(k.found && k.same, "a job inserted without a hash answers any request");
    cr_assert_eq(store_job_key_get(c, "p", "key-3", h1, &k, &err), 0, "%s", err.message);
    cr_assert_not(k.found);
    /* a key is its project's: another project's job may hold the same one */
    cr_assert_eq(store_project_insert(c, "q", NULL, "test", &err), 0, "%s", err.message);
    j.project = "q";
    cr_assert_eq(store_job_insert(c, &j, b, &cb, NULL, &err), 0, "%s", err.message);
    cr_assert(cb, "project q's job is made under the key project p's job holds");
    cr_assert_str_neq(a, b);
    cr_assert_eq(store_job_key_get(c, "q", "key-1", h1, &k, &err), 0, "%s", err.message);
    cr_assert(k.found && !strcmp(k.id, b));
    cr_assert_eq(store_job_key_get(c, "p", "key-1", h1, &k, &err), 0, "%s", err.message);
    cr_assert(k.found && !strcmp(k.id, a));
}

/* The project is checked in the insert's own statement: a missing one inserts nothing and says
 * so on the field, with or without a (free) idempotency key. */
Test(jobs, a_job_needs_its_project)
{
    const char *keys[] = {NULL, "key-nowhere"};
    for (int i = 0; i < 2; i++) {
        store_job_new_t j = {.name = "x", .project = "nowhere", .queue = "default", .slot_type = "cpu",
                             .spec_json = "{\"hyperparameters\": {\"lr\": 0.5}}", .tags_json = "{}",
                             .idempotency_key = keys[i], .reason = "submitted", .nodes = 1,
                             .slots_per_node = 1, .world_size = 1, .max_attempts = 1, .total_steps = 1};
        char id[STORE_ID_LEN];
        bool created = true;
        kiln_err_clear(&err);
        cr_assert_eq(store_job_insert(c, &j, id, &created, NULL, &err), KILN_ENOTFOUND);
        cr_assert_str_eq(err.field, "project");
        cr_assert(strstr(err.message, "\"nowhere\" does not exist"), "%s", err.message);
    }
    cr_assert_eq(count_rows("SELECT count(*) FROM jobs"), 0);
    cr_assert_eq(count_rows("SELECT count(*) FROM job_events"), 0);
    cr_assert_eq(count_rows("SELECT count(*) FROM job_hparams"), 0);
}

/* The queue is checked in the same statement (its row locked as a foreign key's check would): one
 * that does not exist or does not let the project in inserts nothing and says so on "queue". */
Test(jobs, a_job_needs_a_queue_that_lets_its_project_in)
{
    kiln_err_clear(&err);
    json_t *q = json_pack("{s:s, s:n, s:{}, s:{}, s:f, s:[s], s:b, s:{s:s, s:s}}", "name", "closed", "quota",
                          "borrowing_limit", "lending_limit", "weight", 1.0, "projects", "other", "fair_sharing", 0,
                          "preemption", "within_queue", "lower_priority", "reclaim_within_cohort", "any");
    cr_assert_eq(store_queue_insert(c, q, "test", &err), 0, "%s", err.message);
    json_decref(q);
    const char *queues[] = {"closed", "nowhere"};
    for (int i = 0; i < 2; i++) {
        store_job_new_t j = {.name = "x", .project = "p", .queue = queues[i], .slot_type = "cpu",
                             .spec_json = "{}", .tags_json = "{}", .reason = "submitted", .nodes = 1,
                             .slots_per_node = 1, .world_size = 1, .max_attempts = 1, .total_steps = 1};
        char id[STORE_ID_LEN];
        bool created = true;
        kiln_err_clear(&err);
        cr_assert_eq(store_job_insert(c, &j, id, &created, NULL, &err), KILN_EINVAL, "%s", err.message);
        cr_assert_str_eq(err.field, "queue");
        cr_assert(strstr(err.message, "project \"p\" may not use queue"), "%s", err.message);
    }
    cr_assert_eq(count_rows("SELECT count(*) FROM jobs"), 0);
    cr_assert_eq(count_rows("SELECT count(*) FROM job_events"), 0);
}

Test(jobs, many_transitions_in_one_statement_move_only_the_jobs_still_in_their_state)
{
    char a[STORE_ID_LEN], b[STORE_ID_LEN], d[STORE_ID_LEN];
    insert_job("a", 0, "{}", NULL, a, NULL);
    insert_job("b", 0, "{}", NULL, b, NULL);
    insert_job("d", 0, "{}", NULL, d, NULL);
    /* b moved on meanwhile: its move from QUEUED loses, the others' do not */
    cr_assert_eq(store_job_transition(c, b, "QUEUED", "STOPPED", "gone", 0, STORE_TR_ENDED, NULL, &err), 0);
    store_transition_t t[3] = {
        {.id = a, .from = "QUEUED", .reason = "placed \"a\"", .attempt = 1, .backfill_s = -1},
        {.id = b, .from = "QUEUED", .reason = "placed b", .attempt = 1, .backfill_s = -1},
        {.id = d, .from = "QUEUED", .reason = "placed d, backfilled", .attempt = 1, .backfill_s = 30},
    };
    cr_assert_eq(store_job_transition_many(c, t, 3, "SCHEDULED", STORE_TR_NEW_ATTEMPT, "sched", &err), 0, "%s",
                 err.message);
    cr_assert(t[0].done && !t[1].done && t[2].done);
    cr_assert_eq(count_rows("SELECT count(*) FROM jobs WHERE state = 'SCHEDULED' AND attempt = 1"), 2);
    cr_assert_eq(count_rows("SELECT count(*) FROM jobs WHERE state = 'STOPPED'"), 1);
    /* each its own reason and event (next seq, the actor); the backfilled one its predicted end */
    char q[400];
    snprintf(q, sizeof q, "SELECT count(*) FROM job_events WHERE job_id = '%s' AND seq = 2 AND from_state = 'QUEUED'"
             " AND to_state = 'SCHEDULED' AND reason = 'placed \"a\"' AND attempt = 1 AND actor = 'sched'", a);
    cr_assert_eq(count_rows(q), 1);
    snprintf(q, sizeof q, "SELECT count(*) FROM jobs WHERE id = '%s' AND reason = 'placed \"a\"'"
             " AND backfill_end IS NULL", a);
    cr_assert_eq(count_rows(q), 1);
    snprintf(q, sizeof q, "SELECT count(*) FROM jobs WHERE id = '%s' AND backfill_end > now() + interval '20 s'"
             " AND backfill_end < now() + interval '40 s'", d);
    cr_assert_eq(count_rows(q), 1);
    cr_assert_eq(count_rows("SELECT count(*) FROM job_events WHERE to_state = 'SCHEDULED'"), 2);
    /* none at all: nothing to do */
    cr_assert_eq(store_job_transition_many(c, t, 0, "SCHEDULED", 0, NULL, &err), 0);
}

Test(jobs, transitions_write_events_and_check_from)
{
    char id[STORE_ID_LEN];
    insert_job("t", 0, "{}", NULL, id, NULL);
    cr_assert_eq(store_begin(c, &err), 0);
    store_job_row_t row;
    cr_assert_eq(store_job_row(c, id, true, &row, &err), 0);
    cr_assert_str_eq(row.state, "QUEUED");
    cr_assert_eq(row.world_size, 2);
    cr_assert_eq(row.max_attempts, 2);
    cr_assert_eq(store_job_transition(c, id, "QUEUED", "SCHEDULED", "placed", 1, STORE_TR_NEW_ATTEMPT, NULL, &err), 0,
                 "%s", err.message);
    cr_assert_eq(store_job_transition(c, id, "SCHEDULED", "STARTING", "delivered", 1, 0, NULL, &err), 0);
    cr_assert_eq(store_job_transition(c, id, "STARTING", "RUNNING", "all started", 1, STORE_TR_STARTED, NULL, &err), 0);
    /* The job is not QUEUED any more: a stale transition loses. */
    cr_assert_eq(store_job_transition(c, id, "QUEUED", "STOPPED", "late", 1, 0, NULL, &err), KILN_ESTATE);
    cr_assert_eq(store_commit(c, &err), 0);
    /* The database refuses states outside the machine (a CHECK: refused values, not an outage). */
    cr_assert_eq(store_job_transition(c, id, "RUNNING", "BOGUS", "x", 1, 0, NULL, &err), KILN_EINVAL);
    cr_assert_eq(store_job_transition(c, id, "RUNNING", "COMPLETED", "done", 1, STORE_TR_ENDED, NULL, &err), 0);

    json_t *j = NULL, *ev = NULL;
    cr_assert_eq(store_job_get_json(c, id, &j, &err), 0);
    cr_assert_str_eq(json_string_value(json_object_get(j, "state")), "COMPLETED");
    cr_assert_eq(json_integer_value(json_object_get(j, "attempt")), 1);
    cr_assert(json_is_string(json_object_get(j, "started_at")));
    cr_assert(json_is_string(json_object_get(j, "ended_at")));
    json_decref(j);
    cr_assert_eq(store_job_events_json(c, id, &ev, &err), 0);
    const char *want[] = {"QUEUED", "SCHEDULED", "STARTING", "RUNNING", "COMPLETED"};
    cr_assert_eq(json_array_size(ev), 5);
    for (size_t i = 0; i < 5; i++) {
        json_t *e = json_array_get(ev, i);
        cr_assert_str_eq(json_string_value(json_object_get(e, "to_state")), want[i]);
        cr_assert_eq(json_integer_value(json_object_get(e, "seq")), (json_int_t)i + 1);
        if (i > 0)
            cr_assert_str_eq(json_string_value(json_object_get(e, "from_state")), want[i - 1]);
    }
    json_decref(ev);
}

Test(jobs, list_filters_and_pages)
{
    char ids[7][STORE_ID_LEN];
    for (int i = 0; i < 7; i++) {
        char name[16];
        snprintf(name, sizeof(name), "job%d", i);
        insert_job(name, 0, i % 2 ? "{\"team\": \"nlp\"}" : "{\"team\": \"cv\"}", NULL, ids[i], NULL);
    }
    cr_assert_eq(store_job_transition(c, ids[6], "QUEUED", "STOPPED", "x", 0, STORE_TR_ENDED, NULL, &err), 0);

    /* Pages of 3, newest first, no job twice, none missed. */
    store_search_t q = {.limit = 3};
    int seen = 0;
    char prev_names[8][16];
    json_t *cursor = NULL;
    for (int page = 0; page < 5; page++) {
        json_t *arr = NULL, *next = NULL;
        q.after = cursor;
        cr_assert_eq(store_job_search_json(c, &q, &arr, &next, &err), 0, "%s", err.message);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            const char *nm = json_string_value(json_object_get(json_array_get(arr, i), "name"));
            kiln_strlcpy(prev_names[seen], nm, 16);
            seen++;
        }
        json_decref(arr);
        json_decref(cursor);
        cursor = next;
        if (!next)
            break;
    }
    json_decref(cursor);
    cr_assert_eq(seen, 7);
    cr_assert_str_eq(prev_names[0], "job6");
    cr_assert_str_eq(prev_names[6], "job0");

    /* Filters: state and tags. */
    static const struct {
        const char *filter;
        size_t n;
    } cases[] = {{"state = STOPPED", 1}, {"tags.team = nlp", 3}, {"EXISTS tags.team", 7}, {"EXISTS tags.nope", 0}};
    for (size_t k = 0; k < KILN_ARRAY_LEN(cases); k++) {
        arena_t a;
        arena_init(&a, 0);
        query_node_t *f = NULL;
        cr_assert_eq(query_parse(cases[k].filter, kiln_now_us(), &a, &f, &err), 0, "%s", err.message);
        store_search_t qf = {.filter = f, .limit = 50};
        json_t *arr = NULL, *next = NULL;
        cr_assert_eq(store_job_search_json(c, &qf, &arr, &next, &err), 0, "%s", err.message);
        cr_assert_eq(json_array_size(arr), cases[k].n, "%s", cases[k].filter);
        cr_assert_null(next);
        json_decref(arr);
        arena_deinit(&a);
    }

    /* The pending queue: priority, then oldest first. */
    char hi[STORE_ID_LEN];
    insert_job("urgent", 10, "{}", NULL, hi, NULL);
    store_job_row_t *rows = NULL;
    int n = 0;
    cr_assert_eq(store_job_pending(c, 100, &rows, &n, &err), 0);
    cr_assert_eq(n, 7);
    cr_assert_str_eq(rows[0].id, hi);
    cr_assert_str_eq(rows[1].id, ids[0]);
    free(rows);
}

/* ---- ingest ----------------------------------------------------------------------------------- */

TestSuite(ingest, .init = setup_migrated, .fini = teardown);

Test(ingest, logs_copy_and_read_back)
{
    char id[STORE_ID_LEN];
    insert_job("logs", 0, "{}", NULL, id, NULL);
    enum { N = 300 };
    Kiln__LogLine lines[N], *ptrs[N];
    char text[N][64];
    for (int i = 0; i < N; i++) {
        kiln__log_line__init(&lines[i]);
        lines[i].rank = i % 3;
        lines[i].time_us = 1700000000000000LL + i * 1000;
        lines[i].stream = i % 2 ? "stderr" : "stdout";
        snprintf(text[i], sizeof(text[i]), "line %d\twith tab \\ and\nnewline", i);
        lines[i].line = text[i];
        ptrs[i] = &lines[i];
    }
    /* Invalid UTF-8 must not make the batch fail. */
    char bad[] = "bad \xff\xfe utf8 \xc3\xa9";
    lines[5].line = bad;
    int64_t seq = 0;
    cr_assert_eq(store_job_log_seq(c, id, &seq, &err), 0);
    cr_assert_eq(seq, 0);
    int64_t first = 0;
    cr_assert_eq(store_log_seq_take(c, id, 200, &first, &err), 0, "%s", err.message);
    cr_assert_eq(first, 1);
    cr_assert_eq(store_logs_copy(c, id, 1, ptrs, 200, first, kiln_now_us(), &err), 0, "%s", err.message);
    cr_assert_eq(store_log_seq_take(c, id, 100, &first, &err), 0, "%s", err.message);
    cr_assert_eq(first, 201);
    cr_assert_eq(store_logs_copy(c, id, 1, ptrs + 200, 100, first, kiln_now_us(), &err), 0, "%s", err.message);
    /* a batch number is taken once per stream; numbers at or below the last are re-sent copies */
    bool fresh = false;
    cr_assert_eq(store_ingest_claim(c, id, 77, "logs", 1, &fresh, &err), 0, "%s", err.message);
    cr_assert(fresh);
    cr_assert_eq(store_ingest_claim(c, id, 77, "logs", 1, &fresh, &err), 0);
    cr_assert_not(fresh, "the same batch again is a copy");
    cr_assert_eq(store_ingest_claim(c, id, 77, "metrics", 1, &fresh, &err), 0);
    cr_assert(fresh, "another kind is another stream");
    cr_assert_eq(store_ingest_claim(c, id, 78, "logs", 1, &fresh, &err), 0);
    cr_assert(fresh, "another stream");
    cr_assert_eq(store_ingest_claim(c, id, 77, "logs", 3, &fresh, &err), 0);
    cr_assert(fresh, "a gap (batches the agent dropped) is fine");
    cr_assert_eq(store_ingest_claim(c, id, 77, "logs", 2, &fresh, &err), 0);
    cr_assert_not(fresh, "an older batch after a newer one is a copy");
    cr_assert_eq(store_ingest_claim(c, id, 0, "logs", 5, &fresh, &err), 0);
    cr_assert(fresh, "no stream: nothing recorded");
    cr_assert_eq(store_job_log_seq(c, id, &seq, &err), 0);
    cr_assert_eq(seq, 300);
    cr_assert_eq(store_job_log_seq(c, "00000000-0000-0000-0000-000000000000", &seq, &err), KILN_ENOTFOUND);

    json_t *arr = NULL;
    int64_t last = 0;
    store_log_query_t q = {.rank = -1, .after_seq = 0, .limit = 1000};
    cr_assert_eq(store_logs_query_json(c, id, &q, &arr, &last, &err), 0);
    cr_assert_eq(json_array_size(arr), N);
    cr_assert_eq(last, 300);
    json_t *l0 = json_array_get(arr, 0);
    cr_assert_str_eq(json_string_value(json_object_get(l0, "line")), text[0]);
    cr_assert_str_eq(json_string_value(json_object_get(l0, "stream")), "stdout");
    cr_assert_eq(json_integer_value(json_object_get(l0, "seq")), 1);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(arr, 5), "line")),
                     "bad \xef\xbf\xbd\xef\xbf\xbd utf8 \xc3\xa9");
    json_decref(arr);

    /* By rank, after a seq, since a time, with a limit. */
    store_log_query_t qr = {.rank = 1, .after_seq = 100, .limit = 1000};
    cr_assert_eq(store_logs_query_json(c, id, &qr, &arr, &last, &err), 0);
    cr_assert_eq(json_array_size(arr), 67); /* seqs 101..300 with (seq-1) % 3 == 1 */
    for (size_t i = 0; i < json_array_size(arr); i++)
        cr_assert_eq(json_integer_value(json_object_get(json_array_get(arr, i), "rank")), 1);
    json_decref(arr);
    store_log_query_t qt = {.rank = -1, .since_us = 1700000000000000LL + 250 * 1000, .limit = 10};
    cr_assert_eq(store_logs_query_json(c, id, &qt, &arr, &last, &err), 0);
    cr_assert_eq(json_array_size(arr), 10);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(arr, 0), "seq")), 251);
    cr_assert_eq(last, 260);
    json_decref(arr);
}

Test(ingest, metrics_copy_latest_and_downsampling)
{
    char id[STORE_ID_LEN];
    insert_job("metrics", 0, "{}", NULL, id, NULL);
    enum { N = 1000 };
    Kiln__MetricPoint pts[2 * N], *ptrs[2 * N];
    for (int i = 0; i < N; i++) {
        for (int k = 0; k < 2; k++) {
            Kiln__MetricPoint *p = &pts[2 * i + k];
            kiln__metric_point__init(p);
            p->name = k ? "lr" : "train_loss";
            p->step = i + 1;
            p->value = k ? 0.001 : 5.0 - i * 0.001;
            p->time_us = 1700000000000000LL + i * 1000;
            ptrs[2 * i + k] = p;
        }
    }
    cr_assert_eq(store_begin(c, &err), 0);
    cr_assert_eq(store_metrics_copy(c, id, 1, ptrs, 2 * N, kiln_now_us(), NULL, NULL, &err), 0, "%s", err.message);
    bool found = false;
    /* attempt 0 is the job's attempt (it was never placed). */
    cr_assert_eq(store_job_metrics_update(c, id, 0, "{\"train_loss\": 4.001, \"lr\": 0.001}", N, 10.0,
                                          &found, &err), 0, "%s", err.message);
    cr_assert(found);
    cr_assert_eq(store_commit(c, &err), 0);
    cr_assert_eq(count_rows("SELECT sum(n) FROM metric_chunks"), 2 * N);
    cr_assert_eq(count_rows("SELECT count(*) FROM metric_chunks"), 2, "one chunk per metric per batch");

    json_t *j = NULL;
    cr_assert_eq(store_job_get_json(c, id, &j, &err), 0);
    json_t *prog = json_object_get(j, "progress");
    cr_assert_eq(json_integer_value(json_object_get(prog, "step")), N);
    cr_assert_float_eq(json_real_value(json_object_get(prog, "eta_s")), 0.0, 1e-9); /* past total_steps */
    json_decref(j);
    /* A stale attempt's batch does not touch the job's metrics. */
    cr_assert_eq(store_job_metrics_update(c, id, 7, "{\"train_loss\": 99}", 5000, 1.0, &found, &err), 0);
    cr_assert(found);
    cr_assert_eq(store_job_get_json(c, id, &j, &err), 0);
    cr_assert_float_eq(json_real_value(json_object_get(json_object_get(j, "metrics"), "train_loss")), 4.001, 1e-9);
    json_decref(j);
    cr_assert_eq(store_job_metrics_update(c, "00000000-0000-0000-0000-000000000000", 0, "{}", 1, 0, &found,
                                          &err), 0);
    cr_assert_not(found);

    json_t *series = NULL;
    cr_assert_eq(store_metrics_query_json(c, id, &(store_metrics_query_t){.name = "train_loss", .max_points = 50}, &series, &err), 0, "%s", err.message);
    cr_assert_eq(json_array_size(series), 1);
    json_t *points = json_object_get(json_array_get(series, 0), "points");
    cr_assert_leq(json_array_size(points), 50);
    cr_assert_geq(json_array_size(points), 45);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(points, 0), "step")), 1);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(points, json_array_size(points) - 1), "step")), N);
    json_decref(series);
    cr_assert_eq(store_metrics_query_json(c, id, &(store_metrics_query_t){.name = NULL, .max_points = 2000}, &series, &err), 0);
    cr_assert_eq(json_array_size(series), 2);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(series, 0), "name")), "lr");
    cr_assert_eq(json_array_size(json_object_get(json_array_get(series, 1), "points")), N);
    json_decref(series);
    cr_assert_eq(store_metrics_query_json(c, id, &(store_metrics_query_t){.name = "train_loss", .max_points = 2}, &series, &err), 0);
    cr_assert_eq(json_array_size(json_object_get(json_array_get(series, 0), "points")), 2);
    json_decref(series);
}

/* ---- workers and assignments ------------------------------------------------------------------ */

TestSuite(workers, .init = setup_migrated, .fini = teardown);

/* A draining worker (its agent shutting down) heartbeats on but offers no free slot; the
 * listing says so; registering again clears it. */
Test(workers, draining_worker_gets_no_placements)
{
    store_worker_reg_t w = {.id = "w-d", .hostname = "hd", .address = "10.0.0.9", .slot_type = "cpu",
                            .gpus_json = "[]", .version = "v", .slots = 2, .cpu_cores = 2};
    cr_assert_eq(store_worker_upsert(c, &w, NULL, NULL, &err), 0, "%s", err.message);
    bool began = true, changed = true;
    cr_assert_eq(store_worker_touch(c, "w-d", false, &began, NULL, &err), 0);
    cr_assert_not(began);
    store_worker_cap_t *cap = NULL;
    int n = 0;
    cr_assert_eq(store_workers_capacity(c, &cap, &n, &err), 0);
    cr_assert_eq(n, 1);
    free(cap);
    cr_assert_eq(store_worker_touch(c, "w-d", true, &began, NULL, &err), 0);
    cr_assert(began, "the first draining heartbeat starts the drain");
    cr_assert_eq(store_worker_touch(c, "w-d", true, &began, NULL, &err), 0);
    cr_assert_not(began, "later ones do not");
    cr_assert_eq(store_worker_touch(c, "w-d", false, &began, NULL, &err), 0);
    cr_assert_eq(store_workers_capacity(c, &cap, &n, &err), 0);
    cr_assert_eq(n, 1, "a draining worker still counts for what the cluster can run");
    cr_assert_eq(cap[0].slots, 2);
    cr_assert_eq(cap[0].slots_free, 0, "but offers no free slot, even if a later heartbeat omits the flag");
    free(cap);
    cr_assert_eq(store_worker_set_draining(c, "w-d", &changed, &err), 0);
    cr_assert_not(changed);
    json_t *list = NULL;
    cr_assert_eq(store_workers_list_json(c, &list, &err), 0);
    cr_assert(json_is_true(json_object_get(json_array_get(list, 0), "draining")));
    json_decref(list);
    cr_assert_eq(store_worker_upsert(c, &w, NULL, NULL, &err), 0);
    cr_assert_eq(store_workers_capacity(c, &cap, &n, &err), 0);
    cr_assert_eq(cap[0].slots_free, 2, "registering again ends the drain");
    free(cap);
    cr_assert_eq(store_worker_set_draining(c, "w-d", &changed, &err), 0);
    cr_assert(changed);
}

Test(workers, assignments_inserted_together_and_their_attempts_nudge_each_worker_once_on_commit)
{
    store_worker_reg_t w = {.id = "w-1", .hostname = "h1", .address = "10.0.0.1", .slot_type = "cpu",
                            .gpus_json = "[]", .version = "v", .slots = 4, .cpu_cores = 8};
    cr_assert_eq(store_worker_upsert(c, &w, NULL, NULL, &err), 0, "%s", err.message);
    w.id = "w-2";
    cr_assert_eq(store_worker_upsert(c, &w, NULL, NULL, &err), 0, "%s", err.message);
    char j1[STORE_ID_LEN], j2[STORE_ID_LEN];
    insert_job("a", 0, "{}", NULL, j1, NULL);
    insert_job("b", 0, "{}", NULL, j2, NULL);
    PGconn *l = PQconnectdb(url);
    PQclear(PQexec(l, "LISTEN work_test"));
    /* j1 on both workers (two nodes, ranks 0-1 and 2-3), j2 on w-2 */
    store_assign_t a[3] = {
        {.attempt = 1, .node_rank = 0, .nodes = 2, .world_size = 4, .nranks = 2, .ranks = {0, 1},
         .master_addr = "10.0.0.1"},
        {.attempt = 1, .node_rank = 1, .nodes = 2, .world_size = 4, .nranks = 2, .ranks = {2, 3},
         .master_addr = "10.0.0.1"},
        {.attempt = 3, .node_rank = 0, .nodes = 1, .world_size = 1, .nranks = 1, .ranks = {0},
         .master_addr = "a \"quoted\" host", .master_port = 7},
    };
    kiln_strlcpy(a[0].job_id, j1, sizeof a[0].job_id);
    kiln_strlcpy(a[1].job_id, j1, sizeof a[1].job_id);
    kiln_strlcpy(a[2].job_id, j2, sizeof a[2].job_id);
    kiln_strlcpy(a[0].worker_id, "w-1", sizeof a[0].worker_id);
    kiln_strlcpy(a[1].worker_id, "w-2", sizeof a[1].worker_id);
    kiln_strlcpy(a[2].worker_id, "w-2", sizeof a[2].worker_id);
    cr_assert_eq(store_begin(c, &err), 0);
    cr_assert_eq(store_assign_insert_many(c, a, 3, &err), 0, "%s", err.message);
    const char *jobs[2] = {j1, j2};
    int attempts[2] = {1, 3};
    cr_assert_eq(store_assign_notify_workers(c, "work_test", jobs, attempts, 2, &err), 0, "%s", err.message);
    PQconsumeInput(l);
    cr_assert_null(PQnotifies(l), "nothing is sent before the commit");
    cr_assert_eq(store_commit(c, &err), 0);
    store_assign_t *got = NULL;
    int n = 0;
    cr_assert_eq(store_assign_list(c, j1, 1, &got, &n, &err), 0);
    cr_assert_eq(n, 2);
    cr_assert_str_eq(got[1].worker_id, "w-2");
    cr_assert_eq(got[1].nranks, 2);
    cr_assert_eq(got[1].ranks[0], 2);
    cr_assert_eq(got[1].ranks[1], 3);
    free(got);
    cr_assert_eq(store_assign_list(c, j2, 3, &got, &n, &err), 0);
    cr_assert_eq(n, 1);
    cr_assert_str_eq(got[0].master_addr, "a \"quoted\" host");
    cr_assert_eq(got[0].master_port, 7);
    free(got);
    /* one nudge per worker: w-1 and w-2, in any order, and no more */
    int nudged = 0, w1 = 0, w2 = 0;
    for (int t = 0; t < 500 && nudged < 2; t++) {
        PQconsumeInput(l);
        PGnotify *nt;
        while ((nt = PQnotifies(l))) {
            nudged++;
            w1 += strcmp(nt->extra, "w-1") == 0;
            w2 += strcmp(nt->extra, "w-2") == 0;
            PQfreemem(nt);
        }
        if (nudged < 2)
            usleep(10000);
    }
    cr_assert(nudged == 2 && w1 == 1 && w2 == 1, "nudges: %d (w-1 %d, w-2 %d)", nudged, w1, w2);
    /* inserting alone nudges nobody */
    store_assign_t b = a[2];
    b.attempt = 4;
    cr_assert_eq(store_assign_insert_many(c, &b, 1, &err), 0, "%s", err.message);
    PGresult *r = PQexec(l, "SELECT 1");
    PQclear(r);
    PQconsumeInput(l);
    cr_assert_null(PQnotifies(l));
    PQfinish(l);
}

Test(workers, upsert_touch_expire_capacity)
{
    store_worker_reg_t w = {.id = "w-1", .hostname = "h1", .address = "10.0.0.1", .slot_type = "cpu",
                            .gpus_json = "[]", .version = "v", .slots = 4, .cpu_cores = 8};
    bool was_alive = true;
    cr_assert_eq(store_worker_upsert(c, &w, &was_alive, NULL, &err), 0, "%s", err.message);
    cr_assert_not(was_alive);
    w.slots = 3;
    cr_assert_eq(store_worker_upsert(c, &w, &was_alive, NULL, &err), 0);
    cr_assert(was_alive);
    cr_assert_eq(count_rows("SELECT count(*) FROM workers"), 1);
    cr_assert_eq(store_worker_touch(c, "w-1", false, NULL, NULL, &err), 0);
    cr_assert_eq(store_worker_touch(c, "w-unknown", false, NULL, NULL, &err), KILN_ENOTFOUND);

    store_worker_cap_t *cap = NULL;
    int n = 0;
    cr_assert_eq(store_workers_capacity(c, &cap, &n, &err), 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(cap[0].slots, 3);
    cr_assert_eq(cap[0].slots_free, 3);
    free(cap);

    /* An assignment holds slots until released. */
    char id[STORE_ID_LEN];
    insert_job("a", 0, "{}", NULL, id, NULL);
    store_assign_t a = {.attempt = 1, .node_rank = 0, .nodes = 1, .world_size = 2, .nranks = 2,
                        .ranks = {0, 1}, .master_addr = "10.0.0.1", .master_port = 29501};
    kiln_strlcpy(a.job_id, id, sizeof(a.job_id));
    kiln_strlcpy(a.worker_id, "w-1", sizeof(a.worker_id));
    cr_assert_eq(store_assign_insert(c, &a, &err), 0, "%s", err.message);
    cr_assert_eq(store_workers_capacity(c, &cap, &n, &err), 0);
    cr_assert_eq(cap[0].slots_free, 1);
    free(cap);
    store_assign_t *und = NULL;
    cr_assert_eq(store_assign_undelivered(c, "w-1", &und, &n, &err), 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(und[0].nranks, 2);
    cr_assert_eq(und[0].ranks[1], 1);
    char *spec = NULL;
    cr_assert_eq(store_assign_deliver_many(c, &und[0].id, 1, &spec, &err), 0);
    cr_assert_str_eq(spec, "{\"name\": \"x\"}");
    free(spec);
    cr_assert_eq(store_assign_deliver_many(c, &und[0].id, 1, &spec, &err), 0);
    cr_assert_null(spec, "an assignment is delivered once");
    free(und);

    /* Two rank exits release it. */
    Kiln__RankExit e = KILN__RANK_EXIT__INIT;
    e.worker_id = "w-1";
    e.job_id = id;
    e.attempt = 1;
    e.rank = 0;
    store_rank_exit_t rec;
    cr_assert_eq(store_rank_exit_record(c, &e, &rec, &err), 0, "%s", err.message);
    cr_assert(rec.inserted);
    cr_assert_not(rec.released);
    cr_assert_eq(rec.n_exited, 1, "the counts hold the exit just recorded");
    cr_assert_eq(rec.n_ok, 1);
    cr_assert_eq(store_rank_exit_record(c, &e, &rec, &err), 0);
    cr_assert_not(rec.inserted, "a repeated exit is recorded once");
    cr_assert_not(rec.released);
    cr_assert_eq(rec.n_exited, 1, "a repeated exit is counted once");
    e.rank = 1;
    e.exit_code = 3;
    cr_assert_eq(store_rank_exit_record(c, &e, &rec, &err), 0);
    cr_assert(rec.inserted);
    cr_assert(rec.released, "the last rank's exit releases the assignment");
    cr_assert_eq(rec.n_exited, 2);
    cr_assert_eq(rec.n_ok, 1);
    cr_assert_eq(store_rank_exit_record(c, &e, &rec, &err), 0);
    cr_assert_not(rec.inserted);
    cr_assert_not(rec.released, "a released assignment is released once");
    cr_assert_eq(rec.n_exited, 2);
    cr_assert_eq(store_workers_capacity(c, &cap, &n, &err), 0);
    cr_assert_eq(cap[0].slots_free, 3);
    free(cap);

    /* Expiry: with a 0 ms timeout every alive worker is silent. */
    int nexp = 0;
    cr_assert_eq(store_workers_expire(c, 0, 0, &nexp, &err), 0);
    cr_assert_eq(nexp, 1);
    cr_assert_eq(store_worker_touch(c, "w-1", false, NULL, NULL, &err), KILN_ESTATE);
    cr_assert_eq(store_workers_capacity(c, &cap, &n, &err), 0);
    cr_assert_eq(n, 0);
    free(cap);
    json_t *list = NULL;
    cr_assert_eq(store_workers_list_json(c, &list, &err), 0);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(list, 0), "state")), "DEAD");
    json_decref(list);
    /* Re-registering with the old id brings it back. */
    cr_assert_eq(store_worker_upsert(c, &w, &was_alive, NULL, &err), 0);
    cr_assert_not(was_alive);
    cr_assert_eq(store_worker_touch(c, "w-1", false, NULL, NULL, &err), 0);
}

/* Workers w-a and w-b (2 cpu slots each) and a job placed on both: node 0 on w-a, node 1 on w-b,
 * attempt 1, rendezvous port `port` (0: not yet reported). */
static void gang_of_two(char *id, int port)
{
    store_worker_reg_t w1 = {.id = "w-a", .hostname = "ha", .slot_type = "cpu", .slots = 2};
    store_worker_reg_t w2 = {.id = "w-b", .hostname = "hb", .slot_type = "cpu", .slots = 2};
    cr_assert_eq(store_worker_upsert(c, &w1, NULL, NULL, &err), 0);
    cr_assert_eq(store_worker_upsert(c, &w2, NULL, NULL, &err), 0);
    insert_job("s", 0, "{}", NULL, id, NULL);
    for (int k = 0; k < 2; k++) {
        store_assign_t a = {.attempt = 1, .node_rank = k, .nodes = 2, .world_size = 2, .nranks = 1,
                            .ranks = {k}, .master_addr = "ha", .master_port = port};
        kiln_strlcpy(a.job_id, id, sizeof(a.job_id));
        kiln_strlcpy(a.worker_id, k ? "w-b" : "w-a", sizeof(a.worker_id));
        cr_assert_eq(store_assign_insert(c, &a, &err), 0);
    }
}

Test(workers, stop_orders_stale_and_lost)
{
    char id[STORE_ID_LEN];
    gang_of_two(id, 29500);
    store_assign_t *und = NULL;
    int n = 0;
    char *spec = NULL;
    cr_assert_eq(store_assign_undelivered(c, "w-a", &und, &n, &err), 0);
    cr_assert_eq(store_assign_deliver_many(c, &und[0].id, 1, &spec, &err), 0);
    free(spec);
    free(und);

    /* Stop: w-b's undelivered part is released at once; w-a gets one stop order. */
    cr_assert_eq(store_assign_stop(c, id, 1, "stop requested", NULL, &err), 0);
    int unrel = 0;
    cr_assert_eq(store_assign_unreleased(c, id, 1, &unrel, &err), 0);
    cr_assert_eq(unrel, 1);
    store_stop_order_t *stops = NULL;
    cr_assert_eq(store_assign_take_stops(c, "w-a", 60000, &stops, &n, &err), 0);
    cr_assert_eq(n, 1);
    cr_assert_str_eq(stops[0].reason, "stop requested");
    free(stops);
    cr_assert_eq(store_assign_take_stops(c, "w-a", 60000, &stops, &n, &err), 0);
    cr_assert_eq(n, 0, "a stop order is sent once, until the resend delay passes");
    free(stops);
    usleep(20000);
    /* while another transaction changes the assignment (a rank's exit being recorded), a
     * heartbeat's housekeeping skips it rather than wait: it cannot join a deadlock */
    store_conn_t *c2 = NULL;
    cr_assert_eq(store_conn_get(st, &c2, &err), 0);
    cr_assert_eq(store_begin(c2, &err), 0);
    const char *lp[1] = {id};
    cr_assert_eq(store_q(c2, "hold", "UPDATE assignments SET ranks = ranks WHERE job_id = $1::uuid", 1, lp, NULL, &err),
                 0, "%s", err.message);
    cr_assert_eq(store_assign_take_stops(c, "w-a", 10, &stops, &n, &err), 0, "%s", err.message);
    cr_assert_eq(n, 0, "skipped while locked");
    free(stops);
    store_rollback(c2);
    store_conn_put(st, c2);
    cr_assert_eq(store_assign_take_stops(c, "w-a", 10, &stops, &n, &err), 0);
    cr_assert_eq(n, 1, "resent when the assignment is still held after the delay");
    free(stops);

    /* Ranks a worker runs without a live assignment are stale. */
    const char *ids[2] = {id, "11111111-2222-3333-4444-555555555555"};
    int atts[2] = {1, 1};
    store_stop_order_t *stale = NULL;
    cr_assert_eq(store_assign_stale(c, "w-a", ids, atts, 2, &stale, &n, &err), 0, "%s", err.message);
    cr_assert_eq(n, 1);
    cr_assert_str_eq(stale[0].job_id, ids[1]);
    free(stale);
    /* The stopped assignment is reaped once its ranks are no longer reported. */
    store_stop_order_t *reaped = NULL;
    cr_assert_eq(store_assign_reap(c, "w-a", ids, atts, 1, 0, &reaped, &n, &err), 0);
    cr_assert_eq(n, 0, "still reported as running");
    free(reaped);
    cr_assert_eq(store_assign_reap(c, "w-a", ids, atts, 0, 0, &reaped, &n, &err), 0);
    cr_assert_eq(n, 1);
    free(reaped);

    /* Lost: unreleased assignments on dead workers. */
    char id2[STORE_ID_LEN];
    insert_job("l", 0, "{}", NULL, id2, NULL);
    store_assign_t a = {.attempt = 1, .node_rank = 0, .nodes = 1, .world_size = 1, .nranks = 1,
                        .ranks = {0}, .master_addr = "hb", .master_port = 29500};
    kiln_strlcpy(a.job_id, id2, sizeof(a.job_id));
    kiln_strlcpy(a.worker_id, "w-b", sizeof(a.worker_id));
    cr_assert_eq(store_assign_insert(c, &a, &err), 0);
    store_lost_t *lost = NULL;
    cr_assert_eq(store_assign_lost(c, &lost, &n, &err), 0);
    cr_assert_eq(n, 0);
    free(lost);
    int nexp = 0;
    cr_assert_eq(store_workers_expire(c, 0, 0, &nexp, &err), 0);
    cr_assert_eq(store_assign_lost(c, &lost, &n, &err), 0);
    cr_assert_eq(n, 1);
    cr_assert_str_eq(lost[0].job_id, id2);
    cr_assert_str_eq(lost[0].worker_id, "w-b");
    cr_assert_str_eq(lost[0].hostname, "hb");
    free(lost);
}

Test(workers, a_gangs_start_report_sets_the_port_for_every_node_in_one_statement)
{
    char id[STORE_ID_LEN];
    gang_of_two(id, 0);
    store_assign_t *und = NULL;
    int n = 0;
    cr_assert_eq(store_assign_undelivered(c, "w-b", &und, &n, &err), 0);
    cr_assert_eq(n, 0, "node 1's part waits for node 0's port");
    free(und);
    /* Node 1 reporting a port sets none: only node 0 picks the rendezvous. */
    bool found = false, set = true;
    cr_assert_eq(store_assign_set_started(c, id, 1, "w-b", 40000, &found, &set, &err), 0, "%s", err.message);
    cr_assert(found);
    cr_assert_not(set);
    cr_assert_eq(store_assign_undelivered(c, "w-b", &und, &n, &err), 0);
    cr_assert_eq(n, 0);
    free(und);
    /* Node 0's report marks it started and gives both parts the port. */
    cr_assert_eq(store_assign_set_started(c, id, 1, "w-a", 29501, &found, &set, &err), 0, "%s", err.message);
    cr_assert(found);
    cr_assert(set);
    store_assign_t *as = NULL;
    cr_assert_eq(store_assign_list(c, id, 1, &as, &n, &err), 0);
    cr_assert_eq(n, 2);
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(as[k].master_port, 29501, "node %d has the port", k);
        cr_assert(as[k].started, "node %d's report marked it started", k);
    }
    free(as);
    /* A resent report (its reply lost) finds its assignment and sets nothing again. */
    cr_assert_eq(store_assign_set_started(c, id, 1, "w-a", 29502, &found, &set, &err), 0);
    cr_assert(found);
    cr_assert_not(set);
    cr_assert_eq(store_assign_list(c, id, 1, &as, &n, &err), 0);
    cr_assert_eq(as[1].master_port, 29501, "the port is set once");
    free(as);
    /* Node 1's part goes out now; both delivered in one statement, each once, each with its spec. */
    cr_assert_eq(store_assign_undelivered(c, "w-b", &und, &n, &err), 0);
    cr_assert_eq(n, 1);
    store_assign_t *und0 = NULL;
    int n0 = 0;
    cr_assert_eq(store_assign_undelivered(c, "w-a", &und0, &n0, &err), 0);
    cr_assert_eq(n0, 1);
    int64_t ids[2] = {und[0].id, und0[0].id};
    char *spec[2];
    cr_assert_eq(store_assign_deliver_many(c, ids, 2, spec, &err), 0, "%s", err.message);
    cr_assert_str_eq(spec[0], "{\"name\": \"x\"}");
    cr_assert_str_eq(spec[1], "{\"name\": \"x\"}");
    free(spec[0]);
    free(spec[1]);
    cr_assert_eq(store_assign_deliver_many(c, ids, 2, spec, &err), 0);
    cr_assert_null(spec[0], "delivered already");
    cr_assert_null(spec[1]);
    free(und);
    free(und0);
    /* A released part is no longer "found" by its worker's report. */
    cr_assert_eq(store_assign_release(c, id, 1, "w-b", &err), 0);
    cr_assert_eq(store_assign_set_started(c, id, 1, "w-b", 0, &found, &set, &err), 0);
    cr_assert_not(found);
}

Test(workers, scheduler_lock_is_exclusive)
{
    store_conn_t *c2 = NULL;
    cr_assert_eq(store_conn_get(st, &c2, &err), 0);
    store_pass_read_t a = {.keep = 10, .half_life_s = 60}, b = a;
    cr_assert_eq(store_sched_pass_read(c, &a, &err), 0, "%s", err.message);
    cr_assert(a.locked);
    cr_assert_eq(store_sched_pass_read(c2, &b, &err), 0, "%s", err.message);
    cr_assert_not(b.locked, "a second scheduler must not run at the same time");
    cr_assert_null(b.queues, "nothing is kept of a read without the lock");
    store_sched_unlock(c);
    cr_assert_eq(store_sched_pass_read(c2, &b, &err), 0);
    cr_assert(b.locked);
    store_sched_unlock(c2);
    /* A read that fails after the lock was taken releases it: here the snapshot the waiting jobs'
     * changes are read since is refused by PostgreSQL, the statement after the lock's. */
    store_pass_read_t bad = {.since = "123:zzz", .keep = 10, .half_life_s = 60};
    cr_assert_neq(store_sched_pass_read(c, &bad, &err), 0);
    cr_assert_not(bad.locked);
    cr_assert_eq(store_sched_pass_read(c2, &b, &err), 0, "%s", err.message);
    cr_assert(b.locked, "the failed read left the lock held");
    store_sched_unlock(c2);
    store_pass_read_clear(&a);
    store_pass_read_clear(&b);
    store_conn_put(st, c2);
    /* the connection that failed mid-pipeline serves the next statement */
    cr_assert_eq(store_ping(c, &err), 0, "%s", err.message);
}

/* A transaction's BEGIN goes with its first statement, and a deferred statement with the next one
 * that must answer: what each does and how each fails is as if sent alone. */
Test(workers, a_transactions_deferred_statements_count_and_fail_as_if_sent_alone)
{
    static const char ins[] = "INSERT INTO projects (name) VALUES ($1)";
    /* deferred, then committed: written */
    cr_assert_eq(store_begin(c, &err), 0);
    cr_assert_eq(store_q_later(c, "add a project", ins, 1, (const char *[]){"later-a"}, &err), 0);
    cr_assert_eq(store_q_later(c, "add a project", ins, 1, (const char *[]){"later-b"}, &err), 0);
    cr_assert_eq(store_commit(c, &err), 0, "%s", err.message);
    cr_assert_eq(count_rows("SELECT count(*) FROM projects WHERE name LIKE 'later-%'"), 2);
    /* deferred, then rolled back: never sent */
    cr_assert_eq(store_begin(c, &err), 0);
    cr_assert_eq(store_q_later(c, "add a project", ins, 1, (const char *[]){"later-c"}, &err), 0);
    store_rollback(c);
    cr_assert_eq(count_rows("SELECT count(*) FROM projects WHERE name = 'later-c'"), 0);
    /* a deferred failure fails the next statement that must answer, naming itself; the rollback
     * leaves the connection as good as new */
    cr_assert_eq(store_begin(c, &err), 0);
    cr_assert_eq(store_q_later(c, "add a project", ins, 1, (const char *[]){"later-d"}, &err), 0);
    cr_assert_eq(store_q_later(c, "add a project", ins, 1, (const char *[]){"later-a"}, &err), 0);
    cr_assert_eq(store_ping(c, &err), KILN_EEXIST);
    cr_assert(strstr(err.message, "add a project"), "%s", err.message);
    store_rollback(c);
    cr_assert_eq(count_rows("SELECT count(*) FROM projects WHERE name = 'later-d'"), 0);
    cr_assert_eq(store_ping(c, &err), 0, "%s", err.message);
    /* ...and at the COMMIT, which then fails and leaves no transaction open behind it */
    cr_assert_eq(store_begin(c, &err), 0);
    cr_assert_eq(store_q_later(c, "add a project", ins, 1, (const char *[]){"later-f"}, &err), 0);
    cr_assert_eq(store_q_later(c, "add a project", ins, 1, (const char *[]){"later-a"}, &err), 0);
    cr_assert_eq(store_commit(c, &err), KILN_EEXIST);
    cr_assert_eq(count_rows("SELECT count(*) FROM projects WHERE name = 'later-f'"), 0);
    cr_assert_eq(PQtransactionStatus(c->pg), PQTRANS_IDLE, "outside any transaction block, not %d",
                 (int)PQtransactionStatus(c->pg));
    /* outside a transaction it runs at once */
    cr_assert_eq(store_q_later(c, "add a project", ins, 1, (const char *[]){"later-e"}, &err), 0);
    cr_assert_eq(count_rows("SELECT count(*) FROM projects WHERE name = 'later-e'"), 1);
    /* a transaction that sent nothing commits and rolls back without a word to the server */
    cr_assert_eq(store_begin(c, &err), 0);
    cr_assert_eq(store_commit(c, &err), 0);
    cr_assert_eq(store_begin(c, &err), 0);
    store_rollback(c);
    /* and one whose first statement fails is rolled back whole */
    cr_assert_eq(store_begin(c, &err), 0);
    cr_assert_neq(store_q(c, "fail", "SELECT 1 / 0", 0, NULL, NULL, &err), 0);
    store_rollback(c);
    cr_assert_eq(store_ping(c, &err), 0, "%s", err.message);
}

/* A pass's first reads, sent together, give what each read alone gives. */
Test(workers, a_pass_reads_in_one_round_trip_what_each_read_gives)
{
    store_worker_reg_t w = {.id = "w-p", .hostname = "hp", .address = "10.0.0.2", .slot_type = "cpu",
                            .gpus_json = "[]", .version = "v", .slots = 4, .cpu_cores = 4};
    cr_assert_eq(store_worker_upsert(c, &w, NULL, NULL, &err), 0, "%s", err.message);
    char id[STORE_ID_LEN];
    insert_job("p", 0, "{}", NULL, id, NULL);
    store_pass_read_t pr = {.keep = 1000, .usage = true, .half_life_s = 60};
    cr_assert_eq(store_sched_pass_read(c, &pr, &err), 0, "%s", err.message);
    cr_assert(pr.locked);
    store_worker_cap_t *cap = NULL;
    int ncap = 0;
    cr_assert_eq(store_workers_capacity(c, &cap, &ncap, &err), 0);
    cr_assert_eq(pr.ncap, ncap);
    for (int i = 0; i < ncap; i++) {
        cr_assert_str_eq(pr.cap[i].id, cap[i].id);
        cr_assert_eq(pr.cap[i].slots_free, cap[i].slots_free);
    }
    store_pending_t *pend = NULL;
    int npend = 0;
    char *snap = NULL;
    cr_assert_eq(store_job_pending_all(c, 1000, &pend, &npend, &snap, &err), 0);
    cr_assert_eq(pr.npending, npend);
    cr_assert_eq(npend, 1);
    cr_assert_eq(ncap, 1);
    for (int i = 0; i < npend; i++)
        cr_assert_str_eq(pr.pending[i].row.id, pend[i].row.id);
    json_t *q = NULL, *u = NULL;
    cr_assert_eq(store_queue_defs_json(c, NULL, &q, &err), 0);
    cr_assert(json_equal(pr.queues, q));
    cr_assert_eq(store_queue_project_usage(c, 60, &u, &err), 0);
    cr_assert(json_equal(pr.project_usage, u));
    store_holding_t *h = NULL;
    int nh = 0;
    cr_assert_eq(store_job_holding(c, &h, &nh, &err), 0);
    cr_assert_eq(pr.nhold, nh);
    /* and the changes since that snapshot: none */
    store_pass_read_t next = {.since = pr.snap, .keep = 1000, .half_life_s = 60};
    cr_assert_eq(store_sched_pass_read(c, &next, &err), 0, "%s", err.message);
    cr_assert(next.locked, "the session already holds it");
    cr_assert_eq(next.npending, 0);
    cr_assert_not(next.forget);
    cr_assert_null(next.project_usage, "read only when asked for");
    cr_assert_eq(next.ncap, 1);
    store_sched_unlock(c);
    store_sched_unlock(c);
    free(cap);
    free(pend);
    free(snap);
    free(h);
    json_decref(q);
    json_decref(u);
    store_pass_read_clear(&pr);
    store_pass_read_clear(&next);
}

Test(migrate, a_dropped_connection_is_replaced)
{
    PGresult *r = NULL;
    /* Kill the pool's backends from outside and see the pool recover. */
    long pid = 0;
    int rc = store_ping(c, &err);
    cr_assert_eq(rc, 0);
    PGconn *admin = PQconnectdb(url);
    r = PQexec(admin, "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                      " AND pid <> pg_backend_pid() AND backend_type = 'client backend'");
    cr_assert_eq(PQresultStatus(r), PGRES_TUPLES_OK);
    cr_assert_geq(PQntuples(r), 1);
    for (int i = 0; i < PQntuples(r); i++) {
        pid = atol(PQgetvalue(r, i, 0));
        char where[64];
        snprintf(where, sizeof where, "pid = %ld", pid);
        cr_assert(th_pg_end_backends(where, true, 30000), "backend %ld did not exit", pid);
    }
    PQclear(r);
    PQfinish(admin);
    cr_assert_eq(store_ping(c, &err), KILN_EDB, "the killed connection fails once");
    cr_assert_neq(err.message[0], '\0');
    store_conn_put(st, c);
    c = NULL;
    /* Both pooled connections were killed. The one that failed is reconnected when taken again,
     * and the one killed while idle in the pool is noticed when taken: neither fails a query. */
    store_conn_t *c2 = NULL, *c3 = NULL;
    cr_assert_eq(store_conn_get(st, &c2, &err), 0, "%s", err.message);
    cr_assert_eq(store_conn_get(st, &c3, &err), 0, "%s", err.message);
    cr_assert_eq(store_ping(c2, &err), 0, "%s", err.message);
    cr_assert_eq(store_ping(c3, &err), 0, "a connection killed while idle failed its first query: %s",
                 err.message);
    store_conn_put(st, c2);
    store_conn_put(st, c3);
    cr_assert_eq(store_conn_get(st, &c, &err), 0);
    cr_assert_eq(store_ping(c, &err), 0, "%s", err.message);
}

Test(jobs, queue_reasons_change_only_queued_jobs)
{
    char a[STORE_ID_LEN], b[STORE_ID_LEN];
    insert_job("a", 0, "{}", NULL, a, NULL);
    insert_job("b", 0, "{}", NULL, b, NULL);
    cr_assert_eq(store_job_transition(c, b, "QUEUED", "STOPPED", "gone", 0, STORE_TR_ENDED, NULL, &err), 0);
    const char *ids[2] = {a, b};
    const char *why[2] = {"waiting \"for\" a \\ slot, {really}", "must not land"};
    cr_assert_eq(store_job_queue_reasons(c, ids, why, 2, &err), 0, "%s", err.message);
    json_t *j = NULL;
    cr_assert_eq(store_job_get_json(c, a, &j, &err), 0);
    cr_assert_str_eq(json_string_value(json_object_get(j, "reason")), why[0]);
    json_decref(j);
    cr_assert_eq(store_job_get_json(c, b, &j, &err), 0);
    cr_assert_str_eq(json_string_value(json_object_get(j, "reason")), "gone");
    json_decref(j);
    cr_assert_eq(count_rows("SELECT count(*) FROM job_events"), 3, "no event for a reason change");
}

/* ---- join tokens: one UPDATE per use, whatever the number of replicas ------------------------- */

typedef struct use_arg {
    const char *id;
    int used, rc;
} use_arg_t;

/* One kilnd replica's connection taking uses until the token has none left. */
static void *use_thread(void *p)
{
    use_arg_t *a = p;
    store_t *s2 = NULL;
    store_conn_t *c2 = NULL;
    kiln_err_t e;
    a->rc = store_open(url, 1, &s2, &e);
    if (a->rc == 0)
        a->rc = store_conn_get(s2, &c2, &e);
    for (bool consumed = true; a->rc == 0 && consumed;) {
        a->rc = store_join_token_consume(c2, a->id, &consumed, &e);
        a->used += consumed;
    }
    store_conn_put(s2, c2);
    store_close(s2);
    return NULL;
}

TestSuite(trust, .init = setup_migrated, .fini = teardown);

Test(trust, join_token_uses_are_taken_once_by_concurrent_replicas)
{
    uint8_t hash[STORE_HASH_LEN] = {1, 2, 3};
    json_t *t = NULL;
    cr_assert_eq(store_join_token_insert(c, "jt_race", hash, "race", 40, kiln_now_us() + 3600000000LL, "test", &t, &err),
                 0, "%s", err.message);
    cr_assert_str_eq(json_string_value(json_object_get(t, "state")), "active");
    json_decref(t);
    enum { N = 6 };
    pthread_t th[N];
    use_arg_t a[N];
    memset(a, 0, sizeof(a));
    for (int i = 0; i < N; i++) {
        a[i].id = "jt_race";
        pthread_create(&th[i], NULL, use_thread, &a[i]);
    }
    int total = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(a[i].rc, 0, "replica %d failed", i);
        total += a[i].used;
    }
    cr_assert_eq(total, 40, "exactly the token's uses were handed out (%d)", total);
    cr_assert_eq(count_rows("SELECT registrations FROM join_tokens WHERE id = 'jt_race'"), 40);
    store_join_t j;
    cr_assert_eq(store_join_token_find(c, hash, &j, &err), 0, "%s", err.message);
    cr_assert_str_eq(j.state, "used_up");
    /* an expired token gives no use, even with uses left */
    uint8_t hash2[STORE_HASH_LEN] = {4, 5, 6};
    cr_assert_eq(store_join_token_insert(c, "jt_old", hash2, "", 5, kiln_now_us() - 1000000, "test", &t, &err), 0);
    cr_assert_str_eq(json_string_value(json_object_get(t, "state")), "expired");
    json_decref(t);
    bool consumed = true;
    cr_assert_eq(store_join_token_consume(c, "jt_old", &consumed, &err), 0);
    cr_assert(!consumed);
}

/* A job of model m at resources r with the given steps (spec JSON holds both), into id. */
static void insert_shaped(const char *model, const char *resources, int64_t steps, char *id)
{
    char spec[256];
    snprintf(spec, sizeof spec, "{\"model\": %s, \"resources\": %s}", model, resources);
    store_job_new_t j = {.name = "shaped", .project = "p", .queue = "default", .slot_type = "cpu",
                         .spec_json = spec, .reason = "submitted", .nodes = 1, .slots_per_node = 1,
                         .world_size = 1, .max_attempts = 1, .total_steps = steps};
    bool cr = false;
    cr_assert_eq(store_job_insert(c, &j, id, &cr, NULL, &err), 0, "%s", err.message);
}

/* Run-time predictions: a job's own step time, else its model's at its resources, else (an
 * estimate, said so by its source) its model's at other resources; nothing for an unseen model. */
Test(jobs, predictions_fall_back_to_the_model_at_other_resources)
{
    char ran[STORE_ID_LEN], same[STORE_ID_LEN], other[STORE_ID_LEN], unseen[STORE_ID_LEN];
    insert_shaped("{\"layers\": 2}", "{\"slots_per_node\": 1}", 100, ran);
    insert_shaped("{\"layers\": 2}", "{\"slots_per_node\": 1}", 100, same);
    insert_shaped("{\"layers\": 2}", "{\"slots_per_node\": 4}", 300, other);
    insert_shaped("{\"layers\": 9}", "{\"slots_per_node\": 1}", 100, unseen);
    bool found = false;
    /* 4 steps a second: 0.25 s a step, 10 steps done */
    cr_assert_eq(store_job_metrics_update(c, ran, 0, "{}", 10, 4.0, &found, &err), 0, "%s", err.message);
    cr_assert(found);
    const char *ids[] = {ran, same, other, unseen};
    double rt[4];
    store_predict_t src[4];
    cr_assert_eq(store_job_predictions(c, ids, 4, rt, src, &err), 0, "%s", err.message);
    cr_assert_float_eq(rt[0], 0.25 * 90, 1e-6);
    cr_assert_eq(src[0], STORE_PREDICT_OWN);
    cr_assert_float_eq(rt[1], 0.25 * 100, 1e-6);
    cr_assert_eq(src[1], STORE_PREDICT_SHAPE);
    cr_assert_float_eq(rt[2], 0.25 * 300, 1e-6, "the model's step time at other resources, x its steps");
    cr_assert_eq(src[2], STORE_PREDICT_MODEL);
    cr_assert_lt(rt[3], 0);
    cr_assert_eq(src[3], STORE_PREDICT_NONE);
    /* the same with the paths of others, read together in one round trip */
    json_t *paths[2] = {NULL, NULL};
    double rt2[4];
    store_predict_t src2[4];
    bool predicted = false;
    const char *pids[] = {unseen, "00000000-0000-0000-0000-00000000abcd"};
    cr_assert_eq(store_job_facts(c, pids, 2, paths, ids, 4, rt2, src2, &predicted, &err), 0, "%s", err.message);
    cr_assert(predicted);
    for (int i = 0; i < 4; i++) {
        cr_assert_float_eq(rt2[i], rt[i], 1e-9);
        cr_assert_eq(src2[i], src[i]);
    }
    for (int i = 0; i < 2; i++) {
        cr_assert(json_is_array(paths[i]) && json_array_size(paths[i]) == 0, "no paths: an empty list");
        json_decref(paths[i]);
    }
    /* a prediction that cannot be read is a prediction less, not a failed read of the paths */
    const char *bad[] = {"not-a-uuid"};
    cr_assert_eq(store_job_facts(c, pids, 1, paths, bad, 1, rt2, src2, &predicted, &err), 0, "%s", err.message);
    cr_assert_not(predicted);
    cr_assert_lt(rt2[0], 0);
    json_decref(paths[0]);
}

/* The scheduler locks a pass's admitted jobs in one statement: each row where its id is, the
 * missing and the malformed ones not found. */
Test(jobs, rows_lock_reads_each_job_in_place)
{
    char a[STORE_ID_LEN], b[STORE_ID_LEN];
    insert_job("a", 5, NULL, NULL, a, NULL);
    insert_job("b", 7, NULL, NULL, b, NULL);
    const char *ids[] = {b, "not-a-uuid", "00000000-0000-0000-0000-00000000abcd", a};
    store_job_row_t rows[4];
    double age[4];
    bool found[4];
    cr_assert_eq(store_begin(c, &err), 0);
    cr_assert_eq(store_job_rows_lock(c, ids, 4, rows, age, found, &err), 0, "%s", err.message);
    cr_assert_eq(store_commit(c, &err), 0);
    cr_assert(found[0] && !found[1] && !found[2] && found[3]);
    cr_assert_str_eq(rows[0].id, b);
    cr_assert_eq(rows[0].priority, 7);
    cr_assert_str_eq(rows[3].id, a);
    cr_assert_str_eq(rows[3].state, "QUEUED");
    cr_assert_geq(age[3], 0);
}

/* ---- fair sharing between projects ---------------------------------------------------------- */

/* Inserts a job of project in queue holding nodes x 1 slots, in state, started h0 half-lives
 * ago and ended h1 ago (h1 < 0: not ended), half-lives of H seconds. */
#define H 3600.0
static void usage_job(const char *project, const char *queue, const char *state, int nodes, double h0, double h1)
{
    char sql[1024];
    snprintf(sql, sizeof sql,
             "INSERT INTO jobs (id, name, project, queue, spec, state, nodes, slots_per_node, slot_type, world_size,"
             " max_attempts, total_steps, started_at, ended_at) VALUES (gen_random_uuid(), 'u', '%s', '%s', '{}', '%s',"
             " %d, 1, 'cpu', %d, 1, 10, now() - make_interval(secs => %f), %s)",
             project, queue, state, nodes, nodes, h0 * H,
             h1 < 0 ? "NULL" : "now() - make_interval(secs => %f)");
    char full[1200];
    snprintf(full, sizeof full, sql, h1 * H);
    PGconn *pg = PQconnectdb(url);
    PGresult *r = PQexec(pg, full);
    cr_assert_eq(PQresultStatus(r), PGRES_COMMAND_OK, "%s: %s", full, PQerrorMessage(pg));
    PQclear(r);
    PQfinish(pg);
}

static double usage_of(const json_t *u, const char *queue, const char *project)
{
    const json_t *v = json_object_get(json_object_get(u, queue), project);
    return v ? json_number_value(v) : -1;
}

TestSuite(fair, .init = setup_migrated, .fini = teardown);

Test(fair, a_projects_recent_usage_decays_with_the_half_life)
{
    cr_assert_eq(store_project_insert(c, "a", NULL, "test", &err), 0, "%s", err.message);
    cr_assert_eq(store_project_insert(c, "b", NULL, "test", &err), 0, "%s", err.message);
    json_t *q = json_pack("{s:s, s:n, s:{s:i, s:i}, s:f, s:[s], s:b, s:{s:s, s:s}}", "name", "plain", "cohort", "quota",
                          "cpu", 8, "gpu", 0, "weight", 1.0, "projects", "*", "fair_sharing", 0, "preemption",
                          "within_queue", "lower_priority", "reclaim_within_cohort", "any");
    cr_assert_eq(store_queue_insert(c, q, "test", &err), 0, "%s", err.message);
    json_decref(q);
    /* the same run (2 slots for one half-life) ended one half-life ago for a, two for b: a's
     * counts twice b's; each is the slots integrated with the decay, over the decay's time
     * constant: 2 x (2^-1 - 2^-2) = 0.5 and 2 x (2^-2 - 2^-3) = 0.25 */
    usage_job("a", "default", "COMPLETED", 2, 2, 1);
    usage_job("b", "default", "COMPLETED", 2, 3, 2);
    /* a run that ended more than ten time constants (14.4 half-lives) ago counts nothing, even
     * a big one (100 x (2^-15 - 2^-16) = 0.0015 if it counted) */
    usage_job("a", "default", "FAILED", 100, 16, 15);
    /* a job holding slots counts them now, plus its run so far: 1 + (1 - 2^-1) = 1.5 */
    usage_job("p", "default", "RUNNING", 1, 1, -1);
    /* a queue that does not share fairly is not read */
    usage_job("a", "plain", "RUNNING", 4, 1, -1);
    json_t *u = NULL;
    cr_assert_eq(store_queue_project_usage(c, H, &u, &err), 0, "%s", err.message);
    char *text = json_dumps(u, JSON_COMPACT);
    cr_assert_float_eq(usage_of(u, "default", "a"), 0.5, 1e-4, "%s", text);
    cr_assert_float_eq(usage_of(u, "default", "b"), 0.25, 1e-4, "%s", text);
    cr_assert_float_eq(usage_of(u, "default", "p"), 1.5, 1e-4, "%s", text);
    cr_assert_null(json_object_get(u, "plain"), "%s", text);
    free(text);
    json_decref(u);
    /* twice the half-life: the same runs decay half as fast, and the window is twice as long
     * (28.9 of these half-lives' hours): a's big old run counts now, 100 x (2^-7.5 - 2^-8) */
    cr_assert_eq(store_queue_project_usage(c, 2 * H, &u, &err), 0, "%s", err.message);
    text = json_dumps(u, JSON_COMPACT);
    cr_assert_float_eq(usage_of(u, "default", "a"), 2 * (0.7071067811865476 - 0.5) + 100 * (pow(2, -7.5) - pow(2, -8)),
                       1e-4, "%s", text);
    cr_assert_float_eq(usage_of(u, "default", "p"), 1 + (1 - 0.7071067811865476), 1e-4, "%s", text);
    cr_assert_float_eq(usage_of(u, "default", "b"), 2 * (0.5 - 0.3535533905932738), 1e-4, "%s", text);
    free(text);
    json_decref(u);
}
#undef H

/* What checking a submission reads of the queues: the queue and the others of its cohort only. */
Test(fair, a_submissions_queue_is_read_with_its_cohort_alone)
{
    const char *defs[][2] = {{"a", "r"}, {"b", "r"}, {"c", NULL}, {"d", "s"}};
    for (int i = 0; i < 4; i++) {
        json_t *q = json_pack("{s:s, s:s*, s:{s:i}, s:f, s:[s], s:b, s:{s:s, s:s}}", "name", defs[i][0], "cohort",
                              defs[i][1], "quota", "cpu", 8, "weight", 1.0, "projects", "*", "fair_sharing", 0,
                              "preemption", "within_queue", "never", "reclaim_within_cohort", "lower_priority");
        cr_assert_eq(store_queue_insert(c, q, "test", &err), 0, "%s", err.message);
        json_decref(q);
    }
    const char *want[][4] = {{"a", "a", "b", NULL}, {"c", "c", NULL}, {"d", "d", NULL}, {"nowhere", NULL}};
    for (int k = 0; k < 4; k++) {
        json_t *got = NULL;
        cr_assert_eq(store_queue_defs_json(c, want[k][0], &got, &err), 0, "%s", err.message);
        char *text = json_dumps(got, JSON_COMPACT);
        size_t n = 0;
        while (want[k][1 + n])
            n++;
        cr_assert_eq(json_array_size(got), n, "for %s: %s", want[k][0], text);
        for (size_t i = 0; i < n; i++)
            cr_assert_str_eq(json_string_value(json_object_get(json_array_get(got, i), "name")), want[k][1 + i], "%s",
                             text);
        free(text);
        json_decref(got);
    }
    json_t *all = NULL;
    cr_assert_eq(store_queue_defs_json(c, NULL, &all, &err), 0, "%s", err.message);
    cr_assert_eq(json_array_size(all), 5, "every queue, default included");
    /* with its preemption policy as stored (migration 0027), default's the column defaults */
    json_t *pre_a = json_object_get(json_array_get(all, 0), "preemption");
    json_t *pre_default = json_object_get(json_array_get(all, 4), "preemption");
    cr_assert_str_eq(json_string_value(json_object_get(pre_a, "within_queue")), "never");
    cr_assert_str_eq(json_string_value(json_object_get(pre_a, "reclaim_within_cohort")), "lower_priority");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(all, 4), "name")), "default");
    cr_assert_str_eq(json_string_value(json_object_get(pre_default, "within_queue")), "lower_priority");
    cr_assert_str_eq(json_string_value(json_object_get(pre_default, "reclaim_within_cohort")), "any");
    json_decref(all);
}
