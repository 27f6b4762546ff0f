/* cpu.c - the CPU backend (eng_cpu_backend): GEMMs through OpenBLAS (its OpenMP build, so BLAS
 * and these kernels share libgomp's one thread pool), everything else as OpenMP loops the
 * compiler vectorises (AVX-512 where present). Every kernel partitions work statically and
 * reduces in a fixed order, so results are bit-identical run to run for a given thread count.
 * The plain reference each kernel is tested against is engine/ref/ref.c. */
#pragma GCC target("prefer-vector-width=512")
/* ISO C mode (-std=c11) turns off FMA contraction; the kernels want fused multiply-adds. */
#pragma GCC optimize("fp-contract=fast")
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/bf16.h"
#include "engine/cpu/cpu_int.h"

void openblas_set_num_threads(int num_threads);

/* ---- threads and memory --------------------------------------------------------------------- */

void eng_cpu_set_threads(int n)
{
    if (n <= 0) return;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

int eng_cpu_threads(void) { return omp_get_max_threads(); }

/* Allocations carry a 64-byte header saying how they were made. From LAZY_BYTES on they are
 * anonymous mappings: zero pages the kernel backs only when first touched, so a buffer laid out
 * for the whole model costs only the parts a rank uses (a pipeline stage, a ZeRO shard), and
 * cpu_discard can give parts back. Smaller ones come from the heap. */
#define HDR 64
#define LAZY_BYTES ((size_t)1 << 20)
typedef struct alloc_hdr {
    size_t map_bytes; /* length of the mapping, or 0 for a heap block */
} alloc_hdr_t;

static void *cpu_alloc(size_t bytes)
{
    size_t n = (bytes + 63) / 64 * 64 + HDR;
    char *p;
    if (bytes >= LAZY_BYTES) {
        p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) return NULL;
        ((alloc_hdr_t *)p)->map_bytes = n;
    } else {
        void *q = NULL;
        if (posix_memalign(&q, 64, n) != 0) return NULL;
        memset(q, 0, n);
        p = q;
        ((alloc_hdr_t *)p)->map_bytes = 0;
    }
    return p + HDR;
}

static void cpu_free(void *q)
{
    if (!q) return;
    char *p = (char *)q - HDR;
    size_t map = ((alloc_hdr_t *)p)->map_bytes;
    if (map)
        munmap(p, map);
    else
        free(p);
}

/* The pages wholly inside [p, p + bytes) become fresh zero pages again. */
static void cpu_discard(void *p, size_t bytes)
{
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + pg - 1) & ~(pg - 1), e = ((uintptr_t)p + bytes) & ~(pg - 1);
    if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
}

/* Large clears and copies (a step's gradients, activations between blocks) are split over the
 * threads in page-aligned pieces; small ones are not worth waking the pool for. */
#define PAR_BYTES ((size_t)1 << 20)
/* This thread's page-aligned piece [*lo, *hi) of n bytes (inside a parallel region). */
static void par_piece(size_t n, size_t *lo, size_t *hi)
{
    size_t nt = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
    *lo = n * id / nt / 4096 * 4096;
    *hi = id + 1 == nt ? n : n * (id + 1) / nt / 4096 * 4096;
}
static void cpu_memset_zero(void *d, size_t n)
{
    if (n < PAR_BYTES || omp_get_max_threads() == 1) {
        memset(d, 0, n);
        return;
    }
#pragma omp parallel
    {
        size_t lo, hi;
        par_piece(n, &lo, &hi);
        memset((char *)d + lo, 0, hi - lo);
    }
}
static void cpu_copy(void *d, const void *s, size_t n)
{
    char *dc = d;
    const char *sc = s;
    if (n < PAR_BYTES || omp_get_max_threads() == 1 || (dc < sc + n && sc < dc + n)) {
        memmove(d, s, n);
        return;
    }
#pragma omp parallel
    {
        size_t lo, hi;
        par_piece(n, &lo, &hi);
        memcpy(dc + lo, sc + lo, hi - lo);
    }
}
static void cpu_sync(void) {}
static int cpu_status(void *ctx, kiln_err_t *err)
{
    (void)ctx;
    return eng_cpu_onednn_status(err);
}

/* ---- vectorisable math ------------------------------------------------------------------------ */

/* expf good to ~2 ulp over the float range; written so `omp simd` loops vectorise it (Cephes
 * polynomial on [-ln2/2, ln2/2], exponent built from the integer part). */
static inline float fast_expf(float x)
{
    x = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);
    float k = __builtin_rintf(x * 1.44269504088896341f);
    float r = x - k * 0.693359375f + k * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } u;
    u.i = ((int32_t)k + 127) << 23;
    return p * u.f;
}

