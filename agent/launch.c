/* launch.c - the agent's launcher: checks an assignment's paths against the agent's roots, starts
 * its ranks through the runtime of their kind (kiln-train or a job's script: run_train.c,
 * run_script.c) as child processes (own process group, the rank contract's environment from
 * rank/, stdout/stderr/metric records on pipes), reads their output and matches metric
 * definitions on one epoll I/O thread, delivers stop orders and exits, stops the other ranks of
 * an attempt when one of them dies, and removes what a dead rank left in /dev/shm. Each attempt's
 * ranks run in a sandbox box (sandbox.c) that sees the data roots read-only and the job's own
 * directories, unless the sandbox is off.
 * It knows nothing about gRPC (what it reads goes to the callbacks in agent_launch_cbs_t) and
 * never parses the job spec: what it needs comes typed in the assignment. */
#include "agent/agent_int.h"
#include "rank/rank.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define LAUNCH_METRICS_FD 3      /* where a rank finds its metric record pipe (KILN_METRICS_FD) */
#define LAUNCH_DRAIN_US 2000000  /* after a rank exits, how long its pipes may stay open */
#define LAUNCH_READ_BUDGET (1 << 20)

enum { PIPE_STDOUT = 0, PIPE_STDERR = 1, PIPE_METRICS = 2, PIPE_PROC = 3, PIPE_N = 4 };

typedef struct ljob {
    char job_id[64];
    int attempt;
    int refs;                    /* ranks still holding it */
    int port;                    /* the rendezvous port this agent picked for it, or 0 */
    int port_claim;              /* its claim among this host's agents (port_claim), or -1 */
    agent_metric_defs_t defs;
    sandbox_box_t *box;          /* the ranks' sandbox, or NULL (--sandbox off) */
    int nranks;                  /* ranks of the attempt on this agent */
    int grace_ms;                /* stopping.grace_period_s: SIGKILL this long after SIGTERM (0: the order's) */
    const launch_runtime_t *rt;  /* the ranks' kind */
    launch_attempt_t at;         /* what the runtime keeps of the attempt */
} ljob_t;

#define LAUNCH_TAIL_LINES 5      /* stderr lines a rank's failure reason may quote */
#define LAUNCH_TAIL_BYTES 400

typedef struct lrank lrank_t;

typedef struct lsrc {            /* one epoll source of a rank: a pipe or its pidfd */
    lrank_t *r;
    int kind;                    /* PIPE_* */
    int fd;                      /* -1 when closed */
    agent_linebuf_t lb;
} lsrc_t;

struct lrank {
    lrank_t *next;
    ljob_t *job;
    int rank, local_rank;
    int slot;                    /* the slot it holds (slot_used), -1: none */
    int device;                  /* gpu slots: the slot's GPU; -1: none */
    pid_t pid;
    lsrc_t src[PIPE_N];
    bool exited;
    int wstatus;
    bool silent;                 /* killed by the launcher itself: do not deliver the exit */
    int64_t drain_deadline_us;
    int64_t kill_at_us;          /* SIGKILL time after a stop order, 0: none */
    bool sigkilled;              /* the launcher sent it SIGKILL (so a SIGKILL death is not the OOM killer's) */
    int64_t last_step;           /* of its last metric record (a record without a step takes it) */
    agent_metric_cursor_t mcur;  /* where its regex matches take their steps (step marks, counts) */
    bool nonfinite_noted;        /* the job's log was told this rank reported NaN or infinity */
    bool refused_noted;          /* ... that a metric record or entry of this rank was refused */
    char last_err[512];
    char tail[LAUNCH_TAIL_LINES][LAUNCH_TAIL_BYTES]; /* its last stderr lines, a ring */
    int ntail;                   /* lines written into the ring, in all */
};

struct agent_launcher {
    char *train_bin, *work_dir; /* work_dir resolved */
    char *python;               /* --python, resolved ("" when it is nowhere in PATH) */
    char *python_given;         /* --python as given */
    char *cuda_lib;             /* --cuda-lib, or NULL */
    launch_host_t host;         /* what runtimes read of the above */
    char **roots;               /* data roots, resolved */
    size_t nroots;
    char *roots_csv;            /* the roots, comma-separated: the ranks' KILN_DATA_ROOTS */
    int slots, cores, max_line;
    int port_lo, port_hi, port_next; /* rendezvous ports (under mu) */
    double comm_watchdog_s;     /* the ranks' KILN_COMM_WATCHDOG_S (0: the engine's default) */
    int sibling_grace_ms;       /* a dead rank's siblings: SIGKILL this long after SIGTERM */
    bool gpu;
    sandbox_t *sandbox;         /* NULL: --sandbox off, ranks run unconfined */
    /* A rank holds a slot when slots carry something of their own: a GPU (gpu), a share of
     * --cpus (slot_cpus). slot_used[i]: a rank holds slot i. */
    bool *slot_used;
    cpu_set_t *slot_cpus;       /* (slots) each slot's share of --cpus; NULL: ranks are not bound */
    agent_launch_cbs_t cbs;
    /* mu: the rank list and what other threads read of a rank (exited, silent, kill_at_us).
     * The I/O thread reads pipes and matches without it: only it reads a rank's pipes or frees
     * a rank, so its sources stay valid, and starts and stops never wait for a job's output. */
    pthread_mutex_t mu;
    pthread_cond_t idle_cv;
    lrank_t *ranks;
    int nranks;
    int epfd, wakefd;
    pthread_t thread;
    bool thread_started;
    bool stop;
    agent_points_t pts;         /* I/O thread scratch */
    /* What agent_launcher_list answers (heartbeats): rebuilt under mu whenever the rank list
     * changes, read under snap_mu alone. */
    pthread_mutex_t snap_mu;
    agent_rank_info_t *snap;
    size_t nsnap, snap_cap;
};

/* Copies the rank list into the snapshot agent_launcher_list reads. Caller holds l->mu. */
static void snap_rebuild_locked(agent_launcher_t *l)
{
    pthread_mutex_lock(&l->snap_mu);
    size_t n = 0;
    for (lrank_t *r = l->ranks; r; r = r->next)
        n += !r->silent;
    if (n > l->snap_cap) {
        agent_rank_info_t *nv = realloc(l->snap, n * sizeof(*nv));
        if (nv) {
            l->snap = nv;
            l->snap_cap = n;
        }
    }
    l->nsnap = 0;
    for (lrank_t *r = l->ranks; r && l->nsnap < l->snap_cap; r = r->next) {
        if (r->silent)
            continue;
        agent_rank_info_t *s = &l->snap[l->nsnap++];
        kiln_strlcpy(s->job_id, r->job->job_id, sizeof(s->job_id));
        s->attempt = r->job->attempt;
        s->rank = r->rank;
        s->pid = r->pid;
    }
    pthread_mutex_unlock(&l->snap_mu);
}

static void launcher_wake(agent_launcher_t *l)
{
    uint64_t one = 1;
    ssize_t rc = write(l->wakefd, &one, sizeof(one));
    (void)rc;
}

/* ---- reading ------------------------------------------------------------------------------ */

typedef struct line_ctx {
    agent_launcher_t *l;
    lrank_t *r;
    int kind;
} line_ctx_t;

