/* search.c - the filter language compiled to SQL (query/ parses it): one SELECT over jobs whose
 * WHERE is built from the tree with every key and value a bound parameter - the SQL text is
 * assembled from constant fragments only - plus keyset paging over any ordering (the last
 * job's sort keys and id are the cursor), the visibility rule's project list, and the summaries
 * and hyperparameter columns that come back with jobs. Not here: what a caller may see (the
 * service passes the projects) and how cursors travel (the service wraps them in tokens). */
#include "store/store_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* PostgreSQL takes at most 65535 parameters; the parser's limits keep a filter well below. */
#define SB_MAX_PARAMS 20000
/* Hyperparameter conditions are counted up to SB_COUNT_CAP rows (see hp_plan); at most
 * SB_MAX_PROBES groups of them in a filter are counted. */
#define SB_COUNT_CAP 10000
#define SB_MAX_PROBES 8
#define SB_GROUP_ATOMS 8

/* Hyperparameter conditions on one key joined by AND: one walk of job_hparams answers them all,
 * since a job has one row per key ("hp.lr > 1e-4 AND hp.lr < 1e-3" is one range of the index). */
typedef struct hp_group {
    const query_node_t *chain; /* the AND node at the top of the conjunction, or NULL */
    const query_node_t *atoms[SB_GROUP_ATOMS];
    int n;
    bool few;                  /* counted, and it matches few enough rows to be listed */
} hp_group_t;
typedef struct hp_plan {
    hp_group_t *g;
    int n;
} hp_plan_t;

/* A statement being built: SQL text from constant fragments, and its text parameters (copies in
 * the arena). */
typedef struct sb {
    store_buf_t sql;
    const char **params;
    int np;
    arena_t arena;
    bool overflow;
    int64_t now_us;
    const hp_plan_t *hp; /* how the filter's hyperparameter conditions are written, or NULL */
} sb_t;

static void sb_init(sb_t *b, int64_t now_us)
{
    memset(b, 0, sizeof *b);
    arena_init(&b->arena, 0);
    b->params = arena_alloc(&b->arena, sizeof(char *) * SB_MAX_PARAMS);
    b->now_us = now_us;
    store_buf_reserve(&b->sql, 1024);
}

static void sb_deinit(sb_t *b)
{
    store_buf_free(&b->sql);
    arena_deinit(&b->arena);
}

/* Appends a constant fragment of SQL. Never called with request text. */
static void sb_sql(sb_t *b, const char *frag)
{
    store_buf_put(&b->sql, frag, strlen(frag));
}

/* Appends "$n" for a new parameter holding value, then the fragment after it (a cast). */
static void sb_param(sb_t *b, const char *value, const char *cast)
{
    if (b->np >= SB_MAX_PARAMS) {
        b->overflow = true;
        return;
    }
    b->params[b->np++] = arena_strdup(&b->arena, value);
    char ref[16];
    snprintf(ref, sizeof ref, "$%d", b->np);
    sb_sql(b, ref);
    sb_sql(b, cast);
}

static void sb_param_num(sb_t *b, double v)
{
    char t[40];
    snprintf(t, sizeof t, "%.17g", v);
    sb_param(b, t, "::float8");
}

static void sb_param_time(sb_t *b, int64_t us)
{
    char t[32];
    snprintf(t, sizeof t, "%lld", (long long)us);
    sb_sql(b, "(timestamptz 'epoch' + ");
    sb_param(b, t, "::bigint * interval '1 microsecond')");
}

/* A value of field f as a parameter of its type. */
static void sb_value(sb_t *b, const query_field_t *f, const query_value_t *v)
{
    switch (f->type) {
    case QT_TEXT: sb_param(b, v->text, f->id == QF_ID ? "::uuid" : "::text"); break;
    case QT_NUMBER:
    case QT_DURATION: sb_param_num(b, v->num); break;
    case QT_TIME: sb_param_time(b, v->us); break;
    }
}

static const char *op_sql(query_op_t op)
{
    switch (op) {
    case QO_EQ: return " = ";
    case QO_NE: return " <> ";
    case QO_LT: return " < ";
    case QO_LE: return " <= ";
    case QO_GT: return " > ";
    case QO_GE: return " >= ";
    case QO_MATCH: return " ILIKE ";
    }
    return " = ";
}

