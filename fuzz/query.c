/* query.c - fuzz target: the filter language (query/), the same text given as a filter, as an
 * order_by and as a columns list, as svc_job_list parses them from a request (the text is a C
 * string, as every request field is). Each either fails as the request field's client error or
 * gives a tree, ordering or column list that keeps query.h's limits. */
#include "fuzz/fuzz.h"
#include "query/query.h"

/* A fixed "now", so that ages (-7d) give the same times in every run. */
#define FUZZ_NOW_US INT64_C(1795000000000000)

static void check_error(int rc, const kiln_err_t *err, const char *field)
{
    FUZZ_CHECK(rc == KILN_EINVAL && err->status == KILN_EINVAL);
    FUZZ_CHECK(!strcmp(err->field, field));
    FUZZ_CHECK(err->message[0] != '\0');
}

static void check_field(const query_field_t *f)
{
    char name[512];
    FUZZ_CHECK(query_field_name(f, name, sizeof name) != NULL);
    FUZZ_CHECK(name[0] != '\0');
    FUZZ_CHECK(f->id != QF_METRIC || f->key);
}

static void walk(const query_node_t *n, int *terms, int *values)
{
    FUZZ_CHECK(n);
    switch (n->kind) {
    case QN_AND:
    case QN_OR:
        walk(n->left, terms, values);
        walk(n->right, terms, values);
        return;
    case QN_NOT:
        walk(n->left, terms, values);
        return;
    case QN_CMP:
        FUZZ_CHECK(n->nvalues == 1 && n->values);
        break;
    case QN_IN:
        FUZZ_CHECK(n->nvalues >= 1 && n->nvalues <= QUERY_MAX_IN && n->values);
        *values += n->nvalues;
        break;
    case QN_EXISTS:
        break;
    default:
        FUZZ_CHECK(!"a node of no known kind");
    }
    check_field(&n->field);
    ++*terms;
    for (int i = 0; i < n->nvalues; i++)
        if (n->field.type == QT_TEXT)
            FUZZ_CHECK(n->values[i].text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_text(data, size);
    arena_t a;
    arena_init(&a, 0);
    kiln_err_t err;

    kiln_err_clear(&err);
    query_node_t *tree = NULL;
    int rc = query_parse(text, FUZZ_NOW_US, &a, &tree, &err);
    if (rc) {
        check_error(rc, &err, "filter");
    } else if (tree) {
        int terms = 0, values = 0;
        walk(tree, &terms, &values);
        FUZZ_CHECK(terms <= QUERY_MAX_TERMS && values <= QUERY_MAX_VALUES);
    }

    kiln_err_clear(&err);
    query_order_t order;
    rc = query_order_parse(text, &a, &order, &err);
    if (rc) {
        check_error(rc, &err, "order_by");
    } else {
        FUZZ_CHECK(order.n >= 0 && order.n <= QUERY_MAX_ORDER);
        for (int i = 0; i < order.n; i++)
            check_field(&order.keys[i].field);
    }

    kiln_err_clear(&err);
    query_columns_t *cols = malloc(sizeof *cols);
    FUZZ_CHECK(cols);
    rc = query_columns_parse(text, &a, cols, &err);
    if (rc) {
        check_error(rc, &err, "columns");
    } else {
        FUZZ_CHECK(cols->n >= 0 && cols->n <= QUERY_MAX_COLUMNS);
        for (int i = 0; i < cols->n; i++) {
            FUZZ_CHECK(cols->cols[i].name && cols->cols[i].name[0]);
            FUZZ_CHECK(cols->cols[i].id == QF_HP || cols->cols[i].id == QF_METRIC);
        }
    }
    free(cols);

    arena_deinit(&a);
    free(text);
    return 0;
}
