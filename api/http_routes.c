/* http_routes.c - the REST route table and one handler per route: check the path parameters,
 * query arguments and body fields, call the service as the authenticated caller, pass its JSON
 * through. Request parsing, authentication and replies are http.c's; streaming is
 * http_sse.c's; validation of job specs, states and permissions is the service's. */
#include <ctype.h>
#include <stdarg.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/http_int.h"

/* ---- argument helpers ------------------------------------------------------------------------ */

int http_arg_int(http_req_t *r, const char *name, int64_t lo, int64_t hi, int64_t *out,
                 bool *present, kiln_err_t *err)
{
    const char *v = http_arg(r, name);
    if (present)
        *present = v != NULL;
    if (!v)
        return 0;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi) {
        kiln_err_set(err, KILN_EINVAL, name, "query parameter %s must be an integer from %lld to %lld, got \"%.64s\"",
                     name, (long long)lo, (long long)hi, v);
        return KILN_EINVAL;
    }
    *out = x;
    return 0;
}

static int http_arg_bool(http_req_t *r, const char *name, bool *out, kiln_err_t *err)
{
    const char *v = http_arg(r, name);
    *out = false;
    if (!v)
        return 0;
    if (!strcmp(v, "true") || !strcmp(v, "1") || !*v) {
        *out = true;
        return 0;
    }
    if (!strcmp(v, "false") || !strcmp(v, "0"))
        return 0;
    kiln_err_set(err, KILN_EINVAL, name, "query parameter %s must be true or false, got \"%.64s\"",
                 name, v);
    return KILN_EINVAL;
}

/* Job ids are UUIDs (8-4-4-4-12 hex digits); anything else can never name a job. */
static bool http_is_uuid(const char *s)
{
    static const int dash[] = {8, 13, 18, 23};
    if (strlen(s) != 36)
        return false;
    for (int i = 0, d = 0; i < 36; i++) {
        if (d < 4 && i == dash[d]) {
            if (s[i] != '-')
                return false;
            d++;
        } else if (!isxdigit((unsigned char)s[i])) {
            return false;
        }
    }
    return true;
}

static enum MHD_Result http_bad_id(http_req_t *r)
{
    return http_reply_errf(r, KILN_ENOTFOUND, "id", "job ids are UUIDs, as POST /v1/jobs returns them",
                           "no job \"%.80s\": not a job id", r->id);
}

/* Job routes first check that the id can name a job at all. */
#define HTTP_JOB_ID(r)                                                                            \
    do {                                                                                          \
        if (!http_is_uuid((r)->id))                                                               \
            return http_bad_id(r);                                                                \
    } while (0)

/* Replies with the service's error; rc fills in a status the service left unset. */
static enum MHD_Result http_svc_err(http_req_t *r, int rc, kiln_err_t *err)
{
    if (!err->status)
        err->status = rc ? rc : KILN_EINTERNAL;
    return http_reply_err(r, err);
}

/* Parses the body as JSON. Empty bodies give *out = NULL when allow_empty. */
static int http_body_json(http_req_t *r, bool allow_empty, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    size_t i = 0;
    while (i < r->body_len && isspace((unsigned char)r->body[i]))
        i++;
    if (i == r->body_len) {
        if (allow_empty)
            return 0;
        kiln_err_set(err, KILN_EFORMAT, NULL, "request body is empty");
        kiln_err_hint(err, "send a JSON object");
        return KILN_EFORMAT;
    }
    json_error_t jerr;
    json_t *j = json_loadb(r->body, r->body_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!j) {
        kiln_err_set(err, KILN_EFORMAT, NULL, "request body is not valid JSON: %s at line %d column %d",
                     jerr.text, jerr.line, jerr.column);
        kiln_err_detail(err, "line %d, column %d (byte %d)", jerr.line, jerr.column, jerr.position);
        kiln_err_hint(err, "check the JSON syntax near that position");
        return KILN_EFORMAT;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        kiln_err_set(err, KILN_EFORMAT, NULL, "request body must be a JSON object");
        return KILN_EFORMAT;
    }
    *out = j;
    return 0;
}

