/* test_grpc_artifacts.c - artifacts between a real in-process agent and kilnd (service with an
 * artifact store + gRPC server) on a fresh database: what a rank leaves in its output directory
 * is uploaded before its exit is reported (links, subdirectories and odd names stay behind, and
 * the job's log says so), a failed job keeps what it wrote, a job over the per-job limit is told
 * why in its log, damaged chunks and foreign workers are refused over the wire, and a job that
 * starts from another's model gets that model's exact bytes. Ranks are shell scripts. */
#include "tests/grpc/grpc_test.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static gt_kilnd_t K;
static svc_t *S;
static agent_t *A;
static const char *const addr = K.addr, *const dir = K.dir;
static char work[200];

static void setup(void)
{
    gt_start(&K, &(gt_opts_t){.name = "gart", .artifacts = "store",
                              .svc = {.sched_interval_ms = 50, .auth_disabled = true,
                                      .artifact_max_job_bytes = 1 << 20}});
    S = K.svc;
    snprintf(work, sizeof work, "%s/work", dir);
    char data[200];
    snprintf(data, sizeof data, "%s/data", dir);
    mkdir(data, 0755);
    snprintf(data, sizeof data, "%s/data/text.txt", dir);
    FILE *f = fopen(data, "w");
    fputs("the quick brown fox jumps over the lazy dog\n", f);
    fclose(f);
}

static void teardown(void)
{
    agent_destroy(A);
    gt_stop(&K);
}

TestSuite(grpc_artifacts, .init = setup, .fini = teardown, .timeout = 90);

static void start_agent(const char *script)
{
    char data_root[200];
    snprintf(data_root, sizeof data_root, "%s/data", dir);
    const char *roots[] = {data_root};
    A = gt_agent_start(&K, (agent_config_t){.work_dir = work, .train_bin = gt_rank_script(&K, script), .cores = 1,
                                            .data_roots = roots, .n_data_roots = 1});
}

/* A tiny GPT job (the ranks are scripts: what matters is the spec kilnd stores). */
static char *submit(const char *init_from)
{
    json_t *spec = json_pack("{s:s, s:{s:s, s:i, s:i, s:i, s:i}, s:{s:s+}, s:{s:f, s:i, s:i},"
                             " s:{s:i, s:i, s:s}}",
                             "name", "art", "model", "type", "gpt", "n_layer", 1, "n_head", 2, "n_embd", 16, "seq_len",
                             8, "data", "train", dir, "/data/text.txt", "hyperparameters", "lr", 0.01,
                             "global_batch_size", 2, "max_steps", 3, "resources", "nodes", 1, "slots_per_node", 1,
                             "slot_type", "cpu");
    if (init_from)
        json_object_set_new(json_object_get(spec, "model"), "init_from", json_string(init_from));
    json_t *job = NULL;
    bool created = false;
    kiln_err_t err;
    cr_assert_eq(svc_job_create(S, svc_caller_kilnd(), spec, NULL, &job, &created, &err), 0, "%s (%s)", err.message,
                 err.field);
    char *id = strdup(json_string_value(json_object_get(job, "id")));
    json_decref(spec);
    json_decref(job);
    return id;
}

/* Polls the job until it is in one of the '|'-separated states; returns its artifacts as they
 * were at that first sight (caller decrefs). */
static json_t *artifacts_when(const char *id, const char *states, int timeout_ms)
{
    for (int waited = 0; waited <= timeout_ms; waited += 20) {
        json_t *job = NULL, *arts = NULL;
        kiln_err_t err;
        cr_assert_eq(svc_job_get(S, svc_caller_kilnd(), id, &job, &err), 0, "%s", err.message);
        bool reached = th_state_in(json_string_value(json_object_get(job, "state")), states);
        json_decref(job);
        if (reached) {
            cr_assert_eq(svc_job_artifacts(S, svc_caller_kilnd(), id, &arts, &err), 0, "%s", err.message);
            return arts;
        }
        usleep(20000);
    }
    cr_assert_fail("job %s never reached %s", id, states);
    return NULL;
}

