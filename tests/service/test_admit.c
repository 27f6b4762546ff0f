/* test_admit.c - admission (sched_admit) as a pure function: worked examples of quotas, borrowing,
 * lending limits, DRF between queues and fair sharing between projects, then property-based runs:
 * a seeded random cluster and job stream on a virtual clock where, after every pass, no worker is
 * over-committed, no queue is above its nominal quota plus its borrowing limit, no cohort lends
 * more than its queues' lending limits allow, gangs are whole on distinct workers of their slot
 * type, a queue's jobs start in order, and in the end every job that can ever fit has run. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/service.h"

#define U SCHED_UNLIMITED
#define W(id_, type_, total_, free_) {.id = id_, .slot_type = type_, .slots = total_, .slots_free = free_}

static sched_queue_t queue(const char *name, const char *cohort, int cpu, int gpu)
{
    sched_queue_t q = {.name = name, .cohort = cohort, .quota = {cpu, gpu}, .borrowing_limit = {U, U},
                       .lending_limit = {U, U}, .weight = 1};
    return q;
}

static sched_job_t job(const char *id, int q, int prio, int nodes, int spn, int type)
{
    sched_job_t j = {.id = id, .queue = q, .project = -1, .priority = prio, .nodes = nodes, .slots_per_node = spn,
                     .type = type, .runtime_s = -1};
    return j;
}

/* Runs one pass; out has room for 64 jobs. Returns how many were admitted. */
static int pass(const sched_worker_t *w, int nw, const sched_queue_t *q, int nq, const sched_job_t *j, int nj,
                sched_decision_t *out, int *order)
{
    sched_snapshot_t s = {.workers = w, .nworkers = nw, .queues = q, .nqueues = nq, .jobs = j, .njobs = nj};
    int n = -1;
    cr_assert_eq(sched_admit(&s, out, order, &n), 0);
    return n;
}

