/* test_train.c - the training loop end to end through eng_train_run on real data: a fixed seed
 * gives identical losses twice, a run stopped at step k and resumed equals the uninterrupted run
 * bit for bit, validation loss on tinyshakespeare falls below a stated value, the MLP learns
 * its synthetic task, the schedule and batch-geometry checks hold, and an
 * OPENBLAS_CORETYPE that holds back an AVX-512 CPU is recognised. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "rank/rank.h"
#include "spec/spec.h"
#include "tests/common/harness.h"

static char g_data[1200];

static void parse(spec_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void parse(spec_t *s, const char *fmt, ...)
{
    char json[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(json, sizeof(json), fmt, ap);
    va_end(ap);
    kiln_err_t err;
    int rc = spec_parse_string(json, s, &err);
    cr_assert_eq(rc, 0, "spec rejected: %s: %s", err.field, err.message);
}

static const char *data_path(void)
{
    const char *root = getenv("KILN_ROOT");
    snprintf(g_data, sizeof(g_data), "%s/data/tinyshakespeare.txt", root ? root : ".");
    return g_data;
}

static eng_train_opts_t opts(void)
{
    eng_train_opts_t o;
    memset(&o, 0, sizeof(o));
    o.threads = 1;           /* suites run two tests at once on two cores */
    o.peak_gflops = 100;     /* skip the FMA measurement */
    o.metrics_fd = -1;
    o.rank = 0;
    o.world = 1;
    o.quiet = true;
    return o;
}

#define TINY_GPT                                                                                 \
    "{\"model\": {\"type\": \"gpt\", \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, "            \
    "\"seq_len\": 32, \"vocab\": \"bytes\"}, \"data\": {\"train\": \"%s\"}, "                   \
    "\"hyperparameters\": {\"lr\": 3e-3, \"global_batch_size\": 8, \"micro_batch_size\": 4, "    \
    "\"max_steps\": %d, \"warmup_steps\": 3, \"weight_decay\": 0.1, \"grad_clip\": 1.0, "       \
    "\"seed\": %d, \"eval_every\": 4, \"eval_batches\": 2, \"sample_every\": 5, "                \
    "\"sample_tokens\": 16}, \"resources\": {\"device\": \"cpu\"}, "                             \
    "\"checkpoint\": {\"every_steps\": 0, \"keep_last\": 2}}"

static void run_ok(const spec_t *s, const eng_train_opts_t *o, eng_train_result_t *res)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = eng_train_run(s, o, res, &err);
    cr_assert_eq(rc, 0, "training failed: %s: %s", err.field, err.message);
}

Test(train, same_seed_same_losses)
{
    spec_t s;
    parse(&s, TINY_GPT, data_path(), 10, 7);
    eng_train_opts_t o = opts();
    eng_train_result_t a, b;
    run_ok(&s, &o, &a);
    run_ok(&s, &o, &b);
    cr_assert_eq(a.n_losses, 10);
    cr_assert_eq(b.n_losses, 10);
    cr_assert(memcmp(a.losses, b.losses, 10 * sizeof(float)) == 0, "losses differ run to run");
    cr_assert(a.losses[9] < a.losses[0], "loss did not fall: %f -> %f", a.losses[0], a.losses[9]);
    spec_t s2;
    parse(&s2, TINY_GPT, data_path(), 10, 8);
    eng_train_result_t c;
    run_ok(&s2, &o, &c);
    cr_assert(memcmp(a.losses, c.losses, 10 * sizeof(float)) != 0, "seed has no effect");
    free(a.losses);
    free(b.losses);
    free(c.losses);
    spec_deinit(&s);
    spec_deinit(&s2);
}

/* Stop after step 7 (as on SIGTERM: a checkpoint is written), resume from the directory, run to
 * 14: the 14 losses equal the uninterrupted run's exactly. Sampling and evaluation happen on
 * the way (they must not disturb the training state). */
