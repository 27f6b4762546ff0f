/* cuda_gpt_bench.c - kiln's GPT-2 training step on the CUDA backend, timed: forward, backward,
 * global norm, clipping and AdamW per step, exactly the trainer's sequence, on random tokens, at
 * the largest batch that fits. Prints one JSON line (ms/step median after warm-up, tokens/s, MFU
 * against the GPU's dense bf16 peak, device memory) for bench/RESULTS.md; bench/torch_gpt_cuda.py
 * measures PyTorch on the same model; bench/cuda_bench.sh runs both. Without a GPU it says why and
 * exits 0 with {"skipped": ...}.
 *
 *   build-x/bench/cuda_gpt_bench [--config 124m|small] [--T 1024] [--B 0 (largest that fits)]
 *                                [--steps 20] [--warmup 5] [--matmul bf16|tf32|fp32]
 *                                [--peak-tflops 0 (from the device name)] [--deterministic 1]
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "engine/backend.h"
#include "engine/cuda/cuda.h"
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

/* Dense bf16 tensor-core peak (no sparsity), TFLOP/s, from the device name. */
static double peak_for(const char *name)
{
    if (strstr(name, "H200")) return 989.0;
    if (strstr(name, "H100") && strstr(name, "PCIe")) return 756.0;
    if (strstr(name, "H100")) return 989.0;
    if (strstr(name, "A100")) return 312.0;
    return 0.0;
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

static int run_make(const eng_backend_t *be, const eng_gpt_config_t *cfg, int B, run_t *r,
                    kiln_err_t *err)
{
    memset(r, 0, sizeof(*r));
    int rc = eng_gpt_create(cfg, be, B, &r->m, err);
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
    for (int i = 0; i < m->p.n_tensors; i++) {
        const eng_tensor_t *tt = &m->p.tensors[i];
        be->adamw_update(m->p.params + tt->off, m->p.grads + tt->off, r->mom + tt->off,
                         r->var + tt->off, tt->n, 3e-4f, 0.9f, 0.95f, 1e-8f,
                         tt->decay ? 0.1f : 0.0f, scale, t);
    }
    be->synchronize();
    return loss;
}

int main(int argc, char **argv)
{
    const char *config = "124m", *matmul = "bf16";
    int64_t T = 1024, B = 0, steps = 20, warmup = 5, det = 1;
    double peak = 0;
    config_flag_t flags[] = {
        {"config", NULL, CONFIG_STR, &config, "124m or small"},
        {"T", NULL, CONFIG_INT, &T, "sequence length"},
        {"B", NULL, CONFIG_INT, &B, "batch; 0: the largest that fits (powers of two and 3/4 steps)"},
        {"steps", NULL, CONFIG_INT, &steps, "timed steps"},
        {"warmup", NULL, CONFIG_INT, &warmup, "untimed steps first"},
        {"matmul", "KILN_CUDA_MATMUL", CONFIG_STR, &matmul, "bf16, tf32 or fp32 GEMMs"},
        {"peak-tflops", "KILN_PEAK_TFLOPS", CONFIG_DOUBLE, &peak, "0: from the device name"},
        {"deterministic", NULL, CONFIG_INT, &det, "1: no atomics (default), 0: allow them"},
    };
    kiln_err_t err;
    memset(&err, 0, sizeof(err));
    int rc = config_parse(argc, argv, flags, KILN_ARRAY_LEN(flags), "[options]", NULL, &err);
    if (rc) return rc == 1 ? 0 : 2;
    const bcfg_t *c = NULL;
    for (size_t i = 0; i < KILN_ARRAY_LEN(CONFIGS); i++)
        if (!strcmp(config, CONFIGS[i].name)) c = &CONFIGS[i];
    if (!c || T < 1 || steps < 1 || warmup < 0) {
        fprintf(stderr, "cuda_gpt_bench: bad --config/--T/--steps\n");
        return 2;
    }

    const eng_backend_t *be = NULL;
    if (eng_backend_get("cuda", &be, &err) != 0) {
        printf("{\"impl\": \"kiln-cuda\", \"skipped\": \"%s\"}\n", err.message);
        return 0;
    }
    Dl_info info;
    void *h = dladdr((const void *)be, &info) ? dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD) : NULL;
    const eng_cuda_ext_t *x = h ? (const eng_cuda_ext_t *)dlsym(h, "eng_cuda_ext") : NULL;
    if (!x) {
        fprintf(stderr, "cuda_gpt_bench: libkiln_cuda.so has no eng_cuda_ext\n");
        return 1;
    }
    if (x->set_matmul_mode(matmul) != 0) {
        fprintf(stderr, "cuda_gpt_bench: bad --matmul %s\n", matmul);
        return 2;
    }
    x->set_deterministic((int)det);
    char dev[128] = "";
    int ord = 0, ccM = 0, ccm = 0, sms = 0;
    x->device_info(dev, sizeof(dev), &ord, &ccM, &ccm, &sms);
    if (peak <= 0) peak = peak_for(dev);

    eng_gpt_config_t cfg = {(int)T, c->V, c->Vp, c->L, c->NH, c->C};
    run_t r;
    static const int tries[] = {128, 96, 64, 48, 32, 24, 16, 12, 8, 6, 4, 3, 2, 1};
    int bsel = 0, ntries = B > 0 ? 1 : (int)KILN_ARRAY_LEN(tries);
    int32_t *tok = NULL, *tgt = NULL;
    eng_rng_t rng;
    eng_rng_seed(&rng, 42);
    /* A batch fits when the model, its activations and one whole step (with the backend's
     * scratch) run without a device error; out-of-memory while probing is forgotten. */
    for (int i = 0; i < ntries && !bsel; i++) {
        int b = B > 0 ? (int)B : tries[i];
        if (run_make(be, &cfg, b, &r, &err) == 0) {
            eng_gpt_init_weights(r.m, 1337);
            tok = realloc(tok, sizeof(int32_t) * b * T);
            tgt = realloc(tgt, sizeof(int32_t) * b * T);
            step(be, &r, c, tok, tgt, b * (int)T, &rng, 1);
            if (x->status(&err, 1) == 0) bsel = b;
            else run_free(be, &r);
        }
        x->status(NULL, 1);
    }
    if (!bsel) {
        fprintf(stderr, "cuda_gpt_bench: no batch fits: %s\n", err.message);
        return 1;
    }
    int BT = bsel * (int)T;
    double *times = calloc((size_t)steps, sizeof(double));
    float first = 0, last = 0;
    x->mem_reset_peak();
    for (int s = 0; s < warmup + steps; s++) {
        double t0 = kiln_mono_s();
        float loss = step(be, &r, c, tok, tgt, BT, &rng, s + 2);
        double dt = kiln_mono_s() - t0;
        if (s == 0) first = loss;
        last = loss;
        if (s >= warmup) times[s - warmup] = dt;
    }
    int st = x->status(&err, 0);
    if (st) {
        fprintf(stderr, "cuda_gpt_bench: %s\n", err.message);
        return 1;
    }
    eng_cuda_mem_t mem;
    x->mem_stats(&mem);
    qsort(times, (size_t)steps, sizeof(double), cmp_double);
    double med = steps % 2 ? times[steps / 2] : 0.5 * (times[steps / 2 - 1] + times[steps / 2]);
    double tps = BT / med, fpt = eng_gpt_flops_per_token(&cfg);
    printf("{\"impl\": \"kiln-cuda\", \"device\": \"%s\", \"cc\": \"%d.%d\", \"sms\": %d, "
           "\"config\": \"%s\", \"T\": %d, \"B\": %d, \"matmul\": \"%s\", \"deterministic\": %d, "
           "\"params\": %zu, \"ms_per_step\": %.2f, \"min_ms\": %.2f, \"tokens_per_s\": %.1f, "
           "\"model_tflops_per_step\": %.3f, \"achieved_tflops\": %.1f, \"peak_tflops\": %.1f, "
           "\"mfu\": %.4f, \"gpu_mem_mb\": %.1f, \"gpu_mem_peak_mb\": %.1f, "
           "\"loss_first\": %.4f, \"loss_last\": %.4f}\n",
           dev, ccM, ccm, sms, c->name, (int)T, bsel, matmul, (int)det, r.m->p.n, med * 1e3,
           times[0] * 1e3, tps, fpt * BT / 1e12, fpt * tps / 1e12, peak,
           peak > 0 ? fpt * tps / (peak * 1e12) : 0.0, mem.tracked_bytes / 1048576.0,
           mem.tracked_peak_bytes / 1048576.0, first, last);
    free(times);
    free(tok);
    free(tgt);
    run_free(be, &r);
    return 0;
}
