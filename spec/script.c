/* script.c - script jobs (a job spec with an entry_point instead of a model): their fields
 * (entry_point, source, python, free-form hyperparameters, data.channels, environment,
 * distribution.torch_distributed), the engine fields a script job may not use, SageMaker's
 * spellings read as kiln's (metric definitions' "Name"/"Regex", the "validation" channel), the
 * normalised form, and the flat numbers of hyperparameters that search indexes. The shared
 * sections (resources, checkpoint, stopping, retry, metric definitions, tags) are spec.c's. */
#include "spec/spec_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "rank/rank.h"

#define FLAT_MAX 1000     /* numbers of one job's hyperparameters that search indexes */
#define FLAT_DEPTH 8
#define ENV_NAME_MAX 256

bool spec_source_digest(const char *source, char digest[KILN_SHA256_HEX])
{
    size_t pl = strlen(SPEC_CODE_PREFIX);
    if (!source || strncmp(source, SPEC_CODE_PREFIX, pl) != 0 || strlen(source) != pl + 64)
        return false;
    char d[KILN_SHA256_HEX];
    for (size_t i = 0; i < 64; i++) {
        char c = source[pl + i];
        d[i] = c >= 'A' && c <= 'F' ? (char)(c - 'A' + 'a') : c;
    }
    d[64] = '\0';
    if (!kiln_sha256_hex_ok(d))
        return false;
    memcpy(digest, d, KILN_SHA256_HEX);
    return true;
}

int spec_input_path(char *buf, const char *field, kiln_err_t *err)
{
    if (!buf[0])
        return 0;
    if (!strncmp(buf, "file://", 7)) {
        /* A file URL names an absolute path (file:///data/x.txt); what is left after the scheme
         * is validated as the path it is, so the normal form passes this same parser again. */
        memmove(buf, buf + 7, strlen(buf + 7) + 1);
        if (buf[0] != '/')
            return invalid(err, field, "write a file URL with three slashes and an absolute path: "
                           "\"file:///data/corpus.txt\"",
                           "%s: a file URL must name an absolute path (got \"file://%.200s\")", field, buf);
    } else if (strstr(buf, "://")) {
        return invalid(err, field, "kiln reads local files: use a path or a file:// URL on every agent's machine",
                       "%s: unsupported URL scheme in \"%.200s\"", field, buf);
    }
    return normalize_path(buf, SPEC_PATH, field, err);
}

/* Text without terminal control characters (kiln_text_control; jansson already checked it is
 * UTF-8); len is the JSON string's length, so an embedded NUL ("\u0000") is caught. */
static bool plain_text(const char *s, size_t len)
{
    return kiln_text_control_at(s, len) == len;
}

/* ---- SageMaker's spellings and the engine's refusals ------------------------------------------ */

/* Moves obj[from] to obj[to]; both present is a refusal naming section.from. */
static int alias(json_t *obj, const char *section, const char *from, const char *to, kiln_err_t *err)
{
    json_t *v = json_object_get(obj, from);
    if (!v)
        return 0;
    char f[96];
    snprintf(f, sizeof(f), "%s.%s", section, from);
    if (json_object_get(obj, to))
        return invalid(err, f, "give one of them", "%s and %s.%s name the same thing; give one of them", f, section, to);
    json_object_set(obj, to, v);
    json_object_del(obj, from);
    return 0;
}