/* ---- jobs ------------------------------------------------------------------------------------ */

static enum MHD_Result http_jobs_create(http_req_t *r)
{
    const svc_caller_t *who = &r->who;
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *spec = NULL, *job = NULL;
    enum MHD_Result ret;
    int rc = http_body_json(r, false, &spec, &err);
    if (rc)
        return http_reply_err(r, &err);
    const char *key = http_header(r, "Idempotency-Key");
    if (key && (!*key || strlen(key) > 200)) {
        json_decref(spec);
        return http_reply_errf(r, KILN_EINVAL, "Idempotency-Key", "use a UUID or another unique string",
                               "Idempotency-Key must have 1 to 200 characters");
    }
    bool created = true;
    rc = svc_job_create(r->h->svc, who, spec, key, &job, &created, &err);
    json_decref(spec);
    if (rc)
        return http_svc_err(r, rc, &err);
    ret = http_reply_json(r, created ? MHD_HTTP_CREATED : MHD_HTTP_OK, job);
    return ret;
}

static const char *const http_states[] = {"QUEUED", "SCHEDULED", "STARTING", "RUNNING", "STOPPING",
                                          "RESTARTING", "COMPLETED", "FAILED", "STOPPED"};

/* Checks a comma-separated state list; returns it upper-cased (arena) or NULL with err set. */
static const char *http_status_filter(http_req_t *r, const char *v, kiln_err_t *err)
{
    char *s = arena_strdup(&r->arena, v);
    for (char *p = s; *p; p++)
        *p = (char)toupper((unsigned char)*p);
    char *copy = arena_strdup(&r->arena, s), *save = NULL;
    int n = 0;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save), n++) {
        bool ok = false;
        for (size_t i = 0; i < KILN_ARRAY_LEN(http_states); i++)
            ok = ok || !strcmp(tok, http_states[i]);
        if (!ok) {
            kiln_err_set(err, KILN_EINVAL, "status", "unknown job state \"%.40s\" in status", tok);
            kiln_err_hint(err, "states are QUEUED, SCHEDULED, STARTING, RUNNING, STOPPING, "
                               "RESTARTING, COMPLETED, FAILED, STOPPED (comma-separated)");
            return NULL;
        }
    }
    if (n == 0) {
        kiln_err_set(err, KILN_EINVAL, "status", "status must name at least one job state");
        return NULL;
    }
    return s;
}

static enum MHD_Result http_jobs_list(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    svc_job_filter_t f = {0};
    int64_t page_size = 0;
    const char *status = http_arg(r, "status");
    if (status && *status && !(f.status = http_status_filter(r, status, &err)))
        return http_reply_err(r, &err);
    if (http_arg_int(r, "page_size", 1, 500, &page_size, NULL, &err))
        return http_reply_err(r, &err);
    f.page_size = (int)page_size;
    const char *tag = http_arg(r, "tag");
    f.tag = tag && *tag ? tag : NULL;
    const char *tok = http_arg(r, "page_token");
    f.page_token = tok && *tok ? tok : NULL;
    json_t *out = NULL;
    int rc = svc_job_list(r->h->svc, &r->who, &f, &out, &err);
    if (rc)
        return http_svc_err(r, rc, &err);
    return http_reply_json(r, MHD_HTTP_OK, out);
}

static enum MHD_Result http_job_get(http_req_t *r)
{
    HTTP_JOB_ID(r);
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *out = NULL;
    int rc = svc_job_get(r->h->svc, &r->who, r->id, &out, &err);
    if (rc)
        return http_svc_err(r, rc, &err);
    return http_reply_json(r, MHD_HTTP_OK, out);
}

