/* partition.c - automatic partitioning: contiguous stage boundaries for a sequence of profiled
 * blocks, exact (dynamic programming over the stage index and the end of its block range).
 * It does not profile (profile.c does) and knows nothing of the model behind the blocks. */
#include "engine/pipe/pipe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1024.0 * 1024.0)

const char *pipe_optimize_name(pipe_optimize_t o) { return o == PIPE_OPT_MEMORY ? "memory" : "speed"; }
const char *pipe_sched_name(pipe_sched_kind_t k)
{
    return k == PIPE_SCHED_SIMPLE ? "simple" : k == PIPE_SCHED_FORWARD ? "forward" : "interleaved";
}

int pipe_optimize_parse(const char *s, pipe_optimize_t *out)
{
    if (s && !strcmp(s, "speed")) { *out = PIPE_OPT_SPEED; return 0; }
    if (s && !strcmp(s, "memory")) { *out = PIPE_OPT_MEMORY; return 0; }
    return KILN_EINVAL;
}

int pipe_sched_parse(const char *s, pipe_sched_kind_t *out)
{
    if (s && !strcmp(s, "simple")) { *out = PIPE_SCHED_SIMPLE; return 0; }
    if (s && !strcmp(s, "interleaved")) { *out = PIPE_SCHED_INTERLEAVED; return 0; }
    return KILN_EINVAL;
}

int pipe_sched_live_acts(pipe_sched_kind_t k, int stage, int n_stages, int m)
{
    if (k == PIPE_SCHED_SIMPLE)
        return m;
    if (k == PIPE_SCHED_FORWARD)
        return 1;
    int d = n_stages - stage;
    return d < m ? d : m;
}

size_t pipe_stage_mem(const pipe_block_profile_t *prof, int first, int last, int stage,
                      const pipe_partition_opts_t *opts)
{
    size_t fixed = 0, act = 0;
    for (int b = first; b <= last; b++) {
        fixed += 2 * prof[b].param_bytes + prof[b].opt_bytes;
        act += prof[b].act_bytes_per_mb;
    }
    size_t live = (size_t)pipe_sched_live_acts(opts->schedule, stage, opts->n_stages, opts->microbatches);
    return opts->rank_overhead_bytes + fixed + act * live;
}

double pipe_stage_time(const pipe_block_profile_t *prof, int first, int last)
{
    double t = 0;
    for (int b = first; b <= last; b++)
        t += prof[b].fwd_ms + prof[b].bwd_ms;
    return t;
}

/* Inputs of one DP pass over n blocks and p stages. time[i*n + j] is the time of blocks i..j
 * (computed by the same additions as pipe_stage_time, so comparisons between passes are exact);
 * memory is recomputed from prefix sums (integers, exact). */
typedef struct dp_ctx {
    const pipe_block_profile_t *prof;
    const pipe_partition_opts_t *opts;
    int n, p;
    const double *time;     /* (n, n) upper triangle */
    const size_t *fixed_ps; /* (n+1) prefix sums of 2 x params + optimizer state */
    const size_t *act_ps;   /* (n+1) prefix sums of activation bytes per microbatch */
} dp_ctx_t;

static double stage_time_dp(const dp_ctx_t *c, int i, int j) { return c->time[(size_t)i * c->n + j]; }

static double stage_mem_dp(const dp_ctx_t *c, int k, int i, int j)
{
    size_t live = (size_t)pipe_sched_live_acts(c->opts->schedule, k, c->p, c->opts->microbatches);
    size_t fixed = c->fixed_ps[j + 1] - c->fixed_ps[i], act = c->act_ps[j + 1] - c->act_ps[i];
    return (double)(c->opts->rank_overhead_bytes + fixed + live * act);
}

typedef enum {
    OBJ_MAX_TIME,  /* the slowest stage */
    OBJ_MAX_MEM,   /* the largest stage */
    OBJ_SUMSQ_TIME /* sum of squared stage times: spreads what the bottleneck leaves evenly */
} dp_obj_t;

