/* dp.h - kiln's data parallelism: every replica trains on its own shard of each global batch;
 * the gradients of a set of parameter ranges are averaged in buckets that go out while backward
 * is still running (all-reduced, or with distribution.data_parallel.shard_optimizer_state
 * reduce-scattered so each replica updates only its shard and the parameters are all-gathered
 * after: ZeRO stage 1, whose all-gather the loop's layer leaves running into the next forward,
 * each block waiting for its own buckets), and every replica's share of the global norm is its
 * shard of each bucket. Host tensors move over comm/; device tensors over the backend's collectives (NCCL).
 * A job of plain data parallelism runs it as the training loop's parallel layer (dp_parallel);
 * the pipeline runs one inside each stage for that stage's replicas. It is not the collectives
 * (engine/comm/) nor the pipeline (engine/pipe/). */
#ifndef KILN_DP_H
#define KILN_DP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "engine/comm/comm.h"
#include "engine/engine.h"

struct spec;

typedef struct dp dp_t;

/* How the data-parallel layer runs. dp_opts_init() fills it from the spec, then kiln-train's
 * settings may override (dp_settings_apply). */
typedef struct dp_opts {
    double bucket_mb;           /* gradient bucket size in MiB of fp32 gradients
                                 * (distribution.data_parallel.bucket_mb); 0: chosen from the
                                 * model when the buckets are planned (dp_bucket_mb_choose) */
    bool overlap;               /* launch each bucket as soon as backward finished it (default);
                                 * false: all buckets after backward (the benchmark's baseline) */
    bool shard_optimizer_state; /* ZeRO-1: reduce-scatter, update this rank's shard, all-gather */
    bool bf16_gradients;        /* gradients travel as bf16, sums in fp32 (comm_wire_t;
                                 * distribution.data_parallel.gradient_dtype "bf16"); parameters
                                 * (ZeRO's all-gather) stay fp32 */
    bool check;                 /* after every step, verify all ranks hold identical parameters */
    int inject_rank;            /* tests: this rank perturbs a parameter after step inject_step */
    int64_t inject_step;        /* <= 0: never */
    double watchdog_s;          /* device collectives: fail when none completes for this long
                                 * (COMM_WATCHDOG_DEFAULT_S; the rank contract's
                                 * KILN_COMM_WATCHDOG_S, which eng_job_run applies) */
} dp_opts_t;

/* Counters of one run (for logs, benchmarks and tests). */
typedef struct dp_stats {
    int n_buckets;
    size_t max_bucket_floats;
    double bucket_mb;            /* the bucket size planned with (bucket_mb's unit) */
    bool bucket_chosen;          /* ... chosen from the model (bucket_mb was not set) */
    int64_t wait_notes;          /* times the log said a step waited too long (at most 1) */
    size_t opt_state_bytes;      /* AdamW m+v this rank keeps */
    size_t opt_state_full_bytes; /* what an unsharded replica keeps */
    int64_t steps;
    int64_t early_launches;      /* buckets launched during backward */
    double finish_wait_s;        /* time grads_finish spent waiting for reductions (total) */
    double comm_s;               /* time in the collectives after the update (gather, check) */
    int64_t gathers_in_forward;  /* ZeRO: steps whose parameter all-gather went on into the
                                  * next forward */
    double params_wait_s;        /* time the loop waited for those all-gathers */
} dp_stats_t;

/* Where a group's buckets travel; each bounds the bucket size dp chooses differently. */
typedef enum dp_transport {
    DP_TRANSPORT_SHM,     /* comm/ within one host (libfabric shm) */
    DP_TRANSPORT_NETWORK, /* comm/ between hosts (libfabric tcp;ofi_rxm) */
    DP_TRANSPORT_DEVICE,  /* the backend's device collectives (NCCL) */
} dp_transport_t;

/* The bucket size when distribution.data_parallel.bucket_mb is not set, from the gradient
 * this group averages (n floats) and how it travels: the bytes on the wire (bf16_wire: 2 a
 * float, else 4) split into DP_BUCKETS_TARGET buckets, each kept within the transport's
 * bounds on the wire (dp_bucket_bounds). Enough buckets that the first leaves early in
 * backward and the last, all that is left to send once backward ends, is small; few enough
 * that each bucket's fixed cost (a collective's latency, the communication thread's wake-ups)
 * stays small against its transfer. Returns MiB of fp32 gradients, bucket_mb's unit. Pure. */
