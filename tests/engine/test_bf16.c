/* test_bf16.c - mixed precision on the CPU: the bf16 group's fast kernels (oneDNN's matmul, the
 * rounding, the fused AdamW) against the plain reference group (engine/ref), the run-time CPU
 * check, and a whole GPT step in bf16 against the fp32 PyTorch fixture of test_gpt_step.c.
 *
 * Tolerances.
 *  - Rounding fp32 -> bf16: exact (both round to nearest even; NaN stays NaN).
 *  - GEMMs on the same bf16 inputs: the products are exact in fp32, so only the summation differs
 *    (fp32 in oneDNN, double in the reference): |fast - ref| <= 1e-4 + 1e-4 * |ref|.
 *  - bf16 against fp32 GEMMs: the inputs lose their last 16 mantissa bits (relative 2^-9 each), so
 *    |bf16 - fp32| <= 2e-2 * max|fp32| over the output, and somewhere > 1e-4 of it (it is bf16).
 *  - AdamW with the bf16 copy: the fp32 update bit for bit the fp32 AdamW's, the copy exactly the
 *    rounding of it.
 *  - A GPT step in bf16 against PyTorch's float64 reference: loss relative 1e-2, each gradient
 *    tensor within 5e-2 * its largest element (bf16's 8 mantissa bits through a two-layer model),
 *    the CPU's bf16 model against the reference's bf16 model within 2e-2 * max. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/engine.h"

static const eng_backend_bf16_t *CPU = &eng_cpu_bf16, *REF = &eng_ref_bf16;

static void *g_allocs[64];
static int g_nallocs;
static void *track(void *p)
{
    cr_assert(p && g_nallocs < 64);
    g_allocs[g_nallocs++] = p;
    return p;
}
static void teardown(void)
{
    while (g_nallocs > 0) free(g_allocs[--g_nallocs]);
}
static void setup(void) { eng_cpu_set_threads(2); }

static float *fresh(size_t n, eng_rng_t *r, double scale)
{
    float *x = track(malloc(sizeof(float) * n));
    for (size_t i = 0; i < n; i++) x[i] = (float)(scale * eng_rng_normal(r));
    return x;
}
static float *zeros(size_t n) { return track(calloc(n, sizeof(float))); }
static uint16_t *halves(const float *x, size_t n)
{
    uint16_t *h = track(malloc(sizeof(uint16_t) * n));
    REF->from_f32(h, x, n);
    return h;
}

static void expect_close(const float *fast, const float *ref, size_t n, double atol, double rtol,
                         const char *what)
{
    for (size_t i = 0; i < n; i++)
        cr_assert(fabs((double)fast[i] - ref[i]) <= atol + rtol * fabs(ref[i]),
                  "%s[%zu]: fast %.8g vs ref %.8g", what, i, fast[i], ref[i]);
}

Test(bf16, this_machine_has_bf16_compute_and_the_check_can_refuse)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    cr_assert_eq(CPU->available(&err), 0, "%s", err.message);
    eng_cpu_settings_set(NULL, false); /* kiln-train's --cpu-bf16=false, a test setting */
    cr_assert_eq(CPU->available(&err), KILN_EUNSUPP);
    cr_assert(strstr(err.message, "neither AVX512-BF16 nor AMX-BF16"), "%s", err.message);
    cr_assert_str_eq(err.field, "distribution.mixed_precision");
    eng_cpu_settings_set(NULL, true);
}

Test(bf16, rounding_is_exact, .init = setup, .fini = teardown)
{
    eng_rng_t r;
    eng_rng_seed(&r, 3);
    size_t n = 200000;
    float *x = fresh(n, &r, 3);
    /* ties (both ways), the largest finite values, infinities, NaN, denormals */
    uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u,
                          0xff800000u, 0x7fc00001u, 0x00000001u, 0x80400000u, 0x3f80ffffu};
    memcpy(x, special, sizeof(special));
    uint16_t *a = track(malloc(2 * n)), *b = track(malloc(2 * n));
    CPU->from_f32(a, x, n);
    REF->from_f32(b, x, n);
    cr_assert(memcmp(a, b, 2 * n) == 0, "CPU rounding differs from the reference");
    cr_assert_eq(b[0], 0x3f80, "a tie rounds to even (down)");
    cr_assert_eq(b[1], 0x3f82, "a tie rounds to even (up)");
    cr_assert_eq(b[4], 0x7f80, "infinity stays infinity");
    cr_assert((b[6] & 0x7f80) == 0x7f80 && (b[6] & 0x7f), "NaN stays NaN");
}