Test(train, resume_is_exact)
{
    spec_t s;
    parse(&s, TINY_GPT, data_path(), 14, 11);
    eng_train_opts_t o = opts();
    eng_train_result_t full, first, second;
    /* the samples (steps 5 and 10: 10 after the resume) go to each run's samples.txt */
    char out_full[] = "/tmp/kiln-eng-out-XXXXXX", out_resumed[] = "/tmp/kiln-eng-out-XXXXXX";
    cr_assert(mkdtemp(out_full) && mkdtemp(out_resumed));
    o.output_dir = out_full;
    run_ok(&s, &o, &full);
    o.output_dir = out_resumed;
    char dir[] = "/tmp/kiln-eng-ckpt-XXXXXX";
    cr_assert(mkdtemp(dir));
    o.checkpoint_dir = dir;
    o.stop_after_step = 7;
    run_ok(&s, &o, &first);
    cr_assert(first.stopped);
    cr_assert_eq(first.n_losses, 7);
    char path[1200];
    cr_assert_eq(eng_ckpt_find_latest(dir, path, sizeof(path)), 0);
    cr_assert(strstr(path, "ckpt_00000007.bin"), "newest checkpoint %s", path);
    o.stop_after_step = 0;
    run_ok(&s, &o, &second);
    cr_assert_eq(second.start_step, 7);
    cr_assert_eq(second.n_losses, 7);
    for (int i = 0; i < 14; i++) {
        float got = i < 7 ? first.losses[i] : second.losses[i - 7];
        cr_assert(memcmp(&got, &full.losses[i], sizeof(float)) == 0,
                  "step %d: resumed %.9g vs uninterrupted %.9g", i + 1, got, full.losses[i]);
    }
    /* the samples too: the resumed run's sampler continues from the checkpoint's state */
    char pa[128], pb[128], *sa = NULL, *sb = NULL;
    size_t na = 0, nb = 0;
    kiln_err_t err;
    snprintf(pa, sizeof pa, "%s/samples.txt", out_full);
    snprintf(pb, sizeof pb, "%s/samples.txt", out_resumed);
    cr_assert_eq(kiln_file_read(pa, &sa, &na, &err), 0, "%s", err.message);
    cr_assert_eq(kiln_file_read(pb, &sb, &nb, &err), 0, "%s", err.message);
    cr_assert(na > 0 && strstr(sa, "=== step 10"), "%s", sa);
    cr_assert(na == nb && !memcmp(sa, sb, na), "the resumed run's samples are the uninterrupted run's:\n%s\nvs\n%s",
              sb, sa);
    free(sa);
    free(sb);
    cr_assert(th_rm_tree(out_full) && th_rm_tree(out_resumed));
    /* the finished run wrote its final checkpoint; keep_last 2 leaves two */
    cr_assert_eq(eng_ckpt_find_latest(dir, path, sizeof(path)), 0);
    cr_assert(strstr(path, "ckpt_00000014.bin"));
    cr_assert(th_rm_tree(dir), "could not remove %s", dir);
    free(full.losses);
    free(first.losses);
    free(second.losses);
    spec_deinit(&s);
}

/* A run paused at its stopping.max_steps (7 of 14) and launched again with the same spec (an
 * attempt started twice) resumes at 7 and is paused there again, training nothing: it never runs
 * past its rung to max_steps. */
Test(train, a_run_launched_again_at_its_pause_step_stays_paused)
{
    char fmt[2048];
    snprintf(fmt, sizeof fmt, "%.*s, \"stopping\": {\"max_steps\": 7}}", (int)strlen(TINY_GPT) - 1, TINY_GPT);
    spec_t s;
    parse(&s, fmt, data_path(), 14, 11);
    eng_train_opts_t o = opts();
    char dir[] = "/tmp/kiln-eng-pause-XXXXXX";
    cr_assert(mkdtemp(dir));
    o.checkpoint_dir = dir;
    eng_train_result_t first, again;
    run_ok(&s, &o, &first);
    cr_assert(first.paused);
    cr_assert_eq(first.n_losses, 7);
    run_ok(&s, &o, &again);
    cr_assert_eq(again.start_step, 7);
    cr_assert(again.paused, "launched again at its pause step, it is paused");
    cr_assert_eq(again.n_losses, 0, "it trained %d step(s) past its pause step", again.n_losses);
    char path[1200];
    cr_assert_eq(eng_ckpt_find_latest(dir, path, sizeof(path)), 0);
    cr_assert(strstr(path, "ckpt_00000007.bin"), "newest checkpoint %s", path);
    cr_assert(th_rm_tree(dir), "could not remove %s", dir);
    free(first.losses);
    free(again.losses);
    spec_deinit(&s);
}