static enum MHD_Result http_job_stop(http_req_t *r)
{
    HTTP_JOB_ID(r);
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *body = NULL, *out = NULL;
    const char *reason = NULL;
    int rc = http_body_json(r, true, &body, &err);
    if (rc)
        return http_reply_err(r, &err);
    if (body) {
        json_t *jr = json_object_get(body, "reason");
        if (jr && !json_is_string(jr) && !json_is_null(jr)) {
            json_decref(body);
            return http_reply_errf(r, KILN_EINVAL, "reason", NULL, "reason must be a string");
        }
        if (json_is_string(jr))
            reason = arena_strdup(&r->arena, json_string_value(jr));
        json_decref(body);
    }
    rc = svc_job_stop(r->h->svc, &r->who, r->id, reason, &out, &err);
    if (rc)
        return http_svc_err(r, rc, &err);
    return http_reply_json(r, MHD_HTTP_OK, out);
}

static enum MHD_Result http_job_events(http_req_t *r)
{
    HTTP_JOB_ID(r);
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *out = NULL;
    int rc = svc_job_events(r->h->svc, &r->who, r->id, &out, &err);
    if (rc)
        return http_svc_err(r, rc, &err);
    return http_reply_json(r, MHD_HTTP_OK, out);
}

static enum MHD_Result http_job_logs(http_req_t *r)
{
    HTTP_JOB_ID(r);
    kiln_err_t err;
    kiln_err_clear(&err);
    int64_t rank = -1, after_seq = 0, limit = 0;
    bool follow = false;
    svc_log_query_t q = {.rank = -1};
    if (http_arg_int(r, "rank", 0, 1 << 20, &rank, NULL, &err) ||
        http_arg_int(r, "after_seq", 0, INT64_MAX, &after_seq, NULL, &err) ||
        http_arg_int(r, "limit", 1, 10000, &limit, NULL, &err) ||
        http_arg_bool(r, "follow", &follow, &err))
        return http_reply_err(r, &err);
    const char *since = http_arg(r, "since");
    if (since && *since && kiln_time_parse(since, &q.since_us)) {
        return http_reply_errf(r, KILN_EINVAL, "since",
                               "use RFC 3339 (2026-11-21T06:04:37Z) or Unix seconds",
                               "query parameter since is not a time: \"%.64s\"", since);
    }
    q.rank = (int)rank;
    q.after_seq = after_seq;
    q.limit = (int)limit;
    if (follow) {
        /* A reconnecting EventSource sends the last id it saw. */
        const char *last = http_header(r, "Last-Event-ID");
        if (last && *last) {
            char *end;
            errno = 0;
            long long x = strtoll(last, &end, 10);
            if (*end || errno || x < 0)
                return http_reply_errf(r, KILN_EINVAL, "Last-Event-ID", "send the id of the last event received",
                                       "Last-Event-ID must be a log sequence number, got \"%.64s\"", last);
            if (x > q.after_seq)
                q.after_seq = x;
        }
        return http_sse_start(r, q.rank, q.after_seq, q.since_us);
    }
    json_t *out = NULL;
    int rc = svc_job_logs(r->h->svc, &r->who, r->id, &q, &out, &err);
    if (rc)
        return http_svc_err(r, rc, &err);
    return http_reply_json(r, MHD_HTTP_OK, out);
}

static enum MHD_Result http_job_metrics(http_req_t *r)
{
    HTTP_JOB_ID(r);
    kiln_err_t err;
    kiln_err_clear(&err);
    int64_t max_points = 0, start_step = 0, end_step = 0;
    if (http_arg_int(r, "max_points", 2, 100000, &max_points, NULL, &err) ||
        http_arg_int(r, "start_step", 0, INT64_MAX, &start_step, NULL, &err) ||
        http_arg_int(r, "end_step", 0, INT64_MAX, &end_step, NULL, &err))
        return http_reply_err(r, &err);
    if (end_step > 0 && start_step > end_step)
        return http_reply_errf(r, KILN_EINVAL, "end_step", "end_step must be at least start_step",
                               "end_step %lld is before start_step %lld", (long long)end_step,
                               (long long)start_step);
    const char *name = http_arg(r, "name");
    json_t *out = NULL;
    int rc = svc_job_metrics_range(r->h->svc, &r->who, r->id, name && *name ? name : NULL, start_step,
                                   end_step, (int)max_points, &out, &err);
    if (rc)
        return http_svc_err(r, rc, &err);
    return http_reply_json(r, MHD_HTTP_OK, out);
}