static void on_rank_line(void *ud, const char *line, size_t len, bool truncated)
{
    line_ctx_t *c = ud;
    agent_launcher_t *l = c->l;
    lrank_t *r = c->r;
    int64_t now = kiln_now_us();
    char *marked = NULL;
    if (c->kind == PIPE_METRICS) {
        if (len == 0)
            return;
        kiln_err_t err;
        agent_metric_left_t left;
        agent_points_clear(&l->pts);
        char note[400];
        size_t n = 0;
        if (truncated) {
            log_warn("job %s rank %d: metric record longer than 1 MiB ignored", r->job->job_id, r->rank);
            if (!r->refused_noted && l->cbs.on_line) {
                n = kiln_text_fmt(note, sizeof(note), "[kiln-agent] rank %d wrote a metric record longer than 1 MiB; "
                                  "its points are left out (said once per rank)", r->rank);
                l->cbs.on_line(l->cbs.ud, r->job->job_id, r->job->attempt, r->rank, AGENT_STREAM_STDERR, now, note, n);
            }
            r->refused_noted = true;
            return;
        }
        if (agent_metric_parse(line, len, r->rank, &r->last_step, &l->pts, &left, &err) != 0) {
            log_warn("job %s rank %d: malformed metric record ignored: %s", r->job->job_id, r->rank,
                     err.message);
            if (!r->refused_noted)
                n = kiln_text_fmt(note, sizeof(note), "[kiln-agent] rank %d wrote a metric record kiln cannot read "
                                  "(%s); its points are left out (said once per rank)", r->rank, err.message);
            r->refused_noted = true;
        } else if (left.skipped && !r->refused_noted) {
            r->refused_noted = true;
            n = kiln_text_fmt(note, sizeof(note), "[kiln-agent] rank %d wrote %zu metric%s kiln cannot keep (the "
                              "first: \"%s\"): a name has 1 to %d bytes and no control characters, a value is a "
                              "number; such entries are left out (said once per rank)", r->rank, left.skipped,
                              left.skipped == 1 ? "" : "s", left.skipped_first, RANK_METRIC_NAME_MAX);
        }
        if (n && l->cbs.on_line)
            l->cbs.on_line(l->cbs.ud, r->job->job_id, r->job->attempt, r->rank, AGENT_STREAM_STDERR, now, note, n);
        if (l->pts.n && l->cbs.on_points)
            l->cbs.on_points(l->cbs.ud, r->job->job_id, r->job->attempt, l->pts.v, l->pts.n);
        if (left.nonfinite && !r->nonfinite_noted && l->cbs.on_line) {
            /* said once per rank in the job's own log: a NaN is news to whoever trains */
            r->nonfinite_noted = true;
            const agent_point_t *bad = &left.first_nonfinite;
            n = kiln_text_fmt(note, sizeof(note), "[kiln-agent] rank %d reported %s = %g at step %lld; kiln keeps "
                              "finite metric values only, so such points are left out (said once per rank)",
                              r->rank, bad->name, bad->value, (long long)bad->step);
            l->cbs.on_line(l->cbs.ud, r->job->job_id, r->job->attempt, r->rank, AGENT_STREAM_STDERR, now, note, n);
        }
        return;
    }
    int stream = c->kind == PIPE_STDERR ? AGENT_STREAM_STDERR : AGENT_STREAM_STDOUT;
    if (!truncated && agent_metric_cursor_mark(&r->mcur, stream, line, len))
        return; /* a step mark (rank/rank.h): the step of the lines after it, not a log line */
    if (truncated && (marked = malloc(len + sizeof(AGENT_TRUNCATED_MARK)))) {
        /* say so, rather than pass a cut line off as whole */
        memcpy(marked, line, len);
        memcpy(marked + len, AGENT_TRUNCATED_MARK, sizeof(AGENT_TRUNCATED_MARK));
        line = marked;
        len += sizeof(AGENT_TRUNCATED_MARK) - 1;
    }
    if (c->kind == PIPE_STDERR && len > 0) { /* the exit's reason: text kilnd accepts */
        kiln_utf8_copy(r->last_err, sizeof(r->last_err), line, len);
        kiln_utf8_copy(r->tail[r->ntail++ % LAUNCH_TAIL_LINES], LAUNCH_TAIL_BYTES, line, len);
    }
    if (l->cbs.on_line)
        l->cbs.on_line(l->cbs.ud, r->job->job_id, r->job->attempt, r->rank, stream, now, line, len);
    agent_metric_defs_t *d = &r->job->defs;
    if (d->n && !d->off) {
        agent_points_clear(&l->pts);
        if (agent_metric_defs_match(d, &r->mcur, stream, line, len, r->rank, now, &l->pts) && l->cbs.on_points)
            l->cbs.on_points(l->cbs.ud, r->job->job_id, r->job->attempt, l->pts.v, l->pts.n);
        if (r->mcur.note[0] && l->cbs.on_line)
            l->cbs.on_line(l->cbs.ud, r->job->job_id, r->job->attempt, r->rank, AGENT_STREAM_STDERR, now,
                           r->mcur.note, strlen(r->mcur.note));
        r->mcur.note[0] = '\0';
        if (d->off) {
            char note[256];
            int n = snprintf(note, sizeof(note), "[kiln-agent] metric definitions switched off for this job: "
                             "matching its log lines took more than %lld ms of CPU time in %lld ms",
                             (long long)(d->budget_us / 1000), (long long)(d->window_us / 1000));
            log_warn("job %s: metric definitions switched off (matching went over its budget of %lld ms "
                     "per %lld ms)", r->job->job_id, (long long)(d->budget_us / 1000),
                     (long long)(d->window_us / 1000));
            if (l->cbs.on_line)
                l->cbs.on_line(l->cbs.ud, r->job->job_id, r->job->attempt, r->rank, AGENT_STREAM_STDERR,
                               now, note, (size_t)n);
        }
    }
    free(marked);
}

static void src_close(agent_launcher_t *l, lsrc_t *s)
{
    if (s->fd < 0)
        return;
    epoll_ctl(l->epfd, EPOLL_CTL_DEL, s->fd, NULL);
    close(s->fd);
    s->fd = -1;
}

