/* starter.c - kiln-agent's starter: one long-lived thread that launches assignments in the order
 * they came, so that heartbeats never wait for a launch (a script's code may be fetched first)
 * and ranks are forked by a thread that outlives them; an assignment that starts from another
 * job's model, or that restores a synced checkpoint directory, goes to a transfer thread first;
 * the checkpoint directory of an attempt whose rank 0 starts here is watched and synced
 * (ckpt_sync.c); a stop order drops what still waits. */
#include "agent/agent_int.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- the starter: launches assignments, so heartbeats never wait for one ------------------- */

static bool start_same(const Kiln__Assignment *x, const char *job_id, int attempt)
{
    return !strcmp(x->job_id ? x->job_id : "", job_id ? job_id : "") && (attempt == 0 || x->attempt == attempt);
}

/* Queues a copy of as for the starter, unless the same (job, attempt) already waits. */
void agent_start_enqueue(agent_t *a, const Kiln__Assignment *as, bool fetched)
{
    pthread_mutex_lock(&a->mu);
    for (start_item_t *it = a->starts; it; it = it->next)
        if (start_same(it->a, as->job_id, as->attempt)) {
            pthread_mutex_unlock(&a->mu);
            return;
        }
    pthread_mutex_unlock(&a->mu);
    size_t len = protobuf_c_message_get_packed_size(&as->base);
    uint8_t *buf = malloc(len ? len : 1);
    start_item_t *it = calloc(1, sizeof(*it));
    if (buf && it) {
        protobuf_c_message_pack(&as->base, buf);
        it->a = kiln__assignment__unpack(NULL, len, buf);
        it->fetched = fetched;
    }
    free(buf);
    if (!it || !it->a) {
        free(it);
        log_error("job %s: out of memory for its assignment; kilnd will deliver it again", as->job_id);
        return;
    }
    pthread_mutex_lock(&a->mu);
    start_item_t **pp = &a->starts;
    while (*pp)
        pp = &(*pp)->next;
    *pp = it;
    pthread_cond_broadcast(&a->start_cv);
    pthread_mutex_unlock(&a->mu);
}

void start_item_free(start_item_t *it)
{
    if (it)
        kiln__assignment__free_unpacked(it->a, NULL);
    free(it);
}

/* Drops waiting assignments of job_id (attempt 0: any) that a stop order makes moot. */
void agent_start_cancel(agent_t *a, const char *job_id, int attempt)
{
    pthread_mutex_lock(&a->mu);
    start_item_t **pp = &a->starts;
    while (*pp) {
        start_item_t *it = *pp;
        if (start_same(it->a, job_id, attempt)) {
            *pp = it->next;
            log_info("job %s attempt %d: stopped before it started", it->a->job_id, it->a->attempt);
            start_item_free(it);
            continue;
        }
        pp = &it->next;
    }
    pthread_mutex_unlock(&a->mu);
}

/* Whether the assignment's checkpoint directory is synced from here: it runs rank 0, and its
 * checkpoints go to the work dir (no checkpoint.path, which the agents share). */
static bool start_syncs(const Kiln__Assignment *as)
{
    if (as->checkpoint_dir && as->checkpoint_dir[0])
        return false;
    for (size_t i = 0; i < as->n_ranks; i++)
        if (as->ranks[i] == 0)
            return true;
    return false;
}

size_t agent_start_list(agent_t *a, agent_rank_info_t *out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&a->mu);
    for (const start_item_t *it = a->starting ? a->starting : a->starts; it;
         it = it == a->starting ? a->starts : it->next)
        for (size_t k = 0; k < it->a->n_ranks; k++, n++)
            if (n < max) {
                kiln_strlcpy(out[n].job_id, it->a->job_id ? it->a->job_id : "", sizeof(out[n].job_id));
                out[n].attempt = it->a->attempt;
                out[n].rank = it->a->ranks[k];
                out[n].pid = 0;
            }
    pthread_mutex_unlock(&a->mu);
    return n;
}

void *agent_start_main(void *arg)
{
    agent_t *a = arg;
    for (;;) {
        pthread_mutex_lock(&a->mu);
        while (!a->starts && !a->stop_starter)
            pthread_cond_wait(&a->start_cv, &a->mu);
        if (a->stop_starter) {
            pthread_mutex_unlock(&a->mu);
            break;
        }
        start_item_t *it = a->starts;
        a->starts = it->next;
        a->starting = it;
        bool draining = a->draining;
        pthread_mutex_unlock(&a->mu);
        if (draining) {
            ob_add_status(&a->ob, it->a->job_id, it->a->attempt, false, "the agent is shutting down",
                          OB_FAULT_SHUTDOWN, 0);
        } else if (xfer_needs_fetch(it->a) && !it->fetched) {
            /* its model, its synced checkpoints first, on a transfer thread */
            xfer_fetch_and_start(a->xfer, it->a);
        } else {
            /* Launched from this long-lived thread: a rank gets SIGKILL when the thread that
             * forked it ends (PR_SET_PDEATHSIG), so never from a transfer thread. */
            kiln_err_t err;
            bool sync = start_syncs(it->a);
            if (sync && ckpt_sync_watch(a->ckpt, it->a->job_id, it->a->attempt, &err) != 0) {
                log_warn("job %s attempt %d: its checkpoint directory will not be synced: %s", it->a->job_id,
                         it->a->attempt, err.message);
                sync = false;
            }
            int rc = agent_launcher_start(a->launcher, it->a, &err);
            if (rc == KILN_EEXIST)
                log_info("job %s attempt %d is already running here; assignment ignored", it->a->job_id,
                         it->a->attempt);
            else if (rc && sync)
                ckpt_sync_forget(a->ckpt, it->a->job_id, it->a->attempt);
        }
        pthread_mutex_lock(&a->mu);
        a->starting = NULL; /* launched (the launcher lists it), refused, or with a transfer thread */
        pthread_mutex_unlock(&a->mu);
        start_item_free(it);
    }
    return NULL;
}

