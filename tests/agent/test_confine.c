/* test_confine.c - what a job may touch on an agent, with real child processes: the launcher's
 * checks of an assignment's read paths and checkpoint directory against the data roots and other
 * projects' areas (refused before anything starts, with a reason that names the field and never
 * whether a file there exists nor where a link leads), the project area's own directories, the
 * rank's environment (KILN_DATA_ROOTS, no secrets) and umask, and kiln-train's own re-check of
 * the paths its spec names. */
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

/* A launcher of 2 slots with dir/data as its root, whose ranks run k_marker_script. */
static agent_launcher_t *marker_launcher(void)
{
    char *bin = lf_script("rank.sh", k_marker_script);
    const char *roots[] = {data};
    return lf_launcher(bin, 2, false, 2, roots, 1);
}

/* No line a rank wrote holds needle (a file's contents). */
static void assert_no_line_holds(const char *needle)
{
    pthread_mutex_lock(&R.mu);
    for (int i = 0; i < R.nlines; i++)
        cr_assert_null(strstr(R.lines[i].text, needle), "file contents in a line: %s", R.lines[i].text);
    pthread_mutex_unlock(&R.mu);
}

/* Starts job of project with one read path and, when set, a checkpoint directory and a directory
 * to resume from; returns the status and the reason. */
static int start_in(agent_launcher_t *l, const char *job, const char *project, const char *field, const char *path,
                    const char *ckpt, const char *resume, char *reason)
{
    int32_t ranks[] = {0};
    Kiln__Assignment a = lf_assignment(job, 1, ranks, 1, "{}");
    Kiln__JobPath jp = KILN__JOB_PATH__INIT, *jps[] = {&jp};
    jp.field = (char *)field;
    jp.path = (char *)path;
    a.read_paths = jps;
    a.n_read_paths = path ? 1 : 0;
    a.project = (char *)project;
    if (ckpt)
        a.checkpoint_dir = (char *)ckpt;
    if (resume)
        a.resume_from = (char *)resume;
    kiln_err_t err;
    int before = R.start_failed;
    int rc = agent_launcher_start(l, &a, &err);
    reason[0] = '\0';
    if (rc != 0) {
        cr_assert_eq(R.start_failed, before + 1, "the refusal goes to on_started");
        snprintf(reason, 600, "%s", R.start_reason);
        cr_assert_str_eq(reason, err.message);
        cr_assert_null(strstr(reason, "TOP-SECRET"), "the file's contents in the reason: %s", reason);
    }
    return rc;
}

/* Starts job with one read path (field, path); returns the status and the reason. */
static int start_reading(agent_launcher_t *l, const char *job, const char *field, const char *path, char *reason)
{
    return start_in(l, job, "", field, path, NULL, NULL, reason);
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
    agent_launcher_t *l = marker_launcher();
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
    assert_no_line_holds("SECRET");
    cr_assert_null(strstr(R.start_reason, "TOP-SECRET"));
    agent_launcher_destroy(l);
}

