/* rank.h - the rank contract: what kiln-agent and the kiln-train ranks it starts promise each
 * other (docs/contracts.md). The environment a rank is started with (names, a struct, the
 * launcher's envp and the rank's reading of it), the CPUs a rank binds itself to (KILN_CPUS),
 * the metric record a rank writes on KILN_METRICS_FD (one writer, one parser), the step marks
 * that say which step a rank's log lines belong to (one writer, one parser), the exit codes
 * and what they mean for the job, the removal of what a rank's shared-memory transport
 * leaves in /dev/shm, and what a script rank gets beyond all that (torchrun's and SageMaker's
 * variables, SageMaker's arguments: script.c).
 * A leaf: it depends on base/ only. It launches nothing (agent/) and trains nothing (engine/). */
#ifndef KILN_RANK_H
#define KILN_RANK_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"

/* ------------------------------------------------------------------------------------------
 * The environment. Every variable the agent sets for a rank, by name. Nothing else in kiln
 * spells these names; tuning knobs an operator may add (KILN_COMM_CHUNK_BYTES, KILN_DP_*,
 * KILN_CUDA_*, ...) are not part of the contract and live with what they tune.
 * ------------------------------------------------------------------------------------------ */
#define RANK_ENV_SPEC             "KILN_SPEC"
#define RANK_ENV_JOB_ID           "KILN_JOB_ID"
#define RANK_ENV_ATTEMPT          "KILN_ATTEMPT"
#define RANK_ENV_RANK             "KILN_RANK"
#define RANK_ENV_WORLD_SIZE       "KILN_WORLD_SIZE"
#define RANK_ENV_LOCAL_RANK       "KILN_LOCAL_RANK"
#define RANK_ENV_LOCAL_WORLD_SIZE "KILN_LOCAL_WORLD_SIZE"
#define RANK_ENV_NODE_RANK        "KILN_NODE_RANK"
#define RANK_ENV_NODES            "KILN_NODES"
#define RANK_ENV_MASTER_ADDR      "KILN_MASTER_ADDR"
#define RANK_ENV_MASTER_PORT      "KILN_MASTER_PORT"
#define RANK_ENV_CHECKPOINT_DIR   "KILN_CHECKPOINT_DIR"
#define RANK_ENV_OUTPUT_DIR       "KILN_OUTPUT_DIR"
#define RANK_ENV_RESUME_FROM      "KILN_RESUME_FROM"
#define RANK_ENV_INIT_MODEL       "KILN_INIT_MODEL"
#define RANK_ENV_METRICS_FD       "KILN_METRICS_FD"
#define RANK_ENV_THREADS          "KILN_THREADS"
#define RANK_ENV_DEVICE_ID        "KILN_DEVICE_ID"
#define RANK_ENV_DATA_ROOTS       "KILN_DATA_ROOTS"
#define RANK_ENV_COMM_WATCHDOG_S  "KILN_COMM_WATCHDOG_S"
#define RANK_ENV_CPUS             "KILN_CPUS"
#define RANK_ENV_PROJECT          "KILN_PROJECT"
#define RANK_ENV_STEP_MARKS       "KILN_STEP_MARKS"
#define RANK_ENV_FRESH_START      "KILN_FRESH_START"
#define RANK_ENV_PAUSE_AT_STEP    "KILN_PAUSE_AT_STEP"
/* Set from the contract's values for the libraries a rank loads (OpenMP, CUDA). */
#define RANK_ENV_OMP_THREADS      "OMP_NUM_THREADS"
#define RANK_ENV_CUDA_DEVICES     "CUDA_VISIBLE_DEVICES"

/* A script rank (a job with an entry_point) also gets torchrun's variables, so that a script
 * written for torchrun runs unchanged, and SageMaker's SM_* variables (script mode). */
