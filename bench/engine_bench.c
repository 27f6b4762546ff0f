/* engine_bench.c - kiln's GPT training step on the CPU backend, timed: forward, backward, global
 * norm, clipping and AdamW per step, exactly the trainer's sequence, on random tokens. Prints
 * one JSON line per configuration (ms/step median after warm-up, tokens/s, MFU, peak memory)
 * for bench/RESULTS.md; bench/torch_gpt.py measures PyTorch on the same configurations.
 * It tunes its environment as kiln-train does (eng_cpu_tune_env) unless KILN_BENCH_RAW is set.
 *
 *   build-x/bench/engine_bench [--config 124m|small|all] [--threads 2] [--steps 10] [--warmup 3]
 *                              [--precision fp32|bf16] [--recompute] [--peak-gflops G] [--profile] [--ops]
 *
 * --precision bf16 runs the GEMMs through the backend's bf16 group with fp32 master weights, as
 * distribution.mixed_precision "bf16" does; --recompute turns on activation checkpointing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "engine/engine.h"
#include "rank/rank.h"

typedef struct bcfg {
    const char *name;
    int L, NH, C, V, Vp, T, B;
} bcfg_t;

static const bcfg_t CONFIGS[] = {
    {"124m", 12, 12, 768, 50257, 50304, 64, 4},
    {"small", 4, 4, 256, 256, 256, 128, 8},
};

static double process_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double median(double *x, int n);

/* --ops: a backend that forwards to the CPU backend and adds up the process CPU time of each op
 * (CPU time, so other load on the machine does not distort the breakdown). */
enum { OP_MMF, OP_MMB, OP_ATTF, OP_ATTB, OP_LNF, OP_LNB, OP_GELUF, OP_GELUB, OP_XF, OP_XB,
       OP_ENCF, OP_ENCB, OP_RES, OP_ADAM, OP_SUMSQ, OP_MEM, OP_CAST, OP_N };
static const char *const OP_NAMES[OP_N] = {"matmul_fwd", "matmul_bwd", "attn_fwd", "attn_bwd",
    "ln_fwd", "ln_bwd", "gelu_fwd", "gelu_bwd", "xent_fwd", "xent_bwd", "enc_fwd", "enc_bwd",
    "residual", "adamw", "sumsq", "memset/copy", "bf16_round"};
