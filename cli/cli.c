/* cli.c - `kiln`'s entry point: global options (--url, --tls-ca, --profile, --token-file,
 * --json), subcommand dispatch, help texts and the small argument helpers the subcommands share.
 * The subcommands themselves live in cmd_jobs.c, cmd_search.c, cmd_logs.c, cmd_info.c, cmd_artifacts.c,
 * cmd_identity.c and cmd_login.c; where kilnd is and which token to send is config.c's. */
#include "cli/cli_int.h"

#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct cli_command {
    const char *name;
    int (*run)(cli_client_t *c, int argc, char **argv);
    const char *usage;    /* arguments after the name; one line per form */
    const char *summary;
    const char *help;     /* what follows the summary: option or subcommand lines */
} cli_command_t;

static const cli_command_t cli_commands[] = {
    {"submit", cli_cmd_submit, "JOB.json [--source-dir DIR] [--idempotency-key K] [-f|--follow]",
     "submit a training job (JOB.json, or - for stdin) and print its id",
     "options:\n"
     "  --source-dir DIR     a script job's code: pack DIR (honouring DIR/.kilnignore), upload it into\n"
     "                       the job's project (as kiln code push does) and submit with \"source\" set\n"
     "  --idempotency-key K  retrying with the same key returns the same job, never a duplicate\n"
     "  -f, --follow         stream the job's logs until it ends; exit 1 if it FAILED\n"
     "  (a relative data.train / data.val / data.channels path that exists here is sent as an\n"
     "  absolute path)\n"},
    {"code", cli_cmd_code, "push DIR [--project P]\nget DIGEST [--project P] [-o FILE]",
     "upload a source directory as a script job's code, or download an uploaded archive",
     "commands:\n"
     "  push DIR             pack DIR into a gzip'd tar, leaving out what DIR/.kilnignore names\n"
     "                       (gitignore's syntax: patterns, !negation, /anchoring, **, dir/; .git/ is\n"
     "                       left out unless a line says !.git/), upload it and print the source a\n"
     "                       script job names: code:sha256:<digest>. The same tree packs to the same\n"
     "                       bytes, and kilnd keeps them once\n"
     "  get DIGEST           download the archive (DIGEST or code:sha256:DIGEST), checked against its\n"
     "                       SHA-256, to DIGEST.tgz or -o FILE (- for stdout)\n"
     "options:\n"
     "  --project P, -p P    the project the code is for (default: default); only its members see it\n"},
    {"jobs", cli_cmd_jobs, "[--status S] [--tag K:V] [--limit N] [--all]",
     "list jobs, newest first (those of the projects you belong to)",
     "options:\n"
     "  --status S     only jobs in these states (comma-separated: RUNNING,QUEUED)\n"
     "  --tag K:V      only jobs tagged K=V (or carrying tag K)\n"
     "  --limit N      show at most N jobs (default 20)\n"
     "  --all          show every job (follows the pages)\n"
     "  --page-size N  jobs per request (1-" KILN_PAGE_SIZE_MAX_TEXT ", default " KILN_PAGE_SIZE_MAX_TEXT ")\n"},
    {"search", cli_cmd_search, "['FILTER'] [--columns C,...] [--order-by 'FIELD [asc|desc],...'] [--limit N] [--all]",
     "find jobs with the filter language (the projects you belong to)",
     "  FILTER is one line (quote it): fields id, name, project, queue, state, priority, attempt,\n"
     "  created, started, ended, duration, progress, tags.KEY, hp.NAME, model.FIELD, resources.FIELD,\n"
     "  metrics.NAME.min|max|last|count; operators = != < <= > >= ~ (substring) !~ IN (...) EXISTS;\n"
     "  AND, OR, NOT and parentheses; values 3e-4, \"text\", words, 90s, 2h, 2026-11-01, -7d, now.\n"
     "    kiln search 'hp.lr < 1e-3 AND (metrics.val_loss.min < 1.6 OR tags.team = \"nlp\")' \\\n"
     "      --columns hp.lr,metrics.val_loss.min --order-by metrics.val_loss.min\n"
     "options:\n"
     "  --columns C    hp.NAME, hp.*, metrics.NAME.min|max|last|count, metrics.NAME, metrics.*\n"
     "  --order-by O   FIELD [asc|desc], comma-separated (default: newest first); jobs without a\n"
     "                 value for a key come after those with one\n"
     "  --limit N      show at most N jobs (default 50)\n"
     "  --all          show every match (follows the pages)\n"
     "  --page-size N  jobs per request (1-" KILN_PAGE_SIZE_MAX_TEXT ", default " KILN_PAGE_SIZE_MAX_TEXT ")\n"
     "  -o wide        whole ids, project, queue and submitter before the columns; -o json|yaml\n"
     "                 prints kilnd's reply\n"
     "  (docs/search.md describes the language)\n"},
    {"compare", cli_cmd_compare, "ID ID... [--metric NAME]... [--points N] [--width W] [--height H]",
     "compare jobs side by side: spec fields (differences marked), metric summaries, curves",
     "  Each ID may be a unique id prefix or a unique job name; up to 9 jobs.\n"
     "options:\n"
     "  --metric NAME  a metric to summarise and chart (repeatable; default: train_loss and\n"
     "                 val_loss, or the first metric the jobs have; the table then shows all)\n"
     "  --points N     points per curve kilnd keeps when it downsamples (default 120; each\n"
     "                 bucket's lowest and highest point survive)\n"
     "  --width W, --height H   the chart's size in characters (default 64 x 10)\n"
     "  -o json|yaml   the jobs, differing fields, summaries and curves as data\n"},
    {"describe", cli_cmd_describe, "ID",
     "show a job: state, progress and ETA, metrics, workers, events",
     "  ID may be a unique prefix of the id (the short id `kiln jobs` shows) or a unique job name\n"},
    {"logs", cli_cmd_logs, "[-f] [--rank N] [--since T] [--limit N] ID",
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
    {"artifacts", cli_cmd_artifacts, "ID [--get NAME [-o FILE] | --checkpoints]",
     "list a job's artifacts (its output directory: final model, plan, samples), or download one",
     "options:\n"
     "  --get NAME, -g NAME   download artifact NAME (model_llmc.bin is the final model, llm.c format);\n"
     "                        its SHA-256 is checked against kilnd's, and a failed download leaves no file\n"
     "  -o FILE, --output FILE\n"
     "                        where to save it (default: NAME in the current directory; - for stdout;\n"
     "                        a file named like an output format needs a path: ./json)\n"
     "  --checkpoints         list the job's checkpoint directory as kilnd last synced it (a job without\n"
     "                        checkpoint.path: its next attempt finds that state restored, on any agent)\n"
     "  -o wide               the list with exact sizes and whole SHA-256s; -o json|yaml: kilnd's reply\n"
     "  A job's artifacts are uploaded by its agent when it ends. Start a new job from one's model with\n"
     "  \"model\": {\"init_from\": \"job:ID\"} in its spec.\n"},
    {"delete", cli_cmd_delete, "ID",
     "delete an ended job with its events, logs, metrics and artifacts (editors)",
     "  Only a job that has ended can be deleted, one in an end state:" KILN_JOB_STATE_ENDED_WORDS ".\n"
     "  Stop a running one first. A job whose model another unfinished job starts from\n"
     "  (model.init_from) is kept.\n"},
    {"workers", cli_cmd_workers, "[list]\napprove ID\nremove ID [--ban [--reason TEXT]]\nbans\nunban BAN",
     "list registered workers (agents); approve, remove and ban them (cluster admins)",
     "commands:\n"
     "  list                 every worker: its slots, state (PENDING: waits for approval), when and\n"
     "                       with which join token it registered (\"file\": kilnd's --join-token-file);\n"
     "                       -o wide adds where it registered from, the SHA-256 of its client\n"
     "                       certificate (mutual TLS), cores, version, GPUs and data roots\n"
     "  approve ID           let a PENDING worker (kilnd --agent-approval) take work; check its\n"
     "                       data roots and slots first (kiln workers -o wide)\n"
     "  remove ID            take a worker out: what it runs is lost and re-queued, its credential\n"
     "                       stops working; its agent may register again as a new worker\n"
     "    --ban              and ban its worker id and its certificate from registering again\n"
     "    --reason TEXT      recorded with the ban\n"
     "  bans                 the bans, with their numbers\n"
     "  unban BAN            lift ban number BAN\n"},
    {"join-tokens", cli_cmd_join_tokens, "[list]\ncreate [--uses N] [--expires-in D] [--description TEXT]\nrevoke ID",
     "list, create and revoke join tokens agents register with (cluster admins)",
     "commands:\n"
     "  list                 the join tokens: uses left, registrations made, expiry, who made them\n"
     "  create               a new join token, printed once on stdout alone (save it to the file an\n"
     "                       agent's --join-token-file names)\n"
     "    --uses N           registrations it allows (default 1: single-use)\n"
     "    --expires-in D     how long it is valid: 90s, 30m, 12h, 7d (default 24h, at most 365d)\n"
     "    --description TEXT what it is for\n"
     "  revoke ID            it stops registering workers at once (those it registered stay)\n"
     "  An agent re-registering under its own worker id uses its credential, not a join token.\n"},
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
     "  --revoke       first revoke the token on kilnd, so that no copy of it works any more, and\n"
     "                 with it every token made with it (`kiln tokens` shows them as PARENT)\n"
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
     "  list                 your tokens, or those of --user U (cluster admins), with their state,\n"
     "                       who made each and with which token (PARENT)\n"
     "  create [USER]        a new token for USER (default: you), printed once on stdout alone; it is\n"
     "                       made with your token, never outlives it and is revoked with it\n"
     "    --expires-in D     how long it is valid: 3600s, 90m, 12h, 30d (default: until revoked, or\n"
     "                       until your token expires when it does)\n"
     "    --description TEXT what it is for (shown by `kiln tokens`)\n"
     "  revoke ID            revoke a token (ID as `kiln tokens` shows it) and every token made with\n"
     "                       it; they stop working at once\n"
     "A web UI session token (from `kiln ui`) makes no tokens: create them from a `kiln login`.\n"},
    {"projects", cli_cmd_projects,
     "[list]\ncreate NAME [--default-queue QUEUE]\nupdate PROJECT --default-queue QUEUE\nmembers PROJECT\n"
     "add-member PROJECT USER " KILN_NAME_CHOICES(KILN_PROJECT_ROLES) "\nremove-member PROJECT USER",
     "list your projects and roles; create projects; manage their members",
     "commands:\n"
     "  list                 the projects you belong to, with your role and default queue (a\n"
     "                       cluster admin: all)\n"
     "  create NAME          a new project (cluster admins); jobs name it in their \"project\"\n"
     "  update PROJECT       change the project (its admins, cluster admins)\n"
     "  members PROJECT      who belongs to PROJECT, with their roles\n"
     "  add-member PROJECT USER ROLE\n"
     "                       give USER a role in PROJECT (or change it); project admins:\n"
     "                       viewer reads jobs, logs and metrics; editor also submits and stops\n"
     "                       jobs; admin also manages the members\n"
     "  remove-member PROJECT USER\n"
     "                       take USER out of PROJECT\n"
     "options of create and update:\n"
     "  --default-queue QUEUE\n"
     "                       the queue the project's jobs that name no queue go to (default:\n"
     "                       default, the cluster's own); a queue that is some project's default\n"
     "                       cannot be deleted, nor leave that project out of its --projects\n"},
    {"queues", cli_cmd_queues,
     "[list]\ndescribe NAME\ncreate NAME --quota cpu=N,gpu=N [options]\nupdate NAME [options]\ndelete NAME",
     "list the queues jobs wait in, with quotas and usage; manage them (cluster admins)",
     "commands:\n"
     "  list                 every queue: cohort, quota, slots in use, jobs waiting\n"
     "  describe NAME        one queue with its limits, weight and projects (those you can see:\n"
     "                       your own, unless you are a cluster admin)\n"
     "  create NAME          a new queue (a job names it in its \"queue\")\n"
     "  update NAME          change the options given\n"
     "  delete NAME          delete a queue none of whose jobs waits or runs\n"
     "options of create and update:\n"
     "  --quota cpu=N,gpu=N  nominal quota per slot type (a missing one is 0; none: no limit)\n"
     "  --cohort NAME        queues of a cohort lend each other unused quota (none: no cohort)\n"
     "  --borrowing-limit cpu=N,gpu=N\n"
     "                       the most it borrows above its quota (a missing one: unlimited)\n"
     "  --lending-limit cpu=N,gpu=N\n"
     "                       the most of its unused quota it lends (the rest it keeps)\n"
     "  --weight W           its fair-sharing weight against the cohort's other queues\n"
     "  --projects A,B       the projects that may submit to it (*: every project); it keeps\n"
     "                       those whose default queue it is (kiln projects list shows them)\n"
     "                       and those with jobs waiting, running or paused in it\n"
     "  --fair-sharing true|false\n"
     "                       order its jobs by their project's recent usage\n"
     "  --preempt-within-queue " KILN_NAME_CHOICES(KILN_WITHIN_QUEUE_POLICIES) "\n"
     "                       which of its own jobs a job of it within its quota may preempt:\n"
     "                       lower-priority ones or none (default: "
     KILN_NAME_DEFAULT(KILN_WITHIN_QUEUE_POLICIES) ")\n"
     "  --reclaim-within-cohort " KILN_NAME_CHOICES(KILN_RECLAIM_WITHIN_COHORT_POLICIES) "\n"
     "                       which jobs of its cohort's queues that borrow beyond their quota a\n"
     "                       job of it within its quota may preempt (default: "
     KILN_NAME_DEFAULT(KILN_RECLAIM_WITHIN_COHORT_POLICIES) ")\n"},
    {"tune", cli_cmd_tune, "[list [--limit N] [--page-size N]]\nsubmit FILE [--source-dir DIR]\ndescribe ID\nstop ID",
     "hyperparameter tuning: searches whose trials are ordinary jobs",
     "commands:\n"
     "  list                 the tuning jobs you can see, newest first, every one (it follows the\n"
     "                       pages): state, strategy, trials, objective\n"
     "    --limit N          only the newest N\n"
     "    --page-size N      tuning jobs per request (1-" KILN_PAGE_SIZE_MAX_TEXT ", default " KILN_PAGE_SIZE_MAX_TEXT ")\n"
     "  submit FILE          start one from a JSON request (- reads standard input): the base job\n"
     "                       as \"job\", \"parameters\" by path in it (a bare name is\n"
     "                       hyperparameters.NAME), \"objective\", \"strategy\", \"max_jobs\", ...\n"
     "                       (docs/contracts.md, \"Tuning jobs\"); a relative data.train, data.val or\n"
     "                       data.channels path of the base job that exists here is sent as an\n"
     "                       absolute path\n"
     "    --source-dir DIR   a script base job's code: pack DIR (honouring DIR/.kilnignore), upload it\n"
     "                       into the job's project and submit with the job's \"source\" set\n"
     "  describe ID          the tuning job, its trials table and the best trial\n"
     "  stop ID              stop it and its trials\n"
     "  ID may be the whole id, a unique prefix of it (4 characters or more) or a unique name.\n"},
    {"ui", cli_cmd_ui, "[--print]",
     "open kiln's web UI in your browser, already logged in",
     "  asks kilnd for a one-time login link (POST /v1/login-links) and opens it with xdg-open\n"
     "  ($KILN_BROWSER names another program); without a display, or with --print, prints it.\n"
     "  The link works once, for 2 minutes; the browser trades it for a token of its own that\n"
     "  lasts 12 hours at most, never longer than yours, and is revoked when you log out there.\n"
     "  The code is in the URL's fragment, which browsers never send to a server.\n"},
    {"config", cli_cmd_config, "get-profiles\nuse-profile NAME",
     "list the saved logins (profiles) and choose the current one",
     "commands:\n"
     "  get-profiles         every profile of the config file: its URL, whether it holds a token (never\n"
     "                       the token), the current one marked *; -o json prints them as data\n"
     "  use-profile NAME     make NAME the current profile, used when neither --profile nor\n"
     "                       KILN_PROFILE names another (kiln login --profile NAME saves one)\n"},
    {"version", cli_cmd_version, "", "print kiln's and kilnd's versions (exit 6 when kilnd cannot be reached)", ""},
    {"completion", cli_cmd_completion, "bash|zsh|fish", "print a shell completion script",
     "  bash:  source <(kiln completion bash)         (or save it in /etc/bash_completion.d/kiln)\n"
     "  zsh:   source <(kiln completion zsh)          (after compinit; or save it as _kiln in $fpath)\n"
     "  fish:  kiln completion fish | source          (or save it in ~/.config/fish/completions/kiln.fish)\n"},
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
    "  -o, --output FMT   table (default), wide (more columns), json or yaml (the API's replies),\n"
    "                     or name (a list's ids or names, one a line: jobs, search, workers,\n"
    "                     queues, projects, users, tokens, artifacts, tune list)\n"
    "  --json             the same as -o json\n"
    "  --no-headers       tables without their heading line\n";

/* What each exit status means (the overview's help and the README say the same). */
static const char cli_exit_help[] =
    "exit status:\n"
    "  0  ok\n"
    "  1  error: input kilnd refused, a server error, an unreadable config file, a followed job\n"
    "     that FAILED\n"
    "  2  usage: the command line is wrong\n"
    "  3  not found: no such job, worker, queue, user, profile, file, ... (HTTP 404)\n"
    "  4  unauthenticated or forbidden: no valid token, or not allowed (HTTP 401, 403)\n"
    "  5  conflict or wrong state: it already exists, or the job is not in a state that allows it\n"
    "     (HTTP 409)\n"
    "  6  unreachable or unavailable: no answer from kilnd, it is not ready or asks to wait (HTTP\n"
    "     429, 502, 503, 504): trying again later may work\n"
    "  (the API's message goes to stderr)\n";

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
        fprintf(out, "\n%s", cli_exit_help);
        return;
    }
    fprintf(out, "kiln - command-line client for kilnd, the kiln training service\n\n"
                 "usage: kiln [global options] COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < KILN_ARRAY_LEN(cli_commands); i++)
        fprintf(out, "  %-9s %s\n", cli_commands[i].name, cli_commands[i].summary);
    fprintf(out, "  %-9s %s\n", "help", "show this text, or a command's (kiln help tokens)");
    fprintf(out, "\n%s", cli_global_help);
    fprintf(out, "\n%s", cli_exit_help);
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

int cli_paging_opt(const char *cmd, int argc, char **argv, int *i, long *limit, long *page_size, bool *all)
{
    const char *v;
    int m;
    if (!strcmp(argv[*i], "--all") || !strcmp(argv[*i], "-a")) {
        *all = true;
        return 1;
    }
    if ((m = cli_opt(cmd, argc, argv, i, "--limit", "-n", &v)) != 0) {
        if (m < 0)
            return -1;
        if (!cli_parse_int(v, 1, CLI_LIMIT_MAX, limit)) {
            cli_usage_error(cmd, "--limit must be between 1 and %d (got \"%s\")", CLI_LIMIT_MAX, v);
            return -1;
        }
        return 1;
    }
    if ((m = cli_opt(cmd, argc, argv, i, "--page-size", NULL, &v)) != 0) {
        if (m < 0)
            return -1;
        if (!cli_parse_int(v, 1, KILN_PAGE_SIZE_MAX, page_size)) {
            cli_usage_error(cmd, "--page-size must be between 1 and %d (got \"%s\")", KILN_PAGE_SIZE_MAX, v);
            return -1;
        }
        return 1;
    }
    return 0;
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

int cli_exit_code(int st)
{
    switch (st) {
    case KILN_OK: return CLI_EXIT_OK;
    case KILN_ENOTFOUND: return CLI_EXIT_NOT_FOUND;
    case KILN_EUNAUTH:
    case KILN_EPERM: return CLI_EXIT_AUTH;
    case KILN_EEXIST:
    case KILN_ESTATE:
    case KILN_EREUSED: return CLI_EXIT_CONFLICT;
    case KILN_EUNAVAIL:
    case KILN_EDB:
    case KILN_ECOMM:
    case KILN_ELIMIT:
    case KILN_ETIMEDOUT: return CLI_EXIT_UNAVAILABLE;
    default: return CLI_EXIT_ERROR;
    }
}

int cli_fail(const cli_client_t *c, const kiln_err_t *err)
{
    cli_print_error(stderr, err);
    if (err->status == KILN_EUNAUTH)
        cli_print_auth_note(stderr, &c->settings);
    return cli_exit_code(err->status);
}

bool cli_print_names(const cli_client_t *c, const json_t *items, const char *key)
{
    if (c->output != CLI_OUT_NAME)
        return false;
    size_t i;
    json_t *it;
    json_array_foreach(items, i, it)
        printf("%s\n", cli_jstr(it, key));
    return true;
}

bool cli_output_parse(const char *s, cli_output_t *out)
{
    static const char *const names[] = {"table", "wide", "json", "yaml", "name"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(names); i++)
        if (!strcmp(s, names[i])) {
            *out = (cli_output_t)i;
            return true;
        }
    return false;
}

void cli_secret_forget(json_t *reply, const char *key)
{
    json_t *v = json_object_get(reply, key);
    if (json_is_string(v))
        memset((char *)json_string_value(v), 0, json_string_length(v));
}

void cli_print_out(const cli_client_t *c, const json_t *j)
{
    if (c->output == CLI_OUT_YAML) {
        cli_print_yaml(stdout, j);
        return;
    }
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
        /* -o FORMAT, -oFORMAT, --output FORMAT, --output=FORMAT (kubectl's spellings). A value
         * that is no format stays with the command (one may take -o FILE); cli_main checks. */
        const char *v = NULL;
        int skip = 0;
        if (!dashdash && !strcmp(a, "-o") && i + 1 < argc)
            v = argv[i + 1], skip = 1;
        else if (!dashdash && !strncmp(a, "-o", 2) && a[2] && a[2] != '-')
            v = a + 2;
        else if (!dashdash && !strcmp(a, "--output") && i + 1 < argc)
            v = argv[i + 1], skip = 1;
        else if (!dashdash && !strncmp(a, "--output=", 9))
            v = a + 9;
        cli_output_t fmt;
        if (v && cli_output_parse(v, &fmt)) {
            g->output = v;
            i += skip;
            continue;
        }
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
            g->output = "json";
            continue;
        }
        if (!strcmp(a, "--no-headers")) {
            g->no_headers = true;
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

static int cli_run(int argc, char **argv, FILE *data_out)
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
        /* -o with something that is no output format: only for a command that takes -o itself */
        bool o = !strcmp(args[i], "-o") || !strcmp(args[i], "--output") || !strncmp(args[i], "--output=", 9) ||
                 (!strncmp(args[i], "-o", 2) && args[i][2] != '-');
        if (o && !strstr(found->usage, "-o ")) {
            const char *v = args[i][1] == 'o' ? (args[i][2] ? args[i] + 2 : i + 1 < nargs ? args[i + 1] : "")
                                              : (strchr(args[i], '=') ? strchr(args[i], '=') + 1
                                                                      : i + 1 < nargs ? args[i + 1] : "");
            rc = *v ? cli_usage_error(found->name, "unknown output format \"%s\": use table, wide, json, yaml or name", v)
                    : cli_usage_error(found->name, "%s needs a value: table, wide, json, yaml or name", args[i]);
            goto done;
        }
    }
    cli_settings_t settings;
    kiln_err_t err;
    kiln_err_clear(&err);
    if (cli_settings_resolve(&g, &settings, &err) != 0) {
        cli_print_error(stderr, &err);
        rc = CLI_EXIT_ERROR; /* this machine's config or token file, not kilnd's answer */
        goto done;
    }
    /* A profile asked for by name must exist, except for kiln login, which creates it. */
    if (settings.profile_chosen && !settings.profile_exists && found->run != cli_cmd_login) {
        kiln_err_set(&err, KILN_ENOTFOUND, NULL, "no profile \"%s\" in %s", settings.profile, settings.config_path);
        kiln_err_hint(&err, "kiln login --profile %s saves one", settings.profile);
        cli_print_error(stderr, &err);
        rc = cli_exit_code(err.status);
        goto done;
    }
    cli_client_t client;
    cli_client_init(&client, &settings);
    client.data_out = data_out;
    client.output = CLI_OUT_TABLE;
    if (g.output && !cli_output_parse(g.output, &client.output)) {
        rc = cli_usage_error(NULL, "unknown output format \"%s\": use table, wide, json, yaml or name", g.output);
        goto done;
    }
    static const char *const named[] = {"jobs", "search", "workers", "queues", "projects", "users", "tokens",
                                        "artifacts", "tune", NULL};
    bool lists = false;
    for (size_t i = 0; named[i]; i++)
        lists |= !strcmp(found->name, named[i]);
    if (client.output == CLI_OUT_NAME && !lists) {
        rc = cli_usage_error(found->name, "-o name lists ids or names: it applies to jobs, search, workers, queues, "
                                          "projects, users, tokens, artifacts and tune list");
        goto done;
    }
    cli_table_set_headers(!g.no_headers);
    client.json = client.output == CLI_OUT_JSON || client.output == CLI_OUT_YAML;
    rc = found->run(&client, nargs, args);
    memset(&client, 0, sizeof(client));
    memset(&settings, 0, sizeof(settings));

done:
    free(args);
    fflush(stdout);
    return rc;
}

int cli_main(int argc, char **argv)
{
    /* What others wrote (a job's reason, a log line, a tag, kilnd's messages quoting them) reaches
     * this terminal only through cli_term_open's streams, so that no escape sequence in it can
     * rewrite the screen, set the window title or the clipboard. glibc's stdout and stderr are
     * variables a program may set; they are put back before returning. */
    FILE *out = stdout, *errs = stderr;
    FILE *t_out = cli_term_open(out, isatty(fileno(out)) ? _IOLBF : _IOFBF);
    FILE *t_err = t_out ? cli_term_open(errs, _IONBF) : NULL;
    if (!t_out || !t_err) {
        if (t_out)
            fclose(t_out);
        fprintf(stderr, "error: out of memory\n");
        return CLI_EXIT_ERROR;
    }
    stdout = t_out;
    stderr = t_err;
    int rc = cli_run(argc, argv, out);
    stdout = out;
    stderr = errs;
    fclose(t_out);
    fclose(t_err);
    return rc;
}

/* ---- shell completion (kiln completion bash|zsh|fish) ---------------------------------------- */

/* The long options a command's usage and help mention ("--status", "--follow"), space-separated
 * into out. */
static void cli_command_options(const cli_command_t *c, char *out, size_t n)
{
    out[0] = '\0';
    const char *texts[] = {c->usage, c->help};
    for (int t = 0; t < 2; t++)
        for (const char *p = texts[t]; (p = strstr(p, "--")) != NULL;) {
            size_t len = 2;
            while (isalnum((unsigned char)p[len]) || p[len] == '-')
                len++;
            char opt[48];
            if (len > 2 && len < sizeof opt) {
                snprintf(opt, sizeof opt, " %.*s ", (int)len, p);
                char padded[1024];
                snprintf(padded, sizeof padded, " %s ", out);
                if (!strstr(padded, opt) && strlen(out) + len + 2 < n) {
                    if (out[0])
                        strcat(out, " ");
                    strncat(out, p, len);
                }
            }
            p += len;
        }
}

/* The subcommand words of a command whose usage has several forms ("list", "create", ...). */
static void cli_command_words(const cli_command_t *c, char *out, size_t n)
{
    out[0] = '\0';
    const char *u = c->usage;
    while (*u) {
        size_t len = 0;
        while (islower((unsigned char)u[len]) || (len > 0 && u[len] == '-'))
            len++;
        if (len > 0 && (u == c->usage || u[-1] == '\n' || u[-1] == '[') && strlen(out) + len + 2 < n) {
            if (out[0])
                strcat(out, " ");
            strncat(out, u, len);
        }
        u += len ? len : 1;
    }
}

static const char cli_globals_words[] = "--url --tls-ca --token-file --profile -o --output --json --no-headers --help";

/* Arguments completed from the server: a command (and, for one with subcommands, the
 * subcommands after which) takes job ids, worker ids, queue names or tuning job ids. The scripts
 * ask `kiln` itself for them, with the global options typed so far (another --url or --profile). */
static const struct {
    const char *cmd, *subs, *kind;
} cli_dynamic[] = {
    {"describe", NULL, "jobs"}, {"logs", NULL, "jobs"}, {"metrics", NULL, "jobs"}, {"stop", NULL, "jobs"},
    {"artifacts", NULL, "jobs"}, {"delete", NULL, "jobs"}, {"compare", NULL, "jobs"},
    {"workers", "approve remove", "workers"}, {"queues", "describe update delete", "queues"},
    {"tune", "describe stop", "tuning"},
};
/* The kiln arguments (after the global options) that list each kind of candidate. */
static const char cli_dynamic_bash_lister[] =
    "    case \"$1\" in\n"
    "        jobs) \"${COMP_WORDS[0]}\" \"${g[@]}\" jobs -o name --limit 200 2>/dev/null ;;\n"
    "        workers) \"${COMP_WORDS[0]}\" \"${g[@]}\" workers list -o name 2>/dev/null ;;\n"
    "        queues) \"${COMP_WORDS[0]}\" \"${g[@]}\" queues list -o name 2>/dev/null ;;\n"
    "        tuning) \"${COMP_WORDS[0]}\" \"${g[@]}\" tune list -o name 2>/dev/null ;;\n"
    "    esac\n";

/* The kind of server-side candidates for command cmd: its (kind) when its arguments are such,
 * and "" otherwise; *subs gets the subcommands they follow (NULL: the command's own). */
static const char *cli_dynamic_kind(const char *cmd, const char **subs)
{
    *subs = NULL;
    for (size_t i = 0; i < KILN_ARRAY_LEN(cli_dynamic); i++)
        if (!strcmp(cli_dynamic[i].cmd, cmd)) {
            *subs = cli_dynamic[i].subs;
            return cli_dynamic[i].kind;
        }
    return "";
}

static void cli_completion_bash(FILE *out)
{
    fprintf(out, "# bash completion for kiln (kiln completion bash)\n"
                 "# _kiln_ids KIND: job ids, worker ids, queue names or tuning job ids, from kilnd\n"
                 "# (through kiln itself, with the global options typed so far)\n_kiln_ids() {\n"
                 "    local -a g=()\n    local j\n"
                 "    for ((j = 1; j < COMP_CWORD; j++)); do\n"
                 "        case \"${COMP_WORDS[j]}\" in\n"
                 "            --url|--tls-ca|--token-file|--profile) g+=(\"${COMP_WORDS[j]}\" \"${COMP_WORDS[j+1]}\"); ((j++)) ;;\n"
                 "        esac\n    done\n%s}\n"
                 "_kiln() {\n"
                 "    local cur prev cmd sub i\n    cur=\"${COMP_WORDS[COMP_CWORD]}\"\n"
                 "    prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n"
                 "    case \"$prev\" in\n"
                 "        -o|--output) COMPREPLY=($(compgen -W \"table wide json yaml name\" -- \"$cur\")); return ;;\n",
            cli_dynamic_bash_lister);
    fprintf(out, 
                 "        --tls-ca|--token-file) COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n"
                 "        --url|--profile|--status|--tag|--limit|--name|--reason|--rank|--since|--points|--user|"
                 "--expires-in|--description|--idempotency-key|--page-size) return ;;\n"
                 "    esac\n    cmd=\"\"; sub=\"\"\n    for ((i = 1; i < COMP_CWORD; i++)); do\n"
                 "        case \"${COMP_WORDS[i]}\" in\n"
                 "            --url|--tls-ca|--token-file|--profile|-o|--output) ((i++)) ;;\n"
                 "            -*) ;;\n            *) if [ -z \"$cmd\" ]; then cmd=\"${COMP_WORDS[i]}\"; "
                 "elif [ -z \"$sub\" ]; then sub=\"${COMP_WORDS[i]}\"; fi ;;\n        esac\n    done\n"
                 "    local globals=\"%s\"\n    if [ -z \"$cmd\" ]; then\n        COMPREPLY=($(compgen -W \"",
            cli_globals_words);
    for (size_t i = 0; i < KILN_ARRAY_LEN(cli_commands); i++)
        fprintf(out, "%s ", cli_commands[i].name);
    fprintf(out, "help $globals\" -- \"$cur\"))\n        return\n    fi\n    local opts=\"\" words=\"\" dyn=\"\"\n"
                 "    case \"$cmd\" in\n");
    for (size_t i = 0; i < KILN_ARRAY_LEN(cli_commands); i++) {
        char opts[1024], words[256];
        cli_command_options(&cli_commands[i], opts, sizeof opts);
        cli_command_words(&cli_commands[i], words, sizeof words);
        if (!strcmp(cli_commands[i].name, "completion"))
            snprintf(words, sizeof words, "bash zsh fish");
        const char *subs, *kind = cli_dynamic_kind(cli_commands[i].name, &subs);
        char dyn[160] = "";
        if (*kind && subs) /* after one of its subcommands: ids; before: the subcommand words */
            snprintf(dyn, sizeof dyn, "; case \" %s \" in *\" $sub \"*) [ -n \"$sub\" ] && dyn=%s ;; esac", subs,
                     kind);
        else if (*kind)
            snprintf(dyn, sizeof dyn, "; dyn=%s", kind);
        fprintf(out, "        %s) opts=\"%s\"; words=\"%s\"%s ;;\n", cli_commands[i].name, opts, words, dyn);
    }
    fprintf(out, "        help) words=\"");
    for (size_t i = 0; i < KILN_ARRAY_LEN(cli_commands); i++)
        fprintf(out, "%s%s", i ? " " : "", cli_commands[i].name);
    fprintf(out, "\" ;;\n    esac\n"
                 "    if [[ \"$cur\" == -* ]]; then\n        COMPREPLY=($(compgen -W \"$opts $globals\" -- \"$cur\"))\n"
                 "    elif [ -n \"$dyn\" ]; then\n        COMPREPLY=($(compgen -W \"$(_kiln_ids \"$dyn\")\" -- \"$cur\"))\n"
                 "    elif [ -n \"$words\" ]; then\n        COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n"
                 "    else\n        COMPREPLY=($(compgen -f -- \"$cur\"))\n    fi\n}\ncomplete -F _kiln kiln\n");
}

/* Single quotes for zsh and fish descriptions. */
static void cli_put_quoted(FILE *out, const char *s)
{
    fputc('\'', out);
    for (; *s; s++) {
        if (*s == '\'')
            fputs("'\\''", out);
        else if (*s == ':' || *s == '[' || *s == ']')
            fputc(' ', out);
        else
            fputc(*s, out);
    }
    fputc('\'', out);
}

static void cli_completion_zsh(FILE *out)
{
    fprintf(out, "#compdef kiln\n# zsh completion for kiln (kiln completion zsh)\n"
                 "# _kiln_ids KIND: job ids, worker ids, queue names or tuning job ids, from kilnd\n"
                 "# (through kiln itself, with the global options typed so far)\n_kiln_ids() {\n"
                 "    local -a g ids\n    local j\n"
                 "    for ((j = 2; j < CURRENT; j++)); do\n"
                 "        case $words[j] in\n"
                 "            --url|--tls-ca|--token-file|--profile) g+=($words[j] $words[j+1]) ;;\n"
                 "        esac\n    done\n"
                 "    case $1 in\n"
                 "        jobs) ids=(${(f)\"$($words[1] $g jobs -o name --limit 200 2>/dev/null)\"}) ;;\n"
                 "        workers) ids=(${(f)\"$($words[1] $g workers list -o name 2>/dev/null)\"}) ;;\n"
                 "        queues) ids=(${(f)\"$($words[1] $g queues list -o name 2>/dev/null)\"}) ;;\n"
                 "        tuning) ids=(${(f)\"$($words[1] $g tune list -o name 2>/dev/null)\"}) ;;\n"
                 "    esac\n    compadd -a ids\n}\n"
                 "_kiln() {\n"
                 "    local -a globals commands\n"
                 "    globals=(\n"
                 "        '--url[kilnd REST address]:url:'\n"
                 "        '--tls-ca[CA certificate file]:file:_files'\n"
                 "        '--token-file[file holding the API token]:file:_files'\n"
                 "        '--profile[saved login to use]:profile:'\n"
                 "        '(-o --output --json)'{-o,--output}'[output format]:format:(table wide json yaml name)'\n"
                 "        '(-o --output --json)--json[the same as -o json]'\n"
                 "        '--no-headers[tables without their heading line]'\n"
                 "    )\n    commands=(\n");
    for (size_t i = 0; i < KILN_ARRAY_LEN(cli_commands); i++) {
        char d[256];
        snprintf(d, sizeof d, "%s:%s", cli_commands[i].name, cli_commands[i].summary);
        char *colon = strchr(d, ':');
        fprintf(out, "        '%.*s:", (int)(colon - d), d);
        for (const char *p = colon + 1; *p; p++)
            fputs(*p == '\'' ? "'\\''" : (char[2]){*p, 0}, out);
        fputs("'\n", out);
    }
    fprintf(out, "        'help:show the help of kiln or of a command'\n    )\n"
                 "    local curcontext=\"$curcontext\" state line\n    typeset -A opt_args\n"
                 "    _arguments -C $globals '1: :->command' '*:: :->args'\n"
                 "    case $state in\n        command) _describe -t commands 'kiln command' commands ;;\n"
                 "        args)\n            case $words[1] in\n");
    for (size_t i = 0; i < KILN_ARRAY_LEN(cli_commands); i++) {
        char opts[1024], words[256];
        cli_command_options(&cli_commands[i], opts, sizeof opts);
        cli_command_words(&cli_commands[i], words, sizeof words);
        if (!strcmp(cli_commands[i].name, "completion"))
            snprintf(words, sizeof words, "bash zsh fish");
        fprintf(out, "                %s) _arguments $globals", cli_commands[i].name);
        char *save = NULL;
        for (char *o = strtok_r(opts, " ", &save); o; o = strtok_r(NULL, " ", &save))
            fprintf(out, " '%s'", o);
        const char *subs, *kind = cli_dynamic_kind(cli_commands[i].name, &subs);
        if (*kind && subs)
            fprintf(out, " '1: :(%s)' '*: :_kiln_ids %s'", words, kind);
        else if (*kind)
            fprintf(out, " '*: :_kiln_ids %s'", kind);
        else if (words[0])
            fprintf(out, " '*: :(%s)'", words);
        else
            fprintf(out, " '*:file:_files'");
        fprintf(out, " ;;\n");
    }
    fprintf(out, "                help) _describe -t commands 'kiln command' commands ;;\n"
                 "            esac ;;\n    esac\n}\n"
                 "if [ \"$funcstack[1]\" = \"_kiln\" ]; then\n    _kiln \"$@\"\nelse\n    compdef _kiln kiln\nfi\n");
}

static void cli_completion_fish(FILE *out)
{
    fprintf(out, "# fish completion for kiln (kiln completion fish)\n"
                 "complete -c kiln -f\n"
                 "complete -c kiln -l url -r -d 'kilnd REST address'\n"
                 "complete -c kiln -l tls-ca -r -F -d 'CA certificate file'\n"
                 "complete -c kiln -l token-file -r -F -d 'file holding the API token'\n"
                 "complete -c kiln -l profile -r -d 'saved login to use'\n"
                 "complete -c kiln -s o -l output -x -a 'table wide json yaml name' -d 'output format'\n"
                 "complete -c kiln -l json -d 'the same as -o json'\n"
                 "complete -c kiln -l no-headers -d 'tables without their heading line'\n"
                 "# __kiln_ids KIND: job ids, worker ids, queue names or tuning job ids, from kilnd\n"
                 "# (through kiln itself, with the global options typed so far)\n"
                 "function __kiln_ids\n"
                 "    set -l toks (commandline -opc)\n    set -l g\n"
                 "    for j in (seq 2 (math (count $toks) - 1))\n"
                 "        if contains -- $toks[$j] --url --tls-ca --token-file --profile\n"
                 "            set -a g $toks[$j] $toks[(math $j + 1)]\n"
                 "        end\n    end\n"
                 "    switch $argv[1]\n"
                 "        case jobs\n            $toks[1] $g jobs -o name --limit 200 2>/dev/null\n"
                 "        case workers\n            $toks[1] $g workers list -o name 2>/dev/null\n"
                 "        case queues\n            $toks[1] $g queues list -o name 2>/dev/null\n"
                 "        case tuning\n            $toks[1] $g tune list -o name 2>/dev/null\n"
                 "    end\nend\n"
                 "# __kiln_cmd_is CMD [SUB...]: the command typed is CMD (and its first argument one of SUB)\n"
                 "function __kiln_cmd_is\n"
                 "    set -l toks (commandline -opc)\n    set -l a\n    set -l skip 0\n"
                 "    for t in $toks[2..-1]\n"
                 "        if test $skip = 1\n            set skip 0\n"
                 "        else if contains -- $t --url --tls-ca --token-file --profile -o --output\n"
                 "            set skip 1\n"
                 "        else if not string match -q -- '-*' $t\n            set -a a $t\n        end\n"
                 "    end\n"
                 "    test (count $a) -ge 1; and test \"$a[1]\" = \"$argv[1]\"; or return 1\n"
                 "    test (count $argv) -eq 1; and return 0\n"
                 "    test (count $a) -ge 2; and contains -- $a[2] $argv[2..-1]\n"
                 "end\n");
    fprintf(out, "set -l kiln_commands");
    for (size_t i = 0; i < KILN_ARRAY_LEN(cli_commands); i++)
        fprintf(out, " %s", cli_commands[i].name);
    fprintf(out, " help\n");
    for (size_t i = 0; i < KILN_ARRAY_LEN(cli_commands); i++) {
        const cli_command_t *c = &cli_commands[i];
        fprintf(out, "complete -c kiln -n \"not __fish_seen_subcommand_from $kiln_commands\" -a %s -d ", c->name);
        cli_put_quoted(out, c->summary);
        fputc('\n', out);
        char opts[1024], words[256];
        cli_command_options(c, opts, sizeof opts);
        cli_command_words(c, words, sizeof words);
        if (!strcmp(c->name, "completion"))
            snprintf(words, sizeof words, "bash zsh fish");
        char *save = NULL;
        for (char *o = strtok_r(opts, " ", &save); o; o = strtok_r(NULL, " ", &save))
            fprintf(out, "complete -c kiln -n \"__fish_seen_subcommand_from %s\" -l %s\n", c->name, o + 2);
        const char *subs, *kind = cli_dynamic_kind(c->name, &subs);
        if (*kind)
            fprintf(out, "complete -c kiln -n \"__kiln_cmd_is %s%s%s\" -a '(__kiln_ids %s)'\n", c->name,
                    subs ? " " : "", subs ? subs : "", kind);
        if (words[0] && (!*kind || subs))
            fprintf(out, "complete -c kiln -n \"__fish_seen_subcommand_from %s\" -a '%s'\n", c->name, words);
        else if (!strcmp(c->name, "submit"))
            fprintf(out, "complete -c kiln -n \"__fish_seen_subcommand_from submit\" -F\n");
    }
    fprintf(out, "complete -c kiln -n \"__fish_seen_subcommand_from help\" -a '");
    for (size_t i = 0; i < KILN_ARRAY_LEN(cli_commands); i++)
        fprintf(out, "%s%s", i ? " " : "", cli_commands[i].name);
    fprintf(out, "'\n");
}

int cli_cmd_completion(cli_client_t *c, int argc, char **argv)
{
    (void)c;
    if (argc != 2)
        return cli_usage_error("completion", "name one shell: bash, zsh or fish");
    if (!strcmp(argv[1], "bash"))
        cli_completion_bash(stdout);
    else if (!strcmp(argv[1], "zsh"))
        cli_completion_zsh(stdout);
    else if (!strcmp(argv[1], "fish"))
        cli_completion_fish(stdout);
    else
        return cli_usage_error("completion", "unknown shell \"%s\": bash, zsh or fish", argv[1]);
    return CLI_EXIT_OK;
}
