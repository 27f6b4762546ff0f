/* tuning_states.h - the one list of a tuning job's states and of which have ended (a tuning job's
 * trials are ordinary jobs, whose states are base/job_states.h's). kilnd's and the CLI's names and
 * ended checks come from it; tests/service/test_state.c checks every other copy against it (the
 * migrations' CHECK, proto/kiln.proto, api/openapi.yaml, the store's SQL set, the web UI and the
 * Python SDK). */
#ifndef KILN_TUNING_STATES_H
#define KILN_TUNING_STATES_H

#include <stdbool.h>
#include <string.h>

/* X(NAME, KIND): NAME is the state as the API spells it, in the API's order; KIND is ACTIVE (the
 * search goes on: it starts, promotes or stops trials) or ENDED (done: a terminal state, which
 * nothing leaves). A tuning job starts RUNNING; a stop makes it STOPPING until its trials end. */
#define KILN_TUNING_STATES(X)                                                                        \
    X(RUNNING, ACTIVE)                                                                               \
    X(STOPPING, ACTIVE)                                                                              \
    X(COMPLETED, ENDED)                                                                              \
    X(FAILED, ENDED)                                                                                 \
    X(STOPPED, ENDED)

typedef enum { KILN_TUNING_KIND_ACTIVE, KILN_TUNING_KIND_ENDED } kiln_tuning_kind_t;

#define KILN_TUNING_ENUM_(name, kind) KILN_TUNING_##name,
typedef enum { KILN_TUNING_STATES(KILN_TUNING_ENUM_) KILN_TUNING_COUNT_ } kiln_tuning_state_t;
#undef KILN_TUNING_ENUM_

/* KILN_TUNING_NAME(RUNNING) is "RUNNING", and does not compile for a name the list lacks. */
#define KILN_TUNING_NAME(name) ((void)KILN_TUNING_##name, #name)

/* "RUNNING, STOPPING, ..." and "COMPLETED, FAILED, STOPPED" (pointers into literals, for "%s"). */
#define KILN_TUNING_SEP_(name, kind) ", " #name
#define KILN_TUNING_STATE_LIST ((KILN_TUNING_STATES(KILN_TUNING_SEP_)) + 2)
#define KILN_TUNING_ENDED_SEP_(name, kind) KILN_TUNING_ENDED_SEP_##kind(name)
#define KILN_TUNING_ENDED_SEP_ENDED(name) ", " #name
#define KILN_TUNING_ENDED_SEP_ACTIVE(name)
#define KILN_TUNING_STATE_ENDED_LIST ((KILN_TUNING_STATES(KILN_TUNING_ENDED_SEP_)) + 2)

/* The state that name spells (exactly, case-sensitive), or -1 when it is none (NULL too). */
static inline int kiln_tuning_state_parse(const char *name)
{
#define KILN_TUNING_NAMES_(n, kind) #n,
    static const char *const names[] = {KILN_TUNING_STATES(KILN_TUNING_NAMES_)};
#undef KILN_TUNING_NAMES_
    for (int i = 0; name && i < KILN_TUNING_COUNT_; i++)
        if (strcmp(name, names[i]) == 0)
            return i;
    return -1;
}

/* The kind of the state name spells; false for a name that is no tuning state. */
static inline bool kiln_tuning_state_is(const char *name, kiln_tuning_kind_t kind)
{
#define KILN_TUNING_KINDS_(n, k) KILN_TUNING_KIND_##k,
    static const kiln_tuning_kind_t kinds[] = {KILN_TUNING_STATES(KILN_TUNING_KINDS_)};
#undef KILN_TUNING_KINDS_
    int s = kiln_tuning_state_parse(name);
    return s >= 0 && kinds[s] == kind;
}

/* A tuning job in state name has ended (COMPLETED, FAILED, STOPPED) / goes on (RUNNING, STOPPING). */
static inline bool kiln_tuning_ended(const char *name) { return kiln_tuning_state_is(name, KILN_TUNING_KIND_ENDED); }
static inline bool kiln_tuning_active(const char *name) { return kiln_tuning_state_is(name, KILN_TUNING_KIND_ACTIVE); }

#endif