#define RANK_ENV_TORCH_RANK             "RANK"
#define RANK_ENV_TORCH_WORLD_SIZE       "WORLD_SIZE"
#define RANK_ENV_TORCH_LOCAL_RANK       "LOCAL_RANK"
#define RANK_ENV_TORCH_LOCAL_WORLD_SIZE "LOCAL_WORLD_SIZE"
#define RANK_ENV_TORCH_GROUP_RANK       "GROUP_RANK"
#define RANK_ENV_TORCH_GROUP_WORLD_SIZE "GROUP_WORLD_SIZE"
#define RANK_ENV_TORCH_ROLE_RANK        "ROLE_RANK"
#define RANK_ENV_TORCH_ROLE_WORLD_SIZE  "ROLE_WORLD_SIZE"
#define RANK_ENV_TORCH_ROLE_NAME        "ROLE_NAME"
#define RANK_ENV_TORCH_MASTER_ADDR      "MASTER_ADDR"
#define RANK_ENV_TORCH_MASTER_PORT      "MASTER_PORT"
#define RANK_ENV_TORCH_RESTART_COUNT    "TORCHELASTIC_RESTART_COUNT"
#define RANK_ENV_TORCH_MAX_RESTARTS     "TORCHELASTIC_MAX_RESTARTS"
#define RANK_ENV_TORCH_RUN_ID           "TORCHELASTIC_RUN_ID"
#define RANK_ENV_SM_PREFIX              "SM_"
#define RANK_ENV_KILN_PREFIX            "KILN_"

/* The names a job spec's "environment" may not set, because kiln sets them (or must keep them
 * out of a rank), each with the reason a refusal gives: torchrun's variables, OpenMP's and CUDA's
 * (from the rank's slot), every SM_* and KILN_* name, and the loader's LD_PRELOAD and LD_AUDIT
 * (they load code into every program the rank's environment reaches, the launcher's own helpers
 * included, before the script's code runs; a script that wants a preload sets it for the
 * programs it starts). LD_LIBRARY_PATH, PATH and PYTHONPATH stay the job's: a virtual
 * environment may need them, and they change nothing that the script's own code could not. The
 * one list: spec/ refuses these names and the launcher sets them. */
#define RANK_ENV_RESERVED(X)                                                                    \
    X(RANK_ENV_TORCH_RANK, "torchrun's")                                                        \
    X(RANK_ENV_TORCH_WORLD_SIZE, "torchrun's")                                                  \
    X(RANK_ENV_TORCH_LOCAL_RANK, "torchrun's")                                                  \
    X(RANK_ENV_TORCH_LOCAL_WORLD_SIZE, "torchrun's")                                            \
    X(RANK_ENV_TORCH_GROUP_RANK, "torchrun's")                                                  \
    X(RANK_ENV_TORCH_GROUP_WORLD_SIZE, "torchrun's")                                            \
    X(RANK_ENV_TORCH_ROLE_RANK, "torchrun's")                                                   \
    X(RANK_ENV_TORCH_ROLE_WORLD_SIZE, "torchrun's")                                             \
    X(RANK_ENV_TORCH_ROLE_NAME, "torchrun's")                                                   \
    X(RANK_ENV_TORCH_MASTER_ADDR, "torchrun's")                                                 \
    X(RANK_ENV_TORCH_MASTER_PORT, "torchrun's")                                                 \
    X(RANK_ENV_TORCH_RESTART_COUNT, "torchrun's")                                               \
    X(RANK_ENV_TORCH_MAX_RESTARTS, "torchrun's")                                                \
    X(RANK_ENV_TORCH_RUN_ID, "torchrun's")                                                      \
    X(RANK_ENV_OMP_THREADS, "set from the rank's cores")                                        \
    X(RANK_ENV_CUDA_DEVICES, "set from the rank's GPU slot")                                    \
    X("LD_PRELOAD", "a loader variable that would load code into kiln's own helpers")          \
    X("LD_AUDIT", "a loader variable that would load code into kiln's own helpers")

/* Why name may not be set by a spec's "environment" (a reason such as "torchrun's", "SageMaker's
 * (every SM_* name)"), or NULL when it may. Static storage. */
static inline const char *rank_env_reserved(const char *name)
{
#define RANK_ENV_RESERVED_CMP(n, why)                                                           \
    if (!strcmp(name, n))                                                                       \
        return why;
    RANK_ENV_RESERVED(RANK_ENV_RESERVED_CMP)
#undef RANK_ENV_RESERVED_CMP
    if (!strncmp(name, RANK_ENV_SM_PREFIX, strlen(RANK_ENV_SM_PREFIX)))
        return "SageMaker's (every SM_* name)";
    if (!strncmp(name, RANK_ENV_KILN_PREFIX, strlen(RANK_ENV_KILN_PREFIX)))
        return "kiln's rank contract (every KILN_* name)";
    return NULL;
}

