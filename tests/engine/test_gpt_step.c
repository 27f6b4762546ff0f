/* test_gpt_step.c - one whole GPT training step against PyTorch: the loss, every gradient, the
 * gradient norm and the parameters after two AdamW steps with clipping and weight decay, from
 * the fixture tests/engine/fixtures/gpt_step.bin (regenerate with make_gpt_step.py; layout in
 * its docstring). Run on the fast CPU backend and on the plain reference backend.
 *
 * Tolerances (the fixture is float64 PyTorch rounded to float32; kiln computes in float32):
 *  - loss and gradient norm: relative 1e-5;
 *  - gradients, per tensor: |g - ref| <= 1e-4 * max|ref over the tensor| + 1e-4 * |ref|;
 *  - parameters after two steps: |p - ref| <= 1e-4 (the update is ~lr = 1e-2 per step, so this
 *    is 1% of one update; Adam divides by sqrt(v), which amplifies gradient noise only where a
 *    gradient is ~eps, and such elements are allowed 2 * lr * 5e-3, at most 1 in 1000); the
 *    key bias, whose true gradient is exactly 0, only within 2 * lr (see below).
 * Also: gradient accumulation over two microbatches equals one batch of both, and the
 * per-block parameter ranges cover the flat buffer. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

typedef struct fixture {
    int V, Vp, T, L, NH, C, B;
    size_t n;
    float lr, beta1, beta2, eps, wd, clip, loss1, norm1, loss2, norm2;
    int32_t *tok[2], *tgt[2];
    float *init, *grads1, *params2;
    void *buf;
} fixture_t;

static void load_fixture(fixture_t *f)
{
    const char *root = getenv("KILN_ROOT");
    char path[1024];
    snprintf(path, sizeof(path), "%s/tests/engine/fixtures/gpt_step.bin", root ? root : ".");
    FILE *fp = fopen(path, "rb");
    cr_assert(fp, "cannot open fixture %s (run from the repository root or set KILN_ROOT)", path);
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    f->buf = malloc(size);
    cr_assert(fread(f->buf, 1, size, fp) == (size_t)size);
    fclose(fp);
    int32_t *h = f->buf;
    cr_assert_eq(h[0], 0x4B4C4E31, "bad fixture magic");
    f->V = h[2]; f->Vp = h[3]; f->T = h[4]; f->L = h[5]; f->NH = h[6]; f->C = h[7]; f->B = h[8];
    f->n = (size_t)h[9];
    float *hp = (float *)(h + 16);
    f->lr = hp[0]; f->beta1 = hp[1]; f->beta2 = hp[2]; f->eps = hp[3]; f->wd = hp[4];
    f->clip = hp[5]; f->loss1 = hp[6]; f->norm1 = hp[7]; f->loss2 = hp[8]; f->norm2 = hp[9];
    int32_t *p = h + 32;
    size_t bt = (size_t)f->B * f->T;
    for (int k = 0; k < 2; k++) {
        f->tok[k] = p; p += bt;
        f->tgt[k] = p; p += bt;
    }
    f->init = (float *)p;
    f->grads1 = f->init + f->n;
    f->params2 = f->grads1 + f->n;
    cr_assert_eq((size_t)size, (char *)(f->params2 + f->n) - (char *)f->buf, "fixture size");
}

static eng_gpt_t *make_model(const fixture_t *f, const eng_backend_t *be, int B)
{
    eng_gpt_config_t cfg = {f->T, f->V, f->Vp, f->L, f->NH, f->C};
    eng_gpt_t *m = NULL;
    kiln_err_t err;
    cr_assert_eq(eng_gpt_create(&cfg, be, B, &m, &err), 0, "%s", err.message);
    cr_assert_eq(m->p.n, f->n, "parameter count %zu vs fixture %zu", m->p.n, f->n);
    memcpy(m->p.params, f->init, f->n * sizeof(float));
    return m;
}

static void check_grads(const eng_gpt_t *m, const float *ref)
{
    for (int t = 0; t < m->p.n_tensors; t++) {
        const eng_tensor_t *tt = &m->p.tensors[t];
        const float *g = m->p.grads + tt->off, *r = ref + tt->off;
        double mx = 0;
        for (size_t i = 0; i < tt->n; i++) mx = fmax(mx, fabs(r[i]));
        cr_assert(mx > 0 || !strcmp(tt->name, "never"), "tensor %s has no gradient", tt->name);
        for (size_t i = 0; i < tt->n; i++)
            cr_assert(fabs((double)g[i] - r[i]) <= 1e-4 * mx + 1e-4 * fabs(r[i]),
                      "grad %s[%zu]: %.8g vs pytorch %.8g (max %.3g)", tt->name, i, g[i], r[i], mx);
    }
}

/* The optimizer update exactly as the trainer does it: clip by global norm, AdamW per tensor
 * with weight decay on the tensors flagged as 2-D weights. */
