/* test_ranks.c - end to end with a real kilnd, PostgreSQL and two real agents, ranks that fail
 * while two of them train a job on one agent: a SIGKILLed rank loses the attempt, the agent stops
 * its peer, and the job resumes from its checkpoint on the same worker and completes; with no
 * attempt left it fails naming the rank; a rank exiting 2 (bad data) fails the job at once; a
 * SIGSTOPped rank trips its peer's collective watchdog and the job's reason names it. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tests/e2e/e2e.h"

/* A two-rank job on one agent (agent 0 has the cluster's only two slots on one worker), with
 * `attempts` attempts and a checkpoint every 10 steps; data.train replaced when data is given. */
static void submit_pair(const char *name, int steps, int attempts, const char *data, char *id, size_t idn)
{
    char *text = e2e_spec(name, steps, 1, 2, 4);
    json_t *spec = json_loads(text, 0, NULL);
    free(text);
    json_object_set_new(spec, "retry", json_pack("{s:i}", "max_attempts", attempts));
    json_object_set_new(spec, "checkpoint", json_pack("{s:i}", "every_steps", 10));
    if (data)
        json_object_set_new(json_object_get(spec, "data"), "train", json_string(data));
    text = json_dumps(spec, JSON_COMPACT);
    json_decref(spec);
    json_t *job = e2e_submit(text);
    free(text);
    snprintf(id, idn, "%s", e2e_jstr(job, "id"));
    json_decref(job);
}

/* The reason of the job's first event into `to`, or NULL (caller owns the events object). */
static const char *event_reason(json_t *ev, const char *to)
{
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(ev, "events"), i, e)
        if (!strcmp(e2e_jstr(e, "to_state"), to))
            return e2e_jstr(e, "reason");
    return NULL;
}

/* Whether /dev/shm still holds a region of process pid. */
static bool shm_left(pid_t pid)
{
    char prefix[32];
    int n = snprintf(prefix, sizeof prefix, "%d:", (int)pid);
    DIR *d = opendir("/dev/shm");
    bool found = false;
    struct dirent *de;
    while (d && !found && (de = readdir(d)))
        found = !strncmp(de->d_name, prefix, (size_t)n);
    if (d)
        closedir(d);
    return found;
}

/* Waits up to timeout_ms for pid to be gone. */
static bool wait_gone(pid_t pid, long timeout_ms)
{
    for (long t = 0; t <= timeout_ms; t += 50) {
        if (e2e_pid_gone(pid))
            return true;
        usleep(50000);
    }
    return false;
}

/* Freezes the job's two ranks at step >= `step` and returns them: rank 0 in pids[0], rank 1 in
 * pids[1]; worker (128 bytes) gets the worker they run on. */
static void freeze_pair(const char *id, long step, pid_t pids[2], char *worker)
{
    pid_t ranks[E2E_MAX_RANKS];
    int n = 0;
    json_t *job = e2e_freeze_at_step(id, step, 120000, ranks, &n);
    json_t *ws = json_object_get(job, "workers");
    cr_assert_eq(json_array_size(ws), 1, "a two-rank job on one node: %s", e2e_dump(job));
    snprintf(worker, 128, "%s", json_string_value(json_array_get(ws, 0)));
    json_decref(job);
    cr_assert_eq(n, 2, "%d rank processes for a two-rank job", n);
    pids[0] = e2e_rank_pid(id, 0);
    pids[1] = e2e_rank_pid(id, 1);
    cr_assert(pids[0] > 0 && pids[1] > 0 && pids[0] != pids[1], "ranks %d and %d", (int)pids[0], (int)pids[1]);
}

#define PAIR_STEPS 300

