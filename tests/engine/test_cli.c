/* test_cli.c - the kiln-train binary as the agent runs it: the rank contract's environment,
 * metric records on KILN_METRICS_FD, step marks, SIGTERM -> checkpoint and exit 143, resume on restart,
 * and exit 2 with a clear last stderr line for bad specs and unreadable or corrupt data. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/common/harness.h"

static char g_dir[64];

static void mkdir_tmp(void)
{
    strcpy(g_dir, "/tmp/kiln-eng-cli-XXXXXX");
    cr_assert(mkdtemp(g_dir));
}

static void rm_tmp(void)
{
    if (!th_rm_tree(g_dir))
        fprintf(stderr, "could not remove %s\n", g_dir);
}

TestSuite(cli, .init = mkdir_tmp, .fini = rm_tmp, .timeout = 60);

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return strdup("");
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = 0;
    fclose(f);
    return strdup(buf);
}

static const char *last_line(char *text)
{
    size_t n = strlen(text);
    while (n > 0 && text[n - 1] == '\n') text[--n] = 0;
    char *nl = strrchr(text, '\n');
    return nl ? nl + 1 : text;
}

/* Runs kiln-train with env entries, waits, returns the exit code; log in <dir>/<name>.log */
static int run_train(const char *name, char *const env[], pid_t *pid_out, bool wait)
{
    char bin[512], log[256];
    snprintf(bin, sizeof(bin), "%s/kiln-train", th_bin_dir());
    snprintf(log, sizeof(log), "%s/%s.log", g_dir, name);
    char *argv[] = {bin, NULL};
    pid_t pid = th_spawn(argv, env, log);
    cr_assert(pid > 0);
    if (pid_out) *pid_out = pid;
    if (!wait) return 0;
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "kiln-train died of a signal");
    return WEXITSTATUS(status);
}

static char *spec_file(const char *name, const char *json_fmt, const char *data)
{
    static char path[256];
    snprintf(path, sizeof(path), "%s/%s.json", g_dir, name);
    char json[4096];
    snprintf(json, sizeof(json), json_fmt, data);
    write_text(path, json);
    return path;
}

static const char *data_path(void)
{
    static char p[1024];
    const char *root = getenv("KILN_ROOT");
    snprintf(p, sizeof(p), "%s/data/tinyshakespeare.txt", root ? root : ".");
    return p;
}

#define SMALL_SPEC                                                                               \
    "{\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 32, "            \
    "\"seq_len\": 32}, \"data\": {\"train\": \"%s\"}, \"hyperparameters\": {\"lr\": 1e-3, "      \
    "\"global_batch_size\": 4, \"max_steps\": %s, \"eval_every\": 5, \"eval_batches\": 1, "      \
    "\"sample_tokens\": 20}, \"resources\": {\"device\": \"cpu\"}, "                             \
    "\"checkpoint\": {\"every_steps\": 0, \"keep_last\": 1}}"

static char *small_spec(const char *name, const char *steps)
{
    char fmt[4096];
    snprintf(fmt, sizeof(fmt), SMALL_SPEC, "%s", steps);
    return spec_file(name, fmt, data_path());
}

