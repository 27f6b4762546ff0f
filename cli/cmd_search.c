/* cmd_search.c - the experiment subcommands of `kiln`: search (the filter language through
 * POST /v1/jobs:search, page after page) and compare (jobs side by side, with each chosen
 * metric's downsampled curve as a text chart). Printing is compare.c's. */
#include "cli/cli_int.h"

#include <stdlib.h>
#include <string.h>

typedef struct search_query {
    const char *filter, *order_by, *columns;
} search_query_t;

/* A page of POST /v1/jobs:search (the filter may be longer than a URL should be). */
static int search_page(const cli_client_t *c, long page_size, const char *token, void *ud, json_t **page,
                       kiln_err_t *err)
{
    const search_query_t *q = ud;
    json_t *body = json_pack("{s:s, s:I}", "filter", q->filter ? q->filter : "", "page_size", (json_int_t)page_size);
    if (!body)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    if (q->order_by)
        json_object_set_new(body, "order_by", json_string(q->order_by));
    if (q->columns)
        json_object_set_new(body, "columns", json_string(q->columns));
    if (token)
        json_object_set_new(body, "page_token", json_string(token));
    int r = cli_request(c, "POST", "/v1/jobs:search", body, NULL, NULL, page, err);
    json_decref(body);
    return r;
}

