/* test_cuda.c - the CUDA backend (libkiln_cuda.so) against the CPU reference ops, reached only
 * through eng_backend_get("cuda") / dlopen, so this binary starts where libcudart is absent.
 * Without a GPU every device test prints "skipped: no CUDA device found (<reason>)" and is
 * reported as skipped; the loader tests still run. Everything is reached through the backend
 * table (engine/backend.h): its fp32 ops, state, bf16 group, fused GEMM + GELU and NCCL.
 *
 * Each device test draws fresh random inputs (seed from the clock, printed on failure), poisons
 * every overwritten output with NaN before the op runs (so an unwritten element fails), and
 * compares with eng_ref_backend (double accumulation). Tolerances, as relative L2 error
 * ||gpu - ref|| / ||ref|| unless stated:
 *  - fp32 ops, GEMMs in exact fp32 (the backend's default):      1e-5 (attention 1e-4);
 *  - the bf16 group's GEMMs against the reference group on the same bf16 inputs (products exact
 *    in fp32, fp32 against double accumulation):                  1e-4;
 *  - elementwise fp32 (GELU, residual, xent, AdamW):             1e-5 (max-abs where stated);
 *  - the GELU GEMM epilogue's output:                             2e-3;
 *  - sums of squares (double accumulation):                      1e-9 relative;
 *  - a whole GPT training step vs the CPU backend: loss relative 1e-5 and each gradient tensor
 *    and its AdamW update 1e-4 in fp32; in bf16 (both sides bf16 GEMMs, oneDNN vs cuBLAS, the
 *    same roundings up to ties) loss 2e-3, tensors 2e-2;
 *  - deterministic mode (the default): bit-identical results on a second run. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/bf16.h"
#include "engine/engine.h"

static const eng_backend_t *G;      /* the CUDA backend */
static const eng_backend_t *REF = &eng_ref_backend;
static eng_rng_t g_rng;
static uint64_t g_seed;

/* ---- loading and skipping ------------------------------------------------------------------ */

/* The library eng_backend_get() tried, if it is loaded: same search order as backend.c. */
static void *loaded_lib(void)
{
    const char *env = getenv("KILN_CUDA_LIB");
    void *h = NULL;
    if (env && *env && (h = dlopen(env, RTLD_NOW | RTLD_NOLOAD))) return h;
    char exe[PATH_MAX], cand[PATH_MAX + 64];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (len > 0) {
        exe[len] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(cand, sizeof(cand), "%s/libkiln_cuda.so", exe);
            if ((h = dlopen(cand, RTLD_NOW | RTLD_NOLOAD))) return h;
            snprintf(cand, sizeof(cand), "%s/../lib/libkiln_cuda.so", exe);
            if ((h = dlopen(cand, RTLD_NOW | RTLD_NOLOAD))) return h;
        }
    }
    return dlopen("libkiln_cuda.so", RTLD_NOW | RTLD_NOLOAD);
}

/* Loads the backend or skips the calling test with the reason. */
static void need_cuda(void)
{
    kiln_err_t err;
    memset(&err, 0, sizeof(err));
    const eng_backend_t *be = NULL;
    eng_backend_cuda_lib_set(getenv("KILN_CUDA_LIB")); /* as kiln-train's --cuda-lib */
    if (eng_backend_get("cuda", &be, &err) != 0) {
        char reason[400];
        snprintf(reason, sizeof(reason), "%s", err.message);
        void *h = loaded_lib();
        if (h) {
            const char *(*why)(void) = (const char *(*)(void))dlsym(h, "eng_cuda_unavailable_reason");
            if (why && *why()) snprintf(reason, sizeof(reason), "%s", why());
            dlclose(h);
        }
        fprintf(stderr, "skipped: no CUDA device found (%s)\n", reason);
        cr_skip_test("skipped: no CUDA device found (%s)", reason);
    }
    G = be;
    cr_assert_eq(G->abi, ENG_BACKEND_ABI);
    g_seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    eng_rng_seed(&g_rng, g_seed);
}

/* Every test ends with the device clean: no sticky error. */
static void expect_ok(void)
{
    kiln_err_t err;
    memset(&err, 0, sizeof(err));
    int st = G->status(G->ctx, &err);
    cr_assert_eq(st, 0, "device error: %s (seed %llu)", err.message, (unsigned long long)g_seed);
}

/* ---- buffers -------------------------------------------------------------------------------- */
static void *g_host[256], *g_dev[256];
static int g_nhost, g_ndev;
static void *th(void *p) { cr_assert(p && g_nhost < 256); return g_host[g_nhost++] = p; }
static void *td(void *p) { cr_assert(p && g_ndev < 256, "device allocation failed"); return g_dev[g_ndev++] = p; }
static void teardown(void)
{
    while (g_nhost > 0) free(g_host[--g_nhost]);
    if (G) while (g_ndev > 0) G->free(g_dev[--g_ndev]);
}

static float *hrand(size_t n, double scale)
{
    float *x = th(malloc(sizeof(float) * (n ? n : 1)));
    for (size_t i = 0; i < n; i++) x[i] = (float)(scale * eng_rng_normal(&g_rng));
    return x;
}
static float *hcopy(const float *s, size_t n)
{
    float *x = th(malloc(sizeof(float) * (n ? n : 1)));
    memcpy(x, s, n * sizeof(float));
    return x;
}
static float *hnan(size_t n)
{
    float *x = th(malloc(sizeof(float) * (n ? n : 1)));
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}
static int32_t *htok(size_t n, int V)
{
    int32_t *t = th(malloc(sizeof(int32_t) * (n ? n : 1)));
    for (size_t i = 0; i < n; i++) t[i] = (int32_t)eng_rng_below(&g_rng, (uint64_t)V);
    return t;
}
static void *dup_dev(const void *h, size_t bytes)
{
    void *d = td(G->alloc(bytes));
    G->to_device(d, h, bytes);
    return d;
}
static float *dnan(size_t n) { return dup_dev(hnan(n), n * sizeof(float)); }
static float *hget(const void *d, size_t n)
{
    float *h = th(malloc(sizeof(float) * (n ? n : 1)));
    G->to_host(h, d, n * sizeof(float));
    return h;
}

