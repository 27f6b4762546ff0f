/* test_tune_search.c - the tuning search's pure functions without a cluster: seeded draws repeat
 * and differ between seeds, ranges, integer rounding, log and reverse_log scaling (checked
 * statistically) and categorical values are respected, a drawn real reads back from the digits a
 * spec is written with, the grid is enumerated whole, and the
 * controller's decisions: parallelism, the ends (objective missing from a trial that ended or
 * from a hyperband trial paused at its first rung, failures, target, no improvement, all done),
 * hyperband's asynchronous promotions (ASHA) and the median stopping rule (early_stopping
 * "auto"); TPE (strategy bayesian, hyperband's sampler tpe): its startup draws
 * are random's, it repeats for the same history and moves with another, keeps to the ranges and
 * concentrates near the optimum of a synthetic objective, and hyperband's TPE learns from every trial
 * with a rung result, a higher rung ranked first (as Optuna's TPE under its Hyperband pruner). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/service.h"

/* Whether v reads back from the 15 significant digits a job's spec and REST write it with: the
 * value a trial is recorded with is then the value it trains with and the one REST shows. */
static bool written_as_read(double v)
{
    char text[40];
    snprintf(text, sizeof text, "%.15g", v);
    return strtod(text, NULL) == v;
}

/* Parses a request over a tiny GPT base job with params (members) and extra members: its code. */
static int try_parse(spec_tuning_t *t, const char *params, const char *extra, kiln_err_t *err)
{
    char buf[4096];
    snprintf(buf, sizeof buf,
             "{\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8},"
             " \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 2000}},"
             " \"parameters\": {%s}, \"objective\": {\"metric\": \"val_loss\"}%s%s}",
             params, extra ? ", " : "", extra ? extra : "");
    json_error_t je;
    json_t *j = json_loads(buf, 0, &je);
    cr_assert_not_null(j, "%s", je.text);
    int rc = spec_tuning_parse(j, t, err);
    json_decref(j);
    return rc;
}

/* try_parse, which must take it. */
static void parse(spec_tuning_t *t, const char *params, const char *extra)
{
    kiln_err_t err;
    cr_assert_eq(try_parse(t, params, extra, &err), 0, "%s: %s", err.field, err.message);
}

/* The field a hyperband request (try_parse's base job, one lr range) is refused on; "" when taken. */
static const char *hyperband_refused(const char *hyperband, char *field, size_t n)
{
    char extra[512];
    snprintf(extra, sizeof extra, "\"strategy\": \"hyperband\", \"hyperband\": %s", hyperband);
    spec_tuning_t t;
    kiln_err_t err;
    int rc = try_parse(&t, "\"lr\": {\"type\": \"continuous\", \"min\": 1e-4, \"max\": 1e-2}", extra, &err);
    if (rc == 0)
        spec_tuning_deinit(&t);
    else
        cr_assert_eq(rc, KILN_EINVAL, "%s", err.message);
    snprintf(field, n, "%s", rc ? err.field : "");
    return field;
}

Test(tune_search, seeded_draws_repeat_and_seeds_differ)
{
    spec_tuning_t a, b, c;
    const char *p = "\"lr\": {\"type\": \"continuous\", \"min\": 1e-4, \"max\": 1e-2, \"scaling\": \"log\"},"
                    " \"warmup_steps\": {\"type\": \"integer\", \"min\": 0, \"max\": 300},"
                    " \"model.n_embd\": {\"type\": \"categorical\", \"values\": [16, 32]}";
    parse(&a, p, "\"seed\": 11");
    parse(&b, p, "\"seed\": 11");
    parse(&c, p, "\"seed\": 12");
    int same_c = 0;
    for (int n = 0; n < 50; n++) {
        json_t *x = tune_trial_values(&a, n), *y = tune_trial_values(&b, n), *z = tune_trial_values(&c, n);
        cr_assert(json_equal(x, y), "trial %d repeats with the seed", n);
        same_c += json_equal(x, z);
        json_decref(x);
        json_decref(y);
        json_decref(z);
    }
    cr_assert_eq(same_c, 0, "another seed draws other trials");
    /* a trial's values do not depend on which trials were drawn before it */
    json_t *late = tune_trial_values(&a, 49), *again = tune_trial_values(&b, 49);
    cr_assert(json_equal(late, again));
    json_decref(late);
    json_decref(again);
    spec_tuning_deinit(&a);
    spec_tuning_deinit(&b);
    spec_tuning_deinit(&c);
}

Test(tune_search, ranges_integers_and_categoricals_are_respected)
{
    spec_tuning_t t;
    parse(&t, "\"warmup_steps\": {\"type\": \"integer\", \"min\": 3, \"max\": 6},"
              " \"hyperparameters.weight_decay\": {\"type\": \"continuous\", \"min\": 0.05, \"max\": 0.2},"
              " \"model.n_embd\": {\"type\": \"categorical\", \"values\": [16, 32, 64]}",
          "\"seed\": 5");
    int seen_int[10] = {0}, seen_cat[3] = {0};
    for (int n = 0; n < 2000; n++) {
        json_t *v = tune_trial_values(&t, n);
        json_t *w = json_object_get(v, "warmup_steps");
        cr_assert(json_is_integer(w));
        json_int_t k = json_integer_value(w);
        cr_assert(k >= 3 && k <= 6, "%lld", (long long)k);
        seen_int[k]++;
        double wd = json_number_value(json_object_get(v, "hyperparameters.weight_decay"));
        cr_assert(wd >= 0.05 && wd <= 0.2);
        json_int_t e = json_integer_value(json_object_get(v, "model.n_embd"));
        cr_assert(e == 16 || e == 32 || e == 64);
        seen_cat[e == 16 ? 0 : e == 32 ? 1 : 2]++;
        json_decref(v);
    }
    for (int k = 3; k <= 6; k++)
        cr_assert(seen_int[k] > 400 && seen_int[k] < 600, "each integer about a quarter of the draws: %d drew %d", k,
                  seen_int[k]);
    for (int k = 0; k < 3; k++)
        cr_assert(seen_cat[k] > 550 && seen_cat[k] < 780, "each value about a third: %d", seen_cat[k]);
    spec_tuning_deinit(&t);
}

Test(tune_search, log_and_reverse_log_scaling_statistically)
{
    spec_tuning_t t;
    parse(&t, "\"lr\": {\"type\": \"continuous\", \"min\": 1e-4, \"max\": 1e-2, \"scaling\": \"log\"},"
              " \"beta2\": {\"type\": \"continuous\", \"min\": 0.9, \"max\": 0.9999, \"scaling\": \"reverse_log\"}",
          "\"seed\": 9");
    /* log-uniform: log10(lr) is uniform on [-4, -2], so each decade holds half, and the mean of
     * log10 is -3 with standard deviation 2 / sqrt(12) */
    int n = 4000, low_decade = 0, beta_near = 0;
    double sum = 0, sum2 = 0;
    for (int i = 0; i < n; i++) {
        json_t *v = tune_trial_values(&t, i);
        double lr = json_number_value(json_object_get(v, "lr"));
        double b2 = json_number_value(json_object_get(v, "beta2"));
        cr_assert(lr >= 1e-4 && lr <= 1e-2 && b2 >= 0.9 && b2 <= 0.9999);
        cr_assert(written_as_read(lr) && written_as_read(b2), "%.17g %.17g", lr, b2);
        double l = log10(lr);
        sum += l;
        sum2 += l * l;
        low_decade += lr < 1e-3;
        /* 1 - beta2 is log-uniform on [1e-4, 1e-1]: a third of the draws above 0.999 */
        beta_near += b2 > 0.999;
        json_decref(v);
    }
    double mean = sum / n, sd = sqrt(sum2 / n - mean * mean);
    cr_assert(fabs(mean + 3.0) < 0.05, "mean of log10(lr) %.3f, want -3", mean);
    cr_assert(fabs(sd - 2.0 / sqrt(12.0)) < 0.03, "sd of log10(lr) %.3f, want %.3f", sd, 2.0 / sqrt(12.0));
    cr_assert(low_decade > 1850 && low_decade < 2150, "half the draws in [1e-4, 1e-3): %d", low_decade);
    cr_assert(beta_near > 1200 && beta_near < 1470, "a third of beta2 above 0.999: %d", beta_near);
    spec_tuning_deinit(&t);
}

Test(tune_search, grid_enumerates_every_point_once)
{
    spec_tuning_t t;
    parse(&t, "\"warmup_steps\": {\"type\": \"integer\", \"min\": 0, \"max\": 2},"
              " \"model.n_embd\": {\"type\": \"categorical\", \"values\": [16, 32]}",
          "\"strategy\": \"grid\", \"max_jobs\": 6");
    cr_assert_eq(tune_grid_size(&t), 6);
    char seen[6][64];
    for (int n = 0; n < 6; n++) {
        json_t *v = tune_trial_values(&t, n);
        char *s = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
        snprintf(seen[n], sizeof seen[n], "%s", s);
        for (int m = 0; m < n; m++)
            cr_assert_str_neq(seen[m], seen[n], "grid point %d repeats %d", n, m);
        free(s);
        json_decref(v);
    }
    cr_assert_null(tune_trial_values(&t, 6), "nothing past the grid's end");
    spec_tuning_deinit(&t);
}