/* A hyperband trial: paused at its rung (stopping.max_steps 7 of 14), then promoted (launched
 * without the pause) from its checkpoint, it trains exactly the losses of the run straight
 * through: the pause changes nothing of the schedule (the learning rate decays to max_steps). */
Test(train, a_run_paused_at_its_rung_and_promoted_equals_the_run_straight_through)
{
    char fmt[2048];
    snprintf(fmt, sizeof fmt, "%.*s, \"stopping\": {\"max_steps\": 7}}", (int)strlen(TINY_GPT) - 1, TINY_GPT);
    spec_t paused, whole;
    parse(&paused, fmt, data_path(), 14, 11);
    parse(&whole, TINY_GPT, data_path(), 14, 11);
    eng_train_opts_t o = opts();
    eng_train_result_t full, first, rest;
    run_ok(&whole, &o, &full);
    char dir[] = "/tmp/kiln-eng-rung-XXXXXX";
    cr_assert(mkdtemp(dir));
    o.checkpoint_dir = dir;
    run_ok(&paused, &o, &first);
    cr_assert(first.paused);
    cr_assert_eq(first.n_losses, 7);
    run_ok(&whole, &o, &rest);
    cr_assert_eq(rest.start_step, 7);
    cr_assert_eq(rest.n_losses, 7);
    for (int i = 0; i < 14; i++) {
        float got = i < 7 ? first.losses[i] : rest.losses[i - 7];
        cr_assert(memcmp(&got, &full.losses[i], sizeof(float)) == 0,
                  "step %d: paused and promoted %.9g vs straight through %.9g", i + 1, got, full.losses[i]);
    }
    cr_assert(th_rm_tree(dir), "could not remove %s", dir);
    free(full.losses);
    free(first.losses);
    free(rest.losses);
    spec_deinit(&paused);
    spec_deinit(&whole);
}

/* Learning check: L=2, C=64, T=64, 16 sequences a step, 250 steps on tinyshakespeare must reach
 * validation loss < 2.50 nats/byte (a unigram model gets ~3.3; the first step ~5.5). */
Test(train, val_loss_falls_on_tinyshakespeare, .timeout = 120)
{
    spec_t s;
    parse(&s,
          "{\"model\": {\"type\": \"gpt\", \"n_layer\": 2, \"n_head\": 4, \"n_embd\": 64, "
          "\"seq_len\": 64, \"vocab\": \"bytes\"}, \"data\": {\"train\": \"%s\"}, "
          "\"hyperparameters\": {\"lr\": 4e-3, \"global_batch_size\": 16, \"max_steps\": 250, "
          "\"warmup_steps\": 20, \"weight_decay\": 0.1, \"seed\": 1337, \"eval_batches\": 8, "
          "\"sample_tokens\": 0}, \"resources\": {\"device\": \"cpu\"}}",
          data_path());
    eng_train_opts_t o = opts();
    eng_train_result_t r;
    run_ok(&s, &o, &r);
    cr_assert(isfinite(r.last_val_loss));
    cr_assert(r.last_val_loss < 2.50f, "val loss %.4f after 250 steps, want < 2.50",
              r.last_val_loss);
    free(r.losses);
    spec_deinit(&s);
}

