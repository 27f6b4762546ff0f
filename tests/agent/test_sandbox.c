/* test_sandbox.c - the ranks' sandbox with real child processes, through the launcher: escape
 * attempts from a rank (read /etc/shadow, the agent's credential, another job's directories;
 * write outside its own; signal or trace the agent, another job's rank or the box's init; mount,
 * become root) each fail while the agent and the other job go on; a fork bomb stops at the task
 * limit, /tmp fills up to its size, a memory hog is killed and reported as out of memory; output,
 * metric records, exit codes and signals pass through; SIGTERM reaches a rank that has no handler;
 * two kiln-train ranks of a job share the shm transport; jobs never share a uid and their
 * directories go back to the agent; an agent that is not root refuses to start; and the cgroup v2
 * decisions on a tree of plain files. */
#include "tests/agent/launch_fixture.h"
#include "tests/common/harness.h"
#include "agent/agent_int.h"

#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(sandbox, .init = lf_setup, .fini = lf_teardown, .timeout = 90);

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

/* Whether a line of job starts with prefix; the line's text into out (may be NULL). */
static bool job_line(const char *job, const char *prefix, char *out, size_t n)
{
    bool hit = false;
    pthread_mutex_lock(&R.mu);
    for (int i = 0; i < R.nlines && !hit; i++)
        if (!strcmp(R.lines[i].job, job) && !strncmp(R.lines[i].text, prefix, strlen(prefix))) {
            hit = true;
            if (out)
                snprintf(out, n, "%s", R.lines[i].text);
        }
    pthread_mutex_unlock(&R.mu);
    return hit;
}

/* The exit of job's rank 0, or NULL. */
static const ev_exit_t *job_exit(const char *job)
{
    for (int i = 0; i < R.nexits; i++)
        if (!strcmp(R.exits[i].job, job))
            return &R.exits[i];
    return NULL;
}

static void start(agent_launcher_t *l, const char *job, int nranks)
{
    int32_t *ranks = calloc((size_t)nranks, sizeof(int32_t));
    for (int i = 0; i < nranks; i++)
        ranks[i] = i;
    Kiln__Assignment a = lf_assignment(job, 1, ranks, (size_t)nranks, "{}");
    kiln_err_t err;
    cr_assert_eq(agent_launcher_start(l, &a, &err), 0, "%s: %s", job, err.message);
    free(ranks);
}

/* One program for every job of a test: the part named by the job runs (a rank sees no other file
 * of the test's directory). A hostile part starts with CONFINED: it runs only as a uid of the
 * sandbox's default range, so that a rank that is not confined (a broken sandbox, a test run with
 * it off) fails the test instead of signalling every process of the host or writing into /usr. */
static char *program(const char *cases)
{
    char body[8192];
    snprintf(body, sizeof(body),
             "confined() { u=$(id -u); [ \"$u\" -ge %u ] && [ \"$u\" -le %u ]; }\n"
             "case $KILN_JOB_ID in\n%s\nesac\n", AGENT_SANDBOX_UID_LO, AGENT_SANDBOX_UID_HI, cases);
    return lf_script("rank.sh", body);
}

#define CONFINED "  confined || { echo \"not confined (uid $(id -u)): the hostile part does not run\" >&2; exit 9; }\n"

/* Each attempt prints NAME=denied when it fails, NAME=ESCAPED when it works; what a rank may do
 * prints NAME=yes. Last, the rank signals every process it can (kill -1): its own, not others'. */
#define ATTACK                                                                                            \
    "attack)\n"                                                                                           \
    CONFINED                                                                                              \
    "  try() { if sh -c \"$2\" >/dev/null 2>&1; then echo \"$1=ESCAPED\"; else echo \"$1=denied\"; fi; }\n" \
    "  can() { if sh -c \"$2\" >/dev/null 2>&1; then echo \"$1=yes\"; else echo \"$1=no\"; fi; }\n"      \
    "  try shadow 'cat /etc/shadow'\n"                                                                   \
    "  try credential \"cat $T_WORK/agent-credential\"\n"                                                \
    "  try work_dir \"ls -A $T_WORK | grep -v -x -e jobs -e rank.sh -e data\"\n"                                 \
    "  try other_jobs \"ls -A $T_WORK/jobs | grep -v -x attack\"\n"                                      \
    "  try other_output \"cat $T_OTHER/output/secret\"\n"                                                \
    "  try other_checkpoint \"ls $T_OTHER/checkpoints\"\n"                                               \
    "  try root_home 'ls /root'\n"                                                                       \
    "  try home 'ls /home'\n"                                                                            \
    "  try write_usr 'touch /usr/kiln-escape'\n"                                                         \
    "  try write_etc 'touch /etc/kiln-escape'\n"                                                         \
    "  try write_root 'touch /kiln-escape'\n"                                                            \
    "  try write_data \"touch $T_DATA/kiln-escape\"\n"                                                   \
    "  try write_spec \"echo x >> $KILN_SPEC\"\n"                                                        \
    "  try see_agent \"test -e /proc/$T_AGENT_PID\"\n"                                                   \
    "  try kill_agent \"kill -0 $T_AGENT_PID\"\n"                                                        \
    "  try kill_other \"kill -0 $T_OTHER_PID\"\n"                                                        \
    "  try kill_init 'kill -9 1; sleep 0.1; ! kill -0 1'\n"                                              \
    "  try ptrace_agent \"python3 -c 'import ctypes,sys; sys.exit(ctypes.CDLL(None).ptrace(16, $T_AGENT_PID, 0, 0))'\"\n" \
    "  try ptrace_other \"python3 -c 'import ctypes,sys; sys.exit(ctypes.CDLL(None).ptrace(16, $T_OTHER_PID, 0, 0))'\"\n" \
    "  try ptrace_init \"python3 -c 'import ctypes,sys; sys.exit(ctypes.CDLL(None).ptrace(16, 1, 0, 0))'\"\n" \
    "  try init_root 'ls /proc/1/root/'\n"                                                               \
    "  try mount 'mkdir -p /tmp/m && mount -t tmpfs none /tmp/m'\n"                                      \
    "  try setuid_root \"python3 -c 'import os; os.setuid(0)'\"\n"                                       \
    "  try cgroup_fs 'ls /sys/fs/cgroup/memory'\n"                                                       \
    "  can read_data \"cat $T_DATA/corpus.txt\"\n"                                                       \
    "  can write_output \"echo mine > $KILN_OUTPUT_DIR/mine\"\n"                                         \
    "  can write_tmp 'echo mine > /tmp/mine'\n"                                                          \
    "  echo \"ids=$(id -u):$(id -g):$(id -G)\"\n"                                                        \
    "  python3 -c \"import os, pwd; print('pw=' + pwd.getpwuid(os.getuid()).pw_name)\"\n"                \
    "  echo \"procs=$(ls /proc | grep -c '^[0-9]')\"\n"                                                  \
    "  echo attack-done\n"                                                                               \
    "  confined && kill -9 -1;;\n"

