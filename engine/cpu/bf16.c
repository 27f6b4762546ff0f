/* bf16.c - the CPU backend's bf16 group (backend.h): GEMMs with bf16 inputs and fp32
 * accumulation through oneDNN's matmul primitive, which runs AMX tiles or AVX512-BF16 dot
 * products on CPUs that have them (about 4x OpenBLAS's fp32 sgemm on a 2-core Sapphire Rapids,
 * 2x on a Zen 4; bench/RESULTS.md), and the fp32 -> bf16 rounding. Whether the machine has bf16
 * compute is read from the CPU at run time. It is not the rest of the CPU backend (cpu.c), and
 * the plain reference it is tested against is eng_ref_bf16 (engine/ref/ref.c). */
#pragma GCC target("prefer-vector-width=512")
#include <cpuid.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/bf16.h"
#include "engine/cpu/cpu_int.h"

/* ---- the machine ---------------------------------------------------------------------------- */

/* AVX512-BF16: CPUID.(EAX=7,ECX=1):EAX bit 5. AMX-BF16: CPUID.(EAX=7,ECX=0):EDX bit 22. Both
 * need the OS to save the AVX-512 state (XCR0 bits 5-7, with OSXSAVE). KILN_CPU_BF16=0 makes the
 * machine look as if it had neither (to see the refusal on a machine that has them). */
static int bf16_available(kiln_err_t *err)
{
    const char *force = getenv("KILN_CPU_BF16");
    unsigned a, b, c, d;
    bool avx512_bf16 = false, amx_bf16 = false, os_avx512 = false;
    if (__get_cpuid_count(1, 0, &a, &b, &c, &d) && (c & (1u << 27))) { /* OSXSAVE */
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        os_avx512 = (lo & 0xe6) == 0xe6;
    }
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) avx512_bf16 = a & (1u << 5);
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) amx_bf16 = d & (1u << 22);
    if (force && !strcmp(force, "0")) avx512_bf16 = amx_bf16 = false;
    if (os_avx512 && (avx512_bf16 || amx_bf16)) return KILN_OK;
    kiln_err_set(err, KILN_EUNSUPP, "distribution.mixed_precision",
                 "mixed_precision \"bf16\" needs bf16 compute, and this CPU has neither "
                 "AVX512-BF16 nor AMX-BF16%s", force && !strcmp(force, "0") ? " (KILN_CPU_BF16=0)" : "");
    kiln_err_hint(err, "leave out distribution.mixed_precision to train in fp32, or run on a CPU "
                       "with AVX512-BF16 (AMD Zen 4, Intel Cooper Lake or Sapphire Rapids) or a GPU");
    return KILN_EUNSUPP;
}

/* ---- rounding ------------------------------------------------------------------------------- */

static void bf16_from_f32(uint16_t *dst, const float *src, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n > (1u << 16))
    for (size_t i = 0; i < n; i++)
        dst[i] = eng_bf16_round(src[i]);
}

/* ---- oneDNN --------------------------------------------------------------------------------- */

/* One matmul shape: dst (M,N) f32 = src (M,K) bf16 x wei (K,N) bf16 [+ bias (N) f32], with the
 * strides of each operand (row-major views and transposes of kiln's buffers), overwriting or
 * accumulating into dst. Primitives are made once per shape and kept. */
typedef struct mm_key {
    int M, K, N;
    long ss[2], ws[2]; /* src and weight strides */
    int bias, accumulate;
} mm_key_t;

typedef struct mm_entry {
    mm_key_t key;
    dnnl_primitive_t prim;
} mm_entry_t;

#define MM_CACHE 64
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;
static mm_entry_t g_cache[MM_CACHE];
static int g_ncache;
static int g_failed;          /* first failure, sticky: KILN_EDEVICE */
static char g_failmsg[200];

/* Records the first failure; g_mu held. */
static void fail_locked(const char *what, dnnl_status_t st)
{
    if (!g_failed) {
        g_failed = KILN_EDEVICE;
        snprintf(g_failmsg, sizeof(g_failmsg), "oneDNN bf16 matmul failed: %s (status %d)", what,
                 (int)st);
    }
}

