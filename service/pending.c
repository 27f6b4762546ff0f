/* pending.c - a waiting job's pending reason (issue 28 item 5): sched_pending, a pure function
 * over one pass of the admission core (its snapshot and decisions, and the jobs holding slots),
 * and the scheduler's step that writes the result onto the jobs (svc_sched_pending_write, only
 * where it changed). It reads sched_admit's results and never changes how jobs are admitted. */
#include "service/svc_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The detail of an admission reason, "waiting for quota: needs ..." -> "needs ...". */
static const char *reason_detail(const char *reason)
{
    const char *colon = strncmp(reason, "waiting ", 8) == 0 ? strstr(reason, ": ") : NULL;
    return colon ? colon + 2 : reason;
}

static void add_blocking(sched_pending_t *p, const char *id)
{
    for (int k = 0; k < p->nblocking; k++)
        if (strcmp(p->blocking[k], id) == 0)
            return;
    if (p->nblocking < SCHED_PENDING_MAX_BLOCKING)
        p->blocking[p->nblocking++] = id;
}

typedef struct pend {
    const sched_snapshot_t *snap;
    const sched_running_t *run;
    int nrun;
    int *free;                 /* per worker: free slots after the pass */
    int (*usage)[SCHED_NTYPES]; /* per queue: usage after the pass */
    sched_worker_t *view;      /* the workers as one job sees them, during a simulation */
    int *sorted;               /* running jobs by predicted end, unknown last */
} pend_t;

/* A running job's place in the order of predicted ends. */
typedef struct by_end {
    double end_s;              /* < 0: unknown, sorted last */
    const char *id;
    int idx;
} by_end_t;

static int end_cmp(const void *a, const void *b)
{
    const by_end_t *x = a, *y = b;
    bool xu = x->end_s < 0, yu = y->end_s < 0;
    if (xu != yu)
        return xu ? 1 : -1;
    if (x->end_s != y->end_s)
        return x->end_s < y->end_s ? -1 : 1;
    return strcmp(x->id, y->id);
}

/* Whether job j fits the workers it may use in P->view now, and its queue's nominal quota
 * (when quota is set) with usage used. */
static bool fits_now(const pend_t *P, int j, bool quota, int used)
{
    const sched_snapshot_t *s = P->snap;
    const sched_job_t *J = &s->jobs[j];
    if (quota) {
        int nom = s->queues[J->queue].quota[J->type];
        if (nom != SCHED_UNLIMITED && used + J->nodes * J->slots_per_node > nom)
            return false;
    }
    sched_request_t req = {.nodes = J->nodes, .slots_per_node = J->slots_per_node,
                           .slot_type = sched_slot_type_name(J->type)};
    return sched_place(P->view, s->nworkers, &req, NULL);
}

static void drop_blocking(sched_pending_t *p, const char *id)
{
    for (int k = 0; k < p->nblocking; k++)
        if (strcmp(p->blocking[k], id) == 0) {
            memmove(&p->blocking[k], &p->blocking[k + 1], (size_t)(p->nblocking - k - 1) * sizeof(p->blocking[0]));
            p->nblocking--;
            return;
        }
}

/* Releases (sign 1) or takes back (-1) running job R's slots in P->view and its usage of j's
 * queue in *used. */
static void release(const pend_t *P, const bool *usable, const sched_running_t *R, const sched_job_t *J, int sign,
                    int *used)
{
    for (int n = 0; n < R->nodes && R->worker; n++) {
        int w = R->worker[n];
        if (w >= 0 && w < P->snap->nworkers && usable[w])
            P->view[w].slots_free += sign * R->slots_per_node;
    }
    if (R->queue == J->queue)
        *used -= sign * R->nodes * R->slots_per_node;
}

/* The blocked head job j (waiting for free slots or quota): releases the running jobs in the
 * order they end until j fits; the last one's end is its estimated start, and its blocking jobs
 * are those of the released it needs: each earlier one, latest end first, without which it still
 * fits is left out (another queue's job on another worker does not hold back a job waiting for its
 * own queue's quota, and of two ends that free the same slots the first is named). */
