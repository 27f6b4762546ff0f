/* cuda.h - what libkiln_cuda.so exports besides the backend table `eng_cuda_backend`
 * (backend.h): the extension table `eng_cuda_ext` with the CUDA-only parts the fp32 op table
 * cannot express yet (sticky device errors, memory metrics, deterministic mode, bf16 activation
 * ops, flash attention, fused cross-entropy, on-device gradient norm/clipping and AdamW writing a
 * bf16 working copy), and the NCCL transport. Plain C, so the engine and tests reach it with
 * dlsym() and never link libcudart themselves. It is not a tensor library.
 *
 * Every pointer marked "device" is memory from eng_cuda_backend.alloc(); uint16_t buffers hold
 * bf16 bit patterns. All ops are queued on the backend's one stream, in call order. */
#ifndef KILN_ENGINE_CUDA_H
#define KILN_ENGINE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ENG_CUDA_EXT_ABI 1

typedef struct eng_cuda_mem {
    size_t tracked_bytes;      /* device bytes allocated through the backend right now */
    size_t tracked_peak_bytes; /* high-water mark of tracked_bytes since load / reset */
    size_t device_used_bytes;  /* cudaMemGetInfo: total - free (every process on the GPU) */
    size_t device_total_bytes;
} eng_cuda_mem_t;

