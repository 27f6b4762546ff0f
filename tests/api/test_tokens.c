/* test_tokens.c - token lineage over REST against the real server and database: a token never
 * makes a token that outlives it (for its own user or, as a cluster admin, for another),
 * revoking a token revokes every token made with it (at once here, and on a second kilnd within
 * the token cache's bound), a web UI session token makes no tokens, and the lists show who made
 * each token with which token. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/api/api_test.h"

TestSuite(tokens, .init = at_setup, .fini = at_teardown, .timeout = 120);

static const char *str(const json_t *j, const char *key)
{
    const char *s = json_string_value(json_object_get(j, key));
    return s ? s : "";
}

/* A request as the holder of token (NULL: the bootstrap admin); asserts the status (saying the
 * reply's message, never a body that may hold a new token's secret). Returns the reply (caller
 * decrefs). */
static json_t *as(const char *token, const char *method, const char *path, const char *body, long want)
{
    char auth[200];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token ? token : at_admin_token);
    const char *hdrs[] = {auth, NULL};
    long st;
    json_t *j = at_req(method, path, body, hdrs, &st, NULL);
    cr_assert_eq(st, want, "%s %s: want %ld, got %ld: %s", method, path, want, st, str(j, "message"));
    return j;
}

/* A token made as the holder of `with` (NULL: the bootstrap admin) for user with body; the
 * secret into secret and the id into id (each 128 bytes), the reply returned (caller decrefs). */
static json_t *mint(const char *with, const char *user, const char *body, char *secret, char *id)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/users/%s/tokens", user);
    json_t *t = as(with, "POST", path, body, 201);
    snprintf(secret, 128, "%s", str(t, "token"));
    snprintf(id, 128, "%s", str(t, "id"));
    return t;
}

static void new_user(const char *name, bool cluster_admin)
{
    char body[128];
    snprintf(body, sizeof body, "{\"name\": \"%s\", \"cluster_admin\": %s}", name, cluster_admin ? "true" : "false");
    json_decref(as(NULL, "POST", "/v1/users", body, 201));
}

/* The token id of the listing of user (as the admin), or NULL when absent. */
static json_t *listed(const char *user, const char *id)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/users/%s/tokens", user);
    json_t *l = as(NULL, "GET", path, NULL, 200);
    size_t i;
    json_t *t, *found = NULL;
    json_array_foreach(json_object_get(l, "tokens"), i, t)
        if (!strcmp(str(t, "id"), id))
            found = json_incref(t);
    json_decref(l);
    cr_assert_not_null(found, "token %s is not in %s's list", id, user);
    return found;
}

/* Asserts that user's list shows token id with this kind and lineage. */
static void assert_listed(const char *user, const char *id, const char *kind, const char *created_by,
                          const char *parent_id)
{
    json_t *l = listed(user, id);
    cr_assert_str_eq(str(l, "kind"), kind, "%s", id);
    cr_assert_str_eq(str(l, "created_by"), created_by, "%s", id);
    cr_assert_str_eq(str(l, "parent_id"), parent_id, "%s", id);
    json_decref(l);
}

/* The status and message of GET /v1/whoami with token. */
static long whoami(const char *token, char *msg, size_t n)
{
    char auth[200];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
    const char *hdrs[] = {auth, NULL};
    long st;
    json_t *j = at_req("GET", "/v1/whoami", NULL, hdrs, &st, NULL);
    if (msg)
        snprintf(msg, n, "%s", str(j, "message"));
    json_decref(j);
    return st;
}

