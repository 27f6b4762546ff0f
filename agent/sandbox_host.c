/* sandbox_host.c - what a box of the ranks' sandbox holds of the host: its cgroup (cgroup v2, else
 * v1's memory and pids hierarchies; detected, never assumed) with its memory and task limits,
 * killing everything in it and whether the OOM killer struck; its uid, claimed host-wide; and the
 * files given to that uid, recorded in the claim and given back. It starts no process and knows
 * nothing about namespaces (sandbox.c). */
#include "agent/agent_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define CG_BASE_NAME "kiln-sandbox"
#define CG_AGENT_LEAF "kiln-agent"
#define CHOWN_DEPTH 64           /* directory levels a give or take-back walks, at most */

/* Reads a small control file into buf (NUL-terminated, cut at n - 1). Returns bytes read or -1. */
static ssize_t cg_read(const char *path, char *buf, size_t n)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t got = 0;
    while (got + 1 < n) {
        ssize_t r = read(fd, buf + got, n - 1 - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    return (ssize_t)got;
}

/* Writes text to a control file (created when missing, so that a tree of plain files stands in for
 * cgroupfs in tests). Returns 0 or the errno. */
static int cg_write(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return errno;
    size_t len = strlen(text);
    ssize_t w;
    do
        w = write(fd, text, len);
    while (w < 0 && errno == EINTR);
    int e = w == (ssize_t)len ? 0 : (w < 0 ? errno : EIO);
    close(fd);
    return e;
}

/* Whether the space-separated list holds word. */
static bool words_have(const char *list, const char *word)
{
    size_t wl = strlen(word);
    for (const char *p = list; *p;) {
        while (*p == ' ' || *p == '\n' || *p == '\t')
            p++;
        const char *q = p;
        while (*q && *q != ' ' && *q != '\n' && *q != '\t')
            q++;
        if ((size_t)(q - p) == wl && !strncmp(p, word, wl))
            return true;
        p = q;
    }
    return false;
}

/* The path of hierarchy `want` in /proc/self/cgroup text: the line whose controllers (comma
 * separated) hold want, or with want "" the v2 line ("0::/path"). Copies the path into path and
 * the line's controller list into ctrls. */
static bool self_path(const char *text, const char *want, char *ctrls, size_t cn, char *path, size_t pn)
{
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        const char *c1 = memchr(line, ':', len);
        const char *c2 = c1 ? memchr(c1 + 1, ':', len - (size_t)(c1 + 1 - line)) : NULL;
        if (c2) {
            size_t clen = (size_t)(c2 - c1 - 1);
            bool hit = false;
            if (!want[0]) {
                hit = clen == 0 && c1 - line == 1 && line[0] == '0';
            } else {
                for (const char *p = c1 + 1; p < c2;) {
                    const char *q = memchr(p, ',', (size_t)(c2 - p));
                    if (!q)
                        q = c2;
                    if ((size_t)(q - p) == strlen(want) && !strncmp(p, want, strlen(want)))
                        hit = true;
                    p = q + 1;
                }
            }
            if (hit) {
                snprintf(ctrls, cn, "%.*s", (int)clen, c1 + 1);
                snprintf(path, pn, "%.*s", (int)(len - (size_t)(c2 + 1 - line)), c2 + 1);
                return true;
            }
        }
        line = end ? end + 1 : NULL;
    }
    return false;
}

/* "/a/b" without a trailing "/kiln-agent" (the leaf an earlier agent of this cgroup moved into);
 * "/" stays "/". */
static void strip_leaf(char *path)
{
    size_t n = strlen(path), ln = strlen("/" CG_AGENT_LEAF);
    if (n >= ln && !strcmp(path + n - ln, "/" CG_AGENT_LEAF))
        path[n - ln] = '\0';
    n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        path[--n] = '\0';
    if (!strcmp(path, "/"))
        path[0] = '\0';
}

