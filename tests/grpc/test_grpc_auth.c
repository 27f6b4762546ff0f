/* test_grpc_auth.c - who may call what over gRPC, against an in-process kilnd serving TLS (and
 * asking agents for client certificates) on a fresh database, driven by Python's grpcio as a
 * foreign client (tests/grpc/grpc_client.py): the authorization matrix over every method the
 * server registers, forged agents (no join token, no client certificate, a stolen worker id, a
 * real agent reporting for another agent's job), and TLS itself. */
#include "code/code.h"
#include "tests/grpc/grpc_test.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static gt_kilnd_t K;
static svc_t *S;
static const char *const addr = K.addr, *const dir = K.dir, *const tls = K.tls, *const admin_token = K.admin_token,
                         *const join_token = K.join_token;
/* What a suite changes in kilnd's configuration before it starts (the agent-trust suites). */
static void (*configure)(svc_config_t *cfg);

static void setup(void)
{
    /* The workers here are played in-process and heartbeat only when a test says so: none may be
     * declared dead while a slow client call runs (no test here is about liveness). */
    gt_opts_t o = {.name = "grpcauth", .auth = true, .artifacts = "artifacts", .tls = true, .python = true,
                   .svc = {.heartbeat_timeout_ms = 600000, .sched_interval_ms = 50}};
    if (configure)
        configure(&o.svc);
    gt_start(&K, &o);
    S = K.svc;
}

static void teardown(void)
{
    gt_stop(&K);
}

TestSuite(grpc_auth, .init = setup, .fini = teardown, .timeout = 180);

/* ---- the foreign client ------------------------------------------------------------------- */

/* One call of a plan: method, request (JSON text, may be NULL), bearer token (NULL: none). */
typedef struct gcall {
    const char *method;
    json_t *request;             /* stolen */
    const char *token;
    const char *worker_credential;
    bool no_client_cert;
    const char *cert;            /* another client certificate: "agent2" (NULL: agent.pem) */
} gcall_t;

/* Runs the calls with grpc_client.py over TLS; returns an array of {code, details, response}. */
static json_t *run_calls(const gcall_t *calls, size_t n, bool tls_on)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *c = json_pack("{s:s, s:o, s:b}", "method", calls[i].method,
                              "request", calls[i].request ? calls[i].request : json_object(),
                              "client_cert", !calls[i].no_client_cert);
        if (calls[i].cert)
            json_object_set_new(c, "client_cert", json_string(calls[i].cert));
        if (calls[i].token)
            json_object_set_new(c, "token", json_string(calls[i].token));
        if (calls[i].worker_credential)
            json_object_set_new(c, "worker_credential", json_string(calls[i].worker_credential));
        json_array_append_new(arr, c);
    }
    char ca[300] = "", cert[300], key[300];
    if (tls_on)
        snprintf(ca, sizeof ca, "%s/ca.pem", tls);
    snprintf(cert, sizeof cert, "%s/agent.pem", tls);
    snprintf(key, sizeof key, "%s/agent.key", tls);
    char cert2[300], key2[300];
    snprintf(cert2, sizeof cert2, "%s/agent2.pem", tls);
    snprintf(key2, sizeof key2, "%s/agent2.key", tls);
    json_t *plan = json_pack("{s:s, s:s, s:s, s:s, s:s, s:{s:[s, s]}, s:o}", "target", addr, "proto_dir", dir, "ca", ca,
                             "client_cert", cert, "client_key", key, "client_certs", "agent2", cert2, key2, "calls",
                             arr);
    char path[200], said[4096];
    snprintf(path, sizeof path, "%s/plan.json", dir);
    json_t *out = th_grpc_client(plan, path, said, sizeof said);
    cr_assert_not_null(out, "grpc_client.py: %s", said);
    cr_assert_eq(json_array_size(out), n);
    return out;
}

static const char *code_of(json_t *results, size_t i)
{
    return json_string_value(json_object_get(json_array_get(results, i), "code"));
}

/* ---- the world: users, projects, jobs ----------------------------------------------------- */

enum { C_NONE, C_BAD, C_EXPIRED, C_REVOKED, C_VIEWER, C_EDITOR, C_OTHER_ADMIN, C_PROJECT_ADMIN, C_CLUSTER_ADMIN,
       C_COUNT };
static const char *const k_callers[C_COUNT] = {"no token", "bad token", "expired", "revoked", "viewer",
                                               "editor", "admin of another project", "project admin",
                                               "cluster admin"};
static char tokens[C_COUNT][128];
static char job_p[64], victim_token[64], stop_jobs[C_COUNT][64], del_jobs[C_COUNT][64];
static char tuning_p[64], stop_tunings[C_COUNT][64];

/* A tuning request over project's mlp job (one trial). Caller owns it. */
static json_t *tuning_body(const char *project)
{
    return json_pack("{s:s, s:{s:s, s:s, s:{s:s, s:[i], s:i, s:i}, s:{s:s}}, s:{s:{s:s, s:f, s:f}}, s:{s:s}, s:i}",
                     "name", "t", "job", "name", "g", "project", project, "model", "type", "mlp", "hidden", 8,
                     "n_inputs", 4, "n_classes", 2, "data", "train", "synthetic", "parameters", "lr", "type",
                     "continuous", "min", 0.0001, "max", 0.01, "objective", "metric", "val_loss", "max_jobs", 1);
}
static void new_tuning(const char *project, char *id)
{
    json_t *b = tuning_body(project), *out = NULL;
    kiln_err_t err;
    cr_assert_eq(svc_tuning_create(S, svc_caller_kilnd(), b, &out, &err), 0, "%s", err.message);
    snprintf(id, 64, "%s", json_string_value(json_object_get(out, "id")));
    json_decref(out);
    json_decref(b);
}
static char victim_join[32], victim_ban[24];

/* A worker registered in-process whose agent is shutting down (a heartbeat says so): its slot
 * counts for what the cluster could run, but nothing is placed on it. */
static void bare_worker(const char *id, char *cred)
{
    kiln_err_t err;
    arena_t a;
    arena_init(&a, 0);
    Kiln__RegisterRequest req = KILN__REGISTER_REQUEST__INIT;
    Kiln__RegisterResponse reg = KILN__REGISTER_RESPONSE__INIT;
    req.worker_id = (char *)id;
    req.hostname = "bare";
    req.slots = 1;
    req.slot_type = "cpu";
    cr_assert_eq(svc_agent_register(S, &req, NULL, &a, &reg, &err), 0, "%s", err.message);
    if (cred)
        snprintf(cred, 128, "%s", reg.credential);
    Kiln__HeartbeatRequest hb = KILN__HEARTBEAT_REQUEST__INIT;
    Kiln__HeartbeatResponse out = KILN__HEARTBEAT_RESPONSE__INIT;
    hb.worker_id = (char *)id;
    hb.draining = true;
    cr_assert_eq(svc_agent_heartbeat(S, id, &hb, &a, &out, &err), 0, "%s", err.message);
    cr_assert_eq(out.n_assignments, 0);
    arena_deinit(&a);
}

static void user(const char *name, int64_t expires_in_s, char *token_out)
{
    kiln_err_t err;
    json_t *out = NULL;
    cr_assert_eq(svc_user_create(S, svc_caller_kilnd(), name, false, &out, &err), 0, "%s", err.message);
    json_decref(out);
    cr_assert_eq(svc_token_create(S, svc_caller_kilnd(), name, expires_in_s, "", &out, &err), 0, "%s", err.message);
    if (token_out)
        snprintf(token_out, 128, "%s", json_string_value(json_object_get(out, "token")));
    json_decref(out);
}

static void member(const char *project, const char *name, const char *role)
{
    kiln_err_t err;
    json_t *out = NULL;
    cr_assert_eq(svc_member_set(S, svc_caller_kilnd(), project, name, role, &out, &err), 0, "%s", err.message);
    json_decref(out);
}

static void new_job(const char *project, char *id_out)
{
    json_t *spec = json_pack("{s:s, s:s, s:{s:s, s:[i], s:i, s:i}, s:{s:s}}", "name", "g", "project", project,
                             "model", "type", "mlp", "hidden", 8, "n_inputs", 4, "n_classes", 2,
                             "data", "train", "synthetic");
    json_t *job = NULL;
    bool created;
    kiln_err_t err;
    cr_assert_eq(svc_job_create(S, svc_caller_kilnd(), spec, NULL, &job, &created, &err), 0, "%s", err.message);
    snprintf(id_out, 64, "%s", json_string_value(json_object_get(job, "id")));
    json_decref(job);
    json_decref(spec);
}

/* A code archive of project p (its digest and base64 bytes, for UploadCode and DownloadCode). */
static char code_digest[KILN_SHA256_HEX], *code_b64;
static void code_world(void)
{
    char src[200], tgz[220], p[240];
    snprintf(src, sizeof src, "%s/src", dir);
    cr_assert_eq(mkdir(src, 0755), 0);
    snprintf(p, sizeof p, "%s/train.py", src);
    FILE *f = fopen(p, "w");
    fputs("print(1)\n", f);
    fclose(f);
    snprintf(tgz, sizeof tgz, "%s.tgz", src);
    int fd = open(tgz, O_RDWR | O_CREAT | O_TRUNC, 0600);
    kiln_err_t err;
    cr_assert_eq(code_pack_dir(src, fd, NULL, 0, NULL, &err), 0, "%s", err.message);
    close(fd);
    char *data = NULL;
    size_t len = 0;
    cr_assert_eq(kiln_file_read(tgz, &data, &len, &err), 0);
    kiln_sha256_hex(data, len, code_digest);
    size_t b64n = sodium_base64_encoded_len(len, sodium_base64_VARIANT_ORIGINAL);
    code_b64 = malloc(b64n);
    sodium_bin2base64(code_b64, b64n, (const unsigned char *)data, len, sodium_base64_VARIANT_ORIGINAL);
    svc_code_upload_t *u = NULL;
    json_t *out = NULL;
    cr_assert_eq(svc_code_upload_open(S, svc_caller_kilnd(), "p", NULL, 0, (int64_t)len, &u, &err), 0, "%s", err.message);
    cr_assert_eq(svc_code_upload_write(u, data, len, &err), 0, "%s", err.message);
    cr_assert_eq(svc_code_upload_finish(u, &out, &err), 0, "%s", err.message);
    json_decref(out);
    free(data);
}

