/* test_train_modes.c - the training loop's accepted modes, each against the plain run in a
 * forked process of its own (one thread each, side by side):
 *  - distribution.mixed_precision "bf16": 300 steps of the small benchmark configuration (4
 *    layers, C=256, T=128, 8 sequences a step) on tinyshakespeare end within 2% of the fp32
 *    run's validation loss, and the runs are not bit-identical (the GEMMs really ran in bf16);
 *  - distribution.activation_checkpointing: 20 steps give the same parameters bit for bit, and
 *    the process's peak resident memory is lower (both figures are printed).
 * The figures go to stderr, and bench/RESULTS.md records them. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/engine.h"
#include "spec/spec.h"
#include "tests/common/harness.h"

#define MAXSTEPS 300

typedef struct run_out {
    int rc;
    char msg[512];
    int n;
    float losses[MAXSTEPS];
    float val_loss;
    double peak_mem_mb;
    double seconds;
} run_out_t;

static char g_dir[64];

/* Trains spec text in a child process with one thread; out (shared memory) gets the result. */
static pid_t start_run(const char *text, const char *out_dir, run_out_t *out)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid)
        return pid;
    spec_t s;
    kiln_err_t err;
    kiln_err_clear(&err);
    eng_train_result_t res = {0};
    int rc = spec_parse_string(text, &s, &err);
    double t0 = kiln_mono_s();
    if (!rc) {
        eng_train_opts_t o = {.output_dir = out_dir, .metrics_fd = -1, .world = 1, .threads = 1,
                              .peak_gflops = 100, .quiet = true};
        rc = eng_train_run(&s, &o, &res, &err);
    }
    out->rc = rc;
    snprintf(out->msg, sizeof(out->msg), "%s%s%s", err.field, err.field[0] ? ": " : "", err.message);
    out->n = (int)(res.n_losses < MAXSTEPS ? res.n_losses : MAXSTEPS);
    for (int i = 0; i < out->n; i++)
        out->losses[i] = res.losses[i];
    out->val_loss = res.last_val_loss;
    out->peak_mem_mb = res.peak_mem_mb;
    out->seconds = kiln_mono_s() - t0;
    _exit(0);
}

