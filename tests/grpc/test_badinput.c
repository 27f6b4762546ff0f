/* test_badinput.c - the bad-input corpus: requests that once made kilnd answer "the database is
 * unavailable", accept what REST refuses, or answer in HTML, sent to an in-process kilnd (service
 * on a fresh database, REST and gRPC servers, authentication on) over REST (libcurl and a raw
 * socket) and over gRPC (Python's grpcio as a foreign client, tests/grpc/grpc_client.py). One
 * table per transport: each case's status and the field the error names. No case may be a 5xx
 * or UNAVAILABLE, and every REST error body is kiln's JSON error. And the combinations the
 * engine's capability table (spec.h) refuses, generated from the table, refused with its field,
 * message and hint over REST, gRPC and kiln-train --spec alike; so are the tuning refusals the
 * corpus lacks (empty objective metric, more than 30 parameters, a grid larger than max_jobs, an
 * objective an engine job never reports). */
#include "spec/spec.h"
#include "tests/grpc/grpc_test.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static gt_kilnd_t K;
static svc_t *S;
static const char *const dir = K.dir, *const base = K.base, *const admin_token = K.admin_token,
                         *const join_token = K.join_token;
static char job_id[64];
static int http_port;

static void setup(void)
{
    kiln_err_t err;
    gt_start(&K, &(gt_opts_t){.name = "badin", .auth = true, .artifacts = "artifacts", .http = true,
                              .svc = {.heartbeat_interval_ms = 500, .heartbeat_timeout_ms = 60000,
                                      .sched_interval_ms = 50}});
    S = K.svc;
    http_port = K.http_port;

    /* One worker whose data root is /tmp, and one job to aim requests at. */
    arena_t a;
    arena_init(&a, 0);
    Kiln__RegisterRequest req = KILN__REGISTER_REQUEST__INIT;
    Kiln__RegisterResponse out = KILN__REGISTER_RESPONSE__INIT;
    char *roots[] = {"/tmp"};
    req.hostname = "h";
    req.address = "127.0.0.1";
    req.slots = 2;
    req.slot_type = "cpu";
    req.version = "test";
    req.data_roots = roots;
    req.n_data_roots = 1;
    cr_assert_eq(svc_agent_register(S, &req, NULL, &a, &out, &err), 0, "%s", err.message);
    arena_deinit(&a);
    json_t *spec = json_pack("{s:s, s:{s:s}, s:{s:s}}", "name", "target", "model", "type", "gpt", "data", "train",
                             "/tmp/x.txt");
    json_t *job = NULL;
    bool created = false;
    cr_assert_eq(svc_job_create(S, svc_caller_kilnd(), spec, "the-key", &job, &created, &err), 0, "%s", err.message);
    snprintf(job_id, sizeof job_id, "%s", json_string_value(json_object_get(job, "id")));
    json_decref(job);
    json_decref(spec);
}

static void teardown(void)
{
    gt_stop(&K);
}

TestSuite(badinput, .init = setup, .fini = teardown, .timeout = 180);

/* ---- REST ------------------------------------------------------------------------------------ */

#define GOOD_SPEC "{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/tmp/x.txt\"}}"

typedef struct rest_case {
    const char *what;
    const char *method;
    const char *path;            /* "{id}" is replaced by the job's id */
    const char *header;          /* one extra header line, or NULL */
    const char *body;            /* or NULL */
    long status;
    const char *field;           /* the error's field; "" when none is named */
} rest_case_t;

