/* admit.c - admission as a pure function (sched_admit): given a snapshot of the workers, the
 * queues with their quotas and usage, and the pending jobs, decides which jobs start now, where,
 * and why each other job waits. The scheduler thread (sched.c) reads the snapshot from the store
 * and commits the admissions; tests/service/test_admit.c checks its invariants on random clusters.
 * Preemption (victims chosen to lose the least work) and backfill (by predicted run times) are
 * part of the decision, so that tests and a simulator can drive it on a virtual clock. The policy
 * is described in service.h. */
#include "service/svc_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sched_slot_type(const char *name)
{
    if (name && strcmp(name, "cpu") == 0)
        return 0;
    if (name && strcmp(name, "gpu") == 0)
        return 1;
    return -1;
}

const char *sched_slot_type_name(int type)
{
    return type == 0 ? "cpu" : type == 1 ? "gpu" : "?";
}

#define POLICY_NAME_(id, name) name,
const char *const sched_within_names[] = {KILN_WITHIN_QUEUE_POLICIES(POLICY_NAME_, POLICY_NAME_) NULL};
const char *const sched_reclaim_names[] = {KILN_RECLAIM_WITHIN_COHORT_POLICIES(POLICY_NAME_, POLICY_NAME_) NULL};
#undef POLICY_NAME_

int sched_policy_parse(const char *const names[], const char *name)
{
    for (int i = 0; name && names[i]; i++)
        if (strcmp(names[i], name) == 0)
            return i;
    return -1;
}

static bool has_cohort(const sched_queue_t *q)
{
    return q->cohort && q->cohort[0];
}

static bool same_cohort(const sched_queue_t *a, const sched_queue_t *b)
{
    return has_cohort(a) && has_cohort(b) && strcmp(a->cohort, b->cohort) == 0;
}

/* What queue q lends its cohort of a slot type with a bounded quota. */
static int lendable(const sched_queue_t *q, int t)
{
    if (!has_cohort(q) || q->quota[t] == SCHED_UNLIMITED)
        return 0;
    return q->lending_limit[t] == SCHED_UNLIMITED ? q->quota[t] : KILN_MIN(q->quota[t], q->lending_limit[t]);
}

/* What queue q keeps for itself (never lent). */
static int guaranteed(const sched_queue_t *q, int t)
{
    return q->quota[t] - lendable(q, t);
}

/* Slots of the cohort's pool (what its queues lend) of type t, and how many of them queues use
 * beyond what they keep, with usage[] per queue. */
static void pool(const sched_queue_t *qs, int nq, int q, int t, const int (*usage)[SCHED_NTYPES],
                 int *cap, int *used)
{
    *cap = *used = 0;
    for (int r = 0; r < nq; r++) {
        if (r != q && !same_cohort(&qs[q], &qs[r]))
            continue;
        if (qs[r].quota[t] == SCHED_UNLIMITED)
            continue;
        *cap += lendable(&qs[r], t);
        *used += KILN_MAX(0, usage[r][t] - guaranteed(&qs[r], t));
    }
}

int sched_quota_max(const sched_queue_t *queues, int nqueues, int q, int type, const char **which)
{
    const sched_queue_t *Q = &queues[q];
    if (which)
        *which = "quota";
    if (Q->quota[type] == SCHED_UNLIMITED)
        return SCHED_UNLIMITED;
    if (!has_cohort(Q))
        return Q->quota[type];
    int others = 0;
    for (int r = 0; r < nqueues; r++)
        if (r != q && same_cohort(Q, &queues[r]) && queues[r].quota[type] != SCHED_UNLIMITED)
            others += lendable(&queues[r], type);
    int bl = Q->borrowing_limit[type];
    if (bl != SCHED_UNLIMITED && bl < others) {
        if (which && bl > 0)
            *which = "borrowing_limit";
        return Q->quota[type] + bl;
    }
    if (which && others > 0)
        *which = "lending_limit";
    return Q->quota[type] + others;
}

int sched_quota_bound(const sched_queue_t *queues, int nqueues, int q, int type, const char **which, char *words,
                      size_t n)
{
    const char *w = NULL;
    int max = sched_quota_max(queues, nqueues, q, type, &w);
    const sched_queue_t *Q = &queues[q];
    if (which)
        *which = w;
    if (max == SCHED_UNLIMITED)
        snprintf(words, n, "its quota is unlimited");
    else if (!strcmp(w, "borrowing_limit"))
        snprintf(words, n, "its quota (%d) plus its borrowing_limit (%d) allow at most %d", Q->quota[type],
                 Q->borrowing_limit[type], max);
    else if (!strcmp(w, "lending_limit"))
        snprintf(words, n, "at most %d, its quota (%d) plus the %d the other queues of cohort \"%.40s\" lend", max,
                 Q->quota[type], max - Q->quota[type], Q->cohort);
    else
        snprintf(words, n, "its quota allows at most %d%s", max, has_cohort(Q) ? "" : " (it has no cohort to borrow from)");
    return max;
}

typedef struct admit {
    const sched_snapshot_t *snap;
    sched_worker_t *w;                 /* the workers, slots_free as admissions take them */
    sched_worker_t *view;              /* the workers as one job sees them */
    int (*usage)[SCHED_NTYPES];        /* per queue */
    double *proj;                      /* per project index */
    double total[SCHED_NTYPES];        /* the cluster's slots per type (DRF denominators) */
    int *next;                         /* per (queue, type): index of the first undecided job */
    int *blocker;                      /* per (queue, type): the blocked head, or -1 */
    bool *no_borrow;                   /* per (queue, type): its cohort lends no more this pass */
    bool *taken;                       /* per running job: a victim chosen this pass */
    int *cand;                         /* scratch: candidate victims */
    double *at;                        /* per (queue, type): its blocked head's earliest start, < 0
                                          unknown (backfill) */
    int *extra;                        /* per (queue, type) and worker: slots a job may hold past its
                                          blocked head's earliest start without delaying it */
    int *hk;                           /* the keys of the blocked heads, in the order they blocked */
    int nh;
    sched_placement_t *pl;             /* per blocked head (as hk): the slots it reserves */
    int (*usage_at)[SCHED_NTYPES];     /* per (queue, type) and queue: the queues' usage at that blocked
                                          head's earliest start (without it), with the heads of its
                                          slot type that start no later and the jobs backfilled to
                                          hold slots past it */
} admit_t;

static int qt(int q, int t)
{
    return q * SCHED_NTYPES + t;
}

/* The head of (queue q, type t): the first undecided job in priority-then-age order or, when the
 * queue shares fairly between projects, among the undecided jobs of the head's priority the one
 * whose project has the least usage (then the oldest). -1 when none. */
