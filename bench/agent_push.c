/* agent_push.c - throughput of the agent -> kilnd path: an in-process kilnd (service + gRPC
 * server) on the database given by KILN_DATABASE_URL, driven by the agent's gRPC client from
 * several threads: metric batches (PushMetrics), log batches (PushLogs), heartbeats, bare gRPC
 * round trips (an unknown method), and heartbeats each on a new connection (connect, handshake,
 * call, close). Security "on" is what a shared cluster runs: mutual TLS, the agent registered
 * with the join token and every call carrying its credential, each batch checked against the
 * ranks kilnd assigned it; "off" is plain text without credentials. "gate" (the default) is
 * kilnd's own listening socket with its per-address limit (grpc_gate.c), "direct" lets gRPC
 * accept itself, to measure what the gate costs. Not a test: prints rates, asserts nothing.
 * usage: KILN_DATABASE_URL='host=... dbname=...' build/bench/agent_push [seconds] [threads] [off|on]
 *        [gate|direct]
 * "on" needs KILN_TEST_TLS_DIR: a directory of scripts/make-certs.sh. */
#include "api/api.h"
#include "service/service.h"
#include "agent/agent.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef enum { OP_METRICS, OP_LOGS, OP_HEARTBEAT, OP_BARE, OP_CONNECT } op_t;

typedef struct run {
    agent_rpc_t *rpc;
    const agent_md_t *md;        /* the credential, or NULL */
    size_t n_md;
    op_t op;
    const char *worker_id, *job_id;
    double seconds;
    int thread;
    const char *addr;            /* OP_CONNECT: where to connect */
    const agent_tls_t *tls;      /* OP_CONNECT: NULL for plain text */
    long calls, items, errors;
    double bytes;                /* request bytes sent (the encoded messages) */
} run_t;

#define POINTS_PER_BATCH KILN_METRIC_BATCH_POINTS
#define LINES_PER_BATCH 1000

static void *run_main(void *arg)
{
    run_t *r = arg;
    Kiln__MetricPoint *pts = calloc(POINTS_PER_BATCH, sizeof(*pts));
    Kiln__MetricPoint **ptsp = calloc(POINTS_PER_BATCH, sizeof(*ptsp));
    Kiln__LogLine *lines = calloc(LINES_PER_BATCH, sizeof(*lines));
    Kiln__LogLine **linesp = calloc(LINES_PER_BATCH, sizeof(*linesp));
    /* Each client thread streams its own five metrics, step after step, as one rank's trainer
     * would (two threads interleaving step ranges of the same metric would look to kilnd like a
     * retried attempt, whose summaries are rebuilt from the stored points). */
    static const char *base[] = {"train_loss", "lr", "grad_norm", "step_time_ms", "tokens_per_s"};
    char names[5][48];
    for (int k = 0; k < 5; k++)
        snprintf(names[k], sizeof names[k], "%s_%d", base[k], r->thread);
    char text[] = "step 1234/5000 | loss 2.4100 | lr 3.0e-04 | norm 0.83 | 412.0 ms | 9943 tok/s | mfu 41.0%";
    int64_t step = (int64_t)r->thread * 1000000000;
    double end = kiln_mono_s() + r->seconds;
    while (kiln_mono_s() < end) {
        ProtobufCMessage *resp = NULL;
        kiln_err_t err;
        int rc = 0;
        long items = 0;
        if (r->op == OP_METRICS) {
            Kiln__MetricBatch b = KILN__METRIC_BATCH__INIT;
            for (int i = 0; i < POINTS_PER_BATCH; i++) {
                kiln__metric_point__init(&pts[i]);
                pts[i].name = names[i % 5];
                pts[i].step = step + i / 5;
                pts[i].value = 1.0 / (i + 1);
                pts[i].time_us = kiln_now_us();
                ptsp[i] = &pts[i];
            }
            step += POINTS_PER_BATCH / 5;
            b.worker_id = (char *)r->worker_id;
            b.job_id = (char *)r->job_id;
            b.attempt = 1;
            b.n_points = POINTS_PER_BATCH;
            b.points = ptsp;
            rc = agent_rpc_call(r->rpc, "/kiln.AgentService/PushMetrics", r->md, r->n_md, &b.base, &kiln__ack__descriptor, 30000,
                                 &resp, NULL, &err);
            items = POINTS_PER_BATCH;
            if (rc == 0)
                r->bytes += (double)protobuf_c_message_get_packed_size(&b.base);
        } else if (r->op == OP_LOGS) {
            Kiln__LogBatch b = KILN__LOG_BATCH__INIT;
            for (int i = 0; i < LINES_PER_BATCH; i++) {
                kiln__log_line__init(&lines[i]);
                lines[i].rank = 0;
                lines[i].time_us = kiln_now_us();
                lines[i].stream = "stdout";
                lines[i].line = text;
                linesp[i] = &lines[i];
            }
            b.worker_id = (char *)r->worker_id;
            b.job_id = (char *)r->job_id;
            b.attempt = 1;
            b.n_lines = LINES_PER_BATCH;
            b.lines = linesp;
            rc = agent_rpc_call(r->rpc, "/kiln.AgentService/PushLogs", r->md, r->n_md, &b.base, &kiln__ack__descriptor, 30000,
                                 &resp, NULL, &err);
            items = LINES_PER_BATCH;
            if (rc == 0)
                r->bytes += (double)protobuf_c_message_get_packed_size(&b.base);
        } else if (r->op == OP_CONNECT) {
            agent_rpc_t *fresh = NULL;
            Kiln__HeartbeatRequest h = KILN__HEARTBEAT_REQUEST__INIT;
            h.worker_id = (char *)r->worker_id;
            rc = agent_rpc_create(r->addr, r->tls, &fresh, &err);
            if (rc == 0)
                rc = agent_rpc_call(fresh, "/kiln.AgentService/Heartbeat", r->md, r->n_md, &h.base,
                                    &kiln__heartbeat_response__descriptor, 30000, &resp, NULL, &err);
            agent_rpc_destroy(fresh);
            items = 1;
        } else if (r->op == OP_HEARTBEAT) {
            Kiln__HeartbeatRequest h = KILN__HEARTBEAT_REQUEST__INIT;
            h.worker_id = (char *)r->worker_id;
            rc = agent_rpc_call(r->rpc, "/kiln.AgentService/Heartbeat", r->md, r->n_md, &h.base,
                                 &kiln__heartbeat_response__descriptor, 30000, &resp, NULL, &err);
            items = 1;
        } else {
            uint8_t *out = NULL;
            size_t len = 0;
            int code = 0;
            agent_rpc_call_raw(r->rpc, "/kiln.Bench/Nothing", r->md, r->n_md, "", 0, 30000, &out, &len, &code, &err);
            free(out);
            rc = code == 12 ? 0 : -1;
            items = 1;
        }
        if (resp)
            protobuf_c_message_free_unpacked(resp, NULL);
        if (rc == 0) {
            r->calls++;
            r->items += items;
        } else if (r->errors++ == 0) {
            fprintf(stderr, "agent_push: call failed: %s\n", err.message);
        }
    }
    free(pts);
    free(ptsp);
    free(lines);
    free(linesp);
    return NULL;
}