static void simulate(const pend_t *P, int j, const sched_decision_t *d, sched_pending_t *out)
{
    const sched_snapshot_t *s = P->snap;
    const sched_job_t *J = &s->jobs[j];
    bool quota = d->outcome == SCHED_WAIT_QUOTA;
    int used = P->usage[J->queue][J->type];
    bool *usable = calloc((size_t)KILN_MAX(s->nworkers, 1), sizeof(*usable));
    int *rel = calloc((size_t)KILN_MAX(P->nrun, 1), sizeof(*rel)), nrel = 0;
    if (!usable || !rel) {
        free(usable);
        free(rel);
        return;
    }
    for (int i = 0; i < s->nworkers; i++) {
        P->view[i] = s->workers[i];
        P->view[i].slots_free = P->free[i];
        usable[i] = !s->eligible || s->eligible(s->ctx, j, i);
        if (!usable[i])
            P->view[i].slots = P->view[i].slots_free = 0;
    }
    /* Fitting already means it waits for something no end of a job frees (another queue's head
     * goes first, or its cohort keeps the slots for a job within quota): no estimate. */
    bool fit = fits_now(P, j, quota, used);
    for (int k = 0; k < P->nrun && !fit; k++) {
        const sched_running_t *R = &P->run[P->sorted[k]];
        if (R->type != J->type)
            continue;
        bool relevant = quota && R->queue == J->queue;
        for (int n = 0; n < R->nodes && R->worker && !relevant; n++) {
            int w = R->worker[n];
            relevant = w >= 0 && w < s->nworkers && usable[w];
        }
        if (!relevant)
            continue;
        release(P, usable, R, J, 1, &used);
        rel[nrel++] = P->sorted[k];
        add_blocking(out, R->id);
        if (R->end_s < 0) {
            /* its end is unknown, so is everything after it: no estimate, but when its end is
             * all that is missing, the ones released before it may still be more than it needs */
            fit = fits_now(P, j, quota, used);
            break;
        }
        if (fits_now(P, j, quota, used)) {
            out->start_s = KILN_MAX(R->end_s - s->now_s, 0);
            fit = true;
        }
    }
    /* the last released is needed (it did not fit without it); of the others, latest end first */
    for (int k = nrel - 2; fit && k >= 0; k--) {
        const sched_running_t *R = &P->run[rel[k]];
        release(P, usable, R, J, -1, &used);
        if (fits_now(P, j, quota, used))
            drop_blocking(out, R->id);
        else
            release(P, usable, R, J, 1, &used);
    }
    free(usable);
    free(rel);
}

