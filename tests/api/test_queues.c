/* test_queues.c - /v1/queues over real HTTP with the real database and scheduler: the JSON shape
 * the issue gives comes back field for field (with usage and pending), the one validator refuses
 * bad fields naming them, and a job's queue is honoured: a queue that does not exist or that its
 * project may not use is a 400 naming it, a job larger than any quota its queue could get a 422
 * naming the limit, and a queue's quota holds its jobs back while the default queue's run; a
 * project's default queue takes its jobs that name none (a name, or null for "default"; "" is
 * refused), and a queue holding paused jobs or that is a project's default queue cannot be
 * deleted, nor leave that project out of its projects, nor can a queue a running tuning job
 * submits its trials to (nor does a tuning submission racing the change land outside it); a retry
 * under an idempotency key gets its job even after the project's default queue changed, to one
 * that would refuse it too. */
#include <criterion/criterion.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/api/api_test.h"

TestSuite(queues, .init = at_setup, .fini = at_teardown, .timeout = 120);

/* A request as the cluster admin; asserts the status; returns the reply (caller decrefs). */
static json_t *req(const char *method, const char *path, const char *body, long want)
{
    return at_req_want(method, path, body, want);
}

/* A 400 whose field is field. */
static void refused(const char *method, const char *path, const char *body, long status, const char *field,
                    const char *needle)
{
    json_t *j = req(method, path, body, status);
    const char *f = json_string_value(json_object_get(j, "field"));
    cr_assert_str_eq(f ? f : "", field, "%s: field %s", body, f);
    const char *m = json_string_value(json_object_get(j, "message"));
    cr_assert(m && strstr(m, needle), "%s: message \"%s\" lacks \"%s\"", body, m, needle);
    json_decref(j);
}

/* A small job's spec in queue (NULL: none given) of project, with nodes x slots cpu ranks. */
static const char *spec(const char *name, const char *project, const char *queue, int nodes, int slots)
{
    static char buf[1024];
    char q[96] = "";
    if (queue)
        snprintf(q, sizeof q, ", \"queue\": \"%s\"", queue);
    snprintf(buf, sizeof buf,
             "{\"name\": \"%s\", \"project\": \"%s\", \"model\": {\"type\": \"mlp\", \"hidden\": [8], \"n_inputs\": 4,"
             " \"n_classes\": 2}, \"data\": {\"train\": \"synthetic\"}, \"hyperparameters\": {\"global_batch_size\": %d},"
             " \"resources\": {\"nodes\": %d, \"slots_per_node\": %d, \"slot_type\": \"cpu\"}%s}",
             name, project, nodes * slots * 2, nodes, slots, q);
    return buf;
}

/* Stops job id and waits until it is STOPPED. */
static void stop_job(const char *id)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s:stop", id);
    json_decref(req("POST", path, NULL, 200));
    for (int i = 0; i < 400 && at_sql_int("SELECT count(*) FROM jobs WHERE id = '%s' AND state = 'STOPPED'", id) == 0; i++)
        usleep(25000);
    cr_assert_eq(at_sql_int("SELECT count(*) FROM jobs WHERE id = '%s' AND state = 'STOPPED'", id), 1);
}

static char *submit(const char *name, const char *project, const char *queue, int nodes, int slots)
{
    json_t *j = req("POST", "/v1/jobs", spec(name, project, queue, nodes, slots), 201);
    char *id = strdup(json_string_value(json_object_get(j, "id")));
    json_decref(j);
    return id;
}

/* Waits (up to 20 s) until the job's reason contains needle; returns the job. */
static json_t *wait_reason(const char *id, const char *needle)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    for (int i = 0; i < 400; i++) {
        json_t *j = req("GET", path, NULL, 200);
        const char *r = json_string_value(json_object_get(j, "reason"));
        if (r && strstr(r, needle))
            return j;
        if (i == 399)
            cr_assert_fail("job %s's reason never said \"%s\": %s", id, needle, r);
        json_decref(j);
        usleep(50000);
    }
    return NULL;
}

static json_t *queue_named(json_t *list, const char *name)
{
    size_t i;
    json_t *q;
    json_array_foreach(json_object_get(list, "queues"), i, q)
        if (!strcmp(json_string_value(json_object_get(q, "name")), name))
            return q;
    return NULL;
}

Test(queues, the_contract_shape_round_trips)
{
    json_t *made = req("POST", "/v1/queues",
                       "{\"name\": \"nlp\", \"cohort\": \"research\", \"quota\": {\"cpu\": 8, \"gpu\": 0},"
                       " \"borrowing_limit\": {\"cpu\": 4}, \"lending_limit\": {\"cpu\": 8}, \"weight\": 1,"
                       " \"projects\": [\"default\"]}",
                       201);
    json_t *want = json_loads("{\"name\": \"nlp\", \"cohort\": \"research\", \"quota\": {\"cpu\": 8, \"gpu\": 0},"
                              " \"borrowing_limit\": {\"cpu\": 4}, \"lending_limit\": {\"cpu\": 8}, \"weight\": 1.0,"
                              " \"projects\": [\"default\"], \"fair_sharing\": false,"
                              " \"usage\": {\"cpu\": 0, \"gpu\": 0}, \"pending\": 0}", 0, NULL);
    const char *k;
    json_t *v;
    json_object_foreach(want, k, v) {
        json_t *got = json_object_get(made, k);
        char *gs = got ? json_dumps(got, JSON_ENCODE_ANY) : strdup("(absent)");
        bool same = got && (json_equal(got, v) || (json_is_number(got) && json_is_number(v)
                                                   && json_number_value(got) == json_number_value(v)));
        cr_assert(same, "%s is %s", k, gs);
        free(gs);
    }
    cr_assert(json_is_string(json_object_get(made, "created_at")));
    cr_assert_str_eq(json_string_value(json_object_get(made, "created_by")), "admin");
    json_decref(want);
    json_decref(made);
    /* only name and quota are required; the rest default */
    json_decref(req("POST", "/v1/queues", "{\"name\": \"min\", \"quota\": {\"gpu\": 2}}", 201));
    json_t *list = req("GET", "/v1/queues", NULL, 200);
    json_t *min = queue_named(list, "min"), *dflt = queue_named(list, "default");
    cr_assert_not_null(min);
    cr_assert(json_is_null(json_object_get(min, "cohort")));
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(min, "quota"), "cpu")), 0);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(min, "quota"), "gpu")), 2);
    cr_assert_eq(json_object_size(json_object_get(min, "borrowing_limit")), 0);
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(min, "projects"), 0)), "*");
    /* every cluster starts with "default": no limit, no cohort, every project, fair between projects */
    cr_assert_not_null(dflt);
    cr_assert(json_is_null(json_object_get(dflt, "quota")));
    cr_assert(json_is_true(json_object_get(dflt, "fair_sharing")));
    json_decref(list);
    /* PATCH changes what it names; null clears a limit or the cohort */
    json_t *p = req("PATCH", "/v1/queues/nlp", "{\"weight\": 2.5, \"borrowing_limit\": null, \"quota\": {\"cpu\": 6}}",
                    200);
    cr_assert_eq(json_number_value(json_object_get(p, "weight")), 2.5);
    cr_assert_eq(json_object_size(json_object_get(p, "borrowing_limit")), 0);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(p, "quota"), "cpu")), 6);
    cr_assert_str_eq(json_string_value(json_object_get(p, "cohort")), "research");
    json_decref(p);
    json_decref(req("DELETE", "/v1/queues/min", NULL, 200));
    json_decref(req("GET", "/v1/queues/min", NULL, 404));
}

