/* test_search.c - the search against a real PostgreSQL: a generated corpus of jobs (hyperparameters
 * with many ties, tags, states and times, metric summaries, two projects) whose answers this file
 * computes on its own in C (an evaluator of the parsed filter and a comparator for the order),
 * checked for many filters and orderings while paging through in small pages: every matching job
 * exactly once, in order, ties broken by id. Also: input shaped like SQL injection stays a
 * literal; metric summaries stay right with batches out of order, several ranks and a retried
 * attempt (against a reference computed here, and against a rebuild from the raw points); and the
 * history's min/max downsampling. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <libpq-fe.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "query/query.h"
#include "store/store.h"
#include "tests/common/harness.h"

static char *url;
static store_t *st;
static store_conn_t *c;
static kiln_err_t err;

static void setup(void)
{
    url = th_pg_create_db("search");
    cr_assert_not_null(url, "no test database (run with tests/run.sh)");
    cr_assert_eq(store_open(url, 2, &st, &err), 0, "%s", err.message);
    cr_assert_eq(store_conn_get(st, &c, &err), 0, "%s", err.message);
    cr_assert_eq(store_migrate(c, NULL, NULL, &err), 0, "%s", err.message);
    cr_assert_eq(store_project_insert(c, "q", NULL, "test", &err), 0, "%s", err.message);
}

static void teardown(void)
{
    store_conn_put(st, c);
    store_close(st);
    free(url);
}

static void sql(const char *text)
{
    PGconn *pg = PQconnectdb(url);
    PGresult *r = PQexec(pg, text);
    cr_assert(PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK, "%s: %s", text,
              PQerrorMessage(pg));
    PQclear(r);
    PQfinish(pg);
}

static long count_rows(const char *sql)
{
    return (long)th_pg_value(url, sql);
}

/* ---- the corpus and its reference -------------------------------------------------------------- */

#define NJOBS 240
#define BASE_US 1767225600000000LL /* 2026-01-01T00:00:00Z */
#define NOW_US (BASE_US + 3600LL * 1000000)

typedef struct msum {
    bool has;
    int64_t n;
    double min, max, last;
} msum_t;

typedef struct ref {
    char id[STORE_ID_LEN];
    char name[64], project[16], state[16];
    const char *team, *note;      /* NULL: no such tag */
    double lr, gbs, wd;
    int priority, n_layer;
    int64_t created, started, ended; /* 0: not set */
    int64_t step, total;
    msum_t val, train;
} ref_t;

static ref_t jobs[NJOBS];

static const char *const k_states[] = {"QUEUED", "RUNNING", "COMPLETED", "FAILED"};
static const double k_lr[] = {1e-4, 3e-4, 1e-3, 3e-3};
static const double k_val[] = {1.2, 1.5, 1.8, 2.0};
static const char *k_note = "x'; DROP TABLE jobs; --";

static void ingest(const char *id, int attempt, Kiln__MetricPoint **ptrs, size_t n)
{
    store_metric_sum_t *sums = NULL;
    size_t nsums = 0;
    cr_assert_eq(store_begin(c, &err), 0, "%s", err.message);
    cr_assert_eq(store_metrics_copy(c, id, attempt, ptrs, n, kiln_now_us(), &sums, &nsums, &err), 0, "%s",
                 err.message);
    cr_assert_eq(store_metric_summaries_update(c, id, attempt, sums, nsums, &err), 0, "%s", err.message);
    cr_assert_eq(store_commit(c, &err), 0, "%s", err.message);
    free(sums);
}

static void add_points(ref_t *j, msum_t *m, const char *metric, int count, int salt)
{
    Kiln__MetricPoint pts[8], *ptrs[8];
    for (int k = 0; k < count; k++) {
        kiln__metric_point__init(&pts[k]);
        pts[k].name = (char *)metric;
        pts[k].step = k + 1;
        pts[k].value = k_val[(salt + k * 3) % 4];
        pts[k].time_us = BASE_US;
        ptrs[k] = &pts[k];
        double v = pts[k].value;
        if (!m->has || m->n == 0 || v < m->min)
            m->min = v;
        if (!m->has || m->n == 0 || v > m->max)
            m->max = v;
        m->last = v;
        m->n++;
        m->has = true;
    }
    ingest(j->id, 1, ptrs, (size_t)count);
}

