/* outbox.c - the agent's outbox: log lines and metric points grouped into batches per job,
 * rank statuses and exits, all in one FIFO that the sender drains in order. Batches are numbered
 * per attempt (stream id + batch number) so that kilnd stores a re-sent one only once. What
 * cannot be sent yet stays queued, up to a memory cap: while kilnd is unreachable for long, the
 * oldest log and metric batches are dropped (never the one being sent, never a status or an
 * exit), and the job gets a log line saying how much it lost. What an agent took in but could
 * not hand over before it died is counted in a ledger file per attempt, and the next agent in the
 * work dir reports it in the job's log. No gRPC here (agent.c sends). */
#include "agent/agent_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

void ob_init(ob_t *o, int cap_mb)
{
    memset(o, 0, sizeof(*o));
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    o->cap_bytes = (size_t)(cap_mb > 0 ? cap_mb : OB_CAP_MB_DEFAULT) << 20;
}

static size_t ob_item_bytes(const ob_item_t *it)
{
    if (it->kind == OB_LOGS)
        return it->bytes;
    if (it->kind == OB_METRICS)
        return it->points.n * OB_POINT_BYTES;
    return 0;
}

/* ---- streams and ledgers ------------------------------------------------------------------- */

void ob_set_ledger_dir(ob_t *o, const char *dir)
{
    pthread_mutex_lock(&o->mu);
    free(o->ledger_dir);
    o->ledger_dir = dir ? strdup(dir) : NULL;
    pthread_mutex_unlock(&o->mu);
}

static void ledger_path(const ob_t *o, const char *job_id, int attempt, char *out, size_t n)
{
    snprintf(out, n, "%s/jobs/%s/outbox-%d.ledger", o->ledger_dir, job_id, attempt);
}

