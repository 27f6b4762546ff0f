/* comm.h - kiln's collective-communication layer: rendezvous through rank 0, then all-reduce,
 * reduce-scatter, all-gather, broadcast, barrier and tagged point-to-point messages between the
 * ranks of a job, blocking or asynchronous, on host memory over libfabric (`shm` within a host,
 * `tcp;ofi_rxm` across hosts). It is not the data-parallel trainer; that builds on this API.
 *
 * Model: every process holds one communication engine (one libfabric endpoint, one progress
 * thread that owns it). A comm_t is a group of ranks over that engine: the world from
 * comm_create(), sub-groups from comm_split(). Operations are queued and started by the progress
 * thread in submission order, so every rank of a group must submit the group's collectives in the
 * same order. Collectives on disjoint buffers run several at once (one that waits on a peer
 * leaves the link to the next) and may complete out of order; one queued on memory that an
 * earlier unfinished one uses starts after it. Point-to-point operations are posted in order but
 * may complete out of order.
 * Collectives use bandwidth-optimal rings, chunked and pipelined; results are bitwise identical
 * on every rank. A rank that dies makes every pending and later operation fail fast with
 * KILN_ECOMM and the dead rank named ("rank 3 (host h) disconnected"); the group is then unusable
 * (the fabric endpoint is abandoned, so no buffer of a failed operation is touched again) and the
 * caller should report the message and exit non-zero. A rank that is alive but stalled (stopped,
 * hung) trips the watchdog instead: when started operations make no progress for watchdog_s, every
 * operation fails with KILN_ETIMEDOUT naming the rank this one waits on ("no progress for 180 s
 * in an allreduce: waiting on rank 1 (host h)"). */
#ifndef KILN_COMM_H
#define KILN_COMM_H

#include "base/base.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct comm comm_t;
typedef struct comm_req comm_req_t;

typedef enum { COMM_SUM = 0, COMM_AVG = 1 } comm_redop_t;

/* What a reducing collective (all-reduce, reduce-scatter) carries between ranks; buffers are fp32
 * either way. COMM_WIRE_BF16 sends half the bytes: a rank rounds what it sends to bf16 (nearest
 * even, engine/bf16.h) and adds what it receives in fp32, and the rank that completes a shard of
 * an all-reduce rounds it to bf16 once before handing it on, so every rank still ends with
 * identical bytes. The sum loses what the rounding drops (about 3 significant digits are kept
 * of each partial sum sent), so it suits gradients, not parameters. With one rank nothing is
 * sent and nothing is rounded. */
typedef enum { COMM_WIRE_FP32 = 0, COMM_WIRE_BF16 = 1 } comm_wire_t;

/* The watchdog's default: long enough for a peer's slowest step or checkpoint, short enough that
 * a stalled job fails within minutes. KILN_COMM_WATCHDOG_S overrides it. */
#define COMM_WATCHDOG_DEFAULT_S 180

/* Pass as color to comm_split() to take no part in any new group (*out becomes NULL). */
#define COMM_UNDEFINED (-1)

typedef struct comm_config {
    int rank;                /* global rank, 0..world_size-1 */
    int world_size;          /* number of ranks, >= 1 */
    int local_rank;          /* rank on this host (informational) */
    const char *master_addr; /* rank 0's host name or address ("127.0.0.1") */
    int master_port;         /* rank 0's rendezvous TCP port */
    const char *provider;    /* NULL or "auto" (shm if all ranks share a host, else tcp), "shm", "tcp" */
    double timeout_s;        /* rendezvous timeout; <= 0 means 300 */
    double watchdog_s;       /* fail operations that make no progress for this long; <= 0 means
                              * COMM_WATCHDOG_DEFAULT_S */
    size_t chunk_bytes;      /* ring chunk size; 0 means 1 MiB */
    int depth;               /* staging slots = reducing chunks in flight (plain ones: 4x); 0 means 4 */
    const char *hostname;    /* NULL: gethostname(); tests set it to pretend ranks are on other hosts */
    const char *job_id;      /* optional: ranks presenting a different job id are refused */
    bool blocking;           /* tcp: the progress thread sleeps in libfabric's wait instead of polling
                              * (measured: 3x the small-message latency, no CPU saved) */
    long test_stall_after;   /* fault injection (tests): the progress thread stops for good when it
                              * starts its (N+1)th collective, as one stuck in the provider would;
                              * < 0 (comm_config_init's -1): never */
} comm_config_t;

/* Fills cfg with defaults (world of 1, rank 0, 127.0.0.1, automatic provider). */
void comm_config_init(comm_config_t *cfg);

/* The communication settings of a program that joins a job (kiln-train, bench/comm_bench):
 * COMM_SETTINGS_FLAGS(s) expands to their rows of its settings table (base/config.c), which
 * write into *s; comm_settings_apply() copies what is set into a comm_config_t. The fault knob
 * (COMM_SETTINGS_TEST_FLAGS) belongs in test builds only. */