Test(tokens, a_short_lived_token_never_mints_a_token_that_outlives_it)
{
    char parent[128], parent_id[128], child[128], child_id[128];
    new_user("brief", false);
    json_t *p = mint(NULL, "brief", "{\"expires_in_s\": 30}", parent, parent_id);
    const char *parent_exp = str(p, "expires_at");
    cr_assert(parent_exp[0]);

    /* No expiry asked for: the child expires with its parent, and the answer says so. */
    json_t *c = mint(parent, "brief", "{\"description\": \"no expiry asked\"}", child, child_id);
    cr_assert_str_eq(str(c, "expires_at"), parent_exp, "the child ends when its parent does");
    cr_assert(json_is_true(json_object_get(c, "expires_with_parent")));
    cr_assert_str_eq(str(c, "parent_id"), parent_id);
    cr_assert_str_eq(str(c, "created_by"), "brief");
    json_decref(c);
    /* expires_in_s 0 is "none of its own" too */
    c = mint(parent, "brief", "{\"expires_in_s\": 0}", child, child_id);
    cr_assert_str_eq(str(c, "expires_at"), parent_exp);
    json_decref(c);

    /* Longer than the parent: refused, saying when the parent ends and how to get more. */
    json_t *e = as(parent, "POST", "/v1/users/brief/tokens", "{\"expires_in_s\": 86400}", 400);
    cr_assert_str_eq(str(e, "field"), "expires_in_s");
    cr_assert(strstr(str(e, "message"), "cannot outlive") && strstr(str(e, "message"), parent_id) &&
              strstr(str(e, "message"), "expires at"), "%s", str(e, "message"));
    cr_assert(strstr(str(e, "hint"), "leave expires_in_s out") && strstr(str(e, "hint"), "kiln login"), "%s",
              str(e, "hint"));
    json_decref(e);

    /* Shorter: as asked, and made with the parent. */
    c = mint(parent, "brief", "{\"expires_in_s\": 10}", child, child_id);
    cr_assert(strcmp(str(c, "expires_at"), parent_exp) < 0, "%s < %s", str(c, "expires_at"), parent_exp);
    cr_assert(!json_is_true(json_object_get(c, "expires_with_parent")));
    json_decref(c);

    /* A token that never expires makes tokens that never expire. */
    char forever[128], forever_id[128];
    json_decref(mint(NULL, "brief", "{}", forever, forever_id));
    c = mint(forever, "brief", "{}", child, child_id);
    cr_assert_str_eq(str(c, "expires_at"), "");
    cr_assert(!json_is_true(json_object_get(c, "expires_with_parent")));
    json_decref(c);
    json_decref(p);
}

Test(tokens, a_cluster_admin_makes_no_token_for_another_user_that_outlives_its_own)
{
    char admin[128], admin_id[128], tok[128], tok_id[128];
    new_user("ops", true);
    new_user("worker", false);
    json_t *a = mint(NULL, "ops", "{\"expires_in_s\": 60}", admin, admin_id);
    json_t *t = mint(admin, "worker", "{}", tok, tok_id);
    cr_assert_str_eq(str(t, "expires_at"), str(a, "expires_at"));
    cr_assert_str_eq(str(t, "user"), "worker");
    cr_assert_str_eq(str(t, "created_by"), "ops");
    cr_assert_str_eq(str(t, "parent_id"), admin_id);
    json_decref(t);
    json_t *e = as(admin, "POST", "/v1/users/worker/tokens", "{\"expires_in_s\": 3600}", 400);
    cr_assert(strstr(str(e, "message"), "cannot outlive"), "%s", str(e, "message"));
    json_decref(e);
    /* the worker's token is listed with who made it, with which token */
    assert_listed("worker", tok_id, "api", "ops", admin_id);
    json_decref(a);
}

