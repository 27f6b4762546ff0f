/* test_comm.c - the comm module with real processes: each test forks its ranks, which rendezvous
 * over TCP and run collectives on the real libfabric providers (shm and tcp;ofi_rxm). Results are
 * checked bitwise against a serial reference that adds in ring order, and every rank reports a
 * hash of its output into shared memory so the parent checks that all ranks hold the same bytes.
 * Failure paths: a rank that never arrives, a rank killed mid-operation. */
#include "engine/bf16.h"
#include "engine/comm/comm.h"
#include "tests/common/harness.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAXR 8
#define MAXH 256

typedef struct rank_out {
    int rc;
    int wstatus;            /* the child's wait status */
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
    double watchdog_s;      /* 0: the default */
    double watchdog0_s;     /* rank 0's own, when > 0 (else watchdog_s) */
    size_t chunk_bytes;
    int skip_rank;          /* rank that is never started, or -1 */
    long stall_after;       /* comm_config_t's test_stall_after when > 0 */
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
            cc.watchdog_s = r == 0 && cfg->watchdog0_s > 0 ? cfg->watchdog0_s : cfg->watchdog_s;
            cc.chunk_bytes = cfg->chunk_bytes ? cfg->chunk_bytes : 16384;
            cc.depth = 3;
            if (cfg->stall_after > 0)
                cc.test_stall_after = cfg->stall_after;
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
        outs[r].wstatus = st;
    }
    return outs;
}