/* A queue's preemption policy: answers always carry the effective values (the defaults when
 * none was set, the queue "default" too); a PATCH changes the fields it gives and null sets the
 * defaults; an unknown field or value is a 400 naming the field and the values it takes. */
Test(queues, the_preemption_policy_round_trips_and_bad_values_are_refused)
{
    json_t *made = req("POST", "/v1/queues", "{\"name\": \"plain\", \"quota\": {\"cpu\": 2}}", 201);
    json_t *dflt = json_pack("{s:s, s:s}", "within_queue", "lower_priority", "reclaim_within_cohort", "any");
    cr_assert(json_equal(json_object_get(made, "preemption"), dflt), "a queue that sets none has the defaults");
    json_decref(made);
    json_t *d = req("GET", "/v1/queues/default", NULL, 200);
    cr_assert(json_equal(json_object_get(d, "preemption"), dflt), "and so has the queue default");
    json_decref(d);
    made = req("POST", "/v1/queues", "{\"name\": \"prod\", \"cohort\": \"c\", \"quota\": {\"cpu\": 2}, \"preemption\":"
               " {\"within_queue\": \"never\", \"reclaim_within_cohort\": \"lower_priority\"}}", 201);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(made, "preemption"), "within_queue")), "never");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(made, "preemption"), "reclaim_within_cohort")),
                     "lower_priority");
    json_decref(made);
    /* a field left out keeps its value */
    json_t *p = req("PATCH", "/v1/queues/prod", "{\"preemption\": {\"reclaim_within_cohort\": \"never\"}}", 200);
    json_t *want = json_pack("{s:s, s:s}", "within_queue", "never", "reclaim_within_cohort", "never");
    cr_assert(json_equal(json_object_get(p, "preemption"), want));
    json_decref(p);
    json_decref(want);
    /* other fields leave it as it is */
    p = req("PATCH", "/v1/queues/prod", "{\"weight\": 2}", 200);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(p, "preemption"), "within_queue")), "never");
    json_decref(p);
    p = req("PATCH", "/v1/queues/prod", "{\"preemption\": {\"within_queue\": null}}", 200);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(p, "preemption"), "within_queue")),
                     "lower_priority");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(p, "preemption"), "reclaim_within_cohort")),
                     "never");
    json_decref(p);
    p = req("PATCH", "/v1/queues/prod", "{\"preemption\": null}", 200);
    cr_assert(json_equal(json_object_get(p, "preemption"), dflt), "null: the defaults");
    json_decref(p);
    json_t *list = req("GET", "/v1/queues", NULL, 200);
    cr_assert(json_equal(json_object_get(queue_named(list, "prod"), "preemption"), dflt));
    json_decref(list);
    json_decref(dflt);
    refused("POST", "/v1/queues", "{\"name\": \"x\", \"quota\": {}, \"preemption\": {\"within_queue\": \"any\"}}", 400,
            "preemption.within_queue", "preemption.within_queue must be lower_priority or never (got \"any\")");
    refused("PATCH", "/v1/queues/prod", "{\"preemption\": {\"reclaim_within_cohort\": \"Any\"}}", 400,
            "preemption.reclaim_within_cohort",
            "preemption.reclaim_within_cohort must be any, lower_priority or never (got \"Any\")");
    refused("PATCH", "/v1/queues/prod", "{\"preemption\": {\"reclaim_within_cohort\": 1}}", 400,
            "preemption.reclaim_within_cohort", "must be any, lower_priority or never");
    refused("PATCH", "/v1/queues/prod", "{\"preemption\": {\"within_cluster_queue\": \"never\"}}", 400,
            "preemption.within_cluster_queue", "unknown field \"preemption.within_cluster_queue\"");
    refused("PATCH", "/v1/queues/prod", "{\"preemption\": \"never\"}", 400, "preemption",
            "preemption must be an object");
    /* a long value or key of multi-byte characters: a 400 naming the field, the text cut */
    char body[1200], eur[400] = "a";
    for (int i = 0; i < 100; i++)
        strcat(eur, "\xe2\x82\xac");
    snprintf(body, sizeof body, "{\"preemption\": {\"within_queue\": \"%s\"}}", eur);
    refused("PATCH", "/v1/queues/prod", body, 400, "preemption.within_queue", "must be lower_priority or never (got \"a");
    snprintf(body, sizeof body, "{\"preemption\": {\"%s\": \"never\"}}", eur);
    json_t *cut = req("PATCH", "/v1/queues/prod", body, 400);
    const char *cf = json_string_value(json_object_get(cut, "field"));
    cr_assert(cf && !strncmp(cf, "preemption.a", 12), "field %s", cf ? cf : "(none)");
    json_decref(cut);
    refused("PATCH", "/v1/queues/prod", "{\"preemption\": {\"within_queue\": \"n\u00e9ver\"}}", 400,
            "preemption.within_queue", "(got \"n");
    refused("PATCH", "/v1/queues/prod", "{\"preemption\": {\"within_queue\": \"never\", \"within_queue\": \"x\"}}", 400,
            "", "");
    /* nothing refused changed it */
    p = req("GET", "/v1/queues/prod", NULL, 200);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(p, "preemption"), "reclaim_within_cohort")),
                     "any");
    json_decref(p);
}

