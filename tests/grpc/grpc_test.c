/* grpc_test.c - the gRPC suites' in-process kilnd (see grpc_test.h). */
#include "tests/grpc/grpc_test.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The first line of path into out; asserts it is there. */
static void read_token(const char *path, char *out, size_t n)
{
    char *text = th_read_line(path);
    cr_assert_not_null(text, "could not read %s", path);
    snprintf(out, n, "%s", text);
    free(text);
}

/* The service and its servers, on k->dburl, at the addresses k holds; with auth, the tokens the
 * service wrote. */
static void start_servers(gt_kilnd_t *k)
{
    kiln_err_t err;
    k->opts.svc.database_url = k->dburl;
    cr_assert_eq(svc_create(&k->opts.svc, &k->svc, &err), 0, "%s", err.message);
    if (k->opts.auth) {
        read_token(k->boot_file, k->admin_token, sizeof k->admin_token);
        read_token(k->join_file, k->join_token, sizeof k->join_token);
    }
    if (k->opts.http)
        gt_http_start(k);
    gt_grpc_start(k);
}

static void stop_servers(gt_kilnd_t *k)
{
    gt_grpc_stop(k);
    api_http_stop(k->http);
    k->http = NULL;
    svc_destroy(k->svc);
    k->svc = NULL;
    free(k->dburl);
    k->dburl = NULL;
}

void gt_grpc_start(gt_kilnd_t *k)
{
    kiln_err_t err;
    if (!k->opts.tls) {
        cr_assert_eq(api_grpc_start(k->svc, k->addr, NULL, &k->grpc, &err), 0, "%s", err.message);
        return;
    }
    char path[300];
    char *cert = NULL, *key = NULL, *ca = NULL;
    snprintf(path, sizeof path, "%s/server.pem", k->tls);
    cr_assert_eq(kiln_file_read(path, &cert, NULL, &err), 0, "%s", err.message);
    snprintf(path, sizeof path, "%s/server.key", k->tls);
    cr_assert_eq(kiln_file_read(path, &key, NULL, &err), 0, "%s", err.message);
    snprintf(path, sizeof path, "%s/ca.pem", k->tls);
    cr_assert_eq(kiln_file_read(path, &ca, NULL, &err), 0, "%s", err.message);
    api_tls_t tls = {.cert_pem = cert, .key_pem = key, .ca_pem = ca};
    int rc = api_grpc_start(k->svc, k->addr, &tls, &k->grpc, &err);
    free(cert);
    free(key);
    free(ca);
    cr_assert_eq(rc, 0, "%s", err.message);
}

void gt_http_start(gt_kilnd_t *k)
{
    if (k->http)
        return;
    if (!k->http_port) {
        k->http_port = th_free_port();
        snprintf(k->http_addr, sizeof k->http_addr, "127.0.0.1:%d", k->http_port);
        snprintf(k->base, sizeof k->base, "http://127.0.0.1:%d", k->http_port);
    }
    k->opts.http = true;
    if (k->opts.auth)
        th_http_set_token(k->admin_token);
    api_http_config_t hc = {.addr = k->http_addr};
    kiln_err_t err;
    cr_assert_eq(api_http_start(k->svc, &hc, &k->http, &err), 0, "%s", err.message);
}

void gt_grpc_stop(gt_kilnd_t *k)
{
    api_grpc_stop(k->grpc);
    k->grpc = NULL;
}

static void skip_without_python(void)
{
    const char *missing = th_grpc_python_missing();
    if (missing)
        cr_skip_test("%s", missing);
}

void gt_python_ready(const char *dir)
{
    skip_without_python();
    cr_assert_eq(th_protoc_python(dir), 0);
}

