/* http.c - the CLI's REST client over httpc/ (kiln's HTTP client, which the daemons' --health
 * probe uses too): one-shot JSON requests, Server-Sent Events streams, downloads, query
 * building and job-id resolution. It knows kilnd's URL layout and error shape
 * (docs/contracts.md), nothing about how replies are shown. */
#include "cli/cli_int.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "httpc/httpc.h"

void cli_client_init(cli_client_t *c, const cli_settings_t *s)
{
    memset(c, 0, sizeof(*c));
    c->settings = *s;
    c->timeout_ms = 30000;
}

const char *cli_jstr(const json_t *obj, const char *key)
{
    const char *s = json_string_value(json_object_get(obj, key));
    return s ? s : "";
}

double cli_jnum(const json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

const char *cli_jint_text(const json_t *obj, const char *key, const char *dflt, char *buf, size_t n)
{
    json_t *v = json_object_get(obj, key);
    if (json_is_integer(v))
        snprintf(buf, n, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v))
        snprintf(buf, n, "%.0f", json_real_value(v));
    else
        snprintf(buf, n, "%s", dflt);
    return buf;
}

int64_t cli_jtime(const json_t *obj, const char *key)
{
    int64_t us = 0;
    const char *s = json_string_value(json_object_get(obj, key));
    if (!s || kiln_time_parse(s, &us) != 0)
        return 0;
    return us;
}

/* A request to kilnd and what it owns. */
typedef struct cli_req {
    httpc_req_t r;
    char *url;
    const char **headers; /* (NULL-terminated) the fixed lines, then the caller's */
} cli_req_t;

/* A request to kilnd at path: the settings' URL, token and CA (the token goes to that URL only:
 * httpc follows no redirect), the header lines accept and content_type (each may be NULL), then
 * headers (may be NULL). Release with cli_req_deinit whatever it returns. */
static int cli_req_init(cli_req_t *q, const cli_client_t *c, const char *path, const char *accept,
                        const char *content_type, const char *const *headers, kiln_err_t *err)
{
    memset(q, 0, sizeof(*q));
    size_t n = strlen(c->settings.url) + strlen(path) + 1, nh = 0, k = 0;
    while (headers && headers[nh])
        nh++;
    q->url = malloc(n);
    q->headers = calloc(nh + 3, sizeof(*q->headers));
    if (!q->url || !q->headers)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    snprintf(q->url, n, "%s%s", c->settings.url, path);
    if (accept)
        q->headers[k++] = accept;
    if (content_type)
        q->headers[k++] = content_type;
    for (size_t i = 0; i < nh; i++)
        q->headers[k++] = headers[i];
    q->r.url = q->url;
    q->r.headers = q->headers;
    q->r.token = c->settings.token;
    q->r.ca_file = c->settings.ca_file;
    q->r.user_agent = "kiln/" CLI_VERSION;
    q->r.connect_timeout_ms = 5000;
    return 0;
}

static void cli_req_deinit(cli_req_t *q)
{
    free(q->url);
    free(q->headers);
}

static int cli_connect_error(const cli_client_t *c, httpc_end_t end, const httpc_res_t *res, kiln_err_t *err)
{
    if (end == HTTPC_NOMEM)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    if (end == HTTPC_TIMEOUT)
        return kiln_err_set(err, KILN_ETIMEDOUT, NULL, "request to kilnd at %s timed out: %s", c->settings.url,
                            res->error);
    return kiln_err_set(err, KILN_EUNAVAIL, NULL,
                        "could not connect to kilnd at %s: %s (is kilnd running? set KILN_URL)", c->settings.url,
                        res->error);
}

static int cli_request_core(const cli_client_t *c, const char *method, const char *path, const json_t *body,
                            FILE *upload, int64_t upload_len, const char *const *headers, long *http_status,
                            json_t **out, kiln_err_t *err);

int cli_request(const cli_client_t *c, const char *method, const char *path, const json_t *body,
                const char *const *headers, long *http_status, json_t **out, kiln_err_t *err)
{
    return cli_request_core(c, method, path, body, NULL, 0, headers, http_status, out, err);
}