/* Minimises the objective over splits subject to each stage's memory <= mem_cap and time <=
 * time_cap (either may be INFINITY). On success returns the optimum and writes the stage starts
 * into starts (p entries; starts[0] = 0); returns INFINITY when nothing is feasible. best/arg
 * are scratch of p x (n+1). */
static double dp_solve(const dp_ctx_t *c, dp_obj_t obj, double mem_cap, double time_cap,
                       double *best, int *arg, int *starts)
{
    int n = c->n, p = c->p;
    size_t W = (size_t)n + 1;
    for (size_t x = 0; x < (size_t)p * W; x++) {
        best[x] = INFINITY;
        arg[x] = -1;
    }
    /* best[k*W + j]: optimum for blocks 0..j-1 in stages 0..k (stage k ends at block j-1). */
    for (int k = 0; k < p; k++) {
        int jmin = k + 1, jmax = n - (p - 1 - k);
        for (int j = jmin; j <= jmax; j++) {
            int imin = k, imax = j - 1;
            if (k == 0)
                imin = imax = 0;
            for (int i = imin; i <= imax; i++) {
                double prev = k ? best[(size_t)(k - 1) * W + i] : 0.0;
                if (prev == INFINITY)
                    continue;
                double t = stage_time_dp(c, i, j - 1), m = stage_mem_dp(c, k, i, j - 1);
                if (m > mem_cap || t > time_cap)
                    continue;
                double cand;
                if (obj == OBJ_SUMSQ_TIME) {
                    cand = prev + t * t;
                } else {
                    double v = obj == OBJ_MAX_TIME ? t : m;
                    cand = prev > v ? prev : v;
                }
                if (cand < best[(size_t)k * W + j]) {
                    best[(size_t)k * W + j] = cand;
                    arg[(size_t)k * W + j] = i;
                }
            }
        }
    }
    double opt = best[(size_t)(p - 1) * W + n];
    if (opt == INFINITY)
        return INFINITY;
    int j = n;
    for (int k = p - 1; k >= 0; k--) {
        int i = arg[(size_t)k * W + j];
        starts[k] = i;
        j = i;
    }
    return opt;
}

void pipe_plan_predict(pipe_plan_t *plan, const pipe_block_profile_t *prof, const pipe_partition_opts_t *opts)
{
    pipe_partition_opts_t o = {0};
    if (opts)
        o = *opts;
    o.n_stages = plan->n_stages;
    o.microbatches = plan->microbatches;
    o.optimize = plan->optimize;
    o.schedule = plan->schedule;
    double tmax = 0, tsum = 0;
    for (int s = 0; s < plan->n_stages; s++) {
        pipe_stage_t *st = &plan->stages[s];
        double t = pipe_stage_time(prof, st->first, st->last);
        st->predicted_ms = t * plan->microbatches;
        st->predicted_mem_mb = (double)pipe_stage_mem(prof, st->first, st->last, s, &o) / MIB;
        tsum += t;
        if (t > tmax)
            tmax = t;
    }
    plan->balance = tsum > 0 ? tmax / (tsum / plan->n_stages) : 1.0;
    plan->memory_limit_mb = (double)o.mem_limit_bytes / MIB;
}

