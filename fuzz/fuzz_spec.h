/* fuzz_spec.h - what both job-spec targets (spec_json: the REST body, spec_grpc: the gRPC
 * message) check once they hold the spec as JSON: the one validator (spec_parse) either refuses
 * it as a client error, or accepts it, and then the normalised spec kilnd stores parses again to
 * the same spec, as kiln-train and the agents read it later. */
#ifndef KILN_FUZZ_SPEC_H
#define KILN_FUZZ_SPEC_H

#include "fuzz/fuzz.h"
#include "spec/spec.h"

/* An error a client caused: a 4xx status with a message. */
static inline void fuzz_check_client_error(int rc, const kiln_err_t *err)
{
    FUZZ_CHECK(rc != 0 && err->status == rc);
    int http = kiln_status_http(rc);
    FUZZ_CHECK(http >= 400 && http < 500);
    FUZZ_CHECK(err->message[0] != '\0');
}

static inline void fuzz_spec_check(const json_t *j)
{
    spec_t sp, again;
    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = spec_parse(j, &sp, &err);
    if (rc) {
        fuzz_check_client_error(rc, &err);
        return;
    }
    /* spec.h: spec_to_json then spec_parse gives back an equal spec */
    json_t *norm = spec_to_json(&sp);
    FUZZ_CHECK(norm);
    rc = spec_parse(norm, &again, &err);
    if (rc)
        fprintf(stderr, "fuzz: the normalised spec is refused: %s: %s\n", err.field, err.message);
    FUZZ_CHECK(rc == 0);
    json_t *norm2 = spec_to_json(&again);
    FUZZ_CHECK(norm2 && json_equal(norm, norm2));
    json_decref(norm2);
    spec_deinit(&again);
    /* what svc_job_create stores (15 significant digits) and kiln-train parses from text */
    char *text = json_dumps(norm, JSON_COMPACT | SPEC_JSON_REALS);
    FUZZ_CHECK(text);
    rc = spec_parse_string(text, &again, &err);
    if (rc)
        fprintf(stderr, "fuzz: the stored spec is refused: %s: %s\n", err.field, err.message);
    FUZZ_CHECK(rc == 0);
    spec_deinit(&again);
    free(text);
    json_decref(norm);
    FUZZ_CHECK(spec_world_size(&sp) >= 1 && spec_dp_replicas(&sp) >= 1);
    spec_deinit(&sp);
}

#endif /* KILN_FUZZ_SPEC_H */
