/* http.c - the CLI's REST client over libcurl: one-shot JSON requests, Server-Sent Events
 * streams, query building and job-id resolution. It knows kilnd's URL layout and error shape
 * (docs/contracts.md), nothing about how replies are shown. */
#include "cli/cli_int.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void cli_client_init(cli_client_t *c, const cli_settings_t *s)
{
    memset(c, 0, sizeof(*c));
    c->settings = *s;
    c->timeout_ms = 30000;
}

/* What every request to kilnd carries: the token and, for https, the CA to verify it against.
 * auth (caller's storage, >= 600 bytes) holds the header line while the request runs. */
static struct curl_slist *cli_curl_auth(const cli_client_t *c, CURL *h, struct curl_slist *hl, char *auth)
{
    if (c->settings.ca_file[0])
        curl_easy_setopt(h, CURLOPT_CAINFO, c->settings.ca_file);
    if (c->settings.token[0]) {
        snprintf(auth, 600, "Authorization: Bearer %s", c->settings.token);
        hl = curl_slist_append(hl, auth);
    }
    return hl;
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

int64_t cli_jtime(const json_t *obj, const char *key)
{
    int64_t us = 0;
    const char *s = json_string_value(json_object_get(obj, key));
    if (!s || kiln_time_parse(s, &us) != 0)
        return 0;
    return us;
}

typedef struct cli_buf {
    char *p;
    size_t n;
} cli_buf_t;

static size_t cli_buf_write(char *data, size_t size, size_t nmemb, void *ud)
{
    cli_buf_t *b = ud;
    size_t len = size * nmemb;
    char *np = realloc(b->p, b->n + len + 1);
    if (!np)
        return 0;
    b->p = np;
    memcpy(b->p + b->n, data, len);
    b->n += len;
    b->p[b->n] = '\0';
    return len;
}

static void cli_curl_global(void)
{
    static bool done;
    if (!done) {
        curl_global_init(CURL_GLOBAL_DEFAULT);
        done = true;
    }
}

static int cli_connect_error(const cli_client_t *c, CURLcode rc, const char *errbuf, kiln_err_t *err)
{
    const char *why = errbuf && *errbuf ? errbuf : curl_easy_strerror(rc);
    if (rc == CURLE_OPERATION_TIMEDOUT)
        return kiln_err_set(err, KILN_ETIMEDOUT, NULL, "request to kilnd at %s timed out: %s", c->settings.url, why);
    return kiln_err_set(err, KILN_EUNAVAIL, NULL,
                        "could not connect to kilnd at %s: %s (is kilnd running? set KILN_URL)", c->settings.url, why);
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

static size_t cli_upload_read(char *buf, size_t size, size_t nmemb, void *ud)
{
    return fread(buf, 1, size * nmemb, (FILE *)ud);
}

static int cli_request_core(const cli_client_t *c, const char *method, const char *path, const json_t *body,
                            FILE *upload, int64_t upload_len, const char *const *headers, long *http_status,
                            json_t **out, kiln_err_t *err)
{
    int rc = 0;
    CURL *h = NULL;
    struct curl_slist *hl = NULL;
    char *body_text = NULL, *url = NULL;
    cli_buf_t b = {NULL, 0};
    char errbuf[CURL_ERROR_SIZE] = "", auth[600];
    long status = 0;

    *out = NULL;
    cli_curl_global();
    h = curl_easy_init();
    url = malloc(strlen(c->settings.url) + strlen(path) + 1);
    if (!h || !url) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto fail;
    }
    strcpy(url, c->settings.url);
    strcat(url, path);
    hl = curl_slist_append(hl, "Accept: application/json");
    hl = cli_curl_auth(c, h, hl, auth);
    if (body) {
        body_text = json_dumps(body, JSON_COMPACT | JSON_REAL_PRECISION(17));
        if (!body_text) {
            rc = kiln_err_set(err, KILN_ENOMEM, NULL, "could not encode the request body");
            goto fail;
        }
        hl = curl_slist_append(hl, "Content-Type: application/json");
    }
    for (size_t i = 0; headers && headers[i]; i++)
        hl = curl_slist_append(hl, headers[i]);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "kiln/" CLI_VERSION);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, c->timeout_ms);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, cli_buf_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    if (upload) {
        /* a file streamed as the body, as long as it takes; a stalled transfer is given up */
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, cli_upload_read);
        curl_easy_setopt(h, CURLOPT_READDATA, upload);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)upload_len);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 0L);
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
    } else if (body_text) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body_text);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body_text));
    } else if (!strcmp(method, "POST")) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, 0L);
    }
    CURLcode cr = curl_easy_perform(h);
    if (cr != CURLE_OK) {
        rc = cli_connect_error(c, cr, errbuf, err);
        goto fail;
    }
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (http_status)
        *http_status = status;
    if (status < 200 || status > 299) {
        rc = cli_error_from_reply((int)status, b.p, err);
        goto fail;
    }
    json_error_t jerr;
    *out = b.n ? json_loads(b.p, 0, &jerr) : NULL;
    if (!*out) {
        if (b.n) {
            rc = kiln_err_set(err, KILN_EFORMAT, NULL, "kilnd sent a reply that is not JSON: %s", jerr.text);
            goto fail;
        }
        *out = json_object();
    }

