/* gpt.c - the GPT-2 model as a sequence of blocks over flat buffers: memory planning (parameter
 * tensors in llm.c's order, activations per microbatch, backward scratch), initialisation, and
 * per-block forward/backward written against the backend op table.
 * It does not own optimizer state, data or the training loop (train.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

static const char *const gpt_names[ENG_GPT_NTENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};
static const bool gpt_decay[ENG_GPT_NTENSORS] = {
    true, true, false, false, true, false, true, false,
    false, false, true, false, true, false, false, false};

static void gpt_sizes(const eng_gpt_config_t *c, size_t s[ENG_GPT_NTENSORS])
{
    size_t Vp = c->padded_vocab_size, T = c->max_seq_len, L = c->n_layer, C = c->n_embd;
    s[0] = Vp * C;       s[1] = T * C;
    s[2] = L * C;        s[3] = L * C;
    s[4] = L * 3 * C * C; s[5] = L * 3 * C;
    s[6] = L * C * C;    s[7] = L * C;
    s[8] = L * C;        s[9] = L * C;
    s[10] = L * 4 * C * C; s[11] = L * 4 * C;
    s[12] = L * C * 4 * C; s[13] = L * C;
    s[14] = C;           s[15] = C;
}

size_t eng_gpt_num_params(const eng_gpt_config_t *cfg)
{
    size_t s[ENG_GPT_NTENSORS], n = 0;
    gpt_sizes(cfg, s);
    for (int i = 0; i < ENG_GPT_NTENSORS; i++) n += s[i];
    return n;
}

double eng_gpt_flops_per_token(const eng_gpt_config_t *c)
{
    /* N counts the real (unpadded) vocabulary rows of wte and excludes wpe (no matmul). */
    double n = (double)eng_gpt_num_params(c) - (double)c->max_seq_len * c->n_embd -
               (double)(c->padded_vocab_size - c->vocab_size) * c->n_embd;
    return 6.0 * n + 6.0 * c->n_layer * c->n_embd * (double)c->max_seq_len;
}

static void map_weights(eng_gpt_weights_t *w, float *base, const size_t s[ENG_GPT_NTENSORS])
{
    float **ptrs[ENG_GPT_NTENSORS] = {&w->wte, &w->wpe, &w->ln1w, &w->ln1b, &w->qkvw, &w->qkvb,
                                      &w->attprojw, &w->attprojb, &w->ln2w, &w->ln2b, &w->fcw,
                                      &w->fcb, &w->fcprojw, &w->fcprojb, &w->lnfw, &w->lnfb};
    for (int i = 0; i < ENG_GPT_NTENSORS; i++) {
        *ptrs[i] = base;
        base += s[i];
    }
}