/* Reads what the pipe holds (up to a budget, so one chatty rank cannot starve the others). */
static void src_read(agent_launcher_t *l, lsrc_t *s)
{
    char buf[65536];
    size_t total = 0;
    line_ctx_t ctx = {l, s->r, s->kind};
    while (s->fd >= 0 && total < LAUNCH_READ_BUDGET) {
        ssize_t n = read(s->fd, buf, sizeof(buf));
        if (n > 0) {
            agent_linebuf_feed(&s->lb, buf, (size_t)n, on_rank_line, &ctx);
            total += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        /* EOF or a hard error: the writer is gone */
        agent_linebuf_finish(&s->lb, on_rank_line, &ctx);
        src_close(l, s);
    }
}

/* Checks whether the rank's process ended; if so kills what is left of its process group (the
 * zombie keeps the group id from being reused), reaps it and starts the drain. */
static void rank_try_reap(agent_launcher_t *l, lrank_t *r)
{
    if (r->exited)
        return;
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    if (waitid(P_PID, (id_t)r->pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid != r->pid)
        return;
    kill(-r->pid, SIGKILL);
    /* A rank killed mid-run leaves its shm transport's region behind: it is RAM, free it. Now,
     * while the zombie still holds the pid, so the name cannot be another process's yet. */
    int pid = (int)r->pid;
    if (!r->job->box) /* a box's /dev/shm is its own, and goes with it */
        rank_shm_cleanup(&pid, 1);
    int st = 0;
    if (waitpid(r->pid, &st, 0) != r->pid)
        st = 0;
    r->exited = true;
    r->wstatus = st;
    r->drain_deadline_us = kiln_mono_us() + LAUNCH_DRAIN_US;
    src_close(l, &r->src[PIPE_PROC]);
}

static void job_release(ljob_t *j)
{
    if (--j->refs > 0)
        return;
    if (j->port_claim >= 0)
        close(j->port_claim);
    if (j->rt && j->rt->release)
        j->rt->release(&j->at);
    agent_metric_defs_deinit(&j->defs);
    sandbox_box_destroy(j->box);
    free(j);
}

static void rank_free(agent_launcher_t *l, lrank_t *r)
{
    for (int k = 0; k < PIPE_N; k++) {
        src_close(l, &r->src[k]);
        agent_linebuf_deinit(&r->src[k].lb);
    }
    if (r->slot >= 0 && r->slot < l->slots)
        l->slot_used[r->slot] = false;
    job_release(r->job);
    free(r);
}

/* The rank has exited and its pipes are closed (or the drain time is over): hand over the last
 * partial lines, then the exit. */
static void rank_finish(agent_launcher_t *l, lrank_t *r)
{
    for (int k = PIPE_STDOUT; k <= PIPE_METRICS; k++) {
        if (r->src[k].fd >= 0)
            src_read(l, &r->src[k]);
        line_ctx_t ctx = {l, r, k};
        agent_linebuf_finish(&r->src[k].lb, on_rank_line, &ctx);
    }
    if (!r->silent && l->cbs.on_exit) {
        int code = -1, sig = 0;
        char reason[AGENT_REASON_MAX];
        bool oom = false;
        reason[0] = '\0';
        if (WIFEXITED(r->wstatus)) {
            code = WEXITSTATUS(r->wstatus);
            /* kilnd says "exited with code N" itself; the reason is what the rank said */
            if (code != 0)
                kiln_strlcpy(reason, r->last_err, sizeof(reason));
        } else if (WIFSIGNALED(r->wstatus)) {
            sig = WTERMSIG(r->wstatus);
            int64_t limit_mb = 0;
            if (sig == SIGKILL && !r->sigkilled && r->job->box && sandbox_box_oom(r->job->box, &limit_mb)) {
                oom = true;
                if (r->job->nranks > 1)
                    snprintf(reason, sizeof(reason), "out of memory (limit %lld MiB for its %d ranks on this host)",
                             (long long)limit_mb, r->job->nranks);
                else
                    snprintf(reason, sizeof(reason), "out of memory (limit %lld MiB)", (long long)limit_mb);
            } else {
                kiln_strlcpy(reason, strsignal(sig), sizeof(reason));
            }
        }
        if ((code != 0 || sig != 0) && !oom && r->job->rt->exit_reason) {
            char tail[LAUNCH_TAIL_LINES * LAUNCH_TAIL_BYTES];
            size_t off = 0;
            tail[0] = '\0';
            for (int i = KILN_MAX(0, r->ntail - LAUNCH_TAIL_LINES); i < r->ntail; i++)
                off += (size_t)snprintf(tail + off, sizeof(tail) - off, "%s%s", off ? "\n" : "",
                                        r->tail[i % LAUNCH_TAIL_LINES]);
            r->job->rt->exit_reason(&r->job->at, code, sig, tail, reason, sizeof(reason));
        }
        l->cbs.on_exit(l->cbs.ud, r->job->job_id, r->job->attempt, r->rank, r->pid, code, sig, reason);
    }
}

/* A rank of an attempt ended abnormally (a signal, or a non-zero exit): the attempt is over, so
 * its ranks still running here stop too (their peer is gone; kilnd's stop order would come a
 * heartbeat later, or never while kilnd is unreachable): SIGTERM, SIGCONT for one stopped by a
 * debugger or the operator, SIGKILL after the grace. Their exits are reported as usual, after
 * the dead rank's. Caller holds l->mu. */
static void stop_siblings_locked(agent_launcher_t *l, const lrank_t *dead)
{
    int code = WIFEXITED(dead->wstatus) ? WEXITSTATUS(dead->wstatus) : -1;
    int sig = WIFSIGNALED(dead->wstatus) ? WTERMSIG(dead->wstatus) : 0;
    if (dead->silent || (code == 0 && sig == 0))
        return;
    int n = 0;
    int64_t at = kiln_mono_us() + (int64_t)l->sibling_grace_ms * 1000;
    for (lrank_t *r = l->ranks; r; r = r->next) {
        if (r->job != dead->job || r->exited || r->silent)
            continue;
        kill(-r->pid, SIGTERM);
        kill(-r->pid, SIGCONT);
        if (!r->kill_at_us || at < r->kill_at_us)
            r->kill_at_us = at;
        n++;
    }
    if (n) {
        char how[96];
        log_warn("job %s attempt %d: rank %d %s; stopping its %d other rank(s) here", dead->job->job_id,
                 dead->job->attempt, dead->rank, rank_end_describe(code, sig, how, sizeof(how)), n);
    }
}

static void *launcher_main(void *arg)
{
    agent_launcher_t *l = arg;
    struct epoll_event evs[64];
    int64_t stop_deadline = 0;
    for (;;) {
        pthread_mutex_lock(&l->mu);
        if (l->stop) {
            if (!stop_deadline)
                stop_deadline = kiln_mono_us() + 5000000;
            if (!l->ranks || kiln_mono_us() > stop_deadline) {
                pthread_mutex_unlock(&l->mu);
                break;
            }
        }
        /* How long to sleep: until the next kill or drain deadline; poll ranks without a pidfd. */
        int64_t now = kiln_mono_us();
        int64_t next = now + 1000000;
        for (lrank_t *r = l->ranks; r; r = r->next) {
            if (r->kill_at_us && r->kill_at_us < next)
                next = r->kill_at_us;
            if (r->exited && r->drain_deadline_us < next)
                next = r->drain_deadline_us;
            if (!r->exited && r->src[PIPE_PROC].fd < 0 && now + 50000 < next)
                next = now + 50000;
        }
        pthread_mutex_unlock(&l->mu);
        int timeout = next > now ? (int)((next - now + 999) / 1000) : 0;
        int n = epoll_wait(l->epfd, evs, (int)KILN_ARRAY_LEN(evs), timeout);
        /* Metric records first: a log line a metric definition matches then gets the step of
         * the record written just before it. Pipes are read without the lock (see mu). */
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < n; i++) {
                lsrc_t *s = evs[i].data.ptr;
                if (!s) {
                    if (pass == 0) {
                        uint64_t v;
                        ssize_t rc = read(l->wakefd, &v, sizeof(v));
                        (void)rc;
                    }
                    continue;
                }
                if (s->fd < 0 || (pass == 0) != (s->kind == PIPE_METRICS))
                    continue;
                if (s->kind == PIPE_PROC) {
                    pthread_mutex_lock(&l->mu);
                    rank_try_reap(l, s->r);
                    pthread_mutex_unlock(&l->mu);
                } else {
                    src_read(l, s);
                }
            }
        /* Ranks that are done leave the list under the lock; their last lines and exits are
         * delivered after it, and only then are they freed (and stop counting as running). */
        lrank_t *done = NULL, **tail = &done;
        pthread_mutex_lock(&l->mu);
        now = kiln_mono_us();
        lrank_t **pp = &l->ranks;
        while (*pp) {
            lrank_t *r = *pp;
            if (!r->exited && r->src[PIPE_PROC].fd < 0)
                rank_try_reap(l, r);
            if (!r->exited && r->kill_at_us && now >= r->kill_at_us) {
                log_info("job %s rank %d: grace period over; sending SIGKILL", r->job->job_id, r->rank);
                r->sigkilled = true;
                kill(-r->pid, SIGKILL);
                r->kill_at_us = 0;
            }
            bool open = false;
            for (int k = PIPE_STDOUT; k <= PIPE_METRICS; k++)
                open |= r->src[k].fd >= 0;
            if (r->exited && (!open || now >= r->drain_deadline_us)) {
                *pp = r->next;
                r->next = NULL;
                *tail = r;
                tail = &r->next;
                continue;
            }
            pp = &r->next;
        }
        pthread_mutex_unlock(&l->mu);
        if (!done)
            continue;
        for (lrank_t *r = done; r; r = r->next)
            rank_finish(l, r);
        pthread_mutex_lock(&l->mu);
        for (lrank_t *r = done; r; r = r->next)
            stop_siblings_locked(l, r);
        while (done) {
            lrank_t *r = done;
            done = r->next;
            rank_free(l, r);
            l->nranks--;
        }
        snap_rebuild_locked(l);
        if (l->nranks == 0)
            pthread_cond_broadcast(&l->idle_cv);
        pthread_mutex_unlock(&l->mu);
    }
    return NULL;
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

/* name as an absolute path: itself when it has a '/' (made absolute), else the first executable
 * of that name in PATH; "" when there is none. Heap string, or NULL when out of memory. */
static char *launch_find_program(const char *name)
{
    char buf[PATH_MAX];
    if (strchr(name, '/')) {
        /* absolute, its directories resolved but not itself: a virtual environment's python is a
         * link that must stay one (Python finds the environment beside the link, not its target) */
        const char *base = strrchr(name, '/') + 1;
        char dir[PATH_MAX];
        snprintf(dir, sizeof(dir), "%.*s", base - name > 1 ? (int)(base - name - 1) : 1, name);
        if (base[0] && realpath(dir, buf) && strlen(buf) + strlen(base) + 2 <= sizeof(buf)) {
            if (strcmp(buf, "/") != 0)
                strcat(buf, "/");
            strcat(buf, base);
            if (access(buf, F_OK) == 0)
                return strdup(buf);
        }
        return strdup(name[0] == '/' ? name : "");
    }
    const char *path = getenv("PATH");
    char *copy = strdup(path && path[0] ? path : "/usr/local/bin:/usr/bin:/bin"), *save = NULL;
    if (!copy)
        return NULL;
    char *found = NULL;
    for (char *d = strtok_r(copy, ":", &save); d && !found; d = strtok_r(NULL, ":", &save)) {
        if (d[0] != '/' || snprintf(buf, sizeof(buf), "%s/%s", d, name) >= (int)sizeof(buf))
            continue;
        if (access(buf, X_OK) == 0)
            found = strdup(buf); /* as found: a virtual environment's python is a link that must stay one */
    }
    free(copy);
    return found ? found : strdup("");
}

int launch_mounts_add(launch_mounts_t *m, const char *src, const char *dst, unsigned flags, bool give,
                      kiln_err_t *err)
{
    if (m->n >= LAUNCH_MAX_MOUNTS)
        return kiln_err_set(err, KILN_ETOOBIG, NULL, "more than %d mounts for one attempt", LAUNCH_MAX_MOUNTS);
    if (strlen(src) >= sizeof(m->path[0]) || (dst && strlen(dst) >= sizeof(m->dst[0])))
        return kiln_err_set(err, KILN_ETOOBIG, NULL, "path \"%.80s\" is too long for a mount", src);
    kiln_strlcpy(m->path[m->n], src, sizeof(m->path[0]));
    if (dst)
        kiln_strlcpy(m->dst[m->n], dst, sizeof(m->dst[0]));
    m->v[m->n] = (sandbox_mount_t){m->path[m->n], dst ? m->dst[m->n] : NULL, flags};
    m->give[m->n] = give;
    m->n++;
    return 0;
}

void launch_cmd_deinit(launch_cmd_t *c)
{
    rank_envp_free(c->argv);
    rank_envp_free(c->envp);
    c->argv = c->envp = NULL;
}

/* --cpus: CPUs the agent may run on, at least one a slot; slot i gets share i (rank_cpus_share),
 * and unless --cores says otherwise the cores the ranks share are these CPUs. */
static int slot_cpus_plan(agent_launcher_t *l, const agent_launcher_config_t *cfg, kiln_err_t *err)
{
    cpu_set_t all;
    int rc = rank_cpus_parse(cfg->cpus, "cpus", &all, err);
    if (rc || (rc = rank_cpus_allowed(&all, "cpus", "--cpus", err)))
        return rc;
    int n = CPU_COUNT(&all);
    if (n < l->slots)
        return kiln_err_set(err, KILN_EINVAL, "cpus", "--cpus %s names %d CPU(s) for %d slots: each slot needs one "
                            "at least", cfg->cpus, n, l->slots);
    if (!(l->slot_cpus = calloc((size_t)l->slots, sizeof(cpu_set_t))))
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    for (int i = 0; i < l->slots; i++)
        rank_cpus_share(&all, l->slots, i, &l->slot_cpus[i]);
    if (cfg->cores <= 0)
        l->cores = n;
    return 0;
}

int agent_launcher_create(const agent_launcher_config_t *cfg, const agent_launch_cbs_t *cbs,
                           agent_launcher_t **out, kiln_err_t *err)
{
    *out = NULL;
    agent_launcher_t *l = calloc(1, sizeof(*l));
    if (!l)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    l->epfd = l->wakefd = -1;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->idle_cv, NULL);
    pthread_mutex_init(&l->snap_mu, NULL);
    l->train_bin = strdup(cfg->train_bin ? cfg->train_bin : "kiln-train");
    l->python = launch_find_program(cfg->python && cfg->python[0] ? cfg->python : "python3");
    l->python_given = strdup(cfg->python && cfg->python[0] ? cfg->python : "python3");
    l->cuda_lib = cfg->cuda_lib && cfg->cuda_lib[0] ? strdup(cfg->cuda_lib) : NULL;
    /* resolved, so that it can serve as a root for checkpoint directories */
    l->work_dir = realpath(cfg->work_dir ? cfg->work_dir : ".", NULL);
    if (!l->work_dir) {
        kiln_err_set(err, KILN_EIO, NULL, "could not resolve the work dir \"%s\": %s",
                     cfg->work_dir ? cfg->work_dir : ".", strerror(errno));
        goto fail;
    }
    l->roots = calloc(cfg->n_data_roots ? cfg->n_data_roots : 1, sizeof(char *));
    for (size_t i = 0; l->roots && i < cfg->n_data_roots; i++) {
        if (!(l->roots[i] = strdup(cfg->data_roots[i])))
            break;
        l->nroots++;
    }
    if (!l->roots || l->nroots != cfg->n_data_roots) {
        kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto fail;
    }
    /* agent_data_roots_resolve refused roots with commas already */
    if (!(l->roots_csv = rank_data_roots_join((const char *const *)l->roots, l->nroots))) {
        kiln_err_set(err, KILN_EINVAL, "data-root", "a data root holds a comma, which %s cannot carry",
                     RANK_ENV_DATA_ROOTS);
        goto fail;
    }
    if (cfg->comm_watchdog_s < 0 || cfg->comm_watchdog_s > RANK_MAX_WATCHDOG_S) {
        kiln_err_set(err, KILN_EINVAL, "comm-watchdog-s", "the collective watchdog must be 0 (the engine's default) "
                     "or up to %d seconds, not %g", RANK_MAX_WATCHDOG_S, cfg->comm_watchdog_s);
        goto fail;
    }
    l->comm_watchdog_s = cfg->comm_watchdog_s;
    l->sibling_grace_ms = cfg->sibling_grace_ms > 0 ? cfg->sibling_grace_ms : 10000;
    l->slots = cfg->slots > 0 ? cfg->slots : 1;
    l->cores = cfg->cores > 0 ? cfg->cores : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (l->cores < 1)
        l->cores = 1;
    l->max_line = cfg->max_line > 0 ? cfg->max_line : 16384;
    l->port_lo = cfg->port_lo > 0 ? cfg->port_lo : 29500;
    l->port_hi = cfg->port_hi >= l->port_lo ? cfg->port_hi : (cfg->port_lo > 0 ? cfg->port_lo : 29999);
    l->port_next = l->port_lo;
    l->gpu = cfg->gpu;
    if (cfg->sandbox.off) {
        log_warn("SANDBOX OFF (--sandbox off): ranks run unconfined as uid %u, with everything this agent can "
                 "read and write; use it for development only", (unsigned)geteuid());
    } else {
        if (sandbox_create(&cfg->sandbox, l->slots, &l->sandbox, err) != 0)
            goto fail;
        log_info("sandbox: on, %s", sandbox_describe(l->sandbox));
        for (size_t i = 0; i < l->nroots; i++) {
            struct stat st;
            if (stat(l->roots[i], &st) == 0 && (st.st_mode & 005) != 005)
                log_warn("data root %s is not readable by other users (mode %03o): ranks run as uids of their own "
                         "and will not read it", l->roots[i], (unsigned)(st.st_mode & 0777));
        }
    }
    const char *given = cfg->python && cfg->python[0] ? cfg->python : "python3";
    if (l->python && !l->python[0])
        log_warn("--python %s is not in PATH: script jobs with a .py entry point and no \"python\" of their own "
                 "will be refused", given);
    else if (l->python && access(l->python, X_OK) != 0)
        /* a path given whole is taken as it is: missing, a link that leads nowhere or in a loop */
        log_warn("--python %s cannot be run (%s): script jobs with a .py entry point and no \"python\" of their "
                 "own will fail; give --python the path of a Python, such as /usr/bin/python3", given,
                 strerror(errno));
    bool python_hidden = l->sandbox && l->python && l->python[0] && !sandbox_shows(l->sandbox, l->python);
    if (python_hidden) {
        /* named as the operator gave it, then where it was found and where its links lead */
        char real[PATH_MAX], where[2 * PATH_MAX + 64] = "";
        if (strcmp(given, l->python) != 0)
            snprintf(where, sizeof(where), "%s%s", strchr(given, '/') ? ", that is " : ", found in PATH as ",
                     l->python);
        if (realpath(l->python, real) && strcmp(real, l->python) != 0)
            snprintf(where + strlen(where), sizeof(where) - strlen(where), ", a link to %s", real);
        log_warn("--python %s%s%s lies outside what the sandbox shows ranks (/usr, /bin, /lib and --sandbox-ro-path): "
                 "script jobs with a .py entry point and no \"python\" of their own will fail; give --python "
                 "/usr/bin/python3, or --sandbox-ro-path with the directories that hold it, where its links lead "
                 "and its libraries", given, where, where[0] ? "," : "");
    }
    l->host = (launch_host_t){.work_dir = l->work_dir, .train_bin = l->train_bin, .python = l->python,
                              .python_given = l->python_given,
                              .cuda_lib = l->cuda_lib,
                              .roots = (const char *const *)l->roots, .nroots = l->nroots, .code = cfg->code,
                              .gpu = l->gpu, .sandboxed = l->sandbox != NULL, .python_hidden = python_hidden};
    l->slot_used = calloc((size_t)l->slots, sizeof(bool));
    if (l->slot_used && cfg->cpus && cfg->cpus[0] && slot_cpus_plan(l, cfg, err) != 0)
        goto fail;
    if (cbs)
        l->cbs = *cbs;
    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    l->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (!l->train_bin || !l->python || !l->python_given || !l->slot_used || l->epfd < 0 || l->wakefd < 0) {
        kiln_err_set(err, KILN_EIO, NULL, "could not set up the launcher: %s", strerror(errno));
        goto fail;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->wakefd, &ev) != 0) {
        kiln_err_set(err, KILN_EIO, NULL, "could not set up the launcher: %s", strerror(errno));
        goto fail;
    }
    if (pthread_create(&l->thread, NULL, launcher_main, l) != 0) {
        kiln_err_set(err, KILN_EIO, NULL, "could not start the launcher thread");
        goto fail;
    }
    l->thread_started = true;
    *out = l;
    return 0;
fail:
    agent_launcher_destroy(l);
    return err ? err->status : KILN_EIO;
}

