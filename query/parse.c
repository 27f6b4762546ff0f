/* parse.c - the filter language's parser (query.h has the grammar): fields resolved against the
 * one table of names (hyperparameter, model and resources names from spec/), literals converted
 * to the field's type, NOT/AND/OR by recursive descent, and the order_by and columns lists.
 * Errors say what is wrong, where (lex.c draws the caret) and the nearest name that would do. */
#include "query/query_int.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/job_states.h"
#include "spec/spec.h"

/* ---- the table of names ------------------------------------------------------------------- */

static const struct {
    const char *name;
    query_field_id_t id;
    query_type_t type;
    bool nullable;
} k_top[] = {
    {"id", QF_ID, QT_TEXT, false},           {"name", QF_NAME, QT_TEXT, false},
    {"project", QF_PROJECT, QT_TEXT, false}, {"queue", QF_QUEUE, QT_TEXT, false},
    {"state", QF_STATE, QT_TEXT, false},     {"priority", QF_PRIORITY, QT_NUMBER, false},
    {"attempt", QF_ATTEMPT, QT_NUMBER, false}, {"created", QF_CREATED, QT_TIME, false},
    {"started", QF_STARTED, QT_TIME, true},  {"ended", QF_ENDED, QT_TIME, true},
    {"duration", QF_DURATION, QT_DURATION, true}, {"progress", QF_PROGRESS, QT_NUMBER, true},
};

/* Every name a field path may start with, for "did you mean". */
static const char *const k_first[] = {"id", "name", "project", "queue", "state", "priority", "attempt",
                                      "created", "started", "ended", "duration", "progress", "tags",
                                      "hp", "model", "resources", "metrics", NULL};

static const char *const k_aggs[] = {"min", "max", "last", "count", NULL};

#define QUERY_STATE_(name, num, kind) #name,
static const char *const k_states[] = {KILN_JOB_STATES(QUERY_STATE_) NULL};
#undef QUERY_STATE_

#define FIELDS_LIST                                                                                    \
    "fields are id, name, project, queue, state, priority, attempt, created, started, ended, "       \
    "duration, progress, tags.KEY, hp.NAME, model.FIELD, resources.FIELD and "                       \
    "metrics.NAME.min|max|last|count"

const char *query_agg_name(query_agg_t agg)
{
    switch (agg) {
    case QA_MIN: return "min";
    case QA_MAX: return "max";
    case QA_LAST: return "last";
    case QA_COUNT: return "count";
    default: return "";
    }
}

const char *query_field_name(const query_field_t *f, char *buf, size_t n)
{
    switch (f->id) {
    case QF_TAG: snprintf(buf, n, "tags.%s", f->key); break;
    case QF_HP: snprintf(buf, n, "hp.%s", f->key); break;
    case QF_MODEL: snprintf(buf, n, "model.%s", f->key); break;
    case QF_RESOURCE: snprintf(buf, n, "resources.%s", f->key); break;
    case QF_METRIC:
        if (f->agg == QA_NONE)
            snprintf(buf, n, "metrics.%s", f->key);
        else
            snprintf(buf, n, "metrics.%s.%s", f->key, query_agg_name(f->agg));
        break;
    default:
        for (size_t i = 0; i < KILN_ARRAY_LEN(k_top); i++)
            if (k_top[i].id == f->id)
                snprintf(buf, n, "%s", k_top[i].name);
        break;
    }
    return buf;
}

/* The candidate nearest to word within a small edit distance, or NULL. */
static const char *nearest(const char *word, const char *const *cands)
{
    const char *best = NULL;
    int best_d = 99;
    size_t wl = strlen(word);
    for (size_t i = 0; cands[i]; i++) {
        int d = kiln_edit_distance(word, cands[i]);
        if (d < best_d) {
            best_d = d;
            best = cands[i];
        }
    }
    return best && best_d <= 3 && (size_t)best_d < KILN_MAX(wl, (size_t)2) ? best : NULL;
}

static bool in_list(const char *word, const char *const *list)
{
    for (size_t i = 0; list[i]; i++)
        if (!strcmp(word, list[i]))
            return true;
    return false;
}

/* "a, b, c" of a NULL-terminated list, prefixed. */
static const char *list_text(arena_t *a, const char *prefix, const char *const *list)
{
    size_t n = 1;
    for (size_t i = 0; list[i]; i++)
        n += strlen(prefix) + strlen(list[i]) + 2;
    char *s = arena_alloc(a, n);
    for (size_t i = 0; list[i]; i++) {
        if (i)
            strcat(s, ", ");
        strcat(s, prefix);
        strcat(s, list[i]);
    }
    return s;
}