static int head(admit_t *a, const sched_decision_t *out, int q, int t)
{
    const sched_snapshot_t *s = a->snap;
    int *nx = &a->next[qt(q, t)];
    while (*nx < s->njobs && (out[*nx].outcome || s->jobs[*nx].queue != q || s->jobs[*nx].type != t))
        (*nx)++;
    if (*nx >= s->njobs)
        return -1;
    int best = *nx;
    if (!s->queues[q].fair_projects)
        return best;
    int prio = s->jobs[best].priority;
    for (int j = best + 1; j < s->njobs && s->jobs[j].priority == prio; j++) {
        if (out[j].outcome || s->jobs[j].queue != q || s->jobs[j].type != t)
            continue;
        if (a->proj[s->jobs[j].project] < a->proj[s->jobs[best].project])
            best = j;
    }
    return best;
}

static double share(const admit_t *a, int q)
{
    double m = 0;
    for (int t = 0; t < SCHED_NTYPES; t++)
        m = KILN_MAX(m, a->usage[q][t] / a->total[t]);
    double wt = a->snap->queues[q].weight;
    return m / (wt > 0 ? wt : 1);
}

static int job_size(const sched_job_t *j)
{
    return j->nodes * j->slots_per_node;
}

/* Whether job j stays within its queue's nominal quota. */
static bool entitled(const admit_t *a, int j)
{
    const sched_job_t *J = &a->snap->jobs[j];
    int nom = a->snap->queues[J->queue].quota[J->type];
    return nom == SCHED_UNLIMITED || a->usage[J->queue][J->type] + job_size(J) <= nom;
}

/* Admits job j where d->pl places it (borrowed: beyond its queue's nominal quota): takes its
 * slots on those workers and adds its size to its queue's and its project's usage. */
static void take(admit_t *a, int j, sched_decision_t *d, bool borrowed)
{
    const sched_snapshot_t *s = a->snap;
    const sched_job_t *J = &s->jobs[j];
    d->outcome = SCHED_ADMITTED;
    d->borrowed = borrowed;
    d->reason[0] = '\0';
    for (int k = 0; k < d->pl.nodes; k++)
        a->w[d->pl.worker[k]].slots_free -= J->slots_per_node;
    a->usage[J->queue][J->type] += job_size(J);
    if (J->project >= 0 && J->project < s->nprojects)
        a->proj[J->project] += job_size(J);
}

/* Checks job j against its queue's quota and cohort now. Returns 0 when it may be admitted,
 * SCHED_WAIT_QUOTA or SCHED_WAIT_NEVER_QUOTA with the reason written. */
static int quota_check(admit_t *a, int j, char *why, size_t n)
{
    const sched_snapshot_t *s = a->snap;
    const sched_job_t *J = &s->jobs[j];
    const sched_queue_t *Q = &s->queues[J->queue];
    int t = J->type, d = job_size(J), nom = Q->quota[t];
    const char *tn = sched_slot_type_name(t);
    if (nom == SCHED_UNLIMITED)
        return 0;
    char bound[160];
    int max = sched_quota_bound(s->queues, s->nqueues, J->queue, t, NULL, bound, sizeof bound);
    int used = a->usage[J->queue][t];
    if (d > max) {
        snprintf(why, n, "waiting for quota it can never get: needs %d %s slot(s), more than queue %s can ever get: "
                 "%s", d, tn, Q->name, bound);
        return SCHED_WAIT_NEVER_QUOTA;
    }
    if (used + d <= nom && !has_cohort(Q))
        return 0;
    if (!has_cohort(Q)) {
        snprintf(why, n, "waiting for quota: needs %d %s slot(s); queue %s: quota %d, used %d, no cohort to "
                 "borrow from", d, tn, Q->name, nom, used);
        return SCHED_WAIT_QUOTA;
    }
    int bl = Q->borrowing_limit[t];
    int borrowed_after = KILN_MAX(0, used + d - nom);
    int cap, pused;
    pool(s->queues, s->nqueues, J->queue, t, (const int (*)[SCHED_NTYPES])a->usage, &cap, &pused);
    int g = guaranteed(Q, t);
    int need = KILN_MAX(0, used + d - g) - KILN_MAX(0, used - g);
    bool over_limit = bl != SCHED_UNLIMITED && borrowed_after > bl;
    if (!over_limit && need <= cap - pused)
        return 0;
    int may = bl == SCHED_UNLIMITED ? -1 : KILN_MAX(0, bl - KILN_MAX(0, used - nom));
    char mayb[48];
    if (may < 0)
        snprintf(mayb, sizeof mayb, "may borrow what the cohort lends");
    else
        snprintf(mayb, sizeof mayb, "may borrow %d more", may);
    snprintf(why, n, "waiting for quota: needs %d %s slot(s); queue %s: quota %d, used %d, %s; cohort %s: %d "
             "free", d, tn, Q->name, nom, used, mayb, Q->cohort, KILN_MAX(0, cap - pused));
    return SCHED_WAIT_QUOTA;
}

/* The workers job j may use, in a->view; returns how many. */
static int job_view(admit_t *a, int j)
{
    const sched_snapshot_t *s = a->snap;
    int eligible = 0;
    for (int i = 0; i < s->nworkers; i++) {
        a->view[i] = a->w[i];
        if (s->eligible && !s->eligible(s->ctx, j, i))
            a->view[i].slots = a->view[i].slots_free = 0;
        else
            eligible++;
    }
    return eligible;
}


/* ---- preemption ---------------------------------------------------------------------------- */

static int protect_after(const sched_snapshot_t *s)
{
    return s->protect_after > 0 ? s->protect_after : 3;
}

static bool overran(const sched_snapshot_t *s, const sched_running_t *R)
{
    return R->backfilled && s->now_s > R->backfill_end_s;
}

/* Whether running job r may be preempted for pending job j, as j's queue's preemption policy
 * allows (widest: as the default policy, the widest, would): a lower-priority job of j's queue
 * while that queue is within its nominal quota (its usage not above it: a queue whose quota its
 * own lower-priority jobs fill runs its higher-priority ones first; a queue that borrows does not
 * preempt its own jobs; what it may use after them is fits_without's quota check), a job of a
 * borrowing queue of its cohort only when j stays within its queue's nominal quota (within). */
static bool candidate(const admit_t *a, int j, int r, bool within, bool widest)
{
    const sched_snapshot_t *s = a->snap;
    const sched_job_t *J = &s->jobs[j];
    const sched_running_t *R = &s->running[r];
    if (a->taken[r] || !R->preemptible || R->freeing || R->type != J->type || R->queue < 0 || R->queue >= s->nqueues)
        return false;
    if (R->preemptions >= protect_after(s) && R->priority >= J->priority)
        return false;
    if (overran(s, R))
        return true;
    if (J->preempted_by && R->id && strcmp(J->preempted_by, R->id) == 0)
        return false; /* never back and forth */
    const sched_queue_t *Q = &s->queues[J->queue];
    sched_within_t wq = widest ? SCHED_WITHIN_LOWER_PRIORITY : Q->within;
    sched_reclaim_t rc = widest ? SCHED_RECLAIM_ANY : Q->reclaim;
    if (R->queue == J->queue) {
        int nom = Q->quota[J->type];
        bool queue_within = nom == SCHED_UNLIMITED || a->usage[J->queue][J->type] <= nom;
        return queue_within && wq == SCHED_WITHIN_LOWER_PRIORITY && R->priority < J->priority;
    }
    if (!within)
        return false;
    const sched_queue_t *V = &s->queues[R->queue];
    if (!same_cohort(Q, V) || V->quota[J->type] == SCHED_UNLIMITED || a->usage[R->queue][J->type] <= V->quota[J->type])
        return false;
    return rc == SCHED_RECLAIM_ANY || (rc == SCHED_RECLAIM_LOWER_PRIORITY && R->priority < J->priority);
}

