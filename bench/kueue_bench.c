/* kueue_bench.c - Kueue's scheduler benchmark replayed on kiln (issue 28, Performance): 5 cohorts x
 * 6 queues (nominal quota 20 cpu slots, borrowing limit 100), per queue 350 small jobs (1 slot,
 * 200 ms, priority 50, one every 100 ms), 100 medium (5 slots, 500 ms, priority 100, every 500 ms)
 * and 50 large (20 slots, 1 s, priority 200, every 1.2 s) on 30 workers of 20 slots, through the
 * real service and its real scheduler thread on a real PostgreSQL database:
 *   - queues are made with svc_queue_create (what POST /v1/queues calls), jobs submitted with
 *     svc_job_create (what POST /v1/jobs and gRPC CreateJob call) at the given rates;
 *   - simulated agents, one per worker, call what the agent's RPCs reach, on two threads each as
 *     kiln-agent has: the heartbeat loop calls svc_agent_register, then svc_agent_heartbeat (every
 *     --heartbeat-ms, with the (job, attempt) pairs they run, and at once when kilnd nudges the
 *     worker: svc_on_work, the hook behind gRPC's WatchWork, as the real agent's watch thread wakes
 *     its heartbeat loop; --no-push for heartbeats alone), starts each assignment's ranks and queues
 *     its "started" report; the sender sends what has queued up in its outbox (up to 256 reports) in
 *     one svc_agent_report_batch call, in order, as kiln-agent's sender does (agent/sender.c: the
 *     statuses and exits at the head of its outbox in one ReportBatch RPC): "started" reports (with
 *     a rendezvous port) and one exit per rank, code 0, queued the moment the
 *     job's runtime has passed (as the agent's reaper does on waitpid; its heartbeats report the
 *     attempt until its last exit is sent, so that kilnd does not deliver it again while its reports
 *     wait in the outbox); a stop order (a preemption)
 *     ends the ranks at once with code 143, as ranks stopped by SIGTERM after their checkpoint do,
 *     and the job waits in its queue again. --single-reports: one svc_agent_rank_status or
 *     svc_agent_rank_exit call per report, as kiln-agent does with a kilnd older than ReportBatch.
 * Then, on a fresh database, a backlog: --backlog jobs of the same mix submitted before any worker
 * registers, then the workers and agents start; every scheduler pass is recorded
 * (svc_sched_record), with the jobs pending when it began (all but those admitted before it).
 * Prints wall time to all done, average usage (busy slot-seconds / (slots x wall)), average time
 * to admission (creation to first SCHEDULED) per size, preemptions, and the pass times. Not a test.
 *
 * usage: kueue_bench [--database-url URL] [--scale 1] [--heartbeat-ms 250] [--backlog 10000] [--trace]
 * The database URL defaults to KILN_DATABASE_URL, then KILN_PG_URL (scripts/pg.sh); a fresh
 * database is created in that cluster for each phase and dropped afterwards. */
#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "service/service.h"

#define NCOHORTS 5
#define QPER 6
#define NQUEUES (NCOHORTS * QPER)
#define MAX_WORKERS 64
#define MAX_RUN 64 /* assignments one worker holds at once (20 slots: at most 20) */

typedef struct size_class {
    const char *name;
    int slots, priority, count;
    double runtime_s, every_s;
} size_class_t;

static size_class_t sizes[3] = {
    {"small", 1, 50, 350, 0.2, 0.1},
    {"medium", 5, 100, 100, 0.5, 0.5},
    {"large", 20, 200, 50, 1.0, 1.2},
};

static svc_t *svc;
static const char *admin_url;
static double scale = 1.0;
static int64_t heartbeat_ms = 250, nworkers = 30, worker_slots = 20, backlog = 10000, timeout_s = 900;
static const char *phase = "all";
static bool pg_stats, no_push, single_reports, agents_niced, analyze_backlog;
static atomic_long completed, preempt_stops, submit_errors, agent_errors;
static atomic_bool stop_agents;
static int64_t t0_us;

/* ---- database helpers ------------------------------------------------------------------------- */

static int admin_sql(const char *sql)
{
    PGconn *c = PQconnectdb(admin_url);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "kueue_bench: could not connect: %s", PQerrorMessage(c));
        PQfinish(c);
        return -1;
    }
    PGresult *r = PQexec(c, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok)
        fprintf(stderr, "kueue_bench: %s: %s", sql, PQerrorMessage(c));
    PQclear(r);
    PQfinish(c);
    return ok ? 0 : -1;
}

/* One value of a one-row query on conn, as a double (NaN when it failed or was NULL). */
static double sql_num(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    double v = 0.0 / 0.0;
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0))
        v = atof(PQgetvalue(r, 0, 0));
    else if (PQresultStatus(r) != PGRES_TUPLES_OK)
        fprintf(stderr, "kueue_bench: %s: %s", sql, PQerrorMessage(c));
    PQclear(r);
    return v;
}

/* base/job_states.h's states whose kind is kind (is_kind) or is not (!is_kind), as an SQL list
 * "'A', 'B'" written into buf (n bytes); returns buf. */