typedef struct comm_settings {
    const char *provider;     /* "auto" | "shm" | "tcp"; NULL: auto */
    double timeout_s;         /* > 0: the rendezvous timeout */
    int64_t chunk_bytes;      /* > 0: the ring chunk */
    int64_t depth;            /* > 0: transfers in flight */
    bool blocking;            /* comm_config_t's */
    int64_t test_stall_after; /* comm_config_t's; -1: never */
} comm_settings_t;
#define COMM_SETTINGS_INIT {NULL, 0, 0, 0, false, -1}
#define COMM_SETTINGS_FLAGS(s)                                                                             \
    {"comm-provider", "KILN_COMM_PROVIDER", CONFIG_STR, &(s)->provider, CONFIG_ONE_OF("auto|shm|tcp"),     \
     "how ranks talk: shm within a host, tcp across hosts (auto: shm when all ranks share a host)"},        \
    {"comm-timeout-s", "KILN_COMM_TIMEOUT_S", CONFIG_DOUBLE, &(s)->timeout_s, CONFIG_RANGE(0, 86400),      \
     "rendezvous timeout: ranks that never arrive are named in the error (0: 300)"},                       \
    {"comm-chunk-bytes", "KILN_COMM_CHUNK_BYTES", CONFIG_INT, &(s)->chunk_bytes,                           \
     CONFIG_RANGE(0, 1 << 30), "ring chunk size of the collectives (0: 1 MiB)"},                          \
    {"comm-depth", "KILN_COMM_DEPTH", CONFIG_INT, &(s)->depth, CONFIG_RANGE(0, 64),                        \
     "chunks of a collective in flight (0: 4)"},                                                           \
    {"comm-blocking", "KILN_COMM_BLOCKING", CONFIG_BOOL, &(s)->blocking, CONFIG_ANY,                       \
     "tcp: the communication thread sleeps in libfabric's wait instead of polling (3x the small-message "  \
     "latency here, no CPU saved)"}
#define COMM_SETTINGS_TEST_FLAGS(s)                                                                        \
    {"comm-test-stall-after", "KILN_COMM_TEST_STALL_AFTER", CONFIG_INT, &(s)->test_stall_after,            \
     CONFIG_TEST_RANGE(-1, 1000000),                                                                        \
     "the communication thread stops for good at its (N+1)th collective, as one stuck in the provider "    \
     "would (-1: never)"}
void comm_settings_apply(comm_config_t *cfg, const comm_settings_t *s);

struct rank_env;
/* Fills cfg's place in the job from the rank contract (rank/rank.h, already read): rank, world
 * size, local rank, rendezvous address and port, job id and the watchdog; fields the contract
 * leaves unset keep their values. Strings are borrowed from re. */
void comm_config_from_rank(comm_config_t *cfg, const struct rank_env *re);
/* Reads the rank contract from the environment (rank_env_parse) into cfg (comm_config_from_rank).
 * The tuning fields (provider, timeout, chunk size, depth) are the program's settings and keep
 * their values (kiln-train's table sets them). Strings point into the environment (borrowed).
 * Returns 0 or KILN_EINVAL (err names the bad variable). */
int comm_config_from_env(comm_config_t *cfg, kiln_err_t *err);

/* Joins the job: rendezvous with every rank through rank 0 (rank 0 listens on master_port),
 * chooses the provider, opens the fabric and starts the progress thread. Collective over all
 * world_size ranks. On success *out (OUT) is the world group; caller owns it, free with
 * comm_destroy(). Returns 0, KILN_EINVAL (bad config), KILN_ETIMEDOUT ("rendezvous timed out
 * after 30 s: 1 of 4 ranks never arrived (missing: rank 3)"), KILN_ECOMM (a peer failed, fabric
 * errors) or KILN_EIO (sockets). */
int comm_create(const comm_config_t *cfg, comm_t **out, kiln_err_t *err);

/* comm_config_from_env() on a copy of base (NULL: comm_config_init's defaults) + comm_create(). */
int comm_create_from_env(const comm_config_t *base, comm_t **out, kiln_err_t *err);

/* Releases a group. Destroying the last group of the engine waits for every other rank to reach
 * its own teardown (so no rank closes while peers still receive from it; bounded by the timeout)
 * and stops the progress thread. Every request must have been waited for. Accepts NULL. */
void comm_destroy(comm_t *c);

int comm_rank(const comm_t *c);       /* rank in this group */
int comm_size(const comm_t *c);       /* ranks in this group */
/* Provider in use: "shm" or "tcp;ofi_rxm". Static storage. */
const char *comm_provider(const comm_t *c);

/* Shard boundaries used by reduce-scatter and all-gather (and ZeRO-1): element range
 * [*offset, *offset + *count) of n elements owned by rank of world. The first n % world ranks
 * own one element more; shards are contiguous and ordered by rank; counts may be 0. */
