/* cli.c - `kiln`'s entry point: global options (--url, --tls-ca, --profile, --token-file,
 * --json), subcommand dispatch, help texts and the small argument helpers the subcommands share.
 * The subcommands themselves live in cmd_jobs.c, cmd_logs.c, cmd_info.c, cmd_identity.c and
 * cmd_login.c; where kilnd is and which token to send is config.c's. */
#include "cli/cli_int.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef struct cli_command {
    const char *name;
    int (*run)(cli_client_t *c, int argc, char **argv);
    const char *usage;    /* arguments after the name; one line per form */
    const char *summary;
    const char *help;     /* what follows the summary: option or subcommand lines */
} cli_command_t;

static const cli_command_t cli_commands[] = {
    {"submit", cli_cmd_submit, "JOB.json [--idempotency-key K] [-f|--follow]",
     "submit a training job (JOB.json, or - for stdin) and print its id",
     "options:\n"
     "  --idempotency-key K  retrying with the same key returns the same job, never a duplicate\n"
     "  -f, --follow         stream the job's logs until it ends; exit 1 if it FAILED\n"
     "  (a relative data.train / data.val path that exists here is sent as an absolute path)\n"},
    {"jobs", cli_cmd_jobs, "[--status S] [--tag K:V] [--limit N] [--all]",
     "list jobs, newest first (those of the projects you belong to)",
     "options:\n"
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
     "options:\n"
     "  -f, --follow   stream new lines until the job ends (reconnects if the connection drops)\n"
     "  --rank N       only rank N\n"
     "  --since T      only lines since T (RFC 3339 time, Unix seconds, or an age: 30s, 5m, 2h, 1d)\n"
     "  --limit N      without -f: at most N lines (default: all)\n"},
    {"metrics", cli_cmd_metrics, "ID [--name N] [--raw]",
     "summarise a job's metrics (points, last, min, max, trend)",
     "options:\n"
     "  --name N       only metric N\n"
     "  --raw          print step,value rows instead of the summary\n"
     "  --points N     at most N points per series (default 1000; kilnd downsamples)\n"},
    {"stop", cli_cmd_stop, "ID [--reason R]",
     "stop a job (its ranks get SIGTERM, checkpoint and exit)",
     "options:\n"
     "  --reason R     recorded in the job's events\n"},
    {"workers", cli_cmd_workers, "", "list registered workers (agents) and their free slots", ""},
    {"login", cli_cmd_login, "[--url URL] [--tls-ca FILE] [--profile NAME] [--token-file FILE]",
     "check an API token with kilnd and save it for later commands",
     "  Reads the token from stdin (typing is not shown on a terminal), or from --token-file FILE,\n"
     "  asks kilnd who it belongs to (GET /v1/whoami), then saves the URL, the token and the CA\n"
     "  file as a profile (--profile NAME, default: the current one, else \"default\") in\n"
     "  $XDG_CONFIG_HOME/kiln/config.json (default ~/.config/kiln/config.json, mode 0600), and\n"
     "  makes it the current profile. Later commands use it when no --url, --token-file,\n"
     "  --tls-ca or KILN_URL, KILN_TOKEN, KILN_TLS_CA say otherwise; a profile's token is sent\n"
     "  only to the URL it was saved for.\n"
     "  An admin gives you a token with `kiln tokens create YOU`; the first admin's token is in\n"
     "  the file kilnd's --bootstrap-token-file names:\n"
     "    kiln login --url https://kilnd:8080 --tls-ca ca.pem < admin.token\n"},
    {"logout", cli_cmd_logout, "[--profile NAME] [--revoke]",
     "remove the saved token of a profile (the current one by default)",
     "options:\n"
     "  --revoke       first revoke the token on kilnd, so that no copy of it works any more\n"
     "  (the profile keeps its URL and CA; kiln login saves a new token)\n"},
    {"whoami", cli_cmd_whoami, "", "show who kilnd knows you as, your token and your projects", ""},
    {"users", cli_cmd_users, "[list]\ncreate NAME [--cluster-admin]",
     "list users, or create one (cluster admins only)",
     "commands:\n"
     "  list                 every user (the default)\n"
     "  create NAME          a new user; give it a token with `kiln tokens create NAME`\n"
     "    --cluster-admin    the user manages users, projects and workers and sees every project\n"},
    {"tokens", cli_cmd_tokens,
     "[list] [--user U]\ncreate [USER] [--expires-in D] [--description TEXT]\nrevoke ID",
     "list, create and revoke API tokens",
     "commands:\n"
     "  list                 your tokens, or those of --user U (cluster admins), with their state\n"
     "  create [USER]        a new token for USER (default: you), printed once on stdout alone\n"
     "    --expires-in D     how long it is valid: 3600s, 90m, 12h, 30d (default: until revoked)\n"
     "    --description TEXT what it is for (shown by `kiln tokens`)\n"
     "  revoke ID            revoke a token (ID as `kiln tokens` shows it); it stops working at once\n"},
    {"projects", cli_cmd_projects,
     "[list]\ncreate NAME\nmembers PROJECT\nadd-member PROJECT USER viewer|editor|admin\n"
     "remove-member PROJECT USER",
     "list your projects and roles; create projects; manage their members",
     "commands:\n"
     "  list                 the projects you belong to, with your role (a cluster admin: all)\n"
     "  create NAME          a new project (cluster admins); jobs name it in their \"project\"\n"
     "  members PROJECT      who belongs to PROJECT, with their roles\n"
     "  add-member PROJECT USER ROLE\n"
     "                       give USER a role in PROJECT (or change it); project admins:\n"
     "                       viewer reads jobs, logs and metrics; editor also submits and stops\n"
     "                       jobs; admin also manages the members\n"
     "  remove-member PROJECT USER\n"
     "                       take USER out of PROJECT\n"},
    {"ui", cli_cmd_ui, "[--print]",
     "open kiln's web UI in your browser, already logged in",
     "  asks kilnd for a one-time login link (POST /v1/login-links) and opens it with xdg-open\n"
     "  ($KILN_BROWSER names another program); without a display, or with --print, prints it.\n"
     "  The link works once, for 2 minutes; the browser trades it for a token of its own that\n"
     "  lasts 12 hours at most, never longer than yours, and is revoked when you log out there.\n"
     "  The code is in the URL's fragment, which browsers never send to a server.\n"},
    {"version", cli_cmd_version, "", "print the client version and the server's health", ""},
};

