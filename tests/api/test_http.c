/* test_http.c - the REST routes over real HTTP against an in-process service on a fresh
 * database: job creation and validation errors, idempotency, listing and paging, stop and
 * events, metrics, workers, health, and the error shapes for unknown paths and methods. */
#include <criterion/criterion.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/api/api_test.h"

TestSuite(http, .init = at_setup, .fini = at_teardown, .timeout = 60);

static void assert_error_shape(json_t *j, const char *code)
{
    cr_assert_str_eq(json_string_value(json_object_get(j, "code")), code);
    cr_assert(json_is_string(json_object_get(j, "message")));
    cr_assert(strlen(json_string_value(json_object_get(j, "message"))) > 0);
    cr_assert(json_is_string(json_object_get(j, "detail")));
    cr_assert(json_is_string(json_object_get(j, "hint")));
}

Test(http, create_good_job_is_201_queued)
{
    long st;
    char *raw;
    json_t *j = at_req("POST", "/v1/jobs", at_good_spec(), NULL, &st, &raw);
    cr_assert_eq(st, 201, "%s", raw);
    const char *id = json_string_value(json_object_get(j, "id"));
    cr_assert(id && strlen(id) == 36, "%s", raw);
    cr_assert_str_eq(json_string_value(json_object_get(j, "state")), "QUEUED");
    cr_assert_str_eq(json_string_value(json_object_get(j, "name")), "good");
    json_t *spec = json_object_get(j, "spec");
    cr_assert(json_is_object(spec), "the job carries its normalised spec: %s", raw);
    cr_assert(json_object_get(json_object_get(spec, "hyperparameters"), "warmup_steps"),
              "defaults are filled: %s", raw);

    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    char *raw2;
    json_t *g = at_req("GET", path, NULL, NULL, &st, &raw2);
    cr_assert_eq(st, 200, "%s", raw2);
    cr_assert_str_eq(json_string_value(json_object_get(g, "id")), id);
    json_decref(g);
    free(raw2);
    json_decref(j);
    free(raw);
}

Test(http, bad_json_is_400_with_line_and_column)
{
    long st;
    char *raw;
    json_t *j = at_req("POST", "/v1/jobs", "{\"name\": \"x\",\n  \"model\": {\"type\": }\n}", NULL, &st, &raw);
    cr_assert_eq(st, 400, "%s", raw);
    assert_error_shape(j, "bad_format");
    const char *msg = json_string_value(json_object_get(j, "message"));
    cr_assert(strstr(msg, "line 2"), "message names the line: %s", msg);
    cr_assert(strstr(msg, "column"), "message names the column: %s", msg);
    json_decref(j);
    free(raw);

    j = at_req("POST", "/v1/jobs", "[1, 2]", NULL, &st, &raw);
    cr_assert_eq(st, 400, "%s", raw);
    json_decref(j);
    free(raw);

    j = at_req("POST", "/v1/jobs", "", NULL, &st, &raw);
    cr_assert_eq(st, 400, "empty body: %s", raw);
    json_decref(j);
    free(raw);
}

/* Replaces the first occurrence of from in the good spec with to. */
static char *spec_with(const char *from, const char *to)
{
    const char *g = at_good_spec();
    const char *p = strstr(g, from);
    cr_assert(p, "fixture spec lacks %s", from);
    char *out = malloc(strlen(g) + strlen(to) + 1);
    sprintf(out, "%.*s%s%s", (int)(p - g), g, to, p + strlen(from));
    return out;
}

static void expect_bad_field(const char *from, const char *to, const char *field)
{
    char *body = spec_with(from, to);
    long st;
    char *raw;
    json_t *j = at_req("POST", "/v1/jobs", body, NULL, &st, &raw);
    cr_assert_eq(st, 400, "%s -> %s", body, raw);
    assert_error_shape(j, "invalid_argument");
    cr_assert_str_eq(json_string_value(json_object_get(j, "field")), field, "%s", raw);
    json_decref(j);
    free(raw);
    free(body);
}