Test(e2e_ranks, killed_rank_restarts_the_job_from_its_checkpoint, .init = e2e_setup, .fini = e2e_teardown,
     .timeout = 240)
{
    char id[64];
    submit_pair("e2e-rank-killed", PAIR_STEPS, 3, NULL, id, sizeof id);
    pid_t pids[2];
    char worker[128];
    freeze_pair(id, 15, pids, worker);
    int agent = e2e_agent_of_job(id);
    cr_assert_eq(agent, 0, "the two-rank job is not on the two-slot agent");
    char ckpt[400];
    snprintf(ckpt, sizeof ckpt, "%s/jobs/%s/checkpoints", e2e_cl->work_dir[agent], id);
    cr_assert_gt(e2e_count_files(ckpt), 0, "no checkpoint in %s by step 15", ckpt);

    /* Rank 1 dies; rank 0 stays frozen: only the agent can end it now (SIGTERM + SIGCONT). */
    cr_assert_eq(kill(pids[1], SIGKILL), 0);
    cr_assert(wait_gone(pids[0], 30000), "the agent did not stop rank 0 (pid %d) after rank 1 died", (int)pids[0]);
    cr_assert(!shm_left(pids[1]), "rank 1's shm region is still in /dev/shm");

    json_t *job = e2e_wait_state(id, TH_JOB_ENDED, 180000);
    cr_assert_str_eq(e2e_jstr(job, "state"), "COMPLETED", "ended %s: %s", e2e_jstr(job, "state"), e2e_jstr(job, "reason"));
    cr_assert_eq(json_integer_value(json_object_get(job, "attempt")), 2, "%s", e2e_dump(job));
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(job, "progress"), "step")), PAIR_STEPS);
    json_t *workers = json_object_get(job, "workers");
    cr_assert_str_eq(json_string_value(json_array_get(workers, 0)), worker,
                     "attempt 2 is not on the same worker: %s", e2e_dump(workers));
    json_decref(job);

    json_t *ev = e2e_events(id);
    char states[512];
    e2e_event_states(ev, states, sizeof states);
    cr_assert(strstr(states, "RUNNING,RESTARTING,SCHEDULED,STARTING,RUNNING,COMPLETED"), "events: %s", states);
    const char *why = event_reason(ev, "RESTARTING");
    cr_assert(why && strstr(why, "rank 1 ") && strstr(why, "signal 9") && strstr(why, worker),
              "the RESTARTING reason does not name rank 1, the signal and the worker: %s", why ? why : "(none)");
    json_decref(ev);

    /* Attempt 2 resumed from attempt 1's checkpoint, not from scratch. */
    char path[160], want[600];
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?limit=10000", id);
    snprintf(want, sizeof want, "resumed from %s/ckpt_", ckpt);
    json_t *logs = e2e_get(path);
    bool resumed = false;
    size_t i;
    json_t *l;
    json_array_foreach(json_object_get(logs, "lines"), i, l)
        resumed |= json_integer_value(json_object_get(l, "attempt")) == 2 && strstr(e2e_jstr(l, "line"), want);
    json_decref(logs);
    cr_assert(resumed, "attempt 2 never logged \"%s...\"", want);
    e2e_pass();
}

Test(e2e_ranks, killed_rank_without_attempts_left_fails_the_job_naming_it, .init = e2e_setup,
     .fini = e2e_teardown, .timeout = 240)
{
    char id[64];
    submit_pair("e2e-rank-killed-once", 100000, 1, NULL, id, sizeof id);
    pid_t pids[2];
    char worker[128];
    freeze_pair(id, 3, pids, worker);
    cr_assert_eq(kill(pids[1], SIGKILL), 0);
    json_t *job = e2e_wait_state(id, "RESTARTING" TH_OR_ENDED, 60000);
    cr_assert_str_eq(e2e_jstr(job, "state"), "FAILED", "%s: %s", e2e_jstr(job, "state"), e2e_jstr(job, "reason"));
    const char *reason = e2e_jstr(job, "reason");
    cr_assert(strstr(reason, "rank 1 ") && strstr(reason, "signal 9"), "the reason does not name rank 1: %s", reason);
    json_decref(job);
    /* The agent stopped the other rank and both slots are free again. */
    cr_assert(wait_gone(pids[0], 30000), "rank 0 (pid %d) still runs", (int)pids[0]);
    bool freed = false;
    for (int t = 0; t < 100 && !freed; t++) {
        json_t *ws = e2e_get("/v1/workers");
        size_t i;
        json_t *w;
        json_array_foreach(json_object_get(ws, "workers"), i, w)
            if (!strcmp(e2e_jstr(w, "id"), worker))
                freed = json_integer_value(json_object_get(w, "slots_free")) == 2;
        json_decref(ws);
        if (!freed)
            usleep(100000);
    }
    cr_assert(freed, "worker %s did not get its slots back", worker);
    json_t *ev = e2e_events(id);
    cr_assert_null(event_reason(ev, "RESTARTING"), "restarted without attempts left: %s", e2e_dump(ev));
    json_decref(ev);
    e2e_pass();
}