static void world(void)
{
    kiln_err_t err;
    json_t *out = NULL;
    /* what agent trust acts on: workers to approve and remove, first, before any job could be
     * placed on them; they are shutting down, so nothing ever is */
    bare_worker("w-matrix", NULL);
    bare_worker("w-matrix-gone", NULL);
    bare_worker("w-matrix-banned", NULL);
    cr_assert_eq(svc_project_create(S, svc_caller_kilnd(), "p", NULL, &out, &err), 0, "%s", err.message);
    json_decref(out);
    cr_assert_eq(svc_project_create(S, svc_caller_kilnd(), "q", NULL, &out, &err), 0, "%s", err.message);
    json_decref(out);
    snprintf(tokens[C_CLUSTER_ADMIN], 128, "%s", admin_token);
    snprintf(tokens[C_BAD], 128, "kiln_never-issued");
    user("viewer", 0, tokens[C_VIEWER]);
    user("editor", 0, tokens[C_EDITOR]);
    user("qadmin", 0, tokens[C_OTHER_ADMIN]);
    user("padmin", 0, tokens[C_PROJECT_ADMIN]);
    user("lapsed", 1, tokens[C_EXPIRED]);
    user("gone", 0, tokens[C_REVOKED]);
    member("p", "viewer", "viewer");
    member("p", "editor", "editor");
    member("q", "qadmin", "admin");
    member("p", "padmin", "admin");
    member("p", "lapsed", "admin");
    member("p", "gone", "admin");
    cr_assert_eq(svc_tokens_list(S, svc_caller_kilnd(), "gone", &out, &err), 0);
    const char *gone_id = json_string_value(json_object_get(json_array_get(json_object_get(out, "tokens"), 0), "id"));
    json_t *rev = NULL;
    cr_assert_eq(svc_token_revoke(S, svc_caller_kilnd(), gone_id, &rev, &err), 0, "%s", err.message);
    json_decref(rev);
    json_decref(out);
    user("victim", 0, NULL);
    cr_assert_eq(svc_tokens_list(S, svc_caller_kilnd(), "victim", &out, &err), 0);
    snprintf(victim_token, sizeof victim_token, "%s",
             json_string_value(json_object_get(json_array_get(json_object_get(out, "tokens"), 0), "id")));
    json_decref(out);
    for (int c = 0; c < C_COUNT; c++) {
        char name[32];
        snprintf(name, sizeof name, "v%d", c);
        user(name, 0, NULL);
        member("p", name, "viewer");
        new_job("p", stop_jobs[c]);
        new_tuning("p", stop_tunings[c]);
        new_job("p", del_jobs[c]);
        json_t *j = NULL;
        cr_assert_eq(svc_job_stop(S, svc_caller_kilnd(), del_jobs[c], "ended", &j, &err), 0, "%s", err.message);
        json_decref(j);
        /* a queue for each caller to change and one to delete */
        json_t *qb = json_pack("{s:s+, s:{s:i}}", "name", "gq-", (char[2]){(char)('a' + c), 0}, "quota", "cpu", 1);
        cr_assert_eq(svc_queue_create(S, svc_caller_kilnd(), qb, &j, &err), 0, "%s", err.message);
        json_decref(j);
        json_decref(qb);
    }
    new_job("p", job_p);
    new_tuning("p", tuning_p);
    code_world();
    /* a join token to revoke, a ban to lift */
    cr_assert_eq(svc_join_token_create(S, svc_caller_kilnd(), NULL, "1h", "victim", &out, &err), 0, "%s", err.message);
    snprintf(victim_join, sizeof victim_join, "%s", json_string_value(json_object_get(out, "id")));
    json_decref(out);
    cr_assert_eq(svc_worker_remove(S, svc_caller_kilnd(), "w-matrix-banned", true, "matrix", &out, &err), 0, "%s",
                 err.message);
    snprintf(victim_ban, sizeof victim_ban, "%lld",
             (long long)json_integer_value(json_object_get(json_object_get(out, "ban"), "id")));
    json_decref(out);
    sleep(1); /* the 1-second token has expired */
}

/* ---- the matrix --------------------------------------------------------------------------- */

typedef struct row {
    const char *method;
    json_t *(*request)(int caller);
    const char *want[C_COUNT];
} row_t;

#define UNAUTH "UNAUTHENTICATED", "UNAUTHENTICATED", "UNAUTHENTICATED", "UNAUTHENTICATED"
#define EVERYONE UNAUTH, "OK", "OK", "OK", "OK", "OK"
#define JOB_READ UNAUTH, "OK", "OK", "NOT_FOUND", "OK", "OK"
#define CLUSTER_ONLY(d) UNAUTH, d, d, d, d, "OK"
#define MANAGE UNAUTH, "PERMISSION_DENIED", "PERMISSION_DENIED", "NOT_FOUND", "OK", "OK"
#define NOT_AN_AGENT UNAUTH, "UNAUTHENTICATED", "UNAUTHENTICATED", "UNAUTHENTICATED", "UNAUTHENTICATED", \
                     "UNAUTHENTICATED"

static json_t *r_empty(int c) { (void)c; return json_object(); }
static json_t *r_search(int c)
{
    (void)c;
    return json_pack("{s:s, s:s, s:[s]}", "filter", "state = QUEUED OR hp.lr > 0", "order_by", "hp.lr desc", "columns",
                     "hp.lr");
}
static json_t *r_job(int c) { (void)c; return json_pack("{s:s}", "id", job_p); }
static json_t *r_create(int c)
{
    (void)c;
    return json_pack("{s:{s:s, s:s, s:{s:s, s:[i], s:i, s:i}, s:{s:s}}}", "spec", "name", "g", "project", "p",
                     "model", "type", "mlp", "hidden", 8, "n_inputs", 4, "n_classes", 2, "data", "train", "synthetic");
}
static json_t *r_stop(int c) { return json_pack("{s:s}", "id", stop_jobs[c]); }
static json_t *r_user(int c) { return json_pack("{s:s+}", "name", "made-", (char[2]){(char)('a' + c), 0}); }
static json_t *r_victim(int c) { (void)c; return json_pack("{s:s}", "user", "victim"); }
static json_t *r_revoke(int c) { (void)c; return json_pack("{s:s}", "id", victim_token); }
static json_t *r_project(int c) { return json_pack("{s:s+}", "name", "made-", (char[2]){(char)('a' + c), 0}); }
static json_t *r_project_update(int c) { (void)c; return json_pack("{s:s, s:s}", "project", "p", "default_queue", "default"); }
static json_t *r_members(int c) { (void)c; return json_pack("{s:s}", "project", "p"); }
static json_t *r_set(int c) { (void)c; return json_pack("{s:s, s:s, s:s}", "project", "p", "user", "victim", "role", "viewer"); }
static json_t *r_remove(int c)
{
    char name[32];
    snprintf(name, sizeof name, "v%d", c);
    return json_pack("{s:s, s:s}", "project", "p", "user", name);
}
static json_t *r_delete(int c) { return json_pack("{s:s}", "id", del_jobs[c]); }
static json_t *r_artifact(int c) { (void)c; return json_pack("{s:s, s:s}", "id", job_p, "name", "model_llmc.bin"); }
static json_t *r_upload_code(int c)
{
    (void)c;
    return json_pack("{s:s, s:s, s:b}", "project", "p", "data", code_b64, "finish", 1);
}
static json_t *r_download_code(int c) { (void)c; return json_pack("{s:s, s:s}", "project", "p", "digest", code_digest); }
static json_t *r_register(int c) { (void)c; return json_pack("{s:s, s:i, s:s}", "hostname", "forged", "slots", 64, "slot_type", "cpu"); }
static json_t *r_join_create(int c) { (void)c; return json_pack("{s:i, s:s}", "uses", 2, "expires_in", "1h"); }
static json_t *r_join_revoke(int c) { (void)c; return json_pack("{s:s}", "id", victim_join); }
static json_t *r_approve(int c) { (void)c; return json_pack("{s:s}", "id", "w-matrix"); }
static json_t *r_remove_worker(int c) { (void)c; return json_pack("{s:s, s:b}", "id", "w-matrix-gone", "ban", 1); }
static json_t *r_queue_create(int c)
{
    return json_pack("{s:{s:s+, s:{s:i, s:i}}}", "queue", "name", "mq-", (char[2]){(char)('a' + c), 0}, "quota", "cpu",
                     2, "gpu", 0);
}
static json_t *r_queue(int c) { (void)c; return json_pack("{s:s}", "name", "default"); }
static json_t *r_queue_update(int c)
{
    return json_pack("{s:s+, s:{s:f}, s:[s]}", "name", "gq-", (char[2]){(char)('a' + c), 0}, "queue", "weight", 2.0,
                     "update_mask", "weight");
}
static json_t *r_queue_delete(int c) { return json_pack("{s:s+}", "name", "gq-", (char[2]){(char)('a' + c), 0}); }
static json_t *r_tuning_create(int c)
{
    (void)c;
    json_t *b = tuning_body("p");
    return json_pack("{s:o}", "tuning_job", b);
}
static json_t *r_tuning(int c) { (void)c; return json_pack("{s:s}", "id", tuning_p); }
static json_t *r_tuning_stop(int c) { return json_pack("{s:s}", "id", stop_tunings[c]); }
static json_t *r_unban(int c) { (void)c; return json_pack("{s:s}", "id", victim_ban); /* int64: text in proto JSON */ }

static const row_t k_rows[] = {
    {"/kiln.TrainingService/CreateJob", r_create,
     {UNAUTH, "PERMISSION_DENIED", "OK", "PERMISSION_DENIED", "OK", "OK"}},
    {"/kiln.TrainingService/GetJob", r_job, {JOB_READ}},
    {"/kiln.TrainingService/ListJobs", r_empty, {EVERYONE}},
    {"/kiln.TrainingService/SearchJobs", r_search, {EVERYONE}},
    {"/kiln.TrainingService/StopJob", r_stop, {UNAUTH, "PERMISSION_DENIED", "OK", "NOT_FOUND", "OK", "OK"}},
    {"/kiln.TrainingService/ListJobEvents", r_job, {JOB_READ}},
    {"/kiln.TrainingService/StreamLogs", r_job, {JOB_READ}},
    {"/kiln.TrainingService/GetMetrics", r_job, {JOB_READ}},
    {"/kiln.TrainingService/ListWorkers", r_empty, {EVERYONE}},
    {"/kiln.TrainingService/WhoAmI", r_empty, {EVERYONE}},
    {"/kiln.TrainingService/CreateUser", r_user, {CLUSTER_ONLY("PERMISSION_DENIED")}},
    {"/kiln.TrainingService/ListUsers", r_empty, {CLUSTER_ONLY("PERMISSION_DENIED")}},
    {"/kiln.TrainingService/CreateToken", r_victim, {CLUSTER_ONLY("PERMISSION_DENIED")}},
    {"/kiln.TrainingService/ListTokens", r_victim, {CLUSTER_ONLY("PERMISSION_DENIED")}},
    {"/kiln.TrainingService/RevokeToken", r_revoke, {CLUSTER_ONLY("NOT_FOUND")}},
    {"/kiln.TrainingService/CreateProject", r_project, {CLUSTER_ONLY("PERMISSION_DENIED")}},
    {"/kiln.TrainingService/ListProjects", r_empty, {EVERYONE}},
    {"/kiln.TrainingService/UpdateProject", r_project_update, {MANAGE}},
    {"/kiln.TrainingService/ListMembers", r_members, {JOB_READ}},
    {"/kiln.TrainingService/SetMember", r_set, {MANAGE}},
    {"/kiln.TrainingService/RemoveMember", r_remove, {MANAGE}},
    {"/kiln.TrainingService/ListArtifacts", r_job, {JOB_READ}},
    {"/kiln.TrainingService/ListCheckpoints", r_job, {JOB_READ}},
    /* job_p has no artifact: whoever may read the job learns just that (downloads have their
     * own test below) */
    {"/kiln.TrainingService/DownloadArtifact", r_artifact, {UNAUTH, "NOT_FOUND", "NOT_FOUND", "NOT_FOUND",
                                                           "NOT_FOUND", "NOT_FOUND"}},
    {"/kiln.TrainingService/DeleteJob", r_delete, {UNAUTH, "PERMISSION_DENIED", "OK", "NOT_FOUND", "OK", "OK"}},
    /* editors upload into their project; a non-member is refused as for jobs */
    {"/kiln.TrainingService/UploadCode", r_upload_code,
     {UNAUTH, "PERMISSION_DENIED", "OK", "PERMISSION_DENIED", "OK", "OK"}},
    /* members read their project's archives; to anyone else they do not exist */
    {"/kiln.TrainingService/DownloadCode", r_download_code, {JOB_READ}},
    /* what agents are trusted with: cluster admins only */
    {"/kiln.TrainingService/CreateJoinToken", r_join_create, {CLUSTER_ONLY("PERMISSION_DENIED")}},
    {"/kiln.TrainingService/ListJoinTokens", r_empty, {CLUSTER_ONLY("PERMISSION_DENIED")}},
    {"/kiln.TrainingService/RevokeJoinToken", r_join_revoke, {CLUSTER_ONLY("PERMISSION_DENIED")}},
    {"/kiln.TrainingService/ApproveWorker", r_approve, {CLUSTER_ONLY("PERMISSION_DENIED")}},
    {"/kiln.TrainingService/RemoveWorker", r_remove_worker, {CLUSTER_ONLY("PERMISSION_DENIED")}},
    {"/kiln.TrainingService/ListWorkerBans", r_empty, {CLUSTER_ONLY("PERMISSION_DENIED")}},
    {"/kiln.TrainingService/DeleteWorkerBan", r_unban, {CLUSTER_ONLY("PERMISSION_DENIED")}},
    /* queues: every user reads them, cluster admins manage them */
    {"/kiln.TrainingService/CreateQueue", r_queue_create, {CLUSTER_ONLY("PERMISSION_DENIED")}},
    {"/kiln.TrainingService/ListQueues", r_empty, {EVERYONE}},
    {"/kiln.TrainingService/GetQueue", r_queue, {EVERYONE}},
    {"/kiln.TrainingService/UpdateQueue", r_queue_update, {CLUSTER_ONLY("PERMISSION_DENIED")}},
    {"/kiln.TrainingService/DeleteQueue", r_queue_delete, {CLUSTER_ONLY("PERMISSION_DENIED")}},
    /* tuning jobs: as jobs (editors create and stop, viewers read; other projects' do not exist) */
    {"/kiln.TrainingService/CreateTuningJob", r_tuning_create,
     {UNAUTH, "PERMISSION_DENIED", "OK", "PERMISSION_DENIED", "OK", "OK"}},
    {"/kiln.TrainingService/ListTuningJobs", r_empty, {EVERYONE}},
    {"/kiln.TrainingService/GetTuningJob", r_tuning, {JOB_READ}},
    {"/kiln.TrainingService/StopTuningJob", r_tuning_stop,
     {UNAUTH, "PERMISSION_DENIED", "OK", "NOT_FOUND", "OK", "OK"}},
    /* user tokens are no agent's credential, not even a cluster admin's */
    {"/kiln.AgentService/RegisterWorker", r_register, {NOT_AN_AGENT}},
    {"/kiln.AgentService/Heartbeat", r_empty, {NOT_AN_AGENT}},
    {"/kiln.AgentService/ReportRankStatus", r_empty, {NOT_AN_AGENT}},
    {"/kiln.AgentService/PushLogs", r_empty, {NOT_AN_AGENT}},
    {"/kiln.AgentService/PushMetrics", r_empty, {NOT_AN_AGENT}},
    {"/kiln.AgentService/ReportRankExit", r_empty, {NOT_AN_AGENT}},
    {"/kiln.AgentService/ReportBatch", r_empty, {NOT_AN_AGENT}},
    {"/kiln.AgentService/BeginArtifacts", r_empty, {NOT_AN_AGENT}},
    {"/kiln.AgentService/PutArtifactChunk", r_empty, {NOT_AN_AGENT}},
    {"/kiln.AgentService/FetchInitModel", r_empty, {NOT_AN_AGENT}},
    {"/kiln.AgentService/FetchCode", r_empty, {NOT_AN_AGENT}},
    {"/kiln.AgentService/FetchCheckpoint", r_empty, {NOT_AN_AGENT}},
    {"/kiln.AgentService/WatchWork", r_empty, {NOT_AN_AGENT}},
};

