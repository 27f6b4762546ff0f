/* cmd_tune.c - `kiln tune submit|list|describe|stop`: tuning jobs (/v1/tuning-jobs), searches over
 * a base job's hyperparameters whose trials are ordinary jobs. describe prints a warm start's
 * parents, the trials table and the best trial; list each search's trials done, running and best.
 * describe and stop take an id, a unique id prefix or a unique name. */
#include "cli/cli_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/tuning_states.h"

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
    const json_t *hb = json_object_get(json_object_get(t, "spec"), "hyperband");
    if (json_is_object(hb)) {
        /* where its trials pause: what the RUNG and STEPS columns count */
        printf("hyperband:  rungs from %lld to %lld steps, reduction factor %lld, %lld bracket(s), %s sampler",
               (long long)json_integer_value(json_object_get(hb, "min_resource")),
               (long long)json_integer_value(json_object_get(hb, "max_resource")),
               (long long)json_integer_value(json_object_get(hb, "reduction_factor")),
               (long long)json_integer_value(json_object_get(hb, "brackets")), cli_jstr(hb, "sampler"));
        if (json_integer_value(json_object_get(hb, "max_rungs")))
            printf(", at most %lld rungs", (long long)json_integer_value(json_object_get(hb, "max_rungs")));
        printf("\n");
    }
    printf("objective:  %s %s\n", cli_jstr(obj, "goal"), cli_jstr(obj, "metric"));
    const json_t *trials = json_object_get(t, "trials");
    bool hyperband = !strcmp(cli_jstr(t, "strategy"), "hyperband");
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
            /* only hyperband has rungs: the other strategies' trials show none */
            char rung[24] = "-";
            if (hyperband)
                snprintf(rung, sizeof rung, "%lld", (long long)json_integer_value(json_object_get(tr, "rung")));
            printf("%-6lld %-10.8s %-11s %-12s %-8lld %-5s %s\n", (long long)json_integer_value(json_object_get(tr, "trial")),
                   cli_jstr(tr, "job_id"), cli_jstr(tr, "state"), objective,
                   (long long)json_integer_value(json_object_get(tr, "steps")), rung, p);
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
        /* an ended search waits for nothing more: "yet" read as if it did */
        bool ended = kiln_tuning_ended(cli_jstr(t, "state"));
        printf("\nbest:       (no trial %s %s%s)\n", ended ? "reported" : "has reported", cli_jstr(obj, "metric"),
               ended ? "" : " yet");
    }
}

