/* test_tuning.c - tuning jobs over REST against the real server, database and controller (the
 * leader's scheduler thread): what submission refuses and the field it names, the round trip
 * (create, get, list, stop), seeded trials that repeat, and the ends the controller decides for
 * trials the fixture's worker runs by hand: the objective never reported, too many failures,
 * and every trial done with the best one named. A warm start draws none of its parent's
 * configurations, keeps the parent's best until a trial beats it, does not wait for a parent's
 * trial still stopping, and its parents are checked at submission; the list carries each
 * search's trial counts and best. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/tuning_states.h"
#include "tests/api/api_test.h"

TestSuite(tuning, .init = at_setup, .fini = at_teardown, .timeout = 120);

#define BASE_JOB                                                                                              \
    "{\"name\": \"base\", \"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16,"      \
    " \"seq_len\": 8}, \"data\": {\"train\": \"file:///tmp/kiln-api-test.txt\"},"                              \
    " \"hyperparameters\": {\"lr\": 0.001, \"global_batch_size\": 2, \"max_steps\": 500},"   \
    " \"resources\": {\"nodes\": 1, \"slots_per_node\": 1, \"slot_type\": \"cpu\"}}"

/* A tuning request: the base job, parameters (an object's members, text), and extra members. */
static char *request(const char *params, const char *extra)
{
    static char buf[8192];
    snprintf(buf, sizeof buf,
             "{\"name\": \"sweep\", \"job\": " BASE_JOB ", \"parameters\": {%s},"
             " \"objective\": {\"metric\": \"val_loss\", \"goal\": \"minimize\"}%s%s}",
             params, extra && extra[0] ? ", " : "", extra ? extra : "");
    return buf;
}

#define LR "\"lr\": {\"type\": \"continuous\", \"min\": 1e-4, \"max\": 1e-2, \"scaling\": \"log\"}"

/* POSTs body with token (NULL: the admin's) and asserts status want naming field whose text has
 * needle. */
static void refused_as(const char *token, const char *body, long want, const char *field, const char *needle)
{
    char auth[256];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token ? token : "");
    const char *hdrs[] = {auth, NULL};
    long st;
    char *raw = NULL;
    json_t *j = at_req("POST", "/v1/tuning-jobs", body, token ? hdrs : NULL, &st, &raw);
    cr_assert_eq(st, want, "want %ld for %s, got %ld: %s", want, field, st, raw);
    cr_assert_str_eq(json_string_value(json_object_get(j, "field")), field, "%s", raw);
    cr_assert(strstr(raw, needle), "the answer says \"%s\": %s", needle, raw);
    json_decref(j);
    free(raw);
}

/* POSTs body as the admin and asserts a 400 naming field, whose message contains needle. */
static void refused(const char *body, const char *field, const char *needle)
{
    refused_as(NULL, body, 400, field, needle);
}

