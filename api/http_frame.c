/* http_frame.c - how a REST request says its body is framed (RFC 9112 section 6): its
 * Content-Length and Transfer-Encoding header lines, judged before a byte of the body is read.
 * Pure text handling; http.c feeds it libmicrohttpd's header lines and answers its verdict. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api/http_int.h"

bool http_length_ok(const char *s)
{
    uint64_t v = 0;
    if (!s || !*s)
        return false;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
            return false;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    return true;
}

void http_frame_header(http_frame_t *f, const char *key, const char *value)
{
    if (!value)
        value = "";
    if (!strcasecmp(key, "Content-Length")) {
        if (f->nlength++ == 0)
            f->length = value;
        else if (strcmp(f->length, value) != 0)
            f->lengths_differ = true;
    } else if (!strcasecmp(key, "Transfer-Encoding")) {
        if (f->nencoding++ == 0)
            f->encoding = value;
    }
}

int http_frame_check(const http_frame_t *f, uint64_t max_body, kiln_err_t *err)
{
    if (f->lengths_differ) {
        kiln_err_set(err, KILN_EFORMAT, "Content-Length", "the request has Content-Length headers that disagree");
        kiln_err_hint(err, "send one Content-Length header");
        return KILN_EFORMAT;
    }
    if (f->nencoding > 1 || (f->nencoding && f->nlength)) {
        kiln_err_set(err, KILN_EFORMAT, "Transfer-Encoding",
                     f->nlength ? "the request has both Transfer-Encoding and Content-Length"
                                : "the request has more than one Transfer-Encoding header");
        kiln_err_hint(err, "send either Content-Length or Transfer-Encoding: chunked, once");
        return KILN_EFORMAT;
    }
    if (f->nencoding && strcasecmp(f->encoding, "chunked") != 0) {
        kiln_err_set(err, KILN_EFORMAT, "Transfer-Encoding", "Transfer-Encoding \"%.100s\" is not supported",
                     f->encoding);
        kiln_err_hint(err, "send the body with Content-Length or Transfer-Encoding: chunked");
        return KILN_EFORMAT;
    }
    /* a length libmicrohttpd cannot read is its to refuse (MHD_queue_response in http.c) */
    if (f->nlength && http_length_ok(f->length) && strtoull(f->length, NULL, 10) > max_body) {
        kiln_err_set(err, KILN_ETOOBIG, NULL, "request body is larger than %llu bytes", (unsigned long long)max_body);
        if (max_body % (1024 * 1024) == 0)
            kiln_err_hint(err, "send at most %llu MiB", (unsigned long long)(max_body / (1024 * 1024)));
        else
            kiln_err_hint(err, "send at most %llu bytes", (unsigned long long)max_body);
        return KILN_ETOOBIG;
    }
    return 0;
}
