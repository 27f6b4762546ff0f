/* spec_tuning.c - fuzz target: a tuning job request as REST's POST /v1/tuning-jobs receives it
 * (jansson, duplicate keys refused), then the one tuning validator (spec_tuning_parse). A refusal
 * is a client error with a message; an accepted request's normalised form parses (and loads, as
 * kilnd reads a stored one) to the same form, and the job of a trial at each parameter's first
 * value or lower end passes spec_parse. */
#include "fuzz/fuzz_spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t jerr;
    json_t *j = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &jerr);
    if (!j)
        return 0;
    spec_tuning_t t, again;
    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = spec_tuning_parse(j, &t, &err);
    json_decref(j);
    if (rc) {
        fuzz_check_client_error(rc, &err);
        return 0;
    }
    json_t *norm = spec_tuning_to_json(&t);
    FUZZ_CHECK(norm);
    rc = spec_tuning_parse(norm, &again, &err);
    if (rc)
        fprintf(stderr, "fuzz: the normalised tuning job is refused: %s: %s\n", err.field, err.message);
    FUZZ_CHECK(rc == 0);
    json_t *norm2 = spec_tuning_to_json(&again);
    FUZZ_CHECK(norm2 && json_equal(norm, norm2));
    json_decref(norm2);
    spec_tuning_deinit(&again);
    /* read back as kilnd reads its stored requests (spec_tuning_load): the same form */
    rc = spec_tuning_load(norm, &again, &err);
    FUZZ_CHECK(rc == 0);
    norm2 = spec_tuning_to_json(&again);
    FUZZ_CHECK(norm2 && json_equal(norm, norm2));
    json_decref(norm2);
    spec_tuning_deinit(&again);
    json_decref(norm);
    /* a trial at each parameter's first value (categorical) or lower end (ranges) */
    json_t *values = json_object(), *tags = json_object();
    FUZZ_CHECK(values && tags);
    for (int i = 0; i < t.nparams; i++) {
        const spec_tune_param_t *p = &t.params[i];
        json_object_set_new(values, p->name, p->type == SPEC_TUNE_CATEGORICAL ? json_incref(json_array_get(p->values, 0))
                                             : p->type == SPEC_TUNE_INTEGER   ? json_integer((json_int_t)p->min)
                                                                              : json_real(p->min));
    }
    json_t *trial = spec_tuning_trial_spec(&t, values, "trial-0", tags);
    FUZZ_CHECK(trial);
    spec_t sp;
    rc = spec_parse(trial, &sp, &err);
    if (rc)
        fprintf(stderr, "fuzz: a trial's job is refused: %s: %s\n", err.field, err.message);
    FUZZ_CHECK(rc == 0);
    spec_deinit(&sp);
    json_decref(trial);
    json_decref(values);
    json_decref(tags);
    spec_tuning_deinit(&t);
    return 0;
}
