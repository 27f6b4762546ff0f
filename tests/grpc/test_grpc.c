/* test_grpc.c - kilnd's AgentService over real gRPC: an in-process kilnd (service on a fresh
 * database + the gRPC server on a free port) driven by the agent's own gRPC client, by a whole
 * in-process agent running fake ranks (shell scripts), and by Python's grpcio as a foreign
 * client (among others, a tuning job's round trip: Create, Get, List, Stop). Needs the PostgreSQL
 * cluster of tests/run.sh. */
#include "tests/grpc/grpc_test.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/tuning_states.h"

#define M_REGISTER "/kiln.AgentService/RegisterWorker"
#define M_HEARTBEAT "/kiln.AgentService/Heartbeat"
#define M_LOGS "/kiln.AgentService/PushLogs"
#define M_METRICS "/kiln.AgentService/PushMetrics"

static gt_kilnd_t K;
static svc_t *S;
static agent_rpc_t *C;
static const char *const addr = K.addr, *const dir = K.dir;

static void setup(void)
{
    /* These tests are about the protocol; authentication has its own suite (test_grpc_auth.c). */
    gt_start(&K, &(gt_opts_t){.name = "grpc", .rpc = true, .svc = {.sched_interval_ms = 100, .auth_disabled = true}});
    S = K.svc;
    C = K.rpc;
}

static void teardown(void)
{
    gt_stop(&K);
}

TestSuite(grpc, .init = setup, .fini = teardown, .timeout = 60);

static char *register_worker(const char *host, int slots)
{
    Kiln__RegisterRequest req = KILN__REGISTER_REQUEST__INIT;
    req.hostname = (char *)host;
    req.address = (char *)"127.0.0.1";
    req.slots = slots;
    req.slot_type = (char *)"cpu";
    req.version = (char *)"test";
    req.cpu_cores = 2;
    ProtobufCMessage *resp = NULL;
    int code = -1;
    kiln_err_t err;
    cr_assert_eq(agent_rpc_call(C, M_REGISTER, NULL, 0, &req.base, &kiln__register_response__descriptor, 5000, &resp,
                                 &code, &err), 0, "%s", err.message);
    Kiln__RegisterResponse *r = (Kiln__RegisterResponse *)resp;
    cr_assert(r->worker_id && r->worker_id[0]);
    cr_assert_eq(r->heartbeat_interval_ms, 200);
    cr_assert_gt(r->heartbeat_timeout_ms, 0);
    char *id = strdup(r->worker_id);
    protobuf_c_message_free_unpacked(resp, NULL);
    return id;
}

static Kiln__HeartbeatResponse *heartbeat(const char *id)
{
    Kiln__HeartbeatRequest req = KILN__HEARTBEAT_REQUEST__INIT;
    req.worker_id = (char *)id;
    ProtobufCMessage *resp = NULL;
    kiln_err_t err;
    cr_assert_eq(agent_rpc_call(C, M_HEARTBEAT, NULL, 0, &req.base, &kiln__heartbeat_response__descriptor, 5000, &resp,
                                 NULL, &err), 0, "%s", err.message);
    return (Kiln__HeartbeatResponse *)resp;
}

Test(grpc, register_and_heartbeat)
{
    char *id = register_worker("host-a", 2);
    Kiln__HeartbeatResponse *hb = heartbeat(id);
    cr_assert_not(hb->reregister);
    cr_assert_eq(hb->n_assignments, 0);
    protobuf_c_message_free_unpacked(&hb->base, NULL);
    hb = heartbeat("w-nobody-knows");
    cr_assert(hb->reregister, "an unknown worker is told to register again");
    protobuf_c_message_free_unpacked(&hb->base, NULL);

    json_t *workers = NULL;
    kiln_err_t err;
    cr_assert_eq(svc_workers_list(S, svc_caller_kilnd(), &workers, &err), 0, "%s", err.message);
    json_t *arr = json_object_get(workers, "workers");
    cr_assert_eq(json_array_size(arr), 1);
    json_t *w = json_array_get(arr, 0);
    cr_assert_str_eq(json_string_value(json_object_get(w, "id")), id);
    cr_assert_str_eq(json_string_value(json_object_get(w, "hostname")), "host-a");
    cr_assert_eq(json_integer_value(json_object_get(w, "slots")), 2);
    json_decref(workers);
    free(id);
}

Test(grpc, unknown_method_is_unimplemented_not_a_hang)
{
    const char *methods[] = {"/kiln.AgentService/NoSuchThing", "/other.Service/Call"};
    for (size_t i = 0; i < 2; i++) {
        uint8_t *out = NULL;
        size_t len = 0;
        int code = -1;
        kiln_err_t err;
        int64_t t0 = kiln_mono_us();
        int rc = agent_rpc_call_raw(C, methods[i], NULL, 0, "", 0, 20000, &out, &len, &code, &err);
        free(out);
        cr_assert_eq(rc, KILN_EUNSUPP);
        cr_assert_eq(code, 12, "UNIMPLEMENTED, got %d (%s)", code, err.message);
        /* a call left to its deadline would end DEADLINE_EXCEEDED at 20 s; half of it is an answer */
        cr_assert_lt(kiln_mono_us() - t0, 10000000, "answered, not left to the deadline");
    }
}

Test(grpc, malformed_request_is_invalid_argument)
{
    const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f};
    uint8_t *out = NULL;
    size_t len = 0;
    int code = -1;
    kiln_err_t err;
    int rc = agent_rpc_call_raw(C, M_HEARTBEAT, NULL, 0, junk, sizeof(junk), 5000, &out, &len, &code, &err);
    free(out);
    cr_assert_eq(rc, KILN_EINVAL, "rc %d, gRPC code %d: %s", rc, code, err.message);
    cr_assert_eq(code, 3, "INVALID_ARGUMENT, got %d", code);
    cr_assert(strstr(err.message, "HeartbeatRequest"), "%s", err.message);
    /* the server is fine afterwards */
    char *id = register_worker("host-b", 1);
    free(id);
}

Test(grpc, a_second_server_on_a_busy_address_fails)
{
    api_grpc_t *g2 = NULL;
    kiln_err_t err;
    cr_assert_eq(api_grpc_start(S, addr, NULL, &g2, &err), KILN_EIO);
    cr_assert_null(g2);
    cr_assert(strstr(err.message, addr), "%s", err.message);
    cr_assert_eq(api_grpc_start(S, "not an address", NULL, &g2, &err), KILN_EIO);
    char *id = register_worker("host-e", 1); /* the first server is unharmed */
    free(id);
}

typedef struct hb_arg {
    const char *id;
    int ok;
} hb_arg_t;

/* One heartbeat of worker id; whether it was answered. */
static bool hb_once(const char *id, int timeout_ms)
{
    Kiln__HeartbeatRequest req = KILN__HEARTBEAT_REQUEST__INIT;
    req.worker_id = (char *)id;
    ProtobufCMessage *resp = NULL;
    kiln_err_t err;
    if (agent_rpc_call(C, M_HEARTBEAT, NULL, 0, &req.base, &kiln__heartbeat_response__descriptor, timeout_ms, &resp,
                       NULL, &err) != 0)
        return false;
    protobuf_c_message_free_unpacked(resp, NULL);
    return true;
}

static void *hb_loop(void *p)
{
    hb_arg_t *a = p;
    for (int i = 0; i < 150; i++)
        a->ok += hb_once(a->id, 10000);
    return NULL;
}

Test(grpc, concurrent_calls_all_answered)
{
    char *id = register_worker("host-c", 1);
    pthread_t t[4];
    hb_arg_t args[4];
    int64_t t0 = kiln_mono_us();
    for (int i = 0; i < 4; i++) {
        args[i] = (hb_arg_t){id, 0};
        pthread_create(&t[i], NULL, hb_loop, &args[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    double s = (double)(kiln_mono_us() - t0) / 1e6;
    for (int i = 0; i < 4; i++)
        cr_assert_eq(args[i].ok, 150);
    fprintf(stderr, "grpc: 600 heartbeats from 4 threads in %.2f s (%.0f/s)\n", s, 600 / s);
    free(id);
}

/* Heartbeats in a loop until told to stop, counting those answered and those not. */
typedef struct hb_traffic {
    const char *id;
    atomic_int ok, failed;
    atomic_bool stop;
} hb_traffic_t;

static void *hb_until_stopped(void *p)
{
    hb_traffic_t *a = p;
    while (!atomic_load(&a->stop)) {
        if (hb_once(a->id, 2000)) {
            atomic_fetch_add(&a->ok, 1);
        } else {
            atomic_fetch_add(&a->failed, 1);
            usleep(10000);
        }
    }
    return NULL;
}

Test(grpc, stopping_the_server_mid_traffic_is_clean_and_it_can_start_again)
{
    char *id = register_worker("host-d", 1);
    pthread_t t[4];
    hb_traffic_t traffic = {.id = id};
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, hb_until_stopped, &traffic);
    /* stop the server once calls flow, with calls in flight and requests armed */
    for (int64_t end = kiln_mono_us() + 20000000; atomic_load(&traffic.ok) < 40 && kiln_mono_us() < end;)
        usleep(1000);
    cr_assert_geq(atomic_load(&traffic.ok), 40, "calls were answered before the stop");
    gt_grpc_stop(&K);
    /* the calls after the stop fail, and none hangs */
    for (int64_t end = kiln_mono_us() + 20000000; atomic_load(&traffic.failed) < 8 && kiln_mono_us() < end;)
        usleep(1000);
    atomic_store(&traffic.stop, true);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    cr_assert_geq(atomic_load(&traffic.failed), 8, "calls after the stop were refused");
    gt_grpc_start(&K);
    /* the channel reconnects on its own (fail-fast calls fail until it has) */
    int code = -1;
    for (int i = 0; i < 100 && code != 0; i++) {
        Kiln__HeartbeatRequest req = KILN__HEARTBEAT_REQUEST__INIT;
        req.worker_id = id;
        ProtobufCMessage *resp = NULL;
        kiln_err_t err;
        if (agent_rpc_call(C, M_HEARTBEAT, NULL, 0, &req.base, &kiln__heartbeat_response__descriptor, 2000, &resp, &code,
                            &err) == 0) {
            cr_assert_not(((Kiln__HeartbeatResponse *)resp)->reregister);
            protobuf_c_message_free_unpacked(resp, NULL);
        } else {
            cr_assert_eq(code, 14, "only UNAVAILABLE while reconnecting, got %d", code);
            usleep(50000);
        }
    }
    cr_assert_eq(code, 0, "the restarted server answers");
    free(id);
}

/* ---- jobs through a real agent ------------------------------------------------------------- */

static const char *k_spec =
    "{\"name\":\"grpc-test\",\"model\":{\"type\":\"mlp\",\"hidden\":[8],\"n_inputs\":4,\"n_classes\":2},"
    "\"data\":{\"train\":\"synthetic\"},\"hyperparameters\":{\"lr\":0.01,\"global_batch_size\":8,\"max_steps\":3},"
    "\"resources\":{\"nodes\":1,\"slots_per_node\":1,\"slot_type\":\"cpu\"},"
    "\"metric_definitions\":[{\"name\":\"val_loss\",\"regex\":\"val loss ([0-9.]+)\"}]}";

/* The suite's rank program. */
static char *write_script(const char *body)
{
    return gt_rank_script(&K, body);
}

static agent_t *start_agent(const char *bin)
{
    char work[200];
    snprintf(work, sizeof(work), "%s/work", dir);
    return gt_agent_start(&K, (agent_config_t){.work_dir = work, .train_bin = bin, .cores = 2});
}

/* Submits k_spec with `ranks` slots on one node. */
static char *submit_ranks(int ranks)
{
    json_t *spec = json_loads(k_spec, 0, NULL);
    json_object_set_new(json_object_get(spec, "resources"), "slots_per_node", json_integer(ranks));
    json_object_set_new(json_object_get(spec, "hyperparameters"), "global_batch_size", json_integer(8 * ranks));
    json_t *job = NULL;
    bool created = false;
    kiln_err_t err;
    cr_assert_eq(svc_job_create(S, svc_caller_kilnd(), spec, NULL, &job, &created, &err), 0, "%s (%s)", err.message, err.field);
    char *id = strdup(json_string_value(json_object_get(job, "id")));
    json_decref(spec);
    json_decref(job);
    return id;
}

static char *submit(void)
{
    return submit_ranks(1);
}

/* Waits for one of the '|'-separated states; returns the job (caller decrefs). */
static json_t *wait_state(const char *id, const char *states, int timeout_ms)
{
    json_t *job = NULL;
    for (int waited = 0; waited <= timeout_ms; waited += 50) {
        kiln_err_t err;
        json_decref(job);
        job = NULL;
        cr_assert_eq(svc_job_get(S, svc_caller_kilnd(), id, &job, &err), 0, "%s", err.message);
        if (th_state_in(json_string_value(json_object_get(job, "state")), states))
            return job;
        usleep(50000);
    }
    char *text = json_dumps(job, 0);
    cr_assert_fail("job %s never reached %s: %s", id, states, text);
    return NULL;
}

static bool has_line(json_t *logs, int rank, const char *stream, const char *text)
{
    size_t i;
    json_t *l;
    json_array_foreach(json_object_get(logs, "lines"), i, l) {
        if (json_integer_value(json_object_get(l, "rank")) == rank &&
            !strcmp(json_string_value(json_object_get(l, "stream")), stream) &&
            !strcmp(json_string_value(json_object_get(l, "line")), text))
            return true;
    }
    return false;
}

static json_t *job_logs(const char *id)
{
    svc_log_query_t q = {.rank = -1};
    json_t *logs = NULL;
    kiln_err_t err;
    cr_assert_eq(svc_job_logs(S, svc_caller_kilnd(), id, &q, &logs, &err), 0, "%s", err.message);
    return logs;
}

static json_t *series(json_t *metrics, const char *name)
{
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(metrics, "metrics"), i, s)
        if (!strcmp(json_string_value(json_object_get(s, "name")), name))
            return json_object_get(s, "points");
    return NULL;
}

Test(grpc, agent_runs_a_job_and_its_logs_and_metrics_reach_the_service)
{
    char *bin = write_script(
        "echo \"hello from rank $KILN_RANK of $KILN_WORLD_SIZE\"\n"
        "for s in 1 2 3; do\n"
        "  echo \"{\\\"step\\\": $s, \\\"metrics\\\": {\\\"train_loss\\\": 2.$s, \\\"step_time_ms\\\": 10}}\" >&$KILN_METRICS_FD\n"
        "done\n"
        "sleep 0.1\n"
        "echo 'val loss 0.5'\n"
        "echo 'a warning' >&2\n"
        "exit 0\n");
    agent_t *agent = start_agent(bin);
    char *id = submit();
    json_t *job = wait_state(id, TH_JOB_ENDED, 20000);
    cr_assert_str_eq(json_string_value(json_object_get(job, "state")), "COMPLETED", "%s",
                     json_string_value(json_object_get(job, "reason")));
    json_decref(job);
    json_t *logs = job_logs(id);
    cr_assert(has_line(logs, 0, "stdout", "hello from rank 0 of 1"));
    cr_assert(has_line(logs, 0, "stdout", "val loss 0.5"));
    cr_assert(has_line(logs, 0, "stderr", "a warning"));
    json_decref(logs);
    json_t *metrics = NULL;
    kiln_err_t err;
    cr_assert_eq(svc_job_metrics(S, svc_caller_kilnd(), id, &(svc_metrics_query_t){.name = NULL}, &metrics, &err), 0, "%s", err.message);
    json_t *loss = series(metrics, "train_loss");
    cr_assert_eq(json_array_size(loss), 3);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(loss, 2), "step")), 3);
    cr_assert_float_eq(json_number_value(json_object_get(json_array_get(loss, 2), "value")), 2.3, 1e-9);
    json_t *val = series(metrics, "val_loss");
    cr_assert_eq(json_array_size(val), 1, "the metric definition matched the log line");
    /* a script that neither marks its steps nor captures one: the definition's first match */
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(val, 0), "step")), 1);
    json_decref(metrics);
    agent_destroy(agent);
    free(id);
}

