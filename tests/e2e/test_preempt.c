/* test_preempt.c - end to end with a real kilnd and two real agents (3 cpu slots: 2 + 1):
 * preemption that reclaims borrowed quota (the victim checkpoints, goes PREEMPTED naming the
 * preemptor, resumes and ends with the same losses as its uninterrupted twins), preemption for
 * priority that picks the job with the fewest steps since its checkpoint, and backfill of a job
 * predicted to end before the blocked head can start. Running jobs are frozen (SIGSTOP) at a
 * step so that "still running" is certain; every wait is on a state read from the API. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "tests/e2e/e2e.h"

#define STEPS 400

typedef struct frozen {
    char id[64];
    pid_t ranks[E2E_MAX_RANKS];
    int n_ranks;
} frozen_t;

/* A tiny GPT job of 1 x slots on the cpu, with these extra spec members (a JSON object text, or
 * NULL); submitted, and frozen at step `at` when at > 0. */
static void submit(frozen_t *f, const char *name, long steps, int slots, const char *extra, long at)
{
    char *text = e2e_spec(name, (int)steps, 1, slots, 4);
    json_t *spec = json_loads(text, 0, NULL);
    free(text);
    if (extra) {
        json_t *x = json_loads(extra, 0, NULL);
        cr_assert_not_null(x, "bad extra: %s", extra);
        json_object_update(spec, x);
        json_decref(x);
    }
    text = json_dumps(spec, JSON_COMPACT);
    json_decref(spec);
    json_t *job = e2e_submit(text);
    free(text);
    snprintf(f->id, sizeof f->id, "%s", e2e_jstr(job, "id"));
    json_decref(job);
    f->n_ranks = 0;
    if (at > 0)
        json_decref(e2e_freeze_at_step(f->id, at, 120000, f->ranks, &f->n_ranks));
}

static json_t *job_get(const char *id)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    return e2e_get(path);
}

static void create_queue(const char *body)
{
    long st = 0;
    json_t *r = e2e_http("POST", "/v1/queues", body, NULL, &st);
    cr_assert(st == 200 || st == 201, "create queue: HTTP %ld %s", st, e2e_dump(r));
    json_decref(r);
}

/* Waits until one of jobs[0..n) is STOPPING or PREEMPTED; returns its index. */
static int wait_victim(frozen_t *jobs, int n, long timeout_ms)
{
    for (long t = 0; t < timeout_ms; t += 100) {
        for (int i = 0; i < n; i++) {
            json_t *j = job_get(jobs[i].id);
            bool hit = !strcmp(e2e_jstr(j, "state"), "STOPPING") || !strcmp(e2e_jstr(j, "state"), "PREEMPTED");
            json_decref(j);
            if (hit)
                return i;
        }
        usleep(100000);
    }
    cr_assert_fail("no job was preempted in %ld ms", timeout_ms);
    return -1;
}

static void assert_state(const char *id, const char *state)
{
    json_t *j = job_get(id);
    cr_assert_str_eq(e2e_jstr(j, "state"), state, "job %s: %s", id, e2e_dump(j));
    json_decref(j);
}

/* The reason of the job's first event into state (static buffer), "" when none. */
static const char *event_reason(const char *id, const char *state)
{
    static char buf[1024];
    buf[0] = '\0';
    json_t *ev = e2e_events(id);
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(ev, "events"), i, e)
        if (!strcmp(e2e_jstr(e, "to_state"), state)) {
            snprintf(buf, sizeof buf, "%s", e2e_jstr(e, "reason"));
            break;
        }
    json_decref(ev);
    return buf;
}

/* The reason of the job's one event that says it preempts others (it stays where it waits), ""
 * when it has none; asserts it has no second one (one per decision, not one per pass). */
static const char *preempting_event(const char *id)
{
    static char buf[1024];
    buf[0] = '\0';
    json_t *ev = e2e_events(id);
    size_t i;
    json_t *e;
    int n = 0;
    json_array_foreach(json_object_get(ev, "events"), i, e)
        if (!strncmp(e2e_jstr(e, "reason"), "preempting ", 11)) {
            cr_assert_str_eq(e2e_jstr(e, "from_state"), e2e_jstr(e, "to_state"), "%s", e2e_dump(e));
            snprintf(buf, sizeof buf, "%s", e2e_jstr(e, "reason"));
            n++;
        }
    json_decref(ev);
    cr_assert_leq(n, 1, "%s has %d preempting events", id, n);
    return buf;
}

