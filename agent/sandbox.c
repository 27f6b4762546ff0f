/* sandbox.c - the sandbox every rank runs in (agent_int.h, docs/security.md): per attempt a box
 * with its own unprivileged uid (claimed host-wide through lock files), cgroup (sandbox_host.c),
 * PID namespace (a small init reaps orphans, so the ranks themselves are never pid 1) and mount
 * namespace (a tmpfs root holding only what the box may see), and the spawn that starts a process
 * in it, or unconfined for --sandbox off. It does not decide what a rank may see: the launcher
 * passes the box's mounts. Between fork and exec only async-signal-safe calls are made: whatever
 * the children need is prepared before the fork. */
#include "agent/agent_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif

extern char **environ;

#define SB_INIT_WAIT_MS 10000    /* how long a destroyed box may take to empty */

struct sandbox {
    char *state_dir, *stage_dir;
    sandbox_ids_t ids;           /* the agent's uid, the range, the claims (in state_dir) */
    int64_t mem_slot_mb, pids_slot, tmp_mb;
    sandbox_cg_t cg;
    int host_pidns_fd;           /* the agent's PID namespace, to return to after each fork */
    bool ro_recursive;           /* mount_setattr(AT_RECURSIVE) works: read-only covers submounts */
    int cap_last;                /* /proc/sys/kernel/cap_last_cap */
    char **ro_paths;
    size_t n_ro_paths;
    pthread_mutex_t mu;          /* next_uid */
    uint32_t next_uid;
    char describe[400];
};

struct sandbox_box {
    sandbox_t *s;
    char name[128];
    uint32_t uid;
    int claim_fd;                /* <state>/uid-<uid>, flock'ed; its lines: the paths given */
    sandbox_cgbox_t cg;
    pid_t init_pid;              /* -1: none */
    int pidns_fd, mntns_fd;
    int64_t memory_mb;
};

/* ---- what a child reports when a step fails -------------------------------------------------- */

enum {
    ST_PDEATH = 1, ST_CGROUP, ST_UNSHARE, ST_PRIVATE, ST_STAGE, ST_MKDIR, ST_MOUNT, ST_READONLY, ST_WRITE,
    ST_LINK, ST_PIVOT, ST_CHDIR, ST_SETNS, ST_FDS, ST_RLIMIT, ST_PRIVS, ST_EXEC, ST_ROOT_RO,
};

static const char *stage_name(int st)
{
    switch (st) {
    case ST_PDEATH: return "watch the agent";
    case ST_CGROUP: return "join the box's cgroup";
    case ST_UNSHARE: return "make a mount namespace";
    case ST_PRIVATE: return "make its mounts private";
    case ST_STAGE: return "mount the root tmpfs";
    case ST_MKDIR: return "make a mount point";
    case ST_MOUNT: return "mount";
    case ST_READONLY: return "make a mount read-only";
    case ST_WRITE: return "write a file";
    case ST_LINK: return "make a symbolic link";
    case ST_PIVOT: return "pivot_root";
    case ST_CHDIR: return "enter the working directory";
    case ST_SETNS: return "enter the box's mount namespace";
    case ST_FDS: return "set up descriptors";
    case ST_RLIMIT: return "set limits";
    case ST_PRIVS: return "drop privileges";
    case ST_EXEC: return "exec";
    case ST_ROOT_RO: return "make the root read-only";
    default: return "start";
    }
}

typedef struct child_report {
    int stage, err, op;          /* op: the plan entry a box's init failed at, or -1 */
} child_report_t;

/* In a child: tells the parent which step failed, then exits. */
static void child_fail(int fd, int stage, int op)
{
    child_report_t r = {stage, errno, op};
    ssize_t w = write(fd, &r, sizeof(r));
    (void)w;
    _exit(127);
}

/* The parent's side: reads the child's report from fd. 1: the child reported a failure into *r;
 * 0: it reported success; -1: end of file (a spawned child exec'd; a box's init died). */
static int report_read(int fd, child_report_t *r)
{
    ssize_t n;
    do
        n = read(fd, r, sizeof(*r));
    while (n < 0 && errno == EINTR);
    if (n == (ssize_t)sizeof(*r))
        return r->stage != 0;
    r->stage = 0;
    r->err = 0;
    r->op = -1;
    return -1;
}

/* In a child: it gets SIGKILL when the thread that forked it ends, unless that happened already
 * (its parent is no longer `parent`; 0 is a parent outside the child's PID namespace); then it
 * joins the box's cgroup (procs_fd: cgroup.procs per hierarchy, -1 unused; NULL: none). */
static void child_start(int fd, pid_t parent, const int *procs_fd)
{
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
        child_fail(fd, ST_PDEATH, -1);
    for (int i = 0; procs_fd && i < 2; i++)
        if (procs_fd[i] >= 0 && pwrite(procs_fd[i], "0", 1, 0) != 1)
            child_fail(fd, ST_CGROUP, -1);
}

/* In a child: becomes uid, with gid uid and no supplementary groups, and can never gain a
 * privilege again (no_new_privs). The kernel clears the parent-death signal when the effective
 * uid changes, so it is set again here: without it a box (and its ranks) would outlive a killed
 * agent and go on training beside the job's next attempt. parent as for child_start. */
static void child_become(int fd, uint32_t uid, pid_t parent)
{
    if (setgroups(0, NULL) != 0 || setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0 ||
        prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || geteuid() != uid || getegid() != uid)
        child_fail(fd, ST_PRIVS, -1);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
        child_fail(fd, ST_PDEATH, -1);
}

/* ---- the box's root: a plan made before the fork, carried out by the box's init -------------- */

