/* ref.c - the plain reference implementation of every op in backend.h: obvious loops, double
 * accumulators, no threads, no BLAS. The fast CPU kernels (engine/cpu/) and any future backend
 * are tested against these, and these are tested against finite differences.
 * It is not meant to be fast; it is a complete backend (eng_ref_backend) so a whole model can
 * run on it in tests. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/bf16.h"

static void *ref_alloc(size_t bytes)
{
    void *p = NULL;
    size_t n = (bytes + 63) / 64 * 64;
    if (n == 0) n = 64;
    if (posix_memalign(&p, 64, n) != 0) return NULL;
    memset(p, 0, n);
    return p;
}
static void ref_free(void *p) { free(p); }
static void ref_memset_zero(void *d, size_t n) { memset(d, 0, n); }
static void ref_copy(void *d, const void *s, size_t n) { memmove(d, s, n); }
static void ref_sync(void) {}

static void ref_encoder_forward(float *out, const int32_t *inp, const float *wte,
                                const float *wpe, int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const float *we = wte + (size_t)inp[b * T + t] * C, *wp = wpe + (size_t)t * C;
            for (int c = 0; c < C; c++) o[c] = we[c] + wp[c];
        }
}

static void ref_encoder_backward(float *dwte, float *dwpe, const float *dout,
                                 const int32_t *inp, int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *d = dout + ((size_t)b * T + t) * C;
            float *we = dwte + (size_t)inp[b * T + t] * C, *wp = dwpe + (size_t)t * C;
            for (int c = 0; c < C; c++) { we[c] += d[c]; wp[c] += d[c]; }
        }
}

static void ref_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                  const float *w, const float *b, int N, int C)
{
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        double m = 0, v = 0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        v /= C;
        double s = 1.0 / sqrt(v + 1e-5);
        for (int c = 0; c < C; c++) out[(size_t)i * C + c] = (float)((x[c] - m) * s * w[c] + b[c]);
        mean[i] = (float)m;
        rstd[i] = (float)s;
    }
}

static void ref_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                   const float *inp, const float *w, const float *mean,
                                   const float *rstd, int N, int C)
{
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C, *d = dout + (size_t)i * C;
        double m = mean[i], s = rstd[i], dn_mean = 0, dn_xhat_mean = 0;
        for (int c = 0; c < C; c++) {
            double xhat = (x[c] - m) * s, dn = (double)d[c] * w[c];
            dn_mean += dn;
            dn_xhat_mean += dn * xhat;
        }
        dn_mean /= C;
        dn_xhat_mean /= C;
        for (int c = 0; c < C; c++) {
            double xhat = (x[c] - m) * s, dn = (double)d[c] * w[c];
            dinp[(size_t)i * C + c] += (float)((dn - dn_mean - xhat * dn_xhat_mean) * s);
            dw[c] += (float)(d[c] * xhat);
            db[c] += d[c];
        }
    }
}

static void ref_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                               int N, int C, int OC)
{
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) {
            double acc = bias ? bias[o] : 0.0;
            for (int c = 0; c < C; c++) acc += (double)inp[(size_t)i * C + c] * w[(size_t)o * C + c];
            out[(size_t)i * OC + o] = (float)acc;
        }
}

static void ref_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                                const float *inp, const float *w, int N, int C, int OC)
{
    if (dinp)
        for (int i = 0; i < N; i++)
            for (int c = 0; c < C; c++) {
                double acc = 0;
                for (int o = 0; o < OC; o++) acc += (double)dout[(size_t)i * OC + o] * w[(size_t)o * C + c];
                dinp[(size_t)i * C + c] = (float)acc;
            }
    for (int o = 0; o < OC; o++) {
        for (int c = 0; dw && c < C; c++) {
            double acc = 0;
            for (int i = 0; i < N; i++) acc += (double)dout[(size_t)i * OC + o] * inp[(size_t)i * C + c];
            dw[(size_t)o * C + c] += (float)acc;
        }
        if (dbias) {
            double acc = 0;
            for (int i = 0; i < N; i++) acc += dout[(size_t)i * OC + o];
            dbias[o] += (float)acc;
        }
    }
}

static void ref_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                                  int NH)
{
    int hs = C / NH;
    double scale = 1.0 / sqrt(hs);
    double *row = malloc(sizeof(double) * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double mx = -INFINITY;
                for (int u = 0; u <= t; u++) {
                    const float *k = qkv + ((size_t)b * T + u) * 3 * C + C + h * hs;
                    double s = 0;
                    for (int i = 0; i < hs; i++) s += (double)q[i] * k[i];
                    row[u] = s * scale;
                    if (row[u] > mx) mx = row[u];
                }
                double sum = 0;
                for (int u = 0; u <= t; u++) { row[u] = exp(row[u] - mx); sum += row[u]; }
                float *a = att + (((size_t)b * NH + h) * T + t) * T;
                for (int u = 0; u < T; u++) a[u] = u <= t ? (float)(row[u] / sum) : 0.0f;
                float *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) {
                    double acc = 0;
                    for (int u = 0; u <= t; u++)
                        acc += (double)a[u] * qkv[((size_t)b * T + u) * 3 * C + 2 * C + h * hs + i];
                    o[i] = (float)acc;
                }
            }
    free(row);
}

static void ref_attention_backward(float *dqkv, float *scratch, const float *dout,
                                   const float *qkv, const float *att, int B, int T, int C,
                                   int NH)
{
    int hs = C / NH;
    double scale = 1.0 / sqrt(hs);
    memset(dqkv, 0, sizeof(float) * (size_t)B * T * 3 * C);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *a = att + (((size_t)b * NH + h) * T + t) * T;
                float *da = scratch + (((size_t)b * NH + h) * T + t) * T;
                const float *d = dout + ((size_t)b * T + t) * C + h * hs;
                /* out = sum_u a[u] v[u]: da[u] = d . v[u], dv[u] += a[u] d */
                for (int u = 0; u <= t; u++) {
                    const float *v = qkv + ((size_t)b * T + u) * 3 * C + 2 * C + h * hs;
                    float *dv = dqkv + ((size_t)b * T + u) * 3 * C + 2 * C + h * hs;
                    double s = 0;
                    for (int i = 0; i < hs; i++) { s += (double)d[i] * v[i]; dv[i] += a[u] * d[i]; }
                    da[u] = (float)s;
                }
                /* softmax backward: ds[u] = a[u] (da[u] - sum_w a[w] da[w]) */
                double dot = 0;
                for (int u = 0; u <= t; u++) dot += (double)a[u] * da[u];
                const float *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                float *dq = dqkv + ((size_t)b * T + t) * 3 * C + h * hs;
                for (int u = 0; u <= t; u++) {
                    double ds = a[u] * (da[u] - dot) * scale;
                    const float *k = qkv + ((size_t)b * T + u) * 3 * C + C + h * hs;
                    float *dk = dqkv + ((size_t)b * T + u) * 3 * C + C + h * hs;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += (float)(ds * k[i]);
                        dk[i] += (float)(ds * q[i]);
                    }
                }
            }
}

