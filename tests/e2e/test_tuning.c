/* test_tuning.c - a tuning job end to end: the `kiln tune` CLI against a real kilnd and two real
 * agents training tiny GPT trials. A seeded random search run twice gives the same trials, each
 * trained the same (the same val_loss), the second time round as the first; describe prints the
 * trials table and the best trial; a third, warm-started from the first with the same seed, draws
 * none of its trials and describe shows the parent. With script trials (a shell script in a data root whose loss
 * is its hyperparameter): early_stopping "auto" stops the trial worse than the median, and a
 * search whose kilnd is SIGKILLed mid-flight carries on after the restart with the same trials,
 * and a bayesian (TPE) search runs past its random startup to the end.
 * Trials are preemptible work: an ordinary job submitted to a cluster full of them preempts one,
 * which resumes from its checkpoint afterwards, and the search completes. A seeded hyperband run
 * twice gives the same trials (values, rungs, objectives, promotion); one whose objective metric
 * is never reported ends when its first trial pauses at its first rung, with the reason. The CLI
 * names a search by a prefix of its id or its name, on any page of the list, lists every page, and
 * sends a base job's relative data path whole. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <libpq-fe.h>
#include <math.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "base/tuning_states.h"
#include "tests/e2e/e2e.h"

/* Polls the tuning job until it has ended; fails after timeout_ms. Caller owns the result. */
static json_t *wait_ended(const char *id, long timeout_ms)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/tuning-jobs/%s", id);
    int64_t t0 = kiln_mono_us();
    for (;;) {
        json_t *t = e2e_get(path);
        const char *st = e2e_jstr(t, "state");
        if (kiln_tuning_ended(st))
            return t;
        if ((kiln_mono_us() - t0) / 1000 > timeout_ms)
            cr_assert_fail("tuning job %s did not end: %s", id, e2e_dump(t));
        json_decref(t);
        struct timespec pause = {0, 100 * 1000000};
        nanosleep(&pause, NULL); /* polls the condition: the trials train meanwhile */
    }
}

/* Writes script text as <cluster dir>/shared-checkpoints/<name>/trial.sh (a data root of both
 * agents, so the sandbox shows it to the ranks); the directory's path into dir. */
static void script_trial(const char *name, const char *text, char *dir, size_t n)
{
    snprintf(dir, n, "%.200s/shared-checkpoints/%s", e2e_cl->dir, name);
    cr_assert(mkdir(dir, 0755) == 0 || access(dir, F_OK) == 0, "mkdir %s", dir);
    chmod(dir, 0755);
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/trial.sh", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
    chmod(path, 0644);
}

/* POST /v1/tuning-jobs with body, which must be created (201): the tuning job's id (caller frees). */
static char *tuning_created(const char *body)
{
    long st = 0;
    json_t *r = e2e_http("POST", "/v1/tuning-jobs", body, NULL, &st);
    cr_assert_eq(st, 201, "%ld %s", st, e2e_dump(r));
    char *id = strdup(e2e_jstr(r, "id"));
    json_decref(r);
    return id;
}

/* POST /v1/tuning-jobs over a grid of the script job in dir whose hyperparameter "loss" takes
 * values (a JSON array), extra members after; returns the id (caller frees). */
static char *submit_script_grid(const char *dir, const char *values, const char *extra)
{
    char body[PATH_MAX + 2048];
    snprintf(body, sizeof body,
             "{\"name\": \"script-grid\", \"job\": {\"name\": \"t\", \"entry_point\": \"trial.sh\", \"source\": \"%s\","
             " \"retry\": {\"max_attempts\": 1}, \"hyperparameters\": {\"loss\": 1},"
             " \"resources\": {\"nodes\": 1, \"slots_per_node\": 1, \"slot_type\": \"cpu\"},"
             " \"metric_definitions\": [{\"name\": \"loss\", \"regex\": \"^step (?<step>[0-9]+) loss ([0-9.]+)\"}]},"
             " \"parameters\": {\"loss\": {\"type\": \"categorical\", \"values\": %s}},"
             " \"objective\": {\"metric\": \"loss\", \"goal\": \"minimize\"}, \"strategy\": \"grid\"%s%s}",
             dir, values, extra ? ", " : "", extra ? extra : "");
    return tuning_created(body);
}

/* Polls the tuning job until it has n trials (each in state, when not NULL); returns it (caller
 * owns) or fails after 120 s. */
static json_t *wait_trials(const char *id, size_t n, const char *state)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/tuning-jobs/%s", id);
    for (int k = 0;; k++) {
        json_t *t = e2e_get(path);
        json_t *tr = json_object_get(t, "trials");
        bool all = json_array_size(tr) == n;
        for (size_t i = 0; all && state && i < n; i++)
            all = !strcmp(e2e_jstr(json_array_get(tr, i), "state"), state);
        if (all)
            return t;
        if (k == 1200)
            cr_assert_fail("tuning job %s never had %zu trials %s: %s", id, n, state ? state : "", e2e_dump(t));
        json_decref(t);
        usleep(100000);
    }
}

/* kiln tune submit FILE: returns the id it printed (caller frees). */
static char *submit(const char *file)
{
    char *out = NULL, *err = NULL;
    int rc = e2e_kiln(&out, &err, "tune", "submit", file, NULL);
    cr_assert_eq(rc, 0, "kiln tune submit: %s %s", out, err);
    char id[64] = "";
    const char *p = strstr(out, "id:");
    cr_assert(p && sscanf(p + 3, "%63s", id) == 1, "%s", out);
    free(out);
    free(err);
    return strdup(id);
}