static tune_trial_t trial(int n, tune_trial_state_t st, bool has, double obj)
{
    tune_trial_t x = {.trial = n, .job_id = "j", .state = st, .has_objective = has, .objective = obj, .reported = "train_loss"};
    return x;
}

Test(tune_search, decisions_random)
{
    spec_tuning_t t;
    parse(&t, "\"lr\": {\"type\": \"continuous\", \"min\": 1e-4, \"max\": 1e-2}",
          "\"max_jobs\": 4, \"max_parallel_jobs\": 2, \"max_failed_trials\": 2,"
          " \"completion\": {\"target_objective\": 1.0, \"no_improvement_trials\": 2}");
    tune_trial_t tr[4];
    tune_view_t v = {.t = &t, .trials = tr, .ntrials = 0, .next_trial = 0};
    tune_plan_t p;
    tune_decide(&v, &p);
    cr_assert_eq(p.nnew, 2, "max_parallel_jobs at once");
    cr_assert_eq(p.end, TUNE_END_NONE);
    tr[0] = trial(0, TUNE_TRIAL_ACTIVE, false, 0);
    tr[1] = trial(1, TUNE_TRIAL_COMPLETED, true, 2.0);
    v.ntrials = 2;
    v.next_trial = 2;
    tune_decide(&v, &p);
    cr_assert_eq(p.nnew, 1);
    cr_assert_eq(p.best, 1);
    /* the objective never reported by a completed trial ends it, naming both */
    tr[1] = trial(1, TUNE_TRIAL_COMPLETED, false, 0);
    tune_decide(&v, &p);
    cr_assert_eq(p.end, TUNE_END_FAILED);
    cr_assert(strstr(p.reason, "\"val_loss\"") && strstr(p.reason, "train_loss"), "%s", p.reason);
    /* failures */
    tr[0] = trial(0, TUNE_TRIAL_FAILED, false, 0);
    tr[1] = trial(1, TUNE_TRIAL_FAILED, false, 0);
    v.last_failure = "rank 0 exited with code 1";
    tune_decide(&v, &p);
    cr_assert_eq(p.end, TUNE_END_FAILED);
    cr_assert(strstr(p.reason, "2 trial(s) failed") && strstr(p.reason, "code 1"), "%s", p.reason);
    /* the target */
    tr[0] = trial(0, TUNE_TRIAL_ACTIVE, true, 0.9);
    tr[1] = trial(1, TUNE_TRIAL_COMPLETED, true, 2.0);
    tune_decide(&v, &p);
    cr_assert_eq(p.end, TUNE_END_COMPLETED);
    cr_assert(strstr(p.reason, "target"), "%s", p.reason);
    /* no improvement over 2 completed trials */
    tr[0] = trial(0, TUNE_TRIAL_COMPLETED, true, 1.5);
    tr[1] = trial(1, TUNE_TRIAL_COMPLETED, true, 1.6);
    tr[2] = trial(2, TUNE_TRIAL_COMPLETED, true, 1.7);
    v.ntrials = 3;
    v.next_trial = 3;
    tune_decide(&v, &p);
    cr_assert_eq(p.end, TUNE_END_COMPLETED);
    cr_assert(strstr(p.reason, "no improvement"), "%s", p.reason);
    /* all done */
    tr[2] = trial(2, TUNE_TRIAL_COMPLETED, true, 1.4);
    tr[3] = trial(3, TUNE_TRIAL_STOPPED, true, 1.45);
    v.ntrials = 4;
    v.next_trial = 4;
    tune_decide(&v, &p);
    cr_assert_eq(p.end, TUNE_END_COMPLETED);
    cr_assert(strstr(p.reason, "all 4 trial(s) ended"), "%s", p.reason);
    spec_tuning_deinit(&t);
}

Test(tune_search, hyperband_rungs_and_asynchronous_promotion)
{
    spec_tuning_t t;
    parse(&t, "\"lr\": {\"type\": \"continuous\", \"min\": 1e-4, \"max\": 1e-2}",
          "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 100, \"max_resource\": 2000,"
          " \"reduction_factor\": 3}, \"max_jobs\": 30, \"max_parallel_jobs\": 2");
    int64_t r[SPEC_TUNE_MAX_RUNGS];
    int nr = tune_rungs(&t, r);
    cr_assert_eq(nr, 4);
    cr_assert(r[0] == 100 && r[1] == 300 && r[2] == 900 && r[3] == 2000);
    tune_trial_t tr[4];
    for (int i = 0; i < 4; i++) {
        tr[i] = trial(i, TUNE_TRIAL_PAUSED, true, 0);
        tr[i].nrungs = 1;
    }
    tr[0].rung_objective[0] = 3.0;
    tr[1].rung_objective[0] = 2.0;
    tune_view_t v = {.t = &t, .trials = tr, .ntrials = 2, .next_trial = 2};
    tune_plan_t p;
    tune_decide(&v, &p);
    cr_assert_eq(p.npromote, 0, "2 at a rung: the top third is empty");
    cr_assert_eq(p.nnew, 2);
    tr[2].rung_objective[0] = 2.5;
    v.ntrials = 3;
    v.next_trial = 3;
    tune_decide(&v, &p);
    cr_assert_eq(p.npromote, 1, "3 at a rung: the best is promoted at once, not when the rung fills");
    cr_assert_eq(p.promote[0], 1);
    cr_assert_eq(p.nnew, 1);
    /* a promoted trial that finished the next rung is promoted again before anything else */
    tr[1].nrungs = 2;
    tr[1].rung_objective[1] = 1.0;
    tr[3].rung_objective[0] = 1.5;
    v.ntrials = 4;
    v.next_trial = 4;
    tune_decide(&v, &p);
    cr_assert_eq(p.npromote, 1, "trial 3 now leads rung 0 (4 trials: the top one), trial 1 is alone at rung 1");
    cr_assert_eq(p.promote[0], 3);
    /* seeded: the same decisions twice */
    tune_plan_t q;
    tune_decide(&v, &q);
    cr_assert_eq(memcmp(&p, &q, sizeof p), 0);
    spec_tuning_deinit(&t);
}

Test(tune_search, hyperband_brackets_share_the_budget_and_start_at_their_own_rungs)
{
    spec_tuning_t one, three;
    const char *p = "\"lr\": {\"type\": \"continuous\", \"min\": 1e-4, \"max\": 1e-2}";
    parse(&one, p, "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 50, \"max_resource\": 450}");
    parse(&three, p, "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 50, \"max_resource\": 450,"
                     " \"brackets\": 3}");
    cr_assert_eq(tune_brackets(&one), 1, "one bracket unless asked");
    cr_assert_eq(tune_brackets(&three), 3);
    int64_t r[SPEC_TUNE_MAX_RUNGS];
    int count[3] = {0}, seen[3] = {-1, -1, -1};
    for (int n = 0; n < 70; n++) {
        cr_assert_eq(tune_trial_bracket(&one, n), 0);
        cr_assert_eq(tune_trial_rungs(&one, n, r), 3);
        cr_assert(r[0] == 50 && r[1] == 150 && r[2] == 450);
        int b = tune_trial_bracket(&three, n);
        cr_assert(b >= 0 && b < 3);
        cr_assert_eq(b, tune_trial_bracket(&three, n), "a function of the trial's number");
        count[b]++;
        if (seen[b] < 0)
            seen[b] = n;
        /* bracket b's trials start at rung b */
        int nr = tune_trial_rungs(&three, n, r);
        cr_assert_eq(nr, 3 - b);
        cr_assert_eq(r[0], b == 0 ? 50 : b == 1 ? 150 : 450, "trial %d, bracket %d", n, b);
        cr_assert_eq(r[nr - 1], 450);
    }
    cr_assert_eq(tune_trial_bracket(&three, 0), 0, "trial 0 in the most aggressive bracket");
    cr_assert(seen[1] < 4 && seen[2] < 4, "every bracket has a trial among the first four: %d %d", seen[1], seen[2]);
    /* equal budgets: a trial costs 116.7, 250 and 450 steps expected in brackets 0, 1, 2, so
     * 4 : 2 : 1 trials a cycle of 7 */
    cr_assert(count[0] == 40 && count[1] == 20 && count[2] == 10, "%d %d %d", count[0], count[1], count[2]);
    spec_tuning_deinit(&one);
    spec_tuning_deinit(&three);
    /* more brackets than rungs is refused, naming the field */
    char f[sizeof(((kiln_err_t *)0)->field)];
    cr_assert_str_eq(hyperband_refused("{\"min_resource\": 50, \"max_resource\": 450, \"brackets\": 4}", f, sizeof f),
                     "hyperband.brackets");
}

