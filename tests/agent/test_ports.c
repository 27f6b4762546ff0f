/* test_ports.c - rendezvous ports: the agent hands each attempt it leads (node 0 of a job of
 * several ranks, no port from kilnd) a port of its range that no other attempt holds and nothing
 * on the host listens on, gives it back when the attempt's ranks are gone, passes a port kilnd
 * sent on unchanged, and gives a job of one rank none. Two jobs on one host never share one, also
 * when two agents of the host lead them from the same range. */
#include "tests/agent/launch_fixture.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

TestSuite(ports, .init = lf_setup, .fini = lf_teardown, .timeout = 60);

/* A range of 3 ports below the ephemeral ones, different for parallel test processes. */
static int range_lo(void)
{
    return 20000 + (int)(getpid() % 3000) * 3;
}

static int listen_on(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 1) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Starts job with one local rank of a world of 2 on node 0 (kilnd left the port to the agent);
 * returns the port on_started reported (0 when refused). */
static int start_leader(agent_launcher_t *l, const char *job, int world, int kilnd_port, int node_rank)
{
    int32_t ranks[1] = {0};
    Kiln__Assignment a = lf_assignment(job, 1, ranks, 1, "{}");
    a.world_size = world;
    a.node_rank = node_rank;
    a.nodes = world < 2 ? 1 : 2; /* the rank contract: no more agents than ranks */
    a.master_addr = (char *)"127.0.0.1";
    a.master_port = kilnd_port;
    kiln_err_t err;
    int rc = agent_launcher_start(l, &a, &err);
    pthread_mutex_lock(&R.mu);
    int port = R.last_port;
    pthread_mutex_unlock(&R.mu);
    return rc == 0 ? port : -1;
}

Test(ports, each_attempt_gets_its_own_free_port)
{
    int lo = range_lo();
    int busy = listen_on(lo); /* something else on the host holds the first port */
    cr_assert_geq(busy, 0, "could not listen on %d", lo);
    char *bin = lf_script("rank.sh", "echo \"port=${KILN_MASTER_PORT:-none}\"\nsleep 30\n");
    agent_launcher_t *l = lf_launcher_ports(bin, 8, false, 8, NULL, 0, lo, lo + 2);

    int a = start_leader(l, "job-a", 2, 0, 0);
    int b = start_leader(l, "job-b", 4, 0, 0);
    cr_assert_eq(a, lo + 1, "the port another process listens on is skipped (got %d)", a);
    cr_assert_eq(b, lo + 2, "a second job never gets the first one's port (got %d)", b);
    cr_assert_lt(start_leader(l, "job-c", 2, 0, 0), 0, "no port left: the assignment is refused");
    cr_assert(strstr(R.start_reason, "no free rendezvous port"), "%s", R.start_reason);
    /* refused with metric definitions, which the job owned by then: freed once (the sanitizer
     * build catches a second free) */
    {
        int32_t ranks[1] = {0};
        Kiln__Assignment x = lf_assignment("job-defs", 1, ranks, 1, "{}");
        x.world_size = 2;
        x.node_rank = 0;
        x.master_addr = (char *)"127.0.0.1";
        x.master_port = 0;
        Kiln__MetricDefinition def = KILN__METRIC_DEFINITION__INIT, *defs[] = {&def};
        def.name = (char *)"acc";
        def.regex = (char *)"acc=([0-9.]+)";
        x.metric_definitions = defs;
        x.n_metric_definitions = 1;
        kiln_err_t err;
        cr_assert_neq(agent_launcher_start(l, &x, &err), 0, "no port left for a job with metric definitions");
        cr_assert(strstr(err.message, "no free rendezvous port"), "%s", err.message);
    }

    /* What the ranks were told. */
    cr_assert(lf_wait_line("job-a", 0, "port=", 30000) && lf_wait_line("job-b", 0, "port=", 30000),
              "the ranks never said which port they were told");
    char want_a[32], want_b[32];
    snprintf(want_a, sizeof want_a, "port=%d", a);
    snprintf(want_b, sizeof want_b, "port=%d", b);
    bool seen_a = false, seen_b = false;
    pthread_mutex_lock(&R.mu);
    for (int i = 0; i < R.nlines; i++) {
        seen_a |= !strcmp(R.lines[i].text, want_a) && !strcmp(R.lines[i].job, "job-a");
        seen_b |= !strcmp(R.lines[i].text, want_b) && !strcmp(R.lines[i].job, "job-b");
    }
    pthread_mutex_unlock(&R.mu);
    cr_assert(seen_a && seen_b, "the ranks got KILN_MASTER_PORT %d and %d", a, b);

    /* The port comes back when the attempt's ranks are gone. */
    cr_assert_eq(agent_launcher_stop(l, "job-a", 0, 0), 1);
    cr_assert(lf_wait_exits(1, 10000));
    size_t left = 0;
    for (int i = 0; i < 500; i++) {
        agent_rank_info_t info[8];
        left = agent_launcher_list(l, info, 8);
        if (left == 1)
            break;
        usleep(20000);
    }
    cr_assert_eq(left, 1, "job-a's rank is gone from the launcher (%zu ranks listed)", left);
    cr_assert_eq(start_leader(l, "job-d", 2, 0, 0), lo + 1, "the freed port is handed out again");
    agent_launcher_destroy(l);
    close(busy);
}

