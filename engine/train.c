/* train.c - the training loop: a job spec in, a trained model out. Builds the model and data,
 * resumes from the newest checkpoint, runs microbatches with gradient accumulation, global-norm
 * clipping and AdamW on a warm-up + cosine schedule, evaluates, samples, checkpoints, and
 * reports log lines on stdout and metric records on the metrics fd.
 * Data parallelism joins through eng_train_hooks_t; this file never talks to other ranks. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "spec/spec.h"

double eng_lr_at(int64_t step, double lr, int warmup, int64_t max_steps, double min_frac)
{
    double min_lr = lr * min_frac;
    if (warmup > 0 && step <= warmup) return lr * (double)step / warmup;
    if (step >= max_steps) return min_lr;
    double decay = (double)(step - warmup) / (double)(max_steps - warmup);
    if (decay < 0) decay = 0;
    if (decay > 1) decay = 1;
    double coeff = 0.5 * (1.0 + cos(M_PI * decay));
    return min_lr + coeff * (lr - min_lr);
}

/* ---- the run's state -------------------------------------------------------------------------- */

typedef struct run {
    const spec_t *spec;
    const eng_train_opts_t *o;
    const eng_backend_t *be;
    bool is_gpt;
    eng_gpt_t *gpt;
    eng_gpt_acts_t *acts;
    eng_mlp_t *mlp;
    eng_params_t *p;            /* borrowed from gpt or mlp */
    float *m, *v;               /* (n) AdamW moments, device; owned */
    int B, T, accum;            /* microbatch, sequence length, microbatches per step */
    eng_tokens_t train, val;
    eng_sampler_t ts;           /* training sampler */
    eng_synth_t synth;          /* mlp data */
    int32_t *tok, *tgt;         /* (B*T) host */
    float *xbuf;                /* (B, n_in) host (mlp) */
    eng_rng_t sample_rng;
    uint64_t model_hash;
    double flops_per_item;      /* per token (gpt) or example (mlp) */
    double peak_flops;
    FILE *samples;
} run_t;

static uint64_t hash_mix(uint64_t h, uint64_t x)
{
    h ^= x + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
}

/* Data paths: absolute, relative to the working directory, or relative to the spec's directory
 * (and its parent, so examples/x.json can name data/...), or to $KILN_ROOT. */
static void resolve_path(const char *in, const char *spec_dir, char *out, size_t n)
{
    struct stat sb;
    kiln_strlcpy(out, in, n);
    if (in[0] == '/' || stat(in, &sb) == 0) return;
    const char *roots[3] = {spec_dir, NULL, getenv("KILN_ROOT")};
    char parent[SPEC_PATH];
    if (spec_dir) {
        snprintf(parent, sizeof(parent), "%s/..", spec_dir);
        roots[1] = parent;
    }
    for (int i = 0; i < 3; i++) {
        char cand[2 * SPEC_PATH + 2];
        if (!roots[i] || !*roots[i]) continue;
        snprintf(cand, sizeof(cand), "%s/%s", roots[i], in);
        if (stat(cand, &sb) == 0) {
            kiln_strlcpy(out, cand, n);
            return;
        }
    }
}

