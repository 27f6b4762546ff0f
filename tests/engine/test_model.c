/* test_model.c - the model interface (engine.h's eng_model_ops_t) and its agreement with the
 * capability table (spec.h): every model of the table is implemented and offers exactly the
 * optional groups its row claims, every backend the engine has offers what its row claims, and
 * every model goes through one generic check of what the loop relies on: its gradients against
 * central finite differences of its own forward, block ranges that cover each parameter once,
 * gradients reported block by block from last to first, and parameters that a share of ranges
 * initialises to the same values as the whole.
 *
 * Tolerances. Finite differences on the reference backend (double accumulators), objective the
 * forward's mean loss, step h = 1e-2 on 24 parameters spread over the flat buffer: a gradient
 * element passes when |analytic - numeric| <= 5e-3 * max(1e-2, |numeric|) + 1e-4 (the float
 * loss's resolution, ~5e-7 over 2h, is ~1e-5; the largest difference seen is 6e-5). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/engine.h"
#include "spec/spec.h"

TestSuite(model, .timeout = 120);

/* The model section of the table's example for model, with the first data the model takes. */
static void parse_example(const char *model, spec_t *s)
{
    const char *data = NULL;
    for (int c = SPEC_CAP_TEXT; c <= SPEC_CAP_SYNTHETIC && !data; c++)
        if (spec_model_has(model, (spec_cap_t)c)) data = spec_cap_ask((spec_cap_t)c);
    cr_assert_not_null(data, "model %s takes no data", model);
    json_t *j = json_loads(data, 0, NULL);
    cr_assert_not_null(j);
    json_object_set_new(j, "model", json_loads(spec_model_example(model), 0, NULL));
    kiln_err_t err;
    cr_assert_eq(spec_parse(j, s, &err), 0, "%s: %s: %s", model, err.field, err.message);
    json_decref(j);
}

Test(model, every_row_of_the_table_has_an_implementation_with_its_groups)
{
    int n = 0;
    for (int i = 0; spec_models[i]; i++, n++) {
        const char *name = spec_models[i];
        const eng_model_ops_t *ops = eng_model_find(name);
        cr_assert_not_null(ops, "no eng_%s_model", name);
        cr_assert_str_eq(ops->name, name);
        cr_assert(ops->create && ops->destroy && ops->init && ops->block_ranges && ops->acts_create &&
                      ops->acts_destroy && ops->forward && ops->backward,
                  "%s lacks a required function", name);
        cr_assert_eq(ops->bf16 != NULL, spec_model_has(name, SPEC_CAP_BF16), "%s: bf16 group vs table", name);
        cr_assert_eq(ops->pipe != NULL, spec_model_has(name, SPEC_CAP_PIPELINE), "%s: pipe group vs table", name);
        cr_assert_eq(ops->file != NULL,
                     spec_model_has(name, SPEC_CAP_INIT_FILE) || spec_model_has(name, SPEC_CAP_INIT_JOB),
                     "%s: file group vs table", name);
        /* a model that pipelines takes token sequences: the pipeline's stages sample them */
        if (ops->pipe) cr_assert(!spec_model_has(name, SPEC_CAP_SYNTHETIC), "%s", name);
    }
    cr_assert_geq(n, 2);
    cr_assert_null(eng_model_find("transformer-xl"));
}

/* What a backend's row claims is what its table of ops has. */
static void check_backend(const eng_backend_t *be)
{
    const char *n = be->name;
    bool split_head = be->xent_chunk_forward && be->xent_chunk_finish && be->xent_chunk_backward;
    cr_assert_not_null(spec_backend_slots(n), "backend %s has no row", n);
    cr_assert_eq(spec_backend_has(n, SPEC_CAP_BF16), be->bf16 != NULL, "%s: bf16", n);
    cr_assert_eq(spec_backend_has(n, SPEC_CAP_PIPELINE), be->host_memory && split_head, "%s: pipeline", n);
    cr_assert_eq(spec_backend_has(n, SPEC_CAP_SHARD), be->host_memory, "%s: shard_optimizer_state", n);
    cr_assert_eq(spec_backend_has(n, SPEC_CAP_BF16_GRADS), be->host_memory, "%s: gradient_dtype", n);
    cr_assert_eq(spec_backend_has(n, SPEC_CAP_DP), be->host_memory || be->coll != NULL, "%s: dp", n);
}

Test(model, every_backend_has_what_its_row_says)
{
    check_backend(&eng_cpu_backend);
    check_backend(&eng_ref_backend);
    const eng_backend_t *cuda = NULL;
    kiln_err_t err;
    if (eng_backend_get("cuda", &cuda, &err) == 0)
        check_backend(cuda);
    else
        cr_log_info("no cuda backend here (%s): its row is checked where there is one", err.message);
    for (int i = 0; spec_backends[i]; i++)
        cr_assert(!strcmp(spec_backends[i], "cpu") || !strcmp(spec_backends[i], "ref") ||
                      !strcmp(spec_backends[i], "cuda"),
                  "backend %s of the table is not one eng_backend_get knows", spec_backends[i]);
}

