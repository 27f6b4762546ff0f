/* env.c - the rank contract's environment: reading it in a rank (rank_env_parse), building it in
 * the launcher (rank_env_envp) with the same checks, the secrets a rank never sees, and the data
 * roots a rank may read. It starts no process and knows nothing of gRPC or the engine. */
#include "rank/rank.h"
#include "rank/rank_int.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

#define RANK_MAX_ROOTS 64

/* Every variable the contract owns: a rank gets these from the contract only, never from the
 * launcher's own environment. */
static const char *const k_owned[] = {
    RANK_ENV_SPEC, RANK_ENV_JOB_ID, RANK_ENV_ATTEMPT, RANK_ENV_RANK, RANK_ENV_WORLD_SIZE,
    RANK_ENV_LOCAL_RANK, RANK_ENV_LOCAL_WORLD_SIZE, RANK_ENV_NODE_RANK, RANK_ENV_NODES,
    RANK_ENV_MASTER_ADDR, RANK_ENV_MASTER_PORT, RANK_ENV_CHECKPOINT_DIR, RANK_ENV_OUTPUT_DIR,
    RANK_ENV_RESUME_FROM, RANK_ENV_INIT_MODEL, RANK_ENV_METRICS_FD, RANK_ENV_THREADS, RANK_ENV_DEVICE_ID,
    RANK_ENV_DATA_ROOTS, RANK_ENV_COMM_WATCHDOG_S, RANK_ENV_CPUS, RANK_ENV_PROJECT, RANK_ENV_STEP_MARKS,
    RANK_ENV_FRESH_START, RANK_ENV_PAUSE_AT_STEP,
    RANK_ENV_OMP_THREADS,
    RANK_ENV_CUDA_DEVICES,
};

void rank_env_init(rank_env_t *e)
{
    memset(e, 0, sizeof(*e));
    e->attempt = 1;
    e->world_size = 1;
    e->local_world_size = 1;
    e->nodes = 1;
    e->metrics_fd = -1;
    e->device_id = -1;
}

/* The value of name in envp, or NULL when it is absent or empty. */
static const char *env_get(char *const *envp, const char *name)
{
    size_t n = strlen(name);
    for (char *const *p = envp; p && *p; p++)
        if (!strncmp(*p, name, n) && (*p)[n] == '=')
            return (*p)[n + 1] ? *p + n + 1 : NULL;
    return NULL;
}

static int env_i64(char *const *envp, const char *name, long long lo, long long hi, int64_t *out, kiln_err_t *err)
{
    const char *v = env_get(envp, name);
    if (!v)
        return 0;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return kiln_err_set(err, KILN_EINVAL, name, "%s must be an integer from %lld to %lld, not \"%.64s\"", name,
                            lo, hi, v);
    *out = (int64_t)x;
    return 0;
}

static int env_int(char *const *envp, const char *name, long lo, long hi, int *out, kiln_err_t *err)
{
    int64_t x = *out;
    int rc = env_i64(envp, name, lo, hi, &x, err);
    *out = (int)x;
    return rc;
}