Test(sandbox, escape_attempts_fail_while_the_agent_and_another_job_go_on)
{
    char data[300], path[600], other[400];
    snprintf(data, sizeof(data), "%s/data", dir);
    cr_assert_eq(mkdir(data, 0755), 0);
    snprintf(path, sizeof(path), "%s/corpus.txt", data);
    write_file(path, "hello\n");
    snprintf(path, sizeof(path), "%s/agent-credential", dir);
    write_file(path, "worker_id w-1\ncredential AGENT-SECRET\n");
    chmod(path, 0600);
    char *bin = program(ATTACK
                        "victim)\n"
                        "  echo VICTIM-SECRET > \"$KILN_OUTPUT_DIR/secret\"\n"
                        "  echo ckpt > \"$KILN_CHECKPOINT_DIR/ckpt\"\n"
                        "  echo victim-up\n"
                        "  trap 'echo victim-stopped; exit 143' TERM\n"
                        "  while :; do sleep 0.05; done;;\n");
    const char *roots[] = {data};
    agent_launcher_t *l = lf_launcher(bin, 2, false, 2, roots, 1);
    start(l, "victim", 1);
    cr_assert(lf_wait_line("victim", -1, "victim-up", 30000));
    pid_t victim = lf_find_process("victim", "rank.sh");
    cr_assert_gt(victim, 0);
    char v[32];
    snprintf(other, sizeof(other), "%s/jobs/victim", dir);
    setenv("T_WORK", dir, 1);
    setenv("T_OTHER", other, 1);
    setenv("T_DATA", data, 1);
    snprintf(v, sizeof(v), "%d", (int)getpid());
    setenv("T_AGENT_PID", v, 1);
    snprintf(v, sizeof(v), "%d", (int)victim);
    setenv("T_OTHER_PID", v, 1);
    start(l, "attack", 1);
    cr_assert(lf_wait_exits(1, 60000), "the attacker ends");
    static const char *const tries[] = {
        "shadow", "credential", "work_dir", "other_output", "other_checkpoint", "root_home", "home", "write_usr",
        "write_etc", "write_root", "write_data", "write_spec", "see_agent", "kill_agent", "kill_other", "kill_init",
        "ptrace_agent", "ptrace_other", "ptrace_init", "init_root", "mount", "setuid_root", "cgroup_fs", "other_jobs"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(tries); i++) {
        char want[64], got[256] = "";
        snprintf(want, sizeof(want), "%s=", tries[i]);
        cr_assert(job_line("attack", want, got, sizeof(got)), "no line for %s", tries[i]);
        snprintf(want, sizeof(want), "%s=denied", tries[i]);
        cr_assert_str_eq(got, want);
    }
    cr_assert(job_line("attack", "read_data=yes", NULL, 0), "a rank reads the data roots");
    cr_assert(job_line("attack", "write_output=yes", NULL, 0), "a rank writes its own output directory");
    cr_assert(job_line("attack", "write_tmp=yes", NULL, 0), "a rank writes its /tmp");
    char ids[128];
    cr_assert(job_line("attack", "ids=", ids, sizeof(ids)));
    unsigned uid = 0, gid = 0;
    cr_assert_eq(sscanf(ids, "ids=%u:%u:", &uid, &gid), 2, "%s", ids);
    cr_assert(uid >= AGENT_SANDBOX_UID_LO && uid <= AGENT_SANDBOX_UID_HI, "uid %u", uid);
    cr_assert_eq(uid, gid);
    cr_assert(job_line("attack", "pw=kiln", NULL, 0), "getpwuid knows the rank's user");
    char procs[64];
    cr_assert(job_line("attack", "procs=", procs, sizeof(procs)));
    cr_assert_leq(atoi(procs + 6), 8, "a rank sees only its box's processes: %s", procs);
    cr_assert(job_line("attack", "attack-done", NULL, 0));
    pthread_mutex_lock(&R.mu);
    for (int i = 0; i < R.nlines; i++)
        cr_assert_null(strstr(R.lines[i].text, "SECRET"), "a secret in a line: %s", R.lines[i].text);
    pthread_mutex_unlock(&R.mu);
    /* nothing was written outside, the victim runs on and stops when asked */
    cr_assert_neq(access("/usr/kiln-escape", F_OK), 0);
    snprintf(path, sizeof(path), "%s/kiln-escape", data);
    cr_assert_neq(access(path, F_OK), 0);
    cr_assert_eq(lf_find_process("victim", "rank.sh"), victim, "the victim runs on");
    agent_rank_info_t info[4];
    size_t listed = 0;
    for (int i = 0; i < 250 && (listed = agent_launcher_list(l, info, 4)) != 1; i++)
        usleep(20000); /* the attacker leaves the list once its exit is delivered */
    cr_assert_eq(listed, 1);
    cr_assert_str_eq(info[0].job_id, "victim");
    cr_assert_eq(agent_launcher_stop(l, "victim", 0, 5000), 1);
    cr_assert(lf_wait_exits(2, 10000));
    cr_assert_eq(job_exit("victim")->code, 143, "the victim ended on its stop order");
    cr_assert(job_line("victim", "victim-stopped", NULL, 0));
    cr_assert(agent_launcher_wait_idle(l, 10000));
    /* the job's files are the agent's again once its box is gone */
    struct stat st;
    snprintf(path, sizeof(path), "%s/output/secret", other);
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_uid, geteuid(), "owned by %u", (unsigned)st.st_uid);
    snprintf(path, sizeof(path), "%s/checkpoints/ckpt", other);
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_uid, geteuid());
    cr_assert_eq(st.st_mode & 0777, 0600);
    agent_launcher_destroy(l);
}

