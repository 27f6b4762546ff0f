/* pipe.h - kiln's pipeline model parallelism: block profiles, automatic partitioning of a model's
 * blocks into contiguous stages (optimised for speed or memory), the partition plan as JSON,
 * pipeline schedules as data (per-stage action lists run by one loop) and a deterministic
 * simulator of those schedules. It is not the model: the engine's blocks do the arithmetic and
 * comm/ moves the bytes; this module decides what runs where and in which order. */
#ifndef KILN_PIPE_H
#define KILN_PIPE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "engine/comm/comm.h"
#include "engine/dp/dp.h"
#include "engine/engine.h"

/* ------------------------------------------------------------------------------------------
 * Profiles and partitioning
 * ------------------------------------------------------------------------------------------ */

/* What one block costs. Times are per microbatch; bytes per rank. */
typedef struct pipe_block_profile {
    double fwd_ms, bwd_ms;      /* forward / backward time of one microbatch */
    size_t param_bytes;         /* parameters (gradients take as much again) */
    size_t opt_bytes;           /* optimizer state (AdamW: 2 x param_bytes) */
    size_t act_bytes_per_mb;    /* activations one microbatch keeps from forward to backward */
} pipe_block_profile_t;

typedef enum { PIPE_OPT_SPEED = 0, PIPE_OPT_MEMORY = 1 } pipe_optimize_t;
/* FORWARD is the forward-only list used for evaluation (RA, F, SA per microbatch, one slot). */
typedef enum { PIPE_SCHED_SIMPLE = 0, PIPE_SCHED_INTERLEAVED = 1, PIPE_SCHED_FORWARD = 2 } pipe_sched_kind_t;

/* "speed"/"memory" and "simple"/"interleaved" <-> enums. Parsers return 0 or KILN_EINVAL. */
const char *pipe_optimize_name(pipe_optimize_t o);
const char *pipe_sched_name(pipe_sched_kind_t k);
int pipe_optimize_parse(const char *s, pipe_optimize_t *out);
int pipe_sched_parse(const char *s, pipe_sched_kind_t *out);

/* Activation sets stage `stage` of `n_stages` keeps alive at most with m microbatches:
 * simple (GPipe) keeps all m; interleaved (1F1B) keeps min(m, n_stages - stage). */
int pipe_sched_live_acts(pipe_sched_kind_t k, int stage, int n_stages, int m);

/* One stage of a plan: the inclusive block range [first, last]. */
typedef struct pipe_stage {
    int first, last;
    double predicted_ms;      /* compute of one step on this stage: m x sum(fwd_ms + bwd_ms) */
    double predicted_mem_mb;  /* params + grads + optimizer state + kept activations, MiB */
} pipe_stage_t;

/* A partition plan. Caller's storage; pipe_plan_deinit() releases `stages`. */
typedef struct pipe_plan {
    int version;              /* 1 */
    pipe_optimize_t optimize;
    pipe_sched_kind_t schedule;
    int microbatches;
    int n_blocks;
    int head_blocks;          /* blocks the model's head is cut into (a GPT's vocabulary slices), >= 1 */
    int n_stages;
    pipe_stage_t *stages;     /* (n_stages), owned */
    double balance;           /* slowest stage / mean stage time (1 = perfect); 0 if unknown */
    double predicted_pass_ms; /* one pass of m microbatches through the pipeline (simulated) */
    double predicted_bubble;  /* idle fraction of that pass (simulated with the stage costs) */
    double memory_limit_mb;   /* per-rank limit the plan was made for; 0 = none */
    bool manual;              /* true when the plan came from the user */
} pipe_plan_t;

/* Partitioning request. */
typedef struct pipe_partition_opts {
    int n_stages;             /* p >= 1 */
    int microbatches;         /* m >= 1 */
    pipe_optimize_t optimize;
    pipe_sched_kind_t schedule;
    size_t mem_limit_bytes;   /* per-rank memory limit; 0 = none */
    size_t rank_overhead_bytes; /* memory every stage needs besides its blocks (scratch, and with
                                 * activation checkpointing the recompute workspace) */
} pipe_partition_opts_t;