static const row_t *row_of(const char *method)
{
    for (size_t i = 0; i < sizeof k_rows / sizeof k_rows[0]; i++)
        if (!strcmp(k_rows[i].method, method))
            return &k_rows[i];
    return NULL;
}

Test(grpc_auth, every_method_has_a_row)
{
    api_route_info_t m[128];
    size_t n = api_grpc_methods(m, 128);
    for (size_t i = 0; i < n; i++)
        cr_assert_not_null(row_of(m[i].path), "gRPC method %s has no row in the authorization matrix "
                           "(tests/grpc/test_grpc_auth.c)", m[i].path);
    cr_assert_eq(n, sizeof k_rows / sizeof k_rows[0], "every row names a method kilnd serves");
}

Test(grpc_auth, every_method_times_every_caller)
{
    world();
    api_route_info_t m[128];
    size_t n = api_grpc_methods(m, 128);
    gcall_t *calls = calloc(n * C_COUNT, sizeof(*calls));
    const row_t **rows = calloc(n * C_COUNT, sizeof(*rows));
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const row_t *row = row_of(m[i].path);
        cr_assert_not_null(row);
        for (int c = 0; c < C_COUNT; c++, k++) {
            calls[k] = (gcall_t){.method = row->method, .request = row->request(c),
                                 .token = c == C_NONE ? NULL : tokens[c]};
            rows[k] = row;
        }
    }
    json_t *res = run_calls(calls, k, true);
    for (size_t i = 0; i < k; i++) {
        int c = (int)(i % C_COUNT);
        cr_expect_str_eq(code_of(res, i), rows[i]->want[c], "%s as %s: want %s, got %s (%s)", rows[i]->method,
                         k_callers[c], rows[i]->want[c], code_of(res, i),
                         json_string_value(json_object_get(json_array_get(res, i), "details")));
    }
    json_decref(res);
    free(calls);
    free(rows);
}

/* ---- agents ------------------------------------------------------------------------------- */

static json_t *one(gcall_t call)
{
    json_t *res = run_calls(&call, 1, true);
    json_t *r = json_incref(json_array_get(res, 0));
    json_decref(res);
    return r;
}

static const char *code(json_t *r) { return json_string_value(json_object_get(r, "code")); }
static const char *field(json_t *r, const char *k)
{
    return json_string_value(json_object_get(json_object_get(r, "response"), k));
}

/* Registers an agent as a real one does (join token, client certificate) under worker id `id`
 * (a new worker); fills its credential. */
static void agent_register(const char *id, char *cred)
{
    json_t *r = one((gcall_t){.method = "/kiln.AgentService/RegisterWorker",
                              .request = json_pack("{s:s, s:s, s:s, s:i, s:s}", "worker_id", id, "hostname", id,
                                                   "address", "10.0.0.1", "slots", 1, "slot_type", "cpu"),
                              .token = join_token});
    cr_assert_str_eq(code(r), "OK", "%s", json_string_value(json_object_get(r, "details")));
    cr_assert_str_eq(field(r, "worker_id"), id);
    snprintf(cred, 128, "%s", field(r, "credential"));
    cr_assert(!strncmp(cred, "kiln_agent_", 11));
    json_decref(r);
}

static json_t *log_batch(const char *worker, const char *job, const char *text)
{
    return json_pack("{s:s, s:s, s:i, s:[{s:i, s:s, s:s}]}", "worker_id", worker, "job_id", job, "attempt", 1,
                     "lines", "rank", 0, "stream", "stdout", "line", text);
}

Test(grpc_auth, agents_need_the_join_token_and_a_client_certificate)
{
    json_t *reg = json_pack("{s:s, s:i, s:s}", "hostname", "forged", "slots", 64, "slot_type", "cpu");
    json_t *r = one((gcall_t){.method = "/kiln.AgentService/RegisterWorker", .request = json_incref(reg)});
    cr_assert_str_eq(code(r), "UNAUTHENTICATED", "no join token");
    json_decref(r);
    r = one((gcall_t){.method = "/kiln.AgentService/RegisterWorker", .request = json_incref(reg),
                      .token = "kiln_join_guessed"});
    cr_assert_str_eq(code(r), "UNAUTHENTICATED", "a wrong join token");
    json_decref(r);
    r = one((gcall_t){.method = "/kiln.AgentService/RegisterWorker", .request = json_incref(reg),
                      .token = join_token, .no_client_cert = true});
    cr_assert_str_eq(code(r), "UNAUTHENTICATED", "mutual TLS: no client certificate, no agent");
    cr_assert(strstr(json_string_value(json_object_get(r, "details")), "client certificate"));
    json_decref(r);
    json_t *workers = NULL;
    kiln_err_t err;
    cr_assert_eq(svc_workers_list(S, svc_caller_kilnd(), &workers, &err), 0);
    cr_assert_eq(json_array_size(json_object_get(workers, "workers")), 0, "nothing was registered");
    json_decref(workers);
    json_decref(reg);
}

Test(grpc_auth, forged_agents_cannot_touch_another_workers_job)
{
    char acred[128], bcred[128], job[64];
    kiln_err_t err;
    agent_register("w-aaa", acred); /* ids order the workers: the job lands on w-aaa */
    agent_register("w-bbb", bcred);
    new_job("default", job);
    int attempt = 0;
    for (int i = 0; i < 200 && !attempt; i++) {
        json_t *r = one((gcall_t){.method = "/kiln.AgentService/Heartbeat",
                                  .request = json_pack("{s:s}", "worker_id", "w-aaa"), .token = acred});
        cr_assert_str_eq(code(r), "OK", "%s", json_string_value(json_object_get(r, "details")));
        json_t *as = json_object_get(json_object_get(r, "response"), "assignments");
        if (json_array_size(as) == 1)
            attempt = (int)json_integer_value(json_object_get(json_array_get(as, 0), "attempt"));
        json_decref(r);
        if (!attempt)
            usleep(50000);
    }
    cr_assert_eq(attempt, 1, "the job was assigned to w-aaa");
    json_t *r = one((gcall_t){.method = "/kiln.AgentService/ReportRankStatus",
                              .request = json_pack("{s:s, s:s, s:i, s:b}", "worker_id", "w-aaa", "job_id", job,
                                                   "attempt", 1, "started", 1),
                              .token = acred});
    cr_assert_str_eq(code(r), "OK");
    json_decref(r);

    /* forgeries, each refused */
    struct { const char *what, *method; json_t *req; const char *token, *cred, *want; } forged[] = {
        {"register under w-aaa's id without its credential", "/kiln.AgentService/RegisterWorker",
         json_pack("{s:s, s:s, s:s, s:i, s:s}", "worker_id", "w-aaa", "hostname", "evil", "address", "6.6.6.6",
                   "slots", 64, "slot_type", "cpu"), join_token, NULL, "PERMISSION_DENIED"},
        {"register under w-aaa's id with w-bbb's credential", "/kiln.AgentService/RegisterWorker",
         json_pack("{s:s, s:s, s:s, s:i, s:s}", "worker_id", "w-aaa", "hostname", "evil", "address", "6.6.6.6",
                   "slots", 64, "slot_type", "cpu"), join_token, bcred, "PERMISSION_DENIED"},
        {"w-bbb pushes logs into w-aaa's job", "/kiln.AgentService/PushLogs", log_batch("w-bbb", job, "forged"),
         bcred, NULL, "PERMISSION_DENIED"},
        {"w-bbb pushes logs claiming to be w-aaa", "/kiln.AgentService/PushLogs", log_batch("w-aaa", job, "forged"),
         bcred, NULL, "PERMISSION_DENIED"},
        {"logs with no credential", "/kiln.AgentService/PushLogs", log_batch("w-aaa", job, "forged"), NULL, NULL,
         "UNAUTHENTICATED"},
        {"w-bbb pushes metrics", "/kiln.AgentService/PushMetrics",
         json_pack("{s:s, s:s, s:i, s:[{s:i, s:s, s:i, s:f}]}", "worker_id", "w-bbb", "job_id", job, "attempt", 1,
                   "points", "rank", 0, "name", "train_loss", "step", 39999, "value", -123.0),
         bcred, NULL, "PERMISSION_DENIED"},
        {"w-bbb reports the rank's exit", "/kiln.AgentService/ReportRankExit",
         json_pack("{s:s, s:s, s:i, s:i, s:i}", "worker_id", "w-bbb", "job_id", job, "attempt", 1, "rank", 0,
                   "exit_code", 0), bcred, NULL, "PERMISSION_DENIED"},
        {"w-bbb reports the ranks started", "/kiln.AgentService/ReportRankStatus",
         json_pack("{s:s, s:s, s:i, s:b}", "worker_id", "w-bbb", "job_id", job, "attempt", 1, "started", 0), bcred,
         NULL, "PERMISSION_DENIED"},
        {"w-bbb sends a report batch claiming to be w-aaa", "/kiln.AgentService/ReportBatch",
         json_pack("{s:s, s:[{s:{s:s, s:i, s:i, s:i}}]}", "worker_id", "w-aaa", "reports", "exit", "job_id", job,
                   "attempt", 1, "rank", 0, "exit_code", 0), bcred, NULL, "PERMISSION_DENIED"},
        {"a report batch with no credential", "/kiln.AgentService/ReportBatch",
         json_pack("{s:s, s:[{s:{s:s, s:i, s:i, s:i}}]}", "worker_id", "w-aaa", "reports", "exit", "job_id", job,
                   "attempt", 1, "rank", 0, "exit_code", 0), NULL, NULL, "UNAUTHENTICATED"},
        {"a heartbeat as w-aaa with w-bbb's credential", "/kiln.AgentService/Heartbeat",
         json_pack("{s:s}", "worker_id", "w-aaa"), bcred, NULL, "PERMISSION_DENIED"},
        {"w-bbb watches for w-aaa's work", "/kiln.AgentService/WatchWork", json_pack("{s:s}", "worker_id", "w-aaa"),
         bcred, NULL, "PERMISSION_DENIED"},
        {"a watch for w-aaa's work with no credential", "/kiln.AgentService/WatchWork",
         json_pack("{s:s}", "worker_id", "w-aaa"), NULL, NULL, "UNAUTHENTICATED"},
        {"a watch with w-aaa's credential sent as a join token's", "/kiln.AgentService/WatchWork",
         json_pack("{s:s}", "worker_id", "w-aaa"), NULL, acred, "UNAUTHENTICATED"},
    };
    size_t n = sizeof forged / sizeof forged[0];
    gcall_t calls[16];
    for (size_t i = 0; i < n; i++)
        calls[i] = (gcall_t){.method = forged[i].method, .request = forged[i].req, .token = forged[i].token,
                             .worker_credential = forged[i].cred};
    json_t *res = run_calls(calls, n, true);
    for (size_t i = 0; i < n; i++)
        cr_expect_str_eq(code_of(res, i), forged[i].want, "%s: want %s, got %s (%s)", forged[i].what,
                         forged[i].want, code_of(res, i),
                         json_string_value(json_object_get(json_array_get(res, i), "details")));
    json_decref(res);
    /* w-bbb's own batch with w-aaa's ranks in it: taken, each report refused */
    r = one((gcall_t){.method = "/kiln.AgentService/ReportBatch",
                      .request = json_pack("{s:s, s:[{s:{s:s, s:i, s:i, s:i}}, {s:{s:s, s:i, s:b}}]}", "worker_id",
                                           "w-bbb", "reports", "exit", "job_id", job, "attempt", 1, "rank", 0,
                                           "exit_code", 0, "status", "job_id", job, "attempt", 1, "started", 0),
                      .token = bcred});
    cr_assert_str_eq(code(r), "OK", "%s", json_string_value(json_object_get(r, "details")));
    json_t *results = json_object_get(json_object_get(r, "response"), "results");
    cr_assert_eq(json_array_size(results), 2, "%s", json_dumps(r, 0));
    for (size_t i = 0; i < 2; i++)
        cr_assert_eq(json_integer_value(json_object_get(json_array_get(results, i), "code")), 7, "report %zu", i);
    json_decref(r);

    /* nothing landed: the job runs on, untouched, and w-aaa is still itself */
    json_t *j = NULL;
    cr_assert_eq(svc_job_get(S, svc_caller_kilnd(), job, &j, &err), 0);
    cr_assert_str_eq(json_string_value(json_object_get(j, "state")), "RUNNING");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(j, "progress"), "step")), 0);
    cr_assert_eq(json_object_size(json_object_get(j, "metrics")), 0);
    json_decref(j);
    json_t *logs = NULL;
    svc_log_query_t q = {.rank = -1};
    cr_assert_eq(svc_job_logs(S, svc_caller_kilnd(), job, &q, &logs, &err), 0);
    cr_assert_eq(json_array_size(json_object_get(logs, "lines")), 0);
    json_decref(logs);
    json_t *workers = NULL;
    cr_assert_eq(svc_workers_list(S, svc_caller_kilnd(), &workers, &err), 0);
    size_t k;
    json_t *w;
    json_array_foreach(json_object_get(workers, "workers"), k, w)
        if (!strcmp(json_string_value(json_object_get(w, "id")), "w-aaa")) {
            cr_assert_str_eq(json_string_value(json_object_get(w, "address")), "10.0.0.1");
            cr_assert_str_eq(json_string_value(json_object_get(w, "state")), "ALIVE");
            cr_assert_eq(json_integer_value(json_object_get(w, "slots")), 1);
        }
    json_decref(workers);
    /* while the real agent's own reports land */
    r = one((gcall_t){.method = "/kiln.AgentService/PushLogs", .request = log_batch("w-aaa", job, "genuine"),
                      .token = acred});
    cr_assert_str_eq(code(r), "OK", "%s", json_string_value(json_object_get(r, "details")));
    json_decref(r);
    cr_assert_eq(svc_job_logs(S, svc_caller_kilnd(), job, &q, &logs, &err), 0);
    cr_assert_eq(json_array_size(json_object_get(logs, "lines")), 1);
    json_decref(logs);
}