int sandbox_cg_detect(const char *root, const char *self_cgroup, sandbox_cg_t *out, kiln_err_t *err)
{
    memset(out, 0, sizeof(*out));
    char path[512], ctrls[128], buf[1024];
    snprintf(path, sizeof(path), "%s/cgroup.controllers", root);
    bool unified = cg_read(path, buf, sizeof(buf)) >= 0;
    if (unified && words_have(buf, "memory") && words_have(buf, "pids")) {
        char own[384];
        if (!self_path(self_cgroup, "", ctrls, sizeof(ctrls), own, sizeof(own)))
            return kiln_err_set(err, KILN_EUNSUPP, NULL, "cgroup v2 is mounted at %s but this process's cgroup "
                                "(/proc/self/cgroup) has no v2 line", root);
        strip_leaf(own);
        snprintf(path, sizeof(path), "%s%s/cgroup.controllers", root, own);
        if (cg_read(path, buf, sizeof(buf)) < 0 || !words_have(buf, "memory") || !words_have(buf, "pids")) {
            kiln_err_set(err, KILN_EUNSUPP, NULL, "the cgroup kiln-agent runs in (%s) does not have the memory and "
                         "pids controllers", own[0] ? own : "/");
            kiln_err_hint(err, "delegate them to the agent's cgroup (systemd: Delegate=yes in its unit)");
            return KILN_EUNSUPP;
        }
        out->version = 2;
        snprintf(out->base[0], sizeof(out->base[0]), "%s%s/" CG_BASE_NAME, root, own);
        snprintf(out->agent_leaf, sizeof(out->agent_leaf), "%s%s/" CG_AGENT_LEAF, root, own);
        return 0;
    }
    static const char *const want[2] = {"memory", "pids"};
    for (int i = 0; i < 2; i++) {
        char own[384];
        if (!self_path(self_cgroup, want[i], ctrls, sizeof(ctrls), own, sizeof(own))) {
            kiln_err_set(err, KILN_EUNSUPP, NULL, "no cgroup hierarchy with the memory and pids controllers: "
                         "%s has %s, and /proc/self/cgroup names no v1 %s hierarchy", root,
                         unified ? "cgroup v2 without them" : "no cgroup v2", want[i]);
            kiln_err_hint(err, "mount cgroup v2 with the memory and pids controllers (or v1's memory and pids)");
            return KILN_EUNSUPP;
        }
        strip_leaf(own);
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s%s", root, ctrls, own);
        if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
            /* co-mounted controllers may be mounted under the single controller's name */
            snprintf(path, sizeof(path), "%s/%s%s", root, want[i], own);
            if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
                return kiln_err_set(err, KILN_EUNSUPP, NULL, "the cgroup v1 %s hierarchy is not mounted at %s/%s",
                                    want[i], root, ctrls);
        }
        if (snprintf(out->base[i], sizeof(out->base[i]), "%s/" CG_BASE_NAME, path) >= (int)sizeof(out->base[i]))
            return kiln_err_set(err, KILN_EUNSUPP, NULL, "the cgroup path %s is too long", path);
    }
    out->version = 1;
    return 0;
}

static int cg_mkdir(const char *dir, kiln_err_t *err)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return kiln_err_set(err, KILN_EIO, NULL, "could not create cgroup %s: %s", dir, strerror(errno));
    return 0;
}

int sandbox_cg_setup(const sandbox_cg_t *cg, kiln_err_t *err)
{
    int rc, e;
    char path[600];
    if (cg->version == 1) {
        for (int i = 0; i < 2; i++)
            if ((rc = cg_mkdir(cg->base[i], err)) != 0)
                return rc;
        return 0;
    }
    /* v2: a cgroup that enables controllers for its children may hold no process itself, so the
     * agent moves into a leaf beside the boxes' base first. */
    if ((rc = cg_mkdir(cg->agent_leaf, err)) != 0)
        return rc;
    snprintf(path, sizeof(path), "%s/cgroup.procs", cg->agent_leaf);
    if ((e = cg_write(path, "0")) != 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not move kiln-agent into cgroup %s: %s", cg->agent_leaf,
                            strerror(e));
    char own[512];
    snprintf(own, sizeof(own), "%s", cg->base[0]);
    *strrchr(own, '/') = '\0';
    snprintf(path, sizeof(path), "%s/cgroup.subtree_control", own);
    if ((e = cg_write(path, "+memory +pids")) != 0) {
        kiln_err_set(err, KILN_EIO, NULL, "could not enable the memory and pids controllers in %s: %s", path,
                     strerror(e));
        if (e == EBUSY)
            kiln_err_hint(err, "another process shares kiln-agent's cgroup; run the agent in a cgroup of its own");
        return KILN_EIO;
    }
    if ((rc = cg_mkdir(cg->base[0], err)) != 0)
        return rc;
    snprintf(path, sizeof(path), "%s/cgroup.subtree_control", cg->base[0]);
    if ((e = cg_write(path, "+memory +pids")) != 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not enable the memory and pids controllers in %s: %s", path,
                            strerror(e));
    return 0;
}

