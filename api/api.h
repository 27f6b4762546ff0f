/* api.h - kilnd's front ends: REST over libmicrohttpd (http.c and friends) and gRPC over the
 * gRPC C core (grpc_server.c and friends). Thin: decode, call service/, encode. */
#ifndef KILN_API_H
#define KILN_API_H

#include "base/base.h"
#include "service/service.h"

typedef struct api_http api_http_t;
typedef struct api_grpc api_grpc_t;

/* The oldest TLS version both front ends accept. One policy holds on both ports: TLS 1.2 and 1.3
 * only, forward-secret key exchange (ECDHE) and AEAD ciphers (AES-GCM, ChaCha20-Poly1305) only. */
typedef enum { API_TLS_1_2 = 0, API_TLS_1_3 = 1 } api_tls_min_t;

/* TLS for both front ends: PEM text (not file names). Without cert_pem the server speaks plain
 * text. ca_pem (gRPC) asks every client for a certificate signed by that CA and requires one from
 * agents: mutual TLS. */
typedef struct api_tls {
    const char *cert_pem, *key_pem;
    const char *ca_pem;
    api_tls_min_t min_version;        /* zero: TLS 1.2 */
} api_tls_t;

/* What one client may hold of a front end and how long a connection may take, for both ports.
 * Zero fields take the defaults below; per_address -1 means no per-address limit. */
typedef struct api_net_limits {
    int per_address;                  /* connections one client address (IPv6: its /64) may hold open on a
                                         port at once; more are refused at accept */
    int handshake_ms;                 /* from connect to the end of the TLS handshake (plain text: to the
                                         first bytes, on gRPC) */
    int header_ms;                    /* REST: from a request's first byte to the end of its headers */
    int body_ms;                      /* REST: from the end of a request's headers to the end of its body
                                         (a second more for each KiB that arrived) */
    int idle_ms;                      /* a connection with nothing in flight is closed after this */
} api_net_limits_t;
#define API_NET_PER_ADDRESS 256
#define API_NET_HANDSHAKE_MS 30000
#define API_NET_HEADER_MS 30000
#define API_NET_BODY_MS 60000
#define API_NET_IDLE_MS 120000

typedef struct api_http_config {
    const char *addr;                 /* "127.0.0.1:8080" */
    const api_tls_t *tls;             /* NULL: plain text */
    const char *const *cors_origins;  /* browser origins allowed to call the API (CORS) */
    int ncors;
    bool metrics_auth;                /* GET /metrics needs a token too */
    api_net_limits_t limits;          /* zeros: the defaults */
    int threads;                      /* request handler threads; 0: API_HTTP_THREADS */
    int ping_ms;                      /* SSE keep-alive comment interval; 0: API_HTTP_PING_MS */
} api_http_config_t;
#define API_HTTP_THREADS 8
#define API_HTTP_PING_MS 15000

/* Starts the REST server. svc is borrowed and must outlive the server; cfg is copied. Caller
 * owns *out; stop with api_http_stop(). Returns 0 or KILN_EIO/KILN_EINVAL. */
int api_http_start(svc_t *svc, const api_http_config_t *cfg, api_http_t **out, kiln_err_t *err);
/* Ends live streams, stops the server, frees it. Accepts NULL. */
void api_http_stop(api_http_t *h);

typedef struct api_grpc_config {
    const char *addr;                 /* "127.0.0.1:9090"; "unix:PATH" is served by gRPC itself, without
                                         the per-address limit */
    const api_tls_t *tls;             /* NULL: plain text */
    api_net_limits_t limits;          /* zeros: the defaults */
    bool gate_off;                    /* benchmarks only: gRPC accepts TCP connections itself, without
                                         kilnd's gate (no per-address limit, no TLS version gate) */
} api_grpc_config_t;

/* Starts the gRPC server (AgentService and TrainingService). kilnd owns the TCP listening socket
 * (grpc_gate.c): it counts connections per client address, refuses those over the limit, and
 * hands the others to the gRPC core once their TLS ClientHello has arrived. Same ownership rules
 * as api_http_start(); cfg is copied. Returns 0, KILN_EIO (cannot listen) or KILN_EINVAL. */
int api_grpc_start_with(svc_t *svc, const api_grpc_config_t *cfg, api_grpc_t **out, kiln_err_t *err);
/* api_grpc_start_with on addr with tls (NULL: plain text) and the default limits. */
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
    bool page;                        /* REST: a web UI page (takes any query parameter, reads none) */
} api_route_info_t;
/* Fills up to max entries; returns how many routes there are. */
size_t api_http_routes(api_route_info_t *out, size_t max);
size_t api_grpc_methods(api_route_info_t *out, size_t max);

#endif /* KILN_API_H */
