/* sched.c - the scheduler: a thread woken by submissions, exits and registrations (and a tick)
 * that, on the leader kilnd only (notify.c), reads a snapshot of the workers, the queues and the
 * pending jobs, lets the admission core (admit.c, sched_admit: quotas, borrowing, DRF between
 * queues, fair sharing between projects, gangs whole) decide, and commits each admitted job's
 * placement (sched_place: best fit, never partial), writing its assignments and the others'
 * reasons.
 *
 * Head of line: within a queue, a job that fits the cluster but not its free slots or its quota
 * right now blocks the jobs behind it that want the same slot type, so a big job is never starved
 * by a stream of small ones; they start before it only by backfill, when predicted to end before
 * it could start or in slots it leaves free when it starts. A queued job that no longer fits the
 * cluster at all (workers left after it was accepted) blocks nothing and waits for workers. The jobs the core chooses to preempt get their
 * stop orders here (svc_job_preempt). */
#include "service/svc_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct cand {
    int idx, free;
} cand_t;

static int cand_cmp(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->free != y->free)
        return x->free < y->free ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static bool place(const sched_worker_t *w, int n, const sched_request_t *req, bool use_total,
                  sched_placement_t *out)
{
    if (out)
        out->nodes = 0;
    if (!req || req->nodes < 1 || req->slots_per_node < 1 || req->nodes > SCHED_MAX_NODES || n <= 0)
        return false;
    cand_t *c = calloc((size_t)n, sizeof(*c));
    if (!c)
        return false;
    int nc = 0;
    for (int i = 0; i < n; i++) {
        int free_slots = use_total ? w[i].slots : w[i].slots_free;
        if (w[i].slot_type && req->slot_type && strcmp(w[i].slot_type, req->slot_type) != 0)
            continue;
        if (free_slots < req->slots_per_node)
            continue;
        c[nc].idx = i;
        c[nc].free = free_slots;
        nc++;
    }
    bool ok = nc >= req->nodes;
    if (ok && out) {
        qsort(c, (size_t)nc, sizeof(*c), cand_cmp);
        out->nodes = req->nodes;
        for (int k = 0; k < req->nodes; k++)
            out->worker[k] = c[k].idx;
    }
    free(c);
    return ok;
}

bool sched_place(const sched_worker_t *workers, int n, const sched_request_t *req,
                 sched_placement_t *out)
{
    return place(workers, n, req, false, out);
}

bool sched_fits(const sched_worker_t *workers, int n, const sched_request_t *req)
{
    return place(workers, n, req, true, NULL);
}

/* Places one job on the chosen workers inside tx (the pass's one transaction), *locked being its
 * row as locked in tx and pending as the pass read it; backfill (NULL when not) says ahead of which
 * job it was backfilled, its predicted run time, and whether it ends after that job could start
 * (in slots that job leaves free). Returns 0, or an error: KILN_ESTATE (harmless: the job changed
 * state meanwhile, nothing was written) or any other (the transaction is then unusable). */
typedef struct backfill_note {
    const char *head;          /* the head, as sched_job_name names it to the job's project */
    double runtime_s;
    bool beside;
    const char *estimate;      /* NULL, or how runtime_s was estimated */
} backfill_note_t;

/* How a run time from source was estimated, for reasons; NULL when it is a prediction proper. */
static const char *sched_estimate_text(store_predict_t source)
{
    switch (source) {
    case STORE_PREDICT_MODEL:
        return "an estimate from the step time of its model at other resources (nothing of its model has run at "
               "its resources yet)";
    case STORE_PREDICT_DEFAULT:
        return "an estimate: the scheduler's default run time (--sched-default-runtime-s), as nothing of its model "
               "has run yet";
    default:
        return NULL;
    }
}

/* A pass's admissions as they are written: every admitted job's move to SCHEDULED and every
 * assignment of theirs, each kind in one statement (sched_admit_write). */
typedef struct admit_batch {
    store_transition_t *tr;   /* one per job */
    char (*reason)[1600];     /* tr[k].reason's text */
    int ntr;
    store_assign_t *asg;
    int nasg;
} admit_batch_t;

/* Adds to b the placement of one job on the chosen workers, *locked being its row as locked in
 * the pass's transaction and pending as the pass read it; backfill (NULL when not) says ahead of
 * which job it was backfilled, its predicted run time, and whether it ends after that job could
 * start (in slots that job leaves free). b has room for it. Returns 0, or KILN_ESTATE (harmless:
 * the job changed state meanwhile, nothing of it is added). */
static int sched_batch_add(admit_batch_t *b, const store_job_row_t *pending, const store_job_row_t *locked,
                           const store_worker_cap_t *cap, const sched_placement_t *pl, const char *admission,
                           const backfill_note_t *backfill, kiln_err_t *err)
{
    const store_job_row_t *job = locked;
    svc_job_state_t st = svc_state_parse(job->state);
    if ((st != JOB_STATE_QUEUED && st != JOB_STATE_RESTARTING && st != JOB_STATE_PREEMPTED)
        || job->attempt != pending->attempt)
        return kiln_err_set(err, KILN_ESTATE, NULL, "job %s changed while being placed", job->id);
    int attempt = job->attempt + 1;
    const store_worker_cap_t *w0 = &cap[pl->worker[0]];
    char where[512];
    size_t wl = 0;
    where[0] = '\0';
    int k = b->ntr;
    for (int n = 0; n < pl->nodes; n++) {
        const store_worker_cap_t *w = &cap[pl->worker[n]];
        store_assign_t *a = &b->asg[b->nasg++];
        memset(a, 0, sizeof(*a));
        kiln_strlcpy(a->job_id, job->id, sizeof(a->job_id));
        a->attempt = attempt;
        kiln_strlcpy(a->worker_id, w->id, sizeof(a->worker_id));
        a->node_rank = n;
        a->nodes = pl->nodes;
        a->world_size = job->world_size;
        a->nranks = KILN_MIN(job->slots_per_node, (int)KILN_ARRAY_LEN(a->ranks));
        for (int r = 0; r < a->nranks; r++)
            a->ranks[r] = n * job->slots_per_node + r;
        kiln_strlcpy(a->master_addr, w0->address[0] ? w0->address : w0->hostname, sizeof(a->master_addr));
        /* The agent of node 0 picks a port free on its host and reports it; the other nodes'
         * assignments wait for it (store_assign_undelivered). */
        a->master_port = 0;
        if (wl + 80 < sizeof(where))
            wl += (size_t)snprintf(where + wl, sizeof(where) - wl, "%s%s", n ? ", " : "", w->id);
    }
    char *reason = b->reason[k];
    size_t cap_r = sizeof(b->reason[k]);
    int rl = snprintf(reason, cap_r, "%s; placed %d rank(s) on %d worker(s): %s", admission, job->world_size,
                      pl->nodes, where);
    if (st == JOB_STATE_PREEMPTED && rl > 0 && (size_t)rl < cap_r)
        rl += snprintf(reason + rl, cap_r - (size_t)rl, "; resumes from its checkpoint after preemption");
    if (backfill && rl > 0 && (size_t)rl < cap_r)
        snprintf(reason + rl, cap_r - (size_t)rl, "; backfilled ahead of %s: predicted to end in "
                 "%.0f s%s%s%s, %s", backfill->head, backfill->runtime_s, backfill->estimate ? " (" : "",
                 backfill->estimate ? backfill->estimate : "", backfill->estimate ? ")" : "",
                 backfill->beside ? "on slots that job leaves free when it can start" : "before that job can start");
    b->tr[k] = (store_transition_t){.id = job->id, .from = job->state, .reason = reason, .attempt = attempt,
                                    .backfill_s = backfill ? KILN_MAX(backfill->runtime_s, 0.0) : -1};
    b->ntr++;
    return 0;
}

