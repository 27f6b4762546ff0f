/* test_grpc_code.c - code archives and script jobs over real gRPC, against an in-process kilnd
 * (service with an artifact store, gRPC server) on a fresh database: UploadCode in pieces that
 * resume at the offset kilnd holds and answer the archive's SHA-256, the limit dropping an upload;
 * a script job submitted over gRPC (free-form hyperparameters as JSON text) that comes back
 * alike; its assignment carrying the script's fields; and the agent's own transfer code
 * (FetchCode) filling its code cache with exactly the uploaded tree, while a worker not assigned
 * the job is refused. */
#include "agent/agent_int.h"
#include "code/code.h"
#include "tests/grpc/grpc_test.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define M_UPLOAD "/kiln.TrainingService/UploadCode"
#define M_CREATE "/kiln.TrainingService/CreateJob"
#define M_REGISTER "/kiln.AgentService/RegisterWorker"
#define M_HEARTBEAT "/kiln.AgentService/Heartbeat"
#define M_FETCH "/kiln.AgentService/FetchCode"

static gt_kilnd_t K;
static svc_t *S;
static agent_rpc_t *C;
static const char *const dir = K.dir;

static void setup(void)
{
    /* the protocol is tested here; who may call what is test_grpc_auth.c's */
    gt_start(&K, &(gt_opts_t){.name = "gcode", .artifacts = "store", .rpc = true,
                              .svc = {.sched_interval_ms = 50, .auth_disabled = true, .code_max_bytes = 1 << 20}});
    S = K.svc;
    C = K.rpc;
}

static void teardown(void)
{
    gt_stop(&K);
}

TestSuite(grpc_code, .init = setup, .fini = teardown, .timeout = 120);

/* A packed source tree whose train.py says what, with pad random bytes beside it. */
static char *packed(const char *what, size_t pad, size_t *len)
{
    char src[256], p[300];
    snprintf(src, sizeof(src), "%s/src-%s", dir, what);
    cr_assert_eq(mkdir(src, 0755), 0);
    snprintf(p, sizeof(p), "%s/train.py", src);
    FILE *f = fopen(p, "w");
    fprintf(f, "print('%s')\n", what);
    fclose(f);
    if (pad) {
        snprintf(p, sizeof(p), "%s/weights.bin", src);
        char cmd[400];
        snprintf(cmd, sizeof(cmd), "head -c %zu /dev/urandom > %s", pad, p);
        cr_assert_eq(system(cmd), 0);
    }
    snprintf(p, sizeof(p), "%s.tgz", src);
    int fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0600);
    kiln_err_t err;
    cr_assert_eq(code_pack_dir(src, fd, NULL, 0, NULL, &err), 0, "%s", err.message);
    close(fd);
    char *data = NULL;
    cr_assert_eq(kiln_file_read(p, &data, len, &err), 0);
    return data;
}

/* One UploadCode call; returns the gRPC code, the answer in *out (NULL unless OK). */
static int upload_piece(const char *upload_id, int64_t offset, const char *data, size_t n, bool finish,
                        Kiln__UploadCodeResponse **out)
{
    Kiln__UploadCodeRequest req = KILN__UPLOAD_CODE_REQUEST__INIT;
    req.upload_id = (char *)(upload_id ? upload_id : "");
    req.offset = offset;
    req.data.data = (uint8_t *)data;
    req.data.len = n;
    req.finish = finish;
    ProtobufCMessage *resp = NULL;
    int code = -1;
    kiln_err_t err;
    agent_rpc_call(C, M_UPLOAD, NULL, 0, &req.base, &kiln__upload_code_response__descriptor, 10000, &resp, &code, &err);
    *out = (Kiln__UploadCodeResponse *)resp;
    return code;
}

/* Uploads data in pieces of piece bytes; returns the source (heap). */
static char *upload(const char *data, size_t len, size_t piece)
{
    Kiln__UploadCodeResponse *r = NULL;
    char id[64] = "";
    size_t off = 0;
    char *source = NULL;
    do {
        size_t n = KILN_MIN(piece, len - off);
        bool last = off + n == len;
        cr_assert_eq(upload_piece(id, (int64_t)off, data + off, n, last, &r), 0, "piece at %zu", off);
        snprintf(id, sizeof(id), "%s", r->upload_id);
        cr_assert_eq(r->offset, (int64_t)(off + n));
        off += n;
        if (last)
            source = strdup(r->source);
        protobuf_c_message_free_unpacked(&r->base, NULL);
    } while (off < len);
    return source;
}

