/* follow_bench.c - a live follower's latency across kilnd replicas under heavy ingest: an agent
 * (the agent's own gRPC client, mutual TLS and its credential, as kiln-agent) registers with
 * replica A, gets a one-rank job placed on it, reports the rank started and heartbeats with it,
 * then pushes metric points at a fixed rate (default 200,000 points/s, numbered batches as
 * kiln-agent sends them) and log lines at a fixed rate (default 1,000 lines/s), each line carrying
 * the wall-clock time it was sent. A follower on replica B (GET /v1/jobs/ID/logs?follow=true,
 * Server-Sent Events, libcurl, TLS and an API token) takes every line and records how long after
 * its sending it arrived: PushLogs to A, A's commit, A's NOTIFY, B's read of the new lines, the
 * SSE write and the TLS read. Prints the ingest rates reached and the latency percentiles; counts
 * lines sent, received and missing. Not a test: it asserts nothing.
 * usage: follow_bench --grpc A_HOST:PORT --url https://B_HOST:PORT --ca CA.pem --token-file ADMIN
 *                     --tls-dir DIR (agent.pem, agent.key, join.token of scripts/make-certs.sh)
 *                     [--seconds S] [--points-rate P] [--lines-rate L] [--threads T] */
#include "agent/agent.h"
#include "base/base.h"

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define POINTS_PER_BATCH 2000
#define MAX_THREADS 8

static agent_rpc_t *rpc;
static agent_md_t cred_md[1];
static char worker_id[128], job_id[64], auth_header[640];
static const char *url_b, *ca_file;
static int attempt;
static atomic_bool stop_hb, stop_follow, follow_open;
static double seconds = 10, points_rate = 200000, lines_rate = 1000;
static int nthreads = 2;

static int64_t wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "follow_bench: %s: %s\n", what, msg);
    exit(1);
}

/* ---- REST (replica B) ---------------------------------------------------------------------- */

typedef struct buf {
    char *p;
    size_t n;
} buf_t;

static size_t buf_write(char *d, size_t sz, size_t n, void *u)
{
    buf_t *b = u;
    b->p = realloc(b->p, b->n + sz * n + 1);
    memcpy(b->p + b->n, d, sz * n);
    b->n += sz * n;
    b->p[b->n] = '\0';
    return sz * n;
}

static json_t *rest(const char *method, const char *path, const char *body, long *status)
{
    CURL *h = curl_easy_init();
    char url[512];
    snprintf(url, sizeof url, "%s%s", url_b, path);
    struct curl_slist *hd = curl_slist_append(NULL, auth_header);
    hd = curl_slist_append(hd, "Content-Type: application/json");
    buf_t b = {0};
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(h, CURLOPT_CAINFO, ca_file);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, buf_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 30L);
    if (body)
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    CURLcode rc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    curl_slist_free_all(hd);
    curl_easy_cleanup(h);
    if (rc != CURLE_OK)
        die(path, curl_easy_strerror(rc));
    json_t *j = json_loads(b.p ? b.p : "", 0, NULL);
    free(b.p);
    return j;
}

/* ---- the follower (replica B) ---------------------------------------------------------------- */

typedef struct follow {
    buf_t b;
    int64_t *lat;              /* microseconds, one per live line */
    size_t nlat, cap;
    long lines, ends;
} follow_t;

static size_t follow_write(char *d, size_t sz, size_t n, void *u)
{
    follow_t *f = u;
    atomic_store(&follow_open, true);
    buf_write(d, sz, n, &f->b);
    int64_t now = wall_us();
    char *p = f->b.p, *nl;
    while ((nl = strchr(p, '\n')) != NULL) {
        *nl = '\0';
        if (!strncmp(p, "event: end", 10))
            f->ends++;
        else if (!strncmp(p, "data: ", 6)) {
            json_t *j = json_loads(p + 6, 0, NULL);
            const char *line = json_string_value(json_object_get(j, "line"));
            long long sent;
            if (line && sscanf(line, "bench t=%lld", &sent) == 1) {
                if (f->nlat == f->cap) {
                    f->cap = f->cap ? 2 * f->cap : 65536;
                    f->lat = realloc(f->lat, f->cap * sizeof *f->lat);
                }
                f->lat[f->nlat++] = now - sent;
            }
            f->lines++;
            json_decref(j);
        }
        p = nl + 1;
    }
    f->b.n -= (size_t)(p - f->b.p);
    memmove(f->b.p, p, f->b.n + 1);
    return sz * n;
}

static int follow_progress(void *u, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
    (void)u, (void)a, (void)b, (void)c, (void)d;
    return atomic_load(&stop_follow) ? 1 : 0;
}