/* The ILIKE pattern of a substring: %, _ and \ stand for themselves. */
static const char *like_pattern(sb_t *b, const char *s)
{
    size_t n = strlen(s);
    char *p = arena_alloc(&b->arena, 2 * n + 3);
    size_t o = 0;
    p[o++] = '%';
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '%' || s[i] == '_' || s[i] == '\\')
            p[o++] = '\\';
        p[o++] = s[i];
    }
    p[o++] = '%';
    p[o] = '\0';
    return p;
}

static const char *metric_col(query_agg_t agg)
{
    switch (agg) {
    case QA_MIN: return "min";
    case QA_MAX: return "max";
    case QA_LAST: return "last";
    default: return "n";
    }
}

/* A spec section's field (model.X, resources.X) read from the spec, as text or a number. */
static void sb_spec_field(sb_t *b, const char *section, const query_field_t *f)
{
    if (f->type == QT_TEXT) {
        sb_sql(b, "(j.spec -> ");
        sb_sql(b, section);
        sb_sql(b, " ->> ");
        sb_param(b, f->key, "::text)");
        return;
    }
    sb_sql(b, "(CASE WHEN jsonb_typeof(j.spec -> ");
    sb_sql(b, section);
    sb_sql(b, " -> ");
    sb_param(b, f->key, "::text");
    sb_sql(b, ") = 'number' THEN (j.spec -> ");
    sb_sql(b, section);
    sb_sql(b, " ->> ");
    sb_param(b, f->key, "::text)::float8 END)");
}

/* The expression of a field kept on the job row (everything but hyperparameters and metric
 * summaries, which live in their own tables). */
static void sb_row_field(sb_t *b, const query_field_t *f)
{
    switch (f->id) {
    case QF_ID: sb_sql(b, "j.id"); break;
    case QF_NAME: sb_sql(b, "j.name"); break;
    case QF_PROJECT: sb_sql(b, "j.project"); break;
    case QF_QUEUE: sb_sql(b, "j.queue"); break;
    case QF_STATE: sb_sql(b, "j.state"); break;
    case QF_PRIORITY: sb_sql(b, "j.priority"); break;
    case QF_ATTEMPT: sb_sql(b, "j.attempt"); break;
    case QF_CREATED: sb_sql(b, "j.created_at"); break;
    case QF_STARTED: sb_sql(b, "j.started_at"); break;
    case QF_ENDED: sb_sql(b, "j.ended_at"); break;
    case QF_DURATION:
        sb_sql(b, "extract(epoch from (coalesce(j.ended_at, ");
        sb_param_time(b, b->now_us);
        sb_sql(b, ") - j.started_at))::float8");
        break;
    case QF_PROGRESS:
        sb_sql(b, "(CASE WHEN j.total_steps > 0 THEN j.progress_step::float8 / j.total_steps END)");
        break;
    case QF_TAG:
        sb_sql(b, "(j.tags ->> ");
        sb_param(b, f->key, "::text)");
        break;
    case QF_MODEL: sb_spec_field(b, "'model'", f); break;
    case QF_RESOURCE:
        if (!strcmp(f->key, "nodes"))
            sb_sql(b, "j.nodes");
        else if (!strcmp(f->key, "slots_per_node"))
            sb_sql(b, "j.slots_per_node");
        else if (!strcmp(f->key, "slot_type"))
            sb_sql(b, "j.slot_type");
        else
            sb_spec_field(b, "'resources'", f);
        break;
    case QF_HP:
    case QF_METRIC:
        sb_sql(b, "NULL"); /* never: they are compiled through their tables */
        break;
    }
}

/* One comparison of expression-building fn against n's value(s): "e op v", "e IN (...)",
 * "e ILIKE p"; with nullable, wrapped so a missing value gives false rather than NULL. */
