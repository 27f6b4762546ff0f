/* test_outbox.c - the agent's outbox under a long kilnd outage: bounded memory, the oldest log
 * and metric batches dropped first, never the report being sent nor a rank's exit, and the job
 * told in a log line how much it lost. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent_int.h"

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
    setenv("KILN_AGENT_OUTBOX_MB", "1", 1);
    ob_t o;
    ob_init(&o);
    unsetenv("KILN_AGENT_OUTBOX_MB");
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