Test(grpc_code, an_upload_in_pieces_resumes_where_kilnd_holds_it)
{
    size_t len = 0;
    char *data = packed("pieces", 300000, &len);
    cr_assert_gt(len, 250000);
    char sha[KILN_SHA256_HEX], want[100];
    kiln_sha256_hex(data, len, sha);
    snprintf(want, sizeof(want), "code:sha256:%s", sha);
    Kiln__UploadCodeResponse *r = NULL;
    cr_assert_eq(upload_piece(NULL, 0, data, 100000, false, &r), 0);
    char id[64];
    snprintf(id, sizeof(id), "%s", r->upload_id);
    cr_assert_eq(strlen(id), 32);
    cr_assert_eq(r->offset, 100000);
    cr_assert_str_eq(r->source, "", "not finished: no source yet");
    protobuf_c_message_free_unpacked(&r->base, NULL);
    /* a piece at the wrong offset (a retry of one kilnd already holds) */
    cr_assert_eq(upload_piece(id, 50000, data + 50000, 1000, false, &r), 9, "FAILED_PRECONDITION");
    cr_assert_null(r);
    cr_assert_eq(upload_piece(id, 100000, data + 100000, 100000, false, &r), 0);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    cr_assert_eq(upload_piece(id, 200000, data + 200000, len - 200000, true, &r), 0);
    cr_assert_str_eq(r->source, want, "the source is the SHA-256 of the bytes");
    cr_assert_str_eq(r->digest, sha);
    cr_assert_eq(r->size, (int64_t)len);
    cr_assert_eq(r->files, 2);
    cr_assert(r->created);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    /* again, in one call: the same source, nothing new */
    cr_assert_eq(upload_piece(NULL, 0, data, len, true, &r), 0);
    cr_assert_str_eq(r->source, want);
    cr_assert_not(r->created);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    /* the finished upload is gone: its id names nothing now */
    cr_assert_eq(upload_piece(id, (int64_t)len, "x", 1, false, &r), 5, "NOT_FOUND");
    free(data);
}

Test(grpc_code, an_upload_past_the_limit_is_dropped)
{
    size_t len = 0;
    char *data = packed("big", (1 << 20) + 100000, &len); /* random: it does not compress */
    Kiln__UploadCodeResponse *r = NULL;
    cr_assert_eq(upload_piece(NULL, 0, data, 600000, false, &r), 0);
    char id[64];
    snprintf(id, sizeof(id), "%s", r->upload_id);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    cr_assert_eq(upload_piece(id, 600000, data + 600000, 600000, false, &r), 3, "INVALID_ARGUMENT (REST's 413)");
    cr_assert_eq(upload_piece(id, 600000, data + 600000, 1000, false, &r), 5, "the upload is gone");
    free(data);
}

/* ---- a script job, its assignment and its code on the agent --------------------------------- */

static char *register_worker(const char *host, const char *root)
{
    Kiln__RegisterRequest req = KILN__REGISTER_REQUEST__INIT;
    char *roots[] = {(char *)root};
    req.hostname = (char *)host;
    req.address = (char *)"127.0.0.1";
    req.slots = 2;
    req.slot_type = (char *)"cpu";
    req.version = (char *)"test";
    req.cpu_cores = 2;
    req.data_roots = roots;
    req.n_data_roots = 1;
    ProtobufCMessage *resp = NULL;
    kiln_err_t err;
    cr_assert_eq(agent_rpc_call(C, M_REGISTER, NULL, 0, &req.base, &kiln__register_response__descriptor, 5000, &resp,
                                 NULL, &err), 0, "%s", err.message);
    char *id = strdup(((Kiln__RegisterResponse *)resp)->worker_id);
    protobuf_c_message_free_unpacked(resp, NULL);
    return id;
}

/* Heartbeats as worker id until kilnd assigns it something (asserts within 10 s). */
static Kiln__HeartbeatResponse *assignment_of(const char *id)
{
    for (int i = 0; i < 200; i++) {
        Kiln__HeartbeatRequest req = KILN__HEARTBEAT_REQUEST__INIT;
        req.worker_id = (char *)id;
        ProtobufCMessage *resp = NULL;
        kiln_err_t err;
        cr_assert_eq(agent_rpc_call(C, M_HEARTBEAT, NULL, 0, &req.base, &kiln__heartbeat_response__descriptor, 5000,
                                     &resp, NULL, &err), 0, "%s", err.message);
        Kiln__HeartbeatResponse *hb = (Kiln__HeartbeatResponse *)resp;
        if (hb->n_assignments)
            return hb;
        protobuf_c_message_free_unpacked(resp, NULL);
        usleep(50000);
    }
    cr_assert_fail("no assignment within 10 s");
    return NULL;
}

