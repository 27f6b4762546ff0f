/* test_state.c - the job state machine's table: every legal transition is allowed, everything
 * else (including leaving a terminal state and skipping steps) is refused; names round-trip. */
#include <criterion/criterion.h>

#include "service/service.h"

Test(state, names_round_trip)
{
    for (int s = JOB_STATE_QUEUED; s <= JOB_STATE_STOPPED; s++) {
        const char *n = svc_state_name((svc_job_state_t)s);
        cr_assert_neq(n[0], '\0');
        cr_assert_eq(svc_state_parse(n), (svc_job_state_t)s, "%s", n);
    }
    cr_assert_eq(svc_state_parse("running"), JOB_STATE_NONE, "names are case-sensitive");
    cr_assert_eq(svc_state_parse("BOGUS"), JOB_STATE_NONE);
    cr_assert_eq(svc_state_parse(NULL), JOB_STATE_NONE);
    cr_assert_str_eq(svc_state_name((svc_job_state_t)42), "");
}

Test(state, legal_transitions)
{
    static const struct { svc_job_state_t from, to; } ok[] = {
        {JOB_STATE_NONE, JOB_STATE_QUEUED},
        {JOB_STATE_QUEUED, JOB_STATE_SCHEDULED},
        {JOB_STATE_QUEUED, JOB_STATE_STOPPED},
        {JOB_STATE_SCHEDULED, JOB_STATE_STARTING},
        {JOB_STATE_SCHEDULED, JOB_STATE_STOPPED},
        {JOB_STATE_SCHEDULED, JOB_STATE_RESTARTING},
        {JOB_STATE_STARTING, JOB_STATE_RUNNING},
        {JOB_STATE_STARTING, JOB_STATE_FAILED},
        {JOB_STATE_STARTING, JOB_STATE_STOPPING},
        {JOB_STATE_RUNNING, JOB_STATE_COMPLETED},
        {JOB_STATE_RUNNING, JOB_STATE_FAILED},
        {JOB_STATE_RUNNING, JOB_STATE_STOPPING},
        {JOB_STATE_RUNNING, JOB_STATE_RESTARTING},
        {JOB_STATE_STOPPING, JOB_STATE_STOPPED},
        {JOB_STATE_RESTARTING, JOB_STATE_SCHEDULED},
        {JOB_STATE_RESTARTING, JOB_STATE_STOPPED},
        {JOB_STATE_RESTARTING, JOB_STATE_FAILED},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
        cr_assert(svc_state_legal(ok[i].from, ok[i].to), "%s -> %s should be legal",
                  svc_state_name(ok[i].from), svc_state_name(ok[i].to));
}

Test(state, illegal_transitions)
{
    static const struct { svc_job_state_t from, to; } bad[] = {
        {JOB_STATE_QUEUED, JOB_STATE_RUNNING},      /* skips placement */
        {JOB_STATE_QUEUED, JOB_STATE_COMPLETED},
        {JOB_STATE_QUEUED, JOB_STATE_STOPPING},     /* nothing runs: straight to STOPPED */
        {JOB_STATE_SCHEDULED, JOB_STATE_RUNNING},   /* must be delivered first */
        {JOB_STATE_RUNNING, JOB_STATE_QUEUED},
        {JOB_STATE_RUNNING, JOB_STATE_STOPPED},     /* through STOPPING */
        {JOB_STATE_STOPPING, JOB_STATE_RUNNING},
        {JOB_STATE_STOPPING, JOB_STATE_COMPLETED},
        {JOB_STATE_RESTARTING, JOB_STATE_RUNNING},
        {JOB_STATE_NONE, JOB_STATE_RUNNING},
        {JOB_STATE_QUEUED, JOB_STATE_NONE},
        {JOB_STATE_QUEUED, JOB_STATE_QUEUED},
        {JOB_STATE_RUNNING, JOB_STATE_RUNNING},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_assert_not(svc_state_legal(bad[i].from, bad[i].to), "%s -> %s should be illegal",
                      svc_state_name(bad[i].from), svc_state_name(bad[i].to));
    /* Nothing leaves a terminal state. */
    svc_job_state_t term[] = {JOB_STATE_COMPLETED, JOB_STATE_FAILED, JOB_STATE_STOPPED};
    for (int t = 0; t < 3; t++) {
        cr_assert(svc_state_terminal(term[t]));
        for (int to = JOB_STATE_NONE; to <= JOB_STATE_STOPPED + 1; to++)
            cr_assert_not(svc_state_legal(term[t], (svc_job_state_t)to), "%s -> %d", svc_state_name(term[t]), to);
    }
    cr_assert_not(svc_state_terminal(JOB_STATE_STOPPING));
    cr_assert_not(svc_state_terminal(JOB_STATE_RESTARTING));
    cr_assert_not(svc_state_legal((svc_job_state_t)-1, JOB_STATE_QUEUED));
    cr_assert_not(svc_state_legal(JOB_STATE_QUEUED, (svc_job_state_t)99));
}
