/* launch_fixture.h - what the launcher suites share: a recorder for the launcher's callbacks
 * (lines, points, exits, start results, each stamped with when it arrived), a temporary directory
 * holding shell scripts that stand in for kiln-train, and assignment builders. Test-only. */
#ifndef KILN_TEST_LAUNCH_FIXTURE_H
#define KILN_TEST_LAUNCH_FIXTURE_H

#include "agent/agent.h"

#include <pthread.h>

typedef struct ev_line {
    char job[64];
    int rank, stream;
    int64_t at_us;     /* monotonic time the callback ran */
    char text[256];
} ev_line_t;

typedef struct ev_exit {
    char job[64];
    int rank, code, sig;
    char reason[256];
    int64_t at_us;     /* monotonic time the callback ran */
    int lines_before;  /* lines seen when the exit arrived */
    int points_before;
} ev_exit_t;

typedef struct rec {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ev_line_t *lines;
    int nlines, lines_cap;
    agent_points_t points;
    ev_exit_t exits[16];
    int nexits;
    int started, start_failed;
    int last_port;     /* the rendezvous port of the last start */
    char start_reason[600];
    bool start_host_fault;  /* the last start failed for a fault of the host */
    size_t long_len;
    bool long_marked;
} rec_t;

extern rec_t R;
extern char dir[256];  /* the test's directory (resolved); the launcher's work dir */

/* .init / .fini of the launcher suites: R reset, dir created / removed. */
void lf_setup(void);
void lf_teardown(void);
/* Writes dir/name, a "#!/bin/sh" script with body, executable. Returns its path (static). */
char *lf_script(const char *name, const char *body);
/* A launcher on dir with the recorder's callbacks and data roots roots[0..n). */
agent_launcher_t *lf_launcher(const char *bin, int slots, bool gpu, int cores, const char *const *roots, size_t n);
/* The same with the rendezvous ports port_lo..port_hi. */
agent_launcher_t *lf_launcher_ports(const char *bin, int slots, bool gpu, int cores, const char *const *roots,
                                    size_t n, int port_lo, int port_hi);
/* A launcher with the recorder's callbacks and the whole configuration given. */
agent_launcher_t *lf_launcher_cfg(const agent_launcher_config_t *cfg);
/* Waits until n exits arrived; false after timeout_ms. */
bool lf_wait_exits(int n, int timeout_ms);
/* The first line of rank starting with prefix, or NULL. Call with R.mu not held. */
const ev_line_t *lf_find_line(int rank, const char *prefix);
/* Waits until rank (-1: any) of job (NULL: any) has printed a line starting with prefix (a script
 * saying it is ready: its traps are set, its files written); false after timeout_ms. */
bool lf_wait_line(const char *job, int rank, const char *prefix, int timeout_ms);
/* The pid (as this process sees it) of a process whose environment holds KILN_JOB_ID=job and
 * whose command line holds cmd_part, or -1. A rank in a sandbox has a pid of its own there ($$),
 * so tests find it here. */
pid_t lf_find_process(const char *job, const char *cmd_part);
/* An assignment of job on this agent: ranks[0..n), world 8, node 1 of 2, master 10.0.0.7:29500. */
Kiln__Assignment lf_assignment(const char *job, int attempt, int32_t *ranks, size_t n, const char *spec);

#endif
