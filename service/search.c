/* search.c - listing and searching jobs: the filter, order_by and columns of a request parsed
 * (query/), the legacy status and tag parameters folded into the filter, the caller's projects
 * (the tenancy rule: a cluster admin sees every project, anyone else those it has a role in),
 * the page token (page_token.c) that carries the store's cursor, and the columns and summaries
 * each job comes back with. The SQL is store/search.c's. */
#include "service/svc_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* status "RUNNING,QUEUED" -> state IN (...); tag "k:v" -> tags.k = v, "k" -> EXISTS tags.k. */
static int legacy_filters(const svc_job_filter_t *f, arena_t *a, query_node_t **out, kiln_err_t *err)
{
    *out = NULL;
    if (f->status && *f->status) {
        char *copy = arena_strdup(a, f->status), *save = NULL;
        const char *states[64];
        int n = 0;
        for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            while (*t == ' ')
                t++;
            if (*t && n < (int)KILN_ARRAY_LEN(states))
                states[n++] = t;
        }
        if (n == 0) {
            kiln_err_set(err, KILN_EINVAL, "status", "status must name at least one job state");
            kiln_err_hint(err, "states are %s (comma-separated)", KILN_JOB_STATE_LIST);
            return KILN_EINVAL;
        }
        query_node_t *node = NULL;
        int rc = query_build_in("state", states, n, "status", a, &node, err);
        if (rc)
            return rc;
        *out = node;
    }
    if (f->tag && *f->tag) {
        char *key = arena_strdup(a, f->tag);
        char *colon = strchr(key, ':');
        if (colon)
            *colon = '\0';
        if (!*key)
            return kiln_err_set(err, KILN_EINVAL, "tag", "tag filter needs a key (\"key\" or \"key:value\")");
        /* the key as one quoted segment: whatever it holds, it names one tag */
        json_t *q = json_string(key);
        char *qs = q ? json_dumps(q, JSON_ENCODE_ANY) : NULL;
        json_decref(q);
        if (!qs)
            return kiln_err_set(err, KILN_EINVAL, "tag", "tag filter is not valid UTF-8");
        char *field = arena_sprintf(a, "tags.%s", qs);
        free(qs);
        query_node_t *node = NULL;
        int rc;
        if (colon) {
            const char *v = colon + 1;
            rc = query_build_in(field, &v, 1, "tag", a, &node, err);
        } else {
            rc = query_build_exists(field, "tag", a, &node, err);
        }
        if (rc)
            return rc;
        *out = query_and(a, *out, node);
    }
    return 0;
}

