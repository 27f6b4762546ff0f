/* backend.h - the engine's table of ops: one struct of function pointers per device backend (the
 * CPU, the plain reference, and CUDA in libkiln_cuda.so). Models and the trainer reach the device
 * only through this table, so a backend is a new table, not a new model. The table carries the
 * whole device: its version, its state (ctx), a sticky status the trainer checks once per step,
 * memory, the fp32 ops, and optional groups (bf16 compute, fused ops) that are used when present.
 * Every pointer argument below is DEVICE memory of the backend (host memory where host_memory
 * is set); shapes are in the comments, row-major.
 * It is not a tensor library: no shapes at run time, no autograd, just llm.c-style kernels. */
#ifndef KILN_ENGINE_BACKEND_H
#define KILN_ENGINE_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

/* Version of the table's layout. A backend loaded at run time (libkiln_cuda.so) built against
 * another version is refused. */
#define ENG_BACKEND_ABI 3

typedef struct eng_backend eng_backend_t;

/* bf16 compute for mixed precision: GEMMs whose inputs are bf16 (uint16_t bit patterns), with
 * fp32 accumulation and fp32 outputs. Everything else in a bf16 run stays fp32 (LayerNorm,
 * softmax, attention, the optimizer with fp32 master weights). The shapes and the
 * accumulate/overwrite rules are matmul_forward's and matmul_backward's. */
typedef struct eng_backend_bf16 {
    /* 0 when this machine can run the group; otherwise KILN_EUNSUPP with err saying why (the
     * CPU has neither AVX512-BF16 nor AMX-BF16, read from the CPU flags at run time). */
    int (*available)(kiln_err_t *err);
    /* dst (n) = src rounded to bf16 (nearest even) */
    void (*from_f32)(uint16_t *dst, const float *src, size_t n);
    /* out (N,OC) = inp (N,C) @ w^T (OC,C) + bias (OC, fp32, may be NULL) */
    void (*matmul_forward)(float *out, const uint16_t *inp, const uint16_t *w, const float *bias,
                           int N, int C, int OC);
    /* dinp (N,C) = dout @ w (skipped when dinp is NULL); dw (OC,C) += dout^T @ inp (skipped
     * when dw is NULL); dbias (OC) += column sums of the fp32 dout (skipped when NULL). dout_bf
     * (N,OC) is dout in bf16. */
    void (*matmul_backward)(float *dinp, float *dw, float *dbias, const float *dout,
                            const uint16_t *dout_bf, const uint16_t *inp, const uint16_t *w, int N,
                            int C, int OC);
    /* The table's adamw_update on the fp32 master weights that also writes param_bf16 (n): the
     * updated weights rounded to bf16, in the same pass. */
    void (*adamw_update)(float *param, uint16_t *param_bf16, const float *grad, float *m, float *v,
                         size_t n, float lr, float beta1, float beta2, float eps, float wd,
                         float grad_scale, int64_t t);
} eng_backend_bf16_t;

/* Fused ops a backend may offer; NULL entries are composed from the plain ops instead. */
typedef struct eng_backend_fused {
    /* out (N,OC) = gelu(pre), pre (N,OC) = inp (N,C) @ w^T + bias: matmul_forward then
     * gelu_forward in one call (a GEMM epilogue). */
    void (*matmul_forward_gelu)(float *out, float *pre, const float *inp, const float *w,
                                const float *bias, int N, int C, int OC);
} eng_backend_fused_t;

/* Collectives on device memory for a group of ranks, one device per rank (NCCL on CUDA): the
 * data-parallel layer's reductions of device tensors. Ops are queued behind the work already
 * queued on the device and return at once; their device buffers are borrowed until wait(),
 * which blocks until every queued op finished, or fails (KILN_ETIMEDOUT) when none completed for
 * timeout_s, aborting the communicator. Semantics as comm.h's host collectives: allreduce in
 * place (avg != 0 averages), reduce_scatter leaves the shard comm_shard_range(n, rank, world)
 * reduced, allgather fills every rank's buffer from each rank's shard. */
typedef struct eng_dev_comm eng_dev_comm_t;
/* Copies len bytes of rank 0's buf into buf on every rank (the host transport's broadcast,
 * which carries the communicator's bootstrap). */
typedef int (*eng_dev_bcast_fn)(void *ctx, void *buf, size_t len, kiln_err_t *err);
typedef struct eng_backend_coll {
    /* Collective over world ranks. Caller owns *out (destroy). 0, KILN_EUNAVAIL or KILN_ECOMM. */
    int (*create)(int rank, int world, eng_dev_bcast_fn bcast, void *bctx, eng_dev_comm_t **out,
                  kiln_err_t *err);
    void (*destroy)(eng_dev_comm_t *c); /* accepts NULL */
    int (*allreduce)(eng_dev_comm_t *c, float *buf, size_t n, int avg, kiln_err_t *err);
    int (*reduce_scatter)(eng_dev_comm_t *c, float *buf, size_t n, int avg, kiln_err_t *err);
    int (*allgather)(eng_dev_comm_t *c, float *buf, size_t n, kiln_err_t *err);
    int (*wait)(eng_dev_comm_t *c, double timeout_s, kiln_err_t *err);
} eng_backend_coll_t;

