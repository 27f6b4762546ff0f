/* test_faults.c - the control plane keeps its promises under faults, with real kilnd, agents,
 * PostgreSQL and training: two kilnd replicas on one database (a job submitted on one is
 * followed on the other to its end; the leader is SIGKILLed mid-job and the other takes over
 * scheduling and liveness), kilnd paused for longer than the heartbeat timeout (no worker is
 * declared dead), and an agent SIGKILLed mid-job with retries while kilnd is killed and paused
 * (every train_loss step of the final attempt stored once, the earlier attempt's points kept
 * apart by their attempt, and the job's log says how many lines the dead agent lost). */
#include "tests/e2e/e2e.h"
#include "base/base.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/common/harness.h"

/* Submits a tiny GPT job (spec text from e2e_spec, adjusted by edit when not NULL); returns
 * its id in id (64 bytes). */
static void submit(const char *name, int max_steps, void (*edit)(json_t *), char *id)
{
    char *text = e2e_spec(name, max_steps, 1, 1, 4);
    if (edit) {
        json_t *spec = json_loads(text, 0, NULL);
        edit(spec);
        free(text);
        text = json_dumps(spec, JSON_COMPACT);
        json_decref(spec);
    }
    json_t *job = e2e_submit(text);
    free(text);
    snprintf(id, 64, "%s", e2e_jstr(job, "id"));
    json_decref(job);
}

/* Whether any worker is DEAD; fills workers with the reply for messages. */
static bool any_dead(void)
{
    json_t *ws = e2e_get("/v1/workers");
    size_t i;
    json_t *w;
    bool dead = false;
    json_array_foreach(json_object_get(ws, "workers"), i, w)
        dead |= !strcmp(e2e_jstr(w, "state"), "DEAD");
    json_decref(ws);
    return dead;
}

/* Every stored log line of a job (caller owns the array). */
static json_t *stored_lines(const char *id)
{
    json_t *all = json_array();
    long long after = 0;
    for (;;) {
        char path[200];
        snprintf(path, sizeof path, "/v1/jobs/%s/logs?limit=10000&after_seq=%lld", id, after);
        json_t *page = e2e_get(path);
        json_t *lines = json_object_get(page, "lines");
        size_t n = json_array_size(lines);
        json_array_extend(all, lines);
        after = (long long)e2e_jint(page, "next_since_seq");
        json_decref(page);
        if (n < 10000)
            return all;
    }
}

/* ---- two replicas ------------------------------------------------------------------------ */

