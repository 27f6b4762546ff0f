/* fabric.c - the libfabric transport: opens an FI_EP_RDM endpoint with tagged messages on `shm`
 * or `tcp;ofi_rxm`, posts transfers, reaps the completion queue (progress is manual: data moves
 * only while the progress thread reads it) and runs point-to-point operations. The ring
 * algorithms that use it are in ring.c; the rendezvous that exchanges addresses in rendezvous.c. */
#include "engine/comm/comm_int.h"
#include "rank/rank.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *prov_fullname(const char *prov)
{
    return strcmp(prov, "shm") == 0 ? "shm" : "tcp;ofi_rxm";
}

static struct fi_info *fabric_hints(const char *prov, bool ordered)
{
    struct fi_info *h = fi_allocinfo();
    if (!h)
        return NULL;
    h->ep_attr->type = FI_EP_RDM;
    h->caps = FI_TAGGED | FI_MSG | FI_DIRECTED_RECV;
    h->mode = FI_CONTEXT | FI_CONTEXT2;
    /* Say which registration duties we can carry; fi_info then tells which it needs. */
    h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    h->domain_attr->threading = FI_THREAD_DOMAIN;
    if (ordered) {
        h->tx_attr->msg_order = FI_ORDER_SAS;
        h->rx_attr->msg_order = FI_ORDER_SAS;
    }
    h->fabric_attr->prov_name = strdup(prov_fullname(prov));
    return h;
}

/* tcp;ofi_rxm sends a message above its eager limit (16 KiB by default) by rendezvous: the
 * sender announces it, the receiver asks for the data with an RMA read, and that request travels
 * in the one FIFO TCP stream the receiver's own outgoing data fills. In a ring both directions
 * carry chunks at once, so every request waited behind a whole chunk of the other direction and
 * the two directions took turns: half the link's rate on a 1 Gbit/s link (bench/dp_netns.sh).
 * Sent eagerly, a chunk streams at once; rxm places it in the posted receive, or, when it comes
 * before the receive is posted, in a buffer it allocates and copies from later. The limit is
 * rxm's FI_OFI_RXM_EAGER_LIMIT, read when an endpoint opens; an operator's own value is kept.
 * Process-wide: the last engine opened sets it (one engine per process in kiln-train). */
static void tcp_set_eager_limit(size_t chunk_bytes)
{
    static char ours[32]; /* the value this process set, to tell it from an operator's */
    const char *cur = getenv("FI_OFI_RXM_EAGER_LIMIT");
    if (cur && strcmp(cur, ours) != 0)
        return;
    size_t v = chunk_bytes < COMM_EAGER_MIN ? COMM_EAGER_MIN : chunk_bytes; /* rxm's own floor */
    snprintf(ours, sizeof(ours), "%zu", v > COMM_EAGER_MAX ? (size_t)COMM_EAGER_MAX : v);
    setenv("FI_OFI_RXM_EAGER_LIMIT", ours, 1);
}