#define GELU_S 0.7978845608028654 /* sqrt(2/pi) */
static void ref_gelu_forward(float *out, const float *inp, size_t N)
{
    for (size_t i = 0; i < N; i++) {
        double x = inp[i];
        out[i] = (float)(0.5 * x * (1.0 + tanh(GELU_S * (x + 0.044715 * x * x * x))));
    }
}

static void ref_gelu_backward(float *dinp, const float *inp, const float *dout, size_t N)
{
    for (size_t i = 0; i < N; i++) {
        double x = inp[i], u = GELU_S * (x + 0.044715 * x * x * x);
        double th = tanh(u), sech2 = 1.0 - th * th;
        double g = 0.5 * (1.0 + th) + 0.5 * x * sech2 * GELU_S * (1.0 + 3.0 * 0.044715 * x * x);
        dinp[i] = (float)(g * dout[i]);
    }
}

static void ref_relu_forward(float *out, const float *inp, size_t N)
{
    for (size_t i = 0; i < N; i++) out[i] = inp[i] > 0 ? inp[i] : 0.0f;
}
static void ref_relu_backward(float *dinp, const float *inp, const float *dout, size_t N)
{
    for (size_t i = 0; i < N; i++) dinp[i] = inp[i] > 0 ? dout[i] : 0.0f;
}
static void ref_residual_forward(float *out, const float *a, const float *b, size_t N)
{
    for (size_t i = 0; i < N; i++) out[i] = a[i] + b[i];
}

