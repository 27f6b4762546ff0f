/* cuda_backend.cu - the exported face of libkiln_cuda.so: `eng_cuda_backend`, backend.h's table
 * of ops on the GPU (fp32 storage as the table demands, GEMMs on bf16 tensor cores by default),
 * `eng_cuda_available()` for the loader, and `eng_cuda_ext` (cuda.h) with what the table cannot
 * express yet. It only adapts shapes and argument orders; the kernels live in the other files.
 * The engine reaches all of this through dlopen/dlsym, never by linking.
 * Threads: any thread may call the ops (each selects the device on first use), but not two at
 * once: the ops share one stream, one scratch buffer and one cuBLAS handle. */
#include <cstdio>
#include <cstring>

extern "C" {
#include "engine/backend.h"
}
#include "engine/cuda/cuda_int.cuh"

/* ---- memory ------------------------------------------------------------------------------------ */
static void *cu_alloc(size_t bytes) { return kc_malloc(bytes); }
static void cu_free(void *p) { kc_mfree(p); }

static void cu_memset_zero(void *dst, size_t bytes)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || bytes == 0) return;
    KC_CUDA(cudaMemsetAsync(dst, 0, bytes, c->stream));
}

/* Host copies synchronise: the caller may reuse or free its host buffer right after. */
static void cu_to_device(void *dst, const void *src, size_t bytes)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || bytes == 0) return;
    KC_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
    KC_CUDA(cudaStreamSynchronize(c->stream));
}

static void cu_to_host(void *dst, const void *src, size_t bytes)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || bytes == 0) return;
    KC_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    KC_CUDA(cudaStreamSynchronize(c->stream));
}

static void cu_copy(void *dst, const void *src, size_t bytes)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || bytes == 0 || dst == src) return;
    KC_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
}

static void cu_synchronize(void)
{
    kc_ctx_t *c = kc_ctx();
    if (!c) return;
    KC_CUDA(cudaStreamSynchronize(c->stream));
}

/* ---- ops ------------------------------------------------------------------------------------------ */
static void cu_encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe,
                               int B, int T, int C)
{
    kc_encoder_forward<float>(out, inp, wte, wpe, B, T, C);
}
static void cu_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp,
                                int B, int T, int C)
{
    kc_encoder_backward<float>(dwte, dwpe, dout, inp, B, T, C);
}
static void cu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                 const float *w, const float *b, int N, int C)
{
    kc_layernorm_forward<float>(out, mean, rstd, inp, w, b, N, C);
}
static void cu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                  const float *inp, const float *w, const float *mean,
                                  const float *rstd, int N, int C)
{
    kc_layernorm_backward<float>(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

/* Row-major out (N,OC) = inp (N,C) @ w^T is column-major out^T = w^T' @ inp^T': with cuBLAS's
 * column-major view of the row-major buffers, D (OC,N) = op_T(w as (C,OC)) @ inp as (C,N). */
static void mm_forward(const void *inp, const void *w, const void *bias, void *out, void *pre,
                       bool gelu, int N, int C, int OC, cudaDataType_t ab, cudaDataType_t d)
{
    kc_gemm_args_t g;
    memset(&g, 0, sizeof(g));
    g.ta = true; g.tb = false;
    g.m = OC; g.n = N; g.k = C;
    g.A = w; g.lda = C;
    g.B = inp; g.ldb = C;
    g.D = out; g.ldd = OC;
    g.ab_type = ab; g.d_type = d;
    g.alpha = 1.0f; g.beta = 0.0f;
    g.bias = bias; g.gelu = gelu; g.gelu_pre = pre;
    kc_gemm(&g);
}

/* dinp (N,C) = dout (N,OC) @ w (OC,C): column-major D (C,N) = w as (C,OC) @ dout as (OC,N).
 * dw (OC,C) += dout^T @ inp: column-major D (C,OC) = inp as (C,N) @ op_T(dout as (OC,N)). */
static void mm_backward(void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                        int N, int C, int OC, cudaDataType_t ab)
{
    kc_gemm_args_t g;
    if (dinp) {
        memset(&g, 0, sizeof(g));
        g.ta = false; g.tb = false;
        g.m = C; g.n = N; g.k = OC;
        g.A = w; g.lda = C;
        g.B = dout; g.ldb = OC;
        g.D = dinp; g.ldd = C;
        g.ab_type = ab; g.d_type = ab;
        g.alpha = 1.0f; g.beta = 0.0f;
        kc_gemm(&g);
    }
    memset(&g, 0, sizeof(g));
    g.ta = false; g.tb = true;
    g.m = C; g.n = OC; g.k = N;
    g.A = inp; g.lda = C;
    g.B = dout; g.ldb = OC;
    g.D = dw; g.ldd = C;
    g.ab_type = ab; g.d_type = CUDA_R_32F; /* parameter gradients stay fp32 */
    g.alpha = 1.0f; g.beta = 1.0f;
    kc_gemm(&g);
}

static void cu_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                              int N, int C, int OC)
{
    mm_forward(inp, w, bias, out, NULL, false, N, C, OC, CUDA_R_32F, CUDA_R_32F);
}
static void cu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                               const float *inp, const float *w, int N, int C, int OC)
{
    mm_backward(dinp, dw, dout, inp, w, N, C, OC, CUDA_R_32F);
    if (dbias) kc_colsum_add<float>(dbias, dout, N, OC);
}

