/* spec.h - the job spec as a typed C struct: parsing from JSON with defaults, validation that
 * names the offending field, and the normalised JSON form. One validator for kilnd (at
 * submission) and kiln-train (standalone runs), so both accept and reject the same specs.
 * It does not know about the cluster: whether a job fits the registered workers is the
 * scheduler's question. */
#ifndef KILN_SPEC_H
#define KILN_SPEC_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"

#define SPEC_MAX_HIDDEN 16
#define SPEC_MAX_METRIC_DEFS 16
#define SPEC_MAX_REGEX 256       /* bytes of one metric definition's pattern */
#define SPEC_MAX_TAGS 32
#define SPEC_STR 256
#define SPEC_PATH 1024
#define SPEC_MAX_CHANNELS 20          /* data.channels of a job */
#define SPEC_CHANNEL_NAME 64          /* bytes of a channel's name, with its NUL */
#define SPEC_MAX_SCRIPT_HPARAMS 100   /* keys of a script job's hyperparameters (SageMaker's limits) */
#define SPEC_SCRIPT_HPARAM_KEY 256    /* characters of one key */
#define SPEC_SCRIPT_HPARAM_VALUE 2500 /* characters of one value, written as JSON */
#define SPEC_MAX_ENV 100              /* environment variables of a script job */
#define SPEC_ENV_VALUE 512            /* characters of one value */
#define SPEC_MAX_GRACE_S 3600         /* stopping.grace_period_s, at most */

/* Reals in the JSON kiln writes for people and programs (a job's spec as stored, REST's answers,
 * gRPC's JSON fields) carry 15 significant digits (DBL_DIG): every decimal of up to 15 digits a
 * person writes reads back as written, and 0.1 is not shown as 0.10000000000000001. A value kiln
 * chooses itself (a tuning trial's) is rounded to them first (spec_real_round), so that the value
 * recorded, the one shown on REST and gRPC and the one the job trains with are one double. */
#define SPEC_JSON_REALS JSON_REAL_PRECISION(15)

/* The metrics kiln's engine (kiln-train) reports of a run: each step's, in the order engine/train.c
 * gives their values; val_loss at each evaluation (when the job has validation data); and a
 * pipeline's bubble each step. A tuning job over an engine job optimises one of them or one of
 * the job's metric_definitions (spec_engine_reports). */
#define SPEC_ENGINE_STEP_METRICS "train_loss", "lr", "grad_norm", "step_time_ms", "tokens_per_s", "mfu", "peak_mem_mb"
#define SPEC_ENGINE_VAL_METRIC "val_loss"
#define SPEC_ENGINE_PIPE_METRIC "pipeline_bubble"

typedef struct spec_model {
    char type[16];          /* a model of the capability table (SPEC_MODEL_MAP): "gpt", "mlp" */
    int n_layer, n_head, n_embd, seq_len;
    char vocab[16];         /* "bytes" | "gpt2" | "custom" */
    int vocab_size;         /* real vocabulary size V (bytes: 256, gpt2: 50257) */
    int padded_vocab_size;  /* V rounded up to a multiple of 64 (gpt2: 50304); bytes: 256 */
    int hidden[SPEC_MAX_HIDDEN];
    int n_hidden;
    int n_inputs, n_classes;
    char init_from[SPEC_PATH]; /* "": none; an llm.c file (absolute, normalised), or "job:<id>" */
} spec_model_t;

/* A named input of a script job (data.channels): a directory or file inside the data roots,
 * absolute and normalised. */
typedef struct spec_channel {
    char name[SPEC_CHANNEL_NAME]; /* [A-Za-z0-9_-]+ */
    char path[SPEC_PATH];
} spec_channel_t;