int comm_fabric_open(comm_engine_t *e, const char *prov, const char *node, kiln_err_t *err)
{
    comm_fabric_t *f = &e->fab;
    struct fi_info *hints = NULL;
    int rc = -FI_ENODATA;
    const char *what = "fi_getinfo";
    bool tcp = strcmp(prov, "shm") != 0;
    /* A region named after this pid can only be left over from a killed process that had it. */
    int self = (int)getpid();
    if (!tcp && rank_shm_cleanup(&self, 1) > 0)
        log_info("comm: removed a stale shm region left by an earlier process %d", (int)getpid());
    if (tcp)
        tcp_set_eager_limit(e->chunk_bytes);
    /* Over tcp the kernel moves the data while the progress thread naps: its socket buffers
     * keep the link busy through 200 us (25 KB at 1 Gbit/s, 250 KB at 10), and rxm's
     * completions are polled, so shorter naps only cost wakeups taken from compute. Over shm
     * the progress thread makes the copies itself: it naps briefly. */
    e->spin_yields = tcp ? 16 : 64;
    e->nap_us = tcp ? 200 : 20;

    /* Messages of one tag from one peer must not overtake each other (send/recv contract). */
    for (int ordered = 1; ordered >= 0 && rc != 0; ordered--) {
        fi_freeinfo(hints);
        hints = fabric_hints(prov, ordered);
        if (!hints)
            return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        rc = fi_getinfo(FI_VERSION(1, 9), tcp ? node : NULL, NULL, tcp && node ? FI_SOURCE : 0, hints, &f->info);
    }
    if (rc != 0)
        goto fail;
    f->mr_local = (f->info->domain_attr->mr_mode & FI_MR_LOCAL) != 0;

    struct fi_av_attr av_attr = {.type = FI_AV_TABLE, .count = (size_t)e->world};
    /* e->blocking (tcp only): a completion queue with a wait object lets the thread sleep in the
     * kernel until data arrives instead of polling with naps. Measured here it tripled
     * small-message latency (157 vs 48 us) without saving CPU, so polling is the default. shm
     * moves data only while polled and always polls. */
    bool may_wait = tcp && e->blocking;
    struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_TAGGED, .wait_obj = may_wait ? FI_WAIT_UNSPEC : FI_WAIT_NONE,
                                 .size = (size_t)(COMM_COLL_INFLIGHT * 8 * e->depth + 64)};
    what = "fi_fabric";
    if ((rc = fi_fabric(f->info->fabric_attr, &f->fabric, NULL)) != 0)
        goto fail;
    what = "fi_domain";
    if ((rc = fi_domain(f->fabric, f->info, &f->domain, NULL)) != 0)
        goto fail;
    what = "fi_av_open";
    if ((rc = fi_av_open(f->domain, &av_attr, &f->av, NULL)) != 0)
        goto fail;
    what = "fi_cq_open";
    if ((rc = fi_cq_open(f->domain, &cq_attr, &f->cq, NULL)) != 0 && cq_attr.wait_obj != FI_WAIT_NONE) {
        cq_attr.wait_obj = FI_WAIT_NONE;
        rc = fi_cq_open(f->domain, &cq_attr, &f->cq, NULL);
    }
    if (rc != 0)
        goto fail;
    f->cq_wait = cq_attr.wait_obj != FI_WAIT_NONE;
    log_debug("comm: rank %d opened %s%s%s, mr_mode 0x%x, %s completions", e->rank, prov_fullname(prov),
              node ? " on " : "", node ? node : "", (unsigned)f->info->domain_attr->mr_mode,
              f->cq_wait ? "blocking" : "polled");
    what = "fi_endpoint";
    if ((rc = fi_endpoint(f->domain, f->info, &f->ep, NULL)) != 0)
        goto fail;
    what = "fi_ep_bind";
    if ((rc = fi_ep_bind(f->ep, &f->av->fid, 0)) != 0 ||
        (rc = fi_ep_bind(f->ep, &f->cq->fid, FI_TRANSMIT | FI_RECV)) != 0)
        goto fail;
    what = "fi_enable";
    if ((rc = fi_enable(f->ep)) != 0)
        goto fail;
    f->namelen = sizeof(f->name);
    what = "fi_getname";
    if ((rc = fi_getname(&f->ep->fid, f->name, &f->namelen)) != 0)
        goto fail;

    /* Staging for reducing receives, registered once: depth slots per running collective. */
    int nslots = e->depth * COMM_COLL_INFLIGHT;
    f->slot_bytes = e->chunk_bytes;
    f->slots = aligned_alloc(64, f->slot_bytes * (size_t)nslots);
    f->slot_free = calloc((size_t)nslots, sizeof(int));
    if (!f->slots || !f->slot_free) {
        comm_fabric_close(e);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory for %d staging chunks", nslots);
    }
    for (int i = 0; i < nslots; i++)
        f->slot_free[i] = i;
    f->nslot_free = nslots;
    if (f->mr_local) {
        char msg[COMM_MSG_MAX];
        if (comm_fabric_mr(e, f->slots, f->slot_bytes * (size_t)nslots, &f->slots_mr,
                           &f->slots_desc, msg) != 0) {
            comm_fabric_close(e);
            return kiln_err_set(err, KILN_ECOMM, NULL, "%s", msg);
        }
    }
    fi_freeinfo(hints);
    return 0;

fail:
    fi_freeinfo(hints);
    comm_fabric_close(e);
    kiln_err_set(err, KILN_ECOMM, NULL, "could not open libfabric provider %s%s%s: %s: %s",
                 prov_fullname(prov), node && tcp ? " on " : "", node && tcp ? node : "", what,
                 fi_strerror(-rc));
    kiln_err_hint(err, "check `fi_info -p %s`; KILN_COMM_PROVIDER=shm|tcp overrides the choice",
                  prov_fullname(prov));
    return KILN_ECOMM;
}