Test(grpc_auth, a_new_registration_retires_the_old_credential)
{
    char cred1[128], cred2[128];
    agent_register("w-ccc", cred1);
    /* the agent restarts: same id, its credential as proof */
    json_t *r = one((gcall_t){.method = "/kiln.AgentService/RegisterWorker",
                              .request = json_pack("{s:s, s:s, s:i, s:s}", "worker_id", "w-ccc", "hostname", "c",
                                                   "slots", 1, "slot_type", "cpu"),
                              .token = join_token, .worker_credential = cred1});
    cr_assert_str_eq(code(r), "OK", "%s", json_string_value(json_object_get(r, "details")));
    snprintf(cred2, sizeof cred2, "%s", field(r, "credential"));
    json_decref(r);
    cr_assert_str_neq(cred1, cred2);
    r = one((gcall_t){.method = "/kiln.AgentService/Heartbeat", .request = json_pack("{s:s}", "worker_id", "w-ccc"),
                      .token = cred1});
    cr_assert_str_eq(code(r), "UNAUTHENTICATED", "the old credential stopped working");
    json_decref(r);
    r = one((gcall_t){.method = "/kiln.AgentService/Heartbeat", .request = json_pack("{s:s}", "worker_id", "w-ccc"),
                      .token = cred2});
    cr_assert_str_eq(code(r), "OK");
    json_decref(r);
}

Test(grpc_auth, training_service_over_tls_and_not_in_clear)
{
    json_t *r = one((gcall_t){.method = "/kiln.TrainingService/WhoAmI", .token = admin_token});
    cr_assert_str_eq(code(r), "OK", "%s", json_string_value(json_object_get(r, "details")));
    cr_assert_str_eq(field(r, "user"), "admin");
    json_decref(r);
    /* a plain-text client cannot talk to a TLS server */
    gcall_t plain = {.method = "/kiln.TrainingService/WhoAmI", .token = admin_token};
    json_t *res = run_calls(&plain, 1, false);
    cr_assert_str_eq(code_of(res, 0), "UNAVAILABLE");
    json_decref(res);
}

/* ---- artifacts ----------------------------------------------------------------------------- */

/* Job spec, submitted, run by a new worker of one cpu slot named host (its data root root, or
 * none) driven through the service, with bytes[0..n) uploaded as its model as its agent would: the
 * job's id and the worker's into job and wid (64 bytes each); returns the attempt. */
static int run_with_model(const json_t *spec, const char *host, const char *root, const uint8_t *bytes, size_t n,
                          char *job, char *wid)
{
    kiln_err_t err;
    arena_t a;
    arena_init(&a, 0);
    json_t *jj = NULL;
    bool created;
    cr_assert_eq(svc_job_create(S, svc_caller_kilnd(), spec, NULL, &jj, &created, &err), 0, "%s", err.message);
    snprintf(job, 64, "%s", json_string_value(json_object_get(jj, "id")));
    json_decref(jj);
    Kiln__RegisterRequest req = KILN__REGISTER_REQUEST__INIT;
    Kiln__RegisterResponse reg = KILN__REGISTER_RESPONSE__INIT;
    char *roots[] = {(char *)root};
    req.hostname = (char *)host;
    req.slots = 1;
    req.slot_type = "cpu";
    req.data_roots = root ? roots : NULL;
    req.n_data_roots = root ? 1 : 0;
    cr_assert_eq(svc_agent_register(S, &req, NULL, &a, &reg, &err), 0, "%s", err.message);
    snprintf(wid, 64, "%s", reg.worker_id);
    int attempt = -1;
    for (int i = 0; i < 200 && attempt < 0; i++) {
        Kiln__HeartbeatRequest hb = KILN__HEARTBEAT_REQUEST__INIT;
        Kiln__HeartbeatResponse out = KILN__HEARTBEAT_RESPONSE__INIT;
        hb.worker_id = wid;
        cr_assert_eq(svc_agent_heartbeat(S, wid, &hb, &a, &out, &err), 0, "%s", err.message);
        for (size_t k = 0; k < out.n_assignments; k++)
            if (!strcmp(out.assignments[k]->job_id, job))
                attempt = out.assignments[k]->attempt;
        if (attempt < 0)
            usleep(50000);
    }
    cr_assert(attempt > 0, "the job was assigned");
    char sha[KILN_SHA256_HEX];
    kiln_sha256_hex(bytes, n, sha);
    Kiln__ArtifactFile f = KILN__ARTIFACT_FILE__INIT, *fp[1] = {&f};
    f.name = KILN_ARTIFACT_MODEL;
    f.size = (int64_t)n;
    f.sha256 = sha;
    Kiln__ArtifactManifest m = KILN__ARTIFACT_MANIFEST__INIT;
    m.worker_id = wid;
    m.job_id = job;
    m.attempt = attempt;
    m.n_files = 1;
    m.files = fp;
    Kiln__ArtifactManifestReply r = KILN__ARTIFACT_MANIFEST_REPLY__INIT;
    cr_assert_eq(svc_agent_artifacts_begin(S, wid, &m, &a, &r, &err), 0, "%s", err.message);
    Kiln__ArtifactChunk c = KILN__ARTIFACT_CHUNK__INIT;
    c.worker_id = wid;
    c.job_id = job;
    c.attempt = attempt;
    c.name = KILN_ARTIFACT_MODEL;
    c.data.data = (uint8_t *)bytes;
    c.data.len = n;
    c.sha256 = sha;
    Kiln__ArtifactChunkReply cr = KILN__ARTIFACT_CHUNK_REPLY__INIT;
    cr_assert_eq(svc_agent_artifact_chunk(S, wid, &c, &cr, &err), 0, "%s", err.message);
    cr_assert(cr.complete);
    arena_deinit(&a);
    return attempt;
}

/* A job of project p run by a worker driven through the service, with an artifact of n
 * pseudo-random bytes uploaded as its agent would; returns the bytes (caller frees). */
static uint8_t *job_with_artifact(char *job, char *wid, size_t n)
{
    /* ahead of the world's queued jobs for the one slot */
    json_t *spec = json_pack("{s:s, s:s, s:i, s:{s:s, s:[i], s:i, s:i}, s:{s:s}}", "name", "art", "project", "p",
                             "priority", 100, "model", "type", "mlp", "hidden", 8, "n_inputs", 4, "n_classes", 2,
                             "data", "train", "synthetic");
    uint8_t *data = malloc(n);
    for (size_t i = 0; i < n; i++)
        data[i] = (uint8_t)(i * 7 + i / 251);
    run_with_model(spec, "art", NULL, data, n, job, wid);
    json_decref(spec);
    return data;
}

/* The bytes of a DownloadArtifact stream's messages (base64 in grpc_client.py's JSON). */
static size_t stream_bytes(json_t *r, uint8_t *out, size_t cap, int64_t *first_offset)
{
    size_t n = 0, i;
    json_t *msg;
    *first_offset = -1;
    json_array_foreach(json_object_get(r, "response"), i, msg) {
        const char *b64 = json_string_value(json_object_get(msg, "data"));
        const char *off = json_string_value(json_object_get(msg, "offset")); /* int64 in proto JSON: text */
        if (*first_offset < 0)
            *first_offset = off ? atoll(off) : 0;
        /* decode base64 */
        static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        unsigned v = 0;
        int bits = 0;
        for (const char *p = b64 ? b64 : ""; *p && *p != '='; p++) {
            const char *q = strchr(tbl, *p);
            cr_assert_not_null(q, "base64");
            v = (v << 6) | (unsigned)(q - tbl);
            bits += 6;
            if (bits >= 8) {
                bits -= 8;
                cr_assert_lt(n, cap);
                out[n++] = (uint8_t)(v >> bits);
            }
        }
    }
    return n;
}

