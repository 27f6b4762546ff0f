/* test_trust.c - agents earn trust, end to end: a real kilnd with --agent-approval and mutual TLS,
 * two real kiln-agents that register PENDING, a job that waits until a cluster admin approves one
 * with `kiln workers approve` and then runs on it, `kiln workers` showing how each registered,
 * and `kiln workers remove --ban` taking the other out for good; and an agent that kilnd's
 * registration limit refuses backing off until it gets in. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/common/harness.h"
#include "tests/e2e/e2e.h"

/* The worker as GET /v1/workers lists it (NULL when not listed); caller decrefs. */
static json_t *listed(const char *id)
{
    json_t *ws = e2e_get("/v1/workers"), *found = NULL;
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(ws, "workers"), i, w)
        if (!strcmp(e2e_jstr(w, "id"), id))
            found = json_incref(w);
    json_decref(ws);
    return found;
}

/* Waits until the agent's log holds needle (up to timeout_ms). */
static bool agent_log_says(int agent, const char *needle, long timeout_ms)
{
    char path[512];
    snprintf(path, sizeof path, "%s/agent%d.log", e2e_cl->dir, agent);
    for (long t = 0; t < timeout_ms; t += 100) {
        char *text = e2e_slurp(path);
        bool found = text && strstr(text, needle);
        free(text);
        if (found)
            return true;
        usleep(100000);
    }
    return false;
}

Test(e2e_trust, approval_then_work_then_removal_and_ban, .init = e2e_setup_approval, .fini = e2e_teardown,
     .timeout = 240)
{
    const char *w0 = e2e_cl->worker_id[0], *w1 = e2e_cl->worker_id[1];
    int a0 = -1, a1 = -1; /* which agent process is which worker (once each has logged its id) */
    for (int t = 0; t < 100 && (a0 < 0 || a1 < 0); t++) {
        for (int i = 0; i < E2E_AGENTS; i++) {
            char path[512];
            snprintf(path, sizeof path, "%s/agent%d.log", e2e_cl->dir, i);
            char *text = e2e_slurp(path);
            if (text && strstr(text, w0))
                a0 = i;
            if (text && strstr(text, w1))
                a1 = i;
            free(text);
        }
        if (a0 < 0 || a1 < 0)
            usleep(100000);
    }
    cr_assert(a0 >= 0 && a1 >= 0 && a0 != a1, "each worker's agent");

    /* both registered and wait: the workers list says so, and so do the agents */
    char *out = NULL, *err = NULL;
    cr_assert_eq(e2e_kiln(&out, &err, "workers", NULL), 0, "%s", err);
    cr_assert(strstr(out, "PENDING") && strstr(out, "JOIN-TOKEN") && strstr(out, "file"), "%s", out);
    free(out);
    free(err);
    cr_assert_eq(e2e_kiln(&out, &err, "workers", "-o", "wide", NULL), 0, "%s", err);
    cr_assert(strstr(out, "CERT-SHA256") && strstr(out, "127.0.0.1"), "%s", out);
    free(out);
    free(err);
    json_t *w = listed(w0);
    cr_assert_str_eq(e2e_jstr(w, "approval"), "PENDING");
    cr_assert_eq(strlen(e2e_jstr(w, "cert_sha256")), 64, "bound to its client certificate: %s", e2e_dump(w));
    json_decref(w);
    cr_assert(agent_log_says(a0, "waiting for approval", 20000), "the agent heard it waits");
    cr_assert(agent_log_says(a1, "waiting for approval", 20000), "the agent heard it waits");

    /* a job waits: no pending worker gets it, however many heartbeats and scheduler passes go by */
    char *spec = e2e_spec("trust", 20, 1, 1, 4);
    json_t *job = e2e_submit(spec);
    free(spec);
    char id[64];
    snprintf(id, sizeof id, "%s", e2e_jstr(job, "id"));
    json_decref(job);
    sleep(3); /* three more heartbeats of each agent (one a second), dozens of scheduler passes */
    json_t *j = e2e_wait_state(id, "QUEUED", 1000);
    cr_assert_str_eq(e2e_jstr(j, "state"), "QUEUED", "no pending worker got it: %s", e2e_dump(j));
    json_decref(j);

    /* a cluster admin approves worker 0: the job runs there, to its end */
    cr_assert_eq(e2e_kiln(&out, &err, "workers", "approve", w0, NULL), 0, "%s", err);
    cr_assert(strstr(out, "approved"), "%s", out);
    free(out);
    free(err);
    cr_assert(agent_log_says(a0, "takes work now", 20000), "the agent heard it is approved");
    j = e2e_wait_state(id, TH_JOB_ENDED, 120000);
    cr_assert_str_eq(e2e_jstr(j, "state"), "COMPLETED", "%s", e2e_dump(j));
    json_decref(j);
    json_t *ev = e2e_events(id);
    char *evs = json_dumps(ev, 0);
    cr_assert(strstr(evs, w0) && !strstr(evs, w1), "it ran on the approved worker only: %s", evs);
    free(evs);
    json_decref(ev);
    w = listed(w0);
    cr_assert_str_eq(e2e_jstr(w, "approval"), "APPROVED");
    cr_assert_str_eq(e2e_jstr(w, "approved_by"), "admin");
    json_decref(w);

    /* the other is removed and banned: it is gone from the list, and its agent cannot come back */
    cr_assert_eq(e2e_kiln(&out, &err, "workers", "remove", w1, "--ban", "--reason", "e2e", NULL), 0, "%s", err);
    cr_assert(strstr(out, "removed worker") && strstr(out, "may not register again"), "%s", out);
    free(out);
    free(err);
    w = listed(w1);
    cr_assert_null(w, "a removed worker is not listed");
    cr_assert(agent_log_says(a1, "is banned", 30000), "its agent was refused when it tried to come back");
    cr_assert_eq(e2e_kiln(&out, &err, "workers", "bans", NULL), 0, "%s", err);
    cr_assert(strstr(out, w1) && strstr(out, "e2e"), "%s", out);
    free(out);
    free(err);
    e2e_pass();
}

Test(e2e_trust, an_agent_refused_by_the_registration_limit_backs_off_and_gets_in,
     .init = e2e_setup_register_limit, .fini = e2e_teardown, .timeout = 180)
{
    /* e2e_setup_register_limit waited for both workers ALIVE: one of the agents was refused first */
    int refused = -1;
    for (int i = 0; i < E2E_AGENTS && refused < 0; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/agent%d.log", e2e_cl->dir, i);
        char *text = e2e_slurp(path);
        const char *no = text ? strstr(text, "too many worker registrations from 127.0.0.1") : NULL;
        if (no) {
            refused = i;
            cr_assert(strstr(no, "retry in") && strstr(no, "retrying in"), "it says when it retries: %s", no);
            cr_assert(strstr(no, "registered with kilnd"), "and then it got in: %s", no);
        }
        free(text);
    }
    cr_assert(refused >= 0, "one agent was refused by the limit");
    json_t *ws = e2e_get("/v1/workers");
    cr_assert_eq(json_array_size(json_object_get(ws, "workers")), E2E_AGENTS);
    json_decref(ws);
    e2e_pass();
}
