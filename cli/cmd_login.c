/* cmd_login.c - `kiln login`, `kiln logout` and `kiln config`: a token read from stdin (or
 * --token-file) is checked with kilnd and saved, with the URL and CA, as a profile of the config
 * file; logout removes it again (revoking it first on request); config lists the profiles and
 * chooses the current one. Reading, writing and choosing profiles is
 * config.c's; the token is never printed. */
#include "cli/cli_int.h"
#include "httpc/httpc.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>

/* The terminal's settings while typing is hidden, to put back if the user interrupts. */
static struct termios cli_saved_tty;
static volatile sig_atomic_t cli_tty_hidden;

static void cli_restore_tty_on_signal(int sig)
{
    if (cli_tty_hidden)
        tcsetattr(0, TCSANOW, &cli_saved_tty);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Reads the token from stdin: one hidden line at a terminal, else everything up to EOF. */
static int cli_token_from_stdin(char *out, size_t n, kiln_err_t *err)
{
    char buf[4096];
    size_t len = 0;
    bool tty = isatty(0);
    if (tty) {
        fprintf(stderr, "API token (typing is not shown): ");
        fflush(stderr);
        if (tcgetattr(0, &cli_saved_tty) == 0) {
            struct termios quiet = cli_saved_tty;
            quiet.c_lflag &= ~(tcflag_t)ECHO;
            signal(SIGINT, cli_restore_tty_on_signal);
            signal(SIGTERM, cli_restore_tty_on_signal);
            /* TCSANOW, not TCSAFLUSH: a token pasted before the prompt showed is kept */
            cli_tty_hidden = tcsetattr(0, TCSANOW, &quiet) == 0;
        }
    }
    bool more = false;
    for (;;) {
        if (len == sizeof(buf) - 1) {
            char extra;
            more = read(0, &extra, 1) > 0;
            break;
        }
        ssize_t r = read(0, buf + len, sizeof(buf) - 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        len += (size_t)r;
        if (tty && memchr(buf, '\n', len))
            break;
    }
    buf[len] = '\0';
    if (tty) {
        if (cli_tty_hidden)
            tcsetattr(0, TCSANOW, &cli_saved_tty);
        cli_tty_hidden = 0;
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        fputc('\n', stderr);
    }
    int rc = more ? kiln_err_set(err, KILN_EINVAL, NULL, "stdin does not hold a token (it is too long)")
                  : cli_token_parse(buf, "stdin", out, n, err);
    memset(buf, 0, sizeof(buf));
    if (rc == KILN_EINVAL && len == 0 && !more)
        kiln_err_hint(err, "pipe the token in (kiln login < FILE), or use --token-file FILE");
    return rc;
}

/* The config file (loaded into *cfg; caller owns) and the profile kiln login and logout work on:
 * the one the settings selected, else the file's current one, else "default". */
static int cli_profile_target(const cli_client_t *c, char *path, size_t n, json_t **cfg, char *name, size_t nn,
                              kiln_err_t *err)
{
    *cfg = NULL;
    int rc = 0;
    if (c->settings.config_path[0])
        kiln_strlcpy(path, c->settings.config_path, n);
    else
        rc = cli_config_path(path, n, err);
    if (rc == 0)
        rc = cli_config_load(path, cfg, err);
    if (rc)
        return rc;
    const char *current = json_string_value(json_object_get(*cfg, "current"));
    kiln_strlcpy(name, c->settings.profile[0] ? c->settings.profile : current && *current ? current : "default", nn);
    if (!kiln_ident_ok(name)) {
        json_decref(*cfg);
        *cfg = NULL;
        kiln_err_set(err, KILN_EINVAL, "profile", "profile name \"%.64s\" is not valid", name);
        kiln_err_hint(err, "use 1 to 63 characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit");
        return KILN_EINVAL;
    }
    return 0;
}

int cli_cmd_login(cli_client_t *c, int argc, char **argv)
{
    if (argc > 1)
        return cli_usage_error("login", "unexpected argument %s (the token is read from stdin)", argv[1]);
    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = CLI_EXIT_OK;
    json_t *cfg = NULL, *me = NULL;
    char path[1024], name[64], ca_abs[4096] = "";
    cli_client_t *login = calloc(1, sizeof(*login));
    if (!login) {
        kiln_err_set(&err, KILN_ENOMEM, NULL, "out of memory");
        goto fail;
    }
    if (cli_profile_target(c, path, sizeof(path), &cfg, name, sizeof(name), &err) != 0)
        goto fail;

    /* The token to save: --token-file's, else stdin's (never KILN_TOKEN or the old profile's). */
    *login = *c;
    if (c->settings.token_from != CLI_FROM_FLAG &&
        cli_token_from_stdin(login->settings.token, sizeof(login->settings.token), &err) != 0)
        goto fail;
    if (c->settings.ca_file[0] && !realpath(c->settings.ca_file, ca_abs)) {
        kiln_err_set(&err, KILN_EINVAL, "tls-ca", "could not open CA file \"%s\": %s", c->settings.ca_file,
                     strerror(errno));
        goto fail;
    }
    kiln_strlcpy(login->settings.ca_file, ca_abs, sizeof(login->settings.ca_file));
    if (cli_request(login, "GET", "/v1/whoami", NULL, NULL, NULL, &me, &err) != 0) {
        cli_print_error(stderr, &err);
        fprintf(stderr, "%s; nothing was saved\n", err.status == KILN_EUNAUTH ? "kilnd did not accept the token"
                                                                             : "could not check the token");
        rc = cli_exit_code(err.status);
        goto done;
    }

    json_t *profiles = json_object_get(cfg, "profiles");
    json_t *prof = json_object_get(profiles, name);
    if (!prof) {
        prof = json_object();
        json_object_set_new(profiles, name, prof);
    }
    json_object_set_new(prof, "url", json_string(c->settings.url));
    json_object_set_new(prof, "token", json_string(login->settings.token));
    if (ca_abs[0])
        json_object_set_new(prof, "ca", json_string(ca_abs));
    else
        json_object_del(prof, "ca");
    json_object_set_new(cfg, "current", json_string(name));
    if (cli_config_save(path, cfg, &err) != 0)
        goto fail;

    if (c->json) {
        cli_print_out(c, me);
    } else {
        char from[1200];
        printf("logged in to %s as %s\n\n", c->settings.url, cli_jstr(me, "user"));
        snprintf(from, sizeof(from), "profile \"%s\" (%s), the current one", name, path);
        cli_print_whoami(stdout, me, c->settings.url, from);
    }
    if (!*cli_jstr(me, "token_id"))
        fprintf(stderr, "warning: kilnd at %s does not check tokens (it runs with --no-auth)\n", c->settings.url);
    goto done;

fail:
    rc = cli_fail(c, &err);
done:
    if (login)
        memset(login, 0, sizeof(*login));
    free(login);
    json_decref(cfg);
    json_decref(me);
    return rc;
}

/* Revokes the token saved in prof on the kilnd it was saved for, and with it every token made
 * with it. Fills *id (>= 32 bytes) and *reply (kilnd's answer; caller decrefs). */
static int cli_revoke_saved(const cli_client_t *c, const json_t *prof, char *id, size_t n, json_t **reply,
                            kiln_err_t *err)
{
    int rc = 0;
    json_t *me = NULL, *gone = NULL;
    cli_client_t *t = calloc(1, sizeof(*t));
    if (!t)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    *t = *c;
    cli_url_normalize(cli_jstr(prof, "url"), t->settings.url, sizeof(t->settings.url));
    kiln_strlcpy(t->settings.token, cli_jstr(prof, "token"), sizeof(t->settings.token));
    kiln_strlcpy(t->settings.ca_file, cli_jstr(prof, "ca"), sizeof(t->settings.ca_file));
    rc = cli_request(t, "GET", "/v1/whoami", NULL, NULL, NULL, &me, err);
    if (rc == 0) {
        char path[160];
        kiln_strlcpy(id, cli_jstr(me, "token_id"), n);
        /* kilnd's own token id (not an argument): escaped all the same */
        char *seg = httpc_escape(id);
        if (!seg || !*id || strlen(seg) + 12 >= sizeof(path))
            rc = kiln_err_set(err, KILN_EFORMAT, NULL, "kilnd's whoami answered no usable token_id");
        else
            snprintf(path, sizeof(path), "/v1/tokens/%s", seg);
        free(seg);
        if (rc == 0)
            rc = cli_request(t, "DELETE", path, NULL, NULL, NULL, &gone, err);
    }
    memset(t, 0, sizeof(*t));
    free(t);
    json_decref(me);
    *reply = gone;
    return rc;
}

int cli_cmd_logout(cli_client_t *c, int argc, char **argv)
{
    bool revoke = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--revoke"))
            revoke = true;
        else
            return cli_usage_error("logout", "unexpected argument %s", argv[i]);
    }
    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = CLI_EXIT_OK;
    json_t *cfg = NULL;
    char path[1024], name[64], id[64] = "";
    json_t *gone = NULL;
    if (cli_profile_target(c, path, sizeof(path), &cfg, name, sizeof(name), &err) != 0) {
        rc = cli_fail(c, &err);
        goto done;
    }
    json_t *prof = json_object_get(json_object_get(cfg, "profiles"), name);
    if (!*cli_jstr(prof, "token")) {
        fprintf(stderr, "profile \"%s\" holds no token: nothing to do\n", name);
        goto done;
    }
    if (revoke && cli_revoke_saved(c, prof, id, sizeof(id), &gone, &err) != 0) {
        cli_print_error(stderr, &err);
        fprintf(stderr, "could not revoke the token, so it was kept; kiln logout without --revoke removes it "
                        "anyway\n");
        rc = cli_exit_code(err.status);
        goto done;
    }
    json_object_del(prof, "token");
    if (cli_config_save(path, cfg, &err) != 0) {
        rc = cli_fail(c, &err);
        goto done;
    }
    printf("logged out: removed the token of profile \"%s\" from %s\n", name, path);
    if (id[0]) {
        printf("revoked token %s on kilnd\n", id);
        cli_print_also_revoked(stdout, gone);
    } else {
        fprintf(stderr, "note: the token itself still works until it expires or is revoked "
                        "(kiln logout --revoke revokes it too)\n");
    }

done:
    json_decref(gone);
    json_decref(cfg);
    return rc;
}

/* ---- kiln config get-profiles | use-profile NAME ------------------------------------------- */

/* Lists the profiles of the config file, the current one marked with '*' (kubectl's
 * get-contexts), with their URLs and whether each holds a token (never the token). */
static int cli_config_get_profiles(cli_client_t *c, const char *path, json_t *cfg)
{
    json_t *profiles = json_object_get(cfg, "profiles");
    const char *current = json_string_value(json_object_get(cfg, "current"));
    if (c->json) {
        json_t *list = json_array();
        const char *k;
        json_t *p;
        json_object_foreach(profiles, k, p)
            json_array_append_new(list, json_pack("{s:s, s:s, s:b, s:b}", "name", k, "url", cli_jstr(p, "url"),
                                                  "current", current && !strcmp(current, k), "token",
                                                  *cli_jstr(p, "token") != '\0'));
        json_t *o = json_pack("{s:o, s:s}", "profiles", list, "config", path);
        cli_print_out(c, o);
        json_decref(o);
        return CLI_EXIT_OK;
    }
    cli_table_t t;
    cli_table_init(&t, "CURRENT NAME URL TOKEN CA");
    const char *k;
    json_t *p;
    json_object_foreach(profiles, k, p) {
        const char *row[] = {current && !strcmp(current, k) ? "*" : " ", k, cli_jstr(p, "url"),
                             *cli_jstr(p, "token") ? "saved" : "none", cli_jstr(p, "ca")};
        cli_table_row(&t, row);
    }
    if (t.nrows == 0)
        fprintf(stderr, "no profiles in %s (kiln login saves one)\n", path);
    else
        cli_table_print(stdout, &t);
    return CLI_EXIT_OK;
}

/* Makes profile the config file's current one: later commands use it when neither --profile
 * nor KILN_PROFILE names another. */
static int cli_config_use_profile(cli_client_t *c, const char *path, json_t *cfg, const char *profile)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    if (!json_object_get(json_object_get(cfg, "profiles"), profile)) {
        kiln_err_set(&err, KILN_ENOTFOUND, "profile", "no profile \"%.64s\" in %s", profile, path);
        kiln_err_hint(&err, "kiln config get-profiles lists them; kiln login --profile %.64s saves one", profile);
        return cli_fail(c, &err);
    }
    json_object_set_new(cfg, "current", json_string(profile));
    if (cli_config_save(path, cfg, &err) != 0)
        return cli_fail(c, &err);
    printf("now using profile \"%s\" (%s)\n", profile, path);
    return CLI_EXIT_OK;
}

int cli_cmd_config(cli_client_t *c, int argc, char **argv)
{
    static const char *const subs[] = {"get-profiles", "use-profile", NULL};
    int first = 0;
    const char *sub = cli_subcommand("config", argc, argv, subs, &first);
    if (!sub)
        return CLI_EXIT_USAGE;
    const char *pos[2];
    int n = cli_positional("config", argc, argv, first, pos, 2);
    if (n < 0)
        return CLI_EXIT_USAGE;
    bool list = !strcmp(sub, "get-profiles");
    if (list && n)
        return cli_usage_error("config", "get-profiles takes no argument");
    if (!list && n != 1)
        return cli_usage_error("config", "use-profile needs one profile name");
    char path[1024], name[64];
    json_t *cfg = NULL;
    kiln_err_t err;
    kiln_err_clear(&err);
    if (cli_profile_target(c, path, sizeof path, &cfg, name, sizeof name, &err) != 0)
        return cli_fail(c, &err);
    int rc = list ? cli_config_get_profiles(c, path, cfg) : cli_config_use_profile(c, path, cfg, pos[0]);
    json_decref(cfg);
    return rc;
}
