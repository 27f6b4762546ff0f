/* grpc_code.c - code archives over gRPC: TrainingService.UploadCode, an upload in pieces of at
 * most 4 MiB (one call each, resumable at the offset kilnd holds), and AgentService.FetchCode,
 * the archive an agent's assigned job runs. DownloadCode streams from grpc_stream.c. The checks
 * are the service's (service/code.c), the same as REST's. */
#include "api/grpc_int.h"

#include <stdio.h>
#include <string.h>

#define UPLOAD_PIECE_MAX (4 << 20)

int api_grpc_upload_code(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *arena,
                         ProtobufCMessage **resp, kiln_err_t *err)
{
    const Kiln__UploadCodeRequest *r = (const Kiln__UploadCodeRequest *)req;
    if (r->data.len > UPLOAD_PIECE_MAX) {
        kiln_err_set(err, KILN_EINVAL, "data", "a call carries at most 4 MiB of the archive, not %zu bytes",
                     r->data.len);
        kiln_err_hint(err, "send the archive in pieces of 4 MiB or less, each at the offset the last answer gave");
        return KILN_EINVAL;
    }
    svc_code_upload_t *u = NULL;
    int rc = svc_code_upload_open(ctx->svc, ctx->who, r->project, r->upload_id, r->offset, -1, &u, err);
    if (rc)
        return rc;
    if (r->data.len && (rc = svc_code_upload_write(u, r->data.data, r->data.len, err))) {
        /* past the limit the upload is gone; after an I/O error what kilnd holds stays */
        svc_code_upload_close(u, rc != KILN_ETOOBIG);
        return rc;
    }
    Kiln__UploadCodeResponse *out = arena_alloc(arena, sizeof(*out));
    kiln__upload_code_response__init(out);
    out->upload_id = arena_strdup(arena, svc_code_upload_id(u));
    out->offset = svc_code_upload_offset(u);
    if (!r->finish) {
        svc_code_upload_close(u, true);
        *resp = &out->base;
        return 0;
    }
    json_t *done = NULL;
    if ((rc = svc_code_upload_finish(u, &done, err)))
        return rc;
    out->source = arena_strdup(arena, json_string_value(json_object_get(done, "source")));
    out->digest = arena_strdup(arena, json_string_value(json_object_get(done, "digest")));
    out->size = json_integer_value(json_object_get(done, "size"));
    out->files = (int32_t)json_integer_value(json_object_get(done, "files"));
    out->project = arena_strdup(arena, json_string_value(json_object_get(done, "project")));
    out->created = json_is_true(json_object_get(done, "created"));
    json_decref(done);
    *resp = &out->base;
    return 0;
}

int api_grpc_fetch_code(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *arena,
                        ProtobufCMessage **resp, kiln_err_t *err)
{
    Kiln__CodeChunk *out = arena_alloc(arena, sizeof(*out));
    kiln__code_chunk__init(out);
    *resp = &out->base;
    return svc_agent_code(ctx->svc, ctx->worker_id, (const Kiln__CodeRequest *)req, arena, out, err);
}