static void show_list(const cli_client_t *c, const json_t *reply)
{
    if (cli_print_names(c, json_object_get(reply, "tuning_jobs"), "id"))
        return;
    /* ACTIVE is trials_running: trials not ended nor paused at a rung, those still waiting for
     * slots too (it read RUNNING, and said 2 of two QUEUED trials) */
    if (cli_table_headers())
        printf("%-36s %-16s %-10s %-10s %-7s %-7s %-12s %s\n", "ID", "NAME", "STATE", "STRATEGY", "TRIALS", "ACTIVE",
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

/* A page of GET /v1/tuning-jobs (a cli_page_fn). */
static int tune_page(const cli_client_t *c, long page_size, const char *token, void *ud, json_t **page,
                     kiln_err_t *err)
{
    (void)ud;
    char ps[24];
    snprintf(ps, sizeof ps, "%ld", page_size);
    char *path = strdup("/v1/tuning-jobs");
    if (!path || cli_path_add(&path, "page_size", ps) != 0 ||
        (token && cli_path_add(&path, "page_token", token) != 0)) {
        free(path);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    int rc = cli_request(c, "GET", path, NULL, NULL, NULL, page, err);
    free(path);
    return rc;
}

/* kiln tune list [--limit N] [--page-size N] [--all]: every tuning job the caller can see, newest
 * first, page by page (the newest N with --limit, as kiln jobs takes it). */
static int tune_list(cli_client_t *c, int argc, char **argv, int first)
{
    long limit = 0, page_size = KILN_PAGE_SIZE_MAX; /* limit 0: none given */
    bool all = false;
    for (int i = first; i < argc; i++) {
        int m = cli_paging_opt("tune", argc, argv, &i, &limit, &page_size, &all);
        if (m < 0)
            return CLI_EXIT_USAGE;
        if (m == 0 && strcmp(argv[i], "--") != 0)
            return cli_usage_error("tune", argv[i][0] == '-' && argv[i][1] ? "unknown option %s"
                                                                           : "unexpected argument %s", argv[i]);
    }
    /* every one unless --limit, and --all wins over --limit in either order, as in kiln jobs */
    all = all || limit == 0;
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *acc = NULL;
    bool more = false;
    if (cli_collect_pages(c, tune_page, NULL, "tuning_jobs", page_size, limit, all, &acc, &more, &err) != 0)
        return cli_fail(c, &err);
    json_t *reply = json_pack("{s:o}", "tuning_jobs", acc);
    if (c->json)
        cli_print_out(c, reply);
    else
        show_list(c, reply);
    json_decref(reply);
    if (more && !c->json)
        fprintf(stderr, "(showing the newest %ld tuning jobs; without --limit, every one)\n",
                limit);
    return CLI_EXIT_OK;
}

/* The tuning job ref names: its whole id as it is (36 characters shaped as an id: a name may be as
 * long); else, among the tuning jobs the caller can see (every page of GET /v1/tuning-jobs), the
 * one whose id starts with ref (4 characters or more, in either case, as kilnd reads a job's id
 * prefix) or whose name is ref, as the SDK's find_tuning_job and kiln describe's job references
 * do. id: 64 bytes (OUT). Returns 0, KILN_ENOTFOUND, KILN_EINVAL (several match: err lists them)
 * or a request error. */
static int tune_resolve(const cli_client_t *c, const char *ref, char *id, kiln_err_t *err)
{
    if (strlen(ref) == 36 && cli_id_shaped(ref)) {
        kiln_strlcpy(id, ref, 64);
        return 0;
    }
    json_t *list = NULL;
    bool more = false;
    int rc = cli_collect_pages(c, tune_page, NULL, "tuning_jobs", KILN_PAGE_SIZE_MAX, 0, true, &list, &more, err);
    if (rc != 0)
        return rc;
    int n = 0;
    char cands[256] = "";
    size_t off = 0, i;
    json_t *t;
    json_array_foreach(list, i, t) {
        const char *tid = cli_jstr(t, "id");
        if (strcmp(cli_jstr(t, "name"), ref) != 0 && (strlen(ref) < 4 || strncasecmp(tid, ref, strlen(ref)) != 0))
            continue;
        if (++n == 1)
            kiln_strlcpy(id, tid, 64);
        if (n <= 5 && off < sizeof cands)
            off += (size_t)snprintf(cands + off, sizeof cands - off, "%s%.8s %s (%s)", n > 1 ? ", " : "", tid,
                                    cli_jstr(t, "name"), cli_jstr(t, "state"));
    }
    json_decref(list);
    if (n == 1)
        return 0;
    if (n > 1) {
        kiln_err_set(err, KILN_EINVAL, NULL, "\"%s\" names %d tuning jobs", ref, n);
        kiln_err_detail(err, "newest first: %s%s", cands, n > 5 ? ", ..." : "");
        kiln_err_hint(err, "give the tuning job's id, or a prefix of it only that one has");
        return KILN_EINVAL;
    }
    kiln_err_set(err, KILN_ENOTFOUND, NULL, "no tuning job has the id, id prefix or name \"%s\"", ref);
    kiln_err_hint(err, "kiln tune list lists the tuning jobs you can see");
    return KILN_ENOTFOUND;
}

/* kiln tune submit FILE [--source-dir DIR]: the request as kiln submit reads a job spec (its base
 * job's relative data paths made absolute, its code packed and uploaded with --source-dir). */
static int tune_submit(cli_client_t *c, int argc, char **argv, int first)
{
    const char *file = NULL, *source_dir = NULL, *v;
    for (int i = first; i < argc; i++) {
        int m = cli_opt("tune", argc, argv, &i, "--source-dir", NULL, &v);
        if (m < 0)
            return CLI_EXIT_USAGE;
        if (m)
            source_dir = v;
        else if (argv[i][0] == '-' && argv[i][1] != '\0')
            return cli_usage_error("tune", "unknown option %s", argv[i]);
        else if (!file)
            file = argv[i];
        else
            return cli_usage_error("tune", "submit: one request file at a time (got %s and %s)", file, argv[i]);
    }
    if (!file)
        return cli_usage_error("tune", "submit: missing the request file (JSON; - reads standard input)");
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *body = NULL;
    int rc = CLI_EXIT_OK;
    if (cli_read_request(file, "a tuning request", &body, &err) != 0) {
        rc = cli_fail(c, &err);
        goto done;
    }
    json_t *job = json_object_get(body, "job");
    if (json_is_object(job))
        cli_absolutize_data(job);
    if (source_dir) {
        if (!json_is_object(job)) {
            kiln_err_set(&err, KILN_EINVAL, "--source-dir", "--source-dir is the base job's code, and the request "
                         "has no \"job\"");
            kiln_err_hint(&err, "give the base job as \"job\": {\"entry_point\": \"train.py\", ...}");
            rc = cli_fail(c, &err);
            goto done;
        }
        if (cli_source_dir(c, job, source_dir, &err) != 0) {
            rc = cli_fail(c, &err);
            goto done;
        }
    }
    rc = cli_call_show(c, "POST", "/v1/tuning-jobs", body, show_tuning);
done:
    json_decref(body);
    return rc;
}

int cli_cmd_tune(cli_client_t *c, int argc, char **argv)
{
    static const char *const subs[] = {"list", "submit", "describe", "stop", NULL};
    int first;
    const char *sub = cli_subcommand("tune", argc, argv, subs, &first);
    if (!sub)
        return CLI_EXIT_USAGE;
    if (!strcmp(sub, "submit"))
        return tune_submit(c, argc, argv, first);
    if (!strcmp(sub, "list"))
        return tune_list(c, argc, argv, first);
    const char *pos[1];
    int n = cli_positional("tune", argc, argv, first, pos, 1);
    if (n < 0)
        return CLI_EXIT_USAGE;
    if (n < 1)
        return cli_usage_error("tune", "%s: missing the tuning job's id or name (kiln tune list shows them)", sub);
    char seg[400], path[512], id[64];
    int src = cli_path_segment("tune", pos[0], seg, sizeof seg);
    if (src)
        return src;
    kiln_err_t err;
    kiln_err_clear(&err);
    if (tune_resolve(c, pos[0], id, &err) != 0)
        return cli_fail(c, &err);
    if ((src = cli_path_segment("tune", id, seg, sizeof seg)) != 0)
        return src;
    snprintf(path, sizeof path, "/v1/tuning-jobs/%s%s", seg, !strcmp(sub, "stop") ? ":stop" : "");
    if (!strcmp(sub, "describe"))
        return cli_call_show(c, "GET", path, NULL, show_tuning);
    json_t *empty = json_object();
    int rc = cli_call_show(c, "POST", path, empty, show_tuning);
    json_decref(empty);
    return rc;
}