typedef struct spec_data {
    char train[SPEC_PATH];  /* a local path (a "file://" prefix is removed) */
    char val[SPEC_PATH];    /* "" when the validation set is split from train */
    double val_fraction;
    char format[16];        /* "text" | "tokens" */
    spec_channel_t channels[SPEC_MAX_CHANNELS]; /* script jobs; an engine job's channels are
                                                 * train and val, read into the fields above */
    int n_channels;
} spec_data_t;

typedef struct spec_hparams {
    double lr;
    int global_batch_size;
    int micro_batch_size;   /* 0 means global / data-parallel replicas (no accumulation) */
    int64_t max_steps;
    int warmup_steps;
    double weight_decay, grad_clip;
    uint64_t seed;
    double beta1, beta2, eps, min_lr_fraction;
    int eval_every, eval_batches;
    int sample_every, sample_tokens;
    double temperature;
    int top_k;
} spec_hparams_t;

typedef struct spec_resources {
    int nodes, slots_per_node;
    char slot_type[8];      /* "cpu" | "gpu" */
    char device[8];         /* "auto" | "cpu" | "cuda" */
    int threads_per_rank;   /* 0: decided by the agent */
    int64_t memory_limit_mb;
} spec_resources_t;

typedef struct spec_distribution {
    bool dp_enabled;
    double dp_bucket_mb;    /* MiB of fp32 gradients a bucket holds; 0: not set, chosen from the model by engine/dp */
    bool dp_shard_optimizer_state;
    char dp_gradient_dtype[8]; /* "fp32" | "bf16": what gradients travel as between replicas */
    int mp_partitions;      /* 1: no pipeline */
    int mp_microbatches;    /* 0: not set, chosen from the job by a pipeline (engine) */
    char mp_pipeline[16];   /* "simple" | "interleaved" */
    char mp_optimize[16];   /* "speed" | "memory" */
    bool mp_auto_partition;
    json_t *mp_partition_plan; /* owned; NULL when absent */
    char mixed_precision[8];   /* "" | "bf16" */
    bool activation_checkpointing;
} spec_distribution_t;

/* A metric definition: a PCRE2 pattern (compiled with PCRE2_UTF | PCRE2_NEVER_BACKSLASH_C, as
 * kiln-agent compiles it) whose first capture group is the value; no backreferences. */
typedef struct spec_metric_def {
    char name[64];
    char regex[SPEC_MAX_REGEX + 1];
} spec_metric_def_t;

/* What a script job (one with an entry_point instead of a model) adds: the user's program, where
 * its code comes from, and what kiln hands it without reading it. */
typedef struct spec_script {
    char entry_point[SPEC_PATH]; /* "": an engine job. A relative path inside the code, normalised
                                  * (no "..", no "./"): .py runs with Python, .sh with /bin/sh,
                                  * anything else is executed */
    char source[SPEC_PATH];      /* "code:sha256:<64 lower-case hex>" (an archive uploaded to
                                  * kilnd) or an absolute, normalised directory in the data roots */
    char python[SPEC_PATH];      /* "": the agent's --python; else absolute and normalised (the
                                  * agent checks it lies inside a data root) */
    json_t *hyperparameters;     /* owned; a free-form object kiln does not interpret */
    json_t *environment;         /* owned; an object of strings; NULL when empty */
    bool torch_distributed;      /* distribution.torch_distributed.enabled: one rank per slot
                                  * (false: one process per node, which owns the node's slots) */
    int nproc_per_node;          /* processes per node: slots_per_node, or 1 when not enabled */
} spec_script_t;

