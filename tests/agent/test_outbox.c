/* test_outbox.c - the agent's outbox under a long kilnd outage: bounded memory, the oldest log
 * and metric batches dropped first, never the report being sent nor a rank's exit, and the job
 * told in a log line how much it lost. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent_int.h"
#include "tests/common/harness.h"

/* Lines of job queued (notices not counted), its exits, and whether a notice is queued or filling. */
static size_t queued_lines(ob_t *o, const char *job, int *exits, bool *notice)
{
    size_t n = 0;
    *exits = 0;
    *notice = false;
    for (ob_item_t *it = o->head; it; it = it->next) {
        if (strcmp(it->job_id, job) != 0)
            continue;
        if (it->kind == OB_EXIT)
            (*exits)++;
        for (size_t i = 0; i < it->nlines; i++) {
            bool is_notice = strstr(it->lines[i].line, "[kiln-agent]") != NULL;
            n += !is_notice;
            *notice |= is_notice;
        }
    }
    for (ob_item_t *it = o->open; it; it = it->next)
        for (size_t i = 0; i < it->nlines; i++)
            *notice |= strstr(it->lines[i].line, "[kiln-agent]") != NULL;
    return n;
}

Test(outbox, a_full_outbox_drops_the_oldest_batches_and_says_so)
{
    ob_t o;
    ob_init(&o, 1); /* kiln-agent --outbox-mb 1 */
    cr_assert_eq(o.cap_bytes, (size_t)1 << 20);
    char line[200];
    memset(line, 'x', sizeof(line) - 1);
    line[sizeof(line) - 1] = '\0';
    /* 20,000 lines of ~230 counted bytes: about 4.4 MiB, 20 sealed batches of 1,000 lines */
    for (int i = 0; i < 20000; i++) {
        snprintf(line, 16, "%08d", i);
        line[8] = 'x';
        ob_add_line(&o, "job-a", 1, 0, AGENT_STREAM_STDOUT, 1, line, strlen(line));
        if (i == 10)
            ob_add_exit(&o, "job-a", 1, 0, 42, 0, 0, "", false); /* sealed early: the head */
    }
    ob_add_exit(&o, "job-a", 1, 1, 43, 1, 0, "boom", false);
    pthread_mutex_lock(&o.mu);
    cr_assert_leq(o.queued_bytes, o.cap_bytes, "queued %zu bytes over a cap of %zu", o.queued_bytes, o.cap_bytes);
    cr_assert_gt(o.dropped_lines, 10000, "dropped %llu lines", (unsigned long long)o.dropped_lines);
    int exits = 0;
    bool notice = false;
    size_t kept = queued_lines(&o, "job-a", &exits, &notice);
    cr_assert_eq(exits, 2, "both exits are kept");
    cr_assert(notice, "the job is told what it lost");
    /* the head (the first 11 lines, sealed by the first exit) is never dropped */
    cr_assert_eq(o.head->kind, OB_LOGS);
    cr_assert_eq(strncmp(o.head->lines[0].line, "00000000", 8), 0);
    /* what is kept is the oldest batch being sent and the newest ones, in order */
    cr_assert_lt(kept, 20000);
    cr_assert_geq(kept + o.dropped_lines, 20000, "kept %zu, dropped %llu (notices included)", kept,
                  (unsigned long long)o.dropped_lines);
    int last = -1;
    for (ob_item_t *it = o.head; it; it = it->next)
        for (size_t i = 0; i < it->nlines; i++) {
            if (strstr(it->lines[i].line, "[kiln-agent]"))
                continue;
            int k = atoi(it->lines[i].line);
            cr_assert_gt(k, last, "line %d after %d", k, last);
            last = k;
        }
    cr_assert_eq(last, 19999, "the newest line is kept");
    /* popping the head gives its bytes back */
    size_t before = o.queued_bytes, head_bytes = o.head->bytes;
    ob_item_free(ob_pop_locked(&o));
    cr_assert_eq(o.queued_bytes, before - head_bytes);
    pthread_mutex_unlock(&o.mu);
    ob_deinit(&o);
}

/* Batches are numbered per attempt and kind, 1, 2, 3, ... in the order they leave, under one
 * random stream id per attempt; another attempt is another stream. */
