/* cuda_int.cuh - private header of the CUDA backend (engine/cuda/, built into libkiln_cuda.so):
 * the one process-wide device context (stream, cuBLAS/cuBLASLt handles, scratch, tracked
 * allocations, sticky error), the checking macros every CUDA/cuBLAS/NCCL call goes through, and
 * the kernel launchers shared between the files. Everything the engine sees goes through the
 * backend table (engine/backend.h) that cuda_backend.cu exports. Nothing outside engine/cuda/
 * includes it. */
#ifndef KILN_ENGINE_CUDA_INT_CUH
#define KILN_ENGINE_CUDA_INT_CUH

#include <cstddef>
#include <cstdint>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "engine/backend.h"
}

typedef __nv_bfloat16 bf16;

/* ---- errors ------------------------------------------------------------------------------------
 * Ops in backend.h return void, so a failure is recorded as the backend's sticky error (the first
 * one wins; it is logged once) and reported by the table's status(). After a failure the ops keep
 * running but their results are meaningless; the trainer checks status once per step. */
void kc_fail(int status, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define KC_CUDA(call)                                                                          \
    do {                                                                                       \
        cudaError_t kc_e_ = (call);                                                            \
        if (kc_e_ != cudaSuccess)                                                              \
            kc_fail(KILN_EDEVICE, __FILE__, __LINE__, "%s failed: %s (%s)", #call,            \
                    cudaGetErrorString(kc_e_), cudaGetErrorName(kc_e_));                       \
    } while (0)

/* After every kernel launch: launch-configuration errors surface here, asynchronous faults at
 * the next synchronising call (also checked). */
#define KC_LAUNCHED(name)                                                                      \
    do {                                                                                       \
        cudaError_t kc_e_ = cudaGetLastError();                                                \
        if (kc_e_ != cudaSuccess)                                                              \
            kc_fail(KILN_EDEVICE, __FILE__, __LINE__, "kernel %s failed to launch: %s", name,  \
                    cudaGetErrorString(kc_e_));                                                \
    } while (0)

#define KC_CUBLAS(call)                                                                        \
    do {                                                                                       \
        cublasStatus_t kc_s_ = (call);                                                         \
        if (kc_s_ != CUBLAS_STATUS_SUCCESS)                                                    \
            kc_fail(KILN_EDEVICE, __FILE__, __LINE__, "%s failed: %s (%s)", #call,            \
                    cublasGetStatusString(kc_s_), cublasGetStatusName(kc_s_));                 \
    } while (0)

/* Integer-valued launch helpers. */
static inline unsigned kc_blocks(size_t n, unsigned per)
{
    size_t b = (n + per - 1) / per;
    if (b == 0) b = 1;
    if (b > 0x7fffffffu) b = 0x7fffffffu; /* grid-stride loops cover the rest */
    return (unsigned)b;
}

/* ---- the device context ------------------------------------------------------------------------ */
typedef enum { KC_MM_FP32 = 0, KC_MM_TF32 = 1 } kc_mm_mode_t;

typedef struct kc_ctx {
    int ready;                 /* 1 once kc_init() succeeded */
    int device;                /* CUDA device ordinal in use */
    int sm_count;
    int cc_major, cc_minor;
    cudaStream_t stream;       /* every op runs on it, in order */
    cublasHandle_t cublas;
    cublasLtHandle_t lt;
    void *lt_ws;               /* cuBLASLt workspace */
    size_t lt_ws_bytes;
    void *scratch;             /* grow-only op scratch (sorting, partial sums, permutes) */
    size_t scratch_bytes;
    int deterministic;         /* 1: no atomics in reductions, fixed orders (default; env
                                * KILN_CUDA_DETERMINISTIC=0 lets the embedding backward use atomics) */
    kc_mm_mode_t mm_mode;      /* fp32 GEMMs: exact fp32 (default), or TF32 tensor cores with
                                * env KILN_CUDA_MATMUL=tf32 */
    int use_lt;                /* 0: cublasGemmEx only (env KILN_CUDA_NO_LT=1, for comparison) */
} kc_ctx_t;

/* The context; kc_ctx() initialises it on first use (thread-safe) and returns NULL when no
 * usable device exists (the reason is kept for kc_unavailable_reason()). */
kc_ctx_t *kc_ctx(void);
/* Scratch of at least bytes on the context's stream (contents undefined). The pointer is valid
 * until the next kc_scratch() call; growing synchronises the stream first. NULL on failure
 * (recorded as the sticky error). */
void *kc_scratch(size_t bytes);
/* Tracked device allocation (zeroed) / release; the tracked totals feed mem_stats. */
void *kc_malloc(size_t bytes);
void kc_mfree(void *p);

/* ---- element conversions used by every templated kernel ---------------------------------------- */
__device__ __forceinline__ float kc_f(float x) { return x; }
__device__ __forceinline__ float kc_f(bf16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T kc_to(float x);
template <> __device__ __forceinline__ float kc_to<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 kc_to<bf16>(float x) { return __float2bfloat16_rn(x); }

/* ---- GEMM (cuda_gemm.cu) ---------------------------------------------------------------------
 * Column-major cuBLAS convention: D (m,n) = alpha * op(A) (m,k) @ op(B) (k,n) + beta * D, with an
 * optional epilogue: bias (m) added per row of D (fp32 when D is fp32, else D's type), then GELU
 * (tanh) when gelu is set; gelu_pre (same layout as D) receives the pre-activation when given.
 * Element types: A, B either both fp32 or both bf16; D fp32 or bf16. fp32 inputs use the
 * context's mm_mode (exact fp32 by default). Tries cuBLASLt first and falls back to
 * cublasGemmEx (bias/GELU then applied by a separate kernel). Errors become the sticky error. */
typedef struct kc_gemm_args {
    bool ta, tb;                /* transpose A / B */
    int m, n, k;
    const void *A; int lda;
    const void *B; int ldb;
    void *D; int ldd;
    cudaDataType_t ab_type;     /* CUDA_R_32F or CUDA_R_16BF */
    cudaDataType_t d_type;      /* CUDA_R_32F or CUDA_R_16BF */
    float alpha, beta;
    const void *bias;           /* may be NULL */
    bool gelu;
    void *gelu_pre;             /* may be NULL */
} kc_gemm_args_t;
void kc_gemm(const kc_gemm_args_t *g);

/* Strided-batched plain GEMM (attention): fp32 or bf16 A/B/C, fp32 accumulate. */
void kc_gemm_batched(bool ta, bool tb, int m, int n, int k, float alpha, const void *A, int lda,
                     long long sA, const void *B, int ldb, long long sB, float beta, void *C,
                     int ldc, long long sC, int batch, cudaDataType_t type);

/* ---- launchers (cuda_kernels.cu, cuda_attention.cu): shapes and semantics as in backend.h;
 * T is the storage type (float; the templates also read bf16), math is fp32. All queue work on
 * the context's stream and record failures as the sticky error. ------------------------------ */
void kc_f32_to_bf16(bf16 *dst, const float *src, size_t n);
template <typename T>
void kc_encoder_forward(T *out, const int32_t *inp, const T *wte, const T *wpe, int B, int T_, int C);
template <typename T>
void kc_encoder_backward(float *dwte, float *dwpe, const T *dout, const int32_t *inp, int B,
                         int T_, int C);
template <typename T>
void kc_layernorm_forward(T *out, float *mean, float *rstd, const T *inp, const T *w, const T *b,
                          int N, int C);
template <typename T>
void kc_layernorm_backward(T *dinp, float *dw, float *db, const T *dout, const T *inp, const T *w,
                           const float *mean, const float *rstd, int N, int C);
/* dst (cols) += column sums of src (rows, cols); fixed-order two-stage reduction. */
template <typename T> void kc_colsum_add(float *dst, const T *src, int rows, int cols);
template <typename T> void kc_gelu_forward(T *out, const T *inp, size_t n);
template <typename T> void kc_gelu_backward(T *dinp, const T *inp, const T *dout, size_t n);
template <typename T> void kc_residual_forward(T *out, const T *a, const T *b, size_t n);
void kc_relu_forward(float *out, const float *inp, size_t n);
void kc_relu_backward(float *dinp, const float *inp, const float *dout, size_t n);
void kc_scale(float *x, float s, size_t n);
void kc_xent_forward(float *probs, float *losses, const float *logits, const int32_t *targets,
                     int N, int V, int Vp);
void kc_xent_backward(float *dlogits, const float *probs, const int32_t *targets, float dloss,
                      int N, int V, int Vp);
/* AdamW; param_bf16 (may be NULL) receives the updated weights rounded to bf16. */
void kc_adamw(float *param, bf16 *param_bf16, const float *grad, float *m, float *v, size_t n,
              float lr, float beta1, float beta2, float eps, float wd, float grad_scale, int64_t t);
double kc_sumsq(const float *x, size_t n);
/* Unfused attention (cuBLAS batched GEMMs + softmax kernel): saves att (B,NH,T,T) in S. */
template <typename S>
void kc_attention_forward_unfused(S *out, S *att, const S *qkv, int B, int T, int C, int NH);
template <typename S>
void kc_attention_backward_unfused(S *dqkv, S *scratch, const S *dout, const S *qkv, const S *att,
                                   int B, int T, int C, int NH);

/* State reported through the table (cuda_common.cu). */
const char *kc_unavailable_reason(void);
/* 0 or the first failure since load (sticky), after waiting for queued work. */
int kc_status(kiln_err_t *err);
void kc_mem_stats(eng_backend_mem_t *out);

/* NCCL communicators: the table's device collectives (cuda_nccl.cu). */
extern const eng_backend_coll_t kc_nccl;

#endif /* KILN_ENGINE_CUDA_INT_CUH */
