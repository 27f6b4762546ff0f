/* cmd_jobs.c - the job subcommands of `kiln`: submit, jobs, describe and stop. Each parses its
 * arguments, makes its REST calls through http.c and prints through format.c. */
#include "cli/cli_int.h"

#include <ctype.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

int cli_read_request(const char *path, const char *what, json_t **out, kiln_err_t *err)
{
    json_error_t jerr;
    *out = NULL;
    if (!strcmp(path, "-")) {
        *out = json_loadf(stdin, JSON_REJECT_DUPLICATES, &jerr);
        if (!*out)
            return kiln_err_set(err, KILN_EINVAL, NULL, "stdin:%d:%d: %s", jerr.line, jerr.column, jerr.text);
    } else {
        char *text = NULL;
        size_t len = 0;
        int rc = kiln_file_read(path, &text, &len, err);
        if (rc != 0)
            return rc;
        *out = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
        free(text);
        if (!*out)
            return kiln_err_set(err, KILN_EINVAL, NULL, "%s:%d:%d: %s", path, jerr.line, jerr.column, jerr.text);
    }
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return kiln_err_set(err, KILN_EINVAL, NULL, "%s: %s must be a JSON object", path, what);
    }
    return 0;
}

/* obj[key], a relative path that exists here, made absolute; anything else left as is. */
static void absolutize(json_t *obj, const char *key)
{
    const char *p = json_string_value(json_object_get(obj, key));
    if (!p || !*p || p[0] == '/' || strstr(p, "://"))
        return;
    char *abs = realpath(p, NULL);
    if (abs) {
        json_object_set_new(obj, key, json_string(abs));
        free(abs);
    }
}

/* A relative data path that exists here ("data/tinyshakespeare.txt" from the repository root)
 * is made absolute, so that an agent finds it whatever its own working directory is: an engine
 * job's data.train and data.val and a script job's data.channels, as the SDK does. Anything
 * else (absolute paths, URLs, "synthetic", paths only the agents' machines have) is left as is. */
void cli_absolutize_data(json_t *spec)
{
    static const char *const keys[] = {"train", "val"};
    json_t *data = json_object_get(spec, "data");
    for (size_t i = 0; i < KILN_ARRAY_LEN(keys); i++)
        absolutize(data, keys[i]);
    json_t *channels = json_object_get(data, "channels");
    const char *name;
    json_t *v;
    json_object_foreach(channels, name, v)
        absolutize(channels, name);
}

int cli_source_dir(cli_client_t *c, json_t *spec, const char *dir, kiln_err_t *err)
{
    if (!json_is_string(json_object_get(spec, "entry_point"))) {
        kiln_err_set(err, KILN_EINVAL, "--source-dir", "--source-dir is a script job's code, and this spec names "
                     "no entry_point");
        kiln_err_hint(err, "add \"entry_point\": \"train.py\" (the program to run, inside DIR) to the spec");
        return KILN_EINVAL;
    }
    json_t *given = json_object_get(spec, "source");
    if (given && !json_is_null(given)) {
        kiln_err_set(err, KILN_EINVAL, "--source-dir", "the spec names a source and --source-dir gives another");
        kiln_err_hint(err, "leave \"source\" out of the spec, or --source-dir off the command");
        return KILN_EINVAL;
    }
    char source[100];
    int rc = cli_code_push(c, dir, json_string_value(json_object_get(spec, "project")), source, err);
    if (rc == 0)
        json_object_set_new(spec, "source", json_string(source));
    return rc;
}

