/* tuning.c - the tuning job request: parsing with defaults, validation that names the offending
 * field, the normalised form, and the job spec of one trial. Whether a parameter's values suit the
 * base job is asked of the job validator itself (spec_parse), by substituting them. It does not
 * sample or decide anything: that is service/tune_search.c's. */
#include "spec/spec_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_strategies[] = {"random", "grid", "hyperband", "bayesian", NULL};

static const char *const k_warm_types[] = {"identical_data_and_algorithm", "transfer_learning", NULL};

const char *spec_tune_strategy_name(spec_tune_strategy_t s)
{
    return s >= SPEC_TUNE_RANDOM && s <= SPEC_TUNE_BAYESIAN ? k_strategies[s - 1] : "";
}

const char *spec_warm_type_name(spec_warm_type_t w)
{
    return w >= SPEC_WARM_IDENTICAL && w <= SPEC_WARM_TRANSFER ? k_warm_types[w - 1] : "";
}

/* warm_start: {"parents": [ids], "type": ...} into t (the parents' own checks are the service's). */
static int parse_warm_start(spec_tuning_t *t, const json_t *ws, kiln_err_t *err)
{
    static const char *const keys[] = {"parents", "type", NULL};
    static const char *const hint = "give {\"parents\": [\"<tuning job id>\"], \"type\": "
                                    "\"identical_data_and_algorithm\" or \"transfer_learning\"}";
    rd_t r = {err, "warm_start"};
    int rc = rd_known_keys(&r, ws, keys);
    if (rc)
        return rc;
    const json_t *parents = json_object_get(ws, "parents");
    if (!json_is_array(parents) || json_array_size(parents) == 0 || json_array_size(parents) > SPEC_TUNE_MAX_PARENTS)
        return invalid(err, "warm_start.parents", hint, "warm_start.parents must be a list of 1 to %d tuning job ids",
                       SPEC_TUNE_MAX_PARENTS);
    size_t i;
    json_t *v;
    json_array_foreach(parents, i, v) {
        char f[48];
        snprintf(f, sizeof f, "warm_start.parents[%zu]", i);
        const char *id = json_string_value(v);
        bool uuid = id && strlen(id) == 36;
        for (int k = 0; uuid && k < 36; k++)
            uuid = (k == 8 || k == 13 || k == 18 || k == 23) ? id[k] == '-' : strchr("0123456789abcdefABCDEF", id[k]) != NULL;
        if (!uuid)
            return invalid(err, f, "give the id `kiln tune list` shows (GET /v1/tuning-jobs)",
                           "%s is not a tuning job id", f);
        char *dst = t->parents[t->nparents];
        for (int k = 0; k <= 36; k++)
            dst[k] = (char)(id[k] >= 'A' && id[k] <= 'F' ? id[k] - 'A' + 'a' : id[k]);
        for (int k = 0; k < t->nparents; k++)
            if (!strcmp(t->parents[k], dst))
                return invalid(err, f, "name each parent once", "%s repeats warm_start.parents[%d]", f, k);
        t->nparents++;
    }
    char type[40] = "";
    if ((rc = rd_string(&r, ws, "type", type, sizeof type)))
        return rc;
    for (int k = 0; k_warm_types[k]; k++)
        if (!strcmp(type, k_warm_types[k]))
            t->warm_type = (spec_warm_type_t)(k + 1);
    if (!t->warm_type)
        return invalid(err, "warm_start.type", "\"identical_data_and_algorithm\" (the same base job and parameter "
                       "names) or \"transfer_learning\" (parameters or the base job changed)",
                       "warm_start.type must be \"identical_data_and_algorithm\" or \"transfer_learning\"%s%s%s",
                       type[0] ? " (got \"" : "", type, type[0] ? "\")" : "");
    return 0;
}

void spec_tuning_deinit(spec_tuning_t *t)
{
    if (!t)
        return;
    json_decref(t->job);
    t->job = NULL;
    for (int i = 0; i < t->nparams; i++) {
        json_decref(t->params[i].values);
        t->params[i].values = NULL;
    }
    t->nparams = 0;
}

/* The member of obj at the dotted path; with create, missing objects on the way (and nothing at
 * the leaf) are made, and *parent / *leaf say where to set it. NULL when absent (or not an
 * object on the way). */
static json_t *path_walk(json_t *obj, const char *path, bool create, json_t **parent, char leaf[160])
{
    char buf[160];
    kiln_strlcpy(buf, path, sizeof buf);
    json_t *cur = obj;
    char *save = NULL;
    char *tok = strtok_r(buf, ".", &save);
    while (tok) {
        char *next = strtok_r(NULL, ".", &save);
        if (!json_is_object(cur))
            return NULL;
        json_t *child = json_object_get(cur, tok);
        if (!next) {
            if (parent)
                *parent = cur;
            if (leaf)
                kiln_strlcpy(leaf, tok, 160);
            return child;
        }
        if (!child && create) {
            child = json_object();
            json_object_set_new(cur, tok, child);
        }
        cur = child;
        tok = next;
    }
    return NULL;
}