Test(queues, bad_fields_are_refused_naming_them)
{
    refused("POST", "/v1/queues", "{\"quota\": {}}", 400, "name", "needs a name");
    refused("POST", "/v1/queues", "{\"name\": \"Bad Name\", \"quota\": {}}", 400, "name", "not valid");
    refused("POST", "/v1/queues", "{\"name\": \"a\"}", 400, "quota", "needs a quota");
    refused("POST", "/v1/queues", "{\"name\": \"a\", \"quota\": {\"tpu\": 1}}", 400, "quota.tpu", "slot type");
    refused("POST", "/v1/queues", "{\"name\": \"a\", \"quota\": {\"cpu\": -1}}", 400, "quota.cpu", "whole number");
    refused("POST", "/v1/queues", "{\"name\": \"a\", \"quota\": {\"cpu\": 1.5}}", 400, "quota.cpu", "whole number");
    refused("POST", "/v1/queues", "{\"name\": \"a\", \"quota\": {}, \"borrowing_limit\": {\"cpu\": 1}}", 400,
            "borrowing_limit", "needs a cohort");
    refused("POST", "/v1/queues", "{\"name\": \"a\", \"quota\": null, \"cohort\": \"c\"}", 400, "quota",
            "needs a quota");
    refused("POST", "/v1/queues", "{\"name\": \"a\", \"quota\": {}, \"weight\": 0}", 400, "weight", "above 0");
    refused("POST", "/v1/queues", "{\"name\": \"a\", \"quota\": {}, \"projects\": [\"nope\"]}", 400, "projects[0]",
            "\"nope\" does not exist");
    refused("POST", "/v1/queues", "{\"name\": \"a\", \"quota\": {}, \"colour\": \"red\"}", 400, "colour",
            "unknown field");
    /* projects: each named once, at most 1000 entries (100,000 "*" were once stored) */
    refused("POST", "/v1/queues", "{\"name\": \"a\", \"quota\": {}, \"projects\": [\"default\", \"*\", \"default\"]}", 400,
            "projects[2]", "names \"default\" twice (projects[0] and projects[2])");
    refused("PATCH", "/v1/queues/default", "{\"projects\": [\"*\", \"*\"]}", 400, "projects[1]", "twice");
    json_t *many = json_pack("{s:s, s:{}, s:[]}", "name", "a", "quota", "projects");
    for (int i = 0; i < 1001; i++)
        json_array_append_new(json_object_get(many, "projects"), json_string("*"));
    char *text = json_dumps(many, JSON_COMPACT);
    refused("POST", "/v1/queues", text, 400, "projects", "projects has 1001 entries, more than the 1000 a queue takes");
    free(text);
    json_array_clear(json_object_get(many, "projects"));
    json_array_append_new(json_object_get(many, "projects"), json_string("*"));
    for (int i = 0; i < 999; i++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", i);
        json_array_append_new(json_object_get(many, "projects"), json_string(name));
    }
    text = json_dumps(many, JSON_COMPACT);
    refused("POST", "/v1/queues", text, 400, "projects[1]", "project \"p0\" does not exist");
    free(text);
    json_decref(many);
    refused("PATCH", "/v1/queues/default", "{\"name\": \"other\"}", 400, "name", "cannot change");
    refused("DELETE", "/v1/queues/default", NULL, 409, "name", "cannot be deleted");
    json_decref(req("GET", "/v1/queues/a", NULL, 404));
}

Test(queues, a_jobs_queue_is_honoured)
{
    json_decref(req("POST", "/v1/projects", "{\"name\": \"p\"}", 201));
    json_decref(req("POST", "/v1/queues", "{\"name\": \"one\", \"quota\": {\"cpu\": 1}}", 201));
    json_decref(req("POST", "/v1/queues", "{\"name\": \"ponly\", \"quota\": {\"cpu\": 4}, \"projects\": [\"p\"]}", 201));
    json_decref(req("POST", "/v1/queues", "{\"name\": \"lend\", \"cohort\": \"c\", \"quota\": {\"cpu\": 2},"
                                          " \"lending_limit\": {\"cpu\": 1}}", 201));
    json_decref(req("POST", "/v1/queues", "{\"name\": \"borrow\", \"cohort\": \"c\", \"quota\": {\"cpu\": 1}}", 201));
    /* refused at submission, naming the queue or the limit */
    refused("POST", "/v1/jobs", spec("j", "default", "nowhere", 1, 1), 400, "queue", "queue \"nowhere\" does not exist");
    refused("POST", "/v1/jobs", spec("j", "default", "ponly", 1, 1), 400, "queue",
            "project \"default\" may not use queue \"ponly\"");
    refused("POST", "/v1/jobs", spec("j", "default", "one", 2, 1), 422, "queue", "its quota allows at most 1");
    /* what bounds "borrow" is what "lend" lends (its lending_limit), not a limit of "borrow" */
    refused("POST", "/v1/jobs", spec("j", "default", "borrow", 1, 3), 422, "queue",
            "can ever get: at most 2, its quota (1) plus the 1 the other queues of cohort \"c\" lend");
    {
        json_t *j = req("POST", "/v1/jobs", spec("j", "default", "borrow", 1, 3), 422);
        cr_assert(strstr(json_string_value(json_object_get(j, "hint")), "lending limits of cohort \"c\""), "%s",
                  json_string_value(json_object_get(j, "hint")));
        json_decref(j);
    }
    json_decref(req("POST", "/v1/queues", "{\"name\": \"capped\", \"cohort\": \"c\", \"quota\": {\"cpu\": 0},"
                                          " \"borrowing_limit\": {\"cpu\": 1}}", 201));
    refused("POST", "/v1/jobs", spec("j", "default", "capped", 1, 2), 422, "queue",
            "its quota (0) plus its borrowing_limit (1) allow at most 1");
    /* accepted: within what the queue could ever get (borrowing included), or no queue named */
    free(submit("ok", "p", "ponly", 1, 1));
    char *a = submit("a", "default", "one", 1, 1);
    char *b = submit("b", "default", "one", 1, 1);
    char *d = submit("d", "default", NULL, 1, 1);
    at_run_job(a);
    at_run_job(d);
    json_t *jb = wait_reason(b, "waiting for quota");
    cr_assert_str_eq(json_string_value(json_object_get(jb, "state")), "QUEUED");
    cr_assert_str_eq(json_string_value(json_object_get(jb, "reason")),
                     "waiting for quota: needs 1 cpu slot(s); queue one: quota 1, used 1, no cohort to borrow from");
    cr_assert_str_eq(json_string_value(json_object_get(jb, "queue")), "one");
    json_decref(jb);
    json_t *list = req("GET", "/v1/queues", NULL, 200);
    json_t *one = queue_named(list, "one");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(one, "usage"), "cpu")), 1);
    cr_assert_eq(json_integer_value(json_object_get(one, "pending")), 1);
    json_decref(list);
    /* a queue whose jobs wait or run stays */
    refused("DELETE", "/v1/queues/one", NULL, 409, "name", "2 job(s) waiting or running");
    /* more quota: the waiting job starts */
    json_decref(req("PATCH", "/v1/queues/one", "{\"quota\": {\"cpu\": 2}}", 200));
    at_run_job(b);
    free(a);
    free(b);
    free(d);
}

Test(queues, a_queue_holding_paused_jobs_stays)
{
    /* a hyperband trial PAUSED at a rung goes back to its queue when promoted: deleting the queue
     * under it would leave it waiting for a queue that no longer exists */
    json_decref(req("POST", "/v1/queues", "{\"name\": \"hb\", \"quota\": {\"cpu\": 4}}", 201));
    json_t *j = req("POST", "/v1/jobs",
                    "{\"name\": \"trial\", \"queue\": \"hb\", \"model\": {\"type\": \"mlp\", \"hidden\": [8],"
                    " \"n_inputs\": 4, \"n_classes\": 2}, \"data\": {\"train\": \"synthetic\"},"
                    " \"hyperparameters\": {\"global_batch_size\": 2, \"max_steps\": 8}, \"stopping\": {\"max_steps\": 2},"
                    " \"resources\": {\"nodes\": 1, \"slots_per_node\": 1, \"slot_type\": \"cpu\"}}",
                    201);
    char *id = strdup(json_string_value(json_object_get(j, "id")));
    json_decref(j);
    int attempt = at_run_job(id);
    at_rank_exit(id, attempt, 0);
    json_decref(wait_reason(id, "paused at step 2"));
    cr_assert_eq(at_sql_int("SELECT count(*) FROM jobs WHERE id = '%s' AND state = 'PAUSED'", id), 1);
    /* it holds no slots and waits for no admission: neither usage nor pending counts it */
    json_t *q = req("GET", "/v1/queues/hb", NULL, 200);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(q, "usage"), "cpu")), 0);
    cr_assert_eq(json_integer_value(json_object_get(q, "pending")), 0);
    json_decref(q);
    refused("DELETE", "/v1/queues/hb", NULL, 409, "name", "queue \"hb\" has 1 job(s) waiting, running or paused (1 paused)");
    json_decref(req("GET", "/v1/queues/hb", NULL, 200));
    /* once it is stopped the queue may go */
    stop_job(id);
    json_decref(req("DELETE", "/v1/queues/hb", NULL, 200));
    free(id);
}

