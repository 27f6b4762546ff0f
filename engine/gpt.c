/* gpt.c - the GPT-2 model as a sequence of blocks over flat buffers: memory planning (parameter
 * tensors in llm.c's order, activations per microbatch, backward scratch), initialisation, and
 * per-block forward/backward written against the backend op table.
 * It does not own optimizer state, data or the training loop (train.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "spec/spec.h"

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
        m->be->free(m->work);
        m->be->free(m->wbf);
        m->be->free(m->xbf);
        m->be->free(m->dbf);
    }
    free(m);
}

uint64_t eng_gpt_config_hash(const eng_gpt_config_t *c)
{
    uint64_t h = 1469598103934665603ULL;
    int cf[6] = {c->max_seq_len, c->vocab_size, c->padded_vocab_size, c->n_layer, c->n_head,
                 c->n_embd};
    for (int i = 0; i < 6; i++) h ^= (uint64_t)cf[i] + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
}

static int cmp_range_off(const void *a, const void *b)
{
    const eng_range_t *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

int eng_gpt_init_weights_ranges(eng_gpt_t *m, uint64_t seed, const eng_range_t *ranges, int n,
                                kiln_err_t *err)
{
    const eng_gpt_config_t *c = &m->cfg;
    const eng_params_t *P = &m->p;
    eng_range_t *r = NULL;
    float *buf = NULL;
    int rc = KILN_OK;
    size_t maxn = 1;
    r = malloc(sizeof(*r) * (size_t)(n > 0 ? n : 1));
    if (!r) goto nomem;
    memcpy(r, ranges, sizeof(*r) * (size_t)n);
    qsort(r, (size_t)n, sizeof(*r), cmp_range_off);
    for (int i = 0; i < n; i++) maxn = r[i].n > maxn ? r[i].n : maxn;
    buf = malloc(sizeof(float) * maxn);
    if (!buf) goto nomem;
    eng_rng_t rng;
    eng_rng_seed(&rng, seed);
    double resid_std = 0.02 / sqrt(2.0 * c->n_layer);
    size_t wte_real = (size_t)c->vocab_size * c->n_embd; /* wte rows past V stay 0 */
    for (int k = 0; k < P->n_tensors; k++) {
        const eng_tensor_t *t = &P->tensors[k];
        const char *nm = t->name;
        bool ones = !strcmp(nm, "ln1w") || !strcmp(nm, "ln2w") || !strcmp(nm, "lnfw");
        bool normal = !ones && t->decay;
        double sd = (!strcmp(nm, "attprojw") || !strcmp(nm, "fcprojw")) ? resid_std : 0.02;
        size_t pos = t->off, end = t->off + t->n; /* next element whose value is drawn */
        for (int i = 0; i < n; i++) {
            size_t a = r[i].off > t->off ? r[i].off : t->off;
            size_t b = r[i].off + r[i].n < end ? r[i].off + r[i].n : end;
            if (a >= b) continue;
            if (normal) {
                for (; pos < a; pos++) eng_rng_normal(&rng); /* values of other ranks' ranges */
                for (size_t j = a; j < b; j++, pos++) {
                    float x = (float)(sd * eng_rng_normal(&rng));
                    buf[j - a] = k == 0 && j - t->off >= wte_real ? 0.0f : x;
                }
            } else {
                for (size_t j = a; j < b; j++) buf[j - a] = ones ? 1.0f : 0.0f;
            }
            m->be->to_device(P->params + a, buf, (b - a) * sizeof(float));
        }
        if (normal) /* the rest of this tensor's draws come before the next tensor's */
            for (; pos < end; pos++) eng_rng_normal(&rng);
    }
    goto done;
nomem:
    rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory while initialising parameters");
done:
    free(r);
    free(buf);
    return rc;
}

void eng_gpt_init_weights(eng_gpt_t *m, uint64_t seed)
{
    eng_range_t all = {0, m->p.n};
    kiln_err_t err;
    if (eng_gpt_init_weights_ranges(m, seed, &all, 1, &err))
        log_error("gpt: %s", err.message);
}

/* ---- activation checkpointing and bf16 ------------------------------------------------------- */

/* Floats of one block's activations that a recomputing model keeps in its workspace, for
 * microbatches of B x T: ln1 with mean and rstd, qkv, att, atty; ln2 with mean and rstd, fch,
 * fch_gelu; and the head's logits. */
