/* http_routes.c - the REST route table and one handler per route: check the path parameters,
 * query arguments and body fields, call the service as the authenticated caller, pass its JSON
 * through. Request parsing, authentication and replies are http.c's; streaming is
 * http_sse.c's; validation of job specs, states and permissions is the service's. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
    return svc_check_int_text(name, v, lo, hi, out, err);
}

static int http_arg_bool(http_req_t *r, const char *name, bool *out, kiln_err_t *err)
{
    return svc_check_bool_text(name, http_arg(r, name), out, err);
}

/* Finds the first query argument not in names (NULL-terminated), or given twice: http_arg reads
 * only the first, so a second would go unread (as a JSON body's repeated key is refused). */
typedef struct http_args_check {
    const char *const *names;
    const char *unknown, *repeated;
    uint64_t seen; /* bit i: names[i] was met */
} http_args_check_t;

static enum MHD_Result http_args_visit(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    http_args_check_t *c = cls;
    (void)kind;
    (void)value;
    for (size_t i = 0; c->names[i]; i++)
        if (!strcmp(key, c->names[i])) {
            uint64_t bit = i < 64 ? (uint64_t)1 << i : 0;
            if (c->seen & bit) {
                c->repeated = key;
                return MHD_NO;
            }
            c->seen |= bit;
            return MHD_YES;
        }
    c->unknown = key;
    return MHD_NO;
}

int http_args_known(http_req_t *r, const char *const *names, kiln_err_t *err)
{
    http_args_check_t c = {names, NULL, NULL, 0};
    MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, http_args_visit, &c);
    if (c.repeated) {
        kiln_err_set(err, KILN_EINVAL, c.repeated, "query parameter \"%.60s\" is given more than once", c.repeated);
        kiln_err_hint(err, "give %.60s once", c.repeated);
        return KILN_EINVAL;
    }
    if (!c.unknown)
        return 0;
    char list[256] = "";
    for (size_t i = 0; names[i]; i++)
        snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", i ? ", " : "", names[i]);
    const char *best = NULL;
    int best_d = 99;
    for (size_t i = 0; names[i]; i++) {
        int d = kiln_edit_distance(c.unknown, names[i]);
        if (d < best_d) {
            best_d = d;
            best = names[i];
        }
    }
    kiln_err_set(err, KILN_EINVAL, c.unknown, "unknown query parameter \"%.60s\"", c.unknown);
    if (!names[0])
        kiln_err_hint(err, "this request takes no query parameters");
    else if (best && best_d <= 3 && (size_t)best_d < strlen(c.unknown))
        kiln_err_hint(err, "did you mean %s? this request takes %s", best, list);
    else
        kiln_err_hint(err, "this request takes %s", list);
    return KILN_EINVAL;
}

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
    /* The service checks the key as gRPC's idempotency_key; over REST it is a header, named as
     * the client wrote it. */
    const char *key = http_header(r, "Idempotency-Key");
    if (key && !*key) {
        json_decref(spec);
        return http_reply_errf(r, KILN_EINVAL, "Idempotency-Key", "use a UUID or another unique string",
                               "Idempotency-Key must have 1 to 200 characters");
    }
    if (key && svc_check_str("Idempotency-Key", key, 200, &err)) {
        json_decref(spec);
        return http_reply_err(r, &err);
    }
    bool created = true;
    rc = svc_job_create(r->h->svc, who, spec, key, &job, &created, &err);
    json_decref(spec);
    if (rc)
        return http_svc_err(r, rc, &err);
    ret = http_reply_json(r, created ? MHD_HTTP_CREATED : MHD_HTTP_OK, job);
    return ret;
}

/* A paged list's page_size and page_token, as every list reads them: page_size a whole number of
 * int32 (set says whether it was given) whose range the service checks, as it checks gRPC's (the
 * same message for 0 or 501 on both); "?page_token=" the first page. Nonzero (err set) when
 * page_size is no such number: the message gives the range the service takes, 1 to
 * KILN_PAGE_SIZE_MAX, not int32's. */
