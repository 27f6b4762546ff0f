/* test_profile.c - block profiles of a GPT: byte counts agree with the engine's own memory plan
 * (parameter count, activation slab), the tied embedding counts on both end blocks, and the
 * timings are real (positive, and a wider model's layers take longer). */
#include "engine/pipe/pipe.h"

#include <criterion/criterion.h>

Test(profile, bytes_match_the_engine_plan)
{
    eng_gpt_config_t cfg = {.max_seq_len = 16, .vocab_size = 256, .padded_vocab_size = 256, .n_layer = 3,
                            .n_head = 2, .n_embd = 32};
    int B = 2, T = 16, nb = cfg.n_layer + 2;
    pipe_block_profile_t prof[8];
    size_t over = 0;
    kiln_err_t err;
    eng_cpu_set_threads(1);
    cr_assert_eq(pipe_profile_gpt(&cfg, &eng_cpu_backend, B, T, 1, 3, prof, &over, &err), 0, "%s", err.message);
    size_t params = 0, acts = 0;
    for (int b = 0; b < nb; b++) {
        params += prof[b].param_bytes;
        acts += prof[b].act_bytes_per_mb;
        cr_assert_eq(prof[b].opt_bytes, 2 * prof[b].param_bytes, "AdamW keeps m and v");
        cr_assert_gt(prof[b].fwd_ms, 0.0);
        cr_assert_gt(prof[b].bwd_ms, 0.0);
    }
    size_t wte = (size_t)cfg.padded_vocab_size * cfg.n_embd * sizeof(float);
    cr_assert_eq(params, eng_gpt_num_params(&cfg) * sizeof(float) + wte,
                 "every parameter once, the tied wte on both the embedding and the head");
    for (int b = 2; b <= cfg.n_layer; b++)
        cr_assert_eq(prof[b].param_bytes, prof[1].param_bytes, "layers are alike");
    eng_gpt_t *m = NULL;
    eng_gpt_acts_t *a = NULL;
    cr_assert_eq(eng_gpt_create(&cfg, &eng_cpu_backend, B, &m, &err), 0);
    cr_assert_eq(eng_gpt_acts_create(m, B, T, &a, &err), 0);
    /* the slab rounds each of its 20 arrays up to 16 floats */
    cr_assert(acts <= a->bytes && a->bytes - acts <= 20 * 16 * sizeof(float),
              "activation bytes %zu, the engine's slab %zu", acts, a->bytes);
    cr_assert_gt(over, 0);
    eng_gpt_acts_destroy(m, a);
    eng_gpt_destroy(m);
}

Test(profile, wider_layers_take_longer)
{
    eng_gpt_config_t small = {.max_seq_len = 32, .vocab_size = 256, .padded_vocab_size = 256, .n_layer = 2,
                              .n_head = 2, .n_embd = 32};
    eng_gpt_config_t wide = small;
    wide.n_embd = 256;
    pipe_block_profile_t ps[4], pw[4];
    kiln_err_t err;
    eng_cpu_set_threads(1);
    cr_assert_eq(pipe_profile_gpt(&small, &eng_cpu_backend, 4, 32, 1, 5, ps, NULL, &err), 0, "%s", err.message);
    cr_assert_eq(pipe_profile_gpt(&wide, &eng_cpu_backend, 4, 32, 1, 5, pw, NULL, &err), 0, "%s", err.message);
    /* 64x the layer FLOPs; even on a busy machine the median is several times slower */
    cr_assert_gt(pw[1].fwd_ms + pw[1].bwd_ms, 3 * (ps[1].fwd_ms + ps[1].bwd_ms), "small %.3f ms, wide %.3f ms",
                 ps[1].fwd_ms + ps[1].bwd_ms, pw[1].fwd_ms + pw[1].bwd_ms);
}
