/* train.c - the training loop, the only one: a job spec in, a trained model out. Every step
 * runs the passes of its microbatches with gradient accumulation (or a parallel layer's passes:
 * a pipeline schedule), lets the parallel layer reduce the gradients, clips on the global norm,
 * applies AdamW on a warm-up + cosine schedule to the rank's share of the parameters, then
 * evaluates, samples, checkpoints and reports (log lines on stdout, metric records on the
 * metrics fd). Data parallelism and the pipeline join through eng_parallel_t (engine.h); this
 * file never talks to other ranks except through it. Setup is in train_setup.c, checkpoints
 * and samples in train_state.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_int.h"
#include "rank/rank.h"

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

/* ---- the loop's own passes ---------------------------------------------------------------------- */

typedef struct ready_ctx {
    const eng_parallel_t *par;
    bool last_micro;
} ready_ctx_t;

static void on_grads_ready(void *ctx, int block, int ranges)
{
    ready_ctx_t *c = ctx;
    if (c->last_micro && c->par && c->par->grads_ready)
        c->par->grads_ready(c->par->ctx, block, ranges);
}

/* a failure here is the layer's to report (grads_finish, or the next params_wait) */
static void on_block_start(void *ctx, int block)
{
    ready_ctx_t *c = ctx;
    c->par->params_wait(c->par->ctx, block, NULL);
}

/* Microbatch `micro` of the pass: token sequences from sampler s, or synthetic examples of step
 * `step` (1-based): the global batch of step s is examples [(s-1)*G, s*G) after base, split
 * over replicas like the sampler's sequences. */
static void next_batch(eng_run_t *r, eng_sampler_t *s, int64_t step, uint64_t base, int micro, eng_batch_t *b)
{
    const eng_geometry_t *g = &r->geo;
    *b = (eng_batch_t){.B = g->B, .targets = r->tgt};
    if (r->tokens) {
        eng_sampler_micro(s, micro, g->B, r->tok, r->tgt);
        b->tokens = r->tok;
        return;
    }
    int replica = r->par ? r->par->replica : 0;
    for (int i = 0; i < g->B; i++) {
        uint64_t idx = base + (uint64_t)(step - 1) * g->global + (uint64_t)replica * g->per_replica +
                       (uint64_t)micro * g->B + i;
        eng_synth_example(&r->synth, idx, r->xbuf + (size_t)i * r->spec->model.n_inputs, &r->tgt[i]);
    }
    b->x = r->xbuf;
}

/* Forward (and backward when train) of `passes` microbatches (next_batch's: from sampler s, or
 * examples of index `index` after `base`). Adds each microbatch's mean loss to *sum. */
static void own_passes(eng_run_t *r, eng_sampler_t *s, int64_t index, uint64_t base, int passes,
                       bool train, double *sum, double *count)
{
    ready_ctx_t rc = {r->par, false};
    bool wait = r->par && r->par->params_wait;
    const eng_model_ops_t *ops = r->model.ops;
    for (int mi = 0; mi < passes; mi++) {
        eng_batch_t b;
        rc.last_micro = mi == passes - 1;
        next_batch(r, s, index, base, mi, &b);
        *sum += ops->forward(&r->model, r->acts, &b, wait ? on_block_start : NULL, &rc);
        if (train) ops->backward(&r->model, r->acts, r->dloss, on_grads_ready, &rc);
        *count += 1;
    }
}

static int run_passes(eng_run_t *r, eng_sampler_t *s, int64_t index, uint64_t base, int passes,
                      bool train, double *sum, double *count, kiln_err_t *err)
{
    if (r->par && r->par->run_passes)
        return r->par->run_passes(r->par->ctx, s, passes, train, sum, count, err);
    own_passes(r, s, index, base, passes, train, sum, count);
    return KILN_OK;
}

/* ---- one step ------------------------------------------------------------------------------------ */

typedef struct adamw_args {
    eng_run_t *r;
    int64_t step;
    double lr;
    float scale;
} adamw_args_t;

