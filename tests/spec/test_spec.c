/* test_spec.c - job spec parsing: defaults, normalisation round trip, and errors that name the
 * offending field for every kind of mistake a user makes. */
#include "spec/spec.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

static const char *good =
    "{\"name\": \"gpt-shakespeare\", \"model\": {\"type\": \"gpt\", \"n_layer\": 2, \"n_head\": 4, \"n_embd\": 64,"
    " \"seq_len\": 32}, \"data\": {\"train\": \"file:///data/tiny.txt\"},"
    " \"hyperparameters\": {\"lr\": 1e-3, \"global_batch_size\": 8, \"max_steps\": 10},"
    " \"resources\": {\"nodes\": 2, \"slots_per_node\": 1},"
    " \"metric_definitions\": [{\"name\": \"val_loss\", \"regex\": \"val loss ([0-9.]+)\"}],"
    " \"tags\": {\"team\": \"nlp\"}, \"priority\": 5}";

Test(spec, good_spec_gets_defaults)
{
    spec_t s;
    kiln_err_t err;
    cr_assert_eq(spec_parse_string(good, &s, &err), 0, "%s (%s)", err.message, err.field);
    cr_assert_str_eq(s.name, "gpt-shakespeare");
    cr_assert_str_eq(s.data.train, "/data/tiny.txt");
    cr_assert_str_eq(s.data.format, "text");
    cr_assert_eq(s.model.vocab_size, 256);
    cr_assert_eq(s.model.padded_vocab_size, 256);
    cr_assert_eq(spec_world_size(&s), 2);
    cr_assert(s.dist.dp_enabled, "two replicas turn data parallelism on");
    cr_assert_float_eq(s.hp.beta2, 0.95, 1e-12);
    cr_assert_eq(s.ckpt_keep_last, 3);
    cr_assert_eq(s.n_metric_defs, 1);
    cr_assert_eq(s.n_tags, 1);
    cr_assert_eq(s.priority, 5);
    spec_deinit(&s);
}

Test(spec, normalised_json_round_trips)
{
    spec_t s, t;
    kiln_err_t err;
    cr_assert_eq(spec_parse_string(good, &s, &err), 0);
    json_t *j = spec_to_json(&s);
    cr_assert_not_null(j);
    cr_assert_eq(spec_parse(j, &t, &err), 0, "%s (%s)", err.message, err.field);
    json_t *k = spec_to_json(&t);
    cr_assert(json_equal(j, k), "normalised form is stable");
    char *text = json_dumps(j, 0);
    cr_assert(strstr(text, "\"max_steps\": 10"));
    free(text);
    json_decref(j);
    json_decref(k);
    spec_deinit(&s);
    spec_deinit(&t);
}

/* checkpoint.path is kept in the normalised form only when given. */
Test(spec, checkpoint_path_round_trips)
{
    spec_t s;
    kiln_err_t err;
    cr_assert_eq(spec_parse_string("{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"},"
                                   " \"checkpoint\": {\"path\": \"/mnt/shared/ckpt\"}}", &s, &err), 0, "%s", err.message);
    cr_assert_str_eq(s.ckpt_path, "/mnt/shared/ckpt");
    json_t *j = spec_to_json(&s);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "checkpoint"), "path")), "/mnt/shared/ckpt");
    json_decref(j);
    spec_deinit(&s);
    cr_assert_eq(spec_parse_string(good, &s, &err), 0);
    j = spec_to_json(&s);
    cr_assert_null(json_object_get(json_object_get(j, "checkpoint"), "path"));
    json_decref(j);
    spec_deinit(&s);
}

/* distribution.data_parallel.bucket_mb (and a pipeline's microbatches) are stored only when the
 * user set them: left out, they read back as 0 (the engine chooses them from the job) and stay
 * out of the normal form, so "chosen by kiln" is visible in the stored spec. */
