/* test_metric_defs.c - metric definitions at submission: PCRE2 patterns that kiln-agent can run
 * on every log line of a job; too many, too long, uncompilable, group-less or backreferencing
 * ones, and those whose "step" group can never capture a step, are refused with a message naming
 * the field. */
#include "spec/spec.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A valid spec with the given "metric_definitions" value (JSON text). */
static int parse_defs(const char *defs_json, spec_t *s, kiln_err_t *err)
{
    char *j = NULL;
    if (asprintf(&j, "{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"}, \"metric_definitions\": %s}",
                 defs_json) < 0)
        cr_assert_fail("asprintf");
    int rc = spec_parse_string(j, s, err);
    free(j);
    return rc;
}

static void refused(const char *defs_json, const char *field, const char *needle)
{
    spec_t s;
    kiln_err_t err;
    cr_assert_eq(parse_defs(defs_json, &s, &err), KILN_EINVAL, "accepted: %s", defs_json);
    cr_assert_str_eq(err.field, field, "%s", err.message);
    cr_assert(strstr(err.message, needle), "message \"%s\" lacks \"%s\"", err.message, needle);
    cr_assert(strstr(err.message, field), "message \"%s\" does not name %s", err.message, field);
}

Test(metric_defs, perl_compatible_patterns_are_accepted)
{
    spec_t s;
    kiln_err_t err;
    cr_assert_eq(parse_defs("[{\"name\": \"val_loss\", \"regex\": \"val loss (\\\\d+\\\\.\\\\d+)\"},"
                            " {\"name\": \"acc\", \"regex\": \"(?<=acc=)([0-9.]+)%\"},"
                            " {\"name\": \"lr\", \"regex\": \"\\\\blr (?<v>[0-9.e-]+)\"}]", &s, &err), 0,
                 "%s (%s)", err.message, err.field);
    cr_assert_eq(s.n_metric_defs, 3);
    spec_deinit(&s);
}

Test(metric_defs, backreferences_are_refused)
{
    /* the pattern of the issue that kept an agent busy */
    refused("[{\"name\": \"x\", \"regex\": \"((.|..)+)+\\\\2x\"}]", "metric_definitions[0].regex", "backreference");
    refused("[{\"name\": \"ok\", \"regex\": \"ok ([0-9]+)\"}, {\"name\": \"x\", \"regex\": \"(?<a>[0-9]+) \\\\k<a>\"}]",
            "metric_definitions[1].regex", "backreference");
}

Test(metric_defs, bad_patterns_are_refused_by_field)
{
    refused("[{\"name\": \"x\", \"regex\": \"(unclosed\"}]", "metric_definitions[0].regex", "does not compile");
    refused("[{\"name\": \"acc\", \"regex\": \"acc [0-9.]+\"}]", "metric_definitions[0].regex", "capture group");
    refused("[{\"name\": \"x\", \"regex\": \"\\\\C([0-9])\"}]", "metric_definitions[0].regex", "does not compile");
}