/* The checks every rank_env_t passes, whichever way it travels. */
static int env_check(const rank_env_t *e, kiln_err_t *err)
{
#define RANGE(v, name, lo, hi)                                                                          \
    if ((long)(v) < (long)(lo) || (long)(v) > (long)(hi))                                               \
        return kiln_err_set(err, KILN_EINVAL, name, "%s must be an integer from %ld to %ld, not %ld", name, \
                            (long)(lo), (long)(hi), (long)(v));
    RANGE(e->attempt, RANK_ENV_ATTEMPT, 1, INT_MAX);
    RANGE(e->world_size, RANK_ENV_WORLD_SIZE, 1, RANK_MAX_WORLD);
    RANGE(e->rank, RANK_ENV_RANK, 0, RANK_MAX_WORLD - 1);
    RANGE(e->local_world_size, RANK_ENV_LOCAL_WORLD_SIZE, 1, RANK_MAX_WORLD);
    RANGE(e->local_rank, RANK_ENV_LOCAL_RANK, 0, RANK_MAX_WORLD - 1);
    RANGE(e->nodes, RANK_ENV_NODES, 1, RANK_MAX_WORLD);
    RANGE(e->node_rank, RANK_ENV_NODE_RANK, 0, RANK_MAX_WORLD - 1);
    if (e->master_port != 0)
        RANGE(e->master_port, RANK_ENV_MASTER_PORT, 1, 65535);
    if (e->metrics_fd != -1)
        RANGE(e->metrics_fd, RANK_ENV_METRICS_FD, 0, INT_MAX);
    if (e->threads != 0)
        RANGE(e->threads, RANK_ENV_THREADS, 1, RANK_MAX_THREADS);
    if (e->device_id != -1)
        RANGE(e->device_id, RANK_ENV_DEVICE_ID, 0, 1023);
#undef RANGE
    if (e->rank >= e->world_size)
        return kiln_err_set(err, KILN_EINVAL, RANK_ENV_RANK, "%s %d must be below %s %d", RANK_ENV_RANK, e->rank,
                            RANK_ENV_WORLD_SIZE, e->world_size);
    if (e->local_world_size > e->world_size)
        return kiln_err_set(err, KILN_EINVAL, RANK_ENV_LOCAL_WORLD_SIZE, "%s %d must not exceed %s %d",
                            RANK_ENV_LOCAL_WORLD_SIZE, e->local_world_size, RANK_ENV_WORLD_SIZE, e->world_size);
    if (e->local_rank >= e->local_world_size)
        return kiln_err_set(err, KILN_EINVAL, RANK_ENV_LOCAL_RANK, "%s %d must be below %s %d", RANK_ENV_LOCAL_RANK,
                            e->local_rank, RANK_ENV_LOCAL_WORLD_SIZE, e->local_world_size);
    if (e->nodes > e->world_size)
        return kiln_err_set(err, KILN_EINVAL, RANK_ENV_NODES, "%s %d must not exceed %s %d", RANK_ENV_NODES,
                            e->nodes, RANK_ENV_WORLD_SIZE, e->world_size);
    if (e->node_rank >= e->nodes)
        return kiln_err_set(err, KILN_EINVAL, RANK_ENV_NODE_RANK, "%s %d must be below %s %d", RANK_ENV_NODE_RANK,
                            e->node_rank, RANK_ENV_NODES, e->nodes);
    if (e->comm_watchdog_s != 0 && !(e->comm_watchdog_s > 0 && e->comm_watchdog_s <= RANK_MAX_WATCHDOG_S))
        return kiln_err_set(err, KILN_EINVAL, RANK_ENV_COMM_WATCHDOG_S,
                            "%s must be a number of seconds above 0 and at most %d, not %g", RANK_ENV_COMM_WATCHDOG_S,
                            RANK_MAX_WATCHDOG_S, e->comm_watchdog_s);
    if (e->cpus) {
        cpu_set_t s;
        int rc = rank_cpus_parse(e->cpus, RANK_ENV_CPUS, &s, err);
        if (rc)
            return rc;
    }
    if (e->pause_at_step < 0 || e->pause_at_step > RANK_MAX_STEP)
        return kiln_err_set(err, KILN_EINVAL, RANK_ENV_PAUSE_AT_STEP, "%s must be a step from 1 to %lld, not %lld",
                            RANK_ENV_PAUSE_AT_STEP, (long long)RANK_MAX_STEP, (long long)e->pause_at_step);
    if (e->project && !kiln_ident_ok(e->project))
        return kiln_err_set(err, KILN_EINVAL, RANK_ENV_PROJECT, "%s must be a project name (1 to 63 characters of "
                            "a-z 0-9 . _ -, starting with a letter or digit), not \"%.64s\"", RANK_ENV_PROJECT,
                            e->project);
    return 0;
}

