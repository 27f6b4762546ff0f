/* test_regex.c - regex metrics (a job's metric_definitions) end to end, with a real kilnd, real
 * agents and a real kiln-train job: a match lands at the step of the line that matched it, each
 * step once, with the time of its line, and its summary counts exactly its points; a regex's
 * group named "step" gives the step itself; a step group that can never capture one is a 400. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/e2e/e2e.h"

#define STEPS 300
#define EVAL_EVERY 50

/* The points of metric name (every attempt), as returned by the API (caller owns). */
static json_t *points_of(const char *id, const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?name=%s&max_points=100000", id, name);
    json_t *m = e2e_get(path);
    json_t *series = json_object_get(m, "metrics");
    cr_assert_eq(json_array_size(series), 1, "%s: %s", name, e2e_dump(m));
    json_t *pts = json_incref(json_object_get(json_array_get(series, 0), "points"));
    json_decref(m);
    return pts;
}

/* value[step] of metric name, for steps 1..STEPS (NAN where there is none). */
static void values_by_step(const char *id, const char *name, double *value)
{
    for (int s = 0; s <= STEPS; s++)
        value[s] = NAN;
    json_t *pts = points_of(id, name);
    size_t i;
    json_t *pt;
    json_array_foreach(pts, i, pt) {
        json_int_t s = e2e_jint(pt, "step");
        cr_assert(s >= 1 && s <= STEPS, "%s at step %lld", name, (long long)s);
        value[s] = json_number_value(json_object_get(pt, "value"));
    }
    json_decref(pts);
}

/* Checks a regex metric's points: exactly the steps want[0..nwant), once each, at rank 0 and
 * attempt 1, each value what kiln-train printed (4 decimals) of the exact one it recorded
 * (exact[step]), each time the time of the log line of its step (line_us[step]); and its
 * summary: count nwant, last step want[nwant - 1]. */
static void check_regex_metric(const char *id, const json_t *summaries, const char *name, const int *want,
                               size_t nwant, const double *exact, const json_int_t *line_us)
{
    json_t *pts = points_of(id, name);
    cr_assert_eq(json_array_size(pts), nwant, "%s: %zu points, want %zu: %s", name, json_array_size(pts), nwant,
                 e2e_dump(pts));
    static bool seen[STEPS + 1];
    memset(seen, 0, sizeof seen);
    size_t i;
    json_t *pt;
    json_array_foreach(pts, i, pt) {
        json_int_t s = e2e_jint(pt, "step");
        cr_assert(s >= 1 && s <= STEPS, "%s: a point at step %lld", name, (long long)s);
        cr_assert_not(seen[s], "%s: step %lld twice", name, (long long)s);
        seen[s] = true;
        cr_assert_eq(e2e_jint(pt, "rank"), 0);
        cr_assert_eq(e2e_jint(pt, "attempt"), 1);
        double v = json_number_value(json_object_get(pt, "value"));
        cr_assert(isfinite(exact[s]) && fabs(v - exact[s]) <= 5.1e-5,
                  "%s at step %lld is %.4f, but the engine's value there is %.6f: not the step of its line", name,
                  (long long)s, v, exact[s]);
        cr_assert_eq(e2e_jint(pt, "time_us"), line_us[s], "%s at step %lld: time %lld, its line's %lld", name,
                     (long long)s, (long long)e2e_jint(pt, "time_us"), (long long)line_us[s]);
    }
    for (size_t k = 0; k < nwant; k++)
        cr_assert(seen[want[k]], "%s: no point at step %d", name, want[k]);
    json_decref(pts);
    json_t *sum = json_object_get(summaries, name);
    cr_assert_not_null(sum, "no summary of %s", name);
    cr_assert_eq(e2e_jint(sum, "count"), (json_int_t)nwant, "%s: summary %s", name, e2e_dump(sum));
    cr_assert_eq(e2e_jint(sum, "last_step"), want[nwant - 1], "%s: summary %s", name, e2e_dump(sum));
}

