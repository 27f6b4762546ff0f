/* test_config.c - the kiln CLI's global options, its config file of saved logins (0600, atomic
 * replace, profiles, refusal of a file others can read), the precedence of flags over the
 * environment over the profile, the identity tables, and login / logout / identity commands'
 * usage and failure paths without a server. The end-to-end suite (tests/e2e/test_identity.c)
 * runs the same commands against a real kilnd. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"

#define TOKEN_A "kiln_AAAAsecretAAAA"
#define TOKEN_B "kiln_BBBBsecretBBBB"

static char home_dir[64];

static void remove_home(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", home_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", home_dir);
}

/* A fresh directory as XDG_CONFIG_HOME (removed when the test's process exits), with nothing of
 * the caller's environment that would change what kiln resolves. Returns the config file's path
 * (static storage). */
static const char *fresh_home(void)
{
    static char path[128];
    snprintf(home_dir, sizeof home_dir, "/tmp/kiln-cfg-XXXXXX");
    cr_assert_not_null(mkdtemp(home_dir));
    atexit(remove_home);
    setenv("XDG_CONFIG_HOME", home_dir, 1);
    unsetenv("KILN_URL");
    unsetenv("KILN_TOKEN");
    unsetenv("KILN_TLS_CA");
    unsetenv("KILN_PROFILE");
    snprintf(path, sizeof path, "%s/kiln/config.json", home_dir);
    return path;
}

static void write_file(const char *path, const char *text, mode_t mode)
{
    char dir[256];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    *slash = '\0';
    mkdir(dir, 0700);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert(fd >= 0, "%s", path);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    cr_assert_eq(chmod(path, mode), 0);
}

/* Two profiles: "default" (current) for https://a.example:8443 with a CA, "other" for b. */
static const char *two_profiles(void)
{
    const char *path = fresh_home();
    write_file(path,
               "{\"current\": \"default\", \"profiles\": {"
               "\"default\": {\"url\": \"https://a.example:8443/\", \"token\": \"" TOKEN_A "\", \"ca\": \"/etc/a-ca.pem\"},"
               "\"other\": {\"url\": \"b.example:8080\", \"token\": \"" TOKEN_B "\"}}, \"editor\": \"vi\"}",
               0600);
    return path;
}

