/* test_dp.c - data parallelism with real processes: each run forks its ranks (one thread each),
 * which rendezvous over TCP and train through the one training loop (eng_job_run) with the
 * data-parallel layer over libfabric's shm provider.
 * Checks: 2 and 4 ranks reproduce single-rank training with the same global batch; ZeRO-1
 * equals plain data parallelism, also with its all-gather left running into the next forward;
 * a stopped-and-resumed run equals the uninterrupted one; the parameter check catches an
 * injected divergence; the bucket size dp chooses when bucket_mb is not set; and, with the real
 * kiln-train binary, a killed rank makes its peer fail fast naming it, a SIGTERM on one rank
 * stops every rank at the same step, and a rank kept waiting by a slower peer is told so once. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/comm/comm.h"
#include "engine/dp/dp.h"
#include "engine/engine.h"
#include "engine/job.h"
#include "spec/spec.h"
#include "tests/common/harness.h"

#define MAXR 4
#define MAXSTEPS 64

/* Tolerances for "data parallel equals single rank": the only difference is the order in which
 * per-sequence gradients are summed (within a rank, then across ranks), so fp32 rounding. */
#define LOSS_TOL 2e-5  /* relative, per step, over 20 steps */
#define PARAM_TOL 2e-5 /* absolute, every parameter after 20 steps (weights are O(0.02..1)) */
/* bf16 gradients: each is rounded to 8 significant bits before it is summed */
#define BF16_LOSS_TOL 1e-3
#define BF16_PARAM_TOL 1e-2

typedef struct rank_out {
    int rc;
    int64_t n_losses, start_step;
    float losses[MAXSTEPS];
    float val_loss;
    dp_stats_t stats;
    char msg[600];
} rank_out_t;

typedef struct job {
    int world;
    int steps;             /* max_steps */
    int stop_after;        /* > 0: stop (checkpoint) after this step */
    int eval_every, sample_every; /* gpt: validation and samples (16 tokens) every so many steps */
    bool zero, overlap, check, recompute, bf16_grads;
    const char *inject;    /* "RANK:STEP" (kiln-train's --dp-inject-rank and --dp-inject-step) or NULL */
    double bucket_mb;      /* 0: the test's default; < 0: left out of the spec (gpt) */
    const char *model;     /* "gpt" or "mlp" */
    const char *provider;  /* NULL: shm */
    char ckpt[256], out[256];
} job_t;

static char g_root[512];
static char *read_file(const char *path);

static const char *root(void)
{
    const char *r = getenv("KILN_ROOT");
    snprintf(g_root, sizeof g_root, "%s", r ? r : ".");
    return g_root;
}

static void tmpdir(char *out, size_t n, const char *tag)
{
    snprintf(out, n, "/tmp/kiln-dp-%d-%s-XXXXXX", (int)getpid(), tag);
    cr_assert(mkdtemp(out), "mkdtemp: %s", strerror(errno));
}

/* Parses the run's spec; false (with the reason on stderr) when rejected. Called in the ranks,
 * where Criterion's assertions must not be used. */
static bool spec_for(const job_t *j, spec_t *s)
{
    char json[4096], bucket[64] = "";
    if (j->bucket_mb >= 0)
        snprintf(bucket, sizeof bucket, "\"bucket_mb\": %g, ", j->bucket_mb > 0 ? j->bucket_mb : 0.02);
    if (!strcmp(j->model, "mlp"))
        snprintf(json, sizeof json,
                 "{\"model\": {\"type\": \"mlp\", \"n_inputs\": 16, \"n_classes\": 4, "
                 "\"hidden\": [32, 32]}, \"data\": {\"train\": \"synthetic\"}, "
                 "\"hyperparameters\": {\"lr\": 3e-3, \"global_batch_size\": 16, "
                 "\"micro_batch_size\": 4, \"max_steps\": %d, \"warmup_steps\": 3, "
                 "\"weight_decay\": 0.1, \"grad_clip\": 1.0, \"seed\": 5, \"eval_every\": 0, "
                 "\"eval_batches\": 1}, \"resources\": {\"device\": \"cpu\", \"nodes\": 1, "
                 "\"slots_per_node\": %d}, \"distribution\": {\"data_parallel\": {\"bucket_mb\": "
                 "%g, \"shard_optimizer_state\": %s}}, \"checkpoint\": {\"every_steps\": 0, "
                 "\"keep_last\": 2}}",
                 j->steps, j->world, j->bucket_mb > 0 ? j->bucket_mb : 0.004,
                 j->zero ? "true" : "false");
    else
        snprintf(json, sizeof json,
                 "{\"model\": {\"type\": \"gpt\", \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, "
                 "\"seq_len\": 32, \"vocab\": \"bytes\"}, \"data\": {\"train\": "
                 "\"%s/data/tinyshakespeare.txt\"}, \"hyperparameters\": {\"lr\": 3e-3, "
                 "\"global_batch_size\": 24, \"micro_batch_size\": 2, \"max_steps\": %d, "
                 "\"warmup_steps\": 3, \"weight_decay\": 0.1, \"grad_clip\": 1.0, \"seed\": 7, "
                 "\"eval_every\": %d, \"eval_batches\": 1, \"sample_every\": %d, "
                 "\"sample_tokens\": %d}, \"resources\": {\"device\": \"cpu\", \"nodes\": 1, "
                 "\"slots_per_node\": %d}, \"distribution\": {\"data_parallel\": {%s"
                 "\"shard_optimizer_state\": %s, \"gradient_dtype\": \"%s\"}, "
                 "\"activation_checkpointing\": %s}, \"checkpoint\": {\"every_steps\": 0, \"keep_last\": 2}}",
                 root(), j->steps, j->eval_every, j->sample_every, j->sample_every > 0 ? 16 : 0,
                 j->world, bucket, j->zero ? "true" : "false",
                 j->bf16_grads ? "bf16" : "fp32", j->recompute ? "true" : "false");
    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = spec_parse_string(json, s, &err);
    if (rc) fprintf(stderr, "spec rejected: %s: %s\n", err.field, err.message);
    return rc == 0;
}

