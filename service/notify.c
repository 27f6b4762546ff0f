/* notify.c - how several kilnd on one database keep each other informed, on one thread with
 * one dedicated database session (store_listener_t):
 *  - it LISTENs for news: log lines stored (any kilnd), jobs that ended, work for the scheduler,
 *    work for an agent (handed to svc_on_work's hook: gRPC's WatchWork nudges the agent);
 *    log news makes the live followers of this kilnd read the new lines from the database and
 *    hand them out (svc_follow_catch_up), so a follower sees every line whichever kilnd stored it;
 *  - it sends this kilnd's news, coalesced: after an ingest commits, the job's highest seq (one
 *    notification per job per pass, however many batches), and scheduler wake-ups from kilnd that
 *    do not lead;
 *  - it holds the leader lock (a session advisory lock): the leader runs the scheduler and the
 *    liveness checker. A leader that dies or loses its session loses the lock at once; another
 *    kilnd takes it within a second.
 * After the session is lost and opened again, every followed job is caught up from the database
 * (what was notified meanwhile went nowhere). The durable facts are rows; notifications only say
 * where to look. */
#include "service/svc_int.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define NOTIFY_LOCK_TRY_MS 1000     /* a kilnd that does not lead tries the leader lock this often */
#define NOTIFY_POLL_MS 250
/* A kilnd that does not lead tells the leader's scheduler of new work at most this often: each
 * notification is a transaction, and one per job submitted here cost PostgreSQL about 0.06 ms a
 * job at 1,000 jobs/s (bench/RESULTS.md, "Two kilnd replicas"). The leader's pass places every
 * job queued by then, so a job waits this much longer at most. */
#define NOTIFY_SCHED_GAP_US 20000

bool svc_is_leader(svc_t *s)
{
    return atomic_load(&s->leader);
}

uint64_t svc_leader_epoch(svc_t *s)
{
    return atomic_load(&s->leader_epoch);
}