/* Memory of stage `stage` holding blocks [first, last] under opts (bytes): parameters, gradients
 * (as large as parameters), optimizer state, act_bytes_per_mb x the activation sets the
 * schedule keeps live on that stage, and opts->rank_overhead_bytes. */
size_t pipe_stage_mem(const pipe_block_profile_t *prof, int first, int last, int stage,
                      const pipe_partition_opts_t *opts);
/* Time of blocks [first, last] for one microbatch (sum of fwd_ms + bwd_ms). */
double pipe_stage_time(const pipe_block_profile_t *prof, int first, int last);

/* Chooses contiguous stage boundaries for n blocks (n >= opts->n_stages, every stage non-empty)
 * and fills *out (OUT; caller's storage, release with pipe_plan_deinit()).
 * "speed": minimises the slowest stage's time with every stage's memory within the limit, ties
 * broken by the smallest largest-stage memory. "memory": minimises the largest stage's memory,
 * ties broken by the smallest slowest-stage time. Remaining ties go to the split whose stage
 * times are most even (least sum of squares). Exact (dynamic programming, O(p n^2)).
 * Fills predicted_ms, predicted_mem_mb, balance and the simulated pass time and bubble. Returns 0; KILN_EINVAL (bad options, fewer
 * blocks than stages); KILN_EUNFIT when no split fits the memory limit ("model does not fit:
 * ..."). Thread-safe. */
int pipe_partition(const pipe_block_profile_t *prof, int n, const pipe_partition_opts_t *opts,
                   pipe_plan_t *out, kiln_err_t *err);

/* Fills predicted_ms / predicted_mem_mb / balance / memory_limit_mb of a plan (e.g. a manual
 * one) from profiles, with the plan's own stage count, schedule and microbatch count and the
 * memory terms of opts (limit, overhead; may be NULL). */
void pipe_plan_predict(pipe_plan_t *plan, const pipe_block_profile_t *prof, const pipe_partition_opts_t *opts);

/* ------------------------------------------------------------------------------------------
 * Plans as JSON
 * ------------------------------------------------------------------------------------------ */

void pipe_plan_init(pipe_plan_t *p);
void pipe_plan_deinit(pipe_plan_t *p); /* accepts NULL and zeroed plans */
/* Deep copy; dst is overwritten (release it first). Returns 0 or KILN_ENOMEM. */
int pipe_plan_copy(pipe_plan_t *dst, const pipe_plan_t *src);

/* The plan as a JSON object:
 * {"version": 1, "optimize": "speed", "schedule": "interleaved", "microbatches": 4,
 *  "n_blocks": 8, "head_blocks": 1, "memory_limit_mb": 0, "manual": false, "stages": [{"stage": 0, "blocks": [0, 3],
 *  "predicted_ms": 12.3, "predicted_mem_mb": 210.5}, ...], "balance": 1.04,
 *  "predicted_pass_ms": 15.2, "predicted_bubble": 0.2}.
 * Caller owns the result (json_decref); NULL only on allocation failure. */
json_t *pipe_plan_to_json(const pipe_plan_t *p);
/* Same, as indented text. Caller owns the result (free()). */
char *pipe_plan_to_string(const pipe_plan_t *p);

/* Reads and validates a plan for a model of n_blocks blocks cut into n_stages stages (the job's
 * partitions). Accepts the full form above (missing optional fields take defaults) and the
 * compact {"stages": [[0, 1], [2, 3]]}; a bare array of ranges is accepted as well. Checks that
 * the stages are in order, non-empty, in range, do not overlap, cover every block, and that
 * there are exactly n_stages of them; each error names the stage and the blocks at fault, with
 * err->field "distribution.model_parallel.partition_plan". *out (OUT) is manual=true.
 * Returns 0 or KILN_EINVAL. */
int pipe_plan_from_json(const json_t *j, int n_blocks, int n_stages, pipe_plan_t *out,
                        kiln_err_t *err);
/* The plan's "head_blocks" (1 when absent), which fixes the model's block count; 0 when it is
 * not a positive integer up to PIPE_MAX_HEAD_BLOCKS. */
int pipe_plan_json_head_blocks(const json_t *j);
/* Validates an already-built plan the same way (blocks contiguous and covering 0..n_blocks-1,
 * n_stages stages). Returns 0 or KILN_EINVAL. */