/* One rank (a forked child): joins the group and trains. World 1 runs eng_train_run directly. */
static int rank_main(const job_t *j, int rank, int port, rank_out_t *out)
{
    spec_t s;
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
    if (!spec_for(j, &s)) {
        snprintf(out->msg, sizeof out->msg, "spec rejected");
        return 2;
    }
    eng_train_opts_t o;
    memset(&o, 0, sizeof o);
    o.threads = 1;
    o.peak_gflops = 100;
    o.metrics_fd = -1;
    o.rank = rank;
    o.world = j->world;
    o.quiet = true;
    o.checkpoint_dir = j->ckpt[0] ? j->ckpt : NULL;
    o.output_dir = j->out;
    o.stop_after_step = j->stop_after;
    eng_settings_t es = ENG_SETTINGS_INIT;
    es.dp_check = j->check;
    es.dp_overlap = j->overlap;
    long long inject_step = 0;
    if (j->inject && sscanf(j->inject, "%" SCNd64 ":%lld", &es.dp_inject_rank, &inject_step) != 2) return 4;
    es.dp_inject_step = inject_step;
    o.settings = &es;
    /* rank 0 logs; the others stay quiet so Criterion's output stays readable */
    if (rank != 0 && !freopen("/dev/null", "w", stdout)) return 3;
    kiln_err_t err;
    kiln_err_clear(&err);
    eng_train_result_t res;
    memset(&res, 0, sizeof res);
    int rc;
    if (j->world == 1) {
        rc = eng_train_run(&s, &o, &res, &err);
    } else {
        comm_config_t cc;
        comm_config_init(&cc);
        cc.rank = rank;
        cc.world_size = j->world;
        cc.master_port = port;
        cc.provider = j->provider ? j->provider : "shm";
        cc.timeout_s = 30;
        comm_t *c = NULL;
        rc = comm_create(&cc, &c, &err);
        eng_job_info_t info;
        if (rc == 0) rc = eng_job_run(&s, &o, c, &res, &info, &err);
        if (rc == 0) out->stats = info.dp;
        comm_destroy(c);
    }
    out->rc = rc;
    snprintf(out->msg, sizeof out->msg, "%s", err.message);
    out->start_step = res.start_step;
    out->val_loss = res.last_val_loss;
    out->n_losses = res.n_losses < MAXSTEPS ? res.n_losses : MAXSTEPS;
    if (res.losses) memcpy(out->losses, res.losses, sizeof(float) * (size_t)out->n_losses);
    free(res.losses);
    spec_deinit(&s);
    return rc ? 1 : 0;
}

