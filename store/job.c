/* job.c - SQL for jobs and job events: insert with idempotency key, row reads and locks, state
 * transitions with their event rows, the JSON shapes the API returns (listing and search are
 * search.c's), and the per-batch job update of metric ingestion. */
#include "store/store_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int not_found(kiln_err_t *err, const char *id)
{
    kiln_err_set(err, KILN_ENOTFOUND, NULL, "job \"%s\" not found", id ? id : "");
    kiln_err_hint(err, "list jobs with GET /v1/jobs (kiln jobs)");
    return KILN_ENOTFOUND;
}

/* Runs sql, whose $1 is job id, for its one row: *r (OUT; PQclear it) on 0. A job that does not
 * exist (id no UUID, or no row) is not_found. prepared: through store_qp, else store_q. */
static int job_one_row(store_conn_t *c, const char *what, const char *sql, bool prepared, const char *id,
                       PGresult **r, kiln_err_t *err)
{
    *r = NULL;
    if (!store_is_uuid(id))
        return not_found(err, id);
    const char *p[1] = {id};
    int rc = prepared ? store_qp(c, what, sql, 1, p, r, err) : store_q(c, what, sql, 1, p, r, err);
    if (rc)
        return rc;
    if (PQntuples(*r) != 1) {
        PQclear(*r);
        *r = NULL;
        return not_found(err, id);
    }
    return 0;
}

json_t *store_job_json(const PGresult *r, int i)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(store_get_str(r, i, 0)));
    json_object_set_new(o, "name", json_string(store_get_str(r, i, 1)));
    json_object_set_new(o, "state", json_string(store_get_str(r, i, 2)));
    json_object_set_new(o, "reason", json_string(store_get_str(r, i, 3)));
    json_object_set_new(o, "attempt", json_integer(store_get_int(r, i, 4)));
    store_json_set_time(o, "created_at", r, i, 5);
    store_json_set_time(o, "updated_at", r, i, 6);
    store_json_set_time(o, "started_at", r, i, 7);
    store_json_set_time(o, "ended_at", r, i, 8);
    json_t *prog = json_object();
    json_object_set_new(prog, "step", json_integer(store_get_i64(r, i, 9)));
    json_object_set_new(prog, "total_steps", json_integer(store_get_i64(r, i, 10)));
    json_object_set_new(prog, "eta_s", store_is_null(r, i, 11) ? json_null()
                                                                : json_real(store_get_double(r, i, 11)));
    json_object_set_new(o, "progress", prog);
    json_object_set_new(o, "metrics", store_get_json(r, i, 12, NULL));
    json_object_set_new(o, "workers", store_get_json(r, i, 14, json_array()));
    json_object_set_new(o, "priority", json_integer(store_get_int(r, i, 15)));
    json_object_set_new(o, "queue", json_string(store_get_str(r, i, 16)));
    json_object_set_new(o, "project", json_string(store_get_str(r, i, 17)));
    json_object_set_new(o, "tags", store_get_json(r, i, 18, NULL));
    json_object_set_new(o, "world_size", json_integer(store_get_int(r, i, 19)));
    json_object_set_new(o, "submitted_by", json_string(store_get_str(r, i, 20)));
    json_object_set_new(o, "spec", store_get_json(r, i, 13, NULL));
    if (!store_is_null(r, i, 21))  /* only while the job waits (store_job_pending_set) */
        json_object_set_new(o, "pending", store_get_json(r, i, 21, NULL));
    return o;
}

int store_insert_no_project(store_conn_t *c, const char *project, kiln_err_t *err)
{
    bool exists = true;
    int rc = store_project_exists(c, project, &exists, err);
    if (rc)
        return rc;
    if (!exists)
        return kiln_err_set(err, KILN_ENOTFOUND, "project", "project \"%s\" does not exist", project);
    return 0;
}

int store_insert_no_queue(store_conn_t *c, const char *project, const char *queue, kiln_err_t *err)
{
    const char *p[2] = {queue, project};
    PGresult *r = NULL;
    int rc = store_q(c, "read a job's queue",
                     "SELECT count(*) FROM queues WHERE name = $1 AND (projects ? '*' OR projects ? $2)", 2, p, &r,
                     err);
    if (rc)
        return rc;
    int64_t allowed = store_get_i64(r, 0, 0);
    PQclear(r);
    if (!allowed)
        return kiln_err_set(err, KILN_EINVAL, "queue", "project \"%.80s\" may not use queue \"%.80s\"", project,
                            queue);
    return 0;
}