static uint16_t *dev_bf_nan(size_t n)
{
    uint16_t *b = th(malloc(2 * (n ? n : 1)));
    for (size_t i = 0; i < n; i++) b[i] = 0x7fc0; /* NaN */
    return dup_dev(b, n * 2);
}
static float *hget_bf(const uint16_t *d, size_t n)
{
    uint16_t *b = th(malloc(2 * (n ? n : 1)));
    G->to_host(b, d, n * 2);
    float *f = th(malloc(sizeof(float) * (n ? n : 1)));
    for (size_t i = 0; i < n; i++) f[i] = eng_bf16_value(b[i]);
    return f;
}

/* ---- comparisons ---------------------------------------------------------------------------- */
static double rel_l2(const float *got, const float *want, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
#define EXPECT_REL(got, want, n, tol, what)                                                      \
    do {                                                                                         \
        double e_ = rel_l2((got), (want), (n));                                                  \
        cr_assert(e_ <= (tol), "%s: relative L2 error %.3g > %.3g (seed %llu)", (what), e_,      \
                  (double)(tol), (unsigned long long)g_seed);                                    \
    } while (0)
static double max_abs(const float *got, const float *want, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        double d = fabs((double)got[i] - want[i]);
        if (d > m) m = d;
    }
    return m;
}

TestSuite(cuda, .fini = teardown, .timeout = 120);

/* Criterion 2.4's runner leaks a 48-byte event record now and then when skipped tests report
 * concurrently (--jobs 2; never with --jobs 1, never in this file's code). LeakSanitizer reads
 * this hook from the binary; the suppression names only that library. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libcriterion.so\n"; }

/* ---- the loader (runs with or without a GPU) --------------------------------------------------- */

/* The test binary never links libcudart: the runtime's symbols are not in the global scope. */
Test(cuda, binary_does_not_link_cuda_runtime)
{
    cr_assert_null(dlsym(RTLD_DEFAULT, "cudaGetDeviceCount"),
                   "libcudart is linked into the test binary");
    const eng_backend_t *be = NULL;
    kiln_err_t err;
    eng_backend_get("auto", &be, &err);
    cr_assert_null(dlsym(RTLD_DEFAULT, "cudaGetDeviceCount"),
                   "loading the CUDA backend leaked libcudart into the global scope");
}

/* "auto" falls back to the CPU when no GPU is usable, "cuda" then fails with a reason and a
 * hint; with a GPU both give the CUDA backend. */
Test(cuda, device_choice_degrades_cleanly)
{
    const eng_backend_t *be_auto = NULL, *be_cuda = NULL;
    kiln_err_t err;
    memset(&err, 0, sizeof(err));
    cr_assert_eq(eng_backend_get("auto", &be_auto, &err), 0);
    int rc = eng_backend_get("cuda", &be_cuda, &err);
    if (rc == 0) {
        cr_assert_str_eq(be_cuda->name, "cuda");
        cr_assert_eq(be_auto, be_cuda, "auto must pick the GPU when one is usable");
        /* Every required op of the table is implemented (from memset_zero on; discard is
         * optional and device memory has none), and the groups the trainer uses are there. */
        void *const *slot = (void *const *)&be_cuda->memset_zero;
        size_t nptr = (sizeof(eng_backend_t) - offsetof(eng_backend_t, memset_zero)) / sizeof(void *);
        for (size_t i = 0; i < nptr; i++) cr_assert_not_null(slot[i], "table slot %zu is NULL", i);
        cr_assert(be_cuda->status && be_cuda->mem_stats && be_cuda->bf16 && be_cuda->fused && be_cuda->coll);
        cr_assert(!be_cuda->host_memory);
    } else {
        cr_assert_eq(rc, KILN_EUNAVAIL);
        cr_assert_str_eq(be_auto->name, "cpu");
        cr_assert(strlen(err.message) > 0 && strstr(err.message, "cuda"), "message: %s", err.message);
        cr_assert(strlen(err.hint) > 0, "no hint");
        void *h = loaded_lib();
        if (h) { /* the library was found: it must explain itself */
            const char *(*why)(void) = (const char *(*)(void))dlsym(h, "eng_cuda_unavailable_reason");
            cr_assert_not_null(why);
            cr_assert(strlen(why()) > 0);
            const eng_backend_t *t = dlsym(h, "eng_cuda_backend");
            cr_assert_not_null(t);
            cr_assert_eq(t->abi, ENG_BACKEND_ABI, "the library's table is version %d", t->abi);
            fprintf(stderr, "cuda backend library loads; no device: %s\n", why());
            dlclose(h);
        }
    }
}

/* ---- GEMMs ------------------------------------------------------------------------------------- */

/* One round of forward (with and without bias), backward and the GELU epilogue. Odd shapes
 * leave 16-byte alignment behind, which sends cuBLASLt to other kernels or to the fallback. */
