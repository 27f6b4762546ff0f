/* test_kiln_train.c - the pipeline through the kiln-train binary, started the way the agent starts
 * ranks (the rank contract's KILN_* environment): a partitioned job trains and writes its plan and
 * model (and, without microbatches in its spec, chooses them); a job whose smallest stage exceeds resources.memory_limit_mb and a job with a bad manual
 * plan fail on every rank with a clear last line. */
#include "tests/common/harness.h"
#include "tests/pipe/pipe_test.h"
#include "base/base.h"

#include <criterion/criterion.h>
#include <glob.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_dir[64];

static int g_steps = 5;

static void setup_dir(int n_embd, const char *extra_mp, const char *extra_res)
{
    pipe_test_remove_stale_shm();
    snprintf(g_dir, sizeof(g_dir), "/tmp/kiln-pipe-kt-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
    char path[128];
    snprintf(path, sizeof(path), "%s/data.txt", g_dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    for (int i = 0; i < 3000; i++)
        fprintf(f, "%s", i % 7 ? "glaze the pot " : "fire the kiln.\n");
    fclose(f);
    snprintf(path, sizeof(path), "%s/spec.json", g_dir);
    f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f,
            "{\"name\": \"pipe-kt\", \"model\": {\"type\": \"gpt\", \"n_layer\": 4, \"n_head\": 2, \"n_embd\": %d,"
            " \"seq_len\": 16}, \"data\": {\"train\": \"%s/data.txt\"},"
            " \"hyperparameters\": {\"lr\": 1e-3, \"global_batch_size\": 8, \"max_steps\": %d, \"sample_tokens\": 16},"
            " \"resources\": {\"nodes\": 1, \"slots_per_node\": 2, \"threads_per_rank\": 1%s},"
            " \"distribution\": {\"model_parallel\": {\"partitions\": 2, \"microbatches\": 4%s}}}",
            n_embd, g_dir, g_steps, extra_res, extra_mp);
    fclose(f);
}

/* Starts 2 ranks of kiln-train (pids OUT). */
static void start_ranks(pid_t pids[2])
{
    static char bin[512], spec[128], out[128], ckpt[128], port[32], logp[2][128];
    snprintf(bin, sizeof(bin), "%s/kiln-train", th_bin_dir());
    cr_assert_eq(access(bin, X_OK), 0, "%s not built (set KILN_BIN_DIR)", bin);
    snprintf(spec, sizeof(spec), "KILN_SPEC=%s/spec.json", g_dir);
    snprintf(out, sizeof(out), "KILN_OUTPUT_DIR=%s/out", g_dir);
    snprintf(ckpt, sizeof(ckpt), "KILN_CHECKPOINT_DIR=%s/ckpt", g_dir);
    snprintf(port, sizeof(port), "KILN_MASTER_PORT=%d", th_free_port());
    for (int r = 0; r < 2; r++) {
        char rank[32];
        snprintf(rank, sizeof(rank), "KILN_RANK=%d", r);
        char *env[] = {spec, out, ckpt, port, rank, "KILN_WORLD_SIZE=2", "KILN_LOCAL_RANK=0",
                       "KILN_MASTER_ADDR=127.0.0.1", "KILN_JOB_ID=pipe-kt", "KILN_PEAK_GFLOPS=100",
                       "KILN_COMM_TIMEOUT_S=30", NULL};
        char *argv[] = {bin, NULL};
        snprintf(logp[r], sizeof(logp[r]), "%s/rank%d.log", g_dir, r);
        pids[r] = th_spawn(argv, env, logp[r]);
        cr_assert_gt(pids[r], 0);
    }
}

/* Starts 2 ranks of kiln-train; returns their exit statuses in st. */
static void run_ranks(int st[2])
{
    pid_t pids[2];
    start_ranks(pids);
    for (int r = 0; r < 2; r++) {
        int s = -1;
        double deadline = kiln_mono_s() + 90;
        while (waitpid(pids[r], &s, WNOHANG) == 0) {
            if (kiln_mono_s() > deadline) {
                th_stop(pids[0], 9, 100);
                th_stop(pids[1], 9, 100);
                cr_assert_fail("rank %d hung", r);
            }
            usleep(20000);
        }
        st[r] = s;
    }
}

static char *slurp(const char *name)
{
    char path[160], *text = NULL;
    size_t len;
    kiln_err_t err;
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    if (kiln_file_read(path, &text, &len, &err))
        return NULL;
    return text;
}

static void cleanup(void)
{
    cr_assert(th_rm_tree(g_dir), "could not remove %s", g_dir);
}

Test(kiln_train, partitioned_job_trains_and_writes_its_plan, .timeout = 120)
{
    setup_dir(32, "", "");
    int st[2];
    run_ranks(st);
    char *log0 = slurp("rank0.log"), *log1 = slurp("rank1.log");
    cr_assert_not_null(log0);
    for (int r = 0; r < 2; r++)
        cr_assert(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0, "rank %d exit 0x%x:\n%s", r, st[r], r ? log1 : log0);
    cr_assert(strstr(log0, "pipeline: automatic plan, 2 stages"), "%s", log0);
    cr_assert(strstr(log0, "step 5/5 | loss"), "%s", log0);
    cr_assert(strstr(log1, "is stage 1 of 2"), "%s", log1);
    char *plan = slurp("out/partition_plan.json");
    cr_assert_not_null(plan);
    cr_assert(strstr(plan, "\"stages\": [\n    {\"stage\": 0, \"blocks\": [0, "), "%s", plan);
    struct stat sb;
    char path[160];
    snprintf(path, sizeof(path), "%s/out/model_llmc.bin", g_dir);
    cr_assert_eq(stat(path, &sb), 0, "no final model");
    snprintf(path, sizeof(path), "%s/ckpt/ckpt_00000005.bin", g_dir);
    cr_assert_eq(stat(path, &sb), 0, "no checkpoint");
    char *samples = slurp("out/samples.txt");
    cr_assert(samples && strstr(samples, "=== step 5 (temperature"), "no text sample: %s", samples ? samples : "");
    cr_assert(strstr(log0, "sample at step 5"), "%s", log0);
    free(samples);
    free(log0);
    free(log1);
    /* the written plan, passed back as the job's partition_plan, is used as it is; this time
     * the spec leaves microbatches out, and the pipeline chooses 8 (4 a stage) of 1 sequence */
    char keep[64];
    snprintf(keep, sizeof(keep), "%s", g_dir);
    setup_dir(32, "", "");
    char *spec = slurp("spec.json"), patched[8192];
    char *cut = strstr(spec, "\"microbatches\": 4");
    cr_assert_not_null(cut);
    snprintf(patched, sizeof(patched), "%.*s\"partition_plan\": %s%s", (int)(cut - spec), spec,
             plan, cut + strlen("\"microbatches\": 4"));
    snprintf(path, sizeof(path), "%s/spec.json", g_dir);
    kiln_err_t err;
    cr_assert_eq(kiln_file_write_atomic(path, patched, strlen(patched), &err), 0);
    run_ranks(st);
    log0 = slurp("rank0.log");
    cr_assert(WIFEXITED(st[0]) && WEXITSTATUS(st[0]) == 0 && WIFEXITED(st[1]) && WEXITSTATUS(st[1]) == 0, "%s", log0);
    cr_assert(strstr(log0, "pipeline: manual plan, 2 stages"), "%s", log0);
    cr_assert(strstr(log0, "8 microbatches of 1 (chosen from the job"), "%s", log0);
    char *plan2 = slurp("out/partition_plan.json");
    cr_assert_not_null(plan2);
    const char *s1 = strstr(plan, "\"stages\""), *s2 = strstr(plan2, "\"stages\"");
    cr_assert(s1 && s2);
    /* same block ranges (predicted figures come from this run's profile) */
    for (int k = 0; k < 2; k++) {
        char want[64];
        const char *b1 = strstr(s1, "\"blocks\": [");
        cr_assert_not_null(b1);
        snprintf(want, sizeof(want), "%.*s", (int)(strchr(b1, ']') - b1 + 1), b1);
        cr_assert(strstr(s2, want), "stage %d: %s not in %s", k, want, plan2);
        s1 = b1 + 1;
    }
    free(spec);
    free(plan);
    free(plan2);
    free(log0);
    cleanup();
    snprintf(g_dir, sizeof(g_dir), "%s", keep);
    cleanup();
}

static const char *last_line(char *text)
{
    size_t n = strlen(text);
    while (n && text[n - 1] == '\n')
        text[--n] = '\0';
    char *nl = strrchr(text, '\n');
    return nl ? nl + 1 : text;
}

Test(kiln_train, model_over_the_memory_limit_fails_clearly, .timeout = 120)
{
    /* 4 layers of width 128: each layer's parameters, gradients and AdamW state take 3 MiB */
    setup_dir(128, "", ", \"memory_limit_mb\": 1");
    int st[2];
    run_ranks(st);
    for (int r = 0; r < 2; r++) {
        char name[32];
        snprintf(name, sizeof(name), "rank%d.log", r);
        char *log = slurp(name);
        cr_assert(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) != 0, "rank %d succeeded:\n%s", r, log);
        const char *ll = last_line(log);
        cr_assert(strstr(ll, "model does not fit: the smallest possible stage needs") &&
                      strstr(ll, "limit 1.0 MiB; use more partitions or a larger memory limit"),
                  "rank %d: %s", r, ll);
        free(log);
    }
    cleanup();
}

