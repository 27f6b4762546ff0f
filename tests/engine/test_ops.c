/* test_ops.c - every op of the backend table: the reference implementation's backward against
 * central finite differences of its forward, and each fast CPU kernel against the reference on
 * fresh random inputs.
 *
 * Tolerances. Finite differences: objective f = sum(out * R) for a fixed random R, accumulated in
 * double; step h = 1e-2 (1e-3 for the saturating ops); a gradient element passes when
 * |analytic - numeric| <= 2e-3 * max(1, |numeric|). Fast vs reference: |fast - ref| <=
 * 1e-5 + 1e-4 * |ref| per element (float GEMMs and the polynomial expf against double
 * accumulation); GELU 1e-5 absolute (tanh through expf loses ~1e-6 near 0); AdamW 1e-7
 * absolute on O(1) state (float against double arithmetic); the rest exact or tighter. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/engine.h"

static const eng_backend_t *REF = &eng_ref_backend;
static const eng_backend_t *CPU = &eng_cpu_backend;

/* Every buffer a test makes is tracked and freed in teardown (leak-clean under ASan). */
static void *g_allocs[512];
static int g_nallocs;
static void *track(void *p)
{
    cr_assert(p && g_nallocs < 512);
    g_allocs[g_nallocs++] = p;
    return p;
}
static void teardown(void)
{
    while (g_nallocs > 0) free(g_allocs[--g_nallocs]);
}

static void fill(float *x, size_t n, eng_rng_t *r, double scale)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)(scale * eng_rng_normal(r));
}

static float *fresh(size_t n, eng_rng_t *r, double scale)
{
    float *x = track(malloc(sizeof(float) * (n ? n : 1)));
    fill(x, n, r, scale);
    return x;
}

static float *zeros(size_t n) { return track(calloc(n ? n : 1, sizeof(float))); }