static void check_matmul_shape(int N, int C, int OC, double tol)
{
    float *inp = hrand((size_t)N * C, 1.0), *w = hrand((size_t)OC * C, 0.1),
          *bias = hrand(OC, 0.5), *dout = hrand((size_t)N * OC, 1.0);
    float *dw0 = hrand((size_t)OC * C, 0.1), *db0 = hrand(OC, 0.1);
    float *d_inp = dup_dev(inp, (size_t)N * C * 4), *d_w = dup_dev(w, (size_t)OC * C * 4);
    float *d_bias = dup_dev(bias, OC * 4), *d_dout = dup_dev(dout, (size_t)N * OC * 4);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        float *d_out = dnan((size_t)N * OC);
        G->matmul_forward(d_out, d_inp, d_w, with_bias ? d_bias : NULL, N, C, OC);
        float *ref = hnan((size_t)N * OC);
        REF->matmul_forward(ref, inp, w, with_bias ? bias : NULL, N, C, OC);
        EXPECT_REL(hget(d_out, (size_t)N * OC), ref, (size_t)N * OC, tol, "matmul_forward");
    }
    float *d_dinp = dnan((size_t)N * C), *d_dw = dup_dev(dw0, (size_t)OC * C * 4),
          *d_db = dup_dev(db0, OC * 4);
    G->matmul_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N, C, OC);
    float *dinp = hnan((size_t)N * C), *dw = hcopy(dw0, (size_t)OC * C), *db = hcopy(db0, OC);
    REF->matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC);
    EXPECT_REL(hget(d_dinp, (size_t)N * C), dinp, (size_t)N * C, tol, "matmul_backward dinp");
    EXPECT_REL(hget(d_dw, (size_t)OC * C), dw, (size_t)OC * C, tol, "matmul_backward dw");
    /* the bias gradient is a plain fp32 column sum in every mode */
    EXPECT_REL(hget(d_db, OC), db, OC, 1e-5, "matmul_backward dbias");
    /* fused GELU epilogue (the table's fused group) */
    float *d_out = dnan((size_t)N * OC), *d_pre = dnan((size_t)N * OC);
    G->fused->matmul_forward_gelu(d_out, d_pre, d_inp, d_w, d_bias, N, C, OC);
    float *pre = hnan((size_t)N * OC), *out = hnan((size_t)N * OC);
    REF->matmul_forward(pre, inp, w, bias, N, C, OC);
    REF->gelu_forward(out, pre, (size_t)N * OC);
    EXPECT_REL(hget(d_pre, (size_t)N * OC), pre, (size_t)N * OC, tol, "matmul_forward_gelu pre");
    /* cuBLASLt's GELU epilogue may evaluate tanh with a fast approximation (~5e-4 relative) */
    EXPECT_REL(hget(d_out, (size_t)N * OC), out, (size_t)N * OC, tol > 2e-3 ? tol : 2e-3,
               "matmul_forward_gelu out");
}

static void check_matmul(double tol)
{
    check_matmul_shape(96 + (int)eng_rng_below(&g_rng, 64), 128 + 8 * (int)eng_rng_below(&g_rng, 8),
                       160 + 8 * (int)eng_rng_below(&g_rng, 8), tol);
    check_matmul_shape(37 + (int)eng_rng_below(&g_rng, 10), 53, 29 + 2 * (int)eng_rng_below(&g_rng, 5),
                       tol);
    expect_ok();
}

Test(cuda, matmul_fp32) { need_cuda(); check_matmul(1e-5); }

/* The bf16 group: GEMMs on the same bf16 inputs as the reference group, the rounding, and the
 * AdamW that writes the bf16 copy. */
Test(cuda, bf16_group)
{
    need_cuda();
    kiln_err_t err;
    memset(&err, 0, sizeof(err));
    if (G->bf16->available(&err) != 0) {
        fprintf(stderr, "skipped: %s\n", err.message);
        cr_skip_test("skipped: %s", err.message);
    }
    const eng_backend_bf16_t *B = G->bf16, *R = &eng_ref_bf16;
    int N = 96 + (int)eng_rng_below(&g_rng, 64), C = 128 + 8 * (int)eng_rng_below(&g_rng, 8), OC = 200;
    float *inp = hrand((size_t)N * C, 1.0), *w = hrand((size_t)OC * C, 0.1), *bias = hrand(OC, 0.5);
    float *dout = hrand((size_t)N * OC, 1.0), *dw0 = hrand((size_t)OC * C, 0.1), *db0 = hrand(OC, 0.1);
    uint16_t *bi = th(malloc(2 * (size_t)N * C)), *bw = th(malloc(2 * (size_t)OC * C)),
             *bd = th(malloc(2 * (size_t)N * OC));
    R->from_f32(bi, inp, (size_t)N * C);
    R->from_f32(bw, w, (size_t)OC * C);
    R->from_f32(bd, dout, (size_t)N * OC);
    /* rounding on the device equals the reference's */
    uint16_t *d_bi = td(G->alloc(2 * (size_t)N * C)), *got = th(malloc(2 * (size_t)N * C));
    B->from_f32(d_bi, dup_dev(inp, (size_t)N * C * 4), (size_t)N * C);
    G->to_host(got, d_bi, 2 * (size_t)N * C);
    cr_assert(memcmp(got, bi, 2 * (size_t)N * C) == 0, "bf16 rounding differs from the reference");
    uint16_t *d_bw = dup_dev(bw, 2 * (size_t)OC * C), *d_bd = dup_dev(bd, 2 * (size_t)N * OC);
    float *d_bias = dup_dev(bias, OC * 4), *d_dout = dup_dev(dout, (size_t)N * OC * 4);
    float *d_out = dnan((size_t)N * OC), *out = hnan((size_t)N * OC);
    B->matmul_forward(d_out, d_bi, d_bw, d_bias, N, C, OC);
    R->matmul_forward(out, bi, bw, bias, N, C, OC);
    EXPECT_REL(hget(d_out, (size_t)N * OC), out, (size_t)N * OC, 1e-4, "bf16 matmul_forward");
    float *d_dinp = dnan((size_t)N * C), *d_dw = dup_dev(dw0, (size_t)OC * C * 4), *d_db = dup_dev(db0, OC * 4);
    float *dinp = hnan((size_t)N * C), *dw = hcopy(dw0, (size_t)OC * C), *db = hcopy(db0, OC);
    B->matmul_backward(d_dinp, d_dw, d_db, d_dout, d_bd, d_bi, d_bw, N, C, OC);
    R->matmul_backward(dinp, dw, db, dout, bd, bi, bw, N, C, OC);
    EXPECT_REL(hget(d_dinp, (size_t)N * C), dinp, (size_t)N * C, 1e-4, "bf16 matmul_backward dinp");
    EXPECT_REL(hget(d_dw, (size_t)OC * C), dw, (size_t)OC * C, 1e-4, "bf16 matmul_backward dw");
    EXPECT_REL(hget(d_db, OC), db, OC, 1e-5, "bf16 matmul_backward dbias");
    /* AdamW with the bf16 copy */
    size_t n = 5000;
    float *p = hrand(n, 1.0), *g = hrand(n, 1.0), *m = hrand(n, 0.1), *v = hrand(n, 0.1);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    float *rp = hcopy(p, n), *rm = hcopy(m, n), *rv = hcopy(v, n);
    REF->adamw_update(rp, g, rm, rv, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 7);
    float *d_p = dup_dev(p, n * 4), *d_g = dup_dev(g, n * 4), *d_m = dup_dev(m, n * 4), *d_v = dup_dev(v, n * 4);
    uint16_t *d_pb = dev_bf_nan(n);
    B->adamw_update(d_p, d_pb, d_g, d_m, d_v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 7);
    float *gp = hget(d_p, n), *pb = hget_bf(d_pb, n);
    cr_assert(max_abs(gp, rp, n) <= 1e-6, "bf16 adamw param");
    for (size_t i = 0; i < n; i++) cr_assert_eq(pb[i], eng_bf16_value(eng_bf16_round(gp[i])), "bf16 copy [%zu]", i);
    expect_ok();
}