/* Team A fills the cluster by borrowing team B's quota; B submits within its quota: one of A's
 * jobs (the one that loses least) is preempted, goes PREEMPTED naming B's job, and B's job runs
 * while A's other jobs still do. The victim resumes from its checkpoint and ends with the very
 * losses of its twins that were never interrupted (same spec and seed: kiln-train's resume is
 * bit-exact), and its preemption did not use up its one attempt. */
Test(preempt, reclaim_borrowed_quota_resumes_bit_exact, .init = e2e_setup, .fini = e2e_teardown, .timeout = 300)
{
    create_queue("{\"name\": \"team-a\", \"cohort\": \"research\", \"quota\": {\"cpu\": 1}, \"projects\": [\"default\"]}");
    create_queue("{\"name\": \"team-b\", \"cohort\": \"research\", \"quota\": {\"cpu\": 2}, \"projects\": [\"default\"]}");
    char extra[600];
    snprintf(extra, sizeof extra, "{\"queue\": \"team-a\", \"checkpoint\": {\"every_steps\": 10, \"path\": "
             "\"%s/shared-checkpoints\"}}", e2e_cl->dir);
    frozen_t a[3];
    for (int i = 0; i < 3; i++)
        submit(&a[i], "e2e-team-a", STEPS, 1, extra, 15 + 7 * i);
    frozen_t b;
    submit(&b, "e2e-team-b", STEPS, 1, "{\"queue\": \"team-b\"}", 0);
    int v = wait_victim(a, 3, 60000);
    e2e_thaw(a[v].ranks, a[v].n_ranks); /* so that it can checkpoint and exit on the SIGTERM */
    json_t *j = e2e_wait_state(a[v].id, "PREEMPTED", 60000);
    cr_assert(strstr(e2e_jstr(j, "reason"), b.id), "the reason does not name the preemptor %s: %s", b.id,
              e2e_jstr(j, "reason"));
    json_decref(j);
    /* B's job runs at once: A's other jobs still run (frozen) */
    json_decref(e2e_wait_state(b.id, "RUNNING|COMPLETED", 60000));
    for (int i = 0; i < 3; i++)
        if (i != v)
            assert_state(a[i].id, "RUNNING");
    cr_assert(strstr(event_reason(a[v].id, "STOPPING"), "queue team-b reclaims the quota queue team-a borrows"),
              "%s", event_reason(a[v].id, "STOPPING"));
    /* the event names the rule that allowed it: the preemptor's queue's policy */
    cr_assert(strstr(event_reason(a[v].id, "STOPPING"), "allowed by queue team-b's preemption.reclaim_within_cohort "
                     "(any)"), "%s", event_reason(a[v].id, "STOPPING"));
    /* and B's job has one event naming its victim and the rule */
    const char *note = preempting_event(b.id);
    cr_assert(strstr(note, a[v].id) && strstr(note, "queue team-b reclaims the quota queue team-a borrows"), "%s",
              note);
    for (int i = 0; i < 3; i++)
        cr_assert(i == v || !strstr(note, a[i].id), "%s", note);
    for (int i = 0; i < 3; i++)
        if (i != v)
            e2e_thaw(a[i].ranks, a[i].n_ranks);
    json_t *done[3];
    for (int i = 0; i < 3; i++) {
        done[i] = e2e_wait_state(a[i].id, TH_JOB_ENDED, 180000);
        cr_assert_str_eq(e2e_jstr(done[i], "state"), "COMPLETED", "%s", e2e_dump(done[i]));
    }
    json_decref(e2e_wait_state(b.id, TH_JOB_ENDED, 120000));
    cr_assert_eq(e2e_jint(done[v], "attempt"), 2, "%s", e2e_dump(done[v]));
    char states[512];
    json_t *ev = e2e_events(a[v].id);
    e2e_event_states(ev, states, sizeof states);
    json_decref(ev);
    cr_assert(strstr(states, "RUNNING,STOPPING,PREEMPTED,SCHEDULED,STARTING,RUNNING,COMPLETED"), "%s", states);
    cr_assert(strstr(event_reason(a[v].id, "PREEMPTED"), b.id), "%s", event_reason(a[v].id, "PREEMPTED"));
    /* resumed from its checkpoint, and bit-exact: the same final losses as an uninterrupted twin */
    char path[160];
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?limit=10000", a[v].id);
    json_t *logs = e2e_get(path);
    bool resumed = false;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(logs, "lines"), i, e)
        resumed |= e2e_jint(e, "attempt") == 2 && strstr(e2e_jstr(e, "line"), "resumed from");
    json_decref(logs);
    cr_assert(resumed, "attempt 2 did not resume from a checkpoint");
    int twin = v == 0 ? 1 : 0;
    static const char *const names[] = {"train_loss", "val_loss"};
    for (int k = 0; k < 2; k++) {
        json_t *x = json_object_get(json_object_get(done[v], "metrics"), names[k]);
        json_t *y = json_object_get(json_object_get(done[twin], "metrics"), names[k]);
        cr_assert(json_is_number(x) && json_is_number(y), "%s: %s", names[k], e2e_dump(done[v]));
        cr_assert(json_number_value(x) == json_number_value(y), "%s after preemption %.17g, uninterrupted %.17g",
                  names[k], json_number_value(x), json_number_value(y));
    }
    for (int k = 0; k < 3; k++)
        json_decref(done[k]);
    e2e_pass();
}