Test(http, bad_spec_is_400_naming_the_field)
{
    expect_bad_field("\"lr\": 0.001", "\"lr\": -1", "hyperparameters.lr");
    expect_bad_field("\"n_head\": 2", "\"n_head\": 3", "model.n_head");
    expect_bad_field("\"max_steps\": 5", "\"max_steps\": 5, \"learning_rate\": 1", "hyperparameters.learning_rate");
    /* a regex metric's step group that can never capture a step (the gRPC twin: test_badinput.c) */
    expect_bad_field("\"max_steps\": 5}", "\"max_steps\": 5}, \"metric_definitions\": [{\"name\": \"x\","
                     " \"regex\": \"step (?<step>[a-z]+) ([0-9.]+)\"}]", "metric_definitions[0].regex");
}

Test(http, a_job_no_worker_fits_is_accepted_and_says_what_it_waits_for)
{
    /* the fixture's cluster is one 4-slot CPU worker: a GPU job waits for a GPU worker */
    char *body = spec_with("\"slot_type\": \"cpu\"", "\"slot_type\": \"gpu\"");
    long st;
    char *raw;
    json_t *j = at_req("POST", "/v1/jobs", body, NULL, &st, &raw);
    cr_assert_eq(st, 201, "%s", raw);
    cr_assert_str_eq(json_string_value(json_object_get(j, "state")), "QUEUED");
    const char *why = json_string_value(json_object_get(j, "reason"));
    cr_assert(why && strstr(why, "waiting for workers") && strstr(why, "gpu"), "%s", raw);
    json_decref(j);
    free(raw);
    free(body);
}

Test(http, idempotent_retry_returns_the_same_job)
{
    const char *h1[] = {"Idempotency-Key: key-one", NULL};
    const char *h2[] = {"Idempotency-Key: key-two", NULL};
    long st;
    char *raw;
    json_t *a = at_req("POST", "/v1/jobs", at_good_spec(), h1, &st, &raw);
    cr_assert_eq(st, 201, "%s", raw);
    free(raw);
    json_t *b = at_req("POST", "/v1/jobs", at_good_spec(), h1, &st, &raw);
    cr_assert_eq(st, 200, "a retry is 200: %s", raw);
    free(raw);
    json_t *c = at_req("POST", "/v1/jobs", at_good_spec(), h2, &st, &raw);
    cr_assert_eq(st, 201, "another key is a new job: %s", raw);
    free(raw);
    const char *ida = json_string_value(json_object_get(a, "id"));
    cr_assert_str_eq(ida, json_string_value(json_object_get(b, "id")));
    cr_assert_str_neq(ida, json_string_value(json_object_get(c, "id")));
    json_t *list = at_req("GET", "/v1/jobs", NULL, NULL, &st, NULL);
    cr_assert_eq(json_array_size(json_object_get(list, "jobs")), 2, "no duplicate was stored");
    json_decref(list);
    json_decref(a);
    json_decref(b);
    json_decref(c);
}

Test(http, list_pages_and_filters)
{
    char *ids[5];
    for (int i = 0; i < 5; i++) {
        char name[16];
        snprintf(name, sizeof name, "job-%d", i);
        ids[i] = at_create_job(name, i < 2 ? "{\"team\": \"nlp\"}" : "{\"team\": \"cv\"}", NULL);
    }
    /* page_size=2 over 5 jobs: 3 pages, newest first, no duplicates, no gaps */
    char path[512];
    char token[256] = "";
    int seen = 0, pages = 0;
    for (;;) {
        snprintf(path, sizeof path, "/v1/jobs?page_size=2%s%s", token[0] ? "&page_token=" : "", token);
        long st;
        char *raw;
        json_t *j = at_req("GET", path, NULL, NULL, &st, &raw);
        cr_assert_eq(st, 200, "%s", raw);
        pages++;
        json_t *jobs = json_object_get(j, "jobs");
        cr_assert(json_array_size(jobs) <= 2);
        size_t i;
        json_t *job;
        json_array_foreach(jobs, i, job) {
            const char *id = json_string_value(json_object_get(job, "id"));
            cr_assert_lt(seen, 5, "more jobs than created: %s", raw);
            cr_assert_str_eq(id, ids[4 - seen], "page %d item %zu out of order: %s", pages, i, raw);
            seen++;
        }
        const char *next = json_string_value(json_object_get(j, "next_page_token"));
        cr_assert(next, "next_page_token is always present: %s", raw);
        kiln_strlcpy(token, next, sizeof token);
        json_decref(j);
        free(raw);
        if (!token[0])
            break;
        cr_assert_lt(pages, 5, "paging does not end");
    }
    cr_assert_eq(seen, 5);
    cr_assert_eq(pages, 3);

    long st;
    json_t *j = at_req("GET", "/v1/jobs?tag=team:nlp", NULL, NULL, &st, NULL);
    cr_assert_eq(st, 200);
    cr_assert_eq(json_array_size(json_object_get(j, "jobs")), 2);
    json_decref(j);

    /* stop two; the status filter (a comma list) finds exactly them */
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "/v1/jobs/%s:stop", ids[i]);
        j = at_req("POST", path, NULL, NULL, &st, NULL);
        cr_assert_eq(st, 200);
        json_decref(j);
    }
    j = at_req("GET", "/v1/jobs?status=STOPPED", NULL, NULL, &st, NULL);
    cr_assert_eq(st, 200);
    cr_assert_eq(json_array_size(json_object_get(j, "jobs")), 2);
    json_decref(j);
    j = at_req("GET", "/v1/jobs?status=FAILED,STOPPED&page_size=1", NULL, NULL, &st, NULL);
    cr_assert_eq(json_array_size(json_object_get(j, "jobs")), 1);
    cr_assert_str_neq(json_string_value(json_object_get(j, "next_page_token")), "");
    json_decref(j);
    j = at_req("GET", "/v1/jobs?status=COMPLETED", NULL, NULL, &st, NULL);
    cr_assert_eq(json_array_size(json_object_get(j, "jobs")), 0);
    json_decref(j);
    for (int i = 0; i < 5; i++)
        free(ids[i]);
}