int pipe_plan_validate(const pipe_plan_t *p, int n_blocks, int n_stages, kiln_err_t *err);
/* Stage that owns `block`, or -1. */
int pipe_plan_stage_of(const pipe_plan_t *p, int block);

/* ------------------------------------------------------------------------------------------
 * Schedules as data
 * ------------------------------------------------------------------------------------------ */

typedef enum {
    PIPE_FORWARD = 0,   /* forward of microbatch mb through this stage's blocks */
    PIPE_BACKWARD,      /* backward of microbatch mb (frees its activation set) */
    PIPE_SEND_ACT,      /* send mb's output activations to the next stage */
    PIPE_RECV_ACT,      /* receive mb's input activations from the previous stage */
    PIPE_SEND_GRAD,     /* send the gradient of mb's input to the previous stage */
    PIPE_RECV_GRAD,     /* receive the gradient of mb's output from the next stage */
} pipe_action_kind_t;

const char *pipe_action_name(pipe_action_kind_t k); /* "F", "B", "SA", "RA", "SG", "RG" */

typedef struct pipe_action {
    pipe_action_kind_t kind;
    int mb;    /* microbatch 0..m-1 */
    int slot;  /* activation slot mb uses on this stage (0..peak-1): buffers are reused */
} pipe_action_t;

/* A stage's action list. Caller's storage; pipe_sched_deinit() releases the array. */
typedef struct pipe_sched {
    pipe_sched_kind_t kind;
    int stage, n_stages, m;
    pipe_action_t *actions; /* (n) owned */
    int n;
    int peak_live;          /* most activation sets alive at once on this stage */
} pipe_sched_t;

/* Builds the action list of `stage` (0..n_stages-1) for m microbatches into *out (OUT).
 * simple: for each mb RECV_ACT, FORWARD, SEND_ACT; then for each mb RECV_GRAD, BACKWARD,
 * SEND_GRAD. interleaved (1F1B): min(n_stages - stage - 1, m) warm-up forwards, then one forward
 * and one backward alternately, then the remaining backwards. forward: RECV_ACT, FORWARD,
 * SEND_ACT per microbatch, all in slot 0 (evaluation; no backward). The first stage has no RECV_ACT /
 * SEND_GRAD, the last no SEND_ACT / RECV_GRAD. Sends are meant to be asynchronous (posted, then
 * completed by the finish hook); with that, every stage's list is deadlock-free (the simulator
 * proves it for given p, m). Returns 0, KILN_EINVAL or KILN_ENOMEM. */
int pipe_sched_build(pipe_sched_kind_t kind, int stage, int n_stages, int m, pipe_sched_t *out,
                     kiln_err_t *err);
void pipe_sched_deinit(pipe_sched_t *s); /* accepts NULL */
/* The list as text, one action per token ("F0 SA0 F1 SA1 RG0 B0 ..."), into buf (size n). */
char *pipe_sched_format(const pipe_sched_t *s, char *buf, size_t n);

/* Costs for the simulator, in arbitrary time units. Per-stage arrays of length n_stages
 * (NULL: 1 for fwd, 1 for bwd). comm is the delay from a send to the matching receive being
 * able to complete (>= 0). */
typedef struct pipe_sim_costs {
    const double *fwd;
    const double *bwd;
    double comm;
} pipe_sim_costs_t;

typedef struct pipe_sim_result {
    double makespan;   /* time the last stage finishes */
    double busy_total; /* sum over stages of time spent in FORWARD / BACKWARD */
    double bubble;     /* 1 - busy_total / (n_stages x makespan): the idle fraction */
} pipe_sim_result_t;

/* Runs the action lists of all n_stages stages (scheds[s] for stage s) against each other:
 * each stage runs its actions in order; FORWARD/BACKWARD take their cost; sends are
 * asynchronous (cost 0 to the sender); a receive waits for its matching send + comm. Checks
 * that every send has exactly one matching receive. Returns 0 with *out filled; KILN_EINVAL when
 * the lists do not match (a receive nobody sends, a send nobody receives) or deadlock, with a
 * message naming the stage and action that is stuck. Deterministic, single-threaded. */