static const char *states_sql(kiln_job_kind_t kind, bool is_kind, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
#define STATES_SQL_(name, num, k)                                                                    \
    if ((KILN_JOB_KIND_##k == kind) == is_kind && len < n)                                           \
        len += (size_t)snprintf(buf + len, n - len, "%s'%s'", len ? ", " : "", #name);
    KILN_JOB_STATES(STATES_SQL_)
#undef STATES_SQL_
    return buf;
}

/* ---- the simulated agents --------------------------------------------------------------------- */

typedef struct run_slot {
    char job[40];
    int attempt, nranks, ranks[32];
    int64_t end_us; /* when its ranks exit with code 0 */
    bool ended;     /* its exits are queued: it is dropped when the last is sent (until then its
                       heartbeats report it, so that kilnd does not deliver it again meanwhile) */
} run_slot_t;

/* ---- --trace: where an attempt's time goes on the agent's side, step by step (kiln_mono_us) ---- */

typedef struct step_stat {
    atomic_llong sum_us, n, max_us;
} step_stat_t;

enum {
    ST_NUDGE_TO_HB,  /* kilnd's nudge (svc_on_work) -> the agent's heartbeat begins */
    ST_HB_DELIVER,   /* a heartbeat that delivered assignments: the call, start to return */
    ST_HB_PER_ASSIGN,/* the same, per assignment it delivered */
    ST_HB_EMPTY,     /* a heartbeat that delivered nothing */
    ST_STATUS,       /* svc_agent_rank_status (started): the call */
    ST_END_LAG,      /* the runtime's end -> the agent acts on it */
    ST_EXIT_CALL,    /* one svc_agent_rank_exit */
    ST_EXITS_JOB,    /* all of an attempt's rank exits, the first call's start to the last's return */
    ST_EXIT_TO_PASS, /* the last exit's return -> the next scheduler pass begins */
    ST_COMMIT_TO_NUDGE, /* the commit of the admitting pass before a nudge -> the nudge */
    ST_BATCH_CALL,   /* one svc_agent_report_batch */
    ST_BATCH_REPORTS,/* the reports it carried (a count, not ms) */
    ST_N_
};
static const char *step_names[ST_N_] = {
    "nudge -> heartbeat begins", "heartbeat delivering (call)", "  per assignment delivered",
    "heartbeat delivering nothing (call)", "start report (call)", "runtime's end -> agent acts",
    "one rank exit (call)", "an attempt's rank exits (all calls)", "last exit -> next pass begins",
    "pass's commit -> nudge (notify path)", "report batch (call)", "  reports per batch (count)",
};
static step_stat_t steps[ST_N_];
static bool trace;
/* the last exits' return times of completed attempts, and the nudges' times, for the pass gaps */
#define MAX_MARKS 400000
static int64_t *exit_marks, *nudge_marks;
static atomic_int n_exit_marks, n_nudge_marks;

static void step_add(int k, int64_t us)
{
    if (us < 0)
        us = 0;
    atomic_fetch_add(&steps[k].sum_us, us);
    atomic_fetch_add(&steps[k].n, 1);
    long long m = atomic_load(&steps[k].max_us);
    while (us > m && !atomic_compare_exchange_weak(&steps[k].max_us, &m, us)) {
    }
}

static void mark(int64_t *marks, atomic_int *n, int64_t at)
{
    int i = atomic_fetch_add(n, 1);
    if (marks && i < MAX_MARKS)
        marks[i] = at;
}

/* A report in a worker's outbox: sent in order by its sender thread, as kiln-agent's sender drains
 * its outbox (agent/sender.c): "started" reports and rank exits. */
typedef struct report {
    bool exit;           /* a rank exit; else a "started" report */
    char job[40];
    int attempt, rank, code, port;
    bool last;           /* the attempt's last rank exit */
    int64_t end_us;      /* an exit: when its runtime ended (0: a stop order's) */
} report_t;
#define MAX_OUT 2048

typedef struct worker {
    char id[64];
    pthread_mutex_t mu;  /* run, nrun and the outbox */
    pthread_cond_t out_cv; /* the sender's: a report queued, or the queue's end */
    run_slot_t run[MAX_RUN];
    int nrun;
    report_t out[MAX_OUT];
    int out_head, out_n;
    int64_t next_hb_us;
    atomic_bool nudged; /* kilnd has work for it: heartbeat now */
    atomic_llong nudged_at_us; /* when (the first nudge not yet acted on) */
    arena_t arena;
} worker_t;

static worker_t workers[MAX_WORKERS];

/* Each worker's agent has two threads, as kiln-agent has: the heartbeat loop (woken by kilnd's
 * nudge or its interval; it takes assignments, starts their "ranks" and queues the "started"
 * reports, and acts on stop orders) and the sender (it queues each rank's exit when its runtime
 * has passed, as the agent's reaper does on waitpid, and sends the reports in order). */
static pthread_mutex_t agent_mu[MAX_WORKERS];
static pthread_cond_t agent_cv[MAX_WORKERS];
static bool agent_woken[MAX_WORKERS];

/* svc_on_work's hook (the notify thread, after the commit): what WatchWork's nudge does. */
static void on_work(void *ud, const char *worker_id)
{
    (void)ud;
    for (int i = 0; i < nworkers; i++)
        if (strcmp(workers[i].id, worker_id) == 0) {
            int64_t now = kiln_mono_us();
            long long zero = 0;
            atomic_compare_exchange_strong(&workers[i].nudged_at_us, &zero, now);
            if (trace)
                mark(nudge_marks, &n_nudge_marks, now);
            atomic_store(&workers[i].nudged, true);
            int t = i;
            pthread_mutex_lock(&agent_mu[t]);
            agent_woken[t] = true;
            pthread_cond_signal(&agent_cv[t]);
            pthread_mutex_unlock(&agent_mu[t]);
            return;
        }
}

static double runtime_of(int world_size)
{
    for (int k = 0; k < 3; k++)
        if (sizes[k].slots == world_size)
            return sizes[k].runtime_s;
    return 1.0;
}

static void agent_err(const char *what, const kiln_err_t *err)
{
    if (atomic_fetch_add(&agent_errors, 1) < 10)
        fprintf(stderr, "kueue_bench: agent: %s: %s\n", what, err->message);
}

/* Queues a report (w->mu held). */
static void out_put_locked(worker_t *w, const report_t *r)
{
    if (w->out_n == MAX_OUT) {
        kiln_err_t err;
        kiln_err_set(&err, KILN_ENOMEM, NULL, "worker %s: outbox full, a report dropped", w->id);
        agent_err("outbox", &err);
        return;
    }
    w->out[(w->out_head + w->out_n++) % MAX_OUT] = *r;
    pthread_cond_signal(&w->out_cv);
}

/* Queues the exits of run slot i's ranks with exit code `code` (w->mu held). */
static void end_ranks_locked(worker_t *w, int i, int code, int64_t end_us)
{
    run_slot_t *r = &w->run[i];
    for (int k = 0; k < r->nranks; k++) {
        report_t rep = {.exit = true, .attempt = r->attempt, .rank = r->ranks[k], .code = code,
                        .last = k == r->nranks - 1, .end_us = end_us};
        kiln_strlcpy(rep.job, r->job, sizeof rep.job);
        out_put_locked(w, &rep);
    }
    r->ended = true;
}

/* Drops the run slot of (job, attempt), its last exit sent. */
static void run_drop(worker_t *w, const char *job, int attempt)
{
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < w->nrun; i++)
        if (w->run[i].attempt == attempt && strcmp(w->run[i].job, job) == 0) {
            w->run[i] = w->run[--w->nrun];
            break;
        }
    pthread_mutex_unlock(&w->mu);
}

/* What the sender does once a report is through (sent alone or in a batch): an exit's steps,
 * and the attempt's end with its last exit. t_call, t_end: the call that carried it. */
static void report_sent(worker_t *w, const report_t *r, int64_t t_call, int64_t t_end, int64_t *first_exit_us)
{
    if (!r->exit)
        return;
    if (*first_exit_us == 0) {
        *first_exit_us = t_call;
        if (r->code == 0)
            step_add(ST_END_LAG, t_call - r->end_us);
    }
    if (r->last) {
        run_drop(w, r->job, r->attempt);
        if (r->code == 0) {
            step_add(ST_EXITS_JOB, t_end - *first_exit_us);
            if (trace)
                mark(exit_marks, &n_exit_marks, t_end);
            atomic_fetch_add(&completed, 1);
        }
        *first_exit_us = 0;
    }
}

/* Sends one report. */
static void send_report(worker_t *w, const report_t *r, int64_t *first_exit_us)
{
    kiln_err_t err;
    int64_t t_call = kiln_mono_us();
    if (!r->exit) {
        Kiln__RankStatus st = KILN__RANK_STATUS__INIT;
        st.worker_id = w->id;
        st.job_id = (char *)r->job;
        st.attempt = r->attempt;
        st.started = true;
        st.reason = "";
        st.master_port = r->port;
        if (svc_agent_rank_status(svc, w->id, &st, &err))
            agent_err("rank status", &err);
        step_add(ST_STATUS, kiln_mono_us() - t_call);
        return;
    }
    Kiln__RankExit rq = KILN__RANK_EXIT__INIT;
    rq.worker_id = w->id;
    rq.job_id = (char *)r->job;
    rq.attempt = r->attempt;
    rq.rank = r->rank;
    rq.exit_code = r->code;
    rq.reason = r->code ? "stopped on SIGTERM after a checkpoint" : "";
    if (svc_agent_rank_exit(svc, w->id, &rq, &err))
        agent_err("rank exit", &err);
    int64_t t_end = kiln_mono_us();
    step_add(ST_EXIT_CALL, t_end - t_call);
    report_sent(w, r, t_call, t_end, first_exit_us);
}

#define BATCH_MAX SVC_REPORT_BATCH_MAX /* kiln-agent's AGENT_BATCH_MAX */

/* Sends reports r[0..n) in one svc_agent_report_batch call, as kiln-agent's sender does. A
 * report not handled (a retryable result) is counted as an error: nothing here is retried. */
static void send_batch(worker_t *w, const report_t *r, int n, arena_t *arena, int64_t *first_exit_us)
{
    Kiln__Report reps[BATCH_MAX], *repp[BATCH_MAX];
    Kiln__RankStatus st[BATCH_MAX];
    Kiln__RankExit ex[BATCH_MAX];
    for (int i = 0; i < n; i++) {
        kiln__report__init(&reps[i]);
        if (!r[i].exit) {
            kiln__rank_status__init(&st[i]);
            st[i].worker_id = w->id;
            st[i].job_id = (char *)r[i].job;
            st[i].attempt = r[i].attempt;
            st[i].started = true;
            st[i].reason = "";
            st[i].master_port = r[i].port;
            reps[i].kind_case = KILN__REPORT__KIND_STATUS;
            reps[i].status = &st[i];
        } else {
            kiln__rank_exit__init(&ex[i]);
            ex[i].worker_id = w->id;
            ex[i].job_id = (char *)r[i].job;
            ex[i].attempt = r[i].attempt;
            ex[i].rank = r[i].rank;
            ex[i].exit_code = r[i].code;
            ex[i].reason = r[i].code ? "stopped on SIGTERM after a checkpoint" : "";
            reps[i].kind_case = KILN__REPORT__KIND_EXIT;
            reps[i].exit = &ex[i];
        }
        repp[i] = &reps[i];
    }
    Kiln__ReportBatchRequest rq = KILN__REPORT_BATCH_REQUEST__INIT;
    rq.worker_id = w->id;
    rq.n_reports = (size_t)n;
    rq.reports = repp;
    Kiln__ReportBatchReply out = KILN__REPORT_BATCH_REPLY__INIT;
    kiln_err_t err;
    arena_reset(arena);
    int64_t t_call = kiln_mono_us();
    if (svc_agent_report_batch(svc, w->id, &rq, arena, &out, &err))
        agent_err("report batch", &err);
    int64_t t_end = kiln_mono_us();
    step_add(ST_BATCH_CALL, t_end - t_call);
    step_add(ST_BATCH_REPORTS, (int64_t)n * 1000); /* printed in "ms": a count */
    for (size_t i = 0; i < out.n_results; i++)
        if (out.results[i]->code != 0) {
            kiln_err_set(&err, KILN_EINTERNAL, NULL, "report %zu: gRPC status %d: %s", i, out.results[i]->code,
                         out.results[i]->message);
            agent_err("report batch", &err);
        }
    for (int i = 0; i < n; i++)
        report_sent(w, &r[i], t_call, t_end, first_exit_us);
}

static void *sender_main(void *p)
{
    worker_t *w = p;
    int64_t first_exit_us = 0;
    report_t *batch = calloc(BATCH_MAX, sizeof(*batch));
    arena_t arena;
    arena_init(&arena, 64 << 10);
    pthread_mutex_lock(&w->mu);
    while (!atomic_load(&stop_agents)) {
        /* ranks whose runtime has passed exit with code 0 (the reaper's waitpid) */
        int64_t now = kiln_mono_us(), next = now + 50000;
        for (int k = 0; k < w->nrun; k++) {
            if (w->run[k].ended)
                continue;
            if (w->run[k].end_us <= now)
                end_ranks_locked(w, k, 0, w->run[k].end_us);
            else
                next = KILN_MIN(next, w->run[k].end_us);
        }
        if (w->out_n == 0) {
            struct timespec ts;
            int64_t ns = next * 1000; /* kiln_mono_us is CLOCK_MONOTONIC */
            ts.tv_sec = ns / 1000000000;
            ts.tv_nsec = ns % 1000000000;
            pthread_cond_timedwait(&w->out_cv, &w->mu, &ts);
            continue;
        }
        int n = single_reports || !batch ? 1 : KILN_MIN(w->out_n, BATCH_MAX);
        report_t one;
        report_t *r = n == 1 ? &one : batch;
        for (int i = 0; i < n; i++) {
            r[i] = w->out[w->out_head];
            w->out_head = (w->out_head + 1) % MAX_OUT;
            w->out_n--;
        }
        pthread_mutex_unlock(&w->mu);
        if (single_reports)
            send_report(w, r, &first_exit_us);
        else
            send_batch(w, r, n, &arena, &first_exit_us);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    arena_deinit(&arena);
    free(batch);
    return NULL;
}

/* One heartbeat of worker w, and what the agent does with its answer. */
static void agent_beat(worker_t *w)
{
    kiln_err_t err;
    Kiln__HeartbeatRequest rq = KILN__HEARTBEAT_REQUEST__INIT;
    Kiln__RunningRank rr[MAX_RUN], *rrp[MAX_RUN];
    char jobs[MAX_RUN][40];
    rq.worker_id = w->id;
    pthread_mutex_lock(&w->mu);
    int nrun = w->nrun;
    for (int i = 0; i < nrun; i++) {
        kiln__running_rank__init(&rr[i]);
        kiln_strlcpy(jobs[i], w->run[i].job, sizeof jobs[i]);
        rr[i].job_id = jobs[i];
        rr[i].attempt = w->run[i].attempt;
        rr[i].rank = w->run[i].ranks[0];
        rrp[i] = &rr[i];
    }
    pthread_mutex_unlock(&w->mu);
    rq.running = rrp;
    rq.n_running = (size_t)nrun;
    arena_reset(&w->arena);
    Kiln__HeartbeatResponse rs = KILN__HEARTBEAT_RESPONSE__INIT;
    int64_t t_hb = kiln_mono_us();
    long long nudged_at = atomic_exchange(&w->nudged_at_us, 0);
    if (nudged_at)
        step_add(ST_NUDGE_TO_HB, t_hb - nudged_at);
    int hrc = svc_agent_heartbeat(svc, w->id, &rq, &w->arena, &rs, &err);
    int64_t t_hb_end = kiln_mono_us();
    if (rs.n_assignments > 0) {
        step_add(ST_HB_DELIVER, t_hb_end - t_hb);
        for (size_t a = 0; a < rs.n_assignments; a++)
            step_add(ST_HB_PER_ASSIGN, (t_hb_end - t_hb) / (int64_t)rs.n_assignments);
    } else {
        step_add(ST_HB_EMPTY, t_hb_end - t_hb);
    }
    if (hrc) {
        agent_err("heartbeat", &err);
        return;
    }
    if (rs.reregister) {
        kiln_err_set(&err, KILN_ESTATE, NULL, "worker %s was told to register again", w->id);
        agent_err("heartbeat", &err);
    }
    pthread_mutex_lock(&w->mu);
    /* stop orders first: ranks stopped by SIGTERM exit with 143 */
    for (size_t s = 0; s < rs.n_stops; s++)
        for (int i = 0; i < w->nrun; i++)
            if (!w->run[i].ended && w->run[i].attempt == rs.stops[s]->attempt &&
                strcmp(w->run[i].job, rs.stops[s]->job_id) == 0) {
                atomic_fetch_add(&preempt_stops, 1);
                end_ranks_locked(w, i, 143, 0);
                break;
            }
    /* new assignments: the ranks start now and run their runtime; the "started" report is queued */
    for (size_t a = 0; a < rs.n_assignments; a++) {
        const Kiln__Assignment *as = rs.assignments[a];
        bool known = false;
        for (int i = 0; i < w->nrun && !known; i++)
            known = w->run[i].attempt == as->attempt && strcmp(w->run[i].job, as->job_id) == 0;
        if (known || w->nrun >= MAX_RUN)
            continue;
        run_slot_t *r = &w->run[w->nrun++];
        kiln_strlcpy(r->job, as->job_id, sizeof(r->job));
        r->attempt = as->attempt;
        r->nranks = (int)KILN_MIN(as->n_ranks, KILN_ARRAY_LEN(r->ranks));
        for (int k = 0; k < r->nranks; k++)
            r->ranks[k] = as->ranks[k];
        r->end_us = kiln_mono_us() + (int64_t)(runtime_of(as->world_size) * 1e6);
        r->ended = false;
        report_t rep = {.exit = false, .attempt = as->attempt, .port = as->node_rank == 0 ? 29500 : 0};
        kiln_strlcpy(rep.job, as->job_id, sizeof rep.job);
        out_put_locked(w, &rep);
    }
    pthread_mutex_unlock(&w->mu);
}

typedef struct agent_thread {
    int first, step; /* the workers it plays: first, first + step, ... */
} agent_thread_t;

/* The heartbeat loop: at once when nudged, else every --heartbeat-ms. */
static void *agent_main(void *p)
{
    agent_thread_t *t = p;
    while (!atomic_load(&stop_agents)) {
        int64_t now = kiln_mono_us(), next = now + heartbeat_ms * 1000;
        for (int i = t->first; i < nworkers; i += t->step) {
            worker_t *w = &workers[i];
            if (atomic_exchange(&w->nudged, false) || now >= w->next_hb_us) {
                agent_beat(w);
                w->next_hb_us = kiln_mono_us() + heartbeat_ms * 1000;
            }
            next = KILN_MIN(next, w->next_hb_us);
        }
        int64_t sleep_us = next - kiln_mono_us();
        int th = t->first;
        pthread_mutex_lock(&agent_mu[th]);
        if (sleep_us > 0 && !agent_woken[th]) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            int64_t ns = ts.tv_nsec + sleep_us * 1000;
            ts.tv_sec += ns / 1000000000;
            ts.tv_nsec = ns % 1000000000;
            pthread_cond_timedwait(&agent_cv[th], &agent_mu[th], &ts);
        }
        agent_woken[th] = false;
        pthread_mutex_unlock(&agent_mu[th]);
    }
    return NULL;
}

static int register_workers(void)
{
    for (int i = 0; i < nworkers; i++) {
        kiln_err_t err;
        arena_init(&workers[i].arena, 0);
        Kiln__RegisterRequest reg = KILN__REGISTER_REQUEST__INIT;
        Kiln__RegisterResponse out = KILN__REGISTER_RESPONSE__INIT;
        char host[32];
        snprintf(host, sizeof host, "sim-%02d", i);
        reg.hostname = host;
        reg.address = "127.0.0.1";
        reg.slots = (int32_t)worker_slots;
        reg.slot_type = "cpu";
        if (svc_agent_register(svc, &reg, NULL, &workers[i].arena, &out, &err)) {
            fprintf(stderr, "kueue_bench: register: %s\n", err.message);
            return -1;
        }
        kiln_strlcpy(workers[i].id, out.worker_id, sizeof workers[i].id);
        workers[i].nrun = 0;
        workers[i].out_head = workers[i].out_n = 0;
        workers[i].next_hb_us = 0;
    }
    return 0;
}

/* ---- submission ------------------------------------------------------------------------------ */

static json_t *job_spec(int size, int queue)
{
    char qname[32];
    snprintf(qname, sizeof qname, "c%d-q%d", queue / QPER, queue % QPER);
    return json_pack("{s:s, s:{s:s, s:[i], s:i, s:i}, s:{s:s}, s:{s:f, s:i, s:I},"
                     " s:{s:i, s:i, s:s}, s:i, s:s}",
                     "name", sizes[size].name,
                     "model", "type", "mlp", "hidden", 8, "n_inputs", 4, "n_classes", 2,
                     "data", "train", "synthetic",
                     "hyperparameters", "lr", 0.01, "global_batch_size", 40, "max_steps", (json_int_t)100,
                     "resources", "nodes", 1, "slots_per_node", sizes[size].slots, "slot_type", "cpu",
                     "priority", sizes[size].priority, "queue", qname);
}

static int submit(int size, int queue)
{
    json_t *sp = job_spec(size, queue), *job = NULL;
    bool created = false;
    kiln_err_t err;
    int rc = svc_job_create(svc, svc_caller_kilnd(), sp, NULL, &job, &created, &err);
    if (rc && atomic_fetch_add(&submit_errors, 1) < 10)
        fprintf(stderr, "kueue_bench: submit: %s\n", err.message);
    json_decref(sp);
    json_decref(job);
    return rc;
}

static int count_of(int size) { return (int)(sizes[size].count * scale + 0.5); }

typedef struct submitter {
    int size, part, parts;
    double max_lag_s;
} submitter_t;

/* Submits its size's jobs to queues part, part + parts, ...: job i of queue q at
 * i x every + q x every / 30 after the start (Kueue's generators, one per queue, start together;
 * here each queue's are spread over the interval), as fast as it can when behind. */
static void *submit_main(void *p)
{
    submitter_t *s = p;
    const size_class_t *c = &sizes[s->size];
    int n = count_of(s->size);
    for (int i = 0; i < n; i++)
        for (int q = s->part; q < NQUEUES; q += s->parts) {
            int64_t at = t0_us + (int64_t)((i * c->every_s + q * c->every_s / NQUEUES) * 1e6);
            int64_t now = kiln_mono_us();
            if (at > now)
                usleep((useconds_t)(at - now));
            else
                s->max_lag_s = KILN_MAX(s->max_lag_s, (double)(now - at) / 1e6);
            submit(s->size, q);
        }
    return NULL;
}

/* ---- one phase on a fresh database ------------------------------------------------------------ */

static char bench_url[2048], dbname[64];

static int phase_begin(const char *tag)
{
    snprintf(dbname, sizeof dbname, "kueue_bench_%s_%d", tag, (int)getpid());
    char sql[160];
    snprintf(sql, sizeof sql, "CREATE DATABASE %s", dbname);
    if (admin_sql(sql))
        return -1;
    snprintf(bench_url, sizeof bench_url, "%s dbname=%s", admin_url, dbname);
    svc_config_t cfg = {.database_url = bench_url, .heartbeat_interval_ms = (int)heartbeat_ms,
                        .heartbeat_timeout_ms = 120000, .db_pool_size = 40, .stop_grace_ms = 1000};
    kiln_err_t err;
    if (svc_create(&cfg, &svc, &err)) {
        fprintf(stderr, "kueue_bench: %s\n", err.message);
        return -1;
    }
    for (int q = 0; q < NQUEUES; q++) {
        char name[32], cohort[16];
        snprintf(name, sizeof name, "c%d-q%d", q / QPER, q % QPER);
        snprintf(cohort, sizeof cohort, "c%d", q / QPER);
        json_t *body = json_pack("{s:s, s:s, s:{s:i}, s:{s:i}, s:[s]}", "name", name, "cohort", cohort, "quota",
                                 "cpu", 20, "borrowing_limit", "cpu", 100, "projects", "default");
        json_t *out = NULL;
        int rc = svc_queue_create(svc, svc_caller_kilnd(), body, &out, &err);
        json_decref(body);
        json_decref(out);
        if (rc) {
            fprintf(stderr, "kueue_bench: queue %s: %s\n", name, err.message);
            return -1;
        }
    }
    if (pg_stats) {
        PGconn *c = PQconnectdb(bench_url);
        PQclear(PQexec(c, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"));
        PQclear(PQexec(c, "SELECT pg_stat_statements_reset()"));
        PQfinish(c);
    }
    atomic_store(&completed, 0);
    atomic_store(&preempt_stops, 0);
    memset(steps, 0, sizeof steps);
    atomic_store(&n_exit_marks, 0);
    atomic_store(&n_nudge_marks, 0);
    atomic_store(&stop_agents, false);
    return 0;
}

/* The statements that took the most of the database's time in this phase. */
static void report_statements(void)
{
    PGconn *c = PQconnectdb(bench_url);
    PGresult *r = PQexec(c, "SELECT round(total_exec_time)::bigint, calls, round((total_exec_time / calls)::numeric, 3),"
                            " round(max_exec_time::numeric, 1),"
                            " regexp_replace(left(query, 110), '\\s+', ' ', 'g') FROM pg_stat_statements"
                            " ORDER BY total_exec_time DESC LIMIT 15");
    if (PQresultStatus(r) == PGRES_TUPLES_OK) {
        printf("kueue_bench: database time by statement (total ms, calls, ms per call, max ms, statement):\n");
        for (int i = 0; i < PQntuples(r); i++)
            printf("  %8s %8s %8s %8s  %s\n", PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), PQgetvalue(r, i, 2),
                   PQgetvalue(r, i, 3), PQgetvalue(r, i, 4));
    } else {
        fprintf(stderr, "kueue_bench: pg_stat_statements: %s", PQerrorMessage(c));
    }
    PQclear(r);
    PQfinish(c);
}

static void phase_end(void)
{
    if (pg_stats)
        report_statements();
    svc_destroy(svc);
    svc = NULL;
    for (int i = 0; i < nworkers; i++)
        arena_deinit(&workers[i].arena);
    char sql[160];
    snprintf(sql, sizeof sql, "DROP DATABASE %s", dbname);
    admin_sql(sql);
}

static pthread_t agent_th[MAX_WORKERS], sender_th[MAX_WORKERS];
static agent_thread_t agent_args[MAX_WORKERS];

/* --agents-niced: a simulated agent's thread at the lowest CPU priority (nice 19, this thread
 * only), so that it yields the CPU to the scheduler thread, as agents on other machines would. */
typedef struct agent_start {
    void *(*fn)(void *);
    void *arg;
} agent_start_t;
static agent_start_t agent_starts[2 * MAX_WORKERS];

static void *agent_thread(void *p)
{
    agent_start_t *a = p;
    if (agents_niced && setpriority(PRIO_PROCESS, (id_t)gettid(), 19) != 0)
        perror("kueue_bench: setpriority");
    return a->fn(a->arg);
}

static void agents_start(void)
{
    if (!no_push)
        svc_on_work(svc, on_work, NULL);
    for (int i = 0; i < nworkers; i++) {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&agent_cv[i], &ca);
        pthread_condattr_destroy(&ca);
        pthread_mutex_init(&agent_mu[i], NULL);
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&workers[i].out_cv, &ca);
        pthread_condattr_destroy(&ca);
        pthread_mutex_init(&workers[i].mu, NULL);
        agent_woken[i] = false;
        agent_args[i] = (agent_thread_t){.first = i, .step = (int)nworkers};
        agent_starts[2 * i] = (agent_start_t){agent_main, &agent_args[i]};
        agent_starts[2 * i + 1] = (agent_start_t){sender_main, &workers[i]};
        pthread_create(&agent_th[i], NULL, agent_thread, &agent_starts[2 * i]);
        pthread_create(&sender_th[i], NULL, agent_thread, &agent_starts[2 * i + 1]);
    }
}

static void agents_stop(void)
{
    svc_on_work(svc, NULL, NULL);
    atomic_store(&stop_agents, true);
    for (int i = 0; i < nworkers; i++) {
        pthread_join(agent_th[i], NULL);
        pthread_mutex_lock(&workers[i].mu);
        pthread_cond_signal(&workers[i].out_cv);
        pthread_mutex_unlock(&workers[i].mu);
        pthread_join(sender_th[i], NULL);
        pthread_cond_destroy(&workers[i].out_cv);
        pthread_mutex_destroy(&workers[i].mu);
        pthread_cond_destroy(&agent_cv[i]);
        pthread_mutex_destroy(&agent_mu[i]);
    }
}

/* Waits until `total` jobs have ended (or the timeout); returns 0 when they did. */
static int wait_done(long total)
{
    int64_t last_print = kiln_mono_us();
    PGconn *c = PQconnectdb(bench_url);
    char ended_sql[256], list[160];
    snprintf(ended_sql, sizeof ended_sql, "SELECT count(*) FROM jobs WHERE state IN (%s)",
             states_sql(KILN_JOB_KIND_ENDED, true, list, sizeof list));
    for (;;) {
        double ended = sql_num(c, ended_sql);
        if (ended >= (double)total)
            break;
        if (kiln_mono_us() - t0_us > timeout_s * 1000000) {
            fprintf(stderr, "kueue_bench: only %.0f of %ld jobs ended in %lld s\n", ended, total, (long long)timeout_s);
            PQfinish(c);
            return -1;
        }
        if (kiln_mono_us() - last_print > 10000000) {
            last_print = kiln_mono_us();
            fprintf(stderr, "kueue_bench: %5.0f s: %ld of %ld done, %ld preempted\n",
                    (double)(last_print - t0_us) / 1e6, atomic_load(&completed), total, atomic_load(&preempt_stops));
        }
        usleep(1000000); /* the count takes the database ~20 ms at 15,000 jobs: not more often */
    }
    PQfinish(c);
    return 0;
}

/* The four figures (and preemptions) from the database's job events. */
static void report_figures(const char *what)
{
    PGconn *c = PQconnectdb(bench_url);
    double wall = sql_num(c, "SELECT extract(epoch FROM (SELECT max(time) FROM job_events WHERE to_state = 'COMPLETED')"
                             " - (SELECT min(created_at) FROM jobs))");
    /* slots held: from each attempt's SCHEDULED to the end of that attempt, its first state that
     * holds no slots (ended, waiting again, or parked) */
    char busy_sql[640], holding[160];
    snprintf(busy_sql, sizeof busy_sql,
             "SELECT sum(j.nodes * j.slots_per_node * extract(epoch FROM e.time - s.time))"
             " FROM job_events s JOIN jobs j ON j.id = s.job_id"
             " JOIN LATERAL (SELECT min(time) AS time FROM job_events x WHERE x.job_id = s.job_id"
             "   AND x.attempt = s.attempt AND x.to_state NOT IN (%s)) e ON true WHERE s.to_state = 'SCHEDULED'",
             states_sql(KILN_JOB_KIND_HOLDING, true, holding, sizeof holding));
    double busy = sql_num(c, busy_sql);
    double preempted = sql_num(c, "SELECT count(*) FROM job_events WHERE to_state = 'PREEMPTED'");
    double done = sql_num(c, "SELECT count(*) FROM jobs WHERE state = 'COMPLETED'");
    double all = sql_num(c, "SELECT count(*) FROM jobs");
    printf("kueue_bench: %s: %.0f of %.0f jobs completed, all done in %.1f s of wall time\n", what, done, all, wall);
    printf("kueue_bench: %s: average usage %.1f%% (%.0f busy slot-seconds / (%lld slots x %.1f s))\n", what,
           100.0 * busy / ((double)(nworkers * worker_slots) * wall), busy, (long long)(nworkers * worker_slots), wall);
    for (int k = 2; k >= 0; k--) {
        char sql[600];
        snprintf(sql, sizeof sql,
                 "SELECT avg(extract(epoch FROM f.time - j.created_at)) FROM jobs j JOIN LATERAL"
                 " (SELECT min(time) AS time FROM job_events e WHERE e.job_id = j.id AND e.to_state = 'SCHEDULED')"
                 " f ON true WHERE j.priority = %d", sizes[k].priority);
        double avg = sql_num(c, sql);
        snprintf(sql, sizeof sql,
                 "SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM f.time - j.created_at))"
                 " FROM jobs j JOIN LATERAL (SELECT min(time) AS time FROM job_events e WHERE e.job_id = j.id"
                 " AND e.to_state = 'SCHEDULED') f ON true WHERE j.priority = %d", sizes[k].priority);
        double p99 = sql_num(c, sql);
        printf("kueue_bench: %s: average time to admission, %-6s %6.2f s (p99 %.2f s)\n", what, sizes[k].name, avg, p99);
    }
    printf("kueue_bench: %s: %.0f preemptions (%ld stop orders the agents acted on)\n", what, preempted,
           atomic_load(&preempt_stops));
    /* where a completed attempt's time beyond its runtime goes, from its events: SCHEDULED (the
     * pass's commit) -> STARTING (delivered in a heartbeat) -> RUNNING (its ranks' start reported)
     * -> COMPLETED (the last exit recorded), less the runtime */
    PGresult *r = PQexec(c, "SELECT avg(extract(epoch FROM st - s)), avg(extract(epoch FROM ru - st)),"
                            " avg(extract(epoch FROM co - ru) - CASE j.world_size WHEN 1 THEN 0.2 WHEN 5 THEN 0.5"
                            "  ELSE 1.0 END), avg(extract(epoch FROM co - s) - CASE j.world_size WHEN 1 THEN 0.2"
                            "  WHEN 5 THEN 0.5 ELSE 1.0 END), percentile_cont(0.99) WITHIN GROUP (ORDER BY"
                            "  extract(epoch FROM co - s) - CASE j.world_size WHEN 1 THEN 0.2 WHEN 5 THEN 0.5 ELSE"
                            "  1.0 END) FROM (SELECT job_id, attempt,"
                            "  min(time) FILTER (WHERE to_state = 'SCHEDULED') s,"
                            "  min(time) FILTER (WHERE to_state = 'STARTING') st,"
                            "  min(time) FILTER (WHERE to_state = 'RUNNING') ru,"
                            "  min(time) FILTER (WHERE to_state = 'COMPLETED') co FROM job_events GROUP BY 1, 2) x"
                            " JOIN jobs j ON j.id = x.job_id"
                            " WHERE co IS NOT NULL AND st IS NOT NULL AND ru IS NOT NULL");
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
        printf("kueue_bench: %s: a completed attempt, on average: scheduled -> delivered %.3f s, -> started %.3f s,"
               " -> end recorded %.3f s beyond its runtime; %.3f s in all beyond its runtime (p99 %.3f s)\n", what,
               atof(PQgetvalue(r, 0, 0)), atof(PQgetvalue(r, 0, 1)), atof(PQgetvalue(r, 0, 2)),
               atof(PQgetvalue(r, 0, 3)), atof(PQgetvalue(r, 0, 4)));
    else
        fprintf(stderr, "kueue_bench: step times: %s", PQerrorMessage(c));
    PQclear(r);
    PQfinish(c);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Where the time of the passes in range that took at least min_us went, on average: work (the
 * scheduler thread's CPU time, its database backends' CPU time), waiting for a CPU (both run-queue
 * delays), the rest (blocked: I/O, fsync, locks, the socket); the wall time by phase and by step
 * of the read; and how many of them had each phase, and each read step, as their largest part. */
static void report_tail(const char *what, const svc_sched_pass_t *p, int n, const long *pending, int64_t lo,
                        int64_t hi, int64_t min_us, const char *label)
{
    static const char *step_names[SVC_SCHED_STEPS] = {"read", "view", "facts", "build"};
    double wall = 0, cpu = 0, cwait = 0, dcpu = 0, dwait = 0, ph[4] = {0}, st[SVC_SCHED_STEPS] = {0}, facts = 0;
    int k = 0, top_ph[4] = {0}, top_st[SVC_SCHED_STEPS] = {0};
    for (int i = 0; i < n; i++) {
        if ((pending && (pending[i] < lo || pending[i] > hi)) || p[i].took_us < min_us)
            continue;
        k++;
        wall += (double)p[i].took_us;
        facts += p[i].facts_read;
        int64_t v[4] = {p[i].read_us, p[i].decide_us, p[i].commit_us,
                        p[i].took_us - p[i].read_us - p[i].decide_us - p[i].commit_us};
        int b = 0;
        for (int f = 0; f < 4; f++) {
            ph[f] += (double)v[f];
            b = v[f] > v[b] ? f : b;
        }
        top_ph[b]++;
        b = 0;
        for (int s = 0; s < SVC_SCHED_STEPS; s++) {
            st[s] += (double)p[i].step_us[s];
            b = p[i].step_us[s] > p[i].step_us[b] ? s : b;
        }
        top_st[b]++;
        for (int f = 0; f < 3; f++) {
            cpu += (double)p[i].cpu_us[f];
            cwait += (double)p[i].cpu_wait_us[f];
            dcpu += (double)p[i].db_cpu_us[f];
            dwait += (double)p[i].db_wait_us[f];
        }
    }
    if (k == 0)
        return;
    double rest = wall - cpu - cwait - dcpu - dwait;
    printf("kueue_bench: %s: %s (%d, %.1f ms on average): work %.1f ms (%.0f%%: scheduler thread's CPU %.1f, its "
           "database backends' CPU %.1f), waiting for a CPU %.1f ms (%.0f%%: thread %.1f, backends %.1f), the rest "
           "%.1f ms (%.0f%%); by phase: read %.1f, decide %.1f, commit %.1f, unlock %.1f ms; read by step:",
           what, label, k, wall / k / 1e3, (cpu + dcpu) / k / 1e3, 100 * (cpu + dcpu) / wall, cpu / k / 1e3,
           dcpu / k / 1e3, (cwait + dwait) / k / 1e3, 100 * (cwait + dwait) / wall, cwait / k / 1e3, dwait / k / 1e3,
           rest / k / 1e3, 100 * rest / wall, ph[0] / k / 1e3, ph[1] / k / 1e3, ph[2] / k / 1e3, ph[3] / k / 1e3);
    for (int s = 0; s < SVC_SCHED_STEPS; s++)
        printf(" %s %.1f", step_names[s], st[s] / k / 1e3);
    printf(" ms (%.0f jobs' paths or predictions read); largest phase (passes): read %d, decide %d, commit %d, "
           "unlock %d; largest read step:", facts / k, top_ph[0], top_ph[1], top_ph[2], top_ph[3]);
    for (int s = 0; s < SVC_SCHED_STEPS; s++)
        printf(" %s %d", step_names[s], top_st[s]);
    printf("\n");
}

static void report_passes(const char *what, const svc_sched_pass_t *p, int n, const long *pending, int64_t lo,
                          int64_t hi)
{
    int64_t *t = malloc(sizeof(int64_t) * (size_t)(n + 1));
    int k = 0, whole = 0;
    double jobs = 0;
    for (int i = 0; i < n; i++)
        if (!pending || (pending[i] >= lo && pending[i] <= hi)) {
            t[k++] = p[i].took_us;
            jobs += p[i].jobs;
            whole += p[i].full_read;
        }
    qsort(t, (size_t)k, sizeof(int64_t), cmp_i64);
    /* where the time of the slowest 1% and of the median pass went (each phase's own p50 / p99) */
    static const char *phase_names[4] = {"read", "decide", "commit", "reasons"};
    char phases[256] = "";
    size_t pl = 0;
    int64_t *ph = malloc(sizeof(int64_t) * (size_t)(n + 1));
    for (int f = 0; f < 4 && k > 0; f++) {
        int m = 0;
        for (int i = 0; i < n; i++)
            if (!pending || (pending[i] >= lo && pending[i] <= hi))
                ph[m++] = f == 0 ? p[i].read_us : f == 1 ? p[i].decide_us : f == 2 ? p[i].commit_us : p[i].reasons_us;
        qsort(ph, (size_t)m, sizeof(int64_t), cmp_i64);
        pl += (size_t)snprintf(phases + pl, sizeof phases - pl, "%s%s %.1f/%.1f", f ? ", " : "", phase_names[f],
                               ph[m / 2] / 1e3, ph[m * 99 / 100] / 1e3);
    }
    free(ph);
    char range[64] = "";
    if (pending)
        snprintf(range, sizeof range, " with %lld-%lld jobs pending", (long long)lo, (long long)hi);
    if (k > 0)
        printf("kueue_bench: %s: %d passes%s: p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max "
               "%.1f ms (%.0f jobs read per pass, %d of the passes read the queue whole; phases p50/p99 ms: %s)\n",
               what, k, range, t[k / 2] / 1e3, t[k * 9 / 10] / 1e3, t[k * 99 / 100] / 1e3,
               t[k - 1] / 1e3, jobs / k, whole, phases);
    else
        printf("kueue_bench: %s: no pass%s\n", what, range);
    if (k > 0) {
        /* the scheduler thread's own CPU time per pass, beside the wall time */
        int64_t *c = malloc(sizeof(int64_t) * (size_t)(k + 1));
        int m = 0;
        for (int i = 0; i < n; i++)
            if (!pending || (pending[i] >= lo && pending[i] <= hi))
                c[m++] = p[i].cpu_us[0] + p[i].cpu_us[1] + p[i].cpu_us[2];
        qsort(c, (size_t)m, sizeof(int64_t), cmp_i64);
        printf("kueue_bench: %s: the scheduler thread's CPU time per pass%s: p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, "
               "max %.1f ms\n", what, range, c[m / 2] / 1e3, c[m * 9 / 10] / 1e3, c[m * 99 / 100] / 1e3,
               c[m - 1] / 1e3);
        free(c);
        report_tail(what, p, n, pending, lo, hi, 0, "all passes");
        report_tail(what, p, n, pending, lo, hi, t[k * 95 / 100], "passes at or above p95");
        report_tail(what, p, n, pending, lo, hi, t[k * 99 / 100], "passes at or above p99");
    }
    free(t);
}

static int cmp_i64(const void *a, const void *b);

/* The first recorded pass that begins at or after t (passes are recorded in order), or -1. */
static int pass_after(const svc_sched_pass_t *p, int n, int64_t t)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (p[mid].at_us < t)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n ? lo : -1;
}

/* --trace: where an attempt's time went, step by step, as the agents saw it, and the gaps between
 * the agents' calls and the scheduler's passes. */
static void report_steps(const char *what, const svc_sched_pass_t *p, int n)
{
    if (!trace)
        return;
    int ne = KILN_MIN(atomic_load(&n_exit_marks), MAX_MARKS);
    for (int i = 0; i < ne; i++) {
        int k = pass_after(p, n, exit_marks[i]);
        if (k >= 0)
            step_add(ST_EXIT_TO_PASS, p[k].at_us - exit_marks[i]);
    }
    int nn = KILN_MIN(atomic_load(&n_nudge_marks), MAX_MARKS);
    qsort(nudge_marks, (size_t)nn, sizeof(int64_t), cmp_i64);
    /* the commits of the passes that admitted jobs (a pass's phases follow each other from at_us;
     * the pass itself ends later, when it releases its lock) */
    int64_t *commits = malloc(sizeof(int64_t) * (size_t)(n + 1));
    int nc = 0;
    for (int k = 0; commits && k < n; k++)
        if (p[k].admitted > 0)
            commits[nc++] = p[k].at_us + p[k].read_us + p[k].decide_us + p[k].commit_us;
    for (int i = 0, k = 0; i < nn && nc > 0; i++) {
        /* the last of them before the nudge */
        while (k + 1 < nc && commits[k + 1] <= nudge_marks[i])
            k++;
        if (commits[k] <= nudge_marks[i])
            step_add(ST_COMMIT_TO_NUDGE, nudge_marks[i] - commits[k]);
    }
    free(commits);
    printf("kueue_bench: %s: steps as the agents saw them (average ms, max ms, count):\n", what);
    for (int k = 0; k < ST_N_; k++) {
        long long c = atomic_load(&steps[k].n);
        printf("  %-40s %9.2f %9.1f %8lld\n", step_names[k], c ? (double)atomic_load(&steps[k].sum_us) / c / 1e3 : 0.0,
               (double)atomic_load(&steps[k].max_us) / 1e3, c);
    }
}

static int run_kueue(void)
{
    if (phase_begin("k") || register_workers())
        return -1;
    long total = 0;
    for (int k = 0; k < 3; k++)
        total += (long)count_of(k) * NQUEUES;
    svc_sched_pass_t *rec = calloc(200000, sizeof(*rec));
    svc_sched_record(svc, rec, 200000);
    printf("kueue_bench: kueue: %ld jobs (%d small, %d medium, %d large per queue) into %d queues of %d cohorts, "
           "%lld workers x %lld slots, heartbeats every %lld ms\n",
           total, count_of(0), count_of(1), count_of(2), NQUEUES, NCOHORTS, (long long)nworkers,
           (long long)worker_slots, (long long)heartbeat_ms);
    fflush(stdout);
    t0_us = kiln_mono_us();
    agents_start();
    submitter_t subs[6];
    pthread_t sth[6];
    for (int i = 0; i < 6; i++) {
        subs[i] = (submitter_t){.size = i / 2, .part = i % 2, .parts = 2};
        pthread_create(&sth[i], NULL, submit_main, &subs[i]);
    }
    double lag = 0;
    for (int i = 0; i < 6; i++) {
        pthread_join(sth[i], NULL);
        lag = KILN_MAX(lag, subs[i].max_lag_s);
    }
    printf("kueue_bench: kueue: submitted in %.1f s (at most %.2f s behind the schedule), %ld refused\n",
           (double)(kiln_mono_us() - t0_us) / 1e6, lag, atomic_load(&submit_errors));
    int rc = wait_done(total);
    agents_stop();
    int n = svc_sched_recorded(svc);
    svc_sched_record(svc, NULL, 0);
    report_figures("kueue");
    report_passes("kueue", rec, n, NULL, 0, 0);
    report_steps("kueue", rec, n);
    free(rec);
    printf("kueue_bench: kueue: %ld agent call errors\n", atomic_load(&agent_errors));
    phase_end();
    return rc;
}

static int run_backlog(void)
{
    if (phase_begin("b"))
        return -1;
    /* the same mix, queue after queue, before any worker registers: every job waits */
    int64_t t = kiln_mono_us();
    long total = 0;
    for (long i = 0; i < backlog; i++) {
        /* 35 small : 10 medium : 5 large */
        int r = (int)(i % 50), size = r < 35 ? 0 : r < 45 ? 1 : 2;
        if (submit(size, (int)(i % NQUEUES)) == 0)
            total++;
    }
    printf("kueue_bench: backlog: %ld jobs submitted in %.1f s with no worker\n", total,
           (double)(kiln_mono_us() - t) / 1e6);
    if (analyze_backlog) { /* the statistics a long-lived jobs table has, before the workers join */
        PGconn *c = PQconnectdb(bench_url);
        PGresult *r = PQexec(c, "ANALYZE jobs");
        if (PQresultStatus(r) != PGRES_COMMAND_OK)
            fprintf(stderr, "kueue_bench: ANALYZE jobs: %s", PQerrorMessage(c));
        PQclear(r);
        PQfinish(c);
    }
    svc_sched_pass_t *rec = calloc(200000, sizeof(*rec));
    svc_sched_record(svc, rec, 200000);
    t0_us = kiln_mono_us();
    if (register_workers())
        return -1;
    agents_start();
    int rc = wait_done(total);
    agents_stop();
    int n = svc_sched_recorded(svc);
    svc_sched_record(svc, NULL, 0);
    /* the jobs pending when a pass began: all but those the passes before it admitted (a
     * preempted job back in its queue is not counted again: there are few) */
    long *pend = calloc((size_t)n + 1, sizeof(long)), admitted = 0;
    for (int i = 0; i < n; i++) {
        pend[i] = total - admitted;
        admitted += rec[i].admitted;
    }
    printf("kueue_bench: backlog: drained in %.1f s\n", (double)(kiln_mono_us() - t0_us) / 1e6);
    report_passes("backlog", rec, n, pend, backlog * 9 / 10, backlog);
    report_passes("backlog", rec, n, pend, 1, backlog);
    free(pend);
    free(rec);
    phase_end();
    return rc;
}

int main(int argc, char **argv)
{
    admin_url = getenv("KILN_DATABASE_URL");
    if (!admin_url)
        admin_url = getenv("KILN_PG_URL");
    config_flag_t flags[] = {
        {"database-url", NULL, CONFIG_STR, &admin_url, CONFIG_ANY, "libpq connection string of a cluster to create the bench databases in"},
        {"scale", NULL, CONFIG_DOUBLE, &scale, CONFIG_ANY, "fraction of each queue's job counts (1: Kueue's 350/100/50)"},
        {"heartbeat-ms", NULL, CONFIG_INT, &heartbeat_ms, CONFIG_ANY, "each simulated agent's heartbeat interval"},
        {"backlog", NULL, CONFIG_INT, &backlog, CONFIG_ANY, "jobs pending when the workers join, for the pass times"},
        {"phase", NULL, CONFIG_STR, &phase, CONFIG_ANY, "all | kueue | backlog"},
        {"timeout", NULL, CONFIG_INT, &timeout_s, CONFIG_ANY, "seconds a phase may take"},
        {"single-reports", NULL, CONFIG_BOOL, &single_reports, CONFIG_ANY, "agents send one report a call "
         "(svc_agent_rank_status, svc_agent_rank_exit), as kiln-agent does with a kilnd older than ReportBatch"},
        {"no-push", NULL, CONFIG_BOOL, &no_push, CONFIG_ANY, "agents heartbeat at their interval only (no nudge "
         "when kilnd commits work for them, as with a kilnd without WatchWork)"},
        {"trace", NULL, CONFIG_BOOL, &trace, CONFIG_ANY, "print where an attempt's time goes, step by step, as "
         "the agents see it (each call's time, the agents' own lag, the gaps to the scheduler's passes)"},
        {"agents-niced", NULL, CONFIG_BOOL, &agents_niced, CONFIG_ANY, "run the simulated agents' threads at the "
         "lowest CPU priority (nice 19), as if on other machines (the database backends serving them are not)"},
        {"analyze", NULL, CONFIG_BOOL, &analyze_backlog, CONFIG_ANY, "ANALYZE the jobs table once the backlog is "
         "submitted, as autovacuum does for a long-lived table (a fresh database has no statistics until autovacuum "
         "comes by, up to a minute or more: until then the planner scans all of jobs for the run-time history)"},
        {"pg-stats", NULL, CONFIG_BOOL, &pg_stats, CONFIG_ANY, "print the statements that took the database's time "
         "(needs shared_preload_libraries=pg_stat_statements)"},
    };
    kiln_err_t err;
    setvbuf(stdout, NULL, _IOLBF, 0);
    log_init("kueue_bench");
    log_set_level(LOG_WARN);
    int rc = config_parse(argc, argv, flags, KILN_ARRAY_LEN(flags), "kueue_bench [flags]", NULL, &err);
    if (rc == 1)
        return 0;
    if (rc || !admin_url || scale <= 0 || scale > 10 || heartbeat_ms < 10 || backlog < 1) {
        fprintf(stderr, "kueue_bench: %s\n", rc ? err.message : "need --database-url (or KILN_PG_URL), sane sizes");
        return 2;
    }
    if (trace) {
        exit_marks = calloc(MAX_MARKS, sizeof(int64_t));
        nudge_marks = calloc(MAX_MARKS, sizeof(int64_t));
    }
    rc = 0;
    if (strcmp(phase, "backlog") != 0)
        rc |= run_kueue();
    if (strcmp(phase, "kueue") != 0)
        rc |= run_backlog();
    return rc ? 1 : 0;
}