Test(http, list_rejects_bad_parameters)
{
    /* a page size that is no number gets the real range, as one out of it does (not int32's) */
    static const char *const bad[][3] = {
        {"/v1/jobs?page_size=0", "page_size", "page_size must be a whole number from 1 to 500"},
        {"/v1/jobs?page_size=abc", "page_size", "page_size must be a whole number from 1 to 500, got \\\"abc\\\""},
        {"/v1/jobs?page_size=501", "page_size", "page_size must be a whole number from 1 to 500"},
        {"/v1/jobs?page_size=99999999999", "page_size", "page_size must be a whole number from 1 to 500"},
        {"/v1/jobs?status=RUNING", "status", "RUNING"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        long st;
        char *raw;
        json_t *j = at_req("GET", bad[i][0], NULL, NULL, &st, &raw);
        cr_assert_eq(st, 400, "%s: %s", bad[i][0], raw);
        assert_error_shape(j, "invalid_argument");
        cr_assert_str_eq(json_string_value(json_object_get(j, "field")), bad[i][1], "%s", raw);
        cr_assert(strstr(raw, bad[i][2]), "%s: %s", bad[i][0], raw);
        json_decref(j);
        free(raw);
    }
}

Test(http, unknown_and_malformed_ids)
{
    long st;
    char *raw;
    json_t *j = at_req("GET", "/v1/jobs/00000000-0000-4000-8000-000000000000", NULL, NULL, &st, &raw);
    cr_assert_eq(st, 404, "%s", raw);
    assert_error_shape(j, "not_found");
    json_decref(j);
    free(raw);
    static const char *const paths[] = {"/v1/jobs/nope", "/v1/jobs/nope/events", "/v1/jobs/'%3B--/logs",
                                        "/v1/jobs/00000000-0000-4000-8000-00000000000g/metrics",
                                        "/v1/jobs/%FF%FE", "/v2/%C3%28"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        j = at_req("GET", paths[i], NULL, NULL, &st, &raw);
        cr_assert(st == 404 || st == 400, "%s: %ld %s", paths[i], st, raw);
        cr_assert(json_is_string(json_object_get(j, "code")), "%s", raw);
        cr_assert(json_is_string(json_object_get(j, "message")), "a message even for bytes that are not UTF-8: %s", raw);
        json_decref(j);
        free(raw);
    }
    j = at_req("POST", "/v1/jobs/00000000-0000-4000-8000-000000000000:stop", NULL, NULL, &st, &raw);
    cr_assert_eq(st, 404, "%s", raw);
    json_decref(j);
    free(raw);
}

Test(http, stop_queued_job_then_events)
{
    char *id = at_create_job("to-stop", NULL, NULL);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s:stop", id);
    long st;
    char *raw;
    json_t *j = at_req("POST", path, "{\"reason\": \"changed my mind\"}", NULL, &st, &raw);
    cr_assert_eq(st, 200, "%s", raw);
    cr_assert_str_eq(json_string_value(json_object_get(j, "state")), "STOPPED", "%s", raw);
    json_decref(j);
    free(raw);

    /* stopping a finished job is a state error */
    j = at_req("POST", path, NULL, NULL, &st, &raw);
    cr_assert_eq(st, 409, "%s", raw);
    assert_error_shape(j, "failed_precondition");
    json_decref(j);
    free(raw);

    j = at_req("POST", path, "{\"reason\": 5}", NULL, &st, &raw);
    cr_assert_eq(st, 400, "%s", raw);
    json_decref(j);
    free(raw);

    snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
    j = at_req("GET", path, NULL, NULL, &st, &raw);
    cr_assert_eq(st, 200, "%s", raw);
    json_t *ev = json_object_get(j, "events");
    cr_assert_geq(json_array_size(ev), 2, "%s", raw);
    json_t *first = json_array_get(ev, 0), *last = json_array_get(ev, json_array_size(ev) - 1);
    cr_assert(json_is_null(json_object_get(first, "from_state")), "%s", raw);
    cr_assert_str_eq(json_string_value(json_object_get(first, "to_state")), "QUEUED");
    cr_assert_str_eq(json_string_value(json_object_get(last, "to_state")), "STOPPED");
    cr_assert(strstr(json_string_value(json_object_get(last, "reason")), "changed my mind"), "%s", raw);
    cr_assert(json_is_string(json_object_get(last, "time")), "%s", raw);
    json_decref(j);
    free(raw);
    free(id);
}

Test(http, metrics_with_name_filter_and_downsampling)
{
    char *id = at_create_job("metrics", NULL, NULL);
    int attempt = at_run_job(id);
    Kiln__MetricPoint pts[40], *ptrs[40];
    for (int i = 0; i < 20; i++) {
        Kiln__MetricPoint p = KILN__METRIC_POINT__INIT;
        pts[2 * i] = p;
        pts[2 * i].name = "train_loss";
        pts[2 * i].step = i + 1;
        pts[2 * i].value = 5.0 - i * 0.1;
        pts[2 * i].time_us = kiln_now_us();
        pts[2 * i + 1] = p;
        pts[2 * i + 1].name = "lr";
        pts[2 * i + 1].step = i + 1;
        pts[2 * i + 1].value = 0.001;
        pts[2 * i + 1].time_us = kiln_now_us();
    }
    for (int i = 0; i < 40; i++)
        ptrs[i] = &pts[i];
    Kiln__MetricBatch b = KILN__METRIC_BATCH__INIT;
    b.worker_id = at_worker;
    b.job_id = id;
    b.attempt = attempt;
    b.n_points = 40;
    b.points = ptrs;
    kiln_err_t err;
    kiln_err_clear(&err);
    cr_assert_eq(svc_agent_metrics(at_svc, at_worker, &b, &err), 0, "%s", err.message);

    char path[256];
    long st;
    char *raw;
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?name=train_loss", id);
    json_t *j = at_req("GET", path, NULL, NULL, &st, &raw);
    cr_assert_eq(st, 200, "%s", raw);
    json_t *series = json_object_get(j, "metrics");
    cr_assert_eq(json_array_size(series), 1, "%s", raw);
    json_t *s0 = json_array_get(series, 0);
    cr_assert_str_eq(json_string_value(json_object_get(s0, "name")), "train_loss");
    json_t *points = json_object_get(s0, "points");
    cr_assert_eq(json_array_size(points), 20, "%s", raw);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(points, 0), "step")), 1);
    cr_assert_float_eq(json_number_value(json_object_get(json_array_get(points, 0), "value")), 5.0, 1e-9);
    json_decref(j);
    free(raw);

    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?max_points=5", id);
    j = at_req("GET", path, NULL, NULL, &st, &raw);
    cr_assert_eq(st, 200, "%s", raw);
    series = json_object_get(j, "metrics");
    cr_assert_eq(json_array_size(series), 2, "every metric without a name: %s", raw);
    for (size_t k = 0; k < 2; k++) {
        points = json_object_get(json_array_get(series, k), "points");
        cr_assert_leq(json_array_size(points), 5, "%s", raw);
        cr_assert_eq(json_integer_value(json_object_get(json_array_get(points, 0), "step")), 1);
        cr_assert_eq(json_integer_value(json_object_get(json_array_get(points, json_array_size(points) - 1), "step")), 20,
                     "last point kept: %s", raw);
    }
    json_decref(j);
    free(raw);

    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?max_points=x", id);
    j = at_req("GET", path, NULL, NULL, &st, &raw);
    cr_assert_eq(st, 400, "%s", raw);
    cr_assert_str_eq(json_string_value(json_object_get(j, "field")), "max_points");
    json_decref(j);
    free(raw);

    /* the job carries the latest value of each metric and its progress */
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    j = at_req("GET", path, NULL, NULL, &st, &raw);
    cr_assert_eq(st, 200, "%s", raw);
    cr_assert_float_eq(json_number_value(json_object_get(json_object_get(j, "metrics"), "train_loss")), 3.1, 1e-9,
                       "%s", raw);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(j, "progress"), "step")), 20, "%s", raw);
    json_decref(j);
    free(raw);
    free(id);
}