int pipe_sim_run(const pipe_sched_t *scheds, int n_stages, const pipe_sim_costs_t *costs,
                 pipe_sim_result_t *out, kiln_err_t *err);

/* Simulates the plan's schedule with its stages' forward and backward costs (sums of the
 * blocks' fwd_ms / bwd_ms) and fills plan->predicted_pass_ms and predicted_bubble. Returns 0,
 * KILN_EINVAL or KILN_ENOMEM. */
int pipe_plan_simulate(pipe_plan_t *plan, const pipe_block_profile_t *prof, kiln_err_t *err);

/* Theoretical bubble of a synchronous pipeline with uniform stages: (p-1)/(m+p-1). */
double pipe_bubble_theory(int n_stages, int m);

/* ------------------------------------------------------------------------------------------
 * The one loop that runs a schedule
 * ------------------------------------------------------------------------------------------ */

/* Hooks called by pipe_run for one stage. ctx is passed through. Each returns 0 or a negative
 * status (pipe_run stops at the first failure and returns it). Send hooks must not wait for the
 * receiver: post the send and complete it in `finish` (or later, before its buffer is reused). */
typedef struct pipe_hooks {
    int (*forward)(void *ctx, int mb, int slot, kiln_err_t *err);
    int (*backward)(void *ctx, int mb, int slot, kiln_err_t *err);
    int (*send_act)(void *ctx, int mb, int slot, kiln_err_t *err);
    int (*recv_act)(void *ctx, int mb, int slot, kiln_err_t *err);
    int (*send_grad)(void *ctx, int mb, int slot, kiln_err_t *err);
    int (*recv_grad)(void *ctx, int mb, int slot, kiln_err_t *err);
    int (*finish)(void *ctx, kiln_err_t *err); /* after the last action; may be NULL */
} pipe_hooks_t;

/* Per-action timing (filled by pipe_run when a trace is given). */
typedef struct pipe_trace_entry {
    pipe_action_kind_t kind;
    int mb;
    double t0, t1; /* seconds, kiln_mono_s() */
} pipe_trace_entry_t;

/* Runs s's actions in order through hooks. Hooks that are NULL are skipped (a stage without
 * neighbours needs no send/recv). trace (may be NULL) must hold s->n entries (+1 for finish is
 * not recorded). Returns 0 or the first hook's failure. */
int pipe_run(const pipe_sched_t *s, const pipe_hooks_t *hooks, void *ctx,
             pipe_trace_entry_t *trace, kiln_err_t *err);

/* ------------------------------------------------------------------------------------------
 * Profiling and pipelined training. A stage runs its model's blocks through the model
 * interface's pipe group (engine.h's eng_model_pipe_t); the planner (profile and memory model
 * below) models the GPT's blocks, the one model whose capability row says it pipelines.
 * ------------------------------------------------------------------------------------------ */

/* Most head blocks a GPT head is split into for a pipeline. */
#define PIPE_MAX_HEAD_BLOCKS 64

/* Profiles the 2L + 1 + head_blocks blocks of a GPT of config cfg (engine.h: embedding,
 * attention and MLP halves of each layer, head slices) on backend be for microbatches of B
 * sequences of T tokens, with activation checkpointing when recompute (eng_gpt_set_recompute:
 * backward then includes the recomputation, and a block keeps only its boundaries): times
 * forward and backward of each block (warmup untimed + iters timed runs, median) on a one-layer
 * clone of the model (every layer has the same shapes, so layer 1's figures stand for all), and
 * computes parameter, AdamW state and activation bytes per microbatch from the engine's memory
 * plan (the tied wte counts on both the embedding and the head blocks, since both stages hold a
 * copy). out holds 2L + 1 + head_blocks entries (OUT). *overhead_bytes (OUT, may be NULL) gets
 * the per-rank memory outside the blocks (backward scratch, boundary buffers, the recompute
 * workspace). Returns 0, KILN_EINVAL, KILN_EUNSUPP (backend cannot split the head) or
 * KILN_ENOMEM. Not thread-safe (uses the backend's threads). */