/* tanh(u) = 1 - 2 / (exp(2u) + 1); saturates correctly at both ends. */
static inline float fast_tanhf(float u)
{
    return 1.0f - 2.0f / (fast_expf(2.0f * u) + 1.0f);
}

/* ---- encoder -------------------------------------------------------------------------------- */

static void cpu_encoder_forward(float *out, const int32_t *inp, const float *wte,
                                const float *wpe, int B, int T, int C)
{
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        float *o = out + (size_t)bt * C;
        const float *we = wte + (size_t)inp[bt] * C, *wp = wpe + (size_t)(bt % T) * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = we[c] + wp[c];
    }
}

/* Parallel over channel ranges: each thread owns columns of dwte/dwpe, so repeated tokens never
 * race and the summation order (b, t ascending) is fixed. */
static void cpu_encoder_backward(float *dwte, float *dwpe, const float *dout,
                                 const int32_t *inp, int B, int T, int C)
{
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int c0 = (int)((long)C * id / nt), c1 = (int)((long)C * (id + 1) / nt);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                const float *d = dout + ((size_t)b * T + t) * C;
                float *we = dwte + (size_t)inp[b * T + t] * C, *wp = dwpe + (size_t)t * C;
#pragma omp simd
                for (int c = c0; c < c1; c++) { we[c] += d[c]; wp[c] += d[c]; }
            }
    }
}

/* ---- layernorm -------------------------------------------------------------------------------- */

static void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                  const float *w, const float *b, int N, int C)
{
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float *o = out + (size_t)i * C;
        float m = 0.0f, v = 0.0f;
#pragma omp simd reduction(+ : m)
        for (int c = 0; c < C; c++) m += x[c];
        m /= (float)C;
#pragma omp simd reduction(+ : v)
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        v /= (float)C;
        float s = 1.0f / sqrtf(v + 1e-5f);
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * w[c] + b[c];
        mean[i] = m;
        rstd[i] = s;
    }
}

/* dinp per row in parallel; dw/db by channel ranges over all rows (no races, fixed order). */
static void cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                   const float *inp, const float *w, const float *mean,
                                   const float *rstd, int N, int C)
{
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int i = 0; i < N; i++) {
            const float *x = inp + (size_t)i * C, *d = dout + (size_t)i * C;
            float *di = dinp + (size_t)i * C;
            float m = mean[i], s = rstd[i], dn_mean = 0.0f, dn_xhat_mean = 0.0f;
#pragma omp simd reduction(+ : dn_mean, dn_xhat_mean)
            for (int c = 0; c < C; c++) {
                float dn = d[c] * w[c];
                dn_mean += dn;
                dn_xhat_mean += dn * (x[c] - m) * s;
            }
            dn_mean /= (float)C;
            dn_xhat_mean /= (float)C;
#pragma omp simd
            for (int c = 0; c < C; c++) {
                float xhat = (x[c] - m) * s;
                di[c] += (d[c] * w[c] - dn_mean - xhat * dn_xhat_mean) * s;
            }
        }
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int c0 = (int)((long)C * id / nt), c1 = (int)((long)C * (id + 1) / nt);
        for (int i = 0; i < N; i++) {
            const float *x = inp + (size_t)i * C, *d = dout + (size_t)i * C;
            float m = mean[i], s = rstd[i];
#pragma omp simd
            for (int c = c0; c < c1; c++) {
                dw[c] += d[c] * (x[c] - m) * s;
                db[c] += d[c];
            }
        }
    }
}

/* ---- matmul ----------------------------------------------------------------------------------- */

/* fp32 GEMMs run on OpenBLAS, or on oneDNN's AVX-512 kernels where OPENBLAS_CORETYPE holds
 * OpenBLAS back (onednn.c, eng_cpu_onednn_sgemm). */
static void cpu_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                               int N, int C, int OC)
{
    if (eng_cpu_onednn_sgemm(NULL)) {
        eng_cpu_onednn_sgemm_forward(out, inp, w, bias, N, C, OC);
        return;
    }
    /* OpenBLAS computes C = beta C, then C += A B. Its beta = 0 pass is slower than memset
     * (1-5% of a GEMM here), so C is always prepared by us and beta is 1: same bits. */
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < N; i++)
            memcpy(out + (size_t)i * OC, bias, sizeof(float) * OC);
    } else {
        cpu_memset_zero(out, sizeof(float) * (size_t)N * OC);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C, 1.0f, out,
                OC);
}

/* Two threads run the two GEMMs of matmul_backward side by side (below; OpenBLAS only). */
static bool cpu_matmul_backward_joint(void) { return omp_get_max_threads() == 2 && !eng_cpu_onednn_sgemm(NULL); }