Test(http, workers_health_ready)
{
    long st;
    char *raw;
    json_t *j = at_req("GET", "/v1/workers", NULL, NULL, &st, &raw);
    cr_assert_eq(st, 200, "%s", raw);
    json_t *w = json_array_get(json_object_get(j, "workers"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(w, "id")), at_worker, "%s", raw);
    cr_assert_eq(json_integer_value(json_object_get(w, "slots")), 4, "%s", raw);
    cr_assert_str_eq(json_string_value(json_object_get(w, "state")), "ALIVE", "%s", raw);
    json_decref(j);
    free(raw);

    j = at_req("GET", "/healthz", NULL, NULL, &st, NULL);
    cr_assert_eq(st, 200);
    cr_assert_str_eq(json_string_value(json_object_get(j, "status")), "ok");
    json_decref(j);
    j = at_req("GET", "/readyz", NULL, NULL, &st, NULL);
    cr_assert_eq(st, 200);
    cr_assert_str_eq(json_string_value(json_object_get(j, "status")), "ready");
    json_decref(j);
}

Test(http, unknown_path_is_404_and_wrong_method_is_405)
{
    long st;
    char *raw;
    json_t *j = at_req("GET", "/v2/nothing", NULL, NULL, &st, &raw);
    cr_assert_eq(st, 404, "%s", raw);
    assert_error_shape(j, "not_found");
    json_decref(j);
    free(raw);

    j = at_req("GET", "/v1/jobs/00000000-0000-4000-8000-000000000000/nothing", NULL, NULL, &st, &raw);
    cr_assert_eq(st, 404, "%s", raw);
    json_decref(j);
    free(raw);

    j = at_req("DELETE", "/v1/jobs", NULL, NULL, &st, &raw);
    cr_assert_eq(st, 405, "%s", raw);
    cr_assert_str_eq(json_string_value(json_object_get(j, "code")), "method_not_allowed");
    json_decref(j);
    free(raw);

    j = at_req("GET", "/v1/jobs/00000000-0000-4000-8000-000000000000:stop", NULL, NULL, &st, &raw);
    cr_assert_eq(st, 405, "%s", raw);
    json_decref(j);
    free(raw);

    j = at_req("POST", "/healthz", "{}", NULL, &st, &raw);
    cr_assert_eq(st, 405, "%s", raw);
    json_decref(j);
    free(raw);
}

