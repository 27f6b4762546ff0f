/* pipe_int.h - what the pipeline layer's files share (setup.c, stage.c): the state of one rank
 * of the grid, its parameter ranges, and the steps each file provides. Nothing outside
 * engine/pipe/ includes it. */
#ifndef KILN_PIPE_INT_H
#define KILN_PIPE_INT_H

#include "engine/pipe/pipe.h"
#include "spec/spec.h"

#define PIPE_MAX_RANGES (3 * ENG_MAX_TENSORS)

/* Message tags between stages (point-to-point, on the world or the pipe group). */
#define PIPE_TAG_ACT 0x01000000u
#define PIPE_TAG_GRAD 0x02000000u
#define PIPE_TAG_GATHER 0x03000000u
#define PIPE_TAG_TIED 0x04000000u
#define PIPE_TAG_PLAN 0x05000000u

/* A parameter range a stage holds. */
typedef struct pipe_range {
    size_t off, n;
    int block;      /* the (lowest) block of the stage that lists it */
    bool tied_copy; /* rows of the tied wte that a head block holds on a stage without block 0:
                     * a copy of stage 0's, which stage 0 updates and sends back */
} pipe_range_t;

struct pipe_layer {
    const spec_t *spec;            /* borrowed */
    const eng_train_opts_t *opts;  /* borrowed */
    comm_t *world;                 /* borrowed: every rank of the job */
    comm_t *pipe_group;            /* this replica's stages, ranked by stage; owned */
    comm_t *replica_group;         /* this stage's replicas, ranked by replica; owned */
    int rank, world_size;
    int n_stages, n_replicas;
    int stage, replica;            /* rank = replica * n_stages + stage */
    dp_opts_t dp_opts;
    dp_t *dp;                      /* averaging over replica_group; owned */
    eng_geometry_t geo;
    eng_gpt_config_t cfg;          /* the planner's view of the model (profile.c models GPT blocks) */

    /* the plan (prepare) */
    pipe_plan_t plan;
    int first_block, last_block;   /* this stage's blocks */
    int n_blocks, head_first;      /* the model's blocks and its first head block */

    /* the model (attach; borrowed from the training loop) */
    const eng_backend_t *be;
    eng_model_t *model;            /* its blocks through model->ops->pipe (engine.h) */
    const eng_model_pipe_t *mp;    /* model->ops->pipe */
    float *m, *v;
    float dloss;
    pipe_range_t ranges[PIPE_MAX_RANGES];
    int n_ranges;
    float *tied_buf;               /* stage 0: a head stage's rows of the wte gradient; owned */

    /* the schedules and their buffers (attach) */
    pipe_sched_t sched;            /* a training pass */
    pipe_sched_t forward_sched;    /* an evaluation pass */
    int n_slots;
    void **acts;                   /* (n_slots) activation sets, one per microbatch in flight */
    float **input_grad;            /* (n_slots) gradient of the stage input, sent back */
    float *output_grad;            /* received gradient of the stage output */
    comm_req_t **act_sends;        /* (n_slots) activation sends in flight */
    comm_req_t **grad_sends;       /* (n_slots) gradient sends in flight */
    int32_t *tokens, *targets;     /* (B*T) host */
    size_t act_set_bytes;          /* planned bytes of one activation set on this stage */
    pipe_trace_entry_t *trace;     /* (sched.n) the last pass's action timings */
    bool print_trace;              /* eng_settings_t's pipe_trace: print them after each step */

    /* the passes in progress */
    eng_sampler_t *sampler;
    int pass, passes;
    bool train;
    double loss_sum, loss_count;
    double busy_s;                 /* seconds in F/B this step */
    double passes_t0, passes_t1;   /* the step's passes, kiln_mono_s() */

    /* measurements */
    double pass_ms_sum, bubble_sum;
    int n_timed, steps_seen;
    double act_resident_bytes, state_resident_bytes;
};

/* ---- setup.c ---- */
/* The parameter ranges stage k holds, in block order (OUT: up to PIPE_MAX_RANGES); returns the
 * count. The tied wte is listed by block 0 whole and by the head blocks in row slices: a slice
 * inside a range already listed is skipped, and a slice on a stage without block 0 is a tied
 * copy. Every rank can compute any stage's list. */
int pipe_stage_ranges(const pipe_layer_t *pl, int k, pipe_range_t *out);
/* Rows [*r0, *r1) of wte that stage k's head blocks hold (r0 == r1: none). */
void pipe_head_rows(const pipe_layer_t *pl, int k, int *r0, int *r1);

/* ---- stage.c ---- */
/* The step's passes over sampler s through the schedule (the loop's run_passes). */
int pipe_run_passes(pipe_layer_t *pl, eng_sampler_t *s, int passes, bool train, double *loss_sum,
                    double *loss_count, kiln_err_t *err);
void pipe_grads_ready(pipe_layer_t *pl, int block);
int pipe_grads_finish(pipe_layer_t *pl, kiln_err_t *err);
int pipe_after_update(pipe_layer_t *pl, int64_t step, kiln_err_t *err);
int pipe_gather(pipe_layer_t *pl, float *buf, kiln_err_t *err);
int pipe_step_metrics(pipe_layer_t *pl, const char **names, double *vals, int max, int *n,
                      kiln_err_t *err);
/* Waits for every send of the slots (after a pass, and before the buffers are released). */
int pipe_wait_sends(pipe_layer_t *pl, kiln_err_t *err);

#endif /* KILN_PIPE_INT_H */
