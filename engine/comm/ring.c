/* ring.c - bandwidth-optimal ring collectives over the libfabric transport: reduce-scatter,
 * all-gather, all-reduce (the two back to back) and a pipelined ring broadcast. Each segment is
 * cut into chunks; a unit is (step, chunk) and up to `depth` receives and sends are in flight, so
 * large buffers stream. Not the transport itself (fabric.c) nor the queueing (progress.c).
 *
 * Chunks are the configured size or less: a segment is cut into the fewest chunks of at most
 * chunk_bytes, all of equal size (so a segment a little over one chunk makes two halves, not a
 * chunk and a sliver), which also lets the all-gather half start before a whole segment is in.
 * Several rings may run at once (COMM_COLL_INFLIGHT); each takes at most `depth` staging slots.
 *
 * Reduce-scatter: at step t rank r sends segment r-t-1 to its right and receives segment r-t-2
 * from its left, adding its own values (incoming partial + own, in ring order). After W-1 steps
 * rank r holds the reduced segment r. All-gather then forwards finished segments around the
 * ring, so every rank ends with the owner's exact bytes (bitwise identical results).
 *
 * With the bf16 wire (comm_wire_t) the ring keeps a bf16 image of the buffer (`wire`, half its
 * size): a chunk is rounded into it just before it is sent, a reducing receive lands in a staging
 * slot as bf16 and is added to the fp32 buffer, and an all-gather receive lands in the image and
 * is widened into the buffer. The owner of a finished all-reduce segment rounds it to bf16 in
 * place, so the bytes it keeps are the bytes the others receive. */
#include "engine/comm/comm_int.h"
#include "engine/bf16.h"

#include <rdma/fi_endpoint.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { UNIT_IDLE = 0, UNIT_POSTED = 1, UNIT_DONE = 2 };

#ifndef COMM_RING_WINDOW
#define COMM_RING_WINDOW 4 /* plain (non-reducing) transfers may run this many times deeper */
#endif

struct comm_ring {
    int W, r;             /* group size and rank */
    int left, right;      /* world ranks of the ring neighbours */
    int steps;
    size_t nch;           /* chunks per segment */
    size_t ce;            /* elements per chunk */
    uint32_t units;       /* steps * nch */
    uint8_t *rstate;      /* (units) receive state */
    uint32_t next_recv, next_send;
    int recv_inflight, send_inflight;
    int window;           /* transfers in flight per direction; reducing receives are further
                           * limited by the depth staging slots */
    int slots_held;       /* staging slots this ring holds (at most depth) */
    int nxf;
    comm_xfer_t *xf;      /* (2 * window) */
    uint16_t *wire;       /* (n) the bf16 image with the bf16 wire, else NULL */
    struct fid_mr *wmr;   /* its registration when the provider needs FI_MR_LOCAL */
    void *wdesc;
};

static int ring_mod(int a, int w)
{
    return ((a % w) + w) % w;
}

void comm_shard_range(size_t n, int rank, int world, size_t *offset, size_t *count)
{
    if (world < 1 || rank < 0 || rank >= world) {
        *offset = 0;
        *count = 0;
        return;
    }
    size_t w = (size_t)world, r = (size_t)rank;
    size_t base = n / w, extra = n % w;
    *offset = r * base + (r < extra ? r : extra);
    *count = base + (r < extra ? 1 : 0);
}

/* What step t does on this rank: segment sent (-1: none), segment received (-1: none), whether
 * the receive is reduced into the buffer, and whether it completes the reduction (average). */
static void ring_step(const comm_req_t *op, const comm_ring_t *R, int t, int *sseg, int *rseg,
                      bool *reduce, bool *final)
{
    int W = R->W, r = R->r;
    *reduce = false;
    *final = false;
    switch (op->kind) {
    case COMM_OP_ALLREDUCE:
    case COMM_OP_REDUCE_SCATTER:
        if (t < W - 1) {
            *sseg = ring_mod(r - t - 1, W);
            *rseg = ring_mod(r - t - 2, W);
            *reduce = true;
            *final = t == W - 2;
            return;
        }
        t -= W - 1; /* the all-gather half of an all-reduce */
        __attribute__((fallthrough));
    case COMM_OP_ALLGATHER:
        *sseg = ring_mod(r - t, W);
        *rseg = ring_mod(r - t - 1, W);
        return;
    case COMM_OP_BCAST: {
        int right = ring_mod(r + 1, W);
        *sseg = right != op->root ? 0 : -1;
        *rseg = r != op->root ? 0 : -1;
        return;
    }
    default:
        *sseg = *rseg = -1;
        return;
    }
}