/* Forks j->world ranks; returns their outputs (shared memory, caller munmaps). */
static rank_out_t *run_job(const job_t *j)
{
    rank_out_t *outs = mmap(NULL, sizeof(rank_out_t) * MAXR, PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(outs != MAP_FAILED);
    memset(outs, 0, sizeof(rank_out_t) * MAXR);
    int port = th_free_port();
    pid_t pids[MAXR];
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < j->world; r++) {
        outs[r].rc = -100;
        pid_t p = fork();
        cr_assert(p >= 0);
        if (p == 0) _exit(rank_main(j, r, port, &outs[r]));
        pids[r] = p;
    }
    double deadline = kiln_mono_s() + 150;
    for (int r = 0; r < j->world; r++) {
        int st;
        while (waitpid(pids[r], &st, WNOHANG) == 0) {
            if (kiln_mono_s() > deadline) {
                for (int k = 0; k < j->world; k++) kill(pids[k], SIGKILL);
                cr_assert_fail("ranks did not finish within 150 s");
            }
            usleep(20000);
        }
        if (!WIFEXITED(st)) outs[r].rc = -200 - (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    }
    return outs;
}

static void expect_ok(const job_t *j, const rank_out_t *outs)
{
    for (int r = 0; r < j->world; r++)
        cr_assert_eq(outs[r].rc, 0, "rank %d of %d failed (%d): %s", r, j->world, outs[r].rc,
                     outs[r].msg);
}

static float *final_params(const job_t *j, size_t *n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/model_llmc.bin", j->out);
    eng_gpt_config_t cfg;
    float *p = NULL;
    kiln_err_t err;
    int rc = eng_gpt_llmc_read(path, &cfg, &p, &err);
    cr_assert_eq(rc, 0, "final model: %s", err.message);
    *n = eng_gpt_num_params(&cfg);
    return p;
}

static job_t gpt_job(int world, int steps)
{
    job_t j;
    memset(&j, 0, sizeof j);
    j.world = world;
    j.steps = steps;
    j.overlap = true;
    j.check = true;
    j.model = "gpt";
    tmpdir(j.out, sizeof j.out, "out");
    return j;
}

static void rm_rf(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* Compares two runs: losses (relative tol, 0 = bitwise) and final parameters (absolute). */
static void compare(const char *what, const job_t *ja, const rank_out_t *a, const job_t *jb,
                    const rank_out_t *b, double ltol, double ptol)
{
    cr_assert_eq(a[0].n_losses, b[0].n_losses, "%s: step counts differ", what);
    double worst_l = 0, worst_p = 0;
    for (int i = 0; i < a[0].n_losses; i++) {
        double d = fabs((double)a[0].losses[i] - b[0].losses[i]) / fabs((double)a[0].losses[i]);
        if (d > worst_l) worst_l = d;
        cr_assert(d <= ltol, "%s: step %d loss %.9g vs %.9g (rel diff %.3g > %.3g)", what,
                  i + 1, a[0].losses[i], b[0].losses[i], d, ltol);
    }
    size_t na, nb;
    float *pa = final_params(ja, &na), *pb = final_params(jb, &nb);
    cr_assert_eq(na, nb);
    for (size_t i = 0; i < na; i++) {
        double d = fabs((double)pa[i] - pb[i]);
        if (d > worst_p) worst_p = d;
    }
    fprintf(stderr, "%s: %lld steps, worst loss rel diff %.3g, worst parameter abs diff %.3g\n",
            what, (long long)a[0].n_losses, worst_l, worst_p);
    cr_assert(worst_p <= ptol, "%s: parameters differ by %.3g > %.3g", what, worst_p, ptol);
    if (ptol == 0) cr_assert(memcmp(pa, pb, na * sizeof(float)) == 0, "%s: not bitwise", what);
    free(pa);
    free(pb);
}

static void matches_single_rank(int world)
{
    job_t one = gpt_job(1, 20), many = gpt_job(world, 20);
    rank_out_t *a = run_job(&one), *b = run_job(&many);
    expect_ok(&one, a);
    expect_ok(&many, b);
    for (int r = 1; r < world; r++) /* every rank saw the same (all-reduced) losses */
        cr_assert(memcmp(b[r].losses, b[0].losses, sizeof(float) * 20) == 0);
    cr_assert_gt(b[0].stats.n_buckets, 1, "expected several buckets");
    cr_assert_gt(b[0].stats.early_launches, 0, "no bucket was launched during backward");
    cr_assert(a[0].losses[19] < a[0].losses[0] - 0.5, "did not learn: %f -> %f", a[0].losses[0],
              a[0].losses[19]);
    char what[64];
    snprintf(what, sizeof what, "%d ranks vs 1", world);
    compare(what, &one, a, &many, b, LOSS_TOL, PARAM_TOL);
    rm_rf(one.out);
    rm_rf(many.out);
    munmap(a, sizeof(rank_out_t) * MAXR);
    munmap(b, sizeof(rank_out_t) * MAXR);
}

Test(dp, two_ranks_match_single_rank, .timeout = 120) { matches_single_rank(2); }
Test(dp, four_ranks_match_single_rank, .timeout = 120) { matches_single_rank(4); }

/* Overlap changes when buckets go out, never what they compute. */
Test(dp, overlap_off_is_bitwise_equal, .timeout = 120)
{
    job_t on = gpt_job(2, 12), off = gpt_job(2, 12);
    off.overlap = false;
    rank_out_t *a = run_job(&on), *b = run_job(&off);
    expect_ok(&on, a);
    expect_ok(&off, b);
    cr_assert_eq(b[0].stats.early_launches, 0);
    compare("overlap on vs off", &on, a, &off, b, 0, 0);
    rm_rf(on.out);
    rm_rf(off.out);
}

/* The provider moves the bytes; the ring arithmetic is the same, so tcp;ofi_rxm gives the same
 * bits as shm. */
Test(dp, tcp_provider_gives_the_same_bits_as_shm, .timeout = 120)
{
    job_t shm = gpt_job(2, 10), tcp = gpt_job(2, 10);
    tcp.provider = "tcp";
    rank_out_t *a = run_job(&shm), *b = run_job(&tcp);
    expect_ok(&shm, a);
    expect_ok(&tcp, b);
    compare("tcp;ofi_rxm vs shm", &shm, a, &tcp, b, 0, 0);
    rm_rf(shm.out);
    rm_rf(tcp.out);
}

/* ZeRO-1 reduces with a reduce-scatter over the flat buffer instead of bucketed all-reduces.
 * With 2 ranks every element is a + b either way, and the norm uses the same shard partial sums
 * in both modes, so the runs are bitwise equal; with 4 ranks the addition order differs. */
Test(dp, zero1_equals_plain_data_parallel, .timeout = 150)
{
    for (int world = 2; world <= 4; world += 2) {
        job_t plain = gpt_job(world, 20), zero = gpt_job(world, 20);
        zero.zero = true;
        rank_out_t *a = run_job(&plain), *b = run_job(&zero);
        expect_ok(&plain, a);
        expect_ok(&zero, b);
        cr_assert_eq(b[0].stats.opt_state_full_bytes, a[0].stats.opt_state_bytes);
        size_t sum = 0;
        for (int r = 0; r < world; r++) sum += b[r].stats.opt_state_bytes;
        cr_assert_eq(sum, b[0].stats.opt_state_full_bytes, "shards do not add up to the state");
        /* each bucket is split separately: a rank holds at most one float more per bucket */
        cr_assert_leq(b[0].stats.opt_state_bytes,
                      b[0].stats.opt_state_full_bytes / world + 8 * (size_t)b[0].stats.n_buckets);
        char what[64];
        snprintf(what, sizeof what, "ZeRO-1 vs plain, %d ranks", world);
        if (world == 2)
            compare(what, &plain, a, &zero, b, 0, 0);
        else
            compare(what, &plain, a, &zero, b, LOSS_TOL, PARAM_TOL);
        rm_rf(plain.out);
        rm_rf(zero.out);
    }
}

/* As the training loop's layer, ZeRO-1 leaves its parameter all-gather running into the next
 * step's forward, which waits for each block's buckets before the block runs (without that
 * wait the losses differ at once); validation, samples and the final model wait for all of
 * them. The parameter check needs them at once, so it is off here: the runs must still be
 * plain data parallelism's, bit for bit, with the same validation loss and samples. */
Test(dp, zero1_all_gather_in_the_next_forward_changes_no_bit, .timeout = 120)
{
    job_t plain = gpt_job(2, 12), zero = gpt_job(2, 12);
    plain.check = zero.check = false;
    plain.eval_every = zero.eval_every = 4;
    plain.sample_every = zero.sample_every = 5;
    zero.zero = true;
    rank_out_t *a = run_job(&plain), *b = run_job(&zero);
    expect_ok(&plain, a);
    expect_ok(&zero, b);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(a[r].stats.gathers_in_forward, 0);
        cr_assert_eq(b[r].stats.gathers_in_forward, 12, "rank %d: %lld of 12 all-gathers went on "
                     "into the next forward", r, (long long)b[r].stats.gathers_in_forward);
        cr_assert(memcmp(&a[r].val_loss, &b[r].val_loss, sizeof(float)) == 0,
                  "rank %d: validation loss %.9g vs %.9g", r, a[r].val_loss, b[r].val_loss);
    }
    compare("ZeRO-1 with the all-gather in the next forward vs plain", &plain, a, &zero, b, 0, 0);
    char pa[300], pb[300];
    snprintf(pa, sizeof pa, "%s/samples.txt", plain.out);
    snprintf(pb, sizeof pb, "%s/samples.txt", zero.out);
    char *sa = read_file(pa), *sb = read_file(pb);
    cr_assert(strlen(sa) > 0, "no samples were written");
    cr_assert_str_eq(sa, sb, "samples differ");
    free(sa);
    free(sb);
    rm_rf(plain.out);
    rm_rf(zero.out);
    munmap(a, sizeof(rank_out_t) * MAXR);
    munmap(b, sizeof(rank_out_t) * MAXR);
}

/* gradient_dtype "bf16": gradients cross between ranks as bf16. Every rank still holds the same
 * parameters after every step (the check is on), training follows the fp32 run closely, and it is
 * not the fp32 run (the gradients really were rounded). With ZeRO-1 the reduce-scatter is bf16
 * and the parameters' all-gather fp32. */
Test(dp, bf16_gradients_track_fp32_and_keep_ranks_identical, .timeout = 150)
{
    for (int world = 2; world <= 3; world++) {
        job_t fp32 = gpt_job(world, 20), bf16 = gpt_job(world, 20);
        fp32.zero = bf16.zero = world == 3;
        bf16.bf16_grads = true;
        rank_out_t *a = run_job(&fp32), *b = run_job(&bf16);
        expect_ok(&fp32, a);
        expect_ok(&bf16, b);
        cr_assert(b[0].losses[19] < b[0].losses[0] - 0.5, "did not learn: %f -> %f", b[0].losses[0],
                  b[0].losses[19]);
        char what[80];
        snprintf(what, sizeof what, "bf16 vs fp32 gradients, %d ranks%s", world, fp32.zero ? ", ZeRO-1" : "");
        compare(what, &fp32, a, &bf16, b, BF16_LOSS_TOL, BF16_PARAM_TOL);
        cr_assert(memcmp(a[0].losses + 1, b[0].losses + 1, sizeof(float) * 19) != 0,
                  "%s: the losses are fp32's, bit for bit", what);
        rm_rf(fp32.out);
        rm_rf(bf16.out);
        munmap(a, sizeof(rank_out_t) * MAXR);
        munmap(b, sizeof(rank_out_t) * MAXR);
    }
}

/* Activation checkpointing recomputes the same numbers on every replica. */
Test(dp, activation_checkpointing_is_bitwise_equal, .timeout = 120)
{
    job_t plain = gpt_job(2, 12), rc = gpt_job(2, 12);
    rc.recompute = true;
    rank_out_t *a = run_job(&plain), *b = run_job(&rc);
    expect_ok(&plain, a);
    expect_ok(&rc, b);
    compare("activation checkpointing on vs off, 2 ranks", &plain, a, &rc, b, 0, 0);
    rm_rf(plain.out);
    rm_rf(rc.out);
}

static void resume_exact(bool zero, int world)
{
    job_t full = gpt_job(world, 16), part = gpt_job(world, 16);
    full.zero = part.zero = zero;
    tmpdir(part.ckpt, sizeof part.ckpt, "ckpt");
    part.stop_after = 7;
    rank_out_t *a = run_job(&full), *b = run_job(&part);
    expect_ok(&full, a);
    expect_ok(&part, b);
    cr_assert_eq(b[0].n_losses, 7);
    /* the second half: a fresh set of processes resumes from rank 0's checkpoint */
    part.stop_after = 0;
    rank_out_t *c = run_job(&part);
    expect_ok(&part, c);
    for (int r = 0; r < world; r++) cr_assert_eq(c[r].start_step, 7, "rank %d resumed at %lld", r, (long long)c[r].start_step);
    cr_assert_eq(c[0].n_losses, 9);
    cr_assert(memcmp(a[0].losses, b[0].losses, 7 * sizeof(float)) == 0);
    cr_assert(memcmp(a[0].losses + 7, c[0].losses, 9 * sizeof(float)) == 0,
              "resumed losses differ from the uninterrupted run");
    size_t na, nb;
    float *pa = final_params(&full, &na), *pb = final_params(&part, &nb);
    cr_assert(na == nb && memcmp(pa, pb, na * sizeof(float)) == 0, "final parameters differ");
    free(pa);
    free(pb);
    rm_rf(full.out);
    rm_rf(part.out);
    rm_rf(part.ckpt);
}

Test(dp, resume_from_checkpoint_is_exact, .timeout = 120) { resume_exact(false, 2); }
Test(dp, zero1_resume_from_checkpoint_is_exact, .timeout = 120) { resume_exact(true, 3); }

Test(dp, mlp_trains_data_parallel, .timeout = 120)
{
    job_t one = gpt_job(1, 30), many = gpt_job(4, 30);
    one.model = many.model = "mlp";
    rank_out_t *a = run_job(&one), *b = run_job(&many);
    expect_ok(&one, a);
    expect_ok(&many, b);
    for (int i = 0; i < 30; i++)
        cr_assert(fabs(a[0].losses[i] - b[0].losses[i]) <= LOSS_TOL * fabs(a[0].losses[i]),
                  "step %d: %f vs %f", i + 1, a[0].losses[i], b[0].losses[i]);
    cr_assert(b[0].losses[29] < b[0].losses[0]);
    rm_rf(one.out);
    rm_rf(many.out);
}

Test(dp, divergence_check_catches_a_perturbed_rank, .timeout = 120)
{
    job_t j = gpt_job(2, 10);
    j.inject = "1:4";
    rank_out_t *o = run_job(&j);
    for (int r = 0; r < 2; r++) {
        cr_assert_neq(o[r].rc, 0, "rank %d did not notice the divergence", r);
        cr_assert(strstr(o[r].msg, "diverged after step 4") && strstr(o[r].msg, "rank(s) 1"),
                  "rank %d: %s", r, o[r].msg);
    }
    /* the same injection without the check goes unnoticed: the check is what catches it */
    j.check = false;
    rank_out_t *q = run_job(&j);
    expect_ok(&j, q);
    rm_rf(j.out);
}

/* ---- the real kiln-train binary --------------------------------------------------------------- */

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = calloc(1, (size_t)n + 1);
    if (fread(b, 1, (size_t)n, f) != (size_t)n) b[0] = 0;
    fclose(f);
    return b;
}

