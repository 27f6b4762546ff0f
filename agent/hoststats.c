/* hoststats.c - the machine's use, as kiln-agent's /metrics tells it at scrape time: CPU time by
 * mode and memory from /proc (the host's, what every job on it shares), and per GPU its
 * utilisation and memory from NVML, which is dlopen'ed (libnvidia-ml.so.1) on the first scrape
 * and skipped cleanly where the driver is absent. No thread, no agent_t. */
#include "agent/agent_int.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- CPU and memory from /proc -------------------------------------------------------------- */

static void write_cpu(prom_buf_t *b, const char *proc)
{
    char path[512], line[512];
    snprintf(path, sizeof path, "%s/stat", proc);
    FILE *f = fopen(path, "re");
    if (!f)
        return;
    unsigned long long t[8] = {0};
    int cpus = 0;
    bool have = false;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "cpu ", 4))
            have = sscanf(line + 4, "%llu %llu %llu %llu %llu %llu %llu %llu", &t[0], &t[1], &t[2], &t[3], &t[4],
                          &t[5], &t[6], &t[7]) >= 4;
        else if (!strncmp(line, "cpu", 3) && line[3] >= '0' && line[3] <= '9')
            cpus++;
    }
    fclose(f);
    if (!have)
        return;
    long hz = sysconf(_SC_CLK_TCK);
    if (hz <= 0)
        hz = 100;
    /* /proc/stat's order of the first eight columns */
    static const char *const modes[8] = {"user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"};
    prom_header(b, "kiln_agent_host_cpu_seconds_total",
                "CPU time of the whole machine by mode, summed over its CPUs (/proc/stat); "
                "1 - rate(mode=\"idle\") / kiln_agent_host_cpus is its use.",
                PROM_COUNTER);
    for (int i = 0; i < 8; i++)
        prom_printf(b, "kiln_agent_host_cpu_seconds_total{mode=\"%s\"} %.2f\n", modes[i], (double)t[i] / (double)hz);
    prom_header(b, "kiln_agent_host_cpus", "CPUs of the machine (/proc/stat).", PROM_GAUGE);
    prom_printf(b, "kiln_agent_host_cpus %d\n", cpus);
}

static void write_memory(prom_buf_t *b, const char *proc)
{
    char path[512], line[256];
    snprintf(path, sizeof path, "%s/meminfo", proc);
    FILE *f = fopen(path, "re");
    if (!f)
        return;
    long long total = -1, avail = -1;
    while (fgets(line, sizeof line, f)) {
        long long kb;
        if (sscanf(line, "MemTotal: %lld kB", &kb) == 1)
            total = kb;
        else if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1)
            avail = kb;
    }
    fclose(f);
    if (total < 0 || avail < 0)
        return;
    prom_header(b, "kiln_agent_host_memory_bytes",
                "Memory of the machine (/proc/meminfo): total, available (MemAvailable) and used (the rest).",
                PROM_GAUGE);
    prom_printf(b, "kiln_agent_host_memory_bytes{state=\"total\"} %lld\n", total * 1024);
    prom_printf(b, "kiln_agent_host_memory_bytes{state=\"available\"} %lld\n", avail * 1024);
    prom_printf(b, "kiln_agent_host_memory_bytes{state=\"used\"} %lld\n", (total - avail) * 1024);
}

/* ---- GPUs through NVML ---------------------------------------------------------------------- */

/* NVML's own declarations (nvml.h), for the few calls made here. */
typedef void *nvml_device_t;
typedef struct {
    unsigned int gpu, memory; /* percent of the last sample period */
} nvml_utilization_t;
typedef struct {
    unsigned long long total, free, used; /* bytes */
} nvml_memory_t;

static struct {
    bool ok;
    int (*count)(unsigned int *);
    int (*handle)(unsigned int, nvml_device_t *);
    int (*util)(nvml_device_t, nvml_utilization_t *);
    int (*mem)(nvml_device_t, nvml_memory_t *);
} nvml;
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;

/* Loads NVML and initialises it, once per process; nvml.ok stays false without a driver. The
 * library stays loaded and initialised for the process's life. */
static void nvml_load(void)
{
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return;
    int (*init)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
    *(void **)&nvml.count = dlsym(h, "nvmlDeviceGetCount_v2");
    *(void **)&nvml.handle = dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&nvml.util = dlsym(h, "nvmlDeviceGetUtilizationRates");
    *(void **)&nvml.mem = dlsym(h, "nvmlDeviceGetMemoryInfo");
    if (!init || !nvml.count || !nvml.handle || !nvml.util || !nvml.mem || init() != 0) {
        log_warn("libnvidia-ml.so.1 is there but did not initialise: /metrics reports no GPU use");
        dlclose(h);
        return;
    }
    nvml.ok = true;
}

/* The GPUs NVML sees, or -1 without NVML. */
static int nvml_count(void)
{
    pthread_once(&nvml_once, nvml_load);
    unsigned int n = 0;
    return nvml.ok && nvml.count(&n) == 0 ? (int)n : -1;
}

static void write_gpus(prom_buf_t *b)
{
    int n = nvml_count();
    if (n <= 0)
        return;
    prom_header(b, "kiln_agent_gpu_utilization_ratio",
                "Per GPU, the share of the last sample period a kernel ran (NVML), 0 to 1.", PROM_GAUGE);
    for (int i = 0; i < n; i++) {
        nvml_device_t d;
        nvml_utilization_t u;
        if (nvml.handle((unsigned)i, &d) == 0 && nvml.util(d, &u) == 0)
            prom_printf(b, "kiln_agent_gpu_utilization_ratio{gpu=\"%d\"} %.2f\n", i, u.gpu / 100.0);
    }
    prom_header(b, "kiln_agent_gpu_memory_bytes", "Per GPU, its memory (NVML): total and used.", PROM_GAUGE);
    for (int i = 0; i < n; i++) {
        nvml_device_t d;
        nvml_memory_t m;
        if (nvml.handle((unsigned)i, &d) == 0 && nvml.mem(d, &m) == 0)
            prom_printf(b, "kiln_agent_gpu_memory_bytes{gpu=\"%d\",state=\"total\"} %llu\n"
                           "kiln_agent_gpu_memory_bytes{gpu=\"%d\",state=\"used\"} %llu\n", i, m.total, i, m.used);
    }
}

void agent_host_prom(prom_buf_t *b, const char *proc)
{
    write_cpu(b, proc ? proc : "/proc");
    write_memory(b, proc ? proc : "/proc");
    write_gpus(b);
}
