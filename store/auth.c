/* auth.c - SQL for identity and tenancy: users, API tokens (only their hashes), projects and
 * their members, and agents' credentials (hashes too). Which caller may do what is service/'s
 * business; this file only reads and writes the rows. */
#include "store/store_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A hash as a bytea parameter in hex form ("\x0a1b..."); buf has room for 2 + 2 * 32 + 1. */

/* Unix microseconds (0: none) as a timestamptz parameter expression's argument. */
static const char *us_param(int64_t us, char *buf, size_t n)
{
    if (us <= 0)
        return NULL;
    snprintf(buf, n, "%lld", (long long)us);
    return buf;
}

#define US_TO_TS(p) "(timestamptz 'epoch' + " p "::bigint * interval '1 microsecond')"

/* ---- users ------------------------------------------------------------------------------- */

int store_user_insert(store_conn_t *c, const char *name, bool cluster_admin, const char *created_by,
                      kiln_err_t *err)
{
    const char *p[3] = {name, cluster_admin ? "true" : "false", created_by ? created_by : ""};
    int rc = store_q(c, "create user",
                     "INSERT INTO users (name, cluster_admin, created_by) VALUES ($1, $2::bool, $3)",
                     3, p, NULL, err);
    if (rc == KILN_EEXIST) {
        kiln_err_set(err, KILN_EEXIST, "name", "user \"%s\" already exists", name);
        kiln_err_hint(err, "pick another name, or create a token for the existing user");
    }
    return rc;
}

int store_user_get(store_conn_t *c, const char *name, bool *cluster_admin, kiln_err_t *err)
{
    const char *p[1] = {name};
    PGresult *r = NULL;
    int rc = store_q(c, "read user", "SELECT cluster_admin FROM users WHERE name = $1", 1, p, &r, err);
    if (rc)
        return rc;
    int n = PQntuples(r);
    if (n == 1 && cluster_admin)
        *cluster_admin = store_get_bool(r, 0, 0);
    PQclear(r);
    if (n != 1)
        return kiln_err_set(err, KILN_ENOTFOUND, "user", "user \"%s\" not found", name);
    return 0;
}

int store_users_count(store_conn_t *c, int64_t *n, kiln_err_t *err)
{
    PGresult *r = NULL;
    int rc = store_q(c, "count users", "SELECT count(*) FROM users", 0, NULL, &r, err);
    if (rc)
        return rc;
    *n = store_get_i64(r, 0, 0);
    PQclear(r);
    return 0;
}

static json_t *user_json(const PGresult *r, int i)
{
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(store_get_str(r, i, 0)));
    json_object_set_new(o, "cluster_admin", json_boolean(store_get_bool(r, i, 1)));
    store_json_set_time(o, "created_at", r, i, 2);
    json_object_set_new(o, "created_by", json_string(store_get_str(r, i, 3)));
    return o;
}

#define USER_COLS "name, cluster_admin, " STORE_US("created_at") ", created_by"

int store_user_get_json(store_conn_t *c, const char *name, json_t **out, kiln_err_t *err)
{
    const char *p[1] = {name};
    PGresult *r = NULL;
    *out = NULL;
    int rc = store_q(c, "read user", "SELECT " USER_COLS " FROM users WHERE name = $1", 1, p, &r, err);
    if (rc)
        return rc;
    if (PQntuples(r) == 1)
        *out = user_json(r, 0);
    PQclear(r);
    if (!*out)
        return kiln_err_set(err, KILN_ENOTFOUND, "user", "user \"%s\" not found", name);
    return 0;
}

int store_users_list_json(store_conn_t *c, json_t **out, kiln_err_t *err)
{
    PGresult *r = NULL;
    *out = NULL;
    int rc = store_q(c, "list users", "SELECT " USER_COLS " FROM users ORDER BY name", 0, NULL, &r, err);
    if (rc)
        return rc;
    json_t *arr = json_array();
    for (int i = 0; i < PQntuples(r); i++)
        json_array_append_new(arr, user_json(r, i));
    PQclear(r);
    *out = arr;
    return 0;
}

/* ---- tokens ------------------------------------------------------------------------------ */

