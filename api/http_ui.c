/* http_ui.c - serves the web UI's assets (ui/, built and embedded at build time into
 * http_ui_assets[]) at / and /ui/{asset}: the right Content-Type, ETag and 304, caching for a
 * year of the assets whose names carry their hash, gzip when the browser takes it, and a strict
 * Content-Security-Policy (scripts, styles and API calls from kilnd's own origin only, no
 * inline code, no framing). Not the UI itself: that is ui/src. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api/http_int.h"

#define HTTP_UI_CSP                                                                                \
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "       \
    "connect-src 'self'; font-src 'self'; manifest-src 'self'; base-uri 'none'; "                 \
    "form-action 'none'; frame-ancestors 'none'"

static const http_ui_asset_t *http_ui_find(const char *name)
{
    for (size_t i = 0; i < http_ui_asset_count; i++)
        if (!strcmp(http_ui_assets[i].name, name))
            return &http_ui_assets[i];
    return NULL;
}

/* Whether the Accept-Encoding header takes gzip: "gzip" (or "*") with a q above 0. */
static bool http_ui_takes_gzip(http_req_t *r)
{
    const char *p = http_header(r, MHD_HTTP_HEADER_ACCEPT_ENCODING);
    if (!p)
        return false;
    while (*p) {
        while (*p == ' ' || *p == ',')
            p++;
        const char *tok = p;
        while (*p && *p != ',' && *p != ';' && *p != ' ')
            p++;
        size_t n = (size_t)(p - tok);
        double q = 1;
        while (*p && *p != ',') {
            if (*p++ != ';')
                continue;
            while (*p == ' ')
                p++;
            if (p[0] == 'q' && p[1] == '=')
                q = strtod(p + 2, NULL);
        }
        if (((n == 4 && !strncasecmp(tok, "gzip", 4)) || (n == 1 && *tok == '*')))
            return q > 0;
    }
    return false;
}

/* Whether If-None-Match names etag (or is "*"). */
static bool http_ui_not_modified(http_req_t *r, const char *etag)
{
    const char *inm = http_header(r, MHD_HTTP_HEADER_IF_NONE_MATCH);
    if (!inm)
        return false;
    if (!strcmp(inm, "*"))
        return true;
    size_t n = strlen(etag);
    for (const char *p = inm; (p = strstr(p, etag)) != NULL; p += n)
        if ((p == inm || p[-1] == ' ' || p[-1] == ',' || (p >= inm + 2 && !strncmp(p - 2, "W/", 2))) &&
            (p[n] == '\0' || p[n] == ',' || p[n] == ' '))
            return true;
    return false;
}

static enum MHD_Result http_ui_send(http_req_t *r, const http_ui_asset_t *a)
{
    bool gz = a->gz && http_ui_takes_gzip(r);
    /* The gzipped bytes are another representation: another tag. */
    char etag[96];
    if (gz)
        snprintf(etag, sizeof etag, "%.*s-gz\"", (int)strlen(a->etag) - 1, a->etag);
    else
        snprintf(etag, sizeof etag, "%s", a->etag);
    bool fresh = http_ui_not_modified(r, etag);
    struct MHD_Response *resp =
        fresh ? MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT)
              : MHD_create_response_from_buffer(gz ? a->gz_len : a->len, (void *)(gz ? a->gz : a->data),
                                                MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    if (!fresh) {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, a->content_type);
        if (gz)
            MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_ENCODING, "gzip");
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ETAG, etag);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_VARY, "Accept-Encoding");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL,
                            a->immutable ? "public, max-age=31536000, immutable" : "no-cache");
    MHD_add_response_header(resp, "Content-Security-Policy", HTTP_UI_CSP);
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, "X-Frame-Options", "DENY");
    MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(resp, "Cross-Origin-Opener-Policy", "same-origin");
    enum MHD_Result ret = http_reply_raw(r, fresh ? MHD_HTTP_NOT_MODIFIED : MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ret;
}

enum MHD_Result http_ui_index(http_req_t *r)
{
    const http_ui_asset_t *a = http_ui_find("index.html");
    if (!a)
        return http_reply_errf(r, KILN_ENOTFOUND, NULL, "the API paths are under /v1/ (see api/openapi.yaml)",
                               "this kilnd was built without its web UI");
    return http_ui_send(r, a);
}

enum MHD_Result http_ui_asset(http_req_t *r)
{
    const char *name = http_param(r, "asset");
    const http_ui_asset_t *a = name ? http_ui_find(name) : NULL;
    if (!a)
        return http_reply_errf(r, KILN_ENOTFOUND, "asset", "the page at / names the assets of this kilnd's build",
                               "no web UI asset \"%.80s\"", name ? name : "");
    return http_ui_send(r, a);
}