static int http_page_args(http_req_t *r, int *size, bool *set, const char **token, kiln_err_t *err)
{
    int64_t v = 0;
    const char *text = http_arg(r, "page_size");
    *set = text != NULL;
    if (text && (kiln_parse_int64(text, &v) != 0 || v < INT32_MIN || v > INT32_MAX))
        return svc_check_int_text("page_size", text, 1, KILN_PAGE_SIZE_MAX, &v, err);
    *size = (int)v;
    *token = http_arg(r, "page_token");
    if (*token && !**token)
        *token = NULL;
    return 0;
}

/* The filters are checked by the service (the same checks as gRPC's ListJobs and SearchJobs). */
static enum MHD_Result http_jobs_list(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    svc_job_filter_t f = {0};
    if (http_page_args(r, &f.page_size, &f.page_size_set, &f.page_token, &err))
        return http_reply_err(r, &err);
    f.status = http_arg(r, "status");
    f.tag = http_arg(r, "tag");
    f.filter = http_arg(r, "filter");
    f.order_by = http_arg(r, "order_by");
    f.columns = http_arg(r, "columns");
    /* an empty parameter ("?tag=") is the same as none */
    if (f.status && !*f.status)
        f.status = NULL;
    if (f.tag && !*f.tag)
        f.tag = NULL;
    json_t *out = NULL;
    int rc = svc_job_list(r->h->svc, &r->who, &f, &out, &err);
    if (rc)
        return http_svc_err(r, rc, &err);
    return http_reply_json(r, MHD_HTTP_OK, out);
}

/* A string field of a search body; columns may also be an array of strings (joined with ','). */
static int http_search_field(http_req_t *r, json_t *body, const char *key, const char **out, kiln_err_t *err)
{
    json_t *v = json_object_get(body, key);
    *out = NULL;
    if (!v || json_is_null(v))
        return 0;
    if (json_is_string(v)) {
        *out = arena_strdup(&r->arena, json_string_value(v));
        return 0;
    }
    if (!strcmp(key, "columns") && json_is_array(v)) {
        size_t i, len = 1;
        json_t *e;
        json_array_foreach(v, i, e) {
            if (!json_is_string(e)) {
                kiln_err_set(err, KILN_EINVAL, "columns", "columns[%zu] must be a string", i);
                kiln_err_hint(err, "for example [\"hp.lr\", \"metrics.val_loss.min\"]");
                return KILN_EINVAL;
            }
            len += json_string_length(e) + 1;
        }
        char *joined = arena_alloc(&r->arena, len);
        json_array_foreach(v, i, e) {
            if (i)
                strcat(joined, ",");
            strcat(joined, json_string_value(e));
        }
        *out = joined;
        return 0;
    }
    kiln_err_set(err, KILN_EINVAL, key, "%s must be a string%s", key,
                 !strcmp(key, "columns") ? " or an array of strings" : "");
    return KILN_EINVAL;
}

static int http_body_fields(http_req_t *r, bool allow_empty, const char *const *keys, json_t **out,
                            kiln_err_t *err);