Test(e2e_regex, regex_metrics_land_at_the_step_of_their_line_once, .init = e2e_setup, .fini = e2e_teardown,
     .timeout = 240)
{
    char *text = e2e_spec("e2e-regex", STEPS, 1, 1, 4);
    json_t *spec = json_loads(text, 0, NULL);
    free(text);
    json_object_set_new(json_object_get(spec, "hyperparameters"), "eval_every", json_integer(EVAL_EVERY));
    /* over what kiln-train prints: "step 12/300 | loss 4.1234 | lr ..." every step and
     * "step 50 | val loss 3.9876" every EVAL_EVERY steps */
    json_object_set_new(spec, "metric_definitions",
                        json_pack("[{s:s, s:s}, {s:s, s:s}, {s:s, s:s}]",
                                  "name", "loss_re", "regex", "\\| loss ([0-9.]+) \\|",
                                  "name", "loss_at", "regex", "^step (?<step>[0-9]+)/[0-9]+ \\| loss ([0-9.]+)",
                                  "name", "val_re", "regex", "\\| val loss ([0-9.]+)"));
    text = json_dumps(spec, JSON_COMPACT);
    json_t *job = e2e_submit(text);
    free(text);
    char id[64];
    snprintf(id, sizeof id, "%s", e2e_jstr(job, "id"));
    json_decref(job);

    /* a step group that can never capture a step: 400 naming the field, nothing created */
    json_object_set_new(spec, "metric_definitions",
                        json_pack("[{s:s, s:s}]", "name", "x", "regex", "step (?<step>[a-z]+) ([0-9.]+)"));
    text = json_dumps(spec, JSON_COMPACT);
    long st = 0;
    json_t *r = e2e_http("POST", "/v1/jobs", text, NULL, &st);
    cr_assert_eq(st, 400, "%s", e2e_dump(r));
    cr_assert_str_eq(e2e_jstr(r, "field"), "metric_definitions[0].regex", "%s", e2e_dump(r));
    cr_assert(strstr(e2e_jstr(r, "message"), "step"), "%s", e2e_dump(r));
    json_decref(r);
    free(text);
    json_decref(spec);

    job = e2e_wait_state(id, "COMPLETED", 180000);
    json_t *summaries = json_incref(json_object_get(job, "summaries"));
    json_decref(job);

    /* the log: one "step N/300 | loss" line per step, its time; no step mark (those are the
     * agent's, not the job's) */
    static json_int_t line_us[STEPS + 1], val_us[STEPS + 1];
    memset(line_us, 0, sizeof line_us);
    memset(val_us, 0, sizeof val_us);
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?limit=10000", id);
    json_t *logs = e2e_get(path);
    size_t i;
    json_t *l;
    json_array_foreach(json_object_get(logs, "lines"), i, l) {
        const char *line = e2e_jstr(l, "line");
        cr_assert_null(strchr(line, '\x1e'), "a step mark reached the job's log: %s", e2e_dump(l));
        cr_assert_null(strstr(line, "kiln-step"), "a step mark reached the job's log: %s", e2e_dump(l));
        cr_assert_null(strstr(line, "[kiln-agent] metric_definitions"), "a match was left out: %s", line);
        long long s = 0, of = 0;
        if (sscanf(line, "step %lld/%lld | loss", &s, &of) == 2 && of == STEPS) {
            cr_assert(s >= 1 && s <= STEPS && !line_us[s], "%s", line);
            line_us[s] = e2e_jint(l, "time_us");
        } else if (sscanf(line, "step %lld | val loss", &s) == 1) {
            cr_assert(s >= 1 && s <= STEPS && !val_us[s], "%s", line);
            val_us[s] = e2e_jint(l, "time_us");
        }
    }
    json_decref(logs);
    for (int s = 1; s <= STEPS; s++)
        cr_assert_gt(line_us[s], 0, "no log line of step %d", s);

    /* what kiln-train recorded (metric records, exact) is what each regex point must show */
    static double train_loss[STEPS + 1], val_loss[STEPS + 1];
    values_by_step(id, "train_loss", train_loss);
    values_by_step(id, "val_loss", val_loss);
    static int every[STEPS];
    for (int s = 1; s <= STEPS; s++)
        every[s - 1] = s;
    check_regex_metric(id, summaries, "loss_re", every, STEPS, train_loss, line_us);  /* the step marks */
    check_regex_metric(id, summaries, "loss_at", every, STEPS, train_loss, line_us);  /* the step group */
    /* a line printed every EVAL_EVERY steps lands at its step: 50, 100, ..., which no count of
     * matches could give */
    int evals[STEPS / EVAL_EVERY];
    for (int k = 0; k < STEPS / EVAL_EVERY; k++)
        evals[k] = (k + 1) * EVAL_EVERY;
    check_regex_metric(id, summaries, "val_re", evals, STEPS / EVAL_EVERY, val_loss, val_us);
    json_decref(summaries);
    e2e_pass();
}