static void sb_compare(sb_t *b, const query_node_t *n, void (*expr)(sb_t *, const query_field_t *),
                       const query_field_t *f, bool nullable)
{
    if (nullable)
        sb_sql(b, "COALESCE(");
    if (n->op == QO_MATCH && n->kind == QN_CMP) {
        if (f->id == QF_ID) {
            sb_sql(b, "j.id::text");
        } else {
            expr(b, f);
        }
        sb_sql(b, " ILIKE ");
        sb_param(b, like_pattern(b, n->values[0].text), "::text");
    } else if (n->kind == QN_IN) {
        expr(b, f);
        sb_sql(b, " IN (");
        for (int i = 0; i < n->nvalues; i++) {
            if (i)
                sb_sql(b, ", ");
            sb_value(b, f, &n->values[i]);
        }
        sb_sql(b, ")");
    } else {
        expr(b, f);
        sb_sql(b, op_sql(n->op));
        sb_value(b, f, &n->values[0]);
    }
    if (nullable)
        sb_sql(b, ", false)");
}

static void expr_hp(sb_t *b, const query_field_t *f)
{
    (void)f;
    sb_sql(b, "h.num");
}

static void expr_metric(sb_t *b, const query_field_t *f)
{
    sb_sql(b, "s.");
    sb_sql(b, metric_col(f->agg));
}

/* A tag equal to a value: containment, which the GIN index on tags answers. */
static void sb_tag_contains(sb_t *b, const char *key, const char *value)
{
    json_t *o = json_object();
    json_object_set_new(o, key, json_string(value));
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    sb_sql(b, "j.tags @> ");
    sb_param(b, text ? text : "{}", "::jsonb");
    free(text);
}

/* "SELECT h.job_id FROM job_hparams h WHERE h.key = <key> AND <each condition of the group>" */
static void sb_hp_rows(sb_t *b, const query_node_t *const *atoms, int n)
{
    sb_sql(b, "SELECT h.job_id FROM job_hparams h WHERE h.key = ");
    sb_param(b, atoms[0]->field.key, "::text");
    for (int i = 0; i < n; i++) {
        if (atoms[i]->kind != QN_EXISTS) {
            sb_sql(b, " AND ");
            sb_compare(b, atoms[i], expr_hp, &atoms[i]->field, false);
        }
    }
}

static const hp_group_t *hp_group_of(const hp_plan_t *p, const query_node_t *n, int *index)
{
    for (int i = 0; p && i < p->n; i++)
        for (int k = 0; k < p->g[i].n; k++)
            if (p->g[i].atoms[k] == n) {
                *index = k;
                return &p->g[i];
            }
    return NULL;
}

static void sb_atom(sb_t *b, const query_node_t *n)
{
    const query_field_t *f = &n->field;
    switch (f->id) {
    case QF_HP: {
        int at = 0;
        const hp_group_t *g = hp_group_of(b->hp, n, &at);
        if (g && at > 0) {
            sb_sql(b, "true"); /* written with the first condition of its group */
            return;
        }
        /* The same rows either way; which form is fast depends on how many there are. */
        bool few = g && g->few;
        sb_sql(b, few ? "j.id = ANY(ARRAY(" : "j.id IN (");
        if (g)
            sb_hp_rows(b, g->atoms, g->n);
        else
            sb_hp_rows(b, &n, 1);
        sb_sql(b, few ? "))" : ")");
        return;
    }
    case QF_METRIC:
        sb_sql(b, "j.id IN (SELECT s.job_id FROM metric_summaries s WHERE s.name = ");
        sb_param(b, f->key, "::text");
        if (n->kind == QN_EXISTS) {
            if (f->agg != QA_COUNT)
                sb_sql(b, " AND s.n > 0");
        } else {
            sb_sql(b, " AND ");
            sb_compare(b, n, expr_metric, f, false);
        }
        sb_sql(b, ")");
        return;
    case QF_TAG:
        if (n->kind == QN_EXISTS) {
            sb_sql(b, "j.tags ? ");
            sb_param(b, f->key, "::text");
            return;
        }
        if (n->kind == QN_IN || (n->kind == QN_CMP && n->op == QO_EQ)) {
            sb_sql(b, "(");
            for (int i = 0; i < n->nvalues; i++) {
                if (i)
                    sb_sql(b, " OR ");
                sb_tag_contains(b, f->key, n->values[i].text);
            }
            sb_sql(b, ")");
            return;
        }
        sb_compare(b, n, sb_row_field, f, true);
        return;
    default:
        if (n->kind == QN_EXISTS) {
            if (f->nullable) {
                sb_sql(b, "(");
                sb_row_field(b, f);
                sb_sql(b, ") IS NOT NULL");
            } else {
                sb_sql(b, "true");
            }
            return;
        }
        sb_compare(b, n, sb_row_field, f, f->nullable);
        return;
    }
}