/* Sets the job's value at path to v (v stays the caller's; the job takes a reference). Returns false when the
 * path cannot hold it. */
static bool path_set(json_t *job, const char *path, json_t *v, bool create)
{
    json_t *parent = NULL;
    char leaf[160] = "";
    json_t *cur = path_walk(job, path, create, &parent, leaf);
    if (!parent || !leaf[0] || (!cur && !create))
        return false;
    return json_object_set(parent, leaf, v) == 0;
}

/* Paths no trial may vary: what makes it a trial of this tuning job, and where it runs. */
static bool path_reserved(const char *path)
{
    static const char *const fixed[] = {"name", "project", "queue", "priority", "tags", "entry_point", "source",
                                        "retry", "metric_definitions", NULL};
    for (size_t i = 0; fixed[i]; i++) {
        size_t n = strlen(fixed[i]);
        if (!strncmp(path, fixed[i], n) && (path[n] == '\0' || path[n] == '.'))
            return true;
    }
    return false;
}

/* Whether the base job with v at p->path passes the job validator; err names the parameter's
 * field (what: "min", "max", "values[2]") and carries the validator's reason as its detail. */
static int try_value(const spec_tuning_t *t, const spec_tune_param_t *p, json_t *v, const char *what,
                     kiln_err_t *err)
{
    if (t->stored) /* tried when kilnd accepted it */
        return 0;
    json_t *job = json_deep_copy(t->job);
    if (!job)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    int rc = 0;
    if (t->strategy == SPEC_TUNE_HYPERBAND) {
        /* a trial trains with max_steps = max_resource and pauses at its rungs (as trial jobs are
         * made below): its values are checked against those steps, not the base job's max_steps */
        json_t *total = json_integer((json_int_t)t->max_resource), *rung = json_integer((json_int_t)t->min_resource);
        path_set(job, "hyperparameters.max_steps", total, false);
        path_set(job, "stopping.max_steps", rung, true);
        json_decref(total);
        json_decref(rung);
    }
    if (!path_set(job, p->path, v, t->script)) {
        rc = KILN_EINVAL;
        kiln_err_set(err, KILN_EINVAL, "parameters", "parameter \"%s\": the job spec has no field %s", p->name,
                     p->path);
    } else {
        spec_t sp;
        kiln_err_t e2;
        rc = spec_parse(job, &sp, &e2);
        if (rc == 0) {
            spec_deinit(&sp);
        } else if (rc == KILN_EINVAL) {
            char field[128], text[64];
            char *vs = json_dumps(v, JSON_ENCODE_ANY | JSON_REAL_PRECISION(10));
            snprintf(text, sizeof text, "%s", vs ? vs : "?");
            free(vs);
            snprintf(field, sizeof field, "parameters.%.80s.%s", p->name, what);
            kiln_err_set(err, KILN_EINVAL, field, "parameter \"%s\": the job would refuse %s = %s", p->name, p->path,
                         text);
            kiln_err_detail(err, "%s: %s", e2.field, e2.message);
            if (e2.hint[0])
                kiln_err_hint(err, "%s", e2.hint);
            else
                kiln_err_hint(err, "give parameter \"%s\" a range whose values the job accepts", p->name);
        } else {
            *err = e2;
        }
    }
    json_decref(job);
    return rc;
}

