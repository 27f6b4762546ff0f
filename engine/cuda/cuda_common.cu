/* cuda_common.cu - the CUDA backend's device context: picking the GPU, the stream and library
 * handles, the sticky error every checked call reports into, tracked allocations (for the
 * gpu_mem_mb / gpu_mem_peak_mb metrics) and the grow-only op scratch.
 * The library never calls into libkbase (the executable need not export it): kiln_err_t is filled
 * by hand. It holds no kernels; those are in cuda_kernels.cu, cuda_attention.cu and cuda_gemm.cu. */
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "engine/cuda/cuda_int.cuh"

static kc_ctx_t g_ctx;
static std::once_flag g_once;
static char g_unavail[256] = "not initialised";

/* Sticky error and tracked memory share one lock (both are touched from any thread). */
static std::mutex g_lock;
static int g_status;
static char g_msg[512];
static std::unordered_map<void *, size_t> *g_allocs;
static size_t g_tracked, g_peak;

void kc_fail(int status, const char *file, int line, const char *fmt, ...)
{
    char buf[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    std::lock_guard<std::mutex> lk(g_lock);
    if (g_status == 0) {
        g_status = status;
        const char *base = strrchr(file, '/');
        snprintf(g_msg, sizeof(g_msg), "%s (%s:%d)", buf, base ? base + 1 : file, line);
        fprintf(stderr, "kiln cuda backend: %s\n", g_msg);
    }
}

static int env_int(const char *name, int dflt)
{
    const char *s = getenv(name);
    if (!s || !*s) return dflt;
    return atoi(s);
}

static void ctx_init(void)
{
    kc_ctx_t *c = &g_ctx;
    int count = 0; /* cudaGetDeviceCount leaves it untouched when it fails (no driver) */
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        snprintf(g_unavail, sizeof(g_unavail), "cudaGetDeviceCount: %s (error %d)",
                 cudaGetErrorString(e), (int)e);
        cudaGetLastError(); /* clear it so it does not surface in a later check */
        return;
    }
    if (count <= 0) {
        snprintf(g_unavail, sizeof(g_unavail), "cudaGetDeviceCount reports 0 devices");
        return;
    }
    /* Which GPU: KILN_CUDA_DEVICE, else the only visible one (the agent narrows
     * CUDA_VISIBLE_DEVICES per rank), else KILN_DEVICE_ID / KILN_LOCAL_RANK modulo the count. */
    int dev = env_int("KILN_CUDA_DEVICE", -1);
    if (dev < 0) {
        if (count == 1) dev = 0;
        else {
            int id = env_int("KILN_DEVICE_ID", -1);
            dev = (id >= 0 && id < count) ? id : env_int("KILN_LOCAL_RANK", 0) % count;
        }
    }
    if (dev >= count) {
        snprintf(g_unavail, sizeof(g_unavail), "device %d requested but only %d visible", dev,
                 count);
        return;
    }
    cudaDeviceProp prop;
    if ((e = cudaSetDevice(dev)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess ||
        (e = cudaStreamCreate(&c->stream)) != cudaSuccess) {
        snprintf(g_unavail, sizeof(g_unavail), "device %d: %s", dev, cudaGetErrorString(e));
        return;
    }
    if (prop.major < 7 || (prop.major == 7 && prop.minor < 5)) {
        snprintf(g_unavail, sizeof(g_unavail),
                 "device %d (%.120s) has compute capability %d.%d; kiln needs 7.5 or newer", dev,
                 prop.name, prop.major, prop.minor);
        return;
    }
    cublasStatus_t s;
    if ((s = cublasCreate(&c->cublas)) != CUBLAS_STATUS_SUCCESS ||
        (s = cublasSetStream(c->cublas, c->stream)) != CUBLAS_STATUS_SUCCESS ||
        (s = cublasLtCreate(&c->lt)) != CUBLAS_STATUS_SUCCESS) {
        snprintf(g_unavail, sizeof(g_unavail), "cuBLAS initialisation: %s",
                 cublasGetStatusString(s));
        return;
    }
    /* One workspace bound to the one stream: cuBLAS results are then reproducible run to run. */
    c->lt_ws_bytes = 32u << 20;
    if ((e = cudaMalloc(&c->lt_ws, c->lt_ws_bytes)) != cudaSuccess) {
        snprintf(g_unavail, sizeof(g_unavail), "cublasLt workspace: %s", cudaGetErrorString(e));
        return;
    }
    if ((s = cublasSetWorkspace(c->cublas, c->lt_ws, c->lt_ws_bytes)) != CUBLAS_STATUS_SUCCESS) {
        snprintf(g_unavail, sizeof(g_unavail), "cublasSetWorkspace: %s",
                 cublasGetStatusString(s));
        return;
    }
    c->device = dev;
    c->sm_count = prop.multiProcessorCount;
    c->cc_major = prop.major;
    c->cc_minor = prop.minor;
    c->deterministic = env_int("KILN_CUDA_DETERMINISTIC", 1) != 0;
    const char *mm = getenv("KILN_CUDA_MATMUL");
    c->mm_mode = mm && strcmp(mm, "tf32") == 0 ? KC_MM_TF32 : KC_MM_FP32;
    c->use_lt = env_int("KILN_CUDA_NO_LT", 0) == 0;
    g_allocs = new std::unordered_map<void *, size_t>();
    g_unavail[0] = '\0';
    c->ready = 1;
}

kc_ctx_t *kc_ctx(void)
{
    std::call_once(g_once, ctx_init);
    if (!g_ctx.ready) return NULL;
    /* The current device is per host thread: a thread other than the initialising one (a
     * communication or pipeline thread) must select it before its first launch. */
    static thread_local int t_device_set;
    if (!t_device_set) {
        cudaError_t e = cudaSetDevice(g_ctx.device);
        if (e != cudaSuccess)
            kc_fail(KILN_EDEVICE, __FILE__, __LINE__, "cudaSetDevice(%d) failed: %s",
                    g_ctx.device, cudaGetErrorString(e));
        t_device_set = 1;
    }
    return &g_ctx;
}

const char *kc_unavailable_reason(void)
{
    kc_ctx();
    return g_unavail;
}

int kc_status(kiln_err_t *err)
{
    kc_ctx_t *c = kc_ctx();
    if (!c) {
        if (err) {
            memset(err, 0, sizeof(*err));
            err->status = KILN_EUNAVAIL;
            snprintf(err->message, sizeof(err->message), "cuda backend unavailable: %.200s",
                     g_unavail);
        }
        return KILN_EUNAVAIL;
    }
    /* Surface asynchronous faults of work already queued. */
    KC_CUDA(cudaStreamSynchronize(c->stream));
    std::lock_guard<std::mutex> lk(g_lock);
    int st = g_status;
    if (st && err) {
        memset(err, 0, sizeof(*err));
        err->status = st;
        snprintf(err->message, sizeof(err->message), "cuda backend: %.230s", g_msg);
    }
    return st;
}

void *kc_malloc(size_t bytes)
{
    kc_ctx_t *c = kc_ctx();
    if (!c) return NULL;
    size_t n = bytes ? (bytes + 255) / 256 * 256 : 256;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, n);
    if (e != cudaSuccess) {
        /* Out of memory is an answer, not a bug: report it and let the caller see NULL. */
        kc_fail(e == cudaErrorMemoryAllocation ? KILN_ENOMEM : KILN_EDEVICE, __FILE__, __LINE__,
                "cudaMalloc(%zu bytes) failed: %s", n, cudaGetErrorString(e));
        cudaGetLastError();
        return NULL;
    }
    e = cudaMemsetAsync(p, 0, n, c->stream);
    if (e != cudaSuccess) {
        kc_fail(KILN_EDEVICE, __FILE__, __LINE__, "cudaMemsetAsync failed: %s",
                cudaGetErrorString(e));
        cudaFree(p);
        return NULL;
    }
    std::lock_guard<std::mutex> lk(g_lock);
    (*g_allocs)[p] = n;
    g_tracked += n;
    if (g_tracked > g_peak) g_peak = g_tracked;
    return p;
}

