/* test_partition.c - the automatic partitioner returns the optimal split (checked against brute
 * force over every contiguous split) on synthetic profiles: uniform, heavy first and last blocks,
 * random, and memory-bound cases where the fastest split does not fit; and a clear error when no
 * split fits. */
#include "engine/pipe/pipe.h"

#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#define MIB ((size_t)1 << 20)

typedef struct { double t; size_t m; bool ok; } score_t;

/* Max stage time and max stage memory of the split given by starts[0..p). */
static score_t score(const pipe_block_profile_t *prof, int n, const int *starts, const pipe_partition_opts_t *o)
{
    score_t s = {0, 0, true};
    for (int k = 0; k < o->n_stages; k++) {
        int f = starts[k], l = (k + 1 < o->n_stages ? starts[k + 1] : n) - 1;
        double t = pipe_stage_time(prof, f, l);
        size_t m = pipe_stage_mem(prof, f, l, k, o);
        if (t > s.t) s.t = t;
        if (m > s.m) s.m = m;
        if (o->mem_limit_bytes && m > o->mem_limit_bytes) s.ok = false;
    }
    return s;
}

/* a better than b lexicographically for the objective */
static bool better(score_t a, score_t b, pipe_optimize_t opt)
{
    if (opt == PIPE_OPT_SPEED)
        return a.t < b.t || (a.t == b.t && a.m < b.m);
    return a.m < b.m || (a.m == b.m && a.t < b.t);
}

/* Enumerates every split of n blocks into p non-empty contiguous stages. */
static void brute_rec(const pipe_block_profile_t *prof, int n, const pipe_partition_opts_t *o, int *starts, int k,
                      score_t *best, bool *found)
{
    int p = o->n_stages;
    if (k == p) {
        score_t s = score(prof, n, starts, o);
        if (s.ok && (!*found || better(s, *best, o->optimize))) {
            *best = s;
            *found = true;
        }
        return;
    }
    int lo = starts[k - 1] + 1, hi = n - (p - k);
    for (int i = lo; i <= hi; i++) {
        starts[k] = i;
        brute_rec(prof, n, o, starts, k + 1, best, found);
    }
}

static bool brute(const pipe_block_profile_t *prof, int n, const pipe_partition_opts_t *o, score_t *best)
{
    int starts[32] = {0};
    bool found = false;
    brute_rec(prof, n, o, starts, 1, best, &found);
    return found;
}

static void check_optimal(const pipe_block_profile_t *prof, int n, const pipe_partition_opts_t *o)
{
    pipe_plan_t plan;
    kiln_err_t err;
    score_t want;
    bool feasible = brute(prof, n, o, &want);
    int rc = pipe_partition(prof, n, o, &plan, &err);
    if (!feasible) {
        cr_assert_eq(rc, KILN_EUNFIT, "n=%d p=%d: brute force finds no feasible split, partitioner says %d", n,
                     o->n_stages, rc);
        cr_assert(strstr(err.message, "model does not fit"), "%s", err.message);
        return;
    }
    cr_assert_eq(rc, 0, "n=%d p=%d: %s", n, o->n_stages, err.message);
    cr_assert_eq(plan.n_stages, o->n_stages);
    cr_assert_eq(plan.stages[0].first, 0);
    cr_assert_eq(plan.stages[plan.n_stages - 1].last, n - 1);
    int starts[32];
    for (int k = 0; k < plan.n_stages; k++) {
        starts[k] = plan.stages[k].first;
        cr_assert_leq(plan.stages[k].first, plan.stages[k].last);
        if (k)
            cr_assert_eq(plan.stages[k].first, plan.stages[k - 1].last + 1);
    }
    score_t got = score(prof, n, starts, o);
    cr_assert(got.ok, "the chosen split exceeds the memory limit");
    cr_assert_float_eq(got.t, want.t, 1e-9 * (1 + want.t), "%s n=%d p=%d m=%d: slowest stage %.6f, optimum %.6f",
                       pipe_optimize_name(o->optimize), n, o->n_stages, o->microbatches, got.t, want.t);
    if (o->optimize == PIPE_OPT_MEMORY || got.t == want.t)
        cr_assert_eq(got.m, want.m, "%s n=%d p=%d: largest stage %zu, optimum %zu", pipe_optimize_name(o->optimize),
                     n, o->n_stages, got.m, want.m);
    pipe_plan_deinit(&plan);
}

