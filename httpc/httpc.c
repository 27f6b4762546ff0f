/* httpc.c - one HTTP request over libcurl's easy interface (see httpc.h): the handle's options
 * from the request, the reply into a buffer or a sink, and how it ended. */
#include "httpc/httpc.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void global_init(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

typedef struct ctx {
    CURL *h;
    const httpc_req_t *req;
    httpc_res_t *res;
    bool got_status, stopped, nomem;
} ctx_t;

static int collect(httpc_res_t *res, const char *data, size_t n)
{
    char *p = realloc(res->body, res->len + n + 1);
    if (!p)
        return -1;
    memcpy(p + res->len, data, n);
    res->body = p;
    res->len += n;
    p[res->len] = '\0';
    return 0;
}

static size_t on_write(char *data, size_t size, size_t nmemb, void *ud)
{
    ctx_t *c = ud;
    size_t n = size * nmemb;
    if (!c->got_status) {
        curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &c->res->status);
        c->got_status = true;
    }
    if (c->req->sink && c->res->status == 200) {
        if (c->req->sink(c->req->ud, data, n) != 0) {
            c->stopped = true;
            return 0; /* libcurl ends the transfer with a write error */
        }
        return n;
    }
    if (collect(c->res, data, n) != 0) {
        c->nomem = true;
        return 0;
    }
    return n;
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *ud)
{
    ctx_t *c = ud;
    c->req->on_header(c->req->ud, data, size * nmemb);
    return size * nmemb;
}

/* Reads an upload's next bytes from its stream. */
static size_t on_read(char *buf, size_t size, size_t nmemb, void *ud)
{
    return fread(buf, 1, size * nmemb, (FILE *)ud);
}

static httpc_end_t end_of(CURLcode rc, long status)
{
    switch (rc) {
    case CURLE_OK:
        return HTTPC_OK;
    case CURLE_OUT_OF_MEMORY:
        return HTTPC_NOMEM;
    case CURLE_OPERATION_TIMEDOUT:
        return HTTPC_TIMEOUT;
    default:
        return status == 0 ? HTTPC_CONNECT : HTTPC_BROKEN;
    }
}

httpc_end_t httpc_perform(const httpc_req_t *req, httpc_res_t *res)
{
    memset(res, 0, sizeof(*res));
    pthread_once(&g_once, global_init);
    ctx_t c = {.req = req, .res = res};
    struct curl_slist *hl = NULL;
    char *auth = NULL;
    httpc_end_t end = HTTPC_NOMEM;
    const char *method = req->method ? req->method : "GET";
    if (!(c.h = curl_easy_init()))
        goto fail;
    for (size_t i = 0; req->headers && req->headers[i]; i++) {
        struct curl_slist *nl = curl_slist_append(hl, req->headers[i]);
        if (!nl)
            goto fail;
        hl = nl;
    }
    if (req->token && *req->token) {
        size_t n = strlen(req->token) + 32;
        if (!(auth = malloc(n)))
            goto fail;
        snprintf(auth, n, "Authorization: Bearer %s", req->token);
        struct curl_slist *nl = curl_slist_append(hl, auth);
        if (!nl)
            goto fail;
        hl = nl;
    }
    curl_easy_setopt(c.h, CURLOPT_URL, req->url);
    curl_easy_setopt(c.h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c.h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c.h, CURLOPT_NOSIGNAL, 1L);
    if (strcmp(method, "GET") != 0)
        curl_easy_setopt(c.h, CURLOPT_CUSTOMREQUEST, method);
    if (hl)
        curl_easy_setopt(c.h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c.h, CURLOPT_ERRORBUFFER, res->error);
    if (req->user_agent)
        curl_easy_setopt(c.h, CURLOPT_USERAGENT, req->user_agent);
    if (req->timeout_ms > 0)
        curl_easy_setopt(c.h, CURLOPT_TIMEOUT_MS, req->timeout_ms);
    if (req->connect_timeout_ms > 0)
        curl_easy_setopt(c.h, CURLOPT_CONNECTTIMEOUT_MS, req->connect_timeout_ms);
    if (req->low_speed_s > 0) {
        curl_easy_setopt(c.h, CURLOPT_LOW_SPEED_LIMIT, 1L);
        curl_easy_setopt(c.h, CURLOPT_LOW_SPEED_TIME, req->low_speed_s);
    }
    if (req->no_verify) {
        curl_easy_setopt(c.h, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(c.h, CURLOPT_SSL_VERIFYHOST, 0L);
    } else if (req->ca_file && *req->ca_file) {
        curl_easy_setopt(c.h, CURLOPT_CAINFO, req->ca_file);
    }
    if (req->upload) {
        curl_easy_setopt(c.h, CURLOPT_POST, 1L);
        curl_easy_setopt(c.h, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(c.h, CURLOPT_READDATA, req->upload);
        curl_easy_setopt(c.h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->upload_len);
    } else if (req->body) {
        curl_easy_setopt(c.h, CURLOPT_POSTFIELDS, req->body);
        curl_easy_setopt(c.h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
    } else if (!strcmp(method, "POST")) {
        curl_easy_setopt(c.h, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(c.h, CURLOPT_POSTFIELDSIZE, 0L);
    }
    curl_easy_setopt(c.h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(c.h, CURLOPT_WRITEDATA, &c);
    if (req->on_header) {
        curl_easy_setopt(c.h, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(c.h, CURLOPT_HEADERDATA, &c);
    }
    CURLcode rc = curl_easy_perform(c.h);
    if (!c.got_status)
        curl_easy_getinfo(c.h, CURLINFO_RESPONSE_CODE, &res->status);
    if (rc != CURLE_OK && !res->error[0])
        snprintf(res->error, sizeof res->error, "%s", curl_easy_strerror(rc));
    end = c.nomem ? HTTPC_NOMEM : c.stopped ? HTTPC_STOPPED : end_of(rc, res->status);
fail:
    if (end == HTTPC_NOMEM && !res->error[0])
        snprintf(res->error, sizeof res->error, "out of memory");
    free(auth);
    curl_slist_free_all(hl);
    if (c.h)
        curl_easy_cleanup(c.h);
    return end;
}

void httpc_res_deinit(httpc_res_t *res)
{
    if (!res)
        return;
    free(res->body);
    res->body = NULL;
    res->len = 0;
}

char *httpc_escape(const char *s)
{
    pthread_once(&g_once, global_init);
    char *e = curl_easy_escape(NULL, s, 0);
    char *out = e ? strdup(e) : NULL;
    curl_free(e);
    return out;
}