static void check_matmul(int N, int C, int OC, bool bias)
{
    eng_rng_t r;
    eng_rng_seed(&r, (uint64_t)(N * 131 + C * 7 + OC));
    float *x = fresh((size_t)N * C, &r, 1), *w = fresh((size_t)OC * C, &r, 0.2), *b = fresh(OC, &r, 1);
    float *d = fresh((size_t)N * OC, &r, 1);
    uint16_t *xb = halves(x, (size_t)N * C), *wb = halves(w, (size_t)OC * C), *db = halves(d, (size_t)N * OC);
    float *o1 = zeros((size_t)N * OC), *o2 = zeros((size_t)N * OC), *o3 = zeros((size_t)N * OC);
    CPU->matmul_forward(o1, xb, wb, bias ? b : NULL, N, C, OC);
    REF->matmul_forward(o2, xb, wb, bias ? b : NULL, N, C, OC);
    expect_close(o1, o2, (size_t)N * OC, 1e-4, 1e-4, "out");
    /* against fp32: close, but not the same numbers */
    eng_ref_backend.matmul_forward(o3, x, w, bias ? b : NULL, N, C, OC);
    double mx = 0, worst = 0;
    for (size_t i = 0; i < (size_t)N * OC; i++) mx = fmax(mx, fabs(o3[i]));
    for (size_t i = 0; i < (size_t)N * OC; i++) worst = fmax(worst, fabs((double)o1[i] - o3[i]));
    cr_assert_leq(worst, 2e-2 * mx, "bf16 GEMM off fp32 by %.3g (max %.3g)", worst, mx);
    cr_assert_gt(worst, 1e-4 * mx, "bf16 GEMM equals fp32: it did not round");
    float *dx1 = zeros((size_t)N * C), *dx2 = zeros((size_t)N * C);
    float *dw1 = fresh((size_t)OC * C, &r, 1), *dw2 = zeros((size_t)OC * C);
    float *db1 = fresh(OC, &r, 1), *db2 = zeros(OC);
    memcpy(dw2, dw1, sizeof(float) * OC * C); /* gradients accumulate onto what is there */
    memcpy(db2, db1, sizeof(float) * OC);
    CPU->matmul_backward(dx1, dw1, db1, d, db, xb, wb, N, C, OC);
    REF->matmul_backward(dx2, dw2, db2, d, db, xb, wb, N, C, OC);
    expect_close(dx1, dx2, (size_t)N * C, 1e-4, 1e-4, "dinp");
    expect_close(dw1, dw2, (size_t)OC * C, 1e-4, 1e-4, "dw");
    expect_close(db1, db2, (size_t)OC, 1e-4, 1e-4, "dbias");
    /* dinp may be skipped */
    CPU->matmul_backward(NULL, dw1, NULL, d, db, xb, wb, N, C, OC);
}

Test(bf16, matmul_against_the_reference, .init = setup, .fini = teardown)
{
    check_matmul(37, 48, 70, true);
    check_matmul(64, 128, 384, false);
    check_matmul(128, 256, 64, true);
}

Test(bf16, matmul_is_deterministic, .init = setup, .fini = teardown)
{
    eng_rng_t r;
    eng_rng_seed(&r, 9);
    int N = 256, C = 256, OC = 768;
    uint16_t *x = halves(fresh((size_t)N * C, &r, 1), (size_t)N * C);
    uint16_t *w = halves(fresh((size_t)OC * C, &r, 0.1), (size_t)OC * C);
    float *o[2] = {zeros((size_t)N * OC), zeros((size_t)N * OC)};
    float *dw[2] = {zeros((size_t)OC * C), zeros((size_t)OC * C)};
    uint16_t *d = halves(fresh((size_t)N * OC, &r, 1), (size_t)N * OC);
    float *df = zeros((size_t)N * OC);
    for (int k = 0; k < 2; k++) {
        CPU->matmul_forward(o[k], x, w, NULL, N, C, OC);
        CPU->matmul_backward(NULL, dw[k], NULL, df, d, x, w, N, C, OC);
    }
    cr_assert(memcmp(o[0], o[1], sizeof(float) * N * OC) == 0, "forward differs run to run");
    cr_assert(memcmp(dw[0], dw[1], sizeof(float) * OC * C) == 0, "dw differs run to run");
    kiln_err_t err;
    cr_assert_eq(eng_cpu_backend.status(NULL, &err), 0, "%s", err.message);
}

Test(bf16, adamw_writes_the_rounded_copy, .init = setup, .fini = teardown)
{
    eng_rng_t r;
    eng_rng_seed(&r, 17);
    size_t n = 70001;
    float *p1 = fresh(n, &r, 1), *g = fresh(n, &r, 1), *m1 = fresh(n, &r, 0.1), *v1 = zeros(n);
    for (size_t i = 0; i < n; i++) v1[i] = (float)(0.01 * fabs(eng_rng_normal(&r)));
    float *p2 = zeros(n), *m2 = zeros(n), *v2 = zeros(n);
    memcpy(p2, p1, n * 4);
    memcpy(m2, m1, n * 4);
    memcpy(v2, v1, n * 4);
    uint16_t *pb = track(malloc(2 * n)), *want = track(malloc(2 * n));
    for (int64_t t = 1; t <= 3; t++) {
        CPU->adamw_update(p1, pb, g, m1, v1, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, t);
        eng_cpu_backend.adamw_update(p2, g, m2, v2, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, t);
    }
    cr_assert(memcmp(p1, p2, n * 4) == 0 && memcmp(m1, m2, n * 4) == 0 && memcmp(v1, v2, n * 4) == 0,
              "the fp32 update differs from the fp32 AdamW's");
    REF->from_f32(want, p1, n);
    cr_assert(memcmp(pb, want, 2 * n) == 0, "the bf16 copy is not the rounded weights");
}