static void cu_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                                 int NH)
{
    kc_attention_forward_unfused<float>(out, att, qkv, B, T, C, NH);
}
static void cu_attention_backward(float *dqkv, float *scratch, const float *dout,
                                  const float *qkv, const float *att, int B, int T, int C, int NH)
{
    kc_attention_backward_unfused<float>(dqkv, scratch, dout, qkv, att, B, T, C, NH);
}

static void cu_gelu_forward(float *out, const float *inp, size_t N) { kc_gelu_forward<float>(out, inp, N); }
static void cu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t N)
{
    kc_gelu_backward<float>(dinp, inp, dout, N);
}
static void cu_relu_forward(float *out, const float *inp, size_t N) { kc_relu_forward(out, inp, N); }
static void cu_relu_backward(float *dinp, const float *inp, const float *dout, size_t N)
{
    kc_relu_backward(dinp, inp, dout, N);
}
static void cu_residual_forward(float *out, const float *a, const float *b, size_t N)
{
    kc_residual_forward<float>(out, a, b, N);
}
static void cu_xent_forward(float *probs, float *losses, const float *logits,
                            const int32_t *targets, int N, int V, int Vp)
{
    kc_xent_forward(probs, losses, logits, targets, N, V, Vp);
}
static void cu_xent_backward(float *dlogits, const float *probs, const int32_t *targets,
                             float dloss, int N, int V, int Vp)
{
    kc_xent_backward(dlogits, probs, targets, dloss, N, V, Vp);
}
static void cu_adamw_update(float *param, const float *grad, float *m, float *v, size_t n,
                            float lr, float beta1, float beta2, float eps, float wd,
                            float grad_scale, int64_t t)
{
    kc_adamw(param, NULL, grad, m, v, n, lr, beta1, beta2, eps, wd, grad_scale, NULL, t);
}
static double cu_sumsq(const float *x, size_t n) { return kc_sumsq(x, n); }
static void cu_scale(float *x, float s, size_t n) { kc_scale(x, s, n); }

/* Filled field by field (not with designated initialisers) so the table stays right whatever
 * order backend.h declares its members in. Runs when the library is loaded. */
