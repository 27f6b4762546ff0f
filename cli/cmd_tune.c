/* cmd_tune.c - `kiln tune submit|list|describe|stop`: tuning jobs (/v1/tuning-jobs), searches over
 * a base job's hyperparameters whose trials are ordinary jobs. describe prints a warm start's
 * parents, the trials table and the best trial; list each search's trials done, running and best. */
#include "cli/cli_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A trial's parameters as "lr=0.00123 warmup_steps=40", at most n bytes. */
static void params_text(const json_t *p, char *buf, size_t n)
{
    size_t o = 0;
    buf[0] = '\0';
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)p, k, v) {
        char val[64];
        if (json_is_integer(v))
            snprintf(val, sizeof val, "%lld", (long long)json_integer_value(v));
        else if (json_is_number(v))
            snprintf(val, sizeof val, "%.4g", json_number_value(v));
        else if (json_is_string(v))
            snprintf(val, sizeof val, "%s", json_string_value(v));
        else
            snprintf(val, sizeof val, "%s", json_is_true(v) ? "true" : "false");
        if (o + strlen(k) + strlen(val) + 3 < n)
            o += (size_t)snprintf(buf + o, n - o, "%s%s=%s", o ? " " : "", k, val);
    }
}

static void show_tuning(const cli_client_t *c, const json_t *t)
{
    (void)c;
    const json_t *obj = json_object_get(t, "objective");
    printf("id:         %s\n", cli_jstr(t, "id"));
    printf("name:       %s\n", cli_jstr(t, "name"));
    printf("project:    %s\n", cli_jstr(t, "project"));
    printf("state:      %s\n", cli_jstr(t, "state"));
    printf("reason:     %s\n", cli_jstr(t, "reason"));
    printf("strategy:   %s (seed %lld), up to %lld trial(s), %lld at once\n", cli_jstr(t, "strategy"),
           (long long)json_integer_value(json_object_get(t, "seed")),
           (long long)json_integer_value(json_object_get(t, "max_jobs")),
           (long long)json_integer_value(json_object_get(t, "max_parallel_jobs")));
    printf("objective:  %s %s\n", cli_jstr(obj, "goal"), cli_jstr(obj, "metric"));
    const json_t *trials = json_object_get(t, "trials");
    const json_t *ws = json_object_get(t, "warm_start");
    size_t own = 0, i;
    json_t *tr;
    json_array_foreach(trials, i, tr) own += !json_is_string(json_object_get(tr, "parent"));
    if (json_is_object(ws)) {
        /* the parents, each with the trials of its that are this search's history */
        printf("warm start: %s, from:\n", cli_jstr(ws, "type"));
        size_t k;
        json_t *pid;
        json_array_foreach(json_object_get(ws, "parents"), k, pid) {
            size_t n = 0;
            json_array_foreach(trials, i, tr) n += json_equal(json_object_get(tr, "parent"), pid);
            printf("            %s (%zu trial(s))\n", json_string_value(pid), n);
        }
    }
    if (own > 0) {
        printf("\n%-6s %-10s %-11s %-12s %-8s %-5s %s\n", "TRIAL", "JOB", "STATE", "OBJECTIVE", "STEPS", "RUNG",
               "PARAMETERS");
        size_t i;
        json_t *tr;
        json_array_foreach(trials, i, tr) {
            if (json_is_string(json_object_get(tr, "parent")))
                continue; /* a parent's: counted above */
            char p[512], objective[32] = "-";
            params_text(json_object_get(tr, "parameters"), p, sizeof p);
            if (json_is_number(json_object_get(tr, "objective")))
                snprintf(objective, sizeof objective, "%.6g", cli_jnum(tr, "objective"));
            printf("%-6lld %-10.8s %-11s %-12s %-8lld %-5lld %s\n", (long long)json_integer_value(json_object_get(tr, "trial")),
                   cli_jstr(tr, "job_id"), cli_jstr(tr, "state"), objective,
                   (long long)json_integer_value(json_object_get(tr, "steps")),
                   (long long)json_integer_value(json_object_get(tr, "rung")), p);
        }
    }
    const json_t *best = json_object_get(t, "best");
    if (json_is_object(best)) {
        char p[512];
        params_text(json_object_get(best, "parameters"), p, sizeof p);
        const char *parent = json_string_value(json_object_get(best, "parent"));
        printf("\nbest:       job %s, %s = %.6g%s%s%s\n            %s\n", cli_jstr(best, "job_id"),
               cli_jstr(obj, "metric"), cli_jnum(best, "objective"), parent ? " (a trial of parent " : "",
               parent ? parent : "", parent ? ")" : "", p);
    } else {
        printf("\nbest:       (no trial has reported %s yet)\n", cli_jstr(obj, "metric"));
    }
}

