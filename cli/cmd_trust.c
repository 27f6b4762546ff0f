/* cmd_trust.c - the `kiln` subcommands about what agents are trusted with: workers (the list, and
 * for cluster admins approve, remove, ban and unban) and join tokens (list, create, revoke). A new
 * join token's secret is printed once, on stdout alone, as `kiln tokens create` prints an API
 * token's. The worker table itself is format.c's. */
#include "cli/cli_int.h"

#include <stdlib.h>
#include <string.h>

/* ---- tables ------------------------------------------------------------------------------------ */

void cli_print_join_tokens(FILE *out, const json_t *reply, int64_t now_us)
{
    cli_table_t t;
    cli_table_init(&t, "ID STATE >USES >LEFT >REGISTERED EXPIRES CREATED-BY DESCRIPTION");
    size_t i;
    json_t *j;
    json_array_foreach(json_object_get(reply, "join_tokens"), i, j) {
        char uses[16], left[16], regs[16], exp[40];
        cli_jint_text(j, "uses", "nan", uses, sizeof(uses));
        cli_jint_text(j, "uses_left", "nan", left, sizeof(left));
        cli_jint_text(j, "registrations", "nan", regs, sizeof(regs));
        int64_t e = cli_jtime(j, "expires_at");
        char d[24];
        if (e > now_us)
            snprintf(exp, sizeof exp, "in %s", cli_fmt_duration((double)(e - now_us) / 1e6, d, sizeof d));
        else
            cli_fmt_time(cli_jstr(j, "expires_at"), exp, sizeof exp);
        const char *row[] = {cli_jstr(j, "id"), cli_jstr(j, "state"), uses, left, regs, exp, cli_jstr(j, "created_by"),
                             cli_jstr(j, "description")};
        cli_table_row(&t, row);
    }
    if (t.nrows == 0) {
        fprintf(out, "no join tokens (kilnd's --join-token-file is not listed; kiln join-tokens create makes one)\n");
        return;
    }
    cli_table_print(out, &t);
}

void cli_print_worker_bans(FILE *out, const json_t *reply)
{
    cli_table_t t;
    cli_table_init(&t, ">BAN WORKER CERT-SHA256 BANNED BY REASON");
    size_t i;
    json_t *b;
    json_array_foreach(json_object_get(reply, "bans"), i, b) {
        char id[24], when[32], cert[24];
        cli_jint_text(b, "id", "nan", id, sizeof(id));
        snprintf(cert, sizeof cert, "%.16s", cli_jstr(b, "cert_sha256"));
        cli_fmt_time(cli_jstr(b, "banned_at"), when, sizeof when);
        const char *row[] = {id, cli_jstr(b, "worker_id"), cert, when, cli_jstr(b, "banned_by"), cli_jstr(b, "reason")};
        cli_table_row(&t, row);
    }
    if (t.nrows == 0) {
        fprintf(out, "no worker bans\n");
        return;
    }
    cli_table_print(out, &t);
}

/* ---- workers ----------------------------------------------------------------------------------- */

static void cli_show_workers(const cli_client_t *c, const json_t *reply)
{
    if (!cli_print_names(c, json_object_get(reply, "workers"), "id"))
        cli_print_workers(stdout, reply, kiln_now_us(), c->output == CLI_OUT_WIDE);
}

static void cli_show_approved(const cli_client_t *c, const json_t *reply)
{
    (void)c;
    printf("worker %s (%s) is approved: it takes work now\n", cli_jstr(reply, "id"), cli_jstr(reply, "hostname"));
}

static void cli_show_removed(const cli_client_t *c, const json_t *reply)
{
    (void)c;
    double lost = cli_jnum(reply, "lost_attempts");
    printf("removed worker %s", cli_jstr(reply, "id"));
    if (lost > 0)
        printf("; %.0f attempt(s) it ran were lost and go back to their queues (or fail without retries left)", lost);
    printf("\n");
    const json_t *ban = json_object_get(reply, "ban");
    if (json_is_object(ban))
        printf("ban %.0f: worker id %s%s%.16s may not register again (kiln workers unban %.0f lifts it)\n",
               cli_jnum(ban, "id"), cli_jstr(ban, "worker_id"), *cli_jstr(ban, "cert_sha256") ? " and certificate " : "",
               cli_jstr(ban, "cert_sha256"), cli_jnum(ban, "id"));
}