/* ---- LayerNorm, encoder, elementwise --------------------------------------------------------------- */

Test(cuda, layernorm)
{
    need_cuda();
    int N = 200 + (int)eng_rng_below(&g_rng, 100), C = 96 + (int)eng_rng_below(&g_rng, 200);
    float *inp = hrand((size_t)N * C, 2.0), *w = hrand(C, 1.0), *b = hrand(C, 1.0);
    for (size_t i = 0; i < (size_t)N * C; i++) inp[i] += 3.0f; /* a mean far from 0 */
    float *dout = hrand((size_t)N * C, 1.0), *dinp0 = hrand((size_t)N * C, 1.0),
          *dw0 = hrand(C, 1.0), *db0 = hrand(C, 1.0);
    float *d_inp = dup_dev(inp, (size_t)N * C * 4), *d_w = dup_dev(w, C * 4), *d_b = dup_dev(b, C * 4);
    float *d_out = dnan((size_t)N * C), *d_mean = dnan(N), *d_rstd = dnan(N);
    G->layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C);
    float *out = hnan((size_t)N * C), *mean = hnan(N), *rstd = hnan(N);
    REF->layernorm_forward(out, mean, rstd, inp, w, b, N, C);
    EXPECT_REL(hget(d_out, (size_t)N * C), out, (size_t)N * C, 1e-5, "layernorm_forward out");
    EXPECT_REL(hget(d_mean, N), mean, N, 1e-6, "layernorm_forward mean");
    EXPECT_REL(hget(d_rstd, N), rstd, N, 1e-5, "layernorm_forward rstd");
    float *d_dout = dup_dev(dout, (size_t)N * C * 4), *d_dinp = dup_dev(dinp0, (size_t)N * C * 4);
    float *d_dw = dup_dev(dw0, C * 4), *d_db = dup_dev(db0, C * 4);
    G->layernorm_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean, d_rstd, N, C);
    float *dinp = hcopy(dinp0, (size_t)N * C), *dw = hcopy(dw0, C), *db = hcopy(db0, C);
    REF->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    EXPECT_REL(hget(d_dinp, (size_t)N * C), dinp, (size_t)N * C, 1e-5, "layernorm_backward dinp");
    EXPECT_REL(hget(d_dw, C), dw, C, 1e-5, "layernorm_backward dw");
    EXPECT_REL(hget(d_db, C), db, C, 1e-5, "layernorm_backward db");
    expect_ok();
}

Test(cuda, encoder)
{
    need_cuda();
    int B = 3, T = 40 + (int)eng_rng_below(&g_rng, 30), C = 64 + (int)eng_rng_below(&g_rng, 100),
        V = 50; /* few tokens: many repeats, the hard case for the scatter */
    int32_t *inp = htok((size_t)B * T, V);
    float *wte = hrand((size_t)V * C, 1.0), *wpe = hrand((size_t)T * C, 1.0);
    float *dout = hrand((size_t)B * T * C, 1.0), *dwte0 = hrand((size_t)V * C, 1.0),
          *dwpe0 = hrand((size_t)T * C, 1.0);
    int32_t *d_inp = dup_dev(inp, (size_t)B * T * 4);
    float *d_wte = dup_dev(wte, (size_t)V * C * 4), *d_wpe = dup_dev(wpe, (size_t)T * C * 4);
    float *d_out = dnan((size_t)B * T * C);
    G->encoder_forward(d_out, d_inp, d_wte, d_wpe, B, T, C);
    float *out = hnan((size_t)B * T * C);
    REF->encoder_forward(out, inp, wte, wpe, B, T, C);
    cr_assert_eq(max_abs(hget(d_out, (size_t)B * T * C), out, (size_t)B * T * C), 0.0,
                 "encoder_forward is a float add: exact");
    float *d_dout = dup_dev(dout, (size_t)B * T * C * 4);
    float *d_dwte = dup_dev(dwte0, (size_t)V * C * 4), *d_dwpe = dup_dev(dwpe0, (size_t)T * C * 4);
    G->encoder_backward(d_dwte, d_dwpe, d_dout, d_inp, B, T, C);
    float *dwte = hcopy(dwte0, (size_t)V * C), *dwpe = hcopy(dwpe0, (size_t)T * C);
    REF->encoder_backward(dwte, dwpe, dout, inp, B, T, C);
    EXPECT_REL(hget(d_dwte, (size_t)V * C), dwte, (size_t)V * C, 1e-6, "encoder_backward dwte");
    EXPECT_REL(hget(d_dwpe, (size_t)T * C), dwpe, (size_t)T * C, 1e-6, "encoder_backward dwpe");
    expect_ok();
}