Test(queues, a_projects_default_queue_takes_its_jobs_that_name_none)
{
    json_decref(req("POST", "/v1/queues", "{\"name\": \"team\", \"quota\": {\"cpu\": 4}}", 201));
    json_decref(req("POST", "/v1/projects", "{\"name\": \"a\"}", 201));
    json_decref(req("POST", "/v1/queues", "{\"name\": \"aonly\", \"quota\": {\"cpu\": 4}, \"projects\": [\"a\"]}",
                    201));
    /* set on create, shown on every listing; unset is "default" */
    json_t *p = req("POST", "/v1/projects", "{\"name\": \"b\", \"default_queue\": \"team\"}", 201);
    cr_assert_str_eq(json_string_value(json_object_get(p, "default_queue")), "team");
    json_decref(p);
    json_t *list = req("GET", "/v1/projects", NULL, 200);
    size_t i;
    json_t *e;
    int seen = 0;
    json_array_foreach(json_object_get(list, "projects"), i, e) {
        const char *n = json_string_value(json_object_get(e, "name")), *dq = json_string_value(json_object_get(e, "default_queue"));
        cr_assert(dq, "project %s has no default_queue", n);
        if (!strcmp(n, "a") || !strcmp(n, "default")) {
            cr_assert_str_eq(dq, "default", "%s", n);
            seen++;
        }
        if (!strcmp(n, "b")) {
            cr_assert_str_eq(dq, "team");
            seen++;
        }
    }
    cr_assert_eq(seen, 3);
    json_decref(list);
    /* a job that names no queue goes to its project's default queue, and its spec says which */
    char *jb = submit("jb", "b", NULL, 1, 1);
    char *ja = submit("ja", "a", NULL, 1, 1);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", jb);
    json_t *j = req("GET", path, NULL, 200);
    cr_assert_str_eq(json_string_value(json_object_get(j, "queue")), "team");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "spec"), "queue")), "team");
    json_decref(j);
    snprintf(path, sizeof path, "/v1/jobs/%s", ja);
    j = req("GET", path, NULL, 200);
    cr_assert_str_eq(json_string_value(json_object_get(j, "queue")), "default");
    json_decref(j);
    /* one that names a queue keeps it */
    char *jn = submit("jn", "b", "default", 1, 1);
    cr_assert_eq(at_sql_int("SELECT count(*) FROM jobs WHERE id = '%s' AND queue = 'default'", jn), 1);
    /* changed by PATCH (an admin's); null is "default" again */
    p = req("PATCH", "/v1/projects/a", "{\"default_queue\": \"aonly\"}", 200);
    cr_assert_str_eq(json_string_value(json_object_get(p, "default_queue")), "aonly");
    cr_assert_str_eq(json_string_value(json_object_get(p, "name")), "a");
    json_decref(p);
    char *ja2 = submit("ja2", "a", NULL, 1, 1);
    cr_assert_eq(at_sql_int("SELECT count(*) FROM jobs WHERE id = '%s' AND queue = 'aonly'", ja2), 1);
    /* bad values are refused naming the field */
    refused("PATCH", "/v1/projects/b", "{\"default_queue\": \"nowhere\"}", 400, "default_queue",
            "queue \"nowhere\" does not exist");
    refused("PATCH", "/v1/projects/b", "{\"default_queue\": \"aonly\"}", 400, "default_queue",
            "project \"b\" may not use queue \"aonly\"");
    refused("PATCH", "/v1/projects/b", "{\"default_queue\": 7}", 400, "default_queue", "default_queue must name a queue");
    refused("PATCH", "/v1/projects/b", "{\"owner\": \"me\"}", 400, "owner", "unknown field");
    refused("POST", "/v1/projects", "{\"name\": \"c\", \"default_queue\": \"aonly\"}", 400, "default_queue",
            "project \"c\" may not use queue \"aonly\"");
    refused("POST", "/v1/projects", "{\"name\": \"c\", \"default_queue\": \"nowhere\"}", 400, "default_queue",
            "does not exist");
    json_decref(req("PATCH", "/v1/projects/nope", "{\"default_queue\": null}", 404));
    /* a default queue keeps letting its project in (a_queue_keeps_the_projects_whose_default_queue_it_is) */
    refused("PATCH", "/v1/queues/aonly", "{\"projects\": [\"default\"]}", 409, "projects",
            "queue \"aonly\" is the default queue of project \"a\"");
    /* a queue that is a project's default stays until the project names another */
    refused("DELETE", "/v1/queues/team", NULL, 409, "name", "has 1 job(s) waiting or running");
    snprintf(path, sizeof path, "/v1/jobs/%s:stop", jb);
    json_decref(req("POST", path, NULL, 200));
    refused("DELETE", "/v1/queues/team", NULL, 409, "name", "queue \"team\" is the default queue of project \"b\"");
    p = req("PATCH", "/v1/projects/b", "{\"default_queue\": null}", 200);
    cr_assert_str_eq(json_string_value(json_object_get(p, "default_queue")), "default");
    json_decref(p);
    json_decref(req("DELETE", "/v1/queues/team", NULL, 200));
    free(jb);
    free(ja);
    free(jn);
    free(ja2);
}

/* A 4xx's hint contains needle. */
static void hint_has(const char *method, const char *path, const char *body, long status, const char *needle)
{
    json_t *j = req(method, path, body, status);
    const char *h = json_string_value(json_object_get(j, "hint"));
    cr_assert(h && strstr(h, needle), "%s: hint \"%s\" lacks \"%s\"", body, h, needle);
    json_decref(j);
}

/* The default queue of project, as GET /v1/projects shows it (static storage). */
static const char *default_queue_of(const char *project)
{
    static char out[64];
    out[0] = '\0';
    json_t *list = req("GET", "/v1/projects", NULL, 200);
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(list, "projects"), i, e)
        if (!strcmp(json_string_value(json_object_get(e, "name")), project))
            snprintf(out, sizeof out, "%s", json_string_value(json_object_get(e, "default_queue")));
    json_decref(list);
    cr_assert(out[0], "project %s not listed", project);
    return out;
}

