/* train_setup.c - what the training loop builds before its first step: the batch geometry, the
 * model (initialised over the rank's share, or loaded from an llm.c file), the optimizer state,
 * the data and its sampler. One definition for every layout: a pipeline stage and a
 * data-parallel replica build the same model and read the same data as a single process.
 * It does not run steps (train.c) nor save or restore state (train_state.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/engine_int.h"

/* ---- ranges ----------------------------------------------------------------------------------- */

int eng_ranges_add(eng_ranges_t *l, size_t off, size_t n)
{
    if (n == 0) return KILN_OK;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        eng_range_t *r = realloc(l->r, sizeof(*r) * (size_t)cap);
        if (!r) return KILN_ENOMEM;
        l->r = r;
        l->cap = cap;
    }
    l->r[l->n++] = (eng_range_t){off, n};
    return KILN_OK;
}

void eng_ranges_clear(eng_ranges_t *l) { l->n = 0; }

void eng_ranges_deinit(eng_ranges_t *l)
{
    free(l->r);
    memset(l, 0, sizeof(*l));
}

/* ---- geometry ----------------------------------------------------------------------------------- */

int eng_geometry_init(eng_geometry_t *g, const spec_t *s, int replicas, int microbatches,
                      kiln_err_t *err)
{
    memset(g, 0, sizeof(*g));
    g->global = s->hp.global_batch_size;
    g->replicas = replicas > 0 ? replicas : 1;
    g->microbatches = microbatches > 0 ? microbatches : 1;
    g->T = !strcmp(s->model.type, "gpt") ? s->model.seq_len : 1;
    if (g->global % g->replicas)
        return kiln_err_set(err, KILN_EINVAL, "hyperparameters.global_batch_size",
                            "global_batch_size %d does not split over %d data-parallel replicas",
                            g->global, g->replicas);
    g->per_replica = g->global / g->replicas;
    g->micro = s->hp.micro_batch_size > 0 ? s->hp.micro_batch_size : g->per_replica;
    if (g->micro < 1 || g->per_replica % g->micro)
        return kiln_err_set(err, KILN_EINVAL, "hyperparameters.micro_batch_size",
                            "global_batch_size %d is not a multiple of replicas (%d) x "
                            "micro_batch_size (%d)", g->global, g->replicas, g->micro);
    if (g->micro % g->microbatches)
        return kiln_err_set(err, KILN_EINVAL, "distribution.model_parallel.microbatches",
                            "micro batches of %d sequences do not split into %d microbatches",
                            g->micro, g->microbatches);
    g->passes = g->per_replica / g->micro;
    g->B = g->micro / g->microbatches;
    return KILN_OK;
}

/* ---- data --------------------------------------------------------------------------------------- */

void eng_resolve_path(const char *in, const char *spec_dir, char *out, size_t n)
{
    struct stat sb;
    kiln_strlcpy(out, in, n);
    if (in[0] == '/' || stat(in, &sb) == 0) return;
    const char *roots[3] = {spec_dir, NULL, getenv("KILN_ROOT")};
    char parent[SPEC_PATH + 4];
    if (spec_dir) {
        snprintf(parent, sizeof(parent), "%s/..", spec_dir);
        roots[1] = parent;
    }
    for (int i = 0; i < 3; i++) {
        char cand[2 * SPEC_PATH + 8];
        if (!roots[i] || !*roots[i]) continue;
        snprintf(cand, sizeof(cand), "%s/%s", roots[i], in);
        if (stat(cand, &sb) == 0) {
            kiln_strlcpy(out, cand, n);
            return;
        }
    }
}