Test(spec, bucket_mb_and_microbatches_are_stored_only_when_set)
{
    spec_t s, t;
    kiln_err_t err;
    cr_assert_eq(spec_parse_string(good, &s, &err), 0);
    cr_assert_float_eq(s.dist.dp_bucket_mb, 0.0, 1e-12, "a default of %g", s.dist.dp_bucket_mb);
    json_t *j = spec_to_json(&s);
    json_t *dp = json_object_get(json_object_get(j, "distribution"), "data_parallel");
    cr_assert_not_null(dp);
    cr_assert_null(json_object_get(dp, "bucket_mb"), "an unset bucket_mb is stored");
    cr_assert_eq(spec_parse(j, &t, &err), 0, "%s", err.message);
    cr_assert_float_eq(t.dist.dp_bucket_mb, 0.0, 1e-12);
    json_decref(j);
    spec_deinit(&s);
    spec_deinit(&t);
    cr_assert_eq(spec_parse_string("{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"}, "
                                   "\"distribution\": {\"data_parallel\": {\"bucket_mb\": 2.5}}}", &s, &err), 0,
                 "%s", err.message);
    j = spec_to_json(&s);
    dp = json_object_get(json_object_get(j, "distribution"), "data_parallel");
    cr_assert_float_eq(json_number_value(json_object_get(dp, "bucket_mb")), 2.5, 1e-12);
    json_decref(j);
    spec_deinit(&s);
    /* a pipeline's microbatches likewise: stored only when set */
    cr_assert_eq(spec_parse_string("{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"}, "
                                   "\"resources\": {\"slots_per_node\": 2}, "
                                   "\"distribution\": {\"model_parallel\": {\"partitions\": 2}}}", &s, &err), 0,
                 "%s", err.message);
    cr_assert_eq(s.dist.mp_microbatches, 0);
    j = spec_to_json(&s);
    cr_assert_null(json_object_get(json_object_get(json_object_get(j, "distribution"), "model_parallel"), "microbatches"));
    json_decref(j);
    spec_deinit(&s);
    /* 0 is not a size: leaving it out is how to ask for the chosen one */
    cr_assert_neq(spec_parse_string("{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"}, "
                                    "\"distribution\": {\"data_parallel\": {\"bucket_mb\": 0}}}", &s, &err), 0);
    cr_assert_str_eq(err.field, "distribution.data_parallel.bucket_mb");
}

Test(spec, absolute_paths_are_stored_normalised)
{
    spec_t s;
    kiln_err_t err;
    cr_assert_eq(spec_parse_string("{\"model\": {\"type\": \"gpt\", \"init_from\": \"/models//gpt2/./m.bin\"},"
                                   " \"data\": {\"train\": \"file:///data/../etc/shadow\", \"val\": \"/data/a/../b/v.txt\"},"
                                   " \"checkpoint\": {\"path\": \"/mnt/jobs/../../../../var/tmp/x/\"}}", &s, &err),
                 0, "%s", err.message);
    cr_assert_str_eq(s.data.train, "/etc/shadow", "what kilnd checks is where the file really is");
    cr_assert_str_eq(s.data.val, "/data/b/v.txt");
    cr_assert_str_eq(s.model.init_from, "/models/gpt2/m.bin");
    cr_assert_str_eq(s.ckpt_path, "/var/tmp/x", "no \"..\" is stored");
    json_t *j = spec_to_json(&s);
    char *text = json_dumps(j, 0);
    cr_assert_null(strstr(text, ".."), "%s", text);
    free(text);
    json_decref(j);
    spec_deinit(&s);
    /* a relative path (kiln-train on its own reads it next to the spec) stays as written */
    cr_assert_eq(spec_parse_string("{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"../data/t.txt\"}}", &s, &err),
                 0, "%s", err.message);
    cr_assert_str_eq(s.data.train, "../data/t.txt");
    spec_deinit(&s);
}

Test(spec, gpt2_vocab_is_padded)
{
    spec_t s;
    kiln_err_t err;
    cr_assert_eq(spec_parse_string("{\"model\": {\"type\": \"gpt\", \"vocab\": \"gpt2\"}, \"data\": {\"train\": \"/d/shard.bin\"}}", &s, &err), 0,
                 "%s", err.message);
    cr_assert_eq(s.model.vocab_size, 50257);
    cr_assert_eq(s.model.padded_vocab_size, 50304);
    cr_assert_str_eq(s.data.format, "tokens");
    spec_deinit(&s);
}

struct bad_case {
    const char *json;
    const char *field;
    const char *needle;
};

