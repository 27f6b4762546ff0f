/* backend.h - the engine's table of ops: one struct of function pointers per backend (CPU, and
 * later CUDA in libkiln_cuda.so). Models and the trainer call ops only through this table, so a
 * backend is a new table, not a new model. Every pointer argument below is DEVICE memory of the
 * backend (host memory for the CPU backend); shapes are in the comments, row-major.
 * It is not a tensor library: no shapes at run time, no autograd, just llm.c-style kernels. */
#ifndef KILN_ENGINE_BACKEND_H
#define KILN_ENGINE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

/* Conventions shared by every backward op:
 *  - parameter gradients (dw, db, dbias, dwte, dwpe) ACCUMULATE (+=), so microbatches add up;
 *  - input gradients (dinp) are OVERWRITTEN (=), except layernorm_backward, whose dinp
 *    ACCUMULATES because a LayerNorm input is the residual stream, which already holds the
 *    gradient that flows around the block.
 * Ops never allocate; scratch is passed in. Ops are deterministic: the same inputs and thread
 * count give bit-identical outputs. */
typedef struct eng_backend {
    const char *name; /* "cpu", "cuda" */

    /* memory: alloc returns zeroed, 64-byte aligned device memory or NULL */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
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
    /* dinp (N,C) = dout @ w (skipped when dinp is NULL); dw (OC,C) += dout^T @ inp;
     * dbias (OC) += column sums of dout (skipped when NULL) */
    void (*matmul_backward)(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC);

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
} eng_backend_t;

/* Returns the backend for device "cpu", "cuda" or "auto" in *out (borrowed, static lifetime).
 * "cpu": the CPU backend. "cuda": dlopen()s libkiln_cuda.so (next to the binary, under
 * ../lib, or on the loader path) and takes its `eng_cuda_backend` symbol; KILN_EUNAVAIL with a
 * clear message when that fails or no GPU is present. "auto": cuda when available, else cpu.
 * Thread-safe after the first call. */
int eng_backend_get(const char *device, const eng_backend_t **out, kiln_err_t *err);

/* The CPU backend (the default; always available). */
extern const eng_backend_t eng_cpu_backend;
/* The plain reference ops (engine/ref/): slow, obviously correct, used by tests as the oracle
 * for the fast kernels. A complete backend, so whole models can run on it. */
extern const eng_backend_t eng_ref_backend;

/* Sets the CPU thread count for OpenMP and OpenBLAS (one shared pool). n <= 0 leaves it. */
void eng_cpu_set_threads(int n);
/* Current CPU thread count. */
int eng_cpu_threads(void);

#endif /* KILN_ENGINE_BACKEND_H */
