/* follow.c - live log followers: each has a bounded in-memory queue, sized to what it holds, that
 * the notify thread fills without ever blocking. Whichever kilnd stored a job's lines, a notification tells every kilnd
 * (notify.c), and each reads the new lines from the database once per job, whatever the number
 * of its followers, and hands them out (svc_follow_catch_up). A follower that falls behind (its
 * queue overflowed) drops the queue and is refilled from the database by seq, so it never loses
 * a line; the database is not polled otherwise. When the job ends the follower gets an end
 * notice after its last line. */
#include "service/svc_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FOLLOW_QCAP 4096             /* lines a follower may fall behind before it refills from the database */
#define FOLLOW_QMIN 16               /* a queue this small is kept when it empties; a bigger one is freed */

/* Room for one more line: the queue doubles up to FOLLOW_QCAP (a follower that keeps up holds a
 * few lines, not the most it may hold). false when it is full or memory ran out. f->mu held. */
static bool queue_room(svc_follow_t *f)
{
    if (f->qlen < f->qcap)
        return true;
    if (f->qcap >= FOLLOW_QCAP)
        return false;
    int cap = f->qcap ? KILN_MIN(2 * f->qcap, FOLLOW_QCAP) : FOLLOW_QMIN;
    svc_follow_item_t *nq = malloc((size_t)cap * sizeof(*nq));
    if (!nq)
        return false;
    for (int i = 0; i < f->qlen; i++)
        nq[i] = f->q[(f->qhead + i) % f->qcap];
    free(f->q);
    f->q = nq;
    f->qcap = cap;
    f->qhead = 0;
    return true;
}

static void queue_clear(svc_follow_t *f)
{
    while (f->qlen > 0) {
        json_decref(f->q[f->qhead].line);
        f->qhead = (f->qhead + 1) % f->qcap;
        f->qlen--;
    }
    f->qhead = 0;
}

