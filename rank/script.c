/* script.c - the rank contract of a script rank (a job with an entry_point): torchrun's variables
 * and SageMaker's script-mode variables beside kiln's own, the spec's environment, and the
 * hyperparameters as the command-line arguments SageMaker passes. Values are printed the way
 * Python prints them (str(), json.dumps with sorted keys), so a script sees what it would see
 * under torchrun or SageMaker. It starts no process. */
#include "rank/rank.h"
#include "rank/rank_int.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a growable string ------------------------------------------------------------------- */

typedef struct sbuf {
    char *s;
    size_t n, cap;
    bool oom;
} sbuf_t;

static void sb_put(sbuf_t *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->oom = true;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void sb_str(sbuf_t *b, const char *s)
{
    sb_put(b, s, strlen(s));
}

static void sb_fmt(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_fmt(sbuf_t *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n > 0)
        sb_put(b, tmp, (size_t)KILN_MIN(n, (int)sizeof(tmp) - 1));
}

/* ---- values as Python prints them ---------------------------------------------------------- */

/* repr() of a float: the fewest digits that read back as d, fixed notation for exponents from -4
 * to 15, else d.ddde+XX. */
static void py_float(sbuf_t *b, double d)
{
    if (isnan(d) || isinf(d)) {
        sb_str(b, isnan(d) ? "nan" : d < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[64];
    for (int p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof(tmp), "%.*e", p - 1, d);
        if (strtod(tmp, NULL) == d)
            break;
    }
    char digits[32];
    size_t nd = 0;
    const char *q = tmp;
    bool neg = *q == '-';
    if (neg)
        q++;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9' && nd < sizeof(digits) - 1)
            digits[nd++] = *q;
    digits[nd] = '\0';
    int exp = *q == 'e' ? atoi(q + 1) : 0;
    while (nd > 1 && digits[nd - 1] == '0') /* "%.*e" may pad */
        digits[--nd] = '\0';
    if (neg)
        sb_str(b, "-");
    if (exp >= -4 && exp < 16) {
        if (exp >= (int)nd - 1) {
            sb_str(b, digits);
            for (int i = 0; i < exp - ((int)nd - 1); i++)
                sb_str(b, "0");
            sb_str(b, ".0");
        } else if (exp >= 0) {
            sb_put(b, digits, (size_t)exp + 1);
            sb_str(b, ".");
            sb_str(b, digits + exp + 1);
        } else {
            sb_str(b, "0.");
            for (int i = 0; i < -exp - 1; i++)
                sb_str(b, "0");
            sb_str(b, digits);
        }
    } else {
        sb_put(b, digits, 1);
        if (nd > 1) {
            sb_str(b, ".");
            sb_str(b, digits + 1);
        }
        sb_fmt(b, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
}

/* repr() of a str: single quotes unless it holds one and no double quote. */
static void py_repr_str(sbuf_t *b, const char *s)
{
    char q = strchr(s, '\'') && !strchr(s, '"') ? '"' : '\'';
    sb_put(b, &q, 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '\\' || *p == (unsigned char)q)
            sb_fmt(b, "\\%c", *p);
        else if (*p == '\n')
            sb_str(b, "\\n");
        else if (*p == '\r')
            sb_str(b, "\\r");
        else if (*p == '\t')
            sb_str(b, "\\t");
        else if (*p < 0x20 || *p == 0x7f)
            sb_fmt(b, "\\x%02x", *p);
        else
            sb_put(b, (const char *)p, 1);
    }
    sb_put(b, &q, 1);
}

typedef enum { PY_STR, PY_REPR, PY_JSON } py_mode_t;

static int key_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The keys of an object, sorted (a heap array the caller frees), or NULL for none or no memory. */
static const char **sorted_keys(json_t *o, size_t *n)
{
    *n = json_object_size(o);
    const char **k = *n ? malloc(*n * sizeof(*k)) : NULL;
    if (!k)
        return NULL;
    size_t i = 0;
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) k[i++] = key;
    qsort(k, *n, sizeof(*k), key_cmp);
    return k;
}

static void json_str(sbuf_t *b, const char *s)
{
    sb_str(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            sb_fmt(b, "\\%c", *p);
        else if (*p == '\n')
            sb_str(b, "\\n");
        else if (*p == '\r')
            sb_str(b, "\\r");
        else if (*p == '\t')
            sb_str(b, "\\t");
        else if (*p < 0x20 || *p == 0x7f)
            sb_fmt(b, "\\u%04x", *p);
        else
            sb_put(b, (const char *)p, 1); /* UTF-8 as it is (json.dumps would escape it) */
    }
    sb_str(b, "\"");
}

/* v as Python's str(v) (PY_STR), repr(v) (PY_REPR) or json.dumps(v, sort_keys=True,
 * separators=(",", ":")) (PY_JSON) of the decoded JSON. Dicts keep the JSON's order in str and
 * repr, as Python's do. */
static void py_value(sbuf_t *b, json_t *v, py_mode_t mode)
{
    switch (json_typeof(v)) {
    case JSON_STRING:
        if (mode == PY_STR)
            sb_str(b, json_string_value(v));
        else if (mode == PY_REPR)
            py_repr_str(b, json_string_value(v));
        else
            json_str(b, json_string_value(v));
        return;
    case JSON_INTEGER:
        sb_fmt(b, "%lld", (long long)json_integer_value(v));
        return;
    case JSON_REAL:
        py_float(b, json_real_value(v));
        return;
    case JSON_TRUE:
        sb_str(b, mode == PY_JSON ? "true" : "True");
        return;
    case JSON_FALSE:
        sb_str(b, mode == PY_JSON ? "false" : "False");
        return;
    case JSON_NULL:
        sb_str(b, mode == PY_JSON ? "null" : "None");
        return;
    case JSON_ARRAY: {
        sb_str(b, "[");
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i)
                sb_str(b, mode == PY_JSON ? "," : ", ");
            py_value(b, json_array_get(v, i), mode == PY_JSON ? PY_JSON : PY_REPR);
        }
        sb_str(b, "]");
        return;
    }
    case JSON_OBJECT: {
        sb_str(b, "{");
        if (mode == PY_JSON) {
            size_t n;
            const char **k = sorted_keys(v, &n);
            for (size_t i = 0; k && i < n; i++) {
                if (i)
                    sb_str(b, ",");
                json_str(b, k[i]);
                sb_str(b, ":");
                py_value(b, json_object_get(v, k[i]), PY_JSON);
            }
            b->oom |= n && !k;
            free(k);
        } else {
            const char *key;
            json_t *x;
            bool first = true;
            json_object_foreach(v, key, x) {
                if (!first)
                    sb_str(b, ", ");
                first = false;
                py_repr_str(b, key);
                sb_str(b, ": ");
                py_value(b, x, PY_REPR);
            }
        }
        sb_str(b, "}");
        return;
    }
    }
}