Test(http, oversized_body_is_413)
{
    size_t n = 2 * 1024 * 1024;
    char *body = malloc(n + 1);
    memset(body, ' ', n);
    body[0] = '{';
    body[n - 1] = '}';
    body[n] = '\0';
    long st;
    char *raw;
    json_t *j = at_req("POST", "/v1/jobs", body, NULL, &st, &raw);
    cr_assert_eq(st, 413, "%s", raw);
    assert_error_shape(j, "payload_too_large");
    json_decref(j);
    free(raw);
    free(body);
    /* the server still answers */
    j = at_req("GET", "/healthz", NULL, NULL, &st, NULL);
    cr_assert_eq(st, 200);
    json_decref(j);
}

Test(http, prometheus_metrics)
{
    char *id = at_create_job("prom", NULL, NULL);
    long st;
    char *raw;
    json_t *j = at_req("GET", "/metrics", NULL, NULL, &st, &raw);
    cr_assert_eq(st, 200, "%s", raw);
    cr_assert(strstr(raw, "kiln_http_requests_total{route=\"POST /v1/jobs\",status=\"201\"} 1"), "%s", raw);
    cr_assert(strstr(raw, "kiln_jobs{state="), "%s", raw);
    json_decref(j);
    free(raw);
    free(id);
}