/* Writes b's admissions inside tx (the pass's one transaction): every assignment, then the jobs'
 * moves to SCHEDULED with their events (svc_jobs_set_state: one statement, and one nudge for all
 * their agents, heard when tx commits). The jobs' rows are locked in tx and were checked in their
 * states, so each moves; one that does not is an error. An error leaves tx unusable. */
static int sched_admit_write(svc_tx_t *tx, admit_batch_t *b, kiln_err_t *err)
{
    int rc = store_assign_insert_many(tx->c, b->asg, b->nasg, err);
    if (rc == 0)
        rc = svc_jobs_set_state(tx, b->tr, b->ntr, JOB_STATE_SCHEDULED, STORE_TR_NEW_ATTEMPT, err);
    for (int k = 0; rc == 0 && k < b->ntr; k++)
        if (!b->tr[k].done)
            rc = kiln_err_set(err, KILN_ESTATE, NULL, "job %s changed state while locked by the pass", b->tr[k].id);
    return rc;
}

/* Preempts running job victim (as read into the snapshot) for job `by` of project by_project,
 * inside tx (the pass's one transaction). KILN_ESTATE (harmless, nothing written) when it moved on
 * meanwhile; any other error leaves the transaction unusable. */
static int sched_preempt(svc_tx_t *tx, const store_holding_t *victim, const char *by, const char *by_project,
                         const char *why, kiln_err_t *err)
{
    store_job_row_t job;
    int rc = store_job_row(tx->c, victim->id, true, &job, err);
    if (rc == 0 && (svc_state_parse(job.state) != JOB_STATE_RUNNING || job.attempt != victim->attempt))
        rc = kiln_err_set(err, KILN_ESTATE, NULL, "job %s changed while being preempted", job.id);
    if (rc == 0)
        rc = svc_job_preempt(tx, &job, by, by_project, why, err);
    return rc;
}

/* Whether the pass's decisions preempt any job. */
static bool pass_preempts(const sched_decision_t *dec, int n)
{
    for (int j = 0; j < n; j++)
        if (dec[j].outcome == SCHED_PREEMPTING && dec[j].nvictims > 0)
            return true;
    return false;
}

/* The most waiting jobs the scheduler's view of the queue keeps (in the queue's order); when more
 * wait, it is read whole again once fewer than a pass reads remain of it. */
#define SCHED_VIEW_KEEP 20000

/* The waiting jobs a pass over the whole queue reads, in the queue's order (priority, then age);
 * and, of each queue, project and slot type with none among them, its first SCHED_GROUP_HEADS
 * (at most SCHED_WINDOW of these: svc_sched_view_heads). */
#define SCHED_WINDOW 1000
#define SCHED_GROUP_HEADS 4

/* Up to this many jobs read, every pass writes their pending reasons; beyond, one pass a second. */
#define SCHED_REASONS_EVERY_PASS 100

/* The seconds a job takes to start (processes, data) beyond its predicted steps: a backfilled
 * job's prediction includes it. */
#define SCHED_START_ALLOWANCE_S 3.0

/* What the eligibility callback of the admission core reads: the workers and each pending job's
 * data paths (a JSON array). */
typedef struct paths_ctx {
    const store_worker_cap_t *cap;
    json_t **paths;
} paths_ctx_t;

/* Whether worker w's data roots hold every path job j reads. */
static bool holds_paths(void *ctx, int j, int w)
{
    const paths_ctx_t *p = ctx;
    size_t k;
    json_t *path;
    json_array_foreach(p->paths[j], k, path)
        if (!svc_worker_holds(&p->cap[w], json_string_value(path) ? json_string_value(path) : ""))
            return false;
    return true;
}

/* A hash of s (with its NUL, so that consecutive strings hash apart), continuing from h. */
static uint64_t str_hash(uint64_t h, const char *s)
{
    return kiln_fnv1a(h, s, strlen(s) + 1);
}

/* The index of the (queue, project) pair in the index's names (its project usage slot), added
 * (into names, which has room) when new. */
static int project_slot(kiln_names_t *x, const char *(*names)[2], const char *queue, const char *project)
{
    const char *key[2] = {queue, project};
    size_t at;
    int i = kiln_names_find(x, key, &at);
    if (i >= 0)
        return i;
    names[x->n][0] = queue;
    names[x->n][1] = project;
    x->slot[at] = x->n;
    return x->n++;
}

/* What a pass read of a pending job that the next passes need not read again: its data paths
 * (a job's spec never changes) and its predicted run time (which changes only as jobs like it
 * run: read again after SCHED_PREDICT_TTL_US, at most SCHED_PREDICT_REFRESH a pass). The
 * scheduler thread's, in no order (a pass indexes them by id). */
#define SCHED_PREDICT_TTL_US 5000000
#define SCHED_PREDICT_REFRESH 100
typedef struct sched_known {
    char id[STORE_ID_LEN];
    json_t *paths;             /* owned; NULL: not read yet */
    double runtime_s;
    store_predict_t source;    /* where runtime_s comes from */
    int64_t runtime_at_us;     /* 0: not read yet */
} sched_known_t;

/* Forgets the facts kept of the last pass's jobs. */
static void sched_known_clear(svc_t *s)
{
    for (int i = 0; i < s->nknown; i++)
        json_decref(s->known[i].paths);
    free(s->known);
    s->known = NULL;
    s->nknown = 0;
}

void svc_sched_known_free(svc_t *s)
{
    svc_sched_view_drop(&s->view);
    sched_known_clear(s);
}

/* The waiting jobs a pass reads, kept between passes. Invariant: rows[0..n) are, in
 * store_pending_cmp's order, exactly the jobs waiting in snapshot snap that sort no later than
 * bound (all of them when complete). A row unchanged since snap reads the same now (the columns
 * are migration 0023's trigger list), so bringing it up to date needs only the rows written by
 * transactions snap did not see. Each row is allocated alone and idh[i] is a hash of rows[i]'s
 * id, so that a pass that changes a few of 10,000 rows (3.4 MB) moves pointers and reads hashes. */
struct sched_view {
    store_pending_t **rows;
    uint64_t *idh;
    int n;
    char *snap;             /* pg_current_snapshot() of the reads it holds */
    bool complete;          /* every waiting job is among rows */
    store_pending_t bound;  /* when not complete: the last row of the full read */
    bool was_full;          /* the last read was a full one */
    /* the groups its rows have been found in (a row's store_pending_t.group is its number there,
     * from 1; 0: not looked up yet): the (queue, project, slot type) of each, indexed */
    const char **gnames;    /* room for gmost groups' three names */
    int ngroups, gmost;
    kiln_names_t gidx;
};

static void view_groups_clear(sched_view_t *v);

void svc_sched_view_drop(sched_view_t **view)
{
    if (!*view)
        return;
    view_groups_clear(*view);
    for (int i = 0; i < (*view)->n; i++)
        free((*view)->rows[i]);
    free((*view)->rows);
    free((*view)->idh);
    free((*view)->snap);
    free(*view);
    *view = NULL;
}

bool svc_sched_view_was_full(const sched_view_t *view)
{
    return view && view->was_full;
}

static int pending_ptr_cmp(const void *a, const void *b)
{
    return store_pending_cmp(*(store_pending_t *const *)a, *(store_pending_t *const *)b);
}