static int parse_param(spec_tuning_t *t, const char *name, const json_t *o, kiln_err_t *err)
{
    static const char *const keys[] = {"type", "min", "max", "scaling", "values", NULL};
    static const char *const types[] = {"integer", "continuous", "categorical", NULL};
    static const char *const scalings[] = {"linear", "log", "reverse_log", "auto", NULL};
    spec_tune_param_t *p = &t->params[t->nparams];
    memset(p, 0, sizeof *p);
    char section[160];
    snprintf(section, sizeof section, "parameters.%.120s", name);
    rd_t r = {err, section};
    if (!name[0] || strlen(name) >= sizeof p->name || strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.") != strlen(name)
        || name[0] == '.' || name[strlen(name) - 1] == '.' || strstr(name, ".."))
        return invalid(err, "parameters", "name a field of the job spec (\"lr\", \"hyperparameters.lr\", \"model.n_embd\")",
                       "parameter name \"%.100s\" is not a path in the job spec", name);
    kiln_strlcpy(p->name, name, sizeof p->name);
    snprintf(p->path, sizeof p->path, "%s%s", strchr(name, '.') ? "" : "hyperparameters.", name);
    if (!json_is_object(o))
        return invalid(err, section, "give {\"type\": \"continuous\", \"min\": ..., \"max\": ...}",
                       "%s must be an object", section);
    int rc = rd_known_keys(&r, o, keys);
    if (rc)
        return rc;
    if (path_reserved(p->path))
        return invalid(err, section, "vary hyperparameters, model or data fields",
                       "parameter \"%s\": a trial may not vary %s", name, p->path);
    if (t->strategy == SPEC_TUNE_HYPERBAND &&
        (!strcmp(p->path, "hyperparameters.max_steps") || !strcmp(p->path, "stopping.max_steps")))
        return invalid(err, section, "hyperband gives each trial its steps: set hyperband.min_resource and max_resource",
                       "parameter \"%s\": hyperband decides %s (a trial's rungs)", name, p->path);
    /* the base job must have the field; a script job's hyperparameters are free-form */
    bool free_form = t->script && !strncmp(p->path, "hyperparameters.", 16);
    json_t *base = path_walk(t->job, p->path, false, NULL, NULL);
    if (!free_form && (!base || json_is_object(base) || json_is_array(base)))
        return invalid(err, section,
                       t->script ? "a script job's search varies its hyperparameters: name one bare (\"lr\") or "
                                   "below hyperparameters (\"hyperparameters.model.depth\" makes nested objects)"
                                 : "name a field the job spec has, such as lr, warmup_steps or model.n_embd",
                       "parameter \"%s\": the job spec has no field %s", name, p->path);
    char type[16] = "";
    if ((rc = rd_string(&r, o, "type", type, sizeof type)))
        return rc;
    char type_field[sizeof section + 8];
    snprintf(type_field, sizeof type_field, "%s.type", section);
    if (!type[0])
        return invalid(err, type_field, "\"type\": \"integer\", \"continuous\" or \"categorical\"", "%s is missing",
                       type_field);
    for (int i = 0; types[i]; i++)
        if (!strcmp(type, types[i]))
            p->type = (spec_tune_type_t)(i + 1);
    if (!p->type)
        return invalid(err, type_field, "\"type\": \"integer\", \"continuous\" or \"categorical\"",
                       "%s must be \"integer\", \"continuous\" or \"categorical\" (got \"%s\")", type_field, type);
    if (p->type == SPEC_TUNE_CATEGORICAL) {
        const json_t *vals = json_object_get(o, "values");
        char f[192];
        snprintf(f, sizeof f, "%s.values", section);
        if (json_object_get(o, "min") || json_object_get(o, "max") || json_object_get(o, "scaling"))
            return invalid(err, section, "a categorical parameter takes only values",
                           "%s: min, max and scaling are for integer and continuous parameters", section);
        if (!json_is_array(vals) || json_array_size(vals) == 0 || json_array_size(vals) > SPEC_TUNE_MAX_VALUES)
            return invalid(err, f, "give a list such as [64, 128]", "%s must be a list of 1 to %d values", f,
                           SPEC_TUNE_MAX_VALUES);
        size_t i;
        json_t *v;
        json_array_foreach(vals, i, v) if (!json_is_number(v) && !json_is_string(v) && !json_is_boolean(v))
            return invalid(err, f, "values are numbers, strings or booleans", "%s[%zu] is not a number, string or boolean",
                           f, i);
        p->values = json_deep_copy(vals);
        t->nparams++; /* owned by t from here, so deinit releases it */
        json_array_foreach(vals, i, v) {
            char what[32];
            snprintf(what, sizeof what, "values[%zu]", i);
            if ((rc = try_value(t, p, v, what, err)))
                return rc;
        }
        return 0;
    }
    if (json_object_get(o, "values"))
        return invalid(err, section, "values are for categorical parameters; give min and max",
                       "%s: values are for categorical parameters", section);
    const json_t *jmin = json_object_get(o, "min"), *jmax = json_object_get(o, "max");
    for (int k = 0; k < 2; k++) {
        const json_t *v = k ? jmax : jmin;
        char f[192];
        snprintf(f, sizeof f, "%s.%s", section, k ? "max" : "min");
        if (!json_is_number(v) || !isfinite(json_number_value(v)))
            return invalid(err, f, "give a number", "%s must be a finite number", f);
        if (p->type == SPEC_TUNE_INTEGER && json_is_real(v) && json_real_value(v) != floor(json_real_value(v)))
            return invalid(err, f, "an integer parameter's range has integer ends", "%s must be an integer", f);
        if (p->type == SPEC_TUNE_INTEGER &&
            (json_is_integer(v) ? json_integer_value(v) > (json_int_t)SPEC_TUNE_MAX_INT ||
                                      json_integer_value(v) < -(json_int_t)SPEC_TUNE_MAX_INT
                                : fabs(json_real_value(v)) > SPEC_TUNE_MAX_INT))
            return invalid(err, f, "give an integer from -9007199254740992 to 9007199254740992 (2^53)",
                           "%s (%g) is outside -2^53 to 2^53, the integers a parameter takes", f, json_number_value(v));
    }
    p->min = json_number_value(jmin);
    p->max = json_number_value(jmax);
    if (p->type == SPEC_TUNE_CONTINUOUS) { /* the digits a trial's value is written with */
        p->min = spec_real_round(p->min);
        p->max = spec_real_round(p->max);
    }
    if (p->type == SPEC_TUNE_CONTINUOUS && !isfinite(p->max - p->min)) {
        char f[192];
        snprintf(f, sizeof f, "%s.max", section);
        return invalid(err, f, "give a range whose width max - min is a finite number (below about 1.8e308)",
                       "%s: the range from %g to %g is too wide to draw from", section, p->min, p->max);
    }
    char scaling[16] = "linear";
    if ((rc = rd_string(&r, o, "scaling", scaling, sizeof scaling)))
        return rc;
    int sc = -1;
    for (int i = 0; scalings[i]; i++)
        if (!strcmp(scaling, scalings[i]))
            sc = i;
    if (sc < 0) {
        char f[192];
        snprintf(f, sizeof f, "%s.scaling", section);
        return invalid(err, f, "\"linear\", \"log\" or \"reverse_log\"",
                       "%s must be \"linear\", \"log\" or \"reverse_log\" (got \"%s\")", f, scaling);
    }
    p->scaling = sc == 3 ? SPEC_TUNE_LINEAR : (spec_tune_scaling_t)sc;
    char fmin[192];
    snprintf(fmin, sizeof fmin, "%s.min", section);
    if (p->min >= p->max)
        return invalid(err, fmin, "make min smaller than max", "%s (%g) must be less than max (%g)", fmin, p->min,
                       p->max);
    if (p->scaling == SPEC_TUNE_LOG && p->min <= 0)
        return invalid(err, fmin, "log scaling needs a range above 0; use linear scaling for ranges that include 0",
                       "%s (%g) must be above 0 for log scaling", fmin, p->min);
    if (p->scaling == SPEC_TUNE_REVERSE_LOG && (p->type != SPEC_TUNE_CONTINUOUS || p->min < 0 || p->max >= 1))
        return invalid(err, fmin, "reverse_log suits continuous values near 1, such as a momentum: 0 <= min < max < 1",
                       "%s: reverse_log scaling needs a continuous range with 0 <= min < max < 1", fmin);
    t->nparams++;
    /* the ends, and for a continuous range a value between them that is no integer (a continuous
     * range over an integer field would be refused at every draw but its ends) */
    json_t *lo = p->type == SPEC_TUNE_INTEGER ? json_integer((json_int_t)p->min) : json_real(p->min);
    json_t *hi = p->type == SPEC_TUNE_INTEGER ? json_integer((json_int_t)p->max) : json_real(p->max);
    json_t *mid = p->type == SPEC_TUNE_CONTINUOUS ? json_real(p->min + (p->max - p->min) * 0.3819660112501051) : NULL;
    if (mid && json_real_value(mid) == floor(json_real_value(mid)))
        json_real_set(mid, p->min + (p->max - p->min) * 0.2360679774997897);
    rc = try_value(t, p, lo, "min", err);
    if (rc == 0)
        rc = try_value(t, p, hi, "max", err);
    if (rc == 0 && mid && json_real_value(mid) != floor(json_real_value(mid))) {
        rc = try_value(t, p, mid, "type", err);
        if (rc == KILN_EINVAL)
            kiln_err_hint(err, "field %s takes whole numbers: give parameter \"%s\" \"type\": \"integer\"", p->path,
                          p->name);
    }
    json_decref(lo);
    json_decref(hi);
    json_decref(mid);
    return rc;
}