int svc_follow_open(svc_t *s, const svc_caller_t *who, const char *job_id, int rank,
                    int64_t after_seq, svc_follow_wake_fn wake, void *ud, svc_follow_t **out,
                    kiln_err_t *err)
{
    *out = NULL;
    char full[SVC_JOB_ID_SIZE];
    int rc = svc_job_resolve(s, who, job_id, full, err);
    if (rc)
        return rc;
    job_id = full;
    store_conn_t *c = NULL;
    char state[16], reason[256];
    rc = store_conn_get(s->store, &c, err);
    if (rc)
        return rc;
    /* Fail early for an unknown (or invisible) job, before anything is registered. */
    rc = svc_job_access(c, who, job_id, SVC_ROLE_VIEWER, err);
    if (rc == 0)
        rc = store_job_state(c, job_id, state, sizeof(state), reason, sizeof(reason), err);
    if (rc) {
        store_conn_put(s->store, c);
        return rc;
    }
    svc_follow_t *f = calloc(1, sizeof(*f));
    svc_jobent_t *e = svc_jobent_get(s, job_id);
    if (!f || !e) {
        free(f);
        svc_jobent_put(s, e);
        store_conn_put(s->store, c);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    pthread_mutex_init(&f->mu, NULL);
    f->s = s;
    f->ent = e;
    f->rank = rank < 0 ? -1 : rank;
    f->wake = wake;
    f->ud = ud;

    /* Every line up to the last seq handed out (pub_seq) is committed, so the caller's history
     * read covers it; the notify thread hands later ones to the follower, registered here under
     * the same lock. */
    pthread_mutex_lock(&e->pub_mu);
    if (!e->pub_loaded) {
        /* Without it no live line would reach this job's followers here: refuse the follow (the
         * client retries) rather than open one that stays silent. */
        int64_t last = 0;
        rc = store_job_log_seq(c, job_id, &last, err);
        if (rc) {
            pthread_mutex_unlock(&e->pub_mu);
            pthread_mutex_destroy(&f->mu);
            free(f->q);
            free(f);
            svc_jobent_put(s, e);
            store_conn_put(s->store, c);
            return rc;
        }
        e->pub_seq = last;
        e->pub_loaded = true;
    }
    f->last_seq = KILN_MAX(after_seq, e->pub_seq);
    pthread_mutex_lock(&e->fmu);
    f->next = e->followers;
    e->followers = f;
    pthread_mutex_unlock(&e->fmu);
    pthread_mutex_unlock(&e->pub_mu);

    /* Read the state again now that the follower is registered: an end from here on reaches it
     * through svc_follow_end. */
    if (store_job_state(c, job_id, state, sizeof(state), reason, sizeof(reason), NULL) == 0
        && svc_state_terminal(svc_state_parse(state))) {
        pthread_mutex_lock(&f->mu);
        if (!f->ended) {
            f->ended = true;
            kiln_strlcpy(f->end_state, state, sizeof(f->end_state));
            kiln_strlcpy(f->end_reason, reason, sizeof(f->end_reason));
        }
        f->final_checked = true;  /* the caller's history read is the final read */
        pthread_mutex_unlock(&f->mu);
    }
    store_conn_put(s->store, c);
    *out = f;
    return 0;
}

/* Hands stored lines (JSON objects with seq and rank, in seq order) to the job's followers. */
static void follow_publish(svc_jobent_t *e, json_t *lines)
{
    size_t n = json_array_size(lines);
    pthread_mutex_lock(&e->fmu);
    for (svc_follow_t *f = e->followers; f; f = f->next) {
        bool added = false;
        pthread_mutex_lock(&f->mu);
        for (size_t i = 0; i < n && !f->overflow; i++) {
            json_t *line = json_array_get(lines, i);
            if (f->rank >= 0 && json_integer_value(json_object_get(line, "rank")) != f->rank)
                continue;
            if (!queue_room(f)) {
                /* Behind: stop queueing; the reader refills from the database by seq. */
                f->overflow = true;
                added = true;
                break;
            }
            int tail = (f->qhead + f->qlen) % f->qcap;
            f->q[tail].seq = json_integer_value(json_object_get(line, "seq"));
            f->q[tail].line = json_incref(line);
            f->qlen++;
            added = true;
        }
        pthread_mutex_unlock(&f->mu);
        if (added && f->wake)
            f->wake(f->ud);
    }
    pthread_mutex_unlock(&e->fmu);
}

#define CATCH_UP_PAGE 1000

void svc_follow_catch_up(svc_t *s, svc_jobent_t *e, int64_t seq)
{
    pthread_mutex_lock(&e->fmu);
    bool any = e->followers != NULL;
    pthread_mutex_unlock(&e->fmu);
    if (!any)
        return;
    /* The connection first, then the job's lock (as svc_follow_open holds them), so that a busy
     * pool cannot deadlock the two. */
    store_conn_t *c = NULL;
    kiln_err_t err;
    if (store_conn_get(s->store, &c, &err) != 0) {
        log_warn("follow: could not read new lines of job %s: %s", e->id, err.message);
        return;
    }
    pthread_mutex_lock(&e->pub_mu);
    if (!e->pub_loaded || (seq > 0 && seq <= e->pub_seq)) {
        pthread_mutex_unlock(&e->pub_mu);
        store_conn_put(s->store, c);
        return;
    }
    for (;;) {
        json_t *lines = NULL;
        int64_t last = e->pub_seq;
        store_log_query_t q = {.rank = -1, .after_seq = e->pub_seq, .limit = CATCH_UP_PAGE};
        if (store_logs_query_json(c, e->id, &q, &lines, &last, &err) != 0) {
            /* the next notification (or the followers' end check) reads them */
            log_warn("follow: could not read new lines of job %s: %s", e->id, err.message);
            break;
        }
        size_t n = json_array_size(lines);
        if (n > 0)
            follow_publish(e, lines);
        json_decref(lines);
        e->pub_seq = last;
        if (n < CATCH_UP_PAGE || (seq > 0 && last >= seq))
            break;
    }
    pthread_mutex_unlock(&e->pub_mu);
    store_conn_put(s->store, c);
}

void svc_follow_catch_up_all(svc_t *s)
{
    /* the followed jobs' ids first: catching up takes the database, not the table's lock */
    char (*ids)[STORE_ID_LEN] = NULL;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&s->jobs_mu);
    for (int b = 0; b < SVC_JOBENT_BUCKETS; b++)
        for (svc_jobent_t *e = s->jobs[b]; e; e = e->next) {
            if (e->refs == 0)
                continue; /* followers hold references */
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                void *nv = realloc(ids, cap * sizeof(*ids));
                if (!nv)
                    break;
                ids = nv;
            }
            kiln_strlcpy(ids[n++], e->id, STORE_ID_LEN);
        }
    pthread_mutex_unlock(&s->jobs_mu);
    for (size_t i = 0; i < n; i++) {
        svc_jobent_t *e = svc_jobent_find(s, ids[i]);
        if (!e)
            continue;
        svc_follow_catch_up(s, e, 0);
        char state[16], reason[256];
        store_conn_t *c = NULL;
        kiln_err_t err;
        if (store_conn_get(s->store, &c, &err) == 0) {
            if (store_job_state(c, ids[i], state, sizeof(state), reason, sizeof(reason), &err) == 0 &&
                svc_state_terminal(svc_state_parse(state)))
                svc_follow_end(s, ids[i], state, reason);
            store_conn_put(s->store, c);
        }
        svc_jobent_put(s, e);
    }
    free(ids);
}

