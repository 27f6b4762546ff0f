/* cuda_kernels.cu - the CUDA backend's non-GEMM, non-attention kernels: rounding to bf16,
 * encoder (embedding) forward/backward, LayerNorm forward/backward, GELU, ReLU, residual, softmax
 * cross-entropy, AdamW with fp32 master weights (optionally writing their bf16 copy), the sum of
 * squares, and the fixed-order column sums used for bias gradients.
 * Every kernel computes in fp32 (statistics, reductions) whatever its storage type, and every
 * reduction has a fixed order: no floating-point atomics unless deterministic mode is off.
 * Kernels are the plain one-thread-per-element / one-warp-per-row kind; see bench/CUDA-NOTES.md
 * for which ones are worth vectorising once they can be profiled. */
#include <cmath>

#include <cub/device/device_radix_sort.cuh>

#include "engine/cuda/cuda_int.cuh"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

/* Grid size for grid-stride elementwise kernels: enough blocks to fill the GPU many times over,
 * never more than CUDA's x-dimension limit. */
static unsigned ew_blocks(size_t n) { return kc_blocks(n < ((size_t)1 << 30) ? n : ((size_t)1 << 30), 256); }

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Block-wide sum / max (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
 * The order is fixed: warp butterflies, then warp 0 over the per-warp results. */
__device__ float block_sum(float v)
{
    __shared__ float sh[32];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    float r = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(r);
}
__device__ float block_max(float v)
{
    __shared__ float sh[32];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    float r = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(r);
}

/* ---- conversion ---------------------------------------------------------------------------------- */
__global__ void f32_to_bf16_kernel(bf16 *dst, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}
void kc_f32_to_bf16(bf16 *dst, const float *src, size_t n)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || n == 0) return;
    f32_to_bf16_kernel<<<ew_blocks(n), 256, 0, c->stream>>>(dst, src, n);
    KC_LAUNCHED("f32_to_bf16");
}
/* ---- encoder -------------------------------------------------------------------------------------- */
template <typename T>
__global__ void encoder_fwd_kernel(T *out, const int32_t *inp, const T *wte, const T *wpe, int B,
                                   int T_, int C)
{
    size_t total = (size_t)B * T_ * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T_);
        out[i] = kc_to<T>(kc_f(wte[(size_t)inp[bt] * C + c]) + kc_f(wpe[(size_t)t * C + c]));
    }
}

template <typename T>
void kc_encoder_forward(T *out, const int32_t *inp, const T *wte, const T *wpe, int B, int T_, int C)
{
    kc_ctx_t *c = kc_ctx();
    size_t n = (size_t)B * T_ * C;
    if (!c || n == 0) return;
    encoder_fwd_kernel<T><<<ew_blocks(n), 256, 0, c->stream>>>(out, inp, wte, wpe, B, T_, C);
    KC_LAUNCHED("encoder_forward");
}

/* dwpe (T,C) += sum over b, b in order. */
template <typename T>
__global__ void encoder_bwd_wpe_kernel(float *dwpe, const T *dout, int B, int T_, int C)
{
    size_t total = (size_t)T_ * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (int b = 0; b < B; b++) acc += kc_f(dout[(size_t)b * total + i]);
        dwpe[i] += acc;
    }
}

/* Deterministic dwte: positions sorted (stably) by token; the block at the start of each
 * token's run sums that run's rows in position order and adds the sum once. */
template <typename T>
__global__ void encoder_bwd_wte_sorted_kernel(float *dwte, const T *dout, const int32_t *keys,
                                              const int32_t *pos, int N, int C)
{
    int i = blockIdx.x;
    if (i >= N || (i > 0 && keys[i] == keys[i - 1])) return;
    int tok = keys[i];
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = 0.0f;
        for (int j = i; j < N && keys[j] == tok; j++) acc += kc_f(dout[(size_t)pos[j] * C + c]);
        dwte[(size_t)tok * C + c] += acc;
    }
}

template <typename T>
__global__ void encoder_bwd_wte_atomic_kernel(float *dwte, const T *dout, const int32_t *inp,
                                              int N, int C)
{
    size_t total = (size_t)N * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        atomicAdd(&dwte[(size_t)inp[i / C] * C + i % C], kc_f(dout[i]));
}

__global__ void iota_kernel(int32_t *p, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = i;
}

static size_t align256(size_t x) { return (x + 255) / 256 * 256; }

