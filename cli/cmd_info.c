/* cmd_info.c - the read-only subcommands of `kiln` that are not about one job's lifecycle:
 * metrics (summary table with sparklines, or raw step,value rows) and version. (Workers are
 * cmd_trust.c's.) */
#include "cli/cli_int.h"

#include <stdlib.h>
#include <string.h>

int cli_cmd_metrics(cli_client_t *c, int argc, char **argv)
{
    const char *ref = NULL, *name = NULL, *v;
    bool raw = false;
    long points = 1000;
    for (int i = 1; i < argc; i++) {
        int m;
        if ((m = cli_opt("metrics", argc, argv, &i, "--name", "-n", &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            name = v;
        } else if ((m = cli_opt("metrics", argc, argv, &i, "--points", NULL, &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            if (!cli_parse_int(v, 2, 10000000, &points))
                return cli_usage_error("metrics", "--points must be a number from 2 to 10000000 (got \"%s\")", v);
        } else if (!strcmp(argv[i], "--raw")) {
            raw = true;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error("metrics", "unknown option %s", argv[i]);
        } else if (!ref) {
            ref = argv[i];
        } else {
            return cli_usage_error("metrics", "unexpected argument %s", argv[i]);
        }
    }
    if (!ref)
        return cli_usage_error("metrics", "missing the job id");

    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = CLI_EXIT_OK;
    json_t *reply = NULL;
    char id[64], path[160], num[24];
    char *p = NULL;
    if (cli_resolve_job(c, ref, id, &err) != 0)
        goto fail;
    snprintf(path, sizeof(path), "/v1/jobs/%s/metrics", id);
    snprintf(num, sizeof(num), "%ld", points);
    p = strdup(path);
    /* The chart shows the run as it stands: per step, the latest attempt's value (a step an
     * attempt trained again after a lost one would otherwise appear twice); raw and JSON output
     * give every attempt's points, each with its attempt. */
    if (!p || cli_path_add(&p, "max_points", num) != 0 || (name && cli_path_add(&p, "name", name) != 0) ||
        (!raw && !c->json && cli_path_add(&p, "attempt", "latest") != 0)) {
        kiln_err_set(&err, KILN_ENOMEM, NULL, "out of memory");
        goto fail;
    }
    if (cli_request(c, "GET", p, NULL, NULL, NULL, &reply, &err) != 0)
        goto fail;
    if (name && json_array_size(json_object_get(reply, "metrics")) == 0) {
        kiln_err_set(&err, KILN_ENOTFOUND, "name", "job %.8s has no metric named \"%s\"", id, name);
        kiln_err_hint(&err, "kiln metrics %.8s lists the job's metrics", id);
        goto fail;
    }
    if (c->json) {
        cli_print_out(c, reply);
    } else if (raw) {
        cli_print_metrics_raw(stdout, reply);
    } else {
        cli_print_metrics(stdout, reply, 32);
    }
    goto done;

fail:
    rc = cli_fail(c, &err);
done:
    free(p);
    json_decref(reply);
    return rc;
}

int cli_cmd_version(cli_client_t *c, int argc, char **argv)
{
    if (argc > 1)
        return cli_usage_error("version", "unexpected argument %s", argv[1]);
    /* Both versions; a kilnd that cannot be reached is an error (exit 6), as for any command. */
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *reply = NULL;
    long saved = c->timeout_ms;
    c->timeout_ms = 5000;
    int rc = cli_request(c, "GET", "/healthz", NULL, NULL, NULL, &reply, &err);
    c->timeout_ms = saved;
    const char *ver = rc == 0 ? cli_jstr(reply, "version") : "";
    if (c->json) {
        json_t *o = json_pack("{s:{s:s}, s:{s:s, s:s, s:s}}", "client", "version", CLI_VERSION, "server", "url",
                              c->settings.url, "version", ver, rc == 0 ? "status" : "error",
                              rc == 0 ? (*cli_jstr(reply, "status") ? cli_jstr(reply, "status") : "ok") : err.message);
        cli_print_out(c, o);
        json_decref(o);
    } else {
        printf("kiln %s\n", CLI_VERSION);
        if (rc == 0)
            printf("kilnd %s at %s\n", *ver ? ver : "(version not reported)", c->settings.url);
    }
    json_decref(reply);
    if (rc != 0) {
        fprintf(stderr, "kilnd at %s: unreachable\n", c->settings.url);
        return cli_fail(c, &err);
    }
    return CLI_EXIT_OK;
}