static void cpu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                                const float *inp, const float *w, int N, int C, int OC)
{
    /* dinp and dw are two GEMMs of the same N*C*OC size and independent of each other. On two
     * threads, running them side by side, one thread each, beats splitting each across both
     * threads in turn: no synchronisation inside OpenBLAS, and its packing is done once per
     * GEMM instead of shared. (OpenBLAS's OpenMP build runs single-threaded inside a parallel
     * region; it splits no GEMM along K, so the results are the same bits either way.) */
    if (eng_cpu_onednn_sgemm(NULL)) {
        eng_cpu_onednn_sgemm_backward(dinp, dw, dout, inp, w, N, C, OC);
    } else if (dinp && dw && cpu_matmul_backward_joint()) {
#pragma omp parallel sections num_threads(2)
        {
#pragma omp section
            {
                memset(dinp, 0, sizeof(float) * (size_t)N * C); /* see cpu_matmul_forward */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, w,
                            C, 1.0f, dinp, C);
            }
#pragma omp section
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C,
                        1.0f, dw, C);
        }
    } else {
        if (dinp) {
            cpu_memset_zero(dinp, sizeof(float) * (size_t)N * C);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, w, C,
                        1.0f, dinp, C);
        }
        if (dw)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C,
                        1.0f, dw, C);
    }
    if (dbias) eng_cpu_colsum_acc(dbias, dout, N, OC);
}

/* Each thread owns a range of columns and adds the rows in order: no races, a fixed order. */
void eng_cpu_colsum_acc(float *dbias, const float *dout, int N, int OC)
{
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int o0 = (int)((long)OC * id / nt), o1 = (int)((long)OC * (id + 1) / nt);
        for (int i = 0; i < N; i++) {
            const float *d = dout + (size_t)i * OC;
#pragma omp simd
            for (int o = o0; o < o1; o++) dbias[o] += d[o];
        }
    }
}

/* ---- attention -------------------------------------------------------------------------------- */

/* Causal attention skips the masked upper triangle. Head size 64 with T <= 256 (GPT-2's heads
 * at training lengths) runs the AVX-512 kernels below, 4 query rows at a time against only the
 * keys they see. Other shapes go through OpenBLAS: the T query rows are cut into tiles of
 * att_tile(T) rows, and a tile of rows [r0, r1) only meets keys [0, r1) (5/8 of the full T x T
 * work at T = 128); per (batch, head), in parallel: S = Q K^T / sqrt(hs) by sgemm straight out of
 * the strided qkv buffer, causal softmax per row, out = P V by sgemm. OpenBLAS runs
 * single-threaded inside the parallel region (it checks omp_in_parallel), so the pool is not
 * oversubscribed. Masked entries of att are written as zeros either way. */
static int att_tile(int T) { return T >= 512 ? 128 : (T >= 256 ? 64 : 32); }

#if defined(__AVX512F__)
#include <immintrin.h>
/* Hand-written kernels for the common head size 64 with T <= ATT_KMAX, where the per-head
 * sgemm calls are small enough that OpenBLAS's per-call packing dominates. They touch only the
 * causal lower triangle, 4 query rows at a time, with the row block's scores kept in the att
 * rows they belong to. */
#define ATT_KMAX 256
/* Keep loaded vectors in registers: otherwise GCC folds each use into its FMA as a memory
 * operand, reloading the same 64 bytes 4 times, and the kernels run load-bound at half speed. */
#define ATT_REGS2(a, b) __asm__("" : "+v"(a), "+v"(b))
#define ATT_REGS4(a, b, c, d) __asm__("" : "+v"(a), "+v"(b), "+v"(c), "+v"(d))

/* kt (64, Tp): k^T times scale, zero past T, so 16-key columns load whole */
static void att_pack_t(float *kt, const float *k, int T, int Tp, int ld, float scale)
{
    for (int j = 0; j < Tp; j++) {
        const float *kr = k + (size_t)j * ld;
        for (int d = 0; d < 64; d++) kt[d * Tp + j] = j < T ? kr[d] * scale : 0.0f;
    }
}

/* s[r][j] = sum_d x[r][d] * kt[d][j] for the 4 rows i0..i0+3 (rows past T repeat the last) and
 * keys j in [0, nk) (nk a multiple of 16, <= Tp); row r is stored at s + r * lds, columns past
 * T masked off. */