/* SageMaker's script-mode variables a script rank gets (SM_CHANNEL_<NAME> and SM_HP_<NAME> are
 * built from the channel's and the hyperparameter's name in upper case). */
#define RANK_ENV_SM_MODEL_DIR       "SM_MODEL_DIR"
#define RANK_ENV_SM_OUTPUT_DIR      "SM_OUTPUT_DIR"
#define RANK_ENV_SM_OUTPUT_DATA_DIR "SM_OUTPUT_DATA_DIR"
#define RANK_ENV_SM_CHANNELS        "SM_CHANNELS"
#define RANK_ENV_SM_CHANNEL_PREFIX  "SM_CHANNEL_"
#define RANK_ENV_SM_HPS             "SM_HPS"
#define RANK_ENV_SM_HP_PREFIX       "SM_HP_"
#define RANK_ENV_SM_USER_ARGS       "SM_USER_ARGS"
#define RANK_ENV_SM_CURRENT_HOST    "SM_CURRENT_HOST"
#define RANK_ENV_SM_HOSTS           "SM_HOSTS"
#define RANK_ENV_SM_NUM_CPUS        "SM_NUM_CPUS"
#define RANK_ENV_SM_NUM_GPUS        "SM_NUM_GPUS"
#define RANK_ENV_SM_TRAINING_ENV    "SM_TRAINING_ENV"
#define RANK_ENV_SM_CHECKPOINT_DIR  "SM_CHECKPOINT_DIR"
#define RANK_SM_FAILURE_FILE        "failure"   /* in SM_OUTPUT_DIR: the script's failure reason */
#define RANK_SM_FAILURE_MAX         1024        /* characters of it the job's reason keeps */
#define RANK_SM_CHECKPOINT_PATH     "/opt/ml/checkpoints" /* where a sandboxed rank also finds them */

#define RANK_MAX_WORLD (1 << 20)         /* ranks of one job, at most */
#define RANK_MAX_THREADS 4096
#define RANK_MAX_STEP ((int64_t)1 << 40)  /* KILN_PAUSE_AT_STEP, at most (the spec's bound) */
#define RANK_MAX_WATCHDOG_S (7 * 86400)  /* KILN_COMM_WATCHDOG_S, at most a week */

/* A rank's place in its job. Strings are borrowed: from the environment (rank_env_parse) or
 * from the caller (rank_env_envp). "Unset" values are what a rank started by hand, without an
 * agent, gets. */
typedef struct rank_env {
    const char *spec;            /* KILN_SPEC: the job spec JSON file; NULL: unset */
    const char *job_id;          /* KILN_JOB_ID; NULL: unset */
    int attempt;                 /* KILN_ATTEMPT, >= 1 (1 when unset) */
    int rank, world_size;        /* KILN_RANK in [0, world_size), KILN_WORLD_SIZE >= 1 (0, 1) */
    int local_rank;              /* KILN_LOCAL_RANK in [0, local_world_size) (0) */
    int local_world_size;        /* KILN_LOCAL_WORLD_SIZE: ranks of the job on this agent (1) */
    int node_rank, nodes;        /* KILN_NODE_RANK in [0, nodes), KILN_NODES: agents (0, 1) */
    const char *master_addr;     /* KILN_MASTER_ADDR: rank 0's host; NULL: unset */
    int master_port;             /* KILN_MASTER_PORT 1..65535; 0: unset */
    const char *checkpoint_dir;  /* KILN_CHECKPOINT_DIR; NULL: unset (no checkpoints) */
    const char *output_dir;      /* KILN_OUTPUT_DIR; NULL: unset */
    const char *resume_from;     /* KILN_RESUME_FROM: a checkpoint directory to resume from
                                  * when it holds a newer checkpoint than checkpoint_dir; NULL */
    const char *init_model;      /* KILN_INIT_MODEL: the local copy of the model a spec's
                                  * model.init_from "job:<id>" names, fetched by the agent; NULL */
    int metrics_fd;              /* KILN_METRICS_FD >= 0; -1: unset (no metric records) */
    int threads;                 /* KILN_THREADS 1..RANK_MAX_THREADS; 0: unset */
    int device_id;               /* KILN_DEVICE_ID >= 0 (and CUDA_VISIBLE_DEVICES); -1: none */
    const char *data_roots;      /* KILN_DATA_ROOTS: the directories a rank may read,
                                  * comma-separated; "" none; NULL: unset (anything, by hand) */
    double comm_watchdog_s;      /* KILN_COMM_WATCHDOG_S: a collective without progress for this
                                  * long fails; 0: unset (the engine's default) */
    const char *cpus;            /* KILN_CPUS: the CPUs every thread of the rank runs on, a Linux
                                  * CPU list ("0-3,8"; rank_cpus_parse); NULL: unset (the kernel
                                  * places the threads) */
    const char *project;         /* KILN_PROJECT: the job's project, a project name (1 to 63 of
                                  * a-z 0-9 . _ -); its area of a data root is .kiln/<project>,
                                  * and no other project's may be read; NULL: unset (every area
                                  * is another's) */
    bool step_marks;             /* KILN_STEP_MARKS=1: whoever reads the rank's stdout and stderr
                                  * (the agent) takes step marks out of them (below); false:
                                  * unset (0) */
    bool fresh_start;            /* KILN_FRESH_START=1: train from step 0 whatever checkpoints
                                  * checkpoint_dir and resume_from hold (a tuning trial promoted
                                  * under kilnd's --tune-promoted-restart); false: unset (0) */
    int64_t pause_at_step;       /* KILN_PAUSE_AT_STEP, 1..RANK_MAX_STEP: the spec's stopping.max_steps
                                  * (a hyperband trial's rung), where a script writes its checkpoint,
                                  * reports that step's metrics and exits 0 on every rank, paused;
                                  * 0: unset (train to the end) */
} rank_env_t;

