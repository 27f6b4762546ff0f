/* cuda_gemm.cu - the backend's GEMMs: cuBLASLt with bias / GELU epilogues (the algorithm found
 * once per shape and cached), bf16 or fp32 operands, fp32 accumulate; cublasGemmEx plus a small
 * epilogue kernel as the fallback when cuBLASLt has no algorithm for a case; strided-batched
 * GEMMs for the unfused attention. It is not a general BLAS wrapper: only what the ops need. */
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "engine/cuda/cuda_int.cuh"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

static cublasComputeType_t compute_type(kc_ctx_t *c, cudaDataType_t ab)
{
    if (ab != CUDA_R_32F) return CUBLAS_COMPUTE_32F;
    return c->mm_mode == KC_MM_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

static size_t type_size(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

/* Largest power of two (<= 256) dividing the address: cuBLASLt must be told the real alignment. */
static unsigned align_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    unsigned al = 256;
    while (al > 1 && (a % al) != 0) al >>= 1;
    return al;
}

/* ---- epilogue kernel for the fallback path ------------------------------------------------------ */
template <typename T, typename BT>
__global__ void bias_gelu_kernel(T *d, T *pre, const BT *bias, int m, int n, int ldd, bool gelu)
{
    size_t total = (size_t)m * n;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int row = (int)(i % m);
        size_t col = i / m;
        size_t at = col * ldd + row;
        float x = kc_f(d[at]);
        if (bias) x += kc_f(bias[row]);
        if (gelu) {
            if (pre) pre[at] = kc_to<T>(x);
            float u = GELU_SCALE * (x + 0.044715f * x * x * x);
            x = 0.5f * x * (1.0f + tanhf(u));
        }
        d[at] = kc_to<T>(x);
    }
}

static void apply_bias_gelu(kc_ctx_t *c, const kc_gemm_args_t *g)
{
    if (!g->bias && !g->gelu) return;
    unsigned blocks = kc_blocks((size_t)g->m * g->n, 256);
    if (blocks > 65535u * 16) blocks = 65535u * 16;
    if (g->d_type == CUDA_R_32F)
        bias_gelu_kernel<float, float><<<blocks, 256, 0, c->stream>>>(
            (float *)g->D, (float *)g->gelu_pre, (const float *)g->bias, g->m, g->n, g->ldd,
            g->gelu);
    else
        bias_gelu_kernel<bf16, bf16><<<blocks, 256, 0, c->stream>>>(
            (bf16 *)g->D, (bf16 *)g->gelu_pre, (const bf16 *)g->bias, g->m, g->n, g->ldd,
            g->gelu);
    KC_LAUNCHED("bias_gelu");
}

/* ---- cuBLASLt --------------------------------------------------------------------------------------- */
struct lt_key {
    int ta, tb, m, n, k, lda, ldb, ldd, ab, d, ct, epi, al_a, al_b, al_d, al_bias, beta0;
};
struct lt_val {
    int ok; /* 0: cuBLASLt has no algorithm, use the fallback */
    cublasLtMatmulAlgo_t algo;
};
static std::mutex g_lt_lock;
static std::unordered_map<std::string, lt_val> g_lt_cache;

