/* trust.c - SQL for what an agent is trusted with: join tokens managed by cluster admins (their
 * uses consumed one UPDATE at a time, so replicas never hand out more than a token allows), the
 * approval and removal of workers, and bans on worker ids and client certificates. Registration
 * itself and the worker list are worker.c's; worker credentials are auth.c's. */
#include "store/store_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- join tokens ------------------------------------------------------------------------------ */

#define JOIN_COLS "id, description, uses, uses_left, registrations, " STORE_US("created_at") ", created_by, " \
                  STORE_US("expires_at") ", " STORE_US("revoked_at") ", " STORE_US("last_used_at") ","      \
                  " CASE WHEN revoked_at IS NOT NULL THEN 'revoked' WHEN expires_at <= now() THEN 'expired'"  \
                  " WHEN uses_left = 0 THEN 'used_up' ELSE 'active' END"

static json_t *join_json(const PGresult *r, int i)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(store_get_str(r, i, 0)));
    json_object_set_new(o, "description", json_string(store_get_str(r, i, 1)));
    json_object_set_new(o, "uses", json_integer(store_get_int(r, i, 2)));
    json_object_set_new(o, "uses_left", json_integer(store_get_int(r, i, 3)));
    json_object_set_new(o, "registrations", json_integer(store_get_int(r, i, 4)));
    store_json_set_time(o, "created_at", r, i, 5);
    json_object_set_new(o, "created_by", json_string(store_get_str(r, i, 6)));
    store_json_set_time(o, "expires_at", r, i, 7);
    store_json_set_time(o, "revoked_at", r, i, 8);
    store_json_set_time(o, "last_used_at", r, i, 9);
    json_object_set_new(o, "state", json_string(store_get_str(r, i, 10)));
    return o;
}

int store_join_token_insert(store_conn_t *c, const char *id, const uint8_t hash[STORE_HASH_LEN],
                            const char *description, int uses, int64_t expires_us, const char *created_by,
                            json_t **out, kiln_err_t *err)
{
    char hb[2 * STORE_HASH_LEN + 3], u[16], exp[24];
    snprintf(u, sizeof(u), "%d", uses);
    snprintf(exp, sizeof(exp), "%lld", (long long)expires_us);
    const char *p[6] = {id, store_hash_param(hash, hb), description ? description : "", u, exp,
                        created_by ? created_by : ""};
    PGresult *r = NULL;
    *out = NULL;
    int rc = store_q(c, "create join token",
                     "INSERT INTO join_tokens (id, hash, description, uses, uses_left, expires_at, created_by)"
                     " VALUES ($1, $2::bytea, $3, $4::int, $4::int, to_timestamp($5::bigint / 1e6), $6)"
                     " RETURNING " JOIN_COLS, 6, p, &r, err);
    if (rc)
        return rc;
    *out = join_json(r, 0);
    PQclear(r);
    return 0;
}

int store_join_tokens_list_json(store_conn_t *c, json_t **out, kiln_err_t *err)
{
    PGresult *r = NULL;
    *out = NULL;
    int rc = store_q(c, "list join tokens", "SELECT " JOIN_COLS " FROM join_tokens ORDER BY created_at, id", 0,
                     NULL, &r, err);
    if (rc)
        return rc;
    json_t *arr = json_array();
    for (int i = 0; i < PQntuples(r); i++)
        json_array_append_new(arr, join_json(r, i));
    PQclear(r);
    *out = arr;
    return 0;
}

int store_join_token_revoke(store_conn_t *c, const char *id, json_t **out, kiln_err_t *err)
{
    const char *p[1] = {id};
    PGresult *r = NULL;
    *out = NULL;
    int rc = store_q(c, "revoke join token",
                     "UPDATE join_tokens SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1"
                     " RETURNING " JOIN_COLS, 1, p, &r, err);
    if (rc)
        return rc;
    if (PQntuples(r) == 1)
        *out = join_json(r, 0);
    PQclear(r);
    if (!*out)
        return kiln_err_set(err, KILN_ENOTFOUND, "id", "join token \"%.40s\" not found", id);
    return 0;
}

