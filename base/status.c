/* status.c - the status table (base.h's KILN_STATUS_MAP) and rich error helpers.
 * Maps each kiln status to its message, API code string, HTTP status and gRPC status. */
#include "base/base.h"

#include <stdio.h>
#include <string.h>

struct status_row {
    int value;
    const char *code;
    const char *message;
    int http;
    int grpc;
};

static const struct status_row status_rows[] = {
#define KILN_STATUS_ROW(name, val, code, msg, http, grpc) {val, code, msg, http, grpc},
    KILN_STATUS_MAP(KILN_STATUS_ROW)
#undef KILN_STATUS_ROW
};

static const struct status_row *status_find(int status)
{
    for (size_t i = 0; i < KILN_ARRAY_LEN(status_rows); i++)
        if (status_rows[i].value == status)
            return &status_rows[i];
    return NULL;
}

const char *kiln_strerror(int status)
{
    const struct status_row *r = status_find(status);
    return r ? r->message : "unknown error";
}

const char *kiln_status_code(int status)
{
    const struct status_row *r = status_find(status);
    return r ? r->code : "internal";
}

int kiln_status_http(int status)
{
    const struct status_row *r = status_find(status);
    return r ? r->http : 500;
}

int kiln_status_grpc(int status)
{
    const struct status_row *r = status_find(status);
    return r ? r->grpc : 13;
}

bool kiln_grpc_retryable(int code)
{
    /* UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, CANCELLED, UNKNOWN, INTERNAL */
    return code == 14 || code == 4 || code == 8 || code == 10 || code == 1 || code == 2 || code == 13;
}

void kiln_err_clear(kiln_err_t *err)
{
    if (err)
        memset(err, 0, sizeof(*err));
}

/* An error's text as a terminal may show it: every terminal control character (kiln_text_control:
 * ESC, BEL, CR, a bidirectional override, ...) that a client's input brought into it is written
 * as \uXXXX, wherever the message was formatted, so that no refusal echoes one (lines: a detail
 * keeps its line breaks). Text already quoted with kiln_text_quote has none, and is unchanged. */
static void err_text_clean(char *buf, size_t cap, bool lines)
{
    size_t n = strlen(buf);
    if (kiln_text_control_at(buf, n) == n && kiln_utf8_check(buf, n) == n)
        return;
    char out[sizeof(((kiln_err_t *)0)->detail)]; /* the largest of an error's texts */
    size_t room = cap < sizeof out ? cap : sizeof out, o = 0;
    for (size_t i = 0; i < n && o + 1 < room;) {
        size_t k = i;
        while (k < n && !(lines && buf[k] == '\n'))
            k++;
        o += kiln_text_escape(out + o, room - o, buf + i, k - i, 0);
        if (k < n && o + 1 < room)
            out[o++] = '\n';
        i = k + 1;
    }
    out[o] = '\0';
    memcpy(buf, out, o + 1);
}

int kiln_err_set(kiln_err_t *err, int status, const char *field, const char *fmt, ...)
{
    if (!err)
        return status;
    kiln_err_clear(err);
    err->status = status;
    if (field)
        kiln_strlcpy(err->field, field, sizeof(err->field));
    va_list ap;
    va_start(ap, fmt);
    kiln_text_vfmt(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    err_text_clean(err->field, sizeof(err->field), false);
    err_text_clean(err->message, sizeof(err->message), false);
    return status;
}

void kiln_err_detail(kiln_err_t *err, const char *fmt, ...)
{
    if (!err)
        return;
    va_list ap;
    va_start(ap, fmt);
    kiln_text_vfmt(err->detail, sizeof(err->detail), fmt, ap);
    va_end(ap);
    err_text_clean(err->detail, sizeof(err->detail), true);
}

void kiln_err_hint(kiln_err_t *err, const char *fmt, ...)
{
    if (!err)
        return;
    va_list ap;
    va_start(ap, fmt);
    kiln_text_vfmt(err->hint, sizeof(err->hint), fmt, ap);
    va_end(ap);
    err_text_clean(err->hint, sizeof(err->hint), false);
}