int spec_aliases(json_t *in, kiln_err_t *err)
{
    int rc;
    json_t *defs = json_object_get(in, "metric_definitions");
    size_t i;
    json_t *d;
    json_array_foreach(defs, i, d) {
        if (!json_is_object(d))
            continue;
        char sec[48];
        snprintf(sec, sizeof(sec), "metric_definitions[%zu]", i);
        if ((rc = alias(d, sec, "Name", "name", err)) || (rc = alias(d, sec, "Regex", "regex", err)))
            return rc;
    }
    const json_t *entry = json_object_get(in, "entry_point");
    json_t *data = json_object_get(in, "data");
    if ((entry && !json_is_null(entry)) || !json_is_object(data))
        return 0;
    /* an engine job: its channels are train and val */
    if ((rc = alias(data, "data", "validation", "val", err)))
        return rc;
    json_t *ch = json_object_get(data, "channels");
    if (!ch || json_is_null(ch)) {
        json_object_del(data, "channels");
        return 0;
    }
    if (!json_is_object(ch))
        return invalid(err, "data.channels", "name the inputs: {\"train\": \"/data/train.txt\", \"val\": \"/data/val.txt\"}",
                       "data.channels must be an object of channel names and paths");
    const char *name;
    json_t *path;
    json_object_foreach(ch, name, path) {
        char f[SPEC_CHANNEL_NAME + 32];
        snprintf(f, sizeof(f), "data.channels.%.*s", SPEC_CHANNEL_NAME, name);
        const char *to = !strcmp(name, "train") ? "train"
                         : (!strcmp(name, "val") || !strcmp(name, "validation")) ? "val"
                                                                                 : NULL;
        if (!to)
            return invalid(err, f, "kiln's engine reads the channels train and val (or validation); other channels are "
                           "for script jobs (entry_point)",
                           "%s: kiln's engine has no channel \"%.*s\"", f, SPEC_CHANNEL_NAME, name);
        if (json_object_get(data, to))
            return invalid(err, f, "give one of them", "%s and data.%s name the same input; give one of them", f, to);
        json_object_set(data, to, path);
    }
    json_object_del(data, "channels");
    return 0;
}

int spec_engine_no_script_fields(const json_t *in, kiln_err_t *err)
{
    static const char *const script_only[] = {"source", "python", "environment", NULL};
    for (size_t i = 0; script_only[i]; i++) {
        const json_t *v = json_object_get(in, script_only[i]);
        if (v && !json_is_null(v))
            return invalid(err, script_only[i], "add an entry_point to run your own script, or leave it out",
                           "%s applies to a script job (one with an entry_point instead of a model)", script_only[i]);
    }
    const json_t *td = json_object_get(json_object_get(in, "distribution"), "torch_distributed");
    if (td && !json_is_null(td))
        return invalid(err, "distribution.torch_distributed",
                       "kiln's engine trains in parallel with distribution.data_parallel and model_parallel",
                       "distribution.torch_distributed applies to a script job (one with an entry_point)");
    return 0;
}

/* ---- the sections of a script job ------------------------------------------------------------- */

/* A path inside the code (the entry point): relative, no "..", normalised into buf in place. */
static int code_relative_path(char *buf, size_t len, const char *field, kiln_err_t *err)
{
    static const char *const hint = "name a file inside the code, relative to its top, such as \"train.py\" or "
                                    "\"scripts/train.sh\"";
    if (!buf[0])
        return invalid(err, field, hint, "%s is empty", field);
    if (!plain_text(buf, len))
        return invalid(err, field, hint, "%s has control characters", field);
    if (buf[0] == '/')
        return invalid(err, field, hint, "%s must be relative to the code's top, not an absolute path (got \"%.200s\")",
                       field, buf);
    if (buf[len - 1] == '/')
        return invalid(err, field, hint, "%s names a directory (\"%.200s\"); it must name a file", field, buf);
    char out[SPEC_PATH];
    size_t o = 0;
    for (const char *p = buf; *p;) {
        while (*p == '/')
            p++;
        size_t n = strcspn(p, "/");
        if (n == 2 && p[0] == '.' && p[1] == '.')
            return invalid(err, field, hint, "%s must stay inside the code: no \"..\" (got \"%.200s\")", field, buf);
        if (n > 0 && !(n == 1 && p[0] == '.')) {
            if (o)
                out[o++] = '/';
            memcpy(out + o, p, n);
            o += n;
        }
        p += n;
    }
    out[o] = '\0';
    if (!o)
        return invalid(err, field, hint, "%s names no file (got \"%.200s\")", field, buf);
    memcpy(buf, out, o + 1);
    return 0;
}