#define DP_BUCKETS_TARGET 16
double dp_bucket_mb_choose(size_t n, bool bf16_wire, dp_transport_t t);
/* The transport's bounds of a chosen bucket, in MiB on the wire (OUT), and its name. */
const char *dp_bucket_bounds(dp_transport_t t, double *min_mib, double *max_mib);

/* Defaults from spec->dist: bucket_mb (0 when the spec leaves it to dp), shard_optimizer_state,
 * gradient_dtype; overlap on, check off. */
void dp_opts_init(dp_opts_t *o, const struct spec *s);
/* dp_settings_apply() lays these over dp_opts_init's; they live in eng_settings_t (engine.h),
 * which kiln-train's settings table fills. */
void dp_settings_apply(dp_opts_t *o, const eng_settings_t *s);

/* Creates the layer over group c (borrowed; must outlive the result). Caller owns *out (OUT);
 * free with dp_destroy(). Returns 0, KILN_EINVAL, KILN_ENOMEM. */
int dp_create(comm_t *c, const dp_opts_t *o, dp_t **out, kiln_err_t *err);
/* Releases the layer (waits for reductions still in flight). Accepts NULL. */
void dp_destroy(dp_t *d);

/* Takes charge of the gradients of blocks 0..n_blocks-1 (block_ranges(model, b, out) gives a
 * block's ranges, at most ENG_MAX_TENSORS; ranges of different blocks are identical or
 * disjoint, and one listed by several blocks belongs to the lowest): plans the buckets and
 * this rank's shard of each, and narrows share->update (all the ranges, or the shards under
 * ZeRO) and share->norm (the shards). p, m and v are borrowed. Collective over the group (device
 * collectives are created here). Returns 0, KILN_EINVAL (an option the backend does not have in
 * spec.h's capability table, e.g. ZeRO on device memory: its refusal), KILN_EUNSUPP (a device
 * backend whose build has no device collectives), KILN_ENOMEM or KILN_ECOMM. */
int dp_attach(dp_t *d, const eng_backend_t *be, eng_params_t *p, int n_blocks,
              int (*block_ranges)(const void *model, int block, eng_range_t *out),
              const void *model, eng_share_t *share, kiln_err_t *err);
/* Backward finished the first `ranges` of block `block`'s ranges (ENG_RANGES_ALL: the whole
 * block; last microbatch): launches the buckets that are complete. */
void dp_grads_ready(dp_t *d, int block, int ranges);
/* Launches the rest and waits: the gradients of share->update / share->norm then hold the
 * group's average. */
int dp_grads_finish(dp_t *d, kiln_err_t *err);
/* ZeRO's update as the loop's layer (host memory, more than one rank): apply(actx, off, n) over
 * this rank's shards (share->update) bucket by bucket, in the order the next forward needs
 * them, each bucket's all-gather starting as soon as its shard is updated. Returns 0 or a
 * communication error. */
int dp_update(dp_t *d, void (*apply)(void *actx, size_t off, size_t n), void *actx, kiln_err_t *err);
/* After AdamW: under ZeRO, all-gathers the updated shards; with check, compares parameters.
 * As the loop's layer (dp_parallel, host memory) the all-gather goes on into the next step's
 * forward: the loop calls dp_params_wait before it reads the parameters. */
int dp_after_update(dp_t *d, int64_t step, kiln_err_t *err);
/* Waits until the parameters block `block` reads (-1: all of them) are back from ZeRO's
 * all-gather; nothing to do otherwise. Returns 0 or the communication error (also kept for
 * the next grads_finish). */
int dp_params_wait(dp_t *d, int block, kiln_err_t *err);
/* Makes group rank 0's buf (n floats, flat layout: parameters, m or v) complete with the shards
 * other ranks own (ZeRO; nothing to do otherwise). Collective over the group. */
int dp_gather(dp_t *d, float *buf, kiln_err_t *err);

/* The training loop's parallel layer for a job of plain data parallelism: replica = rank of the
 * group, the hooks above, collectives over the group. out borrows d. */
void dp_parallel(dp_t *d, eng_parallel_t *out);
void dp_get_stats(const dp_t *d, dp_stats_t *out);

#endif /* KILN_DP_H */