Test(spec, bad_specs_name_the_field)
{
    static const struct bad_case cases[] = {
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"}, \"hyperparameters\": {\"lr\": -1}}",
         "hyperparameters.lr", "greater than 0"},
        {"{\"model\": {\"type\": \"gpt\", \"n_embd\": 100, \"n_head\": 3}, \"data\": {\"train\": \"/x.txt\"}}",
         "model.n_head", "must divide"},
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"}, \"hyperparameters\": {\"learning_rate\": 1}}",
         "hyperparameters.learning_rate", "unknown field"},
        {"{\"model\": {\"type\": \"transformer\"}, \"data\": {\"train\": \"/x.txt\"}}", "model.type", "must be one of"},
        {"{\"data\": {\"train\": \"/x.txt\"}}", "model", "names neither"},
        {"{\"model\": {\"type\": \"gpt\"}}", "data", "required"},
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"s3://bucket/x\"}}", "data.train", "unsupported URL"},
        {"{\"model\": {\"type\": \"gpt\", \"n_layer\": \"four\"}, \"data\": {\"train\": \"/x.txt\"}}", "model.n_layer",
         "must be an integer"},
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"}, \"resources\": {\"nodes\": 0}}",
         "resources.nodes", "between 1"},
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"}, \"resources\": {\"nodes\": 3},"
         " \"hyperparameters\": {\"global_batch_size\": 8}}",
         "hyperparameters.global_batch_size", "divisible"},
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"}, \"resources\": {\"nodes\": 3},"
         " \"hyperparameters\": {\"global_batch_size\": 9},"
         " \"distribution\": {\"model_parallel\": {\"partitions\": 2}}}",
         "distribution.model_parallel.partitions", "must divide"},
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"}, \"resources\": {\"device\": \"cuda\"}}",
         "resources.device", "gpu"},
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"},"
         " \"metric_definitions\": [{\"name\": \"acc\", \"regex\": \"acc [0-9.]+\"}]}",
         "metric_definitions[0].regex", "capture group"},
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"}, \"tags\": {\"team\": 3}}", "tags.team",
         "must be a string"},
        /* a tag is a name others' terminals show: no escape sequence may rewrite them */
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"}, \"tags\": {\"team\": \"\\u001b]0;owned\\u0007\"}}",
         "tags.team", "control character"},
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"}, \"tags\": {\"team\": \"nlp\\u202e\"}}",
         "tags.team", "control character"},
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"}, \"tags\": {\"a\\rb\": \"x\"}}",
         "tags.a\\u000db", "control character"},
        {"{\"model\": {\"type\": \"mlp\", \"n_inputs\": 4}, \"data\": {\"train\": \"synthetic\"}}", "model.n_classes",
         "required"},
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"}, \"resources\": {\"nodes\": 2},"
         " \"distribution\": {\"data_parallel\": {\"enabled\": false}}}",
         "distribution.data_parallel.enabled", "disabled"},
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"},"
         " \"checkpoint\": {\"path\": \"ckpts\"}}", "checkpoint.path", "absolute path"},
        {"{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x.txt\"}, \"queue\": \"\"}", "queue",
         "must name a queue"},
        {"[1, 2]", "", "JSON object"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        spec_t s;
        kiln_err_t err;
        int rc = spec_parse_string(cases[i].json, &s, &err);
        cr_assert_eq(rc, KILN_EINVAL, "case %zu accepted", i);
        cr_assert_str_eq(err.field, cases[i].field, "case %zu: field \"%s\" (%s)", i, err.field, err.message);
        cr_assert(strstr(err.message, cases[i].needle), "case %zu: message \"%s\" lacks \"%s\"", i, err.message,
                  cases[i].needle);
    }
}

Test(spec, unknown_key_hints_the_nearest)
{
    spec_t s;
    kiln_err_t err;
    cr_assert_eq(spec_parse_string("{\"model\": {\"type\": \"gpt\", \"n_layers\": 2}, \"data\": {\"train\": \"/x\"}}", &s, &err),
                 KILN_EINVAL);
    cr_assert_str_eq(err.field, "model.n_layers");
    cr_assert(strstr(err.hint, "n_layer"), "hint: %s", err.hint);
}