static void seg_range(const comm_req_t *op, const comm_ring_t *R, int seg, size_t *off, size_t *cnt)
{
    if (op->kind == COMM_OP_BCAST) {
        *off = 0;
        *cnt = op->n;
        return;
    }
    comm_shard_range(op->n, seg, R->W, off, cnt);
}

/* Byte region of chunk c of segment seg; false when it is empty. */
static bool chunk_region(const comm_req_t *op, const comm_ring_t *R, int seg, size_t c,
                         char **ptr, size_t *bytes, size_t *elems)
{
    size_t off, cnt;
    seg_range(op, R, seg, &off, &cnt);
    size_t lo = c * R->ce;
    if (lo >= cnt)
        return false;
    size_t len = cnt - lo < R->ce ? cnt - lo : R->ce;
    *ptr = (char *)op->buf + (off + lo) * op->esize;
    *bytes = len * op->esize;
    *elems = len;
    return true;
}

/* The bf16 image of a region of the buffer. */
static uint16_t *wire_at(const comm_req_t *op, const comm_ring_t *R, const char *ptr)
{
    return R->wire + (size_t)(ptr - (const char *)op->buf) / sizeof(float);
}

static comm_xfer_t *ring_xfer(comm_ring_t *R)
{
    for (int i = 0; i < R->nxf; i++)
        if (!R->xf[i].busy)
            return &R->xf[i];
    return NULL;
}

int comm_ring_start(comm_engine_t *e, comm_req_t *op, char *msg)
{
    comm_t *g = op->grp;
    comm_ring_t *R = calloc(1, sizeof(*R));
    if (!R)
        goto nomem;
    op->ring = R;
    R->W = g->size;
    R->r = g->rank;
    R->left = g->members[ring_mod(g->rank - 1, g->size)];
    R->right = g->members[ring_mod(g->rank + 1, g->size)];
    size_t maxcnt;
    if (op->kind == COMM_OP_BCAST) {
        R->steps = R->W > 1 ? 1 : 0;
        maxcnt = op->n;
    } else {
        R->steps = (op->kind == COMM_OP_ALLREDUCE ? 2 : 1) * (R->W - 1);
        maxcnt = (op->n + (size_t)R->W - 1) / (size_t)R->W;
    }
    R->ce = e->chunk_bytes / op->esize;
    if (R->ce == 0)
        R->ce = 1;
    R->nch = maxcnt == 0 ? 0 : (maxcnt + R->ce - 1) / R->ce;
    /* Unit numbers live in 24 tag bits: grow chunks for enormous buffers. Staging slots are
     * chunk_bytes, so a reducing op that would need larger chunks is refused. */
    while ((uint64_t)R->steps * R->nch >= COMM_UNIT_MAX) {
        R->ce *= 2;
        R->nch = (maxcnt + R->ce - 1) / R->ce;
    }
    if (R->nch > 0)
        R->ce = (maxcnt + R->nch - 1) / R->nch; /* equal chunks, no smaller than needed */
    if (R->ce * op->esize > e->fab.slot_bytes && (op->kind == COMM_OP_ALLREDUCE ||
                                                  op->kind == COMM_OP_REDUCE_SCATTER)) {
        snprintf(msg, COMM_MSG_MAX, "buffer of %zu elements is too large for chunks of %zu bytes",
                 op->n, e->chunk_bytes);
        return KILN_EINVAL;
    }
    R->units = (uint32_t)((size_t)R->steps * R->nch);
    R->rstate = calloc(R->units ? R->units : 1, 1);
    R->window = op->kind == COMM_OP_REDUCE_SCATTER ? e->depth : COMM_RING_WINDOW * e->depth;
    R->nxf = 2 * R->window;
    R->xf = calloc((size_t)R->nxf, sizeof(comm_xfer_t));
    if (!R->rstate || !R->xf)
        goto nomem;
    for (int i = 0; i < R->nxf; i++) {
        R->xf[i].op = op;
        R->xf[i].slot = -1;
    }
    if (op->wire == COMM_WIRE_BF16 && R->steps > 0 && op->n > 0) {
        R->wire = malloc(op->n * sizeof(uint16_t));
        if (!R->wire)
            goto nomem;
        int rc = comm_fabric_mr(e, R->wire, op->n * sizeof(uint16_t), &R->wmr, &R->wdesc, msg);
        if (rc != 0)
            return rc;
    }
    return comm_fabric_mr(e, op->buf, op->n * op->esize, &op->mr, &op->desc, msg);
nomem:
    snprintf(msg, COMM_MSG_MAX, "out of memory for a ring of %d ranks", g->size);
    return KILN_ENOMEM;
}

