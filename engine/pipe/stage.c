/* stage.c - one pipeline stage at work: the schedule's actions (forward and backward of a
 * microbatch through the stage's blocks, activations and gradients sent and received between
 * neighbouring stages) run by pipe_run() as the step's passes, the tied embedding's gradient
 * summed into the first stage and its updated rows sent back, the stage's replicas averaged by
 * the data-parallel layer, the stage gathered to rank 0, and the measured bubble.
 * It does not make the plan or the buffers (setup.c). */
#include "engine/pipe/pipe_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- one microbatch on this stage --------------------------------------------------------------- */

static size_t act_bytes(const pipe_layer_t *pl, int boundary)
{
    return pl->mp->boundary_floats(pl->model->impl, pl->geo.B, pl->geo.T, boundary) * sizeof(float);
}

static size_t grad_bytes(const pipe_layer_t *pl, int boundary)
{
    return pl->mp->grad_floats(pl->model->impl, pl->geo.B, pl->geo.T, boundary) * sizeof(float);
}

static bool is_last_stage(const pipe_layer_t *pl) { return pl->last_block == pl->n_blocks - 1; }

/* The slot's sends must be gone before its buffers are written again. */
static int wait_slot(pipe_layer_t *pl, int slot, kiln_err_t *err)
{
    int rc = comm_wait(pl->act_sends[slot], err);
    pl->act_sends[slot] = NULL;
    int rc2 = comm_wait(pl->grad_sends[slot], rc ? NULL : err);
    pl->grad_sends[slot] = NULL;
    return rc ? rc : rc2;
}

int pipe_wait_sends(pipe_layer_t *pl, kiln_err_t *err)
{
    int rc = 0;
    for (int k = 0; k < pl->n_slots; k++) {
        int r = wait_slot(pl, k, rc ? NULL : err);
        if (!rc)
            rc = r;
    }
    return rc;
}

static int action_forward(void *ctx, int mb, int slot, kiln_err_t *err)
{
    pipe_layer_t *pl = ctx;
    int rc;
    if (pl->first_block == 0 && (rc = wait_slot(pl, slot, err)))
        return rc;
    double t0 = kiln_mono_s();
    void *a = pl->acts[slot], *impl = pl->model->impl;
    if (pl->first_block == 0 || pl->last_block >= pl->head_first) { /* tokens, or the head's targets */
        eng_sampler_micro(pl->sampler, pl->pass * pl->geo.microbatches + mb, pl->geo.B, pl->tokens, pl->targets);
        eng_batch_t batch = {.B = pl->geo.B, .tokens = pl->tokens, .targets = pl->targets};
        pl->mp->set_batch(impl, a, &batch);
    }
    for (int b = pl->first_block; b <= pl->last_block; b++)
        pl->mp->block_forward(impl, a, b, true);
    if (is_last_stage(pl)) {
        pl->loss_sum += pl->mp->loss(impl, a);
        pl->loss_count += 1;
    }
    pl->be->synchronize();
    pl->busy_s += kiln_mono_s() - t0;
    return 0;
}

static int action_backward(void *ctx, int mb, int slot, kiln_err_t *err)
{
    pipe_layer_t *pl = ctx;
    int rc;
    /* the gradient this slot sent last must be gone before input_grad is overwritten */
    if ((rc = comm_wait(pl->grad_sends[slot], err)))
        return rc;
    pl->grad_sends[slot] = NULL;
    double t0 = kiln_mono_s();
    void *impl = pl->model->impl;
    float *scratch[2] = {pl->mp->grad_scratch(impl, 0), pl->mp->grad_scratch(impl, 1)};
    bool last_of_step = pl->pass == pl->passes - 1 && mb == pl->geo.microbatches - 1;
    const float *dout = is_last_stage(pl) ? NULL : pl->output_grad;
    for (int b = pl->last_block; b >= pl->first_block; b--) {
        float *din = b == pl->first_block ? pl->input_grad[slot] : (dout == scratch[0] ? scratch[1] : scratch[0]);
        pl->mp->block_backward(impl, pl->acts[slot], b, dout, b == 0 ? NULL : din, pl->dloss);
        if (last_of_step)
            pipe_grads_ready(pl, b);
        dout = din;
    }
    pl->be->synchronize();
    pl->busy_s += kiln_mono_s() - t0;
    return 0;
}

static int action_send_act(void *ctx, int mb, int slot, kiln_err_t *err)
{
    pipe_layer_t *pl = ctx;
    return comm_send_start(pl->pipe_group, pl->mp->boundary(pl->model->impl, pl->acts[slot], pl->last_block),
                           act_bytes(pl, pl->last_block), pl->stage + 1, PIPE_TAG_ACT | (uint32_t)mb,
                           &pl->act_sends[slot], err);
}