Test(cli, trains_with_metrics_and_samples)
{
    char mpath[256], env_spec[512], env_fd[64], env_out[256], env_ck[256];
    snprintf(mpath, sizeof(mpath), "%s/metrics.jsonl", g_dir);
    int fd = open(mpath, O_WRONLY | O_CREAT | O_TRUNC, 0644); /* inherited by the child */
    cr_assert(fd >= 0);
    snprintf(env_spec, sizeof(env_spec), "KILN_SPEC=%s", small_spec("ok", "6"));
    snprintf(env_fd, sizeof(env_fd), "KILN_METRICS_FD=%d", fd);
    snprintf(env_out, sizeof(env_out), "KILN_OUTPUT_DIR=%s/out", g_dir);
    snprintf(env_ck, sizeof(env_ck), "KILN_CHECKPOINT_DIR=%s/ck", g_dir);
    char *env[] = {env_spec, env_fd, env_out, env_ck, "KILN_RANK=0", "KILN_WORLD_SIZE=1",
                   "KILN_THREADS=1", "KILN_PEAK_GFLOPS=100", NULL};
    int rc = run_train("ok", env, NULL, true);
    close(fd);
    char lp[256];
    snprintf(lp, sizeof(lp), "%s/ok.log", g_dir);
    char *log = read_text(lp);
    cr_assert_eq(rc, 0, "exit %d, log:\n%s", rc, log);
    cr_assert(strstr(log, "step 6/6 | loss "), "%s", log);
    cr_assert(strstr(log, "tok/s | mfu "), "%s", log);
    cr_assert(strstr(log, "val loss"), "%s", log);
    free(log);
    /* metric records: one JSON object per line, train metrics for steps 1..6, val_loss */
    char *m = read_text(mpath);
    int steps = 0, vals = 0;
    for (char *line = strtok(m, "\n"); line; line = strtok(NULL, "\n")) {
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        cr_assert(j, "bad metric record: %s", line);
        json_t *mm = json_object_get(j, "metrics");
        cr_assert(json_is_integer(json_object_get(j, "step")) && json_is_real(json_object_get(j, "time")));
        if (json_object_get(mm, "train_loss")) {
            steps++;
            const char *names[] = {"lr", "grad_norm", "step_time_ms", "tokens_per_s", "mfu",
                                   "peak_mem_mb"};
            for (int i = 0; i < 6; i++)
                cr_assert(json_is_number(json_object_get(mm, names[i])), "no %s in %s", names[i], line);
        }
        if (json_object_get(mm, "val_loss")) vals++;
        json_decref(j);
    }
    cr_assert_eq(steps, 6);
    cr_assert_eq(vals, 2); /* steps 5 and 6 (the last) */
    free(m);
    char sp[256];
    snprintf(sp, sizeof(sp), "%s/out/samples.txt", g_dir);
    char *samples = read_text(sp);
    cr_assert(strstr(samples, "=== step 6"), "samples.txt: %s", samples);
    free(samples);
    snprintf(sp, sizeof(sp), "%s/ck/ckpt_00000006.bin", g_dir);
    cr_assert_eq(access(sp, F_OK), 0, "final checkpoint missing");
}

/* Starts kiln-train as `name` without waiting for it (*pid); true once its log holds `want`,
 * false when 15 s pass without. */
static bool train_until(const char *name, char *const env[], const char *want, pid_t *pid)
{
    run_train(name, env, pid, false);
    char lp[256];
    snprintf(lp, sizeof(lp), "%s/%s.log", g_dir, name);
    bool seen = false;
    for (int i = 0; i < 300 && !seen; i++) {
        char *log = read_text(lp);
        seen = strstr(log, want) != NULL;
        free(log);
        if (!seen) usleep(50000);
    }
    return seen;
}

Test(cli, sigterm_checkpoints_exits_143_and_resumes)
{
    char env_spec[512], env_ck[256];
    snprintf(env_spec, sizeof(env_spec), "KILN_SPEC=%s", small_spec("long", "100000"));
    snprintf(env_ck, sizeof(env_ck), "KILN_CHECKPOINT_DIR=%s/ck", g_dir);
    char *env[] = {env_spec, env_ck, "KILN_THREADS=1", "KILN_PEAK_GFLOPS=100", NULL};
    pid_t pid;
    bool training = train_until("long", env, "step 3/", &pid);
    int status = th_stop(pid, SIGTERM, 20000);
    cr_assert(training, "kiln-train did not start training");
    char lp[256];
    snprintf(lp, sizeof(lp), "%s/long.log", g_dir);
    char *log = read_text(lp);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 143, "status %d, log:\n%s", status, log);
    cr_assert(strstr(log, "stopping at step"), "%s", log);
    free(log);
    /* restart: resumes from the checkpoint */
    pid_t pid2;
    bool resumed = train_until("long2", env, "resumed from", &pid2);
    status = th_stop(pid2, SIGTERM, 20000);
    cr_assert(resumed, "restart did not resume");
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 143);
}

/* KILN_CPUS (an agent's --cpus): the rank binds itself before any thread starts, so every
 * thread it has while training (OpenMP's, OpenBLAS's; 2 threads here) runs only on the CPU it
 * was given. */
