/* test_rank.c - the rank contract (rank/): the environment from the launcher's struct to an envp,
 * into a process environment and back; bad values refused naming the variable; secrets and the
 * launcher's own contract variables never passed on; data roots; CPU lists read, written, cut
 * into slot shares and bound to; metric records from the writer
 * through a pipe to the parser (exact doubles, NaN and infinities, escaped and long names), the
 * Python SDK's writer (kiln.log_metrics) read by the same parser; exit codes and their meaning;
 * shared-memory cleanup of exactly the given processes; a script rank's torchrun and SageMaker
 * variables and SageMaker's arguments. */
#include "rank/rank.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- the environment -------------------------------------------------------------------- */

static const char *envp_get(char *const *envp, const char *name)
{
    size_t n = strlen(name);
    for (char *const *p = envp; p && *p; p++)
        if (!strncmp(*p, name, n) && (*p)[n] == '=')
            return *p + n + 1;
    return NULL;
}

static int envp_count(char *const *envp, const char *name)
{
    size_t n = strlen(name);
    int c = 0;
    for (char *const *p = envp; p && *p; p++)
        c += !strncmp(*p, name, n) && (*p)[n] == '=';
    return c;
}

static void full_env(rank_env_t *e)
{
    rank_env_init(e);
    e->spec = "/w/jobs/j1/spec.json";
    e->job_id = "0b6c2d1e-1111-2222-3333-444455556666";
    e->attempt = 3;
    e->rank = 5;
    e->world_size = 8;
    e->local_rank = 1;
    e->local_world_size = 2;
    e->node_rank = 2;
    e->nodes = 4;
    e->master_addr = "10.1.2.3";
    e->master_port = 29555;
    e->checkpoint_dir = "/mnt/ckpt/j1";
    e->output_dir = "/w/jobs/j1/output";
    e->resume_from = "/mnt/ckpt/other";
    e->metrics_fd = 3;
    e->threads = 6;
    e->device_id = 1;
    e->data_roots = "/srv/data,/mnt/ckpt";
    e->comm_watchdog_s = 2.5;
    e->cpus = "2-3,6";
    e->project = "nlp-team.2";
    e->step_marks = true;
    e->fresh_start = true;
    e->pause_at_step = (int64_t)1 << 35; /* past what an int holds */
}

static void assert_same_env(const rank_env_t *a, const rank_env_t *b)
{
    cr_assert_str_eq(a->spec, b->spec);
    cr_assert_str_eq(a->job_id, b->job_id);
    cr_assert_eq(a->attempt, b->attempt);
    cr_assert_eq(a->rank, b->rank);
    cr_assert_eq(a->world_size, b->world_size);
    cr_assert_eq(a->local_rank, b->local_rank);
    cr_assert_eq(a->local_world_size, b->local_world_size);
    cr_assert_eq(a->node_rank, b->node_rank);
    cr_assert_eq(a->nodes, b->nodes);
    cr_assert_str_eq(a->master_addr, b->master_addr);
    cr_assert_eq(a->master_port, b->master_port);
    cr_assert_str_eq(a->checkpoint_dir, b->checkpoint_dir);
    cr_assert_str_eq(a->output_dir, b->output_dir);
    cr_assert_str_eq(a->resume_from, b->resume_from);
    cr_assert_eq(a->metrics_fd, b->metrics_fd);
    cr_assert_eq(a->threads, b->threads);
    cr_assert_eq(a->device_id, b->device_id);
    cr_assert_str_eq(a->data_roots, b->data_roots);
    cr_assert_eq(a->comm_watchdog_s, b->comm_watchdog_s);
    cr_assert_str_eq(a->cpus, b->cpus);
    cr_assert_str_eq(a->project, b->project);
    cr_assert_eq(a->step_marks, b->step_marks);
    cr_assert_eq(a->fresh_start, b->fresh_start);
    cr_assert_eq(a->pause_at_step, b->pause_at_step);
}

Test(env, round_trip_through_envp_and_the_process_environment)
{
    rank_env_t e, back;
    full_env(&e);
    char *base[] = {"PATH=/usr/bin:/bin", "HOME=/root", "KILN_RANK=99", "KILN_RESUME_FROM=/elsewhere",
                    "KILN_DATA_ROOTS=/", "OMP_NUM_THREADS=64", "KILN_JOIN_TOKEN=kiln_join_x",
                    "KILN_JOIN_TOKEN_FILE=/etc/kiln/join.token", "KILN_TLS_KEY=/etc/kiln/agent.key",
                    "my_api_token=abc", "DB_PASSWORD=pw", "KILN_DP_BUCKET_MB=4", "KILN_CPUS=0-63",
                    "KILN_PROJECT=other", "KILN_STEP_MARKS=0", "KILN_FRESH_START=0", "KILN_PAUSE_AT_STEP=7", NULL};
    char **envp = NULL;
    kiln_err_t err;
    cr_assert_eq(rank_env_envp(&e, base, &envp, &err), 0, "%s", err.message);
    /* the launcher's own values of contract variables and its secrets never reach a rank */
    cr_assert_str_eq(envp_get(envp, "PATH"), "/usr/bin:/bin");
    cr_assert_str_eq(envp_get(envp, "KILN_DP_BUCKET_MB"), "4", "tuning knobs pass through");
    for (const char *const *s = (const char *const[]){"KILN_JOIN_TOKEN", "KILN_JOIN_TOKEN_FILE", "KILN_TLS_KEY",
                                                      "my_api_token", "DB_PASSWORD", NULL};
         *s; s++)
        cr_assert_null(envp_get(envp, *s), "%s was passed on", *s);
    cr_assert_eq(envp_count(envp, RANK_ENV_RANK), 1);
    cr_assert_str_eq(envp_get(envp, RANK_ENV_RANK), "5");
    cr_assert_eq(envp_count(envp, RANK_ENV_RESUME_FROM), 1);
    cr_assert_str_eq(envp_get(envp, RANK_ENV_DATA_ROOTS), "/srv/data,/mnt/ckpt");
    cr_assert_str_eq(envp_get(envp, RANK_ENV_OMP_THREADS), "6", "OpenMP gets the rank's threads");
    cr_assert_str_eq(envp_get(envp, RANK_ENV_CUDA_DEVICES), "1");
    cr_assert_eq(envp_count(envp, RANK_ENV_OMP_THREADS), 1);
    cr_assert_eq(envp_count(envp, RANK_ENV_CPUS), 1);
    cr_assert_str_eq(envp_get(envp, RANK_ENV_CPUS), "2-3,6", "the rank's share, not the launcher's own value");
    cr_assert_eq(envp_count(envp, RANK_ENV_PROJECT), 1);
    cr_assert_str_eq(envp_get(envp, RANK_ENV_PROJECT), "nlp-team.2", "the job's project, not the launcher's");
    cr_assert_eq(envp_count(envp, RANK_ENV_STEP_MARKS), 1);
    cr_assert_str_eq(envp_get(envp, RANK_ENV_STEP_MARKS), "1");
    cr_assert_eq(envp_count(envp, RANK_ENV_FRESH_START), 1);
    cr_assert_str_eq(envp_get(envp, RANK_ENV_FRESH_START), "1", "the assignment's, not the launcher's own value");
    cr_assert_eq(envp_count(envp, RANK_ENV_PAUSE_AT_STEP), 1);
    cr_assert_str_eq(envp_get(envp, RANK_ENV_PAUSE_AT_STEP), "34359738368", "the spec's, not the launcher's own value");

    /* envp -> rank_env_t directly */
    cr_assert_eq(rank_env_parse(envp, &back, &err), 0, "%s", err.message);
    assert_same_env(&e, &back);

    /* envp -> the process environment (what execve gives a rank) -> rank_env_t */
    cr_assert_eq(clearenv(), 0);
    for (char **p = envp; *p; p++)
        cr_assert_eq(putenv(*p), 0);
    cr_assert_eq(rank_env_parse(NULL, &back, &err), 0, "%s", err.message);
    assert_same_env(&e, &back);
    cr_assert_eq(clearenv(), 0); /* before envp's strings go */
    rank_envp_free(envp);
}

