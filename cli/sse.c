/* sse.c - an incremental Server-Sent Events parser (the text/event-stream format of the WHATWG
 * HTML standard): bytes in any split, events out through a callback. It does no I/O. */
#include "cli/cli.h"

#include <stdlib.h>
#include <string.h>

void cli_sse_init(cli_sse_t *p, cli_sse_fn fn, void *ud)
{
    memset(p, 0, sizeof(*p));
    p->fn = fn;
    p->ud = ud;
}

void cli_sse_deinit(cli_sse_t *p)
{
    free(p->line);
    free(p->data);
    p->line = p->data = NULL;
}

static int cli_sse_grow(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 256;
    while (nc < need)
        nc *= 2;
    char *nb = realloc(*buf, nc);
    if (!nb)
        return KILN_ENOMEM;
    *buf = nb;
    *cap = nc;
    return 0;
}

static int cli_sse_dispatch(cli_sse_t *p)
{
    int rc = 0;
    if (p->has_data) {
        if (cli_sse_grow(&p->data, &p->data_cap, p->data_len + 1) != 0)
            return KILN_ENOMEM;
        p->data[p->data_len] = '\0';
        rc = p->fn(p->ud, p->event[0] ? p->event : "message", p->data, p->id);
    }
    p->data_len = 0;
    p->has_data = false;
    p->event[0] = '\0';
    return rc;
}

/* One complete line (without its terminator). */
static int cli_sse_line(cli_sse_t *p, const char *line, size_t n)
{
    if (n == 0)
        return cli_sse_dispatch(p);
    if (line[0] == ':')
        return 0; /* comment, e.g. ": ping" */
    const char *colon = memchr(line, ':', n);
    size_t flen = colon ? (size_t)(colon - line) : n;
    const char *val = colon ? colon + 1 : line + n;
    size_t vlen = colon ? n - flen - 1 : 0;
    if (vlen && *val == ' ') {
        val++;
        vlen--;
    }
    if (flen == 4 && !memcmp(line, "data", 4)) {
        size_t need = p->data_len + vlen + 2;
        if (cli_sse_grow(&p->data, &p->data_cap, need) != 0)
            return KILN_ENOMEM;
        if (p->has_data)
            p->data[p->data_len++] = '\n';
        memcpy(p->data + p->data_len, val, vlen);
        p->data_len += vlen;
        p->has_data = true;
    } else if (flen == 5 && !memcmp(line, "event", 5)) {
        size_t k = KILN_MIN(vlen, sizeof(p->event) - 1);
        memcpy(p->event, val, k);
        p->event[k] = '\0';
    } else if (flen == 2 && !memcmp(line, "id", 2)) {
        size_t k = KILN_MIN(vlen, sizeof(p->id) - 1);
        memcpy(p->id, val, k);
        p->id[k] = '\0';
    }
    /* "retry" and unknown fields are ignored. */
    return 0;
}

int cli_sse_feed(cli_sse_t *p, const char *bytes, size_t n)
{
    if (p->stopped)
        return p->stopped;
    for (size_t i = 0; i < n; i++) {
        char ch = bytes[i];
        if (p->skip_lf) {
            p->skip_lf = false;
            if (ch == '\n')
                continue;
        }
        if (ch == '\r' || ch == '\n') {
            p->skip_lf = ch == '\r';
            int rc = cli_sse_line(p, p->line ? p->line : "", p->line_len);
            p->line_len = 0;
            if (rc == KILN_ENOMEM)
                return rc;
            if (rc != 0) {
                p->stopped = rc;
                return rc;
            }
            continue;
        }
        if (cli_sse_grow(&p->line, &p->line_cap, p->line_len + 1) != 0)
            return KILN_ENOMEM;
        p->line[p->line_len++] = ch;
    }
    return 0;
}
