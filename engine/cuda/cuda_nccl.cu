/* cuda_nccl.cu - NCCL communicators for device memory, the table's device collectives
 * (backend.h's eng_backend_coll_t, which the data-parallel layer reduces device gradients with):
 * bootstrap over the caller's host broadcast, collectives on a dedicated stream ordered after
 * the backend's stream by an event, a host wait that watches NCCL's asynchronous error and
 * aborts on failure or when nothing completes for the watchdog's time. It is not the host
 * transport (engine/comm) and keeps no state beyond each communicator. */
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include <nccl.h>

#include "engine/cuda/cuda_int.cuh"

struct eng_dev_comm {
    ncclComm_t comm;
    int rank, world;
    cudaStream_t stream;   /* the communicator's stream */
    cudaEvent_t ev_ready;  /* recorded on the backend stream before each op */
    int aborted;
};

/* kiln_err_t filled by hand: the library does not call into libkbase. */
static int set_err(kiln_err_t *err, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int set_err(kiln_err_t *err, int status, const char *fmt, ...)
{
    if (!err) return status;
    memset(err, 0, sizeof(*err));
    err->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    return status;
}

static int nccl_err(eng_dev_comm_t *c, kiln_err_t *err, const char *what, ncclResult_t r)
{
    const char *last = c && c->comm ? ncclGetLastError(c->comm) : NULL;
    return set_err(err, KILN_ECOMM, "nccl %s failed: %s%s%.120s", what, ncclGetErrorString(r),
                   last && *last ? ": " : "", last ? last : "");
}

static int cuda_err(kiln_err_t *err, const char *what, cudaError_t e)
{
    return set_err(err, KILN_EDEVICE, "%s failed: %s", what, cudaGetErrorString(e));
}

/* Same split as comm_shard_range(): the first n % world ranks own one element more. */
static void shard(size_t n, int rank, int world, size_t *off, size_t *cnt)
{
    size_t base = n / world, extra = n % world, r = (size_t)rank;
    *cnt = base + (r < extra ? 1 : 0);
    *off = r * base + (r < extra ? r : extra);
}

static void n_destroy(eng_dev_comm_t *c);

static int n_create(int rank, int world, eng_dev_bcast_fn bcast, void *bctx, eng_dev_comm_t **out,
                    kiln_err_t *err)
{
    *out = NULL;
    if (world < 1 || rank < 0 || rank >= world || !bcast)
        return set_err(err, KILN_EINVAL, "bad nccl group: rank %d of %d", rank, world);
    kc_ctx_t *k = kc_ctx();
    if (!k) return set_err(err, KILN_EUNAVAIL, "no CUDA device: %s", kc_unavailable_reason());
    eng_dev_comm_t *c = (eng_dev_comm_t *)calloc(1, sizeof(*c));
    if (!c) return set_err(err, KILN_ENOMEM, "out of memory");
    c->rank = rank;
    c->world = world;
    cudaError_t e;
    ncclResult_t r;
    int st;
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if ((e = cudaSetDevice(k->device)) != cudaSuccess) { st = cuda_err(err, "cudaSetDevice", e); goto fail; }
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        st = cuda_err(err, "cudaStreamCreate", e);
        goto fail;
    }
    if ((e = cudaEventCreateWithFlags(&c->ev_ready, cudaEventDisableTiming)) != cudaSuccess) {
        st = cuda_err(err, "cudaEventCreate", e);
        goto fail;
    }
    if (rank == 0 && (r = ncclGetUniqueId(&id)) != ncclSuccess) {
        st = nccl_err(c, err, "ncclGetUniqueId", r);
        /* the other ranks still wait in bcast: send them the zeroed id so they fail too */
        bcast(bctx, &id, sizeof(id), NULL);
        goto fail;
    }
    if ((st = bcast(bctx, &id, sizeof(id), err)) != 0) goto fail;
    {
        static const ncclUniqueId zero = {};
        if (memcmp(&id, &zero, sizeof(id)) == 0) {
            st = set_err(err, KILN_ECOMM, "rank 0 could not create the nccl id");
            goto fail;
        }
    }
    if ((r = ncclCommInitRank(&c->comm, world, id, rank)) != ncclSuccess) {
        c->comm = NULL;
        st = nccl_err(c, err, "ncclCommInitRank", r);
        goto fail;
    }
    *out = c;
    return 0;
fail:
    n_destroy(c);
    return st;
}

static void n_abort(eng_dev_comm_t *c)
{
    if (!c || !c->comm || c->aborted) return;
    c->aborted = 1;
    ncclResult_t r = ncclCommAbort(c->comm);
    if (r != ncclSuccess)
        fprintf(stderr, "kiln cuda backend: ncclCommAbort: %s\n", ncclGetErrorString(r));
    c->comm = NULL;
}

/* Orders our stream after everything queued so far on the backend's stream. */
static int before_op(eng_dev_comm_t *c, kiln_err_t *err)
{
    if (!c->comm) return set_err(err, KILN_ECOMM, "nccl communicator was aborted");
    kc_ctx_t *k = kc_ctx();
    cudaError_t e;
    if ((e = cudaEventRecord(c->ev_ready, k->stream)) != cudaSuccess) return cuda_err(err, "cudaEventRecord", e);
    if ((e = cudaStreamWaitEvent(c->stream, c->ev_ready, 0)) != cudaSuccess)
        return cuda_err(err, "cudaStreamWaitEvent", e);
    return 0;
}