/* segs[from..nsegs) joined by '.' (arena). */
static const char *join_segs(qctx_t *q, const qtok_t *t, int from)
{
    size_t n = 1;
    for (int i = from; i < t->nsegs; i++)
        n += strlen(t->segs[i]) + 1;
    char *s = arena_alloc(q->arena, n);
    for (int i = from; i < t->nsegs; i++) {
        if (i > from)
            strcat(s, ".");
        strcat(s, t->segs[i]);
    }
    return s;
}

static bool has_wildcard(const qtok_t *t)
{
    for (int i = 0; i < t->nsegs; i++)
        if (!strcmp(t->segs[i], "*"))
            return true;
    return false;
}

/* A spec section's field (model.X, resources.X): the type from spec/, errors with the nearest. */
static int resolve_spec_field(qctx_t *q, const qtok_t *t, const char *section, const char *prefix,
                              const char *const *keys, query_field_t *f)
{
    if (t->nsegs != 2) {
        if (t->nsegs < 2)
            return qfail(q, t->pos, t->len, arena_sprintf(q->arena, "%s are %s", prefix, list_text(q->arena, "", keys)),
                         "%s needs a field name (%s.FIELD)", t->segs[0], t->segs[0]);
        return qfail(q, t->pos, t->len, NULL, "%s has no field \"%s\"", t->segs[0], join_segs(q, t, 1));
    }
    const char *key = t->segs[1];
    spec_kind_t kind = spec_key_kind(section, key);
    if (kind == SPEC_KIND_NONE) {
        const char *best = nearest(key, keys);
        return qfail(q, t->pos, t->len,
                     best ? arena_sprintf(q->arena, "did you mean %s.%s?", t->segs[0], best)
                          : arena_sprintf(q->arena, "%s are %s", prefix, list_text(q->arena, "", keys)),
                     "unknown field \"%s\"", t->text);
    }
    if (kind == SPEC_KIND_LIST)
        return qfail(q, t->pos, t->len, NULL, "%s is a list and cannot be searched", t->text);
    f->key = key;
    f->type = kind == SPEC_KIND_TEXT ? QT_TEXT : QT_NUMBER;
    f->nullable = true;
    if (f->id == QF_RESOURCE && (!strcmp(key, "nodes") || !strcmp(key, "slots_per_node") || !strcmp(key, "slot_type")))
        f->nullable = false;
    return 0;
}