int rank_env_parse(char *const *envp, rank_env_t *out, kiln_err_t *err)
{
    rank_env_t e;
    int rc, marks = 0, fresh = 0;
    rank_env_init(&e);
    if (!envp)
        envp = environ;
    if ((rc = env_int(envp, RANK_ENV_ATTEMPT, 1, INT_MAX, &e.attempt, err)) ||
        (rc = env_int(envp, RANK_ENV_WORLD_SIZE, 1, RANK_MAX_WORLD, &e.world_size, err)) ||
        (rc = env_int(envp, RANK_ENV_RANK, 0, RANK_MAX_WORLD - 1, &e.rank, err)) ||
        (rc = env_int(envp, RANK_ENV_LOCAL_WORLD_SIZE, 1, RANK_MAX_WORLD, &e.local_world_size, err)) ||
        (rc = env_int(envp, RANK_ENV_LOCAL_RANK, 0, RANK_MAX_WORLD - 1, &e.local_rank, err)) ||
        (rc = env_int(envp, RANK_ENV_NODES, 1, RANK_MAX_WORLD, &e.nodes, err)) ||
        (rc = env_int(envp, RANK_ENV_NODE_RANK, 0, RANK_MAX_WORLD - 1, &e.node_rank, err)) ||
        (rc = env_int(envp, RANK_ENV_MASTER_PORT, 1, 65535, &e.master_port, err)) ||
        (rc = env_int(envp, RANK_ENV_METRICS_FD, 0, INT_MAX, &e.metrics_fd, err)) ||
        (rc = env_int(envp, RANK_ENV_THREADS, 1, RANK_MAX_THREADS, &e.threads, err)) ||
        (rc = env_int(envp, RANK_ENV_DEVICE_ID, 0, 1023, &e.device_id, err)) ||
        (rc = env_int(envp, RANK_ENV_STEP_MARKS, 0, 1, &marks, err)) ||
        (rc = env_int(envp, RANK_ENV_FRESH_START, 0, 1, &fresh, err)) ||
        (rc = env_i64(envp, RANK_ENV_PAUSE_AT_STEP, 1, RANK_MAX_STEP, &e.pause_at_step, err)))
        return rc;
    e.step_marks = marks == 1;
    e.fresh_start = fresh == 1;
    const char *w = env_get(envp, RANK_ENV_COMM_WATCHDOG_S);
    if (w) {
        char *end;
        errno = 0;
        double x = strtod(w, &end);
        if (errno || end == w || *end || !(x > 0 && x <= RANK_MAX_WATCHDOG_S))
            return kiln_err_set(err, KILN_EINVAL, RANK_ENV_COMM_WATCHDOG_S,
                                "%s must be a number of seconds above 0 and at most %d, not \"%.64s\"",
                                RANK_ENV_COMM_WATCHDOG_S, RANK_MAX_WATCHDOG_S, w);
        e.comm_watchdog_s = x;
    }
    e.spec = env_get(envp, RANK_ENV_SPEC);
    e.job_id = env_get(envp, RANK_ENV_JOB_ID);
    e.master_addr = env_get(envp, RANK_ENV_MASTER_ADDR);
    e.checkpoint_dir = env_get(envp, RANK_ENV_CHECKPOINT_DIR);
    e.output_dir = env_get(envp, RANK_ENV_OUTPUT_DIR);
    e.resume_from = env_get(envp, RANK_ENV_RESUME_FROM);
    e.init_model = env_get(envp, RANK_ENV_INIT_MODEL);
    e.cpus = env_get(envp, RANK_ENV_CPUS);
    e.project = env_get(envp, RANK_ENV_PROJECT);
    /* set and empty means "no roots", unlike the other strings */
    size_t rn = strlen(RANK_ENV_DATA_ROOTS);
    for (char *const *p = envp; p && *p; p++)
        if (!strncmp(*p, RANK_ENV_DATA_ROOTS, rn) && (*p)[rn] == '=')
            e.data_roots = *p + rn + 1;
    if ((rc = env_check(&e, err)))
        return rc;
    *out = e;
    return 0;
}

/* ---- building a rank's environment ------------------------------------------------------- */

typedef rank_strv_t envb_t;

void rank_strv_push(rank_strv_t *b, char *s)
{
    if (!s || b->oom) {
        free(s);
        b->oom = true;
        return;
    }
    if (b->n + 2 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        char **nv = realloc(b->v, cap * sizeof(char *));
        if (!nv) {
            free(s);
            b->oom = true;
            return;
        }
        b->v = nv;
        b->cap = cap;
    }
    b->v[b->n++] = s;
    b->v[b->n] = NULL;
}

void rank_strv_pushf(rank_strv_t *b, const char *name, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int vlen = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    size_t nlen = strlen(name);
    char *s = vlen < 0 ? NULL : malloc(nlen + 1 + (size_t)vlen + 1);
    if (s) {
        memcpy(s, name, nlen);
        s[nlen] = '=';
        va_start(ap, fmt);
        vsnprintf(s + nlen + 1, (size_t)vlen + 1, fmt, ap);
        va_end(ap);
    }
    rank_strv_push(b, s);
}