/* AdamW of one step over [lo, lo + n) of the flat buffer, cut at tensor boundaries for weight
 * decay. With bf16 the update also writes the bf16 working copy of the weights. */
static void adamw_range(void *ctx, size_t lo, size_t n)
{
    const adamw_args_t *a = ctx;
    eng_run_t *r = a->r;
    const spec_hparams_t *hp = &r->spec->hp;
    const eng_params_t *p = r->p;
    uint16_t *wbf = r->bf16 ? r->model.ops->bf16->weights(r->model.impl) : NULL;
    size_t hi = lo + n;
    for (int i = 0; i < p->n_tensors; i++) {
        const eng_tensor_t *t = &p->tensors[i];
        size_t x = t->off > lo ? t->off : lo, y = t->off + t->n < hi ? t->off + t->n : hi;
        if (x >= y) continue;
        float wd = t->decay ? (float)hp->weight_decay : 0.0f;
        if (wbf)
            r->be->bf16->adamw_update(p->params + x, wbf + x, p->grads + x, r->m + x, r->v + x,
                                      y - x, (float)a->lr, (float)hp->beta1, (float)hp->beta2,
                                      (float)hp->eps, wd, a->scale, a->step);
        else
            r->be->adamw_update(p->params + x, p->grads + x, r->m + x, r->v + x, y - x,
                                (float)a->lr, (float)hp->beta1, (float)hp->beta2, (float)hp->eps,
                                wd, a->scale, a->step);
    }
}

/* AdamW over the rank's update ranges: through the parallel layer, which chooses the order. */
static int adamw(eng_run_t *r, int64_t step, double lr, float scale, kiln_err_t *err)
{
    adamw_args_t a = {r, step, lr, scale};
    if (r->par && r->par->update) return r->par->update(r->par->ctx, adamw_range, &a, err);
    for (int k = 0; k < r->share.update.n; k++)
        adamw_range(&a, r->share.update.r[k].off, r->share.update.r[k].n);
    return KILN_OK;
}