int store_token_insert(store_conn_t *c, const store_token_new_t *t, bool *stored, int64_t *expires_us,
                       kiln_err_t *err)
{
    /* One statement: the parent is checked and the token stored together. A token asking for no
     * expiry takes its parent's; one asking to outlive its parent is not stored. */
    static const char *sql =
        "WITH p AS (SELECT id, expires_at FROM tokens WHERE id = $7::text AND token_revoked_at(id) IS NULL"
        "  AND (expires_at IS NULL OR expires_at > now())),"
        " e AS (SELECT CASE WHEN $5::bigint IS NULL THEN (SELECT expires_at FROM p) ELSE " US_TO_TS("$5") " END AS at)"
        " INSERT INTO tokens (id, user_name, hash, description, expires_at, created_by, parent_id, kind)"
        " SELECT $1, $2, $3::bytea, $4, e.at, $6, $7::text, 'api' FROM e"
        " WHERE $7::text IS NULL OR EXISTS (SELECT 1 FROM p WHERE p.expires_at IS NULL"
        "  OR (e.at IS NOT NULL AND e.at <= p.expires_at))"
        " RETURNING coalesce(" STORE_US("expires_at") ", 0)";
    char hb[2 * STORE_HASH_LEN + 3], eb[24];
    const char *p[7] = {t->id, t->user, store_hash_param(t->hash, hb), t->description ? t->description : "",
                        us_param(t->expires_us, eb, sizeof(eb)), t->created_by ? t->created_by : "",
                        t->parent_id && *t->parent_id ? t->parent_id : NULL};
    PGresult *r = NULL;
    *stored = false;
    *expires_us = 0;
    int rc = store_q(c, "create token", sql, 7, p, &r, err);
    if (rc)
        return rc;
    if (PQntuples(r) == 1) {
        *stored = true;
        *expires_us = store_get_i64(r, 0, 0);
    }
    PQclear(r);
    return 0;
}

int store_token_auth(store_conn_t *c, const uint8_t hash[STORE_HASH_LEN], store_token_auth_t *out,
                     kiln_err_t *err)
{
    /* One round trip: the token, its user, the user's roles, and (at most once a minute) the
     * token's last use. A token is revoked when it or a token it was made with is. */
    static const char *sql =
        "WITH t AS (SELECT id, user_name, expires_at, kind, token_revoked_at(id) AS revoked_at FROM tokens"
        "  WHERE hash = $1::bytea),"
        " touch AS (UPDATE tokens SET last_used_at = now() WHERE hash = $1::bytea"
        "  AND revoked_at IS NULL AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute'))"
        " SELECT t.id, t.user_name, u.cluster_admin, " STORE_US("t.expires_at") ","
        "  t.revoked_at IS NOT NULL, t.expires_at IS NOT NULL AND t.expires_at <= now(),"
        "  (SELECT coalesce(json_object_agg(m.project, m.role), '{}')::text FROM project_members m"
        "   WHERE m.user_name = t.user_name), t.kind = 'session'"
        " FROM t JOIN users u ON u.name = t.user_name";
    char hb[2 * STORE_HASH_LEN + 3];
    const char *p[1] = {store_hash_param(hash, hb)};
    PGresult *r = NULL;
    memset(out, 0, sizeof(*out));
    int rc = store_qp(c, "authenticate token", sql, 1, p, &r, err);
    if (rc)
        return rc;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return kiln_err_set(err, KILN_ENOTFOUND, NULL, "no such token");
    }
    kiln_strlcpy(out->token_id, store_get_str(r, 0, 0), sizeof(out->token_id));
    kiln_strlcpy(out->user, store_get_str(r, 0, 1), sizeof(out->user));
    out->cluster_admin = store_get_bool(r, 0, 2);
    out->expires_us = store_get_i64(r, 0, 3);
    out->revoked = store_get_bool(r, 0, 4);
    out->expired = store_get_bool(r, 0, 5);
    out->roles = store_get_json(r, 0, 6, NULL);
    out->session = store_get_bool(r, 0, 7);
    PQclear(r);
    return 0;
}

