/* test_chaos.c - 20 small training jobs on two kilnd replicas and two agents while, at random
 * (but seeded) moments for a bounded time, kilnd replicas and agents are SIGKILLed and started
 * again and PostgreSQL crashes and comes back. Every job is submitted with an Idempotency-Key
 * and retried until kilnd acknowledges it. Then: all 20 complete, no acknowledged job is lost
 * or duplicated, and each metric step (and each step's log line) is stored once per attempt.
 * KILN_CHAOS_SEED picks the seed (printed; the default is fixed), KILN_CHAOS_S the seconds of
 * chaos (default 40). */
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

#define CHAOS_JOBS 20

/* One REST call to whichever replica answers (the test's own calls face the chaos too):
 * returns the reply (caller owns) with *status, or NULL when neither answered. */
static json_t *call_any(const char *method, const char *path, const char *body, const char *header, long *status)
{
    for (int i = 0; i < e2e_cl->nkilnd; i++) {
        if (e2e_replica_pid(i) <= 0)
            continue;
        char url[512];
        snprintf(url, sizeof url, "%s%s", i ? e2e_cl->url1 : e2e_cl->url0, path);
        const char *hdrs[2] = {header, NULL};
        char *out = NULL;
        long st = 0;
        if (th_http(method, url, body, header ? hdrs : NULL, &st, &out, 5000) == 0 && st > 0 && st < 500) {
            json_t *j = json_loads(out, 0, NULL);
            free(out);
            *status = st;
            return j ? j : json_object();
        }
        free(out);
    }
    return NULL;
}

typedef struct chaos {
    unsigned seed;
    int down_kilnd[2];           /* 1 while a replica is down */
    double kilnd_back_at[2];
    double agent_back_at[2];
    double pg_back_at;
    bool pg_down;
    int kills_kilnd, kills_agent, pg_crashes;
} chaos_t;

static int rnd(chaos_t *c, int n)
{
    return (int)(rand_r(&c->seed) % (unsigned)n);
}

/* Brings back what is due, then maybe breaks something new (at most one replica down at a time,
 * so that the clients and agents always have a kilnd to talk to, once PostgreSQL is back). */
static void chaos_step(chaos_t *c, double now, bool allow_new)
{
    if (c->pg_down && now >= c->pg_back_at) {
        e2e_pg_resume();
        c->pg_down = false;
    }
    /* a kilnd starts only with its database up (a supervisor would restart it until then) */
    for (int i = 0; i < 2 && !c->pg_down; i++)
        if (c->down_kilnd[i] && now >= c->kilnd_back_at[i]) {
            e2e_replica_start(i);
            c->down_kilnd[i] = 0;
        }
    for (int i = 0; i < E2E_AGENTS; i++)
        if (c->agent_back_at[i] > 0 && now >= c->agent_back_at[i]) {
            e2e_agent_restart(i);
            c->agent_back_at[i] = 0;
        }
    if (!allow_new)
        return;
    int what = rnd(c, 10);
    if (what < 4) {
        int i = rnd(c, 2);
        if (!c->down_kilnd[i] && !c->down_kilnd[1 - i]) {
            e2e_replica_signal(i, SIGKILL);
            c->down_kilnd[i] = 1;
            c->kilnd_back_at[i] = now + 0.5 + rnd(c, 1500) / 1000.0;
            c->kills_kilnd++;
        }
    } else if (what < 7) {
        int i = rnd(c, E2E_AGENTS);
        if (c->agent_back_at[i] == 0) {
            e2e_agent_signal(i, SIGKILL);
            c->agent_back_at[i] = now + 0.3 + rnd(c, 1500) / 1000.0;
            c->kills_agent++;
        }
    } else if (what < 8 && !c->pg_down) {
        e2e_pg_crash();
        c->pg_down = true;
        c->pg_back_at = now + 0.5 + rnd(c, 1500) / 1000.0;
        c->pg_crashes++;
    }
}

static char *job_spec(int i, int max_steps)
{
    char name[32];
    snprintf(name, sizeof name, "chaos-%02d", i);
    char *text = e2e_spec(name, max_steps, 1, 1, 4);
    json_t *spec = json_loads(text, 0, NULL);
    free(text);
    char shared[300];
    snprintf(shared, sizeof shared, "%s/shared-checkpoints", e2e_cl->dir);
    json_object_set_new(spec, "retry", json_pack("{s:i}", "max_attempts", 20));
    json_object_set_new(spec, "checkpoint", json_pack("{s:i, s:s}", "every_steps", 100, "path", shared));
    text = json_dumps(spec, JSON_COMPACT);
    json_decref(spec);
    return text;
}

