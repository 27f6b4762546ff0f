/* spec_json.c - fuzz target: a job spec as REST's POST /v1/jobs receives it, the request body
 * parsed as http_body_json does (jansson, duplicate keys refused, an object), then the one
 * validator (fuzz_spec.h says what is checked). */
#include "fuzz/fuzz_spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t jerr;
    json_t *j = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &jerr);
    if (!j)
        return 0;
    if (json_is_object(j))
        fuzz_spec_check(j);
    json_decref(j);
    return 0;
}
