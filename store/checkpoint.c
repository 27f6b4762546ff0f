/* checkpoint.c - SQL for a job's synced checkpoint directory: its contents (checkpoint_blobs, one
 * row per SHA-256 the store holds or is receiving for the job) and its files (checkpoint_files:
 * the SYNCED state kilnd holds whole, and the PENDING state an agent is uploading). Where the
 * bytes live on disk is the service's business. */
#include "store/store_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOB_COLS "sha256, size, received, complete, store_id"
#define FILE_COLS "name, sha256, size, attempt, worker_id, " STORE_US("synced_at")

static void blob_fill(const PGresult *r, int i, void *elem)
{
    store_ckpt_blob_t *b = elem;
    kiln_strlcpy(b->sha256, store_get_str(r, i, 0), sizeof(b->sha256));
    b->size = store_get_i64(r, i, 1);
    b->received = store_get_i64(r, i, 2);
    b->complete = store_get_bool(r, i, 3);
    kiln_strlcpy(b->store_id, store_get_str(r, i, 4), sizeof(b->store_id));
}

static void file_fill(const PGresult *r, int i, void *elem)
{
    store_ckpt_file_t *f = elem;
    kiln_strlcpy(f->name, store_get_str(r, i, 0), sizeof(f->name));
    kiln_strlcpy(f->sha256, store_get_str(r, i, 1), sizeof(f->sha256));
    f->size = store_get_i64(r, i, 2);
    f->attempt = store_get_int(r, i, 3);
    kiln_strlcpy(f->worker_id, store_get_str(r, i, 4), sizeof(f->worker_id));
    f->synced_us = store_get_i64(r, i, 5);
}

int store_ckpt_files(store_conn_t *c, const char *job_id, bool synced, store_ckpt_file_t **out, int *n,
                     kiln_err_t *err)
{
    *out = NULL;
    *n = 0;
    if (!store_is_uuid(job_id))
        return 0;
    const char *p[2] = {job_id, synced ? "SYNCED" : "PENDING"};
    return store_q_rows(c, "read a job's checkpoint files",
                        "SELECT " FILE_COLS " FROM checkpoint_files WHERE job_id = $1::uuid AND state = $2"
                        " ORDER BY name",
                        2, p, sizeof(store_ckpt_file_t), file_fill, (void **)out, n, err);
}

int store_ckpt_file_get(store_conn_t *c, const char *job_id, const char *name, bool synced, store_ckpt_file_t *out,
                        kiln_err_t *err)
{
    memset(out, 0, sizeof(*out));
    const char *p[3] = {job_id, synced ? "SYNCED" : "PENDING", name};
    store_ckpt_file_t *rows = NULL;
    int n = 0;
    int rc = store_is_uuid(job_id)
                 ? store_q_rows(c, "read a checkpoint file",
                                "SELECT " FILE_COLS " FROM checkpoint_files WHERE job_id = $1::uuid"
                                " AND state = $2 AND name = $3",
                                3, p, sizeof(store_ckpt_file_t), file_fill, (void **)&rows, &n, err)
                 : 0;
    if (rc == 0 && n != 1)
        rc = kiln_err_set(err, KILN_ENOTFOUND, "name", synced ? "job %.40s has no synced checkpoint file \"%.512s\""
                                                              : "job %.40s is not syncing a checkpoint file \"%.512s\"",
                          job_id, name);
    if (rc == 0)
        *out = rows[0];
    free(rows);
    return rc;
}

int store_ckpt_pending_set(store_conn_t *c, const char *job_id, int attempt, const char *worker_id,
                           const store_ckpt_file_t *files, int n, const char *store_id, kiln_err_t *err)
{
    char at[16];
    snprintf(at, sizeof(at), "%d", attempt);
    const char *p0[1] = {job_id};
    int rc = store_q(c, "drop a job's pending checkpoint state",
                     "DELETE FROM checkpoint_files WHERE job_id = $1::uuid AND state = 'PENDING'", 1, p0, NULL, err);
    for (int i = 0; i < n && rc == 0; i++) {
        char size[24];
        snprintf(size, sizeof(size), "%lld", (long long)files[i].size);
        const char *pb[4] = {job_id, files[i].sha256, size, store_id};
        rc = store_q(c, "record a checkpoint content",
                     "INSERT INTO checkpoint_blobs (job_id, sha256, size, received, complete, store_id)"
                     " VALUES ($1::uuid, $2, $3::bigint, 0, $3::bigint = 0, $4) ON CONFLICT DO NOTHING",
                     4, pb, NULL, err);
        const char *pf[6] = {job_id, files[i].name, files[i].sha256, size, at, worker_id};
        if (rc == 0)
            rc = store_q(c, "record a pending checkpoint file",
                         "INSERT INTO checkpoint_files (job_id, state, name, sha256, size, attempt, worker_id)"
                         " VALUES ($1::uuid, 'PENDING', $2, $3, $4::bigint, $5::int, $6)",
                         6, pf, NULL, err);
    }
    return rc;
}