template <typename T>
void kc_encoder_backward(float *dwte, float *dwpe, const T *dout, const int32_t *inp, int B,
                         int T_, int C)
{
    kc_ctx_t *c = kc_ctx();
    int N = B * T_;
    if (!c || N <= 0 || C <= 0) return;
    encoder_bwd_wpe_kernel<T><<<ew_blocks((size_t)T_ * C), 256, 0, c->stream>>>(dwpe, dout, B, T_, C);
    KC_LAUNCHED("encoder_backward_wpe");
    if (!c->deterministic) {
        encoder_bwd_wte_atomic_kernel<T><<<ew_blocks((size_t)N * C), 256, 0, c->stream>>>(
            dwte, dout, inp, N, C);
        KC_LAUNCHED("encoder_backward_wte_atomic");
        return;
    }
    size_t temp = 0;
    cudaError_t e = cub::DeviceRadixSort::SortPairs(NULL, temp, (const int32_t *)NULL,
                                                    (int32_t *)NULL, (const int32_t *)NULL,
                                                    (int32_t *)NULL, N, 0, 32, c->stream);
    if (e != cudaSuccess) {
        kc_fail(KILN_EDEVICE, __FILE__, __LINE__, "cub sort size query failed: %s",
                cudaGetErrorString(e));
        return;
    }
    size_t arr = align256((size_t)N * sizeof(int32_t));
    char *ws = (char *)kc_scratch(3 * arr + align256(temp));
    if (!ws) return;
    int32_t *keys = (int32_t *)ws, *pos_in = (int32_t *)(ws + arr), *pos = (int32_t *)(ws + 2 * arr);
    void *tmp = ws + 3 * arr;
    iota_kernel<<<kc_blocks(N, 256), 256, 0, c->stream>>>(pos_in, N);
    KC_LAUNCHED("iota");
    /* LSD radix sort is stable: equal tokens keep increasing position order. */
    KC_CUDA(cub::DeviceRadixSort::SortPairs(tmp, temp, inp, keys, pos_in, pos, N, 0, 32, c->stream));
    int threads = C >= 256 ? 256 : ((C + 31) / 32) * 32;
    encoder_bwd_wte_sorted_kernel<T><<<N, threads, 0, c->stream>>>(dwte, dout, keys, pos, N, C);
    KC_LAUNCHED("encoder_backward_wte_sorted");
}

/* ---- LayerNorm (one warp per row, fp32 statistics) --------------------------------------------- */
template <typename T>
__global__ void ln_fwd_kernel(T *out, float *mean, float *rstd, const T *inp, const T *w,
                              const T *b, int N, int C)
{
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += kc_f(x[c]);
    float m = warp_sum(s) / C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = kc_f(x[c]) - m;
        v += d * d;
    }
    float r = rsqrtf(warp_sum(v) / C + 1e-5f);
    T *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) o[c] = kc_to<T>((kc_f(x[c]) - m) * r * kc_f(w[c]) + kc_f(b[c]));
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = r;
    }
}

template <typename T>
void kc_layernorm_forward(T *out, float *mean, float *rstd, const T *inp, const T *w, const T *b,
                          int N, int C)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || N <= 0) return;
    ln_fwd_kernel<T><<<kc_blocks(N, 8), 256, 0, c->stream>>>(out, mean, rstd, inp, w, b, N, C);
    KC_LAUNCHED("layernorm_forward");
}

/* dinp (row) += (dn - mean(dn) - xhat * mean(dn * xhat)) * rstd, dn = dout * w. */
template <typename T>
__global__ void ln_bwd_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *w,
                                   const float *mean, const float *rstd, int N, int C)
{
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C, *d = dout + (size_t)row * C;
    float m = mean[row], r = rstd[row], a = 0.0f, bsum = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float dn = kc_f(d[c]) * kc_f(w[c]);
        a += dn;
        bsum += dn * (kc_f(x[c]) - m) * r;
    }
    a = warp_sum(a) / C;
    bsum = warp_sum(bsum) / C;
    T *di = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        float xhat = (kc_f(x[c]) - m) * r, dn = kc_f(d[c]) * kc_f(w[c]);
        di[c] = kc_to<T>(kc_f(di[c]) + (dn - a - xhat * bsum) * r);
    }
}

/* Column sums, stage 1: block (32, 8) covers 32 columns of one chunk of rows; each thread sums
 * its rows in order, then the 8 row lanes are added in order. With LN set, the kernel produces
 * both sum(dout * xhat) (into p0) and sum(dout) (into p1); otherwise only sum(src) into p0. */