/* Where p goes among v's rows: the first row that sorts after it. */
static int view_place(const sched_view_t *v, const store_pending_t *p)
{
    int lo = 0, hi = v->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (store_pending_cmp(v->rows[mid], p) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* A copy of p, allocated alone, into rows[i] with its id's hash into idh[i] (false: out of memory). */
static bool view_row_set(store_pending_t **rows, uint64_t *idh, int i, const store_pending_t *p)
{
    if (!(rows[i] = malloc(sizeof(*rows[i]))))
        return false;
    *rows[i] = *p;
    idh[i] = str_hash(KILN_FNV1A_START, p->row.id);
    return true;
}

/* Brings v up to date with ch[0..nch) (every job written since v->snap, as snapshot snap sees
 * it). Takes snap. Returns 0, or KILN_ENOMEM (v unchanged). */
static int view_apply(sched_view_t *v, store_pending_t *ch, int nch, char *snap)
{
    /* the changed jobs' ids, hashed (a table at most half full), and their rows that belong in
     * the view, in its order */
    size_t cap = 16;
    while (cap < 2 * (size_t)nch)
        cap *= 2;
    int *slot = malloc(cap * sizeof(*slot));
    uint64_t *slot_h = malloc(cap * sizeof(*slot_h));
    store_pending_t **add = malloc((size_t)KILN_MAX(nch, 1) * sizeof(*add));
    uint64_t *add_h = malloc((size_t)KILN_MAX(nch, 1) * sizeof(*add_h));
    int *at = malloc((size_t)KILN_MAX(nch, 1) * sizeof(*at));
    store_pending_t **rows = malloc((size_t)KILN_MAX(v->n + nch, 1) * sizeof(*rows));
    uint64_t *idh = malloc((size_t)KILN_MAX(v->n + nch, 1) * sizeof(*idh));
    int nadd = 0;
    bool ok = slot && slot_h && add && add_h && at && rows && idh;
    for (size_t k = 0; ok && k < cap; k++)
        slot[k] = -1;
    for (int i = 0; ok && i < nch; i++) {
        uint64_t h = str_hash(KILN_FNV1A_START, ch[i].row.id);
        size_t k = h & (cap - 1);
        while (slot[k] >= 0)
            k = (k + 1) & (cap - 1);
        slot[k] = i;
        slot_h[k] = h;
        if (ch[i].waiting && (v->complete || store_pending_cmp(&ch[i], &v->bound) <= 0))
            ok = view_row_set(add, add_h, nadd++, &ch[i]);
    }
    if (ok) {
        /* in the view's order (add_h follows: a hash is read again only for the few added) */
        qsort(add, (size_t)nadd, sizeof(*add), pending_ptr_cmp);
        for (int a = 0; a < nadd; a++) { /* each one's place, before any old row is freed below */
            add_h[a] = str_hash(KILN_FNV1A_START, add[a]->row.id);
            at[a] = view_place(v, add[a]);
        }
        /* the unchanged rows (in order already) with those, each added before the first old row
         * that sorts after it; a row written since is dropped (its new version, if it still
         * belongs, is among add) */
        int n = 0, a = 0;
        for (int i = 0; i <= v->n; i++) {
            for (; a < nadd && at[a] <= i; a++) {
                rows[n] = add[a];
                idh[n++] = add_h[a];
            }
            if (i == v->n)
                break;
            bool written = false;
            for (size_t k = v->idh[i] & (cap - 1); slot[k] >= 0 && !written; k = (k + 1) & (cap - 1))
                written = slot_h[k] == v->idh[i] && !strcmp(ch[slot[k]].row.id, v->rows[i]->row.id);
            if (written) {
                free(v->rows[i]);
                continue;
            }
            rows[n] = v->rows[i];
            idh[n++] = v->idh[i];
        }
        free(v->rows);
        free(v->idh);
        free(v->snap);
        v->rows = rows;
        v->idh = idh;
        v->n = n;
        v->snap = snap;
    } else {
        for (int a = 0; add && a < nadd; a++)
            free(add[a]);
        free(rows);
        free(idh);
    }
    free(slot);
    free(slot_h);
    free(add);
    free(add_h);
    free(at);
    return ok ? 0 : KILN_ENOMEM;
}

const char *svc_sched_view_since(const sched_view_t *view)
{
    return view ? view->snap : NULL;
}

int svc_sched_view_update(sched_view_t **view, store_conn_t *c, store_pending_t *rows, int nrows, char *snap,
                          bool forget, int limit, int keep, store_job_row_t **out, int *n, kiln_err_t *err)
{
    *out = NULL;
    *n = 0;
    sched_view_t *v = *view;
    bool fresh = false;
    if (v) { /* rows are the changes since its snapshot */
        if (!forget && view_apply(v, rows, nrows, snap) == 0)
            snap = NULL; /* taken */
        else
            svc_sched_view_drop(view); /* jobs were deleted, or out of memory: read it whole */
        free(rows);
        free(snap);
        rows = NULL;
        snap = NULL;
        /* a bounded view that runs short of what the pass reads: read it whole again */
        if (*view && !v->complete && v->n < limit)
            svc_sched_view_drop(view);
    }
    if (!*view) {
        if (!(v = calloc(1, sizeof(*v)))) {
            free(rows);
            free(snap);
            return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        }
        if (!snap) { /* rows, the first keep waiting jobs, are read here */
            int rc = store_job_pending_all(c, keep, &rows, &nrows, &snap, err);
            if (rc) {
                free(v);
                return rc;
            }
        }
        v->snap = snap;
        v->rows = malloc((size_t)KILN_MAX(nrows, 1) * sizeof(*v->rows));
        v->idh = malloc((size_t)KILN_MAX(nrows, 1) * sizeof(*v->idh));
        for (int i = 0; v->rows && v->idh && i < nrows && view_row_set(v->rows, v->idh, i, &rows[i]); i++)
            v->n = i + 1;
        free(rows);
        if (v->n < nrows) {
            svc_sched_view_drop(&v);
            return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        }
        v->complete = v->n < keep;
        if (v->n > 0)
            v->bound = *v->rows[v->n - 1];
        *view = v;
        fresh = true;
    }
    v->was_full = fresh;
    int m = KILN_MIN(limit, v->n);
    if (m > 0) {
        if (!(*out = malloc((size_t)m * sizeof(**out)))) {
            svc_sched_view_drop(view);
            return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        }
        for (int i = 0; i < m; i++)
            (*out)[i] = v->rows[i]->row;
    }
    *n = m;
    return 0;
}

int svc_sched_view_read(sched_view_t **view, store_conn_t *c, int limit, int keep, store_job_row_t **out, int *n,
                        kiln_err_t *err)
{
    store_pending_t *rows = NULL;
    int nrows = 0;
    char *snap = NULL;
    bool forget = false;
    const char *since = svc_sched_view_since(*view);
    int rc = since ? store_job_pending_changes(c, since, &rows, &nrows, &snap, &forget, err)
                   : store_job_pending_all(c, keep, &rows, &nrows, &snap, err);
    if (rc) {
        svc_sched_view_drop(view);
        *out = NULL;
        *n = 0;
        return rc;
    }
    return svc_sched_view_update(view, c, rows, nrows, snap, forget, limit, keep, out, n, err);
}

/* The number (from 1) of row r's group in v, added when new; 0: out of memory. */
static int view_group_of(sched_view_t *v, const store_job_row_t *r)
{
    const char *key[3] = {r->queue, r->project, r->slot_type};
    int i = v->gidx.slot ? kiln_names_find(&v->gidx, key, NULL) : -1;
    if (i >= 0)
        return i + 1;
    if (v->ngroups == v->gmost) { /* room for twice as many */
        int most = KILN_MAX(2 * v->ngroups, 32);
        const char **names = realloc(v->gnames, (size_t)most * 3 * sizeof(*names));
        if (!names)
            return 0;
        v->gnames = names;
        kiln_names_free(&v->gidx);
        if (!kiln_names_init(&v->gidx, names, 3, most))
            return 0;
        kiln_names_add_all(&v->gidx, v->ngroups);
        v->gmost = most;
    }
    /* its three names in one block, which the first points at */
    size_t lq = strlen(r->queue) + 1, lp = strlen(r->project) + 1, ls = strlen(r->slot_type) + 1;
    char *blk = malloc(lq + lp + ls);
    if (!blk)
        return 0;
    memcpy(blk, r->queue, lq);
    memcpy(blk + lq, r->project, lp);
    memcpy(blk + lq + lp, r->slot_type, ls);
    const char **g = &v->gnames[(size_t)v->ngroups * 3];
    g[0] = blk;
    g[1] = blk + lq;
    g[2] = blk + lq + lp;
    kiln_names_add_all(&v->gidx, ++v->ngroups);
    return v->ngroups;
}

/* Forgets v's groups (and each row's number in them). */
static void view_groups_clear(sched_view_t *v)
{
    for (int i = 0; i < v->n; i++)
        v->rows[i]->group = 0;
    for (int i = 0; i < v->ngroups; i++)
        free((char *)v->gnames[(size_t)i * 3]);
    free(v->gnames);
    kiln_names_free(&v->gidx);
    v->gnames = NULL;
    v->ngroups = v->gmost = 0;
}

int svc_sched_view_heads(sched_view_t *view, int limit, int per_group, int max, store_job_row_t **out, int *n)
{
    *out = NULL;
    *n = 0;
    if (!view || view->n <= limit || per_group <= 0 || max <= 0)
        return 0;
    /* groups no row holds any more are forgotten once they outnumber the rows */
    if (view->ngroups > view->n + 1024)
        view_groups_clear(view);
    for (int i = 0; i < view->n; i++) /* each row's group looked up once, kept for the passes after */
        if (!view->rows[i]->group && !(view->rows[i]->group = (uint64_t)view_group_of(view, &view->rows[i]->row)))
            return KILN_ENOMEM;
    /* per group: its jobs seen so far (-1: none yet), whether one is among the first limit */
    int *seen = malloc((size_t)view->ngroups * sizeof(*seen));
    bool *window = calloc((size_t)view->ngroups, sizeof(*window));
    if (!seen || !window) {
        free(seen);
        free(window);
        return KILN_ENOMEM;
    }
    for (int k = 0; k < view->ngroups; k++)
        seen[k] = -1;
    store_job_row_t *o = NULL; /* grown as heads are found: most passes find none */
    int ngroups = 0, m = 0, ocap = 0;
    for (int i = 0; i < view->n && m < max; i++) {
        int k = (int)view->rows[i]->group - 1;
        if (seen[k] < 0) {
            if (ngroups >= limit + max)
                continue; /* more groups than the pass would take: left for the next passes */
            seen[k] = 0;
            window[k] = i < limit;
            ngroups++;
        }
        if (i >= limit && !window[k] && seen[k] < per_group) {
            if (m == ocap) {
                int grow = KILN_MIN(KILN_MAX(2 * ocap, 16), max);
                store_job_row_t *more = realloc(o, (size_t)grow * sizeof(*o));
                if (!more) {
                    free(seen);
                    free(window);
                    free(o);
                    return KILN_ENOMEM;
                }
                o = more;
                ocap = grow;
            }
            o[m++] = view->rows[i]->row;
        }
        seen[k]++;
    }
    free(seen);
    free(window);
    *out = o;
    *n = m;
    return 0;
}

/* Each job's data paths (new references) and, with predict, its predicted run time (-1: unknown)
 * and where that comes from, for jobs[0..n), reading from the database only what earlier passes did
 * not already read; *nread counts the jobs whose paths or prediction it read. The kept set becomes
 * these jobs', and with head_only (a pass that read only the head of the queue) also keeps what
 * it held of the others, which the next pass over the whole queue reads again. Returns 0 or an
 * error (nothing kept changes then). */
static int sched_job_facts(svc_t *s, store_conn_t *c, const store_job_row_t *jobs, int n, bool predict,
                           bool head_only, json_t **paths, double *runtime, store_predict_t *source, int *nread,
                           kiln_err_t *err)
{
    *nread = 0;
    int nkeep = head_only ? s->nknown : 0; /* room for what it held of the others */
    sched_known_t *k = calloc((size_t)KILN_MAX(n + nkeep, 1), sizeof(*k));
    const char **ids = calloc((size_t)KILN_MAX(n, 1), sizeof(*ids)); /* whose paths to read */
    const char **pids = calloc((size_t)KILN_MAX(n, 1), sizeof(*pids)); /* whose predictions */
    int *at = calloc((size_t)KILN_MAX(n, 1), sizeof(*at)), *pat = calloc((size_t)KILN_MAX(n, 1), sizeof(*pat));
    json_t **got = calloc((size_t)KILN_MAX(n, 1), sizeof(*got));
    double *rt = calloc((size_t)KILN_MAX(n, 1), sizeof(*rt));
    store_predict_t *src = calloc((size_t)KILN_MAX(n, 1), sizeof(*src));
    int rc = 0, nk = 0, m = 0, mp = 0;
    kiln_names_t oldx = {0}, newx = {0}; /* the last pass's set by id, and this pass's */
    const char **oldids = NULL, **newids = NULL;
    if (!k || !ids || !pids || !at || !pat || !got || !rt || !src) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto out;
    }
    oldids = calloc((size_t)KILN_MAX(s->nknown, 1), sizeof(*oldids));
    newids = calloc((size_t)KILN_MAX(n, 1), sizeof(*newids));
    if (!oldids || !newids || !kiln_names_init(&oldx, oldids, 1, s->nknown) || !kiln_names_init(&newx, newids, 1, n)) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto out;
    }
    for (int i = 0; i < s->nknown; i++)
        oldids[i] = s->known[i].id;
    kiln_names_add_all(&oldx, s->nknown);
    int64_t now = kiln_mono_us();
    for (int j = 0; j < n; j++) {
        int o = kiln_names_find(&oldx, (const char *[]){jobs[j].id}, NULL);
        if (o >= 0) {
            k[j] = s->known[o];
            k[j].paths = json_incref(k[j].paths);
        } else {
            k[j] = (sched_known_t){0};
            kiln_strlcpy(k[j].id, jobs[j].id, sizeof k[j].id);
        }
        newids[j] = k[j].id;
        nk++;
    }
    kiln_names_add_all(&newx, n);
    /* the paths nobody read yet */
    for (int j = 0; j < n; j++)
        if (!k[j].paths) {
            ids[m] = k[j].id;
            at[m++] = j;
        }
    /* the predictions never read, and those not read in SCHED_PREDICT_TTL_US, at most
     * SCHED_PREDICT_REFRESH of these a pass (the head of the queue first): the jobs read in one
     * pass would otherwise all expire in the same later one */
    for (int j = 0, stale = 0; predict && j < n; j++)
        if (!k[j].runtime_at_us
            || (now - k[j].runtime_at_us > SCHED_PREDICT_TTL_US && stale++ < SCHED_PREDICT_REFRESH)) {
            pids[mp] = k[j].id;
            pat[mp++] = j;
        }
    /* both in one round trip */
    bool predicted = true;
    kiln_err_t perr;
    kiln_err_clear(&perr);
    if ((rc = store_job_facts(c, ids, m, got, pids, mp, rt, src, &predicted, &perr)) != 0) {
        *err = perr;
        for (int i = 0; i < m; i++)
            json_decref(got[i]);
        goto out;
    }
    *nread += m + mp;
    for (int i = 0; i < m; i++)
        k[at[i]].paths = got[i];
    if (!predicted) {
        log_warn("scheduler: %s", perr.message); /* no backfill this pass for lack of them */
        for (int i = 0; i < mp; i++)
            k[pat[i]].runtime_at_us = 0;
    } else {
        for (int i = 0; i < mp; i++) {
            k[pat[i]].runtime_s = rt[i];
            k[pat[i]].source = src[i];
            k[pat[i]].runtime_at_us = now;
        }
    }
    for (int j = 0; j < n; j++) {
        paths[j] = json_incref(k[j].paths);
        runtime[j] = predict && k[j].runtime_at_us ? k[j].runtime_s : -1;
        source[j] = runtime[j] >= 0 ? k[j].source : STORE_PREDICT_NONE;
    }
    /* a head-only pass keeps the facts of the jobs behind the head too (those still waiting are
     * the next full pass's; the others go with the next full pass's set) */
    int nk2 = n;
    for (int i = 0; i < nkeep; i++)
        if (kiln_names_find(&newx, (const char *[]){s->known[i].id}, NULL) < 0) {
            k[nk2] = s->known[i];
            k[nk2++].paths = json_incref(s->known[i].paths);
        }
    sched_known_clear(s);
    s->known = k;
    s->nknown = nk2;
    k = NULL;
    nk = 0;
out:
    for (int j = 0; k && j < nk; j++)
        json_decref(k[j].paths);
    kiln_names_free(&oldx);
    kiln_names_free(&newx);
    free(oldids);
    free(newids);
    free(k);
    free(ids);
    free(pids);
    free(at);
    free(pat);
    free(got);
    free(rt);
    free(src);
    return rc;
}

