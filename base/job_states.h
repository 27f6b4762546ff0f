/* job_states.h - the one list of job states and of which are terminal. Every other place that names
 * them is generated from it (service.h's enum, state.c's names and svc_state_terminal, the query
 * language's state list, the CLI's cli_state_terminal and `kiln delete`'s help) or checked against
 * it by tests/service/test_state.c (proto/kiln.proto, api/openapi.yaml, the migrations' CHECKs, the
 * store's SQL state sets, the web UI and the Python SDK). */
#ifndef KILN_JOB_STATES_H
#define KILN_JOB_STATES_H

/* X(NAME, number, KIND): NAME is the state as the API spells it, number its proto JobState value
 * (JOB_STATE_NAME), numbers dense from 1 in this order; KIND what the state means for the job's
 * place in the cluster: WAITING (waits in its queue to be placed), HOLDING (holds the slots it
 * was admitted to), PARKED (neither, and not done: a hyperband trial paused at a rung) or ENDED
 * (done: a terminal state, which nothing leaves). KILN_JOB_KIND_##KIND is its kiln_job_kind_t. */
#define KILN_JOB_STATES(X)                                                                           \
    X(QUEUED, 1, WAITING)                                                                            \
    X(SCHEDULED, 2, HOLDING)                                                                         \
    X(STARTING, 3, HOLDING)                                                                          \
    X(RUNNING, 4, HOLDING)                                                                           \
    X(STOPPING, 5, HOLDING)                                                                          \
    X(RESTARTING, 6, WAITING)                                                                        \
    X(COMPLETED, 7, ENDED)                                                                           \
    X(FAILED, 8, ENDED)                                                                              \
    X(STOPPED, 9, ENDED)                                                                             \
    X(PREEMPTED, 10, WAITING)                                                                        \
    X(PAUSED, 11, PARKED)

typedef enum { KILN_JOB_KIND_WAITING, KILN_JOB_KIND_HOLDING, KILN_JOB_KIND_PARKED, KILN_JOB_KIND_ENDED } kiln_job_kind_t;

#define KILN_JOB_STATE_SEP_(name, num, kind) ", " #name
/* "QUEUED, SCHEDULED, ..., STOPPED": every state for messages and hints. */
#define KILN_JOB_STATE_LIST ((KILN_JOB_STATES(KILN_JOB_STATE_SEP_)) + 2)

/* The states of one kind as string literals, for messages and help texts. */
#define KILN_JOB_ENDED_SEP_(name, num, kind) KILN_JOB_ENDED_SEP_##kind(name)
#define KILN_JOB_ENDED_SEP_ENDED(name) ", " #name
#define KILN_JOB_ENDED_SEP_WAITING(name)
#define KILN_JOB_ENDED_SEP_HOLDING(name)
#define KILN_JOB_ENDED_SEP_PARKED(name)
#define KILN_JOB_ENDED_WORD_(name, num, kind) KILN_JOB_ENDED_WORD_##kind(name)
#define KILN_JOB_ENDED_WORD_ENDED(name) " " #name
#define KILN_JOB_ENDED_WORD_WAITING(name)
#define KILN_JOB_ENDED_WORD_HOLDING(name)
#define KILN_JOB_ENDED_WORD_PARKED(name)
/* "COMPLETED, FAILED, STOPPED" (a pointer into a literal, for "%s"): the states a job ends in. */
#define KILN_JOB_STATE_ENDED_LIST ((KILN_JOB_STATES(KILN_JOB_ENDED_SEP_)) + 2)
/* " COMPLETED FAILED STOPPED" (a string literal, to concatenate): the same, each after a space. */
#define KILN_JOB_STATE_ENDED_WORDS KILN_JOB_STATES(KILN_JOB_ENDED_WORD_)

#endif