Test(outbox, batches_are_numbered_per_attempt)
{
    ob_t o;
    ob_init(&o, 0);
    for (int i = 0; i < 2500; i++)
        ob_add_line(&o, "job-a", 1, 0, AGENT_STREAM_STDOUT, 1, "x", 1);
    agent_point_t pt = {.name = "loss", .rank = 0, .step = 1, .value = 1.5, .time_us = 1};
    ob_add_points(&o, "job-a", 1, &pt, 1);
    ob_add_line(&o, "job-a", 2, 0, AGENT_STREAM_STDOUT, 1, "y", 1);
    pthread_mutex_lock(&o.mu);
    ob_seal_due_locked(&o, true);
    uint64_t stream1 = 0, stream2 = 0, next_logs = 1;
    bool metrics_seen = false;
    for (ob_item_t *it = o.head; it; it = it->next) {
        cr_assert_neq(it->stream_id, 0);
        if (it->attempt == 2) {
            stream2 = it->stream_id;
            cr_assert_eq(it->batch_seq, 1, "another attempt counts from 1");
            continue;
        }
        if (!stream1)
            stream1 = it->stream_id;
        cr_assert_eq(it->stream_id, stream1, "one stream per attempt");
        if (it->kind == OB_LOGS)
            cr_assert_eq(it->batch_seq, next_logs++, "log batches in order");
        if (it->kind == OB_METRICS) {
            cr_assert_eq(it->batch_seq, 1, "metric batches are numbered apart");
            metrics_seen = true;
        }
    }
    cr_assert_eq(next_logs, 4, "2,500 lines are three log batches");
    cr_assert(metrics_seen);
    cr_assert_neq(stream1, stream2);
    pthread_mutex_unlock(&o.mu);
    ob_deinit(&o);
}

/* What an agent took in but never had stored is counted in a file that outlives it; the next
 * agent in the work dir queues a line in the job's log saying how much was lost. */
Test(outbox, a_killed_agents_lost_lines_are_reported_by_the_next)
{
    char dir[] = "/tmp/kiln-ledger.XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    const char *job = "7d1f0f6e-34a4-4d6b-9e5c-0a64e0b1c001";
    ob_t o;
    ob_init(&o, 0);
    ob_set_ledger_dir(&o, dir);
    for (int i = 0; i < 1040; i++)
        ob_add_line(&o, job, 1, 3, AGENT_STREAM_STDOUT, 1, "line", 4);
    agent_point_t pts[7];
    for (int i = 0; i < 7; i++)
        pts[i] = (agent_point_t){.name = "loss", .rank = 3, .step = i, .value = 1.0, .time_us = 1};
    ob_add_points(&o, job, 1, pts, 7);
    /* the first batch (1,000 lines) reaches kilnd; the other 40 lines and the points do not */
    pthread_mutex_lock(&o.mu);
    ob_item_t *first = ob_pop_locked(&o);
    pthread_mutex_unlock(&o.mu);
    cr_assert_eq(first->nlines, 1000);
    ob_done(&o, first, true);
    ob_item_free(first);
    /* the agent "dies": its memory goes, its ledger stays (ob_deinit only unmaps it) */
    ob_deinit(&o);

    ob_t n;
    ob_init(&n, 0);
    ob_set_ledger_dir(&n, dir);
    cr_assert_eq(ob_recover(&n), 1, "one attempt lost something");
    pthread_mutex_lock(&n.mu);
    ob_seal_due_locked(&n, true);
    cr_assert_not_null(n.head);
    cr_assert_eq(n.head->kind, OB_LOGS);
    cr_assert_str_eq(n.head->job_id, job);
    cr_assert_eq(n.head->attempt, 1);
    cr_assert_eq(n.head->lines[0].rank, 3, "the notice is a line of a rank the agent ran");
    cr_assert(strstr(n.head->lines[0].line, "40 log line(s) and 7 metric point(s) of attempt 1 were lost"), "%s",
              n.head->lines[0].line);
    pthread_mutex_unlock(&n.mu);
    ob_deinit(&n);
    /* the notice itself is in a new ledger: a second restart reports it, if it too was lost */
    ob_t m;
    ob_init(&m, 0);
    ob_set_ledger_dir(&m, dir);
    cr_assert_eq(ob_recover(&m), 1);
    ob_deinit(&m);
    cr_assert(th_rm_tree(dir), "could not remove %s", dir);
}

/* A long-lived agent keeps no stream per past attempt: one that nothing used for the idle time,
 * with nothing queued and everything it took in accounted for, goes with its ledger file; one
 * still busy, or with lines not yet sent, stays. */