Test(tuning, refuses_bad_input_naming_the_field)
{
    refused(request("\"lr\": {\"type\": \"continuous\", \"min\": 0.01, \"max\": 0.001}", NULL), "parameters.lr.min",
            "less than max");
    refused(request("\"weight_decay\": {\"type\": \"continuous\", \"min\": 0, \"max\": 0.2, \"scaling\": \"log\"}", NULL),
            "parameters.weight_decay.min", "log scaling");
    /* the message names the field once, as every other does: the CLI prints "FIELD: ..." */
    refused(request("\"lr\": {\"type\": \"continuous\", \"min\": 0.01, \"max\": 0.001}", NULL), "parameters.lr.min",
            "\"message\":\"parameters.lr.min (0.01) must be less than max (0.001)\"");
    /* an empty range is no range */
    refused(request("\"lr\": {\"type\": \"continuous\", \"min\": 0.001, \"max\": 0.001}", NULL), "parameters.lr.min",
            "less than max");
    refused(request("\"model.n_foo\": {\"type\": \"integer\", \"min\": 1, \"max\": 4}", NULL), "parameters.model.n_foo",
            "no field model.n_foo");
    refused(request("\"dropout\": {\"type\": \"continuous\", \"min\": 0, \"max\": 0.5}", NULL), "parameters.dropout",
            "no field hyperparameters.dropout");
    /* values the job validator refuses: an end of a range, a categorical value, a fraction for an integer */
    refused(request("\"lr\": {\"type\": \"continuous\", \"min\": 0.001, \"max\": 20}", NULL), "parameters.lr.max",
            "hyperparameters.lr");
    refused(request("\"model.n_head\": {\"type\": \"categorical\", \"values\": [2, 3]}", NULL),
            "parameters.model.n_head.values[1]", "model.n_head = 3");
    refused(request("\"warmup_steps\": {\"type\": \"continuous\", \"min\": 0, \"max\": 300}", NULL),
            "parameters.warmup_steps.type", "warmup_steps");
    refused(request("\"warmup_steps\": {\"type\": \"integer\", \"min\": -5, \"max\": 300}", NULL),
            "parameters.warmup_steps.min", "warmup_steps");
    /* ends no double holds exactly, and a range too wide to draw from */
    refused(request("\"warmup_steps\": {\"type\": \"integer\", \"min\": 0, \"max\": 1e300}", NULL),
            "parameters.warmup_steps.max", "outside -2^53 to 2^53");
    refused(request("\"warmup_steps\": {\"type\": \"integer\", \"min\": -9007199254740993, \"max\": 3}", NULL),
            "parameters.warmup_steps.min", "outside -2^53 to 2^53");
    refused(request("\"lr\": {\"type\": \"continuous\", \"min\": -1e308, \"max\": 1e308}", NULL), "parameters.lr.max",
            "too wide");
    {
        char body[8192];
        snprintf(body, sizeof body,
                 "{\"job\": " BASE_JOB ", \"parameters\": {" LR "}, \"objective\": {\"metric\": \"\"}}");
        refused(body, "objective.metric", "empty");
    }
    refused(request(LR, "\"max_jobs\": 4, \"max_parallel_jobs\": 5"), "max_parallel_jobs", "more than max_jobs");
    {
        char params[4096] = "";
        for (int i = 0; i < 31; i++)
            snprintf(params + strlen(params), sizeof params - strlen(params), "%s\"p%d\": {\"type\": \"integer\", "
                     "\"min\": 0, \"max\": 1}", i ? ", " : "", i);
        refused(request(params, NULL), "parameters", "at most 30");
    }
    refused(request("\"warmup_steps\": {\"type\": \"integer\", \"min\": 0, \"max\": 9},"
                    " \"model.n_embd\": {\"type\": \"categorical\", \"values\": [16, 32]}",
                    "\"strategy\": \"grid\", \"max_jobs\": 19"),
            "max_jobs", "20 points");
    refused(request(LR, "\"strategy\": \"grid\""), "parameters.lr.type", "grid search");
    refused(request(LR, "\"stratgy\": \"grid\""), "stratgy", "strategy");
    /* hyperband's trials train max_resource steps: beyond it a warmup is refused; the base job's
     * max_steps (500) bounds the other strategies' (hyperband_checks_values_... accepts 800) */
    refused(request("\"warmup_steps\": {\"type\": \"integer\", \"min\": 0, \"max\": 1500}",
                    "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 100, \"max_resource\": 1000}"),
            "parameters.warmup_steps.max", "warmup_steps = 1500");
    refused(request("\"warmup_steps\": {\"type\": \"integer\", \"min\": 0, \"max\": 800}", NULL),
            "parameters.warmup_steps.max", "warmup_steps = 800");
    refused(request(LR, "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 100, \"max_resource\": 50}"),
            "hyperband.min_resource", "less than max_resource");
    refused(request(LR, "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 10, \"max_resource\": 90,"
                        " \"brackets\": 4}"),
            "hyperband.brackets", "more than the 3 rungs");
    refused(request(LR, "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 10, \"max_resource\": 90,"
                        " \"max_rungs\": 4}"),
            "hyperband.max_rungs", "hyperband.max_rungs (4) is more than the 3 rungs");
    refused(request(LR, "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 10, \"max_resource\": 90,"
                        " \"sampler\": \"bayesian\"}"),
            "hyperband.sampler", "hyperband.sampler must be");
    refused(request(LR, "\"strategy\": \"tpe\""), "strategy", "bayesian");
    refused(request(LR ", \"stopping.max_steps\": {\"type\": \"integer\", \"min\": 10, \"max\": 40}",
                    "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 10, \"max_resource\": 90}"),
            "parameters.stopping.max_steps", "hyperband decides stopping.max_steps");
    refused(request(LR, "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 10, \"max_resource\": 90},"
                        " \"early_stopping\": \"auto\""),
            "early_stopping", "is for random, grid and bayesian");
    refused(request(LR, "\"early_stopping\": \"median\""), "early_stopping", "early_stopping must be");
    {
        char body[8192];
        snprintf(body, sizeof body, "{\"job\": {\"model\": {\"type\": \"gpt\", \"n_head\": 3, \"n_embd\": 16}},"
                 " \"parameters\": {" LR "}, \"objective\": {\"metric\": \"val_loss\"}}");
        refused(body, "job.model.n_head", "n_head");
    }
    /* the list reads page_size and page_token as GET /v1/jobs does and refuses any other parameter,
     * not ignoring it; a refused page says which field and why */
    {
        static const struct { const char *path, *field, *needle; } bad[] = {
            {"/v1/tuning-jobs?page_size=0", "page_size", "page_size"},
            {"/v1/tuning-jobs?page_size=501", "page_size", "page_size"},
            {"/v1/tuning-jobs?page_size=-1", "page_size", "page_size must be a whole number from 1 to 500"},
            {"/v1/tuning-jobs?page_size=two", "page_size", "page_size must be a whole number from 1 to 500, got"},
            {"/v1/tuning-jobs?page_token=abc", "page_token", "malformed page token"},
            /* a token of the job list is not one of this list */
            {"/v1/tuning-jobs?page_token=eyJ2IjoxLCJoIjoiMDAwMDAwMDAwMDAwMDAwMCIsImMiOnt9fQ", "page_token",
             "another search or list"},
            {"/v1/tuning-jobs?status=RUNNING", "status", "this request takes page_size, page_token"},
        };
        for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
            long st;
            char *raw = NULL;
            json_t *j = at_req("GET", bad[i].path, NULL, NULL, &st, &raw);
            cr_assert_eq(st, 400, "%s: %s", bad[i].path, raw);
            cr_assert_str_eq(json_string_value(json_object_get(j, "field")), bad[i].field, "%s: %s", bad[i].path, raw);
            cr_assert(strstr(raw, bad[i].needle), "%s: %s", bad[i].path, raw);
            json_decref(j);
            free(raw);
        }
        /* a token of this list whose cursor is a job search's, not a tuning job's */
        long st;
        json_t *cur = json_pack("{s:i, s:[i], s:s}", "p", 1, "k", 0, "id", "00000000-0000-4000-8000-000000000000");
        char *tok = svc_page_token_encode(cur, svc_list_fingerprint("tuning-jobs"));
        char path[512];
        snprintf(path, sizeof path, "/v1/tuning-jobs?page_token=%s", tok);
        char *raw = NULL;
        json_t *j = at_req("GET", path, NULL, NULL, &st, &raw);
        cr_assert_eq(st, 400, "%s", raw);
        cr_assert_str_eq(json_string_value(json_object_get(j, "field")), "page_token", "%s", raw);
        cr_assert(strstr(raw, "does not fit this listing"), "%s", raw);
        json_decref(j);
        free(raw);
        free(tok);
        json_decref(cur);
    }
    cr_assert_eq(at_sql_int("SELECT count(*) FROM tuning_jobs"), 0, "nothing refused was stored");
}

/* A script job's search: a path its spec lacks is answered with what a script's search varies (its
 * hyperparameters), not the engine's fields; hyperband needs the script's hyperparameters.max_steps
 * (the step count it trains to) of at least max_resource, and then pauses its trials at their rungs
 * (stopping.max_steps: the ranks' KILN_PAUSE_AT_STEP). */
Test(tuning, a_script_jobs_search_is_told_what_it_may_vary)
{
    static const char script_req[] =
        "{\"name\": \"s\", \"job\": {\"name\": \"s\", \"entry_point\": \"train.py\", \"source\": \"/tmp\","
        " \"hyperparameters\": {\"lr\": 0.01%s}}, \"parameters\": {%s},"
        " \"objective\": {\"metric\": \"val_loss\", \"goal\": \"minimize\"}%s}";
    static const char hb[] = ", \"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 10, \"max_resource\": 90}";
    char body[1024];
    snprintf(body, sizeof body, script_req, "", "\"model.depth\": {\"type\": \"integer\", \"min\": 1, \"max\": 3}", "");
    refused(body, "parameters.model.depth", "a script job's search varies its hyperparameters");
    snprintf(body, sizeof body, script_req, "", LR, hb);
    refused(body, "job.hyperparameters.max_steps", "this one has none");
    snprintf(body, sizeof body, script_req, ", \"max_steps\": 50", LR, hb);
    refused(body, "job.hyperparameters.max_steps", "max_resource (90) is past the script's hyperparameters.max_steps (50)");
    cr_assert_eq(at_sql_int("SELECT count(*) FROM tuning_jobs"), 0, "nothing refused was stored");
}

/* GETs the tuning job until pred holds (asserting within 20 s); returns it (caller decrefs). */
static json_t *wait_tuning(const char *id, bool (*pred)(const json_t *t, void *ctx), void *ctx)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/tuning-jobs/%s", id);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        long st;
        json_t *t = at_req("GET", path, NULL, NULL, &st, NULL);
        cr_assert_eq(st, 200);
        if (pred(t, ctx))
            return t;
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > 20) {
            char *text = json_dumps(t, JSON_COMPACT);
            cr_assert_fail("tuning job %s never reached the awaited condition: %s", id, text);
        }
        json_decref(t);
        struct timespec pause = {0, 20 * 1000000};
        nanosleep(&pause, NULL); /* polls the condition; the controller runs on its own thread */
    }
}

/* Whether the tuning job has at least *ctx trials of its own (a warm start lists its parents'
 * after them, each with "parent"). */