static void fail(const char *what, dnnl_status_t st)
{
    pthread_mutex_lock(&g_mu);
    fail_locked(what, st);
    pthread_mutex_unlock(&g_mu);
}

int eng_cpu_bf16_status(kiln_err_t *err)
{
    pthread_mutex_lock(&g_mu);
    int st = g_failed;
    if (st) kiln_err_set(err, st, NULL, "%s", g_failmsg);
    pthread_mutex_unlock(&g_mu);
    return st;
}

static void descs(const mm_key_t *k, dnnl_memory_desc_t *src, dnnl_memory_desc_t *wei,
                  dnnl_memory_desc_t *bias, dnnl_memory_desc_t *dst)
{
    dnnl_dims_t ds = {k->M, k->K}, dw = {k->K, k->N}, dd = {k->M, k->N}, db = {1, k->N};
    dnnl_dims_t ss = {k->ss[0], k->ss[1]}, ws = {k->ws[0], k->ws[1]}, sd = {k->N, 1},
                sb = {k->N, 1};
    dnnl_memory_desc_init_by_strides(src, 2, ds, dnnl_bf16, ss);
    dnnl_memory_desc_init_by_strides(wei, 2, dw, dnnl_bf16, ws);
    dnnl_memory_desc_init_by_strides(dst, 2, dd, dnnl_f32, sd);
    dnnl_memory_desc_init_by_strides(bias, 2, db, dnnl_f32, sb);
}

/* The primitive for k, made on first use; NULL after a failure (recorded). */
static dnnl_primitive_t primitive(const mm_key_t *k)
{
    dnnl_primitive_t prim = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_status_t st = dnnl_success;
    const char *what = "";
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_ncache; i++)
        if (!memcmp(&g_cache[i].key, k, sizeof(*k))) {
            prim = g_cache[i].prim;
            pthread_mutex_unlock(&g_mu);
            return prim;
        }
    if (!g_engine) {
        if ((st = dnnl_engine_create(&g_engine, dnnl_cpu, 0)) != dnnl_success) {
            what = "creating the CPU engine";
            goto fail;
        }
        if ((st = dnnl_stream_create(&g_stream, g_engine, dnnl_stream_default_flags))) {
            what = "creating the stream";
            goto fail;
        }
    }
    dnnl_memory_desc_t src, wei, bias, dst;
    descs(k, &src, &wei, &bias, &dst);
    dnnl_matmul_desc_t md;
    if ((st = dnnl_matmul_desc_init(&md, &src, &wei, k->bias ? &bias : NULL, &dst))) {
        what = "describing the matmul";
        goto fail;
    }
    if ((st = dnnl_primitive_attr_create(&attr))) {
        what = "creating attributes";
        goto fail;
    }
    if (k->accumulate) {
        if ((st = dnnl_post_ops_create(&po)) || (st = dnnl_post_ops_append_sum(po, 1.0f)) ||
            (st = dnnl_primitive_attr_set_post_ops(attr, po))) {
            what = "setting up accumulation";
            goto fail;
        }
    }
    if ((st = dnnl_primitive_desc_create(&pd, &md, attr, g_engine, NULL)) ||
        (st = dnnl_primitive_create(&prim, pd))) {
        what = "creating the primitive";
        goto fail;
    }
    if (g_ncache == MM_CACHE) { /* full: the oldest shape makes room */
        dnnl_primitive_destroy(g_cache[0].prim);
        memmove(g_cache, g_cache + 1, sizeof(g_cache[0]) * (MM_CACHE - 1));
        g_ncache--;
    }
    g_cache[g_ncache++] = (mm_entry_t){*k, prim};
    goto done;
fail:
    fail_locked(what, st);
    prim = NULL;
done:
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (pd) dnnl_primitive_desc_destroy(pd);
    pthread_mutex_unlock(&g_mu);
    return prim;
}