typedef struct spec {
    char name[128];
    char project[64];
    spec_script_t script;
    spec_model_t model;
    spec_data_t data;
    spec_hparams_t hp;
    spec_resources_t res;
    spec_distribution_t dist;
    int ckpt_every_steps, ckpt_keep_last;
    char ckpt_path[SPEC_PATH];   /* shared directory for checkpoints ("" = the agent's job dir) */
    spec_metric_def_t metric_defs[SPEC_MAX_METRIC_DEFS];
    int n_metric_defs;
    int64_t max_runtime_s;
    int64_t pause_at_step;       /* stopping.max_steps (engine jobs; 0: none): the run stops at this
                                  * step with a checkpoint and exits 0, paused; the learning-rate
                                  * schedule still spans hyperparameters.max_steps, so raising or
                                  * removing it and resuming continues the same run */
    int grace_period_s;          /* stopping.grace_period_s: SIGTERM, then SIGKILL after this
                                  * long; 0: kilnd's --stop-grace-ms */
    int max_attempts;
    int priority;
    char queue[64];              /* "" when the spec names none: kilnd writes the project's default queue */
    char tag_keys[SPEC_MAX_TAGS][64];
    char tag_values[SPEC_MAX_TAGS][SPEC_STR];
    int n_tags;
} spec_t;

/* Parses and validates a job spec. Unknown keys are rejected (a typo must not be silently
 * ignored); missing ones get defaults. On error returns KILN_EINVAL with err->field set to the
 * dotted path of the offending field ("hyperparameters.lr"), a message saying what is wrong, and
 * a hint where one helps. *out must be released with spec_deinit() on success. */
int spec_parse(const json_t *in, spec_t *out, kiln_err_t *err);
/* Same, from text: a JSON syntax error reports line and column. */
int spec_parse_string(const char *text, spec_t *out, kiln_err_t *err);
/* Same, from a file. KILN_ENOTFOUND/KILN_EIO when the file cannot be read. */
int spec_load_file(const char *path, spec_t *out, kiln_err_t *err);
/* Releases what spec_parse allocated (the partition plan, a script job's hyperparameters and
 * environment). Accepts NULL. */
void spec_deinit(spec_t *s);

/* The fields of the spec's "model", "hyperparameters" and "resources" sections, NULL-terminated:
 * what the parser accepts there (and what the filter language's model.*, hp.* and resources.*
 * may name). Static storage. */
extern const char *const spec_model_keys[];
extern const char *const spec_hparam_keys[];
extern const char *const spec_resource_keys[];
typedef enum { SPEC_KIND_NONE = 0, SPEC_KIND_NUMBER, SPEC_KIND_TEXT, SPEC_KIND_LIST } spec_kind_t;
/* What the field key of section ("model", "hyperparameters", "resources") holds in the
 * normalised spec: a number, text, a list (model.hidden), or SPEC_KIND_NONE when the section
 * has no such field. */
spec_kind_t spec_key_kind(const char *section, const char *key);

/* The normalised spec as JSON: every field present with its effective value, but "queue" only
 * when the spec names one (otherwise kilnd decides it at submission: the project's default
 * queue). Caller owns the result (json_decref). spec_to_json then spec_parse gives back an equal
 * spec. */
json_t *spec_to_json(const spec_t *s);

/* A script job's source "code:sha256:<hex>", an archive uploaded to kilnd, named by the SHA-256
 * of its bytes as uploaded. */
#define SPEC_CODE_PREFIX "code:sha256:"
/* When source is "code:sha256:<64 hex digits>" (upper-case accepted): true, with the digest in
 * lower case in digest (KILN_SHA256_HEX bytes); else false, digest untouched. */
bool spec_source_digest(const char *source, char digest[KILN_SHA256_HEX]);

/* The numbers of a job's hyperparameters, flat, for search (hp.NAME): an engine job's fields;
 * a script job's numbers and numeric strings ("0.01"), nested objects' keys joined with '.'
 * ({"model": {"depth": 4}} is "model.depth"), at most 8 levels deep and 1,000 numbers (keys in
 * order), keys of at most 256 bytes; arrays, booleans and other text are left out. Caller owns
 * the object (json_decref). */
json_t *spec_hparams_flat(const spec_t *s);
/* Whether a job's metric_definitions (the normalised spec's array, or NULL) may number points by
 * counting matches: one whose pattern has no group named "step" gives the rank's step mark when
 * it printed one, else the match's count, which need not be a step of its training (then the
 * job's progress is no step to compare a pause with). */
