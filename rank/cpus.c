/* cpus.c - the rank contract's CPU binding: KILN_CPUS, a Linux CPU list ("0-3,8"), read and
 * written (rank_cpus_parse, rank_cpus_format), an agent's CPUs cut into one share per slot
 * (rank_cpus_share), and a rank binding every thread it has, and so every thread it starts
 * after, to its CPUs (rank_cpus_bind). It starts no process and knows nothing of the engine. */
#include "rank/rank.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

int rank_cpus_parse(const char *list, const char *field, cpu_set_t *out, kiln_err_t *err)
{
    CPU_ZERO(out);
    const char *p = list ? list : "";
    if (!*p)
        return kiln_err_set(err, KILN_EINVAL, field, "%s is empty: give CPU numbers and ranges such as \"0-3,8\"",
                            field);
    for (;;) {
        char *end;
        if (!is_digit(*p))
            break;
        errno = 0;
        long lo = strtol(p, &end, 10), hi = lo;
        if (*end == '-') {
            if (!is_digit(end[1]))
                break;
            hi = strtol(end + 1, &end, 10);
        }
        if (errno || (*end && *end != ','))
            break;
        if (hi >= CPU_SETSIZE)
            return kiln_err_set(err, KILN_EINVAL, field, "%s: CPU %ld in \"%.64s\" is beyond the %d CPUs a "
                                "process can be bound to", field, hi, list, CPU_SETSIZE);
        if (hi < lo)
            return kiln_err_set(err, KILN_EINVAL, field, "%s: the range %ld-%ld in \"%.64s\" must run upwards",
                                field, lo, hi, list);
        for (long c = lo; c <= hi; c++)
            CPU_SET((int)c, out);
        if (!*end)
            return 0;
        p = end + 1;
    }
    CPU_ZERO(out);
    return kiln_err_set(err, KILN_EINVAL, field,
                        "%s must be CPU numbers and ranges separated by commas, such as \"0-3,8\", not \"%.64s\"",
                        field, list);
}

char *rank_cpus_format(const cpu_set_t *s, char *buf, size_t n)
{
    size_t off = 0;
    if (n)
        buf[0] = '\0';
    for (int c = 0; c < CPU_SETSIZE && off < n; c++) {
        if (!CPU_ISSET(c, s))
            continue;
        int e = c;
        while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, s))
            e++;
        int w = e > c ? snprintf(buf + off, n - off, "%s%d-%d", off ? "," : "", c, e)
                      : snprintf(buf + off, n - off, "%s%d", off ? "," : "", c);
        off += w > 0 ? (size_t)w : 0;
        c = e;
    }
    return buf;
}

int rank_cpus_share(const cpu_set_t *all, int parts, int i, cpu_set_t *out)
{
    CPU_ZERO(out);
    int n = CPU_COUNT(all);
    if (parts < 1 || i < 0 || i >= parts || n < parts)
        return 0;
    /* share i holds the CPUs from position lo to hi (exclusive) in ascending order; the first
     * n % parts shares hold one more */
    int base = n / parts, extra = n % parts;
    int lo = i * base + (i < extra ? i : extra), hi = lo + base + (i < extra ? 1 : 0), pos = 0;
    for (int c = 0; c < CPU_SETSIZE && pos < hi; c++)
        if (CPU_ISSET(c, all) && pos++ >= lo)
            CPU_SET(c, out);
    return CPU_COUNT(out);
}

int rank_cpus_allowed(const cpu_set_t *want, const char *field, const char *label, kiln_err_t *err)
{
    cpu_set_t allowed, missing;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
        return 0; /* the kernel says when binding */
    CPU_XOR(&missing, want, &allowed);
    CPU_AND(&missing, &missing, want);
    if (CPU_COUNT(&missing) == 0)
        return 0;
    char m[128], a[128];
    rank_cpus_format(&missing, m, sizeof(m));
    rank_cpus_format(&allowed, a, sizeof(a));
    return kiln_err_set(err, KILN_EINVAL, field, "%s names CPU(s) %s, which this process may not run on (it may "
                        "run on %s)", label, m, a);
}

int rank_cpus_bind(const char *list, cpu_set_t *bound, kiln_err_t *err)
{
    cpu_set_t want;
    int rc = rank_cpus_parse(list, RANK_ENV_CPUS, &want, err);
    if (rc || (rc = rank_cpus_allowed(&want, RANK_ENV_CPUS, RANK_ENV_CPUS, err)))
        return rc;
    /* every thread the process has (libraries may have started some), and with the calling
     * one's mask every thread started after */
    DIR *d = opendir("/proc/self/task");
    int bad = 0;
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            pid_t tid = (pid_t)atoi(de->d_name);
            if (tid > 0 && sched_setaffinity(tid, sizeof(want), &want) != 0 && errno != ESRCH)
                bad = errno; /* ESRCH: the thread has ended since */
        }
        closedir(d);
    }
    if (sched_setaffinity(0, sizeof(want), &want) != 0)
        bad = errno;
    if (bad)
        return kiln_err_set(err, KILN_EINVAL, RANK_ENV_CPUS, "could not bind to %s %s: %s", RANK_ENV_CPUS, list,
                            strerror(bad));
    if (bound && sched_getaffinity(0, sizeof(*bound), bound) != 0)
        *bound = want;
    return 0;
}
