/* test_script.c - script jobs in the spec: the example of issue 26 parsed, normalised and parsed
 * again; every rule of entry_point, source, python, free-form hyperparameters (SageMaker's
 * limits), data.channels (and the engine's train/val/validation), environment (kiln's names
 * refused, naming them), distribution.torch_distributed against slots_per_node, the engine fields
 * a script may not use and the script fields an engine job may not; SageMaker's capitalised
 * metric definitions; stopping.grace_period_s; the flat hyperparameters search indexes. */
#include "spec/spec.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIGEST "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

/* The example spec of issue 26. */
static const char *issue_example =
    "{\"name\": \"ddp-mnist\", \"entry_point\": \"train.py\", \"source\": \"code:sha256:" DIGEST "\","
    " \"hyperparameters\": {\"epochs\": 3, \"batch-size\": 64, \"lr\": 0.01, \"model\": {\"depth\": 4}},"
    " \"data\": {\"channels\": {\"train\": \"/data/mnist/train\", \"validation\": \"/data/mnist/val\"}},"
    " \"environment\": {\"MY_FLAG\": \"1\"},"
    " \"resources\": {\"nodes\": 2, \"slots_per_node\": 1, \"slot_type\": \"cpu\", \"memory_limit_mb\": 4096},"
    " \"distribution\": {\"torch_distributed\": {\"enabled\": true, \"nproc_per_node\": 1}},"
    " \"checkpoint\": {\"every_steps\": 0}, \"retry\": {\"max_attempts\": 3},"
    " \"metric_definitions\": [{\"name\": \"val_acc\", \"regex\": \"val_acc=([0-9.]+)\"}]}";

static void parse_ok(const char *json, spec_t *s)
{
    kiln_err_t err;
    cr_assert_eq(spec_parse_string(json, s, &err), 0, "%s: %s (hint: %s)", err.field, err.message, err.hint);
}

Test(script, the_issue_example_parses_and_round_trips)
{
    spec_t s;
    parse_ok(issue_example, &s);
    cr_assert(spec_is_script(&s));
    cr_assert_str_eq(s.script.entry_point, "train.py");
    cr_assert_str_eq(s.script.source, "code:sha256:" DIGEST);
    cr_assert_eq(json_integer_value(json_object_get(s.script.hyperparameters, "epochs")), 3,
                 "epochs is the script's, not the engine's \"eps\"");
    cr_assert_eq(s.data.n_channels, 2);
    cr_assert_str_eq(s.data.channels[1].name, "validation");
    cr_assert_str_eq(s.data.channels[1].path, "/data/mnist/val");
    cr_assert_str_eq(json_string_value(json_object_get(s.script.environment, "MY_FLAG")), "1");
    cr_assert_eq(s.res.memory_limit_mb, 4096);
    cr_assert(s.script.torch_distributed);
    cr_assert_eq(s.script.nproc_per_node, 1);
    cr_assert_eq(s.max_attempts, 3);
    cr_assert_eq(spec_world_size(&s), 2);
    json_t *norm = spec_to_json(&s);
    cr_assert_null(json_object_get(norm, "model"), "a script job's normal form has no model");
    cr_assert_str_eq(json_string_value(json_object_get(norm, "entry_point")), "train.py");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(json_object_get(norm, "hyperparameters"), "model"),
                                                    "depth")), 4, "hyperparameters are kept as given");
    cr_assert_null(json_object_get(json_object_get(norm, "checkpoint"), "keep_last"));
    char *text = json_dumps(norm, JSON_COMPACT);
    spec_t again;
    parse_ok(text, &again);
    json_t *norm2 = spec_to_json(&again);
    cr_assert(json_equal(norm, norm2), "the normal form parses to itself: %s", text);
    free(text);
    json_decref(norm);
    json_decref(norm2);
    spec_deinit(&again);
    spec_deinit(&s);
}

