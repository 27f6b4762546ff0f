/* cuda_gpt_bench.c - kiln's GPT-2 training step on the CUDA backend, timed: forward, backward,
 * global norm, clipping and AdamW per step, exactly the trainer's sequence, on random tokens, at
 * the largest batch that fits. Prints one JSON line (ms/step median after warm-up, tokens/s, MFU
 * against the GPU's dense bf16 peak, device memory) for bench/RESULTS.md; bench/torch_gpt_cuda.py
 * measures PyTorch on the same model; bench/cuda_bench.sh runs both. Without a GPU it says why and
 * exits 0 with {"skipped": ...}. --precision bf16 runs the GEMMs through the backend's bf16 group
 * with fp32 master weights, as distribution.mixed_precision "bf16" does; --matmul tf32 lets fp32
 * GEMMs use TF32 tensor cores (KILN_CUDA_MATMUL).
 *
 *   build-x/bench/cuda_gpt_bench [--config 124m|small] [--T 1024] [--B 0 (largest that fits)]
 *                                [--steps 20] [--warmup 5] [--precision bf16|fp32]
 *                                [--matmul fp32|tf32] [--peak-tflops 989] [--deterministic 1]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "engine/backend.h"
#include "engine/engine.h"

typedef struct bcfg {
    const char *name;
    int L, NH, C, V, Vp;
} bcfg_t;

static const bcfg_t CONFIGS[] = {
    {"124m", 12, 12, 768, 50257, 50304},
    {"small", 4, 4, 256, 256, 256},
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Model, activations and optimizer state for batch B; 0 or the failing status. */
typedef struct run {
    eng_gpt_t *m;
    eng_gpt_acts_t *a;
    float *mom, *var;
} run_t;

static void run_free(const eng_backend_t *be, run_t *r)
{
    if (r->mom) be->free(r->mom);
    if (r->var) be->free(r->var);
    if (r->a) eng_gpt_acts_destroy(r->m, r->a);
    if (r->m) eng_gpt_destroy(r->m);
    memset(r, 0, sizeof(*r));
}

static int run_make(const eng_backend_t *be, const eng_gpt_config_t *cfg, int B, bool bf16, run_t *r,
                    kiln_err_t *err)
{
    memset(r, 0, sizeof(*r));
    int rc = eng_gpt_create(cfg, be, B, &r->m, err);
    if (!rc) rc = eng_gpt_set_bf16(r->m, bf16, err);
    if (!rc) rc = eng_gpt_acts_create(r->m, B, cfg->max_seq_len, &r->a, err);
    if (!rc) {
        r->mom = be->alloc(r->m->p.n * 4);
        r->var = be->alloc(r->m->p.n * 4);
        if (!r->mom || !r->var) rc = KILN_ENOMEM;
    }
    if (rc) run_free(be, r);
    return rc;
}

/* One training step as the trainer does it (the clock covers the host token copy, like
 * kiln-train's); returns the loss. t is AdamW's step. */
static float step(const eng_backend_t *be, run_t *r, const bcfg_t *c, int32_t *tok, int32_t *tgt,
                  int BT, eng_rng_t *rng, int64_t t)
{
    eng_gpt_t *m = r->m;
    size_t n = m->p.n;
    for (int i = 0; i < BT; i++) {
        tok[i] = (int32_t)eng_rng_below(rng, c->V);
        tgt[i] = (int32_t)eng_rng_below(rng, c->V);
    }
    be->memset_zero(m->p.grads, n * 4);
    eng_gpt_acts_set_batch(m, r->a, tok, tgt);
    float loss = eng_gpt_forward(m, r->a, true);
    eng_gpt_backward(m, r->a, 1.0f / BT, NULL, NULL);
    double norm = sqrt(be->sumsq(m->p.grads, n));
    float scale = norm > 1.0 ? (float)(1.0 / norm) : 1.0f;
    uint16_t *wbf = eng_gpt_bf16_weights(m);
    for (int i = 0; i < m->p.n_tensors; i++) {
        const eng_tensor_t *tt = &m->p.tensors[i];
        float wd = tt->decay ? 0.1f : 0.0f;
        if (wbf)
            be->bf16->adamw_update(m->p.params + tt->off, wbf + tt->off, m->p.grads + tt->off,
                                   r->mom + tt->off, r->var + tt->off, tt->n, 3e-4f, 0.9f, 0.95f,
                                   1e-8f, wd, scale, t);
        else
            be->adamw_update(m->p.params + tt->off, m->p.grads + tt->off, r->mom + tt->off,
                             r->var + tt->off, tt->n, 3e-4f, 0.9f, 0.95f, 1e-8f, wd, scale, t);
    }
    be->synchronize();
    return loss;
}