static int parse_source(const json_t *in, spec_script_t *sc, kiln_err_t *err)
{
    static const char *const hint = "upload the code with `kiln code push DIR` and give the source it prints "
                                    "(code:sha256:...), or name a directory inside the agents' data roots";
    rd_t r = {err, ""};
    int rc = rd_string(&r, in, "source", sc->source, sizeof(sc->source));
    if (rc)
        return rc;
    if (!sc->source[0])
        return invalid(err, "source", hint, "a script job needs a source: the code its entry_point is in");
    if (!strncmp(sc->source, "code:", 5)) {
        char d[KILN_SHA256_HEX];
        if (!spec_source_digest(sc->source, d))
            return invalid(err, "source", hint, "source \"%.100s\" is not \"code:sha256:\" followed by 64 hex digits",
                           sc->source);
        snprintf(sc->source, sizeof(sc->source), "%s%s", SPEC_CODE_PREFIX, d);
        return 0;
    }
    if ((rc = spec_input_path(sc->source, "source", err)))
        return rc;
    if (sc->source[0] != '/')
        return invalid(err, "source", hint, "source must be code:sha256:<digest> or an absolute directory (got \"%.200s\")",
                       sc->source);
    return 0;
}

static int parse_python(const json_t *in, spec_script_t *sc, kiln_err_t *err)
{
    rd_t r = {err, ""};
    int rc = rd_string(&r, in, "python", sc->python, sizeof(sc->python));
    if (rc || !sc->python[0])
        return rc;
    if (sc->python[0] != '/')
        return invalid(err, "python", "name an interpreter inside a data root, such as \"/data/venvs/x/bin/python\"; "
                       "leave it out for the agent's Python",
                       "python must be an absolute path (got \"%.200s\")", sc->python);
    return normalize_path(sc->python, sizeof(sc->python), "python", err);
}

static int parse_free_hparams(const json_t *in, spec_script_t *sc, kiln_err_t *err)
{
    rd_t r = {err, ""};
    const json_t *h = NULL;
    int rc = rd_object(&r, in, "hyperparameters", &h);
    if (rc)
        return rc;
    if (h && json_object_size(h) > SPEC_MAX_SCRIPT_HPARAMS)
        return invalid(err, "hyperparameters", "pass fewer, or read a configuration file from the code or a channel",
                       "hyperparameters has %zu keys; a script job may have at most %d", json_object_size(h),
                       SPEC_MAX_SCRIPT_HPARAMS);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)h, key, v) {
        char f[96];
        snprintf(f, sizeof(f), "hyperparameters.%.60s", key);
        size_t kl = strlen(key);
        if (!kl || kl > SPEC_SCRIPT_HPARAM_KEY || !plain_text(key, kl))
            return invalid(err, f, NULL, "a hyperparameter's name must have 1 to %d characters and no control "
                           "characters", SPEC_SCRIPT_HPARAM_KEY);
        char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        size_t tl = text ? strlen(text) : 0;
        free(text);
        if (!text)
            return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        if (tl > SPEC_SCRIPT_HPARAM_VALUE)
            return invalid(err, f, "read large settings from a file in the code or a data channel",
                           "%s is %zu characters as JSON; a value may have at most %d", f, tl, SPEC_SCRIPT_HPARAM_VALUE);
    }
    sc->hyperparameters = h ? json_deep_copy(h) : json_object();
    return sc->hyperparameters ? 0 : kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
}

static bool channel_name_ok(const char *s)
{
    size_t n = strlen(s);
    return n > 0 && n < SPEC_CHANNEL_NAME &&
           strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == n;
}

