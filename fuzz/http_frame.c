/* http_frame.c - fuzz target: a REST request's body framing (api/http_frame.c), judged from its
 * header lines before the body is read. Input: header lines "Key: value" separated by newlines.
 * A verdict is 0, a format error naming Content-Length or Transfer-Encoding, or "too big"; an
 * accepted request has at most one agreeing Content-Length (a number libmicrohttpd reads, within
 * the limit, or one it refuses itself) or one "chunked", never both. */
#include <errno.h>
#include <strings.h>

#include "api/http_int.h"
#include "fuzz/fuzz.h"

#define MAX_BODY (1024 * 1024)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_text(data, size);
    http_frame_t f = {0};
    int nlen = 0, nenc = 0;
    for (char *line = text, *next; line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        char *colon = strchr(line, ':');
        if (!colon)
            continue;
        *colon = '\0';
        char *value = colon + 1;
        while (*value == ' ')
            value++;
        nlen += !strcasecmp(line, "Content-Length");
        nenc += !strcasecmp(line, "Transfer-Encoding");
        http_frame_header(&f, line, value);
    }
    FUZZ_CHECK(f.nlength == nlen && f.nencoding == nenc);
    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = http_frame_check(&f, MAX_BODY, &err);
    FUZZ_CHECK(rc == 0 || rc == KILN_EFORMAT || rc == KILN_ETOOBIG);
    if (rc == KILN_EFORMAT)
        FUZZ_CHECK(!strcmp(err.field, "Content-Length") || !strcmp(err.field, "Transfer-Encoding"));
    if (rc)
        FUZZ_CHECK(err.message[0] && err.hint[0]);
    if (rc == 0) {
        FUZZ_CHECK(!f.lengths_differ && !(nlen && nenc) && nenc <= 1);
        if (nenc)
            FUZZ_CHECK(!strcasecmp(f.encoding, "chunked"));
        if (nlen && http_length_ok(f.length)) {
            errno = 0;
            unsigned long long v = strtoull(f.length, NULL, 10);
            FUZZ_CHECK(errno == 0 && v <= MAX_BODY);
        }
    }
    if (rc == KILN_ETOOBIG)
        FUZZ_CHECK(nlen && http_length_ok(f.length));
    /* a length libmicrohttpd reads is decimal digits below 2^64, and strtoull agrees */
    if (nlen && http_length_ok(f.length)) {
        for (const char *p = f.length; *p; p++)
            FUZZ_CHECK(*p >= '0' && *p <= '9');
        errno = 0;
        (void)strtoull(f.length, NULL, 10);
        FUZZ_CHECK(errno == 0);
    }
    free(text);
    return 0;
}