void gt_start(gt_kilnd_t *k, const gt_opts_t *opts)
{
    memset(k, 0, sizeof *k);
    k->opts = *opts;
    svc_config_t *cfg = &k->opts.svc;
    cfg->heartbeat_interval_ms = cfg->heartbeat_interval_ms ? cfg->heartbeat_interval_ms : 200;
    cfg->heartbeat_timeout_ms = cfg->heartbeat_timeout_ms ? cfg->heartbeat_timeout_ms : 10000;
    cfg->db_pool_size = cfg->db_pool_size ? cfg->db_pool_size : 4;
    if (opts->python)
        skip_without_python(); /* before anything is made */
    k->dburl = th_pg_create_db(opts->name);
    cr_assert_not_null(k->dburl, "needs the test PostgreSQL cluster (run through tests/run.sh)");
    snprintf(k->dir, sizeof k->dir, "/tmp/kiln-%s.XXXXXX", opts->name);
    cr_assert_not_null(mkdtemp(k->dir), "could not make %s", k->dir);
    if (opts->tls) {
        const char *t = th_tls_dir();
        cr_assert_not_null(t);
        snprintf(k->tls, sizeof k->tls, "%s", t);
    }
    if (opts->auth) {
        snprintf(k->boot_file, sizeof k->boot_file, "%s/admin.token", k->dir);
        snprintf(k->join_file, sizeof k->join_file, "%s/join.token", k->dir);
        k->opts.svc.bootstrap_token_file = k->boot_file;
        k->opts.svc.join_token_file = k->join_file;
    }
    if (opts->artifacts) {
        snprintf(k->artifact_dir, sizeof k->artifact_dir, "%s/%s", k->dir, opts->artifacts);
        k->opts.svc.artifact_dir = k->artifact_dir;
    }
    snprintf(k->addr, sizeof k->addr, "127.0.0.1:%d", th_free_port());
    start_servers(k);
    if (opts->rpc) {
        kiln_err_t err;
        cr_assert_eq(agent_rpc_create(k->addr, NULL, &k->rpc, &err), 0, "%s", err.message);
    }
    if (opts->python)
        gt_python_ready(k->dir);
}

void gt_restart(gt_kilnd_t *k, const char *db_prefix)
{
    stop_servers(k);
    k->dburl = th_pg_create_db(db_prefix);
    cr_assert_not_null(k->dburl, "needs the test PostgreSQL cluster (run through tests/run.sh)");
    start_servers(k);
}

void gt_stop(gt_kilnd_t *k)
{
    agent_rpc_destroy(k->rpc);
    k->rpc = NULL;
    stop_servers(k);
    if (k->dir[0] && !th_rm_tree(k->dir))
        fprintf(stderr, "could not remove %s\n", k->dir);
    k->dir[0] = '\0';
}

json_t *gt_grpc_calls(const gt_kilnd_t *k, json_t *calls, const char *name)
{
    char said[4096];
    json_t *out = th_grpc_plain(k->addr, k->dir, calls, name, said, sizeof said);
    cr_assert_not_null(out, "grpc_client.py: %s", said);
    return out;
}

char *gt_rank_script(const gt_kilnd_t *k, const char *body)
{
    static char path[200];
    snprintf(path, sizeof path, "%s/fake-train.sh", k->dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "could not write %s", path);
    fprintf(f, "#!/bin/sh\n%s", body);
    fclose(f);
    chmod(path, 0755);
    return path;
}

agent_t *gt_agent_start(const gt_kilnd_t *k, agent_config_t cfg)
{
    cfg.server = k->addr;
    cfg.address = cfg.address ? cfg.address : "127.0.0.1";
    cfg.slot_type = cfg.slot_type ? cfg.slot_type : "cpu";
    cfg.slots = cfg.slots ? cfg.slots : 1;
    cfg.stop_grace_ms = cfg.stop_grace_ms ? cfg.stop_grace_ms : 2000;
    cfg.tls.insecure = true;
    agent_t *a = NULL;
    kiln_err_t err;
    cr_assert_eq(agent_create(&cfg, &a, &err), 0, "%s", err.message);
    for (int64_t end = kiln_mono_us() + 30000000; kiln_mono_us() < end;) {
        char id[128];
        agent_worker_id(a, id, sizeof id);
        if (id[0])
            return a;
        usleep(50000);
    }
    cr_assert_fail("the agent did not register within 30 s");
    return NULL;
}

json_t *gt_rest(const gt_kilnd_t *k, const char *method, const char *path, const char *body, long *status)
{
    char url[256], *out = NULL;
    snprintf(url, sizeof url, "%s%s", k->base, path);
    const char *hdrs[] = {"Content-Type: application/json", NULL};
    cr_assert_eq(th_http(method, url, body, hdrs, status, &out, 10000), 0, "%s %s: no answer", method, path);
    json_t *j = json_loads(out ? out : "", 0, NULL);
    cr_assert_not_null(j, "%s %s: %s", method, path, out);
    free(out);
    return j;
}