static void metric_record(run_t *r, int64_t step, const char *const *names, const double *vals,
                          int n)
{
    if (r->o->metrics_fd < 0) return;
    char buf[2048];
    int len = snprintf(buf, sizeof(buf), "{\"step\": %lld, \"time\": %.3f, \"metrics\": {",
                       (long long)step, kiln_now_us() / 1e6);
    int first = 1;
    for (int i = 0; i < n && len < (int)sizeof(buf) - 64; i++) {
        if (!isfinite(vals[i])) continue; /* JSON has no NaN */
        len += snprintf(buf + len, sizeof(buf) - len, "%s\"%s\": %.7g", first ? "" : ", ",
                        names[i], vals[i]);
        first = 0;
    }
    len += snprintf(buf + len, sizeof(buf) - len, "}}\n");
    ssize_t off = 0;
    while (off < len) {
        ssize_t w = write(r->o->metrics_fd, buf + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        off += w;
    }
}

/* ---- setup ------------------------------------------------------------------------------------ */

static int setup_data(run_t *r, kiln_err_t *err)
{
    const spec_t *s = r->spec;
    char path[SPEC_PATH];
    int rc;
    if (!strcmp(s->data.format, "synthetic"))
        return eng_synth_init(&r->synth, s->model.n_inputs, s->model.n_classes, s->hp.seed);
    eng_data_kind_t kind = !strcmp(s->data.format, "tokens") ? ENG_DATA_TOKENS : ENG_DATA_TEXT;
    resolve_path(s->data.train, r->o->spec_dir, path, sizeof(path));
    if ((rc = eng_tokens_load(path, kind, &r->train, err))) return rc;
    if (s->data.val[0]) {
        resolve_path(s->data.val, r->o->spec_dir, path, sizeof(path));
        if ((rc = eng_tokens_load(path, kind, &r->val, err))) {
            kiln_strlcpy(err->field, "data.val", sizeof(err->field));
            return rc;
        }
    } else if ((rc = eng_tokens_split_tail(&r->train, s->data.val_fraction, &r->val, err))) {
        return rc;
    }
    int V = s->model.vocab_size;
    if (r->train.max_token >= V || (r->val.n && r->val.max_token >= V))
        return kiln_err_set(err, KILN_EINVAL, "model.vocab",
                            "data holds token %d but the vocabulary has only %d entries",
                            KILN_MAX(r->train.max_token, r->val.max_token), V);
    if (r->train.n < (size_t)r->T + 1)
        return kiln_err_set(err, KILN_EINVAL, "data.train",
                            "training data has %zu tokens, fewer than seq_len+1 = %d", r->train.n,
                            r->T + 1);
    return eng_sampler_init(&r->ts, &r->train, r->T, s->hp.global_batch_size, r->o->rank,
                            r->o->world, true, s->hp.seed, err);
}

static int setup_model(run_t *r, kiln_err_t *err)
{
    const spec_t *s = r->spec;
    int rc;
    r->model_hash = 1469598103934665603ULL;
    if (r->is_gpt) {
        eng_gpt_config_t cfg = {s->model.seq_len, s->model.vocab_size, s->model.padded_vocab_size,
                                s->model.n_layer, s->model.n_head, s->model.n_embd};
        if ((rc = eng_gpt_create(&cfg, r->be, r->B, &r->gpt, err))) return rc;
        if ((rc = eng_gpt_acts_create(r->gpt, r->B, r->T, &r->acts, err))) return rc;
        r->p = &r->gpt->p;
        if (s->model.init_from[0]) {
            eng_gpt_config_t fc;
            float *params = NULL;
            char path[SPEC_PATH];
            resolve_path(s->model.init_from, r->o->spec_dir, path, sizeof(path));
            if ((rc = eng_gpt_llmc_read(path, &fc, &params, err))) return rc;
            if (fc.n_layer != cfg.n_layer || fc.n_head != cfg.n_head || fc.n_embd != cfg.n_embd ||
                fc.vocab_size != cfg.vocab_size || fc.padded_vocab_size != cfg.padded_vocab_size ||
                fc.max_seq_len != cfg.max_seq_len) {
                free(params);
                return kiln_err_set(err, KILN_EINVAL, "model.init_from",
                                    "\"%s\" holds L=%d NH=%d C=%d T=%d V=%d Vp=%d, which does not "
                                    "match the spec's model", path, fc.n_layer, fc.n_head,
                                    fc.n_embd, fc.max_seq_len, fc.vocab_size, fc.padded_vocab_size);
            }
            r->be->to_device(r->p->params, params, r->p->n * sizeof(float));
            free(params);
        } else {
            eng_gpt_init_weights(r->gpt, s->hp.seed);
        }
        int cf[6] = {cfg.max_seq_len, cfg.vocab_size, cfg.padded_vocab_size, cfg.n_layer,
                     cfg.n_head, cfg.n_embd};
        for (int i = 0; i < 6; i++) r->model_hash = hash_mix(r->model_hash, (uint64_t)cf[i]);
        r->flops_per_item = eng_gpt_flops_per_token(&cfg);
        r->tok = malloc(sizeof(int32_t) * r->B * r->T);
        r->tgt = malloc(sizeof(int32_t) * r->B * r->T);
        if (!r->tok || !r->tgt) return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    } else {
        eng_mlp_config_t cfg;
        memset(&cfg, 0, sizeof(cfg));
        cfg.n_inputs = s->model.n_inputs;
        cfg.n_classes = s->model.n_classes;
        cfg.n_hidden = s->model.n_hidden;
        for (int i = 0; i < cfg.n_hidden && i < ENG_MLP_MAX_LAYERS - 1; i++)
            cfg.hidden[i] = s->model.hidden[i];
        if ((rc = eng_mlp_create(&cfg, r->be, r->B, &r->mlp, err))) return rc;
        eng_mlp_init_weights(r->mlp, s->hp.seed);
        r->p = &r->mlp->p;
        r->model_hash = hash_mix(r->model_hash, 0x6d6c70);
        for (int i = 0; i <= r->mlp->n_layers; i++)
            r->model_hash = hash_mix(r->model_hash, (uint64_t)r->mlp->dims[i]);
        r->flops_per_item = 6.0 * (double)r->p->n;
        r->xbuf = malloc(sizeof(float) * r->B * cfg.n_inputs);
        r->tgt = malloc(sizeof(int32_t) * r->B);
        if (!r->xbuf || !r->tgt) return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    r->m = r->be->alloc(r->p->n * sizeof(float));
    r->v = r->be->alloc(r->p->n * sizeof(float));
    if (!r->m || !r->v)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "could not allocate optimizer state");
    return KILN_OK;
}

static void run_deinit(run_t *r)
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
    eng_tokens_deinit(&r->train);
    eng_tokens_deinit(&r->val);
    eng_sampler_deinit(&r->ts);
    eng_synth_deinit(&r->synth);
    free(r->tok);
    free(r->tgt);
    free(r->xbuf);
    if (r->samples) fclose(r->samples);
}