int cli_upload(const cli_client_t *c, const char *path, FILE *in, int64_t len, const char *content_type,
               long *http_status, json_t **out, kiln_err_t *err)
{
    char ct[128];
    snprintf(ct, sizeof(ct), "Content-Type: %s", content_type);
    const char *headers[] = {ct, NULL};
    return cli_request_core(c, "POST", path, NULL, in, len, headers, http_status, out, err);
}

static int cli_request_core(const cli_client_t *c, const char *method, const char *path, const json_t *body,
                            FILE *upload, int64_t upload_len, const char *const *headers, long *http_status,
                            json_t **out, kiln_err_t *err)
{
    int rc = 0;
    char *body_text = NULL;
    cli_req_t q;
    httpc_res_t res;
    memset(&res, 0, sizeof res);

    *out = NULL;
    if ((rc = cli_req_init(&q, c, path, "Accept: application/json", body ? "Content-Type: application/json" : NULL,
                           headers, err)))
        goto fail;
    if (body) {
        body_text = json_dumps(body, JSON_COMPACT | JSON_REAL_PRECISION(17));
        if (!body_text) {
            rc = kiln_err_set(err, KILN_ENOMEM, NULL, "could not encode the request body");
            goto fail;
        }
        q.r.body = body_text;
        q.r.body_len = strlen(body_text);
    }
    q.r.method = method;
    q.r.timeout_ms = c->timeout_ms;
    if (upload) {
        /* a file streamed as the body, as long as it takes; a stalled transfer is given up */
        q.r.upload = upload;
        q.r.upload_len = upload_len;
        q.r.timeout_ms = 0;
        q.r.low_speed_s = 60;
    }
    httpc_end_t end = httpc_perform(&q.r, &res);
    if (end != HTTPC_OK) {
        rc = cli_connect_error(c, end, &res, err);
        goto fail;
    }
    if (http_status)
        *http_status = res.status;
    if (res.status < 200 || res.status > 299) {
        rc = cli_error_from_reply((int)res.status, res.body, err);
        goto fail;
    }
    json_error_t jerr;
    *out = res.len ? json_loads(res.body, 0, &jerr) : NULL;
    if (!*out) {
        if (res.len) {
            rc = kiln_err_set(err, KILN_EFORMAT, NULL, "kilnd sent a reply that is not JSON: %s", jerr.text);
            goto fail;
        }
        *out = json_object();
    }

fail:
    httpc_res_deinit(&res);
    free(body_text);
    cli_req_deinit(&q);
    return rc;
}

/* ---- SSE stream --------------------------------------------------------------------------- */

static int cli_stream_sink(void *ud, const char *data, size_t n)
{
    return cli_sse_feed(ud, data, n) != 0; /* stop: the callback ended it (sse->stopped) */
}

int cli_stream(const cli_client_t *c, const char *path, const char *const *headers, cli_sse_t *sse,
               long low_speed_s, kiln_err_t *err)
{
    int rc = 0;
    cli_req_t q;
    httpc_res_t res;
    memset(&res, 0, sizeof res);

    if ((rc = cli_req_init(&q, c, path, "Accept: text/event-stream", NULL, headers, err)))
        goto fail;
    q.r.low_speed_s = low_speed_s > 0 ? low_speed_s : 60;
    q.r.sink = cli_stream_sink;
    q.r.ud = sse;
    httpc_end_t end = httpc_perform(&q.r, &res);
    if (res.status != 0 && res.status != 200) {
        rc = cli_error_from_reply((int)res.status, res.body, err);
        goto fail;
    }
    if (sse->stopped)
        goto fail; /* rc 0: the callback ended it */
    if (end == HTTPC_NOMEM)
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    else if (end == HTTPC_CONNECT)
        rc = kiln_err_set(err, KILN_ECOMM, NULL, "could not connect to kilnd at %s: %s (is kilnd running? set KILN_URL)",
                          c->settings.url, res.error);
    else if (end != HTTPC_OK)
        rc = kiln_err_set(err, KILN_ECOMM, NULL, "log stream from %s dropped: %s", c->settings.url, res.error);

fail:
    httpc_res_deinit(&res);
    cli_req_deinit(&q);
    return rc;
}

/* ---- downloads ---------------------------------------------------------------------------- */

typedef struct cli_dl {
    FILE *out;
    kiln_sha256_t *sha;
    int64_t bytes;
    bool write_failed;
    char *etag;
} cli_dl_t;

