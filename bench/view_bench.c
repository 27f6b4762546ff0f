/* view_bench.c - the scheduler's kept view of the waiting jobs (service/sched.c) on the CPU alone:
 * a pass's update with 8 jobs admitted from the front of N waiting (Q queues, one project), and
 * its scan for each group's first jobs beyond the window, averaged over PASSES passes.
 *   make BUILD=build build/bench/view_bench && build/bench/view_bench [N=10000] [PASSES=200] [Q=30] */
#include "service/svc_int.h"
#include "base/base.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 10000, passes = argc > 2 ? atoi(argv[2]) : 200;
    int nq = argc > 3 && atoi(argv[3]) > 0 ? atoi(argv[3]) : 30;
    store_pending_t *rows = calloc((size_t)n, sizeof(*rows));
    for (int i = 0; i < n; i++) {
        store_job_row_t *r = &rows[i].row;
        snprintf(r->id, sizeof r->id, "%08x-0000-4000-8000-%012d", (unsigned)(i * 2654435761u), i);
        snprintf(r->state, sizeof r->state, "QUEUED");
        snprintf(r->slot_type, sizeof r->slot_type, "cpu");
        snprintf(r->queue, sizeof r->queue, "q%d", i % nq);
        snprintf(r->project, sizeof r->project, "default");
        r->priority = i % 10 == 0 ? 200 : i % 3 == 0 ? 100 : 50;
        r->nodes = 1;
        r->slots_per_node = 1;
        rows[i].created_us = 1000000 + i;
        rows[i].waiting = true;
    }
    qsort(rows, (size_t)n, sizeof(*rows), store_pending_cmp);
    sched_view_t *view = NULL;
    store_job_row_t *out = NULL;
    int m = 0;
    kiln_err_t err;
    store_pending_t *copy = malloc((size_t)n * sizeof(*copy)); /* the view takes it */
    memcpy(copy, rows, (size_t)n * sizeof(*copy));
    if (svc_sched_view_update(&view, NULL, copy, n, strdup("1:1:"), false, 1000, 20000, &out, &m, &err))
        return 1;
    free(out);
    double upd = 0, heads = 0;
    int gone = 0;
    for (int p = 0; p < passes; p++) {
        /* 8 of the first jobs admitted: their rows written, no longer waiting */
        int nch = 8;
        store_pending_t *ch = calloc((size_t)nch, sizeof(*ch));
        for (int k = 0; k < nch; k++) {
            ch[k] = rows[gone++];
            ch[k].waiting = false;
            ch[k].group = 0;
        }
        double t0 = now_ms();
        if (svc_sched_view_update(&view, NULL, ch, nch, strdup("2:2:"), false, 1000, 20000, &out, &m, &err))
            return 1;
        double t1 = now_ms();
        store_job_row_t *h = NULL;
        int nh = 0;
        svc_sched_view_heads(view, m, 4, 1000, &h, &nh);
        double t2 = now_ms();
        upd += t1 - t0;
        heads += t2 - t1;
        free(h);
        free(out);
    }
    printf("view_bench: %d waiting, %d passes: update %.3f ms, heads %.3f ms a pass (sizeof row %zu)\n", n, passes,
           upd / passes, heads / passes, sizeof(store_pending_t));
    svc_sched_view_drop(&view);
    free(rows);
    return 0;
}
