/* dp.c - data parallelism over comm/ (host tensors) or the backend's device collectives: the
 * bucket plan, buckets launched while backward runs, ZeRO-1's reduce-scatter and all-gather,
 * each rank's shard of every bucket (its share of the global norm, and under ZeRO of the
 * update), ZeRO's parameter all-gather (left running into the next forward when the loop's
 * layer), the parameter-identity check, gathering shards for a checkpoint, and the training
 * loop's parallel layer for plain data-parallel jobs.
 * It is not the training loop (engine/train.c): everything here runs from its hooks. */
#include "engine/dp/dp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec/spec.h"

#define TAG_SHARDS 0x64700000u

/* A contiguous piece of a bucket's shard: flat-buffer offset, offset in the packed bucket. */
typedef struct dp_piece {
    size_t flat, packed, n;
} dp_piece_t;

typedef struct dp_bucket {
    size_t n;              /* floats */
    float *buf;            /* (n) packed gradients (or parameters, for ZeRO's all-gather) */
    int nr;
    eng_range_t *r;        /* (nr) flat-buffer ranges, packed in this order; view into ranges */
    int np;
    dp_piece_t *pieces;    /* (np) this rank's shard of the bucket; view into d->pieces */
    comm_req_t *req;       /* in flight (host), or NULL */
    bool launched;
    int close_block;       /* complete once backward has finished block close_block's first */
    int close_ranges;      /* close_ranges ranges (ENG_RANGES_ALL: the whole block) */
} dp_bucket_t;

struct dp {
    comm_t *c;             /* borrowed */
    dp_opts_t o;
    int rank, world;

    const eng_backend_t *be;
    eng_params_t *p;       /* borrowed */
    bool device;           /* buckets in device memory, reduced by be->coll */
    eng_dev_comm_t *dev;

    int n_buckets;
    dp_bucket_t *b;        /* (n_buckets) in launch order: from the last block backwards */
    int n_blocks;
    int next_launch;       /* buckets before it are launched this step */
    eng_range_t *ranges;   /* all bucket ranges; owned */
    dp_piece_t *pieces;    /* all buckets' shard pieces; owned */
    float *slab;           /* all bucket buffers (backend memory); owned */
    size_t total;          /* floats the layer averages */
    float *host;           /* (max shard) host staging for gathers and checks; owned */
    size_t host_n;

    /* ZeRO's parameter all-gather, started in forward order (last bucket first): bucket by
     * bucket while the loop's AdamW runs (dp_update), else after the update. As the loop's
     * layer on host memory it is left running into the next step's forward, which waits per
     * block (dp_params_wait): buckets >= gathered are back in the parameters, the rest in
     * flight. */
    bool loop_layer;       /* dp_parallel's: the loop calls params_wait before reading them */
    bool gather_started;   /* dp_update started this step's all-gather, bucket by bucket */
    int gathered;          /* d->n_buckets .. 0; 0: nothing in flight */
    int *need_from;        /* (n_blocks) lowest bucket holding a range of the block */

    /* the wait notice: steps measured from one after_update to the next, in windows of
     * WAIT_WINDOW steps; the first window whose wait share passes WAIT_SHARE is logged, once */
    double step_end;       /* when the last after_update returned; 0: none yet */
    double window_wait0;   /* finish_wait_s + params_wait_s at the window's start */
    double window_s;       /* the window's steps' time so far */
    int window_steps;

    int err_status;
    char err_msg[256];
    dp_stats_t st;
};

/* ---- options -------------------------------------------------------------------------------- */

void dp_opts_init(dp_opts_t *o, const spec_t *s)
{
    memset(o, 0, sizeof(*o));
    o->bucket_mb = s && s->dist.dp_bucket_mb > 0 ? s->dist.dp_bucket_mb : 0;
    o->overlap = true;
    o->shard_optimizer_state = s ? s->dist.dp_shard_optimizer_state : false;
    o->bf16_gradients = s && !strcmp(s->dist.dp_gradient_dtype, "bf16");
    o->inject_rank = -1;
    o->watchdog_s = COMM_WATCHDOG_DEFAULT_S;
}