/* ---- a GPT step in bf16 ------------------------------------------------------------------------- */

/* The fixture of test_gpt_step.c (layout in tests/engine/fixtures/make_gpt_step.py). */
typedef struct fixture {
    int V, Vp, T, L, NH, C, B;
    size_t n;
    float loss1;
    int32_t *tok, *tgt;
    float *init, *grads1;
    void *buf;
} fixture_t;

static void load_fixture(fixture_t *f)
{
    const char *root = getenv("KILN_ROOT");
    char path[1024];
    snprintf(path, sizeof(path), "%s/tests/engine/fixtures/gpt_step.bin", root ? root : ".");
    FILE *fp = fopen(path, "rb");
    cr_assert(fp, "cannot open fixture %s", path);
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    f->buf = track(malloc(size));
    cr_assert(fread(f->buf, 1, size, fp) == (size_t)size);
    fclose(fp);
    int32_t *h = f->buf;
    cr_assert_eq(h[0], 0x4B4C4E31, "bad fixture magic");
    f->V = h[2]; f->Vp = h[3]; f->T = h[4]; f->L = h[5]; f->NH = h[6]; f->C = h[7]; f->B = h[8];
    f->n = (size_t)h[9];
    f->loss1 = ((float *)(h + 16))[6];
    size_t bt = (size_t)f->B * f->T;
    f->tok = h + 32;
    f->tgt = f->tok + bt;
    f->init = (float *)(f->tgt + 3 * bt);
    f->grads1 = f->init + f->n;
}

/* Loss and gradients of the fixture's first batch through a bf16 model on be. */
static float bf16_step(const fixture_t *f, const eng_backend_t *be, float *grads)
{
    eng_gpt_config_t cfg = {f->T, f->V, f->Vp, f->L, f->NH, f->C};
    eng_gpt_t *m = NULL;
    eng_gpt_acts_t *a = NULL;
    kiln_err_t err;
    cr_assert_eq(eng_gpt_create(&cfg, be, f->B, &m, &err), 0, "%s", err.message);
    cr_assert_eq(eng_gpt_set_bf16(m, true, &err), 0, "%s", err.message);
    cr_assert_eq(eng_gpt_acts_create(m, f->B, f->T, &a, &err), 0);
    memcpy(m->p.params, f->init, f->n * sizeof(float));
    eng_gpt_bf16_refresh(m, 0, f->n);
    eng_gpt_acts_set_batch(m, a, f->tok, f->tgt);
    float loss = eng_gpt_forward(m, a, true);
    eng_gpt_backward(m, a, 1.0f / (f->B * f->T), NULL, NULL);
    memcpy(grads, m->p.grads, f->n * sizeof(float));
    eng_gpt_acts_destroy(m, a);
    eng_gpt_destroy(m);
    return loss;
}

static double max_diff_over(const float *a, const float *b, size_t off, size_t n, double *mx)
{
    double worst = 0;
    *mx = 0;
    for (size_t i = off; i < off + n; i++) {
        *mx = fmax(*mx, fabs(b[i]));
        worst = fmax(worst, fabs((double)a[i] - b[i]));
    }
    return worst;
}

Test(bf16, gpt_step_against_pytorch, .init = setup, .fini = teardown)
{
    fixture_t f;
    load_fixture(&f);
    float *gc = zeros(f.n), *gr = zeros(f.n);
    float lc = bf16_step(&f, &eng_cpu_backend, gc), lr = bf16_step(&f, &eng_ref_backend, gr);
    cr_assert(fabsf(lc - f.loss1) <= 1e-2f * f.loss1, "bf16 loss %.6f vs pytorch %.6f", lc, f.loss1);
    cr_assert(fabsf(lc - lr) <= 2e-3f * lr, "cpu bf16 loss %.6f vs reference bf16 %.6f", lc, lr);
    eng_gpt_config_t cfg = {f.T, f.V, f.Vp, f.L, f.NH, f.C};
    eng_gpt_t *m = NULL;
    kiln_err_t err;
    cr_assert_eq(eng_gpt_create(&cfg, &eng_ref_backend, 1, &m, &err), 0);
    bool rounded = false;
    for (int t = 0; t < m->p.n_tensors; t++) {
        const eng_tensor_t *tt = &m->p.tensors[t];
        double mx, d = max_diff_over(gc, f.grads1, tt->off, tt->n, &mx);
        cr_assert_leq(d, 5e-2 * mx, "grad %s: bf16 off pytorch by %.3g (max %.3g)", tt->name, d, mx);
        rounded |= d > 1e-4 * mx;
        d = max_diff_over(gc, gr, tt->off, tt->n, &mx);
        cr_assert_leq(d, 2e-2 * mx, "grad %s: cpu bf16 off reference bf16 by %.3g (max %.3g)", tt->name, d, mx);
    }
    cr_assert(rounded, "bf16 gradients equal fp32's: the GEMMs did not run in bf16");
    eng_gpt_destroy(m);
}
