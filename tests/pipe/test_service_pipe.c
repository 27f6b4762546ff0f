/* test_service_pipe.c - a pipelined job through the whole service: a real kilnd (fresh database in
 * the test cluster tests/run.sh starts), a real kiln-agent with 4 CPU slots, and a job whose
 * distribution.model_parallel asks for 2 partitions on 4 ranks (hybrid 2 x 2) submitted over
 * REST; it must complete, report its metrics, and leave the plan and the model in its output. */
#include "tests/common/harness.h"
#include "tests/pipe/pipe_test.h"
#include "base/base.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

Test(service_pipe, hybrid_pipeline_job_completes_through_kilnd_and_an_agent, .timeout = 180)
{
    char *db = th_pg_create_db("pipe_e2e");
    if (!db)
        cr_skip_test("no test PostgreSQL cluster (run through tests/run.sh)");
    pipe_test_remove_stale_shm();
    char work[64] = "/tmp/kiln-pipe-svc-XXXXXX";
    cr_assert_not_null(mkdtemp(work));
    int http = th_free_port(), grpc = th_free_port();
    char bin[3][PATH_MAX], http_addr[64], grpc_addr[64], dburl[1024], agent_dir[128], logk[128], loga[128];
    snprintf(bin[0], sizeof(bin[0]), "%s/kilnd", th_bin_dir());
    snprintf(bin[1], sizeof(bin[1]), "%s/kiln-agent", th_bin_dir());
    snprintf(bin[2], sizeof(bin[2]), "%s/kiln-train", th_bin_dir());
    for (int i = 0; i < 3; i++)
        cr_assert_eq(access(bin[i], X_OK), 0, "%s not built (set KILN_BIN_DIR)", bin[i]);
    snprintf(http_addr, sizeof(http_addr), "127.0.0.1:%d", http);
    snprintf(grpc_addr, sizeof(grpc_addr), "127.0.0.1:%d", grpc);
    snprintf(dburl, sizeof(dburl), "%s", db);
    snprintf(agent_dir, sizeof(agent_dir), "%s/agent", work);
    snprintf(logk, sizeof(logk), "%s/kilnd.log", work);
    snprintf(loga, sizeof(loga), "%s/agent.log", work);
    char *kargv[] = {bin[0], "--database-url", dburl, "--http-addr", http_addr, "--grpc-addr", grpc_addr, NULL};
    /* Plain text without tokens: this suite is about pipelines (e2e covers security). */
    char *kenv[] = {"KILN_INSECURE=1", "KILN_NO_AUTH=1", NULL};
    pid_t kilnd = th_spawn(kargv, kenv, logk);
    cr_assert_gt(kilnd, 0);
    cr_assert(th_wait_port(http, 20000), "kilnd did not listen");
    char data_root[PATH_MAX];
    snprintf(data_root, sizeof(data_root), "%s/data", getenv("KILN_ROOT") ? getenv("KILN_ROOT") : ".");
    char *aargv[] = {bin[1], "--server", grpc_addr, "--slots", "4", "--slot-type", "cpu", "--work-dir", agent_dir,
                     "--insecure", "--data-root", data_root, NULL};
    char bindir_env[PATH_MAX + 16];
    snprintf(bindir_env, sizeof(bindir_env), "KILN_BIN_DIR=%s", th_bin_dir());
    char roots[PATH_MAX + 200];
    const char *root = getenv("KILN_ROOT");
    snprintf(roots, sizeof(roots), "KILN_DATA_ROOTS=%s/data,%s", root && *root ? root : ".", work);
    /* (the job below reads root/data) */
    char *aenv[] = {bindir_env, "KILN_INSECURE=1", roots, NULL};
    pid_t agent = th_spawn(aargv, aenv, loga);
    cr_assert_gt(agent, 0);

    char url[256], *body = NULL;
    long status = 0;
    snprintf(url, sizeof(url), "http://%s/v1/workers", http_addr);
    for (int i = 0; i < 200; i++) {
        free(body);
        body = NULL;
        if (th_http("GET", url, NULL, NULL, &status, &body, 2000) == 0 && body && strstr(body, "ALIVE"))
            break;
        usleep(50000);
    }
    cr_assert(body && strstr(body, "ALIVE"), "the agent did not register: %s", body ? body : "");
    free(body);

    char data[PATH_MAX];
    snprintf(data, sizeof(data), "%s/data/tinyshakespeare.txt", root ? root : ".");
    char job[PATH_MAX + 2048];
    snprintf(job, sizeof(job),
             "{\"name\": \"pipe-hybrid\", \"model\": {\"type\": \"gpt\", \"n_layer\": 4, \"n_head\": 4, \"n_embd\": 64,"
             " \"seq_len\": 64, \"vocab\": \"bytes\"}, \"data\": {\"train\": \"%s\", \"val_fraction\": 0.1},"
             " \"hyperparameters\": {\"lr\": 3e-3, \"global_batch_size\": 16, \"max_steps\": 20, \"warmup_steps\": 5,"
             " \"eval_batches\": 2, \"sample_tokens\": 0},"
             " \"resources\": {\"nodes\": 1, \"slots_per_node\": 4, \"slot_type\": \"cpu\", \"device\": \"cpu\"},"
             " \"distribution\": {\"model_parallel\": {\"partitions\": 2, \"microbatches\": 4,"
             " \"pipeline\": \"interleaved\"}}}",
             data);
    snprintf(url, sizeof(url), "http://%s/v1/jobs", http_addr);
    const char *hdr[] = {"Content-Type: application/json", NULL};
    cr_assert_eq(th_http("POST", url, job, hdr, &status, &body, 10000), 0);
    cr_assert_eq(status, 201, "submit: %ld %s", status, body);
    json_t *j = json_loads(body, 0, NULL);
    cr_assert_not_null(j);
    char id[64];
    snprintf(id, sizeof(id), "%s", json_string_value(json_object_get(j, "id")));
    json_decref(j);
    free(body);

    snprintf(url, sizeof(url), "http://%s/v1/jobs/%s", http_addr, id);
    char *final = th_wait_json_state(url, TH_JOB_ENDED, 150000);
    cr_assert_not_null(final, "the job did not finish");
    j = json_loads(final, 0, NULL);
    const char *state = json_string_value(json_object_get(j, "state"));
    char logs_url[256];
    snprintf(logs_url, sizeof(logs_url), "http://%s/v1/jobs/%s/logs?limit=400", http_addr, id);
    char *logs = NULL;
    th_http("GET", logs_url, NULL, NULL, &status, &logs, 10000);
    cr_assert_str_eq(state, "COMPLETED", "job ended %s: %s\nlogs: %s", state, final, logs ? logs : "");
    cr_assert(strstr(logs, "pipeline: automatic plan, 2 stages x 2 replicas"), "%s", logs);
    /* the plan itself is stored with the job's logs, one line of JSON */
    cr_assert(strstr(logs, "pipeline: plan {\\\"version\\\":1"), "%s", logs);
    cr_assert(strstr(logs, "step 20/20 | loss"), "%s", logs);
    json_t *metrics = json_object_get(j, "metrics");
    cr_assert_not_null(json_object_get(metrics, "train_loss"), "%s", final);
    cr_assert_not_null(json_object_get(metrics, "val_loss"), "%s", final);
    struct stat sb;
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/jobs/%s/output/partition_plan.json", agent_dir, id);
    cr_assert_eq(stat(path, &sb), 0, "no %s", path);
    snprintf(path, sizeof(path), "%s/jobs/%s/output/model_llmc.bin", agent_dir, id);
    cr_assert_eq(stat(path, &sb), 0, "no %s", path);
    json_decref(j);
    free(final);
    free(logs);
    th_stop(agent, SIGTERM, 5000);
    th_stop(kilnd, SIGTERM, 5000);
    cr_assert(th_rm_tree(work), "could not remove %s", work);
    free(db);
}
