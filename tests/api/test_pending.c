/* test_pending.c - a waiting job's pending reason, its admission events and the per-queue
 * Prometheus metrics, over real HTTP with the real database and scheduler: the pending object
 * names the job's position, the slots and quota numbers it lacks and the jobs it waits for, gains
 * an estimated start once the job in its way reports a step rate, follows the cluster as it
 * changes, and names no job of another project (nor do the reasons and events of a job preempted
 * by, waiting behind or backfilled ahead of one, as its project's member reads them); admissions
 * (within quota and borrowing) are events with reasons and counted in /metrics, whose per-queue
 * gauges read what the queues hold (promtool finds nothing to fix). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/api/api_test.h"

TestSuite(pending, .init = at_setup, .fini = at_teardown, .timeout = 120);

/* A request as the cluster admin; asserts the status; returns the reply (caller decrefs). */
static json_t *req(const char *method, const char *path, const char *body, long want)
{
    return at_req_want(method, path, body, want);
}

/* Submits a 1-node job of project's (NULL: the default project's) with `slots` cpu ranks in queue,
 * training max_steps steps, with the spec's members extra ("\"k\": v, ...", or NULL); returns its id. */
static char *submit_with(const char *project, const char *name, const char *queue, int slots, int max_steps,
                         const char *extra)
{
    char body[1024];
    snprintf(body, sizeof body,
             "{\"name\": \"%s\", \"project\": \"%s\", \"queue\": \"%s\", \"model\": {\"type\": \"mlp\", \"hidden\": [8],"
             " \"n_inputs\": 4, \"n_classes\": 2}, \"data\": {\"train\": \"synthetic\"}, \"hyperparameters\":"
             " {\"global_batch_size\": %d, \"max_steps\": %d}, \"resources\": {\"nodes\": 1, \"slots_per_node\": %d,"
             " \"slot_type\": \"cpu\"}%s%s}",
             name, project ? project : "default", queue, slots * 2, max_steps, slots, extra ? ", " : "",
             extra ? extra : "");
    json_t *j = req("POST", "/v1/jobs", body, 201);
    char *id = strdup(json_string_value(json_object_get(j, "id")));
    json_decref(j);
    return id;
}

static char *submit_in(const char *project, const char *name, const char *queue, int slots, int max_steps)
{
    return submit_with(project, name, queue, slots, max_steps, NULL);
}

static char *submit(const char *name, const char *queue, int slots, int max_steps)
{
    return submit_in(NULL, name, queue, slots, max_steps);
}

static json_t *get_job(const char *id)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    return req("GET", path, NULL, 200);
}

/* Whether the job's pending object holds what want (a JSON object) names: position and missing
 * equal, blocking_jobs the same list, estimated_start present when want says true, absent when
 * false (and not checked when want leaves it out). */
static bool pending_is(const json_t *job, const json_t *want)
{
    const json_t *p = json_object_get(job, "pending");
    if (!json_is_object(p))
        return !want || json_is_null(want);
    if (!json_is_object(want))
        return false;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)want, k, v) {
        if (!strcmp(k, "estimated_start")) {
            if (json_is_true(v) != json_is_string(json_object_get(p, k)))
                return false;
        } else if (!json_equal(json_object_get(p, k), v)) {
            return false;
        }
    }
    return true;
}

/* Waits (up to 20 s) until the job's pending object is want (json_pack'd; NULL: absent). */
static json_t *wait_pending(const char *id, json_t *want)
{
    json_t *j = NULL;
    for (int i = 0; i < 400; i++) {
        json_decref(j);
        j = get_job(id);
        if (pending_is(j, want)) {
            json_decref(want);
            return j;
        }
        usleep(50000);
    }
    char *w = want ? json_dumps(want, 0) : strdup("(absent)");
    char *g = json_dumps(json_object_get(j, "pending") ? json_object_get(j, "pending") : json_null(), JSON_ENCODE_ANY);
    cr_assert_fail("job %s's pending never became %s; it is %s (state %s, reason %s)", id, w, g,
                   json_string_value(json_object_get(j, "state")), json_string_value(json_object_get(j, "reason")));
    return NULL;
}