/* Device memory as the trainer reports it. */
typedef struct eng_backend_mem {
    size_t in_use_bytes;    /* allocated through the backend now */
    size_t peak_bytes;      /* high-water mark of in_use_bytes */
    size_t device_total_bytes;
} eng_backend_mem_t;

/* Conventions shared by every backward op:
 *  - parameter gradients (dw, db, dbias, dwte, dwpe) ACCUMULATE (+=), so microbatches add up;
 *  - input gradients (dinp) are OVERWRITTEN (=), except layernorm_backward, whose dinp
 *    ACCUMULATES because a LayerNorm input is the residual stream, which already holds the
 *    gradient that flows around the block.
 * Ops never allocate; scratch is passed in. Ops are deterministic: the same inputs and thread
 * count give bit-identical outputs. */
struct eng_backend {
    int abi;            /* ENG_BACKEND_ABI */
    const char *name;   /* "cpu", "ref", "cuda" */
    void *ctx;          /* the device's state, passed to the state functions below; ops act on
                         * the process's one device of this backend (one device per rank) */
    bool host_memory;   /* device pointers are host memory (the host transport can move them) */

    /* ---- state (optional: NULL means always fine / not known) ---- */
    /* 0, or the FIRST device failure since load (KILN_EDEVICE with err filled; sticky until
     * the process ends). Waits for queued work first, so asynchronous faults are caught. */
    int (*status)(void *ctx, kiln_err_t *err);
    void (*mem_stats)(void *ctx, eng_backend_mem_t *out);

    /* ---- optional groups: NULL when the backend has none ---- */
    const eng_backend_bf16_t *bf16;
    const eng_backend_fused_t *fused;
    const eng_backend_coll_t *coll; /* device collectives (NULL: host memory moves over comm/) */

    /* ---- memory: alloc returns zeroed, 64-byte aligned device memory or NULL ---- */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    /* Gives back the memory behind [p, p + bytes) of an allocation, whose contents are no longer
     * needed (they read as zeros afterwards); whole pages only. Optional (NULL: keeps it). */
    void (*discard)(void *p, size_t bytes);
    void (*memset_zero)(void *dst, size_t bytes);
    void (*to_device)(void *dst, const void *host_src, size_t bytes);
    void (*to_host)(void *host_dst, const void *src, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes); /* device to device */
    void (*synchronize)(void);

    /* out (B,T,C) = wte[inp[b,t]] (V,C) + wpe[t] (T,C); inp (B,T) int32 device tokens */
    void (*encoder_forward)(float *out, const int32_t *inp, const float *wte, const float *wpe,
                            int B, int T, int C);
    /* dwte (V,C) += scatter of dout (B,T,C) by inp; dwpe (T,C) += sum over b of dout */
    void (*encoder_backward)(float *dwte, float *dwpe, const float *dout, const int32_t *inp,
                             int B, int T, int C);

