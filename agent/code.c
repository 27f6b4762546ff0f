/* code.c - the agent's code cache (agent.h says what it promises): archives fetched through a
 * fetcher, checked against their digest, extracted with code/ into <dir>/<digest>/ beside a
 * manifest written last, held while jobs use them, evicted least recently used first past the
 * bound; and the working directories jobs get from a tree: a copy, or the paths of an overlay.
 * It starts no rank and knows no sandbox: the launcher calls it. */
#include "agent/agent_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "code/code.h"

#define MANIFEST_MAGIC "kiln-code-manifest 1"
#define COPY_BLOCK (1 << 20)
#define DEFAULT_MAX_BYTES ((int64_t)10 << 30)

typedef struct entry {
    char digest[KILN_SHA256_HEX];
    int64_t bytes;               /* of the extracted files */
    int refs;                    /* holds (agent_code_acquire) */
    uint64_t used;               /* the cache's clock at its last use */
    bool fetching;               /* someone is fetching it; wait on cv */
} entry_t;

struct agent_code_cache {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char dir[PATH_MAX - 128];
    int64_t max_bytes, total;
    code_limits_t lim;
    agent_code_fetch_fn fetch;
    void *ud;
    entry_t *v;
    size_t n, cap;
    uint64_t clock;
};

static bool digest_ok(const char *d)
{
    return d && kiln_sha256_hex_ok(d);
}

static void tree_path(const agent_code_cache_t *c, const char *digest, char *out, size_t n)
{
    snprintf(out, n, "%s/%s", c->dir, digest);
}

static void manifest_path(const agent_code_cache_t *c, const char *digest, char *out, size_t n)
{
    snprintf(out, n, "%s/%s.manifest", c->dir, digest);
}

/* ---- a tree's manifest --------------------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf_t;

static void sb_printf(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf_t *b, const char *fmt, ...)
{
    for (int tries = 0; tries < 2 && !b->oom; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (w < 0) {
            b->oom = true;
            return;
        }
        if (b->p && b->n + (size_t)w < b->cap) {
            b->n += (size_t)w;
            return;
        }
        size_t cap = (b->cap ? b->cap * 2 : 4096) + (size_t)w;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The entries of the open directory dfd, sorted (heap; *n of them). NULL with *n 0 when empty or
 * unreadable (*bad set for the latter). */
static char **dir_names(int dfd, size_t *n, bool *bad)
{
    *n = 0;
    int d2 = dup(dfd);
    DIR *d = d2 >= 0 ? fdopendir(d2) : NULL;
    if (!d) {
        if (d2 >= 0)
            close(d2);
        *bad = true;
        return NULL;
    }
    char **v = NULL;
    size_t cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 32;
            char **nv = realloc(v, cap * sizeof(*nv));
            if (!nv) {
                *bad = true;
                break;
            }
            v = nv;
        }
        if (!(v[*n] = strdup(de->d_name))) {
            *bad = true;
            break;
        }
        (*n)++;
    }
    closedir(d);
    if (*n)
        qsort(v, *n, sizeof(*v), name_cmp);
    return v;
}