void kc_mfree(void *p)
{
    kc_ctx_t *c = kc_ctx();
    if (!p || !c) return;
    {
        std::lock_guard<std::mutex> lk(g_lock);
        auto it = g_allocs->find(p);
        if (it == g_allocs->end()) {
            fprintf(stderr, "kiln cuda backend: free of %p, which this backend never allocated\n",
                    p);
            return;
        }
        g_tracked -= it->second;
        g_allocs->erase(it);
    }
    /* cudaFree synchronises the device: queued kernels that still use p finish first. */
    KC_CUDA(cudaFree(p));
}

void *kc_scratch(size_t bytes)
{
    kc_ctx_t *c = kc_ctx();
    if (!c) return NULL;
    if (bytes <= c->scratch_bytes) return c->scratch;
    size_t want = bytes + bytes / 4; /* some headroom so steady state never grows */
    if (c->scratch) {
        KC_CUDA(cudaStreamSynchronize(c->stream));
        kc_mfree(c->scratch);
        c->scratch = NULL;
        c->scratch_bytes = 0;
    }
    c->scratch = kc_malloc(want);
    if (c->scratch) c->scratch_bytes = want;
    return c->scratch;
}

void kc_mem_stats(eng_backend_mem_t *out)
{
    memset(out, 0, sizeof(*out));
    kc_ctx_t *c = kc_ctx();
    if (!c) return;
    size_t fr = 0, tot = 0;
    KC_CUDA(cudaMemGetInfo(&fr, &tot));
    std::lock_guard<std::mutex> lk(g_lock);
    out->in_use_bytes = g_tracked;
    out->peak_bytes = g_peak;
    out->device_total_bytes = tot;
}