/* Resolves a path token to a field. whole_metric: "metrics.NAME" (no summary) is allowed. */
static int resolve_field(qctx_t *q, const qtok_t *t, query_field_t *f)
{
    memset(f, 0, sizeof *f);
    if (t->kind != QK_PATH) {
        if (t->kind == QK_EOF)
            return qfail(q, t->pos, 1, FIELDS_LIST, "expected a field, got the end of the %s", q->what);
        return qfail(q, t->pos, t->len, FIELDS_LIST, "expected a field, got %s", qtok_describe(q, t));
    }
    if (qtok_is_any_kw(t))
        return qfail(q, t->pos, t->len, FIELDS_LIST, "expected a field, got %s", qtok_describe(q, t));
    if (has_wildcard(t))
        return qfail(q, t->pos, t->len, "wildcards (hp.*, metrics.*) are for columns",
                     "\"%s\" names more than one field", t->text);
    char first[64];
    kiln_strlcpy(first, t->segs[0], sizeof first);
    for (char *p = first; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    for (size_t i = 0; i < KILN_ARRAY_LEN(k_top); i++) {
        if (strcmp(first, k_top[i].name) != 0)
            continue;
        if (t->nsegs > 1)
            return qfail(q, t->pos, t->len, FIELDS_LIST, "%s has no parts (\"%s\")", k_top[i].name, t->text);
        f->id = k_top[i].id;
        f->type = k_top[i].type;
        f->nullable = k_top[i].nullable;
        return 0;
    }
    if (!strcmp(first, "tags")) {
        if (t->nsegs < 2)
            return qfail(q, t->pos, t->len, "name the tag: tags.team", "tags needs a key (tags.KEY)");
        f->id = QF_TAG;
        f->type = QT_TEXT;
        f->key = join_segs(q, t, 1);
        f->nullable = true;
        return 0;
    }
    if (!strcmp(first, "hp")) {
        /* kiln's engine's hyperparameters, or a script job's own: any name ("hp.epochs",
         * "hp.batch-size", "hp.model.depth" for {"model": {"depth": 4}}, quoted when it holds
         * other characters). An unquoted name one or two letters off an engine's name is taken
         * for a typo of it; quoting it (hp."lrr") names a script's own. */
        const char *best = t->nsegs == 2 && !t->quoted && !in_list(t->segs[1], spec_hparam_keys)
                               ? nearest(t->segs[1], spec_hparam_keys)
                               : NULL;
        if (best && kiln_edit_distance(t->segs[1], best) > 2)
            best = NULL;
        if (t->nsegs < 2 || best) {
            const char *hint = best ? arena_sprintf(q->arena, "did you mean hp.%s?", best)
                                    : arena_sprintf(q->arena, "hyperparameters are %s, or a script job's own",
                                                    list_text(q->arena, "hp.", spec_hparam_keys));
            if (t->nsegs < 2)
                return qfail(q, t->pos, t->len, hint, "hp needs a hyperparameter name (hp.NAME)");
            return qfail(q, t->pos, t->len, hint, "unknown hyperparameter \"%s\"", join_segs(q, t, 1));
        }
        f->id = QF_HP;
        f->type = QT_NUMBER;
        f->key = join_segs(q, t, 1);
        f->nullable = true;
        return 0;
    }
    if (!strcmp(first, "model")) {
        f->id = QF_MODEL;
        return resolve_spec_field(q, t, "model", "model fields", spec_model_keys, f);
    }
    if (!strcmp(first, "resources")) {
        f->id = QF_RESOURCE;
        return resolve_spec_field(q, t, "resources", "resources fields", spec_resource_keys, f);
    }
    if (!strcmp(first, "metrics")) {
        if (t->nsegs < 3) {
            const char *name = t->nsegs == 2 ? t->segs[1] : "NAME";
            return qfail(q, t->pos, t->len, arena_sprintf(q->arena, "for example metrics.%s.min", name),
                         "%s needs a summary: .min, .max, .last or .count", t->text);
        }
        const char *agg = t->segs[t->nsegs - 1];
        f->agg = !strcmp(agg, "min") ? QA_MIN : !strcmp(agg, "max") ? QA_MAX : !strcmp(agg, "last") ? QA_LAST
                 : !strcmp(agg, "count")                         ? QA_COUNT
                                                                 : QA_NONE;
        const char *name = arena_strndup(q->arena, t->text + strlen(t->segs[0]) + 1,
                                         strlen(t->text) - strlen(t->segs[0]) - strlen(agg) - 2);
        if (f->agg == QA_NONE) {
            const char *best = nearest(agg, k_aggs);
            return qfail(q, t->pos, t->len,
                         best ? arena_sprintf(q->arena, "did you mean metrics.%s.%s?", name, best)
                              : "a metric's summaries are .min, .max, .last and .count",
                         "unknown summary \"%s\" of metric \"%s\"", agg, name);
        }
        f->id = QF_METRIC;
        f->type = QT_NUMBER;
        f->key = name;
        f->nullable = true;
        return 0;
    }
    /* Unknown: "lr" is probably hp.lr, "n_layer" model.n_layer; else the nearest name. */
    const char *hint = NULL;
    if (t->nsegs == 1 && in_list(t->segs[0], spec_hparam_keys))
        hint = arena_sprintf(q->arena, "did you mean hp.%s?", t->segs[0]);
    else if (t->nsegs == 1 && spec_key_kind("model", t->segs[0]) != SPEC_KIND_NONE)
        hint = arena_sprintf(q->arena, "did you mean model.%s?", t->segs[0]);
    else if (t->nsegs == 1 && spec_key_kind("resources", t->segs[0]) != SPEC_KIND_NONE)
        hint = arena_sprintf(q->arena, "did you mean resources.%s?", t->segs[0]);
    else {
        const char *best = nearest(first, k_first);
        if (best && t->nsegs > 1)
            hint = arena_sprintf(q->arena, "did you mean %s.%s?", best, join_segs(q, t, 1));
        else if (best)
            hint = arena_sprintf(q->arena, "did you mean %s?", best);
    }
    return qfail(q, t->pos, t->len, hint ? hint : FIELDS_LIST, "unknown field \"%s\"", t->text);
}

/* ---- values ------------------------------------------------------------------------------------- */

static const char *type_word(query_type_t t)
{
    switch (t) {
    case QT_NUMBER: return "a number";
    case QT_TIME: return "a time";
    case QT_DURATION: return "a duration";
    default: return "text";
    }
}

static const char *tok_word(const qtok_t *t)
{
    switch (t->kind) {
    case QK_STRING: return "a string";
    case QK_PATH: return "a word";
    case QK_NUMBER: return "a number";
    case QK_DURATION: return "a duration";
    case QK_TIME: return "a time";
    default: return "something else";
    }
}

static bool is_uuid(const char *s)
{
    if (strlen(s) != 36)
        return false;
    for (int i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (s[i] != '-')
                return false;
        } else if (!isxdigit((unsigned char)s[i])) {
            return false;
        }
    }
    return true;
}

