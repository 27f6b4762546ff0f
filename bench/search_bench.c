/* search_bench.c - latency of experiment searches through kilnd's REST API: each of ten
 * representative searches (the list), and two on one hyperparameter matching some or
 * few jobs (what the planner misjudges without per-key statistics), is sent N times, one after
 * another on one keep-alive connection (libcurl, TLS with an API token when given), after a few
 * warm-up requests; prints how many jobs matched the first page, and p50/p90/p99/max latency
 * measured at the client. The deep page's token is found first by paging through 50,000 jobs.
 * Not a test: it asserts nothing (a search that fails is reported and counted).
 *
 * usage: search_bench --url URL [--ca FILE] [--token-file FILE] [--requests 200] [--warmup 10]
 *                     [--only N] */
#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

typedef struct query {
    const char *what;
    const char *filter;
    const char *order_by;
    const char *columns;
    bool deep;               /* the page after 50,000 matching jobs */
} query_t;

static const query_t k_queries[] = {
    {"single field", "hp.lr < 1e-4", NULL, "hp.lr,metrics.val_loss.min", false},
    {"AND of three", "hp.lr < 1e-3 AND hp.global_batch_size >= 64 AND state = COMPLETED", NULL,
     "hp.lr,metrics.val_loss.min", false},
    {"OR across a hyperparameter and a metric summary", "hp.lr < 2e-5 OR metrics.val_loss.min < 1.2", NULL,
     "hp.lr,metrics.val_loss.min", false},
    {"NOT", "NOT state = COMPLETED", NULL, "hp.lr,metrics.val_loss.min", false},
    {"tag match", "tags.team = speech", NULL, "hp.lr,metrics.val_loss.min", false},
    {"substring on name", "name ~ \"shakespeare-moe\"", NULL, "hp.lr,metrics.val_loss.min", false},
    {"ordering by a metric summary", "", "metrics.val_loss.min", "hp.lr,metrics.val_loss.min", false},
    {"a deep page (after 50,000 jobs)", "state = COMPLETED", NULL, "hp.lr,metrics.val_loss.min", true},
    {"a query matching nothing", "hp.lr > 1", NULL, "hp.lr,metrics.val_loss.min", false},
    {"a hyperparameter matching 1.6% of jobs", "hp.lr > 9e-3", NULL, "hp.lr,metrics.val_loss.min", false},
    {"a narrow range of one hyperparameter", "hp.lr > 1e-3 AND hp.lr < 1.0001e-3", NULL,
     "hp.lr,metrics.val_loss.min", false},
    {"one matching everything", "created > 2000-01-01", NULL, "hp.lr,metrics.val_loss.min", false},
};

static const char *base_url, *ca_file, *token_file;
static int64_t nrequests = 200, nwarmup = 10, only = 0;
static char auth_header[700];

typedef struct body {
    char *p;
    size_t len;
} body_t;

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *ud)
{
    body_t *b = ud;
    size_t n = size * nmemb;
    char *nb = realloc(b->p, b->len + n + 1);
    if (!nb)
        return 0;
    b->p = nb;
    memcpy(b->p + b->len, ptr, n);
    b->len += n;
    b->p[b->len] = '\0';
    return n;
}