Test(e2e_faults, replicas_follow_anywhere_and_the_leader_fails_over, .init = e2e_setup_replicas,
     .fini = e2e_teardown, .timeout = 300)
{
    int leader = e2e_leader(15000);
    cr_assert_geq(leader, 0, "no replica leads");
    int other = 1 - leader;

    /* Submitted on the leader, followed on the other replica. */
    e2e_use_replica(leader);
    char id[64];
    submit("e2e-replicas", 600, NULL, id);
    e2e_use_replica(other);
    char out_path[300], err_path[300];
    snprintf(out_path, sizeof out_path, "%s/follow.out", e2e_cl->dir);
    snprintf(err_path, sizeof err_path, "%s/follow.err", e2e_cl->dir);
    pid_t follower = e2e_kiln_bg(out_path, err_path, "logs", "-f", id, NULL);
    cr_assert_gt(follower, 0);
    pid_t ranks[E2E_MAX_RANKS];
    int n_ranks = 0;
    json_decref(e2e_freeze_at_step(id, 5, 120000, ranks, &n_ranks));

    /* The leader dies mid-job; the other replica takes the lead within seconds. */
    double t0 = kiln_mono_s();
    e2e_replica_signal(leader, SIGKILL);
    int now_leader = e2e_leader(15000);
    double took = kiln_mono_s() - t0;
    cr_assert_eq(now_leader, other, "replica %d did not take the lead after replica %d died", other, leader);
    cr_assert_lt(took, 10.0, "the lead moved after %.1f s", took);

    /* The job completes through the surviving replica (the agents move to it). */
    e2e_thaw(ranks, n_ranks);
    json_t *job = e2e_wait_state(id, TH_JOB_ENDED, 180000);
    cr_assert_str_eq(e2e_jstr(job, "state"), "COMPLETED", "%s", e2e_dump(job));
    cr_assert_eq(e2e_jint(job, "attempt"), 1, "no attempt was lost: %s", e2e_dump(job));
    json_decref(job);

    /* The follower on the other replica saw every stored line once, and the end. */
    int st = e2e_wait_exit(follower, 60000);
    char *out = e2e_slurp(out_path), *err = e2e_slurp(err_path);
    cr_assert_eq(st, 0, "kiln logs -f on replica %d exited %d:\n%s\n%s", other, st, out, err);
    json_t *lines = stored_lines(id);
    size_t printed = 0;
    for (const char *p = out; (p = strstr(p, "step ")) != NULL; p++)
        printed++;
    size_t stored_steps = 0;
    size_t i;
    json_t *l;
    json_array_foreach(lines, i, l)
        stored_steps += strstr(e2e_jstr(l, "line"), "step ") != NULL;
    cr_assert_gt(stored_steps, 500, "the job logged its steps");
    cr_assert_eq(printed, stored_steps, "the follower on replica %d printed %zu step lines, %zu are stored",
                 other, printed, stored_steps);
    json_decref(lines);
    free(out);
    free(err);

    /* The new leader schedules: a second job runs to its end. */
    char id2[64];
    submit("e2e-replicas-2", 50, NULL, id2);
    job = e2e_wait_state(id2, TH_JOB_ENDED, 180000);
    cr_assert_str_eq(e2e_jstr(job, "state"), "COMPLETED", "%s", e2e_dump(job));
    json_decref(job);

    /* The dead replica comes back as a follower of the lead, not a second leader. */
    e2e_replica_start(leader);
    for (int i = 0; i < 25; i++) { /* ~5 s: never two leaders, never the wrong one */
        int mask = e2e_leaders();
        cr_assert_eq(mask, 1 << other, "one leader at a time: replica %d (leaders now: mask %d)", other, mask);
        usleep(200000);
    }
    cr_assert(!any_dead(), "no worker was declared dead");
    e2e_pass();
}

/* ---- kilnd paused ---------------------------------------------------------------------------- */

Test(e2e_faults, a_paused_kilnd_declares_no_worker_dead, .init = e2e_setup_fast_heartbeat, .fini = e2e_teardown,
     .timeout = 300)
{
    char id[64];
    submit("e2e-pause", 1500, NULL, id);
    pid_t ranks[E2E_MAX_RANKS];
    int n_ranks = 0;
    json_decref(e2e_freeze_at_step(id, 5, 120000, ranks, &n_ranks));

    /* kilnd stops for well over the heartbeat timeout while the job trains on. */
    pid_t kilnd = e2e_replica_pid(0);
    int pause_ms = 2 * e2e_cl->heartbeat_timeout_ms + 2000;
    cr_assert_eq(kill(kilnd, SIGSTOP), 0);
    e2e_thaw(ranks, n_ranks);
    usleep((useconds_t)pause_ms * 1000);
    cr_assert_eq(kill(kilnd, SIGCONT), 0);

    json_t *job = e2e_wait_state(id, TH_JOB_ENDED, 180000);
    char path[300];
    snprintf(path, sizeof path, "%s/kilnd.log", e2e_cl->dir);
    char *log = e2e_slurp(path);
    /* (a worker marked DEAD registers again at its next heartbeat: kilnd's log is the witness) */
    const char *dead = strstr(log, "marked DEAD");
    cr_assert_null(dead, "a worker was declared dead for kilnd's own pause: %.200s", dead);
    cr_assert(!any_dead(), "a worker was declared dead for kilnd's own pause");
    cr_assert_str_eq(e2e_jstr(job, "state"), "COMPLETED", "%s", e2e_dump(job));
    cr_assert_eq(e2e_jint(job, "attempt"), 1, "%s", e2e_dump(job));
    json_decref(job);
    json_t *ev = e2e_events(id);
    char states[512];
    e2e_event_states(ev, states, sizeof states);
    cr_assert_null(strstr(states, "RESTARTING"), "events: %s", e2e_dump(ev));
    json_decref(ev);
    cr_assert(strstr(log, "did not run for"), "kilnd noticed its own pause");
    free(log);
    e2e_pass();
}