static void build_corpus(void)
{
    uint32_t r = 12345;
#define RND() (r = r * 1103515245u + 12345u, (r >> 16) & 0x7fff)
    for (int i = 0; i < NJOBS; i++) {
        ref_t *j = &jobs[i];
        memset(j, 0, sizeof *j);
        snprintf(j->name, sizeof j->name, i % 6 == 0 ? "Shakespeare-%d" : i % 6 == 1 ? "shake_%d" : "job-%d", i);
        snprintf(j->project, sizeof j->project, "%s", i % 5 == 0 ? "q" : "default");
        snprintf(j->state, sizeof j->state, "%s", k_states[i % 4]);
        j->team = i % 3 == 0 ? "nlp" : i % 3 == 1 ? "cv" : NULL;
        j->note = i % 17 == 0 ? k_note : NULL;
        j->lr = k_lr[RND() % 4];
        j->gbs = (double)(8 << (RND() % 3));
        j->wd = RND() % 2 ? 0.1 : 0.0;
        j->priority = i % 4 - 1;
        j->n_layer = 1 + i % 3;
        j->created = BASE_US + (int64_t)(i / 2) * 1000000; /* pairs share a creation time */
        j->total = 100;
        j->step = (i * 13) % 101;
        if (i % 4 != 0)
            j->started = j->created + 10 * 1000000LL;
        if (i % 4 >= 2)
            j->ended = j->started + (int64_t)(i % 7) * 20 * 1000000LL;

        json_t *tags = json_object();
        if (j->team)
            json_object_set_new(tags, "team", json_string(j->team));
        if (j->note)
            json_object_set_new(tags, "note", json_string(j->note));
        json_t *spec = json_pack("{s:s, s:s, s:{s:s, s:i, s:i}, s:{s:f, s:i, s:f, s:i, s:s},"
                                 " s:{s:s, s:i, s:i}, s:O}",
                                 "name", j->name, "project", j->project, "model", "type", "gpt", "n_layer",
                                 j->n_layer, "n_head", 2, "hyperparameters", "lr", j->lr, "global_batch_size",
                                 (int)j->gbs, "weight_decay", j->wd, "max_steps", 100, "optimizer", "adamw",
                                 "resources", "slot_type", "cpu", "nodes", 1, "slots_per_node", 1, "tags", tags);
        char *spec_text = json_dumps(spec, JSON_COMPACT | JSON_REAL_PRECISION(15));
        char *tags_text = json_dumps(tags, JSON_COMPACT);
        store_job_new_t nj = {.name = j->name, .project = j->project, .queue = "default", .slot_type = "cpu",
                              .spec_json = spec_text, .tags_json = tags_text, .priority = j->priority,
                              .nodes = 1, .slots_per_node = 1, .world_size = 1, .max_attempts = 1,
                              .total_steps = j->total};
        bool created = false;
        cr_assert_eq(store_job_insert(c, &nj, j->id, &created, NULL, &err), 0, "%s", err.message);
        free(spec_text);
        free(tags_text);
        json_decref(spec);
        json_decref(tags);
        char q[1024];
        char started[64] = "NULL", ended[64] = "NULL";
        if (j->started)
            snprintf(started, sizeof started, "to_timestamp(%lld / 1e6)", (long long)j->started);
        if (j->ended)
            snprintf(ended, sizeof ended, "to_timestamp(%lld / 1e6)", (long long)j->ended);
        snprintf(q, sizeof q,
                 "UPDATE jobs SET state = '%.15s', created_at = to_timestamp(%lld / 1e6), started_at = %.63s,"
                 " ended_at = %.63s, progress_step = %lld WHERE id = '%.36s'",
                 j->state, (long long)j->created, started, ended, (long long)j->step, j->id);
        sql(q);
        if (i % 5 != 4)
            add_points(j, &j->val, "val_loss", 1 + i % 4, i);
        if (i % 2 == 0)
            add_points(j, &j->train, "train_loss", 2, i + 1);
    }
#undef RND
}

/* ---- the reference evaluator ------------------------------------------------------------------- */

typedef enum { V_NONE, V_NUM, V_TEXT, V_TIME } vkind_t;
typedef struct val {
    vkind_t kind;
    double num;
    int64_t us;
    const char *text;
} val_t;

static const msum_t *metric_of(const ref_t *j, const char *name)
{
    return !strcmp(name, "val_loss") ? &j->val : !strcmp(name, "train_loss") ? &j->train : NULL;
}