Test(grpc_auth, artifacts_list_download_and_delete_over_grpc)
{
    world();
    char job[64], wid[64];
    size_t n = 1500000; /* more than one message */
    uint8_t *data = job_with_artifact(job, wid, n);
    char sha[KILN_SHA256_HEX];
    kiln_sha256_hex(data, n, sha);
    json_t *r = one((gcall_t){.method = "/kiln.TrainingService/ListArtifacts",
                              .request = json_pack("{s:s}", "id", job), .token = tokens[C_VIEWER]});
    cr_assert_str_eq(code(r), "OK", "%s", json_string_value(json_object_get(r, "details")));
    json_t *a = json_array_get(json_object_get(json_object_get(r, "response"), "artifacts"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(a, "name")), "model_llmc.bin");
    cr_assert_str_eq(json_string_value(json_object_get(a, "sha256")), sha);
    json_decref(r);

    uint8_t *got = malloc(n);
    int64_t first = 0;
    r = one((gcall_t){.method = "/kiln.TrainingService/DownloadArtifact",
                      .request = json_pack("{s:s, s:s}", "id", job, "name", "model_llmc.bin"), .token = tokens[C_VIEWER]});
    cr_assert_str_eq(code(r), "OK", "%s", json_string_value(json_object_get(r, "details")));
    cr_assert_gt(json_array_size(json_object_get(r, "response")), 1, "streamed in pieces");
    cr_assert_eq(stream_bytes(r, got, n, &first), n);
    cr_assert(!memcmp(got, data, n), "byte for byte");
    json_decref(r);
    r = one((gcall_t){.method = "/kiln.TrainingService/DownloadArtifact",
                      .request = json_pack("{s:s, s:s, s:i, s:i}", "id", job, "name", "model_llmc.bin", "offset", 1000,
                                           "length", 10),
                      .token = tokens[C_VIEWER]});
    cr_assert_str_eq(code(r), "OK");
    cr_assert_eq(stream_bytes(r, got, n, &first), 10);
    cr_assert_eq(first, 1000);
    cr_assert(!memcmp(got, data + 1000, 10));
    json_decref(r);
    r = one((gcall_t){.method = "/kiln.TrainingService/DownloadArtifact",
                      .request = json_pack("{s:s, s:s, s:I}", "id", job, "name", "model_llmc.bin", "offset",
                                           (json_int_t)n + 1),
                      .token = tokens[C_VIEWER]});
    cr_assert_str_eq(code(r), "OUT_OF_RANGE", "%s", json_string_value(json_object_get(r, "details")));
    json_decref(r);
    r = one((gcall_t){.method = "/kiln.TrainingService/DownloadArtifact",
                      .request = json_pack("{s:s, s:s}", "id", job, "name", "../admin.token"), .token = tokens[C_VIEWER]});
    cr_assert_str_eq(code(r), "INVALID_ARGUMENT");
    json_decref(r);
    r = one((gcall_t){.method = "/kiln.TrainingService/DownloadArtifact",
                      .request = json_pack("{s:s, s:s}", "id", job, "name", "model_llmc.bin"),
                      .token = tokens[C_OTHER_ADMIN]});
    cr_assert_str_eq(code(r), "NOT_FOUND", "another project's admin does not see it");
    json_decref(r);
    /* a running job is not deleted; an editor deletes it once it has ended */
    r = one((gcall_t){.method = "/kiln.TrainingService/DeleteJob", .request = json_pack("{s:s}", "id", job),
                      .token = tokens[C_EDITOR]});
    cr_assert_str_eq(code(r), "FAILED_PRECONDITION", "%s", json_string_value(json_object_get(r, "details")));
    json_decref(r);
    json_t *j = NULL;
    kiln_err_t err;
    cr_assert_eq(svc_job_stop(S, svc_caller_kilnd(), job, "done", &j, &err), 0, "%s", err.message);
    json_decref(j);
    /* STOPPING until its worker reports the rank gone */
    Kiln__RankExit ex = KILN__RANK_EXIT__INIT;
    ex.worker_id = wid;
    ex.job_id = job;
    ex.attempt = 1;
    ex.exit_code = 143;
    cr_assert_eq(svc_agent_rank_exit(S, wid, &ex, &err), 0, "%s", err.message);
    cr_assert_eq(svc_job_get(S, svc_caller_kilnd(), job, &j, &err), 0);
    cr_assert_str_eq(json_string_value(json_object_get(j, "state")), "STOPPED");
    json_decref(j);
    r = one((gcall_t){.method = "/kiln.TrainingService/DeleteJob", .request = json_pack("{s:s}", "id", job),
                      .token = tokens[C_EDITOR]});
    cr_assert_str_eq(code(r), "OK", "%s", json_string_value(json_object_get(r, "details")));
    json_t *removed = json_object_get(json_object_get(r, "response"), "removed");
    cr_assert_str_eq(json_string_value(json_object_get(removed, "artifacts")), "1", "int64 map values are text");
    json_decref(r);
    r = one((gcall_t){.method = "/kiln.TrainingService/ListArtifacts", .request = json_pack("{s:s}", "id", job),
                      .token = tokens[C_EDITOR]});
    cr_assert_str_eq(code(r), "NOT_FOUND");
    json_decref(r);
    free(got);
    free(data);
}

static const char *details(json_t *r) { return json_string_value(json_object_get(r, "details")); }

/* ---- another project's jobs ------------------------------------------------------------------ */

/* Over gRPC as over REST: a job of another project that keeps a job from being deleted (it starts
 * from its model) is named only to who may read it; one that holds an idempotency key keeps no
 * other project from using the key (a key is its project's). */
Test(grpc_auth, another_projects_job_is_named_only_to_who_may_read_it)
{
    kiln_err_t err;
    json_t *out = NULL;
    cr_assert_eq(svc_project_create(S, svc_caller_kilnd(), "p", NULL, &out, &err), 0, "%s", err.message);
    json_decref(out);
    cr_assert_eq(svc_project_create(S, svc_caller_kilnd(), "q", NULL, &out, &err), 0, "%s", err.message);
    json_decref(out);
    char t_mine[128], t_both[128], t_q[128];
    user("mine", 0, t_mine);
    member("p", "mine", "editor");
    user("both", 0, t_both);
    member("p", "both", "editor");
    member("q", "both", "viewer");
    user("qed", 0, t_q);
    member("q", "qed", "editor");
    /* the source: a GPT job of p that ran on a worker reading dir and left its model */
    char data[200];
    snprintf(data, sizeof data, "%s/text.txt", dir);
    json_t *spec = json_pack("{s:s, s:s, s:{s:s, s:i, s:i, s:i, s:i}, s:{s:s}, s:{s:f, s:i, s:i}}", "name", "src",
                             "project", "p", "model", "type", "gpt", "n_layer", 1, "n_head", 2, "n_embd", 16, "seq_len",
                             8, "data", "train", data, "hyperparameters", "lr", 0.01, "global_batch_size", 2,
                             "max_steps", 3);
    uint8_t model[1000];
    memset(model, 7, sizeof model);
    char src[64], wid[64];
    int attempt = run_with_model(spec, "src", dir, model, sizeof model, src, wid);
    Kiln__RankExit ex = KILN__RANK_EXIT__INIT;
    ex.worker_id = wid;
    ex.job_id = src;
    ex.attempt = attempt;
    ex.exit_code = 0;
    cr_assert_eq(svc_agent_rank_exit(S, wid, &ex, &err), 0, "%s", err.message);
    /* a job of q starts from its model (its submitter reads both) */
    json_t *jj = NULL;
    bool created;
    char ref[80];
    snprintf(ref, sizeof ref, "job:%s", src);
    json_object_set_new(spec, "project", json_string("q"));
    json_object_set_new(spec, "name", json_string("child"));
    json_object_set_new(json_object_get(spec, "model"), "init_from", json_string(ref));
    cr_assert_eq(svc_job_create(S, svc_caller_kilnd(), spec, NULL, &jj, &created, &err), 0, "%s (%s)", err.message,
                 err.field);
    char child[64];
    snprintf(child, sizeof child, "%s", json_string_value(json_object_get(jj, "id")));
    json_decref(jj);
    json_decref(spec);

    gcall_t calls[] = {
        {.method = "/kiln.TrainingService/DeleteJob", .request = json_pack("{s:s}", "id", src), .token = t_mine},
        {.method = "/kiln.TrainingService/DeleteJob", .request = json_pack("{s:s}", "id", src), .token = t_both},
        {.method = "/kiln.TrainingService/CreateJob",
         .request = json_pack("{s:{s:s, s:s, s:{s:s, s:[i], s:i, s:i}, s:{s:s}}, s:s}", "spec", "name", "k", "project",
                              "p", "model", "type", "mlp", "hidden", 8, "n_inputs", 4, "n_classes", 2, "data", "train",
                              "synthetic", "idempotency_key", "shared-key"),
         .token = t_mine},
        {.method = "/kiln.TrainingService/CreateJob",
         .request = json_pack("{s:{s:s, s:s, s:{s:s, s:[i], s:i, s:i}, s:{s:s}}, s:s}", "spec", "name", "k", "project",
                              "q", "model", "type", "mlp", "hidden", 8, "n_inputs", 4, "n_classes", 2, "data", "train",
                              "synthetic", "idempotency_key", "shared-key"),
         .token = t_q},
    };
    json_t *r = run_calls(calls, KILN_ARRAY_LEN(calls), true);
    const char *said = details(json_array_get(r, 0));
    cr_assert_str_eq(code_of(r, 0), "FAILED_PRECONDITION", "%s", said);
    cr_assert(said && strstr(said, "a job of another project starts from this job's model") && !strstr(said, child),
              "an editor of p alone is not told q's job: %s", said);
    said = details(json_array_get(r, 1));
    cr_assert_str_eq(code_of(r, 1), "FAILED_PRECONDITION", "%s", said);
    cr_assert(said && strstr(said, child), "a member of both is: %s", said);
    cr_assert_str_eq(code_of(r, 2), "OK", "%s", details(json_array_get(r, 2)));
    const char *held = json_string_value(json_object_get(json_object_get(json_array_get(r, 2), "response"), "id"));
    cr_assert_str_eq(code_of(r, 3), "OK", "q's editor uses the key too: %s", details(json_array_get(r, 3)));
    const char *made = json_string_value(json_object_get(json_object_get(json_array_get(r, 3), "response"), "id"));
    cr_assert(held && made && strcmp(held, made), "two jobs, one in each project");
    json_decref(r);
}

/* ---- token lineage -------------------------------------------------------------------------- */

/* The caller a token stands for, as kilnd sees it (strings from a). */
static svc_caller_t caller_of(const char *token, arena_t *a)
{
    svc_caller_t who;
    kiln_err_t err;
    cr_assert_eq(svc_auth_user(S, token, a, &who, &err), 0, "%s", err.message);
    return who;
}