/* Converts the current token to a value of field f's type (op: the comparison it serves). */
static int convert_value(qctx_t *q, const query_field_t *f, query_op_t op, query_value_t *v)
{
    const qtok_t *t = &q->tok;
    char fname[200];
    query_field_name(f, fname, sizeof fname);
    memset(v, 0, sizeof *v);
    bool literal = t->kind == QK_STRING || t->kind == QK_NUMBER || t->kind == QK_DURATION || t->kind == QK_TIME ||
                   (t->kind == QK_PATH && !qtok_is_any_kw(t));
    if (!literal) {
        if (t->kind == QK_EOF)
            return qfail(q, t->pos, 1, "put a value after the operator", "expected a value for %s, got the end of the %s",
                         fname, q->what);
        return qfail(q, t->pos, t->len, "quote text that is a keyword or has spaces: \"...\"",
                     "expected a value for %s, got %s", fname, qtok_describe(q, t));
    }
    if (f->type != QT_TEXT && t->kind == QK_PATH && t->unit_pos > 0) {
        char *num = arena_strndup(q->arena, q->text + t->pos, (size_t)(t->unit_pos - t->pos));
        return qfail(q, t->unit_pos, t->unit_len, "durations are a number and a unit: 500ms, 90s, 15m, 2h, 1d, 1w",
                     "unknown unit \"%.*s\" after %s", t->unit_len, q->text + t->unit_pos, num);
    }
    switch (f->type) {
    case QT_TEXT: {
        const char *s = t->kind == QK_STRING ? t->text : t->kind == QK_PATH && !t->quoted ? t->text : qtok_raw(q, t);
        if (f->id == QF_STATE && op != QO_MATCH) {
            char *up = arena_strdup(q->arena, s);
            for (char *p = up; *p; p++)
                *p = (char)toupper((unsigned char)*p);
            if (!in_list(up, k_states)) {
                const char *best = nearest(up, k_states);
                return qfail(q, t->pos, t->len,
                             best ? arena_sprintf(q->arena, "did you mean %s?", best)
                                  : arena_sprintf(q->arena, "states are %s", list_text(q->arena, "", k_states)),
                             "unknown state \"%s\"", s);
            }
            s = up;
        }
        if (f->id == QF_ID && op != QO_MATCH) {
            if (!is_uuid(s))
                return qfail(q, t->pos, t->len, "to match part of an id, use id ~ \"0b6c\"",
                             "\"%s\" is not a job id (a UUID)", s);
            char *low = arena_strdup(q->arena, s);
            for (char *p = low; *p; p++)
                *p = (char)tolower((unsigned char)*p);
            s = low;
        }
        v->text = s;
        return 0;
    }
    case QT_NUMBER:
        if (t->kind == QK_NUMBER) {
            v->num = t->num;
            return 0;
        }
        return qfail(q, t->pos, t->len, arena_sprintf(q->arena, "compare %s with a number such as 3e-4", fname),
                     "%s is a number; got %s", fname, tok_word(t));
    case QT_TIME:
        if (t->kind == QK_TIME) {
            v->us = t->us;
            return 0;
        }
        if (t->kind == QK_DURATION && t->num < 0) {
            if (t->num < -QUERY_MAX_AGE_S)
                return qfail(q, t->pos, t->len, "an age reaches back at most 1000 years (-52000w)",
                             "age %s is too long ago", qtok_raw(q, t));
            v->us = q->now_us + (int64_t)(t->num * 1e6);
            return 0;
        }
        if (t->kind == QK_PATH && !t->quoted && t->nsegs == 1 && !strcasecmp(t->segs[0], "now")) {
            v->us = q->now_us;
            return 0;
        }
        if (t->kind == QK_STRING && qtime_text(t->text, &v->us) == 0)
            return 0;
        if (t->kind == QK_DURATION)
            return qfail(q, t->pos, t->len, arena_sprintf(q->arena, "an age is negative: -%s means that long ago", qtok_raw(q, t)),
                         "%s is a time; got a duration", fname);
        return qfail(q, t->pos, t->len, "times are dates (2026-11-01), RFC 3339 times (2026-11-01T06:00:00Z), now, "
                                        "or ages such as -7d",
                     "%s is a time; got %s", fname, tok_word(t));
    case QT_DURATION:
        if (t->kind == QK_DURATION || t->kind == QK_NUMBER) {
            v->num = t->num;
            return 0;
        }
        return qfail(q, t->pos, t->len, "durations are 500ms, 90s, 15m, 2h, 1d, 1w, or a number of seconds",
                     "%s is a duration; got %s", fname, tok_word(t));
    }
    return qfail(q, t->pos, t->len, NULL, "%s cannot be compared", fname);
}

