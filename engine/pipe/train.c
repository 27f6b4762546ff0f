/* train.c - pipelined (and hybrid data x pipeline) training of the GPT: a grid of stages x
 * replicas over comm/, each rank holding only its stage's blocks, running the schedule's action
 * list through pipe_run() every step, with the tied embedding's gradient summed between the
 * first stage and the stages holding the head, data-parallel averaging within each stage, global-norm clipping and
 * AdamW on the rank's own parameter ranges.
 * It is not the single-process trainer (engine/train.c); it reuses the engine's blocks, data,
 * sampler and checkpoint format, so its numbers equal single-rank training's. */
#include "engine/pipe/pipe.h"
#include "spec/spec.h"

#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MIB (1024.0 * 1024.0)
#define TAG_ACT 0x01000000u
#define TAG_GRAD 0x02000000u
#define TAG_GATHER 0x03000000u
#define TAG_TIED 0x04000000u
#define MAX_RANGES (3 * ENG_MAX_TENSORS)

/* ---- lazily backed host memory ---------------------------------------------------------------
 * The engine lays a model out as one flat buffer for all blocks, and one activation slab for all
 * layers. On host backends the pipeline allocates those with mmap: pages the stage never touches
 * (other stages' parameters and activations) never become resident, and pages it stops needing
 * are given back with madvise, so a rank's physical memory is its stage's share. */

#define LAZY_HDR 4096

static void *lazy_alloc(size_t bytes)
{
    size_t total = bytes + LAZY_HDR;
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    *(size_t *)p = total;
    return (char *)p + LAZY_HDR;
}

static void lazy_free(void *q)
{
    if (!q)
        return;
    char *p = (char *)q - LAZY_HDR;
    munmap(p, *(size_t *)p);
}

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

/* ---- the run ----------------------------------------------------------------------------------- */

typedef struct prange {
    size_t off, n;
    bool decay;
    bool in_norm; /* counted in the gradient norm: false for the rows of the tied wte a head block
                   * holds away from the first stage (a copy of stage 0's) */
} prange_t;

typedef struct pt {
    const spec_t *s;
    const eng_train_opts_t *o;
    comm_t *world, *pipe, *dp;
    bool own_world;
    int rank, W, p, dp_n, stage, replica;
    const eng_backend_t *be;      /* the job's backend */
    eng_backend_t lazy_be;        /* its copy with lazy host allocation (host backends) */
    const eng_backend_t *mbe;     /* what the model uses */
    bool lazy;
    eng_gpt_config_t cfg;
    eng_gpt_t *gpt;
    float *m, *v;                 /* (n) AdamW moments, full layout, only own ranges touched */
    pipe_plan_t plan;
    int first, last;              /* this stage's blocks */
    int nb, hf;                   /* the model's blocks, and its first head block */
    float *tied_buf;              /* stage 0: a head stage's wte rows of gradient, being summed */
    prange_t rg[MAX_RANGES];
    int nrg;
    pipe_sched_t sched, fsched;   /* training list and forward-only list */
    int n_slots;
    eng_gpt_acts_t **acts;        /* (n_slots) per-slot activations; ckpt: only acts[0] (work) */
    float **xin, **xout;          /* (n_slots) (B,T,C) stage input / output copies (ckpt mode) */
    float **din;                  /* (n_slots) (B,T,C) gradient of the stage input, sent back */
    float *gbuf;                  /* (B,T,C) received output gradient */
    comm_req_t **act_req, **grad_req; /* (n_slots) sends in flight per slot */
    bool ckpt;                    /* activation checkpointing */
    int B, T, m_mb, accum;
    float dloss;
    eng_tokens_t train, val;
    eng_sampler_t ts, vs;
    eng_sampler_t *cur;           /* sampler the hooks read */
    int pass;                     /* accumulation pass within the step */
    int32_t *tok, *tgt;
    double loss_acc;              /* last stage: sum of microbatch mean losses */
    double busy;                  /* seconds in F/B this step */
    pipe_trace_entry_t *trace;
    uint64_t model_hash;
    size_t act_set_bytes;
} pt_t;

