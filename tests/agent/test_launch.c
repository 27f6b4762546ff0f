/* test_launch.c - the launcher with real child processes: a small shell script stands in for
 * kiln-train. Checks the rank environment (GPU and CPU slots among it), captured lines, metric
 * points, exit codes, signals, reasons, stop orders (SIGTERM, then SIGKILL after the grace) and
 * start failures. */
#include "tests/agent/launch_fixture.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(launch, .init = lf_setup, .fini = lf_teardown, .timeout = 90);

/* A shared checkpoint directory ("<checkpoint.path>/<job id>" in the assignment) inside a data
 * root: created for the ranks (0700), so another worker that can read it resumes the job there. */
Test(launch, shared_checkpoint_dir_inside_a_root_is_created_for_the_job)
{
    char *bin = lf_script("ckpt.sh", "echo \"ckpt $KILN_CHECKPOINT_DIR\"\n"
                                     "test -d \"$KILN_CHECKPOINT_DIR\" && echo dir-ok\n");
    char root[300], ck[400];
    snprintf(root, sizeof(root), "%s/shared", dir);
    cr_assert_eq(mkdir(root, 0755), 0);
    const char *roots[] = {root};
    agent_launcher_t *l = lf_launcher(bin, 2, false, 8, roots, 1);
    int32_t ranks[] = {0};
    Kiln__Assignment a = lf_assignment("job-ck", 1, ranks, 1, "{\"model\": {\"type\": \"mlp\"}}");
    snprintf(ck, sizeof(ck), "%s/job-ck", root);
    a.checkpoint_dir = ck;
    kiln_err_t err;
    cr_assert_eq(agent_launcher_start(l, &a, &err), 0, "%s", err.message);
    cr_assert(lf_wait_exits(1, 10000));
    cr_assert(agent_launcher_wait_idle(l, 5000));
    char want[600];
    snprintf(want, sizeof(want), "ckpt %s", ck);
    const ev_line_t *e = lf_find_line(0, "ckpt ");
    cr_assert_not_null(e);
    cr_assert_str_eq(e->text, want);
    cr_assert_not_null(lf_find_line(0, "dir-ok"), "the shared directory is created for the job");
    struct stat st;
    cr_assert_eq(stat(ck, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0700, "mode %o", st.st_mode & 0777);
    agent_launcher_destroy(l);
}

Test(launch, fake_rank_gets_its_environment_and_everything_it_writes)
{
    /* Both ranks fail on their own; the launcher would stop the second when the first fails,
     * so they ignore SIGTERM here (a_failing_rank_stops_its_siblings tests that). */
    char *bin = lf_script("rank.sh",
        "trap '' TERM\n"
        "echo \"env rank=$KILN_RANK world=$KILN_WORLD_SIZE local=$KILN_LOCAL_RANK/$KILN_LOCAL_WORLD_SIZE "
        "node=$KILN_NODE_RANK/$KILN_NODES master=$KILN_MASTER_ADDR:$KILN_MASTER_PORT threads=$KILN_THREADS "
        "omp=$OMP_NUM_THREADS job=$KILN_JOB_ID attempt=$KILN_ATTEMPT fd=$KILN_METRICS_FD dev=${KILN_DEVICE_ID:-none} cpus=${KILN_CPUS:-any} marks=$KILN_STEP_MARKS\"\n"
        "echo \"paths $KILN_SPEC $KILN_CHECKPOINT_DIR $KILN_OUTPUT_DIR\"\n"
        "test -d \"$KILN_CHECKPOINT_DIR\" && test -d \"$KILN_OUTPUT_DIR\" && echo dirs-ok\n"
        "grep -q '\"model\"' \"$KILN_SPEC\" && echo spec-ok\n"
        "echo '{\"step\": 3, \"time\": 1795000000.5, \"metrics\": {\"train_loss\": 2.5}}' >&$KILN_METRICS_FD\n"
        "echo 'this is not json' >&$KILN_METRICS_FD\n"
        "sleep 0.2\n"
        "printf '\\036kiln-step 7\\n'\n" /* a step mark: the step of the line after it */
        "echo \"val loss 1.75\"\n"
        "echo 'first problem' >&2\n"
        "echo \"fatal: rank $KILN_RANK gave up\" >&2\n"
        "printf 'no newline at the end'\n"
        "exit 3\n");
    agent_launcher_t *l = lf_launcher(bin, 4, false, 8, NULL, 0);
    int32_t ranks[] = {4, 5};
    /* the definitions travel typed in the assignment; the spec is only written for kiln-train
     * (this one names a definition the launcher must not pick up) */
    const char *spec = "{\"model\": {\"type\": \"mlp\"}, \"metric_definitions\": [{\"name\": \"nope\", \"regex\": \"(.*)\"}]}";
    Kiln__Assignment a = lf_assignment("job-1", 2, ranks, 2, spec);
    Kiln__MetricDefinition def = KILN__METRIC_DEFINITION__INIT, *defs[] = {&def};
    def.name = (char *)"val_loss";
    def.regex = (char *)"val loss ([0-9.]+)";
    a.metric_definitions = defs;
    a.n_metric_definitions = 1;
    kiln_err_t err;
    cr_assert_eq(agent_launcher_start(l, &a, &err), 0, "%s", err.message);
    cr_assert_eq(R.started, 1, "on_started(ok) before start returns");
    agent_rank_info_t info[4];
    cr_assert_eq(agent_launcher_list(l, info, 4), 2);
    cr_assert_eq(agent_launcher_start(l, &a, &err), KILN_EEXIST, "the same assignment twice is ignored");
    cr_assert(lf_wait_exits(2, 10000));
    cr_assert(agent_launcher_wait_idle(l, 5000));
    cr_assert_eq(agent_launcher_list(l, info, 4), 0);

    for (int rank = 4; rank <= 5; rank++) {
        char want[1024];
        snprintf(want, sizeof(want), "env rank=%d world=8 local=%d/2 node=1/2 master=10.0.0.7:29500 threads=2 "
                 "omp=2 job=job-1 attempt=2 fd=3 dev=none cpus=any marks=1", rank, rank - 4);
        const ev_line_t *e = lf_find_line(rank, "env ");
        cr_assert_not_null(e);
        cr_assert_str_eq(e->text, want);
        cr_assert_eq(e->stream, AGENT_STREAM_STDOUT);
        snprintf(want, sizeof(want), "paths %s/jobs/job-1/spec.json %s/jobs/job-1/checkpoints %s/jobs/job-1/output", dir, dir, dir);
        cr_assert_str_eq(lf_find_line(rank, "paths")->text, want);
        cr_assert_not_null(lf_find_line(rank, "dirs-ok"));
        cr_assert_not_null(lf_find_line(rank, "spec-ok"));
        cr_assert_not_null(lf_find_line(rank, "no newline at the end"), "the partial last line is kept");
        const ev_line_t *fe = lf_find_line(rank, "first problem");
        cr_assert_not_null(fe);
        cr_assert_eq(fe->stream, AGENT_STREAM_STDERR);
        int got_loss = 0, got_val = 0;
        for (size_t i = 0; i < R.points.n; i++) {
            const agent_point_t *p = &R.points.v[i];
            if (p->rank != rank)
                continue;
            if (!strcmp(p->name, "train_loss") && p->value == 2.5 && p->step == 3 && p->time_us == 1795000000500000LL)
                got_loss++;
            if (!strcmp(p->name, "val_loss") && p->value == 1.75 && p->step == 7)
                got_val++;
        }
        cr_assert_eq(got_loss, 1, "the metric record of rank %d", rank);
        cr_assert_eq(got_val, 1, "the metric definition on rank %d's log, at the step of the mark before it", rank);
    }
    cr_assert_eq(R.nlines, 18, "9 lines per rank, nothing else: not the step mark (got %d)", R.nlines);
    for (int rank = 4; rank <= 5; rank++) {
        char want[128];
        snprintf(want, sizeof(want), "[kiln-agent] rank %d wrote a metric record kiln cannot read (", rank);
        const ev_line_t *note = lf_find_line(rank, want);
        cr_assert_not_null(note, "the record that is not JSON is said once in the job's log, not only the agent's");
        cr_assert_eq(note->stream, AGENT_STREAM_STDERR);
    }
    for (int i = 0; i < 2; i++) {
        ev_exit_t *e = &R.exits[i];
        cr_assert_eq(e->code, 3);
        cr_assert_eq(e->sig, 0);
        char want[64];
        snprintf(want, sizeof(want), "fatal: rank %d gave up", e->rank);
        cr_assert_str_eq(e->reason, want, "the last stderr line is the reason");
    }
    /* every line and point of both ranks arrived before the last exit */
    cr_assert_eq(R.exits[1].lines_before, 18);
    cr_assert_eq(R.exits[1].points_before, 4);
    char path[512];
    snprintf(path, sizeof(path), "%s/jobs/job-1/spec.json", dir);
    char *text = NULL;
    size_t len = 0;
    cr_assert_eq(kiln_file_read(path, &text, &len, NULL), 0);
    cr_assert_str_eq(text, spec);
    free(text);
    agent_launcher_destroy(l);
}

Test(launch, clean_exit_signal_death_and_exit_without_stderr)
{
    char *bin = lf_script("rank.sh",
        "case $KILN_RANK in\n"
        "0) echo done; exit 0;;\n"
        "1) kill -9 $$;;\n"
        "2) exit 7;;\n"
        "esac\n");
    agent_launcher_t *l = lf_launcher(bin, 3, false, 3, NULL, 0);
    /* one job each: a failing rank stops the other ranks of its own attempt
     * (a_failing_rank_stops_its_siblings), and these must end on their own */
    const char *jobs[] = {"job-2a", "job-2b", "job-2c"};
    int32_t ranks[] = {0, 1, 2};
    for (int i = 0; i < 3; i++) {
        Kiln__Assignment a = lf_assignment(jobs[i], 1, &ranks[i], 1, "{}");
        cr_assert_eq(agent_launcher_start(l, &a, NULL), 0);
    }
    cr_assert(lf_wait_exits(3, 10000));
    for (int i = 0; i < 3; i++) {
        ev_exit_t *e = &R.exits[i];
        if (e->rank == 0) {
            cr_assert_eq(e->code, 0);
            cr_assert_str_eq(e->reason, "");
        } else if (e->rank == 1) {
            cr_assert_eq(e->code, -1);
            cr_assert_eq(e->sig, 9);
            cr_assert_str_eq(e->reason, "Killed");
        } else {
            cr_assert_eq(e->code, 7);
            cr_assert_str_eq(e->reason, "", "no stderr, no reason (kilnd names the code)");
        }
    }
    agent_launcher_destroy(l);
}

/* One rank of an attempt fails: the launcher reports it, then stops the attempt's other ranks
 * here (SIGTERM, and SIGCONT for one that is stopped), removes the dead rank's shm region, and
 * passes the watchdog and NaN metrics on as the contract says (and says in the job's log what gave no
 * point). */
Test(launch, a_failing_rank_stops_its_siblings)
{
    char *bin = lf_script("rank.sh",
        "echo \"wd=${KILN_COMM_WATCHDOG_S:-unset}\"\n"
        "case $KILN_RANK in\n"
        "0) trap 'echo got-term; exit 143' TERM\n"
        "   echo up; : > \"$KILN_OUTPUT_DIR/r0-up\"; kill -STOP $$\n"
        "   while :; do sleep 0.05; done;;\n"
        "1) while [ ! -e \"$KILN_OUTPUT_DIR/r0-up\" ]; do sleep 0.02; done\n"
        "   echo \"pid $$\"; : > /dev/shm/$$:0:0\n"
        "   echo '{\"step\": 4, \"metrics\": {\"train_loss\": 3.5, \"grad_norm\": \"NaN\", \"x\\u001b[2J\": 1}}' >&$KILN_METRICS_FD\n"
        "   sleep 0.3; echo 'kiln-train: it broke' >&2; exit 1;;\n"
        "esac\n");
    agent_launcher_config_t cfg = {.train_bin = bin, .work_dir = dir, .slots = 2, .cores = 2,
                                   .comm_watchdog_s = 2.5, .sibling_grace_ms = 3000};
    agent_launcher_t *l = lf_launcher_cfg(&cfg);
    kiln_err_t err;
    int32_t ranks[] = {0, 1};
    Kiln__Assignment a = lf_assignment("job-sib", 1, ranks, 2, "{}");
    cr_assert_eq(agent_launcher_start(l, &a, &err), 0, "%s", err.message);
    cr_assert(lf_wait_exits(2, 30000));
    /* from the failed rank's exit to its sibling's: SIGTERM's, not a SIGKILL's after the grace */
    int64_t took_ms = (R.exits[1].at_us - R.exits[0].at_us) / 1000;
    cr_assert_eq(R.exits[0].rank, 1, "the failed rank is reported first");
    cr_assert_eq(R.exits[0].code, 1);
    cr_assert_str_eq(R.exits[0].reason, "kiln-train: it broke");
    cr_assert_eq(R.exits[1].rank, 0);
    cr_assert_eq(R.exits[1].code, 143, "the stopped sibling got SIGCONT and acted on SIGTERM");
    cr_assert_lt(took_ms, cfg.sibling_grace_ms, "stopped by SIGTERM, not by SIGKILL after the grace (%lld ms)",
                 (long long)took_ms);
    cr_assert_not_null(lf_find_line(0, "got-term"));
    cr_assert_str_eq(lf_find_line(0, "wd=")->text, "wd=2.5");
    const ev_line_t *p = lf_find_line(1, "pid ");
    cr_assert_not_null(p);
    char shm[64];
    snprintf(shm, sizeof(shm), "/dev/shm/%d:0:0", atoi(p->text + 4));
    cr_assert_neq(access(shm, F_OK), 0, "%s is left behind", shm);
    /* NaN is no point, and the job's log says so once */
    bool loss = false;
    for (size_t i = 0; i < R.points.n; i++) {
        cr_assert_str_neq(R.points.v[i].name, "grad_norm");
        loss |= !strcmp(R.points.v[i].name, "train_loss") && R.points.v[i].value == 3.5;
    }
    cr_assert(loss);
    const ev_line_t *note = lf_find_line(1, "[kiln-agent] rank 1 reported grad_norm = nan at step 4");
    cr_assert_not_null(note);
    cr_assert_eq(note->stream, AGENT_STREAM_STDERR);
    /* a name that would act on a terminal is no metric's either, and that is said too */
    note = lf_find_line(1, "[kiln-agent] rank 1 wrote 1 metric kiln cannot keep (the first: \"x\x1b[2J\")");
    cr_assert_not_null(note);
    cr_assert_eq(note->stream, AGENT_STREAM_STDERR);
    agent_launcher_destroy(l);
}

Test(launch, stop_order_sends_sigterm_and_the_rank_checkpoints)
{
    char *bin = lf_script("rank.sh",
        "trap 'echo got-term; exit 143' TERM\n"
        "echo running\n"
        "while :; do sleep 0.05; done\n");
    agent_launcher_t *l = lf_launcher(bin, 1, false, 1, NULL, 0);
    int32_t ranks[] = {0};
    Kiln__Assignment a = lf_assignment("job-3", 1, ranks, 1, "{}");
    cr_assert_eq(agent_launcher_start(l, &a, NULL), 0);
    /* its trap is set once it says so: a SIGTERM before that would kill the shell outright */
    cr_assert(lf_wait_line(NULL, 0, "running", 30000), "the rank never said it was running");
    cr_assert_eq(agent_launcher_stop(l, "job-other", 0, 1000), 0, "other jobs are not touched");
    cr_assert_eq(agent_launcher_stop(l, "job-3", 2, 1000), 0, "other attempts are not touched");
    cr_assert_eq(agent_launcher_stop(l, "job-3", 1, 5000), 1);
    cr_assert(lf_wait_exits(1, 4000), "SIGTERM ends it well before the grace");
    cr_assert_eq(R.exits[0].code, 143);
    cr_assert_not_null(lf_find_line(0, "got-term"));
    cr_assert_not_null(lf_find_line(0, "running"));
    agent_launcher_destroy(l);
}

Test(launch, stop_order_sigkills_a_rank_that_ignores_sigterm_after_the_grace)
{
    char *bin = lf_script("rank.sh",
        "trap '' TERM\n"
        "echo stubborn\n"
        "while :; do sleep 0.05; done\n");
    agent_launcher_t *l = lf_launcher(bin, 1, false, 1, NULL, 0);
    int32_t ranks[] = {0};
    Kiln__Assignment a = lf_assignment("job-4", 1, ranks, 1, "{}");
    cr_assert_eq(agent_launcher_start(l, &a, NULL), 0);
    /* it ignores SIGTERM once it says so */
    cr_assert(lf_wait_line(NULL, 0, "stubborn", 30000), "the rank never said it ignores SIGTERM");
    int64_t t0 = kiln_mono_us();
    cr_assert_eq(agent_launcher_stop(l, "job-4", 0, 400), 1);
    cr_assert(lf_wait_exits(1, 5000));
    int64_t took_ms = (kiln_mono_us() - t0) / 1000;
    cr_assert_eq(R.exits[0].sig, 9);
    cr_assert_eq(R.exits[0].code, -1);
    cr_assert_geq(took_ms, 380, "SIGKILL only after the grace (%lld ms)", (long long)took_ms);
    cr_assert_lt(took_ms, 3000);
    agent_launcher_destroy(l);
}

Test(launch, a_program_that_cannot_start_fails_the_assignment)
{
    char bin[300];
    snprintf(bin, sizeof(bin), "%s/missing-train", dir);
    agent_launcher_t *l = lf_launcher(bin, 2, false, 2, NULL, 0);
    int32_t ranks[] = {0, 1};
    Kiln__Assignment a = lf_assignment("job-5", 1, ranks, 2, "{}");
    kiln_err_t err;
    cr_assert_eq(agent_launcher_start(l, &a, &err), KILN_ENOTFOUND);
    cr_assert_eq(R.start_failed, 1);
    cr_assert(!R.start_host_fault, "a program that is not there is not the host's fault");
    cr_assert_eq(R.started, 0);
    cr_assert(strstr(R.start_reason, "could not start"), "%s", R.start_reason);
    cr_assert(strstr(R.start_reason, "No such file"), "%s", R.start_reason);
    agent_rank_info_t info[4];
    cr_assert_eq(agent_launcher_list(l, info, 4), 0);
    /* bad job ids never become paths */
    Kiln__Assignment b = lf_assignment("../etc", 1, ranks, 1, "{}");
    cr_assert_eq(agent_launcher_start(l, &b, &err), KILN_EINVAL);
    agent_launcher_destroy(l);
}

Test(launch, gpu_slots_get_distinct_devices_and_assignment_threads_win)
{
    char *bin = lf_script("rank.sh",
        "echo \"dev=$KILN_DEVICE_ID cuda=$CUDA_VISIBLE_DEVICES threads=$KILN_THREADS\"\n");
    agent_launcher_t *l = lf_launcher(bin, 2, true, 16, NULL, 0);
    int32_t ranks[] = {0, 1};
    Kiln__Assignment a = lf_assignment("job-6", 1, ranks, 2, "{}");
    a.threads_per_rank = 3;
    cr_assert_eq(agent_launcher_start(l, &a, NULL), 0);
    cr_assert(lf_wait_exits(2, 10000));
    const ev_line_t *l0 = lf_find_line(0, "dev="), *l1 = lf_find_line(1, "dev=");
    cr_assert_not_null(l0);
    cr_assert_not_null(l1);
    cr_assert_str_eq(l0->text, "dev=0 cuda=0 threads=3");
    cr_assert_str_eq(l1->text, "dev=1 cuda=1 threads=3");
    agent_launcher_destroy(l);
}

/* The first n CPUs this process may run on, as a list ("0,1"); false when it has fewer. */
static bool first_cpus(int n, char *list, size_t len)
{
    cpu_set_t mine;
    cr_assert_eq(sched_getaffinity(0, sizeof(mine), &mine), 0);
    size_t off = 0;
    list[0] = '\0';
    for (int c = 0; c < CPU_SETSIZE && n > 0; c++)
        if (CPU_ISSET(c, &mine)) {
            off += (size_t)snprintf(list + off, len - off, "%s%d", off ? "," : "", c);
            n--;
        }
    return n == 0;
}

Test(launch, cpu_slots_bind_each_rank_to_its_own_share_and_free_it_when_it_ends)
{
    char list[32], one[16];
    if (!first_cpus(2, list, sizeof(list)))
        cr_skip_test("needs 2 CPUs");
    first_cpus(1, one, sizeof(one));
    char *bin = lf_script("rank.sh", "echo \"cpus=$KILN_CPUS threads=$KILN_THREADS\"\n");
    agent_launcher_config_t cfg = {.train_bin = bin, .work_dir = dir, .slots = 2, .cpus = list};
    agent_launcher_t *l = lf_launcher_cfg(&cfg);
    int32_t ranks[] = {0, 1};
    Kiln__Assignment a = lf_assignment("job-c1", 1, ranks, 2, "{}");
    cr_assert_eq(agent_launcher_start(l, &a, NULL), 0);
    cr_assert(lf_wait_exits(2, 10000));
    const ev_line_t *l0 = lf_find_line(0, "cpus="), *l1 = lf_find_line(1, "cpus=");
    cr_assert_not_null(l0);
    cr_assert_not_null(l1);
    char want0[64], want1[64];
    snprintf(want0, sizeof(want0), "cpus=%s threads=1", one);
    snprintf(want1, sizeof(want1), "cpus=%s threads=1", strchr(list, ',') + 1);
    cr_assert_str_eq(l0->text, want0, "one CPU a slot, one thread a rank");
    cr_assert_str_eq(l1->text, want1, "the other slot's CPU");
    /* the ranks have ended: their slots, and the CPUs with them, are free again */
    int32_t next[] = {2};
    Kiln__Assignment b = lf_assignment("job-c2", 1, next, 1, "{}");
    cr_assert_eq(agent_launcher_start(l, &b, NULL), 0);
    cr_assert(lf_wait_exits(3, 10000));
    const ev_line_t *l2 = lf_find_line(2, "cpus=");
    cr_assert_not_null(l2);
    cr_assert_str_eq(l2->text, want0);
    agent_launcher_destroy(l);
}

Test(launch, cpus_the_agent_may_not_run_on_or_too_few_for_its_slots_are_refused)
{
    char one[16];
    first_cpus(1, one, sizeof(one));
    agent_launch_cbs_t cbs = {0};
    agent_launcher_t *l = NULL;
    kiln_err_t err;
    agent_launcher_config_t cfg = {.train_bin = "/bin/true", .work_dir = dir, .slots = 1, .cpus = "1000"};
    cr_assert_eq(agent_launcher_create(&cfg, &cbs, &l, &err), KILN_EINVAL);
    cr_assert_null(l);
    cr_assert_str_eq(err.field, "cpus");
    cr_assert(strstr(err.message, "--cpus names CPU(s) 1000"), "%s", err.message);
    cfg.cpus = one;
    cfg.slots = 2;
    cr_assert_eq(agent_launcher_create(&cfg, &cbs, &l, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "1 CPU(s) for 2 slots"), "%s", err.message);
    cfg.cpus = "first";
    cr_assert_eq(agent_launcher_create(&cfg, &cbs, &l, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "\"0-3,8\""), "%s", err.message);
}

Test(launch, many_lines_arrive_complete_and_in_order)
{
    char *bin = lf_script("rank.sh", "seq 1 30000\nhead -c 40000 /dev/zero | tr '\\0' 'x'; echo\n");
    agent_launcher_t *l = lf_launcher(bin, 1, false, 1, NULL, 0);
    int32_t ranks[] = {0};
    Kiln__Assignment a = lf_assignment("job-7", 1, ranks, 1, "{}");
    cr_assert_eq(agent_launcher_start(l, &a, NULL), 0);
    cr_assert(lf_wait_exits(1, 20000));
    cr_assert_eq(R.nlines, 30001);
    for (int i = 0; i < 30000; i++) {
        char want[16];
        snprintf(want, sizeof(want), "%d", i + 1);
        cr_assert_str_eq(R.lines[i].text, want);
    }
    cr_assert_eq(strlen(R.lines[30000].text), 255, "the long line (cut by the test's own copy)");
    cr_assert_eq(R.long_len, 16384 + strlen(AGENT_TRUNCATED_MARK), "cut at 16 KiB and marked");
    cr_assert(R.long_marked);
    cr_assert_eq(R.exits[0].lines_before, 30001);
    agent_launcher_destroy(l);
}

/* The rank's state letter from /proc ('Z' zombie), or 0 when the process is gone. */
static char proc_state(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *paren = strrchr(buf, ')');
    return paren && paren[1] == ' ' ? paren[2] : '?';
}

/* How many processes run as uid (the rank's box: its init and its ranks). */
static int procs_of_uid(uid_t uid)
{
    int n = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[300];
        struct stat st;
        snprintf(path, sizeof(path), "/proc/%s", e->d_name);
        if (e->d_name[0] >= '1' && e->d_name[0] <= '9' && stat(path, &st) == 0 && st.st_uid == uid)
            n++;
    }
    if (d)
        closedir(d);
    return n;
}

