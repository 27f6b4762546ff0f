/* test_contract.c - api/openapi.yaml is checked against what the server really answers. The
 * REST server and service run as in kilnd against a real PostgreSQL (the suite's fixture); this
 * records real responses of every route in the server's own table (api_http_routes): success and
 * error cases written here per route, plus the cases every route gets from its method and flags
 * (no token, a bad token, a body that is not JSON, a body too large, a path parameter naming
 * nothing, a method the path lacks, the database gone), and a URL and a header block too large
 * for the HTTP server (414, 431). tools/openapi-check.mjs then validates
 * each response against the spec with Ajv (JSON Schema 2020-12, undocumented fields refused)
 * and fails on an undocumented status, field or route, on a documented route the server lacks,
 * and on a route with no successful response recorded. Redocly and Spectral lint the spec, and
 * tools/proto_names.py checks that kiln.proto and the spec name their fields alike. */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "code/code.h"
#include "tests/api/api_test.h"
#include "tests/common/harness.h"

TestSuite(contract, .timeout = 300);

static json_t *records;

/* The route table's pattern that path (no query) matches, or NULL. */
static const char *route_of(const char *method, const char *path)
{
    static api_route_info_t routes[128];
    size_t n = api_http_routes(routes, 128);
    const char *any = NULL;
    char p[512];
    kiln_strlcpy(p, path, sizeof p);
    p[strcspn(p, "?")] = '\0';
    for (size_t i = 0; i < n && i < 128; i++) {
        const char *a = routes[i].path, *b = p;
        bool ok = true;
        while (*a && ok) {
            if (*a == '{') {
                const char *start = b;
                while (*b && *b != '/' && *b != ':')
                    b++;
                ok = b > start;
                a = strchr(a, '}') + 1;
            } else {
                ok = *a++ == *b++;
            }
        }
        if (!ok || *b)
            continue;
        if (!strcmp(routes[i].method, method))
            return routes[i].path;
        any = routes[i].path;
    }
    return any;
}

/* The Content-Type of a reply's header lines ("" when it has none). */
static void content_type_of(const char *headers, char *out, size_t n)
{
    out[0] = '\0';
    for (const char *line = headers; line && *line;) {
        const char *nl = strchr(line, '\n');
        if (!strncasecmp(line, "Content-Type:", 13)) {
            const char *v = line + 13;
            while (*v == ' ')
                v++;
            snprintf(out, n, "%.*s", (int)strcspn(v, "\r\n"), v);
        }
        line = nl ? nl + 1 : NULL;
    }
}

/* One request, recorded. token NULL sends the admin's; "" sends none. ctype NULL sends JSON
 * when there is a body. Returns the status; *out gets the body (caller frees) when out. */
static long rec(const char *method, const char *path, const char *body, const char *token, const char *ctype,
                const char *extra_header, char **out)
{
    char url[1024], auth[256], ct[128];
    snprintf(url, sizeof url, "%s%s", at_base, path);
    const char *hdrs[4];
    int nh = 0;
    snprintf(auth, sizeof auth, "Authorization:%s%s", token && !*token ? "" : " Bearer ",
             token && !*token ? "" : (token ? token : at_admin_token));
    hdrs[nh++] = auth;
    if (body || ctype) {
        snprintf(ct, sizeof ct, "Content-Type: %s", ctype ? ctype : "application/json");
        hdrs[nh++] = ct;
    }
    if (extra_header)
        hdrs[nh++] = extra_header;
    hdrs[nh] = NULL;
    long st = 0;
    char *text = NULL, *headers = NULL;
    cr_assert_eq(th_http_headers(method, url, body, hdrs, &st, &text, &headers, 20000), 0, "%s %s failed", method,
                 url);
    char ctype_got[128];
    content_type_of(headers, ctype_got, sizeof ctype_got);
    const char *route = route_of(method, path);
    json_t *r = json_pack("{s:s, s:s, s:s?, s:i, s:s, s:s}", "method", method, "path", path, "route", route,
                          "status", (int)st, "content_type", ctype_got, "body", text ? text : "");
    if (!r) /* a body that is not UTF-8 */
        r = json_pack("{s:s, s:s, s:s?, s:i, s:s, s:s}", "method", method, "path", path, "route", route, "status",
                      (int)st, "content_type", ctype_got, "body", "<not UTF-8>");
    json_array_append_new(records, r);
    if (out)
        *out = text;
    else
        free(text);
    free(headers);
    return st;
}

/* A request the HTTP server refuses before any route sees it (a URL or header block over its
 * buffer), recorded as such: tools/openapi-check.mjs checks it against x-kiln-server-refusals.
 * Asserts the status; path may be longer than rec() takes. */
static void rec_refused(long want_status, const char *path, const char *extra_header)
{
    size_t n = strlen(at_base) + strlen(path) + 1;
    char *url = malloc(n);
    cr_assert(url);
    snprintf(url, n, "%s%s", at_base, path);
    char auth[256];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", at_admin_token);
    const char *hdrs[] = {auth, extra_header, NULL};
    long st = 0;
    char *text = NULL, *headers = NULL;
    cr_assert_eq(th_http_headers("GET", url, NULL, hdrs, &st, &text, &headers, 20000), 0, "GET of %zu bytes failed",
                 n);
    cr_assert_eq(st, want_status, "%s", text ? text : "");
    char ctype_got[128];
    content_type_of(headers, ctype_got, sizeof ctype_got);
    char shown[80];
    snprintf(shown, sizeof shown, "%.60s...", path);
    json_array_append_new(records, json_pack("{s:s, s:s, s:b, s:i, s:s, s:s}", "method", "GET", "path", shown,
                                             "server_refusal", 1, "status", (int)st, "content_type", ctype_got,
                                             "body", text ? text : ""));
    free(text);
    free(headers);
    free(url);
}

/* rec() for a body of bytes (a code archive) with Content-Type ctype; asserts the status. */
static void rec_bytes(long want_status, const char *path, const void *data, size_t len, const char *ctype,
                      const char *token)
{
    char url[1024], auth[256], ct[128];
    snprintf(url, sizeof url, "%s%s", at_base, path);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token ? token : at_admin_token);
    snprintf(ct, sizeof ct, "Content-Type: %s", ctype);
    const char *hdrs[] = {auth, ct, NULL};
    long st = 0;
    char *text = NULL, *headers = NULL;
    cr_assert_eq(th_http_send("POST", url, data, len, hdrs, &st, &text, &headers, 20000), 0, "POST %s failed", url);
    cr_assert_eq(st, want_status, "POST %s: %ld %s", path, st, text);
    char ctype_got[128];
    content_type_of(headers, ctype_got, sizeof ctype_got);
    json_array_append_new(records, json_pack("{s:s, s:s, s:s?, s:i, s:s, s:s}", "method", "POST", "path", path,
                                             "route", route_of("POST", path), "status", (int)st, "content_type",
                                             ctype_got, "body", text ? text : ""));
    free(text);
    free(headers);
}

