/* profile.c - measures what the partitioner needs about each GPT block: forward and backward time
 * of one microbatch on the job's backend, and parameter, optimizer-state and activation bytes
 * from the engine's memory plan. It does not decide anything (partition.c does). */
#include "engine/pipe/pipe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

size_t pipe_gpt_act_bytes(const eng_gpt_config_t *c, int head_blocks, int block, int B, int T, bool recompute)
{
    size_t C = c->n_embd, NH = c->n_head, BT = (size_t)B * T, Vp = c->padded_vocab_size;
    int L = c->n_layer, J = head_blocks < 1 ? 1 : head_blocks;
    size_t floats;
    if (block == 0) {
        floats = BT * C + BT;                            /* boundary 0, tokens */
    } else if (block <= 2 * L && block % 2 == 1) {       /* attention half */
        floats = BT * C;                                 /* output boundary (resid2) */
        if (!recompute)
            floats += BT * C + 2 * BT                    /* ln1, mean, rstd */
                      + BT * 3 * C + (size_t)B * NH * T * T /* qkv, att */
                      + BT * C;                          /* atty */
    } else if (block <= 2 * L) {                         /* MLP half */
        floats = BT * C;                                 /* output boundary */
        if (!recompute)
            floats += BT * C + 2 * BT                    /* ln2, mean, rstd */
                      + 2 * BT * 4 * C;                  /* fch, fch_gelu */
    } else {
        int j = block - (2 * L + 1);
        size_t r0 = Vp * (size_t)j / J, r1 = Vp * (size_t)(j + 1) / J;
        floats = (recompute ? 0 : BT * (r1 - r0)) + BT;  /* the slice's logits, targets */
        if (j == 0)
            floats += BT * C + 4 * BT + 2 * BT;          /* lnf with statistics, mean, rstd */
        if (j == J - 1)
            floats += BT;                                /* losses */
    }
    return floats * sizeof(float);
}

int pipe_gpt_choose_head_blocks(const pipe_block_profile_t *prof, int n_layer)
{
    double head = prof[2 * n_layer + 1].fwd_ms + prof[2 * n_layer + 1].bwd_ms;
    double piece = fmin(prof[1].fwd_ms + prof[1].bwd_ms, prof[2].fwd_ms + prof[2].bwd_ms);
    if (!(piece > 0) || !(head > piece))
        return 1;
    double j = ceil(head / piece);
    return j > PIPE_MAX_HEAD_BLOCKS ? PIPE_MAX_HEAD_BLOCKS : (int)j;
}

