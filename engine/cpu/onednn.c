/* onednn.c - the CPU backend's GEMMs through oneDNN's matmul primitive:
 * - the bf16 group (backend.h): bf16 inputs and fp32 accumulation, on AMX tiles or AVX512-BF16
 *   dot products where the CPU has them (about 4x OpenBLAS's fp32 sgemm on a 2-core Sapphire
 *   Rapids, 2x on a Zen 4; bench/RESULTS.md), and the fp32 -> bf16 rounding. Whether the machine
 *   has bf16 compute is read from the CPU at run time;
 * - fp32 GEMMs where OPENBLAS_CORETYPE holds OpenBLAS to kernels without AVX-512 on a CPU that
 *   has it (eng_cpu_onednn_sgemm): machines where OpenBLAS builds misbehave set it so. On a 2-core
 *   Zen 5 oneDNN's AVX-512 kernels ran the GPT's shapes at 320-350 GFLOP/s against 160-180 for
 *   OpenBLAS's AVX2 ones, and the small configuration's fp32 step went from 116 to 72-74 ms.
 *   OpenBLAS's own AVX-512 kernels (250-300 GFLOP/s) keep the GEMMs otherwise: with backward's
 *   two run side by side, one thread each, as cpu.c does, they give as fast a step (71-77 ms).
 * A failure is sticky and reported by the backend's status once per step. It is not the rest of
 * the CPU backend (cpu.c), and the plain reference it is tested against is engine/ref/ref.c. */
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
#include "engine/engine.h"

/* ---- the machine ---------------------------------------------------------------------------- */

/* eng_cpu_settings_set's */
static const char *g_sgemm_setting;
static bool g_bf16_off;

void eng_cpu_settings_set(const char *sgemm, bool bf16)
{
    g_sgemm_setting = sgemm && *sgemm ? sgemm : NULL;
    g_bf16_off = !bf16;
}

/* AVX512-BF16: CPUID.(EAX=7,ECX=1):EAX bit 5. AMX-BF16: CPUID.(EAX=7,ECX=0):EDX bit 22. Both
 * need the OS to save the AVX-512 state (XCR0 bits 5-7, with OSXSAVE). The bf16 setting false
 * makes the machine look as if it had neither (to see the refusal on a machine that has them). */
static int bf16_available(kiln_err_t *err)
{
    unsigned a, b, c, d;
    bool avx512_bf16 = false, amx_bf16 = false, os_avx512 = false;
    if (__get_cpuid_count(1, 0, &a, &b, &c, &d) && (c & (1u << 27))) { /* OSXSAVE */
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        os_avx512 = (lo & 0xe6) == 0xe6;
    }
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) avx512_bf16 = a & (1u << 5);
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) amx_bf16 = d & (1u << 22);
    if (g_bf16_off) avx512_bf16 = amx_bf16 = false;
    if (os_avx512 && (avx512_bf16 || amx_bf16)) return KILN_OK;
    kiln_err_set(err, KILN_EUNSUPP, "distribution.mixed_precision",
                 "mixed_precision \"bf16\" needs bf16 compute, and this CPU has neither "
                 "AVX512-BF16 nor AMX-BF16%s", g_bf16_off ? " (KILN_CPU_BF16=0)" : "");
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

/* One matmul shape: dst (M,N) f32 = src (M,K) x wei (K,N) [+ bias (N) f32], src and weights
 * both bf16 or both fp32, with the
 * strides of each operand (row-major views and transposes of kiln's buffers), overwriting or
 * accumulating into dst. Primitives are made once per shape and kept. */
typedef struct mm_key { /* all long: keys are compared with memcmp, so no padding */
    long M, K, N;
    long ss[2], ws[2]; /* src and weight strides */
    long bias, accumulate;
    long f32;          /* src and weights in fp32 (else bf16) */
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
        snprintf(g_failmsg, sizeof(g_failmsg), "oneDNN matmul failed: %s (status %d)", what,
                 (int)st);
    }
}

static void fail(const char *what, dnnl_status_t st)
{
    pthread_mutex_lock(&g_mu);
    fail_locked(what, st);
    pthread_mutex_unlock(&g_mu);
}

int eng_cpu_onednn_status(kiln_err_t *err)
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
    dnnl_data_type_t in = k->f32 ? dnnl_f32 : dnnl_bf16;
    dnnl_memory_desc_init_by_strides(src, 2, ds, in, ss);
    dnnl_memory_desc_init_by_strides(wei, 2, dw, in, ws);
    dnnl_memory_desc_init_by_strides(dst, 2, dd, dnnl_f32, sd);
    dnnl_memory_desc_init_by_strides(bias, 2, db, dnnl_f32, sb);
}