void comm_ring_free(comm_req_t *op)
{
    comm_ring_t *R = op->ring;
    if (!R)
        return;
    if (R->wmr) /* after the last transfer, or when the start failed before any */
        fi_close(&R->wmr->fid);
    free(R->rstate);
    free(R->xf);
    free(R->wire);
    free(R);
    op->ring = NULL;
}

int comm_ring_waiting_on(const comm_req_t *op)
{
    const comm_ring_t *R = op->ring;
    if (!R)
        return -1;
    return R->recv_inflight > 0 || R->next_recv < R->units ? R->left : R->right;
}

void comm_ring_cancel(comm_engine_t *e, comm_req_t *op)
{
    comm_ring_t *R = op->ring;
    for (int i = 0; R && i < R->nxf; i++)
        if (R->xf[i].busy)
            fi_cancel(&e->fab.ep->fid, &R->xf[i].ctx);
}

static void reduce_chunk(float *restrict dst, const float *restrict in, size_t n, bool avg, float w)
{
    if (avg) {
        for (size_t i = 0; i < n; i++)
            dst[i] = (in[i] + dst[i]) / w;
    } else {
        for (size_t i = 0; i < n; i++)
            dst[i] = in[i] + dst[i];
    }
}

/* reduce_chunk for a bf16 partial sum; `round` leaves each result a bf16 value (the owner's
 * finished all-reduce segment). */
static void reduce_chunk_bf16(float *restrict dst, const uint16_t *restrict in, size_t n, bool avg, float w,
                              bool round)
{
    for (size_t i = 0; i < n; i++) {
        float x = eng_bf16_value(in[i]) + dst[i];
        if (avg)
            x /= w;
        dst[i] = round ? eng_bf16_value(eng_bf16_round(x)) : x;
    }
}

void comm_ring_xfer_done(comm_engine_t *e, comm_xfer_t *x, size_t len)
{
    comm_req_t *op = x->op;
    comm_ring_t *R = op->ring;
    (void)len;
    if (x->is_send) {
        R->send_inflight--;
        return;
    }
    if (x->slot >= 0 || R->wire) {
        int t = (int)(x->unit / R->nch);
        size_t c = x->unit % R->nch;
        int sseg, rseg;
        bool reduce, final;
        ring_step(op, R, t, &sseg, &rseg, &reduce, &final);
        char *dst = NULL;
        size_t bytes = 0, elems = 0;
        chunk_region(op, R, rseg, c, &dst, &bytes, &elems);
        if (x->slot >= 0) {
            const void *in = (char *)e->fab.slots + (size_t)x->slot * e->fab.slot_bytes;
            bool avg = final && op->redop == COMM_AVG;
            if (R->wire)
                reduce_chunk_bf16((float *)dst, in, elems, avg, (float)R->W,
                                  final && op->kind == COMM_OP_ALLREDUCE);
            else
                reduce_chunk((float *)dst, in, elems, avg, (float)R->W);
            e->fab.slot_free[e->fab.nslot_free++] = x->slot;
            R->slots_held--;
            x->slot = -1;
        } else { /* an all-gather receive into the bf16 image */
            const uint16_t *w = wire_at(op, R, dst);
            float *d = (float *)dst;
            for (size_t i = 0; i < elems; i++)
                d[i] = eng_bf16_value(w[i]);
        }
    }
    R->rstate[x->unit] = UNIT_DONE;
    R->recv_inflight--;
}

