/* test_confine.c - what a job may touch on an agent, with real child processes: the launcher's
 * checks of an assignment's read paths and checkpoint directory against the data roots (refused
 * before anything starts, with a reason that names the field and the roots and never whether a
 * file outside exists), the rank's environment (KILN_DATA_ROOTS, no secrets) and umask, and
 * kiln-train's own re-check of the paths its spec names. */
#include "tests/agent/launch_fixture.h"
#include "tests/common/harness.h"

#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

TestSuite(confine, .init = lf_setup, .fini = lf_teardown, .timeout = 60);

static char data[300], outside[300];

/* dir/data (the root) with corpus.txt, dir/outside with secret.txt, dir/data/escape -> outside. */
static void tree(void)
{
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(outside, sizeof outside, "%s/outside", dir);
    cr_assert_eq(mkdir(data, 0755), 0);
    cr_assert_eq(mkdir(outside, 0755), 0);
    char p[400];
    snprintf(p, sizeof p, "%s/corpus.txt", data);
    FILE *f = fopen(p, "w");
    for (int i = 0; i < 100; i++)
        fputs("First Citizen: Before we proceed any further, hear me speak.\n", f);
    fclose(f);
    snprintf(p, sizeof p, "%s/secret.txt", outside);
    f = fopen(p, "w");
    fputs("TOP-SECRET-CONTENTS\n", f);
    fclose(f);
    snprintf(p, sizeof p, "%s/escape", data);
    cr_assert_eq(symlink(outside, p), 0);
}

/* The rank says so when it runs at all. */
static const char k_marker_script[] = "echo started\n";

static bool ran(const char *job)
{
    bool hit = false;
    pthread_mutex_lock(&R.mu);
    for (int i = 0; i < R.nlines && !hit; i++)
        hit = !strcmp(R.lines[i].job, job) && !strcmp(R.lines[i].text, "started");
    pthread_mutex_unlock(&R.mu);
    return hit;
}

static bool job_dir_exists(const char *job)
{
    char p[400];
    snprintf(p, sizeof p, "%s/jobs/%s", dir, job);
    return access(p, F_OK) == 0;
}

/* Starts job with one read path (field, path); returns the status and the reason. */
static int start_reading(agent_launcher_t *l, const char *job, const char *field, const char *path, char *reason)
{
    int32_t ranks[] = {0};
    Kiln__Assignment a = lf_assignment(job, 1, ranks, 1, "{}");
    Kiln__JobPath jp = KILN__JOB_PATH__INIT, *jps[] = {&jp};
    jp.field = (char *)field;
    jp.path = (char *)path;
    a.read_paths = jps;
    a.n_read_paths = 1;
    kiln_err_t err;
    int before = R.start_failed;
    int rc = agent_launcher_start(l, &a, &err);
    if (rc != 0) {
        cr_assert_eq(R.start_failed, before + 1, "the refusal goes to on_started");
        snprintf(reason, 600, "%s", R.start_reason);
        cr_assert_str_eq(reason, err.message);
    }
    return rc;
}

/* reason with path replaced by "<P>", to compare two refusals */
static void unpath(char *reason, const char *path)
{
    char *hit = strstr(reason, path);
    if (!hit)
        return;
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%.*s<P>%s", (int)(hit - reason), reason, hit + strlen(path));
    snprintf(reason, 600, "%s", tmp);
}

