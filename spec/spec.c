/* spec.c - job spec parsing, defaults and validation (see spec.h), and the normalised JSON form.
 * Each section is read by one function that walks its JSON object, rejects unknown keys (with a
 * "did you mean" hint), checks types and ranges, and names the offending field on error. */
#include "spec/spec_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* ---- the fields of the sections other modules name (the filter language's model.*, hp.*,
 * resources.*) ---------------------------------------------------------------------------- */

const char *const spec_model_keys[] = {"type", "n_layer", "n_head", "n_embd", "seq_len", "vocab", "vocab_size",
                                       "hidden", "n_inputs", "n_classes", "init_from", NULL};
const char *const spec_hparam_keys[] = {"lr", "global_batch_size", "micro_batch_size", "max_steps", "warmup_steps",
                                        "weight_decay", "grad_clip", "seed", "beta1", "beta2", "eps",
                                        "min_lr_fraction", "eval_every", "eval_batches", "sample_every",
                                        "sample_tokens", "temperature", "top_k", NULL};
const char *const spec_resource_keys[] = {"nodes", "slots_per_node", "slot_type", "device", "threads_per_rank",
                                          "memory_limit_mb", NULL};

spec_kind_t spec_key_kind(const char *section, const char *key)
{
    static const char *const text[] = {"model.type", "model.vocab", "model.init_from", "resources.slot_type",
                                       "resources.device", NULL};
    const char *const *keys = !strcmp(section, "model")             ? spec_model_keys
                              : !strcmp(section, "hyperparameters") ? spec_hparam_keys
                              : !strcmp(section, "resources")       ? spec_resource_keys
                                                                    : NULL;
    bool known = false;
    for (size_t i = 0; keys && keys[i] && !known; i++)
        known = !strcmp(keys[i], key);
    if (!known)
        return SPEC_KIND_NONE;
    if (!strcmp(section, "model") && !strcmp(key, "hidden"))
        return SPEC_KIND_LIST;
    size_t sl = strlen(section);
    for (size_t i = 0; text[i]; i++)
        if (!strncmp(text[i], section, sl) && text[i][sl] == '.' && !strcmp(text[i] + sl + 1, key))
            return SPEC_KIND_TEXT;
    return SPEC_KIND_NUMBER;
}

/* ---- reading helpers ----------------------------------------------------------------------- */

static const char *rd_path(const rd_t *r, const char *key, char *buf, size_t n)
{
    if (r->section[0])
        snprintf(buf, n, "%s.%s", r->section, key);
    else
        snprintf(buf, n, "%s", key);
    return buf;
}

int rd_fail(const rd_t *r, const char *key, const char *fmt, const char *what)
{
    char path[192];
    rd_path(r, key, path, sizeof(path));
    return kiln_err_set(r->err, KILN_EINVAL, path, fmt, path, what);
}

/* Rejects keys of obj that are not in allowed (NULL-terminated). */
int rd_known_keys(const rd_t *r, const json_t *obj, const char *const allowed[])
{
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)obj, key, val) {
        (void)val;
        bool found = false;
        for (size_t i = 0; allowed[i] && !found; i++)
            found = !strcmp(key, allowed[i]);
        if (found)
            continue;
        /* Only an unknown key pays for the "did you mean" search. */
        const char *best = NULL;
        int best_d = 99;
        for (size_t i = 0; allowed[i]; i++) {
            int d = kiln_edit_distance(key, allowed[i]);
            if (d < best_d) {
                best_d = d;
                best = allowed[i];
            }
        }
        char path[192];
        rd_path(r, key, path, sizeof(path));
        kiln_err_set(r->err, KILN_EINVAL, path, "unknown field \"%s\"", path);
        if (best && best_d <= 3)
            kiln_err_hint(r->err, "did you mean \"%s\"?", best);
        else {
            char list[512] = "";
            for (size_t i = 0; allowed[i]; i++) {
                strncat(list, i ? ", " : "", sizeof(list) - strlen(list) - 1);
                strncat(list, allowed[i], sizeof(list) - strlen(list) - 1);
            }
            kiln_err_hint(r->err, "known fields%s%s: %s", r->section[0] ? " of " : "",
                          r->section[0] ? r->section : "", list);
        }
        return KILN_EINVAL;
    }
    return 0;
}

/* Object member that must be an object (or absent/null -> *out NULL). */
int rd_object(const rd_t *r, const json_t *obj, const char *key, const json_t **out)
{
    *out = NULL;
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_object(v))
        return rd_fail(r, key, "%s must be an object%s", "");
    *out = v;
    return 0;
}

int rd_int64(const rd_t *r, const json_t *obj, const char *key, int64_t *out, int64_t lo, int64_t hi)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v || json_is_null(v))
        return 0; /* keep default */
    int64_t x;
    if (json_is_integer(v))
        x = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 9e15)
        x = (int64_t)json_real_value(v);
    else
        return rd_fail(r, key, "%s must be an integer%s", "");
    if (x < lo || x > hi) {
        char path[192];
        rd_path(r, key, path, sizeof(path));
        return kiln_err_set(r->err, KILN_EINVAL, path, "%s must be between %lld and %lld (got %lld)", path,
                            (long long)lo, (long long)hi, (long long)x);
    }
    *out = x;
    return 0;
}

int rd_int(const rd_t *r, const json_t *obj, const char *key, int *out, int lo, int hi)
{
    int64_t x = *out;
    int rc = rd_int64(r, obj, key, &x, lo, hi);
    if (rc == 0)
        *out = (int)x;
    return rc;
}

/* lo_open: whether lo itself is excluded. */
static int rd_double(const rd_t *r, const json_t *obj, const char *key, double *out, double lo, bool lo_open,
                     double hi)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v))
        return rd_fail(r, key, "%s must be a number%s", "");
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || (lo_open && x == lo) || x > hi) {
        char path[192];
        rd_path(r, key, path, sizeof(path));
        return kiln_err_set(r->err, KILN_EINVAL, path, "%s must be %s %g and at most %g (got %g)", path,
                            lo_open ? "greater than" : "at least", lo, hi, x);
    }
    *out = x;
    return 0;
}

int rd_bool(const rd_t *r, const json_t *obj, const char *key, bool *out)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return rd_fail(r, key, "%s must be true or false%s", "");
    *out = json_is_true(v);
    return 0;
}