static run_out_t *run_pair(const char *a, const char *out_a, const char *b, const char *out_b)
{
    run_out_t *o = mmap(NULL, 2 * sizeof(run_out_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(o != MAP_FAILED);
    memset(o, 0, 2 * sizeof(run_out_t));
    o[0].rc = o[1].rc = -100;
    pid_t p[2] = {start_run(a, out_a, &o[0]), start_run(b, out_b, &o[1])};
    for (int k = 0; k < 2; k++) {
        int st;
        cr_assert_eq(waitpid(p[k], &st, 0), p[k]);
        cr_assert(WIFEXITED(st), "run %d died (status 0x%x)", k, st);
        cr_assert_eq(o[k].rc, 0, "run %d failed: %s", k, o[k].msg);
    }
    return o;
}

static const char *data_path(void)
{
    static char path[1200];
    const char *root = getenv("KILN_ROOT");
    snprintf(path, sizeof(path), "%s/data/tinyshakespeare.txt", root ? root : ".");
    return path;
}

static void rm_dir(void)
{
    cr_assert(th_rm_tree(g_dir), "could not remove %s", g_dir);
}

/* The small configuration of bench/engine_bench.c, trained on bytes of Shakespeare. */
#define SMALL_SPEC                                                                                 \
    "{\"model\": {\"type\": \"gpt\", \"n_layer\": 4, \"n_head\": 4, \"n_embd\": 256, "           \
    "\"seq_len\": 128, \"vocab\": \"bytes\"}, \"data\": {\"train\": \"%s\"}, "                     \
    "\"hyperparameters\": {\"lr\": 2e-3, \"global_batch_size\": 8, \"max_steps\": %d, "          \
    "\"warmup_steps\": 30, \"weight_decay\": 0.1, \"grad_clip\": 1.0, \"seed\": 1337, "           \
    "\"eval_every\": 0, \"eval_batches\": 8, \"sample_tokens\": 0}, "                              \
    "\"resources\": {\"device\": \"cpu\"}%s}"

Test(train_modes, bf16_ends_within_two_percent_of_fp32, .timeout = 600)
{
    char fp32[2048], bf16[2048];
    snprintf(fp32, sizeof(fp32), SMALL_SPEC, data_path(), MAXSTEPS, "");
    snprintf(bf16, sizeof(bf16), SMALL_SPEC, data_path(), MAXSTEPS,
             ", \"distribution\": {\"mixed_precision\": \"bf16\"}");
    run_out_t *o = run_pair(fp32, NULL, bf16, NULL);
    cr_assert_eq(o[0].n, MAXSTEPS);
    cr_assert_eq(o[1].n, MAXSTEPS);
    int differ = 0;
    for (int i = 0; i < MAXSTEPS; i++)
        differ += memcmp(&o[0].losses[i], &o[1].losses[i], sizeof(float)) != 0;
    double rel = fabs((double)o[1].val_loss - o[0].val_loss) / o[0].val_loss;
    fprintf(stderr, "bf16 vs fp32, small configuration, %d steps: val loss %.4f vs %.4f (%.2f%%), "
                    "train loss %.4f vs %.4f, %d of %d step losses differ, %.1f s vs %.1f s (1 thread each)\n",
            MAXSTEPS, o[1].val_loss, o[0].val_loss, rel * 100, o[1].losses[MAXSTEPS - 1],
            o[0].losses[MAXSTEPS - 1], differ, MAXSTEPS, o[1].seconds, o[0].seconds);
    cr_assert(o[0].val_loss < 2.6f, "fp32 did not learn: val loss %.4f", o[0].val_loss);
    cr_assert_leq(rel, 0.02, "bf16 val loss %.4f is %.2f%% off fp32's %.4f", o[1].val_loss, rel * 100,
                  o[0].val_loss);
    cr_assert_gt(differ, MAXSTEPS / 2, "only %d step losses differ: did the GEMMs run in bf16?", differ);
    munmap(o, 2 * sizeof(run_out_t));
}

static float *load_model(const char *dir, size_t *n)
{
    char path[160];
    snprintf(path, sizeof(path), "%s/model_llmc.bin", dir);
    eng_gpt_config_t cfg;
    float *p = NULL;
    kiln_err_t err;
    cr_assert_eq(eng_gpt_llmc_read(path, &cfg, &p, &err), 0, "%s", err.message);
    *n = eng_gpt_num_params(&cfg);
    return p;
}

/* Activations dominate this model's memory (8 x 256 tokens of C=128, 4 layers: about 40 MiB
 * kept for backward without checkpointing, a tenth of that with it). */
#define CKPT_SPEC                                                                                  \
    "{\"model\": {\"type\": \"gpt\", \"n_layer\": 4, \"n_head\": 4, \"n_embd\": 128, "           \
    "\"seq_len\": 256, \"vocab\": \"bytes\"}, \"data\": {\"train\": \"%s\"}, "                     \
    "\"hyperparameters\": {\"lr\": 2e-3, \"global_batch_size\": 8, \"max_steps\": 20, "          \
    "\"warmup_steps\": 5, \"seed\": 7, \"eval_every\": 0, \"eval_batches\": 2, \"sample_tokens\": 0}, " \
    "\"resources\": {\"device\": \"cpu\"}, \"distribution\": {\"activation_checkpointing\": %s}}"

Test(train_modes, activation_checkpointing_same_parameters_less_memory, .timeout = 300)
{
    snprintf(g_dir, sizeof(g_dir), "/tmp/kiln-ckpt-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
    char plain[2048], rc[2048], out_a[128], out_b[128];
    snprintf(plain, sizeof(plain), CKPT_SPEC, data_path(), "false");
    snprintf(rc, sizeof(rc), CKPT_SPEC, data_path(), "true");
    snprintf(out_a, sizeof(out_a), "%s/plain", g_dir);
    snprintf(out_b, sizeof(out_b), "%s/recompute", g_dir);
    run_out_t *o = run_pair(plain, out_a, rc, out_b);
    size_t na, nb;
    float *a = load_model(out_a, &na), *b = load_model(out_b, &nb);
    cr_assert_eq(na, nb);
    cr_assert(memcmp(a, b, na * sizeof(float)) == 0, "parameters differ after 20 steps");
    cr_assert(memcmp(o[0].losses, o[1].losses, 20 * sizeof(float)) == 0, "losses differ");
    fprintf(stderr, "activation checkpointing, 20 steps (L4 C128 T256 B8): parameters identical (%zu), peak RSS "
                    "%.1f MB without, %.1f MB with; %.2f s vs %.2f s\n", na, o[0].peak_mem_mb, o[1].peak_mem_mb,
            o[0].seconds, o[1].seconds);
    cr_assert_lt(o[1].peak_mem_mb, o[0].peak_mem_mb - 20, "peak RSS %.1f MB with checkpointing, %.1f without",
                 o[1].peak_mem_mb, o[0].peak_mem_mb);
    free(a);
    free(b);
    munmap(o, 2 * sizeof(run_out_t));
    rm_dir();
}