int agent_launcher_cores(const agent_launcher_t *l)
{
    return l->cores;
}

void agent_launcher_destroy(agent_launcher_t *l)
{
    if (!l)
        return;
    if (l->thread_started) {
        pthread_mutex_lock(&l->mu);
        l->stop = true;
        for (lrank_t *r = l->ranks; r; r = r->next) {
            r->silent = true;
            if (!r->exited)
                kill(-r->pid, SIGKILL);
        }
        pthread_mutex_unlock(&l->mu);
        launcher_wake(l);
        pthread_join(l->thread, NULL);
    }
    while (l->ranks) {
        lrank_t *r = l->ranks;
        l->ranks = r->next;
        /* reaped if it can be: a box's end waits for the ranks in it to be reaped */
        if (!r->exited && waitpid(r->pid, NULL, WNOHANG) == r->pid)
            r->exited = true;
        rank_free(l, r);
    }
    if (l->epfd >= 0)
        close(l->epfd);
    if (l->wakefd >= 0)
        close(l->wakefd);
    agent_points_free(&l->pts);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->idle_cv);
    pthread_mutex_destroy(&l->snap_mu);
    free(l->snap);
    for (size_t i = 0; i < l->nroots; i++)
        free(l->roots[i]);
    free(l->roots);
    free(l->roots_csv);
    sandbox_destroy(l->sandbox);
    free(l->slot_used);
    free(l->slot_cpus);
    free(l->train_bin);
    free(l->python);
    free(l->python_given);
    free(l->cuda_lib);
    free(l->work_dir);
    free(l);
}