/* The last line of a rank's output. Under ASan a leak report may follow the real last line at
 * exit (comm's teardown after a peer died, for one): it is cut off first. */
static const char *last_line(char *text)
{
    char *leak = strstr(text, "ERROR: LeakSanitizer");
    if (leak) {
        while (leak > text && leak[-1] != '\n') leak--;
        *leak = 0;
        char *sep = strstr(text, "\n=================");
        if (sep && !strchr(sep + 1, '\n')) *sep = 0;
        else if (sep && strspn(sep + 1, "=") == strlen(sep + 1) - 1) *sep = 0;
    }
    size_t n = strlen(text);
    while (n && text[n - 1] == '\n') text[--n] = 0;
    char *p = strrchr(text, '\n');
    return p ? p + 1 : text;
}

/* Starts `world` kiln-train ranks on a long job; returns pids, logs in dir/rN.log. */
static void start_ranks_env(const char *dir, int world, pid_t *pids, int steps, const char *extra_env);
static void start_ranks(const char *dir, int world, pid_t *pids, int steps)
{
    start_ranks_env(dir, world, pids, steps, "KILN_COMM_WATCHDOG_S=180");
}

/* The same with one more environment entry and, when dist is not NULL, that "distribution". */
static void start_ranks_dist(const char *dir, int world, pid_t *pids, int steps, const char *extra_env,
                             const char *dist);
