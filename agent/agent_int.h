/* agent_int.h - internals shared by the agent's files: the agent itself (agent.c: lifecycle and
 * callbacks; heartbeat.c: registration and heartbeats; starter.c; sender.c), the outbox (batched,
 * ordered reports waiting for kilnd, bounded in memory, numbered for exactly-once storage, and
 * counted in a ledger that outlives the process), transfers with kilnd's store, the monitor port,
 * the ranks' sandbox and the kinds of rank the launcher starts (runtimes). Nothing outside agent/
 * includes this (its tests do). */
#ifndef KILN_AGENT_INT_H
#define KILN_AGENT_INT_H

#include <limits.h>
#include <pthread.h>

#include "agent/agent.h"

#define OB_MAX_LINES (KILN_LOG_BATCH_LINES / 10)
#define OB_MAX_LOG_BYTES (1 << 20)   /* well under the 4 MiB message limit */
#define OB_MAX_POINTS KILN_METRIC_BATCH_POINTS
#define OB_FLUSH_US 200000           /* an open batch is sent at the latest this long after it opened */
#define OB_CAP_MB_DEFAULT AGENT_OUTBOX_MB /* queued log and metric batches beyond this are dropped */
#define OB_STREAM_IDLE_US (600LL * 1000000) /* a stream nothing used for this long, with nothing queued, goes */
#define OB_POINT_BYTES 64            /* what a queued metric point is counted as */

typedef enum { OB_LOGS, OB_METRICS, OB_STATUS, OB_EXIT } ob_kind_t;

typedef struct ob_line {
    int rank, stream;
    int64_t time_us;
    char *line;
} ob_line_t;

/* The counters of one stream (one attempt of a job on this agent), in a file of the job's
 * directory mapped shared into memory: every increment is in the kernel's page cache at once, so
 * it survives the agent being killed. A restarted agent reads what the dead one took in from the
 * ranks but never had stored, and tells the job's log (ob_recover). */
#define OB_LEDGER_MAGIC "KLNLDG01"
typedef struct ob_ledger {
    char magic[8];
    char job_id[64];
    int32_t attempt;
    int32_t rank;               /* a rank of the attempt on this agent: the notice is its line */
    uint64_t lines_taken, lines_stored, lines_dropped;
    uint64_t points_taken, points_stored, points_dropped;
} ob_ledger_t;

/* One attempt's reports: its batches are numbered 1, 2, 3, ... per kind in the order they are
 * sealed (the sender sends them in that order), under a random stream id. */
typedef struct ob_stream {
    char job_id[64];
    int attempt;
    uint64_t id;
    uint64_t next_seq[2];       /* OB_LOGS, OB_METRICS */
    int rank;                   /* the first rank seen: kilnd takes notes about the stream as its lines */
    ob_ledger_t *ledger;        /* mapped file, or NULL (no work dir, or it could not be made) */
    int64_t used_us;            /* monotonic time it was last looked up */
} ob_stream_t;

/* One report: a log batch, a metric batch, a rank status or a rank exit. */
typedef struct ob_item {
    struct ob_item *next;
    ob_kind_t kind;
    char job_id[64];
    int attempt;
    uint64_t stream_id, batch_seq; /* OB_LOGS, OB_METRICS: set when sealed */
    int64_t opened_us;          /* monotonic time of the first entry (open batches) */
    ob_line_t *lines;           /* OB_LOGS */
    size_t nlines, lines_cap, bytes;
    agent_points_t points;     /* OB_METRICS */
    bool started;               /* OB_STATUS */
    char reason[AGENT_REASON_MAX]; /* OB_STATUS, OB_EXIT */
    int rank, exit_code, sig;   /* OB_EXIT */
    int port;                   /* OB_STATUS: the rendezvous port picked for the attempt, or 0 */
    bool shutdown;              /* OB_STATUS, OB_EXIT: because the agent is shutting down */
    bool host_fault;            /* OB_STATUS: not started for a fault of this host */
    pid_t pid;
    int tries;                  /* failed sends so far */
} ob_item_t;

/* FIFO of sealed reports plus the batches still filling. Thread-safe (its own lock). Reports
 * of one job leave in the order they were added; a rank's exit is sealed after its output. */
typedef struct ob {
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* signalled when something is sealed */
    ob_item_t *head, *tail;     /* sealed */
    ob_item_t *open;            /* filling: at most one per (job, attempt, kind) */
    size_t sealed;
    size_t queued_bytes;        /* of the sealed log and metric batches */
    size_t cap_bytes;           /* kiln-agent's --outbox-mb, default OB_CAP_MB_DEFAULT */
    bool no_batch;              /* kilnd answered ReportBatch UNIMPLEMENTED: one report a call (sender only) */
    uint64_t dropped_lines, dropped_points; /* in all, since start */
    ob_stream_t *streams;       /* one per (job, attempt) in use (ob_retire_idle_locked) */
    size_t nstreams, capstreams;
    int64_t retired_us;         /* monotonic time of the last sweep for idle streams */
    char *ledger_dir;           /* the agent's work dir (ledgers go to jobs/<job>/), or NULL */
} ob_t;

