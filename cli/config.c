/* config.c - where `kiln` finds kilnd and which credentials it sends: the global options, the
 * environment and the profiles of the config file ($XDG_CONFIG_HOME/kiln/config.json), resolved
 * once per run by cli_settings_resolve(); and the file itself, read (refused when others may read
 * it) and written back atomically with mode 0600. No network I/O here; kiln login and logout
 * (cmd_login.c) are the only writers. */
#include "cli/cli_int.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CLI_CONFIG_MAX (1 << 20)   /* a config file larger than this is not kiln's */
#define CLI_TOKEN_MAX 256          /* kilnd refuses longer tokens */

char *cli_url_normalize(const char *url, char *out, size_t n)
{
    if (!url || !*url) {
        if (n)
            out[0] = '\0';
        return out;
    }
    /* A bare host:port is accepted for convenience, as https: kilnd serves TLS by default. */
    snprintf(out, n, "%s%s", strstr(url, "://") ? "" : "https://", url);
    size_t len = strlen(out);
    while (len > 0 && out[len - 1] == '/')
        out[--len] = '\0';
    return out;
}

int cli_config_path(char *out, size_t n, kiln_err_t *err)
{
    /* The XDG base directory rules: a relative XDG_CONFIG_HOME is ignored. */
    const char *xdg = getenv("XDG_CONFIG_HOME");
    if (xdg && xdg[0] == '/') {
        snprintf(out, n, "%s/kiln/config.json", xdg);
        return 0;
    }
    const char *home = getenv("HOME");
    if (!home || home[0] != '/') {
        struct passwd *pw = getpwuid(getuid());
        home = pw ? pw->pw_dir : NULL;
    }
    if (!home || home[0] != '/')
        return kiln_err_set(err, KILN_EINVAL, NULL,
                            "could not find kiln's config file: neither XDG_CONFIG_HOME nor HOME is set");
    snprintf(out, n, "%s/.config/kiln/config.json", home);
    return 0;
}

/* The file's shape: {"current": "NAME"?, "profiles": {"NAME": {"url"?, "token"?, "ca"?}}}. */
static int cli_config_check(const char *path, json_t *cfg, kiln_err_t *err)
{
    if (!json_is_object(cfg))
        return kiln_err_set(err, KILN_EINVAL, NULL, "config file \"%s\" does not hold a JSON object", path);
    json_t *cur = json_object_get(cfg, "current");
    if (cur && !json_is_string(cur) && !json_is_null(cur))
        return kiln_err_set(err, KILN_EINVAL, "current", "config file \"%s\": \"current\" must be a profile name",
                            path);
    json_t *profiles = json_object_get(cfg, "profiles");
    if (!profiles) {
        json_object_set_new(cfg, "profiles", json_object());
        return 0;
    }
    if (!json_is_object(profiles))
        return kiln_err_set(err, KILN_EINVAL, "profiles", "config file \"%s\": \"profiles\" must be an object",
                            path);
    const char *name;
    json_t *p;
    json_object_foreach(profiles, name, p) {
        static const char *const keys[] = {"url", "token", "ca"};
        if (!json_is_object(p))
            return kiln_err_set(err, KILN_EINVAL, NULL, "config file \"%s\": profile \"%.60s\" must be an object",
                                path, name);
        for (size_t i = 0; i < KILN_ARRAY_LEN(keys); i++) {
            json_t *v = json_object_get(p, keys[i]);
            if (v && !json_is_string(v))
                return kiln_err_set(err, KILN_EINVAL, NULL,
                                    "config file \"%s\": profile \"%.60s\": \"%s\" must be a string", path, name,
                                    keys[i]);
        }
    }
    return 0;
}

