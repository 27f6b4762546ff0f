/* spec_int.h - what spec.c (the spec, its engine sections, the reading helpers) and script.c
 * (script jobs and the SageMaker names) share. Nothing outside spec/ includes this header.
 * The reading helpers keep their short names inside the module; the linker sees them as
 * spec_rd_* (the defines below). */
#ifndef KILN_SPEC_INT_H
#define KILN_SPEC_INT_H

#include "spec/spec.h"

/* Where a reader is: its error and the dotted path of the object it reads ("" for the top). */
typedef struct rd {
    kiln_err_t *err;
    const char *section; /* "" for top level, else "model", "distribution.data_parallel", ... */
} rd_t;

#define rd_fail spec_rd_fail
#define rd_known_keys spec_rd_known_keys
#define rd_object spec_rd_object
#define rd_int64 spec_rd_int64
#define rd_int spec_rd_int
#define rd_bool spec_rd_bool
#define rd_string spec_rd_string
#define invalid spec_invalid
#define normalize_path spec_normalize_path

/* KILN_EINVAL naming section.key: fmt has two %s, the path and what. */
int rd_fail(const rd_t *r, const char *key, const char *fmt, const char *what);
/* Refuses a key of obj that is not in allowed (NULL-terminated), with a "did you mean". */
int rd_known_keys(const rd_t *r, const json_t *obj, const char *const allowed[]);
/* obj.key as an object (absent or null: *out NULL), or a refusal. */
int rd_object(const rd_t *r, const json_t *obj, const char *key, const json_t **out);
/* obj.key as an integer in [lo, hi] (absent or null: *out unchanged), or a refusal. */
int rd_int64(const rd_t *r, const json_t *obj, const char *key, int64_t *out, int64_t lo, int64_t hi);
int rd_int(const rd_t *r, const json_t *obj, const char *key, int *out, int lo, int hi);
int rd_bool(const rd_t *r, const json_t *obj, const char *key, bool *out);
/* obj.key as a string of fewer than n bytes (absent or null: out unchanged), or a refusal. */
int rd_string(const rd_t *r, const json_t *obj, const char *key, char *out, size_t n);
/* KILN_EINVAL with field, hint (may be NULL) and a formatted message. */
int invalid(kiln_err_t *err, const char *field, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* An absolute path in buf (size n) in its lexical normal form; relative ones are left alone. */
int normalize_path(char *buf, size_t n, const char *field, kiln_err_t *err);

/* A path a spec reads (data.train, a channel): a "file://" prefix is removed (what is left must be
 * absolute), any other URL scheme is refused, and an absolute path is normalised. buf has
 * SPEC_PATH bytes; field names it in messages. */
int spec_input_path(char *buf, const char *field, kiln_err_t *err);

/* Before anything is read: SageMaker's names become kiln's in in (a copy the caller owns), so
 * that the readers see one spelling: metric_definitions' "Name" and "Regex" become "name" and
 * "regex"; for an engine job, data.validation becomes data.val and data.channels's train and val
 * (or validation) become data.train and data.val. Refuses a name given in both spellings. */
int spec_aliases(json_t *in, kiln_err_t *err);

/* An engine job may not use a script job's fields (source, python, environment,
 * distribution.torch_distributed): each is refused saying so. */
int spec_engine_no_script_fields(const json_t *in, kiln_err_t *err);

/* A script job's sections: entry_point, source, python, free-form hyperparameters, data.channels,
 * environment, distribution.torch_distributed, and what of checkpoint it may set. res is the
 * resources object as given (slots_per_node may come from torch_distributed). Runs after
 * resources were read and before the shared sections (parse_rest). */
int spec_script_parse(const json_t *in, spec_t *s, kiln_err_t *err);

/* The normalised JSON of a script job (spec_to_json for spec_is_script). */
json_t *spec_script_to_json(const spec_t *s, json_t *res, json_t *ck, json_t *defs, json_t *stopping, json_t *tags);

#endif /* KILN_SPEC_INT_H */