static void sb_node(sb_t *b, const query_node_t *n)
{
    switch (n->kind) {
    case QN_AND:
    case QN_OR:
        sb_sql(b, "(");
        sb_node(b, n->left);
        sb_sql(b, n->kind == QN_AND ? " AND " : " OR ");
        sb_node(b, n->right);
        sb_sql(b, ")");
        return;
    case QN_NOT:
        sb_sql(b, "(NOT ");
        sb_node(b, n->left);
        sb_sql(b, ")");
        return;
    default:
        sb_atom(b, n);
        return;
    }
}

/* ---- ordering and cursors ------------------------------------------------------------------- */

/* The expression of order key i: a joined table's column (o<i>) or a row field. */
static void sb_key(sb_t *b, const query_order_key_t *k, int i)
{
    char alias[16];
    snprintf(alias, sizeof alias, "o%d.", i);
    if (k->field.id == QF_HP) {
        sb_sql(b, alias);
        sb_sql(b, "num");
    } else if (k->field.id == QF_METRIC) {
        sb_sql(b, alias);
        sb_sql(b, metric_col(k->field.agg));
    } else if (k->field.type == QT_TEXT && k->field.id != QF_ID) {
        /* text sorts by bytes, the same on every database whatever its locale */
        sb_sql(b, "(");
        sb_row_field(b, &k->field);
        sb_sql(b, ") COLLATE \"C\"");
    } else {
        sb_row_field(b, &k->field);
    }
}

/* Joins for the keys kept in their own tables; the first key's is an inner join in phase 1. */
static void sb_key_joins(sb_t *b, const query_order_t *o, int phase)
{
    for (int i = 0; i < o->n; i++) {
        const query_field_t *f = &o->keys[i].field;
        if (f->id != QF_HP && f->id != QF_METRIC)
            continue;
        char alias[16];
        snprintf(alias, sizeof alias, "o%d", i);
        sb_sql(b, i == 0 && phase == 1 ? " JOIN " : " LEFT JOIN ");
        sb_sql(b, f->id == QF_HP ? "job_hparams " : "metric_summaries ");
        sb_sql(b, alias);
        sb_sql(b, " ON ");
        sb_sql(b, alias);
        sb_sql(b, ".job_id = j.id AND ");
        sb_sql(b, alias);
        sb_sql(b, f->id == QF_HP ? ".key = " : ".name = ");
        sb_param(b, f->key, "::text");
    }
}

/* A cursor value of key k as a parameter. */
static void sb_cursor_value(sb_t *b, const query_field_t *f, const json_t *v)
{
    if (f->type == QT_TIME) {
        sb_param_time(b, json_integer_value(v));
    } else if (f->type == QT_TEXT) {
        sb_param(b, json_string_value(v), f->id == QF_ID ? "::uuid" : "::text");
    } else {
        sb_param_num(b, json_number_value(v));
    }
}

/* "the row comes after the cursor" for keys [from, n) and then the id, each key ordered by its
 * direction with missing values last; the id in the first key's direction. first_present: key
 * `from` is known not to be missing (phase 1). */
static void sb_after(sb_t *b, const query_order_t *o, int from, const json_t *vals, const char *id, bool id_desc,
                     bool first_present, const char *id_expr)
{
    if (from == o->n) {
        sb_sql(b, id_expr);
        sb_sql(b, id_desc ? " < " : " > ");
        sb_param(b, id, "::uuid");
        return;
    }
    const query_order_key_t *k = &o->keys[from];
    const json_t *v = json_array_get(vals, (size_t)from);
    bool present = first_present && from == 0;
    if (json_is_null(v)) {
        /* nothing sorts after a missing value but other missing ones */
        sb_sql(b, "((");
        sb_key(b, k, from);
        sb_sql(b, ") IS NULL AND ");
        sb_after(b, o, from + 1, vals, id, id_desc, false, id_expr);
        sb_sql(b, ")");
        return;
    }
    sb_sql(b, "((");
    sb_key(b, k, from);
    sb_sql(b, k->desc ? " < " : " > ");
    sb_cursor_value(b, &k->field, v);
    if (k->field.nullable && !present) {
        sb_sql(b, " OR (");
        sb_key(b, k, from);
        sb_sql(b, ") IS NULL");
    }
    sb_sql(b, ") OR (");
    sb_key(b, k, from);
    sb_sql(b, " = ");
    sb_cursor_value(b, &k->field, v);
    sb_sql(b, " AND ");
    sb_after(b, o, from + 1, vals, id, id_desc, false, id_expr);
    sb_sql(b, "))");
}