int rd_string(const rd_t *r, const json_t *obj, const char *key, char *out, size_t n)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return rd_fail(r, key, "%s must be a string%s", "");
    const char *s = json_string_value(v);
    if (strlen(s) >= n) {
        char path[192];
        rd_path(r, key, path, sizeof(path));
        return kiln_err_set(r->err, KILN_EINVAL, path, "%s is too long (at most %zu characters)", path, n - 1);
    }
    kiln_strlcpy(out, s, n);
    return 0;
}

/* String that must be one of the choices (NULL-terminated). */
static int rd_choice(const rd_t *r, const json_t *obj, const char *key, char *out, size_t n,
                     const char *const choices[])
{
    /* read into room for longer text than any choice, so a long wrong value ("ml.m5.xlarge" for
     * a slot type) hears the choices rather than the field's length */
    char got[128];
    kiln_strlcpy(got, out, sizeof(got));
    int rc = rd_string(r, obj, key, got, sizeof(got));
    if (rc)
        return rc;
    for (size_t i = 0; choices[i]; i++)
        if (!strcmp(got, choices[i]) && strlen(got) < n) {
            kiln_strlcpy(out, got, n);
            return 0;
        }
    char path[192], list[256] = "";
    rd_path(r, key, path, sizeof(path));
    for (size_t i = 0; choices[i]; i++) {
        strncat(list, i ? ", " : "", sizeof(list) - strlen(list) - 1);
        strncat(list, "\"", sizeof(list) - strlen(list) - 1);
        strncat(list, choices[i], sizeof(list) - strlen(list) - 1);
        strncat(list, "\"", sizeof(list) - strlen(list) - 1);
    }
    kiln_err_set(r->err, KILN_EINVAL, path, "%s must be one of %s (got \"%s\")", path, list, got);
    return KILN_EINVAL;
}

int invalid(kiln_err_t *err, const char *field, const char *hint, const char *fmt, ...)
{
    if (!err)
        return KILN_EINVAL;
    kiln_err_clear(err);
    err->status = KILN_EINVAL;
    kiln_strlcpy(err->field, field, sizeof(err->field));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    if (hint)
        kiln_strlcpy(err->hint, hint, sizeof(err->hint));
    return KILN_EINVAL;
}

/* ---- sections ---------------------------------------------------------------------------------- */

/* An absolute path in buf is stored in its lexical normal form ("/data/../etc/x" is "/etc/x"),
 * so what kilnd checks, stores and shows is what kiln-train and the agent see. Relative paths
 * (kiln-train on its own reads them from the spec's directory) are left as they are. */
int normalize_path(char *buf, size_t n, const char *field, kiln_err_t *err)
{
    if (buf[0] != '/')
        return 0;
    kiln_err_t e2;
    if (kiln_path_normalize(buf, buf, n, &e2) != 0)
        return invalid(err, field, NULL, "%s is not a usable path: %s", field, e2.message);
    return 0;
}

/* model.init_from names either an llm.c file (a path, normalised like every path) or another
 * job's final model as "job:<id>" (a UUID, stored in lower case): whether that job exists, may be
 * read by the submitter and has a model is kilnd's question at submission. */
static int normalize_init_from(char *buf, size_t n, kiln_err_t *err)
{
    if (strncmp(buf, "job:", 4) != 0)
        return normalize_path(buf, n, "model.init_from", err);
    char *id = buf + 4;
    static const int dash[] = {8, 13, 18, 23};
    bool ok = strlen(id) == 36;
    for (int i = 0, d = 0; ok && i < 36; i++) {
        if (d < 4 && i == dash[d]) {
            ok = id[i] == '-';
            d++;
        } else if (id[i] >= 'A' && id[i] <= 'F') {
            id[i] = (char)(id[i] - 'A' + 'a');
        } else {
            ok = (id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f');
        }
    }
    if (!ok)
        return invalid(err, "model.init_from", "write \"job:\" and the job's id, as kilnd gave it (a UUID)",
                       "model.init_from \"%.60s\" names no job: the part after \"job:\" is not a job id", buf);
    return 0;
}

static int parse_model(const json_t *m, spec_t *s, kiln_err_t *err)
{
    rd_t r = {err, "model"};
    const char *const *keys = spec_model_keys;
    static const char *const vocabs[] = {"bytes", "gpt2", "custom", NULL};
    spec_model_t *mo = &s->model;
    int rc;
    if (!m)
        return invalid(err, "model", "add for example \"model\": {\"type\": \"gpt\"}", "model is required");
    if ((rc = rd_known_keys(&r, m, keys)))
        return rc;
    if (!json_object_get(m, "type")) {
        char list[128] = "";
        for (size_t i = 0; spec_models[i]; i++)
            snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s\"%s\"", i ? ", " : "", spec_models[i]);
        return invalid(err, "model.type", NULL, "model.type is required: one of %s", list);
    }
    if ((rc = rd_choice(&r, m, "type", mo->type, sizeof(mo->type), spec_models)))
        return rc;
    mo->n_layer = 4;
    mo->n_head = 4;
    mo->n_embd = 128;
    mo->seq_len = 64;
    kiln_strlcpy(mo->vocab, "bytes", sizeof(mo->vocab));
    if ((rc = rd_int(&r, m, "n_layer", &mo->n_layer, 1, 1024)) || (rc = rd_int(&r, m, "n_head", &mo->n_head, 1, 1024)) ||
        (rc = rd_int(&r, m, "n_embd", &mo->n_embd, 1, 65536)) ||
        (rc = rd_int(&r, m, "seq_len", &mo->seq_len, 1, 65536)) ||
        (rc = rd_int(&r, m, "vocab_size", &mo->vocab_size, 0, 1 << 24)) ||
        (rc = rd_int(&r, m, "n_inputs", &mo->n_inputs, 0, 1 << 24)) ||
        (rc = rd_int(&r, m, "n_classes", &mo->n_classes, 0, 1 << 24)) ||
        (rc = rd_string(&r, m, "init_from", mo->init_from, sizeof(mo->init_from))) ||
        (rc = normalize_init_from(mo->init_from, sizeof(mo->init_from), err)))
        return rc;
    bool vocab_given = json_object_get(m, "vocab") != NULL;
    if ((rc = rd_choice(&r, m, "vocab", mo->vocab, sizeof(mo->vocab), vocabs)))
        return rc;
    if (mo->vocab_size > 0 && !vocab_given)
        kiln_strlcpy(mo->vocab, "custom", sizeof(mo->vocab));
    if (!strcmp(mo->vocab, "bytes")) {
        if (mo->vocab_size && mo->vocab_size != 256)
            return invalid(err, "model.vocab_size", "drop vocab_size, or set \"vocab\": \"custom\"",
                           "model.vocab_size must be 256 for the \"bytes\" vocabulary (got %d)", mo->vocab_size);
        mo->vocab_size = 256;
    } else if (!strcmp(mo->vocab, "gpt2")) {
        if (mo->vocab_size && mo->vocab_size != 50257)
            return invalid(err, "model.vocab_size", "drop vocab_size, or set \"vocab\": \"custom\"",
                           "model.vocab_size must be 50257 for the \"gpt2\" vocabulary (got %d)", mo->vocab_size);
        mo->vocab_size = 50257;
    } else if (mo->vocab_size <= 0) {
        return invalid(err, "model.vocab_size", "set model.vocab_size to the number of token ids",
                       "model.vocab_size is required for a custom vocabulary");
    }
    mo->padded_vocab_size = (mo->vocab_size + 63) / 64 * 64;

    /* the fields of the model's kind (spec/caps.c's table); another kind's is refused */
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)m, key, val) {
        char f[96];
        if (spec_model_reads(mo->type, key))
            continue;
        char list[256] = "";
        for (size_t i = 0; spec_model_keys[i]; i++)
            if (spec_model_reads(mo->type, spec_model_keys[i]))
                snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", i ? ", " : "", spec_model_keys[i]);
        snprintf(f, sizeof(f), "model.%.80s", key);
        return invalid(err, f, NULL, "%s does not apply to a \"%s\" model, which reads %s", f, mo->type, list);
    }
    (void)val;
    if (spec_model_reads(mo->type, "n_head") && mo->n_embd % mo->n_head)
        return invalid(err, "model.n_head", "choose n_head so that n_embd / n_head is a whole number",
                       "model.n_head (%d) must divide model.n_embd (%d)", mo->n_head, mo->n_embd);
    if (spec_model_reads(mo->type, "hidden")) {
        json_t *h = json_object_get(m, "hidden");
        if (h && !json_is_null(h)) {
            if (!json_is_array(h) || json_array_size(h) > SPEC_MAX_HIDDEN)
                return invalid(err, "model.hidden", NULL, "model.hidden must be an array of at most %d widths",
                               SPEC_MAX_HIDDEN);
            for (size_t i = 0; i < json_array_size(h); i++) {
                json_t *w = json_array_get(h, i);
                if (!json_is_integer(w) || json_integer_value(w) < 1 || json_integer_value(w) > 1 << 20) {
                    char f[64];
                    snprintf(f, sizeof(f), "model.hidden[%zu]", i);
                    return invalid(err, f, NULL, "%s must be an integer between 1 and %d", f, 1 << 20);
                }
                mo->hidden[i] = (int)json_integer_value(w);
            }
            mo->n_hidden = (int)json_array_size(h);
        } else {
            mo->hidden[0] = 128;
            mo->n_hidden = 1;
        }
    }
    if (spec_model_reads(mo->type, "n_inputs") && mo->n_inputs <= 0)
        return invalid(err, "model.n_inputs", "set the number of input features",
                       "model.n_inputs is required for a \"%s\" model", mo->type);
    if (spec_model_reads(mo->type, "n_classes") && mo->n_classes < 2)
        return invalid(err, "model.n_classes", "set the number of classes (at least 2)",
                       "model.n_classes is required for a \"%s\" model and must be at least 2", mo->type);
    return 0;
}