static double step_update(eng_gpt_t *m, float *mom, float *var, const fixture_t *f, int64_t t)
{
    double norm = sqrt(m->be->sumsq(m->p.grads, m->p.n));
    float scale = norm > f->clip ? (float)(f->clip / norm) : 1.0f;
    for (int i = 0; i < m->p.n_tensors; i++) {
        const eng_tensor_t *tt = &m->p.tensors[i];
        m->be->adamw_update(m->p.params + tt->off, m->p.grads + tt->off, mom + tt->off,
                            var + tt->off, tt->n, f->lr, f->beta1, f->beta2, f->eps,
                            tt->decay ? f->wd : 0.0f, scale, t);
    }
    return norm;
}

static void run_against_pytorch(const eng_backend_t *be)
{
    fixture_t f;
    load_fixture(&f);
    eng_gpt_t *m = make_model(&f, be, f.B);
    eng_gpt_acts_t *a = NULL;
    kiln_err_t err;
    cr_assert_eq(eng_gpt_acts_create(m, f.B, f.T, &a, &err), 0);
    float *mom = be->alloc(f.n * 4), *var = be->alloc(f.n * 4);
    float dloss = 1.0f / (f.B * f.T);
    for (int k = 0; k < 2; k++) {
        be->memset_zero(m->p.grads, f.n * 4);
        eng_gpt_acts_set_batch(m, a, f.tok[k], f.tgt[k]);
        float loss = eng_gpt_forward(m, a, true);
        float want = k == 0 ? f.loss1 : f.loss2;
        cr_assert(fabs(loss - want) <= 1e-5 * fabs(want), "%s: loss %d %.7f vs pytorch %.7f",
                  be->name, k + 1, loss, want);
        eng_gpt_backward(m, a, dloss, NULL, NULL);
        if (k == 0) check_grads(m, f.grads1);
        double norm = step_update(m, mom, var, &f, k + 1);
        double wn = k == 0 ? f.norm1 : f.norm2;
        cr_assert(fabs(norm - wn) <= 1e-5 * wn, "%s: grad norm %.7f vs pytorch %.7f", be->name,
                  norm, wn);
    }
    double worst = 0;
    size_t worst_i = 0, loose = 0;
    /* The key bias's exact gradient is 0 (softmax is invariant to adding q.b_k to every score
     * of a row), so both sides hold rounding noise there, which Adam normalises into updates of
     * up to lr: those elements are only held to the two-step bound 2*lr. */
    const eng_tensor_t *qkvb = &m->p.tensors[5];
    for (size_t i = 0; i < f.n; i++) {
        double d = fabs((double)m->p.params[i] - f.params2[i]);
        if (i >= qkvb->off && i < qkvb->off + qkvb->n &&
            ((i - qkvb->off) % (3 * f.C)) / f.C == 1) {
            cr_assert(d <= 2.0 * f.lr + 1e-6, "%s: key bias [%zu] moved beyond two steps", be->name, i);
            continue;
        }
        if (d > worst) { worst = d; worst_i = i; }
        if (d > 1e-4) loose++;
        cr_assert(d <= 2 * f.lr * 5e-3, "%s: param[%zu] after 2 steps %.8g vs pytorch %.8g",
                  be->name, i, m->p.params[i], f.params2[i]);
    }
    cr_assert(loose <= f.n / 1000, "%s: %zu of %zu parameters differ by more than 1e-4 (worst "
              "%.3g at %zu)", be->name, loose, f.n, worst, worst_i);
    be->free(mom);
    be->free(var);
    eng_gpt_acts_destroy(m, a);
    eng_gpt_destroy(m);
    free(f.buf);
}

Test(gpt_step, cpu_backend_matches_pytorch)
{
    eng_cpu_set_threads(2);
    run_against_pytorch(&eng_cpu_backend);
}

Test(gpt_step, ref_backend_matches_pytorch) { run_against_pytorch(&eng_ref_backend); }

/* Two microbatches of one sequence, dloss 1/(2T) each, accumulate the same gradient as one
 * batch of two sequences with dloss 1/(2T). */