/* rec() that also asserts the status. */
static void want(long status, const char *method, const char *path, const char *body, const char *token)
{
    char *text = NULL;
    long st = rec(method, path, body, token, NULL, NULL, &text);
    cr_assert_eq(st, status, "%s %s: %ld %s", method, path, st, text);
    free(text);
}

static char *json_field(const char *text, const char *key)
{
    json_t *j = json_loads(text, 0, NULL);
    const char *v = json_string_value(json_object_get(j, key));
    char *out = strdup(v ? v : "");
    json_decref(j);
    return out;
}

/* Creates a user with a token; returns the token (caller frees). */
static char *make_user(const char *name)
{
    char body[128], path[128], *text = NULL;
    snprintf(body, sizeof body, "{\"name\": \"%s\"}", name);
    want(201, "POST", "/v1/users", body, NULL);
    snprintf(path, sizeof path, "/v1/users/%s/tokens", name);
    cr_assert_eq(rec("POST", path, "{\"description\": \"contract test\"}", NULL, NULL, NULL, &text), 201, "%s", text);
    char *tok = json_field(text, "token");
    free(text);
    return tok;
}

static void push_metrics(const char *job_id, int attempt)
{
    Kiln__MetricPoint pts[6], *ptrs[6];
    for (int i = 0; i < 6; i++) {
        Kiln__MetricPoint p = KILN__METRIC_POINT__INIT;
        pts[i] = p;
        pts[i].rank = 0;
        pts[i].name = i % 2 ? "lr" : "train_loss";
        pts[i].step = i / 2 + 1;
        pts[i].value = i % 2 ? 1e-3 : 5.0 - i;
        pts[i].time_us = kiln_now_us();
        ptrs[i] = &pts[i];
    }
    Kiln__MetricBatch b = KILN__METRIC_BATCH__INIT;
    b.worker_id = at_worker;
    b.job_id = (char *)job_id;
    b.attempt = attempt;
    b.n_points = 6;
    b.points = ptrs;
    kiln_err_t err;
    kiln_err_clear(&err);
    cr_assert_eq(svc_agent_metrics(at_svc, at_worker, &b, &err), 0, "metrics: %s", err.message);
}

/* The value a path parameter takes in the generic cases. */
static const char *param_value(const char *pattern, const char *name, const char *job, const char *token_id)
{
    if (!strcmp(name, "id"))
        return !strncmp(pattern, "/v1/tokens/", 11) ? token_id : job;
    if (!strcmp(name, "project"))
        return "p";
    if (!strcmp(name, "user") || !strcmp(name, "name"))
        return "viewer";
    return "x";
}