/* ---- starting ranks ----------------------------------------------------------------------- */

/* Starts one rank; on success the rank is linked into l->ranks and watched by epoll. */
static int rank_spawn(agent_launcher_t *l, ljob_t *job, const Kiln__Assignment *a, int local_rank,
                      int threads, const char *job_dir, const char *ckpt_dir, const char *resume,
                      bool *host_fault, kiln_err_t *err)
{
    int p[3][2] = {{-1, -1}, {-1, -1}, {-1, -1}};
    launch_cmd_t cmd = {0};
    char spec_path[PATH_MAX + 16];
    lrank_t *r = NULL;
    int rc = 0;

    r = calloc(1, sizeof(*r));
    if (!r) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto fail;
    }
    r->job = job;
    r->rank = (int)a->ranks[local_rank];
    r->local_rank = local_rank;
    r->slot = -1;
    r->device = -1;
    agent_metric_cursor_init(&r->mcur);
    for (int k = 0; k < PIPE_N; k++) {
        r->src[k].r = r;
        r->src[k].kind = k;
        r->src[k].fd = -1;
        agent_linebuf_init(&r->src[k].lb, k == PIPE_METRICS ? (size_t)1 << 20 : (size_t)l->max_line);
    }
    for (int k = 0; k < 3; k++) {
        if (pipe2(p[k], O_CLOEXEC) != 0) {
            rc = kiln_err_set(err, KILN_EIO, NULL, "could not create pipes for rank %d: %s", r->rank,
                              strerror(errno));
            *host_fault = true;
            goto fail;
        }
        fcntl(p[k][0], F_SETFL, O_NONBLOCK);
    }
    if (l->gpu || l->slot_cpus) {
        for (int i = 0; i < l->slots && r->slot < 0; i++)
            if (!l->slot_used[i]) {
                r->slot = i;
                l->slot_used[i] = true;
            }
        if (r->slot < 0 && l->gpu) {
            rc = kiln_err_set(err, KILN_ESTATE, NULL, "no free GPU for rank %d", r->rank);
            goto fail;
        }
        if (r->slot < 0) /* more ranks than slots (agent_launcher_start warned): the kernel places it */
            log_warn("job %s: rank %d runs on any CPU: the CPUs of all %d slots are taken", a->job_id, r->rank,
                     l->slots);
        if (l->gpu)
            r->device = r->slot;
    }
    char cpus[RANK_CPUS_LIST_MAX] = "";
    if (l->slot_cpus && r->slot >= 0)
        rank_cpus_format(&l->slot_cpus[r->slot], cpus, sizeof(cpus));

    /* The rank contract (rank/): the agent's environment minus the contract's variables and
     * its secrets, plus the rank's place in the job. */
    rank_env_t re;
    rank_env_init(&re);
    snprintf(spec_path, sizeof(spec_path), "%s/spec.json", job_dir);
    re.spec = spec_path;
    re.job_id = a->job_id;
    re.attempt = a->attempt;
    re.rank = r->rank;
    re.world_size = a->world_size;
    re.local_rank = local_rank;
    re.local_world_size = (int)a->n_ranks;
    re.node_rank = a->node_rank;
    re.nodes = a->nodes;
    re.master_addr = a->master_addr && a->master_addr[0] ? a->master_addr : "127.0.0.1";
    /* the port node 0's launcher picked for the attempt (launch_port_pick) or kilnd's; a job of
     * one rank has no rendezvous (0: KILN_MASTER_PORT unset) */
    re.master_port = job->port ? job->port : a->master_port;
    re.checkpoint_dir = ckpt_dir;
    re.output_dir = job->at.out_dir;
    re.resume_from = resume[0] ? resume : NULL;
    re.metrics_fd = LAUNCH_METRICS_FD;
    re.threads = threads;
    re.device_id = r->device;
    re.data_roots = l->roots_csv;
    re.comm_watchdog_s = l->comm_watchdog_s;
    re.cpus = cpus[0] ? cpus : NULL;
    re.project = a->project && a->project[0] ? a->project : NULL;
    re.step_marks = true; /* on_rank_line reads them */
    re.fresh_start = a->fresh_start; /* a tuning trial promoted under kilnd's --tune-promoted-restart */
    char model[PATH_MAX];
    if (a->init_from_job && a->init_from_job[0]) {
        xfer_init_model_path(l->work_dir, a->job_id, model, sizeof(model));
        re.init_model = model;
    }
    /* the program, its arguments and environment and where it runs: the runtime's (an
     * assignment the contract cannot carry is refused there, err naming the variable) */
    if ((rc = job->rt->command(&job->at, a, &re, &cmd, err)) != 0)
        goto fail;

    /* in its box (or unconfined): stdout, stderr and metric records on the pipes, and SIGKILL
     * when the agent dies (an orphaned rank would go on writing into a job's checkpoint
     * directory while kilnd restarts the job elsewhere) */
    sandbox_fd_t fds[] = {{p[0][1], 1}, {p[1][1], 2}, {p[2][1], LAUNCH_METRICS_FD}};
    sandbox_spawn_t sp = {.path = cmd.path, .argv = cmd.argv, .envp = cmd.envp, .cwd = cmd.cwd[0] ? cmd.cwd : NULL,
                          .fds = fds, .n_fds = KILN_ARRAY_LEN(fds)};
    if ((rc = sandbox_spawn(job->box, &sp, &r->pid, err)) != 0) {
        *host_fault = rc != KILN_ENOTFOUND; /* not an exec that failed: the host's pipes, fork, box */
        goto fail;
    }
    for (int k = 0; k < 3; k++) {
        close(p[k][1]);
        p[k][1] = -1;
        r->src[k].fd = p[k][0];
        p[k][0] = -1;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &r->src[k]};
        epoll_ctl(l->epfd, EPOLL_CTL_ADD, r->src[k].fd, &ev);
    }
#ifdef SYS_pidfd_open
    int pfd = (int)syscall(SYS_pidfd_open, r->pid, 0);
    if (pfd >= 0) {
        fcntl(pfd, F_SETFD, FD_CLOEXEC);
        r->src[PIPE_PROC].fd = pfd;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &r->src[PIPE_PROC]};
        epoll_ctl(l->epfd, EPOLL_CTL_ADD, pfd, &ev);
    }
#endif
    job->refs++;
    r->next = l->ranks;
    l->ranks = r;
    l->nranks++;
    r = NULL;