/* Returns true when cuBLASLt ran the GEMM (including epilogue). */
static bool lt_gemm(kc_ctx_t *c, const kc_gemm_args_t *g)
{
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (g->gelu && g->gelu_pre) epi = g->bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    else if (g->gelu) epi = g->bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    else if (g->bias) epi = CUBLASLT_EPILOGUE_BIAS;
    cublasComputeType_t ct = compute_type(c, g->ab_type);

    lt_key key;
    memset(&key, 0, sizeof(key));
    key.ta = g->ta; key.tb = g->tb; key.m = g->m; key.n = g->n; key.k = g->k;
    key.lda = g->lda; key.ldb = g->ldb; key.ldd = g->ldd;
    key.ab = (int)g->ab_type; key.d = (int)g->d_type; key.ct = (int)ct; key.epi = (int)epi;
    key.al_a = (int)align_of(g->A); key.al_b = (int)align_of(g->B);
    key.al_d = (int)align_of(g->D);
    key.al_bias = g->bias ? (int)align_of(g->bias) : 0;
    key.beta0 = g->beta == 0.0f;
    std::string skey((const char *)&key, sizeof(key));

    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    bool ran = false;
    cublasOperation_t opa = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cudaDataType_t bias_type = g->d_type;
    lt_val val;
    memset(&val, 0, sizeof(val));
    bool cached = false;

    /* Descriptor creation failures are real errors (bad arguments), not "unsupported". */
    if (cublasLtMatmulDescCreate(&op, ct, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) goto fail;
    KC_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    KC_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    KC_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if (g->bias) {
        KC_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                                 sizeof(g->bias)));
        KC_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                 &bias_type, sizeof(bias_type)));
    }
    if (g->gelu && g->gelu_pre) {
        int64_t aux_ld = g->ldd;
        KC_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                 &g->gelu_pre, sizeof(g->gelu_pre)));
        KC_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                 &aux_ld, sizeof(aux_ld)));
    }
    KC_CUBLAS(cublasLtMatrixLayoutCreate(&la, g->ab_type, g->ta ? g->k : g->m,
                                         g->ta ? g->m : g->k, g->lda));
    KC_CUBLAS(cublasLtMatrixLayoutCreate(&lb, g->ab_type, g->tb ? g->n : g->k,
                                         g->tb ? g->k : g->n, g->ldb));
    KC_CUBLAS(cublasLtMatrixLayoutCreate(&ld, g->d_type, g->m, g->n, g->ldd));
    if (!la || !lb || !ld) goto fail;

    {
        std::lock_guard<std::mutex> lk(g_lt_lock);
        auto it = g_lt_cache.find(skey);
        if (it != g_lt_cache.end()) { val = it->second; cached = true; }
    }
    if (!cached) {
        KC_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
        if (!pref) goto fail;
        uint64_t wsb = c->lt_ws_bytes;
        uint32_t a_al = key.al_a, b_al = key.al_b, d_al = key.al_d;
        KC_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
        KC_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a_al, sizeof(a_al)));
        KC_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &b_al, sizeof(b_al)));
        KC_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &d_al, sizeof(d_al)));
        KC_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &d_al, sizeof(d_al)));
        cublasLtMatmulHeuristicResult_t res;
        int nres = 0;
        memset(&res, 0, sizeof(res));
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(c->lt, op, la, lb, ld, ld, pref, 1,
                                                           &res, &nres);
        /* NOT_SUPPORTED / zero results mean "no kernel for this case": use the fallback. */
        val.ok = (hs == CUBLAS_STATUS_SUCCESS && nres > 0 && res.state == CUBLAS_STATUS_SUCCESS);
        if (val.ok) val.algo = res.algo;
        std::lock_guard<std::mutex> lk(g_lt_lock);
        g_lt_cache[skey] = val;
    }
    if (val.ok) {
        cublasStatus_t ms = cublasLtMatmul(c->lt, op, &g->alpha, g->A, la, g->B, lb, &g->beta,
                                           g->D, ld, g->D, ld, &val.algo, c->lt_ws,
                                           c->lt_ws_bytes, c->stream);
        if (ms == CUBLAS_STATUS_SUCCESS) ran = true;
        else if (ms != CUBLAS_STATUS_NOT_SUPPORTED)
            kc_fail(KILN_EDEVICE, __FILE__, __LINE__, "cublasLtMatmul (%d x %d x %d) failed: %s",
                    g->m, g->n, g->k, cublasGetStatusString(ms));
        else {
            std::lock_guard<std::mutex> lk(g_lt_lock);
            g_lt_cache[skey].ok = 0;
        }
    }
fail:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    return ran;
}

void kc_gemm(const kc_gemm_args_t *g)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || g->m <= 0 || g->n <= 0) return;
    if (g->k <= 0) { /* empty product: D = beta * D (+ epilogue) */
        if (g->beta == 0.0f)
            for (int j = 0; j < g->n; j++)
                KC_CUDA(cudaMemsetAsync((char *)g->D + (size_t)j * g->ldd * type_size(g->d_type),
                                        0, (size_t)g->m * type_size(g->d_type), c->stream));
        apply_bias_gelu(c, g);
        return;
    }
    if (c->use_lt && lt_gemm(c, g)) return;
    cublasOperation_t opa = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    KC_CUBLAS(cublasGemmEx(c->cublas, opa, opb, g->m, g->n, g->k, &g->alpha, g->A, g->ab_type,
                           g->lda, g->B, g->ab_type, g->ldb, &g->beta, g->D, g->d_type, g->ldd,
                           compute_type(c, g->ab_type), CUBLAS_GEMM_DEFAULT));
    apply_bias_gelu(c, g);
}

void kc_gemm_batched(bool ta, bool tb, int m, int n, int k, float alpha, const void *A, int lda,
                     long long sA, const void *B, int ldb, long long sB, float beta, void *C,
                     int ldc, long long sC, int batch, cudaDataType_t type)
{
    kc_ctx_t *c = kc_ctx();
    if (!c || m <= 0 || n <= 0 || k <= 0 || batch <= 0) return;
    KC_CUBLAS(cublasGemmStridedBatchedEx(c->cublas, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                         tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, A, type,
                                         lda, sA, B, type, ldb, sB, &beta, C, type, ldc, sC, batch,
                                         compute_type(c, type), CUBLAS_GEMM_DEFAULT));
}