static const rest_case_t rest_cases[] = {
    {"tuning range with min >= max", "POST", "/v1/tuning-jobs", NULL,
     "{\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 500}}, \"objective\": {\"metric\": \"val_loss\"}, \"parameters\": {\"lr\": {\"type\": \"continuous\", \"min\": 0.1, \"max\": 0.01}}}", 400, "parameters.lr.min"},
    {"tuning log scaling from 0", "POST", "/v1/tuning-jobs", NULL,
     "{\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 500}}, \"objective\": {\"metric\": \"val_loss\"}, \"parameters\": {\"weight_decay\": {\"type\": \"continuous\", \"min\": 0, \"max\": 0.1, \"scaling\": \"log\"}}}", 400, "parameters.weight_decay.min"},
    {"tuning categorical value the job refuses", "POST", "/v1/tuning-jobs", NULL,
     "{\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 500}}, \"objective\": {\"metric\": \"val_loss\"}, \"parameters\": {\"model.n_head\": {\"type\": \"categorical\", \"values\": [2, 5]}}}", 400, "parameters.model.n_head.values[1]"},
    {"tuning path the job lacks", "POST", "/v1/tuning-jobs", NULL,
     "{\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 500}}, \"objective\": {\"metric\": \"val_loss\"}, \"parameters\": {\"model.depth\": {\"type\": \"integer\", \"min\": 1, \"max\": 2}}}", 400, "parameters.model.depth"},
    {"tuning warm start from more than 5 parents", "POST", "/v1/tuning-jobs", NULL,
     "{\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 500}}, \"objective\": {\"metric\": \"val_loss\"}, \"parameters\": {\"lr\": {\"type\": \"continuous\", \"min\": 0.001, \"max\": 0.01}}, \"warm_start\": {\"parents\": [\"00000000-0000-4000-8000-000000000001\", \"00000000-0000-4000-8000-000000000002\", \"00000000-0000-4000-8000-000000000003\", \"00000000-0000-4000-8000-000000000004\", \"00000000-0000-4000-8000-000000000005\", \"00000000-0000-4000-8000-000000000006\"], \"type\": \"transfer_learning\"}}", 400, "warm_start.parents"},
    {"tuning warm start from a missing parent", "POST", "/v1/tuning-jobs", NULL,
     "{\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 500}}, \"objective\": {\"metric\": \"val_loss\"}, \"parameters\": {\"lr\": {\"type\": \"continuous\", \"min\": 0.001, \"max\": 0.01}}, \"warm_start\": {\"parents\": [\"00000000-0000-4000-8000-000000000001\"], \"type\": \"transfer_learning\"}}", 400, "warm_start.parents[0]"},
    {"tuning warm start of no known type", "POST", "/v1/tuning-jobs", NULL,
     "{\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 500}}, \"objective\": {\"metric\": \"val_loss\"}, \"parameters\": {\"lr\": {\"type\": \"continuous\", \"min\": 0.001, \"max\": 0.01}}, \"warm_start\": {\"parents\": [\"00000000-0000-4000-8000-000000000001\"], \"type\": \"identical\"}}", 400, "warm_start.type"},
    {"tuning integer range past 2^53", "POST", "/v1/tuning-jobs", NULL,
     "{\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 500}}, \"objective\": {\"metric\": \"val_loss\"}, \"parameters\": {\"warmup_steps\": {\"type\": \"integer\", \"min\": 0, \"max\": 1e300}}}", 400, "parameters.warmup_steps.max"},
    {"tuning max_parallel_jobs above max_jobs", "POST", "/v1/tuning-jobs", NULL,
     "{\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 500}}, \"objective\": {\"metric\": \"val_loss\"}, \"parameters\": {\"lr\": {\"type\": \"continuous\", \"min\": 0.001, \"max\": 0.01}}, \"max_jobs\": 2, \"max_parallel_jobs\": 3}", 400, "max_parallel_jobs"},
    {"tag not UTF-8", "GET", "/v1/jobs?tag=%FF%FE", NULL, NULL, 400, "tag"},
    {"metric name not UTF-8", "GET", "/v1/jobs/{id}/metrics?name=%FF%FE", NULL, NULL, 400, "name"},
    {"gradient_dtype fp16", "POST", "/v1/jobs", NULL,
     "{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"resources\": {\"nodes\": 2}, "
     "\"distribution\": {\"data_parallel\": {\"gradient_dtype\": \"fp16\"}}}", 400,
     "distribution.data_parallel.gradient_dtype"},
    {"metric definition with both Name and name", "POST", "/v1/jobs", NULL,
     "{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"metric_definitions\": "
     "[{\"Name\": \"acc\", \"name\": \"acc2\", \"regex\": \"acc ([0-9.]+)\"}]}", 400, "metric_definitions[0].Name"},
    {"Idempotency-Key not UTF-8", "POST", "/v1/jobs", "Idempotency-Key: \xff\xfe", GOOD_SPEC, 400, "Idempotency-Key"},
    {"Idempotency-Key of 10,000 characters", "POST", "/v1/jobs", "Idempotency-Key: @10000", GOOD_SPEC, 400,
     "Idempotency-Key"},
    {"Idempotency-Key reused with another body", "POST", "/v1/jobs", "Idempotency-Key: the-key",
     "{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/tmp/other.txt\"}}", 422, "Idempotency-Key"},
    {"page token past year 9999", "GET", "/v1/jobs?page_token=9223372036854775807_00000000-0000-0000-0000-000000000000",
     NULL, NULL, 400, "page_token"},
    {"page token not a token", "GET", "/v1/jobs?page_token=%FF", NULL, NULL, 400, "page_token"},
    {"page_size 0", "GET", "/v1/jobs?page_size=0", NULL, NULL, 400, "page_size"},
    {"page_size -1", "GET", "/v1/jobs?page_size=-1", NULL, NULL, 400, "page_size"},
    {"page_size 501", "GET", "/v1/jobs?page_size=501", NULL, NULL, 400, "page_size"},
    {"page_size +5", "GET", "/v1/jobs?page_size=%2B5", NULL, NULL, 400, "page_size"},
    {"page_size 5 with a space", "GET", "/v1/jobs?page_size=%205", NULL, NULL, 400, "page_size"},
    {"status ,", "GET", "/v1/jobs?status=%2C", NULL, NULL, 400, "status"},
    {"status unknown", "GET", "/v1/jobs?status=RUNNING,NAPPING", NULL, NULL, 400, "status"},
    {"%00 after a job id", "GET", "/v1/jobs/{id}%00", NULL, NULL, 400, "id"},
    {"%00 inside a job id", "GET", "/v1/jobs/{id}%00junk/events", NULL, NULL, 400, "id"},
    {"%00 in a project name", "GET", "/v1/projects/default%00/members", NULL, NULL, 400, "project"},
    {"%00 in a query parameter", "GET", "/v1/jobs?tag=team%00x", NULL, NULL, 400, "tag"},
    {"logs since NaN", "GET", "/v1/jobs/{id}/logs?since=nan", NULL, NULL, 400, "since"},
    {"logs since the year 1", "GET", "/v1/jobs/{id}/logs?since=0001-01-01T00:00:00Z", NULL, NULL, 400, "since"},
    {"logs limit 1e3", "GET", "/v1/jobs/{id}/logs?limit=1e3", NULL, NULL, 400, "limit"},
    {"logs rank +1", "GET", "/v1/jobs/{id}/logs?rank=%2B1", NULL, NULL, 400, "rank"},
    {"logs follow maybe", "GET", "/v1/jobs/{id}/logs?follow=maybe", NULL, NULL, 400, "follow"},
    {"Last-Event-ID not a number", "GET", "/v1/jobs/{id}/logs?follow=true", "Last-Event-ID: 12abc", NULL, 400,
     "Last-Event-ID"},
    {"metrics max_points 0", "GET", "/v1/jobs/{id}/metrics?max_points=0", NULL, NULL, 400, "max_points"},
    {"metrics attempt 0", "GET", "/v1/jobs/{id}/metrics?attempt=0", NULL, NULL, 400, "attempt"},
    {"metrics attempt +1", "GET", "/v1/jobs/{id}/metrics?attempt=%2B1", NULL, NULL, 400, "attempt"},
    {"metrics max_points 1e3", "GET", "/v1/jobs/{id}/metrics?max_points=1e3", NULL, NULL, 400, "max_points"},
    {"filter not UTF-8", "GET", "/v1/jobs?filter=%FF%FE", NULL, NULL, 400, "filter"},
    {"%00 in a filter", "GET", "/v1/jobs?filter=name%20%3D%20%22a%00%22", NULL, NULL, 400, "filter"},
    {"order_by not UTF-8", "GET", "/v1/jobs?order_by=%C0%AF", NULL, NULL, 400, "order_by"},
    {"%00 in columns", "GET", "/v1/jobs?columns=hp.lr%00", NULL, NULL, 400, "columns"},
    {"page_size 1e2", "GET", "/v1/jobs?page_size=1e2", NULL, NULL, 400, "page_size"},
    {"search page_size 501", "POST", "/v1/jobs:search", NULL, "{\"page_size\": 501}", 400, "page_size"},
    {"search page_size 2.5", "POST", "/v1/jobs:search", NULL, "{\"page_size\": 2.5}", 400, "page_size"},
    {"search page token not a token", "POST", "/v1/jobs:search", NULL, "{\"page_token\": \"%%%\"}", 400,
     "page_token"},
    {"%00 in an artifact name", "GET", "/v1/jobs/{id}/artifacts/model%00.bin", NULL, NULL, 400, "name"},
    {"artifact name not UTF-8", "GET", "/v1/jobs/{id}/artifacts/%FF%FE", NULL, NULL, 400, "name"},
    {"%00 after a job id to delete", "DELETE", "/v1/jobs/{id}%00", NULL, NULL, 400, "id"},
    {"train file://", "POST", "/v1/jobs", NULL, "{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"file://\"}}",
     400, "data.train"},
    {"train file://://x.txt", "POST", "/v1/jobs", NULL,
     "{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"file://://x.txt\"}}", 400, "data.train"},
    {"lr NaN in JSON", "POST", "/v1/jobs", NULL,
     "{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"lr\": NaN}}", 400,
     ""},
    {"lr 1e999", "POST", "/v1/jobs", NULL,
     "{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"lr\": 1e999}}", 400,
     ""},
    {"name with \\u0000", "POST", "/v1/jobs", NULL,
     "{\"name\": \"a\\u0000b\", \"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/tmp/x.txt\"}}", 400, ""},
    {"stop reason of 1,000 characters", "POST", "/v1/jobs/{id}:stop", NULL, "{\"reason\": \"@1000\"}", 400, "reason"},
    /* what others' terminals show may hold no escape sequence (kiln_text_control) */
    {"stop reason that sets the window title", "POST", "/v1/jobs/{id}:stop", NULL,
     "{\"reason\": \"done\\u001b]0;owned\\u0007\"}", 400, "reason"},
    {"tag value that clears the screen", "POST", "/v1/jobs", NULL,
     "{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"tags\": {\"team\": \"\\u001b[2J\"}}", 400,
     "tags.team"},
    {"tag key with a bidirectional override", "POST", "/v1/jobs", NULL,
     "{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"tags\": {\"t\\u202e\": \"x\"}}", 400,
     "tags.t\\u202e"},
    {"unknown job field with a BEL", "POST", "/v1/jobs", NULL,
     "{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"x\\u0007\": 1}", 400, "x\\u0007"},
    {"unknown queue field with a BEL", "POST", "/v1/queues", NULL,
     "{\"name\": \"q9\", \"quota\": {\"cpu\": 1}, \"foo\\u0007\": 1}", 400, "foo\\u0007"},
    {"queue quota key that clears the screen", "POST", "/v1/queues", NULL,
     "{\"name\": \"q9\", \"quota\": {\"c\\u001b[2J\": 1}}", 400, "quota.c\\u001b[2J"},
    {"queue name that clears the screen", "GET", "/v1/queues/a%1B%5B2J", NULL, NULL, 404, "name"},
    {"tuning job id with a BEL", "GET", "/v1/tuning-jobs/a%07", NULL, NULL, 404, "id"},
    {"unknown job", "GET", "/v1/jobs/00000000-0000-0000-0000-000000000000", NULL, NULL, 404, ""},
    /* script jobs (the same refusals as gRPC's below) */
    {"both model and entry_point", "POST", "/v1/jobs", NULL,
     "{\"entry_point\": \"t.py\", \"source\": \"/tmp/c\", \"model\": {\"type\": \"gpt\"}}", 400, "entry_point"},
    {"neither model nor entry_point", "POST", "/v1/jobs", NULL, "{\"name\": \"x\"}", 400, "model"},
    {"environment sets RANK", "POST", "/v1/jobs", NULL,
     "{\"entry_point\": \"t.py\", \"source\": \"/tmp/c\", \"environment\": {\"RANK\": \"0\"}}", 400,
     "environment.RANK"},
    {"environment sets SM_MODEL_DIR", "POST", "/v1/jobs", NULL,
     "{\"entry_point\": \"t.py\", \"source\": \"/tmp/c\", \"environment\": {\"SM_MODEL_DIR\": \"/x\"}}", 400,
     "environment.SM_MODEL_DIR"},
    {"epochs on an engine job", "POST", "/v1/jobs", NULL,
     "{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"epochs\": 3}}",
     400, "hyperparameters.epochs"},
    {"entry_point climbing out", "POST", "/v1/jobs", NULL, "{\"entry_point\": \"../t.py\", \"source\": \"/tmp/c\"}",
     400, "entry_point"},
    {"channel name with a space", "POST", "/v1/jobs", NULL,
     "{\"entry_point\": \"t.py\", \"source\": \"/tmp/c\", \"data\": {\"channels\": {\"tr ain\": \"/tmp/d\"}}}", 400,
     "data.channels.tr ain"},
    {"source no project uploaded", "POST", "/v1/jobs", NULL,
     "{\"entry_point\": \"t.py\", \"source\": \"code:sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\"}",
     400, "source"},
    {"nproc_per_node against slots_per_node", "POST", "/v1/jobs", NULL,
     "{\"entry_point\": \"t.py\", \"source\": \"/tmp/c\", \"resources\": {\"slots_per_node\": 2},"
     " \"distribution\": {\"torch_distributed\": {\"nproc_per_node\": 1}}}", 400,
     "distribution.torch_distributed.nproc_per_node"},
    {"code upload as JSON", "POST", "/v1/code", NULL, "{}", 415, "Content-Type"},
    {"code digest not hex", "GET", "/v1/code/xyz", NULL, NULL, 400, "digest"},
    {"code digest with %00", "GET", "/v1/code/ab%00cd", NULL, NULL, 400, "digest"},
};

/* "@N" in a header or body stands for N copies of 'k'. */
static char *expand(const char *s)
{
    const char *at = s ? strchr(s, '@') : NULL;
    if (!at)
        return s ? strdup(s) : NULL;
    int n = atoi(at + 1);
    const char *rest = at + 1 + strspn(at + 1, "0123456789");
    char *out = malloc(strlen(s) + (size_t)n + 1);
    memcpy(out, s, (size_t)(at - s));
    memset(out + (at - s), 'k', (size_t)n);
    strcpy(out + (at - s) + n, rest);
    return out;
}

/* Whether text holds no terminal control character (kiln_text_control), but for the line breaks
 * that join a gRPC status's message and hint when lines. */
static bool no_control(const char *text, bool lines)
{
    for (size_t n = strlen(text), i = kiln_text_control_at(text, n); i < n; i = kiln_text_control_at(text, n)) {
        if (!lines || text[i] != '\n')
            return false;
        text += i + 1;
        n -= i + 1;
    }
    return true;
}

/* Whether body is kiln's JSON error: {code, message, detail, hint}. */
static bool is_json_error(const char *body, json_t **out)
{
    json_t *j = json_loads(body ? body : "", 0, NULL);
    bool ok = j && json_is_string(json_object_get(j, "code")) && json_is_string(json_object_get(j, "message")) &&
              json_is_string(json_object_get(j, "detail")) && json_is_string(json_object_get(j, "hint"));
    if (out)
        *out = j;
    else
        json_decref(j);
    return ok;
}

Test(badinput, rest_corpus)
{
    for (size_t i = 0; i < sizeof rest_cases / sizeof rest_cases[0]; i++) {
        const rest_case_t *c = &rest_cases[i];
        char path[512], url[600];
        const char *id = strstr(c->path, "{id}");
        if (id)
            snprintf(path, sizeof path, "%.*s%s%s", (int)(id - c->path), c->path, job_id, id + 4);
        else
            snprintf(path, sizeof path, "%s", c->path);
        snprintf(url, sizeof url, "%s%s", base, path);
        char *header = expand(c->header), *body = expand(c->body);
        const char *hdrs[3] = {body ? "Content-Type: application/json" : NULL, NULL, NULL};
        if (header)
            hdrs[body ? 1 : 0] = header;
        long st = 0;
        char *out = NULL;
        cr_assert_eq(th_http(c->method, url, body, hdrs, &st, &out, 10000), 0, "%s: no answer", c->what);
        json_t *j = NULL;
        cr_assert(is_json_error(out, &j), "%s: not kiln's JSON error: %s", c->what, out);
        cr_assert_eq(st, c->status, "%s: HTTP %ld, not %ld: %s", c->what, st, c->status, out);
        const char *field = json_string_value(json_object_get(j, "field"));
        cr_assert_str_eq(field ? field : "", c->field, "%s: field \"%s\", not \"%s\": %s", c->what, field ? field : "",
                         c->field, out);
        /* a terminal that shows the error shows the client's input escaped */
        for (const char *const *k = (const char *const[]){"message", "detail", "hint", "field", NULL}; *k; k++) {
            const char *text = json_string_value(json_object_get(j, *k));
            cr_assert(text || !strcmp(*k, "field"), "%s: no %s: %s", c->what, *k, out);
            cr_assert(!text || no_control(text, false), "%s: a control character in its %s: %s", c->what, *k, out);
        }
        json_decref(j);
        free(out);
        free(header);
        free(body);
    }
}

/* Sends raw bytes to the REST port and returns what came back (caller frees). */
static char *raw_http(const char *data, size_t len)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)http_port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(fd, data + off, len - off, MSG_NOSIGNAL);
        if (n <= 0)
            break; /* the server may answer and close before it has read everything */
        off += (size_t)n;
    }
    shutdown(fd, SHUT_WR);
    size_t cap = 65536, have = 0;
    char *buf = malloc(cap);
    for (;;) {
        ssize_t n = recv(fd, buf + have, cap - have - 1, 0);
        if (n <= 0)
            break;
        have += (size_t)n;
        if (have + 1 >= cap)
            break;
    }
    buf[have] = '\0';
    close(fd);
    return buf;
}