static void cli_show_bans(const cli_client_t *c, const json_t *reply)
{
    (void)c;
    cli_print_worker_bans(stdout, reply);
}

static void cli_show_unbanned(const cli_client_t *c, const json_t *reply)
{
    (void)c;
    printf("lifted ban %.0f\n", cli_jnum(reply, "id"));
}

static int cli_workers_remove(cli_client_t *c, int argc, char **argv, int first)
{
    const char *id = NULL, *reason = NULL, *v;
    bool ban = false;
    for (int i = first; i < argc; i++) {
        int m;
        if (!strcmp(argv[i], "--ban")) {
            ban = true;
        } else if ((m = cli_opt("workers", argc, argv, &i, "--reason", NULL, &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            reason = v;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error("workers", "unknown option %s", argv[i]);
        } else if (!id) {
            id = argv[i];
        } else {
            return cli_usage_error("workers", "unexpected argument %s", argv[i]);
        }
    }
    if (!id)
        return cli_usage_error("workers", "remove: missing the id of the worker (kiln workers lists them)");
    if (reason && !ban)
        return cli_usage_error("workers", "remove: --reason is recorded with a ban: add --ban");
    char seg[400];
    int src = cli_path_segment("workers", id, seg, sizeof seg);
    if (src)
        return src;
    char *path = NULL;
    if (asprintf(&path, "/v1/workers/%s", seg) < 0 ||
        (ban && cli_path_add(&path, "ban", "true") != 0) || (reason && cli_path_add(&path, "reason", reason) != 0)) {
        free(path);
        return CLI_EXIT_ERROR;
    }
    int rc = cli_call_show(c, "DELETE", path, NULL, cli_show_removed);
    free(path);
    return rc;
}

int cli_cmd_workers(cli_client_t *c, int argc, char **argv)
{
    static const char *const subs[] = {"list", "approve", "remove", "bans", "unban", NULL};
    int first;
    const char *sub = cli_subcommand("workers", argc, argv, subs, &first);
    if (!sub)
        return CLI_EXIT_USAGE;
    if (!strcmp(sub, "remove"))
        return cli_workers_remove(c, argc, argv, first);
    bool one = !strcmp(sub, "approve") || !strcmp(sub, "unban");
    const char *pos[1];
    int n = cli_positional("workers", argc, argv, first, pos, one ? 1 : 0);
    if (n < 0)
        return CLI_EXIT_USAGE;
    if (one && n == 0)
        return cli_usage_error("workers", "%s: missing the %s", sub,
                               !strcmp(sub, "approve") ? "id of the worker (kiln workers lists them)"
                                                       : "number of the ban (kiln workers bans lists them)");
    if (!strcmp(sub, "list"))
        return cli_call_show(c, "GET", "/v1/workers", NULL, cli_show_workers);
    if (!strcmp(sub, "bans"))
        return cli_call_show(c, "GET", "/v1/worker-bans", NULL, cli_show_bans);
    char seg[400], path[512];
    int src = cli_path_segment("workers", pos[0], seg, sizeof seg);
    if (src)
        return src;
    if (!strcmp(sub, "approve")) {
        snprintf(path, sizeof path, "/v1/workers/%s:approve", seg);
        json_t *none = json_object();
        int rc = cli_call_show(c, "POST", path, none, cli_show_approved);
        json_decref(none);
        return rc;
    }
    snprintf(path, sizeof path, "/v1/worker-bans/%s", seg);
    return cli_call_show(c, "DELETE", path, NULL, cli_show_unbanned);
}

/* ---- join tokens ------------------------------------------------------------------------------- */

static void cli_show_join_tokens(const cli_client_t *c, const json_t *reply)
{
    (void)c;
    cli_print_join_tokens(stdout, reply, kiln_now_us());
}

static void cli_show_join_revoked(const cli_client_t *c, const json_t *reply)
{
    (void)c;
    printf("revoked join token %s (workers it registered keep their own credentials)\n", cli_jstr(reply, "id"));
}

static int cli_join_tokens_create(cli_client_t *c, int argc, char **argv, int first)
{
    const char *desc = NULL, *expires = NULL, *v;
    long uses = 0;
    for (int i = first; i < argc; i++) {
        int m;
        if ((m = cli_opt("join-tokens", argc, argv, &i, "--uses", NULL, &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            if (!cli_parse_int(v, 1, 1000000, &uses))
                return cli_usage_error("join-tokens", "--uses takes 1 to 1000000 registrations (got \"%s\")", v);
        } else if ((m = cli_opt("join-tokens", argc, argv, &i, "--expires-in", NULL, &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            int64_t s;
            if (!cli_parse_duration(v, &s))
                return cli_usage_error("join-tokens", "--expires-in takes a duration such as 90s, 30m, 12h or 7d "
                                                      "(got \"%s\")", v);
            expires = v;
        } else if ((m = cli_opt("join-tokens", argc, argv, &i, "--description", "-d", &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            desc = v;
        } else {
            return cli_usage_error("join-tokens", "unexpected argument %s", argv[i]);
        }
    }
    json_t *body = json_object(), *reply = NULL;
    if (uses)
        json_object_set_new(body, "uses", json_integer(uses));
    if (expires)
        json_object_set_new(body, "expires_in", json_string(expires));
    if (desc)
        json_object_set_new(body, "description", json_string(desc));
    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = CLI_EXIT_OK;
    if (cli_request(c, "POST", "/v1/join-tokens", body, NULL, NULL, &reply, &err) != 0) {
        rc = cli_fail(c, &err);
    } else if (c->json) {
        cli_print_out(c, reply);
    } else {
        /* The secret alone on stdout, so `kiln join-tokens create > join.token` writes the file an
         * agent's --join-token-file reads; everything else on stderr. */
        printf("%s\n", cli_jstr(reply, "token"));
        char tb[40];
        fprintf(stderr, "created join token %s: %.0f registration(s), valid until %s UTC\n", cli_jstr(reply, "id"),
                cli_jnum(reply, "uses"), cli_fmt_time(cli_jstr(reply, "expires_at"), tb, sizeof tb));
        fprintf(stderr, "note: this is the only time the token is shown; give it to an agent with "
                        "--join-token-file FILE (a 0600 file holding it)\n");
    }
    fflush(stdout);
    cli_secret_forget(reply, "token"); /* the secret does not outlive its printing */
    json_decref(reply);
    json_decref(body);
    return rc;
}

int cli_cmd_join_tokens(cli_client_t *c, int argc, char **argv)
{
    static const char *const subs[] = {"list", "create", "revoke", NULL};
    int first;
    const char *sub = cli_subcommand("join-tokens", argc, argv, subs, &first);
    if (!sub)
        return CLI_EXIT_USAGE;
    if (!strcmp(sub, "create"))
        return cli_join_tokens_create(c, argc, argv, first);
    const char *pos[1];
    bool revoke = !strcmp(sub, "revoke");
    int n = cli_positional("join-tokens", argc, argv, first, pos, revoke ? 1 : 0);
    if (n < 0)
        return CLI_EXIT_USAGE;
    if (!revoke)
        return cli_call_show(c, "GET", "/v1/join-tokens", NULL, cli_show_join_tokens);
    if (n == 0)
        return cli_usage_error("join-tokens", "revoke: missing the id of the join token (kiln join-tokens lists them)");
    char seg[400], path[512];
    int src = cli_path_segment("join-tokens", pos[0], seg, sizeof seg);
    if (src)
        return src;
    snprintf(path, sizeof path, "/v1/join-tokens/%s", seg);
    return cli_call_show(c, "DELETE", path, NULL, cli_show_join_revoked);
}