/* ---- arguments ------------------------------------------------------------------------------ */

/* Takes the string out of b (NULL when it ran out of memory). */
static char *sb_take(sbuf_t *b)
{
    if (b->oom) {
        free(b->s);
        return NULL;
    }
    char *s = b->s ? b->s : strdup("");
    memset(b, 0, sizeof(*b));
    return s;
}

static int hp_parse(const char *text, json_t **out, kiln_err_t *err)
{
    json_error_t je;
    *out = json_loads(text && text[0] ? text : "{}", JSON_DECODE_ANY, &je);
    if (!*out || !json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return kiln_err_set(err, KILN_EINVAL, "hyperparameters", "hyperparameters must be a JSON object");
    }
    return 0;
}

static void args_of(json_t *hp, rank_strv_t *a)
{
    size_t n;
    const char **k = sorted_keys(hp, &n);
    if (n && !k) {
        a->oom = true;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        sbuf_t name = {0}, val = {0};
        sb_str(&name, strlen(k[i]) > 1 ? "--" : "-");
        sb_str(&name, k[i]);
        json_t *v = json_object_get(hp, k[i]);
        if (json_is_object(v)) {
            size_t m;
            const char **kk = sorted_keys(v, &m);
            for (size_t j = 0; kk && j < m; j++) {
                if (j)
                    sb_str(&val, ",");
                sb_str(&val, kk[j]);
                sb_str(&val, "=");
                py_value(&val, json_object_get(v, kk[j]), PY_STR);
            }
            val.oom |= m && !kk;
            free(kk);
        } else {
            py_value(&val, v, PY_STR);
        }
        rank_strv_push(a, sb_take(&name));
        rank_strv_push(a, sb_take(&val));
    }
    free(k);
}

