/* join.c - how a new agent gets in: join tokens (kilnd's --join-token-file, and tokens cluster
 * admins make with a number of uses and an expiry, of which a registration consumes one), and the
 * rate limits on registrations (token buckets per source address and for all of this kilnd).
 * Registration itself is agent.c's; what a registered worker may do is auth.c's and trust.c's. */
#include "service/svc_int.h"

#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JOIN_MAX_USES 1000000
#define JOIN_DEFAULT_TTL_S (24 * 3600)
#define JOIN_MAX_TTL_S (365LL * 24 * 3600)

int svc_trust_need_admin(const svc_caller_t *who, const char *what, kiln_err_t *err)
{
    if (who->cluster_admin)
        return 0;
    kiln_err_set(err, KILN_EPERM, NULL, "%s needs a cluster admin", what);
    kiln_err_hint(err, "ask a cluster admin (kiln whoami shows your roles)");
    return KILN_EPERM;
}

/* ---- checking a join token ------------------------------------------------------------------- */

int svc_join_check(svc_t *s, store_conn_t *c, const char *token, svc_join_t *out, kiln_err_t *err)
{
    memset(out, 0, sizeof(*out));
    if (s->cfg.auth_disabled) {
        out->ok = true;
        return 0;
    }
    if (!token || !*token) {
        kiln_strlcpy(out->why, "registering a worker needs a join token", sizeof(out->why));
        return 0;
    }
    if (strlen(token) > 256) {
        kiln_strlcpy(out->why, "the join token is not valid", sizeof(out->why));
        return 0;
    }
    uint8_t hash[STORE_HASH_LEN];
    svc_secret_hash(token, hash);
    if (s->has_join && sodium_memcmp(hash, s->join_hash, STORE_HASH_LEN) == 0) {
        out->ok = true;
        kiln_strlcpy(out->id, "file", sizeof(out->id));
        return 0;
    }
    store_join_t j;
    kiln_err_t e2;
    int rc = store_join_token_find(c, hash, &j, &e2);
    if (rc == KILN_ENOTFOUND) {
        kiln_strlcpy(out->why, "the join token is not valid", sizeof(out->why));
        return 0;
    }
    if (rc) {
        *err = e2;
        return rc;
    }
    kiln_strlcpy(out->id, j.id, sizeof(out->id));
    out->ok = !strcmp(j.state, "active");
    if (!out->ok)
        snprintf(out->why, sizeof(out->why), "the join token %s %s", j.id,
                 !strcmp(j.state, "used_up") ? "has no uses left" : !strcmp(j.state, "expired") ? "expired"
                                                                                                  : "was revoked");
    return 0;
}

/* ---- managed join tokens --------------------------------------------------------------------- */

static void join_id_new(char *out, size_t n)
{
    unsigned char raw[8];
    randombytes_buf(raw, sizeof(raw));
    snprintf(out, n, "jt_%02x%02x%02x%02x%02x%02x%02x%02x", raw[0], raw[1], raw[2], raw[3], raw[4], raw[5], raw[6],
             raw[7]);
}

int svc_join_token_create(svc_t *s, const svc_caller_t *who, const int64_t *uses, const char *expires_in,
                          const char *description, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    int rc = svc_trust_need_admin(who, "creating join tokens", err);
    if (rc)
        return rc;
    int64_t n_uses = uses ? *uses : 1;
    if ((rc = svc_check_range("uses", n_uses, 1, JOIN_MAX_USES, err))) {
        kiln_err_hint(err, "a join token allows 1 (the default: single-use) to %d registrations", JOIN_MAX_USES);
        return rc;
    }
    int64_t ttl = JOIN_DEFAULT_TTL_S;
    if (expires_in && *expires_in) {
        if ((rc = svc_check_str("expires_in", expires_in, 32, err)))
            return rc;
        if (!kiln_duration_parse(expires_in, &ttl) || ttl > JOIN_MAX_TTL_S) {
            kiln_err_set(err, KILN_EINVAL, "expires_in", "expires_in must be a duration of at most 365d, got \"%s\"",
                         expires_in);
            kiln_err_hint(err, "use a whole number with a unit: 90s, 30m, 12h or 7d (absent: 24h)");
            return KILN_EINVAL;
        }
    }
    if ((rc = svc_check_line("description", description, 200, err)))
        return rc;
    char secret[128], id[32];
    uint8_t hash[STORE_HASH_LEN];
    svc_secret_new("kiln_join_", secret, sizeof(secret), hash);
    join_id_new(id, sizeof(id));
    store_conn_t *c = NULL;
    json_t *tok = NULL;
    rc = store_conn_get(s->store, &c, err);
    if (rc == 0) {
        rc = store_join_token_insert(c, id, hash, description, (int)n_uses, kiln_now_us() + ttl * 1000000, who->user,
                                     &tok, err);
        store_conn_put(s->store, c);
    }
    if (rc == 0) {
        json_object_set_new(tok, "token", json_string(secret));
        *out = tok;
        log_info("auth: join token %s (%lld use(s), valid %lld s) created by %s", id, (long long)n_uses,
                 (long long)ttl, who->user);
    }
    sodium_memzero(secret, sizeof(secret));
    return rc;
}