Test(train, mlp_learns_synthetic_task)
{
    spec_t s;
    parse(&s,
          "{\"model\": {\"type\": \"mlp\", \"hidden\": [64, 64], \"n_inputs\": 16, "
          "\"n_classes\": 4}, \"data\": {\"train\": \"synthetic\"}, "
          "\"hyperparameters\": {\"lr\": 3e-3, \"global_batch_size\": 64, \"micro_batch_size\": 32, "
          "\"max_steps\": 300, \"warmup_steps\": 10, \"weight_decay\": 0.0}, "
          "\"resources\": {\"device\": \"cpu\"}}");
    eng_train_opts_t o = opts();
    eng_train_result_t r;
    run_ok(&s, &o, &r);
    /* chance is ln(4) = 1.386 */
    cr_assert(r.last_val_loss < 0.6f, "mlp val loss %.4f, want < 0.6", r.last_val_loss);
    free(r.losses);
    spec_deinit(&s);
}

Test(train, refuses_world_without_data_parallel)
{
    spec_t s;
    parse(&s, TINY_GPT, data_path(), 4, 1);
    eng_train_opts_t o = opts();
    o.world = 2;
    eng_train_result_t r;
    kiln_err_t err;
    cr_assert_eq(eng_train_run(&s, &o, &r, &err), KILN_EUNSUPP);
    cr_assert(strstr(err.message, "needs a parallel layer"), "%s", err.message);
    free(r.losses);
    spec_deinit(&s);
}

Test(train, lr_schedule)
{
    /* warm-up: linear from lr/warmup to lr */
    cr_assert_float_eq(eng_lr_at(1, 1.0, 10, 100, 0.1), 0.1, 1e-12);
    cr_assert_float_eq(eng_lr_at(10, 1.0, 10, 100, 0.1), 1.0, 1e-12);
    /* cosine: halfway between warm-up end and max_steps is the midpoint of lr and min */
    cr_assert_float_eq(eng_lr_at(55, 1.0, 10, 100, 0.1), 0.55, 1e-12);
    cr_assert_float_eq(eng_lr_at(100, 1.0, 10, 100, 0.1), 0.1, 1e-12);
    double prev = 2;
    for (int s = 11; s <= 100; s++) {
        double lr = eng_lr_at(s, 1.0, 10, 100, 0.1);
        cr_assert(lr <= prev && lr >= 0.1 - 1e-12);
        prev = lr;
    }
    cr_assert_float_eq(eng_lr_at(1, 2.0, 0, 10, 0.0), 2.0 * (0.5 * (1 + cos(M_PI * 0.1))), 1e-12);
}

/* model.init_from: an llm.c checkpoint of the right shape starts the run (the first loss is the
 * checkpoint's, not a fresh init's); a different shape is refused, naming the field. */
