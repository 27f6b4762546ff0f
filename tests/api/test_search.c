/* test_search.c - experiment search over REST against the real server and database: the filter,
 * order_by and columns of GET /v1/jobs and POST /v1/jobs:search, summaries of metrics ingested
 * through the service as an agent sends them (on the job and as columns), paging with tokens,
 * and the 400s: an unknown query parameter named, a filter error with its caret and hint, bodies
 * of the wrong shape, a token from another search. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/api/api_test.h"

TestSuite(search_api, .init = at_setup, .fini = at_teardown, .timeout = 120);

static char *create(const char *name, double lr, const char *team)
{
    char body[1024];
    snprintf(body, sizeof body,
             "{\"name\": \"%s\", \"model\": {\"type\": \"mlp\", \"hidden\": [8], \"n_inputs\": 4, \"n_classes\": 2},"
             " \"data\": {\"train\": \"synthetic\"}, \"hyperparameters\": {\"lr\": %g, \"global_batch_size\": 8},"
             " \"tags\": {\"team\": \"%s\"}}",
             name, lr, team);
    long st;
    char *raw = NULL;
    json_t *j = at_req("POST", "/v1/jobs", body, NULL, &st, &raw);
    cr_assert_eq(st, 201, "%s", raw);
    char *id = strdup(json_string_value(json_object_get(j, "id")));
    json_decref(j);
    free(raw);
    return id;
}

/* val_loss of a job, pushed as kiln-agent would: values[i] at step i + 1 */
static void push(const char *id, int attempt, const double *values, int n)
{
    Kiln__MetricPoint pts[16], *ptrs[16];
    for (int i = 0; i < n; i++) {
        kiln__metric_point__init(&pts[i]);
        pts[i].name = "val_loss";
        pts[i].step = i + 1;
        pts[i].value = values[i];
        pts[i].time_us = kiln_now_us();
        ptrs[i] = &pts[i];
    }
    Kiln__MetricBatch b = KILN__METRIC_BATCH__INIT;
    b.worker_id = at_worker;
    b.job_id = (char *)id;
    b.attempt = attempt;
    b.points = ptrs;
    b.n_points = (size_t)n;
    kiln_err_t err;
    cr_assert_eq(svc_agent_metrics(at_svc, at_worker, &b, &err), 0, "%s", err.message);
}

static json_t *get_ok(const char *path)
{
    long st;
    char *raw = NULL;
    json_t *j = at_req("GET", path, NULL, NULL, &st, &raw);
    cr_assert_eq(st, 200, "GET %s: %ld %s", path, st, raw);
    free(raw);
    return j;
}

/* "/v1/jobs?filter=...&..." with each value URL-encoded */
static char *jobs_path(const char *filter, const char *order_by, const char *columns, const char *extra)
{
    static char path[4096];
    char *f = th_url_escape(filter), *o = th_url_escape(order_by), *c = th_url_escape(columns);
    snprintf(path, sizeof path, "/v1/jobs?filter=%s&order_by=%s&columns=%s%s", f, o, c, extra ? extra : "");
    free(f);
    free(o);
    free(c);
    return path;
}