typedef enum { OP_BIND, OP_LINK, OP_TMPFS, OP_PROC, OP_FILE } op_kind_t;

enum {
    OPF_RW = 1,                  /* writable */
    OPF_DEV = 2,                 /* device nodes work through it */
    OPF_FLAT = 4,                /* not recursive: submounts of the source stay out */
    OPF_DIR = 8,                 /* the source is a directory */
    OPF_EXEC = 16,               /* tmpfs: programs may run from it */
};

typedef struct op {
    op_kind_t kind;
    char *src;                   /* bind: host path; link: its target; tmpfs: options; file: contents */
    char *dst;                   /* under the stage */
    unsigned flags;
} op_t;

typedef struct plan {
    op_t *v;
    size_t n, cap;
    bool oom;
} plan_t;

static void plan_add(plan_t *p, op_kind_t kind, const char *src, const char *stage, const char *dst, unsigned flags)
{
    if (p->n == p->cap) {
        size_t nc = p->cap ? 2 * p->cap : 64;
        op_t *nv = realloc(p->v, nc * sizeof(*nv));
        if (!nv) {
            p->oom = true;
            return;
        }
        p->v = nv;
        p->cap = nc;
    }
    op_t *o = &p->v[p->n];
    o->kind = kind;
    o->flags = flags;
    o->src = src ? strdup(src) : NULL;
    size_t len = strlen(stage) + strlen(dst) + 1;
    o->dst = malloc(len);
    if ((src && !o->src) || !o->dst) {
        free(o->src);
        free(o->dst);
        p->oom = true;
        return;
    }
    snprintf(o->dst, len, "%s%s", stage, dst);
    p->n++;
}

static void plan_free(plan_t *p)
{
    for (size_t i = 0; i < p->n; i++) {
        free(p->v[i].src);
        free(p->v[i].dst);
    }
    free(p->v);
    memset(p, 0, sizeof(*p));
}

/* A host path for the box: a symbolic link at the top of the tree (Debian's /bin -> usr/bin) is
 * made again as a link; a directory or file is bound. Missing: false. */
static bool plan_host(plan_t *p, const char *stage, const char *path, unsigned flags)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return false;
    if (S_ISLNK(st.st_mode) && strchr(path + 1, '/') == NULL) {
        char target[PATH_MAX];
        ssize_t n = readlink(path, target, sizeof(target) - 1);
        if (n <= 0)
            return false;
        target[n] = '\0';
        plan_add(p, OP_LINK, target, stage, path, 0);
        return true;
    }
    if (stat(path, &st) != 0)
        return false;
    plan_add(p, OP_BIND, path, stage, path, flags | (S_ISDIR(st.st_mode) ? OPF_DIR : 0));
    return true;
}

/* What every box sees of the host, read-only: the system's programs and libraries, the parts of
 * /etc that the C library, Python and TLS read, and /sys without its submounts (no cgroup tree). */