typedef struct eng_cuda_ext {
    int abi; /* ENG_CUDA_EXT_ABI */

    /* ---- state --------------------------------------------------------------------------- */
    /* Returns 0, or KILN_EDEVICE with err (may be NULL) describing the FIRST CUDA/cuBLAS
     * failure since load or the last clearing call. clear != 0 forgets it. Synchronises the
     * stream first, so asynchronous kernel faults are caught. Thread-safe. */
    int (*status)(kiln_err_t *err, int clear);
    /* Why the backend is unusable ("cudaGetDeviceCount: ... (error 35)"), or "" when usable.
     * Static storage. */
    const char *(*unavailable_reason)(void);
    /* Device name (n bytes), ordinal, compute capability and SM count; 0 or KILN_EUNAVAIL. */
    int (*device_info)(char *name, size_t n, int *ordinal, int *cc_major, int *cc_minor,
                       int *sm_count);
    /* Deterministic mode (default on; env KILN_CUDA_DETERMINISTIC=0 turns it off): no
     * floating-point atomics anywhere, every reduction in a fixed order, so two runs give
     * bit-identical results. Off lets encoder_backward use atomics. */
    void (*set_deterministic)(int on);
    int (*deterministic)(void);
    /* How fp32 GEMMs use tensor cores: "bf16" (default; inputs rounded to bf16, fp32
     * accumulate), "tf32", or "fp32" (exact fp32). Env KILN_CUDA_MATMUL sets the default.
     * Returns 0 or KILN_EINVAL. */
    int (*set_matmul_mode)(const char *mode);
    /* Memory metrics for gpu_mem_mb / gpu_mem_peak_mb. */
    void (*mem_stats)(eng_cuda_mem_t *out);
    void (*mem_reset_peak)(void);

    /* ---- precision ------------------------------------------------------------------------ */
    /* dst (n) = round-to-nearest-even bf16 of src (n); and back. Device pointers. */
    void (*f32_to_bf16)(uint16_t *dst, const float *src, size_t n);
    void (*bf16_to_f32)(float *dst, const uint16_t *src, size_t n);

    /* ---- fused fp32 ops ------------------------------------------------------------------- */
    /* out (N,OC) = gelu(inp @ w^T + bias) in one cuBLASLt call (GELU epilogue); pre (N,OC)
     * receives the pre-activation for gelu_backward. bias (OC) may be NULL. */
    void (*matmul_forward_gelu)(float *out, float *pre, const float *inp, const float *w,
                                const float *bias, int N, int C, int OC);
    /* Flash-style causal attention: online softmax, no (T,T) matrix. qkv (B,T,3C), out (B,T,C),
     * lse (B,NH,T) the per-row log-sum-exp kept for backward. Head size C/NH must be 32, 64 or
     * 128 (other sizes fall back to the unfused path with internal scratch). */
    void (*attention_forward_flash)(float *out, float *lse, const float *qkv, int B, int T,
                                    int C, int NH);
    /* dqkv (B,T,3C) = (overwritten) gradient; scratch (B,NH,T) floats. Deterministic (dq and
     * dk/dv come from two kernels, no atomics). */
    void (*attention_backward_flash)(float *dqkv, float *scratch, const float *dout,
                                     const float *out, const float *lse, const float *qkv,
                                     int B, int T, int C, int NH);
    /* Softmax cross-entropy forward and backward in one pass over the logits: losses (N) =
     * -log softmax(logits)[target], dlogits (N,Vp) = (softmax - onehot) * dloss, padding 0.
     * dlogits may alias logits (the logits are then overwritten by their gradient). */
    void (*xent_fused)(float *dlogits, float *losses, const float *logits, const int32_t *targets,
                       float dloss, int N, int V, int Vp);

    /* ---- optimizer on device, no host round trip ------------------------------------------ */
    /* *acc (device double) += sum of x (n) squared, fixed-order reduction. */
    void (*sumsq_acc)(double *acc, const float *x, size_t n);
    /* From the accumulated sum of squares: *norm = sqrt(*sumsq); *scale = max_norm > 0 and
     * norm > max_norm ? max_norm / (norm + 1e-6) : 1. All three device pointers; norm may be
     * NULL. */
    void (*clip_scale)(float *scale, float *norm, const double *sumsq, float max_norm);
    /* AdamW as backend.h's adamw_update, but the gradient scale is read on device from
     * *grad_scale (NULL means 1), and param_bf16 (n, may be NULL) receives the bf16 working copy
     * of the updated fp32 master weights. */
    void (*adamw_update_dev)(float *param, uint16_t *param_bf16, const float *grad, float *m,
                             float *v, size_t n, float lr, float beta1, float beta2, float eps,
                             float wd, const float *grad_scale, int64_t t);

    /* ---- bf16 activations (fp32 statistics, fp32 parameter gradients) --------------------- */
    void (*encoder_forward_bf16)(uint16_t *out, const int32_t *inp, const uint16_t *wte,
                                 const uint16_t *wpe, int B, int T, int C);
    /* dwte (V,C) +=, dwpe (T,C) += (fp32 master gradients) */
    void (*encoder_backward_bf16)(float *dwte, float *dwpe, const uint16_t *dout,
                                  const int32_t *inp, int B, int T, int C);
    void (*layernorm_forward_bf16)(uint16_t *out, float *mean, float *rstd, const uint16_t *inp,
                                   const uint16_t *w, const uint16_t *b, int N, int C);
    /* dinp (N,C) += (bf16), dw, db (C) += (fp32) */
    void (*layernorm_backward_bf16)(uint16_t *dinp, float *dw, float *db, const uint16_t *dout,
                                    const uint16_t *inp, const uint16_t *w, const float *mean,
                                    const float *rstd, int N, int C);
    /* out (N,OC) = inp @ w^T + bias, pre (may be NULL) gets the pre-GELU value when gelu. */
    void (*matmul_forward_bf16)(uint16_t *out, uint16_t *pre, const uint16_t *inp,
                                const uint16_t *w, const uint16_t *bias, int gelu, int N, int C,
                                int OC);
    /* dinp (N,C) = dout @ w (bf16, skipped when NULL); dw (OC,C) += dout^T @ inp (fp32);
     * dbias (OC) += column sums (fp32, skipped when NULL). */
    void (*matmul_backward_bf16)(uint16_t *dinp, float *dw, float *dbias, const uint16_t *dout,
                                 const uint16_t *inp, const uint16_t *w, int N, int C, int OC);
    void (*gelu_forward_bf16)(uint16_t *out, const uint16_t *inp, size_t N);
    void (*gelu_backward_bf16)(uint16_t *dinp, const uint16_t *inp, const uint16_t *dout,
                               size_t N);
    void (*residual_forward_bf16)(uint16_t *out, const uint16_t *a, const uint16_t *b, size_t N);
    void (*attention_forward_flash_bf16)(uint16_t *out, float *lse, const uint16_t *qkv, int B,
                                         int T, int C, int NH);
    void (*attention_backward_flash_bf16)(uint16_t *dqkv, float *scratch, const uint16_t *dout,
                                          const uint16_t *out, const float *lse,
                                          const uint16_t *qkv, int B, int T, int C, int NH);
    void (*xent_fused_bf16)(uint16_t *dlogits, float *losses, const uint16_t *logits,
                            const int32_t *targets, float dloss, int N, int V, int Vp);

    /* Number of visible CUDA devices without choosing one (0 when none or no driver). */
    int (*device_count)(void);

    /* Unfused causal attention in bf16 on the tensor cores (cuBLAS batched GEMMs, softmax in
     * fp32): the table's attention_forward/backward with bf16 qkv (B,T,3C), out (B,T,C),
     * att and scratch (B,NH,T,T). Faster than the CUDA-core flash kernels at T = 1024 until
     * those use tensor cores; costs the (B,NH,T,T) memory. */
    void (*attention_forward_bf16)(uint16_t *out, uint16_t *att, const uint16_t *qkv, int B,
                                   int T, int C, int NH);
    void (*attention_backward_bf16)(uint16_t *dqkv, uint16_t *scratch, const uint16_t *dout,
                                    const uint16_t *qkv, const uint16_t *att, int B, int T, int C,
                                    int NH);
} eng_cuda_ext_t;