/* ---- one step --------------------------------------------------------------------------------- */

typedef struct ready_ctx {
    run_t *r;
    bool last_micro;
} ready_ctx_t;

static void on_grads_ready(void *ctx, int block)
{
    ready_ctx_t *c = ctx;
    if (c->last_micro && c->r->o->hooks.grads_ready)
        c->r->o->hooks.grads_ready(c->r->o->hooks.ctx, block);
}

/* MLP examples for step `step` (1-based), microbatch `micro`: the global batch of step s is
 * examples [(s-1)*G, s*G), split over ranks like the GPT sampler. */
static void mlp_batch(run_t *r, int64_t step, int micro, uint64_t base)
{
    int G = r->spec->hp.global_batch_size, per_rank = G / r->o->world;
    for (int b = 0; b < r->B; b++) {
        uint64_t idx = base + (uint64_t)(step - 1) * G + (uint64_t)r->o->rank * per_rank +
                       (uint64_t)micro * r->B + b;
        eng_synth_example(&r->synth, idx, r->xbuf + (size_t)b * r->spec->model.n_inputs,
                          &r->tgt[b]);
    }
}

/* Forward + backward of all microbatches of one step; returns the mean training loss. */
static int train_step_grads(run_t *r, int64_t step, float *loss_out, kiln_err_t *err)
{
    const eng_backend_t *be = r->be;
    be->memset_zero(r->p->grads, r->p->n * sizeof(float));
    if (r->is_gpt) eng_sampler_next_step(&r->ts);
    double loss = 0;
    float dloss = 1.0f / ((float)r->accum * (r->is_gpt ? (float)r->B * r->T : (float)r->B));
    ready_ctx_t rc = {r, false};
    for (int mi = 0; mi < r->accum; mi++) {
        rc.last_micro = mi == r->accum - 1;
        if (r->is_gpt) {
            eng_sampler_micro(&r->ts, mi, r->B, r->tok, r->tgt);
            eng_gpt_acts_set_batch(r->gpt, r->acts, r->tok, r->tgt);
            loss += eng_gpt_forward(r->gpt, r->acts, true);
            eng_gpt_backward(r->gpt, r->acts, dloss, on_grads_ready, &rc);
        } else {
            mlp_batch(r, step, mi, 0);
            loss += eng_mlp_forward(r->mlp, r->xbuf, r->tgt, r->B);
            eng_mlp_backward(r->mlp, r->B, dloss, on_grads_ready, &rc);
        }
    }
    loss /= r->accum;
    const eng_train_hooks_t *h = &r->o->hooks;
    if (h->grads_finish) {
        int st = h->grads_finish(h->ctx, r->p->grads, r->p->n);
        if (st) return kiln_err_set(err, st, NULL, "gradient reduction failed at step %lld",
                                    (long long)step);
    }
    if (h->allreduce_sum && r->o->world > 1) {
        double l = loss;
        if (h->allreduce_sum(h->ctx, &l) == 0) loss = l / r->o->world;
    }
    *loss_out = (float)loss;
    return KILN_OK;
}