/* ---- cluster and health ---------------------------------------------------------------------- */

static enum MHD_Result http_workers(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *out = NULL;
    int rc = svc_workers_list(r->h->svc, &r->who, &out, &err);
    if (rc)
        return http_svc_err(r, rc, &err);
    return http_reply_json(r, MHD_HTTP_OK, out);
}

static enum MHD_Result http_healthz(http_req_t *r)
{
    return http_reply_json(r, MHD_HTTP_OK, json_pack("{s:s}", "status", "ok"));
}

static enum MHD_Result http_readyz(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = svc_ready(r->h->svc, &err);
    if (rc)
        return http_svc_err(r, rc, &err);
    return http_reply_json(r, MHD_HTTP_OK, json_pack("{s:s}", "status", "ready"));
}

/* Appends to a heap buffer; on allocation failure the text is just cut short. */
static void http_buf_printf(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void http_buf_printf(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(*buf + *len, *cap - *len, fmt, ap);
        va_end(ap);
        if (n < 0)
            return;
        if ((size_t)n < *cap - *len) {
            *len += (size_t)n;
            return;
        }
        char *nb = realloc(*buf, *cap * 2 + (size_t)n);
        if (!nb)
            return;
        *buf = nb;
        *cap = *cap * 2 + (size_t)n;
    }
}

/* GET /metrics: Prometheus text format. Request counts by route and status, latency sums,
 * open log streams, and jobs by state (one count query per state through the service). */
