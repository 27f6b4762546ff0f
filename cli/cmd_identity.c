/* cmd_identity.c - the identity subcommands of `kiln`: whoami, users, tokens and projects
 * (members included). Each parses its arguments, makes its REST calls through http.c and prints
 * through format.c; with --json the API's replies are printed as they are. A new token's secret is
 * printed once, on stdout alone; nothing else here ever prints one. Saving a login is cmd_login.c's. */
#include "cli/cli_int.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <stdlib.h>
#include <string.h>

const char *cli_subcommand(const char *cmd, int argc, char **argv, const char *const *names, int *first)
{
    *first = 1;
    if (argc < 2 || argv[1][0] == '-')
        return names[0];
    for (size_t i = 0; names[i]; i++)
        if (!strcmp(argv[1], names[i])) {
            *first = 2;
            return names[i];
        }
    char list[256] = "";
    size_t off = 0;
    for (size_t i = 0; names[i] && off < sizeof(list); i++)
        off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%s", i ? ", " : "", names[i]);
    cli_usage_error(cmd, "unknown %s command \"%s\" (%s)", cmd, argv[1], list);
    return NULL;
}

int cli_positional(const char *cmd, int argc, char **argv, int first, const char **pos, int max)
{
    int n = 0;
    for (int i = first; i < argc; i++) {
        if (!strcmp(argv[i], "--"))
            continue;
        if (argv[i][0] == '-' && argv[i][1]) {
            cli_usage_error(cmd, "unknown option %s", argv[i]);
            return -1;
        }
        if (n == max) {
            cli_usage_error(cmd, "unexpected argument %s", argv[i]);
            return -1;
        }
        pos[n++] = argv[i];
    }
    return n;
}

/* The caller's user name (GET /v1/whoami) into out (>= 64 bytes). */
static int cli_my_name(const cli_client_t *c, char *out, size_t n, kiln_err_t *err)
{
    json_t *me = NULL;
    int rc = cli_request(c, "GET", "/v1/whoami", NULL, NULL, NULL, &me, err);
    if (rc == 0)
        kiln_strlcpy(out, cli_jstr(me, "user"), n);
    json_decref(me);
    return rc;
}

int cli_call_show(const cli_client_t *c, const char *method, const char *path, const json_t *body,
                         cli_show_fn show)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *reply = NULL;
    if (cli_request(c, method, path, body, NULL, NULL, &reply, &err) != 0)
        return cli_fail(c, &err);
    if (c->json)
        cli_print_out(c, reply);
    else if (show)
        show(c, reply);
    json_decref(reply);
    return CLI_EXIT_OK;
}

/* ---- whoami ------------------------------------------------------------------------------------ */

int cli_cmd_whoami(cli_client_t *c, int argc, char **argv)
{
    if (argc > 1)
        return cli_usage_error("whoami", "unexpected argument %s", argv[1]);
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *me = NULL;
    if (cli_request(c, "GET", "/v1/whoami", NULL, NULL, NULL, &me, &err) != 0)
        return cli_fail(c, &err);
    if (c->json) {
        cli_print_out(c, me);
    } else {
        char from[1200];
        cli_print_whoami(stdout, me, c->settings.url, cli_token_source(&c->settings, from, sizeof(from)));
    }
    json_decref(me);
    return CLI_EXIT_OK;
}

/* ---- users ------------------------------------------------------------------------------------- */

static void cli_show_users(const cli_client_t *c, const json_t *reply)
{
    if (!cli_print_names(c, json_object_get(reply, "users"), "name"))
        cli_print_users(stdout, reply);
}

static void cli_show_user_created(const cli_client_t *c, const json_t *reply)
{
    (void)c;
    const char *name = cli_jstr(reply, "name");
    printf("created user %s%s\n", name, json_is_true(json_object_get(reply, "cluster_admin")) ? " (cluster admin)" : "");
    fprintf(stderr, "next: kiln tokens create %s gives it a token; kiln projects add-member PROJECT %s ROLE a project\n",
            name, name);
}

