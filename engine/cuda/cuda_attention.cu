/* cuda_attention.cu - causal multi-head self-attention on the GPU, the table's op, which saves the
 * (B,NH,T,T) probabilities: q/k/v permuted to (B,NH,T,hs), scores and outputs by cuBLAS
 * strided-batched GEMMs, a causal softmax kernel computing in fp32. It is not a fused (flash)
 * attention. */
#include <cmath>

#include "engine/cuda/cuda_int.cuh"

__device__ __forceinline__ float att_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float att_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* ---- unfused path ------------------------------------------------------------------------------- */
/* S is the storage type (float); the sequence length keeps the name T. */
template <typename S> static cudaDataType_t dtype_of(void);
template <> cudaDataType_t dtype_of<float>(void) { return CUDA_R_32F; }

/* q, k, v (B,NH,T,hs) <- qkv (B,T,3C) */
template <typename S>
__global__ void permute_qkv_kernel(S *q, S *k, S *v, const S *qkv, int B, int T, int NH, int hs)
{
    size_t C = (size_t)NH * hs, total = (size_t)B * T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        /* i indexes (b, h, t, x) in the permuted layout */
        int x = (int)(i % hs);
        size_t r = i / hs;
        int t = (int)(r % T);
        r /= T;
        int h = (int)(r % NH);
        size_t b = r / NH;
        size_t src = (b * T + t) * 3 * C + (size_t)h * hs + x;
        q[i] = qkv[src];
        k[i] = qkv[src + C];
        v[i] = qkv[src + 2 * C];
    }
}

/* out (B,T,part*C + h*hs + x) <- y (B,NH,T,hs); stride is the row length of out (C or 3C). */
template <typename S>
__global__ void unpermute_kernel(S *out, const S *y, int B, int T, int NH, int hs, size_t stride,
                                 size_t offset)
{
    size_t C = (size_t)NH * hs, total = (size_t)B * T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int x = (int)(i % hs);
        size_t r = i / hs;
        int t = (int)(r % T);
        r /= T;
        int h = (int)(r % NH);
        size_t b = r / NH;
        out[(b * T + t) * stride + offset + (size_t)h * hs + x] = y[i];
    }
}

/* y (B,NH,T,hs) <- x (B,T,C) */
template <typename S>
__global__ void permute_one_kernel(S *y, const S *x, int B, int T, int NH, int hs)
{
    size_t C = (size_t)NH * hs, total = (size_t)B * T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int xi = (int)(i % hs);
        size_t r = i / hs;
        int t = (int)(r % T);
        r /= T;
        int h = (int)(r % NH);
        size_t b = r / NH;
        y[i] = x[(b * T + t) * C + (size_t)h * hs + xi];
    }
}

/* In place on att rows (B*NH*T rows of T): softmax over u <= t, zero above. One warp a row,
 * fp32 arithmetic whatever the storage. */
template <typename S>
__global__ void causal_softmax_kernel(S *att, int rows, int T)
{
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    int t = row % T;
    S *a = att + (size_t)row * T;
    float mx = -INFINITY;
    for (int u = lane; u <= t; u += 32) mx = fmaxf(mx, kc_f(a[u]));
    mx = att_warp_max(mx);
    float s = 0.0f;
    for (int u = lane; u <= t; u += 32) s += expf(kc_f(a[u]) - mx);
    float inv = 1.0f / att_warp_sum(s);
    for (int u = lane; u < T; u += 32) a[u] = kc_to<S>(u <= t ? expf(kc_f(a[u]) - mx) * inv : 0.0f);
}

/* In place: ds[t][u] = p[t][u] * (dp[t][u] - sum_w p[t][w] dp[t][w]) * scale, zero above t. */
template <typename S>
__global__ void causal_softmax_bwd_kernel(S *dp, const S *att, int rows, int T, float scale)
{
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    int t = row % T;
    S *d = dp + (size_t)row * T;
    const S *p = att + (size_t)row * T;
    float dot = 0.0f;
    for (int u = lane; u <= t; u += 32) dot += kc_f(p[u]) * kc_f(d[u]);
    dot = att_warp_sum(dot);
    for (int u = lane; u < T; u += 32)
        d[u] = kc_to<S>(u <= t ? kc_f(p[u]) * (kc_f(d[u]) - dot) * scale : 0.0f);
}

static unsigned grid_for(size_t n)
{
    size_t cap = (size_t)1 << 30;
    return kc_blocks(n < cap ? n : cap, 256);
}