static void work_sizes(const eng_gpt_config_t *c, size_t B, size_t T, size_t s[12])
{
    size_t C = c->n_embd, NH = c->n_head, BT = B * T;
    s[0] = BT * C; s[1] = BT; s[2] = BT; s[3] = BT * 3 * C; s[4] = B * NH * T * T; s[5] = BT * C;
    s[6] = BT * C; s[7] = BT; s[8] = BT; s[9] = BT * 4 * C; s[10] = BT * 4 * C;
    s[11] = BT * (size_t)c->padded_vocab_size;
}

int eng_gpt_set_recompute(eng_gpt_t *m, bool on, kiln_err_t *err)
{
    m->be->free(m->work);
    m->work = NULL;
    m->recompute = on;
    if (!on) return KILN_OK;
    size_t s[12], total = 0;
    work_sizes(&m->cfg, (size_t)m->scratch_B, (size_t)m->scratch_T, s);
    for (int i = 0; i < 12; i++) total += (s[i] + 15) / 16 * 16;
    m->work = m->be->alloc(total * sizeof(float));
    m->work_bytes = total * sizeof(float);
    if (!m->work) {
        m->recompute = false;
        return kiln_err_set(err, KILN_ENOMEM, NULL, "could not allocate the recompute workspace");
    }
    return KILN_OK;
}

int eng_gpt_set_bf16(eng_gpt_t *m, bool on, kiln_err_t *err)
{
    const eng_backend_t *be = m->be;
    int rc;
    be->free(m->wbf);
    be->free(m->xbf);
    be->free(m->dbf);
    m->wbf = m->xbf = m->dbf = NULL;
    m->bf16 = false;
    if (!on) return KILN_OK;
    if (!be->bf16) /* the capability table's refusal, the same as at submission */
        return spec_cap_refuse(SPEC_CAP_BF16, "gpt", be->name, err);
    if ((rc = be->bf16->available(err))) return rc;
    size_t BT = (size_t)m->scratch_B * m->scratch_T, C = m->cfg.n_embd;
    size_t Vp = m->cfg.padded_vocab_size, dmax = 4 * C > Vp ? 4 * C : Vp;
    m->wbf = be->alloc(m->p.n * sizeof(uint16_t));
    m->xbf = be->alloc(BT * 4 * C * sizeof(uint16_t));
    m->dbf = be->alloc(BT * dmax * sizeof(uint16_t));
    if (!m->wbf || !m->xbf || !m->dbf) {
        eng_gpt_set_bf16(m, false, NULL);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "could not allocate the bf16 weights");
    }
    m->bf16 = true;
    return KILN_OK;
}

uint16_t *eng_gpt_bf16_weights(eng_gpt_t *m) { return m->bf16 ? m->wbf : NULL; }

void eng_gpt_bf16_refresh(eng_gpt_t *m, size_t off, size_t n)
{
    if (m->bf16) m->be->bf16->from_f32(m->wbf + off, m->p.params + off, n);
}

/* The GEMMs of every block: fp32, or through the bf16 group (the input rounded into xbf, the
 * weight's bf16 copy at the weight's flat offset, the output gradient rounded into dbf). */
static void mm_forward(eng_gpt_t *m, float *out, const float *inp, const float *w,
                       const float *bias, int N, int C, int OC)
{
    if (!m->bf16) {
        m->be->matmul_forward(out, inp, w, bias, N, C, OC);
        return;
    }
    m->be->bf16->from_f32(m->xbf, inp, (size_t)N * C);
    m->be->bf16->matmul_forward(out, m->xbf, m->wbf + (w - m->p.params), bias, N, C, OC);
}

static void mm_backward(eng_gpt_t *m, float *dinp, float *dw, float *dbias, const float *dout,
                        const float *inp, const float *w, int N, int C, int OC)
{
    if (!m->bf16) {
        m->be->matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC);
        return;
    }
    m->be->bf16->from_f32(m->dbf, dout, (size_t)N * OC);
    m->be->bf16->from_f32(m->xbf, inp, (size_t)N * C);
    m->be->bf16->matmul_backward(dinp, dw, dbias, dout, m->dbf, m->xbf, m->wbf + (w - m->p.params),
                                 N, C, OC);
}

