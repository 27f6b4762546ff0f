/* test_plan.c - the partition plan as JSON: written, read back equal, accepted in the compact
 * form and through the job spec, and every kind of bad plan rejected with a message naming the
 * stage and blocks at fault. */
#include "engine/pipe/pipe.h"
#include "spec/spec.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((size_t)1 << 20)

static void make_plan(pipe_plan_t *plan)
{
    pipe_block_profile_t prof[8];
    for (int i = 0; i < 8; i++)
        prof[i] = (pipe_block_profile_t){.fwd_ms = 1.0 + i * 0.1, .bwd_ms = 2.0, .param_bytes = MIB,
                                         .opt_bytes = 2 * MIB, .act_bytes_per_mb = MIB / 2};
    pipe_partition_opts_t o = {.n_stages = 3, .microbatches = 4, .optimize = PIPE_OPT_MEMORY,
                               .schedule = PIPE_SCHED_SIMPLE, .mem_limit_bytes = 512 * MIB};
    kiln_err_t err;
    cr_assert_eq(pipe_partition(prof, 8, &o, plan, &err), 0, "%s", err.message);
}

Test(plan, round_trip)
{
    pipe_plan_t a, b;
    kiln_err_t err;
    make_plan(&a);
    char *text = pipe_plan_to_string(&a);
    cr_assert_not_null(text);
    cr_assert(strstr(text, "\"blocks\": [\n") || strstr(text, "\"blocks\": ["), "%s", text);
    cr_assert(strstr(text, "\"optimize\": \"memory\""), "%s", text);
    cr_assert(strstr(text, "\"schedule\": \"simple\""), "%s", text);
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    cr_assert_not_null(j, "%s", je.text);
    cr_assert_eq(pipe_plan_from_json(j, 8, 3, &b, &err), 0, "%s", err.message);
    cr_assert_eq(b.n_stages, a.n_stages);
    cr_assert_eq(b.optimize, a.optimize);
    cr_assert_eq(b.schedule, a.schedule);
    cr_assert_eq(b.microbatches, a.microbatches);
    cr_assert_eq(b.n_blocks, 8);
    cr_assert(b.manual);
    cr_assert_float_eq(b.balance, a.balance, 1e-3);
    cr_assert_float_eq(b.memory_limit_mb, 512.0, 1e-9);
    for (int s = 0; s < a.n_stages; s++) {
        cr_assert_eq(b.stages[s].first, a.stages[s].first);
        cr_assert_eq(b.stages[s].last, a.stages[s].last);
        cr_assert_float_eq(b.stages[s].predicted_ms, a.stages[s].predicted_ms, 1e-3);
        cr_assert_float_eq(b.stages[s].predicted_mem_mb, a.stages[s].predicted_mem_mb, 1e-3);
    }
    /* written again, the text is identical */
    char *text2 = pipe_plan_to_string(&b);
    b.manual = false;
    free(text2);
    text2 = pipe_plan_to_string(&b);
    cr_assert_str_eq(text2, text);
    pipe_plan_t c;
    cr_assert_eq(pipe_plan_copy(&c, &b), 0);
    cr_assert_eq(c.stages[2].last, 7);
    pipe_plan_deinit(&c);
    free(text);
    free(text2);
    json_decref(j);
    pipe_plan_deinit(&a);
    pipe_plan_deinit(&b);
    pipe_plan_deinit(NULL);
}

static int parse(const char *text, int n_blocks, int n_stages, pipe_plan_t *out, kiln_err_t *err)
{
    json_error_t je;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &je);
    cr_assert_not_null(j, "test JSON: %s", je.text);
    int rc = pipe_plan_from_json(j, n_blocks, n_stages, out, err);
    json_decref(j);
    return rc;
}

Test(plan, compact_form_and_bare_list)
{
    pipe_plan_t p;
    kiln_err_t err;
    cr_assert_eq(parse("{\"stages\": [[0, 1], [2, 3]]}", 4, 2, &p, &err), 0, "%s", err.message);
    cr_assert_eq(p.n_stages, 2);
    cr_assert_eq(p.stages[0].first, 0);
    cr_assert_eq(p.stages[0].last, 1);
    cr_assert_eq(p.stages[1].first, 2);
    cr_assert_eq(p.stages[1].last, 3);
    cr_assert_eq(pipe_plan_stage_of(&p, 3), 1);
    cr_assert_eq(pipe_plan_stage_of(&p, 4), -1);
    pipe_plan_deinit(&p);
    cr_assert_eq(parse("[[0, 2], [3, 3], [4, 5]]", 6, 3, &p, &err), 0, "%s", err.message);
    cr_assert_eq(p.stages[1].first, 3);
    pipe_plan_deinit(&p);
    /* a single-block stage written in the full form */
    cr_assert_eq(parse("{\"stages\": [{\"stage\": 0, \"blocks\": [0, 0]}, {\"blocks\": [1, 4]}]}", 5, 2, &p, &err), 0,
                 "%s", err.message);
    pipe_plan_deinit(&p);
}