Test(sandbox, a_fork_bomb_stops_at_the_task_limit_and_the_host_is_fine)
{
    char *bin = program("bomb)\n" CONFINED
                        "  i=0\n"
                        "  while [ $i -lt 500 ]; do sleep 60 & i=$((i+1)); done\n"
                        "  echo \"forked all $i\";;\n"
                        "after) echo still-working;;\n");
    agent_launcher_config_t cfg = {.train_bin = bin, .work_dir = dir, .slots = 1, .cores = 1,
                                   .sandbox = {.pids_per_slot = 32}};
    agent_launcher_t *l = lf_launcher_cfg(&cfg);
    start(l, "bomb", 1);
    cr_assert(lf_wait_exits(1, 30000));
    const ev_exit_t *e = job_exit("bomb");
    cr_assert_neq(e->code, 0, "the rank fails");
    cr_assert_not(job_line("bomb", "forked all", NULL, 0));
    cr_assert(strstr(e->reason, "fork"), "reason: %s", e->reason);
    cr_assert_eq(system("true"), 0, "this host still forks");
    cr_assert(agent_launcher_wait_idle(l, 10000));
    /* what the bomb left in its box went with the box */
    cr_assert_eq(lf_find_process("bomb", "sleep"), -1);
    start(l, "after", 1);
    cr_assert(lf_wait_exits(2, 10000));
    cr_assert(job_line("after", "still-working", NULL, 0), "the agent starts the next job");
    agent_launcher_destroy(l);
}

Test(sandbox, tmp_fills_up_to_its_size_only)
{
    char *bin = program("fill)\n" CONFINED
                        "  dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>&1 | head -1\n"
                        "  echo \"size=$(du -m /tmp/fill | cut -f1)\"\n"
                        "  df -m /tmp | tail -1 | awk '{print \"tmpfs=\" $2}'\n"
                        "  echo shared > /dev/shm/x && echo shm-ok;;\n");
    agent_launcher_config_t cfg = {.train_bin = bin, .work_dir = dir, .slots = 1, .cores = 1,
                                   .sandbox = {.tmp_mb = 8}};
    agent_launcher_t *l = lf_launcher_cfg(&cfg);
    start(l, "fill", 1);
    cr_assert(lf_wait_exits(1, 30000));
    cr_assert(job_line("fill", "dd: error writing '/tmp/fill': No space left on device", NULL, 0));
    char got[64];
    cr_assert(job_line("fill", "size=", got, sizeof(got)));
    cr_assert_leq(atoi(got + 5), 8, "%s", got);
    cr_assert(job_line("fill", "tmpfs=8", NULL, 0), "an 8 MiB /tmp");
    cr_assert(job_line("fill", "shm-ok", NULL, 0));
    agent_launcher_destroy(l);
}

Test(sandbox, a_memory_hog_is_killed_and_reported_out_of_memory)
{
    char *bin = program("hog)\n" CONFINED "  exec python3 -c \"x = b'1' * (512 << 20); print('survived')\";;\n"
                        "calm) exec python3 -c \"x = b'1' * (8 << 20); print('fine')\";;\n");
    agent_launcher_config_t cfg = {.train_bin = bin, .work_dir = dir, .slots = 1, .cores = 1,
                                   .sandbox = {.memory_per_slot_mb = 64}};
    agent_launcher_t *l = lf_launcher_cfg(&cfg);
    start(l, "hog", 1);
    cr_assert(lf_wait_exits(1, 30000));
    const ev_exit_t *e = job_exit("hog");
    cr_assert_eq(e->sig, SIGKILL);
    cr_assert_str_eq(e->reason, "out of memory (limit 64 MiB)");
    cr_assert_not(job_line("hog", "survived", NULL, 0));
    start(l, "calm", 1);
    cr_assert(lf_wait_exits(2, 30000));
    cr_assert_eq(job_exit("calm")->code, 0, "within the limit: %s", job_exit("calm")->reason);
    cr_assert(job_line("calm", "fine", NULL, 0));
    agent_launcher_destroy(l);
}

Test(sandbox, output_metrics_exit_codes_and_signals_are_the_ranks_own)
{
    char *bin = program("code) echo to-stdout; echo to-stderr >&2\n"
                        "  echo '{\"step\": 2, \"metrics\": {\"loss\": 1.5}}' >&$KILN_METRICS_FD\n"
                        "  exit 7;;\n"
                        "segv) kill -SEGV $$;;\n"
                        "exit137) exit 137;;\n"
                        "plain) exec python3 -c \"import time; print('waiting', flush=True); time.sleep(60)\";;\n");
    agent_launcher_t *l = lf_launcher(bin, 4, false, 4, NULL, 0);
    start(l, "code", 1);
    start(l, "segv", 1);
    start(l, "exit137", 1);
    start(l, "plain", 1);
    cr_assert(lf_wait_exits(3, 20000));
    const ev_exit_t *e = job_exit("code");
    cr_assert_eq(e->code, 7);
    cr_assert_str_eq(e->reason, "to-stderr");
    cr_assert(job_line("code", "to-stdout", NULL, 0));
    bool point = false;
    for (size_t i = 0; i < R.points.n; i++)
        point |= !strcmp(R.points.v[i].name, "loss") && R.points.v[i].value == 1.5 && R.points.v[i].step == 2;
    cr_assert(point, "the metric record came through");
    e = job_exit("segv");
    cr_assert_eq(e->code, -1);
    cr_assert_eq(e->sig, SIGSEGV, "killed by signal %d", e->sig);
    e = job_exit("exit137");
    cr_assert_eq(e->code, 137, "an exit code is not a signal");
    cr_assert_eq(e->sig, 0);
    /* a program without a SIGTERM handler dies of the stop order's SIGTERM (it is not its PID
     * namespace's init, which would ignore it), well before the grace's SIGKILL */
    cr_assert(lf_wait_line("plain", -1, "waiting", 30000));
    int64_t t0 = kiln_mono_us();
    cr_assert_eq(agent_launcher_stop(l, "plain", 0, 20000), 1);
    cr_assert(lf_wait_exits(4, 15000));
    e = job_exit("plain");
    cr_assert_eq(e->sig, SIGTERM, "killed by signal %d", e->sig);
    cr_assert_lt((kiln_mono_us() - t0) / 1000, 10000);
    agent_launcher_destroy(l);
}

