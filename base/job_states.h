/* job_states.h - the one list of job states. Every other place that names them is generated from
 * it (service.h's enum, state.c's names, the query language's state list) or checked against it by
 * tests/service/test_state.c (proto/kiln.proto, api/openapi.yaml, the migrations' CHECKs, the web
 * UI and the Python SDK). */
#ifndef KILN_JOB_STATES_H
#define KILN_JOB_STATES_H

/* X(NAME, number): NAME is the state as the API spells it, number its proto JobState value
 * (JOB_STATE_NAME); numbers are dense from 1 in this order. */
#define KILN_JOB_STATES(X)                                                                           \
    X(QUEUED, 1)                                                                                     \
    X(SCHEDULED, 2)                                                                                  \
    X(STARTING, 3)                                                                                   \
    X(RUNNING, 4)                                                                                    \
    X(STOPPING, 5)                                                                                   \
    X(RESTARTING, 6)                                                                                 \
    X(COMPLETED, 7)                                                                                  \
    X(FAILED, 8)                                                                                     \
    X(STOPPED, 9)                                                                                    \
    X(PREEMPTED, 10)                                                                                 \
    X(PAUSED, 11)

#define KILN_JOB_STATE_SEP_(name, num) ", " #name
/* "QUEUED, SCHEDULED, ..., STOPPED": every state for messages and hints. */
#define KILN_JOB_STATE_LIST ((KILN_JOB_STATES(KILN_JOB_STATE_SEP_)) + 2)

#endif