Test(cuda, elementwise)
{
    need_cuda();
    size_t n = 10000 + eng_rng_below(&g_rng, 5000);
    float *a = hrand(n, 3.0), *b = hrand(n, 1.0), *d = hrand(n, 1.0);
    float *d_a = dup_dev(a, n * 4), *d_b = dup_dev(b, n * 4), *d_d = dup_dev(d, n * 4);
    float *ref = hnan(n), *d_o = dnan(n);
    G->gelu_forward(d_o, d_a, n);
    REF->gelu_forward(ref, a, n);
    cr_assert(max_abs(hget(d_o, n), ref, n) <= 1e-5, "gelu_forward (seed %llu)", (unsigned long long)g_seed);
    d_o = dnan(n);
    G->gelu_backward(d_o, d_a, d_d, n);
    REF->gelu_backward(ref, a, d, n);
    cr_assert(max_abs(hget(d_o, n), ref, n) <= 1e-5, "gelu_backward");
    d_o = dnan(n);
    G->relu_forward(d_o, d_a, n);
    REF->relu_forward(ref, a, n);
    cr_assert_eq(max_abs(hget(d_o, n), ref, n), 0.0, "relu_forward");
    d_o = dnan(n);
    G->relu_backward(d_o, d_a, d_d, n);
    REF->relu_backward(ref, a, d, n);
    cr_assert_eq(max_abs(hget(d_o, n), ref, n), 0.0, "relu_backward");
    d_o = dnan(n);
    G->residual_forward(d_o, d_a, d_b, n);
    REF->residual_forward(ref, a, b, n);
    cr_assert_eq(max_abs(hget(d_o, n), ref, n), 0.0, "residual_forward");
    G->residual_forward(d_a, d_a, d_b, n); /* out aliasing a */
    cr_assert_eq(max_abs(hget(d_a, n), ref, n), 0.0, "residual_forward in place");
    G->scale(d_b, 0.25f, n);
    float *bs = hcopy(b, n);
    REF->scale(bs, 0.25f, n);
    cr_assert_eq(max_abs(hget(d_b, n), bs, n), 0.0, "scale");
    double s = G->sumsq(d_d, n), want = REF->sumsq(d, n);
    cr_assert(fabs(s - want) <= 1e-9 * want, "sumsq %.17g vs %.17g", s, want);
    expect_ok();
}

/* ---- attention -------------------------------------------------------------------------------------- */

static void ref_attention(float **out, float **att, float **dqkv, const float *qkv,
                          const float *dout, int B, int T, int C, int NH)
{
    *out = hnan((size_t)B * T * C);
    *att = hnan((size_t)B * NH * T * T);
    *dqkv = hnan((size_t)B * T * 3 * C);
    float *scratch = hnan((size_t)B * NH * T * T);
    REF->attention_forward(*out, *att, qkv, B, T, C, NH);
    REF->attention_backward(*dqkv, scratch, dout, qkv, *att, B, T, C, NH);
}

static void check_attention_unfused(double tol, double tol_bwd)
{
    int B = 2, NH = 4, hs = 16 + 8 * (int)eng_rng_below(&g_rng, 3), C = NH * hs,
        T = 33 + (int)eng_rng_below(&g_rng, 40);
    float *qkv = hrand((size_t)B * T * 3 * C, 1.0), *dout = hrand((size_t)B * T * C, 1.0);
    float *out, *att, *dqkv;
    ref_attention(&out, &att, &dqkv, qkv, dout, B, T, C, NH);
    float *d_qkv = dup_dev(qkv, (size_t)B * T * 3 * C * 4), *d_dout = dup_dev(dout, (size_t)B * T * C * 4);
    float *d_out = dnan((size_t)B * T * C), *d_att = dnan((size_t)B * NH * T * T);
    G->attention_forward(d_out, d_att, d_qkv, B, T, C, NH);
    EXPECT_REL(hget(d_out, (size_t)B * T * C), out, (size_t)B * T * C, tol, "attention_forward out");
    EXPECT_REL(hget(d_att, (size_t)B * NH * T * T), att, (size_t)B * NH * T * T, tol, "attention_forward att");
    float *d_dqkv = dnan((size_t)B * T * 3 * C), *d_scr = dnan((size_t)B * NH * T * T);
    G->attention_backward(d_dqkv, d_scr, d_dout, d_qkv, d_att, B, T, C, NH);
    EXPECT_REL(hget(d_dqkv, (size_t)B * T * 3 * C), dqkv, (size_t)B * T * 3 * C, tol_bwd, "attention_backward");
    expect_ok();
}
Test(cuda, attention_unfused_fp32) { need_cuda(); check_attention_unfused(1e-4, 1e-4); }

/* Out of device memory is an answer: alloc returns NULL and status() says why, and keeps
 * saying it (the trainer checks it once per step). */