static void show_list(const cli_client_t *c, const json_t *reply)
{
    (void)c;
    printf("%-36s %-16s %-10s %-10s %-7s %-7s %-12s %s\n", "ID", "NAME", "STATE", "STRATEGY", "TRIALS", "RUNNING",
           "BEST", "OBJECTIVE");
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(reply, "tuning_jobs"), i, t) {
        const json_t *obj = json_object_get(t, "objective");
        const json_t *best = json_object_get(t, "best");
        char best_text[32] = "-";
        if (json_is_object(best))
            snprintf(best_text, sizeof best_text, "%.6g", cli_jnum(best, "objective"));
        printf("%-36s %-16.16s %-10s %-10s %3lld/%-3lld %-7lld %-12s %s %s\n", cli_jstr(t, "id"), cli_jstr(t, "name"),
               cli_jstr(t, "state"), cli_jstr(t, "strategy"),
               (long long)json_integer_value(json_object_get(t, "trials_done")),
               (long long)json_integer_value(json_object_get(t, "max_jobs")),
               (long long)json_integer_value(json_object_get(t, "trials_running")), best_text, cli_jstr(obj, "goal"),
               cli_jstr(obj, "metric"));
    }
}

int cli_cmd_tune(cli_client_t *c, int argc, char **argv)
{
    static const char *const subs[] = {"list", "submit", "describe", "stop", NULL};
    int first;
    const char *sub = cli_subcommand("tune", argc, argv, subs, &first);
    if (!sub)
        return CLI_EXIT_USAGE;
    const char *pos[1];
    int want = !strcmp(sub, "list") ? 0 : 1;
    int n = cli_positional("tune", argc, argv, first, pos, want);
    if (n < 0)
        return CLI_EXIT_USAGE;
    if (n < want)
        return cli_usage_error("tune", "%s: missing the %s", sub,
                               !strcmp(sub, "submit") ? "request file (JSON; - reads standard input)"
                                                      : "tuning job's id (kiln tune list shows them)");
    if (!strcmp(sub, "list"))
        return cli_call_show(c, "GET", "/v1/tuning-jobs", NULL, show_list);
    if (!strcmp(sub, "submit")) {
        json_error_t je;
        json_t *body = !strcmp(pos[0], "-") ? json_loadf(stdin, JSON_REJECT_DUPLICATES, &je)
                                            : json_load_file(pos[0], JSON_REJECT_DUPLICATES, &je);
        if (!body) {
            fprintf(stderr, "kiln tune: could not read %s: %s (line %d, column %d)\n", pos[0], je.text, je.line,
                    je.column);
            return CLI_EXIT_USAGE;
        }
        int rc = cli_call_show(c, "POST", "/v1/tuning-jobs", body, show_tuning);
        json_decref(body);
        return rc;
    }
    char seg[400], path[512];
    int src = cli_path_segment("tune", pos[0], seg, sizeof seg);
    if (src)
        return src;
    snprintf(path, sizeof path, "/v1/tuning-jobs/%s%s", seg, !strcmp(sub, "stop") ? ":stop" : "");
    if (!strcmp(sub, "describe"))
        return cli_call_show(c, "GET", path, NULL, show_tuning);
    json_t *empty = json_object();
    int rc = cli_call_show(c, "POST", path, empty, show_tuning);
    json_decref(empty);
    return rc;
}