static void start_ranks_env(const char *dir, int world, pid_t *pids, int steps, const char *extra_env)
{
    start_ranks_dist(dir, world, pids, steps, extra_env, NULL);
}

static void start_ranks_dist(const char *dir, int world, pid_t *pids, int steps, const char *extra_env,
                             const char *dist)
{
    char spec[600];
    snprintf(spec, sizeof spec, "%s/spec.json", dir);
    FILE *f = fopen(spec, "w");
    cr_assert(f);
    fprintf(f,
            "{\"model\": {\"type\": \"gpt\", \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, "
            "\"seq_len\": 32, \"vocab\": \"bytes\"}, \"data\": {\"train\": "
            "\"%s/data/tinyshakespeare.txt\"}, \"hyperparameters\": {\"global_batch_size\": 12, "
            "\"max_steps\": %d, \"eval_every\": 0, \"sample_every\": 0, \"sample_tokens\": 0}, "
            "\"resources\": {\"device\": \"cpu\", \"nodes\": 1, \"slots_per_node\": %d}, %s%s%s"
            "\"checkpoint\": {\"every_steps\": 0}}\n", root(), steps, world, dist ? "\"distribution\": " : "",
            dist ? dist : "", dist ? ", " : "");
    fclose(f);
    int port = th_free_port();
    char bin[512];
    snprintf(bin, sizeof bin, "%s/kiln-train", th_bin_dir());
    for (int r = 0; r < world; r++) {
        char e_rank[32], e_world[32], e_port[32], e_ck[600], log[600];
        snprintf(e_rank, sizeof e_rank, "KILN_RANK=%d", r);
        snprintf(e_world, sizeof e_world, "KILN_WORLD_SIZE=%d", world);
        snprintf(e_port, sizeof e_port, "KILN_MASTER_PORT=%d", port);
        snprintf(e_ck, sizeof e_ck, "KILN_CHECKPOINT_DIR=%s/ckpt%d", dir, r);
        snprintf(log, sizeof log, "%s/r%d.log", dir, r);
        char *env[] = {e_rank, e_world, e_port, e_ck, "KILN_MASTER_ADDR=127.0.0.1",
                       "KILN_THREADS=1", "KILN_PEAK_GFLOPS=100", "KILN_COMM_TIMEOUT_S=30",
                       (char *)extra_env, NULL};
        char *argv[] = {bin, "--spec", spec, NULL};
        pids[r] = th_spawn(argv, env, log);
        cr_assert_gt(pids[r], 0);
    }
}