int store_job_insert(store_conn_t *c, const store_job_new_t *j, char *id_out, bool *created,
                     json_t **out_json, kiln_err_t *err)
{
    if (out_json)
        *out_json = NULL;
    static const char *sql =
        "WITH j AS ("
        " INSERT INTO jobs (id, name, project, spec, state, reason, priority, queue, nodes,"
        "  slots_per_node, slot_type, world_size, max_attempts, total_steps, tags,"
        "  idempotency_key, event_seq, submitted_by, data_paths, request_hash)"
        " SELECT gen_random_uuid(), $1::text, $2::text, $3::jsonb, " STORE_STATE(QUEUED) ", $4::text, $5::int,"
        "  $6::text, $7::int, $8::int, $9::text, $10::int, $11::int, $12::bigint, $13::jsonb,"
        "  $14::text, 1, $15::text, $16::jsonb, $17::bytea"
        " WHERE EXISTS (SELECT 1 FROM projects WHERE name = $2::text)"
        /* the queue lets the project in: its row locked (as a foreign key's check would) so that
         * a change of its projects (svc_queue_update, which locks it FOR UPDATE and counts the
         * jobs it would leave out) either waits for this job or is seen by it */
        "  AND EXISTS (SELECT 1 FROM queues WHERE name = $6::text"
        "   AND (projects ? '*' OR projects ? $2::text) FOR KEY SHARE)"
        " ON CONFLICT (project, idempotency_key) DO NOTHING"
        " RETURNING *),"
        " e AS (INSERT INTO job_events (job_id, seq, from_state, to_state, reason, attempt, time, actor)"
        "  SELECT id, 1, NULL, " STORE_STATE(QUEUED) ", $4, 0, created_at, $15 FROM j),"
        " h AS (INSERT INTO job_hparams (job_id, key, num)"
        "  SELECT j.id, x.key, (x.value #>> '{}')::float8"
        "  FROM j, jsonb_each(COALESCE($18::jsonb, j.spec -> 'hyperparameters')) x"
        "  WHERE jsonb_typeof(x.value) = 'number')"
        " SELECT " STORE_JOB_COLS " FROM j";
    char prio[16], nodes[16], spn[16], ws[16], ma[16], ts[24];
    snprintf(prio, sizeof(prio), "%d", j->priority);
    snprintf(nodes, sizeof(nodes), "%d", j->nodes);
    snprintf(spn, sizeof(spn), "%d", j->slots_per_node);
    snprintf(ws, sizeof(ws), "%d", j->world_size);
    snprintf(ma, sizeof(ma), "%d", j->max_attempts);
    snprintf(ts, sizeof(ts), "%lld", (long long)j->total_steps);
    char hash[2 * STORE_HASH_LEN + 3] = "";
    if (j->request_hash)
        store_hash_param(j->request_hash, hash);
    const char *p[18] = {j->name, j->project ? j->project : "default", j->spec_json,
                         j->reason ? j->reason : "submitted", prio,
                         j->queue ? j->queue : "default", nodes, spn, j->slot_type, ws, ma, ts,
                         j->tags_json ? j->tags_json : "{}", j->idempotency_key,
                         j->submitted_by ? j->submitted_by : "", j->paths_json ? j->paths_json : "[]",
                         j->request_hash ? hash : NULL, j->hparams_json};
    PGresult *r = NULL;
    store_job_key_t held = {0};
    for (int attempt = 0;; attempt++) {
        int rc = store_qp(c, "insert job", sql, 18, p, &r, err);
        if (rc)
            return rc;
        if (PQntuples(r) == 1) {
            kiln_strlcpy(id_out, PQgetvalue(r, 0, 0), STORE_ID_LEN);
            *created = true;
            if (out_json)
                *out_json = store_job_json(r, 0);
            PQclear(r);
            return 0;
        }
        PQclear(r);
        r = NULL;
        /* Nothing inserted: the key is taken, the project does not exist, or its queue does not
         * let it in. */
        if (j->idempotency_key) {
            rc = store_job_key_get(c, p[1], j->idempotency_key, NULL, &held, err);
            if (rc)
                return rc;
            if (held.found)
                break;
        }
        rc = store_insert_no_project(c, p[1], err);
        if (rc == 0)
            rc = store_insert_no_queue(c, p[1], p[5], err);
        if (rc)
            return rc;
        if (attempt > 0)
            return kiln_err_set(err, KILN_EDB, NULL, "could not insert job: the statement inserted nothing "
                                "twice, although its project exists, its queue lets it in and its idempotency "
                                "key is free");
    }
    kiln_strlcpy(id_out, held.id, STORE_ID_LEN);
    *created = false;
    /* whether that job answers this request is the caller's to say: store_job_key_get */
    kiln_err_set(err, KILN_EREUSED, "idempotency_key", "this idempotency key is already used");
    return KILN_EREUSED;
}

int store_job_key_get(store_conn_t *c, const char *project, const char *key, const uint8_t *request_hash,
                      store_job_key_t *out, kiln_err_t *err)
{
    memset(out, 0, sizeof(*out));
    char hash[2 * STORE_HASH_LEN + 3] = "";
    if (request_hash)
        store_hash_param(request_hash, hash);
    const char *p[3] = {project, key, request_hash ? hash : NULL};
    PGresult *r = NULL;
    int rc = store_q(c, "find job by idempotency key",
                     "SELECT id::text, request_hash IS NULL OR $3::bytea IS NULL OR request_hash = $3::bytea"
                     " FROM jobs WHERE project = $1 AND idempotency_key = $2", 3, p, &r, err);
    if (rc)
        return rc;
    if (PQntuples(r) == 1) {
        out->found = true;
        kiln_strlcpy(out->id, store_get_str(r, 0, 0), sizeof(out->id));
        out->same = store_get_bool(r, 0, 1);
    }
    PQclear(r);
    return 0;
}

#define ROW_COLS "id::text, state, slot_type, attempt, max_attempts, priority, nodes, " \
                 "slots_per_node, world_size, stop_requested, total_steps, ckpt_flat_dir, queue, project, " \
                 "preemptions, coalesce(preempted_by::text, ''), coalesce(last_preempted_by::text, ''), " \
                 "coalesce(fresh_attempt, 0)"
#define ROW_NCOLS 18 /* the columns of ROW_COLS */

/* Fills o from ROW_COLS starting at column off of row i. */
static void row_fill_at(const PGresult *r, int i, int off, store_job_row_t *o)
{
    memset(o, 0, sizeof(*o));
    kiln_strlcpy(o->id, store_get_str(r, i, off + 0), sizeof(o->id));
    kiln_strlcpy(o->state, store_get_str(r, i, off + 1), sizeof(o->state));
    kiln_strlcpy(o->slot_type, store_get_str(r, i, off + 2), sizeof(o->slot_type));
    o->attempt = store_get_int(r, i, off + 3);
    o->max_attempts = store_get_int(r, i, off + 4);
    o->priority = store_get_int(r, i, off + 5);
    o->nodes = store_get_int(r, i, off + 6);
    o->slots_per_node = store_get_int(r, i, off + 7);
    o->world_size = store_get_int(r, i, off + 8);
    o->stop_requested = store_get_bool(r, i, off + 9);
    o->total_steps = store_get_i64(r, i, off + 10);
    o->ckpt_flat_dir = store_get_bool(r, i, off + 11);
    kiln_strlcpy(o->queue, store_get_str(r, i, off + 12), sizeof(o->queue));
    kiln_strlcpy(o->project, store_get_str(r, i, off + 13), sizeof(o->project));
    o->preemptions = store_get_int(r, i, off + 14);
    kiln_strlcpy(o->preempted_by, store_get_str(r, i, off + 15), sizeof(o->preempted_by));
    kiln_strlcpy(o->last_preempted_by, store_get_str(r, i, off + 16), sizeof(o->last_preempted_by));
    o->fresh_attempt = store_get_int(r, i, off + 17);
}

static void row_fill(const PGresult *r, int i, void *elem)
{
    row_fill_at(r, i, 0, elem);
}