/* pattern with its parameters filled in (static storage). missing: values that name nothing. */
static const char *fill(const char *pattern, bool missing, const char *job, const char *token_id)
{
    static char out[512];
    size_t o = 0;
    for (const char *p = pattern; *p && o < sizeof out - 64;) {
        if (*p == '{') {
            const char *close = strchr(p, '}');
            char name[32];
            snprintf(name, sizeof name, "%.*s", (int)(close - p - 1), p + 1);
            const char *v = missing ? (!strcmp(name, "id") && strncmp(pattern, "/v1/tokens/", 11)
                                           ? "00000000-0000-4000-8000-000000000000"
                                           : "nothing-here")
                                    : param_value(pattern, name, job, token_id);
            o += (size_t)snprintf(out + o, sizeof out - o, "%s", v);
            p = close + 1;
        } else {
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
    return out;
}

Test(contract, every_route_against_openapi)
{
    at_setup();
    records = json_array();
    char *text = NULL;

    /* ---- the world: users, a project, jobs in every kind of state, logs and metrics ---- */
    want(201, "POST", "/v1/projects", "{\"name\": \"p\"}", NULL);
    char *viewer = make_user("viewer");
    want(200, "PUT", "/v1/projects/p/members/viewer", "{\"role\": \"viewer\"}", NULL);
    char *running = at_create_job("running", "{\"team\": \"nlp\"}", NULL);
    int attempt = at_run_job(running);
    at_push_logs(running, attempt, "step", 1, 5);
    push_metrics(running, attempt);
    char *done = at_create_job("done", NULL, NULL);
    int a2 = at_run_job(done);
    at_push_logs(done, a2, "line", 1, 3);
    at_rank_exit(done, a2, 0);
    /* a finished job that left an artifact */
    char *art = at_create_job("art", NULL, NULL);
    int a3 = at_run_job(art);
    static const char model[] = "kiln contract test model bytes: not a real llm.c file, only its name";
    kiln_err_t aerr;
    cr_assert_eq(at_upload(at_svc, at_worker, art, a3, "model_llmc.bin", model, sizeof model - 1, 16, &aerr), 0, "%s",
                 aerr.message);
    /* and a synced checkpoint directory */
    const at_ck_file_t ck = {"ckpt-0001.pt", "kiln contract test checkpoint"};
    bool committed = false;
    cr_assert_eq(at_ck_begin(art, a3, &ck, 1, NULL, NULL, &aerr), 0, "%s", aerr.message);
    cr_assert_eq(at_ck_send(art, a3, &ck, &aerr), 0, "%s", aerr.message);
    cr_assert_eq(at_ck_begin(art, a3, &ck, 1, &committed, NULL, &aerr), 0, "%s", aerr.message);
    cr_assert(committed);
    at_rank_exit(art, a3, 0);
    char *queued = at_create_job("queued", NULL, "contract-key-1");
    char path[512];

    /* ---- jobs ---- */
    want(201, "POST", "/v1/jobs", at_good_spec(), NULL);
    cr_assert_eq(rec("POST", "/v1/jobs", at_good_spec(), NULL, NULL, "Idempotency-Key: contract-key-2", &text), 201,
                 "%s", text);
    free(text);
    cr_assert_eq(rec("POST", "/v1/jobs", at_good_spec(), NULL, NULL, "Idempotency-Key: contract-key-2", &text), 200,
                 "an idempotent retry: %s", text);
    free(text);
    want(400, "POST", "/v1/jobs", "{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"synthetic\"},"
                                  " \"hyperparameters\": {\"lr\": -1}}", NULL);
    want(400, "POST", "/v1/jobs", "{\"model\": ", NULL);
    /* the same Idempotency-Key with another spec */
    static const char other_spec[] = "{\"model\": {\"type\": \"mlp\", \"hidden\": [8], \"n_inputs\": 2,"
                                     " \"n_classes\": 2}, \"data\": {\"train\": \"synthetic\"}}";
    cr_assert_eq(rec("POST", "/v1/jobs", other_spec, NULL, NULL, "Idempotency-Key: contract-key-2", &text), 422,
                 "%s", text);
    cr_assert(strstr(text, "idempotency_key_reused"), "%s", text);
    free(text);
    /* larger than the workers alive: accepted, waits; larger than its queue could ever get: 422 */
    want(201, "POST", "/v1/jobs", "{\"model\": {\"type\": \"mlp\", \"hidden\": [4], \"n_inputs\": 2, \"n_classes\": 2},"
                                  " \"data\": {\"train\": \"synthetic\"}, \"resources\": {\"nodes\": 50},"
                                  " \"hyperparameters\": {\"global_batch_size\": 100}}", NULL);
    want(201, "POST", "/v1/queues", "{\"name\": \"tiny\", \"quota\": {\"cpu\": 1}}", NULL);
    want(422, "POST", "/v1/jobs", "{\"model\": {\"type\": \"mlp\", \"hidden\": [4], \"n_inputs\": 2, \"n_classes\": 2},"
                                  " \"data\": {\"train\": \"synthetic\"}, \"resources\": {\"nodes\": 2}, \"queue\": \"tiny\"}",
         NULL);
    want(400, "POST", "/v1/jobs", "{\"model\": {\"type\": \"mlp\", \"hidden\": [4], \"n_inputs\": 2, \"n_classes\": 2},"
                                  " \"data\": {\"train\": \"synthetic\"}, \"queue\": \"nowhere\"}", NULL);
    want(403, "POST", "/v1/jobs", "{\"project\": \"p\", \"model\": {\"type\": \"mlp\", \"hidden\": [4], \"n_inputs\": 2,"
                                  " \"n_classes\": 2}, \"data\": {\"train\": \"synthetic\"}}", viewer);
    want(200, "GET", "/v1/jobs", NULL, NULL);
    want(200, "GET", "/v1/jobs?status=running,queued&tag=team:nlp&page_size=1", NULL, NULL);
    want(400, "GET", "/v1/jobs?status=SLEEPING", NULL, NULL);
    want(400, "GET", "/v1/jobs?page_size=0", NULL, NULL);
    snprintf(path, sizeof path, "/v1/jobs/%s", running);
    want(200, "GET", path, NULL, NULL);
    snprintf(path, sizeof path, "/v1/jobs/%s", done);
    want(200, "GET", path, NULL, NULL);
    want(404, "GET", "/v1/jobs/not-a-uuid", NULL, NULL);
    snprintf(path, sizeof path, "/v1/jobs/%.8s", running); /* a prefix, as `kiln jobs` shows ids */
    want(200, "GET", path, NULL, NULL);
    want(400, "GET", "/v1/jobs/abc", NULL, NULL); /* too short a prefix */
    snprintf(path, sizeof path, "/v1/jobs/%.8s/events", running);
    want(200, "GET", path, NULL, NULL);
    snprintf(path, sizeof path, "/v1/jobs/%s/events", done);
    want(200, "GET", path, NULL, NULL);
    snprintf(path, sizeof path, "/v1/jobs/%s/logs", running);
    want(200, "GET", path, NULL, NULL);
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?rank=0&limit=2&after_seq=1&since=0", running);
    want(200, "GET", path, NULL, NULL);
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?rank=-1", running);
    want(400, "GET", path, NULL, NULL);
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?since=yesterday", running);
    want(400, "GET", path, NULL, NULL);
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?follow=true", done);
    want(200, "GET", path, NULL, NULL); /* a finished job's stream: history, then end */
    /* a reconnect after the stream's end: nothing more to send */
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?follow=true", done);
    cr_assert_eq(rec("GET", path, NULL, NULL, NULL, "Last-Event-ID: end", &text), 204, "%s", text);
    free(text);
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?follow=maybe", done);
    want(400, "GET", path, NULL, NULL);
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics", running);
    want(200, "GET", path, NULL, NULL);
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?name=train_loss&max_points=2", running);
    want(200, "GET", path, NULL, NULL);
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?max_points=1", running);
    want(400, "GET", path, NULL, NULL);
    /* which attempts' points: every point carries its attempt */
    static const char *const attempts[] = {"all", "latest", "1"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(attempts); i++) {
        snprintf(path, sizeof path, "/v1/jobs/%s/metrics?name=train_loss&attempt=%s", running, attempts[i]);
        cr_assert_eq(rec("GET", path, NULL, NULL, NULL, NULL, &text), 200, "%s", text);
        json_t *am = json_loads(text, 0, NULL);
        json_t *apts = json_object_get(json_array_get(json_object_get(am, "metrics"), 0), "points");
        cr_assert_gt(json_array_size(apts), 0, "attempt=%s: %s", attempts[i], text);
        cr_assert_eq(json_integer_value(json_object_get(json_array_get(apts, 0), "attempt")), attempt, "%s", text);
        json_decref(am);
        free(text);
    }
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?attempt=2", running);
    want(200, "GET", path, NULL, NULL); /* an attempt that reported nothing: empty series */
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?attempt=0", running);
    cr_assert_eq(rec("GET", path, NULL, NULL, NULL, NULL, &text), 400, "%s", text);
    cr_assert(strstr(text, "\"field\":\"attempt\""), "%s", text);
    free(text);
    /* a step range (the web UI's zoom): only steps 2 and 3 of train_loss */
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?name=train_loss&start_step=2&end_step=3", running);
    cr_assert_eq(rec("GET", path, NULL, NULL, NULL, NULL, &text), 200, "%s", text);
    json_t *mr = json_loads(text, 0, NULL);
    json_t *pts = json_object_get(json_array_get(json_object_get(mr, "metrics"), 0), "points");
    cr_assert_eq(json_array_size(pts), 2, "%s", text);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(pts, 0), "step")), 2, "%s", text);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(pts, 1), "step")), 3, "%s", text);
    json_decref(mr);
    free(text);
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?start_step=3&end_step=2", running);
    cr_assert_eq(rec("GET", path, NULL, NULL, NULL, NULL, &text), 400, "%s", text);
    cr_assert(strstr(text, "\"field\":\"end_step\""), "%s", text);
    free(text);
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?start_step=-1", running);
    want(400, "GET", path, NULL, NULL);
    snprintf(path, sizeof path, "/v1/jobs/%s:stop", queued);
    want(400, "POST", path, "{\"reason\": 7}", NULL);
    want(200, "POST", path, "{\"reason\": \"contract test\"}", NULL);
    snprintf(path, sizeof path, "/v1/jobs/%s:stop", done);
    want(409, "POST", path, NULL, NULL);
    static const char pspec[] = "{\"project\": \"p\", \"model\": {\"type\": \"mlp\", \"hidden\": [4],"
                                " \"n_inputs\": 2, \"n_classes\": 2}, \"data\": {\"train\": \"synthetic\"}}";
    cr_assert_eq(rec("POST", "/v1/jobs", pspec, NULL, NULL, NULL, &text), 201, "%s", text);
    char *pjob = json_field(text, "id");
    free(text);
    snprintf(path, sizeof path, "/v1/jobs/%s", pjob);
    want(200, "GET", path, NULL, viewer);
    snprintf(path, sizeof path, "/v1/jobs/%s:stop", pjob);
    want(403, "POST", path, NULL, viewer);
    free(pjob);
    snprintf(path, sizeof path, "/v1/jobs/%s:stop", running);
    want(200, "POST", path, NULL, NULL); /* RUNNING -> STOPPING */

    /* ---- search: the filter language on GET and POST ---- */
    want(200, "GET", "/v1/jobs?filter=state%20!%3D%20FAILED%20AND%20hp.lr%20%3C%201&order_by=created%20desc"
                     "&columns=hp.lr,metrics.train_loss.min,metrics.lr&page_size=2", NULL, NULL);
    want(400, "GET", "/v1/jobs?filter=hp.lrr%20%3C%201", NULL, NULL);
    want(400, "GET", "/v1/jobs?fliter=x", NULL, NULL);
    want(200, "POST", "/v1/jobs:search", "{\"filter\": \"metrics.train_loss.min < 10 OR tags.team = nlp\","
                                         " \"order_by\": \"metrics.train_loss.min\", \"columns\": [\"hp.*\","
                                         " \"metrics.train_loss\"], \"page_size\": 1}", NULL);
    want(200, "POST", "/v1/jobs:search", NULL, NULL);
    want(400, "POST", "/v1/jobs:search", "{\"filter\": \"hp.lr <\"}", NULL);
    want(400, "POST", "/v1/jobs:search", "{\"order\": \"name\"}", NULL);

    /* ---- artifacts: list, download (whole, a range, unchanged, out of range), delete ---- */
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts", art);
    want(200, "GET", path, NULL, NULL);
    snprintf(path, sizeof path, "/v1/jobs/%.8s/artifacts", art); /* a prefix */
    want(200, "GET", path, NULL, NULL);
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts/model_llmc.bin", art);
    want(200, "GET", path, NULL, NULL);
    cr_assert_eq(rec("GET", path, NULL, NULL, NULL, "Range: bytes=0-9", &text), 206, "%s", text);
    cr_assert_str_eq(text, "kiln contr");
    free(text);
    char sha[KILN_SHA256_HEX], inm[128];
    kiln_sha256_hex(model, sizeof model - 1, sha);
    snprintf(inm, sizeof inm, "If-None-Match: \"%s\"", sha);
    cr_assert_eq(rec("GET", path, NULL, NULL, NULL, inm, &text), 304, "%s", text);
    free(text);
    cr_assert_eq(rec("GET", path, NULL, NULL, NULL, "Range: bytes=100000-", &text), 416, "%s", text);
    free(text);
    snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints", art);
    want(200, "GET", path, NULL, NULL);
    want(404, "GET", path, NULL, viewer); /* a job in a project the viewer is not in */
    snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints", running); /* nothing synced */
    want(200, "GET", path, NULL, NULL);
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts/.hidden", art);
    want(400, "GET", path, NULL, NULL);
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts/samples.txt", art);
    want(404, "GET", path, NULL, NULL);
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts/model_llmc.bin", art);
    want(404, "GET", path, NULL, viewer); /* a job in a project the viewer is not in */
    snprintf(path, sizeof path, "/v1/jobs/%s", queued);
    want(200, "DELETE", path, NULL, NULL); /* stopped above */
    snprintf(path, sizeof path, "/v1/jobs/%s", running);
    want(409, "DELETE", path, NULL, NULL); /* still running */
    snprintf(path, sizeof path, "/v1/jobs/%s", art);
    want(200, "DELETE", path, NULL, NULL);
    want(404, "GET", path, NULL, NULL);
    free(art);

    /* ---- code archives: upload (new, again, refused, too large), download ---- */
    {
        char src[256], tgz[300];
        snprintf(src, sizeof src, "%s/contract-src", at_dir_path());
        cr_assert_eq(mkdir(src, 0755), 0);
        snprintf(tgz, sizeof tgz, "%s/train.py", src);
        FILE *f = fopen(tgz, "w");
        fputs("print('contract')\n", f);
        fclose(f);
        snprintf(tgz, sizeof tgz, "%s.tgz", src);
        int fd = open(tgz, O_RDWR | O_CREAT | O_TRUNC, 0600);
        kiln_err_t perr;
        cr_assert_eq(code_pack_dir(src, fd, NULL, 0, NULL, &perr), 0, "%s", perr.message);
        close(fd);
        char *arch = NULL;
        size_t alen = 0;
        cr_assert_eq(kiln_file_read(tgz, &arch, &alen, &perr), 0);
        rec_bytes(201, "/v1/code?project=p", arch, alen, "application/gzip", NULL);
        rec_bytes(200, "/v1/code?project=p", arch, alen, "application/octet-stream", NULL);
        rec_bytes(400, "/v1/code?project=p", "not an archive", 14, "application/gzip", NULL);
        rec_bytes(403, "/v1/code?project=p", arch, alen, "application/gzip", viewer);
        rec_bytes(404, "/v1/code?project=nosuch", arch, alen, "application/gzip", NULL);
        size_t blen = (4 << 20) + 16;
        char *bigarch = calloc(1, blen);
        rec_bytes(413, "/v1/code?project=p", bigarch, blen, "application/gzip", NULL);
        free(bigarch);
        char dsha[KILN_SHA256_HEX], cpath[200], cinm[128];
        kiln_sha256_hex(arch, alen, dsha);
        snprintf(cpath, sizeof cpath, "/v1/code/%s?project=p", dsha);
        want(200, "GET", cpath, NULL, NULL);
        want(200, "GET", cpath, NULL, viewer);
        cr_assert_eq(rec("GET", cpath, NULL, NULL, NULL, "Range: bytes=0-9", &text), 206, "%s", text);
        free(text);
        snprintf(cinm, sizeof cinm, "If-None-Match: \"%s\"", dsha);
        cr_assert_eq(rec("GET", cpath, NULL, NULL, NULL, cinm, &text), 304, "%s", text);
        free(text);
        cr_assert_eq(rec("GET", cpath, NULL, NULL, NULL, "Range: bytes=100000000-", &text), 416, "%s", text);
        free(text);
        snprintf(cpath, sizeof cpath, "/v1/code/%s?project=default", dsha);
        want(404, "GET", cpath, NULL, NULL);
        want(400, "GET", "/v1/code/not-a-digest", NULL, NULL);
        free(arch);
    }

    /* ---- cluster, identity ---- */
    want(200, "GET", "/v1/workers", NULL, NULL);
    want(200, "GET", "/v1/whoami", NULL, NULL);
    want(200, "GET", "/v1/whoami", NULL, viewer);
    want(200, "GET", "/v1/users", NULL, NULL);
    want(403, "GET", "/v1/users", NULL, viewer);
    want(409, "POST", "/v1/users", "{\"name\": \"viewer\"}", NULL);
    want(400, "POST", "/v1/users", "{\"name\": \"x\", \"admin\": true}", NULL);
    want(400, "POST", "/v1/users", "{\"name\": \"Not A Name\"}", NULL);
    want(403, "POST", "/v1/users", "{\"name\": \"bob\"}", viewer);
    want(201, "POST", "/v1/users", "{\"name\": \"root2\", \"cluster_admin\": true}", NULL);
    want(200, "GET", "/v1/users/viewer/tokens", NULL, NULL);
    want(200, "GET", "/v1/users/viewer/tokens", NULL, viewer);
    want(403, "GET", "/v1/users/root2/tokens", NULL, viewer);
    want(404, "GET", "/v1/users/nobody/tokens", NULL, NULL);
    cr_assert_eq(rec("POST", "/v1/users/viewer/tokens", "{\"expires_in_s\": 3600}", NULL, NULL, NULL, &text), 201,
                 "%s", text);
    char *hour = json_field(text, "token");
    free(text);
    /* made with a token that expires: it expires with it, or is refused for outliving it */
    want(201, "POST", "/v1/users/viewer/tokens", NULL, hour);
    want(400, "POST", "/v1/users/viewer/tokens", "{\"expires_in_s\": 86400}", hour);
    free(hour);
    want(201, "POST", "/v1/users/viewer/tokens", NULL, viewer);
    want(400, "POST", "/v1/users/viewer/tokens", "{\"expires_in_s\": \"soon\"}", NULL);
    want(404, "POST", "/v1/users/nobody/tokens", "{}", NULL);
    cr_assert_eq(rec("POST", "/v1/users/root2/tokens", "{}", NULL, NULL, NULL, &text), 201, "%s", text);
    char *victim_id = json_field(text, "id");
    free(text);
    snprintf(path, sizeof path, "/v1/tokens/%s", victim_id);
    want(404, "DELETE", path, NULL, viewer); /* another user's token does not exist for it */
    want(200, "DELETE", path, NULL, NULL);
    cr_assert_eq(rec("POST", "/v1/users/viewer/tokens", "{}", NULL, NULL, NULL, &text), 201, "%s", text);
    char *token_id = json_field(text, "id");
    free(text);
    want(200, "GET", "/v1/projects", NULL, NULL);
    want(200, "GET", "/v1/projects", NULL, viewer);
    want(201, "POST", "/v1/projects", "{\"name\": \"q\"}", NULL);
    want(409, "POST", "/v1/projects", "{\"name\": \"q\"}", NULL);
    want(400, "POST", "/v1/projects", "{}", NULL);
    want(403, "POST", "/v1/projects", "{\"name\": \"r\"}", viewer);
    want(200, "GET", "/v1/projects/p/members", NULL, NULL);
    want(200, "GET", "/v1/projects/p/members", NULL, viewer);
    want(404, "GET", "/v1/projects/q/members", NULL, viewer);
    want(200, "PUT", "/v1/projects/q/members/viewer", "{\"role\": \"editor\"}", NULL);
    want(400, "PUT", "/v1/projects/q/members/viewer", "{\"role\": \"owner\"}", NULL);
    want(403, "PUT", "/v1/projects/p/members/root2", "{\"role\": \"admin\"}", viewer);
    want(404, "PUT", "/v1/projects/q/members/nobody", "{\"role\": \"viewer\"}", NULL);
    want(200, "DELETE", "/v1/projects/q/members/viewer", NULL, NULL);
    want(403, "DELETE", "/v1/projects/p/members/viewer", NULL, viewer);
    /* ---- queues ---- */
    want(201, "POST", "/v1/queues", "{\"name\": \"nlp\", \"cohort\": \"research\", \"quota\": {\"cpu\": 8, \"gpu\": 0},"
         " \"borrowing_limit\": {\"cpu\": 4}, \"lending_limit\": {\"cpu\": 8}, \"weight\": 1, \"projects\": [\"p\"]}", NULL);
    want(201, "POST", "/v1/queues", "{\"name\": \"viewer\", \"quota\": {\"cpu\": 1}}", NULL);
    want(409, "POST", "/v1/queues", "{\"name\": \"nlp\", \"quota\": {}}", NULL);
    want(400, "POST", "/v1/queues", "{\"name\": \"x\", \"quota\": {\"tpu\": 1}}", NULL);
    want(400, "POST", "/v1/queues", "{\"name\": \"x\"}", NULL);
    want(403, "POST", "/v1/queues", "{\"name\": \"x\", \"quota\": {}}", viewer);
    want(200, "GET", "/v1/queues", NULL, viewer);
    want(200, "GET", "/v1/queues/nlp", NULL, viewer);
    want(404, "GET", "/v1/queues/none", NULL, NULL);
    want(200, "PATCH", "/v1/queues/nlp", "{\"weight\": 2, \"borrowing_limit\": null}", NULL);
    want(400, "PATCH", "/v1/queues/nlp", "{\"name\": \"other\"}", NULL);
    want(403, "PATCH", "/v1/queues/nlp", "{\"weight\": 3}", viewer);
    want(404, "PATCH", "/v1/queues/none", "{\"weight\": 3}", NULL);
    want(409, "DELETE", "/v1/queues/default", NULL, NULL);
    want(403, "DELETE", "/v1/queues/nlp", NULL, viewer);
    /* a project's default queue */
    want(201, "POST", "/v1/projects", "{\"name\": \"dq\", \"default_queue\": \"viewer\"}", NULL);
    want(400, "POST", "/v1/projects", "{\"name\": \"dq2\", \"default_queue\": \"nlp\"}", NULL);
    want(200, "PATCH", "/v1/projects/p", "{\"default_queue\": \"nlp\"}", NULL);
    want(400, "PATCH", "/v1/projects/q", "{\"default_queue\": \"nlp\"}", NULL);
    want(400, "PATCH", "/v1/projects/p", "{\"colour\": \"red\"}", NULL);
    want(403, "PATCH", "/v1/projects/p", "{\"default_queue\": null}", viewer);
    want(404, "PATCH", "/v1/projects/none", "{\"default_queue\": null}", NULL);
    want(400, "PATCH", "/v1/projects/p", "{\"default_queue\": \"\"}", NULL);
    want(201, "POST", "/v1/projects", "{\"name\": \"dq3\", \"default_queue\": null}", NULL);
    want(409, "DELETE", "/v1/queues/nlp", NULL, NULL);
    want(409, "PATCH", "/v1/queues/nlp", "{\"projects\": [\"q\"]}", NULL);
    want(200, "PATCH", "/v1/projects/p", "{\"default_queue\": null}", NULL);
    want(200, "DELETE", "/v1/queues/nlp", NULL, NULL);
    want(404, "DELETE", "/v1/queues/nlp", NULL, NULL);
    /* ---- tuning jobs ---- */
    {
        static const char tuning[] =
            "{\"name\": \"sweep\", \"job\": {\"model\": {\"type\": \"mlp\", \"hidden\": [8], \"n_inputs\": 4,"
            " \"n_classes\": 2}, \"data\": {\"train\": \"synthetic\"}, \"hyperparameters\": {\"max_steps\": 50}},"
            " \"parameters\": {\"lr\": {\"type\": \"continuous\", \"min\": 0.0001, \"max\": 0.01, \"scaling\": \"log\"},"
            " \"model.hidden\": {\"type\": \"integer\", \"min\": 1, \"max\": 4}},"
            " \"objective\": {\"metric\": \"val_loss\"}, \"max_jobs\": 2, \"seed\": 1}";
        want(400, "POST", "/v1/tuning-jobs", tuning, NULL); /* model.hidden is a list, not a number */
        char body[1024];
        snprintf(body, sizeof body, "%s", tuning);
        char *h = strstr(body, "\"model.hidden\"");
        memcpy(h, "\"warmup_steps\"", strlen("\"warmup_steps\""));
        memmove(h + strlen("\"warmup_steps\""), h + strlen("\"model.hidden\""), strlen(h + strlen("\"model.hidden\"")) + 1);
        want(403, "POST", "/v1/tuning-jobs", body, viewer);
        cr_assert_eq(rec("POST", "/v1/tuning-jobs", body, NULL, NULL, NULL, &text), 201, "%s", text);
        char *tid = json_field(text, "id");
        free(text);
        want(200, "GET", "/v1/tuning-jobs", NULL, NULL);
        snprintf(path, sizeof path, "/v1/tuning-jobs/%s", tid);
        want(200, "GET", path, NULL, NULL);
        want(404, "GET", "/v1/tuning-jobs/00000000-0000-0000-0000-000000000000", NULL, NULL);
        snprintf(path, sizeof path, "/v1/tuning-jobs/%s:stop", tid);
        want(400, "POST", path, "{\"reason\": \"x\"}", NULL);
        want(200, "POST", path, "{}", NULL);
        want(409, "POST", path, "{}", NULL);
        free(tid);
    }
    /* ---- what agents are trusted with: join tokens, approval, removal, bans ---- */
    cr_assert_eq(rec("POST", "/v1/join-tokens", "{\"uses\": 2, \"expires_in\": \"1h\", \"description\": \"rack 4\"}",
                     NULL, NULL, NULL, &text), 201, "%s", text);
    char *join_id = json_field(text, "id");
    free(text);
    want(201, "POST", "/v1/join-tokens", NULL, NULL); /* the defaults: single-use, 24 hours */
    want(400, "POST", "/v1/join-tokens", "{\"uses\": 0}", NULL);
    want(400, "POST", "/v1/join-tokens", "{\"uses\": \"two\"}", NULL);
    want(400, "POST", "/v1/join-tokens", "{\"expires_in\": \"forever\"}", NULL);
    want(400, "POST", "/v1/join-tokens", "{\"ttl\": 60}", NULL);
    want(403, "POST", "/v1/join-tokens", "{}", viewer);
    want(200, "GET", "/v1/join-tokens", NULL, NULL);
    want(403, "GET", "/v1/join-tokens", NULL, viewer);
    snprintf(path, sizeof path, "/v1/join-tokens/%s", join_id);
    want(403, "DELETE", path, NULL, viewer);
    want(200, "DELETE", path, NULL, NULL);
    want(404, "DELETE", "/v1/join-tokens/jt_nothing", NULL, NULL);
    free(join_id);
    snprintf(path, sizeof path, "/v1/workers/%s:approve", at_worker);
    want(200, "POST", path, NULL, NULL);
    want(400, "POST", path, "{\"now\": true}", NULL);
    want(403, "POST", path, NULL, viewer);
    want(404, "POST", "/v1/workers/w-nothing:approve", NULL, NULL);
    {
        /* a worker of its own to remove */
        Kiln__RegisterRequest req = KILN__REGISTER_REQUEST__INIT;
        Kiln__RegisterResponse reg = KILN__REGISTER_RESPONSE__INIT;
        req.worker_id = "w-contract";
        req.hostname = "contract";
        req.slot_type = "cpu";
        arena_t a;
        arena_init(&a, 0);
        kiln_err_t rerr;
        cr_assert_eq(svc_agent_register(at_svc, &req, NULL, &a, &reg, &rerr), 0, "%s", rerr.message);
        arena_deinit(&a);
    }
    want(400, "DELETE", "/v1/workers/w-contract?bann=true", NULL, NULL);
    want(400, "DELETE", "/v1/workers/w-contract?ban=maybe", NULL, NULL);
    want(400, "DELETE", "/v1/workers/w-contract?reason=why", NULL, NULL); /* a reason goes with a ban */
    want(403, "DELETE", "/v1/workers/w-contract?ban=true", NULL, viewer);
    want(404, "DELETE", "/v1/workers/w-nothing", NULL, NULL);
    cr_assert_eq(rec("DELETE", "/v1/workers/w-contract?ban=true&reason=contract", NULL, NULL, NULL, NULL, &text), 200,
                 "%s", text);
    json_t *removed = json_loads(text, 0, NULL);
    free(text);
    char ban_path[64];
    snprintf(ban_path, sizeof ban_path, "/v1/worker-bans/%lld",
             (long long)json_integer_value(json_object_get(json_object_get(removed, "ban"), "id")));
    json_decref(removed);
    want(200, "DELETE", "/v1/workers/w-contract", NULL, NULL); /* removed already: no ban, no change */
    want(200, "GET", "/v1/worker-bans", NULL, NULL);
    want(403, "GET", "/v1/worker-bans", NULL, viewer);
    want(403, "DELETE", ban_path, NULL, viewer);
    want(200, "DELETE", ban_path, NULL, NULL);
    want(404, "DELETE", ban_path, NULL, NULL);
    want(404, "DELETE", "/v1/worker-bans/first", NULL, NULL);
    /* ---- one-time login links and the web UI ---- */
    cr_assert_eq(rec("POST", "/v1/login-links", NULL, viewer, NULL, NULL, &text), 201, "%s", text);
    char *code = json_field(text, "code");
    free(text);
    want(400, "POST", "/v1/login-links", "{\"ttl\": 60}", NULL);
    want(400, "POST", "/v1/login-links:redeem", "{}", "");
    char redeem[256];
    snprintf(redeem, sizeof redeem, "{\"code\": \"%s\"}", code);
    cr_assert_eq(rec("POST", "/v1/login-links:redeem", redeem, "", NULL, NULL, &text), 200, "%s", text);
    char *session = json_field(text, "token");
    free(text);
    want(401, "POST", "/v1/login-links:redeem", redeem, ""); /* once */
    free(code);
    /* a web UI session token makes no tokens and no login links */
    want(403, "POST", "/v1/users/viewer/tokens", "{}", session);
    want(403, "POST", "/v1/login-links", NULL, session);
    free(session);
    char *page = NULL, *hdrs = NULL;
    cr_assert_eq(rec("GET", "/", NULL, "", NULL, NULL, &page), 200);
    want(200, "GET", "/ui", NULL, "");
    /* the page names its script and stylesheet */
    const char *js = strstr(page, "/ui/app-");
    cr_assert(js, "%s", page);
    char asset[128];
    snprintf(asset, sizeof asset, "%.*s", (int)strcspn(js, "\"'"), js);
    want(200, "GET", asset, NULL, "");
    long st_etag = 0;
    char url[1024];
    snprintf(url, sizeof url, "%s%s", at_base, asset);
    cr_assert_eq(th_http_headers("GET", url, NULL, NULL, &st_etag, &text, &hdrs, 20000), 0);
    free(text);
    const char *et = strcasestr(hdrs, "\nETag:");
    cr_assert(et, "%s", hdrs);
    char ui_inm[160];
    snprintf(ui_inm, sizeof ui_inm, "If-None-Match:%.*s", (int)strcspn(et + 6, "\r\n"), et + 6);
    free(hdrs);
    cr_assert_eq(rec("GET", asset, NULL, "", NULL, ui_inm, &text), 304, "%s", text);
    free(text);
    want(404, "GET", "/ui/app-00000000.js", NULL, "");
    free(page);
    want(200, "GET", "/healthz", NULL, "");
    want(200, "GET", "/readyz", NULL, "");
    want(200, "GET", "/metrics", NULL, "");

    /* ---- what every route gets from its method and flags ---- */
    api_route_info_t routes[128];
    size_t nroutes = api_http_routes(routes, 128);
    cr_assert(nroutes <= 128);
    static char big[1024 * 1024 + 64]; /* past kilnd's 1 MiB */
    memset(big, ' ', sizeof big - 1);
    big[0] = '{';
    big[sizeof big - 2] = '}';
    for (size_t i = 0; i < nroutes; i++) {
        const char *m = routes[i].method, *pat = routes[i].path;
        bool body = !strcmp(m, "POST") || !strcmp(m, "PUT") || !strcmp(m, "PATCH");
        const char *real = fill(pat, false, running, token_id);
        char p2[512];
        kiln_strlcpy(p2, real, sizeof p2);
        if (!routes[i].open && strcmp(pat, "/metrics") != 0) {
            rec(m, p2, body ? "{}" : NULL, "", NULL, NULL, NULL);
            rec(m, p2, body ? "{}" : NULL, "kiln_not-a-token", NULL, NULL, NULL);
        }
        if (body) {
            rec(m, p2, "name=x", NULL, "application/x-www-form-urlencoded", NULL, NULL);
            rec(m, p2, big, NULL, NULL, NULL, NULL);
        }
        if (strchr(pat, '{')) {
            char p3[512];
            kiln_strlcpy(p3, fill(pat, true, running, token_id), sizeof p3);
            rec(m, p3, body ? "{}" : NULL, NULL, NULL, NULL, NULL);
        }
        /* a method no route has: 405 with Allow, once per path */
        bool first = true;
        for (size_t j = 0; j < i; j++)
            first = first && strcmp(routes[j].path, pat) != 0;
        if (first)
            rec("PATCH", p2, NULL, NULL, NULL, NULL, NULL);
    }
    want(404, "GET", "/v2/nothing", NULL, NULL);
    /* a URL and a header block over the HTTP server's buffer: JSON errors, as every other */
    {
        static char longpath[40 * 1024];
        memcpy(longpath, "/v1/jobs?name=", 14);
        memset(longpath + 14, 'x', sizeof longpath - 15);
        rec_refused(414, longpath, NULL);
        static char longhdr[40 * 1024];
        memcpy(longhdr, "X-Filler: ", 10);
        memset(longhdr + 10, 'y', sizeof longhdr - 11);
        rec_refused(431, "/v1/jobs", longhdr);
    }

    /* ---- the database gone: every route answers what it answers then ---- */
    char conn[512];
    snprintf(conn, sizeof conn, "host=%s port=%s user=postgres dbname=postgres", getenv("KILN_PG_HOST"),
             getenv("KILN_PG_PORT") ? getenv("KILN_PG_PORT") : "5432");
    PGconn *pg = PQconnectdb(conn);
    cr_assert_eq(PQstatus(pg), CONNECTION_OK, "%s", PQerrorMessage(pg));
    char sql[512];
    snprintf(sql, sizeof sql, "ALTER DATABASE \"%s\" WITH ALLOW_CONNECTIONS false", at_db_name());
    PQclear(PQexec(pg, sql));
    snprintf(sql, sizeof sql, "datname = '%s'", at_db_name());
    cr_assert(th_pg_end_backends(sql, true, 30000), "the database's backends did not exit");
    for (size_t i = 0; i < nroutes; i++) {
        const char *m = routes[i].method, *pat = routes[i].path;
        bool body = !strcmp(m, "POST") || !strcmp(m, "PUT") || !strcmp(m, "PATCH");
        char p2[512];
        kiln_strlcpy(p2, fill(pat, false, running, token_id), sizeof p2);
        rec(m, p2, body ? "{}" : NULL, NULL, NULL, NULL, NULL);
    }
    snprintf(sql, sizeof sql, "ALTER DATABASE \"%s\" WITH ALLOW_CONNECTIONS true", at_db_name());
    PQclear(PQexec(pg, sql));
    PQfinish(pg);

    /* ---- hand everything to the validator ---- */
    json_t *rt = json_array();
    for (size_t i = 0; i < nroutes; i++)
        json_array_append_new(rt, json_pack("{s:s, s:s, s:b}", "method", routes[i].method, "path", routes[i].path,
                                            "open", routes[i].open));
    json_t *all = json_pack("{s:o, s:O}", "routes", rt, "records", records);
    char dir[] = "/tmp/kiln-contract.XXXXXX";
    cr_assert(mkdtemp(dir));
    char file[128], out_file[160], cmd[1024];
    snprintf(file, sizeof file, "%s/responses.json", dir);
    cr_assert_eq(json_dump_file(all, file, JSON_INDENT(1)), 0);
    json_decref(all);
    const char *root = getenv("KILN_ROOT") ? getenv("KILN_ROOT") : ".";
    snprintf(out_file, sizeof out_file, "%s/check.txt", dir);
    snprintf(cmd, sizeof cmd, "node %s/tools/openapi-check.mjs %s/api/openapi.yaml %s > %s 2>&1", root, root, file,
             out_file);
    int rc = system(cmd);
    char *report = NULL;
    kiln_err_t err;
    kiln_file_read(out_file, &report, NULL, &err);
    fprintf(stderr, "%s", report ? report : "");
    cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 0,
              "api/openapi.yaml disagrees with the server (responses kept in %s):\n%.6000s", file,
              report ? report : "");
    free(report);
    cr_assert(th_rm_tree(dir), "could not remove %s", dir);
    free(viewer);
    free(running);
    free(done);
    free(queued);
    free(victim_id);
    free(token_id);
    at_teardown();
}