Test(script, a_directory_source_and_a_python)
{
    spec_t s;
    parse_ok("{\"entry_point\": \"./scripts//train.sh\", \"source\": \"file:///data/code/../code/proj\","
             " \"python\": \"/data/venvs/x/bin/../bin/python\"}", &s);
    cr_assert_str_eq(s.script.entry_point, "scripts/train.sh", "normalised");
    cr_assert_str_eq(s.script.source, "/data/code/proj");
    cr_assert_str_eq(s.script.python, "/data/venvs/x/bin/python");
    cr_assert_eq(s.data.n_channels, 0);
    cr_assert(s.script.torch_distributed, "torch_distributed is on by default: one rank per slot");
    spec_deinit(&s);
    parse_ok("{\"entry_point\": \"t.py\", \"source\": \"code:sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef"
             "0123456789abcdef\"}", &s);
    cr_assert_str_eq(s.script.source, "code:sha256:" DIGEST, "the digest is stored in lower case");
    spec_deinit(&s);
}

Test(script, torch_distributed_and_slots_per_node)
{
    spec_t s;
    parse_ok("{\"entry_point\": \"t.py\", \"source\": \"/data/c\","
             " \"distribution\": {\"torch_distributed\": {\"nproc_per_node\": 4}}}", &s);
    cr_assert_eq(s.res.slots_per_node, 4, "nproc_per_node sets slots_per_node when it is not given");
    cr_assert_eq(s.script.nproc_per_node, 4);
    spec_deinit(&s);
    parse_ok("{\"entry_point\": \"t.py\", \"source\": \"/data/c\", \"resources\": {\"slots_per_node\": 2}}", &s);
    cr_assert_eq(s.script.nproc_per_node, 2, "nproc_per_node follows slots_per_node");
    spec_deinit(&s);
    parse_ok("{\"entry_point\": \"t.py\", \"source\": \"/data/c\", \"resources\": {\"slots_per_node\": 4},"
             " \"distribution\": {\"torch_distributed\": {\"enabled\": false}}}", &s);
    cr_assert_not(s.script.torch_distributed);
    cr_assert_eq(s.script.nproc_per_node, 1, "without torch_distributed: one process per node");
    cr_assert_eq(s.res.slots_per_node, 4, "which owns the node's slots");
    spec_deinit(&s);
}

/* A script job pauses at stopping.max_steps (its ranks' KILN_PAUSE_AT_STEP) within its
 * hyperparameters.max_steps, as a hyperband trial at its rung does; the normalised spec keeps it. */
Test(script, pauses_at_stopping_max_steps_within_its_max_steps)
{
    spec_t s;
    parse_ok("{\"entry_point\": \"t.py\", \"source\": \"/data/c\", \"hyperparameters\": {\"max_steps\": 12},"
             " \"stopping\": {\"max_steps\": 4}}", &s);
    cr_assert_eq(s.pause_at_step, 4);
    cr_assert_eq(spec_script_max_steps(&s), 12);
    json_t *norm = spec_to_json(&s);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(norm, "stopping"), "max_steps")), 4);
    json_decref(norm);
    spec_deinit(&s);
    parse_ok("{\"entry_point\": \"t.py\", \"source\": \"/data/c\", \"hyperparameters\": {\"max_steps\": 12},"
             " \"stopping\": {\"max_steps\": 12}}", &s);
    cr_assert_eq(s.pause_at_step, 12, "at its last step: it simply ends there");
    spec_deinit(&s);
    parse_ok("{\"entry_point\": \"t.py\", \"source\": \"/data/c\", \"hyperparameters\": {\"max_steps\": \"x\"}}", &s);
    cr_assert_eq(spec_script_max_steps(&s), 0, "free-form: not a step count, and no pause asked");
    spec_deinit(&s);
}

