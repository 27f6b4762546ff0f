/* test_job.c - eng_job_run, kiln-train's one entry into the training loop, across layouts: a
 * checkpoint written by a single rank, by two data-parallel ranks with ZeRO-1 (which gathers
 * its sharded optimizer state) and by a two-stage pipeline (which gathers its stages) is resumed
 * by each of the three, and every resumed run continues the uninterrupted single-rank run. The
 * layouts sum the same gradients in different orders, so losses agree to float rounding:
 * relative 1e-4 per step (the pipeline suite's bound), and the checkpoints' parameters to 1e-4.
 * Ranks are forked processes over libfabric's shm provider, one thread each. */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/job.h"
#include "spec/spec.h"
#include "tests/common/harness.h"

#define STEPS 10
#define HALF 5
#define LOSS_RTOL 1e-4
#define PARAM_ATOL 1e-4
#define MAXR 2

typedef enum { SINGLE = 0, DATA_PARALLEL, PIPELINE, N_LAYOUTS } layout_t;
static const char *const LAYOUT_NAMES[N_LAYOUTS] = {"single rank", "2 data-parallel ranks (ZeRO-1)",
                                                    "2 pipeline stages"};

typedef struct rank_out {
    int rc;
    char msg[512];
    int64_t start_step;
    int n;
    float losses[STEPS];
    char layout[32];
} rank_out_t;

static char g_dir[64];

static void spec_text(char *buf, size_t n, layout_t l)
{
    const char *dist = l == DATA_PARALLEL ? ", \"distribution\": {\"data_parallel\": {\"bucket_mb\": 0.01, "
                                            "\"shard_optimizer_state\": true}}"
                     : l == PIPELINE     ? ", \"distribution\": {\"model_parallel\": {\"partitions\": 2, "
                                            "\"microbatches\": 2, \"pipeline\": \"interleaved\"}}"
                                         : "";
    snprintf(buf, n,
             "{\"model\": {\"type\": \"gpt\", \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, \"seq_len\": 16, "
             "\"vocab\": \"bytes\"}, \"data\": {\"train\": \"%s/data/tinyshakespeare.txt\"}, "
             "\"hyperparameters\": {\"lr\": 3e-3, \"global_batch_size\": 8, \"max_steps\": %d, \"warmup_steps\": 2, "
             "\"grad_clip\": 1.0, \"seed\": 7, \"eval_every\": 0, \"eval_batches\": 1, \"sample_tokens\": 0}, "
             "\"resources\": {\"nodes\": 1, \"slots_per_node\": %d, \"threads_per_rank\": 1}, "
             "\"checkpoint\": {\"every_steps\": 0, \"keep_last\": 3}%s}",
             getenv("KILN_ROOT") ? getenv("KILN_ROOT") : ".", STEPS, l == SINGLE ? 1 : 2, dist);
}

static void rank_main(layout_t l, int rank, int world, int port, const char *ckpt, int64_t stop_after,
                      rank_out_t *out)
{
    char text[4096];
    spec_t s;
    kiln_err_t err;
    kiln_err_clear(&err);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (rank != 0 && !freopen("/dev/null", "w", stdout))
        _exit(3);
    spec_text(text, sizeof(text), l);
    int rc = spec_parse_string(text, &s, &err);
    comm_t *c = NULL;
    if (!rc && world > 1) {
        comm_config_t cc;
        comm_config_init(&cc);
        cc.rank = rank;
        cc.world_size = world;
        cc.master_port = port;
        cc.provider = "shm";
        cc.timeout_s = 30;
        rc = comm_create(&cc, &c, &err);
    }
    eng_train_result_t res = {0};
    eng_job_info_t info;
    memset(&info, 0, sizeof(info));
    if (!rc) {
        eng_train_opts_t o = {.checkpoint_dir = ckpt, .metrics_fd = -1, .rank = rank, .world = world,
                              .threads = 1, .peak_gflops = 100, .quiet = true, .stop_after_step = stop_after};
        rc = eng_job_run(&s, &o, c, &res, &info, &err);
    }
    out->rc = rc;
    snprintf(out->msg, sizeof(out->msg), "%s", err.message);
    snprintf(out->layout, sizeof(out->layout), "%s", info.layout ? info.layout : "");
    out->start_step = res.start_step;
    out->n = (int)(res.n_losses < STEPS ? res.n_losses : STEPS);
    for (int i = 0; i < out->n; i++)
        out->losses[i] = res.losses[i];
    eng_job_info_deinit(&info);
    comm_destroy(c);
    _exit(0);
}