int eng_gpt_create(const eng_gpt_config_t *cfg, const eng_backend_t *be, int B, eng_gpt_t **out,
                   kiln_err_t *err)
{
    eng_gpt_t *m = NULL;
    *out = NULL;
    if (cfg->n_layer < 1 || cfg->n_head < 1 || cfg->n_embd < 1 || cfg->max_seq_len < 1 ||
        cfg->vocab_size < 1 || cfg->padded_vocab_size < cfg->vocab_size || B < 1)
        return kiln_err_set(err, KILN_EINVAL, "model", "invalid gpt configuration");
    if (cfg->n_embd % cfg->n_head != 0)
        return kiln_err_set(err, KILN_EINVAL, "model.n_head", "n_head (%d) must divide n_embd (%d)",
                            cfg->n_head, cfg->n_embd);
    m = calloc(1, sizeof(*m));
    if (!m) goto nomem;
    m->cfg = *cfg;
    m->be = be;
    size_t s[ENG_GPT_NTENSORS], off = 0;
    gpt_sizes(cfg, s);
    for (int i = 0; i < ENG_GPT_NTENSORS; i++) {
        m->p.tensors[i] = (eng_tensor_t){gpt_names[i], off, s[i], gpt_decay[i]};
        off += s[i];
    }
    m->p.n_tensors = ENG_GPT_NTENSORS;
    m->p.n = off;
    m->p.params = be->alloc(off * sizeof(float));
    m->p.grads = be->alloc(off * sizeof(float));
    if (!m->p.params || !m->p.grads) goto nomem;
    map_weights(&m->w, m->p.params, s);
    map_weights(&m->g, m->p.grads, s);

    m->head_blocks = 1;
    size_t T = cfg->max_seq_len, C = cfg->n_embd, NH = cfg->n_head, BT = (size_t)B * T;
    size_t nbd = eng_gpt_max_boundary_floats(m, B, (int)T);
    size_t ns = 2 * nbd + BT * C + BT * 3 * C + BT * 4 * C + (size_t)B * NH * T * T;
    m->scratch = be->alloc(ns * sizeof(float));
    if (!m->scratch) goto nomem;
    m->scratch_B = B;
    m->scratch_T = (int)T;
    float *p = m->scratch;
    m->d_a = p; p += nbd;
    m->d_b = p; p += nbd;
    m->d_bt = p; p += BT * C;
    m->d_qkv = p; p += BT * 3 * C;
    m->d_fch = p; p += BT * 4 * C;
    m->d_att = p;
    *out = m;
    return KILN_OK;
nomem:
    eng_gpt_destroy(m);
    return kiln_err_set(err, KILN_ENOMEM, NULL, "could not allocate gpt parameters (%zu floats)",
                        eng_gpt_num_params(cfg));
}

void eng_gpt_destroy(eng_gpt_t *m)
{
    if (!m) return;
    if (m->be) {
        m->be->free(m->p.params);
        m->be->free(m->p.grads);
        m->be->free(m->scratch);
    }
    free(m);
}

void eng_gpt_init_weights(eng_gpt_t *m, uint64_t seed)
{
    const eng_gpt_config_t *c = &m->cfg;
    size_t n = m->p.n;
    float *h = malloc(n * sizeof(float));
    if (!h) return;
    eng_rng_t r;
    eng_rng_seed(&r, seed);
    double resid_std = 0.02 / sqrt(2.0 * c->n_layer);
    for (int i = 0; i < m->p.n_tensors; i++) {
        const eng_tensor_t *t = &m->p.tensors[i];
        float *dst = h + t->off;
        const char *nm = t->name;
        if (!strcmp(nm, "ln1w") || !strcmp(nm, "ln2w") || !strcmp(nm, "lnfw")) {
            for (size_t j = 0; j < t->n; j++) dst[j] = 1.0f;
        } else if (t->decay) {
            double sd = (!strcmp(nm, "attprojw") || !strcmp(nm, "fcprojw")) ? resid_std : 0.02;
            for (size_t j = 0; j < t->n; j++) dst[j] = (float)(sd * eng_rng_normal(&r));
            if (!strcmp(nm, "wte"))
                memset(dst + (size_t)c->vocab_size * c->n_embd, 0,
                       sizeof(float) * (size_t)(c->padded_vocab_size - c->vocab_size) * c->n_embd);
        } else {
            memset(dst, 0, t->n * sizeof(float));
        }
    }
    m->be->to_device(m->p.params, h, n * sizeof(float));
    free(h);
}

/* ---- activations ------------------------------------------------------------------------------ */

