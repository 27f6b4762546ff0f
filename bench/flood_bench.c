/* flood_bench.c - whether one client address holding many idle connections slows others: times
 * GET /healthz on a new TLS connection each (connect, handshake, request) and GET /v1/jobs on a
 * kept-alive connection (with the API token) from 127.0.0.1, first alone, then while 127.0.0.2
 * holds N idle TCP connections to the REST port and N to the gRPC port (opened at once; those
 * kilnd refuses are counted and closed, the rest held), then alone again. Prints the latency
 * percentiles of each phase and the connections 127.0.0.2 got to keep. Not a test: it asserts
 * nothing.
 * usage: flood_bench --url https://127.0.0.1:PORT --grpc-port PORT --ca CA.pem --token-file ADMIN
 *                    [--flood N] [--samples S] */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const char *url, *ca, *token_file;
static int grpc_port, flood = 10000, samples = 200;
static char auth[600];

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static size_t sink(char *d, size_t sz, size_t n, void *u)
{
    (void)d;
    (void)u;
    return sz * n;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* samples requests of path; fresh: a new connection each. Prints p50/p90/p99/max. */
static void timed(const char *label, const char *path, bool fresh)
{
    double *t = calloc((size_t)samples, sizeof *t);
    int fails = 0, n = 0;
    char u[512];
    snprintf(u, sizeof u, "%s%s", url, path);
    struct curl_slist *hd = curl_slist_append(NULL, auth);
    CURL *h = curl_easy_init();
    for (int i = 0; i < samples && fails < 3; i++, n++) { /* three failures: it does not answer */
        if (fresh) {
            curl_easy_cleanup(h);
            h = curl_easy_init();
        }
        curl_easy_setopt(h, CURLOPT_URL, u);
        curl_easy_setopt(h, CURLOPT_CAINFO, ca);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
        double t0 = now_ms();
        long st = 0;
        if (curl_easy_perform(h) != CURLE_OK || (curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st), st != 200))
            fails++;
        t[i] = now_ms() - t0;
    }
    curl_easy_cleanup(h);
    curl_slist_free_all(hd);
    qsort(t, (size_t)n, sizeof *t, cmp);
    printf("  %-34s p50 %7.2f ms  p90 %7.2f ms  p99 %7.2f ms  max %7.2f ms  (%d requests, %d failed)\n", label,
           t[n / 2], t[n * 9 / 10], t[n * 99 / 100], t[n - 1], n, fails);
    free(t);
}

/* Opens n connections from 127.0.0.2 to port; closes those refused until none has been for 2 s
 * (at most 15 s); returns how many stay (their descriptors in fds). */
static int flood_port(int port, int n, int *fds)
{
    for (int i = 0; i < n; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        struct sockaddr_in src = {.sin_family = AF_INET}, dst = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        inet_pton(AF_INET, "127.0.0.2", &src.sin_addr);
        inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
        if (fds[i] < 0 || bind(fds[i], (struct sockaddr *)&src, sizeof src) != 0 ||
            (connect(fds[i], (struct sockaddr *)&dst, sizeof dst) != 0 && errno != EINPROGRESS)) {
            if (fds[i] >= 0)
                close(fds[i]);
            fds[i] = -1;
        }
    }
    struct pollfd *p = calloc((size_t)n, sizeof *p);
    double start = now_ms(), quiet_since = start;
    while (now_ms() - quiet_since < 2000 && now_ms() - start < 15000) {
        int np = 0;
        for (int i = 0; i < n; i++)
            p[np++] = (struct pollfd){.fd = fds[i], .events = POLLIN};
        if (poll(p, (nfds_t)np, 200) <= 0)
            continue;
        for (int i = 0; i < n; i++) {
            if (fds[i] < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            char c;
            ssize_t r = recv(fds[i], &c, 1, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN)) {
                close(fds[i]);
                fds[i] = -1;
                quiet_since = now_ms();
            }
        }
    }
    free(p);
    int held = 0;
    for (int i = 0; i < n; i++)
        held += fds[i] >= 0;
    return held;
}

int main(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--url"))
            url = argv[i + 1];
        else if (!strcmp(argv[i], "--grpc-port"))
            grpc_port = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--ca"))
            ca = argv[i + 1];
        else if (!strcmp(argv[i], "--token-file"))
            token_file = argv[i + 1];
        else if (!strcmp(argv[i], "--flood"))
            flood = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--samples"))
            samples = atoi(argv[i + 1]);
    }
    if (!url || !ca || !token_file || grpc_port <= 0 || samples < 1) {
        fprintf(stderr, "usage: flood_bench --url U --grpc-port P --ca CA --token-file F [--flood N] [--samples S]\n");
        return 2;
    }
    FILE *f = fopen(token_file, "r");
    char tok[512] = "";
    if (!f || !fgets(tok, sizeof tok, f)) {
        fprintf(stderr, "flood_bench: cannot read %s\n", token_file);
        return 1;
    }
    fclose(f);
    tok[strcspn(tok, "\r\n")] = '\0';
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", tok);
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    /* the refused connections to one port are closed before the other is flooded */
    if ((long)rl.rlim_cur < flood + 1000L)
        flood = (int)((long)rl.rlim_cur - 1000);
    curl_global_init(CURL_GLOBAL_DEFAULT);

    printf("from 127.0.0.1, alone:\n");
    timed("GET /healthz, a new connection each", "/healthz", true);
    timed("GET /v1/jobs, one kept-alive conn.", "/v1/jobs?page_size=1", false);
    int *rest = calloc((size_t)flood, sizeof *rest), *grpc = calloc((size_t)flood, sizeof *grpc);
    double t0 = now_ms();
    int held_rest = flood_port(atoi(strrchr(url, ':') + 1), flood, rest);
    int held_grpc = flood_port(grpc_port, flood, grpc);
    printf("127.0.0.2 opened %d idle connections to each port (%.1f s): REST kept %d, gRPC kept %d\n", flood,
           (now_ms() - t0) / 1e3, held_rest, held_grpc);
    printf("from 127.0.0.1, while 127.0.0.2 holds them:\n");
    timed("GET /healthz, a new connection each", "/healthz", true);
    timed("GET /v1/jobs, one kept-alive conn.", "/v1/jobs?page_size=1", false);
    for (int i = 0; i < flood; i++) {
        if (rest[i] >= 0)
            close(rest[i]);
        if (grpc[i] >= 0)
            close(grpc[i]);
    }
    /* the same again without them: what the machine's own drift (other load) does meanwhile */
    usleep(500000);
    printf("from 127.0.0.1, alone again:\n");
    timed("GET /healthz, a new connection each", "/healthz", true);
    timed("GET /v1/jobs, one kept-alive conn.", "/v1/jobs?page_size=1", false);
    free(rest);
    free(grpc);
    return 0;
}