static int action_recv_act(void *ctx, int mb, int slot, kiln_err_t *err)
{
    pipe_layer_t *pl = ctx;
    int rc;
    if ((rc = wait_slot(pl, slot, err)))
        return rc;
    return comm_recv(pl->pipe_group, pl->mp->boundary(pl->model->impl, pl->acts[slot], pl->first_block - 1),
                     act_bytes(pl, pl->first_block - 1), pl->stage - 1, PIPE_TAG_ACT | (uint32_t)mb, NULL, err);
}

static int action_send_grad(void *ctx, int mb, int slot, kiln_err_t *err)
{
    pipe_layer_t *pl = ctx;
    return comm_send_start(pl->pipe_group, pl->input_grad[slot], grad_bytes(pl, pl->first_block - 1), pl->stage - 1,
                           PIPE_TAG_GRAD | (uint32_t)mb, &pl->grad_sends[slot], err);
}

static int action_recv_grad(void *ctx, int mb, int slot, kiln_err_t *err)
{
    pipe_layer_t *pl = ctx;
    (void)slot;
    return comm_recv(pl->pipe_group, pl->output_grad, grad_bytes(pl, pl->last_block), pl->stage + 1,
                     PIPE_TAG_GRAD | (uint32_t)mb, NULL, err);
}

static int action_finish(void *ctx, kiln_err_t *err) { return pipe_wait_sends(ctx, err); }

static const pipe_hooks_t stage_actions = {action_forward,  action_backward,  action_send_act, action_recv_act,
                                           action_send_grad, action_recv_grad, action_finish};

int pipe_run_passes(pipe_layer_t *pl, eng_sampler_t *s, int passes, bool train, double *loss_sum,
                    double *loss_count, kiln_err_t *err)
{
    const pipe_sched_t *sc = train ? &pl->sched : &pl->forward_sched;
    int rc = 0;
    pl->sampler = s;
    pl->train = train;
    pl->passes = passes;
    pl->loss_sum = pl->loss_count = 0;
    if (train) {
        pl->busy_s = 0;
        pl->passes_t0 = kiln_mono_s();
    }
    for (pl->pass = 0; pl->pass < passes && !rc; pl->pass++)
        rc = pipe_run(sc, &stage_actions, pl, train ? pl->trace : NULL, err);
    if (train)
        pl->passes_t1 = kiln_mono_s();
    if (train && !rc && pl->print_trace) {
        /* debugging aid: the last pass's actions with start/end in ms from the passes' start */
        fprintf(stderr, "pipe trace stage %d:", pl->stage);
        for (int i = 0; i < pl->sched.n; i++)
            fprintf(stderr, " %s%d[%.2f,%.2f]", pipe_action_name(pl->trace[i].kind), pl->trace[i].mb,
                    (pl->trace[i].t0 - pl->passes_t0) * 1e3, (pl->trace[i].t1 - pl->passes_t0) * 1e3);
        fprintf(stderr, "\n");
    }
    *loss_sum += pl->loss_sum;
    *loss_count += pl->loss_count;
    return rc;
}

/* ---- the step's gradients and update ------------------------------------------------------------ */

void pipe_grads_ready(pipe_layer_t *pl, int block)
{
    /* the first stage's embedding bucket waits for the head stages' rows of the tied wte */
    if (pl->stage == 0 && block == 0)
        return;
    dp_grads_ready(pl->dp, block, ENG_RANGES_ALL);
}

/* The tied embedding: wte's gradient is the lookup's (stage 0) plus the LM head's (the stages
 * holding head blocks, each for its rows). Every head stage other than 0 sends its rows to stage
 * 0 of its replica, which adds them before its replicas average; stage 0 alone updates wte and
 * sends the updated rows back (tie_params). Only those rows move. */
static int tie_grads(pipe_layer_t *pl, kiln_err_t *err)
{
    int rc, r0, r1;
    if (pl->mp->tied_tensor < 0)
        return 0;
    const eng_tensor_t *tied = &pl->model->p->tensors[pl->mp->tied_tensor];
    size_t C = pl->mp->tied_row(pl->model->impl);
    float *g = pl->model->p->grads + tied->off;
    if (pl->stage != 0) {
        pipe_head_rows(pl, pl->stage, &r0, &r1);
        if (r1 <= r0)
            return 0;
        return comm_send(pl->pipe_group, g + (size_t)r0 * C, (size_t)(r1 - r0) * C * sizeof(float), 0, PIPE_TAG_TIED,
                         err);
    }
    for (int k = 1; k < pl->n_stages; k++) {
        pipe_head_rows(pl, k, &r0, &r1);
        if (r1 <= r0)
            continue;
        size_t n = (size_t)(r1 - r0) * C;
        if (!pl->tied_buf && !(pl->tied_buf = pl->be->alloc(tied->n * sizeof(float))))
            return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        if ((rc = comm_recv(pl->pipe_group, pl->tied_buf, n * sizeof(float), k, PIPE_TAG_TIED, NULL, err)))
            return rc;
        pl->be->residual_forward(g + (size_t)r0 * C, g + (size_t)r0 * C, pl->tied_buf, n);
    }
    return 0;
}