static double g_op_cpu[OP_N];
#define TIMED(op, call) do { double _c = process_cpu_s(); call; g_op_cpu[op] += process_cpu_s() - _c; } while (0)
static const eng_backend_t *C0 = &eng_cpu_backend;
static void t_memset(void *d, size_t n) { TIMED(OP_MEM, C0->memset_zero(d, n)); }
static void t_copy(void *d, const void *s, size_t n) { TIMED(OP_MEM, C0->copy(d, s, n)); }
static void t_encf(float *o, const int32_t *i, const float *a, const float *b, int B, int T, int C)
{ TIMED(OP_ENCF, C0->encoder_forward(o, i, a, b, B, T, C)); }
static void t_encb(float *a, float *b, const float *d, const int32_t *i, int B, int T, int C)
{ TIMED(OP_ENCB, C0->encoder_backward(a, b, d, i, B, T, C)); }
static void t_lnf(float *o, float *m, float *r, const float *x, const float *w, const float *b, int N, int C)
{ TIMED(OP_LNF, C0->layernorm_forward(o, m, r, x, w, b, N, C)); }
static void t_lnb(float *dx, float *dw, float *db, const float *d, const float *x, const float *w,
                  const float *m, const float *r, int N, int C)
{ TIMED(OP_LNB, C0->layernorm_backward(dx, dw, db, d, x, w, m, r, N, C)); }
static void t_mmf(float *o, const float *x, const float *w, const float *b, int N, int C, int OC)
{ TIMED(OP_MMF, C0->matmul_forward(o, x, w, b, N, C, OC)); }
static void t_mmb(float *dx, float *dw, float *db, const float *d, const float *x, const float *w,
                  int N, int C, int OC)
{ TIMED(OP_MMB, C0->matmul_backward(dx, dw, db, d, x, w, N, C, OC)); }
static void t_attf(float *o, float *a, const float *q, int B, int T, int C, int NH)
{ TIMED(OP_ATTF, C0->attention_forward(o, a, q, B, T, C, NH)); }
static void t_attb(float *dq, float *s, const float *d, const float *q, const float *a, int B,
                   int T, int C, int NH)
{ TIMED(OP_ATTB, C0->attention_backward(dq, s, d, q, a, B, T, C, NH)); }
static void t_gf(float *o, const float *x, size_t n) { TIMED(OP_GELUF, C0->gelu_forward(o, x, n)); }
static void t_gb(float *d, const float *x, const float *o, size_t n)
{ TIMED(OP_GELUB, C0->gelu_backward(d, x, o, n)); }
static void t_res(float *o, const float *a, const float *b, size_t n)
{ TIMED(OP_RES, C0->residual_forward(o, a, b, n)); }
static void t_xf(float *p, float *l, const float *lg, const int32_t *t, int N, int V, int Vp)
{ TIMED(OP_XF, C0->xent_forward(p, l, lg, t, N, V, Vp)); }
static void t_xb(float *d, const float *p, const int32_t *t, float dl, int N, int V, int Vp)
{ TIMED(OP_XB, C0->xent_backward(d, p, t, dl, N, V, Vp)); }
static void t_adam(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                   float b2, float eps, float wd, float gs, int64_t t)
{ TIMED(OP_ADAM, C0->adamw_update(p, g, m, v, n, lr, b1, b2, eps, wd, gs, t)); }
static double t_sumsq(const float *x, size_t n)
{ double r; TIMED(OP_SUMSQ, r = C0->sumsq(x, n)); return r; }
static const eng_backend_bf16_t *B0 = &eng_cpu_bf16;
static void t_cast(uint16_t *d, const float *x, size_t n) { TIMED(OP_CAST, B0->from_f32(d, x, n)); }
static void t_bmmf(float *o, const uint16_t *x, const uint16_t *w, const float *b, int N, int C, int OC)
{ TIMED(OP_MMF, B0->matmul_forward(o, x, w, b, N, C, OC)); }
static void t_bmmb(float *dx, float *dw, float *db, const float *d, const uint16_t *dbf,
                   const uint16_t *x, const uint16_t *w, int N, int C, int OC)
{ TIMED(OP_MMB, B0->matmul_backward(dx, dw, db, d, dbf, x, w, N, C, OC)); }
static void t_badam(float *p, uint16_t *pb, const float *g, float *m, float *v, size_t n, float lr,
                    float b1, float b2, float eps, float wd, float gs, int64_t t)
{ TIMED(OP_ADAM, B0->adamw_update(p, pb, g, m, v, n, lr, b1, b2, eps, wd, gs, t)); }
static eng_backend_bf16_t g_timed_bf16;
static eng_backend_t g_timed;
static const eng_backend_t *timed_backend(void)
{
    g_timed_bf16 = eng_cpu_bf16;
    g_timed_bf16.from_f32 = t_cast;
    g_timed_bf16.matmul_forward = t_bmmf;
    g_timed_bf16.matmul_backward = t_bmmb;
    g_timed_bf16.adamw_update = t_badam;
    g_timed = eng_cpu_backend;
    g_timed.bf16 = &g_timed_bf16;
    g_timed.name = "cpu+timing";
    g_timed.memset_zero = t_memset; g_timed.copy = t_copy;
    g_timed.encoder_forward = t_encf; g_timed.encoder_backward = t_encb;
    g_timed.layernorm_forward = t_lnf; g_timed.layernorm_backward = t_lnb;
    g_timed.matmul_forward = t_mmf; g_timed.matmul_backward = t_mmb;
    g_timed.attention_forward = t_attf; g_timed.attention_backward = t_attb;
    g_timed.gelu_forward = t_gf; g_timed.gelu_backward = t_gb;
    g_timed.residual_forward = t_res; g_timed.xent_forward = t_xf; g_timed.xent_backward = t_xb;
    g_timed.adamw_update = t_adam; g_timed.sumsq = t_sumsq;
    return &g_timed;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Per-block timing of forward and backward (the pipeline's profile, and where time goes). */
static void profile(eng_gpt_t *m, eng_gpt_acts_t *a, int reps)
{
    int nb = eng_gpt_num_blocks(m);
    double *fw = calloc(nb, sizeof(double)), *bw = calloc(nb, sizeof(double));
    for (int r = 0; r < reps; r++) {
        for (int b = 0; b < nb; b++) {
            double t0 = kiln_mono_s();
            eng_gpt_block_forward(m, a, b, true);
            fw[b] += kiln_mono_s() - t0;
        }
        float *dout = NULL, *din = m->d_a;
        for (int b = nb - 1; b >= 0; b--) {
            double t0 = kiln_mono_s();
            eng_gpt_block_backward(m, a, b, dout, din, 1.0f / (a->B * a->T));
            bw[b] += kiln_mono_s() - t0;
            dout = din;
            din = din == m->d_a ? m->d_b : m->d_a;
        }
    }
    for (int b = 0; b < nb; b++)
        fprintf(stderr, "  block %2d: forward %8.2f ms, backward %8.2f ms\n", b,
                fw[b] / reps * 1e3, bw[b] / reps * 1e3);
    free(fw);
    free(bw);
}

static int bench(const bcfg_t *c, int threads, int steps, int warmup, double peak, bool prof,
                 bool ops, bool bf16, bool recompute)
{
    eng_gpt_config_t cfg = {c->T, c->V, c->Vp, c->L, c->NH, c->C};
    eng_gpt_t *m = NULL;
    eng_gpt_acts_t *a = NULL;
    kiln_err_t err;
    if (eng_gpt_create(&cfg, ops ? timed_backend() : &eng_cpu_backend, c->B, &m, &err) ||
        eng_gpt_set_recompute(m, recompute, &err) || eng_gpt_set_bf16(m, bf16, &err) ||
        eng_gpt_acts_create(m, c->B, c->T, &a, &err)) {
        fprintf(stderr, "engine_bench: %s\n", err.message);
        return 1;
    }
    eng_gpt_init_weights(m, 1337);
    eng_gpt_bf16_refresh(m, 0, m->p.n);
    uint16_t *wbf = eng_gpt_bf16_weights(m);
    const eng_backend_t *be = m->be;
    size_t n = m->p.n;
    float *mom = be->alloc(n * 4), *var = be->alloc(n * 4);
    int BT = c->B * c->T;
    int32_t *tok = malloc(sizeof(int32_t) * BT), *tgt = malloc(sizeof(int32_t) * BT);
    eng_rng_t rng;
    eng_rng_seed(&rng, 42);
    double *times = calloc(steps, sizeof(double)), *cpus = calloc(steps, sizeof(double));
    float first = 0, last = 0;
    for (int s = 0; s < warmup + steps; s++) {
        for (int i = 0; i < BT; i++) {
            tok[i] = (int32_t)eng_rng_below(&rng, c->V);
            tgt[i] = (int32_t)eng_rng_below(&rng, c->V);
        }
        double t0 = kiln_mono_s(), c0 = process_cpu_s();
        be->memset_zero(m->p.grads, n * 4);
        eng_gpt_acts_set_batch(m, a, tok, tgt);
        float loss = eng_gpt_forward(m, a, true);
        eng_gpt_backward(m, a, 1.0f / BT, NULL, NULL);
        double norm = sqrt(be->sumsq(m->p.grads, n));
        float scale = norm > 1.0 ? (float)(1.0 / norm) : 1.0f;
        for (int i = 0; i < m->p.n_tensors; i++) {
            const eng_tensor_t *t = &m->p.tensors[i];
            if (wbf)
                be->bf16->adamw_update(m->p.params + t->off, wbf + t->off, m->p.grads + t->off,
                                       mom + t->off, var + t->off, t->n, 3e-4f, 0.9f, 0.95f, 1e-8f,
                                       t->decay ? 0.1f : 0.0f, scale, s + 1);
            else
                be->adamw_update(m->p.params + t->off, m->p.grads + t->off, mom + t->off,
                                 var + t->off, t->n, 3e-4f, 0.9f, 0.95f, 1e-8f,
                                 t->decay ? 0.1f : 0.0f, scale, s + 1);
        }
        double dt = kiln_mono_s() - t0, dc = process_cpu_s() - c0;
        if (s == 0) first = loss;
        last = loss;
        if (s == warmup - 1) memset(g_op_cpu, 0, sizeof(g_op_cpu));
        if (s >= warmup) {
            times[s - warmup] = dt;
            cpus[s - warmup] = dc;
        }
        if (getenv("KILN_BENCH_TRACE"))
            fprintf(stderr, "step %d%s: %.2f ms wall, %.2f ms cpu\n", s + 1, s < warmup ? " (warm-up)" : "",
                    dt * 1e3, dc * 1e3);
    }
    double med = median(times, steps), cpu_med = median(cpus, steps);
    double tps = BT / med, fpt = eng_gpt_flops_per_token(&cfg);
    printf("{\"impl\": \"kiln\", \"config\": \"%s\", \"precision\": \"%s\", \"recompute\": %s, "
           "\"threads\": %d, \"params\": %zu, "
           "\"ms_per_step\": %.2f, \"min_ms\": %.2f, \"cpu_ms_per_step\": %.2f, "
           "\"tokens_per_s\": %.1f, "
           "\"model_gflops_per_step\": %.2f, \"achieved_gflops\": %.1f, \"peak_gflops\": %.1f, "
           "\"mfu\": %.4f, \"mfu_vs_486\": %.4f, \"peak_mem_mb\": %.1f, \"loss_first\": %.4f, "
           "\"loss_last\": %.4f}\n",
           c->name, bf16 ? "bf16" : "fp32", recompute ? "true" : "false", threads, n, med * 1e3, times[0] * 1e3, cpu_med * 1e3, tps, fpt * BT / 1e9,
           fpt * tps / 1e9, peak, fpt * tps / (peak * 1e9), fpt * tps / 486e9,
           eng_peak_mem_mb(), first, last);
    fflush(stdout);
    if (prof) profile(m, a, 3);
    if (ops) {
        double tot = 0;
        for (int i = 0; i < OP_N; i++) tot += g_op_cpu[i];
        fprintf(stderr, "  CPU time per step by op (%s):\n", c->name);
        for (int i = 0; i < OP_N; i++)
            fprintf(stderr, "    %-12s %8.2f ms  %5.1f%%\n", OP_NAMES[i], g_op_cpu[i] / steps * 1e3,
                    100 * g_op_cpu[i] / tot);
    }
    free(times);
    free(cpus);
    free(tok);
    free(tgt);
    be->free(mom);
    be->free(var);
    eng_gpt_acts_destroy(m, a);
    eng_gpt_destroy(m);
    return 0;
}

/* Sorts x in place; returns its median. */
static double median(double *x, int n)
{
    qsort(x, n, sizeof(double), cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

int main(int argc, char **argv)
{
    const char *config = "all", *precision = "fp32";
    int64_t threads = 2, steps = 10, warmup = 3;
    double peak = 0;
    bool prof = false, ops = false, recompute = false;
    config_flag_t flags[] = {
        {"config", NULL, CONFIG_STR, &config, CONFIG_ANY, "124m, small or all"},
        {"threads", RANK_ENV_THREADS, CONFIG_INT, &threads, CONFIG_ANY, "CPU threads"},
        {"steps", NULL, CONFIG_INT, &steps, CONFIG_ANY, "timed steps"},
        {"warmup", NULL, CONFIG_INT, &warmup, CONFIG_ANY, "untimed steps first"},
        {"peak-gflops", "KILN_PEAK_GFLOPS", CONFIG_DOUBLE, &peak, CONFIG_ANY, "0: measure"},
        {"profile", NULL, CONFIG_BOOL, &prof, CONFIG_ANY, "per-block timings on stderr"},
        {"ops", NULL, CONFIG_BOOL, &ops, CONFIG_ANY, "CPU time per op on stderr"},
        {"precision", NULL, CONFIG_STR, &precision, CONFIG_ANY, "fp32 or bf16 (bf16 GEMMs, fp32 master weights)"},
        {"recompute", NULL, CONFIG_BOOL, &recompute, CONFIG_ANY, "activation checkpointing"},
    };
    if (!getenv("KILN_BENCH_REEXEC") && !getenv("KILN_BENCH_RAW") && eng_cpu_tune_env()) {
        setenv("KILN_BENCH_REEXEC", "1", 1); /* run as kiln-train does */
        execv("/proc/self/exe", argv);
    }
    kiln_err_t err;
    int rc = config_parse(argc, argv, flags, KILN_ARRAY_LEN(flags), "[options]", NULL, &err);
    if (rc) return rc == 1 ? 0 : 2;
    eng_cpu_set_threads((int)threads);
    if (peak <= 0) peak = eng_measure_peak_gflops();
    for (size_t i = 0; i < KILN_ARRAY_LEN(CONFIGS); i++)
        if (!strcmp(config, "all") || !strcmp(config, CONFIGS[i].name))
            if (bench(&CONFIGS[i], (int)threads, (int)steps, (int)warmup, peak, prof, ops,
                      !strcmp(precision, "bf16"), recompute))
                return 1;
    return 0;
}