static bool log_has(const char *dir, int rank, const char *needle)
{
    char path[600];
    snprintf(path, sizeof path, "%s/r%d.log", dir, rank);
    char *t = read_file(path);
    bool ok = strstr(t, needle) != NULL;
    free(t);
    return ok;
}

static void wait_for_log(const char *dir, int rank, const char *needle, double timeout_s)
{
    double end = kiln_mono_s() + timeout_s;
    while (!log_has(dir, rank, needle)) {
        cr_assert(kiln_mono_s() < end, "rank %d never logged \"%s\"", rank, needle);
        usleep(50000);
    }
}

static int wait_exit(pid_t pid, double timeout_s, double *took)
{
    double t0 = kiln_mono_s();
    int st;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (kiln_mono_s() - t0 > timeout_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            cr_assert_fail("rank %d did not exit within %.0f s", (int)pid, timeout_s);
        }
        usleep(10000);
    }
    if (took) *took = kiln_mono_s() - t0;
    return st;
}

Test(dp_kiln_train, killed_rank_fails_its_peers_fast_naming_it, .timeout = 120)
{
    char dir[256];
    tmpdir(dir, sizeof dir, "kill");
    pid_t pids[3];
    start_ranks(dir, 3, pids, 1000000);
    wait_for_log(dir, 0, "step 5/", 60);
    kill(pids[2], SIGKILL);
    double took[2];
    int st0 = wait_exit(pids[0], 30, &took[0]), st1 = wait_exit(pids[1], 30, &took[1]);
    waitpid(pids[2], NULL, 0);
    for (int r = 0; r < 2; r++) {
        int st = r ? st1 : st0;
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0 && WEXITSTATUS(st) != 143,
                  "rank %d exit status %d", r, st);
        char path[600];
        snprintf(path, sizeof path, "%s/r%d.log", dir, r);
        char *t = read_file(path);
        const char *ll = last_line(t);
        fprintf(stderr, "rank %d exited %d after %.2f s: %s\n", r, WEXITSTATUS(st), took[r], ll);
        cr_assert(strstr(ll, "kiln-train: ") && strstr(ll, "rank 2"),
                  "rank %d's last line does not name rank 2: %s", r, ll);
        cr_assert_lt(took[r], 10, "rank %d took %.1f s to notice", r, took[r]);
        free(t);
    }
    rm_rf(dir);
}