/* ---- one generic check for every model ---------------------------------------------------------- */

typedef struct fixture {
    spec_t spec;
    eng_model_t m;
    void *acts;
    eng_batch_t batch;
    int32_t *tokens, *targets;
    float *x;
} fixture_t;

static void fixture_init(fixture_t *f, const char *name, int B)
{
    const eng_backend_t *be = &eng_ref_backend;
    kiln_err_t err;
    memset(f, 0, sizeof(*f));
    parse_example(name, &f->spec);
    const eng_model_ops_t *ops = eng_model_find(name);
    eng_model_opts_t o = {.B = B, .head_blocks = 1};
    cr_assert_eq(ops->create(&f->spec.model, be, &o, &f->m, &err), 0, "%s: %s", name, err.message);
    cr_assert_eq(f->m.ops, ops);
    cr_assert(f->m.p && f->m.p->n > 0 && f->m.n_blocks > 0 && f->m.flops_per_item > 0, "%s", name);
    eng_range_t all = {0, f->m.p->n};
    cr_assert_eq(ops->init(&f->m, 7, &all, 1, &err), 0, "%s", err.message);
    cr_assert_eq(ops->acts_create(&f->m, B, &f->acts, &err), 0, "%s", err.message);
    /* a batch of the kind of data the model takes */
    eng_rng_t r;
    eng_rng_seed(&r, 11);
    f->batch.B = B;
    if (spec_model_has(name, SPEC_CAP_SYNTHETIC)) {
        int n_in = f->spec.model.n_inputs;
        f->x = malloc(sizeof(float) * (size_t)B * n_in);
        f->targets = malloc(sizeof(int32_t) * (size_t)B);
        for (int i = 0; i < B * n_in; i++) f->x[i] = (float)eng_rng_normal(&r);
        for (int i = 0; i < B; i++) f->targets[i] = (int32_t)eng_rng_below(&r, (uint64_t)f->spec.model.n_classes);
        f->batch.x = f->x;
    } else {
        size_t BT = (size_t)B * f->spec.model.seq_len;
        f->tokens = malloc(sizeof(int32_t) * BT);
        f->targets = malloc(sizeof(int32_t) * BT);
        for (size_t i = 0; i < BT; i++) {
            f->tokens[i] = (int32_t)eng_rng_below(&r, (uint64_t)f->spec.model.vocab_size);
            f->targets[i] = (int32_t)eng_rng_below(&r, (uint64_t)f->spec.model.vocab_size);
        }
        f->batch.tokens = f->tokens;
    }
    f->batch.targets = f->targets;
}

static void fixture_deinit(fixture_t *f)
{
    f->m.ops->acts_destroy(&f->m, f->acts);
    f->m.ops->destroy(&f->m);
    free(f->tokens);
    free(f->targets);
    free(f->x);
    spec_deinit(&f->spec);
}

static int g_starts;
static void count_start(void *ctx, int block)
{
    (void)ctx;
    (void)block;
    g_starts++;
}

typedef struct ready_log {
    int blocks[256];
    int n;
} ready_log_t;

static void on_ready(void *ctx, int block, int ranges)
{
    ready_log_t *l = ctx;
    if (ranges == ENG_RANGES_ALL && l->n < 256) l->blocks[l->n++] = block;
}

static void gradient_check(const char *name)
{
    fixture_t f;
    fixture_init(&f, name, 2);
    eng_model_t *m = &f.m;
    const eng_model_ops_t *ops = m->ops;
    float *P = m->p->params, *G = m->p->grads; /* the reference backend's memory is the host's */
    size_t n = m->p->n;
    int items = f.batch.tokens ? f.batch.B * f.spec.model.seq_len : f.batch.B;
    memset(G, 0, n * sizeof(float));
    g_starts = 0;
    float loss = ops->forward(m, f.acts, &f.batch, count_start, NULL);
    cr_assert(isfinite(loss) && loss > 0, "%s: loss %f", name, loss);
    cr_assert_gt(g_starts, 0, "%s: forward never said which parameters it reads", name);
    ready_log_t log = {.n = 0};
    ops->backward(m, f.acts, 1.0f / (float)items, on_ready, &log);
    /* every block reported once, last to first */
    cr_assert_eq(log.n, m->n_blocks, "%s: %d blocks reported of %d", name, log.n, m->n_blocks);
    for (int i = 0; i < log.n; i++) cr_assert_eq(log.blocks[i], m->n_blocks - 1 - i, "%s", name);
    float *g = malloc(n * sizeof(float));
    memcpy(g, G, n * sizeof(float));
    const double h = 1e-2;
    for (int k = 0; k < 24; k++) {
        size_t i = (size_t)((double)k / 24 * (double)n + 0.37 * (double)n / 24) % n;
        float save = P[i];
        P[i] = (float)(save + h);
        double fp = ops->forward(m, f.acts, &f.batch, NULL, NULL);
        P[i] = (float)(save - h);
        double fm = ops->forward(m, f.acts, &f.batch, NULL, NULL);
        P[i] = save;
        double num = (fp - fm) / (2 * h), ana = g[i];
        cr_assert(fabs(ana - num) <= 5e-3 * fmax(1e-2, fabs(num)) + 1e-4,
                  "%s: param %zu: analytic %.7g vs numeric %.7g", name, i, ana, num);
    }
    free(g);
    fixture_deinit(&f);
}