void svc_follow_end(svc_t *s, const char *job_id, const char *state, const char *reason)
{
    /* No entry means nobody follows the job: do not create one. */
    svc_jobent_t *e = svc_jobent_find(s, job_id);
    if (!e)
        return;
    pthread_mutex_lock(&e->fmu);
    for (svc_follow_t *f = e->followers; f; f = f->next) {
        pthread_mutex_lock(&f->mu);
        f->ended = true;
        kiln_strlcpy(f->end_state, state, sizeof(f->end_state));
        kiln_strlcpy(f->end_reason, reason ? reason : "", sizeof(f->end_reason));
        pthread_mutex_unlock(&f->mu);
        if (f->wake)
            f->wake(f->ud);
    }
    pthread_mutex_unlock(&e->fmu);
    svc_jobent_put(s, e);
}

int svc_follow_read(svc_follow_t *f, json_t *lines, int max, bool *ended, json_t **end_info)
{
    int count = 0;
    *ended = false;
    if (end_info)
        *end_info = NULL;
    if (!f || max <= 0)
        return 0;
    pthread_mutex_lock(&f->mu);
    if (f->overflow) {
        f->overflow = false;
        queue_clear(f);
        f->need_db = true;
    }
    if (f->ended && !f->final_checked && f->qlen == 0) {
        /* Lines committed just before the end may not have been handed over yet. */
        f->need_db = true;
        f->final_checked = true;
    }
    pthread_mutex_unlock(&f->mu);

    if (f->need_db) {
        store_conn_t *c = NULL;
        kiln_err_t err;
        json_t *arr = NULL;
        int64_t last = f->last_seq;
        store_log_query_t q = {.rank = f->rank, .since_us = 0, .after_seq = f->last_seq, .limit = max};
        int rc = store_conn_get(f->s->store, &c, &err);
        if (rc == 0) {
            rc = store_logs_query_json(c, f->ent->id, &q, &arr, &last, &err);
            store_conn_put(f->s->store, c);
        }
        if (rc) {
            log_warn("follow: could not refill job %s from the database: %s", f->ent->id, err.message);
            return 0;  /* need_db stays set: the next read retries */
        }
        size_t n = json_array_size(arr);
        for (size_t i = 0; i < n; i++)
            json_array_append(lines, json_array_get(arr, i));
        json_decref(arr);
        count += (int)n;
        f->last_seq = last;
        if ((int)n < max)
            f->need_db = false;
        if (count >= max)
            return count;
    }

    pthread_mutex_lock(&f->mu);
    while (f->qlen > 0 && count < max) {
        svc_follow_item_t it = f->q[f->qhead];
        f->qhead = (f->qhead + 1) % f->qcap;
        f->qlen--;
        if (it.seq <= f->last_seq) {  /* already delivered by a refill */
            json_decref(it.line);
            continue;
        }
        json_array_append_new(lines, it.line);
        f->last_seq = it.seq;
        count++;
    }
    if (f->qlen == 0 && f->qcap > FOLLOW_QMIN) {
        /* a burst is over: give back what it needed */
        free(f->q);
        f->q = NULL;
        f->qcap = f->qhead = 0;
    }
    if (count == 0 && f->qlen == 0 && !f->overflow && f->ended && f->final_checked && !f->need_db) {
        *ended = true;
        if (end_info)
            *end_info = json_pack("{s:s, s:s}", "state", f->end_state, "reason", f->end_reason);
    }
    pthread_mutex_unlock(&f->mu);
    return count;
}

void svc_follow_close(svc_follow_t *f)
{
    if (!f)
        return;
    svc_jobent_t *e = f->ent;
    pthread_mutex_lock(&e->fmu);
    for (svc_follow_t **pp = &e->followers; *pp; pp = &(*pp)->next) {
        if (*pp == f) {
            *pp = f->next;
            break;
        }
    }
    pthread_mutex_unlock(&e->fmu);
    pthread_mutex_lock(&f->mu);
    queue_clear(f);
    pthread_mutex_unlock(&f->mu);
    pthread_mutex_destroy(&f->mu);
    free(f->q);
    svc_jobent_put(f->s, e);
    free(f);
}