int cli_cmd_users(cli_client_t *c, int argc, char **argv)
{
    static const char *const subs[] = {"list", "create", NULL};
    int first;
    const char *sub = cli_subcommand("users", argc, argv, subs, &first);
    if (!sub)
        return CLI_EXIT_USAGE;
    if (!strcmp(sub, "list")) {
        const char *pos[1];
        if (cli_positional("users", argc, argv, first, pos, 0) < 0)
            return CLI_EXIT_USAGE;
        return cli_call_show(c, "GET", "/v1/users", NULL, cli_show_users);
    }
    const char *name = NULL;
    bool admin = false;
    for (int i = first; i < argc; i++) {
        if (!strcmp(argv[i], "--cluster-admin"))
            admin = true;
        else if (argv[i][0] == '-' && argv[i][1])
            return cli_usage_error("users", "unknown option %s", argv[i]);
        else if (!name)
            name = argv[i];
        else
            return cli_usage_error("users", "unexpected argument %s", argv[i]);
    }
    if (!name)
        return cli_usage_error("users", "missing the name of the user to create");
    json_t *body = json_pack("{s:s, s:b}", "name", name, "cluster_admin", admin);
    int rc = cli_call_show(c, "POST", "/v1/users", body, cli_show_user_created);
    json_decref(body);
    return rc;
}

/* ---- tokens ------------------------------------------------------------------------------------ */

static void cli_show_tokens(const cli_client_t *c, const json_t *reply)
{
    if (!cli_print_names(c, json_object_get(reply, "tokens"), "id"))
        cli_print_tokens(stdout, reply, kiln_now_us());
}

static void cli_show_revoked(const cli_client_t *c, const json_t *reply)
{
    (void)c;
    printf("revoked token %s of user %s\n", cli_jstr(reply, "id"), cli_jstr(reply, "user"));
    cli_print_also_revoked(stdout, reply);
}

static int cli_tokens_list(cli_client_t *c, int argc, char **argv, int first)
{
    const char *user = NULL, *v;
    for (int i = first; i < argc; i++) {
        int m = cli_opt("tokens", argc, argv, &i, "--user", "-u", &v);
        if (m < 0)
            return CLI_EXIT_USAGE;
        if (m)
            user = v;
        else
            return cli_usage_error("tokens", "unexpected argument %s", argv[i]);
    }
    kiln_err_t err;
    kiln_err_clear(&err);
    char me[128], seg[400], path[512];
    if (!user) {
        if (cli_my_name(c, me, sizeof(me), &err) != 0)
            return cli_fail(c, &err);
        user = me;
    }
    int src = cli_path_segment("tokens", user, seg, sizeof(seg));
    if (src)
        return src;
    snprintf(path, sizeof(path), "/v1/users/%s/tokens", seg);
    return cli_call_show(c, "GET", path, NULL, cli_show_tokens);
}