static void notify_kick(svc_t *s)
{
    uint64_t one = 1;
    if (s->notify_efd >= 0 && write(s->notify_efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        log_debug("notify: could not wake the listener: %s", strerror(errno));
}

void svc_notify_logs(svc_t *s, const char *job_id, int64_t last_seq)
{
    pthread_mutex_lock(&s->note_mu);
    int i = 0;
    while (i < s->nnotes && strcmp(s->notes[i].job_id, job_id) != 0)
        i++;
    if (i == s->nnotes) {
        if (s->nnotes == s->capnotes) {
            int cap = s->capnotes ? 2 * s->capnotes : 64;
            svc_note_t *nn = realloc(s->notes, (size_t)cap * sizeof(*nn));
            if (!nn) {
                /* the next batch of the job, or its end, tells the followers instead */
                pthread_mutex_unlock(&s->note_mu);
                log_warn("notify: out of memory; followers of job %s hear of its new lines later", job_id);
                return;
            }
            s->notes = nn;
            s->capnotes = cap;
        }
        kiln_strlcpy(s->notes[i].job_id, job_id, sizeof(s->notes[i].job_id));
        s->notes[i].seq = last_seq;
        s->nnotes++;
    } else if (last_seq > s->notes[i].seq) {
        s->notes[i].seq = last_seq;
    }
    pthread_mutex_unlock(&s->note_mu);
    notify_kick(s);
}

void svc_sched_wake(svc_t *s)
{
    pthread_mutex_lock(&s->mu);
    s->sched_wake = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (!svc_is_leader(s)) {
        /* the leader's scheduler runs the queue: tell it */
        pthread_mutex_lock(&s->note_mu);
        s->note_sched = true;
        pthread_mutex_unlock(&s->note_mu);
        notify_kick(s);
    }
}

/* Sends what is pending in one statement; a scheduler wake-up only when *sched_next_us (the
 * monotonic time) has come, then moves it NOTIFY_SCHED_GAP_US on. On failure the notes are kept
 * for the next session. */
static int notify_send(svc_t *s, store_listener_t *l, int64_t *sched_next_us, kiln_err_t *err)
{
    int64_t now = kiln_mono_us();
    pthread_mutex_lock(&s->note_mu);
    int n = s->nnotes;
    bool sched = s->note_sched && now >= *sched_next_us;
    svc_note_t *notes = s->notes;
    s->notes = NULL;
    s->nnotes = s->capnotes = 0;
    if (sched) {
        s->note_sched = false;
        *sched_next_us = now + NOTIFY_SCHED_GAP_US;
    }
    pthread_mutex_unlock(&s->note_mu);
    if (n == 0 && !sched) {
        free(notes);
        return 0;
    }
    const char **ch = calloc((size_t)n + 1, sizeof(char *));
    const char **pl = calloc((size_t)n + 1, sizeof(char *));
    char (*payload)[STORE_ID_LEN + 24] = calloc((size_t)n + 1, sizeof(*payload));
    int rc = 0;
    if (!ch || !pl || !payload) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    } else {
        size_t k = 0;
        for (int i = 0; i < n; i++) {
            snprintf(payload[i], sizeof(payload[i]), "%s %lld", notes[i].job_id, (long long)notes[i].seq);
            ch[k] = SVC_CH_LOGS;
            pl[k++] = payload[i];
        }
        if (sched) {
            ch[k] = SVC_CH_SCHED;
            pl[k++] = "";
        }
        rc = store_listener_notify(l, ch, pl, k, err);
    }
    if (rc) {
        /* put them back: sent on the next session, merged with newer ones */
        for (int i = 0; i < n; i++)
            svc_notify_logs(s, notes[i].job_id, notes[i].seq);
        if (sched) {
            pthread_mutex_lock(&s->note_mu);
            s->note_sched = true;
            pthread_mutex_unlock(&s->note_mu);
        }
    }
    free(ch);
    free(pl);
    free(payload);
    free(notes);
    return rc;
}

/* ---- what arrives -------------------------------------------------------------------------- */

typedef struct arrivals {
    svc_t *s;
    svc_note_t *logs;            /* followed jobs with new lines: highest seq notified */
    int n, cap;
    bool sched;
} arrivals_t;

static void on_notify(void *ud, const char *channel, const char *payload)
{
    arrivals_t *a = ud;
    if (!strcmp(channel, SVC_CH_SCHED)) {
        a->sched = true;
        return;
    }
    if (!strcmp(channel, SVC_CH_WORK)) {
        if (payload[0] && strlen(payload) < STORE_WORKER_ID_LEN) {
            pthread_mutex_lock(&a->s->note_mu);
            if (a->s->work_fn)
                a->s->work_fn(a->s->work_ud, payload);
            pthread_mutex_unlock(&a->s->note_mu);
        }
        return;
    }
    char job_id[STORE_ID_LEN];
    kiln_strlcpy(job_id, payload, sizeof(job_id));
    if (!store_is_uuid(job_id))
        return;
    if (!strcmp(channel, SVC_CH_JOB_END)) {
        svc_jobent_t *e = svc_jobent_find(a->s, job_id);
        if (!e)
            return; /* nobody here follows it */
        char state[16], reason[256];
        store_conn_t *c = NULL;
        kiln_err_t err;
        if (store_conn_get(a->s->store, &c, &err) == 0) {
            if (store_job_state(c, job_id, state, sizeof(state), reason, sizeof(reason), &err) == 0 &&
                svc_state_terminal(svc_state_parse(state)))
                svc_follow_end(a->s, job_id, state, reason);
            store_conn_put(a->s->store, c);
        }
        svc_jobent_put(a->s, e);
        return;
    }
    if (strcmp(channel, SVC_CH_LOGS) != 0)
        return;
    const char *sp = strchr(payload, ' ');
    int64_t seq = 0;
    if (!sp || kiln_parse_int64(sp + 1, &seq) != 0)
        return;
    for (int i = 0; i < a->n; i++)
        if (!strcmp(a->logs[i].job_id, job_id)) {
            if (seq > a->logs[i].seq)
                a->logs[i].seq = seq;
            return;
        }
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 32;
        svc_note_t *nl = realloc(a->logs, (size_t)cap * sizeof(*nl));
        if (!nl)
            return;
        a->logs = nl;
        a->cap = cap;
    }
    kiln_strlcpy(a->logs[a->n].job_id, job_id, sizeof(a->logs[a->n].job_id));
    a->logs[a->n].seq = seq;
    a->n++;
}

/* ---- leadership --------------------------------------------------------------------------- */

static bool notify_stopping(svc_t *s)
{
    pthread_mutex_lock(&s->mu);
    bool stop = s->stopping;
    pthread_mutex_unlock(&s->mu);
    return stop;
}

static void leader_set(svc_t *s, bool lead, const char *why)
{
    bool was = atomic_exchange(&s->leader, lead);
    if (was == lead)
        return;
    if (lead) {
        atomic_fetch_add(&s->leader_epoch, 1);
        log_info("leader: this kilnd now runs the scheduler and the liveness checker (%s)", why);
        pthread_mutex_lock(&s->mu);
        s->sched_wake = true;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    } else if (notify_stopping(s)) {
        log_info("leader: this kilnd no longer leads (%s)", why);
    } else {
        log_warn("leader: this kilnd no longer leads (%s)", why);
    }
}

