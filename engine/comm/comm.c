/* comm.c - the public face of the comm module: configuration from the rank contract, creating
 * and destroying the engine and its groups, submitting requests to the communication thread and
 * waiting for them, and comm_split(). The rendezvous, transport, rings and thread live in their
 * own files. */
#include "engine/comm/comm_int.h"
#include "rank/rank.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void comm_config_init(comm_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->world_size = 1;
    cfg->master_addr = "127.0.0.1";
    cfg->master_port = 29500;
    cfg->test_stall_after = -1;
}

void comm_settings_apply(comm_config_t *cfg, const comm_settings_t *s)
{
    if (!s)
        return;
    if (s->provider && *s->provider)
        cfg->provider = s->provider;
    if (s->timeout_s > 0)
        cfg->timeout_s = s->timeout_s;
    if (s->chunk_bytes > 0)
        cfg->chunk_bytes = (size_t)s->chunk_bytes;
    if (s->depth > 0)
        cfg->depth = (int)s->depth;
    cfg->blocking = s->blocking;
    cfg->test_stall_after = s->test_stall_after;
}

void comm_config_from_rank(comm_config_t *cfg, const rank_env_t *re)
{
    cfg->world_size = re->world_size;
    cfg->rank = re->rank;
    cfg->local_rank = re->local_rank;
    if (re->master_addr)
        cfg->master_addr = re->master_addr;
    if (re->master_port)
        cfg->master_port = re->master_port;
    if (re->job_id)
        cfg->job_id = re->job_id;
    if (re->comm_watchdog_s > 0)
        cfg->watchdog_s = re->comm_watchdog_s;
}

int comm_config_from_env(comm_config_t *cfg, kiln_err_t *err)
{
    rank_env_t re;
    int rc = rank_env_parse(NULL, &re, err);
    if (rc)
        return rc;
    comm_config_from_rank(cfg, &re);
    return 0;
}

void comm_keep_abandoned(void *p)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static void *kept[256];
    static size_t n;
    if (!p)
        return;
    pthread_mutex_lock(&mu);
    if (n < KILN_ARRAY_LEN(kept))
        kept[n++] = p;
    pthread_mutex_unlock(&mu);
}

static void engine_free(comm_engine_t *e)
{
    if (!e)
        return;
    comm_progress_stop(e);
    if (e->thread_stuck) {
        /* the stuck thread still uses the engine and the fabric: they stay allocated */
        comm_keep_abandoned(e);
        return;
    }
    if (e->tp)
        e->tp->close(e);
    else
        comm_fabric_close(e);
    comm_ctl_close(e);
    free(e->hosts);
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->ctl_mu);
    pthread_cond_destroy(&e->cv_submit);
    pthread_cond_destroy(&e->cv_done);
    free(e);
}

static comm_t *group_new(comm_engine_t *e, int rank, int size, uint16_t gid)
{
    comm_t *g = calloc(1, sizeof(*g));
    if (!g)
        return NULL;
    g->members = calloc((size_t)size, sizeof(int));
    if (!g->members) {
        free(g);
        return NULL;
    }
    g->eng = e;
    g->rank = rank;
    g->size = size;
    g->gid = gid;
    return g;
}