template <typename T, bool LN>
__global__ void colsum_partial_kernel(float *p0, float *p1, const T *src, const T *inp,
                                      const float *mean, const float *rstd, int rows, int cols,
                                      int rows_per_chunk)
{
    __shared__ float s0[8][33], s1[8][33];
    int tx = threadIdx.x, ty = threadIdx.y, col = blockIdx.x * 32 + tx, chunk = blockIdx.y;
    int r0 = chunk * rows_per_chunk, r1 = min(rows, r0 + rows_per_chunk);
    float a0 = 0.0f, a1 = 0.0f;
    if (col < cols)
        for (int r = r0 + ty; r < r1; r += 8) {
            float d = kc_f(src[(size_t)r * cols + col]);
            if (LN) {
                a0 += d * (kc_f(inp[(size_t)r * cols + col]) - mean[r]) * rstd[r];
                a1 += d;
            } else {
                a0 += d;
            }
        }
    s0[ty][tx] = a0;
    s1[ty][tx] = a1;
    __syncthreads();
    if (ty == 0 && col < cols) {
        float t0 = 0.0f, t1 = 0.0f;
        for (int i = 0; i < 8; i++) { t0 += s0[i][tx]; t1 += s1[i][tx]; }
        p0[(size_t)chunk * cols + col] = t0;
        if (LN) p1[(size_t)chunk * cols + col] = t1;
    }
}

/* Stage 2: dst[c] += sum over chunks, chunks in order. */
__global__ void colsum_final_kernel(float *d0, float *d1, const float *p0, const float *p1,
                                    int chunks, int cols)
{
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    float t0 = 0.0f, t1 = 0.0f;
    for (int k = 0; k < chunks; k++) {
        t0 += p0[(size_t)k * cols + col];
        if (d1) t1 += p1[(size_t)k * cols + col];
    }
    d0[col] += t0;
    if (d1) d1[col] += t1;
}

/* Chunking depends on rows only, so the summation order is fixed for a shape. */
static int colsum_chunks(int rows, int *per)
{
    int chunks = (rows + 63) / 64;
    if (chunks > 256) chunks = 256;
    if (chunks < 1) chunks = 1;
    *per = (rows + chunks - 1) / chunks;
    return chunks;
}

template <typename T>
void kc_colsum_add(float *dst, const T *src, int rows, int cols)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || rows <= 0 || cols <= 0) return;
    int per, chunks = colsum_chunks(rows, &per);
    float *p = (float *)kc_scratch((size_t)chunks * cols * sizeof(float));
    if (!p) return;
    dim3 grid((cols + 31) / 32, chunks), block(32, 8);
    colsum_partial_kernel<T, false><<<grid, block, 0, c->stream>>>(p, NULL, src, NULL, NULL, NULL,
                                                                   rows, cols, per);
    KC_LAUNCHED("colsum_partial");
    colsum_final_kernel<<<kc_blocks(cols, 256), 256, 0, c->stream>>>(dst, NULL, p, NULL, chunks, cols);
    KC_LAUNCHED("colsum_final");
}

template <typename T>
void kc_layernorm_backward(T *dinp, float *dw, float *db, const T *dout, const T *inp, const T *w,
                           const float *mean, const float *rstd, int N, int C)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || N <= 0 || C <= 0) return;
    /* dw, db first, then dinp: correct even when dinp aliases dout (it is read per row before
     * being written within the dinp kernel, but the column sums need the original). */
    int per, chunks = colsum_chunks(N, &per);
    float *p = (float *)kc_scratch(2 * (size_t)chunks * C * sizeof(float));
    if (!p) return;
    float *p0 = p, *p1 = p + (size_t)chunks * C;
    dim3 grid((C + 31) / 32, chunks), block(32, 8);
    colsum_partial_kernel<T, true><<<grid, block, 0, c->stream>>>(p0, p1, dout, inp, mean, rstd, N,
                                                                  C, per);
    KC_LAUNCHED("layernorm_backward_partial");
    colsum_final_kernel<<<kc_blocks(C, 256), 256, 0, c->stream>>>(dw, db, p0, p1, chunks, C);
    KC_LAUNCHED("layernorm_backward_final");
    ln_bwd_dinp_kernel<T><<<kc_blocks(N, 8), 256, 0, c->stream>>>(dinp, dout, inp, w, mean, rstd, N, C);
    KC_LAUNCHED("layernorm_backward_dinp");
}

