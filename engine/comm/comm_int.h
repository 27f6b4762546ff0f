/* comm_int.h - internals of the comm module shared by its files: the engine (one per process:
 * fabric endpoint, control connections, progress thread), groups, requests, the transport table
 * and the libfabric helpers. Nothing outside engine/comm/ includes this header. */
#ifndef KILN_COMM_INT_H
#define KILN_COMM_INT_H

#include "engine/comm/comm.h"

#include <pthread.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#define COMM_HOST_MAX 64
#define COMM_ADDR_MAX 256
#define COMM_MSG_MAX 256
#define COMM_PROV_MAX 16
/* Collectives running at once (started in submission order, on disjoint buffers): while one
 * waits on a peer (the all-gather half waits for the reduce-scatter half to come round), the
 * next keeps the link busy. Each holds at most `depth` staging slots of its own. */
#define COMM_COLL_INFLIGHT 4

typedef struct comm_engine comm_engine_t;
typedef struct comm_ring comm_ring_t;

typedef enum {
    COMM_OP_ALLREDUCE = 0,
    COMM_OP_REDUCE_SCATTER,
    COMM_OP_ALLGATHER,
    COMM_OP_BCAST,
    COMM_OP_SEND,
    COMM_OP_RECV,
    COMM_OP_SHUTDOWN, /* engine teardown handshake over the control connections */
} comm_op_kind_t;

/* One libfabric transfer in flight. The fi_context2 must come first: completions hand back its
 * address. */
typedef struct comm_xfer {
    struct fi_context2 ctx;
    comm_req_t *op;
    uint32_t unit;  /* ring unit (step * chunks + chunk) */
    int slot;       /* staging slot of a reducing receive, or -1 */
    bool is_send;
    bool busy;
} comm_xfer_t;

struct comm_req {
    comm_op_kind_t kind;
    comm_t *grp;          /* borrowed; the group outlives its requests */
    uint16_t gid;
    uint32_t seq;         /* collective sequence number within the group */
    void *buf;
    size_t n;             /* elements (collectives) or bytes (bcast, send, recv capacity) */
    size_t esize;         /* element size in bytes */
    comm_redop_t redop;
    comm_wire_t wire;     /* reducing collectives: the type on the wire */
    int root;             /* bcast root, group rank */
    int peer;             /* send/recv peer, group rank */
    uint32_t tag;
    size_t *out_len;      /* recv: received size at completion (may be NULL) */
    void *owned;          /* scratch freed with the request (barrier buffer) */

    /* completion; guarded by the engine mutex */
    bool done;
    int status;
    char msg[COMM_MSG_MAX];

    comm_req_t *next;     /* submission queue / collective FIFO link */
    comm_req_t *anext;    /* active list link (progress thread only) */

    /* executor state: progress thread only */
    bool started;
    int64_t started_us;   /* kiln_mono_us() when started */
    comm_ring_t *ring;
    comm_xfer_t x;        /* the single transfer of a send/recv */
    bool x_pending;       /* send/recv not yet posted (fabric said EAGAIN) */
    struct fid_mr *mr;    /* registration of buf when the provider needs FI_MR_LOCAL */
    void *desc;
};

struct comm {
    comm_engine_t *eng;
    int rank;             /* in this group */
    int size;
    int *members;         /* (size) world rank of each group rank */
    uint16_t gid;         /* tag space; 0 for the world */
    uint32_t next_seq;    /* guarded by the engine mutex */
    uint32_t nsplit;      /* comm_split() calls made on this group */
};

/* A transport executes queued operations for the progress thread. The libfabric one runs ring
 * algorithms over tagged messages; a device transport (NCCL) plugs in with the same table:
 * comm_create() picks e->tp; the rendezvous already ships a 256-byte address per rank (NCCL puts
 * its ncclUniqueId in rank 0's entry instead of a fabric name); start() enqueues ncclAllReduce
 * etc. on the comm stream and records an event, progress() polls cudaEventQuery and
 * ncclCommGetAsyncError and finishes ops, abort() calls ncclCommAbort. Dead-peer detection over
 * the control connections works unchanged. */
typedef struct comm_transport {
    const char *name;
    /* Begins op (a collective or send/recv). Returns 0 or a status that fails only this op. */
    int (*start)(comm_engine_t *e, comm_req_t *op, char *msg);
    /* Drives progress once: completes finished ops through comm_op_finish(). Sets *events to
     * the work it did. With wait_ms > 0 and can_wait(), it may first sleep up to wait_ms for a
     * completion. Returns 0, or a status with msg when the whole engine is broken. */
    int (*progress)(comm_engine_t *e, int wait_ms, int *events, char *msg);
    /* Whether progress() can sleep until data arrives (else the thread naps between polls). */
    bool (*can_wait)(comm_engine_t *e);
    /* Wakes a progress() sleeping in its wait (new work was submitted). Any thread. */
    void (*wake)(comm_engine_t *e);
    /* Cancels every transfer in flight after a failure (buffers are given back). */
    void (*abort)(comm_engine_t *e);
    void (*close)(comm_engine_t *e);
} comm_transport_t;

