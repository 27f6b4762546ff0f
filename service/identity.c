/* identity.c - users, API tokens, projects and project members: who may manage what (cluster
 * admins: users and projects; every user: its own tokens; project admins: their members), and
 * the changes themselves. A token is made with the caller's token, never outlives it and is
 * revoked with it; web UI session tokens make none. A revocation or role change drops the token
 * cache (auth.c) so that it applies to the next request. Authentication itself is auth.c's. */
#include "service/svc_int.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOKEN_MAX_LIFETIME_S (10LL * 365 * 24 * 3600)

static int need_cluster_admin(const svc_caller_t *who, const char *what, kiln_err_t *err)
{
    if (who->cluster_admin)
        return 0;
    kiln_err_set(err, KILN_EPERM, NULL, "%s needs a cluster admin", what);
    kiln_err_hint(err, "ask a cluster admin (kiln whoami shows your roles)");
    return KILN_EPERM;
}

static int bad_name(kiln_err_t *err, const char *field, const char *what, const char *name)
{
    kiln_err_set(err, KILN_EINVAL, field, "%s name \"%.80s\" is not valid", what, name ? name : "");
    kiln_err_hint(err, "use 1 to 63 characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit");
    return KILN_EINVAL;
}

/* Runs fn on a pooled connection. */
#define WITH_CONN(s, err, stmt)                                                                    \
    do {                                                                                           \
        store_conn_t *c_ = NULL;                                                                   \
        rc = store_conn_get((s)->store, &c_, (err));                                               \
        if (rc == 0) {                                                                             \
            store_conn_t *c = c_;                                                                  \
            stmt;                                                                                  \
            store_conn_put((s)->store, c_);                                                        \
        }                                                                                          \
    } while (0)

int svc_whoami(svc_t *s, const svc_caller_t *who, json_t **out, kiln_err_t *err)
{
    (void)s;
    (void)err;
    json_t *projects = json_array();
    for (int i = 0; i < who->nroles; i++)
        json_array_append_new(projects, json_pack("{s:s, s:s}", "project", who->roles[i].project,
                                                  "role", svc_role_name(who->roles[i].role)));
    char exp[40] = "";
    if (who->token_expires_us > 0)
        kiln_time_format(who->token_expires_us, exp, sizeof(exp));
    *out = json_pack("{s:s, s:b, s:o, s:s, s:s}", "user", who->user, "cluster_admin", who->cluster_admin,
                     "projects", projects, "token_id", who->token_id ? who->token_id : "",
                     "token_expires_at", exp);
    return 0;
}

int svc_user_create(svc_t *s, const svc_caller_t *who, const char *name, bool cluster_admin,
                    json_t **out, kiln_err_t *err)
{
    *out = NULL;
    int rc = need_cluster_admin(who, "creating users", err);
    if (rc)
        return rc;
    if (!kiln_ident_ok(name))
        return bad_name(err, "name", "user", name);
    WITH_CONN(s, err, {
        rc = store_user_insert(c, name, cluster_admin, who->user, err);
        if (rc == 0)
            rc = store_user_get_json(c, name, out, err);
    });
    if (rc == 0)
        log_info("auth: user \"%s\" created by %s%s", name, who->user, cluster_admin ? " (cluster admin)" : "");
    return rc;
}

int svc_users_list(svc_t *s, const svc_caller_t *who, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    int rc = need_cluster_admin(who, "listing users", err);
    if (rc)
        return rc;
    json_t *users = NULL;
    WITH_CONN(s, err, rc = store_users_list_json(c, &users, err));
    if (rc == 0)
        *out = json_pack("{s:o}", "users", users);
    return rc;
}

/* A user's own tokens are its business; anyone's are a cluster admin's. Others' tokens do not
 * exist for the caller. */
static int check_token_owner(const svc_caller_t *who, const char *user, kiln_err_t *err)
{
    if (who->cluster_admin || !strcmp(who->user, user))
        return 0;
    kiln_err_set(err, KILN_EPERM, "user", "you can manage only your own tokens (you are \"%s\")", who->user);
    kiln_err_hint(err, "a cluster admin manages other users' tokens");
    return KILN_EPERM;
}

/* A web UI session token (from a login link) makes no tokens: not by POST .../tokens, not by
 * a login link. what: "create tokens", "make login links". */