/* The values of a rank started without an agent (world of one, nothing set). */
void rank_env_init(rank_env_t *e);

/* Reads the contract's variables from envp (NULL-terminated "NAME=value" strings; NULL: the
 * process environment) into *out (OUT; strings point into envp's storage). An unset or empty
 * variable keeps rank_env_init's value. Returns 0, or KILN_EINVAL when a value is malformed or
 * out of range or the values contradict each other; err->field is the variable's name and the
 * message says what it must be ("KILN_RANK 3 must be below KILN_WORLD_SIZE 2"). */
int rank_env_parse(char *const *envp, rank_env_t *out, kiln_err_t *err);

/* The environment of a rank started with *e: the entries of base (NULL-terminated; NULL: none)
 * that are neither the contract's variables nor secrets (rank_env_is_secret), then the
 * contract's variables that e sets (OMP_NUM_THREADS with KILN_THREADS, CUDA_VISIBLE_DEVICES with
 * KILN_DEVICE_ID). *e is checked with rank_env_parse's rules first, so a rank never gets what it
 * would refuse. Caller owns *out (a NULL-terminated array of heap strings); free with
 * rank_envp_free(). Returns 0, KILN_EINVAL (err names the variable) or KILN_ENOMEM. */
int rank_env_envp(const rank_env_t *e, char *const *base, char ***out, kiln_err_t *err);
void rank_envp_free(char **envp); /* accepts NULL */

/* What a script rank (a job with an entry_point) gets beyond the rank contract: torchrun's
 * variables, SageMaker's, the spec's environment. Strings are borrowed. */
typedef struct rank_script_env {
    const char *entry_point;          /* as the spec names it (SM_TRAINING_ENV) */
    const char *hyperparameters_json; /* a JSON object's text; NULL: {} */
    const char *const *channel_names; /* data.channels, n_channels of them */
    const char *const *channel_paths;
    size_t n_channels;
    const char *const *env_names;     /* the spec's environment, n_env of them */
    const char *const *env_values;
    size_t n_env;
    const char *model_dir;            /* SM_MODEL_DIR */
    const char *output_dir;           /* SM_OUTPUT_DIR (the failure file goes there) */
    const char *output_data_dir;      /* SM_OUTPUT_DATA_DIR */
    int max_restarts;                 /* TORCHELASTIC_MAX_RESTARTS: retry.max_attempts - 1 */
    int num_gpus;                     /* SM_NUM_GPUS: GPUs the rank sees (0 on cpu slots) */
} rank_script_env_t;