static int parse_data(const json_t *d, spec_t *s, kiln_err_t *err)
{
    rd_t r = {err, "data"};
    static const char *const keys[] = {"train", "val", "val_fraction", "format", NULL};
    static const char *const formats[] = {"text", "tokens", "synthetic", NULL};
    spec_data_t *da = &s->data;
    int rc;
    da->val_fraction = 0.1;
    if (!d)
        return invalid(err, "data", "add \"data\": {\"train\": \"file:///path/to/corpus.txt\"}", "data is required");
    if ((rc = rd_known_keys(&r, d, keys)))
        return rc;
    if ((rc = rd_string(&r, d, "train", da->train, sizeof(da->train))) ||
        (rc = rd_string(&r, d, "val", da->val, sizeof(da->val))) ||
        (rc = rd_double(&r, d, "val_fraction", &da->val_fraction, 0.0, false, 0.5)))
        return rc;
    if (!da->train[0])
        return invalid(err, "data.train", "point it at a text file or an llm.c token shard, e.g. \"file:///data/tinyshakespeare.txt\"",
                       "data.train is required");
    if ((rc = spec_input_path(da->train, "data.train", err)) || (rc = spec_input_path(da->val, "data.val", err)))
        return rc;
    bool synthetic = !strcmp(da->train, "synthetic");
    const char *ext = strrchr(da->train, '.');
    kiln_strlcpy(da->format, synthetic ? "synthetic" : (ext && !strcmp(ext, ".bin")) ? "tokens" : "text", sizeof(da->format));
    if ((rc = rd_choice(&r, d, "format", da->format, sizeof(da->format), formats)))
        return rc;
    /* whether the model trains on this kind of data is the capability table's (spec_caps_check) */
    if (!strcmp(da->format, "text") && spec_model_reads(s->model.type, "vocab") && strcmp(s->model.vocab, "bytes"))
        return invalid(err, "data.format", "use a token shard (.bin) for the gpt2 or a custom vocabulary, or \"vocab\": \"bytes\"",
                       "text data is tokenised byte by byte and needs model.vocab \"bytes\" (got \"%s\")", s->model.vocab);
    return 0;
}