typedef struct race_arg {
    const char *key;
    long status;
    char id[64];
} race_arg_t;

static void *race_main(void *p)
{
    race_arg_t *a = p;
    char url[128], hdr[128];
    snprintf(url, sizeof url, "%s/v1/jobs", at_base);
    snprintf(hdr, sizeof hdr, "Idempotency-Key: %s", a->key);
    const char *hdrs[] = {hdr, NULL};
    char *out = NULL;
    if (th_http("POST", url, at_good_spec(), hdrs, &a->status, &out, 10000) == 0) {
        json_t *j = json_loads(out, 0, NULL);
        const char *id = json_string_value(json_object_get(j, "id"));
        if (id)
            kiln_strlcpy(a->id, id, sizeof a->id);
        json_decref(j);
    }
    free(out);
    return NULL;
}

Test(http, concurrent_retries_with_one_key_create_one_job)
{
    enum { N = 8 };
    pthread_t t[N];
    race_arg_t a[N];
    for (int i = 0; i < N; i++) {
        memset(&a[i], 0, sizeof a[i]);
        a[i].key = "race-key";
        cr_assert_eq(pthread_create(&t[i], NULL, race_main, &a[i]), 0);
    }
    int created = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        cr_assert(a[i].status == 201 || a[i].status == 200, "request %d: %ld", i, a[i].status);
        created += a[i].status == 201;
        cr_assert_str_eq(a[i].id, a[0].id, "every retry names the same job");
    }
    cr_assert_eq(created, 1, "exactly one request created the job");
    long st;
    json_t *list = at_req("GET", "/v1/jobs", NULL, NULL, &st, NULL);
    cr_assert_eq(json_array_size(json_object_get(list, "jobs")), 1);
    json_decref(list);
}

/* Runs one statement on the test cluster's admin database. */
static void admin_exec(const char *sql)
{
    char conninfo[512];
    snprintf(conninfo, sizeof conninfo, "host=%s port=%s user=postgres dbname=postgres",
             getenv("KILN_PG_HOST"), getenv("KILN_PG_PORT") ? getenv("KILN_PG_PORT") : "5432");
    PGconn *c = PQconnectdb(conninfo);
    cr_assert_eq(PQstatus(c), CONNECTION_OK, "%s", PQerrorMessage(c));
    PGresult *r = PQexec(c, sql);
    cr_assert(PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK, "%s: %s",
              sql, PQerrorMessage(c));
    PQclear(r);
    PQfinish(c);
}

Test(http, database_outage_is_503_and_recovers)
{
    char sql[512];
    const char *db = at_db_name();
    snprintf(sql, sizeof sql, "ALTER DATABASE \"%s\" ALLOW_CONNECTIONS false", db);
    admin_exec(sql);
    /* the pool's backends gone, not only told to go (each exits when it next runs) */
    snprintf(sql, sizeof sql, "datname = '%s'", db);
    cr_assert(th_pg_end_backends(sql, true, 30000), "the database's backends did not exit");

    long st;
    char *raw;
    json_t *j = at_req("GET", "/readyz", NULL, NULL, &st, &raw);
    cr_assert_eq(st, 503, "%s", raw);
    cr_assert_str_eq(json_string_value(json_object_get(j, "code")), "unavailable", "%s", raw);
    json_decref(j);
    free(raw);
    j = at_req("GET", "/v1/jobs", NULL, NULL, &st, &raw);
    cr_assert_eq(st, 503, "%s", raw);
    cr_assert(!strstr(raw, getenv("KILN_PG_HOST")), "the reply leaks the database's socket: %s", raw);
    cr_assert(!strstr(raw, "FATAL"), "the reply leaks PostgreSQL's text: %s", raw);
    json_decref(j);
    free(raw);
    j = at_req("GET", "/healthz", NULL, NULL, &st, NULL);
    cr_assert_eq(st, 200, "alive even without the database");
    json_decref(j);

    snprintf(sql, sizeof sql, "ALTER DATABASE \"%s\" ALLOW_CONNECTIONS true", db);
    admin_exec(sql);
    for (int64_t end = kiln_mono_us() + 30000000; kiln_mono_us() < end;) {
        j = at_req("GET", "/readyz", NULL, NULL, &st, NULL);
        json_decref(j);
        if (st == 200)
            break;
        usleep(100000);
    }
    cr_assert_eq(st, 200, "ready again once the database is back");
    char *id = at_create_job("after-outage", NULL, NULL);
    free(id);
}