/* The environment of a script rank: rank_env_envp's (the agent's environment minus every name
 * rank_env_reserved refuses, then the KILN_* contract, OMP_NUM_THREADS and CUDA_VISIBLE_DEVICES),
 * then torchrun's variables (RANK = KILN_RANK, ..., GROUP_RANK = the node, ROLE_NAME "default",
 * TORCHELASTIC_RESTART_COUNT = attempt - 1, TORCHELASTIC_RUN_ID = the job id; MASTER_ADDR and
 * MASTER_PORT when e has them), SageMaker's (hosts are "algo-<node + 1>"), then the spec's
 * environment (a reserved name there is refused: KILN_EINVAL naming it). Caller owns *out; free
 * with rank_envp_free(). Returns 0, KILN_EINVAL (a bad value or hyperparameters that are not a
 * JSON object) or KILN_ENOMEM. */
int rank_script_envp(const rank_env_t *e, const rank_script_env_t *s, char *const *base, char ***out,
                     kiln_err_t *err);

/* The hyperparameters as the arguments SageMaker's script mode passes: keys in byte order, each
 * "--key" ("-k" for a key of one character) followed by its value printed as Python's str()
 * prints the decoded JSON ("3", "0.01", "True", "None", "[1, 2]", a string as it is) and an
 * object as "k=v,..." with its keys sorted. *out (OUT): a NULL-terminated array of *n heap
 * strings; caller frees with rank_envp_free(). Returns 0, KILN_EINVAL (not a JSON object) or
 * KILN_ENOMEM. */
int rank_script_args(const char *hyperparameters_json, char ***out, size_t *n, kiln_err_t *err);

/* Whether an environment entry ("NAME=value", or a bare name) is one the agent never passes to a
 * rank: KILN_TLS_* and every name holding TOKEN, SECRET, PASSWORD, PASSWD, CREDENTIAL or
 * PRIVATE_KEY, in any case (KILN_JOIN_TOKEN, KILN_JOIN_TOKEN_FILE, KILN_TOKEN, ...). */
bool rank_env_is_secret(const char *entry);

/* KILN_DATA_ROOTS joined from roots[0..n) (resolved directories without commas) into a heap
 * string (caller frees with free()); "" for n = 0. Returns NULL when out of memory or a root
 * holds a comma. */
char *rank_data_roots_join(const char *const *roots, size_t n);

/* For what a rank opens: when KILN_DATA_ROOTS is set in the process environment, confines path
 * to its roots (kiln_path_confine; a missing file inside them passes, so the caller's open
 * reports it) and out of other projects' areas (kiln_path_area_check, with KILN_PROJECT); when it
 * is unset, allows everything (kiln-train run by hand reads what its user asks). field names the
 * spec field in messages. Returns 0, KILN_EINVAL, KILN_ETOOBIG, KILN_EPERM or KILN_ENOMEM. */
int rank_path_confine(const char *path, const char *field, kiln_err_t *err);
/* The same check of the file a rank has opened, as fd (opened from path): where the file really
 * is (/proc/self/fd), so that a symbolic link changed between rank_path_confine and the open
 * cannot take the rank elsewhere. Messages name path, never where the file was found. Call it
 * before reading anything; on failure close fd. Returns 0 (also when KILN_DATA_ROOTS is unset),
 * KILN_EPERM or KILN_ENOMEM. */
int rank_file_confine(int fd, const char *path, const char *field, kiln_err_t *err);

/* ------------------------------------------------------------------------------------------
 * CPU binding. An agent started with --cpus LIST gives each of its slots its own share of those
 * CPUs and each rank the share of its slot as KILN_CPUS; the rank binds itself to it before it
 * starts any thread, so its compute threads, its communication thread and the kernel work they
 * cause stay off the other slots' CPUs.
 * ------------------------------------------------------------------------------------------ */

/* Reads a Linux CPU list ("0-3,8": numbers and ascending ranges, comma-separated, each below
 * CPU_SETSIZE) into *out (OUT). Returns 0 or KILN_EINVAL (err->field is field, the message says
 * what a list looks like). */
int rank_cpus_parse(const char *list, const char *field, cpu_set_t *out, kiln_err_t *err);
#define RANK_CPUS_LIST_MAX (5 * CPU_SETSIZE + 1) /* bytes of the longest list ("0,2,4,...") */
/* Writes s as a CPU list ("0-3,8"; "" when empty) into buf (size n, cut when too small: give
 * RANK_CPUS_LIST_MAX for a list that is passed on); returns buf. */
char *rank_cpus_format(const cpu_set_t *s, char *buf, size_t n);
/* Share i of `parts` shares of all (OUT): consecutive runs of all's CPUs in ascending order, the
 * first (count % parts) shares one CPU larger. Returns the share's CPU count; 0 (an empty share)
 * when all has fewer CPUs than parts or i is out of range. */