static int parse_hparams(const json_t *h, spec_t *s, kiln_err_t *err)
{
    rd_t r = {err, "hyperparameters"};
    const char *const *keys = spec_hparam_keys;
    spec_hparams_t *hp = &s->hp;
    int rc;
    hp->lr = 3e-4;
    hp->global_batch_size = 8;
    hp->max_steps = 100;
    hp->grad_clip = 1.0;
    hp->seed = 1337;
    hp->beta1 = 0.9;
    hp->beta2 = 0.95;
    hp->eps = 1e-8;
    hp->min_lr_fraction = 0.1;
    hp->eval_batches = 8;
    hp->sample_tokens = 256;
    hp->temperature = 1.0;
    hp->top_k = 40;
    if (!h)
        return 0;
    if ((rc = rd_known_keys(&r, h, keys)))
        return rc;
    int64_t seed = 1337;
    if ((rc = rd_double(&r, h, "lr", &hp->lr, 0.0, true, 10.0)) ||
        (rc = rd_int(&r, h, "global_batch_size", &hp->global_batch_size, 1, 1 << 24)) ||
        (rc = rd_int(&r, h, "micro_batch_size", &hp->micro_batch_size, 0, 1 << 24)) ||
        (rc = rd_int64(&r, h, "max_steps", &hp->max_steps, 1, (int64_t)1 << 40)) ||
        (rc = rd_int(&r, h, "warmup_steps", &hp->warmup_steps, 0, 1 << 30)) ||
        (rc = rd_double(&r, h, "weight_decay", &hp->weight_decay, 0.0, false, 10.0)) ||
        (rc = rd_double(&r, h, "grad_clip", &hp->grad_clip, 0.0, false, 1e9)) ||
        (rc = rd_int64(&r, h, "seed", &seed, 0, INT64_MAX)) ||
        (rc = rd_double(&r, h, "beta1", &hp->beta1, 0.0, false, 0.999999)) ||
        (rc = rd_double(&r, h, "beta2", &hp->beta2, 0.0, false, 0.999999)) ||
        (rc = rd_double(&r, h, "eps", &hp->eps, 0.0, true, 1.0)) ||
        (rc = rd_double(&r, h, "min_lr_fraction", &hp->min_lr_fraction, 0.0, false, 1.0)) ||
        (rc = rd_int(&r, h, "eval_every", &hp->eval_every, 0, 1 << 30)) ||
        (rc = rd_int(&r, h, "eval_batches", &hp->eval_batches, 1, 1 << 20)) ||
        (rc = rd_int(&r, h, "sample_every", &hp->sample_every, 0, 1 << 30)) ||
        (rc = rd_int(&r, h, "sample_tokens", &hp->sample_tokens, 0, 1 << 20)) ||
        (rc = rd_double(&r, h, "temperature", &hp->temperature, 0.0, true, 100.0)) ||
        (rc = rd_int(&r, h, "top_k", &hp->top_k, 0, 1 << 24)))
        return rc;
    hp->seed = (uint64_t)seed;
    return 0;
}

static int parse_resources(const json_t *o, spec_t *s, kiln_err_t *err)
{
    rd_t r = {err, "resources"};
    const char *const *keys = spec_resource_keys;
    static const char *const slot_types[] = {"cpu", "gpu", NULL};
    static const char *const devices[] = {"auto", "cpu", "cuda", NULL};
    spec_resources_t *res = &s->res;
    int rc;
    res->nodes = 1;
    res->slots_per_node = 1;
    kiln_strlcpy(res->slot_type, "cpu", sizeof(res->slot_type));
    kiln_strlcpy(res->device, "auto", sizeof(res->device));
    if (o) {
        if ((rc = rd_known_keys(&r, o, keys)))
            return rc;
        if ((rc = rd_int(&r, o, "nodes", &res->nodes, 1, 4096)) ||
            (rc = rd_int(&r, o, "slots_per_node", &res->slots_per_node, 1, 256)) ||
            (rc = rd_choice(&r, o, "slot_type", res->slot_type, sizeof(res->slot_type), slot_types)) ||
            (rc = rd_choice(&r, o, "device", res->device, sizeof(res->device), devices)) ||
            (rc = rd_int(&r, o, "threads_per_rank", &res->threads_per_rank, 0, 1024)) ||
            (rc = rd_int64(&r, o, "memory_limit_mb", &res->memory_limit_mb, 0, (int64_t)1 << 40)))
            return rc;
    }
    if (!strcmp(res->device, "cuda") && strcmp(res->slot_type, "gpu"))
        return invalid(err, "resources.device", "set \"slot_type\": \"gpu\" so the job is placed on GPU slots",
                       "resources.device \"cuda\" needs resources.slot_type \"gpu\"");
    return 0;
}

