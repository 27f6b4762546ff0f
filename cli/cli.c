/* cli.c - `kiln`'s entry point: global options (--url, --json), subcommand dispatch, help texts
 * and the small argument helpers the subcommands share. The subcommands themselves live in
 * cmd_jobs.c, cmd_logs.c and cmd_info.c. */
#include "cli/cli_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct cli_command {
    const char *name;
    int (*run)(cli_client_t *c, int argc, char **argv);
    const char *usage;    /* arguments after the name */
    const char *summary;
    const char *help;     /* option lines */
} cli_command_t;

static const cli_command_t cli_commands[] = {
    {"submit", cli_cmd_submit, "JOB.json [--idempotency-key K] [-f|--follow]",
     "submit a training job (JOB.json, or - for stdin) and print its id",
     "  --idempotency-key K  retrying with the same key returns the same job, never a duplicate\n"
     "  -f, --follow         stream the job's logs until it ends; exit 1 if it FAILED\n"
     "  (a relative data.train / data.val path that exists here is sent as an absolute path)\n"},
    {"jobs", cli_cmd_jobs, "[--status S] [--tag K:V] [--limit N] [--all]",
     "list jobs, newest first",
     "  --status S     only jobs in these states (comma-separated: RUNNING,QUEUED)\n"
     "  --tag K:V      only jobs tagged K=V (or carrying tag K)\n"
     "  --limit N      show at most N jobs (default 20)\n"
     "  --all          show every job (follows the pages)\n"
     "  --page-size N  jobs per request (1-500, default 500)\n"},
    {"describe", cli_cmd_describe, "ID",
     "show a job: state, progress and ETA, metrics, workers, events",
     "  ID may be a unique prefix of the id (the short id `kiln jobs` shows) or a unique job name\n"},
    {"logs", cli_cmd_logs, "[-f] [--rank N] [--since T] ID",
     "print a job's logs; -f follows them live until the job ends",
     "  -f, --follow   stream new lines until the job ends (reconnects if the connection drops)\n"
     "  --rank N       only rank N\n"
     "  --since T      only lines since T (RFC 3339 time, Unix seconds, or an age: 30s, 5m, 2h, 1d)\n"
     "  --limit N      without -f: at most N lines (default: all)\n"},
    {"metrics", cli_cmd_metrics, "ID [--name N] [--raw]",
     "summarise a job's metrics (points, last, min, max, trend)",
     "  --name N       only metric N\n"
     "  --raw          print step,value rows instead of the summary\n"
     "  --points N     at most N points per series (default 1000; kilnd downsamples)\n"},
    {"stop", cli_cmd_stop, "ID [--reason R]",
     "stop a job (its ranks get SIGTERM, checkpoint and exit)",
     "  --reason R     recorded in the job's events\n"},
    {"workers", cli_cmd_workers, "", "list registered workers (agents) and their free slots", ""},
    {"version", cli_cmd_version, "", "print the client version and the server's health", ""},
};

void cli_print_help(FILE *out, const char *cmd)
{
    for (size_t i = 0; cmd && i < KILN_ARRAY_LEN(cli_commands); i++) {
        const cli_command_t *c = &cli_commands[i];
        if (strcmp(c->name, cmd) != 0)
            continue;
        fprintf(out, "usage: kiln %s %s\n\n%s\n", c->name, c->usage, c->summary);
        if (*c->help)
            fprintf(out, "\noptions:\n%s", c->help);
        fprintf(out, "\nglobal options: --url URL (default $KILN_URL or %s), --json (raw API replies)\n",
                CLI_DEFAULT_URL);
        return;
    }
    fprintf(out, "kiln - command-line client for kilnd, the kiln training service\n\n"
                 "usage: kiln [--url URL] [--json] COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < KILN_ARRAY_LEN(cli_commands); i++)
        fprintf(out, "  %-9s %s\n", cli_commands[i].name, cli_commands[i].summary);
    fprintf(out, "  %-9s %s\n", "help", "show this text, or a command's (kiln help logs)");
    fprintf(out, "\nglobal options:\n"
                 "  --url URL   kilnd's REST address (default $KILN_URL, else %s)\n"
                 "  --json      print the API's JSON replies instead of tables\n"
                 "\nexit status: 0 ok, 1 error (the API's message goes to stderr), 2 usage error\n",
            CLI_DEFAULT_URL);
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "kiln%s%s: ", cmd ? " " : "", cmd ? cmd : "");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    for (size_t i = 0; cmd && i < KILN_ARRAY_LEN(cli_commands); i++)
        if (!strcmp(cli_commands[i].name, cmd))
            fprintf(stderr, "usage: kiln %s %s\n", cmd, cli_commands[i].usage);
    fprintf(stderr, "(kiln help%s%s for more)\n", cmd ? " " : "", cmd ? cmd : "");
    return CLI_EXIT_USAGE;
}

int cli_opt(const char *cmd, int argc, char **argv, int *i, const char *lng, const char *shrt,
            const char **val)
{
    const char *a = argv[*i];
    size_t ll = strlen(lng);
    if (!strncmp(a, lng, ll) && a[ll] == '=') {
        *val = a + ll + 1;
        return 1;
    }
    if (strcmp(a, lng) != 0 && (!shrt || strcmp(a, shrt) != 0))
        return 0;
    if (*i + 1 >= argc) {
        cli_usage_error(cmd, "%s needs a value", a);
        return -1;
    }
    *val = argv[++*i];
    return 1;
}

bool cli_parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

int cli_main(int argc, char **argv)
{
    const char *url = NULL;
    bool json = false;
    int rc = CLI_EXIT_OK;
    char **args = calloc((size_t)argc + 1, sizeof(char *));
    int nargs = 0;
    if (!args) {
        fprintf(stderr, "error: out of memory\n");
        return CLI_EXIT_ERROR;
    }
    /* Global options may come before or after the command (until "--"). */
    bool dashdash = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!dashdash && !strcmp(a, "--")) {
            dashdash = true;
            args[nargs++] = argv[i];
        } else if (!dashdash && !strcmp(a, "--url")) {
            if (i + 1 >= argc) {
                rc = cli_usage_error(NULL, "--url needs a value");
                goto done;
            }
            url = argv[++i];
        } else if (!dashdash && !strncmp(a, "--url=", 6)) {
            url = a + 6;
        } else if (!dashdash && !strcmp(a, "--json")) {
            json = true;
        } else {
            args[nargs++] = argv[i];
        }
    }
    if (nargs == 0) {
        cli_print_help(stderr, NULL);
        rc = CLI_EXIT_USAGE;
        goto done;
    }
    const char *cmd = args[0];
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        cli_print_help(stdout, nargs > 1 ? args[1] : NULL);
        goto done;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V"))
        cmd = "version";
    const cli_command_t *found = NULL;
    for (size_t i = 0; i < KILN_ARRAY_LEN(cli_commands); i++)
        if (!strcmp(cli_commands[i].name, cmd))
            found = &cli_commands[i];
    if (!found) {
        rc = cli_usage_error(NULL, "unknown command \"%s\"", cmd);
        goto done;
    }
    for (int i = 1; i < nargs; i++) {
        if (!strcmp(args[i], "--"))
            break;
        if (!strcmp(args[i], "--help") || !strcmp(args[i], "-h")) {
            cli_print_help(stdout, found->name);
            goto done;
        }
    }
    cli_client_t client;
    cli_client_init(&client, url);
    client.json = json;
    rc = found->run(&client, nargs, args);

done:
    free(args);
    fflush(stdout);
    return rc;
}