Test(grpc, a_failing_rank_fails_the_job_with_its_last_stderr_line)
{
    char *bin = write_script("echo 'loading'\necho 'error: data file is corrupt' >&2\nexit 2\n");
    agent_t *agent = start_agent(bin);
    char *id = submit();
    json_t *job = wait_state(id, TH_JOB_ENDED, 20000);
    cr_assert_str_eq(json_string_value(json_object_get(job, "state")), "FAILED");
    const char *reason = json_string_value(json_object_get(job, "reason"));
    cr_assert(reason && strstr(reason, "data file is corrupt"), "reason: %s", reason);
    json_decref(job);
    agent_destroy(agent);
    free(id);
}

Test(grpc, stopping_a_job_sigterms_its_rank)
{
    char *bin = write_script("trap 'echo checkpoint-on-term; exit 143' TERM\necho up\nwhile :; do sleep 0.05; done\n");
    agent_t *agent = start_agent(bin);
    char *id = submit();
    json_decref(wait_state(id, "RUNNING", 20000));
    json_t *job = NULL;
    kiln_err_t err;
    cr_assert_eq(svc_job_stop(S, svc_caller_kilnd(), id, "test stop", &job, &err), 0, "%s", err.message);
    json_decref(job);
    job = wait_state(id, TH_JOB_ENDED, 20000);
    cr_assert_str_eq(json_string_value(json_object_get(job, "state")), "STOPPED");
    json_decref(job);
    json_t *logs = job_logs(id);
    cr_assert(has_line(logs, 0, "stdout", "checkpoint-on-term"));
    json_decref(logs);
    agent_destroy(agent);
    free(id);
}

/* A rank that waits for the test's word. The sandbox gives a rank a /tmp of its own, so the word is
 * a file in the job's checkpoint directory (the output directory's files would be artifacts). */
#define WAIT_FOR_GO "while [ ! -e \"$KILN_CHECKPOINT_DIR/go\" ]; do sleep 0.05; done\n"

static void go_path(const char *id, char *out, size_t n)
{
    snprintf(out, n, "%s/work/jobs/%s/checkpoints/go", dir, id);
}

Test(grpc, output_written_while_kilnd_is_unreachable_is_delivered_later)
{
    char *bin = write_script("echo before\n" WAIT_FOR_GO
                             "i=0; while [ $i -lt 50 ]; do echo \"during $i\"; i=$((i+1)); done\n"
                             "echo '{\"step\": 7, \"metrics\": {\"train_loss\": 1.5}}' >&$KILN_METRICS_FD\nexit 0\n");
    agent_t *agent = start_agent(bin);
    char *id = submit();
    json_decref(wait_state(id, "RUNNING", 20000));
    char go[400];
    go_path(id, go, sizeof(go));
    /* kilnd's gRPC side goes away; the rank writes and exits meanwhile */
    gt_grpc_stop(&K);
    FILE *f = fopen(go, "w");
    fclose(f);
    usleep(1500000);
    json_t *job = NULL;
    kiln_err_t err;
    cr_assert_eq(svc_job_get(S, svc_caller_kilnd(), id, &job, &err), 0);
    cr_assert_str_eq(json_string_value(json_object_get(job, "state")), "RUNNING", "no exit can arrive yet");
    json_decref(job);
    gt_grpc_start(&K);
    job = wait_state(id, TH_JOB_ENDED, 20000);
    cr_assert_str_eq(json_string_value(json_object_get(job, "state")), "COMPLETED", "%s",
                     json_string_value(json_object_get(job, "reason")));
    json_decref(job);
    json_t *logs = job_logs(id);
    cr_assert(has_line(logs, 0, "stdout", "before"));
    for (int i = 0; i < 50; i++) {
        char want[32];
        snprintf(want, sizeof(want), "during %d", i);
        cr_assert(has_line(logs, 0, "stdout", want), "%s was kept and resent", want);
    }
    json_decref(logs);
    json_t *metrics = NULL;
    cr_assert_eq(svc_job_metrics(S, svc_caller_kilnd(), id, &(svc_metrics_query_t){.name = "train_loss"}, &metrics, &err), 0);
    cr_assert_eq(json_array_size(series(metrics, "train_loss")), 1);
    json_decref(metrics);
    agent_destroy(agent);
    free(id);
}

Test(grpc, pushed_logs_and_metrics_read_back_exactly)
{
    /* a worker may push only for the ranks kilnd assigned to it: give it all three */
    char *wid = register_worker("host-p", 3);
    char *id = submit_ranks(3);
    json_decref(wait_state(id, "SCHEDULED|STARTING|RUNNING", 10000));
    /* 3 lines, then a batch over gRPC's default 4 MiB message limit (both sides allow 16) */
    Kiln__LogLine l[3];
    Kiln__LogLine *lp[3];
    const char *text[3] = {"alpha", "beta \xc3\xa9", "gamma"};
    for (int i = 0; i < 3; i++) {
        kiln__log_line__init(&l[i]);
        l[i].rank = i;
        l[i].time_us = 1795000000000000LL + i * 1000;
        l[i].stream = (char *)(i == 1 ? "stderr" : "stdout");
        l[i].line = (char *)text[i];
        lp[i] = &l[i];
    }
    Kiln__LogBatch lb = KILN__LOG_BATCH__INIT;
    lb.worker_id = wid;
    lb.job_id = id;
    lb.attempt = 1;
    lb.n_lines = 3;
    lb.lines = lp;
    ProtobufCMessage *resp = NULL;
    int code = -1;
    kiln_err_t err;
    cr_assert_eq(agent_rpc_call(C, M_LOGS, NULL, 0, &lb.base, &kiln__ack__descriptor, 10000, &resp, &code, &err), 0,
                 "%d %s", code, err.message);
    cr_assert(((Kiln__Ack *)resp)->ok);
    protobuf_c_message_free_unpacked(resp, NULL);

    enum { BIG = 600 };
    static char bigtext[10001];
    memset(bigtext, 'z', 10000);
    Kiln__LogLine *bl = calloc(BIG, sizeof(*bl));
    Kiln__LogLine **blp = calloc(BIG, sizeof(*blp));
    for (int i = 0; i < BIG; i++) {
        kiln__log_line__init(&bl[i]);
        bl[i].rank = 0;
        bl[i].time_us = 1795000001000000LL + i;
        bl[i].stream = (char *)"stdout";
        bl[i].line = bigtext;
        blp[i] = &bl[i];
    }
    lb.n_lines = BIG;
    lb.lines = blp;
    cr_assert_gt(protobuf_c_message_get_packed_size(&lb.base), (size_t)(5 << 20));
    cr_assert_eq(agent_rpc_call(C, M_LOGS, NULL, 0, &lb.base, &kiln__ack__descriptor, 20000, &resp, &code, &err), 0,
                 "a 6 MiB batch: %d %s", code, err.message);
    protobuf_c_message_free_unpacked(resp, NULL);
    free(bl);
    free(blp);

    Kiln__MetricPoint mp[2];
    Kiln__MetricPoint *mpp[2] = {&mp[0], &mp[1]};
    for (int i = 0; i < 2; i++) {
        kiln__metric_point__init(&mp[i]);
        mp[i].rank = 0;
        mp[i].name = (char *)"train_loss";
        mp[i].step = i + 1;
        mp[i].value = 3.0 - i;
        mp[i].time_us = 1795000000000000LL + i;
    }
    Kiln__MetricBatch mb = KILN__METRIC_BATCH__INIT;
    mb.worker_id = wid;
    mb.job_id = id;
    mb.attempt = 1;
    mb.n_points = 2;
    mb.points = mpp;
    cr_assert_eq(agent_rpc_call(C, M_METRICS, NULL, 0, &mb.base, &kiln__ack__descriptor, 10000, &resp, &code, &err), 0,
                 "%d %s", code, err.message);
    protobuf_c_message_free_unpacked(resp, NULL);

    svc_log_query_t q = {.rank = -1, .limit = 10};
    json_t *logs = NULL;
    cr_assert_eq(svc_job_logs(S, svc_caller_kilnd(), id, &q, &logs, &err), 0, "%s", err.message);
    json_t *lines = json_object_get(logs, "lines");
    cr_assert_eq(json_array_size(lines), 10);
    for (int i = 0; i < 3; i++) {
        json_t *x = json_array_get(lines, (size_t)i);
        cr_assert_str_eq(json_string_value(json_object_get(x, "line")), text[i]);
        cr_assert_eq(json_integer_value(json_object_get(x, "rank")), i);
        cr_assert_str_eq(json_string_value(json_object_get(x, "stream")), i == 1 ? "stderr" : "stdout");
    }
    cr_assert_eq(strlen(json_string_value(json_object_get(json_array_get(lines, 3), "line"))), 10000);
    json_decref(logs);
    json_t *metrics = NULL;
    cr_assert_eq(svc_job_metrics(S, svc_caller_kilnd(), id, &(svc_metrics_query_t){.name = "train_loss"}, &metrics, &err), 0, "%s", err.message);
    json_t *pts = series(metrics, "train_loss");
    cr_assert_eq(json_array_size(pts), 2);
    cr_assert_float_eq(json_number_value(json_object_get(json_array_get(pts, 1), "value")), 2.0, 1e-12);
    json_decref(metrics);

    /* reports for a job that does not exist are rejected, not stored */
    lb.job_id = (char *)"not-a-job";
    lb.n_lines = 3;
    lb.lines = lp;
    cr_assert_neq(agent_rpc_call(C, M_LOGS, NULL, 0, &lb.base, &kiln__ack__descriptor, 10000, &resp, &code, &err), 0);
    cr_assert_eq(code, 5, "NOT_FOUND, got %d", code);
    free(id);
    free(wid);
}

Test(grpc, agent_registers_again_when_kilnd_forgot_it)
{
    char *bin = write_script("exit 0\n");
    agent_t *agent = start_agent(bin);
    char before[128];
    agent_worker_id(agent, before, sizeof(before));
    /* a kilnd with an empty database takes over the address */
    gt_restart(&K, "grpc2");
    S = K.svc;
    kiln_err_t err;
    json_t *workers = NULL;
    size_t n = 0;
    for (int i = 0; i < 100 && n == 0; i++) {
        json_decref(workers);
        workers = NULL;
        cr_assert_eq(svc_workers_list(S, svc_caller_kilnd(), &workers, &err), 0, "%s", err.message);
        n = json_array_size(json_object_get(workers, "workers"));
        if (n == 0)
            usleep(100000);
    }
    cr_assert_eq(n, 1, "the agent registered with the new kilnd");
    const char *now = json_string_value(json_object_get(json_array_get(json_object_get(workers, "workers"), 0), "id"));
    cr_assert_str_eq(now, before, "under the id it had");
    json_decref(workers);
    /* and it takes work there */
    char *id = submit();
    json_t *job = wait_state(id, TH_JOB_ENDED, 20000);
    cr_assert_str_eq(json_string_value(json_object_get(job, "state")), "COMPLETED");
    json_decref(job);
    agent_destroy(agent);
    free(id);
}

/* ---- a foreign client: Python's grpcio with protoc's Python messages ----------------------- */

/* Writes a grpcio script, body after the lines that import grpc and kiln_pb2 (as pb) from this
 * suite's directory and open `ch`, a plain-text channel to its server, to dir/name; cmd gets
 * "/usr/bin/python3 SCRIPT DIR ADDR" (the script's own arguments follow: sys.argv[3], ...). */
static void py_script(const char *name, const char *body, char *cmd, size_t n)
{
    static const char preamble[] = "import sys\n"
                                   "sys.path.insert(0, sys.argv[1])\n"
                                   "import grpc, kiln_pb2 as pb\n"
                                   "ch = grpc.insecure_channel(sys.argv[2])\n";
    char script[200];
    snprintf(script, sizeof(script), "%s/%s", dir, name);
    FILE *f = fopen(script, "w");
    cr_assert_not_null(f, "could not write %s", script);
    fputs(preamble, f);
    fputs(body, f);
    fclose(f);
    snprintf(cmd, n, "/usr/bin/python3 %s %s %s", script, dir, addr);
}