/* The transfers' environment of a bare agent: no credential (kilnd runs without auth). */
static char worker[64];
static size_t no_auth(void *ud, char *bearer, agent_md_t *md)
{
    (void)ud;
    (void)bearer;
    (void)md;
    return 0;
}
static void unauthenticated(void *ud, const char *what, const kiln_err_t *err)
{
    (void)ud;
    (void)what;
    (void)err;
}
static bool not_draining(void *ud)
{
    (void)ud;
    return false;
}
static void worker_id(void *ud, char *buf, size_t n)
{
    (void)ud;
    snprintf(buf, n, "%s", worker);
}
static void no_start(void *ud, const Kiln__Assignment *a)
{
    (void)ud;
    (void)a;
}

Test(grpc_code, a_script_job_over_grpc_reaches_the_agents_code_cache)
{
    char data_root[200];
    snprintf(data_root, sizeof(data_root), "%s/data", dir);
    cr_assert_eq(mkdir(data_root, 0755), 0);
    char *wid = register_worker("host-a", data_root);
    snprintf(worker, sizeof(worker), "%s", wid);
    size_t len = 0;
    char *data = packed("job", 1000, &len);
    char *source = upload(data, len, 4096);
    /* the job, over gRPC: its free-form hyperparameters travel as JSON text */
    char train[256], val[256];
    snprintf(train, sizeof(train), "%s/train", data_root);
    snprintf(val, sizeof(val), "%s/val", data_root);
    Kiln__DataSpec__ChannelsEntry ch[2] = {KILN__DATA_SPEC__CHANNELS_ENTRY__INIT, KILN__DATA_SPEC__CHANNELS_ENTRY__INIT};
    ch[0].key = "train";
    ch[0].value = train;
    ch[1].key = "validation";
    ch[1].value = val;
    Kiln__DataSpec__ChannelsEntry *chp[2] = {&ch[0], &ch[1]};
    Kiln__DataSpec ds = KILN__DATA_SPEC__INIT;
    ds.n_channels = 2;
    ds.channels = chp;
    Kiln__JobSpec__EnvironmentEntry env0 = KILN__JOB_SPEC__ENVIRONMENT_ENTRY__INIT, *envp[1] = {&env0};
    env0.key = "MY_FLAG";
    env0.value = "1";
    Google__Protobuf__Int32Value one = GOOGLE__PROTOBUF__INT32_VALUE__INIT, two = GOOGLE__PROTOBUF__INT32_VALUE__INIT,
                                 thirty = GOOGLE__PROTOBUF__INT32_VALUE__INIT;
    one.value = 1;
    two.value = 2;
    thirty.value = 30;
    Google__Protobuf__Int64Value mem = GOOGLE__PROTOBUF__INT64_VALUE__INIT;
    mem.value = 512;
    Kiln__Resources res = KILN__RESOURCES__INIT;
    res.nodes = &one;
    res.memory_limit_mb = &mem;
    Kiln__TorchDistributed td = KILN__TORCH_DISTRIBUTED__INIT;
    td.nproc_per_node = &two;
    Kiln__Distribution dist = KILN__DISTRIBUTION__INIT;
    dist.torch_distributed = &td;
    Kiln__Stopping stop = KILN__STOPPING__INIT;
    stop.grace_period_s = &thirty;
    Kiln__Retry retry = KILN__RETRY__INIT;
    retry.max_attempts = &two;
    Kiln__JobSpec spec = KILN__JOB_SPEC__INIT;
    spec.name = "ddp";
    spec.entry_point = "train.py";
    spec.source = source;
    /* 1e20: past an int64, which PostgreSQL's jsonb writes as 100000000000000000000 */
    spec.hyperparameters_json = "{\"epochs\": 3, \"model\": {\"depth\": 4}, \"big\": 1e20}";
    spec.data = &ds;
    spec.n_environment = 1;
    spec.environment = envp;
    spec.resources = &res;
    spec.distribution = &dist;
    spec.stopping = &stop;
    spec.retry = &retry;
    Kiln__CreateJobRequest creq_job = KILN__CREATE_JOB_REQUEST__INIT;
    creq_job.spec = &spec;
    ProtobufCMessage *resp = NULL;
    int code = -1;
    kiln_err_t err;
    cr_assert_eq(agent_rpc_call(C, M_CREATE, NULL, 0, &creq_job.base, &kiln__job__descriptor, 10000, &resp, &code, &err),
                 0, "%s (%d)", err.message, code);
    Kiln__Job *job = (Kiln__Job *)resp;
    cr_assert_str_eq(job->spec->entry_point, "train.py");
    json_t *hp = json_loads(job->spec->hyperparameters_json, 0, NULL);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(hp, "model"), "depth")), 4,
                 "the hyperparameters come back as sent: %s", job->spec->hyperparameters_json);
    cr_assert_eq(json_number_value(json_object_get(hp, "big")), 1e20, "%s", job->spec->hyperparameters_json);
    json_decref(hp);
    cr_assert_null(job->spec->model);
    char job_id[64];
    snprintf(job_id, sizeof(job_id), "%s", job->id);
    protobuf_c_message_free_unpacked(resp, NULL);

    /* the assignment carries what the script's runtime needs, typed */
    Kiln__HeartbeatResponse *hb = assignment_of(wid);
    const Kiln__Assignment *as = hb->assignments[0];
    cr_assert_str_eq(as->job_id, job_id);
    cr_assert_str_eq(as->entry_point, "train.py");
    cr_assert_str_eq(as->source, source);
    cr_assert_str_eq(as->code_digest, source + strlen("code:sha256:"));
    cr_assert_eq(as->code_size, (int64_t)len);
    cr_assert(as->torch_distributed);
    cr_assert_eq(as->nproc_per_node, 2);
    cr_assert_eq(as->n_ranks, 2, "nproc_per_node set slots_per_node");
    cr_assert_eq(as->memory_limit_mb, 512);
    cr_assert_eq(as->grace_period_s, 30);
    cr_assert_eq(as->max_attempts, 2);
    cr_assert_eq(as->n_channels, 2);
    cr_assert_eq(as->n_environment, 1);
    cr_assert_str_eq(as->environment[0]->key, "MY_FLAG");
    hp = json_loads(as->hyperparameters_json, 0, NULL);
    cr_assert_eq(json_integer_value(json_object_get(hp, "epochs")), 3);
    cr_assert_eq(json_number_value(json_object_get(hp, "big")), 1e20, "the agent gets it as sent: %s",
                 as->hyperparameters_json);
    json_decref(hp);
    bool channel_read = false;
    for (size_t i = 0; i < as->n_read_paths; i++)
        channel_read |= !strcmp(as->read_paths[i]->field, "data.channels.validation");
    cr_assert(channel_read, "the agent checks the channels as it checks every path a job reads");
    int attempt = as->attempt;
    protobuf_c_message_free_unpacked(&hb->base, NULL);

    /* the agent's own fetch fills its cache with the uploaded tree */
    ob_t ob;
    ob_init(&ob, 0);
    xfer_env_t env = {.rpc = C, .ob = &ob, .work_dir = dir, .auth_md = no_auth, .unauthenticated = unauthenticated,
                      .draining = not_draining, .worker_id = worker_id, .start = no_start, .ud = NULL};
    xfer_t *x = NULL;
    cr_assert_eq(xfer_create(&env, &x, &err), 0, "%s", err.message);
    char cache_dir[256], tree[PATH_MAX], p[PATH_MAX + 32];
    snprintf(cache_dir, sizeof(cache_dir), "%s/cache", dir);
    agent_code_cache_t *cache = NULL;
    cr_assert_eq(agent_code_cache_create(cache_dir, 0, xfer_code_fetch, x, &cache, &err), 0, "%s", err.message);
    agent_code_ref_t ref = {.digest = source + strlen("code:sha256:"), .size = (int64_t)len, .job_id = job_id,
                            .attempt = attempt};
    cr_assert_eq(agent_code_acquire(cache, &ref, tree, sizeof(tree), &err), 0, "%s", err.message);
    snprintf(p, sizeof(p), "%s/train.py", tree);
    char *text = NULL;
    cr_assert_eq(kiln_file_read(p, &text, NULL, &err), 0);
    cr_assert_str_eq(text, "print('job')\n");
    free(text);
    agent_code_release(cache, ref.digest);
    agent_code_cache_destroy(cache);
    xfer_destroy(x);
    ob_deinit(&ob);

    /* another worker, not assigned the job, gets none of it */
    char *other = register_worker("host-b", data_root);
    Kiln__CodeRequest creq = KILN__CODE_REQUEST__INIT;
    creq.worker_id = other;
    creq.job_id = job_id;
    creq.attempt = attempt;
    resp = NULL;
    code = -1;
    cr_assert_neq(agent_rpc_call(C, M_FETCH, NULL, 0, &creq.base, &kiln__code_chunk__descriptor, 5000, &resp, &code,
                                 &err), 0);
    cr_assert_eq(code, 7, "PERMISSION_DENIED, got %d: %s", code, err.message);
    free(other);
    free(source);
    free(data);
    free(wid);
}
