/* setup.c - the pipeline layer's setup: the grid of stages x replicas, the partition plan
 * (profiled and partitioned, the user's, or the one saved beside the checkpoint the job resumes
 * from), the stage's parameter ranges and its share of the model, the schedules and their
 * activation buffers, and the layer's table for the training loop.
 * It does not run the schedule (stage.c). */
#include "engine/pipe/pipe_int.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MIB (1024.0 * 1024.0)

static void stage_log(const pipe_layer_t *pl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void stage_log(const pipe_layer_t *pl, const char *fmt, ...)
{
    if (pl->rank != 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

/* ---- memory measurements ---------------------------------------------------------------------- */

/* Resident bytes of [p, p + len) (mincore), 0 when unknown. */
static size_t resident_bytes(const void *p, size_t len)
{
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pg - 1), e = (uintptr_t)p + len;
    size_t npages = (e - a + (size_t)pg - 1) / (size_t)pg;
    unsigned char *vec = malloc(npages ? npages : 1);
    size_t n = 0;
    if (vec && mincore((void *)a, e - a, vec) == 0)
        for (size_t i = 0; i < npages; i++)
            n += vec[i] & 1;
    free(vec);
    return n * (size_t)pg;
}

/* The process's resident memory now (bytes), 0 when unknown. */
static size_t rss_now(void)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return 0;
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
        resident = 0;
    fclose(f);
    return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

/* ---- the grid ------------------------------------------------------------------------------------ */

int pipe_layer_create(comm_t *world, const spec_t *s, const eng_train_opts_t *o, const dp_opts_t *dpo,
                      pipe_layer_t **out, kiln_err_t *err)
{
    pipe_layer_t *pl = NULL;
    int rc;
    *out = NULL;
    /* the capability table's refusal, the same as at submission */
    if (!spec_model_has(s->model.type, SPEC_CAP_PIPELINE))
        return spec_cap_refuse(SPEC_CAP_PIPELINE, s->model.type, NULL, err);
    if (!strcmp(s->data.format, "synthetic"))
        return kiln_err_set(err, KILN_EINVAL, "data.format", "pipeline parallelism needs token data");
    pl = calloc(1, sizeof(*pl));
    if (!pl)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    pl->spec = s;
    pl->opts = o;
    pl->world = world;
    pl->dp_opts = *dpo;
    pl->print_trace = o->settings && o->settings->pipe_trace;
    pl->rank = comm_rank(world);
    pl->world_size = comm_size(world);
    pl->n_stages = s->dist.mp_partitions;
    if (pl->n_stages < 2 || pl->world_size % pl->n_stages) {
        rc = kiln_err_set(err, KILN_EINVAL, "distribution.model_parallel.partitions",
                          "%d partitions do not divide the job's %d ranks", pl->n_stages, pl->world_size);
        goto fail;
    }
    pl->n_replicas = pl->world_size / pl->n_stages;
    pl->stage = pl->rank % pl->n_stages;
    pl->replica = pl->rank / pl->n_stages;
    pl->cfg = (eng_gpt_config_t){s->model.seq_len, s->model.vocab_size, s->model.padded_vocab_size,
                                 s->model.n_layer, s->model.n_head, s->model.n_embd};
    if ((rc = eng_geometry_init(&pl->geo, s, pl->n_replicas, s->dist.mp_microbatches, err)) ||
        (rc = comm_split(world, pl->replica, pl->stage, &pl->pipe_group, err)) ||
        (rc = comm_split(world, pl->stage, pl->replica, &pl->replica_group, err)) ||
        (rc = dp_create(pl->replica_group, &pl->dp_opts, &pl->dp, err)))
        goto fail;
    *out = pl;
    return 0;
fail:
    pipe_layer_destroy(pl);
    return rc;
}

static void release_buffers(pipe_layer_t *pl)
{
    for (int k = 0; k < pl->n_slots; k++) {
        if (pl->act_sends)
            comm_wait(pl->act_sends[k], NULL);
        if (pl->grad_sends)
            comm_wait(pl->grad_sends[k], NULL);
        if (pl->acts && pl->model)
            pl->model->ops->acts_destroy(pl->model, pl->acts[k]);
        if (pl->input_grad && pl->be)
            pl->be->free(pl->input_grad[k]);
    }
    if (pl->be) {
        pl->be->free(pl->output_grad);
        pl->be->free(pl->tied_buf);
    }
    free(pl->acts);
    free(pl->input_grad);
    free(pl->act_sends);
    free(pl->grad_sends);
    free(pl->tokens);
    free(pl->targets);
    free(pl->trace);
    pl->acts = NULL;
    pl->input_grad = NULL;
    pl->act_sends = pl->grad_sends = NULL;
    pl->tokens = pl->targets = NULL;
    pl->trace = NULL;
    pl->output_grad = pl->tied_buf = NULL;
    pl->n_slots = 0;
}

void pipe_layer_destroy(pipe_layer_t *pl)
{
    if (!pl)
        return;
    release_buffers(pl);
    dp_destroy(pl->dp);
    pipe_sched_deinit(&pl->sched);
    pipe_sched_deinit(&pl->forward_sched);
    pipe_plan_deinit(&pl->plan);
    comm_destroy(pl->replica_group);
    comm_destroy(pl->pipe_group);
    free(pl);
}

void pipe_train_info_deinit(pipe_train_info_t *info)
{
    if (info)
        pipe_plan_deinit(&info->plan);
}

/* ---- the plan ---------------------------------------------------------------------------------- */

/* Profiles the model's blocks with the head in J blocks on every rank and averages the times
 * over the ranks, so all ranks hold identical figures (and so make the identical plan).
 * *prof (OUT) is malloc'd with 2L + 1 + J entries; *overhead (OUT) includes what the process
 * held before the model (libraries, the transport's buffers), which counts against a per-rank
 * memory limit too. */
static int profile_blocks(pipe_layer_t *pl, int J, size_t base, pipe_block_profile_t **prof, size_t *overhead,
                          kiln_err_t *err)
{
    const eng_backend_t *be;
    int nb = 2 * pl->cfg.n_layer + 1 + J, rc;
    pipe_block_profile_t *pr = calloc((size_t)nb, sizeof(*pr));
    float *times = calloc((size_t)nb * 2 + 1, sizeof(float));
    *prof = pr;
    if (!pr || !times) {
        free(times);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    if ((rc = eng_backend_get(spec_device(pl->spec), &be, err)) ||
        (rc = pipe_profile_gpt(&pl->cfg, be, pl->geo.B, pl->geo.T, J, pl->spec->dist.activation_checkpointing, 2,
                               5, pr, overhead, err)))
        goto done;
    for (int b = 0; b < nb; b++) {
        times[2 * b] = (float)pr[b].fwd_ms;
        times[2 * b + 1] = (float)pr[b].bwd_ms;
    }
    times[2 * nb] = (float)((double)base / MIB);
    if ((rc = comm_allreduce(pl->world, times, (size_t)nb * 2 + 1, COMM_AVG, err)))
        goto done;
    for (int b = 0; b < nb; b++) {
        pr[b].fwd_ms = times[2 * b];
        pr[b].bwd_ms = times[2 * b + 1];
    }
    *overhead += (size_t)((double)times[2 * nb] * MIB); /* identical on every rank: the plan must be */
done:
    free(times);
    return rc;
}

/* The plan saved beside the checkpoint the job resumes from (checkpoint_extra): the rank holding
 * the checkpoint reads it and hands the text to every rank, so all use the same plan. NULL when
 * there is none (or on a transport failure, which the next collective reports). */
static json_t *saved_plan(pipe_layer_t *pl, int src)
{
    const char *dir = pl->opts->checkpoint_dir;
    char path[SPEC_PATH + 64], *text = NULL;
    uint64_t len = 0;
    kiln_err_t e2;
    kiln_err_clear(&e2);
    if (src < 0)
        return NULL;
    if (pl->rank == src && dir && *dir) {
        size_t n = 0;
        snprintf(path, sizeof(path), "%s/partition_plan.json", dir);
        if (kiln_file_read(path, &text, &n, &e2) == 0)
            len = n;
    }
    if (comm_bcast(pl->world, &len, sizeof(len), src, &e2) || len == 0 || len > (1u << 20)) {
        free(text);
        return NULL;
    }
    if (pl->rank != src)
        text = malloc(len);
    /* every rank must have room before the text moves; otherwise all go without it */
    float ok[1] = {text ? 0.0f : 1.0f};
    json_t *j = NULL;
    if (comm_allreduce(pl->world, ok, 1, COMM_SUM, &e2) == 0 && ok[0] == 0.0f &&
        comm_bcast(pl->world, text, len, src, &e2) == 0)
        j = json_loadb(text, len, 0, NULL);
    free(text);
    return j;
}

static void log_plan(pipe_layer_t *pl, const pipe_plan_t *plan)
{
    const char *out = pl->opts->output_dir;
    stage_log(pl, "pipeline: %s plan, %d stages x %d replicas, %s schedule, %d microbatches of %d%s, balance %.3f, "
              "predicted %.1f ms per pass, bubble %.1f%% (theory %.1f%%)\n", plan->manual ? "manual" : "automatic",
              pl->n_stages, pl->n_replicas, pipe_sched_name(plan->schedule), pl->geo.microbatches, pl->geo.B,
              pl->geo.microbatches_chosen ? " (chosen from the job; set distribution.model_parallel.microbatches "
                                            "to choose another)" : "",
              plan->balance, plan->predicted_pass_ms, plan->predicted_bubble * 100,
              pipe_bubble_theory(pl->n_stages, pl->geo.microbatches) * 100);
    for (int k = 0; k < pl->n_stages; k++)
        stage_log(pl, "pipeline: stage %d blocks [%d, %d]: predicted %.2f ms/step, %.1f MiB\n", k,
                  plan->stages[k].first, plan->stages[k].last, plan->stages[k].predicted_ms,
                  plan->stages[k].predicted_mem_mb);
    if (pl->rank != 0)
        return;
    /* the whole plan on one line, so the job's stored logs hold it (pass it back as partition_plan) */
    json_t *pj = pipe_plan_to_json(plan);
    char *line = pj ? json_dumps(pj, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6)) : NULL;
    if (line)
        stage_log(pl, "pipeline: plan %s\n", line);
    free(line);
    json_decref(pj);
    if (out && *out) {
        char path[SPEC_PATH + 32], *text = pipe_plan_to_string(plan);
        kiln_err_t e2;
        kiln_err_clear(&e2);
        snprintf(path, sizeof(path), "%s/partition_plan.json", out);
        if (!text || kiln_mkdirs(out, &e2) || kiln_file_write_atomic(path, text, strlen(text), &e2))
            log_warn("could not write %s: %s", path, e2.message);
        else
            stage_log(pl, "pipeline: plan written to %s\n", path);
        free(text);
    }
}

/* A given plan (the user's or the resumed one) for nb blocks, checked against the memory limit. */
static int take_plan(pipe_layer_t *pl, const json_t *given, bool resumed, int nb, const pipe_block_profile_t *prof,
                     const pipe_partition_opts_t *po, kiln_err_t *err)
{
    int rc;
    size_t limit = po->mem_limit_bytes;
    if ((rc = pipe_plan_from_json(given, nb, pl->n_stages, &pl->plan, err)))
        return rc;
    if (resumed) {
        pl->plan.manual = json_is_true(json_object_get(given, "manual"));
        stage_log(pl, "pipeline: resuming with the plan saved beside the checkpoint\n");
    }
    pl->plan.optimize = po->optimize;
    pl->plan.schedule = po->schedule;
    pl->plan.microbatches = pl->geo.microbatches;
    pipe_plan_predict(&pl->plan, prof, po);
    if ((rc = pipe_plan_simulate(&pl->plan, prof, err)))
        return rc;
    for (int k = 0; k < pl->n_stages; k++)
        if (limit && pl->plan.stages[k].predicted_mem_mb * MIB > (double)limit) {
            kiln_err_set(err, KILN_EUNFIT, "distribution.model_parallel.partition_plan",
                         "model does not fit: stage %d of the partition plan (blocks [%d, %d]) needs %.1f MiB, "
                         "limit %.1f MiB", k, pl->plan.stages[k].first, pl->plan.stages[k].last,
                         pl->plan.stages[k].predicted_mem_mb, (double)limit / MIB);
            kiln_err_hint(err, "move blocks off that stage, use more partitions, or leave out partition_plan to "
                          "let kiln choose");
            return KILN_EUNFIT;
        }
    return 0;
}

/* Profiles the blocks and makes or validates the plan. The head is first profiled whole; when
 * it costs more than a layer's half (a 50k-word vocabulary), it is cut into vocabulary slices
 * and profiled again, so the partitioner can spread it over stages. A manual plan says how many
 * head blocks it was made for. A job resuming from a checkpoint keeps the plan it was trained
 * with (saved beside the checkpoint): a different cut of the head or of the stages would sum the
 * same numbers in another order, and the resumed run would no longer equal the uninterrupted
 * one. */
static int prepare(void *ctx, int resume_src, int *head_blocks, kiln_err_t *err)
{
    pipe_layer_t *pl = ctx;
    const spec_t *s = pl->spec;
    int L = pl->cfg.n_layer, nb, rc, J = 1;
    pipe_block_profile_t *prof = NULL;
    size_t overhead = 0;
    bool manual = s->dist.mp_partition_plan && !s->dist.mp_auto_partition;
    json_t *resumed = manual ? NULL : saved_plan(pl, resume_src);
    if (resumed) {
        pipe_plan_t probe;
        kiln_err_t e2;
        int Jr = pipe_plan_json_head_blocks(resumed);
        if (Jr < 1 || pipe_plan_from_json(resumed, 2 * L + 1 + Jr, pl->n_stages, &probe, &e2)) {
            if (pl->rank == 0)
                log_warn("pipeline: the plan saved beside the checkpoint does not fit this job (%s); making a new one",
                         Jr < 1 ? "bad head_blocks" : e2.message);
            json_decref(resumed);
            resumed = NULL;
        } else {
            pipe_plan_deinit(&probe);
        }
    }
    const json_t *given = manual ? s->dist.mp_partition_plan : resumed;
    if (given && (J = pipe_plan_json_head_blocks(given)) < 1) {
        rc = kiln_err_set(err, KILN_EINVAL, "distribution.model_parallel.partition_plan",
                          "invalid partition plan: \"head_blocks\" must be an integer from 1 to %d",
                          PIPE_MAX_HEAD_BLOCKS);
        goto done;
    }
    double t0 = kiln_mono_s();
    size_t base = rss_now();
    if ((rc = profile_blocks(pl, J, base, &prof, &overhead, err)))
        goto done;
    if (!given && (J = pipe_gpt_choose_head_blocks(prof, L)) > 1) {
        stage_log(pl, "pipeline: the head costs %.2f+%.2f ms, more than a layer's half; cutting it into %d "
                  "vocabulary slices\n", prof[2 * L + 1].fwd_ms, prof[2 * L + 1].bwd_ms, J);
        free(prof);
        overhead = 0;
        if ((rc = profile_blocks(pl, J, base, &prof, &overhead, err)))
            goto done;
    }
    nb = 2 * L + 1 + J;
    pl->n_blocks = nb;
    pl->head_first = 2 * L + 1;
    double hfw = 0, hbw = 0;
    for (int b = pl->head_first; b < nb; b++) {
        hfw += prof[b].fwd_ms;
        hbw += prof[b].bwd_ms;
    }
    stage_log(pl, "pipeline: profiled %d blocks in %.2f s (microbatch %dx%d%s): embedding %.2f+%.2f ms, layer "
              "attention %.2f+%.2f ms and MLP %.2f+%.2f ms, head %.2f+%.2f ms in %d block%s (forward+backward)\n",
              nb, kiln_mono_s() - t0, pl->geo.B, pl->geo.T,
              s->dist.activation_checkpointing ? ", recomputing activations" : "", prof[0].fwd_ms, prof[0].bwd_ms,
              prof[1].fwd_ms, prof[1].bwd_ms, prof[2].fwd_ms, prof[2].bwd_ms, hfw, hbw, J, J == 1 ? "" : "s");
    pipe_partition_opts_t po = {.n_stages = pl->n_stages, .microbatches = pl->geo.microbatches,
                                .optimize = PIPE_OPT_SPEED, .schedule = PIPE_SCHED_INTERLEAVED,
                                .mem_limit_bytes = s->res.memory_limit_mb > 0 ? (size_t)s->res.memory_limit_mb << 20 : 0,
                                .rank_overhead_bytes = overhead};
    pipe_optimize_parse(s->dist.mp_optimize, &po.optimize);
    pipe_sched_parse(s->dist.mp_pipeline, &po.schedule);
    if (given)
        rc = take_plan(pl, given, resumed != NULL, nb, prof, &po, err);
    else
        rc = pipe_partition(prof, nb, &po, &pl->plan, err);
    if (rc)
        goto done;
    pl->plan.head_blocks = J;
    log_plan(pl, &pl->plan);
    pl->first_block = pl->plan.stages[pl->stage].first;
    pl->last_block = pl->plan.stages[pl->stage].last;
    *head_blocks = J;
done:
    json_decref(resumed);
    free(prof);
    return rc;
}

/* ---- the stage's share of the model ----------------------------------------------------------- */

void pipe_head_rows(const pipe_layer_t *pl, int k, int *r0, int *r1)
{
    int first = pl->plan.stages[k].first, last = pl->plan.stages[k].last, e;
    *r0 = *r1 = 0;
    if (last < pl->head_first)
        return;
    pl->mp->head_rows(pl->model->impl, (first > pl->head_first ? first : pl->head_first) - pl->head_first, r0, &e);
    pl->mp->head_rows(pl->model->impl, last - pl->head_first, &e, r1);
}

int pipe_stage_ranges(const pipe_layer_t *pl, int k, pipe_range_t *out)
{
    const eng_params_t *P = pl->model->p;
    const eng_tensor_t *tied = pl->mp->tied_tensor >= 0 ? &P->tensors[pl->mp->tied_tensor] : NULL;
    int n = 0, first = pl->plan.stages[k].first, last = pl->plan.stages[k].last;
    for (int b = first; b <= last; b++) {
        eng_range_t r[ENG_MAX_TENSORS];
        int nr = pl->model->ops->block_ranges(pl->model->impl, b, r);
        for (int i = 0; i < nr; i++) {
            bool dup = false;
            for (int j = 0; j < n; j++)
                dup |= r[i].off >= out[j].off && r[i].off + r[i].n <= out[j].off + out[j].n;
            if (dup || n >= PIPE_MAX_RANGES)
                continue;
            bool copy = tied && b >= pl->head_first && first > 0 && r[i].off >= tied->off &&
                        r[i].off < tied->off + tied->n;
            out[n++] = (pipe_range_t){r[i].off, r[i].n, b, copy};
        }
    }
    return n;
}

/* Block b's ranges among the stage's own (no tied copy, no slice of a range another block of
 * the stage lists whole): what the stage's replicas average (dp_attach's block_ranges, with the
 * layer as its model). */
static int stage_block_ranges(const void *layer, int block, eng_range_t *out)
{
    const pipe_layer_t *pl = layer;
    int n = 0;
    for (int i = 0; i < pl->n_ranges; i++)
        if (pl->ranges[i].block == block && !pl->ranges[i].tied_copy)
            out[n++] = (eng_range_t){pl->ranges[i].off, pl->ranges[i].n};
    return n;
}

static int make_buffers(pipe_layer_t *pl, kiln_err_t *err)
{
    int rc;
    if ((rc = pipe_sched_build(pl->plan.schedule, pl->stage, pl->n_stages, pl->geo.microbatches, &pl->sched, err)) ||
        (rc = pipe_sched_build(PIPE_SCHED_FORWARD, pl->stage, pl->n_stages, pl->geo.microbatches,
                               &pl->forward_sched, err)))
        return rc;
    int n = pl->sched.peak_live > 0 ? pl->sched.peak_live : 1;
    size_t BT = (size_t)pl->geo.B * pl->geo.T, nbf = pl->mp->max_boundary_floats(pl->model->impl, pl->geo.B, pl->geo.T);
    pl->acts = calloc((size_t)n, sizeof(*pl->acts));
    pl->input_grad = calloc((size_t)n, sizeof(float *));
    pl->act_sends = calloc((size_t)n, sizeof(comm_req_t *));
    pl->grad_sends = calloc((size_t)n, sizeof(comm_req_t *));
    pl->trace = calloc((size_t)pl->sched.n, sizeof(pipe_trace_entry_t));
    pl->tokens = malloc(sizeof(int32_t) * BT);
    pl->targets = malloc(sizeof(int32_t) * BT);
    pl->output_grad = pl->be->alloc(nbf * sizeof(float));
    if (!pl->acts || !pl->input_grad || !pl->act_sends || !pl->grad_sends || !pl->trace || !pl->tokens ||
        !pl->targets || !pl->output_grad)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    pl->n_slots = n;
    for (int k = 0; k < n; k++) {
        if ((rc = pl->model->ops->acts_create(pl->model, pl->geo.B, &pl->acts[k], err)))
            return rc;
        if (!(pl->input_grad[k] = pl->be->alloc(nbf * sizeof(float))))
            return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    bool recompute = pl->spec->dist.activation_checkpointing;
    for (int b = pl->first_block; b <= pl->last_block; b++)
        pl->act_set_bytes += pipe_gpt_act_bytes(&pl->cfg, pl->plan.head_blocks, b, pl->geo.B, pl->geo.T, recompute);
    return 0;
}

static int attach(void *ctx, eng_train_state_t *ts, kiln_err_t *err)
{
    pipe_layer_t *pl = ctx;
    int rc;
    /* the capability table's refusals, the same as at submission (the loop checked its own
     * backend already; a layer used without the loop checks again) */
    if (!ts->model->ops->pipe)
        return spec_cap_refuse(SPEC_CAP_PIPELINE, ts->model->ops->name, NULL, err);
    if (!spec_backend_has(ts->be->name, SPEC_CAP_PIPELINE) || !ts->be->host_memory)
        return spec_cap_refuse(SPEC_CAP_PIPELINE, ts->model->ops->name, ts->be->name, err);
    pl->be = ts->be;
    pl->model = ts->model;
    pl->mp = ts->model->ops->pipe;
    pl->m = ts->m;
    pl->v = ts->v;
    pl->dloss = ts->dloss;
    pl->passes = ts->passes;
    pl->n_ranges = pipe_stage_ranges(pl, pl->stage, pl->ranges);
    /* held: every range the stage computes with (the tied copy too); update and norm: the
     * stage's own ranges, narrowed by the replicas' data-parallel layer to shards under ZeRO */
    eng_share_t *sh = ts->share;
    eng_ranges_clear(&sh->held);
    for (int i = 0; i < pl->n_ranges; i++)
        if (eng_ranges_add(&sh->held, pl->ranges[i].off, pl->ranges[i].n))
            return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    if ((rc = dp_attach(pl->dp, pl->be, pl->model->p, pl->n_blocks, stage_block_ranges, pl, sh, err)) ||
        (rc = make_buffers(pl, err)))
        return rc;
    int held = 0;
    for (int i = 0; i < pl->n_ranges; i++)
        held += !pl->ranges[i].tied_copy;
    if (pl->opts->quiet && pl->rank != 0)
        return 0;
    printf("pipeline: rank %d is stage %d of %d (replica %d of %d): blocks [%d, %d], %d parameter ranges%s, "
           "%d activation slots of %.1f MiB%s\n", pl->rank, pl->stage, pl->n_stages, pl->replica, pl->n_replicas,
           pl->first_block, pl->last_block, held, held < pl->n_ranges ? " and the tied embedding's rows" : "",
           pl->n_slots, pl->act_set_bytes / MIB,
           pl->spec->dist.activation_checkpointing ? " (activation checkpointing: block boundaries only)" : "");
    fflush(stdout);
    return 0;
}

/* Before the loop releases the model: what the run kept resident, then the stage's buffers. */
static void detach(void *ctx)
{
    pipe_layer_t *pl = ctx;
    if (!pl->model)
        return;
    const eng_params_t *P = pl->model->p;
    const void *start;
    size_t act = 0, nb = P->n * sizeof(float), bytes;
    for (int k = 0; k < pl->n_slots; k++) {
        pl->mp->acts_memory(pl->model->impl, pl->acts[k], &start, &bytes);
        act += resident_bytes(start, bytes);
    }
    pl->mp->work_memory(pl->model->impl, &start, &bytes);
    if (bytes)
        act += resident_bytes(start, bytes);
    pl->act_resident_bytes = (double)act;
    pl->state_resident_bytes = (double)(resident_bytes(P->params, nb) + resident_bytes(P->grads, nb) +
                                        resident_bytes(pl->m, nb) + resident_bytes(pl->v, nb));
    release_buffers(pl);
    pl->model = NULL;
}

static int checkpoint_extra(void *ctx, const char *dir, kiln_err_t *err)
{
    pipe_layer_t *pl = ctx;
    char path[SPEC_PATH + 32], *text = pipe_plan_to_string(&pl->plan);
    int rc;
    if (!text)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    snprintf(path, sizeof(path), "%s/partition_plan.json", dir);
    if (!(rc = kiln_mkdirs(dir, err)))
        rc = kiln_file_write_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}

/* ---- the table --------------------------------------------------------------------------------- */

static int par_allgather(void *ctx, void *slots, size_t slot_bytes, kiln_err_t *err)
{
    return comm_allgather_bytes(((pipe_layer_t *)ctx)->world, slots, slot_bytes, err);
}

static int par_bcast(void *ctx, void *buf, size_t bytes, int root, kiln_err_t *err)
{
    return comm_bcast(((pipe_layer_t *)ctx)->world, buf, bytes, root, err);
}

static int par_run_passes(void *ctx, eng_sampler_t *s, int passes, bool train, double *sum, double *count,
                          kiln_err_t *err)
{
    return pipe_run_passes(ctx, s, passes, train, sum, count, err);
}

static void par_grads_ready(void *ctx, int block, int ranges)
{
    if (ranges == ENG_RANGES_ALL) pipe_grads_ready(ctx, block);
}
static int par_grads_finish(void *ctx, kiln_err_t *err) { return pipe_grads_finish(ctx, err); }
static int par_after_update(void *ctx, int64_t step, kiln_err_t *err) { return pipe_after_update(ctx, step, err); }
static int par_gather(void *ctx, float *buf, kiln_err_t *err) { return pipe_gather(ctx, buf, err); }
static int par_step_metrics(void *ctx, const char **names, double *vals, int max, int *n, kiln_err_t *err)
{
    return pipe_step_metrics(ctx, names, vals, max, n, err);
}

void pipe_parallel(pipe_layer_t *pl, eng_parallel_t *out)
{
    memset(out, 0, sizeof(*out));
    out->name = "pipeline";
    out->ctx = pl;
    out->replica = pl->replica;
    out->replicas = pl->n_replicas;
    out->microbatches = pl->geo.microbatches;
    out->allgather = par_allgather;
    out->bcast = par_bcast;
    out->prepare = prepare;
    out->attach = attach;
    out->detach = detach;
    out->run_passes = par_run_passes;
    out->grads_ready = par_grads_ready;
    out->grads_finish = par_grads_finish;
    out->after_update = par_after_update;
    out->step_metrics = par_step_metrics;
    out->gather = par_gather;
    out->checkpoint_extra = checkpoint_extra;
}

int pipe_layer_info(const pipe_layer_t *pl, pipe_train_info_t *info, kiln_err_t *err)
{
    memset(info, 0, sizeof(*info));
    info->stage = pl->stage;
    info->replica = pl->replica;
    info->n_stages = pl->n_stages;
    info->n_replicas = pl->n_replicas;
    info->peak_live = pl->sched.peak_live;
    info->act_bytes_per_set = (double)pl->act_set_bytes;
    info->act_resident_bytes = pl->act_resident_bytes;
    info->state_resident_bytes = pl->state_resident_bytes;
    info->step_ms_mean = pl->n_timed ? pl->pass_ms_sum / pl->n_timed : 0;
    info->bubble_measured = pl->n_timed ? pl->bubble_sum / pl->n_timed : NAN;
    if (pipe_plan_copy(&info->plan, &pl->plan))
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    return 0;
}

void pipe_layer_dp_stats(const pipe_layer_t *pl, dp_stats_t *out)
{
    dp_get_stats(pl->dp, out);
}