static int cmp_off(const void *a, const void *b)
{
    const eng_range_t *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Rounds the held parameters into the bf16 copy, except (skip_updated) the update ranges,
 * whose AdamW wrote it already: what is left is what reached this rank otherwise (ZeRO's
 * all-gather, the pipeline's tied embedding). The update ranges are sorted. */
static void refresh_bf16(eng_run_t *r, bool skip_updated)
{
    const eng_ranges_t *u = &r->share.update;
    void (*refresh)(void *, size_t, size_t) = r->model.ops->bf16->refresh;
    for (int i = 0; i < r->share.held.n; i++) {
        size_t pos = r->share.held.r[i].off, end = pos + r->share.held.r[i].n;
        for (int k = 0; skip_updated && k < u->n && pos < end; k++) {
            size_t c = u->r[k].off, d = c + u->r[k].n;
            if (d <= pos || c >= end) continue;
            if (c > pos) refresh(r->model.impl, pos, c - pos);
            pos = d;
        }
        if (pos < end) refresh(r->model.impl, pos, end - pos);
    }
}

/* Before the loop reads every parameter (not in its own forward): the parallel layer's. */
static int params_all(eng_run_t *r, kiln_err_t *err)
{
    return r->par && r->par->params_wait ? r->par->params_wait(r->par->ctx, -1, err) : KILN_OK;
}

typedef struct step_out {
    float loss;
    double norm, lr;
    bool stop;
} step_out_t;

static int train_step(eng_run_t *r, int64_t step, int64_t max_steps, step_out_t *out,
                      kiln_err_t *err)
{
    const spec_hparams_t *hp = &r->spec->hp;
    const eng_parallel_t *par = r->par;
    int rc;
    for (int i = 0; i < r->share.held.n; i++)
        r->be->memset_zero(r->p->grads + r->share.held.r[i].off,
                           r->share.held.r[i].n * sizeof(float));
    if (r->tokens) eng_sampler_next_step(&r->ts);
    /* scalars summed over the ranks: squared-norm partials, losses, their count, stop requests */
    double sc[4] = {0, 0, 0, 0};
    if ((rc = run_passes(r, &r->ts, step, 0, r->geo.passes, true, &sc[1], &sc[2], err)))
        return rc;
    if (par && par->grads_finish && (rc = par->grads_finish(par->ctx, err))) return rc;
    for (int i = 0; i < r->share.norm.n; i++)
        sc[0] += r->be->sumsq(r->p->grads + r->share.norm.r[i].off, r->share.norm.r[i].n);
    sc[3] = (r->o->stop_flag && *r->o->stop_flag) ||
            (r->o->stop_after_step > 0 && step >= r->o->stop_after_step);
    if ((rc = eng_run_sum(r, sc, 4, err))) return rc;
    out->loss = sc[2] > 0 ? (float)(sc[1] / sc[2]) : NAN;
    out->norm = sqrt(sc[0]);
    out->stop = sc[3] > 0;
    float scale = 1.0f;
    if (hp->grad_clip > 0 && out->norm > hp->grad_clip) scale = (float)(hp->grad_clip / out->norm);
    out->lr = eng_lr_at(step, hp->lr, hp->warmup_steps, max_steps, hp->min_lr_fraction);
    if ((rc = adamw(r, step, out->lr, scale, err))) return rc;
    if (par && par->after_update && (rc = par->after_update(par->ctx, step, err))) return rc;
    /* the bf16 copy is rounded from every held parameter, the gathered ones too */
    if (r->bf16 && (rc = params_all(r, err))) return rc;
    if (r->bf16) refresh_bf16(r, true);
    r->be->synchronize();
    if (r->be->status && (rc = r->be->status(r->be->ctx, err))) return rc;
    return KILN_OK;
}

/* Validation: the first eval_batches batches of the validation stream (sequential, fixed), each
 * replica its shard of micro sequences per batch; for the MLP a fixed held-out index range. */
static int evaluate(eng_run_t *r, float *out, kiln_err_t *err)
{
    int rc = KILN_OK, nb = r->spec->hp.eval_batches > 0 ? r->spec->hp.eval_batches : 1;
    double sc[2] = {0, 0};
    *out = NAN;
    if (r->tokens) {
        eng_sampler_t vs;
        if (r->val.n < (size_t)r->geo.T + 1) return KILN_OK;
        if ((rc = eng_sampler_init(&vs, &r->val, r->geo.T, r->geo.micro * r->geo.replicas,
                                   r->par ? r->par->replica : 0, r->geo.replicas, false, 0, err)))
            return rc;
        for (int i = 0; i < nb && !rc; i++) {
            eng_sampler_next_step(&vs);
            rc = run_passes(r, &vs, 0, 0, 1, false, &sc[0], &sc[1], err);
        }
        eng_sampler_deinit(&vs);
    } else {
        for (int i = 0; i < nb; i++) own_passes(r, NULL, i + 1, (uint64_t)1 << 48, 1, false, &sc[0], &sc[1]);
    }
    if (rc || (rc = eng_run_sum(r, sc, 2, err))) return rc;
    *out = sc[1] > 0 ? (float)(sc[0] / sc[1]) : NAN;
    return KILN_OK;
}

/* ---- setup ---------------------------------------------------------------------------------------- */

/* What this backend and layout can run: the capability table with the backend the run has (the
 * same refusals as at submission, which could only assume one), then what this machine has. */
static int check_layout(eng_run_t *r, kiln_err_t *err)
{
    const spec_t *s = r->spec;
    int rc;
    if (r->world > 1 && !r->par)
        return kiln_err_set(err, KILN_EUNSUPP, "resources",
                            "a job of %d ranks needs a parallel layer to join them (eng_job_run)",
                            r->world);
    if (s->dist.mp_partitions > 1 && !(r->par && r->par->run_passes))
        return kiln_err_set(err, KILN_EUNSUPP, "distribution.model_parallel.partitions",
                            "%d partitions need the pipeline layer (eng_job_run)",
                            s->dist.mp_partitions);
    if ((rc = spec_caps_check(s, r->be->name, err))) return rc;
    if (r->bf16 && !r->be->bf16) /* a build of the backend without its bf16 group */
        return spec_cap_refuse(SPEC_CAP_BF16, s->model.type, r->be->name, err);
    if (r->bf16) return r->be->bf16->available(err);
    return KILN_OK;
}

static int setup(eng_run_t *r, int64_t *start, kiln_err_t *err)
{
    const eng_parallel_t *par = r->par;
    int rc, head_blocks = 1;
    if ((rc = eng_backend_get(spec_device(r->spec), &r->be, err))) return rc;
    if ((rc = check_layout(r, err))) return rc;
    int threads = r->o->threads > 0 ? r->o->threads : r->spec->res.threads_per_rank;
    if (r->be->host_memory) eng_cpu_set_threads(threads);
    if ((rc = eng_geometry_init(&r->geo, r->spec, par ? par->replicas : 1,
                                par ? par->microbatches : 1, err)))
        return rc;
    r->dloss = 1.0f / ((float)r->geo.per_replica * (float)r->geo.T);
    if ((rc = eng_run_find_resume(r, err))) return rc;
    if (par && par->prepare && (rc = par->prepare(par->ctx, r->resume_src, &head_blocks, err)))
        return rc;
    if ((rc = eng_run_setup_model(r, head_blocks, err))) return rc;
    if (par && par->attach) {
        eng_train_state_t st = {r->be, &r->model, r->m, r->v, r->geo.B, r->geo.T, r->geo.passes, r->dloss,
                                &r->share};
        if ((rc = par->attach(par->ctx, &st, err))) return rc;
    }
    qsort(r->share.update.r, (size_t)r->share.update.n, sizeof(eng_range_t), cmp_off);
    if ((rc = eng_run_init_params(r, err)) || (rc = eng_run_setup_data(r, err))) return rc;
    eng_rng_seed(&r->sample_rng, r->spec->hp.seed + 0xabcdefULL);
    if ((rc = eng_run_load_resume(r, start, err))) return rc;
    if (r->bf16) refresh_bf16(r, false);
    return KILN_OK;
}

static void log_start(eng_run_t *r, int64_t max_steps, double peak_flops)
{
    const spec_t *s = r->spec;
    if (r->rank != 0) return;
    printf("kiln-train: %s model, %zu parameters, backend %s%s, %d threads, B=%d T=%d passes=%d "
           "(global batch %d), %lld steps, peak %.0f GFLOP/s%s\n",
           s->model.type, r->p->n, r->be->name, r->bf16 ? " (bf16 GEMMs, fp32 master weights)" : "",
           eng_cpu_threads(), r->geo.B, r->geo.T, r->geo.passes, r->geo.global,
           (long long)max_steps, peak_flops / 1e9, r->o->peak_gflops > 0 ? " (given)" : " (measured)");
    if (r->par)
        printf("parallel: %s, rank %d of %d, data replica %d of %d\n", r->par->name, r->rank,
               r->world, r->par->replica, r->par->replicas);
    if (s->dist.activation_checkpointing)
        printf("activation checkpointing: blocks recompute their activations in backward\n");
    if (r->be == &eng_cpu_backend) {
        printf("cpu: OMP_WAIT_POLICY=%s GOMP_SPINCOUNT=%s OPENBLAS_CORETYPE=%s\n",
               getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "(default)",
               getenv("GOMP_SPINCOUNT") ? getenv("GOMP_SPINCOUNT") : "(default)",
               getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "(auto)");
        const char *sgemm = eng_cpu_sgemm_name();
        printf("cpu: fp32 GEMMs on %s\n", sgemm);
        if (eng_cpu_coretype_holds_back() && !strncmp(sgemm, "OpenBLAS", 8))
            printf("cpu: OPENBLAS_CORETYPE=%s holds OpenBLAS to kernels without AVX-512 on a CPU that has it; "
                   "fp32 GEMMs may run up to 1.6x slower\n", getenv("OPENBLAS_CORETYPE"));
    }
    if (r->tokens)
        printf("data: %zu training tokens, %zu validation tokens\n", r->train.n, r->val.n);
    fflush(stdout);
}

/* ---- the run ---------------------------------------------------------------------------------- */

/* The step the lines that follow belong to, on both streams (rank/rank.h): a regex metric the
 * agent matches on one of them lands at this step. */
static void mark_step(const eng_run_t *r, int64_t step)
{
    if (!r->o->step_marks) return;
    rank_step_mark_write(stdout, step);
    rank_step_mark_write(stderr, step);
}

/* Per-step log line and metric record (rank 0); the parallel layer's metrics are collective. */
static int report_step(eng_run_t *r, int64_t step, int64_t max_steps, const step_out_t *so,
                       double dt, double peak_flops, kiln_err_t *err)
{
    const eng_parallel_t *par = r->par;
    double tps = (double)r->geo.global * r->geo.T / dt;
    double mfu = r->model.flops_per_item * tps / peak_flops;
    const char *names[16] = {SPEC_ENGINE_STEP_METRICS};
    double vals[16] = {so->loss, so->lr, so->norm, dt * 1e3, tps, mfu, eng_peak_mem_mb()};
    int n = 7, extra = 0, rc;
    if (par && par->step_metrics && (rc = par->step_metrics(par->ctx, names + n, vals + n, 16 - n, &extra, err)))
        return rc;
    n += extra;
    if (r->rank != 0) return KILN_OK;
    if (!r->o->quiet) {
        printf("step %lld/%lld | loss %.4f | lr %.1e | norm %.2f | %.1f ms | %.0f %s/s | mfu %.1f%%",
               (long long)step, (long long)max_steps, so->loss, so->lr, so->norm, dt * 1e3, tps,
               r->tokens ? "tok" : "ex", mfu * 100);
        for (int i = 7; i < n; i++) printf(" | %s %.3g", names[i], vals[i]);
        printf("\n");
        fflush(stdout);
    }
    eng_run_metric(r, step, names, vals, n);
    return KILN_OK;
}

int eng_train_run(const spec_t *s, const eng_train_opts_t *o, eng_train_result_t *res,
                  kiln_err_t *err)
{
    eng_run_t r;
    eng_train_result_t local;
    int rc;
    memset(&r, 0, sizeof(r));
    if (!res) res = &local;
    memset(res, 0, sizeof(*res));
    res->last_val_loss = NAN;
    r.spec = s;
    r.o = o;
    r.par = o->parallel;
    r.rank = o->rank;
    r.world = o->world > 0 ? o->world : 1;
    r.tokens = strcmp(s->data.format, "synthetic") != 0;
    r.bf16 = !strcmp(s->dist.mixed_precision, "bf16");
    const spec_hparams_t *hp = &s->hp;
    int64_t max_steps = o->max_steps_override > 0 ? o->max_steps_override : hp->max_steps;
    int64_t start = 0, step = 0;

    if ((rc = setup(&r, &start, err))) goto fail;
    res->start_step = start;
    if (start > 0) mark_step(&r, start); /* what a resumed run says before its first step */
    /* MFU against every rank's peak: tokens per second are the whole job's */
    double peak_flops = (o->peak_gflops > 0 ? o->peak_gflops : eng_measure_peak_gflops()) * 1e9 *
                        r.world;
    log_start(&r, max_steps, peak_flops / r.world);
    res->losses = calloc((size_t)(max_steps > start ? max_steps - start : 1), sizeof(float));
    if (!res->losses) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto fail;
    }
    step = start;
    res->steps_done = start;
    if (s->pause_at_step > 0 && start >= s->pause_at_step && start < max_steps) {
        /* resumed at or past its stopping.max_steps (the same attempt launched again after it
         * paused there): still paused, nothing trained past it */
        res->paused = true;
        if (r.rank == 0) {
            printf("paused at step %lld (stopping.max_steps %lld; resumed there, nothing to train)\n",
                   (long long)start, (long long)s->pause_at_step);
            fflush(stdout);
        }
    }
    while (!res->paused && step < max_steps) {
        step++;
        mark_step(&r, step);
        double t0 = kiln_mono_s();
        step_out_t so;
        if ((rc = train_step(&r, step, max_steps, &so, err))) goto fail;
        double dt = kiln_mono_s() - t0;
        res->losses[res->n_losses++] = so.loss;
        res->last_train_loss = so.loss;
        res->steps_done = step;
        if (!isfinite(so.loss)) {
            rc = kiln_err_set(err, KILN_EINTERNAL, NULL, "training diverged: loss is %f at step %lld",
                              so.loss, (long long)step);
            goto fail;
        }
        if ((rc = report_step(&r, step, max_steps, &so, dt, peak_flops, err))) goto fail;
        bool last = step == max_steps;
        /* stopping.max_steps: paused here with a checkpoint (and evaluated, so the pause reports
         * val_loss); the schedule still spans max_steps */
        bool pause = s->pause_at_step > 0 && step == s->pause_at_step && !last;
        bool eval = (hp->eval_every > 0 && step % hp->eval_every == 0) || last || pause;
        bool sample = (hp->sample_every > 0 && step % hp->sample_every == 0) || last;
        bool periodic = s->ckpt_every_steps > 0 && step % s->ckpt_every_steps == 0;
        bool ckpt = (so.stop || periodic || last || pause) && r.checkpoints;
        if ((eval || sample || ckpt || so.stop || last) && (rc = params_all(&r, err))) goto fail;
        if (eval) {
            float vl;
            if ((rc = evaluate(&r, &vl, err))) goto fail;
            res->last_val_loss = vl;
            if (r.rank == 0 && isfinite(vl)) {
                if (r.model.ops->accuracy && r.acts)
                    printf("step %lld | val loss %.4f | val accuracy %.3f\n", (long long)step, vl,
                           r.model.ops->accuracy(&r.model, r.acts));
                else
                    printf("step %lld | val loss %.4f\n", (long long)step, vl);
                fflush(stdout);
                const char *names[] = {SPEC_ENGINE_VAL_METRIC};
                double vals[] = {vl};
                eng_run_metric(&r, step, names, vals, 1);
            }
        }
        if (sample) eng_run_sample(&r, step);
        if (ckpt && (rc = eng_run_checkpoint(&r, step, err))) goto fail;
        if (so.stop && !last) {
            res->stopped = true;
            if (r.rank == 0) {
                printf("stopping at step %lld on request (%s)\n", (long long)step,
                       r.checkpoints ? "checkpoint written" : "no checkpoint directory");
                fflush(stdout);
            }
            break;
        }
        if (pause) {
            res->paused = true;
            if (r.rank == 0) {
                printf("paused at step %lld (stopping.max_steps; %s)\n", (long long)step,
                       r.checkpoints ? "checkpoint written" : "no checkpoint directory");
                fflush(stdout);
            }
            break;
        }
    }
    if (!res->stopped && step == max_steps && r.writes_model && (rc = eng_run_write_model(&r, err)))
        goto fail;
    res->peak_mem_mb = eng_peak_mem_mb();
    if (r.rank == 0) {
        /* a run that evaluated nothing (stopped or preempted before its first eval_every, or none
         * asked) has no val loss: "nan" read as a diverged model */
        char val[48] = "val loss not measured";
        if (!isnan(res->last_val_loss))
            snprintf(val, sizeof val, "val loss %.4f", res->last_val_loss);
        printf("done: %lld steps, train loss %.4f, %s, peak memory %.1f MB\n", (long long)step,
               res->last_train_loss, val, res->peak_mem_mb);
        fflush(stdout);
    }
    if (r.par && r.par->detach) r.par->detach(r.par->ctx);
    eng_run_deinit(&r);
    if (res == &local) free(local.losses);
    return KILN_OK;
fail:
    if (r.par && r.par->detach) r.par->detach(r.par->ctx);
    eng_run_deinit(&r);
    if (res == &local) free(local.losses);
    return rc;
}
