/* text.c - what kiln accepts as text and as numbers written in text: one UTF-8 decoder (used to
 * check client input, to sanitise ranks' output and to write COPY data), formatting that never
 * leaves a character cut in half, a strict decimal integer parser, and which characters are
 * terminal controls (refused in names, escaped by the CLI). No allocation, no locale. */
#include "base/base.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

size_t kiln_utf8_seq(const unsigned char *p, size_t n)
{
    if (n == 0)
        return 0;
    unsigned c = p[0];
    if (c < 0x80)
        return c ? 1 : 0;
    size_t need;
    unsigned cp, min;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
        cp = c & 0x1F;
        min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        need = 2;
        cp = c & 0x0F;
        min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        cp = c & 0x07;
        min = 0x10000;
    } else {
        return 0; /* a continuation byte, an overlong lead (0xC0, 0xC1) or beyond U+10FFFF */
    }
    if (need >= n)
        return 0;
    for (size_t k = 1; k <= need; k++) {
        if ((p[k] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return need + 1;
}

size_t kiln_utf8_copy(char *dst, size_t cap, const char *src, size_t n)
{
    const unsigned char *p = (const unsigned char *)src;
    size_t i = 0, o = 0;
    if (cap == 0)
        return 0;
    while (i < n) {
        size_t k = kiln_utf8_seq(p + i, n - i);
        /* U+FFFD for a byte that starts no sequence, '?' for a NUL, which PostgreSQL text cannot hold */
        const char *piece = k ? src + i : p[i] ? "\xef\xbf\xbd" : "?";
        size_t len = k ? k : strlen(piece);
        if (o + len >= cap)
            break;
        memcpy(dst + o, piece, len);
        o += len;
        i += k ? k : 1;
    }
    dst[o] = '\0';
    return o;
}

size_t kiln_text_vfmt(char *buf, size_t n, const char *fmt, va_list ap)
{
    if (n == 0)
        return 0;
    int len = vsnprintf(buf, n, fmt, ap);
    if (len < 0) {
        buf[0] = '\0';
        return 0;
    }
    size_t end = KILN_MIN((size_t)len, n - 1), o = 0;
    const unsigned char *p = (const unsigned char *)buf;
    for (size_t i = 0; i < end;) {
        size_t k = p[i] < 0x80 ? 1 : kiln_utf8_seq(p + i, end - i);
        if (k == 0) {
            i++; /* a byte of a character cut short, or a stray one: left out */
            continue;
        }
        memmove(buf + o, buf + i, k);
        o += k;
        i += k;
    }
    buf[o] = '\0';
    return o;
}

size_t kiln_text_fmt(char *buf, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t o = kiln_text_vfmt(buf, n, fmt, ap);
    va_end(ap);
    return o;
}

size_t kiln_utf8_check(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (p[i] >= 0x20 && p[i] < 0x80) { /* the common case: printable ASCII */
            i++;
            continue;
        }
        size_t k = kiln_utf8_seq(p + i, n - i);
        if (k == 0)
            return i;
        i += k;
    }
    return n;
}

size_t kiln_text_control(const unsigned char *p, size_t n)
{
    if (n == 0)
        return 0;
    if (p[0] < 0x20 || p[0] == 0x7f)
        return 1;
    if (n >= 2 && p[0] == 0xC2 && p[1] >= 0x80 && p[1] <= 0x9F)
        return 2;
    if (n >= 3 && p[0] == 0xE2 && ((p[1] == 0x80 && p[2] >= 0xAA && p[2] <= 0xAE) ||
                                   (p[1] == 0x81 && p[2] >= 0xA6 && p[2] <= 0xA9)))
        return 3;
    return 0;
}

size_t kiln_text_control_at(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n; i++)
        if (kiln_text_control(p + i, n - i))
            return i;
    return n;
}

size_t kiln_text_escape_char(const unsigned char *p, size_t n, unsigned flags, char esc[12], const char **shown,
                             size_t *shown_len)
{
    *shown = esc;
    if ((flags & KILN_TEXT_QUOTED) && (p[0] == '"' || p[0] == '\\')) {
        esc[0] = '\\';
        esc[1] = (char)p[0];
        esc[2] = '\0';
        *shown_len = 2;
        return 1;
    }
    if ((flags & KILN_TEXT_QUOTED) && n >= 2 && p[0] == 0xC0 && p[1] == 0x80) {
        *shown_len = (size_t)snprintf(esc, 12, "\\u0000"); /* the NUL http.c carries a %00 as */
        return 2;
    }
    size_t k = kiln_text_control(p, n);
    bool escape = k > 0;
    if (!k && (k = kiln_utf8_seq(p, n)) > 0 && (k == 1 || !(flags & KILN_TEXT_ASCII))) {
        *shown = (const char *)p;
        *shown_len = k;
        return k;
    }
    if (k || escape) {
        unsigned c = p[0];
        unsigned cp = k == 1   ? c
                      : k == 2 ? ((c & 0x1Fu) << 6) | (p[1] & 0x3Fu)
                      : k == 3 ? ((c & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu)
                               : ((c & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
        *shown_len = (size_t)snprintf(esc, 12, cp > 0xFFFF ? "\\U%08x" : "\\u%04x", cp);
        return k;
    }
    *shown_len = (size_t)snprintf(esc, 12, "\\x%02x", p[0]);
    return 1;
}

size_t kiln_text_escape(char *dst, size_t cap, const char *s, size_t n, unsigned flags)
{
    size_t o = 0;
    if (cap == 0)
        return 0;
    for (size_t i = 0; i < n;) {
        char esc[12];
        const char *shown;
        size_t k, used = kiln_text_escape_char((const unsigned char *)s + i, n - i, flags, esc, &shown, &k);
        if (o + k >= cap)
            break;
        memcpy(dst + o, shown, k);
        o += k;
        i += used;
    }
    dst[o] = '\0';
    return o;
}

const char *kiln_text_quote(char *dst, size_t cap, const char *s, size_t n, size_t max_chars)
{
    size_t o = 0, i = 0, chars = 0;
    if (cap == 0)
        return dst;
    dst[0] = '\0';
    while (i < n) {
        char esc[12];
        const char *shown;
        size_t k, used = kiln_text_escape_char((const unsigned char *)s + i, n - i, KILN_TEXT_QUOTED, esc, &shown, &k);
        if (chars == max_chars || o + k + 3 >= cap) { /* room kept for the "..." that says it was cut */
            snprintf(dst + o, cap - o, "...");
            return dst;
        }
        memcpy(dst + o, shown, k);
        o += k;
        i += used;
        chars++;
    }
    dst[o] = '\0';
    return dst;
}

int kiln_parse_int64(const char *s, int64_t *out)
{
    if (!s)
        return KILN_EINVAL;
    const char *p = s;
    bool neg = *p == '-';
    if (neg)
        p++;
    if (*p < '0' || *p > '9')
        return KILN_EINVAL;
    uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    for (; *p >= '0' && *p <= '9'; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (lim - d) / 10)
            return KILN_EINVAL; /* out of range */
        v = v * 10 + d;
    }
    if (*p)
        return KILN_EINVAL;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 0;
}