Test(tokens, revoking_a_token_revokes_every_token_made_with_it)
{
    char a[128], a_id[128], b[128], b_id[128], c[128], c_id[128], other[128], other_id[128];
    char admin[128], admin_id[128], w[128], w_id[128], msg[256];
    new_user("chain", false);
    new_user("lead", true);
    new_user("helper", false);
    json_decref(mint(NULL, "chain", "{}", a, a_id));
    json_decref(mint(a, "chain", "{}", b, b_id));           /* a -> b */
    json_decref(mint(b, "chain", "{}", c, c_id));           /* b -> c */
    json_decref(mint(NULL, "chain", "{}", other, other_id)); /* a sibling of a, made by the admin */
    json_decref(mint(NULL, "lead", "{}", admin, admin_id));
    json_decref(mint(admin, "helper", "{}", w, w_id));      /* lead's token -> helper's */
    cr_assert_eq(whoami(c, NULL, 0), 200);
    cr_assert_eq(whoami(w, NULL, 0), 200);

    /* The owner revokes a: b and c (made with a, and with b) go with it, at once. */
    char path[160];
    snprintf(path, sizeof path, "/v1/tokens/%s", a_id);
    json_t *r = as(a, "DELETE", path, NULL, 200);
    cr_assert_eq(json_integer_value(json_object_get(r, "descendants_revoked")), 2);
    json_decref(r);
    const char *gone[] = {a, b, c};
    const char *gone_ids[] = {a_id, b_id, c_id};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(whoami(gone[i], msg, sizeof msg), 401, "token %d still works", i);
        char want[160];
        snprintf(want, sizeof want, "the token %s was revoked", gone_ids[i]);
        cr_assert(strstr(msg, want), "%s", msg);
        json_t *l = listed("chain", gone_ids[i]);
        cr_assert(json_is_string(json_object_get(l, "revoked_at")), "%s is listed as revoked", gone_ids[i]);
        json_decref(l);
    }
    cr_assert_eq(whoami(other, NULL, 0), 200, "a token not made with a keeps working");

    /* Tokens an admin made for another user are revoked with the admin's token. */
    snprintf(path, sizeof path, "/v1/tokens/%s", admin_id);
    r = as(NULL, "DELETE", path, NULL, 200);
    cr_assert_eq(json_integer_value(json_object_get(r, "descendants_revoked")), 1);
    json_decref(r);
    cr_assert_eq(whoami(w, msg, sizeof msg), 401);
    cr_assert(strstr(msg, "revoked"), "%s", msg);
    /* a revoked token makes nothing */
    json_t *e = as(a, "POST", "/v1/users/chain/tokens", "{}", 401);
    cr_assert(strstr(str(e, "message"), "revoked"), "%s", str(e, "message"));
    json_decref(e);
}

/* A second kilnd on the fixture's database: a replica with its own token cache. */
static svc_t *replica(void)
{
    svc_config_t cfg = {.database_url = at_db_url(), .heartbeat_timeout_ms = 60000, .db_pool_size = 2};
    svc_t *s = NULL;
    kiln_err_t err;
    cr_assert_eq(svc_create(&cfg, &s, &err), 0, "%s", err.message);
    return s;
}

static int auth_on(svc_t *s, const char *token, svc_caller_t *who, arena_t *a, kiln_err_t *err)
{
    kiln_err_clear(err);
    return svc_auth_user(s, token, a, who, err);
}

Test(tokens, a_revoked_parent_stops_its_children_on_every_replica_as_soon_as_itself)
{
    char p[128], p_id[128], child[128], child_id[128];
    new_user("far", false);
    json_decref(mint(NULL, "far", "{}", p, p_id));
    json_decref(mint(p, "far", "{}", child, child_id));
    svc_t *s2 = replica();
    arena_t a;
    arena_init(&a, 0);
    svc_caller_t who;
    kiln_err_t err;
    /* The replica caches the child's answer first, then the parent's. */
    cr_assert_eq(auth_on(s2, child, &who, &a, &err), 0, "%s", err.message);
    cr_assert_eq(auth_on(s2, p, &who, &a, &err), 0, "%s", err.message);
    svc_caller_t parent_on_s2 = who; /* the parent as the replica still knows it */

    /* Revoked through this kilnd. */
    char path[160];
    snprintf(path, sizeof path, "/v1/tokens/%s", p_id);
    json_decref(as(p, "DELETE", path, NULL, 200));

    /* While the replica's cache still holds the parent, it makes nothing with it. */
    json_t *out = NULL;
    int rc = svc_token_create(s2, &parent_on_s2, "far", 0, "from a stale cache", &out, &err);
    cr_assert_eq(rc, KILN_EUNAUTH, "a revoked parent minted a token on a replica (rc %d)", rc);
    cr_assert(strstr(err.message, "revoked"), "%s", err.message);
    cr_assert_null(out);

    /* The replica refuses the parent once its cached answer lapses (the bound for any revoked
     * token); the child, cached earlier, is refused by then too. */
    int64_t deadline = kiln_mono_us() + 30 * 1000000LL;
    while (auth_on(s2, p, &who, &a, &err) == 0) {
        cr_assert_lt(kiln_mono_us(), deadline, "the replica never refused the revoked parent");
        usleep(20000);
    }
    cr_assert_eq(auth_on(s2, child, &who, &a, &err), KILN_EUNAUTH, "the child outlived its parent's revocation");
    cr_assert(strstr(err.message, "revoked"), "%s", err.message);
    arena_deinit(&a);
    svc_destroy(s2);
}

