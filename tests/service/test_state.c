/* test_state.c - the job state machine's table: every legal transition is allowed, everything
 * else (including leaving a terminal state and skipping steps) is refused; names round-trip; and
 * every hand-written copy of the state list or of a kind of states (proto, OpenAPI, migrations,
 * the store's SQL sets and single states, UI, SDK) is the one in base/job_states.h; and the same
 * for a tuning job's states, whose one list is base/tuning_states.h. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/tuning_states.h"
#include "service/service.h"
#include "store/store_int.h"
#include "tests/common/harness.h"

Test(state, names_round_trip)
{
    for (int s = JOB_STATE_NONE + 1; s < JOB_STATE_COUNT_; s++) {
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
        {JOB_STATE_RUNNING, JOB_STATE_PAUSED},
        {JOB_STATE_PAUSED, JOB_STATE_RESTARTING},
        {JOB_STATE_PAUSED, JOB_STATE_COMPLETED},
        {JOB_STATE_PAUSED, JOB_STATE_STOPPED},
        {JOB_STATE_STOPPING, JOB_STATE_PREEMPTED},
        {JOB_STATE_PREEMPTED, JOB_STATE_SCHEDULED},
        {JOB_STATE_PREEMPTED, JOB_STATE_STOPPED},
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
        {JOB_STATE_RUNNING, JOB_STATE_PREEMPTED},   /* through STOPPING: its ranks checkpoint first */
        {JOB_STATE_PREEMPTED, JOB_STATE_RUNNING},
        {JOB_STATE_PREEMPTED, JOB_STATE_QUEUED},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_assert_not(svc_state_legal(bad[i].from, bad[i].to), "%s -> %s should be illegal",
                      svc_state_name(bad[i].from), svc_state_name(bad[i].to));
    /* Nothing leaves a terminal state (base/job_states.h's kind ENDED); every other state has a way on. */
    svc_job_state_t term[] = {JOB_STATE_COMPLETED, JOB_STATE_FAILED, JOB_STATE_STOPPED};
    for (int t = 0; t < 3; t++)
        cr_assert(svc_state_terminal(term[t]));
    for (int from = JOB_STATE_NONE + 1; from < JOB_STATE_COUNT_; from++) {
        bool out = false;
        for (int to = JOB_STATE_NONE; to <= JOB_STATE_COUNT_; to++)
            out = out || svc_state_legal((svc_job_state_t)from, (svc_job_state_t)to);
        cr_assert_neq(out, svc_state_terminal((svc_job_state_t)from), "%s: terminal %d, a legal way out %d",
                      svc_state_name((svc_job_state_t)from), svc_state_terminal((svc_job_state_t)from), out);
    }
    cr_assert_not(svc_state_terminal(JOB_STATE_STOPPING));
    cr_assert_not(svc_state_terminal(JOB_STATE_RESTARTING));
    cr_assert_not(svc_state_terminal(JOB_STATE_PREEMPTED));
    cr_assert_not(svc_state_legal((svc_job_state_t)-1, JOB_STATE_QUEUED));
    cr_assert_not(svc_state_legal(JOB_STATE_QUEUED, (svc_job_state_t)99));
}

/* ---- the copies of the state list ---------------------------------------------------------- */

#define STATE_NAME_(name, num, kind) #name,
static const char *const k_all[] = {KILN_JOB_STATES(STATE_NAME_)};
#undef STATE_NAME_
#define NSTATES ((int)(sizeof(k_all) / sizeof(k_all[0])))
#define STATE_KIND_(name, num, kind) KILN_JOB_KIND_##kind,
static const kiln_job_kind_t k_kind[] = {KILN_JOB_STATES(STATE_KIND_)};
#undef STATE_KIND_
static const char *const k_kind_name[] = {"WAITING", "HOLDING", "PARKED", "ENDED"};

/* The file at path under $KILN_ROOT (the repository), NUL-terminated; caller frees. */
static char *repo_file(const char *path)
{
    char *t = th_repo_file(path);
    cr_assert_not_null(t, "cannot read %s under $KILN_ROOT (run the tests from tests/run.sh, which sets it)", path);
    return t;
}