fail:
    launch_cmd_deinit(&cmd);
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 2; j++)
            if (p[k][j] >= 0)
                close(p[k][j]);
    if (r) {
        if (r->slot >= 0)
            l->slot_used[r->slot] = false;
        for (int k = 0; k < PIPE_N; k++)
            agent_linebuf_deinit(&r->src[k].lb);
        free(r);
    }
    return rc;
}

static bool job_id_ok(const char *id)
{
    if (!id || !id[0] || strlen(id) >= 64 || id[0] == '.')
        return false;
    for (const char *p = id; *p; p++)
        if (!(('a' <= *p && *p <= 'z') || ('A' <= *p && *p <= 'Z') || ('0' <= *p && *p <= '9') ||
              *p == '-' || *p == '_' || *p == '.'))
            return false;
    return true;
}

static bool launcher_running_locked(agent_launcher_t *l, const Kiln__Assignment *a)
{
    for (lrank_t *r = l->ranks; r; r = r->next)
        if (!strcmp(r->job->job_id, a->job_id) && r->job->attempt == a->attempt && !r->exited && !r->silent)
            return true;
    return false;
}

/* The refusal a failed check gives: the check's message, and for paths outside every root what
 * the operator can do about it. */
static int launch_refuse(int rc, kiln_err_t *err, const char *hint)
{
    if (rc == KILN_EPERM && hint)
        kiln_err_hint(err, "%s", hint);
    return rc;
}

/* Whether checkpoint_dir is the job's directory in its project's area, "<checkpoint.path>/.kiln/
 * <project>/<job id>"; its last three components into tail (size n). False for a job of the flat
 * layout (<checkpoint.path>/<job id>) and from a kilnd that sends no project. */
static bool ckpt_in_area(const Kiln__Assignment *a, char *tail, size_t n)
{
    const char *given = a->checkpoint_dir ? a->checkpoint_dir : "";
    if (!a->project || !a->project[0] ||
        snprintf(tail, n, "/" KILN_AREA_DIR "/%s/%s", a->project, a->job_id) >= (int)n)
        return false;
    size_t tn = strlen(tail), gn = strlen(given);
    return gn >= tn && !strcmp(given + gn - tn, tail);
}

/* A checkpoint directory in the project's area must resolve to such a place (ckpt: resolved), so
 * that no symbolic link in the place of ".kiln", the project's or the job's directory takes the
 * ranks' checkpoints out of the area; with made (after kiln_mkdirs_mode), those three must also be
 * real directories, ".kiln" and the project's of the agent's user and closed to others' writes,
 * so that nobody else can have put the job's directory there (the job's own may belong to the
 * uid of a sandbox that ran it). */
static int launch_ckpt_area(const Kiln__Assignment *a, const char *ckpt, bool made, kiln_err_t *err)
{
    char tail[256];
    if (!ckpt_in_area(a, tail, sizeof(tail)))
        return 0;
    size_t tn = strlen(tail), cn = strlen(ckpt);
    if (cn < tn || strcmp(ckpt + cn - tn, tail) != 0) {
        kiln_err_set(err, KILN_EPERM, "checkpoint.path", "checkpoint.path: \"%.200s\" leads elsewhere through a "
                     "symbolic link; kiln keeps a project's checkpoints only in real directories", a->checkpoint_dir);
        kiln_err_hint(err, "remove the symbolic link under checkpoint.path; kiln-agent creates these directories");
        return KILN_EPERM;
    }
    char part[PATH_MAX];
    kiln_strlcpy(part, ckpt, sizeof(part));
    for (int k = 0; made && k < 3; k++) {
        struct stat st;
        bool shared = k > 0; /* ".kiln" or the project's */
        if (lstat(part, &st) != 0 || !S_ISDIR(st.st_mode) ||
            (shared && (st.st_uid != geteuid() || (st.st_mode & 022)))) {
            kiln_err_set(err, KILN_EPERM, "checkpoint.path", "checkpoint.path: \"%.200s\" is not a directory of "
                         "kiln-agent's user that only it may write to", part);
            kiln_err_hint(err, "remove it; kiln-agent creates it with mode 0700");
            return KILN_EPERM;
        }
        *strrchr(part, '/') = '\0';
    }
    return 0;
}

/* The checks of agent_launcher_start, before anything is written: read paths inside a data root
 * (and present), the checkpoint directory and the checkpoint to resume from inside a data root
 * or the work dir, and none of them, resolved, in another project's area. Fills ckpt (resolved
 * checkpoint directory) and resume (resolved, or ""). */
static int launch_check(agent_launcher_t *l, const Kiln__Assignment *a, const char *job_dir, char *ckpt,
                        size_t ckn, char *resume, size_t rn, kiln_err_t *err)
{
    static const char read_hint[] = "kiln-agent lets jobs read only under its --data-root directories";
    static const char write_hint[] =
        "checkpoints go under one of kiln-agent's --data-root directories or its --work-dir";
    int rc;
    for (size_t i = 0; i < a->n_read_paths; i++) {
        const Kiln__JobPath *jp = a->read_paths[i];
        char fbuf[48];
        snprintf(fbuf, sizeof(fbuf), "read_paths[%zu]", i);
        const char *field = jp && jp->field && jp->field[0] ? jp->field : fbuf;
        const char *p = jp && jp->path ? jp->path : "";
        if (!p[0])
            return kiln_err_set(err, KILN_EINVAL, field, "%s names no file", field);
        /* A relative path is refused (kiln_path_confine): where kiln-train would look for it
         * depends on its working directory and KILN_ROOT, so it cannot be checked here. */
        bool exists = false;
        char res[PATH_MAX];
        rc = kiln_path_confine(p, field, (const char *const *)l->roots, l->nroots, res, sizeof(res), &exists, err);
        if (rc)
            return launch_refuse(rc, err, read_hint);
        /* before "does not exist": inside another project's area the answer is the same either way */
        if ((rc = kiln_path_area_check(res, p, field, a->project, err)))
            return rc;
        if (!exists)
            return kiln_err_set(err, KILN_ENOTFOUND, field, "%s \"%.120s\" does not exist", field, p);
    }
    /* a model fetched from kilnd (model.init_from "job:<id>") is in the job's directory already */
    if (a->init_from_job && a->init_from_job[0]) {
        char model[PATH_MAX];
        struct stat st;
        xfer_init_model_path(l->work_dir, a->job_id, model, sizeof(model));
        if (lstat(model, &st) != 0 || !S_ISREG(st.st_mode))
            return kiln_err_set(err, KILN_ENOTFOUND, "model.init_from", "the model of job %.40s was not fetched",
                                a->init_from_job);
    }
    /* where checkpoints may go: the data roots and the work dir */
    const char **wroots = calloc(l->nroots + 1, sizeof(char *));
    if (!wroots)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    for (size_t i = 0; i < l->nroots; i++)
        wroots[i] = l->roots[i];
    wroots[l->nroots] = l->work_dir;
    rc = 0;
    if (a->checkpoint_dir && a->checkpoint_dir[0])
        rc = kiln_path_confine(a->checkpoint_dir, "checkpoint.path", wroots, l->nroots + 1, ckpt, ckn, NULL, err);
    else if (snprintf(ckpt, ckn, "%s/checkpoints", job_dir) >= (int)ckn)
        rc = kiln_err_set(err, KILN_ETOOBIG, NULL, "job directory path too long");
    resume[0] = '\0';
    if (rc == 0 && a->resume_from && a->resume_from[0])
        rc = kiln_path_confine(a->resume_from, "resume_from", wroots, l->nroots + 1, resume, rn, NULL, err);
    free(wroots);
    if (rc)
        return launch_refuse(rc, err, write_hint);
    /* the ranks read what they resume from: neither may be another project's area */
    if (a->checkpoint_dir && a->checkpoint_dir[0] &&
        ((rc = kiln_path_area_check(ckpt, a->checkpoint_dir, "checkpoint.path", a->project, err)) ||
         (rc = launch_ckpt_area(a, ckpt, false, err))))
        return rc;
    if (resume[0])
        rc = kiln_path_area_check(resume, a->resume_from, "resume_from", a->project, err);
    return rc;
}

/* The directories above path that are missing, made mode 0711: a box's ranks reach their
 * checkpoint directory through them (inside a data root they are real directories) without
 * being able to list them. */
static int launch_mkdir_parents(const char *path, kiln_err_t *err)
{
    char parent[PATH_MAX];
    kiln_strlcpy(parent, path, sizeof(parent));
    char *slash = strrchr(parent, '/');
    if (!slash || slash == parent)
        return 0;
    *slash = '\0';
    return kiln_mkdirs_mode(parent, 0711, err);
}