/* A web UI session token of user (a login link asked for with token, redeemed); its id in id. */
static void session_of(const char *token, char *secret, char *id)
{
    json_t *l = as(token, "POST", "/v1/login-links", "{}", 201);
    char body[200];
    snprintf(body, sizeof body, "{\"code\": \"%s\"}", str(l, "code"));
    json_decref(l);
    json_t *t = as(token, "POST", "/v1/login-links:redeem", body, 200);
    snprintf(secret, 128, "%s", str(t, "token"));
    snprintf(id, 128, "%s", str(t, "id"));
    json_decref(t);
}

Test(tokens, a_web_ui_session_token_makes_no_tokens)
{
    char api[128], api_id[128], s[128], s_id[128], boss_s[128], boss_s_id[128];
    new_user("web", false);
    json_decref(mint(NULL, "web", "{}", api, api_id));
    session_of(api, s, s_id);
    cr_assert_eq(whoami(s, NULL, 0), 200, "a session token works for the UI");

    /* no token, for itself ... */
    json_t *e = as(s, "POST", "/v1/users/web/tokens", "{\"expires_in_s\": 60}", 403);
    cr_assert_str_eq(str(e, "code"), "permission_denied");
    cr_assert(strstr(str(e, "message"), "session token cannot create tokens"), "%s", str(e, "message"));
    cr_assert(strstr(str(e, "hint"), "kiln tokens create") && strstr(str(e, "hint"), "kiln login"), "%s",
              str(e, "hint"));
    json_decref(e);
    /* ... no login link (another session) ... */
    e = as(s, "POST", "/v1/login-links", "{}", 403);
    cr_assert(strstr(str(e, "message"), "session token cannot make login links"), "%s", str(e, "message"));
    json_decref(e);
    /* ... and none for others as a cluster admin's session either */
    session_of(at_admin_token, boss_s, boss_s_id);
    e = as(boss_s, "POST", "/v1/users/web/tokens", "{}", 403);
    cr_assert(strstr(str(e, "message"), "session token"), "%s", str(e, "message"));
    json_decref(e);

    /* It is listed as a session made with the token that asked for the link, and dies with it. */
    assert_listed("web", s_id, "session", "web", api_id);
    char path[160];
    snprintf(path, sizeof path, "/v1/tokens/%s", api_id);
    json_t *r = as(NULL, "DELETE", path, NULL, 200);
    cr_assert_eq(json_integer_value(json_object_get(r, "descendants_revoked")), 1);
    json_decref(r);
    char msg[256];
    cr_assert_eq(whoami(s, msg, sizeof msg), 401);
    cr_assert(strstr(msg, "revoked"), "%s", msg);
}

Test(tokens, lists_show_who_made_each_token_with_which_token)
{
    char t[128], t_id[128], u[128], u_id[128];
    new_user("lister", false);
    json_decref(mint(NULL, "lister", "{}", t, t_id));
    json_decref(mint(t, "lister", "{\"description\": \"made by lister\"}", u, u_id));
    json_t *me = as(NULL, "GET", "/v1/whoami", NULL, 200);
    char admin_id[128];
    snprintf(admin_id, sizeof admin_id, "%s", str(me, "token_id"));
    json_decref(me);

    json_t *l = as(t, "GET", "/v1/users/lister/tokens", NULL, 200);
    json_t *tokens = json_object_get(l, "tokens");
    cr_assert_eq(json_array_size(tokens), 2);
    json_t *first = json_array_get(tokens, 0), *second = json_array_get(tokens, 1);
    cr_assert_str_eq(str(first, "id"), t_id);
    cr_assert_str_eq(str(first, "created_by"), "admin");
    cr_assert_str_eq(str(first, "parent_id"), admin_id);
    cr_assert_str_eq(str(first, "kind"), "api");
    cr_assert_str_eq(str(second, "id"), u_id);
    cr_assert_str_eq(str(second, "created_by"), "lister");
    cr_assert_str_eq(str(second, "parent_id"), t_id);
    cr_assert(json_is_null(json_object_get(second, "revoked_at")));
    json_decref(l);
    /* the bootstrap token has no lineage */
    assert_listed("admin", admin_id, "api", "", "");
}