/* Pushes one metric point of rank 0 at step, as if taken at time_us. */
static void push_step(const char *job, int attempt, int64_t step, int64_t time_us)
{
    Kiln__MetricPoint pt = KILN__METRIC_POINT__INIT, *pts[1] = {&pt};
    pt.name = "train_loss";
    pt.step = step;
    pt.value = 1.0;
    pt.time_us = time_us;
    Kiln__MetricBatch mb = KILN__METRIC_BATCH__INIT;
    mb.worker_id = at_worker;
    mb.job_id = (char *)job;
    mb.attempt = attempt;
    mb.n_points = 1;
    mb.points = pts;
    kiln_err_t err;
    cr_assert_eq(svc_agent_metrics(at_svc, at_worker, &mb, &err), 0, "%s", err.message);
}

/* Reports every one of the job's ranks exited with code 0 (the job completes). */
static void ranks_exit(const char *job, int attempt, int ranks)
{
    for (int r = 0; r < ranks; r++) {
        Kiln__RankExit e = KILN__RANK_EXIT__INIT;
        e.worker_id = at_worker;
        e.job_id = (char *)job;
        e.attempt = attempt;
        e.rank = r;
        e.reason = "";
        kiln_err_t err;
        kiln_err_clear(&err);
        cr_assert_eq(svc_agent_rank_exit(at_svc, at_worker, &e, &err), 0, "rank exit: %s", err.message);
    }
}

/* The reason of the job's event into state to (asserts there is one). */
static char *event_reason(const char *id, const char *to)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
    json_t *e = req("GET", path, NULL, 200);
    size_t i;
    json_t *ev;
    char *r = NULL;
    json_array_foreach(json_object_get(e, "events"), i, ev)
        if (!r && !strcmp(json_string_value(json_object_get(ev, "to_state")), to))
            r = strdup(json_string_value(json_object_get(ev, "reason")));
    json_decref(e);
    cr_assert_not_null(r, "job %s has no event into %s", id, to);
    return r;
}

Test(pending, names_position_missing_quota_and_blockers_and_follows_the_cluster)
{
    json_decref(req("POST", "/v1/queues", "{\"name\": \"nlp\", \"quota\": {\"cpu\": 2}}", 201));
    char *a = submit("a", "nlp", 2, 1011);
    int attempt = at_run_job(a);
    char *b = submit("b", "nlp", 2, 10);
    char *c = submit("c", "nlp", 1, 10);
    /* b waits for quota behind nothing; c waits behind b */
    json_decref(wait_pending(b, json_pack("{s:i, s:s, s:[s], s:b}", "position", 1, "missing",
                                          "needs 2 cpu slot(s) on 1 worker(s); queue nlp: quota 2, used 2, no cohort "
                                          "to borrow from", "blocking_jobs", a, "estimated_start", false)));
    char behind[400];
    snprintf(behind, sizeof behind, "its turn: job %s is ahead of it in queue nlp and waits (needs 2 cpu slot(s) on 1 "
             "worker(s); queue nlp: quota 2, used 2, no cohort to borrow from)", b);
    json_decref(wait_pending(c, json_pack("{s:i, s:s, s:[s, s], s:b}", "position", 2, "missing", behind,
                                          "blocking_jobs", b, a, "estimated_start", false)));
    /* the job in its way reports 10 steps a second with 1000 steps to go: b should start in ~100 s */
    int64_t now = kiln_now_us();
    push_step(a, attempt, 1, now - 1000000);
    push_step(a, attempt, 11, now);
    json_t *jb = wait_pending(b, json_pack("{s:i, s:[s], s:b}", "position", 1, "blocking_jobs", a, "estimated_start",
                                           true));
    int64_t at = 0;
    cr_assert_eq(kiln_time_parse(json_string_value(json_object_get(json_object_get(jb, "pending"), "estimated_start")),
                                 &at), 0);
    cr_assert(at >= now + 90 * 1000000LL && at <= now + 130 * 1000000LL, "estimated start %.1f s from now, not ~100",
              (double)(at - now) / 1e6);
    json_decref(jb);
    /* the behind job gets no estimate: b's own run time is not known before it runs */
    json_decref(wait_pending(c, json_pack("{s:i, s:b}", "position", 2, "estimated_start", false)));
    /* a ends: b is placed (no pending any more), c is next and waits for b's quota */
    ranks_exit(a, attempt, 2);
    json_decref(wait_pending(b, NULL));
    json_t *jc = wait_pending(c, json_pack("{s:i, s:s, s:[s]}", "position", 1, "missing",
                                           "needs 1 cpu slot(s) on 1 worker(s); queue nlp: quota 2, used 2, no cohort "
                                           "to borrow from", "blocking_jobs", b));
    cr_assert_str_eq(json_string_value(json_object_get(jc, "state")), "QUEUED");
    json_decref(jc);
    /* admission events say from which queue, within its quota, with the numbers */
    char *r = event_reason(a, "SCHEDULED");
    cr_assert(strstr(r, "admitted from queue nlp within its quota (quota 2 cpu, in use 2 with this job); placed 2 "
                        "rank(s) on 1 worker(s)"), "%s", r);
    free(r);
    free(a);
    free(b);
    free(c);
}