int eng_run_setup_data(eng_run_t *r, kiln_err_t *err)
{
    const spec_t *s = r->spec;
    char path[SPEC_PATH];
    int rc;
    if (!strcmp(s->data.format, "synthetic"))
        return eng_synth_init(&r->synth, s->model.n_inputs, s->model.n_classes, s->hp.seed);
    eng_data_kind_t kind = !strcmp(s->data.format, "tokens") ? ENG_DATA_TOKENS : ENG_DATA_TEXT;
    eng_resolve_path(s->data.train, r->o->spec_dir, path, sizeof(path));
    if ((rc = eng_tokens_load(path, kind, &r->train, err))) return rc;
    if (s->data.val[0]) {
        eng_resolve_path(s->data.val, r->o->spec_dir, path, sizeof(path));
        if ((rc = eng_tokens_load(path, kind, &r->val, err))) {
            kiln_strlcpy(err->field, "data.val", sizeof(err->field));
            return rc;
        }
    } else if ((rc = eng_tokens_split_tail(&r->train, s->data.val_fraction, &r->val, err))) {
        return rc;
    }
    int V = s->model.vocab_size, T = r->geo.T;
    if (r->train.max_token >= V || (r->val.n && r->val.max_token >= V))
        return kiln_err_set(err, KILN_EINVAL, "model.vocab",
                            "data holds token %d but the vocabulary has only %d entries",
                            KILN_MAX(r->train.max_token, r->val.max_token), V);
    if (r->train.n < (size_t)T + 1)
        return kiln_err_set(err, KILN_EINVAL, "data.train",
                            "training data has %zu tokens, fewer than seq_len+1 = %d", r->train.n,
                            T + 1);
    return eng_sampler_init(&r->ts, &r->train, T, r->geo.global, r->par ? r->par->replica : 0,
                            r->geo.replicas, true, s->hp.seed, err);
}

/* ---- model -------------------------------------------------------------------------------------- */