/* POST /v1/jobs:search: GET /v1/jobs's parameters in a JSON body, for long filters. */
static enum MHD_Result http_jobs_search(http_req_t *r)
{
    static const char *const keys[] = {"filter", "order_by", "columns", "page_size", "page_token", "status", "tag",
                                       NULL};
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *body = NULL, *out = NULL;
    svc_job_filter_t f = {0};
    int rc = http_body_fields(r, true, keys, &body, &err);
    if (rc == 0)
        rc = http_search_field(r, body, "filter", &f.filter, &err);
    if (rc == 0)
        rc = http_search_field(r, body, "order_by", &f.order_by, &err);
    if (rc == 0)
        rc = http_search_field(r, body, "columns", &f.columns, &err);
    if (rc == 0)
        rc = http_search_field(r, body, "page_token", &f.page_token, &err);
    if (rc == 0)
        rc = http_search_field(r, body, "status", &f.status, &err);
    if (rc == 0)
        rc = http_search_field(r, body, "tag", &f.tag, &err);
    json_t *ps = json_object_get(body, "page_size");
    if (rc == 0 && ps && !json_is_null(ps)) {
        /* the service's range check, as for GET /v1/jobs and gRPC */
        if (!json_is_integer(ps)) {
            /* what it got, as the query's page_size=abc is answered */
            char *got = json_dumps(ps, JSON_ENCODE_ANY | JSON_COMPACT | JSON_ENSURE_ASCII);
            rc = kiln_err_set(&err, KILN_EINVAL, "page_size",
                              "page_size must be a whole number from 1 to %d, got %.40s%s", KILN_PAGE_SIZE_MAX,
                              got ? got : "?", got && strlen(got) > 40 ? "..." : "");
            kiln_err_hint(&err, "give page_size as a JSON whole number, such as 50 (no quotes, no fraction), or "
                                "leave it out for its default");
            free(got);
        } else if ((rc = svc_check_range("page_size", json_integer_value(ps), 1, KILN_PAGE_SIZE_MAX, &err)) == 0) {
            f.page_size = (int)json_integer_value(ps);
            f.page_size_set = true;
        }
    }
    json_decref(body);
    if (rc)
        return http_reply_err(r, &err);
    rc = svc_job_list(r->h->svc, &r->who, &f, &out, &err);
    if (rc)
        return http_svc_err(r, rc, &err);
    return http_reply_json(r, MHD_HTTP_OK, out);
}