/* Writes the waiting jobs' pending reasons and the QUEUED ones' reason texts for one pass (its
 * snapshot, decisions and jobs); failures are logged (the next write corrects them). */
static void sched_write_reasons(store_conn_t *c, const sched_snapshot_t *snap, const sched_decision_t *dec,
                                const store_job_row_t *jobs)
{
    kiln_err_t err;
    int njobs = snap->njobs;
    kiln_err_clear(&err);
    if (svc_sched_pending_write(c, snap, dec, jobs, &err))
        log_warn("scheduler: could not write the pending reasons: %s", err.message);
    /* Tell users why their queued jobs wait (one statement; rows change only when the reason
     * does). RESTARTING jobs keep the reason they were re-queued with. */
    const char **rids = calloc((size_t)KILN_MAX(njobs, 1), sizeof(char *));
    const char **texts = calloc((size_t)KILN_MAX(njobs, 1), sizeof(char *));
    int nr = 0;
    for (int j = 0; rids && texts && j < njobs && nr < 200; j++) {
        if (dec[j].outcome != SCHED_ADMITTED && dec[j].reason[0]
            && svc_state_parse(jobs[j].state) == JOB_STATE_QUEUED) {
            rids[nr] = jobs[j].id;
            texts[nr] = dec[j].reason;
            nr++;
        }
    }
    if (nr > 0 && store_job_queue_reasons(c, rids, texts, nr, &err))
        log_warn("scheduler: %s", err.message);
    free(rids);
    free(texts);
}