/* ---- an agent killed mid-job, with retries ---------------------------------------------------- */

#define EXACT_STEPS 3000
#define EXACT_CKPT 1000

static void with_retries(json_t *spec)
{
    char shared[300];
    snprintf(shared, sizeof shared, "%s/shared-checkpoints", e2e_cl->dir);
    json_object_set_new(spec, "retry", json_pack("{s:i}", "max_attempts", 3));
    json_object_set_new(spec, "checkpoint", json_pack("{s:i, s:s}", "every_steps", EXACT_CKPT, "path", shared));
}

Test(e2e_faults, an_agent_killed_mid_job_loses_nothing_silently, .init = e2e_setup_fast_heartbeat,
     .fini = e2e_teardown, .timeout = 400)
{
    char id[64];
    submit("e2e-exactly-once", EXACT_STEPS, with_retries, id);
    pid_t ranks[E2E_MAX_RANKS];
    int n_ranks = 0;
    json_decref(e2e_freeze_at_step(id, 100, 120000, ranks, &n_ranks));
    int agent = e2e_agent_of_job(id);
    cr_assert_geq(agent, 0);

    /* kilnd is killed and restarted while the job trains: replies to batches in flight are lost
     * and the agent sends those batches again. */
    e2e_thaw(ranks, n_ranks);
    usleep(150000);
    e2e_kilnd_kill();
    for (int i = 0; i < n_ranks; i++) /* the tiny model would finish while kilnd restarts */
        kill(ranks[i], SIGSTOP);
    e2e_kilnd_start();
    /* Past the checkpoint of step 1000, with every point up to there stored (kilnd reports the
     * step), attempt 1 is frozen again; a retry resumes from that checkpoint, so the steps from
     * 1001 on are trained by both attempts. */
    json_t *job = e2e_freeze_at_step(id, EXACT_CKPT + 5, 120000, ranks, &n_ranks);
    long reached = (long)e2e_jint(json_object_get(job, "progress"), "step");
    json_decref(job);
    cr_assert_lt(reached, 2 * EXACT_CKPT - 300, "attempt 1 ran past the next checkpoint (step %ld)", reached);
    /* Then kilnd pauses, the ranks run a little (their lines and points pile up in the agent's
     * outbox), and the agent dies with them. */
    pid_t kilnd = e2e_replica_pid(0);
    cr_assert_eq(kill(kilnd, SIGSTOP), 0);
    /* until the agent has taken in lines or points it cannot send (its outbox holds them). The
     * ranks run 2 ms at a time and are stopped while the agent's outbox is read, so they cannot
     * reach the next checkpoint meanwhile however fast this machine trains (one 50 ms look with
     * them running took a quiet machine's ranks past step 2000). */
    char murl[64];
    snprintf(murl, sizeof murl, "http://127.0.0.1:%d/metrics", e2e_cl->metrics_port[agent]);
    double queued = 0;
    for (int round = 0; round < 100 && queued <= 0; round++) {
        e2e_thaw(ranks, n_ranks);
        usleep(2000);
        for (int i = 0; i < n_ranks; i++)
            kill(ranks[i], SIGSTOP);
        for (int i = 0; i < 10 && queued <= 0; i++) {
            long st = 0;
            char *body = NULL;
            if (th_http("GET", murl, NULL, NULL, &st, &body, 2000) == 0 && st == 200 && body) {
                const char *q = strstr(body, "\nkiln_agent_outbox_bytes ");
                queued = q ? atof(q + strlen("\nkiln_agent_outbox_bytes ")) : 0;
            }
            free(body);
            if (queued <= 0)
                usleep(20000);
        }
    }
    cr_assert_gt(queued, 0, "the thawed ranks' output never reached the agent's outbox");
    e2e_agent_restart(agent);
    cr_assert_eq(kill(kilnd, SIGCONT), 0);

    job = e2e_wait_state(id, TH_JOB_ENDED, 300000);
    cr_assert_str_eq(e2e_jstr(job, "state"), "COMPLETED", "%s", e2e_dump(job));
    int final = (int)e2e_jint(job, "attempt");
    cr_assert_geq(final, 2, "the attempt the agent died with was lost and retried: %s", e2e_dump(job));
    json_decref(job);

    /* Every train_loss point, each with its attempt. */
    char path[200];
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?name=train_loss&attempt=all&max_points=100000", id);
    json_t *m = e2e_get(path);
    json_t *pts = json_object_get(json_array_get(json_object_get(m, "metrics"), 0), "points");
    cr_assert_gt(json_array_size(pts), 0, "%s", e2e_dump(m));
    static unsigned char seen[16][EXACT_STEPS + 1]; /* [attempt][step]: times stored */
    memset(seen, 0, sizeof seen);
    int64_t first_final = -1, last_earlier = -1;
    size_t i;
    json_t *p;
    json_array_foreach(pts, i, p) {
        int a = (int)e2e_jint(p, "attempt");
        json_int_t step = e2e_jint(p, "step");
        cr_assert(a >= 1 && a <= final && a < 16, "a point of attempt %d: %s", a, e2e_dump(p));
        cr_assert(step >= 1 && step <= EXACT_STEPS, "step %lld", (long long)step);
        cr_assert_lt(seen[a][step], 1, "step %lld of attempt %d is stored twice", (long long)step, a);
        seen[a][step]++;
        if (a == final && (first_final < 0 || step < first_final))
            first_final = step;
        if (a < final && step > last_earlier)
            last_earlier = step;
    }
    for (int s = (int)first_final; s <= EXACT_STEPS; s++)
        cr_assert_eq(seen[final][s], 1, "step %d of the final attempt %d is missing", s, final);
    cr_assert_geq(last_earlier, reached, "the lost attempt's points up to step %ld are kept", reached);
    cr_assert_leq(first_final, EXACT_CKPT + 1, "the final attempt resumed from the checkpoint of step %d (first step %lld)",
                  EXACT_CKPT, (long long)first_final);
    for (long st = first_final; st <= reached; st++)
        cr_assert(seen[1][st] == 1 && seen[final][st] == 1,
                  "step %ld was trained by attempts 1 and %d: both points are kept, told apart by attempt", st, final);
    json_decref(m);

    /* attempt=latest: each step once, the final attempt's value where it trained it again. */
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?name=train_loss&attempt=latest&max_points=100000", id);
    m = e2e_get(path);
    pts = json_object_get(json_array_get(json_object_get(m, "metrics"), 0), "points");
    json_int_t prev = 0;
    json_array_foreach(pts, i, p) {
        cr_assert_gt(e2e_jint(p, "step"), prev, "attempt=latest has one point per step");
        prev = e2e_jint(p, "step");
        if (prev >= first_final)
            cr_assert_eq(e2e_jint(p, "attempt"), final);
    }
    cr_assert_eq(prev, EXACT_STEPS);
    json_decref(m);

    /* The job's log says what the dead agent took in and could not send. */
    json_t *lines = stored_lines(id);
    bool notice = false;
    json_t *l;
    json_array_foreach(lines, i, l)
        notice |= strstr(e2e_jstr(l, "line"), "[kiln-agent]") && strstr(e2e_jstr(l, "line"), "were lost") &&
                  e2e_jint(l, "attempt") < final;
    cr_assert(notice, "no line in the job's log says what was lost");
    json_decref(lines);
    e2e_pass();
}