static val_t field_value(const ref_t *j, const query_field_t *f)
{
    val_t v = {V_NONE, 0, 0, NULL};
    switch (f->id) {
    case QF_ID: v.kind = V_TEXT; v.text = j->id; break;
    case QF_NAME: v.kind = V_TEXT; v.text = j->name; break;
    case QF_PROJECT: v.kind = V_TEXT; v.text = j->project; break;
    case QF_QUEUE: v.kind = V_TEXT; v.text = "default"; break;
    case QF_STATE: v.kind = V_TEXT; v.text = j->state; break;
    case QF_PRIORITY: v.kind = V_NUM; v.num = j->priority; break;
    case QF_ATTEMPT: v.kind = V_NUM; v.num = 0; break;
    case QF_CREATED: v.kind = V_TIME; v.us = j->created; break;
    case QF_STARTED: if (j->started) { v.kind = V_TIME; v.us = j->started; } break;
    case QF_ENDED: if (j->ended) { v.kind = V_TIME; v.us = j->ended; } break;
    case QF_DURATION:
        if (j->started) {
            v.kind = V_NUM;
            v.num = (double)((j->ended ? j->ended : NOW_US) - j->started) / 1e6;
        }
        break;
    case QF_PROGRESS: v.kind = V_NUM; v.num = (double)j->step / (double)j->total; break;
    case QF_TAG: {
        const char *t = !strcmp(f->key, "team") ? j->team : !strcmp(f->key, "note") ? j->note : NULL;
        if (t) {
            v.kind = V_TEXT;
            v.text = t;
        }
        break;
    }
    case QF_HP:
        v.kind = V_NUM;
        if (!strcmp(f->key, "lr"))
            v.num = j->lr;
        else if (!strcmp(f->key, "global_batch_size"))
            v.num = j->gbs;
        else if (!strcmp(f->key, "weight_decay"))
            v.num = j->wd;
        else if (!strcmp(f->key, "max_steps"))
            v.num = 100;
        else
            v.kind = V_NONE;
        break;
    case QF_MODEL:
        if (!strcmp(f->key, "n_layer")) {
            v.kind = V_NUM;
            v.num = j->n_layer;
        } else if (!strcmp(f->key, "type")) {
            v.kind = V_TEXT;
            v.text = "gpt";
        }
        break;
    case QF_RESOURCE:
        if (!strcmp(f->key, "slot_type")) {
            v.kind = V_TEXT;
            v.text = "cpu";
        } else if (!strcmp(f->key, "nodes")) {
            v.kind = V_NUM;
            v.num = 1;
        }
        break;
    case QF_METRIC: {
        const msum_t *m = metric_of(j, f->key);
        if (!m || !m->has)
            break;
        if (f->agg == QA_COUNT) {
            v.kind = V_NUM;
            v.num = (double)m->n;
        } else if (m->n > 0) {
            v.kind = V_NUM;
            v.num = f->agg == QA_MIN ? m->min : f->agg == QA_MAX ? m->max : m->last;
        }
        break;
    }
    }
    return v;
}

static bool contains_ci(const char *hay, const char *needle)
{
    size_t n = strlen(needle);
    for (const char *p = hay; *p; p++)
        if (!strncasecmp(p, needle, n))
            return true;
    return !*needle;
}

static bool cmp_one(const val_t *v, const query_field_t *f, query_op_t op, const query_value_t *lit)
{
    if (v->kind == V_NONE)
        return false;
    if (f->type == QT_TEXT) {
        if (op == QO_MATCH)
            return contains_ci(v->text, lit->text);
        int d = f->id == QF_ID ? strcasecmp(v->text, lit->text) : strcmp(v->text, lit->text);
        return op == QO_EQ ? d == 0 : d != 0;
    }
    double a = v->kind == V_TIME ? (double)v->us : v->num;
    double b = f->type == QT_TIME ? (double)lit->us : lit->num;
    switch (op) {
    case QO_EQ: return a == b;
    case QO_NE: return a != b;
    case QO_LT: return a < b;
    case QO_LE: return a <= b;
    case QO_GT: return a > b;
    case QO_GE: return a >= b;
    default: return false;
    }
}

static bool eval(const ref_t *j, const query_node_t *n)
{
    if (!n)
        return true;
    switch (n->kind) {
    case QN_AND: return eval(j, n->left) && eval(j, n->right);
    case QN_OR: return eval(j, n->left) || eval(j, n->right);
    case QN_NOT: return !eval(j, n->left);
    case QN_EXISTS: return field_value(j, &n->field).kind != V_NONE;
    case QN_CMP: {
        val_t v = field_value(j, &n->field);
        return cmp_one(&v, &n->field, n->op, &n->values[0]);
    }
    case QN_IN: {
        val_t v = field_value(j, &n->field);
        for (int i = 0; i < n->nvalues; i++)
            if (cmp_one(&v, &n->field, QO_EQ, &n->values[i]))
                return true;
        return false;
    }
    }
    return false;
}