/* Where a recorded pass's time goes (svc_sched_pass_t): the scheduler thread's CPU time and
 * run-queue delay, and the same for one database backend, sampled at each phase's end. */
typedef struct pass_clock {
    int64_t cpu, wait, db_cpu, db_wait;
} pass_clock_t;

/* A task's CPU time and run-queue delay in microseconds from its schedstat file (the first two of
 * its three numbers, in nanoseconds); both 0 when it cannot be read. */
static void schedstat_us(const char *path, int64_t *run, int64_t *wait)
{
    *run = *wait = 0;
    FILE *f = fopen(path, "r");
    unsigned long long r = 0, w = 0;
    if (f && fscanf(f, "%llu %llu", &r, &w) == 2) {
        *run = (int64_t)(r / 1000);
        *wait = (int64_t)(w / 1000);
    }
    if (f)
        fclose(f);
}

/* Samples this thread's clocks and, with backend_pid > 0, that backend's. */
static void pass_clock(pass_clock_t *pc, int backend_pid)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    int64_t run;
    schedstat_us("/proc/thread-self/schedstat", &run, &pc->wait);
    pc->cpu = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
    pc->db_cpu = pc->db_wait = 0;
    if (backend_pid > 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/schedstat", backend_pid);
        schedstat_us(path, &pc->db_cpu, &pc->db_wait);
    }
}

/* One pass over the queue: reads a snapshot, lets the admission core (admit.c) decide, commits its
 * admissions in its order and writes the others' reasons. */