/* GET /v1/jobs with the query's parameters; returns the HTTP status, *out the parsed body. */
static long search(CURL *h, const query_t *q, int page_size, const char *token, json_t **out)
{
    char url[8192];
    size_t l = (size_t)snprintf(url, sizeof url, "%s/v1/jobs?page_size=%d", base_url, page_size);
    const char *keys[] = {"filter", "order_by", "columns", "page_token"};
    const char *vals[] = {q->filter, q->order_by, q->columns, token};
    for (int i = 0; i < 4; i++) {
        if (!vals[i] || !*vals[i])
            continue;
        char *e = curl_easy_escape(h, vals[i], 0);
        l += (size_t)snprintf(url + l, sizeof url - l, "&%s=%s", keys[i], e);
        curl_free(e);
    }
    body_t b = {0};
    struct curl_slist *hdrs = auth_header[0] ? curl_slist_append(NULL, auth_header) : NULL;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    long status = 0;
    if (curl_easy_perform(h) == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(hdrs);
    *out = b.p ? json_loads(b.p, 0, NULL) : NULL;
    if (status != 200)
        fprintf(stderr, "search_bench: %s -> %ld %.300s\n", q->what, status, b.p ? b.p : "");
    free(b.p);
    return status;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    config_flag_t flags[] = {
        {"url", "KILN_URL", CONFIG_STR, &base_url, CONFIG_ANY, "kilnd's REST address"},
        {"ca", NULL, CONFIG_STR, &ca_file, CONFIG_ANY, "CA file for an https kilnd"},
        {"token-file", NULL, CONFIG_STR, &token_file, CONFIG_ANY, "file holding an API token"},
        {"requests", NULL, CONFIG_INT, &nrequests, CONFIG_ANY, "measured requests per search"},
        {"warmup", NULL, CONFIG_INT, &nwarmup, CONFIG_ANY, "unmeasured requests per search first"},
        {"only", NULL, CONFIG_INT, &only, CONFIG_ANY, "run only search number N (1-10)"},
    };
    kiln_err_t err;
    log_init("search_bench");
    int rc = config_parse(argc, argv, flags, KILN_ARRAY_LEN(flags), "search_bench [flags]", NULL, &err);
    if (rc == 1)
        return 0;
    if (rc || !base_url || nrequests < 1) {
        fprintf(stderr, "search_bench: %s\n", rc ? err.message : "need --url");
        return 2;
    }
    if (token_file) {
        char *t = NULL;
        if (kiln_file_read(token_file, &t, NULL, &err)) {
            fprintf(stderr, "search_bench: %s\n", err.message);
            return 2;
        }
        t[strcspn(t, "\r\n")] = '\0';
        snprintf(auth_header, sizeof auth_header, "Authorization: Bearer %s", t);
        free(t);
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    CURL *h = curl_easy_init();
    if (ca_file)
        curl_easy_setopt(h, CURLOPT_CAINFO, ca_file);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    int failures = 0;
    int64_t *lat = calloc((size_t)nrequests, sizeof *lat);
    printf("%-50s %8s %8s %8s %8s %8s  %s\n", "search", "matched", "p50 ms", "p90 ms", "p99 ms", "max ms", "filter | order_by");
    for (size_t k = 0; k < KILN_ARRAY_LEN(k_queries); k++) {
        if (only && (size_t)only != k + 1)
            continue;
        const query_t *q = &k_queries[k];
        char *token = NULL;
        if (q->deep) {
            /* 100 pages of 500: the token of the page that starts after 50,000 jobs */
            for (int page = 0; page < 100; page++) {
                json_t *j = NULL;
                if (search(h, q, 500, token, &j) != 200) {
                    failures++;
                    json_decref(j);
                    break;
                }
                free(token);
                const char *next = json_string_value(json_object_get(j, "next_page_token"));
                token = next && *next ? strdup(next) : NULL;
                json_decref(j);
                if (!token)
                    break;
            }
            if (!token) {
                printf("%-50s (fewer than 50,000 jobs match: no deep page)\n", q->what);
                continue;
            }
        }
        size_t matched = 0;
        int64_t n = 0;
        for (int64_t i = 0; i < nwarmup + nrequests; i++) {
            json_t *j = NULL;
            int64_t t0 = kiln_mono_us();
            long st = search(h, q, 50, token, &j);
            int64_t t1 = kiln_mono_us();
            if (st != 200)
                failures++;
            matched = json_array_size(json_object_get(j, "jobs"));
            json_decref(j);
            if (i >= nwarmup)
                lat[n++] = t1 - t0;
        }
        qsort(lat, (size_t)n, sizeof *lat, cmp_i64);
        printf("%-50s %8zu %8.1f %8.1f %8.1f %8.1f  %s%s%s\n", q->what, matched, lat[n / 2] / 1000.0,
               lat[n * 9 / 10] / 1000.0, lat[KILN_MIN(n - 1, n * 99 / 100)] / 1000.0, lat[n - 1] / 1000.0,
               q->filter, q->order_by ? " | " : "", q->order_by ? q->order_by : "");
        fflush(stdout);
        free(token);
    }
    free(lat);
    curl_easy_cleanup(h);
    curl_global_cleanup();
    if (failures)
        printf("search_bench: %d requests failed\n", failures);
    return failures ? 1 : 0;
}