/* revoked_at counts a revoked parent: a token made with it stopped working then too. */
#define TOKEN_COLS "id, user_name, description, " STORE_US("created_at") ", " STORE_US("expires_at") \
                   ", " STORE_US("token_revoked_at(id)") ", " STORE_US("last_used_at") \
                   ", kind, created_by, coalesce(parent_id, '')"

static json_t *token_json(const PGresult *r, int i)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(store_get_str(r, i, 0)));
    json_object_set_new(o, "user", json_string(store_get_str(r, i, 1)));
    json_object_set_new(o, "description", json_string(store_get_str(r, i, 2)));
    store_json_set_time(o, "created_at", r, i, 3);
    store_json_set_time(o, "expires_at", r, i, 4);
    store_json_set_time(o, "revoked_at", r, i, 5);
    store_json_set_time(o, "last_used_at", r, i, 6);
    json_object_set_new(o, "kind", json_string(store_get_str(r, i, 7)));
    json_object_set_new(o, "created_by", json_string(store_get_str(r, i, 8)));
    json_object_set_new(o, "parent_id", json_string(store_get_str(r, i, 9)));
    return o;
}

int store_tokens_list_json(store_conn_t *c, const char *user, json_t **out, kiln_err_t *err)
{
    const char *p[1] = {user};
    PGresult *r = NULL;
    *out = NULL;
    int rc = store_q(c, "list tokens", "SELECT " TOKEN_COLS " FROM tokens WHERE user_name = $1"
                     " ORDER BY created_at, id", 1, p, &r, err);
    if (rc)
        return rc;
    json_t *arr = json_array();
    for (int i = 0; i < PQntuples(r); i++)
        json_array_append_new(arr, token_json(r, i));
    PQclear(r);
    *out = arr;
    return 0;
}

int store_token_get_json(store_conn_t *c, const char *id, json_t **out, kiln_err_t *err)
{
    const char *p[1] = {id};
    PGresult *r = NULL;
    *out = NULL;
    int rc = store_q(c, "read token", "SELECT " TOKEN_COLS " FROM tokens WHERE id = $1", 1, p, &r, err);
    if (rc)
        return rc;
    if (PQntuples(r) == 1)
        *out = token_json(r, 0);
    PQclear(r);
    if (!*out)
        return kiln_err_set(err, KILN_ENOTFOUND, "id", "token \"%.40s\" not found", id);
    return 0;
}

int store_token_revoke(store_conn_t *c, const char *id, int64_t *descendants, kiln_err_t *err)
{
    /* One statement, so that no token made with it keeps working: the token and its descendants
     * (tokens whose parent is one of them) are revoked together; descendants that have expired
     * already stay expired. */
    static const char *sql =
        "WITH RECURSIVE d(id) AS (SELECT id FROM tokens WHERE id = $1"
        "  UNION SELECT t.id FROM tokens t JOIN d ON t.parent_id = d.id),"
        " u AS (UPDATE tokens SET revoked_at = now() FROM d WHERE tokens.id = d.id AND tokens.revoked_at IS NULL"
        "  AND (tokens.id = $1 OR tokens.expires_at IS NULL OR tokens.expires_at > now()) RETURNING tokens.id)"
        " SELECT (SELECT count(*) FROM d WHERE id = $1), (SELECT count(*) FROM u WHERE id <> $1)";
    const char *p[1] = {id};
    PGresult *r = NULL;
    int rc = store_q(c, "revoke token", sql, 1, p, &r, err);
    if (rc)
        return rc;
    bool found = store_get_i64(r, 0, 0) == 1;
    if (descendants)
        *descendants = store_get_i64(r, 0, 1);
    PQclear(r);
    if (!found)
        return kiln_err_set(err, KILN_ENOTFOUND, "id", "token \"%.40s\" not found", id);
    return 0;
}

/* ---- projects and members ---------------------------------------------------------------- */

int store_project_insert(store_conn_t *c, const char *name, const char *default_queue, const char *created_by,
                         kiln_err_t *err)
{
    const char *p[3] = {name, created_by ? created_by : "", default_queue && *default_queue ? default_queue : "default"};
    int rc = store_q(c, "create project", "INSERT INTO projects (name, created_by, default_queue) VALUES ($1, $2, $3)",
                     3, p, NULL, err);
    if (rc == KILN_EEXIST)
        kiln_err_set(err, KILN_EEXIST, "name", "project \"%s\" already exists", name);
    return rc;
}

