/* api.h - kilnd's front ends: REST over libmicrohttpd (http.c and friends) and gRPC over the
 * gRPC C core (grpc_server.c and friends). Thin: decode, call service/, encode. */
#ifndef KILN_API_H
#define KILN_API_H

#include "base/base.h"
#include "service/service.h"

typedef struct api_http api_http_t;
typedef struct api_grpc api_grpc_t;

/* TLS for both front ends: PEM text (not file names). Without cert_pem the server speaks plain
 * text. ca_pem (gRPC) asks every client for a certificate signed by that CA and requires one from
 * agents: mutual TLS. */
typedef struct api_tls {
    const char *cert_pem, *key_pem;
    const char *ca_pem;
} api_tls_t;

typedef struct api_http_config {
    const char *addr;                 /* "127.0.0.1:8080" */
    const api_tls_t *tls;             /* NULL: plain text */
    const char *const *cors_origins;  /* browser origins allowed to call the API (CORS) */
    int ncors;
    bool metrics_auth;                /* GET /metrics needs a token too */
} api_http_config_t;

/* Starts the REST server. svc is borrowed and must outlive the server; cfg is copied. Caller
 * owns *out; stop with api_http_stop(). Returns 0 or KILN_EIO/KILN_EINVAL. */
int api_http_start(svc_t *svc, const api_http_config_t *cfg, api_http_t **out, kiln_err_t *err);
/* Ends live streams, stops the server, frees it. Accepts NULL. */
void api_http_stop(api_http_t *h);

/* Starts the gRPC server (AgentService and TrainingService) on addr ("127.0.0.1:9090"), over TLS
 * when tls has a certificate. Same ownership rules as api_http_start(). */
int api_grpc_start(svc_t *svc, const char *addr, const api_tls_t *tls, api_grpc_t **out, kiln_err_t *err);
/* Shuts the gRPC server down in the order the gRPC core needs, frees it. Accepts NULL. */
void api_grpc_stop(api_grpc_t *g);

/* The routes and methods each front end serves, for tests that must cover every one (the
 * authorization matrix): REST as "METHOD PATTERN" ("POST /v1/jobs/{id}:stop", with `open` true
 * for those that need no token), gRPC as method paths ("/kiln.TrainingService/GetJob"). */
typedef struct api_route_info {
    const char *method;               /* REST method, or NULL for gRPC */
    const char *path;                 /* REST pattern or gRPC method path */
    bool open;                        /* REST: no token needed; gRPC: RegisterWorker (join token) */
    bool agent;                       /* gRPC AgentService */
} api_route_info_t;
/* Fills up to max entries; returns how many routes there are. */
size_t api_http_routes(api_route_info_t *out, size_t max);
size_t api_grpc_methods(api_route_info_t *out, size_t max);

#endif /* KILN_API_H */