Test(kiln_train, bad_manual_plan_fails_clearly, .timeout = 120)
{
    setup_dir(32, ", \"partition_plan\": {\"stages\": [[0, 2], [4, 5]]}", "");
    int st[2];
    run_ranks(st);
    for (int r = 0; r < 2; r++) {
        char name[32];
        snprintf(name, sizeof(name), "rank%d.log", r);
        char *log = slurp(name);
        cr_assert(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 2, "rank %d exit 0x%x:\n%s", r, st[r], log);
        const char *ll = last_line(log);
        cr_assert(strstr(ll, "distribution.model_parallel.partition_plan: invalid partition plan: block 3 is in no "
                             "stage (stage 1 starts at block 4)"), "rank %d: %s", r, ll);
        free(log);
    }
    cleanup();
}

Test(kiln_train, manual_plan_over_the_memory_limit_fails_clearly, .timeout = 120)
{
    setup_dir(128, ", \"partition_plan\": {\"stages\": [[0, 8], [9, 9]]}", ", \"memory_limit_mb\": 8");
    int st[2];
    run_ranks(st);
    for (int r = 0; r < 2; r++) {
        char name[32];
        snprintf(name, sizeof(name), "rank%d.log", r);
        char *log = slurp(name);
        cr_assert(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) != 0, "rank %d succeeded:\n%s", r, log);
        cr_assert(strstr(log, "model does not fit: stage 0 of the partition plan (blocks [0, 8]) needs"), "rank %d: %s",
                  r, log);
        free(log);
    }
    cleanup();
}