Test(tune_search, hyperband_max_rungs_keeps_the_lowest_rungs_then_max_resource)
{
    const char *p = "\"lr\": {\"type\": \"continuous\", \"min\": 1e-4, \"max\": 1e-2}";
    spec_tuning_t all, two, three, four;
    parse(&all, p, "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 100, \"max_resource\": 2000}");
    parse(&two, p, "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 100, \"max_resource\": 2000,"
                   " \"reduction_factor\": 5, \"max_rungs\": 2}, \"max_jobs\": 30, \"max_parallel_jobs\": 2");
    parse(&three, p, "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 100, \"max_resource\": 2000,"
                     " \"max_rungs\": 3}");
    parse(&four, p, "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 100, \"max_resource\": 2000,"
                    " \"max_rungs\": 4}");
    int64_t r[SPEC_TUNE_MAX_RUNGS];
    cr_assert_eq(tune_rungs(&all, r), 4);
    cr_assert(r[0] == 100 && r[1] == 300 && r[2] == 900 && r[3] == 2000);
    cr_assert_eq(tune_rungs(&two, r), 2, "one rung at min_resource, then max_resource");
    cr_assert(r[0] == 100 && r[1] == 2000, "%lld %lld", (long long)r[0], (long long)r[1]);
    cr_assert_eq(tune_trial_rungs(&two, 7, r), 2);
    cr_assert_eq(tune_rungs(&three, r), 3);
    cr_assert(r[0] == 100 && r[1] == 300 && r[2] == 2000);
    cr_assert_eq(tune_rungs(&four, r), 4, "as many as the ladder has: every rung");
    cr_assert(r[0] == 100 && r[1] == 300 && r[2] == 900 && r[3] == 2000);

    /* the top 1/eta of rung 0 goes on to max_resource: 5 paused there, the best promoted */
    tune_trial_t tr[5];
    double obj[5] = {3.0, 2.0, 2.5, 1.5, 2.8};
    for (int i = 0; i < 5; i++) {
        tr[i] = trial(i, TUNE_TRIAL_PAUSED, true, 0);
        tr[i].nrungs = 1;
        tr[i].rung_objective[0] = obj[i];
    }
    tune_view_t v = {.t = &two, .trials = tr, .ntrials = 4, .next_trial = 4};
    tune_plan_t pl;
    tune_decide(&v, &pl);
    cr_assert_eq(pl.npromote, 0, "4 at the rung: the top fifth is empty");
    v.ntrials = v.next_trial = 5;
    tune_decide(&v, &pl);
    cr_assert_eq(pl.npromote, 1);
    cr_assert_eq(pl.promote[0], 3);

    /* written with the request, and read back the same */
    json_t *j = spec_tuning_to_json(&two);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(j, "hyperband"), "max_rungs")), 2);
    spec_tuning_t back;
    kiln_err_t err;
    cr_assert_eq(spec_tuning_load(j, &back, &err), 0, "%s", err.message);
    cr_assert_eq(tune_rungs(&back, r), 2);
    spec_tuning_deinit(&back);
    json_decref(j);
    j = spec_tuning_to_json(&all);
    cr_assert_null(json_object_get(json_object_get(j, "hyperband"), "max_rungs"), "left out: every rung");
    json_decref(j);
    spec_tuning_deinit(&all);
    spec_tuning_deinit(&two);
    spec_tuning_deinit(&three);
    spec_tuning_deinit(&four);

    char f[sizeof(((kiln_err_t *)0)->field)];
    cr_assert_str_eq(hyperband_refused("{\"min_resource\": 100, \"max_resource\": 2000, \"max_rungs\": 5}", f, sizeof f),
                     "hyperband.max_rungs", "more than the ladder's 4 rungs");
    cr_assert_str_eq(hyperband_refused("{\"min_resource\": 100, \"max_resource\": 2000, \"max_rungs\": 1}", f, sizeof f),
                     "hyperband.max_rungs", "one rung would be max_resource alone: no early stopping");
    cr_assert_str_eq(hyperband_refused("{\"min_resource\": 100, \"max_resource\": 2000, \"max_rungs\": 2.5}", f, sizeof f),
                     "hyperband.max_rungs");
    cr_assert_str_eq(hyperband_refused("{\"min_resource\": 100, \"max_resource\": 2000, \"max_rungs\": 2,"
                                       " \"brackets\": 3}", f, sizeof f),
                     "hyperband.brackets", "a bracket a rung, of the rungs max_rungs keeps");
    /* a ladder past SPEC_TUNE_MAX_RUNGS is refused, but not when max_rungs keeps fewer */
    cr_assert_str_eq(hyperband_refused("{\"min_resource\": 1, \"max_resource\": 100000, \"reduction_factor\": 2}", f,
                                       sizeof f), "hyperband.max_resource");
    cr_assert_str_eq(hyperband_refused("{\"min_resource\": 1, \"max_resource\": 100000, \"reduction_factor\": 2,"
                                       " \"max_rungs\": 3}", f, sizeof f), "");
}

Test(tune_search, hyperband_ranks_a_trial_only_against_its_own_bracket)
{
    spec_tuning_t t;
    parse(&t, "\"lr\": {\"type\": \"continuous\", \"min\": 1e-4, \"max\": 1e-2}",
          "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 50, \"max_resource\": 450,"
          " \"brackets\": 2}, \"max_jobs\": 30, \"max_parallel_jobs\": 4");
    /* brackets 0 and 1 cost 116.7 and 250 steps a trial: 2 : 1, trials 0, 2, 3 in bracket 0 */
    int want[4] = {0, 1, 0, 0};
    tune_trial_t tr[4];
    double obj[4] = {3.0, 1.0, 2.0, 2.5};
    for (int i = 0; i < 4; i++) {
        tr[i] = trial(i, TUNE_TRIAL_PAUSED, true, obj[i]);
        tr[i].bracket = tune_trial_bracket(&t, i);
        cr_assert_eq(tr[i].bracket, want[i], "trial %d", i);
        tr[i].nrungs = 1;
        tr[i].rung_objective[0] = obj[i];
    }
    /* trial 1 paused at its first rung (150 steps) has the best value of the four, but it is alone
     * in its bracket: trial 2 leads bracket 0's three at 50 steps and is the one promoted */
    tune_view_t v = {.t = &t, .trials = tr, .ntrials = 4, .next_trial = 4};
    tune_plan_t p;
    tune_decide(&v, &p);
    cr_assert_eq(p.npromote, 1);
    cr_assert_eq(p.promote[0], 2);
    spec_tuning_deinit(&t);
}

Test(tune_search, hyperband_trial_paused_at_its_first_rung_without_the_objective_ends_the_search)
{
    spec_tuning_t t;
    parse(&t, "\"lr\": {\"type\": \"continuous\", \"min\": 1e-4, \"max\": 1e-2}",
          "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 10, \"max_resource\": 90},"
          " \"max_jobs\": 9, \"max_parallel_jobs\": 3");
    /* trials 0 and 1 paused at rung 0 with val_loss there, trial 2 still running toward it */
    tune_trial_t tr[3];
    for (int i = 0; i < 3; i++) {
        tr[i] = trial(i, i < 2 ? TUNE_TRIAL_PAUSED : TUNE_TRIAL_ACTIVE, true, 2.0 + i);
        tr[i].nrungs = i < 2;
        tr[i].rung_objective[0] = 2.0 + i;
        tr[i].reported = "train_loss, val_loss";
    }
    tune_view_t v = {.t = &t, .trials = tr, .ntrials = 3, .next_trial = 3};
    tune_plan_t p;
    tune_decide(&v, &p);
    cr_assert_eq(p.end, TUNE_END_NONE, "%s", p.reason);
    /* trial 1 reached its first rung (paused there, no rung result: tune.c records one only from the
     * objective) having reported other metrics only: the search ends at once, naming the metric
     * and what it did report, before any trial is started or promoted */
    tr[1] = trial(1, TUNE_TRIAL_PAUSED, false, 0);
    tr[1].job_id = "0b5e7a52-0000-4000-8000-000000000001";
    tr[1].reported = "train_loss, step_time_ms";
    tune_decide(&v, &p);
    cr_assert_eq(p.end, TUNE_END_FAILED, "a paused trial without the objective ends the search: %s", p.reason);
    cr_assert_str_eq(p.reason, "objective metric \"val_loss\" was not reported by trial 1 (job "
                               "0b5e7a52-0000-4000-8000-000000000001), which reached its first rung; it reported: "
                               "train_loss, step_time_ms");
    cr_assert(p.nnew == 0 && p.npromote == 0 && p.nstop == 0);
    /* one that reported nothing at all says so */
    tr[1].reported = "";
    tune_decide(&v, &p);
    cr_assert_eq(p.end, TUNE_END_FAILED);
    cr_assert(strstr(p.reason, "reached its first rung; it reported: no metrics"), "%s", p.reason);
    /* the objective came at the rung: the search goes on (trial 2 still runs, nothing to promote
     * among two) */
    tr[1] = trial(1, TUNE_TRIAL_PAUSED, true, 3.0);
    tr[1].nrungs = 1;
    tr[1].rung_objective[0] = 3.0;
    tune_decide(&v, &p);
    cr_assert_eq(p.end, TUNE_END_NONE, "%s", p.reason);
    spec_tuning_deinit(&t);
}