static void att_rows_nt(float *s, int lds, const float *x, int ldx, int i0, int T, const float *kt,
                        int Tp, int nk)
{
    const float *xr[4];
    for (int r = 0; r < 4; r++) xr[r] = x + (size_t)(i0 + r < T ? i0 + r : T - 1) * ldx;
    for (int j = 0; j < nk; j += 32) {
        bool two = j + 16 < nk;
        __m512 a00 = _mm512_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00,
               a30 = a00, a31 = a00;
        for (int d = 0; d < 64; d++) {
            __m512 b0 = _mm512_loadu_ps(kt + d * Tp + j);
            __m512 b1 = two ? _mm512_loadu_ps(kt + d * Tp + j + 16) : b0;
            ATT_REGS2(b0, b1);
            __m512 q0 = _mm512_set1_ps(xr[0][d]), q1 = _mm512_set1_ps(xr[1][d]);
            __m512 q2 = _mm512_set1_ps(xr[2][d]), q3 = _mm512_set1_ps(xr[3][d]);
            a00 = _mm512_fmadd_ps(q0, b0, a00); a01 = _mm512_fmadd_ps(q0, b1, a01);
            a10 = _mm512_fmadd_ps(q1, b0, a10); a11 = _mm512_fmadd_ps(q1, b1, a11);
            a20 = _mm512_fmadd_ps(q2, b0, a20); a21 = _mm512_fmadd_ps(q2, b1, a21);
            a30 = _mm512_fmadd_ps(q3, b0, a30); a31 = _mm512_fmadd_ps(q3, b1, a31);
        }
        __m512 acc[4][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
        for (int r = 0; r < 4 && i0 + r < T; r++)
            for (int h = 0; h < (two ? 2 : 1); h++) {
                int c0 = j + 16 * h;
                __mmask16 m = T - c0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (T - c0)) - 1);
                _mm512_mask_storeu_ps(s + (size_t)r * lds + c0, m, acc[r][h]);
            }
    }
}

/* o[r][0:64] (= or +=) sum_{k < nk} p[r][k] * y[k][0:64] for the 4 rows i0..i0+3 < T */
static void att_rows_nn(float *o, int ldo, const float *p, int ldp, int i0, int T, const float *y,
                        int ldy, int nk, bool accumulate)
{
    const float *pr[4];
    for (int r = 0; r < 4; r++) pr[r] = p + (size_t)(i0 + r < T ? i0 + r : T - 1) * ldp;
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
    for (int k = 0; k < nk; k++) {
        const float *yr = y + (size_t)k * ldy;
        __m512 y0 = _mm512_loadu_ps(yr), y1 = _mm512_loadu_ps(yr + 16);
        __m512 y2 = _mm512_loadu_ps(yr + 32), y3 = _mm512_loadu_ps(yr + 48);
        ATT_REGS4(y0, y1, y2, y3);
        for (int r = 0; r < 4; r++) {
            __m512 pb = _mm512_set1_ps(pr[r][k]);
            acc[r][0] = _mm512_fmadd_ps(pb, y0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(pb, y1, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(pb, y2, acc[r][2]);
            acc[r][3] = _mm512_fmadd_ps(pb, y3, acc[r][3]);
        }
    }
    for (int r = 0; r < 4 && i0 + r < T; r++)
        for (int c = 0; c < 4; c++) {
            float *dst = o + (size_t)(i0 + r) * ldo + 16 * c;
            _mm512_storeu_ps(dst, accumulate ? _mm512_add_ps(_mm512_loadu_ps(dst), acc[r][c])
                                             : acc[r][c]);
        }
}

/* o[c][0:64] = sum_{r >= c} p[r][c] * x[r][0:64] for the 4 keys c0..c0+3 < T (p lower
 * triangular, so rows before c0 contribute nothing) */
static void att_cols_tn(float *o, int ldo, const float *p, int ldp, int c0, int T, const float *x,
                        int ldx)
{
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
    int nc = T - c0 < 4 ? T - c0 : 4;
    for (int r = c0; r < T; r++) {
        const float *xr = x + (size_t)r * ldx, *prow = p + (size_t)r * ldp + c0;
        __m512 x0 = _mm512_loadu_ps(xr), x1 = _mm512_loadu_ps(xr + 16);
        __m512 x2 = _mm512_loadu_ps(xr + 32), x3 = _mm512_loadu_ps(xr + 48);
        ATT_REGS4(x0, x1, x2, x3);
        for (int c = 0; c < 4; c++) {
            __m512 pb = _mm512_set1_ps(c < nc ? prow[c] : 0.0f);
            acc[c][0] = _mm512_fmadd_ps(pb, x0, acc[c][0]);
            acc[c][1] = _mm512_fmadd_ps(pb, x1, acc[c][1]);
            acc[c][2] = _mm512_fmadd_ps(pb, x2, acc[c][2]);
            acc[c][3] = _mm512_fmadd_ps(pb, x3, acc[c][3]);
        }
    }
    for (int c = 0; c < nc; c++)
        for (int k = 0; k < 4; k++) _mm512_storeu_ps(o + (size_t)(c0 + c) * ldo + 16 * k, acc[c][k]);
}

/* fast_expf, 16 lanes at a time (the same polynomial, with fused multiply-adds) */
static inline __m512 exp512(__m512 x)
{
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.7f)), _mm512_set1_ps(-87.3f));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fmadd_ps(k, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

static inline __mmask16 att_mask(int left)
{
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

/* Causal softmax of row t in place (columns <= t), zeros after. Masked 16-lane chunks: the
 * row lengths 1..T are rarely multiples of 16, and scalar remainders cost more than the rest. */
static void att_softmax_row(float *row, int t, int T)
{
    int n = t + 1;
    __m512 vm = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < n; j += 16)
        vm = _mm512_max_ps(vm, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), att_mask(n - j), row + j));
    __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vm)), vs = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) {
        __mmask16 m = att_mask(n - j);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + j), mx));
        _mm512_mask_storeu_ps(row + j, m, e);
        vs = _mm512_mask_add_ps(vs, m, vs, e);
    }
    __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vs));
    for (int j = 0; j < n; j += 16) {
        __mmask16 m = att_mask(n - j);
        _mm512_mask_storeu_ps(row + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), inv));
    }
    memset(row + n, 0, (size_t)(T - n) * sizeof(float));
}