static const char *const k_system[] = {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"};
static const char *const k_etc[] = {
    "alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ssl", "ca-certificates",
    "ca-certificates.conf", "pki", "hosts", "host.conf", "resolv.conf", "nsswitch.conf", "gai.conf",
    "protocols", "services", "localtime", "timezone", "mime.types", "os-release", "debian_version",
    "fonts", "matplotlibrc", "nccl.conf", "OpenCL", "mpi",
};
static const char *const k_devices[] = {"null", "zero", "full", "random", "urandom", "tty"};

/* The whole root of a box with uid: system, /etc (and a passwd and group naming the box's user,
 * so getpwuid works), the operator's extra paths, /proc, /dev, /tmp, then the spec's mounts. */
static int plan_build(const sandbox_t *s, const sandbox_box_spec_t *spec, uint32_t uid, plan_t *p, kiln_err_t *err)
{
    const char *stage = s->stage_dir;
    unsigned ro = s->ro_recursive ? 0 : OPF_FLAT;
    char buf[512];
    for (size_t i = 0; i < KILN_ARRAY_LEN(k_system); i++)
        plan_host(p, stage, k_system[i], ro);
    for (size_t i = 0; i < KILN_ARRAY_LEN(k_etc); i++) {
        snprintf(buf, sizeof(buf), "/etc/%s", k_etc[i]);
        struct stat st;
        if (stat(buf, &st) == 0) /* through links: /etc/resolv.conf often is one */
            plan_add(p, OP_BIND, buf, stage, buf, ro | (S_ISDIR(st.st_mode) ? OPF_DIR : 0));
    }
    /* /etc/python3, /etc/python3.11, ...: Debian's sitecustomize lives there */
    DIR *d = opendir("/etc");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, "python3", 7) != 0)
            continue;
        snprintf(buf, sizeof(buf), "/etc/%s", e->d_name);
        struct stat st;
        if (stat(buf, &st) == 0 && S_ISDIR(st.st_mode))
            plan_add(p, OP_BIND, buf, stage, buf, ro | OPF_DIR);
    }
    if (d)
        closedir(d);
    snprintf(buf, sizeof(buf),
             "root:x:0:0:root:/root:/usr/sbin/nologin\nkiln:x:%u:%u:kiln rank:/tmp:/bin/sh\n"
             "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", uid, uid);
    plan_add(p, OP_FILE, buf, stage, "/etc/passwd", 0);
    snprintf(buf, sizeof(buf), "root:x:0:\nkiln:x:%u:\nnogroup:x:65534:\n", uid);
    plan_add(p, OP_FILE, buf, stage, "/etc/group", 0);
    for (size_t i = 0; i < s->n_ro_paths; i++)
        plan_host(p, stage, s->ro_paths[i], ro);
    plan_add(p, OP_BIND, "/sys", stage, "/sys", OPF_FLAT | OPF_DIR);
    plan_add(p, OP_PROC, NULL, stage, "/proc", 0);
    plan_add(p, OP_TMPFS, "mode=0755,size=1m", stage, "/dev", OPF_DEV);
    for (size_t i = 0; i < KILN_ARRAY_LEN(k_devices); i++) {
        snprintf(buf, sizeof(buf), "/dev/%s", k_devices[i]);
        if (access(buf, F_OK) == 0)
            plan_add(p, OP_BIND, buf, stage, buf, OPF_RW | OPF_DEV | OPF_FLAT);
    }
    plan_add(p, OP_LINK, "/proc/self/fd", stage, "/dev/fd", 0);
    plan_add(p, OP_LINK, "/proc/self/fd/0", stage, "/dev/stdin", 0);
    plan_add(p, OP_LINK, "/proc/self/fd/1", stage, "/dev/stdout", 0);
    plan_add(p, OP_LINK, "/proc/self/fd/2", stage, "/dev/stderr", 0);
    if (spec->gpu && (d = opendir("/dev"))) {
        while ((e = readdir(d))) {
            if (strncmp(e->d_name, "nvidia", 6) != 0)
                continue;
            snprintf(buf, sizeof(buf), "/dev/%s", e->d_name);
            struct stat st;
            if (stat(buf, &st) == 0 && S_ISCHR(st.st_mode))
                plan_add(p, OP_BIND, buf, stage, buf, OPF_RW | OPF_DEV | OPF_FLAT);
        }
        closedir(d);
    }
    /* shared by the box's ranks (libfabric's shm transport, NCCL); its pages count against the
     * box's memory limit */
    if (spec->memory_mb > 0)
        snprintf(buf, sizeof(buf), "mode=1777,size=%" PRId64 "m", spec->memory_mb);
    else
        snprintf(buf, sizeof(buf), "mode=1777");
    plan_add(p, OP_TMPFS, buf, stage, "/dev/shm", 0);
    snprintf(buf, sizeof(buf), "mode=1777,size=%" PRId64 "m", spec->tmp_mb > 0 ? spec->tmp_mb : s->tmp_mb);
    plan_add(p, OP_TMPFS, buf, stage, "/tmp", OPF_EXEC);
    for (size_t i = 0; i < spec->n_mounts; i++) {
        const sandbox_mount_t *m = &spec->mounts[i];
        const char *dst = m->dst ? m->dst : m->src;
        if (!m->src || m->src[0] != '/' || !dst || dst[0] != '/')
            return kiln_err_set(err, KILN_EINVAL, NULL, "sandbox mount \"%s\" is not an absolute path",
                                m->src ? m->src : "(null)");
        if (!strcmp(dst, "/") || !strncmp(dst, "/proc", 5) || !strncmp(dst, "/dev", 4))
            return kiln_err_set(err, KILN_EINVAL, NULL, "sandbox mount \"%s\" cannot go on %s", m->src, dst);
        struct stat st;
        if (stat(m->src, &st) != 0) {
            if (m->flags & SANDBOX_OPTIONAL)
                continue;
            return kiln_err_set(err, KILN_ENOTFOUND, NULL, "\"%s\" is not there to be given to the sandbox: %s",
                                m->src, strerror(errno));
        }
        plan_add(p, OP_BIND, m->src, stage, dst,
                 ((m->flags & SANDBOX_RW) ? OPF_RW : ro) | (S_ISDIR(st.st_mode) ? OPF_DIR : 0));
    }
    if (p->oom)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    return 0;
}

/* mkdir -p of path's directories (all of it when whole, else up to its last '/'). In a child:
 * works on a copy on the stack. Returns 0 or -1 with errno. */
static int mkdir_p(const char *path, bool whole)
{
    char buf[PATH_MAX];
    size_t n = strlen(path);
    if (n >= sizeof(buf)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(buf, path, n + 1);
    if (!whole) {
        char *slash = strrchr(buf, '/');
        if (!slash)
            return 0;
        *slash = '\0';
        n = (size_t)(slash - buf);
    }
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return -1;
        buf[i] = c;
    }
    return 0;
}

/* Read-only (or not) and nosuid, nodev (unless OPF_DEV), for the mount at dst and, when the
 * kernel can, every mount below it. */
static int mount_lock(const char *dst, unsigned flags, bool recursive_attr)
{
    if (recursive_attr && !(flags & OPF_FLAT)) {
        struct mount_attr attr;
        memset(&attr, 0, sizeof(attr));
        attr.attr_set = MOUNT_ATTR_NOSUID | ((flags & OPF_RW) ? 0 : MOUNT_ATTR_RDONLY) |
                        ((flags & OPF_DEV) ? 0 : MOUNT_ATTR_NODEV);
        return (int)syscall(SYS_mount_setattr, AT_FDCWD, dst, AT_RECURSIVE, &attr, sizeof(attr));
    }
    unsigned long mf = MS_REMOUNT | MS_BIND | MS_NOSUID | ((flags & OPF_RW) ? 0 : MS_RDONLY) |
                       ((flags & OPF_DEV) ? 0 : MS_NODEV);
    return mount(NULL, dst, NULL, mf, NULL);
}

typedef struct init_args {
    const plan_t *plan;
    const char *stage;
    bool recursive_attr;
    int procs_fd[2];
    uint32_t uid;
    int report_fd;
} init_args_t;

/* The box's init, pid 1 of its PID namespace: joins the cgroup, builds the root in a mount
 * namespace of its own (which the ranks join), reports, drops every privilege and then only
 * reaps what is orphaned in the box. Never returns. */