/* Reads the words of text[0..len) that are upper-case identifiers (A-Z, _) into names, in order;
 * returns how many. */
static int caps_words(const char *text, size_t len, char names[][32], int max)
{
    int n = 0;
    for (size_t i = 0; i < len;) {
        if (text[i] >= 'A' && text[i] <= 'Z' && (i == 0 || !(text[i - 1] == '_' || (text[i - 1] >= 'a' && text[i - 1] <= 'z')))) {
            size_t j = i;
            while (j < len && ((text[j] >= 'A' && text[j] <= 'Z') || text[j] == '_'))
                j++;
            if (j - i >= 4 && n < max && j - i < 32) {
                memcpy(names[n], text + i, j - i);
                names[n][j - i] = '\0';
                n++;
            }
            i = j;
        } else {
            i++;
        }
    }
    return n;
}

/* names[0..n) is exactly the list, in its order. */
static void assert_is_list(char names[][32], int n, const char *where)
{
    cr_assert_eq(n, NSTATES, "%s names %d states; base/job_states.h has %d (%s)", where, n, NSTATES,
                 KILN_JOB_STATE_LIST);
    for (int i = 0; i < n; i++)
        cr_assert_str_eq(names[i], k_all[i], "%s: state %d is %s, base/job_states.h says %s", where, i,
                         names[i], k_all[i]);
}

/* names[0..n) is, in any order, the states of base/job_states.h that kind is (or is not, when
 * !is_kind) and nothing else. */
static void assert_is_kind(char names[][32], int n, kiln_job_kind_t kind, bool is_kind, const char *where)
{
    int want = 0;
    for (int i = 0; i < NSTATES; i++) {
        if ((k_kind[i] == kind) != is_kind)
            continue;
        want++;
        bool found = false;
        for (int j = 0; j < n; j++)
            found = found || strcmp(names[j], k_all[i]) == 0;
        cr_assert(found, "%s lacks %s, which base/job_states.h says is %s%s", where, k_all[i], is_kind ? "" : "not ",
                  k_kind_name[kind]);
    }
    for (int j = 0; j < n; j++) {
        svc_job_state_t st = svc_state_parse(names[j]);
        cr_assert_neq(st, JOB_STATE_NONE, "%s names %s, not a state of base/job_states.h", where, names[j]);
        cr_assert_eq(k_kind[st - 1] == kind, is_kind, "%s has %s, which base/job_states.h says is %s%s", where,
                     names[j], is_kind ? "not " : "", k_kind_name[kind]);
    }
    cr_assert_eq(n, want, "%s names %d states, base/job_states.h has %d (a state twice?)", where, n, want);
}

Test(state, terminal_is_the_ended_kind)
{
    for (int i = 0; i < NSTATES; i++)
        cr_assert_eq(svc_state_terminal(svc_state_parse(k_all[i])), k_kind[i] == KILN_JOB_KIND_ENDED, "%s", k_all[i]);
    cr_assert_not(svc_state_terminal(JOB_STATE_NONE));
    cr_assert_not(svc_state_terminal(JOB_STATE_COUNT_));
    char names[64][32];
    int n = caps_words(KILN_JOB_STATE_ENDED_LIST, strlen(KILN_JOB_STATE_ENDED_LIST), names, 64);
    assert_is_kind(names, n, KILN_JOB_KIND_ENDED, true, "KILN_JOB_STATE_ENDED_LIST");
    n = caps_words(KILN_JOB_STATE_ENDED_WORDS, strlen(KILN_JOB_STATE_ENDED_WORDS), names, 64);
    assert_is_kind(names, n, KILN_JOB_KIND_ENDED, true, "KILN_JOB_STATE_ENDED_WORDS");
}

/* The store's SQL sets of states (store/store_int.h), one per kind: literals that base/job_states.h
 * cannot make (the preprocessor cannot join a kind's names with commas), checked here instead. */
