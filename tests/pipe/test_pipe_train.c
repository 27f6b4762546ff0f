/* test_pipe_train.c - pipelined training with real processes: ranks are forked, rendezvous over
 * TCP and move activations and gradients over libfabric's shm provider. Each run trains a tiny
 * GPT for 20 steps and is compared with single-rank training of the same spec (engine/train.c):
 * every step's loss and the final parameters (the llm.c model file rank 0 writes) must agree
 * within the tolerances below. Both go through the one training loop (eng_job_run). Covers 2 and 4 stages, both schedules, 1 to 8 microbatches,
 * activation checkpointing, hybrid 2 x 2 data x pipeline, and a manual plan. */
#include "engine/job.h"
#include "engine/pipe/pipe.h"
#include "spec/spec.h"
#include "tests/common/harness.h"
#include "tests/pipe/pipe_test.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <glob.h>
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Differences come only from summation order (microbatched weight-gradient GEMMs, per-range
 * norms), so they stay near float rounding; these bounds leave 3-5x room over what we measure (up to 6e-5 on parameters). */
#define LOSS_RTOL 1e-4
#define PARAM_ATOL 2e-4
#define STEPS 20
#define MAXR 4

typedef struct rank_out {
    int rc;
    char msg[512];
    int n;
    float losses[STEPS];
    float val_loss;
    int first, last, peak_live, n_stages, n_blocks, head_blocks;
    double bubble;
} rank_out_t;

static char g_dir[64];