/* ---- the grammar ------------------------------------------------------------------------------- */

#define MAX_DEPTH 64

static int parse_or(qctx_t *q, query_node_t **out);

static query_node_t *node_new(qctx_t *q, query_kind_t kind)
{
    query_node_t *n = arena_alloc(q->arena, sizeof *n);
    n->kind = kind;
    return n;
}

static int count_term(qctx_t *q, const query_field_t *f, int pos, int len)
{
    if (++q->terms > QUERY_MAX_TERMS)
        return qfail(q, pos, len, "split the search into several", "more than %d comparisons in one %s",
                     QUERY_MAX_TERMS, q->what);
    if ((f->id == QF_HP || f->id == QF_METRIC) && ++q->table_terms > QUERY_MAX_TABLE_TERMS)
        return qfail(q, pos, len, "narrow the search with fewer of them, or with name, state, tags or created",
                     "more than %d comparisons on hyperparameters and metrics in one %s", QUERY_MAX_TABLE_TERMS,
                     q->what);
    return 0;
}

/* field [NOT] IN ( v, ... ): the current token is '(' */
static int parse_in_list(qctx_t *q, const query_field_t *f, query_node_t **out)
{
    char fname[200];
    query_field_name(f, fname, sizeof fname);
    if (q->tok.kind != QK_LPAREN)
        return qfail(q, q->tok.pos, q->tok.len, arena_sprintf(q->arena, "for example %s IN (a, b)", fname),
                     "expected '(' after IN, got %s", qtok_describe(q, &q->tok));
    int open = q->tok.pos;
    int rc = qlex_next(q);
    if (rc)
        return rc;
    query_node_t *n = node_new(q, QN_IN);
    n->field = *f;
    n->op = QO_EQ;
    int cap = 8;
    n->values = arena_alloc(q->arena, sizeof(query_value_t) * (size_t)cap);
    for (;;) {
        if (n->nvalues == QUERY_MAX_IN)
            return qfail(q, q->tok.pos, q->tok.len, NULL, "more than %d values in one IN list", QUERY_MAX_IN);
        if (++q->values > QUERY_MAX_VALUES)
            return qfail(q, q->tok.pos, q->tok.len, "split the search into several", "more than %d values in the IN lists of one %s",
                         QUERY_MAX_VALUES, q->what);
        if (n->nvalues == cap) {
            query_value_t *nv = arena_alloc(q->arena, sizeof(query_value_t) * (size_t)cap * 2);
            memcpy(nv, n->values, sizeof(query_value_t) * (size_t)cap);
            n->values = nv;
            cap *= 2;
        }
        if ((rc = convert_value(q, f, QO_EQ, &n->values[n->nvalues])))
            return rc;
        n->nvalues++;
        if ((rc = qlex_next(q)))
            return rc;
        if (q->tok.kind == QK_COMMA) {
            if ((rc = qlex_next(q)))
                return rc;
            continue;
        }
        if (q->tok.kind == QK_RPAREN)
            break;
        return qfail(q, q->tok.pos, q->tok.len,
                     arena_sprintf(q->arena, "close the list that opens at column %d", open + 1),
                     "expected ',' or ')' in the IN list, got %s", qtok_describe(q, &q->tok));
    }
    *out = n;
    return qlex_next(q);
}