static pipe_block_profile_t blk(double f, double b, size_t params, size_t act)
{
    return (pipe_block_profile_t){.fwd_ms = f, .bwd_ms = b, .param_bytes = params, .opt_bytes = 2 * params,
                                  .act_bytes_per_mb = act};
}

Test(partition, uniform_blocks_split_evenly)
{
    pipe_block_profile_t prof[8];
    for (int i = 0; i < 8; i++)
        prof[i] = blk(1.0, 2.0, MIB, MIB);
    pipe_partition_opts_t o = {.n_stages = 4, .microbatches = 4, .optimize = PIPE_OPT_SPEED,
                               .schedule = PIPE_SCHED_SIMPLE};
    pipe_plan_t plan;
    kiln_err_t err;
    cr_assert_eq(pipe_partition(prof, 8, &o, &plan, &err), 0, "%s", err.message);
    for (int k = 0; k < 4; k++) {
        cr_assert_eq(plan.stages[k].first, 2 * k);
        cr_assert_eq(plan.stages[k].last, 2 * k + 1);
        cr_assert_float_eq(plan.stages[k].predicted_ms, 4 * 6.0, 1e-9);
        /* 2 blocks x (params + grads + 2 x optimizer) = 8 MiB, + 4 microbatches x 2 MiB */
        cr_assert_float_eq(plan.stages[k].predicted_mem_mb, 16.0, 1e-9);
    }
    cr_assert_float_eq(plan.balance, 1.0, 1e-12);
    /* simulated: (m + p - 1) x (f + b) = 7 x 6 ms, bubble (p-1)/(m+p-1) = 3/7 */
    cr_assert_float_eq(plan.predicted_pass_ms, 42.0, 1e-9);
    cr_assert_float_eq(plan.predicted_bubble, 3.0 / 7.0, 1e-12);
    pipe_plan_deinit(&plan);
    check_optimal(prof, 8, &o);
}