int eng_gpt_acts_create(const eng_gpt_t *m, int B, int T, eng_gpt_acts_t **out, kiln_err_t *err)
{
    const eng_gpt_config_t *c = &m->cfg;
    eng_gpt_acts_t *a = NULL;
    *out = NULL;
    if (T < 1 || T > c->max_seq_len || B < 1)
        return kiln_err_set(err, KILN_EINVAL, NULL, "bad activation shape B=%d T=%d", B, T);
    a = calloc(1, sizeof(*a));
    if (!a) goto nomem;
    a->B = B;
    a->T = T;
    size_t L = c->n_layer, C = c->n_embd, NH = c->n_head, BT = (size_t)B * T,
           Vp = c->padded_vocab_size;
    /* plan: ints first (as floats' worth of space), then floats */
    size_t sizes[] = {
        BT, BT,                                   /* tokens, targets (int32) */
        (L + 1) * BT * C,                         /* resid */
        L * BT * C, L * BT, L * BT,               /* ln1, mean, rstd */
        L * BT * 3 * C,                           /* qkv */
        L * B * NH * T * T,                       /* att */
        L * BT * C, L * BT * C,                   /* atty, resid2 */
        L * BT * C, L * BT, L * BT,               /* ln2, mean, rstd */
        L * BT * 4 * C, L * BT * 4 * C,           /* fch, fch_gelu */
        BT * C + 4 * BT, BT, BT,                  /* lnf with the head's stats, mean, rstd */
        BT * Vp, BT,                              /* probs, losses */
    };
    size_t total = 0;
    for (size_t i = 0; i < KILN_ARRAY_LEN(sizes); i++) total += (sizes[i] + 15) / 16 * 16;
    a->slab = m->be->alloc(total * sizeof(float));
    a->host_losses = malloc(BT * sizeof(float));
    if (!a->slab || !a->host_losses) goto nomem;
    a->bytes = total * sizeof(float);
    float *p = a->slab;
    float **dst[] = {(float **)&a->tokens, (float **)&a->targets, &a->resid, &a->ln1,
                     &a->ln1_mean, &a->ln1_rstd, &a->qkv, &a->att, &a->atty, &a->resid2,
                     &a->ln2, &a->ln2_mean, &a->ln2_rstd, &a->fch, &a->fch_gelu, &a->lnf,
                     &a->lnf_mean, &a->lnf_rstd, &a->probs, &a->losses};
    for (size_t i = 0; i < KILN_ARRAY_LEN(sizes); i++) {
        *dst[i] = p;
        p += (sizes[i] + 15) / 16 * 16;
    }
    a->hstats = a->lnf + BT * C;
    *out = a;
    return KILN_OK;
nomem:
    eng_gpt_acts_destroy(m, a);
    return kiln_err_set(err, KILN_ENOMEM, NULL, "could not allocate activations for B=%d T=%d", B,
                        T);
}

void eng_gpt_acts_destroy(const eng_gpt_t *m, eng_gpt_acts_t *a)
{
    if (!a) return;
    m->be->free(a->slab);
    free(a->host_losses);
    free(a);
}

void eng_gpt_acts_set_batch(const eng_gpt_t *m, eng_gpt_acts_t *a, const int32_t *tokens,
                            const int32_t *targets)
{
    size_t BT = (size_t)a->B * a->T;
    m->be->to_device(a->tokens, tokens, BT * sizeof(int32_t));
    if (targets) m->be->to_device(a->targets, targets, BT * sizeof(int32_t));
}

/* ---- blocks ----------------------------------------------------------------------------------- */

typedef enum { BK_EMBED, BK_ATTN, BK_MLP, BK_HEAD } block_kind_t;

/* Kind of block b and its layer (attention / MLP halves) or head slice. */
static block_kind_t block_kind(const eng_gpt_t *m, int b, int *idx)
{
    int L = m->cfg.n_layer;
    if (b <= 0) {
        *idx = 0;
        return BK_EMBED;
    }
    if (b <= 2 * L) {
        *idx = (b - 1) / 2;
        return (b - 1) % 2 ? BK_MLP : BK_ATTN;
    }
    *idx = b - (2 * L + 1);
    return BK_HEAD;
}

int eng_gpt_num_blocks(const eng_gpt_t *m) { return 2 * m->cfg.n_layer + 1 + m->head_blocks; }
int eng_gpt_head_first(const eng_gpt_t *m) { return 2 * m->cfg.n_layer + 1; }