static eng_backend_t make_backend(void)
{
    eng_backend_t t;
    memset(&t, 0, sizeof(t));
    t.name = "cuda";
    t.alloc = cu_alloc;
    t.free = cu_free;
    t.memset_zero = cu_memset_zero;
    t.to_device = cu_to_device;
    t.to_host = cu_to_host;
    t.copy = cu_copy;
    t.synchronize = cu_synchronize;
    t.encoder_forward = cu_encoder_forward;
    t.encoder_backward = cu_encoder_backward;
    t.layernorm_forward = cu_layernorm_forward;
    t.layernorm_backward = cu_layernorm_backward;
    t.matmul_forward = cu_matmul_forward;
    t.matmul_backward = cu_matmul_backward;
    t.attention_forward = cu_attention_forward;
    t.attention_backward = cu_attention_backward;
    t.gelu_forward = cu_gelu_forward;
    t.gelu_backward = cu_gelu_backward;
    t.relu_forward = cu_relu_forward;
    t.relu_backward = cu_relu_backward;
    t.residual_forward = cu_residual_forward;
    t.xent_forward = cu_xent_forward;
    t.xent_backward = cu_xent_backward;
    t.adamw_update = cu_adamw_update;
    t.sumsq = cu_sumsq;
    t.scale = cu_scale;
    return t;
}

/* ---- extension table ------------------------------------------------------------------------------ */
static const char *x_unavailable_reason(void) { return kc_unavailable_reason(); }
static void x_set_deterministic(int on)
{
    kc_ctx_t *c = kc_ctx();
    if (c) c->deterministic = on != 0;
}
static int x_deterministic(void)
{
    kc_ctx_t *c = kc_ctx();
    return c ? c->deterministic : 1;
}
static int x_set_matmul_mode(const char *mode)
{
    kc_ctx_t *c = kc_ctx();
    if (!c) return KILN_EUNAVAIL;
    if (!mode) return KILN_EINVAL;
    if (strcmp(mode, "bf16") == 0) c->mm_mode = KC_MM_BF16;
    else if (strcmp(mode, "tf32") == 0) c->mm_mode = KC_MM_TF32;
    else if (strcmp(mode, "fp32") == 0) c->mm_mode = KC_MM_FP32;
    else return KILN_EINVAL;
    return 0;
}
static void x_f32_to_bf16(uint16_t *dst, const float *src, size_t n) { kc_f32_to_bf16((bf16 *)dst, src, n); }
static void x_bf16_to_f32(float *dst, const uint16_t *src, size_t n) { kc_bf16_to_f32(dst, (const bf16 *)src, n); }

static void x_matmul_forward_gelu(float *out, float *pre, const float *inp, const float *w,
                                  const float *bias, int N, int C, int OC)
{
    mm_forward(inp, w, bias, out, pre, true, N, C, OC, CUDA_R_32F, CUDA_R_32F);
}
static void x_attention_forward_flash(float *out, float *lse, const float *qkv, int B, int T,
                                      int C, int NH)
{
    kc_attention_forward_flash<float>(out, lse, qkv, B, T, C, NH);
}
static void x_attention_backward_flash(float *dqkv, float *scratch, const float *dout,
                                       const float *out, const float *lse, const float *qkv,
                                       int B, int T, int C, int NH)
{
    kc_attention_backward_flash<float>(dqkv, scratch, dout, out, lse, qkv, B, T, C, NH);
}
static void x_xent_fused(float *dlogits, float *losses, const float *logits,
                         const int32_t *targets, float dloss, int N, int V, int Vp)
{
    kc_xent_fused<float>(dlogits, losses, logits, targets, dloss, N, V, Vp);
}
static void x_sumsq_acc(double *acc, const float *x, size_t n) { kc_sumsq_dev(acc, x, n, 1); }
static void x_clip_scale(float *scale, float *norm, const double *sumsq, float max_norm)
{
    kc_clip_scale(scale, norm, sumsq, max_norm);
}
static void x_adamw_update_dev(float *param, uint16_t *param_bf16, const float *grad, float *m,
                               float *v, size_t n, float lr, float beta1, float beta2, float eps,
                               float wd, const float *grad_scale, int64_t t)
{
    kc_adamw(param, (bf16 *)param_bf16, grad, m, v, n, lr, beta1, beta2, eps, wd, 1.0f,
             grad_scale, t);
}