/* ---- elementwise ------------------------------------------------------------------------------------- */
template <typename T>
__global__ void gelu_fwd_kernel(T *out, const T *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = kc_f(inp[i]);
        out[i] = kc_to<T>(0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x))));
    }
}
template <typename T>
__global__ void gelu_bwd_kernel(T *dinp, const T *inp, const T *dout, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = kc_f(inp[i]);
        float th = tanhf(GELU_SCALE * (x + 0.044715f * x * x * x));
        float g = 0.5f * (1.0f + th) +
                  0.5f * x * (1.0f - th * th) * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = kc_to<T>(g * kc_f(dout[i]));
    }
}
template <typename T>
__global__ void residual_kernel(T *out, const T *a, const T *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = kc_to<T>(kc_f(a[i]) + kc_f(b[i]));
}
__global__ void relu_fwd_kernel(float *out, const float *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}
__global__ void relu_bwd_kernel(float *dinp, const float *inp, const float *dout, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dinp[i] = inp[i] > 0.0f ? dout[i] : 0.0f;
}
__global__ void scale_kernel(float *x, float s, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

template <typename T>
void kc_gelu_forward(T *out, const T *inp, size_t n)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || n == 0) return;
    gelu_fwd_kernel<T><<<ew_blocks(n), 256, 0, c->stream>>>(out, inp, n);
    KC_LAUNCHED("gelu_forward");
}
template <typename T>
void kc_gelu_backward(T *dinp, const T *inp, const T *dout, size_t n)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || n == 0) return;
    gelu_bwd_kernel<T><<<ew_blocks(n), 256, 0, c->stream>>>(dinp, inp, dout, n);
    KC_LAUNCHED("gelu_backward");
}
template <typename T>
void kc_residual_forward(T *out, const T *a, const T *b, size_t n)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || n == 0) return;
    residual_kernel<T><<<ew_blocks(n), 256, 0, c->stream>>>(out, a, b, n);
    KC_LAUNCHED("residual_forward");
}
void kc_relu_forward(float *out, const float *inp, size_t n)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || n == 0) return;
    relu_fwd_kernel<<<ew_blocks(n), 256, 0, c->stream>>>(out, inp, n);
    KC_LAUNCHED("relu_forward");
}
void kc_relu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || n == 0) return;
    relu_bwd_kernel<<<ew_blocks(n), 256, 0, c->stream>>>(dinp, inp, dout, n);
    KC_LAUNCHED("relu_backward");
}
void kc_scale(float *x, float s, size_t n)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || n == 0) return;
    scale_kernel<<<ew_blocks(n), 256, 0, c->stream>>>(x, s, n);
    KC_LAUNCHED("scale");
}

/* ---- softmax cross-entropy (one block per row) ------------------------------------------------------ */
/* probs = softmax, losses when targets. probs may alias logits: each element is read and then
 * written by the same thread, after both reductions have finished. */
__global__ void xent_kernel(float *out, float *losses, const float *logits, const int32_t *targets,
                            int V, int Vp)
{
    size_t row = blockIdx.x;
    const float *l = logits + row * Vp;
    float *o = out + row * Vp;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, kc_f(l[j]));
    mx = block_max(mx);
    float s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += expf(kc_f(l[j]) - mx);
    s = block_sum(s);
    float lse = mx + logf(s);
    int tgt = targets ? targets[row] : -1;
    if (threadIdx.x == 0 && targets && losses)
        losses[row] = (tgt >= 0 && tgt < V) ? lse - kc_f(l[tgt]) : NAN;
    __syncthreads(); /* l[tgt] is read above before anyone overwrites it below */
    for (int j = threadIdx.x; j < Vp; j += blockDim.x) o[j] = j < V ? expf(kc_f(l[j]) - lse) : 0.0f;
}

__global__ void xent_bwd_kernel(float *dlogits, const float *probs, const int32_t *targets,
                                float dloss, int N, int V, int Vp)
{
    size_t total = (size_t)N * Vp;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int j = (int)(i % Vp);
        float p = j < V ? probs[i] : 0.0f;
        dlogits[i] = j < V ? (p - (j == targets[i / Vp] ? 1.0f : 0.0f)) * dloss : 0.0f;
    }
}