Test(state, store_sql_sets_are_the_kinds)
{
    static const struct { const char *sql, *where; kiln_job_kind_t kind; } sets[] = {
        {STORE_WAITING_NAMES, "store/store_int.h STORE_WAITING_NAMES", KILN_JOB_KIND_WAITING},
        {STORE_HOLDING_NAMES, "store/store_int.h STORE_HOLDING_NAMES", KILN_JOB_KIND_HOLDING},
        {STORE_PARKED_NAMES, "store/store_int.h STORE_PARKED_NAMES", KILN_JOB_KIND_PARKED},
        {STORE_ENDED_NAMES, "store/store_int.h STORE_ENDED_NAMES", KILN_JOB_KIND_ENDED},
    };
    for (size_t i = 0; i < sizeof(sets) / sizeof(sets[0]); i++) {
        char names[64][32];
        int n = caps_words(sets[i].sql, strlen(sets[i].sql), names, 64);
        assert_is_kind(names, n, sets[i].kind, true, sets[i].where);
    }
}

/* store/'s single states: each STORE_STATE(NAME) a job state, each STORE_TUNING_STATE(NAME) a tuning
 * job's state, and no state quoted by hand ('RUNNING'), where a misspelled name would match nothing
 * and say nothing. */
static void store_states_scan(const char *path, const char *t, void *ctx)
{
    int *uses = ctx;
    static const struct { const char *mark; bool tuning; } macros[] = {
        {"STORE_STATE(", false},
        {"STORE_TUNING_STATE(", true},
    };
    for (size_t m = 0; m < sizeof(macros) / sizeof(macros[0]); m++) {
        for (const char *at = strstr(t, macros[m].mark); at; at = strstr(at, macros[m].mark)) {
            at += strlen(macros[m].mark);
            const char *end = strchr(at, ')');
            cr_assert_not_null(end, "%s: %s without its )", path, macros[m].mark);
            char name[32];
            snprintf(name, sizeof name, "%.*s", (int)KILN_MIN(end - at, 31), at);
            if (macros[m].tuning)
                cr_assert_geq(kiln_tuning_state_parse(name), 0, "%s: %s%s): not a state of base/tuning_states.h (%s)",
                              path, macros[m].mark, name, KILN_TUNING_STATE_LIST);
            else
                cr_assert_neq(svc_state_parse(name), JOB_STATE_NONE, "%s: %s%s): not a state of base/job_states.h (%s)",
                              path, macros[m].mark, name, KILN_JOB_STATE_LIST);
            (*uses)++;
        }
    }
    for (const char *q = strchr(t, '\''); q; q = strchr(q + 1, '\'')) {
        size_t n = strspn(q + 1, "ABCDEFGHIJKLMNOPQRSTUVWXYZ_");
        if (n == 0 || n >= 32 || q[1 + n] != '\'')
            continue;
        char word[32];
        snprintf(word, sizeof word, "%.*s", (int)n, q + 1);
        cr_assert(svc_state_parse(word) == JOB_STATE_NONE && kiln_tuning_state_parse(word) < 0,
                  "%s quotes the state '%s' by hand: write STORE_STATE(%s) or STORE_TUNING_STATE(%s) (store/store_int.h)"
                  " (or, for another table's state of that name, rename one of them)", path, word, word, word);
        q += n + 1;
    }
}

Test(state, store_single_states_are_in_the_lists)
{
    int uses = 0;
    cr_assert_gt(th_repo_dir_each("store", ".c", store_states_scan, &uses), 0, "cannot read store/*.c under $KILN_ROOT");
    cr_assert_gt(uses, 0, "store/ names no single state: is the scan looking at the right files?");
}

