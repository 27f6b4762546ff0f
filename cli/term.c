/* term.c - the one place the CLI makes what it prints safe for a terminal: a stdio stream that
 * passes text on to another one with every terminal control character (kiln_text_control: ESC,
 * BEL, CR, other C0 and C1 codes, DEL, bidirectional overrides) written as a visible \uXXXX
 * escape, newline and tab excepted. Not for bytes that are data (a download to stdout). */
#include "cli/cli_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cli_term {
    FILE *dst;              /* borrowed */
    unsigned char pend[4];  /* the start of a character cut off by the end of a write */
    size_t npend;
    char out[4096];
    size_t nout;
} cli_term_t;

static void term_put(cli_term_t *t, const void *p, size_t n)
{
    if (t->nout + n > sizeof(t->out)) {
        fwrite(t->out, 1, t->nout, t->dst);
        t->nout = 0;
    }
    if (n > sizeof(t->out)) { /* a long run of plain text: passed on as it is */
        fwrite(p, 1, n, t->dst);
        return;
    }
    memcpy(t->out + t->nout, p, n);
    t->nout += n;
}

/* How many bytes the UTF-8 sequence that lead starts has (1 for anything that starts none). */
static size_t term_seq_len(unsigned char lead)
{
    return lead >= 0xC2 && lead <= 0xDF ? 2 : (lead & 0xF0) == 0xE0 ? 3 : lead >= 0xF0 && lead <= 0xF4 ? 4 : 1;
}

/* Writes p[0..n) escaped; at_end: no more bytes follow (else a character cut short at the end is
 * kept for the next write). Returns the bytes taken. */
static size_t term_text(cli_term_t *t, const unsigned char *p, size_t n, bool at_end)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (c >= 0x20 && c < 0x7f) {
            size_t j = i;
            while (j < n && p[j] >= 0x20 && p[j] < 0x7f)
                j++;
            term_put(t, p + i, j - i);
            i = j;
            continue;
        }
        if (c == '\n' || c == '\t') {
            term_put(t, p + i, 1);
            i++;
            continue;
        }
        if (!at_end && c >= 0x80 && i + term_seq_len(c) > n)
            return i; /* the rest of this character comes with the next write */
        char esc[12];
        const char *shown;
        size_t len;
        i += kiln_text_escape_char(p + i, n - i, 0, esc, &shown, &len);
        term_put(t, shown, len);
    }
    return n;
}

static ssize_t term_write(void *cookie, const char *buf, size_t size)
{
    cli_term_t *t = cookie;
    const unsigned char *p = (const unsigned char *)buf;
    size_t i = 0;
    /* a character begun in the last write: complete it from this one first */
    while (t->npend > 0 && i < size) {
        t->pend[t->npend++] = p[i++];
        size_t took = term_text(t, t->pend, t->npend, t->npend == sizeof(t->pend));
        if (took == t->npend) {
            t->npend = 0;
        } else if (took > 0) {
            memmove(t->pend, t->pend + took, t->npend - took);
            t->npend -= took;
        }
    }
    size_t took = term_text(t, p + i, size - i, false);
    memcpy(t->pend + t->npend, p + i + took, size - i - took);
    t->npend += size - i - took;
    fwrite(t->out, 1, t->nout, t->dst);
    memset(t->out, 0, t->nout); /* what passed may have been a secret shown once (kiln tokens create) */
    t->nout = 0;
    fflush(t->dst);
    return (ssize_t)size;
}

static int term_close(void *cookie)
{
    cli_term_t *t = cookie;
    term_text(t, t->pend, t->npend, true);
    fwrite(t->out, 1, t->nout, t->dst);
    int rc = fflush(t->dst);
    free(t);
    return rc;
}

FILE *cli_term_open(FILE *dst, int mode)
{
    cli_term_t *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->dst = dst;
    FILE *f = fopencookie(t, "w", (cookie_io_functions_t){.write = term_write, .close = term_close});
    if (!f) {
        free(t);
        return NULL;
    }
    setvbuf(f, NULL, mode, mode == _IONBF ? 0 : BUFSIZ);
    return f;
}
