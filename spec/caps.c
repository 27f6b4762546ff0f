/* caps.c - the table of what the training engine can run (spec.h's SPEC_MODEL_MAP and
 * SPEC_BACKEND_MAP) and the one refusal of each capability: what a job asks for, whether its
 * model and backend have it, and the field, message and hint that say no. Read by spec_parse at
 * submission and by the engine at run time. It does not parse specs (spec.c). */
#include "spec/spec.h"

#include <stdio.h>
#include <string.h>

/* Which side of the table a capability belongs to. */
enum { SIDE_MODEL = 1, SIDE_BACKEND = 2 };

typedef struct cap_info {
    const char *name;    /* short name */
    int sides;           /* SIDE_MODEL | SIDE_BACKEND */
    const char *field;   /* the spec field that asks for it: the field a refusal names */
    const char *what;    /* how a message names it */
    const char *ask;     /* the smallest JSON that asks for it */
    const char *hint;    /* a model's refusal: what to do instead; for data, how to give it */
    const char *backend_why;  /* a backend's refusal: why it cannot */
    const char *backend_hint; /* a backend's refusal: what to do instead */
} cap_info_t;

static const cap_info_t caps[SPEC_CAP_COUNT] = {
    [SPEC_CAP_TEXT] = {"text", SIDE_MODEL, "data.train", "text data", "{\"data\": {\"train\": \"/tmp/corpus.txt\"}}",
                       "a text file", NULL, NULL},
    [SPEC_CAP_TOKENS] = {"tokens", SIDE_MODEL, "data.train", "token data (an llm.c shard)",
                         "{\"data\": {\"train\": \"/tmp/shard.bin\"}}", "an llm.c token shard (.bin)", NULL, NULL},
    [SPEC_CAP_SYNTHETIC] = {"synthetic", SIDE_MODEL, "data.train", "synthetic data",
                            "{\"data\": {\"train\": \"synthetic\"}}", "\"synthetic\"", NULL, NULL},
    [SPEC_CAP_INIT_FILE] = {"init_from file", SIDE_MODEL, "model.init_from", "model.init_from (an llm.c checkpoint)",
                            "{\"model\": {\"init_from\": \"/tmp/model.bin\"}}", "drop model.init_from", NULL, NULL},
    [SPEC_CAP_INIT_JOB] = {"init_from job", SIDE_MODEL, "model.init_from", "model.init_from \"job:<id>\"",
                           "{\"model\": {\"init_from\": \"job:00000000-0000-0000-0000-000000000000\"}}",
                           "drop model.init_from", NULL, NULL},
    [SPEC_CAP_BF16] = {"bf16", SIDE_MODEL | SIDE_BACKEND, "distribution.mixed_precision", "mixed_precision \"bf16\"",
                       "{\"distribution\": {\"mixed_precision\": \"bf16\"}}",
                       "leave out distribution.mixed_precision to train in fp32", "it has no bf16 compute",
                       "leave out distribution.mixed_precision to train in fp32"},
    [SPEC_CAP_RECOMPUTE] = {"activation checkpointing", SIDE_MODEL, "distribution.activation_checkpointing",
                            "activation_checkpointing", "{\"distribution\": {\"activation_checkpointing\": true}}",
                            "leave out distribution.activation_checkpointing", NULL, NULL},
    [SPEC_CAP_PIPELINE] = {"pipeline", SIDE_MODEL | SIDE_BACKEND, "distribution.model_parallel.partitions",
                           "pipeline parallelism",
                           "{\"resources\": {\"nodes\": 2}, \"distribution\": {\"model_parallel\": {\"partitions\": 2}}}",
                           "leave out distribution.model_parallel.partitions",
                           "its stages run on host memory, and this backend keeps its tensors on the device",
                           "train pipelines on cpu slots (resources.slot_type \"cpu\"), or without partitions on gpu "
                           "slots"},
    [SPEC_CAP_DP] = {"data parallel", SIDE_MODEL | SIDE_BACKEND, "resources", "data parallelism",
                     "{\"resources\": {\"nodes\": 2}}", "train it on one rank (nodes x slots_per_node = 1)",
                     "it has no collectives", "train it on one rank (nodes x slots_per_node = 1)"},
    [SPEC_CAP_SHARD] = {"zero-1", SIDE_BACKEND, "distribution.data_parallel.shard_optimizer_state",
                        "shard_optimizer_state",
                        "{\"resources\": {\"nodes\": 2}, \"distribution\": {\"data_parallel\": "
                        "{\"shard_optimizer_state\": true}}}",
                        NULL,
                        "it keeps its savings in lazily backed host memory, and this backend keeps the optimizer "
                        "state on the device, where it would save nothing",
                        "set distribution.data_parallel.shard_optimizer_state to false on gpu slots"},
    [SPEC_CAP_BF16_GRADS] = {"bf16 gradients", SIDE_BACKEND, "distribution.data_parallel.gradient_dtype",
                             "gradient_dtype \"bf16\"",
                             "{\"resources\": {\"nodes\": 2}, \"distribution\": {\"data_parallel\": "
                             "{\"gradient_dtype\": \"bf16\"}}}",
                             NULL,
                             "it is the wire format of the host collectives; GPU replicas reduce their gradients in "
                             "fp32",
                             "leave out distribution.data_parallel.gradient_dtype (or set \"fp32\") on gpu slots"},
};

