/* dp.c - data-parallel training over comm/: gradient buckets all-reduced while backward runs,
 * global-norm clipping from per-shard partial sums, optional ZeRO-1 optimizer-state sharding,
 * a per-step agreement (stop requests, optional parameter-identity check), and the state sync
 * that makes every rank start (or resume) from the same bytes.
 * It is not the training loop (engine/train.c): everything here runs from its hooks. */
#include "engine/dp/dp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec/spec.h"

typedef struct dp_bucket {
    size_t n;              /* floats */
    float *buf;            /* (n) packed gradients; view into dp->slab */
    int nr;
    eng_range_t *r;        /* (nr) flat-buffer ranges, packed in this order; view into dp->ranges */
    comm_req_t *req;       /* in flight, or NULL */
    bool launched;
} dp_bucket_t;

struct dp {
    comm_t *c;             /* borrowed */
    const spec_t *s;       /* borrowed */
    dp_opts_t o;
    int rank, world;
    volatile int stop;     /* agreed stop request */

    bool attached;
    const eng_backend_t *be;
    eng_params_t *p;       /* borrowed from the trainer */
    float *m, *v;          /* full moments (borrowed from the trainer), or this rank's shard (owned) */
    size_t sh_off, sh_n;   /* this rank's shard of the flat buffer (norm partial sums, ZeRO) */
    float *ck_m, *ck_v;    /* (n) gathered moments for a checkpoint (rank 0, ZeRO); owned */

    int n_buckets;
    dp_bucket_t *b;        /* (n_buckets) in launch order: from the last block backwards */
    int n_blocks;
    int *launch_at;        /* (n_blocks) bucket launched when that block is ready, or -1 */
    eng_range_t *ranges;   /* all bucket ranges; owned */
    float *slab;           /* all bucket buffers; owned */
    float *xbuf;           /* (world * 4) scratch for exact gathers; owned */

    int err_status;
    char err_msg[256];
    dp_stats_t st;
};

/* ---- options -------------------------------------------------------------------------------- */

void dp_opts_init(dp_opts_t *o, const spec_t *s)
{
    memset(o, 0, sizeof(*o));
    o->bucket_mb = s && s->dist.dp_bucket_mb > 0 ? s->dist.dp_bucket_mb : 25.0;
    o->overlap = true;
    o->shard_optimizer_state = s ? s->dist.dp_shard_optimizer_state : false;
    o->inject_rank = -1;
}

static int env_bool(const char *name, bool *out, kiln_err_t *err)
{
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    if (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "yes")) *out = true;
    else if (!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "no")) *out = false;
    else return kiln_err_set(err, KILN_EINVAL, name, "%s must be 0 or 1, not \"%s\"", name, v);
    return 0;
}