static bool listed(json_t *arts, const char *name)
{
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(arts, "artifacts"), i, a)
        if (!strcmp(json_string_value(json_object_get(a, "name")), name))
            return true;
    return false;
}

/* Whether some log line of the job contains text. */
static bool log_has(const char *id, const char *text)
{
    for (int tries = 0; tries < 50; tries++) {
        svc_log_query_t q = {.rank = -1, .limit = 10000};
        json_t *logs = NULL;
        kiln_err_t err;
        cr_assert_eq(svc_job_logs(S, svc_caller_kilnd(), id, &q, &logs, &err), 0, "%s", err.message);
        size_t i;
        json_t *l;
        bool found = false;
        json_array_foreach(json_object_get(logs, "lines"), i, l)
            found = found || strstr(json_string_value(json_object_get(l, "line")), text);
        json_decref(logs);
        if (found)
            return true;
        usleep(50000);
    }
    return false;
}

static char *read_file(const char *path, size_t *len)
{
    char *text = NULL;
    kiln_err_t err;
    cr_assert_eq(kiln_file_read(path, &text, len, &err), 0, "%s", err.message);
    return text;
}

Test(grpc_artifacts, rank_0s_output_is_kept_before_the_job_completes)
{
    start_agent("cd \"$KILN_OUTPUT_DIR\"\n"
                "head -c 200000 /dev/urandom > model_llmc.bin\n"
                "echo 'a sample' > samples.txt\n"
                "ln -s /etc/passwd cred\n"               /* a link out of the directory */
                "echo x > .kept-aside && ln .kept-aside spec-link\n" /* a second name of another file */
                "mkdir sub && echo x > sub/inner\n"
                "echo x > .hidden\n"
                "echo x > 'a b'\n"
                "mkfifo pipe\n"
                "echo done\n");
    char *id = submit(NULL);
    json_t *arts = artifacts_when(id, TH_JOB_ENDED, 30000);
    cr_assert(listed(arts, "model_llmc.bin") && listed(arts, "samples.txt"),
              "kilnd holds the artifacts as soon as the job has ended");
    cr_assert_eq(json_array_size(json_object_get(arts, "artifacts")), 2, "and nothing else");
    json_decref(arts);
    /* the bytes are the rank's */
    char path[400];
    snprintf(path, sizeof path, "%s/jobs/%s/output/model_llmc.bin", work, id);
    size_t len = 0;
    char *want = read_file(path, &len);
    cr_assert_eq(len, 200000);
    svc_artifact_file_t f;
    kiln_err_t err;
    cr_assert_eq(svc_job_artifact_open(S, svc_caller_kilnd(), id, "model_llmc.bin", &f, &err), 0, "%s", err.message);
    char *got = malloc(len);
    cr_assert_eq(pread(f.fd, got, len, 0), (ssize_t)len);
    close(f.fd);
    cr_assert(!memcmp(got, want, len));
    char sha[KILN_SHA256_HEX];
    kiln_sha256_hex(want, len, sha);
    cr_assert_str_eq(f.sha256, sha);
    /* what stayed behind, and why, is in the job's log */
    cr_assert(log_has(id, "[kiln-agent] artifacts: skipped \"cred\": a symbolic link"));
    cr_assert(log_has(id, "skipped \"spec-link\": it has other hard links"));
    cr_assert(log_has(id, "skipped \"sub\": a directory"));
    cr_assert(log_has(id, "skipped \".hidden\""));
    cr_assert(log_has(id, "skipped \"a b\""));
    cr_assert(log_has(id, "skipped \"pipe\": not a regular file"));
    cr_assert(log_has(id, "[kiln-agent] artifacts: 2 file(s), 200009 bytes, kept by kilnd"));
    free(want);
    free(got);
    free(id);
}