static void part_ready(eng_gpt_t *m, int block, int ranges);

/* A projection's backward inside a block, after which the block's first `ranges` ranges are
 * final. When someone waits on them (data parallelism's buckets), the weight and bias gradients
 * are computed first and reported before the input gradient, so that their bucket can leave a
 * GEMM earlier (at 1 Gbit this cut the wait for the last buckets by about a quarter:
 * bench/RESULTS.md). The two GEMMs are independent, so the results are the same bits. Not where
 * the backend computes both at once (matmul_backward_joint): apart, each would be slower. */
static void mm_backward_part(eng_gpt_t *m, int block, int ranges, float *dinp, float *dw, float *dbias,
                             const float *dout, const float *inp, const float *w, int N, int C, int OC)
{
    bool joint = !m->bf16 && m->be->matmul_backward_joint && m->be->matmul_backward_joint();
    if (!m->part_ready || joint) {
        mm_backward(m, dinp, dw, dbias, dout, inp, w, N, C, OC);
        part_ready(m, block, ranges);
        return;
    }
    mm_backward(m, NULL, dw, dbias, dout, inp, w, N, C, OC);
    part_ready(m, block, ranges);
    if (!m->bf16) {
        m->be->matmul_backward(dinp, NULL, NULL, dout, inp, w, N, C, OC);
        return;
    }
    /* m->dbf holds dout in bf16 from the call above */
    m->be->bf16->matmul_backward(dinp, NULL, NULL, dout, m->dbf, m->xbf, m->wbf + (w - m->p.params),
                                 N, C, OC);
}

/* With recompute, the workspace's three regions (an attention half's activations, an MLP
 * half's, the whole head's logits) remember the activation set and block they were last
 * computed for: a backward that comes straight after its forward (the last layer of a
 * single-process step) finds them current and skips the recomputation. */
enum { WORK_ATTN = 0, WORK_MLP = 1, WORK_HEAD = 2 };
static void work_mark(eng_gpt_t *m, int region, const eng_gpt_acts_t *a, int block)
{
    m->work_acts[region] = a;
    m->work_block[region] = block;
}
static bool work_current(const eng_gpt_t *m, int region, const eng_gpt_acts_t *a, int block)
{
    return m->work_acts[region] == a && m->work_block[region] == block;
}

/* ---- activations ------------------------------------------------------------------------------ */