Test(gpt_step, gradient_accumulation)
{
    eng_cpu_set_threads(1);
    fixture_t f;
    load_fixture(&f);
    kiln_err_t err;
    eng_gpt_t *m = make_model(&f, &eng_cpu_backend, f.B);
    eng_gpt_acts_t *a2 = NULL, *a1 = NULL;
    cr_assert_eq(eng_gpt_acts_create(m, 2, f.T, &a2, &err), 0);
    cr_assert_eq(eng_gpt_acts_create(m, 1, f.T, &a1, &err), 0);
    float dloss = 1.0f / (2 * f.T);
    eng_gpt_acts_set_batch(m, a2, f.tok[0], f.tgt[0]);
    eng_gpt_forward(m, a2, true);
    eng_gpt_backward(m, a2, dloss, NULL, NULL);
    float *whole = malloc(f.n * 4);
    memcpy(whole, m->p.grads, f.n * 4);
    memset(m->p.grads, 0, f.n * 4);
    for (int b = 0; b < 2; b++) {
        eng_gpt_acts_set_batch(m, a1, f.tok[0] + b * f.T, f.tgt[0] + b * f.T);
        eng_gpt_forward(m, a1, true);
        eng_gpt_backward(m, a1, dloss, NULL, NULL);
    }
    for (size_t i = 0; i < f.n; i++)
        cr_assert(fabs(whole[i] - m->p.grads[i]) <= 1e-6 + 1e-4 * fabs(whole[i]),
                  "grad[%zu] %.8g (one batch) vs %.8g (accumulated)", i, whole[i], m->p.grads[i]);
    free(whole);
    eng_gpt_acts_destroy(m, a1);
    eng_gpt_acts_destroy(m, a2);
    eng_gpt_destroy(m);
    free(f.buf);
}

static int g_ready_order[64], g_nready, g_nparts;
/* Reports of part of a block: the gradients of its first `ranges` ranges as they were then,
 * compared after backward with the final ones (they must not change after being reported). */
static struct {
    int block, ranges;
    float *snap;
} g_parts[64];
static void ready_cb(void *ctx, int block, int ranges)
{
    eng_gpt_t *m = ctx;
    if (ranges == ENG_RANGES_ALL) {
        /* the whole block, after any parts of it */
        for (int i = 0; i < g_nparts; i++)
            cr_assert(g_parts[i].block >= block, "part of block %d reported after block %d",
                      g_parts[i].block, block);
        g_ready_order[g_nready++] = block;
        return;
    }
    cr_assert(g_nparts < 64);
    cr_assert(ranges > 0 && ranges < ENG_MAX_TENSORS);
    eng_range_t r[ENG_MAX_TENSORS];
    int k = eng_gpt_block_ranges(m, block, r);
    cr_assert(ranges < k, "block %d: %d of its %d ranges reported as a part", block, ranges, k);
    size_t n = 0;
    for (int i = 0; i < ranges; i++) n += r[i].n;
    float *snap = malloc(n * sizeof(float)), *o = snap;
    for (int i = 0; i < ranges; i++, o += r[i - 1].n)
        memcpy(o, m->p.grads + r[i].off, r[i].n * sizeof(float));
    g_parts[g_nparts].block = block;
    g_parts[g_nparts].ranges = ranges;
    g_parts[g_nparts++].snap = snap;
}

/* Per-block ranges tile the flat buffer (wte listed by block 0 and again, whole or in row
 * slices, by the head blocks), and backward reports blocks from last to first. */