static void sched_tick(svc_t *s)
{
    kiln_err_t err;
    store_conn_t *c = NULL;
    store_worker_cap_t *cap = NULL;
    store_job_row_t *jobs = NULL;
    sched_worker_t *w = NULL;
    json_t **paths = NULL;       /* each job's data paths */
    json_t *qjson = NULL, *pusage = NULL;
    sched_queue_t *queues = NULL;
    sched_job_t *sj = NULL;
    sched_decision_t *dec = NULL;
    int *order = NULL;
    double *proj = NULL;
    const char *(*pnames)[2] = NULL; /* (queue, project) pairs, indexed by pidx */
    const char **qnames = NULL, **wnames = NULL;
    kiln_names_t qidx = {0}, widx = {0}, pidx = {0};
    int ncap = 0, njobs = 0, nqueues = 0, nhold = 0, nadmit = 0, facts_read = 0;
    store_holding_t *hold = NULL;
    sched_running_t *run = NULL;
    int *run_workers = NULL;
    double *runtime = NULL;
    store_predict_t *source = NULL; /* where each job's runtime comes from */
    int64_t pass_start = 0, t_read = 0, t_decide = 0, t_commit = 0;
    bool locked = false, reasons = false;
    bool kept = false, full_read = false; /* the pass ran through: its view of the queue may be kept for the next */
    sched_snapshot_t snap = {0};
    store_pass_read_t rd = {0}; /* the pass's first reads: what is not taken from it is freed at the end */
    svc_sched_pass_t rec = {0}; /* this pass's record (took_us 0: none), appended once it is whole */
    /* when recording: the clocks at the pass's start and each phase's end, the commit's backend at
     * its transaction's start and end, and the read's wall time by step */
    pass_clock_t clk[4] = {0}, txclk[2] = {0};
    int64_t step[SVC_SCHED_STEPS] = {0}, t_step = 0;
    int pid = 0;
    bool recording = false;
    kiln_err_clear(&err);
    if (store_conn_get(s->store, &c, &err))
        goto out;
    pass_start = t_step = kiln_mono_us();
    pthread_mutex_lock(&s->mu);
    recording = s->pass_rec != NULL;
    pthread_mutex_unlock(&s->mu);
    if (recording)
        pass_clock(&clk[0], pid = store_conn_backend_pid(c));
#define SCHED_STEP(k)                                                                                                  \
    do {                                                                                                               \
        int64_t t_ = kiln_mono_us();                                                                                   \
        step[k] += t_ - t_step;                                                                                        \
        t_step = t_;                                                                                                   \
    } while (0)
    uint64_t gen = svc_cap_gen(s);
    /* Only the leader schedules (svc_sched_main), but a leader that lost its session has not
     * always noticed yet when another takes over: the pass lock keeps two passes from handing the
     * same free slots to different jobs in that moment. The connection keeps it for the pass. The
     * lock and what the pass reads first go in one round trip: the workers, the waiting jobs (the
     * kept view's changes), the queues and the jobs holding slots. */
    rd.since = svc_sched_view_since(s->view);
    rd.keep = SCHED_VIEW_KEEP;
    rd.half_life_s = SVC_FAIR_HALF_LIFE_S;
    rd.usage = s->sched_fair_seen; /* projects' recent usage, if this pass is like the last */
    if (store_sched_pass_read(c, &rd, &err)) {
        log_warn("scheduler: %s", err.message);
        svc_sched_view_drop(&s->view); /* its changes were not read */
        goto out;
    }
    if (!(locked = rd.locked))
        goto out;
    cap = rd.cap;
    ncap = rd.ncap;
    qjson = rd.queues;
    pusage = rd.project_usage;
    hold = rd.hold;
    nhold = rd.nhold;
    rd.cap = NULL;
    rd.queues = rd.project_usage = NULL;
    rd.hold = NULL;
    SCHED_STEP(SVC_SCHED_STEP_READ);
    /* With no free slot anywhere nothing can be placed: take only the head of the queue (a
     * submission storm into a busy or empty cluster would otherwise go through it all on every
     * wake-up). */
    int free_slots = 0;
    for (int i = 0; i < ncap; i++)
        free_slots += KILN_MAX(cap[i].slots_free, 0);
    /* ...but the whole queue every 2 s all the same, so every waiting job's pending reason
     * (its position, what it waits for) stays current. */
    bool full = free_slots > 0 || pass_start - s->sched_full_us >= 2000000;
    if (full)
        s->sched_full_us = pass_start;
    /* the waiting jobs: the kept view brought up to date with what changed since the last pass */
    int vrc = svc_sched_view_update(&s->view, c, rd.pending, rd.npending, rd.snap, rd.forget,
                                    full ? SCHED_WINDOW : 20, SCHED_VIEW_KEEP, &jobs, &njobs, &err);
    rd.pending = NULL;
    rd.snap = NULL;
    if (vrc) {
        log_warn("scheduler: %s", err.message);
        goto out;
    }
    full_read = svc_sched_view_was_full(s->view);
    /* A queue, project or slot type whose jobs all wait behind the first SCHED_WINDOW (of other
     * queues, projects or types) still has its first jobs considered: admitted to its quota,
     * reclaiming what others borrowed, taking its fair share, backfilled. */
    if (full && njobs >= SCHED_WINDOW) {
        store_job_row_t *heads = NULL, *grown = NULL;
        int nheads = 0;
        if (svc_sched_view_heads(s->view, njobs, SCHED_GROUP_HEADS, SCHED_WINDOW, &heads, &nheads) == 0 && nheads > 0
            && (grown = realloc(jobs, (size_t)(njobs + nheads) * sizeof(*jobs)))) {
            jobs = grown;
            memcpy(jobs + njobs, heads, (size_t)nheads * sizeof(*heads));
            njobs += nheads;
        }
        free(heads);
    }
    SCHED_STEP(SVC_SCHED_STEP_VIEW);
    /* Keep the submission check's view fresh (a copy: the scheduler keeps its own). */
    store_worker_cap_t *copy = ncap ? malloc((size_t)ncap * sizeof(*copy)) : NULL;
    if (copy)
        memcpy(copy, cap, (size_t)ncap * sizeof(*copy));
    if (copy || ncap == 0)
        svc_cap_set(s, copy, copy ? ncap : 0, gen);
    if (njobs <= 0) {
        kept = true;
        goto out;
    }
    if (svc_queues_to_sched(qjson, &queues, &nqueues)) {
        log_warn("scheduler: out of memory");
        goto out;
    }
    svc_prom_queues_seen(queues, nqueues);
    /* the queues by name, the workers by id */
    qnames = calloc((size_t)KILN_MAX(nqueues, 1), sizeof(*qnames));
    wnames = calloc((size_t)KILN_MAX(ncap, 1), sizeof(*wnames));
    for (int q = 0; qnames && q < nqueues; q++)
        qnames[q] = queues[q].name;
    for (int i = 0; wnames && i < ncap; i++)
        wnames[i] = cap[i].id;
    if (!qnames || !wnames || !kiln_names_init(&qidx, qnames, 1, nqueues) || !kiln_names_init(&widx, wnames, 1, ncap)) {
        log_warn("scheduler: out of memory");
        goto out;
    }
    kiln_names_add_all(&qidx, nqueues);
    kiln_names_add_all(&widx, ncap);
    /* Projects' recent usage matters only to the jobs of a fair queue among those read (a query
     * over the recent runs in fair queues: read with the rest when the last pass needed it too). */
    bool fair = false;
    for (int j = 0, q; j < njobs && !fair; j++)
        fair = (q = kiln_names_find(&qidx, (const char *[]){jobs[j].queue}, NULL)) >= 0 && queues[q].fair_projects;
    s->sched_fair_seen = fair;
    if (fair && !pusage && store_queue_project_usage(c, SVC_FAIR_HALF_LIFE_S, &pusage, &err)) {
        log_warn("scheduler: %s", err.message);
        goto out;
    }

    w = calloc((size_t)KILN_MAX(ncap, 1), sizeof(*w));
    sj = calloc((size_t)njobs, sizeof(*sj));
    dec = calloc((size_t)njobs, sizeof(*dec));
    order = calloc((size_t)njobs, sizeof(*order));
    proj = calloc((size_t)njobs, sizeof(*proj));
    pnames = calloc((size_t)njobs, sizeof(*pnames));
    paths = calloc((size_t)njobs, sizeof(json_t *));
    runtime = calloc((size_t)njobs, sizeof(*runtime));
    source = calloc((size_t)njobs, sizeof(*source));
    if (!w || !sj || !dec || !order || !proj || !pnames || !paths || !runtime || !source
        || !kiln_names_init(&pidx, &pnames[0][0], 2, njobs))
        goto out;
    int nrw = 0;
    for (int r = 0; r < nhold; r++)
        nrw += KILN_MAX(hold[r].nodes, 1);
    run = calloc((size_t)KILN_MAX(nhold, 1), sizeof(*run));
    run_workers = calloc((size_t)KILN_MAX(nrw, 1), sizeof(*run_workers));
    if (!run || !run_workers)
        goto out;
    for (int i = 0; i < ncap; i++) {
        w[i].id = cap[i].id;
        w[i].slot_type = cap[i].slot_type;
        w[i].slots = cap[i].slots;
        w[i].slots_free = cap[i].slots_free;
    }
    /* Each job sees only the workers whose data roots hold every file it reads. Run-time
     * predictions matter only when something could be backfilled into free slots. */
    if (sched_job_facts(s, c, jobs, njobs, free_slots > 0, !full, paths, runtime, source, &facts_read, &err)) {
        log_warn("scheduler: could not read the jobs' data paths and predictions: %s", err.message);
        goto out;
    }
    SCHED_STEP(SVC_SCHED_STEP_FACTS);
    double now = (double)kiln_now_us() / 1e6;
    for (int r = 0, off = 0; r < nhold; r++) {
        sched_running_t *x = &run[r];
        const store_holding_t *h = &hold[r];
        x->id = h->id;
        x->queue = kiln_names_find(&qidx, (const char *[]){h->queue}, NULL);
        x->type = sched_slot_type(h->slot_type);
        if (x->queue >= 0 && x->type >= 0) /* each queue's usage: what its jobs hold */
            queues[x->queue].usage[x->type] += h->nodes * h->slots_per_node;
        x->priority = h->priority;
        x->slots_per_node = h->slots_per_node;
        x->worker = &run_workers[off];
        /* its nodes, as far as its assignments say (a part already released holds nothing) */
        char list[sizeof(h->workers)];
        kiln_strlcpy(list, h->workers, sizeof(list));
        char *save = NULL;
        for (char *tok = strtok_r(list, ",", &save); tok && x->nodes < h->nodes; tok = strtok_r(NULL, ",", &save)) {
            int i = kiln_names_find(&widx, (const char *[]){tok}, NULL);
            if (i >= 0)
                run_workers[off + x->nodes++] = i;
        }
        off += KILN_MAX(h->nodes, 1);
        svc_job_state_t hs = svc_state_parse(h->state);
        x->preemptible = hs == JOB_STATE_RUNNING;
        x->freeing = hs == JOB_STATE_STOPPING;
        x->steps_lost = h->steps_lost;
        x->preemptions = h->preemptions;
        x->start_s = now - h->age_s;
        x->end_s = h->end_in_s < 0 ? -1 : now + h->end_in_s;
        x->backfilled = h->backfilled;
        x->backfill_end_s = now + h->backfill_end_in_s;
        x->project_name = h->project;
    }
    for (int j = 0; j < njobs; j++) {
        sched_job_t *x = &sj[j];
        x->id = jobs[j].id;
        x->queue = kiln_names_find(&qidx, (const char *[]){jobs[j].queue}, NULL);
        x->project = project_slot(&pidx, pnames, jobs[j].queue, jobs[j].project);
        proj[x->project] = json_number_value(json_object_get(json_object_get(pusage, jobs[j].queue), jobs[j].project));
        x->priority = jobs[j].priority;
        x->nodes = jobs[j].nodes;
        x->slots_per_node = jobs[j].slots_per_node;
        x->type = sched_slot_type(jobs[j].slot_type);
        /* nothing of its model has run: the configured default, if any (an estimate, as is one
         * from its model at other resources) */
        if (runtime[j] < 0 && free_slots > 0 && s->cfg.sched_default_runtime_s > 0) {
            runtime[j] = s->cfg.sched_default_runtime_s;
            source[j] = STORE_PREDICT_DEFAULT;
        }
        x->runtime_s = runtime[j] < 0 ? -1 : runtime[j] + SCHED_START_ALLOWANCE_S;
        x->runtime_estimate = sched_estimate_text(source[j]);
        x->preempted_by = jobs[j].last_preempted_by[0] ? jobs[j].last_preempted_by : NULL;
        x->project_name = jobs[j].project;
    }
    paths_ctx_t pctx = {.cap = cap, .paths = paths};
    snap = (sched_snapshot_t){.workers = w, .nworkers = ncap, .queues = queues, .nqueues = nqueues, .jobs = sj,
                             .njobs = njobs, .project_usage = proj, .nprojects = pidx.n, .eligible = holds_paths,
                              .ctx = &pctx, .running = run, .nrunning = nhold, .now_s = now,
                              .protect_after = s->cfg.preempt_protect_after};
    SCHED_STEP(SVC_SCHED_STEP_BUILD);
#undef SCHED_STEP
    t_read = kiln_mono_us();
    if (recording)
        pass_clock(&clk[1], pid);
    if (sched_admit(&snap, dec, order, &nadmit)) {
        log_warn("scheduler: out of memory");
        goto out;
    }
    t_decide = kiln_mono_us();
    if (recording)
        pass_clock(&clk[2], 0);
    /* The pass's admissions and preemptions commit in one transaction (one commit to wait for,
     * not one per job); a job that changed meanwhile is left out (nothing of it was written), any
     * other error rolls the pass back (the next pass decides again). Each queue's usage as the
     * admissions of the pass take it, for their events. */
    int (*qusage)[SCHED_NTYPES] = calloc((size_t)KILN_MAX(nqueues, 1), sizeof(*qusage));
    int nvictims = 0, nheads = 0; /* their rows, and the heads' they stop for, are locked with the admitted jobs' */
    for (int j = 0; j < njobs; j++)
        if (dec[j].outcome == SCHED_PREEMPTING && dec[j].nvictims > 0) {
            nvictims += dec[j].nvictims;
            nheads++;
        }
    int nlock = nadmit + nvictims + nheads;
    double *waited = calloc((size_t)KILN_MAX(nlock, 1), sizeof(*waited));
    store_job_row_t *row = calloc((size_t)KILN_MAX(nlock, 1), sizeof(*row)); /* as locked */
    const char **aid = calloc((size_t)KILN_MAX(nlock, 1), sizeof(*aid));
    bool *placed = calloc((size_t)KILN_MAX(nlock, 1), sizeof(*placed));
    const char **preempted = calloc((size_t)KILN_MAX(nhold, 1), sizeof(*preempted)); /* each victim's kind */
    svc_tx_t tx;
    int txrc = !qusage || !waited || !row || !aid || !placed || !preempted
                   ? kiln_err_set(&err, KILN_ENOMEM, NULL, "out of memory")
                   : nadmit > 0 || pass_preempts(dec, njobs) ? svc_tx_begin(s, &tx, &err) : 0;
    bool intx = txrc == 0 && (nadmit > 0 || pass_preempts(dec, njobs));
    int txpid = recording && intx ? store_conn_backend_pid(tx.c) : 0;
    if (txpid)
        pass_clock(&txclk[0], txpid);
    for (int q = 0; qusage && q < nqueues; q++)
        memcpy(qusage[q], queues[q].usage, sizeof(qusage[q]));
    /* the admitted jobs' rows and the victims', locked in one statement (in the order of their
     * ids, as every transaction that locks several jobs does: locking the victims one by one after,
     * the pass could deadlock with a batch of agent reports holding one of them) */
    for (int k = 0; intx && k < nadmit; k++)
        aid[k] = jobs[order[k]].id;
    for (int j = 0, k = nadmit; intx && j < njobs; j++)
        for (int v = 0; dec[j].outcome == SCHED_PREEMPTING && v < dec[j].nvictims; v++)
            aid[k++] = hold[dec[j].victims[v]].id;
    for (int j = 0, k = nadmit + nvictims; intx && j < njobs; j++)
        if (dec[j].outcome == SCHED_PREEMPTING && dec[j].nvictims > 0)
            aid[k++] = jobs[j].id;
    if (intx && nlock > 0)
        txrc = store_job_rows_lock(tx.c, aid, nlock, row, waited, placed, &err);
    /* each placed job's state change and assignments, written together after */
    admit_batch_t batch = {0};
    int nasg = 0;
    for (int k = 0; k < nadmit; k++)
        nasg += dec[order[k]].pl.nodes;
    batch.tr = calloc((size_t)KILN_MAX(nadmit, 1), sizeof(*batch.tr));
    batch.reason = calloc((size_t)KILN_MAX(nadmit, 1), sizeof(*batch.reason));
    batch.asg = calloc((size_t)KILN_MAX(nasg, 1), sizeof(*batch.asg));
    if (intx && txrc == 0 && (!batch.tr || !batch.reason || !batch.asg))
        txrc = kiln_err_set(&err, KILN_ENOMEM, NULL, "out of memory");
    for (int k = 0; intx && txrc == 0 && k < nadmit; k++) {
        int j = order[k];
        if (!placed[k])
            continue; /* deleted meanwhile */
        kiln_err_clear(&err);
        char admission[400];
        sched_admission_text(&snap, j, &dec[j], qusage[sj[j].queue], admission, sizeof admission);
        qusage[sj[j].queue][sj[j].type] += sj[j].nodes * sj[j].slots_per_node;
        char head[SCHED_JOB_NAME_LEN]; /* as the job's project may read it */
        if (dec[j].backfilled)
            sched_job_name(sj[j].project_name, sj[dec[j].behind_head].id, sj[dec[j].behind_head].project_name, head,
                           sizeof head);
        backfill_note_t note = {.head = dec[j].backfilled ? head : NULL,
                                .runtime_s = dec[j].end_s - now, .beside = dec[j].end_s > dec[j].head_start_s,
                                .estimate = sj[j].runtime_estimate};
        int rc = sched_batch_add(&batch, &jobs[j], &row[k], cap, &dec[j].pl, admission,
                                 dec[j].backfilled ? &note : NULL, &err);
        placed[k] = rc == 0; /* KILN_ESTATE: it moved on meanwhile, and is left out */
        if (rc != 0 && rc != KILN_ESTATE)
            txrc = rc;
    }
    if (intx && txrc == 0 && batch.ntr > 0)
        txrc = sched_admit_write(&tx, &batch, &err);
    free(batch.tr);
    free(batch.reason);
    free(batch.asg);
    /* Each head's victims get their stop orders, and the head one event naming those that did (in
     * this pass only: while they stop, later passes see their slots coming back and preempt no
     * more for it). A head that no longer waits (stopped or deleted meanwhile) preempts nothing. */
    for (int j = 0, h = nadmit + nvictims; intx && txrc == 0 && j < njobs; j++) {
        if (dec[j].outcome != SCHED_PREEMPTING || dec[j].nvictims == 0)
            continue;
        const store_job_row_t *head = &row[h];
        if (!placed[h++])
            continue;
        svc_job_state_t hs = svc_state_parse(head->state);
        if (hs != JOB_STATE_QUEUED && hs != JOB_STATE_RESTARTING && hs != JOB_STATE_PREEMPTED)
            continue;
        int stopped[SCHED_MAX_VICTIMS], nstopped = 0;
        for (int k = 0; txrc == 0 && k < dec[j].nvictims; k++) {
            char why[600];
            int v = dec[j].victims[k];
            const char *kind = sched_victim_reason(&snap, j, v, why, sizeof(why));
            kiln_err_clear(&err);
            int rc = sched_preempt(&tx, &hold[v], jobs[j].id, jobs[j].project, why, &err);
            if (rc == 0) {
                preempted[v] = kind;
                stopped[nstopped++] = v;
            } else if (rc != KILN_ESTATE) {
                txrc = rc;
            }
        }
        if (txrc == 0 && nstopped > 0) {
            char note[700];
            bool noted;
            sched_preemptor_reason(&snap, j, stopped, nstopped, note, sizeof note);
            txrc = store_job_note(tx.c, jobs[j].id, head->state, note, tx.actor, &noted, &err);
        }
    }
    if (intx && txrc == 0)
        txrc = svc_tx_commit(&tx, &err);
    else if (intx)
        svc_tx_abort(&tx);
    if (txpid) /* the backend's process outlives the connection's return to the pool */
        pass_clock(&txclk[1], txpid);
    if (txrc != 0) {
        log_warn("scheduler: could not commit the pass's %d admission(s) and its preemptions: %s", nadmit,
                 err.message);
    } else {
        kept = true;
        for (int k = 0; k < nadmit; k++)
            if (placed[k]) {
                int j = order[k];
                prom_observe(&svc_prom_queue_wait, "", waited[k]);
                svc_job_state_t was = svc_state_parse(row[k].state);
                svc_prom_queue_admitted(jobs[j].queue, dec[j].borrowed,
                                        was == JOB_STATE_QUEUED || was == JOB_STATE_PREEMPTED ? waited[k] : -1);
            }
        for (int v = 0; v < nhold; v++)
            if (preempted[v])
                svc_prom_queue_preempted(hold[v].queue, preempted[v]);
    }
    t_commit = kiln_mono_us();
    if (recording)
        pass_clock(&clk[3], 0);
    free(waited);
    free(row);
    free(aid);
    free(placed);
    free(preempted);
    free(qusage);
    /* Each waiting job's pending reason (position, what is missing, what it waits for, when it
     * should start), written where it changed: by every pass of a short queue, and of a long one
     * (where each admission moves every position behind it, so nearly every row changes) by at
     * most one pass a second, and no more often than leaves the writing a fifth of the time. It is
     * written once the pass lock is released: it changes no admission, and the next pass may begin
     * on another kilnd meanwhile (its reasons then replace these). */
    reasons = njobs <= SCHED_REASONS_EVERY_PASS
              || pass_start - s->sched_reasons_us >= KILN_MAX(1000000, 4 * s->sched_reasons_took_us);
out:
    if (!kept) /* not the leader's pass, or it failed somewhere: the next reads the queue whole */
        svc_sched_view_drop(&s->view);
    if (c) {
        if (locked) {
            store_sched_unlock(c);
            int64_t took = kiln_mono_us() - pass_start;
            prom_observe(&svc_prom_sched_pass, "", (double)took / 1e6);
            rec = (svc_sched_pass_t){.at_us = pass_start, .took_us = KILN_MAX(took, 1), .jobs = KILN_MAX(njobs, 0),
                                     .admitted = nadmit, .read_us = t_read ? t_read - pass_start : took,
                                     .decide_us = t_decide ? t_decide - t_read : 0,
                                     .commit_us = t_commit ? t_commit - t_decide : 0, .full_read = full_read,
                                     .facts_read = facts_read};
            memcpy(rec.step_us, step, sizeof step);
            /* each phase that ran: its own clocks' movement (the read's backend is c's; the
             * commit's is its transaction's) */
            for (int f = 0; f < 3 && recording; f++) {
                if (!clk[f + 1].cpu)
                    break;
                rec.cpu_us[f] = clk[f + 1].cpu - clk[f].cpu;
                rec.cpu_wait_us[f] = clk[f + 1].wait - clk[f].wait;
            }
            if (clk[1].cpu) {
                rec.db_cpu_us[0] = clk[1].db_cpu - clk[0].db_cpu;
                rec.db_wait_us[0] = clk[1].db_wait - clk[0].db_wait;
            }
            rec.db_cpu_us[2] = txclk[1].db_cpu - txclk[0].db_cpu;
            rec.db_wait_us[2] = txclk[1].db_wait - txclk[0].db_wait;
        }
        if (reasons) {
            int64_t reasons_start = kiln_mono_us();
            s->sched_reasons_us = pass_start;
            sched_write_reasons(c, &snap, dec, jobs);
            s->sched_reasons_took_us = kiln_mono_us() - reasons_start;
            rec.reasons_us = s->sched_reasons_took_us;
        }
        store_conn_put(s->store, c);
    }
    /* Appended under the lock only now: svc_sched_record(s, NULL, 0) may end the recording (and
     * its caller free the buffer) at any moment, so nothing keeps a pointer into it across the
     * reasons' write. */
    pthread_mutex_lock(&s->mu);
    if (rec.took_us && s->pass_rec && s->pass_rec_n < s->pass_rec_cap)
        s->pass_rec[s->pass_rec_n++] = rec;
    pthread_mutex_unlock(&s->mu);
    for (int j = 0; paths && j < njobs; j++)
        json_decref(paths[j]);
    free(paths);
    free(w);
    free(sj);
    free(dec);
    free(order);
    free(proj);
    free(pnames);
    free(qnames);
    free(wnames);
    kiln_names_free(&qidx);
    kiln_names_free(&widx);
    kiln_names_free(&pidx);
    free(queues);
    json_decref(qjson);
    json_decref(pusage);
    free(cap);
    free(jobs);
    free(hold);
    store_pass_read_clear(&rd);
    free(run);
    free(run_workers);
    free(runtime);
    free(source);
}