static void names_free(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* One line per entry below dfd (rel: its path): kind, mode, size, time, path. */
static void manifest_walk(int dfd, const char *rel, sbuf_t *b, int64_t *bytes, bool *bad, int depth)
{
    size_t n = 0;
    char **names = dir_names(dfd, &n, bad);
    for (size_t i = 0; i < n && !*bad && depth < CODE_PATH_MAX; i++) {
        struct stat st;
        if (fstatat(dfd, names[i], &st, AT_SYMLINK_NOFOLLOW) != 0) {
            *bad = true;
            break;
        }
        char kind = S_ISDIR(st.st_mode) ? 'd' : S_ISREG(st.st_mode) ? 'f' : S_ISLNK(st.st_mode) ? 'l' : '?';
        sb_printf(b, "%c %o %lld %lld.%09ld %s%s%s\n", kind, (unsigned)(st.st_mode & 07777), (long long)st.st_size,
                  (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec, rel, rel[0] ? "/" : "", names[i]);
        if (kind == 'f')
            *bytes += st.st_size;
        if (kind == 'd') {
            int sub = openat(dfd, names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0) {
                *bad = true;
                break;
            }
            size_t rl = strlen(rel) + strlen(names[i]) + 2;
            char *child = malloc(rl);
            if (child) {
                snprintf(child, rl, "%s%s%s", rel, rel[0] ? "/" : "", names[i]);
                manifest_walk(sub, child, b, bytes, bad, depth + 1);
                free(child);
            } else {
                *bad = true;
            }
            close(sub);
        }
    }
    names_free(names, n);
}

/* The manifest text of the tree at path (heap, caller frees) and its files' bytes; NULL when the
 * tree cannot be read. */
static char *manifest_of(const char *path, int64_t *bytes)
{
    *bytes = 0;
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return NULL;
    sbuf_t body = {0};
    bool bad = false;
    manifest_walk(dfd, "", &body, bytes, &bad, 0);
    close(dfd);
    sbuf_t out = {0};
    sb_printf(&out, "%s %lld\n%s", MANIFEST_MAGIC, (long long)*bytes, body.p ? body.p : "");
    free(body.p);
    if (bad || body.oom || out.oom) {
        free(out.p);
        return NULL;
    }
    return out.p;
}

/* Whether the tree of digest matches its manifest; *bytes (OUT) its files' bytes. */
static bool tree_holds(const agent_code_cache_t *c, const char *digest, int64_t *bytes)
{
    char tp[PATH_MAX], mp[PATH_MAX];
    tree_path(c, digest, tp, sizeof(tp));
    manifest_path(c, digest, mp, sizeof(mp));
    char *want = NULL;
    kiln_err_t e2;
    if (kiln_file_read(mp, &want, NULL, &e2) != 0)
        return false;
    char *got = manifest_of(tp, bytes);
    bool ok = got && !strcmp(got, want);
    free(got);
    free(want);
    return ok;
}

static void tree_remove(const agent_code_cache_t *c, const char *digest)
{
    char tp[PATH_MAX], mp[PATH_MAX];
    manifest_path(c, digest, mp, sizeof(mp));
    tree_path(c, digest, tp, sizeof(tp));
    unlink(mp); /* first: a tree without its manifest is never used */
    if (code_tree_remove(tp) != 0)
        log_warn("code cache: could not remove %s completely", tp);
}

/* ---- the entries --------------------------------------------------------------------------------- */

static entry_t *find(agent_code_cache_t *c, const char *digest)
{
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->v[i].digest, digest))
            return &c->v[i];
    return NULL;
}

static entry_t *add(agent_code_cache_t *c, const char *digest)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 16;
        entry_t *v = realloc(c->v, cap * sizeof(*v));
        if (!v)
            return NULL;
        c->v = v;
        c->cap = cap;
    }
    entry_t *e = &c->v[c->n++];
    memset(e, 0, sizeof(*e));
    kiln_strlcpy(e->digest, digest, sizeof(e->digest));
    return e;
}

static void drop(agent_code_cache_t *c, entry_t *e)
{
    c->total -= e->bytes;
    *e = c->v[--c->n];
}

/* Past the bound: the least recently used trees nobody holds go. Caller holds c->mu. */
static void evict_locked(agent_code_cache_t *c)
{
    while (c->total > c->max_bytes) {
        entry_t *victim = NULL;
        for (size_t i = 0; i < c->n; i++) {
            entry_t *e = &c->v[i];
            if (!e->refs && !e->fetching && (!victim || e->used < victim->used))
                victim = e;
        }
        if (!victim) {
            log_warn("code cache: %lld MiB held by running jobs, over its bound of %lld MiB (--code-cache-mb)",
                     (long long)(c->total >> 20), (long long)(c->max_bytes >> 20));
            return;
        }
        log_info("code cache: evicting %s (%lld bytes, least recently used)", victim->digest,
                 (long long)victim->bytes);
        tree_remove(c, victim->digest);
        drop(c, victim);
    }
}

/* ---- fetching and extracting ------------------------------------------------------------------- */