/* ---- the statement ---------------------------------------------------------------------------- */

static void sb_projects(sb_t *b, const char *const *projects, int n)
{
    store_buf_t a = {0};
    store_buf_text_array(&a, projects, n);
    sb_sql(b, " AND j.project = ANY(");
    sb_param(b, a.p, "::text[])");
    store_buf_free(&a);
}

/* Builds the SELECT of one phase: phase 1 (or the only phase) holds the jobs whose first key has
 * a value, phase 2 those without one. Columns: the job's, then each key's value (as text: time
 * keys in microseconds), for the cursor. */
static void sb_select(sb_t *b, const store_search_t *q, const query_order_t *o, int phase, const json_t *cursor,
                      int limit)
{
    bool two = o->keys[0].field.nullable;
    bool first_table = o->keys[0].field.id == QF_HP || o->keys[0].field.id == QF_METRIC;
    bool desc0 = o->keys[0].desc;
    /* In phase 1, a first key from its own table drives the scan through (key, value, job_id):
     * its job_id is the tie-breaker, so one index walk yields the whole order. */
    const char *id_expr = phase == 1 && first_table ? "o0.job_id" : "j.id";
    /* The page is chosen by an inner query that reads only ids and sort keys (k); the job's
     * columns (its spec as text, its workers) are made for the page's rows alone, not for every
     * row a sort looks at. The outer ORDER BY repeats the inner one on k's copies of the keys. */
    static const char *const kcol[] = {"k.r0", "k.r1", "k.r2", "k.r3", "k.r4", "k.r5", "k.r6", "k.r7"};
    static const char *const kas[] = {" AS r0", " AS r1", " AS r2", " AS r3", " AS r4", " AS r5", " AS r6",
                                      " AS r7"};
    _Static_assert(QUERY_MAX_ORDER <= (int)(sizeof kcol / sizeof kcol[0]), "kcol and kas name each order key");
    sb_sql(b, "SELECT " STORE_JOB_COLS);
    for (int i = 0; i < o->n; i++) {
        sb_sql(b, ", (");
        if (o->keys[i].field.type == QT_TIME) {
            sb_sql(b, "floor(extract(epoch from ");
            sb_sql(b, kcol[i]);
            sb_sql(b, ") * 1000000)::bigint");
        } else {
            sb_sql(b, kcol[i]);
        }
        sb_sql(b, ")::text");
    }
    sb_sql(b, " FROM (SELECT j.id AS kid");
    for (int i = 0; i < o->n; i++) {
        sb_sql(b, ", ");
        sb_key(b, &o->keys[i], i);
        sb_sql(b, kas[i]);
    }
    sb_sql(b, " FROM jobs j");
    sb_key_joins(b, o, phase);
    sb_sql(b, " WHERE true");
    if (q->projects)
        sb_projects(b, q->projects, q->nprojects);
    if (q->filter) {
        sb_sql(b, " AND ");
        sb_node(b, q->filter);
    }
    if (two) {
        sb_sql(b, " AND (");
        sb_key(b, &o->keys[0], 0);
        sb_sql(b, phase == 1 ? ") IS NOT NULL" : ") IS NULL");
    }
    if (cursor) {
        const json_t *vals = json_object_get(cursor, "k");
        const char *id = json_string_value(json_object_get(cursor, "id"));
        int from = phase == 2 ? 1 : 0;
        if (from == 0 && o->n == 1) {
            /* one key with a value, then the id, in one direction: a row comparison, which an
             * index on (key, id) answers as a range */
            sb_sql(b, " AND (");
            sb_key(b, &o->keys[0], 0);
            sb_sql(b, ", ");
            sb_sql(b, id_expr);
            sb_sql(b, desc0 ? ") < (" : ") > (");
            sb_cursor_value(b, &o->keys[0].field, json_array_get(vals, 0));
            sb_sql(b, ", ");
            sb_param(b, id, "::uuid)");
        } else {
            if (from == 0) {
                /* a range on the first key that an index can start from */
                sb_sql(b, " AND ");
                sb_key(b, &o->keys[0], 0);
                sb_sql(b, desc0 ? " <= " : " >= ");
                sb_cursor_value(b, &o->keys[0].field, json_array_get(vals, 0));
            }
            sb_sql(b, " AND ");
            sb_after(b, o, from, vals, id, desc0, from == 0, id_expr);
        }
    }
    sb_sql(b, " ORDER BY ");
    for (int i = phase == 2 ? 1 : 0; i < o->n; i++) {
        sb_key(b, &o->keys[i], i);
        /* The first key has a value here: its plain direction matches the indexes. */
        sb_sql(b, o->keys[i].desc ? (i == 0 ? " DESC, " : " DESC NULLS LAST, ")
                                  : (i == 0 ? " ASC, " : " ASC NULLS LAST, "));
    }
    sb_sql(b, id_expr);
    sb_sql(b, desc0 ? " DESC" : " ASC");
    char lim[16];
    snprintf(lim, sizeof lim, "%d", limit);
    sb_sql(b, " LIMIT ");
    sb_param(b, lim, "::int");
    sb_sql(b, ") k JOIN jobs j ON j.id = k.kid ORDER BY ");
    for (int i = phase == 2 ? 1 : 0; i < o->n; i++) {
        sb_sql(b, kcol[i]);
        sb_sql(b, o->keys[i].desc ? (i == 0 ? " DESC, " : " DESC NULLS LAST, ")
                                  : (i == 0 ? " ASC, " : " ASC NULLS LAST, "));
    }
    sb_sql(b, desc0 ? "k.kid DESC" : "k.kid ASC");
}