Test(script, sagemaker_metric_definitions_and_grace)
{
    spec_t s;
    parse_ok("{\"entry_point\": \"t.py\", \"source\": \"/data/c\", \"stopping\": {\"grace_period_s\": 120},"
             " \"metric_definitions\": [{\"Name\": \"val_acc\", \"Regex\": \"val_acc=([0-9.]+)\"},"
             " {\"name\": \"loss\", \"Regex\": \"loss=([0-9.]+)\"}]}", &s);
    cr_assert_eq(s.n_metric_defs, 2);
    cr_assert_str_eq(s.metric_defs[0].name, "val_acc");
    cr_assert_str_eq(s.metric_defs[1].regex, "loss=([0-9.]+)");
    cr_assert_eq(s.grace_period_s, 120);
    json_t *norm = spec_to_json(&s);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(norm, "stopping"), "grace_period_s")), 120);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(norm, "metric_definitions"), 0),
                                                       "name")), "val_acc", "stored in kiln's spelling");
    json_decref(norm);
    spec_deinit(&s);
    /* the engine reads SageMaker's spelling too */
    parse_ok("{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"},"
             " \"metric_definitions\": [{\"Name\": \"acc\", \"Regex\": \"acc ([0-9.]+)\"}]}", &s);
    cr_assert_str_eq(s.metric_defs[0].name, "acc");
    spec_deinit(&s);
}

Test(script, engine_jobs_read_channels_and_validation_as_train_and_val)
{
    spec_t s;
    parse_ok("{\"model\": {\"type\": \"gpt\"}, \"data\": {\"channels\": {\"train\": \"/d/t.txt\","
             " \"validation\": \"file:///d/v.txt\"}}}", &s);
    cr_assert_str_eq(s.data.train, "/d/t.txt");
    cr_assert_str_eq(s.data.val, "/d/v.txt");
    cr_assert_eq(s.data.n_channels, 0, "an engine job's channels are its train and val");
    json_t *norm = spec_to_json(&s);
    cr_assert_null(json_object_get(json_object_get(norm, "data"), "channels"));
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(norm, "data"), "val")), "/d/v.txt");
    json_decref(norm);
    spec_deinit(&s);
    parse_ok("{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/d/t.txt\", \"validation\": \"/d/v.txt\"}}", &s);
    cr_assert_str_eq(s.data.val, "/d/v.txt", "data.validation is data.val");
    spec_deinit(&s);
    parse_ok("{\"model\": {\"type\": \"gpt\"}, \"data\": {\"channels\": {\"train\": \"/d/t.txt\", \"val\": \"/d/v.txt\"}}}",
             &s);
    cr_assert_str_eq(s.data.val, "/d/v.txt");
    spec_deinit(&s);
}

Test(script, flat_hyperparameters_for_search)
{
    spec_t s;
    parse_ok("{\"entry_point\": \"t.py\", \"source\": \"/data/c\", \"hyperparameters\": {\"epochs\": 3, \"lr\": \"0.01\","
             " \"opt\": \"adam\", \"batch-size\": 64, \"model\": {\"depth\": 4, \"act\": \"relu\", \"x\": {\"y\": 1.5}},"
             " \"layers\": [1, 2], \"amp\": true, \"hexy\": \"0x10\", \"inf\": \"inf\"}}", &s);
    json_t *flat = spec_hparams_flat(&s);
    cr_assert_eq(json_integer_value(json_object_get(flat, "epochs")), 3);
    cr_assert_float_eq(json_number_value(json_object_get(flat, "lr")), 0.01, 1e-15, "numeric text is a number");
    cr_assert_eq(json_integer_value(json_object_get(flat, "batch-size")), 64);
    cr_assert_eq(json_integer_value(json_object_get(flat, "model.depth")), 4);
    cr_assert_float_eq(json_number_value(json_object_get(flat, "model.x.y")), 1.5, 0);
    cr_assert_null(json_object_get(flat, "opt"));
    cr_assert_null(json_object_get(flat, "model.act"));
    cr_assert_null(json_object_get(flat, "layers"));
    cr_assert_null(json_object_get(flat, "amp"));
    cr_assert_null(json_object_get(flat, "hexy"));
    cr_assert_null(json_object_get(flat, "inf"));
    cr_assert_eq(json_object_size(flat), 5);
    json_decref(flat);
    spec_deinit(&s);
    parse_ok("{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"}, \"hyperparameters\": {\"lr\": 0.002}}",
             &s);
    flat = spec_hparams_flat(&s);
    cr_assert_float_eq(json_number_value(json_object_get(flat, "lr")), 0.002, 1e-15);
    cr_assert_eq(json_integer_value(json_object_get(flat, "max_steps")), 100, "an engine job's defaults too");
    json_decref(flat);
    spec_deinit(&s);
}