static void assert_all_ok(const run_cfg_t *cfg, const rank_out_t *o)
{
    for (int r = 0; r < cfg->world; r++) {
        cr_assert_eq(o[r].rc, 0, "rank %d of %d (%s) failed (rc %d): %s", r, cfg->world,
                     cfg->provider ? cfg->provider : "auto", o[r].rc, o[r].msg);
        cr_assert(WIFEXITED(o[r].wstatus) && WEXITSTATUS(o[r].wstatus) == 0,
                  "rank %d exited with status 0x%x", r, o[r].wstatus);
    }
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
 * started at rank k+1 and went around the ring, adding each rank's value in turn. On the bf16
 * wire each hop sends its partial sum rounded to bf16 (the next adds its own fp32 value), and the
 * owner of an all-reduce's shard rounds the result once. */
static float ref_ring(size_t n, size_t i, int world, uint32_t seed, comm_redop_t op, comm_wire_t wire,
                      bool allreduce)
{
    int k = 0;
    for (int r = 0; r < world; r++) {
        size_t off, cnt;
        comm_shard_range(n, r, world, &off, &cnt);
        if (i >= off && i < off + cnt)
            k = r;
    }
    bool bf16 = wire == COMM_WIRE_BF16 && world > 1;
    float acc = val((k + 1) % world, i, seed);
    for (int j = 2; j <= world; j++)
        acc = (bf16 ? eng_bf16_value(eng_bf16_round(acc)) : acc) + val((k + j) % world, i, seed);
    if (op == COMM_AVG && world > 1)
        acc = acc / (float)world;
    return bf16 && allreduce ? eng_bf16_value(eng_bf16_round(acc)) : acc;
}

static float ref_reduce(size_t n, size_t i, int world, uint32_t seed, comm_redop_t op)
{
    return ref_ring(n, i, world, seed, op, COMM_WIRE_FP32, false);
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
    float *buf = malloc(sizeof(float) * (big_n + 1)); /* bcast adds up to 3 bytes */
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

/* Runs body on world ranks over provider prov; every rank must pass, with the same outputs. */
static void on_ranks(const char *prov, int world, rank_body_t body)
{
    run_cfg_t cfg = {.world = world, .provider = prov, .skip_rank = -1};
    rank_out_t *o = run_ranks(&cfg, body, NULL);
    assert_all_ok(&cfg, o);
    const char *want = strcmp(prov, "shm") == 0 ? "shm" : "tcp;ofi_rxm";
    cr_assert_str_eq(o[0].provider, want);
    munmap(o, sizeof(rank_out_t) * MAXR);
}

static void collectives(const char *prov, int world) { on_ranks(prov, world, body_collectives); }

static int body_bf16_wire(comm_t *c, rank_out_t *o, void *arg)
{
    (void)arg;
    int W = comm_size(c), me = comm_rank(c);
    size_t ls[16];
    size_t nl = lengths(W, ls);
    float *buf = malloc(sizeof(float) * big_n);
    kiln_err_t err;
    CHECK(o, buf, "out of memory");
    for (size_t li = 0; li < nl; li++) {
        size_t n = ls[li], rounded = 0;
        uint32_t seed = (uint32_t)(li * 104729 + 3);
        for (int opi = 0; opi < 2; opi++) {
            comm_redop_t op = opi ? COMM_AVG : COMM_SUM;
            for (size_t i = 0; i < n; i++)
                buf[i] = val(me, i, seed);
            comm_req_t *req;
            CHECK(o, comm_allreduce_wire_start(c, buf, n, op, COMM_WIRE_BF16, &req, &err) == 0 &&
                         comm_wait(req, &err) == 0, "bf16 allreduce n=%zu: %s", n, err.message);
            for (size_t i = 0; i < n; i++) {
                float want = ref_ring(n, i, W, seed, op, COMM_WIRE_BF16, true);
                CHECK(o, memcmp(&buf[i], &want, 4) == 0, "bf16 allreduce n=%zu op=%d [%zu]: %.9g, want %.9g", n,
                      opi, i, buf[i], want);
                rounded += buf[i] != ref_reduce(n, i, W, seed, op);
            }
            out_hash(o, buf, n * 4);
            for (size_t i = 0; i < n; i++)
                buf[i] = val(me, i, seed);
            CHECK(o, comm_reduce_scatter_wire_start(c, buf, n, op, COMM_WIRE_BF16, &req, &err) == 0 &&
                         comm_wait(req, &err) == 0, "bf16 reduce_scatter n=%zu: %s", n, err.message);
            size_t off, cnt;
            comm_shard_range(n, me, W, &off, &cnt);
            for (size_t i = off; i < off + cnt; i++) {
                float want = ref_ring(n, i, W, seed, op, COMM_WIRE_BF16, false);
                CHECK(o, memcmp(&buf[i], &want, 4) == 0, "bf16 reduce_scatter n=%zu [%zu]: %.9g, want %.9g", n, i,
                      buf[i], want);
            }
        }
        /* the sums really travelled as bf16: most differ from the fp32 ring's */
        CHECK(o, W == 1 || n < 4096 || rounded > n, "bf16 allreduce n=%zu: only %zu of %zu results differ from fp32",
              n, rounded, 2 * n);
    }
    free(buf);
    return 0;
}

static void bf16_wire(const char *prov, int world) { on_ranks(prov, world, body_bf16_wire); }

Test(comm_shm, bf16_wire_world_1) { bf16_wire("shm", 1); }
Test(comm_shm, bf16_wire_world_2) { bf16_wire("shm", 2); }
Test(comm_shm, bf16_wire_world_3) { bf16_wire("shm", 3); }
Test(comm_tcp, bf16_wire_world_2) { bf16_wire("tcp", 2); }
Test(comm_tcp, bf16_wire_world_4) { bf16_wire("tcp", 4); }

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

/* ---- asynchronous all-reduce: several buckets in flight, waited in order ------------------ */

static int body_async(comm_t *c, rank_out_t *o, void *arg)
{
    (void)arg;
    int W = comm_size(c), me = comm_rank(c);
    enum { NB = 6 };
    size_t sizes[NB] = {100003, 5, 0, 65536, 33, 250001};
    float *b[NB];
    comm_req_t *req[NB];
    kiln_err_t err;
    for (int k = 0; k < NB; k++) {
        b[k] = malloc(sizeof(float) * (sizes[k] + 1));
        CHECK(o, b[k], "out of memory");
        for (size_t i = 0; i < sizes[k]; i++)
            b[k][i] = val(me, i, (uint32_t)(100 + k));
    }
    for (int k = 0; k < NB; k++)
        CHECK(o, comm_allreduce_start(c, b[k], sizes[k], k & 1 ? COMM_AVG : COMM_SUM, &req[k], &err) == 0,
              "start %d: %s", k, err.message);
    bool done = false;
    comm_test(req[NB - 1], &done); /* may or may not be done; must not block */
    for (int k = 0; k < NB; k++) {
        CHECK(o, comm_wait(req[k], &err) == 0, "wait %d: %s", k, err.message);
        for (size_t i = 0; i < sizes[k]; i++) {
            float want = ref_reduce(sizes[k], i, W, (uint32_t)(100 + k), k & 1 ? COMM_AVG : COMM_SUM);
            CHECK(o, memcmp(&b[k][i], &want, 4) == 0, "bucket %d [%zu]: %g want %g", k, i, b[k][i], want);
        }
        out_hash(o, b[k], sizes[k] * 4);
        free(b[k]);
    }
    /* comm_test reports completion without freeing */
    float x = (float)me;
    comm_req_t *r;
    CHECK(o, comm_allreduce_start(c, &x, 1, COMM_SUM, &r, &err) == 0, "start: %s", err.message);
    for (int spins = 0; !done || spins == 0; spins++) {
        comm_test(r, &done);
        CHECK(o, spins < 100000, "comm_test never reported completion");
        if (!done)
            usleep(100);
    }
    CHECK(o, comm_wait(r, &err) == 0, "wait: %s", err.message);
    CHECK(o, x == (float)(W * (W - 1) / 2), "sum of ranks %g", x);
    return 0;
}

static void async_buckets(const char *prov, int world)
{
    run_cfg_t cfg = {.world = world, .provider = prov, .skip_rank = -1, .chunk_bytes = 65536};
    rank_out_t *o = run_ranks(&cfg, body_async, NULL);
    assert_all_ok(&cfg, o);
    munmap(o, sizeof(rank_out_t) * MAXR);
}

Test(comm_shm, async_buckets_in_flight) { async_buckets("shm", 3); }
Test(comm_tcp, async_buckets_in_flight) { async_buckets("tcp", 4); }

/* ---- collectives queued on one buffer run in order; disjoint ones run at once -------------- */

static int body_queued(comm_t *c, rank_out_t *o, void *arg)
{
    (void)arg;
    int W = comm_size(c), me = comm_rank(c);
    const size_t n = 300007, m = 120001;
    float *buf = malloc(sizeof(float) * n), *other = malloc(sizeof(float) * m);
    float *want = malloc(sizeof(float) * n);
    kiln_err_t err;
    CHECK(o, buf && other && want, "out of memory");
    for (int round = 0; round < 3; round++) {
        uint32_t sa = 77u + (uint32_t)round, sc = 991u + (uint32_t)round;
        for (size_t i = 0; i < n; i++)
            buf[i] = val(me, i, sa);
        for (size_t i = 0; i < m; i++)
            other[i] = val(me, i, sc);
        /* A: all of buf; B: its middle third, averaged (starts only after A, which it overlaps:
         * averaging before summing gives other bits); C: a disjoint buffer (may run beside A);
         * D: all of buf again, after B */
        comm_req_t *ra, *rb, *rc, *rd;
        CHECK(o, comm_allreduce_start(c, buf, n, COMM_SUM, &ra, &err) == 0, "start A: %s", err.message);
        CHECK(o, comm_allreduce_start(c, buf + n / 3, n / 3, COMM_AVG, &rb, &err) == 0, "start B: %s", err.message);
        CHECK(o, comm_allreduce_start(c, other, m, COMM_AVG, &rc, &err) == 0, "start C: %s", err.message);
        CHECK(o, comm_reduce_scatter_start(c, buf, n, COMM_AVG, &rd, &err) == 0, "start D: %s", err.message);
        CHECK(o, comm_wait(rc, &err) == 0, "wait C: %s", err.message);
        CHECK(o, comm_wait(ra, &err) == 0 && comm_wait(rb, &err) == 0 && comm_wait(rd, &err) == 0,
              "wait A, B, D: %s", err.message);
        /* every rank holds the same values after A and after B, so B and D add W copies */
        for (size_t i = 0; i < n; i++) {
            float s = ref_reduce(n, i, W, sa, COMM_SUM);
            if (i >= n / 3 && i < n / 3 + n / 3) {
                float acc = s;
                for (int j = 1; j < W; j++)
                    acc = acc + s;
                s = acc / (float)W;
            }
            float acc = s;
            for (int j = 1; j < W; j++)
                acc = acc + s;
            want[i] = acc / (float)W;
        }
        size_t off, cnt;
        comm_shard_range(n, me, W, &off, &cnt);
        for (size_t i = off; i < off + cnt; i++)
            CHECK(o, memcmp(&buf[i], &want[i], 4) == 0, "round %d [%zu]: %.9g, want %.9g (out of order?)",
                  round, i, buf[i], want[i]);
        for (size_t i = 0; i < m; i++) {
            float w = ref_reduce(m, i, W, sc, COMM_AVG);
            CHECK(o, memcmp(&other[i], &w, 4) == 0, "round %d C [%zu]: %.9g, want %.9g", round, i, other[i], w);
        }
        out_hash(o, other, m * 4);
    }
    free(buf);
    free(other);
    free(want);
    return 0;
}

Test(comm_shm, queued_collectives_on_one_buffer_run_in_order)
{
    run_cfg_t cfg = {.world = 3, .provider = "shm", .skip_rank = -1, .chunk_bytes = 65536};
    rank_out_t *o = run_ranks(&cfg, body_queued, NULL);
    assert_all_ok(&cfg, o);
    munmap(o, sizeof(rank_out_t) * MAXR);
}

Test(comm_tcp, queued_collectives_on_one_buffer_run_in_order)
{
    /* 3 ranks: averaging over a power of two is exact scaling, which would hide B's order */
    run_cfg_t cfg = {.world = 3, .provider = "tcp", .skip_rank = -1, .chunk_bytes = 65536};
    rank_out_t *o = run_ranks(&cfg, body_queued, NULL);
    assert_all_ok(&cfg, o);
    munmap(o, sizeof(rank_out_t) * MAXR);
}

/* ---- eager chunks over tcp;ofi_rxm: data that arrives before its receive is posted ---------- */

typedef struct late_arg {
    size_t chunk;
    const char *limit; /* FI_OFI_RXM_EAGER_LIMIT the ranks must see after comm_create */
} late_arg_t;

/* Rank 1 comes late to every operation, so the chunks and messages sent to it are already there
 * when it posts its receives: eager ones wait in rxm's buffers, larger point-to-point messages
 * in its rendezvous; both must land intact and, for one tag, in the order sent. */
static int body_late(comm_t *c, rank_out_t *o, void *arg)
{
    const late_arg_t *a = arg;
    int W = comm_size(c), me = comm_rank(c);
    kiln_err_t err;
    const char *lim = getenv("FI_OFI_RXM_EAGER_LIMIT");
    CHECK(o, lim && strcmp(lim, a->limit) == 0, "FI_OFI_RXM_EAGER_LIMIT is %s, want %s",
          lim ? lim : "unset", a->limit);
    size_t n = 5 * a->chunk / sizeof(float) * (size_t)W + 7; /* five chunks and a bit a segment */
    float *buf = malloc(sizeof(float) * n);
    CHECK(o, buf, "out of memory");
    for (int round = 0; round < 2; round++) {
        uint32_t seed = 4242u + (uint32_t)round;
        for (size_t i = 0; i < n; i++)
            buf[i] = val(me, i, seed);
        if (me == 1)
            usleep(300000);
        CHECK(o, comm_allreduce(c, buf, n, COMM_SUM, &err) == 0, "allreduce: %s", err.message);
        for (size_t i = 0; i < n; i++) {
            float want = ref_reduce(n, i, W, seed, COMM_SUM);
            CHECK(o, memcmp(&buf[i], &want, 4) == 0, "late allreduce [%zu]: %.9g, want %.9g", i, buf[i],
                  want);
        }
        out_hash(o, buf, n * 4);
    }
    /* one tag, three sizes: eager, above the eager limit (rendezvous), eager again */
    size_t sz[3] = {1000, 3 * a->chunk + 17, a->chunk};
    unsigned char *m[3];
    for (int k = 0; k < 3; k++) {
        m[k] = malloc(sz[k]);
        CHECK(o, m[k], "out of memory");
    }
    if (me == 0) {
        comm_req_t *r[3];
        for (int k = 0; k < 3; k++) {
            for (size_t i = 0; i < sz[k]; i++)
                m[k][i] = (unsigned char)(i * 13 + (size_t)k * 101);
            CHECK(o, comm_send_start(c, m[k], sz[k], 1, 5, &r[k], &err) == 0, "send %d: %s", k, err.message);
        }
        for (int k = 0; k < 3; k++)
            CHECK(o, comm_wait(r[k], &err) == 0, "send wait %d: %s", k, err.message);
    } else if (me == 1) {
        usleep(300000);
        for (int k = 0; k < 3; k++) {
            size_t got = 0;
            memset(m[k], 0, sz[k]);
            CHECK(o, comm_recv(c, m[k], sz[k], 0, 5, &got, &err) == 0, "recv %d: %s", k, err.message);
            CHECK(o, got == sz[k], "message %d: %zu bytes, want %zu (out of order?)", k, got, sz[k]);
            for (size_t i = 0; i < sz[k]; i++)
                CHECK(o, m[k][i] == (unsigned char)(i * 13 + (size_t)k * 101), "message %d byte %zu", k, i);
        }
    }
    for (int k = 0; k < 3; k++)
        free(m[k]);
    free(buf);
    CHECK(o, comm_barrier(c, &err) == 0, "barrier: %s", err.message);
    return 0;
}

Test(comm_tcp, chunks_that_arrive_before_their_receive)
{
    late_arg_t a = {.chunk = 262144, .limit = "262144"}; /* the eager limit follows the chunk size */
    run_cfg_t cfg = {.world = 3, .provider = "tcp", .skip_rank = -1, .chunk_bytes = a.chunk};
    rank_out_t *o = run_ranks(&cfg, body_late, &a);
    assert_all_ok(&cfg, o);
    munmap(o, sizeof(rank_out_t) * MAXR);
}

Test(comm_tcp, an_operators_eager_limit_is_kept)
{
    cr_assert_eq(setenv("FI_OFI_RXM_EAGER_LIMIT", "65536", 1), 0); /* this test's process only */
    late_arg_t a = {.chunk = 262144, .limit = "65536"};
    run_cfg_t cfg = {.world = 2, .provider = "tcp", .skip_rank = -1, .chunk_bytes = a.chunk};
    rank_out_t *o = run_ranks(&cfg, body_late, &a);
    assert_all_ok(&cfg, o);
    munmap(o, sizeof(rank_out_t) * MAXR);
}

/* ---- point-to-point -------------------------------------------------------------------------- */

static int body_p2p(comm_t *c, rank_out_t *o, void *arg)
{
    int W = comm_size(c), me = comm_rank(c);
    int right = (me + 1) % W, left = (me + W - 1) % W;
    kiln_err_t err;
    enum { BIG = 3 << 20 };
    unsigned char *big = malloc(BIG), *in = malloc(BIG);
    CHECK(o, big && in, "out of memory");
    for (size_t i = 0; i < BIG; i++)
        big[i] = (unsigned char)(i * 7 + (size_t)me);
    /* Every rank sends to its right and receives from its left at once (no deadlock with async). */
    comm_req_t *rs, *rr;
    size_t got = 0;
    CHECK(o, comm_recv_start(c, in, BIG, left, 7, &got, &rr, &err) == 0, "recv: %s", err.message);
    CHECK(o, comm_send_start(c, big, BIG, right, 7, &rs, &err) == 0, "send: %s", err.message);
    CHECK(o, comm_wait(rs, &err) == 0, "wait send: %s", err.message);
    CHECK(o, comm_wait(rr, &err) == 0, "wait recv: %s", err.message);
    CHECK(o, got == BIG, "received %zu bytes", got);
    for (size_t i = 0; i < BIG; i++)
        CHECK(o, in[i] == (unsigned char)(i * 7 + (size_t)left), "byte %zu", i);
    /* Tags select messages: rank 0 sends tags 1, 2, 2 to rank 1, which receives 2 first. */
    if (me == 0) {
        int a = 101, b = 202, d = 203;
        comm_req_t *r1, *r2, *r3;
        CHECK(o, comm_send_start(c, &a, sizeof(a), 1, 1, &r1, &err) == 0, "send: %s", err.message);
        CHECK(o, comm_send_start(c, &b, sizeof(b), 1, 2, &r2, &err) == 0, "send: %s", err.message);
        CHECK(o, comm_send_start(c, &d, sizeof(d), 1, 2, &r3, &err) == 0, "send: %s", err.message);
        CHECK(o, comm_wait(r1, &err) == 0 && comm_wait(r2, &err) == 0 && comm_wait(r3, &err) == 0,
              "send wait: %s", err.message);
        /* an oversize message is refused by the receiver (shm only: tcp;ofi_rxm drops the
         * connection when a message overruns a posted buffer) */
        char eight[8] = "1234567";
        if (*(const int *)arg)
            CHECK(o, comm_send(c, eight, sizeof(eight), 1, 9, &err) == 0, "send 8: %s", err.message);
    } else if (me == 1) {
        int x = 0, y = 0, z = 0;
        CHECK(o, comm_recv(c, &x, sizeof(x), 0, 2, NULL, &err) == 0, "recv 2: %s", err.message);
        CHECK(o, comm_recv(c, &y, sizeof(y), 0, 1, NULL, &err) == 0, "recv 1: %s", err.message);
        CHECK(o, comm_recv(c, &z, sizeof(z), 0, 2, NULL, &err) == 0, "recv 2b: %s", err.message);
        CHECK(o, x == 202 && y == 101 && z == 203, "tags mixed up: %d %d %d", x, y, z);
        char four[4];
        if (*(const int *)arg) {
            int rc = comm_recv(c, four, sizeof(four), 0, 9, NULL, &err);
            CHECK(o, rc == KILN_ETOOBIG, "oversize receive gave %d (%s)", rc, err.message);
        }
    }
    CHECK(o, comm_send(c, big, 1, me, 1, &err) == KILN_EINVAL, "send to self accepted");
    /* the group still works afterwards */
    CHECK(o, comm_barrier(c, &err) == 0, "barrier: %s", err.message);
    free(big);
    free(in);
    return 0;
}

Test(comm_shm, send_recv_with_tags)
{
    run_cfg_t cfg = {.world = 3, .provider = "shm", .skip_rank = -1};
    int oversize = 1;
    rank_out_t *o = run_ranks(&cfg, body_p2p, &oversize);
    assert_all_ok(&cfg, o);
}

Test(comm_tcp, send_recv_with_tags)
{
    run_cfg_t cfg = {.world = 3, .provider = "tcp", .skip_rank = -1};
    int oversize = 0;
    rank_out_t *o = run_ranks(&cfg, body_p2p, &oversize);
    assert_all_ok(&cfg, o);
}

/* ---- comm_split ------------------------------------------------------------------------------- */

static int body_split(comm_t *c, rank_out_t *o, void *arg)
{
    (void)arg;
    int me = comm_rank(c);
    kiln_err_t err;
    /* Two groups by parity, ordered by descending rank; rank 4 stays out of the second split. */
    comm_t *g = NULL, *h = NULL;
    CHECK(o, comm_split(c, me % 2, -me, &g, &err) == 0, "split: %s", err.message);
    CHECK(o, g, "no group");
    int want_size = me % 2 ? 2 : 3;
    CHECK(o, comm_size(g) == want_size, "group size %d, want %d", comm_size(g), want_size);
    int want_rank = me % 2 ? (me == 3 ? 0 : 1) : (me == 4 ? 0 : me == 2 ? 1 : 2);
    CHECK(o, comm_rank(g) == want_rank, "group rank %d, want %d", comm_rank(g), want_rank);
    CHECK(o, comm_split(c, me == 4 ? COMM_UNDEFINED : 0, me, &h, &err) == 0, "split 2: %s", err.message);
    CHECK(o, (me == 4) == (h == NULL), "COMM_UNDEFINED handling");
    /* Collectives in the subgroups (interleaved with the world) see only their members. */
    float x = (float)(me + 1);
    CHECK(o, comm_allreduce(g, &x, 1, COMM_SUM, &err) == 0, "group allreduce: %s", err.message);
    CHECK(o, x == (me % 2 ? 2.0f + 4.0f : 1.0f + 3.0f + 5.0f), "group sum %g", x);
    float y = 1.0f;
    CHECK(o, comm_allreduce(c, &y, 1, COMM_SUM, &err) == 0, "world allreduce: %s", err.message);
    CHECK(o, y == 5.0f, "world sum %g", y);
    if (h) {
        float z[10];
        for (int i = 0; i < 10; i++)
            z[i] = (float)(me * 10 + i);
        CHECK(o, comm_allreduce(h, z, 10, COMM_AVG, &err) == 0, "h allreduce: %s", err.message);
        for (int i = 0; i < 10; i++)
            CHECK(o, z[i] == (float)(15 + i), "h avg [%d] %g", i, z[i]);
    }
    /* point-to-point inside a group uses group ranks */
    int token = me;
    if (comm_size(g) > 1) {
        int gl = (comm_rank(g) + comm_size(g) - 1) % comm_size(g), gr = (comm_rank(g) + 1) % comm_size(g);
        comm_req_t *rr, *rs;
        int got = -1;
        CHECK(o, comm_recv_start(g, &got, sizeof(got), gl, 5, NULL, &rr, &err) == 0, "recv: %s", err.message);
        CHECK(o, comm_send_start(g, &token, sizeof(token), gr, 5, &rs, &err) == 0, "send: %s", err.message);
        CHECK(o, comm_wait(rs, &err) == 0 && comm_wait(rr, &err) == 0, "p2p: %s", err.message);
        int want_left = me % 2 ? (me == 3 ? 1 : 3) : (me == 4 ? 0 : me == 2 ? 4 : 2);
        CHECK(o, got == want_left, "got %d from group left, want %d", got, want_left);
    }
    comm_destroy(h);
    comm_destroy(g);
    return 0;
}

Test(comm_shm, split_groups)
{
    run_cfg_t cfg = {.world = 5, .provider = "shm", .skip_rank = -1};
    rank_out_t *o = run_ranks(&cfg, body_split, NULL);
    assert_all_ok(&cfg, o);
}

Test(comm_tcp, split_groups)
{
    run_cfg_t cfg = {.world = 5, .provider = "tcp", .skip_rank = -1};
    rank_out_t *o = run_ranks(&cfg, body_split, NULL);
    assert_all_ok(&cfg, o);
}

/* ---- provider choice ------------------------------------------------------------------------ */

static int body_sum(comm_t *c, rank_out_t *o, void *arg)
{
    (void)arg;
    kiln_err_t err;
    float x[3] = {1, 2, 3};
    CHECK(o, comm_allreduce(c, x, 3, COMM_SUM, &err) == 0, "allreduce: %s", err.message);
    CHECK(o, x[2] == 3.0f * (float)comm_size(c), "sum %g", x[2]);
    return 0;
}

Test(comm, provider_is_shm_on_one_host_and_tcp_across_hosts)
{
    run_cfg_t one = {.world = 3, .skip_rank = -1, .hosts = {"node-a", "node-a", "node-a"}};
    rank_out_t *o = run_ranks(&one, body_sum, NULL);
    assert_all_ok(&one, o);
    for (int r = 0; r < 3; r++)
        cr_assert_str_eq(o[r].provider, "shm");
    run_cfg_t two = {.world = 3, .skip_rank = -1, .hosts = {"node-a", "node-b", "node-a"}};
    o = run_ranks(&two, body_sum, NULL);
    assert_all_ok(&two, o);
    for (int r = 0; r < 3; r++)
        cr_assert_str_eq(o[r].provider, "tcp;ofi_rxm");
    /* forcing shm across hosts is refused with a reason, on every rank */
    run_cfg_t bad = {.world = 2, .provider = "shm", .skip_rank = -1, .hosts = {"node-a", "node-b"}};
    o = run_ranks(&bad, body_sum, NULL);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(o[r].status, KILN_EINVAL, "rank %d: %d %s", r, o[r].status, o[r].msg);
        cr_assert(strstr(o[r].msg, "provider shm needs every rank on one host"), "rank %d: %s", r, o[r].msg);
    }
}

Test(comm, config_from_env)
{
    setenv("KILN_RANK", "2", 1);
    setenv("KILN_WORLD_SIZE", "4", 1);
    setenv("KILN_LOCAL_RANK", "0", 1);
    setenv("KILN_MASTER_ADDR", "10.1.2.3", 1);
    setenv("KILN_MASTER_PORT", "29999", 1);
    comm_config_t cfg;
    comm_config_init(&cfg);
    cfg.provider = "tcp"; /* the program's settings stay */
    cfg.timeout_s = 30;
    kiln_err_t err;
    cr_assert_eq(comm_config_from_env(&cfg, &err), 0);
    cr_assert_eq(cfg.rank, 2);
    cr_assert_eq(cfg.world_size, 4);
    cr_assert_str_eq(cfg.master_addr, "10.1.2.3");
    cr_assert_eq(cfg.master_port, 29999);
    cr_assert_str_eq(cfg.provider, "tcp");
    cr_assert_eq(cfg.timeout_s, 30.0);
    setenv("KILN_MASTER_PORT", "99999", 1);
    cr_assert_eq(comm_config_from_env(&cfg, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "KILN_MASTER_PORT"), "%s", err.message);
    comm_config_init(&cfg);
    cfg.rank = 3;
    cfg.world_size = 2;
    comm_t *c = NULL;
    cr_assert_eq(comm_create(&cfg, &c, &err), KILN_EINVAL);
    cr_assert_null(c);
}

/* ---- failures ---------------------------------------------------------------------------------- */

Test(comm, rank_that_never_arrives_times_out_with_a_clear_error)
{
    run_cfg_t cfg = {.world = 4, .provider = "tcp", .timeout_s = 2, .skip_rank = 3};
    double t0 = kiln_mono_s();
    rank_out_t *o = run_ranks(&cfg, body_sum, NULL);
    double took = kiln_mono_s() - t0;
    for (int r = 0; r < 3; r++) {
        cr_assert_eq(o[r].status, KILN_ETIMEDOUT, "rank %d: status %d (%s)", r, o[r].status, o[r].msg);
        cr_assert_str_eq(o[r].msg, "rendezvous timed out after 2 s: 1 of 4 ranks never arrived (missing: rank 3)",
                         "rank %d: %s", r, o[r].msg);
    }
    cr_assert(took < 8, "took %.1f s", took);
}

Test(comm, missing_rank_0_times_out_naming_it)
{
    run_cfg_t cfg = {.world = 2, .timeout_s = 1, .skip_rank = 0};
    rank_out_t *o = run_ranks(&cfg, body_sum, NULL);
    cr_assert_eq(o[1].status, KILN_ETIMEDOUT, "%d %s", o[1].status, o[1].msg);
    cr_assert(strstr(o[1].msg, "rendezvous timed out after 1 s: could not reach rank 0 at 127.0.0.1:"),
              "%s", o[1].msg);
}

/* The victim starts a large all-reduce and is killed while it is in flight, once every peer is
 * inside the same all-reduce (flags in shared memory); the peers must fail within seconds naming
 * it. */
typedef struct victim_arg {
    int victim;
    volatile int entered[MAXR];
} victim_arg_t;

static int body_victim(comm_t *c, rank_out_t *o, void *arg)
{
    victim_arg_t *va = arg;
    int me = comm_rank(c), W = comm_size(c);
    kiln_err_t err;
    size_t n = 8u << 20;
    float *buf = calloc(n, sizeof(float));
    CHECK(o, buf, "out of memory");
    CHECK(o, comm_allreduce(c, buf, 1000, COMM_SUM, &err) == 0, "warm-up: %s", err.message);
    if (me == va->victim) {
        comm_req_t *r;
        comm_allreduce_start(c, buf, n, COMM_SUM, &r, &err);
        for (int k = 0; k < W; k++)
            while (k != me && !va->entered[k])
                usleep(1000);
        usleep(20000);
        raise(SIGKILL);
    }
    va->entered[me] = 1;
    double t0 = kiln_mono_s();
    int rc = comm_allreduce(c, buf, n, COMM_SUM, &err);
    o->elapsed_s = kiln_mono_s() - t0;
    o->status = rc;
    snprintf(o->msg, sizeof(o->msg), "%s", rc ? err.message : "allreduce succeeded");
    /* later operations fail at once with the same reason */
    float x = 1;
    int rc2 = comm_allreduce(c, &x, 1, COMM_SUM, &err);
    free(buf);
    return rc == KILN_ECOMM && rc2 == KILN_ECOMM ? 0 : 1;
}

static void killed_rank(const char *prov, int world, int victim, long stall_after)
{
    run_cfg_t cfg = {.world = world, .provider = prov, .skip_rank = -1, .chunk_bytes = 1 << 20,
                     .stall_after = stall_after};
    victim_arg_t *va = mmap(NULL, sizeof(*va), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(va != MAP_FAILED);
    memset((void *)va, 0, sizeof(*va));
    va->victim = victim;
    rank_out_t *o = run_ranks(&cfg, body_victim, va);
    char want[64];
    snprintf(want, sizeof(want), "rank %d (host ", victim);
    for (int r = 0; r < world; r++) {
        if (r == victim)
            continue;
        cr_assert_eq(o[r].rc, 0, "rank %d: rc %d status %d wstatus 0x%x: %s", r, o[r].rc, o[r].status, o[r].wstatus, o[r].msg);
        cr_assert(strstr(o[r].msg, want) && strstr(o[r].msg, "disconnected"), "rank %d: %s", r, o[r].msg);
        cr_assert(o[r].elapsed_s < 5.0, "rank %d took %.2f s to notice", r, o[r].elapsed_s);
        cr_assert(WIFEXITED(o[r].wstatus) && WEXITSTATUS(o[r].wstatus) == 0,
                  "rank %d exited with status 0x%x", r, o[r].wstatus);
    }
    cr_assert(WIFSIGNALED(o[victim].wstatus), "the victim was not killed");
}

Test(comm_shm, killed_rank_fails_peers_fast) { killed_rank("shm", 3, 2, 0); }

/* A peer killed while holding a lock in shm's shared memory can leave the survivors'
 * communication threads spinning inside the provider for good. Simulated here by stopping every
 * rank's thread at the victim's big all-reduce: the waiting callers must still notice the death
 * through the control connections, name the rank, and exit without hanging on the thread. */
Test(comm_shm, killed_rank_is_named_even_when_the_progress_thread_is_stuck, .timeout = 60)
{
    killed_rank("shm", 3, 2, 1);
}
Test(comm_tcp, killed_rank_fails_peers_fast) { killed_rank("tcp", 3, 1, 0); }

/* A rank that stops (SIGSTOP) stays connected, so nothing reports a death: the watchdog fails
 * the operations that wait on it after KILN_COMM_WATCHDOG_S without progress, naming it. Rank 0
 * waits on its left neighbour, the stopped last rank, in an all-reduce, and on the same rank in
 * a receive. The others (in a ring of 3) wait on whoever they receive from: their watchdog names
 * that rank, unless rank 0 has already given up and left, which they see as its disconnection:
 * rank 0's watchdog is the shorter (2 s against 4 s), so rank 1, which waits on rank 0, cannot
 * give up first and be seen leaving.
 * The survivors kill the stopped rank when they are done. */
typedef struct stall_arg {
    int victim;
    volatile pid_t victim_pid;
    volatile int entered[MAXR];
    int p2p;
} stall_arg_t;

static int body_stall(comm_t *c, rank_out_t *o, void *arg)
{
    stall_arg_t *sa = arg;
    int me = comm_rank(c), W = comm_size(c);
    kiln_err_t err;
    float buf[1024] = {0};
    CHECK(o, comm_allreduce(c, buf, 1024, COMM_SUM, &err) == 0, "warm-up: %s", err.message);
    if (me == sa->victim) {
        sa->victim_pid = getpid();
        for (int k = 0; k < W; k++)
            while (k != me && !sa->entered[k])
                usleep(1000);
        raise(SIGSTOP);
        return 0;
    }
    sa->entered[me] = 1;
    double t0 = kiln_mono_s();
    int rc = sa->p2p && me == 0 ? comm_recv(c, buf, sizeof(buf), sa->victim, 7, NULL, &err)
                                : comm_allreduce(c, buf, 1024, COMM_SUM, &err);
    o->elapsed_s = kiln_mono_s() - t0;
    o->status = rc;
    snprintf(o->msg, sizeof(o->msg), "%s", rc ? err.message : "succeeded");
    while (!sa->victim_pid)
        usleep(1000);
    kill(sa->victim_pid, SIGKILL);
    return rc == KILN_ETIMEDOUT || (me != 0 && rc == KILN_ECOMM) ? 0 : 1;
}

static void stalled_rank(const char *prov, int world, bool p2p)
{
    run_cfg_t cfg = {.world = world, .provider = prov, .skip_rank = -1, .watchdog_s = 4, .watchdog0_s = 2};
    stall_arg_t *sa = mmap(NULL, sizeof(*sa), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(sa != MAP_FAILED);
    memset((void *)sa, 0, sizeof(*sa));
    sa->victim = world - 1;
    sa->p2p = p2p;
    rank_out_t *o = run_ranks(&cfg, body_stall, sa);
    char want[64];
    snprintf(want, sizeof(want), "waiting on rank %d (host ", world - 1);
    cr_assert_eq(o[0].status, KILN_ETIMEDOUT, "rank 0: status %d: %s", o[0].status, o[0].msg);
    cr_assert(strstr(o[0].msg, want) && strstr(o[0].msg, "no progress for") &&
                  strstr(o[0].msg, p2p ? "in a receive" : "in an all-reduce"),
              "rank 0: %s", o[0].msg);
    for (int r = 0; r < world - 1; r++) {
        cr_assert_eq(o[r].rc, 0, "rank %d: rc %d status %d: %s", r, o[r].rc, o[r].status, o[r].msg);
        cr_assert(o[r].elapsed_s >= (r == 0 ? 1.9 : 0) && o[r].elapsed_s < 8, "rank %d gave up after %.2f s", r,
                  o[r].elapsed_s);
        fprintf(stderr, "%s, %d ranks: rank %d after %.2f s: %s\n", prov, world, r, o[r].elapsed_s, o[r].msg);
    }
}

Test(comm_shm, stalled_rank_trips_the_watchdog, .timeout = 60) { stalled_rank("shm", 2, false); }
Test(comm_tcp, stalled_rank_trips_the_watchdog, .timeout = 60) { stalled_rank("tcp", 3, false); }
Test(comm_shm, stalled_peer_of_a_receive_trips_the_watchdog, .timeout = 60) { stalled_rank("shm", 2, true); }
Test(comm_tcp, killed_rank_0_fails_peers_fast) { killed_rank("tcp", 3, 0, 0); }

/* ---- point-to-point beside a running collective; an idle engine uses no CPU ----------------- */

static double cpu_s(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

static int body_overlap(comm_t *c, rank_out_t *o, void *arg)
{
    (void)arg;
    int me = comm_rank(c), W = comm_size(c);
    kiln_err_t err;
    size_t n = 1u << 20;
    float *g = malloc(n * sizeof(float));
    CHECK(o, g, "out of memory");
    for (size_t i = 0; i < n; i++)
        g[i] = val(me, i, 5);
    /* A pipeline stage's activations travel while the data-parallel all-reduce runs. */
    comm_req_t *ar, *p2p;
    int token = 1000 + me, got = -1;
    CHECK(o, comm_allreduce_start(c, g, n, COMM_SUM, &ar, &err) == 0, "start: %s", err.message);
    if (me == 0)
        CHECK(o, comm_send_start(c, &token, sizeof(token), W - 1, 77, &p2p, &err) == 0, "send: %s", err.message);
    else if (me == W - 1)
        CHECK(o, comm_recv_start(c, &got, sizeof(got), 0, 77, NULL, &p2p, &err) == 0, "recv: %s", err.message);
    else
        p2p = NULL;
    CHECK(o, comm_wait(p2p, &err) == 0, "p2p: %s", err.message);
    CHECK(o, me != W - 1 || got == 1000, "got %d", got);
    CHECK(o, comm_wait(ar, &err) == 0, "allreduce: %s", err.message);
    for (size_t i = 0; i < n; i += 997) {
        float want = ref_reduce(n, i, W, 5, COMM_SUM);
        CHECK(o, memcmp(&g[i], &want, 4) == 0, "[%zu] %g want %g", i, g[i], want);
    }
    free(g);
    /* idle: the communication thread sleeps instead of spinning */
    double c0 = cpu_s(), t0 = kiln_mono_s();
    usleep(300000);
    double frac = (cpu_s() - c0) / (kiln_mono_s() - t0);
    CHECK(o, frac < 0.2, "an idle engine used %.0f%% of a core", frac * 100);
    CHECK(o, comm_barrier(c, &err) == 0, "barrier: %s", err.message);
    return 0;
}

Test(comm_shm, p2p_beside_allreduce_and_idle_cpu)
{
    run_cfg_t cfg = {.world = 3, .provider = "shm", .skip_rank = -1, .chunk_bytes = 65536};
    rank_out_t *o = run_ranks(&cfg, body_overlap, NULL);
    assert_all_ok(&cfg, o);
}

Test(comm_tcp, p2p_beside_allreduce_and_idle_cpu)
{
    run_cfg_t cfg = {.world = 3, .provider = "tcp", .skip_rank = -1, .chunk_bytes = 65536};
    rank_out_t *o = run_ranks(&cfg, body_overlap, NULL);
    assert_all_ok(&cfg, o);
}

/* ---- rendezvous refuses strangers ------------------------------------------------------------- */

Test(comm, rank_with_another_world_size_or_job_is_refused)
{
    int port = th_free_port();
    pid_t kid[2];
    int pipefd[2];
    cr_assert_eq(pipe(pipefd), 0);
    for (int k = 0; k < 2; k++) {
        kid[k] = fork();
        cr_assert(kid[k] >= 0);
        if (kid[k] == 0) {
            comm_config_t cc;
            comm_config_init(&cc);
            cc.master_port = port;
            cc.timeout_s = 2;
            cc.world_size = 2;
            cc.rank = k;
            cc.job_id = "job-a";
            if (k == 1)
                cc.world_size = 3; /* a stray rank of a different-sized world */
            kiln_err_t err;
            comm_t *c = NULL;
            int rc = comm_create(&cc, &c, &err);
            char line[300];
            int len = snprintf(line, sizeof(line), "%d %d %s\n", k, rc, rc ? err.message : "ok");
            if (write(pipefd[1], line, (size_t)len) < 0)
                _exit(3);
            comm_destroy(c);
            _exit(0);
        }
    }
    close(pipefd[1]);
    for (int k = 0; k < 2; k++)
        waitpid(kid[k], NULL, 0);
    char buf[1024] = "";
    ssize_t n = read(pipefd[0], buf, sizeof(buf) - 1);
    cr_assert(n > 0);
    buf[n] = '\0';
    cr_assert(strstr(buf, "1 -1 rank 1 expects a world of 3 ranks, rank 0 has 2"), "%s", buf);
    cr_assert(strstr(buf, "0 -9 rendezvous timed out after 2 s: 1 of 2 ranks never arrived (missing: rank 1)"),
              "%s", buf);
}
