/* test_hoststats.c - the machine's use on the agent's /metrics (agent/hoststats.c): CPU seconds
 * by mode and memory read from a /proc of the test's own making, exact; the real /proc gives the
 * same families; and without libnvidia-ml.so.1 (this machine, CI) no GPU family and no error. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent_int.h"
#include "tests/common/harness.h"

static void put(const char *dir, const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cr_assert_eq(kiln_file_write_atomic(path, text, strlen(text), NULL), 0, "%s", path);
}

Test(hoststats, cpu_and_memory_come_from_proc)
{
    char dir[] = "/tmp/kiln-proc.XXXXXX";
    cr_assert(mkdtemp(dir));
    long hz = sysconf(_SC_CLK_TCK);
    char stat[512];
    snprintf(stat, sizeof stat,
             "cpu  %ld 0 %ld %ld 0 0 0 0 0 0\ncpu0 1 0 1 1 0 0 0 0 0 0\ncpu1 1 0 1 1 0 0 0 0 0 0\n"
             "intr 12345\nctxt 99\n", 30 * hz, 5 * hz, 200 * hz);
    put(dir, "stat", stat);
    put(dir, "meminfo", "MemTotal:        8000 kB\nMemFree:          100 kB\nMemAvailable:     6000 kB\n");
    prom_buf_t b = {0};
    agent_host_prom(&b, dir);
    cr_assert(!b.oom);
    static const char *const want[] = {
        "# TYPE kiln_agent_host_cpu_seconds_total counter\n",
        "kiln_agent_host_cpu_seconds_total{mode=\"user\"} 30.00\n",
        "kiln_agent_host_cpu_seconds_total{mode=\"system\"} 5.00\n",
        "kiln_agent_host_cpu_seconds_total{mode=\"idle\"} 200.00\n",
        "kiln_agent_host_cpu_seconds_total{mode=\"steal\"} 0.00\n",
        "kiln_agent_host_cpus 2\n",
        "kiln_agent_host_memory_bytes{state=\"total\"} 8192000\n",
        "kiln_agent_host_memory_bytes{state=\"available\"} 6144000\n",
        "kiln_agent_host_memory_bytes{state=\"used\"} 2048000\n",
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(want); i++)
        cr_assert(strstr(b.data, want[i]), "no %s in:\n%s", want[i], b.data);
    free(b.data);

    /* a /proc it cannot read leaves those families out, and nothing else breaks */
    put(dir, "meminfo", "MemTotal: 8000 kB\n");
    unlink(strcat(strcpy(stat, dir), "/stat"));
    prom_buf_t e = {0};
    agent_host_prom(&e, dir);
    cr_assert(!e.data || (!strstr(e.data, "kiln_agent_host_cpu") && !strstr(e.data, "kiln_agent_host_memory")),
              "%s", e.data);
    free(e.data);
    cr_assert(th_rm_tree(dir), "could not remove %s", dir);
}

Test(hoststats, the_real_proc_and_no_gpu_without_nvml)
{
    prom_buf_t b = {0};
    agent_host_prom(&b, NULL);
    cr_assert(b.data && strstr(b.data, "kiln_agent_host_cpu_seconds_total{mode=\"idle\"} "), "%s", b.data);
    cr_assert(strstr(b.data, "kiln_agent_host_memory_bytes{state=\"available\"} "), "%s", b.data);
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h)
        dlclose(h); /* a machine with the driver: the GPU families are its own business */
    else
        cr_assert(!strstr(b.data, "kiln_agent_gpu_"), "no NVML, yet GPU use:\n%s", b.data);
    free(b.data);
}