static const char *k_py =
    "def call(path, req, resp):\n"
    "    return ch.unary_unary(path, request_serializer=req.SerializeToString,\n"
    "                          response_deserializer=resp.FromString)\n"
    "reg = ch.unary_unary('/kiln.AgentService/RegisterWorker', request_serializer=pb.RegisterRequest.SerializeToString,\n"
    "                     response_deserializer=pb.RegisterResponse.FromString)\n"
    "r = reg(pb.RegisterRequest(hostname='py-host', address='127.0.0.1', slots=3, slot_type='cpu', version='py'), timeout=10)\n"
    "print('registered', bool(r.worker_id), r.heartbeat_interval_ms)\n"
    "hb = ch.unary_unary('/kiln.AgentService/Heartbeat', request_serializer=pb.HeartbeatRequest.SerializeToString,\n"
    "                    response_deserializer=pb.HeartbeatResponse.FromString)\n"
    "h = hb(pb.HeartbeatRequest(worker_id=r.worker_id), timeout=10)\n"
    "print('heartbeat reregister', h.reregister)\n"
    "h = hb(pb.HeartbeatRequest(worker_id='nobody'), timeout=10)\n"
    "print('unknown reregister', h.reregister)\n"
    "try:\n"
    "    ch.unary_unary('/kiln.AgentService/Nope')(b'', timeout=10)\n"
    "except grpc.RpcError as e:\n"
    "    print('nope', e.code().name)\n"
    "try:\n"
    "    ch.unary_unary('/kiln.AgentService/Heartbeat')(b'\\xff\\xff\\xff', timeout=10)\n"
    "except grpc.RpcError as e:\n"
    "    print('junk', e.code().name)\n";

static char *run_capture(const char *cmd)
{
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof(buf) - 1, p);
    buf[n] = '\0';
    int st = pclose(p);
    cr_assert_eq(st, 0, "%s failed:\n%s", cmd, buf);
    return buf;
}

Test(grpc, python_grpcio_is_a_foreign_client)
{
    gt_python_ready(dir);
    char py[512], cmd[1024];
    py_script("client.py", k_py, py, sizeof(py));
    snprintf(cmd, sizeof(cmd), "%s 2>&1", py);
    char *out = run_capture(cmd);
    cr_assert(strstr(out, "registered True 200\n"), "%s", out);
    cr_assert(strstr(out, "heartbeat reregister False\n"), "%s", out);
    cr_assert(strstr(out, "unknown reregister True\n"), "%s", out);
    cr_assert(strstr(out, "nope UNIMPLEMENTED\n"), "%s", out);
    cr_assert(strstr(out, "junk INVALID_ARGUMENT\n"), "%s", out);
}

/* ---- TrainingService ------------------------------------------------------------------------ */

static ProtobufCMessage *tcall(const char *method, const ProtobufCMessage *req,
                               const ProtobufCMessageDescriptor *resp_desc, int *code, kiln_err_t *err)
{
    ProtobufCMessage *resp = NULL;
    char path[128];
    snprintf(path, sizeof(path), "/kiln.TrainingService/%s", method);
    *code = -1;
    agent_rpc_call(C, path, NULL, 0, req, resp_desc, 10000, &resp, code, err);
    return resp;
}

Test(grpc, training_service_jobs_round_trip)
{
    char *wid = register_worker("host-t", 2);
    Kiln__ModelSpec model = KILN__MODEL_SPEC__INIT;
    model.type = (char *)"mlp";
    int32_t hidden[] = {8};
    model.hidden = hidden;
    model.n_hidden = 1;
    Google__Protobuf__Int32Value n_inputs = GOOGLE__PROTOBUF__INT32_VALUE__INIT, n_classes = n_inputs,
                                 gbs = n_inputs, nodes = n_inputs, spn = n_inputs, clip_steps = n_inputs;
    Google__Protobuf__Int64Value max_steps = GOOGLE__PROTOBUF__INT64_VALUE__INIT;
    Google__Protobuf__DoubleValue lr = GOOGLE__PROTOBUF__DOUBLE_VALUE__INIT, grad_clip = lr;
    n_inputs.value = 4;
    n_classes.value = 2;
    model.n_inputs = &n_inputs;
    model.n_classes = &n_classes;
    Kiln__DataSpec data = KILN__DATA_SPEC__INIT;
    data.train = (char *)"synthetic";
    Kiln__Hyperparameters hp = KILN__HYPERPARAMETERS__INIT;
    lr.value = 0.01;
    hp.lr = &lr;
    gbs.value = 8;
    hp.global_batch_size = &gbs;
    max_steps.value = 5;
    hp.max_steps = &max_steps;
    /* an explicit zero is honoured: clipping off, no warm-up (the defaults are 1.0 and 0) */
    grad_clip.value = 0;
    hp.grad_clip = &grad_clip;
    clip_steps.value = 0;
    hp.warmup_steps = &clip_steps;
    Kiln__Resources res = KILN__RESOURCES__INIT;
    nodes.value = 1;
    res.nodes = &nodes;
    spn.value = 2;
    res.slots_per_node = &spn;
    res.slot_type = (char *)"cpu";
    Kiln__DataParallel dp = KILN__DATA_PARALLEL__INIT;
    dp.gradient_dtype = (char *)"bf16";
    Kiln__Distribution dist = KILN__DISTRIBUTION__INIT;
    dist.data_parallel = &dp;
    Kiln__JobSpec__TagsEntry tag = KILN__JOB_SPEC__TAGS_ENTRY__INIT;
    tag.key = (char *)"team";
    tag.value = (char *)"nlp";
    Kiln__JobSpec__TagsEntry *tags[] = {&tag};
    Kiln__JobSpec spec = KILN__JOB_SPEC__INIT;
    spec.name = (char *)"via-grpc";
    spec.model = &model;
    spec.data = &data;
    spec.hyperparameters = &hp;
    spec.resources = &res;
    spec.distribution = &dist;
    spec.tags = tags;
    spec.n_tags = 1;
    Kiln__CreateJobRequest creq = KILN__CREATE_JOB_REQUEST__INIT;
    creq.spec = &spec;
    creq.idempotency_key = (char *)"key-1";
    int code;
    kiln_err_t err;
    Kiln__Job *job = (Kiln__Job *)tcall("CreateJob", &creq.base, &kiln__job__descriptor, &code, &err);
    cr_assert_not_null(job, "CreateJob: %d %s", code, err.message);
    cr_assert(job->id && job->id[0]);
    cr_assert_str_eq(job->name, "via-grpc");
    cr_assert_not_null(job->spec);
    cr_assert_eq(job->spec->resources->slots_per_node->value, 2);
    cr_assert_eq(job->spec->hyperparameters->max_steps->value, 5);
    cr_assert_float_eq(job->spec->hyperparameters->beta1->value, 0.9, 1e-12, "defaults are filled in");
    cr_assert_not_null(job->spec->hyperparameters->grad_clip, "an explicit zero comes back set");
    cr_assert_float_eq(job->spec->hyperparameters->grad_clip->value, 0, 1e-12, "grad_clip = 0 was honoured");
    cr_assert_float_eq(job->spec->hyperparameters->temperature->value, 1.0, 1e-12);
    cr_assert_eq(job->spec->n_tags, 1);
    cr_assert_str_eq(job->spec->tags[0]->value, "nlp");
    cr_assert_str_eq(job->spec->distribution->data_parallel->gradient_dtype, "bf16");
    cr_assert(job->state >= KILN__JOB_STATE__JOB_STATE_QUEUED);
    cr_assert(job->created_at && job->created_at[0]);
    char *id = strdup(job->id);
    protobuf_c_message_free_unpacked(&job->base, NULL);

    /* the same idempotency key gives the same job */
    job = (Kiln__Job *)tcall("CreateJob", &creq.base, &kiln__job__descriptor, &code, &err);
    cr_assert_not_null(job);
    cr_assert_str_eq(job->id, id);
    protobuf_c_message_free_unpacked(&job->base, NULL);

    Kiln__GetJobRequest greq = KILN__GET_JOB_REQUEST__INIT;
    greq.id = id;
    job = (Kiln__Job *)tcall("GetJob", &greq.base, &kiln__job__descriptor, &code, &err);
    cr_assert_not_null(job);
    cr_assert_str_eq(job->id, id);
    protobuf_c_message_free_unpacked(&job->base, NULL);
    greq.id = (char *)"00000000-0000-0000-0000-000000000000";
    cr_assert_null(tcall("GetJob", &greq.base, &kiln__job__descriptor, &code, &err));
    cr_assert_eq(code, 5, "NOT_FOUND, got %d", code);

    Kiln__ListJobsRequest lreq = KILN__LIST_JOBS_REQUEST__INIT;
    lreq.tag = (char *)"team:nlp";
    Kiln__ListJobsResponse *list = (Kiln__ListJobsResponse *)tcall("ListJobs", &lreq.base,
                                                                   &kiln__list_jobs_response__descriptor, &code, &err);
    cr_assert_not_null(list, "%s", err.message);
    cr_assert_eq(list->n_jobs, 1);
    cr_assert_str_eq(list->jobs[0]->id, id);
    protobuf_c_message_free_unpacked(&list->base, NULL);

    Kiln__StopJobRequest sreq = KILN__STOP_JOB_REQUEST__INIT;
    sreq.id = id;
    job = (Kiln__Job *)tcall("StopJob", &sreq.base, &kiln__job__descriptor, &code, &err);
    cr_assert_not_null(job, "%s", err.message);
    cr_assert(job->state == KILN__JOB_STATE__JOB_STATE_STOPPED || job->state == KILN__JOB_STATE__JOB_STATE_STOPPING);
    protobuf_c_message_free_unpacked(&job->base, NULL);

    Kiln__ListJobEventsRequest ereq = KILN__LIST_JOB_EVENTS_REQUEST__INIT;
    ereq.id = id;
    Kiln__ListJobEventsResponse *evs = (Kiln__ListJobEventsResponse *)tcall(
        "ListJobEvents", &ereq.base, &kiln__list_job_events_response__descriptor, &code, &err);
    cr_assert_not_null(evs, "%s", err.message);
    cr_assert_geq(evs->n_events, 2);
    cr_assert_eq(evs->events[0]->from_state, KILN__JOB_STATE__JOB_STATE_UNSPECIFIED);
    cr_assert_eq(evs->events[0]->to_state, KILN__JOB_STATE__JOB_STATE_QUEUED);
    cr_assert_str_eq(evs->events[0]->job_id, id);
    cr_assert(evs->events[0]->time && evs->events[0]->time[0]);
    protobuf_c_message_free_unpacked(&evs->base, NULL);

    Kiln__ListWorkersRequest wreq = KILN__LIST_WORKERS_REQUEST__INIT;
    Kiln__ListWorkersResponse *ws = (Kiln__ListWorkersResponse *)tcall(
        "ListWorkers", &wreq.base, &kiln__list_workers_response__descriptor, &code, &err);
    cr_assert_not_null(ws, "%s", err.message);
    cr_assert_eq(ws->n_workers, 1);
    cr_assert_str_eq(ws->workers[0]->id, wid);
    cr_assert_eq(ws->workers[0]->slots, 2);
    cr_assert_str_eq(ws->workers[0]->state, "ALIVE");
    protobuf_c_message_free_unpacked(&ws->base, NULL);

    /* a bad spec names its field */
    lr.value = -1;
    creq.idempotency_key = (char *)"";
    cr_assert_null(tcall("CreateJob", &creq.base, &kiln__job__descriptor, &code, &err));
    cr_assert_eq(code, 3, "INVALID_ARGUMENT, got %d", code);
    cr_assert(strstr(err.message, "hyperparameters.lr"), "%s", err.message);
    free(id);
    free(wid);
}

Test(grpc, training_service_searches_jobs)
{
    kiln_err_t err;
    static const double lrs[] = {0.003, 0.0001, 0.001};
    char ids[3][40];
    for (int i = 0; i < 3; i++) {
        json_t *spec = json_pack("{s:s, s:{s:s, s:[i], s:i, s:i}, s:{s:s}, s:{s:f, s:i}, s:{s:s}}", "name", "g",
                                 "model", "type", "mlp", "hidden", 8, "n_inputs", 4, "n_classes", 2, "data", "train",
                                 "synthetic", "hyperparameters", "lr", lrs[i], "global_batch_size", 8, "tags", "team",
                                 i == 1 ? "cv" : "nlp");
        json_t *job = NULL;
        bool created;
        cr_assert_eq(svc_job_create(S, svc_caller_kilnd(), spec, NULL, &job, &created, &err), 0, "%s", err.message);
        snprintf(ids[i], sizeof ids[i], "%s", json_string_value(json_object_get(job, "id")));
        json_decref(job);
        json_decref(spec);
    }
    Kiln__SearchJobsRequest req = KILN__SEARCH_JOBS_REQUEST__INIT;
    char *cols[] = {(char *)"hp.lr", (char *)"metrics.val_loss.min"};
    req.filter = (char *)"hp.lr <= 1e-3 OR tags.team = cv";
    req.order_by = (char *)"hp.lr desc";
    req.columns = cols;
    req.n_columns = 2;
    req.page_size = 1;
    int code;
    char *token = NULL;
    const char *want[] = {ids[2], ids[1]};
    for (int page = 0; page < 3; page++) {
        req.page_token = token ? token : (char *)"";
        Kiln__ListJobsResponse *r = (Kiln__ListJobsResponse *)tcall("SearchJobs", &req.base,
                                                                     &kiln__list_jobs_response__descriptor, &code, &err);
        cr_assert_not_null(r, "SearchJobs: %d %s", code, err.message);
        if (page == 2) {
            cr_assert_eq(r->n_jobs, 0);
            protobuf_c_message_free_unpacked(&r->base, NULL);
            break;
        }
        cr_assert_eq(r->n_jobs, 1);
        cr_assert_str_eq(r->jobs[0]->id, want[page]);
        /* hp.lr comes back as a column; the metric the job never reported does not */
        cr_assert_eq(r->jobs[0]->n_columns, 1);
        cr_assert_str_eq(r->jobs[0]->columns[0]->key, "hp.lr");
        cr_assert_float_eq(r->jobs[0]->columns[0]->value, lrs[page == 0 ? 2 : 1], 1e-15);
        free(token);
        token = r->next_page_token && r->next_page_token[0] ? strdup(r->next_page_token) : NULL;
        protobuf_c_message_free_unpacked(&r->base, NULL);
        if (!token)
            break;
    }
    free(token);
    /* a bad filter: INVALID_ARGUMENT naming the field, with the caret and the hint */
    req.filter = (char *)"hp.lrr < 1";
    req.page_token = (char *)"";
    cr_assert_null(tcall("SearchJobs", &req.base, &kiln__list_jobs_response__descriptor, &code, &err));
    cr_assert_eq(code, 3, "INVALID_ARGUMENT, got %d", code);
    cr_assert(strstr(err.message, "filter: unknown hyperparameter \"lrr\""), "%s", err.message);
    cr_assert(strstr(err.message, "hp.lrr < 1\n^^^^^^"), "%s", err.message);
    cr_assert(strstr(err.message, "did you mean hp.lr?"), "%s", err.message);
}

