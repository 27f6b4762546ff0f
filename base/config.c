/* config.c - the settings table's parser, shared by every kiln binary: command-line flags with
 * environment-variable fallbacks, each value checked against its type and range or choices.
 * Not a general option parser: long flags only, one value each. */
#include "base/base.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Whether val is one of the '|'-separated words of choices. */
static bool config_choice_ok(const char *choices, const char *val)
{
    size_t n = strlen(val);
    for (const char *p = choices; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && !strncmp(p, val, n))
            return true;
        p += len + (bar ? 1 : 0);
    }
    return false;
}

/* The range check of a number (after its type check). */
static int config_range(const config_flag_t *f, double v, const char *val, const char *origin, kiln_err_t *err)
{
    if (!(f->check.max > f->check.min) || (v >= f->check.min && v <= f->check.max))
        return 0;
    return kiln_err_set(err, KILN_EINVAL, f->name, "invalid value \"%s\" for %s: it must be %.15g to %.15g", val, origin,
                        f->check.min, f->check.max);
}

static int config_set(config_flag_t *f, const char *val, const char *origin, kiln_err_t *err)
{
    char *end = NULL;
    switch (f->type) {
    case CONFIG_STR:
        if (f->check.choices && !config_choice_ok(f->check.choices, val))
            return kiln_err_set(err, KILN_EINVAL, f->name, "invalid value \"%s\" for %s: expected one of %s", val,
                                origin, f->check.choices);
        *(const char **)f->value = val;
        return 0;
    case CONFIG_LIST: {
        config_list_t *l = f->value;
        if (l->n >= CONFIG_LIST_MAX)
            return kiln_err_set(err, KILN_EINVAL, f->name, "too many values for %s (at most %d)", origin,
                                CONFIG_LIST_MAX);
        if (!*val)
            return kiln_err_set(err, KILN_EINVAL, f->name, "empty value for %s", origin);
        l->v[l->n++] = val;
        return 0;
    }
    case CONFIG_INT: {
        errno = 0;
        long long v = strtoll(val, &end, 10);
        if (errno || end == val || *end)
            return kiln_err_set(err, KILN_EINVAL, f->name, "invalid value \"%s\" for %s: expected an integer",
                                val, origin);
        if (config_range(f, (double)v, val, origin, err))
            return KILN_EINVAL;
        *(int64_t *)f->value = v;
        return 0;
    }
    case CONFIG_DOUBLE: {
        errno = 0;
        double v = strtod(val, &end);
        if (errno || end == val || *end || v != v)
            return kiln_err_set(err, KILN_EINVAL, f->name, "invalid value \"%s\" for %s: expected a number",
                                val, origin);
        if (config_range(f, v, val, origin, err))
            return KILN_EINVAL;
        *(double *)f->value = v;
        return 0;
    }
    case CONFIG_BOOL:
        if (!strcasecmp(val, "1") || !strcasecmp(val, "true") || !strcasecmp(val, "yes") || !strcasecmp(val, "on"))
            *(bool *)f->value = true;
        else if (!strcasecmp(val, "0") || !strcasecmp(val, "false") || !strcasecmp(val, "no") || !strcasecmp(val, "off"))
            *(bool *)f->value = false;
        else
            return kiln_err_set(err, KILN_EINVAL, f->name, "invalid value \"%s\" for %s: expected true or false",
                                val, origin);
        return 0;
    }
    return KILN_EINTERNAL;
}

/* The default of f as text into buf ("" when it has none). */
static void config_default(const config_flag_t *f, char *buf, size_t n)
{
    buf[0] = '\0';
    switch (f->type) {
    case CONFIG_STR:
        if (*(const char *const *)f->value)
            snprintf(buf, n, "%s", *(const char *const *)f->value);
        break;
    case CONFIG_INT:
        snprintf(buf, n, "%" PRId64, *(const int64_t *)f->value);
        break;
    case CONFIG_DOUBLE:
        snprintf(buf, n, "%g", *(const double *)f->value);
        break;
    case CONFIG_BOOL:
        snprintf(buf, n, "%s", *(const bool *)f->value ? "true" : "false");
        break;
    case CONFIG_LIST:
        break;
    }
}

static const char *const config_type_names[] = {"str", "int", "number", "bool", "list"};