static bool has_trials(const json_t *t, void *ctx)
{
    size_t own = 0, i;
    json_t *tr;
    json_array_foreach(json_object_get(t, "trials"), i, tr) own += json_object_get(tr, "parent") == NULL;
    return own >= (size_t)*(int *)ctx;
}
static bool in_state(const json_t *t, void *ctx)
{
    return !strcmp(json_string_value(json_object_get(t, "state")), (const char *)ctx);
}

static char *create(const char *body)
{
    long st;
    char *raw = NULL;
    json_t *j = at_req("POST", "/v1/tuning-jobs", body, NULL, &st, &raw);
    cr_assert_eq(st, 201, "%s", raw);
    free(raw);
    char *id = strdup(json_string_value(json_object_get(j, "id")));
    json_decref(j);
    return id;
}

/* A hyperband search over a script job whose hyperparameters.max_steps reaches max_resource: its
 * trials train to max_resource and pause at their first rung (stopping.max_steps, which the agent
 * gives the ranks as KILN_PAUSE_AT_STEP). */
Test(tuning, hyperband_over_a_script_job_pauses_its_trials_at_the_rungs)
{
    char *id = create("{\"name\": \"s\", \"job\": {\"name\": \"s\", \"entry_point\": \"train.py\", \"source\": \"/tmp\","
                      " \"hyperparameters\": {\"lr\": 0.01, \"max_steps\": 200}}, \"parameters\": {" LR "},"
                      " \"objective\": {\"metric\": \"val_loss\", \"goal\": \"minimize\"},"
                      " \"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 10, \"max_resource\": 90},"
                      " \"max_jobs\": 3, \"max_parallel_jobs\": 1, \"seed\": 1}");
    int one = 1;
    json_t *t = wait_tuning(id, has_trials, &one);
    cr_assert_eq(at_sql_int("SELECT count(*) FROM jobs WHERE tags->>'tuning_job' = '%s'"
                            " AND spec->>'entry_point' = 'train.py'"
                            " AND (spec #>> '{stopping,max_steps}')::int = 10"
                            " AND (spec #>> '{hyperparameters,max_steps}')::int = 90", id), 1,
                 "its first trial pauses at the first rung, within the max_resource steps it trains to");
    json_decref(t);
    free(id);
}

/* The trial's job: its id and its spec's hyperparameters / model. */
static json_t *trial_job(const json_t *trials, size_t i)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", json_string_value(json_object_get(json_array_get(trials, i), "job_id")));
    long st;
    json_t *j = at_req("GET", path, NULL, NULL, &st, NULL);
    cr_assert_eq(st, 200);
    return j;
}

Test(tuning, round_trip_seeded_trials_and_stop)
{
    const char *params = LR ", \"warmup_steps\": {\"type\": \"integer\", \"min\": 0, \"max\": 300},"
                         " \"model.n_embd\": {\"type\": \"categorical\", \"values\": [16, 32]}";
    char *id = create(request(params, "\"max_jobs\": 6, \"max_parallel_jobs\": 3, \"seed\": 7"));
    int three = 3;
    json_t *t = wait_tuning(id, has_trials, &three);
    cr_assert_str_eq(json_string_value(json_object_get(t, "state")), "RUNNING");
    cr_assert_str_eq(json_string_value(json_object_get(t, "strategy")), "random");
    cr_assert_eq(json_integer_value(json_object_get(t, "seed")), 7);
    cr_assert(json_is_null(json_object_get(t, "best")));
    json_t *trials = json_object_get(t, "trials");
    cr_assert_eq(json_array_size(trials), 3, "max_parallel_jobs caps the trials at once");
    for (size_t i = 0; i < 3; i++) {
        json_t *tr = json_array_get(trials, i);
        json_t *p = json_object_get(tr, "parameters");
        double lr = json_number_value(json_object_get(p, "lr"));
        json_int_t warm = json_integer_value(json_object_get(p, "warmup_steps"));
        json_int_t embd = json_integer_value(json_object_get(p, "model.n_embd"));
        cr_assert(lr >= 1e-4 && lr <= 1e-2 && json_is_integer(json_object_get(p, "warmup_steps")) && warm >= 0 &&
                  warm <= 300 && (embd == 16 || embd == 32), "trial %zu's values lie in their ranges", i);
        json_t *job = trial_job(trials, i);
        json_t *spec = json_object_get(job, "spec");
        cr_assert_float_eq(json_number_value(json_object_get(json_object_get(spec, "hyperparameters"), "lr")), lr, 1e-12,
                           "the trial's job trains with its lr");
        cr_assert_eq(json_integer_value(json_object_get(json_object_get(spec, "model"), "n_embd")), embd);
        cr_assert_str_eq(json_string_value(json_object_get(json_object_get(job, "tags"), "tuning_job")), id);
        cr_assert_eq(json_integer_value(json_object_get(job, "priority")), -1, "trials sit below ordinary jobs");
        json_decref(job);
    }
    /* the trials are searchable: tags.tuning_job and hp.* */
    {
        char body[300];
        snprintf(body, sizeof body, "{\"filter\": \"tags.tuning_job = \\\"%s\\\" AND hp.lr >= 0.0001\"}", id);
        long st;
        json_t *r = at_req("POST", "/v1/jobs:search", body, NULL, &st, NULL);
        cr_assert_eq(st, 200);
        cr_assert_eq(json_array_size(json_object_get(r, "jobs")), 3);
        json_decref(r);
    }
    /* the same seed gives the same trials */
    char *again = create(request(params, "\"max_jobs\": 6, \"max_parallel_jobs\": 3, \"seed\": 7"));
    json_t *t2 = wait_tuning(again, has_trials, &three);
    for (size_t i = 0; i < 3; i++)
        cr_assert(json_equal(json_object_get(json_array_get(trials, i), "parameters"),
                             json_object_get(json_array_get(json_object_get(t2, "trials"), i), "parameters")),
                  "trial %zu repeats with the seed", i);
    /* listed, without trials */
    long st;
    json_t *list = at_req("GET", "/v1/tuning-jobs", NULL, NULL, &st, NULL);
    cr_assert_eq(st, 200);
    cr_assert_eq(json_array_size(json_object_get(list, "tuning_jobs")), 2);
    cr_assert_null(json_object_get(json_array_get(json_object_get(list, "tuning_jobs"), 0), "trials"));
    json_decref(list);
    /* stopped: its trials stop (queued ones at once) and it ends STOPPED */
    char path[128];
    snprintf(path, sizeof path, "/v1/tuning-jobs/%s:stop", id);
    json_t *s = at_req("POST", path, "{}", NULL, &st, NULL);
    cr_assert_eq(st, 200);
    cr_assert(!strcmp(json_string_value(json_object_get(s, "state")), "STOPPING") ||
              !strcmp(json_string_value(json_object_get(s, "state")), "STOPPED"));
    json_decref(s);
    json_t *done = wait_tuning(id, in_state, "STOPPED");
    cr_assert(json_object_get(done, "ended_at") && !json_is_null(json_object_get(done, "ended_at")));
    size_t i;
    json_t *tr;
    json_array_foreach(json_object_get(done, "trials"), i, tr) {
        const char *st2 = json_string_value(json_object_get(tr, "state"));
        cr_assert(!strcmp(st2, "STOPPED") || !strcmp(st2, "STOPPING"), "trial %zu: %s", i, st2);
    }
    json_decref(at_req("POST", path, "{}", NULL, &st, NULL));
    cr_assert_eq(st, 409, "a stopped tuning job stops no more");
    json_decref(done);
    json_decref(t);
    json_decref(t2);
    free(id);
    free(again);
}