Test(sandbox, jobs_never_share_a_uid_and_a_jobs_ranks_share_one)
{
    char *bin = program("*)\n" CONFINED "  echo \"uid=$(id -u)\"\n"
                        "  echo \"$KILN_RANK\" > /dev/shm/rank-$KILN_RANK\n"
                        "  while [ \"$(ls /dev/shm | grep -c rank-)\" -lt $KILN_LOCAL_WORLD_SIZE ]; do sleep 0.02; done\n"
                        "  echo shm-shared\n"
                        "  sleep 0.3;;\n");
    agent_launcher_t *l1 = lf_launcher(bin, 2, false, 2, NULL, 0);
    agent_launcher_t *l2 = lf_launcher(bin, 2, false, 2, NULL, 0); /* a second agent of this host */
    start(l1, "one", 2);
    start(l2, "two", 1);
    cr_assert(lf_wait_exits(3, 20000));
    unsigned one[2] = {0, 0}, two = 0;
    int n1 = 0;
    pthread_mutex_lock(&R.mu);
    for (int i = 0; i < R.nlines; i++) {
        if (strncmp(R.lines[i].text, "uid=", 4) != 0)
            continue;
        unsigned u = (unsigned)strtoul(R.lines[i].text + 4, NULL, 10);
        if (!strcmp(R.lines[i].job, "one") && n1 < 2)
            one[n1++] = u;
        else if (!strcmp(R.lines[i].job, "two"))
            two = u;
    }
    pthread_mutex_unlock(&R.mu);
    cr_assert_eq(n1, 2);
    cr_assert_eq(one[0], one[1], "the ranks of one job share a uid");
    cr_assert(one[0] && two && one[0] != two, "jobs one (%u) and two (%u) share no uid", one[0], two);
    cr_assert(job_line("one", "shm-shared", NULL, 0), "the ranks of a job share /dev/shm");
    for (int i = 0; i < R.nexits; i++)
        cr_assert_eq(R.exits[i].code, 0);
    agent_launcher_destroy(l1);
    agent_launcher_destroy(l2);
}

/* A second agent of this host that records its uids in another --sandbox-state-dir (a
 * misconfiguration: agents of one host share it) neither takes the first agent's live box for a
 * dead agent's and kills it when it starts, nor hands out its uid. Both use a uid range and state
 * dirs of this test's own, so that no other test's box is in their way or they in its. */
Test(sandbox, an_agent_with_another_state_dir_leaves_a_live_box_alone)
{
    char *bin = program("*)\n  echo \"uid=$(id -u)\"\n  sleep 2\n  echo survived;;\n");
    char bin_copy[PATH_MAX], state[2][PATH_MAX + 16];
    snprintf(bin_copy, sizeof(bin_copy), "%s", bin);
    agent_launcher_t *l[2];
    for (int i = 0; i < 2; i++) {
        snprintf(state[i], sizeof(state[i]), "%s-state%d", dir, i);
        agent_launcher_config_t cfg = {.train_bin = bin_copy, .work_dir = dir, .slots = 1, .cores = 1,
                                       .sandbox = {.state_dir = state[i], .uid_lo = 2100000000u,
                                                   .uid_hi = 2100000015u}};
        l[i] = lf_launcher_cfg(&cfg); /* the second's start sweeps the host's boxes */
        if (i == 0) {
            start(l[0], "first", 1);
            cr_assert(lf_wait_line("first", -1, "uid=", 30000), "the first job did not start");
        }
    }
    start(l[1], "second", 1);
    cr_assert(lf_wait_exits(2, 20000), "the jobs did not end");
    cr_assert(job_line("first", "survived", NULL, 0), "the second agent's start killed the first agent's live box");
    char u1[64] = "", u2[64] = "";
    cr_assert(job_line("first", "uid=", u1, sizeof(u1)) && job_line("second", "uid=", u2, sizeof(u2)));
    cr_assert_str_neq(u1, u2, "both jobs ran as %s", u1);
    for (int i = 0; i < R.nexits; i++)
        cr_assert_eq(R.exits[i].code, 0, "job %s exited %d", R.exits[i].job, R.exits[i].code);
    agent_launcher_destroy(l[1]);
    agent_launcher_destroy(l[0]);
    char cmd[2 * PATH_MAX + 64];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", state[0], state[1]);
    cr_assert_eq(system(cmd), 0);
}

/* What a box shows of the host, as the agent decides before it starts a script job's Python: the
 * system's directories and --sandbox-ro-path, by whole path components; a pyenv shim under /root
 * is not shown, so the agent warns at start and the job is told what to change. */
Test(sandbox, a_program_outside_what_boxes_show_is_told_apart)
{
    char state[PATH_MAX + 16], venv[PATH_MAX + 16], shim[PATH_MAX + 32];
    snprintf(state, sizeof(state), "%s-state", dir);
    snprintf(venv, sizeof(venv), "%s/venv", dir);
    const char *ro[] = {venv};
    agent_sandbox_config_t cfg = {.state_dir = state, .uid_lo = 2100000016u, .uid_hi = 2100000031u,
                                  .ro_paths = ro, .n_ro_paths = 1};
    cr_assert_eq(mkdir(venv, 0755), 0);
    sandbox_t *s = NULL;
    kiln_err_t err;
    cr_assert_eq(sandbox_create(&cfg, 1, &s, &err), 0, "%s", err.message);
    cr_assert(sandbox_shows(s, "/usr/bin/python3"));
    cr_assert(sandbox_shows(s, "/bin/sh"));
    cr_assert(!sandbox_shows(s, "/root/.pyenv/shims/python3"));
    cr_assert(!sandbox_shows(s, "/usrlocal/bin/python3"), "a prefix of a name is not the directory");
    snprintf(shim, sizeof(shim), "%s/bin/python3", venv);
    cr_assert(sandbox_shows(s, shim), "%s lies under --sandbox-ro-path %s", shim, venv);
    snprintf(shim, sizeof(shim), "%s2/bin/python3", venv);
    cr_assert(!sandbox_shows(s, shim));
    sandbox_destroy(s);
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", state);
    cr_assert_eq(system(cmd), 0);
}