Test(gpt_step, block_ranges_and_ready_order)
{
    fixture_t f;
    load_fixture(&f);
    eng_gpt_t *m = make_model(&f, &eng_cpu_backend, 1);
    kiln_err_t err;
    unsigned char *seen = calloc(f.n, 1);
    eng_range_t r[ENG_MAX_TENSORS];
    size_t wte_n = m->p.tensors[0].n;
    for (int J = 1; J <= 3; J += 2) {
        cr_assert_eq(eng_gpt_set_head_blocks(m, J, &err), 0, "%s", err.message);
        int nb = eng_gpt_num_blocks(m);
        cr_assert_eq(nb, 2 * f.L + 1 + J);
        cr_assert_eq(eng_gpt_head_first(m), 2 * f.L + 1);
        memset(seen, 0, f.n);
        for (int b = 0; b < nb; b++) {
            int k = eng_gpt_block_ranges(m, b, r);
            cr_assert(k > 0, "block %d has no parameters", b);
            for (int i = 0; i < k; i++)
                for (size_t j = 0; j < r[i].n; j++) seen[r[i].off + j]++;
        }
        for (size_t i = 0; i < f.n; i++)
            cr_assert_eq(seen[i], i < wte_n ? 2 : 1, "J=%d: element %zu covered %d times", J, i,
                         seen[i]);
    }
    cr_assert_eq(eng_gpt_set_head_blocks(m, 0, &err), KILN_EINVAL);
    /* whole-model passes run the fused head but still report every head block */
    cr_assert_eq(eng_gpt_set_head_blocks(m, 3, &err), 0);
    int nb = eng_gpt_num_blocks(m);
    eng_gpt_acts_t *a = NULL;
    cr_assert_eq(eng_gpt_acts_create(m, 1, f.T, &a, &err), 0);
    eng_gpt_acts_set_batch(m, a, f.tok[0], f.tgt[0]);
    eng_gpt_forward(m, a, true);
    g_nready = g_nparts = 0;
    eng_gpt_backward(m, a, 1.0f, ready_cb, m);
    cr_assert_eq(g_nready, nb);
    for (int i = 0; i < nb; i++) cr_assert_eq(g_ready_order[i], nb - 1 - i);
    /* each layer half reports its output projection, then its input projection, early; what
     * was reported is final */
    cr_assert_eq(g_nparts, 4 * f.L);
    for (int i = 0; i < g_nparts; i++) {
        cr_assert_eq(g_parts[i].block, 2 * f.L - i / 2, "part %d", i);
        cr_assert_eq(g_parts[i].ranges, i % 2 ? 4 : 2, "part %d", i);
        int k = eng_gpt_block_ranges(m, g_parts[i].block, r);
        cr_assert(k >= g_parts[i].ranges);
        const float *o = g_parts[i].snap;
        for (int j = 0; j < g_parts[i].ranges; o += r[j].n, j++)
            cr_assert(memcmp(o, m->p.grads + r[j].off, r[j].n * sizeof(float)) == 0,
                      "block %d range %d changed after it was reported final", g_parts[i].block, j);
        free(g_parts[i].snap);
    }
    free(seen);
    eng_gpt_acts_destroy(m, a);
    eng_gpt_destroy(m);
    free(f.buf);
}

static int g_count_parts;
static void count_cb(void *ctx, int block, int ranges)
{
    (void)ctx;
    (void)block;
    if (ranges != ENG_RANGES_ALL)
        g_count_parts++;
}

/* With someone waiting on parts of blocks (data parallelism), backward computes each
 * projection's weight gradient before its input gradient and reports it in between: every
 * gradient stays the same bits as a backward nobody waits on. On the reference backend and on
 * the CPU backend at one thread (at two it runs both GEMMs side by side and keeps doing so). */
static void early_parts_same_bits(const eng_backend_t *be, int threads)
{
    fixture_t f;
    load_fixture(&f);
    int before = eng_cpu_threads();
    eng_cpu_set_threads(threads);
    eng_gpt_t *m = make_model(&f, be, 1);
    kiln_err_t err;
    eng_gpt_acts_t *a = NULL;
    cr_assert_eq(eng_gpt_acts_create(m, 1, f.T, &a, &err), 0);
    eng_gpt_acts_set_batch(m, a, f.tok[0], f.tgt[0]);
    eng_gpt_forward(m, a, true);
    eng_gpt_backward(m, a, 1.0f, NULL, NULL);
    float *plain = malloc(f.n * sizeof(float));
    memcpy(plain, m->p.grads, f.n * sizeof(float));
    memset(m->p.grads, 0, f.n * sizeof(float));
    eng_gpt_forward(m, a, true);
    g_count_parts = 0;
    eng_gpt_backward(m, a, 1.0f, count_cb, NULL);
    cr_assert_eq(g_count_parts, 4 * f.L, "%s: %d parts reported", be->name, g_count_parts);
    cr_assert(memcmp(plain, m->p.grads, f.n * sizeof(float)) == 0,
              "%s at %d thread(s): gradients differ when parts are reported early", be->name, threads);
    free(plain);
    eng_gpt_acts_destroy(m, a);
    eng_gpt_destroy(m);
    eng_cpu_set_threads(before);
    free(f.buf);
}

Test(gpt_step, early_parts_leave_the_gradients_the_same_bits)
{
    early_parts_same_bits(&eng_cpu_backend, 1);
    early_parts_same_bits(&eng_cpu_backend, 2);
    early_parts_same_bits(&eng_ref_backend, 1);
}

