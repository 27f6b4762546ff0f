/* cuda_attention.cu - causal multi-head self-attention on the GPU, two ways:
 *  - unfused (the table's op, which must save the (B,NH,T,T) probabilities; fp32 or bf16): q/k/v
 *    permuted to (B,NH,T,hs), scores and outputs by cuBLAS strided-batched GEMMs on the tensor
 *    cores, a causal softmax kernel computing in fp32;
 *  - flash-style (cuda.h's extension ops): online softmax over key tiles held in shared memory,
 *    only the per-row log-sum-exp kept; the backward recomputes probabilities, once per key
 *    (dK, dV) and once per query (dQ), so no atomics and bit-identical reruns.
 * The flash kernels run on CUDA cores (fp32 FMA), one thread per query/key row: simple and
 * obviously right, not yet the tensor-core (mma/wgmma) kernels an H100 needs for peak speed. */
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
/* S is the storage type (float or bf16); the sequence length keeps the name T. */
template <typename S> static cudaDataType_t dtype_of(void);
template <> cudaDataType_t dtype_of<float>(void) { return CUDA_R_32F; }
template <> cudaDataType_t dtype_of<bf16>(void) { return CUDA_R_16BF; }

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
template void kc_attention_forward_unfused<bf16>(bf16 *, bf16 *, const bf16 *, int, int, int, int);
template void kc_attention_backward_unfused<float>(float *, float *, const float *, const float *,
                                                   const float *, int, int, int, int);
template void kc_attention_backward_unfused<bf16>(bf16 *, bf16 *, const bf16 *, const bf16 *,
                                                  const bf16 *, int, int, int, int);

/* ---- flash-style path --------------------------------------------------------------------------- */
#define FA_BQ 64 /* queries per forward block (one per thread) */
#define FA_BK 32 /* keys per shared-memory tile */

template <typename T, int HS>
__global__ void __launch_bounds__(FA_BQ) flash_fwd_kernel(T *out, float *lse, const T *qkv, int Tn,
                                                          int NH, float scale)
{
    __shared__ float ks[FA_BK][HS], vs[FA_BK][HS];
    int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int C = NH * HS;
    size_t row3 = 3 * (size_t)C;
    int t = blockIdx.x * FA_BQ + threadIdx.x;
    int last = min(blockIdx.x * FA_BQ + FA_BQ - 1, Tn - 1); /* last query of the block */
    float q[HS], o[HS];
    float m = -INFINITY, l = 0.0f;
    if (t < Tn) {
        const T *qp = qkv + ((size_t)b * Tn + t) * row3 + (size_t)h * HS;
#pragma unroll
        for (int i = 0; i < HS; i++) { q[i] = kc_f(qp[i]) * scale; o[i] = 0.0f; }
    }
    for (int kb = 0; kb <= last; kb += FA_BK) {
        __syncthreads(); /* the previous tile is no longer read */
        for (int idx = threadIdx.x; idx < FA_BK * HS; idx += FA_BQ) {
            int r = idx / HS, i = idx % HS, u = kb + r;
            const T *kp = qkv + ((size_t)b * Tn + u) * row3 + C + (size_t)h * HS + i;
            ks[r][i] = u < Tn ? kc_f(kp[0]) : 0.0f;
            vs[r][i] = u < Tn ? kc_f(kp[C]) : 0.0f;
        }
        __syncthreads();
        if (t < Tn) {
            int umax = min(FA_BK, t - kb + 1); /* causal: keys u <= t */
            for (int r = 0; r < umax; r++) {
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < HS; i++) s += q[i] * ks[r][i];
                if (s > m) { /* new running max: rescale what was accumulated */
                    float corr = expf(m - s);
                    l *= corr;
#pragma unroll
                    for (int i = 0; i < HS; i++) o[i] *= corr;
                    m = s;
                }
                float p = expf(s - m);
                l += p;
#pragma unroll
                for (int i = 0; i < HS; i++) o[i] += p * vs[r][i];
            }
        }
    }
    if (t < Tn) {
        float inv = 1.0f / l;
        T *op = out + ((size_t)b * Tn + t) * C + (size_t)h * HS;
#pragma unroll
        for (int i = 0; i < HS; i++) op[i] = kc_to<T>(o[i] * inv);
        lse[(size_t)bh * Tn + t] = m + logf(l);
    }
}