static int check_op(qctx_t *q, const query_field_t *f, const qtok_t *optok)
{
    char fname[200];
    query_field_name(f, fname, sizeof fname);
    query_op_t op = optok->op;
    if (f->type == QT_TEXT && op != QO_EQ && op != QO_NE && op != QO_MATCH)
        return qfail(q, optok->pos, optok->len, "text compares with =, !=, ~ (substring) and IN",
                     "%s is text and cannot be compared with %.*s", fname, optok->len, q->text + optok->pos);
    if (f->type != QT_TEXT && op == QO_MATCH)
        return qfail(q, optok->pos, optok->len, "~ and !~ match text; compare numbers, times and durations with = != < <= > >=",
                     "%s is %s, not text", fname, type_word(f->type));
    return 0;
}

static int parse_primary(qctx_t *q, query_node_t **out)
{
    int rc;
    qtok_t t = q->tok;
    if (t.kind == QK_LPAREN) {
        if (++q->depth > MAX_DEPTH)
            return qfail(q, t.pos, 1, NULL, "parentheses nested more than %d deep", MAX_DEPTH);
        if ((rc = qlex_next(q)) || (rc = parse_or(q, out)))
            return rc;
        if (q->tok.kind != QK_RPAREN)
            return qfail(q, q->tok.pos, q->tok.len,
                         arena_sprintf(q->arena, "close the '(' at column %d", t.pos + 1),
                         "expected ')', got %s", qtok_describe(q, &q->tok));
        q->depth--;
        return qlex_next(q);
    }
    if (qtok_is_kw(&t, "exists")) {
        if ((rc = qlex_next(q)))
            return rc;
        query_field_t f;
        if ((rc = resolve_field(q, &q->tok, &f)) || (rc = count_term(q, &f, q->tok.pos, q->tok.len)))
            return rc;
        query_node_t *n = node_new(q, QN_EXISTS);
        n->field = f;
        *out = n;
        return qlex_next(q);
    }
    if (t.kind == QK_RPAREN)
        return qfail(q, t.pos, 1, "remove it, or open it with '(' earlier", "unexpected ')'");
    query_field_t f;
    if ((rc = resolve_field(q, &t, &f)) || (rc = count_term(q, &f, t.pos, t.len)) || (rc = qlex_next(q)))
        return rc;
    char fname[200];
    query_field_name(&f, fname, sizeof fname);
    qtok_t op = q->tok;
    if (qtok_is_kw(&op, "exists")) {
        query_node_t *n = node_new(q, QN_EXISTS);
        n->field = f;
        *out = n;
        return qlex_next(q);
    }
    bool negate = false;
    if (qtok_is_kw(&op, "not")) {
        if ((rc = qlex_next(q)))
            return rc;
        if (!qtok_is_kw(&q->tok, "in"))
            return qfail(q, q->tok.pos, q->tok.len, "after a field, NOT comes before IN: name NOT IN (a, b)",
                         "expected IN after NOT, got %s", qtok_describe(q, &q->tok));
        negate = true;
        op = q->tok;
    }
    if (qtok_is_kw(&op, "in")) {
        query_node_t *n = NULL;
        if ((rc = qlex_next(q)) || (rc = parse_in_list(q, &f, &n)))
            return rc;
        if (negate) {
            query_node_t *x = node_new(q, QN_NOT);
            x->left = n;
            n = x;
        }
        *out = n;
        return 0;
    }
    if (op.kind != QK_OP)
        return qfail(q, op.pos, op.len, "compare with =, !=, <, <=, >, >=, ~ (substring), IN (...) or EXISTS",
                     "expected an operator after %s, got %s", fname, qtok_describe(q, &op));
    if ((rc = check_op(q, &f, &op)) || (rc = qlex_next(q)))
        return rc;
    query_node_t *n = node_new(q, QN_CMP);
    n->field = f;
    n->op = op.op;
    n->values = arena_alloc(q->arena, sizeof(query_value_t));
    n->nvalues = 1;
    if ((rc = convert_value(q, &f, op.op, &n->values[0])))
        return rc;
    if (op.op_not) {
        query_node_t *x = node_new(q, QN_NOT);
        x->left = n;
        n = x;
    }
    *out = n;
    return qlex_next(q);
}

static int parse_unary(qctx_t *q, query_node_t **out)
{
    if (!qtok_is_kw(&q->tok, "not"))
        return parse_primary(q, out);
    int pos = q->tok.pos;
    if (++q->depth > MAX_DEPTH)
        return qfail(q, pos, 3, NULL, "NOT nested more than %d deep", MAX_DEPTH);
    int rc = qlex_next(q);
    query_node_t *child = NULL;
    if (rc || (rc = parse_unary(q, &child)))
        return rc;
    q->depth--;
    query_node_t *n = node_new(q, QN_NOT);
    n->left = child;
    *out = n;
    return 0;
}

