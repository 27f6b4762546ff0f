/* tune.c - tuning jobs (migration 0019): the tuning job row with its events, and its trials with
 * their jobs' state, progress and latest metrics. The service (service/tune.c) validates the
 * request and decides; here rows are stored and read as given. */
#include "store/store_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A tuning job's own columns as JSON text (without its trials). */
#define TUNING_JSON                                                                                       \
    "json_build_object('id', t.id, 'name', t.name, 'project', t.project, 'state', t.state,"              \
    " 'reason', t.reason, 'spec', t.spec, 'next_trial', t.next_trial, 'submitted_by', t.submitted_by,"   \
    " 'created_at', " STORE_US("t.created_at") ", 'updated_at', " STORE_US("t.updated_at") ","          \
    " 'ended_at', " STORE_US("t.ended_at") ")::text"

/* Turns the microsecond times of o into RFC 3339 text (null stays null). */
static void times_text(json_t *o)
{
    static const char *const keys[] = {"created_at", "updated_at", "ended_at", "time"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(keys); i++) {
        json_t *v = json_object_get(o, keys[i]);
        if (!v || !json_is_integer(v))
            continue;
        char buf[40];
        kiln_time_format(json_integer_value(v), buf, sizeof buf);
        json_object_set_new(o, keys[i], json_string(buf));
    }
}

/* r's first column (a JSON object a row) as an array in *out, each object's times as text when
 * `times`, and column count_col (>= 0) added as "trial_count"; clears r. */
static int rows_array(PGresult *r, bool times, int count_col, json_t **out, kiln_err_t *err)
{
    json_t *arr = json_array();
    for (int i = 0; arr && i < PQntuples(r); i++) {
        json_t *o = store_get_json(r, i, 0, NULL);
        if (times)
            times_text(o);
        if (count_col >= 0)
            json_object_set_new(o, "trial_count", json_integer(store_get_i64(r, i, count_col)));
        json_array_append_new(arr, o);
    }
    PQclear(r);
    if (!arr)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    *out = arr;
    return 0;
}

int store_tuning_insert(store_conn_t *c, const char *name, const char *project, const char *spec_json,
                        const char *submitted_by, const char *reason, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    static const char *sql =
        "WITH t AS (INSERT INTO tuning_jobs (id, name, project, spec, state, reason, submitted_by)"
        " SELECT gen_random_uuid(), $1::text, $2::text, $3::jsonb, " STORE_TUNING_STATE(RUNNING) ", $4::text, $5::text"
        " WHERE EXISTS (SELECT 1 FROM projects WHERE name = $2::text)"
        /* its trials' queue lets the project in, its row locked as a job's insert locks it
         * (store_job_insert): a change of the queue's projects, which counts the running tuning
         * jobs it would leave out, either waits for this one or is seen by it */
        "  AND EXISTS (SELECT 1 FROM queues WHERE name = $3::jsonb -> 'job' ->> 'queue'"
        "   AND (projects ? '*' OR projects ? $2::text) FOR KEY SHARE)"
        " RETURNING *),"
        " e AS (INSERT INTO tuning_events (tuning_id, seq, from_state, to_state, reason, actor)"
        "  SELECT id, 1, NULL, " STORE_TUNING_STATE(RUNNING) ", $4::text, $5::text FROM t)"
        " SELECT " TUNING_JSON " FROM t";
    const char *p[5] = {name, project, spec_json, reason, submitted_by};
    PGresult *r = NULL;
    for (int attempt = 0;; attempt++) {
        int rc = store_q(c, "insert tuning job", sql, 5, p, &r, err);
        if (rc)
            return rc;
        if (PQntuples(r) == 1)
            break;
        /* the project does not exist, or the queue of its trials does not let it in */
        PQclear(r);
        r = NULL;
        json_t *spec = json_loads(spec_json, 0, NULL);
        const char *queue = json_string_value(json_object_get(json_object_get(spec, "job"), "queue"));
        rc = store_insert_no_project(c, project, err);
        if (rc == 0)
            rc = store_insert_no_queue(c, project, queue ? queue : "", err);
        json_decref(spec);
        if (rc)
            return rc;
        if (attempt > 0)
            return kiln_err_set(err, KILN_EDB, NULL, "could not insert tuning job: the statement inserted nothing "
                                "twice, although its project exists and its queue lets it in");
    }
    *out = store_get_json(r, 0, 0, NULL);
    times_text(*out);
    PQclear(r);
    return 0;
}

