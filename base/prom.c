/* prom.c - the process's Prometheus registry and the text exposition format (0.0.4): counters,
 * gauges and histograms updated under one lock, written in name order with the process_*
 * metrics of /proc/self and kiln_build_info. Not an HTTP server: kilnd's REST front end and
 * kiln-agent's metrics port serve what prom_write() produces. */
#include <ctype.h>
#include <dirent.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/base.h"

const double prom_latency_buckets[13] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                         0.25,  0.5,    1,     2.5,  5,     10};
const double prom_wait_buckets[11] = {1, 5, 15, 30, 60, 300, 900, 1800, 3600, 14400, 86400};

struct prom_series {
    char *labels;                     /* rendered, heap */
    double value;                     /* counters, gauges; histograms: the sum */
    uint64_t count;                   /* histograms */
    uint64_t buckets[PROM_MAX_BUCKETS];
};

static pthread_mutex_t prom_lock = PTHREAD_MUTEX_INITIALIZER;
static prom_family_t *prom_families; /* sorted by name */

static void prom_register_locked(prom_family_t *f)
{
    if (f->registered)
        return;
    if (f->nbuckets > PROM_MAX_BUCKETS)
        abort(); /* a family defined with too many buckets: a bug */
    prom_family_t **pp = &prom_families;
    while (*pp && strcmp((*pp)->name, f->name) < 0)
        pp = &(*pp)->next;
    f->next = *pp;
    *pp = f;
    f->registered = true;
}

void prom_register(prom_family_t *f)
{
    pthread_mutex_lock(&prom_lock);
    prom_register_locked(f);
    pthread_mutex_unlock(&prom_lock);
}

/* The series of labels, created on first use; NULL when memory ran out. Under prom_lock. */
static prom_series_t *prom_series_get(prom_family_t *f, const char *labels)
{
    prom_register_locked(f);
    if (!labels)
        labels = "";
    for (int i = 0; i < f->nseries; i++)
        if (!strcmp(f->series[i].labels, labels))
            return &f->series[i];
    if (f->nseries == f->cap) {
        int cap = f->cap ? f->cap * 2 : 8;
        prom_series_t *ns = realloc(f->series, (size_t)cap * sizeof(*ns));
        if (!ns)
            return NULL;
        f->series = ns;
        f->cap = cap;
    }
    prom_series_t *s = &f->series[f->nseries];
    memset(s, 0, sizeof(*s));
    if (!(s->labels = strdup(labels)))
        return NULL;
    f->nseries++;
    return s;
}

void prom_add(prom_family_t *f, const char *labels, double v)
{
    pthread_mutex_lock(&prom_lock);
    prom_series_t *s = prom_series_get(f, labels);
    if (s)
        s->value += v;
    pthread_mutex_unlock(&prom_lock);
}

void prom_observe(prom_family_t *f, const char *labels, double v)
{
    pthread_mutex_lock(&prom_lock);
    prom_series_t *s = prom_series_get(f, labels);
    if (s) {
        s->value += v;
        s->count++;
        for (int i = 0; i < f->nbuckets; i++)
            if (v <= f->buckets[i])
                s->buckets[i]++; /* cumulative, as the format wants */
    }
    pthread_mutex_unlock(&prom_lock);
}

char *prom_label(char *out, size_t n, const char *name, const char *value)
{
    size_t o = 0;
    int w = snprintf(out, n, "%s=\"", name);
    if (w < 0 || (size_t)w >= n) {
        if (n)
            out[0] = '\0';
        return out;
    }
    o = (size_t)w;
    for (const char *p = value ? value : ""; *p && o + 3 < n; p++) {
        if (*p == '\\' || *p == '"') {
            out[o++] = '\\';
            out[o++] = *p;
        } else if (*p == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
        } else {
            out[o++] = *p;
        }
    }
    if (o + 1 < n)
        out[o++] = '"';
    out[o] = '\0';
    return out;
}

char *prom_label_lower(char *out, size_t n, const char *name, const char *value)
{
    char low[128];
    size_t i = 0;
    for (const char *p = value ? value : ""; *p && i + 1 < sizeof low; p++)
        low[i++] = (char)tolower((unsigned char)*p);
    low[i] = '\0';
    return prom_label(out, n, name, low);
}