void comm_shard_range(size_t n, int rank, int world, size_t *offset, size_t *count);

/* ---- asynchronous operations -------------------------------------------------------------
 * Each *_start queues the operation and returns at once with *req (OUT); the buffer is borrowed
 * by the engine until comm_wait() returns. The caller owns *req: comm_wait() it exactly once.
 * Returns 0, KILN_EINVAL, or KILN_ECOMM when the group has already failed (then *req is NULL).
 * All functions are thread-safe; operations start in submission order (see the top of this
 * file for which run at once). */

/* buf (n floats) becomes the element-wise sum (or average) over the group, identical bytes on
 * every rank. */
int comm_allreduce_start(comm_t *c, float *buf, size_t n, comm_redop_t op, comm_req_t **req,
                         kiln_err_t *err);
/* In place: afterwards buf's shard comm_shard_range(n, rank, size) holds the reduced values of
 * that shard; the rest of buf is clobbered (partial sums). */
int comm_reduce_scatter_start(comm_t *c, float *buf, size_t n, comm_redop_t op, comm_req_t **req,
                              kiln_err_t *err);
/* The two above with the values on the wire in the given type (comm_wire_t). */
int comm_allreduce_wire_start(comm_t *c, float *buf, size_t n, comm_redop_t op, comm_wire_t wire,
                              comm_req_t **req, kiln_err_t *err);
int comm_reduce_scatter_wire_start(comm_t *c, float *buf, size_t n, comm_redop_t op, comm_wire_t wire,
                                   comm_req_t **req, kiln_err_t *err);
/* In place: each rank contributes buf's shard comm_shard_range(n, rank, size); afterwards every
 * rank holds all n floats. */
int comm_allgather_start(comm_t *c, float *buf, size_t n, comm_req_t **req, kiln_err_t *err);
/* len bytes of root's buf are copied into buf on every other rank. */
int comm_bcast_start(comm_t *c, void *buf, size_t len, int root, comm_req_t **req, kiln_err_t *err);
/* Sends len bytes to group rank peer with a user tag. Completes once the bytes are handed to the
 * fabric (it may wait for the matching receive, like MPI_Send). */
int comm_send_start(comm_t *c, const void *buf, size_t len, int peer, uint32_t tag,
                    comm_req_t **req, kiln_err_t *err);
/* Receives a message from group rank peer with the given tag into buf (capacity cap bytes);
 * messages from one peer with one tag arrive in the order sent. out_len (OUT at completion, may
 * be NULL) gets the received size. A larger message is a usage error: the receive fails with
 * KILN_ETOOBIG on shm; tcp;ofi_rxm may drop the connection, failing the group. */
int comm_recv_start(comm_t *c, void *buf, size_t cap, int peer, uint32_t tag, size_t *out_len,
                    comm_req_t **req, kiln_err_t *err);

/* Waits for req, frees it, and returns its status (0 or KILN_ECOMM / KILN_ETOOBIG with err
 * filled). Accepts NULL (returns 0). */
int comm_wait(comm_req_t *req, kiln_err_t *err);
/* Sets *done (OUT) to whether req has finished; does not free it. */
void comm_test(comm_req_t *req, bool *done);

/* ---- blocking forms: start + wait ------------------------------------------------------- */
int comm_allreduce(comm_t *c, float *buf, size_t n, comm_redop_t op, kiln_err_t *err);
int comm_reduce_scatter(comm_t *c, float *buf, size_t n, comm_redop_t op, kiln_err_t *err);
int comm_allgather(comm_t *c, float *buf, size_t n, kiln_err_t *err);
int comm_bcast(comm_t *c, void *buf, size_t len, int root, kiln_err_t *err);
int comm_barrier(comm_t *c, kiln_err_t *err);
/* Every rank fills slot `rank` (slot_bytes bytes) of slots (size x slot_bytes); afterwards every
 * slot holds that rank's bytes, exactly, on every rank. */
int comm_allgather_bytes(comm_t *c, void *slots, size_t slot_bytes, kiln_err_t *err);
int comm_send(comm_t *c, const void *buf, size_t len, int peer, uint32_t tag, kiln_err_t *err);
int comm_recv(comm_t *c, void *buf, size_t cap, int peer, uint32_t tag, size_t *out_len,
              kiln_err_t *err);

/* Collective over c: ranks passing the same color form a new group, ordered by key (ties by rank
 * in c). The new group shares c's engine and uses its own tag space. *out (OUT) is the caller's,
 * free with comm_destroy() (groups may be destroyed in any order; the engine stops with the
 * last one); NULL when color is COMM_UNDEFINED. Collective over c, executed in c's order.
 * Returns 0, KILN_EINVAL, KILN_ECOMM. */
int comm_split(comm_t *c, int color, int key, comm_t **out, kiln_err_t *err);

#endif /* KILN_COMM_H */
