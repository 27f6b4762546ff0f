/* sample.c - text generation from a trained GPT: temperature and top-k sampling, one token at a
 * time, re-running the forward pass over the (sliding) context window. Simple rather than fast:
 * no key/value cache. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

typedef struct cand {
    float p;
    int id;
} cand_t;

static int cand_desc(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id - y->id; /* ties by id: deterministic */
}

int eng_gpt_sample(eng_gpt_t *m, const int32_t *prompt, int n_prompt, int n, double temperature,
                   int top_k, eng_rng_t *rng, int32_t *out_tokens, kiln_err_t *err)
{
    const eng_gpt_config_t *c = &m->cfg;
    int T = c->max_seq_len, V = c->vocab_size, Vp = c->padded_vocab_size;
    eng_gpt_acts_t *a = NULL;
    int32_t *ctx = NULL;
    float *row = NULL;
    cand_t *cands = NULL;
    int rc;
    if (n_prompt < 1) return kiln_err_set(err, KILN_EINVAL, NULL, "sampling needs a prompt");
    if ((rc = eng_gpt_acts_create(m, 1, T, &a, err))) return rc;
    ctx = calloc((size_t)T, sizeof(int32_t));
    row = malloc(sizeof(float) * Vp);
    cands = malloc(sizeof(cand_t) * V);
    if (!ctx || !row || !cands) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto done;
    }
    if (out_tokens != prompt) memmove(out_tokens, prompt, sizeof(int32_t) * n_prompt);
    int len = n_prompt;
    for (int i = 0; i < n; i++) {
        int start = len > T ? len - T : 0, w = len - start;
        memcpy(ctx, out_tokens + start, sizeof(int32_t) * w);
        for (int j = 0; j < w; j++)
            if (ctx[j] < 0 || ctx[j] >= V) ctx[j] = 0;
        memset(ctx + w, 0, sizeof(int32_t) * (T - w)); /* causal: later positions do not matter */
        eng_gpt_acts_set_batch(m, a, ctx, NULL);
        eng_gpt_forward(m, a, false);
        m->be->to_host(row, a->probs + (size_t)(w - 1) * Vp, sizeof(float) * Vp);
        /* softmax(logits / temp) is proportional to p^(1/temp) */
        double inv_t = 1.0 / (temperature > 1e-6 ? temperature : 1e-6);
        for (int j = 0; j < V; j++) cands[j] = (cand_t){row[j], j};
        int k = V;
        if (top_k > 0 && top_k < V) {
            qsort(cands, V, sizeof(cand_t), cand_desc);
            k = top_k;
        }
        double pmax = 0, sum = 0;
        for (int j = 0; j < k; j++) if (cands[j].p > pmax) pmax = cands[j].p;
        for (int j = 0; j < k; j++) {
            double q = cands[j].p > 0 ? exp(inv_t * log(cands[j].p / pmax)) : 0.0;
            cands[j].p = (float)q;
            sum += q;
        }
        double u = eng_rng_uniform(rng) * sum, acc = 0;
        int pick = cands[k - 1].id;
        for (int j = 0; j < k; j++) {
            acc += cands[j].p;
            if (u < acc) {
                pick = cands[j].id;
                break;
            }
        }
        out_tokens[len++] = pick;
    }
    rc = KILN_OK;
done:
    eng_gpt_acts_destroy(m, a);
    free(ctx);
    free(row);
    free(cands);
    return rc;
}