Test(grpc, training_service_metrics_come_back_by_name)
{
    char *bin = write_script(
        "for s in 1 2 3 4; do echo \"{\\\"step\\\": $s, \\\"time\\\": 1795000000, \\\"metrics\\\": {\\\"train_loss\\\": $s.5}}\" >&$KILN_METRICS_FD; done\n"
        "echo 'step 4 done'\nexit 0\n");
    agent_t *agent = start_agent(bin);
    char *id = submit();
    json_decref(wait_state(id, TH_JOB_ENDED, 20000));
    Kiln__GetMetricsRequest mreq = KILN__GET_METRICS_REQUEST__INIT;
    mreq.id = id;
    mreq.name = (char *)"train_loss";
    int code;
    kiln_err_t err;
    Kiln__GetMetricsResponse *m = (Kiln__GetMetricsResponse *)tcall(
        "GetMetrics", &mreq.base, &kiln__get_metrics_response__descriptor, &code, &err);
    cr_assert_not_null(m, "%s", err.message);
    cr_assert_eq(m->n_metrics, 1);
    cr_assert_str_eq(m->metrics[0]->name, "train_loss");
    cr_assert_eq(m->metrics[0]->n_points, 4);
    cr_assert_eq(m->metrics[0]->points[3]->step, 4);
    cr_assert_float_eq(m->metrics[0]->points[3]->value, 4.5, 1e-9);
    cr_assert_eq(m->metrics[0]->points[3]->time_us, 1795000000000000LL);
    protobuf_c_message_free_unpacked(&m->base, NULL);
    /* a step range, as REST's start_step and end_step */
    mreq.start_step = 2;
    mreq.end_step = 3;
    m = (Kiln__GetMetricsResponse *)tcall("GetMetrics", &mreq.base, &kiln__get_metrics_response__descriptor, &code,
                                          &err);
    cr_assert_not_null(m, "%s", err.message);
    cr_assert_eq(m->n_metrics, 1);
    cr_assert_eq(m->metrics[0]->n_points, 2);
    cr_assert_eq(m->metrics[0]->points[0]->step, 2);
    cr_assert_eq(m->metrics[0]->points[1]->step, 3);
    protobuf_c_message_free_unpacked(&m->base, NULL);
    mreq.start_step = 3;
    mreq.end_step = 2;
    cr_assert_null(tcall("GetMetrics", &mreq.base, &kiln__get_metrics_response__descriptor, &code, &err));
    cr_assert_eq(code, 3, "INVALID_ARGUMENT, got %d", code);
    cr_assert(strstr(err.message, "end_step 2 is before start_step 3"), "%s", err.message);
    agent_destroy(agent);
    free(id);
}

/* StreamLogs through Python's grpcio: history, live lines until the job ends, a client that
 * leaves early, an unknown job. */
static const char *k_py_stream =
    "job, go = sys.argv[3], sys.argv[4]\n"
    "stream = ch.unary_stream('/kiln.TrainingService/StreamLogs',\n"
    "    request_serializer=pb.StreamLogsRequest.SerializeToString, response_deserializer=pb.LogLine.FromString)\n"
    "it = stream(pb.StreamLogsRequest(id=job, follow=True), timeout=60)\n"
    "for l in it:\n"
    "    print('follow', l.rank, l.stream, l.seq, l.time_us > 0, l.line, flush=True)\n"
    "    if l.line == 'first':\n"
    "        open(go, 'w').close()\n"
    "print('follow-end', it.code().name, flush=True)\n"
    "for l in stream(pb.StreamLogsRequest(id=job, rank=0, has_rank=True), timeout=60):\n"
    "    print('history', l.seq, l.line, flush=True)\n"
    "print('history-end', flush=True)\n"
    "it = stream(pb.StreamLogsRequest(id=job, follow=True), timeout=60)\n"
    "next(it)\n"
    "it.cancel()\n"
    "print('cancelled', flush=True)\n"
    "try:\n"
    "    list(stream(pb.StreamLogsRequest(id='00000000-0000-0000-0000-000000000000'), timeout=10))\n"
    "except grpc.RpcError as e:\n"
    "    print('unknown', e.code().name, flush=True)\n";

Test(grpc, stream_logs_follows_a_job_to_its_end)
{
    gt_python_ready(dir);
    char *bin = write_script("echo first\n" WAIT_FOR_GO "echo second\necho third >&2\nsleep 0.3\necho fourth\nexit 0\n");
    agent_t *agent = start_agent(bin);
    char *id = submit();
    json_decref(wait_state(id, "RUNNING", 20000));
    char go[400];
    go_path(id, go, sizeof(go));
    char py[512], cmd[1200];
    py_script("stream.py", k_py_stream, py, sizeof(py));
    snprintf(cmd, sizeof(cmd), "timeout 60 %s %s %s 2>&1", py, id, go);
    char *out = run_capture(cmd);
    cr_assert(strstr(out, "follow 0 stdout 1 True first\n"), "%s", out);
    cr_assert(strstr(out, "follow 0 stdout 2 True second\n"), "%s", out);
    cr_assert(strstr(out, "follow 0 stderr 3 True third\n"), "%s", out);
    cr_assert(strstr(out, "follow 0 stdout 4 True fourth\nfollow-end OK\n"), "the stream ends with the job: %s", out);
    cr_assert(strstr(out, "history 1 first\nhistory 2 second\nhistory 3 third\nhistory 4 fourth\nhistory-end\n"), "%s", out);
    cr_assert(strstr(out, "cancelled\n"), "%s", out);
    cr_assert(strstr(out, "unknown NOT_FOUND\n"), "%s", out);
    json_t *job = wait_state(id, TH_JOB_ENDED, 20000);
    cr_assert_str_eq(json_string_value(json_object_get(job, "state")), "COMPLETED");
    json_decref(job);
    agent_destroy(agent);
    free(id);
}

static const char *k_py_stream_stop =
    "stream = ch.unary_stream('/kiln.TrainingService/StreamLogs',\n"
    "    request_serializer=pb.StreamLogsRequest.SerializeToString, response_deserializer=pb.LogLine.FromString)\n"
    "try:\n"
    "    for l in stream(pb.StreamLogsRequest(id=sys.argv[3], follow=True), timeout=60):\n"
    "        print('line', l.line, flush=True)\n"
    "    print('ended OK', flush=True)\n"
    "except grpc.RpcError as e:\n"
    "    print('ended', e.code().name, flush=True)\n";

Test(grpc, stopping_the_server_ends_live_streams)
{
    gt_python_ready(dir);
    char *bin = write_script("trap 'exit 143' TERM\necho alive\nwhile :; do sleep 0.05; done\n");
    agent_t *agent = start_agent(bin);
    char *id = submit();
    json_decref(wait_state(id, "RUNNING", 20000));
    char py[512], cmd[1200];
    py_script("stop.py", k_py_stream_stop, py, sizeof(py));
    snprintf(cmd, sizeof(cmd), "timeout 60 %s %s 2>&1", py, id);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char line[512] = "";
    cr_assert_not_null(fgets(line, sizeof(line), p));
    cr_assert_str_eq(line, "line alive\n");
    int64_t t0 = kiln_mono_us();
    gt_grpc_stop(&K); /* must not wait for the job to end */
    cr_assert_lt(kiln_mono_us() - t0, 5000000, "stop took %lld ms", (long long)((kiln_mono_us() - t0) / 1000));
    cr_assert_not_null(fgets(line, sizeof(line), p));
    cr_assert(!strncmp(line, "ended ", 6) && strcmp(line, "ended OK\n") != 0, "the client saw the stream break: %s", line);
    pclose(p);
    gt_grpc_start(&K);
    agent_destroy(agent);
    free(id);
}

/* ---- one job cannot starve the agent ------------------------------------------------------- */

/* Submits a job named name whose metric definitions are defs (a JSON array). */
static char *submit_with_defs(const char *name, const char *defs)
{
    char text[8192];
    snprintf(text, sizeof(text),
             "{\"name\":\"%s\",\"model\":{\"type\":\"mlp\",\"hidden\":[8],\"n_inputs\":4,\"n_classes\":2},"
             "\"data\":{\"train\":\"synthetic\"},\"hyperparameters\":{\"lr\":0.01,\"global_batch_size\":8,"
             "\"max_steps\":3},\"resources\":{\"nodes\":1,\"slots_per_node\":1,\"slot_type\":\"cpu\"},"
             "\"metric_definitions\":%s}", name, defs);
    json_t *spec = json_loads(text, 0, NULL);
    cr_assert_not_null(spec);
    json_t *job = NULL;
    bool created = false;
    kiln_err_t err;
    cr_assert_eq(svc_job_create(S, svc_caller_kilnd(), spec, NULL, &job, &created, &err), 0, "%s (%s)", err.message, err.field);
    char *id = strdup(json_string_value(json_object_get(job, "id")));
    json_decref(spec);
    json_decref(job);
    return id;
}

typedef struct hb_watch {
    volatile bool stop;
    int64_t max_gap_us;  /* longest time between two heartbeats kilnd recorded */
    int64_t max_late_us; /* the longest the watcher's own 20 ms pause overran: the machine's stalls */
    int seen;
    bool not_alive;
} hb_watch_t;

static void *hb_watcher(void *arg)
{
    hb_watch_t *w = arg;
    int64_t last = 0;
    while (!w->stop) {
        json_t *ws = NULL;
        kiln_err_t err;
        if (svc_workers_list(S, svc_caller_kilnd(), &ws, &err) == 0) {
            json_t *wk = json_array_get(json_object_get(ws, "workers"), 0);
            const char *hb = json_string_value(json_object_get(wk, "last_heartbeat"));
            const char *st = json_string_value(json_object_get(wk, "state"));
            int64_t t = 0;
            if (hb && kiln_time_parse(hb, &t) == 0 && t != last) {
                if (last)
                    w->max_gap_us = KILN_MAX(w->max_gap_us, t - last);
                last = t;
                w->seen++;
            }
            w->not_alive |= st && strcmp(st, "ALIVE") != 0;
        }
        json_decref(ws);
        int64_t t0 = kiln_mono_us();
        usleep(20000);
        w->max_late_us = KILN_MAX(w->max_late_us, kiln_mono_us() - t0 - 20000);
    }
    return NULL;
}

/* The scenario, bounded: a job whose 16 metric definitions backtrack on every line its
 * rank prints, beside a bystander job on the same agent. kilnd keeps receiving heartbeats every
 * interval (200 ms here), the bystander completes with every line and metric point, and the
 * greedy job's log says its definitions were switched off. */
Test(grpc, a_backtracking_job_does_not_starve_heartbeats_or_a_bystander, .timeout = 120)
{
    char *bin = write_script(
        "if grep -q greedy \"$KILN_SPEC\"; then\n"
        "  i=0; while [ $i -lt 3000 ]; do echo 1111111111111111111111111111111111111111; i=$((i+1)); done\n"
        "  sleep 1\n"
        "else\n"
        "  i=1; while [ $i -le 60 ]; do echo \"tick $i\"; i=$((i+1)); sleep 0.03; done\n"
        "fi\n"
        "exit 0\n");
    char work[200];
    snprintf(work, sizeof(work), "%s/work", dir);
    agent_config_t cfg = {.server = addr, .slots = 2, .slot_type = "cpu", .work_dir = work, .train_bin = bin,
                           .address = "127.0.0.1", .cores = 2, .stop_grace_ms = 2000, .tls.insecure = true};
    agent_t *agent = NULL;
    kiln_err_t err;
    cr_assert_eq(agent_create(&cfg, &agent, &err), 0, "%s", err.message);
    char defs[4096];
    size_t off = (size_t)snprintf(defs, sizeof(defs), "[");
    for (int i = 0; i < 16; i++)
        off += (size_t)snprintf(defs + off, sizeof(defs) - off, "%s{\"name\":\"slow%d\",\"regex\":\"(\\\\d+\\\\d+)+\\\\D\"}",
                                i ? "," : "", i);
    snprintf(defs + off, sizeof(defs) - off, "]");
    hb_watch_t w = {0};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, hb_watcher, &w), 0);
    char *greedy = submit_with_defs("greedy", defs);
    char *bystander = submit_with_defs("bystander", "[{\"name\":\"tick\",\"regex\":\"tick ([0-9]+)\"}]");
    json_t *jb = wait_state(bystander, TH_JOB_ENDED, 60000);
    json_t *jg = wait_state(greedy, TH_JOB_ENDED, 60000);
    w.stop = true;
    pthread_join(th, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(jb, "state")), "COMPLETED", "%s",
                     json_string_value(json_object_get(jb, "reason")));
    cr_assert_str_eq(json_string_value(json_object_get(jg, "state")), "COMPLETED", "%s",
                     json_string_value(json_object_get(jg, "reason")));
    json_decref(jb);
    json_decref(jg);
    cr_assert_not(w.not_alive, "the worker was declared dead");
    cr_assert_gt(w.seen, 5);
    /* 1.5 s, and what the machine itself held this process up by (the watcher's worst overrun) */
    cr_assert_lt(w.max_gap_us, 1500000 + w.max_late_us, "heartbeats stopped for %lld ms (the machine stalled the "
                 "watcher %lld ms)", (long long)(w.max_gap_us / 1000), (long long)(w.max_late_us / 1000));

    json_t *logs = job_logs(bystander);
    int ticks = 0;
    size_t i;
    json_t *l;
    json_array_foreach(json_object_get(logs, "lines"), i, l)
        ticks += !strncmp(json_string_value(json_object_get(l, "line")), "tick ", 5);
    json_decref(logs);
    cr_assert_eq(ticks, 60, "every line of the bystander arrived");
    json_t *metrics = NULL;
    cr_assert_eq(svc_job_metrics(S, svc_caller_kilnd(), bystander, &(svc_metrics_query_t){.name = "tick"}, &metrics, &err), 0, "%s", err.message);
    cr_assert_eq(json_array_size(series(metrics, "tick")), 60, "every point of the bystander arrived");
    json_decref(metrics);
    svc_log_query_t q = {.rank = -1, .limit = 10000};
    logs = NULL;
    cr_assert_eq(svc_job_logs(S, svc_caller_kilnd(), greedy, &q, &logs, &err), 0, "%s", err.message);
    bool switched_off = false;
    json_array_foreach(json_object_get(logs, "lines"), i, l)
        switched_off |= strstr(json_string_value(json_object_get(l, "line")), "metric definitions switched off") != NULL;
    json_decref(logs);
    cr_assert(switched_off, "the greedy job's log says its definitions were switched off");
    agent_destroy(agent);
    free(greedy);
    free(bystander);
}