/* The box an attempt's ranks run in (sandbox.c): the data roots, the spec, the model to start
 * from and the checkpoint to resume from, read-only; the output and checkpoint directories
 * writable, and made the box's uid's; then what the runtime asked for (rm). Memory and tasks: the
 * slot's limits times the ranks, memory no more than the spec's resources.memory_limit_mb per
 * rank. */
static int launch_box(agent_launcher_t *l, const Kiln__Assignment *a, const char *job_dir, const char *ckpt_dir,
                      const char *resume, const launch_mounts_t *rm, sandbox_box_t **out, kiln_err_t *err)
{
    char spec[PATH_MAX + 16], out_dir[PATH_MAX + 16], model[PATH_MAX];
    snprintf(spec, sizeof(spec), "%s/spec.json", job_dir);
    snprintf(out_dir, sizeof(out_dir), "%s/output", job_dir);
    sandbox_mount_t *m = calloc(l->nroots + rm->n + 8, sizeof(*m));
    if (!m)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    size_t n = 0;
    for (size_t i = 0; i < l->nroots; i++)
        m[n++] = (sandbox_mount_t){l->roots[i], NULL, SANDBOX_RO};
    m[n++] = (sandbox_mount_t){spec, NULL, SANDBOX_RO};
    m[n++] = (sandbox_mount_t){out_dir, NULL, SANDBOX_RW};
    m[n++] = (sandbox_mount_t){ckpt_dir, NULL, SANDBOX_RW};
    if (resume[0])
        m[n++] = (sandbox_mount_t){resume, NULL, SANDBOX_RO};
    bool init_model = a->init_from_job && a->init_from_job[0];
    if (init_model) {
        xfer_init_model_path(l->work_dir, a->job_id, model, sizeof(model));
        m[n++] = (sandbox_mount_t){model, NULL, SANDBOX_RO};
    }
    for (size_t i = 0; i < rm->n; i++)
        m[n++] = rm->v[i];
    int64_t rank_mb = sandbox_memory_per_slot_mb(l->sandbox);
    if (a->memory_limit_mb > 0 && (rank_mb <= 0 || a->memory_limit_mb < rank_mb))
        rank_mb = a->memory_limit_mb;
    char name[128];
    snprintf(name, sizeof(name), "job %s attempt %d", a->job_id, a->attempt);
    sandbox_box_spec_t bs = {.name = name, .mounts = m, .n_mounts = n, .memory_mb = rank_mb * (int64_t)a->n_ranks,
                             .pids_max = sandbox_pids_per_slot(l->sandbox) * (int64_t)a->n_ranks, .gpu = l->gpu};
    sandbox_box_t *box = NULL;
    int rc = sandbox_box_create(l->sandbox, &bs, &box, err);
    if (rc == KILN_EIO) {
        /* a host's passing trouble (a cgroup gone under it) should not cost the job an attempt:
         * once more, with another uid and cgroup */
        log_warn("job %s attempt %d: %s; building its sandbox once more", a->job_id, a->attempt, err->message);
        kiln_err_clear(err);
        rc = sandbox_box_create(l->sandbox, &bs, &box, err);
    }
    free(m);
    if (rc == 0)
        rc = sandbox_box_give(box, out_dir, true, err);
    if (rc == 0)
        rc = sandbox_box_give(box, ckpt_dir, true, err);
    if (rc == 0)
        rc = sandbox_box_give(box, spec, false, err);
    if (rc == 0 && init_model)
        rc = sandbox_box_give(box, model, false, err);
    for (size_t i = 0; rc == 0 && i < rm->n; i++)
        if (rm->give[i])
            rc = sandbox_box_give(box, rm->path[i], true, err);
    if (rc != 0) {
        sandbox_box_destroy(box);
        return rc;
    }
    log_info("job %s attempt %d: sandbox uid %u, memory %lld MiB, %lld tasks", a->job_id, a->attempt,
             (unsigned)sandbox_box_uid(box), (long long)bs.memory_mb, (long long)bs.pids_max);
    *out = box;
    return 0;
}

/* Whether nothing on this host listens on (or otherwise holds) TCP port p: bound the way rank 0
 * will bind it (any address, SO_REUSEADDR), then let go. */
static bool port_free(int p)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p)};
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    bool ok = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(fd, 1) == 0;
    close(fd);
    return ok;
}

/* Claims port p among the kiln-agents of this host: an abstract unix socket named after the port,
 * which only one process of the network namespace (the scope of its TCP ports, too) can bind,
 * and which the kernel lets go when the holder closes it or dies. Held while the attempt holds
 * the port, so two agents of one host that see the same port free at the same moment (before
 * either job's rank 0 has bound it) cannot both hand it out. The socket, or -1 when another
 * agent holds the port. */
