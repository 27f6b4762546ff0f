/* ignore.c - .kilnignore: gitignore's pattern syntax (code.h says which parts), parsed into a
 * list of patterns and matched against one path at a time. The walk that skips what is excluded
 * is pack.c's. */
#include "code/code.h"

#include <stdlib.h>
#include <string.h>

#define IGNORE_MAX_LINES 10000

typedef struct pattern {
    char *text;          /* without "!", a leading '/' or the trailing '/' */
    bool negate;         /* "!pattern": re-includes */
    bool dir_only;       /* "pattern/": matches directories only */
    bool anchored;       /* holds a '/' before its end: matched against the whole path */
} pattern_t;

struct code_ignore {
    pattern_t *v;
    size_t n, cap;
};

/* ---- matching ------------------------------------------------------------------------------- */

/* A character class at p ("[...]", p at '['): whether c is in it; *end (OUT) is past the ']'.
 * Returns -1 when p opens no class (no closing ']'): '[' is then an ordinary character. */
static int class_match(const char *p, char c, const char **end)
{
    const char *q = p + 1;
    bool neg = *q == '!' || *q == '^';
    if (neg)
        q++;
    bool in = false;
    bool first = true;
    while (*q && (*q != ']' || first)) {
        first = false;
        char lo = *q;
        if (lo == '\\' && q[1])
            lo = *++q;
        char hi = lo;
        if (q[1] == '-' && q[2] && q[2] != ']') {
            q += 2;
            hi = *q;
            if (hi == '\\' && q[1])
                hi = *++q;
        }
        if ((unsigned char)c >= (unsigned char)lo && (unsigned char)c <= (unsigned char)hi)
            in = true;
        q++;
    }
    if (*q != ']')
        return -1;
    *end = q + 1;
    return in != neg;
}

/* Whether pattern p (starting at pat) matches all of text t. "*", "?" and classes never match
 * '/'; "**" as a whole component matches any number of whole directories ("**" + "/x": x at any
 * depth; "a/" + "**": everything below a). */
static bool wildmatch(const char *pat, const char *p, const char *t)
{
    for (; *p; p++, t++) {
        switch (*p) {
        case '*': {
            bool whole = p[1] == '*' && (p == pat || p[-1] == '/') && (p[2] == '\0' || p[2] == '/');
            if (whole && p[2] == '\0')
                return true;
            if (whole) {
                /* zero or more directories, then the rest after the '/' */
                for (const char *s = t;; s++) {
                    if (wildmatch(pat, p + 3, s))
                        return true;
                    s = strchr(s, '/');
                    if (!s)
                        return false;
                }
            }
            while (*p == '*')
                p++;
            if (!*p)
                return strchr(t, '/') == NULL;
            for (const char *s = t;; s++) {
                if (wildmatch(pat, p, s))
                    return true;
                if (!*s || *s == '/')
                    return false;
            }
        }
        case '?':
            if (!*t || *t == '/')
                return false;
            break;
        case '[': {
            const char *end;
            if (!*t || *t == '/')
                return false;
            int m = class_match(p, *t, &end);
            if (m < 0) {
                if (*t != '[')
                    return false;
                break;
            }
            if (!m)
                return false;
            p = end - 1;
            break;
        }
        case '\\':
            if (p[1])
                p++;
            /* fall through */
        default:
            if (*p != *t)
                return false;
            break;
        }
    }
    return *t == '\0';
}

bool code_ignore_match(const code_ignore_t *ig, const char *path, bool is_dir)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    bool excluded = false;
    for (size_t i = 0; ig && i < ig->n; i++) {
        const pattern_t *pt = &ig->v[i];
        if (pt->dir_only && !is_dir)
            continue;
        if (excluded == !pt->negate)
            continue; /* this line could not change the answer */
        if (wildmatch(pt->text, pt->text, pt->anchored ? path : base))
            excluded = !pt->negate;
    }
    return excluded;
}

/* ---- parsing ------------------------------------------------------------------------------------ */

static int add_pattern(code_ignore_t *ig, const char *line, size_t len)
{
    /* trailing spaces go unless escaped with '\' */
    while (len > 0 && line[len - 1] == ' ' && !(len > 1 && line[len - 2] == '\\'))
        len--;
    if (len == 0 || line[0] == '#')
        return 0;
    pattern_t pt = {0};
    if (line[0] == '!') {
        pt.negate = true;
        line++;
        len--;
    }
    if (len > 0 && line[len - 1] == '/' && !(len > 1 && line[len - 2] == '\\')) {
        pt.dir_only = true;
        len--;
    }
    if (len == 0)
        return 0;
    pt.anchored = memchr(line, '/', len) != NULL;
    if (line[0] == '/') {
        line++;
        len--;
    }
    if (len == 0)
        return 0;
    if (ig->n == ig->cap) {
        size_t cap = ig->cap ? 2 * ig->cap : 16;
        pattern_t *v = realloc(ig->v, cap * sizeof(*v));
        if (!v)
            return KILN_ENOMEM;
        ig->v = v;
        ig->cap = cap;
    }
    pt.text = strndup(line, len);
    if (!pt.text)
        return KILN_ENOMEM;
    ig->v[ig->n++] = pt;
    return 0;
}

int code_ignore_parse(const char *text, size_t len, code_ignore_t **out, kiln_err_t *err)
{
    *out = NULL;
    code_ignore_t *ig = calloc(1, sizeof(*ig));
    if (!ig || add_pattern(ig, ".git/", 5)) {
        code_ignore_destroy(ig);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    size_t lineno = 0;
    for (size_t at = 0; text && at < len;) {
        const char *nl = memchr(text + at, '\n', len - at);
        size_t n = nl ? (size_t)(nl - (text + at)) : len - at;
        lineno++;
        const char *line = text + at;
        at += n + (nl ? 1 : 0);
        if (n > 0 && line[n - 1] == '\r')
            n--;
        if (lineno > IGNORE_MAX_LINES) {
            code_ignore_destroy(ig);
            return kiln_err_set(err, KILN_EINVAL, ".kilnignore", ".kilnignore has more than %d lines",
                                IGNORE_MAX_LINES);
        }
        if (kiln_utf8_check(line, n) != n || memchr(line, '\0', n)) {
            code_ignore_destroy(ig);
            return kiln_err_set(err, KILN_EINVAL, ".kilnignore", ".kilnignore line %zu is not UTF-8 text", lineno);
        }
        if (add_pattern(ig, line, n)) {
            code_ignore_destroy(ig);
            return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        }
    }
    *out = ig;
    return 0;
}

void code_ignore_destroy(code_ignore_t *ig)
{
    if (!ig)
        return;
    for (size_t i = 0; i < ig->n; i++)
        free(ig->v[i].text);
    free(ig->v);
    free(ig);
}