static int fetch_extract(agent_code_cache_t *c, const agent_code_ref_t *ref, int64_t *bytes, kiln_err_t *err)
{
    char tmp[PATH_MAX], tp[PATH_MAX], mp[PATH_MAX], got[KILN_SHA256_HEX];
    uint32_t r = 0;
    if (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r))
        r = (uint32_t)kiln_mono_us();
    snprintf(tmp, sizeof(tmp), "%s/.fetch-%.16s-%08x.tgz", c->dir, ref->digest, r);
    tree_path(c, ref->digest, tp, sizeof(tp));
    manifest_path(c, ref->digest, mp, sizeof(mp));
    tree_remove(c, ref->digest); /* whatever an earlier try left */
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not write %s: %s", tmp, strerror(errno));
    unlink(tmp); /* the descriptor is all that is needed */
    int64_t t0 = kiln_mono_us(), size = 0;
    int rc = c->fetch(c->ud, ref, fd, err);
    if (rc == 0)
        rc = kiln_sha256_fd(fd, &size, got, err);
    if (rc == 0 && (strcmp(got, ref->digest) != 0 || (ref->size > 0 && size != ref->size))) {
        log_warn("code cache: the archive fetched for %s has SHA-256 %s and %lld bytes; refused", ref->digest, got,
                 (long long)size);
        kiln_err_set(err, KILN_ECHECKSUM, NULL, "the code archive arrived with SHA-256 %.16s... (%lld bytes), not "
                     "the %.16s... (%lld bytes) the job names; nothing of it was used", got, (long long)size,
                     ref->digest, (long long)ref->size);
        rc = KILN_ECHECKSUM;
    }
    code_stats_t st;
    if (rc == 0 && lseek(fd, 0, SEEK_SET) != 0)
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not read the fetched archive back");
    if (rc == 0)
        rc = code_archive_extract_fd(fd, tp, &c->lim, &st, err);
    close(fd);
    char *manifest = NULL;
    if (rc == 0 && !(manifest = manifest_of(tp, bytes)))
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not read back the tree extracted into %s", tp);
    if (rc == 0)
        rc = kiln_file_write_atomic_mode(mp, manifest, strlen(manifest), 0644, err);
    free(manifest);
    if (rc) {
        tree_remove(c, ref->digest);
        return rc;
    }
    log_info("code cache: %s fetched and extracted for job %s (%lld bytes archived, %lld files, %lld bytes, %.2f s)",
             ref->digest, ref->job_id ? ref->job_id : "?", (long long)size, (long long)st.files,
             (long long)*bytes, (kiln_mono_us() - t0) / 1e6);
    return 0;
}