static int resolve(cli_settings_t *s, kiln_err_t *err, const char *url, const char *ca, const char *profile,
                   const char *token_file)
{
    cli_globals_t g = {.url = url, .tls_ca = ca, .profile = profile, .token_file = token_file};
    kiln_err_clear(err);
    return cli_settings_resolve(&g, s, err);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

/* ---- global options ----------------------------------------------------------------------------- */

Test(cli_globals, anywhere_before_the_double_dash)
{
    char *argv[] = {"kiln", "--url", "https://k:1", "tokens", "--json", "create", "--tls-ca=/ca.pem", "bob",
                    "--profile", "prod", "--token-file", "/t", "--", "--url", NULL};
    int argc = 14;
    char *args[16];
    int n = 0;
    cli_globals_t g;
    cr_assert_eq(cli_parse_globals(argc, argv, &g, args, &n), 0);
    cr_assert_str_eq(g.url, "https://k:1");
    cr_assert_str_eq(g.tls_ca, "/ca.pem");
    cr_assert_str_eq(g.profile, "prod");
    cr_assert_str_eq(g.token_file, "/t");
    cr_assert_str_eq(g.output, "json");
    cr_assert_eq(n, 5);
    const char *want[] = {"tokens", "create", "bob", "--", "--url"};
    for (int i = 0; i < 5; i++)
        cr_assert_str_eq(args[i], want[i]);
    /* Command options stay with the command. */
    char *argv2[] = {"kiln", "tokens", "create", "--expires-in", "1h", "--description", "x", NULL};
    cr_assert_eq(cli_parse_globals(7, argv2, &g, args, &n), 0);
    cr_assert_eq(n, 6);
    cr_assert_null(g.url);
    cr_assert_null(g.output);
    /* -o FORMAT in kubectl's spellings; a value that is no format stays with the command */
    const char *forms[][3] = {{"-o", "yaml", "yaml"}, {"-owide", NULL, "wide"}, {"--output", "json", "json"},
                              {"--output=table", NULL, "table"}};
    for (size_t i = 0; i < 4; i++) {
        char *av[] = {"kiln", "jobs", (char *)forms[i][0], (char *)forms[i][1], NULL};
        cr_assert_eq(cli_parse_globals(forms[i][1] ? 4 : 3, av, &g, args, &n), 0);
        cr_assert_str_eq(g.output, forms[i][2], "%s", forms[i][0]);
        cr_assert_eq(n, 1);
    }
    char *av3[] = {"kiln", "artifacts", "x", "-o", "model.bin", NULL};
    cr_assert_eq(cli_parse_globals(5, av3, &g, args, &n), 0);
    cr_assert_null(g.output);
    cr_assert_eq(n, 4);
    cli_output_t o;
    cr_assert(cli_output_parse("yaml", &o) && o == CLI_OUT_YAML);
    cr_assert(!cli_output_parse("xml", &o));
}

Test(cli_globals, missing_values_and_tokens_as_arguments_are_usage_errors, .init = cr_redirect_stderr)
{
    char *args[8];
    int n;
    cli_globals_t g;
    char *a1[] = {"kiln", "jobs", "--url", NULL};
    cr_assert_eq(cli_parse_globals(3, a1, &g, args, &n), 2);
    char *a2[] = {"kiln", "--profile=", "jobs", NULL};
    cr_assert_eq(cli_parse_globals(3, a2, &g, args, &n), 2);
    char *a3[] = {"kiln", "--token", TOKEN_A, "jobs", NULL};
    cr_assert_eq(cli_parse_globals(4, a3, &g, args, &n), 2);
    char *a4[] = {"kiln", "jobs", "--token=" TOKEN_A, NULL};
    cr_assert_eq(cli_parse_globals(3, a4, &g, args, &n), 2);
    fflush(stderr);
    char buf[4096] = "";
    size_t len = fread(buf, 1, sizeof buf - 1, cr_get_redirected_stderr());
    buf[len] = '\0';
    cr_assert(strstr(buf, "--url needs a value") && strstr(buf, "--profile needs a value"), "%s", buf);
    cr_assert(strstr(buf, "kiln takes no --token") && strstr(buf, "--token-file"), "%s", buf);
    cr_assert_null(strstr(buf, TOKEN_A), "the refused token was echoed: %s", buf);
}

Test(cli_globals, durations)
{
    int64_t s = 0;
    cr_assert(cli_parse_duration("3600s", &s) && s == 3600);
    cr_assert(cli_parse_duration("3600", &s) && s == 3600);
    cr_assert(cli_parse_duration("90m", &s) && s == 5400);
    cr_assert(cli_parse_duration("12h", &s) && s == 43200);
    cr_assert(cli_parse_duration("30d", &s) && s == 30 * 86400);
    const char *bad[] = {"", "0", "0s", "-1h", "1.5h", "5x", "h", "12 h", "1hh", "99999999999999999999d", "40000d"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert(!cli_parse_duration(bad[i], &s), "accepted \"%s\"", bad[i]);
}

Test(cli_globals, urls_are_normalised)
{
    char b[128];
    cr_assert_str_eq(cli_url_normalize("127.0.0.1:8080", b, sizeof b), "https://127.0.0.1:8080");
    cr_assert_str_eq(cli_url_normalize("https://k.example:8443//", b, sizeof b), "https://k.example:8443");
    cr_assert_str_eq(cli_url_normalize("", b, sizeof b), "");
    cr_assert_str_eq(cli_url_normalize(NULL, b, sizeof b), "");
}

/* ---- the config file ------------------------------------------------------------------------------ */

Test(cli_config, path_follows_xdg_then_home)
{
    char p[512];
    kiln_err_t err;
    setenv("XDG_CONFIG_HOME", "/x/cfg", 1);
    cr_assert_eq(cli_config_path(p, sizeof p, &err), 0);
    cr_assert_str_eq(p, "/x/cfg/kiln/config.json");
    setenv("XDG_CONFIG_HOME", "relative/cfg", 1); /* ignored, as the XDG rules say */
    setenv("HOME", "/home/ann", 1);
    cr_assert_eq(cli_config_path(p, sizeof p, &err), 0);
    cr_assert_str_eq(p, "/home/ann/.config/kiln/config.json");
    unsetenv("XDG_CONFIG_HOME");
    cr_assert_eq(cli_config_path(p, sizeof p, &err), 0);
    cr_assert_str_eq(p, "/home/ann/.config/kiln/config.json");
}

Test(cli_config, saved_private_whatever_the_umask)
{
    const char *path = fresh_home();
    umask(0); /* the most permissive: the file and directory must still be private */
    json_t *cfg = json_pack("{s:s, s:{s:{s:s, s:s}}}", "current", "default", "profiles", "default", "url",
                            "https://k:1", "token", TOKEN_A);
    kiln_err_t err;
    kiln_err_clear(&err);
    cr_assert_eq(cli_config_save(path, cfg, &err), 0, "%s", err.message);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0600, "file mode %o", st.st_mode & 07777);
    char dir[256];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = '\0';
    cr_assert_eq(stat(dir, &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0700, "directory mode %o", st.st_mode & 07777);
    json_t *back = NULL;
    cr_assert_eq(cli_config_load(path, &back, &err), 0, "%s", err.message);
    cr_assert(json_equal(cfg, back));
    json_decref(back);
    json_decref(cfg);
}

Test(cli_config, replaced_atomically_keeping_what_it_does_not_know)
{
    const char *path = two_profiles();
    struct stat before, after;
    cr_assert_eq(stat(path, &before), 0);
    json_t *cfg = NULL;
    kiln_err_t err;
    cr_assert_eq(cli_config_load(path, &cfg, &err), 0, "%s", err.message);
    json_object_del(json_object_get(json_object_get(cfg, "profiles"), "other"), "token");
    cr_assert_eq(cli_config_save(path, cfg, &err), 0, "%s", err.message);
    json_decref(cfg);
    /* A new file took the old one's name (rename), so a reader sees the old or the new, whole. */
    cr_assert_eq(stat(path, &after), 0);
    cr_assert_neq(before.st_ino, after.st_ino);
    cr_assert_eq(after.st_mode & 07777, 0600);
    /* Nothing left beside it. */
    char dir[256], cmd[400];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = '\0';
    snprintf(cmd, sizeof cmd, "test \"$(ls -A %s)\" = config.json", dir);
    cr_assert_eq(system(cmd), 0, "temporary files left in %s", dir);
    const char *text = slurp(path);
    cr_assert(strstr(text, TOKEN_A) && !strstr(text, TOKEN_B), "%s", text);
    cr_assert(strstr(text, "\"editor\": \"vi\""), "an unknown key was lost: %s", text);
}

Test(cli_config, a_stale_temporary_file_does_not_leak_its_mode)
{
    const char *path = fresh_home();
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    write_file(tmp, "old", 0644);
    json_t *cfg = json_pack("{s:{}}", "profiles");
    kiln_err_t err;
    cr_assert_eq(cli_config_save(path, cfg, &err), 0, "%s", err.message);
    json_decref(cfg);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0600, "mode %o", st.st_mode & 07777);
}

Test(cli_config, a_missing_file_is_empty)
{
    const char *path = fresh_home();
    json_t *cfg = NULL;
    kiln_err_t err;
    cr_assert_eq(cli_config_load(path, &cfg, &err), 0);
    cr_assert(json_is_object(json_object_get(cfg, "profiles")));
    cr_assert_eq(json_object_size(json_object_get(cfg, "profiles")), 0);
    json_decref(cfg);
}

Test(cli_config, a_file_others_can_read_is_refused)
{
    const char *path = two_profiles();
    static const mode_t modes[] = {0644, 0640, 0604, 0620, 0601};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        cr_assert_eq(chmod(path, modes[i]), 0);
        json_t *cfg = NULL;
        kiln_err_t err;
        kiln_err_clear(&err);
        cr_assert_eq(cli_config_load(path, &cfg, &err), KILN_EPERM, "mode %o accepted", modes[i]);
        cr_assert_null(cfg);
        cr_assert(strstr(err.message, path) && strstr(err.message, "other users"), "%s", err.message);
        char want[300];
        snprintf(want, sizeof want, "chmod 600 %s", path);
        cr_assert(strstr(err.hint, want), "%s", err.hint);
        /* and so is every command that would read it */
        cli_settings_t s;
        cr_assert_eq(resolve(&s, &err, NULL, NULL, NULL, NULL), KILN_EPERM);
    }
    cr_assert_eq(chmod(path, 0400), 0);
    json_t *cfg = NULL;
    kiln_err_t err;
    cr_assert_eq(cli_config_load(path, &cfg, &err), 0, "%s", err.message);
    json_decref(cfg);
}