static void box_init_main(const init_args_t *a)
{
    int fd = a->report_fd;
    child_start(fd, 0, a->procs_fd);
    if (unshare(CLONE_NEWNS) != 0)
        child_fail(fd, ST_UNSHARE, -1);
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        child_fail(fd, ST_PRIVATE, -1);
    if (mount("tmpfs", a->stage, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=4m") != 0)
        child_fail(fd, ST_STAGE, -1);
    for (size_t i = 0; i < a->plan->n; i++) {
        const op_t *o = &a->plan->v[i];
        int op = (int)i;
        switch (o->kind) {
        case OP_BIND: {
            struct stat st;
            bool dir = o->flags & OPF_DIR;
            if (mkdir_p(o->dst, dir) != 0)
                child_fail(fd, ST_MKDIR, op);
            if (!dir && lstat(o->dst, &st) != 0) {
                int mfd = open(o->dst, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
                if (mfd < 0)
                    child_fail(fd, ST_MKDIR, op);
                close(mfd);
            }
            if (mount(o->src, o->dst, NULL, MS_BIND | ((o->flags & OPF_FLAT) ? 0 : MS_REC), NULL) != 0)
                child_fail(fd, ST_MOUNT, op);
            if (mount_lock(o->dst, o->flags, a->recursive_attr) != 0)
                child_fail(fd, ST_READONLY, op);
            break;
        }
        case OP_LINK:
            if (mkdir_p(o->dst, false) != 0)
                child_fail(fd, ST_MKDIR, op);
            if (symlink(o->src, o->dst) != 0 && errno != EEXIST)
                child_fail(fd, ST_LINK, op);
            break;
        case OP_TMPFS:
            if (mkdir_p(o->dst, true) != 0)
                child_fail(fd, ST_MKDIR, op);
            {
                /* /dev holds device nodes (bound in), /tmp programs (a JIT's objects) */
                unsigned long mf = MS_NOSUID | ((o->flags & OPF_DEV) ? 0 : MS_NODEV) |
                                   ((o->flags & OPF_EXEC) ? 0 : MS_NOEXEC);
                if (mount("tmpfs", o->dst, "tmpfs", mf, o->src) != 0)
                    child_fail(fd, ST_MOUNT, op);
            }
            break;
        case OP_PROC:
            if (mkdir_p(o->dst, true) != 0)
                child_fail(fd, ST_MKDIR, op);
            if (mount("proc", o->dst, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0)
                child_fail(fd, ST_MOUNT, op);
            break;
        case OP_FILE: {
            if (mkdir_p(o->dst, false) != 0)
                child_fail(fd, ST_MKDIR, op);
            int ffd = open(o->dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            size_t len = strlen(o->src);
            if (ffd < 0 || write(ffd, o->src, len) != (ssize_t)len)
                child_fail(fd, ST_WRITE, op);
            close(ffd);
            break;
        }
        }
    }
    if (chdir(a->stage) != 0 || syscall(SYS_pivot_root, ".", ".") != 0 || umount2(".", MNT_DETACH) != 0 ||
        chdir("/") != 0)
        child_fail(fd, ST_PIVOT, -1);
    if (mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) != 0)
        child_fail(fd, ST_ROOT_RO, -1);
    /* nothing of the agent's is kept: no descriptor, no privilege, and it cannot be traced */
    child_become(fd, a->uid, 0);
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0)
        child_fail(fd, ST_PRIVS, -1);
    /* an agent that died before the parent-death signal was set again reads no report: end */
    child_report_t ok = {0, 0, -1};
    if (write(fd, &ok, sizeof(ok)) != (ssize_t)sizeof(ok))
        _exit(127);
    if (syscall(SYS_close_range, 0u, ~0u, 0u) != 0)
        for (int i = 0; i < 1024; i++)
            close(i);
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    for (;;) {
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
        siginfo_t si;
        sigwaitinfo(&chld, &si);
    }
}

/* ---- uids ------------------------------------------------------------------------------------- */

/* Whether uid's box cgroup exists while this agent's state directory never claimed uid: the box of
 * another agent of this host that records its uids in another --sandbox-state-dir (agents of one
 * host are meant to share it). Such a box is neither taken for a dead agent's (and killed) nor
 * given the uid of. */
static bool uid_foreign(const sandbox_t *s, uint32_t uid)
{
    char path[PATH_MAX];
    struct stat st;
    snprintf(path, sizeof(path), "%s/uid-%u", s->state_dir, uid);
    if (lstat(path, &st) == 0)
        return false;
    bool exists = false;
    for (int i = 0; i < (s->cg.version == 1 ? 2 : 1) && !exists; i++) {
        snprintf(path, sizeof(path), "%s/u%u", s->cg.base[i], uid);
        exists = stat(path, &st) == 0;
    }
    if (!exists)
        return false;
    log_warn("sandbox: the box of uid %u is another agent's on this host, which records its uids outside %s; "
             "it is left alone (agents of one host should share --sandbox-state-dir)", uid, s->state_dir);
    return true;
}

static int claim_next(sandbox_t *s, uint32_t *uid, kiln_err_t *err)
{
    pthread_mutex_lock(&s->mu);
    uint64_t n = (uint64_t)s->ids.hi - s->ids.lo + 1;
    uint32_t start = s->next_uid;
    pthread_mutex_unlock(&s->mu);
    for (uint64_t k = 0; k < n; k++) {
        uint32_t u = (uint32_t)(s->ids.lo + ((uint64_t)(start - s->ids.lo) + k) % n);
        if (uid_foreign(s, u))
            continue;
        int fd = sandbox_uid_claim(&s->ids, u);
        if (fd < 0)
            continue;
        pthread_mutex_lock(&s->mu);
        s->next_uid = u == s->ids.hi ? s->ids.lo : u + 1;
        pthread_mutex_unlock(&s->mu);
        *uid = u;
        return fd;
    }
    kiln_err_set(err, KILN_EUNAVAIL, NULL, "every sandbox uid of %u-%u is in use on this host", s->ids.lo, s->ids.hi);
    kiln_err_hint(err, "widen kiln-agent's --sandbox-uid-range");
    return -1;
}

/* ---- boxes ------------------------------------------------------------------------------------ */

/* Back to the agent's PID namespace for this thread's children. It cannot fail (the thread came
 * from there); if it did, every later child of the thread would start in a box: abort. */
static void pidns_return(const sandbox_t *s)
{
    if (setns(s->host_pidns_fd, CLONE_NEWPID) != 0) {
        log_error("sandbox: could not return to the agent's PID namespace: %s", strerror(errno));
        abort();
    }
}

uid_t sandbox_box_uid(const sandbox_box_t *b)
{
    return (uid_t)b->uid;
}

int sandbox_box_give(sandbox_box_t *b, const char *path, bool recursive, kiln_err_t *err)
{
    return sandbox_uid_give(&b->s->ids, b->claim_fd, b->uid, path, recursive, err);
}

void sandbox_box_kill(sandbox_box_t *b)
{
    if (b->init_pid > 0)
        kill(b->init_pid, SIGKILL); /* the PID namespace goes with its init */
    sandbox_cgbox_kill(&b->cg, 0);
}

bool sandbox_box_oom(const sandbox_box_t *b, int64_t *limit_mb)
{
    if (limit_mb)
        *limit_mb = b->memory_mb;
    return sandbox_cgbox_oom(&b->cg);
}

void sandbox_box_destroy(sandbox_box_t *b)
{
    if (!b)
        return;
    bool gone = true;
    if (b->init_pid > 0) {
        /* The PID namespace dies with its init; init's own end waits until every process of the
         * namespace is gone and reaped (ranks by their launcher), so wait for it, within bounds. */
        kill(b->init_pid, SIGKILL);
        int64_t deadline = kiln_mono_us() + SB_INIT_WAIT_MS * 1000LL;
        pid_t w;
        while ((w = waitpid(b->init_pid, NULL, WNOHANG)) == 0 && kiln_mono_us() < deadline)
            usleep(1000);
        gone = w != 0;
    }
    if (b->pidns_fd >= 0)
        close(b->pidns_fd);
    if (b->mntns_fd >= 0)
        close(b->mntns_fd);
    if (!gone) {
        /* its uid and cgroup stay claimed (the claim's descriptor is kept open on purpose) */
        log_warn("sandbox: %s: processes of uid %u did not end within %d ms; its uid and cgroup stay claimed",
                 b->name, b->uid, SB_INIT_WAIT_MS);
        free(b);
        return;
    }
    sandbox_cgbox_destroy(&b->cg);
    if (b->claim_fd >= 0) {
        sandbox_uid_take_back(&b->s->ids, b->claim_fd, b->uid);
        close(b->claim_fd); /* and with it the uid */
    }
    free(b);
}

int sandbox_box_create(sandbox_t *s, const sandbox_box_spec_t *spec, sandbox_box_t **out, kiln_err_t *err)
{
    *out = NULL;
    plan_t plan = {0};
    int rc = 0, rp[2] = {-1, -1};
    sandbox_box_t *b = calloc(1, sizeof(*b));
    if (!b)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    b->s = s;
    b->claim_fd = b->pidns_fd = b->mntns_fd = -1;
    b->init_pid = -1;
    b->cg.procs_fd[0] = b->cg.procs_fd[1] = -1;
    snprintf(b->name, sizeof(b->name), "%s", spec->name ? spec->name : "box");
    b->memory_mb = spec->memory_mb;
    if ((b->claim_fd = claim_next(s, &b->uid, err)) < 0) {
        rc = err ? err->status : KILN_EUNAVAIL;
        goto fail;
    }
    char cgname[32];
    snprintf(cgname, sizeof(cgname), "u%u", b->uid);
    if ((rc = sandbox_cgbox_create(&s->cg, cgname, spec->memory_mb * 1024 * 1024, spec->pids_max, &b->cg, err)))
        goto fail;
    if ((rc = plan_build(s, spec, b->uid, &plan, err)))
        goto fail;
    init_args_t ia = {.plan = &plan, .stage = s->stage_dir, .recursive_attr = s->ro_recursive,
                      .procs_fd = {b->cg.procs_fd[0], b->cg.procs_fd[1]}, .uid = b->uid};
    if (pipe2(rp, O_CLOEXEC) != 0) {
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not create a pipe: %s", strerror(errno));
        goto fail;
    }
    ia.report_fd = rp[1];
    /* This thread's next child starts a new PID namespace, as its pid 1; then back. */
    if (unshare(CLONE_NEWPID) != 0) {
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not create a PID namespace: %s", strerror(errno));
        goto fail;
    }
    pid_t pid = fork();
    if (pid == 0)
        box_init_main(&ia);
    int fork_errno = errno;
    pidns_return(s);
    if (pid < 0) {
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not start the sandbox's init: %s", strerror(fork_errno));
        goto fail;
    }
    b->init_pid = pid;
    close(rp[1]);
    rp[1] = -1;
    child_report_t r;
    if (report_read(rp[0], &r) != 0) {
        const char *what = r.op >= 0 && (size_t)r.op < plan.n ? plan.v[r.op].dst + strlen(s->stage_dir) : "";
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not build the sandbox: %s%s%s: %s", stage_name(r.stage),
                          what[0] ? " " : "", what, r.stage ? strerror(r.err) : "its init died");
        goto fail;
    }
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/ns/pid", (int)pid);
    b->pidns_fd = open(path, O_RDONLY | O_CLOEXEC);
    snprintf(path, sizeof(path), "/proc/%d/ns/mnt", (int)pid);
    b->mntns_fd = open(path, O_RDONLY | O_CLOEXEC);
    if (b->pidns_fd < 0 || b->mntns_fd < 0) {
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not open the sandbox's namespaces: %s", strerror(errno));
        goto fail;
    }
    *out = b;
    b = NULL;
fail:
    for (int i = 0; i < 2; i++)
        if (rp[i] >= 0)
            close(rp[i]);
    plan_free(&plan);
    sandbox_box_destroy(b);
    return rc;
}

/* ---- spawning --------------------------------------------------------------------------------- */

typedef struct spawn_args {
    sandbox_box_t *box;
    const sandbox_spawn_t *sp;
    char *const *envp;
    int report_fd;
    int tmp_base;                /* where sources are parked before they move to their targets */
    int max_dst;
    int cap_last;
    pid_t parent;
} spawn_args_t;

static void spawn_child(const spawn_args_t *a)
{
    int fd = a->report_fd;
    sandbox_box_t *b = a->box;
    child_start(fd, b ? 0 : a->parent, b ? b->cg.procs_fd : NULL);
    if (b && setns(b->mntns_fd, CLONE_NEWNS) != 0)
        child_fail(fd, ST_SETNS, -1);
    setpgid(0, 0);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP)
            sigaction(sig, &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    umask(077);
    if (a->sp->cwd ? chdir(a->sp->cwd) != 0 : (b && chdir("/") != 0))
        child_fail(fd, ST_CHDIR, -1);
    /* descriptors: park every source above every target, then move them into place */
    const sandbox_fd_t *fds = a->sp->fds;
    size_t n = a->sp->n_fds;
    int parked[64];
    bool has_stdin = false;
    for (size_t i = 0; i < n && i < KILN_ARRAY_LEN(parked); i++)
        if ((parked[i] = fcntl(fds[i].src, F_DUPFD, a->tmp_base)) < 0)
            child_fail(fd, ST_FDS, -1);
    for (size_t i = 0; i < n && i < KILN_ARRAY_LEN(parked); i++) {
        if (dup2(parked[i], fds[i].dst) < 0)
            child_fail(fd, ST_FDS, -1);
        has_stdin |= fds[i].dst == 0;
    }
    if (!has_stdin) {
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull < 0 || (devnull != 0 && (dup2(devnull, 0) < 0 || close(devnull) != 0)))
            child_fail(fd, ST_FDS, -1);
    }
    /* everything else goes, but the report pipe (close-on-exec) until the exec */
    int lo = a->max_dst + 1;
    if (fd > lo && syscall(SYS_close_range, (unsigned)lo, (unsigned)fd - 1, 0u) != 0)
        for (int i = lo; i < fd; i++)
            close(i);
    if (syscall(SYS_close_range, (unsigned)fd + 1, ~0u, 0u) != 0)
        for (int i = fd + 1; i < 65536; i++)
            close(i);
    if (b) {
        struct rlimit core = {0, 0};
        if (setrlimit(RLIMIT_CORE, &core) != 0)
            child_fail(fd, ST_RLIMIT, -1);
        for (int cap = 0; cap <= a->cap_last; cap++)
            if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL)
                child_fail(fd, ST_PRIVS, -1);
        if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL)
            child_fail(fd, ST_PRIVS, -1);
        child_become(fd, b->uid, 0);
    }
    execve(a->sp->path, a->sp->argv, a->envp);
    child_fail(fd, ST_EXEC, -1);
}

