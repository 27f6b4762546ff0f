/* comm_bench.c - all-reduce bus bandwidth of the comm layer beside the point-to-point bandwidth
 * of the same provider, measured in the same run. One process per rank, started by
 * bench/comm_bench.sh with the rank contract's environment (KILN_RANK, KILN_WORLD_SIZE,
 * KILN_MASTER_ADDR/PORT, KILN_COMM_PROVIDER). Rank 0 prints one line per buffer size.
 *
 * p2p uni:   rank 0 streams S bytes to rank 1 as 1 MiB messages (all posted at once); S / time.
 * p2p bidir: ranks 0 and 1 stream S bytes to each other at the same time; S / time, per direction.
 * allreduce: comm_allreduce (ring, sum) of S bytes of floats; bus bandwidth S / time * 2(n-1)/n.
 * With 2 ranks the ring sends S bytes each way per rank while receiving S bytes, so the fair
 * reference for the bus bandwidth is the bidirectional p2p figure. Bandwidths use the best
 * (shortest) of the iterations, which is what the hardware gives when the shared machine lets
 * it; the last column is the all-reduce/bidir ratio of the medians, for comparison.
 *
 * `comm_bench --buckets N1,N2,... [iters]` instead all-reduces a data-parallel gradient: buckets
 * of N1, N2, ... floats started back to back (as engine/dp does after backward), then waited
 * for; rank 0 prints one line per iteration ("buckets <bytes> <seconds> <MB/s>") and a median
 * line, where MB/s is the bytes each rank sends and receives, 2(n-1)/n of the gradient, per
 * second: the figure to hold against a link's rate (bench/dp_netns.sh). Not a test: it asserts
 * nothing. */
#include "engine/comm/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MSG (1u << 20)

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double best(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return v[0];
}

/* Streams bytes from buf to peer (send) or from peer into buf (recv) as MSG-sized messages,
 * all in flight at once. */
