/* mlp.c - the MLP classifier: linear layers with ReLU or GELU between them and a softmax
 * cross-entropy head, through the same op table and flat buffers as the GPT. Each linear layer
 * (with its activation) is one block. It does not load data (see eng_synth_*). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "spec/spec.h"

static const char *const mlp_wnames[ENG_MLP_MAX_LAYERS] = {
    "w0", "w1", "w2", "w3", "w4", "w5", "w6", "w7", "w8", "w9", "w10", "w11", "w12", "w13",
    "w14", "w15", "w16"};
static const char *const mlp_bnames[ENG_MLP_MAX_LAYERS] = {
    "b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8", "b9", "b10", "b11", "b12", "b13",
    "b14", "b15", "b16"};

int eng_mlp_create(const eng_mlp_config_t *cfg, const eng_backend_t *be, int B, eng_mlp_t **out,
                   kiln_err_t *err)
{
    eng_mlp_t *m = NULL;
    *out = NULL;
    if (cfg->n_inputs < 1 || cfg->n_classes < 2 || cfg->n_hidden < 0 ||
        cfg->n_hidden > ENG_MLP_MAX_LAYERS - 1 || B < 1)
        return kiln_err_set(err, KILN_EINVAL, "model", "invalid mlp configuration");
    m = calloc(1, sizeof(*m));
    if (!m) goto nomem;
    m->cfg = *cfg;
    m->be = be;
    m->B = B;
    m->n_layers = cfg->n_hidden + 1;
    m->dims[0] = cfg->n_inputs;
    for (int i = 0; i < cfg->n_hidden; i++) {
        if (cfg->hidden[i] < 1) {
            free(m);
            return kiln_err_set(err, KILN_EINVAL, "model.hidden", "hidden widths must be >= 1");
        }
        m->dims[i + 1] = cfg->hidden[i];
    }
    m->dims[m->n_layers] = cfg->n_classes;
    size_t off = 0, maxd = 0, nact = 0;
    for (int i = 0; i < m->n_layers; i++) {
        size_t in = m->dims[i], o = m->dims[i + 1];
        m->p.tensors[2 * i] = (eng_tensor_t){mlp_wnames[i], off, o * in, true};
        off += o * in;
        m->p.tensors[2 * i + 1] = (eng_tensor_t){mlp_bnames[i], off, o, false};
        off += o;
        if (o > maxd) maxd = o;
        if (in > maxd) maxd = in;
        nact += 2 * (size_t)B * o;
    }
    m->p.n_tensors = 2 * m->n_layers;
    m->p.n = off;
    m->p.params = be->alloc(off * sizeof(float));
    m->p.grads = be->alloc(off * sizeof(float));
    if (!m->p.params || !m->p.grads) goto nomem;
    for (int i = 0; i < m->n_layers; i++) {
        m->w[i] = m->p.params + m->p.tensors[2 * i].off;
        m->b[i] = m->p.params + m->p.tensors[2 * i + 1].off;
        m->gw[i] = m->p.grads + m->p.tensors[2 * i].off;
        m->gb[i] = m->p.grads + m->p.tensors[2 * i + 1].off;
    }
    size_t total = (size_t)B * cfg->n_inputs + (size_t)B + nact + (size_t)B + 2 * (size_t)B * maxd;
    m->acts = be->alloc(total * sizeof(float));
    m->host_losses = malloc(sizeof(float) * B);
    if (!m->acts || !m->host_losses) goto nomem;
    float *p = m->acts;
    m->x = p; p += (size_t)B * cfg->n_inputs;
    m->y = (int32_t *)p; p += B;
    for (int i = 0; i < m->n_layers; i++) {
        m->pre[i] = p; p += (size_t)B * m->dims[i + 1];
        m->post[i] = p; p += (size_t)B * m->dims[i + 1];
    }
    m->losses = p; p += B;
    m->d_a = p; p += (size_t)B * maxd;
    m->d_b = p;
    *out = m;
    return KILN_OK;
nomem:
    eng_mlp_destroy(m);
    return kiln_err_set(err, KILN_ENOMEM, NULL, "could not allocate the mlp");
}

void eng_mlp_destroy(eng_mlp_t *m)
{
    if (!m) return;
    m->be->free(m->p.params);
    m->be->free(m->p.grads);
    m->be->free(m->acts);
    free(m->host_losses);
    free(m);
}

void eng_mlp_init_weights(eng_mlp_t *m, uint64_t seed)
{
    float *h = calloc(m->p.n, sizeof(float));
    if (!h) return;
    eng_rng_t r;
    eng_rng_seed(&r, seed);
    for (int i = 0; i < m->n_layers; i++) {
        const eng_tensor_t *t = &m->p.tensors[2 * i];
        double bound = 1.0 / sqrt((double)m->dims[i]);
        for (size_t j = 0; j < t->n; j++) h[t->off + j] = (float)((2 * eng_rng_uniform(&r) - 1) * bound);
    }
    m->be->to_device(m->p.params, h, m->p.n * sizeof(float));
    free(h);
}

float eng_mlp_forward(eng_mlp_t *m, const float *x, const int32_t *y, int B)
{
    const eng_backend_t *be = m->be;
    be->to_device(m->x, x, sizeof(float) * (size_t)B * m->cfg.n_inputs);
    be->to_device(m->y, y, sizeof(int32_t) * B);
    const float *in = m->x;
    for (int i = 0; i < m->n_layers; i++) {
        int d_in = m->dims[i], d_out = m->dims[i + 1];
        be->matmul_forward(m->pre[i], in, m->w[i], m->b[i], B, d_in, d_out);
        if (i < m->n_layers - 1) {
            if (m->cfg.gelu) be->gelu_forward(m->post[i], m->pre[i], (size_t)B * d_out);
            else be->relu_forward(m->post[i], m->pre[i], (size_t)B * d_out);
            in = m->post[i];
        }
    }
    int K = m->cfg.n_classes, last = m->n_layers - 1;
    be->xent_forward(m->post[last], m->losses, m->pre[last], m->y, B, K, K);
    be->to_host(m->host_losses, m->losses, sizeof(float) * B);
    double s = 0;
    for (int i = 0; i < B; i++) s += m->host_losses[i];
    return (float)(s / B);
}

void eng_mlp_backward(eng_mlp_t *m, int B, float dloss, eng_grads_ready_fn ready, void *ctx)
{
    const eng_backend_t *be = m->be;
    int K = m->cfg.n_classes, last = m->n_layers - 1;
    float *d = m->d_a, *dnext = m->d_b;
    be->xent_backward(d, m->post[last], m->y, dloss, B, K, K);
    for (int i = last; i >= 0; i--) {
        int d_in = m->dims[i], d_out = m->dims[i + 1];
        if (i < last) {
            if (m->cfg.gelu) be->gelu_backward(d, m->pre[i], d, (size_t)B * d_out);
            else be->relu_backward(d, m->pre[i], d, (size_t)B * d_out);
        }
        const float *in = i == 0 ? m->x : m->post[i - 1];
        be->matmul_backward(i == 0 ? NULL : dnext, m->gw[i], m->gb[i], d, in, m->w[i], B, d_in,
                            d_out);
        if (ready) ready(ctx, i, ENG_RANGES_ALL);
        float *t = d;
        d = dnext;
        dnext = t;
    }
}

double eng_mlp_accuracy(eng_mlp_t *m, int B)
{
    int K = m->cfg.n_classes, last = m->n_layers - 1;
    float *probs = malloc(sizeof(float) * (size_t)B * K);
    int32_t *y = malloc(sizeof(int32_t) * B);
    if (!probs || !y) { free(probs); free(y); return 0; }
    m->be->to_host(probs, m->post[last], sizeof(float) * (size_t)B * K);
    m->be->to_host(y, m->y, sizeof(int32_t) * B);
    int ok = 0;
    for (int b = 0; b < B; b++) {
        int best = 0;
        for (int k = 1; k < K; k++) if (probs[b * K + k] > probs[b * K + best]) best = k;
        ok += best == y[b];
    }
    free(probs);
    free(y);
    return (double)ok / B;
}

int eng_mlp_block_ranges_of(const void *model, int block, eng_range_t *out)
{
    const eng_mlp_t *m = model;
    if (block < 0 || block >= m->n_layers) return 0;
    out[0] = (eng_range_t){m->p.tensors[2 * block].off, m->p.tensors[2 * block].n};
    out[1] = (eng_range_t){m->p.tensors[2 * block + 1].off, m->p.tensors[2 * block + 1].n};
    return 2;
}

/* ---- the model interface (engine.h's eng_model_ops_t) ---------------------------------------- */