Test(metric_defs, at_most_16_definitions_of_at_most_256_bytes)
{
    char many[4096];
    size_t off = 0;
    off += (size_t)snprintf(many + off, sizeof many - off, "[");
    for (int i = 0; i < 16; i++)
        off += (size_t)snprintf(many + off, sizeof many - off, "%s{\"name\": \"m%d\", \"regex\": \"m%d ([0-9]+)\"}",
                                i ? ", " : "", i, i);
    snprintf(many + off, sizeof many - off, "]");
    spec_t s;
    kiln_err_t err;
    cr_assert_eq(parse_defs(many, &s, &err), 0, "16 are allowed: %s", err.message);
    spec_deinit(&s);
    snprintf(many + off, sizeof many - off, ", {\"name\": \"m16\", \"regex\": \"m16 ([0-9]+)\"}]");
    cr_assert_eq(parse_defs(many, &s, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "metric_definitions");
    cr_assert(strstr(err.message, "at most 16"), "%s", err.message);

    char re[300], defs[400];
    memset(re, 'a', sizeof re);
    re[0] = '(';
    re[255] = ')';
    re[256] = '\0';
    snprintf(defs, sizeof defs, "[{\"name\": \"long\", \"regex\": \"%s\"}]", re);
    cr_assert_eq(parse_defs(defs, &s, &err), 0, "256 bytes are allowed: %s", err.message);
    spec_deinit(&s);
    re[256] = 'a';
    re[257] = '\0';
    snprintf(defs, sizeof defs, "[{\"name\": \"long\", \"regex\": \"%s\"}]", re);
    refused(defs, "metric_definitions[0].regex", "too long");
}

/* A regex (C text) inside a metric_definitions JSON array of one definition. */
static char *one_def(const char *regex)
{
    json_t *a = json_pack("[{s:s, s:s}]", "name", "m", "regex", regex);
    cr_assert_not_null(a);
    char *t = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    return t;
}

Test(metric_defs, step_groups_that_can_capture_a_step_are_accepted)
{
    static const char *const ok[] = {
        "^step (?<step>[0-9]+)/[0-9]+ \\| loss ([0-9.]+)",
        "loss ([0-9.]+) at (?<step>\\d+)",                /* the value group comes first */
        "step (?'step'\\d{3}) ([0-9.]+)",                  /* three digits */
        "step (?P<step>[1-9][0-9]*) ([0-9.]+)",
        "step (?<step>13[57]) ([0-9.]+)",                    /* only 135 and 137 */
        "step (?<step>\\d+|n/a) ([0-9.]+)",                /* digits sometimes */
        "step (?<step>\\w+) ([0-9.]+)",                    /* digits among others */
        "s=(?<step>(?<=s=)\\d+) ([0-9.]+)",                /* looks around itself: only running can tell */
        "(?x) step \\s (?<step> \\d+ ) \\s+ v=([0-9.]+) # extended, with a comment",
        "[(](?<step>[0-9]+)[)] \\(x\\) v=([0-9.]+)",      /* parentheses as text and in classes */
        "\\Q(?<step>\\E v=([0-9.]+)",                     /* \\Q...\\E: text, and no step group */
    };
    /* twice: the second time the kept verdicts for the groups' text (a tuning job's values each
     * judge the same definitions) answer as the first */
    for (size_t i = 0; i < 2 * (sizeof ok / sizeof ok[0]); i++) {
        char *defs = one_def(ok[i % (sizeof ok / sizeof ok[0])]);
        spec_t s;
        kiln_err_t err;
        kiln_err_clear(&err);
        cr_assert_eq(parse_defs(defs, &s, &err), 0, "case %zu (%s) refused: %s", i, ok[i % (sizeof ok / sizeof ok[0])],
                     err.message);
        spec_deinit(&s);
        free(defs);
    }
}

Test(metric_defs, step_groups_that_cannot_work_are_refused)
{
    static const char *const bad[][2] = {
        {"step (?<step>[a-z]+) ([0-9.]+)", "never capture a step"},
        {"step (?<step>-[0-9]+) ([0-9.]+)", "never capture a step"},           /* a sign is no step */
        {"step (?<step>[0-9]+\\.[0-9]+) ([0-9.]+)", "never capture a step"},  /* nor a fraction */
        {"step (?<step>\\d{20}) ([0-9.]+)", "never capture a step"},          /* nor 20 digits */
        {"step (?<step>) ([0-9.]+)", "never capture a step"},
        {"step (?<step>[0-9]+)", "capture group for the value besides its step group"},
        {"(?J)(?<step>[0-9]+) (?<step>[0-9]+) ([0-9.]+)", "more than one group named \"step\""},
    };
    for (size_t i = 0; i < 2 * (sizeof bad / sizeof bad[0]); i++) { /* twice, as above */
        size_t k = i % (sizeof bad / sizeof bad[0]);
        char *defs = one_def(bad[k][0]);
        refused(defs, "metric_definitions[0].regex", bad[k][1]);
        free(defs);
    }
}