int store_project_exists(store_conn_t *c, const char *name, bool *exists, kiln_err_t *err)
{
    const char *p[1] = {name};
    PGresult *r = NULL;
    int rc = store_q(c, "read project", "SELECT 1 FROM projects WHERE name = $1", 1, p, &r, err);
    if (rc)
        return rc;
    *exists = PQntuples(r) == 1;
    PQclear(r);
    return 0;
}

int store_project_set_default_queue(store_conn_t *c, const char *name, const char *queue, kiln_err_t *err)
{
    const char *p[2] = {name, queue && *queue ? queue : "default"};
    PGresult *r = NULL;
    int rc = store_q(c, "change project", "UPDATE projects SET default_queue = $2 WHERE name = $1", 2, p, &r, err);
    if (rc)
        return rc;
    bool found = strcmp(PQcmdTuples(r), "1") == 0;
    PQclear(r);
    if (!found)
        return kiln_err_set(err, KILN_ENOTFOUND, "project", "project \"%.80s\" not found", name);
    return 0;
}

int store_project_default_queue(store_conn_t *c, const char *name, char out[64], kiln_err_t *err)
{
    const char *p[1] = {name};
    PGresult *r = NULL;
    int rc = store_q(c, "read project", "SELECT default_queue FROM projects WHERE name = $1", 1, p, &r, err);
    if (rc)
        return rc;
    kiln_strlcpy(out, PQntuples(r) == 1 ? store_get_str(r, 0, 0) : "default", 64);
    PQclear(r);
    return 0;
}

int store_projects_list_json(store_conn_t *c, const char *member, json_t **out, kiln_err_t *err)
{
    /* With member NULL: every project (role ""); else the member's projects with its role. */
    const char *p[1] = {member};
    PGresult *r = NULL;
    *out = NULL;
    int rc = member
        ? store_q(c, "list projects",
                  "SELECT p.name, " STORE_US("p.created_at") ", p.created_by, m.role, p.default_queue FROM projects p"
                  " JOIN project_members m ON m.project = p.name AND m.user_name = $1 ORDER BY p.name",
                  1, p, &r, err)
        : store_q(c, "list projects",
                  "SELECT name, " STORE_US("created_at") ", created_by, '', default_queue FROM projects ORDER BY name",
                  0, NULL, &r, err);
    if (rc)
        return rc;
    json_t *arr = json_array();
    for (int i = 0; i < PQntuples(r); i++) {
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(store_get_str(r, i, 0)));
        store_json_set_time(o, "created_at", r, i, 1);
        json_object_set_new(o, "created_by", json_string(store_get_str(r, i, 2)));
        json_object_set_new(o, "role", json_string(store_get_str(r, i, 3)));
        json_object_set_new(o, "default_queue", json_string(store_get_str(r, i, 4)));
        json_array_append_new(arr, o);
    }
    PQclear(r);
    *out = arr;
    return 0;
}

int store_members_list_json(store_conn_t *c, const char *project, json_t **out, kiln_err_t *err)
{
    const char *p[1] = {project};
    PGresult *r = NULL;
    *out = NULL;
    int rc = store_q(c, "list members", "SELECT project, user_name, role FROM project_members"
                     " WHERE project = $1 ORDER BY user_name", 1, p, &r, err);
    if (rc)
        return rc;
    json_t *arr = json_array();
    for (int i = 0; i < PQntuples(r); i++)
        json_array_append_new(arr, json_pack("{s:s, s:s, s:s}", "project", store_get_str(r, i, 0),
                                             "user", store_get_str(r, i, 1), "role", store_get_str(r, i, 2)));
    PQclear(r);
    *out = arr;
    return 0;
}

int store_member_set(store_conn_t *c, const char *project, const char *user, const char *role,
                     kiln_err_t *err)
{
    const char *p[3] = {project, user, role};
    return store_q(c, "set project member",
                   "INSERT INTO project_members (project, user_name, role) VALUES ($1, $2, $3)"
                   " ON CONFLICT (project, user_name) DO UPDATE SET role = EXCLUDED.role", 3, p, NULL, err);
}

