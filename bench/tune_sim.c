/* tune_sim.c - kiln's tuning search (tune_decide, the controller's own decisions) replayed over
 * recorded learning curves instead of a cluster: a trial's objective at a step is read from a
 * file of curves (each trial trained once, straight through, by bench/tune_sim.py), and trials
 * run max_parallel_jobs at a time on a clock of one tick a step. It answers, per seed, what a
 * search would have found for a budget of steps, in seconds instead of hours.
 *   tune_sim draw REQUEST.json N                  trials 0..N-1's values, one JSON object a line
 *   tune_sim run REQUEST.json CURVES.json BUDGET  the search until BUDGET steps: one JSON object,
 *                                                 or {"need": [trial, step]} (exit 3) when a
 *                                                 trial's curve does not reach a step it trains to
 * CURVES.json: {"<any key>": {"parameters": {...}, "steps": [...], "values": [...]}}, the objective
 * at every step a rung can end at for the trial of those parameter values (a trial's values come
 * from the search itself, tune_next_values: TPE's depend on the results before them). The "need"
 * answer carries the values to train: {"need": [trial, step], "parameters": {...}}. The output's
 * "curve" is [[steps consumed, best so far], ...] with steps counted as the bench's poll counts them
 * (every step trained by then, paused and running trials alike); "drawn" is each trial's values and
 * the steps it had trained by the end ("done" segments only). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/service.h"

typedef struct sim_trial {
    int64_t done;                     /* steps trained */
    int64_t seg_from, seg_to;         /* the segment it runs, when running */
    bool running;
    int64_t start;                    /* the tick its segment started */
} sim_trial_t;

static json_t *load(const char *path)
{
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        fprintf(stderr, "tune_sim: %s: %s (line %d)\n", path, je.text, je.line);
    return j;
}

/* The objective at step s of the trial whose parameters are values, from curves; false when no
 * curve of those parameters reaches s. */
static bool curve_at(const json_t *curves, const json_t *values, int64_t s, double *v)
{
    const char *key;
    const json_t *c;
    json_object_foreach((json_t *)curves, key, c) {
        if (!json_equal(json_object_get(c, "parameters"), (json_t *)values))
            continue;
        const json_t *st = json_object_get(c, "steps"), *va = json_object_get(c, "values");
        for (size_t k = 0; k < json_array_size(st); k++)
            if (json_integer_value(json_array_get(st, k)) == s) {
                *v = json_number_value(json_array_get(va, k));
                return true;
            }
    }
    return false;
}