static int cg_set(const char *dir, const char *file, const char *value, bool optional, kiln_err_t *err)
{
    char path[640];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    if (optional && access(path, F_OK) != 0)
        return 0;
    int e = cg_write(path, value);
    if (e && !optional)
        return kiln_err_set(err, KILN_EIO, NULL, "could not write %s: %s", path, strerror(e));
    return 0;
}

int sandbox_cgbox_create(const sandbox_cg_t *cg, const char *name, int64_t memory_bytes, int64_t pids_max,
                         sandbox_cgbox_t *out, kiln_err_t *err)
{
    memset(out, 0, sizeof(*out));
    out->version = cg->version;
    out->procs_fd[0] = out->procs_fd[1] = -1;
    int n = cg->version == 1 ? 2 : 1;
    for (int i = 0; i < n; i++)
        snprintf(out->dir[i], sizeof(out->dir[i]), "%s/%s", cg->base[i], name);
    /* a box of a killed agent, whose uid (the name) is ours now */
    struct stat st;
    for (int i = 0; i < n; i++)
        if (stat(out->dir[i], &st) == 0) {
            log_warn("sandbox: removing cgroup %s, left by an agent that did not end cleanly", out->dir[i]);
            sandbox_cgbox_kill(out, 2000);
            rmdir(out->dir[i]);
        }
    int rc = 0;
    char mem[32], pids[32];
    if (memory_bytes > 0)
        snprintf(mem, sizeof(mem), "%" PRId64, memory_bytes);
    else
        snprintf(mem, sizeof(mem), "%s", cg->version == 2 ? "max" : "-1");
    if (pids_max > 0)
        snprintf(pids, sizeof(pids), "%" PRId64, pids_max);
    else
        snprintf(pids, sizeof(pids), "max");
    for (int i = 0; i < n && rc == 0; i++)
        rc = cg_mkdir(out->dir[i], err);
    if (rc == 0 && cg->version == 2) {
        rc = cg_set(out->dir[0], "memory.max", mem, false, err);
        if (rc == 0 && memory_bytes > 0) /* the limit holds in RAM: the box does not swap past it */
            rc = cg_set(out->dir[0], "memory.swap.max", "0", true, err);
        if (rc == 0)
            rc = cg_set(out->dir[0], "pids.max", pids, false, err);
    } else if (rc == 0) {
        rc = cg_set(out->dir[0], "memory.limit_in_bytes", mem, false, err);
        if (rc == 0 && memory_bytes > 0) /* where swap is accounted, memory + swap stays within it */
            rc = cg_set(out->dir[0], "memory.memsw.limit_in_bytes", mem, true, err);
        if (rc == 0)
            rc = cg_set(out->dir[1], "pids.max", pids, false, err);
    }
    for (int i = 0; i < n && rc == 0; i++) {
        char path[640];
        snprintf(path, sizeof(path), "%s/cgroup.procs", out->dir[i]);
        if ((out->procs_fd[i] = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644)) < 0)
            rc = kiln_err_set(err, KILN_EIO, NULL, "could not open %s: %s", path, strerror(errno));
    }
    if (rc != 0)
        sandbox_cgbox_destroy(out);
    return rc;
}

/* SIGKILL to each pid listed in dir/cgroup.procs; the count of pids listed. */
static int cg_kill_listed(const char *dir)
{
    char path[640], buf[8192];
    snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
    if (cg_read(path, buf, sizeof(buf)) <= 0)
        return 0;
    int n = 0;
    for (char *p = buf; *p;) {
        char *end;
        long pid = strtol(p, &end, 10);
        if (end == p)
            break;
        /* never 0, -1 or 1: kill() would take them as a group, everyone, or init */
        if (pid > 1) {
            kill((pid_t)pid, SIGKILL);
            n++;
        }
        p = end;
        while (*p == '\n' || *p == ' ')
            p++;
    }
    return n;
}

bool sandbox_cgbox_kill(sandbox_cgbox_t *b, int wait_ms)
{
    int n = b->version == 1 ? 2 : 1;
    char path[640];
    if (b->version == 2 && b->dir[0][0]) {
        snprintf(path, sizeof(path), "%s/cgroup.kill", b->dir[0]);
        if (access(path, F_OK) == 0)
            cg_write(path, "1");
    }
    int64_t deadline = kiln_mono_us() + (int64_t)wait_ms * 1000;
    for (;;) {
        int left = 0;
        for (int i = 0; i < n; i++)
            if (b->dir[i][0])
                left += cg_kill_listed(b->dir[i]);
        if (left == 0)
            return true;
        if (kiln_mono_us() >= deadline)
            return false;
        usleep(1000);
    }
}