/* A link the box shows that leads where it shows nothing (/usr/local/bin/python3 -> /opt/conda/...)
 * is not shown: a box would fail at exec. Here a --sandbox-ro-path directory holds links into one
 * the boxes do not show, into /usr, and a --sandbox-ro-path that is itself a link is followed. */
Test(sandbox, a_link_is_shown_only_where_it_leads_is)
{
    char state[PATH_MAX + 16], shown[PATH_MAX + 16], hidden[PATH_MAX + 16], path[PATH_MAX + 32],
        link[PATH_MAX + 64], alias[PATH_MAX + 16];
    snprintf(state, sizeof(state), "%s-state", dir);
    snprintf(shown, sizeof(shown), "%s/shown", dir);
    snprintf(hidden, sizeof(hidden), "%s/hidden", dir);
    snprintf(alias, sizeof(alias), "%s/alias", dir);
    cr_assert_eq(mkdir(shown, 0755), 0);
    cr_assert_eq(mkdir(hidden, 0755), 0);
    cr_assert_eq(symlink(hidden, alias), 0);
    snprintf(path, sizeof(path), "%s/python3", hidden);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0755);
    cr_assert_geq(fd, 0);
    close(fd);
    const char *ro[] = {shown, alias};
    agent_sandbox_config_t cfg = {.state_dir = state, .uid_lo = 2100000032u, .uid_hi = 2100000047u,
                                  .ro_paths = ro, .n_ro_paths = 1};
    sandbox_t *s = NULL;
    kiln_err_t err;
    cr_assert_eq(sandbox_create(&cfg, 1, &s, &err), 0, "%s", err.message);
    snprintf(link, sizeof(link), "%s/python3", shown);
    cr_assert_eq(symlink(path, link), 0);
    cr_assert(!sandbox_shows(s, path));
    cr_assert(!sandbox_shows(s, link), "%s leads to %s, which no box shows", link, path);
    snprintf(link, sizeof(link), "%s/python3-dir", shown); /* a directory of the path a link */
    cr_assert_eq(symlink(hidden, link), 0);
    snprintf(link, sizeof(link), "%s/python3-dir/python3", shown);
    cr_assert(!sandbox_shows(s, link), "%s leads to %s, which no box shows", link, path);
    snprintf(link, sizeof(link), "%s/python3-usr", shown);
    cr_assert_eq(symlink("/bin/sh", link), 0);
    cr_assert(sandbox_shows(s, link), "%s leads into the system's directories", link);
    snprintf(link, sizeof(link), "%s/python3-gone", shown);
    cr_assert_eq(symlink("/nonexistent/python3", link), 0);
    cr_assert(sandbox_shows(s, link), "a link that leads nowhere is exec's to report");
    sandbox_destroy(s);
    /* a --sandbox-ro-path that is a link shows where it leads at its own place */
    cfg.ro_paths = ro + 1;
    cr_assert_eq(sandbox_create(&cfg, 1, &s, &err), 0, "%s", err.message);
    snprintf(link, sizeof(link), "%s/python3", alias);
    cr_assert(sandbox_shows(s, link), "%s lies under --sandbox-ro-path %s", link, alias);
    sandbox_destroy(s);
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", state);
    cr_assert_eq(system(cmd), 0);
}

/* Makes dir/shown (a directory a test's boxes show) and dir/hidden (one they do not) and an empty
 * executable dir/hidden/python3 (into real): the Python a --python can lead to out of the boxes.
 * Each buffer holds PATH_MAX + 16 bytes or more. */
static void python_beyond_boxes(char *shown, char *hidden, char *real)
{
    snprintf(shown, PATH_MAX + 16, "%s/shown", dir);
    snprintf(hidden, PATH_MAX + 16, "%s/hidden", dir);
    cr_assert_eq(mkdir(shown, 0755), 0);
    cr_assert_eq(mkdir(hidden, 0755), 0);
    snprintf(real, PATH_MAX + 16, "%s/python3", hidden);
    int fd = open(real, O_WRONLY | O_CREAT | O_EXCL, 0755);
    cr_assert_geq(fd, 0);
    close(fd);
}

/* The agent's start: a --python that links out of what the boxes show is told apart, and the
 * warning names it as given and where it leads. */
Test(sandbox, an_agent_warns_of_a_python_that_links_out_of_the_boxes)
{
    char state[PATH_MAX + 16], shown[PATH_MAX + 16], hidden[PATH_MAX + 16], real[PATH_MAX + 32],
        link[PATH_MAX + 32], bin_copy[PATH_MAX];
    char *bin = program("*)\n  true;;\n");
    snprintf(bin_copy, sizeof(bin_copy), "%s", bin);
    snprintf(state, sizeof(state), "%s-state", dir);
    python_beyond_boxes(shown, hidden, real);
    snprintf(link, sizeof(link), "%s/python3", shown);
    cr_assert_eq(symlink(real, link), 0);
    const char *ro[] = {shown};
    agent_launcher_config_t cfg = {.train_bin = bin_copy, .work_dir = dir, .slots = 1, .cores = 1, .python = link,
                                   .sandbox = {.state_dir = state, .uid_lo = 2100000032u, .uid_hi = 2100000047u,
                                               .ro_paths = ro, .n_ro_paths = 1}};
    cr_redirect_stderr();
    agent_launcher_destroy(lf_launcher_cfg(&cfg));
    fflush(stderr);
    char out[16384];
    size_t n = fread(out, 1, sizeof(out) - 1, cr_get_redirected_stderr());
    out[n] = '\0';
    char want[3 * PATH_MAX];
    snprintf(want, sizeof(want), "--python %s, a link to %s, lies outside what the sandbox shows ranks", link, real);
    cr_assert(strstr(out, want), "no \"%s\" in:\n%s", want, out);
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", state);
    cr_assert_eq(system(cmd), 0);
}

