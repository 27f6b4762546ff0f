/* tune_search.c - the tuning search as pure functions: a trial's parameter values from the seed
 * and its number (random and hyperband draws, grid points), hyperband's rungs, and the decision
 * of one controller pass over a snapshot of the trials (start, promote, stop early by the median
 * rule, end). No I/O: tune.c reads the snapshot and carries the decision out; tests and
 * benchmarks drive these directly. */
#include "service/service.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* splitmix64: a stateless mix, so trial n's draw depends on (seed, n, parameter) only. */
static uint64_t mix(uint64_t x)
{
    x += UINT64_C(0x9e3779b97f4a7c15);
    x = (x ^ (x >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94d049bb133111eb);
    return x ^ (x >> 31);
}

double tune_uniform(uint64_t seed, int trial, int param)
{
    uint64_t h = mix(mix(mix(seed) ^ (uint64_t)(uint32_t)trial) ^ ((uint64_t)(uint32_t)param << 32));
    return (double)(h >> 11) * (1.0 / 9007199254740992.0); /* 53 bits: [0, 1) */
}

/* A continuous parameter's value v as a trial gets it: within [min, max], and rounded to the digits
 * a job's spec keeps (spec_real_round), so the value recorded for the trial is the one it trains
 * with and the one REST and gRPC show. */
static json_t *tune_real(const spec_tune_param_t *p, double v)
{
    v = spec_real_round(v);
    return json_real(v < p->min ? p->min : v > p->max ? p->max : v);
}

json_t *tune_param_value(const spec_tune_param_t *p, double u)
{
    if (p->type == SPEC_TUNE_CATEGORICAL) {
        size_t n = json_array_size(p->values);
        size_t i = (size_t)(u * (double)n);
        return json_incref(json_array_get(p->values, i < n ? i : n - 1));
    }
    double lo = p->min, hi = p->max, v;
    if (p->type == SPEC_TUNE_INTEGER) {
        /* each integer of [min, max] gets the share of the scale its cell [k - 0.5, k + 0.5) has */
        lo = p->scaling == SPEC_TUNE_LOG ? KILN_MAX(p->min - 0.5, p->min * 0.5) : p->min - 0.5;
        hi = p->max + 0.5;
    }
    switch (p->scaling) {
    case SPEC_TUNE_LOG:
        v = exp(log(lo) + u * (log(hi) - log(lo)));
        break;
    case SPEC_TUNE_REVERSE_LOG: /* 1 - v is log-uniform: fine steps near 1 */
        v = 1.0 - exp(log(1.0 - hi) + (1.0 - u) * (log(1.0 - lo) - log(1.0 - hi)));
        break;
    default:
        v = lo + u * (hi - lo);
    }
    if (p->type == SPEC_TUNE_INTEGER) {
        double k = floor(v + 0.5);
        k = k < p->min ? p->min : k > p->max ? p->max : k;
        return json_integer((json_int_t)k);
    }
    return tune_real(p, v);
}

int64_t tune_grid_size(const spec_tuning_t *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->nparams; i++) {
        const spec_tune_param_t *p = &t->params[i];
        int64_t k = p->type == SPEC_TUNE_CATEGORICAL ? (int64_t)json_array_size(p->values)
                    : p->type == SPEC_TUNE_INTEGER   ? (int64_t)(p->max - p->min) + 1
                                                     : 0;
        if (k <= 0 || n > INT64_C(1) << 40)
            return -1;
        n *= k;
    }
    return n;
}

/* Point idx (0 <= idx < tune_grid_size) of t's grid: mixed radix, the last parameter varying
 * fastest. Caller owns it. */
static json_t *grid_point(const spec_tuning_t *t, int64_t idx)
{
    json_t *out = json_object();
    int64_t rest = idx;
    for (int i = t->nparams - 1; out && i >= 0; i--) {
        const spec_tune_param_t *p = &t->params[i];
        int64_t k = p->type == SPEC_TUNE_CATEGORICAL ? (int64_t)json_array_size(p->values) : (int64_t)(p->max - p->min) + 1;
        int64_t d = rest % k;
        rest /= k;
        json_object_set_new(out, p->name, p->type == SPEC_TUNE_CATEGORICAL
                                              ? json_incref(json_array_get(p->values, (size_t)d))
                                              : json_integer((json_int_t)(p->min + (double)d)));
    }
    return out;
}

json_t *tune_trial_values(const spec_tuning_t *t, int trial)
{
    json_t *out = json_object();
    if (!out || trial < 0)
        return out;
    if (t->strategy == SPEC_TUNE_GRID) {
        int64_t size = tune_grid_size(t);
        json_decref(out);
        return size < 0 || trial >= size ? NULL : grid_point(t, trial);
    }
    for (int i = 0; i < t->nparams; i++)
        json_object_set_new(out, t->params[i].name, tune_param_value(&t->params[i], tune_uniform(t->seed, trial, i)));
    return out;
}

int tune_rungs(const spec_tuning_t *t, int64_t *steps)
{
    if (t->strategy != SPEC_TUNE_HYPERBAND)
        return 0;
    /* min_resource x eta^k below max_resource, then max_resource; with max_rungs, the ladder's
     * lowest max_rungs - 1 and max_resource */
    int n = 0, below = t->max_rungs > 0 ? t->max_rungs - 1 : SPEC_TUNE_MAX_RUNGS;
    int64_t r = t->min_resource;
    while (n < below && r < t->max_resource) {
        steps[n++] = r;
        r *= t->reduction_factor;
    }
    if (n < SPEC_TUNE_MAX_RUNGS)
        steps[n++] = t->max_resource;
    return n;
}

