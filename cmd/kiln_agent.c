/* kiln_agent.c - kiln-agent's main: flags and environment, signal handling (SIGINT/SIGTERM are
 * blocked before any thread starts and taken with sigwait), GPU detection, then the agent of
 * agent/ runs until a signal asks it to stop its ranks and exit. */
#include "base/base.h"
#include "agent/agent.h"

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* kiln-train next to this executable. */
static void default_train_bin(char *buf, size_t n)
{
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (len <= 0) {
        kiln_strlcpy(buf, "kiln-train", n);
        return;
    }
    self[len] = '\0';
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = '\0';
    snprintf(buf, n, "%s/kiln-train", self);
}

int main(int argc, char **argv)
{
    log_init("kiln-agent");
    const char *server = "127.0.0.1:9090", *slot_type = "cpu", *work_dir = "/tmp/kiln-agent";
    const char *train_bin = NULL, *address = NULL, *worker_id = NULL;
    int64_t slots = 1, cores = 0, grace_ms = 10000;
    config_flag_t flags[] = {
        {"server", "KILN_SERVER", CONFIG_STR, &server, "kilnd gRPC address HOST:PORT"},
        {"slots", "KILN_SLOTS", CONFIG_INT, &slots, "ranks this machine runs at once"},
        {"slot-type", "KILN_SLOT_TYPE", CONFIG_STR, &slot_type, "cpu | gpu"},
        {"work-dir", "KILN_WORK_DIR", CONFIG_STR, &work_dir, "job directories (spec, checkpoints, output) live here"},
        {"train-bin", "KILN_TRAIN_BIN", CONFIG_STR, &train_bin, "program each rank runs (default: kiln-train next to kiln-agent)"},
        {"address", "KILN_ADDRESS", CONFIG_STR, &address, "host address ranks rendezvous on (default: 127.0.0.1 for a loopback kilnd, else the address that reaches it)"},
        {"cores", "KILN_CORES", CONFIG_INT, &cores, "CPU cores shared among ranks (0: all online)"},
        {"worker-id", "KILN_WORKER_ID", CONFIG_STR, &worker_id, "worker id to reuse after a restart"},
        {"stop-grace-ms", "KILN_STOP_GRACE_MS", CONFIG_INT, &grace_ms, "on shutdown, SIGKILL ranks this long after SIGTERM"},
    };
    kiln_err_t err;
    int rc = config_parse(argc, argv, flags, KILN_ARRAY_LEN(flags),
                          "--server HOST:PORT --slots N --slot-type cpu|gpu --work-dir DIR", NULL, &err);
    if (rc == 1)
        return 0;
    if (rc != 0) {
        fprintf(stderr, "kiln-agent: %s\n", err.message);
        return 2;
    }
    if (slots < 1 || slots > 1024) {
        fprintf(stderr, "kiln-agent: --slots must be between 1 and 1024\n");
        return 2;
    }
    char train_buf[PATH_MAX + 16];
    if (!train_bin || !train_bin[0]) {
        default_train_bin(train_buf, sizeof(train_buf));
        train_bin = train_buf;
    }

    /* Before any thread exists (gRPC starts its own), so every thread inherits the mask. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    char *gpu_names[64] = {0};
    int n_gpus = 0;
    if (!strcmp(slot_type, "gpu")) {
        n_gpus = agent_gpu_detect(gpu_names, (int)KILN_ARRAY_LEN(gpu_names));
        if (n_gpus <= 0) {
            fprintf(stderr, "kiln-agent: --slot-type gpu was asked for but no GPU was found "
                            "(neither libcudart nor nvidia-smi reports a device)\n");
            return 1;
        }
        if (slots > n_gpus) {
            fprintf(stderr, "kiln-agent: --slots %lld is more than the %d GPU(s) found\n", (long long)slots, n_gpus);
            return 1;
        }
    }
    agent_config_t cfg = {
        .server = server, .slots = (int)slots, .slot_type = slot_type, .work_dir = work_dir,
        .train_bin = train_bin, .address = address, .worker_id = worker_id, .cores = (int)cores,
        .stop_grace_ms = (int)grace_ms, .gpus = (const char *const *)gpu_names,
        .n_gpus = (size_t)KILN_MIN(n_gpus, (int)KILN_ARRAY_LEN(gpu_names)),
    };
    if (access(train_bin, X_OK) != 0)
        log_warn("rank program %s is not executable; assignments will fail", train_bin);
    agent_t *agent = NULL;
    rc = agent_create(&cfg, &agent, &err);
    for (int i = 0; i < n_gpus && i < (int)KILN_ARRAY_LEN(gpu_names); i++)
        free(gpu_names[i]);
    if (rc != 0) {
        fprintf(stderr, "kiln-agent: %s\n", err.message);
        return 1;
    }
    int sig = 0;
    sigwait(&set, &sig);
    log_info("received %s; stopping ranks and exiting", sig == SIGINT ? "SIGINT" : "SIGTERM");
    agent_shutdown(agent, 5000);
    agent_destroy(agent);
    log_info("agent stopped");
    return 0;
}