static int refuse_session(const svc_caller_t *who, const char *what, kiln_err_t *err)
{
    if (!who->token_session)
        return 0;
    kiln_err_set(err, KILN_EPERM, NULL, "a web UI session token cannot %s", what);
    kiln_err_detail(err, "token %s came from a one-time login link and lasts only for its browser session",
                    who->token_id);
    kiln_err_hint(err, "run `kiln tokens create` (or `kiln ui`) where you logged in with an API token "
                       "(`kiln login`)");
    return KILN_EPERM;
}

/* A new token made with the caller's token and asking for expires_us (0: none of its own) may
 * not end after the caller's token does. */
static int check_outlives(const svc_caller_t *who, int64_t expires_us, kiln_err_t *err)
{
    int64_t parent_us = who->token_expires_us;
    if (parent_us <= 0 || expires_us <= 0 || expires_us <= parent_us)
        return 0;
    char at[40];
    kiln_time_format(parent_us, at, sizeof(at));
    int64_t left_s = (parent_us - kiln_now_us()) / 1000000;
    if (left_s < 0)
        left_s = 0;
    kiln_err_set(err, KILN_EINVAL, "expires_in_s", "a token cannot outlive the token that makes it: this request's "
                 "token %s expires at %s", who->token_id, at);
    kiln_err_detail(err, "expires_in_s asks for a token that ends after that; a token ends no later than the token "
                         "it is made with, and is revoked with it");
    kiln_err_hint(err, "ask for at most %lld seconds, or leave expires_in_s out to get a token that expires with "
                       "this one; a longer-lived token needs a longer-lived token to make it (`kiln login` with "
                       "one, or ask a cluster admin)", (long long)left_s);
    return KILN_EINVAL;
}

int svc_token_create(svc_t *s, const svc_caller_t *who, const char *user, int64_t expires_in_s,
                     const char *description, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    if (!kiln_ident_ok(user))
        return bad_name(err, "user", "user", user);
    int rc = check_token_owner(who, user, err);
    if (rc)
        return rc;
    rc = refuse_session(who, "create tokens", err);
    if (rc)
        return rc;
    if (expires_in_s < 0 || expires_in_s > TOKEN_MAX_LIFETIME_S) {
        kiln_err_set(err, KILN_EINVAL, "expires_in_s", "expires_in_s must be between 0 (never expires) and %lld, got %lld",
                     TOKEN_MAX_LIFETIME_S, (long long)expires_in_s);
        return KILN_EINVAL;
    }
    int crc = svc_check_line("description", description, 200, err);
    if (crc)
        return crc;
    /* The caller's token is the new one's parent (none for kilnd's own calls and --no-auth). */
    const char *parent = who->token_id && *who->token_id ? who->token_id : NULL;
    int64_t expires_us = expires_in_s > 0 ? kiln_now_us() + expires_in_s * 1000000 : 0;
    if (parent) {
        rc = check_outlives(who, expires_us, err);
        if (rc)
            return rc;
    }
    char secret[128], id[32];
    uint8_t hash[STORE_HASH_LEN];
    svc_secret_new("kiln_", secret, sizeof(secret), hash);
    svc_token_id_new(id, sizeof(id));
    store_token_new_t t = {.id = id, .user = user, .hash = hash, .description = description,
                           .expires_us = expires_us, .created_by = who->user, .parent_id = parent};
    bool stored = false;
    int64_t got_us = 0;
    WITH_CONN(s, err, {
        rc = store_user_get(c, user, NULL, err);
        if (rc == 0)
            rc = store_token_insert(c, &t, &stored, &got_us, err);
    });
    if (rc == 0 && !stored) {
        /* The parent was revoked or expired after this request's token was checked. */
        rc = kiln_err_set(err, KILN_EUNAUTH, NULL, "the token %s was revoked or has expired", parent);
        kiln_err_hint(err, "log in again with a valid token (`kiln login`)");
    }
    if (rc == 0) {
        char exp[40] = "";
        if (got_us)
            kiln_time_format(got_us, exp, sizeof(exp));
        *out = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:b}", "id", id, "token", secret, "expires_at", exp,
                         "user", user, "created_by", who->user, "parent_id", parent ? parent : "",
                         "expires_with_parent", expires_us == 0 && got_us != 0);
        log_info("auth: token %s for user \"%s\" created by %s%s%s", id, user, who->user, parent ? " with token " : "",
                 parent ? parent : "");
    }
    memset(secret, 0, sizeof(secret));
    return rc;
}