static int parse_distribution(const json_t *o, spec_t *s, kiln_err_t *err)
{
    rd_t r = {err, "distribution"};
    static const char *const keys[] = {"data_parallel", "model_parallel", "mixed_precision",
                                       "activation_checkpointing", NULL};
    static const char *const dp_keys[] = {"enabled", "bucket_mb", "shard_optimizer_state", "gradient_dtype", NULL};
    static const char *const mp_keys[] = {"partitions", "microbatches", "pipeline", "optimize", "auto_partition",
                                          "partition_plan", NULL};
    static const char *const pipelines[] = {"simple", "interleaved", NULL};
    static const char *const optimizes[] = {"speed", "memory", NULL};
    static const char *const precisions[] = {"", "none", "fp32", "bf16", NULL};
    static const char *const gradient_dtypes[] = {"fp32", "bf16", NULL};
    spec_distribution_t *d = &s->dist;
    int rc;
    d->dp_bucket_mb = 0; /* not set: engine/dp chooses it from the model */
    kiln_strlcpy(d->dp_gradient_dtype, "fp32", sizeof(d->dp_gradient_dtype));
    d->mp_partitions = 1;
    d->mp_microbatches = 0; /* not set: a pipeline chooses it from the job (engine's eng_microbatches_choose) */
    kiln_strlcpy(d->mp_pipeline, "interleaved", sizeof(d->mp_pipeline));
    kiln_strlcpy(d->mp_optimize, "speed", sizeof(d->mp_optimize));
    d->mp_auto_partition = true;
    const json_t *dp = NULL, *mp = NULL;
    bool dp_given = false;
    if (o) {
        if ((rc = rd_known_keys(&r, o, keys)) || (rc = rd_object(&r, o, "data_parallel", &dp)) ||
            (rc = rd_object(&r, o, "model_parallel", &mp)) ||
            (rc = rd_choice(&r, o, "mixed_precision", d->mixed_precision, sizeof(d->mixed_precision), precisions)) ||
            (rc = rd_bool(&r, o, "activation_checkpointing", &d->activation_checkpointing)))
            return rc;
        if (!strcmp(d->mixed_precision, "none") || !strcmp(d->mixed_precision, "fp32"))
            d->mixed_precision[0] = '\0';
    }
    if (dp) {
        rd_t rdp = {err, "distribution.data_parallel"};
        dp_given = json_object_get(dp, "enabled") != NULL;
        if ((rc = rd_known_keys(&rdp, dp, dp_keys)) || (rc = rd_bool(&rdp, dp, "enabled", &d->dp_enabled)) ||
            (rc = rd_double(&rdp, dp, "bucket_mb", &d->dp_bucket_mb, 0.0, true, 4096.0)) ||
            (rc = rd_bool(&rdp, dp, "shard_optimizer_state", &d->dp_shard_optimizer_state)) ||
            (rc = rd_choice(&rdp, dp, "gradient_dtype", d->dp_gradient_dtype, sizeof(d->dp_gradient_dtype),
                            gradient_dtypes)))
            return rc;
    }
    if (mp) {
        rd_t rmp = {err, "distribution.model_parallel"};
        if ((rc = rd_known_keys(&rmp, mp, mp_keys)) || (rc = rd_int(&rmp, mp, "partitions", &d->mp_partitions, 1, 4096)) ||
            (rc = rd_int(&rmp, mp, "microbatches", &d->mp_microbatches, 1, 1 << 16)) ||
            (rc = rd_choice(&rmp, mp, "pipeline", d->mp_pipeline, sizeof(d->mp_pipeline), pipelines)) ||
            (rc = rd_choice(&rmp, mp, "optimize", d->mp_optimize, sizeof(d->mp_optimize), optimizes)) ||
            (rc = rd_bool(&rmp, mp, "auto_partition", &d->mp_auto_partition)))
            return rc;
        json_t *plan = json_object_get(mp, "partition_plan");
        if (plan && json_is_string(plan)) {
            json_error_t je;
            json_t *parsed = json_loads(json_string_value(plan), 0, &je);
            if (!parsed)
                return invalid(err, "distribution.model_parallel.partition_plan", "pass the plan kiln wrote, as an object or its JSON text",
                               "distribution.model_parallel.partition_plan is not valid JSON: %s (line %d, column %d)",
                               je.text, je.line, je.column);
            if (!json_is_object(parsed)) {
                /* the same answer as for the array itself (and as gRPC, which sends the text) */
                json_decref(parsed);
                return invalid(err, "distribution.model_parallel.partition_plan", "pass the plan kiln wrote, as an object",
                               "distribution.model_parallel.partition_plan must be an object");
            }
            d->mp_partition_plan = parsed;
        } else if (plan && json_is_object(plan)) {
            d->mp_partition_plan = json_deep_copy(plan);
        } else if (plan && !json_is_null(plan)) {
            return invalid(err, "distribution.model_parallel.partition_plan", "pass the plan kiln wrote, as an object",
                           "distribution.model_parallel.partition_plan must be an object");
        }
        if (d->mp_partition_plan && !json_object_get(mp, "auto_partition"))
            d->mp_auto_partition = false;
    }
    int world = spec_world_size(s);
    if (world % d->mp_partitions)
        return invalid(err, "distribution.model_parallel.partitions",
                       "make nodes x slots_per_node a multiple of the number of partitions",
                       "distribution.model_parallel.partitions (%d) must divide the job's %d ranks (nodes x slots_per_node)",
                       d->mp_partitions, world);
    /* whether the model can be cut at all is the capability table's (spec_caps_check) */
    int blocks = spec_model_blocks(&s->model);
    if (blocks > 0 && d->mp_partitions > blocks)
        return invalid(err, "distribution.model_parallel.partitions", "use at most as many partitions as the model has blocks",
                       "distribution.model_parallel.partitions (%d) exceeds the %d blocks a pipeline can cut this %s "
                       "model into", d->mp_partitions, blocks, s->model.type);
    int replicas = world / d->mp_partitions;
    if (replicas > 1 && dp_given && !d->dp_enabled)
        return invalid(err, "distribution.data_parallel.enabled",
                       "enable data parallelism, or lower nodes x slots_per_node to the number of partitions",
                       "the job has %d ranks and %d partitions, so %d replicas need data parallelism, but it is disabled",
                       world, d->mp_partitions, replicas);
    if (replicas > 1)
        d->dp_enabled = true;
    return 0;
}

