/* mlp.c - the MLP classifier: linear layers with ReLU or GELU between them and a softmax
 * cross-entropy head, through the same op table and flat buffers as the GPT. Each linear layer
 * (with its activation) is one block. It does not load data (see eng_synth_*). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

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