/* Runs layout l (its ranks forked) with checkpoint directory ckpt, stopping after stop_after
 * (0: the end); returns rank 0's output. */
static rank_out_t run(layout_t l, const char *ckpt, int64_t stop_after)
{
    int world = l == SINGLE ? 1 : 2, port = th_free_port();
    rank_out_t *o = mmap(NULL, sizeof(rank_out_t) * MAXR, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(o != MAP_FAILED);
    memset(o, 0, sizeof(rank_out_t) * MAXR);
    pid_t pids[MAXR];
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < world; r++) {
        o[r].rc = -100;
        pids[r] = fork();
        cr_assert(pids[r] >= 0);
        if (pids[r] == 0)
            rank_main(l, r, world, port, ckpt, stop_after, &o[r]);
    }
    for (int r = 0; r < world; r++) {
        int st;
        cr_assert_eq(waitpid(pids[r], &st, 0), pids[r]);
        cr_assert(WIFEXITED(st), "%s: rank %d died (0x%x)", LAYOUT_NAMES[l], r, st);
        cr_assert_eq(o[r].rc, 0, "%s: rank %d failed: %s", LAYOUT_NAMES[l], r, o[r].msg);
    }
    rank_out_t out = o[0];
    munmap(o, sizeof(rank_out_t) * MAXR);
    return out;
}

static float *ckpt_params(const char *dir, size_t n)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/ckpt_%08d.bin", dir, HALF);
    float *p = malloc(sizeof(float) * n * 3);
    eng_ckpt_meta_t meta;
    memset(&meta, 0, sizeof(meta));
    kiln_err_t err;
    cr_assert_eq(eng_ckpt_read(path, &meta, &eng_ref_backend, p, p + n, p + 2 * n, n, &err), 0, "%s", err.message);
    cr_assert_eq(meta.step, HALF);
    return p;
}

Test(job, checkpoints_resume_across_layouts, .timeout = 300)
{
    snprintf(g_dir, sizeof(g_dir), "/tmp/kiln-job-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
    rank_out_t ref = run(SINGLE, NULL, 0);
    cr_assert_eq(ref.n, STEPS);
    eng_gpt_config_t cfg = {16, 256, 256, 2, 2, 32};
    size_t n = eng_gpt_num_params(&cfg);
    float *first = NULL;
    for (int from = 0; from < N_LAYOUTS; from++) {
        char src[128], cmd[512];
        snprintf(src, sizeof(src), "%s/from%d", g_dir, from);
        rank_out_t a = run((layout_t)from, src, HALF);
        cr_assert_eq(a.n, HALF);
        /* the checkpoint holds the whole model and optimizer state, whoever wrote it */
        float *p = ckpt_params(src, n);
        if (!first)
            first = p;
        double worst = 0;
        for (size_t i = 0; i < 3 * n; i++)
            worst = fmax(worst, fabs((double)p[i] - first[i]));
        cr_assert_leq(worst, PARAM_ATOL, "%s's checkpoint is %.3g off the single rank's", LAYOUT_NAMES[from], worst);
        if (p != first)
            free(p);
        for (int to = 0; to < N_LAYOUTS; to++) {
            char dst[128];
            snprintf(dst, sizeof(dst), "%s/from%d-to%d", g_dir, from, to);
            snprintf(cmd, sizeof(cmd), "cp -r %s %s", src, dst);
            cr_assert_eq(system(cmd), 0);
            rank_out_t b = run((layout_t)to, dst, 0);
            cr_assert_eq(b.start_step, HALF, "%s resuming %s's checkpoint started at %lld", LAYOUT_NAMES[to],
                         LAYOUT_NAMES[from], (long long)b.start_step);
            cr_assert_eq(b.n, STEPS - HALF);
            double rel = 0;
            for (int i = 0; i < STEPS - HALF; i++) {
                double d = fabs((double)b.losses[i] - ref.losses[HALF + i]) / ref.losses[HALF + i];
                rel = fmax(rel, d);
                cr_assert_leq(d, LOSS_RTOL, "%s resuming %s's checkpoint: step %d loss %.7f, uninterrupted %.7f",
                              LAYOUT_NAMES[to], LAYOUT_NAMES[from], HALF + i + 1, b.losses[i], ref.losses[HALF + i]);
            }
            fprintf(stderr, "%s -> %s (%s): steps %d-%d within %.2g of the uninterrupted run\n", LAYOUT_NAMES[from],
                    LAYOUT_NAMES[to], b.layout, HALF + 1, STEPS, rel);
        }
    }
    free(first);
    cr_assert(th_rm_tree(g_dir), "could not remove %s", g_dir);
}
