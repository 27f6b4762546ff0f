/* api_names.h - the one list of each small set of names the API takes and the clients spell: a
 * queue's preemption policies and a project member's roles. Made from it: service.h's enums, the
 * validators' name tables (service/admit.c, service/auth.c) and the CLI's help (cli/cli.c); checked
 * against it by tests/service/test_names.c: the migrations' CHECKs, the OpenAPI and proto texts, the
 * web UI, the Python SDK and the README. Not the job states (base/job_states.h). And the limits
 * that kilnd and the clients share: the largest page of a list. */
#ifndef KILN_API_NAMES_H
#define KILN_API_NAMES_H

/* Each list is LIST(FIRST, NEXT): FIRST(NAME, "api name") for its first value, NEXT(...) for each
 * other in order; the enums number them from 0 (roles from 1) in this order. A policy's first
 * value is its default, the rule of a queue that sets none (Kueue's ClusterQueue spec.preemption). */

/* preemption.within_queue: which jobs of its own queue a head may preempt (withinClusterQueue):
 * those of lower priority (the default), or none. */
#define KILN_WITHIN_QUEUE_POLICIES(FIRST, NEXT)                                                      \
    FIRST(LOWER_PRIORITY, "lower_priority")                                                          \
    NEXT(NEVER, "never")

/* preemption.reclaim_within_cohort: which jobs of its cohort's queues that borrow beyond their
 * nominal quota a head within its own may preempt (reclaimWithinCohort): any of them (the
 * default), those of lower priority, or none. */
#define KILN_RECLAIM_WITHIN_COHORT_POLICIES(FIRST, NEXT)                                             \
    FIRST(ANY, "any")                                                                                \
    NEXT(LOWER_PRIORITY, "lower_priority")                                                           \
    NEXT(NEVER, "never")

/* A project member's role, each allowed what the one before it is and more: a viewer reads jobs,
 * events, logs, metrics, artifacts and members; an editor also submits and stops jobs; an admin
 * also manages the project's members. */
#define KILN_PROJECT_ROLES(FIRST, NEXT)                                                              \
    FIRST(VIEWER, "viewer")                                                                          \
    NEXT(EDITOR, "editor")                                                                           \
    NEXT(ADMIN, "admin")

/* String literals made from a list, for help texts: LIST(KILN_NAME_FIRST_, KILN_NAME_BAR_) is
 * "lower_priority|never", LIST(KILN_NAME_FIRST_, KILN_NAME_SKIP_) the first value alone. */
#define KILN_NAME_FIRST_(id, name) name
#define KILN_NAME_BAR_(id, name) "|" name
#define KILN_NAME_SKIP_(id, name)
#define KILN_NAME_CHOICES(LIST) LIST(KILN_NAME_FIRST_, KILN_NAME_BAR_)
#define KILN_NAME_DEFAULT(LIST) LIST(KILN_NAME_FIRST_, KILN_NAME_SKIP_)

/* The largest page_size of every paged list (jobs, search, tuning jobs; REST and gRPC): kilnd takes
 * 1 to this (service/), and the CLI asks for pages this large unless --page-size says less. */
#define KILN_PAGE_SIZE_MAX 500
/* The same as a string literal, for help texts: "500". */
#define KILN_PAGE_SIZE_MAX_TEXT KILN_LITERAL_(KILN_PAGE_SIZE_MAX)
#define KILN_LITERAL_(x) KILN_LITERAL__(x)
#define KILN_LITERAL__(x) #x

#endif