int store_job_rows_lock(store_conn_t *c, const char *const *ids, int n, store_job_row_t *out, double *age_s,
                        bool *found, kiln_err_t *err)
{
    int m = 0;
    for (int i = 0; i < n; i++)
        found[i] = false;
    const char **valid = calloc((size_t)KILN_MAX(n, 1), sizeof(*valid));
    int *at = calloc((size_t)KILN_MAX(n, 1), sizeof(*at));
    if (!valid || !at) {
        free(valid);
        free(at);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    for (int i = 0; i < n; i++)
        if (store_is_uuid(ids[i])) {
            valid[m] = ids[i];
            at[m++] = i;
        }
    int rc = 0;
    if (m > 0) {
        store_buf_t a = {0};
        store_buf_uuid_array(&a, valid, m);
        const char *p[1] = {a.p};
        PGresult *r = NULL;
        rc = store_qp(c, "lock jobs",
                     "SELECT " ROW_COLS ", x.i, extract(epoch FROM clock_timestamp() - updated_at)::float8"
                     " FROM unnest($1::uuid[]) WITH ORDINALITY x(jid, i) JOIN jobs ON jobs.id = x.jid"
                     " ORDER BY jobs.id FOR UPDATE OF jobs", 1, p, &r, err);
        store_buf_free(&a);
        for (int row = 0; rc == 0 && row < PQntuples(r); row++) { /* each row names its id by its place */
            int k = store_get_int(r, row, ROW_NCOLS) - 1;
            if (k < 0 || k >= m || found[at[k]])
                continue;
            row_fill(r, row, &out[at[k]]);
            age_s[at[k]] = store_get_double(r, row, ROW_NCOLS + 1);
            found[at[k]] = true;
        }
        if (rc == 0)
            PQclear(r);
    }
    free(valid);
    free(at);
    return rc;
}

int store_job_set_preempted_by(store_conn_t *c, const char *id, const char *by, kiln_err_t *err)
{
    if (!store_is_uuid(id) || (by && !store_is_uuid(by)))
        return not_found(err, id);
    const char *p[2] = {id, by};
    return store_q(c, "mark a job preempted", "UPDATE jobs SET preempted_by = $2::uuid,"
                   " last_preempted_by = COALESCE($2::uuid, last_preempted_by) WHERE id = $1::uuid", 2, p,
                   NULL, err);
}

int store_job_row(store_conn_t *c, const char *id, bool lock, store_job_row_t *out, kiln_err_t *err)
{
    const char *sql = lock ? "SELECT " ROW_COLS " FROM jobs WHERE id = $1::uuid FOR UPDATE"
                           : "SELECT " ROW_COLS " FROM jobs WHERE id = $1::uuid";
    PGresult *r = NULL;
    int rc = job_one_row(c, "read job", sql, true, id, &r, err);
    if (rc)
        return rc;
    row_fill(r, 0, out);
    PQclear(r);
    return 0;
}

/* In TRANSITION_SQL: a new attempt ($7 & 8) of a job whose ending attempt trained from step 0
 * (store_job_restart_set) and did not reach the step the job had reached before. */
#define FRESH_AGAIN "(($7::int & 8) <> 0 AND j.fresh_attempt = j.attempt AND j.progress_step < j.restart_step)"

/* A state change of the jobs in CTE x (id, from_state, reason, attempt, backfill_s, i): each in its
 * from_state moves to $6 with flags $7 and gets its event row (actor $8); returns the i of each
 * that moved. */
#define TRANSITION_SQL(X)                                                                                 \
    "WITH x AS (" X "),"                                                                                  \
    " u AS ("                                                                                             \
    " UPDATE jobs j SET state = $6, reason = x.reason, attempt = x.attempt, event_seq = j.event_seq + 1," \
    "  updated_at = clock_timestamp(),"                                                                   \
    "  started_at = CASE WHEN ($7::int & 1) <> 0 AND j.started_at IS NULL"                                \
    "               THEN clock_timestamp() ELSE j.started_at END,"                                        \
    "  ended_at = CASE WHEN ($7::int & 2) <> 0 THEN clock_timestamp() ELSE j.ended_at END,"               \
    "  stop_requested = j.stop_requested OR ($7::int & 4) <> 0,"                                          \
    "  preemptions = j.preemptions + CASE WHEN ($7::int & 16) <> 0 THEN 1 ELSE 0 END,"                    \
    "  preempted_by = CASE WHEN ($7::int & 8) <> 0 THEN NULL ELSE j.preempted_by END,"                    \
    "  backfill_end = CASE WHEN x.backfill_s IS NOT NULL"                                                 \
    "                 THEN clock_timestamp() + x.backfill_s * interval '1 second'"                        \
    "                 WHEN ($7::int & 8) <> 0 THEN NULL ELSE j.backfill_end END,"                         \
    "  eta_s = CASE WHEN ($7::int & 8) <> 0 OR ($7::int & 2) <> 0 THEN NULL ELSE j.eta_s END,"            \
    /* a new attempt after one that restarted from step 0 (--tune-promoted-restart) and ended before  \
     * it trained back to the step it had reached (whose checkpoints stay): from step 0 too */         \
    "  fresh_attempt = CASE WHEN " FRESH_AGAIN " THEN x.attempt ELSE j.fresh_attempt END,"               \
    "  retrained_steps = CASE WHEN " FRESH_AGAIN " THEN j.retrained_steps + j.progress_step"              \
    "                    ELSE j.retrained_steps END,"                                                     \
    "  progress_step = CASE WHEN " FRESH_AGAIN " THEN 0 ELSE j.progress_step END,"                        \
    "  pending = CASE WHEN $6 IN " STORE_WAITING " THEN j.pending END"                                    \
    " FROM x WHERE j.id = x.id AND j.state = x.from_state"                                                \
    " RETURNING j.id, j.event_seq, j.attempt, x.from_state, x.reason, x.i),"                              \
    " e AS (INSERT INTO job_events (job_id, seq, from_state, to_state, reason, attempt, actor)"            \
    " SELECT id, event_seq, from_state, $6, reason, attempt, $8 FROM u ORDER BY i)"                       \
    " SELECT i FROM u"

/* Runs TRANSITION_SQL with parameters p (8) and marks the moved ones of t[0..n) done. */
static int transition_run(store_conn_t *c, const char *sql, const char *const *p, store_transition_t *t, int n,
                          kiln_err_t *err)
{
    PGresult *r = NULL;
    /* one job: prepared (its plan is an index lookup); many: planned with the arrays' sizes known */
    int rc = n == 1 ? store_qp(c, "change job state", sql, 8, p, &r, err)
                    : store_q(c, "change job state", sql, 8, p, &r, err);
    if (rc)
        return rc;
    for (int row = 0; row < PQntuples(r); row++) { /* each row names its transition by its place */
        int k = store_get_int(r, row, 0) - 1;
        if (k >= 0 && k < n)
            t[k].done = true;
    }
    PQclear(r);
    return 0;
}

/* One job's move: a one-row x, so that its plan is an index lookup (prepared once). */
static int transition_one(store_conn_t *c, store_transition_t *t, const char *to, int flags, const char *actor,
                          kiln_err_t *err)
{
    static const char *sql = TRANSITION_SQL("SELECT $1::uuid AS id, $2::text AS from_state, $3::text AS reason,"
                                            " $4::int AS attempt, $5::float8 AS backfill_s, 1::bigint AS i");
    char att[16], fl[16], bf[40];
    snprintf(att, sizeof(att), "%d", t->attempt);
    snprintf(fl, sizeof(fl), "%d", flags);
    snprintf(bf, sizeof(bf), "%.3f", t->backfill_s);
    const char *p[8] = {t->id, t->from, t->reason ? t->reason : "", att, t->backfill_s >= 0 ? bf : NULL, to, fl,
                        actor ? actor : ""};
    return transition_run(c, sql, p, t, 1, err);
}

int store_job_note(store_conn_t *c, const char *id, const char *state, const char *reason, const char *actor,
                   bool *done, kiln_err_t *err)
{
    /* event_seq is no column of jobs_sched_touch's: the note leaves the job's sched_xid alone */
    static const char *sql =
        "WITH u AS (UPDATE jobs SET event_seq = event_seq + 1 WHERE id = $1::uuid AND state = $2::text"
        "  RETURNING id, event_seq, attempt, state)"
        " INSERT INTO job_events (job_id, seq, from_state, to_state, reason, attempt, actor)"
        " SELECT id, event_seq, state, state, $3::text, attempt, $4::text FROM u RETURNING seq";
    *done = false;
    const char *p[4] = {id, state, reason ? reason : "", actor ? actor : ""};
    PGresult *r = NULL;
    int rc = store_qp(c, "note job event", sql, 4, p, &r, err);
    if (rc)
        return rc;
    *done = PQntuples(r) == 1;
    PQclear(r);
    return 0;
}

int store_job_transition_many(store_conn_t *c, store_transition_t *t, int n, const char *to, int flags,
                              const char *actor, kiln_err_t *err)
{
    static const char *sql =
        TRANSITION_SQL("SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int[], $5::float8[])"
                       "  WITH ORDINALITY AS x(id, from_state, reason, attempt, backfill_s, i)");
    for (int k = 0; k < n; k++)
        t[k].done = false;
    if (n <= 0)
        return 0;
    if (n == 1)
        return transition_one(c, t, to, flags, actor, err);
    store_buf_t a[5] = {{0}};
    for (int k = 0; k < n; k++) {
        store_buf_elems(a, 5, k);
        store_buf_array_text(&a[0], t[k].id);
        store_buf_array_text(&a[1], t[k].from);
        store_buf_array_text(&a[2], t[k].reason ? t[k].reason : "");
        store_buf_i64(&a[3], t[k].attempt);
        if (t[k].backfill_s >= 0)
            store_buf_double(&a[4], t[k].backfill_s);
        else
            store_buf_put(&a[4], "NULL", 4);
    }
    store_buf_arrays_end(a, 5, n);
    char fl[16];
    snprintf(fl, sizeof(fl), "%d", flags);
    const char *p[8] = {a[0].p, a[1].p, a[2].p, a[3].p, a[4].p, to, fl, actor ? actor : ""};
    int rc = transition_run(c, sql, p, t, n, err);
    for (int f = 0; f < 5; f++)
        store_buf_free(&a[f]);
    return rc;
}

int store_job_transition(store_conn_t *c, const char *id, const char *from, const char *to,
                         const char *reason, int attempt, int flags, const char *actor,
                         kiln_err_t *err)
{
    store_transition_t t = {.id = id, .from = from, .reason = reason, .attempt = attempt, .backfill_s = -1};
    int rc = store_job_transition_many(c, &t, 1, to, flags, actor, err);
    if (rc == 0 && !t.done)
        return kiln_err_set(err, KILN_ESTATE, NULL, "job \"%s\" is no longer %s", id, from);
    return rc;
}

int store_job_get_json(store_conn_t *c, const char *id, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    PGresult *r = NULL;
    int rc = job_one_row(c, "read job", "SELECT " STORE_JOB_COLS " FROM jobs j WHERE j.id = $1::uuid", false, id,
                         &r, err);
    if (rc)
        return rc;
    *out = store_job_json(r, 0);
    PQclear(r);
    return 0;
}

int store_job_events_json(store_conn_t *c, const char *id, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    if (!store_is_uuid(id))
        return not_found(err, id);
    const char *p[1] = {id};
    PGresult *r = NULL;
    int rc = store_q(c, "read job events",
                     "SELECT seq, from_state, to_state, reason, " STORE_US("time") ", attempt, actor"
                     " FROM job_events WHERE job_id = $1::uuid ORDER BY seq", 1, p, &r, err);
    if (rc)
        return rc;
    int n = PQntuples(r);
    if (n == 0) {  /* every job has its QUEUED event */
        PQclear(r);
        return not_found(err, id);
    }
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        json_t *e = json_object();
        json_object_set_new(e, "seq", json_integer(store_get_i64(r, i, 0)));
        json_object_set_new(e, "from_state", store_is_null(r, i, 1) ? json_null()
                                                                    : json_string(store_get_str(r, i, 1)));
        json_object_set_new(e, "to_state", json_string(store_get_str(r, i, 2)));
        json_object_set_new(e, "reason", json_string(store_get_str(r, i, 3)));
        store_json_set_time(e, "time", r, i, 4);
        json_object_set_new(e, "attempt", json_integer(store_get_int(r, i, 5)));
        json_object_set_new(e, "actor", json_string(store_get_str(r, i, 6)));
        json_array_append_new(arr, e);
    }
    PQclear(r);
    *out = arr;
    return 0;
}


