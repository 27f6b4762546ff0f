/* log_lines.c - fuzz target: the agent's line splitter and sanitiser (agent/lines.c) over the
 * bytes a rank writes to stdout or stderr. Input: one byte for the line limit (0: the default
 * 16 KiB, else 1..255), one for how the stream is cut into reads, then the stream. Every line
 * handed over is valid UTF-8 without NUL or newline, within 3 bytes per input byte of the
 * limit; the lines do not depend on how the stream was cut; and the sanitiser leaves valid
 * text as it is. */
#include "agent/agent.h"
#include "fuzz/fuzz.h"

/* The lines of one pass, concatenated with a record of each line's length and truncation. */
typedef struct lines {
    size_t max_line;
    char *text;
    size_t len, cap;
    size_t n;
} lines_t;

static void put(lines_t *l, const void *p, size_t n)
{
    if (l->len + n > l->cap) {
        size_t cap = l->cap ? l->cap : 1024;
        while (cap < l->len + n)
            cap *= 2;
        l->text = realloc(l->text, cap);
        FUZZ_CHECK(l->text);
        l->cap = cap;
    }
    memcpy(l->text + l->len, p, n);
    l->len += n;
}

static void on_line(void *ud, const char *line, size_t len, bool truncated)
{
    lines_t *l = ud;
    FUZZ_CHECK(line[len] == '\0');
    FUZZ_CHECK(kiln_utf8_check(line, len) == len); /* valid UTF-8, no NUL */
    FUZZ_CHECK(memchr(line, '\n', len) == NULL);
    FUZZ_CHECK(len <= 3 * l->max_line);
    unsigned char t = truncated;
    put(l, &len, sizeof len);
    put(l, &t, 1);
    put(l, line, len);
    l->n++;
}

static void run(lines_t *l, size_t max_line, const char *s, size_t n, unsigned cut)
{
    agent_linebuf_t lb;
    agent_linebuf_init(&lb, max_line);
    l->max_line = lb.max_line;
    size_t off = 0, i = 0;
    while (off < n) {
        /* cut 0: one read; else reads of 1..16 bytes in a pattern the byte picks */
        size_t chunk = cut == 0 ? n - off : 1 + ((cut * 7 + i * 13) % 16);
        if (chunk > n - off)
            chunk = n - off;
        agent_linebuf_feed(&lb, s + off, chunk, on_line, l);
        off += chunk;
        i++;
    }
    agent_linebuf_finish(&lb, on_line, l);
    agent_linebuf_deinit(&lb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    size_t max_line = data[0];
    unsigned cut = data[1];
    const char *s = (const char *)data + 2;
    size_t n = size - 2;

    lines_t whole = {0}, cut_up = {0};
    run(&whole, max_line, s, n, 0);
    run(&cut_up, max_line, s, n, cut ? cut : 1);
    FUZZ_CHECK(whole.n == cut_up.n && whole.len == cut_up.len);
    FUZZ_CHECK(whole.len == 0 || !memcmp(whole.text, cut_up.text, whole.len));
    free(whole.text);
    free(cut_up.text);

    /* the sanitiser alone: valid text comes back as it was, anything else becomes valid */
    char *out = malloc(3 * n + 1);
    FUZZ_CHECK(out);
    size_t o = kiln_utf8_copy(out, 3 * n + 1, s, n);
    FUZZ_CHECK(o <= 3 * n && out[o] == '\0');
    FUZZ_CHECK(kiln_utf8_check(out, o) == o);
    if (kiln_utf8_check(s, n) == n)
        FUZZ_CHECK(o == n && !memcmp(out, s, n));
    free(out);
    return 0;
}