Test(e2e_chaos, twenty_jobs_survive_kilnd_agents_and_postgres_dying, .init = e2e_setup_chaos,
     .fini = e2e_teardown, .timeout = 900)
{
    const char *seed_env = getenv("KILN_CHAOS_SEED");
    const char *secs_env = getenv("KILN_CHAOS_S");
    chaos_t c = {.seed = seed_env ? (unsigned)strtoul(seed_env, NULL, 10) : 20261124u};
    double chaos_s = secs_env ? atof(secs_env) : 40.0;
    fprintf(stderr, "chaos: seed %u, %.0f s of faults (KILN_CHAOS_SEED, KILN_CHAOS_S)\n", c.seed, chaos_s);
    unsigned job_seed = c.seed ^ 0x9e3779b9u;
    int steps[CHAOS_JOBS];
    char ids[CHAOS_JOBS][64];
    memset(ids, 0, sizeof ids);
    for (int i = 0; i < CHAOS_JOBS; i++)
        steps[i] = 300 + (int)(rand_r(&job_seed) % 1500);

    /* The jobs go in one by one during the chaos, each retried with its key until acknowledged. */
    double start = kiln_mono_s(), next_fault = start + 1.0;
    int submitted = 0;
    while (kiln_mono_s() - start < chaos_s || submitted < CHAOS_JOBS) {
        double now = kiln_mono_s();
        bool faults = now - start < chaos_s;
        if (now >= next_fault || !faults) {
            chaos_step(&c, now, faults);
            next_fault = now + 0.5 + rnd(&c, 1500) / 1000.0;
        }
        if (submitted < CHAOS_JOBS && now - start >= submitted * (chaos_s / 2) / CHAOS_JOBS) {
            char *spec = job_spec(submitted, steps[submitted]);
            char key[64];
            snprintf(key, sizeof key, "Idempotency-Key: chaos-key-%02d", submitted);
            long st = 0;
            json_t *r = call_any("POST", "/v1/jobs", spec, key, &st);
            free(spec);
            if (r && (st == 201 || st == 200)) {
                snprintf(ids[submitted], 64, "%s", e2e_jstr(r, "id"));
                submitted++;
            } else if (r) { /* call_any answers NULL for a 5xx (retried): anything else is a refusal */
                char *s = json_dumps(r, JSON_COMPACT);
                cr_assert_fail("submission %d was refused: HTTP %ld %s", submitted, st, s);
                free(s);
            }
            json_decref(r);
        }
        usleep(50000);
        if (now - start > chaos_s + 120)
            cr_assert_fail("only %d of %d jobs were acknowledged", submitted, CHAOS_JOBS);
    }
    /* Everything back up. */
    chaos_step(&c, kiln_mono_s() + 1000, false);
    fprintf(stderr, "chaos: %d kilnd kill(s), %d agent kill(s), %d PostgreSQL crash(es)\n", c.kills_kilnd,
            c.kills_agent, c.pg_crashes);
    cr_assert_gt(c.kills_kilnd + c.kills_agent + c.pg_crashes, 3, "the chaos did little");

    /* All 20 complete. */
    double deadline = kiln_mono_s() + 400;
    for (int i = 0; i < CHAOS_JOBS; i++) {
        char path[160];
        snprintf(path, sizeof path, "/v1/jobs/%.63s", ids[i]);
        for (;;) {
            long st = 0;
            json_t *j = call_any("GET", path, NULL, NULL, &st);
            const char *state = j ? e2e_jstr(j, "state") : "";
            if (!strcmp(state, "COMPLETED")) {
                json_decref(j);
                break;
            }
            char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
            cr_assert(!th_state_in(state, TH_JOB_ENDED), "job %d: %s", i, s ? s : "");
            cr_assert_lt(kiln_mono_s(), deadline, "job %d did not complete: %s", i, s ? s : "(no answer)");
            free(s);
            json_decref(j);
            usleep(500000);
        }
    }

    /* None lost or duplicated: exactly the 20 acknowledged jobs exist, one per key. */
    long st = 0;
    json_t *list = call_any("GET", "/v1/jobs?page_size=500", NULL, NULL, &st);
    cr_assert_not_null(list);
    cr_assert_eq(json_array_size(json_object_get(list, "jobs")), CHAOS_JOBS, "%zu jobs exist",
                 json_array_size(json_object_get(list, "jobs")));
    size_t k;
    json_t *job;
    json_array_foreach(json_object_get(list, "jobs"), k, job) {
        int name_i = atoi(e2e_jstr(job, "name") + 6);
        cr_assert(name_i >= 0 && name_i < CHAOS_JOBS && !strcmp(e2e_jstr(job, "id"), ids[name_i]),
                  "job %s (%s) is not the one its key was acknowledged with", e2e_jstr(job, "id"), e2e_jstr(job, "name"));
    }
    json_decref(list);

    /* Each metric step and each step's log line stored once per attempt; the final attempt has
     * every step from where it resumed to the end. */
    static unsigned char seen[24][2000];
    for (int i = 0; i < CHAOS_JOBS; i++) {
        memset(seen, 0, sizeof seen);
        char path[200];
        snprintf(path, sizeof path, "/v1/jobs/%.63s/metrics?name=train_loss&attempt=all&max_points=100000", ids[i]);
        json_t *m = call_any("GET", path, NULL, NULL, &st);
        cr_assert(m && st == 200);
        json_t *pts = json_object_get(json_array_get(json_object_get(m, "metrics"), 0), "points");
        snprintf(path, sizeof path, "/v1/jobs/%.63s", ids[i]);
        json_t *job = call_any("GET", path, NULL, NULL, &st);
        cr_assert(job && st == 200);
        int final = (int)e2e_jint(job, "attempt"), first_final = 0;
        json_decref(job);
        size_t n;
        json_t *p;
        json_array_foreach(pts, n, p) {
            int a = (int)e2e_jint(p, "attempt"), s = (int)e2e_jint(p, "step");
            cr_assert(a >= 1 && a < 24 && s >= 1 && s < 2000, "job %d: point %d/%d", i, a, s);
            cr_assert_eq(seen[a][s], 0, "job %d: step %d of attempt %d stored twice", i, s, a);
            seen[a][s] = 1;
            if (a == final && (first_final == 0 || s < first_final))
                first_final = s;
        }
        size_t n_points = json_array_size(pts);
        /* The final attempt has every step from where it resumed (a checkpoint every 100 steps,
         * or where a stopped rank wrote one) to the end. (One that resumed from a checkpoint of
         * the last step trains nothing.) */
        for (int s = first_final; first_final > 0 && s <= steps[i]; s++)
            cr_assert_eq(seen[final][s], 1, "job %d: step %d of its final attempt %d is missing", i, s, final);
        json_decref(m);

        memset(seen, 0, sizeof seen);
        long long after = 0;
        int step_lines = 0;
        bool lost_notice = false; /* the next agent's line saying what a killed one could not send */
        for (;;) {
            snprintf(path, sizeof path, "/v1/jobs/%.63s/logs?limit=10000&after_seq=%lld", ids[i], after);
            json_t *page = call_any("GET", path, NULL, NULL, &st);
            cr_assert(page && st == 200);
            json_t *lines = json_object_get(page, "lines");
            json_array_foreach(lines, n, p) {
                lost_notice |= strstr(e2e_jstr(p, "line"), "[kiln-agent]") && strstr(e2e_jstr(p, "line"), "were lost");
                int s = 0, total = 0;
                if (sscanf(e2e_jstr(p, "line"), "step %d/%d |", &s, &total) == 2 && s > 0 && s < 2000) {
                    int a = (int)e2e_jint(p, "attempt");
                    cr_assert_eq(seen[a][s], 0, "job %d: the line of step %d of attempt %d is stored twice", i, s, a);
                    seen[a][s] = 1;
                    step_lines++;
                }
            }
            after = (long long)e2e_jint(page, "next_since_seq");
            size_t got = json_array_size(lines);
            json_decref(page);
            if (got < 10000)
                break;
        }
        /* Nothing stored at all only where an attempt trained to the end and its agent was killed
         * with all of it in its outbox (kilnd or PostgreSQL down), so that the next attempt
         * resumed from the last step's checkpoint: the job's log then says what was lost. */
        cr_assert(n_points > 0 || lost_notice, "job %d: no train_loss point stored, and no line says any was lost", i);
        cr_assert(step_lines > 0 || lost_notice, "job %d: no \"step N/M |\" line in its log, and no line says any was lost", i);
    }
    e2e_pass();
}
