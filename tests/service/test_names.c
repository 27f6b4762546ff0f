/* test_names.c - every hand-written copy of base/api_names.h's lists (a queue's preemption
 * policies, a project member's roles) names the same values in the same order (the first a
 * policy's default): the migrations' last CHECKs, the OpenAPI schemas, the proto comments, the web
 * UI, the Python SDK's docstrings and the README. A value added to api_names.h and not to a copy
 * fails here, naming the file. (service/, cli/ are made from the list and need no check.) */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/api_names.h"
#include "tests/common/harness.h"

#define NAME_(id, name) name,
static const char *const k_within[] = {KILN_WITHIN_QUEUE_POLICIES(NAME_, NAME_)};
static const char *const k_reclaim[] = {KILN_RECLAIM_WITHIN_COHORT_POLICIES(NAME_, NAME_)};
static const char *const k_roles[] = {KILN_PROJECT_ROLES(NAME_, NAME_)};
#undef NAME_

typedef struct {
    const char *const *names;
    int n;
    const char *what; /* the list in base/api_names.h */
} list_t;

#define LIST(a, what) {a, (int)(sizeof(a) / sizeof(a[0])), what}
static const list_t WITHIN = LIST(k_within, "KILN_WITHIN_QUEUE_POLICIES");
static const list_t RECLAIM = LIST(k_reclaim, "KILN_RECLAIM_WITHIN_COHORT_POLICIES");
static const list_t ROLES = LIST(k_roles, "KILN_PROJECT_ROLES");
#undef LIST

/* How a copy spells its values: QUOTED, only words in quotes ('x' or "x"), so that prose around
 * them does not count; BARE, every lower-case word but null (YAML lists, TypeScript keys). */
enum { QUOTED, BARE };

/* Reads the values of text[0..len) into words (up to max, each under 32 bytes); returns how many. */
static int value_words(const char *text, size_t len, int how, char words[][32], int max)
{
    int n = 0;
    for (size_t i = 0; i < len;) {
        bool start = (text[i] >= 'a' && text[i] <= 'z') && (i == 0 || !((text[i - 1] >= 'a' && text[i - 1] <= 'z')
                                                                        || text[i - 1] == '_'));
        if (!start) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < len && ((text[j] >= 'a' && text[j] <= 'z') || text[j] == '_'))
            j++;
        char q = i > 0 ? text[i - 1] : '\0';
        bool take = how == BARE ? !(j - i == 4 && strncmp(text + i, "null", 4) == 0)
                                : (q == '"' || q == '\'') && j < len && text[j] == q;
        if (take && n < max && j - i < 32) {
            memcpy(words[n], text + i, j - i);
            words[n][j - i] = '\0';
            n++;
        }
        i = j;
    }
    return n;
}

/* words[0..n) is the list (whole, or only its first value, the default, when first_only), in order. */
static void assert_words(char words[][32], int n, const list_t *l, bool first_only, const char *where)
{
    int want = first_only ? 1 : l->n;
    char all[256] = "";
    for (int i = 0; i < want; i++)
        snprintf(all + strlen(all), sizeof all - strlen(all), "%s%s", i ? " " : "", l->names[i]);
    cr_assert_eq(n, want, "%s names %d values; base/api_names.h's %s %s %d (%s)", where, n, l->what,
                 first_only ? "defaults to" : "has", want, all);
    for (int i = 0; i < n; i++)
        cr_assert_str_eq(words[i], l->names[i], "%s: value %d is %s, base/api_names.h's %s says %s (%s)", where, i,
                         words[i], l->what, l->names[i], all);
}

/* One copy: in path, after anchor (NULL: the file's start), the text from mark to the next stop. */
typedef struct {
    const char *path, *anchor, *mark, *stop;
    int how;
    const list_t *list;
    bool first_only;
} copy_t;

static void check_copy(const copy_t *c)
{
    char *t = th_repo_file(c->path);
    cr_assert_not_null(t, "cannot read %s under $KILN_ROOT (run the tests from tests/run.sh, which sets it)", c->path);
    const char *from = t;
    if (c->anchor) {
        from = strstr(t, c->anchor);
        cr_assert_not_null(from, "%s has no \"%s\"", c->path, c->anchor);
    }
    const char *at = strstr(from, c->mark);
    cr_assert_not_null(at, "%s has no \"%s\"%s%s", c->path, c->mark, c->anchor ? " after " : "",
                       c->anchor ? c->anchor : "");
    at += strlen(c->mark);
    const char *end = strstr(at, c->stop);
    cr_assert_not_null(end, "%s: no \"%s\" ends the list after \"%s\"", c->path, c->stop, c->mark);
    char words[32][32], where[512];
    int n = value_words(at, (size_t)(end - at), c->how, words, 32);
    snprintf(where, sizeof where, "%s (after \"%s\")", c->path, c->mark);
    assert_words(words, n, c->list, c->first_only, where);
    free(t);
}

static void check_copies(const copy_t *c, size_t n)
{
    for (size_t i = 0; i < n; i++)
        check_copy(&c[i]);
}

