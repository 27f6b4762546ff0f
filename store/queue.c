/* queue.c - queues (migration 0016): create, read (with each queue's usage, pending and admitted counts),
 * update and delete, and the projects' recent usage the scheduler orders fair queues by. The
 * service (service/queue.c) validates the fields; here they are stored as given. */
#include "store/store_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* One queue as JSON text, in the shape GET /v1/queues answers: its fields and, from n (COUNTS
 * below, NULL when none of its jobs waits or holds slots), its usage, pending and admitted. */
#define QUEUE_FIELDS                                                                                \
    "'name', q.name, 'cohort', q.cohort, 'quota', q.quota,"                                         \
    " 'borrowing_limit', q.borrowing_limit, 'lending_limit', q.lending_limit, 'weight', q.weight,"  \
    " 'projects', q.projects, 'fair_sharing', q.fair_sharing,"                                      \
    " 'preemption', json_build_object('within_queue', q.preempt_within_queue,"                     \
    "  'reclaim_within_cohort', q.reclaim_within_cohort),"                                          \
    " 'created_at', " STORE_US("q.created_at") ", 'created_by', q.created_by,"                    \
    " 'updated_at', " STORE_US("q.updated_at")
#define QUEUE_JSON                                                                                  \
    "json_build_object(" QUEUE_FIELDS ","                                                           \
    " 'usage', json_build_object('cpu', coalesce(n.cpu, 0), 'gpu', coalesce(n.gpu, 0)),"            \
    " 'pending', coalesce(n.pending, 0), 'admitted', coalesce(n.admitted, 0))::text"
/* Every queue's counts in one pass over the jobs that wait or hold slots (not one per queue). */
#define COUNTS                                                                                      \
    "(SELECT j.queue,"                                                                              \
    "  sum(j.nodes * j.slots_per_node) FILTER (WHERE j.slot_type = 'cpu' AND j.state IN " STORE_HOLDING ") AS cpu," \
    "  sum(j.nodes * j.slots_per_node) FILTER (WHERE j.slot_type = 'gpu' AND j.state IN " STORE_HOLDING ") AS gpu," \
    "  count(*) FILTER (WHERE j.state IN " STORE_WAITING ") AS pending,"                            \
    "  count(*) FILTER (WHERE j.state IN " STORE_HOLDING ") AS admitted"                            \
    " FROM jobs j WHERE j.state IN (" STORE_HOLDING_NAMES ", " STORE_WAITING_NAMES ")"              \
    "  AND ($1::text IS NULL OR j.queue = $1) GROUP BY j.queue) n"

static int rows_json(PGresult *r, json_t **out, kiln_err_t *err)
{
    json_t *arr = json_array();
    for (int i = 0; arr && i < PQntuples(r); i++) {
        json_t *o = store_get_json(r, i, 0, NULL);
        static const char *const times[] = {"created_at", "updated_at"};
        for (int t = 0; t < 2; t++) {
            char buf[40];
            kiln_time_format(json_integer_value(json_object_get(o, times[t])), buf, sizeof buf);
            json_object_set_new(o, times[t], json_string(buf));
        }
        json_array_append_new(arr, o);
    }
    PQclear(r);
    if (!arr)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    *out = arr;
    return 0;
}

int store_queues_json(store_conn_t *c, const char *name, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    const char *p[1] = {name};
    PGresult *r = NULL;
    int rc = store_q(c, "list queues",
                     "SELECT " QUEUE_JSON " FROM queues q LEFT JOIN " COUNTS " ON n.queue = q.name"
                     " WHERE $1::text IS NULL OR q.name = $1 ORDER BY q.name", 1, p, &r, err);
    if (rc)
        return rc;
    if (name && PQntuples(r) == 0) {
        PQclear(r);
        kiln_err_set(err, KILN_ENOTFOUND, "name", "queue \"%.80s\" does not exist", name);
        kiln_err_hint(err, "kiln queues list shows the queues");
        return KILN_ENOTFOUND;
    }
    return rows_json(r, out, err);
}

void store_queue_defs_stmt(store_stmt_t *s)
{
    *s = (store_stmt_t){.what = "list queues",
                        .sql = "SELECT json_build_object(" QUEUE_FIELDS ")::text FROM queues q ORDER BY q.name"};
}

int store_queue_defs_take(store_stmt_t *s, json_t **out, kiln_err_t *err)
{
    return rows_json(store_stmt_take(s), out, err);
}