Test(admit, borrows_what_the_cohort_lends)
{
    sched_worker_t w[] = {W("a", "cpu", 8, 8)};
    sched_queue_t q[] = {queue("nlp", "research", 4, 0), queue("cv", "research", 4, 0)};
    sched_job_t j[] = {job("j1", 0, 0, 1, 6, 0), job("j2", 0, 0, 1, 2, 0), job("j3", 1, 0, 1, 1, 0)};
    sched_decision_t out[3];
    int order[3];
    cr_assert_eq(pass(w, 1, q, 2, j, 3, out, order), 2);
    cr_assert_eq(order[0], 2, "cv's job stays within cv's quota: it goes before nlp's borrowing");
    cr_assert_eq(out[0].outcome, SCHED_ADMITTED);
    cr_assert(out[0].borrowed, "6 of a quota of 4 borrows");
    cr_assert_not(out[2].borrowed);
    cr_assert_eq(out[1].outcome, SCHED_WAIT_QUOTA, "%s", out[1].reason);
    cr_assert_str_eq(out[1].reason, "waiting for quota: needs 2 cpu slot(s); queue nlp: quota 4, used 6, may borrow "
                                    "what the cohort lends; cohort research: 1 free");
    /* Once nlp has borrowed everything, cv's job within its quota waits for the lent quota to come
     * back (taking it back is preemption's business). */
    q[0].usage[0] = 8;
    cr_assert_eq(pass(w, 1, q, 2, j + 2, 1, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_WAIT_QUOTA, "%d %s", out[0].outcome, out[0].reason);
    cr_assert(strstr(out[0].reason, "queue cv: quota 4, used 0") && strstr(out[0].reason, "cohort research: 0 free"),
              "%s", out[0].reason);
}

Test(admit, borrowing_and_lending_limits)
{
    sched_worker_t w[] = {W("a", "cpu", 16, 16)};
    sched_queue_t q[] = {queue("nlp", "research", 4, 0), queue("cv", "research", 8, 0)};
    q[0].borrowing_limit[0] = 2;
    sched_job_t j[] = {job("j1", 0, 0, 1, 7, 0), job("j2", 0, 0, 1, 6, 0)};
    sched_decision_t out[2];
    int order[2];
    pass(w, 1, q, 2, j, 2, out, order);
    cr_assert_eq(out[0].outcome, SCHED_WAIT_NEVER_QUOTA, "7 > 4 + 2: %s", out[0].reason);
    cr_assert(strstr(out[0].reason, "queue nlp can ever get: its quota (4) plus its borrowing_limit (2) allow at most 6"),
              "%s", out[0].reason);
    cr_assert_eq(out[1].outcome, SCHED_ADMITTED, "6 = 4 + 2: %s", out[1].reason);
    /* cv keeps 5 of its 8: nlp may borrow 3 at most */
    q[0].borrowing_limit[0] = U;
    q[1].lending_limit[0] = 3;
    sched_job_t k[] = {job("k1", 0, 0, 1, 8, 0), job("k2", 0, 0, 1, 7, 0)};
    pass(w, 1, q, 2, k, 2, out, order);
    cr_assert_eq(out[0].outcome, SCHED_WAIT_NEVER_QUOTA, "%s", out[0].reason);
    /* what bounds it is what cv lends, not a lending limit of nlp's own */
    cr_assert(strstr(out[0].reason, "at most 7, its quota (4) plus the 3 the other queues of cohort \"research\" lend"),
              "%s", out[0].reason);
    cr_assert_eq(out[1].outcome, SCHED_ADMITTED, "%s", out[1].reason);
}

Test(admit, no_cohort_no_borrowing)
{
    sched_worker_t w[] = {W("a", "cpu", 8, 8)};
    sched_queue_t q[] = {queue("solo", NULL, 2, 0)};
    q[0].usage[0] = 2;
    sched_job_t j[] = {job("j1", 0, 0, 1, 1, 0), job("j2", 0, 0, 1, 3, 0)};
    sched_decision_t out[2];
    int order[2];
    cr_assert_eq(pass(w, 1, q, 1, j, 2, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_WAIT_QUOTA);
    cr_assert(strstr(out[0].reason, "queue solo: quota 2, used 2, no cohort to borrow from"), "%s", out[0].reason);
    cr_assert_eq(out[1].outcome, SCHED_WAIT_BEHIND, "%s", out[1].reason);
    cr_assert(strstr(out[1].reason, "waiting behind job j1 in queue solo"), "%s", out[1].reason);
}

Test(admit, drf_lowest_weighted_share_first)
{
    /* Both queues borrow from an idle lender; the one with the lower weighted dominant share gets
     * the slot first, whatever the order of the jobs. */
    sched_worker_t w[] = {W("a", "cpu", 10, 2)};
    sched_queue_t q[] = {queue("big", "c", 0, 0), queue("small", "c", 0, 0), queue("lender", "c", 20, 0)};
    q[0].usage[0] = 6;
    q[1].usage[0] = 2;
    sched_job_t j[] = {job("b1", 0, 5, 1, 2, 0), job("s1", 1, 0, 1, 2, 0)};
    sched_decision_t out[2];
    int order[2];
    cr_assert_eq(pass(w, 1, q, 3, j, 2, out, order), 1);
    cr_assert_eq(out[1].outcome, SCHED_ADMITTED, "the lower share goes first: %s", out[0].reason);
    cr_assert_eq(out[0].outcome, SCHED_WAIT_SLOTS);
    /* weight 4 makes big's share 6/10/4 < 2/10 */
    q[0].weight = 4;
    pass(w, 1, q, 3, j, 2, out, order);
    cr_assert_eq(out[0].outcome, SCHED_ADMITTED);
    cr_assert_eq(out[1].outcome, SCHED_WAIT_SLOTS);
}

Test(admit, projects_share_a_queue_by_recent_usage)
{
    sched_worker_t w[] = {W("a", "cpu", 2, 2)};
    sched_queue_t q[] = {queue("default", NULL, U, U)};
    q[0].fair_projects = true;
    double usage[2] = {0, 0};
    sched_job_t j[6];
    char ids[6][16];
    for (int i = 0; i < 5; i++) {
        snprintf(ids[i], sizeof ids[i], "p0-%d", i);
        j[i] = job(ids[i], 0, 0, 1, 1, 0);
        j[i].project = 0;
    }
    j[5] = job("p1-0", 0, 0, 1, 1, 0);
    j[5].project = 1;
    sched_decision_t out[6];
    int order[6], n = 0;
    sched_snapshot_t s = {.workers = w, .nworkers = 1, .queues = q, .nqueues = 1, .jobs = j, .njobs = 6,
                          .project_usage = usage, .nprojects = 2};
    cr_assert_eq(sched_admit(&s, out, order, &n), 0);
    cr_assert_eq(n, 2);
    cr_assert_eq(out[0].outcome, SCHED_ADMITTED);
    cr_assert_eq(out[5].outcome, SCHED_ADMITTED, "project 1's first job is not held back by project 0's five");
    /* without fair sharing: strictly first come first served */
    q[0].fair_projects = false;
    cr_assert_eq(sched_admit(&s, out, order, &n), 0);
    cr_assert_eq(out[1].outcome, SCHED_ADMITTED);
    cr_assert_eq(out[5].outcome, SCHED_WAIT_BEHIND);
    /* with fair sharing, a project that used much recently goes after one that did not */
    q[0].fair_projects = true;
    usage[0] = 0.5;
    usage[1] = 3;
    cr_assert_eq(sched_admit(&s, out, order, &n), 0);
    cr_assert_eq(order[0], 0);
    cr_assert_eq(order[1], 1, "project 0 (0.5 + 1) still below project 1 (3)");
}

Test(admit, priority_within_a_queue_and_entitled_before_borrowers)
{
    /* cv is within its quota and waits for free slots: nlp may not borrow them meanwhile, though
     * its cohort lends enough. */
    sched_worker_t w[] = {W("a", "cpu", 8, 2)};
    sched_queue_t q[] = {queue("nlp", "r", 2, 0), queue("cv", "r", 6, 0), queue("idle", "r", 10, 0)};
    q[0].usage[0] = 2;
    q[1].usage[0] = 3;
    sched_job_t j[] = {job("nlp-1", 0, 9, 1, 1, 0), job("cv-a", 1, 0, 1, 3, 0), job("cv-b", 1, 0, 1, 1, 0)};
    sched_decision_t out[3];
    int order[3];
    cr_assert_eq(pass(w, 1, q, 3, j, 3, out, order), 0);
    cr_assert_eq(out[1].outcome, SCHED_WAIT_SLOTS, "%s", out[1].reason);
    cr_assert_eq(out[2].outcome, SCHED_WAIT_BEHIND, "%s", out[2].reason);
    cr_assert_eq(out[0].outcome, SCHED_WAIT_SLOTS, "%s", out[0].reason);
    cr_assert(strstr(out[0].reason, "would borrow them while a job within its cohort's quota waits"), "%s",
              out[0].reason);
    /* with room for both, both start: cv's first, then nlp's (a lower share than cv's second) */
    w[0].slots_free = 4;
    cr_assert_eq(pass(w, 1, q, 3, j, 3, out, order), 2);
    cr_assert_eq(order[0], 1);
    cr_assert_eq(order[1], 0);
    cr_assert(out[0].borrowed);
}

Test(admit, the_default_queue_is_todays_policy)
{
    /* One unlimited queue without fair sharing: priority, then first come first served; a head
     * that waits for slots blocks its slot type only; one that can never fit blocks nothing. */
    sched_worker_t w[] = {W("a", "cpu", 4, 2), W("g", "gpu", 2, 2)};
    sched_queue_t q[] = {queue("default", NULL, U, U)};
    sched_job_t j[] = {job("huge", 0, 9, 2, 4, 0), job("big", 0, 5, 1, 3, 0), job("gpu", 0, 0, 1, 2, 1),
                       job("small", 0, 0, 1, 1, 0)};
    sched_decision_t out[4];
    int order[4];
    cr_assert_eq(pass(w, 2, q, 1, j, 4, out, order), 1);
    cr_assert_eq(out[0].outcome, SCHED_WAIT_WORKERS);
    cr_assert(strstr(out[0].reason, "more than the alive workers have (the largest alive cpu worker has 4)"), "%s",
              out[0].reason);
    cr_assert_eq(out[1].outcome, SCHED_WAIT_SLOTS);
    cr_assert_str_eq(out[1].reason, "waiting for free slots: needs 1 worker(s) with 3 free cpu slot(s) each");
    cr_assert_eq(out[2].outcome, SCHED_ADMITTED);
    cr_assert_eq(out[3].outcome, SCHED_WAIT_BEHIND);
    sched_decision_t none[1];
    cr_assert_eq(pass(NULL, 0, q, 1, j, 1, none, order), 0);
    cr_assert_str_eq(none[0].reason, "waiting for workers: no worker is alive");
}

/* ---- property-based runs ---------------------------------------------------------------------- */

#define MAXW 10
#define MAXQ 6
#define MAXJ 400

static unsigned rnd(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (*s >> 16) & 0x7fff;
}

typedef struct sim {
    sched_worker_t w[MAXW];
    int nw;
    sched_queue_t q[MAXQ];
    int nq;
    sched_job_t job[MAXJ];  /* every job, in submission order */
    char ids[MAXJ][16];
    int nj;
    int state[MAXJ];        /* 0 not yet submitted, 1 pending, 2 running, 3 done, 4 can never run */
    int ends_at[MAXJ];
    int submit_at[MAXJ];
    sched_placement_t pl[MAXJ];
    double proj[MAXQ * 3];
    unsigned mask[MAXJ];    /* the workers each job's data roots allow */
} sim_t;

/* The eligibility callback: ctx is the pending jobs' worker masks. */
static bool sim_mask(void *ctx, int j, int w)
{
    return (((const unsigned *)ctx)[j] >> w) & 1u;
}

static void sim_make(sim_t *S, unsigned seed)
{
    memset(S, 0, sizeof(*S));
    unsigned s = seed;
    static const char *const cohorts[] = {"a", "b", NULL};
    static const char *const names[] = {"q0", "q1", "q2", "q3", "q4", "q5"};
    static const char *const wids[] = {"w0", "w1", "w2", "w3", "w4", "w5", "w6", "w7", "w8", "w9"};
    S->nw = 2 + (int)(rnd(&s) % (MAXW - 1));
    for (int i = 0; i < S->nw; i++) {
        int slots = 1 + (int)(rnd(&s) % 8);
        S->w[i] = (sched_worker_t){.id = wids[i], .slot_type = rnd(&s) % 4 == 0 ? "gpu" : "cpu", .slots = slots,
                                   .slots_free = slots};
    }
    S->nq = 1 + (int)(rnd(&s) % MAXQ);
    for (int i = 0; i < S->nq; i++) {
        sched_queue_t *q = &S->q[i];
        *q = queue(names[i], cohorts[rnd(&s) % 3], 0, 0);
        for (int t = 0; t < SCHED_NTYPES; t++) {
            q->quota[t] = rnd(&s) % 7 == 0 ? U : (int)(rnd(&s) % 12);
            q->borrowing_limit[t] = rnd(&s) % 2 ? U : (int)(rnd(&s) % 8);
            q->lending_limit[t] = rnd(&s) % 2 ? U : (int)(rnd(&s) % 8);
        }
        q->weight = 0.5 + (rnd(&s) % 4);
        q->fair_projects = rnd(&s) % 2;
    }
    S->nj = 50 + (int)(rnd(&s) % (MAXJ - 50));
    for (int j = 0; j < S->nj; j++) {
        snprintf(S->ids[j], sizeof S->ids[j], "j%d", j);
        int qi = (int)(rnd(&s) % S->nq);
        S->job[j] = job(S->ids[j], qi, (int)(rnd(&s) % 3), 1 + (int)(rnd(&s) % 3), 1 + (int)(rnd(&s) % 4),
                        rnd(&s) % 4 == 0 ? 1 : 0);
        S->job[j].project = qi * 3 + (int)(rnd(&s) % 3);
        S->submit_at[j] = (int)(rnd(&s) % 200);
        S->ends_at[j] = 1 + (int)(rnd(&s) % 20); /* its duration until it starts */
        S->mask[j] = rnd(&s) % 5 == 0 ? (unsigned)rnd(&s) : ~0u;
    }
}

/* The invariants after a pass's admissions have been applied. */
static void sim_check(const sim_t *S, unsigned seed, int now)
{
    for (int i = 0; i < S->nw; i++)
        cr_assert_geq(S->w[i].slots_free, 0, "seed %u t %d: worker %s over-committed", seed, now, S->w[i].id);
    for (int i = 0; i < S->nq; i++)
        for (int t = 0; t < SCHED_NTYPES; t++) {
            const sched_queue_t *q = &S->q[i];
            if (q->quota[t] == U)
                continue;
            int cap = q->quota[t];
            if (q->cohort)
                cap += q->borrowing_limit[t] == U ? 1 << 20 : q->borrowing_limit[t];
            cr_assert_leq(q->usage[t], cap, "seed %u t %d: queue %s uses %d %s, above quota + borrowing limit",
                          seed, now, q->name, q->usage[t], sched_slot_type_name(t));
        }
    /* Each cohort lends no more than its queues' lending limits allow: what queues use beyond what
     * they keep fits what the others lend, so every queue can always reach what it keeps. */
    static const char *const cohorts[] = {"a", "b"};
    for (int c = 0; c < 2; c++)
        for (int t = 0; t < SCHED_NTYPES; t++) {
            int lent = 0, over = 0;
            for (int i = 0; i < S->nq; i++) {
                const sched_queue_t *q = &S->q[i];
                if (!q->cohort || strcmp(q->cohort, cohorts[c]) || q->quota[t] == U)
                    continue;
                int l = q->lending_limit[t] == U ? q->quota[t] : KILN_MIN(q->quota[t], q->lending_limit[t]);
                int keep = q->quota[t] - l;
                lent += l;
                over += KILN_MAX(0, q->usage[t] - keep);
            }
            cr_assert_leq(over, lent, "seed %u t %d: cohort %s %s: %d used beyond what queues keep, %d lent", seed,
                          now, cohorts[c], sched_slot_type_name(t), over, lent);
        }
}

/* Runs one seeded cluster until every job has run or can never run; returns how many ran. */
static int sim_run(unsigned seed)
{
    static sim_t S;
    sim_make(&S, seed);
    sched_job_t pend[MAXJ];
    int idx[MAXJ], order[MAXJ];
    static sched_decision_t out[MAXJ];
    int now = 0;
    for (; now < 5000; now++) {
        /* jobs end, releasing their slots */
        for (int j = 0; j < S.nj; j++)
            if (S.state[j] == 2 && S.ends_at[j] <= now) {
                S.state[j] = 3;
                for (int k = 0; k < S.pl[j].nodes; k++)
                    S.w[S.pl[j].worker[k]].slots_free += S.job[j].slots_per_node;
                S.q[S.job[j].queue].usage[S.job[j].type] -= S.job[j].nodes * S.job[j].slots_per_node;
            } else if (S.state[j] == 0 && S.submit_at[j] <= now) {
                S.state[j] = 1;
            }
        /* the pending jobs in priority order, then oldest first */
        int np = 0;
        for (int prio = 2; prio >= 0; prio--)
            for (int j = 0; j < S.nj; j++)
                if (S.state[j] == 1 && S.job[j].priority == prio) {
                    idx[np] = j;
                    pend[np++] = S.job[j];
                }
        bool live = false;
        for (int j = 0; j < S.nj; j++)
            live = live || S.state[j] < 3;
        if (!live)
            break;
        /* the eligibility callback sees pending indexes: map them back to jobs */
        unsigned masks[MAXJ];
        for (int p = 0; p < np; p++)
            masks[p] = S.mask[idx[p]];
        bool use_mask = seed % 2;
        sched_snapshot_t snap = {.workers = S.w, .nworkers = S.nw, .queues = S.q, .nqueues = S.nq, .jobs = pend,
                                 .njobs = np, .project_usage = S.proj, .nprojects = MAXQ * 3,
                                 .eligible = use_mask ? sim_mask : NULL, .ctx = masks};
        int n = -1;
        cr_assert_eq(sched_admit(&snap, out, order, &n), 0);
        for (int p = 0; p < np; p++) {
            cr_assert(out[p].outcome >= SCHED_ADMITTED && out[p].outcome <= SCHED_WAIT_NEVER_QUOTA);
            if (out[p].outcome != SCHED_ADMITTED)
                cr_assert_neq(out[p].reason[0], '\0', "seed %u: job %s waits without a reason", seed, pend[p].id);
        }
        for (int k = 0; k < n; k++) {
            int p = order[k], j = idx[p];
            const sched_placement_t *pl = &out[p].pl;
            cr_assert_eq(out[p].outcome, SCHED_ADMITTED);
            cr_assert_eq(pl->nodes, S.job[j].nodes, "seed %u: job %s's gang is not whole", seed, S.job[j].id);
            for (int a = 0; a < pl->nodes; a++) {
                const sched_worker_t *w = &S.w[pl->worker[a]];
                cr_assert_str_eq(w->slot_type, sched_slot_type_name(S.job[j].type), "seed %u: job %s on %s", seed,
                                 S.job[j].id, w->id);
                if (use_mask)
                    cr_assert((S.mask[j] >> pl->worker[a]) & 1u, "seed %u: job %s on a worker without its data", seed,
                              S.job[j].id);
                for (int b = 0; b < a; b++)
                    cr_assert_neq(pl->worker[a], pl->worker[b], "seed %u: two nodes of %s on one worker", seed,
                                  S.job[j].id);
                S.w[pl->worker[a]].slots_free -= S.job[j].slots_per_node;
            }
            S.q[S.job[j].queue].usage[S.job[j].type] += S.job[j].nodes * S.job[j].slots_per_node;
            S.proj[S.job[j].project] += S.job[j].nodes * S.job[j].slots_per_node;
            S.state[j] = 2;
            S.pl[j] = *pl;
            S.ends_at[j] += now;
            /* in a queue without fair sharing, nothing ahead of it of its slot type is left waiting
             * for slots or quota */
            if (!S.q[S.job[j].queue].fair_projects)
                for (int e = 0; e < p; e++)
                    if (pend[e].queue == pend[p].queue && pend[e].type == pend[p].type)
                        cr_assert(out[e].outcome == SCHED_ADMITTED || out[e].outcome == SCHED_WAIT_WORKERS
                                      || out[e].outcome == SCHED_WAIT_NEVER_QUOTA,
                                  "seed %u: %s started ahead of %s (%s)", seed, pend[p].id, pend[e].id, out[e].reason);
        }
        /* a job that can never run stays out of the liveness count */
        for (int p = 0; p < np; p++)
            if (out[p].outcome == SCHED_WAIT_WORKERS || out[p].outcome == SCHED_WAIT_NEVER_QUOTA)
                S.state[idx[p]] = 4;
        for (int p = 0; p < S.nq * 3; p++)
            S.proj[p] *= 0.9; /* decaying recent usage */
        sim_check(&S, seed, now);
    }
    int ran = 0;
    for (int j = 0; j < S.nj; j++) {
        cr_assert(S.state[j] == 3 || S.state[j] == 4, "seed %u: job %s never ran (state %d) after %d ticks", seed,
                  S.job[j].id, S.state[j], now);
        ran += S.state[j] == 3;
    }
    return ran;
}

Test(admit, random_clusters_keep_the_invariants, .timeout = 120)
{
    const char *env = getenv("KILN_ADMIT_SEEDS");
    int seeds = env ? atoi(env) : 200;
    int ran = 0, total = 0;
    for (unsigned seed = 1; seed <= (unsigned)seeds; seed++) {
        ran += sim_run(seed);
        total += 1;
    }
    cr_assert_gt(ran, total * 20, "too few jobs ran (%d in %d clusters) for the runs to show much", ran, total);
}

/* ---- preemption and backfill ------------------------------------------------------------------ */

static sched_running_t running(const char *id, int q, int prio, int spn, const int *worker, int64_t lost)
{
    sched_running_t r = {.id = id, .queue = q, .type = 0, .priority = prio, .nodes = 1, .slots_per_node = spn,
                         .worker = worker, .preemptible = true, .steps_lost = lost, .end_s = -1};
    return r;
}

static int pass_running(const sched_worker_t *w, int nw, const sched_queue_t *q, int nq, const sched_job_t *j,
                        int nj, const sched_running_t *r, int nr, double now, sched_decision_t *out, int *order)
{
    sched_snapshot_t s = {.workers = w, .nworkers = nw, .queues = q, .nqueues = nq, .jobs = j, .njobs = nj,
                          .running = r, .nrunning = nr, .now_s = now};
    int n = -1;
    cr_assert_eq(sched_admit(&s, out, order, &n), 0);
    return n;
}

static bool has_victim(const sched_decision_t *d, int r)
{
    for (int k = 0; k < d->nvictims; k++)
        if (d->victims[k] == r)
            return true;
    return false;
}

/* What the pass writes of a job (its reason, a victim's reason) is read by that job's project:
 * a job of another project is "a job of another project", one of its own keeps its id. */
Test(admit, texts_name_only_jobs_of_the_readers_project)
{
    static const int w0[] = {0};
    sched_worker_t w[] = {W("w", "cpu", 4, 0)};
    sched_queue_t q[] = {queue("default", NULL, U, U)};
    q[0].usage[0] = 4;
    sched_running_t r[] = {running("alpha", 0, 0, 2, w0, 1), running("bravo", 0, 0, 2, w0, 1)};
    r[0].project_name = "pa";
    r[1].project_name = "pb";
    sched_job_t j[] = {job("h", 0, 3, 1, 4, 0), job("n", 0, 0, 1, 1, 0)};
    j[0].project_name = "pa";
    j[1].project_name = "pb";
    sched_decision_t out[2];
    int order[2];
    cr_assert_eq(pass_running(w, 1, q, 1, j, 2, r, 2, 0, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_PREEMPTING, "%s", out[0].reason);
    cr_assert(strstr(out[0].reason, "job alpha") && strstr(out[0].reason, "a job of another project")
              && !strstr(out[0].reason, "bravo"), "%s", out[0].reason);
    cr_assert(strstr(out[1].reason, "waiting behind a job of another project in queue default"), "%s", out[1].reason);
    sched_snapshot_t s = {.workers = w, .nworkers = 1, .queues = q, .nqueues = 1, .jobs = j, .njobs = 2,
                          .running = r, .nrunning = 2};
    char why[600];
    /* the victim's reason names no job: svc_job_preempt names the preemptor once, before it; the
     * preemptor's priority is said to its own project's victim (alpha), and to another project's
     * (bravo) only that it is higher */
    for (int v = 0; v < 2; v++) {
        sched_victim_reason(&s, 0, v, why, sizeof why);
        cr_assert(!strstr(why, "job h") && !strstr(why, "another project"), "%s", why);
        cr_assert(strstr(why, v == 0 ? "it needs this job's slots and has the higher priority in queue default (3, "
                                       "this job 0); allowed by"
                                     : "it needs this job's slots and has a higher priority in queue default than "
                                       "this job's (0); allowed by") == why, "%s", why);
        cr_assert(v == 0 || !strstr(why, "3"), "%s", why);
    }
    /* the head's event names its victims as its own project (pa) may read them */
    char note[700];
    sched_preemptor_reason(&s, 0, out[0].victims, out[0].nvictims, note, sizeof note);
    cr_assert(strstr(note, "job alpha") && strstr(note, "a job of another project") && !strstr(note, "bravo"), "%s",
              note);
}

Test(admit, preemption_picks_the_victims_that_lose_least_work)
{
    /* One worker of 4 slots, full. The head (priority 3) needs 2: preempting "old" (2 slots, 10
     * steps since its checkpoint) loses more than "a" and "b" together (3 + 2); "vip" has the
     * higher priority and is never a victim. */
    static const int w0[] = {0};
    sched_worker_t w[] = {W("w", "cpu", 4, 0)};
    sched_queue_t q[] = {queue("default", NULL, U, U)};
    q[0].usage[0] = 4;
    sched_running_t r[] = {running("old", 0, 0, 2, w0, 10), running("a", 0, 0, 1, w0, 3),
                           running("b", 0, 1, 1, w0, 2)};
    sched_job_t j[] = {job("head", 0, 3, 1, 2, 0), job("next", 0, 3, 1, 1, 0)};
    sched_decision_t out[2];
    int order[2];
    cr_assert_eq(pass_running(w, 1, q, 1, j, 2, r, 3, 0, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_PREEMPTING, "%s", out[0].reason);
    cr_assert_eq(out[0].nvictims, 2);
    cr_assert(has_victim(&out[0], 1) && has_victim(&out[0], 2));
    cr_assert(strstr(out[0].reason, "a") && strstr(out[0].reason, "preempted"), "%s", out[0].reason);
    cr_assert_eq(out[1].outcome, SCHED_WAIT_BEHIND, "one head preempts at a time: %s", out[1].reason);
    char why[600];
    sched_snapshot_t s = {.workers = w, .nworkers = 1, .queues = q, .nqueues = 1, .jobs = j, .njobs = 2,
                          .running = r, .nrunning = 3};
    sched_victim_reason(&s, 0, 1, why, sizeof why);
    /* what the stop does, each once: the ranks checkpoint on SIGTERM; the steps since the last
     * checkpoint are lost only if that fails */
    cr_assert_str_eq(why, "it needs this job's slots and has the higher priority in queue default (3, this job 0); "
                          "allowed by queue default's preemption.within_queue (lower_priority); this job's ranks get "
                          "SIGTERM, checkpoint and exit, and it resumes from that checkpoint when admitted again; if "
                          "that checkpoint fails (or a script does not checkpoint on SIGTERM), the 3 step(s) since "
                          "its last checkpoint are lost");
    /* the head's event names both victims, their slots and worker, and the rule once */
    char note[700];
    cr_assert_str_eq(sched_preemptor_reason(&s, 0, out[0].victims, out[0].nvictims, note, sizeof note),
                     out[0].victims[0] == 1
                         ? "preempting job a, job b for 2 cpu slot(s) on worker w: lower priority in queue default, "
                           "allowed by queue default's preemption.within_queue (lower_priority); it starts once "
                           "they have stopped"
                         : "preempting job b, job a for 2 cpu slot(s) on worker w: lower priority in queue default, "
                           "allowed by queue default's preemption.within_queue (lower_priority); it starts once "
                           "they have stopped");

    /* An equal-priority head preempts nothing, and neither does one whose victims are stopping:
     * "old" STOPPING frees 2 slots, enough for the head. */
    j[0].priority = 0;
    cr_assert_eq(pass_running(w, 1, q, 1, j, 1, r, 3, 0, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_WAIT_SLOTS);
    j[0].priority = 3;
    r[0].freeing = true;
    cr_assert_eq(pass_running(w, 1, q, 1, j, 1, r, 3, 0, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_WAIT_SLOTS, "%s", out[0].reason);
    cr_assert(strstr(out[0].reason, "stopping now are freeing"), "%s", out[0].reason);
    /* Stopping jobs count first: a head of 3 slots needs only one more victim, the cheapest. */
    j[0].slots_per_node = 3;
    cr_assert_eq(pass_running(w, 1, q, 1, j, 1, r, 3, 0, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_PREEMPTING);
    cr_assert_eq(out[0].nvictims, 1);
    cr_assert_eq(out[0].victims[0], 2);
}

Test(admit, protected_after_k_preemptions_and_never_back_and_forth)
{
    /* Queue a borrows 2 of b's quota with job "a1"; b's job within its quota reclaims them,
     * unless a1 was preempted k times (the default 3) and b1's priority is not above a1's. */
    static const int w0[] = {0};
    sched_worker_t w[] = {W("w", "cpu", 4, 0)};
    sched_queue_t q[] = {queue("a", "c", 2, 0), queue("b", "c", 2, 0)};
    q[0].usage[0] = 4;
    sched_running_t r[] = {running("a1", 0, 0, 4, w0, 0)};
    sched_job_t j[] = {job("b1", 1, 0, 1, 2, 0)};
    sched_decision_t out[1];
    int order[1];
    r[0].preemptions = 2;
    cr_assert_eq(pass_running(w, 1, q, 2, j, 1, r, 1, 0, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_PREEMPTING, "%s", out[0].reason);
    r[0].preemptions = 3;
    cr_assert_eq(pass_running(w, 1, q, 2, j, 1, r, 1, 0, out, order), 0);
    cr_assert_neq(out[0].outcome, SCHED_PREEMPTING, "a protected job was chosen");
    j[0].priority = 1;
    cr_assert_eq(pass_running(w, 1, q, 2, j, 1, r, 1, 0, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_PREEMPTING, "a higher priority still preempts it");
    /* k from the snapshot */
    j[0].priority = 0;
    r[0].preemptions = 1;
    sched_snapshot_t s = {.workers = w, .nworkers = 1, .queues = q, .nqueues = 2, .jobs = j, .njobs = 1,
                          .running = r, .nrunning = 1, .protect_after = 1};
    int n;
    cr_assert_eq(sched_admit(&s, out, order, &n), 0);
    cr_assert_neq(out[0].outcome, SCHED_PREEMPTING);
    s.protect_after = 2;
    cr_assert_eq(sched_admit(&s, out, order, &n), 0);
    cr_assert_eq(out[0].outcome, SCHED_PREEMPTING);
    /* never the job that preempted it last */
    j[0].preempted_by = "a1";
    cr_assert_eq(sched_admit(&s, out, order, &n), 0);
    cr_assert_neq(out[0].outcome, SCHED_PREEMPTING);
}

/* A head that preempts more victims than its reason has room to name names each one whole or not
 * at all, and counts the rest: a cut id would be neither its project's job nor hidden from the
 * other projects that quote the reason (they are shown whole ids only). */
Test(admit, a_long_list_of_victims_names_whole_ids_and_counts_the_rest)
{
    enum { NV = 10 };
    static int wk[NV];
    static char ids[NV][40];
    sched_worker_t w[NV];
    sched_running_t r[NV];
    for (int i = 0; i < NV; i++) {
        wk[i] = i;
        snprintf(ids[i], sizeof ids[i], "%08d-0000-4000-8000-%012d", i, i);
        w[i] = (sched_worker_t)W(ids[i], "cpu", 1, 0);
        r[i] = running(ids[i], 0, 0, 1, &wk[i], 1);
        r[i].project_name = "nlp";
    }
    sched_queue_t q[] = {queue("default", NULL, U, U)};
    sched_job_t j[] = {job("head", 0, 5, NV, 1, 0)};
    j[0].project_name = "nlp";
    sched_decision_t out[1];
    int order[1];
    cr_assert_eq(pass_running(w, NV, q, 1, j, 1, r, NV, 0, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_PREEMPTING, "%s", out[0].reason);
    cr_assert_eq(out[0].nvictims, NV);
    int named = 0;
    for (int i = 0; i < NV; i++) {
        char whole[64];
        snprintf(whole, sizeof whole, "job %.39s", ids[i]);
        named += strstr(out[0].reason, whole) != NULL;
    }
    cr_assert(named >= 3 && named < NV, "%d named: %s", named, out[0].reason);
    char tail[32];
    snprintf(tail, sizeof tail, " and %d more", NV - named);
    size_t len = strlen(out[0].reason), tl = strlen(tail);
    cr_assert(len >= tl && !strcmp(out[0].reason + len - tl, tail), "the rest are counted at the end: %s",
              out[0].reason);
    /* nothing else of an id: every "job " is followed by a whole one */
    int jobs = 0;
    for (const char *p = out[0].reason; (p = strstr(p, "job ")) != NULL; p += 4)
        jobs += strlen(p) >= 40 && p[4 + 8] == '-' && p[4 + 35] >= '0' && p[4 + 35] <= '9';
    cr_assert_eq(jobs, named, "%s", out[0].reason);
}

Test(admit, reclaim_preempts_only_borrowers)
{
    /* Queues a and b of cohort c, quota 2 each. a uses 4 (borrows 2): its jobs are reclaimed for
     * b's job within b's quota; nothing of a is preempted for a job of b beyond b's quota. */
    static const int w0[] = {0}, w1[] = {1};
    sched_worker_t w[] = {W("w0", "cpu", 2, 0), W("w1", "cpu", 2, 0)};
    sched_queue_t q[] = {queue("a", "c", 2, 0), queue("b", "c", 2, 0)};
    q[0].usage[0] = 4;
    sched_running_t r[] = {running("a1", 0, 9, 2, w0, 5), running("a2", 0, 9, 2, w1, 1)};
    sched_job_t j[] = {job("b1", 1, 0, 1, 2, 0)};
    sched_decision_t out[1];
    int order[1];
    cr_assert_eq(pass_running(w, 2, q, 2, j, 1, r, 2, 0, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_PREEMPTING, "%s", out[0].reason);
    cr_assert_eq(out[0].nvictims, 1);
    cr_assert_eq(out[0].victims[0], 1, "the borrower's job with fewer steps since its checkpoint");
    char why[600];
    sched_snapshot_t s = {.workers = w, .nworkers = 2, .queues = q, .nqueues = 2, .jobs = j, .njobs = 1,
                          .running = r, .nrunning = 2};
    sched_victim_reason(&s, 0, 1, why, sizeof why);
    cr_assert(strstr(why, "its queue b reclaims the quota queue a borrows, which this job holds; allowed by queue b's "
                          "preemption.reclaim_within_cohort (any); this job's ranks get SIGTERM") && !strstr(why, "b1"),
              "%s", why);
    char note[700];
    cr_assert_str_eq(sched_preemptor_reason(&s, 0, &out[0].victims[0], 1, note, sizeof note),
                     "preempting job a2 for 2 cpu slot(s) on worker w1: queue b reclaims the quota queue a borrows, "
                     "allowed by queue b's preemption.reclaim_within_cohort (any); it starts once they have stopped");
    /* a within its quota: nothing to reclaim */
    q[0].usage[0] = 2;
    r[1].queue = 1;
    q[1].usage[0] = 2;
    j[0].slots_per_node = 1;
    cr_assert_eq(pass_running(w, 2, q, 2, j, 1, r, 1, 0, out, order), 0);
    cr_assert_neq(out[0].outcome, SCHED_PREEMPTING, "%s", out[0].reason);
}

/* A head within its queue's quota that waits for the quota its cohort lent out stops the cohort's
 * borrowing, as one that waits for slots does: a borrower's job preempted for it, whose slot has
 * just freed while the other victim still stops, is not readmitted into that slot (found on a
 * live cluster: the victims went back and forth between PREEMPTED and RUNNING 49 times in 15 s
 * and the head never started). */
Test(admit, a_victim_is_not_readmitted_borrowing_while_its_preemptor_waits_for_the_quota)
{
    static const int w0[] = {0}, w1[] = {1};
    /* a borrows 2 of b's quota; b's head needs 2 slots on one worker; victim a1 has stopped (it
     * waits again), victim a2 still stops on w0 */
    sched_worker_t w[] = {W("w0", "cpu", 2, 1), W("w1", "cpu", 2, 0)};
    sched_queue_t q[] = {queue("a", "c", 2, 0), queue("b", "c", 2, 0)};
    q[0].usage[0] = 3;
    sched_running_t r[] = {running("a2", 0, -1, 1, w0, 0), running("a3", 0, -1, 1, w1, 0),
                           running("a4", 0, -1, 1, w1, 0)};
    r[0].freeing = true;
    sched_job_t j[] = {job("b1", 1, 500, 1, 2, 0), job("a1", 0, -1, 1, 1, 0)};
    sched_decision_t out[2];
    int order[2];
    cr_assert_eq(pass_running(w, 2, q, 2, j, 2, r, 3, 0, out, order), 0, "a1: %s", out[1].reason);
    cr_assert_neq(out[1].outcome, SCHED_ADMITTED, "%s", out[1].reason);
    cr_assert(out[0].outcome == SCHED_WAIT_QUOTA || out[0].outcome == SCHED_WAIT_SLOTS, "%s", out[0].reason);
    /* with b's head gone, a borrows that slot as before */
    cr_assert_eq(pass_running(w, 2, q, 2, j + 1, 1, r, 3, 0, out, order), 1, "%s", out[0].reason);
}

/* ---- a queue's preemption policy (Kueue's ClusterQueue spec.preemption) ------------------------ */

Test(admit, within_queue_never_waits_rather_than_preempt)
{
    /* One worker of 4 slots, full with a low-priority job of queue prod; prod's high-priority head
     * needs 2. lower_priority (the default) preempts it, naming the rule; never waits for slots. */
    static const int w0[] = {0};
    sched_worker_t w[] = {W("w", "cpu", 4, 0)};
    sched_queue_t q[] = {queue("prod", NULL, U, U)};
    q[0].usage[0] = 4;
    sched_running_t r[] = {running("low", 0, 0, 4, w0, 1)};
    sched_job_t j[] = {job("high", 0, 5, 1, 2, 0)};
    sched_decision_t out[1];
    int order[1];
    cr_assert_eq(pass_running(w, 1, q, 1, j, 1, r, 1, 0, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_PREEMPTING, "%s", out[0].reason);
    char why[600];
    sched_snapshot_t s = {.workers = w, .nworkers = 1, .queues = q, .nqueues = 1, .jobs = j, .njobs = 1,
                          .running = r, .nrunning = 1};
    cr_assert_str_eq(sched_victim_reason(&s, 0, 0, why, sizeof why), "priority");
    cr_assert(strstr(why, "allowed by queue prod's preemption.within_queue (lower_priority)"), "%s", why);
    q[0].within = SCHED_WITHIN_NEVER;
    cr_assert_eq(pass_running(w, 1, q, 1, j, 1, r, 1, 0, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_WAIT_SLOTS, "a never queue's job waits: %s", out[0].reason);
    cr_assert_eq(out[0].nvictims, 0);
    /* and says that the policy, not the slots alone, is why (the default would preempt "low") */
    cr_assert(strstr(out[0].reason, "; queue prod's preemption.within_queue (never) keeps it from preempting its "
                                    "lower-priority jobs"), "%s", out[0].reason);
    cr_assert_null(strstr(out[0].reason, "reclaim_within_cohort"), "%s", out[0].reason);
    /* a running job of its priority: no policy would preempt it, so the reason names none */
    r[0].priority = 5;
    cr_assert_eq(pass_running(w, 1, q, 1, j, 1, r, 1, 0, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_WAIT_SLOTS, "%s", out[0].reason);
    cr_assert_null(strstr(out[0].reason, "preemption."), "%s", out[0].reason);
    r[0].priority = 0;
    /* whatever the policy, a job backfilled past its predicted end makes room (it started so) */
    r[0].backfilled = true;
    r[0].backfill_end_s = 5;
    cr_assert_eq(pass_running(w, 1, q, 1, j, 1, r, 1, 10, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_PREEMPTING, "%s", out[0].reason);
}

Test(admit, within_queue_preempts_in_a_queue_its_lower_priority_jobs_fill)
{
    /* Queue prod's quota (4) is all used by its low-priority job; its high-priority head needs 3.
     * The queue is within its nominal quota (not above it), so lower_priority preempts "low", and
     * never waits for quota saying that the policy is why. */
    static const int w0[] = {0};
    sched_worker_t w[] = {W("w", "cpu", 8, 4)};
    sched_queue_t q[] = {queue("prod", NULL, 4, 0)};
    q[0].usage[0] = 4;
    sched_running_t r[] = {running("low", 0, 0, 4, w0, 1)};
    sched_job_t j[] = {job("high", 0, 5, 1, 3, 0)};
    sched_decision_t out[1];
    int order[1];
    cr_assert_eq(pass_running(w, 1, q, 1, j, 1, r, 1, 0, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_PREEMPTING, "%s", out[0].reason);
    cr_assert(out[0].nvictims == 1 && out[0].victims[0] == 0);
    q[0].within = SCHED_WITHIN_NEVER;
    cr_assert_eq(pass_running(w, 1, q, 1, j, 1, r, 1, 0, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_WAIT_QUOTA, "%s", out[0].reason);
    cr_assert(strstr(out[0].reason, "queue prod: quota 4, used 4, no cohort to borrow from; queue prod's "
                                    "preemption.within_queue (never) keeps it"), "%s", out[0].reason);
    /* an equal-priority job of its queue is no victim, whatever the policy */
    q[0].within = SCHED_WITHIN_LOWER_PRIORITY;
    r[0].priority = 5;
    cr_assert_eq(pass_running(w, 1, q, 1, j, 1, r, 1, 0, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_WAIT_QUOTA, "%s", out[0].reason);
}

Test(admit, a_queue_that_borrows_does_not_preempt_its_own_jobs)
{
    /* Queue prod (quota 2, cohort c) runs two low-priority jobs of 2 slots: it borrows 2 of the
     * cohort's. Its high-priority head (2 slots) may not preempt them (issue 28: only a queue within
     * its nominal quota preempts), and waits; once prod is back at its quota, it preempts. */
    static const int w0[] = {0}, w1[] = {1};
    sched_worker_t w[] = {W("w0", "cpu", 2, 0), W("w1", "cpu", 2, 0)};
    sched_queue_t q[] = {queue("prod", "c", 2, 0), queue("idle", "c", 2, 0)};
    q[0].usage[0] = 4;
    sched_running_t r[] = {running("low1", 0, 0, 2, w0, 1), running("low2", 0, 0, 2, w1, 1)};
    sched_job_t j[] = {job("high", 0, 5, 1, 2, 0)};
    sched_decision_t out[1];
    int order[1];
    cr_assert_eq(pass_running(w, 2, q, 2, j, 1, r, 2, 0, out, order), 0);
    cr_assert_neq(out[0].outcome, SCHED_PREEMPTING, "a borrowing queue preempted its own job: %s", out[0].reason);
    q[0].usage[0] = 2;
    cr_assert_eq(pass_running(w, 2, q, 2, j, 1, r, 1, 0, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_PREEMPTING, "at its quota: %s", out[0].reason);
}

Test(admit, reclaim_lower_priority_leaves_an_equal_priority_borrower_alone)
{
    /* Queues a and b of cohort c, quota 2 each, on 2 workers of 2 slots. a borrows 2 with two jobs:
     * "eq" (b1's priority, 1 step lost) and "low" (lower priority, 5 steps lost). b1 within b's
     * quota reclaims: any takes the cheaper "eq"; lower_priority takes "low" and never "eq";
     * never takes nothing. The victim's queue's policy does not matter: the preemptor's decides. */
    static const int w0[] = {0}, w1[] = {1};
    sched_worker_t w[] = {W("w0", "cpu", 2, 0), W("w1", "cpu", 2, 0)};
    sched_queue_t q[] = {queue("a", "c", 2, 0), queue("b", "c", 2, 0)};
    q[0].usage[0] = 4;
    q[0].reclaim = SCHED_RECLAIM_NEVER;
    q[0].within = SCHED_WITHIN_NEVER;
    sched_running_t r[] = {running("eq", 0, 1, 2, w0, 1), running("low", 0, 0, 2, w1, 5)};
    sched_job_t j[] = {job("b1", 1, 1, 1, 2, 0)};
    sched_decision_t out[1];
    int order[1];
    char why[600];
    sched_snapshot_t s = {.workers = w, .nworkers = 2, .queues = q, .nqueues = 2, .jobs = j, .njobs = 1,
                          .running = r, .nrunning = 2};
    cr_assert_eq(pass_running(w, 2, q, 2, j, 1, r, 2, 0, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_PREEMPTING, "%s", out[0].reason);
    cr_assert(out[0].nvictims == 1 && out[0].victims[0] == 0, "any: the borrower that loses least (eq)");
    cr_assert_str_eq(sched_victim_reason(&s, 0, 0, why, sizeof why), "reclaim");
    cr_assert(strstr(why, "allowed by queue b's preemption.reclaim_within_cohort (any)"), "%s", why);
    q[1].reclaim = SCHED_RECLAIM_LOWER_PRIORITY;
    cr_assert_eq(pass_running(w, 2, q, 2, j, 1, r, 2, 0, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_PREEMPTING, "%s", out[0].reason);
    cr_assert(out[0].nvictims == 1 && out[0].victims[0] == 1, "lower_priority: only the lower one (low)");
    sched_victim_reason(&s, 0, 1, why, sizeof why);
    cr_assert(strstr(why, "allowed by queue b's preemption.reclaim_within_cohort (lower_priority)"), "%s", why);
    /* with only the equal-priority borrower, b1 waits */
    cr_assert_eq(pass_running(w, 2, q, 2, j, 1, r, 1, 0, out, order), 0);
    cr_assert_neq(out[0].outcome, SCHED_PREEMPTING, "an equal-priority borrower was preempted: %s", out[0].reason);
    cr_assert_eq(out[0].nvictims, 0);
    cr_assert(strstr(out[0].reason, "; queue b's preemption.reclaim_within_cohort (lower_priority) keeps it from "
                                    "reclaiming its quota from the jobs that borrow it"), "%s", out[0].reason);
    q[1].reclaim = SCHED_RECLAIM_NEVER;
    cr_assert_eq(pass_running(w, 2, q, 2, j, 1, r, 2, 0, out, order), 0);
    cr_assert_neq(out[0].outcome, SCHED_PREEMPTING, "never reclaims: %s", out[0].reason);
    cr_assert(strstr(out[0].reason, "; queue b's preemption.reclaim_within_cohort (never) keeps it"), "%s",
              out[0].reason);
    cr_assert_null(strstr(out[0].reason, "within_queue"), "%s", out[0].reason);
    /* reclaim's policy leaves preemption within the queue alone, and the other way round */
    q[1].within = SCHED_WITHIN_NEVER;
    q[1].reclaim = SCHED_RECLAIM_ANY;
    cr_assert_eq(pass_running(w, 2, q, 2, j, 1, r, 2, 0, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_PREEMPTING, "%s", out[0].reason);
}

Test(admit, policy_names_parse)
{
    cr_assert_eq(sched_policy_parse(sched_within_names, "lower_priority"), SCHED_WITHIN_LOWER_PRIORITY);
    cr_assert_eq(sched_policy_parse(sched_within_names, "never"), SCHED_WITHIN_NEVER);
    cr_assert_eq(sched_policy_parse(sched_within_names, "any"), -1);
    cr_assert_eq(sched_policy_parse(sched_reclaim_names, "any"), SCHED_RECLAIM_ANY);
    cr_assert_eq(sched_policy_parse(sched_reclaim_names, "lower_priority"), SCHED_RECLAIM_LOWER_PRIORITY);
    cr_assert_eq(sched_policy_parse(sched_reclaim_names, "never"), SCHED_RECLAIM_NEVER);
    cr_assert_eq(sched_policy_parse(sched_reclaim_names, "Never"), -1);
    cr_assert_eq(sched_policy_parse(sched_reclaim_names, NULL), -1);
}

Test(admit, backfill_only_what_ends_before_the_head_can_start)
{
    /* 4 slots; a running job holds 2 until t=100. The head needs 4: it waits until 100. Behind
     * it, a job of 2 slots predicted to take 50 starts now; one of 80 does not fit beside it; one
     * of 200 and one with no prediction wait. */
    static const int w0[] = {0};
    sched_worker_t w[] = {W("w", "cpu", 4, 2)};
    sched_queue_t q[] = {queue("default", NULL, U, U)};
    q[0].usage[0] = 2;
    sched_running_t r[] = {running("run", 0, 0, 2, w0, 0)};
    r[0].end_s = 100;
    sched_job_t j[] = {job("head", 0, 0, 1, 4, 0), job("long", 0, 0, 1, 2, 0), job("blind", 0, 0, 1, 1, 0),
                       job("short", 0, 0, 1, 2, 0), job("more", 0, 0, 1, 1, 0)};
    for (int i = 0; i < 5; i++)
        j[i].runtime_s = -1;
    j[1].runtime_s = 200;
    j[3].runtime_s = 50;
    j[4].runtime_s = 80;
    sched_decision_t out[5];
    int order[5];
    cr_assert_eq(pass_running(w, 1, q, 1, j, 5, r, 1, 0, out, order), 1);
    cr_assert_eq(out[0].outcome, SCHED_WAIT_SLOTS);
    cr_assert_eq(out[1].outcome, SCHED_WAIT_BEHIND);
    cr_assert_eq(out[2].outcome, SCHED_WAIT_BEHIND);
    cr_assert_eq(out[3].outcome, SCHED_ADMITTED);
    cr_assert(out[3].backfilled);
    cr_assert_eq(out[3].behind_head, 0);
    cr_assert_float_eq(out[3].end_s, 50, 1e-9);
    cr_assert_eq(out[4].outcome, SCHED_WAIT_BEHIND, "no free slot left for it");
    /* no prediction for what the head waits for: nothing is backfilled */
    r[0].end_s = -1;
    cr_assert_eq(pass_running(w, 1, q, 1, j, 5, r, 1, 0, out, order), 0);
    /* nor for one job among those it waits for (it might end first, and the head start sooner) */
    sched_running_t r2[] = {running("run", 0, 0, 2, w0, 0), running("unknown", 0, 0, 1, w0, 0)};
    r2[0].end_s = 100;
    w[0].slots_free = 1;
    q[0].usage[0] = 3;
    j[4].runtime_s = 50;
    cr_assert_eq(pass_running(w, 1, q, 1, j, 5, r2, 2, 0, out, order), 0, "%s", out[4].reason);
    w[0].slots_free = 2;
    q[0].usage[0] = 2;
    j[4].runtime_s = 80;
    /* a backfilled job that overran its prediction is preempted for the head, whatever its priority */
    r[0].end_s = 100;
    r[0].backfilled = true;
    r[0].backfill_end_s = 10;
    r[0].priority = 7;
    cr_assert_eq(pass_running(w, 1, q, 1, j, 1, r, 1, 20, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_PREEMPTING);
    cr_assert_eq(pass_running(w, 1, q, 1, j, 1, r, 1, 5, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_WAIT_SLOTS, "not overrun yet");
}

Test(admit, backfill_a_longer_job_into_slots_the_head_leaves_free)
{
    /* Four workers of 4: w0 full until t=100, w3 half full until t=5000, w1 and w2 free. The head
     * needs 3 x 4: it can start at 100, on w0, w1 and w2, and leaves w3's 2 free slots free then.
     * A job of 1 x 2 predicted to take 1000 s starts now on w3, where it delays nothing; one of
     * 1 x 3 does not (no worker has 3 slots the head leaves free), nor one of 2 x 1. */
    static const int w0[] = {0}, w3[] = {3};
    sched_worker_t w[] = {W("w0", "cpu", 4, 0), W("w1", "cpu", 4, 4), W("w2", "cpu", 4, 4), W("w3", "cpu", 4, 2)};
    sched_queue_t q[] = {queue("default", NULL, U, U)};
    q[0].usage[0] = 6;
    sched_running_t r[] = {running("r0", 0, 0, 4, w0, 0), running("r3", 0, 0, 2, w3, 0)};
    r[0].end_s = 100;
    r[1].end_s = 5000;
    sched_job_t j[] = {job("head", 0, 0, 3, 4, 0), job("wide", 0, 0, 1, 3, 0), job("pair", 0, 0, 2, 1, 0),
                       job("fits", 0, 0, 1, 2, 0), job("more", 0, 0, 1, 1, 0)};
    for (int i = 0; i < 5; i++)
        j[i].runtime_s = 1000;
    sched_decision_t out[5];
    int order[5];
    cr_assert_eq(pass_running(w, 4, q, 1, j, 5, r, 2, 0, out, order), 1);
    cr_assert_eq(out[0].outcome, SCHED_WAIT_SLOTS, "%s", out[0].reason);
    cr_assert_eq(out[1].outcome, SCHED_WAIT_BEHIND, "no worker has 3 slots the head leaves free");
    cr_assert_eq(out[2].outcome, SCHED_WAIT_BEHIND, "only w3 has slots the head leaves free");
    cr_assert_eq(out[3].outcome, SCHED_ADMITTED, "%s", out[3].reason);
    cr_assert(out[3].backfilled);
    cr_assert_eq(out[3].pl.worker[0], 3, "on w3, which the head does not need");
    cr_assert_float_eq(out[3].head_start_s, 100, 1e-9);
    cr_assert_float_eq(out[3].end_s, 1000, 1e-9);
    cr_assert_eq(out[4].outcome, SCHED_WAIT_BEHIND, "w3's free slots are taken");
    /* with w3's job ending by 100 too, the head would take w3 if w1 were busy: nothing longer starts */
    r[1].end_s = 50;
    w[1].slots_free = 0;
    cr_assert_eq(pass_running(w, 4, q, 1, j, 5, r, 2, 0, out, order), 0);
}

Test(admit, backfill_never_takes_the_slots_another_queues_head_waits_for)
{
    /* w0: 2 of 4 free until t=10; w1: full until 1000. Queue a's head needs 2 x 4 (at 1000), queue
     * b's head 1 x 4 (w0, at 10). A job behind a's head of 1 x 2 predicted to take 50 s ends long
     * before a's head can start, but after b's could: it does not take w0's free slots. */
    static const int w0[] = {0}, w1[] = {1};
    sched_worker_t w[] = {W("w0", "cpu", 4, 2), W("w1", "cpu", 4, 0)};
    sched_queue_t q[] = {queue("a", NULL, U, U), queue("b", NULL, U, U)};
    q[0].usage[0] = 4;
    q[1].usage[0] = 2;
    sched_running_t r[] = {running("r0", 1, 0, 2, w0, 0), running("r1", 0, 0, 4, w1, 0)};
    r[0].end_s = 10;
    r[1].end_s = 1000;
    sched_job_t j[] = {job("ahead", 0, 0, 2, 4, 0), job("bhead", 1, 0, 1, 4, 0), job("short", 0, 0, 1, 2, 0)};
    j[2].runtime_s = 50;
    sched_decision_t out[3];
    int order[3];
    cr_assert_eq(pass_running(w, 2, q, 2, j, 3, r, 2, 0, out, order), 0, "%s", out[2].reason);
    cr_assert_eq(out[0].outcome, SCHED_WAIT_SLOTS);
    cr_assert_eq(out[1].outcome, SCHED_WAIT_SLOTS);
    cr_assert_eq(out[2].outcome, SCHED_WAIT_BEHIND);
    /* predicted to take 5 s, it ends before b's head can start: it goes */
    j[2].runtime_s = 5;
    cr_assert_eq(pass_running(w, 2, q, 2, j, 3, r, 2, 0, out, order), 1);
    cr_assert(out[2].backfilled);
}

Test(admit, backfill_behind_a_head_that_waits_for_quota)
{
    /* Queue a (quota 6, no cohort) holds 4 until t=100; its head needs 5: it waits for quota until
     * 100 though the worker has slots. Behind it, a job of 2 predicted to take 50 s starts now (it
     * ends first); one of 2 taking 500 s does not (at 100 the queue would use 2 + 5 > 6). */
    static const int w0[] = {0};
    sched_worker_t w[] = {W("w", "cpu", 16, 12)};
    sched_queue_t q[] = {queue("a", NULL, 6, 0)};
    q[0].usage[0] = 4;
    sched_running_t r[] = {running("run", 0, 0, 4, w0, 0)};
    r[0].end_s = 100;
    sched_job_t j[] = {job("head", 0, 0, 1, 5, 0), job("behind", 0, 0, 1, 2, 0)};
    j[0].runtime_s = 1000;
    j[1].runtime_s = 500;
    sched_decision_t out[2];
    int order[2];
    cr_assert_eq(pass_running(w, 1, q, 1, j, 2, r, 1, 0, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_WAIT_QUOTA, "%s", out[0].reason);
    cr_assert_eq(out[1].outcome, SCHED_WAIT_BEHIND, "it would hold the quota the head needs at 100");
    j[1].runtime_s = 50;
    cr_assert_eq(pass_running(w, 1, q, 1, j, 2, r, 1, 0, out, order), 1);
    cr_assert(out[1].backfilled);
    cr_assert_float_eq(out[1].head_start_s, 100, 1e-9);
    /* with a quota of 7 the head leaves 2 free at 100: the long one fits beside it */
    q[0].quota[0] = 7;
    j[1].runtime_s = 500;
    cr_assert_eq(pass_running(w, 1, q, 1, j, 2, r, 1, 0, out, order), 1);
    cr_assert(out[1].backfilled);
    cr_assert_gt(out[1].end_s, out[1].head_start_s);
}

Test(admit, backfill_of_another_queue_keeps_the_cohort_quota_a_head_needs)
{
    /* Cohort c: queues a and b, quota 4 cpu each, lending all of it (the cohort's pool is 8); the
     * worker has 16 slots. b borrows: it holds 6 until t=100 (starting: not a victim). a's head
     * needs 7 and b's head 8: both wait for quota, a's until 100, b's until a's ends at 1100. A job
     * of b behind its head, of 2 slots, taking 500 s would leave the cohort 6 for a's head at 100:
     * it waits; taking 50 s, it ends first and starts now. */
    static const int w0[] = {0};
    sched_worker_t w[] = {W("w", "cpu", 16, 10)};
    sched_queue_t q[] = {queue("a", "c", 4, 0), queue("b", "c", 4, 0)};
    q[1].usage[0] = 6;
    sched_running_t r[] = {running("run", 1, 0, 6, w0, 0)};
    r[0].end_s = 100;
    r[0].preemptible = false;
    sched_job_t j[] = {job("ahead", 0, 0, 1, 7, 0), job("bhead", 1, 0, 1, 8, 0), job("bjob", 1, 0, 1, 2, 0)};
    j[0].runtime_s = 1000;
    j[1].runtime_s = 1000;
    j[2].runtime_s = 500;
    sched_decision_t out[3];
    int order[3];
    cr_assert_eq(pass_running(w, 1, q, 2, j, 3, r, 1, 0, out, order), 0, "%s", out[2].reason);
    cr_assert_eq(out[0].outcome, SCHED_WAIT_QUOTA, "%s", out[0].reason);
    cr_assert_eq(out[1].outcome, SCHED_WAIT_QUOTA, "%s", out[1].reason);
    cr_assert_eq(out[2].outcome, SCHED_WAIT_BEHIND);
    j[2].runtime_s = 50;
    cr_assert_eq(pass_running(w, 1, q, 2, j, 3, r, 1, 0, out, order), 1);
    cr_assert(out[2].backfilled);
    cr_assert_eq(out[2].behind_head, 1);
    cr_assert_float_eq(out[2].head_start_s, 1100, 1e-9, "b's head starts when a's ends");
}

Test(admit, heads_reserve_in_turn_so_a_later_head_starts_after_an_earlier_one)
{
    /* Worker w (4 slots) is held by b until t=10; worker v has 1 slot free. a's head (4 slots,
     * 100 s) blocks first (the lower share) and takes w at 10; b's head (4 slots) can then start
     * only at 110, when a's ends, not at 10. A job of b of 1 slot taking 50 s starts now on v. */
    static const int w0[] = {0};
    sched_worker_t w[] = {W("w", "cpu", 4, 0), W("v", "cpu", 1, 1)};
    sched_queue_t q[] = {queue("a", NULL, U, U), queue("b", NULL, U, U)};
    q[1].usage[0] = 4;
    sched_running_t r[] = {running("run", 1, 0, 4, w0, 0)};
    r[0].end_s = 10;
    sched_job_t j[] = {job("ahead", 0, 0, 1, 4, 0), job("bhead", 1, 0, 1, 4, 0), job("bjob", 1, 0, 1, 1, 0)};
    j[0].runtime_s = 100;
    j[1].runtime_s = 100;
    j[2].runtime_s = 50;
    sched_decision_t out[3];
    int order[3];
    cr_assert_eq(pass_running(w, 2, q, 2, j, 3, r, 1, 0, out, order), 1);
    cr_assert_eq(out[0].outcome, SCHED_WAIT_SLOTS);
    cr_assert_eq(out[1].outcome, SCHED_WAIT_SLOTS);
    cr_assert(out[2].backfilled);
    cr_assert_eq(out[2].pl.worker[0], 1);
    cr_assert_float_eq(out[2].head_start_s, 110, 1e-9, "b's head starts after a's ends, not at 10");
    /* each blocked head's decision says its own earliest start */
    cr_assert_float_eq(out[0].head_start_s, 10, 1e-9);
    cr_assert_float_eq(out[1].head_start_s, 110, 1e-9);
    /* a's head with no prediction holds w for ever: b's head's start is then reckoned without it */
    j[0].runtime_s = -1;
    cr_assert_eq(pass_running(w, 2, q, 2, j, 3, r, 1, 0, out, order), 1);
    cr_assert_float_eq(out[2].head_start_s, 10, 1e-9);
}

Test(admit, a_later_head_does_not_start_inside_an_earlier_heads_reservation)
{
    /* Worker w (4 slots) is held by two jobs of b, ending at 10 and 20. a's head (4 slots, 100 s)
     * blocks first (the lower share) and takes w at 20. b's head (2 slots, 100 s) would fit at 10,
     * but would then hold w past 20, when a's head takes all of it: it starts at 120, after a's. */
    static const int w0[] = {0};
    sched_worker_t w[] = {W("w", "cpu", 4, 0)};
    sched_queue_t q[] = {queue("a", NULL, U, U), queue("b", NULL, U, U)};
    q[1].usage[0] = 4;
    sched_running_t r[] = {running("r10", 1, 0, 2, w0, 0), running("r20", 1, 0, 2, w0, 0)};
    r[0].end_s = 10;
    r[1].end_s = 20;
    sched_job_t j[] = {job("ahead", 0, 0, 1, 4, 0), job("bhead", 1, 0, 1, 2, 0)};
    j[0].runtime_s = 100;
    j[1].runtime_s = 100;
    sched_decision_t out[2];
    int order[2];
    cr_assert_eq(pass_running(w, 1, q, 2, j, 2, r, 2, 0, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_WAIT_SLOTS);
    cr_assert_eq(out[1].outcome, SCHED_WAIT_SLOTS);
    cr_assert_float_eq(out[0].head_start_s, 20, 1e-9);
    cr_assert_float_eq(out[1].head_start_s, 120, 1e-9, "b's head starts after a's ends, not at 10: %g",
                       out[1].head_start_s);
}

Test(admit, past_the_exact_search_the_victims_are_those_needed_and_no_more)
{
    /* 27 candidates, more than SCHED_PREEMPT_EXACT: the 13 that lose least hold worker v, which
     * the head (14 slots on one worker) cannot use; w's 14 are the victims, and none of v's */
    static const int wv[] = {0}, ww[] = {1};
    static char ids[27][16];
    sched_worker_t w[] = {W("v", "cpu", 13, 0), W("w", "cpu", 14, 0)};
    sched_queue_t q[] = {queue("a", NULL, U, U)};
    q[0].usage[0] = 27;
    sched_running_t r[27];
    for (int i = 0; i < 27; i++) {
        snprintf(ids[i], sizeof ids[i], "r%d", i);
        r[i] = running(ids[i], 0, 0, 1, i < 13 ? wv : ww, i < 13 ? i : 100 + i);
    }
    sched_job_t j[] = {job("big", 0, 10, 1, 14, 0)};
    sched_decision_t out[1];
    int order[1];
    cr_assert_eq(pass_running(w, 2, q, 1, j, 1, r, 27, 0, out, order), 0);
    cr_assert_eq(out[0].outcome, SCHED_PREEMPTING, "%s", out[0].reason);
    cr_assert_eq(out[0].nvictims, 14, "%d victims", out[0].nvictims);
    for (int k = 0; k < out[0].nvictims; k++)
        cr_assert(out[0].victims[k] >= 13, "victim %s holds v, which the head cannot use", r[out[0].victims[k]].id);
}

/* ---- property-based runs with running jobs: preemption and backfill -------------------------- */

/* The cost of a set of victims, as the contract orders them: steps lost, jobs, priorities, then
 * newest (larger start times cost less). */
typedef struct vcost {
    long long lost;
    int n;
    long long prio;
    double age;
} vcost_t;

static vcost_t vcost(const sched_running_t *r, const int *set, int n)
{
    vcost_t c = {0};
    for (int k = 0; k < n; k++) {
        c.lost += r[set[k]].steps_lost;
        c.n++;
        c.prio += r[set[k]].priority;
        c.age -= r[set[k]].start_s;
    }
    return c;
}

static int vcost_cmp(vcost_t x, vcost_t y)
{
    if (x.lost != y.lost)
        return x.lost < y.lost ? -1 : 1;
    if (x.n != y.n)
        return x.n < y.n ? -1 : 1;
    if (x.prio != y.prio)
        return x.prio < y.prio ? -1 : 1;
    return x.age < y.age ? -1 : x.age > y.age;
}

/* The contract's victims for pending job J, written out again here: running, not stopping, its
 * slot type, not protected (preempted k times, priority not below J's), not the job that last
 * preempted J; a backfilled job past its predicted end; otherwise as J's queue's preemption
 * policy allows: a lower-priority job of J's queue while the queue's usage is not above its
 * nominal quota (within_queue lower_priority; never: none), and only for J within its queue's
 * nominal quota a job of a queue of its cohort above its nominal quota (reclaim_within_cohort any;
 * lower_priority: of a lower priority than J's; never: none). */
static bool is_candidate(const sched_queue_t *q, const sched_job_t *J, const sched_running_t *R, int k, double now)
{
    if (!R->preemptible || R->freeing || R->type != J->type || R->queue < 0)
        return false;
    if (R->preemptions >= k && R->priority >= J->priority)
        return false;
    if (R->backfilled && now > R->backfill_end_s)
        return true;
    if (J->preempted_by && !strcmp(J->preempted_by, R->id))
        return false;
    const sched_queue_t *Q = &q[J->queue];
    int nom = q[J->queue].quota[J->type];
    if (R->queue == J->queue)
        return (nom == U || Q->usage[J->type] <= nom) && Q->within == SCHED_WITHIN_LOWER_PRIORITY &&
               R->priority < J->priority;
    if (nom != U && q[J->queue].usage[J->type] + J->nodes * J->slots_per_node > nom)
        return false;
    const sched_queue_t *V = &q[R->queue];
    bool borrower = Q->cohort && V->cohort && !strcmp(Q->cohort, V->cohort) && V->quota[J->type] != U
        && V->usage[J->type] > V->quota[J->type];
    if (!borrower || Q->reclaim == SCHED_RECLAIM_NEVER)
        return false;
    return Q->reclaim == SCHED_RECLAIM_ANY || R->priority < J->priority;
}

/* Gives the queues q[0..nq) random preemption policies drawn from s. */
static void random_policies(sched_queue_t *q, int nq, unsigned *s)
{
    for (int i = 0; i < nq; i++) {
        q[i].within = rnd(s) % 2 ? SCHED_WITHIN_LOWER_PRIORITY : SCHED_WITHIN_NEVER;
        q[i].reclaim = (sched_reclaim_t)(rnd(s) % 3);
    }
}

/* Whether J is admitted at once with the running jobs in set (and the stopping ones) gone: the
 * admission core itself, asked without any running job to preempt. */
static bool starts_without(const sched_worker_t *w, int nw, const sched_queue_t *q, int nq, const sched_job_t *J,
                           const sched_running_t *r, int nr, const int *set, int n)
{
    sched_worker_t w2[MAXW];
    sched_queue_t q2[MAXQ];
    memcpy(w2, w, sizeof(*w) * (size_t)nw);
    memcpy(q2, q, sizeof(*q) * (size_t)nq);
    for (int i = 0; i < nr; i++) {
        bool gone = r[i].freeing;
        for (int k = 0; k < n; k++)
            gone = gone || set[k] == i;
        if (!gone)
            continue;
        q2[r[i].queue].usage[r[i].type] -= r[i].nodes * r[i].slots_per_node;
        for (int x = 0; x < r[i].nodes; x++)
            w2[r[i].worker[x]].slots_free += r[i].slots_per_node;
    }
    sched_decision_t out[1];
    int order[1], na = 0;
    sched_snapshot_t s = {.workers = w2, .nworkers = nw, .queues = q2, .nqueues = nq, .jobs = J, .njobs = 1};
    cr_assert_eq(sched_admit(&s, out, order, &na), 0);
    return na == 1;
}

Test(admit, victims_lose_the_least_work_brute_force, .timeout = 120)
{
    static const char *const wids[] = {"w0", "w1", "w2", "w3"};
    static const char *const rids[] = {"r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9", "r10", "r11"};
    int preempted = 0, checked = 0;
    for (unsigned seed = 1; seed <= 600; seed++) {
        unsigned s = seed;
        int nw = 1 + (int)(rnd(&s) % 3);
        sched_worker_t w[MAXW];
        for (int i = 0; i < nw; i++) {
            int slots = 2 + (int)(rnd(&s) % 5);
            w[i] = (sched_worker_t){.id = wids[i], .slot_type = "cpu", .slots = slots, .slots_free = slots};
        }
        bool cohort = seed % 2;
        sched_queue_t q[2] = {queue("a", cohort ? "c" : NULL, cohort ? (int)(rnd(&s) % 6) : U, 0),
                              queue("b", cohort ? "c" : NULL, cohort ? (int)(rnd(&s) % 6) : U, 0)};
        int nq = cohort ? 2 : 1;
        /* fill the workers with running jobs */
        sched_running_t r[12];
        int rw[12][2];
        int nr = 0;
        for (int tries = 0; tries < 40 && nr < 12; tries++) {
            int nodes = rnd(&s) % 4 == 0 && nw > 1 ? 2 : 1, spn = 1 + (int)(rnd(&s) % 3);
            int a = (int)(rnd(&s) % (unsigned)nw), b = (a + 1) % nw;
            if (w[a].slots_free < spn || (nodes == 2 && w[b].slots_free < spn))
                continue;
            rw[nr][0] = a;
            rw[nr][1] = b;
            r[nr] = running(rids[nr], (int)(rnd(&s) % (unsigned)nq), (int)(rnd(&s) % 3), spn, rw[nr],
                            (int64_t)(rnd(&s) % 8));
            r[nr].nodes = nodes;
            r[nr].preemptions = (int)(rnd(&s) % 5);
            r[nr].start_s = (double)(rnd(&s) % 4);
            r[nr].freeing = rnd(&s) % 10 == 0;
            for (int x = 0; x < nodes; x++)
                w[rw[nr][x]].slots_free -= spn;
            q[r[nr].queue].usage[0] += nodes * spn;
            nr++;
        }
        sched_job_t J = job("head", (int)(rnd(&s) % (unsigned)nq), (int)(rnd(&s) % 4), 1 + (int)(rnd(&s) % 2),
                            1 + (int)(rnd(&s) % 4), 0);
        unsigned ps = seed * 2654435761u; /* its own stream: the clusters stay those of the default policy */
        if (seed % 4 >= 2)
            random_policies(q, nq, &ps);
        sched_decision_t out[1];
        int order[1];
        int na = pass_running(w, nw, q, nq, &J, 1, r, nr, 0, out, order);
        if (na == 1 || out[0].outcome == SCHED_WAIT_WORKERS || out[0].outcome == SCHED_WAIT_NEVER_QUOTA)
            continue;
        int cand[12], nc = 0;
        for (int i = 0; i < nr; i++)
            if (is_candidate(q, &J, &r[i], 3, 0))
                cand[nc++] = i;
        bool freeing_suffices = starts_without(w, nw, q, nq, &J, r, nr, NULL, 0);
        /* the best set by brute force */
        vcost_t best = {0};
        bool found = false;
        for (unsigned m = 1; !freeing_suffices && m < (1u << nc); m++) {
            int set[12], n = 0;
            for (int i = 0; i < nc; i++)
                if (m & (1u << i))
                    set[n++] = cand[i];
            vcost_t c = vcost(r, set, n);
            if (found && vcost_cmp(c, best) >= 0)
                continue;
            if (starts_without(w, nw, q, nq, &J, r, nr, set, n)) {
                best = c;
                found = true;
            }
        }
        checked++;
        if (out[0].outcome != SCHED_PREEMPTING) {
            cr_assert(!found, "seed %u: a set of victims would let the head start, none was chosen (%s)", seed,
                      out[0].reason);
            continue;
        }
        preempted++;
        cr_assert_not(freeing_suffices, "seed %u: preempted although stopping jobs free enough", seed);
        cr_assert(found, "seed %u: victims chosen where no set suffices", seed);
        for (int k = 0; k < out[0].nvictims; k++) {
            int v = out[0].victims[k];
            cr_assert(v >= 0 && v < nr && is_candidate(q, &J, &r[v], 3, 0), "seed %u: victim %d may not be preempted",
                      seed, v);
        }
        cr_assert(starts_without(w, nw, q, nq, &J, r, nr, out[0].victims, out[0].nvictims),
                  "seed %u: the victims do not free enough", seed);
        vcost_t got = vcost(r, out[0].victims, out[0].nvictims);
        cr_assert_eq(vcost_cmp(got, best), 0, "seed %u: victims lose %lld steps in %d job(s); the least is %lld in %d",
                     seed, got.lost, got.n, best.lost, best.n);
    }
    cr_assert_gt(preempted, 50, "only %d of %d cases preempted: the cases show little", preempted, checked);
}

/* A job stream on a virtual clock with running jobs that step and checkpoint, preemption (a
 * victim stops for one tick, loses the steps since its checkpoint and waits again) and backfill
 * (predictions exact, or short by two ticks: overruns). */
typedef struct psim {
    sim_t S;
    int steps[MAXJ];        /* its whole run, in ticks */
    int done[MAXJ];         /* steps done (kept from its last checkpoint when preempted) */
    int ckpt_every[MAXJ];
    int predicted[MAXJ];    /* 0: no prediction; 1 exact; 2 two ticks short */
    int started[MAXJ];      /* tick its current attempt started */
    int preemptions[MAXJ];
    const char *last_by[MAXJ];
    bool backfilled[MAXJ];
    double backfill_end[MAXJ];
    int worker_idx[MAXJ][4];
    int lost;               /* steps lost to preemption in all */
    int npreempt;
    bool pair[150][150];    /* pair[x][y]: job x preempted job y */
    int bf_head[MAXJ];      /* the head a job was backfilled ahead of, + 1 (0: not backfilled) */
    bool bf_long[MAXJ];     /* backfilled to end after that head's earliest start */
    double head_at[MAXJ];   /* the earliest start of a head jobs were backfilled ahead of (< 0: none) */
    int nbackfilled, nlong;
    int nbehind_quota;      /* backfilled ahead of a head that waited for quota */
    bool check_head;        /* predictions exact, one queue: a head starts only after what was
                               backfilled ahead of it has ended */
} psim_t;

static double prediction(const psim_t *P, int j)
{
    int left = P->steps[j] - P->done[j];
    return P->predicted[j] == 0 ? -1 : P->predicted[j] == 1 ? left : KILN_MAX(0, left - 2);
}

/* Runs the stream until every job has run; returns the tick it ended at. livelock: the bait. */
static int psim_run(psim_t *P, unsigned seed, int k_protect)
{
    sim_t *S = &P->S;
    sched_job_t pend[MAXJ];
    int idx[MAXJ], order[MAXJ], ridx[MAXJ];
    static sched_decision_t out[MAXJ];
    static sched_running_t run[MAXJ];
    int now = 0;
    for (; now < 20000; now++) {
        for (int j = 0; j < S->nj; j++) {
            if (S->state[j] == 2 && P->done[j] >= P->steps[j]) {
                S->state[j] = 3;
            } else if (S->state[j] == 5) { /* stopped after a preemption: back to waiting */
                S->state[j] = 1;
            } else if (S->state[j] == 0 && S->submit_at[j] <= now) {
                S->state[j] = 1;
                continue;
            } else {
                continue;
            }
            for (int x = 0; x < S->pl[j].nodes; x++)
                S->w[S->pl[j].worker[x]].slots_free += S->job[j].slots_per_node;
            S->q[S->job[j].queue].usage[S->job[j].type] -= S->job[j].nodes * S->job[j].slots_per_node;
        }
        int np = 0, nr = 0;
        for (int prio = 2; prio >= 0; prio--)
            for (int j = 0; j < S->nj; j++)
                if (S->state[j] == 1 && S->job[j].priority == prio) {
                    idx[np] = j;
                    pend[np] = S->job[j];
                    pend[np].runtime_s = prediction(P, j);
                    pend[np].preempted_by = P->last_by[j];
                    np++;
                }
        for (int j = 0; j < S->nj; j++)
            if (S->state[j] == 2 || S->state[j] == 6) {
                ridx[nr] = j;
                for (int x = 0; x < S->pl[j].nodes; x++)
                    P->worker_idx[j][x] = S->pl[j].worker[x];
                run[nr] = (sched_running_t){.id = S->ids[j], .queue = S->job[j].queue, .type = S->job[j].type,
                                            .priority = S->job[j].priority, .nodes = S->job[j].nodes,
                                            .slots_per_node = S->job[j].slots_per_node, .worker = P->worker_idx[j],
                                            .preemptible = S->state[j] == 2, .freeing = S->state[j] == 6,
                                            .steps_lost = P->done[j] % P->ckpt_every[j],
                                            .preemptions = P->preemptions[j], .start_s = P->started[j],
                                            .end_s = P->predicted[j] ? now + prediction(P, j) : -1,
                                            .backfilled = P->backfilled[j], .backfill_end_s = P->backfill_end[j]};
                nr++;
            }
        bool live = false;
        for (int j = 0; j < S->nj; j++)
            live = live || (S->state[j] != 3 && S->state[j] != 4);
        if (!live)
            break;
        sched_snapshot_t snap = {.workers = S->w, .nworkers = S->nw, .queues = S->q, .nqueues = S->nq, .jobs = pend,
                                 .njobs = np, .project_usage = S->proj, .nprojects = MAXQ * 3, .running = run,
                                 .nrunning = nr, .now_s = now, .protect_after = k_protect};
        int n = -1;
        cr_assert_eq(sched_admit(&snap, out, order, &n), 0);
        /* victims: each allowed, none twice */
        bool taken[MAXJ] = {0};
        for (int p = 0; p < np; p++) {
            cr_assert(out[p].outcome >= SCHED_ADMITTED && out[p].outcome <= SCHED_PREEMPTING);
            if (out[p].outcome != SCHED_ADMITTED)
                cr_assert_neq(out[p].reason[0], '\0', "seed %u: job %s waits without a reason", seed, pend[p].id);
            for (int v = 0; out[p].outcome == SCHED_PREEMPTING && v < out[p].nvictims; v++) {
                int r = out[p].victims[v];
                cr_assert(r >= 0 && r < nr && !taken[r], "seed %u: victim %d chosen twice", seed, r);
                taken[r] = true;
                cr_assert(is_candidate(S->q, &pend[p], &run[r], k_protect, now),
                          "seed %u t %d: %s may not preempt %s (priorities %d, %d; %d preemption(s) before)", seed, now,
                          pend[p].id, run[r].id, pend[p].priority, run[r].priority, run[r].preemptions);
            }
        }
        for (int k = 0; k < n; k++) {
            int p = order[k], j = idx[p];
            const sched_placement_t *pl = &out[p].pl;
            cr_assert_eq(out[p].outcome, SCHED_ADMITTED);
            cr_assert_eq(pl->nodes, S->job[j].nodes, "seed %u: job %s's gang is not whole", seed, S->job[j].id);
            for (int a = 0; a < pl->nodes; a++) {
                cr_assert_str_eq(S->w[pl->worker[a]].slot_type, sched_slot_type_name(S->job[j].type));
                for (int b = 0; b < a; b++)
                    cr_assert_neq(pl->worker[a], pl->worker[b]);
                S->w[pl->worker[a]].slots_free -= S->job[j].slots_per_node;
            }
            S->q[S->job[j].queue].usage[S->job[j].type] += S->job[j].nodes * S->job[j].slots_per_node;
            S->state[j] = 2;
            S->pl[j] = *pl;
            P->started[j] = now;
            P->backfilled[j] = out[p].backfilled;
            P->backfill_end[j] = out[p].end_s;
            if (out[p].backfilled) {
                int h = idx[out[p].behind_head];
                P->bf_head[j] = h + 1;
                P->bf_long[j] = out[p].end_s > out[p].head_start_s;
                P->nbackfilled++;
                P->nbehind_quota += out[out[p].behind_head].outcome == SCHED_WAIT_QUOTA;
                P->nlong += P->bf_long[j];
                if (P->head_at[h] < 0 || out[p].head_start_s < P->head_at[h])
                    P->head_at[h] = out[p].head_start_s;
            }
            for (int b = 0; P->check_head && b < S->nj; b++)
                if (P->bf_head[b] == j + 1 && !P->bf_long[b])
                    cr_assert_eq(S->state[b], 3, "seed %u t %d: head %s started while %s, backfilled ahead of it, "
                                 "still runs", seed, now, S->ids[j], S->ids[b]);
            if (P->check_head && P->head_at[j] >= 0)
                cr_assert_leq(now, P->head_at[j] + 1e-9, "seed %u: head %s started at %d, after %g, its earliest "
                              "start when jobs were backfilled ahead of it", seed, S->ids[j], now, P->head_at[j]);
            if (out[p].backfilled)
                cr_assert(P->predicted[j] && out[p].end_s <= now + prediction(P, j) + 1e-9);
        }
        for (int p = 0; p < np; p++) {
            if (out[p].outcome == SCHED_WAIT_WORKERS || out[p].outcome == SCHED_WAIT_NEVER_QUOTA)
                S->state[idx[p]] = 4;
            for (int v = 0; out[p].outcome == SCHED_PREEMPTING && v < out[p].nvictims; v++) {
                int j = ridx[out[p].victims[v]];
                int keep = P->done[j] - P->done[j] % P->ckpt_every[j];
                P->lost += P->done[j] - keep;
                P->done[j] = keep;
                P->preemptions[j]++;
                P->last_by[j] = pend[p].id;
                P->npreempt++;
                if (idx[p] < 150 && j < 150)
                    P->pair[idx[p]][j] = true;
                S->state[j] = 6; /* stopping: frees its slots at the next tick */
            }
        }
        for (int j = 0; j < S->nj; j++)
            if (S->state[j] == 2)
                P->done[j]++;
            else if (S->state[j] == 6)
                S->state[j] = 5;
        sim_check(S, seed, now);
    }
    for (int j = 0; j < S->nj; j++)
        cr_assert(S->state[j] == 3 || S->state[j] == 4, "seed %u: job %s never finished (state %d, %d preemption(s)) "
                  "after %d ticks", seed, S->job[j].id, S->state[j], P->preemptions[j], now);
    return now;
}

static void psim_make(psim_t *P, unsigned seed)
{
    memset(P, 0, sizeof(*P));
    sim_make(&P->S, seed);
    for (int j = 0; j < MAXJ; j++)
        P->head_at[j] = -1;
    unsigned s = seed * 7919u, ps = seed * 2654435761u;
    if (seed % 2 == 0) /* half the streams with random preemption policies, the others the default */
        random_policies(P->S.q, P->S.nq, &ps);
    P->S.nj = KILN_MIN(P->S.nj, 150);
    for (int j = 0; j < P->S.nj; j++) {
        P->steps[j] = P->S.ends_at[j];
        P->S.mask[j] = ~0u;
        P->ckpt_every[j] = 1 + (int)(rnd(&s) % 8);
        P->predicted[j] = (int)(rnd(&s) % 3);
    }
}

Test(admit, random_streams_with_preemption_and_backfill_keep_the_invariants, .timeout = 120)
{
    const char *env = getenv("KILN_ADMIT_SEEDS");
    int seeds = env ? atoi(env) / 2 : 100;
    static psim_t P;
    int preempts = 0, lost = 0;
    for (unsigned seed = 1; seed <= (unsigned)seeds; seed++) {
        psim_make(&P, seed);
        psim_run(&P, seed, 3);
        preempts += P.npreempt;
        lost += P.lost;
        for (int j = 0; j < P.S.nj; j++)
            cr_assert_leq(P.preemptions[j], 3 + 2 * P.S.nj, "seed %u", seed);
    }
    cr_assert_gt(preempts, 20, "only %d preemptions in %d streams", preempts, seeds);
}

/* Runs 60 seeded streams of one queue, every job of one priority with an exact prediction, and
 * checks that no head starts after the earliest start it had when jobs were backfilled ahead of
 * it. quota: the queue's quota is half the slots of each type (at least the largest job's 12), so
 * heads wait for quota as well as for slots; else it has none. Adds up what the runs did. */
static void never_delays(bool quota, int *backfilled, int *longer, int *behind_quota)
{
    static psim_t P;
    for (unsigned seed = 1; seed <= 60; seed++) {
        psim_make(&P, seed);
        int total[SCHED_NTYPES] = {0, 0};
        for (int i = 0; i < P.S.nw; i++)
            total[sched_slot_type(P.S.w[i].slot_type)] += P.S.w[i].slots;
        P.S.nq = 1;
        P.S.q[0] = quota ? queue("default", NULL, KILN_MAX(12, total[0] / 2), KILN_MAX(12, total[1] / 2))
                         : queue("default", NULL, U, U);
        for (int j = 0; j < P.S.nj; j++) {
            P.S.job[j].queue = 0;
            P.S.job[j].priority = 0;
            P.S.job[j].project = 0;
            P.predicted[j] = 1;
            /* submitted in the order of their ids (the order of age here), so no job that arrives
             * later goes ahead of a head */
            for (int k = j; k > 0 && P.S.submit_at[k - 1] > P.S.submit_at[k]; k--) {
                int t = P.S.submit_at[k];
                P.S.submit_at[k] = P.S.submit_at[k - 1];
                P.S.submit_at[k - 1] = t;
            }
        }
        P.check_head = true;
        psim_run(&P, seed, 3);
        *backfilled += P.nbackfilled;
        *longer += P.nlong;
        *behind_quota += P.nbehind_quota;
        cr_assert_eq(P.npreempt, 0);
    }
}

Test(admit, backfill_never_delays_the_head_with_exact_predictions)
{
    int backfilled = 0, longer = 0, behind_quota = 0;
    never_delays(false, &backfilled, &longer, &behind_quota);
    cr_assert_gt(backfilled, 30, "only %d jobs were backfilled: the runs show little", backfilled);
    cr_assert_gt(longer, 10, "only %d jobs were backfilled past a head's start: the runs show little", longer);
}

Test(admit, backfill_behind_quota_never_delays_the_head_with_exact_predictions)
{
    int backfilled = 0, longer = 0, behind_quota = 0;
    never_delays(true, &backfilled, &longer, &behind_quota);
    cr_assert_gt(backfilled, 30, "only %d jobs were backfilled: the runs show little", backfilled);
    cr_assert_gt(behind_quota, 10, "only %d jobs were backfilled ahead of a head waiting for quota", behind_quota);
}

Test(admit, livelock_bait_every_job_finishes)
{
    /* Two queues of one cohort (quota 2 each on one worker of 4 slots) that borrow from each other
     * in turn, every job of equal priority: first queue a's two long jobs borrow, and queue b's short
     * jobs, arriving one every 6 ticks within b's quota, reclaim; then the other way round. Every
     * job finishes, none is preempted more than k times (the protection is reached), and two jobs
     * never preempt each other back and forth. */
    for (int k = 1; k <= 3; k++) {
        static psim_t P;
        memset(&P, 0, sizeof(P));
        sim_t *S = &P.S;
        S->nw = 1;
        S->w[0] = (sched_worker_t){.id = "w0", .slot_type = "cpu", .slots = 4, .slots_free = 4};
        S->nq = 2;
        S->q[0] = queue("a", "c", 2, 0);
        S->q[1] = queue("b", "c", 2, 0);
        S->nj = 0;
        for (int phase = 0; phase < 2; phase++) {
            int t0 = phase * 300, longq = phase, shortq = 1 - phase;
            for (int i = 0; i < 12; i++) {
                int j = S->nj++;
                bool lng = i < 2;
                int q = lng ? longq : shortq;
                snprintf(S->ids[j], sizeof S->ids[j], "%c%s%d", q ? 'b' : 'a', lng ? "long" : "short", j);
                S->job[j] = job(S->ids[j], q, 1, 1, 2, 0);
                S->job[j].project = q;
                S->submit_at[j] = lng ? t0 : t0 + 2 + 6 * (i - 2);
                P.steps[j] = lng ? 40 : 3;
                P.ckpt_every[j] = 4;
                S->mask[j] = ~0u;
            }
        }
        int end = psim_run(&P, (unsigned)k, k);
        cr_assert_lt(end, 1000, "k %d: the bait took %d ticks", k, end);
        int most = 0;
        for (int j = 0; j < S->nj; j++) {
            cr_assert_leq(P.preemptions[j], k, "k %d: job %s preempted %d times by jobs of its priority", k,
                          S->ids[j], P.preemptions[j]);
            most = KILN_MAX(most, P.preemptions[j]);
            for (int i = 0; i < S->nj; i++)
                cr_assert_not(P.pair[i][j] && P.pair[j][i], "k %d: %s and %s preempted each other", k, S->ids[i],
                              S->ids[j]);
        }
        cr_assert_eq(most, k, "k %d: no job reached the protection (most preemptions %d): the bait shows little", k,
                     most);
    }
}