/* The value of "key N" in a flat-keyed control file, or -1. */
static int64_t cg_key(const char *path, const char *key)
{
    char buf[2048];
    if (cg_read(path, buf, sizeof(buf)) < 0)
        return -1;
    size_t kl = strlen(key);
    for (char *line = buf; line && *line;) {
        if (!strncmp(line, key, kl) && line[kl] == ' ')
            return strtoll(line + kl + 1, NULL, 10);
        line = strchr(line, '\n');
        if (line)
            line++;
    }
    return -1;
}

bool sandbox_cgbox_oom(const sandbox_cgbox_t *b)
{
    char path[640];
    if (!b->dir[0][0])
        return false;
    if (b->version == 2) {
        snprintf(path, sizeof(path), "%s/memory.events", b->dir[0]);
        return cg_key(path, "oom_kill") > 0;
    }
    snprintf(path, sizeof(path), "%s/memory.oom_control", b->dir[0]);
    int64_t kills = cg_key(path, "oom_kill");
    if (kills >= 0)
        return kills > 0;
    /* kernels before 4.13 do not count kills: the limit was hit at least */
    char buf[64];
    snprintf(path, sizeof(path), "%s/memory.failcnt", b->dir[0]);
    return cg_read(path, buf, sizeof(buf)) > 0 && strtoll(buf, NULL, 10) > 0;
}

void sandbox_cgbox_destroy(sandbox_cgbox_t *b)
{
    if (!b->version)
        return;
    bool empty = sandbox_cgbox_kill(b, 5000);
    for (int i = 0; i < 2; i++) {
        if (b->procs_fd[i] >= 0)
            close(b->procs_fd[i]);
        b->procs_fd[i] = -1;
        if (!b->dir[i][0])
            continue;
        /* the last tasks leave the cgroup a moment after they are reaped */
        int tries = 0;
        while (rmdir(b->dir[i]) != 0 && errno == EBUSY && tries++ < 200)
            usleep(1000);
        if (access(b->dir[i], F_OK) == 0)
            log_warn("sandbox: could not remove cgroup %s%s", b->dir[i], empty ? "" : " (processes are left in it)");
        b->dir[i][0] = '\0';
    }
    b->version = 0;
}

void sandbox_cg_each_box(const sandbox_cg_t *cg, void (*fn)(void *ud, uint32_t uid), void *ud)
{
    /* v1: a box's pids cgroup may outlive its memory one (a removal cut short), so both are read;
     * a uid with a directory in the first is not reported again for the second */
    for (int i = 0; i < (cg->version == 1 ? 2 : 1); i++) {
        DIR *d = opendir(cg->base[i]);
        if (!d)
            continue;
        struct dirent *e;
        while ((e = readdir(d))) {
            char *end, path[PATH_MAX];
            struct stat st;
            if (e->d_name[0] != 'u' || e->d_name[1] < '0' || e->d_name[1] > '9')
                continue;
            unsigned long long uid = strtoull(e->d_name + 1, &end, 10);
            if (*end != '\0' || uid == 0 || uid > UINT32_MAX)
                continue;
            snprintf(path, sizeof(path), "%s/%s", cg->base[0], e->d_name);
            if (i == 0 || stat(path, &st) != 0)
                fn(ud, (uint32_t)uid);
        }
        closedir(d);
    }
}

/* ---- uids and the files given to them ------------------------------------------------------- */

typedef struct chown_walk {
    const sandbox_ids_t *ids;
    bool give;                   /* to `to` (entries the agent or the range owns); else back to the agent */
    uid_t to, from;
    gid_t gto;
    dev_t dev;
    char top[PATH_MAX];
} chown_walk_t;

static bool walk_takes(const chown_walk_t *w, uid_t owner)
{
    if (!w->give)
        return owner == w->from;
    return owner == w->ids->agent_uid || (owner >= w->ids->lo && owner <= w->ids->hi);
}

/* Walks the directory dfd (taking ownership of it): entries of the same file system, never
 * through a symbolic link. Closes dfd. Returns 0 or -1 with errno. */
