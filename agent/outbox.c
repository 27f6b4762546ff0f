/* outbox.c - the agent's outbox: log lines and metric points grouped into batches per job,
 * rank statuses and exits, all in one FIFO that the sender drains in order. What cannot be sent
 * yet stays queued, up to a memory cap: while kilnd is unreachable for long, the oldest log and
 * metric batches are dropped (never the one being sent, never a status or an exit), and the job
 * gets a log line saying how much it lost. No gRPC here (agent.c sends). */
#include "agent/agent_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ob_init(ob_t *o)
{
    memset(o, 0, sizeof(*o));
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    const char *mb = getenv("KILN_AGENT_OUTBOX_MB");
    long v = mb ? strtol(mb, NULL, 10) : 0;
    o->cap_bytes = (size_t)(v > 0 ? v : OB_CAP_MB_DEFAULT) << 20;
}

static size_t ob_item_bytes(const ob_item_t *it)
{
    if (it->kind == OB_LOGS)
        return it->bytes;
    if (it->kind == OB_METRICS)
        return it->points.n * OB_POINT_BYTES;
    return 0;
}

ob_item_t *ob_pop_locked(ob_t *o)
{
    ob_item_t *it = o->head;
    if (!it)
        return NULL;
    o->head = it->next;
    if (!o->head)
        o->tail = NULL;
    o->queued_bytes -= ob_item_bytes(it);
    return it;
}

void ob_item_free(ob_item_t *it)
{
    if (!it)
        return;
    for (size_t i = 0; i < it->nlines; i++)
        free(it->lines[i].line);
    free(it->lines);
    agent_points_free(&it->points);
    free(it);
}

void ob_deinit(ob_t *o)
{
    while (o->head) {
        ob_item_t *it = o->head;
        o->head = it->next;
        ob_item_free(it);
    }
    while (o->open) {
        ob_item_t *it = o->open;
        o->open = it->next;
        ob_item_free(it);
    }
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv);
}

static ob_item_t *ob_open_locked(ob_t *o, ob_kind_t kind, const char *job_id, int attempt);
static void ob_add_line_locked(ob_t *o, const char *job_id, int attempt, int rank, int stream,
                               int64_t time_us, char *line, size_t len);

/* Over the cap: drops the oldest log and metric batches after the head (the sender may be
 * sending the head without the lock) until the queue fits, and tells each job what it lost. */
static void ob_shed_locked(ob_t *o)
{
    while (o->queued_bytes > o->cap_bytes) {
        ob_item_t *prev = o->head, *it = prev ? prev->next : NULL;
        while (it && it->kind != OB_LOGS && it->kind != OB_METRICS) {
            prev = it;
            it = it->next;
        }
        if (!it)
            return;
        prev->next = it->next;
        if (o->tail == it)
            o->tail = prev;
        o->queued_bytes -= ob_item_bytes(it);
        size_t lines = it->kind == OB_LOGS ? it->nlines : 0, points = it->kind == OB_METRICS ? it->points.n : 0;
        o->dropped_lines += lines;
        o->dropped_points += points;
        prom_add(&agent_prom_dropped_lines, "", (double)lines);
        prom_add(&agent_prom_dropped_points, "", (double)points);
        log_warn("agent: outbox over %zu MiB (is kilnd unreachable?): dropped %zu log line(s) and %zu "
                 "metric point(s) of job %s", o->cap_bytes >> 20, lines, points, it->job_id);
        char note[256];
        int n = snprintf(note, sizeof(note), "[kiln-agent] %zu log line(s) and %zu metric point(s) of this "
                         "job were dropped: kilnd was unreachable and the agent's outbox was full", lines, points);
        char *copy = strdup(note);
        if (copy)
            ob_add_line_locked(o, it->job_id, it->attempt, 0, AGENT_STREAM_STDERR, kiln_now_us(), copy,
                               (size_t)n);
        ob_item_free(it);
    }
}

static void ob_push_locked(ob_t *o, ob_item_t *it)
{
    it->next = NULL;
    if (o->tail)
        o->tail->next = it;
    else
        o->head = it;
    o->tail = it;
    o->sealed++;
    o->queued_bytes += ob_item_bytes(it);
    ob_shed_locked(o);
    pthread_cond_broadcast(&o->cv);
}

static void ob_seal_locked(ob_t *o, ob_item_t *it)
{
    for (ob_item_t **pp = &o->open; *pp; pp = &(*pp)->next)
        if (*pp == it) {
            *pp = it->next;
            break;
        }
    ob_push_locked(o, it);
}

void ob_seal_due_locked(ob_t *o, bool force)
{
    int64_t now = kiln_mono_us();
    ob_item_t *it = o->open;
    while (it) {
        ob_item_t *next = it->next;
        if (force || now - it->opened_us >= OB_FLUSH_US)
            ob_seal_locked(o, it);
        it = next;
    }
}

static ob_item_t *ob_new(ob_kind_t kind, const char *job_id, int attempt)
{
    ob_item_t *it = calloc(1, sizeof(*it));
    if (!it) {
        log_error("agent: out of memory; a report for job %s is lost", job_id);
        return NULL;
    }
    it->kind = kind;
    kiln_strlcpy(it->job_id, job_id, sizeof(it->job_id));
    it->attempt = attempt;
    it->opened_us = kiln_mono_us();
    return it;
}

