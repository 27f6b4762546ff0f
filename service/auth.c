/* auth.c - who is calling: API tokens and agent credentials are random secrets (libsodium) of
 * which kilnd keeps only BLAKE2b hashes; a bearer token becomes a caller (user, cluster admin,
 * project roles) through a short-lived in-memory cache in front of PostgreSQL, so a request costs
 * no query when its token was seen in the last seconds. Also agents' credentials (each bound to
 * the client certificate its worker registered with), the join token file and the bootstrap of
 * the first cluster admin. What a caller may do is decided where the
 * operation is (job.c, identity.c) with svc_caller_role(). */
#include "service/svc_int.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define AUTH_CACHE_SLOTS 4096        /* power of two */
#define AUTH_TTL_US (2 * 1000000LL)  /* how long a token's answer is reused without a query */

/* ---- secrets -------------------------------------------------------------------------------- */

void svc_secret_hash(const char *secret, uint8_t hash[STORE_HASH_LEN])
{
    crypto_generichash(hash, STORE_HASH_LEN, (const unsigned char *)secret, strlen(secret), NULL, 0);
}

void svc_secret_new(const char *prefix, char *out, size_t n, uint8_t hash[STORE_HASH_LEN])
{
    unsigned char raw[32];
    char b64[64];
    randombytes_buf(raw, sizeof(raw));
    sodium_bin2base64(b64, sizeof(b64), raw, sizeof(raw), sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    sodium_memzero(raw, sizeof(raw));
    snprintf(out, n, "%s%s", prefix, b64);
    sodium_memzero(b64, sizeof(b64));
    if (hash)
        svc_secret_hash(out, hash);
}

void svc_token_id_new(char *out, size_t n)
{
    unsigned char raw[8];
    randombytes_buf(raw, sizeof(raw));
    snprintf(out, n, "tok_%02x%02x%02x%02x%02x%02x%02x%02x", raw[0], raw[1], raw[2], raw[3], raw[4],
             raw[5], raw[6], raw[7]);
}

/* ---- callers -------------------------------------------------------------------------------- */

#define ROLE_NAME_(id, name) name,
static const char *const k_role_names[] = {"", KILN_PROJECT_ROLES(ROLE_NAME_, ROLE_NAME_)};
#undef ROLE_NAME_

const char *svc_role_name(svc_role_t r)
{
    return r >= SVC_ROLE_NONE && r <= SVC_ROLE_ADMIN ? k_role_names[r] : "";
}

svc_role_t svc_role_parse(const char *s)
{
    for (int r = SVC_ROLE_VIEWER; r <= SVC_ROLE_ADMIN; r++)
        if (s && !strcmp(s, k_role_names[r]))
            return (svc_role_t)r;
    return SVC_ROLE_NONE;
}

svc_role_t svc_caller_role(const svc_caller_t *who, const char *project)
{
    if (!who || !project) /* a row that names no project (unreadable) is no one's */
        return SVC_ROLE_NONE;
    if (who->cluster_admin)
        return SVC_ROLE_ADMIN;
    for (int i = 0; i < who->nroles; i++)
        if (!strcmp(who->roles[i].project, project))
            return who->roles[i].role;
    return SVC_ROLE_NONE;
}

const svc_caller_t *svc_caller_kilnd(void)
{
    static const svc_caller_t k = {.user = "", .token_id = "", .cluster_admin = true};
    return &k;
}

/* ---- the token cache ------------------------------------------------------------------------ */

/* One cached answer for a token hash: a caller, or why the token is refused. */
struct svc_auth_entry {
    bool used;
    uint8_t hash[STORE_HASH_LEN];
    uint64_t gen;                /* s->auth_gen when read; older entries are stale */
    int64_t fetched_us;          /* monotonic */
    int status;                  /* 0, or KILN_EUNAUTH with why */
    char why[96];
    char user[64];
    char token_id[32];
    bool cluster_admin;
    bool session;
    int64_t expires_us;
    int nroles;
    svc_project_role_t *roles;   /* heap; project names heap too */
};

static void entry_clear(svc_auth_entry_t *e)
{
    for (int i = 0; i < e->nroles; i++)
        free((char *)e->roles[i].project);
    free(e->roles);
    memset(e, 0, sizeof(*e));
}

static size_t slot_of(const uint8_t hash[STORE_HASH_LEN])
{
    uint64_t k;
    memcpy(&k, hash, sizeof(k));
    return (size_t)(k & (AUTH_CACHE_SLOTS - 1));
}

void svc_auth_invalidate(svc_t *s)
{
    pthread_mutex_lock(&s->auth_mu);
    s->auth_gen++;
    pthread_mutex_unlock(&s->auth_mu);
}

static int roles_cmp(const void *a, const void *b)
{
    return strcmp(((const svc_project_role_t *)a)->project, ((const svc_project_role_t *)b)->project);
}

/* Copies a cached entry into a caller whose strings live in arena. Under auth_mu. */
static void entry_to_caller(const svc_auth_entry_t *e, arena_t *arena, svc_caller_t *out)
{
    memset(out, 0, sizeof(*out));
    out->user = arena_strdup(arena, e->user);
    out->token_id = arena_strdup(arena, e->token_id);
    out->token_expires_us = e->expires_us;
    out->token_session = e->session;
    out->cluster_admin = e->cluster_admin;
    out->nroles = e->nroles;
    if (e->nroles) {
        svc_project_role_t *r = arena_alloc(arena, sizeof(*r) * (size_t)e->nroles);
        for (int i = 0; i < e->nroles; i++) {
            r[i].project = arena_strdup(arena, e->roles[i].project);
            r[i].role = e->roles[i].role;
        }
        out->roles = r;
    }
}

/* Reads the token's row into a fresh entry (outside any lock). */
static int entry_load(svc_t *s, const uint8_t hash[STORE_HASH_LEN], svc_auth_entry_t *e, kiln_err_t *err)
{
    store_conn_t *c = NULL;
    store_token_auth_t t;
    memset(e, 0, sizeof(*e));
    memcpy(e->hash, hash, STORE_HASH_LEN);
    e->used = true;
    int rc = store_conn_get(s->store, &c, err);
    if (rc)
        return rc;
    kiln_err_t e2;
    rc = store_token_auth(c, hash, &t, &e2);
    store_conn_put(s->store, c);
    if (rc == KILN_ENOTFOUND) {
        e->status = KILN_EUNAUTH;
        kiln_strlcpy(e->why, "the token is not valid", sizeof(e->why));
        return 0;
    }
    if (rc) {
        *err = e2;
        return rc;
    }
    if (t.revoked || t.expired) {
        e->status = KILN_EUNAUTH;
        snprintf(e->why, sizeof(e->why), "the token %s was %s", t.token_id, t.revoked ? "revoked" : "expired");
        json_decref(t.roles);
        return 0;
    }
    kiln_strlcpy(e->user, t.user, sizeof(e->user));
    kiln_strlcpy(e->token_id, t.token_id, sizeof(e->token_id));
    e->cluster_admin = t.cluster_admin;
    e->session = t.session;
    e->expires_us = t.expires_us;
    size_t n = json_object_size(t.roles);
    if (n) {
        e->roles = calloc(n, sizeof(*e->roles));
        const char *project;
        json_t *role;
        json_object_foreach(t.roles, project, role) {
            if (!e->roles)
                break;
            svc_role_t r = svc_role_parse(json_string_value(role));
            char *name = strdup(project);
            if (r == SVC_ROLE_NONE || !name) {
                free(name);
                continue;
            }
            e->roles[e->nroles].project = name;
            e->roles[e->nroles].role = r;
            e->nroles++;
        }
        if (e->roles)
            qsort(e->roles, (size_t)e->nroles, sizeof(*e->roles), roles_cmp);
    }
    json_decref(t.roles);
    return 0;
}

static int unauth(kiln_err_t *err, const char *why)
{
    kiln_err_set(err, KILN_EUNAUTH, NULL, "%s", why);
    kiln_err_hint(err, "send \"Authorization: Bearer <token>\" (gRPC: \"authorization\" metadata) with "
                       "a token from `kiln login`; an admin creates tokens with `kiln tokens create "
                       "USER` (POST /v1/users/{name}/tokens), and the first admin's token is in "
                       "kilnd's --bootstrap-token-file");
    return KILN_EUNAUTH;
}

int svc_auth_user(svc_t *s, const char *token, arena_t *arena, svc_caller_t *out, kiln_err_t *err)
{
    memset(out, 0, sizeof(*out));
    if (s->cfg.auth_disabled) {
        out->user = "anonymous";
        out->token_id = "";
        out->cluster_admin = true;
        return 0;
    }
    if (!token || !*token)
        return unauth(err, "this request needs an API token");
    if (strlen(token) > 256)
        return unauth(err, "the token is not valid");
    uint8_t hash[STORE_HASH_LEN];
    svc_secret_hash(token, hash);
    size_t slot = slot_of(hash);
    int64_t now = kiln_mono_us();

    pthread_mutex_lock(&s->auth_mu);
    svc_auth_entry_t *e = &s->auth_cache[slot];
    bool hit = e->used && e->gen == s->auth_gen && now - e->fetched_us < AUTH_TTL_US &&
               sodium_memcmp(e->hash, hash, STORE_HASH_LEN) == 0;
    uint64_t gen = s->auth_gen;
    if (hit) {
        int st = e->status;
        char why[96];
        kiln_strlcpy(why, e->why, sizeof(why));
        if (st == 0)
            entry_to_caller(e, arena, out);
        pthread_mutex_unlock(&s->auth_mu);
        if (st)
            return unauth(err, why);
        goto check_expiry;
    }
    pthread_mutex_unlock(&s->auth_mu);

    svc_auth_entry_t fresh;
    int rc = entry_load(s, hash, &fresh, err);
    if (rc)
        return rc;
    fresh.gen = gen;
    fresh.fetched_us = now;
    int st = fresh.status;
    char why[96];
    kiln_strlcpy(why, fresh.why, sizeof(why));
    if (st == 0)
        entry_to_caller(&fresh, arena, out);
    pthread_mutex_lock(&s->auth_mu);
    e = &s->auth_cache[slot];
    entry_clear(e);
    *e = fresh; /* the entry takes the roles */
    pthread_mutex_unlock(&s->auth_mu);
    if (st)
        return unauth(err, why);
check_expiry:
    if (out->token_expires_us > 0 && kiln_now_us() >= out->token_expires_us) {
        char msg[96];
        snprintf(msg, sizeof(msg), "the token %s expired", out->token_id);
        memset(out, 0, sizeof(*out));
        return unauth(err, msg);
    }
    return 0;
}

/* ---- agents -------------------------------------------------------------------------------- */

static int agent_unauth(kiln_err_t *err, const char *msg, const char *hint)
{
    kiln_err_set(err, KILN_EUNAUTH, NULL, "%s", msg);
    kiln_err_hint(err, "%s", hint);
    return KILN_EUNAUTH;
}

/* Whether a call that presented cert (NULL or "": none) may act for a worker bound to bound. */
static int agent_cert_check(const char *worker_id, const char *bound, const char *cert, kiln_err_t *err)
{
    if (!cert)
        cert = "";
    if (!strcmp(bound, cert))
        return 0;
    char msg[256];
    if (!*bound)
        snprintf(msg, sizeof(msg), "worker %s registered without a client certificate; this call presented one "
                 "(SHA-256 %.16s...)", worker_id, cert);
    else if (!*cert)
        snprintf(msg, sizeof(msg), "worker %s is bound to the client certificate it registered with (SHA-256 "
                 "%.16s...); this call presented none", worker_id, bound);
    else
        snprintf(msg, sizeof(msg), "worker %s is bound to the client certificate it registered with (SHA-256 "
                 "%.16s...); this call presented another (SHA-256 %.16s...)", worker_id, bound, cert);
    log_warn("worker %s: refused a call with its credential from another certificate (%.16s... instead of "
             "%.16s...)", worker_id, *cert ? cert : "none", *bound ? bound : "none");
    return agent_unauth(err, msg, "a worker's credential works only with the certificate it registered with; "
                                  "an agent with a new certificate registers again as a new worker");
}

int svc_auth_agent(svc_t *s, const char *credential, const char *cert_sha256, bool allow_pending,
                   char *worker_id, size_t n, kiln_err_t *err)
{
    if (s->cfg.auth_disabled) {
        worker_id[0] = '\0';
        return 0;
    }
    if (!credential || !*credential || strlen(credential) > 256)
        return agent_unauth(err, "this call needs the worker's credential",
                            "agents send \"authorization: Bearer <credential>\", the credential RegisterWorker "
                            "answered; register again with the join token");
    uint8_t hash[STORE_HASH_LEN];
    svc_secret_hash(credential, hash);
    size_t slot = slot_of(hash);
    int64_t now = kiln_mono_us();
    store_worker_auth_t w;
    pthread_mutex_lock(&s->auth_mu);
    svc_agent_entry_t *e = &s->agent_cache[slot];
    bool hit = e->used && e->gen == s->auth_gen && now - e->fetched_us < AUTH_TTL_US &&
               sodium_memcmp(e->hash, hash, STORE_HASH_LEN) == 0;
    if (hit) {
        kiln_strlcpy(w.id, e->worker_id, sizeof(w.id));
        kiln_strlcpy(w.cert_sha256, e->cert_sha256, sizeof(w.cert_sha256));
        w.pending = e->pending;
    }
    uint64_t gen = s->auth_gen;
    pthread_mutex_unlock(&s->auth_mu);
    if (!hit) {
        store_conn_t *c = NULL;
        int rc = store_conn_get(s->store, &c, err);
        if (rc)
            return rc;
        kiln_err_t e2;
        rc = store_worker_by_credential(c, hash, &w, &e2);
        store_conn_put(s->store, c);
        if (rc == KILN_ENOTFOUND)
            return agent_unauth(err, "the worker credential is not valid",
                                "register again with the join token (a newer registration replaced it, or a "
                                "cluster admin removed the worker)");
        if (rc) {
            *err = e2;
            return rc;
        }
        pthread_mutex_lock(&s->auth_mu);
        e = &s->agent_cache[slot];
        e->used = true;
        memcpy(e->hash, hash, STORE_HASH_LEN);
        e->gen = gen;
        e->fetched_us = now;
        kiln_strlcpy(e->worker_id, w.id, sizeof(e->worker_id));
        kiln_strlcpy(e->cert_sha256, w.cert_sha256, sizeof(e->cert_sha256));
        e->pending = w.pending;
        pthread_mutex_unlock(&s->auth_mu);
    }
    int rc = agent_cert_check(w.id, w.cert_sha256, cert_sha256, err);
    if (rc)
        return rc;
    if (w.pending && !allow_pending) {
        kiln_err_set(err, KILN_ESTATE, NULL, "worker %s is waiting for approval: it may only heartbeat", w.id);
        kiln_err_hint(err, "a cluster admin approves it with `kiln workers approve %s`", w.id);
        return KILN_ESTATE;
    }
    kiln_strlcpy(worker_id, w.id, n);
    return 0;
}

/* ---- secrets in files: the join token and the bootstrap token --------------------------------- */

/* Reads a secret from path (first line, trimmed) into out, or, when the file does not exist,
 * creates it (0600, exclusively) with a new secret. *created says which. */
static int secret_file(const char *path, const char *prefix, char *out, size_t n, bool *created,
                       kiln_err_t *err)
{
    *created = false;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        char buf[512];
        ssize_t got = read(fd, buf, sizeof(buf) - 1);
        struct stat st;
        /* group-readable is how Kubernetes mounts a Secret for a pod's group; world-readable is not */
        bool loose = fstat(fd, &st) == 0 && (st.st_mode & 007);
        close(fd);
        if (got < 0)
            return kiln_err_set(err, KILN_EIO, NULL, "could not read %s: %s", path, strerror(errno));
        buf[got] = '\0';
        buf[strcspn(buf, "\r\n")] = '\0';
        size_t len = strlen(buf);
        while (len && (buf[len - 1] == ' ' || buf[len - 1] == '\t'))
            buf[--len] = '\0';
        if (len < 16 || len >= n) {
            sodium_memzero(buf, sizeof(buf));
            kiln_err_set(err, KILN_EINVAL, NULL, "%s does not hold a token (16 to %zu characters on its first line)",
                         path, n - 1);
            return KILN_EINVAL;
        }
        memcpy(out, buf, len + 1);
        sodium_memzero(buf, sizeof(buf));
        if (loose)
            log_warn("%s can be read by every user on this machine: chmod 600 it", path);
        return 0;
    }
    if (errno != ENOENT)
        return kiln_err_set(err, KILN_EIO, NULL, "could not open %s: %s", path, strerror(errno));
    svc_secret_new(prefix, out, n, NULL);
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not create %s: %s", path, strerror(errno));
    size_t len = strlen(out);
    bool ok = write(fd, out, len) == (ssize_t)len && write(fd, "\n", 1) == 1 && fsync(fd) == 0;
    close(fd);
    if (!ok) {
        unlink(path);
        return kiln_err_set(err, KILN_EIO, NULL, "could not write %s", path);
    }
    *created = true;
    return 0;
}