/* ---- NCCL: collectives on device memory (symbol `eng_cuda_nccl`) ----------------------------
 * One communicator per group of ranks, one GPU per rank (the GPU the backend chose). Operations
 * are queued on the communicator's own stream, behind everything already queued on the
 * backend's stream (a device-side event wait; the host never blocks), so gradient buckets can be
 * all-reduced while backward keeps running. The host transport (engine/comm, libfabric) carries
 * the bootstrap: rank 0's NCCL id is broadcast through the caller's function. A communicator is
 * used by one thread at a time; "queued so far" means what that moment's backend stream holds,
 * so call the operations from the thread that queues the backward (the grads-ready callback). */
typedef struct eng_nccl eng_nccl_t;

/* Copies len bytes of rank 0's buf into buf on every rank (comm_bcast does exactly this).
 * Returns 0 or a KILN_E* status with err filled. */
typedef int (*eng_nccl_bcast_fn)(void *ctx, void *buf, size_t len, kiln_err_t *err);

#define ENG_CUDA_NCCL_ABI 1

typedef struct eng_cuda_nccl {
    int abi; /* ENG_CUDA_NCCL_ABI */
    /* Collective over world ranks: joins the NCCL communicator. *out (OUT) is the caller's;
     * free with destroy(). Returns 0, KILN_EINVAL, KILN_EUNAVAIL (no GPU) or KILN_ECOMM with
     * NCCL's reason. */
    int (*create)(int rank, int world, eng_nccl_bcast_fn bcast, void *bctx, eng_nccl_t **out,
                  kiln_err_t *err);
    /* Waits for queued operations (bounded by 60 s, then aborts) and frees. Accepts NULL. */
    void (*destroy)(eng_nccl_t *c);
    /* ncclCommAbort: ends every queued and running operation (after a peer failed). destroy()
     * must still be called. */
    void (*abort)(eng_nccl_t *c);
    int (*rank)(const eng_nccl_t *c);
    int (*size)(const eng_nccl_t *c);

    /* Queue an operation and return at once; device buffers are borrowed until join()/wait().
     * Semantics as comm.h's host versions: allreduce in place (avg != 0 averages);
     * reduce_scatter in place, the shard of comm_shard_range(n, rank, size) ends up reduced;
     * allgather in place from each rank's shard; bcast len bytes from root; send/recv len bytes
     * to/from a peer (every send needs the matching recv on the peer, in the same order).
     * Return 0, KILN_EINVAL or KILN_ECOMM. */
    int (*allreduce)(eng_nccl_t *c, float *buf, size_t n, int avg, kiln_err_t *err);
    int (*reduce_scatter)(eng_nccl_t *c, float *buf, size_t n, int avg, kiln_err_t *err);
    int (*allgather)(eng_nccl_t *c, float *buf, size_t n, kiln_err_t *err);
    int (*bcast)(eng_nccl_t *c, void *buf, size_t len, int root, kiln_err_t *err);
    int (*send)(eng_nccl_t *c, const void *buf, size_t len, int peer, kiln_err_t *err);
    int (*recv)(eng_nccl_t *c, void *buf, size_t len, int peer, kiln_err_t *err);

    /* Makes the backend's stream wait, on the device, for every operation queued so far: ops
     * queued after join() see the results. The host does not block. Returns 0 or KILN_ECOMM. */
    int (*join)(eng_nccl_t *c, kiln_err_t *err);
    /* Blocks until every queued operation finished, watching NCCL's asynchronous error; a
     * failure or timeout_s (<= 0 means 300) aborts the communicator. Returns 0, KILN_ECOMM or
     * KILN_ETIMEDOUT. */
    int (*wait)(eng_nccl_t *c, double timeout_s, kiln_err_t *err);
} eng_cuda_nccl_t;

#ifdef __cplusplus
}
#endif

#endif /* KILN_ENGINE_CUDA_H */