Test(grpc_auth, tokens_never_outlive_the_token_that_makes_them)
{
    char brief[128], web[128], session[128];
    user("g-brief", 60, brief);
    user("g-web", 0, web);
    arena_t a;
    arena_init(&a, 0);
    svc_caller_t b = caller_of(brief, &a), w = caller_of(web, &a);
    /* the web UI's session token: a login link of g-web, redeemed */
    json_t *link = NULL, *tok = NULL;
    kiln_err_t err;
    cr_assert_eq(svc_login_link_create(S, &w, &link, &err), 0, "%s", err.message);
    cr_assert_eq(svc_login_link_redeem(S, json_string_value(json_object_get(link, "code")), &tok, &err), 0, "%s",
                 err.message);
    snprintf(session, sizeof session, "%s", json_string_value(json_object_get(tok, "token")));
    char session_id[64];
    snprintf(session_id, sizeof session_id, "%s", json_string_value(json_object_get(tok, "id")));
    json_decref(link);
    json_decref(tok);

    gcall_t calls[] = {
        {.method = "/kiln.TrainingService/CreateToken", .request = json_pack("{s:s}", "user", "g-brief"),
         .token = brief},
        {.method = "/kiln.TrainingService/CreateToken",
         .request = json_pack("{s:s, s:i}", "user", "g-brief", "expires_in_s", 86400), .token = brief},
        {.method = "/kiln.TrainingService/CreateToken", .request = json_pack("{s:s}", "user", "g-web"),
         .token = session},
        {.method = "/kiln.TrainingService/ListTokens", .request = json_pack("{s:s}", "user", "g-web"), .token = web},
    };
    json_t *res = run_calls(calls, sizeof calls / sizeof calls[0], true);
    /* no expiry asked for: the child expires with its parent */
    json_t *r = json_array_get(res, 0), *resp = json_object_get(r, "response");
    cr_assert_str_eq(code_of(res, 0), "OK", "%s", details(r));
    cr_assert(json_is_true(json_object_get(resp, "expires_with_parent")), "the answer says it expires with its parent");
    cr_assert_str_eq(json_string_value(json_object_get(resp, "parent_id")), b.token_id);
    cr_assert_str_eq(json_string_value(json_object_get(resp, "created_by")), "g-brief");
    char want_exp[40];
    kiln_time_format(b.token_expires_us, want_exp, sizeof want_exp);
    cr_assert_str_eq(json_string_value(json_object_get(resp, "expires_at")), want_exp);
    char child[128];
    snprintf(child, sizeof child, "%s", json_string_value(json_object_get(resp, "token")));
    /* longer than its parent: refused, with the parent's expiry */
    cr_assert_str_eq(code_of(res, 1), "INVALID_ARGUMENT", "%s", details(json_array_get(res, 1)));
    cr_assert(strstr(details(json_array_get(res, 1)), "cannot outlive") &&
              strstr(details(json_array_get(res, 1)), "expires at"), "%s", details(json_array_get(res, 1)));
    /* a session token makes none */
    cr_assert_str_eq(code_of(res, 2), "PERMISSION_DENIED", "%s", details(json_array_get(res, 2)));
    cr_assert(strstr(details(json_array_get(res, 2)), "session token"), "%s", details(json_array_get(res, 2)));
    /* the list shows each token's kind and lineage */
    json_t *list = json_object_get(json_object_get(json_array_get(res, 3), "response"), "tokens");
    cr_assert_eq(json_array_size(list), 2, "%s", details(json_array_get(res, 3)));
    size_t i;
    json_t *t;
    int sessions = 0;
    json_array_foreach(list, i, t) {
        const char *id = json_string_value(json_object_get(t, "id"));
        if (!strcmp(id, session_id)) {
            sessions++;
            cr_assert_str_eq(json_string_value(json_object_get(t, "kind")), "session");
            cr_assert_str_eq(json_string_value(json_object_get(t, "parent_id")), w.token_id);
            cr_assert_str_eq(json_string_value(json_object_get(t, "created_by")), "g-web");
        } else {
            cr_assert_str_eq(id, w.token_id);
            cr_assert_str_eq(json_string_value(json_object_get(t, "kind")), "api");
        }
    }
    cr_assert_eq(sessions, 1);
    json_decref(res);

    /* revoking the parent revokes the child */
    gcall_t after[] = {
        {.method = "/kiln.TrainingService/RevokeToken", .request = json_pack("{s:s}", "id", b.token_id),
         .token = brief},
        {.method = "/kiln.TrainingService/WhoAmI", .token = child},
    };
    res = run_calls(after, 2, true);
    cr_assert_str_eq(code_of(res, 0), "OK", "%s", details(json_array_get(res, 0)));
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(json_array_get(res, 0), "response"),
                                                       "descendants_revoked")), "1", "int64 fields are text");
    cr_assert_str_eq(code_of(res, 1), "UNAUTHENTICATED", "%s", details(json_array_get(res, 1)));
    cr_assert(strstr(details(json_array_get(res, 1)), "revoked"), "%s", details(json_array_get(res, 1)));
    json_decref(res);
    arena_deinit(&a);
}

/* ---- agents earn trust: certificates, join tokens, limits, approval, removal and bans ------- */

/* RegisterWorker as an agent would send it: worker id (NULL: a new worker), join token,
 * credential and client certificate ("agent2", or NULL for agent.pem) as given. */
static json_t *reg_call(const char *id, const char *token, const char *cred, const char *cert)
{
    json_t *req = json_pack("{s:s, s:s, s:i, s:s}", "hostname", "h", "address", "10.0.0.2", "slots", 1, "slot_type",
                            "cpu");
    if (id)
        json_object_set_new(req, "worker_id", json_string(id));
    return one((gcall_t){.method = "/kiln.AgentService/RegisterWorker", .request = req, .token = token,
                         .worker_credential = cred, .cert = cert});
}

/* Registers a worker that must be accepted; fills its id and credential (128 bytes each). */
static void reg_ok(const char *id, const char *token, const char *cert, char *id_out, char *cred)
{
    json_t *r = reg_call(id, token, NULL, cert);
    cr_assert_str_eq(code(r), "OK", "%s", details(r));
    snprintf(id_out, 128, "%s", field(r, "worker_id"));
    snprintf(cred, 128, "%s", field(r, "credential"));
    json_decref(r);
}

static json_t *heartbeat(const char *cred, const char *cert)
{
    return one((gcall_t){.method = "/kiln.AgentService/Heartbeat", .request = json_object(), .token = cred, .cert = cert});
}

/* The worker with this id as GET /v1/workers shows it (NULL when not listed); caller decrefs. */
static json_t *listed_worker(const char *id)
{
    json_t *ws = NULL, *found = NULL;
    kiln_err_t err;
    cr_assert_eq(svc_workers_list(S, svc_caller_kilnd(), &ws, &err), 0, "%s", err.message);
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(ws, "workers"), i, w)
        if (!strcmp(json_string_value(json_object_get(w, "id")), id))
            found = json_incref(w);
    json_decref(ws);
    return found;
}

/* openssl's SHA-256 fingerprint of a test certificate, as lower-case hex without colons. */
static void openssl_fingerprint(const char *name, char out[65])
{
    char cmd[600], line[256];
    snprintf(cmd, sizeof cmd, "openssl x509 -in %s/%s.pem -noout -fingerprint -sha256", tls, name);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    cr_assert_not_null(fgets(line, sizeof line, p));
    pclose(p);
    const char *eq = strchr(line, '=');
    cr_assert_not_null(eq, "%s", line);
    size_t n = 0;
    for (const char *c = eq + 1; *c && n < 64; c++)
        if (*c != ':' && *c != '\n')
            out[n++] = (char)(*c >= 'A' && *c <= 'F' ? *c - 'A' + 'a' : *c);
    out[n] = '\0';
    cr_assert_eq(n, 64, "%s", line);
}

Test(grpc_auth, a_worker_is_bound_to_the_certificate_it_registered_with)
{
    char wid[128], cred[128], fp[65];
    reg_ok(NULL, join_token, NULL, wid, cred);
    json_t *w = listed_worker(wid);
    openssl_fingerprint("agent", fp);
    cr_assert_str_eq(json_string_value(json_object_get(w, "cert_sha256")), fp, "the fingerprint openssl shows");
    cr_assert_str_eq(json_string_value(json_object_get(w, "join_token")), "file");
    cr_assert_str_eq(json_string_value(json_object_get(w, "registered_from")), "127.0.0.1");
    cr_assert_str_eq(json_string_value(json_object_get(w, "approval")), "APPROVED");
    json_decref(w);

    /* the stolen credential, from another certificate the CA signed: every AgentService call */
    api_route_info_t m[128];
    size_t n = api_grpc_methods(m, 128), k = 0;
    gcall_t calls[32];
    for (size_t i = 0; i < n; i++)
        if (m[i].agent && !m[i].open)
            calls[k++] = (gcall_t){.method = m[i].path, .request = json_pack("{s:s}", "worker_id", wid), .token = cred,
                                   .cert = "agent2"};
    cr_assert_geq(k, 8, "every AgentService method but RegisterWorker");
    calls[k++] = (gcall_t){.method = "/kiln.AgentService/RegisterWorker",
                           .request = json_pack("{s:s, s:s, s:i, s:s}", "worker_id", wid, "hostname", "evil", "slots", 64,
                                                "slot_type", "cpu"),
                           .worker_credential = cred, .cert = "agent2"};
    json_t *res = run_calls(calls, k, true);
    for (size_t i = 0; i < k; i++) {
        json_t *r = json_array_get(res, i);
        cr_expect_str_eq(code(r), "UNAUTHENTICATED", "%s with the credential from another certificate: %s",
                         calls[i].method, details(r));
        cr_expect(strstr(details(r), "bound to the client certificate it registered with"), "%s: %s", calls[i].method,
                  details(r));
    }
    json_decref(res);
    /* the worker itself, with its certificate, goes on; nothing of the attempts above landed */
    json_t *r = heartbeat(cred, NULL);
    cr_assert_str_eq(code(r), "OK", "%s", details(r));
    json_decref(r);
    w = listed_worker(wid);
    cr_assert_str_eq(json_string_value(json_object_get(w, "hostname")), "h");
    cr_assert_eq(json_integer_value(json_object_get(w, "slots")), 1);
    json_decref(w);
    /* and registering again under its id with its credential and certificate works */
    r = reg_call(wid, NULL, cred, NULL);
    cr_assert_str_eq(code(r), "OK", "a re-registration needs no join token: %s", details(r));
    json_decref(r);
}

/* Waits until the join token's state is want (polling the list, up to 10 s). */
static void join_state_is(const char *id, const char *want)
{
    char last[32] = "";
    for (int i = 0; i < 200; i++) {
        json_t *l = NULL;
        kiln_err_t err;
        cr_assert_eq(svc_join_tokens_list(S, svc_caller_kilnd(), &l, &err), 0, "%s", err.message);
        size_t k;
        json_t *t;
        json_array_foreach(json_object_get(l, "join_tokens"), k, t)
            if (!strcmp(json_string_value(json_object_get(t, "id")), id))
                snprintf(last, sizeof last, "%s", json_string_value(json_object_get(t, "state")));
        json_decref(l);
        if (!strcmp(last, want))
            return;
        usleep(50000);
    }
    cr_assert_fail("join token %s is %s, not %s", id, last, want);
}

/* A join token made by a cluster admin: its id and secret (64 and 128 bytes). */
static void join_new(int64_t uses, const char *expires_in, char *id, char *secret)
{
    json_t *out = NULL;
    kiln_err_t err;
    cr_assert_eq(svc_join_token_create(S, svc_caller_kilnd(), &uses, expires_in, "test", &out, &err), 0, "%s",
                 err.message);
    snprintf(id, 64, "%s", json_string_value(json_object_get(out, "id")));
    snprintf(secret, 128, "%s", json_string_value(json_object_get(out, "token")));
    cr_assert(!strncmp(secret, "kiln_join_", 10));
    json_decref(out);
}