static int cli_dl_sink(void *ud, const char *data, size_t len)
{
    cli_dl_t *d = ud;
    if (fwrite(data, 1, len, d->out) != len) {
        d->write_failed = true;
        return -1;
    }
    kiln_sha256_update(d->sha, data, len);
    d->bytes += (int64_t)len;
    return 0;
}

static void cli_dl_header(void *ud, const char *data, size_t len)
{
    cli_dl_t *d = ud;
    if (len > 5 && !strncasecmp(data, "ETag:", 5)) {
        const char *v = data + 5, *e = data + len;
        while (v < e && (*v == ' ' || *v == '"'))
            v++;
        size_t vl = 0;
        while (v + vl < e && v[vl] != '"' && v[vl] != '\r' && v[vl] != '\n')
            vl++;
        snprintf(d->etag, 80, "%.*s", (int)KILN_MIN(vl, 79), v);
    }
}

int cli_download(const cli_client_t *c, const char *path, FILE *out, kiln_sha256_t *sha, int64_t *bytes,
                 char *etag, kiln_err_t *err)
{
    int rc = 0;
    cli_dl_t d = {.out = out, .sha = sha, .etag = etag};
    cli_req_t q;
    httpc_res_t res;
    memset(&res, 0, sizeof res);
    etag[0] = '\0';
    *bytes = 0;
    if ((rc = cli_req_init(&q, c, path, NULL, NULL, NULL, err)))
        goto fail;
    /* a big file takes as long as it takes; a stalled one is given up after a minute */
    q.r.low_speed_s = 60;
    q.r.sink = cli_dl_sink;
    q.r.on_header = cli_dl_header;
    q.r.ud = &d;
    httpc_end_t end = httpc_perform(&q.r, &res);
    if (d.write_failed) {
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not write the download: %s", strerror(errno));
        goto fail;
    }
    if (res.status != 0 && res.status != 200) {
        rc = cli_error_from_reply((int)res.status, res.body, err);
        goto fail;
    }
    if (end != HTTPC_OK) {
        rc = res.status == 0 ? cli_connect_error(c, end, &res, err)
                             : kiln_err_set(err, KILN_ECOMM, NULL, "the download from %s broke off: %s",
                                            c->settings.url, res.error);
        goto fail;
    }
    *bytes = d.bytes;
fail:
    httpc_res_deinit(&res);
    cli_req_deinit(&q);
    return rc;
}

/* ---- paths and ids ------------------------------------------------------------------------ */

int cli_collect_pages(const cli_client_t *c, cli_page_fn fetch, void *ud, const char *key, long page_size, long limit,
                      bool all, json_t **out, bool *more, kiln_err_t *err)
{
    json_t *acc = json_array();
    char *token = NULL;
    int rc = 0;
    *more = false;
    *out = NULL;
    for (;;) {
        long want = all ? page_size : KILN_MIN(page_size, limit - (long)json_array_size(acc));
        json_t *page = NULL;
        if ((rc = fetch(c, want, token, ud, &page, err)) != 0)
            break;
        json_array_extend(acc, json_object_get(page, key));
        const char *next = cli_jstr(page, "next_page_token");
        free(token);
        token = *next ? strdup(next) : NULL;
        json_decref(page);
        if (!token)
            break;
        if (!all && (long)json_array_size(acc) >= limit) {
            *more = true;
            break;
        }
    }
    free(token);
    if (rc) {
        json_decref(acc);
        return rc;
    }
    if (!all && (long)json_array_size(acc) > limit) {
        *more = true;
        while ((long)json_array_size(acc) > limit)
            json_array_remove(acc, json_array_size(acc) - 1);
    }
    *out = acc;
    return 0;
}

int cli_path_add(char **path, const char *key, const char *value)
{
    char *esc = httpc_escape(value);
    if (!esc)
        return KILN_ENOMEM;
    size_t n = strlen(*path) + strlen(key) + strlen(esc) + 3;
    char *np = realloc(*path, n);
    if (!np) {
        free(esc);
        return KILN_ENOMEM;
    }
    strcat(np, strchr(np, '?') ? "&" : "?");
    strcat(np, key);
    strcat(np, "=");
    strcat(np, esc);
    free(esc);
    *path = np;
    return 0;
}