/* ---- the worker credential kept in the work dir --------------------------------------------- */

/* A restarted agent registers under the worker id its credential file holds (and presents the
 * credential); an operator's --worker-id that differs wins and the file is left alone. This
 * kilnd issues no credential, so the file is not rewritten. */
Test(grpc, a_restarted_agent_takes_its_worker_id_from_its_credential_file)
{
    char *bin = write_script("exit 0\n");
    char work[200];
    snprintf(work, sizeof(work), "%s/work", dir);
    kiln_err_t err;
    cr_assert_eq(kiln_mkdirs(work, &err), 0);
    cr_assert_eq(agent_credential_save(work, "w-from-file", "cred-old", &err), 0, "%s", err.message);
    agent_t *agent = start_agent(bin);
    char id[128], cred[512];
    agent_worker_id(agent, id, sizeof(id));
    cr_assert_str_eq(id, "w-from-file");
    agent_destroy(agent);
    cr_assert_eq(agent_credential_load(work, id, sizeof(id), cred, sizeof(cred), &err), 0, "%s", err.message);
    cr_assert_str_eq(id, "w-from-file");
    cr_assert_str_eq(cred, "cred-old", "no credential issued, none written");

    agent_config_t cfg = {.server = addr, .slots = 1, .slot_type = "cpu", .work_dir = work, .train_bin = bin,
                           .address = "127.0.0.1", .cores = 2, .stop_grace_ms = 2000, .tls.insecure = true,
                           .worker_id = "w-operator"};
    cr_assert_eq(agent_create(&cfg, &agent, &err), 0, "%s", err.message);
    id[0] = '\0';
    for (int i = 0; i < 100 && !id[0]; i++) {
        usleep(50000);
        agent_worker_id(agent, id, sizeof(id));
    }
    cr_assert_str_eq(id, "w-operator");
    agent_destroy(agent);
}

/* A waiting job's pending object is the same on gRPC's GetJob as in the JSON REST answers
 * (svc_job_get), and absent on both for a placed job. */
Test(grpc, pending_reason_is_the_same_as_rest)
{
    char *wid = register_worker("host-p", 1);
    char *first = submit();
    json_decref(wait_state(first, "SCHEDULED|STARTING|RUNNING", 10000));
    char *second = submit();
    json_t *job = NULL;
    kiln_err_t err;
    for (int i = 0; i < 400; i++) {
        json_decref(job);
        cr_assert_eq(svc_job_get(S, svc_caller_kilnd(), second, &job, &err), 0, "%s", err.message);
        if (json_array_size(json_object_get(json_object_get(job, "pending"), "blocking_jobs")) == 1)
            break;
        usleep(50000);
    }
    json_t *p = json_object_get(job, "pending");
    cr_assert(json_is_object(p), "the second job waits with a pending object: %s",
              json_string_value(json_object_get(job, "reason")));
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(p, "blocking_jobs"), 0)), first);
    Kiln__GetJobRequest greq = KILN__GET_JOB_REQUEST__INIT;
    greq.id = second;
    int code;
    Kiln__Job *g = (Kiln__Job *)tcall("GetJob", &greq.base, &kiln__job__descriptor, &code, &err);
    cr_assert_not_null(g, "GetJob: %d %s", code, err.message);
    cr_assert_not_null(g->pending);
    cr_assert_eq(g->pending->position, json_integer_value(json_object_get(p, "position")));
    cr_assert_str_eq(g->pending->missing, json_string_value(json_object_get(p, "missing")));
    cr_assert(strstr(g->pending->missing, "needs 1 worker(s) with 1 free cpu slot(s) each; 0 such worker(s)"), "%s",
              g->pending->missing);
    cr_assert_eq(g->pending->n_blocking_jobs, 1);
    cr_assert_str_eq(g->pending->blocking_jobs[0], first);
    cr_assert_str_eq(g->pending->estimated_start, "", "unknown: the first job has no predicted end");
    cr_assert_null(json_object_get(p, "estimated_start"));
    protobuf_c_message_free_unpacked(&g->base, NULL);
    greq.id = first;
    g = (Kiln__Job *)tcall("GetJob", &greq.base, &kiln__job__descriptor, &code, &err);
    cr_assert_not_null(g);
    cr_assert_null(g->pending, "a placed job has no pending reason");
    protobuf_c_message_free_unpacked(&g->base, NULL);
    json_decref(job);
    free(first);
    free(second);
    free(wid);
}

/* ---- tuning jobs ------------------------------------------------------------------------------ */

/* A proto JSON integer: int32 comes as a number, int64 as its decimal text; absent is 0. */
static long long pj_int(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_string(v) ? strtoll(json_string_value(v), NULL, 10) : (long long)json_integer_value(v);
}