Test(outbox, idle_streams_are_forgotten)
{
    char dir[] = "/tmp/kiln-ledger.XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    const char *done_job = "7d1f0f6e-34a4-4d6b-9e5c-0a64e0b1c002", *busy_job = "7d1f0f6e-34a4-4d6b-9e5c-0a64e0b1c003";
    ob_t o;
    ob_init(&o, 0);
    ob_set_ledger_dir(&o, dir);
    ob_add_line(&o, done_job, 2, 0, AGENT_STREAM_STDOUT, 1, "done", 4);
    pthread_mutex_lock(&o.mu);
    ob_seal_due_locked(&o, true);
    /* the first job's batch reaches kilnd; the second job's line is still filling a batch */
    ob_item_t *it = ob_pop_locked(&o);
    cr_assert_str_eq(it->job_id, done_job);
    pthread_mutex_unlock(&o.mu);
    ob_done(&o, it, true);
    ob_item_free(it);
    ob_add_line(&o, busy_job, 1, 0, AGENT_STREAM_STDOUT, 1, "busy", 4);
    pthread_mutex_lock(&o.mu);
    cr_assert_eq(o.nstreams, 2);
    pthread_mutex_unlock(&o.mu);
    char ledger[300];
    snprintf(ledger, sizeof ledger, "%s/jobs/%s/outbox-2.ledger", dir, done_job);
    cr_assert_eq(access(ledger, F_OK), 0, "the attempt has a ledger");

    pthread_mutex_lock(&o.mu);
    int64_t now = kiln_mono_us();
    cr_assert_eq(ob_retire_idle_locked(&o, now, 3600LL * 1000000), 0, "nothing is idle for an hour yet");
    cr_assert_eq(ob_retire_idle_locked(&o, now + 3601LL * 1000000, 3600LL * 1000000), 1, "only the idle, settled one goes");
    cr_assert_eq(o.nstreams, 1);
    cr_assert_str_eq(o.streams[0].job_id, busy_job, "the stream with a queued batch stays");
    pthread_mutex_unlock(&o.mu);
    cr_assert_neq(access(ledger, F_OK), 0, "its ledger file is removed");

    /* a report of the forgotten attempt later starts a new stream (its own numbers) */
    ob_add_line(&o, done_job, 2, 0, AGENT_STREAM_STDOUT, 1, "late", 4);
    pthread_mutex_lock(&o.mu);
    cr_assert_eq(o.nstreams, 2);
    pthread_mutex_unlock(&o.mu);
    ob_deinit(&o);
    cr_assert(th_rm_tree(dir), "could not remove %s", dir);
}

/* A batch kilnd refuses for good is not dropped silently: the job's log gets a line saying how
 * much went; a refused batch of nothing but such lines gets none (no chain of notes). */
Test(outbox, a_refused_batch_is_noted_in_the_jobs_log)
{
    const char *job = "7d1f0f6e-34a4-4d6b-9e5c-0a64e0b1c004";
    ob_t o;
    ob_init(&o, 0);
    for (int i = 0; i < 3; i++)
        ob_add_line(&o, job, 1, 2, AGENT_STREAM_STDOUT, 1, "out", 3);
    pthread_mutex_lock(&o.mu);
    ob_seal_due_locked(&o, true);
    ob_item_t *it = ob_pop_locked(&o);
    pthread_mutex_unlock(&o.mu);
    cr_assert_eq(it->nlines, 3);
    ob_done(&o, it, false);
    ob_note_refused(&o, it, "INVALID_ARGUMENT: line: not UTF-8");
    ob_item_free(it);
    pthread_mutex_lock(&o.mu);
    ob_seal_due_locked(&o, true);
    ob_item_t *note = ob_pop_locked(&o);
    pthread_mutex_unlock(&o.mu);
    cr_assert_not_null(note, "a note is queued");
    cr_assert_eq(note->nlines, 1);
    cr_assert_eq(note->lines[0].rank, 2, "a line of a rank the agent ran");
    cr_assert(strstr(note->lines[0].line, "[kiln-agent] 3 log line(s) and 0 metric point(s) of this job were "
                                          "dropped: kilnd refused them (INVALID_ARGUMENT"), "%s", note->lines[0].line);
    /* the note itself refused: nothing more */
    ob_done(&o, note, false);
    ob_note_refused(&o, note, "PERMISSION_DENIED");
    ob_item_free(note);
    cr_assert(ob_empty(&o), "no note about a refused note");
    ob_deinit(&o);
}