static int parse_rest(const json_t *in, spec_t *s, kiln_err_t *err)
{
    rd_t r = {err, ""};
    const json_t *ck = NULL, *st = NULL, *rt = NULL;
    int rc;
    s->ckpt_keep_last = 3;
    s->max_attempts = 1;
    s->queue[0] = '\0'; /* none named: the project's default queue (svc_queue_resolve_job) */
    if ((rc = rd_object(&r, in, "checkpoint", &ck)) || (rc = rd_object(&r, in, "stopping", &st)) ||
        (rc = rd_object(&r, in, "retry", &rt)))
        return rc;
    if (ck) {
        rd_t rc2 = {err, "checkpoint"};
        static const char *const keys[] = {"every_steps", "keep_last", "path", NULL};
        if ((rc = rd_known_keys(&rc2, ck, keys)) || (rc = rd_int(&rc2, ck, "every_steps", &s->ckpt_every_steps, 0, 1 << 30)) ||
            (rc = rd_int(&rc2, ck, "keep_last", &s->ckpt_keep_last, 1, 1000)) ||
            (rc = rd_string(&rc2, ck, "path", s->ckpt_path, sizeof(s->ckpt_path) - 64)))
            return rc;
        if (s->ckpt_path[0] && s->ckpt_path[0] != '/')
            return invalid(err, "checkpoint.path", "name a directory every agent can reach, such as an NFS "
                           "mount: \"/mnt/shared/kiln-checkpoints\"",
                           "checkpoint.path must be an absolute path (got \"%s\")", s->ckpt_path);
        if ((rc = normalize_path(s->ckpt_path, sizeof(s->ckpt_path) - 64, "checkpoint.path", err)))
            return rc;
    }
    if (st) {
        rd_t rs = {err, "stopping"};
        static const char *const keys[] = {"max_runtime_s", "grace_period_s", "max_steps", NULL};
        if ((rc = rd_known_keys(&rs, st, keys)) || (rc = rd_int64(&rs, st, "max_runtime_s", &s->max_runtime_s, 0, (int64_t)1 << 40)) ||
            (rc = rd_int(&rs, st, "grace_period_s", &s->grace_period_s, 0, SPEC_MAX_GRACE_S)) ||
            (rc = rd_int64(&rs, st, "max_steps", &s->pause_at_step, 0, (int64_t)1 << 40)))
            return rc;
        /* a script pauses where its ranks are told to (KILN_PAUSE_AT_STEP), within the steps it
         * says it trains to */
        int64_t total = spec_is_script(s) ? spec_script_max_steps(s) : s->hp.max_steps;
        if (s->pause_at_step > 0 && total == 0)
            return invalid(err, "stopping.max_steps", "add hyperparameters.max_steps (the step count your script "
                           "trains to), and have the script stop at KILN_PAUSE_AT_STEP with a checkpoint",
                           "stopping.max_steps pauses a script job at a step of its hyperparameters.max_steps; "
                           "this one has no whole-number hyperparameters.max_steps");
        if (s->pause_at_step > 0 && s->pause_at_step > total)
            return invalid(err, "stopping.max_steps", "make it at most hyperparameters.max_steps",
                           "stopping.max_steps (%lld) is past hyperparameters.max_steps (%lld)",
                           (long long)s->pause_at_step, (long long)total);
    }
    if (rt) {
        rd_t rr = {err, "retry"};
        static const char *const keys[] = {"max_attempts", NULL};
        if ((rc = rd_known_keys(&rr, rt, keys)) || (rc = rd_int(&rr, rt, "max_attempts", &s->max_attempts, 1, 100)))
            return rc;
    }
    if ((rc = rd_int(&r, in, "priority", &s->priority, -1000, 1000)) ||
        (rc = rd_string(&r, in, "queue", s->queue, sizeof(s->queue))))
        return rc;
    if (json_is_string(json_object_get(in, "queue")) && !s->queue[0])
        return invalid(err, "queue", "leave queue out to use the project's default queue",
                       "queue must name a queue");

    json_t *defs = json_object_get(in, "metric_definitions");
    if (defs && !json_is_null(defs)) {
        if (!json_is_array(defs) || json_array_size(defs) > SPEC_MAX_METRIC_DEFS)
            return invalid(err, "metric_definitions", NULL, "metric_definitions must be an array of at most %d {name, regex} objects",
                           SPEC_MAX_METRIC_DEFS);
        for (size_t i = 0; i < json_array_size(defs); i++) {
            char sec[64];
            snprintf(sec, sizeof(sec), "metric_definitions[%zu]", i);
            rd_t rm = {err, sec};
            json_t *d = json_array_get(defs, i);
            static const char *const keys[] = {"name", "regex", NULL};
            spec_metric_def_t *md = &s->metric_defs[i];
            if (!json_is_object(d))
                return invalid(err, sec, NULL, "%s must be an object with \"name\" and \"regex\"", sec);
            if ((rc = rd_known_keys(&rm, d, keys)) || (rc = rd_string(&rm, d, "name", md->name, sizeof(md->name))) ||
                (rc = rd_string(&rm, d, "regex", md->regex, sizeof(md->regex))))
                return rc;
            char f[96];
            snprintf(f, sizeof(f), "%s.name", sec);
            if (!md->name[0] || strspn(md->name, "abcdefghijklmnopqrstuvwxyz0123456789_.") != strlen(md->name))
                return invalid(err, f, "use lower-case letters, digits, '_' and '.'", "%s must be a non-empty metric name", f);
            snprintf(f, sizeof(f), "%s.regex", sec);
            void *re = kiln_metric_regex_compile(md->regex, f, NULL, NULL, err);
            if (!re)
                return err ? err->status : KILN_EINVAL;
            pcre2_code_free(re);
        }
        s->n_metric_defs = (int)json_array_size(defs);
    }

    json_t *tags = json_object_get(in, "tags");
    if (tags && !json_is_null(tags)) {
        if (!json_is_object(tags) || json_object_size(tags) > SPEC_MAX_TAGS)
            return invalid(err, "tags", NULL, "tags must be an object of at most %d string values", SPEC_MAX_TAGS);
        const char *k;
        json_t *v;
        json_object_foreach(tags, k, v) {
            /* the key as a message shows a client's input: control characters escaped, cut at 80 */
            char f[160], q[128];
            kiln_text_quote(q, sizeof(q), k, strlen(k), 80);
            snprintf(f, sizeof(f), "tags.%s", q);
            if (!k[0] || strlen(k) >= sizeof(s->tag_keys[0]) || strchr(k, ':') || strchr(k, ',') ||
                kiln_text_control_at(k, strlen(k)) < strlen(k))
                return invalid(err, f, "use short keys without ':', ',' or control characters",
                               "tag key \"%s\" is empty, too long or contains ':', ',' or a control character", q);
            if (!json_is_string(v) || json_string_length(v) >= sizeof(s->tag_values[0]))
                return invalid(err, f, NULL, "%s must be a string of at most %zu characters", f, sizeof(s->tag_values[0]) - 1);
            if (kiln_text_control_at(json_string_value(v), json_string_length(v)) < json_string_length(v))
                return invalid(err, f, "write the value on one line without control characters (tab, CR, ESC, other "
                               "C0 or C1 codes, DEL) or bidirectional overrides (U+202A to U+202E, U+2066 to U+2069)",
                               "%s has a control character", f);
            kiln_strlcpy(s->tag_keys[s->n_tags], k, sizeof(s->tag_keys[0]));
            kiln_strlcpy(s->tag_values[s->n_tags], json_string_value(v), sizeof(s->tag_values[0]));
            s->n_tags++;
        }
    }
    return 0;
}

static int check_batches(spec_t *s, kiln_err_t *err)
{
    int replicas = spec_dp_replicas(s);
    spec_hparams_t *hp = &s->hp;
    if (hp->global_batch_size % replicas)
        return invalid(err, "hyperparameters.global_batch_size", "use a multiple of the number of data-parallel replicas",
                       "hyperparameters.global_batch_size (%d) must be divisible by the %d data-parallel replicas",
                       hp->global_batch_size, replicas);
    int per_replica = hp->global_batch_size / replicas;
    if (hp->micro_batch_size && per_replica % hp->micro_batch_size)
        return invalid(err, "hyperparameters.micro_batch_size",
                       "global_batch_size must equal replicas x micro_batch_size x accumulation steps",
                       "hyperparameters.micro_batch_size (%d) must divide the per-replica batch (%d = %d / %d replicas)",
                       hp->micro_batch_size, per_replica, hp->global_batch_size, replicas);
    int micro = hp->micro_batch_size ? hp->micro_batch_size : per_replica;
    if (s->dist.mp_partitions > 1 && s->dist.mp_microbatches > 0 && micro % s->dist.mp_microbatches)
        return invalid(err, "distribution.model_parallel.microbatches",
                       "choose a number of microbatches that divides the per-replica batch",
                       "distribution.model_parallel.microbatches (%d) must divide the per-replica batch (%d)",
                       s->dist.mp_microbatches, micro);
    if (hp->warmup_steps > hp->max_steps)
        return invalid(err, "hyperparameters.warmup_steps", NULL,
                       "hyperparameters.warmup_steps (%d) must not exceed max_steps (%lld)", hp->warmup_steps,
                       (long long)hp->max_steps);
    return 0;
}

/* ---- public ------------------------------------------------------------------------------------ */

int spec_world_size(const spec_t *s) { return s->res.nodes * s->res.slots_per_node; }