Test(confine, inside_a_root_a_missing_file_says_so_and_a_present_one_runs)
{
    tree();
    agent_launcher_t *l = marker_launcher();
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
    agent_launcher_t *l = marker_launcher();
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

/* Project areas: dir/data/ck/.kiln/proj-a/j-a/ckpt_00000005.bin, project proj-a's checkpoint,
 * readable by anyone as far as the file system goes (a sandbox's uid too): what keeps other
 * projects' jobs out of it is kiln's checks alone. */
static char area_ckpt[450];

static void area_tree(void)
{
    tree();
    char p[400];
    snprintf(p, sizeof p, "%s/ck/" KILN_AREA_DIR "/proj-a/j-a", data);
    kiln_err_t err;
    cr_assert_eq(kiln_mkdirs_mode(p, 0711, &err), 0, "%s", err.message);
    snprintf(area_ckpt, sizeof area_ckpt, "%s/ckpt_00000005.bin", p);
    FILE *f = fopen(area_ckpt, "w");
    fputs("TOP-SECRET-WEIGHTS\n", f);
    fclose(f);
    cr_assert_eq(chmod(area_ckpt, 0644), 0);
}

Test(confine, another_projects_area_is_refused_by_path_and_through_a_link)
{
    area_tree();
    agent_launcher_t *l = marker_launcher();
    char r1[600], r2[600], r3[600], r4[600], p[400], link[400];

    /* by its path: refused, the same whether the file exists or not */
    cr_assert_eq(start_in(l, "j-b1", "proj-b", "data.train", area_ckpt, NULL, NULL, r1), KILN_EPERM);
    cr_assert(strstr(r1, "data.train") && strstr(r1, "another project") && strstr(r1, "proj-b"), "%s", r1);
    snprintf(p, sizeof p, "%s/ck/" KILN_AREA_DIR "/proj-a/j-a/ckpt_00000099.bin", data);
    cr_assert_eq(start_in(l, "j-b2", "proj-b", "data.train", p, NULL, NULL, r2), KILN_EPERM);
    unpath(r1, area_ckpt);
    unpath(r2, p);
    cr_assert_str_eq(r1, r2, "a missing file and a present one in the area answer alike");
    /* through a symbolic link inside the root, which kilnd cannot see: refused, and where it
     * leads is not told */
    snprintf(link, sizeof link, "%s/innocent.txt", data);
    cr_assert_eq(symlink(area_ckpt, link), 0);
    cr_assert_eq(start_in(l, "j-b3", "proj-b", "data.val", link, NULL, NULL, r3), KILN_EPERM);
    cr_assert(strstr(r3, "data.val") && strstr(r3, "another project"), "%s", r3);
    cr_assert_null(strstr(r3, "proj-a"), "where the link leads is not told: %s", r3);
    /* ".." out of a directory that is a link into the area */
    snprintf(link, sizeof link, "%s/models", data);
    snprintf(p, sizeof p, "%s/ck/" KILN_AREA_DIR "/proj-a/j-a", data);
    cr_assert_eq(symlink(p, link), 0);
    snprintf(p, sizeof p, "%s/models/../j-a/ckpt_00000005.bin", data);
    cr_assert_eq(start_in(l, "j-b4", "proj-b", "model.init_from", p, NULL, NULL, r4), KILN_EPERM);
    /* from a kilnd that sends no project, every area is another's */
    cr_assert_eq(start_in(l, "j-old", "", "data.train", area_ckpt, NULL, NULL, r4), KILN_EPERM);
    /* a checkpoint directory or a checkpoint to resume from in another's area */
    snprintf(p, sizeof p, "%s/ck/" KILN_AREA_DIR "/proj-a/j-b5", data);
    cr_assert_eq(start_in(l, "j-b5", "proj-b", NULL, NULL, p, NULL, r4), KILN_EPERM);
    cr_assert(strstr(r4, "checkpoint.path"), "%s", r4);
    snprintf(p, sizeof p, "%s/ck/" KILN_AREA_DIR "/proj-a/j-a", data);
    cr_assert_eq(start_in(l, "j-b6", "proj-b", NULL, NULL, NULL, p, r4), KILN_EPERM);
    cr_assert(strstr(r4, "resume_from"), "%s", r4);
    const char *jobs[] = {"j-b1", "j-b2", "j-b3", "j-b4", "j-old", "j-b5", "j-b6"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(jobs); i++) {
        cr_assert_not(ran(jobs[i]), "%s started a rank", jobs[i]);
        cr_assert_not(job_dir_exists(jobs[i]), "%s got a job directory", jobs[i]);
    }
    snprintf(p, sizeof p, "%s/ck/" KILN_AREA_DIR "/proj-a/j-b5", data);
    cr_assert_neq(access(p, F_OK), 0, "nothing was created in the area");

    /* the project's own jobs reach it; the data root's other files stay everyone's */
    cr_assert_eq(start_in(l, "j-a2", "proj-a", "data.train", area_ckpt, NULL, NULL, r4), 0, "%s", r4);
    cr_assert(lf_wait_exits(1, 10000));
    snprintf(p, sizeof p, "%s/corpus.txt", data);
    cr_assert_eq(start_in(l, "j-b7", "proj-b", "data.train", p, NULL, NULL, r4), 0, "%s", r4);
    cr_assert(lf_wait_exits(2, 10000));
    cr_assert(ran("j-a2") && ran("j-b7"));
    agent_launcher_destroy(l);
}

Test(confine, a_checkpoint_dir_in_the_project_area_is_made_of_the_agents_own_directories)
{
    tree();
    agent_launcher_t *l = marker_launcher();
    char r[600], p[400], ck[400];
    /* created by the agent: .kiln and the project's its own and closed to others' writes (0700,
     * or 0711 where a sandboxed rank must pass through them), the job's 0700 */
    snprintf(ck, sizeof ck, "%s/ck/" KILN_AREA_DIR "/proj-a/j-ok", data);
    cr_assert_eq(start_in(l, "j-ok", "proj-a", NULL, NULL, ck, NULL, r), 0, "%s", r);
    cr_assert(lf_wait_exits(1, 10000));
    struct stat st;
    snprintf(p, sizeof p, "%s/ck/" KILN_AREA_DIR, data);
    cr_assert_eq(stat(p, &st), 0);
    cr_assert(st.st_uid == geteuid() && (st.st_mode & 0777 & ~0011) == 0700, "mode %o", st.st_mode & 0777);
    snprintf(p, sizeof p, "%s/ck/" KILN_AREA_DIR "/proj-a", data);
    cr_assert_eq(stat(p, &st), 0);
    cr_assert(st.st_uid == geteuid() && (st.st_mode & 0777 & ~0011) == 0700, "mode %o", st.st_mode & 0777);
    cr_assert_eq(stat(ck, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0700);

    /* a ".kiln" that someone made a link to a shared directory of the root: refused before
     * anything is created there */
    snprintf(p, sizeof p, "%s/pub", data);
    cr_assert_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/ck2", data);
    cr_assert_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/ck2/" KILN_AREA_DIR, data);
    cr_assert_eq(symlink("../pub", p), 0);
    snprintf(ck, sizeof ck, "%s/ck2/" KILN_AREA_DIR "/proj-a/j-link", data);
    cr_assert_eq(start_in(l, "j-link", "proj-a", NULL, NULL, ck, NULL, r), KILN_EPERM);
    cr_assert(strstr(r, "checkpoint.path") && strstr(r, "symbolic link"), "%s", r);
    snprintf(p, sizeof p, "%s/pub/proj-a", data);
    cr_assert_neq(access(p, F_OK), 0, "nothing was created through the link");
    /* a ".kiln" that others may write to */
    snprintf(p, sizeof p, "%s/ck3/" KILN_AREA_DIR, data);
    kiln_err_t err;
    cr_assert_eq(kiln_mkdirs_mode(p, 0700, &err), 0, "%s", err.message);
    cr_assert_eq(chmod(p, 0777), 0);
    snprintf(ck, sizeof ck, "%s/ck3/" KILN_AREA_DIR "/proj-a/j-open", data);
    cr_assert_eq(start_in(l, "j-open", "proj-a", NULL, NULL, ck, NULL, r), KILN_EPERM);
    cr_assert(strstr(r, "only it may write to"), "%s", r);
    /* a project directory of another user; the job's own directory may be another uid's (the
     * sandbox gives it to the uid its ranks run as) */
    snprintf(p, sizeof p, "%s/ck4/" KILN_AREA_DIR "/proj-a", data);
    cr_assert_eq(kiln_mkdirs_mode(p, 0700, &err), 0, "%s", err.message);
    cr_assert_eq(chown(p, geteuid() + 1, (gid_t)-1), 0);
    snprintf(ck, sizeof ck, "%s/ck4/" KILN_AREA_DIR "/proj-a/j-theirs", data);
    cr_assert_eq(start_in(l, "j-theirs", "proj-a", NULL, NULL, ck, NULL, r), KILN_EPERM);
    cr_assert(strstr(r, "only it may write to"), "%s", r);
    snprintf(ck, sizeof ck, "%s/ck/" KILN_AREA_DIR "/proj-a/j-given", data);
    cr_assert_eq(kiln_mkdirs_mode(ck, 0700, &err), 0, "%s", err.message);
    cr_assert_eq(chown(ck, geteuid() + 1, (gid_t)-1), 0);
    cr_assert_eq(start_in(l, "j-given", "proj-a", NULL, NULL, ck, NULL, r), 0, "%s", r);
    cr_assert(lf_wait_exits(2, 10000));
    cr_assert_not(ran("j-link") || ran("j-open") || ran("j-theirs"));
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
    "\"seq_len\": 8, \"vocab\": \"bytes\", \"init_from\": \"%s\"}, \"data\": {\"train\": \"%s\"}, "
    "\"hyperparameters\": {\"lr\": 0.001, "
    "\"global_batch_size\": 1, \"max_steps\": 1, \"eval_every\": 0, \"sample_every\": 0}, "
    "\"resources\": {\"nodes\": 1, \"slots_per_node\": 1, \"slot_type\": \"cpu\", \"device\": \"cpu\"}}";

/* kiln-train as job of project (NULL: none sent) on data_path, from the llm.c model init_from
 * ("": none); its exit code. */
static int run_train_in(const char *job, const char *data_path, const char *project, const char *init_from)
{
    char bin[PATH_MAX], spec[1200];
    snprintf(bin, sizeof bin, "%s/kiln-train", th_bin_dir());
    cr_assert_eq(access(bin, X_OK), 0, "%s not built (set KILN_BIN_DIR)", bin);
    const char *roots[] = {data};
    agent_launcher_t *l = lf_launcher(bin, 1, false, 1, roots, 1);
    snprintf(spec, sizeof spec, k_spec_fmt, init_from, data_path);
    int32_t ranks[] = {0};
    Kiln__Assignment a = lf_assignment(job, 1, ranks, 1, spec);
    a.world_size = 1;
    a.node_rank = 0;
    a.nodes = 1;
    a.master_addr = (char *)"127.0.0.1";
    a.master_port = th_free_port();
    if (project)
        a.project = (char *)project;
    kiln_err_t err;
    cr_assert_eq(agent_launcher_start(l, &a, &err), 0, "%s", err.message);
    int before = R.nexits;
    cr_assert(lf_wait_exits(before + 1, 50000), "kiln-train did not end");
    agent_launcher_destroy(l);
    return R.exits[before].code;
}

static int run_train(const char *job, const char *data_path)
{
    return run_train_in(job, data_path, NULL, "");
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
    assert_no_line_holds("TOP-SECRET");
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

/* The real kiln-train keeps out of other projects' areas by itself (KILN_PROJECT), given no
 * read_paths to check (a kilnd that does not fill them): by the path and through a link. Its own
 * project's area it reads. */
Test(confine, kiln_train_keeps_out_of_other_projects_areas)
{
    area_tree();
    FILE *f = fopen(area_ckpt, "w");
    for (int i = 0; i < 100; i++)
        fputs("TOP-SECRET-WEIGHTS of project a, as text for the byte vocabulary\n", f);
    fclose(f);
    char link[400];
    snprintf(link, sizeof link, "%s/innocent.txt", data);
    cr_assert_eq(symlink(area_ckpt, link), 0);
    int code = run_train_in("j-train-b", area_ckpt, "proj-b", "");
    cr_assert_eq(code, 2, "reason: %s", R.exits[0].reason);
    cr_assert(strstr(R.exits[0].reason, "another project"), "reason: %s", R.exits[0].reason);
    code = run_train_in("j-train-b-link", link, "proj-b", "");
    cr_assert_eq(code, 2, "reason: %s", R.exits[1].reason);
    cr_assert(strstr(R.exits[1].reason, "another project") && !strstr(R.exits[1].reason, "proj-a"), "reason: %s",
              R.exits[1].reason);
    assert_no_line_holds("TOP-SECRET");
    code = run_train_in("j-train-a", link, "proj-a", "");
    cr_assert_eq(code, 0, "reason: %s", R.exits[2].reason);

    /* model.init_from, an llm.c file (the model j-train-a wrote): from the shared part of the root
     * for anyone, from project a's area for project a only */
    char model[400], shared[400], own[400], cmd[2600];
    snprintf(model, sizeof model, "%s/jobs/j-train-a/output/model_llmc.bin", dir);
    snprintf(shared, sizeof shared, "%s/model.bin", data);
    snprintf(own, sizeof own, "%s/ck/" KILN_AREA_DIR "/proj-a/model.bin", data);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s' && cp '%s' '%s' && chmod 644 '%s' '%s'", model, shared, model, own, shared,
             own); /* readable by a sandbox's uid */
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    snprintf(link, sizeof link, "%s/corpus.txt", data);
    code = run_train_in("j-init-b", link, "proj-b", shared);
    cr_assert_eq(code, 0, "reason: %s", R.exits[3].reason);
    code = run_train_in("j-init-b-area", link, "proj-b", own);
    cr_assert_eq(code, 2, "reason: %s", R.exits[4].reason);
    cr_assert(strstr(R.exits[4].reason, "model.init_from") && strstr(R.exits[4].reason, "another project"),
              "reason: %s", R.exits[4].reason);
    code = run_train_in("j-init-a", link, "proj-a", own);
    cr_assert_eq(code, 0, "reason: %s", R.exits[5].reason);
}