static const query_order_t *g_order;

/* Missing values last in either direction; ties by id in the first key's direction. */
static int ref_cmp(const void *x, const void *y)
{
    const ref_t *a = *(const ref_t *const *)x, *b = *(const ref_t *const *)y;
    const query_order_t *o = g_order;
    bool desc0 = o->n ? o->keys[0].desc : true;
    for (int i = 0; i < (o->n ? o->n : 1); i++) {
        query_field_t created = {.id = QF_CREATED, .type = QT_TIME};
        const query_field_t *f = o->n ? &o->keys[i].field : &created;
        bool desc = o->n ? o->keys[i].desc : true;
        val_t va = field_value(a, f), vb = field_value(b, f);
        if (va.kind == V_NONE || vb.kind == V_NONE) {
            if (va.kind != vb.kind)
                return va.kind == V_NONE ? 1 : -1;
            continue;
        }
        int d;
        if (va.kind == V_TEXT)
            d = strcmp(va.text, vb.text);
        else {
            double p = va.kind == V_TIME ? (double)va.us : va.num, q = vb.kind == V_TIME ? (double)vb.us : vb.num;
            d = p < q ? -1 : p > q;
        }
        if (d)
            return desc ? -d : d;
    }
    int d = strcmp(a->id, b->id);
    return desc0 ? -d : d;
}

/* Pages through the search and checks it returns exactly the reference's jobs in its order. */
static void check(const char *filter, const char *order_by, int page_size, const char *const *projects, int nprojects)
{
    arena_t a;
    arena_init(&a, 0);
    query_node_t *f = NULL;
    query_order_t o;
    cr_assert_eq(query_parse(filter, NOW_US, &a, &f, &err), 0, "%s: %s", filter, err.message);
    cr_assert_eq(query_order_parse(order_by, &a, &o, &err), 0, "%s: %s", order_by, err.message);
    const ref_t *want[NJOBS];
    int nwant = 0;
    for (int i = 0; i < NJOBS; i++) {
        bool visible = !projects;
        for (int p = 0; projects && p < nprojects; p++)
            visible = visible || !strcmp(projects[p], jobs[i].project);
        if (visible && eval(&jobs[i], f))
            want[nwant++] = &jobs[i];
    }
    g_order = &o;
    qsort(want, (size_t)nwant, sizeof want[0], ref_cmp);

    store_search_t q = {.filter = f, .order = &o, .limit = page_size, .now_us = NOW_US, .projects = projects,
                        .nprojects = nprojects};
    json_t *cursor = NULL;
    int got = 0, pages = 0;
    for (;;) {
        json_t *arr = NULL, *next = NULL;
        q.after = cursor;
        cr_assert_eq(store_job_search_json(c, &q, &arr, &next, &err), 0, "%s | %s: %s", filter, order_by, err.message);
        size_t i;
        json_t *job;
        json_array_foreach(arr, i, job) {
            const char *id = json_string_value(json_object_get(job, "id"));
            cr_assert_lt(got, nwant, "[%s] order [%s]: more jobs than the %d expected (%s)", filter, order_by, nwant, id);
            cr_assert_str_eq(id, want[got]->id, "[%s] order [%s]: job %d is %s (%s), expected %s (%s)", filter,
                             order_by, got, id, json_string_value(json_object_get(job, "name")), want[got]->id,
                             want[got]->name);
            got++;
        }
        cr_assert(next || json_array_size(arr) <= (size_t)page_size);
        json_decref(arr);
        json_decref(cursor);
        cursor = next;
        pages++;
        cr_assert_lt(pages, NJOBS + 3, "paging does not end");
        if (!next)
            break;
    }
    cr_assert_eq(got, nwant, "[%s] order [%s]: %d jobs, expected %d", filter, order_by, got, nwant);
    arena_deinit(&a);
}

TestSuite(search, .init = setup, .fini = teardown, .timeout = 120);