static const agent_md_t *bench_md;
static size_t bench_n_md;
static const char *bench_addr;
static const agent_tls_t *bench_tls;

static void measure(agent_rpc_t *rpc, op_t op, const char *label, const char *unit, const char *wid,
                    const char *jid, double seconds, int threads)
{
    run_t runs[16];
    pthread_t t[16];
    double t0 = kiln_mono_s();
    for (int i = 0; i < threads; i++) {
        runs[i] = (run_t){.rpc = rpc, .md = bench_md, .n_md = bench_n_md, .op = op, .worker_id = wid,
                          .job_id = jid, .seconds = seconds, .thread = i, .addr = bench_addr, .tls = bench_tls};
        pthread_create(&t[i], NULL, run_main, &runs[i]);
    }
    long calls = 0, items = 0, errors = 0;
    double bytes = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        calls += runs[i].calls;
        items += runs[i].items;
        errors += runs[i].errors;
        bytes += runs[i].bytes;
    }
    double dt = kiln_mono_s() - t0;
    char mbs[32] = "";
    if (bytes > 0)
        snprintf(mbs, sizeof mbs, ", %.1f MB/s", bytes / dt / 1e6);
    printf("%-28s %10.0f %s/s  (%ld calls, %.0f calls/s%s, %d threads, %.1f s, %ld errors)\n", label, items / dt,
           unit, calls, calls / dt, mbs, threads, dt, errors);
    fflush(stdout);
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