Test(env, unset_means_a_rank_started_by_hand)
{
    rank_env_t e, d;
    kiln_err_t err;
    char *none[] = {"PATH=/bin", "KILN_RANK=", NULL}; /* empty counts as unset */
    cr_assert_eq(rank_env_parse(none, &e, &err), 0, "%s", err.message);
    rank_env_init(&d);
    cr_assert_eq(e.rank, 0);
    cr_assert_eq(e.world_size, 1);
    cr_assert_eq(e.attempt, 1);
    cr_assert_eq(e.metrics_fd, -1);
    cr_assert_eq(e.device_id, -1);
    cr_assert_eq(e.threads, 0);
    cr_assert_eq(e.comm_watchdog_s, 0);
    cr_assert_null(e.spec);
    cr_assert_null(e.data_roots, "unset: no confinement");
    cr_assert_null(e.cpus, "unset: not bound");
    cr_assert_not(e.step_marks, "unset: nobody reads step marks");
    cr_assert_not(e.fresh_start, "unset: the rank resumes from its newest checkpoint");
    cr_assert_eq(e.pause_at_step, 0, "unset: the rank trains to its end");
    /* what is unset stays unset on the way out */
    char **envp = NULL;
    cr_assert_eq(rank_env_envp(&d, NULL, &envp, &err), 0, "%s", err.message);
    for (const char *const *s = (const char *const[]){RANK_ENV_SPEC, RANK_ENV_METRICS_FD, RANK_ENV_THREADS,
                                                      RANK_ENV_DEVICE_ID, RANK_ENV_CUDA_DEVICES, RANK_ENV_DATA_ROOTS,
                                                      RANK_ENV_COMM_WATCHDOG_S, RANK_ENV_RESUME_FROM, RANK_ENV_CPUS,
                                                      RANK_ENV_PROJECT, RANK_ENV_STEP_MARKS, RANK_ENV_FRESH_START,
                                                      RANK_ENV_PAUSE_AT_STEP, NULL};
         *s; s++)
        cr_assert_null(envp_get(envp, *s), "%s is set", *s);
    rank_envp_free(envp);
    /* KILN_DATA_ROOTS set and empty: no directory may be read */
    char *empty_roots[] = {"KILN_DATA_ROOTS=", NULL};
    cr_assert_eq(rank_env_parse(empty_roots, &e, &err), 0);
    cr_assert_not_null(e.data_roots);
    cr_assert_str_eq(e.data_roots, "");
}

typedef struct bad_case {
    const char *entries[4];
    const char *variable;
} bad_case_t;