/* A script job that would run a --python no box shows is refused before its ranks start, its
 * reason naming the Python as the operator gave it (a link's directory resolved, it named only
 * where that led), then where it was found and where it leads. */
Test(sandbox, a_jobs_reason_names_a_hidden_python_as_given)
{
    char state[PATH_MAX + 16], shown[PATH_MAX + 16], hidden[PATH_MAX + 16], real[PATH_MAX + 32],
        alias[PATH_MAX + 32], given[PATH_MAX + 48], found[PATH_MAX + 48], root[PATH_MAX + 16], code[PATH_MAX + 32],
        entry[PATH_MAX + 48], bin_copy[PATH_MAX];
    char *bin = program("*)\n  true;;\n");
    snprintf(bin_copy, sizeof(bin_copy), "%s", bin);
    snprintf(state, sizeof(state), "%s-state", dir);
    python_beyond_boxes(shown, hidden, real);
    /* --python shown/bin/python3, where shown/bin leads to hidden */
    snprintf(alias, sizeof(alias), "%s/bin", shown);
    cr_assert_eq(symlink(hidden, alias), 0);
    snprintf(given, sizeof(given), "%s/python3", alias);
    snprintf(found, sizeof(found), "%s/python3", hidden);
    snprintf(root, sizeof(root), "%s/data", dir);
    snprintf(code, sizeof(code), "%s/code", root);
    cr_assert_eq(mkdir(root, 0755), 0);
    cr_assert_eq(mkdir(code, 0755), 0);
    snprintf(entry, sizeof(entry), "%s/main.py", code);
    FILE *f = fopen(entry, "w");
    cr_assert_not_null(f);
    fputs("print('hello')\n", f);
    fclose(f);
    const char *ro[] = {shown}, *roots[] = {root};
    agent_launcher_config_t cfg = {.train_bin = bin_copy, .work_dir = dir, .slots = 1, .cores = 1, .python = given,
                                   .data_roots = roots, .n_data_roots = 1,
                                   .sandbox = {.state_dir = state, .uid_lo = 2100000032u, .uid_hi = 2100000047u,
                                               .ro_paths = ro, .n_ro_paths = 1}};
    agent_launcher_t *l = lf_launcher_cfg(&cfg);
    int32_t ranks[] = {0};
    Kiln__Assignment a = lf_assignment("job-hidden-python", 1, ranks, 1, "{}");
    a.world_size = 1;
    a.nodes = 1;
    a.node_rank = 0;
    a.entry_point = "main.py";
    a.source = code;
    kiln_err_t err;
    kiln_err_clear(&err);
    int rc = agent_launcher_start(l, &a, &err);
    cr_assert_eq(rc, KILN_EUNSUPP, "rc %d: %s", rc, err.message);
    char want[3 * PATH_MAX];
    snprintf(want, sizeof(want), "this agent's Python %s, that is %s, lies outside what its sandbox shows ranks", given,
             found);
    cr_assert(strstr(err.message, want), "no \"%s\" in: %s", want, err.message);
    agent_launcher_destroy(l);
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", state);
    cr_assert_eq(system(cmd), 0);
}

/* The agent's start: a --python given whole that cannot be run (missing, a link that leads nowhere,
 * a loop of links) is warned of as one not in PATH is, naming it and why; each read as shown (a
 * link that leads nowhere is exec's to report) and nothing was said until a job failed. */
Test(sandbox, an_agent_warns_of_a_python_it_cannot_run)
{
    char state[PATH_MAX + 16], shown[PATH_MAX + 16], bin_copy[PATH_MAX], gone[PATH_MAX + 32], loop_a[PATH_MAX + 32],
        loop_b[PATH_MAX + 32], missing[PATH_MAX + 32];
    char *bin = program("*)\n  true;;\n");
    snprintf(bin_copy, sizeof(bin_copy), "%s", bin);
    snprintf(state, sizeof(state), "%s-state", dir);
    snprintf(shown, sizeof(shown), "%s/shown", dir);
    cr_assert_eq(mkdir(shown, 0755), 0);
    snprintf(gone, sizeof(gone), "%s/python3-gone", shown);
    cr_assert_eq(symlink("/nonexistent/python3", gone), 0);
    snprintf(loop_a, sizeof(loop_a), "%s/python3-a", shown);
    snprintf(loop_b, sizeof(loop_b), "%s/python3-b", shown);
    cr_assert_eq(symlink(loop_b, loop_a), 0);
    cr_assert_eq(symlink(loop_a, loop_b), 0);
    snprintf(missing, sizeof(missing), "%s/python3-missing", shown);
    const char *ro[] = {shown};
    const struct {
        const char *python, *why;
    } cases[] = {{gone, "No such file or directory"}, {loop_a, "Too many levels of symbolic links"},
                 {missing, "No such file or directory"}};
    cr_redirect_stderr();
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        agent_launcher_config_t cfg = {.train_bin = bin_copy, .work_dir = dir, .slots = 1, .cores = 1,
                                       .python = cases[i].python,
                                       .sandbox = {.state_dir = state, .uid_lo = 2100000032u, .uid_hi = 2100000047u,
                                                   .ro_paths = ro, .n_ro_paths = 1}};
        agent_launcher_destroy(lf_launcher_cfg(&cfg));
    }
    fflush(stderr);
    char out[16384];
    size_t n = fread(out, 1, sizeof(out) - 1, cr_get_redirected_stderr());
    out[n] = '\0';
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        char want[PATH_MAX + 128];
        snprintf(want, sizeof(want), "--python %s cannot be run (%s): script jobs", cases[i].python, cases[i].why);
        cr_assert(strstr(out, want), "no \"%s\" in:\n%s", want, out);
    }
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", state);
    cr_assert_eq(system(cmd), 0);
}

/* A box an agent left behind whose cgroup is half removed (with cgroup v1, its pids cgroup alone;
 * with v2, its one cgroup) is swept by the next agent of the same state dir when it starts. Uses
 * a uid range and a state dir of this test's own. */