int svc_tokens_list(svc_t *s, const svc_caller_t *who, const char *user, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    if (!kiln_ident_ok(user))
        return bad_name(err, "user", "user", user);
    int rc = check_token_owner(who, user, err);
    if (rc)
        return rc;
    json_t *tokens = NULL;
    WITH_CONN(s, err, {
        rc = store_user_get(c, user, NULL, err);
        if (rc == 0)
            rc = store_tokens_list_json(c, user, &tokens, err);
    });
    if (rc == 0)
        *out = json_pack("{s:o}", "tokens", tokens);
    return rc;
}

int svc_token_revoke(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    json_t *tok = NULL;
    int64_t descendants = 0;
    int rc;
    WITH_CONN(s, err, {
        rc = store_token_get_json(c, id, &tok, err);
        /* Someone else's token does not exist for the caller. */
        if (rc == 0 && !who->cluster_admin &&
            strcmp(json_string_value(json_object_get(tok, "user")), who->user) != 0) {
            rc = kiln_err_set(err, KILN_ENOTFOUND, "id", "token \"%.40s\" not found", id);
        }
        if (rc == 0)
            rc = store_token_revoke(c, id, &descendants, err);
        json_decref(tok);
        tok = NULL;
        if (rc == 0)
            rc = store_token_get_json(c, id, &tok, err);
    });
    if (rc == 0) {
        svc_auth_invalidate(s);
        log_info("auth: token %s revoked by %s (and %lld tokens made with it)", id, who->user, (long long)descendants);
        json_object_set_new(tok, "descendants_revoked", json_integer(descendants));
        *out = tok;
    }
    return rc;
}

/* A default_queue that names no queue ("", or not a string): refused as a job spec's "queue": ""
 * is. Leaving it out (or JSON null; over gRPC the empty string, proto3's unset) means "default". */
static int bad_default_queue(kiln_err_t *err)
{
    kiln_err_set(err, KILN_EINVAL, "default_queue", "default_queue must name a queue");
    kiln_err_hint(err, "the queue \"default\" is the cluster's own (null means it too); kiln queues list shows the "
                       "others");
    return KILN_EINVAL;
}

/* In one transaction: the queue checked (its row locked, see svc_queue_check_default) and stored
 * as the project's default queue, by insert (a new project created by created_by) or update. */
static int project_store_default(svc_t *s, const char *project, const char *queue, const char *created_by,
                                 kiln_err_t *err)
{
    svc_tx_t tx;
    int rc = svc_tx_begin(s, &tx, err);
    if (rc)
        return rc;
    rc = svc_queue_check_default(tx.c, queue, project, err);
    if (rc == 0)
        rc = created_by ? store_project_insert(tx.c, project, queue, created_by, err)
                        : store_project_set_default_queue(tx.c, project, queue, err);
    if (rc == 0)
        return svc_tx_commit(&tx, err);
    svc_tx_abort(&tx);
    return rc;
}

int svc_project_create(svc_t *s, const svc_caller_t *who, const char *name, const char *default_queue, json_t **out,
                       kiln_err_t *err)
{
    *out = NULL;
    int rc = need_cluster_admin(who, "creating projects", err);
    if (rc)
        return rc;
    if (!kiln_ident_ok(name))
        return bad_name(err, "name", "project", name);
    if (default_queue && !*default_queue)
        return bad_default_queue(err);
    if (!default_queue)
        default_queue = "default";
    rc = project_store_default(s, name, default_queue, who->user, err);
    if (rc == 0) {
        char now[40];
        kiln_time_format(kiln_now_us(), now, sizeof(now));
        *out = json_pack("{s:s, s:s, s:s, s:s, s:s}", "name", name, "created_at", now, "created_by", who->user,
                         "role", "", "default_queue", default_queue);
        log_info("auth: project \"%s\" created by %s (default queue %s)", name, who->user, default_queue);
    }
    return rc;
}

int svc_projects_list(svc_t *s, const svc_caller_t *who, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    json_t *projects = NULL;
    int rc;
    WITH_CONN(s, err, rc = store_projects_list_json(c, who->cluster_admin ? NULL : who->user, &projects, err));
    if (rc == 0)
        *out = json_pack("{s:o}", "projects", projects);
    return rc;
}

/* A project the caller has no role in does not exist for it; one it is in but cannot manage is
 * KILN_EPERM. Cluster admins see whether it exists. */