Test(e2e_tuning, seeded_random_search_repeats_through_the_cli, .init = e2e_setup, .fini = e2e_teardown,
     .timeout = 300)
{
    char *job = e2e_spec("trial", 30, 1, 1, 4);
    char body[4096], file[PATH_MAX];
    snprintf(body, sizeof body,
             "{\"name\": \"lr-sweep\", \"job\": %s, \"parameters\": {"
             "\"lr\": {\"type\": \"continuous\", \"min\": 0.001, \"max\": 0.01, \"scaling\": \"log\"},"
             " \"warmup_steps\": {\"type\": \"integer\", \"min\": 0, \"max\": 10}},"
             " \"objective\": {\"metric\": \"val_loss\", \"goal\": \"minimize\"},"
             " \"strategy\": \"random\", \"max_jobs\": 3, \"max_parallel_jobs\": 2, \"seed\": 42}",
             job);
    free(job);
    snprintf(file, sizeof file, "%s/tune.json", e2e_cl->dir);
    FILE *f = fopen(file, "w");
    cr_assert_not_null(f);
    fputs(body, f);
    fclose(f);

    char *first = submit(file);
    json_t *a = wait_ended(first, 200000);
    cr_assert_str_eq(e2e_jstr(a, "state"), "COMPLETED", "%s", e2e_dump(a));
    char *second = submit(file);
    json_t *b = wait_ended(second, 200000);
    cr_assert_str_eq(e2e_jstr(b, "state"), "COMPLETED", "%s", e2e_dump(b));

    json_t *ta = json_object_get(a, "trials"), *tb = json_object_get(b, "trials");
    cr_assert_eq(json_array_size(ta), 3);
    cr_assert_eq(json_array_size(tb), 3);
    for (size_t i = 0; i < 3; i++) {
        json_t *x = json_array_get(ta, i), *y = json_array_get(tb, i);
        cr_assert(json_equal(json_object_get(x, "parameters"), json_object_get(y, "parameters")),
                  "trial %zu: the same seed gives the same values: %s", i, e2e_dump(a));
        double lr = json_number_value(json_object_get(json_object_get(x, "parameters"), "lr"));
        cr_assert(lr >= 0.001 && lr <= 0.01);
        cr_assert(json_is_number(json_object_get(x, "objective")), "trial %zu reported val_loss", i);
        cr_assert(json_number_value(json_object_get(x, "objective")) == json_number_value(json_object_get(y, "objective")),
                  "trial %zu trained the same both times: %s vs %s", i, e2e_dump(x), e2e_dump(y));
        cr_assert_str_eq(e2e_jstr(x, "state"), "COMPLETED");
        /* the trial is an ordinary job of the search, tagged with it */
        char path[128];
        snprintf(path, sizeof path, "/v1/jobs/%s", e2e_jstr(x, "job_id"));
        json_t *j = e2e_get(path);
        cr_assert_str_eq(e2e_jstr(json_object_get(j, "tags"), "tuning_job"), first);
        json_decref(j);
    }
    cr_assert(json_is_object(json_object_get(a, "best")));

    char *out = NULL, *err = NULL;
    cr_assert_eq(e2e_kiln(&out, &err, "tune", "describe", first, NULL), 0, "%s", err);
    cr_assert(strstr(out, "TRIAL") && strstr(out, "best:") && strstr(out, "COMPLETED"), "%s", out);
    cr_assert(strstr(out, e2e_jstr(json_object_get(a, "best"), "job_id")), "%s", out);
    free(out);
    free(err);
    cr_assert_eq(e2e_kiln(&out, &err, "tune", "list", NULL), 0, "%s", err);
    cr_assert(strstr(out, first) && strstr(out, second), "%s", out);
    free(out);
    free(err);
    /* warm-started from the first: one more trial; the first's trials are its history */
    {
        json_t *req = json_loads(body, 0, NULL);
        json_object_set_new(req, "max_jobs", json_integer(1));
        json_object_set_new(req, "max_parallel_jobs", json_integer(1));
        json_object_set_new(req, "warm_start", json_pack("{s:[s], s:s}", "parents", first, "type",
                                                         "identical_data_and_algorithm"));
        cr_assert_eq(json_dump_file(req, file, 0), 0);
        json_decref(req);
    }
    char *third = submit(file);
    json_t *c = wait_ended(third, 200000);
    cr_assert_str_eq(e2e_jstr(c, "state"), "COMPLETED", "%s", e2e_dump(c));
    cr_assert_eq(json_array_size(json_object_get(c, "trials")), 4, "its trial, then its parent's 3: %s", e2e_dump(c));
    for (size_t i = 1; i < 4; i++)
        cr_assert(!json_equal(json_object_get(json_array_get(json_object_get(c, "trials"), 0), "parameters"),
                              json_object_get(json_array_get(ta, i - 1), "parameters")),
                  "the same seed, yet not the parent's trial %zu", i - 1);
    cr_assert_eq(e2e_kiln(&out, &err, "tune", "describe", third, NULL), 0, "%s", err);
    cr_assert(strstr(out, "warm start: identical_data_and_algorithm") && strstr(out, first) &&
              strstr(out, "(3 trial(s))"), "describe shows the parent: %s", out);
    free(out);
    free(err);
    json_decref(c);
    free(third);
    cr_assert_eq(e2e_kiln(&out, &err, "tune", "stop", first, NULL), 5, "a completed search stops no more (409: exit 5): %s", out);
    cr_assert(strstr(err, "COMPLETED"), "%s", err);
    free(out);
    free(err);
    json_decref(a);
    json_decref(b);
    free(first);
    free(second);
    e2e_pass();
}

/* Whether attempt of job logged a line holding what (printing the attempt's lines when not). */
static bool attempt_logged(const char *job, int attempt, const char *what)
{
    char path[160];
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?limit=10000", job);
    json_t *logs = e2e_get(path);
    bool found = false;
    size_t li;
    json_t *line;
    json_array_foreach(json_object_get(logs, "lines"), li, line)
        if (e2e_jint(line, "attempt") == attempt && strstr(e2e_jstr(line, "line"), what))
            found = true;
    if (!found)
        json_array_foreach(json_object_get(logs, "lines"), li, line)
            if (e2e_jint(line, "attempt") == attempt)
                fprintf(stderr, "attempt %d: %s\n", attempt, e2e_jstr(line, "line"));
    json_decref(logs);
    return found;
}

/* Whether attempt of job resumed from a checkpoint (kiln-train logs "resumed from"). */
static bool attempt_resumed(const char *job, int attempt)
{
    return attempt_logged(job, attempt, "resumed from");
}

/* The job's model artifact through `kiln artifacts --get` (caller frees; *n its size). */
static char *model_of(const char *job, const char *tag, size_t *n)
{
    char file[PATH_MAX], *out = NULL, *err = NULL;
    snprintf(file, sizeof file, "%s/model-%s.bin", e2e_cl->dir, tag);
    cr_assert_eq(e2e_kiln(&out, &err, "artifacts", job, "--get", "model_llmc.bin", "-o", file, NULL), 0, "%s", err);
    free(out);
    free(err);
    FILE *f = fopen(file, "rb");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    cr_assert_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return buf;
}

/* Trains trial_job's spec straight through as a new job (no stopping.max_steps, no tuning tags)
 * and asserts that its model is trial_job's bit for bit; what names trial_job in the message. */