static void *follow_main(void *arg)
{
    follow_t *f = arg;
    CURL *h = curl_easy_init();
    char url[512];
    snprintf(url, sizeof url, "%s/v1/jobs/%s/logs?follow=true", url_b, job_id);
    struct curl_slist *hd = curl_slist_append(NULL, auth_header);
    hd = curl_slist_append(hd, "Accept: text/event-stream");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(h, CURLOPT_CAINFO, ca_file);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, follow_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, f);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, follow_progress);
    curl_easy_perform(h);
    curl_slist_free_all(hd);
    curl_easy_cleanup(h);
    return NULL;
}

/* ---- the agent (replica A) ----------------------------------------------------------------- */

static int call(const char *method, ProtobufCMessage *req, const ProtobufCMessageDescriptor *rd,
                ProtobufCMessage **resp, kiln_err_t *err)
{
    return agent_rpc_call(rpc, method, cred_md, 1, req, rd, 30000, resp, NULL, err);
}

static void heartbeat(bool running)
{
    Kiln__HeartbeatRequest h = KILN__HEARTBEAT_REQUEST__INIT;
    Kiln__RunningRank rr = KILN__RUNNING_RANK__INIT, *rrp = &rr;
    h.worker_id = worker_id;
    if (running) {
        rr.job_id = job_id;
        rr.attempt = attempt;
        rr.rank = 0;
        rr.pid = (int32_t)getpid();
        h.n_running = 1;
        h.running = &rrp;
    }
    ProtobufCMessage *resp = NULL;
    kiln_err_t err;
    if (call("/kiln.AgentService/Heartbeat", &h.base, &kiln__heartbeat_response__descriptor, &resp, &err))
        fprintf(stderr, "follow_bench: heartbeat: %s\n", err.message);
    Kiln__HeartbeatResponse *r = (Kiln__HeartbeatResponse *)resp;
    for (size_t i = 0; r && i < r->n_assignments && !attempt; i++)
        if (!strcmp(r->assignments[i]->job_id, job_id))
            attempt = r->assignments[i]->attempt;
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
}

static void *heartbeat_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop_hb)) {
        heartbeat(true);
        usleep(500000);
    }
    return NULL;
}

typedef struct pusher {
    int thread;
    bool logs;
    long items, calls, errors;
    double dt;
} pusher_t;

