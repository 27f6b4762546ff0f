/* grpc_test.h - fixture for the gRPC suites: an in-process kilnd (the service on a fresh database,
 * its gRPC server on a free port, and as a suite asks, authentication with token files, TLS, a
 * REST server beside it and the agent's own gRPC client) started by one call and stopped by
 * another, plus the set-up Python's grpcio needs as a foreign client. Test-only code. */
#ifndef KILN_TESTS_GRPC_TEST_H
#define KILN_TESTS_GRPC_TEST_H

#include <stdbool.h>

#include "agent/agent.h"
#include "api/api.h"
#include "service/service.h"
#include "tests/common/harness.h"

/* What a suite's kilnd has. */
typedef struct gt_opts {
    const char *name;       /* names the database ("<name>_...") and the directory (/tmp/kiln-<name>.XXXXXX) */
    svc_config_t svc;       /* the service's settings; database_url is filled in, and so are
                               bootstrap_token_file and join_token_file with auth, artifact_dir with
                               artifacts; zeros take a heartbeat every 200 ms, 10 s to declare a
                               worker dead and 4 database connections */
    const char *artifacts;  /* the artifact store, a directory of that name under dir; NULL: none */
    bool auth;              /* tokens written under dir (admin.token, join.token) and read back; a
                               REST server's th_http sends the admin's */
    bool tls;               /* gRPC over TLS with th_tls_dir()'s server certificate, asking clients for
                               certificates signed by its CA */
    bool http;              /* a REST server too, plain text */
    bool rpc;               /* the agent's gRPC client to the server, plain text */
    bool python;            /* Python's grpcio: the test skips without it; kiln_pb2 is generated into dir */
} gt_opts_t;

/* A running kilnd. Every field belongs to the fixture; gt_stop releases them. */
typedef struct gt_kilnd {
    gt_opts_t opts;          /* as started (svc filled in) */
    svc_t *svc;
    api_grpc_t *grpc;
    api_http_t *http;        /* NULL unless opts.http */
    agent_rpc_t *rpc;        /* NULL unless opts.rpc */
    char *dburl;
    char dir[128];           /* a fresh directory, removed by gt_stop */
    char addr[64];           /* the gRPC server's "127.0.0.1:PORT" */
    char http_addr[64];      /* the REST server's "127.0.0.1:PORT" ("" without one) */
    char base[64];           /* "http://127.0.0.1:PORT" ("" without one) */
    int http_port;           /* 0 without one */
    char tls[256];           /* th_tls_dir() with opts.tls, else "" */
    char admin_token[128], join_token[128]; /* with opts.auth, else "" */
    char boot_file[200], join_file[200], artifact_dir[200];
} gt_kilnd_t;

/* Starts what opts asks for into k (the caller's storage, zeroed here). Asserts on failure. */
void gt_start(gt_kilnd_t *k, const gt_opts_t *opts);
/* Stops and frees what gt_start started and removes the directory; accepts a k never started. */
void gt_stop(gt_kilnd_t *k);
/* Replaces the service and its servers with new ones on a fresh database named after db_prefix,
 * at the same addresses, with the same settings; the directory and the agent's client stay. */
void gt_restart(gt_kilnd_t *k, const char *db_prefix);

/* Starts a REST server beside the gRPC one (a no-op when it runs): k->base, k->http_port; with
 * auth, th_http sends the admin's token. gt_stop stops it. */
void gt_http_start(gt_kilnd_t *k);
/* Stops the gRPC server alone (the service and the REST server stay), and starts it again at the
 * same address. */
void gt_grpc_stop(gt_kilnd_t *k);
void gt_grpc_start(gt_kilnd_t *k);

/* Skips the test unless Python's grpcio is there, then generates kiln_pb2 into dir. */
void gt_python_ready(const char *dir);
/* Runs calls (a JSON array; taken) through Python's grpcio (tests/grpc/grpc_client.py) in one
 * process over a plain-text channel to k's gRPC server, the plan written to k->dir/NAME.json:
 * its answers, one a call: {"code", "details", "response" (proto JSON, proto field names),
 * "trailing"} (caller decrefs). Asserts the client ran. */
json_t *gt_grpc_calls(const gt_kilnd_t *k, json_t *calls, const char *name);

/* One request to k's REST server (gt_http_start), body JSON or NULL: the reply as JSON (caller
 * decrefs; asserts there is one and that it is JSON) and the status in *status. */
json_t *gt_rest(const gt_kilnd_t *k, const char *method, const char *path, const char *body, long *status);

/* Writes a rank program, a shell script ("#!/bin/sh\n" then body), to k->dir/fake-train.sh and
 * makes it executable: its path (static storage, the same for every call). */
char *gt_rank_script(const gt_kilnd_t *k, const char *body);
/* An in-process agent of k's gRPC server over plain text, with cfg's settings (the server is k's;
 * address "127.0.0.1", slot_type "cpu", 1 slot and a stop grace of 2000 ms unless cfg says), once
 * it has registered (asserts when it has not within 5 s). Caller owns it; agent_destroy(). */
agent_t *gt_agent_start(const gt_kilnd_t *k, agent_config_t cfg);

#endif