Test(cli, every_thread_of_a_rank_runs_on_the_cpus_it_was_given)
{
    cpu_set_t mine;
    cr_assert_eq(sched_getaffinity(0, sizeof(mine), &mine), 0);
    int cpu = 0;
    while (!CPU_ISSET(cpu, &mine)) cpu++;
    char env_spec[512], env_cpus[32], want[64];
    snprintf(env_spec, sizeof(env_spec), "KILN_SPEC=%s", small_spec("bound", "100000"));
    snprintf(env_cpus, sizeof(env_cpus), "KILN_CPUS=%d", cpu);
    char *env[] = {env_spec, env_cpus, "KILN_THREADS=2", "KILN_PEAK_GFLOPS=100", NULL};
    pid_t pid;
    if (!train_until("bound", env, "step 3/", &pid)) {
        th_stop(pid, SIGKILL, 5000);
        cr_assert_fail("kiln-train did not start training");
    }
    char lp[256];
    snprintf(lp, sizeof(lp), "%s/bound.log", g_dir);
    char task[64];
    snprintf(task, sizeof(task), "/proc/%d/task", (int)pid);
    DIR *d = opendir(task);
    cr_assert_not_null(d);
    int threads = 0;
    char *unbound = NULL; /* the status of the first thread found on other CPUs */
    snprintf(want, sizeof(want), "Cpus_allowed_list:\t%d\n", cpu);
    for (struct dirent *de; (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        char sp[sizeof(task) + sizeof(de->d_name) + 8];
        snprintf(sp, sizeof(sp), "%s/%s/status", task, de->d_name);
        char *st = read_text(sp);
        if (!st[0]) { /* the thread has ended since */
            free(st);
            continue;
        }
        threads++;
        if (!unbound && !strstr(st, want))
            unbound = st;
        else
            free(st);
    }
    closedir(d);
    th_stop(pid, SIGKILL, 5000);
    cr_assert_null(unbound, "a thread is not bound to CPU %d:\n%s", cpu, unbound);
    cr_assert_geq(threads, 2, "the rank's OpenMP thread is among them");
    char *log = read_text(lp);
    snprintf(want, sizeof(want), ", bound to CPUs %d\n", cpu);
    cr_assert(strstr(log, want), "no \"%s\" in:\n%s", want, log);
    free(log);
}

/* KILN_RESUME_FROM: a job started from another directory's checkpoint (its own directory holds
 * none); and bad values of the rank contract's variables are refused with exit 2, naming them. */
Test(cli, resumes_from_another_directory_and_refuses_a_bad_contract)
{
    char env_spec[512], env_ck[256], env_from[256];
    snprintf(env_spec, sizeof(env_spec), "KILN_SPEC=%s", small_spec("six", "6"));
    snprintf(env_ck, sizeof(env_ck), "KILN_CHECKPOINT_DIR=%s/a", g_dir);
    char *env[] = {env_spec, env_ck, "KILN_THREADS=1", "KILN_PEAK_GFLOPS=100", NULL};
    cr_assert_eq(run_train("six", env, NULL, true), 0);
    snprintf(env_spec, sizeof(env_spec), "KILN_SPEC=%s", small_spec("ten", "10"));
    snprintf(env_ck, sizeof(env_ck), "KILN_CHECKPOINT_DIR=%s/b", g_dir);
    snprintf(env_from, sizeof(env_from), "KILN_RESUME_FROM=%s/a", g_dir);
    char *env2[] = {env_spec, env_ck, env_from, "KILN_THREADS=1", "KILN_PEAK_GFLOPS=100", NULL};
    cr_assert_eq(run_train("ten", env2, NULL, true), 0);
    char lp[256], want[320];
    snprintf(lp, sizeof(lp), "%s/ten.log", g_dir);
    snprintf(want, sizeof(want), "resumed from %s/a/ckpt_00000006.bin", g_dir);
    char *log = read_text(lp);
    cr_assert(strstr(log, want), "no \"%s\" in:\n%s", want, log);
    cr_assert(strstr(log, "step 7/10") && !strstr(log, "step 6/10"), "%s", log);
    free(log);
    /* KILN_FRESH_START=1 (a tuning trial promoted under kilnd's --tune-promoted-restart): from
     * step 1, though both directories hold checkpoints, and both keep them */
    char *env_fresh[] = {env_spec, env_ck, env_from, "KILN_FRESH_START=1", "KILN_THREADS=1", "KILN_PEAK_GFLOPS=100",
                         NULL};
    cr_assert_eq(run_train("fresh", env_fresh, NULL, true), 0);
    snprintf(lp, sizeof(lp), "%s/fresh.log", g_dir);
    log = read_text(lp);
    cr_assert(!strstr(log, "resumed from") && strstr(log, "step 1/10") && strstr(log, "step 10/10"), "%s", log);
    free(log);
    char kept[320];
    snprintf(kept, sizeof(kept), "%s/a/ckpt_00000006.bin", g_dir);
    cr_assert_eq(access(kept, F_OK), 0, "%s was kept", kept);

    const char *bad[][2] = {{"KILN_RANK=abc", "KILN_RANK"},
                            {"KILN_FRESH_START=yes", "KILN_FRESH_START"},
                            {"KILN_COMM_WATCHDOG_S=0", "KILN_COMM_WATCHDOG_S"},
                            {"KILN_METRICS_FD=-4", "KILN_METRICS_FD"},
                            {"KILN_CPUS=1000", "KILN_CPUS"},
                            {"KILN_CPUS=0-", "KILN_CPUS"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *env3[] = {env_spec, (char *)bad[i][0], NULL};
        char name[32];
        snprintf(name, sizeof(name), "bad%zu", i);
        cr_assert_eq(run_train(name, env3, NULL, true), 2, "%s", bad[i][0]);
        snprintf(lp, sizeof(lp), "%s/%s.log", g_dir, name);
        log = read_text(lp);
        const char *last = last_line(log);
        cr_assert(strstr(last, bad[i][1]), "the last line does not name %s: %s", bad[i][1], last);
        free(log);
    }
}

/* Runs kiln-train as `name` with env, stdout to <dir>/<name>.out and stderr to <dir>/<name>.err
 * (apart: each stream's marks only say where that stream's lines belong); returns the exit code. */
static int run_train_split(const char *name, char *const env[])
{
    char bin[512], cmd[1024], log[256];
    snprintf(bin, sizeof(bin), "%s/kiln-train", th_bin_dir());
    snprintf(cmd, sizeof(cmd), "exec %s 2>%s/%s.err", bin, g_dir, name);
    snprintf(log, sizeof(log), "%s/%s.out", g_dir, name);
    char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    pid_t pid = th_spawn(argv, env, log);
    cr_assert(pid > 0);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "kiln-train died of a signal");
    return WEXITSTATUS(status);
}

/* The steps of the marks in text, in order, into steps (at most max); returns how many. Every
 * "step N/M | loss" line must follow the mark of step N (and no other since). */
static int marks_of(const char *text, int64_t *steps, int max)
{
    int n = 0;
    int64_t cur = -1;
    char *copy = strdup(text), *save = NULL;
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '\x1e') {
            cr_assert_eq(strncmp(line, "\x1ekiln-step ", 11), 0, "a malformed mark: %s", line + 1);
            cr_assert_lt(n, max);
            cur = steps[n++] = strtoll(line + 11, NULL, 10);
            continue;
        }
        long long s = 0, of = 0;
        if (sscanf(line, "step %lld/%lld | loss", &s, &of) == 2)
            cr_assert_eq(cur, s, "\"%s\" follows the mark of step %lld", line, (long long)cur);
    }
    free(copy);
    return n;
}