Test(confine, read_paths_outside_the_roots_are_refused_before_anything_starts)
{
    tree();
    char *bin = lf_script("rank.sh", k_marker_script);
    const char *roots[] = {data};
    agent_launcher_t *l = lf_launcher(bin, 2, false, 2, roots, 1);
    char r1[600], r2[600], r3[600], r4[600], r5[600], p[400];

    cr_assert_eq(start_reading(l, "j-shadow", "data.train", "/etc/shadow", r1), KILN_EPERM);
    cr_assert(strstr(r1, "data.train") && strstr(r1, data), "names the field and the roots: %s", r1);
    cr_assert(strstr(r1, "--data-root"), "says what the operator can do: %s", r1);
    cr_assert_eq(start_reading(l, "j-missing", "data.train", "/etc/kiln-no-such-file", r2), KILN_EPERM);
    unpath(r1, "/etc/shadow");
    unpath(r2, "/etc/kiln-no-such-file");
    cr_assert_str_eq(r1, r2, "missing and existing files outside answer alike");

    snprintf(p, sizeof p, "%s/../outside/secret.txt", data);
    cr_assert_eq(start_reading(l, "j-dotdot", "data.val", p, r3), KILN_EPERM);
    cr_assert(strstr(r3, "data.val"), "%s", r3);
    snprintf(p, sizeof p, "%s/escape/secret.txt", data);
    cr_assert_eq(start_reading(l, "j-link", "model.init_from", p, r4), KILN_EPERM);
    cr_assert(strstr(r4, "model.init_from"), "%s", r4);
    cr_assert_null(strstr(r4, outside), "where the link leads is not told: %s", r4);
    snprintf(p, sizeof p, "%s2/corpus.txt", data);
    cr_assert_eq(start_reading(l, "j-prefix", "data.train", p, r5), KILN_EPERM, "\"/data2\" is not in \"/data\"");

    char r6[600];
    cr_assert_eq(start_reading(l, "j-rel", "data.train", "data/corpus.txt", r6), KILN_EINVAL,
                 "a relative path cannot be checked: refused");
    cr_assert(strstr(r6, "data.train") && strstr(r6, "absolute"), "%s", r6);

    const char *jobs[] = {"j-shadow", "j-missing", "j-dotdot", "j-link", "j-prefix", "j-rel"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(jobs); i++) {
        cr_assert_not(ran(jobs[i]), "%s started a rank", jobs[i]);
        cr_assert_not(job_dir_exists(jobs[i]), "%s got a job directory", jobs[i]);
    }
    cr_assert_eq(R.started, 0);
    agent_rank_info_t info[4];
    cr_assert_eq(agent_launcher_list(l, info, 4), 0);
    pthread_mutex_lock(&R.mu);
    for (int i = 0; i < R.nlines; i++)
        cr_assert_null(strstr(R.lines[i].text, "SECRET"), "file contents in a line: %s", R.lines[i].text);
    pthread_mutex_unlock(&R.mu);
    cr_assert_null(strstr(R.start_reason, "TOP-SECRET"));
    agent_launcher_destroy(l);
}

Test(confine, inside_a_root_a_missing_file_says_so_and_a_present_one_runs)
{
    tree();
    char *bin = lf_script("rank.sh", k_marker_script);
    const char *roots[] = {data};
    agent_launcher_t *l = lf_launcher(bin, 2, false, 2, roots, 1);
    char r[600], p[400];
    snprintf(p, sizeof p, "%s/nope.txt", data);
    cr_assert_eq(start_reading(l, "j-gone", "data.train", p, r), KILN_ENOTFOUND);
    cr_assert(strstr(r, "data.train") && strstr(r, "does not exist"), "%s", r);
    cr_assert_not(ran("j-gone"));
    /* through a link that stays inside, and with ".." that stays inside */
    snprintf(p, sizeof p, "%s/escape/../data/corpus.txt", data);
    cr_assert_eq(start_reading(l, "j-ok", "data.train", p, r), 0, "%s", r);
    cr_assert(lf_wait_exits(1, 10000));
    cr_assert(ran("j-ok"));
    agent_launcher_destroy(l);
}

Test(confine, an_agent_without_data_roots_lets_jobs_read_nothing)
{
    tree();
    char *bin = lf_script("rank.sh", k_marker_script);
    agent_launcher_t *l = lf_launcher(bin, 1, false, 1, NULL, 0);
    char r[600], p[400];
    snprintf(p, sizeof p, "%s/corpus.txt", data);
    cr_assert_eq(start_reading(l, "j-none", "data.train", p, r), KILN_EPERM);
    cr_assert(strstr(r, "none are allowed"), "%s", r);
    cr_assert_not(ran("j-none"));
    /* no read paths at all (synthetic data): runs */
    int32_t ranks[] = {0};
    Kiln__Assignment a = lf_assignment("j-synth", 1, ranks, 1, "{}");
    cr_assert_eq(agent_launcher_start(l, &a, NULL), 0);
    cr_assert(lf_wait_exits(1, 10000));
    cr_assert(ran("j-synth"));
    agent_launcher_destroy(l);
}