Test(cuda, allocation_failure_is_reported)
{
    need_cuda();
    void *p = G->alloc((size_t)1 << 52); /* 4 PiB */
    cr_assert_null(p);
    kiln_err_t err;
    memset(&err, 0, sizeof(err));
    cr_assert_eq(G->status(G->ctx, &err), KILN_ENOMEM, "status %d: %s", err.status, err.message);
    cr_assert(strstr(err.message, "cudaMalloc"), "message: %s", err.message);
    cr_assert_eq(G->status(G->ctx, NULL), KILN_ENOMEM, "the status is sticky");
}

/* ---- cross-entropy ----------------------------------------------------------------------------------- */

Test(cuda, cross_entropy)
{
    need_cuda();
    int N = 50 + (int)eng_rng_below(&g_rng, 50), V = 1000 + (int)eng_rng_below(&g_rng, 500),
        Vp = V + 64;
    float *logits = hrand((size_t)N * Vp, 3.0);
    int32_t *tgt = htok(N, V);
    float dloss = 1.0f / N;
    float *probs = hnan((size_t)N * Vp), *losses = hnan(N), *dl = hnan((size_t)N * Vp);
    REF->xent_forward(probs, losses, logits, tgt, N, V, Vp);
    REF->xent_backward(dl, probs, tgt, dloss, N, V, Vp);
    float *d_logits = dup_dev(logits, (size_t)N * Vp * 4);
    int32_t *d_tgt = dup_dev(tgt, N * 4);
    float *d_probs = dnan((size_t)N * Vp), *d_losses = dnan(N);
    G->xent_forward(d_probs, d_losses, d_logits, d_tgt, N, V, Vp);
    EXPECT_REL(hget(d_probs, (size_t)N * Vp), probs, (size_t)N * Vp, 1e-5, "xent_forward probs");
    EXPECT_REL(hget(d_losses, N), losses, N, 1e-5, "xent_forward losses");
    float *d_dl = dnan((size_t)N * Vp);
    G->xent_backward(d_dl, d_probs, d_tgt, dloss, N, V, Vp);
    EXPECT_REL(hget(d_dl, (size_t)N * Vp), dl, (size_t)N * Vp, 1e-5, "xent_backward");
    /* in place over the logits, as the model uses it */
    G->xent_forward(d_logits, d_losses, d_logits, d_tgt, N, V, Vp);
    G->xent_backward(d_logits, d_logits, d_tgt, dloss, N, V, Vp);
    EXPECT_REL(hget(d_logits, (size_t)N * Vp), dl, (size_t)N * Vp, 1e-5, "xent in place");
    expect_ok();
}

/* ---- optimizer ---------------------------------------------------------------------------------------- */

Test(cuda, adamw)
{
    need_cuda();
    size_t n = 5000 + eng_rng_below(&g_rng, 5000);
    float *p = hrand(n, 1.0), *g = hrand(n, 1.0), *m = hrand(n, 0.1), *v = hrand(n, 0.1);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, clip = 1.0f;
    int64_t t = 1 + (int64_t)eng_rng_below(&g_rng, 100);
    /* reference: norm on the host, scale, AdamW */
    double ss = REF->sumsq(g, n), norm = sqrt(ss);
    float scale = norm > clip ? (float)(clip / (norm + 1e-6)) : 1.0f;
    float *rp = hcopy(p, n), *rm = hcopy(m, n), *rv = hcopy(v, n);
    REF->adamw_update(rp, g, rm, rv, n, lr, b1, b2, eps, wd, scale, t);
    /* table op with the host scale */
    float *d_p = dup_dev(p, n * 4), *d_g = dup_dev(g, n * 4), *d_m = dup_dev(m, n * 4),
          *d_v = dup_dev(v, n * 4);
    G->adamw_update(d_p, d_g, d_m, d_v, n, lr, b1, b2, eps, wd, scale, t);
    cr_assert(max_abs(hget(d_p, n), rp, n) <= 1e-6, "adamw param");
    cr_assert(max_abs(hget(d_m, n), rm, n) <= 1e-7, "adamw m");
    cr_assert(max_abs(hget(d_v, n), rv, n) <= 1e-7, "adamw v");
    expect_ok();
}

/* ---- a whole training step ------------------------------------------------------------------------------- */

typedef struct step_out {
    float loss;
    float *grads, *delta; /* host copies (n): gradients, and the parameter change of one step */
    size_t n;
} step_out_t;

/* Forward, backward and one AdamW step of a small GPT on backend be, from weights seeded by
 * `seed` and the given batch. AdamW starts from m = 0, v = 1 at step 1000, so the update is
 * close to linear in the gradient (from v = 0 it would be sign(g), which makes elements with
 * noise-level gradients, such as the key bias, flip at random between backends). */