Test(state, proto_enum_is_the_list)
{
    char *t = repo_file("proto/kiln.proto");
    const char *e = strstr(t, "enum JobState {");
    cr_assert_not_null(e, "proto/kiln.proto has no enum JobState");
    const char *end = strchr(e, '}');
    int seen = 0;
    for (const char *p = strstr(e, "JOB_STATE_"); p && p < end; p = strstr(p + 1, "JOB_STATE_")) {
        char name[32];
        int num;
        cr_assert_eq(sscanf(p, "JOB_STATE_%31[A-Z_] = %d;", name, &num), 2, "cannot read %.40s", p);
        if (strcmp(name, "UNSPECIFIED") == 0) {
            cr_assert_eq(num, 0);
            continue;
        }
        svc_job_state_t st = svc_state_parse(name);
        cr_assert_neq(st, JOB_STATE_NONE, "proto's JOB_STATE_%s is not in base/job_states.h", name);
        cr_assert_eq((int)st, num, "proto numbers %s %d, base/job_states.h %d", name, num, (int)st);
        seen++;
    }
    cr_assert_eq(seen, NSTATES, "proto's JobState has %d states, base/job_states.h %d", seen, NSTATES);
    free(t);
}

Test(state, openapi_enum_is_the_list)
{
    char *t = repo_file("api/openapi.yaml");
    const char *e = strstr(t, "\n    JobState:\n");
    cr_assert_not_null(e, "api/openapi.yaml has no JobState schema");
    const char *open = strstr(e, "enum: [");
    cr_assert_not_null(open);
    open += 7;
    const char *close = strchr(open, ']');
    char names[64][32];
    int n = caps_words(open, (size_t)(close - open), names, 64);
    assert_is_list(names, n, "api/openapi.yaml JobState");
    free(t);
}

/* The jobs table's and the events table's CHECK constraints: the last one the migrations (in
 * order) write for state, from_state and to_state. A migration that adds a state rewrites them. */
static const char *const job_cols[] = {"(state IN (", "(from_state IN (", "(to_state IN ("};
typedef struct { char last[3][64][32]; int nlast[3]; } job_checks_t;

static void job_checks_scan(const char *path, const char *t, void *ctx)
{
    (void)path;
    job_checks_t *k = ctx;
    for (int c = 0; c < 3; c++)
        for (const char *p = strstr(t, job_cols[c]); p; p = strstr(p + 1, job_cols[c])) {
            const char *b = p + strlen(job_cols[c]), *close = strchr(b, ')');
            /* only the constraints' lists of job states: "CHECK (state IN ('QUEUED'" (the
             * workers' and artifacts' states are other lists) */
            if (p - t >= 6 && strncmp(p - 6, "CHECK ", 6) == 0 && strncmp(b, "'QUEUED'", 8) == 0 && close)
                k->nlast[c] = caps_words(b, (size_t)(close - b), k->last[c], 64);
        }
}

Test(state, migration_checks_are_the_list)
{
    static job_checks_t k = {.nlast = {-1, -1, -1}};
    cr_assert_gt(th_migrations_each(job_checks_scan, &k), 0, "cannot read the migrations");
    for (int c = 0; c < 3; c++) {
        cr_assert_geq(k.nlast[c], 0, "no migration has CHECK %s...)", job_cols[c]);
        assert_is_list(k.last[c], k.nlast[c], job_cols[c]);
    }
}

/* The words of the first "[...]" or "(...)" list after mark in t, as caps_words reads them. */
static int list_after(const char *t, const char *mark, const char *where, char names[][32], int max)
{
    const char *at = strstr(t, mark);
    cr_assert_not_null(at, "%s has no \"%s\"", where, mark);
    at += strlen(mark);
    const char *end = strpbrk(at, "])");
    cr_assert_not_null(end, "%s: \"%s\" is not followed by a list", where, mark);
    return caps_words(at, (size_t)(end - at), names, max);
}