Test(grpc_artifacts, a_failed_job_keeps_what_it_wrote_and_a_big_one_is_told_why_not)
{
    start_agent("if grep -qE '\"name\": ?\"big\"' \"$KILN_SPEC\"; then\n"
                "  head -c 1500000 /dev/zero > \"$KILN_OUTPUT_DIR/model_llmc.bin\"; exit 0\n"
                "fi\n"
                "echo 'half a run' > \"$KILN_OUTPUT_DIR/samples.txt\"\n"
                "echo 'out of memory' >&2\n"
                "exit 3\n");
    char *id = submit(NULL);
    json_t *arts = artifacts_when(id, TH_JOB_ENDED, 30000);
    cr_assert(listed(arts, "samples.txt"), "a failed job's output is kept too");
    json_decref(arts);
    json_t *job = NULL;
    kiln_err_t err;
    cr_assert_eq(svc_job_get(S, svc_caller_kilnd(), id, &job, &err), 0);
    cr_assert_str_eq(json_string_value(json_object_get(job, "state")), "FAILED");
    cr_assert(strstr(json_string_value(json_object_get(job, "reason")), "out of memory"), "the reason is the rank's");
    json_decref(job);
    free(id);

    /* 1.5 MB against this kilnd's 1 MiB: refused, the job still ends, its log says why */
    json_t *spec = json_pack("{s:s, s:{s:s, s:[i], s:i, s:i}, s:{s:s}}", "name", "big", "model", "type", "mlp",
                             "hidden", 8, "n_inputs", 4, "n_classes", 2, "data", "train", "synthetic");
    bool created;
    cr_assert_eq(svc_job_create(S, svc_caller_kilnd(), spec, NULL, &job, &created, &err), 0, "%s", err.message);
    id = strdup(json_string_value(json_object_get(job, "id")));
    json_decref(job);
    json_decref(spec);
    arts = artifacts_when(id, TH_JOB_ENDED, 30000);
    cr_assert_eq(json_array_size(json_object_get(arts, "artifacts")), 0);
    json_decref(arts);
    cr_assert(log_has(id, "[kiln-agent] artifacts not kept: files: the job's artifacts come to more than this "
                          "kilnd's limit of 1 MiB per job (kilnd --artifact-max-job-mb)"));
    free(id);
}