bool spec_engine_reports(const spec_t *s, const char *name, char *list, size_t cap)
{
    static const char *const engine[] = {SPEC_ENGINE_STEP_METRICS, SPEC_ENGINE_VAL_METRIC, SPEC_ENGINE_PIPE_METRIC};
    const size_t ne = sizeof(engine) / sizeof(engine[0]);
    for (size_t i = 0; i < ne; i++)
        if (!strcmp(engine[i], name))
            return true;
    for (int i = 0; i < s->n_metric_defs; i++)
        if (!strcmp(s->metric_defs[i].name, name))
            return true;
    if (list && cap) {
        size_t len = 0;
        list[0] = '\0';
        for (size_t i = 0; i < ne + (size_t)s->n_metric_defs && len < cap; i++)
            len += (size_t)snprintf(list + len, cap - len, "%s%s", i ? ", " : "",
                                    i < ne ? engine[i] : s->metric_defs[i - ne].name);
    }
    return false;
}

double spec_real_round(double v)
{
    if (!isfinite(v))
        return v;
    char text[40];
    snprintf(text, sizeof(text), "%.15g", v);
    return strtod(text, NULL);
}

const char *spec_device(const spec_t *s)
{
    if (!strcmp(s->res.device, "auto") && strcmp(s->res.slot_type, "gpu"))
        return "cpu";
    return s->res.device;
}

int spec_dp_replicas(const spec_t *s)
{
    int p = s->dist.mp_partitions > 0 ? s->dist.mp_partitions : 1;
    return spec_world_size(s) / p;
}