static void ref_xent_forward(float *probs, float *losses, const float *logits,
                             const int32_t *targets, int N, int V, int Vp)
{
    for (int i = 0; i < N; i++) {
        const float *l = logits + (size_t)i * Vp;
        float *p = probs + (size_t)i * Vp;
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < V; j++) if (l[j] > mx) mx = l[j];
        for (int j = 0; j < V; j++) sum += exp(l[j] - mx);
        double lse = mx + log(sum);
        if (targets) losses[i] = (float)(lse - l[targets[i]]);
        for (int j = 0; j < Vp; j++) p[j] = j < V ? (float)exp(l[j] - lse) : 0.0f;
    }
}

static void ref_xent_backward(float *dlogits, const float *probs, const int32_t *targets,
                              float dloss, int N, int V, int Vp)
{
    for (int i = 0; i < N; i++)
        for (int j = 0; j < Vp; j++) {
            float p = j < V ? probs[(size_t)i * Vp + j] : 0.0f;
            dlogits[(size_t)i * Vp + j] = (p - (j == targets[i] ? 1.0f : 0.0f)) * dloss;
        }
}

static void ref_xent_chunk_forward(float *stats, const float *logits, const int32_t *targets,
                                   int N, int v0, int w, int V, int first)
{
    float *mx = stats, *sm = stats + N, *tl = stats + 2 * (size_t)N;
    for (int i = 0; i < N; i++) {
        double m = first ? -INFINITY : mx[i], s = first ? 0 : sm[i];
        if (first) tl[i] = 0.0f;
        for (int j = 0; j < w && v0 + j < V; j++) {
            double x = logits[(size_t)i * w + j];
            if (x > m) {
                s = s > 0 ? s * exp(m - x) : 0;
                m = x;
            }
            s += exp(x - m);
            if (targets && targets[i] == v0 + j) tl[i] = (float)x;
        }
        mx[i] = (float)m;
        sm[i] = (float)s;
    }
}

static void ref_xent_chunk_finish(float *losses, float *stats, int N)
{
    for (int i = 0; i < N; i++) {
        double lse = (double)stats[i] + log((double)stats[N + i]);
        stats[3 * (size_t)N + i] = (float)lse;
        if (losses) losses[i] = (float)(lse - stats[2 * (size_t)N + i]);
    }
}

static void ref_xent_chunk_backward(float *dlogits, const float *logits, const float *lse,
                                    const int32_t *targets, float dloss, int N, int v0, int w,
                                    int V)
{
    for (int i = 0; i < N; i++)
        for (int j = 0; j < w; j++) {
            size_t k = (size_t)i * w + j;
            double p = v0 + j < V ? exp((double)logits[k] - lse[i]) : 0.0;
            dlogits[k] = (float)((p - (targets[i] == v0 + j ? 1.0 : 0.0)) * dloss);
        }
}

static void ref_adamw_update(float *param, const float *grad, float *m, float *v, size_t n,
                             float lr, float beta1, float beta2, float eps, float wd,
                             float grad_scale, int64_t t)
{
    double bc1 = 1.0 - pow(beta1, (double)t), bc2 = 1.0 - pow(beta2, (double)t);
    for (size_t i = 0; i < n; i++) {
        double g = (double)grad[i] * grad_scale;
        double mi = beta1 * (double)m[i] + (1.0 - beta1) * g;
        double vi = beta2 * (double)v[i] + (1.0 - beta2) * g * g;
        m[i] = (float)mi;
        v[i] = (float)vi;
        double p = param[i];
        p -= lr * ((mi / bc1) / (sqrt(vi / bc2) + eps) + wd * p);
        param[i] = (float)p;
    }
}