/* libfabric's shm provider names its region /dev/shm/<pid>:...; a killed process cannot remove
 * it, and a later process that gets the same pid would then fail to open the provider (EBUSY). */
static void remove_shm_of(pid_t pid)
{
    char pat[64];
    glob_t g;
    snprintf(pat, sizeof(pat), "/dev/shm/%d:*", (int)pid);
    if (glob(pat, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++)
            unlink(g.gl_pathv[i]);
        globfree(&g);
    }
}

Test(kiln_train, a_killed_stage_fails_its_peer_fast, .timeout = 120)
{
    g_steps = 100000;
    setup_dir(32, "", "");
    pid_t pids[2];
    start_ranks(pids);
    /* wait until training runs, then kill stage 1 */
    char *log = NULL;
    for (int i = 0; i < 600; i++) {
        free(log);
        log = slurp("rank0.log");
        if (log && strstr(log, "step 3/"))
            break;
        usleep(50000);
    }
    cr_assert(log && strstr(log, "step 3/"), "training did not start: %s", log ? log : "");
    free(log);
    th_stop(pids[1], SIGKILL, 1000);
    remove_shm_of(pids[1]);
    double t0 = kiln_mono_s();
    int st = -1;
    while (waitpid(pids[0], &st, WNOHANG) == 0) {
        if (kiln_mono_s() - t0 > 60) {
            th_stop(pids[0], SIGKILL, 1000);
            cr_assert_fail("stage 0 did not notice its dead peer within 60 s");
        }
        usleep(20000);
    }
    double dt = kiln_mono_s() - t0;
    remove_shm_of(pids[0]); /* comm leaves its region behind when it fails (reported to comm) */
    log = slurp("rank0.log");
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0, "stage 0 exit 0x%x", st);
    /* kiln-train's own last line (a sanitizer build appends its report after it) */
    const char *ll = log, *p;
    while ((p = strstr(ll + 1, "\nkiln-train: ")))
        ll = p + 1;
    char line[512];
    snprintf(line, sizeof(line), "%.*s", (int)strcspn(ll, "\n"), ll);
    ll = line;
    cr_assert(strstr(ll, "rank 1") && strstr(ll, "disconnected"), "the failure names the dead rank: %s", ll);
    fprintf(stderr, "stage 0 failed %.2f s after stage 1 was killed: %s\n", dt, ll);
    free(log);
    g_steps = 5;
    cleanup();
}

