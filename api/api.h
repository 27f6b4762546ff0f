/* api.h - kilnd's front ends: REST over libmicrohttpd (http.c and friends) and gRPC over the
 * gRPC C core (grpc_server.c and friends). Thin: decode, call service/, encode. */
#ifndef KILN_API_H
#define KILN_API_H

#include "base/base.h"
#include "service/service.h"

typedef struct api_http api_http_t;
typedef struct api_grpc api_grpc_t;

/* Starts the REST server on addr ("127.0.0.1:8080"). svc is borrowed and must outlive the
 * server. Caller owns *out; stop with api_http_stop(). Returns 0 or KILN_EIO/KILN_EINVAL. */
int api_http_start(svc_t *svc, const char *addr, api_http_t **out, kiln_err_t *err);
/* Ends live streams, stops the server, frees it. Accepts NULL. */
void api_http_stop(api_http_t *h);

/* Starts the gRPC server (AgentService, and TrainingService where implemented) on addr
 * ("127.0.0.1:9090"). Same ownership rules as api_http_start(). */
int api_grpc_start(svc_t *svc, const char *addr, api_grpc_t **out, kiln_err_t *err);
/* Shuts the gRPC server down in the order the gRPC core needs, frees it. Accepts NULL. */
void api_grpc_stop(api_grpc_t *g);

#endif /* KILN_API_H */
