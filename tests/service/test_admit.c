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
                     .type = type};
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
    cr_assert(strstr(out[0].reason, "borrowing_limit allows (at most 6)"), "%s", out[0].reason);
    cr_assert_eq(out[1].outcome, SCHED_ADMITTED, "6 = 4 + 2: %s", out[1].reason);
    /* cv keeps 5 of its 8: nlp may borrow 3 at most */
    q[0].borrowing_limit[0] = U;
    q[1].lending_limit[0] = 3;
    sched_job_t k[] = {job("k1", 0, 0, 1, 8, 0), job("k2", 0, 0, 1, 7, 0)};
    pass(w, 1, q, 2, k, 2, out, order);
    cr_assert_eq(out[0].outcome, SCHED_WAIT_NEVER_QUOTA, "%s", out[0].reason);
    cr_assert(strstr(out[0].reason, "lending_limit allows (at most 7)"), "%s", out[0].reason);
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
    cr_assert(strstr(out[0].reason, "more than the alive workers have"), "%s", out[0].reason);
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