int store_tuning_get_json(store_conn_t *c, const char *id, bool for_update, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    const char *p[1] = {id};
    PGresult *r = NULL;
    int rc = store_q(c, "read tuning job",
                     for_update ? "SELECT " TUNING_JSON " FROM tuning_jobs t WHERE t.id = $1::uuid FOR UPDATE"
                                : "SELECT " TUNING_JSON " FROM tuning_jobs t WHERE t.id = $1::uuid",
                     1, p, &r, err);
    if (rc)
        return rc;
    if (PQntuples(r) != 1) {
        PQclear(r);
        kiln_err_set(err, KILN_ENOTFOUND, "id", "tuning job \"%.80s\" not found", id);
        kiln_err_hint(err, "`kiln tune list` (GET /v1/tuning-jobs) lists the tuning jobs you can see");
        return KILN_ENOTFOUND;
    }
    *out = store_get_json(r, 0, 0, NULL);
    times_text(*out);
    PQclear(r);
    return 0;
}

int store_tuning_trials_json(store_conn_t *c, const char *id, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    const char *p[1] = {id};
    PGresult *r = NULL;
    int rc = store_q(c, "read trials",
                     "SELECT json_build_object('trial', t.trial, 'job_id', t.job_id, 'parameters', t.parameters,"
                     " 'rung', t.rung, 'rung_objectives', t.rung_objectives, 'job_state', j.state,"
                     " 'job_reason', j.reason, 'steps', j.progress_step, 'total_steps', j.total_steps,"
                     " 'retrained_steps', j.retrained_steps,"
                     " 'metrics', j.metrics, 'attempt', j.attempt, 'stop_reason', t.stop_reason)::text"
                     " FROM tuning_trials t JOIN jobs j ON j.id = t.job_id WHERE t.tuning_id = $1::uuid"
                     " ORDER BY t.trial",
                     1, p, &r, err);
    if (rc)
        return rc;
    return rows_array(r, false, -1, out, err);
}

int store_tuning_events_json(store_conn_t *c, const char *id, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    const char *p[1] = {id};
    PGresult *r = NULL;
    int rc = store_q(c, "read tuning events",
                     "SELECT json_build_object('seq', seq, 'time', " STORE_US("at") ", 'from_state', from_state,"
                     " 'to_state', to_state, 'reason', reason, 'actor', actor)::text"
                     " FROM tuning_events WHERE tuning_id = $1::uuid ORDER BY seq",
                     1, p, &r, err);
    if (rc)
        return rc;
    return rows_array(r, true, -1, out, err);
}

/* The list's SELECT up to its WHERE: each tuning job's trial counts by state and its best trial,
 * over its own trials and its warm start parents' (the parents' first on a tie, as the service's
 * tune_best); its last two columns are created_at in microseconds and the id, for the cursor. */
#define TUNING_LIST_SELECT                                                                                    \
    "SELECT " TUNING_JSON ", n.total, n.done, n.running,"                                                     \
    " CASE WHEN b.job_id IS NULL THEN NULL ELSE json_build_object('job_id', b.job_id, 'objective',"           \
    "  b.obj)::text END, " STORE_US("t.created_at") ", t.id::text"                                            \
    " FROM tuning_jobs t"                                                                                     \
    " CROSS JOIN LATERAL (SELECT count(*) AS total,"                                                          \
    "  count(*) FILTER (WHERE j.state IN " STORE_ENDED ") AS done,"                                           \
    "  count(*) FILTER (WHERE j.state NOT IN (" STORE_ENDED_NAMES ", " STORE_PARKED_NAMES ")) AS running"     \
    "  FROM tuning_trials x JOIN jobs j ON j.id = x.job_id WHERE x.tuning_id = t.id) n"                       \
    " LEFT JOIN LATERAL (SELECT x.job_id, (j.metrics->>(t.spec->'objective'->>'metric'))::float8 AS obj,"      \
    "  x.tuning_id <> t.id AS from_parent"                                                                    \
    "  FROM tuning_trials x JOIN jobs j ON j.id = x.job_id"                                                   \
    "  WHERE (x.tuning_id = t.id OR x.tuning_id::text IN"                                                     \
    "   (SELECT jsonb_array_elements_text(coalesce(t.spec->'warm_start'->'parents', '[]'::jsonb))))"           \
    "   AND j.state <> " STORE_STATE(FAILED)                                                                  \
    "   AND jsonb_typeof(j.metrics->(t.spec->'objective'->>'metric')) = 'number'"                             \
    "  ORDER BY CASE WHEN t.spec->'objective'->>'goal' = 'maximize'"                                          \
    "   THEN -(j.metrics->>(t.spec->'objective'->>'metric'))::float8"                                         \
    "   ELSE (j.metrics->>(t.spec->'objective'->>'metric'))::float8 END,"                                     \
    "   (x.tuning_id <> t.id) DESC, x.trial LIMIT 1) b ON true"                                               \
    " WHERE ($1::text[] IS NULL OR t.project = ANY($1::text[]))"