Test(grpc_auth, join_tokens_are_used_up_expire_and_are_revoked)
{
    char once_id[64], once[128], wid[128], cred[128], tmp[128];
    join_new(1, "1h", once_id, once);
    reg_ok(NULL, once, NULL, wid, cred);
    json_t *r = reg_call(NULL, once, NULL, NULL);
    cr_assert_str_eq(code(r), "UNAUTHENTICATED", "a single-use join token used again: %s", details(r));
    cr_assert(strstr(details(r), "has no uses left"), "%s", details(r));
    cr_assert(strstr(details(r), once_id), "%s", details(r));
    json_decref(r);
    join_state_is(once_id, "used_up");
    /* the worker it admitted comes back with its credential: no use needed */
    r = reg_call(wid, once, cred, NULL);
    cr_assert_str_eq(code(r), "OK", "%s", details(r));
    json_decref(r);
    json_t *w = listed_worker(wid);
    cr_assert_str_eq(json_string_value(json_object_get(w, "join_token")), once_id, "kiln workers says which token");
    json_decref(w);
    json_t *l = NULL;
    kiln_err_t err;
    cr_assert_eq(svc_join_tokens_list(S, svc_caller_kilnd(), &l, &err), 0);
    json_t *t = json_array_get(json_object_get(l, "join_tokens"), 0);
    cr_assert_eq(json_integer_value(json_object_get(t, "uses_left")), 0);
    cr_assert_eq(json_integer_value(json_object_get(t, "registrations")), 1);
    cr_assert_null(json_object_get(t, "token"), "a listed join token has no secret");
    json_decref(l);

    /* N uses: exactly N new workers */
    char two_id[64], two[128];
    join_new(2, "1h", two_id, two);
    reg_ok(NULL, two, NULL, tmp, tmp);
    reg_ok(NULL, two, NULL, tmp, tmp);
    r = reg_call(NULL, two, NULL, NULL);
    cr_assert_str_eq(code(r), "UNAUTHENTICATED", "%s", details(r));
    json_decref(r);

    /* an expired one */
    char old_id[64], old[128];
    join_new(5, "1s", old_id, old);
    join_state_is(old_id, "expired");
    r = reg_call(NULL, old, NULL, NULL);
    cr_assert_str_eq(code(r), "UNAUTHENTICATED", "an expired join token: %s", details(r));
    cr_assert(strstr(details(r), "expired"), "%s", details(r));
    json_decref(r);

    /* a revoked one */
    char gone_id[64], gone[128];
    join_new(5, "1h", gone_id, gone);
    json_t *rev = NULL;
    cr_assert_eq(svc_join_token_revoke(S, svc_caller_kilnd(), gone_id, &rev, &err), 0, "%s", err.message);
    cr_assert_str_eq(json_string_value(json_object_get(rev, "state")), "revoked");
    json_decref(rev);
    r = reg_call(NULL, gone, NULL, NULL);
    cr_assert_str_eq(code(r), "UNAUTHENTICATED", "%s", details(r));
    cr_assert(strstr(details(r), "was revoked"), "%s", details(r));
    json_decref(r);

    /* the file's token keeps working beside them */
    reg_ok(NULL, join_token, NULL, tmp, tmp);
    /* and what a cluster admin's request may not say */
    json_t *out = NULL;
    int64_t zero = 0, many = 1000001;
    cr_assert_eq(svc_join_token_create(S, svc_caller_kilnd(), &zero, NULL, NULL, &out, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "uses");
    cr_assert_eq(svc_join_token_create(S, svc_caller_kilnd(), &many, NULL, NULL, &out, &err), KILN_EINVAL);
    cr_assert_eq(svc_join_token_create(S, svc_caller_kilnd(), NULL, "forever", NULL, &out, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "expires_in");
    cr_assert_eq(svc_join_token_create(S, svc_caller_kilnd(), NULL, "366d", NULL, &out, &err), KILN_EINVAL);
}

/* One heartbeat of worker wid through the service (what the gRPC server calls once the
 * credential and certificate passed): the attempt of job it was handed (0: none), and whether it
 * was told it waits for approval. */
static int heartbeat_in_process(const char *wid, const char *job, bool *waiting)
{
    arena_t a;
    arena_init(&a, 0);
    kiln_err_t err;
    Kiln__HeartbeatRequest hb = KILN__HEARTBEAT_REQUEST__INIT;
    Kiln__HeartbeatResponse out = KILN__HEARTBEAT_RESPONSE__INIT;
    hb.worker_id = (char *)wid;
    cr_assert_eq(svc_agent_heartbeat(S, wid, &hb, &a, &out, &err), 0, "%s", err.message);
    int attempt = 0;
    for (size_t k = 0; k < out.n_assignments; k++)
        if (!strcmp(out.assignments[k]->job_id, job))
            attempt = out.assignments[k]->attempt;
    if (waiting)
        *waiting = out.waiting_for_approval;
    arena_deinit(&a);
    return attempt;
}

/* Heartbeats as the worker until an assignment of job arrives (up to 10 s); its attempt, or 0. */
static int assignment_of(const char *wid, const char *job)
{
    for (int i = 0; i < 200; i++) {
        int attempt = heartbeat_in_process(wid, job, NULL);
        if (attempt)
            return attempt;
        usleep(50000);
    }
    return 0;
}

static const char *job_state(const char *job)
{
    static char st[32];
    json_t *j = NULL;
    kiln_err_t err;
    cr_assert_eq(svc_job_get(S, svc_caller_kilnd(), job, &j, &err), 0, "%s", err.message);
    snprintf(st, sizeof st, "%s", json_string_value(json_object_get(j, "state")));
    json_decref(j);
    return st;
}

Test(grpc_auth, a_removed_and_banned_worker_cannot_come_back)
{
    char wid[128], cred[128], fp[65], tmp[128], job[64];
    reg_ok(NULL, join_token, NULL, wid, cred);
    json_t *spec = json_pack("{s:s, s:{s:s, s:[i], s:i, s:i}, s:{s:s}, s:{s:i}}", "name", "rm", "model", "type", "mlp",
                             "hidden", 8, "n_inputs", 4, "n_classes", 2, "data", "train", "synthetic", "retry",
                             "max_attempts", 2);
    json_t *jj = NULL;
    bool created;
    kiln_err_t err;
    cr_assert_eq(svc_job_create(S, svc_caller_kilnd(), spec, NULL, &jj, &created, &err), 0, "%s", err.message);
    snprintf(job, sizeof job, "%s", json_string_value(json_object_get(jj, "id")));
    json_decref(jj);
    json_decref(spec);
    cr_assert_eq(assignment_of(wid, job), 1);
    json_t *r = one((gcall_t){.method = "/kiln.AgentService/ReportRankStatus",
                              .request = json_pack("{s:s, s:s, s:i, s:b}", "worker_id", wid, "job_id", job, "attempt", 1,
                                                   "started", 1),
                              .token = cred});
    cr_assert_str_eq(code(r), "OK", "%s", details(r));
    json_decref(r);
    cr_assert_str_eq(job_state(job), "RUNNING");

    /* a cluster admin removes and bans it over gRPC */
    r = one((gcall_t){.method = "/kiln.TrainingService/RemoveWorker",
                      .request = json_pack("{s:s, s:b, s:s}", "id", wid, "ban", 1, "reason", "credential stolen"),
                      .token = admin_token});
    cr_assert_str_eq(code(r), "OK", "%s", details(r));
    json_t *resp = json_object_get(r, "response");
    cr_assert_eq(json_integer_value(json_object_get(resp, "lost_attempts")), 1);
    openssl_fingerprint("agent", fp);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(resp, "ban"), "cert_sha256")), fp);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(resp, "ban"), "worker_id")), wid);
    json_decref(r);
    /* its attempt was lost as when a worker dies: the job waits for its second attempt */
    const char *st = job_state(job);
    cr_assert(!strcmp(st, "RESTARTING") || !strcmp(st, "QUEUED"), "job is %s", st);
    json_t *ev = NULL;
    cr_assert_eq(svc_job_events(S, svc_caller_kilnd(), job, &ev, &err), 0);
    char *evs = json_dumps(ev, 0);
    cr_assert(strstr(evs, "was removed by admin"), "%s", evs);
    free(evs);
    json_decref(ev);
    json_t *w = listed_worker(wid);
    cr_assert_null(w, "a removed worker is not listed");

    /* its credential, its id and its certificate are all refused; another machine with its own
     * certificate is not affected */
    struct { const char *what, *want, *says; } tries[] = {
        {"its heartbeat", "UNAUTHENTICATED", "not valid"},
        {"its id with its old credential", "PERMISSION_DENIED", "is banned"},
        {"a new worker from its certificate", "PERMISSION_DENIED", "certificate is banned"},
        {"its id from another certificate", "PERMISSION_DENIED", "is banned"},
        {"another machine", "OK", ""},
    };
    json_t *reg = json_pack("{s:s, s:i, s:s}", "hostname", "h", "slots", 1, "slot_type", "cpu");
    gcall_t calls[] = {
        {.method = "/kiln.AgentService/Heartbeat", .request = json_object(), .token = cred},
        {.method = "/kiln.AgentService/RegisterWorker", .request = json_pack("{s:s, s:O}", "worker_id", wid, "hostname", json_object_get(reg, "hostname")),
         .token = join_token, .worker_credential = cred},
        {.method = "/kiln.AgentService/RegisterWorker", .request = json_deep_copy(reg), .token = join_token},
        {.method = "/kiln.AgentService/RegisterWorker", .request = json_pack("{s:s}", "worker_id", wid), .token = join_token,
         .cert = "agent2"},
        {.method = "/kiln.AgentService/RegisterWorker", .request = json_deep_copy(reg), .token = join_token,
         .cert = "agent2"},
    };
    json_decref(reg);
    json_t *res = run_calls(calls, sizeof calls / sizeof calls[0], true);
    for (size_t i = 0; i < sizeof tries / sizeof tries[0]; i++) {
        json_t *t = json_array_get(res, i);
        cr_expect_str_eq(code(t), tries[i].want, "%s: %s", tries[i].what, details(t));
        cr_expect(strstr(details(t), tries[i].says), "%s: %s", tries[i].what, details(t));
    }
    json_decref(res);
    /* the bans are listed, and lifting one lets the certificate in again */
    r = one((gcall_t){.method = "/kiln.TrainingService/ListWorkerBans", .token = admin_token});
    cr_assert_str_eq(code(r), "OK", "%s", details(r));
    json_t *bans = json_object_get(json_object_get(r, "response"), "bans");
    cr_assert_eq(json_array_size(bans), 1);
    json_t *ban = json_array_get(bans, 0);
    cr_assert_str_eq(json_string_value(json_object_get(ban, "reason")), "credential stolen");
    char ban_id[32];
    snprintf(ban_id, sizeof ban_id, "%s", json_string_value(json_object_get(ban, "id"))); /* int64: text */
    json_decref(r);
    r = one((gcall_t){.method = "/kiln.TrainingService/DeleteWorkerBan", .request = json_pack("{s:s}", "id", ban_id),
                      .token = admin_token});
    cr_assert_str_eq(code(r), "OK", "%s", details(r));
    json_decref(r);
    reg_ok(NULL, join_token, NULL, tmp, tmp);
}

Test(grpc_auth, artifacts_record_the_worker_that_uploaded_them)
{
    world();
    char job[64], wid[64];
    uint8_t *data = job_with_artifact(job, wid, 1000);
    json_t *r = one((gcall_t){.method = "/kiln.TrainingService/ListArtifacts",
                              .request = json_pack("{s:s}", "id", job), .token = tokens[C_VIEWER]});
    cr_assert_str_eq(code(r), "OK", "%s", details(r));
    json_t *a = json_array_get(json_object_get(json_object_get(r, "response"), "artifacts"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(a, "worker_id")), wid, "provenance: the uploading worker");
    json_decref(r);
    free(data);
}

/* ---- the same kilnd told to trust agents less ------------------------------------------------ */

