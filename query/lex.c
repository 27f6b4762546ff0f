/* lex.c - the filter language's lexer: words and field paths (with quoted segments), quoted
 * strings, numbers, durations, times, operators and punctuation, one token of lookahead; and
 * the error reporter that shows the query with a caret under the offending token. It only cuts
 * text into tokens: what a word means is the parser's business (parse.c). */
#include "query/query_int.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- errors ---------------------------------------------------------------------------------- */

/* Characters (not bytes) of text[from, to): UTF-8 continuation bytes do not count. */
static int qchars(const char *text, int from, int to)
{
    int n = 0;
    for (int i = from; i < to; i++)
        n += ((unsigned char)text[i] & 0xc0) != 0x80;
    return n;
}

int qfail(qctx_t *q, int pos, int len, const char *hint, const char *fmt, ...)
{
    char msg[sizeof q->err->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (pos < 0)
        pos = 0;
    if (pos > q->len)
        pos = q->len;
    if (len < 1)
        len = 1;
    if (q->built) {
        kiln_err_set(q->err, KILN_EINVAL, q->what, "%s", msg);
    } else {
        kiln_err_set(q->err, KILN_EINVAL, q->what, "%s in %s at column %d", msg, q->what,
                     qchars(q->text, 0, pos) + 1);
        /* The query on one line (control characters as spaces), a window around the mistake
         * when it is long, and a line of carets under the token. */
        enum { WINDOW = 96 };
        int from = 0, to = q->len;
        if (qchars(q->text, 0, q->len) > WINDOW) {
            from = pos;
            for (int back = 0; from > 0 && back < WINDOW / 3; back += ((unsigned char)q->text[from] & 0xc0) != 0x80)
                from--;
            while (from > 0 && ((unsigned char)q->text[from] & 0xc0) == 0x80)
                from--;
            to = from;
            for (int c = 0; to < q->len && c < WINDOW; c += ((unsigned char)q->text[to] & 0xc0) != 0x80)
                to++;
            while (to < q->len && ((unsigned char)q->text[to] & 0xc0) == 0x80)
                to++;
        }
        char line[400], carets[300];
        size_t ll = 0, cl = 0;
        const char *dots = "...";
        if (from > 0) {
            memcpy(line, dots, 3);
            ll = 3;
        }
        for (int i = from; i < to && ll + 8 < sizeof line; i++) {
            unsigned char ch = (unsigned char)q->text[i];
            line[ll++] = ch < 0x20 || ch == 0x7f ? ' ' : (char)ch;
        }
        if (to < q->len && ll + 4 < sizeof line) {
            memcpy(line + ll, dots, 3);
            ll += 3;
        }
        line[ll] = '\0';
        int col = (from > 0 ? 3 : 0) + qchars(q->text, from, pos);
        int width = qchars(q->text, pos, KILN_MIN(pos + len, to));
        if (width < 1)
            width = 1;
        for (int i = 0; i < col && cl + 2 < sizeof carets; i++)
            carets[cl++] = ' ';
        for (int i = 0; i < width && cl + 2 < sizeof carets; i++)
            carets[cl++] = '^';
        carets[cl] = '\0';
        kiln_err_detail(q->err, "%s\n%s", line, carets);
    }
    if (hint)
        kiln_err_hint(q->err, "%s", hint);
    return KILN_EINVAL;
}

/* ---- tokens ---------------------------------------------------------------------------------- */

bool qtok_is_kw(const qtok_t *t, const char *kw)
{
    return t->kind == QK_PATH && !t->quoted && t->nsegs == 1 && !strcasecmp(t->segs[0], kw);
}

bool qtok_is_any_kw(const qtok_t *t)
{
    static const char *const kws[] = {"and", "or", "not", "in", "exists"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(kws); i++)
        if (qtok_is_kw(t, kws[i]))
            return true;
    return false;
}

const char *qtok_raw(const qctx_t *q, const qtok_t *t)
{
    return arena_strndup(q->arena, q->text + t->pos, (size_t)t->len);
}

const char *qtok_describe(const qctx_t *q, const qtok_t *t)
{
    if (t->kind == QK_EOF)
        return arena_sprintf(q->arena, "the end of the %s", q->what);
    const char *raw = qtok_raw(q, t);
    if (strlen(raw) > 40)
        return arena_sprintf(q->arena, "\"%.40s...\"", raw);
    if (qtok_is_any_kw(t))
        return arena_sprintf(q->arena, "%s", raw);
    return arena_sprintf(q->arena, "\"%s\"", raw);
}

static bool is_word_start(int c)
{
    return isalpha(c) || c == '_';
}

static bool is_word(int c)
{
    return isalnum(c) || c == '_' || c == '-';
}

/* A quoted string starting at q->at (the quote). Backslash escapes the quote character and
 * itself; any other backslash stays as it is. *out gets the content (arena). */
static int lex_quoted(qctx_t *q, const char **out)
{
    int start = q->at;
    char quote = q->text[q->at++];
    char *buf = arena_alloc(q->arena, (size_t)(q->len - start) + 1);
    size_t n = 0;
    while (q->at < q->len) {
        char c = q->text[q->at];
        if (c == quote) {
            q->at++;
            buf[n] = '\0';
            *out = buf;
            return 0;
        }
        if (c == '\\' && q->at + 1 < q->len && (q->text[q->at + 1] == quote || q->text[q->at + 1] == '\\')) {
            buf[n++] = q->text[q->at + 1];
            q->at += 2;
            continue;
        }
        buf[n++] = c;
        q->at++;
    }
    return qfail(q, start, 1, quote == '"' ? "close it with \"" : "close it with '", "unterminated string");
}

/* A field path or bare word: seg ('.' seg)*, where a seg is a word, a quoted string or '*'. */
static int lex_path(qctx_t *q, qtok_t *t)
{
    t->kind = QK_PATH;
    t->nsegs = 0;
    t->quoted = false;
    for (;;) {
        int s = q->at;
        const char *seg = NULL;
        char c = q->text[q->at];
        if (c == '"' || c == '\'') {
            int rc = lex_quoted(q, &seg);
            if (rc)
                return rc;
            t->quoted = true;
        } else if (c == '*') {
            q->at++;
            seg = "*";
        } else if (is_word_start((unsigned char)c)) {
            while (q->at < q->len && is_word((unsigned char)q->text[q->at]))
                q->at++;
            seg = arena_strndup(q->arena, q->text + s, (size_t)(q->at - s));
        } else {
            return qfail(q, s, 1, "after a '.' comes a name, a quoted name or *",
                         "expected a name after '.'");
        }
        if (t->nsegs == QTOK_MAX_SEGS)
            return qfail(q, t->pos, q->at - t->pos, NULL, "too many parts in a name");
        t->segs[t->nsegs++] = seg;
        if (q->at < q->len && q->text[q->at] == '.') {
            q->at++;
            continue;
        }
        break;
    }
    size_t total = 0;
    for (int i = 0; i < t->nsegs; i++)
        total += strlen(t->segs[i]) + 1;
    char *joined = arena_alloc(q->arena, total + 1);
    size_t o = 0;
    for (int i = 0; i < t->nsegs; i++) {
        size_t sl = strlen(t->segs[i]);
        if (i)
            joined[o++] = '.';
        memcpy(joined + o, t->segs[i], sl);
        o += sl;
    }
    joined[o] = '\0';
    t->text = joined;
    return 0;
}

/* Whether text at i looks like the start of a date: four digits and a '-' then a digit. */
static bool looks_like_date(const qctx_t *q, int i)
{
    for (int k = 0; k < 4; k++)
        if (i + k >= q->len || !isdigit((unsigned char)q->text[i + k]))
            return false;
    return i + 5 < q->len && q->text[i + 4] == '-' && isdigit((unsigned char)q->text[i + 5]);
}

/* Whether text at i is a UUID (8-4-4-4-12 hex digits) not followed by a word character: a job
 * id written bare, which would otherwise start a number. */
static bool looks_like_uuid(const qctx_t *q, int i)
{
    if (q->len - i < 36)
        return false;
    for (int k = 0; k < 36; k++) {
        char c = q->text[i + k];
        if (k == 8 || k == 13 || k == 18 || k == 23) {
            if (c != '-')
                return false;
        } else if (!isxdigit((unsigned char)c)) {
            return false;
        }
    }
    return i + 36 == q->len || !is_word((unsigned char)q->text[i + 36]);
}

/* Parses a date ("2026-11-01", midnight UTC) or an RFC 3339 time; 0 or KILN_EINVAL. */
static int parse_time_text(const char *s, int64_t *us)
{
    size_t n = strlen(s);
    if (n == 10 && s[4] == '-' && s[7] == '-') {
        char buf[32];
        snprintf(buf, sizeof buf, "%sT00:00:00Z", s);
        return kiln_time_parse(buf, us);
    }
    if (n < 19 || s[4] != '-' || s[7] != '-')
        return KILN_EINVAL; /* not plain Unix seconds, which kiln_time_parse also takes */
    return kiln_time_parse(s, us);
}

int qtime_text(const char *s, int64_t *us)
{
    return parse_time_text(s, us);
}

static int lex_time(qctx_t *q, qtok_t *t)
{
    int s = q->at;
    while (q->at < q->len) {
        char c = q->text[q->at];
        if (isdigit((unsigned char)c) || c == '-' || c == ':' || c == '.' || c == '+' || c == 'T' || c == 't' ||
            c == 'Z' || c == 'z')
            q->at++;
        else
            break;
    }
    char *raw = arena_strndup(q->arena, q->text + s, (size_t)(q->at - s));
    t->kind = QK_TIME;
    if (parse_time_text(raw, &t->us))
        return qfail(q, s, q->at - s, "write times as 2026-11-01 or 2026-11-01T06:00:00Z (UTC), or ages as -7d",
                     "\"%s\" is not a time", raw);
    return 0;
}

static int lex_number(qctx_t *q, qtok_t *t)
{
    int s = q->at;
    int i = q->at;
    if (q->text[i] == '-' || q->text[i] == '+')
        i++;
    bool digits = false;
    while (i < q->len && isdigit((unsigned char)q->text[i]))
        i++, digits = true;
    if (i < q->len && q->text[i] == '.') {
        i++;
        while (i < q->len && isdigit((unsigned char)q->text[i]))
            i++, digits = true;
    }
    if (!digits)
        return qfail(q, s, 1, NULL, "expected a number");
    if (i < q->len && (q->text[i] == 'e' || q->text[i] == 'E')) {
        int k = i + 1;
        if (k < q->len && (q->text[k] == '-' || q->text[k] == '+'))
            k++;
        if (k < q->len && isdigit((unsigned char)q->text[k])) {
            while (k < q->len && isdigit((unsigned char)q->text[k]))
                k++;
            i = k;
        }
    }
    char *num = arena_strndup(q->arena, q->text + s, (size_t)(i - s));
    double v = strtod(num, NULL);
    q->at = i;
    if (!isfinite(v))
        return qfail(q, s, i - s, NULL, "number %s is out of range", num);
    t->num = v;
    t->kind = QK_NUMBER;
    if (i < q->len && isalpha((unsigned char)q->text[i])) {
        static const struct {
            const char *unit;
            double seconds;
        } units[] = {{"ms", 0.001}, {"s", 1}, {"m", 60}, {"h", 3600}, {"d", 86400}, {"w", 604800}};
        int u = i;
        while (q->at < q->len && isalnum((unsigned char)q->text[q->at]))
            q->at++;
        char *unit = arena_strndup(q->arena, q->text + u, (size_t)(q->at - u));
        for (size_t k = 0; k < KILN_ARRAY_LEN(units); k++)
            if (!strcmp(unit, units[k].unit)) {
                t->kind = QK_DURATION;
                t->num = v * units[k].seconds;
                if (!isfinite(t->num))
                    return qfail(q, s, q->at - s, NULL, "duration %.*s is out of range", q->at - s, q->text + s);
                return 0;
            }
        /* Not a duration: a word that starts with digits ("0b6c", an id prefix). The parser
         * says "unknown unit" if a number or duration was wanted. */
        while (q->at < q->len && is_word((unsigned char)q->text[q->at]))
            q->at++;
        t->kind = QK_PATH;
        t->segs[0] = t->text = arena_strndup(q->arena, q->text + s, (size_t)(q->at - s));
        t->nsegs = 1;
        t->unit_pos = u;
        t->unit_len = (int)strlen(unit);
        return 0;
    }
    if (i < q->len && (q->text[i] == '_'))
        return qfail(q, s, i - s + 1, NULL, "\"%s\" is not a number", num);
    return 0;
}

int qlex_next(qctx_t *q)
{
    qtok_t *t = &q->tok;
    memset(t, 0, sizeof *t);
    while (q->at < q->len && isspace((unsigned char)q->text[q->at]))
        q->at++;
    t->pos = q->at;
    int rc = 0;
    if (q->at >= q->len) {
        t->kind = QK_EOF;
        t->len = 0;
        return 0;
    }
    char c = q->text[q->at];
    char c1 = q->at + 1 < q->len ? q->text[q->at + 1] : '\0';
    switch (c) {
    case '(': t->kind = QK_LPAREN; q->at++; break;
    case ')': t->kind = QK_RPAREN; q->at++; break;
    case ',': t->kind = QK_COMMA; q->at++; break;
    case '~': t->kind = QK_OP; t->op = QO_MATCH; q->at++; break;
    case '=':
        t->kind = QK_OP;
        t->op = QO_EQ;
        q->at += c1 == '=' ? 2 : 1;
        break;
    case '!':
        if (c1 == '=' || c1 == '~') {
            t->kind = QK_OP;
            t->op = c1 == '=' ? QO_NE : QO_MATCH;
            t->op_not = c1 == '~';
            q->at += 2;
            break;
        }
        return qfail(q, q->at, 1, "negate with NOT, != or !~", "unexpected '!'");
    case '<':
        t->kind = QK_OP;
        if (c1 == '=') {
            t->op = QO_LE;
            q->at += 2;
        } else if (c1 == '>') {
            t->op = QO_NE;
            q->at += 2;
        } else {
            t->op = QO_LT;
            q->at++;
        }
        break;
    case '>':
        t->kind = QK_OP;
        t->op = c1 == '=' ? QO_GE : QO_GT;
        q->at += c1 == '=' ? 2 : 1;
        break;
    case '"':
    case '\'': {
        int rc2 = lex_quoted(q, &t->text);
        if (rc2)
            return rc2;
        t->kind = QK_STRING;
        /* "a".b: a path whose first segment is quoted */
        if (q->at < q->len && q->text[q->at] == '.') {
            q->at = t->pos;
            rc = lex_path(q, t);
        }
        break;
    }
    default:
        if (isxdigit((unsigned char)c) && looks_like_uuid(q, q->at)) {
            t->kind = QK_PATH;
            t->segs[0] = t->text = arena_strndup(q->arena, q->text + q->at, 36);
            t->nsegs = 1;
            q->at += 36;
        } else if (isdigit((unsigned char)c) && looks_like_date(q, q->at))
            rc = lex_time(q, t);
        else if (isdigit((unsigned char)c) || ((c == '-' || c == '+' || c == '.') &&
                                               (isdigit((unsigned char)c1) || (c1 == '.' && c != '.'))))
            rc = lex_number(q, t);
        else if (is_word_start((unsigned char)c) || c == '*')
            rc = lex_path(q, t);
        else if ((unsigned char)c >= 0x20 && (unsigned char)c < 0x7f)
            return qfail(q, q->at, 1, NULL, "unexpected character '%c'", c);
        else if ((unsigned char)c >= 0x80)
            return qfail(q, q->at, 1, "quote text that is not a plain word: \"...\"", "unexpected character");
        else
            return qfail(q, q->at, 1, NULL, "unexpected control character 0x%02x", (unsigned char)c);
        break;
    }
    t->len = q->at - t->pos;
    return rc;
}

/* Whether s[0..n) is valid UTF-8 (no overlong forms, no surrogates). */
static bool utf8_ok(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len = c >= 0xc2 && c < 0xe0 ? 2 : c >= 0xe0 && c < 0xf0 ? 3 : c >= 0xf0 && c < 0xf5 ? 4 : 0;
        if (!len || i + (size_t)len > n)
            return false;
        for (int k = 1; k < len; k++)
            if ((s[i + k] & 0xc0) != 0x80)
                return false;
        if (len == 3) {
            unsigned cp = ((c & 0x0fu) << 12) | ((s[i + 1] & 0x3fu) << 6) | (s[i + 2] & 0x3fu);
            if (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))
                return false;
        } else if (len == 4) {
            unsigned cp = ((c & 0x07u) << 18) | ((s[i + 1] & 0x3fu) << 12);
            if (cp < 0x10000 || cp > 0x10ffff)
                return false;
        }
        i += (size_t)len;
    }
    return true;
}

int qlex_init(qctx_t *q, const char *text, const char *what, arena_t *arena, int64_t now_us, kiln_err_t *err)
{
    memset(q, 0, sizeof *q);
    q->text = text ? text : "";
    q->what = what;
    q->arena = arena;
    q->err = err;
    q->now_us = now_us;
    size_t n = strlen(q->text);
    if (n > QUERY_MAX_TEXT) {
        kiln_err_set(err, KILN_EINVAL, what, "%s is %zu bytes long; at most %d are accepted", what, n,
                     QUERY_MAX_TEXT);
        kiln_err_hint(err, "split the search, or use fewer and shorter terms");
        return KILN_EINVAL;
    }
    if (!utf8_ok((const unsigned char *)q->text, n)) {
        kiln_err_set(err, KILN_EINVAL, what, "%s is not valid UTF-8", what);
        return KILN_EINVAL;
    }
    q->len = (int)n;
    return qlex_next(q);
}
