/* ckpt_sync.c - the agent's checkpoint sync: while an attempt whose rank 0 runs here checkpoints
 * into its work dir (no checkpoint.path), one thread watches that directory and every directory
 * below it with inotify and, each time a file in the tree is closed after writing, renamed or
 * removed, and no file in it is being written, syncs the tree to kilnd (xfer_ckpt_sync). A file
 * written into a directory the script has just made can be half-written when the sync that the
 * directory's creation caused reads it; its close syncs the tree again. Rank 0's exit syncs it a last time
 * (ckpt_sync_final). A sync kilnd refuses (past --artifact-max-job-mb, say) is told once in the
 * job's log and never fails the job. It is not the transfer itself (transfer.c). */
#include "agent/agent_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#define CKPT_WRITING_MAX 64          /* files being written tracked per tree */
#define CKPT_DIRS_MAX 256            /* directories watched below a tree's top (more are synced, not watched) */
#define CKPT_POLL_MS 250
#define CKPT_MASK (IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_CREATE | IN_ONLYDIR)

/* A file being written: its directory's watch and its name there. */
typedef struct ckpt_writing {
    int wd;
    char name[NAME_MAX + 1];
} ckpt_writing_t;

typedef struct ckpt_watch {
    struct ckpt_watch *next;
    char job_id[64];
    int attempt;
    int wd;                      /* inotify watch of the top, -1 once gone */
    int subs[CKPT_DIRS_MAX];     /* watches of the directories below it */
    int n_subs;
    bool rescan;                 /* a directory came or went: watch the tree again */
    bool dirty;                  /* something changed since the last sync began */
    bool busy;                   /* a sync of it is under way */
    ckpt_writing_t writing[CKPT_WRITING_MAX]; /* modified, not closed yet */
    int n_writing;
    char last_error[256];        /* the last refusal told in the job's log */
    bool unsupported;            /* kilnd keeps no artifacts (no --artifact-dir): nothing to sync to */
} ckpt_watch_t;

struct ckpt_sync {
    xfer_t *xfer;
    const char *work_dir;
    int ifd;                     /* inotify */
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* a sync ended */
    ckpt_watch_t *watches;
    bool stopping;
    bool started;
    pthread_t thread;
};

static ckpt_watch_t *find_locked(ckpt_sync_t *c, const char *job_id, int attempt)
{
    for (ckpt_watch_t *w = c->watches; w; w = w->next)
        if (!strcmp(w->job_id, job_id) && w->attempt == attempt)
            return w;
    return NULL;
}

static void writing_add(ckpt_watch_t *w, int wd, const char *name)
{
    for (int i = 0; i < w->n_writing; i++)
        if (w->writing[i].wd == wd && !strcmp(w->writing[i].name, name))
            return;
    if (w->n_writing < CKPT_WRITING_MAX) {
        w->writing[w->n_writing].wd = wd;
        kiln_strlcpy(w->writing[w->n_writing++].name, name, sizeof(w->writing[0].name));
    }
}

static void writing_del(ckpt_watch_t *w, int wd, const char *name)
{
    for (int i = 0; i < w->n_writing; i++)
        if (w->writing[i].wd == wd && !strcmp(w->writing[i].name, name)) {
            w->n_writing--;
            if (i != w->n_writing)
                w->writing[i] = w->writing[w->n_writing];
            return;
        }
}

/* One sync of w, on the calling thread; w is marked busy by the caller (c->mu not held). */
static void sync_one(ckpt_sync_t *c, ckpt_watch_t *w)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    int64_t bytes = 0;
    size_t files = 0;
    int64_t t0 = kiln_mono_us();
    pthread_mutex_lock(&c->mu);
    bool unsupported = w->unsupported;
    pthread_mutex_unlock(&c->mu);
    if (unsupported)
        return;
    int rc = xfer_ckpt_sync(c->xfer, w->job_id, w->attempt, &bytes, &files, &err);
    pthread_mutex_lock(&c->mu);
    if (rc == KILN_EUNSUPP) {
        /* the job's log already says it when its artifacts are not kept */
        w->unsupported = true;
        pthread_mutex_unlock(&c->mu);
        log_info("job %s attempt %d: its checkpoint directory is not synced: %s", w->job_id, w->attempt, err.message);
        return;
    }
    if (rc == 0) {
        w->last_error[0] = '\0';
        pthread_mutex_unlock(&c->mu);
        log_info("job %s attempt %d: checkpoint directory synced (%zu file(s), %lld bytes, %.1f s)", w->job_id,
                 w->attempt, files, (long long)bytes, (kiln_mono_us() - t0) / 1e6);
        return;
    }
    bool told = !strcmp(w->last_error, err.message);
    kiln_strlcpy(w->last_error, err.message, sizeof(w->last_error));
    pthread_mutex_unlock(&c->mu);
    if (rc == KILN_ECANCELED || told)
        return;
    log_warn("job %s attempt %d: checkpoint directory not synced: %s", w->job_id, w->attempt, err.message);
    xfer_job_note(c->xfer, w->job_id, w->attempt, AGENT_STREAM_STDERR,
                  "checkpoints not synced (the job goes on; the next attempt restores the last state kilnd "
                  "holds): %s%s%s", err.message, err.hint[0] ? "; " : "", err.hint);
}