bool spec_metric_steps_counted(const json_t *metric_definitions);
/* The same numbers of a normalised spec's "hyperparameters" object (either kind of job: an
 * engine job's are flat numbers already). Caller owns the result. */
json_t *spec_hparams_flatten(const json_t *hyperparameters);

/* Whether the spec is a script job's (it names an entry_point rather than a model). */
static inline bool spec_is_script(const spec_t *s) { return s->script.entry_point[0] != '\0'; }

/* A script job's hyperparameters.max_steps when it is a whole number from 1 (the step count the
 * script trains to, which kiln reads for progress and hyperband's rungs), else 0. */
int64_t spec_script_max_steps(const spec_t *s);

/* Ranks the job needs: nodes x slots_per_node. */
int spec_world_size(const spec_t *s);

/* v rounded to the significant digits SPEC_JSON_REALS writes: reading back what is written of it
 * gives it again. NaN and the infinities are returned as they are. */
double spec_real_round(double v);

/* Whether an engine job s reports the metric name: one of the engine's (SPEC_ENGINE_*_METRIC*) or
 * of its metric_definitions. When not, and list is not NULL, writes there the names it reports,
 * separated by ", ", for a message. */
bool spec_engine_reports(const spec_t *s, const char *name, char *list, size_t cap);
/* The engine backend a rank asks for: resources.device, except that "auto" on cpu slots is
 * "cpu" (a job placed on CPU slots never takes a GPU it was not given). Static storage. */
const char *spec_device(const spec_t *s);
/* Data-parallel replicas: world size / pipeline partitions. */
int spec_dp_replicas(const spec_t *s);

/* ============================================================================================
 * What the training engine can run (spec/caps.c): one table of what each model and each engine
 * backend can do. kilnd reads it at submission (spec_parse refuses what the job's model or the
 * backend its slots imply cannot do) and kiln-train reads it again once it knows the backend it
 * runs on (spec_caps_check), so a combination is refused with the same field, message and hint
 * wherever it is refused. What one machine cannot do (a CPU without bf16 instructions, a build
 * without device collectives) is only known where the job runs; the engine refuses that itself.
 * ============================================================================================ */

/* A capability: something a job may ask for that not every model or backend has. */
typedef enum spec_cap {
    SPEC_CAP_TEXT,       /* data: a text file, byte-level tokens (model-side) */
    SPEC_CAP_TOKENS,     /* data: an llm.c token shard (model-side) */
    SPEC_CAP_SYNTHETIC,  /* data: "synthetic" classification examples (model-side) */
    SPEC_CAP_INIT_FILE,  /* model.init_from: an llm.c checkpoint file (model-side) */
    SPEC_CAP_INIT_JOB,   /* model.init_from "job:<id>": another job's final model (model-side) */
    SPEC_CAP_BF16,       /* distribution.mixed_precision "bf16" (model and backend) */
    SPEC_CAP_RECOMPUTE,  /* distribution.activation_checkpointing (model-side) */
    SPEC_CAP_PIPELINE,   /* distribution.model_parallel.partitions > 1 (model and backend) */
    SPEC_CAP_DP,         /* data-parallel replicas (model and backend) */
    SPEC_CAP_SHARD,      /* shard_optimizer_state over replicas, ZeRO-1 (backend-side) */
    SPEC_CAP_BF16_GRADS, /* gradient_dtype "bf16" over replicas (backend-side) */
    SPEC_CAP_COUNT
} spec_cap_t;

#define SPEC_CAP_BIT(name) (1u << SPEC_CAP_##name)

/* The models: X(name, fields, caps, example, blocks), one line each.
 *   name     model.type, and the engine's implementation eng_<name>_model (engine/model.h)
 *   fields   the model section's fields it reads besides type and init_from; another given is
 *            refused ("does not apply")
 *   caps     what it can do: SPEC_CAP_BIT()s of the model-side capabilities
 *   example  a small model section of its kind (JSON): the tests build their specs from it
 *   blocks   an expression of m (const spec_model_t *): the blocks a pipeline may cut it into,
 *            with the head whole (0 when it cannot be cut) */
