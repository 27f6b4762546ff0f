/* test_profile.c - block profiles of a GPT: byte counts agree with the engine's own memory plan
 * (parameter count, activation slab), the tied embedding counts on both the embedding and the
 * head (whole or in slices), the head is cut from the profile, and the
 * timings are real (positive, and a wider model's layers take longer). */
#include "engine/pipe/pipe.h"

#include <criterion/criterion.h>
#include <stdbool.h>

static void check_bytes(int J, bool recompute)
{
    eng_gpt_config_t cfg = {.max_seq_len = 16, .vocab_size = 250, .padded_vocab_size = 256, .n_layer = 3,
                            .n_head = 2, .n_embd = 32};
    int B = 2, T = 16, L = cfg.n_layer, nb = 2 * L + 1 + J;
    pipe_block_profile_t prof[16];
    size_t over = 0;
    kiln_err_t err;
    eng_cpu_set_threads(1);
    cr_assert_eq(pipe_profile_gpt(&cfg, &eng_cpu_backend, B, T, J, recompute, 1, 3, prof, &over, &err), 0, "%s",
                 err.message);
    size_t params = 0, acts = 0;
    for (int b = 0; b < nb; b++) {
        params += prof[b].param_bytes;
        acts += prof[b].act_bytes_per_mb;
        cr_assert_eq(prof[b].opt_bytes, 2 * prof[b].param_bytes, "AdamW keeps m and v");
        cr_assert_gt(prof[b].fwd_ms, 0.0, "J=%d block %d", J, b);
        cr_assert_gt(prof[b].bwd_ms, 0.0, "J=%d block %d", J, b);
    }
    size_t wte = (size_t)cfg.padded_vocab_size * cfg.n_embd * sizeof(float);
    cr_assert_eq(params, eng_gpt_num_params(&cfg) * sizeof(float) + wte,
                 "every parameter once, the tied wte on both the embedding and the head");
    for (int b = 3; b <= 2 * L; b++)
        cr_assert_eq(prof[b].param_bytes, prof[2 - b % 2].param_bytes, "layers are alike");
    cr_assert_lt(prof[1].param_bytes, prof[2].param_bytes, "attention (4C^2) is lighter than the MLP (8C^2)");
    eng_gpt_t *m = NULL;
    eng_gpt_acts_t *a = NULL;
    cr_assert_eq(eng_gpt_create(&cfg, &eng_cpu_backend, B, &m, &err), 0);
    cr_assert_eq(eng_gpt_set_recompute(m, recompute, &err), 0);
    cr_assert_eq(eng_gpt_acts_create(m, B, T, &a, &err), 0);
    /* the slab rounds each of its 20 arrays up to 16 floats; every head slice counts the targets
     * (a stage holding any slice keeps them), the slab holds them once */
    size_t slab = a->bytes + (size_t)(J - 1) * B * T * sizeof(int32_t);
    cr_assert(acts <= slab && slab - acts <= 20 * 16 * sizeof(float),
              "J=%d%s: activation bytes %zu, the engine's slab %zu", J, recompute ? " recompute" : "", acts, slab);
    cr_assert_gt(over, 0);
    if (recompute) /* the workspace the blocks recompute into is in the overhead */
        cr_assert_geq(over, m->work_bytes - 12 * 16 * sizeof(float), "overhead %zu, workspace %zu", over,
                      m->work_bytes);
    eng_gpt_acts_destroy(m, a);
    eng_gpt_destroy(m);
}

Test(profile, bytes_match_the_engine_plan)
{
    check_bytes(1, false);
    check_bytes(3, false);
}

/* With activation checkpointing the blocks keep their boundaries only. */
Test(profile, recompute_bytes_match_the_engine_plan)
{
    check_bytes(1, true);
    check_bytes(3, true);
}

/* The head is cut so that no slice costs more than the cheaper half of a layer. */
Test(profile, head_blocks_from_the_profile)
{
    pipe_block_profile_t p[2 * 2 + 2] = {{0}};
    p[1] = (pipe_block_profile_t){.fwd_ms = 1, .bwd_ms = 2};   /* attention: 3 ms */
    p[2] = (pipe_block_profile_t){.fwd_ms = 2, .bwd_ms = 4};   /* MLP: 6 ms */
    p[5] = (pipe_block_profile_t){.fwd_ms = 1, .bwd_ms = 1.5}; /* a cheap head */
    cr_assert_eq(pipe_gpt_choose_head_blocks(p, 2), 1);
    p[5] = (pipe_block_profile_t){.fwd_ms = 6, .bwd_ms = 10.5}; /* 16.5 ms: 5.5 attention halves */
    cr_assert_eq(pipe_gpt_choose_head_blocks(p, 2), 6);
    p[5] = (pipe_block_profile_t){.fwd_ms = 1000, .bwd_ms = 1000};
    cr_assert_eq(pipe_gpt_choose_head_blocks(p, 2), PIPE_MAX_HEAD_BLOCKS);
}

Test(profile, wider_layers_take_longer)
{
    eng_gpt_config_t small = {.max_seq_len = 32, .vocab_size = 256, .padded_vocab_size = 256, .n_layer = 2,
                              .n_head = 2, .n_embd = 32};
    eng_gpt_config_t wide = small;
    wide.n_embd = 256;
    pipe_block_profile_t ps[6], pw[6];
    kiln_err_t err;
    eng_cpu_set_threads(1);
    cr_assert_eq(pipe_profile_gpt(&small, &eng_cpu_backend, 4, 32, 1, false, 1, 5, ps, NULL, &err), 0, "%s", err.message);
    cr_assert_eq(pipe_profile_gpt(&wide, &eng_cpu_backend, 4, 32, 1, false, 1, 5, pw, NULL, &err), 0, "%s", err.message);
    /* 64x the layer FLOPs; even on a busy machine the median is several times slower */
    double ts = ps[1].fwd_ms + ps[1].bwd_ms + ps[2].fwd_ms + ps[2].bwd_ms;
    double tw = pw[1].fwd_ms + pw[1].bwd_ms + pw[2].fwd_ms + pw[2].bwd_ms;
    cr_assert_gt(tw, 3 * ts, "small %.3f ms, wide %.3f ms", ts, tw);
}
