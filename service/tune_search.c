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
    v = v < p->min ? p->min : v > p->max ? p->max : v;
    return json_real(v);
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

json_t *tune_trial_values(const spec_tuning_t *t, int trial)
{
    json_t *out = json_object();
    if (!out || trial < 0)
        return out;
    if (t->strategy == SPEC_TUNE_GRID) {
        int64_t size = tune_grid_size(t);
        if (size < 0 || trial >= size) {
            json_decref(out);
            return NULL;
        }
        /* mixed radix, the last parameter varying fastest */
        int64_t rest = trial;
        for (int i = t->nparams - 1; i >= 0; i--) {
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
    for (int i = 0; i < t->nparams; i++)
        json_object_set_new(out, t->params[i].name, tune_param_value(&t->params[i], tune_uniform(t->seed, trial, i)));
    return out;
}

int tune_rungs(const spec_tuning_t *t, int64_t *steps)
{
    if (t->strategy != SPEC_TUNE_HYPERBAND)
        return 0;
    int n = 0;
    int64_t r = t->min_resource;
    while (n < SPEC_TUNE_MAX_RUNGS && r < t->max_resource) {
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
    int best = -1;
    double best_v = 0;
    for (int i = 0; i < v->ntrials; i++) {
        const tune_trial_t *x = &v->trials[i];
        if (!x->has_objective || x->state == TUNE_TRIAL_FAILED)
            continue;
        if (best < 0 || better(t, x->objective, best_v)) {
            best = i;
            best_v = x->objective;
        }
    }
    out->best = best;
    if (best >= 0 && t->has_target && (best_v == t->target || better(t, best_v, t->target))) {
        out->end = TUNE_END_COMPLETED;
        snprintf(out->reason, sizeof out->reason, "trial %d reached the target objective: %s = %.6g", v->trials[best].trial,
                 t->metric, best_v);
        return 0;
    }
    if (t->no_improvement_trials > 0) {
        /* in trial order over the ended trials: how many since the best one last improved */
        int since = 0, seen = 0;
        double b = 0;
        for (int i = 0; i < v->ntrials; i++) {
            const tune_trial_t *x = &v->trials[i];
            if ((x->state != TUNE_TRIAL_COMPLETED && x->state != TUNE_TRIAL_STOPPED) || !x->has_objective)
                continue;
            if (seen++ == 0 || better(t, x->objective, b)) {
                b = x->objective;
                since = 0;
            } else {
                since++;
            }
        }
        if (seen > 0 && since >= t->no_improvement_trials) {
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
        int64_t g = tune_grid_size(t);
        limit = g >= 0 && g < limit ? g : limit;
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
            snprintf(out->reason, sizeof out->reason, "all %d trial(s) ended; the best is trial %d with %s = %.6g",
                     v->next_trial, v->trials[best].trial, t->metric, best_v);
        else
            snprintf(out->reason, sizeof out->reason, "all %d trial(s) ended", v->next_trial);
    }
    return 0;
}
