/* kiln_agent.c - kiln-agent's main: flags and environment (the join token is taken out of the
 * environment before anything else runs), signal handling (SIGINT/SIGTERM are blocked before any
 * thread starts and taken with sigwait), GPU detection, then the agent of agent/ runs until a
 * signal asks it to stop its ranks and exit. */
#include "base/base.h"
#include "agent/agent.h"
#include "rank/rank.h"
#include "cmd/daemon.h"
#include "cmd/faults.h"

#include <ctype.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define JOIN_TOKEN_MAX 512

/* Reads the join token from file (trailing whitespace dropped) into buf. Never prints it. */
static int read_join_token(const char *file, const config_list_t *roots, char *buf, size_t n, kiln_err_t *err)
{
    char *text = NULL;
    size_t len = 0;
    int rc = kiln_file_read(file, &text, &len, err);
    if (rc)
        return kiln_err_set(err, rc, "join-token-file", "could not read the join token file \"%s\"", file);
    while (len > 0 && isspace((unsigned char)text[len - 1]))
        text[--len] = '\0';
    if (len == 0 || len >= n || strpbrk(text, " \t\r\n")) {
        memset(text, 0, len);
        free(text);
        return kiln_err_set(err, KILN_EINVAL, "join-token-file", "\"%s\" does not hold one join token on one line",
                            file);
    }
    memcpy(buf, text, len + 1);
    memset(text, 0, len);
    free(text);
    struct stat st;
    /* group-readable is how Kubernetes mounts a Secret for a pod's group; world-readable is not */
    if (stat(file, &st) == 0 && (st.st_mode & 007))
        log_warn("the join token file %s can be read by every user on this machine (mode %03o); make it 0600",
                 file, (unsigned)(st.st_mode & 0777));
    /* a job must not be able to read it */
    if (roots->n && kiln_path_confine(file, "join-token-file", roots->v, (size_t)roots->n, NULL, 0, NULL, NULL) == 0)
        return kiln_err_set(err, KILN_EINVAL, "join-token-file", "the join token file \"%s\" lies inside a "
                            "--data-root directory, where jobs could read it", file);
    return 0;
}

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

/* The watchdog's check: the heartbeat thread still goes round (it waits at most one
 * heartbeat interval, or a call's timeout of three, between rounds). */
static bool agent_alive(void *ud)
{
    agent_stats_t st;
    agent_stats(ud, &st);
    return st.heartbeat_loop_age_ms < 4 * KILN_MAX(st.heartbeat_interval_ms, 3000) + 5000;
}