static enum MHD_Result http_job_get(http_req_t *r)
{
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
    if (svc_check_time_text("since", http_arg(r, "since"), &q.since_us, &err))
        return http_reply_err(r, &err);
    q.rank = (int)rank;
    q.after_seq = after_seq;
    q.limit = (int)limit;
    if (follow) {
        /* A reconnecting EventSource sends the last id it saw. */
        const char *last = http_header(r, "Last-Event-ID");
        if (last && !strcmp(last, "end")) {
            /* An EventSource reconnecting after `event: end` (its id is "end"): the stream is
             * over, and 204 No Content is what tells EventSource to stop reconnecting. */
            json_t *job = NULL;
            int rc = svc_job_get(r->h->svc, &r->who, r->id, &job, &err);
            json_decref(job);
            if (rc)
                return http_svc_err(r, rc, &err);
            return http_reply_status(r, MHD_HTTP_NO_CONTENT);
        }
        if (last && *last) {
            int64_t x = 0;
            if (svc_check_int_text("Last-Event-ID", last, 0, INT64_MAX, &x, &err))
                return http_reply_err(r, &err);
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
    kiln_err_t err;
    kiln_err_clear(&err);
    svc_metrics_query_t q = {0};
    int64_t max_points = 0;
    if (http_arg_int(r, "max_points", INT32_MIN, INT32_MAX, &max_points, &q.max_points_set, &err) ||
        http_arg_int(r, "start_step", INT64_MIN, INT64_MAX, &q.start_step, NULL, &err) ||
        http_arg_int(r, "end_step", INT64_MIN, INT64_MAX, &q.end_step, NULL, &err))
        return http_reply_err(r, &err);
    q.max_points = (int)max_points;
    q.name = http_arg(r, "name");
    if (q.name && !*q.name)
        q.name = NULL;
    /* attempt: a number, "latest" (per step the latest attempt's point) or "all" (the default) */
    const char *attempt = http_arg(r, "attempt");
    if (attempt && !strcmp(attempt, "latest")) {
        q.attempt = -1;
    } else if (attempt && *attempt && strcmp(attempt, "all") != 0) {
        int64_t a = 0;
        if (svc_check_int_text("attempt", attempt, 1, INT32_MAX, &a, &err)) {
            kiln_err_hint(&err, "attempt is an attempt number (1, 2, ...), \"latest\" or \"all\"");
            return http_reply_err(r, &err);
        }
        q.attempt = (int)a;
    }
    json_t *out = NULL;
    int rc = svc_job_metrics(r->h->svc, &r->who, r->id, &q, &out, &err);
    if (rc)
        return http_svc_err(r, rc, &err);
    return http_reply_json(r, MHD_HTTP_OK, out);
}

static enum MHD_Result http_job_delete(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *out = NULL;
    int rc = svc_job_delete(r->h->svc, &r->who, r->id, &out, &err);
    if (rc)
        return http_svc_err(r, rc, &err);
    return http_reply_json(r, MHD_HTTP_OK, out);
}

/* ---- artifacts ------------------------------------------------------------------------------- */

static enum MHD_Result http_artifacts_list(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *out = NULL;
    int rc = svc_job_artifacts(r->h->svc, &r->who, r->id, &out, &err);
    if (rc)
        return http_svc_err(r, rc, &err);
    return http_reply_json(r, MHD_HTTP_OK, out);
}

/* GET /v1/jobs/{id}/checkpoints: the job's checkpoint directory as kilnd last synced it. */
static enum MHD_Result http_checkpoints_list(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *out = NULL;
    int rc = svc_job_checkpoints(r->h->svc, &r->who, r->id, &out, &err);
    if (rc)
        return http_svc_err(r, rc, &err);
    return http_reply_json(r, MHD_HTTP_OK, out);
}

/* The file is streamed from disk by libmicrohttpd (never loaded into memory). */
enum MHD_Result http_reply_file(http_req_t *r, svc_artifact_file_t *fp, const char *content_type)
{
    svc_artifact_file_t f = *fp;
    kiln_err_t err;
    kiln_err_clear(&err);
    char etag[KILN_SHA256_HEX + 2], disp[KILN_ARTIFACT_NAME_MAX + 40], crange[96], last_mod[64];
    snprintf(etag, sizeof(etag), "\"%s\"", f.sha256);
    snprintf(disp, sizeof(disp), "attachment; filename=\"%s\"", f.name);
    time_t t = (time_t)(f.created_us / 1000000);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(last_mod, sizeof(last_mod), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    int64_t first = 0, last = f.size - 1;
    int status = MHD_HTTP_OK;
    const char *inm = http_header(r, MHD_HTTP_HEADER_IF_NONE_MATCH);
    const char *range = http_header(r, MHD_HTTP_HEADER_RANGE);
    const char *if_range = http_header(r, MHD_HTTP_HEADER_IF_RANGE);
    if (inm && (strstr(inm, etag) || !strcmp(inm, "*")))
        status = MHD_HTTP_NOT_MODIFIED;
    else if (range && (!if_range || !strcmp(if_range, etag))) {
        int pr = http_range_parse(range, f.size, &first, &last);
        if (pr < 0) {
            close(f.fd);
            kiln_err_set(&err, KILN_ERANGE, "Range", "range \"%.60s\" is not inside \"%s\" (%lld bytes)", range,
                         f.name, (long long)f.size);
            kiln_err_hint(&err, "ask for bytes=FIRST-LAST with FIRST below the size");
            snprintf(crange, sizeof(crange), "bytes */%lld", (long long)f.size);
            return http_reply_err_header(r, &err, MHD_HTTP_HEADER_CONTENT_RANGE, crange);
        }
        if (pr > 0)
            status = MHD_HTTP_PARTIAL_CONTENT;
    }
    struct MHD_Response *resp = NULL;
    uint64_t len = status == MHD_HTTP_NOT_MODIFIED ? 0 : (uint64_t)(last - first + 1);
    if (len == 0 || f.size == 0) {
        close(f.fd);
        resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
    } else {
        /* libmicrohttpd owns the descriptor from here and closes it with the response */
        resp = MHD_create_response_from_fd_at_offset64(len, f.fd, (uint64_t)first);
        if (!resp)
            close(f.fd);
        else if (strcmp(r->method, "HEAD") != 0)
            svc_artifact_served("rest", (int64_t)len);
    }
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ETAG, etag);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCEPT_RANGES, "bytes");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_LAST_MODIFIED, last_mod);
    if (status != MHD_HTTP_NOT_MODIFIED) {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_DISPOSITION, disp);
    }
    if (status == MHD_HTTP_PARTIAL_CONTENT) {
        snprintf(crange, sizeof(crange), "bytes %lld-%lld/%lld", (long long)first, (long long)last, (long long)f.size);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_RANGE, crange);
    }
    enum MHD_Result ret = http_reply_raw(r, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* GET /v1/jobs/{id}/artifacts/{name}: the file, with its SHA-256 as the ETag; a single byte Range
 * gives 206 (or 416). */
static enum MHD_Result http_artifact_get(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    svc_artifact_file_t f;
    int rc = svc_job_artifact_open(r->h->svc, &r->who, r->id, http_param(r, "name"), &f, &err);
    if (rc)
        return http_svc_err(r, rc, &err);
    return http_reply_file(r, &f, "application/octet-stream");
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
    return http_reply_json(r, MHD_HTTP_OK, json_pack("{s:s, s:s, s:b}", "status", "ok", "version", KILN_VERSION,
                                                     "leader", svc_is_leader(r->h->svc)));
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

/* GET /metrics: Prometheus text format. The process registry (REST and gRPC requests and
 * latencies, the service's counters and histograms, process_*, kiln_build_info), open live
 * streams, and the control plane's gauges from the database (svc_prom_write). When the database
 * cannot answer, the rest is still served and kiln_up{component="database"} says 0. */
static enum MHD_Result http_prometheus(http_req_t *r)
{
    api_http_t *h = r->h;
    prom_buf_t b = {0};
    prom_write(&b, "kilnd");
    pthread_mutex_lock(&h->streams_lock);
    int streams = h->nstreams;
    pthread_mutex_unlock(&h->streams_lock);
    prom_header(&b, "kiln_http_log_streams", "Open live log streams (Server-Sent Events).", PROM_GAUGE);
    prom_printf(&b, "kiln_http_log_streams %d\n", streams);
    kiln_err_t err;
    kiln_err_clear(&err);
    bool db = svc_prom_write(h->svc, &b, &err) == 0;
    prom_header(&b, "kiln_up", "Whether a component kilnd depends on answered this scrape.", PROM_GAUGE);
    prom_printf(&b, "kiln_up{component=\"database\"} %d\n", db ? 1 : 0);
    if (b.oom) {
        free(b.data);
        return MHD_NO;
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(b.len, b.data, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(b.data);
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
    static const char *const keys[] = {"name", "default_queue", NULL};
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *body = NULL, *out = NULL;
    const char *name = NULL, *default_queue = NULL;
    int rc = http_body_fields(r, false, keys, &body, &err);
    if (rc == 0)
        rc = http_field_str(body, "name", true, &name, &err);
    if (rc == 0)
        rc = http_field_str(body, "default_queue", false, &default_queue, &err);
    if (rc == 0)
        rc = svc_project_create(r->h->svc, &r->who, name, default_queue, &out, &err);
    json_decref(body);
    return http_reply_svc(r, rc, &err, MHD_HTTP_CREATED, out);
}

/* PATCH: the service checks the fields (the same as gRPC's UpdateProject). */
static enum MHD_Result http_project_update(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *body = NULL, *out = NULL;
    int rc = http_body_json(r, false, &body, &err);
    if (rc == 0)
        rc = svc_project_update(r->h->svc, &r->who, http_param(r, "project"), body, &out, &err);
    json_decref(body);
    return http_reply_svc(r, rc, &err, MHD_HTTP_OK, out);
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

/* ---- queues --------------------------------------------------------------------------------- */

static enum MHD_Result http_queues_list(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *out = NULL;
    int rc = svc_queues_list(r->h->svc, &r->who, &out, &err);
    return http_reply_svc(r, rc, &err, MHD_HTTP_OK, out);
}

static enum MHD_Result http_queue_get(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *out = NULL;
    int rc = svc_queue_get(r->h->svc, &r->who, http_param(r, "name"), &out, &err);
    return http_reply_svc(r, rc, &err, MHD_HTTP_OK, out);
}

/* POST and PATCH: the service checks every field (the same validator as gRPC's). */
static enum MHD_Result http_queue_write(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *body = NULL, *out = NULL;
    bool create = strcmp(r->method, "POST") == 0;
    int rc = http_body_json(r, false, &body, &err);
    if (rc == 0 && create)
        rc = svc_queue_create(r->h->svc, &r->who, body, &out, &err);
    else if (rc == 0)
        rc = svc_queue_update(r->h->svc, &r->who, http_param(r, "name"), body, &out, &err);
    json_decref(body);
    return http_reply_svc(r, rc, &err, create ? MHD_HTTP_CREATED : MHD_HTTP_OK, out);
}

static enum MHD_Result http_queue_delete(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = svc_queue_delete(r->h->svc, &r->who, http_param(r, "name"), &err);
    if (rc)
        return http_svc_err(r, rc, &err);
    return http_reply_json(r, MHD_HTTP_OK, json_pack("{s:s}", "name", http_param(r, "name")));
}

/* ---- tuning jobs ------------------------------------------------------------------------------ */

static enum MHD_Result http_tuning_create(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *body = NULL, *out = NULL;
    int rc = http_body_json(r, false, &body, &err);
    if (rc == 0)
        rc = svc_tuning_create(r->h->svc, &r->who, body, &out, &err);
    json_decref(body);
    return http_reply_svc(r, rc, &err, MHD_HTTP_CREATED, out);
}

/* GET /v1/tuning-jobs?page_size=N&page_token=T: page_size and page_token read as GET /v1/jobs
 * reads them (the service checks them, as for gRPC's ListTuningJobs). */
static enum MHD_Result http_tuning_list(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *out = NULL;
    svc_page_t page = {0};
    if (http_page_args(r, &page.page_size, &page.page_size_set, &page.page_token, &err))
        return http_reply_err(r, &err);
    int rc = svc_tuning_list(r->h->svc, &r->who, &page, &out, &err);
    return http_reply_svc(r, rc, &err, MHD_HTTP_OK, out);
}

static enum MHD_Result http_tuning_get(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *out = NULL;
    int rc = svc_tuning_get(r->h->svc, &r->who, http_param(r, "id"), &out, &err);
    return http_reply_svc(r, rc, &err, MHD_HTTP_OK, out);
}

static enum MHD_Result http_tuning_stop(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *body = NULL, *out = NULL;
    int rc = http_body_json(r, true, &body, &err);
    if (rc)
        return http_reply_err(r, &err);
    if (body && json_object_size(body) > 0) {
        json_decref(body);
        return http_reply_errf(r, KILN_EINVAL, "", "send {} or no body", "a stop request takes no fields");
    }
    json_decref(body);
    rc = svc_tuning_stop(r->h->svc, &r->who, http_param(r, "id"), &out, &err);
    return http_reply_svc(r, rc, &err, MHD_HTTP_OK, out);
}

/* ---- what agents are trusted with: join tokens, approval, removal, bans ---------------------- */

static enum MHD_Result http_join_tokens_create(http_req_t *r)
{
    static const char *const keys[] = {"uses", "expires_in", "description", NULL};
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *body = NULL, *out = NULL;
    const char *expires_in = NULL, *desc = NULL;
    int64_t uses = 0;
    bool has_uses = false;
    int rc = http_body_fields(r, true, keys, &body, &err);
    if (rc == 0)
        rc = http_field_str(body, "expires_in", false, &expires_in, &err);
    if (rc == 0)
        rc = http_field_str(body, "description", false, &desc, &err);
    json_t *u = json_object_get(body, "uses");
    if (rc == 0 && u && !json_is_null(u)) {
        if (!json_is_integer(u))
            rc = kiln_err_set(&err, KILN_EINVAL, "uses", "uses must be a whole number of registrations");
        uses = json_integer_value(u);
        has_uses = true;
    }
    if (rc == 0)
        rc = svc_join_token_create(r->h->svc, &r->who, has_uses ? &uses : NULL, expires_in, desc, &out, &err);
    json_decref(body);
    return http_reply_svc(r, rc, &err, MHD_HTTP_CREATED, out);
}

static enum MHD_Result http_join_tokens_list(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *out = NULL;
    int rc = svc_join_tokens_list(r->h->svc, &r->who, &out, &err);
    return http_reply_svc(r, rc, &err, MHD_HTTP_OK, out);
}

static enum MHD_Result http_join_token_revoke(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *out = NULL;
    int rc = svc_join_token_revoke(r->h->svc, &r->who, r->id, &out, &err);
    return http_reply_svc(r, rc, &err, MHD_HTTP_OK, out);
}

static enum MHD_Result http_worker_approve(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *body = NULL, *out = NULL;
    int rc = http_body_json(r, true, &body, &err);
    if (rc == 0 && json_object_size(body) > 0) {
        rc = kiln_err_set(&err, KILN_EINVAL, json_object_iter_key(json_object_iter(body)), "unknown field \"%.60s\"",
                          json_object_iter_key(json_object_iter(body)));
        kiln_err_hint(&err, "this request takes no fields: send {} or nothing");
    }
    json_decref(body);
    if (rc == 0)
        rc = svc_worker_approve(r->h->svc, &r->who, r->id, &out, &err);
    return http_reply_svc(r, rc, &err, MHD_HTTP_OK, out);
}

static enum MHD_Result http_worker_remove(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *out = NULL;
    bool ban = false;
    int rc = http_arg_bool(r, "ban", &ban, &err);
    if (rc == 0)
        rc = svc_worker_remove(r->h->svc, &r->who, r->id, ban, http_arg(r, "reason"), &out, &err);
    return http_reply_svc(r, rc, &err, MHD_HTTP_OK, out);
}

static enum MHD_Result http_worker_bans_list(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *out = NULL;
    int rc = svc_worker_bans_list(r->h->svc, &r->who, &out, &err);
    return http_reply_svc(r, rc, &err, MHD_HTTP_OK, out);
}

static enum MHD_Result http_worker_ban_delete(http_req_t *r)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    json_t *out = NULL;
    int rc = svc_worker_ban_delete(r->h->svc, &r->who, r->id, &out, &err);
    return http_reply_svc(r, rc, &err, MHD_HTTP_OK, out);
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

/* The query parameters of the routes that take any (the router refuses every other). */
static const char *const k_jobs_list_args[] = {"status", "tag", "filter", "order_by", "columns", "page_size",
                                               "page_token", NULL};
static const char *const k_logs_args[] = {"rank", "after_seq", "limit", "follow", "since", NULL};
static const char *const k_metrics_args[] = {"name", "max_points", "attempt", "start_step", "end_step", NULL};
static const char *const k_code_args[] = {"project", NULL};
static const char *const k_worker_remove_args[] = {"ban", "reason", NULL};
static const char *const k_page_args[] = {"page_size", "page_token", NULL};

const http_route_t http_routes[] = {
    {"GET", "/v1/jobs", http_jobs_list, 0, k_jobs_list_args},
    {"POST", "/v1/jobs", http_jobs_create, 0, NULL},
    {"POST", "/v1/jobs:search", http_jobs_search, 0, NULL},
    {"GET", "/v1/jobs/{id}", http_job_get, 0, NULL},
    {"DELETE", "/v1/jobs/{id}", http_job_delete, 0, NULL},
    {"POST", "/v1/jobs/{id}:stop", http_job_stop, 0, NULL},
    {"GET", "/v1/jobs/{id}/events", http_job_events, 0, NULL},
    {"GET", "/v1/jobs/{id}/logs", http_job_logs, 0, k_logs_args},
    {"GET", "/v1/jobs/{id}/metrics", http_job_metrics, 0, k_metrics_args},
    {"GET", "/v1/jobs/{id}/artifacts", http_artifacts_list, 0, NULL},
    {"GET", "/v1/jobs/{id}/artifacts/{name}", http_artifact_get, 0, NULL},
    {"GET", "/v1/jobs/{id}/checkpoints", http_checkpoints_list, 0, NULL},
    {"POST", "/v1/code", http_code_upload, HTTP_STREAM, k_code_args},
    {"GET", "/v1/code/{digest}", http_code_get, 0, k_code_args},
    {"GET", "/v1/workers", http_workers, 0, NULL},
    {"POST", "/v1/workers/{id}:approve", http_worker_approve, 0, NULL},
    {"DELETE", "/v1/workers/{id}", http_worker_remove, 0, k_worker_remove_args},
    {"GET", "/v1/worker-bans", http_worker_bans_list, 0, NULL},
    {"DELETE", "/v1/worker-bans/{id}", http_worker_ban_delete, 0, NULL},
    {"GET", "/v1/join-tokens", http_join_tokens_list, 0, NULL},
    {"POST", "/v1/join-tokens", http_join_tokens_create, 0, NULL},
    {"DELETE", "/v1/join-tokens/{id}", http_join_token_revoke, 0, NULL},
    {"GET", "/v1/whoami", http_whoami, 0, NULL},
    {"GET", "/v1/users", http_users_list, 0, NULL},
    {"POST", "/v1/users", http_users_create, 0, NULL},
    {"GET", "/v1/users/{name}/tokens", http_tokens_list, 0, NULL},
    {"POST", "/v1/users/{name}/tokens", http_tokens_create, 0, NULL},
    {"DELETE", "/v1/tokens/{id}", http_token_revoke, 0, NULL},
    {"GET", "/v1/projects", http_projects_list, 0, NULL},
    {"POST", "/v1/projects", http_projects_create, 0, NULL},
    {"PATCH", "/v1/projects/{project}", http_project_update, 0, NULL},
    {"GET", "/v1/projects/{project}/members", http_members_list, 0, NULL},
    {"PUT", "/v1/projects/{project}/members/{user}", http_member_set, 0, NULL},
    {"DELETE", "/v1/projects/{project}/members/{user}", http_member_remove, 0, NULL},
    {"GET", "/v1/queues", http_queues_list, 0, NULL},
    {"POST", "/v1/queues", http_queue_write, 0, NULL},
    {"GET", "/v1/queues/{name}", http_queue_get, 0, NULL},
    {"PATCH", "/v1/queues/{name}", http_queue_write, 0, NULL},
    {"DELETE", "/v1/queues/{name}", http_queue_delete, 0, NULL},
    {"GET", "/v1/tuning-jobs", http_tuning_list, 0, k_page_args},
    {"POST", "/v1/tuning-jobs", http_tuning_create, 0, NULL},
    {"GET", "/v1/tuning-jobs/{id}", http_tuning_get, 0, NULL},
    {"POST", "/v1/tuning-jobs/{id}:stop", http_tuning_stop, 0, NULL},
    {"POST", "/v1/login-links", http_login_link_create, 0, NULL},
    {"POST", "/v1/login-links:redeem", http_login_link_redeem, HTTP_OPEN, NULL},
    {"GET", "/", http_ui_index, HTTP_OPEN | HTTP_PAGE, NULL},
    {"GET", "/ui", http_ui_index, HTTP_OPEN | HTTP_PAGE, NULL},
    {"GET", "/ui/{asset}", http_ui_asset, HTTP_OPEN | HTTP_PAGE, NULL},
    {"GET", "/healthz", http_healthz, HTTP_OPEN, NULL},
    {"GET", "/readyz", http_readyz, HTTP_OPEN, NULL},
    {"GET", "/metrics", http_prometheus, HTTP_PROM, NULL},
};
const size_t http_route_count = KILN_ARRAY_LEN(http_routes);