int store_join_token_find(store_conn_t *c, const uint8_t hash[STORE_HASH_LEN], store_join_t *out, kiln_err_t *err)
{
    char hb[2 * STORE_HASH_LEN + 3];
    const char *p[1] = {store_hash_param(hash, hb)};
    PGresult *r = NULL;
    memset(out, 0, sizeof(*out));
    int rc = store_q(c, "find join token",
                     "SELECT id, CASE WHEN revoked_at IS NOT NULL THEN 'revoked' WHEN expires_at <= now() THEN"
                     " 'expired' WHEN uses_left = 0 THEN 'used_up' ELSE 'active' END FROM join_tokens"
                     " WHERE hash = $1::bytea", 1, p, &r, err);
    if (rc)
        return rc;
    int n = PQntuples(r);
    if (n == 1) {
        kiln_strlcpy(out->id, store_get_str(r, 0, 0), sizeof(out->id));
        kiln_strlcpy(out->state, store_get_str(r, 0, 1), sizeof(out->state));
    }
    PQclear(r);
    if (n != 1)
        return kiln_err_set(err, KILN_ENOTFOUND, NULL, "no join token has this hash");
    return 0;
}

int store_join_token_consume(store_conn_t *c, const char *id, bool *consumed, kiln_err_t *err)
{
    const char *p[1] = {id};
    PGresult *r = NULL;
    *consumed = false;
    int rc = store_q(c, "use join token",
                     "UPDATE join_tokens SET uses_left = uses_left - 1, registrations = registrations + 1,"
                     " last_used_at = now() WHERE id = $1 AND uses_left > 0 AND revoked_at IS NULL"
                     " AND expires_at > now() RETURNING uses_left", 1, p, &r, err);
    if (rc)
        return rc;
    *consumed = PQntuples(r) == 1;
    PQclear(r);
    return 0;
}

/* ---- approval, removal and bans --------------------------------------------------------------- */

int store_worker_approve(store_conn_t *c, const char *id, const char *by, bool *changed, kiln_err_t *err)
{
    const char *p[2] = {id, by ? by : ""};
    PGresult *r = NULL;
    *changed = false;
    int rc = store_q(c, "approve worker",
                     "WITH old AS (SELECT approval FROM workers WHERE id = $1 AND removed_at IS NULL)"
                     " UPDATE workers SET approval = 'APPROVED',"
                     "  approved_by = CASE WHEN approval = 'PENDING' THEN $2 ELSE approved_by END,"
                     "  approved_at = CASE WHEN approval = 'PENDING' THEN now() ELSE approved_at END"
                     " WHERE id = $1 AND removed_at IS NULL RETURNING (SELECT approval FROM old)", 2, p, &r, err);
    if (rc)
        return rc;
    int n = PQntuples(r);
    if (n == 1)
        *changed = strcmp(store_get_str(r, 0, 0), "PENDING") == 0;
    PQclear(r);
    if (n != 1)
        return kiln_err_set(err, KILN_ENOTFOUND, "id", "worker \"%.64s\" not found", id);
    return 0;
}

int store_worker_remove(store_conn_t *c, const char *id, const char *by, store_worker_removed_t *out,
                        kiln_err_t *err)
{
    char reason[200];
    snprintf(reason, sizeof(reason), "removed by %.64s", by && *by ? by : "a cluster admin");
    const char *p[3] = {id, by ? by : "", reason};
    PGresult *r = NULL;
    memset(out, 0, sizeof(*out));
    /* removed_at and removed_by stay those of the first removal (a second one adds a ban) */
    int rc = store_q(c, "remove worker",
                     "WITH old AS (SELECT removed_at FROM workers WHERE id = $1)"
                     " UPDATE workers SET state = 'DEAD', credential_hash = NULL, draining = false,"
                     "  state_reason = CASE WHEN removed_at IS NULL THEN $3 ELSE state_reason END,"
                     "  removed_by = CASE WHEN removed_at IS NULL THEN $2 ELSE removed_by END,"
                     "  removed_at = coalesce(removed_at, now())"
                     " WHERE id = $1 RETURNING coalesce(cert_sha256, ''), hostname, " STORE_US("removed_at") ","
                     " removed_by, (SELECT removed_at IS NOT NULL FROM old)", 3, p, &r, err);
    if (rc)
        return rc;
    int n = PQntuples(r);
    if (n == 1) {
        kiln_strlcpy(out->cert_sha256, store_get_str(r, 0, 0), sizeof(out->cert_sha256));
        kiln_strlcpy(out->hostname, store_get_str(r, 0, 1), sizeof(out->hostname));
        out->removed_us = store_get_i64(r, 0, 2);
        kiln_strlcpy(out->removed_by, store_get_str(r, 0, 3), sizeof(out->removed_by));
        out->already = store_get_bool(r, 0, 4);
    }
    PQclear(r);
    if (n != 1)
        return kiln_err_set(err, KILN_ENOTFOUND, "id", "worker \"%.64s\" not found", id);
    return 0;
}

#define BAN_COLS "id, coalesce(worker_id, ''), coalesce(cert_sha256, ''), reason, banned_by, " STORE_US("banned_at")

