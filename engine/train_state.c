/* train_state.c - the training loop's state on disk and between ranks: finding the checkpoint a
 * job resumes from (the newest any rank holds) and handing it to every rank, writing
 * checkpoints and the final model from rank 0 after the parallel layer gathers what other
 * ranks own, text samples, metric records, and the rank-ordered sums of per-step scalars.
 * A checkpoint always holds the whole model in the flat layout, whatever the run's layout.
 * It does not run steps (train.c) nor build the model (train_setup.c). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine_int.h"
#include "rank/rank.h"

/* ---- collectives through the parallel layer --------------------------------------------------- */

int eng_run_sum(eng_run_t *r, double *x, int n, kiln_err_t *err)
{
    if (!r->par || r->world <= 1) return KILN_OK;
    double *slots = calloc((size_t)r->world * n, sizeof(double));
    if (!slots) return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    memcpy(slots + (size_t)r->rank * n, x, sizeof(double) * n);
    int rc = r->par->allgather(r->par->ctx, slots, sizeof(double) * n, err);
    if (rc == 0)
        for (int i = 0; i < n; i++) {
            double s = 0;
            for (int k = 0; k < r->world; k++) s += slots[(size_t)k * n + i];
            x[i] = s;
        }
    free(slots);
    return rc;
}

/* n floats of buf from root to every rank, through host memory when buf is on a device. */
static int bcast_floats(eng_run_t *r, float *buf, size_t n, int root, kiln_err_t *err)
{
    const eng_backend_t *be = r->be;
    if (be->host_memory) return r->par->bcast(r->par->ctx, buf, n * sizeof(float), root, err);
    size_t chunk = (size_t)4 << 20;
    float *tmp = malloc(sizeof(float) * chunk);
    int rc = tmp ? KILN_OK : kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    for (size_t i = 0; i < n && !rc; i += chunk) {
        size_t k = n - i < chunk ? n - i : chunk;
        if (r->rank == root) be->to_host(tmp, buf + i, k * sizeof(float));
        rc = r->par->bcast(r->par->ctx, tmp, k * sizeof(float), root, err);
        if (!rc && r->rank != root) be->to_device(buf + i, tmp, k * sizeof(float));
    }
    free(tmp);
    return rc;
}

/* ---- pages a rank does not need ------------------------------------------------------------- */

