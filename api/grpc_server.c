/* grpc_server.c - placeholder until the AgentService server lands: reports "not supported". */
#include "api/api.h"

int api_grpc_start(svc_t *svc, const char *addr, api_grpc_t **out, kiln_err_t *err)
{
    (void)svc;
    *out = NULL;
    return kiln_err_set(err, KILN_EUNSUPP, NULL, "gRPC server on %s is not built yet", addr);
}

void api_grpc_stop(api_grpc_t *g) { (void)g; }