int store_pending_cmp(const void *a, const void *b)
{
    const store_pending_t *x = a, *y = b;
    if (x->row.priority != y->row.priority)
        return x->row.priority > y->row.priority ? -1 : 1;
    if (x->created_us != y->created_us)
        return x->created_us < y->created_us ? -1 : 1;
    return strcmp(x->row.id, y->row.id); /* lower-case UUID text sorts as PostgreSQL's uuid does */
}

/* The columns of a kept pending row after the snapshot and the forget flag: whether it waits, its
 * ROW_COLS and created_at in microseconds (exact: extract returns numeric). */
#define PENDING_COLS "state IN " STORE_WAITING ", " ROW_COLS ", (extract(epoch FROM created_at) * 1000000)::bigint"

/* The rows of one pending read s: column 0 the snapshot, 1 whether jobs were deleted since, then
 * PENDING_COLS (NULL when no job matched: the one row carries only the snapshot). Takes s's
 * result. */
static int pending_take(store_stmt_t *s, store_pending_t **out, int *n, char **snap, bool *forget, kiln_err_t *err)
{
    PGresult *r = store_stmt_take(s);
    const char *what = s->what;
    *out = NULL;
    *n = 0;
    *snap = NULL;
    if (forget)
        *forget = false;
    int rows = PQntuples(r);
    if (rows < 1) {
        PQclear(r);
        return kiln_err_set(err, KILN_EDB, NULL, "could not %s: the statement returned no snapshot", what);
    }
    store_pending_t *arr = calloc((size_t)rows, sizeof(*arr));
    *snap = strdup(store_get_str(r, 0, 0));
    if (!arr || !*snap) {
        free(arr);
        free(*snap);
        *snap = NULL;
        PQclear(r);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory reading %d rows to %s", rows, what);
    }
    if (forget)
        *forget = store_get_bool(r, 0, 1);
    int m = 0;
    for (int i = 0; i < rows; i++) {
        if (store_is_null(r, i, 3))
            continue; /* no job: the snapshot's row alone */
        arr[m].waiting = store_get_bool(r, i, 2);
        row_fill_at(r, i, 3, &arr[m].row);
        arr[m].created_us = store_get_i64(r, i, 3 + ROW_NCOLS);
        m++;
    }
    PQclear(r);
    *out = arr;
    *n = m;
    return 0;
}