Test(sandbox, a_half_removed_box_of_a_dead_agent_is_swept_at_start)
{
    char state[PATH_MAX + 16], claim[PATH_MAX + 64], stale[700], bin_copy[PATH_MAX];
    char *bin = program("*)\n  true;;\n");
    snprintf(bin_copy, sizeof(bin_copy), "%s", bin);
    snprintf(state, sizeof(state), "%s-state", dir);
    agent_launcher_config_t cfg = {.train_bin = bin_copy, .work_dir = dir, .slots = 1, .cores = 1,
                                   .sandbox = {.state_dir = state, .uid_lo = 2100000020u, .uid_hi = 2100000023u}};
    agent_launcher_destroy(lf_launcher_cfg(&cfg)); /* the cgroup bases and the state dir exist */
    char *self = NULL;
    size_t len = 0;
    kiln_err_t err;
    cr_assert_eq(kiln_file_read("/proc/self/cgroup", &self, &len, &err), 0);
    sandbox_cg_t cg;
    cr_assert_eq(sandbox_cg_detect("/sys/fs/cgroup", self, &cg, &err), 0, "%s", err.message);
    free(self);
    /* what a dead agent of this state dir left: for every uid of the range (the agent's own check
     * at start takes one of them, which would clean that one anyway), its claim and one cgroup */
    const char *base = cg.base[cg.version == 1 ? 1 : 0];
    for (unsigned u = 2100000020u; u <= 2100000023u; u++) {
        snprintf(claim, sizeof(claim), "%s/uid-%u", state, u);
        FILE *f = fopen(claim, "w");
        cr_assert_not_null(f);
        fclose(f);
        snprintf(stale, sizeof(stale), "%s/u%u", base, u);
        cr_assert_eq(mkdir(stale, 0755), 0, "mkdir %s", stale);
    }
    agent_launcher_t *l = lf_launcher_cfg(&cfg);
    for (unsigned u = 2100000020u; u <= 2100000023u; u++) {
        struct stat st;
        snprintf(stale, sizeof(stale), "%s/u%u", base, u);
        cr_assert_neq(stat(stale, &st), 0, "the next agent left the dead box's cgroup %s", stale);
    }
    agent_launcher_destroy(l);
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", state);
    cr_assert_eq(system(cmd), 0);
}

/* Two kiln-train ranks of one job in one box: rank 0 picks libfabric's shm provider (every rank
 * on this host, one /dev/shm) and the job trains its steps. */
Test(sandbox, two_kiln_train_ranks_train_over_shm_in_their_box, .timeout = 180)
{
    char bin[PATH_MAX], spec[1200], data[300], corpus[400];
    snprintf(bin, sizeof bin, "%s/kiln-train", th_bin_dir());
    cr_assert_eq(access(bin, X_OK), 0, "%s not built (set KILN_BIN_DIR)", bin);
    snprintf(data, sizeof data, "%s/data", dir);
    cr_assert_eq(mkdir(data, 0755), 0);
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", data);
    FILE *f = fopen(corpus, "w");
    for (int i = 0; i < 200; i++)
        fputs("First Citizen: Before we proceed any further, hear me speak.\n", f);
    fclose(f);
    snprintf(spec, sizeof spec,
             "{\"name\": \"shm\", \"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 1, \"n_embd\": 16, "
             "\"seq_len\": 16, \"vocab\": \"bytes\"}, \"data\": {\"train\": \"%s\"}, \"hyperparameters\": "
             "{\"lr\": 0.001, \"global_batch_size\": 2, \"max_steps\": 3, \"eval_every\": 0, \"sample_every\": 0}, "
             "\"resources\": {\"nodes\": 1, \"slots_per_node\": 2, \"slot_type\": \"cpu\", \"device\": \"cpu\"}}",
             corpus);
    const char *roots[] = {data};
    agent_launcher_t *l = lf_launcher(bin, 2, false, 2, roots, 1);
    setenv("KILN_LOG_LEVEL", "debug", 1);
    int32_t ranks[] = {0, 1};
    Kiln__Assignment a = lf_assignment("train-shm", 1, ranks, 2, spec);
    a.world_size = 2;
    a.node_rank = 0;
    a.nodes = 1;
    a.master_addr = (char *)"127.0.0.1";
    a.master_port = 0; /* the launcher picks it */
    Kiln__JobPath jp = KILN__JOB_PATH__INIT, *jps[] = {&jp};
    jp.field = (char *)"data.train";
    jp.path = corpus;
    a.read_paths = jps;
    a.n_read_paths = 1;
    kiln_err_t err;
    cr_assert_eq(agent_launcher_start(l, &a, &err), 0, "%s", err.message);
    cr_assert(lf_wait_exits(2, 150000), "kiln-train did not end");
    unsetenv("KILN_LOG_LEVEL");
    for (int i = 0; i < 2; i++)
        cr_assert_eq(R.exits[i].code, 0, "rank %d: %s", R.exits[i].rank, R.exits[i].reason);
    bool shm[2] = {false, false};
    pthread_mutex_lock(&R.mu);
    for (int i = 0; i < R.nlines; i++)
        if (strstr(R.lines[i].text, "joined over shm") && R.lines[i].rank >= 0 && R.lines[i].rank < 2)
            shm[R.lines[i].rank] = true;
    pthread_mutex_unlock(&R.mu);
    cr_assert(shm[0] && shm[1], "both ranks joined over shm");
    agent_launcher_destroy(l);
}

Test(sandbox, an_agent_that_is_not_root_refuses_to_start_unless_the_sandbox_is_off)
{
    char *bin = program("*) echo hi;;\n");
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        if (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0)
            _exit(10);
        agent_launcher_config_t cfg = {.train_bin = bin, .work_dir = "/tmp", .slots = 1, .cores = 1};
        agent_launch_cbs_t cbs = {0};
        agent_launcher_t *l = NULL;
        kiln_err_t err;
        int rc = agent_launcher_create(&cfg, &cbs, &l, &err);
        if (rc != KILN_EPERM || !strstr(err.message, "root") || !strstr(err.hint, "--sandbox off"))
            _exit(11);
        cfg.sandbox.off = true;
        if (agent_launcher_create(&cfg, &cbs, &l, &err) != 0)
            _exit(12);
        agent_launcher_destroy(l);
        _exit(0);
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
}

/* cgroup v2 cannot be mounted here beside v1: its decisions are checked on plain files laid out as
 * /sys/fs/cgroup and /proc/self/cgroup would be on a v2 host. */