void prom_printf(prom_buf_t *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        size_t room = b->cap - b->len;
        va_list ap;
        va_start(ap, fmt);
        int n = b->data ? vsnprintf(b->data + b->len, room, fmt, ap) : -2;
        va_end(ap);
        if (n == -1) {
            b->oom = true;
            return;
        }
        if (n >= 0 && (size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 8192;
        while (n > 0 && cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *nd = realloc(b->data, cap);
        if (!nd) {
            b->oom = true;
            return;
        }
        b->data = nd;
        b->cap = cap;
    }
}

void prom_header(prom_buf_t *b, const char *name, const char *help, prom_type_t type)
{
    static const char *const types[] = {"counter", "gauge", "histogram"};
    prom_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, types[type]);
}

/* name{labels[,extra]} or name{extra} or name. */
static void prom_name(prom_buf_t *b, const char *name, const char *suffix, const char *labels, const char *extra)
{
    bool l = labels && *labels, e = extra && *extra;
    prom_printf(b, "%s%s%s%s%s%s%s", name, suffix, l || e ? "{" : "", l ? labels : "", l && e ? "," : "",
                e ? extra : "", l || e ? "}" : "");
}

static void prom_write_family(prom_buf_t *b, const prom_family_t *f)
{
    prom_header(b, f->name, f->help, f->type);
    for (int i = 0; i < f->nseries; i++) {
        const prom_series_t *s = &f->series[i];
        if (f->type != PROM_HISTOGRAM) {
            prom_name(b, f->name, "", s->labels, NULL);
            prom_printf(b, " %.17g\n", s->value);
            continue;
        }
        for (int k = 0; k < f->nbuckets; k++) {
            char le[48];
            snprintf(le, sizeof le, "le=\"%g\"", f->buckets[k]);
            prom_name(b, f->name, "_bucket", s->labels, le);
            prom_printf(b, " %llu\n", (unsigned long long)s->buckets[k]);
        }
        prom_name(b, f->name, "_bucket", s->labels, "le=\"+Inf\"");
        prom_printf(b, " %llu\n", (unsigned long long)s->count);
        prom_name(b, f->name, "_sum", s->labels, NULL);
        prom_printf(b, " %.17g\n", s->value);
        prom_name(b, f->name, "_count", s->labels, NULL);
        prom_printf(b, " %llu\n", (unsigned long long)s->count);
    }
}

/* process_* as the Prometheus client libraries define them, from /proc/self. */
static void prom_write_process(prom_buf_t *b)
{
    long tick = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    /* Fields after the command name (which may hold spaces) start past the last ')'. */
    const char *p = strrchr(buf, ')');
    unsigned long utime = 0, stime = 0, vsize = 0;
    unsigned long long start = 0;
    long rss = 0;
    if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu %*d %*d %*d %*d %*d %*d %llu %lu %ld",
                    &utime, &stime, &start, &vsize, &rss) == 5) {
        prom_header(b, "process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", PROM_COUNTER);
        prom_printf(b, "process_cpu_seconds_total %.2f\n", (double)(utime + stime) / (double)tick);
        prom_header(b, "process_resident_memory_bytes", "Resident memory size in bytes.", PROM_GAUGE);
        prom_printf(b, "process_resident_memory_bytes %lld\n", (long long)rss * page);
        prom_header(b, "process_virtual_memory_bytes", "Virtual memory size in bytes.", PROM_GAUGE);
        prom_printf(b, "process_virtual_memory_bytes %lu\n", vsize);
        /* start time: boot time (btime of /proc/stat) plus the start in clock ticks */
        FILE *sf = fopen("/proc/stat", "r");
        long long btime = -1;
        char line[256];
        while (sf && fgets(line, sizeof line, sf))
            if (sscanf(line, "btime %lld", &btime) == 1)
                break;
        if (sf)
            fclose(sf);
        if (btime >= 0) {
            prom_header(b, "process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                        PROM_GAUGE);
            prom_printf(b, "process_start_time_seconds %.2f\n", (double)btime + (double)start / (double)tick);
        }
    }
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        long fds = 0;
        struct dirent *e;
        while ((e = readdir(d)))
            fds += e->d_name[0] != '.';
        closedir(d);
        prom_header(b, "process_open_fds", "Number of open file descriptors.", PROM_GAUGE);
        prom_printf(b, "process_open_fds %ld\n", fds - 1); /* less the directory being read */
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        prom_header(b, "process_max_fds", "Maximum number of open file descriptors.", PROM_GAUGE);
        prom_printf(b, "process_max_fds %llu\n", (unsigned long long)rl.rlim_cur);
    }
}

void prom_write(prom_buf_t *b, const char *program)
{
    pthread_mutex_lock(&prom_lock);
    for (const prom_family_t *f = prom_families; f; f = f->next)
        prom_write_family(b, f);
    pthread_mutex_unlock(&prom_lock);
    prom_write_process(b);
    char prog[96];
    prom_header(b, "kiln_build_info", "kiln's version; the value is always 1.", PROM_GAUGE);
    prom_printf(b, "kiln_build_info{%s,version=\"%s\"} 1\n", prom_label(prog, sizeof prog, "program", program),
                KILN_VERSION);
}