/* Whether a batch of b fits: the model, its activations and one whole step run without a
 * device error. Probed in a child process, because the backend's status is sticky. */
static bool batch_fits(const eng_gpt_config_t *cfg, const bcfg_t *c, int b, bool bf16)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
        const eng_backend_t *be = NULL;
        kiln_err_t err;
        run_t r;
        eng_rng_t rng;
        eng_rng_seed(&rng, 42);
        if (eng_backend_get("cuda", &be, &err) || run_make(be, cfg, b, bf16, &r, &err)) _exit(1);
        int32_t *tok = malloc(sizeof(int32_t) * b * cfg->max_seq_len),
                *tgt = malloc(sizeof(int32_t) * b * cfg->max_seq_len);
        if (!tok || !tgt) _exit(1);
        eng_gpt_init_weights(r.m, 1337);
        eng_gpt_bf16_refresh(r.m, 0, r.m->p.n);
        step(be, &r, c, tok, tgt, b * cfg->max_seq_len, &rng, 1);
        _exit(be->status(be->ctx, &err) == 0 ? 0 : 1);
    }
    int st = 0;
    return waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(int argc, char **argv)
{
    const char *config = "124m", *precision = "bf16", *matmul = "fp32";
    int64_t T = 1024, B = 0, steps = 20, warmup = 5, det = 1;
    double peak = 989.0;
    config_flag_t flags[] = {
        {"config", NULL, CONFIG_STR, &config, CONFIG_ANY, "124m or small"},
        {"T", NULL, CONFIG_INT, &T, CONFIG_ANY, "sequence length"},
        {"B", NULL, CONFIG_INT, &B, CONFIG_ANY, "batch; 0: the largest that fits (powers of two and 3/4 steps)"},
        {"steps", NULL, CONFIG_INT, &steps, CONFIG_ANY, "timed steps"},
        {"warmup", NULL, CONFIG_INT, &warmup, CONFIG_ANY, "untimed steps first"},
        {"precision", NULL, CONFIG_STR, &precision, CONFIG_ANY, "bf16 (bf16 GEMMs, fp32 master weights) or fp32"},
        {"matmul", NULL, CONFIG_STR, &matmul, CONFIG_ANY, "fp32 GEMMs: fp32 or tf32"},
        {"peak-tflops", "KILN_PEAK_TFLOPS", CONFIG_DOUBLE, &peak, CONFIG_ANY,
         "dense bf16 peak for MFU (989: H100 SXM and H200; 756 H100 PCIe; 312 A100)"},
        {"deterministic", NULL, CONFIG_INT, &det, CONFIG_ANY, "1: no atomics (default), 0: allow them"},
    };
    kiln_err_t err;
    memset(&err, 0, sizeof(err));
    int rc = config_parse(argc, argv, flags, KILN_ARRAY_LEN(flags), "[options]", NULL, &err);
    if (rc) return rc == 1 ? 0 : 2;
    const bcfg_t *c = NULL;
    for (size_t i = 0; i < KILN_ARRAY_LEN(CONFIGS); i++)
        if (!strcmp(config, CONFIGS[i].name)) c = &CONFIGS[i];
    bool bf16 = !strcmp(precision, "bf16");
    if (!c || T < 1 || steps < 1 || warmup < 0 || (!bf16 && strcmp(precision, "fp32")) ||
        (strcmp(matmul, "fp32") && strcmp(matmul, "tf32"))) {
        fprintf(stderr, "cuda_gpt_bench: bad --config/--T/--steps/--precision/--matmul\n");
        return 2;
    }
    /* the backend reads these when it first initialises the device */
    setenv("KILN_CUDA_MATMUL", matmul, 1);
    setenv("KILN_CUDA_DETERMINISTIC", det ? "1" : "0", 1);

    eng_gpt_config_t cfg = {(int)T, c->V, c->Vp, c->L, c->NH, c->C};
    static const int tries[] = {128, 96, 64, 48, 32, 24, 16, 12, 8, 6, 4, 3, 2, 1};
    int bsel = B > 0 ? (int)B : 0;
    if (!bsel) { /* the device must not be touched in this process before the probes fork */
        for (size_t i = 0; i < KILN_ARRAY_LEN(tries) && !bsel; i++)
            if (batch_fits(&cfg, c, tries[i], bf16)) bsel = tries[i];
    }
    const eng_backend_t *be = NULL;
    if (eng_backend_get("cuda", &be, &err) != 0) {
        printf("{\"impl\": \"kiln-cuda\", \"skipped\": \"%s\"}\n", err.message);
        return 0;
    }
    run_t r;
    if (!bsel || run_make(be, &cfg, bsel, bf16, &r, &err)) {
        fprintf(stderr, "cuda_gpt_bench: no batch fits: %s\n", err.message);
        return 1;
    }
    eng_gpt_init_weights(r.m, 1337);
    eng_gpt_bf16_refresh(r.m, 0, r.m->p.n);
    int BT = bsel * (int)T;
    int32_t *tok = malloc(sizeof(int32_t) * BT), *tgt = malloc(sizeof(int32_t) * BT);
    double *times = calloc((size_t)steps, sizeof(double));
    eng_rng_t rng;
    eng_rng_seed(&rng, 42);
    float first = 0, last = 0;
    for (int s = 0; s < warmup + steps; s++) {
        double t0 = kiln_mono_s();
        float loss = step(be, &r, c, tok, tgt, BT, &rng, s + 1);
        double dt = kiln_mono_s() - t0;
        if (s == 0) first = loss;
        last = loss;
        if (s >= warmup) times[s - warmup] = dt;
    }
    if (be->status(be->ctx, &err)) {
        fprintf(stderr, "cuda_gpt_bench: %s\n", err.message);
        return 1;
    }
    eng_backend_mem_t mem;
    be->mem_stats(be->ctx, &mem);
    qsort(times, (size_t)steps, sizeof(double), cmp_double);
    double med = steps % 2 ? times[steps / 2] : 0.5 * (times[steps / 2 - 1] + times[steps / 2]);
    double tps = BT / med, fpt = eng_gpt_flops_per_token(&cfg);
    printf("{\"impl\": \"kiln-cuda\", \"config\": \"%s\", \"T\": %d, \"B\": %d, \"precision\": \"%s\", "
           "\"matmul\": \"%s\", \"deterministic\": %d, \"params\": %zu, \"ms_per_step\": %.2f, "
           "\"min_ms\": %.2f, \"tokens_per_s\": %.1f, \"model_tflops_per_step\": %.3f, "
           "\"achieved_tflops\": %.1f, \"peak_tflops\": %.1f, \"mfu\": %.4f, \"gpu_mem_mb\": %.1f, "
           "\"gpu_mem_peak_mb\": %.1f, \"loss_first\": %.4f, \"loss_last\": %.4f}\n",
           c->name, (int)T, bsel, precision, matmul, (int)det, r.m->p.n, med * 1e3, times[0] * 1e3, tps,
           fpt * BT / 1e12, fpt * tps / 1e12, peak, peak > 0 ? fpt * tps / (peak * 1e12) : 0.0,
           mem.in_use_bytes / 1048576.0, mem.peak_bytes / 1048576.0, first, last);
    free(times);
    free(tok);
    free(tgt);
    run_free(be, &r);
    return 0;
}