static bool env_is_owned(const char *entry)
{
    for (size_t i = 0; i < KILN_ARRAY_LEN(k_owned); i++) {
        size_t n = strlen(k_owned[i]);
        if (!strncmp(entry, k_owned[i], n) && (entry[n] == '=' || entry[n] == '\0'))
            return true;
    }
    return false;
}

bool rank_env_is_secret(const char *entry)
{
    static const char *const words[] = {"TOKEN",   "SECRET",     "PASSWORD", "PASSWD", "CREDENTIAL",  "PRIVATE_KEY",
                                        "API_KEY", "ACCESS_KEY", "AUTH",     "COOKIE", "DATABASE_URL"};
    static const char *const suffixes[] = {"_KEY", "_DSN"};
    const char *eq = strchr(entry, '=');
    size_t n = eq ? (size_t)(eq - entry) : strlen(entry);
    if (n >= 9 && !strncmp(entry, "KILN_TLS_", 9))
        return true;
    char name[256];
    if (n >= sizeof(name))
        return true; /* no legitimate variable name is this long */
    for (size_t i = 0; i < n; i++)
        name[i] = (char)(entry[i] >= 'a' && entry[i] <= 'z' ? entry[i] - 32 : entry[i]);
    name[n] = '\0';
    for (size_t i = 0; i < KILN_ARRAY_LEN(words); i++)
        if (strstr(name, words[i]))
            return true;
    for (size_t i = 0; i < KILN_ARRAY_LEN(suffixes); i++) {
        size_t k = strlen(suffixes[i]);
        if (n >= k && !strcmp(name + n - k, suffixes[i]))
            return true;
    }
    return false;
}

int rank_env_envp(const rank_env_t *e, char *const *base, char ***out, kiln_err_t *err)
{
    *out = NULL;
    int rc = env_check(e, err);
    if (rc)
        return rc;
    envb_t b = {0};
    for (char *const *p = base; p && *p; p++)
        if (!env_is_owned(*p) && !rank_env_is_secret(*p))
            rank_strv_push(&b, strdup(*p));
    if (e->spec)
        rank_strv_pushf(&b, RANK_ENV_SPEC, "%s", e->spec);
    if (e->job_id)
        rank_strv_pushf(&b, RANK_ENV_JOB_ID, "%s", e->job_id);
    rank_strv_pushf(&b, RANK_ENV_ATTEMPT, "%d", e->attempt);
    rank_strv_pushf(&b, RANK_ENV_RANK, "%d", e->rank);
    rank_strv_pushf(&b, RANK_ENV_WORLD_SIZE, "%d", e->world_size);
    rank_strv_pushf(&b, RANK_ENV_LOCAL_RANK, "%d", e->local_rank);
    rank_strv_pushf(&b, RANK_ENV_LOCAL_WORLD_SIZE, "%d", e->local_world_size);
    rank_strv_pushf(&b, RANK_ENV_NODE_RANK, "%d", e->node_rank);
    rank_strv_pushf(&b, RANK_ENV_NODES, "%d", e->nodes);
    if (e->master_addr)
        rank_strv_pushf(&b, RANK_ENV_MASTER_ADDR, "%s", e->master_addr);
    if (e->master_port)
        rank_strv_pushf(&b, RANK_ENV_MASTER_PORT, "%d", e->master_port);
    if (e->checkpoint_dir)
        rank_strv_pushf(&b, RANK_ENV_CHECKPOINT_DIR, "%s", e->checkpoint_dir);
    if (e->output_dir)
        rank_strv_pushf(&b, RANK_ENV_OUTPUT_DIR, "%s", e->output_dir);
    if (e->resume_from)
        rank_strv_pushf(&b, RANK_ENV_RESUME_FROM, "%s", e->resume_from);
    if (e->init_model)
        rank_strv_pushf(&b, RANK_ENV_INIT_MODEL, "%s", e->init_model);
    if (e->metrics_fd >= 0)
        rank_strv_pushf(&b, RANK_ENV_METRICS_FD, "%d", e->metrics_fd);
    if (e->threads > 0) {
        rank_strv_pushf(&b, RANK_ENV_THREADS, "%d", e->threads);
        rank_strv_pushf(&b, RANK_ENV_OMP_THREADS, "%d", e->threads);
    }
    if (e->device_id >= 0) {
        rank_strv_pushf(&b, RANK_ENV_DEVICE_ID, "%d", e->device_id);
        rank_strv_pushf(&b, RANK_ENV_CUDA_DEVICES, "%d", e->device_id);
    }
    if (e->data_roots)
        rank_strv_pushf(&b, RANK_ENV_DATA_ROOTS, "%s", e->data_roots);
    if (e->comm_watchdog_s > 0)
        rank_strv_pushf(&b, RANK_ENV_COMM_WATCHDOG_S, "%.17g", e->comm_watchdog_s);
    if (e->cpus)
        rank_strv_pushf(&b, RANK_ENV_CPUS, "%s", e->cpus);
    if (e->project)
        rank_strv_pushf(&b, RANK_ENV_PROJECT, "%s", e->project);
    if (e->step_marks)
        rank_strv_pushf(&b, RANK_ENV_STEP_MARKS, "1");
    if (e->fresh_start)
        rank_strv_pushf(&b, RANK_ENV_FRESH_START, "1");
    if (e->pause_at_step > 0)
        rank_strv_pushf(&b, RANK_ENV_PAUSE_AT_STEP, "%lld", (long long)e->pause_at_step);
    if (b.oom || !b.v) {
        rank_envp_free(b.v);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory for a rank's environment");
    }
    *out = b.v;
    return 0;
}