/* The MLP end to end (both activations): every parameter's gradient against central finite
 * differences of the mean loss, on the reference backend (double accumulation), step 1e-2,
 * |analytic - numeric| <= 1e-3 * max(1, |numeric|) + 2e-4; elements where a ReLU crosses its
 * kink within the step are skipped (at most 10%). */
static void mlp_fd(bool gelu)
{
    eng_mlp_config_t cfg = {.n_inputs = 5, .n_classes = 3, .n_hidden = 2, .hidden = {6, 4},
                            .gelu = gelu};
    eng_mlp_t *m = NULL;
    kiln_err_t err;
    int B = 7;
    cr_assert_eq(eng_mlp_create(&cfg, &eng_ref_backend, B, &m, &err), 0, "%s", err.message);
    eng_mlp_init_weights(m, 9);
    float x[35];
    int32_t y[7];
    eng_rng_t r;
    eng_rng_seed(&r, 10);
    for (int i = 0; i < 35; i++) x[i] = (float)eng_rng_normal(&r);
    for (int i = 0; i < B; i++) y[i] = (int32_t)eng_rng_below(&r, 3);
    eng_mlp_forward(m, x, y, B);
    eng_mlp_backward(m, B, 1.0f / B, NULL, NULL);
    /* sign pattern of every hidden pre-activation at the base point */
    int nh = B * (6 + 4);
    unsigned char base[70], cur[70];
#define SIGNS(dst)                                                                                \
    do {                                                                                          \
        int _k = 0;                                                                               \
        for (int _l = 0; _l < 2; _l++)                                                            \
            for (int _j = 0; _j < B * m->dims[_l + 1]; _j++) (dst)[_k++] = m->pre[_l][_j] > 0;   \
    } while (0)
    eng_mlp_forward(m, x, y, B);
    SIGNS(base);
    int kinks = 0;
    for (size_t i = 0; i < m->p.n; i++) {
        float save = m->p.params[i];
        bool crossed = false;
        m->p.params[i] = save + 1e-2f;
        double fp = eng_mlp_forward(m, x, y, B);
        SIGNS(cur);
        crossed |= memcmp(cur, base, nh) != 0;
        m->p.params[i] = save - 1e-2f;
        double fm = eng_mlp_forward(m, x, y, B);
        SIGNS(cur);
        crossed |= memcmp(cur, base, nh) != 0;
        m->p.params[i] = save;
        /* a ReLU unit crossing zero inside +-h breaks the difference quotient: skip */
        if (!gelu && crossed) {
            kinks++;
            continue;
        }
        double num = (fp - fm) / 2e-2, ana = m->p.grads[i];
        cr_assert(fabs(ana - num) <= 1e-3 * fmax(1.0, fabs(num)) + 2e-4,
                  "%s mlp grad[%zu]: analytic %.7g vs numeric %.7g", gelu ? "gelu" : "relu", i,
                  ana, num);
    }
    cr_assert(kinks <= (int)m->p.n / 10, "%d of %zu elements skipped at ReLU kinks", kinks, m->p.n);
    eng_mlp_destroy(m);
}

Test(mlp, gradients_match_finite_differences)
{
    mlp_fd(false);
    mlp_fd(true);
}

/* The model run block by block, as pipeline stages run it, with the head whole (J = 1) and split
 * over 2, 3 and 7 vocabulary slices (uneven, the last one mostly padding rows), against the
 * PyTorch fixture's loss and gradients, on both backends. The gradient flowing between blocks
 * is handed through separate buffers, as it would arrive from another stage. */