Test(env, bad_values_are_refused_naming_the_variable)
{
    static const bad_case_t cases[] = {
        {{"KILN_RANK=-1"}, "KILN_RANK"},
        {{"KILN_RANK=1x"}, "KILN_RANK"},
        {{"KILN_RANK=2", "KILN_WORLD_SIZE=2", "KILN_MASTER_PORT=1"}, "KILN_RANK"},
        {{"KILN_WORLD_SIZE=0"}, "KILN_WORLD_SIZE"},
        {{"KILN_WORLD_SIZE=99999999999"}, "KILN_WORLD_SIZE"},
        {{"KILN_ATTEMPT=0"}, "KILN_ATTEMPT"},
        {{"KILN_MASTER_PORT=70000"}, "KILN_MASTER_PORT"},
        {{"KILN_MASTER_PORT=http"}, "KILN_MASTER_PORT"},
        {{"KILN_METRICS_FD=three"}, "KILN_METRICS_FD"},
        {{"KILN_THREADS=0"}, "KILN_THREADS"},
        {{"KILN_THREADS=100000"}, "KILN_THREADS"},
        {{"KILN_DEVICE_ID=-2"}, "KILN_DEVICE_ID"},
        {{"KILN_LOCAL_RANK=1"}, "KILN_LOCAL_RANK"},
        {{"KILN_LOCAL_WORLD_SIZE=3", "KILN_WORLD_SIZE=2"}, "KILN_LOCAL_WORLD_SIZE"},
        {{"KILN_NODE_RANK=2", "KILN_NODES=2", "KILN_WORLD_SIZE=4"}, "KILN_NODE_RANK"},
        {{"KILN_NODES=5", "KILN_WORLD_SIZE=4"}, "KILN_NODES"},
        {{"KILN_COMM_WATCHDOG_S=0"}, "KILN_COMM_WATCHDOG_S"},
        {{"KILN_COMM_WATCHDOG_S=-3"}, "KILN_COMM_WATCHDOG_S"},
        {{"KILN_COMM_WATCHDOG_S=soon"}, "KILN_COMM_WATCHDOG_S"},
        {{"KILN_COMM_WATCHDOG_S=1e9"}, "KILN_COMM_WATCHDOG_S"},
        {{"KILN_COMM_WATCHDOG_S=nan"}, "KILN_COMM_WATCHDOG_S"},
        {{"KILN_CPUS=all"}, "KILN_CPUS"},
        {{"KILN_CPUS=3-1"}, "KILN_CPUS"},
        {{"KILN_CPUS=0,"}, "KILN_CPUS"},
        {{"KILN_CPUS=0-"}, "KILN_CPUS"},
        {{"KILN_CPUS=-1"}, "KILN_CPUS"},
        {{"KILN_CPUS=1 2"}, "KILN_CPUS"},
        {{"KILN_CPUS=99999"}, "KILN_CPUS"},
        {{"KILN_CPUS=0-99999999999999999999"}, "KILN_CPUS"},
        {{"KILN_PROJECT=../a"}, "KILN_PROJECT"},
        {{"KILN_PROJECT=a/b"}, "KILN_PROJECT"},
        {{"KILN_PROJECT=.kiln"}, "KILN_PROJECT"},
        {{"KILN_PROJECT=Upper"}, "KILN_PROJECT"},
        {{"KILN_PROJECT=0123456789012345678901234567890123456789012345678901234567890123"}, "KILN_PROJECT"},
        {{"KILN_STEP_MARKS=2"}, "KILN_STEP_MARKS"},
        {{"KILN_STEP_MARKS=yes"}, "KILN_STEP_MARKS"},
        {{"KILN_FRESH_START=2"}, "KILN_FRESH_START"},
        {{"KILN_PAUSE_AT_STEP=0"}, "KILN_PAUSE_AT_STEP"},
        {{"KILN_PAUSE_AT_STEP=-3"}, "KILN_PAUSE_AT_STEP"},
        {{"KILN_PAUSE_AT_STEP=10x"}, "KILN_PAUSE_AT_STEP"},
        {{"KILN_PAUSE_AT_STEP=1099511627777"}, "KILN_PAUSE_AT_STEP"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *envp[5] = {0};
        for (int k = 0; k < 4 && cases[i].entries[k]; k++)
            envp[k] = (char *)cases[i].entries[k];
        rank_env_t e;
        kiln_err_t err;
        kiln_err_clear(&err);
        cr_assert_eq(rank_env_parse(envp, &e, &err), KILN_EINVAL, "case %zu (%s) accepted", i, envp[0]);
        cr_assert_str_eq(err.field, cases[i].variable, "case %zu: field %s, message %s", i, err.field, err.message);
        cr_assert(strstr(err.message, cases[i].variable), "case %zu: the message does not name %s: %s", i,
                  cases[i].variable, err.message);
    }
    /* The launcher's side refuses what a rank would refuse, and builds nothing. */
    rank_env_t e;
    full_env(&e);
    e.rank = e.world_size;
    char **envp = (char **)1;
    kiln_err_t err;
    cr_assert_eq(rank_env_envp(&e, NULL, &envp, &err), KILN_EINVAL);
    cr_assert_null(envp);
    cr_assert_str_eq(err.field, RANK_ENV_RANK);
    full_env(&e);
    e.comm_watchdog_s = -1;
    cr_assert_eq(rank_env_envp(&e, NULL, &envp, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, RANK_ENV_COMM_WATCHDOG_S);
}

Test(cpus, lists_read_written_and_cut_into_slot_shares)
{
    cpu_set_t s, t;
    kiln_err_t err;
    char buf[64];
    cr_assert_eq(rank_cpus_parse("0-3,8,10-11", "cpus", &s, &err), 0, "%s", err.message);
    cr_assert_eq(CPU_COUNT(&s), 7);
    cr_assert(CPU_ISSET(8, &s) && !CPU_ISSET(9, &s) && CPU_ISSET(11, &s));
    cr_assert_str_eq(rank_cpus_format(&s, buf, sizeof(buf)), "0-3,8,10-11");
    cr_assert_eq(rank_cpus_parse("5,3,4,4", "cpus", &t, &err), 0, "%s", err.message);
    cr_assert_str_eq(rank_cpus_format(&t, buf, sizeof(buf)), "3-5", "order and repeats do not matter");
    cr_assert_eq(rank_cpus_parse("", "cpus", &t, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "cpus");
    cr_assert(strstr(err.message, "0-3,8"), "the message shows a list: %s", err.message);
    cr_assert_eq(rank_cpus_parse("2-1", "cpus", &t, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "upwards"), "%s", err.message);

    /* 7 CPUs in 3 shares: 3, 2 and 2, consecutive in ascending order, together all of them */
    const char *want[] = {"0-2", "3,8", "10-11"};
    cpu_set_t all_shares;
    CPU_ZERO(&all_shares);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(rank_cpus_share(&s, 3, i, &t), i == 0 ? 3 : 2);
        cr_assert_str_eq(rank_cpus_format(&t, buf, sizeof(buf)), want[i]);
        cpu_set_t both;
        CPU_AND(&both, &all_shares, &t);
        cr_assert_eq(CPU_COUNT(&both), 0, "shares are disjoint");
        CPU_OR(&all_shares, &all_shares, &t);
    }
    cr_assert(CPU_EQUAL(&all_shares, &s));
    cr_assert_eq(rank_cpus_share(&s, 8, 0, &t), 0, "fewer CPUs than shares: none");
    cr_assert_eq(rank_cpus_share(&s, 3, 3, &t), 0);
    cr_assert_eq(rank_cpus_share(&s, 1, 0, &t), 7);
    /* a buffer too small cuts the list, it never overflows */
    char tiny[4];
    cr_assert_eq(strlen(rank_cpus_format(&s, tiny, sizeof(tiny))), 3);
}

Test(cpus, a_rank_binds_every_thread_to_its_cpus_and_only_to_cpus_it_may_use)
{
    cpu_set_t mine, bound;
    kiln_err_t err;
    cr_assert_eq(sched_getaffinity(0, sizeof(mine), &mine), 0);
    int first = -1;
    for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
        if (CPU_ISSET(c, &mine))
            first = c;
    char list[16], buf[64];
    snprintf(list, sizeof(list), "%d", first);
    cr_assert_eq(rank_cpus_bind(list, &bound, &err), 0, "%s", err.message);
    cr_assert_str_eq(rank_cpus_format(&bound, buf, sizeof(buf)), list, "the kernel's mask, read back");
    cpu_set_t now;
    cr_assert_eq(sched_getaffinity(0, sizeof(now), &now), 0);
    cr_assert(CPU_EQUAL(&now, &bound));
    /* a CPU outside the process's mask is refused, naming it and the ones allowed */
    cr_assert_eq(rank_cpus_bind("1000", &bound, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, RANK_ENV_CPUS);
    char allowed[64];
    snprintf(allowed, sizeof(allowed), "(it may run on %s)", list);
    cr_assert(strstr(err.message, "CPU(s) 1000") && strstr(err.message, allowed), "%s", err.message);
    cr_assert_eq(rank_cpus_bind("x", &bound, &err), KILN_EINVAL);
    cr_assert_eq(sched_setaffinity(0, sizeof(mine), &mine), 0, "the process's mask back");
}

Test(env, secrets)
{
    const char *secret[] = {"KILN_JOIN_TOKEN=x", "KILN_JOIN_TOKEN_FILE=/f", "KILN_TOKEN=t", "KILN_TLS_CA=/ca",
                            "KILN_TLS_CERT", "aws_secret_access_key=s", "PGPASSWORD=p", "MY_PASSWD=p",
                            "AGENT_CREDENTIAL=c", "SSH_PRIVATE_KEY=k", "OPENAI_API_KEY=k", "AWS_ACCESS_KEY_ID=a",
                            "SSH_AUTH_SOCK=/s", "GH_AUTHORIZATION=a", "SESSION_COOKIE=c", "DATABASE_URL=postgres://u:p@h",
                            "STRIPE_KEY=k", "signing_key=k", "SENTRY_DSN=https://k@h"};
    const char *fine[] = {"PATH=/bin", "KILN_RANK=1", "KILN_COMM_WATCHDOG_S=3", "HOME=/root", "TLS_MODE=x",
                          "KEYBOARD=us", "MONKEY_MODE=1", "CUDA_VISIBLE_DEVICES=0", "HTTP_PROXY=http://p:3128"};
    for (size_t i = 0; i < sizeof(secret) / sizeof(secret[0]); i++)
        cr_assert(rank_env_is_secret(secret[i]), "%s", secret[i]);
    for (size_t i = 0; i < sizeof(fine) / sizeof(fine[0]); i++)
        cr_assert(!rank_env_is_secret(fine[i]), "%s", fine[i]);
}

Test(env, data_roots_join_and_confine)
{
    const char *roots[] = {"/srv/a", "/srv/b"};
    char *s = rank_data_roots_join(roots, 2);
    cr_assert_str_eq(s, "/srv/a,/srv/b");
    free(s);
    s = rank_data_roots_join(NULL, 0);
    cr_assert_str_eq(s, "");
    free(s);
    const char *comma[] = {"/srv/a,b"};
    cr_assert_null(rank_data_roots_join(comma, 1));

    char tmpl[] = "/tmp/kiln-rank.XXXXXX";
    cr_assert_not_null(mkdtemp(tmpl));
    char T[PATH_MAX], p[PATH_MAX + 64], q[PATH_MAX + 64];
    cr_assert_not_null(realpath(tmpl, T));
    snprintf(p, sizeof p, "%s/data", T);
    cr_assert_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/outside", T);
    cr_assert_eq(mkdir(p, 0755), 0);
    snprintf(q, sizeof q, "%s/data/out", T);
    cr_assert_eq(symlink(p, q), 0); /* a link out of the root */
    kiln_err_t err;
    unsetenv(RANK_ENV_DATA_ROOTS);
    cr_assert_eq(rank_path_confine("/etc/passwd", "data.train", &err), 0, "unset: a rank run by hand");
    char roots_v[PATH_MAX + 32];
    snprintf(roots_v, sizeof roots_v, "/nonexistent,%s/data", T);
    setenv(RANK_ENV_DATA_ROOTS, roots_v, 1);
    snprintf(p, sizeof p, "%s/data/file.txt", T);
    cr_assert_eq(rank_path_confine(p, "data.train", &err), 0, "%s", err.message);
    cr_assert_eq(rank_path_confine("/etc/passwd", "data.train", &err), KILN_EPERM);
    cr_assert_str_eq(err.field, "data.train");
    snprintf(p, sizeof p, "%s/data/out/secret", T);
    cr_assert_eq(rank_path_confine(p, "model.init_from", &err), KILN_EPERM, "a symlink out of the root");
    setenv(RANK_ENV_DATA_ROOTS, "", 1);
    snprintf(p, sizeof p, "%s/data/file.txt", T);
    cr_assert_eq(rank_path_confine(p, "data.train", &err), KILN_EPERM, "set and empty: nothing may be read");

    /* project areas: data/ck/.kiln/proj-a/j/ckpt.bin is project proj-a's alone; a file a rank has
     * opened is checked where it really is (as when a link changed between check and open) */
    setenv(RANK_ENV_DATA_ROOTS, roots_v, 1);
    snprintf(p, sizeof p, "%s/data/ck/" KILN_AREA_DIR "/proj-a/j", T);
    cr_assert_eq(kiln_mkdirs_mode(p, 0700, &err), 0, "%s", err.message);
    snprintf(p, sizeof p, "%s/data/ck/" KILN_AREA_DIR "/proj-a/j/ckpt.bin", T);
    int fd = open(p, O_CREAT | O_WRONLY, 0600);
    cr_assert_geq(fd, 0);
    close(fd);
    snprintf(q, sizeof q, "%s/data/innocent.txt", T);
    cr_assert_eq(symlink(p, q), 0);
    setenv(RANK_ENV_PROJECT, "proj-b", 1);
    cr_assert_eq(rank_path_confine(p, "data.train", &err), KILN_EPERM);
    cr_assert_eq(rank_path_confine(q, "data.train", &err), KILN_EPERM, "through a link");
    cr_assert_null(strstr(err.message, "proj-a"), "%s", err.message);
    fd = open(p, O_RDONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(rank_file_confine(fd, q, "data.train", &err), KILN_EPERM);
    cr_assert_str_eq(err.field, "data.train");
    cr_assert(strstr(err.message, q) && !strstr(err.message, "proj-a"), "names the path as given: %s", err.message);
    setenv(RANK_ENV_PROJECT, "proj-a", 1);
    cr_assert_eq(rank_path_confine(q, "data.train", &err), 0, "%s", err.message);
    cr_assert_eq(rank_file_confine(fd, q, "data.train", &err), 0, "%s", err.message);
    close(fd);
    unsetenv(RANK_ENV_PROJECT);
    cr_assert_eq(rank_path_confine(q, "data.train", &err), KILN_EPERM, "no project: every area is another's");
    fd = open("/etc/passwd", O_RDONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(rank_file_confine(fd, q, "data.train", &err), KILN_EPERM, "an open file outside the roots");
    cr_assert(strstr(err.message, "not inside an allowed directory") && !strstr(err.message, "/etc/passwd"), "%s",
              err.message);
    unsetenv(RANK_ENV_DATA_ROOTS);
    cr_assert_eq(rank_file_confine(fd, q, "data.train", &err), 0, "unset: a rank run by hand");
    close(fd);
    unsetenv(RANK_ENV_DATA_ROOTS);
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", T);
    cr_assert_eq(system(cmd), 0);
}

/* ---- metric records ----------------------------------------------------------------------- */

/* Reads everything a pipe holds (non-blocking) into buf. */
static size_t drain(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    return n;
}

/* The metrics every writer's round trip carries: exact doubles, NaN and infinities, escaped,
 * non-ASCII and longest names. */
#define RT_N 14
static const char *rt_names[RT_N];
static const double rt_vals[RT_N] = {2.4137912345678901, 3e-4, 1e-300, -2.5e300, 5e-324, -0.0, 42, NAN,
                                     INFINITY, -INFINITY, 0.1, 1.0 / 3.0, 7.25, 1.5};
static char rt_long_name[RANK_METRIC_NAME_MAX + 1];

static void rt_init(void)
{
    static const char *const names[RT_N - 1] = {"train_loss", "lr", "tiny", "huge", "denormal", "neg_zero",
                                                "count", "diverged", "up", "down", "quote\"and\\back",
                                                "space name", "\xce\xbb_loss"};
    memset(rt_long_name, 'x', RANK_METRIC_NAME_MAX);
    rt_long_name[RANK_METRIC_NAME_MAX] = '\0';
    for (size_t i = 0; i < RT_N - 1; i++)
        rt_names[i] = names[i];
    rt_names[RT_N - 1] = rt_long_name;
}

/* Asserts buf[0..len) is one record line of step 120, time t (within tol seconds), holding
 * exactly rt_names = rt_vals. */
static void rt_check(const char *buf, size_t len, double t, double tol)
{
    cr_assert_gt(len, 0);
    cr_assert_eq(buf[len - 1], '\n', "one line");
    cr_assert_null(memchr(buf, '\n', len - 1), "one line only: %s", buf);
    kiln_err_t err;
    rank_metric_record_t rec;
    cr_assert_eq(rank_metric_parse(buf, len, &rec, &err), 0, "%s: %s", err.message, buf);
    cr_assert(rec.has_step && rec.step == 120);
    cr_assert(rec.has_time && fabs(rec.time_s - t) <= tol, "%.6f", rec.time_s);
    cr_assert_eq(rec.n, RT_N, "%zu of %d metrics back: %s", rec.n, RT_N, buf);
    cr_assert_eq(rec.skipped, 0);
    for (size_t i = 0; i < RT_N; i++) {
        const rank_metric_t *m = NULL;
        for (size_t k = 0; k < rec.n && !m; k++)
            if (!strcmp(rec.v[k].name, rt_names[i]))
                m = &rec.v[k];
        cr_assert_not_null(m, "metric \"%s\" lost: %s", rt_names[i], buf);
        if (isnan(rt_vals[i]))
            cr_assert(isnan(m->value), "%s: %g", rt_names[i], m->value);
        else
            cr_assert(memcmp(&m->value, &rt_vals[i], sizeof(double)) == 0 || (rt_vals[i] == 0 && m->value == 0),
                      "%s: wrote %.17g, read %.17g", rt_names[i], rt_vals[i], m->value);
        if (isinf(rt_vals[i]))
            cr_assert_eq(signbit(m->value), signbit(rt_vals[i]), "%s", rt_names[i]);
    }
    rank_metric_record_deinit(&rec);
}

Test(metric, writer_to_parser_round_trip)
{
    rt_init();
    int p[2];
    cr_assert_eq(pipe(p), 0);
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    kiln_err_t err;
    double t = 1795000000.123456;
    cr_assert_eq(rank_metric_write(p[1], 120, t, rt_names, rt_vals, RT_N, &err), 0, "%s", err.message);
    char buf[8192];
    size_t len = drain(p[0], buf, sizeof buf);
    rt_check(buf, len, t, 1e-6);
    close(p[0]);
    close(p[1]);
}

/* The Python SDK's kiln.log_metrics (sdk/python/kiln/metrics.py), the writer a script job's
 * code uses, writes records this parser reads exactly as rank_metric_write's. */
Test(metric, the_python_sdk_writer_to_parser_round_trip)
{
    rt_init();
    if (access("/usr/bin/python3", X_OK) != 0)
        cr_assert_fail("/usr/bin/python3 is missing");
    const char *root = getenv("KILN_ROOT") ? getenv("KILN_ROOT") : ".";
    char cmd[PATH_MAX + 512];
    /* The values as Python spells the same doubles; names read from its argv. */
    snprintf(cmd, sizeof cmd,
             "KILN_METRICS_FD=3 /usr/bin/python3 -c 'import sys; sys.path.insert(0, sys.argv[1] + \"/sdk/python\"); "
             "import kiln; inf = float(\"inf\"); "
             "v = [2.4137912345678901, 3e-4, 1e-300, -2.5e300, 5e-324, -0.0, 42, float(\"nan\"), inf, -inf, 0.1, "
             "1.0 / 3.0, 7.25, 1.5]; "
             "assert kiln.log_metrics(120, **dict(zip(sys.argv[2:], v)))' %s 3>&1 >/dev/null",
             root);
    size_t n = strlen(cmd);
    for (size_t i = 0; i < RT_N; i++) {
        /* each name single-quoted for the shell (none holds a single quote) */
        cr_assert_null(strchr(rt_names[i], '\''));
        n += (size_t)snprintf(cmd + n, sizeof cmd - n, " '%s'", rt_names[i]);
        cr_assert_lt(n, sizeof cmd);
    }
    double before = (double)time(NULL);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    char buf[8192];
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    buf[len] = '\0';
    int rc = pclose(f);
    cr_assert_eq(rc, 0, "python exited %d: %s", rc, buf);
    double after = (double)time(NULL) + 1;
    rt_check(buf, len, (before + after) / 2, (after - before) / 2 + 0.001);
}

Test(metric, the_writer_refuses_bad_names_and_writes_nothing)
{
    char too_long[RANK_METRIC_NAME_MAX + 2];
    memset(too_long, 'y', RANK_METRIC_NAME_MAX + 1);
    too_long[RANK_METRIC_NAME_MAX + 1] = '\0';
    int p[2];
    cr_assert_eq(pipe(p), 0);
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    const char *bad[][2] = {{"ok", too_long}, {"ok", ""}, {"ok", "bad\xff utf8"}, {"ok", "\xc0\x80"},
                            {"ok", "loss\x1b[2J"}, {"ok", "rlo\xe2\x80\xae"}};
    const double vals[] = {1, 2};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kiln_err_t err;
        cr_assert_eq(rank_metric_write(p[1], 1, 0, bad[i], vals, 2, &err), KILN_EINVAL, "case %zu", i);
        cr_assert(strstr(err.message, "metric 1"), "the message names the metric: %s", err.message);
    }
    kiln_err_t serr;
    cr_assert_eq(rank_metric_write(p[1], -1, 0, bad[0], vals, 1, &serr), KILN_EINVAL, "a negative step");
    cr_assert_str_eq(serr.field, "step");
    char buf[64];
    cr_assert_eq(drain(p[0], buf, sizeof buf), 0, "something was written: %s", buf);
    /* a record too long for the agent to take (1 MiB) */
    size_t n = 9000;
    const char **names = calloc(n, sizeof(char *));
    double *v = calloc(n, sizeof(double));
    char (*store)[RANK_METRIC_NAME_MAX + 1] = calloc(n, sizeof(*store));
    for (size_t i = 0; i < n; i++) {
        memset(store[i], 'a', RANK_METRIC_NAME_MAX - 8);
        snprintf(store[i] + RANK_METRIC_NAME_MAX - 8, 9, "%08zu", i);
        names[i] = store[i];
    }
    char *out = NULL;
    size_t len = 0;
    kiln_err_t err;
    cr_assert_eq(rank_metric_format(1, 0, names, v, n, &out, &len, &err), KILN_EINVAL);
    cr_assert_null(out);
    cr_assert_eq(rank_metric_format(1, 0, names, v, 100, &out, &len, &err), 0, "%s", err.message);
    cr_assert_lt(len, RANK_METRIC_RECORD_MAX);
    free(out);
    free(names);
    free(v);
    free(store);
    close(p[0]);
    close(p[1]);
}

/* A time is Unix seconds up to the year 9999: the writer never formats another (1e300 came out
 * cut short at 63 bytes, as JSON that no parser takes), and the parser refuses one (the agent
 * made microseconds of it with llround, whatever the value). Found by fuzz/metric_record. */
Test(metric, a_time_outside_unix_seconds_is_refused_by_writer_and_parser)
{
    const char *names[] = {"loss"};
    const double vals[] = {1.5};
    const double bad[] = {1e300, -1, NAN, INFINITY, -INFINITY, RANK_METRIC_TIME_MAX};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *out = NULL;
        size_t len = 0;
        kiln_err_t err;
        cr_assert_eq(rank_metric_format(1, bad[i], names, vals, 1, &out, &len, &err), KILN_EINVAL, "time %g", bad[i]);
        cr_assert_null(out);
        cr_assert_str_eq(err.field, "time");
    }
    const char *lines[] = {"{\"time\": 1e300, \"metrics\": {}}", "{\"time\": -0.5, \"metrics\": {}}",
                           "{\"time\": 253402300800, \"metrics\": {}}"};
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
        rank_metric_record_t rec;
        kiln_err_t err;
        cr_assert_eq(rank_metric_parse(lines[i], strlen(lines[i]), &rec, &err), KILN_EFORMAT, "%s", lines[i]);
        cr_assert_str_eq(err.field, "time");
        rank_metric_record_deinit(&rec);
    }
    /* the last moment of 9999 and the first of 1970 are times */
    const double good[] = {0, 253402300799.5};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        char *out = NULL;
        size_t len = 0;
        kiln_err_t err;
        cr_assert_eq(rank_metric_format(7, good[i], names, vals, 1, &out, &len, &err), 0, "%s", err.message);
        rank_metric_record_t rec;
        cr_assert_eq(rank_metric_parse(out, len, &rec, &err), 0, "%s: %s", err.message, out);
        cr_assert(rec.has_time && rec.time_s == good[i] && rec.n == 1);
        rank_metric_record_deinit(&rec);
        free(out);
    }
}

Test(metric, the_parser_skips_what_is_not_a_metric_and_refuses_what_is_not_a_record)
{
    char line[600];
    char long_name[RANK_METRIC_NAME_MAX + 2];
    memset(long_name, 'z', RANK_METRIC_NAME_MAX + 1);
    long_name[RANK_METRIC_NAME_MAX + 1] = '\0';
    snprintf(line, sizeof line,
             "{\"step\": 7.0, \"metrics\": {\"a\": 1, \"%s\": 2, \"note\": \"hello\", \"n\": null, \"\": 3, "
             "\"b\": \"-Infinity\", \"c\": [1]}}",
             long_name);
    rank_metric_record_t rec;
    kiln_err_t err;
    cr_assert_eq(rank_metric_parse(line, strlen(line), &rec, &err), 0, "%s", err.message);
    cr_assert(rec.has_step && rec.step == 7, "an integral real step is a step");
    cr_assert(!rec.has_time);
    cr_assert_eq(rec.n, 2, "a and b");
    cr_assert_eq(rec.skipped, 5);
    cr_assert(strlen(rec.skipped_first) == sizeof(rec.skipped_first) - 1 &&
              strspn(rec.skipped_first, "z") == sizeof(rec.skipped_first) - 1,
              "the first left out, cut: %s", rec.skipped_first);
    for (size_t i = 0; i < rec.n; i++)
        if (!strcmp(rec.v[i].name, "b"))
            cr_assert(isinf(rec.v[i].value) && rec.v[i].value < 0);
    rank_metric_record_deinit(&rec);

    const char *bad[] = {"", "not json", "[1]", "{\"step\": 1}", "{\"step\": 1.5, \"metrics\": {}}",
                         "{\"step\": \"1\", \"metrics\": {}}", "{\"time\": \"now\", \"metrics\": {}}",
                         "{\"metrics\": [1]}", "{\"metrics\": {\"a\": 1}",
                         "{\"step\": -1, \"metrics\": {\"a\": 1}}", "{\"step\": -9223372036854775808, \"metrics\": {}}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kiln_err_clear(&err);
        cr_assert_eq(rank_metric_parse(bad[i], strlen(bad[i]), &rec, &err), KILN_EFORMAT, "%s", bad[i]);
        cr_assert_neq(err.message[0], '\0');
        cr_assert_eq(rec.n, 0);
        rank_metric_record_deinit(&rec);
    }
    /* a name that would rewrite a terminal (a script writes its own records) is no metric's */
    const char *esc = "{\"step\": 2, \"metrics\": {\"\\u001b]52;c;ZXZpbA==\\u0007\": 1, \"ok\": 2, "
                      "\"x\\u202e\": 3, \"tab\\tname\": 4}}";
    cr_assert_eq(rank_metric_parse(esc, strlen(esc), &rec, &err), 0, "%s", err.message);
    cr_assert_eq(rec.n, 1);
    cr_assert_str_eq(rec.v[0].name, "ok");
    cr_assert_eq(rec.skipped, 3);
    rank_metric_record_deinit(&rec);
    /* no metrics at all is a record */
    const char *empty = "{\"step\": 3, \"time\": 1.5, \"metrics\": {}}";
    cr_assert_eq(rank_metric_parse(empty, strlen(empty), &rec, &err), 0);
    cr_assert_eq(rec.n, 0);
    rank_metric_record_deinit(&rec);
}

/* ---- exits -------------------------------------------------------------------------------- */

Test(mark, writer_to_parser_round_trip_and_nothing_else_is_a_mark)
{
    char buf[RANK_STEP_MARK_MAX];
    const int64_t steps[] = {0, 1, 120, 1000000, INT64_MAX};
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        int n = rank_step_mark_format(steps[i], buf, sizeof(buf));
        cr_assert_gt(n, 0);
        cr_assert_eq(buf[n - 1], '\n', "a mark is a line");
        cr_assert_eq(buf[0], '\x1e', "it starts with a control character nobody types");
        int64_t back = -1;
        cr_assert(rank_step_mark_parse(buf, (size_t)n - 1, &back), "%s", buf);
        cr_assert_eq(back, steps[i]);
    }
    cr_assert_eq(rank_step_mark_format(-1, buf, sizeof(buf)), -1);
    cr_assert_str_eq(buf, "");
    cr_assert_eq(rank_step_mark_format(1, buf, 8), -1, "too small a buffer");
    /* close to a mark is a log line */
    static const char *const not_marks[] = {
        "kiln-step 5", "\x1ekiln-step ", "\x1ekiln-step -1", "\x1ekiln-step 05", "\x1ekiln-step 5 ",
        "\x1ekiln-step 5x", "\x1ekiln-step 9223372036854775808", "\x1ekiln-step 12345678901234567890",
        "\x1ekiln-step  5", "\x1eKILN-STEP 5", "x\x1ekiln-step 5",
    };
    for (size_t i = 0; i < sizeof(not_marks) / sizeof(not_marks[0]); i++) {
        int64_t st = 77;
        cr_assert_not(rank_step_mark_parse(not_marks[i], strlen(not_marks[i]), &st), "case %zu is a mark", i);
        cr_assert_eq(st, 77, "case %zu wrote a step", i);
    }
    /* rank_step_mark_write goes through stdio, so it keeps its place among the stream's lines */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_not_null(f);
    fputs("before\n", f);
    cr_assert_eq(rank_step_mark_write(f, 42), 0);
    fputs("after\n", f);
    fclose(f);
    cr_assert_str_eq(text, "before\n\x1ekiln-step 42\nafter\n");
    free(text);
}