static const char *pj_str(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

/* CreateJob under an idempotency key, from Python's grpcio: the retry of a request gets its job
 * (the same id) even after the project's default queue changed to one that refuses the request
 * now; the same request without the key is refused, another one under the key is ALREADY_EXISTS. */
Test(grpc, a_retry_gets_its_job_after_the_projects_default_queue_changed)
{
    gt_python_ready(dir);
    json_t *spec = json_loads(k_spec, 0, NULL);
    cr_assert_not_null(spec);
    json_object_set_new(json_object_get(spec, "resources"), "slots_per_node", json_integer(2));
    json_t *ans = gt_grpc_calls(&K,
                                json_pack("[{s:s, s:{s:O, s:s}}]", "method", "/kiln.TrainingService/CreateJob",
                                          "request", "spec", spec, "idempotency_key", "grpc-retry"),
                                "retry-first");
    json_t *c = json_array_get(ans, 0);
    cr_assert_str_eq(pj_str(c, "code"), "OK", "%s", json_dumps(c, 0));
    char id[64];
    snprintf(id, sizeof id, "%s", pj_str(json_object_get(c, "response"), "id"));
    cr_assert_str_eq(pj_str(json_object_get(c, "response"), "queue"), "default");
    json_decref(ans);
    /* a cluster admin sends the project's jobs to a queue that never holds 2 slots */
    kiln_err_t err;
    json_t *q = json_pack("{s:s, s:{s:i}}", "name", "tiny", "quota", "cpu", 1), *out = NULL;
    cr_assert_eq(svc_queue_create(S, svc_caller_kilnd(), q, &out, &err), 0, "%s", err.message);
    json_decref(out);
    json_decref(q);
    json_t *patch = json_pack("{s:s}", "default_queue", "tiny");
    cr_assert_eq(svc_project_update(S, svc_caller_kilnd(), "default", patch, &out, &err), 0, "%s", err.message);
    json_decref(out);
    json_decref(patch);
    json_t *other = json_deep_copy(spec);
    json_object_set_new(other, "name", json_string("another"));
    ans = gt_grpc_calls(&K,
                        json_pack("[{s:s, s:{s:O, s:s}}, {s:s, s:{s:O}}, {s:s, s:{s:o, s:s}}]",
                                  "method", "/kiln.TrainingService/CreateJob", "request", "spec", spec,
                                  "idempotency_key", "grpc-retry",
                                  "method", "/kiln.TrainingService/CreateJob", "request", "spec", spec,
                                  "method", "/kiln.TrainingService/CreateJob", "request", "spec", other,
                                  "idempotency_key", "grpc-retry"),
                        "retry-again");
    cr_assert_eq(json_array_size(ans), 3);
    c = json_array_get(ans, 0);
    cr_assert_str_eq(pj_str(c, "code"), "OK", "the retry gets its job: %s", json_dumps(c, 0));
    cr_assert_str_eq(pj_str(json_object_get(c, "response"), "id"), id);
    cr_assert_str_eq(pj_str(json_object_get(c, "response"), "queue"), "default");
    c = json_array_get(ans, 1);
    cr_assert_str_eq(pj_str(c, "code"), "FAILED_PRECONDITION", "a new request is refused now: %s", json_dumps(c, 0));
    c = json_array_get(ans, 2);
    cr_assert_str_eq(pj_str(c, "code"), "ALREADY_EXISTS", "%s", json_dumps(c, 0));
    cr_assert(strstr(pj_str(c, "details"), id), "names the job, which its caller reads: %s", json_dumps(c, 0));
    json_decref(ans);
    json_decref(spec);
}

/* A tuning job over gRPC, from Python's grpcio: CreateTuningJob, then (its trials run on a real
 * agent whose fake rank reports its own lr as val_loss) GetTuningJob answers the state, the trials
 * with their parameters and objectives, and the best, field for field as REST's JSON has them;
 * ListTuningJobs lists it with its counts; StopTuningJob stops a running one and refuses an ended
 * one; an unknown id is NOT_FOUND. */
Test(grpc, training_service_tuning_jobs_round_trip, .timeout = 120)
{
    gt_python_ready(dir);
    char *bin = write_script("lr=$(sed -n 's/.*\"lr\": *\\([0-9.]*\\).*/\\1/p' \"$KILN_SPEC\" | head -n 1)\n"
                             "echo \"val loss $lr\"\n");
    agent_t *agent = start_agent(bin);
    char req[4096];
    snprintf(req, sizeof req,
             "{\"tuning_job\": {\"name\": \"grpc-tune\", \"job\": %s, \"parameters\": {\"lr\": {\"type\": \"continuous\","
             " \"min\": 0.001, \"max\": 0.01, \"scaling\": \"log\"}}, \"objective\": {\"metric\": \"val_loss\", \"goal\":"
             " \"minimize\"}, \"max_jobs\": 3, \"max_parallel_jobs\": 1, \"seed\": 7}}",
             k_spec);
    json_t *r = json_loads(req, 0, NULL);
    cr_assert_not_null(r);
    json_t *ans = gt_grpc_calls(
        &K, json_pack("[{s:s, s:o}]", "method", "/kiln.TrainingService/CreateTuningJob", "request", r), "tune-create");
    json_t *c = json_array_get(ans, 0);
    cr_assert_str_eq(pj_str(c, "code"), "OK", "%s", json_dumps(c, 0));
    json_t *tj = json_object_get(c, "response");
    char id[64];
    snprintf(id, sizeof id, "%s", pj_str(tj, "id"));
    cr_assert(id[0] && !strcmp(pj_str(tj, "name"), "grpc-tune") && !strcmp(pj_str(tj, "state"), "RUNNING") &&
              !strcmp(pj_str(tj, "strategy"), "random") &&
              !strcmp(pj_str(json_object_get(tj, "objective"), "metric"), "val_loss") && pj_int(tj, "max_jobs") == 3 &&
              pj_int(tj, "max_parallel_jobs") == 1 && pj_int(tj, "seed") == 7,
              "%s", json_dumps(tj, 0));
    json_decref(ans);

    /* the trials run; REST's JSON of the ended search, to compare with */
    json_t *rest = NULL;
    kiln_err_t err;
    for (int k = 0;; k++) {
        json_decref(rest);
        cr_assert_eq(svc_tuning_get(S, svc_caller_kilnd(), id, &rest, &err), 0, "%s", err.message);
        const char *st = pj_str(rest, "state");
        if (kiln_tuning_ended(st))
            break;
        cr_assert_lt(k, 1200, "the search did not end: %s", json_dumps(rest, 0));
        usleep(50000);
    }
    cr_assert_str_eq(pj_str(rest, "state"), "COMPLETED", "%s", json_dumps(rest, 0));
    /* a second search whose trials need 2 slots a node: they wait (the agent has 1), it runs */
    json_t *body = json_loads(req, 0, NULL), *out = NULL;
    json_t *tb = json_object_get(body, "tuning_job");
    json_object_set_new(tb, "name", json_string("grpc-tune-wide"));
    json_object_set_new(json_object_get(json_object_get(tb, "job"), "resources"), "slots_per_node", json_integer(2));
    json_object_set_new(json_object_get(json_object_get(tb, "job"), "hyperparameters"), "global_batch_size",
                        json_integer(16));
    cr_assert_eq(svc_tuning_create(S, svc_caller_kilnd(), tb, &out, &err), 0, "%s (%s)", err.message, err.field);
    char id2[64];
    snprintf(id2, sizeof id2, "%s", pj_str(out, "id"));
    json_decref(out);
    json_decref(body);

    ans = gt_grpc_calls(&K,
                        json_pack("[{s:s, s:{s:s}}, {s:s}, {s:s, s:{s:s}}, {s:s, s:{s:s}}, {s:s, s:{s:s}}]",
                                  "method", "/kiln.TrainingService/GetTuningJob", "request", "id", id,
                                  "method", "/kiln.TrainingService/ListTuningJobs",
                                  "method", "/kiln.TrainingService/StopTuningJob", "request", "id", id2,
                                  "method", "/kiln.TrainingService/StopTuningJob", "request", "id", id,
                                  "method", "/kiln.TrainingService/GetTuningJob", "request", "id",
                                  "00000000-0000-4000-8000-000000000000"),
                        "tune-rest");
    cr_assert_eq(json_array_size(ans), 5);
    /* GetTuningJob: as REST has it */
    json_t *g = json_array_get(ans, 0);
    cr_assert_str_eq(pj_str(g, "code"), "OK", "%s", json_dumps(g, 0));
    tj = json_object_get(g, "response");
    cr_assert_str_eq(pj_str(tj, "id"), id);
    cr_assert_str_eq(pj_str(tj, "state"), "COMPLETED");
    cr_assert_str_eq(pj_str(tj, "reason"), pj_str(rest, "reason"));
    cr_assert_gt(json_array_size(json_object_get(tj, "events")), 0, "%s", json_dumps(tj, 0));
    json_t *trials = json_object_get(tj, "trials"), *rtrials = json_object_get(rest, "trials");
    cr_assert_eq(json_array_size(trials), 3, "%s", json_dumps(tj, 0));
    cr_assert_eq(json_array_size(rtrials), 3);
    int best = -1;
    for (size_t i = 0; i < 3; i++) {
        json_t *x = json_array_get(trials, i), *y = json_array_get(rtrials, i);
        cr_assert_eq(pj_int(x, "trial"), (long long)i, "%s", json_dumps(x, 0));
        cr_assert_str_eq(pj_str(x, "job_id"), pj_str(y, "job_id"));
        cr_assert_str_eq(pj_str(x, "state"), "COMPLETED", "%s", json_dumps(x, 0));
        json_t *params = json_loads(pj_str(x, "parameters_json"), 0, NULL);
        cr_assert(json_equal(params, json_object_get(y, "parameters")), "trial %zu: %s", i, json_dumps(x, 0));
        double lr = json_number_value(json_object_get(params, "lr"));
        cr_assert(lr >= 0.001 && lr <= 0.01, "%s", json_dumps(x, 0));
        double obj = json_number_value(json_object_get(x, "objective"));
        cr_assert(json_is_number(json_object_get(x, "objective")) &&
                  obj == json_number_value(json_object_get(y, "objective")), "trial %zu: %s", i, json_dumps(x, 0));
        cr_assert(obj == lr, "the trial ran with the very value recorded for it: %.17g trained, %.17g recorded: %s",
                  obj, lr, json_dumps(x, 0));
        if (best < 0 || obj < json_number_value(json_object_get(json_array_get(trials, (size_t)best), "objective")))
            best = (int)i;
        json_decref(params);
    }
    json_t *b = json_object_get(tj, "best"), *rb = json_object_get(rest, "best");
    cr_assert_str_eq(pj_str(b, "job_id"), pj_str(json_array_get(trials, (size_t)best), "job_id"), "%s", json_dumps(tj, 0));
    cr_assert_str_eq(pj_str(b, "job_id"), pj_str(rb, "job_id"));
    cr_assert(json_number_value(json_object_get(b, "objective")) == json_number_value(json_object_get(rb, "objective")));
    json_t *bp = json_loads(pj_str(b, "parameters_json"), 0, NULL);
    cr_assert(json_equal(bp, json_object_get(rb, "parameters")), "%s", json_dumps(b, 0));
    json_decref(bp);
    /* ListTuningJobs: both, the ended one with its counts and no trials */
    json_t *l = json_array_get(ans, 1);
    cr_assert_str_eq(pj_str(l, "code"), "OK", "%s", json_dumps(l, 0));
    json_t *tjs = json_object_get(json_object_get(l, "response"), "tuning_jobs");
    bool seen1 = false, seen2 = false;
    for (size_t i = 0; i < json_array_size(tjs); i++) {
        json_t *x = json_array_get(tjs, i);
        if (!strcmp(pj_str(x, "id"), id)) {
            seen1 = true;
            cr_assert(!strcmp(pj_str(x, "state"), "COMPLETED") && pj_int(x, "trial_count") == 3 &&
                      pj_int(x, "trials_done") == 3 && !json_object_get(x, "trials") &&
                      !strcmp(pj_str(json_object_get(x, "best"), "job_id"), pj_str(rb, "job_id")),
                      "%s", json_dumps(x, 0));
        }
        seen2 |= !strcmp(pj_str(x, "id"), id2) && !strcmp(pj_str(x, "state"), "RUNNING");
    }
    cr_assert(seen1 && seen2, "%s", json_dumps(l, 0));
    /* StopTuningJob: the running one stops; the ended one is refused, naming its state */
    json_t *s1 = json_array_get(ans, 2), *s2 = json_array_get(ans, 3), *nf = json_array_get(ans, 4);
    cr_assert_str_eq(pj_str(s1, "code"), "OK", "%s", json_dumps(s1, 0));
    const char *st = pj_str(json_object_get(s1, "response"), "state");
    cr_assert(!strcmp(st, "STOPPING") || !strcmp(st, "STOPPED"), "%s", json_dumps(s1, 0));
    cr_assert_str_eq(pj_str(s2, "code"), "FAILED_PRECONDITION", "%s", json_dumps(s2, 0));
    cr_assert(strstr(pj_str(s2, "details"), "COMPLETED"), "%s", json_dumps(s2, 0));
    cr_assert_str_eq(pj_str(nf, "code"), "NOT_FOUND", "%s", json_dumps(nf, 0));
    for (int k = 0;; k++) {
        cr_assert_eq(svc_tuning_get(S, svc_caller_kilnd(), id2, &out, &err), 0, "%s", err.message);
        bool stopped = !strcmp(pj_str(out, "state"), "STOPPED");
        if (!stopped && k == 400)
            cr_assert_fail("the stopped search did not end: %s", json_dumps(out, 0));
        json_decref(out);
        if (stopped)
            break;
        usleep(50000);
    }
    json_decref(ans);
    json_decref(rest);
    agent_destroy(agent);
}

/* ---- queues ------------------------------------------------------------------------------------ */

/* The value of key in a slot-count map of a Queue (every such entry has the same layout), or -1
 * when the map has no such key. */
static int slot_count(void *const *entries, size_t n, const char *key)
{
    for (size_t i = 0; i < n; i++) {
        const Kiln__Queue__QuotaEntry *e = entries[i];
        if (!strcmp(e->key, key))
            return e->value;
    }
    return -1;
}
#define SLOTS(q, map, key) slot_count((void *const *)(q)->map, (q)->n_##map, key)

/* A refusal over gRPC and REST alike: the gRPC code, and the message and hint REST's JSON error
 * has (gRPC's status message is "FIELD: MESSAGE\nhint: HINT", the field named as the request
 * message names it). */
static void refused_alike(const kiln_err_t *gerr, int gcode, int want_gcode, const json_t *rj, long st, long want_st,
                          const char *gfield)
{
    const char *msg = json_string_value(json_object_get(rj, "message"));
    const char *hint = json_string_value(json_object_get(rj, "hint"));
    cr_assert_eq(st, want_st, "REST status %ld", st);
    cr_assert_eq(gcode, want_gcode, "gRPC code %d: %s", gcode, gerr->message);
    cr_assert(msg && hint, "REST's error has a message and a hint");
    char want[600];
    snprintf(want, sizeof want, "%s: %s\nhint: %s", gfield, msg, hint);
    cr_assert_str_eq(gerr->message, want, "gRPC's status message");
}

/* UpdateQueue with ureq, which must succeed and leave the queue's preemption policy within_queue
 * within and reclaim_within_cohort reclaim; why says what the case shows. */
static void update_policy(const Kiln__UpdateQueueRequest *ureq, const char *within, const char *reclaim, const char *why)
{
    int code = 0;
    kiln_err_t err;
    Kiln__Queue *upd = (Kiln__Queue *)tcall("UpdateQueue", &ureq->base, &kiln__queue__descriptor, &code, &err);
    cr_assert_not_null(upd, "UpdateQueue: %d %s", code, err.message);
    cr_assert_str_eq(upd->preemption->within_queue, within, "within_queue: %s", why);
    cr_assert_str_eq(upd->preemption->reclaim_within_cohort, reclaim, "reclaim_within_cohort: %s", why);
    protobuf_c_message_free_unpacked(&upd->base, NULL);
}

Test(grpc, queues_round_trip_with_usage_and_refuse_as_rest_does)
{
    gt_http_start(&K); /* REST on the same service, to compare answers with */
    kiln_err_t err;
    int code = -1;

    /* create: the contract shape, as a message */
    Kiln__Queue__QuotaEntry qc = KILN__QUEUE__QUOTA_ENTRY__INIT, qg = KILN__QUEUE__QUOTA_ENTRY__INIT;
    qc.key = "cpu";
    qc.value = 8;
    qg.key = "gpu";
    qg.value = 0;
    Kiln__Queue__QuotaEntry *quota[] = {&qc, &qg};
    Kiln__Queue__BorrowingLimitEntry bl = KILN__QUEUE__BORROWING_LIMIT_ENTRY__INIT;
    bl.key = "cpu";
    bl.value = 4;
    Kiln__Queue__BorrowingLimitEntry *borrow[] = {&bl};
    Kiln__Queue__LendingLimitEntry ll = KILN__QUEUE__LENDING_LIMIT_ENTRY__INIT;
    ll.key = "cpu";
    ll.value = 8;
    Kiln__Queue__LendingLimitEntry *lend[] = {&ll};
    char *projects[] = {"default"};
    Kiln__Queue q = KILN__QUEUE__INIT;
    q.name = "nlp";
    q.cohort = "research";
    q.quota = quota;
    q.n_quota = 2;
    q.borrowing_limit = borrow;
    q.n_borrowing_limit = 1;
    q.lending_limit = lend;
    q.n_lending_limit = 1;
    q.weight = 1;
    q.projects = projects;
    q.n_projects = 1;
    Kiln__CreateQueueRequest creq = KILN__CREATE_QUEUE_REQUEST__INIT;
    creq.queue = &q;
    Kiln__Queue *made = (Kiln__Queue *)tcall("CreateQueue", &creq.base, &kiln__queue__descriptor, &code, &err);
    cr_assert_not_null(made, "CreateQueue: %d %s", code, err.message);
    cr_assert_str_eq(made->name, "nlp");
    cr_assert_str_eq(made->cohort, "research");
    cr_assert_eq(SLOTS(made, quota, "cpu"), 8);
    cr_assert_eq(SLOTS(made, quota, "gpu"), 0);
    cr_assert_eq(SLOTS(made, borrowing_limit, "cpu"), 4);
    cr_assert_eq(SLOTS(made, borrowing_limit, "gpu"), -1, "a missing limit is unlimited: no entry");
    cr_assert_eq(SLOTS(made, lending_limit, "cpu"), 8);
    cr_assert_eq(made->weight, 1);
    cr_assert_eq(made->n_projects, 1);
    cr_assert_str_eq(made->projects[0], "default");
    cr_assert(!made->fair_sharing);
    cr_assert(made->preemption, "answers carry the preemption policy, its defaults when none was set");
    cr_assert_str_eq(made->preemption->within_queue, "lower_priority");
    cr_assert_str_eq(made->preemption->reclaim_within_cohort, "any");
    cr_assert_eq(SLOTS(made, usage, "cpu"), 0);
    cr_assert_eq(made->pending, 0);
    cr_assert_eq(made->admitted, 0);
    cr_assert(made->created_at[0] && made->updated_at[0]);
    protobuf_c_message_free_unpacked(&made->base, NULL);

    /* one job of the queue holds the worker's only slot, a second waits: usage, admitted, pending */
    char *wid = register_worker("host-q", 1);
    char *ids[2];
    for (int i = 0; i < 2; i++) {
        json_t *spec = json_loads(k_spec, 0, NULL);
        json_object_set_new(spec, "queue", json_string("nlp"));
        json_t *job = NULL;
        bool created = false;
        cr_assert_eq(svc_job_create(S, svc_caller_kilnd(), spec, NULL, &job, &created, &err), 0, "%s", err.message);
        ids[i] = strdup(json_string_value(json_object_get(job, "id")));
        json_decref(job);
        json_decref(spec);
        if (i == 0)
            json_decref(wait_state(ids[0], "SCHEDULED|STARTING|RUNNING", 10000));
    }
    Kiln__GetQueueRequest greq = KILN__GET_QUEUE_REQUEST__INIT;
    greq.name = "nlp";
    Kiln__Queue *got = (Kiln__Queue *)tcall("GetQueue", &greq.base, &kiln__queue__descriptor, &code, &err);
    cr_assert_not_null(got, "GetQueue: %d %s", code, err.message);
    cr_assert_eq(SLOTS(got, usage, "cpu"), 1);
    cr_assert_eq(SLOTS(got, usage, "gpu"), 0);
    cr_assert_eq(got->admitted, 1);
    cr_assert_eq(got->pending, 1);
    protobuf_c_message_free_unpacked(&got->base, NULL);
    Kiln__ListQueuesRequest lreq = KILN__LIST_QUEUES_REQUEST__INIT;
    Kiln__ListQueuesResponse *all =
        (Kiln__ListQueuesResponse *)tcall("ListQueues", &lreq.base, &kiln__list_queues_response__descriptor, &code, &err);
    cr_assert_not_null(all, "ListQueues: %d %s", code, err.message);
    cr_assert_eq(all->n_queues, 2);
    cr_assert_str_eq(all->queues[0]->name, "default");
    cr_assert_eq(all->queues[0]->n_quota, 0, "default has no limit: an empty quota map");
    cr_assert(all->queues[0]->unlimited_quota, "and says so");
    cr_assert(!all->queues[1]->unlimited_quota);
    cr_assert(all->queues[0]->fair_sharing);
    cr_assert_str_eq(all->queues[1]->name, "nlp");
    cr_assert_eq(all->queues[1]->pending, 1);
    protobuf_c_message_free_unpacked(&all->base, NULL);

    /* update: what the mask names; named and unset clears it */
    Kiln__Queue patch = KILN__QUEUE__INIT;
    patch.weight = 2.5;
    char *mask[] = {"weight", "borrowing_limit"};
    Kiln__UpdateQueueRequest ureq = KILN__UPDATE_QUEUE_REQUEST__INIT;
    ureq.name = "nlp";
    ureq.queue = &patch;
    ureq.update_mask = mask;
    ureq.n_update_mask = 2;
    Kiln__Queue *upd = (Kiln__Queue *)tcall("UpdateQueue", &ureq.base, &kiln__queue__descriptor, &code, &err);
    cr_assert_not_null(upd, "UpdateQueue: %d %s", code, err.message);
    cr_assert_eq(upd->weight, 2.5);
    cr_assert_eq(upd->n_borrowing_limit, 0);
    cr_assert_eq(SLOTS(upd, lending_limit, "cpu"), 8, "what the mask does not name stays");
    cr_assert_eq(SLOTS(upd, quota, "cpu"), 8);
    cr_assert_eq(upd->pending, 1);
    protobuf_c_message_free_unpacked(&upd->base, NULL);
    /* the preemption policy: a value given changes, one unset ("") stays; the mask without the
     * message sets the defaults */
    Kiln__QueuePreemption pre = KILN__QUEUE_PREEMPTION__INIT;
    pre.within_queue = "never";
    patch = (Kiln__Queue)KILN__QUEUE__INIT;
    patch.preemption = &pre;
    char *pmask[] = {"preemption"};
    ureq.update_mask = pmask;
    ureq.n_update_mask = 1;
    update_policy(&ureq, "never", "any", "a value given changes");
    pre.within_queue = "";
    pre.reclaim_within_cohort = "lower_priority";
    update_policy(&ureq, "never", "lower_priority", "a value unset (\"\") stays");
    json_t *rest_view = gt_rest(&K, "GET", "/v1/queues/nlp", NULL, &(long){0});
    json_t *set_pre = json_pack("{s:s, s:s}", "within_queue", "never", "reclaim_within_cohort", "lower_priority");
    cr_assert(json_equal(json_object_get(rest_view, "preemption"), set_pre), "REST reads what gRPC set");
    json_decref(set_pre);
    json_decref(rest_view);
    patch.preemption = NULL;
    update_policy(&ureq, "lower_priority", "any", "the mask without the message: the defaults");

    /* the policy's fields by dotted path (AIP-161): each named takes the message's value, merged
     * into the stored policy as REST's {"preemption": {"within_queue": ...}} is, what is not named
     * stays; named unset ("") is its default, as REST's null */
    pre = (Kiln__QueuePreemption)KILN__QUEUE_PREEMPTION__INIT;
    pre.within_queue = "never";
    pre.reclaim_within_cohort = ""; /* not named: not set (a value set is refused, below) */
    patch.preemption = &pre;
    char *within_mask[] = {"preemption.within_queue"};
    ureq.update_mask = within_mask;
    ureq.n_update_mask = 1;
    update_policy(&ureq, "never", "any", "the field named takes its value, the other stays");
    pre.within_queue = "";
    pre.reclaim_within_cohort = "lower_priority";
    char *reclaim_mask[] = {"preemption.reclaim_within_cohort"};
    ureq.update_mask = reclaim_mask;
    update_policy(&ureq, "never", "lower_priority", "a field not named stays");
    pre.reclaim_within_cohort = "never";
    char *both_mask[] = {"preemption.within_queue", "preemption.reclaim_within_cohort"};
    ureq.update_mask = both_mask;
    ureq.n_update_mask = 2;
    update_policy(&ureq, "lower_priority", "never", "named unset: the default");
    /* refused: an unknown field of the policy and a value it does not take, as REST's PATCH
     * refuses them; a part of a field that changes whole, and the policy named both whole and by
     * its fields, naming update_mask; none changes the queue */
    kiln_err_t perr;
    long pst = 0;
    char *unknown_mask[] = {"preemption.sometimes"};
    pre.reclaim_within_cohort = ""; /* set, a field the mask does not name is refused first */
    ureq.update_mask = unknown_mask;
    ureq.n_update_mask = 1;
    kiln_err_clear(&perr);
    cr_assert_null(tcall("UpdateQueue", &ureq.base, &kiln__queue__descriptor, &code, &perr));
    json_t *prj = gt_rest(&K, "PATCH", "/v1/queues/nlp", "{\"preemption\": {\"sometimes\": \"never\"}}", &pst);
    cr_assert_str_eq(json_string_value(json_object_get(prj, "field")), "preemption.sometimes");
    cr_assert_str_eq(json_string_value(json_object_get(prj, "message")), "unknown field \"preemption.sometimes\"");
    refused_alike(&perr, code, 3 /* INVALID_ARGUMENT */, prj, pst, 400, "queue.preemption.sometimes");
    json_decref(prj);
    pre.within_queue = "always";
    ureq.update_mask = within_mask;
    kiln_err_clear(&perr);
    cr_assert_null(tcall("UpdateQueue", &ureq.base, &kiln__queue__descriptor, &code, &perr));
    prj = gt_rest(&K, "PATCH", "/v1/queues/nlp", "{\"preemption\": {\"within_queue\": \"always\"}}", &pst);
    cr_assert_str_eq(json_string_value(json_object_get(prj, "field")), "preemption.within_queue");
    refused_alike(&perr, code, 3 /* INVALID_ARGUMENT */, prj, pst, 400, "queue.preemption.within_queue");
    json_decref(prj);
    char *entry_mask[] = {"quota.cpu"};
    ureq.update_mask = entry_mask;
    kiln_err_clear(&perr);
    cr_assert_null(tcall("UpdateQueue", &ureq.base, &kiln__queue__descriptor, &code, &perr));
    cr_assert_eq(code, 3, "gRPC code %d: %s", code, perr.message);
    cr_assert_str_eq(perr.message, "update_mask path \"quota.cpu\" names a part of quota, which changes whole\n"
                     "hint: name \"quota\" and give all of quota in queue, as REST's PATCH does");
    char *twice_mask[] = {"preemption.within_queue", "preemption"};
    ureq.update_mask = twice_mask;
    ureq.n_update_mask = 2;
    kiln_err_clear(&perr);
    cr_assert_null(tcall("UpdateQueue", &ureq.base, &kiln__queue__descriptor, &code, &perr));
    cr_assert_eq(code, 3, "gRPC code %d: %s", code, perr.message);
    cr_assert(strstr(perr.message, "update_mask names preemption both whole and by its fields\nhint: ") == perr.message,
              "%s", perr.message);
    /* a path with an empty name names no field (it read "unknown field \"\"", naming nothing), and
     * one into a policy's field says that field changes whole (its hint listed that very field) */
    static char *const empty_paths[] = {"", ".", "preemption.", ".within_queue", "preemption..within_queue"};
    for (size_t i = 0; i < sizeof empty_paths / sizeof empty_paths[0]; i++) {
        char *one[] = {empty_paths[i]};
        ureq.update_mask = one;
        ureq.n_update_mask = 1;
        kiln_err_clear(&perr);
        cr_assert_null(tcall("UpdateQueue", &ureq.base, &kiln__queue__descriptor, &code, &perr));
        cr_assert_eq(code, 3, "\"%s\": gRPC code %d: %s", empty_paths[i], code, perr.message);
        char want[160];
        snprintf(want, sizeof want, "update_mask path \"%s\" has an empty field name\nhint: ", empty_paths[i]);
        cr_assert(strstr(perr.message, want) == perr.message, "\"%s\": %s", empty_paths[i], perr.message);
    }
    char *deep_mask[] = {"preemption.within_queue.never"};
    ureq.update_mask = deep_mask;
    ureq.n_update_mask = 1;
    kiln_err_clear(&perr);
    cr_assert_null(tcall("UpdateQueue", &ureq.base, &kiln__queue__descriptor, &code, &perr));
    cr_assert_eq(code, 3, "gRPC code %d: %s", code, perr.message);
    cr_assert_str_eq(perr.message, "update_mask path \"preemption.within_queue.never\" names a part of "
                     "preemption.within_queue, which changes whole\nhint: name \"preemption.within_queue\"");
    rest_view = gt_rest(&K, "GET", "/v1/queues/nlp", NULL, &(long){0});
    set_pre = json_pack("{s:s, s:s}", "within_queue", "lower_priority", "reclaim_within_cohort", "never");
    cr_assert(json_equal(json_object_get(rest_view, "preemption"), set_pre), "the refusals changed nothing");
    json_decref(set_pre);
    json_decref(rest_view);
    ureq.update_mask = pmask;
    ureq.n_update_mask = 1;
    patch.preemption = NULL;

    /* a bad body: the same status, message and hint as over REST */
    Kiln__Queue__QuotaEntry tpu = KILN__QUEUE__QUOTA_ENTRY__INIT;
    tpu.key = "tpu";
    tpu.value = 1;
    Kiln__Queue__QuotaEntry *bad_quota[] = {&tpu};
    Kiln__Queue bad = KILN__QUEUE__INIT;
    bad.name = "x";
    bad.quota = bad_quota;
    bad.n_quota = 1;
    creq.queue = &bad;
    kiln_err_t gerr;
    kiln_err_clear(&gerr);
    cr_assert_null(tcall("CreateQueue", &creq.base, &kiln__queue__descriptor, &code, &gerr));
    long st = 0;
    json_t *rj = gt_rest(&K, "POST", "/v1/queues", "{\"name\": \"x\", \"quota\": {\"tpu\": 1}}", &st);
    cr_assert_str_eq(json_string_value(json_object_get(rj, "field")), "quota.tpu");
    refused_alike(&gerr, code, 3 /* INVALID_ARGUMENT */, rj, st, 400, "queue.quota.tpu");
    json_decref(rj);
    /* a preemption policy's unknown value, alike */
    Kiln__QueuePreemption badpre = KILN__QUEUE_PREEMPTION__INIT;
    badpre.reclaim_within_cohort = "sometimes";
    bad = (Kiln__Queue)KILN__QUEUE__INIT;
    bad.name = "x";
    bad.quota = quota;
    bad.n_quota = 2;
    bad.preemption = &badpre;
    kiln_err_clear(&gerr);
    cr_assert_null(tcall("CreateQueue", &creq.base, &kiln__queue__descriptor, &code, &gerr));
    rj = gt_rest(&K, "POST", "/v1/queues",
                 "{\"name\": \"x\", \"quota\": {\"cpu\": 8}, \"preemption\": {\"reclaim_within_cohort\": \"sometimes\"}}",
                 &st);
    cr_assert_str_eq(json_string_value(json_object_get(rj, "field")), "preemption.reclaim_within_cohort");
    cr_assert_str_eq(json_string_value(json_object_get(rj, "message")),
                     "preemption.reclaim_within_cohort must be any, lower_priority or never (got \"sometimes\")");
    refused_alike(&gerr, code, 3 /* INVALID_ARGUMENT */, rj, st, 400, "queue.preemption.reclaim_within_cohort");
    json_decref(rj);
    /* projects: a project named twice, and more than 1000 entries, alike */
    char *dup[] = {"default", "*", "default"};
    bad = (Kiln__Queue)KILN__QUEUE__INIT;
    bad.name = "x";
    bad.quota = quota;
    bad.n_quota = 2;
    bad.projects = dup;
    bad.n_projects = 3;
    kiln_err_clear(&gerr);
    cr_assert_null(tcall("CreateQueue", &creq.base, &kiln__queue__descriptor, &code, &gerr));
    rj = gt_rest(&K, "POST", "/v1/queues",
              "{\"name\": \"x\", \"quota\": {\"cpu\": 8, \"gpu\": 0}, \"projects\": [\"default\", \"*\", \"default\"]}", &st);
    cr_assert_str_eq(json_string_value(json_object_get(rj, "field")), "projects[2]");
    refused_alike(&gerr, code, 3 /* INVALID_ARGUMENT */, rj, st, 400, "queue.projects[2]");
    json_decref(rj);
    static char *stars[1001];
    json_t *body = json_pack("{s:s, s:{s:i, s:i}, s:[]}", "name", "x", "quota", "cpu", 8, "gpu", 0, "projects");
    for (int i = 0; i < 1001; i++) {
        stars[i] = "*";
        json_array_append_new(json_object_get(body, "projects"), json_string("*"));
    }
    bad.projects = stars;
    bad.n_projects = 1001;
    kiln_err_clear(&gerr);
    cr_assert_null(tcall("CreateQueue", &creq.base, &kiln__queue__descriptor, &code, &gerr));
    char *text = json_dumps(body, JSON_COMPACT);
    rj = gt_rest(&K, "POST", "/v1/queues", text, &st);
    free(text);
    json_decref(body);
    cr_assert_str_eq(json_string_value(json_object_get(rj, "field")), "projects");
    refused_alike(&gerr, code, 3 /* INVALID_ARGUMENT */, rj, st, 400, "queue.projects");
    json_decref(rj);
    /* a queue whose jobs wait or run stays: FAILED_PRECONDITION and 409, saying how many */
    Kiln__DeleteQueueRequest dreq = KILN__DELETE_QUEUE_REQUEST__INIT;
    dreq.name = "nlp";
    kiln_err_clear(&gerr);
    cr_assert_null(tcall("DeleteQueue", &dreq.base, &kiln__delete_queue_response__descriptor, &code, &gerr));
    rj = gt_rest(&K, "DELETE", "/v1/queues/nlp", NULL, &st);
    cr_assert(strstr(json_string_value(json_object_get(rj, "message")), "has 2 job(s) waiting or running"), "%s",
              json_string_value(json_object_get(rj, "message")));
    refused_alike(&gerr, code, 9 /* FAILED_PRECONDITION */, rj, st, 409, "name");
    json_decref(rj);
    /* a queue that does not exist: NOT_FOUND and 404 */
    greq.name = "none";
    kiln_err_clear(&gerr);
    cr_assert_null(tcall("GetQueue", &greq.base, &kiln__queue__descriptor, &code, &gerr));
    rj = gt_rest(&K, "GET", "/v1/queues/none", NULL, &st);
    refused_alike(&gerr, code, 5 /* NOT_FOUND */, rj, st, 404, "name");
    json_decref(rj);
    free(ids[0]);
    free(ids[1]);
    free(wid);
}

/* A project's default queue over gRPC answers as over REST for the same intent: proto3's "" is
 * unset, REST's null, so it means the queue "default" (REST refuses "" as naming no queue); a
 * queue that leaves out a project whose default queue it is is refused alike. */
Test(grpc, a_project_with_jobs_in_a_queue_leaves_it_as_rest_says)
{
    /* UpdateQueue leaving out a project whose jobs wait or run in the queue: FAILED_PRECONDITION
     * with REST's 409's words (how many, and what to do), and nothing changes */
    gt_http_start(&K);
    kiln_err_t err, gerr;
    int code = -1;
    long st = 0;
    json_decref(gt_rest(&K, "POST", "/v1/projects", "{\"name\": \"ja\"}", &st));
    json_decref(gt_rest(&K, "POST", "/v1/projects", "{\"name\": \"jb\"}", &st));
    json_t *rj = gt_rest(&K, "POST", "/v1/queues", "{\"name\": \"jq\", \"quota\": {\"cpu\": 2}}", &st);
    cr_assert_eq(st, 201);
    json_decref(rj);
    rj = gt_rest(&K, "POST", "/v1/jobs",
                 "{\"name\": \"w\", \"project\": \"jb\", \"queue\": \"jq\", \"model\": {\"type\": \"mlp\", \"hidden\": [8],"
                 " \"n_inputs\": 4, \"n_classes\": 2}, \"data\": {\"train\": \"synthetic\"},"
                 " \"resources\": {\"nodes\": 1, \"slots_per_node\": 1, \"slot_type\": \"cpu\"}}", &st);
    cr_assert_eq(st, 201, "%s", json_string_value(json_object_get(rj, "message")));
    char job[64];
    snprintf(job, sizeof job, "%s", json_string_value(json_object_get(rj, "id")));
    json_decref(rj);
    char *only_ja[] = {"ja"};
    Kiln__Queue patch = KILN__QUEUE__INIT;
    patch.projects = only_ja;
    patch.n_projects = 1;
    char *mask[] = {"projects"};
    Kiln__UpdateQueueRequest uq = KILN__UPDATE_QUEUE_REQUEST__INIT;
    uq.name = "jq";
    uq.queue = &patch;
    uq.update_mask = mask;
    uq.n_update_mask = 1;
    kiln_err_clear(&gerr);
    cr_assert_null(tcall("UpdateQueue", &uq.base, &kiln__queue__descriptor, &code, &gerr));
    rj = gt_rest(&K, "PATCH", "/v1/queues/jq", "{\"projects\": [\"ja\"]}", &st);
    cr_assert_str_eq(json_string_value(json_object_get(rj, "message")),
                     "queue \"jq\" has 1 job(s) of project \"jb\" (1 waiting, 0 running), which projects would no "
                     "longer let in");
    refused_alike(&gerr, code, 9 /* FAILED_PRECONDITION */, rj, st, 409, "queue.projects");
    json_decref(rj);
    rj = gt_rest(&K, "GET", "/v1/queues/jq", NULL, &st);
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(rj, "projects"), 0)), "*", "nothing changed");
    json_decref(rj);
    /* once the job has ended, jb may be left out */
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s:stop", job);
    json_decref(gt_rest(&K, "POST", path, NULL, &st));
    cr_assert_eq(st, 200);
    Kiln__Queue *q = (Kiln__Queue *)tcall("UpdateQueue", &uq.base, &kiln__queue__descriptor, &code, &err);
    cr_assert_not_null(q, "UpdateQueue: %d %s", code, err.message);
    cr_assert_eq(q->n_projects, 1);
    cr_assert_str_eq(q->projects[0], "ja");
    protobuf_c_message_free_unpacked(&q->base, NULL);
}