template <typename S>
void kc_attention_forward_unfused(S *out, S *att, const S *qkv, int B, int T, int C, int NH)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || B <= 0 || T <= 0) return;
    int hs = C / NH;
    size_t n = (size_t)B * T * C;
    S *ws = (S *)kc_scratch(4 * n * sizeof(S));
    if (!ws) return;
    S *q = ws, *k = ws + n, *v = ws + 2 * n, *y = ws + 3 * n;
    permute_qkv_kernel<S><<<grid_for(n), 256, 0, c->stream>>>(q, k, v, qkv, B, T, NH, hs);
    KC_LAUNCHED("permute_qkv");
    long long sq = (long long)T * hs, sa = (long long)T * T;
    int batch = B * NH;
    kc_gemm_batched(true, false, T, T, hs, 1.0f / sqrtf((float)hs), k, hs, sq, q, hs, sq, 0.0f,
                    att, T, sa, batch, dtype_of<S>());
    int rows = batch * T;
    causal_softmax_kernel<S><<<kc_blocks(rows, 8), 256, 0, c->stream>>>(att, rows, T);
    KC_LAUNCHED("causal_softmax");
    kc_gemm_batched(false, false, hs, T, T, 1.0f, v, hs, sq, att, T, sa, 0.0f, y, hs, sq, batch,
                    dtype_of<S>());
    unpermute_kernel<S><<<grid_for(n), 256, 0, c->stream>>>(out, y, B, T, NH, hs, (size_t)C, 0);
    KC_LAUNCHED("unpermute");
}

template <typename S>
void kc_attention_backward_unfused(S *dqkv, S *scratch, const S *dout, const S *qkv, const S *att,
                                   int B, int T, int C, int NH)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || B <= 0 || T <= 0) return;
    int hs = C / NH;
    size_t n = (size_t)B * T * C;
    S *ws = (S *)kc_scratch(7 * n * sizeof(S));
    if (!ws) return;
    S *q = ws, *k = ws + n, *v = ws + 2 * n, *dy = ws + 3 * n;
    S *dq = ws + 4 * n, *dk = ws + 5 * n, *dv = ws + 6 * n;
    cudaDataType_t ty = dtype_of<S>();
    permute_qkv_kernel<S><<<grid_for(n), 256, 0, c->stream>>>(q, k, v, qkv, B, T, NH, hs);
    KC_LAUNCHED("permute_qkv");
    /* dy (B,NH,T,hs) <- dout (B,T,C) */
    permute_one_kernel<S><<<grid_for(n), 256, 0, c->stream>>>(dy, dout, B, T, NH, hs);
    KC_LAUNCHED("permute_dout");
    long long sq = (long long)T * hs, sa = (long long)T * T;
    int batch = B * NH, rows = batch * T;
    float scale = 1.0f / sqrtf((float)hs);
    /* dP = dY V^T into scratch */
    kc_gemm_batched(true, false, T, T, hs, 1.0f, v, hs, sq, dy, hs, sq, 0.0f, scratch, T, sa,
                    batch, ty);
    /* dV = P^T dY */
    kc_gemm_batched(false, true, hs, T, T, 1.0f, dy, hs, sq, att, T, sa, 0.0f, dv, hs, sq, batch,
                    ty);
    causal_softmax_bwd_kernel<S><<<kc_blocks(rows, 8), 256, 0, c->stream>>>(scratch, att, rows, T, scale);
    KC_LAUNCHED("causal_softmax_backward");
    /* dQ = dS K, dK = dS^T Q */
    kc_gemm_batched(false, false, hs, T, T, 1.0f, k, hs, sq, scratch, T, sa, 0.0f, dq, hs, sq,
                    batch, ty);
    kc_gemm_batched(false, true, hs, T, T, 1.0f, q, hs, sq, scratch, T, sa, 0.0f, dk, hs, sq,
                    batch, ty);
    unpermute_kernel<S><<<grid_for(n), 256, 0, c->stream>>>(dqkv, dq, B, T, NH, hs, 3 * (size_t)C, 0);
    KC_LAUNCHED("unpermute_dq");
    unpermute_kernel<S><<<grid_for(n), 256, 0, c->stream>>>(dqkv, dk, B, T, NH, hs, 3 * (size_t)C, C);
    KC_LAUNCHED("unpermute_dk");
    unpermute_kernel<S><<<grid_for(n), 256, 0, c->stream>>>(dqkv, dv, B, T, NH, hs, 3 * (size_t)C,
                                                            2 * (size_t)C);
    KC_LAUNCHED("unpermute_dv");
}

template void kc_attention_forward_unfused<float>(float *, float *, const float *, int, int, int, int);
template void kc_attention_backward_unfused<float>(float *, float *, const float *, const float *,
                                                   const float *, int, int, int, int);