Test(confine, checkpoint_dirs_go_under_a_root_or_the_work_dir_only)
{
    tree();
    char *bin = lf_script("rank.sh", k_marker_script);
    const char *roots[] = {data};
    agent_launcher_t *l = lf_launcher(bin, 2, false, 2, roots, 1);
    int32_t ranks[] = {0};
    char ck[400];
    kiln_err_t err;
    /* the example: a work-dir path climbing out with ".." */
    Kiln__Assignment a = lf_assignment("j-ck-out", 1, ranks, 1, "{}");
    snprintf(ck, sizeof ck, "%s/jobs/../../../../../var/tmp/kiln-ck-escape/j-ck-out", dir);
    a.checkpoint_dir = ck;
    cr_assert_eq(agent_launcher_start(l, &a, &err), KILN_EPERM);
    cr_assert(strstr(R.start_reason, "checkpoint.path") && strstr(R.start_reason, data) &&
              strstr(R.start_reason, dir), "names the field, the roots and the work dir: %s", R.start_reason);
    cr_assert_neq(access("/var/tmp/kiln-ck-escape", F_OK), 0, "nothing was created outside");
    cr_assert_not(ran("j-ck-out"));
    /* through a symlink out of the root (to a directory outside the work dir too) */
    char far[] = "/tmp/kiln-far.XXXXXX", link[400], made[400];
    cr_assert_not_null(mkdtemp(far));
    snprintf(link, sizeof link, "%s/far", data);
    cr_assert_eq(symlink(far, link), 0);
    a = lf_assignment("j-ck-link", 1, ranks, 1, "{}");
    snprintf(ck, sizeof ck, "%s/far/ck/j-ck-link", data);
    a.checkpoint_dir = ck;
    int rc = agent_launcher_start(l, &a, &err);
    snprintf(made, sizeof made, "%s/ck", far);
    bool created = access(made, F_OK) == 0;
    /* resume_from is held to the same rule */
    a = lf_assignment("j-resume", 1, ranks, 1, "{}");
    a.resume_from = far;
    int rc2 = agent_launcher_start(l, &a, &err);
    snprintf(made, sizeof made, "rm -rf '%s'", far);
    cr_assert_eq(system(made), 0);
    cr_assert_eq(rc, KILN_EPERM);
    cr_assert_not(created, "nothing was created through the link");
    cr_assert_eq(rc2, KILN_EPERM);
    cr_assert(strstr(R.start_reason, "resume_from"), "%s", R.start_reason);
    /* inside the work dir: fine, created 0700 */
    a = lf_assignment("j-ck-in", 1, ranks, 1, "{}");
    snprintf(ck, sizeof ck, "%s/elsewhere/j-ck-in", dir);
    a.checkpoint_dir = ck;
    cr_assert_eq(agent_launcher_start(l, &a, &err), 0, "%s", err.message);
    cr_assert(lf_wait_exits(1, 10000));
    struct stat st;
    cr_assert_eq(stat(ck, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0700);
    cr_assert_eq(R.started, 1);
    agent_launcher_destroy(l);
}

Test(confine, ranks_get_the_roots_a_private_umask_and_none_of_the_agents_secrets)
{
    tree();
    setenv("KILN_JOIN_TOKEN", "join-secret-1", 1);
    setenv("KILN_TOKEN", "user-secret-2", 1);
    setenv("KILN_WORKER_CREDENTIAL", "cred-secret-3", 1);
    setenv("KILN_TLS_KEY", "/etc/kiln/agent.key", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-4", 1);
    setenv(RANK_ENV_DATA_ROOTS, "/", 1); /* the agent's own setting must not leak through */
    setenv("KILN_HARMLESS", "kept", 1);
    char *bin = lf_script("rank.sh",
                          "echo \"roots=$KILN_DATA_ROOTS umask=$(umask)\"\n"
                          "env | grep -ci 'secret\\|token\\|credential\\|TLS_KEY' | sed 's/^/leaks=/'\n"
                          "echo \"harmless=$KILN_HARMLESS\"\n"
                          "echo x > \"$KILN_CHECKPOINT_DIR/ckpt\"\n"
                          "stat -c 'mode=%a' \"$KILN_CHECKPOINT_DIR/ckpt\"\n");
    char data2[300];
    snprintf(data2, sizeof data2, "%s/data2", dir);
    cr_assert_eq(mkdir(data2, 0755), 0);
    const char *roots[] = {data, data2};
    agent_launcher_t *l = lf_launcher(bin, 1, false, 1, roots, 2);
    int32_t ranks[] = {0};
    Kiln__Assignment a = lf_assignment("j-env", 1, ranks, 1, "{}");
    kiln_err_t err;
    cr_assert_eq(agent_launcher_start(l, &a, &err), 0, "%s", err.message);
    cr_assert(lf_wait_exits(1, 10000));
    char want[700];
    snprintf(want, sizeof want, "roots=%s,%s umask=0077", data, data2);
    cr_assert_not_null(lf_find_line(0, "roots="));
    cr_assert_str_eq(lf_find_line(0, "roots=")->text, want);
    cr_assert_not_null(lf_find_line(0, "leaks="));
    cr_assert_str_eq(lf_find_line(0, "leaks=")->text, "leaks=0");
    cr_assert_not_null(lf_find_line(0, "harmless=kept"), "other variables pass");
    cr_assert_not_null(lf_find_line(0, "mode=600"), "a checkpoint is readable by its owner only");
    agent_launcher_destroy(l);
    unsetenv("KILN_JOIN_TOKEN");
    unsetenv("KILN_TOKEN");
    unsetenv("KILN_WORKER_CREDENTIAL");
    unsetenv("KILN_TLS_KEY");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    unsetenv(RANK_ENV_DATA_ROOTS);
    unsetenv("KILN_HARMLESS");
}

/* The real kiln-train, given a spec whose data lies outside KILN_DATA_ROOTS and no read_paths
 * to check (a kilnd that does not fill them): it refuses the file itself, and nothing of the
 * file reaches a line. Inside the root it trains. */
static const char k_spec_fmt[] =
    "{\"name\": \"confine\", \"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 1, \"n_embd\": 8, "
    "\"seq_len\": 8, \"vocab\": \"bytes\"}, \"data\": {\"train\": \"%s\"}, \"hyperparameters\": {\"lr\": 0.001, "
    "\"global_batch_size\": 1, \"max_steps\": 1, \"eval_every\": 0, \"sample_every\": 0}, "
    "\"resources\": {\"nodes\": 1, \"slots_per_node\": 1, \"slot_type\": \"cpu\", \"device\": \"cpu\"}}";

static int run_train(const char *job, const char *data_path)
{
    char bin[PATH_MAX], spec[1200];
    snprintf(bin, sizeof bin, "%s/kiln-train", th_bin_dir());
    cr_assert_eq(access(bin, X_OK), 0, "%s not built (set KILN_BIN_DIR)", bin);
    const char *roots[] = {data};
    agent_launcher_t *l = lf_launcher(bin, 1, false, 1, roots, 1);
    snprintf(spec, sizeof spec, k_spec_fmt, data_path);
    int32_t ranks[] = {0};
    Kiln__Assignment a = lf_assignment(job, 1, ranks, 1, spec);
    a.world_size = 1;
    a.node_rank = 0;
    a.nodes = 1;
    a.master_addr = (char *)"127.0.0.1";
    a.master_port = th_free_port();
    kiln_err_t err;
    cr_assert_eq(agent_launcher_start(l, &a, &err), 0, "%s", err.message);
    int before = R.nexits;
    cr_assert(lf_wait_exits(before + 1, 50000), "kiln-train did not end");
    agent_launcher_destroy(l);
    return R.exits[before].code;
}

Test(confine, kiln_train_checks_its_own_paths_against_the_roots)
{
    tree();
    char p[400];
    snprintf(p, sizeof p, "%s/secret.txt", outside);
    int code = run_train("j-train-out", p);
    cr_assert_neq(code, 0);
    cr_assert(strstr(R.exits[0].reason, "not inside an allowed directory") && strstr(R.exits[0].reason, data),
              "reason: %s", R.exits[0].reason);
    pthread_mutex_lock(&R.mu);
    for (int i = 0; i < R.nlines; i++)
        cr_assert_null(strstr(R.lines[i].text, "TOP-SECRET"), "file contents in a line: %s", R.lines[i].text);
    pthread_mutex_unlock(&R.mu);
    /* the same file through a link inside the root */
    snprintf(p, sizeof p, "%s/escape/secret.txt", data);
    code = run_train("j-train-link", p);
    cr_assert_neq(code, 0);
    cr_assert(strstr(R.exits[1].reason, "not inside an allowed directory"), "reason: %s", R.exits[1].reason);
    /* and a file inside: kiln-train gets past the check and trains its step */
    snprintf(p, sizeof p, "%s/corpus.txt", data);
    code = run_train("j-train-in", p);
    cr_assert_eq(code, 0, "reason: %s", R.exits[2].reason);
}