static int parse_channels(const json_t *in, spec_t *s, kiln_err_t *err)
{
    rd_t r = {err, ""};
    const json_t *d = NULL, *ch = NULL;
    int rc = rd_object(&r, in, "data", &d);
    if (rc || !d)
        return rc;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)d, key, v) {
        if (!strcmp(key, "channels"))
            continue;
        char f[96];
        snprintf(f, sizeof(f), "data.%.60s", key);
        return invalid(err, f, "name the inputs in data.channels, such as {\"train\": \"/data/mnist/train\"}",
                       "a script job reads its inputs from data.channels; %s is not one of its fields", f);
    }
    rd_t rd = {err, "data"};
    if ((rc = rd_object(&rd, d, "channels", &ch)) || !ch)
        return rc;
    if (json_object_size(ch) > SPEC_MAX_CHANNELS)
        return invalid(err, "data.channels", "read several inputs from one directory", "data.channels has %zu channels; "
                       "a job may have at most %d", json_object_size(ch), SPEC_MAX_CHANNELS);
    json_object_foreach((json_t *)ch, key, v) {
        char f[SPEC_CHANNEL_NAME + 32];
        snprintf(f, sizeof(f), "data.channels.%.*s", SPEC_CHANNEL_NAME, key);
        if (!channel_name_ok(key))
            return invalid(err, f, "use letters, digits, '_' and '-' (at most 63), such as \"train\" or \"validation\"",
                           "channel name \"%.80s\" is empty, too long or has characters other than letters, digits, "
                           "'_' and '-'", key);
        spec_channel_t *c = &s->data.channels[s->data.n_channels];
        for (int k = 0; k < s->data.n_channels; k++)
            if (!strcasecmp(s->data.channels[k].name, key))
                return invalid(err, f, "give the channels names that differ in more than case",
                               "channels \"%s\" and \"%s\" differ only in case (a script sees channels by their "
                               "names in capitals, SM_CHANNEL_<NAME>)", s->data.channels[k].name, key);
        if (!json_is_string(v))
            return invalid(err, f, "give the channel's directory or file, such as \"/data/mnist/train\"",
                           "%s must be a path (a string)", f);
        if (json_string_length(v) >= sizeof(c->path) || strlen(json_string_value(v)) != json_string_length(v))
            return invalid(err, f, NULL, "%s is too long or holds a NUL character", f);
        kiln_strlcpy(c->name, key, sizeof(c->name));
        kiln_strlcpy(c->path, json_string_value(v), sizeof(c->path));
        if ((rc = spec_input_path(c->path, f, err)))
            return rc;
        if (c->path[0] != '/')
            return invalid(err, f, "use an absolute path inside the agents' data roots, such as \"/data/mnist/train\"",
                           "%s must be an absolute path (got \"%.200s\")", f, c->path);
        s->data.n_channels++;
    }
    return 0;
}

static bool env_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > ENV_NAME_MAX || !((s[0] >= 'A' && s[0] <= 'Z') || (s[0] >= 'a' && s[0] <= 'z') || s[0] == '_'))
        return false;
    return strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") == n;
}

static int parse_environment(const json_t *in, spec_script_t *sc, kiln_err_t *err)
{
    rd_t r = {err, ""};
    const json_t *env = NULL;
    int rc = rd_object(&r, in, "environment", &env);
    if (rc || !env)
        return rc;
    if (json_object_size(env) > SPEC_MAX_ENV)
        return invalid(err, "environment", "pass settings as hyperparameters or in a file", "environment has %zu "
                       "variables; a job may set at most %d", json_object_size(env), SPEC_MAX_ENV);
    const char *name;
    json_t *v;
    json_object_foreach((json_t *)env, name, v) {
        char f[96];
        snprintf(f, sizeof(f), "environment.%.60s", name);
        if (!env_name_ok(name))
            return invalid(err, f, "names are a letter or '_' followed by letters, digits and '_'",
                           "\"%.60s\" is not a variable name", name);
        const char *why = rank_env_reserved(name);
        if (why)
            return invalid(err, f, "leave it out: kiln sets it for every rank (docs/contracts.md lists what a script "
                           "receives)", "environment.%.60s is set by kiln (%s); a job may not set it", name, why);
        if (!json_is_string(v) || json_string_length(v) > SPEC_ENV_VALUE ||
            strlen(json_string_value(v)) != json_string_length(v))
            return invalid(err, f, NULL, "%s must be a string of at most %d characters without NUL", f, SPEC_ENV_VALUE);
    }
    if (json_object_size(env) > 0 && !(sc->environment = json_deep_copy(env)))
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    return 0;
}