Test(queues, a_default_queue_names_a_queue_and_null_means_default)
{
    json_decref(req("POST", "/v1/queues", "{\"name\": \"team\", \"quota\": {\"cpu\": 4}}", 201));
    /* "" names no queue: refused as a job's "queue": "" is, saying what to send instead */
    refused("POST", "/v1/projects", "{\"name\": \"e\", \"default_queue\": \"\"}", 400, "default_queue",
            "default_queue must name a queue");
    hint_has("POST", "/v1/projects", "{\"name\": \"e\", \"default_queue\": \"\"}", 400, "(null means it too)");
    json_decref(req("PATCH", "/v1/projects/default", "{\"default_queue\": \"team\"}", 200));
    refused("PATCH", "/v1/projects/default", "{\"default_queue\": \"\"}", 400, "default_queue",
            "default_queue must name a queue");
    cr_assert_str_eq(default_queue_of("default"), "team", "a refused change changes nothing");
    refused("POST", "/v1/jobs", spec("jq", "default", "", 1, 1), 400, "queue", "queue must name a queue");
    /* null, or leaving it out on create, is the queue "default" */
    json_t *p = req("POST", "/v1/projects", "{\"name\": \"e\", \"default_queue\": null}", 201);
    cr_assert_str_eq(json_string_value(json_object_get(p, "default_queue")), "default");
    json_decref(p);
    p = req("POST", "/v1/projects", "{\"name\": \"f\"}", 201);
    cr_assert_str_eq(json_string_value(json_object_get(p, "default_queue")), "default");
    json_decref(p);
    p = req("PATCH", "/v1/projects/default", "{\"default_queue\": null}", 200);
    cr_assert_str_eq(json_string_value(json_object_get(p, "default_queue")), "default");
    json_decref(p);
    cr_assert_str_eq(default_queue_of("default"), "default");
    /* a body that leaves it out changes nothing */
    json_decref(req("PATCH", "/v1/projects/e", "{\"default_queue\": \"team\"}", 200));
    p = req("PATCH", "/v1/projects/e", "{}", 200);
    cr_assert_str_eq(json_string_value(json_object_get(p, "default_queue")), "team");
    json_decref(p);
}

Test(queues, a_queue_keeps_the_projects_whose_default_queue_it_is)
{
    json_decref(req("POST", "/v1/projects", "{\"name\": \"a\"}", 201));
    json_decref(req("POST", "/v1/projects", "{\"name\": \"b\"}", 201));
    json_decref(req("POST", "/v1/queues", "{\"name\": \"team\", \"quota\": {\"cpu\": 4}, \"projects\": [\"a\", \"b\"]}",
                    201));
    json_decref(req("PATCH", "/v1/projects/a", "{\"default_queue\": \"team\"}", 200));
    json_decref(req("PATCH", "/v1/projects/b", "{\"default_queue\": \"team\"}", 200));
    /* leaving one out: 409 naming it and saying what to do first; nothing changes */
    refused("PATCH", "/v1/queues/team", "{\"projects\": [\"a\"], \"weight\": 2}", 409, "projects",
            "queue \"team\" is the default queue of project \"b\", which projects would no longer let in");
    hint_has("PATCH", "/v1/queues/team", "{\"projects\": [\"a\"]}", 409,
             "give project b another default queue first (kiln projects update b --default-queue QUEUE)");
    refused("PATCH", "/v1/queues/team", "{\"projects\": [\"default\"]}", 409, "projects",
            "queue \"team\" is the default queue of projects \"a\", \"b\", which projects would no longer let in");
    json_t *q = req("GET", "/v1/queues/team", NULL, 200);
    cr_assert_eq(json_array_size(json_object_get(q, "projects")), 2);
    cr_assert_eq(json_number_value(json_object_get(q, "weight")), 1.0, "a refused change changes no field");
    json_decref(q);
    /* so their jobs that name no queue are still taken */
    char *jb = submit("jb", "b", NULL, 1, 1);
    cr_assert_eq(at_sql_int("SELECT count(*) FROM jobs WHERE id = '%s' AND queue = 'team'", jb), 1);
    /* what keeps them in passes: "*", other fields, and, once b has another default queue, leaving b out */
    json_decref(req("PATCH", "/v1/queues/team", "{\"projects\": [\"*\"], \"weight\": 2}", 200));
    json_decref(req("PATCH", "/v1/queues/team", "{\"projects\": [\"b\", \"a\"]}", 200));
    json_decref(req("PATCH", "/v1/projects/b", "{\"default_queue\": null}", 200));
    /* b's job is still in the queue: leaving b out waits for it to end too
     * (a_project_leaves_a_queue_only_once_its_jobs_there_have_ended) */
    refused("PATCH", "/v1/queues/team", "{\"projects\": [\"a\"]}", 409, "projects",
            "queue \"team\" has 1 job(s) of project \"b\"");
    at_rank_exit(jb, at_run_job(jb), 0);
    for (int i = 0; i < 400 && at_sql_int("SELECT count(*) FROM jobs WHERE id = '%s' AND state NOT IN"
                                          " ('COMPLETED', 'FAILED', 'STOPPED')", jb) > 0; i++)
        usleep(50000);
    q = req("PATCH", "/v1/queues/team", "{\"projects\": [\"a\"]}", 200);
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(q, "projects"), 0)), "a");
    json_decref(q);
    free(jb);
}

Test(queues, a_refusal_naming_many_projects_names_the_first_and_counts_the_rest)
{
    json_decref(req("POST", "/v1/queues", "{\"name\": \"wide\", \"quota\": {\"cpu\": 4}}", 201));
    char body[256];
    for (int i = 0; i < 6; i++) {
        snprintf(body, sizeof body, "{\"name\": \"a-project-with-a-rather-long-name-%d\", \"default_queue\": \"wide\"}", i);
        json_decref(req("POST", "/v1/projects", body, 201));
    }
    json_t *j = req("PATCH", "/v1/queues/wide", "{\"projects\": [\"default\"]}", 409);
    const char *m = json_string_value(json_object_get(j, "message"));
    cr_assert(m && strstr(m, "queue \"wide\" is the default queue of projects \"a-project-with-a-rather-long-name-0\", ")
              && strstr(m, " more, which projects would no longer let in"), "%s", m);
    json_decref(j);
}

Test(queues, a_retry_gets_its_job_after_the_projects_default_queue_changed)
{
    json_decref(req("POST", "/v1/queues", "{\"name\": \"team\", \"quota\": {\"cpu\": 4}}", 201));
    json_decref(req("PATCH", "/v1/projects/default", "{\"default_queue\": \"team\"}", 200));
    const char *hdrs[] = {"Idempotency-Key: retry-dq", NULL};
    char body[1024];
    snprintf(body, sizeof body, "%s", spec("jr", "default", NULL, 1, 1));
    long st;
    char *raw = NULL;
    json_t *first = at_req("POST", "/v1/jobs", body, hdrs, &st, &raw);
    cr_assert_eq(st, 201, "%s", raw);
    free(raw);
    cr_assert_str_eq(json_string_value(json_object_get(first, "queue")), "team");
    /* an admin sends the project's jobs elsewhere; the client, unsure its request arrived, retries */
    json_decref(req("PATCH", "/v1/projects/default", "{\"default_queue\": null}", 200));
    json_t *again = at_req("POST", "/v1/jobs", body, hdrs, &st, &raw);
    cr_assert_eq(st, 200, "the retry gets the job the first request created: %s", raw);
    free(raw);
    cr_assert_str_eq(json_string_value(json_object_get(again, "id")), json_string_value(json_object_get(first, "id")));
    cr_assert_str_eq(json_string_value(json_object_get(again, "queue")), "team");
    cr_assert_eq(at_sql_int("SELECT count(*) FROM jobs WHERE name = 'jr'"), 1);
    json_decref(again);
    /* another request under the key is still refused */
    snprintf(body, sizeof body, "%s", spec("jr2", "default", NULL, 1, 1));
    again = at_req("POST", "/v1/jobs", body, hdrs, &st, &raw);
    cr_assert_eq(st, 422, "%s", raw);
    free(raw);
    json_decref(again);
    json_decref(first);
}

