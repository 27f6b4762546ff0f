/* test_parity.c - REST and gRPC say the same thing for queues and tuning jobs: tables of requests,
 * each sent over REST (JSON) and over gRPC (Python's grpcio, proto JSON) to one in-process kilnd
 * on a fresh database. A refusal has the same status class, message, detail and hint on both
 * (the field named as each request names it); what both accept has the same effect, and the
 * queues both answer carry the same information. Not the round trips (test_grpc.c). */
#include "tests/grpc/grpc_test.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static gt_kilnd_t K;
static svc_t *S;
static const char *const dir = K.dir;

static void setup(void)
{
    /* the answers are compared here; who may call what is test_grpc_auth.c's and test_authz.c's */
    gt_start(&K, &(gt_opts_t){.name = "parity", .http = true,
                              .svc = {.sched_interval_ms = 100, .auth_disabled = true}});
    S = K.svc;
}

static void teardown(void)
{
    gt_stop(&K);
}

TestSuite(parity, .init = setup, .fini = teardown, .timeout = 60);

/* One request said both ways. */
typedef struct parity_case {
    const char *what;
    const char *method, *path, *rest; /* REST: body NULL for none */
    const char *rpc;                  /* TrainingService's method */
    const char *grpc;                 /* its request as proto JSON; NULL: {"<wrap>": rest} */
    long status;                      /* REST's; 2xx: both accept */
    const char *code;                 /* gRPC's status name (for a refusal) */
    const char *field, *gfield;       /* the field each names ("" none) */
} parity_case_t;