static void optimizer_step(run_t *r, int64_t step, double lr, float grad_scale)
{
    const spec_hparams_t *hp = &r->spec->hp;
    for (int i = 0; i < r->p->n_tensors; i++) {
        const eng_tensor_t *t = &r->p->tensors[i];
        r->be->adamw_update(r->p->params + t->off, r->p->grads + t->off, r->m + t->off,
                            r->v + t->off, t->n, (float)lr, (float)hp->beta1, (float)hp->beta2,
                            (float)hp->eps, t->decay ? (float)hp->weight_decay : 0.0f, grad_scale,
                            step);
    }
}

/* Validation: the first eval_batches microbatches of the validation stream (sequential, fixed),
 * each rank its shard; for the MLP a fixed held-out index range. */
static float evaluate(run_t *r, kiln_err_t *err)
{
    double loss = 0;
    int nb = r->spec->hp.eval_batches;
    if (r->is_gpt) {
        if (r->val.n < (size_t)r->T + 1) return NAN;
        eng_sampler_t vs;
        if (eng_sampler_init(&vs, &r->val, r->T, r->B * r->o->world, r->o->rank, r->o->world,
                             false, 0, err))
            return NAN;
        for (int i = 0; i < nb; i++) {
            eng_sampler_next_step(&vs);
            eng_sampler_micro(&vs, 0, r->B, r->tok, r->tgt);
            eng_gpt_acts_set_batch(r->gpt, r->acts, r->tok, r->tgt);
            loss += eng_gpt_forward(r->gpt, r->acts, true);
        }
        eng_sampler_deinit(&vs);
    } else {
        for (int i = 0; i < nb; i++) {
            mlp_batch(r, i + 1, 0, (uint64_t)1 << 48);
            loss += eng_mlp_forward(r->mlp, r->xbuf, r->tgt, r->B);
        }
    }
    loss /= nb;
    const eng_train_hooks_t *h = &r->o->hooks;
    if (h->allreduce_sum && r->o->world > 1) {
        double l = loss;
        if (h->allreduce_sum(h->ctx, &l) == 0) loss = l / r->o->world;
    }
    return (float)loss;
}

static void sample_text(run_t *r, int64_t step)
{
    const spec_hparams_t *hp = &r->spec->hp;
    if (!r->is_gpt || hp->sample_tokens <= 0 || r->o->rank != 0 ||
        strcmp(r->spec->model.vocab, "bytes") != 0)
        return;
    const char *prompt = r->o->sample_prompt && *r->o->sample_prompt ? r->o->sample_prompt : "\n";
    int np = (int)strlen(prompt), n = hp->sample_tokens;
    int32_t *toks = malloc(sizeof(int32_t) * (np + n + 1));
    char *text = malloc((size_t)np + n + 1);
    if (!toks || !text) goto done;
    for (int i = 0; i < np; i++) toks[i] = (uint8_t)prompt[i];
    kiln_err_t err;
    kiln_err_clear(&err);
    if (eng_gpt_sample(r->gpt, toks, np, n, hp->temperature, hp->top_k, &r->sample_rng, toks,
                       &err) != 0) {
        log_warn("sampling failed: %s", err.message);
        goto done;
    }
    for (int i = 0; i < np + n; i++) text[i] = (char)toks[i];
    text[np + n] = '\0';
    printf("sample at step %lld (temperature %.2f, top_k %d):\n", (long long)step,
           hp->temperature, hp->top_k);
    /* one log line per text line, so the agent's line-based forwarding keeps the shape */
    char *save = NULL;
    char *copy = strdup(text);
    for (char *line = copy ? strtok_r(copy, "\n", &save) : NULL; line;
         line = strtok_r(NULL, "\n", &save))
        printf("  | %s\n", line);
    free(copy);
    fflush(stdout);
    if (r->o->output_dir && *r->o->output_dir) {
        if (!r->samples) {
            char path[SPEC_PATH + 32];
            kiln_err_t e2;
            kiln_mkdirs(r->o->output_dir, &e2);
            snprintf(path, sizeof(path), "%s/samples.txt", r->o->output_dir);
            r->samples = fopen(path, "a");
        }
        if (r->samples) {
            fprintf(r->samples, "=== step %lld (temperature %.2f, top_k %d)\n%s\n\n",
                    (long long)step, hp->temperature, hp->top_k, text);
            fflush(r->samples);
        }
    }
done:
    free(toks);
    free(text);
}