int pipe_partition(const pipe_block_profile_t *prof, int n, const pipe_partition_opts_t *opts,
                   pipe_plan_t *out, kiln_err_t *err)
{
    double *time = NULL, *best = NULL;
    size_t *fixed_ps = NULL, *act_ps = NULL;
    int *arg = NULL, *starts = NULL;
    int rc = 0;
    pipe_plan_init(out);
    if (!prof || n <= 0 || !opts || opts->n_stages < 1 || opts->microbatches < 1 ||
        (opts->schedule != PIPE_SCHED_SIMPLE && opts->schedule != PIPE_SCHED_INTERLEAVED))
        return kiln_err_set(err, KILN_EINVAL, NULL, "partitioning needs at least one block, stage and microbatch");
    int p = opts->n_stages;
    if (p > n)
        return kiln_err_set(err, KILN_EINVAL, "distribution.model_parallel.partitions",
                            "cannot cut %d blocks into %d stages: every stage needs at least one block", n, p);
    time = malloc(sizeof(double) * (size_t)n * (size_t)n);
    fixed_ps = calloc((size_t)n + 1, sizeof(size_t));
    act_ps = calloc((size_t)n + 1, sizeof(size_t));
    best = malloc(sizeof(double) * (size_t)p * ((size_t)n + 1));
    arg = malloc(sizeof(int) * (size_t)p * ((size_t)n + 1));
    starts = malloc(sizeof(int) * (size_t)p);
    if (!time || !fixed_ps || !act_ps || !best || !arg || !starts) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory while partitioning %d blocks", n);
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        double t = 0;
        for (int j = i; j < n; j++) {
            t += prof[j].fwd_ms + prof[j].bwd_ms;
            time[(size_t)i * n + j] = t;
        }
        fixed_ps[i + 1] = fixed_ps[i] + 2 * prof[i].param_bytes + prof[i].opt_bytes;
        act_ps[i + 1] = act_ps[i] + prof[i].act_bytes_per_mb;
    }
    dp_ctx_t c = {.prof = prof, .opts = opts, .n = n, .p = p, .time = time,
                  .fixed_ps = fixed_ps, .act_ps = act_ps};
    double cap = opts->mem_limit_bytes ? (double)opts->mem_limit_bytes : INFINITY;
    /* The smallest achievable largest stage, with no limit: the fit test and the error's figure. */
    double min_mem = dp_solve(&c, OBJ_MAX_MEM, INFINITY, INFINITY, best, arg, starts);
    if (min_mem > cap) {
        rc = kiln_err_set(err, KILN_EUNFIT, "resources.memory_limit_mb",
                          "model does not fit: the smallest possible stage needs %.1f MiB, limit %.1f MiB; "
                          "use more partitions or a larger memory limit", min_mem / MIB, cap / MIB);
        kiln_err_hint(err, "with %d partitions and %d microbatches (%s schedule); the interleaved schedule keeps "
                      "fewer activations", p, opts->microbatches, pipe_sched_name(opts->schedule));
        goto fail;
    }
    /* Lexicographic: the primary objective, then the other one among the primary's optima, then
     * the most even spread of time among what is left (only the split changes, not the two
     * maxima). Caps compare the same sums the passes computed, so equality is exact. */
    double tcap, mcap;
    if (opts->optimize == PIPE_OPT_SPEED) {
        tcap = dp_solve(&c, OBJ_MAX_TIME, cap, INFINITY, best, arg, starts);
        mcap = dp_solve(&c, OBJ_MAX_MEM, cap, tcap, best, arg, starts);
    } else {
        mcap = min_mem;
        tcap = dp_solve(&c, OBJ_MAX_TIME, mcap, INFINITY, best, arg, starts);
    }
    dp_solve(&c, OBJ_SUMSQ_TIME, mcap, tcap, best, arg, starts);
    out->stages = calloc((size_t)p, sizeof(pipe_stage_t));
    if (!out->stages) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto fail;
    }
    out->n_stages = p;
    out->n_blocks = n;
    out->optimize = opts->optimize;
    out->schedule = opts->schedule;
    out->microbatches = opts->microbatches;
    for (int k = 0; k < p; k++) {
        out->stages[k].first = starts[k];
        out->stages[k].last = (k + 1 < p ? starts[k + 1] : n) - 1;
    }
    pipe_plan_predict(out, prof, opts);
    if ((rc = pipe_plan_simulate(out, prof, err)))
        pipe_plan_deinit(out);
fail:
    free(time);
    free(fixed_ps);
    free(act_ps);
    free(best);
    free(arg);
    free(starts);
    return rc;
}