/* Three low-priority jobs fill the cluster; one checkpoints every step, the others have not
 * checkpointed since they started. A high-priority job preempts the first, and only it. */
Test(preempt, priority_preempts_the_fewest_steps_since_checkpoint, .init = e2e_setup, .fini = e2e_teardown,
     .timeout = 300)
{
    char every1[600], rarely[600];
    snprintf(every1, sizeof every1, "{\"checkpoint\": {\"every_steps\": 1, \"path\": \"%s/shared-checkpoints\"}}", e2e_cl->dir);
    snprintf(rarely, sizeof rarely, "{\"checkpoint\": {\"every_steps\": 100000, \"path\": \"%s/shared-checkpoints\"}}", e2e_cl->dir);
    frozen_t low[3];
    submit(&low[0], "e2e-low-rarely", STEPS, 1, rarely, 30);
    submit(&low[1], "e2e-low-often", STEPS, 1, every1, 30);
    submit(&low[2], "e2e-low-rarely2", STEPS, 1, rarely, 30);
    frozen_t high;
    submit(&high, "e2e-high", STEPS, 1, "{\"priority\": 5}", 0);
    int v = wait_victim(low, 3, 60000);
    cr_assert_eq(v, 1, "preempted %s, not the job that checkpoints every step", low[v].id);
    e2e_thaw(low[v].ranks, low[v].n_ranks);
    json_t *j = e2e_wait_state(low[1].id, "PREEMPTED", 60000);
    cr_assert(strstr(e2e_jstr(j, "reason"), high.id), "%s", e2e_jstr(j, "reason"));
    json_decref(j);
    json_decref(e2e_wait_state(high.id, "RUNNING|COMPLETED", 60000));
    assert_state(low[0].id, "RUNNING");
    assert_state(low[2].id, "RUNNING");
    cr_assert(strstr(event_reason(low[1].id, "STOPPING"), "has the higher priority"), "%s",
              event_reason(low[1].id, "STOPPING"));
    cr_assert(strstr(event_reason(low[1].id, "STOPPING"), "preemption.within_queue (lower_priority)"), "%s",
              event_reason(low[1].id, "STOPPING"));
    const char *note = preempting_event(high.id);
    cr_assert(strstr(note, low[1].id) && !strstr(note, low[0].id) && !strstr(note, low[2].id)
              && strstr(note, "lower priority in queue default"), "%s", note);
    e2e_thaw(low[0].ranks, low[0].n_ranks);
    e2e_thaw(low[2].ranks, low[2].n_ranks);
    for (int i = 0; i < 3; i++) {
        j = e2e_wait_state(low[i].id, TH_JOB_ENDED, 180000);
        cr_assert_str_eq(e2e_jstr(j, "state"), "COMPLETED", "%s", e2e_dump(j));
        json_decref(j);
    }
    json_decref(e2e_wait_state(high.id, "COMPLETED", 120000));
    e2e_pass();
}