/* A pending reason is read by the waiting job's project: the jobs of other projects in its way
 * (what its readers cannot see) are counted and described but never named. */
Test(pending, names_no_job_of_another_project)
{
    json_decref(req("POST", "/v1/projects", "{\"name\": \"other\"}", 201));
    json_decref(req("POST", "/v1/queues", "{\"name\": \"nlp\", \"quota\": {\"cpu\": 2}}", 201));
    char *a = submit_in("other", "a", "nlp", 2, 1011);
    at_run_job(a);
    char *b = submit("b", "nlp", 2, 10);
    char *c = submit_in("other", "c", "nlp", 1, 10);
    /* b (project default) waits for the quota other's job a holds: a is not named */
    json_decref(wait_pending(b, json_pack("{s:i, s:s, s:[]}", "position", 1, "missing",
                                          "needs 2 cpu slot(s) on 1 worker(s); queue nlp: quota 2, used 2, no cohort "
                                          "to borrow from", "blocking_jobs")));
    /* c (project other) waits behind b, which it cannot see, and so for a, which it can */
    json_decref(wait_pending(c, json_pack("{s:i, s:s, s:[s]}", "position", 2, "missing",
                                          "its turn: a job of another project is ahead of it in queue nlp and waits "
                                          "(needs 2 cpu slot(s) on 1 worker(s); queue nlp: quota 2, used 2, no cohort "
                                          "to borrow from)", "blocking_jobs", a)));
    free(a);
    free(b);
    free(c);
}

/* A user of role viewer in project with a token; copies the token's Authorization header into auth. */
static void viewer_of(const char *project, const char *user, char *auth, size_t n)
{
    char token[128];
    at_user_token(user, project, "viewer", token, sizeof token);
    snprintf(auth, n, "Authorization: Bearer %s", token);
}

/* What a member (auth) reads of job id: the job and its events, as one text (caller frees). */
static char *as_member(const char *auth, const char *id)
{
    const char *hdrs[] = {auth, NULL};
    char path[128], *job = NULL, *ev = NULL, *all = NULL;
    long st;
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    json_decref(at_req("GET", path, NULL, hdrs, &st, &job));
    cr_assert_eq(st, 200, "%s: %s", path, job);
    snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
    json_decref(at_req("GET", path, NULL, hdrs, &st, &ev));
    cr_assert_eq(st, 200, "%s: %s", path, ev);
    cr_assert(asprintf(&all, "%s\n%s", job, ev) > 0);
    free(job);
    free(ev);
    return all;
}

/* Waits (up to 20 s) until the job's reason holds text; returns the job. */
static json_t *wait_reason(const char *id, const char *text)
{
    json_t *j = NULL;
    for (int i = 0; i < 400; i++) {
        json_decref(j);
        j = get_job(id);
        const char *r = json_string_value(json_object_get(j, "reason"));
        if (r && strstr(r, text))
            return j;
        usleep(50000);
    }
    cr_assert_fail("job %s's reason never held \"%s\": it is %s (%s)", id, text,
                   json_string_value(json_object_get(j, "reason")), json_string_value(json_object_get(j, "state")));
    return NULL;
}

/* Reasons and events are read by the job's project, as its pending reason is: a job of project
 * pb preempted by, waiting behind, or backfilled ahead of by a job of project pa (and the other
 * way round) finds the other project's job described but never named, over REST by a member of
 * its own project; a job of its own project keeps its id. */