/* ---- hyperband's brackets ----------------------------------------------------------------------
 * Bracket b's trials start at rung b (b = 0: the most aggressive) and are ranked only against
 * one another. Bracket b's trial costs, expected, c_b = the sum over its rungs k >= b of
 * (rungs[k] - rungs[k-1]) / eta^(k-b) steps (rungs[b-1] = 0); as in Hyperband, the brackets get
 * equal budgets, so bracket b gets m_b = round(c_last / c_b) trials (at least 1, at most
 * TUNE_BRACKET_SHARE_MAX) in each cycle of sum(m_b) trials, interleaved by a smooth weighted
 * round robin (trial 0 in bracket 0). */
#define TUNE_BRACKET_SHARE_MAX 64

int tune_brackets(const spec_tuning_t *t)
{
    int64_t r[SPEC_TUNE_MAX_RUNGS];
    int nr = tune_rungs(t, r);
    if (nr == 0)
        return 0;
    int nb = t->brackets > 0 ? t->brackets : 1;
    return nb < nr ? nb : nr;
}

int tune_trial_bracket(const spec_tuning_t *t, int trial)
{
    int64_t r[SPEC_TUNE_MAX_RUNGS];
    int nr = tune_rungs(t, r), nb = tune_brackets(t);
    if (nb <= 1 || trial < 0)
        return 0;
    double cost[SPEC_TUNE_MAX_RUNGS];
    int share[SPEC_TUNE_MAX_RUNGS], cycle = 0;
    for (int b = 0; b < nb; b++) {
        double c = 0, keep = 1;
        for (int k = b; k < nr; k++, keep /= t->reduction_factor)
            c += (double)(r[k] - (k > b ? r[k - 1] : 0)) * keep;
        cost[b] = c;
    }
    for (int b = 0; b < nb; b++) {
        double m = floor(cost[nb - 1] / cost[b] + 0.5);
        share[b] = m < 1 ? 1 : m > TUNE_BRACKET_SHARE_MAX ? TUNE_BRACKET_SHARE_MAX : (int)m;
        cycle += share[b];
    }
    /* the place in the cycle, then the smooth weighted round robin up to it */
    int pos = trial % cycle, given[SPEC_TUNE_MAX_RUNGS] = {0}, pick = 0;
    for (int i = 0; i <= pos; i++) {
        pick = 0;
        for (int b = 1; b < nb; b++)
            if ((given[b] + 0.5) / share[b] < (given[pick] + 0.5) / share[pick])
                pick = b;
        given[pick]++;
    }
    return pick;
}

int tune_trial_rungs(const spec_tuning_t *t, int trial, int64_t *steps)
{
    int64_t r[SPEC_TUNE_MAX_RUNGS];
    int nr = tune_rungs(t, r), b = tune_trial_bracket(t, trial);
    for (int k = b; k < nr; k++)
        steps[k - b] = r[k];
    return nr - b;
}

/* Whether a is better than b for the objective's goal. */
static bool better(const spec_tuning_t *t, double a, double b) { return t->maximize ? a > b : a < b; }

/* "trial 3", or "trial 3 of tuning job <id>" for a parent's, into buf. */
static void trial_name(const tune_trial_t *x, char *buf, size_t n)
{
    if (x->parent)
        snprintf(buf, n, "trial %d of tuning job %.40s", x->trial, x->parent);
    else
        snprintf(buf, n, "trial %d", x->trial);
}

/* The index of trial i among those of its bracket that finished their rung k, best first; -1
 * when it did not. *n (OUT) = how many finished it. */