Test(partition, heavy_first_and_last_blocks)
{
    /* A GPT's embedding and head (large vocabulary) outweigh a transformer layer. */
    pipe_block_profile_t prof[10];
    for (int i = 0; i < 10; i++)
        prof[i] = blk(1.0, 2.0, MIB, MIB);
    prof[0] = blk(4.0, 5.0, 8 * MIB, MIB);
    prof[9] = blk(6.0, 9.0, 8 * MIB, 4 * MIB);
    for (int p = 1; p <= 6; p++)
        for (int opt = 0; opt < 2; opt++)
            for (int sch = 0; sch < 2; sch++) {
                pipe_partition_opts_t o = {.n_stages = p, .microbatches = 4, .optimize = (pipe_optimize_t)opt,
                                           .schedule = (pipe_sched_kind_t)sch};
                check_optimal(prof, 10, &o);
            }
    /* With 4 stages for speed the head (15 ms) is alone on the last stage. */
    pipe_partition_opts_t o = {.n_stages = 4, .microbatches = 4, .optimize = PIPE_OPT_SPEED,
                               .schedule = PIPE_SCHED_INTERLEAVED};
    pipe_plan_t plan;
    kiln_err_t err;
    cr_assert_eq(pipe_partition(prof, 10, &o, &plan, &err), 0, "%s", err.message);
    cr_assert_eq(plan.stages[3].first, 9);
    cr_assert_eq(plan.stages[3].last, 9);
    cr_assert_eq(plan.stages[0].first, 0);
    cr_assert_lt(plan.stages[0].last, 3, "the heavy embedding gets few layers beside it");
    pipe_plan_deinit(&plan);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

Test(partition, random_profiles_match_brute_force)
{
    for (int iter = 0; iter < 400; iter++) {
        int n = 1 + (int)(rnd() % 10);
        int p = 1 + (int)(rnd() % (n < 5 ? n : 5));
        pipe_block_profile_t prof[10];
        for (int i = 0; i < n; i++) {
            /* small integers make exact ties common, which exercises the tie-break */
            prof[i] = blk((double)(1 + rnd() % 4), (double)(rnd() % 5), (1 + rnd() % 6) * MIB,
                          (rnd() % 5) * MIB);
            if (rnd() % 3 == 0)
                prof[i].fwd_ms += (double)(rnd() % 1000) / 997.0;
        }
        pipe_partition_opts_t o = {.n_stages = p, .microbatches = 1 + (int)(rnd() % 8),
                                   .optimize = (pipe_optimize_t)(rnd() % 2),
                                   .schedule = (pipe_sched_kind_t)(rnd() % 2)};
        if (rnd() % 3 == 0)
            o.rank_overhead_bytes = (rnd() % 3) * MIB / 2;
        if (iter % 2) {
            /* a limit somewhere around a typical stage, so some cases are infeasible */
            size_t total = 0;
            for (int i = 0; i < n; i++)
                total += 3 * prof[i].param_bytes + (size_t)o.microbatches * prof[i].act_bytes_per_mb;
            o.mem_limit_bytes = total / (size_t)p + (rnd() % 8) * MIB;
        }
        check_optimal(prof, n, &o);
    }
}

Test(partition, memory_bound_speed_split_does_not_fit)
{
    /* Six blocks of equal time; the last three have large parameters (10 MiB -> 40 MiB with
     * gradients and AdamW state, against 4 MiB for the first three). The fastest 2-way split is
     * 0-2 | 3-5 (3 | 3 ms) but its second stage needs 120 MiB; under an 85 MiB limit the
     * partitioner must take 0-3 | 4-5 (4 | 2 ms, 52 | 80 MiB), the fastest split that fits. */
    pipe_block_profile_t prof[6] = {blk(0.5, 0.5, MIB, 0),      blk(0.5, 0.5, MIB, 0),
                                    blk(0.5, 0.5, MIB, 0),      blk(0.5, 0.5, 10 * MIB, 0),
                                    blk(0.5, 0.5, 10 * MIB, 0), blk(0.5, 0.5, 10 * MIB, 0)};
    pipe_partition_opts_t o = {.n_stages = 2, .microbatches = 2, .optimize = PIPE_OPT_SPEED,
                               .schedule = PIPE_SCHED_SIMPLE};
    pipe_plan_t plan;
    kiln_err_t err;
    cr_assert_eq(pipe_partition(prof, 6, &o, &plan, &err), 0, "%s", err.message);
    cr_assert_eq(plan.stages[0].last, 2, "without a limit the compute is balanced 3 | 3");
    cr_assert_float_eq(plan.stages[1].predicted_mem_mb, 120.0, 1e-9);
    pipe_plan_deinit(&plan);

    o.mem_limit_bytes = 85 * MIB;
    cr_assert_eq(pipe_partition(prof, 6, &o, &plan, &err), 0, "%s", err.message);
    cr_assert_eq(plan.stages[0].last, 3, "the limit moves block 3 onto the first stage");
    cr_assert_float_eq(plan.stages[0].predicted_mem_mb, 52.0, 1e-9);
    cr_assert_float_eq(plan.stages[1].predicted_mem_mb, 80.0, 1e-9);
    cr_assert_float_eq(plan.balance, 4.0 / 3.0, 1e-3);
    cr_assert_float_eq(plan.memory_limit_mb, 85.0, 1e-9);
    pipe_plan_deinit(&plan);
    check_optimal(prof, 6, &o);

    /* Activations: 4 MiB per block per microbatch and 8 microbatches. simple keeps all 8 sets on
     * every stage (best split needs 180 MiB); interleaved keeps min(m, p - stage) = 2 and 1
     * (best split 0-3 | 4-5 needs 84 | 88 MiB), so a 100 MiB limit fits only interleaved. */
    for (int i = 0; i < 6; i++)
        prof[i].act_bytes_per_mb = 4 * MIB;
    o.microbatches = 8;
    o.mem_limit_bytes = 100 * MIB;
    cr_assert_eq(pipe_partition(prof, 6, &o, &plan, &err), KILN_EUNFIT);
    cr_assert(strstr(err.message, "smallest possible stage needs 180.0 MiB, limit 100.0 MiB"), "%s", err.message);
    check_optimal(prof, 6, &o);
    o.schedule = PIPE_SCHED_INTERLEAVED;
    cr_assert_eq(pipe_partition(prof, 6, &o, &plan, &err), 0, "%s", err.message);
    cr_assert_eq(plan.stages[0].last, 3);
    cr_assert_float_eq(plan.stages[0].predicted_mem_mb, 84.0, 1e-9);
    cr_assert_float_eq(plan.stages[1].predicted_mem_mb, 88.0, 1e-9);
    pipe_plan_deinit(&plan);
    check_optimal(prof, 6, &o);
    o.optimize = PIPE_OPT_MEMORY;
    check_optimal(prof, 6, &o);
}

Test(partition, memory_objective_balances_memory)
{
    /* The embedding (block 0) is slow and large, the head (block 5) large: for speed block 0
     * stands alone (10 | 5 ms); for memory the split 0-2 | 3-5 gives 128 | 128 MiB. */
    pipe_block_profile_t prof[6] = {blk(5, 5, 30 * MIB, 0),     blk(0.5, 0.5, MIB, 0), blk(0.5, 0.5, MIB, 0),
                                    blk(0.5, 0.5, MIB, 0),      blk(0.5, 0.5, MIB, 0),
                                    blk(0.5, 0.5, 30 * MIB, 0)};
    pipe_partition_opts_t o = {.n_stages = 2, .microbatches = 1, .optimize = PIPE_OPT_MEMORY,
                               .schedule = PIPE_SCHED_SIMPLE};
    pipe_plan_t plan;
    kiln_err_t err;
    cr_assert_eq(pipe_partition(prof, 6, &o, &plan, &err), 0, "%s", err.message);
    cr_assert_eq(plan.stages[0].last, 2);
    cr_assert_float_eq(plan.stages[0].predicted_mem_mb, 128.0, 1e-9);
    cr_assert_float_eq(plan.stages[1].predicted_mem_mb, 128.0, 1e-9);
    pipe_plan_deinit(&plan);
    check_optimal(prof, 6, &o);
    o.optimize = PIPE_OPT_SPEED;
    cr_assert_eq(pipe_partition(prof, 6, &o, &plan, &err), 0, "%s", err.message);
    cr_assert_eq(plan.stages[0].last, 0);
    cr_assert_float_eq(plan.balance, 10.0 / 7.5, 1e-3);
    pipe_plan_deinit(&plan);
    check_optimal(prof, 6, &o);
}

Test(partition, nothing_fits_is_a_clear_error)
{
    pipe_block_profile_t prof[4];
    for (int i = 0; i < 4; i++)
        prof[i] = blk(1, 1, 10 * MIB, 0);
    /* each block alone needs 40 MiB (params + grads + 2 x optimizer state) */
    pipe_partition_opts_t o = {.n_stages = 2, .microbatches = 1, .optimize = PIPE_OPT_SPEED,
                               .schedule = PIPE_SCHED_SIMPLE, .mem_limit_bytes = 50 * MIB};
    pipe_plan_t plan;
    kiln_err_t err;
    cr_assert_eq(pipe_partition(prof, 4, &o, &plan, &err), KILN_EUNFIT);
    cr_assert(strstr(err.message, "model does not fit: the smallest possible stage needs 80.0 MiB, limit 50.0 MiB"),
              "%s", err.message);
    cr_assert(strstr(err.message, "use more partitions or a larger memory limit"), "%s", err.message);
    o.n_stages = 4;
    cr_assert_eq(pipe_partition(prof, 4, &o, &plan, &err), 0, "%s", err.message);
    pipe_plan_deinit(&plan);
    o.n_stages = 5;
    cr_assert_eq(pipe_partition(prof, 4, &o, &plan, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "every stage needs at least one block"), "%s", err.message);
}

Test(partition, live_activation_counts)
{
    cr_assert_eq(pipe_sched_live_acts(PIPE_SCHED_SIMPLE, 0, 4, 8), 8);
    cr_assert_eq(pipe_sched_live_acts(PIPE_SCHED_INTERLEAVED, 0, 4, 8), 4);
    cr_assert_eq(pipe_sched_live_acts(PIPE_SCHED_INTERLEAVED, 3, 4, 8), 1);
    cr_assert_eq(pipe_sched_live_acts(PIPE_SCHED_INTERLEAVED, 0, 4, 2), 2);
}

Test(partition, ties_spread_the_rest_evenly)
{
    /* GPT-2 124M's shape at short context: a negligible embedding, 12 equal layers and a head as
     * slow as 6 layers. With 8 stages the head alone sets the pace; the other 7 stages should
     * still share the 12 layers evenly (at most 2 each), not pile them up behind the head. */
    pipe_block_profile_t prof[14];
    prof[0] = blk(0.001, 0.001, MIB, MIB);
    for (int i = 1; i <= 12; i++)
        prof[i] = blk(0.5, 0.5, MIB, MIB);
    prof[13] = blk(3, 3, MIB, MIB);
    pipe_partition_opts_t o = {.n_stages = 8, .microbatches = 4, .optimize = PIPE_OPT_SPEED,
                               .schedule = PIPE_SCHED_INTERLEAVED};
    pipe_plan_t plan;
    kiln_err_t err;
    cr_assert_eq(pipe_partition(prof, 14, &o, &plan, &err), 0, "%s", err.message);
    cr_assert_eq(plan.stages[7].first, 13, "the head stands alone");
    for (int k = 0; k < 7; k++)
        cr_assert_leq(plan.stages[k].last - plan.stages[k].first + 1 - (plan.stages[k].first == 0), 2,
                      "stage %d holds blocks [%d, %d]", k, plan.stages[k].first, plan.stages[k].last);
    pipe_plan_deinit(&plan);
    check_optimal(prof, 14, &o);
}

Test(partition, activation_checkpointing_keeps_boundaries_only)
{
    /* With activation checkpointing a GPT layer's half keeps only its output boundary (B,T,C) per
     * microbatch; the rest is recomputed into one workspace (the overhead). 4 layers of C=128 at
     * B=4, T=128, 8 microbatches, simple schedule, 2 stages, a 40 MiB limit: without recompute a
     * stage keeps 8 x 2 layers of activations (~2.4 MiB per half layer each) and does not fit;
     * with it 8 x 4 boundaries of 0.25 MiB do. */
    eng_gpt_config_t cfg = {.max_seq_len = 128, .vocab_size = 256, .padded_vocab_size = 256, .n_layer = 4,
                            .n_head = 4, .n_embd = 128};
    int B = 4, T = 128, L = 4, nb = 2 * L + 2;
    size_t boundary = (size_t)B * T * cfg.n_embd * sizeof(float);
    pipe_block_profile_t plain[10], rc[10];
    for (int b = 0; b < nb; b++) {
        size_t with = pipe_gpt_act_bytes(&cfg, 1, b, B, T, true), without = pipe_gpt_act_bytes(&cfg, 1, b, B, T, false);
        if (b >= 1 && b <= 2 * L) {
            cr_assert_eq(with, boundary, "block %d keeps its output boundary only", b);
            cr_assert_gt(without, 4 * with, "block %d: %zu bytes without recompute", b, without);
        }
        cr_assert_leq(with, without);
        plain[b] = blk(1, 2, MIB / 4, without);
        rc[b] = blk(1, 2, MIB / 4, with);
    }
    pipe_partition_opts_t o = {.n_stages = 2, .microbatches = 8, .optimize = PIPE_OPT_SPEED,
                               .schedule = PIPE_SCHED_SIMPLE, .mem_limit_bytes = 40 * MIB,
                               .rank_overhead_bytes = 4 * MIB};
    pipe_plan_t plan;
    kiln_err_t err;
    cr_assert_eq(pipe_partition(plain, nb, &o, &plan, &err), KILN_EUNFIT);
    cr_assert_eq(pipe_partition(rc, nb, &o, &plan, &err), 0, "%s", err.message);
    pipe_plan_deinit(&plan);
    check_optimal(rc, nb, &o);
}