static const char *const k_filters[] = {
    "",
    "hp.lr < 1e-3",
    "hp.lr < 3e-4 OR metrics.val_loss.min < 1.5",
    "hp.lr <= 3e-4 AND (metrics.val_loss.min < 1.6 OR tags.team = nlp) AND state = COMPLETED",
    "metrics.val_loss.min < 1.6 OR hp.global_batch_size > 16 AND priority > 0",
    "(metrics.val_loss.min < 1.6 OR hp.global_batch_size > 16) AND priority > 0",
    "NOT tags.team = nlp",
    "tags.team != nlp",
    "EXISTS tags.team AND NOT EXISTS metrics.val_loss.min",
    "NOT (hp.weight_decay = 0.1 OR state IN (QUEUED, FAILED))",
    "name ~ \"SHAKE\"",
    "name !~ \"-1\" AND name ~ e",
    "priority IN (-1, 2) AND state NOT IN (RUNNING)",
    "metrics.val_loss.count >= 3 OR metrics.train_loss.last >= 1.8",
    "metrics.val_loss.max = 2 AND metrics.val_loss.min = 1.2",
    "created > 2026-01-01T00:00:50Z AND created <= 2026-01-01T00:01:30Z",
    "started EXISTS AND ended < -58m",
    "duration > 60s OR duration < 1",
    "progress >= 0.5",
    "hp.weight_decay = 0.1 AND hp.global_batch_size IN (8, 32)",
    "model.n_layer >= 2 AND model.type = gpt AND resources.slot_type = cpu AND resources.nodes = 1",
    "tags.note = \"x'; DROP TABLE jobs; --\"",
    "tags.note ~ \"; drop\"",
    "id ~ \"a\" OR project = q",
    "hp.lr > 5",
    "metrics.missing.min < 1 OR tags.\"no such\" = x",
    /* conditions on one key under one AND are one walk of job_hparams (store/search.c hp_plan) */
    "hp.lr > 1e-4 AND hp.lr < 1e-3 AND hp.global_batch_size >= 8",
    "EXISTS hp.lr AND hp.lr >= 1e-4 AND state != FAILED AND hp.lr <= 3e-4 AND NOT hp.lr = 2e-4",
    "(hp.lr > 1e-4 OR hp.lr < 5e-5) AND hp.lr != 3e-4",
    "NOT (hp.lr > 1e-4 AND hp.lr < 1e-3) OR hp.global_batch_size IN (8) AND hp.global_batch_size > 4",
};

static const char *const k_orders[] = {
    "",
    "metrics.val_loss.min",
    "metrics.val_loss.min desc",
    "hp.lr desc, metrics.val_loss.last",
    "name",
    "priority desc, created",
    "tags.team",
    "tags.team desc, hp.global_batch_size",
    "started desc",
    "duration",
    "state, progress desc",
    "id desc",
    "metrics.val_loss.count desc, metrics.train_loss.min",
};

Test(search, filters_and_orders_match_an_independent_evaluation)
{
    build_corpus();
    for (size_t f = 0; f < KILN_ARRAY_LEN(k_filters); f++)
        check(k_filters[f], "", 50, NULL, 0);
    for (size_t o = 0; o < KILN_ARRAY_LEN(k_orders); o++)
        check("", k_orders[o], 500, NULL, 0);
    /* The injection-shaped tag value was a value, nothing more. */
    cr_assert_eq(count_rows("SELECT count(*) FROM jobs"), NJOBS);
}

Test(search, paging_through_ties_has_no_duplicates_or_gaps)
{
    build_corpus();
    /* Pages of 7 through orders full of ties (4 learning rates, 4 loss values, pairs of jobs
     * created at the same time) and through the jobs without the key. */
    for (size_t o = 0; o < KILN_ARRAY_LEN(k_orders); o++) {
        check("", k_orders[o], 7, NULL, 0);
        check("hp.lr < 3e-3 OR metrics.val_loss.min < 1.6", k_orders[o], 7, NULL, 0);
    }
    check("NOT tags.team = nlp", "metrics.val_loss.min, hp.lr desc", 1, NULL, 0);
    check("", "metrics.val_loss.min", 3, NULL, 0);
}

Test(search, only_the_callers_projects)
{
    build_corpus();
    const char *q[] = {"q"};
    check("", "", 9, q, 1);
    check("hp.lr < 1e-3 OR metrics.val_loss.min < 1.6", "metrics.val_loss.min", 4, q, 1);
    const char *none[] = {"nobody"};
    check("", "", 10, none, 1);
}

