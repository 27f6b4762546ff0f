/* pipe_test.h - helpers shared by the pipe suite's multi-process tests. Test-only. */
#ifndef KILN_TESTS_PIPE_TEST_H
#define KILN_TESTS_PIPE_TEST_H

#include <errno.h>
#include <glob.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

/* libfabric's shm provider names its region /dev/shm/<pid>:...; a process that is killed (some
 * suites kill ranks on purpose) cannot remove it, and a new process that reuses the pid then
 * fails to open the provider ("fi_enable: Device or resource busy"). Regions of processes that
 * no longer exist are garbage: remove them before starting ranks. */
static inline void pipe_test_remove_stale_shm(void)
{
    glob_t g;
    if (glob("/dev/shm/*:*", 0, NULL, &g) != 0)
        return;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        const char *name = g.gl_pathv[i] + strlen("/dev/shm/");
        char *end;
        long pid = strtol(name, &end, 10);
        if (end != name && *end == ':' && pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH)
            unlink(g.gl_pathv[i]);
    }
    globfree(&g);
}

#endif