static void mkfile(const char *root, const char *rel, const char *text)
{
    char p[600], cmd[700];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", p);
    cr_assert_eq(system(cmd), 0);
    write_file(p, text);
}

static void expect_file(const char *dir_, const char *name, const char *want)
{
    char p[700], buf[256] = "";
    snprintf(p, sizeof p, "%s/%s", dir_, name);
    FILE *f = fopen(p, "r");
    cr_assert_not_null(f, "%s was not written", p);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cr_assert_str_eq(buf, want, "%s", p);
}

Test(sandbox, cgroup_v2_and_v1_decisions_on_a_tree_of_files)
{
    char root[300], p[600];
    snprintf(root, sizeof root, "%s/cg2", dir);
    mkfile(root, "cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n");
    mkfile(root, "system.slice/kiln.service/cgroup.controllers", "cpu io memory pids\n");
    sandbox_cg_t cg;
    kiln_err_t err;
    cr_assert_eq(sandbox_cg_detect(root, "0::/system.slice/kiln.service\n", &cg, &err), 0, "%s", err.message);
    cr_assert_eq(cg.version, 2);
    snprintf(p, sizeof p, "%s/system.slice/kiln.service/kiln-sandbox", root);
    cr_assert_str_eq(cg.base[0], p);
    snprintf(p, sizeof p, "%s/system.slice/kiln.service/kiln-agent", root);
    cr_assert_str_eq(cg.agent_leaf, p);
    /* an agent restarted in the leaf its predecessor moved into decides the same */
    sandbox_cg_t again;
    cr_assert_eq(sandbox_cg_detect(root, "0::/system.slice/kiln.service/kiln-agent\n", &again, &err), 0);
    cr_assert_str_eq(again.base[0], cg.base[0]);
    cr_assert_eq(sandbox_cg_setup(&cg, &err), 0, "%s", err.message);
    expect_file(cg.agent_leaf, "cgroup.procs", "0");
    snprintf(p, sizeof p, "%s/system.slice/kiln.service", root);
    expect_file(p, "cgroup.subtree_control", "+memory +pids");
    expect_file(cg.base[0], "cgroup.subtree_control", "+memory +pids");
    sandbox_cgbox_t b;
    cr_assert_eq(sandbox_cgbox_create(&cg, "u2000000007", 64 << 20, 100, &b, &err), 0, "%s", err.message);
    expect_file(b.dir[0], "memory.max", "67108864");
    expect_file(b.dir[0], "pids.max", "100");
    cr_assert_eq(b.dir[1][0], '\0', "one hierarchy");
    cr_assert_geq(b.procs_fd[0], 0);
    cr_assert_not(sandbox_cgbox_oom(&b), "no memory.events: no OOM");
    mkfile(b.dir[0], "memory.events", "low 0\nhigh 0\nmax 12\noom 1\noom_kill 0\n");
    cr_assert_not(sandbox_cgbox_oom(&b), "hitting the limit is not a kill");
    mkfile(b.dir[0], "memory.events", "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n");
    cr_assert(sandbox_cgbox_oom(&b));
    close(b.procs_fd[0]);
    sandbox_cgbox_t unlimited;
    cr_assert_eq(sandbox_cgbox_create(&cg, "u2000000008", 0, 0, &unlimited, &err), 0);
    expect_file(unlimited.dir[0], "memory.max", "max");
    expect_file(unlimited.dir[0], "pids.max", "max");
    close(unlimited.procs_fd[0]);
    /* controllers not delegated to the agent's cgroup: refused, saying how to delegate them */
    mkfile(root, "user.slice/cgroup.controllers", "cpu io\n");
    cr_assert_eq(sandbox_cg_detect(root, "0::/user.slice\n", &cg, &err), KILN_EUNSUPP);
    cr_assert(strstr(err.hint, "Delegate=yes"), "%s", err.hint);

    /* v1: the memory and pids hierarchies, each with the agent's own cgroup in it */
    snprintf(root, sizeof root, "%s/cg1", dir);
    mkfile(root, "unified/cgroup.controllers", "");
    mkfile(root, "memory/agents/a1/cgroup.procs", "");
    mkfile(root, "pids/agents/a1/cgroup.procs", "");
    const char *self = "12:pids:/agents/a1\n4:memory:/agents/a1\n1:name=systemd:/\n0::/\n";
    cr_assert_eq(sandbox_cg_detect(root, self, &cg, &err), 0, "%s", err.message);
    cr_assert_eq(cg.version, 1);
    snprintf(p, sizeof p, "%s/memory/agents/a1/kiln-sandbox", root);
    cr_assert_str_eq(cg.base[0], p);
    snprintf(p, sizeof p, "%s/pids/agents/a1/kiln-sandbox", root);
    cr_assert_str_eq(cg.base[1], p);
    cr_assert_eq(sandbox_cg_setup(&cg, &err), 0, "%s", err.message);
    cr_assert_eq(sandbox_cgbox_create(&cg, "u2000000009", 32 << 20, 50, &b, &err), 0, "%s", err.message);
    expect_file(b.dir[0], "memory.limit_in_bytes", "33554432");
    expect_file(b.dir[1], "pids.max", "50");
    mkfile(b.dir[0], "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n");
    cr_assert_not(sandbox_cgbox_oom(&b));
    mkfile(b.dir[0], "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n");
    cr_assert(sandbox_cgbox_oom(&b));
    /* a kernel without the oom_kill count: the limit was hit */
    mkfile(b.dir[0], "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\n");
    mkfile(b.dir[0], "memory.failcnt", "0\n");
    cr_assert_not(sandbox_cgbox_oom(&b));
    mkfile(b.dir[0], "memory.failcnt", "3\n");
    cr_assert(sandbox_cgbox_oom(&b));
    close(b.procs_fd[0]);
    close(b.procs_fd[1]);
    /* no memory or pids anywhere */
    snprintf(root, sizeof root, "%s/cg0", dir);
    mkfile(root, "unified/cgroup.controllers", "");
    cr_assert_eq(sandbox_cg_detect(root, "1:name=systemd:/\n0::/\n", &cg, &err), KILN_EUNSUPP);
    cr_assert(strstr(err.message, "memory and pids"), "%s", err.message);
}