/* Runs the tuning job's trial n on the fixture's worker: reports metric (NULL: none) = value at the
 * step its stopping.max_steps pauses it at (step 5 when none), then exits with code. */
static void run_trial(const char *id, int n, const char *metric, double value, int code)
{
    int want = n + 1;
    json_t *t = wait_tuning(id, has_trials, &want);
    const char *job = json_string_value(json_object_get(json_array_get(json_object_get(t, "trials"), (size_t)n), "job_id"));
    int attempt = at_run_job(job);
    int64_t step = at_sql_int("SELECT coalesce((spec->'stopping'->>'max_steps')::bigint, 5) FROM jobs WHERE id = '%s'", job);
    Kiln__MetricPoint pts[2] = {KILN__METRIC_POINT__INIT, KILN__METRIC_POINT__INIT}, *pp[2] = {&pts[0], &pts[1]};
    pts[0].name = "train_loss";
    pts[0].step = step;
    pts[0].value = 3.0;
    pts[1].name = (char *)metric;
    pts[1].step = step;
    pts[1].value = value;
    Kiln__MetricBatch mb = KILN__METRIC_BATCH__INIT;
    mb.worker_id = at_worker;
    mb.job_id = (char *)job;
    mb.attempt = attempt;
    mb.n_points = metric ? 2 : 1;
    mb.points = pp;
    kiln_err_t err;
    cr_assert_eq(svc_agent_metrics(at_svc, at_worker, &mb, &err), 0, "%s", err.message);
    at_rank_exit(job, attempt, code);
    json_decref(t);
}

static bool ended(const json_t *t, void *ctx)
{
    (void)ctx;
    return kiln_tuning_ended(json_string_value(json_object_get(t, "state")));
}

Test(tuning, objective_never_reported_fails_with_the_metrics_seen)
{
    char *id = create(request(LR, "\"max_jobs\": 3, \"seed\": 1"));
    run_trial(id, 0, NULL, 0, 0);
    json_t *t = wait_tuning(id, ended, NULL);
    const char *reason = json_string_value(json_object_get(t, "reason"));
    cr_assert_str_eq(json_string_value(json_object_get(t, "state")), "FAILED", "%s", reason);
    cr_assert(strstr(reason, "\"val_loss\"") && strstr(reason, "train_loss"), "the reason names the metric and what "
              "was reported: %s", reason);
    cr_assert_eq(json_array_size(json_object_get(t, "trials")), 1, "no trial after the first");
    json_decref(t);
    free(id);
}

Test(tuning, failing_trials_end_it_after_max_failed_trials)
{
    char *id = create(request(LR, "\"max_jobs\": 5, \"seed\": 1, \"max_failed_trials\": 2"));
    run_trial(id, 0, "val_loss", 2.0, 1);
    run_trial(id, 1, "val_loss", 2.0, 1);
    json_t *t = wait_tuning(id, ended, NULL);
    const char *reason = json_string_value(json_object_get(t, "reason"));
    cr_assert_str_eq(json_string_value(json_object_get(t, "state")), "FAILED", "%s", reason);
    cr_assert(strstr(reason, "2 trial(s) failed"), "%s", reason);
    json_decref(t);
    free(id);
}

Test(tuning, completes_with_the_best_trial)
{
    char *id = create(request(LR, "\"max_jobs\": 3, \"seed\": 3"));
    run_trial(id, 0, "val_loss", 2.5, 0);
    run_trial(id, 1, "val_loss", 1.5, 0);
    run_trial(id, 2, "val_loss", 2.0, 0);
    json_t *t = wait_tuning(id, ended, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(t, "state")), "COMPLETED", "%s",
                     json_string_value(json_object_get(t, "reason")));
    json_t *best = json_object_get(t, "best");
    cr_assert_float_eq(json_number_value(json_object_get(best, "objective")), 1.5, 1e-9);
    cr_assert_str_eq(json_string_value(json_object_get(best, "job_id")),
                     json_string_value(json_object_get(json_array_get(json_object_get(t, "trials"), 1), "job_id")));
    cr_assert(json_equal(json_object_get(best, "parameters"),
                         json_object_get(json_array_get(json_object_get(t, "trials"), 1), "parameters")));
    cr_assert(json_array_size(json_object_get(t, "events")) >= 2, "RUNNING, then COMPLETED");
    json_decref(t);
    free(id);
}

static bool trial_1_promoted(const json_t *t, void *ctx)
{
    (void)ctx;
    return json_integer_value(json_object_get(json_array_get(json_object_get(t, "trials"), 1), "rung")) == 1;
}

/* Hyperband with three rungs (10, 30, 90): of three trials paused at rung 0 the best is promoted
 * and pauses again at rung 1 (its job's stopping.max_steps becomes 30, not the end); alone there,
 * it is not promoted again, and when the search ends the trials still paused end COMPLETED. */
Test(tuning, a_promoted_trial_pauses_at_its_next_rung_and_paused_trials_end_with_the_search)
{
    char *id = create(request(LR, "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 10,"
                                  " \"max_resource\": 90, \"reduction_factor\": 3}, \"max_jobs\": 3,"
                                  " \"max_parallel_jobs\": 1, \"seed\": 1"));
    double obj[3] = {3.0, 1.0, 2.0};
    for (int n = 0; n < 3; n++)
        run_trial(id, n, "val_loss", obj[n], 0);
    json_t *t = wait_tuning(id, trial_1_promoted, NULL);
    json_t *job = trial_job(json_object_get(t, "trials"), 1);
    json_t *stopping = json_object_get(json_object_get(job, "spec"), "stopping");
    cr_assert_eq(json_integer_value(json_object_get(stopping, "max_steps")), 30,
                 "the promoted trial pauses at rung 1 (30 steps), not at %lld",
                 (long long)json_integer_value(json_object_get(stopping, "max_steps")));
    json_decref(job);
    json_decref(t);
    run_trial(id, 1, "val_loss", 0.5, 0);
    t = wait_tuning(id, ended, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(t, "state")), "COMPLETED", "%s",
                     json_string_value(json_object_get(t, "reason")));
    size_t i;
    json_t *tr;
    json_array_foreach(json_object_get(t, "trials"), i, tr)
        cr_assert_str_eq(json_string_value(json_object_get(tr, "state")), "COMPLETED", "trial %zu", i);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(json_object_get(t, "trials"), 1), "rung")), 1);
    json_decref(t);
    free(id);
}