static void pt_log(pt_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void pt_log(pt_t *t, const char *fmt, ...)
{
    if (t->o->quiet && t->rank != 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

/* Data paths resolve as engine/train.c resolves them (absolute, working directory, the spec's
 * directory and its parent, $KILN_ROOT), so a spec behaves the same in both trainers. */
static void resolve_path(const char *in, const char *spec_dir, char *out, size_t n)
{
    struct stat sb;
    kiln_strlcpy(out, in, n);
    if (in[0] == '/' || stat(in, &sb) == 0)
        return;
    char parent[SPEC_PATH + 4];
    const char *roots[3] = {spec_dir, NULL, getenv("KILN_ROOT")};
    if (spec_dir) {
        snprintf(parent, sizeof(parent), "%s/..", spec_dir);
        roots[1] = parent;
    }
    for (int i = 0; i < 3; i++) {
        char cand[2 * SPEC_PATH + 8];
        if (!roots[i] || !*roots[i])
            continue;
        snprintf(cand, sizeof(cand), "%s/%s", roots[i], in);
        if (stat(cand, &sb) == 0) {
            kiln_strlcpy(out, cand, n);
            return;
        }
    }
}

/* The engine's model fingerprint (engine/train.c), so checkpoints are interchangeable. */
static uint64_t gpt_hash(const eng_gpt_config_t *c)
{
    uint64_t h = 1469598103934665603ULL;
    int cf[6] = {c->max_seq_len, c->vocab_size, c->padded_vocab_size, c->n_layer, c->n_head, c->n_embd};
    for (int i = 0; i < 6; i++)
        h ^= (uint64_t)cf[i] + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
}

static void metric_record(pt_t *t, int64_t step, const char *const *names, const double *vals, int n)
{
    if (t->o->metrics_fd < 0 || t->rank != 0)
        return;
    char buf[2048];
    int len = snprintf(buf, sizeof(buf), "{\"step\": %lld, \"time\": %.3f, \"metrics\": {", (long long)step,
                       kiln_now_us() / 1e6);
    int first = 1;
    for (int i = 0; i < n && len < (int)sizeof(buf) - 64; i++) {
        if (!isfinite(vals[i]))
            continue;
        len += snprintf(buf + len, sizeof(buf) - len, "%s\"%s\": %.7g", first ? "" : ", ", names[i], vals[i]);
        first = 0;
    }
    len += snprintf(buf + len, sizeof(buf) - len, "}}\n");
    ssize_t off = 0;
    while (off < len) {
        ssize_t w = write(t->o->metrics_fd, buf + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        off += w;
    }
}

/* ---- hooks: one microbatch on this stage ------------------------------------------------------- */

static size_t bt_c(const pt_t *t) { return (size_t)t->B * t->T * t->cfg.n_embd; }
/* the largest message between stages: (B,T,C) plus the head's statistics */
static size_t bmax(const pt_t *t) { return bt_c(t) + 4 * (size_t)t->B * t->T; }
static size_t act_bytes(const pt_t *t, int boundary)
{
    return eng_gpt_boundary_floats(t->gpt, t->B, t->T, boundary) * sizeof(float);
}
static size_t grad_bytes(const pt_t *t, int boundary)
{
    return eng_gpt_grad_floats(t->gpt, t->B, t->T, boundary) * sizeof(float);
}

static int wait_slot(pt_t *t, int slot, kiln_err_t *err)
{
    int rc = comm_wait(t->act_req[slot], err);
    t->act_req[slot] = NULL;
    int rc2 = comm_wait(t->grad_req[slot], rc ? NULL : err);
    t->grad_req[slot] = NULL;
    return rc ? rc : rc2;
}

static void set_batch(pt_t *t, eng_gpt_acts_t *a, int mb)
{
    eng_sampler_micro(t->cur, t->pass * t->m_mb + mb, t->B, t->tok, t->tgt);
    eng_gpt_acts_set_batch(t->gpt, a, t->tok, t->tgt);
}

/* Runs this stage's blocks forward on activation set a for microbatch mb. */
static void stage_forward(pt_t *t, eng_gpt_acts_t *a, int mb, int slot)
{
    if (t->first == 0 || t->last >= t->hf) /* tokens, or targets for the head */
        set_batch(t, a, mb);
    if (t->ckpt && t->first > 0)
        t->be->copy(eng_gpt_boundary(t->gpt, a, t->first - 1), t->xin[slot], act_bytes(t, t->first - 1));
    for (int b = t->first; b <= t->last; b++)
        eng_gpt_block_forward(t->gpt, a, b, true);
}

static int h_forward(void *ctx, int mb, int slot, kiln_err_t *err)
{
    pt_t *t = ctx;
    int rc;
    if (t->first == 0 && (rc = wait_slot(t, slot, err)))
        return rc;
    double t0 = kiln_mono_s();
    eng_gpt_acts_t *a = t->acts[t->ckpt ? 0 : slot];
    stage_forward(t, a, mb, slot);
    if (t->last == t->nb - 1) {
        size_t BT = (size_t)t->B * t->T;
        t->be->to_host(a->host_losses, a->losses, BT * sizeof(float));
        double s = 0;
        for (size_t i = 0; i < BT; i++)
            s += a->host_losses[i];
        t->loss_acc += s / (double)BT;
    } else if (t->ckpt) {
        t->be->copy(t->xout[slot], eng_gpt_boundary(t->gpt, a, t->last), act_bytes(t, t->last));
    }
    t->be->synchronize();
    t->busy += kiln_mono_s() - t0;
    return 0;
}

static int h_backward(void *ctx, int mb, int slot, kiln_err_t *err)
{
    pt_t *t = ctx;
    int rc;
    /* the previous gradient sent from this slot must be gone before din is overwritten */
    if ((rc = comm_wait(t->grad_req[slot], err)))
        return rc;
    t->grad_req[slot] = NULL;
    double t0 = kiln_mono_s();
    eng_gpt_acts_t *a = t->acts[t->ckpt ? 0 : slot];
    if (t->ckpt)
        stage_forward(t, a, mb, slot); /* recompute what was not kept */
    const float *dout = t->last == t->nb - 1 ? NULL : t->gbuf;
    for (int b = t->last; b >= t->first; b--) {
        float *din = b == t->first ? t->din[slot] : (dout == t->gpt->d_a ? t->gpt->d_b : t->gpt->d_a);
        eng_gpt_block_backward(t->gpt, a, b, dout, b == 0 ? NULL : din, t->dloss);
        dout = din;
    }
    t->be->synchronize();
    t->busy += kiln_mono_s() - t0;
    return 0;
}

static int h_send_act(void *ctx, int mb, int slot, kiln_err_t *err)
{
    pt_t *t = ctx;
    const float *buf = t->ckpt ? t->xout[slot] : eng_gpt_boundary(t->gpt, t->acts[slot], t->last);
    return comm_send_start(t->pipe, buf, act_bytes(t, t->last), t->stage + 1, TAG_ACT | (uint32_t)mb,
                           &t->act_req[slot], err);
}

static int h_recv_act(void *ctx, int mb, int slot, kiln_err_t *err)
{
    pt_t *t = ctx;
    int rc;
    if ((rc = wait_slot(t, slot, err)))
        return rc;
    float *buf = t->ckpt ? t->xin[slot] : eng_gpt_boundary(t->gpt, t->acts[slot], t->first - 1);
    return comm_recv(t->pipe, buf, act_bytes(t, t->first - 1), t->stage - 1, TAG_ACT | (uint32_t)mb, NULL, err);
}

static int h_send_grad(void *ctx, int mb, int slot, kiln_err_t *err)
{
    pt_t *t = ctx;
    return comm_send_start(t->pipe, t->din[slot], grad_bytes(t, t->first - 1), t->stage - 1, TAG_GRAD | (uint32_t)mb,
                           &t->grad_req[slot], err);
}

static int h_recv_grad(void *ctx, int mb, int slot, kiln_err_t *err)
{
    (void)slot;
    pt_t *t = ctx;
    return comm_recv(t->pipe, t->gbuf, grad_bytes(t, t->last), t->stage + 1, TAG_GRAD | (uint32_t)mb, NULL, err);
}

static int h_finish(void *ctx, kiln_err_t *err)
{
    pt_t *t = ctx;
    int rc = 0;
    for (int k = 0; k < t->n_slots; k++) {
        int r = wait_slot(t, k, rc ? NULL : err);
        if (!rc)
            rc = r;
    }
    return rc;
}

static const pipe_hooks_t pt_hooks = {h_forward, h_backward, h_send_act, h_recv_act,
                                      h_send_grad, h_recv_grad, h_finish};

/* ---- setup ------------------------------------------------------------------------------------- */

static int setup_grid(pt_t *t, comm_t *world, kiln_err_t *err)
{
    int rc;
    if (world) {
        t->world = world;
    } else {
        if ((rc = comm_create_from_env(&t->world, err)))
            return rc;
        t->own_world = true;
    }
    t->rank = comm_rank(t->world);
    t->W = comm_size(t->world);
    t->p = t->s->dist.mp_partitions;
    if (t->p < 2 || t->W % t->p)
        return kiln_err_set(err, KILN_EINVAL, "distribution.model_parallel.partitions",
                            "%d partitions do not divide the job's %d ranks", t->p, t->W);
    t->dp_n = t->W / t->p;
    t->stage = t->rank % t->p;
    t->replica = t->rank / t->p;
    if ((rc = comm_split(t->world, t->replica, t->stage, &t->pipe, err)))
        return rc;
    return comm_split(t->world, t->stage, t->replica, &t->dp, err);
}

static int setup_data(pt_t *t, kiln_err_t *err)
{
    const spec_t *s = t->s;
    char path[SPEC_PATH];
    int rc;
    if (!strcmp(s->data.format, "synthetic"))
        return kiln_err_set(err, KILN_EINVAL, "data.format", "pipeline parallelism needs token data");
    eng_data_kind_t kind = !strcmp(s->data.format, "tokens") ? ENG_DATA_TOKENS : ENG_DATA_TEXT;
    resolve_path(s->data.train, t->o->spec_dir, path, sizeof(path));
    if ((rc = eng_tokens_load(path, kind, &t->train, err)))
        return rc;
    if (s->data.val[0]) {
        resolve_path(s->data.val, t->o->spec_dir, path, sizeof(path));
        if ((rc = eng_tokens_load(path, kind, &t->val, err)))
            return rc;
    } else if ((rc = eng_tokens_split_tail(&t->train, s->data.val_fraction, &t->val, err))) {
        return rc;
    }
    int V = s->model.vocab_size;
    if (t->train.max_token >= V || (t->val.n && t->val.max_token >= V))
        return kiln_err_set(err, KILN_EINVAL, "model.vocab", "data holds token %d but the vocabulary has only %d entries",
                            KILN_MAX(t->train.max_token, t->val.max_token), V);
    return eng_sampler_init(&t->ts, &t->train, t->T, s->hp.global_batch_size, t->replica, t->dp_n, true,
                            s->hp.seed, err);
}

/* Profiles the model's blocks with the head in J blocks on every rank and averages the times
 * over the ranks, so all ranks hold identical figures (and so make the identical plan).
 * *prof (OUT) is malloc'd with 2L + 1 + J entries; *overhead (OUT) includes what the process
 * held before the model (libraries, the transport's buffers), which counts against a per-rank
 * memory limit too. */
static int profile_blocks(pt_t *t, int J, size_t base, pipe_block_profile_t **prof, size_t *overhead,
                          kiln_err_t *err)
{
    int nb = 2 * t->cfg.n_layer + 1 + J, rc;
    pipe_block_profile_t *pr = calloc((size_t)nb, sizeof(*pr));
    float *times = calloc((size_t)nb * 2 + 1, sizeof(float));
    *prof = pr;
    if (!pr || !times) {
        free(times);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    if ((rc = pipe_profile_gpt(&t->cfg, t->be, t->B, t->T, J, 2, 5, pr, overhead, err)))
        goto done;
    for (int b = 0; b < nb; b++) {
        times[2 * b] = (float)pr[b].fwd_ms;
        times[2 * b + 1] = (float)pr[b].bwd_ms;
    }
    times[2 * nb] = (float)((double)base / MIB);
    if ((rc = comm_allreduce(t->world, times, (size_t)nb * 2 + 1, COMM_AVG, err)))
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

/* The plan saved beside the latest checkpoint (write_checkpoint), when the job resumes from one:
 * rank 0 reads it and hands the text to every rank, so all use the same plan. NULL when there is
 * none (or on a transport failure, which the next collective reports). */
static json_t *saved_plan(pt_t *t)
{
    const char *dir = t->o->checkpoint_dir;
    char path[SPEC_PATH + 64], *text = NULL;
    uint64_t len = 0;
    kiln_err_t e2;
    kiln_err_clear(&e2);
    if (!dir || !*dir)
        return NULL;
    if (t->rank == 0 && eng_ckpt_find_latest(dir, path, sizeof(path)) == KILN_OK) {
        size_t n = 0;
        snprintf(path, sizeof(path), "%s/partition_plan.json", dir);
        if (kiln_file_read(path, &text, &n, &e2) == 0)
            len = n;
    }
    if (comm_bcast(t->world, &len, sizeof(len), 0, &e2) || len == 0 || len > (1u << 20)) {
        free(text);
        return NULL;
    }
    if (t->rank != 0)
        text = malloc(len);
    /* every rank must have room before the text moves; otherwise all go without it */
    float ok[1] = {text ? 0.0f : 1.0f};
    json_t *j = NULL;
    if (comm_allreduce(t->world, ok, 1, COMM_SUM, &e2) == 0 && ok[0] == 0.0f &&
        comm_bcast(t->world, text, len, 0, &e2) == 0)
        j = json_loadb(text, len, 0, NULL);
    free(text);
    return j;
}

/* Profiles the blocks and makes or validates the plan. The head is first profiled whole; when
 * it costs more than a layer's half (a 50k-word vocabulary), it is cut into vocabulary slices
 * and profiled again, so the partitioner can spread it over stages. A manual plan says how many
 * head blocks it was made for. A job resuming from a checkpoint keeps the plan it was trained
 * with (saved beside the checkpoint): a different cut of the head or of the stages would sum the
 * same numbers in another order, and the resumed run would no longer equal the uninterrupted
 * one. */
static int setup_plan(pt_t *t, kiln_err_t *err)
{
    const spec_t *s = t->s;
    int L = t->cfg.n_layer, nb, rc, J = 1;
    pipe_block_profile_t *prof = NULL;
    size_t overhead = 0;
    bool manual = s->dist.mp_partition_plan && !s->dist.mp_auto_partition;
    json_t *resumed = manual ? NULL : saved_plan(t);
    if (resumed) {
        pipe_plan_t probe;
        kiln_err_t e2;
        int Jr = pipe_plan_json_head_blocks(resumed);
        if (Jr < 1 || pipe_plan_from_json(resumed, 2 * L + 1 + Jr, t->p, &probe, &e2)) {
            if (t->rank == 0)
                log_warn("pipeline: the plan saved beside the checkpoint does not fit this job (%s); making a new one",
                         Jr < 1 ? "bad head_blocks" : e2.message);
            json_decref(resumed);
            resumed = NULL;
        } else {
            pipe_plan_deinit(&probe);
        }
    }
    const json_t *given = manual ? s->dist.mp_partition_plan : resumed;
    if (manual && (J = pipe_plan_json_head_blocks(given)) < 1)
        return kiln_err_set(err, KILN_EINVAL, "distribution.model_parallel.partition_plan",
                            "invalid partition plan: \"head_blocks\" must be an integer from 1 to %d",
                            PIPE_MAX_HEAD_BLOCKS);
    if (resumed)
        J = pipe_plan_json_head_blocks(resumed);
    double t0 = kiln_mono_s();
    size_t base = rss_now();
    if ((rc = profile_blocks(t, J, base, &prof, &overhead, err)))
        goto done;
    if (!given && (J = pipe_gpt_choose_head_blocks(prof, L)) > 1) {
        if (t->rank == 0)
            pt_log(t, "pipeline: the head costs %.2f+%.2f ms, more than a layer's half; cutting it into %d "
                   "vocabulary slices\n", prof[2 * L + 1].fwd_ms, prof[2 * L + 1].bwd_ms, J);
        free(prof);
        overhead = 0;
        if ((rc = profile_blocks(t, J, base, &prof, &overhead, err)))
            goto done;
    }
    nb = 2 * L + 1 + J;
    t->nb = nb;
    t->hf = 2 * L + 1;
    if (t->rank == 0) {
        double hfw = 0, hbw = 0;
        for (int b = t->hf; b < nb; b++) {
            hfw += prof[b].fwd_ms;
            hbw += prof[b].bwd_ms;
        }
        pt_log(t, "pipeline: profiled %d blocks in %.2f s (microbatch %dx%d): embedding %.2f+%.2f ms, layer "
               "attention %.2f+%.2f ms and MLP %.2f+%.2f ms, head %.2f+%.2f ms in %d block%s (forward+backward)\n",
               nb, kiln_mono_s() - t0, t->B, t->T, prof[0].fwd_ms, prof[0].bwd_ms, prof[1].fwd_ms, prof[1].bwd_ms,
               prof[2].fwd_ms, prof[2].bwd_ms, hfw, hbw, J, J == 1 ? "" : "s");
    }
    pipe_optimize_t opt = PIPE_OPT_SPEED;
    pipe_sched_kind_t sk = PIPE_SCHED_INTERLEAVED;
    pipe_optimize_parse(s->dist.mp_optimize, &opt);
    pipe_sched_parse(s->dist.mp_pipeline, &sk);
    size_t limit = s->res.memory_limit_mb > 0 ? (size_t)s->res.memory_limit_mb << 20 : 0;
    pipe_partition_opts_t po = {.n_stages = t->p, .microbatches = t->m_mb, .optimize = opt, .schedule = sk,
                                .mem_limit_bytes = limit, .rank_overhead_bytes = overhead, .recompute = t->ckpt,
                                .boundary_bytes = bmax(t) * sizeof(float)};
    if (given) {
        if ((rc = pipe_plan_from_json(given, nb, t->p, &t->plan, err)))
            goto done;
        if (resumed) {
            const json_t *mv = json_object_get(resumed, "manual");
            t->plan.manual = json_is_true(mv);
            if (t->rank == 0)
                pt_log(t, "pipeline: resuming with the plan saved beside the checkpoint\n");
        }
        t->plan.optimize = opt;
        t->plan.schedule = sk;
        t->plan.microbatches = t->m_mb;
        pipe_plan_predict(&t->plan, prof, &po);
        if ((rc = pipe_plan_simulate(&t->plan, prof, err)))
            goto done;
        for (int k = 0; k < t->p; k++)
            if (limit && t->plan.stages[k].predicted_mem_mb * MIB > (double)limit) {
                rc = kiln_err_set(err, KILN_EUNFIT, "distribution.model_parallel.partition_plan",
                                  "model does not fit: stage %d of the partition plan (blocks [%d, %d]) needs %.1f MiB, "
                                  "limit %.1f MiB", k, t->plan.stages[k].first, t->plan.stages[k].last,
                                  t->plan.stages[k].predicted_mem_mb, (double)limit / MIB);
                kiln_err_hint(err, "move blocks off that stage, use more partitions, or leave out partition_plan to "
                              "let kiln choose");
                goto done;
            }
    } else {
        if ((rc = pipe_partition(prof, nb, &po, &t->plan, err)))
            goto done;
    }
    t->plan.head_blocks = J;
    if (t->rank == 0) {
        pt_log(t, "pipeline: %s plan, %d stages x %d replicas, %s schedule, %d microbatches of %d, balance %.3f, "
               "predicted %.1f ms per pass, bubble %.1f%% (theory %.1f%%)\n", t->plan.manual ? "manual" : "automatic",
               t->p, t->dp_n, pipe_sched_name(sk), t->m_mb, t->B, t->plan.balance, t->plan.predicted_pass_ms,
               t->plan.predicted_bubble * 100, pipe_bubble_theory(t->p, t->m_mb) * 100);
        for (int k = 0; k < t->p; k++)
            pt_log(t, "pipeline: stage %d blocks [%d, %d]: predicted %.2f ms/step, %.1f MiB\n", k,
                   t->plan.stages[k].first, t->plan.stages[k].last, t->plan.stages[k].predicted_ms,
                   t->plan.stages[k].predicted_mem_mb);
        /* the whole plan on one line, so the job's stored logs hold it (pass it back as partition_plan) */
        json_t *pj = pipe_plan_to_json(&t->plan);
        char *line = pj ? json_dumps(pj, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6)) : NULL;
        if (line)
            pt_log(t, "pipeline: plan %s\n", line);
        free(line);
        json_decref(pj);
        if (t->o->output_dir && *t->o->output_dir) {
            char path[SPEC_PATH + 32], *text = pipe_plan_to_string(&t->plan);
            kiln_err_t e2;
            kiln_err_clear(&e2);
            snprintf(path, sizeof(path), "%s/partition_plan.json", t->o->output_dir);
            if (!text || kiln_mkdirs(t->o->output_dir, &e2) || kiln_file_write_atomic(path, text, strlen(text), &e2))
                log_warn("could not write %s: %s", path, e2.message);
            else
                pt_log(t, "pipeline: plan written to %s\n", path);
            free(text);
        }
    }
    t->first = t->plan.stages[t->stage].first;
    t->last = t->plan.stages[t->stage].last;
    rc = 0;
done:
    json_decref(resumed);
    free(prof);
    return rc;
}

static int cmp_range(const void *a, const void *b)
{
    const eng_range_t *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Gives back the pages of buf (n floats) outside this stage's ranges. */
static void release_outside(pt_t *t, float *buf, size_t n)
{
    if (!t->lazy || !buf)
        return;
    eng_range_t r[MAX_RANGES + 1];
    for (int i = 0; i < t->nrg; i++)
        r[i] = (eng_range_t){t->rg[i].off, t->rg[i].n};
    qsort(r, (size_t)t->nrg, sizeof(r[0]), cmp_range);
    r[t->nrg] = (eng_range_t){n, 0};
    long pg = sysconf(_SC_PAGESIZE);
    size_t pos = 0;
    for (int i = 0; i <= t->nrg; i++) {
        uintptr_t a = (uintptr_t)(buf + pos), e = (uintptr_t)(buf + r[i].off);
        a = (a + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
        e &= ~(uintptr_t)(pg - 1);
        if (e > a)
            madvise((void *)a, e - a, MADV_DONTNEED);
        if (r[i].off + r[i].n > pos)
            pos = r[i].off + r[i].n;
    }
}

/* GPT-2 initialisation of this stage's ranges only, drawing the same random stream as
 * eng_gpt_init_weights (engine/gpt.c) so every parameter gets the value a single process gives
 * it, without ever holding the whole model: values of other stages' ranges are drawn and
 * dropped. Mirrors gpt.c's rules (normal(0, 0.02) for 2-D weights, 0.02/sqrt(2L) for the
 * residual projections, LayerNorm weights 1, biases 0, padded wte rows 0); the pipeline tests
 * compare parameters with single-process training, so a drift between the two would show. */
static int init_own_ranges(pt_t *t, uint64_t seed, kiln_err_t *err)
{
    const eng_params_t *P = &t->gpt->p;
    eng_range_t r[MAX_RANGES];
    for (int i = 0; i < t->nrg; i++)
        r[i] = (eng_range_t){t->rg[i].off, t->rg[i].n};
    qsort(r, (size_t)t->nrg, sizeof(r[0]), cmp_range);
    size_t maxn = 0;
    for (int i = 0; i < t->nrg; i++)
        maxn = r[i].n > maxn ? r[i].n : maxn;
    float *buf = malloc(sizeof(float) * (maxn ? maxn : 1));
    if (!buf)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory while initialising parameters");
    eng_rng_t rng;
    eng_rng_seed(&rng, seed);
    double resid_std = 0.02 / sqrt(2.0 * t->cfg.n_layer);
    size_t wte_keep = (size_t)t->cfg.vocab_size * t->cfg.n_embd; /* wte rows past V stay 0 */
    for (int k = 0; k < P->n_tensors; k++) {
        const eng_tensor_t *ten = &P->tensors[k];
        bool ones = !strcmp(ten->name, "ln1w") || !strcmp(ten->name, "ln2w") || !strcmp(ten->name, "lnfw");
        bool normal = !ones && ten->decay;
        double sd = (!strcmp(ten->name, "attprojw") || !strcmp(ten->name, "fcprojw")) ? resid_std : 0.02;
        size_t pos = ten->off, end = ten->off + ten->n; /* next element whose value is drawn */
        for (int i = 0; i < t->nrg; i++) {
            size_t a = r[i].off > ten->off ? r[i].off : ten->off;
            size_t b = r[i].off + r[i].n < end ? r[i].off + r[i].n : end;
            if (a >= b)
                continue;
            if (normal) {
                for (; pos < a; pos++) { /* two uniforms per normal, as eng_rng_normal draws them */
                    eng_rng_next(&rng);
                    eng_rng_next(&rng);
                }
                for (size_t j = a; j < b; j++, pos++) {
                    buf[j - a] = (float)(sd * eng_rng_normal(&rng));
                    if (k == 0 && j - ten->off >= wte_keep)
                        buf[j - a] = 0.0f;
                }
            } else {
                for (size_t j = a; j < b; j++)
                    buf[j - a] = ones ? 1.0f : 0.0f;
            }
            t->be->to_device(P->params + a, buf, (b - a) * sizeof(float));
        }
        /* the rest of a normal tensor's draws happen before the next tensor's */
        if (normal)
            for (; pos < end; pos++) {
                eng_rng_next(&rng);
                eng_rng_next(&rng);
            }
    }
    free(buf);
    return 0;
}

/* The parameter ranges stage k holds, in block order (OUT: up to MAX_RANGES); returns the
 * count. The tied wte is listed by block 0 whole and by the head blocks in row slices: a slice
 * inside a range already listed is skipped, and a slice on a stage without block 0 is a copy
 * (tied: summed with stage 0's gradient; not in the norm; not gathered). Every rank can compute
 * any stage's list, which is how rank 0 knows what the others send it. */
static int stage_ranges(const pt_t *t, int k, prange_t *out)
{
    const eng_params_t *P = &t->gpt->p;
    int n = 0, first = t->plan.stages[k].first, last = t->plan.stages[k].last;
    for (int b = first; b <= last; b++) {
        eng_range_t r[ENG_MAX_TENSORS];
        int nr = eng_gpt_block_ranges(t->gpt, b, r);
        for (int i = 0; i < nr; i++) {
            bool dup = false;
            for (int j = 0; j < n; j++)
                dup |= r[i].off >= out[j].off && r[i].off + r[i].n <= out[j].off + out[j].n;
            if (dup || n >= MAX_RANGES)
                continue;
            bool decay = false;
            for (int q = 0; q < P->n_tensors; q++)
                if (r[i].off >= P->tensors[q].off && r[i].off < P->tensors[q].off + P->tensors[q].n)
                    decay = P->tensors[q].decay;
            bool copy = b >= t->hf && r[i].off >= P->tensors[0].off &&
                        r[i].off < P->tensors[0].off + P->tensors[0].n && first > 0;
            out[n++] = (prange_t){r[i].off, r[i].n, decay, !copy};
        }
    }
    return n;
}

static int setup_model(pt_t *t, kiln_err_t *err)
{
    const spec_t *s = t->s;
    int rc;
    if ((rc = eng_gpt_create(&t->cfg, t->mbe, t->B, &t->gpt, err)))
        return rc;
    if (s->model.init_from[0]) {
        eng_gpt_config_t fc;
        float *params = NULL;
        char path[SPEC_PATH];
        resolve_path(s->model.init_from, t->o->spec_dir, path, sizeof(path));
        if ((rc = eng_gpt_llmc_read(path, &fc, &params, err)))
            return rc;
        if (fc.n_layer != t->cfg.n_layer || fc.n_embd != t->cfg.n_embd || fc.n_head != t->cfg.n_head ||
            fc.padded_vocab_size != t->cfg.padded_vocab_size || fc.max_seq_len != t->cfg.max_seq_len) {
            free(params);
            return kiln_err_set(err, KILN_EINVAL, "model.init_from", "\"%s\" does not match the spec's model", path);
        }
        t->be->to_device(t->gpt->p.params, params, t->gpt->p.n * sizeof(float));
        free(params);
    }
    if ((rc = eng_gpt_set_head_blocks(t->gpt, t->plan.head_blocks, err)))
        return rc;
    t->nrg = stage_ranges(t, t->stage, t->rg);
    if (!s->model.init_from[0] && (rc = init_own_ranges(t, s->hp.seed, err)))
        return rc;
    t->m = t->mbe->alloc(t->gpt->p.n * sizeof(float));
    t->v = t->mbe->alloc(t->gpt->p.n * sizeof(float));
    if (!t->m || !t->v)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "could not allocate optimizer state");
    t->model_hash = gpt_hash(&t->cfg);
    return 0;
}

static int setup_buffers(pt_t *t, kiln_err_t *err)
{
    int rc;
    pipe_sched_kind_t sk = t->plan.schedule;
    if ((rc = pipe_sched_build(sk, t->stage, t->p, t->m_mb, &t->sched, err)) ||
        (rc = pipe_sched_build(PIPE_SCHED_FORWARD, t->stage, t->p, t->m_mb, &t->fsched, err)))
        return rc;
    t->n_slots = t->sched.peak_live > 0 ? t->sched.peak_live : 1;
    size_t n = (size_t)t->n_slots;
    t->acts = calloc(n, sizeof(*t->acts));
    t->xin = calloc(n, sizeof(float *));
    t->xout = calloc(n, sizeof(float *));
    t->din = calloc(n, sizeof(float *));
    t->act_req = calloc(n, sizeof(comm_req_t *));
    t->grad_req = calloc(n, sizeof(comm_req_t *));
    t->trace = calloc((size_t)t->sched.n, sizeof(pipe_trace_entry_t));
    t->tok = malloc(sizeof(int32_t) * t->B * t->T);
    t->tgt = malloc(sizeof(int32_t) * t->B * t->T);
    t->gbuf = t->mbe->alloc(bmax(t) * sizeof(float));
    if (!t->acts || !t->xin || !t->xout || !t->din || !t->act_req || !t->grad_req || !t->trace || !t->tok ||
        !t->tgt || !t->gbuf)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    int n_acts = t->ckpt ? 1 : t->n_slots;
    for (int k = 0; k < n_acts; k++)
        if ((rc = eng_gpt_acts_create(t->gpt, t->B, t->T, &t->acts[k], err)))
            return rc;
    for (int k = 0; k < t->n_slots; k++) {
        t->din[k] = t->mbe->alloc(bmax(t) * sizeof(float));
        if (!t->din[k])
            return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        if (t->ckpt) {
            t->xin[k] = t->mbe->alloc(bmax(t) * sizeof(float));
            t->xout[k] = t->mbe->alloc(bmax(t) * sizeof(float));
            if (!t->xin[k] || !t->xout[k])
                return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
            t->acts[k] = t->acts[0];
        }
    }
    for (int b = t->first; b <= t->last; b++)
        t->act_set_bytes += pipe_gpt_act_bytes(&t->cfg, t->plan.head_blocks, b, t->B, t->T);
    return 0;
}

/* ---- gathering to rank 0 (final model, checkpoints) -------------------------------------------- */

/* Rank 0 receives, for every stage k > 0 of replica 0, that stage's ranges of buf (n floats) in
 * the order the stage lists them; those stages send theirs. Other replicas do nothing. */
static int gather_to_root(pt_t *t, float *buf, kiln_err_t *err)
{
    int rc;
    if (t->replica != 0)
        return 0;
    if (t->rank != 0) {
        for (int i = 0; i < t->nrg; i++) {
            if (!t->rg[i].in_norm)
                continue; /* the tied wte copy: rank 0 has it */
            if ((rc = comm_send(t->world, buf + t->rg[i].off, t->rg[i].n * sizeof(float), 0,
                                TAG_GATHER | (uint32_t)i, err)))
                return rc;
        }
        return 0;
    }
    for (int k = 1; k < t->p; k++) {
        prange_t r[MAX_RANGES];
        int n = stage_ranges(t, k, r);
        for (int i = 0; i < n; i++) {
            if (!r[i].in_norm)
                continue;
            if ((rc = comm_recv(t->world, buf + r[i].off, r[i].n * sizeof(float), k, TAG_GATHER | (uint32_t)i, NULL,
                                err)))
                return rc;
        }
    }
    return 0;
}

static int write_checkpoint(pt_t *t, int64_t step, kiln_err_t *err)
{
    const char *dir = t->o->checkpoint_dir;
    if (!dir || !*dir)
        return 0;
    int rc;
    if ((rc = gather_to_root(t, t->gpt->p.params, err)) || (rc = gather_to_root(t, t->m, err)) ||
        (rc = gather_to_root(t, t->v, err)))
        return rc;
    if (t->rank == 0) {
        /* the plan first: a checkpoint is resumed with the plan it was trained with */
        char path[SPEC_PATH + 32], *text = pipe_plan_to_string(&t->plan);
        if (!text)
            return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        snprintf(path, sizeof(path), "%s/partition_plan.json", dir);
        rc = kiln_mkdirs(dir, err);
        if (!rc)
            rc = kiln_file_write_atomic(path, text, strlen(text), err);
        free(text);
        if (rc)
            return rc;
        eng_ckpt_meta_t meta;
        memset(&meta, 0, sizeof(meta));
        meta.step = step;
        meta.train = t->ts.st;
        eng_rng_seed(&meta.sample_rng, t->s->hp.seed + 0xabcdefULL);
        meta.model_hash = t->model_hash;
        meta.n_params = t->gpt->p.n;
        if ((rc = eng_ckpt_write(dir, &meta, t->be, t->gpt->p.params, t->m, t->v, t->gpt->p.n,
                                 t->s->ckpt_keep_last, err)))
            return rc;
        pt_log(t, "checkpoint: step %lld written to %s/ckpt_%08lld.bin\n", (long long)step, dir, (long long)step);
        release_outside(t, t->gpt->p.params, t->gpt->p.n);
        release_outside(t, t->m, t->gpt->p.n);
        release_outside(t, t->v, t->gpt->p.n);
    }
    /* nobody trains on while rank 0 still reads its buffers */
    return comm_barrier(t->world, err);
}

/* Text samples as engine/train.c writes them: rank 0 gathers the parameters (a transient copy of
 * the whole model on that rank) and runs the engine's sampler over all blocks. Collective over
 * replica 0's stages. */
static void sample_text(pt_t *t, eng_rng_t *rng, int64_t step)
{
    const spec_hparams_t *hp = &t->s->hp;
    if (hp->sample_tokens <= 0 || strcmp(t->s->model.vocab, "bytes") != 0)
        return;
    kiln_err_t err;
    kiln_err_clear(&err);
    if (gather_to_root(t, t->gpt->p.params, &err)) {
        log_warn("sampling: could not gather the parameters: %s", err.message);
        return;
    }
    if (t->rank != 0)
        return;
    const char *prompt = t->o->sample_prompt && *t->o->sample_prompt ? t->o->sample_prompt : "\n";
    int np = (int)strlen(prompt), n = hp->sample_tokens;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(np + n + 1));
    char *text = malloc((size_t)np + n + 1);
    if (!toks || !text)
        goto done;
    for (int i = 0; i < np; i++)
        toks[i] = (uint8_t)prompt[i];
    if (eng_gpt_sample(t->gpt, toks, np, n, hp->temperature, hp->top_k, rng, toks, &err)) {
        log_warn("sampling failed: %s", err.message);
        goto done;
    }
    for (int i = 0; i < np + n; i++)
        text[i] = (char)toks[i];
    text[np + n] = '\0';
    pt_log(t, "sample at step %lld (temperature %.2f, top_k %d):\n", (long long)step, hp->temperature, hp->top_k);
    char *save = NULL, *copy = strdup(text);
    for (char *line = copy ? strtok_r(copy, "\n", &save) : NULL; line; line = strtok_r(NULL, "\n", &save))
        pt_log(t, "  | %s\n", line);
    free(copy);
    if (t->o->output_dir && *t->o->output_dir) {
        char path[SPEC_PATH + 32];
        snprintf(path, sizeof(path), "%s/samples.txt", t->o->output_dir);
        kiln_mkdirs(t->o->output_dir, &err);
        FILE *f = fopen(path, "a");
        if (f) {
            fprintf(f, "=== step %lld (temperature %.2f, top_k %d)\n%s\n\n", (long long)step, hp->temperature,
                    hp->top_k, text);
            fclose(f);
        }
    }
done:
    free(toks);
    free(text);
    release_outside(t, t->gpt->p.params, t->gpt->p.n);
}

/* Resumes from rank 0's newest checkpoint, which rank 0 reads and hands to every rank: ranks on
 * other nodes may find none in their own checkpoint directory, or an older one, and a stage
 * that started over while the others resumed would never meet them at the same step. */
static int try_resume(pt_t *t, int64_t *start, kiln_err_t *err)
{
    char path[SPEC_PATH + 64];
    *start = 0;
    if (!t->o->checkpoint_dir || !*t->o->checkpoint_dir)
        return 0;
    int64_t hdr[2] = {0, 0}; /* rank 0's read status, the step it resumes from (0: none) */
    if (t->rank == 0 && eng_ckpt_find_latest(t->o->checkpoint_dir, path, sizeof(path)) == KILN_OK) {
        eng_ckpt_meta_t meta;
        memset(&meta, 0, sizeof(meta));
        meta.model_hash = t->model_hash;
        hdr[0] = eng_ckpt_read(path, &meta, t->be, t->gpt->p.params, t->m, t->v, t->gpt->p.n, err);
        if (hdr[0] == 0) {
            t->ts.st = meta.train;
            hdr[1] = meta.step;
        }
    }
    int rc;
    if ((rc = comm_bcast(t->world, hdr, sizeof(hdr), 0, err)))
        return rc;
    if (hdr[0] != 0)
        return t->rank == 0 ? (int)hdr[0]
                            : kiln_err_set(err, KILN_EIO, NULL, "rank 0 could not read its checkpoint");
    if (hdr[1] == 0)
        return 0;
    size_t nb = t->gpt->p.n * sizeof(float);
    if ((rc = comm_bcast(t->world, t->gpt->p.params, nb, 0, err)) || (rc = comm_bcast(t->world, t->m, nb, 0, err)) ||
        (rc = comm_bcast(t->world, t->v, nb, 0, err)) ||
        (rc = comm_bcast(t->world, &t->ts.st, sizeof(t->ts.st), 0, err)))
        return rc;
    *start = hdr[1];
    if (t->rank == 0)
        pt_log(t, "resumed from %s at step %lld\n", path, (long long)hdr[1]);
    else
        pt_log(t, "resumed from rank 0's checkpoint at step %lld\n", (long long)hdr[1]);
    return 0;
}

/* ---- one step ---------------------------------------------------------------------------------- */

/* Runs the step's pipeline passes; returns with this stage's gradients accumulated. */
static int run_passes(pt_t *t, const pipe_sched_t *sc, int passes, kiln_err_t *err)
{
    int rc;
    for (t->pass = 0; t->pass < passes; t->pass++)
        if ((rc = pipe_run(sc, &pt_hooks, t, t->trace, err)))
            return rc;
    return 0;
}

/* Rows [*r0, *r1) of wte that stage k's head blocks hold (r0 == r1: none). */
static void head_rows_of(const pt_t *t, int k, int *r0, int *r1)
{
    int first = t->plan.stages[k].first, last = t->plan.stages[k].last, e;
    *r0 = *r1 = 0;
    if (last < t->hf)
        return;
    eng_gpt_head_rows(t->gpt, (first > t->hf ? first : t->hf) - t->hf, r0, &e);
    eng_gpt_head_rows(t->gpt, last - t->hf, &e, r1);
}

/* The tied embedding: wte's gradient is the lookup's (stage 0) plus the LM head's (the stages
 * holding head blocks, each for its rows). Every head stage other than 0 sends its rows to
 * stage 0, which adds them to its own and sends the sums back, so both sides update those rows
 * identically. Only those rows move (a stage holding a slice of a 50k-word head never touches
 * the rest of wte). Within one replica, after the data-parallel averaging. */
static int sum_tied(pt_t *t, kiln_err_t *err)
{
    int rc, r0, r1;
    size_t C = (size_t)t->cfg.n_embd;
    float *g = t->gpt->p.grads + t->gpt->p.tensors[0].off;
    if (t->stage != 0) {
        head_rows_of(t, t->stage, &r0, &r1);
        if (r1 <= r0)
            return 0;
        size_t bytes = (size_t)(r1 - r0) * C * sizeof(float);
        if ((rc = comm_send(t->pipe, g + (size_t)r0 * C, bytes, 0, TAG_TIED, err)))
            return rc;
        return comm_recv(t->pipe, g + (size_t)r0 * C, bytes, 0, TAG_TIED, NULL, err);
    }
    for (int k = 1; k < t->p; k++) {
        head_rows_of(t, k, &r0, &r1);
        if (r1 <= r0)
            continue;
        size_t n = (size_t)(r1 - r0) * C;
        if (!t->tied_buf && !(t->tied_buf = t->mbe->alloc((size_t)t->cfg.padded_vocab_size * C * sizeof(float))))
            return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        if ((rc = comm_recv(t->pipe, t->tied_buf, n * sizeof(float), k, TAG_TIED, NULL, err)))
            return rc;
        t->be->residual_forward(g + (size_t)r0 * C, g + (size_t)r0 * C, t->tied_buf, n);
        if ((rc = comm_send(t->pipe, g + (size_t)r0 * C, n * sizeof(float), k, TAG_TIED, err)))
            return rc;
    }
    return 0;
}

static int reduce_grads(pt_t *t, kiln_err_t *err)
{
    int rc = 0;
    float *g = t->gpt->p.grads;
    if (t->dp_n > 1) {
        comm_req_t *req[MAX_RANGES] = {0};
        for (int i = 0; i < t->nrg && !rc; i++)
            rc = comm_allreduce_start(t->dp, g + t->rg[i].off, t->rg[i].n, COMM_AVG, &req[i], err);
        for (int i = 0; i < t->nrg; i++) {
            int r = comm_wait(req[i], rc ? NULL : err);
            if (!rc)
                rc = r;
        }
        if (rc)
            return rc;
    }
    return sum_tied(t, err);
}

static float evaluate(pt_t *t, kiln_err_t *err)
{
    if (t->val.n < (size_t)t->T + 1)
        return NAN;
    int nb = t->s->hp.eval_batches > 0 ? t->s->hp.eval_batches : 1;
    if (eng_sampler_init(&t->vs, &t->val, t->T, t->B * t->m_mb * t->dp_n, t->replica, t->dp_n, false, 0, err))
        return NAN;
    t->cur = &t->vs;
    t->loss_acc = 0;
    int rc = 0;
    for (int i = 0; i < nb && !rc; i++) {
        eng_sampler_next_step(&t->vs);
        rc = run_passes(t, &t->fsched, 1, err);
    }
    eng_sampler_deinit(&t->vs);
    t->cur = &t->ts;
    float buf[1] = {t->last == t->nb - 1 ? (float)(t->loss_acc / ((double)nb * t->m_mb)) : 0.0f};
    if (rc || comm_allreduce(t->world, buf, 1, COMM_SUM, err))
        return NAN;
    return buf[0] / (float)t->dp_n;
}

static void split2(double x, float *hi, float *lo)
{
    *hi = (float)x;
    *lo = (float)(x - (double)*hi);
}

/* ---- the run ----------------------------------------------------------------------------------- */

static void pt_deinit(pt_t *t)
{
    if (t->gpt) {
        int n_acts = t->ckpt ? 1 : t->n_slots;
        for (int k = 0; t->acts && k < n_acts; k++)
            eng_gpt_acts_destroy(t->gpt, t->acts[k]);
        for (int k = 0; k < t->n_slots; k++) {
            if (t->din)
                t->mbe->free(t->din[k]);
            if (t->xin)
                t->mbe->free(t->xin[k]);
            if (t->xout)
                t->mbe->free(t->xout[k]);
            if (t->act_req)
                comm_wait(t->act_req[k], NULL);
            if (t->grad_req)
                comm_wait(t->grad_req[k], NULL);
        }
        t->mbe->free(t->gbuf);
        t->mbe->free(t->tied_buf);
        t->mbe->free(t->m);
        t->mbe->free(t->v);
        eng_gpt_destroy(t->gpt);
    }
    free(t->acts);
    free(t->xin);
    free(t->xout);
    free(t->din);
    free(t->act_req);
    free(t->grad_req);
    free(t->trace);
    free(t->tok);
    free(t->tgt);
    pipe_sched_deinit(&t->sched);
    pipe_sched_deinit(&t->fsched);
    pipe_plan_deinit(&t->plan);
    eng_tokens_deinit(&t->train);
    eng_tokens_deinit(&t->val);
    eng_sampler_deinit(&t->ts);
    comm_destroy(t->dp);
    comm_destroy(t->pipe);
    if (t->own_world)
        comm_destroy(t->world);
}

void pipe_train_info_deinit(pipe_train_info_t *info)
{
    if (info)
        pipe_plan_deinit(&info->plan);
}

int pipe_train_run(const spec_t *s, const eng_train_opts_t *o, comm_t *world, eng_train_result_t *res,
                   pipe_train_info_t *info, kiln_err_t *err)
{
    pt_t t;
    int rc;
    eng_train_result_t local;
    memset(&t, 0, sizeof(t));
    if (!res)
        res = &local;
    memset(res, 0, sizeof(*res));
    res->last_val_loss = NAN;
    if (info) {
        memset(info, 0, sizeof(*info));
        info->bubble_measured = NAN;
    }
    t.s = s;
    t.o = o;
    t.ckpt = s->dist.activation_checkpointing;
    const spec_hparams_t *hp = &s->hp;
    if (strcmp(s->model.type, "gpt"))
        return kiln_err_set(err, KILN_EINVAL, "distribution.model_parallel.partitions",
                            "pipeline parallelism applies to the gpt model");
    if ((rc = eng_backend_get(spec_device(s), &t.be, err)))
        return rc;
    t.mbe = t.be;
    if (t.be != &eng_cpu_backend && t.be != &eng_ref_backend) {
        /* comm/ moves host memory only; device tensors would need NCCL send/recv */
        rc = kiln_err_set(err, KILN_EUNSUPP, "resources.device",
                          "pipeline parallelism runs on the CPU backend; this job's device is %s", t.be->name);
        kiln_err_hint(err, "set resources.device to \"cpu\", or train without model_parallel.partitions");
        return rc;
    }
    /* host memory: lazily backed allocations, so a rank's resident memory is its stage's */
    t.lazy_be = *t.be;
    t.lazy_be.alloc = lazy_alloc;
    t.lazy_be.free = lazy_free;
    t.mbe = &t.lazy_be;
    t.lazy = true;
    eng_cpu_set_threads(o->threads > 0 ? o->threads : s->res.threads_per_rank);
    if ((rc = setup_grid(&t, world, err)))
        goto done;
    /* batch geometry: per replica G/dp sequences = accum passes x m microbatches x B */
    int G = hp->global_batch_size, per_replica = G / t.dp_n;
    int micro = hp->micro_batch_size > 0 ? hp->micro_batch_size : per_replica;
    t.m_mb = s->dist.mp_microbatches;
    if (G % t.dp_n || per_replica % micro || micro % t.m_mb) {
        rc = kiln_err_set(err, KILN_EINVAL, "distribution.model_parallel.microbatches",
                          "global batch %d does not split into %d replicas x micro batches of %d x %d microbatches",
                          G, t.dp_n, micro, t.m_mb);
        goto done;
    }
    t.accum = per_replica / micro;
    t.B = micro / t.m_mb;
    t.T = s->model.seq_len;
    t.dloss = 1.0f / ((float)t.accum * t.m_mb * (float)t.B * t.T);
    t.cfg = (eng_gpt_config_t){s->model.seq_len, s->model.vocab_size, s->model.padded_vocab_size,
                               s->model.n_layer, s->model.n_head, s->model.n_embd};
    if ((rc = setup_plan(&t, err)) || (rc = setup_model(&t, err)) || (rc = setup_data(&t, err)) ||
        (rc = setup_buffers(&t, err)))
        goto done;
    t.cur = &t.ts;
    int64_t start = 0;
    if ((rc = try_resume(&t, &start, err)))
        goto done;
    release_outside(&t, t.gpt->p.params, t.gpt->p.n);
    release_outside(&t, t.gpt->p.grads, t.gpt->p.n);
    release_outside(&t, t.m, t.gpt->p.n);
    release_outside(&t, t.v, t.gpt->p.n);
    res->start_step = start;
    int64_t max_steps = o->max_steps_override > 0 ? o->max_steps_override : hp->max_steps;
    pt_log(&t, "pipeline: rank %d is stage %d of %d (replica %d of %d): blocks [%d, %d], %d parameter ranges, "
           "%d activation slots of %.1f MiB%s\n", t.rank, t.stage, t.p, t.replica, t.dp_n, t.first, t.last, t.nrg,
           t.n_slots, t.act_set_bytes / MIB, t.ckpt ? " (activation checkpointing: stage inputs only)" : "");
    if (t.rank == 0 && t.dp_n > 1 && s->dist.dp_shard_optimizer_state)
        log_warn("pipeline: distribution.data_parallel.shard_optimizer_state is not supported with partitions > 1; "
                 "each rank keeps its stage's full AdamW state");
    res->losses = calloc((size_t)(max_steps > start ? max_steps - start : 1), sizeof(float));
    if (!res->losses) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto done;
    }
    double items_per_step = (double)G * t.T, step_ms_sum = 0, bubble_sum = 0;
    /* MFU over the whole job: model FLOPs per token against every rank's peak */
    double flops_per_token = eng_gpt_flops_per_token(&t.cfg);
    double peak_flops = (o->peak_gflops > 0 ? o->peak_gflops : eng_measure_peak_gflops()) * 1e9 * t.W;
    int n_timed = 0;
    eng_rng_t sample_rng;
    eng_rng_seed(&sample_rng, hp->seed + 0xabcdefULL); /* as engine/train.c seeds it */
    int64_t step = start;
    while (step < max_steps) {
        step++;
        double t0 = kiln_mono_s();
        for (int i = 0; i < t.nrg; i++)
            t.be->memset_zero(t.gpt->p.grads + t.rg[i].off, t.rg[i].n * sizeof(float));
        eng_sampler_next_step(&t.ts);
        t.loss_acc = 0;
        t.busy = 0;
        double p0 = kiln_mono_s();
        if ((rc = run_passes(&t, &t.sched, t.accum, err)))
            goto done;
        double p1 = kiln_mono_s();
        if (getenv("KILN_PIPE_TRACE") && step == max_steps) {
            /* debugging aid: the last pass's actions with start/end in ms from the step's start */
            fprintf(stderr, "pipe trace stage %d:", t.stage);
            for (int i = 0; i < t.sched.n; i++)
                fprintf(stderr, " %s%d[%.2f,%.2f]", pipe_action_name(t.trace[i].kind), t.trace[i].mb,
                        (t.trace[i].t0 - p0) * 1e3, (t.trace[i].t1 - p0) * 1e3);
            fprintf(stderr, "\n");
        }
        if ((rc = reduce_grads(&t, err)))
            goto done;
        /* one all-reduce of the step's scalars over every rank: the squared-norm partials (the
         * replicas hold identical gradients, so the sum counts each stage dp times), the loss
         * (from each replica's last stage), the stop flag, and each rank's pipeline timing */
        double sumsq = 0;
        for (int i = 0; i < t.nrg; i++)
            if (t.rg[i].in_norm)
                sumsq += t.be->sumsq(t.gpt->p.grads + t.rg[i].off, t.rg[i].n);
        size_t ns = 5 + 5 * (size_t)t.W;
        float *sc = calloc(ns, sizeof(float));
        if (!sc) {
            rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
            goto done;
        }
        split2(sumsq, &sc[0], &sc[1]);
        if (t.last == t.nb - 1)
            split2(t.loss_acc / ((double)t.accum * t.m_mb), &sc[2], &sc[3]);
        sc[4] = o->stop_flag && *o->stop_flag ? 1.0f : 0.0f;
        float *mine = sc + 5 + 5 * (size_t)t.rank;
        mine[0] = (float)t.busy;
        split2(p0, &mine[1], &mine[2]);
        split2(p1, &mine[3], &mine[4]);
        if ((rc = comm_allreduce(t.world, sc, ns, COMM_SUM, err))) {
            free(sc);
            goto done;
        }
        double gsumsq = ((double)sc[0] + sc[1]) / t.dp_n;
        float loss = (float)(((double)sc[2] + sc[3]) / t.dp_n);
        bool stop = sc[4] > 0;
        double busy = 0, tmin = INFINITY, tmax = -INFINITY;
        for (int r = 0; r < t.W; r++) {
            const float *e = sc + 5 + 5 * (size_t)r;
            busy += e[0];
            tmin = fmin(tmin, (double)e[1] + e[2]);
            tmax = fmax(tmax, (double)e[3] + e[4]);
        }
        free(sc);
        double bubble = tmax > tmin ? 1.0 - busy / (t.W * (tmax - tmin)) : 0;
        double norm = sqrt(gsumsq);
        float scale = 1.0f;
        if (hp->grad_clip > 0 && norm > hp->grad_clip)
            scale = (float)(hp->grad_clip / norm);
        double lr = eng_lr_at(step, hp->lr, hp->warmup_steps, max_steps, hp->min_lr_fraction);
        for (int i = 0; i < t.nrg; i++) {
            const prange_t *r = &t.rg[i];
            t.be->adamw_update(t.gpt->p.params + r->off, t.gpt->p.grads + r->off, t.m + r->off, t.v + r->off, r->n,
                               (float)lr, (float)hp->beta1, (float)hp->beta2, (float)hp->eps,
                               r->decay ? (float)hp->weight_decay : 0.0f, scale, step);
        }
        t.be->synchronize();
        double dt = kiln_mono_s() - t0;
        if (step > start + 1 || max_steps - start == 1) {
            step_ms_sum += dt * 1e3;
            bubble_sum += bubble;
            n_timed++;
        }
        res->losses[res->n_losses++] = loss;
        res->last_train_loss = loss;
        res->steps_done = step;
        if (!isfinite(loss)) {
            rc = kiln_err_set(err, KILN_EINTERNAL, NULL, "training diverged: loss is %f at step %lld", loss,
                              (long long)step);
            goto done;
        }
        if (t.rank == 0) {
            double tps = items_per_step / dt, mfu = flops_per_token * tps / peak_flops;
            if (!o->quiet)
                pt_log(&t, "step %lld/%lld | loss %.4f | lr %.1e | norm %.2f | %.1f ms | %.0f tok/s | mfu %.1f%% | "
                       "bubble %.1f%%\n", (long long)step, (long long)max_steps, loss, lr, norm, dt * 1e3, tps,
                       mfu * 100, bubble * 100);
            const char *names[] = {"train_loss", "lr", "grad_norm", "step_time_ms", "tokens_per_s", "mfu",
                                   "peak_mem_mb", "pipeline_bubble"};
            double vals[] = {loss, lr, norm, dt * 1e3, tps, mfu, eng_peak_mem_mb(), bubble};
            metric_record(&t, step, names, vals, 8);
        }
        bool last = step == max_steps;
        if ((hp->eval_every > 0 && step % hp->eval_every == 0) || last) {
            float vl = evaluate(&t, err);
            res->last_val_loss = vl;
            if (t.rank == 0 && isfinite(vl)) {
                pt_log(&t, "step %lld | val loss %.4f\n", (long long)step, vl);
                const char *names[] = {"val_loss"};
                double vals[] = {vl};
                metric_record(&t, step, names, vals, 1);
            }
        }
        if ((hp->sample_every > 0 && step % hp->sample_every == 0) || last)
            sample_text(&t, &sample_rng, step);
        bool periodic = s->ckpt_every_steps > 0 && step % s->ckpt_every_steps == 0;
        if (stop || periodic || last)
            if ((rc = write_checkpoint(&t, step, err)))
                goto done;
        if (stop && !last) {
            res->stopped = true;
            pt_log(&t, "stopping at step %lld on request (checkpoint written)\n", (long long)step);
            break;
        }
    }
    if (!res->stopped && step == max_steps && o->output_dir && *o->output_dir) {
        if ((rc = gather_to_root(&t, t.gpt->p.params, err)))
            goto done;
        if (t.rank == 0) {
            char path[SPEC_PATH + 32];
            kiln_err_t e2;
            kiln_err_clear(&e2);
            snprintf(path, sizeof(path), "%s/model_llmc.bin", o->output_dir);
            if (kiln_mkdirs(o->output_dir, &e2) == 0 && eng_gpt_llmc_write(t.gpt, path, &e2) == 0)
                pt_log(&t, "final model written to %s (llm.c format)\n", path);
            else
                log_warn("could not write the final model: %s", e2.message);
        }
    }
    res->peak_mem_mb = eng_peak_mem_mb();
    if (info) {
        info->stage = t.stage;
        info->replica = t.replica;
        info->n_stages = t.p;
        info->n_replicas = t.dp_n;
        info->peak_live = t.sched.peak_live;
        info->act_bytes_per_set = (double)t.act_set_bytes;
        info->step_ms_mean = n_timed ? step_ms_sum / n_timed : 0;
        info->bubble_measured = n_timed ? bubble_sum / n_timed : NAN;
        if (t.lazy) {
            size_t act_res = 0;
            for (int k = 0; k < (t.ckpt ? 1 : t.n_slots); k++)
                act_res += resident_bytes(t.acts[k]->slab, t.acts[k]->bytes);
            for (int k = 0; t.ckpt && k < t.n_slots; k++)
                act_res += resident_bytes(t.xin[k], bmax(&t) * sizeof(float)) +
                           resident_bytes(t.xout[k], bmax(&t) * sizeof(float));
            info->act_resident_bytes = (double)act_res;
            size_t nb = t.gpt->p.n * sizeof(float);
            info->state_resident_bytes = (double)(resident_bytes(t.gpt->p.params, nb) +
                                                  resident_bytes(t.gpt->p.grads, nb) + resident_bytes(t.m, nb) +
                                                  resident_bytes(t.v, nb));
        }
        pipe_plan_copy(&info->plan, &t.plan);
    }
    if (t.rank == 0)
        pt_log(&t, "done: %lld steps, train loss %.4f, val loss %.4f, peak memory %.1f MB\n", (long long)step,
               res->last_train_loss, res->last_val_loss, res->peak_mem_mb);
    rc = 0;
done:
    pt_deinit(&t);
    if (res == &local)
        free(local.losses);
    return rc;
}