static int tuning_parse(const json_t *in, spec_tuning_t *out, bool stored, kiln_err_t *err)
{
    static const char *const keys[] = {"name", "job", "parameters", "objective", "strategy", "hyperband", "max_jobs",
                                       "max_parallel_jobs", "seed", "completion", "early_stopping",
                                       "max_failed_trials", "trial_priority", "warm_start", NULL};
    static const char *const obj_keys[] = {"metric", "goal", NULL};
    static const char *const hb_keys[] = {"min_resource", "max_resource", "reduction_factor", "brackets", "max_rungs",
                                          "sampler", NULL};
    static const char *const done_keys[] = {"target_objective", "no_improvement_trials", NULL};
    memset(out, 0, sizeof *out);
    out->stored = stored;
    kiln_err_clear(err);
    if (!json_is_object(in))
        return invalid(err, "", "send {\"name\", \"job\", \"parameters\", \"objective\", ...}",
                       "the tuning job must be a JSON object");
    rd_t r = {err, ""};
    int rc;
    const json_t *job, *params, *objective, *hb, *done, *ws;
    spec_t base;
    bool parsed = false;
    kiln_strlcpy(out->name, "tuning", sizeof out->name);
    out->max_jobs = 10;
    out->max_parallel_jobs = 1;
    out->max_failed_trials = 3;
    out->reduction_factor = 3;
    out->brackets = 1;
    if ((rc = rd_known_keys(&r, in, keys)) || (rc = rd_string(&r, in, "name", out->name, sizeof out->name)) ||
        (rc = rd_object(&r, in, "job", &job)) || (rc = rd_object(&r, in, "parameters", &params)) ||
        (rc = rd_object(&r, in, "objective", &objective)) || (rc = rd_object(&r, in, "hyperband", &hb)) ||
        (rc = rd_object(&r, in, "completion", &done)) || (rc = rd_object(&r, in, "warm_start", &ws)))
        goto fail;
    if (!out->name[0] || strspn(out->name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") != strlen(out->name)) {
        rc = invalid(err, "name", "use letters, digits, '-', '_' and '.'",
                     "name \"%s\" is empty or has characters other than letters, digits, '-', '_' and '.'", out->name);
        goto fail;
    }
    if (!job) {
        rc = invalid(err, "job", "give the base job spec, as POST /v1/jobs takes it", "job is missing");
        goto fail;
    }
    /* the base job itself: its refusals name "job.<field>" */
    if ((rc = spec_parse(job, &base, err))) {
        if (rc == KILN_EINVAL) {
            char f[sizeof err->field];
            snprintf(f, sizeof f, "job%s%.120s", err->field[0] ? "." : "", err->field);
            kiln_strlcpy(err->field, f, sizeof err->field);
        }
        goto fail;
    }
    parsed = true;
    out->job = spec_to_json(&base);
    out->script = spec_is_script(&base);
    kiln_strlcpy(out->project, base.project, sizeof out->project);
    out->trial_priority = base.priority > -1000 ? base.priority - 1 : -1000;
    if (!out->job) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto fail;
    }
    /* the strategy first: which parameters it takes depends on it */
    {
        char strategy[16] = "random";
        if ((rc = rd_string(&r, in, "strategy", strategy, sizeof strategy)))
            goto fail;
        for (int i = 0; k_strategies[i]; i++)
            if (!strcmp(strategy, k_strategies[i]))
                out->strategy = (spec_tune_strategy_t)(i + 1);
        if (!out->strategy) {
            rc = invalid(err, "strategy", "\"random\", \"grid\", \"hyperband\" or \"bayesian\" (TPE)",
                         "strategy must be \"random\", \"grid\", \"hyperband\" or \"bayesian\" (got \"%s\")",
                         strategy);
            goto fail;
        }
    }
    if ((rc = rd_int(&r, in, "max_jobs", &out->max_jobs, 1, SPEC_TUNE_MAX_JOBS)) ||
        (rc = rd_int(&r, in, "max_parallel_jobs", &out->max_parallel_jobs, 1, SPEC_TUNE_MAX_JOBS)) ||
        (rc = rd_int(&r, in, "max_failed_trials", &out->max_failed_trials, 1, SPEC_TUNE_MAX_JOBS)) ||
        (rc = rd_int(&r, in, "trial_priority", &out->trial_priority, -1000, 1000)))
        goto fail;
    if (out->max_parallel_jobs > out->max_jobs) {
        rc = invalid(err, "max_parallel_jobs", "run at most max_jobs trials at once",
                     "max_parallel_jobs (%d) is more than max_jobs (%d)", out->max_parallel_jobs, out->max_jobs);
        goto fail;
    }
    {
        json_t *seed = json_object_get(in, "seed");
        if (seed && !json_is_null(seed)) {
            if (!json_is_integer(seed) || json_integer_value(seed) < 0) {
                rc = invalid(err, "seed", "give a whole number from 0", "seed must be an integer of at least 0");
                goto fail;
            }
            out->seed = (uint64_t)json_integer_value(seed);
            out->seed_set = true;
        }
    }
    {
        json_t *es = json_object_get(in, "early_stopping");
        const char *v = json_string_value(es);
        if (es && !json_is_null(es) && (!v || (strcmp(v, "auto") && strcmp(v, "off")))) {
            rc = invalid(err, "early_stopping", "\"auto\" (the median stopping rule) or \"off\"",
                         "early_stopping must be \"auto\" or \"off\"");
            goto fail;
        }
        if (v && !strcmp(v, "auto")) {
            if (out->strategy == SPEC_TUNE_HYPERBAND) {
                rc = invalid(err, "early_stopping", "leave early_stopping out (or \"off\"), or use strategy random, grid or bayesian",
                             "early_stopping \"auto\" (the median stopping rule) is for random, grid and bayesian; hyperband "
                             "already stops trials at its rungs");
                goto fail;
            }
            out->early_stopping = true;
        }
    }
    /* objective */
    {
        rd_t ro = {err, "objective"};
        char goal[16] = "minimize";
        if (!objective) {
            rc = invalid(err, "objective", "give {\"metric\": \"val_loss\", \"goal\": \"minimize\"}", "objective is missing");
            goto fail;
        }
        if ((rc = rd_known_keys(&ro, objective, obj_keys)) ||
            (rc = rd_string(&ro, objective, "metric", out->metric, sizeof out->metric)) ||
            (rc = rd_string(&ro, objective, "goal", goal, sizeof goal)))
            goto fail;
        if (!out->metric[0]) {
            rc = invalid(err, "objective.metric", "name a metric the trials report, such as val_loss (or one of the "
                         "job's metric_definitions)", "objective.metric is empty");
            goto fail;
        }
        if (strspn(out->metric, "abcdefghijklmnopqrstuvwxyz0123456789_.") != strlen(out->metric)) {
            rc = invalid(err, "objective.metric", "metric names are lower-case letters, digits, '_' and '.'",
                         "objective.metric \"%s\" is not a metric name", out->metric);
            goto fail;
        }
        if (strcmp(goal, "minimize") && strcmp(goal, "maximize")) {
            rc = invalid(err, "objective.goal", "\"minimize\" or \"maximize\"",
                         "objective.goal must be \"minimize\" or \"maximize\" (got \"%s\")", goal);
            goto fail;
        }
        out->maximize = !strcmp(goal, "maximize");
        char reported[1024];
        if (!out->script && !spec_engine_reports(&base, out->metric, reported, sizeof reported)) {
            rc = invalid(err, "objective.metric",
                         "optimise one of those, or add to the job a metric_definitions entry that reads it from the "
                         "trial's log lines",
                         "objective.metric \"%s\" is never reported by an engine job; it reports %s", out->metric,
                         reported);
            goto fail;
        }
    }
    /* completion criteria */
    if (done) {
        rd_t rc2 = {err, "completion"};
        json_t *tv = json_object_get(done, "target_objective");
        if ((rc = rd_known_keys(&rc2, done, done_keys)) ||
            (rc = rd_int(&rc2, done, "no_improvement_trials", &out->no_improvement_trials, 1, SPEC_TUNE_MAX_JOBS)))
            goto fail;
        if (tv && !json_is_null(tv)) {
            if (!json_is_number(tv) || !isfinite(json_number_value(tv))) {
                rc = invalid(err, "completion.target_objective", "give a number", "completion.target_objective must be a "
                             "finite number");
                goto fail;
            }
            out->has_target = true;
            out->target = json_number_value(tv);
        }
    }
    /* hyperband */
    if (out->strategy == SPEC_TUNE_HYPERBAND) {
        rd_t rh = {err, "hyperband"};
        if (!hb) {
            rc = invalid(err, "hyperband", "give {\"min_resource\": 100, \"max_resource\": 2000, \"reduction_factor\": 3} "
                         "(steps)", "strategy hyperband needs hyperband.min_resource and max_resource");
            goto fail;
        }
        if ((rc = rd_known_keys(&rh, hb, hb_keys)) ||
            (rc = rd_int64(&rh, hb, "min_resource", &out->min_resource, 1, INT64_C(1000000000))) ||
            (rc = rd_int64(&rh, hb, "max_resource", &out->max_resource, 1, INT64_C(1000000000))) ||
            (rc = rd_int(&rh, hb, "reduction_factor", &out->reduction_factor, 2, 10)) ||
            (rc = rd_int(&rh, hb, "brackets", &out->brackets, 1, SPEC_TUNE_MAX_RUNGS)) ||
            (rc = rd_int(&rh, hb, "max_rungs", &out->max_rungs, 2, SPEC_TUNE_MAX_RUNGS)))
            goto fail;
        {
            json_t *sj = json_object_get(hb, "sampler");
            const char *sv = json_string_value(sj);
            if (sj && !json_is_null(sj) && (!sv || (strcmp(sv, "random") && strcmp(sv, "tpe")))) {
                rc = invalid(err, "hyperband.sampler", "\"random\" (random search's draws) or \"tpe\" (TPE over the "
                             "results at the rungs)", "hyperband.sampler must be \"random\" or \"tpe\"");
                goto fail;
            }
            out->sampler = sv && !strcmp(sv, "tpe") ? SPEC_TUNE_SAMPLER_TPE : SPEC_TUNE_SAMPLER_RANDOM;
        }
        if (!out->min_resource || !out->max_resource) {
            rc = invalid(err, !out->min_resource ? "hyperband.min_resource" : "hyperband.max_resource",
                         "give both, in steps", "hyperband.min_resource and max_resource are both needed");
            goto fail;
        }
        if (out->min_resource >= out->max_resource) {
            rc = invalid(err, "hyperband.min_resource", "make min_resource smaller than max_resource",
                         "hyperband.min_resource (%lld) must be less than max_resource (%lld)",
                         (long long)out->min_resource, (long long)out->max_resource);
            goto fail;
        }
        int64_t r0 = out->min_resource;
        int rungs = 1;
        while (r0 * out->reduction_factor < out->max_resource && rungs < SPEC_TUNE_MAX_RUNGS) {
            r0 *= out->reduction_factor;
            rungs++;
        }
        if (!out->max_rungs && r0 * out->reduction_factor < out->max_resource) {
            rc = invalid(err, "hyperband.max_resource", "raise min_resource or reduction_factor, or keep fewer rungs "
                         "with max_rungs",
                         "hyperband would need more than %d rungs", SPEC_TUNE_MAX_RUNGS);
            goto fail;
        }
        /* a script trial pauses at its rungs by the rank contract (KILN_PAUSE_AT_STEP): its
         * hyperparameters.max_steps is the step count it trains to, which hyperband sets to
         * max_resource */
        int64_t script_steps = out->script ? spec_script_max_steps(&base) : 0;
        if (out->script && script_steps < out->max_resource) {
            const char *hint = "give the script a hyperparameters.max_steps of at least max_resource (the step count "
                               "it trains to), and have it stop at KILN_PAUSE_AT_STEP with a checkpoint, its metrics "
                               "reported and exit code 0";
            if (script_steps)
                rc = invalid(err, "job.hyperparameters.max_steps", hint, "hyperband.max_resource (%lld) is past the "
                             "script's hyperparameters.max_steps (%lld)", (long long)out->max_resource,
                             (long long)script_steps);
            else
                rc = invalid(err, "job.hyperparameters.max_steps", hint, "hyperband pauses a script job's trials at "
                             "steps of its hyperparameters.max_steps, and this one has none (or not a whole number)");
            goto fail;
        }
        if (out->max_rungs > rungs + 1) {
            rc = invalid(err, "hyperband.max_rungs", "leave max_rungs out for every rung, or give fewer",
                         "hyperband.max_rungs (%d) is more than the %d rungs from min_resource to max_resource",
                         out->max_rungs, rungs + 1);
            goto fail;
        }
        if (out->max_rungs)
            rungs = out->max_rungs - 1;
        if (out->brackets > rungs + 1) {
            rc = invalid(err, "hyperband.brackets", "give at most one bracket a rung",
                         "hyperband.brackets (%d) is more than the %d rungs %s", out->brackets, rungs + 1,
                         out->max_rungs ? "that hyperband.max_rungs keeps" : "from min_resource to max_resource");
            goto fail;
        }
    } else if (hb) {
        rc = invalid(err, "hyperband", "leave hyperband out, or set \"strategy\": \"hyperband\"",
                     "hyperband settings are for the hyperband strategy (this one is %s)",
                     spec_tune_strategy_name(out->strategy));
        goto fail;
    }
    /* parameters */
    if (!params || json_object_size(params) == 0) {
        rc = invalid(err, "parameters", "give {\"lr\": {\"type\": \"continuous\", \"min\": 1e-4, \"max\": 1e-2}}",
                     "parameters is missing or empty");
        goto fail;
    }
    if (json_object_size(params) > SPEC_TUNE_MAX_PARAMS) {
        rc = invalid(err, "parameters", "tune fewer parameters at once", "parameters has %zu entries; at most %d",
                     json_object_size(params), SPEC_TUNE_MAX_PARAMS);
        goto fail;
    }
    {
        const char *name;
        json_t *p;
        json_object_foreach((json_t *)params, name, p) {
            if ((rc = parse_param(out, name, p, err)))
                goto fail;
            for (int i = 0; i + 1 < out->nparams; i++)
                if (!strcmp(out->params[i].path, out->params[out->nparams - 1].path)) {
                    rc = invalid(err, "parameters", "name each field once",
                                 "parameters \"%s\" and \"%s\" are the same field", out->params[i].name, name);
                    goto fail;
                }
        }
    }
    if (ws && (rc = parse_warm_start(out, ws, err)))
        goto fail;
    if (out->strategy == SPEC_TUNE_GRID) {
        double size = 1;
        for (int i = 0; i < out->nparams; i++) {
            const spec_tune_param_t *p = &out->params[i];
            if (p->type == SPEC_TUNE_CONTINUOUS) {
                char f[192];
                snprintf(f, sizeof f, "parameters.%s.type", p->name);
                rc = invalid(err, f, "give the values to try as a categorical parameter, or use strategy random",
                             "grid search takes categorical and integer parameters; \"%s\" is continuous", p->name);
                goto fail;
            }
            size *= p->type == SPEC_TUNE_CATEGORICAL ? (double)json_array_size(p->values) : p->max - p->min + 1;
        }
        if (size > out->max_jobs) {
            rc = invalid(err, "max_jobs", "raise max_jobs to the grid's size, or try fewer values",
                         "the grid has %.0f points, more than max_jobs (%d)", size, out->max_jobs);
            goto fail;
        }
    }
    spec_deinit(&base);
    return 0;
fail:
    if (parsed)
        spec_deinit(&base);
    spec_tuning_deinit(out);
    return rc;
}