int sched_pending(const sched_snapshot_t *s, const sched_decision_t *dec, const sched_running_t *running,
                  int nrunning, sched_pending_t *out)
{
    pend_t P = {.snap = s, .run = running, .nrun = nrunning};
    int *pos = calloc((size_t)KILN_MAX(s->nqueues, 1) + 1, sizeof(*pos));
    P.free = calloc((size_t)KILN_MAX(s->nworkers, 1), sizeof(*P.free));
    P.usage = calloc((size_t)KILN_MAX(s->nqueues, 1), sizeof(*P.usage));
    P.view = calloc((size_t)KILN_MAX(s->nworkers, 1), sizeof(*P.view));
    P.sorted = calloc((size_t)KILN_MAX(nrunning, 1), sizeof(*P.sorted));
    int rc = 0;
    if (!pos || !P.free || !P.usage || !P.view || !P.sorted) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (int i = 0; i < s->nworkers; i++)
        P.free[i] = s->workers[i].slots_free;
    for (int q = 0; q < s->nqueues; q++)
        for (int t = 0; t < SCHED_NTYPES; t++)
            P.usage[q][t] = s->queues[q].usage[t];
    for (int j = 0; j < s->njobs; j++) {
        const sched_job_t *J = &s->jobs[j];
        memset(&out[j], 0, sizeof(out[j]));
        out[j].start_s = -1;
        if (dec[j].outcome != SCHED_ADMITTED)
            continue;
        for (int k = 0; k < dec[j].pl.nodes; k++)
            P.free[dec[j].pl.worker[k]] -= J->slots_per_node;
        P.usage[J->queue][J->type] += J->nodes * J->slots_per_node;
    }
    by_end_t *order = calloc((size_t)KILN_MAX(nrunning, 1), sizeof(*order));
    if (!order) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (int k = 0; k < nrunning; k++)
        order[k] = (by_end_t){.end_s = running[k].end_s, .id = running[k].id, .idx = k};
    qsort(order, (size_t)nrunning, sizeof(*order), end_cmp);
    for (int k = 0; k < nrunning; k++)
        P.sorted[k] = order[k].idx;
    free(order);

    /* The blocked heads first: the jobs behind them name what they wait for. */
    for (int j = 0; j < s->njobs; j++) {
        const sched_job_t *J = &s->jobs[j];
        sched_pending_t *p = &out[j];
        if (dec[j].outcome == SCHED_ADMITTED)
            continue;
        bool known = J->queue >= 0 && J->queue < s->nqueues;
        p->position = ++pos[known ? J->queue + 1 : 0];
        if (dec[j].outcome == SCHED_WAIT_BEHIND)
            continue;
        const char *detail = reason_detail(dec[j].reason);
        if (dec[j].outcome == SCHED_WAIT_SLOTS) {
            int have = 0;
            for (int i = 0; i < s->nworkers; i++)
                if (P.free[i] >= J->slots_per_node && sched_slot_type(s->workers[i].slot_type) == J->type
                    && (!s->eligible || s->eligible(s->ctx, j, i)))
                    have++;
            snprintf(p->missing, sizeof p->missing, "%s; %d such worker(s) have them free now", detail, have);
        } else if (dec[j].outcome == SCHED_WAIT_QUOTA && strncmp(detail, "needs ", 6) == 0 && strstr(detail, "; ")) {
            /* "needs 2 cpu slot(s); queue nlp: ..." says the gang's shape too */
            snprintf(p->missing, sizeof p->missing, "needs %d %s slot(s) on %d worker(s); %s",
                     J->nodes * J->slots_per_node, sched_slot_type_name(J->type), J->nodes, strstr(detail, "; ") + 2);
        } else {
            snprintf(p->missing, sizeof p->missing, "%s", detail);
        }
        /* waiting while jobs preempted for it stop: those are what it waits for */
        for (int k = 0; dec[j].outcome == SCHED_PREEMPTING && k < dec[j].nvictims; k++)
            if (dec[j].victims[k] >= 0 && dec[j].victims[k] < s->nrunning)
                add_blocking(p, s->running[dec[j].victims[k]].id);
        if (known && (dec[j].outcome == SCHED_WAIT_SLOTS || dec[j].outcome == SCHED_WAIT_QUOTA))
            simulate(&P, j, &dec[j], p);
    }
    for (int j = 0; j < s->njobs; j++) {
        const sched_job_t *J = &s->jobs[j];
        sched_pending_t *p = &out[j];
        if (dec[j].outcome != SCHED_WAIT_BEHIND)
            continue;
        /* the head it waits behind: the one job of its queue and slot type that blocks them */
        int head = -1;
        for (int h = 0; h < s->njobs && head < 0; h++)
            if (s->jobs[h].queue == J->queue && s->jobs[h].type == J->type
                && (dec[h].outcome == SCHED_WAIT_SLOTS || dec[h].outcome == SCHED_WAIT_QUOTA
                    || dec[h].outcome == SCHED_PREEMPTING))
                head = h;
        if (head < 0) {
            snprintf(p->missing, sizeof p->missing, "%s", reason_detail(dec[j].reason));
            continue;
        }
        char text[sizeof p->missing], name[SCHED_JOB_NAME_LEN]; /* head != j, but the compiler cannot know it */
        snprintf(text, sizeof text, "its turn: %s is ahead of it in queue %s and waits (%.250s)",
                 sched_job_name(J->project_name, s->jobs[head].id, s->jobs[head].project_name, name, sizeof name),
                 s->queues[J->queue].name, out[head].missing);
        memcpy(p->missing, text, sizeof text);
        /* backfill starts it ahead of the head only by its run time: say when that is an estimate */
        size_t ml = strlen(p->missing);
        if (J->runtime_estimate && J->runtime_s >= 0 && ml < sizeof p->missing)
            snprintf(p->missing + ml, sizeof p->missing - ml, "; its run time, %.0f s, is %s", J->runtime_s,
                     J->runtime_estimate);
        add_blocking(p, s->jobs[head].id);
        for (int k = 0; k < out[head].nblocking; k++)
            add_blocking(p, out[head].blocking[k]);
    }
out:
    free(pos);
    free(P.free);
    free(P.usage);
    free(P.view);
    free(P.sorted);
    return rc;
}