static double now_ms(void) { return kiln_mono_s() * 1e3; }

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of column c of an (n, PROF_COLS) table. */
#define PROF_COLS (3 + PIPE_MAX_HEAD_BLOCKS)
static double median_col(double (*t)[PROF_COLS], int n, int c)
{
    double v[64];
    int k = n < 64 ? n : 64;
    for (int i = 0; i < k; i++)
        v[i] = t[i][c];
    qsort(v, (size_t)k, sizeof(double), cmp_double);
    return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

int pipe_profile_gpt(const eng_gpt_config_t *cfg, const eng_backend_t *be, int B, int T, int head_blocks,
                     bool recompute, int warmup, int iters, pipe_block_profile_t *out, size_t *overhead_bytes,
                     kiln_err_t *err)
{
    eng_gpt_t *m = NULL;
    eng_gpt_acts_t *a = NULL, *other = NULL; /* other: a second microbatch (recompute) */
    int32_t *tok = NULL;
    float *dout = NULL, *din = NULL;
    double (*ft)[PROF_COLS] = NULL, (*bt)[PROF_COLS] = NULL;
    int rc, J = head_blocks;
    if (J < 1 || J > PIPE_MAX_HEAD_BLOCKS)
        return kiln_err_set(err, KILN_EINVAL, NULL, "head blocks must be 1..%d, not %d", PIPE_MAX_HEAD_BLOCKS, J);
    if (iters < 1)
        iters = 1;
    if (iters > 64)
        iters = 64;
    if (warmup < 0)
        warmup = 0;
    /* a one-layer clone: blocks 0 (embedding), 1 (attention), 2 (MLP), 3.. (head slices) */
    eng_gpt_config_t one = *cfg;
    one.n_layer = 1;
    int nc = 3 + J;
    if ((rc = eng_gpt_create(&one, be, B, &m, err)) || (rc = eng_gpt_set_head_blocks(m, J, err)) ||
        (rc = eng_gpt_set_recompute(m, recompute, err)))
        goto fail;
    if ((rc = eng_gpt_acts_create(m, B, T, &a, err)) ||
        (recompute && (rc = eng_gpt_acts_create(m, B, T, &other, err))))
        goto fail;
    eng_gpt_init_weights(m, 1234);
    size_t BT = (size_t)B * T, C = cfg->n_embd, nbf = eng_gpt_max_boundary_floats(m, B, T);
    tok = malloc(sizeof(int32_t) * BT);
    float *h = malloc(sizeof(float) * nbf);
    dout = be->alloc(sizeof(float) * nbf);
    din = be->alloc(sizeof(float) * nbf);
    ft = calloc((size_t)iters, sizeof(*ft));
    bt = calloc((size_t)iters, sizeof(*bt));
    if (!tok || !h || !dout || !din || !ft || !bt) {
        free(h);
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory while profiling");
        goto fail;
    }
    eng_rng_t r;
    eng_rng_seed(&r, 99);
    for (size_t i = 0; i < BT; i++)
        tok[i] = (int32_t)eng_rng_below(&r, (uint64_t)cfg->vocab_size);
    for (size_t i = 0; i < BT * C; i++)
        h[i] = (float)(eng_rng_normal(&r) * 0.01);
    for (size_t i = BT * C; i < nbf; i++)
        h[i] = 1.0f; /* a plausible log-sum-exp for the head slices' incoming gradient */
    be->to_device(dout, h, sizeof(float) * nbf);
    free(h);
    eng_gpt_acts_set_batch(m, a, tok, tok);
    if (other)
        eng_gpt_acts_set_batch(m, other, tok, tok);
    float dloss = 1.0f / (float)BT;

    /* the median of the timed runs: other processes on the machine make single runs noisy */
    for (int it = 0; it < warmup + iters; it++) {
        bool timed = it >= warmup;
        for (int b = 0; b < nc; b++) {
            be->synchronize();
            double t0 = now_ms();
            eng_gpt_block_forward(m, a, b, true);
            be->synchronize();
            if (timed)
                ft[it - warmup][b] = now_ms() - t0;
        }
        /* with recompute, another microbatch's forward in between (as in a pipeline) leaves the
         * workspace to someone else, so every backward recomputes */
        for (int b = 0; other && b < nc; b++)
            eng_gpt_block_forward(m, other, b, true);
        /* backward last to first (the head turns probs into dlogits, so one backward per forward) */
        for (int b = nc - 1; b >= 0; b--) {
            be->synchronize();
            double t0 = now_ms();
            eng_gpt_block_backward(m, a, b, b == nc - 1 ? NULL : dout, din, dloss);
            be->synchronize();
            if (timed)
                bt[it - warmup][b] = now_ms() - t0;
        }
    }
    double fwd[PROF_COLS], bwd[PROF_COLS];
    for (int b = 0; b < nc; b++) {
        fwd[b] = median_col(ft, iters, b);
        bwd[b] = median_col(bt, iters, b);
    }
    int L = cfg->n_layer, nb = 2 * L + 1 + J;
    for (int b = 0; b < nb; b++) {
        /* the clone's block that stands for block b of the full model */
        int src = b == 0 ? 0 : (b <= 2 * L ? 2 - b % 2 : 3 + (b - 2 * L - 1));
        eng_range_t rg[ENG_MAX_TENSORS];
        int nr = eng_gpt_block_ranges(m, src, rg);
        size_t np = 0;
        for (int i = 0; i < nr; i++)
            np += rg[i].n;
        out[b] = (pipe_block_profile_t){
            .fwd_ms = fwd[src],
            .bwd_ms = bwd[src],
            .param_bytes = np * sizeof(float),
            .opt_bytes = 2 * np * sizeof(float),
            .act_bytes_per_mb = pipe_gpt_act_bytes(cfg, J, b, B, T, recompute),
        };
    }
    if (overhead_bytes) {
        /* backward scratch (eng_gpt_create) + received gradient + input boundary + sent gradient,
         * and with recompute the workspace of one block's activations and the head's logits */
        size_t NH = cfg->n_head, Vp = cfg->padded_vocab_size;
        size_t scratch = 2 * nbf + BT * C + BT * 3 * C + BT * 4 * C + (size_t)B * NH * T * T;
        size_t work = recompute ? 3 * BT * C + 4 * BT + BT * 3 * C + (size_t)B * NH * T * T +
                                      2 * BT * 4 * C + BT * Vp
                                : 0;
        *overhead_bytes = (scratch + 3 * nbf + work) * sizeof(float);
    }
    rc = 0;
fail:
    free(ft);
    free(bt);
    free(tok);
    if (be && dout)
        be->free(dout);
    if (be && din)
        be->free(din);
    if (m) {
        eng_gpt_acts_destroy(m, a);
        eng_gpt_acts_destroy(m, other);
        eng_gpt_destroy(m);
    }
    return rc;
}