/* D (B,NH,T) = rowsum(dO * O) per head: one warp per (b, h, t). */
template <typename T>
__global__ void flash_bwd_dot_kernel(float *D, const T *dout, const T *out, int B, int Tn, int NH,
                                     int HS)
{
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= B * NH * Tn) return;
    int t = row % Tn, bh = row / Tn, b = bh / NH, h = bh % NH;
    size_t at = ((size_t)b * Tn + t) * NH * HS + (size_t)h * HS;
    float s = 0.0f;
    for (int i = lane; i < HS; i += 32) s += kc_f(dout[at + i]) * kc_f(out[at + i]);
    s = att_warp_sum(s);
    if (lane == 0) D[row] = s;
}

#define FB_BR 32 /* own rows (keys or queries) per backward block, one per thread */

/* Dynamic shared memory: own rows a, b (FB_BR x (HS+1), padded against bank conflicts), then a
 * tile of the other side (BO rows of HS for two tensors) and BO floats of lse and of D. */
template <int HS> struct fb_cfg {
    static const int BO = HS >= 128 ? 16 : 32;
    static const size_t smem = (2 * FB_BR * (HS + 1) + 2 * BO * HS + 2 * BO) * sizeof(float);
};

/* One thread per key u: dV[u] = sum_t p dO[t], dK[u] = sum_t ds q[t] * scale over t >= u. */
template <typename T, int HS>
__global__ void __launch_bounds__(FB_BR) flash_bwd_dkv_kernel(T *dqkv, const T *qkv, const T *dout,
                                                              const float *lse, const float *D,
                                                              int Tn, int NH, float scale)
{
    const int BO = fb_cfg<HS>::BO;
    extern __shared__ float sm[];
    float *kown = sm, *vown = kown + FB_BR * (HS + 1);
    float *qt = vown + FB_BR * (HS + 1), *dot_ = qt + BO * HS, *lse_t = dot_ + BO * HS,
          *D_t = lse_t + BO;
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, C = NH * HS;
    size_t row3 = 3 * (size_t)C;
    int u0 = blockIdx.x * FB_BR, u = u0 + threadIdx.x;
    for (int idx = threadIdx.x; idx < FB_BR * HS; idx += FB_BR) {
        int r = idx / HS, i = idx % HS, uu = u0 + r;
        const T *kp = qkv + ((size_t)b * Tn + uu) * row3 + C + (size_t)h * HS + i;
        kown[r * (HS + 1) + i] = uu < Tn ? kc_f(kp[0]) : 0.0f;
        vown[r * (HS + 1) + i] = uu < Tn ? kc_f(kp[C]) : 0.0f;
    }
    float dk[HS], dv[HS];
#pragma unroll
    for (int i = 0; i < HS; i++) { dk[i] = 0.0f; dv[i] = 0.0f; }
    const float *kr = kown + threadIdx.x * (HS + 1), *vr = vown + threadIdx.x * (HS + 1);
    for (int tb = u0; tb < Tn; tb += BO) { /* queries t >= u0 can see some key of the block */
        __syncthreads();
        for (int idx = threadIdx.x; idx < BO * HS; idx += FB_BR) {
            int r = idx / HS, i = idx % HS, t = tb + r;
            qt[idx] = t < Tn ? kc_f(qkv[((size_t)b * Tn + t) * row3 + (size_t)h * HS + i]) : 0.0f;
            dot_[idx] = t < Tn ? kc_f(dout[((size_t)b * Tn + t) * C + (size_t)h * HS + i]) : 0.0f;
        }
        for (int r = threadIdx.x; r < BO; r += FB_BR) {
            int t = tb + r;
            lse_t[r] = t < Tn ? lse[(size_t)bh * Tn + t] : 0.0f;
            D_t[r] = t < Tn ? D[(size_t)bh * Tn + t] : 0.0f;
        }
        __syncthreads();
        if (u < Tn) {
            for (int r = 0; r < BO; r++) {
                int t = tb + r;
                if (t < u || t >= Tn) continue;
                const float *q = qt + r * HS, *g = dot_ + r * HS;
                float s = 0.0f, dp = 0.0f;
#pragma unroll
                for (int i = 0; i < HS; i++) { s += q[i] * kr[i]; dp += g[i] * vr[i]; }
                float p = expf(s * scale - lse_t[r]);
                float ds = p * (dp - D_t[r]) * scale;
#pragma unroll
                for (int i = 0; i < HS; i++) { dv[i] += p * g[i]; dk[i] += ds * q[i]; }
            }
        }
    }
    if (u < Tn) {
        T *dkp = dqkv + ((size_t)b * Tn + u) * row3 + C + (size_t)h * HS;
#pragma unroll
        for (int i = 0; i < HS; i++) { dkp[i] = kc_to<T>(dk[i]); dkp[C + i] = kc_to<T>(dv[i]); }
    }
}

