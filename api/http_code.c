/* http_code.c - REST for code archives: POST /v1/code?project=P takes a gzip'd tar as the
 * streamed request body (never held in memory: each piece goes to the service's upload as it
 * arrives) and answers the source a script job names; GET /v1/code/{digest}?project=P gives the
 * archive back to the project's members. The checks are the service's (service/code.c). */
#include <stdlib.h>
#include <string.h>

#include "api/http_int.h"

int http_code_body(http_req_t *r, const char *data, size_t n, kiln_err_t *err)
{
    if (data)
        return svc_code_upload_write(r->stream, data, n, err);
    /* a Content-Length past the limit is refused before a byte of the body is read */
    int64_t announced = -1;
    const char *len = http_header(r, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (len && svc_check_int_text("Content-Length", len, 0, INT64_MAX, &announced, err))
        return KILN_EINVAL;
    svc_code_upload_t *u = NULL;
    int rc = svc_code_upload_open(r->h->svc, &r->who, http_arg(r, "project"), NULL, 0, announced, &u, err);
    r->stream = u;
    return rc;
}

enum MHD_Result http_code_upload(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *out = NULL;
    int rc = svc_code_upload_finish(r->stream, &out, &err);
    r->stream = NULL;
    if (rc) {
        if (!err.status)
            err.status = rc;
        return http_reply_err(r, &err);
    }
    bool created = json_is_true(json_object_get(out, "created"));
    return http_reply_json(r, created ? MHD_HTTP_CREATED : MHD_HTTP_OK, out);
}

void http_code_done(http_req_t *r)
{
    svc_code_upload_close(r->stream, false);
    r->stream = NULL;
}

enum MHD_Result http_code_get(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    svc_artifact_file_t f;
    int rc = svc_code_open(r->h->svc, &r->who, http_arg(r, "project"), http_param(r, "digest"), &f, &err);
    if (rc) {
        if (!err.status)
            err.status = rc;
        return http_reply_err(r, &err);
    }
    return http_reply_file(r, &f, "application/gzip");
}

const http_stream_route_t http_stream_routes[] = {
    {http_code_upload, http_code_body, http_code_done},
};
const size_t http_stream_route_count = KILN_ARRAY_LEN(http_stream_routes);