/* With KILN_STEP_MARKS=1 and metric definitions, kiln-train marks on both streams step 0 when it
 * starts, the step it resumed from, and each step before its lines; without either, nothing. */
Test(cli, marks_the_step_of_its_lines_for_the_agent)
{
    char fmt[4096];
    snprintf(fmt, sizeof(fmt), SMALL_SPEC, "%s", "%s");
    fmt[strlen(fmt) - 1] = '\0'; /* the closing brace: add the definitions */
    strcat(fmt, ", \"metric_definitions\": [{\"name\": \"loss_re\", \"regex\": \"loss ([0-9.]+)\"}]}");
    char env_spec[512], env_ck[256];
    char specfmt[4096];
    snprintf(specfmt, sizeof(specfmt), fmt, "%s", "4");
    snprintf(env_spec, sizeof(env_spec), "KILN_SPEC=%s", spec_file("m4", specfmt, data_path()));
    snprintf(env_ck, sizeof(env_ck), "KILN_CHECKPOINT_DIR=%s/ck", g_dir);
    char *env[] = {env_spec, env_ck, "KILN_STEP_MARKS=1", "KILN_THREADS=1", "KILN_PEAK_GFLOPS=100", NULL};
    cr_assert_eq(run_train_split("m4", env), 0);
    char path[256];
    int64_t st[64];
    snprintf(path, sizeof(path), "%s/m4.out", g_dir);
    char *out = read_text(path);
    cr_assert_eq(marks_of(out, st, 64), 5, "%s", out);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(st[i], i, "stdout mark %d is %lld", i, (long long)st[i]);
    cr_assert(strstr(out, "step 4/4 | loss"), "%s", out);
    free(out);
    snprintf(path, sizeof(path), "%s/m4.err", g_dir);
    char *err = read_text(path);
    cr_assert_eq(marks_of(err, st, 64), 5, "%s", err);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(st[i], i);
    free(err);

    /* a resumed run marks the step it resumed from, then only the steps it trains */
    snprintf(specfmt, sizeof(specfmt), fmt, "%s", "6");
    snprintf(env_spec, sizeof(env_spec), "KILN_SPEC=%s", spec_file("m6", specfmt, data_path()));
    cr_assert_eq(run_train_split("m6", env), 0);
    snprintf(path, sizeof(path), "%s/m6.out", g_dir);
    out = read_text(path);
    cr_assert(strstr(out, "resumed from"), "%s", out);
    static const int64_t want[] = {0, 4, 5, 6};
    cr_assert_eq(marks_of(out, st, 64), 4, "%s", out);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(st[i], want[i], "resumed: stdout mark %d is %lld", i, (long long)st[i]);
    free(out);

    /* not asked (no KILN_STEP_MARKS: a rank run by hand), or no definitions: no marks */
    char *by_hand[] = {env_spec, "KILN_THREADS=1", "KILN_PEAK_GFLOPS=100", NULL};
    cr_assert_eq(run_train_split("hand", by_hand), 0);
    snprintf(env_spec, sizeof(env_spec), "KILN_SPEC=%s", small_spec("nodefs", "2"));
    char *no_defs[] = {env_spec, "KILN_STEP_MARKS=1", "KILN_THREADS=1", "KILN_PEAK_GFLOPS=100", NULL};
    cr_assert_eq(run_train_split("nodefs", no_defs), 0);
    const char *files[] = {"hand.out", "hand.err", "nodefs.out", "nodefs.err"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(path, sizeof(path), "%s/%s", g_dir, files[i]);
        char *text = read_text(path);
        cr_assert_null(strchr(text, '\x1e'), "%s holds a mark:\n%s", files[i], text);
        free(text);
    }
}