Test(search_api, filter_order_columns_and_summaries)
{
    char *a = create("alpha", 0.003, "nlp"), *b = create("beta", 0.0001, "cv"), *c = create("gamma", 0.001, "nlp");
    int att_a = at_run_job(a), att_b = at_run_job(b);
    double va[] = {2.0, 1.4, 1.7}, vb[] = {1.9, 1.8, 1.2, 1.3};
    push(a, att_a, va, 3);
    push(b, att_b, vb, 4);

    /* GET /v1/jobs/{id} carries every metric's summary */
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s", b);
    json_t *job = get_ok(path);
    json_t *s = json_object_get(json_object_get(job, "summaries"), "val_loss");
    cr_assert_not_null(s);
    cr_assert_eq(json_integer_value(json_object_get(s, "count")), 4);
    cr_assert_float_eq(json_real_value(json_object_get(s, "min")), 1.2, 1e-12);
    cr_assert_eq(json_integer_value(json_object_get(s, "min_step")), 3);
    cr_assert_float_eq(json_real_value(json_object_get(s, "max")), 1.9, 1e-12);
    cr_assert_eq(json_integer_value(json_object_get(s, "max_step")), 1);
    cr_assert_float_eq(json_real_value(json_object_get(s, "last")), 1.3, 1e-12);
    cr_assert_eq(json_integer_value(json_object_get(s, "last_step")), 4);
    json_decref(job);

    /* ordered by the summary; the job without val_loss comes last */
    json_t *j = get_ok(jobs_path("hp.lr < 1e-2", "metrics.val_loss.min", "hp.lr,metrics.val_loss.min", NULL));
    json_t *jobs = json_object_get(j, "jobs");
    cr_assert_eq(json_array_size(jobs), 3);
    const char *want[] = {b, a, c};
    const double min[] = {1.2, 1.4, 0}, lr[] = {0.0001, 0.003, 0.001};
    for (size_t i = 0; i < 3; i++) {
        json_t *x = json_array_get(jobs, i);
        cr_assert_str_eq(json_string_value(json_object_get(x, "id")), want[i], "position %zu", i);
        json_t *cols = json_object_get(x, "columns");
        cr_assert_eq(json_object_size(cols), 2);
        cr_assert_float_eq(json_number_value(json_object_get(cols, "hp.lr")), lr[i], 1e-15);
        if (i < 2) {
            cr_assert_float_eq(json_number_value(json_object_get(cols, "metrics.val_loss.min")), min[i], 1e-12);
            cr_assert_not_null(json_object_get(json_object_get(x, "summaries"), "val_loss"));
        } else {
            cr_assert(json_is_null(json_object_get(cols, "metrics.val_loss.min")), "a value it lacks is null");
            cr_assert_eq(json_object_size(json_object_get(x, "summaries")), 0);
        }
    }
    json_decref(j);

    /* OR across a hyperparameter and a summary; the whole summary as a column */
    j = get_ok(jobs_path("hp.lr >= 1e-3 AND tags.team = nlp OR metrics.val_loss.last < 1.5", "name desc",
                         "metrics.val_loss", NULL));
    jobs = json_object_get(j, "jobs");
    cr_assert_eq(json_array_size(jobs), 3);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(jobs, 0), "name")), "gamma");
    json_t *cols = json_object_get(json_array_get(jobs, 1), "columns");
    cr_assert_eq(json_object_size(cols), 4, "min, max, last and count");
    cr_assert_float_eq(json_number_value(json_object_get(cols, "metrics.val_loss.last")), 1.3, 1e-12);
    json_decref(j);

    /* POST /v1/jobs:search: the same, in a body, one job a page */
    char body[512], *token = NULL;
    int seen = 0;
    for (int page = 0; page < 5; page++) {
        snprintf(body, sizeof body,
                 "{\"filter\": \"NOT tags.team = cv OR metrics.val_loss.count > 3\", \"order_by\": \"hp.lr desc\","
                 " \"columns\": [\"hp.*\"], \"page_size\": 1%s%s%s}",
                 token ? ", \"page_token\": \"" : "", token ? token : "", token ? "\"" : "");
        long st;
        char *raw = NULL;
        j = at_req("POST", "/v1/jobs:search", body, NULL, &st, &raw);
        cr_assert_eq(st, 200, "%s", raw);
        free(raw);
        jobs = json_object_get(j, "jobs");
        cr_assert_leq(json_array_size(jobs), 1);
        if (json_array_size(jobs)) {
            json_t *x = json_array_get(jobs, 0);
            cr_assert_str_eq(json_string_value(json_object_get(x, "id")), want[seen == 0 ? 1 : seen == 1 ? 2 : 0]);
            cr_assert_geq(json_object_size(json_object_get(x, "columns")), 18, "hp.* gives every hyperparameter");
            seen++;
        }
        free(token);
        const char *next = json_string_value(json_object_get(j, "next_page_token"));
        token = next && *next ? strdup(next) : NULL;
        json_decref(j);
        if (!token)
            break;
    }
    cr_assert_eq(seen, 3);

    /* the status and tag parameters still work, ANDed with the filter */
    j = get_ok("/v1/jobs?status=queued,scheduled,running&tag=team:nlp&filter=hp.lr%20%3E%202e-3");
    cr_assert_eq(json_array_size(json_object_get(j, "jobs")), 1);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(j, "jobs"), 0), "id")), a);
    json_decref(j);
    free(a);
    free(b);
    free(c);
}

static json_t *bad(const char *method, const char *path, const char *body, const char *field)
{
    long st;
    char *raw = NULL;
    json_t *j = at_req(method, path, body, NULL, &st, &raw);
    cr_assert_eq(st, 400, "%s %s: %ld %s", method, path, st, raw);
    cr_assert_str_eq(json_string_value(json_object_get(j, "code")), "invalid_argument", "%s", raw);
    cr_assert_str_eq(json_string_value(json_object_get(j, "field")), field, "%s", raw);
    free(raw);
    return j;
}