void rank_envp_free(char **envp)
{
    for (char **p = envp; p && *p; p++)
        free(*p);
    free(envp);
}

char *rank_data_roots_join(const char *const *roots, size_t n)
{
    size_t len = 1;
    for (size_t i = 0; i < n; i++) {
        if (strchr(roots[i], ','))
            return NULL;
        len += strlen(roots[i]) + 1;
    }
    char *s = malloc(len);
    if (!s)
        return NULL;
    size_t off = 0;
    s[0] = '\0';
    for (size_t i = 0; i < n; i++)
        off += (size_t)snprintf(s + off, len - off, "%s%s", i ? "," : "", roots[i]);
    return s;
}

/* KILN_DATA_ROOTS split into roots (pointing into *copy, which the caller frees); false when it is
 * unset (nothing to confine to). */
static bool env_roots(char **copy, const char **roots, size_t *nroots)
{
    const char *env = getenv(RANK_ENV_DATA_ROOTS);
    *copy = NULL;
    *nroots = 0;
    if (!env)
        return false;
    char *save = NULL;
    *copy = strdup(env);
    for (char *tok = *copy ? strtok_r(*copy, ",", &save) : NULL; tok && *nroots < RANK_MAX_ROOTS;
         tok = strtok_r(NULL, ",", &save))
        roots[(*nroots)++] = tok;
    return true;
}

int rank_path_confine(const char *path, const char *field, kiln_err_t *err)
{
    char *copy, res[PATH_MAX];
    const char *roots[RANK_MAX_ROOTS];
    size_t nroots;
    if (!env_roots(&copy, roots, &nroots))
        return 0;
    if (!copy)
        return kiln_err_set(err, KILN_ENOMEM, field, "out of memory");
    int rc = kiln_path_confine(path, field, roots, nroots, res, sizeof(res), NULL, err);
    if (rc == 0)
        rc = kiln_path_area_check(res, path, field, getenv(RANK_ENV_PROJECT), err);
    free(copy);
    return rc;
}

int rank_file_confine(int fd, const char *path, const char *field, kiln_err_t *err)
{
    char *copy, link[64], real[PATH_MAX];
    const char *roots[RANK_MAX_ROOTS];
    size_t nroots;
    if (!env_roots(&copy, roots, &nroots))
        return 0;
    if (!copy)
        return kiln_err_set(err, KILN_ENOMEM, field, "out of memory");
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, real, sizeof(real) - 1);
    if (n > 0)
        real[n] = '\0';
    /* where the open file is cannot be told (no /proc, a path too long): refused like outside */
    int rc = kiln_path_confine_resolved(n > 0 && real[0] == '/' ? real : NULL, path, field, roots, nroots, err);
    if (rc == 0)
        rc = kiln_path_area_check(real, path, field, getenv(RANK_ENV_PROJECT), err);
    free(copy);
    return rc;
}