/* envp with HOME=/tmp (the box has no home directories): a heap copy, or NULL when out of memory. */
static char **env_for_box(char *const *envp)
{
    size_t n = 0;
    while (envp && envp[n])
        n++;
    char **v = calloc(n + 2, sizeof(char *));
    if (!v)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(envp[i], "HOME=", 5) != 0)
            v[k++] = envp[i];
    v[k++] = (char *)"HOME=/tmp";
    v[k] = NULL;
    return v;
}

int sandbox_spawn(sandbox_box_t *b, const sandbox_spawn_t *sp, pid_t *out_pid, kiln_err_t *err)
{
    int rp[2] = {-1, -1};
    char **envp = NULL;
    int rc = 0;
    int max_dst = 2;
    if (sp->n_fds > 64)
        return kiln_err_set(err, KILN_EINVAL, NULL, "too many descriptors for a rank (%zu)", sp->n_fds);
    for (size_t i = 0; i < sp->n_fds; i++)
        max_dst = KILN_MAX(max_dst, sp->fds[i].dst);
    if (b && !(envp = env_for_box(sp->envp ? sp->envp : environ)))
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    if (pipe2(rp, O_CLOEXEC) != 0) {
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not create a pipe: %s", strerror(errno));
        goto done;
    }
    /* the report pipe sits above every target and every parked source */
    int high = fcntl(rp[1], F_DUPFD_CLOEXEC, max_dst + 80);
    if (high < 0) {
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not move a descriptor: %s", strerror(errno));
        goto done;
    }
    close(rp[1]);
    rp[1] = high;
    spawn_args_t a = {.box = b, .sp = sp, .envp = envp ? envp : (sp->envp ? sp->envp : environ),
                      .report_fd = rp[1], .tmp_base = max_dst + 1, .max_dst = max_dst,
                      .cap_last = b ? b->s->cap_last : 0, .parent = getpid()};
    if (b && setns(b->pidns_fd, CLONE_NEWPID) != 0) {
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not enter the sandbox's PID namespace: %s", strerror(errno));
        goto done;
    }
    pid_t pid = fork();
    if (pid == 0)
        spawn_child(&a);
    int fork_errno = errno;
    if (b)
        pidns_return(b->s);
    if (pid < 0) {
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not fork: %s", strerror(fork_errno));
        goto done;
    }
    close(rp[1]);
    rp[1] = -1;
    child_report_t r;
    if (report_read(rp[0], &r) > 0) {
        /* the child is gone or going: reap it now so no zombie is left behind */
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        if (r.stage == ST_EXEC) /* the program's own fault: missing, not executable */
            rc = kiln_err_set(err, KILN_ENOTFOUND, NULL, "could not start %s: %s", sp->path, strerror(r.err));
        else
            rc = kiln_err_set(err, KILN_EIO, NULL, "could not start %s: %s%s: %s", sp->path,
                              b ? "sandbox: " : "", stage_name(r.stage), strerror(r.err));
        goto done;
    }
    setpgid(pid, pid); /* also from here, so the group exists before anyone signals it */
    *out_pid = pid;
done:
    for (int i = 0; i < 2; i++)
        if (rp[i] >= 0)
            close(rp[i]);
    free(envp);
    return rc;
}