Test(kiln_train, sigterm_checkpoints_and_exits_143, .timeout = 120)
{
    /* the agent's stop: every rank gets SIGTERM; they agree at the end of the step, rank 0
     * writes a checkpoint, and all exit 143; a new attempt resumes from it */
    g_steps = 100000;
    setup_dir(32, "", "");
    pid_t pids[2];
    start_ranks(pids);
    char *log = NULL;
    for (int i = 0; i < 600; i++) {
        free(log);
        log = slurp("rank0.log");
        if (log && strstr(log, "step 3/"))
            break;
        usleep(50000);
    }
    cr_assert(log && strstr(log, "step 3/"), "training did not start: %s", log ? log : "");
    free(log);
    kill(pids[0], SIGTERM);
    kill(pids[1], SIGTERM);
    for (int r = 0; r < 2; r++) {
        int st = -1;
        double t0 = kiln_mono_s();
        while (waitpid(pids[r], &st, WNOHANG) == 0) {
            if (kiln_mono_s() - t0 > 60) {
                th_stop(pids[0], SIGKILL, 1000);
                th_stop(pids[1], SIGKILL, 1000);
                cr_assert_fail("rank %d did not stop", r);
            }
            usleep(20000);
        }
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 143, "rank %d exit 0x%x", r, st);
    }
    log = slurp("rank0.log");
    cr_assert(strstr(log, "stopping at step") && strstr(log, "checkpoint: step"), "%s", log);
    free(log);
    /* the next attempt resumes where the first stopped */
    g_steps = 100000;
    pid_t again[2];
    start_ranks(again);
    for (int i = 0; i < 600; i++) {
        log = slurp("rank0.log");
        bool resumed = log && strstr(log, "resumed from");
        free(log);
        if (resumed)
            break;
        usleep(50000);
    }
    th_stop(again[0], SIGKILL, 1000);
    th_stop(again[1], SIGKILL, 1000);
    remove_shm_of(again[0]);
    remove_shm_of(again[1]);
    log = slurp("rank0.log");
    cr_assert(strstr(log, "resumed from"), "%s", log);
    free(log);
    g_steps = 5;
    cleanup();
}