/* The first limit waiting jobs, in the queue's order. */
static void pending_all_stmt(store_stmt_t *s, int limit)
{
    *s = (store_stmt_t){.what = "read the job queue",
                        .sql = "SELECT s.snap::text, false, j.* FROM (SELECT pg_current_snapshot() AS snap) s"
                               " LEFT JOIN LATERAL (SELECT " PENDING_COLS " FROM jobs WHERE state IN " STORE_WAITING
                               "  ORDER BY priority DESC, created_at, id LIMIT $1::int) j ON true",
                        .nparams = 1, .params = s->p};
    snprintf(s->buf[0], sizeof s->buf[0], "%d", limit);
    s->p[0] = s->buf[0];
}

/* Every job written since snapshot since (which must outlive s). KILN_EINVAL when since is not a
 * snapshot's text. */
static int pending_changes_stmt(store_stmt_t *s, const char *since, kiln_err_t *err)
{
    *s = (store_stmt_t){.what = "read the job queue's changes",
                        .sql = "SELECT s.snap::text, s.forgot, j.* FROM (SELECT pg_current_snapshot() AS snap,"
                               "  NOT pg_visible_in_snapshot((SELECT xid FROM job_forget), $1::pg_snapshot) AS forgot) s"
                               " LEFT JOIN LATERAL (SELECT " PENDING_COLS " FROM jobs WHERE sched_xid >= $2::xid8"
                               "  AND NOT pg_visible_in_snapshot(sched_xid, $1::pg_snapshot)) j ON true",
                        .nparams = 2, .params = s->p};
    /* a snapshot's text is xmin:xmax:xip,...; rows written before xmin were visible in it (or
     * never committed), so the index bounds the scan to those at or after it */
    size_t k = 0;
    while (since[k] >= '0' && since[k] <= '9' && k < sizeof s->buf[0] - 1) {
        s->buf[0][k] = since[k];
        k++;
    }
    s->buf[0][k] = '\0';
    if (k == 0 || since[k] != ':')
        return kiln_err_set(err, KILN_EINVAL, NULL, "malformed snapshot \"%.60s\"", since);
    s->p[0] = since;
    s->p[1] = s->buf[0];
    return 0;
}

int store_job_pending_all(store_conn_t *c, int limit, store_pending_t **out, int *n, char **snap, kiln_err_t *err)
{
    *out = NULL;
    *n = 0;
    *snap = NULL;
    store_stmt_t s;
    pending_all_stmt(&s, limit);
    int rc = store_qp_pipeline(c, &s, 1, err);
    return rc ? rc : pending_take(&s, out, n, snap, NULL, err);
}

int store_job_pending(store_conn_t *c, int limit, store_job_row_t **out, int *n, kiln_err_t *err)
{
    store_pending_t *rows = NULL;
    char *snap = NULL;
    *out = NULL;
    *n = 0;
    int rc = store_job_pending_all(c, limit, &rows, n, &snap, err);
    free(snap);
    if (rc)
        return rc;
    if (*n > 0 && !(*out = malloc((size_t)*n * sizeof(**out)))) {
        free(rows);
        *n = 0;
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory reading the job queue");
    }
    for (int k = 0; k < *n; k++)
        (*out)[k] = rows[k].row;
    free(rows);
    return 0;
}

int store_job_pending_changes(store_conn_t *c, const char *since, store_pending_t **out, int *n, char **snap,
                              bool *forget, kiln_err_t *err)
{
    *out = NULL;
    *n = 0;
    *snap = NULL;
    *forget = true; /* unless read: a caller that cannot read the changes reads the queue whole */
    store_stmt_t s;
    int rc = pending_changes_stmt(&s, since, err);
    if (rc == 0)
        rc = store_qp_pipeline(c, &s, 1, err);
    return rc ? rc : pending_take(&s, out, n, snap, forget, err);
}

static void holding_fill(const PGresult *r, int i, void *elem)
{
    store_holding_t *o = elem;
    kiln_strlcpy(o->id, store_get_str(r, i, 0), sizeof(o->id));
    kiln_strlcpy(o->state, store_get_str(r, i, 1), sizeof(o->state));
    kiln_strlcpy(o->queue, store_get_str(r, i, 2), sizeof(o->queue));
    kiln_strlcpy(o->slot_type, store_get_str(r, i, 3), sizeof(o->slot_type));
    o->attempt = store_get_int(r, i, 4);
    o->priority = store_get_int(r, i, 5);
    o->nodes = store_get_int(r, i, 6);
    o->slots_per_node = store_get_int(r, i, 7);
    o->preemptions = store_get_int(r, i, 8);
    o->steps_lost = store_get_i64(r, i, 9);
    o->age_s = store_get_double(r, i, 10);
    o->end_in_s = store_is_null(r, i, 11) ? -1 : KILN_MAX(0.0, store_get_double(r, i, 11));
    o->backfilled = !store_is_null(r, i, 12);
    o->backfill_end_in_s = store_get_double(r, i, 12);
    kiln_strlcpy(o->workers, store_get_str(r, i, 13), sizeof(o->workers));
    kiln_strlcpy(o->project, store_get_str(r, i, 14), sizeof(o->project));
}