/* ---- the host's side -------------------------------------------------------------------------- */

static void sweep_one(void *ud, uint32_t uid)
{
    sandbox_t *s = ud;
    if (uid < s->ids.lo || uid > s->ids.hi || uid_foreign(s, uid))
        return;
    int fd = sandbox_uid_claim(&s->ids, uid); /* takes back what it was given */
    if (fd < 0)
        return;                 /* a live agent's box */
    sandbox_cgbox_t cg = {.version = s->cg.version, .procs_fd = {-1, -1}};
    for (int i = 0; i < (s->cg.version == 1 ? 2 : 1); i++)
        snprintf(cg.dir[i], sizeof(cg.dir[i]), "%s/u%u", s->cg.base[i], uid);
    log_warn("sandbox: removing the box of uid %u, left by an agent that did not end cleanly", uid);
    sandbox_cgbox_destroy(&cg);
    close(fd);
}

static int read_int_file(const char *path, int dflt)
{
    char buf[32];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dflt;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return dflt;
    buf[n] = '\0';
    return atoi(buf);
}

int sandbox_create(const agent_sandbox_config_t *cfg, int slots, sandbox_t **out, kiln_err_t *err)
{
    *out = NULL;
    static const char hint[] = "kiln-agent --sandbox off runs ranks unconfined, for development only";
    int rc = 0;
    char *self = NULL;
    size_t self_len = 0;
    if (geteuid() != 0) {
        kiln_err_set(err, KILN_EPERM, "sandbox", "the ranks' sandbox needs kiln-agent to run as root (it makes "
                     "namespaces, mounts and cgroups and changes uids); this one runs as uid %u", (unsigned)geteuid());
        kiln_err_hint(err, "%s", hint);
        return KILN_EPERM;
    }
    uint32_t lo = cfg->uid_lo ? cfg->uid_lo : AGENT_SANDBOX_UID_LO;
    uint32_t hi = cfg->uid_lo ? cfg->uid_hi : AGENT_SANDBOX_UID_HI;
    if (lo < 1000 || hi < lo || hi >= UINT32_MAX - 1 || (lo <= 65534 && hi >= 65534) ||
        (lo <= (uint32_t)getuid() && (uint32_t)getuid() <= hi))
        return kiln_err_set(err, KILN_EINVAL, "sandbox-uid-range", "the sandbox's uid range %u-%u must be LO-HI "
                            "with 1000 <= LO <= HI < 4294967294, leaving out nobody (65534) and the agent's uid",
                            lo, hi);
    if (cfg->memory_per_slot_mb < 0 || cfg->pids_per_slot < 0 || cfg->tmp_mb < 0)
        return kiln_err_set(err, KILN_EINVAL, "sandbox", "the sandbox's limits must be 0 (the default) or positive");
    sandbox_t *s = calloc(1, sizeof(*s));
    if (!s)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    pthread_mutex_init(&s->mu, NULL);
    s->host_pidns_fd = -1;
    s->ids.lo = lo;
    s->ids.hi = hi;
    s->next_uid = lo + (uint32_t)getpid() % (hi - lo + 1); /* agents of one host start apart */
    s->ids.agent_uid = geteuid();
    s->ids.agent_gid = getegid();
    int64_t ram_mb = (int64_t)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE) / (1024 * 1024);
    s->mem_slot_mb = cfg->memory_per_slot_mb ? cfg->memory_per_slot_mb : KILN_MAX(64, ram_mb / KILN_MAX(1, slots));
    s->pids_slot = cfg->pids_per_slot ? cfg->pids_per_slot : 4096;
    s->tmp_mb = cfg->tmp_mb ? cfg->tmp_mb : 1024;
    s->cap_last = read_int_file("/proc/sys/kernel/cap_last_cap", 63);
    s->state_dir = strdup(cfg->state_dir && cfg->state_dir[0] ? cfg->state_dir : AGENT_SANDBOX_STATE_DIR);
    if (s->state_dir) {
        size_t n = strlen(s->state_dir) + 8;
        if ((s->stage_dir = malloc(n)))
            snprintf(s->stage_dir, n, "%s/root", s->state_dir);
    }
    s->ro_paths = calloc(cfg->n_ro_paths + 1, sizeof(char *));
    s->ids.state_dir = s->state_dir;
    if (!s->state_dir || !s->stage_dir || !s->ro_paths) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < cfg->n_ro_paths; i++) {
        const char *p = cfg->ro_paths[i];
        if (!p || p[0] != '/' || !strcmp(p, "/") || !strncmp(p, "/proc", 5) || !strncmp(p, "/dev", 4)) {
            rc = kiln_err_set(err, KILN_EINVAL, "sandbox-ro-path", "--sandbox-ro-path \"%s\" must be an absolute path "
                              "other than /, /proc and /dev", p ? p : "");
            goto fail;
        }
        if (!(s->ro_paths[s->n_ro_paths] = strdup(p))) {
            rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
            goto fail;
        }
        s->n_ro_paths++;
    }
    if (s->state_dir[0] != '/') {
        rc = kiln_err_set(err, KILN_EINVAL, "sandbox-state-dir", "the sandbox's state directory must be absolute");
        goto fail;
    }
    if ((rc = kiln_mkdirs_mode(s->stage_dir, 0700, err)))
        goto fail;
    /* mount_setattr (Linux 5.12): with it, read-only covers a bound tree's submounts; without it
     * those are left out (binds are not recursive) rather than left writable */
    errno = 0;
    s->ro_recursive = syscall(SYS_mount_setattr, -1, "", 0, NULL, 0) != 0 && errno != ENOSYS;
    if ((s->host_pidns_fd = open("/proc/self/ns/pid", O_RDONLY | O_CLOEXEC)) < 0) {
        rc = kiln_err_set(err, KILN_EUNSUPP, "sandbox", "no PID namespaces here (/proc/self/ns/pid: %s)", strerror(errno));
        kiln_err_hint(err, "%s", hint);
        goto fail;
    }
    kiln_err_t ferr;
    if (kiln_file_read("/proc/self/cgroup", &self, &self_len, &ferr) != 0) {
        rc = kiln_err_set(err, KILN_EUNSUPP, "sandbox", "could not read /proc/self/cgroup: %s", ferr.message);
        goto fail;
    }
    if ((rc = sandbox_cg_detect("/sys/fs/cgroup", self, &s->cg, err)) != 0 || (rc = sandbox_cg_setup(&s->cg, err)) != 0) {
        if (!err->hint[0])
            kiln_err_hint(err, "%s", hint);
        goto fail;
    }
    sandbox_cg_each_box(&s->cg, sweep_one, s);
    /* one box made and destroyed: namespaces, mounts, the cgroup and the uid all work here */
    sandbox_box_spec_t probe = {.name = "probe", .memory_mb = 64, .pids_max = 16, .tmp_mb = 1};
    sandbox_box_t *b = NULL;
    if ((rc = sandbox_box_create(s, &probe, &b, err)) != 0) {
        kiln_err_hint(err, "%s", hint);
        rc = rc == KILN_EUNAVAIL ? rc : KILN_EUNSUPP;
        goto fail;
    }
    sandbox_box_destroy(b);
    if (snprintf(s->describe, sizeof(s->describe), "cgroup v%d (%s), uids %u-%u, per slot %" PRId64 " MiB of "
                 "memory and %" PRId64 " tasks, /tmp %" PRId64 " MiB%s", s->cg.version, s->cg.base[0], lo, hi,
                 s->mem_slot_mb, s->pids_slot, s->tmp_mb,
                 s->ro_recursive ? "" : "; bound trees come without their submounts") >= (int)sizeof(s->describe))
        s->describe[sizeof(s->describe) - 1] = '\0';
    free(self);
    *out = s;
    return 0;
