/* page_token.c - fuzz target: a page token a client sends back with a job listing or search (or
 * the tuning job list), through what svc_job_list and the store do with it before any SQL: the order_by parsed
 * (query_order_parse), the token decoded for the search's fingerprint (svc_page_token_decode),
 * the cursor inside checked against the order (store_search_cursor_ok). Input: the order_by text,
 * a newline, then either the token (first byte of the input even) or the JSON inside a token
 * (odd), which the target base64url-encodes, so that mutations reach the cursor check too. */
#include <sodium.h>

#include "fuzz/fuzz.h"
#include "query/query.h"
#include "service/service.h"
#include "store/store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    bool wrap = data[0] & 1;
    char *text = fuzz_text(data + 1, size - 1);
    size_t tlen = size - 1;
    char *nl = memchr(text, '\n', tlen);
    if (!nl) {
        free(text);
        return 0;
    }
    *nl = '\0';
    const char *order_by = text, *rest = nl + 1;
    size_t rest_len = tlen - (size_t)(rest - text);
    char *b64 = NULL;
    if (wrap) {
        size_t cap = sodium_base64_ENCODED_LEN(rest_len, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
        b64 = malloc(cap);
        FUZZ_CHECK(b64);
        sodium_bin2base64(b64, cap, (const unsigned char *)rest, rest_len, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
        rest = b64;
    }

    arena_t a;
    arena_init(&a, 0);
    kiln_err_t err;
    kiln_err_clear(&err);
    query_order_t order;
    if (query_order_parse(order_by, &a, &order, &err) == 0) {
        svc_job_filter_t f = {.order_by = order_by};
        json_t *cursor = NULL;
        int rc = svc_page_token_decode(rest, svc_search_fingerprint(&f), &cursor, &err);
        if (rc) {
            FUZZ_CHECK(rc == KILN_EINVAL && !strcmp(err.field, "page_token") && !cursor);
        } else {
            FUZZ_CHECK(json_is_object(cursor));
            if (store_search_cursor_ok(&order, cursor)) {
                /* what the store builds the next page from: as many keys as the order has */
                query_order_t dflt;
                const query_order_t *o = store_search_order(&order, &dflt);
                FUZZ_CHECK(json_array_size(json_object_get(cursor, "k")) == (size_t)o->n);
                /* and a cursor the service hands out again round-trips */
                char *tok = svc_page_token_encode(cursor, svc_search_fingerprint(&f));
                json_t *back = NULL;
                FUZZ_CHECK(tok && svc_page_token_decode(tok, svc_search_fingerprint(&f), &back, &err) == 0);
                FUZZ_CHECK(json_equal(back, cursor));
                json_decref(back);
                free(tok);
            }
        }
        json_decref(cursor);
    }
    /* the same token as one of the tuning job list: its own fingerprint and cursor check */
    json_t *tcur = NULL;
    int trc = svc_page_token_decode(rest, svc_list_fingerprint("tuning-jobs"), &tcur, &err);
    if (trc) {
        FUZZ_CHECK(trc == KILN_EINVAL && !strcmp(err.field, "page_token") && !tcur);
    } else if (store_tuning_cursor_ok(tcur)) {
        FUZZ_CHECK(json_is_integer(json_object_get(tcur, "t")) &&
                   store_is_uuid(json_string_value(json_object_get(tcur, "id"))));
    }
    json_decref(tcur);
    arena_deinit(&a);
    free(b64);
    free(text);
    return 0;
}