/* Adds a watch of every directory below the one dfd (depth names deep) to subs, walking through
 * descriptors with O_NOFOLLOW (a link is never watched through) and watching each directory as
 * the descriptor names it. */
static void watch_below(int ifd, int dfd, int depth, int *subs, int *n)
{
    int fd2 = dup(dfd);
    DIR *d = fd2 >= 0 ? fdopendir(fd2) : NULL;
    if (!d) {
        if (fd2 >= 0)
            close(fd2);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d)) && *n < CKPT_DIRS_MAX) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
            (de->d_type != DT_DIR && de->d_type != DT_UNKNOWN))
            continue;
        int fd = openat(dfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            continue;
        char self[64];
        snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
        int wd = inotify_add_watch(ifd, self, CKPT_MASK);
        if (wd >= 0) {
            bool have = false;
            for (int i = 0; i < *n && !have; i++)
                have = subs[i] == wd;
            if (!have)
                subs[(*n)++] = wd;
            if (depth + 1 < KILN_ARTIFACT_PATH_DEPTH)
                watch_below(ifd, fd, depth + 1, subs, n);
        }
        close(fd);
    }
    closedir(d);
}

/* Watches the directories below w's top as they are now, and no others; c->mu held. */
static void rewatch_locked(ckpt_sync_t *c, ckpt_watch_t *w)
{
    char dir[PATH_MAX];
    xfer_ckpt_dir(c->work_dir, w->job_id, dir, sizeof(dir));
    int subs[CKPT_DIRS_MAX], n = 0;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd >= 0) {
        watch_below(c->ifd, dfd, 0, subs, &n);
        close(dfd);
    }
    for (int i = 0; i < w->n_subs; i++) {
        bool kept = false;
        for (int k = 0; k < n && !kept; k++)
            kept = subs[k] == w->subs[i];
        if (!kept)
            inotify_rm_watch(c->ifd, w->subs[i]);
    }
    memcpy(w->subs, subs, sizeof(subs[0]) * (size_t)n);
    w->n_subs = n;
    w->rescan = false;
    /* a file being written in a directory no longer watched (moved out of the tree) is no
     * reason to wait */
    for (int i = 0; i < w->n_writing;) {
        bool watched = w->writing[i].wd == w->wd;
        for (int k = 0; k < n && !watched; k++)
            watched = subs[k] == w->writing[i].wd;
        if (watched)
            i++;
        else
            w->writing[i] = w->writing[--w->n_writing];
    }
}

/* Reads what inotify has; c->mu held. */
static void read_events_locked(ckpt_sync_t *c)
{
    char buf[16384] __attribute__((aligned(__alignof__(struct inotify_event))));
    for (;;) {
        ssize_t n = read(c->ifd, buf, sizeof(buf));
        if (n <= 0)
            return;
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)p;
            p += sizeof(*ev) + ev->len;
            if (ev->mask & IN_Q_OVERFLOW) {
                /* events were lost: every directory is synced again once it is quiet */
                for (ckpt_watch_t *it = c->watches; it; it = it->next)
                    it->dirty = it->rescan = true, it->n_writing = 0;
                continue;
            }
            ckpt_watch_t *w = NULL;
            int sub = -1;
            for (ckpt_watch_t *it = c->watches; it && !w; it = it->next) {
                if (it->wd == ev->wd)
                    w = it;
                for (int i = 0; i < it->n_subs && !w; i++)
                    if (it->subs[i] == ev->wd)
                        w = it, sub = i;
            }
            if (!w)
                continue;
            if (ev->mask & IN_IGNORED) {
                if (sub >= 0)
                    w->subs[sub] = w->subs[--w->n_subs];
                else
                    w->wd = -1;
                continue;
            }
            const char *name = ev->len ? ev->name : "";
            if (ev->mask & IN_ISDIR) {
                /* a directory made, moved or removed: the set of watched directories changes */
                if (ev->mask & (IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE))
                    w->rescan = w->dirty = true;
                continue;
            }
            if (ev->mask & IN_MODIFY)
                writing_add(w, ev->wd, name);
            if (ev->mask & (IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE)) {
                writing_del(w, ev->wd, name);
                w->dirty = true;
            }
        }
    }
}