/* The cursor of row i of r (key values after the job's columns). */
static json_t *row_cursor(const PGresult *r, int i, const query_order_t *o, int phase)
{
    json_t *k = json_array();
    for (int c = 0; c < o->n; c++) {
        int col = STORE_JOB_NCOLS + c;
        const query_field_t *f = &o->keys[c].field;
        if (store_is_null(r, i, col))
            json_array_append_new(k, json_null());
        else if (f->type == QT_TIME)
            json_array_append_new(k, json_integer(store_get_i64(r, i, col)));
        else if (f->type == QT_TEXT)
            json_array_append_new(k, json_string(store_get_str(r, i, col)));
        else
            json_array_append_new(k, json_real(store_get_double(r, i, col)));
    }
    return json_pack("{s:i, s:o, s:s}", "p", phase, "k", k, "id", store_get_str(r, i, 0));
}

static bool is_hp_atom(const query_node_t *n)
{
    return n->kind != QN_AND && n->kind != QN_OR && n->kind != QN_NOT && n->field.id == QF_HP;
}

static int hp_count(const query_node_t *n)
{
    if (!n)
        return 0;
    if (n->kind == QN_AND || n->kind == QN_OR || n->kind == QN_NOT)
        return hp_count(n->left) + hp_count(n->right);
    return n->field.id == QF_HP;
}

/* Groups the hyperparameter conditions of the tree n; chain: the AND node n's conjunction
 * starts at, NULL when n is not under an AND. */
static void hp_group_walk(hp_plan_t *p, const query_node_t *n, const query_node_t *chain)
{
    if (!n)
        return;
    if (n->kind == QN_AND) {
        hp_group_walk(p, n->left, chain ? chain : n);
        hp_group_walk(p, n->right, chain ? chain : n);
        return;
    }
    if (n->kind == QN_OR || n->kind == QN_NOT) {
        hp_group_walk(p, n->left, NULL);
        hp_group_walk(p, n->right, NULL);
        return;
    }
    if (!is_hp_atom(n))
        return;
    for (int i = 0; chain && i < p->n; i++) {
        hp_group_t *g = &p->g[i];
        if (g->chain == chain && g->n < SB_GROUP_ATOMS && !strcmp(g->atoms[0]->field.key, n->field.key)) {
            g->atoms[g->n++] = n;
            return;
        }
    }
    hp_group_t *g = &p->g[p->n++];
    memset(g, 0, sizeof *g);
    g->chain = chain;
    g->atoms[0] = n;
    g->n = 1;
}