/* Gives back (sign 1: also their slots in a->view) or takes again (sign -1: the quota usage only)
 * what the running jobs set[0..n) and every STOPPING job not taken by another head hold. */
static void give_back(admit_t *a, const int *set, int n, int sign)
{
    const sched_snapshot_t *s = a->snap;
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < (pass ? s->nrunning : n); k++) {
            int r = pass ? k : set[k];
            const sched_running_t *R = &s->running[r];
            if (pass && !(R->freeing && !a->taken[r]))
                continue;
            if (R->queue >= 0 && R->queue < s->nqueues && R->type >= 0 && R->type < SCHED_NTYPES)
                a->usage[R->queue][R->type] -= sign * R->nodes * R->slots_per_node;
            for (int x = 0; sign > 0 && x < R->nodes; x++)
                if (R->worker[x] >= 0 && R->worker[x] < s->nworkers && a->view[R->worker[x]].slots > 0)
                    a->view[R->worker[x]].slots_free += R->slots_per_node;
        }
}

/* Whether job j could start with the slots and quota of the running jobs set[0..n) given back,
 * and those of every STOPPING job (freeing). */
static bool fits_without(admit_t *a, int j, const int *set, int n)
{
    const sched_job_t *J = &a->snap->jobs[j];
    job_view(a, j);
    give_back(a, set, n, 1);
    char why[300];
    sched_request_t req = {.nodes = J->nodes, .slots_per_node = J->slots_per_node,
                           .slot_type = sched_slot_type_name(J->type)};
    bool ok = quota_check(a, j, why, sizeof why) == 0 && sched_place(a->view, a->snap->nworkers, &req, NULL);
    give_back(a, set, n, -1);
    return ok;
}

/* The cost of losing a set of victims, compared lexicographically: steps lost, jobs, priorities,
 * then the negated start times (newer victims cost less). */
typedef struct cost {
    int64_t lost;
    int n;
    int64_t prio;
    double age;
} cost_t;

static int cost_cmp(const cost_t *x, const cost_t *y)
{
    if (x->lost != y->lost)
        return x->lost < y->lost ? -1 : 1;
    if (x->n != y->n)
        return x->n < y->n ? -1 : 1;
    if (x->prio != y->prio)
        return x->prio < y->prio ? -1 : 1;
    if (x->age != y->age)
        return x->age < y->age ? -1 : 1;
    return 0;
}

static int victim_cmp(const sched_snapshot_t *s, int x, int y)
{
    const sched_running_t *X = &s->running[x], *Y = &s->running[y];
    if (X->steps_lost != Y->steps_lost)
        return X->steps_lost < Y->steps_lost ? -1 : 1;
    if (X->priority != Y->priority)
        return X->priority < Y->priority ? -1 : 1;
    if (X->start_s != Y->start_s)
        return X->start_s > Y->start_s ? -1 : 1;
    return x < y ? -1 : x > y;
}

static void sort_cands(const sched_snapshot_t *s, int *c, int n)
{
    for (int i = 1; i < n; i++) /* insertion sort: candidates are few, and no global state */
        for (int k = i; k > 0 && victim_cmp(s, c[k - 1], c[k]) > 0; k--) {
            int tmp = c[k];
            c[k] = c[k - 1];
            c[k - 1] = tmp;
        }
}

/* Chooses the victims for head j (among the candidates its queue's policy allows, or with widest
 * those the default policy would): writes them to victims[SCHED_MAX_VICTIMS] and returns how many
 * (0: none suffice). */
static int choose_victims(admit_t *a, int j, bool within, bool widest, int *victims)
{
    const sched_snapshot_t *s = a->snap;
    int n = 0;
    for (int r = 0; r < s->nrunning; r++)
        if (candidate(a, j, r, within, widest))
            a->cand[n++] = r;
    if (n == 0)
        return 0;
    sort_cands(s, a->cand, n);
    int m = KILN_MIN(n, SCHED_PREEMPT_EXACT);
    unsigned best_mask = 0;
    cost_t best = {0};
    int set[SCHED_PREEMPT_EXACT];
    for (unsigned mask = 1; mask < (1u << m); mask++) {
        cost_t c = {0};
        int k = 0;
        for (int i = 0; i < m; i++)
            if (mask & (1u << i)) {
                const sched_running_t *R = &s->running[a->cand[i]];
                c.lost += R->steps_lost;
                c.n++;
                c.prio += R->priority;
                c.age -= R->start_s;
                set[k++] = a->cand[i];
            }
        if (best_mask && cost_cmp(&c, &best) >= 0)
            continue;
        if (fits_without(a, j, set, k)) {
            best = c;
            best_mask = mask;
        }
    }
    int nv = 0;
    if (best_mask) {
        for (int i = 0; i < m; i++)
            if (best_mask & (1u << i))
                victims[nv++] = a->cand[i];
        return nv;
    }
    if (n == m)
        return 0;
    /* More candidates than an exhaustive search allows: the first that suffice in the order of
     * least lost work, less any the others do without. */
    int k = 0;
    while (k < n && !fits_without(a, j, a->cand, k))
        k++;
    if (k >= n && !fits_without(a, j, a->cand, n))
        return 0;
    for (int i = k - 1; i >= 0; i--) {
        int drop = a->cand[i];
        memmove(&a->cand[i], &a->cand[i + 1], (size_t)(k - i - 1) * sizeof(int));
        if (fits_without(a, j, a->cand, k - 1)) {
            k--;
        } else {
            memmove(&a->cand[i + 1], &a->cand[i], (size_t)(k - i - 1) * sizeof(int));
            a->cand[i] = drop;
        }
    }
    if (k > SCHED_MAX_VICTIMS)
        return 0;
    memcpy(victims, a->cand, (size_t)k * sizeof(int));
    return k;
}

/* Head j, which preempts nothing, waits: when its queue's
 * preemption policy is why (the default policy would find victims that make room), its reason
 * says so, naming the rule: "; queue Q's preemption.within_queue (never) keeps it from preempting
 * ...". */