/* cap_mb: the bound of the queued log and metric batches in MiB (0: OB_CAP_MB_DEFAULT). */
void ob_init(ob_t *o, int cap_mb);
/* Keeps a ledger for every stream under dir/jobs/<job id>/ from now on (dir is copied). */
void ob_set_ledger_dir(ob_t *o, const char *dir);
/* At start-up, before anything is queued: reads the ledgers a previous agent in this work dir
 * left, and for every attempt whose lines or points it took in but never had stored, queues a
 * line in that job's log saying how many were lost; removes the ledgers. Returns the number of
 * attempts that lost something. */
int ob_recover(ob_t *o);
/* The sender: kilnd stored it (stored) or refused it for good (!stored); counted in the ledger. */
void ob_done(ob_t *o, const ob_item_t *it, bool stored);
/* The sender gave a log or metric batch up for good (kilnd refused it, why): a line in the job's
 * log says how much of it was dropped (not for a batch of nothing but such notes). */
void ob_note_refused(ob_t *o, const ob_item_t *it, const char *why);
/* Takes the head report off the queue once it is sent (or given up). Caller holds o->mu. */
ob_item_t *ob_pop_locked(ob_t *o);
void ob_deinit(ob_t *o);        /* frees everything still queued */
void ob_add_line(ob_t *o, const char *job_id, int attempt, int rank, int stream, int64_t time_us,
                 const char *line, size_t len);
void ob_add_points(ob_t *o, const char *job_id, int attempt, const agent_point_t *pts, size_t n);
/* Why an attempt did not start here: its spec, data or code (the job fails); the agent shutting
 * down, or a fault of this host (the attempt is lost and re-queued). */
typedef enum { OB_FAULT_JOB, OB_FAULT_SHUTDOWN, OB_FAULT_HOST } ob_fault_t;
/* started, or not for fault (ignored when started). */
void ob_add_status(ob_t *o, const char *job_id, int attempt, bool started, const char *reason,
                   ob_fault_t fault, int master_port);
/* Seals the job's open batches first, so the exit follows every line the rank wrote. shutdown:
 * the agent stopped the rank because it is shutting down. */
void ob_add_exit(ob_t *o, const char *job_id, int attempt, int rank, pid_t pid, int exit_code,
                 int sig, const char *reason, bool shutdown);
/* Seals open batches older than OB_FLUSH_US (all of them when force). Caller holds o->mu. */
void ob_seal_due_locked(ob_t *o, bool force);
/* Forgets the streams not used for idle_us (as of now_us, monotonic) that nothing queued or
 * filling belongs to and whose ledger balances (every line and point taken was stored or
 * dropped): their ledger is unmapped and removed. A later report of that attempt starts a new
 * stream. Returns how many went. Caller holds o->mu. */
size_t ob_retire_idle_locked(ob_t *o, int64_t now_us, int64_t idle_us);
/* Exits queued but not yet acknowledged, so heartbeats keep reporting those ranks. Returns the
 * count; copies up to max. */
size_t ob_pending_exits(ob_t *o, agent_rank_info_t *out, size_t max);
/* True when nothing is queued or filling. */
bool ob_empty(ob_t *o);
void ob_item_free(ob_item_t *it);

/* ---- transfers with kilnd's artifact store (transfer.c) -------------------------------------- */

#define AGENT_SECRET_MAX 512          /* bytes of a join token or credential */

typedef struct xfer xfer_t;

/* What the transfers need from the agent. auth_md fills md[0] with the call's credential (bearer
 * has AGENT_SECRET_MAX + 8 bytes) and returns 1, or 0 without one; unauthenticated is called when
 * kilnd refuses it (the agent registers again). */
typedef struct xfer_env {
    agent_rpc_t *rpc;
    ob_t *ob;
    const char *work_dir;
    size_t (*auth_md)(void *ud, char *bearer, agent_md_t *md);
    void (*unauthenticated)(void *ud, const char *what, const kiln_err_t *err);
    bool (*draining)(void *ud);  /* the agent is shutting down: start nothing */
    void (*worker_id)(void *ud, char *buf, size_t n); /* the worker id kilnd gave ("" before) */
    /* Hands an assignment whose model is in place to the agent's starter, which launches it
     * (ranks must be forked by a thread that lives as long as they do). */
    void (*start)(void *ud, const Kiln__Assignment *a);
    /* Rank 0 of the attempt exited: sync its checkpoint directory one last time (when it is
     * synced) before its output is uploaded and its exit reported. NULL: none. */
    void (*ckpt_final)(void *ud, const char *job_id, int attempt);
    void *ud;
    int chunk_bytes;             /* upload chunk size (kiln-agent's --upload-chunk-kb); 0: XFER_CHUNK_DEFAULT */
    int delay_ms;                /* a pause after each upload chunk (--upload-delay-ms, test builds only) */
} xfer_env_t;