Test(cli_config, bad_files_are_named_without_their_text)
{
    const char *path = fresh_home();
    json_t *cfg = NULL;
    kiln_err_t err;
    /* A token cut by a line break: jansson's own message would quote it ("unexpected newline
     * near '"kiln_AAAA...'"); kiln's gives the position only. */
    write_file(path, "{\"profiles\": {\"default\": {\"token\": \"kiln_AAAAsec\nretAAAA\"}}}", 0600);
    kiln_err_clear(&err);
    cr_assert_eq(cli_config_load(path, &cfg, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "not valid JSON (line 1, column"), "%s", err.message);
    cr_assert_null(strstr(err.message, "AAAA"), "%s", err.message);
    cr_assert_null(strstr(err.detail, "AAAA"), "%s", err.detail);
    cr_assert_null(strstr(err.hint, "AAAA"), "%s", err.hint);
    static const char *const shapes[] = {"[1]", "{\"profiles\": []}", "{\"current\": 3}",
                                         "{\"profiles\": {\"p\": \"x\"}}", "{\"profiles\": {\"p\": {\"url\": 8}}}"};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        write_file(path, shapes[i], 0600);
        kiln_err_clear(&err);
        cr_assert_eq(cli_config_load(path, &cfg, &err), KILN_EINVAL, "accepted %s", shapes[i]);
        cr_assert(strstr(err.message, path), "%s", err.message);
    }
}

/* ---- precedence: flags > environment > profile ------------------------------------------------------ */

Test(cli_settings, the_current_profile_fills_what_is_not_given)
{
    two_profiles();
    cli_settings_t s;
    kiln_err_t err;
    cr_assert_eq(resolve(&s, &err, NULL, NULL, NULL, NULL), 0, "%s", err.message);
    cr_assert_str_eq(s.url, "https://a.example:8443");
    cr_assert_str_eq(s.token, TOKEN_A);
    cr_assert_str_eq(s.ca_file, "/etc/a-ca.pem");
    cr_assert_eq(s.url_from, CLI_FROM_PROFILE);
    cr_assert_eq(s.token_from, CLI_FROM_PROFILE);
    cr_assert_eq(s.ca_from, CLI_FROM_PROFILE);
    cr_assert_str_eq(s.profile, "default");
    cr_assert(s.profile_exists && !s.profile_chosen);
}