int svc_auth_setup(svc_t *s, store_conn_t *c, kiln_err_t *err)
{
    char secret[300];
    bool created = false;
    int rc = 0;
    if (s->cfg.auth_disabled) {
        log_warn("AUTHENTICATION IS OFF (--no-auth): anyone who can reach kilnd's ports can run "
                 "and read every job and register agents");
        return 0;
    }
    if (s->cfg.join_token_file && *s->cfg.join_token_file) {
        rc = secret_file(s->cfg.join_token_file, "kiln_join_", secret, sizeof(secret), &created, err);
        if (rc)
            return rc;
        svc_secret_hash(secret, s->join_hash);
        sodium_memzero(secret, sizeof(secret));
        s->has_join = true;
        log_info("auth: agents register with the join token in %s%s", s->cfg.join_token_file,
                 created ? " (created now)" : "");
    } else {
        log_warn("auth: no --join-token-file: no agent can register with this kilnd");
    }
    if (s->cfg.bootstrap_token_file && *s->cfg.bootstrap_token_file) {
        int64_t users = 0;
        rc = store_users_count(c, &users, err);
        if (rc)
            return rc;
        if (users > 0) {
            log_info("auth: users exist; --bootstrap-token-file is not needed any more");
            return 0;
        }
        rc = secret_file(s->cfg.bootstrap_token_file, "kiln_", secret, sizeof(secret), &created, err);
        if (rc)
            return rc;
        uint8_t hash[STORE_HASH_LEN];
        char id[32];
        bool made = false;
        svc_secret_hash(secret, hash);
        sodium_memzero(secret, sizeof(secret));
        svc_token_id_new(id, sizeof(id));
        rc = store_bootstrap_admin(c, SVC_BOOTSTRAP_USER, id, hash, &made, err);
        if (rc)
            return rc;
        if (made)
            log_info("auth: created the cluster admin \"%s\"; its token (%s) is in %s", SVC_BOOTSTRAP_USER,
                     id, s->cfg.bootstrap_token_file);
        else if (created)
            unlink(s->cfg.bootstrap_token_file); /* another kilnd bootstrapped first */
    }
    return 0;
}

int svc_auth_init(svc_t *s, kiln_err_t *err)
{
    if (sodium_init() < 0)
        return kiln_err_set(err, KILN_EINTERNAL, NULL, "could not initialise libsodium");
    pthread_mutex_init(&s->auth_mu, NULL);
    pthread_mutex_init(&s->reg_mu, NULL);
    s->auth_cache = calloc(AUTH_CACHE_SLOTS, sizeof(*s->auth_cache));
    s->agent_cache = calloc(AUTH_CACHE_SLOTS, sizeof(*s->agent_cache));
    if (!s->auth_cache || !s->agent_cache)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    return 0;
}

void svc_auth_free(svc_t *s)
{
    if (s->auth_cache)
        for (size_t i = 0; i < AUTH_CACHE_SLOTS; i++)
            entry_clear(&s->auth_cache[i]);
    free(s->auth_cache);
    free(s->agent_cache);
    s->auth_cache = NULL;
    s->agent_cache = NULL;
    sodium_memzero(s->join_hash, sizeof(s->join_hash));
}