int rank_cpus_share(const cpu_set_t *all, int parts, int i, cpu_set_t *out);
/* KILN_EINVAL naming the CPUs of want the calling process may not run on, and those it may
 * ("<label> names CPU(s) 5, which this process may not run on (it may run on 0-1)"; err->field
 * is field); 0 when it may run on all of them. */
int rank_cpus_allowed(const cpu_set_t *want, const char *field, const char *label, kiln_err_t *err);
/* Binds every thread of the calling process, and so every thread it starts after, to the CPUs
 * of list (KILN_CPUS). *bound (OUT, may be NULL) is the mask the kernel then reports. Returns 0 or
 * KILN_EINVAL: a malformed list, a CPU the process may not run on (the message names it and the
 * CPUs it may use), or a refusal by the kernel. */
int rank_cpus_bind(const char *list, cpu_set_t *bound, kiln_err_t *err);

/* ------------------------------------------------------------------------------------------
 * Metric records: one JSON object per line on KILN_METRICS_FD,
 *   {"step": 120, "time": 1795000000.123456, "metrics": {"train_loss": 2.41, "lr": 0.0003}}
 * Values are JSON numbers (17 significant digits: they read back as the same double); JSON has
 * no NaN or infinity, so those travel as the strings "NaN", "Infinity" and "-Infinity".
 * ------------------------------------------------------------------------------------------ */
#define RANK_METRIC_NAME_MAX 127          /* bytes of a metric's name, at most */
#define RANK_METRIC_RECORD_MAX (1 << 20)  /* bytes of one record line, newline included */
#define RANK_METRIC_TIME_MAX 253402300800.0 /* "time" is below this: 10000-01-01T00:00:00Z */

typedef struct rank_metric {
    char name[RANK_METRIC_NAME_MAX + 1];
    double value;                /* may be NaN or +-infinity */
} rank_metric_t;

typedef struct rank_metric_record {
    bool has_step;
    int64_t step;                /* the optimizer step, when has_step */
    bool has_time;
    double time_s;               /* Unix time in seconds, when has_time */
    rank_metric_t *v;            /* heap; release with rank_metric_record_deinit */
    size_t n;
    size_t skipped;              /* entries left out: not a number (nor a non-finite spelling),
                                  * or a name empty, longer than RANK_METRIC_NAME_MAX or with a
                                  * terminal control character (kiln_text_control) */
    char skipped_first[64];      /* the name of the first entry left out, cut (valid UTF-8) */
} rank_metric_record_t;

/* Formats one record (newline-terminated) into a heap string: step, time_s (Unix seconds) and
 * names[i] = vals[i] for i < n. Names are 1..RANK_METRIC_NAME_MAX bytes of UTF-8 without terminal
 * control characters and are escaped as JSON needs. Caller owns *out (free()); *len (OUT) its
 * length. Returns 0, KILN_EINVAL (a negative step; a name empty, too long, not UTF-8 or with a
 * control character, or the record longer than RANK_METRIC_RECORD_MAX: err names the metric;
 * time_s not in [0, RANK_METRIC_TIME_MAX); nothing is formatted) or KILN_ENOMEM. */
int rank_metric_format(int64_t step, double time_s, const char *const *names, const double *vals,
                       size_t n, char **out, size_t *len, kiln_err_t *err);
/* rank_metric_format, then one write(2) of the whole line to fd (retried on EINTR and short
 * writes). Returns 0, rank_metric_format's statuses, or KILN_EIO. */
int rank_metric_write(int fd, int64_t step, double time_s, const char *const *names,
                      const double *vals, size_t n, kiln_err_t *err);
/* Parses one record line (len bytes, no newline needed) into *out (OUT; deinit it after, also
 * after a failure). "step" must be an integer of 0 or more and "time" a number in [0, RANK_METRIC_TIME_MAX)
 * when present (null: absent); "metrics" must be an object. Returns 0, KILN_EFORMAT (err says what is wrong, field the key)
 * or KILN_ENOMEM. */
int rank_metric_parse(const char *line, size_t len, rank_metric_record_t *out, kiln_err_t *err);
void rank_metric_record_deinit(rank_metric_record_t *r);