static int n_allreduce(eng_dev_comm_t *c, float *buf, size_t n, int avg, kiln_err_t *err)
{
    int st = before_op(c, err);
    if (st || n == 0) return st;
    ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat32, avg ? ncclAvg : ncclSum, c->comm, c->stream);
    return r == ncclSuccess ? 0 : nccl_err(c, err, "ncclAllReduce", r);
}

static int n_reduce_scatter(eng_dev_comm_t *c, float *buf, size_t n, int avg, kiln_err_t *err)
{
    int st = before_op(c, err);
    if (st || n == 0) return st;
    ncclRedOp_t op = avg ? ncclAvg : ncclSum;
    ncclResult_t r;
    if (n % c->world == 0) { /* equal shards: NCCL's in-place reduce-scatter */
        size_t cnt = n / c->world;
        r = ncclReduceScatter(buf, buf + (size_t)c->rank * cnt, cnt, ncclFloat32, op, c->comm, c->stream);
        return r == ncclSuccess ? 0 : nccl_err(c, err, "ncclReduceScatter", r);
    }
    /* uneven shards: one reduce per shard to its owner, grouped into one launch */
    if ((r = ncclGroupStart()) != ncclSuccess) return nccl_err(c, err, "ncclGroupStart", r);
    for (int q = 0; q < c->world; q++) {
        size_t off, cnt;
        shard(n, q, c->world, &off, &cnt);
        if (cnt == 0) continue;
        r = ncclReduce(buf + off, buf + off, cnt, ncclFloat32, op, q, c->comm, c->stream);
        if (r != ncclSuccess) {
            ncclGroupEnd();
            return nccl_err(c, err, "ncclReduce", r);
        }
    }
    r = ncclGroupEnd();
    return r == ncclSuccess ? 0 : nccl_err(c, err, "ncclGroupEnd", r);
}

static int n_allgather(eng_dev_comm_t *c, float *buf, size_t n, kiln_err_t *err)
{
    int st = before_op(c, err);
    if (st || n == 0) return st;
    ncclResult_t r;
    if (n % c->world == 0) {
        size_t cnt = n / c->world;
        r = ncclAllGather(buf + (size_t)c->rank * cnt, buf, cnt, ncclFloat32, c->comm, c->stream);
        return r == ncclSuccess ? 0 : nccl_err(c, err, "ncclAllGather", r);
    }
    if ((r = ncclGroupStart()) != ncclSuccess) return nccl_err(c, err, "ncclGroupStart", r);
    for (int q = 0; q < c->world; q++) {
        size_t off, cnt;
        shard(n, q, c->world, &off, &cnt);
        if (cnt == 0) continue;
        r = ncclBroadcast(buf + off, buf + off, cnt, ncclFloat32, q, c->comm, c->stream);
        if (r != ncclSuccess) {
            ncclGroupEnd();
            return nccl_err(c, err, "ncclBroadcast", r);
        }
    }
    r = ncclGroupEnd();
    return r == ncclSuccess ? 0 : nccl_err(c, err, "ncclGroupEnd", r);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int n_wait(eng_dev_comm_t *c, double timeout_s, kiln_err_t *err)
{
    if (timeout_s <= 0) timeout_s = 300;
    double t0 = now_s();
    for (;;) {
        cudaError_t e = cudaStreamQuery(c->stream);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) {
            n_abort(c);
            return cuda_err(err, "nccl stream", e);
        }
        if (c->comm) {
            ncclResult_t a = ncclSuccess;
            ncclResult_t r = ncclCommGetAsyncError(c->comm, &a);
            if (r != ncclSuccess || a != ncclSuccess) {
                int st = nccl_err(c, err, "collective", r != ncclSuccess ? r : a);
                n_abort(c);
                return st;
            }
        }
        if (now_s() - t0 > timeout_s) {
            n_abort(c);
            return set_err(err, KILN_ETIMEDOUT,
                           "nccl operations did not finish within %.0f s (a peer may have died); "
                           "communicator aborted", timeout_s);
        }
        struct timespec ts = {0, 100000}; /* 100 us */
        nanosleep(&ts, NULL);
    }
}

static void n_destroy(eng_dev_comm_t *c)
{
    if (!c) return;
    if (c->comm) {
        kiln_err_t err;
        if (n_wait(c, 60, &err) != 0)
            fprintf(stderr, "kiln cuda backend: nccl teardown: %s\n", err.message);
    }
    if (c->comm) {
        ncclResult_t r = ncclCommDestroy(c->comm);
        if (r != ncclSuccess)
            fprintf(stderr, "kiln cuda backend: ncclCommDestroy: %s\n", ncclGetErrorString(r));
    }
    if (c->ev_ready) cudaEventDestroy(c->ev_ready);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
}

const eng_backend_coll_t kc_nccl = {
    n_create, n_destroy, n_allreduce, n_reduce_scatter, n_allgather, n_wait,
};
