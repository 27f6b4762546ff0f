/* code.c - SQL for code archives: the blob of each digest (size, files, which artifact store
 * holds its bytes) and the projects that uploaded it. Where the bytes live is the service's
 * business (service/code.c). */
#include "store/store_int.h"

#include <stdio.h>
#include <string.h>

int store_code_put(store_conn_t *c, const char *project, const char *digest, int64_t size, int files,
                   const char *store_id, const char *uploaded_by, bool *created, kiln_err_t *err)
{
    char sz[24], nf[16];
    snprintf(sz, sizeof(sz), "%lld", (long long)size);
    snprintf(nf, sizeof(nf), "%d", files);
    const char *p[6] = {project, digest, sz, nf, store_id, uploaded_by ? uploaded_by : ""};
    PGresult *r = NULL;
    /* one statement: the blob (kept when it exists), then the project's row */
    int rc = store_q(c, "record a code archive",
                     "WITH b AS (INSERT INTO code_blobs (digest, size, files, store_id)"
                     "  VALUES ($2, $3::bigint, $4::int, $5) ON CONFLICT (digest) DO NOTHING)"
                     " INSERT INTO code_sources (project, digest, uploaded_by) VALUES ($1, $2, $6)"
                     " ON CONFLICT (project, digest) DO NOTHING RETURNING 1",
                     6, p, &r, err);
    if (rc == KILN_EINVAL && strstr(err->message, "code_blobs"))
        rc = KILN_EDB; /* a foreign key race with a blob being recorded: the caller retries */
    if (rc == 0 && created)
        *created = PQntuples(r) == 1;
    PQclear(r);
    return rc;
}

static void code_fill(const PGresult *r, int i, store_code_t *out)
{
    kiln_strlcpy(out->digest, store_get_str(r, i, 0), sizeof(out->digest));
    out->size = store_get_i64(r, i, 1);
    out->files = store_get_int(r, i, 2);
    kiln_strlcpy(out->store_id, store_get_str(r, i, 3), sizeof(out->store_id));
    kiln_strlcpy(out->uploaded_by, store_get_str(r, i, 4), sizeof(out->uploaded_by));
    out->created_us = store_get_i64(r, i, 5);
}

static int code_one(store_conn_t *c, const char *what, const char *sql, int np, const char *const *p,
                    store_code_t *out, kiln_err_t *err)
{
    memset(out, 0, sizeof(*out));
    PGresult *r = NULL;
    int rc = store_q(c, what, sql, np, p, &r, err);
    if (rc == 0 && PQntuples(r) != 1)
        rc = KILN_ENOTFOUND;
    if (rc == 0)
        code_fill(r, 0, out);
    PQclear(r);
    return rc;
}

int store_code_get(store_conn_t *c, const char *project, const char *digest, store_code_t *out, kiln_err_t *err)
{
    const char *p[2] = {project, digest};
    int rc = code_one(c, "read a code archive",
                      "SELECT b.digest, b.size, b.files, b.store_id, s.uploaded_by, " STORE_US("s.created_at")
                      " FROM code_sources s JOIN code_blobs b ON b.digest = s.digest"
                      " WHERE s.project = $1 AND s.digest = $2",
                      2, p, out, err);
    if (rc == KILN_ENOTFOUND)
        kiln_err_set(err, KILN_ENOTFOUND, "digest", "project \"%.64s\" has no code archive %.64s", project, digest);
    return rc;
}

int store_code_blob(store_conn_t *c, const char *digest, store_code_t *out, kiln_err_t *err)
{
    const char *p[1] = {digest};
    int rc = code_one(c, "read a code archive",
                      "SELECT digest, size, files, store_id, '', " STORE_US("created_at")
                      " FROM code_blobs WHERE digest = $1",
                      1, p, out, err);
    if (rc == KILN_ENOTFOUND)
        kiln_err_set(err, KILN_ENOTFOUND, "digest", "kilnd holds no code archive %.64s", digest);
    return rc;
}