static void policy_why(admit_t *a, int j, bool within, sched_decision_t *d)
{
    const sched_snapshot_t *s = a->snap;
    const sched_job_t *J = &s->jobs[j];
    const sched_queue_t *Q = &s->queues[J->queue];
    if (Q->within == SCHED_WITHIN_LOWER_PRIORITY && Q->reclaim == SCHED_RECLAIM_ANY)
        return;
    int v[SCHED_MAX_VICTIMS];
    int nv = choose_victims(a, j, within, true, v);
    bool own = false, cohort = false;
    for (int k = 0; k < nv; k++) {
        if (candidate(a, j, v[k], within, false))
            continue;
        own = own || s->running[v[k]].queue == J->queue;
        cohort = cohort || s->running[v[k]].queue != J->queue;
    }
    size_t len = strlen(d->reason);
    if (own && len < sizeof d->reason)
        len += (size_t)snprintf(d->reason + len, sizeof d->reason - len, "; queue %s's preemption.within_queue (%s) "
                                "keeps it from preempting its lower-priority jobs", Q->name, sched_within_names[Q->within]);
    if (cohort && len < sizeof d->reason)
        snprintf(d->reason + len, sizeof d->reason - len, "; queue %s's preemption.reclaim_within_cohort (%s) keeps "
                 "it from reclaiming its quota from the jobs that borrow it", Q->name, sched_reclaim_names[Q->reclaim]);
}

/* Head j cannot start now: when slots being freed would let it, it waits for them; otherwise it
 * preempts the victims that lose the least work, if any suffice. Returns true when it decided
 * (out[j] written). */
static bool try_preempt(admit_t *a, int j, sched_decision_t *out)
{
    const sched_snapshot_t *s = a->snap;
    const sched_job_t *J = &s->jobs[j];
    sched_decision_t *d = &out[j];
    if (s->nrunning == 0)
        return false;
    bool within = entitled(a, j);
    bool any_freeing = false;
    for (int r = 0; r < s->nrunning; r++)
        any_freeing = any_freeing || (s->running[r].freeing && s->running[r].type == J->type && !a->taken[r]);
    if (any_freeing && fits_without(a, j, NULL, 0)) {
        d->outcome = SCHED_WAIT_SLOTS;
        snprintf(d->reason, sizeof d->reason, "waiting for free slots: needs %d worker(s) with %d free %s slot(s) "
                 "each, which jobs stopping now are freeing", J->nodes, J->slots_per_node,
                 sched_slot_type_name(J->type));
        return true;
    }
    int nv = choose_victims(a, j, within, false, d->victims);
    if (nv == 0) {
        policy_why(a, j, within, d);
        return false;
    }
    d->outcome = SCHED_PREEMPTING;
    d->nvictims = nv;
    size_t len = (size_t)snprintf(d->reason, sizeof d->reason, "waiting for %d job(s) preempted for it to stop "
                                  "and free their slots:", nv);
    /* a victim is named whole or not at all (a cut id is neither a name nor hidden from readers of
     * other projects, whose copies of this reason name only whole ids): those without room are
     * counted at the end */
    int named = 0;
    for (int k = 0; k < nv; k++) {
        const sched_running_t *V = &s->running[d->victims[k]];
        char name[SCHED_JOB_NAME_LEN];
        a->taken[d->victims[k]] = true;
        sched_job_name(J->project_name, V->id, V->project_name, name, sizeof name);
        size_t need = strlen(name) + 2 + (k + 1 < nv ? sizeof " and 1000 more" : 0);
        if (named == k && len + need < sizeof d->reason) {
            len += (size_t)snprintf(d->reason + len, sizeof d->reason - len, "%s %s", k ? "," : "", name);
            named++;
        }
    }
    if (named < nv)
        snprintf(d->reason + len, sizeof d->reason - len, " and %d more", nv - named);
    return true;
}

const char *sched_job_name(const char *reader, const char *id, const char *project, char *buf, size_t n)
{
    bool theirs = reader && project ? strcmp(reader, project) == 0 : reader == project;
    if (theirs)
        snprintf(buf, n, "job %s", id);
    else
        snprintf(buf, n, "a job of another project");
    return buf;
}

/* Which rule lets pending job j preempt running job r, as SVC_PREEMPT_REASONS names it. */
static const char *victim_kind(const sched_snapshot_t *s, int j, int r)
{
    const sched_running_t *R = &s->running[r];
    if (overran(s, R))
        return "backfill_overrun";
    return R->queue == s->jobs[j].queue ? "priority" : "reclaim";
}

const char *sched_victim_reason(const sched_snapshot_t *s, int j, int r, char *buf, size_t n)
{
    const sched_job_t *J = &s->jobs[j];
    const sched_running_t *R = &s->running[r];
    const char *qn = J->queue >= 0 && J->queue < s->nqueues ? s->queues[J->queue].name : "?";
    const char *rq = R->queue >= 0 && R->queue < s->nqueues ? s->queues[R->queue].name : "?";
    const sched_queue_t *Q = J->queue >= 0 && J->queue < s->nqueues ? &s->queues[J->queue] : NULL;
    /* what the stop does to R: its ranks checkpoint on SIGTERM (kiln's engine does), so only a
     * checkpoint that fails or is never written loses the steps since the last one */
    char lost[200];
    if (R->steps_lost > 0)
        snprintf(lost, sizeof lost, "if that checkpoint fails (or a script does not checkpoint on SIGTERM), the %lld "
                 "step(s) since its last checkpoint are lost", (long long)R->steps_lost);
    else
        snprintf(lost, sizeof lost, "if that checkpoint fails (or a script does not checkpoint on SIGTERM), it "
                 "resumes from its last checkpoint");
    static const char stop[] = "this job's ranks get SIGTERM, checkpoint and exit, and it resumes from that "
                               "checkpoint when admitted again";
    const char *kind = victim_kind(s, j, r);
    if (!strcmp(kind, "backfill_overrun")) {
        snprintf(buf, n, "it needs the slots this job holds in queue %s: this job was backfilled ahead of it and ran "
                 "past its predicted end (a backfilled job that overruns is preempted whatever the queues' "
                 "preemption policy); %s; %s", rq, stop, lost);
        return kind;
    }
    if (!strcmp(kind, "priority")) {
        /* the preemptor's priority, as its id, is for readers of its own project (sched_job_name):
         * another project's member learns that it is higher, not what it is */
        char prio[160];
        bool theirs = J->project_name && R->project_name ? strcmp(J->project_name, R->project_name) == 0
                                                         : J->project_name == R->project_name;
        if (theirs)
            snprintf(prio, sizeof prio, "the higher priority in queue %.63s (%d, this job %d)", qn, J->priority,
                     R->priority);
        else
            snprintf(prio, sizeof prio, "a higher priority in queue %.63s than this job's (%d)", qn, R->priority);
        snprintf(buf, n, "it needs this job's slots and has %s; allowed by queue %s's preemption.within_queue (%s); "
                 "%s; %s", prio, qn, sched_within_names[Q ? Q->within : 0], stop, lost);
        return "priority";
    }
    snprintf(buf, n, "its queue %s reclaims the quota queue %s borrows, which this job holds; allowed by queue %s's "
             "preemption.reclaim_within_cohort (%s); %s; %s", qn, rq, qn, sched_reclaim_names[Q ? Q->reclaim : 0],
             stop, lost);
    return "reclaim";
}