static int write_checkpoint(run_t *r, int64_t step, kiln_err_t *err)
{
    const float *m = r->m, *v = r->v;
    /* dp module (additive): a sharded optimizer state is gathered on every rank's call */
    if (r->o->hooks.ckpt_state) {
        int rc = r->o->hooks.ckpt_state(r->o->hooks.ctx, &m, &v, err);
        if (rc) return rc;
    }
    if (!r->o->checkpoint_dir || !*r->o->checkpoint_dir || r->o->rank != 0) return KILN_OK;
    eng_ckpt_meta_t meta;
    memset(&meta, 0, sizeof(meta));
    meta.step = step;
    meta.train = r->ts.st;
    meta.sample_rng = r->sample_rng;
    meta.model_hash = r->model_hash;
    meta.n_params = r->p->n;
    double t0 = kiln_mono_s();
    int rc = eng_ckpt_write(r->o->checkpoint_dir, &meta, r->be, r->p->params, m, v, r->p->n,
                            r->spec->ckpt_keep_last, err);
    if (rc == 0)
        printf("checkpoint: step %lld written to %s/ckpt_%08lld.bin (%.2f s)\n", (long long)step,
               r->o->checkpoint_dir, (long long)step, kiln_mono_s() - t0);
    fflush(stdout);
    return rc;
}

static int try_resume(run_t *r, int64_t *start_step, kiln_err_t *err)
{
    char path[SPEC_PATH + 64];
    *start_step = 0;
    if (!r->o->checkpoint_dir || !*r->o->checkpoint_dir) return KILN_OK;
    if (eng_ckpt_find_latest(r->o->checkpoint_dir, path, sizeof(path)) != KILN_OK) return KILN_OK;
    eng_ckpt_meta_t meta;
    memset(&meta, 0, sizeof(meta));
    meta.model_hash = r->model_hash;
    int rc = eng_ckpt_read(path, &meta, r->be, r->p->params, r->m, r->v, r->p->n, err);
    if (rc) return rc;
    r->ts.st = meta.train;
    r->sample_rng = meta.sample_rng;
    *start_step = meta.step;
    printf("resumed from %s at step %lld\n", path, (long long)meta.step);
    fflush(stdout);
    return KILN_OK;
}

/* dp module (additive): block parameter ranges for hooks.attach */
static int run_block_ranges(const void *model, int block, eng_range_t *out)
{
    const run_t *r = model;
    if (r->is_gpt) return eng_gpt_block_ranges(r->gpt, block, out);
    if (block < 0 || block >= r->mlp->n_layers) return 0;
    out[0] = (eng_range_t){r->p->tensors[2 * block].off, r->p->tensors[2 * block].n};
    out[1] = (eng_range_t){r->p->tensors[2 * block + 1].off, r->p->tensors[2 * block + 1].n};
    return 2;
}

/* ---- the run ---------------------------------------------------------------------------------- */