static int project_access(svc_t *s, const svc_caller_t *who, const char *project, svc_role_t need,
                          kiln_err_t *err)
{
    if (!kiln_ident_ok(project) ||
        (!who->cluster_admin && svc_caller_role(who, project) == SVC_ROLE_NONE)) {
        kiln_err_set(err, KILN_ENOTFOUND, "project", "project \"%.80s\" not found", project ? project : "");
        kiln_err_hint(err, "kiln projects lists the projects you belong to");
        return KILN_ENOTFOUND;
    }
    if (who->cluster_admin) {
        bool exists = false;
        int rc;
        WITH_CONN(s, err, rc = store_project_exists(c, project, &exists, err));
        if (rc)
            return rc;
        if (!exists) {
            kiln_err_set(err, KILN_ENOTFOUND, "project", "project \"%.80s\" not found", project);
            kiln_err_hint(err, "create it with kiln projects create %s", project);
            return KILN_ENOTFOUND;
        }
        return 0;
    }
    return svc_project_need(who, project, need, err);
}

int svc_project_update(svc_t *s, const svc_caller_t *who, const char *project, const json_t *patch, json_t **out,
                       kiln_err_t *err)
{
    *out = NULL;
    int rc = project_access(s, who, project, SVC_ROLE_ADMIN, err);
    if (rc)
        return rc;
    if (!json_is_object(patch))
        return kiln_err_set(err, KILN_EINVAL, NULL, "a project change must be a JSON object");
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)patch, k, v) {
        if (strcmp(k, "default_queue") != 0) {
            kiln_err_set(err, KILN_EINVAL, k, "unknown field \"%.60s\"", k);
            kiln_err_hint(err, "a project's field that can change is default_queue");
            return KILN_EINVAL;
        }
    }
    const json_t *dq = json_object_get(patch, "default_queue");
    if (dq && !json_is_null(dq) && (!json_is_string(dq) || !*json_string_value(dq)))
        return bad_default_queue(err);
    const char *queue = json_is_string(dq) ? json_string_value(dq) : "default";
    json_t *all = NULL;
    if (dq)
        rc = project_store_default(s, project, queue, NULL, err);
    if (rc == 0)
        WITH_CONN(s, err, rc = store_projects_list_json(c, NULL, &all, err));
    size_t i;
    json_t *p;
    json_array_foreach(all, i, p)
        if (strcmp(json_string_value(json_object_get(p, "name")), project) == 0) {
            /* the caller's role, as GET /v1/projects shows it */
            json_object_set_new(p, "role", json_string(who->cluster_admin ? "" : svc_role_name(svc_caller_role(who, project))));
            *out = json_incref(p);
        }
    json_decref(all);
    if (rc == 0 && !*out)
        rc = kiln_err_set(err, KILN_ENOTFOUND, "project", "project \"%.80s\" not found", project);
    if (rc == 0 && dq)
        log_info("auth: project \"%s\"'s default queue is now %s (set by %s)", project, queue, who->user);
    return rc;
}

int svc_members_list(svc_t *s, const svc_caller_t *who, const char *project, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    int rc = project_access(s, who, project, SVC_ROLE_VIEWER, err);
    if (rc)
        return rc;
    json_t *members = NULL;
    WITH_CONN(s, err, rc = store_members_list_json(c, project, &members, err));
    if (rc == 0)
        *out = json_pack("{s:o}", "members", members);
    return rc;
}

int svc_member_set(svc_t *s, const svc_caller_t *who, const char *project, const char *user,
                   const char *role, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    int rc = project_access(s, who, project, SVC_ROLE_ADMIN, err);
    if (rc)
        return rc;
    if (!kiln_ident_ok(user))
        return bad_name(err, "user", "user", user);
    if (svc_role_parse(role) == SVC_ROLE_NONE) {
        kiln_err_set(err, KILN_EINVAL, "role", "role must be viewer, editor or admin, got \"%.40s\"",
                     role ? role : "");
        return KILN_EINVAL;
    }
    WITH_CONN(s, err, {
        rc = store_user_get(c, user, NULL, err);
        if (rc == 0)
            rc = store_member_set(c, project, user, role, err);
    });
    if (rc == KILN_ENOTFOUND)
        kiln_err_hint(err, "a cluster admin creates users with kiln users create NAME");
    if (rc)
        return rc;
    svc_auth_invalidate(s);
    log_info("auth: %s is now %s of project \"%s\" (set by %s)", user, role, project, who->user);
    *out = json_pack("{s:s, s:s, s:s}", "project", project, "user", user, "role", role);
    return 0;
}