/* Adds "columns" and "summaries" to each job of the page. */
static int add_columns(store_conn_t *c, json_t *jobs, const query_columns_t *cols, kiln_err_t *err)
{
    size_t njobs = json_array_size(jobs);
    if (njobs == 0 || cols->n == 0)
        return 0;
    const char **ids = calloc(njobs, sizeof *ids);
    const char **names = calloc((size_t)cols->n, sizeof *names);
    int nnames = 0;
    bool all_metrics = false, any_metric = false;
    if (!ids || !names) {
        free(ids);
        free(names);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    for (size_t i = 0; i < njobs; i++)
        ids[i] = json_string_value(json_object_get(json_array_get(jobs, i), "id"));
    for (int k = 0; k < cols->n; k++) {
        if (cols->cols[k].id != QF_METRIC)
            continue;
        any_metric = true;
        if (!cols->cols[k].key)
            all_metrics = true;
        else
            names[nnames++] = cols->cols[k].key;
    }
    json_t *sums = NULL;
    int rc = 0;
    if (any_metric)
        rc = store_job_summaries_json(c, ids, (int)njobs, all_metrics ? NULL : names, nnames, &sums, err);
    free(ids);
    free(names);
    if (rc)
        return rc;
    static const char *const aggs[] = {"min", "max", "last", "count"};
    size_t i;
    json_t *job;
    json_array_foreach(jobs, i, job) {
        json_t *mine = json_object_get(sums, json_string_value(json_object_get(job, "id")));
        /* hp.NAME as search indexes it: a script's nested keys joined with '.', numeric text */
        json_t *hp = spec_hparams_flatten(json_object_get(json_object_get(job, "spec"), "hyperparameters"));
        json_t *colv = json_object(), *summ = json_object();
        for (int k = 0; k < cols->n; k++) {
            const query_column_t *col = &cols->cols[k];
            if (col->id == QF_HP) {
                const char *key;
                json_t *v;
                if (!col->key) {
                    json_object_foreach(hp, key, v) {
                        char cname[200];
                        snprintf(cname, sizeof cname, "hp.%s", key);
                        if (json_is_number(v))
                            json_object_set(colv, cname, v);
                    }
                    continue;
                }
                v = json_object_get(hp, col->key);
                json_object_set_new(colv, col->name, json_is_number(v) ? json_incref(v) : json_null());
                continue;
            }
            /* metrics: one summary, a whole one, or all of them */
            const char *name;
            json_t *sm;
            json_object_foreach(mine, name, sm) {
                if (col->key && strcmp(name, col->key) != 0)
                    continue;
                json_object_set(summ, name, sm);
            }
            if (col->key && col->agg != QA_NONE) {
                json_t *sm1 = json_object_get(mine, col->key);
                json_t *v = json_object_get(sm1, query_agg_name(col->agg));
                json_object_set_new(colv, col->name, v ? json_incref(v) : json_null());
                continue;
            }
            for (size_t a = 0; a < KILN_ARRAY_LEN(aggs); a++) {
                if (col->key) {
                    char cname[400];
                    snprintf(cname, sizeof cname, "metrics.%s.%s", col->key, aggs[a]);
                    json_t *v = json_object_get(json_object_get(mine, col->key), aggs[a]);
                    json_object_set_new(colv, cname, v ? json_incref(v) : json_null());
                    continue;
                }
                json_object_foreach(mine, name, sm) {
                    char cname[400];
                    snprintf(cname, sizeof cname, "metrics.%s.%s", name, aggs[a]);
                    json_t *v = json_object_get(sm, aggs[a]);
                    json_object_set_new(colv, cname, v ? json_incref(v) : json_null());
                }
            }
        }
        json_decref(hp);
        json_object_set_new(job, "columns", colv);
        json_object_set_new(job, "summaries", summ);
    }
    json_decref(sums);
    return 0;
}

static int search_timeout_ms(const svc_t *s)
{
    return s->cfg.search_timeout_ms > 0 ? s->cfg.search_timeout_ms : SVC_SEARCH_TIMEOUT_MS;
}

/* A search reads in one transaction whose every statement is cut off after --search-timeout-ms
 * (57014, KILN_ETIMEDOUT): the filter language bounds what one filter holds, but what PostgreSQL
 * needs to plan and run it grows with the tables, and a search must not hold a connection and
 * the database's CPU for minutes. */
static int search_begin(svc_t *s, store_conn_t *c, kiln_err_t *err)
{
    int rc = store_begin(c, err);
    return rc ? rc : store_tx_statement_timeout(c, search_timeout_ms(s), err);
}

int svc_job_list(svc_t *s, const svc_caller_t *who, const svc_job_filter_t *f, json_t **out, kiln_err_t *err)
{
    arena_t a;
    arena_init(&a, 0);
    query_node_t *filter = NULL, *legacy = NULL;
    query_order_t order;
    query_columns_t cols;
    json_t *cursor = NULL, *jobs = NULL, *next = NULL;
    const char **projects = NULL;
    store_conn_t *c = NULL;
    char *tok = NULL;
    int64_t now = kiln_now_us();
    *out = NULL;
    /* the one validator (check.c) before anything is parsed: text is UTF-8 without NUL, of a
     * bounded length, and a page size the caller gave is in range */
    int rc = 0;
    if ((rc = svc_check_str("filter", f->filter, 0, err)) || /* its length is the parser's: QUERY_MAX_TEXT */
        (rc = svc_check_str("order_by", f->order_by, 2048, err)) ||
        (rc = svc_check_str("columns", f->columns, 4096, err)) || (rc = svc_check_str("status", f->status, 200, err)) ||
        (rc = svc_check_str("tag", f->tag, 320, err)) || (rc = svc_check_str("page_token", f->page_token, 8192, err)) ||
        (f->page_size_set && (rc = svc_check_range("page_size", f->page_size, 1, KILN_PAGE_SIZE_MAX, err)))) {
        arena_deinit(&a);
        return rc;
    }
    rc = query_parse(f->filter, now, &a, &filter, err);
    if (rc == 0)
        rc = query_order_parse(f->order_by, &a, &order, err);
    if (rc == 0)
        rc = query_columns_parse(f->columns, &a, &cols, err);
    if (rc == 0)
        rc = legacy_filters(f, &a, &legacy, err);
    uint64_t fp = svc_search_fingerprint(f);
    if (rc == 0 && f->page_token && *f->page_token)
        rc = svc_page_token_decode(f->page_token, fp, &cursor, err);
    if (rc)
        goto fail;
    store_search_t q = {
        .filter = query_and(&a, legacy, filter),
        .order = &order,
        .limit = f->page_size <= 0 ? 50 : KILN_MIN(f->page_size, KILN_PAGE_SIZE_MAX),
        .after = cursor,
        .now_us = now,
    };
    /* Tenancy: a member sees the projects it has a role in; a cluster admin every project. */
    if (!who->cluster_admin) {
        projects = calloc((size_t)who->nroles + 1, sizeof(*projects));
        if (!projects) {
            rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
            goto fail;
        }
        for (int i = 0; i < who->nroles; i++)
            projects[i] = who->roles[i].project;
        q.projects = projects;
        q.nprojects = who->nroles;
    }
    if ((rc = store_conn_get(s->store, &c, err)) || (rc = search_begin(s, c, err)) ||
        (rc = store_job_search_json(c, &q, &jobs, &next, err)) || (rc = add_columns(c, jobs, &cols, err)))
        goto fail;
    store_rollback(c); /* it wrote nothing */
    if (next && !(tok = svc_page_token_encode(next, fp))) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto fail;
    }
    *out = json_pack("{s:O, s:s}", "jobs", jobs, "next_page_token", tok ? tok : "");
fail:
    if (rc == KILN_ETIMEDOUT) {
        kiln_err_set(err, KILN_EINVAL, "filter", "the search ran longer than the %d ms kilnd allows one search",
                     search_timeout_ms(s));
        kiln_err_hint(err, "narrow it: fewer hp.* and metrics.* comparisons, a created or state condition, "
                           "fewer columns (kilnd's --search-timeout-ms sets the limit)");
        rc = KILN_EINVAL;
    }
    store_conn_put(s->store, c);
    free(projects);
    free(tok);
    json_decref(cursor);
    json_decref(jobs);
    json_decref(next);
    arena_deinit(&a);
    return rc;
}