/* Every route of the server's table refuses a query parameter it does not take (a page_token or
 * a state filter on a list that has neither) with a 400 naming it, rather than ignoring it. The
 * router checks each route's own list before the handler runs, so placeholder path values do. */
Test(http, every_route_refuses_a_query_parameter_it_does_not_take)
{
    static const char *const sent[] = {"page_token=x", "state=RUNNING", "no_such=1"};
    api_route_info_t routes[128];
    size_t n = api_http_routes(routes, 128);
    cr_assert_lt(n, 128);
    for (size_t i = 0; i < n; i++) {
        const char *m = routes[i].method, *pat = routes[i].path;
        char path[512];
        size_t k = 0;
        for (const char *p = pat; *p && k < sizeof path - 2;) {
            if (*p == '{') {
                path[k++] = 'x';
                p = strchr(p, '}') + 1;
            } else {
                path[k++] = *p++;
            }
        }
        path[k] = '\0';
        bool body = !strcmp(m, "POST") || !strcmp(m, "PUT") || !strcmp(m, "PATCH");
        const char *gz[] = {"Content-Type: application/gzip", NULL};
        if (routes[i].page) { /* a page a browser opens from a link that may carry parameters of its own */
            if (strchr(pat, '{'))
                continue;
            long st;
            char *raw = NULL;
            char url[600];
            snprintf(url, sizeof url, "%s?utm_source=mail", path);
            json_decref(at_req(m, url, NULL, NULL, &st, &raw));
            cr_assert_eq(st, 200, "%s %s: a page opens whatever its link carries, got %ld", m, url, st);
            free(raw);
            continue;
        }
        bool code = !strcmp(pat, "/v1/code");
        for (size_t s = 0; s < sizeof sent / sizeof sent[0]; s++) {
            /* page_token is the job and tuning job lists' own */
            if ((!strcmp(pat, "/v1/jobs") || !strcmp(pat, "/v1/tuning-jobs")) && !strcmp(m, "GET") && s == 0)
                continue;
            char url[600], field[32];
            snprintf(url, sizeof url, "%s?%s", path, sent[s]);
            snprintf(field, sizeof field, "%.*s", (int)strcspn(sent[s], "="), sent[s]);
            long st;
            char *raw = NULL;
            json_t *j = at_req(m, url, code ? "" : body ? "{}" : NULL, code ? gz : NULL, &st, &raw);
            cr_assert_eq(st, 400, "%s %s: want 400, got %ld: %s", m, url, st, raw);
            cr_assert_str_eq(json_string_value(json_object_get(j, "code")), "invalid_argument", "%s %s: %s", m, url,
                             raw);
            cr_assert_str_eq(json_string_value(json_object_get(j, "field")), field, "%s %s: %s", m, url, raw);
            cr_assert(strstr(json_string_value(json_object_get(j, "message")), field), "%s %s: %s", m, url, raw);
            cr_assert(strstr(json_string_value(json_object_get(j, "hint")), "this request takes"), "%s %s: %s", m,
                      url, raw);
            json_decref(j);
            free(raw);
        }
    }
    /* what a route takes still works, and its refusal lists it */
    long st;
    char *raw = NULL;
    json_t *j = at_req("DELETE", "/v1/workers/x?ban=true&reson=r", NULL, NULL, &st, &raw);
    cr_assert_eq(st, 400, "%s", raw);
    cr_assert_str_eq(json_string_value(json_object_get(j, "field")), "reson");
    cr_assert_str_eq(json_string_value(json_object_get(j, "hint")), "did you mean reason? this request takes ban, reason");
    json_decref(j);
    free(raw);
    j = at_req("GET", "/v1/queues", NULL, NULL, &st, &raw);
    cr_assert_eq(st, 200, "%s", raw);
    json_decref(j);
    free(raw);
}