int eng_gpt_set_head_blocks(eng_gpt_t *m, int J, kiln_err_t *err)
{
    if (J < 1 || J > m->cfg.padded_vocab_size)
        return kiln_err_set(err, KILN_EINVAL, NULL, "head blocks must be 1..%d, not %d",
                            m->cfg.padded_vocab_size, J);
    if (J > 1 && (!m->be->xent_chunk_forward || !m->be->xent_chunk_finish ||
                  !m->be->xent_chunk_backward))
        return kiln_err_set(err, KILN_EUNSUPP, NULL,
                            "the %s backend cannot split the GPT head over several blocks",
                            m->be->name);
    m->head_blocks = J;
    return KILN_OK;
}

void eng_gpt_head_rows(const eng_gpt_t *m, int j, int *r0, int *r1)
{
    long Vp = m->cfg.padded_vocab_size, J = m->head_blocks;
    *r0 = (int)(Vp * j / J);
    *r1 = (int)(Vp * (j + 1) / J);
}

size_t eng_gpt_max_boundary_floats(const eng_gpt_t *m, int B, int T)
{
    size_t BT = (size_t)B * T;
    return BT * m->cfg.n_embd + 4 * BT;
}

size_t eng_gpt_boundary_floats(const eng_gpt_t *m, int B, int T, int i)
{
    size_t BT = (size_t)B * T;
    return BT * m->cfg.n_embd + (i >= eng_gpt_head_first(m) ? 4 * BT : 0);
}

size_t eng_gpt_grad_floats(const eng_gpt_t *m, int B, int T, int i)
{
    size_t BT = (size_t)B * T;
    return BT * m->cfg.n_embd + (i >= eng_gpt_head_first(m) ? BT : 0);
}

float *eng_gpt_boundary(const eng_gpt_t *m, eng_gpt_acts_t *a, int i)
{
    size_t BTC = (size_t)a->B * a->T * m->cfg.n_embd;
    int l;
    switch (block_kind(m, i, &l)) {
    case BK_EMBED: return a->resid;
    case BK_ATTN: return a->resid2 + (size_t)l * BTC;
    case BK_MLP: return a->resid + (size_t)(l + 1) * BTC;
    case BK_HEAD: break;
    }
    return a->lnf;
}

/* Final LayerNorm, the tied LM head over the whole vocabulary and the fused softmax
 * cross-entropy: the single-slice head, and what whole-model passes always use. */
static void head_forward(eng_gpt_t *m, eng_gpt_acts_t *a, bool has_targets)
{
    const eng_backend_t *be = m->be;
    const eng_gpt_config_t *c = &m->cfg;
    int BT = a->B * a->T, C = c->n_embd;
    const float *x = a->resid + (size_t)c->n_layer * BT * C;
    be->layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, x, m->w.lnfw, m->w.lnfb, BT, C);
    be->matmul_forward(a->probs, a->lnf, m->w.wte, NULL, BT, C, c->padded_vocab_size);
    be->xent_forward(a->probs, a->losses, a->probs, has_targets ? a->targets : NULL, BT,
                     c->vocab_size, c->padded_vocab_size);
}

static void head_backward(eng_gpt_t *m, eng_gpt_acts_t *a, float *din, float dloss)
{
    const eng_backend_t *be = m->be;
    const eng_gpt_config_t *c = &m->cfg;
    int BT = a->B * a->T, C = c->n_embd, Vp = c->padded_vocab_size;
    const float *x = a->resid + (size_t)c->n_layer * BT * C;
    be->xent_backward(a->probs, a->probs, a->targets, dloss, BT, c->vocab_size, Vp);
    /* dlnf = dlogits @ wte; dwte += dlogits^T @ lnf */
    be->matmul_backward(m->d_bt, m->g.wte, NULL, a->probs, a->lnf, m->w.wte, BT, C, Vp);
    be->memset_zero(din, (size_t)BT * C * sizeof(float));
    be->layernorm_backward(din, m->g.lnfw, m->g.lnfb, m->d_bt, x, m->w.lnfw, a->lnf_mean,
                           a->lnf_rstd, BT, C);
}

/* Head slice j of J > 1: logits of vocabulary rows [r0, r1) of wte, folded into the running
 * softmax statistics that travel with lnf (slice 0 computes lnf first; the last slice turns the
 * statistics into the loss). The slice's logits stay in a->probs at offset BT * r0. */