static void *push_main(void *arg)
{
    pusher_t *p = arg;
    /* Each metric thread streams its own five metrics, step after step, as one rank's trainer
     * would (two threads interleaving step ranges of the same metric would look to kilnd like a
     * retried attempt, whose summaries are rebuilt from the stored points). */
    static const char *base[] = {"train_loss", "lr", "grad_norm", "step_time_ms", "tokens_per_s"};
    char names[5][48];
    for (int k = 0; k < 5; k++)
        snprintf(names[k], sizeof names[k], "%s_%d", base[k], p->thread);
    double rate = p->logs ? lines_rate : points_rate / nthreads;
    int per_batch = p->logs ? KILN_MIN(KILN_LOG_BATCH_LINES, KILN_MAX(1, (int)(lines_rate / 100))) : POINTS_PER_BATCH;
    Kiln__MetricPoint *pts = calloc((size_t)per_batch, sizeof *pts);
    Kiln__LogLine *lines = calloc((size_t)per_batch, sizeof *lines);
    void **ptrs = calloc((size_t)per_batch, sizeof *ptrs);
    char (*text)[96] = calloc((size_t)per_batch, sizeof *text);
    uint64_t stream_id = ((uint64_t)getpid() << 16) ^ ((uint64_t)p->thread + 1) ^ ((uint64_t)p->logs << 40);
    int64_t step = (int64_t)p->thread * 1000000000;
    double t0 = kiln_mono_s();
    for (uint64_t seq = 1;; seq++) {
        /* batch k is due at t0 + k * per_batch / rate (late ones go at once) */
        double due = t0 + (double)(seq - 1) * per_batch / rate, now = kiln_mono_s();
        if (now - t0 >= seconds)
            break;
        if (due > now)
            usleep((useconds_t)((due - now) * 1e6));
        ProtobufCMessage *resp = NULL;
        kiln_err_t err;
        int rc;
        if (p->logs) {
            Kiln__LogBatch b = KILN__LOG_BATCH__INIT;
            int64_t t = wall_us();
            for (int i = 0; i < per_batch; i++) {
                kiln__log_line__init(&lines[i]);
                snprintf(text[i], sizeof text[i], "bench t=%lld n=%llu/%d | loss 2.4100", (long long)t,
                         (unsigned long long)seq, i);
                lines[i].time_us = t;
                lines[i].stream = "stdout";
                lines[i].line = text[i];
                ptrs[i] = &lines[i];
            }
            b.worker_id = worker_id;
            b.job_id = job_id;
            b.attempt = attempt;
            b.n_lines = (size_t)per_batch;
            b.lines = (Kiln__LogLine **)ptrs;
            b.stream_id = stream_id;
            b.batch_seq = seq;
            rc = call("/kiln.AgentService/PushLogs", &b.base, &kiln__ack__descriptor, &resp, &err);
        } else {
            Kiln__MetricBatch b = KILN__METRIC_BATCH__INIT;
            for (int i = 0; i < per_batch; i++) {
                kiln__metric_point__init(&pts[i]);
                pts[i].name = names[i % 5];
                pts[i].step = step + i / 5;
                pts[i].value = 1.0 / (i + 1);
                pts[i].time_us = wall_us();
                ptrs[i] = &pts[i];
            }
            step += per_batch / 5;
            b.worker_id = worker_id;
            b.job_id = job_id;
            b.attempt = attempt;
            b.n_points = (size_t)per_batch;
            b.points = (Kiln__MetricPoint **)ptrs;
            b.stream_id = stream_id;
            b.batch_seq = seq;
            rc = call("/kiln.AgentService/PushMetrics", &b.base, &kiln__ack__descriptor, &resp, &err);
        }
        if (resp)
            protobuf_c_message_free_unpacked(resp, NULL);
        if (rc == 0) {
            p->calls++;
            p->items += per_batch;
        } else if (p->errors++ == 0) {
            fprintf(stderr, "follow_bench: push failed: %s\n", err.message);
        }
    }
    p->dt = kiln_mono_s() - t0;
    free(pts);
    free(lines);
    free(ptrs);
    free(text);
    return NULL;
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static char *read_line(const char *path)
{
    char *t = NULL;
    kiln_err_t err;
    if (kiln_file_read(path, &t, NULL, &err))
        die(path, err.message);
    t[strcspn(t, "\r\n")] = '\0';
    return t;
}

int main(int argc, char **argv)
{
    const char *grpc = NULL, *token_file = NULL, *tls_dir = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--grpc")) grpc = v;
        else if (!strcmp(a, "--url")) url_b = v;
        else if (!strcmp(a, "--ca")) ca_file = v;
        else if (!strcmp(a, "--token-file")) token_file = v;
        else if (!strcmp(a, "--tls-dir")) tls_dir = v;
        else if (!strcmp(a, "--seconds")) seconds = atof(v);
        else if (!strcmp(a, "--points-rate")) points_rate = atof(v);
        else if (!strcmp(a, "--lines-rate")) lines_rate = atof(v);
        else if (!strcmp(a, "--threads")) nthreads = atoi(v);
        else die("unknown flag", a);
    }
    if (!grpc || !url_b || !ca_file || !token_file || !tls_dir || seconds <= 0 || points_rate < 0 ||
        lines_rate < 100 || nthreads < 1 || nthreads > MAX_THREADS)
        die("usage", "--grpc A --url https://B --ca CA --token-file ADMIN --tls-dir DIR [--seconds S] "
                     "[--points-rate P] [--lines-rate L>=100] [--threads T<=8]");
    log_init("follow_bench");
    log_set_level(LOG_WARN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    char *tok = read_line(token_file);
    snprintf(auth_header, sizeof auth_header, "Authorization: Bearer %s", tok);
    free(tok);

    /* The agent: registered with the join token, then its credential on every call. */
    char ca[512], cert[512], key[512], join_path[512], join[600];
    snprintf(ca, sizeof ca, "%s/ca.pem", tls_dir);
    snprintf(cert, sizeof cert, "%s/agent.pem", tls_dir);
    snprintf(key, sizeof key, "%s/agent.key", tls_dir);
    snprintf(join_path, sizeof join_path, "%s/join.token", tls_dir);
    kiln_err_t err;
    agent_tls_t tls = {.ca_file = ca, .cert_file = cert, .key_file = key};
    if (agent_rpc_create(grpc, &tls, &rpc, &err))
        die("gRPC channel", err.message);
    tok = read_line(join_path);
    snprintf(join, sizeof join, "Bearer %s", tok);
    free(tok);
    agent_md_t jmd[1] = {{"authorization", join}};
    Kiln__RegisterRequest reg = KILN__REGISTER_REQUEST__INIT;
    reg.hostname = "follow-bench";
    reg.address = "127.0.0.1";
    reg.slots = 1;
    reg.slot_type = "cpu";
    ProtobufCMessage *resp = NULL;
    if (agent_rpc_call(rpc, "/kiln.AgentService/RegisterWorker", jmd, 1, &reg.base,
                       &kiln__register_response__descriptor, 10000, &resp, NULL, &err))
        die("register", err.message);
    Kiln__RegisterResponse *rr = (Kiln__RegisterResponse *)resp;
    snprintf(worker_id, sizeof worker_id, "%s", rr->worker_id);
    static char credential[600];
    snprintf(credential, sizeof credential, "Bearer %s", rr->credential);
    cred_md[0] = (agent_md_t){"authorization", credential};
    protobuf_c_message_free_unpacked(resp, NULL);

    /* A one-rank job, submitted on replica B, placed on this agent by whichever replica leads. */
    long st = 0;
    json_t *job = rest("POST", "/v1/jobs",
                       "{\"name\":\"follow-bench\",\"model\":{\"type\":\"mlp\",\"hidden\":[8],\"n_inputs\":4,"
                       "\"n_classes\":2},\"data\":{\"train\":\"synthetic\"},\"resources\":{\"nodes\":1,"
                       "\"slots_per_node\":1,\"slot_type\":\"cpu\"},\"priority\":1000}",
                       &st);
    if (st != 201)
        die("create job", json_dumps(job, 0));
    snprintf(job_id, sizeof job_id, "%s", json_string_value(json_object_get(job, "id")));
    json_decref(job);
    for (int i = 0; i < 100 && !attempt; i++) {
        heartbeat(false);
        if (!attempt)
            usleep(100000);
    }
    if (!attempt)
        die("placement", "the job was not assigned to the bench agent within 10 s");
    Kiln__RankStatus rs = KILN__RANK_STATUS__INIT;
    rs.worker_id = worker_id;
    rs.job_id = job_id;
    rs.attempt = attempt;
    rs.started = true;
    resp = NULL;
    if (call("/kiln.AgentService/ReportRankStatus", &rs.base, &kiln__ack__descriptor, &resp, &err))
        die("rank status", err.message);
    protobuf_c_message_free_unpacked(resp, NULL);
    pthread_t hb;
    pthread_create(&hb, NULL, heartbeat_main, NULL);

    /* The follower on B, connected before the first line is sent. */
    follow_t f = {0};
    pthread_t ft;
    pthread_create(&ft, NULL, follow_main, &f);
    for (int i = 0; i < 100 && !atomic_load(&follow_open); i++)
        usleep(50000);
    if (!atomic_load(&follow_open))
        usleep(500000); /* an SSE stream may send nothing until the first line */

    pusher_t ps[MAX_THREADS + 1];
    pthread_t pt[MAX_THREADS + 1];
    for (int i = 0; i <= nthreads; i++) {
        ps[i] = (pusher_t){.thread = i, .logs = i == nthreads};
        pthread_create(&pt[i], NULL, push_main, &ps[i]);
    }
    long points = 0, lines = 0, errors = 0;
    double dt = 0;
    for (int i = 0; i <= nthreads; i++) {
        pthread_join(pt[i], NULL);
        if (ps[i].logs)
            lines += ps[i].items;
        else
            points += ps[i].items;
        errors += ps[i].errors;
        dt = KILN_MAX(dt, ps[i].dt);
    }
    /* the lines still on their way */
    for (int i = 0; i < 100 && (long)f.nlat < lines; i++)
        usleep(50000);
    atomic_store(&stop_follow, true);
    pthread_join(ft, NULL);
    atomic_store(&stop_hb, true);
    pthread_join(hb, NULL);

    qsort(f.lat, f.nlat, sizeof *f.lat, cmp64);
#define PCT(p) (f.nlat ? f.lat[(size_t)((p) / 100.0 * (double)(f.nlat - 1) + 0.5)] / 1000.0 : 0.0)
    printf("ingest to replica A over gRPC (%d metric threads + 1 log thread, %.1f s): %.0f points/s "
           "(target %.0f), %.0f lines/s (target %.0f), %ld failed calls\n",
           nthreads, dt, points / dt, points_rate, lines / dt, lines_rate, errors);
    printf("follower on replica B (SSE): %zu of %ld lines received, %ld missing\n", f.nlat, lines,
           lines - (long)f.nlat);
    printf("latency send -> SSE line (ms): p50 %.2f  p90 %.2f  p99 %.2f  p99.9 %.2f  max %.2f\n", PCT(50), PCT(90),
           PCT(99), PCT(99.9), f.nlat ? f.lat[f.nlat - 1] / 1000.0 : 0.0);
    fflush(stdout);
    free(f.lat);
    free(f.b.p);
    agent_rpc_destroy(rpc);
    curl_global_cleanup();
    return 0;
}
