/* query.h - kiln's filter language: one line of text that selects jobs, the same in the CLI, the
 * SDK, REST, gRPC and the web UI, with the order_by and columns lists that travel with it.
 * A hand-written lexer and a recursive-descent parser turn text into a small tree whose field
 * names are resolved against one fixed table (the hyperparameter, model and resources names come
 * from spec/); store/ compiles the tree to parameterised SQL. Nothing here touches a database,
 * and no text of a query ever becomes SQL text: keys and values travel as bound parameters.
 *
 * The language (docs/search.md has it for users):
 *   filter  := or
 *   or      := and (OR and)*             AND binds tighter than OR; NOT tighter than AND
 *   and     := unary (AND unary)*
 *   unary   := NOT unary | primary
 *   primary := '(' or ')' | EXISTS field | field EXISTS
 *            | field op value | field [NOT] IN '(' value (',' value)* ')'
 *   op      := = | != | < | <= | > | >= | ~ (case-insensitive substring) | !~
 * Keywords are case-insensitive. Fields: id, name, project, queue, state, priority, attempt,
 * created, started, ended, duration, progress, tags.KEY, hp.NAME, model.FIELD, resources.FIELD,
 * metrics.NAME.(min|max|last|count). A path segment may be quoted: tags."cost center".
 * Values: numbers (3e-4), quoted strings ("nlp", 'nlp'; \" \' \\ escape), bare words (COMPLETED),
 * durations (500ms 90s 15m 2h 1d 1w), times (2026-11-01, 2026-11-01T06:00:00Z, "now", and ages
 * such as -7d: seven days before now).
 *
 * Meaning. A comparison with a value the job does not have (a tag it lacks, a metric it never
 * reported, `ended` of a running job) is false, so `tags.team != "nlp"` matches only jobs with
 * another team and `NOT tags.team = "nlp"` also those without one. Text compares with =, !=, IN
 * and ~ only; numbers, times and durations with every operator. `duration` is ended (or now,
 * for a job still running) minus started, in seconds; `progress` is progress_step / total_steps
 * (0 to 1). */
#ifndef KILN_QUERY_H
#define KILN_QUERY_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"

/* Longest filter, order_by or columns text accepted (bytes). */
#define QUERY_MAX_TEXT 16384
/* Most comparisons in one filter, values in one IN list, keys in one order_by, columns. */
#define QUERY_MAX_TERMS 256
/* Most of them on hp.* and metrics.* in one filter: each is a lookup in its own table, and
 * PostgreSQL's planning time grows steeply with the lookups joined by AND (64: 1 s, 256: 10 min). */
#define QUERY_MAX_TABLE_TERMS 32
#define QUERY_MAX_IN 1000
#define QUERY_MAX_VALUES 10000 /* in all IN lists of a filter together */
#define QUERY_MAX_ORDER 8
/* The oldest age a filter may name (-7d: seven days before now), in seconds: 1,000 years, so
 * that now minus an age is a time every part of kiln (and PostgreSQL's timestamptz) holds. */
#define QUERY_MAX_AGE_S (1000.0 * 365.25 * 86400)
#define QUERY_MAX_COLUMNS 64

typedef enum query_field_id {
    QF_ID, QF_NAME, QF_PROJECT, QF_QUEUE, QF_STATE, QF_PRIORITY, QF_ATTEMPT, QF_CREATED, QF_STARTED,
    QF_ENDED, QF_DURATION, QF_PROGRESS, QF_TAG, QF_HP, QF_MODEL, QF_RESOURCE, QF_METRIC
} query_field_id_t;

/* The type of a field; literals are converted to it while parsing. */
typedef enum query_type {
    QT_TEXT,       /* compared as text */
    QT_NUMBER,     /* double */
    QT_TIME,       /* Unix microseconds */
    QT_DURATION    /* seconds (double) */
} query_type_t;

/* Which summary of a metric (metrics.NAME.AGG); QA_NONE elsewhere, and for a column naming the
 * whole summary. */
typedef enum query_agg { QA_NONE = 0, QA_MIN, QA_MAX, QA_LAST, QA_COUNT } query_agg_t;

typedef struct query_field {
    query_field_id_t id;
    query_type_t type;
    const char *key;     /* QF_TAG: the tag key; QF_HP: the hyperparameter; QF_MODEL, QF_RESOURCE:
                            the spec field; QF_METRIC: the metric name; else NULL. From the arena */
    query_agg_t agg;     /* QF_METRIC */
    bool nullable;       /* whether a job may lack a value for it */
} query_field_t;