static void holding_stmt(store_stmt_t *s)
{
    *s = (store_stmt_t){.what = "read the jobs holding slots",
                        .sql = "SELECT j.id::text, j.state, j.queue, j.slot_type, j.attempt, j.priority, j.nodes,"
                               " j.slots_per_node, j.preemptions,"
                               " GREATEST(j.progress_step - COALESCE(floor(CASE WHEN jsonb_typeof(j.metrics->'checkpoint_step')"
                               "  = 'number' THEN (j.metrics->>'checkpoint_step')::float8 END)::bigint, 0), 0),"
                               " extract(epoch FROM clock_timestamp() - j.created_at)::float8,"
                               " LEAST(CASE WHEN j.step_time_s IS NOT NULL AND j.total_steps > 0"
                               "   THEN j.step_time_s * GREATEST(j.total_steps - j.progress_step, 0) END,"
                               "  CASE WHEN j.started_at IS NOT NULL AND (j.spec->'stopping'->>'max_runtime_s')::float8 > 0"
                               "   THEN extract(epoch FROM j.started_at - clock_timestamp())::float8"
                               "    + (j.spec->'stopping'->>'max_runtime_s')::float8 END),"
                               " extract(epoch FROM j.backfill_end - clock_timestamp())::float8,"
                               " (SELECT string_agg(a.worker_id, ',' ORDER BY a.node_rank) FROM assignments a"
                               "   WHERE a.job_id = j.id AND a.attempt = j.attempt AND NOT a.released),"
                               " j.project"
                               " FROM jobs j WHERE j.state IN " STORE_HOLDING};
}

static int holding_take(store_stmt_t *s, store_holding_t **out, int *n, kiln_err_t *err)
{
    return store_stmt_rows(s, sizeof(**out), holding_fill, (void **)out, n, err);
}

int store_job_holding(store_conn_t *c, store_holding_t **out, int *n, kiln_err_t *err)
{
    *out = NULL;
    *n = 0;
    store_stmt_t s;
    holding_stmt(&s);
    int rc = store_qp_pipeline(c, &s, 1, err);
    return rc ? rc : holding_take(&s, out, n, err);
}

/* Statement s reads the predictions of the n jobs ids (their uuid array built into a, which must
 * outlive s's run; the caller frees it). */
static void predictions_stmt(store_stmt_t *s, store_buf_t *a, const char *const *ids, int n)
{
    store_buf_uuid_array(a, ids, n);
    *s = (store_stmt_t){.what = "predict run times",
                        .sql = "WITH p AS (SELECT x.i, j.spec, j.total_steps, j.progress_step, j.step_time_s, j.started_at"
                               "  FROM unnest($1::uuid[]) WITH ORDINALITY x(id, i) JOIN jobs j ON j.id = x.id),"
                               " h AS (SELECT spec->'model' AS m, spec->'resources' AS r, sum(step_time_s) AS st, count(*) AS n"
                               "  FROM jobs WHERE step_time_s IS NOT NULL AND spec->'model' IS NOT NULL"
                               "   AND spec->'model' IN (SELECT spec->'model' FROM p)"
                               "  GROUP BY 1, 2),"
                               " hm AS (SELECT m, sum(st) / sum(n) AS st FROM h GROUP BY m)"
                               " SELECT p.i, CASE"
                               "  WHEN p.step_time_s IS NOT NULL AND p.total_steps > 0"
                               "   THEN p.step_time_s * GREATEST(p.total_steps - p.progress_step, 0)"
                               "  WHEN (p.spec->'stopping'->>'max_runtime_s')::float8 > 0"
                               "   THEN GREATEST((p.spec->'stopping'->>'max_runtime_s')::float8"
                               "    - COALESCE(extract(epoch FROM clock_timestamp() - p.started_at)::float8, 0), 0)"
                               "  WHEN h.st IS NOT NULL AND p.total_steps > 0 THEN h.st / h.n * p.total_steps"
                               "  WHEN hm.st IS NOT NULL AND p.total_steps > 0 THEN hm.st * p.total_steps END,"
                               " CASE WHEN p.step_time_s IS NOT NULL AND p.total_steps > 0 THEN 1"
                               "  WHEN (p.spec->'stopping'->>'max_runtime_s')::float8 > 0 THEN 2"
                               "  WHEN h.st IS NOT NULL AND p.total_steps > 0 THEN 3"
                               "  WHEN hm.st IS NOT NULL AND p.total_steps > 0 THEN 4 ELSE 0 END"
                               " FROM p LEFT JOIN h ON h.m = p.spec->'model' AND h.r = p.spec->'resources'"
                               " LEFT JOIN hm ON hm.m = p.spec->'model'",
                        .nparams = 1, .params = s->p};
    s->p[0] = a->p;
}

/* The predictions r holds into runtime_s[0..n) and source (set to none first). Consumes r. */
static void predictions_take(PGresult *r, int n, double *runtime_s, store_predict_t *source)
{
    for (int i = 0; i < n; i++) {
        runtime_s[i] = -1;
        if (source)
            source[i] = STORE_PREDICT_NONE;
    }
    /* each row names its id by its place in ids (1-based) */
    for (int row = 0; r && row < PQntuples(r); row++) {
        int i = store_get_int(r, row, 0) - 1;
        if (i >= 0 && i < n && !store_is_null(r, row, 1)) {
            runtime_s[i] = store_get_double(r, row, 1);
            if (source)
                source[i] = (store_predict_t)store_get_int(r, row, 2);
        }
    }
    PQclear(r);
}

int store_job_predictions(store_conn_t *c, const char *const *ids, int n, double *runtime_s, store_predict_t *source,
                          kiln_err_t *err)
{
    predictions_take(NULL, n, runtime_s, source);
    if (n <= 0)
        return 0;
    store_buf_t a = {0};
    store_stmt_t s;
    predictions_stmt(&s, &a, ids, n);
    int rc = store_qp_pipeline(c, &s, 1, err);
    store_buf_free(&a);
    if (rc == 0)
        predictions_take(s.r, n, runtime_s, source);
    return rc;
}

/* Statement s reads the data paths of the n jobs ids (their uuid array built into a, as above). */
static void paths_stmt(store_stmt_t *s, store_buf_t *a, const char *const *ids, int n)
{
    store_buf_uuid_array(a, ids, n);
    *s = (store_stmt_t){.what = "read job paths",
                        .sql = "SELECT x.i, j.data_paths::text FROM unnest($1::uuid[]) WITH ORDINALITY x(id, i)"
                               " JOIN jobs j ON j.id = x.id",
                        .nparams = 1, .params = s->p};
    s->p[0] = a->p;
}

/* The paths r holds into out[0..n) (an empty array where it has none; r NULL: all). Consumes r. */
static void paths_take(PGresult *r, int n, json_t **out)
{
    for (int i = 0; i < n; i++)
        out[i] = NULL;
    for (int row = 0; r && row < PQntuples(r); row++) { /* each row names its id by its place in ids */
        int i = store_get_int(r, row, 0) - 1;
        if (i >= 0 && i < n && !out[i])
            out[i] = store_get_json(r, row, 1, json_array());
    }
    PQclear(r);
    for (int i = 0; i < n; i++)
        if (!out[i])
            out[i] = json_array();
}