/* Appends to buf (n bytes, len used) what fmt makes, as much as fits; returns the new length. */
static size_t text_cat(char *buf, size_t n, size_t len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static size_t text_cat(char *buf, size_t n, size_t len, const char *fmt, ...)
{
    if (len + 1 >= n)
        return len;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + len, n - len, fmt, ap);
    va_end(ap);
    return w < 0 ? len : KILN_MIN(len + (size_t)w, n - 1);
}

const char *sched_preemptor_reason(const sched_snapshot_t *s, int j, const int *victims, int nv, char *buf,
                                   size_t n)
{
    const sched_job_t *J = &s->jobs[j];
    const sched_queue_t *Q = J->queue >= 0 && J->queue < s->nqueues ? &s->queues[J->queue] : NULL;
    const char *qn = Q ? Q->name : "?";
    /* the victims, each named whole or counted at the end (as the decision's reason names them) */
    char names[320];
    size_t len = 0;
    int named = 0, slots = 0;
    for (int k = 0; k < nv; k++) {
        const sched_running_t *V = &s->running[victims[k]];
        char name[SCHED_JOB_NAME_LEN];
        sched_job_name(J->project_name, V->id, V->project_name, name, sizeof name);
        slots += V->nodes * V->slots_per_node;
        size_t need = strlen(name) + 2 + (k + 1 < nv ? sizeof " and 1000 more" : 0);
        if (named == k && len + need < sizeof names) {
            len = text_cat(names, sizeof names, len, "%s%s", k ? ", " : "", name);
            named++;
        }
    }
    if (named < nv)
        len = text_cat(names, sizeof names, len, " and %d more", nv - named);
    names[len] = '\0';
    /* the workers whose slots they free, each once */
    char where[200];
    size_t wl = 0;
    int nworkers = 0, unnamed = 0;
    for (int k = 0; k < nv; k++) {
        const sched_running_t *V = &s->running[victims[k]];
        for (int d = 0; d < V->nodes; d++) {
            bool seen = false;
            for (int e = 0; e <= k && !seen; e++)
                for (int f = 0; f < (e < k ? s->running[victims[e]].nodes : d) && !seen; f++)
                    seen = s->running[victims[e]].worker[f] == V->worker[d];
            if (seen)
                continue;
            const char *wid = V->worker[d] >= 0 && V->worker[d] < s->nworkers ? s->workers[V->worker[d]].id : "?";
            if (!unnamed && wl + strlen(wid) + 2 + sizeof " and 1000 more" < sizeof where)
                wl = text_cat(where, sizeof where, wl, "%s%s", nworkers ? ", " : "", wid);
            else
                unnamed++;
            nworkers++;
        }
    }
    if (unnamed)
        wl = text_cat(where, sizeof where, wl, " and %d more", unnamed);
    where[wl] = '\0';
    len = (size_t)snprintf(buf, n, "preempting %s for %d %s slot(s) on worker%s %s:", names, slots,
                           sched_slot_type_name(J->type), nworkers == 1 ? "" : "s", where);
    len = KILN_MIN(len, n ? n - 1 : 0);
    /* each rule that allowed one of them, once */
    bool by_priority = false, by_reclaim = false, by_overrun = false;
    for (int k = 0; k < nv; k++) {
        const char *kind = victim_kind(s, j, victims[k]);
        by_priority |= !strcmp(kind, "priority");
        by_reclaim |= !strcmp(kind, "reclaim");
        by_overrun |= !strcmp(kind, "backfill_overrun");
    }
    const char *sep = " ";
    if (by_priority) {
        len = text_cat(buf, n, len, "%slower priority in queue %s, allowed by queue %s's preemption.within_queue (%s)",
                       sep, qn, qn, sched_within_names[Q ? Q->within : 0]);
        sep = "; ";
    }
    if (by_reclaim) {
        /* the borrowing queues, each once */
        char lenders[160];
        size_t ll = 0;
        int nq = 0;
        for (int k = 0; k < nv; k++) {
            const sched_running_t *V = &s->running[victims[k]];
            bool seen = strcmp(victim_kind(s, j, victims[k]), "reclaim") != 0;
            for (int e = 0; e < k && !seen; e++)
                seen = s->running[victims[e]].queue == V->queue && !strcmp(victim_kind(s, j, victims[e]), "reclaim");
            if (!seen)
                ll = text_cat(lenders, sizeof lenders, ll, "%s%s", nq++ ? ", " : "",
                              V->queue >= 0 && V->queue < s->nqueues ? s->queues[V->queue].name : "?");
        }
        lenders[ll] = '\0';
        len = text_cat(buf, n, len, "%squeue %s reclaims the quota queue%s %s %s", sep, qn, nq == 1 ? "" : "s",
                       lenders, nq == 1 ? "borrows" : "borrow");
        len = text_cat(buf, n, len, ", allowed by queue %s's preemption.reclaim_within_cohort (%s)", qn,
                       sched_reclaim_names[Q ? Q->reclaim : 0]);
        sep = "; ";
    }
    if (by_overrun) {
        len = text_cat(buf, n, len, "%sbackfilled ahead of it and past their predicted end (preempted whatever the "
                       "queues' preemption policy)", sep);
        sep = "; ";
    }
    text_cat(buf, n, len, "; it starts once they have stopped");
    return buf;
}

/* ---- backfill ------------------------------------------------------------------------------- */

/* Whether head b passes its quota check with the queues' usage use[] (a->usage swapped). */
static bool quota_ok_with(admit_t *a, int b, int (*use)[SCHED_NTYPES])
{
    int (*saved)[SCHED_NTYPES] = a->usage;
    char why[300];
    a->usage = use;
    bool ok = quota_check(a, b, why, sizeof why) == 0;
    a->usage = saved;
    return ok;
}

/* A change to the slots and quota of one slot type: a job ending (its slots and usage come back)
 * or a blocked head starting at its earliest start (it takes its reservation). */
typedef struct change {
    double t;
    int sign;               /* +1: slots come back; -1: a head takes them */
    int queue, size, spn, nodes;
    const int *worker;      /* [nodes] */
} change_t;

static int change_cmp(const void *x, const void *y)
{
    const change_t *a = x, *b = y;
    return a->t < b->t ? -1 : a->t > b->t;
}

/* Applies change c (dir 1) or undoes it (dir -1) to a->view and use[]. */
static void apply(admit_t *a, const change_t *c, int type, int (*use)[SCHED_NTYPES], int dir)
{
    const sched_snapshot_t *s = a->snap;
    for (int x = 0; x < c->nodes; x++) {
        int w = c->worker[x];
        if (w >= 0 && w < s->nworkers && a->view[w].slots > 0)
            a->view[w].slots_free += dir * c->sign * c->spn;
    }
    if (c->queue >= 0 && c->queue < s->nqueues)
        use[c->queue][type] -= dir * c->sign * c->size;
}