static int port_claim(int p)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int n = snprintf(sa.sun_path + 1, sizeof(sa.sun_path) - 1, "kiln-rendezvous-port-%d", p);
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
    if (bind(fd, (struct sockaddr *)&sa, len) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A rendezvous port of the range that no agent of the host (this one included) has claimed and
 * nothing on the host uses, into *out, with its claim in *claim. Caller holds l->mu.
 * KILN_EUNAVAIL when there is none. */
static int port_pick_locked(agent_launcher_t *l, int *out, int *claim, kiln_err_t *err)
{
    int n = l->port_hi - l->port_lo + 1;
    for (int k = 0; k < n; k++) {
        int p = l->port_lo + (l->port_next - l->port_lo + k) % n;
        int fd = port_claim(p); /* fails for the ports this agent's attempts hold, too */
        if (fd < 0)
            continue;
        if (!port_free(p)) {
            close(fd);
            continue;
        }
        l->port_next = p + 1 > l->port_hi ? l->port_lo : p + 1; /* spread reuse over the range */
        *out = p;
        *claim = fd;
        return 0;
    }
    kiln_err_set(err, KILN_EUNAVAIL, NULL, "no free rendezvous port in %d-%d on this host", l->port_lo, l->port_hi);
    kiln_err_hint(err, "widen kiln-agent's --rendezvous-ports or free ports in the range");
    return KILN_EUNAVAIL;
}

int agent_launcher_start(agent_launcher_t *l, const Kiln__Assignment *a, kiln_err_t *err)
{
    kiln_err_t lerr;
    if (!err)
        err = &lerr;
    kiln_err_clear(err);
    int rc = 0;
    int threads = a->threads_per_rank > 0 ? a->threads_per_rank : KILN_MAX(1, l->cores / l->slots);
    char job_dir[PATH_MAX], path[PATH_MAX + 16], ckpt_dir[PATH_MAX], resume[PATH_MAX];
    ljob_t *job = NULL;
    sandbox_box_t *box = NULL;
    lrank_t *first_old;
    const launch_runtime_t *rt = a->entry_point && a->entry_point[0] ? &launch_runtime_script : &launch_runtime_train;
    launch_attempt_t at = {.host = &l->host, .attempt = a->attempt};
    launch_mounts_t *rm = NULL;
    bool prepared = false;
    bool host_fault = false;     /* a failure of this host's (its sandbox, processes, ports, memory) */
    agent_metric_defs_t defs;
    kiln_err_t derr;
    char defs_note[400] = "";
    /* where a start's time goes (the "started" line): files, the runtime's preparation (a
     * script's code), the sandbox's box, spawning the ranks */
    int64_t t0 = kiln_mono_us(), t_files = 0, t_prep = 0, t_box = 0;

    if (!job_id_ok(a->job_id))
        return kiln_err_set(err, KILN_EINVAL, "job_id", "assignment has a bad job id");
    pthread_mutex_lock(&l->mu);
    bool running = launcher_running_locked(l, a);
    pthread_mutex_unlock(&l->mu);
    if (running)
        return kiln_err_set(err, KILN_EEXIST, NULL, "job %s attempt %d is already running", a->job_id, a->attempt);
    /* Checks, the job directory and the definitions first, outside the lock: they touch the file
     * system (which may be slow), and writing the spec syncs to disk. */
    const char *spec = a->spec_json ? a->spec_json : "{}";
    snprintf(job_dir, sizeof(job_dir), "%s/jobs/%s", l->work_dir, a->job_id);
    if (a->n_ranks == 0)
        rc = kiln_err_set(err, KILN_EINVAL, "ranks", "assignment has no ranks");
    if (rc == 0)
        rc = launch_check(l, a, job_dir, ckpt_dir, sizeof(ckpt_dir), resume, sizeof(resume), err);
    if (rc == 0)
        rc = kiln_mkdirs_mode(job_dir, 0700, err);
    if (rc == 0 && l->sandbox)
        rc = launch_mkdir_parents(ckpt_dir, err);
    if (rc == 0)
        rc = kiln_mkdirs_mode(ckpt_dir, 0700, err);
    if (rc == 0)
        rc = launch_ckpt_area(a, ckpt_dir, true, err);
    snprintf(path, sizeof(path), "%s/output", job_dir);
    if (rc == 0)
        rc = kiln_mkdirs_mode(path, 0700, err);
    snprintf(path, sizeof(path), "%s/spec.json", job_dir);
    if (rc == 0)
        rc = kiln_file_write_atomic_mode(path, spec, strlen(spec), 0600, err);
    kiln_strlcpy(at.job_id, a->job_id, sizeof(at.job_id));
    kiln_strlcpy(at.job_dir, job_dir, sizeof(at.job_dir));
    snprintf(at.out_dir, sizeof(at.out_dir), "%s/output", job_dir);
    kiln_strlcpy(at.ckpt_dir, ckpt_dir, sizeof(at.ckpt_dir));
    if (rc == 0 && !(rm = calloc(1, sizeof(*rm))))
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    t_files = kiln_mono_us();
    if (rc == 0)
        rc = rt->prepare(&at, a, rm, err);
    prepared = rc == 0;
    t_prep = kiln_mono_us();
    if (rc == 0 && l->sandbox)
        /* a path of the job's that is not there (KILN_ENOTFOUND) is the job's fault, not the host's */
        host_fault = (rc = launch_box(l, a, job_dir, ckpt_dir, resume, rm, &box, err)) != 0 && rc != KILN_ENOTFOUND;
    t_box = kiln_mono_us();
    free(rm);
    if (agent_metric_defs_init(&defs, a->metric_definitions, a->n_metric_definitions, &derr) != 0) {
        log_warn("job %s: metric definitions ignored: %s", a->job_id, derr.message);
        snprintf(defs_note, sizeof(defs_note), "[kiln-agent] metric definitions ignored: %s", derr.message);
        agent_metric_defs_deinit(&defs);
        agent_metric_defs_init(&defs, NULL, 0, NULL);
    }
    pthread_mutex_lock(&l->mu);
    first_old = l->ranks;
    if (rc != 0)
        goto done;
    if (launcher_running_locked(l, a)) {
        pthread_mutex_unlock(&l->mu);
        agent_metric_defs_deinit(&defs);
        sandbox_box_destroy(box);
        if (prepared && rt->release)
            rt->release(&at);
        return kiln_err_set(err, KILN_EEXIST, NULL, "job %s attempt %d is already running", a->job_id, a->attempt);
    }

    job = calloc(1, sizeof(*job));
    if (!job) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto done;
    }
    job->box = box; /* the job owns it now */
    box = NULL;
    job->rt = rt;
    job->at = at; /* and the runtime's state */
    prepared = false;
    job->grace_ms = a->grace_period_s > 0 ? a->grace_period_s * 1000 : 0;
    job->nranks = (int)a->n_ranks;
    kiln_strlcpy(job->job_id, a->job_id, sizeof(job->job_id));
    job->attempt = a->attempt;
    job->refs = 1; /* ours, until the loop below is done */
    job->port_claim = -1;
    job->defs = defs; /* the job owns them now */
    agent_metric_defs_init(&defs, NULL, 0, NULL);
    /* a script gets MASTER_PORT even alone (torch.distributed's env:// wants one) */
    if (a->master_port == 0 && (a->world_size > 1 || rt == &launch_runtime_script) && a->node_rank == 0 &&
        (rc = port_pick_locked(l, &job->port, &job->port_claim, err)) != 0) {
        host_fault = true;
        goto done;
    }
    if (defs_note[0] && l->cbs.on_line)
        l->cbs.on_line(l->cbs.ud, a->job_id, a->attempt, a->ranks[0], AGENT_STREAM_STDERR, kiln_now_us(), defs_note,
                       strlen(defs_note));
    if (l->nranks + (int)a->n_ranks > l->slots)
        log_warn("job %s: %d ranks assigned while %d of %d slots are busy", a->job_id,
                 (int)a->n_ranks, l->nranks, l->slots);
    for (size_t i = 0; i < a->n_ranks; i++) {
        if ((rc = rank_spawn(l, job, a, (int)i, threads, job_dir, ckpt_dir, resume, &host_fault, err)) != 0)
            break;
    }
    if (rc != 0) {
        /* Kill the ranks this call started; their exits are ours, not the job's. */
        for (lrank_t *r = l->ranks; r != first_old; r = r->next) {
            r->silent = true;
            kill(-r->pid, SIGKILL);
        }
    }
done:
    if (rc != 0) {
        log_error("job %s attempt %d: not started: %s", a->job_id, a->attempt, err->message);
        if (err->hint[0] && strlen(err->message) + strlen(err->hint) + 3 < sizeof(err->message)) {
            /* the reason kilnd shows the job's owner carries the hint too */
            size_t ml = strlen(err->message);
            snprintf(err->message + ml, sizeof(err->message) - ml, "; %s", err->hint);
        }
    } else {
        int64_t t_end = kiln_mono_us();
        log_info("job %s attempt %d: started %d rank(s) (threads %d) in %.1f ms: files %.1f, prepare %.1f, "
                 "sandbox %.1f, spawn %.1f", a->job_id, a->attempt, (int)a->n_ranks, threads,
                 (double)(t_end - t0) / 1e3, (double)(t_files - t0) / 1e3, (double)(t_prep - t_files) / 1e3,
                 (double)(t_box - t_prep) / 1e3, (double)(t_end - t_box) / 1e3);
    }
    if (l->cbs.on_started)
        l->cbs.on_started(l->cbs.ud, a->job_id, a->attempt, rc == 0, rc != 0 && (host_fault || rc == KILN_ENOMEM),
                          rc == 0 ? "" : err->message, rc == 0 && job ? job->port : 0);
    if (job)
        job_release(job);
    snap_rebuild_locked(l);
    pthread_mutex_unlock(&l->mu);
    agent_metric_defs_deinit(&defs);
    sandbox_box_destroy(box); /* made, but no job took it */
    if (prepared && rt->release)
        rt->release(&at);
    launcher_wake(l);
    return rc;
}

/* ---- stopping and listing ---------------------------------------------------------------- */

static int launcher_signal(agent_launcher_t *l, const char *job_id, int attempt, int grace_ms)
{
    int n = 0;
    pthread_mutex_lock(&l->mu);
    int64_t now = kiln_mono_us();
    for (lrank_t *r = l->ranks; r; r = r->next) {
        if (r->exited)
            continue;
        if (job_id && (strcmp(r->job->job_id, job_id) || (attempt && r->job->attempt != attempt)))
            continue;
        int g = grace_ms > 0 && r->job->grace_ms > 0 ? r->job->grace_ms : grace_ms; /* the spec's, if it set one */
        int sig = g > 0 ? SIGTERM : SIGKILL;
        r->sigkilled |= sig == SIGKILL;
        kill(-r->pid, sig);
        if (sig == SIGTERM)
            kill(-r->pid, SIGCONT); /* a stopped rank acts on it too (then checkpoints, or not) */
        int64_t at = g > 0 ? now + (int64_t)g * 1000 : 0;
        if (at && (!r->kill_at_us || at < r->kill_at_us))
            r->kill_at_us = at;
        n++;
    }
    pthread_mutex_unlock(&l->mu);
    launcher_wake(l);
    return n;
}

int agent_launcher_stop(agent_launcher_t *l, const char *job_id, int attempt, int grace_ms)
{
    return launcher_signal(l, job_id, attempt, grace_ms);
}

int agent_launcher_stop_all(agent_launcher_t *l, int grace_ms)
{
    return launcher_signal(l, NULL, 0, grace_ms);
}

bool agent_launcher_wait_idle(agent_launcher_t *l, int timeout_ms)
{
    struct timespec ts;
    kiln_deadline_in(&ts, timeout_ms);
    pthread_mutex_lock(&l->mu);
    while (l->nranks > 0)
        if (pthread_cond_timedwait(&l->idle_cv, &l->mu, &ts) != 0)
            break;
    bool idle = l->nranks == 0;
    pthread_mutex_unlock(&l->mu);
    return idle;
}

size_t agent_launcher_list(agent_launcher_t *l, agent_rank_info_t *out, size_t max)
{
    pthread_mutex_lock(&l->snap_mu);
    size_t n = l->nsnap;
    if (n && max)
        memcpy(out, l->snap, KILN_MIN(n, max) * sizeof(*out));
    pthread_mutex_unlock(&l->snap_mu);
    return n;
}