#define BF(p) ((bf16 *)(p))
#define CBF(p) ((const bf16 *)(p))
static void x_encoder_forward_bf16(uint16_t *out, const int32_t *inp, const uint16_t *wte,
                                   const uint16_t *wpe, int B, int T, int C)
{
    kc_encoder_forward<bf16>(BF(out), inp, CBF(wte), CBF(wpe), B, T, C);
}
static void x_encoder_backward_bf16(float *dwte, float *dwpe, const uint16_t *dout,
                                    const int32_t *inp, int B, int T, int C)
{
    kc_encoder_backward<bf16>(dwte, dwpe, CBF(dout), inp, B, T, C);
}
static void x_layernorm_forward_bf16(uint16_t *out, float *mean, float *rstd, const uint16_t *inp,
                                     const uint16_t *w, const uint16_t *b, int N, int C)
{
    kc_layernorm_forward<bf16>(BF(out), mean, rstd, CBF(inp), CBF(w), CBF(b), N, C);
}
static void x_layernorm_backward_bf16(uint16_t *dinp, float *dw, float *db, const uint16_t *dout,
                                      const uint16_t *inp, const uint16_t *w, const float *mean,
                                      const float *rstd, int N, int C)
{
    kc_layernorm_backward<bf16>(BF(dinp), dw, db, CBF(dout), CBF(inp), CBF(w), mean, rstd, N, C);
}
static void x_matmul_forward_bf16(uint16_t *out, uint16_t *pre, const uint16_t *inp,
                                  const uint16_t *w, const uint16_t *bias, int gelu, int N, int C,
                                  int OC)
{
    mm_forward(inp, w, bias, out, gelu ? pre : NULL, gelu != 0, N, C, OC, CUDA_R_16BF,
               CUDA_R_16BF);
}
static void x_matmul_backward_bf16(uint16_t *dinp, float *dw, float *dbias, const uint16_t *dout,
                                   const uint16_t *inp, const uint16_t *w, int N, int C, int OC)
{
    mm_backward(dinp, dw, dout, inp, w, N, C, OC, CUDA_R_16BF);
    if (dbias) kc_colsum_add<bf16>(dbias, CBF(dout), N, OC);
}
static void x_gelu_forward_bf16(uint16_t *out, const uint16_t *inp, size_t N)
{
    kc_gelu_forward<bf16>(BF(out), CBF(inp), N);
}
static void x_gelu_backward_bf16(uint16_t *dinp, const uint16_t *inp, const uint16_t *dout, size_t N)
{
    kc_gelu_backward<bf16>(BF(dinp), CBF(inp), CBF(dout), N);
}
static void x_residual_forward_bf16(uint16_t *out, const uint16_t *a, const uint16_t *b, size_t N)
{
    kc_residual_forward<bf16>(BF(out), CBF(a), CBF(b), N);
}
static void x_attention_forward_flash_bf16(uint16_t *out, float *lse, const uint16_t *qkv, int B,
                                           int T, int C, int NH)
{
    kc_attention_forward_flash<bf16>(BF(out), lse, CBF(qkv), B, T, C, NH);
}
static void x_attention_backward_flash_bf16(uint16_t *dqkv, float *scratch, const uint16_t *dout,
                                            const uint16_t *out, const float *lse,
                                            const uint16_t *qkv, int B, int T, int C, int NH)
{
    kc_attention_backward_flash<bf16>(BF(dqkv), scratch, CBF(dout), CBF(out), lse, CBF(qkv), B, T,
                                      C, NH);
}
static void x_xent_fused_bf16(uint16_t *dlogits, float *losses, const uint16_t *logits,
                              const int32_t *targets, float dloss, int N, int V, int Vp)
{
    kc_xent_fused<bf16>(BF(dlogits), losses, CBF(logits), targets, dloss, N, V, Vp);
}