int svc_trust_list(svc_t *s, const svc_caller_t *who, const char *what, svc_trust_list_fn list, const char *key,
                   json_t **out, kiln_err_t *err)
{
    *out = NULL;
    int rc = svc_trust_need_admin(who, what, err);
    if (rc)
        return rc;
    store_conn_t *c = NULL;
    json_t *arr = NULL;
    rc = store_conn_get(s->store, &c, err);
    if (rc)
        return rc;
    rc = list(c, &arr, err);
    store_conn_put(s->store, c);
    if (rc == 0)
        *out = json_pack("{s:o}", key, arr);
    return rc;
}

int svc_join_tokens_list(svc_t *s, const svc_caller_t *who, json_t **out, kiln_err_t *err)
{
    return svc_trust_list(s, who, "listing join tokens", store_join_tokens_list_json, "join_tokens", out, err);
}

int svc_join_token_revoke(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    int rc = svc_trust_need_admin(who, "revoking join tokens", err);
    if (rc)
        return rc;
    if ((rc = svc_check_str("id", id, 64, err)))
        return rc;
    store_conn_t *c = NULL;
    rc = store_conn_get(s->store, &c, err);
    if (rc)
        return rc;
    rc = store_join_token_revoke(c, id ? id : "", out, err);
    store_conn_put(s->store, c);
    if (rc == KILN_ENOTFOUND)
        kiln_err_hint(err, "kiln join-tokens list shows the join tokens");
    if (rc == 0)
        log_info("auth: join token %s revoked by %s", id, who->user);
    return rc;
}

/* ---- registration rate limits ---------------------------------------------------------------- */

/* Brings bucket b up to date at now (monotonic) for per_min a minute, bursts of cap. */
static void bucket_fill(svc_reg_bucket_t *b, int per_min, double cap, int64_t now)
{
    double add = (double)(now - b->at_us) / 1e6 * per_min / 60.0;
    b->tokens = fmin(cap, b->tokens + (add > 0 ? add : 0));
    b->at_us = now;
}

static double bucket_cap(int per_min)
{
    return fmax(1.0, floor(per_min / 6.0));
}

/* The bucket of addr: its slot, or a free one, or the one idle longest among those it may take. */
static svc_reg_bucket_t *bucket_of(svc_t *s, const char *addr, int per_min, int64_t now)
{
    uint32_t h = 2166136261u;
    for (const char *p = addr; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    svc_reg_bucket_t *pick = NULL;
    for (int i = 0; i < 8; i++) {
        svc_reg_bucket_t *b = &s->reg_addr[(h + (uint32_t)i) % SVC_REG_BUCKETS];
        if (!strcmp(b->addr, addr))
            return b;
        if (!pick || !b->addr[0] || (pick->addr[0] && b->at_us < pick->at_us))
            pick = b;
    }
    /* a bucket idle this long is full again anyway: taking it over loses nothing */
    kiln_strlcpy(pick->addr, addr, sizeof(pick->addr));
    pick->tokens = bucket_cap(per_min);
    pick->at_us = now;
    return pick;
}

int svc_register_admit(svc_t *s, const char *address, kiln_err_t *err)
{
    int per_addr = s->cfg.register_per_min_addr, per_all = s->cfg.register_per_min;
    if (per_addr <= 0 && per_all <= 0)
        return 0;
    const char *addr = address && *address ? address : "unknown";
    int64_t now = kiln_mono_us();
    double wait_s = 0;
    bool by_addr = false;
    pthread_mutex_lock(&s->reg_mu);
    svc_reg_bucket_t *b = per_addr > 0 ? bucket_of(s, addr, per_addr, now) : NULL;
    if (b) {
        bucket_fill(b, per_addr, bucket_cap(per_addr), now);
        if (b->tokens < 1.0) {
            wait_s = (1.0 - b->tokens) * 60.0 / per_addr;
            by_addr = true;
        }
    }
    if (per_all > 0) {
        if (!s->reg_all.at_us) {
            s->reg_all.tokens = bucket_cap(per_all);
            s->reg_all.at_us = now;
        }
        bucket_fill(&s->reg_all, per_all, bucket_cap(per_all), now);
        if (s->reg_all.tokens < 1.0)
            wait_s = fmax(wait_s, (1.0 - s->reg_all.tokens) * 60.0 / per_all);
    }
    if (wait_s == 0) {
        if (b)
            b->tokens -= 1.0;
        if (per_all > 0)
            s->reg_all.tokens -= 1.0;
    }
    pthread_mutex_unlock(&s->reg_mu);
    if (wait_s == 0)
        return 0;
    if (by_addr)
        kiln_err_set(err, KILN_ELIMIT, NULL, "too many worker registrations from %.64s: at most %d a minute", addr,
                     per_addr);
    else
        kiln_err_set(err, KILN_ELIMIT, NULL, "too many worker registrations: this kilnd takes at most %d a minute",
                     per_all);
    kiln_err_hint(err, "retry in %.1f s (kilnd's --register-per-min-per-addr and --register-per-min set the limits)",
                  ceil(wait_s * 10) / 10);
    log_warn("auth: refused a worker registration from %.64s: %s", addr, err->message);
    return KILN_ELIMIT;
}