Test(train, init_from_llmc_checkpoint)
{
    char dir[] = "/tmp/kiln-eng-init-XXXXXX";
    cr_assert(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof(path), "%s/start.bin", dir);
    eng_gpt_config_t cfg = {32, 256, 256, 2, 2, 32};
    eng_gpt_t *m = NULL;
    kiln_err_t err;
    cr_assert_eq(eng_gpt_create(&cfg, &eng_cpu_backend, 1, &m, &err), 0);
    eng_gpt_init_weights(m, 99);
    eng_cpu_backend.scale(m->p.params, 3.0f, m->p.n); /* far from any fresh init */
    cr_assert_eq(eng_gpt_llmc_write(m, path, &err), 0, "%s", err.message);
    eng_gpt_destroy(m);

    spec_t s;
    char json[2048];
    snprintf(json, sizeof(json), TINY_GPT, data_path(), 4, 7);
    /* splice "init_from" into the model object */
    char *model_end = strstr(json, "\"vocab\": \"bytes\"}");
    cr_assert(model_end);
    char spliced[3072];
    int head = (int)(model_end - json) + (int)strlen("\"vocab\": \"bytes\"");
    snprintf(spliced, sizeof(spliced), "%.*s, \"init_from\": \"%s\"%s", head, json, path,
             json + head);
    cr_assert_eq(spec_parse_string(spliced, &s, &err), 0, "%s: %s", err.field, err.message);
    eng_train_opts_t o = opts();
    eng_train_result_t fresh, loaded;
    spec_t plain;
    parse(&plain, TINY_GPT, data_path(), 4, 7);
    run_ok(&plain, &o, &fresh);
    run_ok(&s, &o, &loaded);
    cr_assert(fabsf(fresh.losses[0] - loaded.losses[0]) > 0.05f,
              "init_from had no effect: %f vs %f", fresh.losses[0], loaded.losses[0]);
    free(fresh.losses);
    free(loaded.losses);
    spec_deinit(&s);
    spec_deinit(&plain);

    /* a checkpoint of another shape */
    cfg.n_embd = 64;
    cr_assert_eq(eng_gpt_create(&cfg, &eng_cpu_backend, 1, &m, &err), 0);
    cr_assert_eq(eng_gpt_llmc_write(m, path, &err), 0);
    eng_gpt_destroy(m);
    cr_assert_eq(spec_parse_string(spliced, &s, &err), 0);
    eng_train_result_t bad;
    cr_assert_eq(eng_train_run(&s, &o, &bad, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "model.init_from");
    cr_assert(strstr(err.message, "does not match"), "%s", err.message);
    free(bad.losses);
    spec_deinit(&s);
    cr_assert(th_rm_tree(dir), "could not remove %s", dir);
}

/* model.init_from "job:<id>": the model is the file kiln-agent fetched (opts.init_model), read
 * even outside KILN_DATA_ROOTS (kiln put it there, no spec named it); without it the run is
 * refused naming the field and saying how to run it by hand. */
Test(train, init_from_a_job_reads_the_fetched_model)
{
    char dir[] = "/tmp/kiln-eng-job-XXXXXX";
    cr_assert(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof(path), "%s/model_llmc.bin", dir);
    eng_gpt_config_t cfg = {32, 256, 256, 2, 2, 32};
    eng_gpt_t *m = NULL;
    kiln_err_t err;
    cr_assert_eq(eng_gpt_create(&cfg, &eng_cpu_backend, 1, &m, &err), 0);
    eng_gpt_init_weights(m, 99);
    eng_cpu_backend.scale(m->p.params, 3.0f, m->p.n);
    cr_assert_eq(eng_gpt_llmc_write(m, path, &err), 0, "%s", err.message);
    eng_gpt_destroy(m);

    char json[2048], spliced[3072];
    snprintf(json, sizeof(json), TINY_GPT, data_path(), 4, 7);
    char *model_end = strstr(json, "\"vocab\": \"bytes\"}");
    cr_assert(model_end);
    int head = (int)(model_end - json) + (int)strlen("\"vocab\": \"bytes\"");
    spec_t by_path, by_job;
    snprintf(spliced, sizeof(spliced), "%.*s, \"init_from\": \"%s\"%s", head, json, path, json + head);
    cr_assert_eq(spec_parse_string(spliced, &by_path, &err), 0, "%s", err.message);
    snprintf(spliced, sizeof(spliced), "%.*s, \"init_from\": \"job:0b6c2f0e-1d3a-4c55-9d7e-2f1e9a7b5c11\"%s", head,
             json, json + head);
    cr_assert_eq(spec_parse_string(spliced, &by_job, &err), 0, "%s", err.message);

    eng_train_opts_t o = opts();
    eng_train_result_t res;
    memset(&res, 0, sizeof(res));
    cr_assert_eq(eng_train_run(&by_job, &o, &res, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "model.init_from");
    cr_assert(strstr(err.message, "--init-model"), "%s", err.message);
    free(res.losses);

    eng_train_result_t a, b;
    run_ok(&by_path, &o, &a);
    /* the data roots (the training text's directory) do not hold the fetched copy; that is no
     * reason to refuse it */
    char root[1300];
    snprintf(root, sizeof(root), "%s", data_path());
    *strrchr(root, '/') = '\0';
    setenv(RANK_ENV_DATA_ROOTS, root, 1);
    o.init_model = path;
    run_ok(&by_job, &o, &b);
    unsetenv(RANK_ENV_DATA_ROOTS);
    cr_assert_float_eq(a.losses[0], b.losses[0], 1e-6, "the same model either way: %f vs %f", a.losses[0],
                       b.losses[0]);
    free(a.losses);
    free(b.losses);
    spec_deinit(&by_path);
    spec_deinit(&by_job);
    cr_assert(th_rm_tree(dir), "could not remove %s", dir);
}

/* kiln-train says when the operator's OPENBLAS_CORETYPE holds OpenBLAS to kernels slower than
 * the CPU could run: a core type without AVX-512 on a CPU with it, except on AMD family 19h. */
Test(cpu_env, a_coretype_without_avx512_is_named_only_where_the_cpu_could_do_better)
{
    cr_assert(eng_coretype_holds_back("Haswell", true, false));
    cr_assert(eng_coretype_holds_back("Zen", true, false), "Zen's kernels on an AVX-512 CPU that is not a Zen 3/4");
    cr_assert(!eng_coretype_holds_back("Zen", true, true), "on AMD family 19h kiln picks Zen itself");
    cr_assert(!eng_coretype_holds_back("Haswell", false, false), "a CPU without AVX-512 loses nothing");
    cr_assert(!eng_coretype_holds_back("SkylakeX", true, false));
    cr_assert(!eng_coretype_holds_back("cooperlake", true, false), "OpenBLAS reads the name in any case");
    cr_assert(!eng_coretype_holds_back("SapphireRapids", true, false));
    cr_assert(!eng_coretype_holds_back(NULL, true, false), "unset: OpenBLAS chooses");
    cr_assert(!eng_coretype_holds_back("", true, false));
}

/* A pipeline's microbatches when the spec leaves them out (eng_microbatches_choose): the most,
 * up to 4 a stage, that split a pass's sequences evenly, so the bubble (p-1)/(m+p-1) is under a
 * fifth where the batch allows; 1 before was a bubble of (p-1)/p, no pipelining at all. */
Test(train, pipeline_microbatches_are_chosen_from_the_job)
{
    cr_assert_eq(eng_microbatches_choose(8, 2), 8);   /* 4 a stage, 1 sequence each */
    cr_assert_eq(eng_microbatches_choose(64, 2), 8);
    cr_assert_eq(eng_microbatches_choose(64, 4), 16);
    cr_assert_eq(eng_microbatches_choose(12, 4), 12);
    cr_assert_eq(eng_microbatches_choose(6, 4), 6);   /* no more than a pass's sequences */
    cr_assert_eq(eng_microbatches_choose(20, 4), 10); /* 16 does not divide 20 */
    cr_assert_eq(eng_microbatches_choose(7, 2), 7);
    cr_assert_eq(eng_microbatches_choose(11, 2), 1);  /* a prime above 8: only whole passes */
    cr_assert_eq(eng_microbatches_choose(1, 8), 1);

    /* the geometry takes it when the spec leaves microbatches out, and the value it is given */
    spec_t s;
    kiln_err_t err;
    cr_assert_eq(spec_parse_string("{\"model\": {\"type\": \"gpt\", \"n_layer\": 4, \"n_head\": 2, \"n_embd\": 32, "
                                   "\"seq_len\": 16}, \"data\": {\"train\": \"/x.txt\"}, \"hyperparameters\": "
                                   "{\"global_batch_size\": 32}, \"resources\": {\"slots_per_node\": 4}, "
                                   "\"distribution\": {\"model_parallel\": {\"partitions\": 2}}}", &s, &err),
                 0, "%s", err.message);
    cr_assert_eq(s.dist.mp_microbatches, 0);
    eng_geometry_t g;
    cr_assert_eq(eng_geometry_init(&g, &s, 2, s.dist.mp_microbatches, &err), 0, "%s", err.message);
    cr_assert(g.microbatches_chosen);
    cr_assert_eq(g.microbatches, 8);
    cr_assert_eq(g.B, 2);
    cr_assert_eq(eng_geometry_init(&g, &s, 2, 2, &err), 0, "%s", err.message);
    cr_assert(!g.microbatches_chosen);
    cr_assert_eq(g.microbatches, 2);
    spec_deinit(&s);
}