Test(pending, no_reason_or_event_names_a_job_of_another_project)
{
    char auth_a[200], auth_b[200];
    json_decref(req("POST", "/v1/projects", "{\"name\": \"pa\"}", 201));
    json_decref(req("POST", "/v1/projects", "{\"name\": \"pb\"}", 201));
    viewer_of("pa", "alice", auth_a, sizeof auth_a);
    viewer_of("pb", "bob", auth_b, sizeof auth_b);
    /* pb's v runs on the worker's 4 slots; pa's h, of a higher priority, preempts it */
    char *v = submit_with("pb", "v", "default", 4, 100000, NULL);
    int va = at_run_job(v);
    char *h = submit_with("pa", "h", "default", 3, 100000, "\"priority\": 5");
    /* why, without the other project's job: its priority is not said, only that it is higher */
    json_decref(wait_reason(v, "preempted by a job of another project: it needs this job's slots and has a higher "
                               "priority in queue default than this job's (0); allowed by queue default's"));
    char *seen = as_member(auth_b, v);
    cr_assert(!strstr(seen, "(5") && !strstr(seen, " 5,") && !strstr(seen, h), "pb's member reads pa's job: %s", seen);
    free(seen);
    seen = as_member(auth_a, h); /* h waits while v stops */
    cr_assert(!strstr(seen, v), "pa's member reads pb's job %s: %s", v, seen);
    free(seen);
    /* v stops and waits (PREEMPTED) for all 4 slots; h runs on 3, for hours by its step rate */
    ranks_exit(v, va, 4);
    json_decref(wait_reason(v, "preempted by a job of another project: every rank has exited"));
    int ha = at_run_job(h);
    int64_t now = kiln_now_us();
    push_step(h, ha, 1, now - 1000000);
    push_step(h, ha, 11, now);
    /* pa's w, predicted to end in a minute, is backfilled onto the free slot ahead of v */
    char *w = submit_with("pa", "w", "default", 1, 100000, "\"stopping\": {\"max_runtime_s\": 60}");
    json_decref(wait_reason(w, "backfilled ahead of a job of another project"));
    /* pa's x waits behind v (no free slot is left), and for h and w, which its readers see */
    char *x = submit_with("pa", "x", "default", 1, 100000, NULL);
    json_decref(wait_reason(x, "waiting behind a job of another project in queue default"));
    json_t *jx = wait_pending(x, json_pack("{s:i}", "position", 2));
    const json_t *bl = json_object_get(json_object_get(jx, "pending"), "blocking_jobs");
    char *bls = json_dumps(bl, 0);
    cr_assert(json_array_size(bl) == 2 && strstr(bls, h) && strstr(bls, w), "x waits for h and w: %s", bls);
    free(bls);
    json_decref(jx);
    json_decref(wait_pending(v, json_pack("{s:i, s:[]}", "position", 1, "blocking_jobs")));
    /* what each project's member reads of its jobs names no job of the other project */
    const char *pa_jobs[] = {h, w, x};
    for (size_t k = 0; k < KILN_ARRAY_LEN(pa_jobs); k++) {
        seen = as_member(auth_a, pa_jobs[k]);
        cr_assert(!strstr(seen, v), "pa's member reads pb's job %s: %s", v, seen);
        free(seen);
    }
    seen = as_member(auth_b, v);
    for (size_t k = 0; k < KILN_ARRAY_LEN(pa_jobs); k++)
        cr_assert(!strstr(seen, pa_jobs[k]), "pb's member reads pa's job %s: %s", pa_jobs[k], seen);
    free(seen);
    free(v);
    free(h);
    free(w);
    free(x);
}

/* A queue's preemption policy over the real scheduler: a high-priority head of a within_queue
 * "never" queue that a lower-priority job of its queue keeps waiting says the policy is why (its
 * reason and its pending reason's missing), preempts nothing, and once the policy allows it
 * preempts, the victim's reason naming the rule. */
Test(pending, a_head_its_queues_policy_keeps_from_preempting_says_so)
{
    json_decref(req("POST", "/v1/queues", "{\"name\": \"prod\", \"quota\": {\"cpu\": 4}, \"preemption\":"
                                          " {\"within_queue\": \"never\"}}", 201));
    char *v = submit("v", "prod", 4, 100000);
    at_run_job(v);
    char *h = submit_with(NULL, "h", "prod", 3, 100000, "\"priority\": 5");
    const char *rule = "queue prod's preemption.within_queue (never) keeps it from preempting its lower-priority jobs";
    json_t *jh = wait_reason(h, rule);
    cr_assert_str_eq(json_string_value(json_object_get(jh, "state")), "QUEUED");
    const char *missing = json_string_value(json_object_get(json_object_get(jh, "pending"), "missing"));
    cr_assert(missing && strstr(missing, rule), "pending.missing: %s", missing ? missing : "(none)");
    json_decref(jh);
    json_t *jv = get_job(v);
    cr_assert_str_eq(json_string_value(json_object_get(jv, "state")), "RUNNING", "v was preempted");
    json_decref(jv);
    /* the default policy: h preempts v, whose reason names the rule that allowed it */
    json_decref(req("PATCH", "/v1/queues/prod", "{\"preemption\": {\"within_queue\": null}}", 200));
    json_decref(wait_reason(v, "allowed by queue prod's preemption.within_queue (lower_priority)"));
    free(v);
    free(h);
}