int store_ckpt_blob_get(store_conn_t *c, const char *job_id, const char *sha256, bool lock, store_ckpt_blob_t *out,
                        kiln_err_t *err)
{
    memset(out, 0, sizeof(*out));
    const char *p[2] = {job_id, sha256};
    store_ckpt_blob_t *rows = NULL;
    int n = 0;
    int rc = store_is_uuid(job_id)
                 ? store_q_rows(c, "read a checkpoint content",
                                lock ? "SELECT " BLOB_COLS " FROM checkpoint_blobs WHERE job_id = $1::uuid"
                                       " AND sha256 = $2 FOR UPDATE"
                                     : "SELECT " BLOB_COLS " FROM checkpoint_blobs WHERE job_id = $1::uuid"
                                       " AND sha256 = $2",
                                2, p, sizeof(store_ckpt_blob_t), blob_fill, (void **)&rows, &n, err)
                 : 0;
    if (rc == 0 && n != 1)
        rc = kiln_err_set(err, KILN_ENOTFOUND, "sha256", "job %.40s holds no checkpoint content %.16s...", job_id,
                          sha256);
    if (rc == 0)
        *out = rows[0];
    free(rows);
    return rc;
}

int store_ckpt_blob_progress(store_conn_t *c, const char *job_id, const char *sha256, int64_t received,
                             bool complete, const char *store_id, kiln_err_t *err)
{
    char rec[24];
    snprintf(rec, sizeof(rec), "%lld", (long long)received);
    const char *p[5] = {job_id, sha256, rec, complete ? "true" : "false", store_id};
    return store_q(c, "record a checkpoint content's progress",
                   "UPDATE checkpoint_blobs SET received = $3::bigint, complete = $4::boolean, store_id = $5"
                   " WHERE job_id = $1::uuid AND sha256 = $2",
                   5, p, NULL, err);
}

int store_ckpt_commit(store_conn_t *c, const char *job_id, kiln_err_t *err)
{
    const char *p[1] = {job_id};
    /* a file whose content did not change keeps the attempt and worker that wrote it */
    int rc = store_q(c, "carry over unchanged checkpoint files",
                     "UPDATE checkpoint_files p SET attempt = s.attempt, worker_id = s.worker_id"
                     " FROM checkpoint_files s WHERE p.job_id = $1::uuid AND p.state = 'PENDING'"
                     " AND s.job_id = $1::uuid AND s.state = 'SYNCED' AND s.name = p.name AND s.sha256 = p.sha256",
                     1, p, NULL, err);
    if (rc == 0)
        rc = store_q(c, "drop the synced checkpoint state",
                     "DELETE FROM checkpoint_files WHERE job_id = $1::uuid AND state = 'SYNCED'", 1, p, NULL, err);
    if (rc == 0)
        rc = store_q(c, "make the pending checkpoint state the synced one",
                     "UPDATE checkpoint_files SET state = 'SYNCED', synced_at = now()"
                     " WHERE job_id = $1::uuid AND state = 'PENDING'",
                     1, p, NULL, err);
    return rc;
}

int store_ckpt_blobs_prune(store_conn_t *c, const char *job_id, store_ckpt_blob_t **out, int *n, kiln_err_t *err)
{
    *out = NULL;
    *n = 0;
    const char *p[1] = {job_id};
    return store_q_rows(c, "drop checkpoint contents no file names",
                        "DELETE FROM checkpoint_blobs b WHERE b.job_id = $1::uuid AND NOT EXISTS"
                        " (SELECT 1 FROM checkpoint_files f WHERE f.job_id = b.job_id AND f.sha256 = b.sha256)"
                        " RETURNING " BLOB_COLS,
                        1, p, sizeof(store_ckpt_blob_t), blob_fill, (void **)out, n, err);
}

int store_ckpt_blobs(store_conn_t *c, const char *job_id, store_ckpt_blob_t **out, int *n, kiln_err_t *err)
{
    *out = NULL;
    *n = 0;
    if (!store_is_uuid(job_id))
        return 0;
    const char *p[1] = {job_id};
    return store_q_rows(c, "read a job's checkpoint contents",
                        "SELECT " BLOB_COLS " FROM checkpoint_blobs WHERE job_id = $1::uuid ORDER BY sha256", 1, p,
                        sizeof(store_ckpt_blob_t), blob_fill, (void **)out, n, err);
}