Test(grpc_artifacts, damaged_chunks_and_other_workers_are_refused_over_the_wire)
{
    start_agent("echo x > \"$KILN_OUTPUT_DIR/samples.txt\"; sleep 30\n");
    char *id = submit(NULL);
    char wid[128];
    agent_worker_id(A, wid, sizeof wid);
    /* running: the rank sleeps */
    for (int i = 0; i < 200; i++) {
        json_t *job = NULL;
        kiln_err_t err;
        cr_assert_eq(svc_job_get(S, svc_caller_kilnd(), id, &job, &err), 0);
        bool running = !strcmp(json_string_value(json_object_get(job, "state")), "RUNNING");
        json_decref(job);
        if (running)
            break;
        usleep(50000);
    }
    agent_rpc_t *c = NULL;
    kiln_err_t err;
    cr_assert_eq(agent_rpc_create(addr, NULL, &c, &err), 0, "%s", err.message);
    char sha[KILN_SHA256_HEX];
    kiln_sha256_hex("0123456789", 10, sha);
    Kiln__ArtifactFile f = KILN__ARTIFACT_FILE__INIT, *fp[1] = {&f};
    f.name = "extra.bin";
    f.size = 10;
    f.sha256 = sha;
    Kiln__ArtifactManifest m = KILN__ARTIFACT_MANIFEST__INIT;
    m.worker_id = wid;
    m.job_id = id;
    m.attempt = 1;
    m.n_files = 1;
    m.files = fp;
    ProtobufCMessage *resp = NULL;
    int code = -1;
    cr_assert_eq(agent_rpc_call(c, "/kiln.AgentService/BeginArtifacts", NULL, 0, &m.base,
                                &kiln__artifact_manifest_reply__descriptor, 5000, &resp, &code, &err), 0, "%s",
                 err.message);
    protobuf_c_message_free_unpacked(resp, NULL);
    Kiln__ArtifactChunk ch = KILN__ARTIFACT_CHUNK__INIT;
    ch.worker_id = wid;
    ch.job_id = id;
    ch.attempt = 1;
    ch.name = "extra.bin";
    ch.data.data = (uint8_t *)"0123456789";
    ch.data.len = 10;
    char bad[KILN_SHA256_HEX];
    kiln_sha256_hex("0123456788", 10, bad);
    ch.sha256 = bad;
    cr_assert_neq(agent_rpc_call(c, "/kiln.AgentService/PutArtifactChunk", NULL, 0, &ch.base,
                                 &kiln__artifact_chunk_reply__descriptor, 5000, &resp, &code, &err), 0);
    cr_assert_eq(code, 15, "DATA_LOSS, got %d: %s", code, err.message);
    cr_assert(!kiln_grpc_retryable(code), "the sender handles it (asks the offset, sends again)");
    ch.sha256 = sha;
    ch.offset = 3;
    cr_assert_neq(agent_rpc_call(c, "/kiln.AgentService/PutArtifactChunk", NULL, 0, &ch.base,
                                 &kiln__artifact_chunk_reply__descriptor, 5000, &resp, &code, &err), 0);
    cr_assert_eq(code, 9, "FAILED_PRECONDITION at the wrong offset, got %d", code);
    ch.offset = 0;
    ch.worker_id = "w-somebody-else";
    cr_assert_neq(agent_rpc_call(c, "/kiln.AgentService/PutArtifactChunk", NULL, 0, &ch.base,
                                 &kiln__artifact_chunk_reply__descriptor, 5000, &resp, &code, &err), 0);
    cr_assert_eq(code, 7, "PERMISSION_DENIED for a worker without rank 0, got %d", code);
    ch.worker_id = wid;
    cr_assert_eq(agent_rpc_call(c, "/kiln.AgentService/PutArtifactChunk", NULL, 0, &ch.base,
                                &kiln__artifact_chunk_reply__descriptor, 5000, &resp, &code, &err), 0, "%s",
                 err.message);
    cr_assert(((Kiln__ArtifactChunkReply *)resp)->complete);
    protobuf_c_message_free_unpacked(resp, NULL);
    agent_rpc_destroy(c);
    free(id);
}

Test(grpc_artifacts, a_job_from_another_jobs_model_gets_its_exact_bytes)
{
    start_agent("if [ -n \"$KILN_INIT_MODEL\" ]; then\n"
                "  echo \"init model $(sha256sum < \"$KILN_INIT_MODEL\" | cut -c1-64) at $KILN_INIT_MODEL\"\n"
                "else\n"
                "  head -c 300000 /dev/urandom > \"$KILN_OUTPUT_DIR/model_llmc.bin\"\n"
                "fi\n");
    char *src = submit(NULL);
    json_t *arts = artifacts_when(src, TH_JOB_ENDED, 30000);
    json_t *a = json_array_get(json_object_get(arts, "artifacts"), 0);
    char sha[KILN_SHA256_HEX];
    snprintf(sha, sizeof sha, "%s", json_string_value(json_object_get(a, "sha256")));
    json_decref(arts);
    char ref[64], line[512];
    snprintf(ref, sizeof ref, "job:%s", src);
    char *child = submit(ref);
    json_decref(artifacts_when(child, TH_JOB_ENDED, 30000));
    json_t *job = NULL;
    kiln_err_t err;
    cr_assert_eq(svc_job_get(S, svc_caller_kilnd(), child, &job, &err), 0);
    cr_assert_str_eq(json_string_value(json_object_get(job, "state")), "COMPLETED", "%s",
                     json_string_value(json_object_get(job, "reason")));
    json_decref(job);
    snprintf(line, sizeof line, "init model %s at %s/jobs/%s/init/model_llmc.bin", sha, work, child);
    cr_assert(log_has(child, line), "the rank saw the fetched model (%s)", line);
    free(src);
    free(child);
}