Test(dp_kiln_train, sigterm_on_one_rank_stops_all_at_the_same_step, .timeout = 120)
{
    char dir[256];
    tmpdir(dir, sizeof dir, "term");
    pid_t pids[2];
    start_ranks(dir, 2, pids, 1000000);
    wait_for_log(dir, 0, "step 3/", 60);
    kill(pids[1], SIGTERM); /* only rank 1 is told: rank 0 must stop with it */
    for (int r = 0; r < 2; r++) {
        int st = wait_exit(pids[r], 30, NULL);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 143, "rank %d exit status %d", r, st);
    }
    char ck[600], path[700];
    snprintf(ck, sizeof ck, "%s/ckpt0", dir);
    cr_assert_eq(eng_ckpt_find_latest(ck, path, sizeof path), 0, "rank 0 wrote no checkpoint");
    snprintf(ck, sizeof ck, "%s/ckpt1", dir);
    cr_assert_neq(eng_ckpt_find_latest(ck, path, sizeof path), 0, "rank 1 wrote a checkpoint");
    rm_rf(dir);
}

/* A rank that stops (SIGSTOP) stays connected: its peer's collective makes no progress, the
 * watchdog (KILN_COMM_WATCHDOG_S) fails it, and kiln-train exits non-zero with a last line that
 * names the stopped rank. */
Test(dp_kiln_train, stalled_rank_trips_the_watchdog_naming_it, .timeout = 120)
{
    char dir[256];
    tmpdir(dir, sizeof dir, "stall");
    pid_t pids[2];
    start_ranks_env(dir, 2, pids, 1000000, "KILN_COMM_WATCHDOG_S=3");
    wait_for_log(dir, 0, "step 3/", 60);
    kill(pids[1], SIGSTOP);
    double took;
    int st = wait_exit(pids[0], 30, &took);
    kill(pids[1], SIGKILL);
    waitpid(pids[1], NULL, 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "rank 0 exit status 0x%x", st);
    char path[600];
    snprintf(path, sizeof path, "%s/r0.log", dir);
    char *t = read_file(path);
    const char *ll = last_line(t);
    fprintf(stderr, "rank 0 exited %d after %.2f s: %s\n", WEXITSTATUS(st), took, ll);
    cr_assert(strstr(ll, "kiln-train: ") && strstr(ll, "waiting on rank 1") && strstr(ll, "no progress for"),
              "rank 0's last line does not name rank 1: %s", ll);
    cr_assert(took >= 2.5 && took < 20, "rank 0 gave up after %.1f s", took);
    free(t);
    rm_rf(dir);
}

/* A rank that runs slower than its peer (stopped three quarters of the time, as under a noisy
 * neighbour) makes the peer wait for gradients most of every step: the peer's log says so once,
 * with the measured share and what helps (bf16 gradients when they travel as fp32; with bf16,
 * something else), however many windows of steps wait that long. Rank 0's log also says which
 * bucket size dp chose, as the spec leaves bucket_mb out. */
static void slow_peer(const char *dist, const char *help)
{
    char dir[256];
    tmpdir(dir, sizeof dir, "wait");
    pid_t pids[2];
    start_ranks_dist(dir, 2, pids, 40, "KILN_COMM_WATCHDOG_S=180", dist);
    int st0 = 0;
    double end = kiln_mono_s() + 100;
    while (waitpid(pids[0], &st0, WNOHANG) == 0) {
        cr_assert(kiln_mono_s() < end, "rank 0 did not finish 40 steps within 100 s");
        kill(pids[1], SIGSTOP);
        usleep(15000);
        kill(pids[1], SIGCONT);
        usleep(5000);
    }
    kill(pids[1], SIGCONT);
    int st1 = wait_exit(pids[1], 30, NULL);
    char path[600];
    snprintf(path, sizeof path, "%s/r0.log", dir);
    char *t = read_file(path);
    cr_assert(WIFEXITED(st0) && WEXITSTATUS(st0) == 0 && WIFEXITED(st1) && WEXITSTATUS(st1) == 0,
              "exit statuses 0x%x 0x%x:\n%s", st0, st1, t);
    int notes = 0;
    const char *note = NULL;
    for (const char *p = t; (p = strstr(p, "of its steps waiting for gradients")); p++, notes++)
        if (!note) note = p;
    cr_assert_eq(notes, 1, "rank 0 said %d times that it waits for gradients:\n%s", notes, t);
    const char *eol = strchr(note, '\n');
    fprintf(stderr, "rank 0: ...%.*s\n", eol ? (int)(eol - note) : 200, note);
    const char *pct = strstr(t, "dp: rank 0 spent ");
    cr_assert(pct && atoi(pct + strlen("dp: rank 0 spent ")) > 20, "no share over 20%%:\n%s", t);
    cr_assert(strstr(note, help), "the note does not say \"%s\":\n%s", help, t);
    cr_assert(strstr(t, "dp: bucket_mb ") && strstr(t, "chosen from the model"),
              "rank 0's log does not say which bucket size dp chose:\n%s", t);
    free(t);
    rm_rf(dir);
}