Test(search_api, errors_name_the_parameter_and_show_where)
{
    char *a = create("alpha", 0.003, "nlp");
    json_t *j = bad("GET", "/v1/jobs?order=name", NULL, "order");
    cr_assert_str_eq(json_string_value(json_object_get(j, "message")), "unknown query parameter \"order\"");
    cr_assert(strstr(json_string_value(json_object_get(j, "hint")), "did you mean order_by?"));
    json_decref(j);
    json_decref(bad("GET", "/v1/jobs?project=p", NULL, "project"));
    json_decref(bad("GET", "/v1/jobs?page_size=1&name=x", NULL, "name"));
    /* a parameter given twice: only the first would be read */
    j = bad("GET", "/v1/jobs?page_size=1&page_size=2", NULL, "page_size");
    cr_assert_str_eq(json_string_value(json_object_get(j, "message")),
                     "query parameter \"page_size\" is given more than once");
    json_decref(j);
    json_decref(bad("GET", "/v1/tuning-jobs?page_token=&page_token=x", NULL, "page_token"));
    json_decref(bad("GET", "/v1/jobs?status=RUNNING&tag=a&status=QUEUED", NULL, "status"));

    j = bad("GET", jobs_path("hp.lr < 1e-3 AND stat = COMPLETED", "", "", NULL), NULL, "filter");
    cr_assert_str_eq(json_string_value(json_object_get(j, "message")), "unknown field \"stat\" in filter at column 18");
    cr_assert_str_eq(json_string_value(json_object_get(j, "detail")),
                     "hp.lr < 1e-3 AND stat = COMPLETED\n                 ^^^^");
    cr_assert_str_eq(json_string_value(json_object_get(j, "hint")), "did you mean state?");
    json_decref(j);
    json_decref(bad("GET", jobs_path("", "metrics.val_loss", "", NULL), NULL, "order_by"));
    json_decref(bad("GET", jobs_path("", "", "state", NULL), NULL, "columns"));
    json_decref(bad("GET", "/v1/jobs?status=DONE", NULL, "status"));

    json_decref(bad("POST", "/v1/jobs:search", "{\"filter\": \"name ~ a\", \"colums\": [\"hp.lr\"]}", "colums"));
    json_decref(bad("POST", "/v1/jobs:search", "{\"filter\": 3}", "filter"));
    json_decref(bad("POST", "/v1/jobs:search", "{\"columns\": [\"hp.lr\", 7]}", "columns"));
    json_decref(bad("POST", "/v1/jobs:search", "{\"page_size\": 0}", "page_size"));
    /* one that is no whole number says what it got, as ?page_size=abc does */
    static const char *const not_whole[][2] = {{"\"abc\"", "\"abc\""}, {"1e3", "1000.0"}, {"true", "true"},
                                               {"[5]", "[5]"}};
    for (size_t i = 0; i < KILN_ARRAY_LEN(not_whole); i++) {
        char body[64], want[128];
        snprintf(body, sizeof body, "{\"page_size\": %s}", not_whole[i][0]);
        snprintf(want, sizeof want, "page_size must be a whole number from 1 to 500, got %s", not_whole[i][1]);
        j = bad("POST", "/v1/jobs:search", body, "page_size");
        cr_assert_str_eq(json_string_value(json_object_get(j, "message")), want);
        cr_assert(json_string_value(json_object_get(j, "hint"))[0], "%s: no hint", body);
        json_decref(j);
    }
    j = bad("POST", "/v1/jobs:search", "{\"filter\": \"name = \\\"x'; DROP TABLE jobs; --\"}", "filter");
    cr_assert(strstr(json_string_value(json_object_get(j, "message")), "unterminated string"));
    json_decref(j);

    /* a token belongs to its search */
    create("beta", 0.001, "nlp");
    json_t *page = get_ok(jobs_path("hp.lr > 0", "hp.lr", "", "&page_size=1"));
    const char *tok = json_string_value(json_object_get(page, "next_page_token"));
    cr_assert(tok && *tok);
    char path[2048];
    snprintf(path, sizeof path, "%s&page_token=%s", jobs_path("hp.lr > 0", "name", "", "&page_size=1"), tok);
    j = bad("GET", path, NULL, "page_token");
    cr_assert(strstr(json_string_value(json_object_get(j, "message")), "another search"));
    json_decref(j);
    json_decref(bad("GET", "/v1/jobs?page_token=bm90IGEgdG9rZW4", NULL, "page_token"));
    json_decref(page);

    char mpath[256];
    snprintf(mpath, sizeof mpath, "/v1/jobs/%s/metrics?max_point=5", a);
    json_decref(bad("GET", mpath, NULL, "max_point"));
    free(a);
}