typedef enum query_op { QO_EQ, QO_NE, QO_LT, QO_LE, QO_GT, QO_GE, QO_MATCH } query_op_t;

typedef struct query_value {
    double num;          /* QT_NUMBER; QT_DURATION (seconds) */
    int64_t us;          /* QT_TIME */
    const char *text;    /* QT_TEXT (from the arena): for QO_MATCH the substring itself */
} query_value_t;

typedef enum query_kind { QN_AND, QN_OR, QN_NOT, QN_CMP, QN_IN, QN_EXISTS } query_kind_t;

typedef struct query_node {
    query_kind_t kind;
    struct query_node *left, *right; /* QN_AND, QN_OR: both; QN_NOT: left */
    query_field_t field;             /* QN_CMP, QN_IN, QN_EXISTS */
    query_op_t op;                   /* QN_CMP */
    query_value_t *values;           /* QN_CMP: 1, QN_IN: nvalues (of the field's type) */
    int nvalues;
} query_node_t;

/* Parses a filter. now_us is the time ages (-7d) and "now" count from, and what `duration` of a
 * running job is measured to. Blank text gives *out = NULL: every job matches. The tree, its
 * strings and values are allocated from arena. Returns 0, or KILN_EINVAL with err->field
 * "filter", a message naming what is wrong and its column, err->detail holding the query (or the
 * part around the mistake) with a caret line under the offending token, and err->hint a fix (the
 * nearest field name, state, unit or summary when there is one). Thread-safe. */
int query_parse(const char *text, int64_t now_us, arena_t *arena, query_node_t **out, kiln_err_t *err);

/* One key of an ordering. */
typedef struct query_order_key {
    query_field_t field;
    bool desc;
} query_order_key_t;
typedef struct query_order {
    query_order_key_t keys[QUERY_MAX_ORDER];
    int n;               /* 0: the default order, newest first */
} query_order_t;

/* Parses "FIELD [asc|desc], ..." (any field the filter knows; asc is the default). Blank text
 * gives n = 0. Errors as query_parse, with err->field "order_by". */
int query_order_parse(const char *text, arena_t *arena, query_order_t *out, kiln_err_t *err);

/* One column a search returns with each job. */
typedef struct query_column {
    const char *name;    /* as the reply names it: "hp.lr", "metrics.val_loss.min", "metrics.val_loss" */
    query_field_id_t id; /* QF_HP or QF_METRIC */
    const char *key;     /* the hyperparameter or metric; NULL for hp.* and metrics.* (all of them) */
    query_agg_t agg;     /* QF_METRIC: one summary, or QA_NONE for the whole summary */
} query_column_t;
typedef struct query_columns {
    query_column_t cols[QUERY_MAX_COLUMNS];
    int n;
} query_columns_t;

/* Parses a comma-separated list of columns: hp.NAME, hp.*, metrics.NAME.(min|max|last|count),
 * metrics.NAME (the whole summary) and metrics.* (every metric's summary). Blank text gives
 * n = 0. Errors as query_parse, with err->field "columns". */
int query_columns_parse(const char *text, arena_t *arena, query_columns_t *out, kiln_err_t *err);

/* ---- building filters in code (the legacy `status` and `tag` list parameters) ------------- */

/* field IN (values[0..n)) as a text comparison (n == 1: field = value). field is a field name
 * of the language ("state", "tags.team"); values are checked as a parsed literal would be (a
 * state must be a state). Errors as query_parse, with err->field set to what_field. */
int query_build_in(const char *field, const char *const *values, int n, const char *what_field,
                   arena_t *arena, query_node_t **out, kiln_err_t *err);
/* EXISTS field. */
int query_build_exists(const char *field, const char *what_field, arena_t *arena, query_node_t **out,
                       kiln_err_t *err);
/* a AND b; either may be NULL (then the other is returned). */
query_node_t *query_and(arena_t *arena, query_node_t *a, query_node_t *b);

/* ---- names ------------------------------------------------------------------------------- */

/* The language's name of a field ("hp.lr", "metrics.val_loss.min", "created"), into buf. */
const char *query_field_name(const query_field_t *f, char *buf, size_t n);
/* "min", "max", "last", "count" ("" for QA_NONE). */
const char *query_agg_name(query_agg_t agg);

#endif /* KILN_QUERY_H */