Test(cli, bad_specs_and_data_exit_2)
{
    char env_spec[512];
    char *env[] = {env_spec, "KILN_THREADS=1", "KILN_PEAK_GFLOPS=100", NULL};
    struct { const char *name, *json, *expect; } cases[] = {
        {"nhead", "{\"model\": {\"type\": \"gpt\", \"n_head\": 3}, \"data\": {\"train\": \"%s\"}}",
         "model.n_head"},
        {"typo", "{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"%s\"}, \"hyperparmeters\": {}}",
         "hyperparmeters"},
        {"syntax", "{\"model\": {\"type\": \"gpt\",, }", "line"},
        {"missing", "{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/nonexistent/data.txt\"}}",
         "could not open data file \"/nonexistent/data.txt\""},
        {"shard", "{\"model\": {\"type\": \"gpt\", \"vocab\": \"gpt2\"}, \"data\": {\"train\": \"%s\"}}",
         "is not an llm.c token shard"},
    };
    char shard[256];
    snprintf(shard, sizeof(shard), "%s/corrupt.bin", g_dir);
    char junk[2048];
    memset(junk, 'x', sizeof(junk));
    FILE *f = fopen(shard, "wb");
    fwrite(junk, 1, sizeof(junk), f);
    fclose(f);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *data = strcmp(cases[i].name, "shard") == 0 ? shard : data_path();
        snprintf(env_spec, sizeof(env_spec), "KILN_SPEC=%s", spec_file(cases[i].name, cases[i].json, data));
        int rc = run_train(cases[i].name, env, NULL, true);
        char lp[256];
        snprintf(lp, sizeof(lp), "%s/%s.log", g_dir, cases[i].name);
        char *log = read_text(lp);
        const char *last = last_line(log);
        cr_assert_eq(rc, 2, "%s: exit %d, log:\n%s", cases[i].name, rc, log);
        cr_assert(strstr(last, cases[i].expect), "%s: last line \"%s\" lacks \"%s\"",
                  cases[i].name, last, cases[i].expect);
        free(log);
    }
    /* no spec at all */
    char *env2[] = {"KILN_SPEC=", NULL};
    cr_assert_eq(run_train("nospec", env2, NULL, true), 2);
}