int comm_create(const comm_config_t *cfg, comm_t **out, kiln_err_t *err)
{
    comm_engine_t *e = NULL;
    comm_t *g = NULL;
    int rc;
    *out = NULL;
    if (cfg->world_size < 1 || cfg->rank < 0 || cfg->rank >= cfg->world_size)
        return kiln_err_set(err, KILN_EINVAL, "rank", "rank %d is out of range for a world of %d ranks",
                            cfg->rank, cfg->world_size);
    if (cfg->world_size > 1 && (cfg->master_port < 1 || cfg->master_port > 65535 || !cfg->master_addr))
        return kiln_err_set(err, KILN_EINVAL, "master_port", "a rendezvous address and port are required");
    if (cfg->provider && *cfg->provider && strcmp(cfg->provider, "shm") != 0 &&
        strcmp(cfg->provider, "tcp") != 0 && strcmp(cfg->provider, "auto") != 0)
        return kiln_err_set(err, KILN_EINVAL, "provider", "unknown provider \"%s\" (shm, tcp or auto)",
                            cfg->provider);

    e = calloc(1, sizeof(*e));
    if (!e)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->ctl_mu, NULL);
    pthread_cond_init(&e->cv_submit, NULL);
    pthread_cond_init(&e->cv_done, NULL);
    e->rank = cfg->rank;
    e->world = cfg->world_size;
    e->local_rank = cfg->local_rank;
    e->timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : 300;
    e->watchdog_us = (int64_t)((cfg->watchdog_s > 0 ? cfg->watchdog_s : COMM_WATCHDOG_DEFAULT_S) * 1e6);
    e->chunk_bytes = cfg->chunk_bytes ? cfg->chunk_bytes : (1u << 20);
    e->chunk_bytes = (e->chunk_bytes + 63) & ~(size_t)63;
    e->depth = cfg->depth > 0 ? cfg->depth : 4;
    e->blocking = cfg->blocking;
    e->test_stall_after = cfg->test_stall_after;
    e->spin_yields = 64; /* the transport may change them (comm_fabric_open) */
    e->nap_us = 20;
    e->hosts = calloc((size_t)e->world, COMM_HOST_MAX);
    if (!e->hosts) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto fail;
    }
    if ((rc = comm_rendezvous(e, cfg, err)) != 0)
        goto fail;
    e->tp = &comm_fabric_transport; /* host memory; a device (NCCL) transport is chosen here */
    g = group_new(e, e->rank, e->world, 0);
    if (!g) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto fail;
    }
    for (int r = 0; r < e->world; r++)
        g->members[r] = r;
    e->refs = 1;
    if ((rc = comm_progress_start(e, err)) != 0)
        goto fail;
    log_debug("comm: rank %d of %d joined over %s", e->rank, e->world, comm_provider(g));
    *out = g;
    return 0;
fail:
    if (g) {
        free(g->members);
        free(g);
    }
    engine_free(e);
    return rc;
}

int comm_create_from_env(const comm_config_t *base, comm_t **out, kiln_err_t *err)
{
    comm_config_t cfg;
    if (base)
        cfg = *base;
    else
        comm_config_init(&cfg);
    int rc = comm_config_from_env(&cfg, err);
    if (rc != 0) {
        *out = NULL;
        return rc;
    }
    return comm_create(&cfg, out, err);
}

int comm_rank(const comm_t *c)
{
    return c->rank;
}

int comm_size(const comm_t *c)
{
    return c->size;
}

const char *comm_provider(const comm_t *c)
{
    return strcmp(c->eng->provider, "shm") == 0 ? "shm" : "tcp;ofi_rxm";
}

/* ---- requests -------------------------------------------------------------------------------- */

static comm_req_t *req_new(comm_t *c, comm_op_kind_t kind, void *buf, size_t n, size_t esize)
{
    comm_req_t *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->kind = kind;
    r->grp = c;
    r->gid = c ? c->gid : 0;
    r->buf = buf;
    r->n = n;
    r->esize = esize;
    return r;
}

static void req_free(comm_req_t *r)
{
    if (!r)
        return;
    comm_ring_free(r);
    free(r->owned);
    free(r);
}

/* Queues r on e (takes ownership of r unless it fails). */
static int submit(comm_engine_t *e, comm_req_t *r, comm_req_t **out, kiln_err_t *err)
{
    pthread_mutex_lock(&e->mu);
    if (e->failed) {
        int st = e->failed;
        kiln_err_set(err, st, NULL, "%s", e->failmsg);
        pthread_mutex_unlock(&e->mu);
        req_free(r);
        *out = NULL;
        return st;
    }
    if (r->kind != COMM_OP_SEND && r->kind != COMM_OP_RECV && r->grp)
        r->seq = r->grp->next_seq++;
    if (e->q_tail)
        e->q_tail->next = r;
    else
        e->q_head = r;
    e->q_tail = r;
    pthread_cond_signal(&e->cv_submit);
    pthread_mutex_unlock(&e->mu);
    if (e->tp && e->tp->wake)
        e->tp->wake(e); /* the thread may be asleep in the fabric's wait */
    *out = r;
    return 0;
}