/* Within the sandbox (the default) a rank and its box's init change uid, which clears the
 * parent-death signal: the launcher sets it again, or the rank would train on beside the job's
 * next attempt. The rank is one process (exec), so no short-lived fork of it is taken for it. */
Test(launch, ranks_die_with_the_agent)
{
    char *bin = lf_script("rank.sh", "echo $$ > \"$KILN_OUTPUT_DIR/pid.tmp\"; mv \"$KILN_OUTPUT_DIR/pid.tmp\" \"$KILN_OUTPUT_DIR/pid\"\n"
                                        "exec sleep 600\n");
    pid_t agent = fork();
    cr_assert_geq(agent, 0);
    if (agent == 0) {
        /* a stand-in agent process: starts the rank, then dies without cleaning up */
        agent_launcher_config_t cfg = {.train_bin = bin, .work_dir = dir, .slots = 1, .cores = 1};
        agent_launch_cbs_t cbs = {0};
        agent_launcher_t *l = NULL;
        int32_t ranks[] = {0};
        Kiln__Assignment a = lf_assignment("job-8", 1, ranks, 1, "{}");
        if (agent_launcher_create(&cfg, &cbs, &l, NULL) != 0 || agent_launcher_start(l, &a, NULL) != 0)
            _exit(1);
        sleep(30);
        _exit(0);
    }
    pid_t rank = 0;
    for (int i = 0; i < 200 && rank <= 0; i++) {
        /* the rank's pid as this process sees it ($$ is its pid in its sandbox) */
        rank = lf_find_process("job-8", "sleep");
        if (rank <= 0)
            usleep(50000);
    }
    cr_assert_gt(rank, 0, "the rank started");
    char path[64];
    struct stat st;
    snprintf(path, sizeof(path), "/proc/%d", (int)rank);
    cr_assert_eq(stat(path, &st), 0);
    uid_t box_uid = st.st_uid;
    cr_assert(proc_state(rank) != 0 && proc_state(rank) != 'Z', "the rank runs");
    kill(agent, SIGKILL);
    waitpid(agent, NULL, 0);
    char state = 'R';
    int left = 0;
    for (int i = 0; i < 250; i++) {
        state = proc_state(rank);
        left = box_uid != getuid() ? procs_of_uid(box_uid) : 0;
        if ((state == 0 || state == 'Z') && left == 0)
            break;
        usleep(20000);
    }
    if (state != 0 && state != 'Z')
        kill(rank, SIGKILL);
    cr_assert(state == 0 || state == 'Z', "the rank outlived its agent (state %c)", state);
    cr_assert_eq(left, 0, "%d process(es) of the rank's box (uid %u) outlived the agent", left, (unsigned)box_uid);
}