int comm_fabric_insert(comm_engine_t *e, const uint8_t (*addrs)[COMM_ADDR_MAX], const uint32_t *lens,
                       kiln_err_t *err)
{
    comm_fabric_t *f = &e->fab;
    f->peers = calloc((size_t)e->world, sizeof(fi_addr_t));
    if (!f->peers)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    for (int r = 0; r < e->world; r++) {
        (void)lens;
        int n = fi_av_insert(f->av, addrs[r], 1, &f->peers[r], 0, NULL);
        if (n != 1)
            return kiln_err_set(err, KILN_ECOMM, NULL, "could not insert the fabric address of rank %d: %s",
                                r, fi_strerror(n < 0 ? -n : FI_EINVAL));
    }
    return 0;
}

void comm_fabric_close(comm_engine_t *e)
{
    comm_fabric_t *f = &e->fab;
    if (f->abandoned) {
        log_debug("comm: leaving the failed fabric endpoint open");
        /* the endpoint, its fabric objects and the slots stay allocated (the provider may still
         * know them), referenced from a copy of the fabric's state */
        comm_fabric_t *kept = malloc(sizeof(*kept));
        if (kept) {
            *kept = *f;
            comm_keep_abandoned(kept);
        }
        memset(f, 0, sizeof(*f));
        return;
    }
    if (f->slots_mr)
        fi_close(&f->slots_mr->fid);
    if (f->ep)
        fi_close(&f->ep->fid);
    if (f->av)
        fi_close(&f->av->fid);
    if (f->cq)
        fi_close(&f->cq->fid);
    if (f->domain)
        fi_close(&f->domain->fid);
    if (f->fabric)
        fi_close(&f->fabric->fid);
    if (f->info)
        fi_freeinfo(f->info);
    free(f->slots);
    free(f->slot_free);
    free(f->peers);
    memset(f, 0, sizeof(*f));
}

int comm_fabric_mr(comm_engine_t *e, void *buf, size_t len, struct fid_mr **mr, void **desc, char *msg)
{
    comm_fabric_t *f = &e->fab;
    *mr = NULL;
    *desc = NULL;
    if (!f->mr_local || len == 0)
        return 0;
    int rc = fi_mr_reg(f->domain, buf, len, FI_SEND | FI_RECV, 0, f->mr_key++, 0, mr, NULL);
    if (rc != 0) {
        snprintf(msg, COMM_MSG_MAX, "could not register %zu bytes with the fabric: %s", len, fi_strerror(-rc));
        *mr = NULL;
        return KILN_ECOMM;
    }
    *desc = fi_mr_desc(*mr);
    return 0;
}

int comm_fabric_post(comm_engine_t *e, comm_xfer_t *x, void *buf, size_t len, void *desc,
                     int world_peer, uint64_t tag, char *msg)
{
    comm_fabric_t *f = &e->fab;
    ssize_t rc;
    if (x->is_send)
        rc = fi_tsend(f->ep, buf, len, desc, f->peers[world_peer], tag, &x->ctx);
    else
        rc = fi_trecv(f->ep, buf, len, desc, f->peers[world_peer], tag, 0, &x->ctx);
    if (rc == 0) {
        x->busy = true;
        return 0;
    }
    if (rc == -FI_EAGAIN)
        return 1;
    snprintf(msg, COMM_MSG_MAX, "could not post a %s of %zu bytes to rank %d: %s",
             x->is_send ? "send" : "receive", len, world_peer, fi_strerror((int)-rc));
    return KILN_ECOMM;
}

/* ---- point-to-point operations --------------------------------------------------------- */

static int p2p_try_post(comm_engine_t *e, comm_req_t *op, char *msg)
{
    comm_t *g = op->grp;
    int rc = comm_fabric_post(e, &op->x, op->buf, op->n, op->desc, g->members[op->peer],
                              comm_tag_p2p(op->gid, op->tag), msg);
    op->x_pending = rc == 1;
    return rc < 0 ? rc : 0;
}

static int fabric_start(comm_engine_t *e, comm_req_t *op, char *msg)
{
    if (op->kind != COMM_OP_SEND && op->kind != COMM_OP_RECV)
        return comm_ring_start(e, op, msg);
    memset(&op->x, 0, sizeof(op->x));
    op->x.op = op;
    op->x.slot = -1;
    op->x.is_send = op->kind == COMM_OP_SEND;
    int rc = comm_fabric_mr(e, op->buf, op->n, &op->mr, &op->desc, msg);
    if (rc == 0)
        rc = p2p_try_post(e, op, msg);
    return rc;
}