static void expect_bad(const char *text, int n_blocks, int n_stages, const char *needle)
{
    pipe_plan_t p;
    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = parse(text, n_blocks, n_stages, &p, &err);
    cr_assert_eq(rc, KILN_EINVAL, "%s was accepted", text);
    cr_assert_str_eq(err.field, "distribution.model_parallel.partition_plan");
    cr_assert(strstr(err.message, needle), "%s: got \"%s\", want \"%s\"", text, err.message, needle);
    cr_assert_null(p.stages, "a rejected plan holds nothing");
}

Test(plan, bad_plans_are_rejected_clearly)
{
    expect_bad("{\"stages\": [[0, 2], [2, 3]]}", 4, 2, "stages 0 and 1 overlap: both hold block 2");
    expect_bad("{\"stages\": [[0, 3], [1, 3]]}", 4, 2, "stages 0 and 1 overlap: both hold block 1");
    expect_bad("{\"stages\": [[0, 1], [3, 4]]}", 5, 2, "block 2 is in no stage (stage 1 starts at block 3)");
    expect_bad("{\"stages\": [[0, 0], [4, 5]]}", 6, 2, "blocks 1..3 are in no stage");
    expect_bad("{\"stages\": [[0, 1], [2, 3]]}", 6, 2, "blocks 4..5 are in no stage (the last stage ends at block 3)");
    expect_bad("{\"stages\": [[0, 1], [2, 2]]}", 4, 2, "block 3 is in no stage");
    expect_bad("{\"stages\": [[1, 1], [2, 3]]}", 4, 2, "block 0 is in no stage");
    expect_bad("{\"stages\": [[0, 1], [2, 9]]}", 4, 2, "stage 1 holds blocks [2, 9], out of range: the model has blocks 0..3");
    expect_bad("{\"stages\": [[-1, 1], [2, 3]]}", 4, 2, "out of range");
    expect_bad("{\"stages\": [[0, 3], []]}", 4, 2, "stage 1 is empty");
    expect_bad("{\"stages\": [[0, 1], [3, 2], [2, 3]]}", 4, 3, "stage 1 is empty (blocks [3, 2])");
    expect_bad("{\"stages\": [{\"blocks\": []}, {\"blocks\": [0, 3]}]}", 4, 2, "stage 0 is empty");
    expect_bad("{\"stages\": [[0, 0], [1, 1], [2, 3]]}", 4, 2,
               "the plan has 3 stages but the job has only 2 partitions");
    expect_bad("{\"stages\": [[0, 3]]}", 4, 2, "the plan has 1 stage but the job has 2 partitions");
    expect_bad("{\"stages\": []}", 4, 2, "the plan has no stages");
    expect_bad("{\"stages\": [[2, 3], [0, 1]]}", 4, 2, "stages are out of order: stage 1 starts at block 0");
    expect_bad("{\"stages\": [[0, \"x\"], [2, 3]]}", 4, 2, "stage 0: blocks must be an inclusive [first, last] pair");
    expect_bad("{\"stages\": [[0, 1, 2], [3, 3]]}", 4, 2, "pair of integers");
    expect_bad("{\"stages\": [{\"stage\": 1, \"blocks\": [0, 1]}, {\"blocks\": [2, 3]}]}", 4, 2,
               "stage number 1 is listed at position 0");
    expect_bad("{\"stages\": [{\"range\": [0, 1]}, {\"blocks\": [2, 3]}]}", 4, 2, "stage 0 has no \"blocks\" range");
    expect_bad("{\"plan\": [[0, 1], [2, 3]]}", 4, 2, "the plan has no \"stages\"");
    expect_bad("{\"stages\": {\"0\": [0, 1]}}", 4, 2, "\"stages\" must be a list");
    expect_bad("{\"stages\": [[0, 1], [2, 3]], \"n_blocks\": 6}", 4, 2,
               "the plan was made for a model of 6 blocks, this model has 4");
    expect_bad("{\"stages\": [[0, 1], [2, 3]], \"schedule\": \"zigzag\"}", 4, 2, "\"schedule\" must be");
    expect_bad("{\"stages\": [[0, 1], [2, 3]], \"version\": 7}", 4, 2, "unsupported plan version");
    expect_bad("42", 4, 2, "the plan must be an object");
    expect_bad("{\"stages\": [[0, 1], [2, 3]], \"head_blocks\": 0}", 4, 2,
               "\"head_blocks\" must be an integer from 1 to 64");
    expect_bad("{\"stages\": [[0, 1], [2, 3]], \"head_blocks\": \"all\"}", 4, 2, "\"head_blocks\" must be");
}

/* head_blocks fixes the block count a plan is read against, and travels through JSON */
Test(plan, head_blocks_round_trip)
{
    json_t *j = json_loads("{\"head_blocks\": 3, \"stages\": [[0, 5], [6, 7]]}", 0, NULL);
    cr_assert_eq(pipe_plan_json_head_blocks(j), 3);
    pipe_plan_t p;
    kiln_err_t err;
    cr_assert_eq(pipe_plan_from_json(j, 8, 2, &p, &err), 0, "%s", err.message);
    cr_assert_eq(p.head_blocks, 3);
    json_t *back = pipe_plan_to_json(&p);
    cr_assert_eq(json_integer_value(json_object_get(back, "head_blocks")), 3);
    json_decref(back);
    pipe_plan_deinit(&p);
    json_decref(j);
    j = json_loads("{\"stages\": [[0, 1], [2, 3]]}", 0, NULL);
    cr_assert_eq(pipe_plan_json_head_blocks(j), 1);
    json_decref(j);
}