static uint64_t hash_mix(uint64_t h, uint64_t x)
{
    return h ^ (x + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
}

int eng_run_share_all(eng_run_t *r, kiln_err_t *err)
{
    eng_share_t *sh = &r->share;
    eng_ranges_clear(&sh->held);
    eng_ranges_clear(&sh->update);
    eng_ranges_clear(&sh->norm);
    if (eng_ranges_add(&sh->held, 0, r->p->n) || eng_ranges_add(&sh->update, 0, r->p->n) ||
        eng_ranges_add(&sh->norm, 0, r->p->n))
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    return KILN_OK;
}

/* Copies an llm.c checkpoint's parameters into the held ranges after checking its shape. */
static int load_init_from(eng_run_t *r, const eng_gpt_config_t *cfg, kiln_err_t *err)
{
    eng_gpt_config_t fc;
    float *params = NULL;
    char path[SPEC_PATH];
    int rc;
    if (!strncmp(r->spec->model.init_from, "job:", 4)) {
        /* another job's model: kiln-agent fetched it from kilnd and checked its SHA-256 */
        if (!r->o->init_model || !*r->o->init_model)
            return kiln_err_set(err, KILN_EINVAL, "model.init_from",
                                "\"%s\" names a kiln job's model, which kiln-agent fetches from kilnd; "
                                "run by hand, give a local copy with --init-model FILE (kiln artifacts "
                                "%s --get " KILN_ARTIFACT_MODEL ")",
                                r->spec->model.init_from, r->spec->model.init_from + 4);
        kiln_strlcpy(path, r->o->init_model, sizeof(path));
        rc = eng_gpt_llmc_read_fetched(path, &fc, &params, err);
    } else {
        eng_resolve_path(r->spec->model.init_from, r->o->spec_dir, path, sizeof(path));
        rc = eng_gpt_llmc_read(path, &fc, &params, err);
    }
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
    for (int i = 0; i < r->share.held.n; i++) {
        const eng_range_t *h = &r->share.held.r[i];
        r->be->to_device(r->p->params + h->off, params + h->off, h->n * sizeof(float));
    }
    free(params);
    return KILN_OK;
}

static int setup_gpt(eng_run_t *r, int head_blocks, kiln_err_t *err)
{
    const spec_t *s = r->spec;
    int rc;
    eng_gpt_config_t cfg = {s->model.seq_len, s->model.vocab_size, s->model.padded_vocab_size,
                            s->model.n_layer, s->model.n_head, s->model.n_embd};
    if ((rc = eng_gpt_create(&cfg, r->be, r->geo.B, &r->gpt, err))) return rc;
    if (head_blocks > 1 && (rc = eng_gpt_set_head_blocks(r->gpt, head_blocks, err))) return rc;
    if (s->dist.activation_checkpointing && (rc = eng_gpt_set_recompute(r->gpt, true, err)))
        return rc;
    if (r->bf16 && (rc = eng_gpt_set_bf16(r->gpt, true, err))) return rc;
    r->p = &r->gpt->p;
    r->model_hash = eng_gpt_config_hash(&cfg);
    r->flops_per_item = eng_gpt_flops_per_token(&cfg);
    return KILN_OK;
}

static int setup_mlp(eng_run_t *r, kiln_err_t *err)
{
    const spec_t *s = r->spec;
    eng_mlp_config_t cfg;
    int rc;
    memset(&cfg, 0, sizeof(cfg));
    cfg.n_inputs = s->model.n_inputs;
    cfg.n_classes = s->model.n_classes;
    cfg.n_hidden = s->model.n_hidden;
    for (int i = 0; i < cfg.n_hidden && i < ENG_MLP_MAX_LAYERS - 1; i++)
        cfg.hidden[i] = s->model.hidden[i];
    if ((rc = eng_mlp_create(&cfg, r->be, r->geo.B, &r->mlp, err))) return rc;
    eng_mlp_init_weights(r->mlp, s->hp.seed);
    r->p = &r->mlp->p;
    r->model_hash = hash_mix(1469598103934665603ULL, 0x6d6c70);
    for (int i = 0; i <= r->mlp->n_layers; i++)
        r->model_hash = hash_mix(r->model_hash, (uint64_t)r->mlp->dims[i]);
    r->flops_per_item = 6.0 * (double)r->p->n;
    return KILN_OK;
}

int eng_run_setup_model(eng_run_t *r, int head_blocks, kiln_err_t *err)
{
    int rc;
    size_t BT = (size_t)r->geo.B * r->geo.T;
    if ((rc = r->is_gpt ? setup_gpt(r, head_blocks, err) : setup_mlp(r, err))) return rc;
    if ((rc = eng_run_share_all(r, err))) return rc;
    r->m = r->be->alloc(r->p->n * sizeof(float));
    r->v = r->be->alloc(r->p->n * sizeof(float));
    if (!r->m || !r->v)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "could not allocate optimizer state");
    if (r->is_gpt) {
        r->tok = malloc(sizeof(int32_t) * BT);
        r->tgt = malloc(sizeof(int32_t) * BT);
        if (!r->tok || !r->tgt) return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        if (!(r->par && r->par->run_passes) &&
            (rc = eng_gpt_acts_create(r->gpt, r->geo.B, r->geo.T, &r->acts, err)))
            return rc;
    } else {
        r->xbuf = malloc(sizeof(float) * r->geo.B * r->spec->model.n_inputs);
        r->tgt = malloc(sizeof(int32_t) * r->geo.B);
        if (!r->xbuf || !r->tgt) return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    return KILN_OK;
}

/* The GPT's parameters over the rank's held ranges: from model.init_from, or the seed. */
int eng_run_init_params(eng_run_t *r, kiln_err_t *err)
{
    if (!r->is_gpt) return KILN_OK; /* the MLP initialised itself (it is never split) */
    if (r->spec->model.init_from[0]) return load_init_from(r, &r->gpt->cfg, err);
    return eng_gpt_init_weights_ranges(r->gpt, r->spec->hp.seed, r->share.held.r,
                                       r->share.held.n, err);
}

void eng_run_deinit(eng_run_t *r)
{
    if (r->gpt) {
        eng_gpt_acts_destroy(r->gpt, r->acts);
        eng_gpt_destroy(r->gpt);
    }
    eng_mlp_destroy(r->mlp);
    if (r->be) {
        r->be->free(r->m);
        r->be->free(r->v);
    }
    eng_ranges_deinit(&r->share.held);
    eng_ranges_deinit(&r->share.update);
    eng_ranges_deinit(&r->share.norm);
    eng_tokens_deinit(&r->train);
    eng_tokens_deinit(&r->val);
    eng_sampler_deinit(&r->ts);
    eng_synth_deinit(&r->synth);
    free(r->tok);
    free(r->tgt);
    free(r->xbuf);
    if (r->samples) fclose(r->samples);
}