fail:
    free(self);
    sandbox_destroy(s);
    return rc;
}

void sandbox_destroy(sandbox_t *s)
{
    if (!s)
        return;
    if (s->host_pidns_fd >= 0)
        close(s->host_pidns_fd);
    for (size_t i = 0; i < s->n_ro_paths; i++)
        free(s->ro_paths[i]);
    free(s->ro_paths);
    free(s->state_dir);
    free(s->stage_dir);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

const char *sandbox_describe(const sandbox_t *s)
{
    return s->describe;
}

/* Whether path is dir or lies below it. */
static bool path_under(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/' || (n == 1 && dir[0] == '/'));
}

/* Whether path lies in the system's directories or under a --sandbox-ro-path; with resolved (path
 * is a realpath), also under where a --sandbox-ro-path's links lead, which a box shows at the
 * ro-path's own place. */
static bool shown_at(const sandbox_t *s, const char *path, bool resolved)
{
    for (size_t i = 0; i < KILN_ARRAY_LEN(k_system); i++)
        if (path_under(path, k_system[i]))
            return true;
    char real[PATH_MAX];
    for (size_t i = 0; i < s->n_ro_paths; i++)
        if (path_under(path, s->ro_paths[i]) || (resolved && realpath(s->ro_paths[i], real) && path_under(path, real)))
            return true;
    return false;
}

bool sandbox_shows(const sandbox_t *s, const char *path)
{
    if (!shown_at(s, path, false))
        return false;
    /* a link the box shows is no use when where it leads is not shown: follow every link */
    char real[PATH_MAX];
    return !realpath(path, real) || shown_at(s, real, true);
}

int64_t sandbox_memory_per_slot_mb(const sandbox_t *s)
{
    return s->mem_slot_mb;
}

int64_t sandbox_pids_per_slot(const sandbox_t *s)
{
    return s->pids_slot;
}