/* Trial n's curve: its objective at steps 10, 20, ... (k values of vals). */
static int64_t curve_steps[10] = {10, 20, 30, 40, 50, 60, 70, 80, 90, 100};
static void curve(tune_trial_t *x, const double *vals, int k, int64_t total)
{
    x->curve = (tune_curve_t){.steps = curve_steps, .values = vals, .n = k};
    x->total_steps = total;
}

Test(tune_search, median_rule_stops_a_running_trial_worse_than_the_completed_median)
{
    spec_tuning_t t;
    parse(&t, "\"lr\": {\"type\": \"continuous\", \"min\": 1e-4, \"max\": 1e-2}",
          "\"max_jobs\": 10, \"max_parallel_jobs\": 2, \"early_stopping\": \"auto\"");
    cr_assert(t.early_stopping);
    /* completed trials' running averages up to step 30: 4.0, 3.0, 2.0 (median 3.0); up to 100: 2.7, 2.0, 1.1 */
    static const double c0[] = {5, 4, 3, 3, 2, 2, 2, 1, 1, 1}, c1[] = {3, 3, 3, 2, 2, 2, 1, 1, 1, 2},
                        c2[] = {2, 2, 2, 1, 1, 1, 0, 0, 1, 1};
    static const double bad[] = {4, 3.5, 3.2}, good[] = {4, 3, 2.5}, tie[] = {4, 3.5, 3.0};
    tune_trial_t tr[5];
    tr[0] = trial(0, TUNE_TRIAL_COMPLETED, true, 1);
    tr[1] = trial(1, TUNE_TRIAL_COMPLETED, true, 2);
    tr[2] = trial(2, TUNE_TRIAL_COMPLETED, true, 1);
    curve(&tr[0], c0, 10, 100);
    curve(&tr[1], c1, 10, 100);
    curve(&tr[2], c2, 10, 100);
    tr[3] = trial(3, TUNE_TRIAL_ACTIVE, true, 3.2);
    curve(&tr[3], bad, 3, 100);
    tr[4] = trial(4, TUNE_TRIAL_ACTIVE, true, 2.5);
    curve(&tr[4], good, 3, 100);
    tune_view_t v = {.t = &t, .trials = tr, .ntrials = 5, .next_trial = 5};
    tune_plan_t p;
    tune_decide(&v, &p);
    cr_assert_eq(p.nstop, 1, "the trial whose best (3.2) is worse than the median (3.0) stops, the other goes on");
    cr_assert_eq(p.stop[0].index, 3);
    cr_assert_eq(p.stop[0].step, 30);
    cr_assert_float_eq(p.stop[0].best, 3.2, 1e-12);
    cr_assert_float_eq(p.stop[0].median, 3.0, 1e-12);
    cr_assert_eq(p.stop[0].history, 3);
    cr_assert_eq(p.nnew, 0, "a stopped trial holds its slot until its job has ended");
    /* equal to the median is not worse */
    curve(&tr[3], tie, 3, 100);
    tune_decide(&v, &p);
    cr_assert_eq(p.nstop, 0);
    curve(&tr[3], bad, 3, 100);
    /* not before 1/10 of its steps */
    curve(&tr[3], bad, 3, 400);
    tune_decide(&v, &p);
    cr_assert_eq(p.nstop, 0, "step 30 of 400 is too early to judge");
    curve(&tr[3], bad, 3, 300);
    tune_decide(&v, &p);
    cr_assert_eq(p.nstop, 1, "step 30 of 300 is judged");
    /* not with fewer than 3 completed trials */
    tr[2].state = TUNE_TRIAL_FAILED;
    tune_decide(&v, &p);
    cr_assert_eq(p.nstop, 0, "2 completed trials are not enough history");
    tr[2].state = TUNE_TRIAL_COMPLETED;
    /* only what the completed trials had reported by the step counts: at step 10 their values are 5, 3, 2 */
    static const double early[] = {3.5};
    curve(&tr[3], early, 1, 100);
    tune_decide(&v, &p);
    cr_assert_eq(p.nstop, 1);
    cr_assert_float_eq(p.stop[0].median, 3.0, 1e-12);
    cr_assert_eq(p.stop[0].step, 10);
    /* maximize: higher is better; the running averages' median up to step 30 is still 3.0 */
    t.maximize = true;
    static const double low[] = {1, 2, 2.5};
    curve(&tr[3], bad, 3, 100);
    curve(&tr[4], low, 3, 100);
    tune_decide(&v, &p);
    cr_assert_eq(p.nstop, 1, "maximize: a best of 4.0 goes on, a best of 2.5 stops");
    cr_assert_eq(p.stop[0].index, 4);
    t.maximize = false;
    /* off, or a trial that is not running: never */
    t.early_stopping = false;
    curve(&tr[4], bad, 3, 100);
    tune_decide(&v, &p);
    cr_assert_eq(p.nstop, 0, "early_stopping off");
    t.early_stopping = true;
    tr[3].state = TUNE_TRIAL_PAUSED;
    tr[4].state = TUNE_TRIAL_STOPPED;
    tune_decide(&v, &p);
    cr_assert_eq(p.nstop, 0, "only running trials are judged");
    /* a trial stopped early counts as a trial: the search ends when every trial has ended */
    tr[3].state = TUNE_TRIAL_STOPPED;
    v.next_trial = 10;
    tr[3].objective = 0.5;
    tune_decide(&v, &p);
    cr_assert_eq(p.end, TUNE_END_COMPLETED, "%s", p.reason);
    cr_assert_eq(p.best, 3, "a trial stopped early keeps its objective and can be the best");
    spec_tuning_deinit(&t);
}

/* ---- warm start: the parents' trials as history ---------------------------------------------- */

Test(tune_search, warm_start_never_redraws_a_parents_configuration)
{
    spec_tuning_t t;
    parse(&t, "\"model.n_embd\": {\"type\": \"categorical\", \"values\": [16, 32, 64]},"
              " \"warmup_steps\": {\"type\": \"integer\", \"min\": 0, \"max\": 1}",
          "\"seed\": 4, \"max_jobs\": 6");
    cr_assert_eq(tune_space_left(&t, NULL), 6);
    /* a parent tried four of the six points (one twice) and one outside this space */
    json_t *tried = json_loads("[{\"model.n_embd\": 16, \"warmup_steps\": 0}, {\"model.n_embd\": 32, \"warmup_steps\": 1},"
                               " {\"model.n_embd\": 64, \"warmup_steps\": 0}, {\"model.n_embd\": 16, \"warmup_steps\": 1},"
                               " {\"model.n_embd\": 16, \"warmup_steps\": 0}, {\"model.n_embd\": 128, \"warmup_steps\": 0}]",
                               0, NULL);
    cr_assert_not_null(tried);
    cr_assert_eq(tune_space_left(&t, tried), 2);
    for (int n = 0; n < 40; n++) {
        json_t *v = tune_trial_values_new(&t, n, tried);
        cr_assert_not_null(v, "trial %d has an untried point", n);
        json_int_t e = json_integer_value(json_object_get(v, "model.n_embd")),
                   w = json_integer_value(json_object_get(v, "warmup_steps"));
        cr_assert((e == 32 && w == 0) || (e == 64 && w == 1), "trial %d drew a parent's point: %lld, %lld", n,
                  (long long)e, (long long)w);
        json_t *again = tune_trial_values_new(&t, n, tried);
        cr_assert(json_equal(v, again), "the same trial draws the same");
        json_decref(again);
        json_decref(v);
    }
    /* without parents: trial n's values as before */
    json_t *a = tune_trial_values_new(&t, 3, NULL), *b = tune_trial_values(&t, 3);
    cr_assert(json_equal(a, b));
    json_decref(a);
    json_decref(b);
    spec_tuning_deinit(&t);

    /* grid skips the points a parent tried, and its end comes sooner */
    parse(&t, "\"model.n_embd\": {\"type\": \"categorical\", \"values\": [16, 32, 64]},"
              " \"warmup_steps\": {\"type\": \"integer\", \"min\": 0, \"max\": 1}",
          "\"strategy\": \"grid\", \"max_jobs\": 6");
    char seen[2][64];
    for (int n = 0; n < 2; n++) {
        json_t *v = tune_trial_values_new(&t, n, tried);
        cr_assert_not_null(v);
        char *s = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
        snprintf(seen[n], sizeof seen[n], "%s", s);
        free(s);
        json_decref(v);
    }
    cr_assert_str_eq(seen[0], "{\"model.n_embd\":32,\"warmup_steps\":0}");
    cr_assert_str_eq(seen[1], "{\"model.n_embd\":64,\"warmup_steps\":1}");
    cr_assert_null(tune_trial_values_new(&t, 2, tried), "two points were left");
    tune_view_t v = {.t = &t, .trials = NULL, .ntrials = 0, .next_trial = 0, .tried = tried};
    tune_plan_t p;
    t.max_parallel_jobs = 6;
    tune_decide(&v, &p);
    cr_assert_eq(p.nnew, 2, "grid: only the untried points are trials");
    spec_tuning_deinit(&t);

    /* a random search whose parents tried the whole space starts nothing and ends */
    parse(&t, "\"warmup_steps\": {\"type\": \"integer\", \"min\": 0, \"max\": 1}", "\"max_jobs\": 4");
    json_t *all = json_loads("[{\"warmup_steps\": 0}, {\"warmup_steps\": 1}]", 0, NULL);
    v = (tune_view_t){.t = &t, .trials = NULL, .ntrials = 0, .next_trial = 0, .tried = all};
    tune_decide(&v, &p);
    cr_assert_eq(p.nnew, 0);
    cr_assert_eq(p.end, TUNE_END_COMPLETED, "%s", p.reason);
    json_decref(all);
    json_decref(tried);
    spec_tuning_deinit(&t);
}