/* ---- refusals ---------------------------------------------------------------------------------- */

typedef struct bad {
    const char *json;
    const char *field;
    const char *needle;
} bad_t;

#define S "\"entry_point\": \"t.py\", \"source\": \"/data/c\""

static char *big_object(int keys, int value_len)
{
    size_t cap = (size_t)keys * (size_t)(value_len + 40) + 256;
    char *p = malloc(cap);
    size_t o = (size_t)snprintf(p, cap, "{" S ", \"hyperparameters\": {");
    for (int i = 0; i < keys; i++) {
        o += (size_t)snprintf(p + o, cap - o, "%s\"k%d\": \"", i ? ", " : "", i);
        memset(p + o, 'v', (size_t)value_len);
        o += (size_t)value_len;
        o += (size_t)snprintf(p + o, cap - o, "\"");
    }
    snprintf(p + o, cap - o, "}}");
    return p;
}

Test(script, every_rule_names_the_field)
{
    static const bad_t cases[] = {
        /* one or the other */
        {"{\"entry_point\": \"t.py\", \"source\": \"/data/c\", \"model\": {\"type\": \"gpt\"}}", "entry_point",
         "either model (kiln's engine trains it) or entry_point (your own script), not both"},
        {"{\"name\": \"x\"}", "model", "names neither"},
        /* entry_point */
        {"{\"entry_point\": 3, \"source\": \"/data/c\"}", "entry_point", "must be a string"},
        {"{\"entry_point\": \"\", \"source\": \"/data/c\"}", "entry_point", "is empty"},
        {"{\"entry_point\": \"/abs/t.py\", \"source\": \"/data/c\"}", "entry_point", "not an absolute path"},
        {"{\"entry_point\": \"../t.py\", \"source\": \"/data/c\"}", "entry_point", "no \"..\""},
        {"{\"entry_point\": \"a/../../t.py\", \"source\": \"/data/c\"}", "entry_point", "no \"..\""},
        {"{\"entry_point\": \"scripts/\", \"source\": \"/data/c\"}", "entry_point", "names a directory"},
        {"{\"entry_point\": \"t\\n.py\", \"source\": \"/data/c\"}", "entry_point", "control characters"},
        /* source */
        {"{\"entry_point\": \"t.py\"}", "source", "needs a source"},
        {"{\"entry_point\": \"t.py\", \"source\": \"code:sha256:abc\"}", "source", "64 hex digits"},
        {"{\"entry_point\": \"t.py\", \"source\": \"code:md5:" DIGEST "\"}", "source", "64 hex digits"},
        {"{\"entry_point\": \"t.py\", \"source\": \"relative/dir\"}", "source", "absolute directory"},
        {"{\"entry_point\": \"t.py\", \"source\": \"s3://bucket/code\"}", "source", "unsupported URL scheme"},
        /* python */
        {"{" S ", \"python\": \"python3\"}", "python", "absolute path"},
        /* hyperparameters */
        {"{" S ", \"hyperparameters\": [1]}", "hyperparameters", "must be an object"},
        {"{" S ", \"hyperparameters\": {\"\": 1}}", "hyperparameters.", "1 to 256 characters"},
        /* data.channels */
        {"{" S ", \"data\": {\"train\": \"/data/x\"}}", "data.train", "data.channels"},
        {"{" S ", \"data\": {\"channels\": [\"/data/x\"]}}", "data.channels", "must be an object"},
        {"{" S ", \"data\": {\"channels\": {\"tr ain\": \"/data/x\"}}}", "data.channels.tr ain", "letters, digits"},
        {"{" S ", \"data\": {\"channels\": {\"train\": \"data/x\"}}}", "data.channels.train", "absolute path"},
        {"{" S ", \"data\": {\"channels\": {\"train\": 5}}}", "data.channels.train", "must be a path"},
        {"{" S ", \"data\": {\"channels\": {\"train\": \"/a\", \"Train\": \"/b\"}}}", "data.channels.Train",
         "differ only in case"},
        {"{" S ", \"data\": {\"channels\": {\"train\": \"hdfs://x/y\"}}}", "data.channels.train", "unsupported URL"},
        /* environment */
        {"{" S ", \"environment\": {\"RANK\": \"3\"}}", "environment.RANK", "environment.RANK is set by kiln (torchrun's)"},
        {"{" S ", \"environment\": {\"MASTER_PORT\": \"1\"}}", "environment.MASTER_PORT", "torchrun's"},
        {"{" S ", \"environment\": {\"TORCHELASTIC_RUN_ID\": \"1\"}}", "environment.TORCHELASTIC_RUN_ID", "torchrun's"},
        {"{" S ", \"environment\": {\"OMP_NUM_THREADS\": \"8\"}}", "environment.OMP_NUM_THREADS", "set by kiln"},
        {"{" S ", \"environment\": {\"CUDA_VISIBLE_DEVICES\": \"0\"}}", "environment.CUDA_VISIBLE_DEVICES", "set by kiln"},
        {"{" S ", \"environment\": {\"SM_MODEL_DIR\": \"/x\"}}", "environment.SM_MODEL_DIR", "SageMaker's"},
        {"{" S ", \"environment\": {\"SM_ANYTHING\": \"/x\"}}", "environment.SM_ANYTHING", "every SM_* name"},
        {"{" S ", \"environment\": {\"KILN_SPEC\": \"/x\"}}", "environment.KILN_SPEC", "every KILN_* name"},
        {"{" S ", \"environment\": {\"LD_PRELOAD\": \"/x.so\"}}", "environment.LD_PRELOAD", "loader variable"},
        {"{" S ", \"environment\": {\"1X\": \"a\"}}", "environment.1X", "not a variable name"},
        {"{" S ", \"environment\": {\"A-B\": \"a\"}}", "environment.A-B", "not a variable name"},
        {"{" S ", \"environment\": {\"A\": 1}}", "environment.A", "must be a string"},
        /* distribution */
        {"{" S ", \"distribution\": {\"data_parallel\": {\"enabled\": true}}}", "distribution.data_parallel",
         "a script job's own code decides"},
        {"{" S ", \"distribution\": {\"model_parallel\": {\"partitions\": 2}}}", "distribution.model_parallel",
         "kiln's engine"},
        {"{" S ", \"distribution\": {\"mixed_precision\": \"bf16\"}}", "distribution.mixed_precision", "kiln's engine"},
        {"{" S ", \"resources\": {\"slots_per_node\": 2}, \"distribution\": {\"torch_distributed\": {\"nproc_per_node\": 4}}}",
         "distribution.torch_distributed.nproc_per_node", "must equal resources.slots_per_node (2)"},
        {"{" S ", \"distribution\": {\"torch_distributed\": {\"enabled\": false, \"nproc_per_node\": 2}}}",
         "distribution.torch_distributed.nproc_per_node", "one process per node"},
        {"{" S ", \"distribution\": {\"torch_distributed\": {\"enabled\": \"yes\"}}}",
         "distribution.torch_distributed.enabled", "true or false"},
        {"{" S ", \"distribution\": {\"torch_distributed\": {\"nproc\": 2}}}", "distribution.torch_distributed.nproc",
         "unknown field"},
        /* the engine's fields */
        {"{" S ", \"checkpoint\": {\"every_steps\": 100}}", "checkpoint.every_steps", "decides itself when to checkpoint"},
        {"{" S ", \"checkpoint\": {\"keep_last\": 2}}", "checkpoint.keep_last", "kiln's engine's"},
        {"{" S ", \"resources\": {\"device\": \"cuda\", \"slot_type\": \"gpu\"}}", "resources.device",
         "chooses its own device"},
        /* stopping */
        {"{" S ", \"stopping\": {\"grace_period_s\": 3601}}", "stopping.grace_period_s", "between 0 and 3600"},
        {"{" S ", \"stopping\": {\"grace_period_s\": -1}}", "stopping.grace_period_s", "between 0 and 3600"},
        /* a pause needs the step count the script trains to, and lies within it */
        {"{" S ", \"stopping\": {\"max_steps\": 10}}", "stopping.max_steps", "no whole-number hyperparameters.max_steps"},
        {"{" S ", \"hyperparameters\": {\"max_steps\": \"200\"}, \"stopping\": {\"max_steps\": 10}}",
         "stopping.max_steps", "no whole-number hyperparameters.max_steps"},
        {"{" S ", \"hyperparameters\": {\"max_steps\": 8}, \"stopping\": {\"max_steps\": 10}}", "stopping.max_steps",
         "past hyperparameters.max_steps (8)"},
        /* SageMaker's spelling beside kiln's */
        {"{" S ", \"metric_definitions\": [{\"name\": \"a\", \"Name\": \"b\", \"regex\": \"a=([0-9]+)\"}]}",
         "metric_definitions[0].Name", "name the same thing"},
        /* a script's fields on an engine job */
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"}, \"source\": \"/data/c\"}", "source",
         "applies to a script job"},
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"}, \"environment\": {\"A\": \"1\"}}",
         "environment", "applies to a script job"},
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"}, \"python\": \"/usr/bin/python3\"}", "python",
         "applies to a script job"},
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"},"
         " \"distribution\": {\"torch_distributed\": {\"enabled\": true}}}", "distribution.torch_distributed",
         "applies to a script job"},
        /* the engine keeps its validated hyperparameters and its two channels */
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"}, \"hyperparameters\": {\"epochs\": 3}}",
         "hyperparameters.epochs", "unknown field"},
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"channels\": {\"train\": \"/x.txt\", \"test\": \"/y.txt\"}}}",
         "data.channels.test", "kiln's engine has no channel"},
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\", \"channels\": {\"train\": \"/y.txt\"}}}",
         "data.channels.train", "name the same input"},
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"channels\": {\"train\": \"/x\", \"val\": \"/y\", \"validation\": \"/z\"}}}",
         "data.channels.validation", "name the same input"},
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\", \"val\": \"/y\", \"validation\": \"/z\"}}",
         "data.validation", "name the same thing"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        spec_t s;
        kiln_err_t err;
        int rc = spec_parse_string(cases[i].json, &s, &err);
        cr_assert_eq(rc, KILN_EINVAL, "case %zu (%s) accepted", i, cases[i].json);
        cr_assert_str_eq(err.field, cases[i].field, "case %zu: field \"%s\" (%s)", i, err.field, err.message);
        cr_assert(strstr(err.message, cases[i].needle), "case %zu: message \"%s\" lacks \"%s\"", i, err.message,
                  cases[i].needle);
    }
    /* the hints say what to do */
    spec_t s;
    kiln_err_t err;
    cr_assert_eq(spec_parse_string("{\"entry_point\": \"t.py\"}", &s, &err), KILN_EINVAL);
    cr_assert(strstr(err.hint, "kiln code push"), "%s", err.hint);
    cr_assert_eq(spec_parse_string("{" S ", \"environment\": {\"WORLD_SIZE\": \"3\"}}", &s, &err), KILN_EINVAL);
    cr_assert(strstr(err.hint, "kiln sets it"), "%s", err.hint);
}