Test(model, gradients_of_every_model_match_finite_differences)
{
    for (int i = 0; spec_models[i]; i++) gradient_check(spec_models[i]);
}

Test(model, block_ranges_cover_every_parameter_and_a_share_initialises_like_the_whole)
{
    for (int i = 0; spec_models[i]; i++) {
        const char *name = spec_models[i];
        fixture_t f;
        fixture_init(&f, name, 1);
        eng_model_t *m = &f.m;
        size_t n = m->p->n;
        unsigned char *seen = calloc(n, 1);
        for (int b = 0; b < m->n_blocks; b++) {
            eng_range_t r[ENG_MAX_TENSORS];
            int nr = m->ops->block_ranges(m->impl, b, r);
            cr_assert_gt(nr, 0, "%s: block %d has no parameters", name, b);
            for (int k = 0; k < nr; k++) {
                cr_assert_leq(r[k].off + r[k].n, n, "%s", name);
                for (size_t j = r[k].off; j < r[k].off + r[k].n; j++) seen[j] = 1;
            }
        }
        for (size_t j = 0; j < n; j++) cr_assert(seen[j], "%s: parameter %zu in no block", name, j);
        free(seen);
        /* the whole model (fixture_init, seed 7) against two halves */
        float *whole = malloc(n * sizeof(float));
        memcpy(whole, m->p->params, n * sizeof(float));
        memset(m->p->params, 0, n * sizeof(float));
        eng_range_t halves[2] = {{n / 2, n - n / 2}, {0, n / 2}};
        kiln_err_t err;
        cr_assert_eq(m->ops->init(m, 7, halves, 2, &err), 0, "%s", err.message);
        cr_assert_eq(memcmp(whole, m->p->params, n * sizeof(float)), 0, "%s: a share initialised otherwise", name);
        free(whole);
        fixture_deinit(&f);
    }
}

/* ---- the engine reads the same table ------------------------------------------------------------ */

/* Asks for capability c in an already parsed spec (what a spec changed after submission, or a
 * backend other than the one submission assumed, would bring to the engine); false for the
 * capabilities that need several ranks. */
static bool ask_in_struct(spec_t *s, spec_cap_t c)
{
    switch (c) {
    case SPEC_CAP_TEXT: kiln_strlcpy(s->data.format, "text", sizeof(s->data.format)); return true;
    case SPEC_CAP_TOKENS: kiln_strlcpy(s->data.format, "tokens", sizeof(s->data.format)); return true;
    case SPEC_CAP_SYNTHETIC: kiln_strlcpy(s->data.format, "synthetic", sizeof(s->data.format)); return true;
    case SPEC_CAP_INIT_FILE: kiln_strlcpy(s->model.init_from, "/tmp/model.bin", sizeof(s->model.init_from)); return true;
    case SPEC_CAP_INIT_JOB:
        kiln_strlcpy(s->model.init_from, "job:00000000-0000-0000-0000-000000000000", sizeof(s->model.init_from));
        return true;
    case SPEC_CAP_BF16: kiln_strlcpy(s->dist.mixed_precision, "bf16", sizeof(s->dist.mixed_precision)); return true;
    case SPEC_CAP_RECOMPUTE: s->dist.activation_checkpointing = true; return true;
    default: return false;
    }
}

Test(model, the_training_loop_refuses_what_the_table_refuses_with_its_message)
{
    int n = 0;
    for (int i = 0; spec_models[i]; i++) {
        const char *name = spec_models[i];
        for (int c = 0; c < SPEC_CAP_COUNT; c++) {
            spec_t s;
            parse_example(name, &s);
            if (spec_model_has(name, (spec_cap_t)c) || !ask_in_struct(&s, (spec_cap_t)c)) {
                spec_deinit(&s);
                continue;
            }
            kiln_err_t want, err;
            spec_cap_refuse((spec_cap_t)c, name, NULL, &want);
            eng_train_opts_t o;
            memset(&o, 0, sizeof(o));
            o.threads = 1;
            o.peak_gflops = 100;
            o.metrics_fd = -1;
            o.world = 1;
            o.quiet = true;
            eng_train_result_t res;
            cr_assert_eq(eng_train_run(&s, &o, &res, &err), KILN_EINVAL, "%s: %s was not refused", name,
                         spec_cap_name((spec_cap_t)c));
            cr_assert_str_eq(err.field, want.field, "%s", name);
            cr_assert_str_eq(err.message, want.message, "%s", name);
            cr_assert_str_eq(err.hint, want.hint, "%s", name);
            free(res.losses);
            spec_deinit(&s);
            n++;
        }
    }
    cr_assert_geq(n, 2, "the table refuses no model anything the loop could be asked");
}