int comm_wait(comm_req_t *req, kiln_err_t *err)
{
    if (!req)
        return 0;
    comm_engine_t *e = req->grp->eng;
    pthread_mutex_lock(&e->mu);
    uint64_t seen = e->ticks;
    int64_t since = kiln_mono_us();
    while (!req->done) {
        struct timespec ts;
        kiln_deadline_in(&ts, 200);
        pthread_cond_timedwait(&e->cv_done, &e->mu, &ts);
        if (req->done)
            break;
        if (e->ticks != seen) {
            seen = e->ticks;
            since = kiln_mono_us();
            continue;
        }
        if (kiln_mono_us() - since < COMM_STUCK_US)
            continue;
        /* The progress thread is stuck inside the provider (COMM_STUCK_US): watch the peers from
         * here so a death is still noticed and named. */
        pthread_mutex_unlock(&e->mu);
        if (pthread_mutex_trylock(&e->ctl_mu) == 0) {
            comm_ctl_poll(e);
            pthread_mutex_unlock(&e->ctl_mu);
        }
        pthread_mutex_lock(&e->mu);
        if (!e->failed && kiln_mono_us() - since >= e->watchdog_us)
            comm_watchdog_fail_locked(e, req, (kiln_mono_us() - since) / 1e6);
        if (e->failed && !req->done) {
            /* The stuck thread may still hold req: leave it allocated. */
            comm_keep_abandoned(req);
            int st = e->failed;
            kiln_err_set(err, st, NULL, "%s", e->failmsg[0] ? e->failmsg : kiln_strerror(st));
            pthread_mutex_unlock(&e->mu);
            return st;
        }
    }
    pthread_mutex_unlock(&e->mu);
    int st = req->status;
    if (st != 0)
        kiln_err_set(err, st, NULL, "%s", req->msg[0] ? req->msg : kiln_strerror(st));
    req_free(req);
    return st;
}

void comm_test(comm_req_t *req, bool *done)
{
    if (!req) {
        *done = true;
        return;
    }
    comm_engine_t *e = req->grp->eng;
    pthread_mutex_lock(&e->mu);
    *done = req->done;
    pthread_mutex_unlock(&e->mu);
}

static int start_coll_wire(comm_t *c, comm_op_kind_t kind, void *buf, size_t n, size_t esize,
                           comm_redop_t op, comm_wire_t wire, int root, comm_req_t **req, kiln_err_t *err)
{
    *req = NULL;
    if (!c || (!buf && n > 0))
        return kiln_err_set(err, KILN_EINVAL, NULL, "a group and a buffer are required");
    if (op != COMM_SUM && op != COMM_AVG)
        return kiln_err_set(err, KILN_EINVAL, NULL, "unknown reduction %d", (int)op);
    if (wire != COMM_WIRE_FP32 && wire != COMM_WIRE_BF16)
        return kiln_err_set(err, KILN_EINVAL, NULL, "unknown wire type %d", (int)wire);
    if (root < 0 || root >= c->size)
        return kiln_err_set(err, KILN_EINVAL, NULL, "root %d is not a rank of a group of %d", root, c->size);
    comm_req_t *r = req_new(c, kind, buf, n, esize);
    if (!r)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    r->redop = op;
    r->wire = c->size > 1 ? wire : COMM_WIRE_FP32;
    r->root = root;
    return submit(c->eng, r, req, err);
}

static int start_coll(comm_t *c, comm_op_kind_t kind, void *buf, size_t n, size_t esize,
                      comm_redop_t op, int root, comm_req_t **req, kiln_err_t *err)
{
    return start_coll_wire(c, kind, buf, n, esize, op, COMM_WIRE_FP32, root, req, err);
}

int comm_allreduce_start(comm_t *c, float *buf, size_t n, comm_redop_t op, comm_req_t **req,
                         kiln_err_t *err)
{
    return start_coll(c, COMM_OP_ALLREDUCE, buf, n, sizeof(float), op, 0, req, err);
}

int comm_reduce_scatter_start(comm_t *c, float *buf, size_t n, comm_redop_t op, comm_req_t **req,
                              kiln_err_t *err)
{
    return start_coll(c, COMM_OP_REDUCE_SCATTER, buf, n, sizeof(float), op, 0, req, err);
}

int comm_allreduce_wire_start(comm_t *c, float *buf, size_t n, comm_redop_t op, comm_wire_t wire,
                              comm_req_t **req, kiln_err_t *err)
{
    return start_coll_wire(c, COMM_OP_ALLREDUCE, buf, n, sizeof(float), op, wire, 0, req, err);
}