Test(ports, a_port_from_kilnd_is_kept_and_one_rank_gets_none)
{
    int lo = range_lo();
    char *bin = lf_script("rank.sh", "echo \"port=${KILN_MASTER_PORT:-none}\"\nexit 0\n");
    agent_launcher_t *l = lf_launcher_ports(bin, 8, false, 8, NULL, 0, lo, lo + 2);
    cr_assert_eq(start_leader(l, "job-n1", 2, 31234, 1), 0, "node 1 uses kilnd's port and picks none");
    cr_assert(lf_wait_exits(1, 10000));
    cr_assert_eq(start_leader(l, "job-solo", 1, 0, 0), 0, "a job of one rank has no rendezvous");
    cr_assert(lf_wait_exits(2, 10000));
    const ev_line_t *x = lf_find_line(0, "port=31234");
    cr_assert_not_null(x, "node 1 got kilnd's port");
    bool none = false;
    pthread_mutex_lock(&R.mu);
    for (int i = 0; i < R.nlines; i++)
        none |= !strcmp(R.lines[i].job, "job-solo") && !strcmp(R.lines[i].text, "port=none");
    pthread_mutex_unlock(&R.mu);
    cr_assert(none, "a job of one rank gets no KILN_MASTER_PORT");
    agent_launcher_destroy(l);
}

Test(ports, two_agents_of_one_host_never_hand_out_the_same_port)
{
    int lo = range_lo();
    /* The ranks do not bind their port (as in the moment between the agent's pick and rank 0's
     * listen), so only the agents' claims keep the second agent off the first one's port. */
    char *bin = lf_script("rank.sh", "echo \"port=${KILN_MASTER_PORT:-none}\"\nsleep 30\n");
    agent_launcher_t *l1 = lf_launcher_ports(bin, 8, false, 8, NULL, 0, lo, lo + 2);
    agent_launcher_t *l2 = lf_launcher_ports(bin, 8, false, 8, NULL, 0, lo, lo + 2);
    int a = start_leader(l1, "job-one", 2, 0, 0);
    int b = start_leader(l2, "job-two", 2, 0, 0);
    cr_assert_eq(a, lo, "the first agent takes the first port (got %d)", a);
    cr_assert_eq(b, lo + 1, "the second agent skips the port the first one claimed (got %d)", b);
    cr_assert_eq(start_leader(l1, "job-three", 2, 0, 0), lo + 2);
    cr_assert_lt(start_leader(l2, "job-four", 2, 0, 0), 0, "every port of the range is claimed on this host");

    /* The first agent's claims go with it: its ports are free for the second again. */
    agent_launcher_destroy(l1);
    int c = start_leader(l2, "job-five", 2, 0, 0);
    cr_assert(c == lo || c == lo + 2, "a port comes back when its agent is gone (got %d)", c);
    agent_launcher_destroy(l2);
}