Test(search, a_cursor_from_another_order_is_refused)
{
    build_corpus();
    arena_t a;
    arena_init(&a, 0);
    query_order_t o1, o2;
    cr_assert_eq(query_order_parse("metrics.val_loss.min", &a, &o1, &err), 0);
    cr_assert_eq(query_order_parse("name, created", &a, &o2, &err), 0);
    store_search_t q = {.order = &o1, .limit = 5, .now_us = NOW_US};
    json_t *arr = NULL, *next = NULL;
    cr_assert_eq(store_job_search_json(c, &q, &arr, &next, &err), 0, "%s", err.message);
    cr_assert_not_null(next);
    q.order = &o2;
    q.after = next;
    json_t *arr2 = NULL, *next2 = NULL;
    cr_assert_eq(store_job_search_json(c, &q, &arr2, &next2, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "page_token");
    json_t *forged = json_pack("{s:i, s:[s], s:s}", "p", 1, "k", "'; DROP TABLE jobs; --", "id", jobs[0].id);
    q.order = &o1;
    q.after = forged;
    cr_assert_eq(store_job_search_json(c, &q, &arr2, &next2, &err), KILN_EINVAL);
    json_decref(forged);
    json_decref(arr);
    json_decref(next);
    arena_deinit(&a);
}

/* ---- summaries ---------------------------------------------------------------------------------- */

TestSuite(summaries, .init = setup, .fini = teardown, .timeout = 120);

typedef struct rpt {
    int rank, attempt, batch, pos;
    int64_t step;
    double value;
} rpt_t;

/* The reference summary of everything ingested: the lowest rank; per step the point of the
 * highest (attempt, batch, position); finite values only. */
static void ref_summary(const rpt_t *p, int n, int *rank, int64_t *cnt, double *mn, double *mx, double *last,
                        int64_t *mn_step, int64_t *mx_step, int64_t *last_step)
{
    *rank = 1 << 30;
    for (int i = 0; i < n; i++)
        if (p[i].rank < *rank)
            *rank = p[i].rank;
    *cnt = 0;
    *last_step = -1;
    for (int64_t step = -50; step <= 400; step++) {
        const rpt_t *best = NULL;
        for (int i = 0; i < n; i++) {
            if (p[i].rank != *rank || p[i].step != step)
                continue;
            if (!best || p[i].attempt > best->attempt ||
                (p[i].attempt == best->attempt &&
                 (p[i].batch > best->batch || (p[i].batch == best->batch && p[i].pos > best->pos))))
                best = &p[i];
        }
        if (!best || !isfinite(best->value))
            continue;
        if (*cnt == 0 || best->value < *mn) {
            *mn = best->value;
            *mn_step = step;
        }
        if (*cnt == 0 || best->value > *mx) {
            *mx = best->value;
            *mx_step = step;
        }
        *last = best->value;
        *last_step = step;
        (*cnt)++;
    }
}

static void check_summary(const char *id, const rpt_t *p, int n, const char *when)
{
    int rank;
    int64_t cnt, mn_step = 0, mx_step = 0, last_step;
    double mn = 0, mx = 0, last = 0;
    ref_summary(p, n, &rank, &cnt, &mn, &mx, &last, &mn_step, &mx_step, &last_step);
    json_t *all = NULL;
    cr_assert_eq(store_job_summaries_json(c, &id, 1, NULL, 0, &all, &err), 0, "%s", err.message);
    json_t *s = json_object_get(json_object_get(all, id), "loss");
    cr_assert_not_null(s, "%s: no summary", when);
    char *text = json_dumps(s, JSON_COMPACT);
    cr_assert_eq(json_integer_value(json_object_get(s, "rank")), rank, "%s: %s", when, text);
    cr_assert_eq(json_integer_value(json_object_get(s, "count")), cnt, "%s: %s (want count %lld)", when, text, (long long)cnt);
    if (cnt > 0) {
        cr_assert_eq(json_real_value(json_object_get(s, "min")), mn, "%s: %s (want min %g)", when, text, mn);
        cr_assert_eq(json_real_value(json_object_get(s, "max")), mx, "%s: %s (want max %g)", when, text, mx);
        cr_assert_eq(json_real_value(json_object_get(s, "last")), last, "%s: %s (want last %g)", when, text, last);
        cr_assert_eq(json_integer_value(json_object_get(s, "min_step")), mn_step, "%s: %s", when, text);
        cr_assert_eq(json_integer_value(json_object_get(s, "max_step")), mx_step, "%s: %s", when, text);
        cr_assert_eq(json_integer_value(json_object_get(s, "last_step")), last_step, "%s: %s", when, text);
    } else {
        cr_assert(json_is_null(json_object_get(s, "min")), "%s: %s", when, text);
    }
    free(text);
    json_decref(all);
}

static char *new_job(void)
{
    static char id[STORE_ID_LEN];
    store_job_new_t nj = {.name = "sum", .queue = "default", .slot_type = "cpu", .spec_json = "{}", .tags_json = "{}",
                          .nodes = 1, .slots_per_node = 1, .world_size = 1, .max_attempts = 3, .total_steps = 100};
    bool created;
    cr_assert_eq(store_job_insert(c, &nj, id, &created, NULL, &err), 0, "%s", err.message);
    return id;
}

static void push(const char *id, rpt_t *all, int *nall, int batch, int attempt, const int *ranks, const int64_t *steps,
                 const double *values, int n)
{
    Kiln__MetricPoint pts[64], *ptrs[64];
    for (int i = 0; i < n; i++) {
        kiln__metric_point__init(&pts[i]);
        pts[i].name = "loss";
        pts[i].rank = ranks[i];
        pts[i].step = steps[i];
        pts[i].value = values[i];
        pts[i].time_us = BASE_US + steps[i];
        ptrs[i] = &pts[i];
        all[*nall] = (rpt_t){ranks[i], attempt, batch, i, steps[i], values[i]};
        (*nall)++;
    }
    ingest(id, attempt, ptrs, (size_t)n);
}

Test(summaries, a_retried_attempt_replaces_the_steps_it_repeats)
{
    const char *id = new_job();
    rpt_t all[256];
    int nall = 0;
    int r0[16] = {0};
    /* attempt 1: steps 1..10, its minimum at step 8 */
    int64_t s1[10];
    double v1[10];
    for (int i = 0; i < 10; i++) {
        s1[i] = i + 1;
        v1[i] = 5.0 - 0.1 * i;
    }
    v1[7] = 0.5;
    push(id, all, &nall, 0, 1, r0, s1, v1, 10);
    check_summary(id, all, nall, "attempt 1");
    /* attempt 2 resumes from step 6: its steps 6..12 replace attempt 1's 6..10, the old minimum
     * at step 8 included */
    int64_t s2[7];
    double v2[7];
    for (int i = 0; i < 7; i++) {
        s2[i] = 6 + i;
        v2[i] = 3.0 - 0.05 * i;
    }
    push(id, all, &nall, 1, 2, r0, s2, v2, 7);
    check_summary(id, all, nall, "attempt 2");
    json_t *sums = NULL;
    cr_assert_eq(store_job_summaries_json(c, &id, 1, NULL, 0, &sums, &err), 0);
    json_t *s = json_object_get(json_object_get(sums, id), "loss");
    cr_assert_eq(json_integer_value(json_object_get(s, "count")), 12, "each of steps 1..12 once");
    cr_assert_eq(json_real_value(json_object_get(s, "min")), 2.7);
    cr_assert_eq(json_integer_value(json_object_get(s, "min_step")), 12);
    cr_assert_eq(json_integer_value(json_object_get(s, "attempt")), 2);
    json_decref(sums);
    /* a late batch of attempt 1 (an agent's queue drained after the retry began) changes nothing
     * the retry already replaced, and adds the step it alone has */
    int64_t s3[2] = {9, 20};
    double v3[2] = {0.1, 4.0};
    push(id, all, &nall, 2, 1, r0, s3, v3, 2);
    check_summary(id, all, nall, "late attempt 1 batch");
}

Test(summaries, out_of_order_batches_several_ranks_and_non_finite_values)
{
    const char *id = new_job();
    rpt_t all[4096];
    int nall = 0;
    uint32_t r = 99;
#define RND() (r = r * 1103515245u + 12345u, (r >> 16) & 0x7fff)
    int attempt = 1;
    for (int batch = 0; batch < 60; batch++) {
        int n = 1 + (int)(RND() % 20);
        int ranks[64];
        int64_t steps[64];
        double values[64];
        int64_t base = (int64_t)(RND() % 300) - 20; /* anywhere: out of order and overlapping */
        if (batch % 10 == 9)
            attempt++;
        for (int i = 0; i < n; i++) {
            /* rank 2 first, ranks 1 and 0 later: the summary moves to the lowest */
            ranks[i] = batch < 10 ? 2 : batch < 25 ? 1 + (int)(RND() % 2) : (int)(RND() % 3);
            steps[i] = batch % 7 == 3 ? base : base + (int64_t)(RND() % 40); /* repeated steps too */
            values[i] = (double)(RND() % 50) / 8.0 - 2.0;
            if (RND() % 23 == 0)
                values[i] = RND() % 2 ? NAN : INFINITY;
        }
        push(id, all, &nall, batch, attempt, ranks, steps, values, n);
        char when[64];
        snprintf(when, sizeof when, "batch %d", batch);
        check_summary(id, all, nall, when);
    }
#undef RND
    /* The incremental result is what a rebuild from the chunks gives. */
    json_t *before = NULL, *after = NULL;
    cr_assert_eq(store_job_summaries_json(c, &id, 1, NULL, 0, &before, &err), 0);
    char q[256];
    snprintf(q, sizeof q, "SELECT metric_summary_rebuild('%s', 'loss')", id);
    sql(q);
    cr_assert_eq(store_job_summaries_json(c, &id, 1, NULL, 0, &after, &err), 0);
    cr_assert(json_equal(before, after), "incremental and rebuilt summaries differ");
    json_decref(before);
    json_decref(after);
}

Test(summaries, in_order_batches_merge_without_a_rebuild)
{
    const char *id = new_job();
    rpt_t all[512];
    int nall = 0;
    int r0[16] = {0};
    for (int batch = 0; batch < 20; batch++) {
        int64_t steps[10];
        double values[10];
        for (int i = 0; i < 10; i++) {
            steps[i] = batch * 10 + i + 1;
            values[i] = sin((double)steps[i]) + (batch == 13 && i == 4 ? -5 : 0);
        }
        push(id, all, &nall, batch, 1, r0, steps, values, 10);
    }
    check_summary(id, all, nall, "after 20 batches");
    cr_assert_eq(count_rows("SELECT count(*) FROM metric_summaries WHERE dirty"), 0);
}

/* ---- history downsampling ------------------------------------------------------------------------ */

Test(summaries, history_keeps_each_buckets_min_and_max)
{
    const char *id = new_job();
    rpt_t all[1200];
    int nall = 0;
    int r0[64] = {0};
    /* 1000 steps of a smooth curve with one spike up at step 537 and one down at step 811 */
    for (int batch = 0; batch < 20; batch++) {
        int64_t steps[50];
        double values[50];
        for (int i = 0; i < 50; i++) {
            steps[i] = batch * 50 + i + 1;
            values[i] = 2.0 + 0.001 * (double)steps[i];
            if (steps[i] == 537)
                values[i] = 100.0;
            if (steps[i] == 811)
                values[i] = -100.0;
        }
        push(id, all, &nall, batch, 1, r0, steps, values, 50);
    }
    /* a retry rewrites steps 990..1000 */
    int64_t rs[11];
    double rv[11];
    for (int i = 0; i < 11; i++) {
        rs[i] = 990 + i;
        rv[i] = 7.0;
    }
    push(id, all, &nall, 20, 2, r0, rs, rv, 11);
    json_t *h = NULL;
    /* attempt -1: per rank and step, the latest attempt's points (what a chart shows) */
    store_metrics_query_t q = {.name = "loss", .max_points = 20, .attempt = -1};
    cr_assert_eq(store_metrics_query_json(c, id, &q, &h, &err), 0, "%s", err.message);
    json_t *pts = json_object_get(json_array_get(h, 0), "points");
    cr_assert_leq(json_array_size(pts), 20);
    cr_assert_geq(json_array_size(pts), 16);
    bool up = false, down = false;
    int64_t prev = 0;
    size_t i;
    json_t *p;
    json_array_foreach(pts, i, p) {
        int64_t step = json_integer_value(json_object_get(p, "step"));
        double v = json_number_value(json_object_get(p, "value"));
        cr_assert_gt(step, prev, "in step order, each step once");
        prev = step;
        up = up || (step == 537 && v == 100.0);
        down = down || (step == 811 && v == -100.0);
        if (step >= 990)
            cr_assert_eq(v, 7.0, "the retry's value at step %lld", (long long)step);
    }
    cr_assert(up && down, "both spikes survive");
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(pts, 0), "step")), 1);
    cr_assert_eq(prev, 1000, "the last point is kept");
    json_decref(h);
    q.max_points = 2;
    cr_assert_eq(store_metrics_query_json(c, id, &q, &h, &err), 0);
    cr_assert_eq(json_array_size(json_object_get(json_array_get(h, 0), "points")), 2);
    json_decref(h);
    q.max_points = 5000;
    cr_assert_eq(store_metrics_query_json(c, id, &q, &h, &err), 0);
    cr_assert_eq(json_array_size(json_object_get(json_array_get(h, 0), "points")), 1000, "one point per step");
    json_decref(h);
}