int comm_reduce_scatter_wire_start(comm_t *c, float *buf, size_t n, comm_redop_t op, comm_wire_t wire,
                                   comm_req_t **req, kiln_err_t *err)
{
    return start_coll_wire(c, COMM_OP_REDUCE_SCATTER, buf, n, sizeof(float), op, wire, 0, req, err);
}

int comm_allgather_start(comm_t *c, float *buf, size_t n, comm_req_t **req, kiln_err_t *err)
{
    return start_coll(c, COMM_OP_ALLGATHER, buf, n, sizeof(float), COMM_SUM, 0, req, err);
}

int comm_bcast_start(comm_t *c, void *buf, size_t len, int root, comm_req_t **req, kiln_err_t *err)
{
    return start_coll(c, COMM_OP_BCAST, buf, len, 1, COMM_SUM, root, req, err);
}

static int start_p2p(comm_t *c, comm_op_kind_t kind, void *buf, size_t len, int peer, uint32_t tag,
                     size_t *out_len, comm_req_t **req, kiln_err_t *err)
{
    *req = NULL;
    if (!c || (!buf && len > 0))
        return kiln_err_set(err, KILN_EINVAL, NULL, "a group and a buffer are required");
    if (peer < 0 || peer >= c->size || peer == c->rank)
        return kiln_err_set(err, KILN_EINVAL, NULL, "peer %d is not another rank of a group of %d", peer, c->size);
    comm_req_t *r = req_new(c, kind, buf, len, 1);
    if (!r)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    r->peer = peer;
    r->tag = tag;
    r->out_len = out_len;
    return submit(c->eng, r, req, err);
}

int comm_send_start(comm_t *c, const void *buf, size_t len, int peer, uint32_t tag,
                    comm_req_t **req, kiln_err_t *err)
{
    return start_p2p(c, COMM_OP_SEND, (void *)buf, len, peer, tag, NULL, req, err);
}

int comm_recv_start(comm_t *c, void *buf, size_t cap, int peer, uint32_t tag, size_t *out_len,
                    comm_req_t **req, kiln_err_t *err)
{
    return start_p2p(c, COMM_OP_RECV, buf, cap, peer, tag, out_len, req, err);
}

/* ---- blocking forms -------------------------------------------------------------------------- */

#define START_WAIT(call)                                                                           \
    do {                                                                                           \
        comm_req_t *req_;                                                                          \
        int rc_ = (call);                                                                          \
        return rc_ != 0 ? rc_ : comm_wait(req_, err);                                              \
    } while (0)

int comm_allreduce(comm_t *c, float *buf, size_t n, comm_redop_t op, kiln_err_t *err)
{
    START_WAIT(comm_allreduce_start(c, buf, n, op, &req_, err));
}

int comm_reduce_scatter(comm_t *c, float *buf, size_t n, comm_redop_t op, kiln_err_t *err)
{
    START_WAIT(comm_reduce_scatter_start(c, buf, n, op, &req_, err));
}

int comm_allgather(comm_t *c, float *buf, size_t n, kiln_err_t *err)
{
    START_WAIT(comm_allgather_start(c, buf, n, &req_, err));
}

int comm_bcast(comm_t *c, void *buf, size_t len, int root, kiln_err_t *err)
{
    START_WAIT(comm_bcast_start(c, buf, len, root, &req_, err));
}

int comm_send(comm_t *c, const void *buf, size_t len, int peer, uint32_t tag, kiln_err_t *err)
{
    START_WAIT(comm_send_start(c, buf, len, peer, tag, &req_, err));
}

int comm_recv(comm_t *c, void *buf, size_t cap, int peer, uint32_t tag, size_t *out_len,
              kiln_err_t *err)
{
    START_WAIT(comm_recv_start(c, buf, cap, peer, tag, out_len, &req_, err));
}

/* All-gather of one element of esize bytes per rank (elems: size * esize bytes, own slot filled). */
static int gather_small(comm_t *c, void *elems, size_t esize, kiln_err_t *err)
{
    comm_req_t *req = NULL;
    int rc = start_coll(c, COMM_OP_ALLGATHER, elems, (size_t)c->size, esize, COMM_SUM, 0, &req, err);
    return rc != 0 ? rc : comm_wait(req, err);
}

