/* cmd_queues.c - `kiln queues list|describe|create|update|delete`: the queues jobs wait in, with
 * their quotas, cohort limits, weight and projects (/v1/queues). Cluster admins create, change and
 * delete them; everyone lists and describes them. */
#include "cli/cli_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "cpu=8,gpu=0" as {"cpu": 8, "gpu": 0}; "none" as null. NULL after a usage error (printed). */
static json_t *slot_counts(const char *opt, const char *v)
{
    if (!strcmp(v, "none"))
        return json_null();
    json_t *o = json_object();
    char buf[256];
    kiln_strlcpy(buf, v, sizeof buf);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '=');
        long n = 0;
        if (!eq || !cli_parse_int(eq + 1, 0, 1000000, &n)) {
            json_decref(o);
            cli_usage_error("queues", "%s takes slot counts such as cpu=8,gpu=0 or none (got \"%s\")", opt, v);
            return NULL;
        }
        *eq = '\0';
        json_object_set_new(o, t, json_integer(n));
    }
    return o;
}

/* The fields the options of create or update set, into body. Returns 0, or CLI_EXIT_USAGE. */
static int queue_options(int argc, char **argv, int first, json_t *body, const char **name)
{
    static const char *const counts[][2] = {{"--quota", "quota"}, {"--borrowing-limit", "borrowing_limit"},
                                            {"--lending-limit", "lending_limit"}};
    static const char *const policies[][2] = {{"--preempt-within-queue", "within_queue"},
                                              {"--reclaim-within-cohort", "reclaim_within_cohort"}};
    *name = NULL;
    for (int i = first; i < argc; i++) {
        const char *v;
        int m = 0;
        bool done = false;
        for (int k = 0; k < 3 && !done; k++) {
            if ((m = cli_opt("queues", argc, argv, &i, counts[k][0], NULL, &v)) == 0)
                continue;
            if (m < 0)
                return CLI_EXIT_USAGE;
            json_t *o = slot_counts(counts[k][0], v);
            if (!o)
                return CLI_EXIT_USAGE;
            json_object_set_new(body, counts[k][1], o);
            done = true;
        }
        /* the preemption policy's values go as given: the service says which it takes */
        for (int k = 0; k < 2 && !done; k++) {
            if ((m = cli_opt("queues", argc, argv, &i, policies[k][0], NULL, &v)) == 0)
                continue;
            if (m < 0)
                return CLI_EXIT_USAGE;
            json_t *pre = json_object_get(body, "preemption");
            if (!pre)
                json_object_set_new(body, "preemption", pre = json_object());
            json_object_set_new(pre, policies[k][1], json_string(v));
            done = true;
        }
        if (done)
            continue;
        if ((m = cli_opt("queues", argc, argv, &i, "--cohort", NULL, &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            json_object_set_new(body, "cohort", !strcmp(v, "none") ? json_null() : json_string(v));
        } else if ((m = cli_opt("queues", argc, argv, &i, "--weight", NULL, &v)) != 0) {
            char *end = NULL;
            double w = m > 0 ? strtod(v, &end) : 0;
            if (m < 0 || !end || *end || end == v)
                return m < 0 ? CLI_EXIT_USAGE : cli_usage_error("queues", "--weight takes a number (got \"%s\")", v);
            json_object_set_new(body, "weight", json_real(w));
        } else if ((m = cli_opt("queues", argc, argv, &i, "--projects", NULL, &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            json_t *arr = json_array();
            char buf[1024];
            kiln_strlcpy(buf, v, sizeof buf);
            char *save = NULL;
            for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
                json_array_append_new(arr, json_string(t));
            json_object_set_new(body, "projects", arr);
        } else if ((m = cli_opt("queues", argc, argv, &i, "--fair-sharing", NULL, &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            if (strcmp(v, "true") != 0 && strcmp(v, "false") != 0)
                return cli_usage_error("queues", "--fair-sharing takes true or false (got \"%s\")", v);
            json_object_set_new(body, "fair_sharing", json_boolean(!strcmp(v, "true")));
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error("queues", "unknown option %s", argv[i]);
        } else if (!*name) {
            *name = argv[i];
        } else {
            return cli_usage_error("queues", "unexpected argument %s", argv[i]);
        }
    }
    if (!*name)
        return cli_usage_error("queues", "missing the queue's name");
    return 0;
}

/* "cpu 8, gpu 0" from a slot-count object; unl for a missing slot type, "no limit" for null. */
static const char *counts_text(const json_t *o, const char *unl, char *buf, size_t n)
{
    if (!json_is_object(o))
        return "no limit";
    char cpu[24], gpu[24];
    const json_t *c = json_object_get(o, "cpu"), *g = json_object_get(o, "gpu");
    snprintf(cpu, sizeof cpu, "%lld", (long long)json_integer_value(c));
    snprintf(gpu, sizeof gpu, "%lld", (long long)json_integer_value(g));
    snprintf(buf, n, "cpu %s, gpu %s", c ? cpu : unl, g ? gpu : unl);
    return buf;
}

static void show_queue(const json_t *q)
{
    char a[64], b[64];
    const json_t *cohort = json_object_get(q, "cohort");
    printf("name:            %s\n", cli_jstr(q, "name"));
    printf("quota:           %s\n", counts_text(json_object_get(q, "quota"), "0", a, sizeof a));
    /* what it uses above its quota it borrows from its cohort: reclaimable by the lenders */
    char borrowed[64] = "";
    const json_t *quota = json_object_get(q, "quota"), *usage = json_object_get(q, "usage");
    static const char *const types[] = {"cpu", "gpu"};
    for (size_t t = 0; t < 2 && json_is_object(quota); t++) {
        json_int_t over = json_integer_value(json_object_get(usage, types[t])) -
                          json_integer_value(json_object_get(quota, types[t]));
        if (over > 0)
            snprintf(borrowed + strlen(borrowed), sizeof borrowed - strlen(borrowed), "%s%s %lld",
                     borrowed[0] ? ", " : " (borrowing ", types[t], (long long)over);
    }
    if (borrowed[0])
        snprintf(borrowed + strlen(borrowed), sizeof borrowed - strlen(borrowed), ")");
    printf("usage:           %s%s\n", counts_text(usage, "0", a, sizeof a), borrowed);
    printf("pending:         %lld job(s)\n", (long long)json_integer_value(json_object_get(q, "pending")));
    printf("admitted:        %lld job(s) holding slots\n", (long long)json_integer_value(json_object_get(q, "admitted")));
    printf("cohort:          %s\n", json_is_string(cohort) ? json_string_value(cohort) : "(none)");
    if (json_is_string(cohort)) {
        printf("borrowing limit: %s\n", counts_text(json_object_get(q, "borrowing_limit"), "unlimited", a, sizeof a));
        printf("lending limit:   %s\n", counts_text(json_object_get(q, "lending_limit"), "unlimited", b, sizeof b));
    }
    printf("weight:          %g\n", cli_jnum(q, "weight"));
    printf("fair sharing:    %s\n", json_is_true(json_object_get(q, "fair_sharing")) ? "between projects" : "no");
    const json_t *pre = json_object_get(q, "preemption");
    printf("preemption:      within queue %s, reclaim within cohort %s\n", cli_jstr(pre, "within_queue"),
           cli_jstr(pre, "reclaim_within_cohort"));
    printf("projects:        ");
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(q, "projects"), i, p)
        printf("%s%s", i ? ", " : "", !strcmp(json_string_value(p), "*") ? "every project" : json_string_value(p));
    /* a caller that is not a cluster admin reads only its own projects of the queue's */
    if (json_array_size(json_object_get(q, "projects")) == 0)
        printf("none: no project may submit to it (or, unless you are a cluster admin, only projects you are not "
               "a member of)");
    printf("\n");
}

static void show_list(const cli_client_t *c, const json_t *reply)
{
    char a[64], b[64];
    if (cli_print_names(c, json_object_get(reply, "queues"), "name"))
        return;
    /* -o wide adds what sets queues apart when a cluster has many: the jobs holding slots, the
     * weight and the preemption policy, which otherwise takes a describe per queue */
    bool wide = c->output == CLI_OUT_WIDE;
    if (cli_table_headers()) {
        printf("%-20s %-14s %-18s %-18s %s", "NAME", "COHORT", "QUOTA", "USAGE", "PENDING");
        if (wide)
            printf(" %-8s %-6s %-14s %s", "ADMITTED", "WEIGHT", "WITHIN-QUEUE", "RECLAIM");
        printf("\n");
    }
    size_t i;
    json_t *q;
    json_array_foreach(json_object_get(reply, "queues"), i, q) {
        const json_t *cohort = json_object_get(q, "cohort"), *pre = json_object_get(q, "preemption");
        printf("%-20s %-14s %-18s %-18s %-*lld", cli_jstr(q, "name"),
               json_is_string(cohort) ? json_string_value(cohort) : "-",
               counts_text(json_object_get(q, "quota"), "0", a, sizeof a),
               counts_text(json_object_get(q, "usage"), "0", b, sizeof b), wide ? 7 : 0,
               (long long)json_integer_value(json_object_get(q, "pending")));
        if (wide)
            printf(" %-8lld %-6g %-14s %s", (long long)json_integer_value(json_object_get(q, "admitted")),
                   cli_jnum(q, "weight"), cli_jstr(pre, "within_queue"), cli_jstr(pre, "reclaim_within_cohort"));
        printf("\n");
    }
}

static void show_one(const cli_client_t *c, const json_t *reply)
{
    (void)c;
    show_queue(reply);
}

static void show_deleted(const cli_client_t *c, const json_t *reply)
{
    (void)c;
    printf("deleted queue %s\n", cli_jstr(reply, "name"));
}

int cli_cmd_queues(cli_client_t *c, int argc, char **argv)
{
    static const char *const subs[] = {"list", "describe", "create", "update", "delete", NULL};
    int first;
    const char *sub = cli_subcommand("queues", argc, argv, subs, &first);
    if (!sub)
        return CLI_EXIT_USAGE;
    char seg[400], path[512];
    if (!strcmp(sub, "create") || !strcmp(sub, "update")) {
        json_t *body = json_object();
        const char *name = NULL;
        int rc = queue_options(argc, argv, first, body, &name);
        if (rc == 0 && !strcmp(sub, "create") && !json_object_get(body, "quota"))
            rc = cli_usage_error("queues", "create: --quota is required: slot counts such as cpu=8,gpu=0, or none "
                                 "for no limit");
        if (rc == 0 && !strcmp(sub, "update") && json_object_size(body) == 0)
            rc = cli_usage_error("queues", "update: nothing to change: give --quota, --cohort, --borrowing-limit, "
                                 "--lending-limit, --weight, --projects, --fair-sharing, --preempt-within-queue or "
                                 "--reclaim-within-cohort");
        if (rc == 0 && strcmp(sub, "create") != 0)
            rc = cli_path_segment("queues", name, seg, sizeof seg);
        if (rc == 0 && !strcmp(sub, "create")) {
            json_object_set_new(body, "name", json_string(name));
            rc = cli_call_show(c, "POST", "/v1/queues", body, show_one);
        } else if (rc == 0) {
            snprintf(path, sizeof path, "/v1/queues/%s", seg);
            rc = cli_call_show(c, "PATCH", path, body, show_one);
        }
        json_decref(body);
        return rc;
    }
    const char *pos[1];
    int want = !strcmp(sub, "list") ? 0 : 1;
    int n = cli_positional("queues", argc, argv, first, pos, want);
    if (n < 0)
        return CLI_EXIT_USAGE;
    if (n < want)
        return cli_usage_error("queues", "%s: missing the queue's name (kiln queues lists them)", sub);
    if (!strcmp(sub, "list"))
        return cli_call_show(c, "GET", "/v1/queues", NULL, show_list);
    int src = cli_path_segment("queues", pos[0], seg, sizeof seg);
    if (src)
        return src;
    snprintf(path, sizeof path, "/v1/queues/%s", seg);
    if (!strcmp(sub, "describe"))
        return cli_call_show(c, "GET", path, NULL, show_one);
    return cli_call_show(c, "DELETE", path, NULL, show_deleted);
}