/* Creates the engine and stream on first use; g_mu held. */
static dnnl_status_t engine_locked(const char **what)
{
    dnnl_status_t st = dnnl_success;
    if (!g_engine && (st = dnnl_engine_create(&g_engine, dnnl_cpu, 0)) != dnnl_success) {
        g_engine = NULL;
        *what = "creating the CPU engine";
        return st;
    }
    if (!g_stream && (st = dnnl_stream_create(&g_stream, g_engine, dnnl_stream_default_flags))) {
        g_stream = NULL;
        *what = "creating the stream";
    }
    return st;
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
    if ((st = engine_locked(&what)))
        goto fail;
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

static void run(const mm_key_t *k, const void *src, const void *wei, const float *bias, float *dst)
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

/* The GEMMs of a backward (either output may be NULL): dinp (N,C) = dout (N,OC) @ w (OC,C), and
 * dw (OC,C) += dout^T (OC,N) @ inp (N,C), dout^T read strided. (Copying dout^T row by row
 * first made the small configuration's step slower: 77-82 against 72-74 ms in fp32, 51-53
 * against 48-50 in bf16. Running the two side by side on one thread each, as cpu.c does with
 * OpenBLAS, did too: 87 against 81 ms in fp32.) f32: the operands are fp32, else bf16. */
static void backward_gemms(float *dinp, float *dw, const void *dout, const void *inp, const void *w, int N, int C,
                          int OC, int f32)
{
    if (dinp) {
        mm_key_t k = {N, OC, C, {OC, 1}, {C, 1}, 0, 0, f32};
        run(&k, dout, w, NULL, dinp);
    }
    if (dw) {
        mm_key_t k = {OC, N, C, {1, OC}, {C, 1}, 0, 1, f32};
        run(&k, dout, inp, NULL, dw);
    }
}

/* out (N,OC) = inp (N,C) @ w^T: src inp (M=N, K=C), weights w^T (K=C, N=OC) read from w (OC,C). */
static void bf16_matmul_forward(float *out, const uint16_t *inp, const uint16_t *w,
                                const float *bias, int N, int C, int OC)
{
    mm_key_t k = {N, C, OC, {C, 1}, {1, C}, bias != NULL, 0, 0};
    run(&k, inp, w, bias, out);
}

static void bf16_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                                 const uint16_t *dout_bf, const uint16_t *inp, const uint16_t *w,
                                 int N, int C, int OC)
{
    backward_gemms(dinp, dw, dout_bf, inp, w, N, C, OC, 0);
    if (dbias) eng_cpu_colsum_acc(dbias, dout, N, OC);
}

const eng_backend_bf16_t eng_cpu_bf16 = {
    .available = bf16_available,
    .from_f32 = bf16_from_f32,
    .matmul_forward = bf16_matmul_forward,
    .matmul_backward = bf16_matmul_backward,
    .adamw_update = eng_cpu_adamw_bf16,
};

/* ---- fp32 ----------------------------------------------------------------------------------- */

/* Whether fp32 GEMMs go through oneDNN: the sgemm setting (onednn|openblas) decides, else oneDNN
 * when OPENBLAS_CORETYPE holds OpenBLAS back (eng_cpu_coretype_holds_back) and oneDNN's fp32
 * matmul runs AVX-512 kernels here (asked of a primitive made for a GPT shape). */
static pthread_once_t g_sgemm_once = PTHREAD_ONCE_INIT;
static bool g_sgemm_onednn;
static char g_sgemm_impl[128] = "OpenBLAS";

static void sgemm_decide(void)
{
    const char *env = g_sgemm_setting;
    if (env && !strcmp(env, "openblas")) {
        snprintf(g_sgemm_impl, sizeof(g_sgemm_impl), "OpenBLAS (KILN_CPU_SGEMM)");
        return;
    }
    if (env && strcmp(env, "onednn")) /* kiln-train's table allows only the two */
        return;
    if (!env && !eng_cpu_coretype_holds_back())
        return;
    mm_key_t k = {256, 256, 256, {256, 1}, {1, 256}, 1, 0, 1};
    dnnl_memory_desc_t src, wei, bias, dst;
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    const char *impl = NULL, *what = "";
    descs(&k, &src, &wei, &bias, &dst);
    pthread_mutex_lock(&g_mu);
    dnnl_status_t st = engine_locked(&what);
    pthread_mutex_unlock(&g_mu);
    if (st == dnnl_success && dnnl_matmul_desc_init(&md, &src, &wei, &bias, &dst) == dnnl_success &&
        dnnl_primitive_desc_create(&pd, &md, NULL, g_engine, NULL) == dnnl_success &&
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl) {
        bool forced = env && !strcmp(env, "onednn");
        if (forced || !strncmp(impl, "brg:avx512", 10)) {
            g_sgemm_onednn = true;
            snprintf(g_sgemm_impl, sizeof(g_sgemm_impl), "oneDNN %s%s", impl, forced ? " (KILN_CPU_SGEMM)" : "");
        }
    } else if (env) {
        snprintf(g_sgemm_impl, sizeof(g_sgemm_impl),
                 "OpenBLAS (KILN_CPU_SGEMM=onednn, but oneDNN could not make an fp32 matmul here)");
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
}

bool eng_cpu_onednn_sgemm(const char **impl)
{
    pthread_once(&g_sgemm_once, sgemm_decide);
    if (impl) *impl = g_sgemm_impl;
    return g_sgemm_onednn;
}

const char *eng_cpu_sgemm_name(void)
{
    const char *impl;
    eng_cpu_onednn_sgemm(&impl);
    return impl;
}

void eng_cpu_onednn_sgemm_forward(float *out, const float *inp, const float *w, const float *bias, int N, int C,
                                  int OC)
{
    mm_key_t k = {N, C, OC, {C, 1}, {1, C}, bias != NULL, 0, 1};
    run(&k, inp, w, bias, out);
}

void eng_cpu_onednn_sgemm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                                   int N, int C, int OC)
{
    backward_gemms(dinp, dw, dout, inp, w, N, C, OC, 1);
}