Test(cli_settings, environment_beats_the_profile_and_flags_beat_both)
{
    two_profiles();
    char tokfile[] = "/tmp/kiln-tok-XXXXXX";
    int fd = mkstemp(tokfile);
    cr_assert(write(fd, "  kiln_FILEtoken\n", 17) == 17);
    close(fd);
    cli_settings_t s;
    kiln_err_t err;
    setenv("KILN_TOKEN", "kiln_ENVtoken", 1);
    setenv("KILN_TLS_CA", "/env-ca.pem", 1);
    cr_assert_eq(resolve(&s, &err, NULL, NULL, NULL, NULL), 0);
    cr_assert_str_eq(s.token, "kiln_ENVtoken");
    cr_assert_eq(s.token_from, CLI_FROM_ENV);
    cr_assert_str_eq(s.ca_file, "/env-ca.pem");
    cr_assert_str_eq(s.url, "https://a.example:8443"); /* still the profile's */
    cr_assert_eq(resolve(&s, &err, NULL, "/flag-ca.pem", NULL, tokfile), 0, "%s", err.message);
    cr_assert_str_eq(s.token, "kiln_FILEtoken");
    cr_assert_eq(s.token_from, CLI_FROM_FLAG);
    cr_assert_str_eq(s.token_file, tokfile);
    cr_assert_str_eq(s.ca_file, "/flag-ca.pem");
    cr_assert_eq(s.ca_from, CLI_FROM_FLAG);
    /* The same URL as the profile's, spelled with a trailing slash: still the profile. */
    unsetenv("KILN_TOKEN");
    setenv("KILN_URL", "https://a.example:8443/", 1);
    cr_assert_eq(resolve(&s, &err, NULL, NULL, NULL, NULL), 0);
    cr_assert_eq(s.url_from, CLI_FROM_ENV);
    cr_assert_str_eq(s.token, TOKEN_A);
    unlink(tokfile);
}

Test(cli_settings, a_profile_token_goes_only_to_its_own_url)
{
    two_profiles();
    cli_settings_t s;
    kiln_err_t err;
    cr_assert_eq(resolve(&s, &err, "https://evil.example", NULL, NULL, NULL), 0);
    cr_assert_str_eq(s.url, "https://evil.example");
    cr_assert_str_eq(s.token, "");
    cr_assert_eq(s.token_from, CLI_FROM_NONE);
    cr_assert_str_eq(s.ca_file, "");
    cr_assert(s.profile_other_url);
    setenv("KILN_URL", "http://a.example:8443", 1); /* plain text to the same host: another URL */
    cr_assert_eq(resolve(&s, &err, NULL, NULL, NULL, NULL), 0);
    cr_assert_str_eq(s.token, "");
    /* After a 401 kiln says why no token went, and never shows one. */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cli_print_auth_note(f, &s);
    fclose(f);
    cr_assert(strstr(text, "profile \"default\" holds the login for https://a.example:8443, not for "
                           "http://a.example:8443"), "%s", text);
    cr_assert(strstr(text, "kiln login --url http://a.example:8443"), "%s", text);
    cr_assert_null(strstr(text, "AAAA"));
    free(text);
}

Test(cli_settings, choosing_a_profile)
{
    two_profiles();
    cli_settings_t s;
    kiln_err_t err;
    setenv("KILN_PROFILE", "other", 1);
    cr_assert_eq(resolve(&s, &err, NULL, NULL, NULL, NULL), 0);
    cr_assert_str_eq(s.profile, "other");
    cr_assert(s.profile_chosen);
    cr_assert_str_eq(s.url, "https://b.example:8080");
    cr_assert_str_eq(s.token, TOKEN_B);
    cr_assert_str_eq(s.ca_file, "");
    cr_assert_eq(resolve(&s, &err, NULL, NULL, "default", NULL), 0); /* --profile beats KILN_PROFILE */
    cr_assert_str_eq(s.token, TOKEN_A);
    cr_assert_eq(resolve(&s, &err, NULL, NULL, "nope", NULL), 0);
    cr_assert(!s.profile_exists);
    cr_assert_str_eq(s.token, "");
    cr_assert_eq(s.url_from, CLI_FROM_DEFAULT);
}

Test(cli_settings, flags_and_environment_alone_need_no_file)
{
    const char *path = two_profiles();
    cr_assert_eq(chmod(path, 0644), 0); /* would be refused if it were read */
    setenv("KILN_URL", "https://k:1", 1);
    setenv("KILN_TOKEN", "kiln_x", 1);
    setenv("KILN_TLS_CA", "/ca.pem", 1);
    cli_settings_t s;
    kiln_err_t err;
    cr_assert_eq(resolve(&s, &err, NULL, NULL, NULL, NULL), 0, "%s", err.message);
    cr_assert_str_eq(s.config_path, "");
    cr_assert_eq(resolve(&s, &err, NULL, NULL, "default", NULL), KILN_EPERM);
}

