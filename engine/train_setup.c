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

int eng_microbatches_choose(int micro, int stages)
{
    int most = stages * ENG_MICROBATCHES_PER_STAGE;
    for (int m = most < micro ? most : micro; m > 1; m--)
        if (micro % m == 0)
            return m;
    return 1;
}

int eng_geometry_init(eng_geometry_t *g, const spec_t *s, int replicas, int microbatches,
                      kiln_err_t *err)
{
    memset(g, 0, sizeof(*g));
    g->global = s->hp.global_batch_size;
    g->replicas = replicas > 0 ? replicas : 1;
    g->microbatches = microbatches > 0 ? microbatches : 1;
    g->microbatches_chosen = microbatches <= 0 && s->dist.mp_partitions > 1;
    g->T = strcmp(s->data.format, "synthetic") ? s->model.seq_len : 1; /* sequences, or examples */
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
    if (g->microbatches_chosen)
        g->microbatches = eng_microbatches_choose(g->micro, s->dist.mp_partitions);
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

int eng_run_setup_model(eng_run_t *r, int head_blocks, kiln_err_t *err)
{
    const spec_t *s = r->spec;
    const eng_model_ops_t *ops = eng_model_find(s->model.type);
    int rc;
    size_t B = (size_t)r->geo.B, BT = B * r->geo.T;
    if (!ops) /* spec_parse took the type from the same table: a bug */
        return kiln_err_set(err, KILN_EINTERNAL, "model.type", "no model \"%s\" in this engine", s->model.type);
    eng_model_opts_t mo = {r->geo.B, head_blocks, s->dist.activation_checkpointing, r->bf16};
    rc = ops->create(&s->model, r->be, &mo, &r->model, err);
    if (rc) return rc;
    r->p = r->model.p;
    if ((rc = eng_run_share_all(r, err))) return rc;
    r->m = r->be->alloc(r->p->n * sizeof(float));
    r->v = r->be->alloc(r->p->n * sizeof(float));
    if (!r->m || !r->v)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "could not allocate optimizer state");
    r->tok = r->tokens ? malloc(sizeof(int32_t) * BT) : NULL;
    r->tgt = malloc(sizeof(int32_t) * (r->tokens ? BT : B));
    r->xbuf = r->tokens ? NULL : malloc(sizeof(float) * B * (size_t)s->model.n_inputs);
    if ((r->tokens && !r->tok) || !r->tgt || (!r->tokens && !r->xbuf))
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    if (!(r->par && r->par->run_passes) && (rc = r->model.ops->acts_create(&r->model, r->geo.B, &r->acts, err)))
        return rc;
    return KILN_OK;
}

/* The model's parameters over the rank's held ranges: from model.init_from, or the seed. */
int eng_run_init_params(eng_run_t *r, kiln_err_t *err)
{
    const eng_model_t *m = &r->model;
    const char *from = r->spec->model.init_from;
    if (!from[0])
        return m->ops->init(&r->model, r->spec->hp.seed, r->share.held.r, r->share.held.n, err);
    /* the capability table gave only models with files a model.init_from (spec_caps_check) */
    if (!m->ops->file)
        return spec_cap_refuse(!strncmp(from, "job:", 4) ? SPEC_CAP_INIT_JOB : SPEC_CAP_INIT_FILE, m->ops->name, NULL,
                               err);
    char path[SPEC_PATH];
    bool fetched = !strncmp(from, "job:", 4);
    if (fetched) {
        /* another job's model: kiln-agent fetched it from kilnd and checked its SHA-256 */
        if (!r->o->init_model || !*r->o->init_model)
            return kiln_err_set(err, KILN_EINVAL, "model.init_from",
                                "\"%s\" names a kiln job's model, which kiln-agent fetches from kilnd; "
                                "run by hand, give a local copy with --init-model FILE (kiln artifacts "
                                "%s --get %s)", from, from + 4, m->ops->file->name);
        kiln_strlcpy(path, r->o->init_model, sizeof(path));
    } else {
        eng_resolve_path(from, r->o->spec_dir, path, sizeof(path));
    }
    return m->ops->file->load(&r->model, path, fetched, r->share.held.r, r->share.held.n, err);
}

void eng_run_deinit(eng_run_t *r)
{
    if (r->model.ops) {
        r->model.ops->acts_destroy(&r->model, r->acts);
        r->model.ops->destroy(&r->model);
    }
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