static double ref_sumsq(const float *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

static void ref_scale(float *x, float s, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* ---- bf16: the inputs rounded to bf16 (round to nearest even), products summed in double ---- */

static int ref_bf16_available(kiln_err_t *err)
{
    (void)err;
    return 0;
}

static void ref_bf16_from_f32(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = eng_bf16_round(src[i]);
}

static void ref_bf16_matmul_forward(float *out, const uint16_t *inp, const uint16_t *w,
                                    const float *bias, int N, int C, int OC)
{
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) {
            double acc = bias ? bias[o] : 0.0;
            for (int c = 0; c < C; c++)
                acc += eng_bf16_value(inp[(size_t)i * C + c]) * eng_bf16_value(w[(size_t)o * C + c]);
            out[(size_t)i * OC + o] = (float)acc;
        }
}

static void ref_bf16_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                                     const uint16_t *dout_bf, const uint16_t *inp,
                                     const uint16_t *w, int N, int C, int OC)
{
    if (dinp)
        for (int i = 0; i < N; i++)
            for (int c = 0; c < C; c++) {
                double acc = 0;
                for (int o = 0; o < OC; o++)
                    acc += eng_bf16_value(dout_bf[(size_t)i * OC + o]) * eng_bf16_value(w[(size_t)o * C + c]);
                dinp[(size_t)i * C + c] = (float)acc;
            }
    for (int o = 0; o < OC; o++) {
        for (int c = 0; dw && c < C; c++) {
            double acc = 0;
            for (int i = 0; i < N; i++)
                acc += eng_bf16_value(dout_bf[(size_t)i * OC + o]) * eng_bf16_value(inp[(size_t)i * C + c]);
            dw[(size_t)o * C + c] += (float)acc;
        }
        if (dbias) {
            double acc = 0;
            for (int i = 0; i < N; i++) acc += dout[(size_t)i * OC + o];
            dbias[o] += (float)acc;
        }
    }
}

static void ref_bf16_adamw_update(float *param, uint16_t *param_bf16, const float *grad, float *m,
                                  float *v, size_t n, float lr, float beta1, float beta2, float eps,
                                  float wd, float grad_scale, int64_t t)
{
    ref_adamw_update(param, grad, m, v, n, lr, beta1, beta2, eps, wd, grad_scale, t);
    ref_bf16_from_f32(param_bf16, param, n);
}

const eng_backend_bf16_t eng_ref_bf16 = {
    .available = ref_bf16_available,
    .from_f32 = ref_bf16_from_f32,
    .matmul_forward = ref_bf16_matmul_forward,
    .matmul_backward = ref_bf16_matmul_backward,
    .adamw_update = ref_bf16_adamw_update,
};

const eng_backend_t eng_ref_backend = {
    .abi = ENG_BACKEND_ABI, .host_memory = true, .bf16 = &eng_ref_bf16,
    .name = "ref",
    .alloc = ref_alloc, .free = ref_free, .memset_zero = ref_memset_zero,
    .to_device = ref_copy, .to_host = ref_copy, .copy = ref_copy, .synchronize = ref_sync,
    .encoder_forward = ref_encoder_forward, .encoder_backward = ref_encoder_backward,
    .layernorm_forward = ref_layernorm_forward, .layernorm_backward = ref_layernorm_backward,
    .matmul_forward = ref_matmul_forward, .matmul_backward = ref_matmul_backward,
    .attention_forward = ref_attention_forward, .attention_backward = ref_attention_backward,
    .gelu_forward = ref_gelu_forward, .gelu_backward = ref_gelu_backward,
    .relu_forward = ref_relu_forward, .relu_backward = ref_relu_backward,
    .residual_forward = ref_residual_forward,
    .xent_forward = ref_xent_forward, .xent_backward = ref_xent_backward,
    .xent_chunk_forward = ref_xent_chunk_forward, .xent_chunk_finish = ref_xent_chunk_finish,
    .xent_chunk_backward = ref_xent_chunk_backward,
    .adamw_update = ref_adamw_update, .sumsq = ref_sumsq, .scale = ref_scale,
};
