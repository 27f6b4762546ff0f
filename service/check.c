/* check.c - the validator: one set of checks for what clients send, shared by REST (query
 * parameters, path segments, headers), gRPC (request fields) and the service's own functions,
 * so that both front ends refuse the same input with the same field, message and hint. It
 * checks values; what a value means (a state name, a page token) is checked where it is used. */
#include "service/svc_int.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Bad input is quoted in messages with kiln_text_quote, at most this many characters of it
 * (controls as \uXXXX, bytes that are not UTF-8 as \xHH, the %00 REST carries as C0 80 as the
 * \u0000 gRPC's NUL shows as), so that both front ends quote the same bytes the same way. */
#define QUOTE_CHARS 40

int svc_check_text(const char *field, const char *s, size_t len, size_t max_chars, kiln_err_t *err)
{
    if (!s)
        return 0;
    size_t bad = kiln_utf8_check(s, len);
    if (bad < len) {
        char q[200];
        kiln_text_quote(q, sizeof(q), s, len, QUOTE_CHARS);
        /* %00 in a URL arrives as the overlong C0 80 (http.c), so that it is seen here */
        bool nul = s[bad] == '\0' || ((unsigned char)s[bad] == 0xC0 && bad + 1 < len && (unsigned char)s[bad + 1] == 0x80);
        kiln_err_set(err, KILN_EINVAL, field, "%s %s (byte %zu of \"%s\")", field,
                     nul ? "contains a NUL byte" : "is not valid UTF-8", bad, q);
        kiln_err_hint(err, nul ? "remove the NUL (%%00) byte" : "send the text as UTF-8");
        return KILN_EINVAL;
    }
    if (max_chars > 0) {
        size_t chars = 0;
        for (size_t i = 0; i < len; i++)
            chars += ((unsigned char)s[i] & 0xC0) != 0x80;
        if (chars > max_chars) {
            kiln_err_set(err, KILN_EINVAL, field, "%s is too long: %zu characters, at most %zu", field, chars,
                         max_chars);
            kiln_err_hint(err, "shorten %s", field);
            return KILN_EINVAL;
        }
    }
    return 0;
}

int svc_check_str(const char *field, const char *s, size_t max_chars, kiln_err_t *err)
{
    return s ? svc_check_text(field, s, strlen(s), max_chars, err) : 0;
}

int svc_check_line(const char *field, const char *s, size_t max_chars, kiln_err_t *err)
{
    int rc = svc_check_str(field, s, max_chars, err);
    if (rc || !s)
        return rc;
    size_t len = strlen(s), at = kiln_text_control_at(s, len);
    if (at == len)
        return 0;
    char q[200];
    kiln_text_quote(q, sizeof(q), s, len, QUOTE_CHARS);
    kiln_err_set(err, KILN_EINVAL, field, "%s has a control character (byte %zu of \"%s\")", field, at, q);
    kiln_err_hint(err, "write %s on one line without control characters (tab, CR, ESC and other C0 or C1 codes, "
                       "DEL) or bidirectional overrides (U+202A to U+202E, U+2066 to U+2069)", field);
    return KILN_EINVAL;
}

int svc_check_int_text(const char *field, const char *text, int64_t lo, int64_t hi, int64_t *out, kiln_err_t *err)
{
    int64_t v = 0;
    int rc = svc_check_str(field, text, 64, err);
    if (rc)
        return rc;
    if (kiln_parse_int64(text, &v) != 0 || v < lo || v > hi) {
        char q[200];
        kiln_text_quote(q, sizeof(q), text, strlen(text), QUOTE_CHARS);
        kiln_err_set(err, KILN_EINVAL, field, "%s must be a whole number from %lld to %lld, got \"%s\"", field,
                     (long long)lo, (long long)hi, q);
        kiln_err_hint(err, "write %s in decimal digits, without a sign '+', spaces or a fraction", field);
        return KILN_EINVAL;
    }
    *out = v;
    return 0;
}

int svc_check_time_text(const char *field, const char *text, int64_t *out_us, kiln_err_t *err)
{
    *out_us = 0;
    if (!text || !*text || kiln_time_parse(text, out_us) == 0)
        return 0;
    char q[200];
    kiln_text_quote(q, sizeof(q), text, strlen(text), QUOTE_CHARS);
    kiln_err_set(err, KILN_EINVAL, field, "%s is not a time: \"%s\"", field, q);
    kiln_err_hint(err, "use RFC 3339 (2026-11-21T06:04:37Z) or Unix seconds");
    return KILN_EINVAL;
}

int svc_check_range(const char *field, int64_t v, int64_t lo, int64_t hi, kiln_err_t *err)
{
    if (v >= lo && v <= hi)
        return 0;
    kiln_err_set(err, KILN_EINVAL, field, "%s must be a whole number from %lld to %lld, got %lld", field,
                 (long long)lo, (long long)hi, (long long)v);
    kiln_err_hint(err, "leave %s out for its default", field);
    return KILN_EINVAL;
}

int svc_check_finite(const char *field, double v, kiln_err_t *err)
{
    if (isfinite(v))
        return 0;
    kiln_err_set(err, KILN_EINVAL, field, "%s must be a finite number, got %s", field,
                 isnan(v) ? "NaN" : v > 0 ? "Infinity" : "-Infinity");
    kiln_err_hint(err, "send a number such as 0.5; NaN and Infinity are not values kiln accepts");
    return KILN_EINVAL;
}

int svc_check_bool_text(const char *field, const char *text, bool *out, kiln_err_t *err)
{
    *out = false;
    if (!text)
        return 0;
    if (!strcmp(text, "true") || !strcmp(text, "1") || !*text) {
        *out = true;
        return 0;
    }
    if (!strcmp(text, "false") || !strcmp(text, "0"))
        return 0;
    int rc = svc_check_str(field, text, 64, err);
    if (rc)
        return rc;
    char q[200];
    kiln_text_quote(q, sizeof(q), text, strlen(text), QUOTE_CHARS);
    kiln_err_set(err, KILN_EINVAL, field, "%s must be true or false, got \"%s\"", field, q);
    return KILN_EINVAL;
}