static step_out_t gpt_step(const eng_backend_t *be, uint64_t seed, const int32_t *tok,
                           const int32_t *tgt, int B, int T, bool bf16)
{
    eng_gpt_config_t cfg = {.max_seq_len = T, .vocab_size = 100, .padded_vocab_size = 128,
                            .n_layer = 2, .n_head = 4, .n_embd = 64};
    eng_gpt_t *m = NULL;
    eng_gpt_acts_t *a = NULL;
    kiln_err_t err;
    cr_assert_eq(eng_gpt_create(&cfg, be, B, &m, &err), 0, "%s", err.message);
    cr_assert_eq(eng_gpt_set_bf16(m, bf16, &err), 0, "%s", err.message);
    eng_gpt_init_weights(m, seed);
    eng_gpt_bf16_refresh(m, 0, m->p.n);
    cr_assert_eq(eng_gpt_acts_create(m, B, T, &a, &err), 0, "%s", err.message);
    eng_gpt_acts_set_batch(m, a, tok, tgt);
    step_out_t r;
    r.n = m->p.n;
    float *before = th(malloc(r.n * 4));
    be->to_host(before, m->p.params, r.n * 4);
    r.loss = eng_gpt_forward(m, a, true);
    eng_gpt_backward(m, a, 1.0f / (B * T), NULL, NULL);
    r.grads = th(malloc(r.n * 4));
    be->to_host(r.grads, m->p.grads, r.n * 4);
    float *mom = be->alloc(r.n * 4), *var = be->alloc(r.n * 4);
    cr_assert(mom && var);
    float *ones = th(malloc(r.n * 4));
    for (size_t i = 0; i < r.n; i++) ones[i] = 1.0f;
    be->to_device(var, ones, r.n * 4);
    double norm = sqrt(be->sumsq(m->p.grads, r.n));
    float scale = norm > 1.0 ? (float)(1.0 / norm) : 1.0f;
    be->adamw_update(m->p.params, m->p.grads, mom, var, r.n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                     scale, 1000);
    r.delta = th(malloc(r.n * 4));
    be->to_host(r.delta, m->p.params, r.n * 4);
    for (size_t i = 0; i < r.n; i++) r.delta[i] -= before[i];
    be->free(mom);
    be->free(var);
    eng_gpt_acts_destroy(m, a);
    eng_gpt_destroy(m);
    return r;
}

static void check_gpt_step(bool bf16, double loss_tol, double grad_tol)
{
    const char *mode = bf16 ? "bf16" : "fp32";
    kiln_err_t e0;
    if (bf16 && G->bf16->available(&e0) != 0) {
        fprintf(stderr, "skipped: %s\n", e0.message);
        cr_skip_test("skipped: %s", e0.message);
    }
    int B = 4, T = 64;
    int32_t *tok = htok((size_t)B * T, 100), *tgt = htok((size_t)B * T, 100);
    uint64_t seed = eng_rng_next(&g_rng);
    eng_cpu_set_threads(2);
    step_out_t c = gpt_step(&eng_cpu_backend, seed, tok, tgt, B, T, bf16);
    step_out_t g = gpt_step(G, seed, tok, tgt, B, T, bf16);
    cr_assert_eq(c.n, g.n);
    cr_assert(fabsf(g.loss - c.loss) <= loss_tol * fabsf(c.loss), "%s: loss %.7f vs cpu %.7f",
              mode, g.loss, c.loss);
    /* per tensor, in the model's layout */
    eng_gpt_config_t cfg = {T, 100, 128, 2, 4, 64};
    eng_gpt_t *m = NULL;
    kiln_err_t err;
    cr_assert_eq(eng_gpt_create(&cfg, &eng_cpu_backend, 1, &m, &err), 0);
    for (int t = 0; t < m->p.n_tensors; t++) {
        const eng_tensor_t *tt = &m->p.tensors[t];
        char what[96];
        snprintf(what, sizeof(what), "%s: gradient of %s", mode, tt->name);
        EXPECT_REL(g.grads + tt->off, c.grads + tt->off, tt->n, grad_tol, what);
        snprintf(what, sizeof(what), "%s: AdamW update of %s", mode, tt->name);
        EXPECT_REL(g.delta + tt->off, c.delta + tt->off, tt->n, grad_tol, what);
    }
    eng_gpt_destroy(m);
    expect_ok();
}
Test(cuda, gpt_step_fp32_matches_cpu, .timeout = 300) { need_cuda(); check_gpt_step(false, 1e-5, 1e-4); }
Test(cuda, gpt_step_bf16_matches_cpu, .timeout = 300) { need_cuda(); check_gpt_step(true, 2e-3, 2e-2); }

/* Deterministic mode: the same step twice gives the same bits (loss, gradients, parameters). */
Test(cuda, deterministic_twice, .timeout = 300)
{
    need_cuda();
    int B = 4, T = 64;
    int32_t *tok = htok((size_t)B * T, 100), *tgt = htok((size_t)B * T, 100);
    uint64_t seed = eng_rng_next(&g_rng);
    step_out_t a = gpt_step(G, seed, tok, tgt, B, T, false);
    step_out_t b = gpt_step(G, seed, tok, tgt, B, T, false);
    cr_assert(memcmp(&a.loss, &b.loss, sizeof(float)) == 0, "loss differs: %.9g vs %.9g", a.loss, b.loss);
    cr_assert(memcmp(a.grads, b.grads, a.n * 4) == 0, "gradients differ between two runs");
    cr_assert(memcmp(a.delta, b.delta, a.n * 4) == 0, "parameters differ between two runs");
    expect_ok();
}

/* ---- metrics ------------------------------------------------------------------------------------------------ */

Test(cuda, memory_metrics)
{
    need_cuda();
    eng_backend_mem_t m0, m1, m2;
    G->mem_stats(G->ctx, &m0);
    void *p = G->alloc(64u << 20);
    cr_assert_not_null(p);
    G->mem_stats(G->ctx, &m1);
    cr_assert(m1.in_use_bytes >= m0.in_use_bytes + (64u << 20), "in use %zu -> %zu", m0.in_use_bytes,
              m1.in_use_bytes);
    cr_assert(m1.peak_bytes >= m1.in_use_bytes);
    cr_assert(m1.device_total_bytes > m1.in_use_bytes);
    /* alloc returns zeroed memory */
    float *h = hget(p, 1024);
    for (int i = 0; i < 1024; i++) cr_assert_eq(h[i], 0.0f);
    G->free(p);
    G->mem_stats(G->ctx, &m2);
    cr_assert_eq(m2.in_use_bytes, m0.in_use_bytes);
    cr_assert(m2.peak_bytes >= m0.in_use_bytes + (64u << 20), "peak kept after free");
    expect_ok();
}