static double dot(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

static void setup(void) { eng_cpu_set_threads(2); }

/* Central difference of f w.r.t. x[i], compared with g[i], for every i (or a stride). */
#define CHECK_FD(x, n, g, h, fexpr)                                                              \
    do {                                                                                         \
        for (size_t _i = 0; _i < (n); _i++) {                                                    \
            float _save = (x)[_i];                                                               \
            (x)[_i] = _save + (h);                                                               \
            double _fp = (fexpr);                                                                \
            (x)[_i] = _save - (h);                                                               \
            double _fm = (fexpr);                                                                \
            (x)[_i] = _save;                                                                     \
            double _num = (_fp - _fm) / (2.0 * (h)), _ana = (g)[_i];                             \
            cr_assert(fabs(_ana - _num) <= 2e-3 * fmax(1.0, fabs(_num)),                        \
                      "%s[%zu]: analytic %.7g vs numeric %.7g", #x, _i, _ana, _num);             \
        }                                                                                        \
    } while (0)

static void expect_close(const float *fast, const float *ref, size_t n, double atol, double rtol,
                         const char *what)
{
    for (size_t i = 0; i < n; i++)
        cr_assert(fabs((double)fast[i] - ref[i]) <= atol + rtol * fabs(ref[i]),
                  "%s[%zu]: fast %.8g vs ref %.8g", what, i, fast[i], ref[i]);
}

/* ---- finite differences on the reference ops ------------------------------------------------- */

Test(ops_fd, matmul, .init = setup, .fini = teardown)
{
    eng_rng_t r;
    eng_rng_seed(&r, 1);
    int N = 5, C = 7, OC = 6;
    float *x = fresh(N * C, &r, 1), *w = fresh(OC * C, &r, 0.5), *b = fresh(OC, &r, 0.5);
    float *out = zeros(N * OC), *R = fresh(N * OC, &r, 1);
    float *dx = zeros(N * C), *dw = zeros(OC * C), *db = zeros(OC);
    REF->matmul_backward(dx, dw, db, R, x, w, N, C, OC);
#define F_MM (REF->matmul_forward(out, x, w, b, N, C, OC), dot(out, R, N * OC))
    CHECK_FD(x, (size_t)N * C, dx, 1e-2, F_MM);
    CHECK_FD(w, (size_t)OC * C, dw, 1e-2, F_MM);
    CHECK_FD(b, (size_t)OC, db, 1e-2, F_MM);
}

Test(ops_fd, layernorm, .init = setup, .fini = teardown)
{
    eng_rng_t r;
    eng_rng_seed(&r, 2);
    int N = 4, C = 9;
    float *x = fresh(N * C, &r, 1), *w = fresh(C, &r, 1), *b = fresh(C, &r, 1);
    float *out = zeros(N * C), *mean = zeros(N), *rstd = zeros(N), *R = fresh(N * C, &r, 1);
    float *dx = zeros(N * C), *dw = zeros(C), *db = zeros(C);
    REF->layernorm_forward(out, mean, rstd, x, w, b, N, C);
    REF->layernorm_backward(dx, dw, db, R, x, w, mean, rstd, N, C);
#define F_LN (REF->layernorm_forward(out, mean, rstd, x, w, b, N, C), dot(out, R, N * C))
    CHECK_FD(x, (size_t)N * C, dx, 1e-2, F_LN);
    CHECK_FD(w, (size_t)C, dw, 1e-2, F_LN);
    CHECK_FD(b, (size_t)C, db, 1e-2, F_LN);
}

Test(ops_fd, attention, .init = setup, .fini = teardown)
{
    eng_rng_t r;
    eng_rng_seed(&r, 3);
    int B = 2, T = 5, C = 8, NH = 2;
    size_t nq = (size_t)B * T * 3 * C;
    float *qkv = fresh(nq, &r, 1), *out = zeros(B * T * C), *att = zeros(B * NH * T * T);
    float *R = fresh(B * T * C, &r, 1), *dqkv = zeros(nq), *scratch = zeros(B * NH * T * T);
    REF->attention_forward(out, att, qkv, B, T, C, NH);
    REF->attention_backward(dqkv, scratch, R, qkv, att, B, T, C, NH);
#define F_ATT (REF->attention_forward(out, att, qkv, B, T, C, NH), dot(out, R, B * T * C))
    CHECK_FD(qkv, nq, dqkv, 1e-2, F_ATT);
}

Test(ops_fd, gelu_relu, .init = setup, .fini = teardown)
{
    eng_rng_t r;
    eng_rng_seed(&r, 4);
    size_t n = 64;
    float *x = fresh(n, &r, 2), *out = zeros(n), *R = fresh(n, &r, 1), *dx = zeros(n);
    REF->gelu_backward(dx, x, R, n);
#define F_GELU (REF->gelu_forward(out, x, n), dot(out, R, n))
    CHECK_FD(x, n, dx, 1e-3, F_GELU);
    for (size_t i = 0; i < n; i++)
        if (fabsf(x[i]) < 1e-2f) x[i] = 0.5f; /* keep away from ReLU's kink */
    REF->relu_backward(dx, x, R, n);
#define F_RELU (REF->relu_forward(out, x, n), dot(out, R, n))
    CHECK_FD(x, n, dx, 1e-3, F_RELU);
}

Test(ops_fd, encoder, .init = setup, .fini = teardown)
{
    eng_rng_t r;
    eng_rng_seed(&r, 5);
    int B = 2, T = 3, C = 4, V = 5;
    int32_t inp[] = {1, 4, 1, 0, 1, 3}; /* repeated token 1 */
    float *wte = fresh(V * C, &r, 1), *wpe = fresh(T * C, &r, 1), *out = zeros(B * T * C);
    float *R = fresh(B * T * C, &r, 1), *dwte = zeros(V * C), *dwpe = zeros(T * C);
    REF->encoder_backward(dwte, dwpe, R, inp, B, T, C);
#define F_ENC (REF->encoder_forward(out, inp, wte, wpe, B, T, C), dot(out, R, B * T * C))
    CHECK_FD(wte, (size_t)V * C, dwte, 1e-2, F_ENC);
    CHECK_FD(wpe, (size_t)T * C, dwpe, 1e-2, F_ENC);
}

Test(ops_fd, softmax_xent, .init = setup, .fini = teardown)
{
    eng_rng_t r;
    eng_rng_seed(&r, 6);
    int N = 4, V = 7, Vp = 8;
    int32_t tgt[] = {0, 6, 3, 3};
    float *logits = fresh(N * Vp, &r, 2), *probs = zeros(N * Vp), *losses = zeros(N);
    float *dl = zeros(N * Vp);
    float dloss = 0.37f;
    REF->xent_forward(probs, losses, logits, tgt, N, V, Vp);
    REF->xent_backward(dl, probs, tgt, dloss, N, V, Vp);
    for (int i = 0; i < N; i++) cr_assert_eq(dl[i * Vp + V], 0.0f, "padding gets no gradient");
    float ones[4] = {1, 1, 1, 1};
#define F_XE (REF->xent_forward(probs, losses, logits, tgt, N, V, Vp), dloss * dot(losses, ones, N))
    CHECK_FD(logits, (size_t)N * Vp, dl, 1e-2, F_XE);
}

/* ---- fast CPU kernels against the reference ----------------------------------------------------- */

/* The CPU backend's fp32 GEMMs against the reference, on OpenBLAS and on oneDNN
 * (eng_cpu_settings_set, kiln-train's --cpu-sgemm; the choice is made once per process, and each test is a process of its own). */
static void matmul_case(int N, int C, int OC, uint64_t seed);

static void matmul_on(const char *sgemm, const char *want)
{
    eng_cpu_settings_set(sgemm, true);
    if (strncmp(eng_cpu_sgemm_name(), want, strlen(want)))
        cr_skip_test("fp32 GEMMs run on %s here", eng_cpu_sgemm_name());
    matmul_case(37, 48, 70, 11);
    matmul_case(130, 64, 200, 19); /* the transposed output gradient spans several tiles */
}

Test(ops_fast, matmul_on_openblas, .init = setup, .fini = teardown) { matmul_on("openblas", "OpenBLAS"); }
Test(ops_fast, matmul_on_onednn, .init = setup, .fini = teardown) { matmul_on("onednn", "oneDNN"); }

static void matmul_case(int N, int C, int OC, uint64_t seed)
{
    eng_rng_t r;
    eng_rng_seed(&r, seed);
    float *x = fresh(N * C, &r, 1), *w = fresh(OC * C, &r, 0.2), *b = fresh(OC, &r, 1);
    float *o1 = zeros(N * OC), *o2 = zeros(N * OC), *d = fresh(N * OC, &r, 1);
    CPU->matmul_forward(o1, x, w, b, N, C, OC);
    REF->matmul_forward(o2, x, w, b, N, C, OC);
    expect_close(o1, o2, (size_t)N * OC, 1e-5, 1e-4, "out");
    CPU->matmul_forward(o1, x, w, NULL, N, C, OC);
    REF->matmul_forward(o2, x, w, NULL, N, C, OC);
    expect_close(o1, o2, (size_t)N * OC, 1e-5, 1e-4, "out (no bias)");
    float *dx1 = zeros(N * C), *dx2 = zeros(N * C), *dw1 = fresh(OC * C, &r, 1), *dw2 = zeros(OC * C);
    float *db1 = fresh(OC, &r, 1), *db2 = zeros(OC);
    memcpy(dw2, dw1, sizeof(float) * OC * C); /* accumulation onto existing values */
    memcpy(db2, db1, sizeof(float) * OC);
    CPU->matmul_backward(dx1, dw1, db1, d, x, w, N, C, OC);
    REF->matmul_backward(dx2, dw2, db2, d, x, w, N, C, OC);
    expect_close(dx1, dx2, (size_t)N * C, 1e-5, 1e-4, "dinp");
    expect_close(dw1, dw2, (size_t)OC * C, 1e-5, 1e-4, "dw");
    expect_close(db1, db2, (size_t)OC, 1e-5, 1e-4, "dbias");
}

Test(ops_fast, layernorm, .init = setup, .fini = teardown)
{
    eng_rng_t r;
    eng_rng_seed(&r, 12);
    int N = 33, C = 96;
    float *x = fresh(N * C, &r, 3), *w = fresh(C, &r, 1), *b = fresh(C, &r, 1);
    float *o1 = zeros(N * C), *o2 = zeros(N * C), *m1 = zeros(N), *m2 = zeros(N);
    float *s1 = zeros(N), *s2 = zeros(N), *d = fresh(N * C, &r, 1);
    for (int i = 0; i < N * C; i++) x[i] += 5.0f; /* a mean far from zero */
    CPU->layernorm_forward(o1, m1, s1, x, w, b, N, C);
    REF->layernorm_forward(o2, m2, s2, x, w, b, N, C);
    expect_close(o1, o2, (size_t)N * C, 1e-5, 1e-4, "out");
    expect_close(m1, m2, N, 1e-5, 1e-5, "mean");
    expect_close(s1, s2, N, 1e-5, 1e-4, "rstd");
    float *dx1 = fresh(N * C, &r, 1), *dx2 = zeros(N * C), *dw1 = zeros(C), *dw2 = zeros(C);
    float *db1 = zeros(C), *db2 = zeros(C);
    memcpy(dx2, dx1, sizeof(float) * N * C); /* dinp accumulates */
    CPU->layernorm_backward(dx1, dw1, db1, d, x, w, m2, s2, N, C);
    REF->layernorm_backward(dx2, dw2, db2, d, x, w, m2, s2, N, C);
    expect_close(dx1, dx2, (size_t)N * C, 1e-5, 1e-4, "dinp");
    expect_close(dw1, dw2, C, 1e-5, 1e-4, "dw");
    expect_close(db1, db2, C, 1e-5, 1e-4, "db");
}

/* T = 19 fits one causal tile; 77 and 300 cross several, ending in a partial one (tiles are 32
 * rows below T = 256, 64 from there). Head size 64 with T <= 256 takes the hand-written AVX-512
 * kernels where the CPU has them: T = 77 and 130 end in partial 4-row and 16-key blocks. */
Test(ops_fast, attention, .init = setup, .fini = teardown)
{
    eng_rng_t r;
    eng_rng_seed(&r, 13);
    const int shapes[][4] = {{3, 19, 24, 3}, {2, 77, 32, 2}, {1, 300, 16, 2},
                             {2, 77, 128, 2}, {1, 130, 64, 1}, {1, 128, 256, 4}};
    for (size_t i = 0; i < KILN_ARRAY_LEN(shapes); i++) {
        int B = shapes[i][0], T = shapes[i][1], C = shapes[i][2], NH = shapes[i][3];
        cr_log_info("attention B=%d T=%d C=%d NH=%d", B, T, C, NH);
        size_t nq = (size_t)B * T * 3 * C, na = (size_t)B * NH * T * T;
        float *qkv = fresh(nq, &r, 1), *o1 = zeros(B * T * C), *o2 = zeros(B * T * C);
        float *a1 = fresh(na, &r, 1), *a2 = zeros(na), *d = fresh(B * T * C, &r, 1);
        CPU->attention_forward(o1, a1, qkv, B, T, C, NH);
        REF->attention_forward(o2, a2, qkv, B, T, C, NH);
        expect_close(o1, o2, (size_t)B * T * C, 1e-5, 1e-4, "out");
        expect_close(a1, a2, na, 1e-6, 1e-4, "att");
        float *dq1 = fresh(nq, &r, 1), *dq2 = zeros(nq), *s1 = fresh(na, &r, 1), *s2 = zeros(na);
        CPU->attention_backward(dq1, s1, d, qkv, a2, B, T, C, NH);
        REF->attention_backward(dq2, s2, d, qkv, a2, B, T, C, NH);
        expect_close(dq1, dq2, nq, 1e-5, 1e-4, "dqkv");
    }
}

Test(ops_fast, pointwise, .init = setup, .fini = teardown)
{
    eng_rng_t r;
    eng_rng_seed(&r, 14);
    size_t n = 10007;
    float *x = fresh(n, &r, 3), *d = fresh(n, &r, 1), *o1 = zeros(n), *o2 = zeros(n);
    x[0] = 30.0f; /* saturation at both ends */
    x[1] = -30.0f;
    CPU->gelu_forward(o1, x, n);
    REF->gelu_forward(o2, x, n);
    expect_close(o1, o2, n, 1e-5, 1e-5, "gelu");
    CPU->gelu_backward(o1, x, d, n);
    REF->gelu_backward(o2, x, d, n);
    expect_close(o1, o2, n, 1e-5, 1e-5, "gelu'");
    CPU->relu_forward(o1, x, n);
    REF->relu_forward(o2, x, n);
    expect_close(o1, o2, n, 0, 0, "relu");
    CPU->relu_backward(o1, x, d, n);
    REF->relu_backward(o2, x, d, n);
    expect_close(o1, o2, n, 0, 0, "relu'");
    CPU->residual_forward(o1, x, d, n);
    REF->residual_forward(o2, x, d, n);
    expect_close(o1, o2, n, 0, 0, "residual");
    memcpy(o1, x, n * sizeof(float));
    memcpy(o2, x, n * sizeof(float));
    CPU->scale(o1, 0.3f, n);
    REF->scale(o2, 0.3f, n);
    expect_close(o1, o2, n, 0, 0, "scale");
    double s1 = CPU->sumsq(x, n), s2 = REF->sumsq(x, n);
    cr_assert(fabs(s1 - s2) <= 1e-12 * s2, "sumsq %.17g vs %.17g", s1, s2);
}

Test(ops_fast, encoder, .init = setup, .fini = teardown)
{
    eng_rng_t r;
    eng_rng_seed(&r, 15);
    int B = 4, T = 9, C = 40, V = 11;
    int32_t inp[36];
    for (int i = 0; i < B * T; i++) inp[i] = (int32_t)eng_rng_below(&r, 4); /* many repeats */
    float *wte = fresh(V * C, &r, 1), *wpe = fresh(T * C, &r, 1);
    float *o1 = zeros(B * T * C), *o2 = zeros(B * T * C), *d = fresh(B * T * C, &r, 1);
    CPU->encoder_forward(o1, inp, wte, wpe, B, T, C);
    REF->encoder_forward(o2, inp, wte, wpe, B, T, C);
    expect_close(o1, o2, (size_t)B * T * C, 0, 0, "out");
    float *g1 = zeros(V * C), *g2 = zeros(V * C), *p1 = zeros(T * C), *p2 = zeros(T * C);
    CPU->encoder_backward(g1, p1, d, inp, B, T, C);
    REF->encoder_backward(g2, p2, d, inp, B, T, C);
    expect_close(g1, g2, (size_t)V * C, 1e-6, 1e-5, "dwte");
    expect_close(p1, p2, (size_t)T * C, 1e-6, 1e-5, "dwpe");
}

Test(ops_fast, softmax_xent, .init = setup, .fini = teardown)
{
    eng_rng_t r;
    eng_rng_seed(&r, 16);
    int N = 13, V = 1000, Vp = 1024;
    int32_t tgt[13];
    for (int i = 0; i < N; i++) tgt[i] = (int32_t)eng_rng_below(&r, V);
    float *l = fresh(N * Vp, &r, 4), *p1 = zeros(N * Vp), *p2 = zeros(N * Vp);
    float *l1 = zeros(N), *l2 = zeros(N);
    l[5] = 80.0f; /* a dominant logit: exp must not overflow */
    CPU->xent_forward(p1, l1, l, tgt, N, V, Vp);
    REF->xent_forward(p2, l2, l, tgt, N, V, Vp);
    expect_close(p1, p2, (size_t)N * Vp, 1e-7, 1e-5, "probs");
    expect_close(l1, l2, N, 1e-5, 1e-5, "losses");
    /* in place (probs aliasing logits), as the GPT uses it */
    float *l3 = zeros((size_t)N * Vp);
    memcpy(l3, l, sizeof(float) * N * Vp);
    CPU->xent_forward(l3, l1, l3, tgt, N, V, Vp);
    expect_close(l3, p2, (size_t)N * Vp, 1e-7, 1e-5, "probs in place");
    expect_close(l1, l2, N, 1e-5, 1e-5, "losses in place");
    CPU->xent_backward(p1, p2, tgt, 0.25f, N, V, Vp);
    REF->xent_backward(l3, p2, tgt, 0.25f, N, V, Vp);
    expect_close(p1, l3, (size_t)N * Vp, 1e-7, 1e-6, "dlogits");
}

Test(ops_fast, adamw, .init = setup, .fini = teardown)
{
    eng_rng_t r;
    eng_rng_seed(&r, 17);
    size_t n = 5000;
    float *p1 = fresh(n, &r, 1), *g = fresh(n, &r, 1), *m1 = fresh(n, &r, 0.1), *v1 = zeros(n);
    for (size_t i = 0; i < n; i++) v1[i] = (float)(0.01 * fabs(eng_rng_normal(&r)));
    float *p2 = zeros(n), *m2 = zeros(n), *v2 = zeros(n);
    memcpy(p2, p1, n * 4);
    memcpy(m2, m1, n * 4);
    memcpy(v2, v1, n * 4);
    for (int64_t t = 3; t <= 5; t++) {
        CPU->adamw_update(p1, g, m1, v1, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, t);
        REF->adamw_update(p2, g, m2, v2, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, t);
    }
    expect_close(p1, p2, n, 1e-7, 1e-6, "param");
    expect_close(m1, m2, n, 1e-7, 1e-5, "m");
    expect_close(v1, v2, n, 1e-7, 1e-5, "v");
}

/* The fast kernels are deterministic, and sumsq does not depend on the thread count. */
Test(ops_fast, deterministic, .fini = teardown)
{
    eng_rng_t r;
    eng_rng_seed(&r, 18);
    size_t n = 300001;
    float *x = fresh(n, &r, 1);
    eng_cpu_set_threads(1);
    double s1 = CPU->sumsq(x, n);
    eng_cpu_set_threads(2);
    double s2 = CPU->sumsq(x, n);
    cr_assert(s1 == s2, "sumsq depends on the thread count: %.17g vs %.17g", s1, s2);
    int N = 64, C = 96;
    float *w = fresh(C, &r, 1), *b = fresh(C, &r, 1), *d = fresh(N * C, &r, 1);
    float *m = zeros(N), *s = zeros(N), *o = zeros(N * C);
    float *dx[2], *dw[2], *db[2];
    for (int k = 0; k < 2; k++) {
        dx[k] = zeros(N * C);
        dw[k] = zeros(C);
        db[k] = zeros(C);
        CPU->layernorm_forward(o, m, s, x, w, b, N, C);
        CPU->layernorm_backward(dx[k], dw[k], db[k], d, x, w, m, s, N, C);
    }
    cr_assert(memcmp(dw[0], dw[1], C * 4) == 0 && memcmp(dx[0], dx[1], N * C * 4) == 0);
}