void dp_settings_apply(dp_opts_t *o, const eng_settings_t *s)
{
    if (!s) return;
    o->check = s->dp_check;
    o->overlap = s->dp_overlap;
    if (s->dp_zero) o->shard_optimizer_state = !strcmp(s->dp_zero, "1");
    if (s->dp_bucket_mb > 0) o->bucket_mb = s->dp_bucket_mb;
    if (s->dp_gradient_dtype) o->bf16_gradients = !strcmp(s->dp_gradient_dtype, "bf16");
    if (s->dp_inject_rank >= 0) {
        o->inject_rank = (int)s->dp_inject_rank;
        o->inject_step = s->dp_inject_step;
    }
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

int dp_create(comm_t *c, const dp_opts_t *o, dp_t **out, kiln_err_t *err)
{
    *out = NULL;
    if (!c || !o) return kiln_err_set(err, KILN_EINVAL, NULL, "dp_create: missing argument");
    dp_t *d = calloc(1, sizeof(*d));
    if (!d) return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    d->c = c;
    d->o = *o;
    if (!(d->o.bucket_mb > 0)) d->o.bucket_mb = 0; /* chosen by plan_buckets */
    if (!(d->o.watchdog_s > 0)) d->o.watchdog_s = COMM_WATCHDOG_DEFAULT_S;
    d->rank = comm_rank(c);
    d->world = comm_size(c);
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
    d->next_launch = 0;
    if (d->dev) d->be->coll->wait(d->dev, d->o.watchdog_s, NULL);
}

void dp_destroy(dp_t *d)
{
    if (!d) return;
    wait_all(d);
    if (d->dev) d->be->coll->destroy(d->dev);
    if (d->be) d->be->free(d->slab);
    free(d->b);
    free(d->ranges);
    free(d->pieces);
    free(d->need_from);
    free(d->host);
    free(d);
}

void dp_get_stats(const dp_t *d, dp_stats_t *out) { *out = d->st; }

/* Remembers the first communication error (its message names the dead rank). */
static int fail(dp_t *d, int status, const kiln_err_t *e, kiln_err_t *err, const char *what)
{
    if (!d->err_status) {
        d->err_status = status;
        snprintf(d->err_msg, sizeof(d->err_msg), "%s", e && e->message[0] ? e->message : kiln_strerror(status));
    }
    if (err) kiln_err_set(err, d->err_status, NULL, "%s: %s", what, d->err_msg);
    return d->err_status;
}

/* ---- the bucket plan ------------------------------------------------------------------------ */

/* The pieces of shard `rank` of bucket bk (OUT, at most bk->nr); returns the count. */
static int shard_pieces(const dp_t *d, const dp_bucket_t *bk, int rank, dp_piece_t *out)
{
    size_t so, sn, pos = 0;
    int n = 0;
    comm_shard_range(bk->n, rank, d->world, &so, &sn);
    for (int k = 0; k < bk->nr; k++) {
        size_t a = pos > so ? pos : so, e = pos + bk->r[k].n < so + sn ? pos + bk->r[k].n : so + sn;
        if (a < e) out[n++] = (dp_piece_t){bk->r[k].off + (a - pos), a, e - a};
        pos += bk->r[k].n;
    }
    return n;
}

/* The bounds of a chosen bucket on the wire, per transport (bench/RESULTS.md, "Bucket size
 * chosen from the model"). Between hosts a collective's fixed cost is a few hundred
 * microseconds (a ring step's round trips and the communication thread's wake-ups): 256 KiB
 * takes ~2 ms at 1 Gbit/s, so a bucket of at least that keeps the fixed cost near a tenth;
 * within a host the transfer itself is fast (GB/s) and a bucket below 1 MiB buys no overlap
 * worth its packing and wake-ups; NCCL's launches are cheap but its links are fast, and
 * PyTorch DDP's first bucket is 1 MB. Every transport stops at DDP's 25 MB: past it the first
 * bucket leaves late and the last one sent after backward is long. */
static const struct {
    const char *name;
    double min_mib, max_mib;
} g_bounds[] = {
    [DP_TRANSPORT_SHM] = {"shm", 1.0, 25.0},
    [DP_TRANSPORT_NETWORK] = {"tcp;ofi_rxm", 0.25, 25.0},
    [DP_TRANSPORT_DEVICE] = {"device collectives", 1.0, 25.0},
};

const char *dp_bucket_bounds(dp_transport_t t, double *min_mib, double *max_mib)
{
    if ((unsigned)t > DP_TRANSPORT_DEVICE) t = DP_TRANSPORT_NETWORK;
    if (min_mib) *min_mib = g_bounds[t].min_mib;
    if (max_mib) *max_mib = g_bounds[t].max_mib;
    return g_bounds[t].name;
}

double dp_bucket_mb_choose(size_t n, bool bf16_wire, dp_transport_t t)
{
    double lo, hi, per = bf16_wire ? 2.0 : 4.0;
    dp_bucket_bounds(t, &lo, &hi);
    double wire_mib = (double)n * per / (1 << 20) / DP_BUCKETS_TARGET;
    wire_mib = wire_mib < lo ? lo : wire_mib > hi ? hi : wire_mib;
    return wire_mib / per * sizeof(float); /* the same floats, in MiB of fp32 */
}

static dp_transport_t transport(const dp_t *d)
{
    if (d->device) return DP_TRANSPORT_DEVICE;
    return !strcmp(comm_provider(d->c), "shm") ? DP_TRANSPORT_SHM : DP_TRANSPORT_NETWORK;
}

/* Groups the blocks' ranges into buckets in the order backward finishes them (last block
 * first, a block's ranges in their listed order), closing a bucket after a range once it holds
 * bucket_mb: backward reports parts of a block (eng_grads_ready_fn), so the first bucket leaves
 * as soon as its gradients exist and the last ones left after backward are small. A range
 * listed by several blocks (a tied embedding) is final after the lowest of them and goes in
 * its bucket. */
static int plan_buckets(dp_t *d, int nb, int (*block_ranges)(const void *, int, eng_range_t *),
                        const void *model, kiln_err_t *err)
{
    int total = 0, na = 0, rc = KILN_OK;
    eng_range_t tmp[ENG_MAX_TENSORS], *all = NULL;
    int *owner = NULL;
    for (int b = 0; b < nb; b++) total += block_ranges(model, b, tmp);
    all = calloc((size_t)total + 1, sizeof(*all));
    owner = calloc((size_t)total + 1, sizeof(int));
    d->ranges = calloc((size_t)total + 1, sizeof(eng_range_t));
    d->pieces = calloc((size_t)total + 1, sizeof(dp_piece_t));
    int *pos = calloc((size_t)total + 1, sizeof(int));
    d->b = calloc((size_t)total + 1, sizeof(dp_bucket_t));
    if (!all || !owner || !pos || !d->ranges || !d->pieces || !d->b) goto nomem;
    for (int b = 0; b < nb; b++) {
        int k = block_ranges(model, b, tmp);
        for (int i = 0; i < k; i++) {
            int j;
            for (j = 0; j < na; j++)
                if (all[j].off == tmp[i].off && all[j].n == tmp[i].n) break;
            if (j == na) {
                all[na] = tmp[i];
                pos[na] = i;
                owner[na++] = b;
            } else if (b < owner[j]) {
                owner[j] = b;
                pos[j] = i;
            }
        }
    }
    size_t n_all = 0;
    for (int j = 0; j < na; j++) n_all += all[j].n;
    d->st.bucket_chosen = !(d->o.bucket_mb > 0);
    d->st.bucket_mb = d->st.bucket_chosen ? dp_bucket_mb_choose(n_all, d->o.bf16_gradients, transport(d))
                                          : d->o.bucket_mb;
    size_t cap = (size_t)(d->st.bucket_mb * 1024 * 1024 / sizeof(float)), off = 0;
    if (cap < 1) cap = 1;
    int nr = 0, np = 0;
    dp_bucket_t *cur = NULL;
    for (int b = nb - 1; b >= 0; b--) {
        int k = block_ranges(model, b, tmp);
        for (int i = 0; i < k; i++) {
            int j;
            for (j = 0; j < na; j++)
                if (owner[j] == b && pos[j] == i) break;
            if (j == na) continue; /* final after a lower block */
            if (!cur) {
                cur = &d->b[d->n_buckets++];
                cur->r = &d->ranges[nr];
            }
            d->ranges[nr++] = all[j];
            cur->nr++;
            cur->n += all[j].n;
            if (cur->n >= cap) {
                cur->close_block = b;
                cur->close_ranges = i + 1;
                cur = NULL;
            }
        }
        if (cur && b == 0) {
            cur->close_block = 0;
            cur->close_ranges = ENG_RANGES_ALL;
            cur = NULL;
        }
    }
    d->n_blocks = nb;
    for (int i = 0; i < d->n_buckets; i++) {
        dp_bucket_t *bk = &d->b[i];
        bk->pieces = d->pieces + np;
        bk->np = shard_pieces(d, bk, d->rank, bk->pieces);
        np += bk->np;
        d->total += bk->n;
        if (bk->n > d->st.max_bucket_floats) d->st.max_bucket_floats = bk->n;
    }
    d->slab = d->be->alloc(sizeof(float) * (d->total ? d->total : 1));
    if (!d->slab) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "could not allocate gradient buckets");
        goto done;
    }
    for (int i = 0; i < d->n_buckets; i++) {
        d->b[i].buf = d->slab + off;
        off += d->b[i].n;
    }
    d->st.n_buckets = d->n_buckets;
    if (d->st.bucket_chosen && d->rank == 0) {
        double lo, hi;
        const char *via = dp_bucket_bounds(transport(d), &lo, &hi);
        double per = d->o.bf16_gradients ? 2.0 : 4.0;
        printf("dp: bucket_mb %.3g chosen from the model: %.2f MiB of gradients, %.2f MiB as %s on "
               "the wire over %s, split in %d and kept within %g-%g MiB a bucket there (set "
               "distribution.data_parallel.bucket_mb to choose another)\n",
               d->st.bucket_mb, n_all * 4.0 / (1 << 20), n_all * per / (1 << 20),
               d->o.bf16_gradients ? "bf16" : "fp32", via, DP_BUCKETS_TARGET, lo, hi);
        fflush(stdout);
    }
    /* which buckets a block's forward needs: those holding any of its ranges (a range listed
     * by several blocks, like a tied embedding, sits in one bucket) */
    d->need_from = calloc((size_t)nb + 1, sizeof(int));
    if (!d->need_from) goto nomem;
    for (int b = 0; b < nb; b++) {
        int k = block_ranges(model, b, tmp), lo = d->n_buckets;
        for (int i = 0; i < d->n_buckets; i++)
            for (int j = 0; j < d->b[i].nr && lo > i; j++)
                for (int q = 0; q < k; q++)
                    if (d->b[i].r[j].off < tmp[q].off + tmp[q].n &&
                        tmp[q].off < d->b[i].r[j].off + d->b[i].r[j].n) {
                        lo = i;
                        break;
                    }
        d->need_from[b] = lo;
    }
    goto done;