Test(plan, accepted_through_the_job_spec)
{
    /* 2 layers -> 6 blocks; 2 ranks, 2 partitions; the plan given as an object and as text */
    const char *fmt =
        "{\"name\": \"p\", \"model\": {\"type\": \"gpt\", \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32,"
        " \"seq_len\": 16}, \"data\": {\"train\": \"/tmp/x.txt\"},"
        " \"hyperparameters\": {\"lr\": 1e-3, \"global_batch_size\": 4, \"max_steps\": 2},"
        " \"resources\": {\"nodes\": 1, \"slots_per_node\": 2},"
        " \"distribution\": {\"model_parallel\": {\"partitions\": 2, \"microbatches\": 2,"
        " \"partition_plan\": %s}}}";
    const char *plans[] = {"{\"stages\": [[0, 0], [1, 5]]}", "\"{\\\"stages\\\": [[0, 0], [1, 5]]}\""};
    for (int i = 0; i < 2; i++) {
        char text[2048];
        snprintf(text, sizeof(text), fmt, plans[i]);
        spec_t s;
        kiln_err_t err;
        cr_assert_eq(spec_parse_string(text, &s, &err), 0, "%s (%s)", err.message, err.field);
        cr_assert_not_null(s.dist.mp_partition_plan);
        cr_assert(!s.dist.mp_auto_partition);
        pipe_plan_t p;
        cr_assert_eq(pipe_plan_from_json(s.dist.mp_partition_plan, 2 * s.model.n_layer + 2, s.dist.mp_partitions, &p,
                                         &err), 0, "%s", err.message);
        cr_assert_eq(p.stages[0].last, 0);
        cr_assert_eq(p.stages[1].first, 1);
        pipe_plan_deinit(&p);
        spec_deinit(&s);
    }
}

Test(plan, predict_fills_a_manual_plan)
{
    pipe_plan_t p;
    kiln_err_t err;
    cr_assert_eq(parse("{\"stages\": [[0, 0], [1, 3]], \"microbatches\": 2, \"schedule\": \"interleaved\"}", 4, 2,
                       &p, &err), 0, "%s", err.message);
    pipe_block_profile_t prof[4];
    for (int i = 0; i < 4; i++)
        prof[i] = (pipe_block_profile_t){.fwd_ms = 1, .bwd_ms = 1, .param_bytes = MIB, .opt_bytes = 2 * MIB,
                                         .act_bytes_per_mb = MIB};
    pipe_plan_predict(&p, prof, NULL);
    cr_assert_float_eq(p.stages[0].predicted_ms, 4.0, 1e-9);
    cr_assert_float_eq(p.stages[1].predicted_ms, 12.0, 1e-9);
    /* stage 0 keeps min(2, 2) = 2 sets, stage 1 min(2, 1) = 1 */
    cr_assert_float_eq(p.stages[0].predicted_mem_mb, 4.0 + 2.0, 1e-9);
    cr_assert_float_eq(p.stages[1].predicted_mem_mb, 12.0 + 3.0, 1e-9);
    cr_assert_float_eq(p.balance, 6.0 / 4.0, 1e-9);
    pipe_plan_deinit(&p);
}

Test(plan, bad_plan_in_a_job_spec_is_rejected)
{
    /* what the pipeline layer does with the spec's plan before anything else: an overlapping plan
     * fails on every rank alike with the field named */
    const char *text =
        "{\"name\": \"p\", \"model\": {\"type\": \"gpt\", \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32,"
        " \"seq_len\": 16}, \"data\": {\"train\": \"/tmp/x.txt\"},"
        " \"hyperparameters\": {\"lr\": 1e-3, \"global_batch_size\": 4, \"max_steps\": 2},"
        " \"resources\": {\"nodes\": 1, \"slots_per_node\": 2},"
        " \"distribution\": {\"model_parallel\": {\"partitions\": 2, \"microbatches\": 2,"
        " \"partition_plan\": {\"stages\": [[0, 2], [2, 5]]}}}}";
    spec_t s;
    kiln_err_t err;
    cr_assert_eq(spec_parse_string(text, &s, &err), 0, "%s", err.message);
    pipe_plan_t p;
    cr_assert_eq(pipe_plan_from_json(s.dist.mp_partition_plan, 2 * s.model.n_layer + 2, s.dist.mp_partitions, &p, &err),
                 KILN_EINVAL);
    cr_assert_str_eq(err.field, "distribution.model_parallel.partition_plan");
    cr_assert(strstr(err.message, "stages 0 and 1 overlap: both hold block 2"), "%s", err.message);
    spec_deinit(&s);
}