Test(state, ui_and_sdk_name_every_state)
{
    char *t = repo_file("ui/src/dom.ts");
    const char *mark = strstr(t, "const STATE_MARK");
    cr_assert_not_null(mark, "ui/src/dom.ts has no STATE_MARK");
    const char *mend = strstr(mark, "};");
    for (int i = 0; i < NSTATES; i++) {
        char key[48];
        snprintf(key, sizeof key, "%s:", k_all[i]);
        const char *k = strstr(mark, key);
        cr_assert(k && k < mend, "ui/src/dom.ts STATE_MARK has no mark for %s", k_all[i]);
    }
    char names[64][32];
    int n = list_after(t, "export const TERMINAL = new Set([", "ui/src/dom.ts", names, 64);
    assert_is_kind(names, n, KILN_JOB_KIND_ENDED, true, "ui/src/dom.ts TERMINAL");
    n = list_after(t, "export const LIVE_STATES = [", "ui/src/dom.ts", names, 64);
    assert_is_kind(names, n, KILN_JOB_KIND_ENDED, false, "ui/src/dom.ts LIVE_STATES");
    free(t);

    t = repo_file("sdk/python/kiln/client.py");
    n = list_after(t, "\nTERMINAL_STATES = frozenset((", "sdk/python/kiln/client.py", names, 64);
    assert_is_kind(names, n, KILN_JOB_KIND_ENDED, true, "sdk/python/kiln/client.py TERMINAL_STATES");
    const char *job = strstr(t, "class Job(");
    const char *doc = job ? strstr(job, "def state(self) -> str:") : NULL;
    cr_assert_not_null(doc, "sdk/python/kiln/client.py has no Job.state");
    const char *dend = strstr(strstr(doc, "\"\"\"") + 3, "\"\"\"");
    n = caps_words(doc, (size_t)(dend - doc), names, 64);
    assert_is_list(names, n, "sdk/python/kiln/client.py Job.state's docstring");
    free(t);
}

/* The pages that list the states for people: the filter language's state field (docs/search.md)
 * and the REST contract (docs/contracts.md), each a backquoted list. */
static void doc_list_is_the_list(const char *path, const char *after)
{
    char *t = repo_file(path);
    const char *at = strstr(t, after);
    cr_assert_not_null(at, "%s has no \"%s\"", path, after);
    const char *open = strchr(at + strlen(after), '`');
    cr_assert_not_null(open);
    open++;
    const char *close = strchr(open, '`');
    cr_assert_not_null(close);
    char names[64][32];
    int n = caps_words(open, (size_t)(close - open), names, 64);
    char where[256];
    snprintf(where, sizeof where, "%s (after \"%s\")", path, after);
    assert_is_list(names, n, where);
    free(t);
}

Test(state, docs_name_every_state)
{
    /* and the prose that lists the end states of jobs (not of tuning jobs, whose states are another
     * list) */
    static const struct { const char *path, *mark; } ended[] = {
        {"api/openapi.yaml", "that has ended ("},
        {"api/openapi.yaml", "`trials_done` how many ended ("},
        {"ui/src/pages/tunings.ts", "trials that ended ("},
    };
    for (size_t i = 0; i < sizeof(ended) / sizeof(ended[0]); i++) {
        char *t = repo_file(ended[i].path);
        char names[64][32], where[256];
        snprintf(where, sizeof where, "%s (after \"%s\")", ended[i].path, ended[i].mark);
        int n = list_after(t, ended[i].mark, where, names, 64);
        assert_is_kind(names, n, KILN_JOB_KIND_ENDED, true, where);
        free(t);
    }
    doc_list_is_the_list("docs/search.md", "| `state` | text |");
    doc_list_is_the_list("docs/contracts.md", "Job states\nare the enum names without their prefix:");
}

/* ---- a tuning job's states: base/tuning_states.h and its copies ---------------------------------- */

#define TUNING_NAME_(name, kind) #name,
static const char *const k_tuning[] = {KILN_TUNING_STATES(TUNING_NAME_)};
#undef TUNING_NAME_
#define NTUNING ((int)(sizeof(k_tuning) / sizeof(k_tuning[0])))