Test(tuning, target_objective_ends_it_early)
{
    char *id = create(request(LR, "\"max_jobs\": 5, \"seed\": 3, \"completion\": {\"target_objective\": 1.0}"));
    run_trial(id, 0, "val_loss", 0.9, 0);
    json_t *t = wait_tuning(id, ended, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(t, "state")), "COMPLETED");
    cr_assert(strstr(json_string_value(json_object_get(t, "reason")), "target"));
    cr_assert_eq(json_array_size(json_object_get(t, "trials")), 1);
    json_decref(t);
    free(id);
}

/* A stopped hyperband search stops its paused trials as well as its running ones: a trial paused
 * at its rung is never promoted now, and ends STOPPED with the others. */
Test(tuning, a_stopped_search_stops_its_paused_trials)
{
    char *id = create(request(LR, "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 10,"
                                  " \"max_resource\": 90, \"reduction_factor\": 3}, \"max_jobs\": 3,"
                                  " \"max_parallel_jobs\": 1, \"seed\": 1"));
    run_trial(id, 0, "val_loss", 3.0, 0);
    int two = 2;
    json_t *t = wait_tuning(id, has_trials, &two); /* trial 0 paused at rung 0, trial 1 submitted */
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(t, "trials"), 0), "state")),
                     "PAUSED");
    json_decref(t);
    char path[128];
    snprintf(path, sizeof path, "/v1/tuning-jobs/%s:stop", id);
    long st;
    json_decref(at_req("POST", path, "{}", NULL, &st, NULL));
    cr_assert_eq(st, 200);
    t = wait_tuning(id, in_state, "STOPPED");
    size_t i;
    json_t *tr;
    json_array_foreach(json_object_get(t, "trials"), i, tr)
        cr_assert_str_eq(json_string_value(json_object_get(tr, "state")), "STOPPED", "trial %zu", i);
    json_decref(t);
    free(id);
}

/* A failed search's reason quotes its own last failed trial, not one of a warm start parent's
 * (whose trials are its history, after its own). */
Test(tuning, a_failed_search_quotes_its_own_last_failure_not_a_parents)
{
    char *parent = create(request(LR, "\"max_jobs\": 1, \"seed\": 1, \"max_failed_trials\": 1"));
    run_trial(parent, 0, "val_loss", 2.0, 3);
    json_t *p = wait_tuning(parent, ended, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(p, "state")), "FAILED");
    cr_assert(strstr(json_string_value(json_object_get(p, "reason")), "exited with code 3"), "%s",
              json_string_value(json_object_get(p, "reason")));
    json_decref(p);
    char extra[400];
    snprintf(extra, sizeof extra, "\"max_jobs\": 2, \"seed\": 2, \"max_failed_trials\": 1, \"warm_start\":"
             " {\"parents\": [\"%s\"], \"type\": \"transfer_learning\"}", parent);
    char *child = create(request(LR, extra));
    run_trial(child, 0, "val_loss", 2.0, 1);
    json_t *c = wait_tuning(child, ended, NULL);
    const char *reason = json_string_value(json_object_get(c, "reason"));
    cr_assert_str_eq(json_string_value(json_object_get(c, "state")), "FAILED", "%s", reason);
    cr_assert(strstr(reason, "1 trial(s) failed") && strstr(reason, "exited with code 1"), "%s", reason);
    cr_assert_null(strstr(reason, "code 3"), "the parent's failure was quoted as the search's own: %s", reason);
    json_decref(c);
    free(parent);
    free(child);
}

#define HYPERBAND3 "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 10, \"max_resource\": 90," \
                   " \"reduction_factor\": 3}"

/* A hyperband trial that reaches its first rung without reporting the objective fails the search,
 * and no objective is recorded for it at that rung (none was reported). */
Test(tuning, a_trial_paused_without_the_objective_records_no_rung_objective)
{
    char *id = create(request(LR, HYPERBAND3 ", \"max_jobs\": 3, \"max_parallel_jobs\": 1, \"seed\": 1"));
    run_trial(id, 0, NULL, 0, 0);
    json_t *t = wait_tuning(id, ended, NULL);
    const char *reason = json_string_value(json_object_get(t, "reason"));
    cr_assert_str_eq(json_string_value(json_object_get(t, "state")), "FAILED", "%s", reason);
    cr_assert(strstr(reason, "reached its first rung"), "%s", reason);
    json_t *rungs = json_object_get(json_array_get(json_object_get(t, "trials"), 0), "rungs");
    cr_assert_eq(json_array_size(rungs), 0, "an objective was recorded that the trial never reported");
    json_decref(t);
    free(id);
}

/* Each hyperband trial's job first trains to its bracket's first rung (stopping.max_steps), and a
 * trial of the bracket of the last rung alone (trial 3 here: three brackets of rungs 10, 30 and 90
 * share trials 4:2:1) trains straight to max_resource, with no pause. */
Test(tuning, a_hyperband_trial_of_the_last_rungs_bracket_runs_to_max_resource)
{
    char *id = create(request(LR, "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 10,"
                                  " \"max_resource\": 90, \"reduction_factor\": 3, \"brackets\": 3}, \"max_jobs\": 4,"
                                  " \"max_parallel_jobs\": 4, \"seed\": 1"));
    int four = 4;
    json_t *t = wait_tuning(id, has_trials, &four);
    static const int pause[4] = {10, 30, 10, 0};
    for (size_t n = 0; n < 4; n++) {
        json_t *job = trial_job(json_object_get(t, "trials"), n);
        json_t *spec = json_object_get(job, "spec");
        json_t *at = json_object_get(json_object_get(spec, "stopping"), "max_steps");
        if (pause[n])
            cr_assert_eq(json_integer_value(at), pause[n], "trial %zu pauses at %lld", n, (long long)json_integer_value(at));
        else
            cr_assert_null(at, "trial %zu pauses at %lld", n, (long long)json_integer_value(at));
        cr_assert_eq(json_integer_value(json_object_get(json_object_get(spec, "hyperparameters"), "max_steps")), 90);
        json_decref(job);
    }
    json_decref(t);
    free(id);
}

/* ---- warm start ------------------------------------------------------------------------------ */

#define WARMUP4 "\"warmup_steps\": {\"type\": \"integer\", \"min\": 0, \"max\": 3}"

/* The configuration text of a trial's parameters, for comparing. Caller frees. */
static char *config_text(const json_t *tr)
{
    return json_dumps(json_object_get(tr, "parameters"), JSON_COMPACT | JSON_SORT_KEYS);
}

/* The list's entry for tuning job id (caller decrefs). */
static json_t *listed(const char *id)
{
    long st;
    json_t *list = at_req("GET", "/v1/tuning-jobs", NULL, NULL, &st, NULL);
    cr_assert_eq(st, 200);
    size_t i;
    json_t *o, *found = NULL;
    json_array_foreach(json_object_get(list, "tuning_jobs"), i, o) if (!strcmp(json_string_value(json_object_get(o, "id")), id))
        found = json_incref(o);
    json_decref(list);
    cr_assert_not_null(found, "tuning job %s is listed", id);
    return found;
}

