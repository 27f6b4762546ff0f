/* engine_bench.c - kiln's GPT training step on the CPU backend, timed: forward, backward, global
 * norm, clipping and AdamW per step, exactly the trainer's sequence, on random tokens. Prints
 * one JSON line per configuration (ms/step median after warm-up, tokens/s, MFU, peak memory)
 * for bench/RESULTS.md; bench/torch_gpt.py measures PyTorch on the same configurations.
 *
 *   build-x/bench/engine_bench [--config 124m|small|all] [--threads 2] [--steps 10] [--warmup 3]
 *                              [--peak-gflops G] [--profile]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "engine/engine.h"

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

static int bench(const bcfg_t *c, int threads, int steps, int warmup, double peak, bool prof)
{
    eng_gpt_config_t cfg = {c->T, c->V, c->Vp, c->L, c->NH, c->C};
    eng_gpt_t *m = NULL;
    eng_gpt_acts_t *a = NULL;
    kiln_err_t err;
    if (eng_gpt_create(&cfg, &eng_cpu_backend, c->B, &m, &err) ||
        eng_gpt_acts_create(m, c->B, c->T, &a, &err)) {
        fprintf(stderr, "engine_bench: %s\n", err.message);
        return 1;
    }
    eng_gpt_init_weights(m, 1337);
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
            be->adamw_update(m->p.params + t->off, m->p.grads + t->off, mom + t->off,
                             var + t->off, t->n, 3e-4f, 0.9f, 0.95f, 1e-8f,
                             t->decay ? 0.1f : 0.0f, scale, s + 1);
        }
        double dt = kiln_mono_s() - t0, dc = process_cpu_s() - c0;
        if (s == 0) first = loss;
        last = loss;
        if (s >= warmup) {
            times[s - warmup] = dt;
            cpus[s - warmup] = dc;
        }
    }
    double med = median(times, steps), cpu_med = median(cpus, steps);
    double tps = BT / med, fpt = eng_gpt_flops_per_token(&cfg);
    printf("{\"impl\": \"kiln\", \"config\": \"%s\", \"threads\": %d, \"params\": %zu, "
           "\"ms_per_step\": %.2f, \"min_ms\": %.2f, \"cpu_ms_per_step\": %.2f, "
           "\"tokens_per_s\": %.1f, "
           "\"model_gflops_per_step\": %.2f, \"achieved_gflops\": %.1f, \"peak_gflops\": %.1f, "
           "\"mfu\": %.4f, \"mfu_vs_486\": %.4f, \"peak_mem_mb\": %.1f, \"loss_first\": %.4f, "
           "\"loss_last\": %.4f}\n",
           c->name, threads, n, med * 1e3, times[0] * 1e3, cpu_med * 1e3, tps, fpt * BT / 1e9,
           fpt * tps / 1e9, peak, fpt * tps / (peak * 1e9), fpt * tps / 486e9,
           eng_peak_mem_mb(), first, last);
    fflush(stdout);
    if (prof) profile(m, a, 3);
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
    const char *config = "all";
    int64_t threads = 2, steps = 10, warmup = 3;
    double peak = 0;
    bool prof = false;
    config_flag_t flags[] = {
        {"config", NULL, CONFIG_STR, &config, "124m, small or all"},
        {"threads", "KILN_THREADS", CONFIG_INT, &threads, "CPU threads"},
        {"steps", NULL, CONFIG_INT, &steps, "timed steps"},
        {"warmup", NULL, CONFIG_INT, &warmup, "untimed steps first"},
        {"peak-gflops", "KILN_PEAK_GFLOPS", CONFIG_DOUBLE, &peak, "0: measure"},
        {"profile", NULL, CONFIG_BOOL, &prof, "per-block timings on stderr"},
    };
    kiln_err_t err;
    int rc = config_parse(argc, argv, flags, KILN_ARRAY_LEN(flags), "[options]", NULL, &err);
    if (rc) return rc == 1 ? 0 : 2;
    eng_cpu_set_threads((int)threads);
    if (peak <= 0) peak = eng_measure_peak_gflops();
    for (size_t i = 0; i < KILN_ARRAY_LEN(CONFIGS); i++)
        if (!strcmp(config, "all") || !strcmp(config, CONFIGS[i].name))
            if (bench(&CONFIGS[i], (int)threads, (int)steps, (int)warmup, peak, prof)) return 1;
    return 0;
}