int pipe_grads_finish(pipe_layer_t *pl, kiln_err_t *err)
{
    int rc;
    if ((rc = tie_grads(pl, err)))
        return rc;
    return dp_grads_finish(pl->dp, err);
}

/* Stage 0's updated rows of wte go to the head stages' copies. */
static int tie_params(pipe_layer_t *pl, kiln_err_t *err)
{
    int rc, r0, r1;
    if (pl->mp->tied_tensor < 0)
        return 0;
    size_t C = pl->mp->tied_row(pl->model->impl);
    float *w = pl->model->p->params + pl->model->p->tensors[pl->mp->tied_tensor].off;
    if (pl->stage != 0) {
        pipe_head_rows(pl, pl->stage, &r0, &r1);
        if (r1 <= r0)
            return 0;
        return comm_recv(pl->pipe_group, w + (size_t)r0 * C, (size_t)(r1 - r0) * C * sizeof(float), 0, PIPE_TAG_TIED,
                         NULL, err);
    }
    for (int k = 1; k < pl->n_stages; k++) {
        pipe_head_rows(pl, k, &r0, &r1);
        if (r1 > r0 && (rc = comm_send(pl->pipe_group, w + (size_t)r0 * C, (size_t)(r1 - r0) * C * sizeof(float), k,
                                       PIPE_TAG_TIED, err)))
            return rc;
    }
    return 0;
}

int pipe_after_update(pipe_layer_t *pl, int64_t step, kiln_err_t *err)
{
    int rc;
    if ((rc = dp_after_update(pl->dp, step, err)))
        return rc;
    return tie_params(pl, err);
}

/* ---- state for rank 0 ------------------------------------------------------------------------- */

/* First within each stage's replicas (ZeRO shards to replica 0), then replica 0's stages send
 * their own ranges (not the tied copy: rank 0 has wte) to rank 0, range by range. */
int pipe_gather(pipe_layer_t *pl, float *buf, kiln_err_t *err)
{
    int rc;
    if ((rc = dp_gather(pl->dp, buf, err)))
        return rc;
    if (pl->replica != 0)
        return 0;
    if (pl->stage != 0) {
        for (int i = 0; i < pl->n_ranges; i++)
            if (!pl->ranges[i].tied_copy &&
                (rc = comm_send(pl->pipe_group, buf + pl->ranges[i].off, pl->ranges[i].n * sizeof(float), 0,
                                PIPE_TAG_GATHER | (uint32_t)i, err)))
                return rc;
        return 0;
    }
    for (int k = 1; k < pl->n_stages; k++) {
        pipe_range_t r[PIPE_MAX_RANGES];
        int n = pipe_stage_ranges(pl, k, r);
        for (int i = 0; i < n; i++)
            if (!r[i].tied_copy && (rc = comm_recv(pl->pipe_group, buf + r[i].off, r[i].n * sizeof(float), k,
                                                   PIPE_TAG_GATHER | (uint32_t)i, NULL, err)))
                return rc;
    }
    return 0;
}

/* The step's bubble: the idle fraction of all ranks between the first rank's start of the
 * passes and the last rank's end, from each rank's time in forward and backward. */
int pipe_step_metrics(pipe_layer_t *pl, const char **names, double *vals, int max, int *n, kiln_err_t *err)
{
    int W = pl->world_size, rc;
    double *slots = calloc((size_t)W * 3, sizeof(double));
    *n = 0;
    if (!slots)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    double *mine = slots + 3 * (size_t)pl->rank;
    mine[0] = pl->busy_s;
    mine[1] = pl->passes_t0;
    mine[2] = pl->passes_t1;
    if ((rc = comm_allgather_bytes(pl->world, slots, 3 * sizeof(double), err))) {
        free(slots);
        return rc;
    }
    double busy = 0, tmin = INFINITY, tmax = -INFINITY;
    for (int r = 0; r < W; r++) {
        busy += slots[3 * r];
        tmin = fmin(tmin, slots[3 * r + 1]);
        tmax = fmax(tmax, slots[3 * r + 2]);
    }
    free(slots);
    double bubble = tmax > tmin ? 1.0 - busy / (W * (tmax - tmin)) : 0;
    /* the first step's passes include first touches of every buffer: the mean leaves it out */
    pl->steps_seen++;
    if (pl->steps_seen > 1 || pl->n_timed == 0) {
        if (pl->steps_seen == 2 && pl->n_timed == 1) { /* drop the first step's figures */
            pl->pass_ms_sum = 0;
            pl->bubble_sum = 0;
            pl->n_timed = 0;
        }
        pl->pass_ms_sum += (tmax - tmin) * 1e3;
        pl->bubble_sum += bubble;
        pl->n_timed++;
    }
    if (max > 0) {
        names[0] = SPEC_ENGINE_PIPE_METRIC;
        vals[0] = bubble;
        *n = 1;
    }
    return 0;
}