int main(int argc, char **argv)
{
    log_init("agent_push");
    log_set_level(LOG_WARN);
    const char *url = getenv("KILN_DATABASE_URL");
    if (!url) {
        fprintf(stderr, "usage: KILN_DATABASE_URL='host=... dbname=...' %s [seconds] [threads]\n", argv[0]);
        return 2;
    }
    double seconds = argc > 1 ? atof(argv[1]) : 5;
    int threads = argc > 2 ? atoi(argv[2]) : 2;
    bool secure = argc > 3 && !strcmp(argv[3], "on");
    bool direct = argc > 4 && !strcmp(argv[4], "direct");
    if (threads < 1 || threads > 16)
        threads = 2;
    svc_t *s = NULL;
    api_grpc_t *g = NULL;
    agent_rpc_t *rpc = NULL;
    kiln_err_t err;
    const char *tls_dir = getenv("KILN_TEST_TLS_DIR");
    char files[6][512], join[600];
    char *pem[3] = {NULL, NULL, NULL};
    if (secure) {
        if (!tls_dir) {
            fprintf(stderr, "agent_push: security on needs KILN_TEST_TLS_DIR (bash scripts/make-certs.sh DIR)\n");
            return 2;
        }
        static const char *const names[6] = {"server.pem", "server.key", "ca.pem", "agent.pem", "agent.key", "join.token"};
        for (int i = 0; i < 6; i++)
            snprintf(files[i], sizeof(files[i]), "%s/%s", tls_dir, names[i]);
        for (int i = 0; i < 3; i++)
            if (kiln_file_read(files[i], &pem[i], NULL, &err) != 0) {
                fprintf(stderr, "agent_push: %s\n", err.message);
                return 1;
            }
    }
    svc_config_t cfg = {.database_url = url, .auth_disabled = !secure, .join_token_file = secure ? files[5] : NULL};
    if (svc_create(&cfg, &s, &err) != 0) {
        fprintf(stderr, "agent_push: %s\n", err.message);
        return 1;
    }
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", free_port());
    api_tls_t stls = {.cert_pem = pem[0], .key_pem = pem[1], .ca_pem = pem[2]};
    agent_tls_t ctls = {.ca_file = files[2], .cert_file = files[3], .key_file = files[4]};
    api_grpc_config_t gcfg = {.addr = addr, .tls = secure ? &stls : NULL, .gate_off = direct};
    bench_addr = addr;
    bench_tls = secure ? &ctls : NULL;
    if (api_grpc_start_with(s, &gcfg, &g, &err) != 0 ||
        agent_rpc_create(addr, secure ? &ctls : NULL, &rpc, &err) != 0) {
        fprintf(stderr, "agent_push: %s\n", err.message);
        return 1;
    }
    agent_md_t md[1];
    if (secure) {
        char *tok = NULL;
        if (kiln_file_read(files[5], &tok, NULL, &err) != 0) {
            fprintf(stderr, "agent_push: %s\n", err.message);
            return 1;
        }
        tok[strcspn(tok, "\n")] = '\0';
        snprintf(join, sizeof(join), "Bearer %s", tok);
        free(tok);
        md[0] = (agent_md_t){"authorization", join};
    }
    Kiln__RegisterRequest reg = KILN__REGISTER_REQUEST__INIT;
    reg.hostname = "bench";
    reg.address = "127.0.0.1";
    reg.slots = 1;
    reg.slot_type = "cpu";
    ProtobufCMessage *resp = NULL;
    if (agent_rpc_call(rpc, "/kiln.AgentService/RegisterWorker", md, secure, &reg.base,
                        &kiln__register_response__descriptor, 10000, &resp, NULL, &err) != 0) {
        fprintf(stderr, "agent_push: register: %s\n", err.message);
        return 1;
    }
    char *wid = strdup(((Kiln__RegisterResponse *)resp)->worker_id);
    static char credential[600];
    snprintf(credential, sizeof(credential), "Bearer %s", ((Kiln__RegisterResponse *)resp)->credential);
    protobuf_c_message_free_unpacked(resp, NULL);
    static agent_md_t cred_md[1];
    cred_md[0] = (agent_md_t){"authorization", credential};
    bench_md = secure ? cred_md : NULL;
    bench_n_md = secure ? 1 : 0;
    /* a job for the bench worker to push into: kilnd places it there (one slot, one rank) */
    json_t *spec = json_loads("{\"name\":\"bench\",\"model\":{\"type\":\"mlp\",\"hidden\":[8],\"n_inputs\":4,"
                              "\"n_classes\":2},\"data\":{\"train\":\"synthetic\"},\"resources\":{\"nodes\":1,"
                              "\"slots_per_node\":1}}", 0, NULL);
    json_t *job = NULL;
    bool created;
    if (svc_job_create(s, svc_caller_kilnd(), spec, NULL, &job, &created, &err) != 0) {
        fprintf(stderr, "agent_push: job: %s\n", err.message);
        return 1;
    }
    const char *jid = json_string_value(json_object_get(job, "id"));
    for (int i = 0; i < 200; i++) {
        json_t *j = NULL;
        bool placed = svc_job_get(s, svc_caller_kilnd(), jid, &j, &err) == 0 &&
                      json_integer_value(json_object_get(j, "attempt")) == 1;
        json_decref(j);
        if (placed)
            break;
        usleep(50000);
    }
    printf("agent -> kilnd over gRPC, security %s%s, %d client thread(s), kilnd in process, %s, %ld cores online\n",
           secure ? "on" : "off", secure ? " (mutual TLS, credential, rank checks)" : " (plain text)", threads,
           direct ? "gRPC accepts itself (no gate)" : "through kilnd's gate", sysconf(_SC_NPROCESSORS_ONLN));
    measure(rpc, OP_CONNECT, "new connection + Heartbeat", "calls", wid, jid, seconds, threads);
    measure(rpc, OP_BARE, "bare round trip (UNIMPL.)", "calls", wid, jid, seconds, threads);
    measure(rpc, OP_HEARTBEAT, "Heartbeat", "calls", wid, jid, seconds, threads);
    measure(rpc, OP_METRICS, "PushMetrics (5000/batch)", "points", wid, jid, seconds, threads);
    measure(rpc, OP_LOGS, "PushLogs (1000/batch)", "lines", wid, jid, seconds, threads);
    json_decref(spec);
    json_decref(job);
    free(wid);
    agent_rpc_destroy(rpc);
    api_grpc_stop(g);
    svc_destroy(s);
    for (int i = 0; i < 3; i++)
        free(pem[i]);
    return 0;
}