/* A suite whose kilnd cfg_fn configures. */
#define TRUST_SUITE(name, cfg_fn)                                                                  \
    static void setup_##name(void)                                                                 \
    {                                                                                              \
        configure = cfg_fn;                                                                        \
        setup();                                                                                   \
    }                                                                                              \
    TestSuite(name, .init = setup_##name, .fini = teardown, .timeout = 120)

static void cfg_distinct(svc_config_t *cfg) { cfg->agent_distinct_certs = true; }
TRUST_SUITE(grpc_trust_distinct, cfg_distinct);

Test(grpc_trust_distinct, one_live_worker_per_certificate)
{
    char w1[128], cred1[128], w2[128], cred2[128];
    reg_ok(NULL, join_token, NULL, w1, cred1);
    json_t *r = reg_call(NULL, join_token, NULL, NULL);
    cr_assert_str_eq(code(r), "PERMISSION_DENIED", "a second worker with w1's certificate: %s", details(r));
    cr_assert(strstr(details(r), w1) && strstr(details(r), "certificate of its own"), "%s", details(r));
    json_decref(r);
    reg_ok(NULL, join_token, "agent2", w2, cred2);
    /* w1 itself registers again with its own certificate */
    r = reg_call(w1, NULL, cred1, NULL);
    cr_assert_str_eq(code(r), "OK", "%s", details(r));
    json_decref(r);
    /* once w1 is gone, its certificate may register a worker again */
    json_t *out = NULL;
    kiln_err_t err;
    cr_assert_eq(svc_worker_remove(S, svc_caller_kilnd(), w1, false, NULL, &out, &err), 0, "%s", err.message);
    json_decref(out);
    char w3[128], cred3[128];
    reg_ok(NULL, join_token, NULL, w3, cred3);
}

/* per source address: 12 a minute, bursts of 2; in all: 18 a minute, bursts of 3 */
static void cfg_limits(svc_config_t *cfg)
{
    cfg->register_per_min_addr = 12;
    cfg->register_per_min = 18;
}
TRUST_SUITE(grpc_trust_limits, cfg_limits);

Test(grpc_trust_limits, registrations_are_rate_limited)
{
    gcall_t calls[3];
    for (int i = 0; i < 3; i++)
        calls[i] = (gcall_t){.method = "/kiln.AgentService/RegisterWorker",
                             .request = json_pack("{s:s, s:i, s:s}", "hostname", "flood", "slots", 1, "slot_type", "cpu"),
                             .token = join_token};
    json_t *res = run_calls(calls, 3, true);
    json_t *first = json_array_get(res, 0), *third = json_array_get(res, 2);
    cr_assert_str_eq(code(first), "OK", "%s", details(first));
    cr_assert_str_eq(code(json_array_get(res, 1)), "OK", "%s", details(json_array_get(res, 1)));
    cr_assert_str_eq(code(third), "RESOURCE_EXHAUSTED", "the third within a burst of 2: %s", details(third));
    cr_assert(strstr(details(third), "too many worker registrations from 127.0.0.1"), "%s", details(third));
    const char *hint = json_string_value(json_object_get(json_object_get(third, "trailing"), "kiln-hint"));
    cr_assert(hint && strstr(hint, "retry in"), "says when to retry: %s", hint ? hint : "(no hint)");
    /* a worker registering again with its credential is not counted */
    json_t *r = reg_call(field(first, "worker_id"), NULL, field(first, "credential"), NULL);
    cr_assert_str_eq(code(r), "OK", "%s", details(r));
    json_decref(r);
    json_decref(res);
    /* the limit for all of this kilnd: registrations from other addresses share it (at most 3 at
     * once), each address within its own */
    char join_copy[128];
    snprintf(join_copy, sizeof join_copy, "%s", join_token);
    int admitted = 0, refused = 0;
    for (int i = 1; i <= 5 && !refused; i++) {
        char from[32];
        snprintf(from, sizeof from, "10.0.0.%d", i);
        svc_agent_peer_t peer = {.join_token = join_copy, .address = from};
        Kiln__RegisterRequest req = KILN__REGISTER_REQUEST__INIT;
        Kiln__RegisterResponse out = KILN__REGISTER_RESPONSE__INIT;
        req.hostname = from;
        req.slot_type = "cpu";
        arena_t a;
        arena_init(&a, 0);
        kiln_err_t err;
        int rc = svc_agent_register_as(S, &req, &peer, &a, &out, &err);
        arena_deinit(&a);
        if (rc == 0) {
            admitted++;
        } else {
            cr_assert_eq(rc, KILN_ELIMIT, "%s", err.message);
            cr_assert(strstr(err.message, "this kilnd takes at most 18 a minute"), "%s", err.message);
            refused = i;
        }
    }
    cr_assert(refused > 0 && admitted <= 3, "the global limit holds: %d admitted", admitted);
}

/* approval mode */
static void cfg_approval(svc_config_t *cfg) { cfg->agent_approval = true; }
TRUST_SUITE(grpc_trust_approval, cfg_approval);

Test(grpc_trust_approval, a_pending_worker_gets_no_job_until_approved)
{
    char wid[128], cred[128], job[64];
    reg_ok(NULL, join_token, NULL, wid, cred);
    json_t *w = listed_worker(wid);
    cr_assert_str_eq(json_string_value(json_object_get(w, "approval")), "PENDING");
    json_decref(w);
    new_job("default", job);
    /* it heartbeats (and stays alive), hears that it waits, and gets nothing while the scheduler
     * (every 50 ms) runs twenty times and more */
    for (int i = 0; i < 20; i++) {
        bool waiting = false;
        cr_assert_eq(heartbeat_in_process(wid, job, &waiting), 0, "no work while pending");
        cr_assert(waiting);
        usleep(50000);
    }
    cr_assert_str_eq(job_state(job), "QUEUED");
    /* over the wire: its heartbeat says so; what it would report is refused */
    gcall_t calls[] = {{.method = "/kiln.AgentService/Heartbeat", .request = json_object(), .token = cred},
                       {.method = "/kiln.AgentService/PushLogs", .request = log_batch(wid, job, "forged"), .token = cred}};
    json_t *res = run_calls(calls, 2, true);
    json_t *r = json_array_get(res, 0);
    cr_assert_str_eq(code(r), "OK", "%s", details(r));
    json_t *resp = json_object_get(r, "response");
    cr_assert(json_is_true(json_object_get(resp, "waiting_for_approval")));
    cr_assert(strstr(json_string_value(json_object_get(resp, "message")), "kiln workers approve"));
    cr_assert_eq(json_array_size(json_object_get(resp, "assignments")), 0, "no work while pending");
    r = json_array_get(res, 1);
    cr_assert_str_eq(code(r), "FAILED_PRECONDITION", "%s", details(r));
    cr_assert(strstr(details(r), "waiting for approval"), "%s", details(r));
    json_decref(res);
    /* a cluster admin approves it (an editor may not) */
    char editor[128];
    user("ed", 0, editor);
    r = one((gcall_t){.method = "/kiln.TrainingService/ApproveWorker", .request = json_pack("{s:s}", "id", wid),
                      .token = editor});
    cr_assert_str_eq(code(r), "PERMISSION_DENIED", "%s", details(r));
    json_decref(r);
    r = one((gcall_t){.method = "/kiln.TrainingService/ApproveWorker", .request = json_pack("{s:s}", "id", wid),
                      .token = admin_token});
    cr_assert_str_eq(code(r), "OK", "%s", details(r));
    cr_assert_str_eq(field(r, "approval"), "APPROVED");
    cr_assert_str_eq(field(r, "approved_by"), "admin");
    json_decref(r);
    /* and now it runs the job */
    cr_assert_eq(assignment_of(wid, job), 1, "the approved worker got the job");
    r = one((gcall_t){.method = "/kiln.AgentService/ReportRankStatus",
                      .request = json_pack("{s:s, s:s, s:i, s:b}", "worker_id", wid, "job_id", job, "attempt", 1,
                                           "started", 1),
                      .token = cred});
    cr_assert_str_eq(code(r), "OK", "%s", details(r));
    json_decref(r);
    cr_assert_str_eq(job_state(job), "RUNNING");
    /* registering again keeps the approval */
    r = reg_call(wid, NULL, cred, NULL);
    cr_assert_str_eq(code(r), "OK", "%s", details(r));
    json_decref(r);
    w = listed_worker(wid);
    cr_assert_str_eq(json_string_value(json_object_get(w, "approval")), "APPROVED");
    json_decref(w);
}

/* ListTuningJobs pages as GET /v1/tuning-jobs does: page_size 2 and each next_page_token in turn
 * give every tuning job the caller may see exactly once, newest first, and another project's
 * never; the last page's token is "". */
Test(grpc_auth, a_queue_names_only_the_projects_its_reader_can_see_as_rest_does)
{
    /* ListQueues and GetQueue show a member only its own projects of a queue's (and "*"), as
     * REST's GET /v1/queues does; a cluster admin sees them all */
    kiln_err_t err;
    json_t *out = NULL;
    cr_assert_eq(svc_project_create(S, svc_caller_kilnd(), "a", NULL, &out, &err), 0, "%s", err.message);
    json_decref(out);
    cr_assert_eq(svc_project_create(S, svc_caller_kilnd(), "b", NULL, &out, &err), 0, "%s", err.message);
    json_decref(out);
    json_t *body = json_pack("{s:s, s:{s:i}, s:[s, s]}", "name", "shared", "quota", "cpu", 4, "projects", "a", "b");
    cr_assert_eq(svc_queue_create(S, svc_caller_kilnd(), body, &out, &err), 0, "%s", err.message);
    json_decref(out);
    json_decref(body);
    char t_a[128];
    user("ua", 0, t_a);
    member("a", "ua", "viewer");
    gcall_t calls[] = {
        {"/kiln.TrainingService/ListQueues", json_object(), t_a, NULL, false, NULL},
        {"/kiln.TrainingService/GetQueue", json_pack("{s:s}", "name", "shared"), t_a, NULL, false, NULL},
        {"/kiln.TrainingService/GetQueue", json_pack("{s:s}", "name", "shared"), admin_token, NULL, false, NULL},
    };
    json_t *res = run_calls(calls, 3, true);
    for (size_t i = 0; i < 3; i++)
        cr_assert_str_eq(code_of(res, i), "OK", "call %zu: %s", i,
                         json_string_value(json_object_get(json_array_get(res, i), "details")));
    json_t *listed = NULL, *q;
    size_t i;
    json_array_foreach(json_object_get(json_object_get(json_array_get(res, 0), "response"), "queues"), i, q)
        if (!strcmp(json_string_value(json_object_get(q, "name")), "shared"))
            listed = json_object_get(q, "projects");
    json_t *got = json_object_get(json_object_get(json_array_get(res, 1), "response"), "projects");
    json_t *all = json_object_get(json_object_get(json_array_get(res, 2), "response"), "projects");
    char *ls = json_dumps(listed, JSON_COMPACT | JSON_ENCODE_ANY), *gs = json_dumps(got, JSON_COMPACT | JSON_ENCODE_ANY),
         *as = json_dumps(all, JSON_COMPACT | JSON_ENCODE_ANY);
    cr_assert_str_eq(ls, "[\"a\"]", "ListQueues shows a member of a only a");
    cr_assert_str_eq(gs, "[\"a\"]", "GetQueue shows a member of a only a");
    cr_assert_str_eq(as, "[\"a\",\"b\"]", "a cluster admin sees both");
    /* REST answers the same caller the same */
    gt_http_start(&K);
    char url[200], auth[200], *raw = NULL;
    long st = 0;
    snprintf(url, sizeof url, "%s/v1/queues/shared", K.base);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", t_a);
    const char *hdrs[] = {auth, NULL};
    cr_assert_eq(th_http("GET", url, NULL, hdrs, &st, &raw, 10000), 0);
    cr_assert_eq(st, 200, "%s", raw);
    json_t *rj = json_loads(raw, 0, NULL);
    char *rs = json_dumps(json_object_get(rj, "projects"), JSON_COMPACT);
    cr_assert_str_eq(rs, gs, "REST and gRPC agree");
    free(rs);
    json_decref(rj);
    free(raw);
    free(ls);
    free(gs);
    free(as);
    json_decref(res);
}

Test(grpc_auth, list_tuning_jobs_pages_within_the_callers_projects)
{
    world();
    char q1[64], q2[64];
    new_tuning("q", q1);
    new_tuning("q", q2);
    json_t *all = NULL;
    kiln_err_t err;
    cr_assert_eq(svc_tuning_list(S, svc_caller_kilnd(), &(svc_page_t){0}, &all, &err), 0, "%s", err.message);
    struct { int caller; const char *project; } cases[] = {{C_VIEWER, "p"}, {C_OTHER_ADMIN, "q"}};
    for (size_t c = 0; c < KILN_ARRAY_LEN(cases); c++) {
        size_t want = 0, i;
        json_t *t;
        json_array_foreach(json_object_get(all, "tuning_jobs"), i, t)
            want += !strcmp(json_string_value(json_object_get(t, "project")), cases[c].project);
        json_t *seen = json_object();
        char token[512] = "";
        int pages = 0;
        do {
            json_t *req = json_pack("{s:i}", "page_size", 2);
            if (token[0])
                json_object_set_new(req, "page_token", json_string(token));
            gcall_t call = {.method = "/kiln.TrainingService/ListTuningJobs", .request = req,
                            .token = tokens[cases[c].caller]};
            json_t *res = run_calls(&call, 1, true);
            cr_assert_str_eq(code_of(res, 0), "OK", "%s", json_dumps(res, 0));
            json_t *r = json_object_get(json_array_get(res, 0), "response");
            json_t *page = json_object_get(r, "tuning_jobs");
            cr_assert_leq(json_array_size(page), 2);
            json_array_foreach(page, i, t) {
                const char *id = json_string_value(json_object_get(t, "id"));
                cr_assert_str_eq(json_string_value(json_object_get(t, "project")), cases[c].project,
                                 "%s sees only its project's", k_callers[cases[c].caller]);
                cr_assert_null(json_object_get(seen, id), "%s listed twice", id);
                json_object_set_new(seen, id, json_true());
            }
            const char *next = json_string_value(json_object_get(r, "next_page_token"));
            snprintf(token, sizeof token, "%s", next ? next : "");
            json_decref(res);
            cr_assert_lt(++pages, 20);
        } while (token[0]);
        cr_assert_eq(json_object_size(seen), want, "%s: every tuning job of %s once", k_callers[cases[c].caller],
                     cases[c].project);
        cr_assert_eq(pages, (int)(want + 1) / 2, "no empty last page");
        json_decref(seen);
    }
    cr_assert_geq(json_array_size(json_object_get(all, "tuning_jobs")), 5);
    json_decref(all);
}
