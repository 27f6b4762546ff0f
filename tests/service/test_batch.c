/* test_batch.c - an agent's start reports and rank exits in one call (svc_agent_report_batch,
 * gRPC ReportBatch) with a real PostgreSQL: handled in the batch's order, a resent batch is a
 * harmless repeat, one refused report (another worker's rank, a report kilnd refuses inside the
 * transaction) leaves the others handled, and an oversized batch is refused whole. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "tests/service/fixture.h"

TestSuite(batch, .init = setup, .fini = teardown, .timeout = 60);

#define B_MAX 300

/* A batch under construction: reports of one worker, in order. */
typedef struct batch {
    Kiln__Report reps[B_MAX], *repp[B_MAX];
    Kiln__RankStatus st[B_MAX];
    Kiln__RankExit ex[B_MAX];
    int n;
} batch_t;

static void b_status(batch_t *b, const char *wid, const char *job, int attempt)
{
    int i = b->n++;
    kiln__report__init(&b->reps[i]);
    kiln__rank_status__init(&b->st[i]);
    b->st[i].worker_id = (char *)wid;
    b->st[i].job_id = (char *)job;
    b->st[i].attempt = attempt;
    b->st[i].started = true;
    b->st[i].reason = (char *)"";
    b->reps[i].kind_case = KILN__REPORT__KIND_STATUS;
    b->reps[i].status = &b->st[i];
    b->repp[i] = &b->reps[i];
}

static void b_exit(batch_t *b, const char *wid, const char *job, int attempt, int rank, int code)
{
    int i = b->n++;
    kiln__report__init(&b->reps[i]);
    kiln__rank_exit__init(&b->ex[i]);
    b->ex[i].worker_id = (char *)wid;
    b->ex[i].job_id = (char *)job;
    b->ex[i].attempt = attempt;
    b->ex[i].rank = rank;
    b->ex[i].exit_code = code;
    b->ex[i].reason = (char *)(code ? "boom" : "");
    b->reps[i].kind_case = KILN__REPORT__KIND_EXIT;
    b->reps[i].exit = &b->ex[i];
    b->repp[i] = &b->reps[i];
}

/* Sends b as worker wid (the credential's) naming worker `claimed` (NULL: wid); the results'
 * codes into codes (b->n of them). */
static int b_send_as(batch_t *b, const char *wid, const char *claimed, int *codes)
{
    Kiln__ReportBatchRequest rq = KILN__REPORT_BATCH_REQUEST__INIT;
    rq.worker_id = (char *)(claimed ? claimed : wid);
    rq.n_reports = (size_t)b->n;
    rq.reports = b->repp;
    Kiln__ReportBatchReply out = KILN__REPORT_BATCH_REPLY__INIT;
    arena_reset(&arena);
    kiln_err_clear(&err);
    int rc = svc_agent_report_batch(svc, wid, &rq, &arena, &out, &err);
    if (rc == 0) {
        cr_assert_eq(out.n_results, (size_t)b->n, "one result per report");
        for (int i = 0; i < b->n; i++)
            codes[i] = out.results[i]->code;
    }
    return rc;
}

static int b_send(batch_t *b, const char *wid, int *codes)
{
    return b_send_as(b, wid, NULL, codes);
}

/* A worker of `slots` slots and a job of one node using all of them, delivered to it. */
static void placed(int slots, char *wid, char *job)
{
    reg(NULL, slots, "cpu", wid);
    submit(spec(1, slots, "cpu", 0, 1), NULL, job, NULL);
    json_decref(wait_state(job, "SCHEDULED", 5000));
    Kiln__HeartbeatResponse *r = hb(wid, NULL, 0);
    cr_assert_eq(r->n_assignments, 1);
    cr_assert_str_eq(r->assignments[0]->job_id, job);
}

Test(batch, a_start_report_and_the_exits_in_one_call_run_the_job_to_completed_in_order)
{
    char w[64], job[40], ev[256];
    placed(4, w, job);
    batch_t b = {0};
    b_status(&b, w, job, 1);
    for (int r = 0; r < 4; r++)
        b_exit(&b, r == 1 ? "" : w, job, 1, r, 0); /* a report without a worker id is the batch's */
    int codes[B_MAX];
    cr_assert_eq(b_send(&b, w, codes), 0, "%s", err.message);
    for (int i = 0; i < b.n; i++)
        cr_assert_eq(codes[i], 0, "report %d: %d", i, codes[i]);
    json_t *j = get(job);
    cr_assert_str_eq(state_of(j), "COMPLETED");
    cr_assert_str_eq(json_string_value(json_object_get(j, "reason")), "all 4 rank(s) exited with code 0");
    json_decref(j);
    /* the start report first (RUNNING), then the exits: handled in the batch's order */
    events_str(job, ev, sizeof(ev));
    cr_assert_str_eq(ev, "QUEUED SCHEDULED STARTING RUNNING COMPLETED");
    slots_all_free();
}