Test(tune_search, warm_start_parents_trials_are_history_not_this_jobs)
{
    spec_tuning_t t;
    parse(&t, "\"lr\": {\"type\": \"continuous\", \"min\": 1e-4, \"max\": 1e-2}",
          "\"max_jobs\": 4, \"max_parallel_jobs\": 2, \"max_failed_trials\": 2,"
          " \"completion\": {\"no_improvement_trials\": 2}");
    const char *P = "7d1b8a44-0000-4000-8000-000000000001";
    tune_trial_t tr[6];
    /* the parent's trials: its best 1.0, two failures, one without the objective */
    tr[0] = trial(0, TUNE_TRIAL_COMPLETED, true, 1.0);
    tr[1] = trial(1, TUNE_TRIAL_FAILED, false, 0);
    tr[2] = trial(2, TUNE_TRIAL_FAILED, false, 0);
    tr[3] = trial(3, TUNE_TRIAL_COMPLETED, false, 0);
    for (int i = 0; i < 4; i++)
        tr[i].parent = P;
    tune_view_t v = {.t = &t, .trials = tr, .ntrials = 4, .next_trial = 0};
    tune_plan_t p;
    tune_decide(&v, &p);
    cr_assert_eq(p.end, TUNE_END_NONE, "a parent's failures and missing objective are not this job's: %s", p.reason);
    cr_assert_eq(p.nnew, 2, "the parent's trials take no slot");
    cr_assert_eq(p.best, 0, "the parent's best is the best before any trial");
    cr_assert_eq(tune_best(&v), 0);
    /* a trial that ties does not beat it; one that is better does */
    tune_trial_t own[6];
    own[0] = trial(0, TUNE_TRIAL_COMPLETED, true, 1.0);
    memcpy(&own[1], tr, sizeof tr[0] * 4);
    v.trials = own;
    v.ntrials = 5;
    v.next_trial = 1;
    cr_assert_eq(tune_best(&v), 1, "a tie keeps the parent's best");
    own[0].objective = 0.5;
    cr_assert_eq(tune_best(&v), 0, "beaten");
    /* no_improvement_trials counts this job's trials against the parent's bar */
    own[0].objective = 1.5;
    own[5] = trial(1, TUNE_TRIAL_COMPLETED, true, 1.2);
    /* order: own trials first as tune.c builds the view */
    tune_trial_t ord[6] = {own[0], own[5], own[1], own[2], own[3], own[4]};
    v.trials = ord;
    v.ntrials = 6;
    v.next_trial = 2;
    tune_decide(&v, &p);
    cr_assert_eq(p.end, TUNE_END_COMPLETED, "two own trials worse than the parent's 1.0: %s", p.reason);
    cr_assert(strstr(p.reason, "no improvement") && strstr(p.reason, "last 2"), "%s", p.reason);
    ord[1].objective = 0.8;
    tune_decide(&v, &p);
    cr_assert_eq(p.end, TUNE_END_NONE, "one beat the parent: %s", p.reason);
    cr_assert_eq(p.best, 1);
    spec_tuning_deinit(&t);

    /* the target: a parent's trial that reached it ends the search at once, naming it */
    parse(&t, "\"lr\": {\"type\": \"continuous\", \"min\": 1e-4, \"max\": 1e-2}",
          "\"completion\": {\"target_objective\": 1.0}");
    v = (tune_view_t){.t = &t, .trials = tr, .ntrials = 4, .next_trial = 0};
    tune_decide(&v, &p);
    cr_assert_eq(p.end, TUNE_END_COMPLETED);
    cr_assert(strstr(p.reason, "trial 0 of tuning job 7d1b8a44"), "%s", p.reason);
    spec_tuning_deinit(&t);
}

Test(tune_search, warm_start_median_rule_and_hyperband_rank_against_the_parents)
{
    spec_tuning_t t;
    const char *P = "7d1b8a44-0000-4000-8000-000000000001";
    parse(&t, "\"lr\": {\"type\": \"continuous\", \"min\": 1e-4, \"max\": 1e-2}",
          "\"max_jobs\": 10, \"max_parallel_jobs\": 2, \"early_stopping\": \"auto\"");
    /* three completed trials of the parent (median of the running averages up to step 30: 3.0) */
    static const double c0[] = {5, 4, 3}, c1[] = {3, 3, 3}, c2[] = {2, 2, 2}, bad[] = {4, 3.5, 3.2};
    tune_trial_t tr[4];
    tr[0] = trial(0, TUNE_TRIAL_ACTIVE, true, 3.2);
    curve(&tr[0], bad, 3, 100);
    tr[1] = trial(0, TUNE_TRIAL_COMPLETED, true, 3);
    tr[2] = trial(1, TUNE_TRIAL_COMPLETED, true, 3);
    tr[3] = trial(2, TUNE_TRIAL_COMPLETED, true, 2);
    curve(&tr[1], c0, 3, 100);
    curve(&tr[2], c1, 3, 100);
    curve(&tr[3], c2, 3, 100);
    for (int i = 1; i < 4; i++)
        tr[i].parent = P;
    tune_view_t v = {.t = &t, .trials = tr, .ntrials = 4, .next_trial = 1};
    tune_plan_t p;
    tune_decide(&v, &p);
    cr_assert_eq(p.nstop, 1, "the parent's completed trials are the median's history");
    cr_assert_eq(p.stop[0].index, 0);
    cr_assert_eq(p.stop[0].history, 3);
    spec_tuning_deinit(&t);

    /* hyperband: a new trial at rung 0 ranks against the parent's rung results */
    parse(&t, "\"lr\": {\"type\": \"continuous\", \"min\": 1e-4, \"max\": 1e-2}",
          "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 100, \"max_resource\": 900,"
          " \"reduction_factor\": 3}, \"max_jobs\": 30, \"max_parallel_jobs\": 2");
    tune_trial_t hb[3];
    hb[0] = trial(0, TUNE_TRIAL_PAUSED, true, 0);
    hb[0].nrungs = 1;
    hb[0].rung_objective[0] = 2.0;
    hb[1] = trial(0, TUNE_TRIAL_COMPLETED, true, 1.0);
    hb[2] = trial(1, TUNE_TRIAL_COMPLETED, true, 1.0);
    hb[1].nrungs = hb[2].nrungs = 1;
    hb[1].rung_objective[0] = 3.0;
    hb[2].rung_objective[0] = 2.5;
    hb[1].parent = hb[2].parent = P;
    v = (tune_view_t){.t = &t, .trials = hb, .ntrials = 3, .next_trial = 1};
    tune_decide(&v, &p);
    cr_assert_eq(p.npromote, 1, "the best of 3 at rung 0 (two of them the parent's) is promoted at once");
    cr_assert_eq(p.promote[0], 0);
    hb[0].rung_objective[0] = 2.7;
    tune_decide(&v, &p);
    cr_assert_eq(p.npromote, 0, "the parent's 2.5 ranks above it");
    spec_tuning_deinit(&t);
}

/* ---- TPE ------------------------------------------------------------------------------------- */

#define TPE_SPACE                                                                                    \
    "\"lr\": {\"type\": \"continuous\", \"min\": 1e-5, \"max\": 1e-1, \"scaling\": \"log\"},"         \
    " \"warmup_steps\": {\"type\": \"integer\", \"min\": 0, \"max\": 300},"                           \
    " \"model.n_embd\": {\"type\": \"categorical\", \"values\": [16, 32, 64]}"