/* The key is looked up before the submission's checks: a retry gets its job even when the
 * project's new default queue would refuse the request now. */
Test(queues, a_retry_gets_its_job_after_the_projects_default_queue_changed_to_one_that_refuses_it)
{
    json_decref(req("POST", "/v1/queues", "{\"name\": \"tiny\", \"quota\": {\"cpu\": 1}}", 201));
    const char *hdrs[] = {"Idempotency-Key: retry-tiny", NULL};
    char body[1024];
    snprintf(body, sizeof body, "%s", spec("jt", "default", NULL, 1, 2));
    long st;
    char *raw = NULL;
    json_t *first = at_req("POST", "/v1/jobs", body, hdrs, &st, &raw);
    cr_assert_eq(st, 201, "%s", raw);
    free(raw);
    cr_assert_str_eq(json_string_value(json_object_get(first, "queue")), "default");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(first, "spec"), "queue")), "default",
                     "the stored spec names the queue the project's default gave it");
    json_decref(req("PATCH", "/v1/projects/default", "{\"default_queue\": \"tiny\"}", 200));
    /* the same body as a new request is refused now: tiny never holds 2 slots */
    refused("POST", "/v1/jobs", body, 422, "queue", "queue \"tiny\"");
    /* but the retry gets the job its first try created */
    json_t *again = at_req("POST", "/v1/jobs", body, hdrs, &st, &raw);
    cr_assert_eq(st, 200, "the retry gets the job the first request created: %s", raw);
    free(raw);
    cr_assert_str_eq(json_string_value(json_object_get(again, "id")), json_string_value(json_object_get(first, "id")));
    cr_assert_str_eq(json_string_value(json_object_get(again, "queue")), "default");
    json_decref(again);
    cr_assert_eq(at_sql_int("SELECT count(*) FROM jobs WHERE name = 'jt'"), 1);
    /* another request under the key is the key's conflict, not the queue's refusal */
    snprintf(body, sizeof body, "%s", spec("jt2", "default", NULL, 1, 2));
    again = at_req("POST", "/v1/jobs", body, hdrs, &st, &raw);
    cr_assert_eq(st, 422, "%s", raw);
    cr_assert_str_eq(json_string_value(json_object_get(again, "field")), "Idempotency-Key", "%s", raw);
    cr_assert(strstr(raw, json_string_value(json_object_get(first, "id"))), "names the job, which its caller reads: %s",
              raw);
    free(raw);
    json_decref(again);
    json_decref(first);
}

Test(queues, only_cluster_admins_manage_queues)
{
    /* every other caller's 403 and 401 are in test_authz's matrix; here what a refusal says */
    json_decref(req("POST", "/v1/users", "{\"name\": \"u\"}", 201));
    json_t *t = req("POST", "/v1/users/u/tokens", "{}", 201);
    char auth[200];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", json_string_value(json_object_get(t, "token")));
    json_decref(t);
    const char *hdrs[] = {auth, NULL};
    long st;
    char *raw = NULL;
    json_t *j = at_req("POST", "/v1/queues", "{\"name\": \"x\", \"quota\": {}}", hdrs, &st, &raw);
    cr_assert_eq(st, 403, "%s", raw);
    cr_assert(strstr(json_string_value(json_object_get(j, "message")), "creating queues needs a cluster admin"), "%s",
              raw);
    json_decref(j);
    free(raw);
    j = at_req("PATCH", "/v1/queues/default", "{\"preemption\": {\"within_queue\": \"never\"}}", hdrs, &st, &raw);
    cr_assert_eq(st, 403, "only a cluster admin changes a queue's preemption policy: %s", raw);
    json_decref(j);
    free(raw);
    j = at_req("GET", "/v1/queues", NULL, hdrs, &st, &raw);
    cr_assert_eq(st, 200, "every user reads the queues: %s", raw);
    json_t *dq = queue_named(j, "default");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(dq, "preemption"), "within_queue")),
                     "lower_priority", "and their preemption policy, unchanged: %s", raw);
    json_decref(j);
    free(raw);
}

/* A token of a new user (not a cluster admin) who is a member of project (NULL: of none), as an
 * Authorization header into auth. */
static void member_auth(const char *user, const char *project, char *auth, size_t n)
{
    char token[128];
    at_user_token(user, project, "viewer", token, sizeof token);
    snprintf(auth, n, "Authorization: Bearer %s", token);
}

/* The projects of queue name as the caller whose header is auth reads them, by GET /v1/queues and
 * GET /v1/queues/{name} (which must agree), as compact JSON (caller frees). */
static char *projects_seen(const char *auth, const char *name)
{
    const char *hdrs[] = {auth, NULL};
    long st;
    char *raw = NULL, path[128];
    json_t *list = at_req("GET", "/v1/queues", NULL, hdrs, &st, &raw);
    cr_assert_eq(st, 200, "%s", raw);
    free(raw);
    char *from_list = json_dumps(json_object_get(queue_named(list, name), "projects"), JSON_COMPACT);
    json_decref(list);
    snprintf(path, sizeof path, "/v1/queues/%s", name);
    json_t *one = at_req("GET", path, NULL, hdrs, &st, &raw);
    cr_assert_eq(st, 200, "%s", raw);
    free(raw);
    char *from_one = json_dumps(json_object_get(one, "projects"), JSON_COMPACT);
    json_decref(one);
    cr_assert_str_eq(from_list, from_one, "GET /v1/queues and GET /v1/queues/%s agree", name);
    free(from_one);
    return from_list;
}