Test(tuning, warm_start_draws_no_parent_configuration_and_keeps_its_best_until_beaten)
{
    /* the parent: 2 of the 4 points, best 1.0 */
    char *parent = create(request(WARMUP4, "\"max_jobs\": 2, \"seed\": 5"));
    run_trial(parent, 0, "val_loss", 1.0, 0);
    run_trial(parent, 1, "val_loss", 2.0, 0);
    json_t *p = wait_tuning(parent, ended, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(p, "state")), "COMPLETED");
    json_t *ptrials = json_object_get(p, "trials");
    cr_assert_eq(json_array_size(ptrials), 2);
    char *tried[2] = {config_text(json_array_get(ptrials, 0)), config_text(json_array_get(ptrials, 1))};
    const char *parent_best = json_string_value(json_object_get(json_object_get(p, "best"), "job_id"));
    cr_assert_str_eq(parent_best, json_string_value(json_object_get(json_array_get(ptrials, 0), "job_id")));
    {
        json_t *l = listed(parent);
        cr_assert_eq(json_integer_value(json_object_get(l, "trials_done")), 2);
        cr_assert_eq(json_integer_value(json_object_get(l, "trials_running")), 0);
        cr_assert_str_eq(json_string_value(json_object_get(json_object_get(l, "best"), "job_id")), parent_best);
        json_decref(l);
    }

    /* the child: the same seed, so without the parent's history its trials would be the parent's */
    char extra[400];
    snprintf(extra, sizeof extra, "\"max_jobs\": 2, \"seed\": 5, \"warm_start\": {\"parents\": [\"%s\"],"
             " \"type\": \"identical_data_and_algorithm\"}", parent);
    char *child = create(request(WARMUP4, extra));
    int one = 1;
    json_t *c = wait_tuning(child, has_trials, &one);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(c, "warm_start"), "type")),
                     "identical_data_and_algorithm");
    json_t *best = json_object_get(c, "best");
    cr_assert_str_eq(json_string_value(json_object_get(best, "job_id")), parent_best, "the parent's best is the best");
    cr_assert_str_eq(json_string_value(json_object_get(best, "parent")), parent);
    cr_assert_float_eq(json_number_value(json_object_get(best, "objective")), 1.0, 1e-9);
    {
        json_t *l = listed(child);
        cr_assert_eq(json_integer_value(json_object_get(l, "trials_done")), 0);
        cr_assert_eq(json_integer_value(json_object_get(l, "trials_running")), 1);
        cr_assert_str_eq(json_string_value(json_object_get(json_object_get(l, "best"), "job_id")), parent_best);
        json_decref(l);
    }
    json_decref(c);
    /* a trial worse than the parent's best leaves it best */
    run_trial(child, 0, "val_loss", 1.5, 0);
    int two = 2;
    c = wait_tuning(child, has_trials, &two);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(c, "best"), "job_id")), parent_best);
    json_decref(c);
    /* one better beats it */
    run_trial(child, 1, "val_loss", 0.5, 0);
    c = wait_tuning(child, ended, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(c, "state")), "COMPLETED", "%s",
                     json_string_value(json_object_get(c, "reason")));
    json_t *trials = json_object_get(c, "trials");
    cr_assert_eq(json_array_size(trials), 4, "its 2 trials, then the parent's 2");
    for (size_t i = 0; i < 2; i++) {
        json_t *tr = json_array_get(trials, i);
        cr_assert_null(json_object_get(tr, "parent"));
        char *mine = config_text(tr);
        cr_assert(strcmp(mine, tried[0]) && strcmp(mine, tried[1]), "trial %zu repeats a parent's configuration: %s", i,
                  mine);
        free(mine);
    }
    for (size_t i = 2; i < 4; i++)
        cr_assert_str_eq(json_string_value(json_object_get(json_array_get(trials, i), "parent")), parent);
    best = json_object_get(c, "best");
    cr_assert_float_eq(json_number_value(json_object_get(best, "objective")), 0.5, 1e-9);
    cr_assert_str_eq(json_string_value(json_object_get(best, "job_id")),
                     json_string_value(json_object_get(json_array_get(trials, 1), "job_id")));
    cr_assert(json_is_null(json_object_get(best, "parent")));
    {
        json_t *l = listed(child);
        cr_assert_eq(json_integer_value(json_object_get(l, "trials_done")), 2);
        cr_assert_float_eq(json_number_value(json_object_get(json_object_get(l, "best"), "objective")), 0.5, 1e-9);
        json_decref(l);
    }
    json_decref(c);
    json_decref(p);
    free(tried[0]);
    free(tried[1]);
    free(parent);
    free(child);
}

/* A parent that ended while one of its trials was still stopping (its search failed, and the
 * running trial it stopped waits for its ranks to exit): in the child that trial is history, a
 * stopped one, not a trial the child waits for, so the child ends once its own trials have. */
Test(tuning, warm_start_from_a_parent_whose_trial_is_still_stopping_does_not_wait_for_it)
{
    char *parent = create(request(LR, "\"max_jobs\": 2, \"max_parallel_jobs\": 2, \"seed\": 1,"
                                      " \"max_failed_trials\": 1"));
    int two = 2;
    json_t *p = wait_tuning(parent, has_trials, &two);
    char *stopping = strdup(json_string_value(json_object_get(json_array_get(json_object_get(p, "trials"), 1), "job_id")));
    json_decref(p);
    int attempt = at_run_job(stopping); /* trial 1 runs */
    run_trial(parent, 0, "val_loss", 2.0, 3); /* trial 0 fails: the search fails and stops trial 1 */
    p = wait_tuning(parent, ended, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(p, "state")), "FAILED", "%s",
                     json_string_value(json_object_get(p, "reason")));
    json_decref(p);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", stopping);
    long st;
    json_t *j = at_req("GET", path, NULL, NULL, &st, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(j, "state")), "STOPPING", "its ranks have not exited");
    json_decref(j);

    char extra[400];
    snprintf(extra, sizeof extra, "\"max_jobs\": 1, \"seed\": 2, \"warm_start\": {\"parents\": [\"%s\"],"
             " \"type\": \"transfer_learning\"}", parent);
    char *child = create(request(LR, extra));
    run_trial(child, 0, "val_loss", 1.0, 0);
    json_t *c = wait_tuning(child, ended, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(c, "state")), "COMPLETED", "%s",
                     json_string_value(json_object_get(c, "reason")));
    json_decref(c);
    j = at_req("GET", path, NULL, NULL, &st, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(j, "state")), "STOPPING",
                     "the parent's trial was still stopping when the child ended");
    json_decref(j);
    at_rank_exit(stopping, attempt, 143);
    free(stopping);
    free(parent);
    free(child);
}