static int cli_tokens_create(cli_client_t *c, int argc, char **argv, int first)
{
    const char *user = NULL, *desc = NULL, *v;
    int64_t expires = 0;
    for (int i = first; i < argc; i++) {
        int m;
        if ((m = cli_opt("tokens", argc, argv, &i, "--expires-in", NULL, &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            if (!cli_parse_duration(v, &expires))
                return cli_usage_error("tokens", "--expires-in takes a duration such as 3600s, 90m, 12h or 30d "
                                                 "(got \"%s\")", v);
        } else if ((m = cli_opt("tokens", argc, argv, &i, "--description", "-d", &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            desc = v;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error("tokens", "unknown option %s", argv[i]);
        } else if (!user) {
            user = argv[i];
        } else {
            return cli_usage_error("tokens", "unexpected argument %s", argv[i]);
        }
    }
    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = CLI_EXIT_OK;
    char me[128], seg[400], path[512];
    json_t *body = NULL, *reply = NULL;
    if (!user) {
        if (cli_my_name(c, me, sizeof(me), &err) != 0)
            return cli_fail(c, &err);
        user = me;
    }
    int src = cli_path_segment("tokens", user, seg, sizeof(seg));
    if (src)
        return src;
    body = json_object();
    if (expires > 0)
        json_object_set_new(body, "expires_in_s", json_integer(expires));
    if (desc)
        json_object_set_new(body, "description", json_string(desc));
    snprintf(path, sizeof(path), "/v1/users/%s/tokens", seg);
    if (cli_request(c, "POST", path, body, NULL, NULL, &reply, &err) != 0) {
        rc = cli_fail(c, &err);
        goto done;
    }
    if (c->json) {
        cli_print_out(c, reply);
    } else {
        /* The secret alone on stdout, so that `kiln tokens create U > file` or `| kiln login`
         * takes exactly it; everything else on stderr. */
        printf("%s\n", cli_jstr(reply, "token"));
        const char *exp = cli_jstr(reply, "expires_at");
        char tb[40];
        fprintf(stderr, "created token %s for user %s, %s%s%s\n", cli_jstr(reply, "id"), cli_jstr(reply, "user"),
                *exp ? "valid until " : "valid until revoked", *exp ? cli_fmt_time(exp, tb, sizeof(tb)) : "",
                *exp ? " UTC" : "");
        const char *parent = cli_jstr(reply, "parent_id");
        if (json_is_true(json_object_get(reply, "expires_with_parent")))
            fprintf(stderr, "note: it expires with token %s, which made it (a token never outlives the token that "
                            "makes it); log in with a longer-lived token to make a longer-lived one\n", parent);
        if (*parent)
            fprintf(stderr, "note: revoking token %s revokes it too\n", parent);
        fprintf(stderr, "note: this is the only time the token is shown: it cannot be shown again, "
                        "so store it now (kiln login reads it on stdin)\n");
    }
    fflush(stdout);

done:
    cli_secret_forget(reply, "token"); /* the secret does not outlive its printing */
    json_decref(reply);
    json_decref(body);
    return rc;
}

int cli_cmd_tokens(cli_client_t *c, int argc, char **argv)
{
    static const char *const subs[] = {"list", "create", "revoke", NULL};
    int first;
    const char *sub = cli_subcommand("tokens", argc, argv, subs, &first);
    if (!sub)
        return CLI_EXIT_USAGE;
    if (!strcmp(sub, "list"))
        return cli_tokens_list(c, argc, argv, first);
    if (!strcmp(sub, "create"))
        return cli_tokens_create(c, argc, argv, first);
    const char *pos[1];
    int n = cli_positional("tokens", argc, argv, first, pos, 1);
    if (n < 0)
        return CLI_EXIT_USAGE;
    if (n == 0)
        return cli_usage_error("tokens", "missing the id of the token to revoke (kiln tokens lists them)");
    char seg[400], path[512];
    int src = cli_path_segment("tokens", pos[0], seg, sizeof(seg));
    if (src)
        return src;
    snprintf(path, sizeof(path), "/v1/tokens/%s", seg);
    return cli_call_show(c, "DELETE", path, NULL, cli_show_revoked);
}

/* ---- projects ---------------------------------------------------------------------------------- */

static void cli_show_project_created(const cli_client_t *c, const json_t *reply)
{
    (void)c;
    const char *name = cli_jstr(reply, "name");
    printf("created project %s (default queue %s)\n", name, cli_jstr(reply, "default_queue"));
    fprintf(stderr, "next: kiln projects add-member %s USER " KILN_NAME_CHOICES(KILN_PROJECT_ROLES) "\n", name);
}

static void cli_show_members(const cli_client_t *c, const json_t *reply)
{
    (void)c;
    cli_print_members(stdout, reply);
}

static void cli_show_member_set(const cli_client_t *c, const json_t *reply)
{
    (void)c;
    printf("%s is now %s of project %s\n", cli_jstr(reply, "user"), cli_jstr(reply, "role"),
           cli_jstr(reply, "project"));
}

static void cli_show_member_removed(const cli_client_t *c, const json_t *reply)
{
    (void)c;
    printf("removed %s from project %s\n", cli_jstr(reply, "user"), cli_jstr(reply, "project"));
}

static int cli_projects_list(cli_client_t *c)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = CLI_EXIT_OK;
    json_t *reply = NULL, *me = NULL;
    if (cli_request(c, "GET", "/v1/projects", NULL, NULL, NULL, &reply, &err) != 0) {
        rc = cli_fail(c, &err);
        goto done;
    }
    if (c->json) {
        cli_print_out(c, reply);
        goto done;
    }
    if (cli_print_names(c, json_object_get(reply, "projects"), "name"))
        goto done;
    /* A cluster admin's listing has every project without roles: whoami has its own. */
    bool roleless = false;
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(reply, "projects"), i, p)
        roleless |= !*cli_jstr(p, "role");
    if (roleless && cli_request(c, "GET", "/v1/whoami", NULL, NULL, NULL, &me, &err) != 0) {
        rc = cli_fail(c, &err);
        goto done;
    }
    cli_print_projects(stdout, reply, me);

done:
    json_decref(reply);
    json_decref(me);
    return rc;
}

static void cli_show_project_updated(const cli_client_t *c, const json_t *reply)
{
    (void)c;
    printf("project %s: default queue %s\n", cli_jstr(reply, "name"), cli_jstr(reply, "default_queue"));
}

/* create NAME [--default-queue Q] and update PROJECT --default-queue Q. */
static int cli_project_write(cli_client_t *c, const char *sub, int argc, char **argv, int first)
{
    const char *name = NULL, *queue = NULL;
    for (int i = first; i < argc; i++) {
        const char *v;
        int m = cli_opt("projects", argc, argv, &i, "--default-queue", NULL, &v);
        if (m < 0)
            return CLI_EXIT_USAGE;
        if (m > 0)
            queue = v;
        else if (argv[i][0] == '-' && argv[i][1])
            return cli_usage_error("projects", "unknown option %s", argv[i]);
        else if (!name)
            name = argv[i];
        else
            return cli_usage_error("projects", "unexpected argument %s", argv[i]);
    }
    if (!name)
        return cli_usage_error("projects", "%s: missing the project", sub);
    bool create = !strcmp(sub, "create");
    if (!create && !queue)
        return cli_usage_error("projects", "update: say what to change (--default-queue QUEUE)");
    char seg[400], path[512];
    int src = create ? 0 : cli_path_segment("projects", name, seg, sizeof seg);
    if (src)
        return src;
    snprintf(path, sizeof path, "/v1/projects/%s", seg);
    json_t *body = create ? json_pack("{s:s}", "name", name) : json_object();
    if (queue)
        json_object_set_new(body, "default_queue", json_string(queue));
    int rc = create ? cli_call_show(c, "POST", "/v1/projects", body, cli_show_project_created)
                    : cli_call_show(c, "PATCH", path, body, cli_show_project_updated);
    json_decref(body);
    return rc;
}

int cli_cmd_projects(cli_client_t *c, int argc, char **argv)
{
    static const char *const subs[] = {"list", "create", "update", "members", "add-member", "remove-member", NULL};
    int first;
    const char *sub = cli_subcommand("projects", argc, argv, subs, &first);
    if (!sub)
        return CLI_EXIT_USAGE;
    if (!strcmp(sub, "create") || !strcmp(sub, "update"))
        return cli_project_write(c, sub, argc, argv, first);
    const char *pos[3];
    int want = !strcmp(sub, "list") ? 0 : !strcmp(sub, "add-member") ? 3 : !strcmp(sub, "remove-member") ? 2 : 1;
    int n = cli_positional("projects", argc, argv, first, pos, want);
    if (n < 0)
        return CLI_EXIT_USAGE;
    if (n < want) {
        static const char *const what[] = {"the project", "the user", "the role (" KILN_NAME_CHOICES(KILN_PROJECT_ROLES) ")"};
        return cli_usage_error("projects", "%s: missing %s", sub, what[n]);
    }
    if (!strcmp(sub, "list"))
        return cli_projects_list(c);

    char project[400], user[400], path[1024];
    int rc = cli_path_segment("projects", pos[0], project, sizeof(project));
    if (rc == 0 && n > 1)
        rc = cli_path_segment("projects", pos[1], user, sizeof(user));
    if (rc)
        return rc;
    json_t *body = NULL;
    if (!strcmp(sub, "members")) {
        snprintf(path, sizeof(path), "/v1/projects/%s/members", project);
        rc = cli_call_show(c, "GET", path, NULL, cli_show_members);
    } else if (!strcmp(sub, "add-member")) {
        snprintf(path, sizeof(path), "/v1/projects/%s/members/%s", project, user);
        body = json_pack("{s:s}", "role", pos[2]);
        rc = cli_call_show(c, "PUT", path, body, cli_show_member_set);
    } else {
        snprintf(path, sizeof(path), "/v1/projects/%s/members/%s", project, user);
        rc = cli_call_show(c, "DELETE", path, NULL, cli_show_member_removed);
    }
    json_decref(body);
    return rc;
}

/* ---- ui ---------------------------------------------------------------------------------------- */

/* Starts a program that opens url in the user's browser; true when it ran and said it worked
 * (within 5 s; a slower one is taken as working). Its output goes nowhere. */
static bool cli_open_browser(const char *url)
{
    const char *opener = getenv("KILN_BROWSER");
    if (!opener || !*opener)
        opener = "xdg-open";
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
    char *argv[] = {(char *)opener, (char *)url, NULL};
    pid_t pid;
    int rc = posix_spawnp(&pid, opener, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        return false;
    for (int i = 0; i < 50; i++) {
        int st;
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid)
            return WIFEXITED(st) && WEXITSTATUS(st) == 0;
        if (w < 0)
            return false;
        usleep(100 * 1000);
    }
    return true;
}

int cli_cmd_ui(cli_client_t *c, int argc, char **argv)
{
    bool print = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--print") || !strcmp(argv[i], "--no-browser"))
            print = true;
        else
            return cli_usage_error("ui", "unexpected argument %s", argv[i]);
    }
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *link = NULL, *none = json_object();
    int rc = cli_request(c, "POST", "/v1/login-links", none, NULL, NULL, &link, &err);
    json_decref(none);
    if (rc != 0)
        return cli_fail(c, &err);
    /* The code rides in the fragment: browsers never send it to a server, and the page takes it
     * out of the address bar and the history entry before it uses it, once. */
    size_t n = strlen(c->settings.url) + strlen(cli_jstr(link, "code")) + 16;
    char *url = malloc(n);
    if (!url) {
        json_decref(link);
        return CLI_EXIT_ERROR;
    }
    snprintf(url, n, "%s/#login=%s", c->settings.url, cli_jstr(link, "code"));
    int ret = CLI_EXIT_OK;
    if (!print && (getenv("DISPLAY") || getenv("WAYLAND_DISPLAY") || getenv("KILN_BROWSER")) && cli_open_browser(url)) {
        fprintf(stderr, "opened kiln's web UI in your browser, logged in as you with a one-time link\n");
    } else {
        printf("%s\n", url);
        fprintf(stderr, "open this link in a browser within %s: it logs the browser in as you, once "
                        "(the browser gets a token of its own, valid until %s at most)\n",
                "2 minutes", cli_jstr(link, "session_expires_at"));
    }
    memset(url, 0, n);
    free(url);
    json_decref(link);
    return ret;
}