/* Maps (creating it) the ledger of a stream; NULL when it cannot (logged once per stream). */
static ob_ledger_t *ledger_open(const ob_t *o, const char *job_id, int attempt, int rank)
{
    if (!o->ledger_dir || !job_id[0] || strchr(job_id, '/') || strstr(job_id, ".."))
        return NULL;
    char path[PATH_MAX], dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s/jobs/%s", o->ledger_dir, job_id);
    kiln_err_t err;
    if (kiln_mkdirs_mode(dir, 0700, &err) != 0) {
        log_warn("agent: no ledger for job %s: %s", job_id, err.message);
        return NULL;
    }
    ledger_path(o, job_id, attempt, path, sizeof(path));
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, sizeof(ob_ledger_t)) != 0) {
        log_warn("agent: no ledger for job %s: %s: %s", job_id, path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    ob_ledger_t *l = mmap(NULL, sizeof(*l), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (l == MAP_FAILED) {
        log_warn("agent: no ledger for job %s: mmap: %s", job_id, strerror(errno));
        return NULL;
    }
    kiln_strlcpy(l->job_id, job_id, sizeof(l->job_id));
    l->attempt = attempt;
    l->rank = rank;
    memcpy(l->magic, OB_LEDGER_MAGIC, sizeof(l->magic)); /* last: the header is whole */
    return l;
}

/* The stream of (job, attempt), created on first use. rank: a rank of the attempt here. */
static ob_stream_t *ob_stream_locked(ob_t *o, const char *job_id, int attempt, int rank)
{
    for (size_t i = 0; i < o->nstreams; i++)
        if (o->streams[i].attempt == attempt && !strcmp(o->streams[i].job_id, job_id)) {
            o->streams[i].used_us = kiln_mono_us();
            return &o->streams[i];
        }
    if (o->nstreams == o->capstreams) {
        size_t cap = o->capstreams ? 2 * o->capstreams : 16;
        ob_stream_t *ns = realloc(o->streams, cap * sizeof(*ns));
        if (!ns)
            return NULL;
        o->streams = ns;
        o->capstreams = cap;
    }
    ob_stream_t *st = &o->streams[o->nstreams++];
    memset(st, 0, sizeof(*st));
    kiln_strlcpy(st->job_id, job_id, sizeof(st->job_id));
    st->attempt = attempt;
    st->used_us = kiln_mono_us();
    st->rank = rank;
    while (st->id == 0 && getrandom(&st->id, sizeof(st->id), 0) != (ssize_t)sizeof(st->id))
        st->id = (uint64_t)kiln_now_us() ^ ((uint64_t)kiln_mono_us() << 20) ^ (uint64_t)getpid();
    st->next_seq[OB_LOGS] = st->next_seq[OB_METRICS] = 1;
    st->ledger = ledger_open(o, job_id, attempt, rank);
    return st;
}

void ob_done(ob_t *o, const ob_item_t *it, bool stored)
{
    if (it->kind != OB_LOGS && it->kind != OB_METRICS)
        return;
    pthread_mutex_lock(&o->mu);
    ob_stream_t *st = ob_stream_locked(o, it->job_id, it->attempt, 0);
    if (st && st->ledger) {
        if (it->kind == OB_LOGS)
            *(stored ? &st->ledger->lines_stored : &st->ledger->lines_dropped) += it->nlines;
        else
            *(stored ? &st->ledger->points_stored : &st->ledger->points_dropped) += it->points.n;
    }
    pthread_mutex_unlock(&o->mu);
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
    for (size_t i = 0; i < o->nstreams; i++)
        if (o->streams[i].ledger)
            munmap(o->streams[i].ledger, sizeof(ob_ledger_t));
    free(o->streams);
    free(o->ledger_dir);
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

/* Queues a line of the agent's own (it starts "[kiln-agent]") in the attempt's log. */
static void ob_note_locked(ob_t *o, const char *job_id, int attempt, int rank, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void ob_note_locked(ob_t *o, const char *job_id, int attempt, int rank, const char *fmt, ...)
{
    char note[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(note, sizeof(note), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    char *copy = strdup(note);
    if (copy)
        ob_add_line_locked(o, job_id, attempt, rank, AGENT_STREAM_STDERR, kiln_now_us(), copy,
                           strlen(copy));
}

void ob_note_refused(ob_t *o, const ob_item_t *it, const char *why)
{
    if (it->kind != OB_LOGS && it->kind != OB_METRICS)
        return;
    /* a refused batch of nothing but such notes gets no note about itself (no note chains) */
    bool notes_only = it->kind == OB_LOGS;
    for (size_t i = 0; notes_only && i < it->nlines; i++)
        notes_only = strncmp(it->lines[i].line, "[kiln-agent]", 12) == 0;
    if (notes_only)
        return;
    pthread_mutex_lock(&o->mu);
    ob_stream_t *st = ob_stream_locked(o, it->job_id, it->attempt, 0);
    ob_note_locked(o, it->job_id, it->attempt, st ? st->rank : 0, "[kiln-agent] %zu log line(s) and %zu metric "
                   "point(s) of this job were dropped: kilnd refused them (%.*s)",
                   it->kind == OB_LOGS ? it->nlines : 0, it->kind == OB_METRICS ? it->points.n : (size_t)0,
                   (int)KILN_MIN(strcspn(why, "\r\n"), (size_t)300), why); /* its first line */
    pthread_mutex_unlock(&o->mu);
}

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
        ob_stream_t *st = ob_stream_locked(o, it->job_id, it->attempt, 0);
        if (st && st->ledger) {
            st->ledger->lines_dropped += lines;  /* the note below tells the job's log */
            st->ledger->points_dropped += points;
        }
        int note_rank = st ? st->rank : 0;
        prom_add(&agent_prom_dropped_lines, "", (double)lines);
        prom_add(&agent_prom_dropped_points, "", (double)points);
        log_warn("agent: outbox over %zu MiB (is kilnd unreachable?): dropped %zu log line(s) and %zu "
                 "metric point(s) of job %s", o->cap_bytes >> 20, lines, points, it->job_id);
        ob_note_locked(o, it->job_id, it->attempt, note_rank, "[kiln-agent] %zu log line(s) and %zu metric point(s) "
                       "of this job were dropped: kilnd was unreachable and the agent's outbox was full", lines,
                       points);
        ob_item_free(it);
    }
}

static void ob_push_locked(ob_t *o, ob_item_t *it)
{
    if (it->kind == OB_LOGS || it->kind == OB_METRICS) {
        ob_stream_t *st = ob_stream_locked(o, it->job_id, it->attempt, 0);
        if (st) {
            it->stream_id = st->id;
            it->batch_seq = st->next_seq[it->kind]++;
        }
    }
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
    ob_stream_t *st = ob_stream_locked(o, job_id, attempt, rank);
    if (st && st->ledger)
        st->ledger->lines_taken++;
    if (it->nlines >= OB_MAX_LINES || it->bytes >= OB_MAX_LOG_BYTES)
        ob_seal_locked(o, it);
}

void ob_add_points(ob_t *o, const char *job_id, int attempt, const agent_point_t *pts, size_t n)
{
    pthread_mutex_lock(&o->mu);
    ob_stream_t *st = n ? ob_stream_locked(o, job_id, attempt, pts[0].rank) : NULL;
    for (size_t i = 0; i < n; i++) {
        ob_item_t *it = ob_open_locked(o, OB_METRICS, job_id, attempt);
        if (!it)
            break;
        agent_points_push(&it->points, &pts[i]);
        if (st && st->ledger)
            st->ledger->points_taken++;
        if (it->points.n >= OB_MAX_POINTS) {
            ob_seal_locked(o, it);
            /* sealing may shed other jobs' batches and note it, which may grow the streams */
            st = ob_stream_locked(o, job_id, attempt, pts[0].rank);
        }
    }
    pthread_mutex_unlock(&o->mu);
}

void ob_add_status(ob_t *o, const char *job_id, int attempt, bool started, const char *reason,
                   ob_fault_t fault, int master_port)
{
    ob_item_t *it = ob_new(OB_STATUS, job_id, attempt);
    if (!it)
        return;
    it->started = started;
    it->port = master_port;
    it->shutdown = !started && fault == OB_FAULT_SHUTDOWN;
    it->host_fault = !started && fault == OB_FAULT_HOST;
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

/* Whether a queued or filling report belongs to the stream. */
static bool ob_stream_busy_locked(const ob_t *o, const ob_stream_t *st)
{
    const ob_item_t *lists[2] = {o->head, o->open};
    for (int k = 0; k < 2; k++)
        for (const ob_item_t *it = lists[k]; it; it = it->next)
            if (it->attempt == st->attempt && !strcmp(it->job_id, st->job_id))
                return true;
    return false;
}

size_t ob_retire_idle_locked(ob_t *o, int64_t now_us, int64_t idle_us)
{
    size_t gone = 0;
    for (size_t i = o->nstreams; i-- > 0;) {
        ob_stream_t *st = &o->streams[i];
        if (now_us - st->used_us < idle_us || ob_stream_busy_locked(o, st))
            continue;
        const ob_ledger_t *l = st->ledger;
        if (l && (l->lines_taken != l->lines_stored + l->lines_dropped ||
                  l->points_taken != l->points_stored + l->points_dropped))
            continue; /* not all accounted for: kept, so that a crash still tells the job */
        if (st->ledger) {
            munmap(st->ledger, sizeof(ob_ledger_t));
            char path[PATH_MAX];
            ledger_path(o, st->job_id, st->attempt, path, sizeof(path));
            unlink(path);
        }
        o->streams[i] = o->streams[--o->nstreams];
        gone++;
    }
    return gone;
}

bool ob_empty(ob_t *o)
{
    pthread_mutex_lock(&o->mu);
    bool empty = !o->head && !o->open;
    pthread_mutex_unlock(&o->mu);
    return empty;
}

/* ---- after a restart --------------------------------------------------------------------------- */

int ob_recover(ob_t *o)
{
    if (!o->ledger_dir)
        return 0;
    char jobs[PATH_MAX];
    snprintf(jobs, sizeof(jobs), "%s/jobs", o->ledger_dir);
    DIR *d = opendir(jobs);
    if (!d)
        return 0;
    int lost_attempts = 0;
    struct dirent *je;
    while ((je = readdir(d)) != NULL) {
        if (je->d_name[0] == '.')
            continue;
        char jdir[PATH_MAX + 256];
        snprintf(jdir, sizeof(jdir), "%s/%s", jobs, je->d_name);
        DIR *jd = opendir(jdir);
        if (!jd)
            continue;
        struct dirent *le;
        while ((le = readdir(jd)) != NULL) {
            int attempt = 0;
            char tail[16] = "";
            if (sscanf(le->d_name, "outbox-%d.%15s", &attempt, tail) != 2 || strcmp(tail, "ledger") != 0)
                continue;
            char path[PATH_MAX + 512];
            snprintf(path, sizeof(path), "%s/%s", jdir, le->d_name);
            ob_ledger_t l;
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            ssize_t got = fd >= 0 ? read(fd, &l, sizeof(l)) : -1;
            if (fd >= 0)
                close(fd);
            unlink(path);
            if (got != (ssize_t)sizeof(l) || memcmp(l.magic, OB_LEDGER_MAGIC, sizeof(l.magic)) != 0)
                continue;
            l.job_id[sizeof(l.job_id) - 1] = '\0';
            uint64_t lines = l.lines_taken - KILN_MIN(l.lines_taken, l.lines_stored + l.lines_dropped);
            uint64_t points = l.points_taken - KILN_MIN(l.points_taken, l.points_stored + l.points_dropped);
            if (lines == 0 && points == 0)
                continue;
            lost_attempts++;
            log_warn("agent: the previous agent in this work dir lost %" PRIu64 " log line(s) and %" PRIu64
                     " metric point(s) of job %s attempt %d before it could send them; telling the job's log",
                     lines, points, l.job_id, (int)l.attempt);
            char note[300];
            int n = snprintf(note, sizeof(note), "[kiln-agent] %" PRIu64 " log line(s) and %" PRIu64 " metric point(s) "
                             "of attempt %d were lost: its agent stopped (killed or crashed) before it could send "
                             "them to kilnd", lines, points, (int)l.attempt);
            ob_add_line(o, l.job_id, (int)l.attempt, (int)l.rank, AGENT_STREAM_STDERR, kiln_now_us(), note,
                        (size_t)n);
        }
        closedir(jd);
    }
    closedir(d);
    return lost_attempts;
}