static void x_attention_forward_bf16(uint16_t *out, uint16_t *att, const uint16_t *qkv, int B,
                                     int T, int C, int NH)
{
    kc_attention_forward_unfused<bf16>(BF(out), BF(att), CBF(qkv), B, T, C, NH);
}
static void x_attention_backward_bf16(uint16_t *dqkv, uint16_t *scratch, const uint16_t *dout,
                                      const uint16_t *qkv, const uint16_t *att, int B, int T,
                                      int C, int NH)
{
    kc_attention_backward_unfused<bf16>(BF(dqkv), BF(scratch), CBF(dout), CBF(qkv), CBF(att), B,
                                        T, C, NH);
}

static int x_device_count(void)
{
    int n = 0; /* left untouched when the call fails (no driver) */
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

static eng_cuda_ext_t make_ext(void)
{
    eng_cuda_ext_t x;
    memset(&x, 0, sizeof(x));
    x.abi = ENG_CUDA_EXT_ABI;
    x.status = kc_status;
    x.unavailable_reason = x_unavailable_reason;
    x.device_info = kc_device_info;
    x.set_deterministic = x_set_deterministic;
    x.deterministic = x_deterministic;
    x.set_matmul_mode = x_set_matmul_mode;
    x.mem_stats = kc_mem_stats;
    x.mem_reset_peak = kc_mem_reset_peak;
    x.f32_to_bf16 = x_f32_to_bf16;
    x.bf16_to_f32 = x_bf16_to_f32;
    x.matmul_forward_gelu = x_matmul_forward_gelu;
    x.attention_forward_flash = x_attention_forward_flash;
    x.attention_backward_flash = x_attention_backward_flash;
    x.xent_fused = x_xent_fused;
    x.sumsq_acc = x_sumsq_acc;
    x.clip_scale = x_clip_scale;
    x.adamw_update_dev = x_adamw_update_dev;
    x.encoder_forward_bf16 = x_encoder_forward_bf16;
    x.encoder_backward_bf16 = x_encoder_backward_bf16;
    x.layernorm_forward_bf16 = x_layernorm_forward_bf16;
    x.layernorm_backward_bf16 = x_layernorm_backward_bf16;
    x.matmul_forward_bf16 = x_matmul_forward_bf16;
    x.matmul_backward_bf16 = x_matmul_backward_bf16;
    x.gelu_forward_bf16 = x_gelu_forward_bf16;
    x.gelu_backward_bf16 = x_gelu_backward_bf16;
    x.residual_forward_bf16 = x_residual_forward_bf16;
    x.attention_forward_flash_bf16 = x_attention_forward_flash_bf16;
    x.attention_backward_flash_bf16 = x_attention_backward_flash_bf16;
    x.xent_fused_bf16 = x_xent_fused_bf16;
    x.device_count = x_device_count;
    x.attention_forward_bf16 = x_attention_forward_bf16;
    x.attention_backward_bf16 = x_attention_backward_bf16;
    return x;
}

/* ---- exports ---------------------------------------------------------------------------------------- */
extern "C" {
/* backend.h's table on the GPU. Loaded by eng_backend_get("cuda"). */
__attribute__((visibility("default"))) eng_backend_t eng_cuda_backend = make_backend();
/* The extension table (cuda.h). */
__attribute__((visibility("default"))) eng_cuda_ext_t eng_cuda_ext = make_ext();

/* 1 when a usable GPU is present (first call initialises the device context; thread-safe). */
__attribute__((visibility("default"))) int eng_cuda_available(void) { return kc_ctx() != NULL; }

/* Why the backend is unusable, or "" (static storage). */
__attribute__((visibility("default"))) const char *eng_cuda_unavailable_reason(void)
{
    return kc_unavailable_reason();
}
}