#define SPEC_MODEL_MAP(X)                                                                              \
    X(gpt, "n_layer n_head n_embd seq_len vocab vocab_size",                                          \
      SPEC_CAP_BIT(TEXT) | SPEC_CAP_BIT(TOKENS) | SPEC_CAP_BIT(INIT_FILE) | SPEC_CAP_BIT(INIT_JOB) |  \
          SPEC_CAP_BIT(BF16) | SPEC_CAP_BIT(RECOMPUTE) | SPEC_CAP_BIT(PIPELINE) | SPEC_CAP_BIT(DP),    \
      "{\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 32, \"seq_len\": 16}",              \
      2 * (m)->n_layer + 2)                                                                            \
    X(mlp, "hidden n_inputs n_classes", SPEC_CAP_BIT(SYNTHETIC) | SPEC_CAP_BIT(DP),                   \
      "{\"type\": \"mlp\", \"hidden\": [8], \"n_inputs\": 4, \"n_classes\": 2}", 0)

/* The engine's backends: X(name, slots, caps).
 *   name   the backend (engine/backend.h's eng_backend_t.name)
 *   slots  the resources.slot_type whose jobs run on it; "" for one no spec chooses (the
 *          reference ops, which tests run whole models on)
 *   caps   SPEC_CAP_BIT()s of the backend-side capabilities it has */
#define SPEC_BACKEND_MAP(X)                                                                            \
    X(cpu, "cpu", SPEC_CAP_BIT(BF16) | SPEC_CAP_BIT(PIPELINE) | SPEC_CAP_BIT(DP) | SPEC_CAP_BIT(SHARD) | \
                      SPEC_CAP_BIT(BF16_GRADS))                                                        \
    X(ref, "", SPEC_CAP_BIT(BF16) | SPEC_CAP_BIT(PIPELINE) | SPEC_CAP_BIT(DP) | SPEC_CAP_BIT(SHARD) |    \
                   SPEC_CAP_BIT(BF16_GRADS))                                                           \
    X(cuda, "gpu", SPEC_CAP_BIT(BF16) | SPEC_CAP_BIT(DP))

/* The models and backends of the table, in its order, NULL-terminated. */
extern const char *const spec_models[];
extern const char *const spec_backends[];

/* A capability's short name ("bf16", "pipeline", ...; static), and the smallest JSON that asks
 * for it (an object to merge into a spec: what the tests send). */
const char *spec_cap_name(spec_cap_t cap);
const char *spec_cap_ask(spec_cap_t cap);
/* model's example model section (JSON), backend's slot type ("" for none). NULL when unknown. */
const char *spec_model_example(const char *model);
const char *spec_backend_slots(const char *backend);
/* Whether model (model.type) / backend has cap. A capability of the other side only is had by
 * every model (backend); an unknown name has none. */
bool spec_model_has(const char *model, spec_cap_t cap);
bool spec_backend_has(const char *backend, spec_cap_t cap);
/* Whether model reads field of the model section (type and init_from: every model). */
bool spec_model_reads(const char *model, const char *field);
/* The blocks a pipeline may cut model m into (0: it cannot be cut). */
int spec_model_blocks(const spec_model_t *m);
/* The capabilities s asks for (SPEC_CAP_BIT()s). */
unsigned spec_caps_asked(const spec_t *s);
/* The backend a job of s runs on as far as submission can tell: "cuda" on gpu slots (unless
 * resources.device is "cpu"), else "cpu". Static storage. */
const char *spec_backend(const spec_t *s);
/* The refusal of cap, the one message for it wherever it is refused: by model when backend is
 * NULL, else by backend. Fills err (field, message, hint) and returns KILN_EINVAL. */