/* libmicrohttpd's own refusals (before any handler runs) carry kiln's JSON error too. */
Test(badinput, rest_server_library_errors_are_json)
{
    static const struct {
        const char *what;
        const char *head;        /* request up to the big part */
        size_t big;              /* bytes of 'a' after head */
        const char *tail;
        int status;
    } cases[] = {
        {"header line without a colon", "GET /v1/jobs HTTP/1.1\r\nHost: x\r\nNo colon here", 0, "\r\n\r\n", 400},
        {"URL of 70,000 bytes", "GET /", 70000, " HTTP/1.1\r\nHost: x\r\n\r\n", 414},
        {"header of 70,000 bytes", "GET /v1/jobs HTTP/1.1\r\nHost: x\r\nX-Big: ", 70000, "\r\n\r\n", 431},
        {"chunked body that is not", "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                                     "Content-Type: application/json\r\n\r\nzz\r\n", 0, "\r\n", 400},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t hl = strlen(cases[i].head), tl = strlen(cases[i].tail);
        char *req = malloc(hl + cases[i].big + tl + 1);
        memcpy(req, cases[i].head, hl);
        memset(req + hl, 'a', cases[i].big);
        memcpy(req + hl + cases[i].big, cases[i].tail, tl);
        char *resp = raw_http(req, hl + cases[i].big + tl);
        free(req);
        int st = 0;
        cr_assert_eq(sscanf(resp, "HTTP/1.1 %d", &st), 1, "%s: no status line: %.300s", cases[i].what, resp);
        cr_assert_eq(st, cases[i].status, "%s: %.300s", cases[i].what, resp);
        cr_assert(strcasestr(resp, "Content-Type: application/json"), "%s: %.400s", cases[i].what, resp);
        const char *body = strstr(resp, "\r\n\r\n");
        cr_assert(body && is_json_error(body + 4, NULL), "%s: not kiln's JSON error: %.400s", cases[i].what, resp);
        free(resp);
    }
}

/* ---- gRPC ------------------------------------------------------------------------------------ */

typedef struct grpc_case {
    const char *what;
    const char *method;          /* "TrainingService/ListJobs" */
    const char *request;         /* proto JSON ("{id}" is the job's id), or NULL */
    const char *hex;             /* raw request bytes as hex, instead of request */
    int token;                   /* 0: the admin's token, 1: the join token */
    const char *code;
    const char *field;           /* kiln-field of the trailing metadata; "" when none */
} grpc_case_t;

/* A CreateJobRequest {spec {name "a\xffc" model {type "gpt"} data {train "/tmp/x.txt"}}} */
#define BAD_NAME_HEX "0a 1a 0a 03 61 ff 63 1a 05 0a 03 67 70 74 22 0c 0a 0a 2f 74 6d 70 2f 78 2e 74 78 74"
/* A GetJobRequest {id "00000000-0000-0000-0000-000000000000\0zz"} */
#define NUL_ID_HEX "0a 27 30 30 30 30 30 30 30 30 2d 30 30 30 30 2d 30 30 30 30 2d 30 30 30 30 2d 30 30 30 30 30 30 " \
                   "30 30 30 30 30 30 00 7a 7a"
/* A DownloadArtifactRequest {id "00000000-0000-0000-0000-000000000000" name "a\0b"} */
#define DL_NUL_NAME_HEX "0a 24 30 30 30 30 30 30 30 30 2d 30 30 30 30 2d 30 30 30 30 2d 30 30 30 30 2d 30 30 30 30 30 " \
                        "30 30 30 30 30 30 30 12 03 61 00 62"
/* A CreateJobRequest {spec {name "x", 200: 1}}: a field number kiln.JobSpec does not declare */
#define UNKNOWN_SPEC_FIELD_HEX "0a 06 0a 01 78 c0 0c 01"
/* A ListJobsRequest {99: "ab"} */
#define UNKNOWN_LIST_FIELD_HEX "9a 06 02 61 62"
/* A RegisterRequest {worker_id "w\xfe\xff" slots 1 slot_type "cpu"} */
#define BAD_WORKER_HEX "0a 03 77 fe ff 20 01 2a 03 63 70 75"

static const grpc_case_t grpc_cases[] = {
    {"CreateTuningJob: tuning range with min >= max", "TrainingService/CreateTuningJob",
     "{\"tuning_job\": {\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 500}}, \"objective\": {\"metric\": \"val_loss\"}, \"parameters\": {\"lr\": {\"type\": \"continuous\", \"min\": 0.1, \"max\": 0.01}}}}", NULL, 0, "INVALID_ARGUMENT", "tuning_job.parameters.lr.min"},
    {"CreateTuningJob: tuning log scaling from 0", "TrainingService/CreateTuningJob",
     "{\"tuning_job\": {\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 500}}, \"objective\": {\"metric\": \"val_loss\"}, \"parameters\": {\"weight_decay\": {\"type\": \"continuous\", \"min\": 0, \"max\": 0.1, \"scaling\": \"log\"}}}}", NULL, 0, "INVALID_ARGUMENT", "tuning_job.parameters.weight_decay.min"},
    {"CreateTuningJob: tuning categorical value the job refuses", "TrainingService/CreateTuningJob",
     "{\"tuning_job\": {\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 500}}, \"objective\": {\"metric\": \"val_loss\"}, \"parameters\": {\"model.n_head\": {\"type\": \"categorical\", \"values_json\": \"[2, 5]\"}}}}", NULL, 0, "INVALID_ARGUMENT", "tuning_job.parameters.model.n_head.values[1]"},
    {"CreateTuningJob: tuning path the job lacks", "TrainingService/CreateTuningJob",
     "{\"tuning_job\": {\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 500}}, \"objective\": {\"metric\": \"val_loss\"}, \"parameters\": {\"model.depth\": {\"type\": \"integer\", \"min\": 1, \"max\": 2}}}}", NULL, 0, "INVALID_ARGUMENT", "tuning_job.parameters.model.depth"},
    {"CreateTuningJob: tuning warm start from more than 5 parents", "TrainingService/CreateTuningJob",
     "{\"tuning_job\": {\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 500}}, \"objective\": {\"metric\": \"val_loss\"}, \"parameters\": {\"lr\": {\"type\": \"continuous\", \"min\": 0.001, \"max\": 0.01}}, \"warm_start\": {\"parents\": [\"00000000-0000-4000-8000-000000000001\", \"00000000-0000-4000-8000-000000000002\", \"00000000-0000-4000-8000-000000000003\", \"00000000-0000-4000-8000-000000000004\", \"00000000-0000-4000-8000-000000000005\", \"00000000-0000-4000-8000-000000000006\"], \"type\": \"transfer_learning\"}}}", NULL, 0, "INVALID_ARGUMENT", "tuning_job.warm_start.parents"},
    {"CreateTuningJob: tuning warm start from a missing parent", "TrainingService/CreateTuningJob",
     "{\"tuning_job\": {\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 500}}, \"objective\": {\"metric\": \"val_loss\"}, \"parameters\": {\"lr\": {\"type\": \"continuous\", \"min\": 0.001, \"max\": 0.01}}, \"warm_start\": {\"parents\": [\"00000000-0000-4000-8000-000000000001\"], \"type\": \"transfer_learning\"}}}", NULL, 0, "INVALID_ARGUMENT", "tuning_job.warm_start.parents[0]"},
    {"CreateTuningJob: tuning warm start of no known type", "TrainingService/CreateTuningJob",
     "{\"tuning_job\": {\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 500}}, \"objective\": {\"metric\": \"val_loss\"}, \"parameters\": {\"lr\": {\"type\": \"continuous\", \"min\": 0.001, \"max\": 0.01}}, \"warm_start\": {\"parents\": [\"00000000-0000-4000-8000-000000000001\"], \"type\": \"identical\"}}}", NULL, 0, "INVALID_ARGUMENT", "tuning_job.warm_start.type"},
    {"CreateTuningJob: tuning integer range past 2^53", "TrainingService/CreateTuningJob",
     "{\"tuning_job\": {\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 500}}, \"objective\": {\"metric\": \"val_loss\"}, \"parameters\": {\"warmup_steps\": {\"type\": \"integer\", \"min\": 0, \"max\": 1e300}}}}", NULL, 0, "INVALID_ARGUMENT", "tuning_job.parameters.warmup_steps.max"},
    {"CreateTuningJob: tuning max_parallel_jobs above max_jobs", "TrainingService/CreateTuningJob",
     "{\"tuning_job\": {\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 500}}, \"objective\": {\"metric\": \"val_loss\"}, \"parameters\": {\"lr\": {\"type\": \"continuous\", \"min\": 0.001, \"max\": 0.01}}, \"max_jobs\": 2, \"max_parallel_jobs\": 3}}", NULL, 0, "INVALID_ARGUMENT", "tuning_job.max_parallel_jobs"},
    {"CreateTuningJob: early_stopping auto with hyperband", "TrainingService/CreateTuningJob",
     "{\"tuning_job\": {\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 500}}, \"objective\": {\"metric\": \"val_loss\"}, \"parameters\": {\"lr\": {\"type\": \"continuous\", \"min\": 0.001, \"max\": 0.01}}, \"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 10, \"max_resource\": 90}, \"early_stopping\": \"auto\"}}", NULL, 0, "INVALID_ARGUMENT", "tuning_job.early_stopping"},
    {"CreateTuningJob: a hyperband sampler of no known kind", "TrainingService/CreateTuningJob",
     "{\"tuning_job\": {\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 500}}, \"objective\": {\"metric\": \"val_loss\"}, \"parameters\": {\"lr\": {\"type\": \"continuous\", \"min\": 0.001, \"max\": 0.01}}, \"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 10, \"max_resource\": 90, \"sampler\": \"bayesian\"}}}", NULL, 0, "INVALID_ARGUMENT", "tuning_job.hyperband.sampler"},
    {"CreateTuningJob: more hyperband brackets than rungs", "TrainingService/CreateTuningJob",
     "{\"tuning_job\": {\"job\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"hyperparameters\": {\"max_steps\": 500}}, \"objective\": {\"metric\": \"val_loss\"}, \"parameters\": {\"lr\": {\"type\": \"continuous\", \"min\": 0.001, \"max\": 0.01}}, \"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 10, \"max_resource\": 90, \"brackets\": 4}}}", NULL, 0, "INVALID_ARGUMENT", "tuning_job.hyperband.brackets"},
    {"ListJobs with tag \\xff\\xfe", "TrainingService/ListJobs", NULL, "12 02 ff fe", 0, "INVALID_ARGUMENT", "tag"},
    {"ListJobs page_size 0", "TrainingService/ListJobs", "{\"page_size\": 0}", NULL, 0, "INVALID_ARGUMENT",
     "page_size"},
    {"ListJobs page_size -1", "TrainingService/ListJobs", "{\"page_size\": -1}", NULL, 0, "INVALID_ARGUMENT",
     "page_size"},
    {"ListJobs page_size 501", "TrainingService/ListJobs", "{\"page_size\": 501}", NULL, 0, "INVALID_ARGUMENT",
     "page_size"},
    {"ListJobs status ,", "TrainingService/ListJobs", "{\"status\": \",\"}", NULL, 0, "INVALID_ARGUMENT", "status"},
    {"ListJobs page token past year 9999", "TrainingService/ListJobs",
     "{\"page_token\": \"9223372036854775807_00000000-0000-0000-0000-000000000000\"}", NULL, 0, "INVALID_ARGUMENT",
     "page_token"},
    {"CreateJob lr NaN", "TrainingService/CreateJob",
     "{\"spec\": {\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/tmp/x.txt\"}, "
     "\"hyperparameters\": {\"lr\": \"NaN\"}}}", NULL, 0, "INVALID_ARGUMENT", "spec.hyperparameters.lr"},
    {"CreateJob temperature Inf", "TrainingService/CreateJob",
     "{\"spec\": {\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/tmp/x.txt\"}, "
     "\"hyperparameters\": {\"temperature\": \"Infinity\"}}}", NULL, 0, "INVALID_ARGUMENT",
     "spec.hyperparameters.temperature"},
    {"CreateJob temperature 0 (explicit, out of range)", "TrainingService/CreateJob",
     "{\"spec\": {\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/tmp/x.txt\"}, "
     "\"hyperparameters\": {\"temperature\": 0}}}", NULL, 0, "INVALID_ARGUMENT", "spec.hyperparameters.temperature"},
    {"CreateJob gradient_dtype fp16", "TrainingService/CreateJob",
     "{\"spec\": {\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"resources\": {\"nodes\": 2}, "
     "\"distribution\": {\"data_parallel\": {\"gradient_dtype\": \"fp16\"}}}}", NULL, 0, "INVALID_ARGUMENT",
     "spec.distribution.data_parallel.gradient_dtype"},
    {"CreateJob metric definition whose step group matches no step", "TrainingService/CreateJob",
     "{\"spec\": {\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"metric_definitions\": "
     "[{\"name\": \"x\", \"regex\": \"step (?<step>[a-z]+) ([0-9.]+)\"}]}}", NULL, 0, "INVALID_ARGUMENT",
     "spec.metric_definitions[0].regex"},
    {"CreateJob n_layer 0 (explicit)", "TrainingService/CreateJob",
     "{\"spec\": {\"model\": {\"type\": \"gpt\", \"n_layer\": 0}, \"data\": {\"train\": \"/tmp/x.txt\"}}}", NULL, 0,
     "INVALID_ARGUMENT", "spec.model.n_layer"},
    {"CreateJob name not UTF-8", "TrainingService/CreateJob", NULL, BAD_NAME_HEX, 0, "INVALID_ARGUMENT", "spec.name"},
    /* CreateTuningJobRequest {tuning_job {parameters {key "lr" value {values_json "\xff"}}}}: named by its key */
    {"CreateTuningJob values_json not UTF-8", "TrainingService/CreateTuningJob", NULL,
     "0a 0b 1a 09 0a 02 6c 72 12 03 2a 01 ff", 0, "INVALID_ARGUMENT", "tuning_job.parameters.lr.values_json"},
    {"CreateJob idempotency key of 10,000 characters", "TrainingService/CreateJob",
     "{\"spec\": {\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/tmp/x.txt\"}}, \"idempotency_key\": \"@10000\"}",
     NULL, 0, "INVALID_ARGUMENT", "idempotency_key"},
    {"CreateJob idempotency key reused with another spec", "TrainingService/CreateJob",
     "{\"spec\": {\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/tmp/y.txt\"}}, \"idempotency_key\": \"the-key\"}",
     NULL, 0, "ALREADY_EXISTS", "idempotency_key"},
    {"CreateJob train file://", "TrainingService/CreateJob",
     "{\"spec\": {\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"file://\"}}}", NULL, 0, "INVALID_ARGUMENT",
     "spec.data.train"},
    {"CreateJob with a spec field this kilnd does not know", "TrainingService/CreateJob", NULL, UNKNOWN_SPEC_FIELD_HEX,
     0, "INVALID_ARGUMENT", "spec.200"},
    {"ListJobs with a field this kilnd does not know", "TrainingService/ListJobs", NULL, UNKNOWN_LIST_FIELD_HEX, 0,
     "INVALID_ARGUMENT", "99"},
    {"GetJob id with a NUL", "TrainingService/GetJob", NULL, NUL_ID_HEX, 0, "INVALID_ARGUMENT", "id"},
    {"GetMetrics max_points 0", "TrainingService/GetMetrics", "{\"id\": \"{id}\", \"max_points\": 0}", NULL, 0,
     "INVALID_ARGUMENT", "max_points"},
    {"GetMetrics name not UTF-8", "TrainingService/GetMetrics", NULL, "12 02 ff fe", 0, "INVALID_ARGUMENT", "name"},
    {"SearchJobs filter not UTF-8", "TrainingService/SearchJobs", NULL, "0a 02 ff fe", 0, "INVALID_ARGUMENT",
     "filter"},
    {"SearchJobs columns with a NUL", "TrainingService/SearchJobs", NULL, "1a 03 61 00 62", 0, "INVALID_ARGUMENT",
     "columns"},
    {"SearchJobs page_size 501", "TrainingService/SearchJobs", "{\"page_size\": 501}", NULL, 0, "INVALID_ARGUMENT",
     "page_size"},
    {"SearchJobs page_size -1", "TrainingService/SearchJobs", "{\"page_size\": -1}", NULL, 0, "INVALID_ARGUMENT",
     "page_size"},
    {"DownloadArtifact name with a NUL", "TrainingService/DownloadArtifact", NULL, DL_NUL_NAME_HEX, 0,
     "INVALID_ARGUMENT", "name"},
    {"StreamLogs follow on an unknown job", "TrainingService/StreamLogs",
     "{\"id\": \"00000000-0000-0000-0000-000000000000\", \"follow\": true}", NULL, 0, "NOT_FOUND", ""},
    {"StreamLogs since NaN", "TrainingService/StreamLogs", "{\"id\": \"{id}\", \"since\": \"nan\"}", NULL, 0,
     "INVALID_ARGUMENT", "since"},
    {"StopJob reason of 1,000 characters", "TrainingService/StopJob", "{\"id\": \"{id}\", \"reason\": \"@1000\"}", NULL,
     0, "INVALID_ARGUMENT", "reason"},
    {"StopJob reason that writes the clipboard", "TrainingService/StopJob",
     "{\"id\": \"{id}\", \"reason\": \"\\u001b]52;c;ZXZpbA==\\u0007\"}", NULL, 0, "INVALID_ARGUMENT", "reason"},
    {"CreateJob tag value with a CR", "TrainingService/CreateJob",
     "{\"spec\": {\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/tmp/x.txt\"}, \"tags\": {\"team\": \"a\\rb\"}}}",
     NULL, 0, "INVALID_ARGUMENT", "spec.tags.team"},
    {"CreateJob both model and entry_point", "TrainingService/CreateJob",
     "{\"spec\": {\"entry_point\": \"t.py\", \"source\": \"/tmp/c\", \"model\": {\"type\": \"gpt\"}}}", NULL, 0,
     "INVALID_ARGUMENT", "spec.entry_point"},
    {"CreateJob neither model nor entry_point", "TrainingService/CreateJob", "{\"spec\": {\"name\": \"x\"}}", NULL, 0,
     "INVALID_ARGUMENT", "spec.model"},
    {"CreateJob environment sets RANK", "TrainingService/CreateJob",
     "{\"spec\": {\"entry_point\": \"t.py\", \"source\": \"/tmp/c\", \"environment\": {\"RANK\": \"0\"}}}", NULL, 0,
     "INVALID_ARGUMENT", "spec.environment.RANK"},
    {"CreateJob environment sets SM_MODEL_DIR", "TrainingService/CreateJob",
     "{\"spec\": {\"entry_point\": \"t.py\", \"source\": \"/tmp/c\", \"environment\": {\"SM_MODEL_DIR\": \"/x\"}}}",
     NULL, 0, "INVALID_ARGUMENT", "spec.environment.SM_MODEL_DIR"},
    {"CreateJob epochs on an engine job (hyperparameters_json)", "TrainingService/CreateJob",
     "{\"spec\": {\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/tmp/x.txt\"},"
     " \"hyperparameters_json\": \"{\\\"epochs\\\": 3}\"}}", NULL, 0, "INVALID_ARGUMENT", "spec.hyperparameters.epochs"},
    {"CreateJob hyperparameters_json not an object", "TrainingService/CreateJob",
     "{\"spec\": {\"entry_point\": \"t.py\", \"source\": \"/tmp/c\", \"hyperparameters_json\": \"[1]\"}}", NULL, 0,
     "INVALID_ARGUMENT", "spec.hyperparameters_json"},
    {"CreateJob entry_point climbing out", "TrainingService/CreateJob",
     "{\"spec\": {\"entry_point\": \"../t.py\", \"source\": \"/tmp/c\"}}", NULL, 0, "INVALID_ARGUMENT",
     "spec.entry_point"},
    {"CreateJob channel name with a space", "TrainingService/CreateJob",
     "{\"spec\": {\"entry_point\": \"t.py\", \"source\": \"/tmp/c\", \"data\": {\"channels\": {\"tr ain\": \"/tmp/d\"}}}}",
     NULL, 0, "INVALID_ARGUMENT", "spec.data.channels.tr ain"},
    {"CreateJob source no project uploaded", "TrainingService/CreateJob",
     "{\"spec\": {\"entry_point\": \"t.py\", \"source\": "
     "\"code:sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\"}}", NULL, 0, "INVALID_ARGUMENT",
     "spec.source"},
    {"CreateJob nproc_per_node against slots_per_node", "TrainingService/CreateJob",
     "{\"spec\": {\"entry_point\": \"t.py\", \"source\": \"/tmp/c\", \"resources\": {\"slots_per_node\": 2},"
     " \"distribution\": {\"torch_distributed\": {\"nproc_per_node\": 1}}}}", NULL, 0, "INVALID_ARGUMENT",
     "spec.distribution.torch_distributed.nproc_per_node"},
    {"UploadCode not an archive", "TrainingService/UploadCode", "{\"data\": \"aGVsbG8gd29ybGQ=\", \"finish\": true}",
     NULL, 0, "INVALID_ARGUMENT", "archive"},
    {"UploadCode an upload id nobody made", "TrainingService/UploadCode",
     "{\"upload_id\": \"0123456789abcdef0123456789abcdef\", \"offset\": 5, \"data\": \"aGVsbG8=\"}", NULL, 0,
     "NOT_FOUND", "upload_id"},
    {"DownloadCode digest not hex", "TrainingService/DownloadCode", "{\"digest\": \"xyz\"}", NULL, 0,
     "INVALID_ARGUMENT", "digest"},
    {"RegisterWorker worker id not UTF-8", "AgentService/RegisterWorker", NULL, BAD_WORKER_HEX, 1, "INVALID_ARGUMENT",
     "worker_id"},
    {"RegisterWorker worker id of 1,000 characters", "AgentService/RegisterWorker",
     "{\"worker_id\": \"@1000\", \"slots\": 1, \"slot_type\": \"cpu\"}", NULL, 1, "INVALID_ARGUMENT", "worker_id"},
    {"GetQueue name that clears the screen", "TrainingService/GetQueue", "{\"name\": \"a\\u001b[2J\"}", NULL, 0,
     "NOT_FOUND", "name"},
    {"CreateQueue field with a BEL", "TrainingService/CreateQueue",
     "{\"queue\": {\"name\": \"q9\", \"quota\": {\"c\\u0007\": 1}}}", NULL, 0, "INVALID_ARGUMENT", "queue.quota.c\\u0007"},
    {"RegisterWorker hostname with an escape sequence", "AgentService/RegisterWorker",
     "{\"hostname\": \"h\\u001b[2J\", \"slots\": 1, \"slot_type\": \"cpu\"}", NULL, 1, "INVALID_ARGUMENT", "hostname"},
};

/* Replaces "{id}" with the job's id and "@N" with N 'k's; caller frees. */
static char *fill(const char *s)
{
    char *e = expand(s);
    char *id = e ? strstr(e, "{id}") : NULL;
    if (!id)
        return e;
    char *out = malloc(strlen(e) + 64);
    sprintf(out, "%.*s%s%s", (int)(id - e), e, job_id, id + 4);
    free(e);
    return out;
}

Test(badinput, grpc_corpus)
{
    gt_python_ready(dir);
    size_t n = sizeof grpc_cases / sizeof grpc_cases[0];
    json_t *calls = json_array();
    for (size_t i = 0; i < n; i++) {
        const grpc_case_t *c = &grpc_cases[i];
        char method[128];
        snprintf(method, sizeof method, "/kiln.%s", c->method);
        json_t *call = json_pack("{s:s, s:s}", "method", method, "token", c->token ? join_token : admin_token);
        if (c->hex) {
            char hex[512];
            size_t k = 0;
            for (const char *p = c->hex; *p && k < sizeof hex - 1; p++)
                if (*p != ' ')
                    hex[k++] = *p;
            hex[k] = '\0';
            json_object_set_new(call, "request_hex", json_string(hex));
        } else {
            char *text = fill(c->request);
            json_t *req = json_loads(text, 0, NULL);
            cr_assert_not_null(req, "%s: bad test request %s", c->what, text);
            json_object_set_new(call, "request", req);
            free(text);
        }
        json_array_append_new(calls, call);
    }
    json_t *ans = gt_grpc_calls(&K, calls, "plan");
    for (size_t i = 0; i < n; i++) {
        const grpc_case_t *c = &grpc_cases[i];
        json_t *r = json_array_get(ans, i);
        cr_assert_not_null(r, "%s: no answer from grpc_client.py", c->what);
        char *line = json_dumps(r, JSON_COMPACT);
        const char *code = json_string_value(json_object_get(r, "code"));
        cr_assert_str_eq(code, c->code, "%s: %s", c->what, line);
        json_t *tr = json_object_get(r, "trailing");
        const char *field = json_string_value(json_object_get(tr, "kiln-field"));
        cr_assert_str_eq(field ? field : "", c->field, "%s: %s", c->what, line);
        cr_assert_not_null(json_object_get(tr, "kiln-code"), "%s: no kiln-code: %s", c->what, line);
        const char *details = json_string_value(json_object_get(r, "details"));
        cr_assert(details && no_control(details, true), "%s: a control character in its message: %s", c->what, line);
        cr_assert_lt(json_real_value(json_object_get(r, "seconds")), 15.0, "%s: answered late (a stream that waits instead of refusing): %s",
                     c->what, line);
        free(line);
    }
    json_decref(ans);
}

/* An explicit zero over gRPC is honoured, as in REST's JSON: grad_clip 0 turns clipping off
 * (its default is 1.0), warmup_steps 0 and auto_partition false are kept. */
Test(badinput, grpc_explicit_zero_values_are_honoured)
{
    kiln_err_t err;
    gt_python_ready(dir);
    json_t *req = json_loads("{\"spec\": {\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/tmp/x.txt\", "
                             "\"val_fraction\": 0}, \"hyperparameters\": {\"grad_clip\": 0, \"seed\": 0, "
                             "\"min_lr_fraction\": 0}, \"distribution\": {\"model_parallel\": "
                             "{\"auto_partition\": false}}}}", 0, NULL);
    json_t *ans = gt_grpc_calls(&K,
                                json_pack("[{s:s, s:s, s:o}]", "method", "/kiln.TrainingService/CreateJob", "token",
                                          admin_token, "request", req),
                                "zero");
    json_t *r = json_incref(json_array_get(ans, 0));
    json_decref(ans);
    cr_assert_not_null(r, "no answer from grpc_client.py");
    char *line = json_dumps(r, JSON_COMPACT);
    cr_assert_str_eq(json_string_value(json_object_get(r, "code")), "OK", "%s", line);
    const char *id = json_string_value(json_object_get(json_object_get(r, "response"), "id"));
    json_t *job = NULL;
    cr_assert_eq(svc_job_get(S, svc_caller_kilnd(), id, &job, &err), 0, "%s", err.message);
    json_t *spec = json_object_get(job, "spec");
    json_t *hp = json_object_get(spec, "hyperparameters");
    cr_assert_float_eq(json_number_value(json_object_get(hp, "grad_clip")), 0.0, 1e-12, "%s", line);
    cr_assert_eq(json_integer_value(json_object_get(hp, "seed")), 0);
    cr_assert_float_eq(json_number_value(json_object_get(hp, "min_lr_fraction")), 0.0, 1e-12);
    cr_assert_float_eq(json_number_value(json_object_get(json_object_get(spec, "data"), "val_fraction")), 0.0, 1e-12);
    cr_assert(json_is_false(json_object_get(json_object_get(json_object_get(spec, "distribution"), "model_parallel"),
                                            "auto_partition")));
    json_decref(job);
    json_decref(r);
    free(line);
}

/* The tuning refusals the corpus above does not send (issue 29: bad input is refused the same over
 * REST and gRPC): an empty objective metric, more than 30 parameters, a grid larger than max_jobs,
 * an objective metric an engine job never reports (and no metric_definitions entry reads).
 * Each is a 400 over REST; over gRPC INVALID_ARGUMENT with the field under tuning_job and REST's
 * message and hint, word for word. */
Test(badinput, tuning_refusals_alike_over_rest_and_grpc)
{
    static const char k_job[] = "{\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16,"
                                " \"seq_len\": 8}, \"data\": {\"train\": \"/tmp/x.txt\"},"
                                " \"hyperparameters\": {\"max_steps\": 500}}";
    struct {
        const char *what, *field;
        json_t *body;
    } cases[4];
    json_t *lr = json_pack("{s:{s:s, s:f, s:f}}", "lr", "type", "continuous", "min", 0.001, "max", 0.01);
    cases[0].what = "an empty objective metric";
    cases[0].field = "objective.metric";
    cases[0].body = json_pack("{s:o, s:O, s:{s:s}}", "job", json_loads(k_job, 0, NULL), "parameters", lr, "objective",
                              "metric", "");
    json_t *many = json_object();
    for (int i = 0; i <= 30; i++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", i);
        json_object_set_new(many, name, json_pack("{s:s, s:f, s:f}", "type", "continuous", "min", 0.0, "max", 1.0));
    }
    cases[1].what = "31 parameters";
    cases[1].field = "parameters";
    cases[1].body = json_pack("{s:o, s:o, s:{s:s}}", "job", json_loads(k_job, 0, NULL), "parameters", many,
                              "objective", "metric", "val_loss");
    cases[2].what = "a grid of 10 points with max_jobs 5";
    cases[2].field = "max_jobs";
    cases[2].body = json_pack("{s:o, s:{s:{s:s, s:i, s:i}}, s:{s:s}, s:s, s:i}", "job", json_loads(k_job, 0, NULL),
                              "parameters", "warmup_steps", "type", "integer", "min", 0, "max", 9, "objective", "metric",
                              "val_loss", "strategy", "grid", "max_jobs", 5);
    cases[3].what = "an objective no engine job reports";
    cases[3].field = "objective.metric";
    cases[3].body = json_pack("{s:o, s:O, s:{s:s}}", "job", json_loads(k_job, 0, NULL), "parameters", lr, "objective",
                              "metric", "bleu");
    json_decref(lr);
    /* REST: each refusal's field, message and hint */
    char *message[4], *hint[4];
    json_t *calls = json_array();
    for (int i = 0; i < 4; i++) {
        cr_assert_not_null(cases[i].body, "%s: bad test request", cases[i].what);
        char url[200], *body = json_dumps(cases[i].body, JSON_COMPACT), *out = NULL;
        const char *hdrs[] = {"Content-Type: application/json", NULL};
        long st = 0;
        snprintf(url, sizeof url, "%s/v1/tuning-jobs", base);
        cr_assert_eq(th_http("POST", url, body, hdrs, &st, &out, 10000), 0, "%s: no answer", cases[i].what);
        json_t *j = NULL;
        cr_assert(is_json_error(out, &j), "%s: not kiln's JSON error: %s", cases[i].what, out);
        cr_assert_eq(st, 400, "%s: HTTP %ld: %s", cases[i].what, st, out);
        cr_assert_str_eq(json_string_value(json_object_get(j, "field")), cases[i].field, "%s: %s", cases[i].what, out);
        message[i] = strdup(json_string_value(json_object_get(j, "message")));
        hint[i] = strdup(json_string_value(json_object_get(j, "hint")));
        cr_assert(message[i][0], "%s: %s", cases[i].what, out);
        json_decref(j);
        free(out);
        free(body);
        json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:o}}", "method", "/kiln.TrainingService/CreateTuningJob",
                                               "token", admin_token, "request", "tuning_job", cases[i].body));
    }
    cr_assert(strstr(message[0], "objective.metric is empty") && strstr(message[1], "31 entries; at most 30") &&
              strstr(message[2], "the grid has 10 points, more than max_jobs (5)") &&
              strstr(message[3], "objective.metric \"bleu\" is never reported by an engine job; it reports "
                                 "train_loss, lr,") && strstr(message[3], "val_loss") &&
              strstr(hint[3], "metric_definitions"),
              "%s | %s | %s | %s", message[0], message[1], message[2], message[3]);
    /* gRPC, in one run of the foreign client */
    const char *missing = th_grpc_python_missing();
    if (missing) {
        json_decref(calls);
        for (int i = 0; i < 4; i++) {
            free(message[i]);
            free(hint[i]);
        }
        cr_skip_test("%s", missing);
    }
    cr_assert_eq(th_protoc_python(dir), 0);
    json_t *ans = gt_grpc_calls(&K, calls, "tuning-plan");
    for (int i = 0; i < 4; i++) {
        json_t *r = json_array_get(ans, i);
        cr_assert_not_null(r, "%s: no answer from grpc_client.py", cases[i].what);
        char *line = json_dumps(r, JSON_COMPACT);
        cr_assert_str_eq(json_string_value(json_object_get(r, "code")), "INVALID_ARGUMENT", "%s: %s", cases[i].what,
                         line);
        json_t *tr = json_object_get(r, "trailing");
        char field[128], details[2048];
        snprintf(field, sizeof field, "tuning_job.%s", cases[i].field);
        cr_assert_str_eq(json_string_value(json_object_get(tr, "kiln-field")), field, "%s: %s", cases[i].what, line);
        cr_assert_str_eq(json_string_value(json_object_get(tr, "kiln-hint")), hint[i], "%s: %s", cases[i].what, line);
        /* gRPC's one message: "field: message", then the hint on a line of its own */
        snprintf(details, sizeof details, "%s: %s%s%s", field, message[i], hint[i][0] ? "\nhint: " : "", hint[i]);
        cr_assert_str_eq(json_string_value(json_object_get(r, "details")), details, "%s: %s", cases[i].what, line);
        free(line);
    }
    json_decref(ans);
    for (int i = 0; i < 4; i++) {
        free(message[i]);
        free(hint[i]);
    }
}