typedef struct comm_fabric {
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_av *av;
    struct fid_cq *cq;
    struct fid_ep *ep;
    fi_addr_t *peers;     /* (world) fabric address of each world rank */
    bool mr_local;        /* provider needs registered local buffers */
    bool abandoned;       /* failed: never call into the provider again */
    bool cq_wait;         /* the completion queue has a wait object (fi_cq_sread works) */
    uint64_t mr_key;      /* next requested key when the provider does not pick keys */
    char name[COMM_ADDR_MAX];
    size_t namelen;
    float *slots;         /* staging for reducing receives: depth slots of slot_bytes for each
                           * of COMM_COLL_INFLIGHT collectives */
    size_t slot_bytes;
    struct fid_mr *slots_mr;
    void *slots_desc;
    int *slot_free;       /* stack of free slot indices */
    int nslot_free;
} comm_fabric_t;

struct comm_engine {
    int refs;             /* groups alive; guarded by mu */
    int rank, world, local_rank;
    char (*hosts)[COMM_HOST_MAX]; /* (world) host name of each rank */
    char provider[COMM_PROV_MAX]; /* "shm" or "tcp" */
    size_t chunk_bytes;
    int depth;
    bool blocking;        /* comm_config_t's */
    long test_stall_after; /* comm_config_t's; collectives_started counts against it */
    long collectives_started;
    double timeout_s;
    int64_t watchdog_us;  /* started operations with no progress for this long fail */
    /* How the progress thread waits while transfers are in flight but none completed (the
     * transport sets them; progress.c says why): yields first, then naps of nap_us. */
    int spin_yields;
    int nap_us;

    const comm_transport_t *tp;
    comm_fabric_t fab;

    /* control connections kept from the rendezvous: rank 0 holds one per rank (ctl_fds[0] is
     * -1), other ranks hold ctl_fds[0], their link to rank 0. */
    int *ctl_fds;
    int nctl;
    uint8_t (*ctl_buf)[8];
    int *ctl_have;
    bool *ctl_bye;        /* rank 0: rank said goodbye (so its disconnect is not a death) */
    bool allbye;          /* every rank reached teardown */
    int64_t last_ctl_us;

    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_submit;
    pthread_cond_t cv_done;
    comm_req_t *q_head, *q_tail;  /* submitted, not yet taken by the thread (mu) */
    bool stop;                    /* mu */
    int failed;                   /* mu: 0 or the status every op now fails with */
    char failmsg[COMM_MSG_MAX];   /* mu */
    uint64_t ticks;               /* mu: progress loop iterations; a waiter that sees none for
                                   * COMM_STUCK_US knows the thread is stuck in the provider */
    bool thread_done;             /* mu: progress_main returned */
    bool thread_stuck;            /* the thread never came back after a failure: left detached,
                                   * and the engine is never freed under it */
    pthread_mutex_t ctl_mu;       /* serialises comm_ctl_poll (progress thread or a waiter) */

    /* progress thread only */
    comm_req_t *coll_head, *coll_tail; /* collectives in submission order, not finished; the
                                        * first COMM_COLL_INFLIGHT may run (progress.c) */
    comm_req_t *active;                /* started ops not finished, oldest first */
    int64_t pending_fail_us;           /* fabric error seen: fail then unless a death explains it */
    int64_t progress_us;               /* last time a transfer completed or an op started/ended */
    char pending_fail[COMM_MSG_MAX];
};

/* ---- engine (comm.c, progress.c) ---- */
/* A progress thread that has not come round its loop for this long is stuck inside the provider:
 * libfabric's shm provider can spin forever on a lock that a killed peer held in shared memory.
 * Waiters then watch the control connections themselves, so a dead peer is still named. */
#define COMM_STUCK_US 2000000
/* Marks op finished with status/msg (msg may be NULL) and wakes waiters. Progress thread. */
void comm_op_finish(comm_engine_t *e, comm_req_t *op, int status, const char *msg);
/* Memory a failed engine keeps on purpose (a stuck thread's engine, an abandoned endpoint's
 * buffers the provider may still touch) stays referenced from here for the process's life, so it
 * is kept, not lost (and leak checkers see it so). NULL is ignored. Any thread. */