Test(exit, codes_and_what_they_mean)
{
    kiln_err_t err;
    kiln_err_set(&err, KILN_EINVAL, "hyperparameters.lr", "bad");
    cr_assert_eq(rank_exit_code_for(&err), RANK_EXIT_BAD_INPUT);
    kiln_err_set(&err, KILN_EIO, "data.train", "unreadable");
    cr_assert_eq(rank_exit_code_for(&err), RANK_EXIT_BAD_INPUT);
    kiln_err_set(&err, KILN_EIO, "checkpoint", "disk full");
    cr_assert_eq(rank_exit_code_for(&err), RANK_EXIT_FAILURE);
    kiln_err_set(&err, KILN_ECOMM, NULL, "rank 1 (host h) disconnected");
    cr_assert_eq(rank_exit_code_for(&err), RANK_EXIT_FAILURE);
    kiln_err_set(&err, KILN_ETIMEDOUT, NULL, "no progress for 3 s in an all-reduce: waiting on rank 1");
    cr_assert_eq(rank_exit_code_for(&err), RANK_EXIT_FAILURE);
    kiln_err_set(&err, KILN_EPERM, "data.train", "outside the data roots");
    cr_assert_eq(rank_exit_code_for(&err), RANK_EXIT_BAD_INPUT);

    cr_assert_eq(rank_end_of(0, 0), RANK_END_DONE);
    cr_assert_eq(rank_end_of(2, 0), RANK_END_BAD_INPUT);
    cr_assert_eq(rank_end_of(1, 0), RANK_END_LOST);
    cr_assert_eq(rank_end_of(143, 0), RANK_END_LOST, "stopped without being asked: lost, like preemption");
    cr_assert_eq(rank_end_of(134, 0), RANK_END_LOST);
    cr_assert_eq(rank_end_of(-1, SIGKILL), RANK_END_LOST);
    cr_assert_eq(rank_end_of(2, SIGSEGV), RANK_END_LOST, "a signal wins over a stale code");

    char buf[128];
    cr_assert_str_eq(rank_end_describe(-1, SIGKILL, buf, sizeof buf), "was killed by signal 9 (Killed)");
    cr_assert_str_eq(rank_end_describe(2, 0, buf, sizeof buf), "exited with code 2 (bad spec or data)");
    cr_assert_str_eq(rank_end_describe(143, 0, buf, sizeof buf), "exited with code 143 (stopped after a checkpoint)");
    cr_assert_str_eq(rank_end_describe(1, 0, buf, sizeof buf), "exited with code 1");
}