int eng_gpt_acts_create(const eng_gpt_t *m, int B, int T, eng_gpt_acts_t **out, kiln_err_t *err)
{
    const eng_gpt_config_t *c = &m->cfg;
    eng_gpt_acts_t *a = NULL;
    *out = NULL;
    if (T < 1 || T > c->max_seq_len || B < 1 || (m->recompute && B > m->scratch_B))
        return kiln_err_set(err, KILN_EINVAL, NULL, "bad activation shape B=%d T=%d", B, T);
    a = calloc(1, sizeof(*a));
    if (!a) goto nomem;
    a->B = B;
    a->T = T;
    size_t L = c->n_layer, C = c->n_embd, NH = c->n_head, BT = (size_t)B * T,
           Vp = c->padded_vocab_size;
    /* With recompute, a block's activations (all but the boundaries) are one layer's worth in
     * the model's workspace, shared by every activation set: each block recomputes them at the
     * start of its backward. */
    size_t Lk = m->recompute ? 0 : L;
    /* plan: ints first (as floats' worth of space), then floats */
    size_t sizes[] = {
        BT, BT,                                   /* tokens, targets (int32) */
        (L + 1) * BT * C,                         /* resid */
        Lk * BT * C, Lk * BT, Lk * BT,            /* ln1, mean, rstd */
        Lk * BT * 3 * C,                          /* qkv */
        Lk * B * NH * T * T,                      /* att */
        Lk * BT * C, L * BT * C,                  /* atty, resid2 */
        Lk * BT * C, Lk * BT, Lk * BT,            /* ln2, mean, rstd */
        Lk * BT * 4 * C, Lk * BT * 4 * C,         /* fch, fch_gelu */
        BT * C + 4 * BT, BT, BT,                  /* lnf with the head's stats, mean, rstd */
        m->recompute ? 0 : BT * Vp, BT,           /* probs, losses */
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
    if (m->recompute) {
        size_t ws[12];
        work_sizes(c, (size_t)m->scratch_B, (size_t)m->scratch_T, ws);
        float **wd[12] = {&a->ln1, &a->ln1_mean, &a->ln1_rstd, &a->qkv, &a->att, &a->atty,
                          &a->ln2, &a->ln2_mean, &a->ln2_rstd, &a->fch, &a->fch_gelu, &a->probs};
        float *w = m->work;
        for (int i = 0; i < 12; i++) {
            *wd[i] = w;
            w += (ws[i] + 15) / 16 * 16;
        }
    }
    *out = a;
    return KILN_OK;
nomem:
    if (a) { /* never used, so no workspace region remembers it */
        m->be->free(a->slab);
        free(a->host_losses);
        free(a);
    }
    return kiln_err_set(err, KILN_ENOMEM, NULL, "could not allocate activations for B=%d T=%d", B,
                        T);
}

void eng_gpt_acts_destroy(eng_gpt_t *m, eng_gpt_acts_t *a)
{
    if (!a) return;
    for (int i = 0; i < 3; i++)
        if (m->work_acts[i] == a) m->work_acts[i] = NULL;
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
    mm_forward(m, a->probs, a->lnf, m->w.wte, NULL, BT, C, c->padded_vocab_size);
    be->xent_forward(a->probs, a->losses, a->probs, has_targets ? a->targets : NULL, BT,
                     c->vocab_size, c->padded_vocab_size);
    work_mark(m, WORK_HEAD, has_targets ? a : NULL, 2 * c->n_layer + 1);
}

static void head_backward(eng_gpt_t *m, eng_gpt_acts_t *a, float *din, float dloss)
{
    const eng_backend_t *be = m->be;
    const eng_gpt_config_t *c = &m->cfg;
    int BT = a->B * a->T, C = c->n_embd, Vp = c->padded_vocab_size;
    const float *x = a->resid + (size_t)c->n_layer * BT * C;
    if (m->recompute && !work_current(m, WORK_HEAD, a, 2 * c->n_layer + 1)) {
        /* the softmax, from the kept lnf */
        mm_forward(m, a->probs, a->lnf, m->w.wte, NULL, BT, C, Vp);
        be->xent_forward(a->probs, a->losses, a->probs, a->targets, BT, c->vocab_size, Vp);
    }
    be->xent_backward(a->probs, a->probs, a->targets, dloss, BT, c->vocab_size, Vp);
    work_mark(m, WORK_HEAD, NULL, -1); /* the probabilities are now dlogits */
    /* dlnf = dlogits @ wte; dwte += dlogits^T @ lnf */
    mm_backward(m, m->d_bt, m->g.wte, NULL, a->probs, a->lnf, m->w.wte, BT, C, Vp);
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
    mm_forward(m, logits, a->lnf, m->w.wte + (size_t)r0 * C, NULL, BT, C, r1 - r0);
    work_mark(m, WORK_HEAD, NULL, -1); /* the whole head's region now holds a slice */
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
    if (m->recompute) /* the slice's logits, from the kept lnf (its statistics are kept) */
        mm_forward(m, logits, a->lnf, m->w.wte + (size_t)r0 * C, NULL, BT, C, r1 - r0);
    be->xent_chunk_backward(logits, logits, lse, a->targets, dloss, BT, r0, r1 - r0,
                            c->vocab_size);
    float *dl = j == 0 ? m->d_bt : din;
    mm_backward(m, dl, m->g.wte + (size_t)r0 * C, NULL, logits, a->lnf, m->w.wte + (size_t)r0 * C,
                BT, C, r1 - r0);
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

/* Layer l's slice of a per-layer activation: with recompute there is one layer's worth. */
static size_t lw(const eng_gpt_t *m, int l) { return m->recompute ? 0 : (size_t)l; }

/* res2 = x + attproj(attention(qkv(ln1(x)))) for layer l */
static void attn_forward(eng_gpt_t *m, eng_gpt_acts_t *a, int l)
{
    const eng_backend_t *be = m->be;
    const eng_gpt_weights_t *w = &m->w;
    int B = a->B, T = a->T, C = m->cfg.n_embd, NH = m->cfg.n_head;
    size_t BT = (size_t)B * T, k = lw(m, l);
    const float *x = a->resid + l * BT * C;
    float *ln1 = a->ln1 + k * BT * C, *ln1m = a->ln1_mean + k * BT, *ln1r = a->ln1_rstd + k * BT;
    float *qkv = a->qkv + k * BT * 3 * C, *att = a->att + k * B * NH * T * T;
    float *atty = a->atty + k * BT * C, *res2 = a->resid2 + l * BT * C;
    be->layernorm_forward(ln1, ln1m, ln1r, x, w->ln1w + l * C, w->ln1b + l * C, (int)BT, C);
    mm_forward(m, qkv, ln1, w->qkvw + (size_t)l * 3 * C * C, w->qkvb + l * 3 * C, (int)BT, C, 3 * C);
    be->attention_forward(atty, att, qkv, B, T, C, NH);
    mm_forward(m, res2, atty, w->attprojw + (size_t)l * C * C, w->attprojb + l * C, (int)BT, C, C);
    be->residual_forward(res2, res2, x, BT * C);
    work_mark(m, WORK_ATTN, a, 2 * l + 1);
}

/* y = res2 + fcproj(gelu(fc(ln2(res2)))) for layer l */
static void mlp_forward(eng_gpt_t *m, eng_gpt_acts_t *a, int l)
{
    const eng_backend_t *be = m->be;
    const eng_gpt_weights_t *w = &m->w;
    int C = m->cfg.n_embd;
    size_t BT = (size_t)a->B * a->T, k = lw(m, l);
    const float *res2 = a->resid2 + l * BT * C;
    float *y = a->resid + (l + 1) * BT * C;
    float *ln2 = a->ln2 + k * BT * C, *ln2m = a->ln2_mean + k * BT, *ln2r = a->ln2_rstd + k * BT;
    float *fch = a->fch + k * BT * 4 * C, *fchg = a->fch_gelu + k * BT * 4 * C;
    const float *fcw = w->fcw + (size_t)l * 4 * C * C, *fcb = w->fcb + l * 4 * C;
    be->layernorm_forward(ln2, ln2m, ln2r, res2, w->ln2w + l * C, w->ln2b + l * C, (int)BT, C);
    if (!m->bf16 && be->fused && be->fused->matmul_forward_gelu) {
        be->fused->matmul_forward_gelu(fchg, fch, ln2, fcw, fcb, (int)BT, C, 4 * C);
    } else {
        mm_forward(m, fch, ln2, fcw, fcb, (int)BT, C, 4 * C);
        be->gelu_forward(fchg, fch, BT * 4 * C);
    }
    mm_forward(m, y, fchg, w->fcprojw + (size_t)l * C * 4 * C, w->fcprojb + l * C, (int)BT, 4 * C, C);
    be->residual_forward(y, y, res2, BT * C);
    work_mark(m, WORK_MLP, a, 2 * l + 2);
}

void eng_gpt_block_forward(eng_gpt_t *m, eng_gpt_acts_t *a, int block, bool has_targets)
{
    int l;
    switch (block_kind(m, block, &l)) {
    case BK_EMBED:
        m->be->encoder_forward(a->resid, a->tokens, m->w.wte, m->w.wpe, a->B, a->T, m->cfg.n_embd);
        return;
    case BK_HEAD:
        if (m->head_blocks == 1)
            head_forward(m, a, has_targets);
        else
            head_slice_forward(m, a, l, has_targets);
        return;
    case BK_ATTN:
        attn_forward(m, a, l);
        return;
    case BK_MLP:
        mlp_forward(m, a, l);
        return;
    }
}

/* The first `ranges` of block's ranges (eng_gpt_block_ranges order) have final gradients. */
static void part_ready(eng_gpt_t *m, int block, int ranges)
{
    if (m->part_ready) m->part_ready(m->part_ctx, block, ranges);
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
        size_t k = lw(m, l);
        const float *x = a->resid + l * BT * C;
        float *ln1 = a->ln1 + k * BT * C, *ln1m = a->ln1_mean + k * BT, *ln1r = a->ln1_rstd + k * BT;
        float *qkv = a->qkv + k * BT * 3 * C, *att = a->att + k * B * NH * T * T;
        float *atty = a->atty + k * BT * C;
        if (m->recompute && !work_current(m, WORK_ATTN, a, block)) attn_forward(m, a, l);
        be->copy(din, dout, BT * C * sizeof(float));
        mm_backward_part(m, block, 2, m->d_bt, g->attprojw + (size_t)l * C * C, g->attprojb + l * C, dout,
                         atty, w->attprojw + (size_t)l * C * C, (int)BT, C, C);
        be->attention_backward(m->d_qkv, m->d_att, m->d_bt, qkv, att, B, T, C, NH);
        mm_backward_part(m, block, 4, m->d_bt, g->qkvw + (size_t)l * 3 * C * C, g->qkvb + l * 3 * C,
                         m->d_qkv, ln1, w->qkvw + (size_t)l * 3 * C * C, (int)BT, C, 3 * C);
        be->layernorm_backward(din, g->ln1w + l * C, g->ln1b + l * C, m->d_bt, x, w->ln1w + l * C,
                               ln1m, ln1r, (int)BT, C);
        return;
    }
    case BK_MLP: {
        size_t k = lw(m, l);
        const float *res2 = a->resid2 + l * BT * C;
        float *ln2 = a->ln2 + k * BT * C, *ln2m = a->ln2_mean + k * BT, *ln2r = a->ln2_rstd + k * BT;
        float *fch = a->fch + k * BT * 4 * C, *fchg = a->fch_gelu + k * BT * 4 * C;
        if (m->recompute && !work_current(m, WORK_MLP, a, block)) mlp_forward(m, a, l);
        be->copy(din, dout, BT * C * sizeof(float));
        mm_backward_part(m, block, 2, m->d_fch, g->fcprojw + (size_t)l * C * 4 * C, g->fcprojb + l * C,
                         dout, fchg, w->fcprojw + (size_t)l * C * 4 * C, (int)BT, 4 * C, C);
        be->gelu_backward(m->d_fch, fch, m->d_fch, BT * 4 * C);
        mm_backward_part(m, block, 4, m->d_bt, g->fcw + (size_t)l * 4 * C * C, g->fcb + l * 4 * C,
                         m->d_fch, ln2, w->fcw + (size_t)l * 4 * C * C, (int)BT, C, 4 * C);
        be->layernorm_backward(din, g->ln2w + l * C, g->ln2b + l * C, m->d_bt, res2,
                               w->ln2w + l * C, ln2m, ln2r, (int)BT, C);
        return;
    }
    }
}