/* ---- the capability table, at every door ------------------------------------------------------ */

/* One case for every model of the table, every backend a spec can choose (its slot type), and
 * every capability the table says the model or the backend lacks: the model's example section,
 * the first data it takes, the backend's slots, and the smallest JSON that asks for the
 * capability. A new row of the table is a new set of cases. */
typedef struct cap_case {
    char what[128];
    json_t *spec;   /* owned */
    kiln_err_t want; /* the table's refusal (spec_cap_refuse) */
} cap_case_t;

static int cap_cases(cap_case_t *out, int max)
{
    int n = 0;
    for (int mi = 0; spec_models[mi]; mi++) {
        const char *model = spec_models[mi];
        const char *data = NULL;
        for (int c = SPEC_CAP_TEXT; c <= SPEC_CAP_SYNTHETIC && !data; c++)
            if (spec_model_has(model, (spec_cap_t)c))
                data = spec_cap_ask((spec_cap_t)c);
        cr_assert_not_null(data, "model %s takes no data", model);
        for (int bi = 0; spec_backends[bi]; bi++) {
            const char *backend = spec_backends[bi], *slots = spec_backend_slots(backend);
            if (!slots[0])
                continue; /* no spec chooses it */
            for (int c = 0; c < SPEC_CAP_COUNT; c++) {
                bool model_has = spec_model_has(model, (spec_cap_t)c);
                if (model_has && spec_backend_has(backend, (spec_cap_t)c))
                    continue;
                cr_assert_lt(n, max);
                cap_case_t *k = &out[n];
                snprintf(k->what, sizeof k->what, "%s on %s slots: %s", model, slots, spec_cap_name((spec_cap_t)c));
                k->spec = json_pack("{s:s, s:o, s:{s:s, s:s}}", "name", "caps", "model",
                                    json_loads(spec_model_example(model), 0, NULL), "resources", "slot_type", slots,
                                    "device", !strcmp(slots, "gpu") ? "cuda" : "cpu");
                json_t *d = json_loads(data, 0, NULL), *ask = json_loads(spec_cap_ask((spec_cap_t)c), 0, NULL);
                cr_assert(d && ask && k->spec, "%s: bad JSON in the table", k->what);
                json_object_update_recursive(k->spec, d);
                json_object_update_recursive(k->spec, ask);
                json_decref(d);
                json_decref(ask);
                spec_cap_refuse((spec_cap_t)c, model, model_has ? backend : NULL, &k->want);
                /* what the validator itself says is the table's refusal */
                spec_t s;
                kiln_err_t err;
                cr_assert_eq(spec_parse(k->spec, &s, &err), KILN_EINVAL, "%s: accepted", k->what);
                cr_assert_str_eq(err.field, k->want.field, "%s", k->what);
                cr_assert_str_eq(err.message, k->want.message, "%s", k->what);
                cr_assert_str_eq(err.hint, k->want.hint, "%s", k->what);
                n++;
            }
        }
    }
    return n;
}