int main(int argc, char **argv)
{
    /* The join token from the environment: taken and removed before any thread exists, so no
     * child (rank or helper) ever inherits it. */
    char join_token[JOIN_TOKEN_MAX] = "";
    const char *env_token = getenv("KILN_JOIN_TOKEN");
    bool token_from_env = env_token && env_token[0];
    if (token_from_env && kiln_strlcpy(join_token, env_token, sizeof(join_token)) >= sizeof(join_token)) {
        fprintf(stderr, "kiln-agent: KILN_JOIN_TOKEN is too long\n");
        return 2;
    }
    /* wiped in place first: unsetenv alone leaves the text in the block /proc/<pid>/environ shows */
    if (env_token)
        memset((char *)env_token, 0, strlen(env_token));
    unsetenv("KILN_JOIN_TOKEN");
    log_init("kiln-agent");
    const char *server = "127.0.0.1:9090", *slot_type = "cpu", *work_dir = "/tmp/kiln-agent";
    const char *train_bin = NULL, *address = NULL, *worker_id = NULL, *token_file = NULL;
    const char *tls_ca = NULL, *tls_cert = NULL, *tls_key = NULL, *ports = "29500-29999", *metrics_addr = NULL;
    const char *cpus = NULL, *python = "python3", *log_level = "info", *cuda_lib = NULL;
    const char *sandbox = "on", *sandbox_uids = NULL, *sandbox_state = AGENT_SANDBOX_STATE_DIR;
    bool insecure = false, health = false;
    config_list_t data_roots = {0}, sandbox_ro = {0};
    int64_t slots = 0, cores = 0, grace_ms = 10000, code_cache_mb = 10240;
    int64_t mem_per_slot = 0, pids_per_slot = 0, sandbox_tmp = 0;
    double watchdog_s = 0;
    int64_t outbox_mb = AGENT_OUTBOX_MB, upload_chunk_kb = AGENT_UPLOAD_CHUNK_KB, upload_delay_ms = 0;
    config_flag_t flags[] = {
        {"server", "KILN_SERVER", CONFIG_STR, &server, CONFIG_ANY,
         "kilnd gRPC address HOST:PORT; several comma-separated (kilnd replicas): the agent moves to the next "
         "when one does not answer"},
        {"slots", "KILN_SLOTS", CONFIG_INT, &slots, CONFIG_RANGE(0, 1024),
         "ranks this machine runs at once (default: 1 cpu slot, or one slot per GPU found)"},
        {"slot-type", "KILN_SLOT_TYPE", CONFIG_STR, &slot_type, CONFIG_ONE_OF("cpu|gpu"),
         "the kind of slot this machine offers (gpu: one per GPU found, unless --slots says fewer)"},
        {"work-dir", "KILN_WORK_DIR", CONFIG_STR, &work_dir, CONFIG_ANY, "job directories (spec, checkpoints, output) live here"},
        {"train-bin", "KILN_TRAIN_BIN", CONFIG_STR, &train_bin, CONFIG_ANY, "program each rank runs (default: kiln-train next to kiln-agent)"},
        {"address", "KILN_ADDRESS", CONFIG_STR, &address, CONFIG_ANY, "host address ranks rendezvous on (default: 127.0.0.1 for a loopback kilnd, else the address that reaches it)"},
        {"cores", "KILN_CORES", CONFIG_INT, &cores, CONFIG_RANGE(0, 65536), "CPU cores shared among ranks (0: the --cpus count, else all online)"},
        {"cpus", "KILN_AGENT_CPUS", CONFIG_STR, &cpus, CONFIG_ANY,
         "CPU list such as 0-15, cut into one share per slot: each rank runs bound to its slot's share "
         "(default: unbound)"},
        {"worker-id", "KILN_WORKER_ID", CONFIG_STR, &worker_id, CONFIG_ANY, "worker id to reuse after a restart"},
        {"stop-grace-ms", "KILN_STOP_GRACE_MS", CONFIG_INT, &grace_ms, CONFIG_RANGE(0, 3600000),
         "on shutdown, or when a rank of a job dies and its other ranks here are stopped, SIGKILL ranks this long "
         "after SIGTERM"},
        {"comm-watchdog-s", RANK_ENV_COMM_WATCHDOG_S, CONFIG_DOUBLE, &watchdog_s, CONFIG_RANGE(0, RANK_MAX_WATCHDOG_S),
         "a collective of a job's ranks that makes no progress for this many seconds fails, naming the rank it "
         "waits on (0: the engine's default, 180)"},
        {"data-root", RANK_ENV_DATA_ROOTS, CONFIG_LIST, &data_roots, CONFIG_ANY, "directory jobs may read from (none: jobs read no files); must exist"},
        {"join-token-file", "KILN_JOIN_TOKEN_FILE", CONFIG_STR, &token_file, CONFIG_ANY, "file holding the cluster's join token (or put the token itself in KILN_JOIN_TOKEN)"},
        {"tls-ca", "KILN_TLS_CA", CONFIG_STR, &tls_ca, CONFIG_ANY, "verify kilnd's certificate against this CA (PEM; default: the system's roots)"},
        {"tls-cert", "KILN_TLS_CERT", CONFIG_STR, &tls_cert, CONFIG_ANY, "client certificate for mutual TLS (PEM)"},
        {"tls-key", "KILN_TLS_KEY", CONFIG_STR, &tls_key, CONFIG_ANY, "its private key (PEM)"},
        {"insecure", "KILN_INSECURE", CONFIG_BOOL, &insecure, CONFIG_ANY, "talk to kilnd in plain text (no TLS)"},
        {"rendezvous-ports", "KILN_RENDEZVOUS_PORTS", CONFIG_STR, &ports, CONFIG_ANY,
         "LO-HI: TCP ports rank 0 of a job this machine leads may listen on; each job gets one free on this host, "
         "which no other kiln-agent of the host hands out meanwhile (keep the range outside the kernel's ephemeral ports)"},
        {"code-cache-mb", "KILN_CODE_CACHE_MB", CONFIG_INT, &code_cache_mb, CONFIG_RANGE(1, 1 << 30),
         "bound of the cache of script jobs' code (WORK_DIR/code-cache: each archive extracted once; the least "
         "recently used go first, never one a running job uses)"},
        {"python", "KILN_PYTHON", CONFIG_STR, &python, CONFIG_ANY,
         "the Python that runs a script job's .py entry point, looked up in PATH unless it is a path (a job's "
         "own \"python\" inside the data roots replaces it); in the sandbox it, and where its links lead, must lie "
         "under /usr or a --sandbox-ro-path"},
        {"metrics-addr", "KILN_METRICS_ADDR", CONFIG_STR, &metrics_addr, CONFIG_ANY,
         "serve GET /metrics (Prometheus) and GET /healthz over plain HTTP on this local HOST:PORT"},
        {"sandbox", "KILN_SANDBOX", CONFIG_STR, &sandbox, CONFIG_ONE_OF("on|off"),
         "on: each rank runs as an unprivileged uid of its own, in PID and mount namespaces that show it "
         "only the system's libraries, its data and its own directories, with cgroup limits (needs root); off "
         "runs ranks unconfined, for development only"},
        {"sandbox-uid-range", "KILN_SANDBOX_UID_RANGE", CONFIG_STR, &sandbox_uids, CONFIG_ANY,
         "LO-HI: uids handed to jobs' ranks, one per job attempt, never two at once on this host (default "
         "2000000000-2000065535; no real user may have them)"},
        {"memory-per-slot-mb", "KILN_MEMORY_PER_SLOT_MB", CONFIG_INT, &mem_per_slot, CONFIG_RANGE(0, 1 << 30),
         "memory limit of each rank (cgroup; 0: the machine's memory divided among the slots)"},
        {"sandbox-pids-per-slot", "KILN_SANDBOX_PIDS_PER_SLOT", CONFIG_INT, &pids_per_slot, CONFIG_RANGE(0, 4194304),
         "processes and threads each rank may have (cgroup pids.max; 0: 4096)"},
        {"sandbox-tmp-mb", "KILN_SANDBOX_TMP_MB", CONFIG_INT, &sandbox_tmp, CONFIG_RANGE(0, 1 << 30),
         "size of the private /tmp a job's ranks on this machine share (0: 1024)"},
        {"sandbox-state-dir", "KILN_SANDBOX_STATE_DIR", CONFIG_STR, &sandbox_state, CONFIG_ANY,
         "where agents of this machine record the uids they hand out (shared by them; keep it local)"},
        {"sandbox-ro-path", "KILN_SANDBOX_RO_PATHS", CONFIG_LIST, &sandbox_ro, CONFIG_ANY,
         "another host path every rank may read, such as /opt/conda (the system's /usr, /lib and parts of /etc "
         "always are)"},
        {"outbox-mb", "KILN_AGENT_OUTBOX_MB", CONFIG_INT, &outbox_mb, CONFIG_RANGE(1, 1 << 20),
         "log lines and metric points waiting for kilnd are kept up to this much; beyond it the oldest batches are "
         "dropped, and the job's log says how many"},
        {"upload-chunk-kb", "KILN_AGENT_UPLOAD_CHUNK_KB", CONFIG_INT, &upload_chunk_kb, CONFIG_RANGE(1, 4096),
         "artifact upload chunk size (kilnd may ask for smaller)"},
        {"log-level", "KILN_LOG_LEVEL", CONFIG_STR, &log_level, CONFIG_ONE_OF(LOG_LEVEL_CHOICES),
         "the least severe log lines written"},
        {"cuda-lib", "KILN_CUDA_LIB", CONFIG_STR, &cuda_lib, CONFIG_ANY,
         "path of libkiln_cuda.so when it is not beside kiln-train: ranks get it as their --cuda-lib, and the "
         "sandbox shows it to them"},
#if KILN_FAULTS
        {"upload-delay-ms", "KILN_AGENT_UPLOAD_DELAY_MS", CONFIG_INT, &upload_delay_ms, CONFIG_TEST_RANGE(0, 60000),
         "a pause after every artifact upload chunk: makes an upload long enough to interrupt"},
#endif
        {"health", NULL, CONFIG_BOOL, &health, CONFIG_ANY,
         "check a running kiln-agent: GET /healthz at --metrics-addr, exit 0 when it answers"},
    };
    kiln_err_t err;
    int rc = config_parse(argc, argv, flags, KILN_ARRAY_LEN(flags),
                          "--server HOST:PORT --slots N --slot-type cpu|gpu --work-dir DIR --data-root DIR "
                          "--join-token-file FILE [--tls-ca FILE | --insecure]", NULL, &err);
    if (rc == 1)
        return 0;
    if (rc != 0) {
        fprintf(stderr, "kiln-agent: %s\n", err.message);
        if (err.hint[0])
            fprintf(stderr, "hint: %s\n", err.hint);
        return 2;
    }
    log_level_t level = LOG_INFO;
    log_level_parse(log_level, &level); /* one of the table's choices */
    log_set_level(level);
    if (health) {
        /* a container's HEALTHCHECK: the same flags and environment as the agent it checks */
        if (!metrics_addr || !metrics_addr[0]) {
            fprintf(stderr, "kiln-agent: --health checks the agent's --metrics-addr (KILN_METRICS_ADDR), "
                            "which is not set\n");
            return 2;
        }
        char url[256], why[512];
        daemon_local_url(metrics_addr, false, "/healthz", url, sizeof url);
        int bad = daemon_probe(url, NULL, 5000, why, sizeof why);
        fprintf(bad ? stderr : stdout, "kiln-agent: %s\n", why);
        return bad;
    }
    if (token_file && token_file[0]) {
        if (token_from_env) {
            fprintf(stderr, "kiln-agent: the join token comes from both --join-token-file and KILN_JOIN_TOKEN; "
                            "give it once\n");
            return 2;
        }
        if (read_join_token(token_file, &data_roots, join_token, sizeof(join_token), &err) != 0) {
            fprintf(stderr, "kiln-agent: %s\n", err.message);
            return 2;
        }
    }
    if (!join_token[0])
        log_warn("no join token (--join-token-file or KILN_JOIN_TOKEN): a kilnd that authenticates agents "
                 "will refuse this one");
    int port_lo = 0, port_hi = 0, used = 0;
    if (sscanf(ports, "%d-%d%n", &port_lo, &port_hi, &used) != 2 || ports[used] || port_lo < 1024 ||
        port_hi > 65535 || port_hi < port_lo) {
        fprintf(stderr, "kiln-agent: --rendezvous-ports must be LO-HI with 1024 <= LO <= HI <= 65535, not \"%s\"\n",
                ports);
        return 2;
    }
    agent_sandbox_config_t sandbox_cfg = {.memory_per_slot_mb = mem_per_slot, .pids_per_slot = pids_per_slot,
                                          .tmp_mb = sandbox_tmp, .state_dir = sandbox_state,
                                          .ro_paths = sandbox_ro.v, .n_ro_paths = (size_t)sandbox_ro.n};
    sandbox_cfg.off = !strcmp(sandbox, "off");
    if (sandbox_uids && sandbox_uids[0]) {
        unsigned long long lo = 0, hi = 0;
        int end = 0;
        if (sscanf(sandbox_uids, "%llu-%llu%n", &lo, &hi, &end) != 2 || sandbox_uids[end] || lo < 1000 || hi < lo ||
            hi >= 4294967294ULL) {
            fprintf(stderr, "kiln-agent: --sandbox-uid-range must be LO-HI with 1000 <= LO <= HI < 4294967294, "
                            "not \"%s\"\n", sandbox_uids);
            return 2;
        }
        sandbox_cfg.uid_lo = (uint32_t)lo;
        sandbox_cfg.uid_hi = (uint32_t)hi;
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
        if (slots == 0)
            slots = n_gpus; /* one slot per GPU this node (or this container) was given */
        if (slots > n_gpus) {
            fprintf(stderr, "kiln-agent: --slots %lld is more than the %d GPU(s) found\n", (long long)slots, n_gpus);
            return 1;
        }
    }
    if (slots == 0)
        slots = 1;
    agent_config_t cfg = {
        .server = server, .slots = (int)slots, .slot_type = slot_type, .work_dir = work_dir,
        .train_bin = train_bin, .address = address, .worker_id = worker_id, .cores = (int)cores, .cpus = cpus,
        .stop_grace_ms = (int)grace_ms, .comm_watchdog_s = watchdog_s, .gpus = (const char *const *)gpu_names,
        .n_gpus = (size_t)KILN_MIN(n_gpus, (int)KILN_ARRAY_LEN(gpu_names)),
        .data_roots = data_roots.v, .n_data_roots = (size_t)data_roots.n, .join_token = join_token,
        .tls = {.insecure = insecure, .ca_file = tls_ca, .cert_file = tls_cert, .key_file = tls_key},
        .port_lo = port_lo, .port_hi = port_hi,
        .metrics_addr = metrics_addr,
        .sandbox = sandbox_cfg,
        .code_cache_bytes = code_cache_mb << 20,
        .python = python,
        .outbox_mb = (int)outbox_mb,
        .upload_chunk_kb = (int)upload_chunk_kb,
        .upload_delay_ms = (int)upload_delay_ms,
        .cuda_lib = cuda_lib,
    };
    if (access(train_bin, X_OK) != 0)
        log_warn("rank program %s is not executable; assignments will fail", train_bin);
    agent_t *agent = NULL;
    rc = agent_create(&cfg, &agent, &err);
    memset(join_token, 0, sizeof(join_token)); /* the agent keeps its own copy */
    for (int i = 0; i < n_gpus && i < (int)KILN_ARRAY_LEN(gpu_names); i++)
        free(gpu_names[i]);
    if (rc != 0) {
        fprintf(stderr, "kiln-agent: %s%s%s\n", err.message, err.hint[0] ? "; " : "", err.hint);
        return 1;
    }
    char status_line[300];
    snprintf(status_line, sizeof status_line, "%lld %s slot(s), kilnd %s", (long long)slots, slot_type, server);
    daemon_ready(status_line);
    daemon_watchdog_start(agent_alive, agent);
    int sig = 0;
    sigwait(&set, &sig);
    log_info("received %s; stopping ranks and exiting", sig == SIGINT ? "SIGINT" : "SIGTERM");
    daemon_stopping();
    agent_shutdown(agent, 5000);
    agent_destroy(agent);
    log_info("agent stopped");
    return 0;
}