static void run_blockwise(const eng_backend_t *be, int J)
{
    fixture_t f;
    load_fixture(&f);
    eng_gpt_t *m = make_model(&f, be, f.B);
    kiln_err_t err;
    cr_assert_eq(eng_gpt_set_head_blocks(m, J, &err), 0, "%s", err.message);
    eng_gpt_acts_t *a = NULL;
    cr_assert_eq(eng_gpt_acts_create(m, f.B, f.T, &a, &err), 0);
    size_t BT = (size_t)f.B * f.T, nbf = eng_gpt_max_boundary_floats(m, f.B, f.T);
    float *g1 = be->alloc(nbf * 4), *g2 = be->alloc(nbf * 4);
    be->memset_zero(m->p.grads, f.n * 4);
    eng_gpt_acts_set_batch(m, a, f.tok[0], f.tgt[0]);
    int nb = eng_gpt_num_blocks(m);
    for (int b = 0; b < nb; b++) eng_gpt_block_forward(m, a, b, true);
    be->to_host(a->host_losses, a->losses, BT * 4);
    double loss = 0;
    for (size_t i = 0; i < BT; i++) loss += a->host_losses[i];
    loss /= (double)BT;
    cr_assert(fabs(loss - f.loss1) <= 1e-5 * fabs(f.loss1), "%s J=%d: loss %.7f vs pytorch %.7f",
              be->name, J, loss, f.loss1);
    float *dout = NULL, *din = g1;
    for (int b = nb - 1; b >= 0; b--) {
        eng_gpt_block_backward(m, a, b, dout, din, 1.0f / (float)BT);
        dout = din;
        din = din == g1 ? g2 : g1;
    }
    check_grads(m, f.grads1);
    be->free(g1);
    be->free(g2);
    eng_gpt_acts_destroy(m, a);
    eng_gpt_destroy(m);
    free(f.buf);
}

Test(gpt_step, blockwise_and_split_head_match_pytorch)
{
    eng_cpu_set_threads(2);
    const int js[] = {1, 2, 3, 7};
    for (size_t i = 0; i < sizeof(js) / sizeof(js[0]); i++) {
        run_blockwise(&eng_cpu_backend, js[i]);
        run_blockwise(&eng_ref_backend, js[i]);
    }
}

/* Activation checkpointing recomputes the same numbers: gradients equal the stored-activation
 * run's bit for bit, whole-model and block by block with a split head, with two microbatches in
 * flight (forward a, forward b, backward a, backward b: the workspace then holds b's blocks
 * when a's backward needs its own), and each activation set is smaller. */
static void grads_of(const fixture_t *f, bool recompute, int J, float *out, size_t *act_bytes)
{
    eng_gpt_t *m = make_model(f, &eng_cpu_backend, 1);
    kiln_err_t err;
    cr_assert_eq(eng_gpt_set_head_blocks(m, J, &err), 0, "%s", err.message);
    cr_assert_eq(eng_gpt_set_recompute(m, recompute, &err), 0, "%s", err.message);
    eng_gpt_acts_t *a[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(eng_gpt_acts_create(m, 1, f->T, &a[k], &err), 0);
        eng_gpt_acts_set_batch(m, a[k], f->tok[0] + k * f->T, f->tgt[0] + k * f->T);
    }
    *act_bytes = a[0]->bytes;
    size_t nbf = eng_gpt_max_boundary_floats(m, 1, f->T);
    float *g1 = calloc(nbf, 4), *g2 = calloc(nbf, 4);
    int nb = eng_gpt_num_blocks(m);
    for (int k = 0; k < 2; k++)
        for (int b = 0; b < nb; b++) eng_gpt_block_forward(m, a[k], b, true);
    for (int k = 0; k < 2; k++) {
        float *dout = NULL, *din = g1;
        for (int b = nb - 1; b >= 0; b--) {
            eng_gpt_block_backward(m, a[k], b, dout, din, 1.0f / (2 * f->T));
            dout = din;
            din = din == g1 ? g2 : g1;
        }
    }
    /* and whole-model passes: forward then backward of one set */
    eng_gpt_forward(m, a[0], true);
    eng_gpt_backward(m, a[0], 1.0f / (2 * f->T), NULL, NULL);
    memcpy(out, m->p.grads, f->n * 4);
    free(g1);
    free(g2);
    for (int k = 0; k < 2; k++) eng_gpt_acts_destroy(m, a[k]);
    eng_gpt_destroy(m);
}

Test(gpt_step, activation_checkpointing_gives_the_same_bits)
{
    eng_cpu_set_threads(2);
    fixture_t f;
    load_fixture(&f);
    float *plain = malloc(f.n * 4), *rc = malloc(f.n * 4);
    const int js[] = {1, 3};
    for (size_t i = 0; i < 2; i++) {
        size_t bp, br;
        grads_of(&f, false, js[i], plain, &bp);
        grads_of(&f, true, js[i], rc, &br);
        cr_assert(memcmp(plain, rc, f.n * 4) == 0, "J=%d: recomputed gradients differ", js[i]);
        cr_assert_lt(br, bp / 2, "J=%d: an activation set holds %zu bytes with recompute, %zu without",
                     js[i], br, bp);
    }
    free(plain);
    free(rc);
    free(f.buf);
}