/* The last line of text (trailing newlines dropped), in place. */
static const char *last_line_of(char *text)
{
    size_t n = strlen(text);
    while (n > 0 && text[n - 1] == '\n')
        text[--n] = '\0';
    char *nl = strrchr(text, '\n');
    return nl ? nl + 1 : text;
}

Test(badinput, capabilities_the_table_refuses_are_refused_alike_over_rest_grpc_and_kiln_train)
{
    cap_case_t cases[64];
    int n = cap_cases(cases, 64);
    cr_assert_geq(n, 4, "the table refuses too little to test: %d cases", n);
    const char *missing = th_grpc_python_missing();
    json_t *calls = json_array();
    for (int i = 0; i < n; i++) {
        const cap_case_t *c = &cases[i];
        /* REST */
        char url[200], *body = json_dumps(c->spec, JSON_COMPACT), *out = NULL;
        const char *hdrs[] = {"Content-Type: application/json", NULL};
        long st = 0;
        snprintf(url, sizeof url, "%s/v1/jobs", base);
        cr_assert_eq(th_http("POST", url, body, hdrs, &st, &out, 10000), 0, "%s: no answer", c->what);
        json_t *j = NULL;
        cr_assert(is_json_error(out, &j), "%s: not kiln's JSON error: %s", c->what, out);
        cr_assert_eq(st, 400, "%s: HTTP %ld: %s", c->what, st, out);
        cr_assert_str_eq(json_string_value(json_object_get(j, "field")), c->want.field, "%s: %s", c->what, out);
        cr_assert_str_eq(json_string_value(json_object_get(j, "message")), c->want.message, "%s: %s", c->what, out);
        cr_assert_str_eq(json_string_value(json_object_get(j, "hint")), c->want.hint, "%s: %s", c->what, out);
        json_decref(j);
        free(out);
        free(body);
        /* kiln-train --spec, as an operator runs it by hand */
        char path[200], cmd[700];
        snprintf(path, sizeof path, "%s/caps-%d.json", dir, i);
        cr_assert_eq(json_dump_file(c->spec, path, 0), 0);
        snprintf(cmd, sizeof cmd, "KILN_THREADS=1 KILN_PEAK_GFLOPS=100 %s/kiln-train --spec %s 2>&1", th_bin_dir(), path);
        FILE *p = popen(cmd, "r");
        cr_assert_not_null(p);
        char text[8192];
        size_t got = fread(text, 1, sizeof text - 1, p);
        text[got] = '\0';
        int status = pclose(p);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 2, "%s: kiln-train exit %d: %s", c->what,
                  WEXITSTATUS(status), text);
        char hint_line[600];
        snprintf(hint_line, sizeof hint_line, "kiln-train: hint: %s\n", c->want.hint);
        cr_assert(strstr(text, hint_line), "%s: no \"%s\" in: %s", c->what, c->want.hint, text);
        const char *last = last_line_of(text);
        char field_at[300];
        snprintf(field_at, sizeof field_at, ": %s: ", c->want.field);
        size_t ml = strlen(c->want.message), ll = strlen(last);
        cr_assert(strstr(last, field_at) && ll >= ml && !strcmp(last + ll - ml, c->want.message),
                  "%s: last line \"%s\" is not \"...: %s: ... %s\"", c->what, last, c->want.field, c->want.message);
        /* gRPC, in one run of the foreign client below */
        json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:O}}", "method", "/kiln.TrainingService/CreateJob",
                                               "token", admin_token, "request", "spec", c->spec));
    }
    if (missing) {
        cr_log_warn("gRPC leg skipped: %s", missing);
    } else {
        cr_assert_eq(th_protoc_python(dir), 0);
        json_t *ans = gt_grpc_calls(&K, calls, "caps-plan");
        calls = NULL;
        for (int i = 0; i < n; i++) {
            const cap_case_t *c = &cases[i];
            json_t *r = json_array_get(ans, i);
            cr_assert_not_null(r, "%s: no answer from grpc_client.py", c->what);
            char *line = json_dumps(r, JSON_COMPACT);
            cr_assert_str_eq(json_string_value(json_object_get(r, "code")), "INVALID_ARGUMENT", "%s: %s", c->what,
                             line);
            json_t *tr = json_object_get(r, "trailing");
            char field[300];
            snprintf(field, sizeof field, "spec.%s", c->want.field);
            cr_assert_str_eq(json_string_value(json_object_get(tr, "kiln-field")), field, "%s: %s", c->what, line);
            cr_assert_str_eq(json_string_value(json_object_get(tr, "kiln-hint")), c->want.hint, "%s: %s", c->what,
                             line);
            /* gRPC's one message: "field: message", then the hint on a line of its own */
            char details[1200];
            snprintf(details, sizeof details, "%s: %s\nhint: %s", field, c->want.message, c->want.hint);
            cr_assert_str_eq(json_string_value(json_object_get(r, "details")), details, "%s: %s", c->what, line);
            free(line);
        }
        json_decref(ans);
    }
    json_decref(calls);
    for (int i = 0; i < n; i++)
        json_decref(cases[i].spec);
}