int rank_script_args(const char *hyperparameters_json, char ***out, size_t *n, kiln_err_t *err)
{
    *out = NULL;
    *n = 0;
    json_t *hp;
    int rc = hp_parse(hyperparameters_json, &hp, err);
    if (rc)
        return rc;
    rank_strv_t a = {0};
    args_of(hp, &a);
    json_decref(hp);
    if (!a.oom && !a.v)
        a.v = calloc(1, sizeof(char *));
    if (a.oom || !a.v) {
        rank_envp_free(a.v);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory for a script's arguments");
    }
    *out = a.v;
    *n = a.n;
    return 0;
}

/* ---- the environment ------------------------------------------------------------------------ */

static void env_add(rank_strv_t *a, const char *name, const char *value)
{
    rank_strv_pushf(a, name, "%s", value ? value : "");
}

/* Removes the entries named name (the spec's environment replaces what the agent's had). */
static void env_remove(rank_strv_t *a, const char *name)
{
    size_t len = strlen(name), j = 0;
    for (size_t i = 0; i < a->n; i++) {
        if (!strncmp(a->v[i], name, len) && a->v[i][len] == '=') {
            free(a->v[i]);
            continue;
        }
        a->v[j++] = a->v[i];
    }
    a->n = j;
    if (a->v)
        a->v[j] = NULL;
}

/* "SM_<prefix><NAME in upper case>" */
static void sm_name(sbuf_t *b, const char *prefix, const char *name)
{
    sb_str(b, prefix);
    for (const char *p = name; *p; p++) {
        char c = *p >= 'a' && *p <= 'z' ? (char)(*p - 32) : *p;
        sb_put(b, &c, 1);
    }
}

/* The JSON text of v (PY_JSON), or NULL when out of memory. */
static char *json_text(json_t *v)
{
    sbuf_t b = {0};
    py_value(&b, v, PY_JSON);
    return sb_take(&b);
}

static void env_add_json(rank_strv_t *a, const char *name, json_t *v)
{
    char *t = v ? json_text(v) : NULL;
    if (!t)
        a->oom = true;
    else
        env_add(a, name, t);
    free(t);
}