/* TPE_SPACE for hyperband searches whose trials train 90 steps (max_resource): a warmup beyond
 * them is a value the trials' jobs would refuse, which the request is refused for. */
#define HB_TPE_SPACE                                                                                 \
    "\"lr\": {\"type\": \"continuous\", \"min\": 1e-5, \"max\": 1e-1, \"scaling\": \"log\"},"         \
    " \"warmup_steps\": {\"type\": \"integer\", \"min\": 0, \"max\": 90},"                            \
    " \"model.n_embd\": {\"type\": \"categorical\", \"values\": [16, 32, 64]}"

/* A synthetic objective with its optimum at lr = 1e-3, warmup 100, n_embd 32: a quadratic in
 * log10(lr), plus smaller terms for the others. */
static double synthetic(const json_t *v)
{
    double d = log10(json_number_value(json_object_get(v, "lr"))) + 3.0;
    double w = ((double)json_integer_value(json_object_get(v, "warmup_steps")) - 100.0) / 300.0;
    return d * d + w * w + (json_integer_value(json_object_get(v, "model.n_embd")) == 32 ? 0.0 : 0.5);
}

/* A sequential search of n trials of t (each ends before the next is drawn) on synthetic: vals
 * (n, caller decrefs) hold the values each trial was given. */
static void run_search(const spec_tuning_t *t, int n, json_t **vals)
{
    tune_trial_t *tr = calloc((size_t)n, sizeof *tr);
    cr_assert_not_null(tr);
    for (int i = 0; i < n; i++) {
        tune_view_t v = {.t = t, .trials = tr, .ntrials = i, .next_trial = i};
        vals[i] = tune_next_values(&v, i);
        cr_assert_not_null(vals[i]);
        tr[i] = (tune_trial_t){.trial = i, .state = TUNE_TRIAL_COMPLETED, .has_objective = true,
                               .objective = synthetic(vals[i]), .values = vals[i], .reported = "val_loss"};
    }
    free(tr);
}

Test(tune_search, tpe_startup_is_random_and_same_history_gives_same_values)
{
    spec_tuning_t t, r;
    parse(&t, TPE_SPACE, "\"strategy\": \"bayesian\", \"seed\": 3, \"max_jobs\": 40");
    parse(&r, TPE_SPACE, "\"seed\": 3, \"max_jobs\": 40");
    json_t *a[30], *b[30];
    run_search(&t, 30, a);
    run_search(&t, 30, b);
    int differs_from_random = 0;
    for (int i = 0; i < 30; i++) {
        cr_assert(json_equal(a[i], b[i]), "trial %d repeats for the same seed and history", i);
        json_t *rv = tune_trial_values(&r, i);
        if (i < TUNE_TPE_STARTUP)
            cr_assert(json_equal(a[i], rv), "startup trial %d is random search's draw", i);
        else
            differs_from_random += !json_equal(a[i], rv);
        json_decref(rv);
    }
    cr_assert_geq(differs_from_random, 15, "past the startup, TPE's values are not random's");
    /* another history: the same trial number gets other values */
    tune_trial_t tr[20];
    for (int i = 0; i < 20; i++)
        tr[i] = (tune_trial_t){.trial = i, .state = TUNE_TRIAL_COMPLETED, .has_objective = true,
                               .objective = synthetic(a[i]), .values = a[i]};
    tune_view_t v = {.t = &t, .trials = tr, .ntrials = 20, .next_trial = 20};
    json_t *x = tune_next_values(&v, 20), *y = tune_next_values(&v, 20);
    cr_assert(json_equal(x, y));
    for (int i = 0; i < 20; i++)
        tr[i].objective = -synthetic(a[i]); /* the worst are now the best */
    json_t *z = tune_next_values(&v, 20);
    cr_assert(!json_equal(x, z), "a different history moves the draw");
    /* a trial that failed, or runs, is not an observation */
    tr[19].state = TUNE_TRIAL_FAILED;
    tune_obs_t obs[20];
    cr_assert_eq(tune_tpe_history(&v, obs), 19);
    tr[18].state = TUNE_TRIAL_ACTIVE;
    tr[17].state = TUNE_TRIAL_STOPPED;
    cr_assert_eq(tune_tpe_history(&v, obs), 18);
    cr_assert(obs[17].partial && !obs[0].partial, "a trial stopped early ranks after the finished ones");
    json_decref(x);
    json_decref(y);
    json_decref(z);
    for (int i = 0; i < 30; i++) {
        json_decref(a[i]);
        json_decref(b[i]);
    }
    spec_tuning_deinit(&t);
    spec_tuning_deinit(&r);
}

Test(tune_search, tpe_keeps_to_ranges_scalings_and_categoricals)
{
    spec_tuning_t t;
    parse(&t, "\"lr\": {\"type\": \"continuous\", \"min\": 1e-4, \"max\": 1e-2, \"scaling\": \"log\"},"
              " \"beta2\": {\"type\": \"continuous\", \"min\": 0.9, \"max\": 0.9999, \"scaling\": \"reverse_log\"},"
              " \"model.n_layer\": {\"type\": \"integer\", \"min\": 1, \"max\": 4},"
              " \"warmup_steps\": {\"type\": \"integer\", \"min\": 1, \"max\": 1000, \"scaling\": \"log\"},"
              " \"model.n_embd\": {\"type\": \"categorical\", \"values\": [16, 32, 64]}",
          "\"strategy\": \"bayesian\", \"seed\": 9");
    tune_trial_t tr[40];
    json_t *vals[40];
    int cat[3] = {0};
    for (int i = 0; i < 40; i++) {
        tune_view_t v = {.t = &t, .trials = tr, .ntrials = i, .next_trial = i};
        vals[i] = tune_next_values(&v, i);
        const json_t *x = vals[i];
        double lr = json_number_value(json_object_get(x, "lr")), b2 = json_number_value(json_object_get(x, "beta2"));
        cr_assert(lr >= 1e-4 && lr <= 1e-2, "%g", lr);
        cr_assert(b2 >= 0.9 && b2 <= 0.9999, "%g", b2);
        cr_assert(written_as_read(lr) && written_as_read(b2), "%.17g %.17g", lr, b2);
        cr_assert(json_is_integer(json_object_get(x, "warmup_steps")) && json_is_integer(json_object_get(x, "model.n_layer")));
        json_int_t nl = json_integer_value(json_object_get(x, "model.n_layer")),
                   w = json_integer_value(json_object_get(x, "warmup_steps")),
                   e = json_integer_value(json_object_get(x, "model.n_embd"));
        cr_assert(nl >= 1 && nl <= 4 && w >= 1 && w <= 1000, "%lld %lld", (long long)nl, (long long)w);
        cr_assert(e == 16 || e == 32 || e == 64, "%lld", (long long)e);
        /* an objective that wants lr and 1 - beta2 small on their log scales, and n_embd 64 */
        tr[i] = (tune_trial_t){.trial = i, .state = TUNE_TRIAL_COMPLETED, .has_objective = true,
                               .objective = log(lr) + log(1 - b2) + (e == 64 ? 0 : 3), .values = vals[i]};
        if (i >= TUNE_TPE_STARTUP)
            cat[e == 16 ? 0 : e == 32 ? 1 : 2]++;
    }
    cr_assert_gt(cat[2], cat[0] + cat[1], "the better category is drawn most: %d %d %d", cat[0], cat[1], cat[2]);
    for (int i = 0; i < 40; i++)
        json_decref(vals[i]);
    spec_tuning_deinit(&t);
}

Test(tune_search, tpe_concentrates_near_the_optimum_more_than_random_draws)
{
    /* over 8 seeds, trials 15..39 of TPE against random search's: their distance to the optimum
     * in log10(lr), and the best objective found */
    double tpe_dist = 0, rnd_dist = 0;
    int tpe_closer = 0, tpe_best_better = 0;
    for (int seed = 1; seed <= 8; seed++) {
        spec_tuning_t t, r;
        char extra[96];
        snprintf(extra, sizeof extra, "\"strategy\": \"bayesian\", \"seed\": %d, \"max_jobs\": 40", seed);
        parse(&t, TPE_SPACE, extra);
        snprintf(extra, sizeof extra, "\"seed\": %d, \"max_jobs\": 40", seed);
        parse(&r, TPE_SPACE, extra);
        json_t *a[40], *b[40];
        run_search(&t, 40, a);
        run_search(&r, 40, b);
        double dt = 0, dr = 0, bt = INFINITY, br = INFINITY;
        for (int i = 0; i < 40; i++) {
            bt = fmin(bt, synthetic(a[i]));
            br = fmin(br, synthetic(b[i]));
            if (i >= 15) {
                dt += fabs(log10(json_number_value(json_object_get(a[i], "lr"))) + 3.0);
                dr += fabs(log10(json_number_value(json_object_get(b[i], "lr"))) + 3.0);
            }
            json_decref(a[i]);
            json_decref(b[i]);
        }
        tpe_dist += dt;
        rnd_dist += dr;
        tpe_closer += dt < dr;
        tpe_best_better += bt < br;
        spec_tuning_deinit(&t);
        spec_tuning_deinit(&r);
    }
    cr_assert_lt(tpe_dist, 0.6 * rnd_dist, "TPE's later trials are nearer the optimum: %.2f vs random's %.2f",
                 tpe_dist, rnd_dist);
    cr_assert_geq(tpe_closer, 7, "nearer on %d of 8 seeds", tpe_closer);
    cr_assert_geq(tpe_best_better, 6, "a better best on %d of 8 seeds", tpe_best_better);
}