void comm_keep_abandoned(void *p);
/* Puts the engine into the failed state (first message wins). Any thread. */
void comm_engine_fail(comm_engine_t *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The watchdog tripped for op (stalled for secs): the engine fails with KILN_ETIMEDOUT naming
 * the rank op waits on. Called with e->mu held. */
void comm_watchdog_fail_locked(comm_engine_t *e, const comm_req_t *op, double secs);
int comm_progress_start(comm_engine_t *e, kiln_err_t *err);
void comm_progress_stop(comm_engine_t *e);

/* ---- rendezvous and control connections (rendezvous.c) ---- */
/* Runs the rendezvous for e (rank, world, hosts filled from cfg), opens the fabric through
 * comm_fabric_open() and fills e->hosts, e->fab.peers and e->ctl_fds. */
int comm_rendezvous(comm_engine_t *e, const comm_config_t *cfg, kiln_err_t *err);
/* Polls the control connections (non-blocking): relays deaths, handles goodbyes. */
void comm_ctl_poll(comm_engine_t *e);
/* Starts the teardown handshake for this rank (progress thread). */
void comm_ctl_bye(comm_engine_t *e);
void comm_ctl_close(comm_engine_t *e);

/* ---- libfabric (fabric.c) ---- */
extern const comm_transport_t comm_fabric_transport;
/* Opens provider prov ("shm" or "tcp") bound to node (an IP address for tcp, NULL for shm) and
 * fills e->fab.name/namelen with the endpoint address. */
int comm_fabric_open(comm_engine_t *e, const char *prov, const char *node, kiln_err_t *err);
/* Inserts the world's addresses (world entries of COMM_ADDR_MAX bytes, lengths in lens). */
int comm_fabric_insert(comm_engine_t *e, const uint8_t (*addrs)[COMM_ADDR_MAX], const uint32_t *lens,
                       kiln_err_t *err);
void comm_fabric_close(comm_engine_t *e);
/* Messages up to the ring's chunk size, clamped to [COMM_EAGER_MIN, COMM_EAGER_MAX], go eagerly
 * over tcp;ofi_rxm (pushed by the sender, no rendezvous; fabric.c says why). Larger
 * point-to-point messages keep rxm's rendezvous, which needs no receiver-side copy. */
#define COMM_EAGER_MIN 16384
#define COMM_EAGER_MAX (8u << 20)
/* Posts a tagged send/receive of x. Returns 0, 1 when the fabric is busy (retry after progress)
 * or KILN_ECOMM with msg. */
int comm_fabric_post(comm_engine_t *e, comm_xfer_t *x, void *buf, size_t len, void *desc,
                     int world_peer, uint64_t tag, char *msg);
int comm_fabric_mr(comm_engine_t *e, void *buf, size_t len, struct fid_mr **mr, void **desc, char *msg);

/* ---- ring collectives (ring.c) ---- */
int comm_ring_start(comm_engine_t *e, comm_req_t *op, char *msg);
/* Posts what the ring can post now; finishes op when all is done. Returns 0 or KILN_ECOMM. */
int comm_ring_advance(comm_engine_t *e, comm_req_t *op, char *msg);
/* A transfer of a ring completed successfully (len: bytes moved). */
void comm_ring_xfer_done(comm_engine_t *e, comm_xfer_t *x, size_t len);
void comm_ring_free(comm_req_t *op);
/* Cancels op's busy transfers (after a failure). */
void comm_ring_cancel(comm_engine_t *e, comm_req_t *op);
/* The world rank a started ring op waits on now: its left neighbour while receives are
 * outstanding, else its right neighbour. -1 when op has no ring. */
int comm_ring_waiting_on(const comm_req_t *op);

/* Tag layout: bit 63 point-to-point; bits 48..61 group id; collectives: bits 24..47 sequence,
 * bits 0..23 ring unit; point-to-point: bits 16..47 user tag. */
#define COMM_TAG_P2P (1ull << 63)
#define COMM_UNIT_MAX (1u << 24)
static inline uint64_t comm_tag_coll(uint16_t gid, uint32_t seq, uint32_t unit)
{
    return ((uint64_t)(gid & 0x3fff) << 48) | ((uint64_t)(seq & 0xffffff) << 24) | (unit & 0xffffff);
}
static inline uint64_t comm_tag_p2p(uint16_t gid, uint32_t tag)
{
    return COMM_TAG_P2P | ((uint64_t)(gid & 0x3fff) << 48) | ((uint64_t)tag << 16);
}

#endif /* KILN_COMM_INT_H */