int cli_cmd_submit(cli_client_t *c, int argc, char **argv)
{
    const char *file = NULL, *key = NULL, *source_dir = NULL, *v;
    bool follow = false;
    for (int i = 1; i < argc; i++) {
        int m = cli_opt("submit", argc, argv, &i, "--idempotency-key", NULL, &v);
        if (m < 0)
            return CLI_EXIT_USAGE;
        if (m) {
            key = v;
        } else if ((m = cli_opt("submit", argc, argv, &i, "--source-dir", NULL, &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            source_dir = v;
        } else if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--follow")) {
            follow = true;
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            return cli_usage_error("submit", "unknown option %s", argv[i]);
        } else if (!file) {
            file = argv[i];
        } else {
            return cli_usage_error("submit", "one job file at a time (got %s and %s)", file, argv[i]);
        }
    }
    if (!file)
        return cli_usage_error("submit", "missing the job file");

    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *spec = NULL, *job = NULL;
    int rc = CLI_EXIT_OK;
    char header[600];
    const char *headers[2] = {NULL, NULL};
    long http = 0;
    if (cli_read_request(file, "a job spec", &spec, &err) != 0) {
        rc = cli_fail(c, &err);
        goto done;
    }
    cli_absolutize_data(spec);
    if (source_dir && cli_source_dir(c, spec, source_dir, &err) != 0) {
        rc = cli_fail(c, &err);
        goto done;
    }
    if (key) {
        snprintf(header, sizeof(header), "Idempotency-Key: %s", key);
        headers[0] = header;
    }
    if (cli_request(c, "POST", "/v1/jobs", spec, headers, &http, &job, &err) != 0) {
        rc = cli_fail(c, &err);
        goto done;
    }
    const char *id = cli_jstr(job, "id");
    if (c->json) {
        cli_print_out(c, job);
    } else {
        json_t *res = json_object_get(json_object_get(job, "spec"), "resources");
        double nodes = cli_jnum(res, "nodes"), spn = cli_jnum(res, "slots_per_node");
        printf("%s\n", id);
        const char *queue = cli_jstr(job, "queue");
        fprintf(stderr, "%s job %.8s \"%s\": %s%s%s (%.0f node%s x %.0f %s slot%s)%s\n",
                http == 200 ? "existing" : "submitted", id, cli_jstr(job, "name"), cli_jstr(job, "state"),
                *queue ? " in queue " : "", queue,
                nodes == nodes ? nodes : 1, nodes == 1 ? "" : "s", spn == spn ? spn : 1,
                *cli_jstr(res, "slot_type") ? cli_jstr(res, "slot_type") : "cpu", spn == 1 ? "" : "s",
                http == 200 ? " - same idempotency key, nothing new submitted" : "");
    }
    fflush(stdout);
    if (follow) {
        char final_state[32] = "";
        if (cli_follow_logs(c, id, -1, NULL, final_state, &err) != 0) {
            rc = cli_fail(c, &err);
            goto done;
        }
        if (!strcmp(final_state, "FAILED"))
            rc = CLI_EXIT_ERROR;
    }

done:
    json_decref(spec);
    json_decref(job);
    return rc;
}

typedef struct jobs_query {
    const char *status, *tag;
} jobs_query_t;

/* A page of GET /v1/jobs with kiln jobs' filters. */
static int jobs_page(const cli_client_t *c, long page_size, const char *token, void *ud, json_t **page,
                     kiln_err_t *err)
{
    const jobs_query_t *q = ud;
    char ps[24];
    snprintf(ps, sizeof(ps), "%ld", page_size);
    char *path = strdup("/v1/jobs");
    if (!path || cli_path_add(&path, "page_size", ps) != 0 || (q->status && cli_path_add(&path, "status", q->status) != 0) ||
        (q->tag && cli_path_add(&path, "tag", q->tag) != 0) ||
        (token && cli_path_add(&path, "page_token", token) != 0)) {
        free(path);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    int r = cli_request(c, "GET", path, NULL, NULL, NULL, page, err);
    free(path);
    return r;
}

int cli_cmd_jobs(cli_client_t *c, int argc, char **argv)
{
    const char *status = NULL, *tag = NULL, *v;
    long limit = 20, page_size = KILN_PAGE_SIZE_MAX;
    bool all = false;
    for (int i = 1; i < argc; i++) {
        int m;
        if ((m = cli_opt("jobs", argc, argv, &i, "--status", "-s", &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            status = v;
        } else if ((m = cli_opt("jobs", argc, argv, &i, "--tag", "-t", &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            tag = v;
        } else if ((m = cli_paging_opt("jobs", argc, argv, &i, &limit, &page_size, &all)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
        } else {
            return cli_usage_error("jobs", "unexpected argument %s", argv[i]);
        }
    }
    char status_up[256] = "";
    if (status) {
        for (size_t k = 0; status[k] && k + 1 < sizeof(status_up); k++)
            status_up[k] = (char)toupper((unsigned char)status[k]);
    }

    kiln_err_t err;
    kiln_err_clear(&err);
    jobs_query_t q = {status ? status_up : NULL, tag};
    json_t *acc = NULL;
    bool more = false;
    if (cli_collect_pages(c, jobs_page, &q, "jobs", page_size, limit, all, &acc, &more, &err) != 0)
        return cli_fail(c, &err);
    if (c->json) {
        json_t *o = json_pack("{s:O}", "jobs", acc);
        cli_print_out(c, o);
        json_decref(o);
    } else if (!cli_print_names(c, acc, "id")) {
        cli_print_jobs(stdout, acc, kiln_now_us(), c->output == CLI_OUT_WIDE);
        if (more)
            fprintf(stderr, "(showing the newest %zu jobs; --all lists every one, --limit N more)\n",
                    json_array_size(acc));
    }
    json_decref(acc);
    return CLI_EXIT_OK;
}

/* Parses "CMD ID" with no options beyond those the caller handles; returns the ID or NULL after
 * printing a usage error. */
static const char *cli_one_id(const char *cmd, const char *id, const char *extra)
{
    if (extra) {
        cli_usage_error(cmd, "unexpected argument %s", extra);
        return NULL;
    }
    if (!id) {
        cli_usage_error(cmd, "missing the job id");
        return NULL;
    }
    return id;
}

int cli_cmd_describe(cli_client_t *c, int argc, char **argv)
{
    const char *ref = NULL, *extra = NULL;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-' && argv[i][1])
            return cli_usage_error("describe", "unknown option %s", argv[i]);
        if (!ref)
            ref = argv[i];
        else if (!extra)
            extra = argv[i];
    }
    if (!cli_one_id("describe", ref, extra))
        return CLI_EXIT_USAGE;

    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = CLI_EXIT_OK;
    json_t *job = NULL, *events = NULL;
    char id[64], path[160];
    if (cli_resolve_job(c, ref, id, &err) != 0) {
        rc = cli_fail(c, &err);
        goto done;
    }
    snprintf(path, sizeof(path), "/v1/jobs/%s", id);
    if (cli_request(c, "GET", path, NULL, NULL, NULL, &job, &err) != 0) {
        rc = cli_fail(c, &err);
        goto done;
    }
    snprintf(path, sizeof(path), "/v1/jobs/%s/events", id);
    if (cli_request(c, "GET", path, NULL, NULL, NULL, &events, &err) != 0) {
        rc = cli_fail(c, &err);
        goto done;
    }
    if (c->json) {
        json_t *o = json_pack("{s:O,s:O}", "job", job, "events", json_object_get(events, "events"));
        cli_print_out(c, o);
        json_decref(o);
    } else {
        cli_print_job(stdout, job, events, kiln_now_us());
    }

done:
    json_decref(job);
    json_decref(events);
    return rc;
}

int cli_cmd_stop(cli_client_t *c, int argc, char **argv)
{
    const char *ref = NULL, *extra = NULL, *reason = NULL, *v;
    for (int i = 1; i < argc; i++) {
        int m = cli_opt("stop", argc, argv, &i, "--reason", "-r", &v);
        if (m < 0)
            return CLI_EXIT_USAGE;
        if (m)
            reason = v;
        else if (argv[i][0] == '-' && argv[i][1])
            return cli_usage_error("stop", "unknown option %s", argv[i]);
        else if (!ref)
            ref = argv[i];
        else if (!extra)
            extra = argv[i];
    }
    if (!cli_one_id("stop", ref, extra))
        return CLI_EXIT_USAGE;

    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = CLI_EXIT_OK;
    json_t *job = NULL, *body = NULL;
    char id[64], path[160];
    if (cli_resolve_job(c, ref, id, &err) != 0) {
        rc = cli_fail(c, &err);
        goto done;
    }
    body = reason ? json_pack("{s:s}", "reason", reason) : json_object();
    snprintf(path, sizeof(path), "/v1/jobs/%s:stop", id);
    if (cli_request(c, "POST", path, body, NULL, NULL, &job, &err) != 0) {
        rc = cli_fail(c, &err);
        goto done;
    }
    if (c->json)
        cli_print_out(c, job);
    else
        printf("job %.8s (%s): %s\n", id, cli_jstr(job, "name"), cli_jstr(job, "state"));

done:
    json_decref(job);
    json_decref(body);
    return rc;
}