int spec_cap_refuse(spec_cap_t cap, const char *model, const char *backend, kiln_err_t *err);
/* Refuses the first capability s asks for that its model, then backend, does not have
 * (spec_cap_refuse). backend: the one the job runs on (spec_backend(s) at submission, the
 * engine's own at run time). Returns 0 or KILN_EINVAL. */
int spec_caps_check(const spec_t *s, const char *backend, kiln_err_t *err);

/* ============================================================================================
 * Tuning jobs (spec/tuning.c): a search over a base job spec's parameters toward an objective
 * metric. The request is parsed and validated here, once for REST and gRPC: every parameter's
 * path must be one the base spec has, and the ends of its range and each categorical value are
 * substituted into the base spec and run through spec_parse, so a value the job validator would
 * refuse is refused at submission, naming the parameter.
 * ============================================================================================ */
#define SPEC_TUNE_MAX_PARAMS 30    /* SageMaker's limit */
#define SPEC_TUNE_MAX_VALUES 100   /* values of one categorical parameter */
#define SPEC_TUNE_MAX_JOBS 1000    /* max_jobs, at most */
#define SPEC_TUNE_MAX_RUNGS 16     /* hyperband rungs, at most */
#define SPEC_TUNE_MAX_PARENTS 5    /* warm_start.parents, at most (SageMaker's limit) */
#define SPEC_TUNE_MAX_INT 9007199254740992.0 /* 2^53: an integer range's ends lie within +-this, where a
                                                 double holds every integer exactly */

typedef enum { SPEC_TUNE_INTEGER = 1, SPEC_TUNE_CONTINUOUS, SPEC_TUNE_CATEGORICAL } spec_tune_type_t;
typedef enum { SPEC_TUNE_LINEAR = 0, SPEC_TUNE_LOG, SPEC_TUNE_REVERSE_LOG } spec_tune_scaling_t;
typedef enum { SPEC_TUNE_RANDOM = 1, SPEC_TUNE_GRID, SPEC_TUNE_HYPERBAND, SPEC_TUNE_BAYESIAN } spec_tune_strategy_t;
/* hyperband.sampler: how hyperband draws a new trial (random search's draw, or TPE over the
 * results at its rungs). */
typedef enum { SPEC_TUNE_SAMPLER_RANDOM = 0, SPEC_TUNE_SAMPLER_TPE } spec_tune_sampler_t;
/* warm_start.type: the parents ran the same base job's data and model with the same parameter
 * names, or (transfer_learning) parameters were added or removed and the base job changed. */
typedef enum { SPEC_WARM_NONE = 0, SPEC_WARM_IDENTICAL, SPEC_WARM_TRANSFER } spec_warm_type_t;

typedef struct spec_tune_param {
    char name[128];              /* as the request names it ("lr", "model.n_embd") */
    char path[160];              /* its dotted path in the job spec ("hyperparameters.lr") */
    spec_tune_type_t type;
    spec_tune_scaling_t scaling; /* integer and continuous */
    double min, max;             /* integer and continuous; min < max */
    json_t *values;              /* categorical: an array of 1 to SPEC_TUNE_MAX_VALUES numbers,
                                  * strings or booleans (owned); NULL otherwise */
} spec_tune_param_t;