/* Softmax backward of row t in place: dr = ar (dr - <ar, dr>) scale over columns <= t. */
static void att_softmax_bwd_row(float *dr, const float *ar, int t, int T, float scale)
{
    int n = t + 1;
    __m512 vd = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) {
        __mmask16 m = att_mask(n - j);
        vd = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, ar + j), _mm512_maskz_loadu_ps(m, dr + j), vd);
    }
    __m512 dot = _mm512_set1_ps(_mm512_reduce_add_ps(vd)), sc = _mm512_set1_ps(scale);
    for (int j = 0; j < n; j += 16) {
        __mmask16 m = att_mask(n - j);
        __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, dr + j), dot);
        _mm512_mask_storeu_ps(dr + j, m, _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, ar + j), d), sc));
    }
    memset(dr + n, 0, (size_t)(T - n) * sizeof(float));
}

static bool att_fast(int T, int hs) { return hs == 64 && T <= ATT_KMAX; }

static void att_fwd_bh(float *out, int ldo, float *a, const float *q, const float *k,
                       const float *v, int T, int C3, float scale)
{
    float kt[64 * ATT_KMAX];
    int Tp = (T + 15) & ~15;
    att_pack_t(kt, k, T, Tp, C3, scale);
    for (int i0 = 0; i0 < T; i0 += 4) {
        int kend = i0 + 4 < T ? i0 + 4 : T, nk = (kend + 15) & ~15;
        att_rows_nt(a + (size_t)i0 * T, T, q, C3, i0, T, kt, Tp, nk);
        for (int t = i0; t < kend; t++) att_softmax_row(a + (size_t)t * T, t, T);
        att_rows_nn(out, ldo, a, T, i0, T, v, C3, kend, false);
    }
}

static void att_bwd_bh(float *dq, float *dk, float *dv, float *ds, const float *a,
                       const float *dout, int ldd, const float *q, const float *k, const float *v,
                       int T, int C3, float scale)
{
    float vt[64 * ATT_KMAX];
    int Tp = (T + 15) & ~15;
    att_pack_t(vt, v, T, Tp, C3, 1.0f);
    for (int i0 = 0; i0 < T; i0 += 4) {
        int kend = i0 + 4 < T ? i0 + 4 : T, nk = (kend + 15) & ~15;
        /* dP = dO V^T, then dS = P (dP - rowdot) scale, then dQ = dS K */
        att_rows_nt(ds + (size_t)i0 * T, T, dout, ldd, i0, T, vt, Tp, nk);
        for (int t = i0; t < kend; t++)
            att_softmax_bwd_row(ds + (size_t)t * T, a + (size_t)t * T, t, T, scale);
        att_rows_nn(dq, C3, ds, T, i0, T, k, C3, kend, false);
    }
    for (int c0 = 0; c0 < T; c0 += 4) {
        att_cols_tn(dk, C3, ds, T, c0, T, q, C3); /* dK = dS^T Q */
        att_cols_tn(dv, C3, a, T, c0, T, dout, ldd); /* dV = P^T dO */
    }
}
#else
/* Causal softmax of row t in place (columns <= t), zeros after. */
static void att_softmax_row(float *row, int t, int T)
{
    float mx = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : mx)
    for (int u = 0; u <= t; u++) mx = row[u] > mx ? row[u] : mx;