    /* out (N,C) = (inp - mean) * rstd * w + b; mean, rstd (N) saved for backward */
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C);
    /* dinp (N,C) +=, dw (C) +=, db (C) += */
    void (*layernorm_backward)(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C);

    /* out (N,OC) = inp (N,C) @ w^T + bias; w (OC,C), bias (OC) or NULL */
    void (*matmul_forward)(float *out, const float *inp, const float *w, const float *bias,
                           int N, int C, int OC);
    /* dinp (N,C) = dout @ w (skipped when dinp is NULL); dw (OC,C) += dout^T @ inp (skipped
     * when dw is NULL); dbias (OC) += column sums of dout (skipped when NULL) */
    void (*matmul_backward)(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC);
    /* Optional: whether matmul_backward computes dinp and dw at the same time (then two calls,
     * one for each, would be slower and give dw no sooner). NULL: one after the other. */
    bool (*matmul_backward_joint)(void);

    /* Causal multi-head self-attention. qkv (B,T,3C) holds q,k,v per position (heads NH, head
     * size C/NH); out (B,T,C); att (B,NH,T,T) saves the softmax probabilities (row t valid for
     * columns <= t, zero above). */
    void (*attention_forward)(float *out, float *att, const float *qkv, int B, int T, int C,
                              int NH);
    /* dqkv (B,T,3C) = ...; scratch (B,NH,T,T) */
    void (*attention_backward)(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH);

    /* GELU, tanh approximation (GPT-2): out (N) = gelu(inp); dinp (N) = gelu'(inp) * dout */
    void (*gelu_forward)(float *out, const float *inp, size_t N);
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, size_t N);
    /* ReLU: out = max(inp, 0); dinp = dout where inp > 0 else 0 */
    void (*relu_forward)(float *out, const float *inp, size_t N);
    void (*relu_backward)(float *dinp, const float *inp, const float *dout, size_t N);

    /* out (N) = a + b (out may alias a or b) */
    void (*residual_forward)(float *out, const float *a, const float *b, size_t N);

    /* Fused softmax + cross-entropy over the first V of Vp columns (padding ignored).
     * probs (N,Vp) = softmax(logits) (probs may alias logits; padded columns become 0);
     * losses (N) = -log probs[target] when targets is non-NULL (then losses must be non-NULL). */
    void (*xent_forward)(float *probs, float *losses, const float *logits,
                         const int32_t *targets, int N, int V, int Vp);
    /* dlogits (N,Vp) = (probs - onehot(target)) * dloss (may alias probs); padding 0 */
    void (*xent_backward)(float *dlogits, const float *probs, const int32_t *targets,
                          float dloss, int N, int V, int Vp);

    /* Cross-entropy over a vocabulary cut into slices, one GEMM per slice (a GPT head split
     * into several blocks, so pipeline stages can share it). stats is (4,N), four arrays:
     * running max, running sum of exp(logit - max), the target's logit, and log-sum-exp.
     * chunk_forward folds logits (N,w), the columns [v0, v0+w) of the padded vocabulary, into
     * stats (columns >= V are padding and ignored; first: stats start afresh; targets may be
     * NULL, then the target logit is left alone). chunk_finish sets stats' log-sum-exp and, when
     * losses is non-NULL, losses (N) = lse - target logit. chunk_backward: dlogits (N,w) =
     * (exp(logits - lse) - onehot(target)) * dloss over the slice (may alias logits; padding 0).
     * Optional: NULL in a backend that does not offer the split head. */
    void (*xent_chunk_forward)(float *stats, const float *logits, const int32_t *targets, int N,
                               int v0, int w, int V, int first);
    void (*xent_chunk_finish)(float *losses, float *stats, int N);
    void (*xent_chunk_backward)(float *dlogits, const float *logits, const float *lse,
                                const int32_t *targets, float dloss, int N, int v0, int w, int V);

    /* AdamW on n parameters (one contiguous range). t is the 1-based step for bias correction;
     * grad_scale multiplies g first (clipping); wd is applied decoupled (param -= lr*wd*param). */
    void (*adamw_update)(float *param, const float *grad, float *m, float *v, size_t n,
                         float lr, float beta1, float beta2, float eps, float wd,
                         float grad_scale, int64_t t);
    /* Returns sum of squares of x (n), accumulated in double in a fixed order. */
    double (*sumsq)(const float *x, size_t n);
    /* x (n) *= s */
    void (*scale)(float *x, float s, size_t n);
};

/* Returns the backend for device "cpu", "cuda" or "auto" in *out (borrowed, static lifetime).
 * "cpu": the CPU backend. "cuda": dlopen()s libkiln_cuda.so (next to the binary, under
 * ../lib, or on the loader path) and takes its `eng_cuda_backend` symbol, whose abi must be
 * ENG_BACKEND_ABI; KILN_EUNAVAIL with a clear message when that fails or no GPU is present.
 * "auto": cuda when available, else cpu. "ref": the reference ops. Thread-safe. */
int eng_backend_get(const char *device, const eng_backend_t **out, kiln_err_t *err);
/* kiln-train's --cuda-lib (KILN_CUDA_LIB): where libkiln_cuda.so is when it is not beside the
 * executable (NULL: look there, then in ../lib, then the loader's path). Call before the first
 * eng_backend_get("cuda"); path is borrowed for the process's lifetime. */
void eng_backend_cuda_lib_set(const char *path);

/* The CPU backend (the default; always available). */
extern const eng_backend_t eng_cpu_backend;
/* The plain reference ops (engine/ref/): slow, obviously correct, used by tests as the oracle
 * for the fast kernels. A complete backend, so whole models can run on it. */
extern const eng_backend_t eng_ref_backend;
/* Their bf16 groups: the CPU's runs oneDNN's matmul (AMX or AVX512-BF16 kernels, chosen by
 * oneDNN for the machine); the reference rounds to bf16 and accumulates in double. */
extern const eng_backend_bf16_t eng_cpu_bf16;
extern const eng_backend_bf16_t eng_ref_bf16;

/* Sets the CPU thread count for OpenMP and OpenBLAS (one shared pool). n <= 0 leaves it. */
void eng_cpu_set_threads(int n);
/* Current CPU thread count. */
int eng_cpu_threads(void);

#endif /* KILN_ENGINE_BACKEND_H */