/* How many rows each group of hyperparameter conditions matches, counted up to SB_COUNT_CAP in
 * one walk of the (key, num, job_id) index. The planner cannot tell: job_hparams holds every
 * hyperparameter's values in one column, whose statistics mix them all (lr with max_steps), so
 * "hp.lr > 1" looks like it matches a third of the jobs. It then walks the jobs in the page's
 * order looking for matches: fast when many match, every job read when none does (736 ms at
 * 100,000 jobs, against 0.5 ms). A group that matches few rows is written as the list of their
 * job ids instead (j.id = ANY(ARRAY(...))), which PostgreSQL looks up directly, then sorts.
 * "Few": listing costs about 0.007 ms per match, while the walk reads about 50 * N / m of the N
 * jobs to fill a page of 50, 0.025 ms each; the two meet near m * m = 180 * N (EXPLAIN ANALYZE at
 * N = 100,000 with 1,608 matches: 10.9 ms listed, 71 ms walked). N is PostgreSQL's estimate of
 * the number of jobs (pg_class.reltuples).
 * Fills *p (p->g to free). */
static int hp_plan(store_conn_t *c, const store_search_t *q, hp_plan_t *p, kiln_err_t *err)
{
    memset(p, 0, sizeof *p);
    int atoms = hp_count(q->filter);
    if (atoms == 0)
        return 0;
    p->g = calloc((size_t)atoms, sizeof *p->g);
    if (!p->g)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    hp_group_walk(p, q->filter, NULL);
    for (int i = 0; i < p->n && i < SB_MAX_PROBES; i++) {
        sb_t b;
        sb_init(&b, q->now_us);
        sb_sql(&b, "SELECT count(*), (SELECT greatest(reltuples, 1) FROM pg_class"
                   " WHERE oid = 'jobs'::regclass)::float8 FROM (");
        sb_hp_rows(&b, p->g[i].atoms, p->g[i].n);
        char lim[24];
        snprintf(lim, sizeof lim, "%d", SB_COUNT_CAP);
        sb_sql(&b, " LIMIT ");
        sb_param(&b, lim, "::int) x");
        store_buf_putc(&b.sql, '\0');
        PGresult *r = NULL;
        int rc = b.overflow ? 0 : store_q(c, "count the rows of hyperparameter conditions", b.sql.p, b.np,
                                          b.params, &r, err);
        sb_deinit(&b);
        if (rc)
            return rc;
        if (r) {
            double m = (double)store_get_i64(r, 0, 0), jobs = store_get_double(r, 0, 1);
            p->g[i].few = m < SB_COUNT_CAP && m * m < 180.0 * jobs;
        }
        PQclear(r);
    }
    return 0;
}

