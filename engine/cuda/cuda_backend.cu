/* cuda_backend.cu - the exported face of libkiln_cuda.so: `eng_cuda_backend`, backend.h's table
 * for the GPU (its state, the fp32 ops, the bf16 GEMM group for mixed precision, the fused
 * GEMM + GELU, NCCL as the device collectives), and `eng_cuda_available()` /
 * `eng_cuda_unavailable_reason()` for the loader. It only adapts shapes and argument orders; the
 * kernels live in the other files. The engine reaches it through dlopen/dlsym, never by linking.
 * Threads: any thread may call the ops (each selects the device on first use), but not two at
 * once: the ops share one stream, one scratch buffer and one cuBLAS handle. */
#include <cstdio>
#include <cstring>

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
                        int N, int C, int OC, cudaDataType_t ab, cudaDataType_t dinp_type)
{
    kc_gemm_args_t g;
    if (dinp) {
        memset(&g, 0, sizeof(g));
        g.ta = false; g.tb = false;
        g.m = C; g.n = N; g.k = OC;
        g.A = w; g.lda = C;
        g.B = dout; g.ldb = OC;
        g.D = dinp; g.ldd = C;
        g.ab_type = ab; g.d_type = dinp_type;
        g.alpha = 1.0f; g.beta = 0.0f;
        kc_gemm(&g);
    }
    if (!dw)
        return;
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
    mm_backward(dinp, dw, dout, inp, w, N, C, OC, CUDA_R_32F, CUDA_R_32F);
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
    kc_adamw(param, NULL, grad, m, v, n, lr, beta1, beta2, eps, wd, grad_scale, t);
}
static double cu_sumsq(const float *x, size_t n) { return kc_sumsq(x, n); }
static void cu_scale(float *x, float s, size_t n) { kc_scale(x, s, n); }

/* ---- state ------------------------------------------------------------------------------------------ */
static int cu_status(void *ctx, kiln_err_t *err)
{
    (void)ctx;
    return kc_status(err);
}
static void cu_mem_stats(void *ctx, eng_backend_mem_t *out)
{
    (void)ctx;
    kc_mem_stats(out);
}

/* ---- bf16 GEMMs (mixed precision) ----------------------------------------------------------------- */
/* Tensor cores need compute capability 8.0 (A100) or newer for bf16. */
static int bf16_available(kiln_err_t *err)
{
    kc_ctx_t *c = kc_ctx();
    if (c && c->cc_major >= 8) return 0;
    if (err) {
        memset(err, 0, sizeof(*err));
        err->status = KILN_EUNSUPP;
        snprintf(err->field, sizeof(err->field), "distribution.mixed_precision");
        if (c)
            snprintf(err->message, sizeof(err->message),
                     "mixed_precision \"bf16\" needs a GPU of compute capability 8.0 or newer; "
                     "this one is %d.%d", c->cc_major, c->cc_minor);
        else
            snprintf(err->message, sizeof(err->message), "no usable CUDA device: %.200s",
                     kc_unavailable_reason());
    }
    return KILN_EUNSUPP;
}
static void bf16_from_f32(uint16_t *dst, const float *src, size_t n) { kc_f32_to_bf16((bf16 *)dst, src, n); }
static void bf16_matmul_forward(float *out, const uint16_t *inp, const uint16_t *w, const float *bias,
                                int N, int C, int OC)
{
    mm_forward(inp, w, bias, out, NULL, false, N, C, OC, CUDA_R_16BF, CUDA_R_32F);
}
static void bf16_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                                 const uint16_t *dout_bf, const uint16_t *inp, const uint16_t *w,
                                 int N, int C, int OC)
{
    mm_backward(dinp, dw, dout_bf, inp, w, N, C, OC, CUDA_R_16BF, CUDA_R_32F);
    if (dbias) kc_colsum_add<float>(dbias, dout, N, OC);
}
static void bf16_adamw_update(float *param, uint16_t *param_bf16, const float *grad, float *m, float *v,
                              size_t n, float lr, float beta1, float beta2, float eps, float wd,
                              float grad_scale, int64_t t)
{
    kc_adamw(param, (bf16 *)param_bf16, grad, m, v, n, lr, beta1, beta2, eps, wd, grad_scale, t);
}
static const eng_backend_bf16_t g_bf16 = {
    bf16_available, bf16_from_f32, bf16_matmul_forward, bf16_matmul_backward, bf16_adamw_update,
};

/* ---- fused ops ------------------------------------------------------------------------------------- */
static void cu_matmul_forward_gelu(float *out, float *pre, const float *inp, const float *w,
                                   const float *bias, int N, int C, int OC)
{
    mm_forward(inp, w, bias, out, pre, true, N, C, OC, CUDA_R_32F, CUDA_R_32F);
}
static const eng_backend_fused_t g_fused = {cu_matmul_forward_gelu};

/* Filled field by field (not with designated initialisers, which C++ requires in declaration
 * order) so the table stays right whatever order backend.h declares its members in. Runs when
 * the library is loaded. */
static eng_backend_t make_backend(void)
{
    eng_backend_t t;
    memset(&t, 0, sizeof(t));
    t.abi = ENG_BACKEND_ABI;
    t.name = "cuda";
    t.host_memory = false;
    t.status = cu_status;
    t.mem_stats = cu_mem_stats;
    t.bf16 = &g_bf16;
    t.fused = &g_fused;
    t.coll = &kc_nccl;
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

/* ---- exports ---------------------------------------------------------------------------------------- */
extern "C" {
/* backend.h's table on the GPU. Loaded by eng_backend_get("cuda"). */
__attribute__((visibility("default"))) eng_backend_t eng_cuda_backend = make_backend();

/* 1 when a usable GPU is present (first call initialises the device context; thread-safe). */
__attribute__((visibility("default"))) int eng_cuda_available(void) { return kc_ctx() != NULL; }

/* Why the backend is unusable, or "" (static storage). */
__attribute__((visibility("default"))) const char *eng_cuda_unavailable_reason(void)
{
    return kc_unavailable_reason();
}
}
