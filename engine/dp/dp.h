/* dp.h - kiln's data parallelism: every rank holds a replica of the model and trains on its own
 * shard of each global batch; gradients are averaged in buckets all-reduced by comm/'s
 * communication thread while backward is still running, clipping uses the global norm, and with
 * distribution.data_parallel.shard_optimizer_state the AdamW state is sharded (ZeRO stage 1).
 * It joins the engine's training loop through eng_train_hooks_t; it is not the collectives
 * (engine/comm/) nor pipeline parallelism (engine/pipe/, which does its own hybrid replicas). */
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

/* How the data-parallel layer runs. dp_opts_init() fills it from the spec, then the
 * environment may override (dp_opts_from_env). */
typedef struct dp_opts {
    double bucket_mb;           /* gradient bucket size in MiB (distribution.data_parallel.bucket_mb) */
    bool overlap;               /* launch each bucket as soon as backward finished it (default);
                                 * false: all buckets after backward (the benchmark's baseline) */
    bool shard_optimizer_state; /* ZeRO-1: reduce-scatter, update this rank's shard, all-gather */
    bool check;                 /* after every step, verify all ranks hold identical parameters */
    int inject_rank;            /* tests: this rank perturbs a parameter after step inject_step */
    int64_t inject_step;        /* <= 0: never */
    volatile int *local_stop;   /* this rank's stop request (SIGTERM); agreed across ranks each step */
} dp_opts_t;

/* Counters of one run (for logs, benchmarks and tests). */
typedef struct dp_stats {
    int n_buckets;
    size_t max_bucket_floats;
    size_t opt_state_bytes;      /* AdamW m+v this rank keeps */
    size_t opt_state_full_bytes; /* what an unsharded replica keeps */
    int64_t steps;
    int64_t early_launches;      /* buckets launched during backward */
    double finish_wait_s;        /* time grads_finish spent waiting for reductions (total) */
    double comm_s;               /* time in the optimizer's collectives (norm, gather, check) */
} dp_stats_t;

/* Defaults from spec->dist: bucket_mb, shard_optimizer_state; overlap on, check off. */
void dp_opts_init(dp_opts_t *o, const struct spec *s);
/* Overrides from the environment: KILN_DP_CHECK=1, KILN_DP_OVERLAP=0|1, KILN_DP_BUCKET_MB=x,
 * KILN_DP_ZERO=0|1, KILN_DP_INJECT_DIVERGENCE=rank:step. Returns 0 or KILN_EINVAL (err names
 * the variable). */
int dp_opts_from_env(dp_opts_t *o, kiln_err_t *err);

/* Creates the data-parallel layer over group c (borrowed; must outlive the result) for spec s
 * (borrowed). Caller owns *out (OUT); free with dp_destroy(). Returns 0, KILN_EINVAL, KILN_ENOMEM. */
int dp_create(comm_t *c, const struct spec *s, const dp_opts_t *o, dp_t **out, kiln_err_t *err);
/* Releases the layer (waits for reductions still in flight). Accepts NULL. */
void dp_destroy(dp_t *d);

/* The hooks to put in eng_train_opts_t.hooks (ctx = d). The run must use o.rank/o.world of c.
 * Hooks are called from the training thread only. */
void dp_hooks(dp_t *d, eng_train_hooks_t *out);
/* The stop flag the training loop should read: this rank's local_stop ORed over all ranks once
 * per step, so every rank stops after the same step. Borrowed; valid until dp_destroy(). */
volatile int *dp_stop_flag(dp_t *d);
/* The last communication error (empty when none); borrowed. */
const char *dp_last_error(const dp_t *d);
void dp_get_stats(const dp_t *d, dp_stats_t *out);

/* kiln-train's entry for world size > 1 without pipeline partitions: joins the job's ranks
 * (comm_create_from_env() when world is NULL; otherwise borrows world), runs eng_train_run with
 * the data-parallel hooks (options from the spec, then the environment), and leaves the group.
 * opts->rank and opts->world are taken from the group. A rank that dies makes this return
 * KILN_ECOMM with the dead rank named in err. res as for eng_train_run; stats (may be NULL) gets
 * the counters. */
int dp_train_run(const struct spec *s, const eng_train_opts_t *opts, comm_t *world,
                 eng_train_result_t *res, dp_stats_t *stats, kiln_err_t *err);

#endif /* KILN_DP_H */