static void assert_straight_model(const char *trial_job, const char *what)
{
    char path[160];
    json_t *tj = e2e_get((snprintf(path, sizeof path, "/v1/jobs/%s", trial_job), path));
    json_t *spec = json_deep_copy(json_object_get(tj, "spec"));
    json_object_del(json_object_get(spec, "stopping"), "max_steps");
    json_object_set_new(spec, "name", json_string("straight"));
    json_object_set_new(spec, "tags", json_object());
    char *spec_text = json_dumps(spec, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_t *straight = e2e_submit(spec_text);
    char *sid = strdup(e2e_jstr(straight, "id"));
    json_decref(e2e_wait_state(sid, "COMPLETED", 120000));
    size_t na = 0, nb = 0;
    char *a = model_of(trial_job, what, &na), *b = model_of(sid, "straight", &nb);
    cr_assert(na == nb && na > 0 && !memcmp(a, b, na), "the %s trial's model (%zu bytes) is the straight run's "
              "(%zu bytes) bit for bit", what, na, nb);
    free(a);
    free(b);
    free(spec_text);
    free(sid);
    json_decref(straight);
    json_decref(spec);
    json_decref(tj);
}

/* Submits a hyperband search named name over lr, rungs 10 and 30 (hyperband members extra), 3
 * trials all at once, objective metric (val_loss when NULL; another is read from the log lines by a
 * metric definition, as kilnd refuses an objective no engine job reports), seed 9; returns its id
 * (caller frees). */
static char *hyperband_submit(const char *name, const char *extra, const char *metric)
{
    char *job = e2e_spec(name, 30, 1, 1, 4);
    if (metric) {
        json_t *j = json_loads(job, 0, NULL);
        cr_assert_not_null(j);
        char regex[128];
        snprintf(regex, sizeof regex, "^%s ([0-9.]+)$", metric);
        json_object_set_new(j, "metric_definitions", json_pack("[{s:s, s:s}]", "name", metric, "regex", regex));
        free(job);
        job = json_dumps(j, JSON_COMPACT);
        json_decref(j);
    }
    char body[4096];
    snprintf(body, sizeof body,
             "{\"name\": \"%s\", \"job\": %s, \"parameters\": {"
             "\"lr\": {\"type\": \"continuous\", \"min\": 0.001, \"max\": 0.01, \"scaling\": \"log\"}},"
             " \"objective\": {\"metric\": \"%s\"}, \"strategy\": \"hyperband\","
             " \"hyperband\": {\"min_resource\": 10, \"max_resource\": 30, %s},"
             " \"max_jobs\": 3, \"max_parallel_jobs\": 3, \"seed\": 9}",
             name, job, metric ? metric : "val_loss", extra);
    free(job);
    return tuning_created(body);
}

/* hyperband_submit, then waits for the search to end COMPLETED: the tuning job, its id in *id. */
static json_t *hyperband_done(const char *name, const char *extra, char **id)
{
    *id = hyperband_submit(name, extra, NULL);
    json_t *t = wait_ended(*id, 200000);
    cr_assert_str_eq(e2e_jstr(t, "state"), "COMPLETED", "%s", e2e_dump(t));
    return t;
}

/* Fails unless the hyperband searches a and b (ended) have the same trials: the same parameters,
 * the same rungs reached with the same objectives there (the same promotions), the same steps,
 * states and final objectives, and the same best. */
static void same_hyperband_trials(json_t *a, json_t *b)
{
    json_t *ta = json_object_get(a, "trials"), *tb = json_object_get(b, "trials");
    cr_assert_eq(json_array_size(ta), json_array_size(tb), "%s\nvs %s", e2e_dump(a), e2e_dump(b));
    int best_a = -1, best_b = -1;
    for (size_t i = 0; i < json_array_size(ta); i++) {
        json_t *x = json_array_get(ta, i), *y = json_array_get(tb, i);
        cr_assert(json_equal(json_object_get(x, "parameters"), json_object_get(y, "parameters")),
                  "trial %zu: the same seed draws the same values: %s vs %s", i, e2e_dump(x), e2e_dump(y));
        cr_assert(e2e_jint(x, "rung") == e2e_jint(y, "rung") && e2e_jint(x, "steps") == e2e_jint(y, "steps") &&
                  !strcmp(e2e_jstr(x, "state"), e2e_jstr(y, "state")),
                  "trial %zu: promoted alike, to the same rung: %s vs %s", i, e2e_dump(x), e2e_dump(y));
        cr_assert(json_array_size(json_object_get(x, "rungs")) > 0 &&
                  json_equal(json_object_get(x, "rungs"), json_object_get(y, "rungs")),
                  "trial %zu: the same rungs, the same objective at each, bit for bit: %s vs %s", i, e2e_dump(x),
                  e2e_dump(y));
        cr_assert(json_is_number(json_object_get(x, "objective")) &&
                  json_number_value(json_object_get(x, "objective")) == json_number_value(json_object_get(y, "objective")),
                  "trial %zu: the same final objective: %s vs %s", i, e2e_dump(x), e2e_dump(y));
        if (!strcmp(e2e_jstr(x, "job_id"), e2e_jstr(json_object_get(a, "best"), "job_id")))
            best_a = (int)i;
        if (!strcmp(e2e_jstr(y, "job_id"), e2e_jstr(json_object_get(b, "best"), "job_id")))
            best_b = (int)i;
    }
    cr_assert(best_a >= 0 && best_a == best_b, "the same trial is best: %d vs %d", best_a, best_b);
    cr_assert(json_equal(json_object_get(json_object_get(a, "best"), "parameters"),
                         json_object_get(json_object_get(b, "best"), "parameters")) &&
              json_number_value(json_object_get(json_object_get(a, "best"), "objective")) ==
                  json_number_value(json_object_get(json_object_get(b, "best"), "objective")),
              "%s vs %s", e2e_dump(json_object_get(a, "best")), e2e_dump(json_object_get(b, "best")));
}

Test(e2e_tuning, hyperband_trial_paused_and_promoted_ends_bit_identical_to_straight_through, .init = e2e_setup,
     .fini = e2e_teardown, .timeout = 300)
{
    char *id = NULL;
    json_t *t = hyperband_done("hb", "\"reduction_factor\": 3", &id);
    /* the same search again, with the same seed: it runs while this one is checked and its best
     * trial is trained straight through, and gives the same trials (compared at the end) */
    char *again = hyperband_submit("hb", "\"reduction_factor\": 3", NULL);
    /* three trials paused at step 10; the best of them (the top third) was promoted and ran to 30 */
    json_t *trials = json_object_get(t, "trials");
    cr_assert_eq(json_array_size(trials), 3, "%s", e2e_dump(t));
    int promoted = -1;
    for (size_t i = 0; i < 3; i++) {
        json_t *x = json_array_get(trials, i);
        cr_assert_str_eq(e2e_jstr(x, "state"), "COMPLETED", "%s", e2e_dump(t));
        if (e2e_jint(x, "rung") == 1) {
            cr_assert_eq(promoted, -1, "one trial promoted: %s", e2e_dump(t));
            promoted = (int)i;
        }
    }
    cr_assert_geq(promoted, 0, "%s", e2e_dump(t));
    json_t *best = json_array_get(trials, (size_t)promoted);
    /* each trial's rung history: every one finished rung 0 (10 steps), the promoted one rung 1
     * (30) with its final objective */
    for (size_t i = 0; i < 3; i++) {
        json_t *x = json_array_get(trials, i), *rg = json_object_get(x, "rungs");
        cr_assert_eq(json_array_size(rg), i == (size_t)promoted ? 2 : 1, "%s", e2e_dump(x));
        cr_assert(e2e_jint(json_array_get(rg, 0), "rung") == 0 && e2e_jint(json_array_get(rg, 0), "steps") == 10 &&
                  json_is_number(json_object_get(json_array_get(rg, 0), "objective")), "%s", e2e_dump(x));
    }
    json_t *top = json_array_get(json_object_get(best, "rungs"), 1);
    cr_assert(e2e_jint(top, "rung") == 1 && e2e_jint(top, "steps") == 30 &&
              json_number_value(json_object_get(top, "objective")) ==
                  json_number_value(json_object_get(best, "objective")), "%s", e2e_dump(best));
    const char *trial_job = e2e_jstr(best, "job_id");
    cr_assert_str_eq(e2e_jstr(json_object_get(t, "best"), "job_id"), trial_job);
    json_t *ev = e2e_events(trial_job);
    char states[512];
    e2e_event_states(ev, states, sizeof states);
    cr_assert(strstr(states, "RUNNING,PAUSED,RESTARTING,SCHEDULED") && strstr(states, "COMPLETED"),
              "the trial paused at its rung, then resumed: %s", states);
    json_decref(ev);
    /* the promoted attempt continued from the checkpoint of step 10, not from the start */
    char path[160];
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?limit=10000", trial_job);
    json_t *logs = e2e_get(path);
    char *text = e2e_dump(logs);
    cr_assert(strstr(text, "paused at step 10") && strstr(text, "at step 10"), "%s", text);
    json_decref(logs);
    cr_assert(attempt_resumed(trial_job, 2), "the second attempt resumed from the checkpoint of step 10");
    /* the same trial trained straight through: the same parameters, bit for bit */
    assert_straight_model(trial_job, "paused-and-promoted");
    /* the second run: the same trials, the same promotion, the same objectives at each rung */
    json_t *t2 = wait_ended(again, 200000);
    cr_assert_str_eq(e2e_jstr(t2, "state"), "COMPLETED", "%s", e2e_dump(t2));
    same_hyperband_trials(t, t2);
    json_decref(t2);
    free(again);
    json_decref(t);
    free(id);
    e2e_pass();
}


/* kilnd --tune-promoted-restart (the benchmark's baseline for what pause and resume saves): the
 * promoted trial trains again from step 0 to its next rung, counts every step it trained (10 to
 * its first rung, then 30), says it restarted, and ends with the model of the same trial trained
 * straight through (same seed, same data order). Ignoring the switch (resuming) fails it. */
Test(e2e_tuning, hyperband_promoted_restart_trains_from_step_zero_to_the_straight_model, .init = e2e_setup_promoted_restart,
     .fini = e2e_teardown, .timeout = 300)
{
    char *id = NULL;
    json_t *t = hyperband_done("hbr", "\"reduction_factor\": 3", &id);
    json_t *trials = json_object_get(t, "trials");
    cr_assert_eq(json_array_size(trials), 3, "%s", e2e_dump(t));
    int promoted = -1;
    for (size_t i = 0; i < 3; i++) {
        json_t *x = json_array_get(trials, i);
        cr_assert_str_eq(e2e_jstr(x, "state"), "COMPLETED", "%s", e2e_dump(t));
        if (e2e_jint(x, "rung") == 1)
            promoted = (int)i;
        else
            cr_assert_eq(e2e_jint(x, "steps"), 10, "a trial never promoted trained to its rung: %s", e2e_dump(x));
    }
    cr_assert_geq(promoted, 0, "%s", e2e_dump(t));
    json_t *best = json_array_get(trials, (size_t)promoted);
    /* its rung history as when it resumes; its steps: 10, then 30 from step 0 again */
    json_t *rg = json_object_get(best, "rungs");
    cr_assert(json_array_size(rg) == 2 && e2e_jint(json_array_get(rg, 0), "steps") == 10 &&
              e2e_jint(json_array_get(rg, 1), "steps") == 30, "%s", e2e_dump(best));
    cr_assert_eq(e2e_jint(best, "steps"), 40, "the restarted trial counts every step it trained: %s", e2e_dump(best));
    const char *trial_job = e2e_jstr(best, "job_id");
    json_t *ev = e2e_events(trial_job);
    char *evt = e2e_dump(ev);
    cr_assert(strstr(evt, "restarts from step 0") && !strstr(evt, "resumes from its checkpoint"),
              "the promotion says it restarts: %s", evt);
    json_decref(ev);
    /* the second attempt started afresh: no resume, its first step logged again */
    cr_assert(!attempt_resumed(trial_job, 2), "the second attempt did not resume");
    cr_assert(attempt_logged(trial_job, 2, "step 1/"), "the second attempt trained from step 1 again");
    /* the same trial trained straight through: the same parameters, bit for bit */
    assert_straight_model(trial_job, "restarted");
    json_decref(t);
    free(id);
    e2e_pass();
}

/* kilnd --tune-promoted-restart, the promoted attempt lost before it trained back to the step it
 * had reached (its rank killed as it starts, on its way to rung 1, its old checkpoint of rung 0
 * still there): the retry trains from step 0 again, as the switch promises, rather than resume
 * from the checkpoint the restart set aside; the trial counts every step it trained (rung 0's,
 * the lost attempt's, then rung 1's) and ends with the straight run's model; its metric series,
 * read as charts read it (attempt=latest), has each step once, the last attempt's; its last
 * rung's objective is the retry's value there. The rungs are long enough (the tiny model trains
 * dozens of steps in the 20 ms e2e_freeze_at_step lets it run) that it is frozen before rung 0's. */
#define RETRY_R0 400
#define RETRY_R1 1200
Test(e2e_tuning, hyperband_promoted_restart_retried_trains_from_step_zero_again, .init = e2e_setup_promoted_restart,
     .fini = e2e_teardown, .timeout = 300)
{
    char *base = e2e_spec("hbq", RETRY_R1, 1, 1, 4);
    json_t *j = json_loads(base, 0, NULL);
    free(base);
    json_object_set_new(j, "retry", json_pack("{s:i}", "max_attempts", 3));
    char *job = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    char body[4096];
    snprintf(body, sizeof body,
             "{\"name\": \"hbq\", \"job\": %s, \"parameters\": {"
             "\"lr\": {\"type\": \"continuous\", \"min\": 0.001, \"max\": 0.01, \"scaling\": \"log\"}},"
             " \"objective\": {\"metric\": \"val_loss\"}, \"strategy\": \"hyperband\","
             " \"hyperband\": {\"min_resource\": %d, \"max_resource\": %d, \"reduction_factor\": 3},"
             " \"max_jobs\": 3, \"max_parallel_jobs\": 3, \"seed\": 9}", job, RETRY_R0, RETRY_R1);
    free(job);
    char *id = tuning_created(body);
    /* the promoted trial: frozen as it starts on its way back up, well before its rung's step, and
     * its ranks killed */
    char path[160], trial_job[64] = "";
    snprintf(path, sizeof path, "/v1/tuning-jobs/%s", id);
    for (int i = 0; i < 6000 && !trial_job[0]; i++) {
        json_t *t = e2e_get(path);
        size_t k;
        json_t *x;
        json_array_foreach(json_object_get(t, "trials"), k, x)
            if (e2e_jint(x, "rung") == 1)
                snprintf(trial_job, sizeof trial_job, "%s", e2e_jstr(x, "job_id"));
        cr_assert(trial_job[0] || !strcmp(e2e_jstr(t, "state"), "RUNNING"), "no trial was promoted: %s", e2e_dump(t));
        json_decref(t);
        if (!trial_job[0])
            usleep(20000);
    }
    cr_assert(trial_job[0], "no trial was promoted in time");
    pid_t ranks[E2E_MAX_RANKS];
    int n_ranks = 0;
    json_t *frozen = e2e_freeze_at_step(trial_job, 1, 120000, ranks, &n_ranks);
    long reached = (long)e2e_jint(json_object_get(frozen, "progress"), "step");
    cr_assert_eq(e2e_jint(frozen, "attempt"), 2, "%s", e2e_dump(frozen));
    cr_assert_lt(reached, RETRY_R0, "the restarted attempt was frozen before step %d: %s", RETRY_R0, e2e_dump(frozen));
    json_decref(frozen);
    for (int i = 0; i < n_ranks; i++)
        kill(ranks[i], SIGKILL);
    json_t *t = wait_ended(id, 200000);
    cr_assert_str_eq(e2e_jstr(t, "state"), "COMPLETED", "%s", e2e_dump(t));
    json_t *best = NULL;
    size_t k;
    json_t *x;
    json_array_foreach(json_object_get(t, "trials"), k, x)
        if (!strcmp(e2e_jstr(x, "job_id"), trial_job))
            best = x;
    cr_assert_not_null(best, "%s", e2e_dump(t));
    cr_assert_eq(e2e_jint(best, "rung"), 1, "%s", e2e_dump(best));
    /* the retry (attempt 3) trained from step 1, resuming from no checkpoint */
    cr_assert(!attempt_resumed(trial_job, 3), "the retry of the restarted attempt did not resume");
    cr_assert(attempt_logged(trial_job, 3, "step 1/"), "the retry trained from step 1 again");
    /* every step it trained, once: its first rung's, the lost attempt's (at least those it was
     * frozen at), then its second rung's */
    json_int_t steps = e2e_jint(best, "steps");
    cr_assert(steps >= RETRY_R0 + reached + RETRY_R1 && steps < 2 * RETRY_R0 + RETRY_R1,
              "steps %lld: %d + the lost attempt's (%ld..) + %d: %s", (long long)steps, RETRY_R0, reached, RETRY_R1,
              e2e_dump(best));
    json_t *rg = json_object_get(best, "rungs");
    cr_assert(json_array_size(rg) == 2 && e2e_jint(json_array_get(rg, 0), "steps") == RETRY_R0 &&
              e2e_jint(json_array_get(rg, 1), "steps") == RETRY_R1, "%s", e2e_dump(best));
    /* its metric series as charts read it (the web UI asks attempt=latest; attempt=all, the
     * default, keeps every attempt's points told apart by attempt): every step once, the
     * last attempt's; its last rung's objective is that attempt's val_loss there */
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?name=train_loss&attempt=latest&max_points=100000", trial_job);
    json_t *m = e2e_get(path);
    json_t *pts = json_object_get(json_array_get(json_object_get(m, "metrics"), 0), "points");
    json_int_t prev = 0;
    json_t *p;
    json_array_foreach(pts, k, p) {
        cr_assert_eq(e2e_jint(p, "step"), prev + 1, "one point per step: %s", e2e_dump(p));
        cr_assert_eq(e2e_jint(p, "attempt"), 3, "the last attempt's: %s", e2e_dump(p));
        prev = e2e_jint(p, "step");
    }
    cr_assert_eq(prev, RETRY_R1, "%s", e2e_dump(m));
    json_decref(m);
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?name=val_loss&attempt=latest&max_points=100000", trial_job);
    m = e2e_get(path);
    pts = json_object_get(json_array_get(json_object_get(m, "metrics"), 0), "points");
    json_t *last = json_array_get(pts, json_array_size(pts) - 1);
    cr_assert(e2e_jint(last, "step") == RETRY_R1 && e2e_jint(last, "attempt") == 3 &&
              json_number_value(json_object_get(last, "value")) ==
                  json_number_value(json_object_get(json_array_get(rg, 1), "objective")),
              "rung 1's objective is the retry's val_loss at its step: %s / %s", e2e_dump(last), e2e_dump(rg));
    json_decref(m);
    assert_straight_model(trial_job, "retried");
    json_decref(t);
    free(id);
    e2e_pass();
}

Test(e2e_tuning, hyperband_brackets_start_their_trials_at_their_own_rungs, .init = e2e_setup, .fini = e2e_teardown,
     .timeout = 300)
{
    /* rungs 10 and 30, two brackets (TPE's sampler): trials 0 and 2 start at rung 0 (10 steps), trial 1 in bracket 1
     * runs straight to 30; two trials at rung 0 promote none */
    char *id = NULL;
    json_t *t = hyperband_done("hbb", "\"brackets\": 2, \"sampler\": \"tpe\"", &id);
    cr_assert_eq(e2e_jint(json_object_get(json_object_get(t, "spec"), "hyperband"), "brackets"), 2, "%s", e2e_dump(t));
    /* TPE's sampler starts once 10 trials have a rung result: these 3 trials are random's draws */
    cr_assert_str_eq(e2e_jstr(json_object_get(json_object_get(t, "spec"), "hyperband"), "sampler"), "tpe", "%s",
                     e2e_dump(t));
    json_t *trials = json_object_get(t, "trials");
    cr_assert_eq(json_array_size(trials), 3, "%s", e2e_dump(t));
    for (size_t i = 0; i < 3; i++) {
        json_t *x = json_array_get(trials, i), *rg = json_object_get(x, "rungs");
        cr_assert_eq(e2e_jint(x, "rung"), 0, "none promoted: %s", e2e_dump(x));
        cr_assert_eq(json_array_size(rg), 1, "%s", e2e_dump(x));
        cr_assert_eq(e2e_jint(json_array_get(rg, 0), "steps"), i == 1 ? 30 : 10, "%s", e2e_dump(x));
        cr_assert_eq(e2e_jint(x, "steps"), i == 1 ? 30 : 10, "%s", e2e_dump(x));
        json_t *ev = e2e_events(e2e_jstr(x, "job_id"));
        char states[512];
        e2e_event_states(ev, states, sizeof states);
        cr_assert(i == 1 ? !strstr(states, "PAUSED") : strstr(states, "RUNNING,PAUSED") != NULL,
                  "trial %zu: %s", i, states);
        json_decref(ev);
    }
    json_decref(t);
    free(id);
    e2e_pass();
}

Test(e2e_tuning, hyperband_objective_never_reported_ends_the_search_at_the_first_rung, .init = e2e_setup,
     .fini = e2e_teardown, .timeout = 300)
{
    /* the trials report train_loss and val_loss, never "bleu" (its metric definition matches no line):
     * the first trial paused at its first rung (step 10) ends the search, whose reason names the
     * metric and what was reported */
    char *id = hyperband_submit("nobleu", "\"reduction_factor\": 3", "bleu");
    json_t *t = wait_ended(id, 200000);
    cr_assert_str_eq(e2e_jstr(t, "state"), "FAILED", "%s", e2e_dump(t));
    const char *reason = e2e_jstr(t, "reason");
    cr_assert(strstr(reason, "objective metric \"bleu\" was not reported by trial ") &&
              strstr(reason, "which reached its first rung; it reported: ") && strstr(reason, "train_loss") &&
              strstr(reason, "val_loss"), "%s", reason);
    /* no trial trained past its first rung, and none is left running or paused */
    json_t *trials = json_object_get(t, "trials");
    cr_assert_geq(json_array_size(trials), 1, "%s", e2e_dump(t));
    for (size_t i = 0; i < json_array_size(trials); i++) {
        json_t *x = json_array_get(trials, i);
        cr_assert(e2e_jint(x, "steps") <= 10 && e2e_jint(x, "rung") == 0, "%s", e2e_dump(x));
        json_decref(e2e_wait_state(e2e_jstr(x, "job_id"), TH_JOB_ENDED, 60000));
    }
    json_decref(t);
    free(id);
    e2e_pass();
}

/* A trial reports its hyperparameter as its loss at steps 1-5 and ends; the one with loss 9 goes
 * on reporting until it is stopped. */
static const char k_median_sh[] =
    "i=1\n"
    "while [ $i -le 5 ]; do echo \"step $i loss $2\"; i=$((i+1)); sleep 0.05; done\n"
    "while [ \"$2\" = 9 ]; do echo \"step $i loss $2\"; i=$((i+1)); sleep 0.1; done\n";

Test(e2e_tuning, median_rule_stops_the_trial_worse_than_the_completed_median, .init = e2e_setup,
     .fini = e2e_teardown, .timeout = 300)
{
    char dir[PATH_MAX];
    script_trial("median", k_median_sh, dir, sizeof dir);
    /* one at a time: trials 0-2 complete (losses 2, 1, 3: median 2), then trial 3 (loss 9) runs
     * until the median rule stops it, and the search ends with every trial */
    char *id = submit_script_grid(dir, "[2, 1, 3, 9]", "\"max_jobs\": 4, \"max_parallel_jobs\": 1, "
                                                       "\"early_stopping\": \"auto\"");
    json_t *t = wait_ended(id, 200000);
    cr_assert_str_eq(e2e_jstr(t, "state"), "COMPLETED", "%s", e2e_dump(t));
    json_t *trials = json_object_get(t, "trials");
    cr_assert_eq(json_array_size(trials), 4, "%s", e2e_dump(t));
    for (size_t i = 0; i < 3; i++)
        cr_assert_str_eq(e2e_jstr(json_array_get(trials, i), "state"), "COMPLETED", "trial %zu: %s", i, e2e_dump(t));
    json_t *bad = json_array_get(trials, 3);
    cr_assert_str_eq(e2e_jstr(bad, "state"), "STOPPED", "%s", e2e_dump(bad));
    cr_assert(strstr(e2e_jstr(bad, "reason"), "stopped early by the median rule") &&
              strstr(e2e_jstr(bad, "reason"), "median of the running averages of 3 completed trial(s)"),
              "%s", e2e_dump(bad));
    cr_assert(json_number_value(json_object_get(bad, "objective")) == 9.0, "it keeps its objective: %s", e2e_dump(bad));
    json_t *best = json_object_get(t, "best");
    cr_assert(json_number_value(json_object_get(best, "objective")) == 1.0, "%s", e2e_dump(t));
    cr_assert_str_eq(e2e_jstr(best, "job_id"), e2e_jstr(json_array_get(trials, 1), "job_id"));
    /* its job's events say who stopped it and why */
    json_t *ev = e2e_events(e2e_jstr(bad, "job_id"));
    char *text = json_dumps(ev, 0);
    cr_assert(strstr(text, "stopped early by the median rule"), "%s", text);
    free(text);
    json_decref(ev);
    json_decref(t);
    free(id);
    e2e_pass();
}

/* A trial reports its hyperparameter as its loss once and ends. */
static const char k_echo_sh[] = "echo \"step 1 loss $2\"\n";

Test(e2e_tuning, bayesian_search_runs_past_its_random_startup_to_the_end, .init = e2e_setup, .fini = e2e_teardown,
     .timeout = 300)
{
    char dir[PATH_MAX];
    script_trial("bayes", k_echo_sh, dir, sizeof dir);
    /* 12 trials, 2 at once: the first 10 random search's draws; trial 11 is drawn with at most one
     * other running, so by TPE over at least 10 ended trials */
    char body[PATH_MAX + 2048];
    snprintf(body, sizeof body,
             "{\"name\": \"bayes\", \"job\": {\"name\": \"t\", \"entry_point\": \"trial.sh\", \"source\": \"%s\","
             " \"retry\": {\"max_attempts\": 1}, \"hyperparameters\": {\"loss\": 1},"
             " \"resources\": {\"nodes\": 1, \"slots_per_node\": 1, \"slot_type\": \"cpu\"},"
             " \"metric_definitions\": [{\"name\": \"loss\", \"regex\": \"^step (?<step>[0-9]+) loss ([0-9.]+)\"}]},"
             " \"parameters\": {\"loss\": {\"type\": \"continuous\", \"min\": 1, \"max\": 9}},"
             " \"objective\": {\"metric\": \"loss\"}, \"strategy\": \"bayesian\", \"max_jobs\": 12,"
             " \"max_parallel_jobs\": 2, \"seed\": 5, \"early_stopping\": \"auto\"}",
             dir);
    char *id = tuning_created(body);
    json_t *t = wait_ended(id, 240000);
    cr_assert_str_eq(e2e_jstr(t, "state"), "COMPLETED", "%s", e2e_dump(t));
    cr_assert_str_eq(e2e_jstr(t, "strategy"), "bayesian", "%s", e2e_dump(t));
    json_t *trials = json_object_get(t, "trials");
    cr_assert_eq(json_array_size(trials), 12, "%s", e2e_dump(t));
    for (size_t i = 0; i < 12; i++) {
        json_t *x = json_array_get(trials, i);
        double p = json_number_value(json_object_get(json_object_get(x, "parameters"), "loss"));
        cr_assert(p >= 1 && p <= 9, "%s", e2e_dump(x));
        cr_assert(fabs(json_number_value(json_object_get(x, "objective")) - p) < 1e-9, "each trial ran its values: %s",
                  e2e_dump(x));
    }
    json_decref(t);
    free(id);
    e2e_pass();
}

/* A trial reports its loss until the file GO in its script's directory exists, then ends. */
static const char k_wait_sh[] =
    "i=1\n"
    "while [ ! -e \"$GO\" ]; do echo \"step $i loss $2\"; i=$((i+1)); sleep 0.1; done\n"
    "echo \"step $i loss $2\"\n";

Test(e2e_tuning, a_search_carries_on_with_the_same_trials_after_kilnd_is_killed, .init = e2e_setup,
     .fini = e2e_teardown, .timeout = 300)
{
    char dir[PATH_MAX], script[sizeof k_wait_sh + PATH_MAX + 32], go[PATH_MAX + 8];
    snprintf(go, sizeof go, "%.200s/shared-checkpoints/restart/GO", e2e_cl->dir);
    snprintf(script, sizeof script, "GO='%s'\n%s", go, k_wait_sh);
    script_trial("restart", script, dir, sizeof dir);
    char *id = submit_script_grid(dir, "[4, 3, 2, 1]", "\"max_jobs\": 4, \"max_parallel_jobs\": 2");
    /* two trials run (and wait for GO) when kilnd dies */
    json_t *t = wait_trials(id, 2, "RUNNING");
    json_t *before = json_incref(json_object_get(t, "trials"));
    cr_assert_eq(json_array_size(before), 2, "%s", e2e_dump(t));
    json_decref(t);
    e2e_kilnd_kill();
    e2e_kilnd_start();
    FILE *f = fopen(go, "w");
    cr_assert_not_null(f);
    fclose(f);
    t = wait_ended(id, 200000);
    cr_assert_str_eq(e2e_jstr(t, "state"), "COMPLETED", "%s", e2e_dump(t));
    json_t *after = json_object_get(t, "trials");
    cr_assert_eq(json_array_size(after), 4, "%s", e2e_dump(t));
    for (size_t i = 0; i < 4; i++) {
        json_t *x = json_array_get(after, i);
        cr_assert_eq(e2e_jint(x, "trial"), (json_int_t)i);
        cr_assert_str_eq(e2e_jstr(x, "state"), "COMPLETED", "%s", e2e_dump(t));
        if (i < 2)
            cr_assert_str_eq(e2e_jstr(x, "job_id"), e2e_jstr(json_array_get(before, i), "job_id"),
                             "trial %zu kept its job across the restart: %s", i, e2e_dump(t));
    }
    cr_assert(json_number_value(json_object_get(json_object_get(t, "best"), "objective")) == 1.0, "%s", e2e_dump(t));
    /* no trial was submitted twice: the project has exactly the search's four trial jobs */
    char q[256];
    snprintf(q, sizeof q, "/v1/jobs?tag=tuning_job:%s", id);
    json_t *jobs = e2e_get(q);
    cr_assert_eq(json_array_size(json_object_get(jobs, "jobs")), 4, "%s", e2e_dump(jobs));
    json_decref(jobs);
    json_decref(before);
    json_decref(t);
    free(id);
    e2e_pass();
}

Test(e2e_tuning, trials_yield_to_an_ordinary_job_and_resume_from_their_checkpoints, .init = e2e_setup,
     .fini = e2e_teardown, .timeout = 300)
{
    /* three trials (at the default trial priority, the base job's minus 1) fill the 3 cpu slots,
     * each frozen at step 30 with a checkpoint every step */
    char *text = e2e_spec("pre", 400, 1, 1, 4);
    json_t *base = json_loads(text, 0, NULL);
    free(text);
    char ckpt[PATH_MAX];
    snprintf(ckpt, sizeof ckpt, "%.200s/shared-checkpoints", e2e_cl->dir);
    json_object_set_new(base, "checkpoint", json_pack("{s:i, s:s}", "every_steps", 1, "path", ckpt));
    json_t *req = json_pack("{s:s, s:o, s:{s:{s:s, s:f, s:f}}, s:{s:s}, s:s, s:i, s:i, s:i}", "name", "pre", "job",
                            base, "parameters", "lr", "type", "continuous", "min", 0.001, "max", 0.01, "objective",
                            "metric", "train_loss", "strategy", "random", "max_jobs", 3, "max_parallel_jobs", 3,
                            "seed", 3);
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    char *id = tuning_created(body);
    free(body);
    char path[256];
    snprintf(path, sizeof path, "/v1/tuning-jobs/%s", id);
    json_t *t = wait_trials(id, 3, NULL);
    json_t *trials = json_object_get(t, "trials");
    cr_assert_eq(json_array_size(trials), 3, "%s", e2e_dump(t));
    char jobs[3][64];
    pid_t ranks[3][E2E_MAX_RANKS];
    int nranks[3];
    for (int i = 0; i < 3; i++)
        snprintf(jobs[i], sizeof jobs[i], "%s", e2e_jstr(json_array_get(trials, (size_t)i), "job_id"));
    /* each rank is held (SIGSTOP) as soon as it exists, so that none runs to its end while
     * another is brought to step 30 */
    for (int k = 0, held = 0; held != 7; k++) {
        cr_assert_lt(k, 12000, "the trials' ranks never all started");
        for (int i = 0; i < 3; i++) {
            pid_t pid = held & (1 << i) ? -1 : e2e_rank_pid(jobs[i], 0);
            if (pid > 0 && kill(pid, SIGSTOP) == 0)
                held |= 1 << i;
        }
        usleep(10000);
    }
    for (int i = 0; i < 3; i++) {
        json_t *j = e2e_freeze_at_step(jobs[i], 30, 120000, ranks[i], &nranks[i]);
        cr_assert_eq(e2e_jint(j, "priority"), -1, "a trial runs below ordinary jobs: %s", e2e_dump(j));
        json_decref(j);
    }
    json_decref(t);
    /* an ordinary job (priority 0) to the same queue preempts one trial */
    char *spec = e2e_spec("ordinary", 20, 1, 1, 4);
    json_t *o = e2e_submit(spec);
    free(spec);
    char ord[64];
    snprintf(ord, sizeof ord, "%s", e2e_jstr(o, "id"));
    json_decref(o);
    int victim = -1;
    for (int k = 0; k < 600 && victim < 0; k++) {
        for (int i = 0; i < 3 && victim < 0; i++) {
            snprintf(path, sizeof path, "/v1/jobs/%s", jobs[i]);
            json_t *j = e2e_get(path);
            if (!strcmp(e2e_jstr(j, "state"), "STOPPING") || !strcmp(e2e_jstr(j, "state"), "PREEMPTED"))
                victim = i;
            json_decref(j);
        }
        if (victim < 0)
            usleep(100000);
    }
    cr_assert_geq(victim, 0, "no trial was preempted for the ordinary job");
    e2e_thaw(ranks[victim], nranks[victim]);
    json_t *v = e2e_wait_state(jobs[victim], "PREEMPTED", 60000);
    cr_assert(strstr(e2e_jstr(v, "reason"), ord), "%s", e2e_dump(v));
    json_decref(v);
    json_decref(e2e_wait_state(ord, "COMPLETED", 120000));
    for (int i = 0; i < 3; i++)
        if (i != victim)
            e2e_thaw(ranks[i], nranks[i]);
    /* the preempted trial resumed from its checkpoint and the search completed with three trials */
    t = wait_ended(id, 200000);
    cr_assert_str_eq(e2e_jstr(t, "state"), "COMPLETED", "%s", e2e_dump(t));
    trials = json_object_get(t, "trials");
    cr_assert_eq(json_array_size(trials), 3, "%s", e2e_dump(t));
    for (size_t i = 0; i < 3; i++)
        cr_assert_str_eq(e2e_jstr(json_array_get(trials, i), "state"), "COMPLETED", "%s", e2e_dump(t));
    snprintf(path, sizeof path, "/v1/jobs/%s", jobs[victim]);
    json_t *vj = e2e_get(path);
    int attempt = (int)e2e_jint(vj, "attempt");
    json_decref(vj);
    cr_assert_geq(attempt, 2, "the preempted trial ran again");
    cr_assert(attempt_resumed(jobs[victim], attempt), "the preempted trial resumed from its checkpoint");
    json_decref(t);
    free(id);
    e2e_pass();
}

/* What a user types at the CLI: `kiln tune submit` sends the base job's relative data path whole
 * (as `kiln submit` does; kilnd refuses a relative one), and `kiln tune describe|stop` take a
 * unique id prefix (in either case) or a unique name, as `kiln describe` does, a name as long as
 * an id included (it was sent as an id, "not found"); a name two searches share is refused
 * listing both, and a request file that is not there is "not found" (exit 3). */
Test(e2e_tuning, the_cli_names_a_search_by_prefix_or_name_and_sends_relative_data_paths_whole, .init = e2e_setup,
     .fini = e2e_teardown, .timeout = 180)
{
    /* trials long enough never to end their searches before the test stops them */
    char *job = e2e_spec("named", 1000000, 1, 1, 4);
    json_t *base = json_loads(job, 0, NULL);
    free(job);
    cr_assert_not_null(base);
    json_object_set_new(json_object_get(base, "data"), "train", json_string("data/tinyshakespeare.txt"));
    json_t *req = json_pack("{s:s, s:o, s:{s:{s:s, s:f, s:f}}, s:{s:s, s:s}, s:s, s:i, s:i, s:i}", "name",
                            "cli-names-of-thirty-six-characters-x", "job", base, "parameters", "lr", "type",
                            "continuous", "min", 1e-3, "max", 1e-2, "objective", "metric", "val_loss", "goal",
                            "minimize", "strategy", "random", "max_jobs", 1, "max_parallel_jobs", 1, "seed", 3);
    cr_assert_not_null(req);
    char file[PATH_MAX];
    snprintf(file, sizeof file, "%s/named.json", e2e_cl->dir);
    cr_assert_eq(json_dump_file(req, file, 0), 0);
    json_decref(req);

    char *first = submit(file);
    char path[128];
    snprintf(path, sizeof path, "/v1/tuning-jobs/%s", first);
    json_t *t = e2e_get(path);
    json_t *data = json_object_get(json_object_get(json_object_get(t, "spec"), "job"), "data");
    cr_assert_str_eq(e2e_jstr(data, "train"), e2e_data_path(), "the relative path went whole: %s", e2e_dump(t));
    json_decref(t);

    char prefix[9];
    snprintf(prefix, sizeof prefix, "%.8s", first);
    char *out = NULL, *err = NULL;
    cr_assert_eq(e2e_kiln(&out, &err, "tune", "describe", prefix, NULL), 0, "by its id's prefix: %s", err);
    cr_assert(strstr(out, first), "%s", out);
    free(out);
    free(err);
    for (size_t k = 0; k < 8; k++)
        prefix[k] = (char)toupper((unsigned char)prefix[k]);
    cr_assert_eq(e2e_kiln(&out, &err, "tune", "describe", prefix, NULL), 0, "by its id's prefix in capitals: %s", err);
    cr_assert(strstr(out, first), "%s", out);
    free(out);
    free(err);
    snprintf(prefix, sizeof prefix, "%.8s", first);
    cr_assert_eq(e2e_kiln(&out, &err, "tune", "describe", "cli-names-of-thirty-six-characters-x", NULL), 0,
                 "by its name, of 36 characters: %s", err);
    cr_assert(strstr(out, first), "%s", out);
    free(out);
    free(err);

    char *second = submit(file);
    cr_assert_eq(e2e_kiln(&out, &err, "tune", "describe", "cli-names-of-thirty-six-characters-x", NULL), 1,
                 "two share the name: %s", out);
    cr_assert(strstr(err, "\"cli-names-of-thirty-six-characters-x\" names 2 tuning jobs"), "%s", err);
    cr_assert(strstr(err, prefix), "the candidates are listed: %s", err);
    free(out);
    free(err);
    cr_assert_eq(e2e_kiln(&out, &err, "tune", "stop", prefix, NULL), 0, "%s", err);
    cr_assert(strstr(out, first) && (strstr(out, "STOPPING") || strstr(out, "STOPPED")), "%s", out);
    free(out);
    free(err);
    cr_assert_eq(e2e_kiln(&out, &err, "tune", "stop", second, NULL), 0, "%s", err);
    free(out);
    free(err);
    /* 500 newer ones (ended, made in the database: the controller leaves them be) push both past
     * the list's first page: the CLI looks through every page */
    PGconn *db = PQconnectdb(e2e_cl->db_url);
    cr_assert_eq(PQstatus(db), CONNECTION_OK, "%s", PQerrorMessage(db));
    PGresult *ins = PQexec(db, "INSERT INTO tuning_jobs (id, name, project, spec, state, created_at)"
                               " SELECT gen_random_uuid(), 'filler-' || g, t.project, t.spec, 'COMPLETED',"
                               " now() + interval '1 second'"
                               " FROM generate_series(1, 500) g, (SELECT project, spec FROM tuning_jobs LIMIT 1) t");
    cr_assert_eq(PQresultStatus(ins), PGRES_COMMAND_OK, "%s", PQerrorMessage(db));
    PQclear(ins);
    PQfinish(db);
    cr_assert_eq(e2e_kiln(&out, &err, "tune", "describe", prefix, NULL), 0, "by a prefix, past the first page: %s",
                 err);
    cr_assert(strstr(out, first), "%s", out);
    free(out);
    free(err);
    cr_assert_eq(e2e_kiln(&out, &err, "tune", "list", "--page-size", "7", NULL), 0, "%s", err);
    cr_assert(strstr(out, first) && strstr(out, second) && strstr(out, "filler-500"), "every page: %.300s", out);
    size_t fillers = 0;
    for (const char *p = out; (p = strstr(p, " filler-")) != NULL; p++)
        fillers++;
    cr_assert_eq(fillers, 500, "each once");
    free(out);
    free(err);
    cr_assert_eq(e2e_kiln(&out, &err, "tune", "list", "--limit", "3", NULL), 0, "%s", err);
    cr_assert(!strstr(out, first) && strstr(err, "showing the newest 3"), "%s %s", out, err);
    /* trials_running counts trials waiting for slots too: not headed RUNNING */
    cr_assert(strstr(out, " TRIALS  ACTIVE ") && !strstr(out, " RUNNING "), "%s", out);
    free(out);
    free(err);
    /* --all wins over --limit in either order, as kiln jobs takes them */
    cr_assert_eq(e2e_kiln(&out, &err, "tune", "list", "--all", "--limit", "3", NULL), 0, "%s", err);
    cr_assert(strstr(out, first) && !strstr(err, "showing the newest"), "%.300s %s", out, err);
    free(out);
    free(err);
    /* an ended search with no objective reported waits for nothing more: no "yet" */
    cr_assert_eq(e2e_kiln(&out, &err, "tune", "describe", "filler-1", NULL), 0, "%s", err);
    cr_assert(strstr(out, "best:       (no trial reported val_loss)\n"), "%s", out);
    free(out);
    free(err);
    cr_assert_eq(e2e_kiln(&out, &err, "tune", "describe", "cli-names-of-thirty-six-characters-x", NULL), 1,
                 "two share the name, past the first page: %s", out);
    cr_assert(strstr(err, "\"cli-names-of-thirty-six-characters-x\" names 2 tuning jobs"), "%s", err);
    free(out);
    free(err);
    cr_assert_eq(e2e_kiln(&out, &err, "tune", "submit", "no-such-request.json", NULL), 3, "%s", err);
    cr_assert(strstr(err, "no-such-request.json"), "%s", err);
    free(out);
    free(err);
    json_decref(wait_ended(first, 60000));
    json_decref(wait_ended(second, 60000));
    free(first);
    free(second);
    e2e_pass();
}