Test(spec, syntax_error_reports_position)
{
    spec_t s;
    kiln_err_t err;
    cr_assert_eq(spec_parse_string("{\"model\": {\"type\": \"gpt\",\n}", &s, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "line 2"), "%s", err.message);
}

/* The plan's JSON text must hold an object, as the plan itself must: "[1, 2]" was accepted at
 * submission and then refused when the stored (normalised) spec was read again, by kiln-train.
 * Found by fuzz/spec_json's round trip. */
Test(spec, partition_plan_text_must_hold_an_object)
{
    const char *texts[] = {"[1, 2]", "[]", "[{\\\"stages\\\": [[0, 1], [2, 3]]}]"};
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        char j[512];
        snprintf(j, sizeof j,
                 "{\"model\": {\"type\": \"gpt\", \"n_layer\": 2}, \"data\": {\"train\": \"/x\"},"
                 " \"resources\": {\"nodes\": 2}, \"distribution\": {\"model_parallel\": {\"partitions\": 2,"
                 " \"partition_plan\": \"%s\"}}}",
                 texts[i]);
        spec_t s;
        kiln_err_t err;
        cr_assert_eq(spec_parse_string(j, &s, &err), KILN_EINVAL, "accepted plan text %s", texts[i]);
        cr_assert_str_eq(err.field, "distribution.model_parallel.partition_plan");
        cr_assert(strstr(err.message, "must be an object"), "%s", err.message);
    }
}

Test(spec, partition_plan_accepts_object_or_text)
{
    spec_t s;
    kiln_err_t err;
    const char *j = "{\"model\": {\"type\": \"gpt\", \"n_layer\": 2}, \"data\": {\"train\": \"/x\"},"
                    " \"resources\": {\"nodes\": 2}, \"hyperparameters\": {\"global_batch_size\": 4},"
                    " \"distribution\": {\"model_parallel\": {\"partitions\": 2, \"microbatches\": 2,"
                    " \"partition_plan\": \"{\\\"stages\\\": [[0, 1], [2, 3]]}\"}}}";
    cr_assert_eq(spec_parse_string(j, &s, &err), 0, "%s (%s)", err.message, err.field);
    cr_assert_not_null(s.dist.mp_partition_plan);
    cr_assert(!s.dist.mp_auto_partition, "a given plan turns automatic partitioning off");
    cr_assert_eq(spec_dp_replicas(&s), 1);
    spec_deinit(&s);
}

Test(spec, missing_file_is_reported)
{
    spec_t s;
    kiln_err_t err;
    cr_assert_eq(spec_load_file("/nonexistent/job.json", &s, &err), KILN_ENOTFOUND);
    cr_assert(strstr(err.message, "/nonexistent/job.json"));
}