static int run(const spec_tuning_t *t, const json_t *curves, int64_t budget)
{
    int cap = t->max_jobs;
    tune_trial_t *tr = calloc((size_t)cap, sizeof *tr);
    sim_trial_t *sm = calloc((size_t)cap, sizeof *sm);
    json_t **vals = calloc((size_t)cap, sizeof *vals);
    int64_t trial_rungs[SPEC_TUNE_MAX_RUNGS], grung[SPEC_TUNE_MAX_RUNGS];
    int ngr = tune_rungs(t, grung), nb = tune_brackets(t);
    int64_t max_steps = json_integer_value(json_object_get(json_object_get(t->job, "hyperparameters"), "max_steps"));
    int64_t reached[SPEC_TUNE_MAX_RUNGS + 1] = {0}, seg_steps[SPEC_TUNE_MAX_RUNGS + 1] = {0};
    int per_bracket[SPEC_TUNE_MAX_RUNGS + 1] = {0};
    if (!tr || !sm || !vals)
        return 1;
    json_t *curve = json_array();
    int n = 0;
    int64_t now = 0, finished = 0;
    double best = 0;
    bool have_best = false;
    char why[400] = "budget spent";
    for (;;) {
        tune_view_t v = {.t = t, .trials = tr, .ntrials = n, .next_trial = n};
        tune_plan_t plan;
        tune_decide(&v, &plan);
        if (plan.end != TUNE_END_NONE) {
            kiln_strlcpy(why, plan.reason, sizeof why);
            break;
        }
        int need = -1, first_new = n;
        int64_t need_to = 0;
        for (int k = 0; k < plan.npromote + plan.nnew; k++) {
            int i = k < plan.npromote ? plan.promote[k] : n++;
            if (k >= plan.npromote) {
                /* as the controller does: each new trial of one pass over the same history */
                v.ntrials = first_new;
                vals[i] = tune_next_values(&v, i);
                tr[i] = (tune_trial_t){.trial = i, .state = TUNE_TRIAL_ACTIVE, .reported = "val_loss",
                                       .bracket = tune_trial_bracket(t, i), .values = vals[i]};
                per_bracket[tr[i].bracket]++;
            }
            int nr = tune_trial_rungs(t, i, trial_rungs);
            int64_t to = nr ? trial_rungs[tr[i].nrungs] : max_steps;
            double probe;
            if (need < 0 && !curve_at(curves, vals[i], to, &probe)) {
                need = i;
                need_to = to;
            }
            tr[i].state = TUNE_TRIAL_ACTIVE;
            sm[i] = (sim_trial_t){.done = sm[i].done, .seg_from = sm[i].done, .seg_to = to, .running = true,
                                  .start = now};
        }
        if (need >= 0) {
            /* the caller trains trial need to step need_to and asks again */
            char *vt = json_dumps(vals[need], JSON_COMPACT | JSON_REAL_PRECISION(17));
            printf("{\"need\": [%d, %lld], \"parameters\": %s}\n", need, (long long)need_to, vt ? vt : "null");
            free(vt);
            for (int i = 0; i < n; i++)
                json_decref(vals[i]);
            free(vals);
            free(tr);
            free(sm);
            json_decref(curve);
            return 3;
        }
        /* the next segment to end; ties: the lowest trial */
        int next = -1;
        for (int i = 0; i < n; i++)
            if (sm[i].running && (next < 0 || sm[i].start + sm[i].seg_to - sm[i].seg_from
                                                  < sm[next].start + sm[next].seg_to - sm[next].seg_from))
                next = i;
        if (next < 0) {
            kiln_strlcpy(why, "nothing runs", sizeof why);
            break;
        }
        int64_t at = sm[next].start + sm[next].seg_to - sm[next].seg_from, consumed = finished;
        for (int i = 0; i < n; i++)
            if (sm[i].running)
                consumed += at - sm[i].start;
        if (consumed > budget)
            break;
        now = at;
        sim_trial_t *s = &sm[next];
        tune_trial_t *x = &tr[next];
        s->running = false;
        s->done = s->seg_to;
        finished += s->seg_to - s->seg_from;
        double val = 0;
        curve_at(curves, vals[next], s->seg_to, &val);
        int g = 0; /* the global rung the segment ended at */
        while (g < ngr && grung[g] != s->seg_to)
            g++;
        reached[g]++;
        seg_steps[g] += s->seg_to - s->seg_from;
        x->has_objective = true;
        x->objective = val;
        int nr = tune_trial_rungs(t, next, trial_rungs);
        if (nr && x->nrungs < nr - 1) {
            x->rung_objective[x->nrungs++] = val;
            x->state = TUNE_TRIAL_PAUSED;
        } else {
            x->state = TUNE_TRIAL_COMPLETED;
        }
        if (!have_best || val < best) {
            best = val;
            have_best = true;
            json_array_append_new(curve, json_pack("[I, f]", (json_int_t)consumed, val));
        }
    }
    json_t *rungs = json_array();
    for (int g = 0; g < (ngr ? ngr : 1); g++)
        json_array_append_new(rungs, json_pack("{s:I, s:I, s:I}", "steps", (json_int_t)(ngr ? grung[g] : max_steps),
                                               "segments_ending", (json_int_t)reached[g], "segment_steps",
                                               (json_int_t)seg_steps[g]));
    json_t *brackets = json_array();
    for (int b = 0; b < nb; b++)
        json_array_append_new(brackets, json_integer(per_bracket[b]));
    json_t *drawn = json_array(); /* each trial's values and the steps it trained */
    for (int i = 0; i < n; i++)
        json_array_append_new(drawn, json_pack("{s:O, s:I}", "parameters", vals[i], "steps", (json_int_t)sm[i].done));
    json_t *out = json_pack("{s:o, s:I, s:i, s:s, s:o, s:o, s:o}", "curve", curve, "steps", (json_int_t)finished,
                            "trials", n, "end", why, "rungs", rungs, "trials_by_bracket", brackets, "drawn", drawn);
    char *text = json_dumps(out, JSON_COMPACT);
    puts(text);
    free(text);
    json_decref(out);
    for (int i = 0; i < n; i++)
        json_decref(vals[i]);
    free(vals);
    free(tr);
    free(sm);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 4 || (strcmp(argv[1], "draw") && strcmp(argv[1], "run")) || (!strcmp(argv[1], "run") && argc < 5)) {
        fprintf(stderr, "usage: tune_sim draw REQUEST.json N | tune_sim run REQUEST.json CURVES.json BUDGET\n");
        return 2;
    }
    json_t *req = load(argv[2]);
    if (!req)
        return 1;
    spec_tuning_t t;
    kiln_err_t err;
    if (spec_tuning_parse(req, &t, &err)) {
        fprintf(stderr, "tune_sim: %s: %s\n", err.field, err.message);
        return 1;
    }
    int rc = 0;
    if (!strcmp(argv[1], "draw")) {
        int n = atoi(argv[3]);
        for (int i = 0; i < n; i++) {
            json_t *v = tune_trial_values(&t, i);
            char *text = json_dumps(v, JSON_COMPACT | JSON_REAL_PRECISION(17));
            printf("%s\n", text);
            free(text);
            json_decref(v);
        }
    } else {
        json_t *curves = load(argv[3]);
        rc = curves ? run(&t, curves, strtoll(argv[4], NULL, 10)) : 1;
        json_decref(curves);
    }
    spec_tuning_deinit(&t);
    json_decref(req);
    return rc;
}