Test(tune_search, hyperband_tpe_learns_from_every_trial_with_a_rung_ranked_by_the_rung)
{
    spec_tuning_t t, plain, two;
    const char *hb = "\"strategy\": \"hyperband\", \"seed\": 4, \"max_jobs\": 100, \"max_parallel_jobs\": 4,"
                     " \"hyperband\": {\"min_resource\": 10, \"max_resource\": 90, \"sampler\": \"tpe\"}";
    parse(&t, HB_TPE_SPACE, hb);
    parse(&plain, HB_TPE_SPACE, "\"strategy\": \"hyperband\", \"seed\": 4, \"max_jobs\": 100,"
                             " \"hyperband\": {\"min_resource\": 10, \"max_resource\": 90}");
    parse(&two, HB_TPE_SPACE, "\"strategy\": \"hyperband\", \"seed\": 4, \"max_jobs\": 100,"
                           " \"hyperband\": {\"min_resource\": 10, \"max_resource\": 90, \"brackets\": 2,"
                           " \"sampler\": \"tpe\"}");
    json_t *norm = spec_tuning_to_json(&t);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(norm, "hyperband"), "sampler")), "tpe");
    json_decref(norm);
    tune_trial_t tr[30];
    json_t *vals[30];
    for (int i = 0; i < 30; i++) {
        vals[i] = tune_trial_values(&t, i);
        double f = synthetic(vals[i]);
        /* rung 0 (10 steps): every trial; rung 1 (30): the first 12; the top (90): 4 completed */
        tr[i] = (tune_trial_t){.trial = i, .state = TUNE_TRIAL_PAUSED, .has_objective = true, .objective = f + 1,
                               .values = vals[i], .nrungs = 1, .rung_objective = {f + 2}};
        if (i < 12) {
            tr[i].nrungs = 2;
            tr[i].rung_objective[1] = f + 1;
        }
        if (i < 4) {
            tr[i].state = TUNE_TRIAL_COMPLETED;
            tr[i].objective = f;
        }
    }
    tr[12].state = TUNE_TRIAL_ACTIVE; /* promoted, running to rung 1: it keeps its rung 0 result */
    tr[13].state = TUNE_TRIAL_STOPPED;
    tr[14].state = TUNE_TRIAL_FAILED; /* not an observation */
    tr[15].state = TUNE_TRIAL_ACTIVE; /* its first rung still running: no result yet */
    tr[15].nrungs = 0;
    tune_view_t v = {.t = &t, .trials = tr, .ntrials = 30, .next_trial = 30};
    tune_obs_t obs[30];
    cr_assert_eq(tune_tpe_history(&v, obs), 28, "every trial with a result but the failed one");
    cr_assert(!obs[0].partial && obs[0].objective == tr[0].objective, "a completed trial at its final objective");
    cr_assert(obs[4].partial && obs[4].rung == 1 && obs[4].objective == tr[4].rung_objective[1],
              "a paused trial at its highest rung's objective");
    cr_assert(obs[12].partial && obs[12].rung == 0 && obs[12].objective == tr[12].rung_objective[0]);
    cr_assert(obs[13].partial && obs[13].objective == tr[13].rung_objective[0]);
    cr_assert(obs[14].values == tr[16].values, "the failed and the unfinished trials are left out");
    /* TPE starts at 10 trials with a result, wherever they are: 9 are not enough */
    v.ntrials = 9;
    cr_assert_eq(tune_tpe_history(&v, obs), 9);
    json_t *x = tune_next_values(&v, 9), *y = tune_trial_values(&t, 9);
    cr_assert(json_equal(x, y));
    json_decref(x);
    json_decref(y);
    v.ntrials = 30;
    x = tune_next_values(&v, 30);
    y = tune_trial_values(&t, 30);
    cr_assert(!json_equal(x, y), "with enough results the draw is TPE's");
    json_decref(x);
    json_decref(y);
    /* two brackets: 6 trials at rung 0 and 4 of bracket 1 at rung 1 (its first) are 10 results,
     * though no rung has 10 of them (BOHB's rule would still draw at random) */
    tune_trial_t b2[10];
    for (int i = 0; i < 10; i++)
        b2[i] = (tune_trial_t){.trial = i, .state = TUNE_TRIAL_PAUSED, .has_objective = true,
                               .objective = synthetic(vals[i]), .values = vals[i], .nrungs = 1,
                               .rung_objective = {synthetic(vals[i])}, .bracket = i < 6 ? 0 : 1};
    tune_view_t w = {.t = &two, .trials = b2, .ntrials = 10, .next_trial = 10};
    cr_assert_eq(tune_tpe_history(&w, obs), 10);
    cr_assert(obs[6].rung == 1 && obs[0].rung == 0, "a bracket 1 trial's first rung is rung 1");
    x = tune_next_values(&w, 10);
    y = tune_trial_values(&two, 10);
    cr_assert(!json_equal(x, y), "10 results across the rungs: the draw is TPE's");
    json_decref(x);
    json_decref(y);
    /* sampler random: no history, random's draws */
    v.t = &plain;
    cr_assert_eq(tune_tpe_history(&v, obs), 0);
    for (int i = 0; i < 30; i++)
        json_decref(vals[i]);
    spec_tuning_deinit(&t);
    spec_tuning_deinit(&plain);
    spec_tuning_deinit(&two);
}

Test(tune_search, tpe_ranks_a_higher_rung_before_a_better_value_at_a_lower_one)
{
    /* 10 observations near lr 1e-2 at rung 1 with objective 5, 10 near lr 1e-4 at rung 0 with
     * objective 1 (a lower rung's values are not comparable with a higher's): l is the best
     * 2 (ceil(20 / 10)), which are rung 1's, so TPE draws near 1e-2, not 1e-4 */
    spec_tuning_t t;
    parse(&t, HB_TPE_SPACE, "\"strategy\": \"hyperband\", \"seed\": 5, \"hyperband\": {\"min_resource\": 10,"
                         " \"max_resource\": 90, \"sampler\": \"tpe\"}");
    json_t *vals[20];
    tune_obs_t obs[20];
    for (int i = 0; i < 20; i++) {
        bool high = i % 2 == 0;
        vals[i] = json_pack("{s:f, s:i, s:i}", "lr", (high ? 1e-2 : 1e-4) * (1.0 + 0.01 * i), "warmup_steps", 50,
                            "model.n_embd", 32);
        obs[i] = (tune_obs_t){.values = vals[i], .objective = (high ? 5.0 : 1.0) + 0.01 * i, .partial = true,
                              .rung = high ? 1 : 0};
    }
    int near_high = 0;
    for (int n = 20; n < 40; n++) {
        json_t *x = tune_tpe_values(&t, n, obs, 20);
        cr_assert_not_null(x);
        near_high += fabs(log10(json_number_value(json_object_get(x, "lr"))) + 2.0) < 1.0;
        json_decref(x);
    }
    cr_assert_geq(near_high, 15, "%d of 20 draws within a decade of 1e-2", near_high);
    for (int i = 0; i < 20; i++)
        json_decref(vals[i]);
    spec_tuning_deinit(&t);
}

Test(tune_search, tpe_learns_from_a_warm_start_parents_trials)
{
    spec_tuning_t t;
    parse(&t, TPE_SPACE, "\"strategy\": \"bayesian\", \"seed\": 6");
    spec_tuning_t r;
    parse(&r, TPE_SPACE, "\"seed\": 6");
    tune_trial_t tr[12];
    json_t *vals[12];
    for (int i = 0; i < 12; i++) {
        vals[i] = tune_trial_values(&r, 100 + i);
        tr[i] = (tune_trial_t){.trial = i, .state = TUNE_TRIAL_COMPLETED, .has_objective = true,
                               .objective = synthetic(vals[i]), .values = vals[i], .parent = "p"};
    }
    /* this job's trial 0, with 12 parents' trials as history: TPE at once, not a startup draw */
    tune_view_t v = {.t = &t, .trials = tr, .ntrials = 12, .next_trial = 0};
    json_t *x = tune_next_values(&v, 0), *y = tune_trial_values(&t, 0);
    cr_assert(!json_equal(x, y));
    json_decref(x);
    json_decref(y);
    for (int i = 0; i < 12; i++)
        json_decref(vals[i]);
    spec_tuning_deinit(&t);
    spec_tuning_deinit(&r);
}