int store_member_remove(store_conn_t *c, const char *project, const char *user, bool *removed,
                        kiln_err_t *err)
{
    const char *p[2] = {project, user};
    PGresult *r = NULL;
    int rc = store_q(c, "remove project member",
                     "DELETE FROM project_members WHERE project = $1 AND user_name = $2 RETURNING 1", 2, p,
                     &r, err);
    if (rc)
        return rc;
    *removed = PQntuples(r) == 1;
    PQclear(r);
    return 0;
}

/* ---- agents' credentials ----------------------------------------------------------------- */

int store_worker_check_credential(store_conn_t *c, const char *id, const uint8_t hash[STORE_HASH_LEN],
                                  store_worker_claim_t *out, kiln_err_t *err)
{
    char hb[2 * STORE_HASH_LEN + 3];
    const char *p[2] = {id, hash ? store_hash_param(hash, hb) : NULL};
    PGresult *r = NULL;
    memset(out, 0, sizeof(*out));
    int rc = store_q(c, "check worker credential",
                     "SELECT coalesce(credential_hash = $2::bytea, false), coalesce(cert_sha256, '')"
                     " FROM workers WHERE id = $1", 2, p, &r, err);
    if (rc)
        return rc;
    if (PQntuples(r) == 1) {
        out->exists = true;
        out->match = store_get_bool(r, 0, 0);
        kiln_strlcpy(out->cert_sha256, store_get_str(r, 0, 1), sizeof(out->cert_sha256));
    }
    PQclear(r);
    return 0;
}

int store_worker_by_credential(store_conn_t *c, const uint8_t hash[STORE_HASH_LEN], store_worker_auth_t *out,
                               kiln_err_t *err)
{
    char hb[2 * STORE_HASH_LEN + 3];
    const char *p[1] = {store_hash_param(hash, hb)};
    PGresult *r = NULL;
    memset(out, 0, sizeof(*out));
    int rc = store_qp(c, "authenticate agent",
                      "SELECT id, coalesce(cert_sha256, ''), approval = 'PENDING' FROM workers"
                      " WHERE credential_hash = $1::bytea", 1, p, &r, err);
    if (rc)
        return rc;
    int found = PQntuples(r);
    if (found == 1) {
        kiln_strlcpy(out->id, store_get_str(r, 0, 0), sizeof(out->id));
        kiln_strlcpy(out->cert_sha256, store_get_str(r, 0, 1), sizeof(out->cert_sha256));
        out->pending = store_get_bool(r, 0, 2);
    }
    PQclear(r);
    if (found != 1)
        return kiln_err_set(err, KILN_ENOTFOUND, NULL, "no worker holds this credential");
    return 0;
}

/* Advisory lock key for bootstrap: "kiln" "boot". */
#define BOOT_LOCK_KEY "7596502641651806068"

int store_bootstrap_admin(store_conn_t *c, const char *user, const char *token_id,
                          const uint8_t hash[STORE_HASH_LEN], bool *created, kiln_err_t *err)
{
    *created = false;
    int64_t n = 0;
    int rc = store_begin(c, err);
    if (rc)
        return rc;
    /* Several kilnd may start at once on an empty database: one of them creates the admin. */
    rc = store_q(c, "take the bootstrap lock", "SELECT pg_advisory_xact_lock(" BOOT_LOCK_KEY ")", 0,
                 NULL, NULL, err);
    if (rc == 0)
        rc = store_users_count(c, &n, err);
    if (rc == 0 && n == 0) {
        /* the first token has no parent: it is stored unconditionally */
        store_token_new_t t = {.id = token_id, .user = user, .hash = hash,
                               .description = "bootstrap token (--bootstrap-token-file)"};
        bool stored = false;
        int64_t exp = 0;
        rc = store_user_insert(c, user, true, "bootstrap", err);
        if (rc == 0)
            rc = store_token_insert(c, &t, &stored, &exp, err);
        *created = rc == 0;
    }
    if (rc) {
        store_rollback(c);
        *created = false;
        return rc;
    }
    rc = store_commit(c, err);
    if (rc)
        *created = false;
    return rc;
}