/* The earliest time the m-th blocked head (a->hk[m], waiting for free slots or for quota) could
 * start, by the predicted ends of the jobs holding slots of its type (jobs STOPPING end now, jobs
 * admitted this pass end after their run time) and the reservations of the heads before it
 * (a->hk[0..m)): they take their slots and quota at their earliest starts and give them back after
 * their predicted run times (never, without one; with skip, heads without a prediction are left
 * out instead, when they would keep it from ever starting). It is the first such time at which its quota
 * check passes and its gang fits with what the heads before it take later while it would run
 * (until its predicted end; for ever without one) already taken. < 0 when a job holding slots has
 * no prediction (it might end sooner than predicted ones, and the head then start sooner). When
 * known, sets a->pl[m] (the slots it reserves), extra[w]: what worker w has free then beyond them,
 * which a job may hold longer, and use[] (per queue): the queues' usage then, without the head,
 * which jobs that hold slots longer add to. */
static double earliest_start(admit_t *a, int m, const sched_decision_t *out, const int *order, int nadmitted,
                             bool skip, int *extra, int (*use)[SCHED_NTYPES])
{
    const sched_snapshot_t *s = a->snap;
    int b = a->blocker[a->hk[m]];
    const sched_job_t *B = &s->jobs[b];
    sched_request_t req = {.nodes = B->nodes, .slots_per_node = B->slots_per_node,
                           .slot_type = sched_slot_type_name(B->type)};
    int cap = s->nrunning + nadmitted + 2 * m;
    change_t *ev = calloc((size_t)KILN_MAX(cap, 1), sizeof(*ev));
    int *takes = calloc((size_t)KILN_MAX(m, 1), sizeof(*takes)); /* the heads' takes, as indices into ev */
    if (!ev || !takes) {
        free(ev);
        free(takes);
        return -1;
    }
    int n = 0;
    bool unknown = false;
    for (int r = 0; r < s->nrunning; r++) {
        const sched_running_t *R = &s->running[r];
        if (R->type != B->type)
            continue;
        double end = R->freeing || a->taken[r] ? s->now_s : R->end_s;
        unknown = unknown || end < 0;
        ev[n++] = (change_t){.t = KILN_MAX(end, s->now_s), .sign = 1, .queue = R->queue,
                             .size = R->nodes * R->slots_per_node, .spn = R->slots_per_node, .nodes = R->nodes,
                             .worker = R->worker};
    }
    for (int k = 0; k < nadmitted; k++) {
        const sched_job_t *J = &s->jobs[order[k]];
        if (J->type != B->type)
            continue;
        unknown = unknown || J->runtime_s < 0;
        ev[n++] = (change_t){.t = s->now_s + J->runtime_s, .sign = 1, .queue = J->queue, .size = job_size(J),
                             .spn = J->slots_per_node, .nodes = out[order[k]].pl.nodes,
                             .worker = out[order[k]].pl.worker};
    }
    for (int h = 0; h < m; h++) {
        const sched_job_t *H = &s->jobs[a->blocker[a->hk[h]]];
        if (H->type != B->type || a->at[a->hk[h]] < 0 || (skip && H->runtime_s < 0))
            continue;
        change_t c = {.t = a->at[a->hk[h]], .sign = -1, .queue = H->queue, .size = job_size(H),
                      .spn = H->slots_per_node, .nodes = a->pl[h].nodes, .worker = a->pl[h].worker};
        ev[n++] = c;
        if (H->runtime_s >= 0) {
            c.t += H->runtime_s;
            c.sign = 1;
            ev[n++] = c;
        }
    }
    double at = -1;
    if (!unknown) {
        qsort(ev, (size_t)n, sizeof(*ev), change_cmp);
        int nt = 0;
        for (int x = 0; x < n; x++)
            if (ev[x].sign < 0)
                takes[nt++] = x;
        job_view(a, b);
        for (int q = 0; q < s->nqueues; q++)
            for (int t = 0; t < SCHED_NTYPES; t++)
                use[q][t] = a->usage[q][t];
        for (int k = 0; k < n && at < 0; k++) {
            apply(a, &ev[k], B->type, use, 1);
            if (k < n - 1 && ev[k + 1].t <= ev[k].t)
                continue;
            /* what the heads before it take later, while it would run: taken now (conservative:
             * what ends meanwhile is not counted back) */
            double until = B->runtime_s >= 0 ? ev[k].t + B->runtime_s : 1e300;
            for (int x = 0; x < nt; x++)
                if (takes[x] > k && ev[takes[x]].t < until)
                    apply(a, &ev[takes[x]], B->type, use, 1);
            if (quota_ok_with(a, b, use) && sched_place(a->view, s->nworkers, &req, &a->pl[m])) {
                at = ev[k].t;
                for (int i = 0; i < s->nworkers; i++) /* workers it may not use: what is free now */
                    extra[i] = a->view[i].slots > 0 ? a->view[i].slots_free : a->w[i].slots_free;
                for (int x = 0; x < a->pl[m].nodes; x++)
                    extra[a->pl[m].worker[x]] -= B->slots_per_node;
            }
            for (int x = 0; at < 0 && x < nt; x++)
                if (takes[x] > k && ev[takes[x]].t < until)
                    apply(a, &ev[takes[x]], B->type, use, -1);
        }
    }
    free(ev);
    free(takes);
    return at;
}

/* Whether head b waits for free slots or for quota, which backfill may go around. */
static bool waits(const sched_decision_t *out, int b)
{
    return b >= 0 && (out[b].outcome == SCHED_WAIT_SLOTS || out[b].outcome == SCHED_WAIT_QUOTA);
}

/* Whether the blocked head of key k waits for free slots or quota with a known earliest start. */
static bool reserves(const admit_t *a, const sched_decision_t *out, int k)
{
    return waits(out, a->blocker[k]) && a->at[k] >= 0;
}

/* Whether job j, holding its slots past the earliest start of every head of its slot type that it
 * would outlast (end), leaves each of them its quota then. */
static bool quota_past_heads(admit_t *a, const sched_decision_t *out, int j, double end)
{
    const sched_snapshot_t *s = a->snap;
    const sched_job_t *J = &s->jobs[j];
    int nkeys = KILN_MAX(s->nqueues, 1) * SCHED_NTYPES;
    bool ok = true;
    for (int k = J->type; ok && k < nkeys; k += SCHED_NTYPES) {
        if (!reserves(a, out, k) || end <= a->at[k])
            continue;
        int (*use)[SCHED_NTYPES] = &a->usage_at[(size_t)k * s->nqueues];
        use[J->queue][J->type] += job_size(J);
        ok = quota_ok_with(a, a->blocker[k], use);
        use[J->queue][J->type] -= job_size(J);
    }
    return ok;
}