/* UpdateQueue with ureq is INVALID_ARGUMENT naming field, with message and the start of hint. */
static void mask_refuses(const Kiln__UpdateQueueRequest *ureq, const char *field, const char *message, const char *hint)
{
    int code = 0;
    kiln_err_t err;
    kiln_err_clear(&err);
    cr_assert_null(tcall("UpdateQueue", &ureq->base, &kiln__queue__descriptor, &code, &err), "%s is refused", field);
    cr_assert_eq(code, 3 /* INVALID_ARGUMENT */, "%s: gRPC code %d: %s", field, code, err.message);
    char want[400];
    snprintf(want, sizeof want, "%s: %s\nhint: %s", field, message, hint);
    cr_assert(strstr(err.message, want) == err.message, "%s: %s", field, err.message);
}

/* Every field UpdateQueue's queue sets is one its update_mask names, or the request is refused
 * naming it (kiln honours or refuses every field given, never ignores one): a number, a map, a
 * list, a message, unlimited_quota, a policy's field when the mask names the policy's fields one
 * by one, and a field an answer carries alone; the queue is left as it was. A scalar at its zero
 * value cannot be told from unset and is fine, as is queue.name repeating the request's name. */
Test(grpc, update_queue_refuses_a_field_its_mask_does_not_name)
{
    gt_http_start(&K);
    long st = 0;
    json_t *rj = gt_rest(&K, "POST", "/v1/queues", "{\"name\": \"uq\", \"cohort\": \"c1\", \"quota\": {\"cpu\": 4}}",
                         &st);
    cr_assert_eq(st, 201, "%s", json_string_value(json_object_get(rj, "message")));
    json_decref(rj);
    rj = gt_rest(&K, "GET", "/v1/queues/uq", NULL, &st);
    char *before = json_dumps(rj, JSON_SORT_KEYS);
    json_decref(rj);

    Kiln__Queue patch = KILN__QUEUE__INIT;
    patch.cohort = "c2";
    char *mask[] = {"cohort"};
    Kiln__UpdateQueueRequest ureq = KILN__UPDATE_QUEUE_REQUEST__INIT;
    ureq.name = "uq";
    ureq.queue = &patch;
    ureq.update_mask = mask;
    ureq.n_update_mask = 1;
    patch.weight = 3;
    mask_refuses(&ureq, "queue.weight", "weight is set but update_mask does not name it",
                 "add \"weight\" to update_mask to change it, or leave it unset");
    patch.weight = 0;
    Kiln__Queue__QuotaEntry cpu = KILN__QUEUE__QUOTA_ENTRY__INIT;
    cpu.key = "cpu";
    cpu.value = 8;
    Kiln__Queue__QuotaEntry *quota[] = {&cpu};
    patch.quota = quota;
    patch.n_quota = 1;
    mask_refuses(&ureq, "queue.quota", "quota is set but update_mask does not name it",
                 "add \"quota\" to update_mask");
    patch.quota = NULL;
    patch.n_quota = 0;
    patch.unlimited_quota = true;
    mask_refuses(&ureq, "queue.unlimited_quota", "unlimited_quota is set but update_mask does not name it",
                 "add \"unlimited_quota\" to update_mask");
    patch.unlimited_quota = false;
    Kiln__Queue__LendingLimitEntry lend = KILN__QUEUE__LENDING_LIMIT_ENTRY__INIT;
    lend.key = "cpu";
    lend.value = 1;
    Kiln__Queue__LendingLimitEntry *lending[] = {&lend};
    patch.lending_limit = lending;
    patch.n_lending_limit = 1;
    mask_refuses(&ureq, "queue.lending_limit", "lending_limit is set but update_mask does not name it",
                 "add \"lending_limit\" to update_mask");
    patch.lending_limit = NULL;
    patch.n_lending_limit = 0;
    char *only_default[] = {"default"};
    patch.projects = only_default;
    patch.n_projects = 1;
    mask_refuses(&ureq, "queue.projects", "projects is set but update_mask does not name it",
                 "add \"projects\" to update_mask");
    patch.projects = NULL;
    patch.n_projects = 0;
    patch.fair_sharing = true;
    mask_refuses(&ureq, "queue.fair_sharing", "fair_sharing is set but update_mask does not name it",
                 "add \"fair_sharing\" to update_mask");
    patch.fair_sharing = false;
    Kiln__QueuePreemption pre = KILN__QUEUE_PREEMPTION__INIT;
    pre.within_queue = "never";
    patch.preemption = &pre;
    mask_refuses(&ureq, "queue.preemption", "preemption is set but update_mask does not name it",
                 "add \"preemption\" to update_mask");
    /* the mask names one field of the policy, the message sets the other too */
    char *within_mask[] = {"cohort", "preemption.within_queue"};
    ureq.update_mask = within_mask;
    ureq.n_update_mask = 2;
    pre.reclaim_within_cohort = "never";
    mask_refuses(&ureq, "queue.preemption.reclaim_within_cohort",
                 "preemption.reclaim_within_cohort is set but update_mask does not name it",
                 "add \"preemption.reclaim_within_cohort\" to update_mask");
    patch.preemption = NULL;
    ureq.update_mask = mask;
    ureq.n_update_mask = 1;
    /* a queue read and sent back: what an answer carries alone is not set on an update */
    Kiln__Queue__UsageEntry used = KILN__QUEUE__USAGE_ENTRY__INIT;
    used.key = "cpu";
    Kiln__Queue__UsageEntry *usage[] = {&used};
    patch.usage = usage;
    patch.n_usage = 1;
    mask_refuses(&ureq, "queue.usage", "usage is set but update_mask does not name it",
                 "usage is output only: leave it unset in an update");
    patch.usage = NULL;
    patch.n_usage = 0;
    patch.created_at = "2026-01-01T00:00:00Z";
    mask_refuses(&ureq, "queue.created_at", "created_at is set but update_mask does not name it",
                 "created_at is output only");
    patch.created_at = NULL;
    patch.name = "other";
    mask_refuses(&ureq, "queue.name", "name is set but update_mask does not name it", "leave queue.name unset");
    rj = gt_rest(&K, "GET", "/v1/queues/uq", NULL, &st);
    char *after = json_dumps(rj, JSON_SORT_KEYS);
    json_decref(rj);
    cr_assert_str_eq(after, before, "the refusals changed nothing");
    free(after);
    free(before);

    /* the request's own name, zero values (proto3 leaves them out) and what the mask names: done */
    patch.name = "uq";
    patch.weight = 2;
    char *both[] = {"cohort", "weight"};
    ureq.update_mask = both;
    ureq.n_update_mask = 2;
    int code = 0;
    kiln_err_t err;
    Kiln__Queue *q = (Kiln__Queue *)tcall("UpdateQueue", &ureq.base, &kiln__queue__descriptor, &code, &err);
    cr_assert_not_null(q, "UpdateQueue: %d %s", code, err.message);
    cr_assert_str_eq(q->cohort, "c2");
    cr_assert_eq(q->weight, 2);
    cr_assert_eq(SLOTS(q, quota, "cpu"), 4, "what the mask does not name stays");
    protobuf_c_message_free_unpacked(&q->base, NULL);
}