static int rung_rank(const tune_view_t *v, int k, int i, int *n)
{
    int cnt = 0, better_than = 0;
    const tune_trial_t *me = &v->trials[i];
    bool mine = me->nrungs > k;
    for (int j = 0; j < v->ntrials; j++) {
        const tune_trial_t *o = &v->trials[j];
        if (o->nrungs <= k || o->bracket != me->bracket)
            continue;
        cnt++;
        if (mine && j != i
            && (better(v->t, o->rung_objective[k], me->rung_objective[k])
                || (o->rung_objective[k] == me->rung_objective[k] && o->trial < me->trial)))
            better_than++;
    }
    *n = cnt;
    return mine ? better_than : -1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

bool tune_median_stop(const tune_view_t *v, int i, tune_stop_t *out)
{
    const spec_tuning_t *t = v->t;
    const tune_trial_t *me = &v->trials[i];
    if (!t->early_stopping || t->strategy == SPEC_TUNE_HYPERBAND || me->state != TUNE_TRIAL_ACTIVE || me->curve.n == 0)
        return false;
    int64_t s = me->curve.steps[me->curve.n - 1];
    if (s < 1 || (me->total_steps > 0 && s * TUNE_MEDIAN_MIN_PART < me->total_steps))
        return false;
    double best = me->curve.values[0];
    for (int k = 1; k < me->curve.n; k++)
        if (better(t, me->curve.values[k], best))
            best = me->curve.values[k];
    double *avg = malloc(sizeof(double) * (size_t)(v->ntrials ? v->ntrials : 1));
    if (!avg)
        return false;
    int n = 0;
    for (int j = 0; j < v->ntrials; j++) {
        const tune_trial_t *o = &v->trials[j];
        if (j == i || o->state != TUNE_TRIAL_COMPLETED)
            continue;
        double sum = 0;
        int cnt = 0;
        for (int k = 0; k < o->curve.n && o->curve.steps[k] <= s; k++, cnt++)
            sum += o->curve.values[k];
        if (cnt > 0)
            avg[n++] = sum / cnt;
    }
    bool stop = false;
    if (n >= TUNE_MEDIAN_MIN_TRIALS) {
        qsort(avg, (size_t)n, sizeof *avg, cmp_double);
        double median = n % 2 ? avg[n / 2] : (avg[n / 2 - 1] + avg[n / 2]) / 2;
        if (better(t, median, best)) {
            *out = (tune_stop_t){.index = i, .step = s, .best = best, .median = median, .history = n};
            stop = true;
        }
    }
    free(avg);
    return stop;
}

int tune_decide(const tune_view_t *v, tune_plan_t *out)
{
    const spec_tuning_t *t = v->t;
    memset(out, 0, sizeof *out);
    int active = 0, failed = 0;
    /* the objective checked early: a trial that finished a rung (or, without rungs, ended
     * COMPLETED) without reporting it ends the search */
    for (int i = 0; i < v->ntrials; i++) {
        const tune_trial_t *x = &v->trials[i];
        if (x->parent)
            continue; /* a parent's trial is history: its own job judged it */
        if (x->state == TUNE_TRIAL_ACTIVE)
            active++;
        if (x->state == TUNE_TRIAL_FAILED)
            failed++;
        bool due = x->state == TUNE_TRIAL_PAUSED || x->state == TUNE_TRIAL_COMPLETED;
        if (due && !x->has_objective) {
            out->end = TUNE_END_FAILED;
            snprintf(out->reason, sizeof out->reason,
                     "objective metric \"%s\" was not reported by trial %d (job %s), which %s; it reported: %s",
                     t->metric, x->trial, x->job_id ? x->job_id : "?",
                     x->state == TUNE_TRIAL_PAUSED ? "reached its first rung" : "ended",
                     x->reported && x->reported[0] ? x->reported : "no metrics");
            return 0;
        }
    }
    if (failed >= t->max_failed_trials) {
        out->end = TUNE_END_FAILED;
        snprintf(out->reason, sizeof out->reason, "%d trial(s) failed (max_failed_trials is %d)%s%s", failed,
                 t->max_failed_trials, v->last_failure && v->last_failure[0] ? "; the last: " : "",
                 v->last_failure ? v->last_failure : "");
        return 0;
    }
    /* the best so far, over every objective a trial has at its end or its rungs' ends */
    int best = tune_best(v);
    double best_v = best >= 0 ? v->trials[best].objective : 0;
    char best_name[120] = "";
    if (best >= 0)
        trial_name(&v->trials[best], best_name, sizeof best_name);
    out->best = best;
    if (best >= 0 && t->has_target && (best_v == t->target || better(t, best_v, t->target))) {
        out->end = TUNE_END_COMPLETED;
        snprintf(out->reason, sizeof out->reason, "%s reached the target objective: %s = %.6g", best_name, t->metric,
                 best_v);
        return 0;
    }
    if (t->no_improvement_trials > 0) {
        /* in trial order over the ended trials: how many since the best one last improved; the
         * parents' trials (the earlier ones) set the bar but are not counted */
        int since = 0, seen = 0, own = 0;
        double b = 0;
        for (int pass = 0; pass < 2; pass++) {
            for (int i = 0; i < v->ntrials; i++) {
                const tune_trial_t *x = &v->trials[i];
                if ((x->state != TUNE_TRIAL_COMPLETED && x->state != TUNE_TRIAL_STOPPED) || !x->has_objective ||
                    (x->parent != NULL) != (pass == 0))
                    continue;
                own += pass == 1;
                if (seen++ == 0 || better(t, x->objective, b)) {
                    b = x->objective;
                    since = 0;
                } else if (pass == 1) {
                    since++;
                }
            }
        }
        if (own > 0 && since >= t->no_improvement_trials) {
            out->end = TUNE_END_COMPLETED;
            snprintf(out->reason, sizeof out->reason, "no improvement of %s over the last %d trials", t->metric, since);
            return 0;
        }
    }
    int64_t rungs[SPEC_TUNE_MAX_RUNGS];
    int nr = tune_rungs(t, rungs);
    /* the median stopping rule: a stopped trial's slots count until its job has ended */
    for (int i = 0; i < v->ntrials && out->nstop < TUNE_PLAN_MAX; i++)
        if (tune_median_stop(v, i, &out->stop[out->nstop]))
            out->nstop++;
    int room = t->max_parallel_jobs - active;
    /* hyperband (ASHA): from the top rung down, a paused trial in the top 1/eta of its rung so
     * far (in its bracket) is promoted at once */
    if (nr > 0) {
        for (int k = nr - 2; k >= 0 && room > 0; k--) {
            for (int i = 0; i < v->ntrials && room > 0; i++) {
                const tune_trial_t *x = &v->trials[i];
                if (x->state != TUNE_TRIAL_PAUSED || x->nrungs != k + 1)
                    continue;
                int n = 0, r = rung_rank(v, k, i, &n);
                if (r >= 0 && r < n / t->reduction_factor && out->npromote < TUNE_PLAN_MAX) {
                    out->promote[out->npromote++] = i;
                    room--;
                }
            }
        }
    }
    int64_t limit = t->max_jobs;
    if (t->strategy == SPEC_TUNE_GRID) {
        int64_t g = json_array_size(v->tried) ? tune_space_left(t, v->tried) : tune_grid_size(t);
        limit = g >= 0 && g < limit ? g : limit;
    } else if (json_array_size(v->tried) && tune_space_left(t, v->tried) == 0) {
        limit = KILN_MIN(limit, v->next_trial); /* the parents tried every point of the space */
    }
    while (room > 0 && v->next_trial + out->nnew < limit && out->nnew < TUNE_PLAN_MAX) {
        out->nnew++;
        room--;
    }
    /* the end: every trial drawn and none left to run or to promote */
    bool waiting = false;
    for (int i = 0; i < v->ntrials && !waiting; i++)
        waiting = v->trials[i].state == TUNE_TRIAL_ACTIVE;
    if (!waiting && out->npromote == 0 && out->nnew == 0 && v->next_trial >= limit) {
        out->end = TUNE_END_COMPLETED;
        if (best >= 0)
            snprintf(out->reason, sizeof out->reason, "all %d trial(s) ended; the best is %s with %s = %.6g",
                     v->next_trial, best_name, t->metric, best_v);
        else
            snprintf(out->reason, sizeof out->reason, "all %d trial(s) ended", v->next_trial);
    }
    return 0;
}

/* ---- warm start ------------------------------------------------------------------------------- */

/* A configuration's text for comparing: its members sorted, numbers as 17 digits (what a value
 * read back from the database prints as). Caller frees. */
static char *config_key(const json_t *values)
{
    return json_dumps(values, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The tried configurations' keys, sorted, for bsearch. */
typedef struct tried_set {
    char **keys;
    size_t n;
} tried_set_t;

static void tried_free(tried_set_t *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->keys[i]);
    free(s->keys);
    s->keys = NULL;
    s->n = 0;
}

static int tried_build(const json_t *tried, tried_set_t *s)
{
    s->n = 0;
    s->keys = calloc(json_array_size(tried) + 1, sizeof *s->keys);
    if (!s->keys)
        return KILN_ENOMEM;
    size_t i;
    json_t *v;
    json_array_foreach(tried, i, v) {
        if (!(s->keys[s->n] = config_key(v))) {
            tried_free(s);
            return KILN_ENOMEM;
        }
        s->n++;
    }
    qsort(s->keys, s->n, sizeof *s->keys, cmp_str);
    return 0;
}

/* Whether values is one of s's (false when it cannot be encoded: the caller then finds out). */
static bool tried_has(const tried_set_t *s, const json_t *values)
{
    if (s->n == 0)
        return false;
    char *k = config_key(values);
    bool in = k && bsearch(&k, s->keys, s->n, sizeof *s->keys, cmp_str) != NULL;
    free(k);
    return in;
}

int64_t tune_space_left(const spec_tuning_t *t, const json_t *tried)
{
    int64_t size = tune_grid_size(t);
    if (size < 0)
        return -1;
    tried_set_t s;
    if (tried_build(tried, &s))
        return -1;
    /* distinct tried configurations that are points of this grid */
    int64_t in = 0;
    for (size_t i = 0; i < s.n; i++) {
        if (i > 0 && !strcmp(s.keys[i], s.keys[i - 1]))
            continue;
        json_t *v = json_loads(s.keys[i], 0, NULL);
        bool point = json_object_size(v) == (size_t)t->nparams;
        for (int k = 0; point && k < t->nparams; k++) {
            const spec_tune_param_t *p = &t->params[k];
            json_t *x = json_object_get(v, p->name);
            if (p->type == SPEC_TUNE_CATEGORICAL) {
                bool found = false;
                for (size_t m = 0; !found && m < json_array_size(p->values); m++)
                    found = json_equal(x, json_array_get(p->values, m));
                point = found;
            } else {
                point = json_is_integer(x) && (double)json_integer_value(x) >= p->min &&
                        (double)json_integer_value(x) <= p->max;
            }
        }
        json_decref(v);
        in += point;
    }
    tried_free(&s);
    return size - in;
}

/* Trial n's draw number r (r = 0: tune_trial_values' draw). */
static json_t *redraw(const spec_tuning_t *t, int trial, int r)
{
    uint64_t seed = r == 0 ? t->seed : mix(t->seed ^ mix((uint64_t)r));
    json_t *out = json_object();
    for (int i = 0; out && i < t->nparams; i++)
        json_object_set_new(out, t->params[i].name, tune_param_value(&t->params[i], tune_uniform(seed, trial, i)));
    return out;
}

json_t *tune_trial_values_new(const spec_tuning_t *t, int trial, const json_t *tried)
{
    if (json_array_size(tried) == 0 || trial < 0)
        return tune_trial_values(t, trial);
    tried_set_t s;
    if (tried_build(tried, &s))
        return NULL;
    json_t *out = NULL;
    int64_t size = tune_grid_size(t);
    if (t->strategy == SPEC_TUNE_GRID) {
        /* the trial-th point not tried */
        int64_t seen = 0;
        for (int64_t g = 0; g < size && !out; g++) {
            json_t *v = grid_point(t, g);
            if (v && !tried_has(&s, v) && seen++ == trial) {
                out = v;
                break;
            }
            json_decref(v);
        }
        tried_free(&s);
        return out;
    }
    for (int r = 0; r <= TUNE_REDRAWS && !out; r++) {
        json_t *v = redraw(t, trial, r);
        if (v && !tried_has(&s, v))
            out = v;
        else
            json_decref(v);
    }
    if (!out && size > 0) {
        /* a small space nearly all tried: the first untried point from a drawn offset */
        int64_t from = (int64_t)(tune_uniform(t->seed, trial, SPEC_TUNE_MAX_PARAMS) * (double)size);
        for (int64_t k = 0; k < size && !out; k++) {
            json_t *v = grid_point(t, (from + k) % size);
            if (v && !tried_has(&s, v))
                out = v;
            else
                json_decref(v);
        }
    }
    tried_free(&s);
    return out;
}

int tune_best(const tune_view_t *v)
{
    int best = -1;
    for (int i = 0; i < v->ntrials; i++) {
        const tune_trial_t *x = &v->trials[i];
        if (!x->has_objective || x->state == TUNE_TRIAL_FAILED)
            continue;
        const tune_trial_t *b = best >= 0 ? &v->trials[best] : NULL;
        if (!b || better(v->t, x->objective, b->objective) || (x->objective == b->objective && x->parent && !b->parent))
            best = i;
    }
    return best;
}

/* ---- TPE: the Tree-structured Parzen Estimator (Bergstra et al., NeurIPS 2011) -----------------
 * As Optuna's TPESampler does it by default (univariate): per parameter, in its own scale (log
 * for log, log(1 - v) for reverse_log, integers continuous over their cells then rounded), the
 * observations are split into the gamma(n) = min(ceil(n / 10), 25) best, whose Parzen estimator
 * is l(x), and the rest, g(x); each estimator is a mixture of truncated normals, one at each
 * observation (the bandwidth the larger distance to its neighbours, clipped to [range / min(100,
 * components), range]) plus a prior (the range's middle, bandwidth the range, weight 1), the
 * observations weighted 1 each up to 25 of them, the older ones ramped down past that.
 * Categorical parameters: each observation a row of smoothed counts (prior weight 1). The value
 * is the candidate, of TUNE_TPE_CANDIDATES drawn from l, with the largest l(x) / g(x). Random
 * numbers come from (seed, trial) alone, so a trial's values are a pure function of the request,
 * its number and the history. */

#define TPE_PRIOR_WEIGHT 1.0
#define TPE_FLAT_WEIGHTS 25

/* A uniform number for trial n's TPE draw k of parameter i: a stream apart from random's. */
static double tpe_uniform(uint64_t seed, int trial, int param, int k)
{
    return tune_uniform(mix(seed ^ UINT64_C(0x7470652d7470652d)), trial, (param + 1) * 4096 + k);
}

/* The standard normal's lower tail P(Z < z). */
static double phi_cdf(double z) { return 0.5 * erfc(-z / M_SQRT2); }

/* log of P(a < Z < b), a < b, computed on the side of 0 where it keeps its precision. */
static double log_gauss_mass(double a, double b)
{
    double m = a >= 0 ? phi_cdf(-a) - phi_cdf(-b) : b <= 0 ? phi_cdf(b) - phi_cdf(a) : 1.0 - phi_cdf(a) - phi_cdf(-b);
    return log(m > 1e-300 ? m : 1e-300);
}

/* A draw from N(0, 1) truncated to (a, b) for u in [0, 1), by inverting its distribution. */
static double truncnorm_draw(double a, double b, double u)
{
    if (a >= 0) /* the upper tail: mirrored, where the lower tail's cdf is precise */
        return -truncnorm_draw(-b, -a, 1.0 - u);
    double pa = phi_cdf(a), pb = phi_cdf(b);
    if (!(pb - pa > 1e-14))
        return a + u * (b - a);
    double target = pa + u * (pb - pa), lo = a, hi = b;
    for (int i = 0; i < 80; i++) {
        double mid = 0.5 * (lo + hi);
        if (phi_cdf(mid) < target)
            lo = mid;
        else
            hi = mid;
    }
    return 0.5 * (lo + hi);
}

/* One parameter's Parzen estimator over the internal scale [lo, hi]: n components (the
 * observations, then the prior), weights summing to 1. */
typedef struct parzen {
    int n;
    double *w, *mu, *sigma;           /* numerical */
    double *cat;                      /* categorical: n rows of k probabilities */
    int k;
    double lo, hi;
} parzen_t;

static void parzen_free(parzen_t *pz)
{
    free(pz->w);
    free(pz->mu);
    free(pz->sigma);
    free(pz->cat);
}

/* Optuna's default_weights: 1 each up to TPE_FLAT_WEIGHTS; past that the newest 25 get 1, the
 * older ones a ramp from 1/n up (xs in age order, oldest first). */
static double tpe_weight(int i, int n)
{
    if (n <= TPE_FLAT_WEIGHTS || i >= n - TPE_FLAT_WEIGHTS)
        return 1.0;
    int m = n - TPE_FLAT_WEIGHTS;
    return m == 1 ? 1.0 / n : 1.0 / n + (1.0 - 1.0 / n) * (double)i / (double)(m - 1);
}

/* Sorts the indexes idx[0..n) by before(ctx, a, b) (a goes first), stably: an insertion sort
 * with a context (qsort has none, and the controller may run on several threads). */
static void sort_idx(int *idx, int n, bool (*before)(const void *ctx, int a, int b), const void *ctx)
{
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0 && before(ctx, idx[b], idx[b - 1]); b--) {
            int tmp = idx[b];
            idx[b] = idx[b - 1];
            idx[b - 1] = tmp;
        }
}

static bool by_value(const void *ctx, int a, int b) { return ((const double *)ctx)[a] < ((const double *)ctx)[b]; }
static bool by_index(const void *ctx, int a, int b)
{
    (void)ctx;
    return a < b;
}

/* Builds pz from the n observations xs (internal scale, or category indexes) in age order. */
static int parzen_build(parzen_t *pz, const spec_tune_param_t *p, double lo, double hi, const double *xs, int n)
{
    memset(pz, 0, sizeof *pz);
    pz->n = n + 1;
    pz->lo = lo;
    pz->hi = hi;
    pz->w = malloc(sizeof(double) * (size_t)pz->n);
    if (!pz->w)
        return KILN_ENOMEM;
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += pz->w[i] = tpe_weight(i, n);
    sum += pz->w[n] = TPE_PRIOR_WEIGHT;
    for (int i = 0; i <= n; i++)
        pz->w[i] /= sum;
    if (p->type == SPEC_TUNE_CATEGORICAL) {
        pz->k = (int)json_array_size(p->values);
        pz->cat = malloc(sizeof(double) * (size_t)pz->n * (size_t)pz->k);
        if (!pz->cat)
            return KILN_ENOMEM;
        double base = TPE_PRIOR_WEIGHT / (n + 1);
        for (int i = 0; i <= n; i++) {
            double rs = 0;
            for (int c = 0; c < pz->k; c++)
                rs += pz->cat[i * pz->k + c] = base + (i < n && (int)xs[i] == c ? 1.0 : 0.0);
            for (int c = 0; c < pz->k; c++)
                pz->cat[i * pz->k + c] /= rs;
        }
        return 0;
    }
    pz->mu = malloc(sizeof(double) * (size_t)pz->n);
    pz->sigma = malloc(sizeof(double) * (size_t)pz->n);
    int *order = malloc(sizeof(int) * (size_t)pz->n);
    if (!pz->mu || !pz->sigma || !order) {
        free(order);
        return KILN_ENOMEM;
    }
    for (int i = 0; i < n; i++)
        pz->mu[i] = xs[i];
    pz->mu[n] = 0.5 * (lo + hi);
    /* the bandwidth: the larger gap to a neighbour among the sorted means (the range's ends the
     * outer neighbours), the first and last taking their inner gap (consider_endpoints off) */
    int m = pz->n;
    for (int i = 0; i < m; i++)
        order[i] = i;
    sort_idx(order, m, by_value, pz->mu);
    for (int r = 0; r < m; r++) {
        double left = pz->mu[order[r]] - (r > 0 ? pz->mu[order[r - 1]] : lo);
        double right = (r + 1 < m ? pz->mu[order[r + 1]] : hi) - pz->mu[order[r]];
        double s = left > right ? left : right;
        if (m >= 2 && r == 0)
            s = pz->mu[order[1]] - pz->mu[order[0]];
        if (m >= 2 && r == m - 1)
            s = pz->mu[order[m - 1]] - pz->mu[order[m - 2]];
        pz->sigma[order[r]] = s;
    }
    free(order);
    double minsigma = (hi - lo) / KILN_MIN(100.0, 1.0 + m), maxsigma = hi - lo;
    for (int i = 0; i < m; i++)
        pz->sigma[i] = pz->sigma[i] < minsigma ? minsigma : pz->sigma[i] > maxsigma ? maxsigma : pz->sigma[i];
    pz->sigma[n] = hi - lo;
    return 0;
}

/* log of pz's density at x (a category index for categorical). */
static double parzen_log_pdf(const parzen_t *pz, double x)
{
    if (pz->cat) {
        double s = 0;
        for (int i = 0; i < pz->n; i++)
            s += pz->w[i] * pz->cat[i * pz->k + (int)x];
        return log(s > 1e-300 ? s : 1e-300);
    }
    double best = -INFINITY, *lp = malloc(sizeof(double) * (size_t)pz->n);
    if (!lp)
        return 0;
    for (int i = 0; i < pz->n; i++) {
        double z = (x - pz->mu[i]) / pz->sigma[i];
        lp[i] = log(pz->w[i]) - 0.5 * z * z - log(pz->sigma[i] * sqrt(2 * M_PI)) -
                log_gauss_mass((pz->lo - pz->mu[i]) / pz->sigma[i], (pz->hi - pz->mu[i]) / pz->sigma[i]);
        best = lp[i] > best ? lp[i] : best;
    }
    double s = 0;
    for (int i = 0; i < pz->n; i++)
        s += exp(lp[i] - best);
    free(lp);
    return best + log(s);
}

/* A draw from pz with the uniforms u1 (which component) and u2 (where in it). */
static double parzen_draw(const parzen_t *pz, double u1, double u2)
{
    int c = pz->n - 1;
    double acc = 0;
    for (int i = 0; i < pz->n; i++)
        if ((acc += pz->w[i]) > u1) {
            c = i;
            break;
        }
    if (pz->cat) {
        acc = 0;
        for (int k = 0; k < pz->k; k++)
            if ((acc += pz->cat[c * pz->k + k]) > u2)
                return k;
        return pz->k - 1;
    }
    double mu = pz->mu[c], s = pz->sigma[c];
    double x = mu + s * truncnorm_draw((pz->lo - mu) / s, (pz->hi - mu) / s, u2);
    return x < pz->lo ? pz->lo : x > pz->hi ? pz->hi : x;
}

/* p's internal scale: [*lo, *hi], as tune_param_value maps the uniform draw. */
static void tpe_bounds(const spec_tune_param_t *p, double *lo, double *hi)
{
    double a = p->min, b = p->max;
    if (p->type == SPEC_TUNE_INTEGER) {
        a = p->scaling == SPEC_TUNE_LOG ? KILN_MAX(p->min - 0.5, p->min * 0.5) : p->min - 0.5;
        b = p->max + 0.5;
    }
    if (p->scaling == SPEC_TUNE_LOG) {
        *lo = log(a);
        *hi = log(b);
    } else if (p->scaling == SPEC_TUNE_REVERSE_LOG) { /* log(1 - v): decreasing in v */
        *lo = log(1.0 - b);
        *hi = log(1.0 - a);
    } else {
        *lo = a;
        *hi = b;
    }
}

/* The observation v of p on its internal scale into *x; false when v is not one of p's values. */
static bool tpe_to_internal(const spec_tune_param_t *p, const json_t *v, double *x)
{
    if (p->type == SPEC_TUNE_CATEGORICAL) {
        for (size_t k = 0; k < json_array_size(p->values); k++)
            if (json_equal(json_array_get(p->values, k), (json_t *)v)) {
                *x = (double)k;
                return true;
            }
        return false;
    }
    if (!json_is_number(v))
        return false;
    double d = json_number_value(v);
    if (!(d >= p->min && d <= p->max))
        return false;
    *x = p->scaling == SPEC_TUNE_LOG ? log(d) : p->scaling == SPEC_TUNE_REVERSE_LOG ? log(1.0 - d) : d;
    return true;
}

/* The internal x of p as its value (caller owns it). */
static json_t *tpe_from_internal(const spec_tune_param_t *p, double x)
{
    if (p->type == SPEC_TUNE_CATEGORICAL)
        return json_incref(json_array_get(p->values, (size_t)x));
    double v = p->scaling == SPEC_TUNE_LOG ? exp(x) : p->scaling == SPEC_TUNE_REVERSE_LOG ? 1.0 - exp(x) : x;
    if (p->type == SPEC_TUNE_INTEGER) {
        double k = floor(v + 0.5);
        return json_integer((json_int_t)(k < p->min ? p->min : k > p->max ? p->max : k));
    }
    return tune_real(p, v);
}

/* Best first: full observations before partial ones, then the higher rung first, then by objective
 * (t's goal). */
typedef struct obs_rank {
    const tune_obs_t *obs;
    bool maximize;
} obs_rank_t;

static bool obs_before(const void *ctx, int i, int j)
{
    const obs_rank_t *r = ctx;
    const tune_obs_t *x = &r->obs[i], *y = &r->obs[j];
    if (x->partial != y->partial)
        return !x->partial;
    if (x->rung != y->rung)
        return x->rung > y->rung;
    return r->maximize ? x->objective > y->objective : x->objective < y->objective;
}

/* Parameter i's TPE value for trial n over the observations idx[0..m) (best first; the first
 * `below` of them form l). Caller owns it; NULL when out of memory. */
static json_t *tpe_param(const spec_tuning_t *t, int trial, int i, const tune_obs_t *obs, const int *idx, int m,
                         int below)
{
    const spec_tune_param_t *p = &t->params[i];
    double lo = 0, hi = 0, *xl = malloc(sizeof(double) * (size_t)(m + 1)), *xg = malloc(sizeof(double) * (size_t)(m + 1));
    int *age = malloc(sizeof(int) * (size_t)(m + 1));
    json_t *out = NULL;
    parzen_t l = {0}, g = {0};
    if (!xl || !xg || !age)
        goto done;
    if (p->type != SPEC_TUNE_CATEGORICAL)
        tpe_bounds(p, &lo, &hi);
    /* each side in age order (the observations' order in obs) for the weights */
    int nl = 0, ng = 0;
    for (int pass = 0; pass < 2; pass++) {
        int c = 0;
        for (int r = pass ? below : 0; r < (pass ? m : below); r++)
            age[c++] = idx[r];
        sort_idx(age, c, by_index, NULL);
        for (int a = 0; a < c; a++) {
            double x = 0;
            tpe_to_internal(p, json_object_get(obs[age[a]].values, p->name), &x);
            (pass ? xg : xl)[a] = x;
        }
        *(pass ? &ng : &nl) = c;
    }
    if (parzen_build(&l, p, lo, hi, xl, nl) || parzen_build(&g, p, lo, hi, xg, ng))
        goto done;
    double best_x = 0, best_score = -INFINITY;
    for (int k = 0; k < TUNE_TPE_CANDIDATES; k++) {
        double x = parzen_draw(&l, tpe_uniform(t->seed, trial, i, 2 * k), tpe_uniform(t->seed, trial, i, 2 * k + 1));
        double score = parzen_log_pdf(&l, x) - parzen_log_pdf(&g, x);
        if (score > best_score) {
            best_score = score;
            best_x = x;
        }
    }
    out = tpe_from_internal(p, best_x);
done:
    parzen_free(&l);
    parzen_free(&g);
    free(xl);
    free(xg);
    free(age);
    return out;
}

json_t *tune_tpe_values(const spec_tuning_t *t, int trial, const tune_obs_t *obs, int nobs)
{
    json_t *out = json_object();
    int *idx = malloc(sizeof(int) * (size_t)(nobs + 1));
    if (!out || !idx || trial < 0)
        goto fail;
    for (int i = 0; i < t->nparams; i++) {
        /* the observations that have a value of this parameter (a transfer-learning parent's
         * may not), best first */
        const spec_tune_param_t *p = &t->params[i];
        int m = 0;
        for (int k = 0; k < nobs; k++) {
            double x;
            if (isfinite(obs[k].objective) && tpe_to_internal(p, json_object_get(obs[k].values, p->name), &x))
                idx[m++] = k;
        }
        json_t *v;
        if (m < TUNE_TPE_STARTUP) {
            v = tune_param_value(p, tune_uniform(t->seed, trial, i));
        } else {
            obs_rank_t r = {obs, t->maximize};
            sort_idx(idx, m, obs_before, &r);
            int below = (m + 9) / 10;
            v = tpe_param(t, trial, i, obs, idx, m, below < 25 ? below : 25);
        }
        if (!v || json_object_set_new(out, p->name, v))
            goto fail;
    }
    free(idx);
    return out;
fail:
    free(idx);
    json_decref(out);
    return NULL;
}

int tune_tpe_history(const tune_view_t *v, tune_obs_t *out)
{
    const spec_tuning_t *t = v->t;
    int n = 0;
    if (t->strategy == SPEC_TUNE_BAYESIAN) {
        for (int i = 0; i < v->ntrials; i++) {
            const tune_trial_t *x = &v->trials[i];
            if (!x->values || !x->has_objective ||
                (x->state != TUNE_TRIAL_COMPLETED && x->state != TUNE_TRIAL_STOPPED))
                continue;
            out[n++] = (tune_obs_t){.values = x->values, .objective = x->objective,
                                    .partial = x->state == TUNE_TRIAL_STOPPED};
        }
        return n;
    }
    if (t->strategy != SPEC_TUNE_HYPERBAND || t->sampler != SPEC_TUNE_SAMPLER_TPE)
        return 0;
    /* as Optuna's TPE under its Hyperband pruner: every trial that got a result, at the highest
     * rung it finished (the global rung: a later bracket starts higher), ranked by that rung
     * then by its objective there */
    int64_t rungs[SPEC_TUNE_MAX_RUNGS];
    int nr = tune_rungs(t, rungs);
    for (int i = 0; i < v->ntrials; i++) {
        const tune_trial_t *x = &v->trials[i];
        int own = nr - x->bracket; /* its own rungs */
        if (!x->values || x->state == TUNE_TRIAL_FAILED)
            continue;
        if (x->state == TUNE_TRIAL_COMPLETED && x->has_objective && (!x->parent || x->nrungs >= own - 1))
            out[n++] = (tune_obs_t){.values = x->values, .objective = x->objective, .rung = nr - 1};
        else if (x->nrungs > 0)
            out[n++] = (tune_obs_t){.values = x->values, .objective = x->rung_objective[x->nrungs - 1],
                                    .partial = true, .rung = x->bracket + x->nrungs - 1};
    }
    return n;
}

json_t *tune_next_values(const tune_view_t *v, int trial)
{
    const spec_tuning_t *t = v->t;
    bool tpe = t->strategy == SPEC_TUNE_BAYESIAN || (t->strategy == SPEC_TUNE_HYPERBAND && t->sampler == SPEC_TUNE_SAMPLER_TPE);
    if (!tpe || trial < 0)
        return tune_trial_values_new(t, trial, v->tried);
    tune_obs_t *obs = malloc(sizeof *obs * (size_t)(v->ntrials + 1));
    if (!obs)
        return NULL;
    int n = tune_tpe_history(v, obs);
    json_t *out = n >= TUNE_TPE_STARTUP ? tune_tpe_values(t, trial, obs, n) : NULL;
    free(obs);
    if (out && json_array_size(v->tried)) {
        /* a parent ran this configuration: drawn as random search would instead */
        tried_set_t s;
        if (tried_build(v->tried, &s)) {
            json_decref(out);
            return NULL;
        }
        if (tried_has(&s, out)) {
            json_decref(out);
            out = NULL;
        }
        tried_free(&s);
    }
    return out ? out : tune_trial_values_new(t, trial, v->tried);
}