static enum MHD_Result http_prometheus(http_req_t *r)
{
    api_http_t *h = r->h;
    size_t len = 0, cap = 8192;
    char *buf = malloc(cap);
    if (!buf)
        return MHD_NO;
    buf[0] = '\0';
    http_buf_printf(&buf, &len, &cap,
                    "# HELP kiln_http_requests_total REST requests answered, by route and status.\n"
                    "# TYPE kiln_http_requests_total counter\n");
    for (size_t rt = 0; rt <= http_route_count; rt++)
        for (int st = 100; st < 600; st++) {
            size_t slot = rt < http_route_count ? rt : HTTP_MAX_ROUTES;
            unsigned long n = atomic_load_explicit(&h->requests[slot][st], memory_order_relaxed);
            if (n)
                http_buf_printf(&buf, &len, &cap,
                                "kiln_http_requests_total{route=\"%s%s%s\",status=\"%d\"} %lu\n",
                                rt < http_route_count ? http_routes[rt].method : "unknown",
                                rt < http_route_count ? " " : "",
                                rt < http_route_count ? http_routes[rt].pattern : "", st, n);
        }
    http_buf_printf(&buf, &len, &cap,
                    "# HELP kiln_http_request_seconds_sum Time spent answering REST requests, by route.\n"
                    "# TYPE kiln_http_request_seconds_sum counter\n");
    for (size_t rt = 0; rt <= http_route_count; rt++) {
        size_t slot = rt < http_route_count ? rt : HTTP_MAX_ROUTES;
        unsigned long long us = atomic_load_explicit(&h->latency_us[slot], memory_order_relaxed);
        if (us)
            http_buf_printf(&buf, &len, &cap, "kiln_http_request_seconds_sum{route=\"%s%s%s\"} %.6f\n",
                            rt < http_route_count ? http_routes[rt].method : "unknown",
                            rt < http_route_count ? " " : "",
                            rt < http_route_count ? http_routes[rt].pattern : "", us / 1e6);
    }
    pthread_mutex_lock(&h->streams_lock);
    int streams = h->nstreams;
    pthread_mutex_unlock(&h->streams_lock);
    http_buf_printf(&buf, &len, &cap,
                    "# HELP kiln_http_log_streams Open live log streams (SSE).\n"
                    "# TYPE kiln_http_log_streams gauge\nkiln_http_log_streams %d\n", streams);
    /* Live jobs only: finished jobs grow without bound and are not worth paging through here. */
    static const char *const live[] = {"QUEUED", "SCHEDULED", "STARTING", "RUNNING", "STOPPING",
                                       "RESTARTING"};
    http_buf_printf(&buf, &len, &cap,
                    "# HELP kiln_jobs Jobs not yet finished, by state (at most 10000 counted per state).\n"
                    "# TYPE kiln_jobs gauge\n");
    for (size_t i = 0; i < KILN_ARRAY_LEN(live); i++) {
        size_t count = 0;
        char token[512] = "";
        kiln_err_t err;
        for (int page = 0; page < 20; page++) {
            svc_job_filter_t f = {.status = live[i], .page_size = 500,
                                  .page_token = token[0] ? token : NULL};
            json_t *out = NULL;
            kiln_err_clear(&err);
            if (svc_job_list(h->svc, svc_caller_kilnd(), &f, &out, &err))
                break;
            count += json_array_size(json_object_get(out, "jobs"));
            const char *next = json_string_value(json_object_get(out, "next_page_token"));
            bool more = next && *next && strlen(next) < sizeof token;
            if (more)
                kiln_strlcpy(token, next, sizeof token);
            json_decref(out);
            if (!more)
                break;
        }
        http_buf_printf(&buf, &len, &cap, "kiln_jobs{state=\"%s\"} %zu\n", live[i], count);
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(buf);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4");
    enum MHD_Result ret = http_reply_raw(r, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ret;
}


/* ---- identity and tenancy -------------------------------------------------------------------- */

/* Reads the body as a JSON object whose keys are among `keys` (NULL-terminated); an unknown key
 * is a 400 naming it. *out may be NULL for an empty body when allow_empty. */
static int http_body_fields(http_req_t *r, bool allow_empty, const char *const *keys, json_t **out,
                            kiln_err_t *err)
{
    int rc = http_body_json(r, allow_empty, out, err);
    if (rc || !*out)
        return rc;
    const char *k;
    json_t *v;
    json_object_foreach(*out, k, v) {
        bool known = false;
        for (size_t i = 0; keys[i] && !known; i++)
            known = !strcmp(k, keys[i]);
        if (!known) {
            char list[160] = "";
            for (size_t i = 0; keys[i]; i++)
                snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", i ? ", " : "", keys[i]);
            kiln_err_set(err, KILN_EINVAL, k, "unknown field \"%.60s\"", k);
            kiln_err_hint(err, "this request takes %s", list);
            json_decref(*out);
            *out = NULL;
            return KILN_EINVAL;
        }
    }
    return 0;
}

/* A string field of body (NULL when absent); a field of another type is a 400. */
static int http_field_str(json_t *body, const char *key, bool required, const char **out, kiln_err_t *err)
{
    json_t *v = json_object_get(body, key);
    *out = NULL;
    if (!v || json_is_null(v)) {
        if (required) {
            kiln_err_set(err, KILN_EINVAL, key, "%s is required", key);
            return KILN_EINVAL;
        }
        return 0;
    }
    if (!json_is_string(v)) {
        kiln_err_set(err, KILN_EINVAL, key, "%s must be a string", key);
        return KILN_EINVAL;
    }
    *out = json_string_value(v);
    return 0;
}

static enum MHD_Result http_reply_svc(http_req_t *r, int rc, kiln_err_t *err, int status, json_t *out)
{
    if (rc)
        return http_svc_err(r, rc, err);
    return http_reply_json(r, status, out);
}

static enum MHD_Result http_whoami(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *out = NULL;
    int rc = svc_whoami(r->h->svc, &r->who, &out, &err);
    return http_reply_svc(r, rc, &err, MHD_HTTP_OK, out);
}

static enum MHD_Result http_users_list(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *out = NULL;
    int rc = svc_users_list(r->h->svc, &r->who, &out, &err);
    return http_reply_svc(r, rc, &err, MHD_HTTP_OK, out);
}

static enum MHD_Result http_users_create(http_req_t *r)
{
    static const char *const keys[] = {"name", "cluster_admin", NULL};
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *body = NULL, *out = NULL;
    const char *name = NULL;
    int rc = http_body_fields(r, false, keys, &body, &err);
    if (rc == 0)
        rc = http_field_str(body, "name", true, &name, &err);
    json_t *admin = json_object_get(body, "cluster_admin");
    if (rc == 0 && admin && !json_is_boolean(admin))
        rc = kiln_err_set(&err, KILN_EINVAL, "cluster_admin", "cluster_admin must be true or false");
    if (rc == 0)
        rc = svc_user_create(r->h->svc, &r->who, name, json_is_true(admin), &out, &err);
    json_decref(body);
    return http_reply_svc(r, rc, &err, MHD_HTTP_CREATED, out);
}

static enum MHD_Result http_tokens_create(http_req_t *r)
{
    static const char *const keys[] = {"expires_in_s", "description", NULL};
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *body = NULL, *out = NULL;
    const char *desc = NULL;
    int64_t expires = 0;
    int rc = http_body_fields(r, true, keys, &body, &err);
    if (rc == 0)
        rc = http_field_str(body, "description", false, &desc, &err);
    json_t *e = json_object_get(body, "expires_in_s");
    if (rc == 0 && e && !json_is_null(e)) {
        if (!json_is_integer(e))
            rc = kiln_err_set(&err, KILN_EINVAL, "expires_in_s", "expires_in_s must be a whole number of seconds");
        else
            expires = json_integer_value(e);
    }
    if (rc == 0)
        rc = svc_token_create(r->h->svc, &r->who, http_param(r, "name"), expires, desc, &out, &err);
    json_decref(body);
    return http_reply_svc(r, rc, &err, MHD_HTTP_CREATED, out);
}

static enum MHD_Result http_tokens_list(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *out = NULL;
    int rc = svc_tokens_list(r->h->svc, &r->who, http_param(r, "name"), &out, &err);
    return http_reply_svc(r, rc, &err, MHD_HTTP_OK, out);
}

static enum MHD_Result http_token_revoke(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *out = NULL;
    int rc = svc_token_revoke(r->h->svc, &r->who, r->id, &out, &err);
    return http_reply_svc(r, rc, &err, MHD_HTTP_OK, out);
}

static enum MHD_Result http_projects_list(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *out = NULL;
    int rc = svc_projects_list(r->h->svc, &r->who, &out, &err);
    return http_reply_svc(r, rc, &err, MHD_HTTP_OK, out);
}

static enum MHD_Result http_projects_create(http_req_t *r)
{
    static const char *const keys[] = {"name", NULL};
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *body = NULL, *out = NULL;
    const char *name = NULL;
    int rc = http_body_fields(r, false, keys, &body, &err);
    if (rc == 0)
        rc = http_field_str(body, "name", true, &name, &err);
    if (rc == 0)
        rc = svc_project_create(r->h->svc, &r->who, name, &out, &err);
    json_decref(body);
    return http_reply_svc(r, rc, &err, MHD_HTTP_CREATED, out);
}

static enum MHD_Result http_members_list(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *out = NULL;
    int rc = svc_members_list(r->h->svc, &r->who, http_param(r, "project"), &out, &err);
    return http_reply_svc(r, rc, &err, MHD_HTTP_OK, out);
}

static enum MHD_Result http_member_set(http_req_t *r)
{
    static const char *const keys[] = {"role", NULL};
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *body = NULL, *out = NULL;
    const char *role = NULL;
    int rc = http_body_fields(r, false, keys, &body, &err);
    if (rc == 0)
        rc = http_field_str(body, "role", true, &role, &err);
    if (rc == 0)
        rc = svc_member_set(r->h->svc, &r->who, http_param(r, "project"), http_param(r, "user"), role, &out,
                           &err);
    json_decref(body);
    return http_reply_svc(r, rc, &err, MHD_HTTP_OK, out);
}

static enum MHD_Result http_member_remove(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = svc_member_remove(r->h->svc, &r->who, http_param(r, "project"), http_param(r, "user"), &err);
    if (rc)
        return http_svc_err(r, rc, &err);
    return http_reply_json(r, MHD_HTTP_OK, json_pack("{s:s, s:s}", "project", http_param(r, "project"),
                                                     "user", http_param(r, "user")));
}

/* ---- one-time login links (the web UI) ------------------------------------------------------- */

static enum MHD_Result http_login_link_create(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *body = NULL, *out = NULL;
    int rc = http_body_json(r, true, &body, &err);
    if (rc == 0 && json_object_size(body) > 0) {
        rc = kiln_err_set(&err, KILN_EINVAL, json_object_iter_key(json_object_iter(body)),
                          "unknown field \"%.60s\"", json_object_iter_key(json_object_iter(body)));
        kiln_err_hint(&err, "this request takes no fields: send {} or nothing");
    }
    json_decref(body);
    if (rc == 0)
        rc = svc_login_link_create(r->h->svc, &r->who, &out, &err);
    return http_reply_svc(r, rc, &err, MHD_HTTP_CREATED, out);
}

/* Open: the code in the body is the credential. It travels in the body, never in a URL, so no
 * access log or browser history holds it. */
static enum MHD_Result http_login_link_redeem(http_req_t *r)
{
    static const char *const keys[] = {"code", NULL};
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *body = NULL, *out = NULL;
    const char *code = NULL;
    int rc = http_body_fields(r, false, keys, &body, &err);
    if (rc == 0)
        rc = http_field_str(body, "code", true, &code, &err);
    if (rc == 0)
        rc = svc_login_link_redeem(r->h->svc, code, &out, &err);
    json_decref(body);
    return http_reply_svc(r, rc, &err, MHD_HTTP_OK, out);
}

/* ---- the table ------------------------------------------------------------------------------- */

const http_route_t http_routes[] = {
    {"GET", "/v1/jobs", http_jobs_list, 0},
    {"POST", "/v1/jobs", http_jobs_create, 0},
    {"GET", "/v1/jobs/{id}", http_job_get, 0},
    {"POST", "/v1/jobs/{id}:stop", http_job_stop, 0},
    {"GET", "/v1/jobs/{id}/events", http_job_events, 0},
    {"GET", "/v1/jobs/{id}/logs", http_job_logs, 0},
    {"GET", "/v1/jobs/{id}/metrics", http_job_metrics, 0},
    {"GET", "/v1/workers", http_workers, 0},
    {"GET", "/v1/whoami", http_whoami, 0},
    {"GET", "/v1/users", http_users_list, 0},
    {"POST", "/v1/users", http_users_create, 0},
    {"GET", "/v1/users/{name}/tokens", http_tokens_list, 0},
    {"POST", "/v1/users/{name}/tokens", http_tokens_create, 0},
    {"DELETE", "/v1/tokens/{id}", http_token_revoke, 0},
    {"GET", "/v1/projects", http_projects_list, 0},
    {"POST", "/v1/projects", http_projects_create, 0},
    {"GET", "/v1/projects/{project}/members", http_members_list, 0},
    {"PUT", "/v1/projects/{project}/members/{user}", http_member_set, 0},
    {"DELETE", "/v1/projects/{project}/members/{user}", http_member_remove, 0},
    {"POST", "/v1/login-links", http_login_link_create, 0},
    {"POST", "/v1/login-links:redeem", http_login_link_redeem, HTTP_OPEN},
    {"GET", "/", http_ui_index, HTTP_OPEN},
    {"GET", "/ui", http_ui_index, HTTP_OPEN},
    {"GET", "/ui/{asset}", http_ui_asset, HTTP_OPEN},
    {"GET", "/healthz", http_healthz, HTTP_OPEN},
    {"GET", "/readyz", http_readyz, HTTP_OPEN},
    {"GET", "/metrics", http_prometheus, HTTP_PROM},
};
const size_t http_route_count = KILN_ARRAY_LEN(http_routes);