Test(queues, a_queue_names_only_the_projects_its_reader_can_see)
{
    /* GET /v1/projects hides the projects a user is not a member of: so do a queue's projects */
    json_decref(req("POST", "/v1/projects", "{\"name\": \"a\"}", 201));
    json_decref(req("POST", "/v1/projects", "{\"name\": \"b\"}", 201));
    json_decref(req("POST", "/v1/queues", "{\"name\": \"shared\", \"quota\": {\"cpu\": 4}, \"projects\": [\"a\", \"b\"]}",
                    201));
    json_decref(req("POST", "/v1/queues", "{\"name\": \"open\", \"quota\": {\"cpu\": 4}, \"projects\": [\"*\", \"b\"]}",
                    201));
    char in_a[200], in_none[200];
    member_auth("ua", "a", in_a, sizeof in_a);
    member_auth("nobody", NULL, in_none, sizeof in_none);
    char *seen = projects_seen(in_a, "shared");
    cr_assert_str_eq(seen, "[\"a\"]", "a member of a sees a, not b");
    free(seen);
    seen = projects_seen(in_none, "shared");
    cr_assert_str_eq(seen, "[]", "a member of no project sees none of them");
    free(seen);
    seen = projects_seen(in_a, "open");
    cr_assert_str_eq(seen, "[\"*\"]", "\"*\" names no project: every reader sees it");
    free(seen);
    /* a cluster admin sees them all; the queue itself is unchanged */
    json_t *q = req("GET", "/v1/queues/shared", NULL, 200);
    char *all = json_dumps(json_object_get(q, "projects"), JSON_COMPACT);
    cr_assert_str_eq(all, "[\"a\",\"b\"]");
    free(all);
    json_decref(q);
    /* the member of a still submits to it, and reads its load (usage and pending are the cluster's) */
    const char *hdrs[] = {in_a, NULL};
    long st;
    char *raw = NULL;
    json_decref(req("PUT", "/v1/projects/a/members/ua", "{\"role\": \"editor\"}", 200));
    json_t *j = at_req("POST", "/v1/jobs", spec("ja", "a", "shared", 1, 1), hdrs, &st, &raw);
    cr_assert_eq(st, 201, "%s", raw);
    json_decref(j);
    free(raw);
    j = at_req("GET", "/v1/queues/shared", NULL, hdrs, &st, &raw);
    cr_assert_eq(json_integer_value(json_object_get(j, "pending")), 1, "%s", raw);
    json_decref(j);
    free(raw);
}

Test(queues, a_project_leaves_a_queue_only_once_its_jobs_there_have_ended)
{
    /* as DELETE refuses a queue its jobs use, a PATCH leaving out a project whose jobs wait, run
     * or are paused in the queue is a 409 saying how many and what to do; nothing changes */
    json_decref(req("POST", "/v1/projects", "{\"name\": \"a\"}", 201));
    json_decref(req("POST", "/v1/projects", "{\"name\": \"b\"}", 201));
    json_decref(req("POST", "/v1/queues", "{\"name\": \"team\", \"quota\": {\"cpu\": 1}, \"projects\": [\"*\"]}", 201));
    char *run = submit("run", "b", "team", 1, 1);
    int attempt = at_run_job(run);
    char *wait1 = submit("wait1", "b", "team", 1, 1);
    char *wait2 = submit("wait2", "b", "team", 1, 1);
    char *other = submit("other", "a", "team", 1, 1);
    refused("PATCH", "/v1/queues/team", "{\"projects\": [\"a\"], \"weight\": 2}", 409, "projects",
            "queue \"team\" has 3 job(s) of project \"b\" (2 waiting, 1 running), which projects would no longer "
            "let in");
    hint_has("PATCH", "/v1/queues/team", "{\"projects\": [\"a\"]}", 409,
             "stop them or let them end, then remove the project (kiln search 'project = \"b\" AND queue = \"team\"'");
    /* "*" to a list leaves out every project it does not name: both are counted */
    refused("PATCH", "/v1/queues/team", "{\"projects\": []}", 409, "projects",
            "queue \"team\" has 4 job(s) of projects \"a\", \"b\" (3 waiting, 1 running)");
    json_t *q = req("GET", "/v1/queues/team", NULL, 200);
    char *ps = json_dumps(json_object_get(q, "projects"), JSON_COMPACT);
    cr_assert_str_eq(ps, "[\"*\"]", "a refused change changes nothing");
    cr_assert_eq(json_number_value(json_object_get(q, "weight")), 1.0);
    free(ps);
    json_decref(q);
    /* other fields, and a list that keeps b, pass */
    json_decref(req("PATCH", "/v1/queues/team", "{\"projects\": [\"b\", \"a\"], \"weight\": 2}", 200));
    /* once b's jobs there have ended (the waiting ones stopped, the running one done), b may go */
    const char *ids[] = {wait1, wait2};
    for (int i = 0; i < 2; i++) {
        char path[128];
        snprintf(path, sizeof path, "/v1/jobs/%s:stop", ids[i]);
        json_decref(req("POST", path, NULL, 200));
    }
    refused("PATCH", "/v1/queues/team", "{\"projects\": [\"a\"]}", 409, "projects",
            "queue \"team\" has 1 job(s) of project \"b\" (0 waiting, 1 running)");
    at_rank_exit(run, attempt, 0);
    for (int i = 0; i < 400 && at_sql_int("SELECT count(*) FROM jobs WHERE project = 'b' AND state NOT IN"
                                          " ('COMPLETED', 'FAILED', 'STOPPED')") > 0; i++)
        usleep(50000);
    q = req("PATCH", "/v1/queues/team", "{\"projects\": [\"a\"]}", 200);
    ps = json_dumps(json_object_get(q, "projects"), JSON_COMPACT);
    cr_assert_str_eq(ps, "[\"a\"]");
    free(ps);
    json_decref(q);
    free(run);
    free(wait1);
    free(wait2);
    free(other);
}

/* A POST of path with body by b (racer_t) on its own thread: the status it got. */
typedef struct racer {
    const char *path, *body;
    long status;
} racer_t;

static void *submit_b(void *arg)
{
    racer_t *x = arg;
    char *raw = NULL;
    json_decref(at_req("POST", x->path, x->body, NULL, &x->status, &raw));
    free(raw);
    return NULL;
}

/* Runs fn(arg) on its own thread while a second connection holds a transaction open after the
 * statements held (NULL-terminated), until a statement LIKE waiting_like waits on a lock; then
 * commits the transaction and joins the thread. Returns whether the statement waited. */
static bool race_an_open_transaction(const char *const *held, void *(*fn)(void *), void *arg, const char *waiting_like)
{
    PGconn *pg = PQconnectdb(at_db_url());
    cr_assert_eq(PQstatus(pg), CONNECTION_OK, "%s", PQerrorMessage(pg));
    PQclear(PQexec(pg, "BEGIN"));
    for (; *held; held++) {
        PGresult *r = PQexec(pg, *held);
        cr_assert(PQresultStatus(r) == PGRES_TUPLES_OK || PQresultStatus(r) == PGRES_COMMAND_OK, "%s: %s", *held,
                  PQerrorMessage(pg));
        PQclear(r);
    }
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, fn, arg), 0);
    bool waits = false;
    for (int i = 0; i < 400 && !waits; i++) {
        waits = at_sql_int("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%s'",
                           waiting_like) > 0;
        if (!waits)
            usleep(25000);
    }
    PGresult *r = PQexec(pg, "COMMIT");
    cr_assert_eq(PQresultStatus(r), PGRES_COMMAND_OK, "%s", PQerrorMessage(pg));
    PQclear(r);
    PQfinish(pg);
    pthread_join(t, NULL);
    return waits;
}

/* Project b's submission of body to path while a change of queue team's projects that leaves b
 * out (as svc_queue_update makes it: the queue's row locked, then updated) is held open: the
 * submission has passed its check against the old projects, and its insert into table waits on
 * the queue's row, then finds b left out and is refused with a 400; nothing of b lands in table. */