static int parse_torch_distributed(const json_t *in, spec_t *s, kiln_err_t *err)
{
    static const char *const keys[] = {"torch_distributed", NULL};
    static const char *const td_keys[] = {"enabled", "nproc_per_node", NULL};
    static const char *const engine_only[] = {"data_parallel", "model_parallel", "mixed_precision",
                                              "activation_checkpointing", NULL};
    rd_t r = {err, ""}, rdist = {err, "distribution"}, rtd = {err, "distribution.torch_distributed"};
    spec_script_t *sc = &s->script;
    const json_t *dist = NULL, *td = NULL;
    int rc = rd_object(&r, in, "distribution", &dist);
    if (rc)
        return rc;
    for (size_t i = 0; dist && engine_only[i]; i++) {
        const json_t *v = json_object_get(dist, engine_only[i]);
        if (!v || json_is_null(v))
            continue;
        char f[64];
        snprintf(f, sizeof(f), "distribution.%s", engine_only[i]);
        return invalid(err, f, "leave it out: distribution.torch_distributed starts one rank per slot with torchrun's "
                       "variables, and the script's own code (DDP, FSDP, ...) trains in parallel",
                       "%s is how kiln's engine trains in parallel; a script job's own code decides how it does", f);
    }
    if (dist && ((rc = rd_known_keys(&rdist, dist, keys)) || (rc = rd_object(&rdist, dist, "torch_distributed", &td))))
        return rc;
    sc->torch_distributed = true;
    int nproc = 0;
    if (td && ((rc = rd_known_keys(&rtd, td, td_keys)) || (rc = rd_bool(&rtd, td, "enabled", &sc->torch_distributed)) ||
               (rc = rd_int(&rtd, td, "nproc_per_node", &nproc, 1, 256))))
        return rc;
    const json_t *spn = json_object_get(json_object_get(in, "resources"), "slots_per_node");
    bool slots_given = spn && !json_is_null(spn);
    if (!sc->torch_distributed) {
        if (nproc > 1)
            return invalid(err, "distribution.torch_distributed.nproc_per_node",
                           "enable torch_distributed for one rank per slot, or leave nproc_per_node out",
                           "without torch_distributed kiln starts one process per node, not %d", nproc);
        sc->nproc_per_node = 1;
        return 0;
    }
    if (nproc && slots_given && nproc != s->res.slots_per_node)
        return invalid(err, "distribution.torch_distributed.nproc_per_node", "leave one of them out",
                       "distribution.torch_distributed.nproc_per_node (%d) must equal resources.slots_per_node (%d): "
                       "kiln starts one rank per slot", nproc, s->res.slots_per_node);
    if (nproc)
        s->res.slots_per_node = nproc;
    sc->nproc_per_node = s->res.slots_per_node;
    return 0;
}

/* What of the engine's sections a script job may not set. */
static int script_engine_refusals(const json_t *in, const spec_t *s, kiln_err_t *err)
{
    if (strcmp(s->res.device, "auto") != 0)
        return invalid(err, "resources.device", "leave it out: resources.slot_type \"gpu\" gives a script its GPUs "
                       "(CUDA_VISIBLE_DEVICES)", "resources.device chooses kiln's engine backend; a script chooses its "
                       "own device");
    const json_t *ck = json_object_get(in, "checkpoint");
    const json_t *every = json_object_get(ck, "every_steps");
    if (every && !json_is_null(every) && !(json_is_number(every) && json_number_value(every) == 0))
        return invalid(err, "checkpoint.every_steps", "leave it out: a script saves a checkpoint when it chooses, into "
                       "the checkpoint directory kiln gives it (docs/contracts.md)",
                       "checkpoint.every_steps is kiln's engine's; a script job decides itself when to checkpoint");
    const json_t *keep = json_object_get(ck, "keep_last");
    if (keep && !json_is_null(keep))
        return invalid(err, "checkpoint.keep_last", "leave it out; the script removes the checkpoints it no longer needs",
                       "checkpoint.keep_last is kiln's engine's; kiln keeps what a script leaves in its checkpoint "
                       "directory");
    return 0;
}

int spec_script_parse(const json_t *in, spec_t *s, kiln_err_t *err)
{
    spec_script_t *sc = &s->script;
    const json_t *e = json_object_get(in, "entry_point");
    if (!json_is_string(e))
        return invalid(err, "entry_point", "name the script to run, such as \"train.py\"",
                       "entry_point must be a string");
    rd_t r = {err, ""};
    int rc = rd_string(&r, in, "entry_point", sc->entry_point, sizeof(sc->entry_point));
    if (rc == 0)
        rc = code_relative_path(sc->entry_point, json_string_length(e), "entry_point", err);
    if (rc == 0)
        rc = parse_source(in, sc, err);
    if (rc == 0)
        rc = parse_python(in, sc, err);
    if (rc == 0)
        rc = parse_free_hparams(in, sc, err);
    if (rc == 0)
        rc = parse_channels(in, s, err);
    if (rc == 0)
        rc = parse_environment(in, sc, err);
    if (rc == 0)
        rc = parse_torch_distributed(in, s, err);
    if (rc == 0)
        rc = script_engine_refusals(in, s, err);
    return rc;
}

