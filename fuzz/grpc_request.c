/* grpc_request.c - fuzz target: the bytes of any gRPC request kilnd serves (TrainingService from
 * users, AgentService from agents), through what grpc_server.c does before a handler runs: the
 * wire check of text fields (api_grpc_wire_check), then protobuf-c's unpack of the method's
 * request type. Input: the method's name ("CreateJob", "PushLogs"), a NUL, then the message.
 * A message the wire check passes holds only valid text: converting it (api_grpc_msg_to_json,
 * which checks every string again after decoding) never finds a string that is not. */
#include "api/grpc_int.h"
#include "fuzz/fuzz.h"
#include "proto/kiln.pb-c.h"

/* The request type of the method called name, or NULL. */
static const ProtobufCMessageDescriptor *request_type(const char *name)
{
    const ProtobufCServiceDescriptor *services[] = {&kiln__training_service__descriptor,
                                                    &kiln__agent_service__descriptor};
    for (size_t s = 0; s < KILN_ARRAY_LEN(services); s++)
        for (unsigned i = 0; i < services[s]->n_methods; i++)
            if (!strcmp(services[s]->methods[i].name, name))
                return services[s]->methods[i].input;
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, '\0', size < 64 ? size : 64);
    if (!nul)
        return 0;
    const ProtobufCMessageDescriptor *d = request_type((const char *)data);
    if (!d)
        return 0;
    const uint8_t *msg = nul + 1;
    size_t len = size - (size_t)(msg - data);

    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = api_grpc_wire_check(d, msg, len, true, &err);
    if (rc) {
        FUZZ_CHECK(rc == KILN_EINVAL && err.message[0]);
        return 0;
    }
    ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, len, msg);
    if (!m)
        return 0;
    json_t *j = NULL;
    kiln_err_clear(&err);
    rc = api_grpc_msg_to_json(m, "", &j, &err);
    if (rc) {
        FUZZ_CHECK(rc == KILN_EINVAL && !j);
        if (strstr(err.message, "NUL byte") || strstr(err.message, "not valid UTF-8"))
            fprintf(stderr, "fuzz: the wire check passed text that is not: %s\n", err.message);
        FUZZ_CHECK(!strstr(err.message, "NUL byte") && !strstr(err.message, "not valid UTF-8"));
    }
    json_decref(j);
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}