typedef struct spec_tuning {
    char name[128];
    char project[64];            /* the base job's */
    json_t *job;                 /* the base job spec, normalised (spec_to_json; owned) */
    bool script;                 /* the base job is a script job */
    spec_tune_param_t params[SPEC_TUNE_MAX_PARAMS];
    int nparams;
    char metric[64];             /* objective.metric */
    bool maximize;               /* objective.goal "maximize" (default "minimize") */
    spec_tune_strategy_t strategy;
    int64_t min_resource, max_resource; /* hyperband: steps */
    int reduction_factor;        /* hyperband: eta, 2 to 10 (default 3) */
    spec_tune_sampler_t sampler; /* hyperband.sampler (default random) */
    int brackets;                /* hyperband: brackets, 1 to its rungs (default 1: trials start at the first rung) */
    int max_rungs;               /* hyperband: rungs at most, max_resource's included (0: every rung of the ladder) */
    int max_jobs;                /* trials in all (default 10) */
    int max_parallel_jobs;       /* trials at once (default 1); at most max_jobs */
    uint64_t seed;
    bool seed_set;               /* false: kilnd draws one at submission and records it */
    bool has_target;             /* completion.target_objective given */
    double target;
    int no_improvement_trials;   /* completion.no_improvement_trials (0: off) */
    bool early_stopping;         /* early_stopping "auto": the median stopping rule (random, grid, bayesian) */
    int max_failed_trials;       /* failed trials that end the tuning job (default 3) */
    int trial_priority;          /* default: the base job's priority minus 1 */
    int nparents;                /* warm_start.parents: earlier tuning jobs whose trials are history */
    char parents[SPEC_TUNE_MAX_PARENTS][40]; /* their ids (UUIDs, lower case, distinct) */
    spec_warm_type_t warm_type;  /* warm_start.type; SPEC_WARM_NONE without parents */
    bool stored;                 /* read by spec_tuning_load: its values are not tried again */
} spec_tuning_t;

/* Parses and validates a tuning request (the body of POST /v1/tuning-jobs; the keys name, job,
 * parameters, objective, strategy, hyperband, max_jobs, max_parallel_jobs, seed, completion,
 * early_stopping, max_failed_trials, trial_priority, warm_start). warm_start is {"parents": [1 to
 * SPEC_TUNE_MAX_PARENTS distinct tuning job ids], "type": "identical_data_and_algorithm" |
 * "transfer_learning"}; what needs the parents themselves (they exist, share the project, have
 * ended with trials, the same objective) is checked where the submission reads them
 * (svc_tuning_create). A bare parameter name means
 * hyperparameters.<name> (an engine job's hyperparameters section and a script job's free-form
 * hyperparameters alike); a dotted name is a path in the job spec. KILN_EINVAL with err->field
 * the offending field ("parameters.lr.min", "job.model.n_head", "max_parallel_jobs") otherwise.
 * *out must be released with spec_tuning_deinit() on success. */
int spec_tuning_parse(const json_t *in, spec_tuning_t *out, kiln_err_t *err);
/* The same for a request kilnd accepted and stored (spec_tuning_to_json's): everything but trying
 * the base job's validator on each parameter's values, which spec_tuning_parse did then and which
 * costs one job validation per categorical value and range end on every read. */
int spec_tuning_load(const json_t *in, spec_tuning_t *out, kiln_err_t *err);
/* Releases what spec_tuning_parse allocated. Accepts NULL. */
void spec_tuning_deinit(spec_tuning_t *t);
/* The normalised request (every field with its effective value). Caller owns the result. */
json_t *spec_tuning_to_json(const spec_tuning_t *t);
/* The job spec of a trial: the base job with each parameter's value (values: an object by
 * parameter name) set at its path, named name, tagged tags (an object of strings, merged into
 * the base job's), at the request's trial_priority; for hyperband, hyperparameters.max_steps is
 * the last rung (max_resource) and stopping.max_steps the first (min_resource): it pauses there. Caller
 * owns the result; NULL when out of memory. */
json_t *spec_tuning_trial_spec(const spec_tuning_t *t, const json_t *values, const char *name, const json_t *tags);
/* warm_start.type's name ("identical_data_and_algorithm", "transfer_learning"; "" for none). Static
 * storage. */
const char *spec_warm_type_name(spec_warm_type_t w);
/* The strategy's name ("random", "grid", "hyperband"). Static storage. */
const char *spec_tune_strategy_name(spec_tune_strategy_t s);

#endif /* KILN_SPEC_H */