Test(batch, a_batch_sent_again_after_a_lost_reply_is_a_harmless_repeat)
{
    char w[64], job[40], ev[256];
    placed(2, w, job);
    batch_t first = {0}, again = {0};
    b_status(&first, w, job, 1);
    b_exit(&first, w, job, 1, 0, 0);
    b_status(&again, w, job, 1);
    b_exit(&again, w, job, 1, 0, 0);
    b_exit(&again, w, job, 1, 1, 0);
    int codes[B_MAX];
    cr_assert_eq(b_send(&first, w, codes), 0, "%s", err.message);
    json_t *j = get(job);
    cr_assert_str_eq(state_of(j), "RUNNING", "one rank still runs");
    json_decref(j);
    /* the reply was lost: the agent sends what it still holds, the first two again */
    for (int round = 0; round < 2; round++) {
        cr_assert_eq(b_send(&again, w, codes), 0, "%s", err.message);
        for (int i = 0; i < again.n; i++)
            cr_assert_eq(codes[i], 0, "round %d, report %d: %d", round, i, codes[i]);
        j = get(job);
        cr_assert_str_eq(state_of(j), "COMPLETED");
        json_decref(j);
    }
    events_str(job, ev, sizeof(ev));
    cr_assert_str_eq(ev, "QUEUED SCHEDULED STARTING RUNNING COMPLETED", "each change once");
    slots_all_free();
}

Test(batch, one_refused_report_leaves_the_others_handled)
{
    char w1[64], w2[64], done[40], j1[40], j2[40], ev[256];
    placed(2, w1, done);
    status(w1, done, 1, false, "could not start"); /* it fails: its assignment is released, never started */
    json_decref(wait_state(done, "FAILED", 1000));
    submit(spec(1, 2, "cpu", 0, 1), NULL, j1, NULL);
    json_decref(wait_state(j1, "SCHEDULED", 5000));
    cr_assert_eq(hb(w1, NULL, 0)->n_assignments, 1);
    placed(2, w2, j2);

    batch_t b = {0};
    b_status(&b, w1, done, 1);  /* no live assignment: refused inside the transaction */
    b_exit(&b, w1, j2, 1, 0, 0); /* w2's rank: refused before any database work */
    b_status(&b, w1, j1, 1);
    b_exit(&b, w1, j1, 1, 0, 1); /* fails: the attempt is lost; the job, with one attempt, fails */
    b_exit(&b, w1, j1, 1, 1, 0); /* recorded, changes nothing */
    b_exit(&b, w2, j1, 1, 1, 0); /* names another worker than the credential's */
    int codes[B_MAX];
    cr_assert_eq(b_send(&b, w1, codes), 0, "%s", err.message);
    int want[] = {5 /* NOT_FOUND */, 7 /* PERMISSION_DENIED */, 0, 0, 0, 7};
    for (int i = 0; i < b.n; i++)
        cr_assert_eq(codes[i], want[i], "report %d: %d, not %d", i, codes[i], want[i]);
    json_t *j = get(j1);
    cr_assert_str_eq(state_of(j), "FAILED");
    cr_assert(strstr(json_string_value(json_object_get(j, "reason")), "rank 0 on worker"), "%s",
              json_string_value(json_object_get(j, "reason")));
    json_decref(j);
    events_str(j1, ev, sizeof(ev));
    cr_assert_str_eq(ev, "QUEUED SCHEDULED STARTING RUNNING FAILED");
    j = get(j2);
    cr_assert_str_eq(state_of(j), "STARTING", "another worker's report changed nothing");
    json_decref(j);
    events_str(done, ev, sizeof(ev));
    cr_assert_str_eq(ev, "QUEUED SCHEDULED STARTING FAILED");
}

Test(batch, an_oversized_batch_is_refused_whole)
{
    char w[64], job[40];
    placed(1, w, job);
    static batch_t b;
    memset(&b, 0, sizeof(b));
    b_status(&b, w, job, 1);
    while (b.n < SVC_REPORT_BATCH_MAX + 1)
        b_exit(&b, w, job, 1, 0, 0);
    int codes[B_MAX];
    cr_assert_eq(b_send(&b, w, codes), KILN_EINVAL);
    cr_assert(strstr(err.message, "at most 256 reports"), "%s", err.message);
    cr_assert_str_eq(err.field, "reports");
    json_t *j = get(job);
    cr_assert_str_eq(state_of(j), "STARTING", "nothing of it handled");
    json_decref(j);
    /* another worker's batch: refused before anything, whatever it holds */
    b.n = 1;
    cr_assert_eq(b_send_as(&b, w, "w-not-this-one", codes), KILN_EPERM);
    j = get(job);
    cr_assert_str_eq(state_of(j), "STARTING");
    json_decref(j);
}