Test(e2e_ranks, rank_exiting_2_fails_the_job_at_once, .init = e2e_setup, .fini = e2e_teardown, .timeout = 240)
{
    /* Text too short for one sequence, inside a data root: kilnd and the agent accept the path,
     * kiln-train refuses the data (exit code 2), and no attempt would do better. */
    char data[400];
    snprintf(data, sizeof data, "%s/shared-checkpoints/tiny.txt", e2e_cl->dir);
    FILE *f = fopen(data, "w");
    cr_assert_not_null(f);
    fputs("too short\n", f);
    fclose(f);
    char id[64];
    submit_pair("e2e-rank-bad-data", 100, 3, data, id, sizeof id);
    json_t *job = e2e_wait_state(id, "RESTARTING" TH_OR_ENDED, 120000);
    cr_assert_str_eq(e2e_jstr(job, "state"), "FAILED", "%s: %s", e2e_jstr(job, "state"), e2e_jstr(job, "reason"));
    const char *reason = e2e_jstr(job, "reason");
    cr_assert(strstr(reason, "code 2 (bad spec or data)") && strstr(reason, "data.train"), "%s", reason);
    cr_assert_eq(json_integer_value(json_object_get(job, "attempt")), 1);
    json_decref(job);
    json_t *ev = e2e_events(id);
    char states[512];
    cr_assert_null(strstr(e2e_event_states(ev, states, sizeof states), "RESTARTING"), "events: %s", states);
    json_decref(ev);
    e2e_pass();
}

Test(e2e_ranks, stopped_rank_trips_the_watchdog_naming_it, .init = e2e_setup_short_watchdog,
     .fini = e2e_teardown, .timeout = 240)
{
    char id[64];
    submit_pair("e2e-rank-stalled", 100000, 1, NULL, id, sizeof id);
    pid_t pids[2];
    char worker[128];
    freeze_pair(id, 3, pids, worker);
    /* Rank 1 stays stopped: alive (its sockets open) but silent. Rank 0 goes on into its next
     * collective and waits on rank 1 until the watchdog fires. */
    time_t t0 = time(NULL);
    kill(pids[0], SIGCONT);
    json_t *job = e2e_wait_state(id, "RESTARTING" TH_OR_ENDED, 90000);
    long took = (long)(time(NULL) - t0);
    cr_assert_str_eq(e2e_jstr(job, "state"), "FAILED", "%s: %s", e2e_jstr(job, "state"), e2e_jstr(job, "reason"));
    const char *reason = e2e_jstr(job, "reason");
    char want[64];
    snprintf(want, sizeof want, "KILN_COMM_WATCHDOG_S=%d", E2E_WATCHDOG_S);
    cr_assert(strstr(reason, "rank 0 ") && strstr(reason, "no progress") && strstr(reason, "waiting on rank 1") &&
                  strstr(reason, want),
              "the reason does not say rank 0 waited on rank 1 past the watchdog (%s): %s", want, reason);
    cr_assert_geq(took, E2E_WATCHDOG_S - 1, "failed after %ld s, before the watchdog's %d s", took, E2E_WATCHDOG_S);
    json_decref(job);
    /* The agent ended the stopped rank too (SIGTERM and SIGCONT, then SIGKILL after the grace). */
    cr_assert(wait_gone(pids[1], 30000), "the stopped rank 1 (pid %d) was left behind", (int)pids[1]);
    e2e_pass();
}