int eng_train_run(const spec_t *s, const eng_train_opts_t *o, eng_train_result_t *res,
                  kiln_err_t *err)
{
    run_t r;
    int rc;
    memset(&r, 0, sizeof(r));
    eng_train_result_t local;
    if (!res) res = &local;
    memset(res, 0, sizeof(*res));
    res->last_val_loss = NAN;
    r.spec = s;
    r.o = o;
    r.is_gpt = !strcmp(s->model.type, "gpt");
    const spec_hparams_t *hp = &s->hp;

    if (o->world > 1 && !o->hooks.grads_finish)
        return kiln_err_set(err, KILN_EUNSUPP, "resources",
                            "data parallelism not available in this build (world size %d)",
                            o->world);
    if (s->dist.mp_partitions > 1)
        return kiln_err_set(err, KILN_EUNSUPP, "distribution.model_parallel.partitions",
                            "pipeline parallelism not available in this build");
    if ((rc = eng_backend_get(spec_device(s), &r.be, err))) return rc;
    int threads = o->threads > 0 ? o->threads : s->res.threads_per_rank;
    if (r.be == &eng_cpu_backend || r.be == &eng_ref_backend) eng_cpu_set_threads(threads);

    /* batch geometry: global = replicas x micro x accum */
    int replicas = o->world > 0 ? o->world : 1;
    int G = hp->global_batch_size;
    r.B = hp->micro_batch_size > 0 ? hp->micro_batch_size : G / replicas;
    if (r.B < 1 || G % (replicas * r.B) != 0)
        return kiln_err_set(err, KILN_EINVAL, "hyperparameters.micro_batch_size",
                            "global_batch_size %d is not a multiple of replicas (%d) x "
                            "micro_batch_size (%d)", G, replicas, r.B);
    r.accum = G / (replicas * r.B);
    r.T = r.is_gpt ? s->model.seq_len : 1;
    int64_t max_steps = o->max_steps_override > 0 ? o->max_steps_override : hp->max_steps;

    if ((rc = setup_model(&r, err))) goto done;
    if ((rc = setup_data(&r, err))) goto done;
    eng_rng_seed(&r.sample_rng, hp->seed + 0xabcdefULL);
    int64_t start = 0;
    if ((rc = try_resume(&r, &start, err))) goto done;
    if (o->hooks.attach) { /* dp module (additive) */
        eng_train_state_t st = {r.be, r.p, &r.m, &r.v,
                                r.is_gpt ? eng_gpt_num_blocks(r.gpt) : r.mlp->n_layers,
                                run_block_ranges, &r, &start, &r.ts.st, &r.sample_rng,
                                r.model_hash};
        if ((rc = o->hooks.attach(o->hooks.ctx, &st, err))) goto done;
    }
    res->start_step = start;

    r.peak_flops = (o->peak_gflops > 0 ? o->peak_gflops : eng_measure_peak_gflops()) * 1e9;
    double items_per_step = (double)G * r.T;
    printf("kiln-train: %s model, %zu parameters, backend %s, %d threads, B=%d T=%d accum=%d "
           "(global batch %d), %lld steps, peak %.0f GFLOP/s%s\n",
           s->model.type, r.p->n, r.be->name, eng_cpu_threads(), r.B, r.T, r.accum, G,
           (long long)max_steps, r.peak_flops / 1e9, o->peak_gflops > 0 ? " (given)" : " (measured)");
    if (r.be == &eng_cpu_backend)
        printf("cpu: OMP_WAIT_POLICY=%s GOMP_SPINCOUNT=%s OPENBLAS_CORETYPE=%s\n",
               getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "(default)",
               getenv("GOMP_SPINCOUNT") ? getenv("GOMP_SPINCOUNT") : "(default)",
               getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "(auto)");
    if (r.is_gpt)
        printf("data: %zu training tokens, %zu validation tokens\n", r.train.n, r.val.n);
    fflush(stdout);

    res->losses = calloc((size_t)(max_steps > start ? max_steps - start : 1), sizeof(float));
    if (!res->losses) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto done;
    }
    int eval_every = hp->eval_every, sample_every = hp->sample_every;
    int64_t step = start;
    while (step < max_steps) {
        step++;
        double t0 = kiln_mono_s();
        float loss = 0;
        if ((rc = train_step_grads(&r, step, &loss, err))) goto done;
        double norm;
        double lr = eng_lr_at(step, hp->lr, hp->warmup_steps, max_steps, hp->min_lr_fraction);
        if (o->hooks.optimizer_step) { /* dp module (additive) */
            if ((rc = o->hooks.optimizer_step(o->hooks.ctx, step, lr, &norm, err))) goto done;
        } else {
            double sumsq = r.be->sumsq(r.p->grads, r.p->n);
            norm = sqrt(sumsq);
            float scale = 1.0f;
            if (hp->grad_clip > 0 && norm > hp->grad_clip) scale = (float)(hp->grad_clip / norm);
            optimizer_step(&r, step, lr, scale);
        }
        r.be->synchronize();
        double dt = kiln_mono_s() - t0;
        double tps = items_per_step / dt;
        double mfu = r.flops_per_item * tps / r.peak_flops;
        res->losses[res->n_losses++] = loss;
        res->last_train_loss = loss;
        res->steps_done = step;
        if (!isfinite(loss)) {
            rc = kiln_err_set(err, KILN_EINTERNAL, NULL, "training diverged: loss is %f at step %lld",
                              loss, (long long)step);
            goto done;
        }
        if (o->rank == 0) {
            if (!o->quiet) {
                printf("step %lld/%lld | loss %.4f | lr %.1e | norm %.2f | %.1f ms | %.0f %s/s | "
                       "mfu %.1f%%\n", (long long)step, (long long)max_steps, loss, lr, norm,
                       dt * 1e3, tps, r.is_gpt ? "tok" : "ex", mfu * 100);
                fflush(stdout);
            }
            double pm = eng_peak_mem_mb();
            const char *names[] = {"train_loss", "lr", "grad_norm", "step_time_ms",
                                   "tokens_per_s", "mfu", "peak_mem_mb"};
            double vals[] = {loss, lr, norm, dt * 1e3, tps, mfu, pm};
            metric_record(&r, step, names, vals, 7);
        }
        bool last = step == max_steps;
        if ((eval_every > 0 && step % eval_every == 0) || last) {
            float vl = evaluate(&r, err);
            res->last_val_loss = vl;
            if (o->rank == 0 && isfinite(vl)) {
                if (r.is_gpt) {
                    printf("step %lld | val loss %.4f\n", (long long)step, vl);
                } else {
                    printf("step %lld | val loss %.4f | val accuracy %.3f\n", (long long)step, vl,
                           eng_mlp_accuracy(r.mlp, r.B));
                }
                fflush(stdout);
                const char *names[] = {"val_loss"};
                double vals[] = {vl};
                metric_record(&r, step, names, vals, 1);
            }
        }
        if ((sample_every > 0 && step % sample_every == 0) || last) sample_text(&r, step);
        bool stop = (o->stop_flag && *o->stop_flag) ||
                    (o->stop_after_step > 0 && step >= o->stop_after_step);
        bool periodic = s->ckpt_every_steps > 0 && step % s->ckpt_every_steps == 0;
        if (stop || periodic || last) {
            if ((rc = write_checkpoint(&r, step, err))) goto done;
        }
        if (stop && !last) {
            res->stopped = true;
            printf("stopping at step %lld on request (%s)\n", (long long)step,
                   o->checkpoint_dir && *o->checkpoint_dir ? "checkpoint written"
                                                           : "no checkpoint directory");
            fflush(stdout);
            break;
        }
    }
    if (r.is_gpt && o->output_dir && *o->output_dir && o->rank == 0 && !res->stopped &&
        step == max_steps) {
        char path[SPEC_PATH + 32];
        snprintf(path, sizeof(path), "%s/model_llmc.bin", o->output_dir);
        kiln_err_t e2;
        kiln_err_clear(&e2);
        if (kiln_mkdirs(o->output_dir, &e2) == 0 && eng_gpt_llmc_write(r.gpt, path, &e2) == 0)
            printf("final model written to %s (llm.c format)\n", path);
        else
            log_warn("could not write the final model: %s", e2.message);
    }
    res->peak_mem_mb = eng_peak_mem_mb();
    if (o->rank == 0) {
        printf("done: %lld steps, train loss %.4f, val loss %.4f, peak memory %.1f MB\n",
               (long long)step, res->last_train_loss, res->last_val_loss, res->peak_mem_mb);
        fflush(stdout);
    }
    rc = KILN_OK;
done:
    run_deinit(&r);
    if (res == &local) free(local.losses);
    return rc;
}