/* ---- the scheduler's step ------------------------------------------------------------------ */

/* The pending object of p as compact JSON text (caller frees). now_us: the pass's wall clock. */
static char *pending_text(const sched_pending_t *p, int64_t now_us)
{
    json_t *o = json_pack("{s:i, s:s, s:[]}", "position", p->position, "missing", p->missing, "blocking_jobs");
    if (!o)
        return NULL;
    for (int k = 0; k < p->nblocking; k++)
        json_array_append_new(json_object_get(o, "blocking_jobs"), json_string(p->blocking[k]));
    if (p->start_s >= 0 && p->start_s < 1e9) {
        /* to the next 10 s: a person reads minutes, and the row changes only when that does */
        int64_t at = now_us + (int64_t)ceil(p->start_s * 1e6);
        at = (at + 9999999) / 10000000 * 10000000;
        char buf[40];
        json_object_set_new(o, "estimated_start", json_string(kiln_time_format(at, buf, sizeof buf)));
    }
    char *text = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(o);
    return text;
}

/* The project of job id, of the pass's snapshot (its waiting jobs, and the jobs holding slots);
 * NULL when it holds neither. */
/* The snapshot's jobs' ids, waiting then holding slots, indexed for job_project. */
typedef struct snap_ids {
    const char **ids;
    kiln_names_t index;
} snap_ids_t;

static bool snap_ids_init(snap_ids_t *x, const sched_snapshot_t *snap)
{
    int n = snap->njobs + snap->nrunning;
    if (!(x->ids = calloc((size_t)KILN_MAX(n, 1), sizeof(*x->ids))))
        return false;
    for (int k = 0; k < n; k++) {
        const char *id = k < snap->njobs ? snap->jobs[k].id : snap->running[k - snap->njobs].id;
        x->ids[k] = id ? id : "";
    }
    if (!kiln_names_init(&x->index, x->ids, 1, n)) {
        free(x->ids);
        return false;
    }
    kiln_names_add_all(&x->index, n);
    return true;
}

static void snap_ids_free(snap_ids_t *x)
{
    kiln_names_free(&x->index);
    free(x->ids);
}

/* The project of job id of the snapshot, or NULL. */
static const char *job_project(const sched_snapshot_t *snap, const snap_ids_t *x, const char *id)
{
    int k = kiln_names_find(&x->index, &id, NULL);
    return k < 0 ? NULL : k < snap->njobs ? snap->jobs[k].project_name : snap->running[k - snap->njobs].project_name;
}

/* What job j's pending reason says of the jobs of other projects, which its readers cannot see
 * (DESIGN.md: what a caller cannot see does not exist for it): their ids leave blocking_jobs, and
 * "job <id>" in the text is named as sched_job_name names it ("a job of another project"), the
 * text of a job it waits behind included (written for that job's project). The rest (position,
 * estimated start) counts them without naming them. */
static void pending_redact(sched_pending_t *p, const char *project, const sched_snapshot_t *snap,
                           const snap_ids_t *x)
{
    int keep = 0;
    for (int k = 0; k < p->nblocking; k++) {
        const char *other = job_project(snap, x, p->blocking[k]);
        if (other && !strcmp(other, project))
            p->blocking[keep++] = p->blocking[k];
    }
    p->nblocking = keep;
    char out[sizeof p->missing];
    size_t o = 0;
    for (const char *t = p->missing; *t && o + 1 < sizeof out;) {
        char id[STORE_ID_LEN], name[SCHED_JOB_NAME_LEN];
        if (!strncmp(t, "job ", 4) && strlen(t + 4) >= 36) {
            memcpy(id, t + 4, 36);
            id[36] = '\0';
            if (store_is_uuid(id)) {
                o += (size_t)snprintf(out + o, sizeof out - o, "%s",
                                      sched_job_name(project, id, job_project(snap, x, id), name, sizeof name));
                o = KILN_MIN(o, sizeof out - 1);
                t += 4 + 36;
                continue;
            }
        }
        out[o++] = *t++;
    }
    out[o] = '\0';
    memcpy(p->missing, out, sizeof out);
}

