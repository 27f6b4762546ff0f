/* test_comm.c - the comm module with real processes: each test forks its ranks, which rendezvous
 * over TCP and run collectives on the real libfabric providers (shm and tcp;ofi_rxm). Results are
 * checked bitwise against a serial reference that adds in ring order, and every rank reports a
 * hash of its output into shared memory so the parent checks that all ranks hold the same bytes.
 * Failure paths: a rank that never arrives, a rank killed mid-operation. */
#include "engine/comm/comm.h"
#include "tests/common/harness.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAXR 8
#define MAXH 256

typedef struct rank_out {
    int rc;
    int status;
    double elapsed_s;
    char provider[32];
    char msg[600];
    int nh;
    uint64_t h[MAXH];
} rank_out_t;

typedef struct run_cfg {
    int world;
    const char *provider;   /* "shm", "tcp" or NULL (auto) */
    const char *hosts[MAXR]; /* per-rank host name override, or NULL */
    double timeout_s;
    size_t chunk_bytes;
    int skip_rank;          /* rank that is never started, or -1 */
} run_cfg_t;

typedef int (*rank_body_t)(comm_t *c, rank_out_t *out, void *arg);

static uint64_t fnv(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void out_hash(rank_out_t *o, const void *p, size_t n)
{
    if (o->nh < MAXH)
        o->h[o->nh++] = fnv(p, n);
}

#define CHECK(o, cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            snprintf((o)->msg, sizeof((o)->msg), __VA_ARGS__);                                     \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* Forks cfg->world ranks running body; fills outs (shared memory). Returns when all exited. */
static rank_out_t *run_ranks(const run_cfg_t *cfg, rank_body_t body, void *arg)
{
    rank_out_t *outs = mmap(NULL, sizeof(rank_out_t) * MAXR, PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(outs != MAP_FAILED);
    memset(outs, 0, sizeof(rank_out_t) * MAXR);
    int port = th_free_port();
    pid_t pids[MAXR];
    for (int r = 0; r < cfg->world; r++) {
        outs[r].rc = -100;
        pids[r] = -1;
        if (r == cfg->skip_rank)
            continue;
        pid_t p = fork();
        cr_assert(p >= 0);
        if (p == 0) {
            comm_config_t cc;
            comm_config_init(&cc);
            cc.rank = r;
            cc.world_size = cfg->world;
            cc.master_port = port;
            cc.provider = cfg->provider;
            cc.hostname = cfg->hosts[r];
            cc.timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : 20;
            cc.chunk_bytes = cfg->chunk_bytes ? cfg->chunk_bytes : 16384;
            cc.depth = 3;
            kiln_err_t err;
            kiln_err_clear(&err);
            comm_t *c = NULL;
            double t0 = kiln_mono_s();
            int rc = comm_create(&cc, &c, &err);
            outs[r].status = rc;
            if (rc != 0) {
                snprintf(outs[r].msg, sizeof(outs[r].msg), "%s", err.message);
                outs[r].elapsed_s = kiln_mono_s() - t0;
                outs[r].rc = 2;
                _exit(2);
            }
            snprintf(outs[r].provider, sizeof(outs[r].provider), "%s", comm_provider(c));
            outs[r].rc = body(c, &outs[r], arg);
            outs[r].elapsed_s = kiln_mono_s() - t0;
            comm_destroy(c);
            _exit(outs[r].rc);
        }
        pids[r] = p;
    }
    double deadline = kiln_mono_s() + 90;
    for (int r = 0; r < cfg->world; r++) {
        if (pids[r] < 0)
            continue;
        int st;
        while (waitpid(pids[r], &st, WNOHANG) == 0) {
            if (kiln_mono_s() > deadline) {
                for (int k = 0; k < cfg->world; k++)
                    if (pids[k] > 0)
                        kill(pids[k], SIGKILL);
            }
            usleep(2000);
        }
    }
    return outs;
}

static void assert_all_ok(const run_cfg_t *cfg, const rank_out_t *o)
{
    for (int r = 0; r < cfg->world; r++)
        cr_assert_eq(o[r].rc, 0, "rank %d of %d (%s) failed (rc %d): %s", r, cfg->world,
                     cfg->provider ? cfg->provider : "auto", o[r].rc, o[r].msg);
    for (int r = 1; r < cfg->world; r++) {
        cr_assert_eq(o[r].nh, o[0].nh, "rank %d made %d checks, rank 0 %d", r, o[r].nh, o[0].nh);
        for (int i = 0; i < o[0].nh; i++)
            cr_assert_eq(o[r].h[i], o[0].h[i], "rank %d's output %d differs from rank 0's", r, i);
    }
}

/* ---- data and serial references ----------------------------------------------------------- */

static float val(int rank, size_t i, uint32_t seed)
{
    uint64_t x = (uint64_t)rank * 0x9E3779B97F4A7C15ull ^ (uint64_t)i * 0xBF58476D1CE4E5B9ull ^ seed;
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 29;
    return (float)((double)(x >> 40) / (double)(1ull << 24) * 2.0 - 1.0) * 3.0f;
}

/* What the ring computes for element i: the owner k of i's shard receives the partial sum that
 * started at rank k+1 and went around the ring, adding each rank's value in turn. */
static float ref_reduce(size_t n, size_t i, int world, uint32_t seed, comm_redop_t op)
{
    int k = 0;
    for (int r = 0; r < world; r++) {
        size_t off, cnt;
        comm_shard_range(n, r, world, &off, &cnt);
        if (i >= off && i < off + cnt)
            k = r;
    }
    float acc = val((k + 1) % world, i, seed);
    for (int j = 2; j <= world; j++)
        acc = acc + val((k + j) % world, i, seed);
    if (op == COMM_AVG && world > 1)
        acc = acc / (float)world;
    return acc;
}

static const size_t big_n = 1000003;

static size_t lengths(int world, size_t *out)
{
    size_t ls[] = {0, 1, (size_t)(world > 1 ? world - 1 : 0), (size_t)world, (size_t)world + 1, 7, 13,
                   4096, 4097, 12289, 65537, big_n};
    memcpy(out, ls, sizeof(ls));
    return KILN_ARRAY_LEN(ls);
}

static int body_collectives(comm_t *c, rank_out_t *o, void *arg)
{
    (void)arg;
    int W = comm_size(c), me = comm_rank(c);
    size_t ls[16];
    size_t nl = lengths(W, ls);
    float *buf = malloc(sizeof(float) * big_n);
    kiln_err_t err;
    CHECK(o, buf, "out of memory");
    for (size_t li = 0; li < nl; li++) {
        size_t n = ls[li];
        uint32_t seed = (uint32_t)(li * 7919 + 1);
        for (int opi = 0; opi < 2; opi++) {
            comm_redop_t op = opi ? COMM_AVG : COMM_SUM;
            /* all-reduce */
            for (size_t i = 0; i < n; i++)
                buf[i] = val(me, i, seed);
            CHECK(o, comm_allreduce(c, buf, n, op, &err) == 0, "allreduce n=%zu: %s", n, err.message);
            for (size_t i = 0; i < n; i++) {
                float want = ref_reduce(n, i, W, seed, op);
                CHECK(o, memcmp(&buf[i], &want, 4) == 0, "allreduce n=%zu op=%d [%zu]: %.9g, want %.9g",
                      n, opi, i, buf[i], want);
            }
            out_hash(o, buf, n * 4);
            /* reduce-scatter: own shard only */
            for (size_t i = 0; i < n; i++)
                buf[i] = val(me, i, seed);
            CHECK(o, comm_reduce_scatter(c, buf, n, op, &err) == 0, "reduce_scatter n=%zu: %s", n, err.message);
            size_t off, cnt;
            comm_shard_range(n, me, W, &off, &cnt);
            for (size_t i = off; i < off + cnt; i++) {
                float want = ref_reduce(n, i, W, seed, op);
                CHECK(o, memcmp(&buf[i], &want, 4) == 0, "reduce_scatter n=%zu [%zu]: %.9g, want %.9g", n,
                      i, buf[i], want);
            }
        }
        /* all-gather: own shard filled, the rest garbage */
        size_t off, cnt;
        comm_shard_range(n, me, W, &off, &cnt);
        for (size_t i = 0; i < n; i++)
            buf[i] = (i >= off && i < off + cnt) ? val(99, i, seed) : -12345.0f;
        CHECK(o, comm_allgather(c, buf, n, &err) == 0, "allgather n=%zu: %s", n, err.message);
        for (size_t i = 0; i < n; i++)
            CHECK(o, buf[i] == val(99, i, seed), "allgather n=%zu [%zu]: %g", n, i, buf[i]);
        out_hash(o, buf, n * 4);
        /* broadcast of bytes from a rotating root */
        int root = (int)(li % (size_t)W);
        size_t bytes = n * 4 + (li & 3);
        unsigned char *b = (unsigned char *)buf;
        for (size_t i = 0; i < bytes; i++)
            b[i] = me == root ? (unsigned char)(i * 31 + li) : 0xEE;
        CHECK(o, comm_bcast(c, b, bytes, root, &err) == 0, "bcast %zu bytes: %s", bytes, err.message);
        for (size_t i = 0; i < bytes; i++)
            CHECK(o, b[i] == (unsigned char)(i * 31 + li), "bcast %zu bytes root %d [%zu] = %u", bytes,
                  root, i, b[i]);
        out_hash(o, b, bytes);
    }
    CHECK(o, comm_barrier(c, &err) == 0, "barrier: %s", err.message);
    free(buf);
    return 0;
}

static void collectives(const char *prov, int world)
{
    run_cfg_t cfg = {.world = world, .provider = prov, .skip_rank = -1};
    rank_out_t *o = run_ranks(&cfg, body_collectives, NULL);
    assert_all_ok(&cfg, o);
    const char *want = strcmp(prov, "shm") == 0 ? "shm" : "tcp;ofi_rxm";
    cr_assert_str_eq(o[0].provider, want);
    munmap(o, sizeof(rank_out_t) * MAXR);
}

Test(comm_shm, collectives_world_1) { collectives("shm", 1); }
Test(comm_shm, collectives_world_2) { collectives("shm", 2); }
Test(comm_shm, collectives_world_3) { collectives("shm", 3); }
Test(comm_shm, collectives_world_4) { collectives("shm", 4); }
Test(comm_shm, collectives_world_5) { collectives("shm", 5); }
Test(comm_tcp, collectives_world_1) { collectives("tcp", 1); }
Test(comm_tcp, collectives_world_2) { collectives("tcp", 2); }
Test(comm_tcp, collectives_world_3) { collectives("tcp", 3); }
Test(comm_tcp, collectives_world_4) { collectives("tcp", 4); }
Test(comm_tcp, collectives_world_5) { collectives("tcp", 5); }

Test(comm, shard_range_covers_every_element_once)
{
    for (int w = 1; w <= 7; w++)
        for (size_t n = 0; n < 30; n++) {
            size_t next = 0;
            for (int r = 0; r < w; r++) {
                size_t off, cnt;
                comm_shard_range(n, r, w, &off, &cnt);
                cr_assert_eq(off, next, "n=%zu w=%d r=%d", n, w, r);
                cr_assert(cnt == n / (size_t)w || cnt == n / (size_t)w + 1);
                next = off + cnt;
            }
            cr_assert_eq(next, n);
        }
}