Test(dp_kiln_train, a_rank_waiting_for_gradients_is_told_once_to_send_bf16, .timeout = 150)
{
    slow_peer(NULL, "gradient_dtype: \"bf16\"");
}

Test(dp_kiln_train, a_rank_waiting_for_bf16_gradients_is_told_what_else_helps, .timeout = 150)
{
    slow_peer("{\"data_parallel\": {\"gradient_dtype\": \"bf16\"}}", "already travel as bf16");
}

/* The bucket size dp chooses when bucket_mb is not set (dp_bucket_mb_choose): the gradient's
 * bytes on the wire split in DP_BUCKETS_TARGET, within the transport's bounds. The old fixed
 * 25 MiB held the whole small GPT of bench/dp_netns.sh in one bucket, so nothing overlapped
 * backward; GPT-2 124M keeps PyTorch DDP's 25 MB. */
Test(dp_buckets, chosen_from_the_gradient_bytes_and_the_transport)
{
    const double mib = 1 << 20;
    /* bench/dp_netns.sh's small GPT: L=4 H=4 C=256 V=256 T=128, 12.4 MiB of fp32 gradients */
    size_t small = 256 * 256 + 128 * 256 + 4 * (12 * 256 * 256 + 13 * 256) + 2 * 256;
    double b = dp_bucket_mb_choose(small, false, DP_TRANSPORT_NETWORK);
    cr_assert_float_eq(b, small * 4.0 / mib / DP_BUCKETS_TARGET, 1e-9, "small GPT, tcp: %g", b);
    cr_assert(small * 4.0 / mib / b >= 12, "the small GPT in %g buckets", small * 4.0 / mib / b);
    /* bf16 on the wire: half the bytes, the same number of buckets, so the same floats */
    cr_assert_float_eq(dp_bucket_mb_choose(small, true, DP_TRANSPORT_NETWORK), b, 1e-9);
    /* within a host or on GPUs at least 1 MiB a bucket */
    cr_assert_float_eq(dp_bucket_mb_choose(small, false, DP_TRANSPORT_SHM), 1.0, 1e-9);
    cr_assert_float_eq(dp_bucket_mb_choose(small, false, DP_TRANSPORT_DEVICE), 1.0, 1e-9);

    /* GPT-2 124M: 475 MiB of fp32 gradients; 16 buckets would be 29.7 MiB, above the 25 MiB cap */
    size_t gpt2 = 124439808;
    cr_assert_float_eq(dp_bucket_mb_choose(gpt2, false, DP_TRANSPORT_NETWORK), 25.0, 1e-9);
    cr_assert_float_eq(dp_bucket_mb_choose(gpt2, false, DP_TRANSPORT_DEVICE), 25.0, 1e-9);
    /* as bf16, 14.8 MiB on the wire a bucket: 16 buckets of 29.7 MiB of fp32 gradients */
    b = dp_bucket_mb_choose(gpt2, true, DP_TRANSPORT_NETWORK);
    cr_assert_float_eq(b, gpt2 * 4.0 / mib / DP_BUCKETS_TARGET, 1e-9, "GPT-2, bf16 over tcp: %g", b);

    /* a tiny model: one bucket at the transport's minimum, measured on the wire */
    cr_assert_float_eq(dp_bucket_mb_choose(1000, false, DP_TRANSPORT_NETWORK), 0.25, 1e-9);
    cr_assert_float_eq(dp_bucket_mb_choose(1000, true, DP_TRANSPORT_NETWORK), 0.5, 1e-9);
    double lo, hi;
    cr_assert_str_eq(dp_bucket_bounds(DP_TRANSPORT_NETWORK, &lo, &hi), "tcp;ofi_rxm");
    cr_assert(lo == 0.25 && hi == 25.0);
}

/* A spec without bucket_mb leaves it to dp: a run plans with the chosen size and says so in its
 * counters; a spec that sets it gets exactly that. */
Test(dp_buckets, a_run_without_bucket_mb_plans_the_chosen_size, .timeout = 120)
{
    job_t j = gpt_job(2, 3);
    j.bucket_mb = -1; /* left out of the spec */
    rank_out_t *o = run_job(&j);
    expect_ok(&j, o);
    cr_assert(o[0].stats.bucket_chosen, "bucket_mb was not chosen");
    /* the 2-layer test GPT over shm: below 16 MiB, so the shm minimum, 1 MiB, one bucket */
    cr_assert_float_eq(o[0].stats.bucket_mb, 1.0, 1e-9, "chose %g", o[0].stats.bucket_mb);
    cr_assert_eq(o[0].stats.n_buckets, 1);
    rm_rf(j.out);
    j = gpt_job(2, 3);
    j.bucket_mb = 0.02;
    o = run_job(&j);
    expect_ok(&j, o);
    cr_assert(!o[0].stats.bucket_chosen);
    cr_assert_float_eq(o[0].stats.bucket_mb, 0.02, 1e-9);
    cr_assert_gt(o[0].stats.n_buckets, 1);
    rm_rf(j.out);
}