static int cmp_off(const void *a, const void *b)
{
    const eng_range_t *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Discards the parts of buf (n floats) outside the ranges of l (sorted in place). */
static void release_outside(const eng_backend_t *be, float *buf, size_t n, eng_ranges_t *l)
{
    if (!be->discard || !buf) return;
    qsort(l->r, (size_t)l->n, sizeof(l->r[0]), cmp_off);
    size_t pos = 0;
    for (int i = 0; i <= l->n; i++) {
        size_t end = i < l->n ? l->r[i].off : n;
        if (end > pos) be->discard(buf + pos, (end - pos) * sizeof(float));
        if (i < l->n && l->r[i].off + l->r[i].n > pos) pos = l->r[i].off + l->r[i].n;
    }
}

void eng_run_release(eng_run_t *r)
{
    size_t n = r->p->n;
    release_outside(r->be, r->p->params, n, &r->share.held);
    release_outside(r->be, r->p->grads, n, &r->share.held);
    release_outside(r->be, r->m, n, &r->share.update);
    release_outside(r->be, r->v, n, &r->share.update);
}

/* ---- resume ------------------------------------------------------------------------------------ */

static int64_t ckpt_step_of(const char *path)
{
    const char *base = strrchr(path, '/');
    long long s = 0;
    if (sscanf(base ? base + 1 : path, "ckpt_%lld.bin", &s) != 1) return 0;
    return s;
}

int eng_run_find_resume(eng_run_t *r, kiln_err_t *err)
{
    const char *dir = r->o->checkpoint_dir, *out = r->o->output_dir;
    r->resume_src = -1;
    r->resume_step = 0;
    r->resume_path[0] = '\0';
    int64_t mine = 0;
    /* fresh_start: step 0, whatever the directories hold (they keep it; the run writes beside it) */
    if (!r->o->fresh_start && dir && *dir &&
        eng_ckpt_find_latest(dir, r->resume_path, sizeof(r->resume_path)) == 0)
        mine = ckpt_step_of(r->resume_path);
    const char *from = r->o->resume_from;
    char other[sizeof(r->resume_path)];
    if (!r->o->fresh_start && from && *from && eng_ckpt_find_latest(from, other, sizeof(other)) == 0 && ckpt_step_of(other) > mine) {
        mine = ckpt_step_of(other);
        memcpy(r->resume_path, other, sizeof(other));
    }
    /* per rank: its newest checkpoint's step, whether it has a checkpoint and an output
     * directory (rank 0's say whether the job checkpoints and writes a model: the gathers
     * behind both are collective) */
    double me[3] = {(double)mine, dir && *dir, out && *out};
    double *slots = me;
    int rc = KILN_OK, world = r->par ? r->world : 1;
    if (world > 1) {
        slots = calloc((size_t)world * 3, sizeof(double));
        if (!slots) return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        memcpy(slots + 3 * (size_t)r->rank, me, sizeof(me));
        rc = r->par->allgather(r->par->ctx, slots, sizeof(me), err);
    }
    /* the newest checkpoint any rank holds; the lowest rank holding it hands it out (ranks on
     * other nodes may hold an older one, or none) */
    for (int k = 0; rc == 0 && k < world; k++)
        if (slots[3 * k] > (double)r->resume_step) {
            r->resume_step = (int64_t)slots[3 * k];
            r->resume_src = k;
        }
    r->checkpoints = rc == 0 && slots[1] != 0;
    r->writes_model = rc == 0 && slots[2] != 0;
    if (slots != me) free(slots);
    return rc;
}

int eng_run_load_resume(eng_run_t *r, int64_t *start, kiln_err_t *err)
{
    int rc;
    *start = 0;
    if (r->resume_src < 0) return KILN_OK;
    size_t n = r->p->n;
    eng_ckpt_meta_t meta;
    memset(&meta, 0, sizeof(meta));
    meta.model_hash = r->model.hash;
    /* int64 pair: the reading rank's status and step, so every rank fails together */
    int64_t hdr[2] = {0, 0};
    if (r->rank == r->resume_src) {
        hdr[0] = eng_ckpt_read(r->resume_path, &meta, r->be, r->p->params, r->m, r->v, n, err);
        hdr[1] = meta.step;
    }
    if (r->par && r->world > 1) {
        if ((rc = r->par->bcast(r->par->ctx, hdr, sizeof(hdr), r->resume_src, err))) return rc;
        if (hdr[0] != 0)
            return r->rank == r->resume_src
                       ? (int)hdr[0]
                       : kiln_err_set(err, KILN_EIO, "checkpoint",
                                      "rank %d could not read its checkpoint of step %lld",
                                      r->resume_src, (long long)r->resume_step);
        if ((rc = r->par->bcast(r->par->ctx, &meta, sizeof(meta), r->resume_src, err)) ||
            (rc = bcast_floats(r, r->p->params, n, r->resume_src, err)) ||
            (rc = bcast_floats(r, r->m, n, r->resume_src, err)) ||
            (rc = bcast_floats(r, r->v, n, r->resume_src, err)))
            return rc;
    } else if (hdr[0] != 0) {
        return (int)hdr[0];
    }
    r->ts.st = meta.train;
    r->sample_rng = meta.sample_rng;
    *start = meta.step;
    eng_run_release(r);
    if (r->rank == r->resume_src)
        printf("resumed from %s at step %lld\n", r->resume_path, (long long)meta.step);
    else if (!r->o->quiet)
        printf("resumed from rank %d's checkpoint at step %lld\n", r->resume_src,
               (long long)meta.step);
    fflush(stdout);
    return KILN_OK;
}

/* ---- checkpoints and the final model ---------------------------------------------------------- */

static int gather(eng_run_t *r, float *buf, kiln_err_t *err)
{
    return r->par && r->par->gather ? r->par->gather(r->par->ctx, buf, err) : KILN_OK;
}

int eng_run_checkpoint(eng_run_t *r, int64_t step, kiln_err_t *err)
{
    const char *dir = r->o->checkpoint_dir;
    int rc;
    if ((rc = gather(r, r->p->params, err)) || (rc = gather(r, r->m, err)) ||
        (rc = gather(r, r->v, err)))
        return rc;
    if (r->rank == 0) {
        if (r->par && r->par->checkpoint_extra &&
            (rc = r->par->checkpoint_extra(r->par->ctx, dir, err)))
            return rc;
        eng_ckpt_meta_t meta;
        memset(&meta, 0, sizeof(meta));
        meta.step = step;
        meta.train = r->ts.st;
        meta.sample_rng = r->sample_rng;
        meta.model_hash = r->model.hash;
        meta.n_params = r->p->n;
        double t0 = kiln_mono_s();
        if ((rc = eng_ckpt_write(dir, &meta, r->be, r->p->params, r->m, r->v, r->p->n,
                                 r->spec->ckpt_keep_last, err)))
            return rc;
        printf("checkpoint: step %lld written to %s/ckpt_%08lld.bin (%.2f s)\n", (long long)step,
               dir, (long long)step, kiln_mono_s() - t0);
        fflush(stdout);
        /* what preempting the job loses is the steps since this (the scheduler reads it) */
        const char *names[] = {"checkpoint_step"};
        double vals[] = {(double)step};
        eng_run_metric(r, step, names, vals, 1);
    }
    eng_run_release(r);
    return KILN_OK;
}

int eng_run_write_model(eng_run_t *r, kiln_err_t *err)
{
    int rc;
    const eng_model_file_t *file = r->model.ops->file;
    if (!file) return KILN_OK; /* a model without a file format leaves none */
    if ((rc = gather(r, r->p->params, err))) return rc;
    if (r->rank == 0) {
        char path[SPEC_PATH + 32];
        kiln_err_t e2;
        kiln_err_clear(&e2);
        snprintf(path, sizeof(path), "%s/%s", r->o->output_dir, file->name);
        if (kiln_mkdirs(r->o->output_dir, &e2) == 0 && file->write(&r->model, path, &e2) == 0)
            printf("final model written to %s (%s format)\n", path, file->format);
        else
            log_warn("could not write the final model: %s", e2.message);
        fflush(stdout);
    }
    eng_run_release(r);
    return KILN_OK;
}

/* ---- text samples --------------------------------------------------------------------------- */

static void print_sample(eng_run_t *r, int64_t step, const char *text)
{
    const spec_hparams_t *hp = &r->spec->hp;
    printf("sample at step %lld (temperature %.2f, top_k %d):\n", (long long)step,
           hp->temperature, hp->top_k);
    /* one log line per text line, so the agent's line-based forwarding keeps the shape */
    char *save = NULL, *copy = strdup(text);
    for (char *line = copy ? strtok_r(copy, "\n", &save) : NULL; line;
         line = strtok_r(NULL, "\n", &save))
        printf("  | %s\n", line);
    free(copy);
    fflush(stdout);
    if (!r->o->output_dir || !*r->o->output_dir) return;
    if (!r->samples) {
        char path[SPEC_PATH + 32];
        kiln_err_t e2;
        kiln_mkdirs(r->o->output_dir, &e2);
        snprintf(path, sizeof(path), "%s/samples.txt", r->o->output_dir);
        r->samples = fopen(path, "a");
    }
    if (r->samples) {
        fprintf(r->samples, "=== step %lld (temperature %.2f, top_k %d)\n%s\n\n", (long long)step,
                hp->temperature, hp->top_k, text);
        fflush(r->samples);
    }
}

void eng_run_sample(eng_run_t *r, int64_t step)
{
    const spec_hparams_t *hp = &r->spec->hp;
    if (!r->model.ops->sample || hp->sample_tokens <= 0 || strcmp(r->spec->model.vocab, "bytes") != 0)
        return;
    kiln_err_t err;
    kiln_err_clear(&err);
    if (gather(r, r->p->params, &err)) {
        log_warn("sampling: could not gather the parameters: %s", err.message);
        return;
    }
    if (r->rank == 0) {
        const char *prompt = r->o->sample_prompt && *r->o->sample_prompt ? r->o->sample_prompt : "\n";
        int np = (int)strlen(prompt), n = hp->sample_tokens;
        int32_t *toks = malloc(sizeof(int32_t) * (size_t)(np + n + 1));
        char *text = malloc((size_t)np + n + 1);
        if (toks && text) {
            for (int i = 0; i < np; i++) toks[i] = (uint8_t)prompt[i];
            if (r->model.ops->sample(&r->model, toks, np, n, hp->temperature, hp->top_k, &r->sample_rng,
                                     toks, &err) == 0) {
                for (int i = 0; i < np + n; i++) text[i] = (char)toks[i];
                text[np + n] = '\0';
                print_sample(r, step, text);
            } else {
                log_warn("sampling failed: %s", err.message);
            }
        }
        free(toks);
        free(text);
    }
    eng_run_release(r);
}

/* ---- metric records ------------------------------------------------------------------------- */

void eng_run_metric(eng_run_t *r, int64_t step, const char *const *names, const double *vals,
                    int n)
{
    if (r->o->metrics_fd < 0 || r->rank != 0 || n <= 0) return;
    kiln_err_t err;
    if (rank_metric_write(r->o->metrics_fd, step, kiln_now_us() / 1e6, names, vals, (size_t)n, &err) != 0 &&
        !r->metrics_broken) {
        /* training goes on: metrics are a report, not the work */
        r->metrics_broken = true;
        log_warn("metric records: %s (further failures are not reported)", err.message);
    }
}