static int parse_and(qctx_t *q, query_node_t **out)
{
    int rc = parse_unary(q, out);
    while (rc == 0 && qtok_is_kw(&q->tok, "and")) {
        query_node_t *right = NULL;
        if ((rc = qlex_next(q)) || (rc = parse_unary(q, &right)))
            return rc;
        query_node_t *n = node_new(q, QN_AND);
        n->left = *out;
        n->right = right;
        *out = n;
    }
    return rc;
}

static int parse_or(qctx_t *q, query_node_t **out)
{
    int rc = parse_and(q, out);
    while (rc == 0 && qtok_is_kw(&q->tok, "or")) {
        query_node_t *right = NULL;
        if ((rc = qlex_next(q)) || (rc = parse_and(q, &right)))
            return rc;
        query_node_t *n = node_new(q, QN_OR);
        n->left = *out;
        n->right = right;
        *out = n;
    }
    return rc;
}

int query_parse(const char *text, int64_t now_us, arena_t *arena, query_node_t **out, kiln_err_t *err)
{
    qctx_t q;
    *out = NULL;
    int rc = qlex_init(&q, text, "filter", arena, now_us, err);
    if (rc)
        return rc;
    if (q.tok.kind == QK_EOF)
        return 0;
    query_node_t *n = NULL;
    if ((rc = parse_or(&q, &n)))
        return rc;
    if (q.tok.kind != QK_EOF) {
        const char *hint = "join conditions with AND or OR";
        if (q.tok.kind == QK_RPAREN)
            hint = "remove it, or open it with '(' earlier";
        return qfail(&q, q.tok.pos, q.tok.len, hint, "unexpected %s", qtok_describe(&q, &q.tok));
    }
    *out = n;
    return 0;
}

/* ---- order_by and columns ---------------------------------------------------------------------- */

int query_order_parse(const char *text, arena_t *arena, query_order_t *out, kiln_err_t *err)
{
    qctx_t q;
    memset(out, 0, sizeof *out);
    int rc = qlex_init(&q, text, "order_by", arena, 0, err);
    if (rc || q.tok.kind == QK_EOF)
        return rc;
    for (;;) {
        if (out->n == QUERY_MAX_ORDER)
            return qfail(&q, q.tok.pos, q.tok.len, NULL, "more than %d keys", QUERY_MAX_ORDER);
        query_order_key_t *k = &out->keys[out->n];
        if ((rc = resolve_field(&q, &q.tok, &k->field)) || (rc = qlex_next(&q)))
            return rc;
        if (qtok_is_kw(&q.tok, "asc") || qtok_is_kw(&q.tok, "desc")) {
            k->desc = qtok_is_kw(&q.tok, "desc");
            if ((rc = qlex_next(&q)))
                return rc;
        }
        out->n++;
        if (q.tok.kind == QK_EOF)
            return 0;
        if (q.tok.kind != QK_COMMA)
            return qfail(&q, q.tok.pos, q.tok.len, "order_by is FIELD [asc|desc], comma-separated: metrics.val_loss.min, created desc",
                         "expected asc, desc or ',', got %s", qtok_describe(&q, &q.tok));
        if ((rc = qlex_next(&q)))
            return rc;
    }
}