int agent_code_acquire(agent_code_cache_t *c, const agent_code_ref_t *ref, char *tree, size_t n, kiln_err_t *err)
{
    if (!digest_ok(ref->digest))
        return kiln_err_set(err, KILN_EINVAL, "code_digest", "\"%.80s\" is not a code archive's digest",
                            ref->digest ? ref->digest : "");
    pthread_mutex_lock(&c->mu);
    for (;;) {
        entry_t *e = find(c, ref->digest);
        if (e && e->fetching) {
            pthread_cond_wait(&c->cv, &c->mu);
            continue;
        }
        if (e) {
            int64_t bytes = 0;
            if (tree_holds(c, ref->digest, &bytes)) {
                e->refs++;
                e->used = ++c->clock;
                char mp[PATH_MAX];
                manifest_path(c, ref->digest, mp, sizeof(mp));
                utimensat(AT_FDCWD, mp, NULL, 0); /* the order of use outlives the agent */
                pthread_mutex_unlock(&c->mu);
                tree_path(c, ref->digest, tree, n);
                return 0;
            }
            if (e->refs) {
                /* changed under a job that holds it: fetching it again would pull it away */
                pthread_mutex_unlock(&c->mu);
                return kiln_err_set(err, KILN_EIO, NULL, "the cached code %s changed while a job holds it",
                                    ref->digest);
            }
            log_warn("code cache: %s does not match its manifest (damaged); fetching it again", ref->digest);
            tree_remove(c, ref->digest);
            drop(c, e);
        }
        break;
    }
    entry_t *e = add(c, ref->digest);
    if (!e) {
        pthread_mutex_unlock(&c->mu);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    e->fetching = true;
    e->refs = 1;
    pthread_mutex_unlock(&c->mu);
    int64_t bytes = 0;
    int rc = fetch_extract(c, ref, &bytes, err);
    pthread_mutex_lock(&c->mu);
    e = find(c, ref->digest);
    if (rc) {
        drop(c, e);
    } else {
        e->fetching = false;
        e->bytes = bytes;
        e->used = ++c->clock;
        c->total += bytes;
        evict_locked(c);
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (rc == 0)
        tree_path(c, ref->digest, tree, n);
    return rc;
}

void agent_code_release(agent_code_cache_t *c, const char *digest)
{
    pthread_mutex_lock(&c->mu);
    entry_t *e = digest ? find(c, digest) : NULL;
    if (e && e->refs > 0) {
        e->refs--;
        evict_locked(c);
    } else {
        log_error("code cache: %.80s released without a hold (a bug)", digest ? digest : "");
    }
    pthread_mutex_unlock(&c->mu);
}

static bool held(agent_code_cache_t *c, const char *digest)
{
    pthread_mutex_lock(&c->mu);
    entry_t *e = digest_ok(digest) ? find(c, digest) : NULL;
    bool h = e && e->refs > 0 && !e->fetching;
    pthread_mutex_unlock(&c->mu);
    return h;
}

/* ---- working directories ----------------------------------------------------------------------- */

typedef struct copier {
    int64_t bytes, max;
    char *buf;
    kiln_err_t *err;
    const char *what;            /* names the source in messages */
} copier_t;

static int copy_file(copier_t *cp, int sfd, const char *name, int dfd, const struct stat *st)
{
    if (cp->max > 0 && st->st_size > cp->max - cp->bytes) {
        kiln_err_set(cp->err, KILN_ETOOBIG, "source", "%s holds more than %lld MiB", cp->what,
                     (long long)(cp->max >> 20));
        kiln_err_hint(cp->err, "upload the code as an archive (kiln code push) or point source at a smaller "
                               "directory; data belongs in data.channels");
        return KILN_ETOOBIG;
    }
    int in = openat(sfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    int out = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                     (st->st_mode & 0111) ? 0755 : 0644);
    int rc = 0;
    if (in < 0 || out < 0)
        rc = kiln_err_set(cp->err, KILN_EIO, NULL, "could not copy \"%.200s\": %s", name, strerror(errno));
    for (int64_t left = st->st_size; rc == 0 && left > 0;) {
        /* in the kernel where it can (copy_file_range), else through a buffer */
        ssize_t k = copy_file_range(in, NULL, out, NULL, (size_t)KILN_MIN(left, (int64_t)COPY_BLOCK), 0);
        if (k < 0 && (errno == EXDEV || errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP)) {
            k = read(in, cp->buf, (size_t)KILN_MIN(left, (int64_t)COPY_BLOCK));
            if (k > 0 && write(out, cp->buf, (size_t)k) != k)
                k = -1;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            rc = kiln_err_set(cp->err, KILN_EIO, NULL, "could not copy \"%.200s\": %s", name,
                              k == 0 ? "it shrank while it was copied" : strerror(errno));
        else
            left -= k;
    }
    if (rc == 0)
        cp->bytes += st->st_size;
    if (in >= 0)
        close(in);
    if (out >= 0)
        close(out);
    return rc;
}

/* Copies the entries of sfd into dfd: directories, files and links; anything else is left out. */
static int copy_dir(copier_t *cp, int sfd, int dfd, int depth)
{
    if (depth > CODE_PATH_MAX / 2)
        return kiln_err_set(cp->err, KILN_EINVAL, "source", "%s is nested too deep", cp->what);
    size_t n = 0;
    bool bad = false;
    char **names = dir_names(sfd, &n, &bad);
    int rc = bad ? kiln_err_set(cp->err, KILN_EIO, NULL, "could not read a directory of %s", cp->what) : 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        struct stat st;
        if (fstatat(sfd, names[i], &st, AT_SYMLINK_NOFOLLOW) != 0) {
            rc = kiln_err_set(cp->err, KILN_EIO, NULL, "could not read \"%.200s\": %s", names[i], strerror(errno));
        } else if (S_ISREG(st.st_mode)) {
            rc = copy_file(cp, sfd, names[i], dfd, &st);
        } else if (S_ISLNK(st.st_mode)) {
            char target[PATH_MAX];
            ssize_t k = readlinkat(sfd, names[i], target, sizeof(target) - 1);
            if (k < 0 || (target[k] = '\0', symlinkat(target, dfd, names[i]) != 0))
                rc = kiln_err_set(cp->err, KILN_EIO, NULL, "could not copy link \"%.200s\": %s", names[i],
                                  strerror(errno));
        } else if (S_ISDIR(st.st_mode)) {
            int s2 = openat(sfd, names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            int d2 = mkdirat(dfd, names[i], 0755) == 0
                         ? openat(dfd, names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                         : -1;
            rc = s2 < 0 || d2 < 0 ? kiln_err_set(cp->err, KILN_EIO, NULL, "could not copy directory \"%.200s\": %s",
                                                 names[i], strerror(errno))
                                  : copy_dir(cp, s2, d2, depth + 1);
            if (s2 >= 0)
                close(s2);
            if (d2 >= 0)
                close(d2);
        }
    }
    names_free(names, n);
    return rc;
}

/* workdir (new) as a copy of the open directory sfd. */
static int copy_tree(int sfd, const char *workdir, int64_t max, const char *what, int64_t *bytes, kiln_err_t *err)
{
    if (mkdir(workdir, 0755) != 0)
        return errno == EEXIST ? kiln_err_set(err, KILN_EEXIST, NULL, "%s exists", workdir)
                               : kiln_err_set(err, KILN_EIO, NULL, "could not create %s: %s", workdir, strerror(errno));
    copier_t cp = {.max = max, .buf = malloc(COPY_BLOCK), .err = err, .what = what};
    int dfd = open(workdir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int rc = !cp.buf ? kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory")
             : dfd < 0 ? kiln_err_set(err, KILN_EIO, NULL, "could not open %s: %s", workdir, strerror(errno))
                       : copy_dir(&cp, sfd, dfd, 0);
    if (dfd >= 0)
        close(dfd);
    free(cp.buf);
    if (rc)
        code_tree_remove(workdir);
    if (bytes)
        *bytes = cp.bytes;
    return rc;
}

int agent_code_prepare(agent_code_cache_t *c, const char *digest, const char *workdir, int64_t *bytes,
                       kiln_err_t *err)
{
    if (!held(c, digest))
        return kiln_err_set(err, KILN_ENOTFOUND, NULL, "code %.80s is not held in the cache", digest ? digest : "");
    char tp[PATH_MAX], what[100];
    tree_path(c, digest, tp, sizeof(tp));
    snprintf(what, sizeof(what), "code %.16s...", digest);
    int sfd = open(tp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sfd < 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not open %s: %s", tp, strerror(errno));
    int rc = copy_tree(sfd, workdir, 0, what, bytes, err);
    close(sfd);
    return rc;
}

int agent_code_overlay(agent_code_cache_t *c, const char *digest, const char *job_dir, char *lower, char *upper,
                       char *work, size_t n, kiln_err_t *err)
{
    if (!held(c, digest))
        return kiln_err_set(err, KILN_ENOTFOUND, NULL, "code %.80s is not held in the cache", digest ? digest : "");
    tree_path(c, digest, lower, n);
    snprintf(upper, n, "%s/code-upper", job_dir);
    snprintf(work, n, "%s/code-work", job_dir);
    /* fresh: a retried attempt starts from the code as uploaded */
    code_tree_remove(upper);
    code_tree_remove(work);
    int rc = kiln_mkdirs_mode(upper, 0755, err);
    if (rc == 0)
        rc = kiln_mkdirs_mode(work, 0755, err);
    return rc;
}

int agent_code_copy_dir(const char *src, const char *const *roots, size_t nroots, int64_t max_bytes,
                        const char *workdir, int64_t *bytes, kiln_err_t *err)
{
    char real[PATH_MAX];
    bool exists = false;
    int rc = kiln_path_confine(src, "source", roots, nroots, real, sizeof(real), &exists, err);
    if (rc)
        return rc;
    int sfd = exists ? open(real, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (sfd < 0) {
        kiln_err_set(err, KILN_ENOTFOUND, "source", "source %.200s is not a directory the agent can read", src);
        return KILN_ENOTFOUND;
    }
    char what[PATH_MAX + 16];
    snprintf(what, sizeof(what), "source %.200s", src);
    rc = copy_tree(sfd, workdir, max_bytes > 0 ? max_bytes : DEFAULT_MAX_BYTES, what, bytes, err);
    close(sfd);
    return rc;
}

/* ---- the cache ----------------------------------------------------------------------------------- */

typedef struct found {
    char digest[KILN_SHA256_HEX];
    int64_t bytes;
    struct timespec used;
} found_t;

static int found_cmp(const void *a, const void *b)
{
    const found_t *x = a, *y = b;
    if (x->used.tv_sec != y->used.tv_sec)
        return x->used.tv_sec < y->used.tv_sec ? -1 : 1;
    return x->used.tv_nsec < y->used.tv_nsec ? -1 : x->used.tv_nsec > y->used.tv_nsec;
}

/* At start: the trees an earlier agent left whose manifests hold, in their order of use; the rest
 * of the directory (half-written trees, fetches) goes. */
static void cache_load(agent_code_cache_t *c)
{
    int dfd = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    size_t n = 0;
    bool bad = false;
    char **names = dfd >= 0 ? dir_names(dfd, &n, &bad) : NULL;
    found_t *f = calloc(n ? n : 1, sizeof(*f));
    size_t nf = 0;
    for (size_t i = 0; i < n && f; i++) {
        const char *nm = names[i];
        size_t l = strlen(nm);
        bool manifest = l == 64 + 9 && !strcmp(nm + 64, ".manifest");
        bool tree = l == 64 && digest_ok(nm);
        char d[KILN_SHA256_HEX];
        kiln_strlcpy(d, nm, sizeof(d));
        if (tree) {
            char mp[PATH_MAX];
            manifest_path(c, d, mp, sizeof(mp));
            if (access(mp, F_OK) == 0)
                continue; /* judged with its manifest */
        }
        struct stat st;
        if (manifest && digest_ok(d) && tree_holds(c, d, &f[nf].bytes) && fstatat(dfd, nm, &st, 0) == 0) {
            kiln_strlcpy(f[nf].digest, d, sizeof(f[nf].digest));
            f[nf].used = st.st_mtim;
            nf++;
            continue;
        }
        char p[PATH_MAX];
        snprintf(p, sizeof(p), "%s/%s", c->dir, nm);
        log_info("code cache: removing %s (%s)", p, manifest ? "its tree does not match it" : "left unfinished");
        if (manifest && digest_ok(d))
            tree_remove(c, d);
        else
            code_tree_remove(p);
    }
    if (f && nf)
        qsort(f, nf, sizeof(*f), found_cmp);
    for (size_t i = 0; i < nf; i++) {
        entry_t *e = add(c, f[i].digest);
        if (!e)
            break;
        e->bytes = f[i].bytes;
        e->used = ++c->clock;
        c->total += e->bytes;
    }
    if (nf)
        log_info("code cache: %zu tree(s), %lld bytes, kept from before", nf, (long long)c->total);
    free(f);
    names_free(names, n);
    if (dfd >= 0)
        close(dfd);
    evict_locked(c);
}

int agent_code_cache_create(const char *dir, int64_t max_bytes, agent_code_fetch_fn fetch, void *ud,
                            agent_code_cache_t **out, kiln_err_t *err)
{
    *out = NULL;
    agent_code_cache_t *c = calloc(1, sizeof(*c));
    if (!c)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    if (strlen(dir) >= sizeof(c->dir)) {
        free(c);
        return kiln_err_set(err, KILN_EINVAL, NULL, "the code cache's path is too long");
    }
    int rc = kiln_mkdirs_mode(dir, 0755, err);
    if (rc) {
        free(c);
        return rc;
    }
    kiln_strlcpy(c->dir, dir, sizeof(c->dir));
    c->max_bytes = max_bytes > 0 ? max_bytes : DEFAULT_MAX_BYTES;
    /* a tree may fill the whole cache, no more (kilnd bounds the archives themselves) */
    code_limits_default(&c->lim, c->max_bytes / 10);
    c->fetch = fetch;
    c->ud = ud;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    cache_load(c);
    *out = c;
    return 0;
}

void agent_code_cache_destroy(agent_code_cache_t *c)
{
    if (!c)
        return;
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->v);
    free(c);
}