fail:
    free(b.p);
    free(body_text);
    free(url);
    curl_slist_free_all(hl);
    if (h)
        curl_easy_cleanup(h);
    return rc;
}

/* ---- SSE stream --------------------------------------------------------------------------- */

typedef struct cli_stream_ctx {
    CURL *h;
    cli_sse_t *sse;
    long status;
    cli_buf_t errbody;   /* body of a non-200 reply */
    bool got_status;
} cli_stream_ctx_t;

static size_t cli_stream_write(char *data, size_t size, size_t nmemb, void *ud)
{
    cli_stream_ctx_t *s = ud;
    size_t len = size * nmemb;
    if (!s->got_status) {
        curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &s->status);
        s->got_status = true;
    }
    if (s->status != 200)
        return cli_buf_write(data, size, nmemb, &s->errbody);
    if (cli_sse_feed(s->sse, data, len) != 0)
        return 0; /* stop: curl reports a write error, which we recognise by sse->stopped */
    return len;
}

int cli_stream(const cli_client_t *c, const char *path, const char *const *headers, cli_sse_t *sse,
               long low_speed_s, kiln_err_t *err)
{
    int rc = 0;
    struct curl_slist *hl = NULL;
    char *url = NULL;
    char errbuf[CURL_ERROR_SIZE] = "", auth[600];
    cli_stream_ctx_t s = {0};

    cli_curl_global();
    s.sse = sse;
    s.h = curl_easy_init();
    url = malloc(strlen(c->settings.url) + strlen(path) + 1);
    if (!s.h || !url) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto fail;
    }
    strcpy(url, c->settings.url);
    strcat(url, path);
    hl = curl_slist_append(hl, "Accept: text/event-stream");
    hl = cli_curl_auth(c, s.h, hl, auth);
    for (size_t i = 0; headers && headers[i]; i++)
        hl = curl_slist_append(hl, headers[i]);
    curl_easy_setopt(s.h, CURLOPT_URL, url);
    curl_easy_setopt(s.h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(s.h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(s.h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(s.h, CURLOPT_USERAGENT, "kiln/" CLI_VERSION);
    curl_easy_setopt(s.h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(s.h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(s.h, CURLOPT_LOW_SPEED_TIME, low_speed_s > 0 ? low_speed_s : 60L);
    curl_easy_setopt(s.h, CURLOPT_WRITEFUNCTION, cli_stream_write);
    curl_easy_setopt(s.h, CURLOPT_WRITEDATA, &s);
    CURLcode cr = curl_easy_perform(s.h);
    if (!s.got_status)
        curl_easy_getinfo(s.h, CURLINFO_RESPONSE_CODE, &s.status);
    if (s.status != 0 && s.status != 200) {
        rc = cli_error_from_reply((int)s.status, s.errbody.p, err);
        goto fail;
    }
    if (sse->stopped)
        goto fail; /* rc 0: the callback ended it */
    if (cr != CURLE_OK) {
        const char *why = *errbuf ? errbuf : curl_easy_strerror(cr);
        if (s.status == 0 && cr == CURLE_COULDNT_CONNECT)
            rc = kiln_err_set(err, KILN_ECOMM, NULL,
                              "could not connect to kilnd at %s: %s (is kilnd running? set KILN_URL)", c->settings.url, why);
        else
            rc = kiln_err_set(err, KILN_ECOMM, NULL, "log stream from %s dropped: %s", c->settings.url, why);
    }

fail:
    free(s.errbody.p);
    free(url);
    curl_slist_free_all(hl);
    if (s.h)
        curl_easy_cleanup(s.h);
    return rc;
}

/* ---- downloads ---------------------------------------------------------------------------- */

typedef struct cli_dl {
    CURL *h;
    FILE *out;
    kiln_sha256_t *sha;
    int64_t bytes;
    long status;
    bool got_status, write_failed;
    cli_buf_t errbody;
    char *etag;
} cli_dl_t;

static size_t cli_dl_write(char *data, size_t size, size_t nmemb, void *ud)
{
    cli_dl_t *d = ud;
    size_t len = size * nmemb;
    if (!d->got_status) {
        curl_easy_getinfo(d->h, CURLINFO_RESPONSE_CODE, &d->status);
        d->got_status = true;
    }
    if (d->status != 200)
        return cli_buf_write(data, size, nmemb, &d->errbody);
    if (fwrite(data, 1, len, d->out) != len) {
        d->write_failed = true;
        return 0;
    }
    kiln_sha256_update(d->sha, data, len);
    d->bytes += (int64_t)len;
    return len;
}

static size_t cli_dl_header(char *data, size_t size, size_t nmemb, void *ud)
{
    cli_dl_t *d = ud;
    size_t len = size * nmemb;
    if (len > 5 && !strncasecmp(data, "ETag:", 5)) {
        const char *v = data + 5;
        while (*v == ' ' || *v == '"')
            v++;
        size_t vl = strcspn(v, "\"\r\n");
        snprintf(d->etag, 80, "%.*s", (int)KILN_MIN(vl, 79), v);
    }
    return len;
}

int cli_download(const cli_client_t *c, const char *path, FILE *out, kiln_sha256_t *sha, int64_t *bytes,
                 char *etag, kiln_err_t *err)
{
    int rc = 0;
    struct curl_slist *hl = NULL;
    char *url = NULL;
    char errbuf[CURL_ERROR_SIZE] = "", auth[600];
    cli_dl_t d = {.out = out, .sha = sha, .etag = etag};
    etag[0] = '\0';
    *bytes = 0;
    cli_curl_global();
    d.h = curl_easy_init();
    url = malloc(strlen(c->settings.url) + strlen(path) + 1);
    if (!d.h || !url) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto fail;
    }
    strcpy(url, c->settings.url);
    strcat(url, path);
    hl = cli_curl_auth(c, d.h, hl, auth);
    curl_easy_setopt(d.h, CURLOPT_URL, url);
    curl_easy_setopt(d.h, CURLOPT_NOSIGNAL, 1L);
    if (hl)
        curl_easy_setopt(d.h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(d.h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(d.h, CURLOPT_USERAGENT, "kiln/" CLI_VERSION);
    curl_easy_setopt(d.h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    /* a big file takes as long as it takes; a stalled one is given up after a minute */
    curl_easy_setopt(d.h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(d.h, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(d.h, CURLOPT_WRITEFUNCTION, cli_dl_write);
    curl_easy_setopt(d.h, CURLOPT_WRITEDATA, &d);
    curl_easy_setopt(d.h, CURLOPT_HEADERFUNCTION, cli_dl_header);
    curl_easy_setopt(d.h, CURLOPT_HEADERDATA, &d);
    CURLcode cr = curl_easy_perform(d.h);
    if (!d.got_status)
        curl_easy_getinfo(d.h, CURLINFO_RESPONSE_CODE, &d.status);
    if (d.write_failed) {
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not write the download: %s", strerror(errno));
        goto fail;
    }
    if (d.status != 0 && d.status != 200) {
        rc = cli_error_from_reply((int)d.status, d.errbody.p, err);
        goto fail;
    }
    if (cr != CURLE_OK) {
        rc = d.status == 0 ? cli_connect_error(c, cr, errbuf, err)
                           : kiln_err_set(err, KILN_ECOMM, NULL, "the download from %s broke off: %s", c->settings.url,
                                          *errbuf ? errbuf : curl_easy_strerror(cr));
        goto fail;
    }
    *bytes = d.bytes;
fail:
    free(d.errbody.p);
    free(url);
    curl_slist_free_all(hl);
    if (d.h)
        curl_easy_cleanup(d.h);
    return rc;
}

/* ---- paths and ids ------------------------------------------------------------------------ */

int cli_collect_jobs(const cli_client_t *c, cli_jobs_page_fn fetch, void *ud, long page_size, long limit, bool all,
                     json_t **out, bool *more, kiln_err_t *err)
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
        json_array_extend(acc, json_object_get(page, "jobs"));
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
    char *esc = curl_easy_escape(NULL, value, 0);
    if (!esc)
        return KILN_ENOMEM;
    size_t n = strlen(*path) + strlen(key) + strlen(esc) + 3;
    char *np = realloc(*path, n);
    if (!np) {
        curl_free(esc);
        return KILN_ENOMEM;
    }
    strcat(np, strchr(np, '?') ? "&" : "?");
    strcat(np, key);
    strcat(np, "=");
    strcat(np, esc);
    curl_free(esc);
    *path = np;
    return 0;
}

char *cli_path_segment(const char *s, char *out, size_t n)
{
    char *esc = curl_easy_escape(NULL, s, 0);
    if (!esc || strlen(esc) >= n)
        snprintf(out, n, "%s", "");
    else
        snprintf(out, n, "%s", esc);
    curl_free(esc);
    return out;
}

/* Whether s could be (a prefix of) a job id: hex digits and dashes where a UUID has them. */
static bool cli_id_shaped(const char *s)
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
    char path[256], esc[160];
    /* An id or a prefix of one (kilnd takes 4 characters or more): kilnd resolves it, as every
     * job route does. */
    if (cli_id_shaped(ref) && strlen(ref) >= 4) {
        snprintf(path, sizeof path, "/v1/jobs/%s", cli_path_segment(ref, esc, sizeof esc));
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
    char name_match[64] = "";
    char *token = strdup("");
    for (int pages = 0; token && pages < 40; pages++) {
        char *p = strdup("/v1/jobs?page_size=500");
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
        kiln_err_hint(err, "use the job id (kiln jobs lists them)");
    } else {
        rc = kiln_err_set(err, KILN_ENOTFOUND, NULL, "no job matches \"%s\"", ref);
        kiln_err_hint(err, "kiln jobs --all lists every job");
    }

done:
    free(token);
    json_decref(page);
    return rc;
}