/* ---- the rows ---------------------------------------------------------------------------------- */

typedef struct model_row {
    const char *name, *fields;
    unsigned caps;
    const char *example;
    int (*blocks)(const spec_model_t *m);
} model_row_t;

typedef struct backend_row {
    const char *name, *slots;
    unsigned caps;
} backend_row_t;

#define X(name, fields, caps, example, blocks)                                                                 \
    static int name##_blocks(const spec_model_t *m)                                                            \
    {                                                                                                          \
        (void)m;                                                                                               \
        return (blocks);                                                                                       \
    }
SPEC_MODEL_MAP(X)
#undef X

static const model_row_t model_rows[] = {
#define X(name, fields, caps, example, blocks) {#name, fields, caps, example, name##_blocks},
    SPEC_MODEL_MAP(X)
#undef X
};

static const backend_row_t backend_rows[] = {
#define X(name, slots, caps) {#name, slots, caps},
    SPEC_BACKEND_MAP(X)
#undef X
};

const char *const spec_models[] = {
#define X(name, fields, caps, example, blocks) #name,
    SPEC_MODEL_MAP(X)
#undef X
        NULL};

const char *const spec_backends[] = {
#define X(name, slots, caps) #name,
    SPEC_BACKEND_MAP(X)
#undef X
        NULL};

static const model_row_t *model_row(const char *name)
{
    for (size_t i = 0; name && i < KILN_ARRAY_LEN(model_rows); i++)
        if (!strcmp(model_rows[i].name, name))
            return &model_rows[i];
    return NULL;
}

static const backend_row_t *backend_row(const char *name)
{
    for (size_t i = 0; name && i < KILN_ARRAY_LEN(backend_rows); i++)
        if (!strcmp(backend_rows[i].name, name))
            return &backend_rows[i];
    return NULL;
}

/* ---- questions ---------------------------------------------------------------------------------- */

const char *spec_cap_name(spec_cap_t cap) { return cap < SPEC_CAP_COUNT ? caps[cap].name : "?"; }
const char *spec_cap_ask(spec_cap_t cap) { return cap < SPEC_CAP_COUNT ? caps[cap].ask : "{}"; }

const char *spec_model_example(const char *model)
{
    const model_row_t *r = model_row(model);
    return r ? r->example : NULL;
}

const char *spec_backend_slots(const char *backend)
{
    const backend_row_t *r = backend_row(backend);
    return r ? r->slots : NULL;
}

bool spec_model_has(const char *model, spec_cap_t cap)
{
    const model_row_t *r = model_row(model);
    return r && cap < SPEC_CAP_COUNT && (!(caps[cap].sides & SIDE_MODEL) || (r->caps & (1u << cap)));
}

bool spec_backend_has(const char *backend, spec_cap_t cap)
{
    const backend_row_t *r = backend_row(backend);
    return r && cap < SPEC_CAP_COUNT && (!(caps[cap].sides & SIDE_BACKEND) || (r->caps & (1u << cap)));
}