int svc_sched_pending_write(store_conn_t *c, const sched_snapshot_t *snap, const sched_decision_t *dec,
                            const store_job_row_t *jobs, kiln_err_t *err)
{
    int nwait = 0;
    for (int j = 0; j < snap->njobs; j++)
        nwait += dec[j].outcome != SCHED_ADMITTED;
    if (nwait == 0)
        return 0;
    /* The jobs holding slots after the pass: the snapshot's, and those the pass admitted, where it
     * placed them and to end when it predicted (what the admission core assumed of them). */
    int nrun = snap->nrunning + (snap->njobs - nwait), nw = 0, rc = 0;
    sched_running_t *r = calloc((size_t)KILN_MAX(nrun, 1), sizeof(*r));
    sched_pending_t *pend = calloc((size_t)snap->njobs, sizeof(*pend));
    const char **ids = calloc((size_t)nwait, sizeof(*ids));
    char **texts = calloc((size_t)nwait, sizeof(*texts));
    snap_ids_t sids = {0};
    if (!r || !pend || !ids || !texts || !snap_ids_init(&sids, snap)) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto out;
    }
    if (snap->nrunning > 0)
        memcpy(r, snap->running, (size_t)snap->nrunning * sizeof(*r));
    nrun = snap->nrunning;
    for (int j = 0; j < snap->njobs; j++) {
        const sched_job_t *J = &snap->jobs[j];
        if (dec[j].outcome == SCHED_ADMITTED)
            r[nrun++] = (sched_running_t){.id = J->id, .queue = J->queue, .type = J->type, .priority = J->priority,
                                          .nodes = dec[j].pl.nodes, .slots_per_node = J->slots_per_node,
                                          .worker = dec[j].pl.worker,
                                          .end_s = J->runtime_s < 0 ? -1 : snap->now_s + J->runtime_s,
                                          .project_name = J->project_name};
    }
    rc = sched_pending(snap, dec, r, nrun, pend);
    if (rc) {
        kiln_err_set(err, rc, NULL, "out of memory");
        goto out;
    }
    int64_t now = kiln_now_us();
    for (int j = 0; j < snap->njobs; j++) {
        if (dec[j].outcome == SCHED_ADMITTED)
            continue;
        ids[nw] = jobs[j].id;
        pending_redact(&pend[j], jobs[j].project, snap, &sids);
        texts[nw] = pending_text(&pend[j], now);
        if (!texts[nw]) {
            rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
            goto out;
        }
        nw++;
    }
    rc = store_job_pending_set(c, ids, (const char *const *)texts, nw, err);
out:
    for (int k = 0; texts && k < nw; k++)
        free(texts[k]);
    free(texts);
    free(ids);
    free(pend);
    free(r);
    snap_ids_free(&sids);
    return rc;
}

void sched_admission_text(const sched_snapshot_t *s, int j, const sched_decision_t *d, const int *usage,
                          char *out, size_t n)
{
    const sched_job_t *J = &s->jobs[j];
    if (J->queue < 0 || J->queue >= s->nqueues) {
        snprintf(out, n, "admitted");
        return;
    }
    const sched_queue_t *Q = &s->queues[J->queue];
    const char *tn = sched_slot_type_name(J->type);
    int size = J->nodes * J->slots_per_node, nom = Q->quota[J->type];
    int after = (usage ? usage[J->type] : Q->usage[J->type]) + size;
    if (nom == SCHED_UNLIMITED)
        snprintf(out, n, "admitted from queue %s (no quota limit)", Q->name);
    else if (d->borrowed)
        snprintf(out, n, "admitted from queue %s borrowing %d %s slot(s) from cohort %s (quota %d, in use %d with "
                 "this job)", Q->name, KILN_MIN(size, after - nom), tn, Q->cohort ? Q->cohort : "", nom, after);
    else
        snprintf(out, n, "admitted from queue %s within its quota (quota %d %s, in use %d with this job)", Q->name,
                 nom, tn, after);
}