/* What the engine cannot run is a 400 at submission, naming the field. */
Test(spec, combinations_the_engine_cannot_run_are_refused)
{
    static const struct {
        const char *json, *field, *needle;
    } cases[] = {
        {"{\"name\": \"m\", \"model\": {\"type\": \"mlp\", \"n_inputs\": 4, \"n_classes\": 2}, "
         "\"data\": {\"train\": \"synthetic\"}, \"distribution\": {\"mixed_precision\": \"bf16\"}}",
         "distribution.mixed_precision", "applies to the gpt model"},
        {"{\"name\": \"m\", \"model\": {\"type\": \"mlp\", \"n_inputs\": 4, \"n_classes\": 2}, "
         "\"data\": {\"train\": \"synthetic\"}, \"distribution\": {\"activation_checkpointing\": true}}",
         "distribution.activation_checkpointing", "applies to the gpt model"},
        {"{\"name\": \"p\", \"model\": {\"type\": \"gpt\", \"n_layer\": 2}, \"data\": {\"train\": \"/d\"}, "
         "\"resources\": {\"nodes\": 2, \"slot_type\": \"gpu\"}, "
         "\"distribution\": {\"model_parallel\": {\"partitions\": 2}}}",
         "distribution.model_parallel.partitions", "host memory"},
        {"{\"name\": \"z\", \"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/d\"}, "
         "\"resources\": {\"nodes\": 2, \"slot_type\": \"gpu\", \"device\": \"cuda\"}, "
         "\"distribution\": {\"data_parallel\": {\"shard_optimizer_state\": true}}}",
         "distribution.data_parallel.shard_optimizer_state", "gpu slots"},
        {"{\"name\": \"g\", \"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/d\"}, "
         "\"resources\": {\"nodes\": 2, \"slot_type\": \"gpu\", \"device\": \"cuda\"}, "
         "\"distribution\": {\"data_parallel\": {\"gradient_dtype\": \"bf16\"}}}",
         "distribution.data_parallel.gradient_dtype", "GPU replicas reduce their gradients in fp32"},
        {"{\"name\": \"g\", \"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/d\"}, "
         "\"resources\": {\"nodes\": 2}, \"distribution\": {\"data_parallel\": {\"gradient_dtype\": \"fp16\"}}}",
         "distribution.data_parallel.gradient_dtype", "must be one of \"fp32\", \"bf16\" (got \"fp16\")"},
        /* a cloud instance type where kiln takes a slot type: the choices, not its length */
        {"{\"name\": \"g\", \"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/d\"}, "
         "\"resources\": {\"slot_type\": \"ml.m5.xlarge\"}}",
         "resources.slot_type", "must be one of \"cpu\", \"gpu\" (got \"ml.m5.xlarge\")"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        spec_t s;
        kiln_err_t err;
        cr_assert_eq(spec_parse_string(cases[i].json, &s, &err), KILN_EINVAL, "case %zu accepted", i);
        cr_assert_str_eq(err.field, cases[i].field, "case %zu: %s", i, err.message);
        cr_assert(strstr(err.message, cases[i].needle), "case %zu: %s", i, err.message);
        cr_assert_eq(kiln_status_http(err.status), 400);
    }
    /* the same on cpu slots, or for the gpt, runs */
    spec_t s;
    kiln_err_t err;
    cr_assert_eq(spec_parse_string("{\"name\": \"ok\", \"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/d\"}, "
                                   "\"resources\": {\"nodes\": 4}, \"distribution\": {\"mixed_precision\": \"bf16\", "
                                   "\"activation_checkpointing\": true, \"data_parallel\": {\"shard_optimizer_state\": true, "
                                   "\"gradient_dtype\": \"bf16\"}, \"model_parallel\": {\"partitions\": 2}}}", &s, &err),
                 0, "%s: %s", err.field, err.message);
    cr_assert_str_eq(s.dist.dp_gradient_dtype, "bf16");
    spec_deinit(&s);
    /* fp32 unless asked, and in the normal form either way */
    cr_assert_eq(spec_parse_string("{\"name\": \"ok\", \"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/d\"}, "
                                   "\"resources\": {\"nodes\": 2, \"slot_type\": \"gpu\"}}", &s, &err),
                 0, "%s: %s", err.field, err.message);
    cr_assert_str_eq(s.dist.dp_gradient_dtype, "fp32");
    json_t *norm = spec_to_json(&s);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(json_object_get(norm, "distribution"),
                                                                       "data_parallel"), "gradient_dtype")), "fp32");
    json_decref(norm);
    spec_deinit(&s);
}

/* What kilnd accepts, kiln-train accepts: the normal form a spec is stored in (and the agent
 * hands to kiln-train) passes the same parser again and normalises to itself. Tricky paths and
 * file URLs either round-trip or are refused at once, naming the field. */