int cli_config_load(const char *path, json_t **out, kiln_err_t *err)
{
    int rc = 0;
    char *text = NULL;
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) {
            *out = json_pack("{s:{}}", "profiles");
            return *out ? 0 : kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        }
        return kiln_err_set(err, KILN_EIO, NULL, "could not open config file \"%s\": %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not read config file \"%s\": %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = kiln_err_set(err, KILN_EINVAL, NULL, "config file \"%s\" is not a regular file", path);
        goto fail;
    }
    if (st.st_mode & 077) {
        rc = kiln_err_set(err, KILN_EPERM, NULL, "config file \"%s\" may be read by other users (mode %04o)", path,
                          (unsigned)(st.st_mode & 07777));
        kiln_err_detail(err, "it holds API tokens, so kiln uses it only when it is private to you");
        kiln_err_hint(err, "chmod 600 %s (and revoke its tokens if someone else may have read them)", path);
        goto fail;
    }
    if (st.st_size > CLI_CONFIG_MAX) {
        rc = kiln_err_set(err, KILN_EINVAL, NULL, "config file \"%s\" is larger than %d bytes", path, CLI_CONFIG_MAX);
        goto fail;
    }
    text = malloc((size_t)st.st_size + 1);
    if (!text) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto fail;
    }
    size_t len = 0;
    while (len < (size_t)st.st_size) {
        ssize_t r = read(fd, text + len, (size_t)st.st_size - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = kiln_err_set(err, KILN_EIO, NULL, "could not read config file \"%s\": %s", path, strerror(errno));
            goto fail;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    json_error_t jerr;
    *out = json_loadb(text, len, 0, &jerr);
    if (!*out) {
        /* jansson's text quotes the bytes near the error, which may be a token: position only. */
        rc = kiln_err_set(err, KILN_EINVAL, NULL, "config file \"%s\" is not valid JSON (line %d, column %d)", path,
                          jerr.line, jerr.column);
        kiln_err_hint(err, "fix it, or remove it and log in again with kiln login");
        goto fail;
    }
    rc = cli_config_check(path, *out, err);
    if (rc) {
        json_decref(*out);
        *out = NULL;
    }

fail:
    if (text) {
        memset(text, 0, (size_t)st.st_size);
        free(text);
    }
    close(fd);
    return rc;
}

int cli_config_save(const char *path, const json_t *cfg, kiln_err_t *err)
{
    char dir[1024];
    if (kiln_strlcpy(dir, path, sizeof(dir)) >= sizeof(dir))
        return kiln_err_set(err, KILN_EINVAL, NULL, "config file path too long");
    int rc = kiln_mkdirs_mode(dirname(dir), 0700, err);
    if (rc)
        return rc;
    char *text = json_dumps(cfg, JSON_INDENT(2));
    if (!text)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "could not encode the config file");
    size_t len = strlen(text);
    char *nl = realloc(text, len + 2);
    if (!nl) {
        memset(text, 0, len);
        free(text);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    text = nl;
    text[len++] = '\n';
    text[len] = '\0';
    rc = kiln_file_write_atomic_mode(path, text, len, 0600, err);
    memset(text, 0, len);
    free(text);
    return rc;
}

int cli_token_parse(const char *text, const char *what, char *out, size_t n, kiln_err_t *err)
{
    if (n)
        out[0] = '\0';
    while (*text && isspace((unsigned char)*text))
        text++;
    size_t len = strlen(text);
    while (len > 0 && isspace((unsigned char)text[len - 1]))
        len--;
    if (len == 0)
        return kiln_err_set(err, KILN_EINVAL, NULL, "no token in %s", what);
    bool printable = true;
    for (size_t i = 0; i < len; i++)
        if (!isgraph((unsigned char)text[i]))
            printable = false;
    if (!printable || len > CLI_TOKEN_MAX || len >= n) {
        kiln_err_set(err, KILN_EINVAL, NULL, "%s does not hold a token", what);
        kiln_err_detail(err, "a token is one line of at most %d printable characters without spaces", CLI_TOKEN_MAX);
        return KILN_EINVAL;
    }
    memcpy(out, text, len);
    out[len] = '\0';
    return 0;
}

static int cli_token_file_read(const char *path, char *out, size_t n, kiln_err_t *err)
{
    char *text = NULL;
    size_t len = 0;
    kiln_err_t e2;
    kiln_err_clear(&e2);
    if (kiln_file_read(path, &text, &len, &e2) != 0)
        return kiln_err_set(err, KILN_EINVAL, "token-file", "%s", e2.message);
    char what[1100];
    snprintf(what, sizeof(what), "token file \"%s\"", path);
    int rc = cli_token_parse(text, what, out, n, err);
    memset(text, 0, len);
    free(text);
    return rc;
}

static const char *cli_env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

int cli_settings_resolve(const cli_globals_t *g, cli_settings_t *s, kiln_err_t *err)
{
    int rc = 0;
    json_t *cfg = NULL;
    const char *v;
    memset(s, 0, sizeof(*s));

    if (g->url) {
        cli_url_normalize(g->url, s->url, sizeof(s->url));
        s->url_from = CLI_FROM_FLAG;
    } else if ((v = cli_env("KILN_URL"))) {
        cli_url_normalize(v, s->url, sizeof(s->url));
        s->url_from = CLI_FROM_ENV;
    }
    if (g->token_file) {
        rc = cli_token_file_read(g->token_file, s->token, sizeof(s->token), err);
        if (rc)
            return rc;
        kiln_strlcpy(s->token_file, g->token_file, sizeof(s->token_file));
        s->token_from = CLI_FROM_FLAG;
    } else if ((v = cli_env("KILN_TOKEN"))) {
        kiln_strlcpy(s->token, v, sizeof(s->token));
        s->token_from = CLI_FROM_ENV;
    }
    if (g->tls_ca) {
        kiln_strlcpy(s->ca_file, g->tls_ca, sizeof(s->ca_file));
        s->ca_from = CLI_FROM_FLAG;
    } else if ((v = cli_env("KILN_TLS_CA"))) {
        kiln_strlcpy(s->ca_file, v, sizeof(s->ca_file));
        s->ca_from = CLI_FROM_ENV;
    }
    const char *chosen = g->profile ? g->profile : cli_env("KILN_PROFILE");

    /* Flags and environment say everything: the file is not needed (nor its permissions). */
    if (s->url_from && s->token_from && s->ca_from && !chosen)
        return 0;

    rc = cli_config_path(s->config_path, sizeof(s->config_path), err);
    if (rc == 0)
        rc = cli_config_load(s->config_path, &cfg, err);
    if (rc)
        goto done;
    const char *current = json_string_value(json_object_get(cfg, "current"));
    const char *name = chosen ? chosen : current && *current ? current : "default";
    kiln_strlcpy(s->profile, name, sizeof(s->profile));
    s->profile_chosen = chosen != NULL;
    json_t *prof = json_object_get(json_object_get(cfg, "profiles"), name);
    s->profile_exists = prof != NULL;
    if (prof) {
        const char *purl = json_string_value(json_object_get(prof, "url"));
        cli_url_normalize(purl && *purl ? purl : CLI_DEFAULT_URL, s->profile_url, sizeof(s->profile_url));
        if (s->url_from && strcmp(s->url, s->profile_url) != 0) {
            /* The profile's token belongs to its kilnd: never send it to another one. */
            s->profile_other_url = true;
        } else {
            const char *tok = json_string_value(json_object_get(prof, "token"));
            const char *ca = json_string_value(json_object_get(prof, "ca"));
            if (!s->url_from) {
                kiln_strlcpy(s->url, s->profile_url, sizeof(s->url));
                s->url_from = CLI_FROM_PROFILE;
            }
            if (!s->token_from && tok && *tok) {
                kiln_strlcpy(s->token, tok, sizeof(s->token));
                s->token_from = CLI_FROM_PROFILE;
            }
            if (!s->ca_from && ca && *ca) {
                kiln_strlcpy(s->ca_file, ca, sizeof(s->ca_file));
                s->ca_from = CLI_FROM_PROFILE;
            }
        }
    }

done:
    if (rc == 0 && !s->url_from) {
        cli_url_normalize(CLI_DEFAULT_URL, s->url, sizeof(s->url));
        s->url_from = CLI_FROM_DEFAULT;
    }
    json_decref(cfg);
    return rc;
}

char *cli_token_source(const cli_settings_t *s, char *buf, size_t n)
{
    switch (s->token_from) {
    case CLI_FROM_FLAG:
        snprintf(buf, n, "--token-file %s", s->token_file);
        break;
    case CLI_FROM_ENV:
        snprintf(buf, n, "KILN_TOKEN");
        break;
    case CLI_FROM_PROFILE:
        snprintf(buf, n, "profile \"%s\" (%s)", s->profile, s->config_path);
        break;
    default:
        snprintf(buf, n, "none");
        break;
    }
    return buf;
}

void cli_print_auth_note(FILE *out, const cli_settings_t *s)
{
    char from[1200];
    if (s->token_from != CLI_FROM_NONE)
        fprintf(out, "note: kiln sent the token of %s\n", cli_token_source(s, from, sizeof(from)));
    else if (s->profile_other_url)
        fprintf(out, "note: kiln sent no token: profile \"%s\" holds the login for %s, not for %s\n", s->profile,
                s->profile_url, s->url);
    else
        fprintf(out, "note: kiln sent no token (none in --token-file, KILN_TOKEN or a saved login)\n");
    bool url_given = s->url_from == CLI_FROM_FLAG || s->url_from == CLI_FROM_ENV;
    bool ca_given = s->ca_from == CLI_FROM_FLAG || s->ca_from == CLI_FROM_ENV;
    fprintf(out, "to log in: kiln login%s%s%s%s%s%s (it reads a token on stdin and saves it for later commands)\n",
            url_given ? " --url " : "", url_given ? s->url : "", ca_given ? " --tls-ca " : "",
            ca_given ? s->ca_file : "", s->profile_chosen ? " --profile " : "", s->profile_chosen ? s->profile : "");
}

bool cli_parse_duration(const char *s, int64_t *seconds)
{
    return kiln_duration_parse(s, seconds);
}
