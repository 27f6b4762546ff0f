/* spec_grpc.c - fuzz target: a job spec as gRPC's CreateJob receives it, through what
 * grpc_server.c and grpc_training.c do with the bytes of the request: the wire check of its text
 * fields, protobuf-c's unpack of CreateJobRequest, the conversion of its JobSpec into the
 * service's JSON (api_grpc_msg_to_json), then the one validator (fuzz_spec.h). */
#include "api/grpc_int.h"
#include "fuzz/fuzz_spec.h"
#include "proto/kiln.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const ProtobufCMessageDescriptor *d = &kiln__create_job_request__descriptor;
    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = api_grpc_wire_check(d, data, size, true, &err);
    if (rc) {
        fuzz_check_client_error(rc, &err);
        return 0;
    }
    Kiln__CreateJobRequest *req = (Kiln__CreateJobRequest *)protobuf_c_message_unpack(d, NULL, size, data);
    if (!req)
        return 0;
    json_t *spec = NULL;
    rc = req->spec ? api_grpc_msg_to_json(&req->spec->base, "spec", &spec, &err) : 0;
    if (rc) {
        fuzz_check_client_error(rc, &err);
        FUZZ_CHECK(!spec);
    } else {
        if (!spec)
            spec = json_object();
        fuzz_spec_check(spec);
    }
    json_decref(spec);
    protobuf_c_message_free_unpacked(&req->base, NULL);
    return 0;
}