Test(spec, whatever_parses_its_normal_form_parses_again)
{
    static const struct {
        const char *train;
        const char *stored;   /* NULL: refused */
    } cases[] = {
        {"file:///data/x.txt", "/data/x.txt"},
        {"file:////data//x.txt", "/data/x.txt"},
        {"file:///a://b.txt", "/a:/b.txt"},
        {"/file://x.txt", NULL},
        {"file://://x.txt", NULL},
        {"file://", NULL},
        {"file://host/x.txt", NULL},
        {"file://file:///x.txt", NULL},
        {"s3://bucket/x.txt", NULL},
        {"://x.txt", NULL},
        {"", NULL},
        {"file:///", "/"},
        {"data/t.txt", "data/t.txt"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *in = json_pack("{s:{s:s}, s:{s:s}}", "model", "type", "gpt", "data", "train", cases[i].train);
        spec_t s, t;
        kiln_err_t err;
        int rc = spec_parse(in, &s, &err);
        json_decref(in);
        if (!cases[i].stored) {
            cr_assert_eq(rc, KILN_EINVAL, "\"%s\" was accepted as \"%s\"", cases[i].train, rc ? "" : s.data.train);
            cr_assert_str_eq(err.field, "data.train", "\"%s\": %s", cases[i].train, err.message);
            continue;
        }
        cr_assert_eq(rc, 0, "\"%s\": %s (%s)", cases[i].train, err.message, err.field);
        cr_assert_str_eq(s.data.train, cases[i].stored, "\"%s\"", cases[i].train);
        json_t *j = spec_to_json(&s);
        cr_assert_eq(spec_parse(j, &t, &err), 0, "the normal form of \"%s\" is refused: %s", cases[i].train, err.message);
        json_t *k = spec_to_json(&t);
        cr_assert(json_equal(j, k), "the normal form of \"%s\" changes when parsed again", cases[i].train);
        json_decref(j);
        json_decref(k);
        spec_deinit(&s);
        spec_deinit(&t);
    }
}

/* model.init_from "job:<id>": another job's model, kept as a lower-case id; anything else after
 * "job:" is refused naming the field; an mlp has nothing to start from. */
Test(spec, init_from_names_a_job_or_a_file)
{
    spec_t s;
    kiln_err_t err;
    cr_assert_eq(spec_parse_string("{\"model\": {\"type\": \"gpt\", \"init_from\": "
                                   "\"job:0B6C2F0E-1D3A-4C55-9D7E-2F1E9A7B5C11\"}, \"data\": {\"train\": \"/d/t.txt\"}}",
                                   &s, &err), 0, "%s", err.message);
    cr_assert_str_eq(s.model.init_from, "job:0b6c2f0e-1d3a-4c55-9d7e-2f1e9a7b5c11");
    json_t *j = spec_to_json(&s);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "model"), "init_from")),
                     "job:0b6c2f0e-1d3a-4c55-9d7e-2f1e9a7b5c11");
    json_decref(j);
    spec_deinit(&s);
    const char *bad[] = {"job:", "job:123", "job:0b6c2f0e-1d3a-4c55-9d7e-2f1e9a7b5c1", "job:../../etc/passwd",
                         "job:0b6c2f0e_1d3a_4c55_9d7e_2f1e9a7b5c11"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, "{\"model\": {\"type\": \"gpt\", \"init_from\": \"%s\"}, \"data\": {\"train\": "
                 "\"/d/t.txt\"}}", bad[i]);
        cr_assert_eq(spec_parse_string(text, &s, &err), KILN_EINVAL, "%s", bad[i]);
        cr_assert_str_eq(err.field, "model.init_from");
        cr_assert(strstr(err.message, "names no job"), "%s", err.message);
    }
    cr_assert_eq(spec_parse_string("{\"model\": {\"type\": \"mlp\", \"n_inputs\": 4, \"n_classes\": 2, \"init_from\": "
                                   "\"/d/m.bin\"}, \"data\": {\"train\": \"synthetic\"}}", &s, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "model.init_from");
}

/* A model section holds the fields of its kind (the capability table's row): another kind's field
 * is refused naming it, not silently ignored; every model's example has a normal form that
 * parses again to itself and names only its own fields. */