/* The value of the series line (name and labels exactly) in a scrape; asserts it is there. */
static const char *series(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, line, n) && p[n] == ' ')
            return p + n + 1;
    cr_assert_fail("no series %s in:\n%s", line, text);
    return NULL;
}

static void series_is(const char *text, const char *line, const char *want)
{
    const char *v = series(text, line);
    cr_assert(!strncmp(v, want, strlen(want)) && (v[strlen(want)] == '\n' || !v[strlen(want)]), "%s is %.20s, not %s",
              line, v, want);
}

Test(pending, borrowing_is_an_event_and_the_queues_show_in_metrics)
{
    json_decref(req("POST", "/v1/queues", "{\"name\": \"lend\", \"cohort\": \"c\", \"quota\": {\"cpu\": 2}}", 201));
    json_decref(req("POST", "/v1/queues", "{\"name\": \"borrow\", \"cohort\": \"c\", \"quota\": {\"cpu\": 1}}", 201));
    char *x = submit("x", "borrow", 2, 10);
    at_run_job(x);
    char *y = submit("y", "borrow", 2, 10);
    json_decref(wait_pending(y, json_pack("{s:i, s:s, s:[s]}", "position", 1, "missing",
                                          "needs 2 cpu slot(s) on 1 worker(s); queue borrow: quota 1, used 2, may "
                                          "borrow what the cohort lends; cohort c: 1 free", "blocking_jobs", x)));
    char *r = event_reason(x, "SCHEDULED");
    cr_assert(strstr(r, "admitted from queue borrow borrowing 1 cpu slot(s) from cohort c (quota 1, in use 2 with this "
                        "job)"), "%s", r);
    free(r);
    long st;
    char *text = NULL;
    json_decref(at_req("GET", "/metrics", NULL, NULL, &st, &text));
    cr_assert_eq(st, 200);
    series_is(text, "kiln_queue_admissions_total{queue=\"borrow\",borrowing=\"true\"}", "1");
    series_is(text, "kiln_queue_admissions_total{queue=\"borrow\",borrowing=\"false\"}", "0");
    series_is(text, "kiln_queue_admission_wait_seconds_count{queue=\"borrow\"}", "1");
    series_is(text, "kiln_queue_preemptions_total{queue=\"borrow\",reason=\"reclaim\"}", "0");
    series_is(text, "kiln_queue_preemptions_total{queue=\"lend\",reason=\"priority\"}", "0");
    series_is(text, "kiln_queue_pending_jobs{queue=\"borrow\"}", "1");
    series_is(text, "kiln_queue_admitted_jobs{queue=\"borrow\"}", "1");
    series_is(text, "kiln_queue_admitted_jobs{queue=\"lend\"}", "0");
    series_is(text, "kiln_queue_usage_slots{queue=\"borrow\",slot_type=\"cpu\"}", "2");
    series_is(text, "kiln_queue_quota_slots{queue=\"borrow\",slot_type=\"cpu\"}", "1");
    series_is(text, "kiln_queue_quota_slots{queue=\"default\",slot_type=\"cpu\"}", "+Inf");
    series_is(text, "kiln_queue_borrowed_slots{queue=\"borrow\",slot_type=\"cpu\"}", "1");
    series_is(text, "kiln_queue_borrowed_slots{queue=\"lend\",slot_type=\"cpu\"}", "0");
    /* promtool finds nothing to fix */
    cr_assert(access("/usr/bin/promtool", X_OK) == 0, "promtool is missing (Debian's prometheus package)");
    char path[200], cmd[512];
    snprintf(path, sizeof path, "%s/metrics.txt", at_dir_path());
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "/usr/bin/promtool check metrics < %s > %s.lint 2>&1", path, path);
    int rc = system(cmd);
    snprintf(cmd, sizeof cmd, "%s.lint", path);
    char *said = NULL;
    kiln_err_t err;
    cr_assert_eq(kiln_file_read(cmd, &said, NULL, &err), 0, "%s", err.message);
    cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 0 && !said[0], "promtool check metrics: %s", said);
    free(said);
    free(text);
    free(x);
    free(y);
}