int spec_parse(const json_t *in, spec_t *out, kiln_err_t *err)
{
    static const char *const keys[] = {"name", "project", "model", "data", "hyperparameters", "resources",
                                       "distribution", "checkpoint", "metric_definitions", "stopping", "retry",
                                       "priority", "queue", "tags", "entry_point", "source", "python",
                                       "environment", NULL};
    memset(out, 0, sizeof(*out));
    kiln_err_clear(err);
    if (!json_is_object(in))
        return invalid(err, "", "send a JSON object such as {\"model\": {...}, \"data\": {...}}", "the job spec must be a JSON object");
    rd_t r = {err, ""};
    const json_t *model, *data, *hp, *res, *dist;
    int rc;
    /* SageMaker's spellings are read as kiln's, in a copy */
    json_t *copy = json_deep_copy(in);
    if (!copy)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    in = copy;
    kiln_strlcpy(out->name, "job", sizeof(out->name));
    kiln_strlcpy(out->project, "default", sizeof(out->project));
    if ((rc = rd_known_keys(&r, in, keys)) || (rc = spec_aliases(copy, err)) ||
        (rc = rd_string(&r, in, "name", out->name, sizeof(out->name))) ||
        (rc = rd_string(&r, in, "project", out->project, sizeof(out->project))) ||
        (rc = rd_object(&r, in, "model", &model)) || (rc = rd_object(&r, in, "data", &data)) ||
        (rc = rd_object(&r, in, "hyperparameters", &hp)) || (rc = rd_object(&r, in, "resources", &res)) ||
        (rc = rd_object(&r, in, "distribution", &dist)))
        goto fail;
    if (!out->name[0] || strspn(out->name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") != strlen(out->name)) {
        rc = invalid(err, "name", "use letters, digits, '-', '_' and '.'", "name \"%s\" is empty or has characters other than letters, digits, '-', '_' and '.'", out->name);
        goto fail;
    }
    const json_t *entry = json_object_get(in, "entry_point");
    bool script = entry && !json_is_null(entry);
    if (script && model) {
        rc = invalid(err, "entry_point", "leave out model to run your own script, or entry_point to train kiln's model",
                     "a job names either model (kiln's engine trains it) or entry_point (your own script), not both");
        goto fail;
    }
    if (!script && !model) {
        rc = invalid(err, "model", "add \"model\": {\"type\": \"gpt\"} to train kiln's model, or \"entry_point\": "
                     "\"train.py\" with a \"source\" to run your own script",
                     "a job names model (kiln's engine trains it) or entry_point (your own script); this one names neither");
        goto fail;
    }
    if (script) {
        if ((rc = parse_resources(res, out, err)) || (rc = spec_script_parse(in, out, err)) ||
            (rc = parse_rest(in, out, err)))
            goto fail;
    } else if ((rc = spec_engine_no_script_fields(in, err)) || (rc = parse_model(model, out, err)) ||
               (rc = parse_data(data, out, err)) || (rc = parse_hparams(hp, out, err)) ||
               (rc = parse_resources(res, out, err)) || (rc = parse_distribution(dist, out, err)) ||
               (rc = parse_rest(in, out, err)) || (rc = check_batches(out, err)) ||
               (rc = spec_caps_check(out, spec_backend(out), err))) {
        goto fail;
    }
    json_decref(copy);
    return 0;
fail:
    json_decref(copy);
    spec_deinit(out);
    return rc;
}

int spec_parse_string(const char *text, spec_t *out, kiln_err_t *err)
{
    json_error_t je;
    json_t *j = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        memset(out, 0, sizeof(*out));
        return invalid(err, "", "check the JSON syntax near that position",
                       "the job spec is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    }
    int rc = spec_parse(j, out, err);
    json_decref(j);
    return rc;
}

int spec_load_file(const char *path, spec_t *out, kiln_err_t *err)
{
    char *text = NULL;
    memset(out, 0, sizeof(*out));
    int rc = kiln_file_read(path, &text, NULL, err);
    if (rc)
        return rc;
    rc = spec_parse_string(text, out, err);
    free(text);
    if (rc && err && !strstr(err->message, path)) {
        char msg[sizeof(err->message) + SPEC_PATH + 4];
        snprintf(msg, sizeof(msg), "%s: %s", path, err->message);
        kiln_strlcpy(err->message, msg, sizeof(err->message));
    }
    return rc;
}

void spec_deinit(spec_t *s)
{
    if (!s)
        return;
    json_decref(s->dist.mp_partition_plan);
    s->dist.mp_partition_plan = NULL;
    json_decref(s->script.hyperparameters);
    s->script.hyperparameters = NULL;
    json_decref(s->script.environment);
    s->script.environment = NULL;
}

/* The value of the model section's field key in the normalised spec. */
static json_t *model_field_json(const spec_model_t *m, const char *key)
{
    if (!strcmp(key, "hidden")) {
        json_t *hidden = json_array();
        for (int i = 0; i < m->n_hidden; i++)
            json_array_append_new(hidden, json_integer(m->hidden[i]));
        return hidden;
    }
    if (!strcmp(key, "vocab"))
        return json_string(m->vocab);
    const struct {
        const char *key;
        int value;
    } ints[] = {{"n_layer", m->n_layer},       {"n_head", m->n_head},         {"n_embd", m->n_embd},
                {"seq_len", m->seq_len},       {"vocab_size", m->vocab_size}, {"n_inputs", m->n_inputs},
                {"n_classes", m->n_classes}};
    for (size_t i = 0; i < KILN_ARRAY_LEN(ints); i++)
        if (!strcmp(key, ints[i].key))
            return json_integer(ints[i].value);
    return json_null();
}

/* spec_to_json with "queue" always present ("" when the spec names none). */
static json_t *spec_json_all(const spec_t *s)
{
    json_t *res = json_pack("{s:i, s:i, s:s, s:s, s:i, s:I}", "nodes", s->res.nodes, "slots_per_node",
                            s->res.slots_per_node, "slot_type", s->res.slot_type, "device", s->res.device,
                            "threads_per_rank", s->res.threads_per_rank, "memory_limit_mb",
                            (json_int_t)s->res.memory_limit_mb);
    json_t *defs = json_array();
    for (int i = 0; i < s->n_metric_defs; i++)
        json_array_append_new(defs, json_pack("{s:s, s:s}", "name", s->metric_defs[i].name, "regex", s->metric_defs[i].regex));
    json_t *tags = json_object();
    for (int i = 0; i < s->n_tags; i++)
        json_object_set_new(tags, s->tag_keys[i], json_string(s->tag_values[i]));
    json_t *stopping = json_pack("{s:I}", "max_runtime_s", (json_int_t)s->max_runtime_s);
    if (s->grace_period_s)
        json_object_set_new(stopping, "grace_period_s", json_integer(s->grace_period_s));
    if (s->pause_at_step)
        json_object_set_new(stopping, "max_steps", json_integer((json_int_t)s->pause_at_step));
    json_t *ck = spec_is_script(s) ? json_pack("{s:i}", "every_steps", 0)
                                   : json_pack("{s:i, s:i}", "every_steps", s->ckpt_every_steps, "keep_last",
                                               s->ckpt_keep_last);
    if (s->ckpt_path[0])
        json_object_set_new(ck, "path", json_string(s->ckpt_path));
    if (spec_is_script(s))
        return spec_script_to_json(s, res, ck, defs, stopping, tags);
    /* the fields the model's kind reads, in spec_model_keys' order */
    json_t *model = json_pack("{s:s}", "type", s->model.type);
    for (size_t i = 0; spec_model_keys[i]; i++) {
        const char *k = spec_model_keys[i];
        if (strcmp(k, "type") && strcmp(k, "init_from") && spec_model_reads(s->model.type, k))
            json_object_set_new(model, k, model_field_json(&s->model, k));
    }
    if (s->model.init_from[0])
        json_object_set_new(model, "init_from", json_string(s->model.init_from));
    json_t *data = json_pack("{s:s, s:f, s:s}", "train", s->data.train, "val_fraction", s->data.val_fraction, "format",
                             s->data.format);
    if (s->data.val[0])
        json_object_set_new(data, "val", json_string(s->data.val));
    const spec_hparams_t *h = &s->hp;
    json_t *hp = json_pack("{s:f, s:i, s:i, s:I, s:i, s:f, s:f, s:I, s:f, s:f, s:f, s:f, s:i, s:i, s:i, s:i, s:f, s:i}",
                           "lr", h->lr, "global_batch_size", h->global_batch_size, "micro_batch_size",
                           h->micro_batch_size, "max_steps", (json_int_t)h->max_steps, "warmup_steps", h->warmup_steps,
                           "weight_decay", h->weight_decay, "grad_clip", h->grad_clip, "seed", (json_int_t)h->seed,
                           "beta1", h->beta1, "beta2", h->beta2, "eps", h->eps, "min_lr_fraction", h->min_lr_fraction,
                           "eval_every", h->eval_every, "eval_batches", h->eval_batches, "sample_every",
                           h->sample_every, "sample_tokens", h->sample_tokens, "temperature", h->temperature, "top_k",
                           h->top_k);
    const spec_distribution_t *d = &s->dist;
    json_t *dist = json_pack(
        "{s:{s:b, s:b, s:s}, s:{s:i, s:s, s:s, s:b, s:O?}, s:s, s:b}", "data_parallel", "enabled",
        d->dp_enabled, "shard_optimizer_state", d->dp_shard_optimizer_state,
        "gradient_dtype", d->dp_gradient_dtype, "model_parallel",
        "partitions", d->mp_partitions, "pipeline", d->mp_pipeline, "optimize",
        d->mp_optimize, "auto_partition", d->mp_auto_partition, "partition_plan", d->mp_partition_plan,
        "mixed_precision", d->mixed_precision[0] ? d->mixed_precision : "none", "activation_checkpointing",
        d->activation_checkpointing);
    /* absent when the user left them to the engine, so "chosen by kiln" stays visible */
    if (d->dp_bucket_mb > 0)
        json_object_set_new(json_object_get(dist, "data_parallel"), "bucket_mb", json_real(d->dp_bucket_mb));
    if (d->mp_microbatches > 0)
        json_object_set_new(json_object_get(dist, "model_parallel"), "microbatches", json_integer(d->mp_microbatches));
    return json_pack("{s:s, s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:{s:i}, s:i, s:s, s:o}", "name",
                     s->name, "project", s->project, "model", model, "data", data, "hyperparameters", hp, "resources", res,
                     "distribution", dist, "checkpoint", ck, "metric_definitions", defs, "stopping", stopping,
                     "retry", "max_attempts", s->max_attempts, "priority", s->priority, "queue", s->queue, "tags", tags);
}

json_t *spec_to_json(const spec_t *s)
{
    json_t *o = spec_json_all(s);
    if (o && !s->queue[0])
        json_object_del(o, "queue"); /* the project's default queue, decided at submission */
    return o;
}

bool spec_metric_steps_counted(const json_t *defs)
{
    size_t i;
    json_t *d;
    json_array_foreach(defs, i, d) {
        const char *regex = json_string_value(json_object_get(d, "regex"));
        int step_group = 0;
        kiln_err_t err;
        void *re = regex ? kiln_metric_regex_compile(regex, "metric_definitions", NULL, &step_group, &err) : NULL;
        if (!re)
            return true; /* spec_parse compiled it; should it not compile now, nothing says its steps are real */
        pcre2_code_free(re);
        if (step_group == 0)
            return true;
    }
    return false;
}