/* One thread per query t: dQ[t] = sum_{u <= t} ds k[u] * scale. */
template <typename T, int HS>
__global__ void __launch_bounds__(FB_BR) flash_bwd_dq_kernel(T *dqkv, const T *qkv, const T *dout,
                                                             const float *lse, const float *D,
                                                             int Tn, int NH, float scale)
{
    const int BO = fb_cfg<HS>::BO;
    extern __shared__ float sm[];
    float *qown = sm, *gown = qown + FB_BR * (HS + 1);
    float *kt = gown + FB_BR * (HS + 1), *vt = kt + BO * HS;
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, C = NH * HS;
    size_t row3 = 3 * (size_t)C;
    int t0 = blockIdx.x * FB_BR, t = t0 + threadIdx.x;
    for (int idx = threadIdx.x; idx < FB_BR * HS; idx += FB_BR) {
        int r = idx / HS, i = idx % HS, tt = t0 + r;
        qown[r * (HS + 1) + i] =
            tt < Tn ? kc_f(qkv[((size_t)b * Tn + tt) * row3 + (size_t)h * HS + i]) : 0.0f;
        gown[r * (HS + 1) + i] =
            tt < Tn ? kc_f(dout[((size_t)b * Tn + tt) * C + (size_t)h * HS + i]) : 0.0f;
    }
    float dq[HS];
#pragma unroll
    for (int i = 0; i < HS; i++) dq[i] = 0.0f;
    const float *qr = qown + threadIdx.x * (HS + 1), *gr = gown + threadIdx.x * (HS + 1);
    float my_lse = t < Tn ? lse[(size_t)bh * Tn + t] : 0.0f;
    float my_D = t < Tn ? D[(size_t)bh * Tn + t] : 0.0f;
    int last = min(t0 + FB_BR - 1, Tn - 1);
    for (int ub = 0; ub <= last; ub += BO) {
        __syncthreads();
        for (int idx = threadIdx.x; idx < BO * HS; idx += FB_BR) {
            int r = idx / HS, i = idx % HS, uu = ub + r;
            const T *kp = qkv + ((size_t)b * Tn + uu) * row3 + C + (size_t)h * HS + i;
            kt[idx] = uu < Tn ? kc_f(kp[0]) : 0.0f;
            vt[idx] = uu < Tn ? kc_f(kp[C]) : 0.0f;
        }
        __syncthreads();
        if (t < Tn) {
            for (int r = 0; r < BO; r++) {
                int uu = ub + r;
                if (uu > t) break;
                const float *k = kt + r * HS, *v = vt + r * HS;
                float s = 0.0f, dp = 0.0f;
#pragma unroll
                for (int i = 0; i < HS; i++) { s += qr[i] * k[i]; dp += gr[i] * v[i]; }
                float p = expf(s * scale - my_lse);
                float ds = p * (dp - my_D) * scale;
#pragma unroll
                for (int i = 0; i < HS; i++) dq[i] += ds * k[i];
            }
        }
    }
    if (t < Tn) {
        T *dqp = dqkv + ((size_t)b * Tn + t) * row3 + (size_t)h * HS;
#pragma unroll
        for (int i = 0; i < HS; i++) dqp[i] = kc_to<T>(dq[i]);
    }
}

