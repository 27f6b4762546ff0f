/* lifecycle.c - SQL for the end of a job's life: deleting a job with every row of it, wherever
 * migrations put them (every table with a job_id uuid column, children before parents), and
 * the log retention's bounded batches under an advisory lock one kilnd holds at a time. */
#include "store/store_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIFE_MAX_TABLES 64
/* Advisory lock key of the clean-up pass: "kiln" "jntr". */
#define JANITOR_LOCK_KEY "7596502641282183794"

typedef struct life_table {
    char oid[16];
    char quoted[160];            /* the name as format('%I') quotes it */
    char name[128];
    bool done;
} life_table_t;

/* Whether some table not yet emptied (other than t) has a foreign key into t. */
static bool life_referenced(const life_table_t *tabs, int n, const PGresult *edges, int t)
{
    for (int e = 0; e < PQntuples(edges); e++) {
        const char *from = PQgetvalue(edges, e, 0), *to = PQgetvalue(edges, e, 1);
        if (strcmp(to, tabs[t].oid) != 0 || !strcmp(from, tabs[t].oid))
            continue;
        for (int k = 0; k < n; k++)
            if (!tabs[k].done && k != t && !strcmp(tabs[k].oid, from))
                return true;
    }
    return false;
}

int store_job_delete(store_conn_t *c, const char *job_id, json_t **removed, kiln_err_t *err)
{
    *removed = NULL;
    if (!store_is_uuid(job_id))
        return kiln_err_set(err, KILN_ENOTFOUND, "id", "job \"%.80s\" not found", job_id);
    PGresult *r = NULL, *edges = NULL;
    life_table_t *tabs = NULL;
    int rc = store_q(c, "find the tables that hold job rows",
                     "SELECT c.oid::text, format('%I', c.relname), c.relname"
                     " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
                     " WHERE a.attname = 'job_id' AND a.atttypid = 'uuid'::regtype AND NOT a.attisdropped"
                     "  AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
                     "  AND c.relnamespace = to_regnamespace(current_schema())"
                     "  AND c.relname <> 'artifact_trash'"   /* the store's to-do list, not the job's rows */
                     " ORDER BY c.relname",
                     0, NULL, &r, err);
    if (rc == 0)
        rc = store_q(c, "read foreign keys", "SELECT conrelid::text, confrelid::text FROM pg_constraint WHERE contype = 'f'",
                     0, NULL, &edges, err);
    if (rc)
        goto done;
    int n = KILN_MIN(PQntuples(r), LIFE_MAX_TABLES);
    tabs = calloc((size_t)KILN_MAX(n, 1), sizeof(*tabs));
    if (!tabs) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        kiln_strlcpy(tabs[i].oid, PQgetvalue(r, i, 0), sizeof(tabs[i].oid));
        kiln_strlcpy(tabs[i].quoted, PQgetvalue(r, i, 1), sizeof(tabs[i].quoted));
        kiln_strlcpy(tabs[i].name, PQgetvalue(r, i, 2), sizeof(tabs[i].name));
    }
    *removed = json_object();
    const char *p[1] = {job_id};
    for (int left = n; left > 0;) {
        int pick = -1;
        for (int t = 0; t < n && pick < 0; t++)
            if (!tabs[t].done && !life_referenced(tabs, n, edges, t))
                pick = t;
        if (pick < 0) /* a cycle of foreign keys: take them in name order, the database will say */
            for (int t = 0; t < n && pick < 0; t++)
                if (!tabs[t].done)
                    pick = t;
        char sql[256], what[200];
        snprintf(sql, sizeof(sql), "DELETE FROM %s WHERE job_id = $1::uuid", tabs[pick].quoted);
        snprintf(what, sizeof(what), "delete the job's rows from %s", tabs[pick].name);
        PGresult *d = NULL;
        rc = store_q(c, what, sql, 1, p, &d, err);
        if (rc)
            goto done;
        long long rows = atoll(PQcmdTuples(d));
        PQclear(d);
        if (rows > 0)
            json_object_set_new(*removed, tabs[pick].name, json_integer(rows));
        tabs[pick].done = true;
        left--;
    }
    PGresult *j = NULL;
    rc = store_q(c, "delete the job", "DELETE FROM jobs WHERE id = $1::uuid", 1, p, &j, err);
    if (rc == 0 && atoll(PQcmdTuples(j)) != 1)
        rc = kiln_err_set(err, KILN_ENOTFOUND, "id", "job \"%s\" not found", job_id);
    PQclear(j);