/* Adds job j's usage to the usage at the earliest start of every head it outlasts. */
static void hold_past_heads(admit_t *a, const sched_decision_t *out, int j, double end)
{
    const sched_snapshot_t *s = a->snap;
    const sched_job_t *J = &s->jobs[j];
    int nkeys = KILN_MAX(s->nqueues, 1) * SCHED_NTYPES;
    for (int k = J->type; k < nkeys; k += SCHED_NTYPES)
        if (reserves(a, out, k) && end > a->at[k])
            a->usage_at[(size_t)k * s->nqueues + (size_t)J->queue][J->type] += job_size(J);
}

/* Starts jobs behind the blocked head b of (queue q, type t) (key kb) that end by its earliest
 * start, or that fit the slots and quota it leaves free then (a->extra, a->usage_at), and likewise
 * for every other head of their slot type waiting for free slots or quota. */
static void backfill(admit_t *a, int kb, sched_decision_t *out, int *order, int *nadmitted)
{
    const sched_snapshot_t *s = a->snap;
    int b = a->blocker[kb];
    const sched_job_t *B = &s->jobs[b];
    int nkeys = KILN_MAX(s->nqueues, 1) * SCHED_NTYPES, nw = s->nworkers;
    if (a->at[kb] < 0)
        return;
    for (int j = 0; j < s->njobs; j++) {
        const sched_job_t *J = &s->jobs[j];
        if (out[j].outcome || J->queue != B->queue || J->type != B->type || J->runtime_s < 0)
            continue;
        double at = a->at[kb];
        double end = s->now_s + J->runtime_s;
        char why[300];
        if (quota_check(a, j, why, sizeof why) != 0 || (!entitled(a, j) && a->no_borrow[qt(J->queue, J->type)])
            || !quota_past_heads(a, out, j, end))
            continue;
        sched_request_t req = {.nodes = J->nodes, .slots_per_node = J->slots_per_node,
                               .slot_type = sched_slot_type_name(J->type)};
        sched_decision_t *d = &out[j];
        job_view(a, j);
        /* past a head's earliest start, only in the slots that head leaves free then */
        for (int k = J->type; k < nkeys; k += SCHED_NTYPES)
            for (int i = 0; reserves(a, out, k) && end > a->at[k] && i < nw; i++)
                a->view[i].slots_free = KILN_MAX(0, KILN_MIN(a->view[i].slots_free, a->extra[k * nw + i]));
        if (!sched_place(a->view, nw, &req, &d->pl))
            continue;
        for (int k = J->type; k < nkeys; k += SCHED_NTYPES)
            for (int x = 0; reserves(a, out, k) && end > a->at[k] && x < d->pl.nodes; x++)
                a->extra[k * nw + d->pl.worker[x]] -= J->slots_per_node;
        hold_past_heads(a, out, j, end);
        take(a, j, d, !entitled(a, j));
        d->backfilled = true;
        d->behind_head = b;
        d->end_s = end;
        d->head_start_s = at;
        order[(*nadmitted)++] = j;
    }
}

/* Head j blocks the jobs behind it in key (queue, type). */
static void block(admit_t *a, int key, int j)
{
    a->blocker[key] = j;
    a->hk[a->nh++] = key;
}

/* Tries the head job j; writes out[j]. Returns true when it was admitted. */
static bool try_job(admit_t *a, int j, sched_decision_t *out)
{
    const sched_snapshot_t *s = a->snap;
    const sched_job_t *J = &s->jobs[j];
    const sched_queue_t *Q = &s->queues[J->queue];
    sched_decision_t *d = &out[j];
    const char *tn = sched_slot_type_name(J->type);
    int key = qt(J->queue, J->type);
    sched_request_t req = {.nodes = J->nodes, .slots_per_node = J->slots_per_node, .slot_type = tn};
    int eligible = job_view(a, j);
    if (s->nworkers == 0) {
        d->outcome = SCHED_WAIT_WORKERS;
        snprintf(d->reason, sizeof d->reason, "waiting for workers: no worker is alive");
        return false;
    }
    if (eligible == 0) {
        d->outcome = SCHED_WAIT_WORKERS;
        snprintf(d->reason, sizeof d->reason, "waiting for workers: no alive %s worker's --data-root holds every "
                 "file the job reads", tn);
        return false;
    }
    if (!sched_fits(a->view, s->nworkers, &req)) {
        int largest = 0; /* the same words as the reason a submission starts with (job.c) */
        for (int i = 0; i < s->nworkers; i++)
            if (!strcmp(a->view[i].slot_type, tn))
                largest = KILN_MAX(largest, a->view[i].slots);
        d->outcome = SCHED_WAIT_WORKERS;
        snprintf(d->reason, sizeof d->reason, "waiting for workers: needs %d worker(s) with %d %s slot(s) each, "
                 "more than the alive workers have (the largest alive %s worker has %d)", J->nodes,
                 J->slots_per_node, tn, tn, largest);
        return false;
    }
    int q = quota_check(a, j, d->reason, sizeof d->reason);
    if (q == SCHED_WAIT_NEVER_QUOTA) {
        d->outcome = SCHED_WAIT_NEVER_QUOTA;
        return false;
    }
    if (q) {
        d->outcome = SCHED_WAIT_QUOTA;
        block(a, key, j);
        /* within its queue's nominal quota it waits for the quota its cohort lent out: the
         * borrowers may not take back what frees meanwhile (a victim preempted for it was
         * readmitted, borrowing, into the slot it had freed, and preempted again, without end) */
        if (entitled(a, j) && has_cohort(Q))
            for (int r = 0; r < s->nqueues; r++)
                if (same_cohort(Q, &s->queues[r]))
                    a->no_borrow[qt(r, J->type)] = true;
        try_preempt(a, j, out);
        return false;
    }
    bool within = entitled(a, j);
    if (!within && a->no_borrow[key]) {
        d->outcome = SCHED_WAIT_SLOTS;
        snprintf(d->reason, sizeof d->reason, "waiting for free slots: needs %d worker(s) with %d free %s slot(s) "
                 "each, and queue %s would borrow them while a job within its cohort's quota waits for them",
                 J->nodes, J->slots_per_node, tn, Q->name);
        block(a, key, j);
        return false;
    }
    if (!sched_place(a->view, s->nworkers, &req, &d->pl)) {
        d->outcome = SCHED_WAIT_SLOTS;
        snprintf(d->reason, sizeof d->reason, "waiting for free slots: needs %d worker(s) with %d free %s slot(s) each",
                 J->nodes, J->slots_per_node, tn);
        block(a, key, j);
        if (within && has_cohort(Q))
            for (int r = 0; r < s->nqueues; r++)
                if (same_cohort(Q, &s->queues[r]))
                    a->no_borrow[qt(r, J->type)] = true;
        try_preempt(a, j, out);
        return false;
    }
    take(a, j, d, !within);
    return true;
}

