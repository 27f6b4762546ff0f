/* http_range.c - the Range header of artifact downloads (RFC 9110 section 14): one byte range
 * parsed against the size of the file. Pure text handling; the reply (206, 416, the whole file)
 * is http_routes.c's. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "api/http_int.h"

int http_range_parse(const char *h, int64_t size, int64_t *first, int64_t *last)
{
    if (strncmp(h, "bytes=", 6) != 0)
        return 0;
    const char *p = h + 6;
    while (*p == ' ')
        p++;
    if (strchr(p, ','))
        return 0; /* several ranges: answered with the whole file, which RFC 9110 allows */
    const char *dash = strchr(p, '-');
    if (!dash)
        return 0;
    char *end = NULL;
    errno = 0;
    if (dash == p) { /* suffix: the last N bytes */
        long long n = strtoll(dash + 1, &end, 10);
        if (errno || end == dash + 1 || *end || n < 0)
            return 0;
        if (n == 0 || size == 0)
            return -1;
        *first = n >= size ? 0 : size - n;
        *last = size - 1;
        return 1;
    }
    long long a = strtoll(p, &end, 10);
    if (errno || end != dash || a < 0)
        return 0;
    long long b = size - 1;
    if (dash[1]) {
        b = strtoll(dash + 1, &end, 10);
        if (errno || *end || b < a)
            return 0;
    }
    if (a >= size)
        return -1;
    *first = a;
    *last = b < size - 1 ? b : size - 1;
    return 1;
}
