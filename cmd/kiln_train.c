/* kiln_train.c - kiln-train, one rank of a training job: reads its place in the job from the rank
 * contract's environment (rank/rank.h, docs/contracts.md) and flags, the job spec, trains, and
 * exits with the contract's codes: 0 (done), 143 (stopped by SIGTERM after a checkpoint), 2 (bad
 * spec or data) or 1 (failure). Everything else lives in engine/. */
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "cmd/faults.h"
#include "engine/comm/comm.h"
#include "engine/engine.h"
#include "engine/job.h"
#include "rank/rank.h"
#include "spec/spec.h"

static volatile int g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

int main(int argc, char **argv)
{
    const char *spec_path = NULL, *ckpt_dir = NULL, *out_dir = NULL, *prompt = NULL, *resume = NULL;
    const char *init_model = NULL, *log_level = "info";
    int64_t threads = 0, max_steps = 0;
    double peak = 0;
    bool quiet = false, fresh = false;
    eng_settings_t es = ENG_SETTINGS_INIT;
    const char *cpu_sgemm = NULL, *cuda_lib = NULL;
    bool cpu_bf16 = true;
    comm_settings_t cs = COMM_SETTINGS_INIT;
    es.comm = &cs;
    /* The rank contract first: the flags below override what the agent set. */
    rank_env_t re;
    kiln_err_t err;
    kiln_err_clear(&err);
    log_init("kiln-train");
    if (rank_env_parse(NULL, &re, &err) != 0) {
        fprintf(stderr, "kiln-train: %s\n", err.message);
        return RANK_EXIT_BAD_INPUT;
    }
    /* before any thread starts (OpenMP's, the communication thread), so all of them inherit it */
    char cpus[RANK_CPUS_LIST_MAX] = "";
    if (re.cpus) {
        cpu_set_t bound;
        if (rank_cpus_bind(re.cpus, &bound, &err) != 0) {
            fprintf(stderr, "kiln-train: %s\n", err.message);
            return RANK_EXIT_BAD_INPUT;
        }
        rank_cpus_format(&bound, cpus, sizeof(cpus));
    }
    spec_path = re.spec;
    threads = re.threads;
    ckpt_dir = re.checkpoint_dir;
    out_dir = re.output_dir;
    resume = re.resume_from;
    fresh = re.fresh_start;
    init_model = re.init_model;
    config_flag_t flags[] = {
        {"spec", NULL, CONFIG_STR, &spec_path, CONFIG_ANY, "job spec JSON file (default " RANK_ENV_SPEC ")"},
        {"threads", NULL, CONFIG_INT, &threads, CONFIG_RANGE(0, RANK_MAX_THREADS), "CPU threads (default " RANK_ENV_THREADS "; 0: spec or all cores)"},
        {"checkpoint-dir", NULL, CONFIG_STR, &ckpt_dir, CONFIG_ANY,
         "checkpoint directory: resumes from the newest checkpoint in it (default " RANK_ENV_CHECKPOINT_DIR ")"},
        {"resume-from", NULL, CONFIG_STR, &resume, CONFIG_ANY,
         "another checkpoint directory to resume from when it holds a newer checkpoint (default "
         RANK_ENV_RESUME_FROM ")"},
        {"fresh-start", NULL, CONFIG_BOOL, &fresh, CONFIG_ANY,
         "train from step 0, resuming from neither checkpoint directory (default " RANK_ENV_FRESH_START
         "; kilnd's --tune-promoted-restart)"},
        {"output-dir", NULL, CONFIG_STR, &out_dir, CONFIG_ANY, "samples and the final model (default " RANK_ENV_OUTPUT_DIR ")"},
        {"init-model", NULL, CONFIG_STR, &init_model, CONFIG_ANY,
         "the model file a spec's model.init_from \"job:<id>\" stands for (default " RANK_ENV_INIT_MODEL
         ", set by kiln-agent to the copy it fetched from kilnd)"},
        {"max-steps", NULL, CONFIG_INT, &max_steps, CONFIG_RANGE(0, 1000000000000), "override hyperparameters.max_steps"},
        {"sample", NULL, CONFIG_STR, &prompt, CONFIG_ANY, "prompt for text samples (default a newline)"},
        {"peak-gflops", "KILN_PEAK_GFLOPS", CONFIG_DOUBLE, &peak, CONFIG_RANGE(0, 1e9),
         "machine peak for MFU (0: measure an FMA loop at start)"},
        {"quiet", NULL, CONFIG_BOOL, &quiet, CONFIG_ANY, "no per-step log lines"},
        {"log-level", "KILN_LOG_LEVEL", CONFIG_STR, &log_level, CONFIG_ONE_OF(LOG_LEVEL_CHOICES),
         "the least severe log lines written"},
        {"dp-check", "KILN_DP_CHECK", CONFIG_BOOL, &es.dp_check, CONFIG_ANY,
         "after every step, the ranks compare a hash of their parameters and fail on divergence"},
        {"dp-overlap", "KILN_DP_OVERLAP", CONFIG_BOOL, &es.dp_overlap, CONFIG_ANY,
         "send each gradient bucket as soon as backward has finished it (false: all after backward)"},
        {"dp-zero", "KILN_DP_ZERO", CONFIG_STR, &es.dp_zero, CONFIG_ONE_OF("0|1"),
         "1: shard the optimizer state across the ranks (ZeRO-1); replaces the spec's "
         "distribution.data_parallel.shard_optimizer_state"},
        {"dp-bucket-mb", "KILN_DP_BUCKET_MB", CONFIG_DOUBLE, &es.dp_bucket_mb, CONFIG_RANGE(0, 4096),
         "gradient bucket size in MiB; replaces the spec's bucket_mb (0: the spec's, else chosen from the model)"},
        {"dp-gradient-dtype", "KILN_DP_GRADIENT_DTYPE", CONFIG_STR, &es.dp_gradient_dtype,
         CONFIG_ONE_OF("fp32|bf16"), "the gradients' wire type; replaces the spec's gradient_dtype"},
        {"pipe-trace", "KILN_PIPE_TRACE", CONFIG_BOOL, &es.pipe_trace, CONFIG_ANY,
         "print the last step's per-action timings of every pipeline stage"},
        COMM_SETTINGS_FLAGS(&cs),
        {"cpu-sgemm", "KILN_CPU_SGEMM", CONFIG_STR, &cpu_sgemm, CONFIG_ONE_OF("onednn|openblas"),
         "what runs the CPU backend's fp32 GEMMs (default: OpenBLAS, or oneDNN's AVX-512 kernels where "
         "OPENBLAS_CORETYPE holds OpenBLAS to kernels without AVX-512 on a CPU that has it)"},
        {"cuda-lib", "KILN_CUDA_LIB", CONFIG_STR, &cuda_lib, CONFIG_ANY,
         "path of libkiln_cuda.so when it is not beside kiln-train or in ../lib (kiln-agent passes its own)"},
#if KILN_FAULTS
        {"cpu-bf16", "KILN_CPU_BF16", CONFIG_BOOL, &cpu_bf16, CONFIG_TEST,
         "false: the CPU looks as if it had no bf16 instructions (mixed_precision \"bf16\" is then refused)"},
        {"dp-inject-rank", "KILN_DP_INJECT_RANK", CONFIG_INT, &es.dp_inject_rank, CONFIG_TEST_RANGE(-1, 1000000),
         "this rank perturbs a parameter after step --dp-inject-step, so that the ranks diverge (-1: none)"},
        {"dp-inject-step", "KILN_DP_INJECT_STEP", CONFIG_INT, &es.dp_inject_step, CONFIG_TEST_RANGE(0, 1e12),
         "the step after which --dp-inject-rank diverges"},
        COMM_SETTINGS_TEST_FLAGS(&cs),
#endif
    };
    int rc = config_parse(argc, argv, flags, KILN_ARRAY_LEN(flags),
                          "--spec FILE [options]\n(a rank started by kiln-agent reads its place in the job from "
                          "the KILN_* variables of docs/contracts.md)", NULL, &err);
    if (rc == 1) return RANK_EXIT_DONE;
    if (rc) {
        fprintf(stderr, "kiln-train: %s\n", err.message);
        return RANK_EXIT_BAD_INPUT;
    }
    /* libgomp and OpenBLAS read their tuning variables once, when they load: when
     * eng_cpu_tune_env() sets any (passive OpenMP waiting, OpenBLAS kernels for Zen 4), re-exec
     * ourselves once (same pid, same fds, so the agent sees nothing), with settings that have
     * been checked. */
    if (!getenv("KILN_TRAIN_REEXEC") && eng_cpu_tune_env()) {
        setenv("KILN_TRAIN_REEXEC", "1", 1);
        execv("/proc/self/exe", argv);
        /* exec failed: carry on with the defaults */
    }
    log_level_t level = LOG_INFO;
    log_level_parse(log_level, &level); /* one of the table's choices */
    log_set_level(level);
    eng_cpu_settings_set(cpu_sgemm, cpu_bf16);
    eng_backend_cuda_lib_set(cuda_lib);
    if (!spec_path || !*spec_path) {
        fprintf(stderr, "kiln-train: no job spec: pass --spec FILE or set " RANK_ENV_SPEC "\n");
        return RANK_EXIT_BAD_INPUT;
    }

    spec_t spec;
    if ((rc = spec_load_file(spec_path, &spec, &err))) {
        if (err.hint[0]) fprintf(stderr, "kiln-train: hint: %s\n", err.hint);
        fprintf(stderr, "kiln-train: invalid job spec %s: %s%s%s\n", spec_path,
                err.field[0] ? err.field : "", err.field[0] ? ": " : "", err.message);
        return RANK_EXIT_BAD_INPUT;
    }
    if (spec_is_script(&spec)) {
        fprintf(stderr, "kiln-train: %s is a script job's spec (entry_point \"%s\"): kiln-train trains kiln's own "
                "models; kiln-agent runs scripts\n", spec_path, spec.script.entry_point);
        spec_deinit(&spec);
        return RANK_EXIT_BAD_INPUT;
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    char *dup = strdup(spec_path);
    eng_train_opts_t o;
    memset(&o, 0, sizeof(o));
    o.checkpoint_dir = ckpt_dir;
    o.resume_from = resume;
    o.fresh_start = fresh;
    o.output_dir = out_dir;
    o.max_steps_override = max_steps;
    o.threads = (int)threads;
    o.peak_gflops = peak;
    o.metrics_fd = re.metrics_fd;
    o.rank = re.rank;
    o.world = re.world_size;
    o.sample_prompt = prompt;
    o.spec_dir = dup ? dirname(dup) : ".";
    o.init_model = init_model;
    o.stop_flag = &g_stop;
    o.quiet = quiet;
    o.settings = &es;
    /* the agent's regex metrics take the step of a line from the step marks before it */
    o.step_marks = re.step_marks && spec.n_metric_defs > 0;
    if (o.step_marks) {
        rank_step_mark_write(stdout, 0);
        rank_step_mark_write(stderr, 0);
    }
    printf("kiln-train: job \"%s\" rank %d/%d attempt %d%s%s\n", spec.name, o.rank, o.world, re.attempt,
           cpus[0] ? ", bound to CPUs " : "", cpus);
    fflush(stdout);

    /* the job's ranks join from the KILN_* environment when there are several */
    eng_train_result_t res;
    rc = eng_job_run(&spec, &o, NULL, &res, NULL, &err);
    free(res.losses);
    spec_deinit(&spec);
    free(dup);
    if (rc) {
        /* the hint first: the agent takes the last stderr line as the failure reason */
        if (err.hint[0]) fprintf(stderr, "kiln-train: hint: %s\n", err.hint);
        fprintf(stderr, "kiln-train: %s%s%s\n", err.field[0] ? err.field : "",
                err.field[0] ? ": " : "", err.message[0] ? err.message : kiln_strerror(rc));
        return rank_exit_code_for(&err);
    }
    /* stopped on request (SIGTERM from the agent, or SIGINT at a terminal), checkpoint written */
    if (res.stopped) return RANK_EXIT_STOPPED;
    return RANK_EXIT_DONE;
}