extern const eng_model_ops_t eng_mlp_model; /* below; listed by model.c from spec.h's table */

/* The MLP keeps its one set of activations inside the model (sized for the B it was created
 * with); an activation set only remembers the batch of the last forward. */
typedef struct mlp_acts {
    int B;
} mlp_acts_t;

static uint64_t hash_mix(uint64_t h, uint64_t x)
{
    return h ^ (x + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
}

static int mlp_create(const spec_model_t *sm, const eng_backend_t *be, const eng_model_opts_t *o, eng_model_t *out,
                      kiln_err_t *err)
{
    eng_mlp_config_t cfg;
    eng_mlp_t *m = NULL;
    int rc;
    memset(out, 0, sizeof(*out));
    out->ops = &eng_mlp_model;
    memset(&cfg, 0, sizeof(cfg));
    cfg.n_inputs = sm->n_inputs;
    cfg.n_classes = sm->n_classes;
    cfg.n_hidden = sm->n_hidden;
    for (int i = 0; i < cfg.n_hidden && i < ENG_MLP_MAX_LAYERS - 1; i++)
        cfg.hidden[i] = sm->hidden[i];
    if ((rc = eng_mlp_create(&cfg, be, o->B, &m, err))) return rc;
    out->impl = m;
    out->p = &m->p;
    out->n_blocks = m->n_layers;
    out->hash = hash_mix(1469598103934665603ULL, 0x6d6c70);
    for (int i = 0; i <= m->n_layers; i++)
        out->hash = hash_mix(out->hash, (uint64_t)m->dims[i]);
    out->flops_per_item = 6.0 * (double)m->p.n;
    return KILN_OK;
}

static void mlp_destroy(eng_model_t *m)
{
    eng_mlp_destroy(m->impl);
    m->impl = NULL;
}

/* The whole model at once whatever the ranges: its draws run over every weight in order, so
 * the values are the same for any share (the MLP is never cut into stages). */
static int mlp_init(eng_model_t *m, uint64_t seed, const eng_range_t *ranges, int n, kiln_err_t *err)
{
    (void)ranges;
    (void)n;
    (void)err;
    eng_mlp_init_weights(m->impl, seed);
    return KILN_OK;
}

static int mlp_acts_create(eng_model_t *m, int B, void **out, kiln_err_t *err)
{
    const eng_mlp_t *mlp = m->impl;
    *out = NULL;
    if (B < 1 || B > mlp->B) return kiln_err_set(err, KILN_EINVAL, NULL, "bad activation shape B=%d", B);
    mlp_acts_t *a = calloc(1, sizeof(*a));
    if (!a) return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    a->B = B;
    *out = a;
    return KILN_OK;
}

static void mlp_acts_destroy(eng_model_t *m, void *acts)
{
    (void)m;
    free(acts);
}

static float mlp_forward(eng_model_t *m, void *acts, const eng_batch_t *b, void (*block_start)(void *, int),
                         void *ctx)
{
    mlp_acts_t *a = acts;
    a->B = b->B;
    if (block_start) block_start(ctx, -1);
    return eng_mlp_forward(m->impl, b->x, b->targets, b->B);
}

static void mlp_backward(eng_model_t *m, void *acts, float dloss, eng_grads_ready_fn ready, void *ctx)
{
    eng_mlp_backward(m->impl, ((mlp_acts_t *)acts)->B, dloss, ready, ctx);
}

static double mlp_accuracy(eng_model_t *m, void *acts) { return eng_mlp_accuracy(m->impl, ((mlp_acts_t *)acts)->B); }

const eng_model_ops_t eng_mlp_model = {
    .name = "mlp",
    .create = mlp_create,
    .destroy = mlp_destroy,
    .init = mlp_init,
    .block_ranges = eng_mlp_block_ranges_of,
    .acts_create = mlp_acts_create,
    .acts_destroy = mlp_acts_destroy,
    .forward = mlp_forward,
    .backward = mlp_backward,
    .accuracy = mlp_accuracy,
};
