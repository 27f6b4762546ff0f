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
}

void kiln_err_hint(kiln_err_t *err, const char *fmt, ...)
{
    if (!err)
        return;
    va_list ap;
    va_start(ap, fmt);
    kiln_text_vfmt(err->hint, sizeof(err->hint), fmt, ap);
    va_end(ap);
}
