/* grpc_int.h - internals shared by the gRPC server's files (grpc_server.c, grpc_training.c):
 * the method table entry. Nothing outside api/grpc_*.c includes this. */
#ifndef KILN_API_GRPC_INT_H
#define KILN_API_GRPC_INT_H

#include <protobuf-c/protobuf-c.h>

#include "base/base.h"
#include "service/service.h"

/* Handles one decoded request: fills *resp (allocated from arena, or NULL on error) and returns
 * 0 or a kiln status with err filled. Runs on a gRPC completion-queue thread. */
typedef int (*api_grpc_handler_fn)(svc_t *s, const ProtobufCMessage *req, arena_t *arena,
                                   ProtobufCMessage **resp, kiln_err_t *err);

typedef struct api_grpc_method {
    const char *path;                            /* "/kiln.AgentService/Heartbeat" */
    const ProtobufCMessageDescriptor *req_desc;  /* request message type */
    api_grpc_handler_fn handle;
} api_grpc_method_t;

/* TrainingService's unary methods (grpc_training.c). */
extern const api_grpc_method_t api_grpc_training_methods[];
extern const size_t api_grpc_training_method_count;

#endif /* KILN_API_GRPC_INT_H */