/* names[0..n) is exactly base/tuning_states.h's list, in its order. */
static void assert_is_tuning_list(char names[][32], int n, const char *where)
{
    cr_assert_eq(n, NTUNING, "%s names %d tuning states; base/tuning_states.h has %d (%s)", where, n, NTUNING,
                 KILN_TUNING_STATE_LIST);
    for (int i = 0; i < n; i++)
        cr_assert_str_eq(names[i], k_tuning[i], "%s: tuning state %d is %s, base/tuning_states.h says %s", where, i,
                         names[i], k_tuning[i]);
}

/* names[0..n) is, in any order, the tuning states of kind (each once) and nothing else. */
static void assert_is_tuning_kind(char names[][32], int n, kiln_tuning_kind_t kind, const char *where)
{
    static const char *const kind_name[] = {"ACTIVE", "ENDED"};
    int want = 0;
    for (int i = 0; i < NTUNING; i++) {
        if (!kiln_tuning_state_is(k_tuning[i], kind))
            continue;
        want++;
        bool found = false;
        for (int j = 0; j < n; j++)
            found = found || strcmp(names[j], k_tuning[i]) == 0;
        cr_assert(found, "%s lacks %s, which base/tuning_states.h says is %s", where, k_tuning[i], kind_name[kind]);
    }
    for (int j = 0; j < n; j++) {
        cr_assert_geq(kiln_tuning_state_parse(names[j]), 0, "%s names %s, not a state of base/tuning_states.h", where,
                      names[j]);
        cr_assert(kiln_tuning_state_is(names[j], kind), "%s has %s, which base/tuning_states.h says is not %s", where,
                  names[j], kind_name[kind]);
    }
    cr_assert_eq(n, want, "%s names %d tuning states, base/tuning_states.h has %d (a state twice?)", where, n, want);
}

Test(state, tuning_names_and_kinds)
{
    for (int i = 0; i < NTUNING; i++) {
        cr_assert_eq(kiln_tuning_state_parse(k_tuning[i]), i, "%s", k_tuning[i]);
        cr_assert_neq(kiln_tuning_ended(k_tuning[i]), kiln_tuning_active(k_tuning[i]), "%s is one kind", k_tuning[i]);
    }
    cr_assert_eq(kiln_tuning_state_parse("running"), -1, "names are case-sensitive");
    cr_assert_eq(kiln_tuning_state_parse("QUEUED"), -1, "a job's state, not a tuning job's");
    cr_assert_eq(kiln_tuning_state_parse(NULL), -1);
    cr_assert_not(kiln_tuning_ended(NULL));
    cr_assert_not(kiln_tuning_active("BOGUS"));
    cr_assert_str_eq(KILN_TUNING_NAME(STOPPING), "STOPPING");
    cr_assert(kiln_tuning_active(KILN_TUNING_NAME(RUNNING)));
    cr_assert(kiln_tuning_ended(KILN_TUNING_NAME(STOPPED)));
    char names[64][32];
    int n = caps_words(KILN_TUNING_STATE_LIST, strlen(KILN_TUNING_STATE_LIST), names, 64);
    assert_is_tuning_list(names, n, "KILN_TUNING_STATE_LIST");
    n = caps_words(KILN_TUNING_STATE_ENDED_LIST, strlen(KILN_TUNING_STATE_ENDED_LIST), names, 64);
    assert_is_tuning_kind(names, n, KILN_TUNING_KIND_ENDED, "KILN_TUNING_STATE_ENDED_LIST");
    n = caps_words(STORE_TUNING_ACTIVE_NAMES, strlen(STORE_TUNING_ACTIVE_NAMES), names, 64);
    assert_is_tuning_kind(names, n, KILN_TUNING_KIND_ACTIVE, "store/store_int.h STORE_TUNING_ACTIVE_NAMES");
}

/* The tuning_jobs table's CHECK on state, the last one the migrations (in order) write, and the
 * active index's predicate, which must be the store's STORE_TUNING_ACTIVE_NAMES for its queries
 * to use the index. */
static const char *const tuning_marks[] = {"CHECK (state IN ('RUNNING'", "ON tuning_jobs (state) WHERE state IN ("};
typedef struct { char last[2][64][32]; int nlast[2]; } tuning_checks_t;