int store_job_paths(store_conn_t *c, const char *const *ids, int n, json_t **out, kiln_err_t *err)
{
    store_buf_t a = {0};
    store_stmt_t s;
    paths_stmt(&s, &a, ids, n);
    int rc = store_qp_pipeline(c, &s, 1, err);
    store_buf_free(&a);
    paths_take(rc ? NULL : s.r, n, out);
    return rc;
}

int store_job_facts(store_conn_t *c, const char *const *path_ids, int np, json_t **paths, const char *const *pred_ids,
                    int nr, double *runtime_s, store_predict_t *source, bool *predicted, kiln_err_t *err)
{
    store_buf_t a = {0}, b = {0};
    store_stmt_t st[2];
    int n = 0, ip = -1, ir = -1;
    if (np > 0) {
        paths_stmt(&st[ip = n++], &a, path_ids, np);
    }
    if (nr > 0)
        predictions_stmt(&st[ir = n++], &b, pred_ids, nr);
    int rc = n ? store_qp_pipeline(c, st, n, err) : 0;
    store_buf_free(&a);
    store_buf_free(&b);
    /* the paths are needed; a prediction that could not be read is only a prediction less */
    bool paths_ok = ip < 0 || st[ip].r;
    *predicted = ir < 0 || (rc == 0 && st[ir].r);
    if (ip >= 0)
        paths_take(paths_ok ? st[ip].r : NULL, np, paths);
    predictions_take(ir >= 0 && *predicted ? st[ir].r : NULL, nr, runtime_s, source);
    if (ir >= 0 && !*predicted)
        PQclear(st[ir].r);
    return paths_ok ? 0 : rc;
}

/* Runs sql, an UPDATE whose $1 is a uuid[] of ids and $2 a text[] of the matching texts, in one
 * statement (what names it in errors). */
static int update_by_ids(store_conn_t *c, const char *what, const char *sql, const char *const *ids,
                         const char *const *texts, int n, kiln_err_t *err)
{
    if (n <= 0)
        return 0;
    store_buf_t a = {0}, b = {0};
    store_buf_uuid_array(&a, ids, n);
    store_buf_text_array(&b, texts, n);
    const char *p[2] = {a.p, b.p};
    int rc = store_qp(c, what, sql, 2, p, NULL, err);
    store_buf_free(&a);
    store_buf_free(&b);
    return rc;
}

int store_job_queue_reasons(store_conn_t *c, const char *const *ids, const char *const *reasons, int n,
                            kiln_err_t *err)
{
    return update_by_ids(c, "update the reasons of queued jobs",
                         "UPDATE jobs j SET reason = v.reason FROM unnest($1::uuid[], $2::text[]) AS v(id, reason)"
                         " WHERE j.id = v.id AND j.state = " STORE_STATE(QUEUED) " AND j.reason <> v.reason", ids, reasons, n, err);
}

int store_job_pending_set(store_conn_t *c, const char *const *ids, const char *const *pending_json, int n,
                          kiln_err_t *err)
{
    return update_by_ids(c, "update the pending reasons of waiting jobs",
                         "UPDATE jobs j SET pending = v.p::jsonb FROM unnest($1::uuid[], $2::text[]) AS v(id, p)"
                         " WHERE j.id = v.id AND j.state IN " STORE_WAITING " AND j.pending IS DISTINCT FROM v.p::jsonb",
                         ids, pending_json, n, err);
}

int store_job_overdue(store_conn_t *c, store_job_row_t **out, int *n, kiln_err_t *err)
{
    return store_q_rows(c, "find jobs past their maximum runtime",
                        "SELECT " ROW_COLS " FROM jobs WHERE state IN (" STORE_STATE(SCHEDULED) ", " STORE_STATE(STARTING) ", "
                        STORE_STATE(RUNNING) ")"
                        " AND started_at IS NOT NULL AND (spec->'stopping'->>'max_runtime_s')::bigint > 0"
                        " AND started_at + (spec->'stopping'->>'max_runtime_s')::bigint * interval '1 second'"
                        "  < now() ORDER BY started_at LIMIT 100", 0, NULL,
                        sizeof(**out), row_fill, (void **)out, n, err);
}

int store_job_log_seq(store_conn_t *c, const char *id, int64_t *out, kiln_err_t *err)
{
    *out = 0;
    PGresult *r = NULL;
    int rc = job_one_row(c, "read the last log seq",
                         "SELECT coalesce((SELECT last_seq FROM log_seqs WHERE job_id = $1::uuid), 0) FROM jobs"
                         " WHERE id = $1::uuid", true, id, &r, err);
    if (rc)
        return rc;
    *out = store_get_i64(r, 0, 0);
    PQclear(r);
    return 0;
}

int store_job_metrics_update(store_conn_t *c, const char *id, int attempt, const char *latest_json,
                             int64_t max_step, double steps_per_s, bool *found, kiln_err_t *err)
{
    static const char *sql =
        "UPDATE jobs SET"
        " metrics = CASE WHEN attempt = $2::int THEN metrics || $3::jsonb ELSE metrics END,"
        " progress_step = CASE WHEN attempt = $2::int THEN GREATEST(progress_step, $4::bigint)"
        "  ELSE progress_step END,"
        " step_time_s = CASE WHEN attempt = $2::int AND $5::float8 > 0 THEN 1 / $5::float8 ELSE step_time_s END,"
        " eta_s = CASE WHEN attempt = $2::int AND $5::float8 > 0 AND total_steps > 0"
        "  THEN GREATEST(total_steps - GREATEST(progress_step, $4::bigint), 0) / $5::float8"
        "  ELSE eta_s END"
        " WHERE id = $1::uuid RETURNING 1";
    char att[16], step[24], rate[40];
    snprintf(att, sizeof(att), "%d", attempt);
    snprintf(step, sizeof(step), "%lld", (long long)max_step);
    snprintf(rate, sizeof(rate), "%.9g", steps_per_s);
    const char *p[5] = {id, att, latest_json, step, rate};
    *found = false;
    if (!store_is_uuid(id))
        return 0;
    PGresult *r = NULL;
    int rc = store_q(c, "update job metrics", sql, 5, p, &r, err);
    if (rc)
        return rc;
    *found = PQntuples(r) == 1;
    PQclear(r);
    return 0;
}