/* env is copied (its pointers are borrowed for the transfers' lifetime). */
int xfer_create(const xfer_env_t *env, xfer_t **out, kiln_err_t *err);
/* Lets running transfers finish for up to grace_ms, then cancels the rest (an upload cancelled
 * still reports its rank's exit) and waits for every thread. Idempotent. */
void xfer_shutdown(xfer_t *x, int grace_ms);
/* Shuts down (grace 0) and frees. Accepts NULL. */
void xfer_destroy(xfer_t *x);
/* Rank 0 of an attempt exited: upload its output directory, then queue its exit in the outbox.
 * Returns at once (a thread does the work). */
void xfer_rank0_exit(xfer_t *x, const char *job_id, int attempt, int rank, pid_t pid, int exit_code, int sig,
                     const char *reason);
/* Another rank of an attempt exited: when rank 0's upload of that attempt is still under way,
 * the exit is kept and queued right after rank 0's, so kilnd learns of the exits in the order the
 * ranks ended (the first failure names the attempt's end) and returns true; false: no upload is
 * pending and the caller queues the exit itself. */
bool xfer_defer_exit(xfer_t *x, const char *job_id, int attempt, int rank, pid_t pid, int exit_code, int sig,
                     const char *reason);
/* An assignment that xfer_needs_fetch: fetch the model of init_from_job (unless a checked copy
 * is there) and restore the synced checkpoint directory (xfer_restores: the job's checkpoint
 * directory made to hold exactly checkpoint_files), then hand it to env.start; a failure refuses
 * the assignment (a RankStatus with the reason). An assignment already being fetched is ignored.
 * a is copied. */
void xfer_fetch_and_start(xfer_t *x, const Kiln__Assignment *a);
/* Whether the assignment has a synced checkpoint state to restore (checkpoint_files, and its
 * checkpoint directory is the job's work dir's), and whether it needs a transfer before it starts
 * (that, or init_from_job). */
bool xfer_restores(const Kiln__Assignment *a);
bool xfer_needs_fetch(const Kiln__Assignment *a);
/* The job's checkpoint directory in the agent's work dir: <work_dir>/jobs/<job_id>/checkpoints. */
void xfer_ckpt_dir(const char *work_dir, const char *job_id, char *out, size_t n);
/* Records that rank 0 of attempt runs here, so the job's checkpoint directory here is that
 * attempt's (a later restore of an older synced state leaves it alone). Logs a failure. */
void xfer_ckpt_attempt_set(const char *work_dir, const char *job_id, int attempt);
/* Syncs the job's checkpoint directory to kilnd once, on the calling thread: the manifest of its
 * files, the whole tree by relative path (agent_tree_scan), what kilnd lacks of them, and the manifest again,
 * which kilnd makes the job's synced state. *bytes and *files (OUT) what the state holds.
 * Errors: kilnd's refusal (KILN_ETOOBIG past --artifact-max-job-mb, KILN_ESTATE when the
 * attempt is no longer the job's latest, ...), KILN_ECANCELED when the transfers stop. */