int query_columns_parse(const char *text, arena_t *arena, query_columns_t *out, kiln_err_t *err)
{
    qctx_t q;
    memset(out, 0, sizeof *out);
    int rc = qlex_init(&q, text, "columns", arena, 0, err);
    if (rc || q.tok.kind == QK_EOF)
        return rc;
    for (;;) {
        qtok_t t = q.tok;
        query_column_t c = {0};
        if (t.kind != QK_PATH || qtok_is_any_kw(&t))
            return qfail(&q, t.pos, t.len, "columns are hp.NAME, hp.*, metrics.NAME[.min|.max|.last|.count] and metrics.*",
                         "expected a column, got %s", qtok_describe(&q, &t));
        if (!strcasecmp(t.segs[0], "hp")) {
            c.id = QF_HP;
            if (t.nsegs == 2 && !strcmp(t.segs[1], "*")) {
                c.name = "hp.*";
            } else {
                query_field_t f;
                if ((rc = resolve_field(&q, &t, &f)))
                    return rc;
                c.key = f.key;
                c.name = arena_sprintf(arena, "hp.%s", f.key);
            }
        } else if (!strcasecmp(t.segs[0], "metrics")) {
            c.id = QF_METRIC;
            if (t.nsegs == 2 && !strcmp(t.segs[1], "*")) {
                c.name = "metrics.*";
            } else if (t.nsegs < 2 || has_wildcard(&t)) {
                return qfail(&q, t.pos, t.len, "for example metrics.val_loss, metrics.val_loss.min or metrics.*",
                             "\"%s\" is not a metric column", t.text);
            } else if (t.nsegs >= 3 && in_list(t.segs[t.nsegs - 1], k_aggs)) {
                query_field_t f;
                if ((rc = resolve_field(&q, &t, &f)))
                    return rc;
                c.key = f.key;
                c.agg = f.agg;
                c.name = arena_sprintf(arena, "metrics.%s.%s", f.key, query_agg_name(f.agg));
            } else {
                c.key = join_segs(&q, &t, 1);
                c.name = arena_sprintf(arena, "metrics.%s", c.key);
            }
        } else {
            query_field_t f;
            if ((rc = resolve_field(&q, &t, &f)))
                return rc;
            return qfail(&q, t.pos, t.len, "columns choose hp.* and metrics.* values; the other fields come with every job",
                         "%s is not a column", t.text);
        }
        bool dup = false;
        for (int i = 0; i < out->n && !dup; i++)
            dup = !strcmp(out->cols[i].name, c.name);
        if (!dup) {
            if (out->n == QUERY_MAX_COLUMNS)
                return qfail(&q, t.pos, t.len, "use hp.* or metrics.*", "more than %d columns", QUERY_MAX_COLUMNS);
            out->cols[out->n++] = c;
        }
        if ((rc = qlex_next(&q)))
            return rc;
        if (q.tok.kind == QK_EOF)
            return 0;
        if (q.tok.kind != QK_COMMA)
            return qfail(&q, q.tok.pos, q.tok.len, "separate columns with commas: hp.lr,metrics.val_loss.min",
                         "expected ',' between columns, got %s", qtok_describe(&q, &q.tok));
        if ((rc = qlex_next(&q)))
            return rc;
    }
}

/* ---- building in code ------------------------------------------------------------------------- */

/* Resolves field text (one path) for a built filter. */
static int built_field(qctx_t *q, const char *field, const char *what, arena_t *arena, query_field_t *f,
                       kiln_err_t *err)
{
    int rc = qlex_init(q, field, what, arena, 0, err);
    if (rc)
        return rc;
    q->built = true;
    return resolve_field(q, &q->tok, f);
}

int query_build_in(const char *field, const char *const *values, int n, const char *what_field,
                   arena_t *arena, query_node_t **out, kiln_err_t *err)
{
    qctx_t q;
    query_field_t f;
    *out = NULL;
    int rc = built_field(&q, field, what_field, arena, &f, err);
    if (rc)
        return rc;
    if (n < 1 || n > QUERY_MAX_IN)
        return qfail(&q, 0, 1, NULL, "%s needs 1 to %d values", what_field, QUERY_MAX_IN);
    query_node_t *node = node_new(&q, n == 1 ? QN_CMP : QN_IN);
    node->field = f;
    node->op = QO_EQ;
    node->values = arena_alloc(arena, sizeof(query_value_t) * (size_t)n);
    node->nvalues = n;
    for (int i = 0; i < n; i++) {
        memset(&q.tok, 0, sizeof q.tok);
        q.tok.kind = QK_STRING;
        q.tok.text = arena_strdup(arena, values[i]);
        if ((rc = convert_value(&q, &f, QO_EQ, &node->values[i])))
            return rc;
    }
    *out = node;
    return 0;
}

int query_build_exists(const char *field, const char *what_field, arena_t *arena, query_node_t **out,
                       kiln_err_t *err)
{
    qctx_t q;
    query_field_t f;
    *out = NULL;
    int rc = built_field(&q, field, what_field, arena, &f, err);
    if (rc)
        return rc;
    query_node_t *node = node_new(&q, QN_EXISTS);
    node->field = f;
    *out = node;
    return 0;
}

query_node_t *query_and(arena_t *arena, query_node_t *a, query_node_t *b)
{
    if (!a)
        return b;
    if (!b)
        return a;
    query_node_t *n = arena_alloc(arena, sizeof *n);
    n->kind = QN_AND;
    n->left = a;
    n->right = b;
    return n;
}