static void head_slice_forward(eng_gpt_t *m, eng_gpt_acts_t *a, int j, bool has_targets)
{
    const eng_backend_t *be = m->be;
    const eng_gpt_config_t *c = &m->cfg;
    int BT = a->B * a->T, C = c->n_embd, r0, r1;
    eng_gpt_head_rows(m, j, &r0, &r1);
    float *logits = a->probs + (size_t)BT * r0;
    if (j == 0)
        be->layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd,
                              a->resid + (size_t)c->n_layer * BT * C, m->w.lnfw, m->w.lnfb, BT, C);
    be->matmul_forward(logits, a->lnf, m->w.wte + (size_t)r0 * C, NULL, BT, C, r1 - r0);
    be->xent_chunk_forward(a->hstats, logits, has_targets ? a->targets : NULL, BT, r0, r1 - r0,
                           c->vocab_size, j == 0);
    if (j == m->head_blocks - 1) be->xent_chunk_finish(has_targets ? a->losses : NULL, a->hstats, BT);
}

/* Backward of slice j. The gradient that flows between slices is (dlnf (B,T,C), lse (B,T)):
 * the last slice starts it from its own statistics, each slice adds dlogits @ wte[r0:r1], and
 * slice 0 takes it through the final LayerNorm. */
static void head_slice_backward(eng_gpt_t *m, eng_gpt_acts_t *a, int j, const float *dout,
                                float *din, float dloss)
{
    const eng_backend_t *be = m->be;
    const eng_gpt_config_t *c = &m->cfg;
    int BT = a->B * a->T, C = c->n_embd, J = m->head_blocks, r0, r1;
    size_t BTC = (size_t)BT * C;
    eng_gpt_head_rows(m, j, &r0, &r1);
    float *logits = a->probs + (size_t)BT * r0;
    const float *lse = j == J - 1 ? a->hstats + 3 * (size_t)BT : dout + BTC;
    be->xent_chunk_backward(logits, logits, lse, a->targets, dloss, BT, r0, r1 - r0,
                            c->vocab_size);
    float *dl = j == 0 ? m->d_bt : din;
    be->matmul_backward(dl, m->g.wte + (size_t)r0 * C, NULL, logits, a->lnf,
                        m->w.wte + (size_t)r0 * C, BT, C, r1 - r0);
    if (j < J - 1) be->residual_forward(dl, dl, dout, BTC);
    if (j > 0) {
        be->copy(din + BTC, lse, (size_t)BT * sizeof(float));
        return;
    }
    be->memset_zero(din, BTC * sizeof(float));
    be->layernorm_backward(din, m->g.lnfw, m->g.lnfb, m->d_bt,
                           a->resid + (size_t)c->n_layer * BTC, m->w.lnfw, a->lnf_mean,
                           a->lnf_rstd, BT, C);
}