int store_job_state(store_conn_t *c, const char *id, char *state, size_t state_n, char *reason,
                    size_t reason_n, kiln_err_t *err)
{
    state[0] = '\0';
    if (reason_n)
        reason[0] = '\0';
    PGresult *r = NULL;
    int rc = job_one_row(c, "read job state", "SELECT state, reason FROM jobs WHERE id = $1::uuid", false, id, &r,
                         err);
    if (rc)
        return rc;
    kiln_strlcpy(state, store_get_str(r, 0, 0), state_n);
    if (reason_n)
        kiln_strlcpy(reason, store_get_str(r, 0, 1), reason_n);
    PQclear(r);
    return 0;
}

int store_job_state_age(store_conn_t *c, const char *id, double *seconds, kiln_err_t *err)
{
    *seconds = 0;
    const char *p[1] = {id};
    PGresult *r = NULL;
    int rc = store_qp(c, "read job state age",
                      "SELECT extract(epoch FROM clock_timestamp() - updated_at)::float8 FROM jobs WHERE id = $1::uuid",
                      1, p, &r, err);
    if (rc)
        return rc;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return not_found(err, id);
    }
    *seconds = atof(store_get_str(r, 0, 0));
    PQclear(r);
    return 0;
}

int store_job_project(store_conn_t *c, const char *id, char *project, size_t n, kiln_err_t *err)
{
    project[0] = '\0';
    PGresult *r = NULL;
    int rc = job_one_row(c, "read job project", "SELECT project FROM jobs WHERE id = $1::uuid", true, id, &r, err);
    if (rc)
        return rc;
    kiln_strlcpy(project, store_get_str(r, 0, 0), n);
    PQclear(r);
    return 0;
}

int store_job_ids_between(store_conn_t *c, const char *lo, const char *hi, const char *projects, int max,
                          char (*ids)[37], int *n, kiln_err_t *err)
{
    *n = 0;
    char lim[16];
    snprintf(lim, sizeof lim, "%d", max);
    const char *p[4] = {lo, hi, projects, lim};
    PGresult *r = NULL;
    int rc = store_qp(c, "find job ids by prefix",
                      "SELECT id FROM jobs WHERE id BETWEEN $1::uuid AND $2::uuid"
                      " AND ($3::text[] IS NULL OR project = ANY($3::text[])) ORDER BY id LIMIT $4::int",
                      4, p, &r, err);
    if (rc)
        return rc;
    for (int i = 0; i < PQntuples(r) && i < max; i++)
        kiln_strlcpy(ids[(*n)++], store_get_str(r, i, 0), 37);
    PQclear(r);
    return 0;
}

/* Advisory lock key for the scheduler: "kiln" "schd". */
#define SCHED_LOCK_KEY "7596502641281558628"

void store_pass_read_clear(store_pass_read_t *pr)
{
    free(pr->cap);
    free(pr->pending);
    free(pr->snap);
    json_decref(pr->queues);
    json_decref(pr->project_usage);
    free(pr->hold);
    pr->cap = NULL;
    pr->pending = NULL;
    pr->snap = NULL;
    pr->queues = pr->project_usage = NULL;
    pr->hold = NULL;
    pr->ncap = pr->npending = pr->nhold = 0;
    pr->locked = pr->forget = false;
}

int store_sched_pass_read(store_conn_t *c, store_pass_read_t *pr, kiln_err_t *err)
{
    enum { LOCK, WORKERS, PENDING, QUEUES, HOLDING, USAGE, N };
    store_pass_read_clear(pr);
    store_stmt_t st[N];
    st[LOCK] = (store_stmt_t){.what = "take the scheduler lock",
                              .sql = "SELECT pg_try_advisory_lock(" SCHED_LOCK_KEY ")"};
    store_workers_capacity_stmt(&st[WORKERS]);
    int rc = 0;
    if (pr->since)
        rc = pending_changes_stmt(&st[PENDING], pr->since, err);
    else
        pending_all_stmt(&st[PENDING], pr->keep);
    store_queue_defs_stmt(&st[QUEUES]);
    holding_stmt(&st[HOLDING]);
    store_queue_project_usage_stmt(&st[USAGE], pr->half_life_s);
    st[USAGE].r = NULL; /* when not sent */
    if (rc)
        return rc;
    int n = pr->usage ? N : USAGE;
    rc = store_qp_pipeline(c, st, n, err);
    /* a failure after the lock was taken leaves it held (a transaction's end does not release it) */
    pr->locked = st[LOCK].r && store_get_bool(st[LOCK].r, 0, 0);
    if (rc == 0 && pr->locked) { /* each take takes its statement's result, failed or not */
        bool forget = false;
        rc = store_workers_capacity_take(&st[WORKERS], &pr->cap, &pr->ncap, err);
        if (rc == 0)
            rc = pending_take(&st[PENDING], &pr->pending, &pr->npending, &pr->snap, &forget, err);
        pr->forget = forget;
        if (rc == 0)
            rc = store_queue_defs_take(&st[QUEUES], &pr->queues, err);
        if (rc == 0)
            rc = holding_take(&st[HOLDING], &pr->hold, &pr->nhold, err);
        if (rc == 0 && n > USAGE)
            rc = store_queue_project_usage_take(&st[USAGE], &pr->project_usage, err);
    }
    for (int k = 0; k < N; k++) /* what was not taken: another scheduler holds the lock, or an error */
        PQclear(st[k].r);
    if (rc) {
        bool held = pr->locked;
        store_pass_read_clear(pr);
        if (held)
            store_sched_unlock(c);
    }
    return rc;
}

void store_sched_unlock(store_conn_t *c)
{
    store_unlock(c, SCHED_LOCK_KEY);
}

int store_job_restart_set(store_conn_t *c, const char *id, int fresh_attempt, kiln_err_t *err)
{
    char at[16];
    snprintf(at, sizeof at, "%d", fresh_attempt);
    const char *p[2] = {id, at};
    return store_q(c, "set the attempt that starts from step 0",
                   "UPDATE jobs SET fresh_attempt = $2::int, retrained_steps = retrained_steps + progress_step,"
                   " restart_step = progress_step, progress_step = 0, updated_at = now() WHERE id = $1::uuid",
                   2, p, NULL, err);
}

int store_job_pause_set(store_conn_t *c, const char *id, int64_t pause_at, kiln_err_t *err)
{
    char at[24];
    snprintf(at, sizeof at, "%lld", (long long)pause_at);
    const char *p[2] = {id, at};
    return store_q(c, "set the pause step",
                   "UPDATE jobs SET max_attempts = max_attempts + 1, updated_at = now(),"
                   " spec = CASE WHEN $2::bigint > 0 THEN jsonb_set(spec, '{stopping,max_steps}', to_jsonb($2::bigint))"
                   "  ELSE spec #- '{stopping,max_steps}' END WHERE id = $1::uuid",
                   2, p, NULL, err);
}