static void make_data(void)
{
    pipe_test_remove_stale_shm();
    snprintf(g_dir, sizeof(g_dir), "/tmp/kiln-pipe-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
    char path[128];
    snprintf(path, sizeof(path), "%s/data.txt", g_dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    static const char *words[] = {"the", "kiln", "fires", "clay", "into", "stone", "and", "a", "pot",
                                  "holds", "water", "while", "glaze", "runs", "slowly", "over", "its", "rim"};
    uint64_t x = 42;
    for (int i = 0; i < 6000; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        fprintf(f, "%s%s", words[(x >> 33) % 18], (x >> 20) % 9 == 0 ? ".\n" : " ");
    }
    fclose(f);
}

static const char *g_extra = "";    /* extra top-level spec fields */
static const char *g_hp_extra = ""; /* extra hyperparameters */
static const char *g_dist_extra = ""; /* extra distribution fields (the reference gets them too) */
static double g_loss_rtol = LOSS_RTOL, g_param_atol = PARAM_ATOL;

static void spec_text(char *buf, size_t n, int n_layer, int world, int parts, int micro, const char *sched,
                      bool ckpt, const char *plan)
{
    char planf[256] = "";
    if (plan)
        snprintf(planf, sizeof(planf), ", \"partition_plan\": %s", plan);
    snprintf(buf, n,
             "{\"name\": \"pipe-test\", \"model\": {\"type\": \"gpt\", \"n_layer\": %d, \"n_head\": 2, \"n_embd\": 32,"
             " \"seq_len\": 16, \"vocab\": \"bytes\"}, \"data\": {\"train\": \"%s/data.txt\", \"val_fraction\": 0.1},"
             " \"hyperparameters\": {\"lr\": 3e-3, \"global_batch_size\": 8, \"max_steps\": %d, \"warmup_steps\": 2,"
             " \"grad_clip\": 1.0, \"seed\": 7, \"eval_every\": 0, \"eval_batches\": 2, \"sample_every\": 0,"
             " \"sample_tokens\": 0%s},"
             " \"resources\": {\"nodes\": 1, \"slots_per_node\": %d, \"threads_per_rank\": 1},"
             " \"distribution\": {\"model_parallel\": {\"partitions\": %d, \"microbatches\": %d, \"pipeline\": \"%s\"%s},"
             " \"activation_checkpointing\": %s%s}%s}",
             n_layer, g_dir, STEPS, g_hp_extra, world, parts, micro, sched, planf, ckpt ? "true" : "false", g_dist_extra,
             g_extra);
}

static rank_out_t *shared_outs(void)
{
    rank_out_t *o = mmap(NULL, sizeof(rank_out_t) * MAXR, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(o != MAP_FAILED);
    memset(o, 0, sizeof(rank_out_t) * MAXR);
    return o;
}

static void wait_check(rank_out_t *outs, int n)
{
    for (int r = 0; r < n; r++)
        cr_assert_eq(outs[r].rc, 0, "rank %d failed: %s", r, outs[r].msg);
}

static void wait_all(pid_t *pids, int n, rank_out_t *outs, bool check)
{
    double deadline = kiln_mono_s() + 120;
    for (int r = 0; r < n; r++) {
        int st;
        while (waitpid(pids[r], &st, WNOHANG) == 0) {
            if (kiln_mono_s() > deadline) {
                for (int k = 0; k < n; k++)
                    kill(pids[k], SIGKILL);
                cr_assert_fail("rank %d did not finish in time", r);
            }
            usleep(10000);
        }
        cr_assert(WIFEXITED(st), "rank %d died (status 0x%x)", r, st);
    }
    if (check)
        wait_check(outs, n);
}

/* Single-rank reference in a child process (OpenMP is never started in the test process, so
 * forking ranks stays safe). Writes <g_dir>/ref/model_llmc.bin. */
static rank_out_t *run_reference(int n_layer)
{
    char text[4096], out_dir[128];
    spec_text(text, sizeof(text), n_layer, 1, 1, 1, "simple", false, NULL);
    snprintf(out_dir, sizeof(out_dir), "%s/ref%d", g_dir, n_layer);
    rank_out_t *outs = shared_outs();
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        spec_t s;
        kiln_err_t err;
        kiln_err_clear(&err);
        int rc = spec_parse_string(text, &s, &err);
        eng_train_result_t res = {0};
        if (!rc) {
            eng_train_opts_t o = {.output_dir = out_dir, .metrics_fd = -1, .rank = 0, .world = 1, .threads = 1,
                                  .peak_gflops = 100, .quiet = true};
            rc = eng_train_run(&s, &o, &res, &err);
        }
        outs[0].rc = rc;
        snprintf(outs[0].msg, sizeof(outs[0].msg), "%s", err.message);
        for (int i = 0; i < res.n_losses && i < STEPS; i++)
            outs[0].losses[i] = res.losses[i];
        outs[0].n = (int)res.n_losses;
        outs[0].val_loss = res.last_val_loss;
        _exit(0);
    }
    wait_all(&pid, 1, outs, true);
    cr_assert_eq(outs[0].n, STEPS);
    return outs;
}

typedef struct run_cfg {
    int n_layer, world, parts, micro;
    const char *sched;
    bool ckpt;
    const char *plan;
    const char *ckpt_dir; /* checkpoint directory, or NULL */
    const char *ckpt_dir_others; /* when set, the other ranks' (as if on other nodes) */
} run_cfg_t;

static rank_out_t *run_pipeline_once(const run_cfg_t *c, const char *out_dir, bool *busy);

/* Runs the ranks; once more when a rank met a stale shm region (see pipe_test.h). */
static rank_out_t *run_pipeline(const run_cfg_t *c, const char *out_dir)
{
    bool busy = false;
    rank_out_t *outs = run_pipeline_once(c, out_dir, &busy);
    if (busy) {
        pipe_test_remove_stale_shm();
        outs = run_pipeline_once(c, out_dir, &busy);
    }
    wait_check(outs, c->world);
    return outs;
}

static rank_out_t *run_pipeline_once(const run_cfg_t *c, const char *out_dir, bool *busy)
{
    char text[4096];
    spec_text(text, sizeof(text), c->n_layer, c->world, c->parts, c->micro, c->sched, c->ckpt, c->plan);
    rank_out_t *outs = shared_outs();
    int port = th_free_port();
    pid_t pids[MAXR];
    for (int r = 0; r < c->world; r++) {
        pids[r] = fork();
        cr_assert(pids[r] >= 0);
        if (pids[r] != 0)
            continue;
        rank_out_t *me = &outs[r];
        me->rc = -100;
        spec_t s;
        kiln_err_t err;
        kiln_err_clear(&err);
        comm_t *w = NULL;
        int rc = spec_parse_string(text, &s, &err);
        if (!rc) {
            comm_config_t cc;
            comm_config_init(&cc);
            cc.rank = r;
            cc.world_size = c->world;
            cc.master_port = port;
            cc.provider = "shm";
            cc.timeout_s = 30;
            rc = comm_create(&cc, &w, &err);
        }
        eng_train_result_t res = {0};
        eng_job_info_t job;
        memset(&job, 0, sizeof(job));
        pipe_train_info_t info = {0};
        if (!rc) {
            eng_train_opts_t o = {.output_dir = out_dir, .checkpoint_dir = r && c->ckpt_dir_others ? c->ckpt_dir_others : c->ckpt_dir, .metrics_fd = -1, .rank = r,
                                  .world = c->world, .threads = 1, .peak_gflops = 100, .quiet = true};
            rc = eng_job_run(&s, &o, w, &res, &job, &err);
            info = job.pipe;
        }
        snprintf(me->msg, sizeof(me->msg), "%s", err.message);
        for (int i = 0; i < res.n_losses && i < STEPS; i++)
            me->losses[i] = res.losses[i];
        me->n = (int)res.n_losses;
        me->val_loss = res.last_val_loss;
        if (!rc) {
            me->first = info.plan.stages[info.stage].first;
            me->last = info.plan.stages[info.stage].last;
            me->peak_live = info.peak_live;
            me->n_stages = info.n_stages;
            me->n_blocks = info.plan.n_blocks;
            me->head_blocks = info.plan.head_blocks;
            me->bubble = info.bubble_measured;
        }
        comm_destroy(w);
        me->rc = rc;
        _exit(0);
    }
    wait_all(pids, c->world, outs, false);
    *busy = false;
    for (int r = 0; r < c->world; r++)
        *busy |= outs[r].rc != 0 && strstr(outs[r].msg, "Device or resource busy") != NULL;
    return outs;
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

static void check_equal(const run_cfg_t *c)
{
    make_data();
    rank_out_t *ref = run_reference(c->n_layer);
    char out_dir[128], ref_dir[128];
    snprintf(out_dir, sizeof(out_dir), "%s/pipe", g_dir);
    snprintf(ref_dir, sizeof(ref_dir), "%s/ref%d", g_dir, c->n_layer);
    rank_out_t *outs = run_pipeline(c, out_dir);
    int dp = c->world / c->parts;
    for (int r = 0; r < c->world; r++) {
        cr_assert_eq(outs[r].n, STEPS, "rank %d ran %d steps", r, outs[r].n);
        for (int i = 0; i < STEPS; i++)
            cr_assert(fabsf(outs[r].losses[i] - ref->losses[0 * 0 + i]) <= g_loss_rtol * fabsf(ref->losses[i]),
                      "%d stages x %d, %s, m=%d: rank %d step %d loss %.7f, single rank %.7f", c->parts, dp, c->sched,
                      c->micro, r, i + 1, outs[r].losses[i], ref->losses[i]);
        cr_assert(fabsf(outs[r].val_loss - ref->val_loss) <= g_loss_rtol * fabsf(ref->val_loss),
                  "val loss %.7f, single rank %.7f", outs[r].val_loss, ref->val_loss);
        int stage = r % c->parts;
        cr_assert_eq(outs[r].n_stages, c->parts);
        int want_live = c->sched[0] == 's' ? c->micro : (c->micro < c->parts - stage ? c->micro : c->parts - stage);
        cr_assert_eq(outs[r].peak_live, want_live, "rank %d kept %d activation sets, want %d", r, outs[r].peak_live,
                     want_live);
    }
    /* the stages tile the model */
    cr_assert_eq(outs[0].first, 0);
    for (int k = 1; k < c->parts; k++)
        cr_assert_eq(outs[k].first, outs[k - 1].last + 1);
    cr_assert_eq(outs[0].n_blocks, 2 * c->n_layer + 1 + outs[0].head_blocks);
    cr_assert_eq(outs[c->parts - 1].last, outs[0].n_blocks - 1);
    cr_assert(ref->losses[STEPS - 1] < ref->losses[0] - 0.5f, "the model learns (%.3f -> %.3f)", ref->losses[0],
              ref->losses[STEPS - 1]);
    size_t n1, n2;
    float *a = load_model(ref_dir, &n1), *b = load_model(out_dir, &n2);
    cr_assert_eq(n1, n2);
    double maxd = 0;
    size_t at = 0;
    for (size_t i = 0; i < n1; i++)
        if (fabs((double)a[i] - b[i]) > maxd) {
            maxd = fabs((double)a[i] - b[i]);
            at = i;
        }
    cr_assert_leq(maxd, g_param_atol, "parameters differ by %.3g at %zu (%.7f vs %.7f)", maxd, at, a[at], b[at]);
    fprintf(stderr, "pipe_train %d stages x %d, %s, m=%d%s, %d head blocks: max |loss diff| rel %.2g, max |param "
                    "diff| %.2g, bubble %.2f\n", c->parts, dp, c->sched, c->micro, c->ckpt ? ", checkpointing" : "",
            outs[0].head_blocks,
            (double)fabsf(outs[0].losses[STEPS - 1] - ref->losses[STEPS - 1]) / ref->losses[STEPS - 1], maxd,
            outs[0].bubble);
    free(a);
    free(b);
    cr_assert(th_rm_tree(g_dir), "could not remove %s", g_dir);
}

Test(pipe_train, two_stages_simple_m1, .timeout = 120)
{
    check_equal(&(run_cfg_t){.n_layer = 2, .world = 2, .parts = 2, .micro = 1, .sched = "simple"});
}

Test(pipe_train, two_stages_simple_m8, .timeout = 120)
{
    check_equal(&(run_cfg_t){.n_layer = 2, .world = 2, .parts = 2, .micro = 8, .sched = "simple"});
}

Test(pipe_train, two_stages_interleaved_m4, .timeout = 120)
{
    check_equal(&(run_cfg_t){.n_layer = 2, .world = 2, .parts = 2, .micro = 4, .sched = "interleaved"});
}

Test(pipe_train, two_stages_interleaved_m2_checkpointing, .timeout = 120)
{
    check_equal(&(run_cfg_t){.n_layer = 2, .world = 2, .parts = 2, .micro = 2, .sched = "interleaved", .ckpt = true});
}

Test(pipe_train, four_stages_interleaved_m8, .timeout = 120)
{
    check_equal(&(run_cfg_t){.n_layer = 2, .world = 4, .parts = 4, .micro = 8, .sched = "interleaved"});
}

Test(pipe_train, four_stages_simple_m2, .timeout = 120)
{
    check_equal(&(run_cfg_t){.n_layer = 2, .world = 4, .parts = 4, .micro = 2, .sched = "simple"});
}

Test(pipe_train, four_stages_interleaved_m1, .timeout = 120)
{
    check_equal(&(run_cfg_t){.n_layer = 2, .world = 4, .parts = 4, .micro = 1, .sched = "interleaved"});
}

/* The rest of the 2 and 4 stages x both schedules x m in {1, 2, 4, 8} matrix. */
#define MATRIX(name, P, SCHED, M)                                                                  \
    Test(pipe_train, name, .timeout = 120)                                                         \
    {                                                                                              \
        check_equal(&(run_cfg_t){.n_layer = 2, .world = P, .parts = P, .micro = M, .sched = SCHED}); \
    }
MATRIX(two_stages_simple_m2, 2, "simple", 2)
MATRIX(two_stages_simple_m4, 2, "simple", 4)
MATRIX(two_stages_interleaved_m1, 2, "interleaved", 1)
MATRIX(two_stages_interleaved_m2, 2, "interleaved", 2)
MATRIX(two_stages_interleaved_m8, 2, "interleaved", 8)
MATRIX(four_stages_simple_m1, 4, "simple", 1)
MATRIX(four_stages_simple_m4, 4, "simple", 4)
MATRIX(four_stages_simple_m8, 4, "simple", 8)
MATRIX(four_stages_interleaved_m2, 4, "interleaved", 2)
MATRIX(four_stages_interleaved_m4, 4, "interleaved", 4)

Test(pipe_train, accumulation_passes_equal_single_rank, .timeout = 120)
{
    /* micro_batch_size 4 of a global batch of 8: two pipeline passes of 2 microbatches of 2 per
     * step, gradients accumulated over both (the reference takes all 8 sequences at once) */
    make_data();
    rank_out_t *ref = run_reference(2);
    char ref_dir[128], out_dir[128];
    snprintf(ref_dir, sizeof(ref_dir), "%s/ref2", g_dir);
    snprintf(out_dir, sizeof(out_dir), "%s/pipe", g_dir);
    g_hp_extra = ", \"micro_batch_size\": 4";
    run_cfg_t c = {.n_layer = 2, .world = 2, .parts = 2, .micro = 2, .sched = "interleaved"};
    rank_out_t *outs = run_pipeline(&c, out_dir);
    g_hp_extra = "";
    for (int i = 0; i < STEPS; i++)
        cr_assert(fabsf(outs[0].losses[i] - ref->losses[i]) <= LOSS_RTOL * ref->losses[i], "step %d: %.7f vs %.7f",
                  i + 1, outs[0].losses[i], ref->losses[i]);
    size_t n1, n2;
    float *a = load_model(ref_dir, &n1), *b = load_model(out_dir, &n2);
    double maxd = 0;
    for (size_t i = 0; i < n1; i++)
        maxd = fmax(maxd, fabs((double)a[i] - b[i]));
    cr_assert_leq(maxd, PARAM_ATOL, "parameters differ by %.3g", maxd);
    free(a);
    free(b);
    cr_assert(th_rm_tree(g_dir), "could not remove %s", g_dir);
}

Test(pipe_train, hybrid_2x2_equals_single_rank, .timeout = 120)
{
    check_equal(&(run_cfg_t){.n_layer = 2, .world = 4, .parts = 2, .micro = 2, .sched = "interleaved"});
}

/* ZeRO-1 inside the pipeline: each stage's two replicas reduce-scatter their stage's gradient
 * buckets, update half each and all-gather the parameters. */
Test(pipe_train, hybrid_2x2_zero1_equals_single_rank, .timeout = 120)
{
    g_dist_extra = ", \"data_parallel\": {\"shard_optimizer_state\": true, \"bucket_mb\": 0.01}";
    check_equal(&(run_cfg_t){.n_layer = 2, .world = 4, .parts = 2, .micro = 2, .sched = "interleaved",
                             .plan = "{\"head_blocks\": 2, \"stages\": [[0, 3], [4, 6]]}"});
    g_dist_extra = "";
}

/* bf16 gradients between each stage's two replicas (the single rank has no replica to send to):
 * the hybrid run tracks it within bf16's rounding of the gradients. (Held to the fp32 runs'
 * tolerances it fails, parameters ~3e-3 apart: the gradients did cross as bf16.) */
Test(pipe_train, hybrid_2x2_bf16_gradients_track_single_rank, .timeout = 120)
{
    g_dist_extra = ", \"data_parallel\": {\"gradient_dtype\": \"bf16\", \"bucket_mb\": 0.01}";
    g_loss_rtol = 1e-3;
    g_param_atol = 1e-2;
    check_equal(&(run_cfg_t){.n_layer = 2, .world = 4, .parts = 2, .micro = 2, .sched = "interleaved"});
    g_dist_extra = "";
    g_loss_rtol = LOSS_RTOL;
    g_param_atol = PARAM_ATOL;
}

/* bf16 mixed precision through a pipeline with the head split over both stages, against the
 * single-rank bf16 run: the same bf16 GEMMs, summed in another order, so a bf16 rounding may
 * land on the other side of a tie now and then: losses within 2e-3, parameters within 1e-3. */
Test(pipe_train, bf16_two_stages_equals_single_rank, .timeout = 120)
{
    g_dist_extra = ", \"mixed_precision\": \"bf16\"";
    g_loss_rtol = 2e-3;
    g_param_atol = 1e-3;
    check_equal(&(run_cfg_t){.n_layer = 2, .world = 2, .parts = 2, .micro = 2, .sched = "interleaved",
                             .plan = "{\"head_blocks\": 3, \"stages\": [[0, 5], [6, 7]]}"});
    g_dist_extra = "";
    g_loss_rtol = LOSS_RTOL;
    g_param_atol = PARAM_ATOL;
}

/* The head cut into 3 vocabulary slices (manual plans, so the cut does not depend on timings):
 * on 2 stages, slice 0 (with the final LayerNorm) shares stage 0 with the embedding and slices
 * 1-2 sit on stage 1; on 4 stages, slice 0 follows layer 1's MLP half and slices 1 and 2 have a
 * stage each, so the softmax statistics travel forward over two hops, the log-sum-exp back, and
 * three stages sum their rows of the tied embedding's gradient with stage 0. */
Test(pipe_train, split_head_two_stages, .timeout = 120)
{
    check_equal(&(run_cfg_t){.n_layer = 2, .world = 2, .parts = 2, .micro = 2, .sched = "interleaved",
                             .plan = "{\"head_blocks\": 3, \"stages\": [[0, 5], [6, 7]]}"});
}

Test(pipe_train, split_head_four_stages, .timeout = 120)
{
    check_equal(&(run_cfg_t){.n_layer = 2, .world = 4, .parts = 4, .micro = 4, .sched = "interleaved",
                             .plan = "{\"head_blocks\": 3, \"stages\": [[0, 3], [4, 5], [6, 6], [7, 7]]}"});
}

Test(pipe_train, manual_plan_is_honoured, .timeout = 120)
{
    /* 3 layers -> 8 blocks; the embedding, layer 0 and layer 1's attention half on stage 0, the rest
     * (layer 1's MLP half on) on stage 1 */
    run_cfg_t c = {.n_layer = 3, .world = 2, .parts = 2, .micro = 2, .sched = "simple",
                   .plan = "{\"stages\": [[0, 3], [4, 7]]}"};
    make_data();
    char out_dir[128];
    snprintf(out_dir, sizeof(out_dir), "%s/pipe", g_dir);
    rank_out_t *outs = run_pipeline(&c, out_dir);
    cr_assert_eq(outs[0].first, 0);
    cr_assert_eq(outs[0].last, 3);
    cr_assert_eq(outs[1].first, 4);
    cr_assert_eq(outs[1].last, 7);
    cr_assert_eq(outs[1].head_blocks, 1);
    /* the plan kiln wrote is the manual one, and reads back as a valid plan */
    char path[160], *text = NULL;
    size_t len;
    kiln_err_t err;
    snprintf(path, sizeof(path), "%s/partition_plan.json", out_dir);
    cr_assert_eq(kiln_file_read(path, &text, &len, &err), 0, "%s", err.message);
    cr_assert(strstr(text, "\"manual\": true"), "%s", text);
    json_t *j = json_loads(text, 0, NULL);
    pipe_plan_t p;
    cr_assert_eq(pipe_plan_from_json(j, 8, 2, &p, &err), 0, "%s", err.message);
    cr_assert_eq(p.stages[1].first, 4);
    pipe_plan_deinit(&p);
    json_decref(j);
    free(text);
    cr_assert(th_rm_tree(g_dir), "could not remove %s", g_dir);
}

Test(pipe_train, resume_from_checkpoint_is_exact, .timeout = 120)
{
    /* 20 steps with a checkpoint every 10; then the step-20 checkpoint is removed and a new run
     * resumes from step 10: its steps 11..20 and final parameters equal the uninterrupted run's.
     * The first run's plan (here a manual one, with the head in 3 slices) is saved beside the
     * checkpoint, and the resumed run, given no plan, must take it rather than make its own: a
     * different cut of the stages or of the head would sum in another order. */
    make_data();
    char ck[128], out1[128], out2[128], cmd[512];
    snprintf(ck, sizeof(ck), "%s/ckpt", g_dir);
    snprintf(out1, sizeof(out1), "%s/out1", g_dir);
    snprintf(out2, sizeof(out2), "%s/out2", g_dir);
    g_extra = ", \"checkpoint\": {\"every_steps\": 10, \"keep_last\": 5}";
    run_cfg_t c = {.n_layer = 2, .world = 2, .parts = 2, .micro = 2, .sched = "interleaved", .ckpt_dir = ck,
                   .plan = "{\"head_blocks\": 3, \"stages\": [[0, 5], [6, 7]]}"};
    rank_out_t *a = run_pipeline(&c, out1);
    snprintf(cmd, sizeof(cmd), "rm %s/ckpt_00000020.bin && ls %s/ckpt_00000010.bin %s/partition_plan.json >/dev/null",
             ck, ck, ck);
    cr_assert_eq(system(cmd), 0);
    c.plan = NULL;
    /* rank 1 as if on another node: its own checkpoint directory is empty, and it must take
     * rank 0's checkpoint rather than start over */
    char empty[128];
    snprintf(empty, sizeof(empty), "%s/ckpt-node1", g_dir);
    cr_assert_eq(mkdir(empty, 0755), 0);
    c.ckpt_dir_others = empty;
    rank_out_t *b = run_pipeline(&c, out2);
    g_extra = "";
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(b[r].head_blocks, 3, "rank %d resumed with %d head blocks", r, b[r].head_blocks);
        cr_assert_eq(b[r].first, a[r].first);
        cr_assert_eq(b[r].last, a[r].last);
    }
    cr_assert_eq(a[0].n, STEPS);
    cr_assert_eq(b[0].n, STEPS - 10, "the resumed run trained %d steps", b[0].n);
    cr_assert_eq(b[1].n, STEPS - 10, "rank 1 trained %d steps after the resume", b[1].n);
    for (int i = 0; i < STEPS - 10; i++)
        cr_assert_eq(b[0].losses[i], a[0].losses[10 + i], "step %d: %.8f after resume, %.8f uninterrupted", 11 + i,
                     b[0].losses[i], a[0].losses[10 + i]);
    size_t n1, n2;
    float *p1 = load_model(out1, &n1), *p2 = load_model(out2, &n2);
    cr_assert_eq(n1, n2);
    cr_assert_eq(memcmp(p1, p2, n1 * sizeof(float)), 0, "parameters differ after resume");
    free(p1);
    free(p2);
    cr_assert(th_rm_tree(g_dir), "could not remove %s", g_dir);
}