static const char *str(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

/* Sends every case both ways (REST first, then all of gRPC in one grpcio process) and checks
 * that they answer alike. */
static void walk(const parity_case_t *cases, size_t n, const char *wrap, const char *name)
{
    json_t *rest[64], *calls = json_array();
    long status[64];
    cr_assert_leq(n, 64);
    for (size_t i = 0; i < n; i++) {
        const parity_case_t *c = &cases[i];
        rest[i] = gt_rest(&K, c->method, c->path, c->rest, &status[i]);
        json_error_t je;
        json_t *req = c->grpc ? json_loads(c->grpc, JSON_ALLOW_NUL, &je)
                              : json_pack("{s:O}", wrap, json_loads(c->rest, 0, &je));
        cr_assert_not_null(req, "%s: %s", c->what, je.text);
        if (!c->grpc)
            json_decref(json_object_get(req, wrap)); /* the pack's O took its own reference */
        char m[120];
        snprintf(m, sizeof m, "/kiln.TrainingService/%s", c->rpc);
        json_array_append_new(calls, json_pack("{s:s, s:o}", "method", m, "request", req));
    }
    json_t *ans = gt_grpc_calls(&K, calls, name);
    cr_assert_eq(json_array_size(ans), n);
    /* every difference, not only the first */
    char diffs[16384] = "";
    size_t nd = 0;
#define DIFF(cond, ...)                                                                                      \
    do {                                                                                                     \
        if (!(cond) && strlen(diffs) < sizeof diffs - 1) {                                                   \
            nd++;                                                                                            \
            snprintf(diffs + strlen(diffs), sizeof diffs - strlen(diffs), __VA_ARGS__);                      \
        }                                                                                                    \
    } while (0)
    for (size_t i = 0; i < n; i++) {
        const parity_case_t *c = &cases[i];
        const json_t *r = rest[i], *g = json_array_get(ans, i), *md = json_object_get(g, "trailing");
        char *rtext = json_dumps(r, JSON_COMPACT), *gtext = json_dumps(g, JSON_COMPACT);
        /* gRPC's one message: "FIELD: MESSAGE", then the detail and the hint on lines of their own */
        const char *gf = c->gfield ? c->gfield : "", *msg = str(r, "message");
        bool named = gf[0] && strncmp(msg, gf, strlen(gf)) != 0;
        char want[1400];
        snprintf(want, sizeof want, "%s%s%s%s%s%s%s", named ? gf : "", named ? ": " : "", msg,
                 str(r, "detail")[0] ? "\n" : "", str(r, "detail"), str(r, "hint")[0] ? "\nhint: " : "",
                 str(r, "hint"));
        if (c->status < 300) {
            DIFF(status[i] == c->status && !strcmp(str(g, "code"), "OK"),
                 "\n%s: both should accept:\n  REST %ld %s\n  gRPC %s", c->what, status[i], rtext, gtext);
        } else {
            DIFF(status[i] == c->status && !strcmp(str(g, "code"), c->code) && !strcmp(str(r, "field"), c->field) &&
                     !strcmp(str(md, "kiln-field"), gf) && !strcmp(str(md, "kiln-code"), str(r, "code")) &&
                     !strcmp(str(md, "kiln-hint"), str(r, "hint")) &&
                     !strcmp(str(md, "kiln-detail"), str(r, "detail")) && !strcmp(str(g, "details"), want),
                 "\n%s: want %ld / %s naming %s / %s alike:\n  REST %ld %s\n  gRPC %s", c->what, c->status, c->code,
                 c->field, gf, status[i], rtext, gtext);
        }
        free(rtext);
        free(gtext);
        json_decref(rest[i]);
    }
#undef DIFF
    cr_assert_eq(nd, 0, "%zu of %zu case(s) differ:%s", nd, n, diffs);
    json_decref(ans);
}

/* ---- queues ------------------------------------------------------------------------------------ */

/* A Queue of ListQueues (proto JSON, where a zero value is left out) as REST's JSON has it. */
static json_t *queue_as_rest(const json_t *g)
{
    json_t *q = json_object();
    static const char *const strs[] = {"name", "created_at", "created_by", "updated_at"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(strs); i++)
        json_object_set_new(q, strs[i], json_string(str(g, strs[i])));
    json_object_set_new(q, "cohort", str(g, "cohort")[0] ? json_string(str(g, "cohort")) : json_null());
    json_t *quota = json_object_get(g, "quota");
    json_object_set_new(q, "quota", json_is_true(json_object_get(g, "unlimited_quota")) ? json_null()
                                    : quota ? json_copy(quota) : json_object());
    static const char *const maps[] = {"borrowing_limit", "lending_limit", "usage"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(maps); i++) {
        json_t *m = json_object_get(g, maps[i]);
        json_object_set_new(q, maps[i], m ? json_copy(m) : json_object());
    }
    json_object_set_new(q, "weight", json_real(json_number_value(json_object_get(g, "weight"))));
    json_t *p = json_object_get(g, "projects");
    json_object_set_new(q, "projects", p ? json_copy(p) : json_array());
    json_object_set_new(q, "fair_sharing", json_boolean(json_is_true(json_object_get(g, "fair_sharing"))));
    json_t *pre = json_object_get(g, "preemption");
    json_object_set_new(q, "preemption", pre ? json_copy(pre) : json_object());
    json_object_set_new(q, "pending", json_integer(json_integer_value(json_object_get(g, "pending"))));
    json_object_set_new(q, "admitted", json_integer(json_integer_value(json_object_get(g, "admitted"))));
    return q;
}

/* The queue called name in a list of queues (borrowed). */
static json_t *named(const json_t *queues, const char *name)
{
    for (size_t i = 0; i < json_array_size(queues); i++)
        if (!strcmp(str(json_array_get(queues, i), "name"), name))
            return json_array_get(queues, i);
    cr_assert_fail("no queue \"%s\"", name);
    return NULL;
}

/* What a queue is, without what only its name and its times say. */
static json_t *config_of(const json_t *q)
{
    json_t *c = json_deep_copy(q);
    static const char *const drop[] = {"name", "created_at", "updated_at", "created_by"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(drop); i++)
        json_object_del(c, drop[i]);
    return c;
}

#define Q "\"quota\": {\"cpu\": 8, \"gpu\": 0}"
#define GQ(fields) "{\"queue\": {" fields "}}"
#define UPD(name, fields, mask) "{\"name\": \"" name "\", \"queue\": {" fields "}, \"update_mask\": " mask "}"

/* Every field of a queue refused alike, and each value REST accepts said over gRPC with the same
 * effect: quota null (unlimited_quota), quota {}, a limit or cohort cleared, weight, projects []
 * and fair_sharing false on an update; then every queue answers alike on both. */
Test(parity, queues_refuse_and_accept_alike_over_rest_and_grpc)
{
    gt_python_ready(dir);
    /* a pair of queues to change, one for each API, alike */
    static const char *const pair[] = {"rq", "gq"};
    for (int i = 0; i < 2; i++) {
        char body[300];
        long st;
        snprintf(body, sizeof body, "{\"name\": \"%s\", \"cohort\": \"team\", " Q ", \"borrowing_limit\": {\"cpu\": 2},"
                 " \"fair_sharing\": true, \"weight\": 3}", pair[i]);
        json_decref(gt_rest(&K, "POST", "/v1/queues", body, &st));
        cr_assert_eq(st, 201);
    }
    static const parity_case_t cases[] = {
        /* create: refused */
        {"no name", "POST", "/v1/queues", "{" Q "}", "CreateQueue", NULL, 400, "INVALID_ARGUMENT", "name",
         "queue.name"},
        {"bad name", "POST", "/v1/queues", "{\"name\": \"Bad name\", " Q "}", "CreateQueue", NULL, 400,
         "INVALID_ARGUMENT", "name", "queue.name"},
        {"no quota", "POST", "/v1/queues", "{\"name\": \"x\"}", "CreateQueue", NULL, 400, "INVALID_ARGUMENT",
         "quota", "queue.quota"},
        {"quota's slot type", "POST", "/v1/queues", "{\"name\": \"x\", \"quota\": {\"tpu\": 1}}", "CreateQueue", NULL,
         400, "INVALID_ARGUMENT", "quota.tpu", "queue.quota.tpu"},
        {"quota below 0", "POST", "/v1/queues", "{\"name\": \"x\", \"quota\": {\"cpu\": -1}}", "CreateQueue", NULL,
         400, "INVALID_ARGUMENT", "quota.cpu", "queue.quota.cpu"},
        {"quota too large", "POST", "/v1/queues", "{\"name\": \"x\", \"quota\": {\"gpu\": 1000001}}", "CreateQueue",
         NULL, 400, "INVALID_ARGUMENT", "quota.gpu", "queue.quota.gpu"},
        {"bad cohort", "POST", "/v1/queues", "{\"name\": \"x\", \"cohort\": \"A B\", " Q "}", "CreateQueue", NULL, 400,
         "INVALID_ARGUMENT", "cohort", "queue.cohort"},
        {"a limit without a cohort", "POST", "/v1/queues", "{\"name\": \"x\", " Q ", \"borrowing_limit\": {\"cpu\": 1}}",
         "CreateQueue", NULL, 400, "INVALID_ARGUMENT", "borrowing_limit", "queue.borrowing_limit"},
        {"a limit below 0", "POST", "/v1/queues",
         "{\"name\": \"x\", \"cohort\": \"c\", " Q ", \"lending_limit\": {\"gpu\": -1}}", "CreateQueue", NULL, 400,
         "INVALID_ARGUMENT", "lending_limit.gpu", "queue.lending_limit.gpu"},
        {"no quota limit in a cohort", "POST", "/v1/queues", "{\"name\": \"x\", \"cohort\": \"c\", \"quota\": null}",
         "CreateQueue", GQ("\"name\": \"x\", \"cohort\": \"c\", \"unlimited_quota\": true"), 400, "INVALID_ARGUMENT",
         "quota", "queue.quota"},
        {"weight below 0", "POST", "/v1/queues", "{\"name\": \"x\", " Q ", \"weight\": -1}", "CreateQueue", NULL, 400,
         "INVALID_ARGUMENT", "weight", "queue.weight"},
        {"weight too large", "POST", "/v1/queues", "{\"name\": \"x\", " Q ", \"weight\": 1e7}", "CreateQueue", NULL, 400,
         "INVALID_ARGUMENT", "weight", "queue.weight"},
        {"no such project", "POST", "/v1/queues", "{\"name\": \"x\", " Q ", \"projects\": [\"nope\"]}", "CreateQueue",
         NULL, 400, "INVALID_ARGUMENT", "projects[0]", "queue.projects[0]"},
        {"a project twice", "POST", "/v1/queues", "{\"name\": \"x\", " Q ", \"projects\": [\"default\", \"default\"]}",
         "CreateQueue", NULL, 400, "INVALID_ARGUMENT", "projects[1]", "queue.projects[1]"},
        {"an output-only field", "POST", "/v1/queues", "{\"name\": \"x\", " Q ", \"usage\": {\"cpu\": 1}}",
         "CreateQueue", NULL, 400, "INVALID_ARGUMENT", "usage", "queue.usage"},
        {"a name taken", "POST", "/v1/queues", "{\"name\": \"default\", " Q "}", "CreateQueue", NULL, 409,
         "ALREADY_EXISTS", "name", "queue.name"},
        {"a preemption value within the queue", "POST", "/v1/queues",
         "{\"name\": \"x\", " Q ", \"preemption\": {\"within_queue\": \"any\"}}", "CreateQueue", NULL, 400,
         "INVALID_ARGUMENT", "preemption.within_queue", "queue.preemption.within_queue"},
        {"a preemption value of reclaim", "POST", "/v1/queues",
         "{\"name\": \"x\", " Q ", \"preemption\": {\"reclaim_within_cohort\": \"LowerPriority\"}}", "CreateQueue",
         NULL, 400, "INVALID_ARGUMENT", "preemption.reclaim_within_cohort", "queue.preemption.reclaim_within_cohort"},
        /* create: accepted alike */
        {"no quota limit", "POST", "/v1/queues", "{\"name\": \"r-unlimited\", \"quota\": null}", "CreateQueue",
         GQ("\"name\": \"g-unlimited\", \"unlimited_quota\": true"), 201, NULL, NULL, NULL},
        {"a quota of nothing", "POST", "/v1/queues", "{\"name\": \"r-zero\", \"quota\": {}}", "CreateQueue",
         GQ("\"name\": \"g-zero\", \"quota\": {\"cpu\": 0, \"gpu\": 0}"), 201, NULL, NULL, NULL},
        {"every field", "POST", "/v1/queues",
         "{\"name\": \"r-all\", \"cohort\": \"c\", " Q ", \"borrowing_limit\": {\"cpu\": 4}, \"lending_limit\": "
         "{\"gpu\": 0}, \"weight\": 0.5, \"projects\": [\"default\"], \"fair_sharing\": true, \"preemption\": "
         "{\"within_queue\": \"never\", \"reclaim_within_cohort\": \"lower_priority\"}}", "CreateQueue",
         GQ("\"name\": \"g-all\", \"cohort\": \"c\", " Q ", \"borrowing_limit\": {\"cpu\": 4}, \"lending_limit\": "
            "{\"gpu\": 0}, \"weight\": 0.5, \"projects\": [\"default\"], \"fair_sharing\": true, \"preemption\": "
            "{\"within_queue\": \"never\", \"reclaim_within_cohort\": \"lower_priority\"}"), 201, NULL, NULL,
         NULL},
        /* update: refused */
        {"weight 0", "PATCH", "/v1/queues/rq", "{\"weight\": 0}", "UpdateQueue", UPD("gq", "", "[\"weight\"]"), 400,
         "INVALID_ARGUMENT", "weight", "queue.weight"},
        {"a new name", "PATCH", "/v1/queues/rq", "{\"name\": \"other\"}", "UpdateQueue",
         UPD("gq", "\"name\": \"other\"", "[\"name\"]"), 400, "INVALID_ARGUMENT", "name", "name"},
        {"a cohort's queue without a quota limit", "PATCH", "/v1/queues/rq", "{\"quota\": null}", "UpdateQueue",
         UPD("gq", "\"unlimited_quota\": true", "[\"quota\"]"), 400, "INVALID_ARGUMENT", "quota", "queue.quota"},
        {"an unknown field", "PATCH", "/v1/queues/rq", "{\"pending\": 0}", "UpdateQueue",
         UPD("gq", "", "[\"pending\"]"), 400, "INVALID_ARGUMENT", "pending", "queue.pending"},
        {"no such queue", "PATCH", "/v1/queues/none", "{\"weight\": 2}", "UpdateQueue",
         UPD("none", "\"weight\": 2", "[\"weight\"]"), 404, "NOT_FOUND", "name", "name"},
        {"deleting default", "DELETE", "/v1/queues/default", NULL, "DeleteQueue", "{\"name\": \"default\"}", 409,
         "FAILED_PRECONDITION", "name", "name"},
        /* a NUL is quoted as the byte it is both ways (REST's read "q\xc0\x80x", how http.c carries %00) */
        {"a name with a NUL", "GET", "/v1/queues/q%00x", NULL, "GetQueue", "{\"name\": \"q\\u0000x\"}", 400,
         "INVALID_ARGUMENT", "name", "name"},
        /* update: accepted alike */
        {"fair_sharing false", "PATCH", "/v1/queues/rq", "{\"fair_sharing\": false}", "UpdateQueue",
         UPD("gq", "", "[\"fair_sharing\"]"), 200, NULL, NULL, NULL},
        {"projects none", "PATCH", "/v1/queues/rq", "{\"projects\": []}", "UpdateQueue",
         UPD("gq", "", "[\"projects\"]"), 200, NULL, NULL, NULL},
        {"a limit cleared and weight", "PATCH", "/v1/queues/rq", "{\"borrowing_limit\": null, \"weight\": 0.25}",
         "UpdateQueue", UPD("gq", "\"weight\": 0.25", "[\"borrowing_limit\", \"weight\"]"), 200, NULL, NULL, NULL},
        {"no cohort, no quota limit", "PATCH", "/v1/queues/rq", "{\"cohort\": null, \"quota\": null}", "UpdateQueue",
         UPD("gq", "\"unlimited_quota\": true", "[\"cohort\", \"unlimited_quota\"]"), 200, NULL, NULL, NULL},
        {"one preemption value", "PATCH", "/v1/queues/rq", "{\"preemption\": {\"reclaim_within_cohort\": \"never\"}}",
         "UpdateQueue", UPD("gq", "\"preemption\": {\"reclaim_within_cohort\": \"never\"}", "[\"preemption\"]"), 200,
         NULL, NULL, NULL},
        {"a preemption value by its path", "PATCH", "/v1/queues/rq", "{\"preemption\": {\"within_queue\": \"never\"}}",
         "UpdateQueue", UPD("gq", "\"preemption\": {\"within_queue\": \"never\"}", "[\"preemption.within_queue\"]"),
         200, NULL, NULL, NULL},
        {"a preemption value's default by its path", "PATCH", "/v1/queues/rq",
         "{\"preemption\": {\"reclaim_within_cohort\": null}}", "UpdateQueue",
         UPD("gq", "", "[\"preemption.reclaim_within_cohort\"]"), 200, NULL, NULL, NULL},
        {"a preemption value refused by its path", "PATCH", "/v1/queues/rq",
         "{\"preemption\": {\"within_queue\": \"x\"}}", "UpdateQueue",
         UPD("gq", "\"preemption\": {\"within_queue\": \"x\"}", "[\"preemption.within_queue\"]"), 400,
         "INVALID_ARGUMENT", "preemption.within_queue", "queue.preemption.within_queue"},
        {"an unknown preemption field by its path", "PATCH", "/v1/queues/rq", "{\"preemption\": {\"nope\": \"never\"}}",
         "UpdateQueue", UPD("gq", "", "[\"preemption.nope\"]"), 400, "INVALID_ARGUMENT", "preemption.nope",
         "queue.preemption.nope"},
        {"a preemption value refused on update", "PATCH", "/v1/queues/rq", "{\"preemption\": {\"within_queue\": \"x\"}}",
         "UpdateQueue", UPD("gq", "\"preemption\": {\"within_queue\": \"x\"}", "[\"preemption\"]"), 400,
         "INVALID_ARGUMENT", "preemption.within_queue", "queue.preemption.within_queue"},
    };
    walk(cases, KILN_ARRAY_LEN(cases), "queue", "queues");

    /* what each pair made is alike, and both APIs answer every queue alike */
    long st;
    json_t *rl = gt_rest(&K, "GET", "/v1/queues", NULL, &st);
    cr_assert_eq(st, 200);
    json_t *rqs = json_object_get(rl, "queues");
    static const char *const made[][2] = {{"r-unlimited", "g-unlimited"}, {"r-zero", "g-zero"}, {"r-all", "g-all"},
                                          {"rq", "gq"}};
    for (size_t i = 0; i < KILN_ARRAY_LEN(made); i++) {
        json_t *a = config_of(named(rqs, made[i][0])), *b = config_of(named(rqs, made[i][1]));
        char *at = json_dumps(a, JSON_SORT_KEYS), *bt = json_dumps(b, JSON_SORT_KEYS);
        cr_assert(json_equal(a, b), "REST made %s, gRPC %s", at, bt);
        free(at);
        free(bt);
        json_decref(a);
        json_decref(b);
    }
    cr_assert(json_is_null(json_object_get(named(rqs, "gq"), "quota")) &&
              json_equal(json_object_get(named(rqs, "gq"), "projects"), json_array()),
              "the updates took");
    json_t *ans = gt_grpc_calls(&K, json_pack("[{s:s}]", "method", "/kiln.TrainingService/ListQueues"), "list");
    json_t *gqs = json_object_get(json_object_get(json_array_get(ans, 0), "response"), "queues");
    cr_assert_eq(json_array_size(gqs), json_array_size(rqs));
    for (size_t i = 0; i < json_array_size(gqs); i++) {
        json_t *g = queue_as_rest(json_array_get(gqs, i)), *r = json_deep_copy(json_array_get(rqs, i));
        /* JSON has one kind of number: REST's weight 1 is proto's 1.0 */
        json_object_set_new(r, "weight", json_real(json_number_value(json_object_get(r, "weight"))));
        char *gt = json_dumps(g, JSON_SORT_KEYS), *rt = json_dumps(r, JSON_SORT_KEYS);
        cr_assert(json_equal(g, r), "gRPC answers %s, REST %s", gt, rt);
        free(gt);
        free(rt);
        json_decref(g);
        json_decref(r);
    }
    json_decref(ans);
    json_decref(rl);
}

/* unlimited_quota is gRPC's alone; with quota entries it says two things */
Test(parity, unlimited_quota_with_entries_is_refused)
{
    gt_python_ready(dir);
    json_t *ans = gt_grpc_calls(&K,
                                json_pack("[{s:s, s:{s:{s:s, s:b, s:{s:i}}}}]", "method",
                                          "/kiln.TrainingService/CreateQueue", "request", "queue", "name", "x",
                                          "unlimited_quota", 1, "quota", "cpu", 1),
                                "both");
    json_t *g = json_array_get(ans, 0);
    cr_assert_str_eq(str(g, "code"), "INVALID_ARGUMENT");
    cr_assert_str_eq(str(json_object_get(g, "trailing"), "kiln-field"), "queue.unlimited_quota");
    json_decref(ans);
}

/* ---- tuning jobs ------------------------------------------------------------------------------- */

#define JOB                                                                                                   \
    "\"job\": {\"name\": \"base\", \"model\": {\"type\": \"mlp\", \"hidden\": [8], \"n_inputs\": 4, \"n_classes\": 2},"  \
    " \"data\": {\"train\": \"synthetic\"}, \"hyperparameters\": {\"lr\": 0.01, \"global_batch_size\": 8,"      \
    " \"max_steps\": 30}, \"resources\": {\"nodes\": 1, \"slots_per_node\": 1, \"slot_type\": \"cpu\"}}"
#define LR "\"lr\": {\"type\": \"continuous\", \"min\": 0.001, \"max\": 0.01}"
#define OBJ "\"objective\": {\"metric\": \"val_loss\"}"
/* A tuning job's body: the base job, lr's range, the objective, and more members. */
#define TJ(more) "{\"name\": \"t\", " JOB ", \"parameters\": {" LR "}, " OBJ more "}"
#define TJP(params, more) "{\"name\": \"t\", " JOB ", \"parameters\": {" params "}, " OBJ more "}"
#define HB                                                                                                    \
    "{\"name\": \"hb\", " JOB ", \"parameters\": {" LR "}, " OBJ ", \"strategy\": \"hyperband\", \"hyperband\": "  \
    "{\"min_resource\": 10, \"max_resource\": 90, \"reduction_factor\": 3, \"brackets\": 2, \"max_rungs\": 3, "  \
    "\"sampler\": \"tpe\"}, "                                                                                       \
    "\"max_jobs\": 3, \"seed\": 5}"
#define NOBODY "00000000-0000-4000-8000-000000000000"
#define TREFUSED(what, body, field) \
    {what, "POST", "/v1/tuning-jobs", body, "CreateTuningJob", NULL, 400, "INVALID_ARGUMENT", field, \
     "tuning_job." field}

/* Whether the gRPC answer g (proto JSON, zero values left out) says everything the REST answer r
 * does: each member of r under its own name or, for what REST carries as free JSON, as its text
 * under NAME_json; a difference is written to why (path: what). */
static bool says_alike(const json_t *r, const json_t *g, const char *path, char *why, size_t n)
{
    if (json_is_object(r)) {
        const char *k;
        json_t *rv;
        json_object_foreach((json_t *)r, k, rv) {
            char p[256], jk[80];
            snprintf(p, sizeof p, "%s.%s", path, k);
            snprintf(jk, sizeof jk, "%s_json", k);
            json_t *gv = json_object_get(g, k), *gj = json_object_get(g, jk);
            if (!gv && json_is_string(gj)) {
                json_t *parsed = json_loads(json_string_value(gj), JSON_DECODE_ANY, NULL);
                bool same = parsed && says_alike(rv, parsed, p, why, n);
                json_decref(parsed);
                if (!same)
                    return false;
                continue;
            }
            bool zero = json_is_null(rv) || json_is_false(rv) || (json_is_number(rv) && json_number_value(rv) == 0) ||
                        (json_is_string(rv) && !json_string_length(rv)) ||
                        ((json_is_array(rv) || json_is_object(rv)) && !json_array_size(rv) && !json_object_size(rv));
            if (!gv && zero)
                continue;
            if (!gv) {
                snprintf(why, n, "%s: gRPC has no %s", p, k);
                return false;
            }
            if (!says_alike(rv, gv, p, why, n))
                return false;
        }
        return true;
    }
    if (json_is_array(r)) {
        if (json_array_size(r) != json_array_size(g)) {
            snprintf(why, n, "%s: %zu entries over REST, %zu over gRPC", path, json_array_size(r), json_array_size(g));
            return false;
        }
        for (size_t i = 0; i < json_array_size(r); i++) {
            char p[256];
            snprintf(p, sizeof p, "%s[%zu]", path, i);
            if (!says_alike(json_array_get(r, i), json_array_get(g, i), p, why, n))
                return false;
        }
        return true;
    }
    /* proto JSON writes an int64 as its decimal text; REST writes a double with 15 significant
     * digits, gRPC has all of it */
    double rn = json_number_value(r), gn = json_number_value(g);
    bool same = json_equal(r, g) || (json_is_number(r) && json_is_number(g) && fabs(rn - gn) <= 1e-14 * fabs(gn)) ||
                (json_is_integer(r) && json_is_string(g) && strtoll(json_string_value(g), NULL, 10) == json_integer_value(r));
    if (!same) {
        char *a = json_dumps(r, JSON_ENCODE_ANY), *b = json_dumps(g, JSON_ENCODE_ANY);
        snprintf(why, n, "%s: REST %s, gRPC %s", path, a, b);
        free(a);
        free(b);
    }
    return same;
}

/* Every field of a tuning job's body refused alike (a categorical parameter's values travel as
 * JSON text over gRPC), and one accepted by both. */
Test(parity, tuning_jobs_refuse_and_accept_alike_over_rest_and_grpc)
{
    gt_python_ready(dir);
    static const parity_case_t cases[] = {
        TREFUSED("a bad name", "{\"name\": \"Bad name!\", " JOB ", \"parameters\": {" LR "}, " OBJ "}", "name"),
        TREFUSED("no job", "{\"parameters\": {" LR "}, " OBJ "}", "job"),
        TREFUSED("no parameters", "{" JOB ", " OBJ "}", "parameters"),
        TREFUSED("a parameter's type", TJP("\"lr\": {\"type\": \"real\", \"min\": 0.001, \"max\": 0.01}", ""),
                 "parameters.lr.type"),
        TREFUSED("min above max", TJP("\"lr\": {\"type\": \"continuous\", \"min\": 0.1, \"max\": 0.01}", ""),
                 "parameters.lr.min"),
        TREFUSED("no max", TJP("\"lr\": {\"type\": \"continuous\", \"min\": 0.1}", ""), "parameters.lr.max"),
        TREFUSED("log scaling from 0", TJP("\"lr\": {\"type\": \"continuous\", \"min\": 0, \"max\": 0.01, "
                                           "\"scaling\": \"log\"}", ""), "parameters.lr.min"),
        TREFUSED("a scaling", TJP("\"lr\": {\"type\": \"continuous\", \"min\": 0.001, \"max\": 0.01, "
                                  "\"scaling\": \"cubic\"}", ""), "parameters.lr.scaling"),
        TREFUSED("no such field", TJP("\"model.n_foo\": {\"type\": \"integer\", \"min\": 1, \"max\": 4}", ""),
                 "parameters.model.n_foo"),
        TREFUSED("a value the job refuses", TJP("\"lr\": {\"type\": \"continuous\", \"min\": 0.001, \"max\": 20}", ""),
                 "parameters.lr.max"),
        {"a categorical value the job refuses", "POST", "/v1/tuning-jobs",
         TJP("\"lr\": {\"type\": \"categorical\", \"values\": [0.01, -1]}", ""), "CreateTuningJob",
         "{\"tuning_job\": " TJP("\"lr\": {\"type\": \"categorical\", \"values_json\": \"[0.01, -1]\"}", "") "}", 400,
         "INVALID_ARGUMENT", "parameters.lr.values[1]", "tuning_job.parameters.lr.values[1]"},
        {"no categorical values", "POST", "/v1/tuning-jobs",
         TJP("\"lr\": {\"type\": \"categorical\", \"values\": []}", ""), "CreateTuningJob",
         "{\"tuning_job\": " TJP("\"lr\": {\"type\": \"categorical\", \"values_json\": \"[]\"}", "") "}", 400,
         "INVALID_ARGUMENT", "parameters.lr.values", "tuning_job.parameters.lr.values"},
        TREFUSED("no objective", "{\"name\": \"t\", " JOB ", \"parameters\": {" LR "}}", "objective"),
        TREFUSED("a goal", "{\"name\": \"t\", " JOB ", \"parameters\": {" LR "}, \"objective\": {\"metric\": "
                 "\"val_loss\", \"goal\": \"lowest\"}}", "objective.goal"),
        TREFUSED("a strategy", TJ(", \"strategy\": \"tpe\""), "strategy"),
        TREFUSED("grid over a continuous range", TJ(", \"strategy\": \"grid\""), "parameters.lr.type"),
        TREFUSED("max_jobs 0", TJ(", \"max_jobs\": 0"), "max_jobs"),
        TREFUSED("max_jobs too many", TJ(", \"max_jobs\": 1001"), "max_jobs"),
        TREFUSED("max_parallel_jobs 0", TJ(", \"max_parallel_jobs\": 0"), "max_parallel_jobs"),
        TREFUSED("max_parallel_jobs above max_jobs", TJ(", \"max_jobs\": 4, \"max_parallel_jobs\": 5"),
                 "max_parallel_jobs"),
        TREFUSED("seed below 0", TJ(", \"seed\": -1"), "seed"),
        TREFUSED("max_failed_trials below 0", TJ(", \"max_failed_trials\": -1"), "max_failed_trials"),
        TREFUSED("trial_priority", TJ(", \"trial_priority\": 100000"), "trial_priority"),
        TREFUSED("early_stopping", TJ(", \"early_stopping\": \"sometimes\""), "early_stopping"),
        TREFUSED("no_improvement_trials 0", TJ(", \"completion\": {\"no_improvement_trials\": 0}"),
                 "completion.no_improvement_trials"),
        TREFUSED("hyperband without its resources", TJ(", \"strategy\": \"hyperband\""), "hyperband"),
        TREFUSED("hyperband's min above max", TJ(", \"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 100,"
                                                 " \"max_resource\": 50}"), "hyperband.min_resource"),
        TREFUSED("hyperband's eta", TJ(", \"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 10,"
                                       " \"max_resource\": 90, \"reduction_factor\": 1}"), "hyperband.reduction_factor"),
        TREFUSED("hyperband's brackets", TJ(", \"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 10,"
                                            " \"max_resource\": 90, \"brackets\": 4}"), "hyperband.brackets"),
        TREFUSED("hyperband's max_rungs", TJ(", \"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 10,"
                                             " \"max_resource\": 90, \"max_rungs\": 4}"), "hyperband.max_rungs"),
        TREFUSED("hyperband's sampler", TJ(", \"strategy\": \"hyperband\", \"hyperband\": {\"min_resource\": 10,"
                                           " \"max_resource\": 90, \"sampler\": \"bayesian\"}"), "hyperband.sampler"),
        TREFUSED("hyperband without its strategy", TJ(", \"hyperband\": {\"min_resource\": 10, \"max_resource\": 90}"),
                 "hyperband"),
        TREFUSED("a warm start's type", TJ(", \"warm_start\": {\"parents\": [\"00000000-0000-4000-8000-000000000000\"],"
                                           " \"type\": \"similar\"}"), "warm_start.type"),
        TREFUSED("a warm start's parent", TJ(", \"warm_start\": {\"parents\": [\"00000000-0000-4000-8000-000000000000\"],"
                                             " \"type\": \"transfer_learning\"}"), "warm_start.parents[0]"),
        TREFUSED("a warm start without parents", TJ(", \"warm_start\": {\"parents\": [],"
                                                    " \"type\": \"transfer_learning\"}"), "warm_start.parents"),
        TREFUSED("the base job's queue", "{\"name\": \"t\", \"job\": {\"name\": \"base\", \"queue\": \"none\", "
                 "\"model\": {\"type\": \"mlp\", \"hidden\": [8], \"n_inputs\": 4, \"n_classes\": 2}, \"data\": "
                 "{\"train\": \"synthetic\"}, \"hyperparameters\": {\"lr\": 0.01, \"global_batch_size\": 8, "
                 "\"max_steps\": 30}, \"resources\": {\"nodes\": 1, \"slots_per_node\": 1, \"slot_type\": \"cpu\"}}, "
                 "\"parameters\": {" LR "}, " OBJ "}", "job.queue"),
        /* the list's page, refused alike (gRPC's page_size is a wrapper: 0 is a size given) */
        {"listing a page of 0", "GET", "/v1/tuning-jobs?page_size=0", NULL, "ListTuningJobs", "{\"page_size\": 0}", 400,
         "INVALID_ARGUMENT", "page_size", "page_size"},
        {"listing a page of 501", "GET", "/v1/tuning-jobs?page_size=501", NULL, "ListTuningJobs",
         "{\"page_size\": 501}", 400, "INVALID_ARGUMENT", "page_size", "page_size"},
        {"listing a page of -1", "GET", "/v1/tuning-jobs?page_size=-1", NULL, "ListTuningJobs", "{\"page_size\": -1}",
         400, "INVALID_ARGUMENT", "page_size", "page_size"},
        {"listing after a malformed token", "GET", "/v1/tuning-jobs?page_token=abc", NULL, "ListTuningJobs",
         "{\"page_token\": \"abc\"}", 400, "INVALID_ARGUMENT", "page_token", "page_token"},
        {"listing after another list's token", "GET",
         "/v1/tuning-jobs?page_token=eyJ2IjoxLCJoIjoiMDAwMDAwMDAwMDAwMDAwMCIsImMiOnt9fQ", NULL, "ListTuningJobs",
         "{\"page_token\": \"eyJ2IjoxLCJoIjoiMDAwMDAwMDAwMDAwMDAwMCIsImMiOnt9fQ\"}", 400, "INVALID_ARGUMENT",
         "page_token", "page_token"},
        {"listing a page of 2", "GET", "/v1/tuning-jobs?page_size=2", NULL, "ListTuningJobs", "{\"page_size\": 2}",
         200, NULL, NULL, NULL},
        {"getting one that does not exist", "GET", "/v1/tuning-jobs/" NOBODY, NULL, "GetTuningJob",
         "{\"id\": \"" NOBODY "\"}", 404, "NOT_FOUND", "id", "id"},
        {"stopping one that does not exist", "POST", "/v1/tuning-jobs/" NOBODY ":stop", NULL, "StopTuningJob",
         "{\"id\": \"" NOBODY "\"}", 404, "NOT_FOUND", "id", "id"},
        {"every field", "POST", "/v1/tuning-jobs",
         TJP(LR ", \"global_batch_size\": {\"type\": \"categorical\", \"values\": [8, 16]}",
             ", \"strategy\": \"random\", \"max_jobs\": 2, \"max_parallel_jobs\": 1, \"seed\": 0, \"max_failed_trials\": "
             "1, \"trial_priority\": 0, \"early_stopping\": \"auto\", \"completion\": {\"target_objective\": 0, "
             "\"no_improvement_trials\": 1}"), "CreateTuningJob",
         "{\"tuning_job\": " TJP(LR ", \"global_batch_size\": {\"type\": \"categorical\", \"values_json\": \"[8, 16]\"}",
             ", \"strategy\": \"random\", \"max_jobs\": 2, \"max_parallel_jobs\": 1, \"seed\": 0, \"max_failed_trials\": "
             "1, \"trial_priority\": 0, \"early_stopping\": \"auto\", \"completion\": {\"target_objective\": 0, "
             "\"no_improvement_trials\": 1}") "}", 201, NULL, NULL, NULL},
        {"hyperband", "POST", "/v1/tuning-jobs", HB, "CreateTuningJob", NULL, 201, NULL, NULL, NULL},
    };
    walk(cases, KILN_ARRAY_LEN(cases), "tuning_job", "tuning");

    /* the searches both made answer alike: Get and List say what REST's JSON does, once they have
     * stopped (a running one changes between two answers); each row's two searches, one made
     * over each API (same name), are the same search */
    long st;
    json_t *rl = gt_rest(&K, "GET", "/v1/tuning-jobs", NULL, &st);
    size_t n = json_array_size(json_object_get(rl, "tuning_jobs"));
    cr_assert_eq(n, 4, "REST and gRPC made one of each accepted row");
    kiln_err_t err;
    for (size_t i = 0; i < n; i++) {
        json_t *out = NULL;
        const char *id = str(json_array_get(json_object_get(rl, "tuning_jobs"), i), "id");
        cr_assert_eq(svc_tuning_stop(S, svc_caller_kilnd(), id, &out, &err), 0, "%s", err.message);
        for (int k = 0; strcmp(str(out, "state"), "STOPPED"); k++) {
            cr_assert_lt(k, 400, "the search did not stop: %s", str(out, "state"));
            usleep(50000);
            json_decref(out);
            cr_assert_eq(svc_tuning_get(S, svc_caller_kilnd(), id, &out, &err), 0, "%s", err.message);
        }
        json_decref(out);
    }
    json_decref(rl);
    rl = gt_rest(&K, "GET", "/v1/tuning-jobs", NULL, &st);
    json_t *rts = json_object_get(rl, "tuning_jobs");
    json_t *calls = json_pack("[{s:s}]", "method", "/kiln.TrainingService/ListTuningJobs");
    json_t *rgets[4];
    for (size_t i = 0; i < n; i++) {
        char path[120];
        snprintf(path, sizeof path, "/v1/tuning-jobs/%s", str(json_array_get(rts, i), "id"));
        rgets[i] = gt_rest(&K, "GET", path, NULL, &st);
        cr_assert_eq(st, 200);
        json_array_append_new(calls, json_pack("{s:s, s:{s:s}}", "method", "/kiln.TrainingService/GetTuningJob",
                                               "request", "id", str(json_array_get(rts, i), "id")));
    }
    for (size_t i = 0; i < n; i++)
        for (size_t k = i + 1; k < n; k++)
            if (!strcmp(str(rgets[i], "name"), str(rgets[k], "name"))) {
                char *sa = json_dumps(json_object_get(rgets[i], "spec"), JSON_SORT_KEYS),
                     *sb = json_dumps(json_object_get(rgets[k], "spec"), JSON_SORT_KEYS);
                cr_assert_str_eq(sa, sb, "the search REST made and the one gRPC made are the same");
                free(sa);
                free(sb);
            }
    char why[600] = "";
    json_t *ans = gt_grpc_calls(&K, calls, "tuning-answers");
    json_t *gl = json_object_get(json_object_get(json_array_get(ans, 0), "response"), "tuning_jobs");
    cr_assert(says_alike(rts, gl, "tuning_jobs", why, sizeof why), "ListTuningJobs: %s", why);
    for (size_t i = 0; i < n; i++) {
        json_t *g = json_object_get(json_array_get(ans, i + 1), "response");
        cr_assert(says_alike(rgets[i], g, "tuning_job", why, sizeof why), "GetTuningJob: %s", why);
        json_decref(rgets[i]);
    }
    json_decref(ans);
    json_decref(rl);
}