int svc_member_remove(svc_t *s, const svc_caller_t *who, const char *project, const char *user,
                      kiln_err_t *err)
{
    int rc = project_access(s, who, project, SVC_ROLE_ADMIN, err);
    if (rc)
        return rc;
    bool removed = false;
    if (kiln_ident_ok(user))
        WITH_CONN(s, err, rc = store_member_remove(c, project, user, &removed, err));
    if (rc)
        return rc;
    if (!removed) {
        kiln_err_set(err, KILN_ENOTFOUND, "user", "\"%.80s\" is not a member of project \"%s\"", user, project);
        return KILN_ENOTFOUND;
    }
    svc_auth_invalidate(s);
    log_info("auth: %s removed from project \"%s\" by %s", user, project, who->user);
    return 0;
}

/* ---- one-time login links (the web UI) -------------------------------------------------------- */

#define LOGIN_LINK_TTL_S 120                 /* how long a link may wait for its browser */
#define LOGIN_SESSION_S (12LL * 3600)        /* the browser token's lifetime at most */
#define LOGIN_CODE_PREFIX "kiln_login_"

int svc_login_link_create(svc_t *s, const svc_caller_t *who, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    if (s->cfg.auth_disabled || !who->token_id || !who->token_id[0]) {
        kiln_err_set(err, KILN_ESTATE, NULL, "kilnd runs without authentication: there is nothing to log in to");
        kiln_err_hint(err, "open kilnd's URL in the browser directly");
        return KILN_ESTATE;
    }
    int rc = refuse_session(who, "make login links", err);
    if (rc)
        return rc;
    char code[128];
    uint8_t hash[STORE_HASH_LEN];
    svc_secret_new(LOGIN_CODE_PREFIX, code, sizeof(code), hash);
    int64_t now = kiln_now_us();
    int64_t expires_us = now + LOGIN_LINK_TTL_S * 1000000LL;
    int64_t session_us = now + LOGIN_SESSION_S * 1000000LL;
    if (who->token_expires_us > 0 && who->token_expires_us < session_us)
        session_us = who->token_expires_us;
    WITH_CONN(s, err, rc = store_login_link_insert(c, hash, who->user, who->token_id, expires_us, session_us, err));
    if (rc == 0) {
        char exp[40], sexp[40];
        kiln_time_format(expires_us, exp, sizeof(exp));
        kiln_time_format(session_us, sexp, sizeof(sexp));
        *out = json_pack("{s:s, s:s, s:s}", "code", code, "expires_at", exp, "session_expires_at", sexp);
        log_info("auth: login link for user \"%s\" created with token %s (valid %d s)", who->user,
                 who->token_id, LOGIN_LINK_TTL_S);
    }
    sodium_memzero(code, sizeof(code));
    return rc;
}

static int login_refused(kiln_err_t *err, const char *why)
{
    kiln_err_set(err, KILN_EUNAUTH, "code", "this login link %s", why);
    kiln_err_hint(err, "run `kiln ui` again for a new link (each works once, for %d seconds), or paste an "
                       "API token", LOGIN_LINK_TTL_S);
    return KILN_EUNAUTH;
}

int svc_login_link_redeem(svc_t *s, const char *code, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    if (s->cfg.auth_disabled) {
        kiln_err_set(err, KILN_ESTATE, NULL, "kilnd runs without authentication: there is nothing to log in to");
        return KILN_ESTATE;
    }
    size_t plen = strlen(LOGIN_CODE_PREFIX);
    if (!code || strncmp(code, LOGIN_CODE_PREFIX, plen) != 0 || strlen(code) > 100)
        return login_refused(err, "is not valid");
    uint8_t hash[STORE_HASH_LEN], token_hash[STORE_HASH_LEN];
    svc_secret_hash(code, hash);
    char secret[128], id[32];
    svc_secret_new("kiln_", secret, sizeof(secret), token_hash);
    svc_token_id_new(id, sizeof(id));
    store_login_redeemed_t red;
    int rc;
    WITH_CONN(s, err, rc = store_login_link_redeem(c, hash, id, token_hash, "web UI (one-time login link)", &red, err));
    if (rc == 0 && !red.redeemed) {
        rc = login_refused(err, !red.known ? "is not valid"
                                : red.used ? "was already used"
                                : red.expired ? "has expired"
                                : "belongs to a token that was revoked or has expired");
    } else if (rc == 0) {
        char exp[40];
        kiln_time_format(red.expires_us, exp, sizeof(exp));
        *out = json_pack("{s:s, s:s, s:s, s:s}", "id", id, "token", secret, "expires_at", exp, "user", red.user);
        log_info("auth: login link of user \"%s\" used: token %s for the web UI", red.user, id);
    }
    sodium_memzero(secret, sizeof(secret));
    return rc;
}
