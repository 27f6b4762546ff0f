/* test_tuning.c - a tuning job end to end: the `kiln tune` CLI against a real kilnd and two real
 * agents training tiny GPT trials. A seeded random search run twice gives the same trials, each
 * trained the same (the same val_loss), the second time round as the first; describe prints the
 * trials table and the best trial. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
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
        if (strcmp(st, "RUNNING") && strcmp(st, "STOPPING"))
            return t;
        if ((kiln_mono_us() - t0) / 1000 > timeout_ms)
            cr_assert_fail("tuning job %s did not end: %s", id, e2e_dump(t));
        json_decref(t);
        struct timespec pause = {0, 100 * 1000000};
        nanosleep(&pause, NULL); /* polls the condition: the trials train meanwhile */
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
    cr_assert_eq(e2e_kiln(&out, &err, "tune", "stop", first, NULL), 1, "a completed search stops no more: %s", out);
    cr_assert(strstr(err, "COMPLETED"), "%s", err);
    free(out);
    free(err);
    json_decref(a);
    json_decref(b);
    free(first);
    free(second);
    e2e_pass();
}