int xfer_ckpt_sync(xfer_t *x, const char *job_id, int attempt, int64_t *bytes, size_t *files, kiln_err_t *err);
/* A line of the agent's ("[kiln-agent] ...") in the job's log, as rank 0's. */
void xfer_job_note(xfer_t *x, const char *job_id, int attempt, int stream, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* A stop order: a fetch for job_id (attempt 0: any) is abandoned, and nothing is started. */
void xfer_cancel(xfer_t *x, const char *job_id, int attempt);
/* The ranks transfers hold (uploads whose exits are not queued yet, assignments being
 * fetched: pid 0), for heartbeats. Copies up to max, returns how many there are. */
size_t xfer_list(xfer_t *x, agent_rank_info_t *out, size_t max);
/* The code cache's fetcher (agent_code_fetch_fn; ud is the xfer_t): FetchCode from kilnd, piece
 * by piece, into fd, retrying while kilnd is unreachable; answers that disagree with each other
 * (size, digest, offsets) are refused (KILN_EFORMAT). The cache checks the digest. */
int xfer_code_fetch(void *ud, const agent_code_ref_t *ref, int fd, kiln_err_t *err);
/* Where an assignment's fetched model lives: <work_dir>/jobs/<job_id>/init/model_llmc.bin. */
void xfer_init_model_path(const char *work_dir, const char *job_id, char *out, size_t n);

/* ---- checkpoint directories synced to kilnd (ckpt_sync.c) ------------------------------------ */

typedef struct ckpt_sync ckpt_sync_t;
/* Starts the watcher thread; x and work_dir are borrowed for its lifetime. Caller owns *out;
 * free with ckpt_sync_destroy (after xfer_shutdown, which ends a sync under way). */
int ckpt_sync_create(xfer_t *x, const char *work_dir, ckpt_sync_t **out, kiln_err_t *err);
void ckpt_sync_destroy(ckpt_sync_t *c);
/* Watches the attempt's checkpoint directory (xfer_ckpt_dir, created mode 0700 when missing):
 * each change, once nothing in it is half-written, is synced. Watching it again is a no-op.
 * KILN_EIO when inotify refuses. Thread-safe. */
int ckpt_sync_watch(ckpt_sync_t *c, const char *job_id, int attempt, kiln_err_t *err);
/* Rank 0 of the attempt exited: waits for a sync under way, syncs once more on the calling
 * thread, and stops watching. Nothing when the attempt is not watched. Thread-safe. */
void ckpt_sync_final(ckpt_sync_t *c, const char *job_id, int attempt);
/* Stops watching (after a sync under way) without syncing. Thread-safe. */
void ckpt_sync_forget(ckpt_sync_t *c, const char *job_id, int attempt);

/* ---- the local metrics and health port (monitor.c) ---- */
typedef struct agent_monitor agent_monitor_t;
extern prom_family_t agent_prom_dropped_lines, agent_prom_dropped_points;
/* Serves GET /metrics and GET /healthz on addr ("HOST:PORT", IPv4) for agent a (borrowed; it
 * must outlive the server). Caller owns *out; stop with agent_monitor_stop(). Returns 0,
 * KILN_EINVAL (bad address) or KILN_EIO (cannot listen). */
int agent_monitor_start(agent_t *a, const char *addr, agent_monitor_t **out, kiln_err_t *err);
void agent_monitor_stop(agent_monitor_t *m);
/* Appends the machine's use to b (hoststats.c): kiln_agent_host_cpu_seconds_total{mode},
 * kiln_agent_host_cpus and kiln_agent_host_memory_bytes{state} from proc (a /proc, or NULL for
 * "/proc"; a file it cannot read leaves its families out), and per GPU
 * kiln_agent_gpu_utilization_ratio{gpu} and kiln_agent_gpu_memory_bytes{gpu,state} when NVML
 * (libnvidia-ml.so.1) loads, none otherwise. Thread-safe. */
void agent_host_prom(prom_buf_t *b, const char *proc);

/* ---- the agent itself (agent.c, heartbeat.c, starter.c, sender.c) ---------------------------- */

#define AGENT_VERSION "kiln-agent " KILN_VERSION
#define AGENT_RPC_TIMEOUT_MS 10000
#define AGENT_MAX_LIST 1024
/* A ReportBatch call's bound: kilnd takes up to SVC_REPORT_BATCH_MAX (256) reports and 1 MiB. */
#define AGENT_BATCH_MAX 256
#define AGENT_BATCH_BYTES (256 << 10)
#define AGENT_MAX_INTERNAL_TRIES 30  /* INTERNAL/UNKNOWN answers before a report is given up */
#define AGENT_MAX_ROOTS 32
#define AGENT_LIMITED_MIN_MS 5000    /* first wait after kilnd's registration limit refused us */
#define AGENT_LIMITED_MAX_MS 60000
/* gRPC status codes the agent acts on */
#define GRPC_CANCELLED 1
#define GRPC_DEADLINE_EXCEEDED 4
#define GRPC_PERMISSION_DENIED 7
#define GRPC_RESOURCE_EXHAUSTED 8
#define GRPC_FAILED_PRECONDITION 9
#define GRPC_ABORTED 10
#define GRPC_UNIMPLEMENTED 12
#define GRPC_UNAVAILABLE 14
#define GRPC_DATA_LOSS 15
#define GRPC_UNAUTHENTICATED 16

/* An assignment waiting for the starter thread (an owned copy of the message). */
typedef struct start_item {
    struct start_item *next;
    Kiln__Assignment *a;
    bool fetched;                /* its init model is in place (a transfer thread fetched it) */
} start_item_t;

struct agent {
    char *server, *slot_type, *work_dir, *train_bin, *address;
    char **gpus;
    size_t n_gpus;
    char *roots[AGENT_MAX_ROOTS]; /* data roots, resolved */
    size_t n_roots;
    int slots, cores, stop_grace_ms;
    char hostname[256];
    char join_token[AGENT_SECRET_MAX]; /* "" when none was given */
    bool id_from_cfg;            /* the operator named the worker id (--worker-id) */

    agent_rpc_t *rpc;
    agent_launcher_t *launcher;
    xfer_t *xfer;                /* uploads of output directories, fetches of init models */
    ckpt_sync_t *ckpt;           /* checkpoint directories synced while their jobs run */
    agent_code_cache_t *code;    /* script jobs' code, <work_dir>/code-cache (--code-cache-mb) */
    ob_t ob;

    pthread_mutex_t mu;          /* the fields below */
    pthread_cond_t cv;           /* wakes the heartbeat thread for stop */
    char worker_id[128];
    char credential[AGENT_SECRET_MAX]; /* kilnd's answer to the last registration, "" if none */
    bool registered;
    start_item_t *starts;        /* assignments for the starter, in order */
    const start_item_t *starting; /* the one the starter is launching now, or NULL */
    pthread_cond_t start_cv;     /* wakes the starter */
    bool stop_starter;
    pthread_t start_thread;
    bool start_started;
    int hb_interval_ms;
    bool draining;               /* shutting down: no new assignments */
    bool hb_now;                 /* heartbeat at once (the drain starting), then clear */
    bool drain_acked;            /* kilnd has taken a heartbeat that says draining */
    bool stop_hb, stop_sender, shut_done;
    pthread_t hb_thread, sender_thread, watch_thread;
    bool hb_started, sender_started, watch_started;
    agent_monitor_t *monitor;    /* --metrics-addr, or NULL */
    int64_t hb_loop_us;          /* kiln_mono_us of the heartbeat loop's last round (under mu) */
};

/* The watch thread (watch.c): holds WatchWork open while registered; each nudge sets hb_now. */
void *agent_watch_main(void *arg);

/* Sleeps up to ms on the agent's condition variable; returns early when *flag, or *wake (when
 * not NULL), turns true (agent.c). */
void agent_wait(agent_t *a, int ms, const bool *flag, const bool *wake);
bool agent_flag(agent_t *a, const bool *flag);         /* *flag, read under a->mu */
/* heartbeat.c: md[0] = "authorization: Bearer <credential>" while the agent holds one (bearer has
 * AGENT_SECRET_MAX + 8 bytes); returns 1, or 0 without one. */
size_t agent_auth_md(agent_t *a, char *bearer, agent_md_t *md);
/* Whether s can travel as a metadata value: printable ASCII, not empty, bounded. */
bool agent_secret_ok(const char *s);
/* kilnd refused the credential on a call (what): register again. */
void agent_unauthenticated(agent_t *a, const char *what, const kiln_err_t *err);
/* The ranks to report: running, plus those whose exit kilnd has not acknowledged (queued, or
 * waiting for an upload) and assignments being fetched. Copies up to max; returns the count. */
size_t agent_running(agent_t *a, agent_rank_info_t *v, size_t max);
void *agent_hb_main(void *arg);                        /* the heartbeat thread (arg: agent_t) */
/* starter.c: queues a copy of as for the starter (fetched: its init model is in place), unless
 * the same (job, attempt) already waits. */
void agent_start_enqueue(agent_t *a, const Kiln__Assignment *as, bool fetched);
/* Drops waiting assignments of job_id (attempt 0: any) that a stop order makes moot. */
void agent_start_cancel(agent_t *a, const char *job_id, int attempt);
void *agent_start_main(void *arg);                     /* the starter thread (arg: agent_t) */
void start_item_free(start_item_t *it);                /* accepts NULL */
/* The ranks of the assignments waiting for the starter or being launched by it, into
 * out[0..max) (as xfer_list): a heartbeat reports them, so that kilnd does not deliver again an
 * assignment whose start is only slow. Returns how many there are (may exceed max). */
size_t agent_start_list(agent_t *a, agent_rank_info_t *out, size_t max);
void *agent_sender_main(void *arg);                    /* sender.c: the sender thread (arg: agent_t) */

/* ---- the ranks' sandbox (sandbox.c, sandbox_host.c) -------------------------------------------
 * A sandbox_t is the host's side, one per launcher: the configuration, the cgroup hierarchy and
 * the uid range. A box is one attempt's confinement on this host, shared by the attempt's ranks
 * here: an unprivileged uid no other box holds (claimed host-wide, so agents sharing a host never
 * hand out the same uid), a cgroup with the attempt's memory and task limits, a PID namespace and
 * a mount namespace whose root holds only the system's libraries (read-only), the mounts the box
 * was made with, a private /proc, a minimal /dev, and /tmp and /dev/shm shared by the attempt's
 * ranks (tmpfs, size-limited). Ranks are spawned into a box as the agent's own children (their
 * exit status is theirs, stop signals reach them as sent), as the box's uid, with no
 * capabilities and no new privileges. The network namespace stays the host's (ranks rendezvous
 * over TCP across hosts). A box lives until sandbox_box_destroy, which kills whatever is left
 * in it. */
typedef struct sandbox sandbox_t;
typedef struct sandbox_box sandbox_box_t;

/* Checks that the sandbox can work on this host and prepares it: root (the agent sets up
 * namespaces, mounts and cgroups and changes uids), a writable cgroup hierarchy with the memory
 * and pids controllers (v2 at /sys/fs/cgroup, else v1's memory and pids hierarchies), the state
 * directory, and one probe box made and destroyed. Leftovers of a killed agent (boxes' cgroups
 * whose uid nobody claims) are removed. slots sizes the default memory limit per rank. Caller
 * owns *out; free with sandbox_destroy(). Returns 0, KILN_EPERM (not root), KILN_EUNSUPP (no
 * usable cgroup hierarchy, namespaces refused) or KILN_EINVAL (a bad setting); err says why
 * and hints at --sandbox off. cfg->off must be false. */
int sandbox_create(const agent_sandbox_config_t *cfg, int slots, sandbox_t **out, kiln_err_t *err);
void sandbox_destroy(sandbox_t *s); /* accepts NULL; boxes must be destroyed first */
/* One line for the agent's start-up log ("cgroup v1, uids 2000000000-2000065535, ..."). */
const char *sandbox_describe(const sandbox_t *s);
/* Whether every box shows the host path (absolute) at the same place: it lies in the system's
 * directories (/usr, /bin, /lib, ...) or under a --sandbox-ro-path, and so does where its links
 * lead (its realpath, when it resolves; a --sandbox-ro-path's own links followed too). A program
 * outside them (a python of /root/.pyenv; /usr/local/bin/python3 linking to /opt/conda) cannot be
 * started in a box. */
bool sandbox_shows(const sandbox_t *s, const char *path);
/* The memory and task limits of one rank, as configured (MiB; tasks). */
int64_t sandbox_memory_per_slot_mb(const sandbox_t *s);
int64_t sandbox_pids_per_slot(const sandbox_t *s);

enum {
    SANDBOX_RO = 0,          /* read-only (the default) */
    SANDBOX_RW = 1,          /* writable (by the box's uid, once sandbox_box_give has made it its own) */
    SANDBOX_OPTIONAL = 2,    /* skipped when the source does not exist */
};

typedef struct sandbox_mount {
    const char *src;         /* host path (absolute; symbolic links in it are followed) */
    const char *dst;         /* where the box sees it (absolute); NULL: the same path as src */
    unsigned flags;          /* SANDBOX_* */
} sandbox_mount_t;

typedef struct sandbox_box_spec {
    const char *name;        /* for log lines and errors ("job-7 attempt 2") */
    const sandbox_mount_t *mounts; /* in order: a mount inside an earlier one comes after it */
    size_t n_mounts;
    int64_t memory_mb;       /* memory limit of the whole box (0: none) */
    int64_t pids_max;        /* processes and threads of the whole box (0: none) */
    int64_t tmp_mb;          /* size of /tmp (0: the sandbox's setting) */
    bool gpu;                /* the NVIDIA device nodes (/dev/nvidia*) are there too */
} sandbox_box_spec_t;

/* Makes a box: claims a uid, creates its cgroup, starts its PID namespace's init and builds its
 * root (every spec mount must exist unless SANDBOX_OPTIONAL; err names the one that does not).
 * The calling thread must live as long as the box: the box's init, like ranks, is killed when
 * the thread that forked it ends. Caller owns *out; free with sandbox_box_destroy().
 * Thread-safe. Returns 0, KILN_ENOTFOUND (a mount's source), KILN_EUNAVAIL (every uid of the
 * range is taken), KILN_EIO (a namespace, mount or cgroup step failed: err names it). */
int sandbox_box_create(sandbox_t *s, const sandbox_box_spec_t *spec, sandbox_box_t **out, kiln_err_t *err);
/* Kills everything left in the box (its init, so the whole PID namespace, and the cgroup), waits
 * for it to go, removes the cgroup, gives the paths it was given back to the agent's uid and
 * releases the uid. Blocks while the kernel tears the processes down. Accepts NULL. */
void sandbox_box_destroy(sandbox_box_t *b);
uid_t sandbox_box_uid(const sandbox_box_t *b);
/* Makes path the box's (chown to its uid and gid): with recursive, every entry below it too,
 * without following symbolic links or leaving the file system, and only entries the agent's uid
 * or a uid of the sandbox's range owns (a file someone else owns stays theirs). Recorded, so
 * destroy (or the next agent to claim the uid, after a crash) gives it back. Returns 0, or
 * KILN_EIO naming the path. */
int sandbox_box_give(sandbox_box_t *b, const char *path, bool recursive, kiln_err_t *err);
/* SIGKILL to every process in the box, at once (the rank spawns a launcher holds are killed too;
 * their exits are still theirs to reap). */
void sandbox_box_kill(sandbox_box_t *b);
/* Whether the kernel's OOM killer has killed a process of the box (cgroup v2 memory.events
 * oom_kill; v1 memory.oom_control oom_kill, or memory.failcnt on kernels without that line, which
 * says the limit was hit; the caller then also requires that the rank died of SIGKILL). *limit_mb
 * (OUT, may be NULL) is the box's memory limit. */
bool sandbox_box_oom(const sandbox_box_t *b, int64_t *limit_mb);

/* One inherited descriptor of a spawned process: src (the caller's) becomes dst in the child. */
typedef struct sandbox_fd {
    int src, dst;
} sandbox_fd_t;

typedef struct sandbox_spawn {
    const char *path;        /* the program, as the box sees it (absolute) */
    char *const *argv, *const *envp;
    const char *cwd;         /* as the box sees it; NULL: the box's / (or, unconfined, the agent's cwd) */
    const sandbox_fd_t *fds; /* the descriptors it keeps; every other one is closed; without an
                              * entry for 0, stdin is /dev/null */
    size_t n_fds;
} sandbox_spawn_t;

/* Starts a process, a child of the calling thread (which must outlive it: it gets SIGKILL when
 * that thread ends), in its own process group (pgid = its pid), with default signal handling,
 * no blocked signals and umask 077. In box b (NULL: unconfined, as the agent's user, for
 * --sandbox off): in the box's cgroup and namespaces, as its uid and gid with no supplementary
 * groups, no capabilities (bounding set emptied), no new privileges and no core dumps; HOME is
 * /tmp there. *pid (OUT) is the child's pid as the agent sees it. Returns 0; KILN_ENOTFOUND when
 * the exec failed (a missing or not executable program is reported here, not as an exit); else
 * KILN_EIO with err naming the step that failed and the errno. */
int sandbox_spawn(sandbox_box_t *b, const sandbox_spawn_t *sp, pid_t *pid, kiln_err_t *err);

/* ---- what a box holds of the host (sandbox_host.c) ----------------------------------------------
 * Its uid: claimed with flock on <state_dir>/uid-<uid> (the kernel lets go when the agent dies),
 * so agents sharing a host never hand out the same uid. The file records the paths given to the
 * uid, so that they are given back when the box ends, or by whoever claims the uid next. */
typedef struct sandbox_ids {
    const char *state_dir;       /* where the claims are (borrowed) */
    uid_t agent_uid;             /* the agent's, to which given paths go back */
    gid_t agent_gid;
    uint32_t lo, hi;             /* the sandbox's uid range */
} sandbox_ids_t;

/* Claims uid for this process; what an earlier holder gave it and did not take back is taken back
 * first. Returns the claim (a descriptor: closing it lets go), or -1 when another holds it. */
int sandbox_uid_claim(const sandbox_ids_t *ids, uint32_t uid);
/* Records path in the claim, then chowns it to uid (sandbox_box_give says which entries). Returns
 * 0, KILN_EINVAL (a path that cannot be recorded) or KILN_EIO naming it. */
int sandbox_uid_give(const sandbox_ids_t *ids, int claim, uint32_t uid, const char *path, bool recursive,
                     kiln_err_t *err);
/* Gives every path recorded in the claim back to the agent (the entries uid owns) and empties the
 * record; the claim stays held. */
void sandbox_uid_take_back(const sandbox_ids_t *ids, int claim, uint32_t uid);

/* Cgroups: the decisions apart, so that they can be tested on any host. */
typedef struct sandbox_cg {
    int version;             /* 1 or 2 */
    char base[2][512];       /* where boxes go: v2 base[0]; v1 base[0] memory, base[1] pids */
    char agent_leaf[512];    /* v2: the leaf the agent moves itself into, "" for none */
} sandbox_cg_t;

typedef struct sandbox_cgbox {
    int version;
    char dir[2][560];        /* the box's cgroup per hierarchy ("" unused) */
    int procs_fd[2];         /* their cgroup.procs, open for writing (-1 unused) */
} sandbox_cgbox_t;

/* Decides where boxes' cgroups go from the cgroup file system at root (/sys/fs/cgroup) and the
 * agent's /proc/self/cgroup text: v2 when root/cgroup.controllers lists memory and pids (boxes go
 * in <own cgroup>/kiln-sandbox, the agent into <own cgroup>/kiln-agent, since a v2 cgroup that
 * hands controllers to its children holds no processes), else v1 when root/<memory>/ and
 * root/<pids>/ are there (boxes in <own cgroup of each>/kiln-sandbox). Reads, writes nothing.
 * Returns 0 or KILN_EUNSUPP saying what is missing. */
int sandbox_cg_detect(const char *root, const char *self_cgroup, sandbox_cg_t *out, kiln_err_t *err);
/* Makes the bases (v2: moves the calling process into agent_leaf and enables memory and pids
 * for the children). Returns 0 or KILN_EIO naming the file. */
int sandbox_cg_setup(const sandbox_cg_t *cg, kiln_err_t *err);
/* Creates cgroup <base>/<name> with the limits (0: none; v2 memory.max and memory.swap.max 0,
 * pids.max; v1 memory.limit_in_bytes (and memory.memsw.limit_in_bytes where swap is accounted),
 * pids.max). A leftover of that name is killed and removed first. Returns 0 or KILN_EIO naming
 * the file. */
int sandbox_cgbox_create(const sandbox_cg_t *cg, const char *name, int64_t memory_bytes, int64_t pids_max,
                         sandbox_cgbox_t *out, kiln_err_t *err);
/* SIGKILL to every process in it (v2 cgroup.kill where the kernel has it, else each pid of
 * cgroup.procs, until none is left or wait_ms passes). True when it is empty. */
bool sandbox_cgbox_kill(sandbox_cgbox_t *b, int wait_ms);
/* The OOM question of sandbox_box_oom for this cgroup. */
bool sandbox_cgbox_oom(const sandbox_cgbox_t *b);
/* Kills what is left (sandbox_cgbox_kill), removes the directories, closes the fds. */
void sandbox_cgbox_destroy(sandbox_cgbox_t *b);
/* Names under the bases that look like boxes ("u<uid>"): calls fn for each uid found (once). */
void sandbox_cg_each_box(const sandbox_cg_t *cg, void (*fn)(void *ud, uint32_t uid), void *ud);

/* ---- the kinds of rank the launcher starts (launch.c, run_train.c, run_script.c) ---------------
 * The launcher does everything a rank's kind does not change: the job's directories, the box and
 * its common mounts (data roots, spec, output and checkpoint directories), the rank contract's
 * values, slots, pipes, output, metrics, signals, exits, OOM and what reaches kilnd. A runtime
 * says what differs: what an attempt needs on the host before its box is made (code, its own
 * directories) and what the box must show it, and for each rank the program, its arguments,
 * its environment and its working directory; and it may know a better reason for a failed rank
 * than its last stderr line. */
typedef struct launch_host {       /* the launcher's settings a runtime reads (borrowed) */
    const char *work_dir;          /* resolved */
    const char *train_bin;         /* kiln-train */
    const char *python;            /* --python as an absolute path, not through its links ("" when not found) */
    const char *python_given;      /* --python as the operator gave it ("python3" when not given) */
    const char *cuda_lib;          /* --cuda-lib, or NULL */
    const char *const *roots;      /* data roots, resolved */
    size_t nroots;
    agent_code_cache_t *code;      /* script jobs' code; NULL: code archives cannot be fetched */
    bool gpu;                      /* slot type gpu */
    bool sandboxed;                /* ranks run in a box (paths are the same inside and out) */
    bool python_hidden;            /* sandboxed, and python lies where no box shows it */
} launch_host_t;

typedef struct launch_attempt {    /* one attempt on this agent, as its runtime sees it */
    const launch_host_t *host;
    char job_id[64];
    int attempt;
    char job_dir[PATH_MAX];        /* <work_dir>/jobs/<job id> */
    char out_dir[PATH_MAX + 16];   /* <job_dir>/output: what rank 0 leaves there becomes artifacts */
    char ckpt_dir[PATH_MAX];       /* resolved, writable */
    void *state;                   /* the runtime's (prepare makes it, release frees it) */
} launch_attempt_t;

#define LAUNCH_MAX_MOUNTS 64
typedef struct launch_mounts {     /* what a runtime adds to the box (paths copied in) */
    sandbox_mount_t v[LAUNCH_MAX_MOUNTS];
    char path[LAUNCH_MAX_MOUNTS][PATH_MAX];
    char dst[LAUNCH_MAX_MOUNTS][64];
    bool give[LAUNCH_MAX_MOUNTS];  /* made the box's uid's, recursively (SANDBOX_RW ones) */
    size_t n;
} launch_mounts_t;

/* Adds a mount (dst NULL: where the host has it); give: the box's uid gets the tree. Returns 0,
 * or KILN_ETOOBIG when there are LAUNCH_MAX_MOUNTS already or a path is too long. */
int launch_mounts_add(launch_mounts_t *m, const char *src, const char *dst, unsigned flags, bool give,
                      kiln_err_t *err);

typedef struct launch_cmd {        /* one rank's process */
    char path[PATH_MAX];           /* the program, as the box sees it (absolute) */
    char **argv;                   /* NULL-terminated heap strings (rank_envp_free) */
    char **envp;                   /* likewise */
    char cwd[PATH_MAX];            /* "": the box's / (the agent's cwd unconfined) */
} launch_cmd_t;

typedef struct launch_runtime {
    const char *name;              /* "kiln-train", "script" */
    /* On the starter thread, before the box: makes what the attempt's ranks need on the host
     * (the job's directories exist) and adds what the box must show them to *m. Returns 0 or a
     * status with err (the attempt is refused with err's message). */
    int (*prepare)(launch_attempt_t *at, const Kiln__Assignment *a, launch_mounts_t *m, kiln_err_t *err);
    /* One rank: re holds the rank contract's values; fills *cmd (caller frees its arrays). */
    int (*command)(launch_attempt_t *at, const Kiln__Assignment *a, const rank_env_t *re, launch_cmd_t *cmd,
                   kiln_err_t *err);
    /* A rank of the attempt ended abnormally (not by the memory limit): may replace *reason
     * (size n; what the launcher has: the last stderr line, or the signal's name) with a better
     * one; tail holds the rank's last stderr lines, '\n'-separated. May be NULL. */
    void (*exit_reason)(const launch_attempt_t *at, int exit_code, int sig, const char *tail, char *reason,
                        size_t n);
    void (*release)(launch_attempt_t *at); /* frees at->state; may be NULL */
} launch_runtime_t;

extern const launch_runtime_t launch_runtime_train;  /* run_train.c: kiln's own engine */
extern const launch_runtime_t launch_runtime_script; /* run_script.c: a job's entry_point */

/* Before rank 0's output directory is uploaded: a script job's SM_MODEL_DIR and
 * SM_OUTPUT_DATA_DIR (<job_dir>/model, <job_dir>/sm-output/data), each with its subdirectories,
 * become <job_dir>/output/model.tar.gz and output.tar.gz when they hold anything (as SageMaker
 * packs them); notes (size n) says what was kept, or that the attempt left no model (a stopped,
 * preempted or paused attempt's successor may still write one). Does
 * nothing for a job without those directories (kiln-train's). */
void agent_output_pack_trees(const char *job_dir, char *notes, size_t n);

/* A launch_cmd_t's arrays freed and cleared. */
void launch_cmd_deinit(launch_cmd_t *c);

#endif /* KILN_AGENT_INT_H */
