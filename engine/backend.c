/* backend.c - picks the backend for a device name: the built-in CPU backend, the reference ops, or
 * the CUDA backend loaded at run time from libkiln_cuda.so (so binaries built without CUDA, or run
 * where the CUDA runtime is absent, still start), whose table version must match. It does not
 * implement any op. */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend.h"

static pthread_mutex_t g_cuda_lock = PTHREAD_MUTEX_INITIALIZER;
static const eng_backend_t *g_cuda;     /* loaded backend, once found */
static char g_cuda_error[256];          /* why loading failed, once tried */
static int g_cuda_tried;

static const char *g_cuda_lib; /* eng_backend_cuda_lib_set's */

void eng_backend_cuda_lib_set(const char *path) { g_cuda_lib = path; }

/* Candidate locations: the --cuda-lib setting, beside the executable, ../lib relative to it, then
 * the dynamic loader's own search path. */
static void *cuda_dlopen(char *why, size_t n)
{
    const char *env = g_cuda_lib;
    char exe[PATH_MAX], cand[PATH_MAX + 64];
    void *h = NULL;
    if (env && *env && (h = dlopen(env, RTLD_NOW | RTLD_LOCAL))) return h;
    ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (len > 0) {
        exe[len] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(cand, sizeof(cand), "%s/libkiln_cuda.so", exe);
            if ((h = dlopen(cand, RTLD_NOW | RTLD_LOCAL))) return h;
            snprintf(cand, sizeof(cand), "%s/../lib/libkiln_cuda.so", exe);
            if ((h = dlopen(cand, RTLD_NOW | RTLD_LOCAL))) return h;
        }
    }
    h = dlopen("libkiln_cuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) snprintf(why, n, "%s", dlerror());
    return h;
}

static const eng_backend_t *cuda_load(void)
{
    pthread_mutex_lock(&g_cuda_lock);
    if (!g_cuda_tried) {
        g_cuda_tried = 1;
        void *h = cuda_dlopen(g_cuda_error, sizeof(g_cuda_error));
        if (h) {
            /* The library exports `eng_cuda_backend`, an eng_backend_t, plus optional
             * `int eng_cuda_available(void)` (whether a usable GPU is present) and
             * `const char *eng_cuda_unavailable_reason(void)` (why not). */
            int (*avail)(void) = (int (*)(void))dlsym(h, "eng_cuda_available");
            const char *(*why)(void) = (const char *(*)(void))dlsym(h, "eng_cuda_unavailable_reason");
            const eng_backend_t *be = dlsym(h, "eng_cuda_backend");
            if (!be)
                snprintf(g_cuda_error, sizeof(g_cuda_error),
                         "libkiln_cuda.so has no symbol eng_cuda_backend");
            else if (be->abi != ENG_BACKEND_ABI)
                snprintf(g_cuda_error, sizeof(g_cuda_error),
                         "libkiln_cuda.so has backend table version %d, this engine needs %d",
                         be->abi, ENG_BACKEND_ABI);
            else if (avail && !avail())
                snprintf(g_cuda_error, sizeof(g_cuda_error), "no usable CUDA GPU found%s%s",
                         why && *why() ? ": " : "", why ? why() : "");
            else
                g_cuda = be;
        }
    }
    const eng_backend_t *be = g_cuda;
    pthread_mutex_unlock(&g_cuda_lock);
    return be;
}

int eng_backend_get(const char *device, const eng_backend_t **out, kiln_err_t *err)
{
    *out = NULL;
    if (!device || !*device || strcmp(device, "auto") == 0) {
        /* Without NVIDIA's kernel driver there is no GPU to find: skip loading the CUDA
         * libraries (half a second and ~150 MB of cuBLAS) just to learn that. */
        if (access("/proc/driver/nvidia/version", R_OK) != 0) {
            *out = &eng_cpu_backend;
            return KILN_OK;
        }
        const eng_backend_t *be = cuda_load();
        *out = be ? be : &eng_cpu_backend;
        return KILN_OK;
    }
    if (strcmp(device, "cpu") == 0) {
        *out = &eng_cpu_backend;
        return KILN_OK;
    }
    if (strcmp(device, "cuda") == 0) {
        const eng_backend_t *be = cuda_load();
        if (!be) {
            kiln_err_set(err, KILN_EUNAVAIL, "resources.device",
                         "cuda backend not available: %s", g_cuda_error);
            kiln_err_hint(err, "build libkiln_cuda.so with nvcc present, run on a machine with a "
                               "GPU, or use device \"cpu\"");
            return KILN_EUNAVAIL;
        }
        *out = be;
        return KILN_OK;
    }
    if (strcmp(device, "ref") == 0) {
        *out = &eng_ref_backend;
        return KILN_OK;
    }
    return kiln_err_set(err, KILN_EINVAL, "resources.device",
                        "unknown device \"%s\" (expected auto, cpu or cuda)", device);
}