/* Every job route takes a unique prefix of the id, resolved by kilnd among the jobs the caller
 * can see; a prefix several jobs share is refused with the candidates. */
Test(contract, job_id_prefixes)
{
    at_setup();
    records = json_array();
    /* jobs until two share their first 4 characters (about 300 expected; bounded) */
    char (*ids)[40] = calloc(3000, 40);
    int n = 0, a = -1, b = -1;
    for (; n < 3000 && a < 0; n++) {
        char *id = at_create_job("p", NULL, NULL);
        kiln_strlcpy(ids[n], id, 40);
        free(id);
        for (int k = 0; k < n && a < 0; k++)
            if (!strncmp(ids[k], ids[n], 4)) {
                a = k;
                b = n;
            }
    }
    cr_assert(a >= 0, "no two of %d job ids share 4 characters", n);
    char path[128], *text = NULL;
    snprintf(path, sizeof path, "/v1/jobs/%.4s", ids[a]);
    long st = rec("GET", path, NULL, NULL, NULL, NULL, &text);
    cr_assert_eq(st, 400, "%s", text);
    cr_assert(strstr(text, "ambiguous") && strstr(text, "more characters"), "%s", text);
    free(text);
    /* the shortest prefix that tells them apart names one job on every route */
    size_t len = 4;
    while (ids[a][len] == ids[b][len])
        len++;
    len++;
    static const char *const tails[] = {"", "/events", "/logs", "/metrics"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(tails); i++) {
        snprintf(path, sizeof path, "/v1/jobs/%.*s%s", (int)len, ids[b], tails[i]);
        cr_assert_eq(rec("GET", path, NULL, NULL, NULL, NULL, &text), 200, "%s: %s", path, text);
        if (!tails[i][0])
            cr_assert(strstr(text, ids[b]), "the prefix named %s: %s", ids[b], text);
        free(text);
    }
    snprintf(path, sizeof path, "/v1/jobs/%.*s:stop", (int)len, ids[b]);
    cr_assert_eq(rec("POST", path, NULL, NULL, NULL, NULL, &text), 200, "%s", text);
    cr_assert(strstr(text, ids[b]) && strstr(text, "STOPPED"), "%s", text);
    free(text);
    /* a viewer of another project does not see them: not found, not ambiguous */
    json_decref(at_req("POST", "/v1/projects", "{\"name\": \"other\"}", NULL, &st, NULL));
    json_decref(at_req("POST", "/v1/users", "{\"name\": \"stranger\"}", NULL, &st, NULL));
    json_t *t = at_req("POST", "/v1/users/stranger/tokens", "{}", NULL, &st, NULL);
    cr_assert_eq(st, 201);
    snprintf(path, sizeof path, "/v1/jobs/%.4s", ids[a]);
    st = rec("GET", path, NULL, json_string_value(json_object_get(t, "token")), NULL, NULL, &text);
    cr_assert_eq(st, 404, "%s", text);
    free(text);
    json_decref(t);
    free(ids);
    json_decref(records);
    at_teardown();
}

