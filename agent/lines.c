/* lines.c - the agent's line splitter: a byte stream from a rank's pipe becomes complete,
 * sanitised lines (valid UTF-8, no NUL, bounded length). No I/O here; the launcher feeds it. */
#include "agent/agent.h"

#include <stdlib.h>
#include <string.h>

void agent_linebuf_init(agent_linebuf_t *lb, size_t max_line)
{
    memset(lb, 0, sizeof(*lb));
    lb->max_line = max_line ? max_line : 16384;
}

void agent_linebuf_deinit(agent_linebuf_t *lb)
{
    free(lb->buf);
    memset(lb, 0, sizeof(*lb));
}

static void linebuf_emit(agent_linebuf_t *lb, const char *s, size_t len, bool truncated,
                         agent_line_fn fn, void *ud)
{
    if (len > 0 && s[len - 1] == '\r')
        len--;
    /* Truncation may split a multi-byte character; kiln_utf8_copy turns the stump into U+FFFD. */
    char stackbuf[3 * 1024 + 1];
    char *out = 3 * len + 1 <= sizeof(stackbuf) ? stackbuf : malloc(3 * len + 1);
    if (!out)
        return;
    size_t n = kiln_utf8_copy(out, 3 * len + 1, s, len);
    fn(ud, out, n, truncated);
    if (out != stackbuf)
        free(out);
    (void)lb;
}

/* Appends up to the line limit; bytes past it are dropped and the line marked truncated. */
static void linebuf_append(agent_linebuf_t *lb, const char *data, size_t n)
{
    size_t room = lb->max_line > lb->len ? lb->max_line - lb->len : 0;
    if (n > room) {
        lb->truncated = true;
        n = room;
    }
    if (n == 0)
        return;
    if (lb->len + n > lb->cap) {
        size_t cap = lb->cap ? lb->cap : 256;
        while (cap < lb->len + n)
            cap *= 2;
        char *nb = realloc(lb->buf, cap);
        if (!nb) {
            lb->truncated = true;
            return;
        }
        lb->buf = nb;
        lb->cap = cap;
    }
    memcpy(lb->buf + lb->len, data, n);
    lb->len += n;
}

void agent_linebuf_feed(agent_linebuf_t *lb, const char *data, size_t n, agent_line_fn fn, void *ud)
{
    while (n > 0) {
        const char *nl = memchr(data, '\n', n);
        if (!nl) {
            linebuf_append(lb, data, n);
            return;
        }
        size_t seg = (size_t)(nl - data);
        if (lb->len == 0 && !lb->truncated) {
            /* Common case: a whole line inside this chunk; no copy. */
            bool trunc = seg > lb->max_line;
            linebuf_emit(lb, data, trunc ? lb->max_line : seg, trunc, fn, ud);
        } else {
            linebuf_append(lb, data, seg);
            linebuf_emit(lb, lb->buf, lb->len, lb->truncated, fn, ud);
            lb->len = 0;
            lb->truncated = false;
        }
        data = nl + 1;
        n -= seg + 1;
    }
}

void agent_linebuf_finish(agent_linebuf_t *lb, agent_line_fn fn, void *ud)
{
    if (lb->len > 0 || lb->truncated)
        linebuf_emit(lb, lb->buf ? lb->buf : "", lb->len, lb->truncated, fn, ud);
    lb->len = 0;
    lb->truncated = false;
}