/* ---- the thread ----------------------------------------------------------------------------- */

void *svc_notify_main(void *arg)
{
    svc_t *s = arg;
    static const char *const channels[] = {SVC_CH_LOGS, SVC_CH_JOB_END, SVC_CH_SCHED, SVC_CH_WORK};
    store_listener_t *l = NULL;
    int backoff_ms = 100, fails = 0;
    int64_t next_try_us = 0, sched_next_us = 0;
    arrivals_t a = {.s = s};
    while (!notify_stopping(s)) {
        kiln_err_t err;
        kiln_err_clear(&err);
        if (!l) {
            if (store_listener_open(s->database_url, channels, KILN_ARRAY_LEN(channels), &l, &err) != 0) {
                if (fails++ % 20 == 0)
                    log_warn("notify: %s (retrying)", err.message);
                struct pollfd pf = {.fd = s->notify_efd, .events = POLLIN};
                poll(&pf, 1, backoff_ms);
                backoff_ms = KILN_MIN(backoff_ms * 2, 1000);
                continue;
            }
            if (fails > 0)
                log_info("notify: listening to the database again");
            fails = 0;
            backoff_ms = 100;
            next_try_us = 0;
            /* whatever was notified while no session listened went nowhere */
            svc_follow_catch_up_all(s);
        }
        if (!svc_is_leader(s) && kiln_mono_us() >= next_try_us) {
            bool got = false;
            if (store_listener_try_lock(l, SVC_LEADER_KEY, &got, &err) != 0)
                goto lost;
            if (got)
                leader_set(s, true, "took the leader lock");
            next_try_us = kiln_mono_us() + NOTIFY_LOCK_TRY_MS * 1000;
        }
        if (notify_send(s, l, &sched_next_us, &err) != 0)
            goto lost;

        struct pollfd pf[2] = {{.fd = store_listener_fd(l), .events = POLLIN},
                               {.fd = s->notify_efd, .events = POLLIN}};
        int wait_ms = NOTIFY_POLL_MS;
        if (!svc_is_leader(s))
            wait_ms = (int)KILN_MAX(0, KILN_MIN(wait_ms, (next_try_us - kiln_mono_us()) / 1000));
        pthread_mutex_lock(&s->note_mu);
        bool sched_waits = s->note_sched;
        pthread_mutex_unlock(&s->note_mu);
        if (sched_waits) /* a wake-up held back by NOTIFY_SCHED_GAP_US: go when it may */
            wait_ms = (int)KILN_MAX(0, KILN_MIN(wait_ms, (sched_next_us - kiln_mono_us() + 999) / 1000));
        if (poll(pf, 2, wait_ms) < 0 && errno != EINTR)
            continue;
        if (pf[1].revents & POLLIN) {
            uint64_t v;
            if (read(s->notify_efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                log_debug("notify: %s", strerror(errno));
        }
        /* Drained whatever woke us: a query of this loop (a send, the lock) may have read
         * notifications into libpq's queue without the socket being readable now. */
        a.n = 0;
        a.sched = false;
        if (store_listener_drain(l, on_notify, &a, &err) != 0)
            goto lost;
        if (a.sched && svc_is_leader(s)) {
            pthread_mutex_lock(&s->mu);
            s->sched_wake = true;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
        }
        for (int i = 0; i < a.n; i++) {
            svc_jobent_t *e = svc_jobent_find(s, a.logs[i].job_id);
            if (e) {
                svc_follow_catch_up(s, e, a.logs[i].seq);
                svc_jobent_put(s, e);
            }
        }
        continue;
    lost:
        log_warn("notify: %s; connecting again", err.message);
        leader_set(s, false, "its database session ended");
        store_listener_close(l);
        l = NULL;
    }
    free(a.logs);
    leader_set(s, false, "shutting down");
    store_listener_close(l); /* releases the leader lock at once */
    return NULL;
}

int svc_notify_init(svc_t *s, kiln_err_t *err)
{
    s->notify_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->notify_efd < 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not create an eventfd: %s", strerror(errno));
    return 0;
}

void svc_notify_free(svc_t *s)
{
    if (s->notify_efd >= 0)
        close(s->notify_efd);
    s->notify_efd = -1;
    free(s->notes);
    s->notes = NULL;
    s->nnotes = s->capnotes = 0;
}

void svc_on_work(svc_t *s, svc_work_fn fn, void *ud)
{
    pthread_mutex_lock(&s->note_mu);
    s->work_fn = fn;
    s->work_ud = ud;
    pthread_mutex_unlock(&s->note_mu);
}

void svc_notify_wake(svc_t *s)
{
    notify_kick(s);
}