void eng_gpt_block_forward(eng_gpt_t *m, eng_gpt_acts_t *a, int block, bool has_targets)
{
    const eng_backend_t *be = m->be;
    const eng_gpt_config_t *c = &m->cfg;
    int B = a->B, T = a->T, C = c->n_embd, NH = c->n_head, l;
    size_t BT = (size_t)B * T;
    const eng_gpt_weights_t *w = &m->w;
    switch (block_kind(m, block, &l)) {
    case BK_EMBED:
        be->encoder_forward(a->resid, a->tokens, w->wte, w->wpe, B, T, C);
        return;
    case BK_HEAD:
        if (m->head_blocks == 1)
            head_forward(m, a, has_targets);
        else
            head_slice_forward(m, a, l, has_targets);
        return;
    case BK_ATTN: {
        /* res2 = x + attproj(attention(qkv(ln1(x)))) */
        const float *x = a->resid + l * BT * C;
        float *ln1 = a->ln1 + l * BT * C, *ln1m = a->ln1_mean + l * BT, *ln1r = a->ln1_rstd + l * BT;
        float *qkv = a->qkv + l * BT * 3 * C, *att = a->att + (size_t)l * B * NH * T * T;
        float *atty = a->atty + l * BT * C, *res2 = a->resid2 + l * BT * C;
        be->layernorm_forward(ln1, ln1m, ln1r, x, w->ln1w + l * C, w->ln1b + l * C, (int)BT, C);
        be->matmul_forward(qkv, ln1, w->qkvw + (size_t)l * 3 * C * C, w->qkvb + l * 3 * C, (int)BT,
                           C, 3 * C);
        be->attention_forward(atty, att, qkv, B, T, C, NH);
        be->matmul_forward(res2, atty, w->attprojw + (size_t)l * C * C, w->attprojb + l * C,
                           (int)BT, C, C);
        be->residual_forward(res2, res2, x, BT * C);
        return;
    }
    case BK_MLP: {
        /* y = res2 + fcproj(gelu(fc(ln2(res2)))) */
        const float *res2 = a->resid2 + l * BT * C;
        float *y = a->resid + (l + 1) * BT * C;
        float *ln2 = a->ln2 + l * BT * C, *ln2m = a->ln2_mean + l * BT, *ln2r = a->ln2_rstd + l * BT;
        float *fch = a->fch + l * BT * 4 * C, *fchg = a->fch_gelu + l * BT * 4 * C;
        be->layernorm_forward(ln2, ln2m, ln2r, res2, w->ln2w + l * C, w->ln2b + l * C, (int)BT, C);
        be->matmul_forward(fch, ln2, w->fcw + (size_t)l * 4 * C * C, w->fcb + l * 4 * C, (int)BT, C,
                           4 * C);
        be->gelu_forward(fchg, fch, BT * 4 * C);
        be->matmul_forward(y, fchg, w->fcprojw + (size_t)l * C * 4 * C, w->fcprojb + l * C,
                           (int)BT, 4 * C, C);
        be->residual_forward(y, y, res2, BT * C);
        return;
    }
    }
}

void eng_gpt_block_backward(eng_gpt_t *m, eng_gpt_acts_t *a, int block, const float *dout,
                            float *din, float dloss)
{
    const eng_backend_t *be = m->be;
    const eng_gpt_config_t *c = &m->cfg;
    int B = a->B, T = a->T, C = c->n_embd, NH = c->n_head, l;
    size_t BT = (size_t)B * T;
    const eng_gpt_weights_t *w = &m->w;
    eng_gpt_weights_t *g = &m->g;
    switch (block_kind(m, block, &l)) {
    case BK_EMBED:
        be->encoder_backward(g->wte, g->wpe, dout, a->tokens, B, T, C);
        return;
    case BK_HEAD:
        if (m->head_blocks == 1)
            head_backward(m, a, din, dloss);
        else
            head_slice_backward(m, a, l, dout, din, dloss);
        return;
    case BK_ATTN: {
        const float *x = a->resid + l * BT * C;
        float *ln1 = a->ln1 + l * BT * C, *ln1m = a->ln1_mean + l * BT, *ln1r = a->ln1_rstd + l * BT;
        float *qkv = a->qkv + l * BT * 3 * C, *att = a->att + (size_t)l * B * NH * T * T;
        float *atty = a->atty + l * BT * C;
        be->copy(din, dout, BT * C * sizeof(float));
        be->matmul_backward(m->d_bt, g->attprojw + (size_t)l * C * C, g->attprojb + l * C, dout,
                            atty, w->attprojw + (size_t)l * C * C, (int)BT, C, C);
        be->attention_backward(m->d_qkv, m->d_att, m->d_bt, qkv, att, B, T, C, NH);
        be->matmul_backward(m->d_bt, g->qkvw + (size_t)l * 3 * C * C, g->qkvb + l * 3 * C,
                            m->d_qkv, ln1, w->qkvw + (size_t)l * 3 * C * C, (int)BT, C, 3 * C);
        be->layernorm_backward(din, g->ln1w + l * C, g->ln1b + l * C, m->d_bt, x, w->ln1w + l * C,
                               ln1m, ln1r, (int)BT, C);
        return;
    }
    case BK_MLP: {
        const float *res2 = a->resid2 + l * BT * C;
        float *ln2 = a->ln2 + l * BT * C, *ln2m = a->ln2_mean + l * BT, *ln2r = a->ln2_rstd + l * BT;
        float *fch = a->fch + l * BT * 4 * C, *fchg = a->fch_gelu + l * BT * 4 * C;
        be->copy(din, dout, BT * C * sizeof(float));
        be->matmul_backward(m->d_fch, g->fcprojw + (size_t)l * C * 4 * C, g->fcprojb + l * C, dout,
                            fchg, w->fcprojw + (size_t)l * C * 4 * C, (int)BT, 4 * C, C);
        be->gelu_backward(m->d_fch, fch, m->d_fch, BT * 4 * C);
        be->matmul_backward(m->d_bt, g->fcw + (size_t)l * 4 * C * C, g->fcb + l * 4 * C, m->d_fch,
                            ln2, w->fcw + (size_t)l * 4 * C * C, (int)BT, C, 4 * C);
        be->layernorm_backward(din, g->ln2w + l * C, g->ln2b + l * C, m->d_bt, res2,
                               w->ln2w + l * C, ln2m, ln2r, (int)BT, C);
        return;
    }
    }
}