/* What the engine cannot run is refused with exit code 2 and a reason on the last line: bf16 on
 * a CPU without bf16 instructions (KILN_CPU_BF16=0 makes this one look like that), and the
 * combinations the spec refuses at submission (here bf16 for the MLP). */
Test(cli, combinations_the_engine_cannot_run_exit_2)
{
    char env_spec[512];
    char *env[] = {env_spec, "KILN_THREADS=1", "KILN_PEAK_GFLOPS=100", "KILN_CPU_BF16=0", NULL};
    struct { const char *name, *json, *expect; } cases[] = {
        {"bf16cpu", "{\"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_embd\": 32, \"n_head\": 2, "
                    "\"seq_len\": 16}, \"data\": {\"train\": \"%s\"}, \"hyperparameters\": {\"max_steps\": 2}, "
                    "\"distribution\": {\"mixed_precision\": \"bf16\"}}",
         "neither AVX512-BF16 nor AMX-BF16"},
        {"bf16mlp", "{\"model\": {\"type\": \"mlp\", \"n_inputs\": 4, \"n_classes\": 2}, "
                    "\"data\": {\"train\": \"synthetic\"}, \"distribution\": {\"mixed_precision\": \"bf16\"}}",
         "applies to the gpt model"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(env_spec, sizeof(env_spec), "KILN_SPEC=%s", spec_file(cases[i].name, cases[i].json, data_path()));
        int rc = run_train(cases[i].name, env, NULL, true);
        char lp[256];
        snprintf(lp, sizeof(lp), "%s/%s.log", g_dir, cases[i].name);
        char *log = read_text(lp);
        const char *last = last_line(log);
        cr_assert_eq(rc, 2, "%s: exit %d, log:\n%s", cases[i].name, rc, log);
        cr_assert(strstr(last, cases[i].expect) && strstr(last, "distribution.mixed_precision"),
                  "%s: last line \"%s\" lacks \"%s\"", cases[i].name, last, cases[i].expect);
        if (!strcmp(cases[i].name, "bf16cpu"))
            cr_assert(strstr(log, "kiln-train: hint: leave out distribution.mixed_precision"), "no hint:\n%s", log);
        free(log);
    }
    /* an operator's KILN_CPU_SGEMM that names no GEMM library */
    snprintf(env_spec, sizeof(env_spec), "KILN_SPEC=%s", spec_file("sgemm", "{\"model\": {\"type\": \"mlp\", "
             "\"n_inputs\": 4, \"n_classes\": 2}, \"data\": {\"train\": \"synthetic\"}}", data_path()));
    char *env3[] = {env_spec, "KILN_THREADS=1", "KILN_PEAK_GFLOPS=100", "KILN_CPU_SGEMM=mkl", NULL};
    int rc = run_train("sgemm", env3, NULL, true);
    char lp[256];
    snprintf(lp, sizeof(lp), "%s/sgemm.log", g_dir);
    char *log = read_text(lp);
    cr_assert_eq(rc, 2, "KILN_CPU_SGEMM=mkl: exit %d, log:\n%s", rc, log);
    cr_assert(strstr(last_line(log), "invalid value \"mkl\" for KILN_CPU_SGEMM: expected one of onednn|openblas"),
              "%s", log);
    free(log);
}