json_t *spec_script_to_json(const spec_t *s, json_t *res, json_t *ck, json_t *defs, json_t *stopping, json_t *tags)
{
    const spec_script_t *sc = &s->script;
    json_t *channels = json_object();
    for (int i = 0; i < s->data.n_channels; i++)
        json_object_set_new(channels, s->data.channels[i].name, json_string(s->data.channels[i].path));
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:o, s:{s:o}, s:o, s:o, s:{s:{s:b, s:i}}, s:o, s:o, s:o, s:{s:i}, "
                          "s:i, s:s, s:o}",
                          "name", s->name, "project", s->project, "entry_point", sc->entry_point, "source", sc->source,
                          "hyperparameters", sc->hyperparameters ? json_deep_copy(sc->hyperparameters) : json_object(),
                          "data", "channels", channels, "environment",
                          sc->environment ? json_deep_copy(sc->environment) : json_object(), "resources", res,
                          "distribution", "torch_distributed", "enabled", sc->torch_distributed, "nproc_per_node",
                          sc->nproc_per_node, "checkpoint", ck, "metric_definitions", defs, "stopping", stopping,
                          "retry", "max_attempts", s->max_attempts, "priority", s->priority, "queue", s->queue,
                          "tags", tags);
    if (o && sc->python[0])
        json_object_set_new(o, "python", json_string(sc->python));
    return o;
}

/* ---- hyperparameters for search ---------------------------------------------------------------- */

/* A number written as text ("0.01", "3"): the whole string, finite. */
static bool text_number(const char *s, double *out)
{
    if (!s[0] || s[0] == ' ' || strlen(s) > 64)
        return false;
    char *end = NULL;
    double v = strtod(s, &end);
    if (*end || !isfinite(v) || !strpbrk(s, "0123456789"))
        return false;
    /* strtod reads hex and "infinity"; search takes what people write as a decimal number */
    if (strpbrk(s, "xXnN"))
        return false;
    *out = v;
    return true;
}

static void flatten(json_t *out, const char *prefix, const json_t *obj, int depth)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        if (json_object_size(out) >= FLAT_MAX)
            return;
        char name[SPEC_SCRIPT_HPARAM_KEY + 2];
        int n = snprintf(name, sizeof(name), "%s%s%s", prefix, prefix[0] ? "." : "", key);
        if (n < 0 || n > SPEC_SCRIPT_HPARAM_KEY)
            continue;
        double d;
        if (json_is_object(v) && depth < FLAT_DEPTH)
            flatten(out, name, v, depth + 1);
        else if (json_is_integer(v) || json_is_real(v))
            json_object_set(out, name, v);
        else if (json_is_string(v) && text_number(json_string_value(v), &d))
            json_object_set_new(out, name, json_real(d));
    }
}

json_t *spec_hparams_flatten(const json_t *hyperparameters)
{
    json_t *out = json_object();
    if (out && json_is_object(hyperparameters))
        flatten(out, "", hyperparameters, 1);
    return out;
}

int64_t spec_script_max_steps(const spec_t *s)
{
    const json_t *v = spec_is_script(s) ? json_object_get(s->script.hyperparameters, "max_steps") : NULL;
    return json_is_integer(v) && json_integer_value(v) > 0 ? (int64_t)json_integer_value(v) : 0;
}

json_t *spec_hparams_flat(const spec_t *s)
{
    if (spec_is_script(s))
        return spec_hparams_flatten(s->script.hyperparameters);
    json_t *all = spec_to_json(s);
    json_t *hp = json_incref(json_object_get(all, "hyperparameters"));
    json_decref(all);
    return hp ? hp : json_object();
}