int store_queue_defs_json(store_conn_t *c, const char *cohort_of, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    store_stmt_t s;
    store_queue_defs_stmt(&s);
    if (cohort_of) {
        const char *p[1] = {cohort_of};
        s.sql = "SELECT json_build_object(" QUEUE_FIELDS ")::text FROM queues q"
                " WHERE q.name = $1 OR q.cohort = (SELECT cohort FROM queues WHERE name = $1 AND cohort <> '')"
                " ORDER BY q.name";
        s.nparams = 1;
        s.params = p;
        int rc = store_qp_pipeline(c, &s, 1, err);
        return rc ? rc : store_queue_defs_take(&s, out, err);
    }
    int rc = store_qp_pipeline(c, &s, 1, err);
    return rc ? rc : store_queue_defs_take(&s, out, err);
}

/* The text of a JSON field of q, or NULL when absent or null. Caller frees. */
static char *field_text(const json_t *q, const char *key)
{
    const json_t *v = json_object_get(q, key);
    return v && !json_is_null(v) ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
}

/* The statement parameters of q's fields, in the order insert and update take them: name,
 * cohort, quota, borrowing_limit, lending_limit, weight, projects, fair_sharing,
 * preemption.within_queue, preemption.reclaim_within_cohort (QUEUE_NPARAMS). The texts are
 * malloc'd into own[0..4) (caller frees); weight is written into wbuf. */
#define QUEUE_NPARAMS 10
static void queue_params(const json_t *q, const char *p[QUEUE_NPARAMS], char *own[4], char wbuf[32])
{
    static const char *const keys[] = {"quota", "borrowing_limit", "lending_limit", "projects"};
    for (int i = 0; i < 4; i++)
        own[i] = field_text(q, keys[i]);
    snprintf(wbuf, 32, "%.17g", json_number_value(json_object_get(q, "weight")));
    p[0] = json_string_value(json_object_get(q, "name"));
    p[1] = json_string_value(json_object_get(q, "cohort"));
    p[2] = own[0];
    p[3] = own[1] ? own[1] : "{}";
    p[4] = own[2] ? own[2] : "{}";
    p[5] = wbuf;
    p[6] = own[3] ? own[3] : "[]";
    p[7] = json_is_true(json_object_get(q, "fair_sharing")) ? "true" : "false";
    const json_t *pre = json_object_get(q, "preemption");
    p[8] = json_string_value(json_object_get(pre, "within_queue"));
    p[9] = json_string_value(json_object_get(pre, "reclaim_within_cohort"));
}

int store_queue_insert(store_conn_t *c, const json_t *q, const char *created_by, kiln_err_t *err)
{
    const char *p[QUEUE_NPARAMS + 1];
    char *own[4], weight[32];
    queue_params(q, p, own, weight);
    p[QUEUE_NPARAMS] = created_by ? created_by : "";
    int rc = store_q(c, "create queue",
                     "INSERT INTO queues (name, cohort, quota, borrowing_limit, lending_limit, weight, projects,"
                     " fair_sharing, preempt_within_queue, reclaim_within_cohort, created_by)"
                     " VALUES ($1, $2, $3::jsonb, $4::jsonb, $5::jsonb, $6::float8, $7::jsonb, $8::boolean,"
                     " $9, $10, $11)",
                     QUEUE_NPARAMS + 1, p, NULL, err);
    if (rc == KILN_EEXIST)
        kiln_err_set(err, KILN_EEXIST, "name", "queue \"%.80s\" already exists", p[0]);
    for (int i = 0; i < 4; i++)
        free(own[i]);
    return rc;
}

int store_queue_update(store_conn_t *c, const json_t *q, kiln_err_t *err)
{
    const char *p[QUEUE_NPARAMS];
    char *own[4], weight[32];
    queue_params(q, p, own, weight);
    PGresult *r = NULL;
    int rc = store_q(c, "update queue",
                     "UPDATE queues SET cohort = $2, quota = $3::jsonb, borrowing_limit = $4::jsonb,"
                     " lending_limit = $5::jsonb, weight = $6::float8, projects = $7::jsonb, fair_sharing = $8::boolean,"
                     " preempt_within_queue = $9, reclaim_within_cohort = $10, updated_at = now() WHERE name = $1",
                     QUEUE_NPARAMS, p, &r, err);
    if (rc == 0) {
        if (strcmp(PQcmdTuples(r), "1") != 0)
            rc = kiln_err_set(err, KILN_ENOTFOUND, "name", "queue \"%.80s\" does not exist", p[0]);
        PQclear(r);
    }
    for (int i = 0; i < 4; i++)
        free(own[i]);
    return rc;
}