static void *sync_main(void *arg)
{
    ckpt_sync_t *c = arg;
    struct pollfd pfd = {.fd = c->ifd, .events = POLLIN};
    pthread_mutex_lock(&c->mu);
    while (!c->stopping) {
        pthread_mutex_unlock(&c->mu);
        int pr = poll(&pfd, 1, CKPT_POLL_MS);
        pthread_mutex_lock(&c->mu);
        if (pr > 0)
            read_events_locked(c);
        for (ckpt_watch_t *w = c->watches; w; w = w->next)
            if (w->rescan)
                rewatch_locked(c, w);
        /* a directory with nothing half-written, changed since its last sync */
        ckpt_watch_t *due = NULL;
        for (ckpt_watch_t *w = c->watches; w && !due; w = w->next)
            if (w->dirty && !w->busy && w->n_writing == 0)
                due = w;
        if (!due || c->stopping)
            continue;
        due->dirty = false;
        due->busy = true;
        pthread_mutex_unlock(&c->mu);
        sync_one(c, due);
        pthread_mutex_lock(&c->mu);
        due->busy = false;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int ckpt_sync_create(xfer_t *x, const char *work_dir, ckpt_sync_t **out, kiln_err_t *err)
{
    *out = NULL;
    ckpt_sync_t *c = calloc(1, sizeof(*c));
    if (!c)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    c->xfer = x;
    c->work_dir = work_dir;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (c->ifd < 0) {
        int e = errno;
        ckpt_sync_destroy(c);
        return kiln_err_set(err, KILN_EIO, NULL, "could not watch checkpoint directories (inotify): %s", strerror(e));
    }
    if (pthread_create(&c->thread, NULL, sync_main, c) != 0) {
        ckpt_sync_destroy(c);
        return kiln_err_set(err, KILN_EIO, NULL, "could not start the checkpoint sync thread");
    }
    c->started = true;
    *out = c;
    return 0;
}

void ckpt_sync_destroy(ckpt_sync_t *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->stopping = true;
    pthread_mutex_unlock(&c->mu);
    if (c->started)
        pthread_join(c->thread, NULL);
    while (c->watches) {
        ckpt_watch_t *w = c->watches;
        c->watches = w->next;
        free(w);
    }
    if (c->ifd >= 0)
        close(c->ifd);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

int ckpt_sync_watch(ckpt_sync_t *c, const char *job_id, int attempt, kiln_err_t *err)
{
    char dir[PATH_MAX];
    xfer_ckpt_dir(c->work_dir, job_id, dir, sizeof(dir));
    int rc = kiln_mkdirs_mode(dir, 0700, err);
    if (rc)
        return rc;
    pthread_mutex_lock(&c->mu);
    if (find_locked(c, job_id, attempt)) {
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    ckpt_watch_t *w = calloc(1, sizeof(*w));
    int wd = w ? inotify_add_watch(c->ifd, dir, CKPT_MASK | IN_DONT_FOLLOW) : -1;
    if (wd < 0) {
        int e = errno;
        pthread_mutex_unlock(&c->mu);
        free(w);
        return w ? kiln_err_set(err, KILN_EIO, NULL, "could not watch %s: %s", dir, strerror(e))
                 : kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    xfer_ckpt_attempt_set(c->work_dir, job_id, attempt);
    kiln_strlcpy(w->job_id, job_id, sizeof(w->job_id));
    w->attempt = attempt;
    w->wd = wd;
    w->next = c->watches;
    c->watches = w;
    rewatch_locked(c, w); /* a restored tree has directories already */
    pthread_mutex_unlock(&c->mu);
    log_info("job %s attempt %d: its checkpoint directory is synced to kilnd as it changes", job_id, attempt);
    return 0;
}

/* Takes w out of the list and drops its inotify watch; c->mu held, w not busy. */
static void forget_locked(ckpt_sync_t *c, ckpt_watch_t *w)
{
    for (ckpt_watch_t **pp = &c->watches; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    if (w->wd >= 0)
        inotify_rm_watch(c->ifd, w->wd);
    for (int i = 0; i < w->n_subs; i++)
        inotify_rm_watch(c->ifd, w->subs[i]);
    free(w);
}

/* The attempt's watch once no sync of it is under way (NULL: not watched); c->mu held. */
static ckpt_watch_t *idle_locked(ckpt_sync_t *c, const char *job_id, int attempt)
{
    ckpt_watch_t *w = find_locked(c, job_id, attempt);
    while (w && w->busy) {
        pthread_cond_wait(&c->cv, &c->mu);
        w = find_locked(c, job_id, attempt);
    }
    return w;
}

void ckpt_sync_final(ckpt_sync_t *c, const char *job_id, int attempt)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    ckpt_watch_t *w = idle_locked(c, job_id, attempt);
    if (!w) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    w->busy = true;
    w->n_writing = 0; /* the ranks are gone: what is there is what they left */
    pthread_mutex_unlock(&c->mu);
    sync_one(c, w);
    pthread_mutex_lock(&c->mu);
    forget_locked(c, w);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void ckpt_sync_forget(ckpt_sync_t *c, const char *job_id, int attempt)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    ckpt_watch_t *w = idle_locked(c, job_id, attempt);
    if (w)
        forget_locked(c, w);
    pthread_mutex_unlock(&c->mu);
}