static const char cli_global_help[] =
    "global options (before or after the command):\n"
    "  --url URL          kilnd's REST address (default $KILN_URL, then the profile's, else\n"
    "                     " CLI_DEFAULT_URL ")\n"
    "  --tls-ca FILE      CA certificate to verify an https kilnd (default $KILN_TLS_CA, then the\n"
    "                     profile's, else the system's CAs)\n"
    "  --token-file FILE  read the API token from FILE (default $KILN_TOKEN, then the profile's);\n"
    "                     a token is never given as an argument, where other users could see it\n"
    "  --profile NAME     use this saved login (default $KILN_PROFILE, then the current one)\n"
    "  --json             print the API's JSON replies instead of tables\n";

static void cli_print_usage_lines(FILE *out, const char *prefix, const cli_command_t *c)
{
    const char *u = c->usage;
    bool first = true;
    do {
        size_t len = strcspn(u, "\n");
        fprintf(out, "%s kiln %s%s%.*s\n", first ? prefix : "      ", c->name, len ? " " : "", (int)len, u);
        first = false;
        u += len;
    } while (*u++ == '\n');
}

void cli_print_help(FILE *out, const char *cmd)
{
    for (size_t i = 0; cmd && i < KILN_ARRAY_LEN(cli_commands); i++) {
        const cli_command_t *c = &cli_commands[i];
        if (strcmp(c->name, cmd) != 0)
            continue;
        cli_print_usage_lines(out, "usage:", c);
        fprintf(out, "\n%s\n", c->summary);
        if (*c->help)
            fprintf(out, "\n%s", c->help);
        fprintf(out, "\n%s", cli_global_help);
        return;
    }
    fprintf(out, "kiln - command-line client for kilnd, the kiln training service\n\n"
                 "usage: kiln [global options] COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < KILN_ARRAY_LEN(cli_commands); i++)
        fprintf(out, "  %-9s %s\n", cli_commands[i].name, cli_commands[i].summary);
    fprintf(out, "  %-9s %s\n", "help", "show this text, or a command's (kiln help tokens)");
    fprintf(out, "\n%s", cli_global_help);
    fprintf(out, "\nexit status: 0 ok, 1 error (the API's message goes to stderr), 2 usage error\n");
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
            cli_print_usage_lines(stderr, "usage:", &cli_commands[i]);
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

int cli_fail(const cli_client_t *c, const kiln_err_t *err)
{
    cli_print_error(stderr, err);
    if (err->status == KILN_EUNAUTH)
        cli_print_auth_note(stderr, &c->settings);
    return CLI_EXIT_ERROR;
}

void cli_print_json(const json_t *j)
{
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
    if (s) {
        puts(s);
        free(s);
    }
}

int cli_parse_globals(int argc, char **argv, cli_globals_t *g, char **args, int *nargs)
{
    static const struct {
        const char *name;
        size_t offset;
    } valued[] = {
        {"--url", offsetof(cli_globals_t, url)},
        {"--tls-ca", offsetof(cli_globals_t, tls_ca)},
        {"--profile", offsetof(cli_globals_t, profile)},
        {"--token-file", offsetof(cli_globals_t, token_file)},
    };
    memset(g, 0, sizeof(*g));
    *nargs = 0;
    bool dashdash = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (dashdash || a[0] != '-' || a[1] != '-') {
            args[(*nargs)++] = argv[i];
            continue;
        }
        if (!strcmp(a, "--")) {
            dashdash = true;
            args[(*nargs)++] = argv[i];
            continue;
        }
        if (!strcmp(a, "--json")) {
            g->json = true;
            continue;
        }
        if (!strcmp(a, "--token") || !strncmp(a, "--token=", 8)) {
            cli_usage_error(NULL, "kiln takes no --token: other users can read a program's arguments");
            fprintf(stderr, "hint: kiln login saves a token (read from stdin); or use --token-file FILE or "
                            "KILN_TOKEN\n");
            return CLI_EXIT_USAGE;
        }
        bool matched = false;
        for (size_t k = 0; k < KILN_ARRAY_LEN(valued) && !matched; k++) {
            const char **slot = (const char **)(void *)((char *)g + valued[k].offset);
            int m = cli_opt(NULL, argc, argv, &i, valued[k].name, NULL, slot);
            if (m < 0)
                return CLI_EXIT_USAGE;
            if (m > 0 && !**slot)
                return cli_usage_error(NULL, "%s needs a value", valued[k].name);
            matched = m > 0;
        }
        if (!matched)
            args[(*nargs)++] = argv[i];
    }
    return 0;
}

int cli_main(int argc, char **argv)
{
    int rc = CLI_EXIT_OK;
    char **args = calloc((size_t)argc + 1, sizeof(char *));
    int nargs = 0;
    cli_globals_t g;
    if (!args) {
        fprintf(stderr, "error: out of memory\n");
        return CLI_EXIT_ERROR;
    }
    rc = cli_parse_globals(argc, argv, &g, args, &nargs);
    if (rc)
        goto done;
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
    cli_settings_t settings;
    kiln_err_t err;
    kiln_err_clear(&err);
    if (cli_settings_resolve(&g, &settings, &err) != 0) {
        cli_print_error(stderr, &err);
        rc = CLI_EXIT_ERROR;
        goto done;
    }
    /* A profile asked for by name must exist, except for kiln login, which creates it. */
    if (settings.profile_chosen && !settings.profile_exists && found->run != cli_cmd_login) {
        kiln_err_set(&err, KILN_ENOTFOUND, NULL, "no profile \"%s\" in %s", settings.profile, settings.config_path);
        kiln_err_hint(&err, "kiln login --profile %s saves one", settings.profile);
        cli_print_error(stderr, &err);
        rc = CLI_EXIT_ERROR;
        goto done;
    }
    cli_client_t client;
    cli_client_init(&client, &settings);
    client.json = g.json;
    rc = found->run(&client, nargs, args);
    memset(&client, 0, sizeof(client));
    memset(&settings, 0, sizeof(settings));

done:
    free(args);
    fflush(stdout);
    return rc;
}