int comm_ring_advance(comm_engine_t *e, comm_req_t *op, char *msg)
{
    comm_ring_t *R = op->ring;
    comm_fabric_t *f = &e->fab;
    int rc;

    while (R->next_recv < R->units && R->recv_inflight < R->window) {
        uint32_t u = R->next_recv;
        int t = (int)(u / R->nch), sseg, rseg;
        size_t c = u % R->nch, bytes, elems;
        bool reduce, final;
        char *ptr;
        ring_step(op, R, t, &sseg, &rseg, &reduce, &final);
        if (rseg < 0 || !chunk_region(op, R, rseg, c, &ptr, &bytes, &elems)) {
            R->rstate[u] = UNIT_DONE;
            R->next_recv++;
            continue;
        }
        if (reduce && (R->slots_held >= e->depth || f->nslot_free == 0))
            break;
        comm_xfer_t *x = ring_xfer(R);
        if (!x)
            break;
        x->is_send = false;
        x->unit = u;
        void *desc = op->desc;
        if (R->wire) {
            bytes = elems * sizeof(uint16_t);
            ptr = (char *)wire_at(op, R, ptr);
            desc = R->wdesc;
        }
        if (reduce) {
            x->slot = f->slot_free[f->nslot_free - 1];
            ptr = (char *)f->slots + (size_t)x->slot * f->slot_bytes;
            desc = f->slots_desc;
        }
        rc = comm_fabric_post(e, x, ptr, bytes, desc, R->left, comm_tag_coll(op->gid, op->seq, u), msg);
        if (rc != 0) {
            x->slot = -1;
            if (rc < 0)
                return rc;
            break;
        }
        if (reduce) {
            f->nslot_free--;
            R->slots_held++;
        }
        R->rstate[u] = UNIT_POSTED;
        R->recv_inflight++;
        R->next_recv++;
    }

    while (R->next_send < R->units && R->send_inflight < R->window) {
        uint32_t u = R->next_send;
        int t = (int)(u / R->nch), sseg, rseg;
        size_t c = u % R->nch, bytes, elems;
        bool reduce, final;
        char *ptr;
        ring_step(op, R, t, &sseg, &rseg, &reduce, &final);
        /* A rank forwards what it has received: broadcast forwards the same unit, the other
         * rings send at step t what they received (and reduced) at step t-1. */
        if (op->kind == COMM_OP_BCAST) {
            if (rseg >= 0 && R->rstate[u] != UNIT_DONE)
                break;
        } else if (t > 0 && R->rstate[u - R->nch] != UNIT_DONE) {
            break;
        }
        if (sseg < 0 || !chunk_region(op, R, sseg, c, &ptr, &bytes, &elems)) {
            R->next_send++;
            continue;
        }
        comm_xfer_t *x = ring_xfer(R);
        if (!x)
            break;
        x->is_send = true;
        x->unit = u;
        x->slot = -1;
        void *desc = op->desc;
        if (R->wire) { /* exact for a finished segment, which already holds bf16 values */
            uint16_t *w = wire_at(op, R, ptr);
            const float *src = (const float *)ptr;
            for (size_t i = 0; i < elems; i++)
                w[i] = eng_bf16_round(src[i]);
            ptr = (char *)w;
            bytes = elems * sizeof(uint16_t);
            desc = R->wdesc;
        }
        rc = comm_fabric_post(e, x, ptr, bytes, desc, R->right, comm_tag_coll(op->gid, op->seq, u), msg);
        if (rc != 0) {
            if (rc < 0)
                return rc;
            break;
        }
        R->send_inflight++;
        R->next_send++;
    }

    if (R->next_recv == R->units && R->next_send == R->units && R->recv_inflight == 0 &&
        R->send_inflight == 0) {
        if (op->mr) {
            fi_close(&op->mr->fid);
            op->mr = NULL;
        }
        comm_ring_free(op);
        comm_op_finish(e, op, 0, NULL);
    }
    return 0;
}