json_t *spec_tuning_to_json(const spec_tuning_t *t)
{
    json_t *params = json_object();
    for (int i = 0; i < t->nparams; i++) {
        const spec_tune_param_t *p = &t->params[i];
        static const char *const types[] = {"", "integer", "continuous", "categorical"};
        static const char *const scalings[] = {"linear", "log", "reverse_log"};
        json_t *o = json_pack("{s:s}", "type", types[p->type]);
        if (p->type == SPEC_TUNE_CATEGORICAL) {
            json_object_set(o, "values", p->values);
        } else {
            json_object_set_new(o, "min", p->type == SPEC_TUNE_INTEGER ? json_integer((json_int_t)p->min) : json_real(p->min));
            json_object_set_new(o, "max", p->type == SPEC_TUNE_INTEGER ? json_integer((json_int_t)p->max) : json_real(p->max));
            json_object_set_new(o, "scaling", json_string(scalings[p->scaling]));
        }
        json_object_set_new(params, p->name, o);
    }
    json_t *out = json_pack("{s:s, s:O, s:o, s:{s:s, s:s}, s:s, s:i, s:i, s:I, s:s, s:i, s:i}", "name", t->name, "job",
                            t->job, "parameters", params, "objective", "metric", t->metric, "goal",
                            t->maximize ? "maximize" : "minimize", "strategy", spec_tune_strategy_name(t->strategy),
                            "max_jobs", t->max_jobs, "max_parallel_jobs", t->max_parallel_jobs, "seed",
                            (json_int_t)t->seed, "early_stopping", t->early_stopping ? "auto" : "off",
                            "max_failed_trials", t->max_failed_trials, "trial_priority", t->trial_priority);
    if (!out)
        return NULL;
    if (t->strategy == SPEC_TUNE_HYPERBAND) {
        json_t *hb = json_pack("{s:I, s:I, s:i, s:i, s:s}", "min_resource", (json_int_t)t->min_resource,
                               "max_resource", (json_int_t)t->max_resource, "reduction_factor", t->reduction_factor,
                               "brackets", t->brackets, "sampler",
                               t->sampler == SPEC_TUNE_SAMPLER_TPE ? "tpe" : "random");
        if (hb && t->max_rungs)
            json_object_set_new(hb, "max_rungs", json_integer(t->max_rungs));
        json_object_set_new(out, "hyperband", hb);
    }
    json_t *done = json_object();
    if (t->has_target)
        json_object_set_new(done, "target_objective", json_real(t->target));
    if (t->no_improvement_trials)
        json_object_set_new(done, "no_improvement_trials", json_integer(t->no_improvement_trials));
    json_object_set_new(out, "completion", done);
    if (t->nparents > 0) {
        json_t *parents = json_array();
        for (int i = 0; i < t->nparents; i++)
            json_array_append_new(parents, json_string(t->parents[i]));
        json_object_set_new(out, "warm_start",
                            json_pack("{s:o, s:s}", "parents", parents, "type", spec_warm_type_name(t->warm_type)));
    }
    return out;
}