int sched_admit(const sched_snapshot_t *s, sched_decision_t *out, int *order, int *nadmitted)
{
    *nadmitted = 0;
    for (int j = 0; j < s->njobs; j++)
        memset(&out[j], 0, sizeof(out[j]));
    int nkeys = KILN_MAX(s->nqueues, 1) * SCHED_NTYPES;
    admit_t a = {.snap = s};
    a.w = calloc((size_t)KILN_MAX(s->nworkers, 1), sizeof(*a.w));
    a.view = calloc((size_t)KILN_MAX(s->nworkers, 1), sizeof(*a.view));
    a.usage = calloc((size_t)KILN_MAX(s->nqueues, 1), sizeof(*a.usage));
    a.proj = calloc((size_t)KILN_MAX(s->nprojects, 1), sizeof(*a.proj));
    a.next = calloc((size_t)nkeys, sizeof(*a.next));
    a.blocker = calloc((size_t)nkeys, sizeof(*a.blocker));
    a.no_borrow = calloc((size_t)nkeys, sizeof(*a.no_borrow));
    a.taken = calloc((size_t)KILN_MAX(s->nrunning, 1), sizeof(*a.taken));
    a.cand = calloc((size_t)KILN_MAX(s->nrunning, 1), sizeof(*a.cand));
    a.at = calloc((size_t)nkeys, sizeof(*a.at));
    a.extra = calloc((size_t)nkeys * (size_t)KILN_MAX(s->nworkers, 1), sizeof(*a.extra));
    a.hk = calloc((size_t)nkeys, sizeof(*a.hk));
    a.pl = calloc((size_t)nkeys, sizeof(*a.pl));
    a.usage_at = calloc((size_t)nkeys * (size_t)KILN_MAX(s->nqueues, 1), sizeof(*a.usage_at));
    int rc = 0;
    if (!a.w || !a.view || !a.usage || !a.proj || !a.next || !a.blocker || !a.no_borrow || !a.taken || !a.cand
        || !a.at || !a.extra || !a.hk || !a.pl || !a.usage_at) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (int i = 0; i < s->nworkers; i++) {
        a.w[i] = s->workers[i];
        int t = sched_slot_type(s->workers[i].slot_type);
        if (t >= 0)
            a.total[t] += s->workers[i].slots;
    }
    for (int t = 0; t < SCHED_NTYPES; t++)
        if (a.total[t] <= 0)
            a.total[t] = 1;
    for (int q = 0; q < s->nqueues; q++)
        for (int t = 0; t < SCHED_NTYPES; t++)
            a.usage[q][t] = s->queues[q].usage[t];
    for (int p = 0; p < s->nprojects; p++)
        a.proj[p] = s->project_usage[p];
    for (int k = 0; k < nkeys; k++)
        a.blocker[k] = -1;
    /* A job of an unknown queue or slot type waits with a reason and takes part in nothing. */
    for (int j = 0; j < s->njobs; j++) {
        const sched_job_t *J = &s->jobs[j];
        if (J->queue < 0 || J->queue >= s->nqueues || J->type < 0 || J->type >= SCHED_NTYPES) {
            out[j].outcome = SCHED_WAIT_WORKERS;
            snprintf(out[j].reason, sizeof out[j].reason, "waiting for its queue or slot type to exist");
        }
    }
    for (;;) {
        int best = -1;
        bool best_in = false;
        double best_share = 0;
        for (int q = 0; q < s->nqueues; q++)
            for (int t = 0; t < SCHED_NTYPES; t++) {
                if (a.blocker[qt(q, t)] >= 0)
                    continue;
                int j = head(&a, out, q, t);
                if (j < 0)
                    continue;
                bool in = entitled(&a, j);
                double sh = share(&a, q);
                bool better = best < 0 || (in && !best_in)
                    || (in == best_in && (sh < best_share || (sh == best_share
                        && (s->jobs[j].priority > s->jobs[best].priority
                            || (s->jobs[j].priority == s->jobs[best].priority && j < best)))));
                if (better) {
                    best = j;
                    best_in = in;
                    best_share = sh;
                }
            }
        if (best < 0)
            break;
        if (try_job(&a, best, out))
            order[(*nadmitted)++] = best;
    }
    /* Jobs behind a head that waits for free slots or quota start now when they end before it can
     * (or leave it the slots and quota it takes then). Each head's reservation counts the heads that
     * blocked before it; then each head's slots and quota then lose what heads after it hold then. */
    for (int k = 0; k < nkeys; k++)
        a.at[k] = -1;
    for (int m = 0; m < a.nh; m++) {
        int k = a.hk[m];
        for (int skip = 0; skip < 2 && a.at[k] < 0 && waits(out, a.blocker[k]); skip++)
            a.at[k] = earliest_start(&a, m, out, order, *nadmitted, skip, &a.extra[(size_t)k * s->nworkers],
                                     &a.usage_at[(size_t)k * s->nqueues]);
    }
    for (int m = 0; m < a.nh; m++)
        for (int h = m + 1; reserves(&a, out, a.hk[m]) && h < a.nh; h++) {
            int k = a.hk[m], kh = a.hk[h];
            const sched_job_t *H = &s->jobs[a.blocker[kh]];
            if (!reserves(&a, out, kh) || H->type != s->jobs[a.blocker[k]].type || a.at[kh] > a.at[k]
                || (H->runtime_s >= 0 && a.at[kh] + H->runtime_s <= a.at[k]))
                continue;
            for (int x = 0; x < a.pl[h].nodes; x++)
                a.extra[(size_t)k * s->nworkers + (size_t)a.pl[h].worker[x]] -= H->slots_per_node;
            a.usage_at[(size_t)k * s->nqueues + (size_t)H->queue][H->type] += job_size(H);
        }
    for (int k = 0; k < nkeys; k++)
        if (reserves(&a, out, k)) {
            out[a.blocker[k]].head_start_s = a.at[k];
            backfill(&a, k, out, order, nadmitted);
        }
    /* Everything left waits behind its queue's blocked head. */
    for (int j = 0; j < s->njobs; j++) {
        if (out[j].outcome)
            continue;
        const sched_job_t *J = &s->jobs[j];
        int b = a.blocker[qt(J->queue, J->type)];
        char name[SCHED_JOB_NAME_LEN];
        if (b >= 0)
            sched_job_name(J->project_name, s->jobs[b].id, s->jobs[b].project_name, name, sizeof name);
        out[j].outcome = SCHED_WAIT_BEHIND;
        snprintf(out[j].reason, sizeof out[j].reason, "waiting behind %s in queue %s (higher priority or "
                 "submitted earlier)", b >= 0 ? name : "job ?", s->queues[J->queue].name);
    }
out:
    free(a.w);
    free(a.view);
    free(a.usage);
    free(a.proj);
    free(a.next);
    free(a.blocker);
    free(a.no_borrow);
    free(a.taken);
    free(a.cand);
    free(a.at);
    free(a.extra);
    free(a.hk);
    free(a.pl);
    free(a.usage_at);
    return rc;
}