static ob_item_t *ob_open_locked(ob_t *o, ob_kind_t kind, const char *job_id, int attempt)
{
    for (ob_item_t *it = o->open; it; it = it->next)
        if (it->kind == kind && it->attempt == attempt && !strcmp(it->job_id, job_id))
            return it;
    ob_item_t *it = ob_new(kind, job_id, attempt);
    if (it) {
        it->next = o->open;
        o->open = it;
    }
    return it;
}

void ob_add_line(ob_t *o, const char *job_id, int attempt, int rank, int stream, int64_t time_us,
                 const char *line, size_t len)
{
    char *copy = malloc(len + 1);
    if (!copy) {
        log_error("agent: out of memory; a log line of job %s is lost", job_id);
        return;
    }
    memcpy(copy, line, len);
    copy[len] = '\0';
    pthread_mutex_lock(&o->mu);
    ob_add_line_locked(o, job_id, attempt, rank, stream, time_us, copy, len);
    pthread_mutex_unlock(&o->mu);
}

/* Takes ownership of line (len bytes, NUL-terminated). */
static void ob_add_line_locked(ob_t *o, const char *job_id, int attempt, int rank, int stream,
                               int64_t time_us, char *copy, size_t len)
{
    ob_item_t *it = ob_open_locked(o, OB_LOGS, job_id, attempt);
    if (it && it->nlines == it->lines_cap) {
        size_t cap = it->lines_cap ? it->lines_cap * 2 : 64;
        ob_line_t *nv = realloc(it->lines, cap * sizeof(*nv));
        if (nv) {
            it->lines = nv;
            it->lines_cap = cap;
        }
    }
    if (!it || it->nlines == it->lines_cap) {
        free(copy);
        log_error("agent: out of memory; a log line of job %s is lost", job_id);
        return;
    }
    it->lines[it->nlines++] = (ob_line_t){.rank = rank, .stream = stream, .time_us = time_us, .line = copy};
    it->bytes += len + 32;
    if (it->nlines >= OB_MAX_LINES || it->bytes >= OB_MAX_LOG_BYTES)
        ob_seal_locked(o, it);
}

void ob_add_points(ob_t *o, const char *job_id, int attempt, const agent_point_t *pts, size_t n)
{
    pthread_mutex_lock(&o->mu);
    for (size_t i = 0; i < n; i++) {
        ob_item_t *it = ob_open_locked(o, OB_METRICS, job_id, attempt);
        if (!it)
            break;
        agent_points_push(&it->points, &pts[i]);
        if (it->points.n >= OB_MAX_POINTS)
            ob_seal_locked(o, it);
    }
    pthread_mutex_unlock(&o->mu);
}

void ob_add_status(ob_t *o, const char *job_id, int attempt, bool started, const char *reason,
                   bool shutdown)
{
    ob_item_t *it = ob_new(OB_STATUS, job_id, attempt);
    if (!it)
        return;
    it->started = started;
    it->shutdown = shutdown;
    kiln_strlcpy(it->reason, reason ? reason : "", sizeof(it->reason));
    pthread_mutex_lock(&o->mu);
    ob_push_locked(o, it);
    pthread_mutex_unlock(&o->mu);
}

void ob_add_exit(ob_t *o, const char *job_id, int attempt, int rank, pid_t pid, int exit_code,
                 int sig, const char *reason, bool shutdown)
{
    ob_item_t *it = ob_new(OB_EXIT, job_id, attempt);
    if (!it)
        return;
    it->rank = rank;
    it->pid = pid;
    it->exit_code = exit_code;
    it->sig = sig;
    kiln_strlcpy(it->reason, reason ? reason : "", sizeof(it->reason));
    it->shutdown = shutdown;
    pthread_mutex_lock(&o->mu);
    /* Logs before metrics: a job's lines are usually what explains its numbers. */
    for (int kind = OB_LOGS; kind <= OB_METRICS; kind++) {
        ob_item_t *open = o->open;
        while (open) {
            ob_item_t *next = open->next;
            if ((int)open->kind == kind && open->attempt == attempt && !strcmp(open->job_id, job_id))
                ob_seal_locked(o, open);
            open = next;
        }
    }
    ob_push_locked(o, it);
    pthread_mutex_unlock(&o->mu);
}

size_t ob_pending_exits(ob_t *o, agent_rank_info_t *out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&o->mu);
    for (ob_item_t *it = o->head; it; it = it->next) {
        if (it->kind != OB_EXIT)
            continue;
        if (n < max) {
            kiln_strlcpy(out[n].job_id, it->job_id, sizeof(out[n].job_id));
            out[n].attempt = it->attempt;
            out[n].rank = it->rank;
            out[n].pid = it->pid;
        }
        n++;
    }
    pthread_mutex_unlock(&o->mu);
    return n;
}

bool ob_empty(ob_t *o)
{
    pthread_mutex_lock(&o->mu);
    bool empty = !o->head && !o->open;
    pthread_mutex_unlock(&o->mu);
    return empty;
}