void svc_sched_record(svc_t *s, svc_sched_pass_t *buf, int cap)
{
    pthread_mutex_lock(&s->mu);
    s->pass_rec = buf && cap > 0 ? buf : NULL;
    s->pass_rec_cap = s->pass_rec ? cap : 0;
    s->pass_rec_n = 0;
    pthread_mutex_unlock(&s->mu);
}

int svc_sched_recorded(svc_t *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->pass_rec_n;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void *svc_sched_main(void *arg)
{
    svc_t *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        if (!s->sched_wake && !s->stopping) {
            struct timespec ts;
            kiln_deadline_in(&ts, s->cfg.sched_interval_ms);
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        }
        bool stop = s->stopping;
        s->sched_wake = false;
        pthread_mutex_unlock(&s->mu);
        if (stop)
            break;
        if (!svc_is_leader(s)) {
            svc_sched_view_drop(&s->view); /* a leader again reads the queue whole first */
            continue; /* the leader schedules; wake-ups here were forwarded to it (notify.c) */
        }
        svc_tune_pass(s);
        sched_tick(s);
        /* Coalesce bursts of wake-ups (a submission storm) into at most one pass per 20 ms. */
        struct timespec pause = {.tv_sec = 0, .tv_nsec = 20 * 1000000};
        nanosleep(&pause, NULL);
    }
    return NULL;
}