/* Runs a command from the repository root; asserts it exits 0 and shows its output if not. */
static void run_tool(const char *what, const char *cmdline)
{
    const char *root = getenv("KILN_ROOT") ? getenv("KILN_ROOT") : ".";
    char dir[] = "/tmp/kiln-lint.XXXXXX";
    cr_assert(mkdtemp(dir));
    char cmd[2048], out_file[128];
    snprintf(out_file, sizeof out_file, "%s/out.txt", dir);
    snprintf(cmd, sizeof cmd, "cd %s && %s > %s 2>&1", root, cmdline, out_file);
    int rc = system(cmd);
    char *report = NULL;
    kiln_err_t err;
    kiln_file_read(out_file, &report, NULL, &err);
    if (!th_rm_tree(dir))
        fprintf(stderr, "could not remove %s\n", dir);
    cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "%s failed:\n%.8000s", what, report ? report : "");
    free(report);
}

Test(contract, redocly_lint)
{
    /* clean: no error and no warning either */
    run_tool("redocly lint", "out=$(REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true "
                             "tools/node_modules/.bin/redocly lint --format=stylish --config tools/redocly.yaml "
                             "api/openapi.yaml 2>&1); rc=$?; echo \"$out\"; "
                             "[ $rc -eq 0 ] && ! echo \"$out\" | grep -qE ' (warning|error) '");
}

Test(contract, spectral_lint)
{
    run_tool("spectral lint", "tools/node_modules/.bin/spectral lint --fail-severity=warn "
                              "--ruleset tools/spectral.yaml api/openapi.yaml");
}

Test(contract, proto_and_openapi_field_names)
{
    run_tool("proto and OpenAPI field names", "/usr/bin/python3 tools/proto_names.py proto/kiln.proto api/openapi.yaml");
}