int store_job_search_json(store_conn_t *c, const store_search_t *q, json_t **out, json_t **next, kiln_err_t *err)
{
    *out = NULL;
    *next = NULL;
    query_order_t dflt;
    const query_order_t *o = store_search_order(q->order, &dflt);
    if (q->after && !store_search_cursor_ok(o, q->after)) {
        kiln_err_set(err, KILN_EINVAL, "page_token", "page token does not fit this search");
        kiln_err_hint(err, "pass next_page_token from the previous page, with the same filter and order_by");
        return KILN_EINVAL;
    }
    bool two = o->keys[0].field.nullable;
    int phase = q->after ? (int)json_integer_value(json_object_get(q->after, "p")) : 1;
    int want = q->limit + 1;
    json_t *arr = json_array();
    json_t *last_cursor = NULL;
    int got = 0, rc = 0;
    const json_t *cursor = q->after;
    hp_plan_t hp;
    rc = hp_plan(c, q, &hp, err);
    while (rc == 0 && phase <= (two ? 2 : 1) && got < want) {
        sb_t b;
        sb_init(&b, q->now_us);
        b.hp = &hp;
        sb_select(&b, q, o, phase, cursor, want - got);
        store_buf_putc(&b.sql, '\0');
        if (b.overflow) {
            sb_deinit(&b);
            rc = kiln_err_set(err, KILN_EINVAL, "filter", "the search has too many values");
            kiln_err_hint(err, "split it into several searches");
            break;
        }
        PGresult *r = NULL;
        rc = store_q(c, "search jobs", b.sql.p, b.np, b.params, &r, err);
        sb_deinit(&b);
        if (rc)
            break;
        for (int i = 0; i < PQntuples(r) && got < want; i++, got++) {
            if (got < q->limit) {
                json_array_append_new(arr, store_job_json(r, i));
                json_decref(last_cursor);
                last_cursor = row_cursor(r, i, o, phase);
            }
        }
        PQclear(r);
        phase++;
        cursor = NULL; /* phase 2 starts from its beginning */
    }
    free(hp.g);
    if (rc) {
        json_decref(arr);
        json_decref(last_cursor);
        return rc;
    }
    *out = arr;
    if (got > q->limit)
        *next = last_cursor;
    else
        json_decref(last_cursor);
    return 0;
}

/* ---- summaries --------------------------------------------------------------------------------- */

static json_t *store_summary_json(const PGresult *r, int i, int col)
{
    /* columns from col: n, min, max, last, min_step, max_step, last_step, rank, attempt */
    json_t *o = json_object();
    bool any = store_get_i64(r, i, col) > 0;
    json_object_set_new(o, "count", json_integer(store_get_i64(r, i, col)));
    static const char *const vals[] = {"min", "max", "last"};
    for (int k = 0; k < 3; k++) {
        double v = store_get_double(r, i, col + 1 + k);
        json_object_set_new(o, vals[k], any && !store_is_null(r, i, col + 1 + k) && isfinite(v) ? json_real(v) : json_null());
    }
    static const char *const steps[] = {"min_step", "max_step", "last_step"};
    for (int k = 0; k < 3; k++)
        json_object_set_new(o, steps[k], any && !store_is_null(r, i, col + 4 + k)
                                             ? json_integer(store_get_i64(r, i, col + 4 + k)) : json_null());
    json_object_set_new(o, "rank", json_integer(store_get_int(r, i, col + 7)));
    json_object_set_new(o, "attempt", json_integer(store_get_int(r, i, col + 8)));
    return o;
}

int store_job_summaries_json(store_conn_t *c, const char *const *ids, int n, const char *const *names, int nnames,
                             json_t **out, kiln_err_t *err)
{
    *out = json_object();
    if (n <= 0)
        return 0;
    store_buf_t a = {0}, m = {0};
    for (int i = 0; i < n; i++) { /* an id that is no UUID names no job: the nil UUID */
        store_buf_elem(&a, i);
        const char *id = store_is_uuid(ids[i]) ? ids[i] : "00000000-0000-0000-0000-000000000000";
        store_buf_put(&a, id, strlen(id));
    }
    store_buf_array_end(&a, n);
    store_buf_text_array(&m, names, names ? nnames : 0);
    const char *p[2] = {a.p, names ? m.p : NULL};
    PGresult *r = NULL;
    int rc = store_q(c, "read metric summaries",
                     "SELECT job_id::text, name, n, min, max, last, min_step, max_step, last_step, rank, attempt"
                     " FROM metric_summaries WHERE job_id = ANY($1::uuid[])"
                     " AND ($2::text[] IS NULL OR name = ANY($2::text[])) ORDER BY job_id, name",
                     2, p, &r, err);
    store_buf_free(&a);
    store_buf_free(&m);
    if (rc) {
        json_decref(*out);
        *out = NULL;
        return rc;
    }
    for (int i = 0; i < PQntuples(r); i++) {
        const char *id = store_get_str(r, i, 0);
        json_t *job = json_object_get(*out, id);
        if (!job) {
            job = json_object();
            json_object_set_new(*out, id, job);
        }
        json_object_set_new(job, store_get_str(r, i, 1), store_summary_json(r, i, 2));
    }
    PQclear(r);
    return 0;
}