/* ---- shared memory ------------------------------------------------------------------------ */

static void touch_shm(const char *name)
{
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/%.100s", name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    fputs("region", f);
    fclose(f);
}

static bool shm_exists(const char *name)
{
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/%.100s", name);
    return access(path, F_OK) == 0;
}

Test(shm, cleanup_removes_exactly_the_given_processes_regions)
{
    /* pids above pid_max: no process can have them, so no real region is touched */
    long pid_max = 4194304;
    FILE *f = fopen("/proc/sys/kernel/pid_max", "r");
    if (f) {
        cr_assert_eq(fscanf(f, "%ld", &pid_max), 1);
        fclose(f);
    }
    int a = (int)(pid_max + 1000 + getpid() % 1000), b = a + 1, other = a + 2;
    char n[12][64];
    snprintf(n[0], 64, "%d:0:0", a);          /* attempt's rank a: two endpoints */
    snprintf(n[1], 64, "%d:0:1", a);
    snprintf(n[2], 64, "%d:0:0", b);          /* attempt's rank b */
    snprintf(n[3], 64, "%d:0:0", other);      /* another attempt's rank */
    snprintf(n[4], 64, "%d0:0:0", a);         /* a longer pid that starts with a's digits */
    snprintf(n[5], 64, "%d-0", a);            /* no colon: not a region of the transport */
    snprintf(n[6], 64, "x%d:0:0", a);
    for (int i = 0; i < 7; i++)
        touch_shm(n[i]);
    snprintf(n[7], 64, "%d:dir", b);          /* not a regular file */
    char dir[128];
    snprintf(dir, sizeof dir, "/dev/shm/%.63s", n[7]);
    cr_assert_eq(mkdir(dir, 0700), 0);

    int attempt[] = {a, b};
    cr_assert_eq(rank_shm_cleanup(attempt, 2), 3);
    cr_assert(!shm_exists(n[0]) && !shm_exists(n[1]) && !shm_exists(n[2]));
    for (int i = 3; i < 8; i++)
        cr_assert(shm_exists(n[i]), "%s was removed", n[i]);
    cr_assert_eq(rank_shm_cleanup(attempt, 2), 0, "nothing left of them");
    cr_assert_eq(rank_shm_cleanup(&other, 1), 1);
    cr_assert(!shm_exists(n[3]));
    cr_assert_eq(rank_shm_cleanup(NULL, 0), 0);
    for (int i = 4; i < 7; i++) {
        char path[128];
        snprintf(path, sizeof path, "/dev/shm/%.63s", n[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* ---- a script rank's contract ------------------------------------------------------------- */

/* The arguments SageMaker's toolkit (to_cmd_args) makes of these hyperparameters, as Python 3
 * printed them. */
Test(rank_script, hyperparameters_become_the_arguments_sagemaker_passes)
{
    const char *hp = "{\"f\":[0.01,1e-05,1000000.0,3.0,1e16,0.30000000000000004,-2.5e-7,123456789012345678,1.5e300],"
                     "\"l\":[1,\"a\",true,null,2.0,\"it's\",{\"k\":\"v\"}],\"o\":{\"b\":1,\"a\":{\"x\":\"y\"}},"
                     "\"s\":\"plain text\",\"n\":null,\"t\":false,\"k\":7}";
    const char *want[] = {"-f", "[0.01, 1e-05, 1000000.0, 3.0, 1e+16, 0.30000000000000004, -2.5e-07, "
                                "123456789012345678, 1.5e+300]",
                          "-k", "7", "-l", "[1, 'a', True, None, 2.0, \"it's\", {'k': 'v'}]", "-n", "None",
                          "-o", "a={'x': 'y'},b=1", "-s", "plain text", "-t", "False"};
    char **args = NULL;
    size_t n = 0;
    kiln_err_t err;
    cr_assert_eq(rank_script_args(hp, &args, &n, &err), 0, "%s", err.message);
    cr_assert_eq(n, sizeof(want) / sizeof(want[0]));
    for (size_t i = 0; i < n; i++)
        cr_assert_str_eq(args[i], want[i], "argument %zu", i);
    cr_assert_null(args[n]);
    rank_envp_free(args);
    cr_assert_eq(rank_script_args("{}", &args, &n, &err), 0);
    cr_assert_eq(n, 0);
    cr_assert_null(args[0]);
    rank_envp_free(args);
    cr_assert_eq(rank_script_args("[1]", &args, &n, &err), KILN_EINVAL);
    cr_assert_null(args);
}

Test(rank_script, the_environment_has_torchrun_and_sagemaker_and_refuses_reserved_names)
{
    rank_env_t e;
    rank_env_init(&e);
    e.job_id = "job-9";
    e.attempt = 3;
    e.rank = 3;
    e.world_size = 4;
    e.local_rank = 1;
    e.local_world_size = 2;
    e.node_rank = 1;
    e.nodes = 2;
    e.master_addr = "10.0.0.1";
    e.master_port = 29501;
    e.threads = 2;
    e.checkpoint_dir = "/ck";
    const char *cn[] = {"validation", "train"}, *cp[] = {"/d/v", "/d/t"};
    const char *en[] = {"MY_FLAG", "PATH"}, *ev[] = {"1", "/venv/bin"};
    rank_script_env_t s = {.entry_point = "src/train.py", .hyperparameters_json = "{\"lr\": 0.5, \"m\": {\"d\": 2}}",
                           .channel_names = cn, .channel_paths = cp, .n_channels = 2, .env_names = en,
                           .env_values = ev, .n_env = 2, .model_dir = "/j/model", .output_dir = "/j/out",
                           .output_data_dir = "/j/out/data", .max_restarts = 4, .num_gpus = 0};
    char *base[] = {"PATH=/usr/bin", "RANK=99", "SM_HPS=x", "LD_PRELOAD=/evil.so", "KILN_JOIN_TOKEN=s", "HOME=/h", NULL};
    char **envp = NULL;
    kiln_err_t err;
    cr_assert_eq(rank_script_envp(&e, &s, base, &envp, &err), 0, "%s", err.message);
    static const char *const want[][2] = {
        {"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "1"},
        {"GROUP_WORLD_SIZE", "2"}, {"ROLE_RANK", "3"}, {"ROLE_WORLD_SIZE", "4"}, {"ROLE_NAME", "default"},
        {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29501"}, {"TORCHELASTIC_RESTART_COUNT", "2"},
        {"TORCHELASTIC_MAX_RESTARTS", "4"}, {"TORCHELASTIC_RUN_ID", "job-9"}, {"OMP_NUM_THREADS", "2"},
        {"SM_MODEL_DIR", "/j/model"}, {"SM_OUTPUT_DIR", "/j/out"}, {"SM_OUTPUT_DATA_DIR", "/j/out/data"},
        {"SM_CHANNELS", "[\"train\",\"validation\"]"}, {"SM_CHANNEL_TRAIN", "/d/t"}, {"SM_CHANNEL_VALIDATION", "/d/v"},
        {"SM_HPS", "{\"lr\":0.5,\"m\":{\"d\":2}}"}, {"SM_HP_LR", "0.5"}, {"SM_HP_M", "{\"d\":2}"},
        {"SM_USER_ARGS", "[\"--lr\",\"0.5\",\"-m\",\"d=2\"]"}, {"SM_CURRENT_HOST", "algo-2"},
        {"SM_HOSTS", "[\"algo-1\",\"algo-2\"]"}, {"SM_NUM_CPUS", "2"}, {"SM_NUM_GPUS", "0"},
        {"SM_CHECKPOINT_DIR", "/ck"}, {"KILN_RANK", "3"}, {"MY_FLAG", "1"}, {"PATH", "/venv/bin"}, {"HOME", "/h"},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        cr_assert_eq(envp_count(envp, want[i][0]), 1, "%s once", want[i][0]);
        cr_assert_str_eq(envp_get(envp, want[i][0]), want[i][1], "%s", want[i][0]);
    }
    cr_assert_null(envp_get(envp, "LD_PRELOAD"));
    cr_assert_null(envp_get(envp, "KILN_JOIN_TOKEN"));
    cr_assert_null(envp_get(envp, "CUDA_VISIBLE_DEVICES"));
    json_error_t je;
    json_t *t = json_loads(envp_get(envp, "SM_TRAINING_ENV"), 0, &je);
    cr_assert_not_null(t, "%s", je.text);
    cr_assert_str_eq(json_string_value(json_object_get(t, "module_name")), "train");
    cr_assert_str_eq(json_string_value(json_object_get(t, "current_host")), "algo-2");
    cr_assert(json_is_false(json_object_get(t, "is_master")));
    json_decref(t);
    rank_envp_free(envp);

    /* a name kiln sets is refused, naming it */
    const char *bad[] = {"MASTER_PORT"}, *badv[] = {"1"};
    s.env_names = bad;
    s.env_values = badv;
    s.n_env = 1;
    cr_assert_eq(rank_script_envp(&e, &s, base, &envp, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "MASTER_PORT") && strstr(err.message, "torchrun"), "%s", err.message);
    cr_assert_null(envp);
}