template <typename T, int HS>
static void flash_fwd(kc_ctx_t *c, T *out, float *lse, const T *qkv, int B, int Tn, int NH)
{
    dim3 grid((Tn + FA_BQ - 1) / FA_BQ, B * NH);
    flash_fwd_kernel<T, HS><<<grid, FA_BQ, 0, c->stream>>>(out, lse, qkv, Tn, NH,
                                                           1.0f / sqrtf((float)HS));
    KC_LAUNCHED("flash_attention_forward");
}

template <typename T, int HS>
static void flash_bwd(kc_ctx_t *c, T *dqkv, const T *qkv, const T *dout, const float *lse,
                      const float *D, int B, int Tn, int NH)
{
    size_t smem = fb_cfg<HS>::smem;
    float scale = 1.0f / sqrtf((float)HS);
    /* Above 48 KiB a kernel must opt in to dynamic shared memory. */
    KC_CUDA(cudaFuncSetAttribute(flash_bwd_dkv_kernel<T, HS>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    KC_CUDA(cudaFuncSetAttribute(flash_bwd_dq_kernel<T, HS>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((Tn + FB_BR - 1) / FB_BR, B * NH);
    flash_bwd_dkv_kernel<T, HS><<<grid, FB_BR, smem, c->stream>>>(dqkv, qkv, dout, lse, D, Tn, NH, scale);
    KC_LAUNCHED("flash_attention_backward_dkv");
    flash_bwd_dq_kernel<T, HS><<<grid, FB_BR, smem, c->stream>>>(dqkv, qkv, dout, lse, D, Tn, NH, scale);
    KC_LAUNCHED("flash_attention_backward_dq");
}

template <typename T>
void kc_attention_forward_flash(T *out, float *lse, const T *qkv, int B, int Tn, int C, int NH)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || B <= 0 || Tn <= 0) return;
    int hs = NH > 0 ? C / NH : 0;
    switch (hs * (NH * hs == C)) {
    case 32: flash_fwd<T, 32>(c, out, lse, qkv, B, Tn, NH); break;
    case 64: flash_fwd<T, 64>(c, out, lse, qkv, B, Tn, NH); break;
    case 128: flash_fwd<T, 128>(c, out, lse, qkv, B, Tn, NH); break;
    default:
        kc_fail(KILN_EUNSUPP, __FILE__, __LINE__,
                "flash attention supports head sizes 32, 64 and 128, not C/NH = %d/%d", C, NH);
    }
}

template <typename T>
void kc_attention_backward_flash(T *dqkv, float *scratch, const T *dout, const T *out,
                                 const float *lse, const T *qkv, int B, int Tn, int C, int NH)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || B <= 0 || Tn <= 0) return;
    int hs = NH > 0 ? C / NH : 0;
    if (hs != 32 && hs != 64 && hs != 128) {
        kc_fail(KILN_EUNSUPP, __FILE__, __LINE__,
                "flash attention supports head sizes 32, 64 and 128, not C/NH = %d/%d", C, NH);
        return;
    }
    int rows = B * NH * Tn;
    flash_bwd_dot_kernel<T><<<kc_blocks(rows, 8), 256, 0, c->stream>>>(scratch, dout, out, B, Tn, NH, hs);
    KC_LAUNCHED("flash_attention_backward_dot");
    switch (hs) {
    case 32: flash_bwd<T, 32>(c, dqkv, qkv, dout, lse, scratch, B, Tn, NH); break;
    case 64: flash_bwd<T, 64>(c, dqkv, qkv, dout, lse, scratch, B, Tn, NH); break;
    default: flash_bwd<T, 128>(c, dqkv, qkv, dout, lse, scratch, B, Tn, NH); break;
    }
}

template void kc_attention_forward_flash<float>(float *, float *, const float *, int, int, int, int);
template void kc_attention_forward_flash<bf16>(bf16 *, float *, const bf16 *, int, int, int, int);
template void kc_attention_backward_flash<float>(float *, float *, const float *, const float *,
                                                 const float *, const float *, int, int, int, int);
template void kc_attention_backward_flash<bf16>(bf16 *, float *, const bf16 *, const bf16 *,
                                                const float *, const bf16 *, int, int, int, int);