Test(names, openapi_is_the_lists)
{
    static const copy_t c[] = {
        {"api/openapi.yaml", NULL, "within_queue:\n          type: [string, 'null']\n          enum: [", "]", BARE,
         &WITHIN, false},
        {"api/openapi.yaml", "within_queue:\n          type: [string, 'null']", "default: ", "\n", BARE, &WITHIN, true},
        {"api/openapi.yaml", NULL, "reclaim_within_cohort:\n          type: [string, 'null']\n          enum: [", "]",
         BARE, &RECLAIM, false},
        {"api/openapi.yaml", "reclaim_within_cohort:\n          type: [string, 'null']", "default: ", "\n", BARE,
         &RECLAIM, true},
        {"api/openapi.yaml", NULL, "within_queue: {type: string, enum: [", "]", BARE, &WITHIN, false},
        {"api/openapi.yaml", NULL, "reclaim_within_cohort: {type: string, enum: [", "]", BARE, &RECLAIM, false},
        {"api/openapi.yaml", NULL, "to `{\"within_queue\": ", ",", QUOTED, &WITHIN, true},
        {"api/openapi.yaml", "to `{\"within_queue\": ", "\"reclaim_within_cohort\": ", "}", QUOTED, &RECLAIM, true},
        {"api/openapi.yaml", NULL, "\n    Role:\n      type: string\n      enum: [", "]", BARE, &ROLES, false},
    };
    check_copies(c, sizeof(c) / sizeof(c[0]));
}

Test(names, proto_comments_are_the_lists)
{
    static const copy_t c[] = {
        {"proto/kiln.proto", NULL, "string within_queue = 1;", ": ", QUOTED, &WITHIN, false},
        {"proto/kiln.proto", NULL, "string reclaim_within_cohort = 2;", ": ", QUOTED, &RECLAIM, false},
        {"proto/kiln.proto", "message ProjectRole {", "// role: ", "\n", QUOTED, &ROLES, false},
    };
    check_copies(c, sizeof(c) / sizeof(c[0]));
}

Test(names, ui_is_the_lists)
{
    static const copy_t c[] = {
        {"ui/src/pages/queues.ts", NULL, "const WITHIN: QueuePreemption['within_queue'][] = [", "]", QUOTED, &WITHIN,
         false},
        {"ui/src/pages/queues.ts", NULL, "const RECLAIM: QueuePreemption['reclaim_within_cohort'][] = [", "]", QUOTED,
         &RECLAIM, false},
        {"ui/src/types.ts", "export interface QueuePreemption {", "within_queue: ", ";", QUOTED, &WITHIN, false},
        {"ui/src/types.ts", "export interface QueuePreemption {", "reclaim_within_cohort: ", ";", QUOTED, &RECLAIM,
         false},
        /* the roles by rank, from 1 (the enum's numbers) */
        {"ui/src/api.ts", NULL, "const RANK: Record<string, number> = {", "}", BARE, &ROLES, false},
    };
    check_copies(c, sizeof(c) / sizeof(c[0]));
}

Test(names, sdk_and_readme_are_the_lists)
{
    static const copy_t c[] = {
        {"sdk/python/kiln/client.py", "def queues(self)", "{\"within_queue\": ", ",", QUOTED, &WITHIN, false},
        {"sdk/python/kiln/client.py", "def queues(self)", "\"reclaim_within_cohort\": ", "}", QUOTED, &RECLAIM,
         false},
        {"sdk/python/kiln/client.py", "def create_queue(", "(preempt_within_queue ", ")", QUOTED, &WITHIN, false},
        {"sdk/python/kiln/client.py", "def create_queue(", "(reclaim_within_cohort ", ")", QUOTED, &RECLAIM, false},
        {"sdk/python/kiln/client.py", "def set_member(", "the role ", " in ", QUOTED, &ROLES, false},
        {"README.md", NULL, "`\"preemption\": {\"within_queue\": ", ",", QUOTED, &WITHIN, false},
        {"README.md", "`\"preemption\": {\"within_queue\": ", "\"reclaim_within_cohort\": ", "}", QUOTED, &RECLAIM,
         false},
    };
    check_copies(c, sizeof(c) / sizeof(c[0]));
}

/* The database's CHECKs: the last one the migrations (in order) write for each column. Applied
 * migrations are never rewritten: a value added to api_names.h needs a new migration that replaces
 * the constraint, and this test fails until there is one. */
static const struct { const char *col; const list_t *list; } name_checks[] = {
    {"(preempt_within_queue IN (", &WITHIN},
    {"(reclaim_within_cohort IN (", &RECLAIM},
    {"(role IN (", &ROLES},
};
enum { NCHECKS = sizeof(name_checks) / sizeof(name_checks[0]) };
typedef struct { char last[NCHECKS][32][32], from[NCHECKS][700]; int nlast[NCHECKS]; } name_checks_t;

static void name_checks_scan(const char *path, const char *t, void *ctx)
{
    name_checks_t *k = ctx;
    for (int c = 0; c < NCHECKS; c++)
        for (const char *p = strstr(t, name_checks[c].col); p; p = strstr(p + 1, name_checks[c].col)) {
            const char *b = p + strlen(name_checks[c].col), *close = strchr(b, ')');
            if (p - t >= 6 && strncmp(p - 6, "CHECK ", 6) == 0 && close) {
                k->nlast[c] = value_words(b, (size_t)(close - b), QUOTED, k->last[c], 32);
                snprintf(k->from[c], sizeof k->from[c], "%s CHECK %s", path, name_checks[c].col);
            }
        }
}

Test(names, migration_checks_are_the_lists)
{
    static name_checks_t k;
    for (int c = 0; c < NCHECKS; c++)
        k.nlast[c] = -1;
    cr_assert_gt(th_migrations_each(name_checks_scan, &k), 0, "cannot read the migrations");
    for (int c = 0; c < NCHECKS; c++) {
        cr_assert_geq(k.nlast[c], 0, "no migration has CHECK %s...))", name_checks[c].col);
        assert_words(k.last[c], k.nlast[c], name_checks[c].list, false, k.from[c]);
    }
}
