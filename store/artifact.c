/* artifact.c - SQL for artifacts (the rows of a job's uploaded files: declared size and
 * SHA-256, how much the store holds, which store), the artifact store's trash list, and the
 * lifecycle statements: deleting a job with every row that belongs to it, and the log
 * retention's batches. Where the bytes live on disk is the service's business. */
#include "store/store_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ART_COLS "name, attempt, worker_id, size, sha256, state, received, store_id, " \
                 STORE_US("created_at") ", " STORE_US("completed_at")

static void art_fill(const PGresult *r, int i, void *elem)
{
    store_artifact_t *a = elem;
    kiln_strlcpy(a->name, store_get_str(r, i, 0), sizeof(a->name));
    a->attempt = store_get_int(r, i, 1);
    kiln_strlcpy(a->worker_id, store_get_str(r, i, 2), sizeof(a->worker_id));
    a->size = store_get_i64(r, i, 3);
    kiln_strlcpy(a->sha256, store_get_str(r, i, 4), sizeof(a->sha256));
    a->complete = !strcmp(store_get_str(r, i, 5), "COMPLETE");
    a->received = store_get_i64(r, i, 6);
    kiln_strlcpy(a->store_id, store_get_str(r, i, 7), sizeof(a->store_id));
    a->created_us = store_get_i64(r, i, 8);
    a->completed_us = store_get_i64(r, i, 9);
}

int store_artifacts_of(store_conn_t *c, const char *job_id, bool lock, store_artifact_t **out, int *n,
                       kiln_err_t *err)
{
    *out = NULL;
    *n = 0;
    if (!store_is_uuid(job_id))
        return 0;
    const char *p[1] = {job_id};
    return store_q_rows(c, "read a job's artifacts",
                        lock ? "SELECT " ART_COLS " FROM artifacts WHERE job_id = $1::uuid ORDER BY name FOR UPDATE"
                             : "SELECT " ART_COLS " FROM artifacts WHERE job_id = $1::uuid ORDER BY name",
                        1, p, sizeof(store_artifact_t), art_fill, (void **)out, n, err);
}

int store_artifact_get(store_conn_t *c, const char *job_id, const char *name, bool lock, store_artifact_t *out,
                       kiln_err_t *err)
{
    memset(out, 0, sizeof(*out));
    const char *p[2] = {job_id, name};
    PGresult *r = NULL;
    int rc = store_is_uuid(job_id)
                 ? store_q(c, "read an artifact",
                           lock ? "SELECT " ART_COLS " FROM artifacts WHERE job_id = $1::uuid AND name = $2 FOR UPDATE"
                                : "SELECT " ART_COLS " FROM artifacts WHERE job_id = $1::uuid AND name = $2",
                           2, p, &r, err)
                 : KILN_ENOTFOUND;
    if (rc == 0 && PQntuples(r) != 1)
        rc = KILN_ENOTFOUND;
    if (rc == 0)
        art_fill(r, 0, out);
    PQclear(r);
    if (rc == KILN_ENOTFOUND)
        kiln_err_set(err, KILN_ENOTFOUND, "name", "job %.40s has no artifact \"%.128s\"", job_id, name);
    return rc;
}

int store_artifact_put(store_conn_t *c, const char *job_id, const store_artifact_t *a, kiln_err_t *err)
{
    char attempt[16], size[24], received[24];
    snprintf(attempt, sizeof(attempt), "%d", a->attempt);
    snprintf(size, sizeof(size), "%lld", (long long)a->size);
    snprintf(received, sizeof(received), "%lld", (long long)a->received);
    const char *p[9] = {job_id, a->name, attempt, a->worker_id, size, a->sha256,
                        a->complete ? "COMPLETE" : "UPLOADING", received, a->store_id};
    return store_q(c, "record an artifact",
                   "INSERT INTO artifacts (job_id, name, attempt, worker_id, size, sha256, state, received, store_id,"
                   " created_at, completed_at)"
                   " VALUES ($1::uuid, $2, $3::int, $4, $5::bigint, $6, $7, $8::bigint, $9, now(),"
                   "  CASE WHEN $7 = 'COMPLETE' THEN now() END)"
                   " ON CONFLICT (job_id, name) DO UPDATE SET attempt = EXCLUDED.attempt,"
                   "  worker_id = EXCLUDED.worker_id, size = EXCLUDED.size, sha256 = EXCLUDED.sha256,"
                   "  state = EXCLUDED.state, received = EXCLUDED.received, store_id = EXCLUDED.store_id,"
                   "  created_at = EXCLUDED.created_at, completed_at = EXCLUDED.completed_at",
                   9, p, NULL, err);
}

int store_artifact_delete(store_conn_t *c, const char *job_id, const char *name, kiln_err_t *err)
{
    const char *p[2] = {job_id, name};
    return store_q(c, "remove an artifact", "DELETE FROM artifacts WHERE job_id = $1::uuid AND name = $2", 2, p,
                   NULL, err);
}

int store_artifact_progress(store_conn_t *c, const char *job_id, const char *name, int64_t received, bool complete,
                            kiln_err_t *err)
{
    char rec[24];
    snprintf(rec, sizeof(rec), "%lld", (long long)received);
    const char *p[4] = {job_id, name, rec, complete ? "COMPLETE" : "UPLOADING"};
    return store_q(c, "record an artifact's progress",
                   "UPDATE artifacts SET received = $3::bigint, state = $4,"
                   " completed_at = CASE WHEN $4 = 'COMPLETE' THEN now() END"
                   " WHERE job_id = $1::uuid AND name = $2",
                   4, p, NULL, err);
}

/* ---- the trash ----------------------------------------------------------------------------- */

int store_artifact_trash_add(store_conn_t *c, const char *store_id, const char *job_id, int attempt, kiln_err_t *err)
{
    char at[16];
    snprintf(at, sizeof(at), "%d", attempt);
    const char *p[3] = {store_id, job_id, at};
    return store_q(c, "queue artifact files for removal",
                   "INSERT INTO artifact_trash (store_id, job_id, attempt) VALUES ($1, $2::uuid, $3::int)"
                   " ON CONFLICT DO NOTHING",
                   3, p, NULL, err);
}

static void trash_fill(const PGresult *r, int i, void *elem)
{
    store_trash_t *t = elem;
    kiln_strlcpy(t->job_id, store_get_str(r, i, 0), sizeof(t->job_id));
    t->attempt = store_get_int(r, i, 1);
}

int store_artifact_trash_list(store_conn_t *c, const char *store_id, int limit, store_trash_t **out, int *n,
                              kiln_err_t *err)
{
    char lim[16];
    snprintf(lim, sizeof(lim), "%d", limit);
    const char *p[2] = {store_id, lim};
    return store_q_rows(c, "read the artifact trash",
                        "SELECT job_id::text, attempt FROM artifact_trash WHERE store_id = $1"
                        " ORDER BY queued_at LIMIT $2::int",
                        2, p, sizeof(store_trash_t), trash_fill, (void **)out, n, err);
}

int store_artifact_trash_done(store_conn_t *c, const char *store_id, const store_trash_t *t, kiln_err_t *err)
{
    char at[16];
    snprintf(at, sizeof(at), "%d", t->attempt);
    const char *p[3] = {store_id, t->job_id, at};
    return store_q(c, "clear an artifact trash entry",
                   "DELETE FROM artifact_trash WHERE store_id = $1 AND job_id = $2::uuid AND attempt = $3::int", 3, p,
                   NULL, err);
}