Test(launch, an_exit_is_reported_even_when_a_stray_process_keeps_the_pipes_open)
{
    /* the stray holds the pipes for 60 s: an exit reported well within that did not wait for them */
    char *bin = lf_script("rank.sh", "setsid sleep 60 &\necho $! > \"$KILN_OUTPUT_DIR/stray\"\necho bye\nexit 4\n");
    agent_launcher_t *l = lf_launcher(bin, 1, false, 1, NULL, 0);
    int32_t ranks[] = {0};
    Kiln__Assignment a = lf_assignment("job-9", 1, ranks, 1, "{}");
    int64_t t0 = kiln_mono_us();
    cr_assert_eq(agent_launcher_start(l, &a, NULL), 0);
    bool got = lf_wait_exits(1, 30000);
    int64_t took_ms = (kiln_mono_us() - t0) / 1000;
    char path[300];
    snprintf(path, sizeof(path), "%s/jobs/job-9/output/stray", dir);
    FILE *f = fopen(path, "r");
    int stray = 0;
    if (f) {
        if (fscanf(f, "%d", &stray) != 1)
            stray = 0;
        fclose(f);
    }
    if (stray > 0)
        kill(stray, SIGKILL);
    cr_assert(got, "the exit came although the pipes stayed open");
    cr_assert_eq(R.exits[0].code, 4);
    cr_assert_not_null(lf_find_line(0, "bye"));
    cr_assert_lt(took_ms, 30000, "the exit waited for the stray's pipes (%lld ms)", (long long)took_ms);
    agent_launcher_destroy(l);
}
