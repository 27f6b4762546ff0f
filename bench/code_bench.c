/* code_bench.c - what a script job's code costs on an agent (issue 26): a source tree of about
 * 1,000 files and 50 MiB is packed (code/), then fetched into the agent's code cache and
 * extracted (cold), and each job's working directory is prepared from the cached tree, as a copy
 * (agent_code_prepare) and as an overlay mounted in a mount namespace of its own (what a
 * launcher does with agent_code_overlay's paths), in interleaved rounds. Prints one line per
 * measurement and the medians. Needs root for the overlay (it is skipped otherwise).
 *   build/bench/code_bench [FILES] [MiB] [ROUNDS]     (default 1000 50 9) */
#include "agent/agent.h"
#include "code/code.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char top[64];

static double now_s(void)
{
    return (double)kiln_mono_us() / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int serve(void *ud, const agent_code_ref_t *ref, int fd, kiln_err_t *err)
{
    (void)ref;
    (void)err;
    int in = open(ud, O_RDONLY);
    char buf[1 << 16];
    ssize_t k;
    while ((k = read(in, buf, sizeof(buf))) > 0)
        if (write(fd, buf, (size_t)k) != k)
            return KILN_EIO;
    close(in);
    return 0;
}

/* Mounts an overlay of lower at target in a mount namespace of a child of its own; returns the
 * seconds from the namespace to the mounted tree's first file read, or -1. */
static double overlay_once(const char *lower, const char *upper, const char *work, const char *target)
{
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        double t0 = now_s(), dt = -1;
        char opts[3 * PATH_MAX + 64], probe[PATH_MAX + 32];
        snprintf(opts, sizeof(opts), "lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work);
        snprintf(probe, sizeof(probe), "%s/f0000/train.py", target);
        if (unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_PRIVATE | MS_REC, NULL) == 0 &&
            mount("overlay", target, "overlay", 0, opts) == 0 && access(probe, R_OK) == 0)
            dt = now_s() - t0;
        else
            fprintf(stderr, "overlay: %s\n", strerror(errno));
        if (write(fds[1], &dt, sizeof(dt)) != (ssize_t)sizeof(dt))
            _exit(1);
        _exit(0);
    }
    close(fds[1]);
    double dt = -1;
    if (read(fds[0], &dt, sizeof(dt)) != (ssize_t)sizeof(dt))
        dt = -1;
    close(fds[0]);
    waitpid(pid, NULL, 0);
    return dt;
}

int main(int argc, char **argv)
{
    int nfiles = argc > 1 ? atoi(argv[1]) : 1000, mib = argc > 2 ? atoi(argv[2]) : 50,
        rounds = argc > 3 ? atoi(argv[3]) : 9;
    kiln_err_t err;
    snprintf(top, sizeof(top), "/tmp/kiln-code-bench.XXXXXX");
    if (!mkdtemp(top))
        return 1;
    char src[PATH_MAX], p[PATH_MAX + 64];
    snprintf(src, sizeof(src), "%s/src", top);
    mkdir(src, 0755);
    /* nfiles files in directories of 100, mib MiB in all, random bytes (they do not compress:
     * the archive is as large as the tree, the worst case for a fetch) */
    size_t per = ((size_t)mib << 20) / (size_t)nfiles;
    char *buf = malloc(per);
    int rnd = open("/dev/urandom", O_RDONLY);
    for (int i = 0; i < nfiles; i++) {
        snprintf(p, sizeof(p), "%s/f%04d", src, i / 100 * 100);
        mkdir(p, 0755);
        if (i % 100 == 0)
            snprintf(p, sizeof(p), "%s/f%04d/train.py", src, i / 100 * 100);
        else
            snprintf(p, sizeof(p), "%s/f%04d/m%d.py", src, i / 100 * 100, i);
        if (read(rnd, buf, per) != (ssize_t)per)
            return 1;
        int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || write(fd, buf, per) != (ssize_t)per)
            return 1;
        close(fd);
    }
    close(rnd);
    free(buf);
    char tgz[PATH_MAX];
    snprintf(tgz, sizeof(tgz), "%s/code.tgz", top);
    int fd = open(tgz, O_RDWR | O_CREAT | O_TRUNC, 0600);
    double t0 = now_s();
    code_stats_t st;
    if (code_pack_dir(src, fd, NULL, 0, &st, &err) != 0) {
        fprintf(stderr, "pack: %s\n", err.message);
        return 1;
    }
    double pack_s = now_s() - t0;
    char digest[KILN_SHA256_HEX];
    int64_t size = 0;
    kiln_sha256_fd(fd, &size, digest, &err);
    close(fd);
    printf("tree: %lld files, %lld bytes; archive %lld bytes, packed in %.3f s\n", (long long)st.files,
           (long long)st.bytes, (long long)size, pack_s);

    char cache_dir[PATH_MAX];
    snprintf(cache_dir, sizeof(cache_dir), "%s/cache", top);
    agent_code_cache_t *c = NULL;
    if (agent_code_cache_create(cache_dir, 0, serve, tgz, &c, &err) != 0)
        return 1;
    char tree[PATH_MAX];
    agent_code_ref_t ref = {.digest = digest, .size = size, .job_id = "bench", .attempt = 1};
    t0 = now_s();
    if (agent_code_acquire(c, &ref, tree, sizeof(tree), &err) != 0) {
        fprintf(stderr, "acquire: %s\n", err.message);
        return 1;
    }
    printf("cold cache: fetch (a local copy here), SHA-256 check, extraction, manifest: %.3f s\n", now_s() - t0);
    agent_code_release(c, digest);
    double warm[64], copy[64], ovl[64];
    rounds = rounds > 64 ? 64 : rounds;
    bool can_overlay = geteuid() == 0;
    for (int r = 0; r < rounds; r++) {
        t0 = now_s();
        agent_code_acquire(c, &ref, tree, sizeof(tree), &err); /* a warm cache: the manifest check */
        warm[r] = now_s() - t0;
        char work[PATH_MAX], job[PATH_MAX], lower[PATH_MAX], upper[PATH_MAX], owork[PATH_MAX], target[PATH_MAX + 16];
        snprintf(work, sizeof(work), "%s/copy-%d", top, r);
        t0 = now_s();
        if (agent_code_prepare(c, digest, work, NULL, &err) != 0) {
            fprintf(stderr, "prepare: %s\n", err.message);
            return 1;
        }
        copy[r] = now_s() - t0;
        code_tree_remove(work);
        ovl[r] = -1;
        if (can_overlay) {
            snprintf(job, sizeof(job), "%s/job-%d", top, r);
            mkdir(job, 0755);
            snprintf(target, sizeof(target), "%s/code", job);
            mkdir(target, 0755);
            t0 = now_s();
            if (agent_code_overlay(c, digest, job, lower, upper, owork, PATH_MAX, &err) == 0) {
                double in_child = overlay_once(lower, upper, owork, target);
                ovl[r] = in_child < 0 ? -1 : now_s() - t0;
            }
            code_tree_remove(job);
        }
        agent_code_release(c, digest);
        printf("round %d: warm acquire %.4f s, copy %.4f s, overlay %.4f s\n", r, warm[r], copy[r], ovl[r]);
    }
    printf("median of %d rounds: warm acquire %.4f s, copy %.4f s, overlay %.4f s%s\n", rounds, median(warm, rounds),
           median(copy, rounds), median(ovl, rounds), can_overlay ? "" : " (overlay needs root: not measured)");
    agent_code_cache_destroy(c);
    code_tree_remove(top);
    return 0;
}