int eng_gpt_block_ranges(const eng_gpt_t *m, int block, eng_range_t *out)
{
    const eng_tensor_t *t = m->p.tensors;
    int L = m->cfg.n_layer, C = m->cfg.n_embd, n = 0, l;
    if (block < 0 || block >= eng_gpt_num_blocks(m)) return 0;
    block_kind_t kind = block_kind(m, block, &l);
    switch (kind) {
    case BK_EMBED:
        out[n++] = (eng_range_t){t[0].off, t[0].n};
        out[n++] = (eng_range_t){t[1].off, t[1].n};
        break;
    case BK_ATTN:
    case BK_MLP: {
        int lo = kind == BK_ATTN ? 2 : 8; /* ln1w..attprojb or ln2w..fcprojb */
        for (int i = lo; i < lo + 6; i++) {
            size_t per = t[i].n / L;
            out[n++] = (eng_range_t){t[i].off + (size_t)l * per, per};
        }
        break;
    }
    case BK_HEAD: {
        int r0, r1;
        eng_gpt_head_rows(m, l, &r0, &r1);
        if (l == 0) {
            out[n++] = (eng_range_t){t[14].off, t[14].n};
            out[n++] = (eng_range_t){t[15].off, t[15].n};
        }
        out[n++] = (eng_range_t){t[0].off + (size_t)r0 * C, (size_t)(r1 - r0) * C};
        break;
    }
    }
    return n;
}

float eng_gpt_forward(eng_gpt_t *m, eng_gpt_acts_t *a, bool has_targets)
{
    int hf = eng_gpt_head_first(m);
    for (int b = 0; b < hf; b++) eng_gpt_block_forward(m, a, b, has_targets);
    head_forward(m, a, has_targets);
    if (!has_targets) return 0.0f;
    size_t BT = (size_t)a->B * a->T;
    m->be->to_host(a->host_losses, a->losses, BT * sizeof(float));
    double s = 0;
    for (size_t i = 0; i < BT; i++) s += a->host_losses[i];
    return (float)(s / (double)BT);
}

void eng_gpt_backward(eng_gpt_t *m, eng_gpt_acts_t *a, float dloss, eng_grads_ready_fn ready,
                      void *ctx)
{
    int nb = eng_gpt_num_blocks(m), hf = eng_gpt_head_first(m);
    float *dout = m->d_a, *din = m->d_b;
    head_backward(m, a, dout, dloss);
    for (int b = nb - 1; ready && b >= hf; b--) ready(ctx, b);
    for (int b = hf - 1; b >= 0; b--) {
        eng_gpt_block_backward(m, a, b, dout, din, dloss);
        if (ready) ready(ctx, b);
        float *t = dout;
        dout = din;
        din = t;
    }
}