int rank_script_envp(const rank_env_t *e, const rank_script_env_t *s, char *const *base, char ***out,
                     kiln_err_t *err)
{
    *out = NULL;
    json_t *hp = NULL, *hosts = NULL, *chans = NULL, *dirs = NULL, *tenv = NULL, *args = NULL;
    char **filtered = NULL, **contract = NULL;
    rank_strv_t a = {0}, uargs = {0};
    int rc = hp_parse(s->hyperparameters_json, &hp, err);
    if (rc)
        return rc;
    for (size_t i = 0; i < s->n_env; i++) {
        const char *why = rank_env_reserved(s->env_names[i]);
        if (why) {
            rc = kiln_err_set(err, KILN_EINVAL, "environment", "environment variable %s is %s and set by kiln",
                              s->env_names[i], why);
            goto out;
        }
    }
    /* the agent's own environment, minus every name kiln sets for a script */
    size_t nb = 0;
    for (char *const *p = base; p && *p; p++)
        nb++;
    if (!(filtered = calloc(nb + 1, sizeof(char *)))) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory for a rank's environment");
        goto out;
    }
    size_t nf = 0;
    for (char *const *p = base; p && *p; p++) {
        char name[256];
        const char *eq = strchr(*p, '=');
        size_t len = eq ? (size_t)(eq - *p) : strlen(*p);
        snprintf(name, sizeof(name), "%.*s", (int)KILN_MIN(len, sizeof(name) - 1), *p);
        if (!rank_env_reserved(name))
            filtered[nf++] = *p;
    }
    if ((rc = rank_env_envp(e, filtered, &contract, err)))
        goto out;
    for (char **p = contract; *p; p++) {
        rank_strv_push(&a, *p);
        *p = NULL;
    }

    /* torchrun's */
    rank_strv_pushf(&a, RANK_ENV_TORCH_RANK, "%d", e->rank);
    rank_strv_pushf(&a, RANK_ENV_TORCH_WORLD_SIZE, "%d", e->world_size);
    rank_strv_pushf(&a, RANK_ENV_TORCH_LOCAL_RANK, "%d", e->local_rank);
    rank_strv_pushf(&a, RANK_ENV_TORCH_LOCAL_WORLD_SIZE, "%d", e->local_world_size);
    rank_strv_pushf(&a, RANK_ENV_TORCH_GROUP_RANK, "%d", e->node_rank);
    rank_strv_pushf(&a, RANK_ENV_TORCH_GROUP_WORLD_SIZE, "%d", e->nodes);
    rank_strv_pushf(&a, RANK_ENV_TORCH_ROLE_RANK, "%d", e->rank);
    rank_strv_pushf(&a, RANK_ENV_TORCH_ROLE_WORLD_SIZE, "%d", e->world_size);
    env_add(&a, RANK_ENV_TORCH_ROLE_NAME, "default");
    if (e->master_addr)
        env_add(&a, RANK_ENV_TORCH_MASTER_ADDR, e->master_addr);
    if (e->master_port)
        rank_strv_pushf(&a, RANK_ENV_TORCH_MASTER_PORT, "%d", e->master_port);
    rank_strv_pushf(&a, RANK_ENV_TORCH_RESTART_COUNT, "%d", e->attempt - 1);
    rank_strv_pushf(&a, RANK_ENV_TORCH_MAX_RESTARTS, "%d", KILN_MAX(s->max_restarts, 0));
    env_add(&a, RANK_ENV_TORCH_RUN_ID, e->job_id ? e->job_id : "none");

    /* SageMaker's */
    char host[32];
    snprintf(host, sizeof(host), "algo-%d", e->node_rank + 1);
    hosts = json_array();
    for (int i = 0; hosts && i < e->nodes; i++) {
        char h[32];
        snprintf(h, sizeof(h), "algo-%d", i + 1);
        json_array_append_new(hosts, json_string(h));
    }
    chans = json_array();
    dirs = json_object();
    const char **names = s->n_channels ? calloc(s->n_channels, sizeof(*names)) : NULL;
    for (size_t i = 0; names && i < s->n_channels; i++)
        names[i] = s->channel_names[i];
    if (names)
        qsort(names, s->n_channels, sizeof(*names), key_cmp);
    for (size_t i = 0; chans && names && i < s->n_channels; i++)
        json_array_append_new(chans, json_string(names[i]));
    free(names);
    for (size_t i = 0; dirs && i < s->n_channels; i++) {
        json_object_set_new(dirs, s->channel_names[i], json_string(s->channel_paths[i]));
        sbuf_t b = {0};
        sm_name(&b, RANK_ENV_SM_CHANNEL_PREFIX, s->channel_names[i]);
        char *n = sb_take(&b);
        if (n)
            env_add(&a, n, s->channel_paths[i]);
        a.oom |= !n;
        free(n);
    }
    env_add_json(&a, RANK_ENV_SM_CHANNELS, chans);
    env_add(&a, RANK_ENV_SM_MODEL_DIR, s->model_dir);
    env_add(&a, RANK_ENV_SM_OUTPUT_DIR, s->output_dir);
    env_add(&a, RANK_ENV_SM_OUTPUT_DATA_DIR, s->output_data_dir);
    if (e->checkpoint_dir)
        env_add(&a, RANK_ENV_SM_CHECKPOINT_DIR, e->checkpoint_dir);
    env_add_json(&a, RANK_ENV_SM_HPS, hp);
    const char *key;
    json_t *v;
    json_object_foreach(hp, key, v) {
        sbuf_t b = {0};
        sm_name(&b, RANK_ENV_SM_HP_PREFIX, key);
        char *n = sb_take(&b);
        char *t = json_is_string(v) ? strdup(json_string_value(v)) : json_text(v);
        if (n && t)
            env_add(&a, n, t);
        a.oom |= !n || !t;
        free(n);
        free(t);
    }
    args_of(hp, &uargs);
    args = json_array();
    for (size_t i = 0; args && i < uargs.n; i++)
        json_array_append_new(args, json_string(uargs.v[i]));
    a.oom |= uargs.oom;
    env_add_json(&a, RANK_ENV_SM_USER_ARGS, args);
    env_add(&a, RANK_ENV_SM_CURRENT_HOST, host);
    env_add_json(&a, RANK_ENV_SM_HOSTS, hosts);
    rank_strv_pushf(&a, RANK_ENV_SM_NUM_CPUS, "%d", e->threads > 0 ? e->threads : 1);
    rank_strv_pushf(&a, RANK_ENV_SM_NUM_GPUS, "%d", s->num_gpus);
    char module[256];
    const char *ep = s->entry_point ? s->entry_point : "";
    const char *slash = strrchr(ep, '/');
    snprintf(module, sizeof(module), "%s", slash ? slash + 1 : ep);
    size_t ml = strlen(module);
    if (ml > 3 && !strcmp(module + ml - 3, ".py"))
        module[ml - 3] = '\0';
    tenv = json_pack("{s:O,s:s,s:O,s:O,s:b,s:s,s:s,s:s,s:i,s:i,s:s,s:s,s:s,s:O}", "channel_input_dirs", dirs,
                     "current_host", host, "hosts", hosts, "hyperparameters", hp, "is_master", e->node_rank == 0,
                     "job_name", e->job_id ? e->job_id : "", "master_hostname", "algo-1", "model_dir",
                     s->model_dir ? s->model_dir : "", "num_cpus", e->threads > 0 ? e->threads : 1, "num_gpus",
                     s->num_gpus, "output_data_dir", s->output_data_dir ? s->output_data_dir : "", "output_dir",
                     s->output_dir ? s->output_dir : "", "user_entry_point", ep, "user_args", args);
    if (tenv) {
        json_object_set_new(tenv, "module_name", json_string(module));
        json_object_set_new(tenv, "checkpoint_dir", json_string(e->checkpoint_dir ? e->checkpoint_dir : ""));
    }
    env_add_json(&a, RANK_ENV_SM_TRAINING_ENV, tenv);

    /* the spec's, over the agent's */
    for (size_t i = 0; i < s->n_env; i++) {
        env_remove(&a, s->env_names[i]);
        env_add(&a, s->env_names[i], s->env_values[i]);
    }
    if (a.oom || !hosts || !chans || !dirs || !args || !tenv) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory for a rank's environment");
        goto out;
    }
    *out = a.v;
    a.v = NULL;
out:
    rank_envp_free(a.v);
    rank_envp_free(uargs.v);
    rank_envp_free(contract);
    free(filtered);
    json_decref(hp);
    json_decref(hosts);
    json_decref(chans);
    json_decref(dirs);
    json_decref(args);
    json_decref(tenv);
    return rc;
}