Test(tuning, warm_start_refuses_parents_it_cannot_use_naming_the_field)
{
    char body[10000], extra[1200];
    /* more than 5, not an id, no type: the validator's */
    snprintf(extra, sizeof extra, "\"warm_start\": {\"parents\": [\"%s\", \"%s\", \"%s\", \"%s\", \"%s\", \"%s\"],"
             " \"type\": \"transfer_learning\"}", "00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002",
             "00000000-0000-4000-8000-000000000003", "00000000-0000-4000-8000-000000000004",
             "00000000-0000-4000-8000-000000000005", "00000000-0000-4000-8000-000000000006");
    refused(request(LR, extra), "warm_start.parents", "1 to 5");
    refused(request(LR, "\"warm_start\": {\"parents\": [\"lr-sweep\"], \"type\": \"transfer_learning\"}"),
            "warm_start.parents[0]", "not a tuning job id");
    refused(request(LR, "\"warm_start\": {\"parents\": [\"00000000-0000-4000-8000-000000000001\"]}"), "warm_start.type",
            "identical_data_and_algorithm");
    /* missing */
    refused(request(LR, "\"warm_start\": {\"parents\": [\"00000000-0000-4000-8000-000000000001\"],"
                        " \"type\": \"transfer_learning\"}"),
            "warm_start.parents[0]", "not found");
    /* still running */
    char *running = create(request(LR, "\"max_jobs\": 3, \"seed\": 1"));
    snprintf(extra, sizeof extra, "\"warm_start\": {\"parents\": [\"%s\"], \"type\": \"transfer_learning\"}", running);
    refused(request(LR, extra), "warm_start.parents[0]", "is RUNNING");
    /* another objective: an ended parent that minimised train_loss */
    snprintf(body, sizeof body, "{\"name\": \"other\", \"job\": " BASE_JOB ", \"parameters\": {" LR "},"
             " \"objective\": {\"metric\": \"train_loss\"}, \"max_jobs\": 1, \"seed\": 2}");
    char *other = create(body);
    run_trial(other, 0, "val_loss", 1.0, 0);
    json_decref(wait_tuning(other, ended, NULL));
    snprintf(extra, sizeof extra, "\"warm_start\": {\"parents\": [\"%s\", \"%s\"], \"type\": \"transfer_learning\"}",
             "00000000-0000-4000-8000-000000000009", other);
    refused(request(LR, extra), "warm_start.parents[0]", "not found");
    snprintf(extra, sizeof extra, "\"warm_start\": {\"parents\": [\"%s\"], \"type\": \"transfer_learning\"}", other);
    refused(request(LR, extra), "warm_start.parents[0]", "objective is train_loss (minimize), not val_loss");
    /* the same metric, the other goal: an ended parent that maximised val_loss */
    snprintf(body, sizeof body, "{\"name\": \"up\", \"job\": " BASE_JOB ", \"parameters\": {" LR "},"
             " \"objective\": {\"metric\": \"val_loss\", \"goal\": \"maximize\"}, \"max_jobs\": 1, \"seed\": 2}");
    char *up = create(body);
    run_trial(up, 0, "val_loss", 1.0, 0);
    json_decref(wait_tuning(up, ended, NULL));
    snprintf(extra, sizeof extra, "\"warm_start\": {\"parents\": [\"%s\"], \"type\": \"transfer_learning\"}", up);
    refused(request(LR, extra), "warm_start.parents[0]", "objective is val_loss (maximize), not val_loss (minimize)");
    free(up);
    /* identical_data_and_algorithm: other parameter names */
    snprintf(body, sizeof body, "{\"name\": \"same\", \"job\": " BASE_JOB ", \"parameters\": {" WARMUP4 "},"
             " \"objective\": {\"metric\": \"val_loss\"}, \"max_jobs\": 1, \"seed\": 2}");
    char *same = create(body);
    run_trial(same, 0, "val_loss", 1.0, 0);
    json_decref(wait_tuning(same, ended, NULL));
    snprintf(extra, sizeof extra, "\"warm_start\": {\"parents\": [\"%s\"], \"type\": \"identical_data_and_algorithm\"}",
             same);
    refused(request(LR, extra), "warm_start.type", "same names");
    /* in another project */
    long st;
    json_decref(at_req("POST", "/v1/projects", "{\"name\": \"elsewhere\"}", NULL, &st, NULL));
    cr_assert_eq(st, 201);
    snprintf(body, sizeof body, "{\"job\": {\"project\": \"elsewhere\", \"model\": {\"type\": \"gpt\", \"n_layer\": 1,"
             " \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"file:///tmp/kiln-api-test.txt\"},"
             " \"hyperparameters\": {\"max_steps\": 500}, \"resources\": {\"nodes\": 1, \"slots_per_node\": 1,"
             " \"slot_type\": \"cpu\"}}, \"parameters\": {" LR "}, \"objective\": {\"metric\": \"val_loss\"}, \"max_jobs\": 1}");
    char *away = create(body);
    snprintf(extra, sizeof extra, "\"warm_start\": {\"parents\": [\"%s\"], \"type\": \"transfer_learning\"}", away);
    refused(request(LR, extra), "warm_start.parents[0]", "in project \\\"elsewhere\\\"");
    /* transfer_learning takes the parent with other parameters */
    snprintf(extra, sizeof extra, "\"max_jobs\": 1, \"warm_start\": {\"parents\": [\"%s\"], \"type\": \"transfer_learning\"}",
             same);
    char *ok = create(request(LR, extra));
    cr_assert_eq(at_sql_int("SELECT count(*) FROM tuning_jobs WHERE spec->'warm_start'->>'type' = 'transfer_learning'"), 1,
                 "only the one accepted was stored");
    free(running);
    free(other);
    free(same);
    free(away);
    free(ok);
}

/* ---- what a job submitted by the same caller meets ------------------------------------------- */

/* The controller submits trials as kilnd, so submission asks for the submitter what a job of
 * theirs would be asked: a base job or a trial's value that starts from another project's model,
 * or reads a file outside every data root, is a 400 then, not a trial run (or failed) later. */
