/* kiln_train.c - kiln-train, one rank of a training job: reads the job spec and its place in the
 * job from flags or the rank contract's environment (docs/contracts.md), trains, and exits
 * 0 (done), 143 (stopped by SIGTERM after a checkpoint), 2 (bad spec or data) or 1 (failure).
 * Everything else lives in engine/. */
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "engine/engine.h"
#include "engine/job.h"
#include "spec/spec.h"

static volatile int g_stop;
static volatile int g_signo;

static void on_signal(int sig)
{
    g_stop = 1;
    g_signo = sig;
}

static int env_int(const char *name, int def)
{
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end;
    long x = strtol(v, &end, 10);
    return *end ? def : (int)x;
}

/* Setup problems (the spec, the data, an unsupported layout) exit 2; others 1. */
static int exit_code_for(const kiln_err_t *err)
{
    switch (err->status) {
    case KILN_EINVAL:
    case KILN_ENOTFOUND:
    case KILN_EFORMAT:
    case KILN_EUNSUPP:
    case KILN_EUNAVAIL:
        return 2;
    case KILN_EIO:
        return strncmp(err->field, "data", 4) == 0 || strncmp(err->field, "model", 5) == 0 ? 2 : 1;
    default:
        return 1;
    }
}

int main(int argc, char **argv)
{
    const char *spec_path = NULL, *ckpt_dir = NULL, *out_dir = NULL, *prompt = NULL, *init_model = NULL;
    int64_t threads = 0, max_steps = 0;
    double peak = 0;
    bool quiet = false;
    config_flag_t flags[] = {
        {"spec", "KILN_SPEC", CONFIG_STR, &spec_path, "job spec JSON file"},
        {"threads", "KILN_THREADS", CONFIG_INT, &threads, "CPU threads (0: spec or all cores)"},
        {"checkpoint-dir", "KILN_CHECKPOINT_DIR", CONFIG_STR, &ckpt_dir,
         "checkpoint directory (resumes from the newest checkpoint in it)"},
        {"output-dir", "KILN_OUTPUT_DIR", CONFIG_STR, &out_dir, "samples and the final model"},
        {"init-model", "KILN_INIT_MODEL", CONFIG_STR, &init_model,
         "the model file a spec's model.init_from \"job:<id>\" stands for (kiln-agent sets it to the copy it "
         "fetched from kilnd)"},
        {"max-steps", NULL, CONFIG_INT, &max_steps, "override hyperparameters.max_steps"},
        {"sample", NULL, CONFIG_STR, &prompt, "prompt for text samples (default a newline)"},
        {"peak-gflops", "KILN_PEAK_GFLOPS", CONFIG_DOUBLE, &peak,
         "machine peak for MFU (0: measure an FMA loop at start)"},
        {"quiet", NULL, CONFIG_BOOL, &quiet, "no per-step log lines"},
    };
    /* libgomp and OpenBLAS read their tuning variables once, when they load: when
     * eng_cpu_tune_env() sets any (passive OpenMP waiting, OpenBLAS kernels for Zen 4), re-exec
     * ourselves once (same pid, same fds, so the agent sees nothing). */
    if (!getenv("KILN_TRAIN_REEXEC") && eng_cpu_tune_env()) {
        setenv("KILN_TRAIN_REEXEC", "1", 1);
        execv("/proc/self/exe", argv);
        /* exec failed: carry on with the defaults */
    }
    kiln_err_t err;
    kiln_err_clear(&err);
    log_init("kiln-train");
    int rc = config_parse(argc, argv, flags, KILN_ARRAY_LEN(flags), "--spec FILE [options]", NULL,
                          &err);
    if (rc == 1) return 0;
    if (rc) {
        fprintf(stderr, "kiln-train: %s\n", err.message);
        return 2;
    }
    if (!spec_path || !*spec_path) {
        fprintf(stderr, "kiln-train: no job spec: pass --spec FILE or set KILN_SPEC\n");
        return 2;
    }

    spec_t spec;
    if ((rc = spec_load_file(spec_path, &spec, &err))) {
        if (err.hint[0]) fprintf(stderr, "kiln-train: hint: %s\n", err.hint);
        fprintf(stderr, "kiln-train: invalid job spec %s: %s%s%s\n", spec_path,
                err.field[0] ? err.field : "", err.field[0] ? ": " : "", err.message);
        return 2;
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
    o.output_dir = out_dir;
    o.max_steps_override = max_steps;
    o.threads = (int)threads;
    o.peak_gflops = peak;
    o.metrics_fd = env_int("KILN_METRICS_FD", -1);
    o.rank = env_int("KILN_RANK", 0);
    o.world = env_int("KILN_WORLD_SIZE", 1);
    o.sample_prompt = prompt;
    o.spec_dir = dup ? dirname(dup) : ".";
    o.init_model = init_model;
    o.stop_flag = &g_stop;
    o.quiet = quiet;
    if (o.world < 1 || o.rank < 0 || o.rank >= o.world) {
        fprintf(stderr, "kiln-train: bad rank %d of world size %d (KILN_RANK, KILN_WORLD_SIZE)\n",
                o.rank, o.world);
        spec_deinit(&spec);
        free(dup);
        return 2;
    }
    printf("kiln-train: job \"%s\" rank %d/%d attempt %s\n", spec.name, o.rank, o.world,
           getenv("KILN_ATTEMPT") ? getenv("KILN_ATTEMPT") : "1");
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
        return exit_code_for(&err);
    }
    if (res.stopped) return 128 + (g_signo ? g_signo : SIGTERM);
    return 0;
}