void config_usage(const char *program, const char *usage, const config_flag_t *flags, size_t n)
{
    printf("usage: %s %s\n\noptions:\n", program, usage ? usage : "[options]");
    for (size_t i = 0; i < n; i++) {
        const config_flag_t *f = &flags[i];
        char def[160], val[128], range[96] = "";
        config_default(f, val, sizeof val);
        if (f->type == CONFIG_LIST)
            snprintf(def, sizeof(def), " (repeatable)");
        else if (val[0])
            snprintf(def, sizeof(def), " (default %s)", val);
        else
            def[0] = '\0';
        if (f->check.max > f->check.min)
            snprintf(range, sizeof range, " [%.15g to %.15g]", f->check.min, f->check.max);
        else if (f->check.choices)
            snprintf(range, sizeof range, " [%s]", f->check.choices);
        printf("  --%-22s %s%s%s%s%s%s\n", f->name, f->check.test_only ? "(test builds only) " : "",
               f->help ? f->help : "", range, def, f->env ? "; env " : "", f->env ? f->env : "");
    }
    printf("  --%-22s %s\n", "print-settings", "print this table, one setting a line, tab-separated");
}

void config_print_settings(FILE *out, const config_flag_t *flags, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const config_flag_t *f = &flags[i];
        char def[128], lo[32] = "-", hi[32] = "-";
        config_default(f, def, sizeof def);
        if (f->check.max > f->check.min) {
            snprintf(lo, sizeof lo, "%.15g", f->check.min);
            snprintf(hi, sizeof hi, "%.15g", f->check.max);
        }
        fprintf(out, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t", f->name, f->env ? f->env : "-",
                config_type_names[f->type], lo, hi, f->check.choices ? f->check.choices : "-", def[0] ? def : "-",
                f->check.test_only ? 1 : 0);
        for (const char *h = f->help ? f->help : ""; *h; h++) /* one line, whatever the help holds */
            fputc(*h == '\t' || *h == '\n' ? ' ' : *h, out);
        fputc('\n', out);
    }
}

int config_parse(int argc, char **argv, config_flag_t *flags, size_t nflags,
                 const char *usage, int *npos, kiln_err_t *err)
{
    const char *program = argc > 0 ? argv[0] : "kiln";
    bool *seen = calloc(nflags ? nflags : 1, sizeof(bool));
    int pos = 0;
    int rc = 0;
    if (!seen)
        return KILN_ENOMEM;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0 || !strcmp(arg, "-") ) {
            if (!npos) {
                rc = kiln_err_set(err, KILN_EINVAL, NULL, "unexpected argument \"%s\"", arg);
                goto out;
            }
            argv[pos++] = argv[i];
            continue;
        }
        if (!strcmp(arg, "--help")) {
            config_usage(program, usage, flags, nflags);
            rc = 1;
            goto out;
        }
        if (!strcmp(arg, "--print-settings")) {
            config_print_settings(stdout, flags, nflags);
            rc = 1;
            goto out;
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        size_t k;
        for (k = 0; k < nflags; k++)
            if (strlen(flags[k].name) == nlen && !strncmp(flags[k].name, name, nlen))
                break;
        if (k == nflags) {
            rc = kiln_err_set(err, KILN_EINVAL, NULL, "unknown option \"--%.*s\"", (int)nlen, name);
            kiln_err_hint(err, "run %s --help for the list of options", program);
            goto out;
        }
        const char *val;
        if (eq)
            val = eq + 1;
        else if (flags[k].type == CONFIG_BOOL && (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0 ||
                                                   (strcasecmp(argv[i + 1], "true") && strcasecmp(argv[i + 1], "false"))))
            val = "true";
        else if (i + 1 < argc)
            val = argv[++i];
        else {
            rc = kiln_err_set(err, KILN_EINVAL, flags[k].name, "option \"--%s\" needs a value", flags[k].name);
            goto out;
        }
        char origin[160];
        snprintf(origin, sizeof(origin), "--%s", flags[k].name);
        if ((rc = config_set(&flags[k], val, origin, err)) != 0)
            goto out;
        seen[k] = true;
    }
    for (size_t k = 0; k < nflags; k++) {
        if (seen[k] || !flags[k].env)
            continue;
        const char *v = getenv(flags[k].env);
        if (!v || !*v)
            continue;
        if (flags[k].type != CONFIG_LIST) {
            if ((rc = config_set(&flags[k], v, flags[k].env, err)) != 0)
                goto out;
            continue;
        }
        /* a list from the environment: comma-separated; the pieces live as long as the process */
        char *copy = strdup(v), *save = NULL;
        if (!copy) {
            rc = KILN_ENOMEM;
            goto out;
        }
        for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
            if ((rc = config_set(&flags[k], tok, flags[k].env, err)) != 0)
                goto out;
    }
    if (npos)
        *npos = pos;
out:
    free(seen);
    return rc;
}