Test(tuning, base_job_and_trials_meet_the_submitters_job_checks)
{
    long st;
    char *raw = NULL;
    json_decref(at_req("POST", "/v1/projects", "{\"name\": \"secret\"}", NULL, &st, NULL));
    cr_assert_eq(st, 201);
    json_decref(at_req("POST", "/v1/projects", "{\"name\": \"mine\"}", NULL, &st, NULL));
    cr_assert_eq(st, 201);
    json_decref(at_req("POST", "/v1/users", "{\"name\": \"carol\"}", NULL, &st, NULL));
    cr_assert_eq(st, 201);
    json_decref(at_req("PUT", "/v1/projects/mine/members/carol", "{\"role\": \"editor\"}", NULL, &st, NULL));
    cr_assert_eq(st, 200);
    json_t *t = at_req("POST", "/v1/users/carol/tokens", "{}", NULL, &st, &raw);
    cr_assert_eq(st, 201, "%s", raw);
    char carol[128];
    kiln_strlcpy(carol, json_string_value(json_object_get(t, "token")), sizeof carol);
    json_decref(t);
    free(raw);
    /* a job of project secret, whose model carol may not start from */
    char body[8192];
    snprintf(body, sizeof body, "{\"project\": \"secret\", \"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2,"
             " \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"file:///tmp/kiln-api-test.txt\"},"
             " \"hyperparameters\": {\"max_steps\": 5}, \"resources\": {\"slot_type\": \"cpu\"}}");
    t = at_req("POST", "/v1/jobs", body, NULL, &st, &raw);
    cr_assert_eq(st, 201, "%s", raw);
    char src[64];
    kiln_strlcpy(src, json_string_value(json_object_get(t, "id")), sizeof src);
    json_decref(t);
    free(raw);
#define MINE_JOB(INIT, TRAIN)                                                                                    \
    "{\"project\": \"mine\", \"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16,"     \
    " \"seq_len\": 8" INIT "}, \"data\": {\"train\": \"" TRAIN "\"}, \"hyperparameters\": {\"lr\": 0.001,"       \
    " \"max_steps\": 5}, \"resources\": {\"slot_type\": \"cpu\"}}"
    snprintf(body, sizeof body, "{\"job\": " MINE_JOB(", \"init_from\": \"job:%s\"", "/tmp/kiln-api-test.txt")
             ", \"parameters\": {" LR "}, \"objective\": {\"metric\": \"val_loss\"}}", src);
    refused_as(carol, body, 400, "job.model.init_from", "a project you cannot read");
    /* the same refusal carol's own job gets */
    snprintf(body, sizeof body, MINE_JOB(", \"init_from\": \"job:%s\"", "/tmp/kiln-api-test.txt"), src);
    {
        char auth[256];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", carol);
        const char *hdrs[] = {auth, NULL};
        json_t *j = at_req("POST", "/v1/jobs", body, hdrs, &st, &raw);
        cr_assert_eq(st, 400, "%s", raw);
        cr_assert_str_eq(json_string_value(json_object_get(j, "field")), "model.init_from", "%s", raw);
        json_decref(j);
        free(raw);
    }
    /* a file outside the fixture worker's data root (/tmp): in the base job, and as a trial's value */
    snprintf(body, sizeof body, "{\"job\": " MINE_JOB("", "/srv/corpus.txt") ", \"parameters\": {" LR "},"
             " \"objective\": {\"metric\": \"val_loss\"}}");
    refused_as(carol, body, 400, "job.data.train", "not inside a data root");
    snprintf(body, sizeof body, "{\"job\": " MINE_JOB("", "/tmp/kiln-api-test.txt") ", \"parameters\": {\"data.train\":"
             " {\"type\": \"categorical\", \"values\": [\"/tmp/kiln-api-test.txt\", \"/srv/corpus.txt\"]}},"
             " \"objective\": {\"metric\": \"val_loss\"}}");
    refused_as(carol, body, 400, "parameters.data.train.values[1]", "not inside a data root");
    /* a file in another project's area (403, as for a job of carol's) */
    snprintf(body, sizeof body, "{\"job\": " MINE_JOB("", "/tmp/kiln-api-test.txt") ", \"parameters\": {\"data.train\":"
             " {\"type\": \"categorical\", \"values\": [\"/tmp/kiln-api-test.txt\", \"/tmp/.kiln/secret/corpus.txt\"]}},"
             " \"objective\": {\"metric\": \"val_loss\"}}");
    refused_as(carol, body, 403, "parameters.data.train.values[1]", "another project");
#undef MINE_JOB
    cr_assert_eq(at_sql_int("SELECT count(*) FROM tuning_jobs"), 0, "nothing refused was stored");
}

/* A hyperband trial trains max_resource steps whatever the base job's max_steps: its values are
 * checked against those steps, so a warmup the base job's 500 steps would refuse is accepted. */
Test(tuning, hyperband_checks_values_against_the_steps_its_trials_train)
{
    {
        long st;
        char *raw = NULL;
        json_t *j = at_req("POST", "/v1/tuning-jobs",
                           request("\"warmup_steps\": {\"type\": \"integer\", \"min\": 0, \"max\": 800}",
                                   "\"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 100,"
                                   " \"max_resource\": 1000}"),
                           NULL, &st, &raw);
        cr_assert_eq(st, 201, "%s", raw);
        json_decref(j);
        free(raw);
    }
}

/* Numbers past what a 64-bit integer holds are kept as sent. PostgreSQL writes a jsonb number
 * without an exponent (1e20 comes back as 100000000000000000000), which jansson refuses as an
 * integer: kilnd read such a job's spec as {} and such a tuning job not at all (its project
 * missing, a read crashed kilnd). A script job's free-form hyperparameters and a categorical
 * parameter's values may hold any number. */
Test(tuning, numbers_past_64_bit_integers_are_kept)
{
    long st;
    char *raw = NULL;
    json_t *j = at_req("POST", "/v1/jobs",
                       "{\"name\": \"big\", \"entry_point\": \"train.py\", \"source\": \"/tmp\", \"hyperparameters\": "
                       "{\"big\": 1e20, \"neg\": -2.5e300, \"mid\": 1e18, \"deep\": [1e19, {\"x\": -1e25}]}}",
                       NULL, &st, &raw);
    cr_assert_eq(st, 201, "%s", raw);
    free(raw);
    char path[160];
    snprintf(path, sizeof path, "/v1/jobs/%s", json_string_value(json_object_get(j, "id")));
    json_decref(j);
    j = at_req("GET", path, NULL, NULL, &st, NULL);
    cr_assert_eq(st, 200);
    json_t *h = json_object_get(json_object_get(j, "spec"), "hyperparameters");
    cr_assert_eq(json_number_value(json_object_get(h, "big")), 1e20);
    cr_assert_eq(json_number_value(json_object_get(h, "neg")), -2.5e300);
    cr_assert_eq(json_number_value(json_object_get(h, "mid")), 1e18);
    cr_assert_eq(json_number_value(json_array_get(json_object_get(h, "deep"), 0)), 1e19);
    cr_assert_eq(json_number_value(json_object_get(json_array_get(json_object_get(h, "deep"), 1), "x")), -1e25);
    json_decref(j);

    char *id = create("{\"name\": \"big\", \"job\": {\"name\": \"s\", \"entry_point\": \"train.py\", \"source\": \"/tmp\","
                      " \"hyperparameters\": {\"lr\": 0.01, \"big\": 1e20}}, \"parameters\": {\"scale\": "
                      "{\"type\": \"categorical\", \"values\": [1e20, 2]}},"
                      " \"objective\": {\"metric\": \"val_loss\", \"goal\": \"minimize\"}, \"max_jobs\": 2}");
    int one = 1;
    json_t *t = wait_tuning(id, has_trials, &one);
    cr_assert_str_eq(json_string_value(json_object_get(t, "project")), "default");
    double scale = json_number_value(
        json_object_get(json_object_get(json_array_get(json_object_get(t, "trials"), 0), "parameters"), "scale"));
    cr_assert(scale == 1e20 || scale == 2, "the trial takes one of the values as sent (%g)", scale);
    json_decref(t);
    json_t *list = at_req("GET", "/v1/tuning-jobs", NULL, NULL, &st, NULL);
    cr_assert_eq(st, 200);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(list, "tuning_jobs"), 0), "id")),
                     id);
    json_decref(list);
    snprintf(path, sizeof path, "/v1/tuning-jobs/%s:stop", id);
    json_t *s = at_req("POST", path, "{}", NULL, &st, NULL);
    cr_assert_eq(st, 200);
    json_decref(s);
    json_decref(wait_tuning(id, in_state, "STOPPED"));
    free(id);
}