static json_t *ban_json(const PGresult *r, int i)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_integer(store_get_i64(r, i, 0)));
    json_object_set_new(o, "worker_id", json_string(store_get_str(r, i, 1)));
    json_object_set_new(o, "cert_sha256", json_string(store_get_str(r, i, 2)));
    json_object_set_new(o, "reason", json_string(store_get_str(r, i, 3)));
    json_object_set_new(o, "banned_by", json_string(store_get_str(r, i, 4)));
    store_json_set_time(o, "banned_at", r, i, 5);
    return o;
}

int store_ban_insert(store_conn_t *c, const char *worker_id, const char *cert_sha256, const char *reason,
                     const char *by, json_t **out, kiln_err_t *err)
{
    const char *p[4] = {worker_id && *worker_id ? worker_id : NULL, cert_sha256 && *cert_sha256 ? cert_sha256 : NULL,
                        reason ? reason : "", by ? by : ""};
    PGresult *r = NULL;
    *out = NULL;
    int rc = store_q(c, "ban worker",
                     "INSERT INTO worker_bans (worker_id, cert_sha256, reason, banned_by) VALUES ($1, $2, $3, $4)"
                     " RETURNING " BAN_COLS, 4, p, &r, err);
    if (rc)
        return rc;
    *out = ban_json(r, 0);
    PQclear(r);
    return 0;
}

int store_bans_list_json(store_conn_t *c, json_t **out, kiln_err_t *err)
{
    PGresult *r = NULL;
    *out = NULL;
    int rc = store_q(c, "list worker bans", "SELECT " BAN_COLS " FROM worker_bans ORDER BY id", 0, NULL, &r, err);
    if (rc)
        return rc;
    json_t *arr = json_array();
    for (int i = 0; i < PQntuples(r); i++)
        json_array_append_new(arr, ban_json(r, i));
    PQclear(r);
    *out = arr;
    return 0;
}

int store_ban_delete(store_conn_t *c, int64_t id, json_t **out, kiln_err_t *err)
{
    char idb[24];
    snprintf(idb, sizeof(idb), "%lld", (long long)id);
    const char *p[1] = {idb};
    PGresult *r = NULL;
    *out = NULL;
    int rc = store_q(c, "lift worker ban", "DELETE FROM worker_bans WHERE id = $1::bigint RETURNING " BAN_COLS, 1, p,
                     &r, err);
    if (rc)
        return rc;
    if (PQntuples(r) == 1)
        *out = ban_json(r, 0);
    PQclear(r);
    if (!*out)
        return kiln_err_set(err, KILN_ENOTFOUND, "id", "worker ban %lld not found", (long long)id);
    return 0;
}

int store_ban_find(store_conn_t *c, const char *worker_id, const char *cert_sha256, int64_t *ban_id,
                   bool *by_cert, kiln_err_t *err)
{
    const char *p[2] = {worker_id && *worker_id ? worker_id : NULL, cert_sha256 && *cert_sha256 ? cert_sha256 : NULL};
    PGresult *r = NULL;
    *ban_id = 0;
    *by_cert = false;
    int rc = store_q(c, "check worker bans",
                     "SELECT id, cert_sha256 IS NOT DISTINCT FROM $2 AND $2 IS NOT NULL FROM worker_bans"
                     " WHERE worker_id = $1 OR cert_sha256 = $2 ORDER BY id LIMIT 1", 2, p, &r, err);
    if (rc)
        return rc;
    if (PQntuples(r) == 1) {
        *ban_id = store_get_i64(r, 0, 0);
        *by_cert = store_get_bool(r, 0, 1);
    }
    PQclear(r);
    return 0;
}

int store_worker_cert_holder(store_conn_t *c, const char *cert_sha256, const char *except_id, char *holder,
                             size_t n, kiln_err_t *err)
{
    const char *p[2] = {cert_sha256, except_id ? except_id : ""};
    PGresult *r = NULL;
    holder[0] = '\0';
    /* Serialises registrations with this certificate across kilnd replicas until commit, so
     * two of them cannot both find it free. */
    int rc = store_q(c, "lock certificate", "SELECT pg_advisory_xact_lock(hashtextextended('kiln-cert:' || $1, 0))",
                     1, p, &r, err);
    if (rc)
        return rc;
    PQclear(r);
    rc = store_q(c, "find certificate holder",
                 "SELECT id FROM workers WHERE cert_sha256 = $1 AND id <> $2 AND state = 'ALIVE'"
                 " AND removed_at IS NULL ORDER BY id LIMIT 1", 2, p, &r, err);
    if (rc)
        return rc;
    if (PQntuples(r) == 1)
        kiln_strlcpy(holder, store_get_str(r, 0, 0), n);
    PQclear(r);
    return 0;
}