Test(spec, a_model_reads_only_the_fields_of_its_kind)
{
    static const struct {
        const char *model, *field;
    } cases[] = {
        {"{\"type\": \"mlp\", \"n_inputs\": 4, \"n_classes\": 2, \"n_layer\": 3}", "model.n_layer"},
        {"{\"type\": \"mlp\", \"n_inputs\": 4, \"n_classes\": 2, \"vocab\": \"gpt2\"}", "model.vocab"},
        {"{\"type\": \"gpt\", \"hidden\": [8]}", "model.hidden"},
        {"{\"type\": \"gpt\", \"n_classes\": 3}", "model.n_classes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *in = json_pack("{s:o, s:{s:s}}", "model", json_loads(cases[i].model, 0, NULL), "data", "train",
                               strstr(cases[i].model, "mlp") ? "synthetic" : "/d.txt");
        spec_t s;
        kiln_err_t err;
        cr_assert_eq(spec_parse(in, &s, &err), KILN_EINVAL, "%s was accepted", cases[i].model);
        cr_assert_str_eq(err.field, cases[i].field, "%s: %s", cases[i].model, err.message);
        cr_assert(strstr(err.message, "does not apply"), "%s", err.message);
        json_decref(in);
    }
    for (int m = 0; spec_models[m]; m++) {
        const char *data = NULL;
        for (int c = SPEC_CAP_TEXT; c <= SPEC_CAP_SYNTHETIC && !data; c++)
            if (spec_model_has(spec_models[m], (spec_cap_t)c))
                data = spec_cap_ask((spec_cap_t)c);
        json_t *in = json_loads(data, 0, NULL);
        json_object_set_new(in, "model", json_loads(spec_model_example(spec_models[m]), 0, NULL));
        spec_t s, t;
        kiln_err_t err;
        cr_assert_eq(spec_parse(in, &s, &err), 0, "%s's example: %s: %s", spec_models[m], err.field, err.message);
        json_t *j = spec_to_json(&s);
        const char *key;
        json_t *v;
        json_object_foreach(json_object_get(j, "model"), key, v)
            cr_assert(spec_model_reads(spec_models[m], key), "%s's normal form names %s", spec_models[m], key);
        cr_assert_eq(spec_parse(j, &t, &err), 0, "%s: %s", spec_models[m], err.message);
        json_t *k = spec_to_json(&t);
        cr_assert(json_equal(j, k), "%s's normal form changes when parsed again", spec_models[m]);
        json_decref(in);
        json_decref(j);
        json_decref(k);
        spec_deinit(&s);
        spec_deinit(&t);
    }
}

/* A pipeline of more partitions than the blocks the table says the model can be cut into. */
Test(spec, partitions_beyond_the_models_blocks_are_refused)
{
    spec_t s;
    kiln_err_t err;
    cr_assert_eq(spec_parse_string("{\"model\": {\"type\": \"gpt\", \"n_layer\": 1}, \"data\": {\"train\": \"/d\"}, "
                                   "\"resources\": {\"nodes\": 5}, \"distribution\": {\"model_parallel\": "
                                   "{\"partitions\": 5}}}", &s, &err),
                 KILN_EINVAL);
    cr_assert_str_eq(err.field, "distribution.model_parallel.partitions");
    cr_assert(strstr(err.message, "exceeds the 4 blocks"), "%s", err.message);
    cr_assert_eq(spec_parse_string("{\"model\": {\"type\": \"gpt\", \"n_layer\": 1}, \"data\": {\"train\": \"/d\"}, "
                                   "\"resources\": {\"nodes\": 4}, \"distribution\": {\"model_parallel\": "
                                   "{\"partitions\": 4}}}", &s, &err),
                 0, "%s", err.message);
    spec_deinit(&s);
}

/* stopping.max_steps: a pause step within max_steps, for engine jobs; kept by the round trip. */
Test(spec, pause_step_is_checked_and_round_trips)
{
    const char *tmpl = "{\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": 8},"
                       " \"data\": {\"train\": \"/data/tiny.txt\"}, \"hyperparameters\": {\"max_steps\": 30},"
                       " \"stopping\": {\"max_steps\": %d}}";
    char buf[512];
    spec_t s;
    kiln_err_t err;
    snprintf(buf, sizeof buf, tmpl, 10);
    cr_assert_eq(spec_parse_string(buf, &s, &err), 0, "%s", err.message);
    cr_assert_eq(s.pause_at_step, 10);
    json_t *j = spec_to_json(&s);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(j, "stopping"), "max_steps")), 10);
    json_decref(j);
    spec_deinit(&s);
    snprintf(buf, sizeof buf, tmpl, 31);
    cr_assert_eq(spec_parse_string(buf, &s, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "stopping.max_steps");
    cr_assert(strstr(err.message, "past hyperparameters.max_steps"), "%s", err.message);
    cr_assert_eq(spec_parse_string("{\"entry_point\": \"t.py\", \"source\": \"/data/c\", \"stopping\": {\"max_steps\": 5}}",
                                   &s, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "stopping.max_steps");
}