Test(cli_settings, no_file_means_the_default_url_and_no_token)
{
    fresh_home();
    cli_settings_t s;
    kiln_err_t err;
    cr_assert_eq(resolve(&s, &err, NULL, NULL, NULL, NULL), 0);
    cr_assert_str_eq(s.url, CLI_DEFAULT_URL);
    cr_assert_eq(s.url_from, CLI_FROM_DEFAULT);
    cr_assert_eq(s.token_from, CLI_FROM_NONE);
}

Test(cli_settings, token_files_and_text)
{
    fresh_home();
    char out[512];
    kiln_err_t err;
    cr_assert_eq(cli_token_parse("\n  kiln_abc-_1 \r\n", "stdin", out, sizeof out, &err), 0);
    cr_assert_str_eq(out, "kiln_abc-_1");
    kiln_err_clear(&err);
    cr_assert_eq(cli_token_parse(" \n", "stdin", out, sizeof out, &err), KILN_EINVAL);
    cr_assert_str_eq(err.message, "no token in stdin");
    kiln_err_clear(&err);
    cr_assert_eq(cli_token_parse("kiln_ab secretword", "stdin", out, sizeof out, &err), KILN_EINVAL);
    cr_assert_null(strstr(err.message, "secretword"), "%s", err.message);
    char big[400];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    cr_assert_eq(cli_token_parse(big, "stdin", out, sizeof out, &err), KILN_EINVAL);
    /* --token-file: missing and empty files are errors that name the file. */
    cli_settings_t s;
    cr_assert_eq(resolve(&s, &err, NULL, NULL, NULL, "/nonexistent/tok"), KILN_EINVAL);
    cr_assert(strstr(err.message, "/nonexistent/tok"), "%s", err.message);
    char tokfile[] = "/tmp/kiln-tok-XXXXXX";
    close(mkstemp(tokfile));
    cr_assert_eq(resolve(&s, &err, NULL, NULL, NULL, tokfile), KILN_EINVAL);
    cr_assert(strstr(err.message, "no token in token file"), "%s", err.message);
    unlink(tokfile);
}

Test(cli_settings, the_401_note_names_the_source_of_the_token)
{
    const char *path = two_profiles();
    cli_settings_t s;
    kiln_err_t err;
    struct {
        const char *env_token;
        const char *want;
    } cases[] = {
        {NULL, "kiln sent the token of profile \"default\""},
        {"kiln_ENV", "kiln sent the token of KILN_TOKEN"},
    };
    for (size_t i = 0; i < 2; i++) {
        if (cases[i].env_token)
            setenv("KILN_TOKEN", cases[i].env_token, 1);
        cr_assert_eq(resolve(&s, &err, NULL, NULL, NULL, NULL), 0);
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        cli_print_auth_note(f, &s);
        fclose(f);
        cr_assert(strstr(text, cases[i].want), "%s", text);
        cr_assert(strstr(text, "kiln login"), "%s", text);
        cr_assert_null(strstr(text, "AAAA"), "%s", text);
        cr_assert_null(strstr(text, "kiln_ENV"), "%s", text);
        if (i == 0)
            cr_assert(strstr(text, path), "%s", text);
        free(text);
    }
}

/* ---- identity tables ---------------------------------------------------------------------------------- */

static char *render(void (*fn)(FILE *, const json_t *, const json_t *), const char *a, const char *b)
{
    json_t *ja = json_loads(a, 0, NULL), *jb = b ? json_loads(b, 0, NULL) : NULL;
    cr_assert_not_null(ja, "bad fixture %s", a);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    fn(f, ja, jb);
    fclose(f);
    json_decref(ja);
    json_decref(jb);
    return text;
}

static void whoami_fn(FILE *f, const json_t *a, const json_t *b)
{
    (void)b;
    cli_print_whoami(f, a, "https://k:1", "KILN_TOKEN");
}

static void tokens_fn(FILE *f, const json_t *a, const json_t *b)
{
    (void)b;
    int64_t now = 0;
    kiln_time_parse("2026-11-24T12:00:00Z", &now);
    cli_print_tokens(f, a, now);
}

static void projects_fn(FILE *f, const json_t *a, const json_t *b) { cli_print_projects(f, a, b); }
static void members_fn(FILE *f, const json_t *a, const json_t *b) { (void)b; cli_print_members(f, a); }
static void users_fn(FILE *f, const json_t *a, const json_t *b) { (void)b; cli_print_users(f, a); }