#pragma omp simd reduction(+ : sum)
    for (int u = 0; u <= t; u++) {
        row[u] = fast_expf(row[u] - mx);
        sum += row[u];
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int u = 0; u <= t; u++) row[u] *= inv;
    memset(row + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
}

/* Softmax backward of row t in place: dr = ar (dr - <ar, dr>) scale over columns <= t. */
static void att_softmax_bwd_row(float *dr, const float *ar, int t, int T, float scale)
{
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int u = 0; u <= t; u++) dot += ar[u] * dr[u];
#pragma omp simd
    for (int u = 0; u <= t; u++) dr[u] = ar[u] * (dr[u] - dot) * scale;
    memset(dr + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
}

/* Without AVX-512 every shape takes the sgemm path; these are never called. */
static bool att_fast(int T, int hs) { (void)T; (void)hs; return false; }
static void att_fwd_bh(float *out, int ldo, float *a, const float *q, const float *k,
                       const float *v, int T, int C3, float scale)
{
    (void)out; (void)ldo; (void)a; (void)q; (void)k; (void)v; (void)T; (void)C3; (void)scale;
}
static void att_bwd_bh(float *dq, float *dk, float *dv, float *ds, const float *a,
                       const float *dout, int ldd, const float *q, const float *k, const float *v,
                       int T, int C3, float scale)
{
    (void)dq; (void)dk; (void)dv; (void)ds; (void)a; (void)dout; (void)ldd; (void)q; (void)k;
    (void)v; (void)T; (void)C3; (void)scale;
}
#endif

static void cpu_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                                  int NH)
{
    int hs = C / NH, C3 = 3 * C, tb = att_tile(T);
    bool fast = att_fast(T, hs);
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *q = qkv + (size_t)b * T * C3 + h * hs;
        const float *k = q + C, *v = q + 2 * C;
        float *a = att + (size_t)bh * T * T;
        if (fast) {
            att_fwd_bh(out + (size_t)b * T * C + h * hs, C, a, q, k, v, T, C3, scale);
            continue;
        }
        for (int r0 = 0; r0 < T; r0 += tb) {
            int r1 = r0 + tb < T ? r0 + tb : T;
            float *at = a + (size_t)r0 * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, hs, scale,
                        q + (size_t)r0 * C3, C3, k, C3, 0.0f, at, T);
            for (int t = r0; t < r1; t++) att_softmax_row(a + (size_t)t * T, t, T);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, hs, r1, 1.0f, at, T,
                        v, C3, 0.0f, out + ((size_t)b * T + r0) * C + h * hs, C);
        }
    }
}

/* The same tiles backward. Row tiles: dP = dO V^T over keys [0, r1), the softmax backward, then
 * dQ = dS K. Column tiles [c0, c1) of keys are only met by queries [c0, T):
 * dK = dS^T Q and dV = P^T dO over those rows. */
static void cpu_attention_backward(float *dqkv, float *scratch, const float *dout,
                                   const float *qkv, const float *att, int B, int T, int C,
                                   int NH)
{
    int hs = C / NH, C3 = 3 * C, tb = att_tile(T);
    bool fast = att_fast(T, hs);
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *q = qkv + (size_t)b * T * C3 + h * hs;
        const float *k = q + C, *v = q + 2 * C;
        float *dq = dqkv + (size_t)b * T * C3 + h * hs, *dk = dq + C, *dv = dq + 2 * C;
        const float *a = att + (size_t)bh * T * T;
        const float *d = dout + (size_t)b * T * C + h * hs;
        float *ds = scratch + (size_t)bh * T * T;
        if (fast) {
            att_bwd_bh(dq, dk, dv, ds, a, d, C, q, k, v, T, C3, scale);
            continue;
        }
        for (int r0 = 0; r0 < T; r0 += tb) {
            int r1 = r0 + tb < T ? r0 + tb : T;
            float *dst = ds + (size_t)r0 * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, hs, 1.0f,
                        d + (size_t)r0 * C, C, v, C3, 0.0f, dst, T);
            for (int t = r0; t < r1; t++)
                att_softmax_bwd_row(ds + (size_t)t * T, a + (size_t)t * T, t, T, scale);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, hs, r1, 1.0f, dst, T,
                        k, C3, 0.0f, dq + (size_t)r0 * C3, C3);
        }
        for (int c0 = 0; c0 < T; c0 += tb) {
            int c1 = c0 + tb < T ? c0 + tb : T;
            size_t off = (size_t)c0 * T + c0;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1 - c0, hs, T - c0, 1.0f,
                        ds + off, T, q + (size_t)c0 * C3, C3, 0.0f, dk + (size_t)c0 * C3, C3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1 - c0, hs, T - c0, 1.0f,
                        a + off, T, d + (size_t)c0 * C, C, 0.0f, dv + (size_t)c0 * C3, C3);
        }
    }
}