int eng_gpt_block_ranges_of(const void *model, int block, eng_range_t *out)
{
    return eng_gpt_block_ranges(model, block, out);
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
        /* ln1w..attprojb or ln2w..fcprojb, listed in backward's order: the projection out of
         * the half (attproj, fcproj), the projection into it (qkv, fc), its layernorm */
        static const int order[6] = {4, 5, 2, 3, 0, 1};
        int lo = kind == BK_ATTN ? 2 : 8;
        for (int j = 0; j < 6; j++) {
            int i = lo + order[j];
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
    int hf = eng_gpt_head_first(m), nb = eng_gpt_num_blocks(m);
    for (int b = 0; b < hf; b++) {
        if (m->block_start) m->block_start(m->block_ctx, b);
        eng_gpt_block_forward(m, a, b, has_targets);
    }
    for (int b = hf; m->block_start && b < nb; b++) m->block_start(m->block_ctx, b);
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
    for (int b = nb - 1; ready && b >= hf; b--) ready(ctx, b, ENG_RANGES_ALL);
    m->part_ready = ready;
    m->part_ctx = ctx;
    for (int b = hf - 1; b >= 0; b--) {
        eng_gpt_block_backward(m, a, b, dout, din, dloss);
        if (ready) ready(ctx, b, ENG_RANGES_ALL);
        float *t = dout;
        dout = din;
        din = t;
    }
    m->part_ready = NULL;
    m->part_ctx = NULL;
}

/* ---- the model interface (engine.h's eng_model_ops_t) ---------------------------------------- */

extern const eng_model_ops_t eng_gpt_model; /* below; listed by model.c from spec.h's table */

static int gpt_create(const spec_model_t *sm, const eng_backend_t *be, const eng_model_opts_t *o,
                      eng_model_t *out, kiln_err_t *err)
{
    eng_gpt_config_t cfg = {sm->seq_len, sm->vocab_size, sm->padded_vocab_size, sm->n_layer, sm->n_head,
                            sm->n_embd};
    eng_gpt_t *m = NULL;
    int rc;
    memset(out, 0, sizeof(*out));
    out->ops = &eng_gpt_model;
    if ((rc = eng_gpt_create(&cfg, be, o->B, &m, err))) return rc;
    out->impl = m;
    if ((o->head_blocks > 1 && (rc = eng_gpt_set_head_blocks(m, o->head_blocks, err))) ||
        (o->recompute && (rc = eng_gpt_set_recompute(m, true, err))) ||
        (o->bf16 && (rc = eng_gpt_set_bf16(m, true, err))))
        return rc;
    out->p = &m->p;
    out->n_blocks = eng_gpt_num_blocks(m);
    out->hash = eng_gpt_config_hash(&cfg);
    out->flops_per_item = eng_gpt_flops_per_token(&cfg);
    return KILN_OK;
}

static void gpt_destroy(eng_model_t *m)
{
    eng_gpt_destroy(m->impl);
    m->impl = NULL;
}

static int gpt_init(eng_model_t *m, uint64_t seed, const eng_range_t *ranges, int n, kiln_err_t *err)
{
    return eng_gpt_init_weights_ranges(m->impl, seed, ranges, n, err);
}

static int gpt_acts_create(eng_model_t *m, int B, void **out, kiln_err_t *err)
{
    const eng_gpt_t *g = m->impl;
    return eng_gpt_acts_create(g, B, g->scratch_T, (eng_gpt_acts_t **)out, err); /* T = seq_len */
}

static void gpt_acts_destroy(eng_model_t *m, void *acts) { eng_gpt_acts_destroy(m->impl, acts); }

static float gpt_forward(eng_model_t *mm, void *acts, const eng_batch_t *b, void (*block_start)(void *, int),
                         void *ctx)
{
    eng_gpt_t *m = mm->impl;
    eng_gpt_acts_set_batch(m, acts, b->tokens, b->targets);
    m->block_start = block_start;
    m->block_ctx = ctx;
    float loss = eng_gpt_forward(m, acts, b->targets != NULL);
    m->block_start = NULL;
    return loss;
}

static void gpt_backward(eng_model_t *m, void *acts, float dloss, eng_grads_ready_fn ready, void *ctx)
{
    eng_gpt_backward(m->impl, acts, dloss, ready, ctx);
}

static int gpt_sample(eng_model_t *m, const int32_t *prompt, int n_prompt, int n, double temperature, int top_k,
                      eng_rng_t *rng, int32_t *out, kiln_err_t *err)
{
    return eng_gpt_sample(m->impl, prompt, n_prompt, n, temperature, top_k, rng, out, err);
}

static uint16_t *gpt_bf16_weights(void *impl) { return eng_gpt_bf16_weights(impl); }
static void gpt_bf16_refresh(void *impl, size_t off, size_t n) { eng_gpt_bf16_refresh(impl, off, n); }

/* An llm.c checkpoint's parameters into the held ranges, after checking its shape. */
static int gpt_load(eng_model_t *mm, const char *path, bool fetched, const eng_range_t *held, int n_held,
                    kiln_err_t *err)
{
    const eng_gpt_t *m = mm->impl;
    const eng_gpt_config_t *cfg = &m->cfg;
    eng_gpt_config_t fc;
    float *params = NULL;
    int rc = fetched ? eng_gpt_llmc_read_fetched(path, &fc, &params, err) : eng_gpt_llmc_read(path, &fc, &params, err);
    if (rc) return rc;
    if (fc.n_layer != cfg->n_layer || fc.n_head != cfg->n_head || fc.n_embd != cfg->n_embd ||
        fc.vocab_size != cfg->vocab_size || fc.padded_vocab_size != cfg->padded_vocab_size ||
        fc.max_seq_len != cfg->max_seq_len) {
        free(params);
        return kiln_err_set(err, KILN_EINVAL, "model.init_from",
                            "\"%s\" holds L=%d NH=%d C=%d T=%d V=%d Vp=%d, which does not match "
                            "the spec's model", path, fc.n_layer, fc.n_head, fc.n_embd,
                            fc.max_seq_len, fc.vocab_size, fc.padded_vocab_size);
    }
    for (int i = 0; i < n_held; i++)
        m->be->to_device(m->p.params + held[i].off, params + held[i].off, held[i].n * sizeof(float));
    free(params);
    return KILN_OK;
}

static int gpt_write(const eng_model_t *m, const char *path, kiln_err_t *err)
{
    return eng_gpt_llmc_write(m->impl, path, err);
}

/* the pipeline's view: the blocks one at a time */
static int gpt_head_first(const void *impl) { return eng_gpt_head_first(impl); }
static size_t gpt_tied_row(const void *impl) { return (size_t)((const eng_gpt_t *)impl)->cfg.n_embd; }
static void gpt_head_rows(const void *impl, int j, int *r0, int *r1) { eng_gpt_head_rows(impl, j, r0, r1); }
static void gpt_set_batch(void *impl, void *acts, const eng_batch_t *b)
{
    eng_gpt_acts_set_batch(impl, acts, b->tokens, b->targets);
}
static void gpt_block_forward(void *impl, void *acts, int block, bool has_targets)
{
    eng_gpt_block_forward(impl, acts, block, has_targets);
}
static void gpt_block_backward(void *impl, void *acts, int block, const float *dout, float *din, float dloss)
{
    eng_gpt_block_backward(impl, acts, block, dout, din, dloss);
}
static float *gpt_boundary(void *impl, void *acts, int i) { return eng_gpt_boundary(impl, acts, i); }
static size_t gpt_boundary_floats(const void *impl, int B, int T, int i)
{
    return eng_gpt_boundary_floats(impl, B, T, i);
}
static size_t gpt_grad_floats(const void *impl, int B, int T, int i) { return eng_gpt_grad_floats(impl, B, T, i); }
static size_t gpt_max_boundary_floats(const void *impl, int B, int T)
{
    return eng_gpt_max_boundary_floats(impl, B, T);
}
static float *gpt_grad_scratch(void *impl, int k)
{
    eng_gpt_t *m = impl;
    return k ? m->d_b : m->d_a;
}
static double gpt_loss(void *impl, void *acts)
{
    const eng_gpt_t *m = impl;
    eng_gpt_acts_t *a = acts;
    size_t BT = (size_t)a->B * a->T;
    m->be->to_host(a->host_losses, a->losses, BT * sizeof(float));
    double s = 0;
    for (size_t i = 0; i < BT; i++) s += a->host_losses[i];
    return s / (double)BT;
}
static void gpt_acts_memory(const void *impl, const void *acts, const void **start, size_t *bytes)
{
    (void)impl;
    const eng_gpt_acts_t *a = acts;
    *start = a->slab;
    *bytes = a->bytes;
}
static void gpt_work_memory(const void *impl, const void **start, size_t *bytes)
{
    const eng_gpt_t *m = impl;
    *start = m->work;
    *bytes = m->work ? m->work_bytes : 0;
}

static const eng_model_bf16_t gpt_bf16 = {gpt_bf16_weights, gpt_bf16_refresh};
static const eng_model_file_t gpt_file = {KILN_ARTIFACT_MODEL, "llm.c", gpt_load, gpt_write};
static const eng_model_pipe_t gpt_pipe = {
    .head_first = gpt_head_first,
    .tied_tensor = 0, /* wte */
    .tied_row = gpt_tied_row,
    .head_rows = gpt_head_rows,
    .set_batch = gpt_set_batch,
    .block_forward = gpt_block_forward,
    .block_backward = gpt_block_backward,
    .boundary = gpt_boundary,
    .boundary_floats = gpt_boundary_floats,
    .grad_floats = gpt_grad_floats,
    .max_boundary_floats = gpt_max_boundary_floats,
    .grad_scratch = gpt_grad_scratch,
    .loss = gpt_loss,
    .acts_memory = gpt_acts_memory,
    .work_memory = gpt_work_memory,
};

const eng_model_ops_t eng_gpt_model = {
    .name = "gpt",
    .create = gpt_create,
    .destroy = gpt_destroy,
    .init = gpt_init,
    .block_ranges = eng_gpt_block_ranges_of,
    .acts_create = gpt_acts_create,
    .acts_destroy = gpt_acts_destroy,
    .forward = gpt_forward,
    .backward = gpt_backward,
    .sample = gpt_sample,
    .bf16 = &gpt_bf16,
    .file = &gpt_file,
    .pipe = &gpt_pipe,
};