Test(cli_identity_format, whoami_page)
{
    char *out = render(whoami_fn,
                       "{\"user\": \"alice\", \"cluster_admin\": false, \"token_id\": \"tok_1\","
                       " \"token_expires_at\": \"2026-12-01T10:00:00.000Z\","
                       " \"projects\": [{\"project\": \"ml\", \"role\": \"viewer\"}, {\"project\": \"nlp-x\", \"role\": \"admin\"}]}",
                       NULL);
    cr_assert_str_eq(out, "User:         alice\n"
                          "Token:        tok_1, expires 2026-12-01 10:00:00 UTC\n"
                          "kilnd:        https://k:1\n"
                          "Login:        KILN_TOKEN\n"
                          "Projects:\n"
                          "  PROJECT  ROLE\n"
                          "  ml       viewer\n"
                          "  nlp-x    admin\n");
    free(out);
    out = render(whoami_fn, "{\"user\": \"admin\", \"cluster_admin\": true, \"token_id\": \"tok_2\","
                            " \"token_expires_at\": \"\", \"projects\": []}", NULL);
    cr_assert(strstr(out, "User:         admin (cluster admin)\n") && strstr(out, "tok_2, does not expire"), "%s", out);
    cr_assert(strstr(out, "Projects:     none as a member"), "%s", out);
    free(out);
}

Test(cli_identity_format, tokens_table_states)
{
    char *out = render(tokens_fn,
                       "{\"tokens\": ["
                       "{\"id\": \"tok_a\", \"user\": \"al\", \"description\": \"ci\", \"created_at\": \"2026-11-20T00:00:00Z\","
                       " \"expires_at\": null, \"revoked_at\": null, \"last_used_at\": \"2026-11-24T11:58:00Z\", \"kind\": \"api\"},"
                       "{\"id\": \"tok_b\", \"user\": \"al\", \"description\": \"\", \"created_at\": \"2026-11-20T00:00:00Z\","
                       " \"expires_at\": \"2026-11-21T00:00:00Z\", \"revoked_at\": null, \"last_used_at\": null},"
                       "{\"id\": \"tok_c\", \"user\": \"al\", \"description\": \"old\", \"created_at\": \"2026-11-20T00:00:00Z\","
                       " \"expires_at\": \"2027-01-01T00:00:00Z\", \"revoked_at\": \"2026-11-22T00:00:00Z\", \"last_used_at\": null},"
                       "{\"id\": \"tok_d\", \"user\": \"al\", \"description\": \"web\", \"created_at\": \"2026-11-24T11:00:00Z\","
                       " \"expires_at\": \"2026-11-24T23:00:00Z\", \"revoked_at\": null, \"last_used_at\": null,"
                       " \"kind\": \"session\", \"created_by\": \"al\", \"parent_id\": \"tok_a\"}]}",
                       NULL);
    /* lineage: who made each token, with which token ("-": none, as for tokens older than it) */
    cr_assert(!strncmp(out, "ID     USER  KIND     STATE    CREATED              EXPIRES              LAST-USED  "
                            "CREATED-BY  PARENT  DESCRIPTION\n", 115), "%s", out);
    cr_assert(strstr(out, "tok_a  al    api      active   2026-11-20 00:00:00  never                2m00s ago  -           "
                          "-       ci\n"), "%s", out);
    cr_assert(strstr(out, "tok_b  al    -        expired  2026-11-20 00:00:00  2026-11-21 00:00:00  never      -           "
                          "-       -\n"), "%s", out);
    cr_assert(strstr(out, "tok_c  al    -        revoked"), "%s", out); /* no kind: an older kilnd's reply */
    cr_assert(strstr(out, "tok_d  al    session  active   2026-11-24 11:00:00  2026-11-24 23:00:00  never      al          "
                          "tok_a   web\n"), "%s", out);
    free(out);
    out = render(tokens_fn, "{\"tokens\": []}", NULL);
    cr_assert_str_eq(out, "no tokens\n");
    free(out);
}

Test(cli_identity_format, projects_members_users)
{
    /* A member's listing carries roles; a cluster admin's does not, and whoami fills them in. */
    char *out = render(projects_fn, "{\"projects\": [{\"name\": \"ml\", \"role\": \"viewer\", \"created_at\": "
                                    "\"2026-11-20T00:00:00Z\", \"created_by\": \"admin\", \"default_queue\": \"nlp\"}]}",
                       NULL);
    cr_assert_str_eq(out, "NAME  ROLE    DEFAULT-QUEUE  CREATED              CREATED-BY\n"
                          "ml    viewer  nlp            2026-11-20 00:00:00  admin\n");
    free(out);
    out = render(projects_fn,
                 "{\"projects\": [{\"name\": \"ml\", \"role\": \"\"}, {\"name\": \"default\", \"role\": \"\"}]}",
                 "{\"user\": \"root\", \"cluster_admin\": true, \"projects\": [{\"project\": \"ml\", \"role\": \"editor\"}]}");
    cr_assert(strstr(out, "\nml       editor           "), "%s", out);
    cr_assert(strstr(out, "\ndefault  (cluster admin)  "), "%s", out);
    free(out);
    out = render(projects_fn, "{\"projects\": []}", "{\"cluster_admin\": false}");
    cr_assert(!strncmp(out, "no projects (a project admin adds you", 37), "%s", out);
    free(out);
    out = render(members_fn, "{\"members\": [{\"project\": \"ml\", \"user\": \"alice\", \"role\": \"viewer\"}]}", NULL);
    cr_assert_str_eq(out, "USER   ROLE\nalice  viewer\n");
    free(out);
    out = render(users_fn, "{\"users\": [{\"name\": \"admin\", \"cluster_admin\": true, \"created_at\": "
                           "\"2026-11-20T00:00:00Z\", \"created_by\": \"bootstrap\"}, {\"name\": \"bo\", "
                           "\"cluster_admin\": false, \"created_at\": \"2026-11-21T00:00:00Z\", \"created_by\": \"admin\"}]}",
                 NULL);
    cr_assert_str_eq(out, "NAME   CLUSTER-ADMIN  CREATED              CREATED-BY\n"
                          "admin  yes            2026-11-20 00:00:00  bootstrap\n"
                          "bo     no             2026-11-21 00:00:00  admin\n");
    free(out);
}