/* ---- pointwise -------------------------------------------------------------------------------- */

#define GELU_S 0.7978845608028654f

static void cpu_gelu_forward(float *out, const float *inp, size_t N)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + fast_tanhf(GELU_S * (x + 0.044715f * x * x * x)));
    }
}

static void cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t N)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float th = fast_tanhf(GELU_S * (x + 0.044715f * x * x * x));
        float g = 0.5f * (1.0f + th) +
                  0.5f * x * (1.0f - th * th) * GELU_S * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = g * dout[i];
    }
}

static void cpu_relu_forward(float *out, const float *inp, size_t N)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < N; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

static void cpu_relu_backward(float *dinp, const float *inp, const float *dout, size_t N)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < N; i++) dinp[i] = inp[i] > 0.0f ? dout[i] : 0.0f;
}

static void cpu_residual_forward(float *out, const float *a, const float *b, size_t N)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < N; i++) out[i] = a[i] + b[i];
}

/* ---- softmax cross-entropy ---------------------------------------------------------------------- */

static void cpu_xent_forward(float *probs, float *losses, const float *logits,
                             const int32_t *targets, int N, int V, int Vp)
{
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *l = logits + (size_t)i * Vp;
        float *p = probs + (size_t)i * Vp;
        float mx = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : mx)
        for (int j = 0; j < V; j++) mx = l[j] > mx ? l[j] : mx;
        float lt = targets ? l[targets[i]] : 0.0f; /* read before probs overwrite logits */
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < V; j++) {
            p[j] = fast_expf(l[j] - mx);
            sum += p[j];
        }
        float inv = 1.0f / sum;
#pragma omp simd
        for (int j = 0; j < V; j++) p[j] *= inv;
        for (int j = V; j < Vp; j++) p[j] = 0.0f;
        if (targets) losses[i] = mx + logf(sum) - lt;
    }
}

static void cpu_xent_backward(float *dlogits, const float *probs, const int32_t *targets,
                              float dloss, int N, int V, int Vp)
{
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *p = probs + (size_t)i * Vp;
        float *d = dlogits + (size_t)i * Vp;
#pragma omp simd
        for (int j = 0; j < V; j++) d[j] = p[j] * dloss;
        for (int j = V; j < Vp; j++) d[j] = 0.0f;
        d[targets[i]] -= dloss;
    }
}

/* The vocabulary-sliced variant (backend.h): an online softmax, one slice at a time. */
static void cpu_xent_chunk_forward(float *stats, const float *logits, const int32_t *targets,
                                   int N, int v0, int w, int V, int first)
{
    float *mx = stats, *sm = stats + N, *tl = stats + 2 * (size_t)N;
    int wv = V - v0 < w ? V - v0 : w;
    if (wv < 0) wv = 0;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *l = logits + (size_t)i * w;
        float m0 = first ? -INFINITY : mx[i], s0 = first ? 0.0f : sm[i], cm = -INFINITY;
#pragma omp simd reduction(max : cm)
        for (int j = 0; j < wv; j++) cm = l[j] > cm ? l[j] : cm;
        float nm = cm > m0 ? cm : m0, sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < wv; j++) sum += fast_expf(l[j] - nm);
        sm[i] = (s0 > 0.0f ? s0 * fast_expf(m0 - nm) : 0.0f) + sum;
        mx[i] = nm;
        if (first) tl[i] = 0.0f;
        if (targets && targets[i] >= v0 && targets[i] - v0 < wv) tl[i] = l[targets[i] - v0];
    }
}

static void cpu_xent_chunk_finish(float *losses, float *stats, int N)
{
    const float *mx = stats, *sm = stats + N, *tl = stats + 2 * (size_t)N;
    float *lse = stats + 3 * (size_t)N;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        lse[i] = mx[i] + logf(sm[i]);
        if (losses) losses[i] = lse[i] - tl[i];
    }
}

static void cpu_xent_chunk_backward(float *dlogits, const float *logits, const float *lse,
                                    const int32_t *targets, float dloss, int N, int v0, int w,
                                    int V)
{
    int wv = V - v0 < w ? V - v0 : w;
    if (wv < 0) wv = 0;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *l = logits + (size_t)i * w;
        float *d = dlogits + (size_t)i * w, z = lse[i];
#pragma omp simd
        for (int j = 0; j < wv; j++) d[j] = fast_expf(l[j] - z) * dloss;
        for (int j = wv; j < w; j++) d[j] = 0.0f;
        if (targets[i] >= v0 && targets[i] - v0 < wv) d[targets[i] - v0] -= dloss;
    }
}