static int stream(comm_t *c, char *buf, size_t bytes, int peer, bool send, comm_req_t **reqs, kiln_err_t *err)
{
    size_t nmsg = (bytes + MSG - 1) / MSG;
    for (size_t i = 0; i < nmsg; i++) {
        size_t len = bytes - i * MSG < MSG ? bytes - i * MSG : MSG;
        int rc = send ? comm_send_start(c, buf + i * MSG, len, peer, 1, &reqs[i], err)
                      : comm_recv_start(c, buf + i * MSG, len, peer, 1, NULL, &reqs[i], err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int wait_all(comm_req_t **reqs, size_t n, kiln_err_t *err)
{
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        int r = comm_wait(reqs[i], err);
        if (r && !rc)
            rc = r;
    }
    return rc;
}

/* --buckets: the gradient of a data-parallel step, all-reduced bucket by bucket. */
static int bench_buckets(comm_t *c, const char *list, int iters)
{
    size_t n[256], total = 0;
    int nb = 0;
    for (const char *p = list; *p && nb < 256;) {
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || v == 0) {
            fprintf(stderr, "comm_bench: --buckets wants positive float counts, not \"%s\"\n", list);
            return 2;
        }
        n[nb++] = (size_t)v;
        total += (size_t)v;
        p = *end == ',' ? end + 1 : end;
    }
    float *buf = malloc(total * sizeof(float));
    comm_req_t *reqs[256];
    double t[1024];
    kiln_err_t err;
    if (!buf || iters < 1 || iters > 1024) {
        fprintf(stderr, "comm_bench: out of memory or bad iteration count\n");
        free(buf);
        return 1;
    }
    int me = comm_rank(c), W = comm_size(c);
    double bus = 2.0 * (W - 1) / W;
    for (int it = 0; it <= iters; it++) { /* iteration 0 warms up */
        for (size_t i = 0; i < total; i++)
            buf[i] = 1e-3f * (float)(i % 1000);
        if (comm_barrier(c, &err))
            goto fail;
        double t0 = kiln_mono_s();
        size_t off = 0;
        for (int b = 0; b < nb; b++) {
            if (comm_allreduce_start(c, buf + off, n[b], COMM_AVG, &reqs[b], &err))
                goto fail;
            off += n[b];
        }
        double done[256];
        for (int b = 0; b < nb; b++) {
            if (comm_wait(reqs[b], &err))
                goto fail;
            done[b] = kiln_mono_s() - t0;
        }
        if (it > 0 && me == 0 && getenv("COMM_BENCH_TRACE")) {
            for (int b = 0; b < nb; b++)
                printf(" %.1f", done[b] * 1e3);
            printf(" ms\n");
        }
        if (it > 0) {
            t[it - 1] = kiln_mono_s() - t0;
            if (me == 0)
                printf("buckets %zu %.4f %.1f\n", total * sizeof(float), t[it - 1],
                       total * sizeof(float) * bus / t[it - 1] / 1e6);
        }
    }
    if (me == 0) {
        double m = median(t, iters);
        printf("buckets_median %zu %.4f %.1f %d\n", total * sizeof(float), m,
               total * sizeof(float) * bus / m / 1e6, nb);
        fflush(stdout);
    }
    free(buf);
    return 0;
fail:
    fprintf(stderr, "comm_bench: rank %d: %s\n", me, err.message);
    free(buf);
    return 1;
}

int main(int argc, char **argv)
{
    log_init("comm_bench");
    /* the communication settings kiln-train has (KILN_COMM_*), then positional arguments */
    comm_settings_t cs = COMM_SETTINGS_INIT;
    const char *buckets = NULL;
    config_flag_t flags[] = {
        COMM_SETTINGS_FLAGS(&cs),
        {"buckets", NULL, CONFIG_STR, &buckets, CONFIG_ANY, "SIZES: time bucketed all-reduces of these sizes"},
    };
    kiln_err_t cerr;
    int npos = 0;
    int prc = config_parse(argc, argv, flags, KILN_ARRAY_LEN(flags), "[MIN_MIB MAX_MIB] | --buckets SIZES [ITERS]",
                           &npos, &cerr);
    if (prc == 1)
        return 0;
    if (prc) {
        fprintf(stderr, "comm_bench: %s\n", cerr.message);
        return 2;
    }
    comm_config_t cc;
    comm_config_init(&cc);
    comm_settings_apply(&cc, &cs);
    /* argv[0..npos) are the positional arguments now */
    argc = npos + 1;
    memmove(argv + 1, argv, (size_t)npos * sizeof(char *));
    if (buckets) {
        kiln_err_t err;
        comm_t *c = NULL;
        if (comm_create_from_env(&cc, &c, &err) != 0) {
            fprintf(stderr, "comm_bench: %s\n", err.message);
            return 1;
        }
        int rc = bench_buckets(c, buckets, argc > 1 ? atoi(argv[1]) : 10);
        comm_destroy(c);
        return rc;
    }
    size_t min_mib = argc > 1 ? (size_t)atol(argv[1]) : 1;
    size_t max_mib = argc > 2 ? (size_t)atol(argv[2]) : 256;
    kiln_err_t err;
    comm_t *c = NULL;
    if (comm_create_from_env(&cc, &c, &err) != 0) {
        fprintf(stderr, "comm_bench: %s\n", err.message);
        return 1;
    }
    int me = comm_rank(c), W = comm_size(c);
    size_t maxb = max_mib << 20;
    char *sbuf = malloc(maxb), *rbuf = malloc(maxb);
    comm_req_t **reqs = calloc(2 * (maxb / MSG + 1), sizeof(*reqs));
    if (!sbuf || !rbuf || !reqs) {
        fprintf(stderr, "comm_bench: out of memory\n");
        return 1;
    }
    memset(sbuf, 1, maxb);
    memset(rbuf, 0, maxb);
    float *fb = (float *)rbuf;
    for (size_t i = 0; i < maxb / 4; i++)
        fb[i] = 1.0f;
    if (me == 0)
        printf("%-12s %9s %12s %14s %16s %7s %12s\n", "provider", "size_MiB", "p2p_uni_GBs",
               "p2p_bidir_GBs", "allreduce_busGBs", "ratio", "ratio_median");
    for (size_t mib = min_mib; mib <= max_mib; mib *= 4) {
        size_t bytes = mib << 20, nmsg = (bytes + MSG - 1) / MSG;
        int iters = mib >= 64 ? 5 : 11;
        double tu[16], tb[16], ta[16];
        char ack = 0;
        for (int it = 0; it <= iters; it++) { /* iteration 0 warms up */
            int k = it - 1;
            /* unidirectional: rank 0 -> rank 1, ended by a one-byte acknowledgement */
            comm_barrier(c, &err);
            double t0 = kiln_mono_s();
            if (me == 0) {
                if (stream(c, sbuf, bytes, 1, true, reqs, &err) || wait_all(reqs, nmsg, &err) ||
                    comm_recv(c, &ack, 1, 1, 2, NULL, &err))
                    goto fail;
            } else if (me == 1) {
                if (stream(c, rbuf, bytes, 0, false, reqs, &err) || wait_all(reqs, nmsg, &err) ||
                    comm_send(c, &ack, 1, 0, 2, &err))
                    goto fail;
            }
            if (k >= 0)
                tu[k] = kiln_mono_s() - t0;
            /* bidirectional: ranks 0 and 1 exchange at once */
            comm_barrier(c, &err);
            t0 = kiln_mono_s();
            if (me < 2) {
                int peer = 1 - me;
                if (stream(c, rbuf, bytes, peer, false, reqs, &err) ||
                    stream(c, sbuf, bytes, peer, true, reqs + nmsg, &err) || wait_all(reqs, 2 * nmsg, &err))
                    goto fail;
            }
            if (k >= 0)
                tb[k] = kiln_mono_s() - t0;
            /* all-reduce */
            comm_barrier(c, &err);
            t0 = kiln_mono_s();
            if (comm_allreduce(c, fb, bytes / 4, COMM_SUM, &err))
                goto fail;
            if (k >= 0)
                ta[k] = kiln_mono_s() - t0;
            for (size_t i = 0; i < 4; i++) /* keep the values small and finite */
                fb[i] = 1.0f;
        }
        double gb = (double)bytes / 1e9, bus = 2.0 * (W - 1) / W;
        double rmed = (median(tb, iters) / median(ta, iters)) * bus;
        double u = gb / best(tu, iters), b = gb / best(tb, iters);
        double a = gb / best(ta, iters) * bus;
        /* rank 0's view; the exchange times are symmetric */
        if (me == 0) {
            printf("%-12s %9zu %12.3f %14.3f %16.3f %6.0f%% %11.0f%%\n", comm_provider(c), mib, u, b, a,
                   100.0 * a / b, 100.0 * rmed);
            fflush(stdout);
        }
    }
    comm_destroy(c);
    free(sbuf);
    free(rbuf);
    free(reqs);
    return 0;
fail:
    fprintf(stderr, "comm_bench: rank %d: %s\n", me, err.message);
    return 1;
}