done:
    if (rc) {
        json_decref(*removed);
        *removed = NULL;
    }
    free(tabs);
    PQclear(r);
    PQclear(edges);
    return rc;
}

int store_job_init_dependent(store_conn_t *c, const char *job_id, const char *projects, char *by, char *by_project,
                             kiln_err_t *err)
{
    by[0] = by_project[0] = '\0';
    char ref[64];
    snprintf(ref, sizeof(ref), "job:%s", job_id);
    const char *p[2] = {ref, projects};
    PGresult *r = NULL;
    int rc = store_q(c, "find jobs that start from a job's model",
                     "SELECT id::text, project FROM jobs WHERE spec->'model'->>'init_from' = $1"
                     " AND state NOT IN " STORE_ENDED
                     " ORDER BY ($2::text[] IS NULL OR project = ANY($2::text[])) DESC LIMIT 1",
                     2, p, &r, err);
    if (rc)
        return rc;
    if (PQntuples(r) == 1) {
        kiln_strlcpy(by, PQgetvalue(r, 0, 0), STORE_ID_LEN);
        kiln_strlcpy(by_project, PQgetvalue(r, 0, 1), 64);
    }
    PQclear(r);
    return 0;
}

/* ---- log retention -------------------------------------------------------------------------- */

static void ref_fill(const PGresult *r, int i, void *elem)
{
    store_job_ref_t *j = elem;
    kiln_strlcpy(j->id, store_get_str(r, i, 0), sizeof(j->id));
}

int store_logs_expired_jobs(store_conn_t *c, int days, int limit, store_job_ref_t **out, int *n, kiln_err_t *err)
{
    char d[16], lim[16];
    snprintf(d, sizeof(d), "%d", days);
    snprintf(lim, sizeof(lim), "%d", limit);
    const char *p[2] = {d, lim};
    return store_q_rows(c, "find jobs whose logs have expired",
                        "SELECT id::text FROM jobs WHERE ended_at IS NOT NULL AND logs_expired_at IS NULL"
                        " AND ended_at < now() - make_interval(days => $1::int)"
                        " AND state IN " STORE_ENDED
                        " ORDER BY ended_at LIMIT $2::int",
                        2, p, sizeof(store_job_ref_t), ref_fill, (void **)out, n, err);
}

int store_logs_delete_batch(store_conn_t *c, const char *job_id, int limit, int64_t *deleted, kiln_err_t *err)
{
    char lim[16];
    snprintf(lim, sizeof(lim), "%d", limit);
    const char *p[2] = {job_id, lim};
    PGresult *r = NULL;
    *deleted = 0;
    int rc = store_q(c, "drop a batch of expired log lines",
                     "DELETE FROM logs WHERE job_id = $1::uuid AND seq IN"
                     " (SELECT seq FROM logs WHERE job_id = $1::uuid ORDER BY seq LIMIT $2::int)",
                     2, p, &r, err);
    if (rc == 0)
        *deleted = atoll(PQcmdTuples(r));
    PQclear(r);
    return rc;
}

int store_job_logs_expired(store_conn_t *c, const char *job_id, kiln_err_t *err)
{
    const char *p[1] = {job_id};
    return store_q(c, "record that a job's logs expired", "UPDATE jobs SET logs_expired_at = now() WHERE id = $1::uuid",
                   1, p, NULL, err);
}

int store_janitor_lock(store_conn_t *c, bool *got, kiln_err_t *err)
{
    PGresult *r = NULL;
    *got = false;
    int rc = store_q(c, "take the clean-up lock", "SELECT pg_try_advisory_lock(" JANITOR_LOCK_KEY ")", 0, NULL, &r,
                     err);
    if (rc)
        return rc;
    *got = store_get_bool(r, 0, 0);
    PQclear(r);
    return 0;
}

void store_janitor_unlock(store_conn_t *c)
{
    store_unlock(c, JANITOR_LOCK_KEY);
}