static int walk_dir(chown_walk_t *w, int dfd, int depth)
{
    struct stat st;
    int rc = 0;
    if (fstat(dfd, &st) != 0) {
        close(dfd);
        return -1;
    }
    if (walk_takes(w, st.st_uid) && fchown(dfd, w->to, w->gto) != 0) {
        close(dfd);
        return -1;
    }
    if (depth >= CHOWN_DEPTH) {
        close(dfd);
        errno = ELOOP;
        return -1;
    }
    int lfd = dup(dfd);
    DIR *d = lfd >= 0 ? fdopendir(lfd) : NULL;
    if (!d) {
        if (lfd >= 0)
            close(lfd);
        close(dfd);
        return -1;
    }
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_dev != w->dev)
            continue;
        if (S_ISDIR(st.st_mode)) {
            int cfd = openat(dfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (cfd >= 0)
                rc = walk_dir(w, cfd, depth + 1);
            continue;
        }
        if (!walk_takes(w, st.st_uid))
            continue;
        /* a second name of a file the agent owns is not the job's to take */
        if (w->give && S_ISREG(st.st_mode) && st.st_nlink > 1 && st.st_uid == w->ids->agent_uid)
            continue;
        if (fchownat(dfd, e->d_name, w->to, w->gto, AT_SYMLINK_NOFOLLOW) != 0 && errno != ENOENT)
            rc = -1;
    }
    closedir(d);
    close(dfd);
    return rc;
}

/* Chowns path (recursive: and what is below) as w says. Returns 0 or -1 with errno. */
static int walk_path(chown_walk_t *w, const char *path, bool recursive)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return -1;
    if (S_ISLNK(st.st_mode)) {
        errno = ELOOP;
        return -1;
    }
    w->dev = st.st_dev;
    if (!S_ISDIR(st.st_mode) || !recursive)
        return walk_takes(w, st.st_uid) ? lchown(path, w->to, w->gto) : 0;
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    return dfd < 0 ? -1 : walk_dir(w, dfd, 0);
}

void sandbox_uid_take_back(const sandbox_ids_t *ids, int fd, uint32_t uid)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size <= 0 || st.st_size > (1 << 20))
        goto done;
    char *text = malloc((size_t)st.st_size + 1);
    if (!text)
        goto done;
    ssize_t n = pread(fd, text, (size_t)st.st_size, 0);
    text[n > 0 ? n : 0] = '\0';
    for (char *line = text; line && *line;) {
        char *end = strchr(line, '\n');
        if (end)
            *end = '\0';
        if ((line[0] == 'R' || line[0] == 'F') && line[1] == ' ' && line[2] == '/') {
            chown_walk_t w = {.ids = ids, .give = false, .to = ids->agent_uid, .gto = ids->agent_gid, .from = uid};
            if (walk_path(&w, line + 2, line[0] == 'R') != 0 && errno != ENOENT)
                log_warn("sandbox: could not give %s back from uid %u: %s", line + 2, uid, strerror(errno));
        }
        line = end ? end + 1 : NULL;
    }
    free(text);
done:
    if (ftruncate(fd, 0) != 0)
        log_warn("sandbox: could not empty the claim of uid %u: %s", uid, strerror(errno));
}

int sandbox_uid_claim(const sandbox_ids_t *ids, uint32_t uid)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/uid-%u", ids->state_dir, uid);
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);
        return -1;
    }
    sandbox_uid_take_back(ids, fd, uid);
    return fd;
}

int sandbox_uid_give(const sandbox_ids_t *ids, int claim, uint32_t uid, const char *path, bool recursive,
                     kiln_err_t *err)
{
    char line[PATH_MAX + 4];
    int n = snprintf(line, sizeof(line), "%c %s\n", recursive ? 'R' : 'F', path);
    if (n >= (int)sizeof(line) || strchr(path, '\n'))
        return kiln_err_set(err, KILN_EINVAL, NULL, "path \"%.120s\" cannot be given to the sandbox", path);
    /* recorded first: an agent killed halfway leaves the record for the next one */
    if (lseek(claim, 0, SEEK_END) < 0 || write(claim, line, (size_t)n) != n)
        return kiln_err_set(err, KILN_EIO, NULL, "could not record the sandbox's claim on %s: %s", path,
                            strerror(errno));
    chown_walk_t w = {.ids = ids, .give = true, .to = uid, .gto = uid};
    if (walk_path(&w, path, recursive) != 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not give %s to the sandbox's uid %u: %s", path, uid,
                            strerror(errno));
    return 0;
}