Test(script, sagemaker_limits_on_hyperparameters_and_environment)
{
    spec_t s;
    kiln_err_t err;
    char *ok = big_object(100, 2498); /* "vvv...": 2,500 characters as JSON */
    cr_assert_eq(spec_parse_string(ok, &s, &err), 0, "%s", err.message);
    spec_deinit(&s);
    free(ok);
    char *many = big_object(101, 1);
    cr_assert_eq(spec_parse_string(many, &s, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "hyperparameters");
    cr_assert(strstr(err.message, "at most 100"), "%s", err.message);
    free(many);
    char *big = big_object(1, 2499);
    cr_assert_eq(spec_parse_string(big, &s, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "hyperparameters.k0");
    cr_assert(strstr(err.message, "2501 characters as JSON; a value may have at most 2500"), "%s", err.message);
    free(big);
    char key[300];
    memset(key, 'k', 257);
    key[257] = '\0';
    char json[1024];
    snprintf(json, sizeof(json), "{" S ", \"hyperparameters\": {\"%s\": 1}}", key);
    cr_assert_eq(spec_parse_string(json, &s, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "1 to 256 characters"), "%s", err.message);
    key[256] = '\0';
    snprintf(json, sizeof(json), "{" S ", \"hyperparameters\": {\"%s\": 1}}", key);
    cr_assert_eq(spec_parse_string(json, &s, &err), 0, "a key of 256 characters: %s", err.message);
    spec_deinit(&s);

    /* environment: 100 variables, values of 512 characters */
    size_t cap = 100 * 600 + 200, o = 0;
    char *env = malloc(cap);
    o += (size_t)snprintf(env + o, cap - o, "{" S ", \"environment\": {");
    for (int i = 0; i < 100; i++) {
        o += (size_t)snprintf(env + o, cap - o, "%s\"V%d\": \"", i ? ", " : "", i);
        memset(env + o, 'x', 512);
        o += 512;
        env[o++] = '"';
    }
    snprintf(env + o, cap - o, "}}");
    cr_assert_eq(spec_parse_string(env, &s, &err), 0, "%s", err.message);
    cr_assert_eq(json_object_size(s.script.environment), 100);
    spec_deinit(&s);
    /* one more variable; one character more */
    char *more = malloc(cap + 64);
    snprintf(more, cap + 64, "%.*s, \"V100\": \"x\"}}", (int)(strlen(env) - 2), env);
    cr_assert_eq(spec_parse_string(more, &s, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "environment");
    free(more);
    snprintf(json, sizeof(json), "{" S ", \"environment\": {\"A\": \"%0513d\"}}", 0);
    cr_assert_eq(spec_parse_string(json, &s, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "at most 512"), "%s", err.message);
    free(env);

    /* channels: at most 20 */
    o = (size_t)snprintf(json, sizeof(json), "{" S ", \"data\": {\"channels\": {");
    for (int i = 0; i < 21; i++)
        o += (size_t)snprintf(json + o, sizeof(json) - o, "%s\"c%d\": \"/d/%d\"", i ? ", " : "", i, i);
    snprintf(json + o, sizeof(json) - o, "}}}");
    cr_assert_eq(spec_parse_string(json, &s, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "data.channels");
    cr_assert(strstr(err.message, "at most 20"), "%s", err.message);
}

Test(script, allowed_loader_and_path_variables)
{
    spec_t s;
    parse_ok("{" S ", \"environment\": {\"LD_LIBRARY_PATH\": \"/data/venv/lib\", \"PATH\": \"/data/venv/bin:/usr/bin\","
             " \"PYTHONPATH\": \"/data/lib\", \"_X\": \"\"}}", &s);
    cr_assert_eq(json_object_size(s.script.environment), 4);
    spec_deinit(&s);
}

Test(script, source_digest)
{
    char d[KILN_SHA256_HEX];
    cr_assert(spec_source_digest("code:sha256:" DIGEST, d));
    cr_assert_str_eq(d, DIGEST);
    cr_assert_not(spec_source_digest("code:sha256:" DIGEST "0", d));
    cr_assert_not(spec_source_digest("code:sha256:g123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", d));
    cr_assert_not(spec_source_digest("/data/code", d));
    cr_assert_not(spec_source_digest(NULL, d));
}