/* A job of 2 slots runs (frozen) on the 2-slot agent, predicted from its measured step time to
 * run for hours; a big job of 2 slots waits for it at the head of the queue. Behind it, a small
 * job with stopping.max_runtime_s (a prediction) is backfilled onto the free slot and completes;
 * one with no prediction waits behind the head. The big job starts once the first ends (stopped
 * here), and the backfilled job had ended before that: the head started no later than it would
 * have without backfill. */
Test(preempt, backfill_runs_a_small_job_while_the_big_one_waits, .init = e2e_setup, .fini = e2e_teardown,
     .timeout = 300)
{
    frozen_t first, big, small, blind;
    /* the first job is frozen only once kilnd knows its step time (from two metric batches): the
     * head's reservation, and so any backfill, needs the predicted end of the job it waits for */
    submit(&first, "e2e-first", 10000000, 2, NULL, 0);
    for (int64_t until = kiln_mono_us() + 120 * 1000000;;) {
        json_t *j = job_get(first.id);
        bool known = json_is_number(json_object_get(json_object_get(j, "progress"), "eta_s"));
        json_decref(j);
        if (known)
            break;
        cr_assert_lt(kiln_mono_us(), until, "job %s: no step time known after 120 s", first.id);
        usleep(50000);
    }
    json_decref(e2e_freeze_at_step(first.id, 1, 120000, first.ranks, &first.n_ranks));
    submit(&big, "e2e-big", STEPS, 2, NULL, 0);
    json_decref(e2e_wait_state(big.id, "QUEUED", 1000));
    submit(&small, "e2e-small", STEPS, 1, "{\"stopping\": {\"max_runtime_s\": 600}}", 0);
    /* no prediction: another model shape that never ran, no max_runtime_s */
    submit(&blind, "e2e-blind", STEPS, 1, "{\"hyperparameters\": {\"lr\": 0.003, \"global_batch_size\": 4, "
           "\"max_steps\": 400, \"warmup_steps\": 2, \"seed\": 8, \"eval_every\": 0, \"sample_every\": 0}, "
           "\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 32, \"seq_len\": 32, "
           "\"vocab\": \"bytes\"}}", 0);
    json_t *j = e2e_wait_state(small.id, TH_JOB_ENDED, 120000);
    cr_assert_str_eq(e2e_jstr(j, "state"), "COMPLETED", "%s", e2e_dump(j));
    json_decref(j);
    cr_assert(strstr(event_reason(small.id, "SCHEDULED"), "backfilled ahead of job"), "%s",
              event_reason(small.id, "SCHEDULED"));
    cr_assert(strstr(event_reason(small.id, "SCHEDULED"), big.id), "%s", event_reason(small.id, "SCHEDULED"));
    assert_state(big.id, "QUEUED");
    assert_state(blind.id, "QUEUED");
    j = job_get(blind.id);
    cr_assert(strstr(e2e_jstr(j, "reason"), big.id), "%s", e2e_jstr(j, "reason"));
    json_decref(j);
    assert_state(first.id, "RUNNING");
    /* the first job ends (stopped: it would run for hours); the big one starts */
    long st = 0;
    char path[160];
    snprintf(path, sizeof path, "/v1/jobs/%s:stop", first.id);
    json_decref(e2e_http("POST", path, NULL, NULL, &st));
    cr_assert_eq(st, 200);
    e2e_thaw(first.ranks, first.n_ranks);
    json_decref(e2e_wait_state(first.id, "STOPPED", 60000));
    j = e2e_wait_state(big.id, TH_JOB_ENDED, 120000);
    cr_assert_str_eq(e2e_jstr(j, "state"), "COMPLETED", "%s", e2e_dump(j));
    json_decref(j);
    json_t *f = job_get(first.id), *s = job_get(small.id);
    cr_assert(strcmp(e2e_jstr(s, "ended_at"), e2e_jstr(f, "ended_at")) < 0, "backfilled job ended %s, after %s",
              e2e_jstr(s, "ended_at"), e2e_jstr(f, "ended_at"));
    json_decref(f);
    json_decref(s);
    json_decref(e2e_wait_state(blind.id, "COMPLETED", 120000));
    e2e_pass();
}