static void tuning_checks_scan(const char *path, const char *t, void *ctx)
{
    (void)path;
    tuning_checks_t *k = ctx;
    for (int c = 0; c < 2; c++)
        for (const char *p = strstr(t, tuning_marks[c]); p; p = strstr(p + 1, tuning_marks[c])) {
            const char *b = strstr(p, "IN (") + 4, *close = strchr(b, ')');
            if (close)
                k->nlast[c] = caps_words(b, (size_t)(close - b), k->last[c], 64);
        }
}

Test(state, tuning_migrations_are_the_list)
{
    static tuning_checks_t k = {.nlast = {-1, -1}};
    cr_assert_gt(th_migrations_each(tuning_checks_scan, &k), 0, "cannot read the migrations");
    cr_assert_geq(k.nlast[0], 0, "no migration has %s...)", tuning_marks[0]);
    assert_is_tuning_list(k.last[0], k.nlast[0], "the migrations' tuning_jobs CHECK (state IN (...))");
    cr_assert_geq(k.nlast[1], 0, "no migration has %s...)", tuning_marks[1]);
    assert_is_tuning_kind(k.last[1], k.nlast[1], KILN_TUNING_KIND_ACTIVE, "the migrations' tuning_jobs_active_idx");
}

/* The words between the first mark after from in t and the end of that line. */
static int line_after(const char *t, const char *from, const char *mark, const char *where, char names[][32], int max)
{
    const char *at = strstr(t, from);
    cr_assert_not_null(at, "%s has no \"%s\"", where, from);
    at = strstr(at, mark);
    cr_assert_not_null(at, "%s has no \"%s\" after \"%s\"", where, mark, from);
    at += strlen(mark);
    const char *end = strchr(at, '\n');
    return caps_words(at, end ? (size_t)(end - at) : strlen(at), names, max);
}

Test(state, tuning_copies_are_the_list)
{
    char names[64][32];
    char *t = repo_file("proto/kiln.proto");
    int n = line_after(t, "\nmessage TuningJob {", "string state = 4;", "proto/kiln.proto", names, 64);
    assert_is_tuning_list(names, n, "proto/kiln.proto TuningJob.state's comment");
    free(t);

    t = repo_file("api/openapi.yaml");
    n = line_after(t, "\n    TuningJob:\n", "state: {type: string, enum: [", "api/openapi.yaml", names, 64);
    assert_is_tuning_list(names, n, "api/openapi.yaml TuningJob.state");
    free(t);

    t = repo_file("ui/src/types.ts");
    n = line_after(t, "", "export type TuningState =", "ui/src/types.ts", names, 64);
    assert_is_tuning_list(names, n, "ui/src/types.ts TuningState");
    free(t);
    t = repo_file("ui/src/dom.ts");
    n = list_after(t, "export const TUNING_ENDED = new Set([", "ui/src/dom.ts", names, 64);
    assert_is_tuning_kind(names, n, KILN_TUNING_KIND_ENDED, "ui/src/dom.ts TUNING_ENDED");
    free(t);

    t = repo_file("sdk/python/kiln/client.py");
    n = list_after(t, "\nTUNING_TERMINAL_STATES = frozenset((", "sdk/python/kiln/client.py", names, 64);
    assert_is_tuning_kind(names, n, KILN_TUNING_KIND_ENDED, "sdk/python/kiln/client.py TUNING_TERMINAL_STATES");
    const char *cls = strstr(t, "class TuningJob(");
    const char *doc = cls ? strstr(cls, "``state``") : NULL;
    cr_assert_not_null(doc, "sdk/python/kiln/client.py has no TuningJob docstring naming ``state``");
    const char *dend = strstr(doc, "\"\"\"");
    cr_assert_not_null(dend);
    n = caps_words(doc, (size_t)(dend - doc), names, 64);
    assert_is_tuning_list(names, n, "sdk/python/kiln/client.py TuningJob's docstring");
    free(t);
}