Test(tune_search, log_scaled_integers_statistically)
{
    /* an integer of [1, 8] on a log scale: integer k gets the share of log(x) over its cell
     * [k - 0.5, k + 0.5) of [0.5, 8.5) (the lowest cell starts at min / 2, so that min keeps a
     * cell of its own above 0): 1 gets log(3) / log(17), about 39%, 8 about 4.4% */
    spec_tuning_t t;
    parse(&t, "\"warmup_steps\": {\"type\": \"integer\", \"min\": 1, \"max\": 8, \"scaling\": \"log\"}",
          "\"seed\": 3");
    int n = 4000, seen[9] = {0};
    for (int i = 0; i < n; i++) {
        json_t *v = tune_trial_values(&t, i);
        json_t *b = json_object_get(v, "warmup_steps");
        cr_assert(json_is_integer(b));
        json_int_t k = json_integer_value(b);
        cr_assert(k >= 1 && k <= 8, "%lld", (long long)k);
        seen[k]++;
        json_decref(v);
    }
    for (int k = 1; k <= 8; k++) {
        double p = (log(k + 0.5) - log(k - 0.5)) / log(17.0), want = n * p, sd = sqrt(n * p * (1 - p));
        cr_assert(fabs(seen[k] - want) < 5 * sd, "integer %d drew %d of %d, want about %.0f", k, seen[k], n, want);
    }
    spec_tuning_deinit(&t);
}

Test(tune_search, hyperband_ties_at_a_rung_promote_no_more_than_the_top_third)
{
    /* three trials at rung 0, two of them equal and best: the top third is one trial, the lower
     * trial number of the two, not both */
    spec_tuning_t t;
    parse(&t, "\"lr\": {\"type\": \"continuous\", \"min\": 1e-4, \"max\": 1e-2}",
          "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 100, \"max_resource\": 900,"
          " \"reduction_factor\": 3}, \"max_jobs\": 3, \"max_parallel_jobs\": 3");
    tune_trial_t tr[3];
    double obj[3] = {2.0, 1.0, 1.0};
    for (int i = 0; i < 3; i++) {
        tr[i] = trial(i, TUNE_TRIAL_PAUSED, true, obj[i]);
        tr[i].nrungs = 1;
        tr[i].rung_objective[0] = obj[i];
    }
    tune_view_t v = {.t = &t, .trials = tr, .ntrials = 3, .next_trial = 3};
    tune_plan_t p;
    tune_decide(&v, &p);
    cr_assert_eq(p.npromote, 1, "a tie ranks by trial number: %d promoted", p.npromote);
    cr_assert_eq(p.promote[0], 1);
    spec_tuning_deinit(&t);
}

Test(tune_search, thirty_parameters_are_not_too_many)
{
    /* SageMaker's limit, 30: thirty parameters pass the count (these are then refused naming the
     * first one the base job lacks), thirty-one are refused for their number */
    for (int n = 30; n <= 31; n++) {
        char params[4096] = "", buf[8192];
        for (int i = 0; i < n; i++)
            snprintf(params + strlen(params), sizeof params - strlen(params),
                     "%s\"p%d\": {\"type\": \"integer\", \"min\": 0, \"max\": 1}", i ? ", " : "", i);
        snprintf(buf, sizeof buf,
                 "{\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8},"
                 " \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 2000}},"
                 " \"parameters\": {%s}, \"objective\": {\"metric\": \"val_loss\"}}", params);
        json_t *j = json_loads(buf, 0, NULL);
        cr_assert_not_null(j);
        spec_tuning_t t;
        kiln_err_t err;
        cr_assert_eq(spec_tuning_parse(j, &t, &err), KILN_EINVAL);
        if (n == 30)
            cr_assert(!strcmp(err.field, "parameters.p0") && !strstr(err.message, "at most"), "30 parameters: %s: %s",
                      err.field, err.message);
        else
            cr_assert(!strcmp(err.field, "parameters") && strstr(err.message, "at most 30"), "31 parameters: %s: %s",
                      err.field, err.message);
        json_decref(j);
    }
}

/* Hyperband over a script job (spec_tuning_parse): accepted when the script's
 * hyperparameters.max_steps, the step count it trains to, reaches max_resource; its trials then
 * train to max_resource and pause at their rungs (stopping.max_steps: KILN_PAUSE_AT_STEP).
 * Refused, naming job.hyperparameters.max_steps, without one or below max_resource. */
static int parse_script_hyperband(const char *hp, spec_tuning_t *t, kiln_err_t *err)
{
    char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"job\": {\"entry_point\": \"train.py\", \"source\": \"/tmp\", \"hyperparameters\": {%s}},"
             " \"parameters\": {\"lr\": {\"type\": \"continuous\", \"min\": 0.001, \"max\": 0.1}},"
             " \"objective\": {\"metric\": \"val_loss\"}, \"strategy\": \"hyperband\","
             " \"hyperband\": {\"min_resource\": 100, \"max_resource\": 900}, \"max_jobs\": 9}", hp);
    json_error_t je;
    json_t *j = json_loads(buf, 0, &je);
    cr_assert_not_null(j, "%s", je.text);
    int rc = spec_tuning_parse(j, t, err);
    json_decref(j);
    return rc;
}

Test(tune_search, hyperband_over_a_script_job_needs_its_max_steps_to_reach_max_resource)
{
    spec_tuning_t t;
    kiln_err_t err;
    cr_assert_eq(parse_script_hyperband("\"lr\": 0.01, \"max_steps\": 900", &t, &err), 0, "%s: %s", err.field,
                 err.message);
    cr_assert(t.script);
    json_t *v = json_pack("{s:f}", "lr", 0.01);
    json_t *trial = spec_tuning_trial_spec(&t, v, "s-0", NULL);
    cr_assert_not_null(trial);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(trial, "stopping"), "max_steps")), 100,
                 "a trial pauses at the first rung");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(trial, "hyperparameters"), "max_steps")), 900);
    spec_t sp;
    cr_assert_eq(spec_parse(trial, &sp, &err), 0, "a trial's spec is a valid script job: %s", err.message);
    cr_assert_eq(sp.pause_at_step, 100);
    spec_deinit(&sp);
    json_decref(trial);
    json_decref(v);
    spec_tuning_deinit(&t);
    cr_assert_eq(parse_script_hyperband("\"lr\": 0.01, \"max_steps\": 5000", &t, &err), 0, "%s", err.message);
    spec_tuning_deinit(&t);

    cr_assert_eq(parse_script_hyperband("\"lr\": 0.01", &t, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "job.hyperparameters.max_steps");
    cr_assert(strstr(err.message, "this one has none") && strstr(err.hint, "KILN_PAUSE_AT_STEP"), "%s / %s",
              err.message, err.hint);
    cr_assert_eq(parse_script_hyperband("\"lr\": 0.01, \"max_steps\": 899", &t, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "job.hyperparameters.max_steps");
    cr_assert(strstr(err.message, "max_resource (900) is past the script's hyperparameters.max_steps (899)"), "%s",
              err.message);
    cr_assert_eq(parse_script_hyperband("\"lr\": 0.01, \"max_steps\": \"900\"", &t, &err), KILN_EINVAL,
                 "a string is not a step count");
}

/* A stored request is read back without trying the job validator on its values again
 * (spec_tuning_load): submission tried them, and a read (every controller pass, every GET) would
 * pay one job validation per categorical value and range end. Everything else is read as
 * spec_tuning_parse reads it. */
Test(tune_search, a_stored_request_is_read_without_trying_its_values_again)
{
    spec_tuning_t t;
    parse(&t, "\"model.n_head\": {\"type\": \"categorical\", \"values\": [2, 4]}", "\"max_jobs\": 4, \"seed\": 3");
    json_t *stored = spec_tuning_to_json(&t);
    spec_tuning_deinit(&t);
    /* a value the job validator refuses (n_head 5 does not divide n_embd 16) */
    json_array_append_new(json_object_get(json_object_get(json_object_get(stored, "parameters"), "model.n_head"),
                                          "values"),
                          json_integer(5));
    kiln_err_t err;
    cr_assert_eq(spec_tuning_parse(stored, &t, &err), KILN_EINVAL, "submission tries every value");
    cr_assert_str_eq(err.field, "parameters.model.n_head.values[2]", "%s", err.message);
    cr_assert_eq(spec_tuning_load(stored, &t, &err), 0, "%s: %s", err.field, err.message);
    cr_assert(t.stored);
    cr_assert_eq(json_array_size(t.params[0].values), 3);
    cr_assert_eq(t.max_jobs, 4);
    cr_assert_eq(t.seed, 3);
    spec_tuning_deinit(&t);
    /* what is not a value's trial is still checked */
    json_object_set_new(stored, "max_jobs", json_integer(0));
    cr_assert_eq(spec_tuning_load(stored, &t, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "max_jobs", "%s", err.message);
    json_decref(stored);
}