static void race_a_change_of_the_queues_projects(const char *path, const char *body, const char *table)
{
    json_decref(req("POST", "/v1/projects", "{\"name\": \"b\"}", 201));
    json_decref(req("POST", "/v1/queues", "{\"name\": \"team\", \"quota\": {\"cpu\": 1}}", 201));
    static const char *const held[] = {"SELECT 1 FROM queues WHERE name = 'team' FOR UPDATE",
                                       "UPDATE queues SET projects = '[\"default\"]' WHERE name = 'team'", NULL};
    racer_t x = {.path = path, .body = body};
    char like[96];
    snprintf(like, sizeof like, "%%INSERT INTO %s%%", table);
    cr_assert(race_an_open_transaction(held, submit_b, &x, like), "the insert into %s never waited on the queue's row",
              table);
    cr_assert_eq(x.status, 400, "the submission is refused as one after the change is");
    cr_assert_eq(at_sql_int("SELECT count(*) FROM %s WHERE project = 'b'", table), 0);
}

Test(queues, a_submission_racing_a_change_of_the_queues_projects_never_lands_outside_them)
{
    race_a_change_of_the_queues_projects("/v1/jobs", spec("racer", "b", "team", 1, 1), "jobs");
}

/* A DELETE of the queue by its own thread: the status it got. */
static void *delete_team(void *arg)
{
    long *status = arg;
    char *raw = NULL;
    json_decref(at_req("DELETE", "/v1/queues/team", NULL, NULL, status, &raw));
    free(raw);
    return NULL;
}

/* A DELETE of a queue while a job's entry into it is committing (the job's insert holds the
 * queue's row FOR KEY SHARE, as store_job_insert's does; here an ended job made QUEUED again)
 * waits for it, then counts the job and is refused with a 409: a queue is never deleted under a
 * job or a tuning job that entered it, which would then wait for ever or submit its next trials
 * to a queue that is gone. */
Test(queues, a_delete_racing_a_job_entering_the_queue_counts_it)
{
    json_decref(req("POST", "/v1/queues", "{\"name\": \"team\", \"quota\": {\"cpu\": 1}}", 201));
    char *id = submit("racer", "default", "team", 1, 1);
    stop_job(id);
    char requeue[200];
    snprintf(requeue, sizeof requeue, "UPDATE jobs SET state = 'QUEUED' WHERE id = '%s'", id);
    const char *const held[] = {"SELECT 1 FROM queues WHERE name = 'team' FOR KEY SHARE", requeue, NULL};
    long status = 0;
    cr_assert(race_an_open_transaction(held, delete_team, &status, "%FROM queues%"),
              "the delete never waited on the queue's row");
    cr_assert_eq(status, 409, "the delete counts the job that entered the queue");
    cr_assert_eq(at_sql_int("SELECT count(*) FROM queues WHERE name = 'team'"), 1);
    free(id);
}

/* A tuning request of project's over queue (its base job spec()'s), up to 3 trials, one at once. */
static const char *tuning(const char *project, const char *queue)
{
    static char buf[1600];
    snprintf(buf, sizeof buf,
             "{\"name\": \"sweep\", \"job\": %s, \"parameters\": {\"lr\": {\"type\": \"continuous\", \"min\": 1e-4,"
             " \"max\": 1e-2}}, \"objective\": {\"metric\": \"val_loss\"}, \"max_jobs\": 3, \"max_parallel_jobs\": 1}",
             spec("t", project, queue, 1, 1));
    return buf;
}

/* A running tuning job submits its next trials to its queue: a PATCH leaving its project out is a
 * 409 counting it beside its trial (and counting it alone between two trials, when no job of it
 * is in the queue), and so is a DELETE of the queue; stopped, it counts no more. Otherwise its
 * next trial would be refused and the search fail, and a paused trial promoted would wait in a
 * queue its project may not use. */
Test(queues, a_running_tuning_job_keeps_its_project_in_its_queue)
{
    json_decref(req("POST", "/v1/projects", "{\"name\": \"b\"}", 201));
    json_decref(req("POST", "/v1/queues", "{\"name\": \"team\", \"quota\": {\"cpu\": 1}, \"projects\": [\"b\"]}", 201));
    json_t *t = req("POST", "/v1/tuning-jobs", tuning("b", "team"), 201);
    char *id = strdup(json_string_value(json_object_get(t, "id")));
    json_decref(t);
    for (int i = 0; i < 400 && at_sql_int("SELECT count(*) FROM jobs WHERE project = 'b'") == 0; i++)
        usleep(25000);
    cr_assert_eq(at_sql_int("SELECT count(*) FROM jobs WHERE project = 'b' AND queue = 'team'"), 1, "its first trial");
    refused("PATCH", "/v1/queues/team", "{\"projects\": [\"default\"]}", 409, "projects",
            "queue \"team\" has 1 job(s) of project \"b\" (");
    refused("PATCH", "/v1/queues/team", "{\"projects\": [\"default\"]}", 409, "projects",
            ") and 1 running tuning job(s) that submit their next trials to it, which projects would no longer let in");
    hint_has("PATCH", "/v1/queues/team", "{\"projects\": [\"default\"]}", 409, "kiln tune list lists its tuning jobs");
    /* stopped, with its trial: nothing of b is left in the queue */
    char path[128];
    snprintf(path, sizeof path, "/v1/tuning-jobs/%s:stop", id);
    json_decref(req("POST", path, NULL, 200));
    for (int i = 0; i < 400 && at_sql_int("SELECT count(*) FROM tuning_jobs WHERE state = 'STOPPED'") == 0; i++)
        usleep(25000);
    cr_assert_eq(at_sql_int("SELECT count(*) FROM jobs WHERE project = 'b' AND state IN ('QUEUED', 'RUNNING')"), 0);
    /* between two trials a running tuning job has no job in the queue: it counts alone (made
     * RUNNING again here, as it is before the controller's pass submits its next trial) */
    cr_assert_eq(at_sql_int("WITH u AS (UPDATE tuning_jobs SET state = 'RUNNING' WHERE id = '%s' RETURNING 1)"
                            " SELECT count(*) FROM u", id), 1);
    json_t *j = req("PATCH", "/v1/queues/team", "{\"projects\": [\"default\"]}", 409);
    const char *m = json_string_value(json_object_get(j, "message"));
    cr_assert(m && strstr(m, "1 running tuning job(s)") && strstr(m, "that submit their next trials to it"), "%s", m);
    json_decref(j);
    j = req("DELETE", "/v1/queues/team", NULL, 409);
    m = json_string_value(json_object_get(j, "message"));
    cr_assert(m && (strstr(m, "has 1 running tuning job(s) that submit their next trials to it") ||
                    strstr(m, "job(s) waiting or running")), "%s", m);
    json_decref(j);
    cr_assert_eq(at_sql_int("WITH u AS (UPDATE tuning_jobs SET state = 'STOPPED' WHERE id = '%s' RETURNING 1)"
                            " SELECT count(*) FROM u", id), 1);
    free(id);
}

/* As a job's submission: a tuning job submitted while a change of its queue's projects that leaves
 * its project out is committing waits for it, then is refused naming job.queue; it never runs
 * with trials bound for a queue its project may not use. */
Test(queues, a_tuning_submission_racing_a_change_of_the_queues_projects_never_lands_outside_them)
{
    race_a_change_of_the_queues_projects("/v1/tuning-jobs", tuning("b", "team"), "tuning_jobs");
}