/* ---- one-time login links ----------------------------------------------------------------- */

int store_login_link_insert(store_conn_t *c, const uint8_t hash[STORE_HASH_LEN], const char *user,
                            const char *token_id, int64_t expires_us, int64_t session_expires_us,
                            kiln_err_t *err)
{
    char hb[2 * STORE_HASH_LEN + 3], eb[24], sb[24];
    const char *p[5] = {store_hash_param(hash, hb), user, token_id, us_param(expires_us, eb, sizeof(eb)),
                        us_param(session_expires_us, sb, sizeof(sb))};
    /* Links a day past their expiry are of no use to anyone: each new link sweeps them. */
    int rc = store_q(c, "sweep login links",
                     "DELETE FROM login_links WHERE expires_at < now() - interval '1 day'", 0, NULL, NULL, err);
    if (rc == 0)
        rc = store_q(c, "create login link",
                     "INSERT INTO login_links (hash, user_name, token_id, expires_at, session_expires_at)"
                     " VALUES ($1::bytea, $2, $3, " US_TO_TS("$4") ", " US_TO_TS("$5") ")",
                     5, p, NULL, err);
    return rc;
}

int store_login_link_redeem(store_conn_t *c, const uint8_t hash[STORE_HASH_LEN], const char *token_id,
                            const uint8_t token_hash[STORE_HASH_LEN], const char *description,
                            store_login_redeemed_t *out, kiln_err_t *err)
{
    /* One statement: the link is marked used and the token made together, or neither. A link
     * whose asking token was revoked (or a token it was made with) or has expired since is
     * refused like a used one. The new token is a session made with the asking token. */
    static const char *sql =
        "WITH l AS (UPDATE login_links SET used_at = now(), issued_token_id = $2"
        "  WHERE hash = $1::bytea AND used_at IS NULL AND expires_at > now()"
        "  AND EXISTS (SELECT 1 FROM tokens t WHERE t.id = login_links.token_id"
        "   AND token_revoked_at(t.id) IS NULL AND (t.expires_at IS NULL OR t.expires_at > now()))"
        "  RETURNING user_name, token_id, session_expires_at)"
        " INSERT INTO tokens (id, user_name, hash, description, expires_at, created_by, parent_id, kind)"
        " SELECT $2, user_name, $3::bytea, $4, session_expires_at, user_name, token_id, 'session' FROM l"
        " RETURNING user_name, " STORE_US("expires_at");
    char hb[2 * STORE_HASH_LEN + 3], tb[2 * STORE_HASH_LEN + 3];
    const char *p[4] = {store_hash_param(hash, hb), token_id, store_hash_param(token_hash, tb), description};
    PGresult *r = NULL;
    memset(out, 0, sizeof(*out));
    int rc = store_q(c, "redeem login link", sql, 4, p, &r, err);
    if (rc)
        return rc;
    if (PQntuples(r) == 1) {
        kiln_strlcpy(out->user, store_get_str(r, 0, 0), sizeof(out->user));
        out->expires_us = store_get_i64(r, 0, 1);
        out->redeemed = true;
        PQclear(r);
        return 0;
    }
    PQclear(r);
    /* Not redeemed: say why (the code is 256 random bits, so this tells a guesser nothing). */
    const char *q[1] = {p[0]};
    rc = store_q(c, "read login link",
                 "SELECT l.used_at IS NOT NULL, l.expires_at <= now(),"
                 "  NOT EXISTS (SELECT 1 FROM tokens t WHERE t.id = l.token_id AND token_revoked_at(t.id) IS NULL"
                 "   AND (t.expires_at IS NULL OR t.expires_at > now()))"
                 " FROM login_links l WHERE l.hash = $1::bytea",
                 1, q, &r, err);
    if (rc)
        return rc;
    out->known = PQntuples(r) == 1;
    if (out->known) {
        out->used = store_get_bool(r, 0, 0);
        out->expired = store_get_bool(r, 0, 1);
        out->token_gone = store_get_bool(r, 0, 2);
    }
    PQclear(r);
    return 0;
}