json_t *spec_tuning_trial_spec(const spec_tuning_t *t, const json_t *values, const char *name, const json_t *tags)
{
    json_t *job = json_deep_copy(t->job);
    if (!job)
        return NULL;
    for (int i = 0; i < t->nparams; i++) {
        json_t *v = json_object_get(values, t->params[i].name);
        if (v)
            path_set(job, t->params[i].path, v, t->script);
    }
    json_object_set_new(job, "name", json_string(name));
    json_object_set_new(job, "priority", json_integer(t->trial_priority));
    json_t *jt = json_object_get(job, "tags");
    if (!json_is_object(jt)) {
        jt = json_object();
        json_object_set_new(job, "tags", jt);
    }
    json_object_update(jt, (json_t *)tags);
    if (t->strategy == SPEC_TUNE_HYPERBAND) {
        json_t *v = json_integer((json_int_t)t->max_resource), *at = json_integer((json_int_t)t->min_resource);
        path_set(job, "hyperparameters.max_steps", v, false);
        path_set(job, "stopping.max_steps", at, true);
        json_decref(v);
        json_decref(at);
    }
    return job;
}

int spec_tuning_parse(const json_t *in, spec_tuning_t *out, kiln_err_t *err)
{
    return tuning_parse(in, out, false, err);
}

int spec_tuning_load(const json_t *in, spec_tuning_t *out, kiln_err_t *err)
{
    return tuning_parse(in, out, true, err);
}