/* ---- commands without a server ------------------------------------------------------------------------- */

static int run_cli(const char **argv)
{
    int argc = 0;
    while (argv[argc])
        argc++;
    return cli_main(argc, (char **)argv);
}

static char *captured_stderr(void)
{
    fflush(stderr);
    static char buf[16384];
    size_t n = fread(buf, 1, sizeof buf - 1, cr_get_redirected_stderr());
    buf[n] = '\0';
    return buf;
}

Test(cli_identity_main, usage_errors_exit_2, .init = cr_redirect_stderr)
{
    fresh_home();
    const char *const *cases[] = {
        (const char *[]){"kiln", "tokens", "frobnicate", NULL},
        (const char *[]){"kiln", "tokens", "create", "--expires-in", "5x", NULL},
        (const char *[]){"kiln", "tokens", "create", "--expires-in", NULL},
        (const char *[]){"kiln", "tokens", "create", "a", "b", NULL},
        (const char *[]){"kiln", "tokens", "revoke", NULL},
        (const char *[]){"kiln", "tokens", "list", "bob", NULL},
        (const char *[]){"kiln", "users", "create", NULL},
        (const char *[]){"kiln", "users", "create", "bo", "--admin", NULL},
        (const char *[]){"kiln", "projects", "add-member", "ml", "bo", NULL},
        (const char *[]){"kiln", "projects", "remove-member", "ml", NULL},
        (const char *[]){"kiln", "projects", "members", NULL},
        (const char *[]){"kiln", "projects", "create", "a", "b", NULL},
        (const char *[]){"kiln", "whoami", "me", NULL},
        (const char *[]){"kiln", "login", "https://k:1", NULL},
        (const char *[]){"kiln", "logout", "--now", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_assert_eq(run_cli((const char **)cases[i]), 2, "case %zu (%s %s)", i, cases[i][1], cases[i][2]);
    char *err = captured_stderr();
    cr_assert(strstr(err, "usage: kiln tokens [list] [--user U]\n"
                          "       kiln tokens create [USER] [--expires-in D] [--description TEXT]\n"
                          "       kiln tokens revoke ID\n"), "%s", err);
    cr_assert(strstr(err, "--expires-in takes a duration such as 3600s, 90m, 12h or 30d"), "%s", err);
}

Test(cli_identity_main, help_lists_the_identity_commands_and_options, .init = cr_redirect_stdout)
{
    fresh_home();
    cr_assert_eq(run_cli((const char *[]){"kiln", "help", NULL}), 0);
    cr_assert_eq(run_cli((const char *[]){"kiln", "tokens", "--help", NULL}), 0);
    cr_assert_eq(run_cli((const char *[]){"kiln", "help", "login", NULL}), 0);
    fflush(stdout);
    char buf[32768];
    size_t n = fread(buf, 1, sizeof buf - 1, cr_get_redirected_stdout());
    buf[n] = '\0';
    static const char *const want[] = {
        "  login     ", "  logout    ", "  whoami    ", "  users     ", "  tokens    ", "  projects  ",
        "--tls-ca FILE", "--profile NAME", "--token-file FILE", "usage: kiln tokens [list] [--user U]",
        "kiln tokens create", "mode 0600", "kiln login --url https://kilnd:8080 --tls-ca ca.pem < admin.token",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_assert(strstr(buf, want[i]), "help lacks \"%s\":\n%s", want[i], buf);
}

Test(cli_identity_main, an_unknown_named_profile_is_an_error, .init = cr_redirect_stderr)
{
    two_profiles();
    cr_assert_eq(run_cli((const char *[]){"kiln", "--profile", "nope", "whoami", NULL}), 3, "not found");
    char *err = captured_stderr();
    cr_assert(strstr(err, "error: no profile \"nope\" in ") && strstr(err, "kiln login --profile nope"), "%s", err);
}

Test(cli_identity_main, a_config_others_can_read_stops_every_command, .init = cr_redirect_stderr)
{
    const char *path = two_profiles();
    cr_assert_eq(chmod(path, 0644), 0);
    cr_assert_eq(run_cli((const char *[]){"kiln", "jobs", NULL}), 1);
    char *err = captured_stderr();
    char want[300];
    snprintf(want, sizeof want, "hint: chmod 600 %s", path);
    cr_assert(strstr(err, want), "%s", err);
    cr_assert_null(strstr(err, "AAAA"));
}

/* stdin from a file for kiln login. */
static void stdin_from(const char *text)
{
    char path[] = "/tmp/kiln-stdin-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    lseek(fd, 0, SEEK_SET);
    dup2(fd, 0);
    close(fd);
    unlink(path);
}

Test(cli_identity_main, login_saves_nothing_when_the_token_is_not_checked, .init = cr_redirect_stderr)
{
    const char *path = fresh_home();
    stdin_from("kiln_NEWsecret\n");
    cr_assert_eq(run_cli((const char *[]){"kiln", "--url", "http://127.0.0.1:1", "login", NULL}), 6, "unreachable");
    char *err = captured_stderr();
    cr_assert(strstr(err, "could not connect to kilnd at http://127.0.0.1:1"), "%s", err);
    cr_assert(strstr(err, "could not check the token; nothing was saved"), "%s", err);
    cr_assert_null(strstr(err, "NEWsecret"));
    cr_assert_neq(access(path, F_OK), 0, "a config file was written");
    /* No token at all. */
    stdin_from("");
    cr_assert_eq(run_cli((const char *[]){"kiln", "--url", "http://127.0.0.1:1", "login", NULL}), 1);
    cr_assert(strstr(captured_stderr(), "error: no token in stdin"));
}

Test(cli_identity_main, logout_removes_the_token_and_keeps_the_rest, .init = cr_redirect_stdout)
{
    const char *path = two_profiles();
    cr_assert_eq(run_cli((const char *[]){"kiln", "logout", NULL}), 0);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0600);
    const char *text = slurp(path);
    cr_assert_null(strstr(text, TOKEN_A), "%s", text);
    cr_assert(strstr(text, TOKEN_B) && strstr(text, "https://a.example:8443/") && strstr(text, "/etc/a-ca.pem"),
              "%s", text);
    cr_assert_eq(run_cli((const char *[]){"kiln", "logout", NULL}), 0); /* nothing left to remove */
    cr_assert_eq(run_cli((const char *[]){"kiln", "--profile", "other", "logout", NULL}), 0);
    cr_assert_null(strstr(slurp(path), TOKEN_B));
}

Test(cli_identity_main, logout_revoke_keeps_a_token_it_could_not_revoke, .init = cr_redirect_stderr)
{
    const char *path = fresh_home();
    write_file(path, "{\"current\": \"x\", \"profiles\": {\"x\": {\"url\": \"http://127.0.0.1:1\", \"token\": \""
                     TOKEN_A "\"}}}", 0600);
    cr_assert_eq(run_cli((const char *[]){"kiln", "logout", "--revoke", NULL}), 6, "unreachable");
    cr_assert(strstr(captured_stderr(), "could not revoke the token, so it was kept"));
    cr_assert(strstr(slurp(path), TOKEN_A));
}

Test(cli_identity_main, config_lists_profiles_and_switches_the_current_one, .init = cr_redirect_stdout)
{
    const char *path = two_profiles();
    cr_assert_eq(run_cli((const char *[]){"kiln", "config", "get-profiles", NULL}), 0);
    cr_assert_eq(run_cli((const char *[]){"kiln", "config", "use-profile", "other", NULL}), 0);
    cr_assert(strstr(slurp(path), "\"current\": \"other\""), "%s", slurp(path));
    cr_assert_eq(run_cli((const char *[]){"kiln", "--no-headers", "config", "get-profiles", NULL}), 0);
    cr_assert_eq(run_cli((const char *[]){"kiln", "config", "use-profile", "nope", NULL}), 3, "no such profile");
    cr_assert_eq(run_cli((const char *[]){"kiln", "config", "use-profile", NULL}), 2);
    cr_assert_eq(run_cli((const char *[]){"kiln", "config", "set-profile", "x", NULL}), 2);
    fflush(stdout);
    static char out[8192];
    size_t n = fread(out, 1, sizeof out - 1, cr_get_redirected_stdout());
    out[n] = '\0';
    /* the first listing: a heading, the current one marked, URLs, never a token */
    cr_assert(strstr(out, "CURRENT  NAME     URL                      TOKEN  CA\n"
                          "*        default  https://a.example:8443/  saved  /etc/a-ca.pem\n"
                          "         other    b.example:8080           saved  -\n"),
              "%s", out);
    cr_assert(strstr(out, "now using profile \"other\""), "%s", out);
    /* the second: no heading, and "other" is current */
    const char *after = strstr(out, "now using profile \"other\"");
    cr_assert(after && strstr(after, ")\n         default  https://a.example:8443/  saved  /etc/a-ca.pem\n"
                                     "*        other    b.example:8080           saved  -\n"),
              "%s", out);
    cr_assert_null(strstr(out, TOKEN_A));
    cr_assert_null(strstr(out, TOKEN_B));
}