/* ------------------------------------------------------------------------------------------
 * Step marks: the step a rank's log lines belong to, told on the pipe that carries them. A rank
 * started with KILN_STEP_MARKS=1 may write a mark line on stdout or stderr; the lines after it on
 * that stream belong to its step, up to the next mark. The reader takes marks out of the log and
 * gives a metric definition's match (a regex over log lines) the step of its stream's last mark.
 * Being in the same byte stream as the lines, a mark is ordered with them exactly; no other
 * channel (the metric records' pipe) can overtake it. A mark is RANK_STEP_MARK_PREFIX, the step
 * in decimal (0 to INT64_MAX, no sign or leading zeros) and a newline; anything else, even close
 * to one, is an ordinary log line. kiln-train writes one on both streams when it starts (step 0),
 * once it has resumed (the step it resumed from) and before each step's lines.
 * ------------------------------------------------------------------------------------------ */
#define RANK_STEP_MARK_PREFIX "\x1e" "kiln-step " /* ASCII record separator: never typed by chance */
#define RANK_STEP_MARK_MAX 40                   /* bytes of a mark, newline and NUL included */

/* Formats the mark of step (>= 0) into buf (size n >= RANK_STEP_MARK_MAX), newline-terminated.
 * Returns its length, or -1 for a negative step or a buffer too small (buf then holds ""). */
int rank_step_mark_format(int64_t step, char *buf, size_t n);
/* rank_step_mark_format, then fputs to f (a rank's stdout or stderr: the stdio stream its lines
 * go through, so the mark keeps its place among them; not flushed). Returns 0 or KILN_EIO. */
int rank_step_mark_write(FILE *f, int64_t step);
/* Whether line[0..len) (without its newline) is a mark; if so *step (OUT) is its step. */
bool rank_step_mark_parse(const char *line, size_t len, int64_t *step);

/* ------------------------------------------------------------------------------------------
 * Exit codes and what an ended rank means for its job.
 * ------------------------------------------------------------------------------------------ */
enum {
    RANK_EXIT_DONE = 0,       /* every step done */
    RANK_EXIT_FAILURE = 1,    /* failed while running (a peer, the device, the file system...) */
    RANK_EXIT_BAD_INPUT = 2,  /* the spec or its data cannot work: another attempt would fail too */
    RANK_EXIT_STOPPED = 143,  /* stopped on request (SIGTERM) after writing a checkpoint */
};

/* kiln-train's exit code for a run that ended with err: RANK_EXIT_BAD_INPUT for problems of the
 * spec, its data or a layout the engine cannot run (KILN_EINVAL, KILN_ENOTFOUND, KILN_EFORMAT,
 * KILN_EUNSUPP, KILN_EUNAVAIL, KILN_EPERM (a path outside the data roots), and KILN_EIO on a data.* or model.* field), else
 * RANK_EXIT_FAILURE. */
int rank_exit_code_for(const kiln_err_t *err);

typedef enum {
    RANK_END_DONE,       /* exit code 0 */
    RANK_END_BAD_INPUT,  /* exit code 2: the job fails at once */
    RANK_END_LOST,       /* any other exit or a signal: the attempt is lost, like a lost worker */
} rank_end_t;

/* What a rank that ended with exit_code (when sig is 0) or by signal sig means for its job. */
rank_end_t rank_end_of(int exit_code, int sig);

/* How the rank ended, for reasons people read: "exited with code 2 (bad spec or data)",
 * "exited with code 143 (stopped after a checkpoint)", "was killed by signal 9 (Killed)".
 * Writes into buf (size n); returns buf. */
char *rank_end_describe(int exit_code, int sig, char *buf, size_t n);

/* ------------------------------------------------------------------------------------------
 * Shared memory. The comm module's shm transport (libfabric's shm provider) keeps one region per
 * process, /dev/shm/<pid>:<...>, which a process killed by a signal cannot remove. Whoever knows
 * that pids[0..n) have ended calls this: the agent for each of an attempt's ranks once it has
 * exited and before it is reaped (so the pid, held by the zombie, cannot already name another
 * process's region), a rank for its own pid before it opens the transport (a region left by an
 * earlier process with its pid). Removes only regular files named "<pid>:..." for those pids.
 * Returns how many it removed.
 * ------------------------------------------------------------------------------------------ */
int rank_shm_cleanup(const int *pids, size_t n);

#endif /* KILN_RANK_H */