static void run(const mm_key_t *k, const uint16_t *src, const uint16_t *wei, const float *bias,
                float *dst)
{
    dnnl_primitive_t prim = primitive(k);
    if (!prim) return;
    dnnl_memory_desc_t ds, dw, db, dd;
    descs(k, &ds, &dw, &db, &dd);
    dnnl_memory_t ms = NULL, mw = NULL, mb = NULL, md = NULL;
    dnnl_status_t st;
    if ((st = dnnl_memory_create(&ms, &ds, g_engine, (void *)src)) ||
        (st = dnnl_memory_create(&mw, &dw, g_engine, (void *)wei)) ||
        (st = dnnl_memory_create(&md, &dd, g_engine, dst)) ||
        (bias && (st = dnnl_memory_create(&mb, &db, g_engine, (void *)bias)))) {
        fail("wrapping the buffers", st);
        goto done;
    }
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, md},
                               {DNNL_ARG_BIAS, mb}};
    if ((st = dnnl_primitive_execute(prim, g_stream, bias ? 4 : 3, args)) ||
        (st = dnnl_stream_wait(g_stream)))
        fail("executing", st);
done:
    dnnl_memory_destroy(ms);
    dnnl_memory_destroy(mw);
    dnnl_memory_destroy(mb);
    dnnl_memory_destroy(md);
}

/* A buffer of at least n bf16 values for the transposed output gradient, kept between calls
 * (the backend's GEMMs run one at a time, as its oneDNN stream does); NULL without memory. */
static uint16_t *transpose_scratch(size_t n)
{
    static uint16_t *buf;
    static size_t cap;
    pthread_mutex_lock(&g_mu);
    if (cap < n) {
        free(buf);
        buf = malloc(n * sizeof(uint16_t));
        cap = buf ? n : 0;
    }
    uint16_t *out = buf;
    pthread_mutex_unlock(&g_mu);
    return out;
}

/* dst (cols, rows) = src (rows, cols)^T, in 64x64 tiles. */
static void transpose_bf16(uint16_t *restrict dst, const uint16_t *restrict src, int rows, int cols)
{
#pragma omp parallel for schedule(static)
    for (int cb = 0; cb < cols; cb += 64)
        for (int rb = 0; rb < rows; rb += 64)
            for (int c = cb; c < cb + 64 && c < cols; c++)
                for (int r = rb; r < rb + 64 && r < rows; r++)
                    dst[(size_t)c * rows + r] = src[(size_t)r * cols + c];
}

/* out (N,OC) = inp (N,C) @ w^T: src inp (M=N, K=C), weights w^T (K=C, N=OC) read from w (OC,C). */
static void bf16_matmul_forward(float *out, const uint16_t *inp, const uint16_t *w,
                                const float *bias, int N, int C, int OC)
{
    mm_key_t k = {N, C, OC, {C, 1}, {1, C}, bias != NULL, 0};
    run(&k, inp, w, bias, out);
}

static void bf16_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                                 const uint16_t *dout_bf, const uint16_t *inp, const uint16_t *w,
                                 int N, int C, int OC)
{
    if (dinp) { /* dinp (N,C) = dout (N,OC) @ w (OC,C) */
        mm_key_t k = {N, OC, C, {OC, 1}, {C, 1}, 0, 0};
        run(&k, dout_bf, w, NULL, dinp);
    }
    if (dw) { /* dw (OC,C) += dout^T (OC,N) @ inp (N,C), dout^T laid out row by row first:
               * oneDNN's bf16 kernels read a transposed source at a third of their speed */
        uint16_t *t = transpose_scratch((size_t)N * OC);
        if (t) {
            transpose_bf16(t, dout_bf, N, OC);
            mm_key_t k = {OC, N, C, {N, 1}, {C, 1}, 0, 1};
            run(&k, t, inp, NULL, dw);
        } else {
            mm_key_t k = {OC, N, C, {1, OC}, {C, 1}, 0, 1};
            run(&k, dout_bf, inp, NULL, dw);
        }
    }
    if (dbias) eng_cpu_colsum_acc(dbias, dout, N, OC);
}

const eng_backend_bf16_t eng_cpu_bf16 = {
    .available = bf16_available,
    .from_f32 = bf16_from_f32,
    .matmul_forward = bf16_matmul_forward,
    .matmul_backward = bf16_matmul_backward,
    .adamw_update = eng_cpu_adamw_bf16,
};