bool spec_model_reads(const char *model, const char *field)
{
    const model_row_t *r = model_row(model);
    if (!strcmp(field, "type") || !strcmp(field, "init_from"))
        return true;
    if (!r)
        return false;
    size_t n = strlen(field);
    for (const char *p = r->fields; (p = strstr(p, field)); p += n)
        if ((p == r->fields || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0'))
            return true;
    return false;
}

int spec_model_blocks(const spec_model_t *m)
{
    const model_row_t *r = model_row(m->type);
    return r ? r->blocks(m) : 0;
}

unsigned spec_caps_asked(const spec_t *s)
{
    const spec_distribution_t *d = &s->dist;
    bool replicas = spec_dp_replicas(s) > 1;
    unsigned a = 0;
    if (!strcmp(s->data.format, "text"))
        a |= SPEC_CAP_BIT(TEXT);
    else if (!strcmp(s->data.format, "tokens"))
        a |= SPEC_CAP_BIT(TOKENS);
    else if (!strcmp(s->data.format, "synthetic"))
        a |= SPEC_CAP_BIT(SYNTHETIC);
    if (s->model.init_from[0])
        a |= !strncmp(s->model.init_from, "job:", 4) ? SPEC_CAP_BIT(INIT_JOB) : SPEC_CAP_BIT(INIT_FILE);
    if (!strcmp(d->mixed_precision, "bf16"))
        a |= SPEC_CAP_BIT(BF16);
    if (d->activation_checkpointing)
        a |= SPEC_CAP_BIT(RECOMPUTE);
    if (d->mp_partitions > 1)
        a |= SPEC_CAP_BIT(PIPELINE);
    if (replicas)
        a |= SPEC_CAP_BIT(DP);
    if (replicas && d->dp_shard_optimizer_state)
        a |= SPEC_CAP_BIT(SHARD);
    if (replicas && !strcmp(d->dp_gradient_dtype, "bf16"))
        a |= SPEC_CAP_BIT(BF16_GRADS);
    return a;
}

const char *spec_backend(const spec_t *s)
{
    return !strcmp(s->res.slot_type, "gpu") && strcmp(spec_device(s), "cpu") != 0 ? "cuda" : "cpu";
}

/* ---- the refusals ------------------------------------------------------------------------------- */

/* Appends the names of the models that have cap ("gpt", "gpt and x", "a, b and c") to out. */
static void models_with(spec_cap_t cap, char *out, size_t n)
{
    size_t k = 0, total = 0;
    for (size_t i = 0; i < KILN_ARRAY_LEN(model_rows); i++)
        total += spec_model_has(model_rows[i].name, cap);
    out[0] = '\0';
    for (size_t i = 0; i < KILN_ARRAY_LEN(model_rows); i++) {
        if (!spec_model_has(model_rows[i].name, cap))
            continue;
        const char *sep = k == 0 ? "" : k + 1 == total ? " and " : ", ";
        size_t len = strlen(out);
        snprintf(out + len, n - len, "%s%s", sep, model_rows[i].name);
        k++;
    }
}

int spec_cap_refuse(spec_cap_t cap, const char *model, const char *backend, kiln_err_t *err)
{
    if (cap >= SPEC_CAP_COUNT)
        return kiln_err_set(err, KILN_EINVAL, NULL, "unknown capability %d", (int)cap);
    const cap_info_t *c = &caps[cap];
    if (backend) {
        const backend_row_t *r = backend_row(backend);
        const char *slots = r && r->slots[0] ? r->slots : NULL;
        kiln_err_set(err, KILN_EINVAL, c->field, "%s is not available on the %s backend%s%s%s: %s", c->what, backend,
                     slots ? " (" : "", slots ? slots : "", slots ? " slots)" : "",
                     c->backend_why ? c->backend_why : "it does not have it");
        if (c->backend_hint)
            kiln_err_hint(err, "%s", c->backend_hint);
        return KILN_EINVAL;
    }
    char who[128];
    models_with(cap, who, sizeof(who));
    kiln_err_set(err, KILN_EINVAL, c->field, "%s applies to the %s model%s, not the %s", c->what,
                 who[0] ? who : "no", strstr(who, " and ") ? "s" : "", model ? model : "?");
    if (cap == SPEC_CAP_TEXT || cap == SPEC_CAP_TOKENS || cap == SPEC_CAP_SYNTHETIC) {
        /* data: name what the model trains on instead */
        char how[192] = "";
        for (int d = SPEC_CAP_TEXT; d <= SPEC_CAP_SYNTHETIC; d++)
            if (spec_model_has(model, (spec_cap_t)d)) {
                size_t len = strlen(how);
                snprintf(how + len, sizeof(how) - len, "%s%s", len ? " or " : "", caps[d].hint);
            }
        kiln_err_hint(err, "point data.train at data the %s model trains on: %s", model ? model : "?",
                      how[0] ? how : "none");
    } else {
        kiln_err_hint(err, "%s", c->hint);
    }
    return KILN_EINVAL;
}

int spec_caps_check(const spec_t *s, const char *backend, kiln_err_t *err)
{
    unsigned asked = spec_caps_asked(s);
    for (int c = 0; c < SPEC_CAP_COUNT; c++)
        if ((asked & (1u << c)) && !spec_model_has(s->model.type, (spec_cap_t)c))
            return spec_cap_refuse((spec_cap_t)c, s->model.type, NULL, err);
    for (int c = 0; c < SPEC_CAP_COUNT; c++)
        if ((asked & (1u << c)) && !spec_backend_has(backend, (spec_cap_t)c))
            return spec_cap_refuse((spec_cap_t)c, s->model.type, backend, err);
    return 0;
}