static void p2p_done(comm_engine_t *e, comm_req_t *op, int status, size_t len, const char *msg)
{
    op->x.busy = false;
    if (op->mr) {
        fi_close(&op->mr->fid);
        op->mr = NULL;
    }
    if (status == 0 && op->out_len)
        *op->out_len = len;
    comm_op_finish(e, op, status, msg);
}

static int fabric_progress(comm_engine_t *e, int wait_ms, int *events, char *msg)
{
    comm_fabric_t *f = &e->fab;
    struct fi_cq_tagged_entry ent[16];
    *events = 0;
    for (int round = 0; round < 4; round++) {
        ssize_t n = round == 0 && wait_ms > 0 && f->cq_wait ? fi_cq_sread(f->cq, ent, 16, NULL, wait_ms)
                                                           : fi_cq_read(f->cq, ent, 16);
        if (n == -FI_EAGAIN || n == -FI_ETIMEDOUT)
            break;
        if (n == -FI_EAVAIL) {
            struct fi_cq_err_entry ce;
            memset(&ce, 0, sizeof(ce));
            if (fi_cq_readerr(f->cq, &ce, 0) != 1)
                break;
            comm_xfer_t *x = ce.op_context;
            int eno = ce.err < 0 ? -ce.err : ce.err; /* shm 1.17 reports negative codes */
            (*events)++;
            if (x && x->op && x->op->ring == NULL && eno == FI_ETRUNC && !x->is_send) {
                char m[COMM_MSG_MAX];
                snprintf(m, sizeof(m), "message from rank %d (tag %u) is larger than the %zu-byte buffer",
                         x->op->peer, x->op->tag, x->op->n);
                p2p_done(e, x->op, KILN_ETOOBIG, 0, m);
                continue;
            }
            if (eno == FI_ECANCELED)
                continue;
            snprintf(msg, COMM_MSG_MAX, "fabric %s failed: %s",
                     x && x->is_send ? "send" : "receive",
                     eno == FI_ETRUNC ? "message larger than the posted buffer (ranks disagree on sizes?)"
                                      : fi_strerror(eno));
            return KILN_ECOMM;
        }
        if (n < 0) {
            snprintf(msg, COMM_MSG_MAX, "could not read the fabric completion queue: %s", fi_strerror((int)-n));
            return KILN_ECOMM;
        }
        for (ssize_t i = 0; i < n; i++) {
            comm_xfer_t *x = ent[i].op_context;
            x->busy = false;
            if (x->op->ring)
                comm_ring_xfer_done(e, x, ent[i].len);
            else
                p2p_done(e, x->op, 0, ent[i].len, NULL);
        }
        *events += (int)n;
        if (n < 16)
            break;
    }
    /* Post what can be posted now; comm_op_finish() unlinks, so fetch next first. */
    comm_req_t *next;
    for (comm_req_t *op = e->active; op; op = next) {
        next = op->anext;
        int rc = 0;
        if (op->ring) {
            rc = comm_ring_advance(e, op, msg);
        } else if (op->x_pending) {
            rc = p2p_try_post(e, op, msg);
            if (rc == 0 && !op->x_pending)
                (*events)++;
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

static void fabric_abort(comm_engine_t *e)
{
    comm_fabric_t *f = &e->fab;
    if (!f->ep)
        return;
    for (comm_req_t *op = e->active; op; op = op->anext) {
        if (op->ring)
            comm_ring_cancel(e, op);
        else if (op->x.busy)
            fi_cancel(&f->ep->fid, &op->x.ctx);
    }
    /* Sends to a dead peer cannot be cancelled, and closing an ofi_rxm endpoint with a broken
     * connection crashes inside libfabric 1.17. Progress is manual, so once we stop calling into
     * the provider it touches no buffer of ours again: abandon the endpoint (the process is about
     * to fail anyway) and let the failed operations return. */
    f->abandoned = true;
}

static void fabric_close_tp(comm_engine_t *e)
{
    comm_fabric_close(e);
}

static bool fabric_can_wait(comm_engine_t *e)
{
    return e->fab.cq_wait;
}

static void fabric_wake(comm_engine_t *e)
{
    if (e->fab.cq_wait && e->fab.cq)
        fi_cq_signal(e->fab.cq);
}

const comm_transport_t comm_fabric_transport = {
    .name = "libfabric",
    .start = fabric_start,
    .progress = fabric_progress,
    .abort = fabric_abort,
    .close = fabric_close_tp,
    .can_wait = fabric_can_wait,
    .wake = fabric_wake,
};