int cli_path_segment(const char *cmd, const char *s, char *out, size_t n)
{
    out[0] = '\0';
    if (!*s)
        return cli_usage_error(cmd, "an empty argument names nothing");
    if (!strcmp(s, ".") || !strcmp(s, ".."))
        return cli_usage_error(cmd, "\"%s\" names nothing", s);
    char *esc = httpc_escape(s);
    if (!esc) {
        fprintf(stderr, "kiln %s: out of memory\n", cmd);
        return CLI_EXIT_ERROR;
    }
    bool fits = strlen(esc) < n;
    if (fits)
        memcpy(out, esc, strlen(esc) + 1);
    free(esc);
    if (!fits)
        return cli_usage_error(cmd, "an argument of %zu characters is too long to name anything", strlen(s));
    return 0;
}

bool cli_id_shaped(const char *s)
{
    static const char layout[] = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
    size_t n = strlen(s);
    if (n == 0 || n > 36)
        return false;
    for (size_t i = 0; i < n; i++)
        if (layout[i] == '-' ? s[i] != '-' : !isxdigit((unsigned char)s[i]))
            return false;
    return true;
}

int cli_resolve_job(const cli_client_t *c, const char *ref, char *out, kiln_err_t *err)
{
    if (!*ref)
        return kiln_err_set(err, KILN_EINVAL, NULL, "empty job id");
    int rc = 0;
    json_t *page = NULL;
    char path[256];
    /* An id or a prefix of one (kilnd takes 4 characters or more): kilnd resolves it, as every
     * job route does. Hex digits and dashes are a path segment as they are. */
    if (cli_id_shaped(ref) && strlen(ref) >= 4) {
        snprintf(path, sizeof path, "/v1/jobs/%s", ref);
        kiln_err_t e2;
        kiln_err_clear(&e2);
        rc = cli_request(c, "GET", path, NULL, NULL, NULL, &page, &e2);
        if (rc == 0) {
            kiln_strlcpy(out, cli_jstr(page, "id"), 64);
            json_decref(page);
            return 0;
        }
        if (rc != KILN_ENOTFOUND || strlen(ref) == 36) {
            *err = e2; /* a whole id kilnd does not know is not a name either */
            return rc;
        }
        /* not the id of a job: perhaps a name */
    }
    /* A name: scan the job list (newest first), a bounded number of pages. */
    int name_matches = 0;
    char name_match[64] = "", candidates[256] = "";
    size_t cand_len = 0;
    char *token = strdup("");
    for (int pages = 0; token && pages < 40; pages++) {
        char *p = strdup("/v1/jobs?page_size=" KILN_PAGE_SIZE_MAX_TEXT);
        if (!p || (*token && cli_path_add(&p, "page_token", token) != 0)) {
            free(p);
            rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
            goto done;
        }
        rc = cli_request(c, "GET", p, NULL, NULL, NULL, &page, err);
        free(p);
        if (rc != 0)
            goto done;
        size_t i;
        json_t *job;
        json_array_foreach(json_object_get(page, "jobs"), i, job) {
            if (!strcmp(cli_jstr(job, "name"), ref)) {
                name_matches++;
                kiln_strlcpy(name_match, cli_jstr(job, "id"), sizeof(name_match));
                if (name_matches <= 5 && cand_len < sizeof(candidates))
                    cand_len += (size_t)snprintf(candidates + cand_len, sizeof(candidates) - cand_len, "%s%.8s (%s)",
                                                 name_matches > 1 ? ", " : "", name_match, cli_jstr(job, "state"));
            }
        }
        free(token);
        const char *next = cli_jstr(page, "next_page_token");
        token = *next ? strdup(next) : NULL;
        json_decref(page);
        page = NULL;
    }
    if (name_matches == 1) {
        kiln_strlcpy(out, name_match, 64);
    } else if (name_matches > 1) {
        rc = kiln_err_set(err, KILN_EINVAL, NULL, "%d jobs are named \"%s\"", name_matches, ref);
        kiln_err_detail(err, "newest first: %s%s", candidates, name_matches > 5 ? ", ..." : "");
        kiln_err_hint(err, "use the job id, or a prefix of it only that job has (kiln jobs lists them)");
    } else {
        rc = kiln_err_set(err, KILN_ENOTFOUND, NULL, "no job matches \"%s\"", ref);
        kiln_err_hint(err, "kiln jobs --all lists every job");
    }

done:
    free(token);
    json_decref(page);
    return rc;
}