/* ---- NCCL: the table's device collectives ----------------------------------------------------------- */

static int bcast_self(void *ctx, void *buf, size_t len, kiln_err_t *err)
{
    (void)ctx; (void)buf; (void)len; (void)err;
    return 0; /* world of one: rank 0 already holds the bytes */
}

/* A world of one exercises every call on one GPU: results equal the inputs. */
Test(cuda, nccl_single_rank)
{
    need_cuda();
    const eng_backend_coll_t *N = G->coll;
    kiln_err_t err;
    eng_dev_comm_t *c = NULL;
    cr_assert_eq(N->create(0, 1, bcast_self, NULL, &c, &err), 0, "%s", err.message);
    size_t n = 1001;
    float *x = hrand(n, 1.0);
    float *d = dup_dev(x, n * 4);
    cr_assert_eq(N->allreduce(c, d, n, 0, &err), 0, "%s", err.message);
    cr_assert_eq(N->allreduce(c, d, n, 1, &err), 0, "%s", err.message);
    cr_assert_eq(N->reduce_scatter(c, d, n, 0, &err), 0, "%s", err.message);
    cr_assert_eq(N->allgather(c, d, n, &err), 0, "%s", err.message);
    cr_assert_eq(N->wait(c, 30, &err), 0, "%s", err.message);
    cr_assert_eq(max_abs(hget(d, n), x, n), 0.0);
    N->destroy(c);
    expect_ok();
}

/* Two processes, one GPU each, the NCCL id passed through a pipe (standing in for comm_bcast).
 * Children are forked before anything touches CUDA. */
typedef struct pipe_ctx { int rank, fd; } pipe_ctx_t;
static int bcast_pipe(void *ctx, void *buf, size_t len, kiln_err_t *err)
{
    pipe_ctx_t *p = ctx;
    (void)err;
    if (p->rank == 0) return write(p->fd, buf, len) == (ssize_t)len ? 0 : KILN_EIO;
    size_t got = 0;
    while (got < len) {
        ssize_t r = read(p->fd, (char *)buf + got, len - got);
        if (r <= 0) return KILN_EIO;
        got += (size_t)r;
    }
    return 0;
}

#define CHILD_SKIP 77
static int nccl_child(int rank, int fd)
{
    char dev[16];
    snprintf(dev, sizeof(dev), "%d", rank);
    setenv("KILN_CUDA_DEVICE", dev, 1); /* a second device that is not there fails the load */
    const eng_backend_t *be = NULL;
    kiln_err_t err;
    if (eng_backend_get("cuda", &be, &err) != 0) return CHILD_SKIP;
    const eng_backend_coll_t *N = be->coll;
    pipe_ctx_t pc = {rank, fd};
    eng_dev_comm_t *c = NULL;
    if (N->create(rank, 2, bcast_pipe, &pc, &c, &err) != 0) {
        fprintf(stderr, "rank %d: %s\n", rank, err.message);
        return 1;
    }
    size_t n = 1001; /* odd: uneven shards */
    float *hx = malloc(n * 4), *hy = malloc(n * 4);
    for (size_t i = 0; i < n; i++) hx[i] = (float)(i % 97) + 1000.0f * rank;
    float *d = be->alloc(n * 4);
    be->to_device(d, hx, n * 4);
    int bad = 0;
    /* allreduce sum: (i%97) + (i%97 + 1000) */
    if (N->allreduce(c, d, n, 0, &err) || N->wait(c, 60, &err)) bad = 1;
    be->to_host(hy, d, n * 4);
    for (size_t i = 0; i < n && !bad; i++)
        if (hy[i] != 2.0f * (float)(i % 97) + 1000.0f) { bad = 2; fprintf(stderr, "allreduce [%zu] %g\n", i, hy[i]); }
    /* reduce-scatter then all-gather of the original data = allreduce */
    be->to_device(d, hx, n * 4);
    if (!bad && (N->reduce_scatter(c, d, n, 0, &err) || N->allgather(c, d, n, &err) ||
                 N->wait(c, 60, &err))) bad = 3;
    be->to_host(hy, d, n * 4);
    for (size_t i = 0; i < n && !bad; i++)
        if (hy[i] != 2.0f * (float)(i % 97) + 1000.0f) { bad = 4; fprintf(stderr, "rs+ag [%zu] %g\n", i, hy[i]); }
    if (bad) fprintf(stderr, "rank %d: nccl check %d failed: %s\n", rank, bad, err.message);
    N->destroy(c);
    be->free(d);
    free(hx);
    free(hy);
    return bad ? 1 : 0;
}

Test(cuda, nccl_two_ranks, .timeout = 180)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        cr_assert(pids[r] >= 0);
        if (pids[r] == 0) {
            close(r == 0 ? fds[0] : fds[1]);
            _exit(nccl_child(r, r == 0 ? fds[1] : fds[0]));
        }
    }
    close(fds[0]);
    close(fds[1]);
    int codes[2];
    for (int r = 0; r < 2; r++) {
        int ws = 0;
        cr_assert_eq(waitpid(pids[r], &ws, 0), pids[r]);
        codes[r] = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    }
    if (codes[0] == CHILD_SKIP || codes[1] == CHILD_SKIP) {
        need_cuda(); /* skips with the reason when there is no GPU at all */
        fprintf(stderr, "skipped: nccl_two_ranks needs 2 CUDA devices\n");
        cr_skip_test("skipped: nccl_two_ranks needs 2 CUDA devices");
    }
    cr_assert_eq(codes[0], 0, "rank 0 exited %d", codes[0]);
    cr_assert_eq(codes[1], 0, "rank 1 exited %d", codes[1]);
}