Test(grpc, a_projects_default_queue_answers_as_rest_does)
{
    gt_http_start(&K); /* REST on the same service, to compare answers with */
    kiln_err_t err, gerr;
    int code = -1;
    long st = 0;

    /* created without one ("" over gRPC, null or nothing over REST): "default" */
    Kiln__CreateProjectRequest cp = KILN__CREATE_PROJECT_REQUEST__INIT;
    cp.name = "ga";
    cp.default_queue = "";
    Kiln__Project *p = (Kiln__Project *)tcall("CreateProject", &cp.base, &kiln__project__descriptor, &code, &err);
    cr_assert_not_null(p, "CreateProject: %d %s", code, err.message);
    cr_assert_str_eq(p->default_queue, "default");
    protobuf_c_message_free_unpacked(&p->base, NULL);
    json_t *rj = gt_rest(&K, "POST", "/v1/projects", "{\"name\": \"gb\", \"default_queue\": null}", &st);
    cr_assert_eq(st, 201);
    cr_assert_str_eq(json_string_value(json_object_get(rj, "default_queue")), "default");
    json_decref(rj);
    rj = gt_rest(&K, "POST", "/v1/projects", "{\"name\": \"gc\", \"default_queue\": \"\"}", &st);
    cr_assert_eq(st, 400, "REST's \"\" names no queue");
    cr_assert_str_eq(json_string_value(json_object_get(rj, "field")), "default_queue");
    json_decref(rj);

    /* a queue both take as their default queue, one over each API */
    rj = gt_rest(&K, "POST", "/v1/queues", "{\"name\": \"gq\", \"quota\": {\"cpu\": 2}, \"projects\": [\"ga\", \"gb\"]}",
                 &st);
    cr_assert_eq(st, 201);
    json_decref(rj);
    Kiln__UpdateProjectRequest up = KILN__UPDATE_PROJECT_REQUEST__INIT;
    up.project = "ga";
    up.default_queue = "gq";
    p = (Kiln__Project *)tcall("UpdateProject", &up.base, &kiln__project__descriptor, &code, &err);
    cr_assert_not_null(p, "UpdateProject: %d %s", code, err.message);
    cr_assert_str_eq(p->default_queue, "gq");
    protobuf_c_message_free_unpacked(&p->base, NULL);
    rj = gt_rest(&K, "PATCH", "/v1/projects/gb", "{\"default_queue\": \"gq\"}", &st);
    cr_assert_eq(st, 200);
    json_decref(rj);

    /* UpdateQueue leaving ga out: FAILED_PRECONDITION, as REST's 409, with the same words */
    char *only_gb[] = {"gb"};
    Kiln__Queue patch = KILN__QUEUE__INIT;
    patch.projects = only_gb;
    patch.n_projects = 1;
    char *mask[] = {"projects"};
    Kiln__UpdateQueueRequest uq = KILN__UPDATE_QUEUE_REQUEST__INIT;
    uq.name = "gq";
    uq.queue = &patch;
    uq.update_mask = mask;
    uq.n_update_mask = 1;
    kiln_err_clear(&gerr);
    cr_assert_null(tcall("UpdateQueue", &uq.base, &kiln__queue__descriptor, &code, &gerr));
    rj = gt_rest(&K, "PATCH", "/v1/queues/gq", "{\"projects\": [\"gb\"]}", &st);
    cr_assert_str_eq(json_string_value(json_object_get(rj, "message")),
                     "queue \"gq\" is the default queue of project \"ga\", which projects would no longer let in");
    refused_alike(&gerr, code, 9 /* FAILED_PRECONDITION */, rj, st, 409, "queue.projects");
    json_decref(rj);

    /* UpdateProject's "" sets "default" again, as REST's null; then ga may be left out */
    up.default_queue = "";
    p = (Kiln__Project *)tcall("UpdateProject", &up.base, &kiln__project__descriptor, &code, &err);
    cr_assert_not_null(p, "UpdateProject: %d %s", code, err.message);
    cr_assert_str_eq(p->default_queue, "default");
    protobuf_c_message_free_unpacked(&p->base, NULL);
    rj = gt_rest(&K, "PATCH", "/v1/projects/gb", "{\"default_queue\": null}", &st);
    cr_assert_eq(st, 200);
    cr_assert_str_eq(json_string_value(json_object_get(rj, "default_queue")), "default");
    json_decref(rj);
    Kiln__Queue *q = (Kiln__Queue *)tcall("UpdateQueue", &uq.base, &kiln__queue__descriptor, &code, &err);
    cr_assert_not_null(q, "UpdateQueue: %d %s", code, err.message);
    cr_assert_eq(q->n_projects, 1);
    cr_assert_str_eq(q->projects[0], "gb");
    protobuf_c_message_free_unpacked(&q->base, NULL);
}