nomem:
    rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
done:
    free(all);
    free(owner);
    free(pos);
    return rc;
}

/* The rank's share: every averaged range is updated here (without ZeRO) or only the shards;
 * the shards are its part of the norm either way, so both modes sum the same numbers. */
static int narrow_share(dp_t *d, eng_share_t *share, kiln_err_t *err)
{
    eng_ranges_clear(&share->update);
    eng_ranges_clear(&share->norm);
    size_t own = 0;
    for (int i = 0; i < d->n_buckets; i++) {
        const dp_bucket_t *bk = &d->b[i];
        for (int k = 0; k < bk->np; k++) {
            own += bk->pieces[k].n;
            if (eng_ranges_add(&share->norm, bk->pieces[k].flat, bk->pieces[k].n) ||
                (d->o.shard_optimizer_state &&
                 eng_ranges_add(&share->update, bk->pieces[k].flat, bk->pieces[k].n)))
                return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        }
        for (int k = 0; !d->o.shard_optimizer_state && k < bk->nr; k++)
            if (eng_ranges_add(&share->update, bk->r[k].off, bk->r[k].n))
                return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    d->st.opt_state_full_bytes = 2 * d->total * sizeof(float);
    d->st.opt_state_bytes = 2 * (d->o.shard_optimizer_state ? own : d->total) * sizeof(float);
    return KILN_OK;
}

static int dev_bcast(void *ctx, void *buf, size_t len, kiln_err_t *err)
{
    return comm_bcast(ctx, buf, len, 0, err);
}

int dp_attach(dp_t *d, const eng_backend_t *be, eng_params_t *p, int n_blocks,
              int (*block_ranges)(const void *, int, eng_range_t *), const void *model,
              eng_share_t *share, kiln_err_t *err)
{
    int rc;
    d->be = be;
    d->p = p;
    d->device = !be->host_memory;
    if (d->device && !be->coll)
        return kiln_err_set(err, KILN_EUNSUPP, "resources.device",
                            "data parallelism over the %s backend needs its device collectives, "
                            "which this build does not have", be->name);
    /* the options may come from kiln-train's settings (dp_settings_apply), not only from the spec the
     * loop checked: the capability table's refusal, the same as at submission */
    if (d->o.shard_optimizer_state && !spec_backend_has(be->name, SPEC_CAP_SHARD))
        return spec_cap_refuse(SPEC_CAP_SHARD, NULL, be->name, err);
    if (d->o.bf16_gradients && !spec_backend_has(be->name, SPEC_CAP_BF16_GRADS))
        return spec_cap_refuse(SPEC_CAP_BF16_GRADS, NULL, be->name, err);
    if ((rc = plan_buckets(d, n_blocks, block_ranges, model, err)) ||
        (rc = narrow_share(d, share, err)))
        return rc;
    size_t maxshard = 0;
    for (int r = 0; r < d->world; r++) {
        size_t s = 0;
        for (int i = 0; i < d->n_buckets; i++) {
            size_t so, sn;
            comm_shard_range(d->b[i].n, r, d->world, &so, &sn);
            s += sn;
        }
        maxshard = s > maxshard ? s : maxshard;
    }
    d->host_n = maxshard > 0 ? maxshard : 1;
    d->host = malloc(sizeof(float) * d->host_n);
    if (!d->host) return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    if (d->device && d->world > 1 &&
        (rc = be->coll->create(d->rank, d->world, dev_bcast, d->c, &d->dev, err)))
        return rc;
    if (d->o.shard_optimizer_state)
        printf("dp: rank %d/%d over %s: ZeRO-1, %d gradient buckets (largest %.2f MiB) "
               "reduce-scattered %s%s backward, parameters all-gathered %s; AdamW "
               "state for %zu of %zu parameters (%.1f of %.1f MiB)%s\n",
               d->rank, d->world, d->device ? be->name : comm_provider(d->c), d->n_buckets,
               d->st.max_bucket_floats * 4.0 / (1 << 20), d->o.bf16_gradients ? "as bf16 " : "",
               d->o.overlap ? "during" : "after",
               d->loop_layer && !d->o.check ? "during the next forward" : "after the update",
               d->st.opt_state_bytes / 8, d->total, d->st.opt_state_bytes / 1048576.0,
               d->st.opt_state_full_bytes / 1048576.0,
               d->o.check ? ", parameter check every step" : "");
    else
        printf("dp: rank %d/%d over %s: %d gradient buckets (largest %.2f MiB) all-reduced %s%s "
               "backward%s\n", d->rank, d->world, d->device ? be->name : comm_provider(d->c),
               d->n_buckets, d->st.max_bucket_floats * 4.0 / (1 << 20), d->o.bf16_gradients ? "as bf16 " : "",
               d->o.overlap ? "during" : "after", d->o.check ? ", parameter check every step" : "");
    fflush(stdout);
    return KILN_OK;
}

/* ---- reductions ----------------------------------------------------------------------------- */

static void pack_ranges(dp_t *d, dp_bucket_t *bk, const float *src)
{
    size_t off = 0;
    for (int k = 0; k < bk->nr; k++) {
        d->be->copy(bk->buf + off, src + bk->r[k].off, bk->r[k].n * sizeof(float));
        off += bk->r[k].n;
    }
}

static void unpack_ranges(dp_t *d, const dp_bucket_t *bk, float *dst)
{
    size_t off = 0;
    for (int k = 0; k < bk->nr; k++) {
        d->be->copy(dst + bk->r[k].off, bk->buf + off, bk->r[k].n * sizeof(float));
        off += bk->r[k].n;
    }
}

static void launch(dp_t *d, int i)
{
    dp_bucket_t *bk = &d->b[i];
    if (bk->launched) return;
    bk->launched = true;
    if (d->err_status || d->world == 1) return;
    if (d->gathered > 0 && dp_params_wait(d, -1, NULL)) return; /* the buffers are shared */
    pack_ranges(d, bk, d->p->grads);
    kiln_err_t e;
    kiln_err_clear(&e);
    int rc;
    comm_wire_t wire = d->o.bf16_gradients ? COMM_WIRE_BF16 : COMM_WIRE_FP32;
    if (d->device) /* ZeRO and the bf16 wire are host memory only (dp_attach) */
        rc = d->be->coll->allreduce(d->dev, bk->buf, bk->n, 1, &e);
    else if (d->o.shard_optimizer_state)
        rc = comm_reduce_scatter_wire_start(d->c, bk->buf, bk->n, COMM_AVG, wire, &bk->req, &e);
    else
        rc = comm_allreduce_wire_start(d->c, bk->buf, bk->n, COMM_AVG, wire, &bk->req, &e);
    if (rc) {
        bk->req = NULL;
        fail(d, rc, &e, NULL, NULL);
    }
}

void dp_grads_ready(dp_t *d, int block, int ranges)
{
    if (!d->o.overlap || block < 0 || block >= d->n_blocks) return;
    /* buckets go out in order on every rank, so every rank submits the same sequence */
    while (d->next_launch < d->n_buckets) {
        dp_bucket_t *bk = &d->b[d->next_launch];
        if (bk->close_block < block || (bk->close_block == block && bk->close_ranges > ranges))
            break;
        if (!bk->launched) {
            launch(d, d->next_launch);
            d->st.early_launches++;
        }
        d->next_launch++;
    }
}

/* The reduced values back into the gradients: this rank's shard (ZeRO) or all of it. */
static void unpack_reduced(dp_t *d, const dp_bucket_t *bk)
{
    if (!d->o.shard_optimizer_state) {
        unpack_ranges(d, bk, d->p->grads);
        return;
    }
    for (int k = 0; k < bk->np; k++)
        d->be->copy(d->p->grads + bk->pieces[k].flat, bk->buf + bk->pieces[k].packed,
                    bk->pieces[k].n * sizeof(float));
}

int dp_grads_finish(dp_t *d, kiln_err_t *err)
{
    double t0 = kiln_mono_s();
    for (int i = 0; i < d->n_buckets; i++) launch(d, i);
    d->next_launch = 0;
    if (d->device && d->dev && !d->err_status) {
        kiln_err_t e;
        kiln_err_clear(&e);
        int rc = d->be->coll->wait(d->dev, d->o.watchdog_s, &e);
        if (rc) fail(d, rc, &e, NULL, NULL);
    }
    for (int i = 0; i < d->n_buckets; i++) {
        dp_bucket_t *bk = &d->b[i];
        kiln_err_t e;
        kiln_err_clear(&e);
        int r = comm_wait(bk->req, &e);
        bk->req = NULL;
        bk->launched = false;
        if (r) fail(d, r, &e, NULL, NULL);
        if (!d->err_status && d->world > 1) unpack_reduced(d, bk);
    }
    d->st.finish_wait_s += kiln_mono_s() - t0;
    if (d->err_status) return fail(d, d->err_status, NULL, err, "gradient reduction failed");
    return 0;
}

/* ---- after the update ----------------------------------------------------------------------- */

/* ZeRO (host memory only, dp_attach): this rank's updated shard of bucket i goes to every rank
 * (into the bucket's buffer). */
static void gather_bucket(dp_t *d, int i)
{
    dp_bucket_t *bk = &d->b[i];
    if (d->err_status) return;
    for (int k = 0; k < bk->np; k++)
        d->be->copy(bk->buf + bk->pieces[k].packed, d->p->params + bk->pieces[k].flat,
                    bk->pieces[k].n * sizeof(float));
    kiln_err_t e;
    kiln_err_clear(&e);
    int rc = comm_allgather_start(d->c, bk->buf, bk->n, &bk->req, &e);
    if (rc) fail(d, rc, &e, NULL, NULL);
}

/* Every bucket's all-gather, in the order forward needs them (the last, with the embeddings,
 * first). They come back into the parameters in gather_wait. */
static void gather_start(dp_t *d)
{
    d->gathered = d->n_buckets;
    for (int i = d->n_buckets - 1; i >= 0; i--) gather_bucket(d, i);
}

int dp_update(dp_t *d, void (*apply)(void *actx, size_t off, size_t n), void *actx, kiln_err_t *err)
{
    /* a bucket's shard is updated and its all-gather starts at once, in the order the next
     * forward needs them, so the first are on their way while AdamW still runs over the rest;
     * the shards are share->update (narrow_share), and ZeRO is host memory only (dp_attach) */
    d->gathered = d->n_buckets;
    d->gather_started = true;
    for (int i = d->n_buckets - 1; i >= 0; i--) {
        const dp_bucket_t *bk = &d->b[i];
        for (int k = 0; k < bk->np; k++) apply(actx, bk->pieces[k].flat, bk->pieces[k].n);
        gather_bucket(d, i);
    }
    return d->err_status ? fail(d, d->err_status, NULL, err, "parameter all-gather failed") : 0;
}

/* Brings back the all-gathered buckets down to bucket `to` (all, after an error). */
static int gather_wait(dp_t *d, int to, kiln_err_t *err)
{
    while (d->gathered > (d->err_status ? 0 : to)) {
        dp_bucket_t *bk = &d->b[--d->gathered];
        kiln_err_t e;
        kiln_err_clear(&e);
        int r = comm_wait(bk->req, &e);
        bk->req = NULL;
        if (r) fail(d, r, &e, NULL, NULL);
        if (!d->err_status) unpack_ranges(d, bk, d->p->params);
    }
    return d->err_status ? fail(d, d->err_status, NULL, err, "parameter all-gather failed") : 0;
}

int dp_params_wait(dp_t *d, int block, kiln_err_t *err)
{
    int to = block >= 0 && block < d->n_blocks ? d->need_from[block] : 0;
    if (d->gathered <= to) return d->err_status ? gather_wait(d, 0, err) : 0;
    double t0 = kiln_mono_s();
    int rc = gather_wait(d, to, err);
    d->st.params_wait_s += kiln_mono_s() - t0;
    return rc;
}

static uint64_t hash_words(uint64_t h, const float *x, size_t n)
{
    const uint32_t *w = (const uint32_t *)x;
    for (size_t i = 0; i < n; i++) {
        h ^= w[i];
        h *= 0x100000001b3ULL;
        h ^= h >> 29;
    }
    return h;
}

/* Every rank's hash of the parameters this layer averages, compared exactly. */
static int check_identical(dp_t *d, int64_t step, kiln_err_t *err)
{
    uint64_t h = 1469598103934665603ULL ^ d->total, all[d->world];
    for (int i = 0; i < d->n_buckets; i++)
        for (int k = 0; k < d->b[i].nr; k++) {
            const eng_range_t *r = &d->b[i].r[k];
            for (size_t o = 0; o < r->n; o += d->host_n) {
                size_t n = r->n - o < d->host_n ? r->n - o : d->host_n;
                d->be->to_host(d->host, d->p->params + r->off + o, n * sizeof(float));
                h = hash_words(h, d->host, n);
            }
        }
    all[d->rank] = h;
    kiln_err_t e;
    kiln_err_clear(&e);
    int rc = comm_allgather_bytes(d->c, all, sizeof(uint64_t), &e);
    if (rc) return fail(d, rc, &e, err, "data-parallel parameter check failed");
    char who[128] = "";
    size_t len = 0;
    for (int k = 1; k < d->world && len < sizeof(who) - 12; k++)
        if (all[k] != all[0]) len += snprintf(who + len, sizeof(who) - len, "%s%d", len ? ", " : "", k);
    if (!len) return 0;
    return kiln_err_set(err, KILN_EINTERNAL, NULL,
                        "data-parallel parameters diverged after step %lld: rank(s) %s differ "
                        "from rank 0 (hash %016llx)", (long long)step, who,
                        (unsigned long long)all[0]);
}

/* Says once, in the rank's log, when a window of steps spent more than WAIT_SHARE of its time
 * waiting for the group's gradients (and, under ZeRO, parameters), with what would help: bf16
 * gradients when they travel as fp32 on host collectives, else more compute per gradient byte
 * or a faster link. The first window starts after the first step (set-up, first touches). */
#define WAIT_WINDOW 8
#define WAIT_SHARE 0.2
static void note_wait(dp_t *d, int64_t step)
{
    double now = kiln_mono_s(), waited = d->st.finish_wait_s + d->st.params_wait_s;
    if (d->step_end > 0 && d->world > 1 && !d->st.wait_notes) {
        d->window_s += now - d->step_end;
        if (++d->window_steps == WAIT_WINDOW) {
            double w = waited - d->window_wait0, share = d->window_s > 0 ? w / d->window_s : 0;
            if (share > WAIT_SHARE) {
                char help[400];
                if (!d->device && !d->o.bf16_gradients)
                    snprintf(help, sizeof help,
                             "set distribution.data_parallel.gradient_dtype: \"bf16\" to send half the "
                             "bytes (sums stay fp32)");
                else
                    snprintf(help, sizeof help,
                             "the gradients already travel as %s; a larger batch per replica "
                             "(hyperparameters.global_batch_size) gives backward more to hide them "
                             "under%s, and a faster link between the hosts shortens them",
                             d->o.bf16_gradients ? "bf16" : "fp32 (the only dtype of device collectives)",
                             d->o.shard_optimizer_state || d->device
                                 ? ""
                                 : ", shard_optimizer_state moves the parameters' all-gather into the next "
                                   "forward");
                printf("dp: rank %d spent %.0f%% of its steps waiting for gradients (%.1f of %.1f ms a "
                       "step, steps %lld-%lld): the all-reduce does not fit under backward, or a peer "
                       "rank is slower; %s%s\n",
                       d->rank, 100 * share, 1e3 * w / WAIT_WINDOW, 1e3 * d->window_s / WAIT_WINDOW,
                       (long long)(step - WAIT_WINDOW + 1), (long long)step, help,
                       d->st.bucket_chosen ? "" : "; or leave bucket_mb unset so dp chooses it from the model");
                fflush(stdout);
                d->st.wait_notes++;
            }
            d->window_steps = 0;
            d->window_s = 0;
            d->window_wait0 = waited;
        }
    } else {
        d->window_wait0 = waited;
    }
    d->step_end = now;
}

int dp_after_update(dp_t *d, int64_t step, kiln_err_t *err)
{
    double t0 = kiln_mono_s();
    int rc;
    if (d->err_status) return fail(d, d->err_status, NULL, err, "data-parallel step failed");
    bool inject = d->o.inject_step > 0 && step == d->o.inject_step && d->rank == d->o.inject_rank;
    if (d->o.shard_optimizer_state && d->world > 1) {
        if (!d->gather_started) gather_start(d);
        d->gather_started = false;
        /* the loop's layer lets the next forward wait per block; the pipeline's stages, the
         * check and the injection need every parameter now */
        bool defer = d->loop_layer && !d->o.check && !inject;
        if (!defer && (rc = gather_wait(d, 0, err))) return rc;
        if (defer) d->st.gathers_in_forward++;
    }
    if (inject) {
        float x;
        float *at = d->p->params + d->p->n / 2;
        d->be->to_host(&x, at, sizeof(x));
        x = nextafterf(x, INFINITY);
        d->be->to_device(at, &x, sizeof(x));
        printf("dp: rank %d perturbed one parameter after step %lld (--dp-inject-rank, a test setting)\n",
               d->rank, (long long)step);
        fflush(stdout);
    }
    if (d->o.check && (rc = check_identical(d, step, err))) return rc;
    d->st.steps++;
    d->st.comm_s += kiln_mono_s() - t0;
    note_wait(d, step);
    return 0;
}

/* ---- checkpoints ---------------------------------------------------------------------------- */

int dp_gather(dp_t *d, float *buf, kiln_err_t *err)
{
    if (!d->o.shard_optimizer_state || d->world == 1) return 0;
    kiln_err_t e;
    kiln_err_clear(&e);
    int rc = dp_params_wait(d, -1, err);
    if (rc) return rc;
    if (d->rank != 0) { /* this rank's pieces of every bucket, in bucket order, one message */
        size_t pos = 0;
        for (int i = 0; i < d->n_buckets; i++)
            for (int k = 0; k < d->b[i].np; k++) {
                const dp_piece_t *pc = &d->b[i].pieces[k];
                d->be->to_host(d->host + pos, buf + pc->flat, pc->n * sizeof(float));
                pos += pc->n;
            }
        rc = comm_send(d->c, d->host, pos * sizeof(float), 0, TAG_SHARDS, &e);
    } else {
        int maxnr = 1;
        for (int i = 0; i < d->n_buckets; i++) maxnr = d->b[i].nr > maxnr ? d->b[i].nr : maxnr;
        dp_piece_t *pc = malloc(sizeof(*pc) * (size_t)maxnr);
        if (!pc) return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        for (int r = 1; r < d->world && !rc; r++) {
            if ((rc = comm_recv(d->c, d->host, d->host_n * sizeof(float), r, TAG_SHARDS, NULL, &e)))
                break;
            size_t pos = 0;
            for (int i = 0; i < d->n_buckets; i++) {
                int np = shard_pieces(d, &d->b[i], r, pc);
                for (int k = 0; k < np; k++) {
                    d->be->to_device(buf + pc[k].flat, d->host + pos, pc[k].n * sizeof(float));
                    pos += pc[k].n;
                }
            }
        }
        free(pc);
    }
    return rc ? fail(d, rc, &e, err, "gathering the optimizer state for a checkpoint failed") : 0;
}

/* ---- the training loop's parallel layer ------------------------------------------------------- */

static int par_allgather(void *ctx, void *slots, size_t slot_bytes, kiln_err_t *err)
{
    dp_t *d = ctx;
    return comm_allgather_bytes(d->c, slots, slot_bytes, err);
}

static int par_bcast(void *ctx, void *buf, size_t bytes, int root, kiln_err_t *err)
{
    dp_t *d = ctx;
    return comm_bcast(d->c, buf, bytes, root, err);
}

static int par_attach(void *ctx, eng_train_state_t *st, kiln_err_t *err)
{
    const eng_model_t *m = st->model;
    return dp_attach(ctx, st->be, m->p, m->n_blocks, m->ops->block_ranges, m->impl, st->share, err);
}

static void par_grads_ready(void *ctx, int block, int ranges) { dp_grads_ready(ctx, block, ranges); }
static int par_grads_finish(void *ctx, kiln_err_t *err) { return dp_grads_finish(ctx, err); }
static int par_after_update(void *ctx, int64_t step, kiln_err_t *err) { return dp_after_update(ctx, step, err); }
static int par_gather(void *ctx, float *buf, kiln_err_t *err) { return dp_gather(ctx, buf, err); }
static int par_params_wait(void *ctx, int block, kiln_err_t *err) { return dp_params_wait(ctx, block, err); }
static int par_update(void *ctx, void (*apply)(void *, size_t, size_t), void *actx, kiln_err_t *err)
{
    return dp_update(ctx, apply, actx, err);
}

void dp_parallel(dp_t *d, eng_parallel_t *out)
{
    memset(out, 0, sizeof(*out));
    out->name = d->o.shard_optimizer_state ? "data parallel (ZeRO-1)" : "data parallel";
    out->ctx = d;
    out->replica = d->rank;
    out->replicas = d->world;
    out->microbatches = 1;
    out->allgather = par_allgather;
    out->bcast = par_bcast;
    out->attach = par_attach;
    out->grads_ready = par_grads_ready;
    out->grads_finish = par_grads_finish;
    out->after_update = par_after_update;
    out->gather = par_gather;
    out->params_wait = par_params_wait;
    /* ZeRO's update goes bucket by bucket; otherwise the loop applies its update ranges */
    if (d->o.shard_optimizer_state && d->world > 1) out->update = par_update;
    d->loop_layer = true;
}