void kc_xent_forward(float *probs, float *losses, const float *logits, const int32_t *targets,
                     int N, int V, int Vp)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || N <= 0) return;
    xent_kernel<<<N, 512, 0, c->stream>>>(probs, losses, logits, targets, V, Vp);
    KC_LAUNCHED("xent_forward");
}
void kc_xent_backward(float *dlogits, const float *probs, const int32_t *targets, float dloss,
                      int N, int V, int Vp)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || N <= 0) return;
    xent_bwd_kernel<<<ew_blocks((size_t)N * Vp), 256, 0, c->stream>>>(dlogits, probs, targets, dloss, N, V, Vp);
    KC_LAUNCHED("xent_backward");
}
/* ---- AdamW, norms ----------------------------------------------------------------------------------- */
/* bc1, bc2: bias corrections 1 - beta^t, computed on the host in double. */
__global__ void adamw_kernel(float *param, bf16 *param_bf16, const float *grad, float *m, float *v,
                             size_t n, float lr, float beta1, float beta2, float eps, float wd,
                             float gs, float bc1, float bc2)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = grad[i] * gs;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float p = param[i];
        p -= lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * p);
        param[i] = p;
        if (param_bf16) param_bf16[i] = __float2bfloat16_rn(p);
    }
}

void kc_adamw(float *param, bf16 *param_bf16, const float *grad, float *m, float *v, size_t n,
              float lr, float beta1, float beta2, float eps, float wd, float grad_scale, int64_t t)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || n == 0) return;
    double bc1 = 1.0 - pow((double)beta1, (double)t), bc2 = 1.0 - pow((double)beta2, (double)t);
    adamw_kernel<<<ew_blocks(n), 256, 0, c->stream>>>(param, param_bf16, grad, m, v, n, lr, beta1,
                                                      beta2, eps, wd, grad_scale, (float)bc1,
                                                      (float)bc2);
    KC_LAUNCHED("adamw");
}

/* Sum of squares: stage 1 with a block count that depends on n only, each block reducing its
 * grid-stride share in double; stage 2 one block adding the partials in order. */
#define SUMSQ_MAX_BLOCKS 1024
__global__ void sumsq_partial_kernel(double *part, const float *x, size_t n)
{
    double acc = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc += (double)x[i] * x[i];
    __shared__ double sh[32];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    acc = warp_sum_d(acc);
    if (lane == 0) sh[wid] = acc;
    __syncthreads();
    if (wid == 0) {
        double r = lane < (int)(blockDim.x >> 5) ? sh[lane] : 0.0;
        r = warp_sum_d(r);
        if (lane == 0) part[blockIdx.x] = r;
    }
}
__global__ void sumsq_final_kernel(double *out, const double *part, int nparts)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double s = 0.0;
    for (int i = 0; i < nparts; i++) s += part[i];
    *out = s;
}
double kc_sumsq(const float *x, size_t n)
{
    kc_ctx_t *c = kc_ctx();
    if (!c) return NAN;
    /* The result slot lives past the partials in the same scratch (one allocation). */
    double *buf = (double *)kc_scratch((SUMSQ_MAX_BLOCKS + 1) * sizeof(double));
    if (!buf) return NAN;
    size_t nb = (n + 2047) / 2048;
    int blocks = (int)(nb < 1 ? 1 : (nb > SUMSQ_MAX_BLOCKS ? SUMSQ_MAX_BLOCKS : nb));
    sumsq_partial_kernel<<<blocks, 256, 0, c->stream>>>(buf, x, n);
    KC_LAUNCHED("sumsq_partial");
    sumsq_final_kernel<<<1, 32, 0, c->stream>>>(buf + SUMSQ_MAX_BLOCKS, buf, blocks);
    KC_LAUNCHED("sumsq_final");
    double r = NAN;
    KC_CUDA(cudaMemcpyAsync(&r, buf + SUMSQ_MAX_BLOCKS, sizeof(double), cudaMemcpyDeviceToHost,
                            c->stream));
    KC_CUDA(cudaStreamSynchronize(c->stream));
    return r;
}

/* ---- instantiations ------------------------------------------------------------------------------ */
#define KC_INST(T)                                                                                   \
    template void kc_encoder_forward<T>(T *, const int32_t *, const T *, const T *, int, int, int); \
    template void kc_encoder_backward<T>(float *, float *, const T *, const int32_t *, int, int, int); \
    template void kc_layernorm_forward<T>(T *, float *, float *, const T *, const T *, const T *, int, int); \
    template void kc_layernorm_backward<T>(T *, float *, float *, const T *, const T *, const T *, \
                                           const float *, const float *, int, int);            \
    template void kc_colsum_add<T>(float *, const T *, int, int);                              \
    template void kc_gelu_forward<T>(T *, const T *, size_t);                                  \
    template void kc_gelu_backward<T>(T *, const T *, const T *, size_t);                      \
    template void kc_residual_forward<T>(T *, const T *, const T *, size_t);
KC_INST(float)
