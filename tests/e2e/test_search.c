/* test_search.c - experiment search end to end: two real training runs (kilnd, two agents,
 * kiln-train) with different learning rates, then their metric summaries as ingestion kept
 * them, and the same search through every client: REST, gRPC (Python's grpcio over TLS, the
 * admin's token), `kiln search` and `kiln compare`. The SDK's search and compare are exercised by
 * tests/sdk (the python_sdk case of test_clients.c). */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/common/harness.h"
#include "tests/e2e/e2e.h"

#define STEPS 20

static char *submit_lr(const char *name, double lr)
{
    char *text = e2e_spec(name, STEPS, 1, 1, 4);
    json_t *spec = json_loads(text, 0, NULL);
    free(text);
    json_object_set_new(json_object_get(spec, "hyperparameters"), "lr", json_real(lr));
    json_object_set_new(json_object_get(spec, "tags"), "sweep", json_string("lr"));
    text = json_dumps(spec, JSON_COMPACT);
    json_decref(spec);
    json_t *job = e2e_submit(text);
    free(text);
    char *id = strdup(json_string_value(json_object_get(job, "id")));
    json_decref(job);
    return id;
}

Test(e2e_search, summaries_of_real_runs_found_by_every_client, .init = e2e_setup, .fini = e2e_teardown,
     .timeout = 300)
{
    char *slow = submit_lr("sweep-slow", 3e-4), *fast = submit_lr("sweep-fast", 3e-3);
    json_decref(e2e_wait_state(slow, "COMPLETED", 180000));
    json_decref(e2e_wait_state(fast, "COMPLETED", 180000));

    /* The summary ingestion kept: every step once, its last value the job's latest. */
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s", fast);
    json_t *job = e2e_get(path);
    json_t *s = json_object_get(json_object_get(job, "summaries"), "train_loss");
    cr_assert_not_null(s, "no train_loss summary");
    cr_assert_eq(json_integer_value(json_object_get(s, "count")), STEPS);
    cr_assert_eq(json_integer_value(json_object_get(s, "last_step")), STEPS);
    cr_assert_eq(json_integer_value(json_object_get(s, "rank")), 0);
    double last = json_number_value(json_object_get(s, "last"));
    cr_assert_float_eq(last, json_number_value(json_object_get(json_object_get(job, "metrics"), "train_loss")), 1e-9);
    cr_assert_leq(json_number_value(json_object_get(s, "min")), last);
    cr_assert_geq(json_number_value(json_object_get(s, "max")), last);
    double summary_min = json_number_value(json_object_get(s, "min"));
    json_decref(job);
    /* ...and it is what the history says */
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?name=train_loss&max_points=1000", fast);
    json_t *h = e2e_get(path);
    json_t *pts = json_object_get(json_array_get(json_object_get(h, "metrics"), 0), "points");
    cr_assert_eq(json_array_size(pts), STEPS);
    double mn = 1e300;
    size_t i;
    json_t *pt;
    json_array_foreach(pts, i, pt)
        mn = json_number_value(json_object_get(pt, "value")) < mn ? json_number_value(json_object_get(pt, "value")) : mn;
    cr_assert_float_eq(mn, summary_min, 1e-12);
    json_decref(h);

    /* REST: the sweep ordered by the summary */
    char *f = th_url_escape("tags.sweep = lr AND hp.lr <= 3e-3 AND metrics.train_loss.count >= 20");
    snprintf(path, sizeof path, "/v1/jobs?filter=%s&order_by=hp.lr%%20desc&columns=hp.lr,metrics.train_loss.last", f);
    free(f);
    json_t *r = e2e_get(path);
    json_t *jobs = json_object_get(r, "jobs");
    cr_assert_eq(json_array_size(jobs), 2);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(jobs, 0), "id")), fast);
    cr_assert_float_eq(json_number_value(json_object_get(json_object_get(json_array_get(jobs, 1), "columns"), "hp.lr")),
                       3e-4, 1e-15);
    json_decref(r);

    /* gRPC: SearchJobs over TLS with the admin's token */
    json_t *g = e2e_grpc("/kiln.TrainingService/SearchJobs",
                          json_pack("{s:s, s:s, s:[s]}", "filter", "tags.sweep = lr AND hp.lr < 1e-3", "order_by",
                                    "metrics.train_loss.min", "columns", "metrics.train_loss.min"));
    cr_assert_str_eq(json_string_value(json_object_get(g, "code")), "OK", "%s", json_string_value(json_object_get(g, "details")));
    json_t *gj = json_object_get(json_object_get(g, "response"), "jobs");
    cr_assert_eq(json_array_size(gj), 1);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(gj, 0), "id")), slow);
    cr_assert_not_null(json_object_get(json_object_get(json_object_get(json_array_get(gj, 0), "summaries"), "train_loss"), "min"));
    json_decref(g);
    g = e2e_grpc("/kiln.TrainingService/SearchJobs", json_pack("{s:s}", "filter", "hp.lr << 1"));
    cr_assert_str_eq(json_string_value(json_object_get(g, "code")), "INVALID_ARGUMENT");
    json_decref(g);

    /* the CLI */
    char *out = NULL, *err = NULL;
    int rc = e2e_kiln(&out, &err, "search", "tags.sweep = lr AND metrics.train_loss.last < 100", "--columns",
                      "hp.lr,metrics.train_loss.last", "--order-by", "hp.lr", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    char sslow[9], sfast[9];
    snprintf(sslow, sizeof sslow, "%.8s", slow);
    snprintf(sfast, sizeof sfast, "%.8s", fast);
    cr_assert(strstr(out, "hp.lr") && strstr(out, "metrics.train_loss.last"), "%s", out);
    cr_assert(strstr(out, sslow) && strstr(out, sfast) && strstr(out, sslow) < strstr(out, sfast), "%s", out);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "search", "hp.lrr < 1", NULL);
    cr_assert_eq(rc, 1);
    cr_assert(strstr(err, "unknown hyperparameter") && strstr(err, "^^^^^^") && strstr(err, "did you mean hp.lr?"), "%s",
              err);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "--json", "search", "tags.sweep = lr", "--columns", "metrics.train_loss", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    json_t *js = json_loads(out, 0, NULL);
    cr_assert_eq(json_array_size(json_object_get(js, "jobs")), 2, "%s", out);
    cr_assert_not_null(json_object_get(json_object_get(json_array_get(json_object_get(js, "jobs"), 0), "columns"),
                                       "metrics.train_loss.count"));
    json_decref(js);
    free(out);
    free(err);
    /* -o yaml and -o wide (global, before or after the command) */
    rc = e2e_kiln(&out, &err, "search", "tags.sweep = lr", "--columns", "hp.lr", "-o", "yaml", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "jobs:\n") && strstr(out, "hp.lr") && strstr(out, slow), "%s", out);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "-o", "wide", "search", "tags.sweep = lr", "--columns", "hp.lr", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "PROJECT") && strstr(out, "QUEUE") && strstr(out, slow) && strstr(out, fast), "%s", out);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "compare", sslow, sfast, "-o", "json", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    js = json_loads(out, 0, NULL);
    cr_assert_not_null(js, "compare -o json prints JSON: %s", out);
    json_decref(js);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "compare", sslow, sfast, NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "*  hp.lr"), "the learning rates differ: %s", out);
    cr_assert(strstr(out, "   hp.max_steps"), "the steps do not: %s", out);
    cr_assert(strstr(out, "metrics.train_loss.min") && strstr(out, "\ntrain_loss\n") && strstr(out, "(step)"), "%s", out);
    cr_assert(strstr(out, "1 ") && strstr(out, "sweep-slow") && strstr(out, "sweep-fast"), "%s", out);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "compare", sslow, NULL);
    cr_assert_eq(rc, 2, "one job is a usage error");
    free(out);
    free(err);
    free(slow);
    free(fast);
    e2e_pass();
}