int pipe_profile_gpt(const eng_gpt_config_t *cfg, const eng_backend_t *be, int B, int T, int head_blocks,
                     bool recompute, int warmup, int iters, pipe_block_profile_t *out, size_t *overhead_bytes,
                     kiln_err_t *err);

/* How many blocks to cut a GPT's head into, from a profile made with one head block (2L + 2
 * entries): enough that no slice costs more than the cheaper of a layer's two halves (a
 * 50k-word head is several layers' worth of work, more than a stage should carry), at most
 * PIPE_MAX_HEAD_BLOCKS; 1 when the head is already cheap. */
int pipe_gpt_choose_head_blocks(const pipe_block_profile_t *prof, int n_layer);

/* Bytes of the activations one microbatch of B x T keeps for block `block` of a GPT of cfg
 * whose head is cut into head_blocks blocks, from eng_gpt_acts_create's plan (with recompute:
 * the block's output boundary only, and the head's statistics and losses). */
size_t pipe_gpt_act_bytes(const eng_gpt_config_t *cfg, int head_blocks, int block, int B, int T, bool recompute);

/* What a pipelined run reports beyond eng_train_result_t (pipe_layer_info). */
typedef struct pipe_train_info {
    pipe_plan_t plan;          /* the plan used (owned; pipe_plan_deinit) */
    int stage, replica;        /* this rank's place in the grid */
    int n_stages, n_replicas;
    int peak_live;             /* activation sets this stage kept at most */
    double act_bytes_per_set;  /* planned bytes of one activation set on this stage */
    double act_resident_bytes; /* activation memory resident at the end (mincore; host backends) */
    double state_resident_bytes; /* parameters + gradients + AdamW state resident at the end */
    double step_ms_mean;       /* mean pipeline time per step (the passes; excluding the first step) */
    double bubble_measured;    /* mean idle fraction of the steps from per-action timings (all stages) */
} pipe_train_info_t;
void pipe_train_info_deinit(pipe_train_info_t *info); /* accepts NULL */

/* The pipeline layer of one rank: the training loop's parallel layer (eng_parallel_t) for a GPT
 * with distribution.model_parallel.partitions = p > 1, on a grid of p stages x (world / p)
 * data-parallel replicas, global rank = replica * p + stage. The loop runs the steps; the layer
 * profiles the blocks and partitions them (or validates the user's partition_plan, or takes the
 * plan saved beside the checkpoint the job resumes from), logs the plan and writes it to
 * output_dir/partition_plan.json; the rank holds and updates only its stage's parameters, runs
 * the spec's schedule over its microbatches as the step's passes, adds the head stages' rows of
 * the tied embedding's gradient to the first stage's, averages within the stage's replicas
 * through a data-parallel layer (dp.h: buckets during backward, ZeRO-1 with
 * shard_optimizer_state), sends the updated embedding rows back, and gathers its stage to rank 0
 * for checkpoints, samples and the final model. Host backends only. */
typedef struct pipe_layer pipe_layer_t;

/* Creates the layer over the job's world (borrowed; must outlive it) for spec s and opts (both
 * borrowed): splits the grid. dpo sets the stage replicas' data-parallel options. Caller owns
 * *out; free with pipe_layer_destroy(). Collective. Returns 0, KILN_EINVAL (the partitions do
 * not divide the world, no token data, or a model or (at attach) a backend the capability table
 * says cannot pipeline: its refusal) or KILN_ECOMM. */
int pipe_layer_create(comm_t *world, const struct spec *s, const eng_train_opts_t *o,
                      const dp_opts_t *dpo, pipe_layer_t **out, kiln_err_t *err);
void pipe_layer_destroy(pipe_layer_t *pl); /* accepts NULL */
/* The training loop's parallel layer. out borrows pl. */
void pipe_parallel(pipe_layer_t *pl, eng_parallel_t *out);
/* What the run measured (OUT; release with pipe_train_info_deinit), after eng_train_run. */
int pipe_layer_info(const pipe_layer_t *pl, pipe_train_info_t *info, kiln_err_t *err);
/* The stage's data-parallel counters. */
void pipe_layer_dp_stats(const pipe_layer_t *pl, dp_stats_t *out);

#endif /* KILN_PIPE_H */