int cli_cmd_search(cli_client_t *c, int argc, char **argv)
{
    const char *filter = NULL, *columns = NULL, *order_by = NULL, *v;
    long limit = 50, page_size = KILN_PAGE_SIZE_MAX;
    bool all = false;
    for (int i = 1; i < argc; i++) {
        int m;
        if ((m = cli_opt("search", argc, argv, &i, "--columns", "-c", &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            columns = v;
        } else if ((m = cli_opt("search", argc, argv, &i, "--order-by", NULL, &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            order_by = v;
        } else if ((m = cli_paging_opt("search", argc, argv, &i, &limit, &page_size, &all)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--")) {
            if (i + 1 < argc && !filter)
                filter = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1] && !filter) {
            return cli_usage_error("search", "unknown option %s (put a filter that starts with '-' after --)", argv[i]);
        } else if (!filter) {
            filter = argv[i];
        } else {
            return cli_usage_error("search", "one filter at a time: quote it ('hp.lr < 1e-3 AND state = COMPLETED')");
        }
    }
    kiln_err_t err;
    kiln_err_clear(&err);
    search_query_t q = {filter, order_by, columns};
    json_t *acc = NULL;
    bool more = false;
    if (cli_collect_pages(c, search_page, &q, "jobs", page_size, limit, all, &acc, &more, &err) != 0)
        return cli_fail(c, &err);
    if (c->json) {
        json_t *o = json_pack("{s:O}", "jobs", acc);
        cli_print_out(c, o);
        json_decref(o);
    } else if (!cli_print_names(c, acc, "id")) {
        cli_print_search(stdout, acc, kiln_now_us(), c->output == CLI_OUT_WIDE);
        if (more)
            fprintf(stderr, "(showing the first %zu; --all shows every match, --limit N more)\n", json_array_size(acc));
    }
    json_decref(acc);
    return CLI_EXIT_OK;
}

#define CLI_COMPARE_MAX 9
#define CLI_COMPARE_METRICS 8

/* The points of a metrics reply's one series as steps and values (malloc'd), into s. */
static void series_of(const json_t *reply, cli_series_t *s)
{
    const json_t *pts = json_object_get(json_array_get(json_object_get(reply, "metrics"), 0), "points");
    size_t n = json_array_size(pts);
    double *x = calloc(n + 1, sizeof *x), *y = calloc(n + 1, sizeof *y);
    s->steps = x;
    s->values = y;
    s->n = x && y ? n : 0;
    for (size_t i = 0; i < s->n; i++) {
        const json_t *p = json_array_get(pts, i);
        x[i] = cli_jnum(p, "step");
        y[i] = cli_jnum(p, "value");
    }
}

int cli_cmd_compare(cli_client_t *c, int argc, char **argv)
{
    const char *refs[CLI_COMPARE_MAX], *metrics[CLI_COMPARE_METRICS], *v;
    int nrefs = 0, nmetrics = 0;
    long points = 120, width = 64, height = 10;
    for (int i = 1; i < argc; i++) {
        int m;
        if ((m = cli_opt("compare", argc, argv, &i, "--metric", "-m", &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            if (nmetrics == CLI_COMPARE_METRICS)
                return cli_usage_error("compare", "at most %d --metric", CLI_COMPARE_METRICS);
            metrics[nmetrics++] = v;
        } else if ((m = cli_opt("compare", argc, argv, &i, "--points", NULL, &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            if (!cli_parse_int(v, 2, 100000, &points))
                return cli_usage_error("compare", "--points must be a number from 2 to 100000 (got \"%s\")", v);
        } else if ((m = cli_opt("compare", argc, argv, &i, "--width", NULL, &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            if (!cli_parse_int(v, 16, 400, &width))
                return cli_usage_error("compare", "--width must be a number from 16 to 400 (got \"%s\")", v);
        } else if ((m = cli_opt("compare", argc, argv, &i, "--height", NULL, &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            if (!cli_parse_int(v, 3, 100, &height))
                return cli_usage_error("compare", "--height must be a number from 3 to 100 (got \"%s\")", v);
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error("compare", "unknown option %s", argv[i]);
        } else if (nrefs == CLI_COMPARE_MAX) {
            return cli_usage_error("compare", "at most %d jobs at a time", CLI_COMPARE_MAX);
        } else {
            refs[nrefs++] = argv[i];
        }
    }
    if (nrefs < 2)
        return cli_usage_error("compare", "name at least two jobs");

    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = CLI_EXIT_OK;
    json_t *jobs = json_array(), *curves = json_object();
    char ids[CLI_COMPARE_MAX][64], path[512];
    cli_series_t series[CLI_COMPARE_MAX];
    memset(series, 0, sizeof series);
    for (int j = 0; j < nrefs; j++) {
        json_t *job = NULL;
        if (cli_resolve_job(c, refs[j], ids[j], &err) != 0)
            goto fail;
        snprintf(path, sizeof path, "/v1/jobs/%.63s", ids[j]);
        if (cli_request(c, "GET", path, NULL, NULL, NULL, &job, &err) != 0)
            goto fail;
        json_array_append_new(jobs, job);
    }
    /* The curves: the metrics asked for, else train_loss and val_loss where the jobs have
     * them, else the first metric any of them has. */
    const char *chosen[CLI_COMPARE_METRICS];
    int nchosen = 0;
    for (int m = 0; m < nmetrics; m++)
        chosen[nchosen++] = metrics[m];
    if (nchosen == 0) {
        static const char *const pref[] = {"train_loss", "val_loss"};
        for (size_t p = 0; p < KILN_ARRAY_LEN(pref); p++)
            for (int j = 0; j < nrefs; j++)
                if (json_object_get(json_object_get(json_array_get(jobs, (size_t)j), "summaries"), pref[p])) {
                    chosen[nchosen++] = pref[p];
                    break;
                }
        for (int j = 0; j < nrefs && nchosen == 0; j++) {
            void *it = json_object_iter(json_object_get(json_array_get(jobs, (size_t)j), "summaries"));
            if (it)
                chosen[nchosen++] = json_object_iter_key(it);
        }
    }
    for (int m = 0; m < nchosen; m++) {
        json_t *per_job = json_array();
        json_object_set_new(curves, chosen[m], per_job);
        for (int j = 0; j < nrefs; j++) {
            json_t *reply = NULL;
            char *p = NULL;
            char num[24];
            snprintf(path, sizeof path, "/v1/jobs/%.63s/metrics", ids[j]);
            snprintf(num, sizeof num, "%ld", points);
            p = strdup(path);
            /* each curve as the run stands: per step the latest attempt's point */
            if (!p || cli_path_add(&p, "name", chosen[m]) != 0 || cli_path_add(&p, "max_points", num) != 0 ||
                cli_path_add(&p, "attempt", "latest") != 0) {
                free(p);
                kiln_err_set(&err, KILN_ENOMEM, NULL, "out of memory");
                goto fail;
            }
            int r = cli_request(c, "GET", p, NULL, NULL, NULL, &reply, &err);
            free(p);
            if (r != 0)
                goto fail;
            json_t *pts = json_object_get(json_array_get(json_object_get(reply, "metrics"), 0), "points");
            if (pts)
                json_array_append(per_job, pts);
            else
                json_array_append_new(per_job, json_array());
            if (!c->json)
                series_of(reply, &series[j]);
            json_decref(reply);
        }
        if (!c->json) {
            if (m == 0) {
                cli_print_compare(stdout, jobs, metrics, nmetrics);
                fputc('\n', stdout);
            }
            char title[160];
            snprintf(title, sizeof title, "%s", chosen[m]);
            cli_print_chart(stdout, title, series, nrefs, (int)width, (int)height);
            for (int j = 0; j < nrefs; j++) {
                free((void *)series[j].steps);
                free((void *)series[j].values);
                memset(&series[j], 0, sizeof series[j]);
            }
        }
    }
    if (c->json) {
        json_t *o = json_pack("{s:O, s:O}", "jobs", jobs, "curves", curves);
        cli_print_out(c, o);
        json_decref(o);
    } else {
        if (nchosen == 0)
            cli_print_compare(stdout, jobs, metrics, nmetrics);
        char legend[1024] = "";
        for (int j = 0; j < nrefs; j++) {
            char sid[16];
            size_t l = strlen(legend);
            snprintf(legend + l, sizeof legend - l, "%s%d %s %s", j ? "   " : "", j + 1,
                     cli_short_id(ids[j], sid, sizeof sid), cli_jstr(json_array_get(jobs, (size_t)j), "name"));
        }
        printf("%s\n", legend);
    }
    goto done;
fail:
    rc = cli_fail(c, &err);
done:
    for (int j = 0; j < CLI_COMPARE_MAX; j++) {
        free((void *)series[j].steps);
        free((void *)series[j].values);
    }
    json_decref(jobs);
    json_decref(curves);
    return rc;
}