int comm_allgather_bytes(comm_t *c, void *slots, size_t slot_bytes, kiln_err_t *err)
{
    if (!c || slot_bytes == 0)
        return kiln_err_set(err, KILN_EINVAL, NULL, "a group and a slot size are required");
    return gather_small(c, slots, slot_bytes, err);
}

int comm_barrier(comm_t *c, kiln_err_t *err)
{
    if (!c)
        return kiln_err_set(err, KILN_EINVAL, NULL, "a group is required");
    /* Every rank's byte reaches every other rank only after all of them entered. */
    unsigned char *b = calloc((size_t)c->size, 1);
    if (!b)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    int rc = gather_small(c, b, 1, err);
    free(b);
    return rc;
}

/* ---- groups ------------------------------------------------------------------------------------ */

static uint16_t split_gid(uint16_t parent, uint32_t nsplit, int color)
{
    uint32_t h = 2166136261u;
    uint32_t v[3] = {parent, nsplit, (uint32_t)color};
    const unsigned char *p = (const unsigned char *)v;
    for (size_t i = 0; i < sizeof(v); i++)
        h = (h ^ p[i]) * 16777619u;
    uint16_t gid = (uint16_t)((h ^ (h >> 14) ^ (h >> 28)) & 0x3fff);
    return gid ? gid : 1;
}

int comm_split(comm_t *c, int color, int key, comm_t **out, kiln_err_t *err)
{
    *out = NULL;
    if (!c)
        return kiln_err_set(err, KILN_EINVAL, NULL, "a group is required");
    if (color < 0 && color != COMM_UNDEFINED)
        return kiln_err_set(err, KILN_EINVAL, NULL, "color must be >= 0 or COMM_UNDEFINED");
    int32_t *ck = calloc((size_t)c->size * 2, sizeof(int32_t));
    if (!ck)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    ck[2 * c->rank] = color;
    ck[2 * c->rank + 1] = key;
    int rc = gather_small(c, ck, 2 * sizeof(int32_t), err);
    uint32_t nsplit = c->nsplit++;
    if (rc != 0 || color == COMM_UNDEFINED)
        goto done;
    int size = 0, myrank = 0;
    for (int r = 0; r < c->size; r++)
        if (ck[2 * r] == color)
            size++;
    comm_t *g = group_new(c->eng, 0, size, split_gid(c->gid, nsplit, color));
    if (!g) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto done;
    }
    /* Members ordered by (key, parent rank): insertion sort of parent ranks. */
    int m = 0;
    for (int r = 0; r < c->size; r++) {
        if (ck[2 * r] != color)
            continue;
        int i = m++;
        while (i > 0) {
            int q = g->members[i - 1];
            int kq = ck[2 * q + 1], kr = ck[2 * r + 1];
            if (kq < kr || (kq == kr && q < r))
                break;
            g->members[i] = q;
            i--;
        }
        g->members[i] = r;
    }
    for (int i = 0; i < size; i++) {
        if (g->members[i] == c->rank)
            myrank = i;
        g->members[i] = c->members[g->members[i]]; /* parent rank -> world rank */
    }
    g->rank = myrank;
    pthread_mutex_lock(&c->eng->mu);
    c->eng->refs++;
    pthread_mutex_unlock(&c->eng->mu);
    *out = g;
done:
    free(ck);
    return rc;
}

void comm_destroy(comm_t *c)
{
    if (!c)
        return;
    comm_engine_t *e = c->eng;
    pthread_mutex_lock(&e->mu);
    if (e->refs <= 0) {
        pthread_mutex_unlock(&e->mu);
        log_error("comm: comm_destroy on an engine with no groups");
        return;
    }
    bool last = --e->refs == 0;
    pthread_mutex_unlock(&e->mu);
    if (last) {
        /* Teardown handshake in queue order, after every earlier operation. */
        comm_req_t *r = req_new(c, COMM_OP_SHUTDOWN, NULL, 0, 1), *req = NULL;
        kiln_err_t err;
        if (r && submit(e, r, &req, &err) == 0 && comm_wait(req, &err) != 0)
            log_warn("comm: teardown: %s", err.message);
        engine_free(e);
    }
    free(c->members);
    free(c);
}
