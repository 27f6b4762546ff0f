/* page_token.c - the page tokens of job listings and searches, and of the other paged lists (tuning
 * jobs): base64url (no padding) of {"v": 1, "h": "<fingerprint of the search or list>", "c": <the
 * store's cursor>}, opaque to clients. Decoding is the first thing done with a token a client
 * sends back; the cursor inside is then checked by the store (store_search_cursor_ok,
 * store_tuning_cursor_ok). Pure: no database. */
#include "service/svc_int.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* FNV-1a over parts[0..n), each ended by a 0xff byte (no text holds one) */
static uint64_t fingerprint(const char *const *parts, int n)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) {
        for (const char *p = parts[i] ? parts[i] : ""; *p; p++)
            h = (h ^ (uint8_t)*p) * 1099511628211ull;
        h = (h ^ 0xff) * 1099511628211ull;
    }
    return h;
}

uint64_t svc_search_fingerprint(const svc_job_filter_t *f)
{
    const char *parts[4] = {f->filter, f->order_by, f->status, f->tag};
    return fingerprint(parts, 4);
}

uint64_t svc_list_fingerprint(const char *list)
{
    const char *parts[2] = {"list", list};
    return fingerprint(parts, 2);
}

char *svc_page_token_encode(const json_t *cursor, uint64_t fp)
{
    char h[20];
    snprintf(h, sizeof h, "%016llx", (unsigned long long)fp);
    json_t *t = json_pack("{s:i, s:s, s:O}", "v", 1, "h", h, "c", cursor);
    char *text = t ? json_dumps(t, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(t);
    if (!text)
        return NULL;
    size_t n = strlen(text);
    size_t cap = sodium_base64_ENCODED_LEN(n, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    char *b64 = malloc(cap);
    if (b64)
        sodium_bin2base64(b64, cap, (const unsigned char *)text, n, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    free(text);
    return b64;
}

static int bad_token(kiln_err_t *err, const char *why)
{
    kiln_err_set(err, KILN_EINVAL, "page_token", "%s", why);
    kiln_err_hint(err, "pass next_page_token from the previous page of the same list unchanged (and a search's same "
                       "filter and order_by)");
    return KILN_EINVAL;
}

int svc_page_token_decode(const char *tok, uint64_t fp, json_t **cursor, kiln_err_t *err)
{
    *cursor = NULL;
    size_t n = strlen(tok);
    if (n > 8192)
        return bad_token(err, "page token is too long");
    unsigned char *bin = malloc(n + 1);
    size_t len = 0;
    if (!bin)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    if (sodium_base642bin(bin, n, tok, n, NULL, &len, NULL, sodium_base64_VARIANT_URLSAFE_NO_PADDING) != 0) {
        free(bin);
        return bad_token(err, "malformed page token");
    }
    json_t *t = json_loadb((const char *)bin, len, 0, NULL);
    free(bin);
    char h[20];
    snprintf(h, sizeof h, "%016llx", (unsigned long long)fp);
    const char *th = json_string_value(json_object_get(t, "h"));
    json_t *c = json_object_get(t, "c");
    if (!t || json_integer_value(json_object_get(t, "v")) != 1 || !th || !json_is_object(c)) {
        json_decref(t);
        return bad_token(err, "malformed page token");
    }
    if (strcmp(th, h) != 0) {
        json_decref(t);
        return bad_token(err, "page token belongs to another search or list (a different filter or order_by, or "
                              "another resource)");
    }
    *cursor = json_incref(c);
    json_decref(t);
    return 0;
}
