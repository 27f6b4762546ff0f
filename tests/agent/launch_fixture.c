/* launch_fixture.c - the launcher suites' recorder, scripts and assignments (launch_fixture.h). */
#include "tests/agent/launch_fixture.h"
#include "tests/common/harness.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

rec_t R;
char dir[256];

static void on_started(void *ud, const char *job_id, int attempt, bool ok, bool host_fault, const char *reason,
                       int master_port)
{
    rec_t *r = ud;
    (void)job_id, (void)attempt;
    pthread_mutex_lock(&r->mu);
    r->last_port = master_port;
    if (ok)
        r->started++;
    else
        r->start_failed++;
    r->start_host_fault = !ok && host_fault;
    snprintf(r->start_reason, sizeof(r->start_reason), "%s", reason);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void on_line(void *ud, const char *job_id, int attempt, int rank, int stream, int64_t t,
                    const char *line, size_t len)
{
    rec_t *r = ud;
    (void)attempt, (void)t;
    pthread_mutex_lock(&r->mu);
    if (r->nlines == r->lines_cap) {
        r->lines_cap = r->lines_cap ? r->lines_cap * 2 : 64;
        r->lines = realloc(r->lines, (size_t)r->lines_cap * sizeof(*r->lines));
    }
    ev_line_t *l = &r->lines[r->nlines++];
    snprintf(l->job, sizeof(l->job), "%s", job_id);
    l->rank = rank;
    l->stream = stream;
    l->at_us = kiln_mono_us();
    snprintf(l->text, sizeof(l->text), "%s", line);
    if (len > 1000) {
        r->long_len = len;
        r->long_marked = len > strlen(AGENT_TRUNCATED_MARK) &&
                         !strcmp(line + len - strlen(AGENT_TRUNCATED_MARK), AGENT_TRUNCATED_MARK) &&
                         line[0] == 'x' && line[16383] == 'x';
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void on_points(void *ud, const char *job_id, int attempt, const agent_point_t *pts, size_t n)
{
    rec_t *r = ud;
    (void)job_id, (void)attempt;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < n; i++)
        agent_points_push(&r->points, &pts[i]);
    pthread_mutex_unlock(&r->mu);
}

static void on_exit_cb(void *ud, const char *job_id, int attempt, int rank, pid_t pid, int code, int sig,
                       const char *reason)
{
    rec_t *r = ud;
    (void)attempt, (void)pid;
    pthread_mutex_lock(&r->mu);
    if (r->nexits < (int)KILN_ARRAY_LEN(r->exits)) {
        ev_exit_t *e = &r->exits[r->nexits++];
        snprintf(e->job, sizeof(e->job), "%s", job_id);
        e->rank = rank;
        e->code = code;
        e->sig = sig;
        e->at_us = kiln_mono_us();
        snprintf(e->reason, sizeof(e->reason), "%s", reason);
        e->lines_before = r->nlines;
        e->points_before = (int)r->points.n;
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

void lf_setup(void)
{
    memset(&R, 0, sizeof(R));
    pthread_mutex_init(&R.mu, NULL);
    pthread_cond_init(&R.cv, NULL);
    char tmpl[] = "/tmp/kiln-wtest.XXXXXX", real[PATH_MAX];
    cr_assert_not_null(mkdtemp(tmpl));
    cr_assert_not_null(realpath(tmpl, real));
    cr_assert_lt(strlen(real), sizeof(dir));
    memcpy(dir, real, strlen(real) + 1);
}

void lf_teardown(void)
{
    cr_assert(th_rm_tree(dir), "could not remove %s", dir);
    free(R.lines);
    agent_points_free(&R.points);
}

char *lf_script(const char *name, const char *body)
{
    static char path[300];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "#!/bin/sh\n%s", body);
    fclose(f);
    chmod(path, 0755);
    return path;
}

agent_launcher_t *lf_launcher_cfg(const agent_launcher_config_t *cfg)
{
    agent_launch_cbs_t cbs = {on_started, on_line, on_points, on_exit_cb, &R};
    agent_launcher_t *l = NULL;
    kiln_err_t err;
    cr_assert_eq(agent_launcher_create(cfg, &cbs, &l, &err), 0, "%s", err.message);
    return l;
}

agent_launcher_t *lf_launcher(const char *bin, int slots, bool gpu, int cores, const char *const *roots, size_t n)
{
    return lf_launcher_ports(bin, slots, gpu, cores, roots, n, 0, 0);
}

agent_launcher_t *lf_launcher_ports(const char *bin, int slots, bool gpu, int cores, const char *const *roots,
                                    size_t n, int port_lo, int port_hi)
{
    agent_launcher_config_t cfg = {.train_bin = bin, .work_dir = dir, .slots = slots, .gpu = gpu, .cores = cores,
                                   .data_roots = roots, .n_data_roots = n, .port_lo = port_lo, .port_hi = port_hi};
    return lf_launcher_cfg(&cfg);
}

bool lf_wait_exits(int n, int timeout_ms)
{
    struct timespec ts;
    kiln_deadline_in(&ts, timeout_ms);
    pthread_mutex_lock(&R.mu);
    while (R.nexits < n)
        if (pthread_cond_timedwait(&R.cv, &R.mu, &ts) != 0)
            break;
    bool ok = R.nexits >= n;
    pthread_mutex_unlock(&R.mu);
    return ok;
}

/* The first line of rank (-1: any) of job (NULL: any) starting with prefix; R.mu held. */
static const ev_line_t *find_line_locked(const char *job, int rank, const char *prefix)
{
    for (int i = 0; i < R.nlines; i++)
        if ((rank < 0 || R.lines[i].rank == rank) && (!job || !strcmp(R.lines[i].job, job)) &&
            !strncmp(R.lines[i].text, prefix, strlen(prefix)))
            return &R.lines[i];
    return NULL;
}

bool lf_wait_line(const char *job, int rank, const char *prefix, int timeout_ms)
{
    struct timespec ts;
    kiln_deadline_in(&ts, timeout_ms);
    pthread_mutex_lock(&R.mu);
    int rc = 0;
    while (!find_line_locked(job, rank, prefix) && rc == 0)
        rc = pthread_cond_timedwait(&R.cv, &R.mu, &ts);
    bool found = find_line_locked(job, rank, prefix) != NULL;
    pthread_mutex_unlock(&R.mu);
    return found;
}

const ev_line_t *lf_find_line(int rank, const char *prefix)
{
    pthread_mutex_lock(&R.mu);
    const ev_line_t *hit = find_line_locked(NULL, rank, prefix);
    pthread_mutex_unlock(&R.mu);
    return hit;
}

/* The NUL-separated contents of /proc/<pid>/<what> into buf; their length, or 0. */
static size_t proc_read(const char *pid, const char *what, char *buf, size_t n)
{
    char path[300];
    snprintf(path, sizeof(path), "/proc/%s/%s", pid, what);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t got = fread(buf, 1, n - 1, f);
    fclose(f);
    buf[got] = '\0';
    return got;
}

pid_t lf_find_process(const char *job, const char *cmd_part)
{
    char want[128], buf[16384];
    snprintf(want, sizeof(want), "KILN_JOB_ID=%s", job);
    DIR *d = opendir("/proc");
    struct dirent *e;
    pid_t found = -1;
    while (d && found < 0 && (e = readdir(d))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        size_t n = proc_read(e->d_name, "cmdline", buf, sizeof(buf));
        bool cmd = false;
        for (size_t i = 0; i < n && !cmd; i += strlen(buf + i) + 1)
            cmd = strstr(buf + i, cmd_part) != NULL;
        if (!cmd)
            continue;
        n = proc_read(e->d_name, "environ", buf, sizeof(buf));
        for (size_t i = 0; i < n && found < 0; i += strlen(buf + i) + 1)
            if (!strcmp(buf + i, want))
                found = atoi(e->d_name);
    }
    if (d)
        closedir(d);
    return found;
}

Kiln__Assignment lf_assignment(const char *job, int attempt, int32_t *ranks, size_t n, const char *spec)
{
    Kiln__Assignment a = KILN__ASSIGNMENT__INIT;
    a.job_id = (char *)job;
    a.attempt = attempt;
    a.spec_json = (char *)spec;
    a.world_size = 8;
    a.ranks = ranks;
    a.n_ranks = n;
    a.node_rank = 1;
    a.nodes = 2;
    a.master_addr = (char *)"10.0.0.7";
    a.master_port = 29500;
    return a;
}