int dp_opts_from_env(dp_opts_t *o, kiln_err_t *err)
{
    int rc;
    if ((rc = env_bool("KILN_DP_CHECK", &o->check, err)) ||
        (rc = env_bool("KILN_DP_OVERLAP", &o->overlap, err)) ||
        (rc = env_bool("KILN_DP_ZERO", &o->shard_optimizer_state, err)))
        return rc;
    const char *v = getenv("KILN_DP_BUCKET_MB");
    if (v && *v) {
        char *end;
        double x = strtod(v, &end);
        if (*end || !(x > 0))
            return kiln_err_set(err, KILN_EINVAL, "KILN_DP_BUCKET_MB",
                                "KILN_DP_BUCKET_MB must be a positive number, not \"%s\"", v);
        o->bucket_mb = x;
    }
    v = getenv("KILN_DP_INJECT_DIVERGENCE");
    if (v && *v) {
        int r;
        long long st;
        if (sscanf(v, "%d:%lld", &r, &st) != 2)
            return kiln_err_set(err, KILN_EINVAL, "KILN_DP_INJECT_DIVERGENCE",
                                "KILN_DP_INJECT_DIVERGENCE must be RANK:STEP, not \"%s\"", v);
        o->inject_rank = r;
        o->inject_step = st;
    }
    return 0;
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

int dp_create(comm_t *c, const spec_t *s, const dp_opts_t *o, dp_t **out, kiln_err_t *err)
{
    *out = NULL;
    if (!c || !s || !o) return kiln_err_set(err, KILN_EINVAL, NULL, "dp_create: missing argument");
    dp_t *d = calloc(1, sizeof(*d));
    if (!d) return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    d->c = c;
    d->s = s;
    d->o = *o;
    if (!(d->o.bucket_mb > 0)) d->o.bucket_mb = 25;
    d->rank = comm_rank(c);
    d->world = comm_size(c);
    d->xbuf = calloc((size_t)d->world * 4, sizeof(float));
    if (!d->xbuf) {
        free(d);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    *out = d;
    return 0;
}

static void wait_all(dp_t *d)
{
    for (int i = 0; i < d->n_buckets; i++) {
        comm_wait(d->b[i].req, NULL);
        d->b[i].req = NULL;
        d->b[i].launched = false;
    }
}

void dp_destroy(dp_t *d)
{
    if (!d) return;
    wait_all(d);
    if (d->o.shard_optimizer_state && d->be) {
        d->be->free(d->m);
        d->be->free(d->v);
    }
    if (d->be) {
        d->be->free(d->ck_m);
        d->be->free(d->ck_v);
    }
    free(d->b);
    free(d->launch_at);
    free(d->ranges);
    free(d->slab);
    free(d->xbuf);
    free(d);
}

volatile int *dp_stop_flag(dp_t *d) { return &d->stop; }
const char *dp_last_error(const dp_t *d) { return d->err_msg; }
void dp_get_stats(const dp_t *d, dp_stats_t *out) { *out = d->st; }

/* Remembers the first communication error (its message names the dead rank). */
static int fail(dp_t *d, int status, const kiln_err_t *e, kiln_err_t *err, const char *what)
{
    if (!d->err_status) {
        d->err_status = status;
        snprintf(d->err_msg, sizeof(d->err_msg), "%s", e && e->message[0] ? e->message : kiln_strerror(status));
    }
    if (err) kiln_err_set(err, status, NULL, "%s: %s", what, d->err_msg);
    return status;
}

/* ---- exact gathers of 64-bit values through the float all-reduce ----------------------------- */

/* Every rank contributes one 64-bit value; *all (OUT, world entries) receives everyone's. Each
 * value travels as four 16-bit pieces, each exact in a float, in its own rank's row of a
 * zero-filled buffer, so the sum-all-reduce only ever adds zeros: the result is exact. */
static int gather_u64(dp_t *d, uint64_t mine, uint64_t *all, kiln_err_t *err)
{
    size_t n = (size_t)d->world * 4;
    memset(d->xbuf, 0, n * sizeof(float));
    for (int k = 0; k < 4; k++) d->xbuf[d->rank * 4 + k] = (float)((mine >> (16 * k)) & 0xffff);
    kiln_err_t e;
    kiln_err_clear(&e);
    int rc = comm_allreduce(d->c, d->xbuf, n, COMM_SUM, &e);
    if (rc) return fail(d, rc, &e, err, "data-parallel agreement failed");
    for (int r = 0; r < d->world; r++) {
        uint64_t x = 0;
        for (int k = 0; k < 4; k++) x |= (uint64_t)d->xbuf[r * 4 + k] << (16 * k);
        all[r] = x;
    }
    return 0;
}

/* Sum of a double over ranks, added in rank order: identical bits on every rank. */
static int sum_double(dp_t *d, double *x, kiln_err_t *err)
{
    uint64_t mine, all[d->world];
    memcpy(&mine, x, sizeof(mine));
    int rc = gather_u64(d, mine, all, err);
    if (rc) return rc;
    double s = 0;
    for (int r = 0; r < d->world; r++) {
        double v;
        memcpy(&v, &all[r], sizeof(v));
        s += v;
    }
    *x = s;
    return 0;
}

static int hook_allreduce_sum(void *ctx, double *x)
{
    return sum_double(ctx, x, NULL);
}

/* ---- buckets -------------------------------------------------------------------------------- */

static int plan_buckets(dp_t *d, const eng_train_state_t *st, kiln_err_t *err)
{
    int nb = st->n_blocks, total = 0;
    eng_range_t tmp[ENG_MAX_TENSORS];
    for (int b = 0; b < nb; b++) total += st->block_ranges(st->model, b, tmp);
    eng_range_t *all = calloc((size_t)total + 1, sizeof(*all));
    int *owner = calloc((size_t)total + 1, sizeof(int));
    d->ranges = calloc((size_t)total + 1, sizeof(eng_range_t));
    d->launch_at = malloc(sizeof(int) * (size_t)nb);
    d->b = calloc((size_t)nb, sizeof(dp_bucket_t));
    if (!all || !owner || !d->ranges || !d->launch_at || !d->b) {
        free(all);
        free(owner);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    /* A range listed by several blocks (tied embeddings) is final after the lowest of them:
     * it belongs to that block's bucket. */
    int na = 0;
    for (int b = 0; b < nb; b++) {
        int k = st->block_ranges(st->model, b, tmp);
        for (int i = 0; i < k; i++) {
            int j;
            for (j = 0; j < na; j++)
                if (all[j].off == tmp[i].off && all[j].n == tmp[i].n) break;
            if (j == na) {
                all[na] = tmp[i];
                owner[na++] = b;
            } else if (b < owner[j]) {
                owner[j] = b;
            }
        }
    }
    size_t covered = 0;
    for (int j = 0; j < na; j++) covered += all[j].n;
    if (covered != st->p->n) {
        free(all);
        free(owner);
        return kiln_err_set(err, KILN_EINTERNAL, NULL,
                            "block ranges cover %zu of %zu parameters", covered, st->p->n);
    }
    /* Fill buckets in the order backward finishes blocks (last block first), closing a bucket
     * at a block boundary once it holds bucket_mb. */
    size_t cap = (size_t)(d->o.bucket_mb * 1024 * 1024 / sizeof(float));
    if (cap < 1) cap = 1;
    int nr = 0;
    dp_bucket_t *cur = NULL;
    for (int b = nb - 1; b >= 0; b--) {
        d->launch_at[b] = -1;
        for (int j = 0; j < na; j++) {
            if (owner[j] != b) continue;
            if (!cur) {
                cur = &d->b[d->n_buckets++];
                cur->r = &d->ranges[nr];
            }
            d->ranges[nr++] = all[j];
            cur->nr++;
            cur->n += all[j].n;
        }
        if (cur && (cur->n >= cap || b == 0)) {
            d->launch_at[b] = (int)(cur - d->b);
            cur = NULL;
        }
    }
    free(all);
    free(owner);
    d->slab = malloc(sizeof(float) * (st->p->n ? st->p->n : 1));
    if (!d->slab) return kiln_err_set(err, KILN_ENOMEM, NULL, "could not allocate gradient buckets");
    size_t off = 0;
    for (int i = 0; i < d->n_buckets; i++) {
        d->b[i].buf = d->slab + off;
        off += d->b[i].n;
        if (d->b[i].n > d->st.max_bucket_floats) d->st.max_bucket_floats = d->b[i].n;
    }
    d->n_blocks = nb;
    d->st.n_buckets = d->n_buckets;
    return 0;
}

static void launch(dp_t *d, int i)
{
    dp_bucket_t *bk = &d->b[i];
    if (bk->launched) return;
    bk->launched = true;
    if (d->err_status) return;
    const float *g = d->p->grads;
    size_t off = 0;
    for (int k = 0; k < bk->nr; k++) {
        memcpy(bk->buf + off, g + bk->r[k].off, bk->r[k].n * sizeof(float));
        off += bk->r[k].n;
    }
    kiln_err_t e;
    kiln_err_clear(&e);
    int rc = comm_allreduce_start(d->c, bk->buf, bk->n, COMM_AVG, &bk->req, &e);
    if (rc) {
        bk->req = NULL;
        fail(d, rc, &e, NULL, NULL);
    }
}

static void hook_grads_ready(void *ctx, int block)
{
    dp_t *d = ctx;
    if (!d->o.overlap || d->o.shard_optimizer_state || block < 0 || block >= d->n_blocks) return;
    int i = d->launch_at[block];
    if (i < 0) return;
    /* buckets go out in order on every rank, so every rank submits the same sequence */
    for (int k = 0; k <= i; k++)
        if (!d->b[k].launched) {
            launch(d, k);
            d->st.early_launches++;
        }
}

static int hook_grads_finish(void *ctx, float *grads, size_t n)
{
    dp_t *d = ctx;
    double t0 = kiln_mono_s();
    int rc = 0;
    (void)n;
    if (d->o.shard_optimizer_state) {
        /* ZeRO-1: only this rank's shard of the averaged gradient is needed */
        kiln_err_t e;
        kiln_err_clear(&e);
        if (!d->err_status && (rc = comm_reduce_scatter(d->c, grads, d->p->n, COMM_AVG, &e)))
            fail(d, rc, &e, NULL, NULL);
    } else {
        for (int i = 0; i < d->n_buckets; i++) launch(d, i);
        for (int i = 0; i < d->n_buckets; i++) {
            dp_bucket_t *bk = &d->b[i];
            kiln_err_t e;
            kiln_err_clear(&e);
            int r = comm_wait(bk->req, &e);
            bk->req = NULL;
            bk->launched = false;
            if (r) fail(d, r, &e, NULL, NULL);
            if (d->err_status) continue;
            size_t off = 0;
            for (int k = 0; k < bk->nr; k++) {
                memcpy(grads + bk->r[k].off, bk->buf + off, bk->r[k].n * sizeof(float));
                off += bk->r[k].n;
            }
        }
    }
    d->st.finish_wait_s += kiln_mono_s() - t0;
    return d->err_status ? d->err_status : 0;
}

/* ---- the optimizer step --------------------------------------------------------------------- */

static uint64_t param_hash(const float *x, size_t n)
{
    const uint32_t *w = (const uint32_t *)x;
    uint64_t h = 1469598103934665603ULL ^ n;
    for (size_t i = 0; i < n; i++) {
        h ^= w[i];
        h *= 0x100000001b3ULL;
        h ^= h >> 29;
    }
    return h;
}

/* Every rank learns whether any rank asked to stop and, in check mode, whether all ranks hold
 * the same parameters (a hash of them, compared exactly). */
static int agree(dp_t *d, int64_t step, kiln_err_t *err)
{
    uint64_t h = 0, all[d->world];
    if (d->o.check) h = param_hash(d->p->params, d->p->n) & ~1ULL;
    bool local = d->o.local_stop && *d->o.local_stop;
    int rc = gather_u64(d, h | (local ? 1 : 0), all, err);
    if (rc) return rc;
    int stop = 0;
    for (int r = 0; r < d->world; r++) stop |= (int)(all[r] & 1);
    if (stop) d->stop = 1;
    if (!d->o.check) return 0;
    for (int r = 1; r < d->world; r++)
        if ((all[r] & ~1ULL) != (all[0] & ~1ULL)) {
            char who[128] = "";
            size_t len = 0;
            for (int k = 1; k < d->world && len < sizeof(who) - 12; k++)
                if ((all[k] & ~1ULL) != (all[0] & ~1ULL))
                    len += snprintf(who + len, sizeof(who) - len, "%s%d", len ? ", " : "", k);
            return kiln_err_set(err, KILN_EINTERNAL, NULL,
                                "data-parallel parameters diverged after step %lld: rank(s) %s "
                                "differ from rank 0 (hash %016llx vs %016llx)",
                                (long long)step, who, (unsigned long long)(all[r] & ~1ULL),
                                (unsigned long long)(all[0] & ~1ULL));
        }
    return 0;
}

static int hook_optimizer_step(void *ctx, int64_t step, double lr, double *grad_norm,
                               kiln_err_t *err)
{
    dp_t *d = ctx;
    const spec_hparams_t *hp = &d->s->hp;
    const eng_params_t *p = d->p;
    double t0 = kiln_mono_s();
    int rc;
    if (d->err_status) return fail(d, d->err_status, NULL, err, "data-parallel step failed");
    /* the checkpoint copies of a sharded state live only until the next update */
    d->be->free(d->ck_m);
    d->be->free(d->ck_v);
    d->ck_m = d->ck_v = NULL;

    /* Global norm from per-shard partial sums: the same arithmetic with and without ZeRO, so
     * both give the same bits. */
    double sumsq = d->sh_n ? d->be->sumsq(p->grads + d->sh_off, d->sh_n) : 0.0;
    if ((rc = sum_double(d, &sumsq, err))) return rc;
    double norm = sqrt(sumsq);
    float scale = 1.0f;
    if (hp->grad_clip > 0 && norm > hp->grad_clip) scale = (float)(hp->grad_clip / norm);
    *grad_norm = norm;

    size_t lo = d->o.shard_optimizer_state ? d->sh_off : 0;
    size_t hi = d->o.shard_optimizer_state ? d->sh_off + d->sh_n : p->n;
    for (int i = 0; i < p->n_tensors; i++) {
        const eng_tensor_t *t = &p->tensors[i];
        size_t a = t->off > lo ? t->off : lo, b = t->off + t->n < hi ? t->off + t->n : hi;
        if (a >= b) continue;
        d->be->adamw_update(p->params + a, p->grads + a, d->m + (a - lo), d->v + (a - lo), b - a,
                            (float)lr, (float)hp->beta1, (float)hp->beta2, (float)hp->eps,
                            t->decay ? (float)hp->weight_decay : 0.0f, scale, step);
    }
    if (d->o.shard_optimizer_state) {
        kiln_err_t e;
        kiln_err_clear(&e);
        if ((rc = comm_allgather(d->c, p->params, p->n, &e)))
            return fail(d, rc, &e, err, "parameter all-gather failed");
    }
    if (d->o.inject_step > 0 && step == d->o.inject_step && d->rank == d->o.inject_rank) {
        float one_ulp_more = nextafterf(p->params[p->n / 2], INFINITY);
        p->params[p->n / 2] = one_ulp_more;
        printf("dp: rank %d perturbed one parameter after step %lld (KILN_DP_INJECT_DIVERGENCE)\n",
               d->rank, (long long)step);
        fflush(stdout);
    }
    if ((rc = agree(d, step, err))) return rc;
    d->st.steps++;
    d->st.comm_s += kiln_mono_s() - t0;
    return 0;
}

/* ZeRO-1 checkpoints: rank 0 gathers every shard of m and v and writes the usual full file. */
static int hook_ckpt_state(void *ctx, const float **m, const float **v, kiln_err_t *err)
{
    dp_t *d = ctx;
    if (!d->o.shard_optimizer_state) return 0;
    size_t n = d->p->n;
    int rc = 0;
    kiln_err_t e;
    kiln_err_clear(&e);
    if (d->rank == 0) {
        if (!d->ck_m) d->ck_m = d->be->alloc(n * sizeof(float));
        if (!d->ck_v) d->ck_v = d->be->alloc(n * sizeof(float));
        if (!d->ck_m || !d->ck_v)
            return kiln_err_set(err, KILN_ENOMEM, NULL, "could not allocate the checkpoint's optimizer state");
        memcpy(d->ck_m + d->sh_off, d->m, d->sh_n * sizeof(float));
        memcpy(d->ck_v + d->sh_off, d->v, d->sh_n * sizeof(float));
        for (int r = 1; r < d->world && !rc; r++) {
            size_t off, cnt;
            comm_shard_range(n, r, d->world, &off, &cnt);
            if (!cnt) continue;
            if (!(rc = comm_recv(d->c, d->ck_m + off, cnt * sizeof(float), r, 0x6d, NULL, &e)))
                rc = comm_recv(d->c, d->ck_v + off, cnt * sizeof(float), r, 0x76, NULL, &e);
        }
        *m = d->ck_m;
        *v = d->ck_v;
    } else if (d->sh_n) {
        if (!(rc = comm_send(d->c, d->m, d->sh_n * sizeof(float), 0, 0x6d, &e)))
            rc = comm_send(d->c, d->v, d->sh_n * sizeof(float), 0, 0x76, &e);
    }
    if (rc) return fail(d, rc, &e, err, "gathering the optimizer state for a checkpoint failed");
    return 0;
}

/* ---- attach: same starting bytes everywhere ------------------------------------------------- */

static int bcast(dp_t *d, void *buf, size_t len, int root, kiln_err_t *err)
{
    kiln_err_t e;
    kiln_err_clear(&e);
    int rc = comm_bcast(d->c, buf, len, root, &e);
    return rc ? fail(d, rc, &e, err, "data-parallel state broadcast failed") : 0;
}

static int hook_attach(void *ctx, eng_train_state_t *st, kiln_err_t *err)
{
    dp_t *d = ctx;
    int rc;
    if (strcmp(st->be->name, "cpu") != 0 && strcmp(st->be->name, "ref") != 0)
        return kiln_err_set(err, KILN_EUNSUPP, "resources.device",
                            "data parallelism runs on host memory; backend \"%s\" needs the NCCL "
                            "path, which this build does not have", st->be->name);
    d->be = st->be;
    d->p = st->p;
    comm_shard_range(st->p->n, d->rank, d->world, &d->sh_off, &d->sh_n);
    /* ZeRO-1 reduce-scatters the flat buffer in place: no bucket copies needed */
    if (!d->o.shard_optimizer_state && (rc = plan_buckets(d, st, err))) return rc;

    /* Resume point: the newest checkpoint any rank found (agents may hold different ones);
     * the lowest rank holding it sends the state to everyone. Model fingerprints must match. */
    uint64_t steps[d->world], hashes[d->world];
    if ((rc = gather_u64(d, st->model_hash, hashes, err))) return rc;
    for (int r = 0; r < d->world; r++)
        if (hashes[r] != hashes[0])
            return kiln_err_set(err, KILN_EINVAL, "model",
                                "rank %d built a different model than rank 0", r);
    if ((rc = gather_u64(d, (uint64_t)*st->step, steps, err))) return rc;
    int src = 0;
    for (int r = 1; r < d->world; r++)
        if (steps[r] > steps[src]) src = r;
    size_t nb = st->p->n * sizeof(float);
    if ((rc = bcast(d, st->p->params, nb, src, err))) return rc;
    if (steps[src] > 0) {
        if ((rc = bcast(d, *st->m, nb, src, err)) || (rc = bcast(d, *st->v, nb, src, err)) ||
            (rc = bcast(d, st->sampler, sizeof(*st->sampler), src, err)) ||
            (rc = bcast(d, st->sample_rng, sizeof(*st->sample_rng), src, err)))
            return rc;
        if ((int64_t)steps[src] != *st->step)
            printf("dp: rank %d takes the state of step %llu from rank %d\n", d->rank,
                   (unsigned long long)steps[src], src);
        *st->step = (int64_t)steps[src];
    }

    d->st.opt_state_full_bytes = 2 * nb;
    if (d->o.shard_optimizer_state) {
        size_t sb = (d->sh_n ? d->sh_n : 1) * sizeof(float);
        d->m = d->be->alloc(sb);
        d->v = d->be->alloc(sb);
        if (!d->m || !d->v) return kiln_err_set(err, KILN_ENOMEM, NULL, "could not allocate the optimizer shard");
        memcpy(d->m, *st->m + d->sh_off, d->sh_n * sizeof(float));
        memcpy(d->v, *st->v + d->sh_off, d->sh_n * sizeof(float));
        d->be->free(*st->m);
        d->be->free(*st->v);
        *st->m = *st->v = NULL;
        d->st.opt_state_bytes = 2 * d->sh_n * sizeof(float);
    } else {
        d->m = *st->m;
        d->v = *st->v;
        d->st.opt_state_bytes = 2 * nb;
    }
    d->attached = true;
    if (d->o.shard_optimizer_state)
        printf("dp: rank %d/%d over %s: ZeRO-1, gradients reduce-scattered after backward, "
               "parameters all-gathered after the update%s\n", d->rank, d->world,
               comm_provider(d->c), d->o.check ? ", parameter check every step" : "");
    else
        printf("dp: rank %d/%d over %s: %d gradient buckets (largest %.2f MiB) all-reduced %s "
               "backward%s\n", d->rank, d->world, comm_provider(d->c), d->n_buckets,
               d->st.max_bucket_floats * 4.0 / (1 << 20), d->o.overlap ? "during" : "after",
               d->o.check ? ", parameter check every step" : "");
    if (d->o.shard_optimizer_state)
        printf("dp: rank %d keeps AdamW state for %zu of %zu parameters: %.1f MiB instead of "
               "%.1f MiB (saves %.1f MiB)\n", d->rank, d->sh_n, st->p->n,
               d->st.opt_state_bytes / 1048576.0, d->st.opt_state_full_bytes / 1048576.0,
               (d->st.opt_state_full_bytes - d->st.opt_state_bytes) / 1048576.0);
    fflush(stdout);
    return 0;
}

void dp_hooks(dp_t *d, eng_train_hooks_t *out)
{
    memset(out, 0, sizeof(*out));
    out->ctx = d;
    out->grads_ready = hook_grads_ready;
    out->grads_finish = hook_grads_finish;
    out->allreduce_sum = hook_allreduce_sum;
    out->attach = hook_attach;
    out->optimizer_step = hook_optimizer_step;
    out->ckpt_state = hook_ckpt_state;
}

/* ---- kiln-train's entry --------------------------------------------------------------------- */

int dp_train_run(const spec_t *s, const eng_train_opts_t *opts, comm_t *world,
                 eng_train_result_t *res, dp_stats_t *stats, kiln_err_t *err)
{
    comm_t *c = world;
    dp_t *d = NULL;
    int rc;
    if (res) memset(res, 0, sizeof(*res));
    if (!c && (rc = comm_create_from_env(&c, err))) return rc;
    dp_opts_t o;
    dp_opts_init(&o, s);
    if ((rc = dp_opts_from_env(&o, err))) goto done;
    o.local_stop = opts->stop_flag;
    if ((rc = dp_create(c, s, &o, &d, err))) goto done;
    eng_train_opts_t to = *opts;
    to.rank = comm_rank(c);
    to.world = comm_size(c);
    to.stop_flag = dp_stop_flag(d);
    dp_hooks(d, &to.hooks);
    rc = eng_train_run(s, &to, res, err);
    if (rc && d->err_msg[0] && !strstr(err->message, d->err_msg)) {
        char msg[sizeof(err->message) + sizeof(d->err_msg) + 4];
        snprintf(msg, sizeof(msg), "%s: %s", err->message, d->err_msg);
        kiln_strlcpy(err->message, msg, sizeof(err->message));
    }
    if (stats) dp_get_stats(d, stats);
    if (rc == 0 && to.rank == 0) {
        printf("dp: %lld steps on %d ranks, %lld buckets launched during backward, %.2f s waiting "
               "for gradients, %.2f s in optimizer collectives\n", (long long)d->st.steps,
               to.world, (long long)d->st.early_launches, d->st.finish_wait_s, d->st.comm_s);
        fflush(stdout);
    }
done:
    dp_destroy(d);
    if (!world) comm_destroy(c);
    return rc;
}