int store_queue_lock(store_conn_t *c, const char *name, bool exclusive, kiln_err_t *err)
{
    const char *p[1] = {name};
    PGresult *r = NULL;
    int rc = store_q(c, "lock queue", exclusive ? "SELECT 1 FROM queues WHERE name = $1 FOR UPDATE"
                                                : "SELECT 1 FROM queues WHERE name = $1 FOR SHARE",
                     1, p, &r, err);
    if (rc == 0)
        PQclear(r);
    return rc;
}

int store_queue_default_of(store_conn_t *c, const char *name, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    const char *p[1] = {name};
    PGresult *r = NULL;
    int rc = store_q(c, "read projects' default queues", "SELECT name FROM projects WHERE default_queue = $1 ORDER BY name",
                     1, p, &r, err);
    if (rc)
        return rc;
    *out = json_array();
    for (int i = 0; i < PQntuples(r); i++)
        json_array_append_new(*out, json_string(store_get_str(r, i, 0)));
    PQclear(r);
    return 0;
}

int store_queue_jobs_left_out(store_conn_t *c, const char *name, const json_t *projects, json_t **out,
                              kiln_err_t *err)
{
    *out = NULL;
    char *text = json_dumps(projects, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    const char *p[2] = {name, text};
    PGresult *r = NULL;
    int rc = store_q(c, "read the jobs a queue's projects leave out",
                     "SELECT project, sum(waiting), sum(holding), sum(paused), sum(tuning) FROM ("
                     " SELECT project, count(*) FILTER (WHERE state IN " STORE_WAITING ") AS waiting,"
                     "  count(*) FILTER (WHERE state IN " STORE_HOLDING ") AS holding,"
                     "  count(*) FILTER (WHERE state IN (" STORE_PARKED_NAMES ")) AS paused, 0 AS tuning"
                     " FROM jobs WHERE queue = $1"
                     "  AND state IN (" STORE_WAITING_NAMES ", " STORE_HOLDING_NAMES ", " STORE_PARKED_NAMES ")"
                     "  AND NOT ($2::jsonb ? '*' OR $2::jsonb ? project)"
                     " GROUP BY project"
                     /* a running tuning job submits its next trials (ordinary jobs) to its queue */
                     " UNION ALL SELECT project, 0, 0, 0, count(*) FROM tuning_jobs"
                     "  WHERE state = " STORE_TUNING_STATE(RUNNING) " AND spec -> 'job' ->> 'queue' = $1"
                     "  AND NOT ($2::jsonb ? '*' OR $2::jsonb ? project)"
                     " GROUP BY project) x"
                     " GROUP BY project ORDER BY project",
                     2, p, &r, err);
    free(text);
    if (rc)
        return rc;
    *out = json_array();
    for (int i = 0; *out && i < PQntuples(r); i++)
        json_array_append_new(*out, json_pack("{s:s, s:I, s:I, s:I, s:I}", "project", store_get_str(r, i, 0),
                                              "waiting", (json_int_t)store_get_i64(r, i, 1), "running",
                                              (json_int_t)store_get_i64(r, i, 2), "paused",
                                              (json_int_t)store_get_i64(r, i, 3), "tuning",
                                              (json_int_t)store_get_i64(r, i, 4)));
    PQclear(r);
    return *out ? 0 : kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
}

int store_queue_delete(store_conn_t *c, const char *name, kiln_err_t *err)
{
    const char *p[1] = {name};
    PGresult *r = NULL;
    /* One statement: the queue goes only while none of its jobs waits, runs or is paused (a
     * paused trial promoted later goes back to its queue, which must still exist). Its caller
     * holds the queue's row FOR UPDATE (store_queue_lock) from before it, so that the counts see
     * every job and tuning job whose insert locked the row first. */
    int rc = store_q(c, "delete queue",
                     "WITH busy AS (SELECT count(*) AS n, count(*) FILTER (WHERE state IN (" STORE_PARKED_NAMES "))"
                     "   AS paused FROM jobs WHERE queue = $1"
                     "   AND state IN (" STORE_WAITING_NAMES ", " STORE_HOLDING_NAMES ", " STORE_PARKED_NAMES ")),"
                     " dflt AS (SELECT count(*) AS n, min(name) AS project FROM projects WHERE default_queue = $1),"
                     /* a running tuning job submits its next trials to its queue */
                     " tun AS (SELECT count(*) AS n FROM tuning_jobs WHERE state = " STORE_TUNING_STATE(RUNNING)
                     "  AND spec -> 'job' ->> 'queue' = $1),"
                     " d AS (DELETE FROM queues WHERE name = $1 AND (SELECT n FROM busy) = 0 AND (SELECT n FROM dflt) = 0"
                     "  AND (SELECT n FROM tun) = 0 RETURNING 1)"
                     " SELECT (SELECT n FROM busy), (SELECT count(*) FROM d), (SELECT count(*) FROM queues WHERE name = $1),"
                     "  (SELECT paused FROM busy), (SELECT n FROM dflt), (SELECT project FROM dflt), (SELECT n FROM tun)",
                     1, p, &r, err);
    if (rc)
        return rc;
    int64_t busy = store_get_i64(r, 0, 0), deleted = store_get_i64(r, 0, 1), exists = store_get_i64(r, 0, 2);
    int64_t paused = store_get_i64(r, 0, 3), dflt = store_get_i64(r, 0, 4), tuning = store_get_i64(r, 0, 6);
    char project[64];
    kiln_strlcpy(project, store_get_str(r, 0, 5), sizeof project);
    PQclear(r);
    if (deleted == 1)
        return 0;
    if (!exists) {
        kiln_err_set(err, KILN_ENOTFOUND, "name", "queue \"%.80s\" does not exist", name);
        return KILN_ENOTFOUND;
    }
    if (busy == 0 && tuning > 0) {
        kiln_err_set(err, KILN_ESTATE, "name", "queue \"%.80s\" has %lld running tuning job(s) that submit their next "
                     "trials to it", name, (long long)tuning);
        kiln_err_hint(err, "stop them (kiln tune stop) or wait until they end, then delete the queue");
        return KILN_ESTATE;
    }
    if (busy == 0) {
        kiln_err_set(err, KILN_ESTATE, "name", "queue \"%.80s\" is the default queue of project \"%s\"%s", name,
                     project, dflt > 1 ? " and others" : "");
        kiln_err_hint(err, "give the project another default queue first: kiln projects update %s --default-queue "
                           "QUEUE", project);
        return KILN_ESTATE;
    }
    if (paused)
        kiln_err_set(err, KILN_ESTATE, "name", "queue \"%.80s\" has %lld job(s) waiting, running or paused (%lld paused)",
                     name, (long long)busy, (long long)paused);
    else
        kiln_err_set(err, KILN_ESTATE, "name", "queue \"%.80s\" has %lld job(s) waiting or running", name,
                     (long long)busy);
    kiln_err_hint(err, paused ? "stop them (a paused trial waits for its tuning job to promote or end it) or wait until "
                                "they end, then delete the queue"
                              : "stop them or wait until they end, then delete the queue");
    return KILN_ESTATE;
}

void store_queue_project_usage_stmt(store_stmt_t *s, double half_life_s)
{
    /* held now, plus each job's slots integrated over its run with a decay of tau, divided by tau
     * (a job that ran all along with n slots counts n); runs that ended ten tau ago count nothing */
    *s = (store_stmt_t){.what = "read projects' recent usage",
                        .sql = "SELECT json_object_agg(queue, projects)::text FROM ("
                               " SELECT queue, json_object_agg(project, u) AS projects FROM ("
                               "  SELECT queue, project, sum(nodes * slots_per_node * ("
                               "   CASE WHEN state IN " STORE_HOLDING " THEN 1 ELSE 0 END"
                               "   + CASE WHEN started_at IS NULL THEN 0 ELSE"
                               "     exp(-extract(epoch FROM now() - coalesce(ended_at, now())) / $1::float8)"
                               "     - exp(-extract(epoch FROM now() - started_at) / $1::float8) END)) AS u"
                               "  FROM jobs WHERE queue IN (SELECT name FROM queues WHERE fair_sharing)"
                               "   AND (state IN " STORE_HOLDING
                               "    OR ended_at > now() - make_interval(secs => 10 * $1::float8))"
                               "  GROUP BY queue, project) per_project GROUP BY queue) per_queue",
                        .nparams = 1, .params = s->p};
    snprintf(s->buf[0], sizeof s->buf[0], "%.6g", half_life_s / 0.6931471805599453);
    s->p[0] = s->buf[0];
}

int store_queue_project_usage_take(store_stmt_t *s, json_t **out, kiln_err_t *err)
{
    PGresult *r = store_stmt_take(s);
    *out = store_get_json(r, 0, 0, NULL);
    PQclear(r);
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = json_object();
    }
    return *out ? 0 : kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
}

int store_queue_project_usage(store_conn_t *c, double half_life_s, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    store_stmt_t s;
    store_queue_project_usage_stmt(&s, half_life_s);
    int rc = store_qp_pipeline(c, &s, 1, err);
    return rc ? rc : store_queue_project_usage_take(&s, out, err);
}