int store_tuning_list_json(store_conn_t *c, const char *projects, int limit, const json_t *after, json_t **out,
                           json_t **next, kiln_err_t *err)
{
    *out = NULL;
    *next = NULL;
    if (after && !store_tuning_cursor_ok(after)) {
        kiln_err_set(err, KILN_EINVAL, "page_token", "page token does not fit this listing");
        kiln_err_hint(err, "pass next_page_token from the previous page of GET /v1/tuning-jobs unchanged");
        return KILN_EINVAL;
    }
    char lim[16], us[24];
    /* one row more than the page: whether another page follows */
    snprintf(lim, sizeof lim, "%d", limit + 1);
    if (after)
        snprintf(us, sizeof us, "%lld", (long long)json_integer_value(json_object_get(after, "t")));
    const char *after_id = after ? json_string_value(json_object_get(after, "id")) : NULL;
    const char *p[4] = {projects, lim, after ? us : NULL, after_id};
    PGresult *r = NULL;
    /* the keyset: the rows after the cursor's (created_at, id) in the order of the page */
    int rc = after ? store_q(c, "list tuning jobs",
                             TUNING_LIST_SELECT
                             " AND (t.created_at, t.id) < (timestamptz 'epoch' + $3::bigint * interval '1 microsecond',"
                             " $4::uuid)"
                             " ORDER BY t.created_at DESC, t.id DESC LIMIT $2::int",
                             4, p, &r, err)
                   : store_q(c, "list tuning jobs",
                             TUNING_LIST_SELECT " ORDER BY t.created_at DESC, t.id DESC LIMIT $2::int", 2, p, &r, err);
    if (rc)
        return rc;
    int rows = PQntuples(r);
    if (rows > limit) {
        *next = json_pack("{s:I, s:s}", "t", (json_int_t)store_get_i64(r, limit - 1, 5), "id",
                          store_get_str(r, limit - 1, 6));
        if (!*next) {
            PQclear(r);
            return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        }
    }
    json_t *arr = NULL;
    json_t *extra = json_array();
    for (int i = 0; extra && i < rows; i++)
        json_array_append_new(extra, json_pack("{s:I, s:I, s:o}", "trials_done", (json_int_t)store_get_i64(r, i, 2),
                                               "trials_running", (json_int_t)store_get_i64(r, i, 3), "best",
                                               PQgetisnull(r, i, 4) ? json_null() : store_get_json(r, i, 4, NULL)));
    if (!extra) {
        PQclear(r);
        json_decref(*next);
        *next = NULL;
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    rc = rows_array(r, true, 1, &arr, err);
    size_t i;
    json_t *o;
    json_array_foreach(arr, i, o) json_object_update(o, json_array_get(extra, i));
    json_decref(extra);
    /* the row beyond the page only told that more follow */
    if (rc == 0 && rows > limit)
        json_array_remove(arr, (size_t)limit);
    if (rc) {
        json_decref(*next);
        *next = NULL;
    }
    *out = arr;
    return rc;
}

int store_tuning_active(store_conn_t *c, char (**ids)[STORE_ID_LEN], int *n, kiln_err_t *err)
{
    *ids = NULL;
    *n = 0;
    PGresult *r = NULL;
    int rc = store_q(c, "list active tuning jobs",
                     "SELECT id::text FROM tuning_jobs WHERE state IN (" STORE_TUNING_ACTIVE_NAMES ") ORDER BY created_at",
                     0, NULL, &r, err);
    if (rc)
        return rc;
    int rows = PQntuples(r);
    if (rows > 0) {
        *ids = calloc((size_t)rows, STORE_ID_LEN);
        if (!*ids) {
            PQclear(r);
            return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        }
        for (int i = 0; i < rows; i++)
            kiln_strlcpy((*ids)[i], store_get_str(r, i, 0), STORE_ID_LEN);
        *n = rows;
    }
    PQclear(r);
    return 0;
}

int store_tuning_set_state(store_conn_t *c, const char *id, const char *from, const char *to, const char *reason,
                           const char *actor, bool ended, kiln_err_t *err)
{
    const char *p[6] = {id, from, to, reason, actor, ended ? "t" : "f"};
    PGresult *r = NULL;
    int rc = store_q(c, "change tuning job state",
                     "WITH t AS (UPDATE tuning_jobs SET state = $3::text, reason = $4::text, updated_at = now(),"
                     "  ended_at = CASE WHEN $6::bool THEN now() ELSE ended_at END"
                     "  WHERE id = $1::uuid AND state = $2::text RETURNING id)"
                     " INSERT INTO tuning_events (tuning_id, seq, from_state, to_state, reason, actor)"
                     " SELECT t.id, (SELECT coalesce(max(seq), 0) + 1 FROM tuning_events WHERE tuning_id = t.id),"
                     "  $2::text, $3::text, $4::text, $5::text FROM t RETURNING seq",
                     6, p, &r, err);
    if (rc)
        return rc;
    int rows = PQntuples(r);
    PQclear(r);
    if (rows != 1)
        return kiln_err_set(err, KILN_ESTATE, NULL, "tuning job %s is no longer %s", id, from);
    return 0;
}

int store_tuning_trial_insert(store_conn_t *c, const char *tuning_id, int trial, const char *job_id,
                              const char *params_json, int rung, kiln_err_t *err)
{
    char tr[16], rg[16];
    snprintf(tr, sizeof tr, "%d", trial);
    snprintf(rg, sizeof rg, "%d", rung);
    const char *p[5] = {tuning_id, tr, job_id, params_json, rg};
    int rc = store_q(c, "record trial",
                     "WITH t AS (INSERT INTO tuning_trials (tuning_id, trial, job_id, parameters, rung)"
                     " VALUES ($1::uuid, $2::int, $3::uuid, $4::jsonb, $5::int) RETURNING tuning_id)"
                     " UPDATE tuning_jobs SET next_trial = greatest(next_trial, $2::int + 1), updated_at = now()"
                     " WHERE id = $1::uuid",
                     5, p, NULL, err);
    return rc;
}

int store_tuning_trial_rung(store_conn_t *c, const char *tuning_id, int trial, int rung,
                            const char *rung_objectives_json, kiln_err_t *err)
{
    char tr[16], rg[16];
    snprintf(tr, sizeof tr, "%d", trial);
    snprintf(rg, sizeof rg, "%d", rung);
    const char *p[4] = {tuning_id, tr, rg, rung_objectives_json};
    return store_q(c, "record trial rung",
                   "UPDATE tuning_trials SET rung = $3::int, rung_objectives = coalesce($4::jsonb, rung_objectives)"
                   " WHERE tuning_id = $1::uuid AND trial = $2::int",
                   4, p, NULL, err);
}

int store_tuning_curves_json(store_conn_t *c, const char *id, const char *metric, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    const char *p[2] = {id, metric};
    PGresult *r = NULL;
    int rc = store_q(c, "read trial curves",
                     "SELECT json_object_agg(x.trial::text, x.curve)::text FROM ("
                     " SELECT t.trial, json_build_object('steps', array_agg(pt.step ORDER BY pt.step),"
                     "  'values', array_agg(pt.val ORDER BY pt.step)) AS curve"
                     " FROM tuning_trials t JOIN jobs j ON j.id = t.job_id"
                     " CROSS JOIN LATERAL (SELECT DISTINCT ON (u.step) u.step, u.val"
                     "  FROM metric_chunks m, unnest(m.steps, m.vals) AS u(step, val)"
                     "  WHERE m.job_id = t.job_id AND m.name = $2::text"
                     "   AND u.val NOT IN ('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8)"
                     "  ORDER BY u.step, m.attempt DESC, m.rank, m.id DESC) pt"
                     " WHERE t.tuning_id = $1::uuid AND j.state NOT IN (" STORE_STATE(FAILED) ", " STORE_STATE(STOPPED) ", "
                     STORE_STATE(STOPPING) ")"
                     " GROUP BY t.trial) x",
                     2, p, &r, err);
    if (rc)
        return rc;
    *out = PQntuples(r) == 1 && !PQgetisnull(r, 0, 0) ? store_get_json(r, 0, 0, NULL) : json_object();
    PQclear(r);
    if (!*out)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    return 0;
}

int store_tuning_trial_stopped(store_conn_t *c, const char *tuning_id, int trial, const char *reason, kiln_err_t *err)
{
    char tr[16];
    snprintf(tr, sizeof tr, "%d", trial);
    const char *p[3] = {tuning_id, tr, reason};
    return store_q(c, "record trial stopped early",
                   "UPDATE tuning_trials SET stop_reason = $3::text WHERE tuning_id = $1::uuid AND trial = $2::int", 3,
                   p, NULL, err);
}
