/* perf.c - machine measurements the trainer reports against: the peak fp32 FMA rate of this
 * process's threads (MFU's denominator) and the process's peak resident memory.
 * It does not time the model itself (train.c does). */
#pragma GCC target("prefer-vector-width=512")
#include <cpuid.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>

#include "engine/engine.h"

#if defined(__AVX512F__)
#include <immintrin.h>
/* 12 independent accumulator chains of 16-wide FMAs: enough to cover FMA latency on current
 * x86 cores, so the loop runs at the FMA units' throughput. */
static double fma_loop(long iters)
{
    __m512 a[12], b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
        for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
    float s = 0;
    for (int i = 0; i < 12; i++) s += _mm512_reduce_add_ps(a[i]);
    return s;
}
#define FMA_FLOPS_PER_ITER (12.0 * 16 * 2)
#else
static double fma_loop(long iters)
{
    float a[12][8];
    for (int i = 0; i < 12; i++)
        for (int j = 0; j < 8; j++) a[i][j] = (float)i;
    for (long it = 0; it < iters; it++)
        for (int i = 0; i < 12; i++)
#pragma omp simd
            for (int j = 0; j < 8; j++) a[i][j] = a[i][j] * 0.999999f + 1e-7f;
    double s = 0;
    for (int i = 0; i < 12; i++) s += a[i][0];
    return s;
}
#define FMA_FLOPS_PER_ITER (12.0 * 8 * 2)
#endif

/* Each thread times its own FMA loop in thread CPU time, so other processes competing for the
 * cores do not lower the figure (a loaded machine still reports its hardware peak, and MFU on it
 * reads low, as it should); the threads' rates add up. Best of three repetitions. */
static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double eng_measure_peak_gflops(void)
{
    long iters = 10000000; /* ~50 ms a repetition */
    double best = 0, sink = 0;
    for (int rep = 0; rep < 3; rep++) {
        double total = 0;
#pragma omp parallel reduction(+ : sink, total)
        {
            double t0 = thread_cpu_s();
            sink += fma_loop(iters);
            double dt = thread_cpu_s() - t0;
            if (dt > 0) total += FMA_FLOPS_PER_ITER * iters / dt / 1e9;
        }
        if (total > best) best = total;
    }
    if (sink == 12345.678) best += 1e-9; /* keep the loop's result live */
    return best;
}

double eng_peak_mem_mb(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return ru.ru_maxrss / 1024.0;
}

/* AMD family 19h (Zen 3 / Zen 4): Zen 4 runs 512-bit FMAs as two 256-bit halves, and OpenBLAS
 * 0.3.21's AVX2 "Zen" kernels measure ~5% faster there than the Cooperlake (AVX-512) kernels it
 * picks by itself (bench/RESULTS.md). */
static bool amd_family_19h(void)
{
    unsigned a, b, c, d;
    char vendor[13];
    if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
    memcpy(vendor, &b, 4);
    memcpy(vendor + 4, &d, 4);
    memcpy(vendor + 8, &c, 4);
    vendor[12] = '\0';
    if (strcmp(vendor, "AuthenticAMD") != 0 || !__get_cpuid(1, &a, &b, &c, &d)) return false;
    unsigned family = (a >> 8) & 0xf;
    if (family == 0xf) family += (a >> 20) & 0xff;
    return family == 0x19;
}

/* AVX-512 usable: the CPU has AVX512F (CPUID.(EAX=7,ECX=0):EBX bit 16) and the OS saves its
 * state (XCR0 bits 5-7 with SSE and AVX, under OSXSAVE). */
static bool cpu_avx512(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c & (1u << 27))) return false;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0xe6) != 0xe6) return false;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 16));
}

bool eng_coretype_holds_back(const char *coretype, bool avx512, bool amd_19h)
{
    if (!coretype || !coretype[0] || !avx512 || amd_19h) return false;
    static const char *const with_avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    for (size_t i = 0; i < sizeof(with_avx512) / sizeof(with_avx512[0]); i++)
        if (!strcasecmp(coretype, with_avx512[i])) return false;
    return true;
}

bool eng_cpu_coretype_holds_back(void)
{
    return eng_coretype_holds_back(getenv("OPENBLAS_CORETYPE"), cpu_avx512(), amd_family_19h());
}

bool eng_cpu_tune_env(void)
{
    bool changed = false;
    /* Waiting threads spin about 0.1 ms (5,000 pause loops), then sleep. Sleeping at once
     * (OMP_WAIT_POLICY=PASSIVE) costs a futex wake-up per parallel region: 4.5x slower for a
     * tiny model and 4% for the small configuration on a quiet machine. libgomp's default
     * (300,000 loops) collapses on shared cores: 8.6x slower than PASSIVE with the 2 cores
     * busy, where the bounded spin costs 1.3x (bench/RESULTS.md). */
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT")) {
        setenv("GOMP_SPINCOUNT", "5000", 1);
        changed = true;
    }
    if (!getenv("OPENBLAS_CORETYPE") && amd_family_19h()) {
        setenv("OPENBLAS_CORETYPE", "Zen", 1);
        changed = true;
    }
    return changed;
}
