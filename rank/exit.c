/* exit.c - how a rank ends: the exit code kiln-train gives a failure, what an exit code or a
 * signal means for the job (kilnd decides with it), the words for it, and the shared memory an
 * ended rank leaves behind. */
#include "rank/rank.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int rank_exit_code_for(const kiln_err_t *err)
{
    if (!err)
        return RANK_EXIT_FAILURE;
    switch (err->status) {
    case KILN_EINVAL:
    case KILN_ENOTFOUND:
    case KILN_EFORMAT:
    case KILN_EUNSUPP:
    case KILN_EUNAVAIL:
    case KILN_EPERM:
        return RANK_EXIT_BAD_INPUT;
    case KILN_EIO:
        return strncmp(err->field, "data", 4) == 0 || strncmp(err->field, "model", 5) == 0 ? RANK_EXIT_BAD_INPUT
                                                                                           : RANK_EXIT_FAILURE;
    default:
        return RANK_EXIT_FAILURE;
    }
}

rank_end_t rank_end_of(int exit_code, int sig)
{
    if (sig != 0)
        return RANK_END_LOST;
    if (exit_code == RANK_EXIT_DONE)
        return RANK_END_DONE;
    if (exit_code == RANK_EXIT_BAD_INPUT)
        return RANK_END_BAD_INPUT;
    return RANK_END_LOST;
}

char *rank_end_describe(int exit_code, int sig, char *buf, size_t n)
{
    if (sig != 0) {
        const char *what = sig > 0 && sig < NSIG ? strsignal(sig) : NULL;
        snprintf(buf, n, "was killed by signal %d (%s)", sig, what ? what : "unknown signal");
        return buf;
    }
    const char *what = NULL;
    switch (exit_code) {
    case RANK_EXIT_DONE: what = "done"; break;
    case RANK_EXIT_BAD_INPUT: what = "bad spec or data"; break;
    case RANK_EXIT_STOPPED: what = "stopped after a checkpoint"; break;
    default: break;
    }
    if (what)
        snprintf(buf, n, "exited with code %d (%s)", exit_code, what);
    else
        snprintf(buf, n, "exited with code %d", exit_code);
    return buf;
}

int rank_shm_cleanup(const int *pids, size_t n)
{
    if (n == 0)
        return 0;
    int dfd = open("/dev/shm", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return 0;
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return 0;
    }
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        /* "<pid>:..." exactly: digits, then a colon */
        const char *p = de->d_name;
        char *end;
        errno = 0;
        long pid = strtol(p, &end, 10);
        if (end == p || *end != ':' || errno || p[0] < '0' || p[0] > '9')
            continue;
        bool ours = false;
        for (size_t i = 0; i < n && !ours; i++)
            ours = pids[i] > 0 && pids[i] == pid;
        if (!ours)
            continue;
        struct stat st;
        if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        removed += unlinkat(dfd, de->d_name, 0) == 0;
    }
    closedir(d);
    return removed;
}