/* ---- optimizer and reductions ------------------------------------------------------------------- */

/* AdamW; with wbf it also writes the updated weights rounded to bf16 (the bf16 group's entry),
 * the same arithmetic in both forms. */
static inline void adamw_body(float *param, uint16_t *wbf, const float *grad, float *m, float *v,
                              size_t n, float lr, float beta1, float beta2, float eps, float wd,
                              float grad_scale, int64_t t)
{
    float bc1 = (float)(1.0 - pow(beta1, (double)t)), bc2 = (float)(1.0 - pow(beta2, (double)t));
    float ibc1 = 1.0f / bc1, ibc2 = 1.0f / bc2;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float p = param[i];
        p = p - lr * ((mi * ibc1) / (sqrtf(vi * ibc2) + eps) + wd * p);
        param[i] = p;
        if (wbf)
            wbf[i] = eng_bf16_round(p);
    }
}

static void cpu_adamw_update(float *param, const float *grad, float *m, float *v, size_t n,
                             float lr, float beta1, float beta2, float eps, float wd,
                             float grad_scale, int64_t t)
{
    adamw_body(param, NULL, grad, m, v, n, lr, beta1, beta2, eps, wd, grad_scale, t);
}

void eng_cpu_adamw_bf16(float *param, uint16_t *param_bf16, const float *grad, float *m, float *v,
                        size_t n, float lr, float beta1, float beta2, float eps, float wd,
                        float grad_scale, int64_t t)
{
    adamw_body(param, param_bf16, grad, m, v, n, lr, beta1, beta2, eps, wd, grad_scale, t);
}

/* Fixed 16K-element chunks summed in double, chunk partials added in order: the result does
 * not depend on the thread count. */
#define SUMSQ_CHUNK 16384
static double cpu_sumsq(const float *x, size_t n)
{
    size_t nchunks = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    double stackbuf[256], *part = nchunks <= 256 ? stackbuf : malloc(sizeof(double) * nchunks);
    if (!part) { /* out of memory: fall back to one serial pass (still deterministic) */
        double s = 0;
        for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
        return s;
    }
#pragma omp parallel for schedule(static)
    for (size_t ch = 0; ch < nchunks; ch++) {
        size_t i0 = ch * SUMSQ_CHUNK, i1 = i0 + SUMSQ_CHUNK < n ? i0 + SUMSQ_CHUNK : n;
        double s = 0;
#pragma omp simd reduction(+ : s)
        for (size_t i = i0; i < i1; i++) s += (double)x[i] * x[i];
        part[ch] = s;
    }
    double s = 0;
    for (size_t ch = 0; ch < nchunks; ch++) s += part[ch];
    if (part != stackbuf) free(part);
    return s;
}

static void cpu_scale(float *x, float s, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

const eng_backend_t eng_cpu_backend = {
    .abi = ENG_BACKEND_ABI, .name = "cpu", .host_memory = true, .status = cpu_status,
    .bf16 = &eng_cpu_bf16,
    .alloc = cpu_alloc, .free = cpu_free, .discard = cpu_discard, .memset_zero = cpu_memset_zero,
    .to_device = cpu_copy, .to_host = cpu_copy, .copy = cpu_copy, .synchronize = cpu_sync,
    .encoder_forward = cpu_encoder_forward, .encoder_backward = cpu_encoder_backward,
    .layernorm_forward = cpu_layernorm_forward, .layernorm_backward = cpu_layernorm_backward,
    .matmul_forward = cpu_matmul_forward, .matmul_backward = cpu_matmul_backward,
    .matmul_backward_joint = cpu_matmul_backward_joint,
    .attention_forward = cpu_attention_forward, .attention_backward = cpu_attention_backward,
    .gelu_forward = cpu_gelu_forward, .gelu_backward = cpu_gelu_backward,
    .relu_forward = cpu_relu_forward, .relu_backward = cpu_relu_backward,
    .residual_forward = cpu_residual_forward,
    .xent_forward = cpu_xent_forward, .xent_backward = cpu_xent_backward,
    .xent_chunk_forward = cpu_xent_chunk_forward, .xent_chunk_finish = cpu_xent_chunk_finish,
    .xent_chunk_backward = cpu_xent_chunk_backward,
    .adamw_update = cpu_adamw_update, .sumsq = cpu_sumsq, .scale = cpu_scale,
};
