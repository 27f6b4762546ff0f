/* agent.h - kiln-agent: registers a machine's slots with kilnd over gRPC, heartbeats, launches
 * the ranks of its assignments (kiln-train processes, or a script job's own code), forwards their
 * output and metric records in batches and reports their exits. The pieces (line splitter, metric records, the launcher,
 * the gRPC client) are public so they can be tested without a network.
 * It is not the training engine (engine/) and holds no job state beyond the ranks it runs. */
#ifndef KILN_AGENT_H
#define KILN_AGENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/base.h"
#include "proto/kiln.pb-c.h"
#include "rank/rank.h"

/* ------------------------------------------------------------------------------------------
 * Line splitter: turns a byte stream into lines. Partial lines wait for more data; lines longer
 * than max_line bytes are truncated there (the rest up to the newline is dropped). A trailing
 * "\r" is removed. Lines handed to the callback are valid UTF-8 without NUL bytes (invalid
 * bytes become U+FFFD), so they can be stored as text as they are.
 * ------------------------------------------------------------------------------------------ */
typedef void (*agent_line_fn)(void *ud, const char *line, size_t len, bool truncated);

typedef struct agent_linebuf {
    char *buf;          /* pending partial line */
    size_t len, cap;
    size_t max_line;
    bool truncated;     /* the pending line already lost bytes */
} agent_linebuf_t;

/* Caller's storage. max_line 0 means 16 KiB. */
void agent_linebuf_init(agent_linebuf_t *lb, size_t max_line);
void agent_linebuf_deinit(agent_linebuf_t *lb);
/* Feeds n bytes; calls fn for every line completed by them. The line pointer is borrowed for the
 * duration of the call. */
void agent_linebuf_feed(agent_linebuf_t *lb, const char *data, size_t n, agent_line_fn fn, void *ud);
/* End of stream: hands over the pending partial line, if any. */
void agent_linebuf_finish(agent_linebuf_t *lb, agent_line_fn fn, void *ud);

/* ------------------------------------------------------------------------------------------
 * Metric points, metric records (docs/contracts.md) and metric definitions (regex on log lines).
 * ------------------------------------------------------------------------------------------ */
#define AGENT_METRIC_NAME (RANK_METRIC_NAME_MAX + 1)

typedef struct agent_point {
    char name[AGENT_METRIC_NAME];
    int rank;
    int64_t step;
    double value;
    int64_t time_us;
} agent_point_t;

/* A growable array of points. Caller's storage; zero-initialise or agent_points_reset(). */
typedef struct agent_points {
    agent_point_t *v;
    size_t n, cap;
} agent_points_t;

void agent_points_push(agent_points_t *p, const agent_point_t *pt);
void agent_points_clear(agent_points_t *p); /* n = 0, keeps the memory */
void agent_points_free(agent_points_t *p);

/* What a metric record held that gave no point, for the job's log. */
typedef struct agent_metric_left {
    size_t nonfinite;              /* NaN and infinities (kiln keeps finite values only) */
    agent_point_t first_nonfinite; /* the first of them, when nonfinite */
    size_t skipped;                /* entries rank_metric_parse left out (rank_metric_record_t.skipped) */
    char skipped_first[64];        /* the name of the first of them, when skipped */
} agent_metric_left_t;

/* Parses one metric record line (rank_metric_parse: {"step": N, "time": S, "metrics": {"name":
 * value, ...}}) and appends one point per finite metric to out, tagged with rank. A missing step
 * uses *last_step; a missing time uses now. *last_step (IN/OUT) is updated to the record's step.
 * *left (OUT, may be NULL) says what gave no point: entries that are not numbers or whose names
 * kiln refuses, and NaN and infinities. Returns 0, or KILN_EFORMAT with err saying what is wrong
 * (nothing is appended then). */
int agent_metric_parse(const char *line, size_t len, int rank, int64_t *last_step,
                        agent_points_t *out, agent_metric_left_t *left, kiln_err_t *err);

/* Metric definitions: PCRE2 patterns over a rank's log lines (kiln_metric_regex_compile says
 * which they may be): a match gives a point whose value is the first capture group that is not
 * the step group. Its step, in this order: a group named "step", when the pattern has one and it
 * took part in the match (a capture that is not a whole number below 2^63 gives no point); else
 * the step of the last step mark on the line's stream (rank/rank.h: kiln-train marks its steps,
 * so the step of the line is known exactly, not guessed from the metric records' pipe); else the
 * definition's own count of points on that rank (1, 2, 3, ...): a script that neither marks nor
 * captures its steps. A definition keeps one point per rank and step in an attempt, the first:
 * a later match at a step it has a point for (or one more than AGENT_STEP_WINDOW steps below its
 * highest) gives none. Every point keeps the time of its line. Matching is bounded twice: per
 * line and definition by PCRE2's match, depth and heap limits (a line that hits one is no match),
 * and per job by a CPU-time budget: once matching a job's lines has used more than budget_us of
 * the matching thread's CPU time within one window of window_us (wall clock), the job's
 * definitions switch off for good (off). */
#define AGENT_MAX_METRIC_DEFS 16
#define AGENT_MAX_REGEX 256               /* bytes of one pattern */
#define AGENT_MATCH_LIMIT 100000          /* pcre2_set_match_limit, per line and definition */
#define AGENT_MATCH_DEPTH_LIMIT 10000     /* pcre2_set_depth_limit */
#define AGENT_MATCH_HEAP_KIB 4096         /* pcre2_set_heap_limit */
#define AGENT_MATCH_BUDGET_US 100000      /* CPU time a job's matching may use ... */
#define AGENT_MATCH_WINDOW_US 1000000     /* ... in one window this long */
#define AGENT_STEP_WINDOW 1024            /* steps below a definition's highest point told apart */
typedef struct agent_metric_def agent_metric_def_t; /* one compiled definition (metrics.c) */

typedef struct agent_metric_defs {
    agent_metric_def_t *v;
    size_t n;
    void *match_ctx;             /* pcre2_match_context_8 with the limits above */
    bool off;                    /* switched off: the job went over its budget */
    int64_t budget_us, window_us;
    int64_t window_start_us;     /* monotonic time the current window opened (-1: none yet) */
    int64_t spent_us;            /* matching CPU time spent in it */
} agent_metric_defs_t;

enum { AGENT_STREAM_STDOUT = 0, AGENT_STREAM_STDERR = 1 };

/* What the steps of one rank's matches come from and which steps its points have: one per rank
 * and attempt, used by one thread. Caller's storage; agent_metric_cursor_init() before use. */
typedef struct agent_metric_cursor {
    int64_t mark[2];                      /* per stream: its last step mark's step; -1: none yet */
    int64_t count[AGENT_MAX_METRIC_DEFS]; /* per definition: its points so far */
    int64_t hi[AGENT_MAX_METRIC_DEFS];    /* per definition: its highest point's step; -1: none */
    /* per definition: which steps of (hi - AGENT_STEP_WINDOW, hi] have a point (bit step % window) */
    uint64_t seen[AGENT_MAX_METRIC_DEFS][AGENT_STEP_WINDOW / 64];
    uint32_t noted_step, noted_repeat;    /* definitions whose left-out matches were said (bits) */
    /* A note for the job's log about matches left out (what and why, once per definition and
     * kind), "" when none: the caller says it and empties it. */
    char note[400];
} agent_metric_cursor_t;

void agent_metric_cursor_init(agent_metric_cursor_t *c);
/* When line (len bytes) of stream (AGENT_STREAM_*) is a step mark (rank_step_mark_parse), makes
 * its step the stream's and returns true: the line is not part of the log. Else false. */
bool agent_metric_cursor_mark(agent_metric_cursor_t *c, int stream, const char *line, size_t len);

/* Compiles defs[0..n) (name, regex) for one job, with the budget set to AGENT_MATCH_BUDGET_US
 * per AGENT_MATCH_WINDOW_US (the caller may change budget_us and window_us after). n = 0 gives an
 * empty set. Returns 0, or KILN_EINVAL when there are more than AGENT_MAX_METRIC_DEFS
 * definitions, a name is empty or too long, or a pattern is longer than AGENT_MAX_REGEX bytes or
 * fails kiln_metric_regex_compile, the check spec/ applies at submission (err names
 * "metric_definitions[i].regex"; the pattern's text is not repeated). Release with agent_metric_defs_deinit() (also after a
 * failure). Not thread-safe: one job's set is used by one thread. */
int agent_metric_defs_init(agent_metric_defs_t *d, Kiln__MetricDefinition *const *defs, size_t n,
                            kiln_err_t *err);
void agent_metric_defs_deinit(agent_metric_defs_t *d);
/* Applies every definition to a log line of rank's stream (valid UTF-8, NUL-terminated, len
 * bytes; not a step mark) and appends a point (rank, the step above, time_us: the line's time)
 * for each that matches with a value; c is the rank's cursor (IN/OUT: counts, steps taken,
 * c->note). Counts the CPU time it takes against the budget; the call that goes over it sets
 * d->off, and calls after that match nothing. Returns points appended. */
size_t agent_metric_defs_match(agent_metric_defs_t *d, agent_metric_cursor_t *c, int stream, const char *line,
                               size_t len, int rank, int64_t time_us, agent_points_t *out);

/* ------------------------------------------------------------------------------------------
 * Launcher: starts the ranks of an assignment as child processes (each in its own process group,
 * stdout/stderr/metric records on pipes), reads their output on its own I/O thread and delivers
 * lines, metric points and exits to callbacks, in order per rank: every line and point of a rank
 * comes before its exit. Stop orders send SIGTERM to the rank's process group, then SIGKILL after
 * the grace period.
 * ------------------------------------------------------------------------------------------ */
typedef struct agent_launch_cbs {
    /* on_started runs on the caller of agent_launcher_start, with the launcher's lock held; the
     * others run on the launcher's I/O thread without it (on_line also on the caller of
     * agent_launcher_start, lock held, for the launcher's own note about a job before its ranks
     * start). None may call back into the launcher. Pointers are borrowed for the call. */
    /* master_port: the rendezvous port the launcher picked for this attempt (node 0 of a job of
     * several ranks), else 0. host_fault (not ok): the start failed for a fault of this host
     * (its sandbox, processes, ports, memory), not of the job's spec, data or code. */
    void (*on_started)(void *ud, const char *job_id, int attempt, bool ok, bool host_fault, const char *reason,
                       int master_port);
    void (*on_line)(void *ud, const char *job_id, int attempt, int rank, int stream,
                    int64_t time_us, const char *line, size_t len);
    void (*on_points)(void *ud, const char *job_id, int attempt, const agent_point_t *pts, size_t n);
    /* exit_code -1 when killed by signal sig. reason: for a non-zero exit code the rank's last
     * stderr line ("" when it wrote none; a script rank: its last stderr lines); for a signal
     * its description ("Killed"), or, for a SIGKILL by the kernel's OOM killer in the box's
     * cgroup, "out of memory (limit N MiB)"; for a script rank that failed either way and left
     * SageMaker's failure file, that file's first RANK_SM_FAILURE_MAX characters. */
    void (*on_exit)(void *ud, const char *job_id, int attempt, int rank, pid_t pid, int exit_code,
                    int sig, const char *reason);
    void *ud;
} agent_launch_cbs_t;

/* Appended to a log line the launcher had to cut at max_line bytes. */
#define AGENT_TRUNCATED_MARK " [line truncated]"
/* Bytes of a rank's exit or start reason the agent keeps (a script's failure file: its first
 * RANK_SM_FAILURE_MAX characters, UTF-8). */
#define AGENT_REASON_MAX (4 * RANK_SM_FAILURE_MAX + 64)

/* ------------------------------------------------------------------------------------------
 * The sandbox every rank runs in (sandbox.c; docs/security.md, "Ranks run in a sandbox"): each
 * attempt on a host gets an unprivileged uid of its own, PID and mount namespaces in which it sees
 * only the system's libraries, its data and its own directories, no new privileges, and cgroup
 * limits on memory and tasks. The agent's settings for it; zero values are the defaults.
 * ------------------------------------------------------------------------------------------ */
#define AGENT_SANDBOX_UID_LO 2000000000u  /* the default uid range: far above any real user's */
#define AGENT_SANDBOX_UID_HI 2000065535u
#define AGENT_SANDBOX_STATE_DIR "/var/lib/kiln-sandbox"

typedef struct agent_sandbox_config {
    bool off;                    /* development only: ranks run unconfined, as the agent's user */
    uint32_t uid_lo, uid_hi;     /* uids handed to attempts, one each, never two at once on a host
                                  * (0, 0: AGENT_SANDBOX_UID_LO..AGENT_SANDBOX_UID_HI) */
    int64_t memory_per_slot_mb;  /* memory limit per rank (0: the host's memory divided among the slots) */
    int64_t pids_per_slot;       /* processes and threads per rank (0: 4096) */
    int64_t tmp_mb;              /* size of an attempt's private /tmp (0: 1024) */
    const char *state_dir;       /* uid claims and the sandbox's mount point (NULL: AGENT_SANDBOX_STATE_DIR) */
    const char *const *ro_paths; /* more host paths every rank may read (an /opt/conda), absolute */
    size_t n_ro_paths;
} agent_sandbox_config_t;

typedef struct agent_launcher_config {
    const char *train_bin;   /* program each rank runs (kiln-train) */
    const char *work_dir;    /* jobs/<job_id>/... live under it */
    int slots;               /* ranks this agent may run at once */
    bool gpu;                /* slot type gpu: set KILN_DEVICE_ID / CUDA_VISIBLE_DEVICES */
    int cores;               /* CPU cores to share among ranks (0: the --cpus count, else online
                              * processors) */
    /* --cpus: a CPU list ("0-3,8") cut into one share per slot (rank_cpus_share); a rank holds a
     * free slot and runs bound to its share (KILN_CPUS). Every CPU must be one the agent may run
     * on and each slot needs one at least, else agent_launcher_create refuses it. NULL or "": no
     * binding, the kernel places the ranks' threads. */
    const char *cpus;
    int max_line;            /* log line limit in bytes (0: 16 KiB) */
    /* Directories jobs may read from, already resolved (agent_data_roots_resolve); none: jobs
     * may read nothing. Passed to ranks as KILN_DATA_ROOTS. */
    const char *const *data_roots;
    size_t n_data_roots;
    /* Rendezvous ports rank 0 of an attempt may listen on (0, 0: 29500 to 29999). The launcher
     * hands each attempt it leads (node 0, several ranks, no port from kilnd) a port of the range
     * that no attempt of this agent holds and that nothing on the host is bound to; the attempt
     * holds it until its last rank has exited. Keep the range out of the kernel's ephemeral
     * ports (/proc/sys/net/ipv4/ip_local_port_range). */
    int port_lo, port_hi;
    /* Passed to ranks as KILN_COMM_WATCHDOG_S: a collective that makes no progress for this many
     * seconds fails naming the rank it waits on. 0: unset (the engine's default, 180 s); at most
     * RANK_MAX_WATCHDOG_S, else agent_launcher_create refuses it. */
    double comm_watchdog_s;
    /* When a rank ends abnormally (a signal, a non-zero exit), the attempt's other ranks here get
     * SIGTERM (and SIGCONT), then SIGKILL after this many ms (0: 10000). */
    int sibling_grace_ms;
    /* How ranks are confined (zero: the sandbox, on, with its defaults). agent_launcher_create
     * refuses to start when the sandbox is on and cannot work here (err says why). */
    agent_sandbox_config_t sandbox;
    /* Script jobs: the Python that runs a .py entry point (--python; NULL: "python3"), looked up
     * in PATH when it has no '/', made absolute when it has (a link stays one: a virtual
     * environment's python); a job's own "python" replaces it. */
    const char *python;
    /* kiln-agent's --cuda-lib: libkiln_cuda.so when it is not beside train_bin (NULL: none); the
     * box shows it to kiln-train ranks, which get it as their --cuda-lib. */
    const char *cuda_lib;
    /* Where script jobs' code archives come from (borrowed; it must outlive the launcher). NULL:
     * a job whose source is an archive is refused. */
    struct agent_code_cache *code;
} agent_launcher_config_t;

typedef struct agent_launcher agent_launcher_t;

/* Starts the I/O thread. cfg strings are copied. Caller owns *out; free with
 * agent_launcher_destroy(). Returns 0 or KILN_EIO. */
int agent_launcher_create(const agent_launcher_config_t *cfg, const agent_launch_cbs_t *cbs,
                           agent_launcher_t **out, kiln_err_t *err);
/* Kills every remaining rank (SIGKILL to its group), reaps it, stops the thread. Accepts NULL.
 * Exits of ranks killed here are not delivered. */
void agent_launcher_destroy(agent_launcher_t *l);
/* The CPU cores its ranks share: the config's cores, else the --cpus count, else the online
 * processors (at least 1). */
int agent_launcher_cores(const agent_launcher_t *l);

/* Launches one assignment. First the checks, before anything is written or started: every
 * a->read_paths entry must be absolute and resolve inside a data root; a->checkpoint_dir ("":
 * <job dir>/checkpoints) and a->resume_from (when set) inside a data root or the work dir; and
 * none of them, resolved, inside a project area other than a->project's (kiln_path_area_check).
 * A failed check refuses the assignment: on_started(ok=false, reason naming the field and the
 * allowed directories; outside them, or in another project's area, it never says whether the
 * path exists) and KILN_EPERM (KILN_EINVAL for a relative path, KILN_ENOTFOUND for a read path
 * inside a root but missing). Then it creates the job directory, output/ and the checkpoint
 * directory (mode 0700); one in the project's area (<checkpoint.path>/.kiln/<project>/<job id>)
 * must then be made of real directories, .kiln and the project's of the agent's user and closed
 * to others' writes, or the assignment is refused (KILN_EPERM). Then it writes <work_dir>/jobs/<job_id>/spec.json (a->spec_json,
 * for kiln-train; the launcher does not read it), compiles a->metric_definitions (a set that
 * does not compile is dropped with a line in the job's log), makes the attempt's sandbox box
 * (unless the sandbox is off: the data roots, the rank program, the spec, the model to start from
 * and the checkpoint to resume from read-only, the output and checkpoint directories writable and
 * given to the box's uid; memory and tasks per slot times the ranks) and starts one rank per
 * a->ranks entry in it (in its output directory) with the environment of docs/contracts.md:
 * umask 077, a->threads_per_rank threads (0:
 * the cores divided among the slots), KILN_DATA_ROOTS, and none of the agent's secrets
 * (KILN_JOIN_TOKEN and the like are filtered out). When a->master_port is 0, a->world_size > 1
 * and a->node_rank is 0, rank 0's rendezvous port is one the launcher picks (see port_lo);
 * when none is free the assignment is refused. Then on_started(ok=true, the port). If a rank fails to
 * start, the ranks already started are killed (their exits are not delivered),
 * on_started(ok=false, reason) is called and the status is returned. An assignment (job_id,
 * attempt) that is already running is ignored (returns KILN_EEXIST, no callback). Thread-safe;
 * it does not wait for the I/O thread's reading or matching. */
int agent_launcher_start(agent_launcher_t *l, const Kiln__Assignment *a, kiln_err_t *err);
/* Stop order: SIGTERM to every rank of job_id (attempt 0: any attempt), SIGKILL after grace_ms
 * (0: at once). Returns the number of ranks signalled. Thread-safe. */
int agent_launcher_stop(agent_launcher_t *l, const char *job_id, int attempt, int grace_ms);
/* Stop order for every rank. Returns the number signalled. */
int agent_launcher_stop_all(agent_launcher_t *l, int grace_ms);
/* Waits until no rank is left (every exit delivered) or timeout_ms passes. True when idle. */
bool agent_launcher_wait_idle(agent_launcher_t *l, int timeout_ms);

typedef struct agent_rank_info {
    char job_id[64];
    int attempt, rank;
    pid_t pid;
} agent_rank_info_t;
/* Copies up to max running ranks into out; returns how many ranks there are (may be > max).
 * Reads a snapshot under its own small lock: it never waits for a start, a stop or the I/O
 * thread. */
size_t agent_launcher_list(agent_launcher_t *l, agent_rank_info_t *out, size_t max);

/* ------------------------------------------------------------------------------------------
 * Artifacts: what rank 0 leaves at the top of its output directory is uploaded to kilnd when the
 * attempt ends (transfer.c). Only regular files with a single link and a name kiln accepts
 * (kiln_artifact_name_ok) qualify: a symbolic or hard link the job made to another file (the
 * agent's credential, another job's data) is never followed or sent.
 * ------------------------------------------------------------------------------------------ */
#define AGENT_MAX_ARTIFACTS 256

typedef struct agent_out_file {
    char name[KILN_ARTIFACT_PATH_MAX + 1]; /* a path in the tree for agent_tree_scan */
    int fd;                      /* open read-only on the very file that was hashed */
    int64_t size;
    char sha256[KILN_SHA256_HEX];
} agent_out_file_t;

/* Lists and hashes the files at the top of dir, by name, at most AGENT_MAX_ARTIFACTS. Entries
 * that do not qualify (see above; directories too) are skipped, each with a line in notes
 * ("" when none; cut at notes_n). *out is heap (caller frees with agent_output_free), *n its
 * count. Returns 0 (also for a missing dir: nothing to upload), or KILN_EIO / KILN_ENOMEM. */
int agent_output_scan(const char *dir, agent_out_file_t **out, size_t *n, char *notes, size_t notes_n,
                      kiln_err_t *err);
/* agent_output_scan over the whole tree under dir (a checkpoint directory): each file named by
 * its path relative to dir (kiln_artifact_path_ok), directories walked through descriptors with
 * O_NOFOLLOW so that no link leads out of the tree; at most AGENT_MAX_ARTIFACTS files in all. */
int agent_tree_scan(const char *dir, agent_out_file_t **out, size_t *n, char *notes, size_t notes_n, kiln_err_t *err);
void agent_output_free(agent_out_file_t *v, size_t n);

/* ------------------------------------------------------------------------------------------
 * gRPC client: one channel to kilnd, unary calls with deadlines.
 * ------------------------------------------------------------------------------------------ */
typedef struct agent_rpc agent_rpc_t;

/* How the channel is secured. insecure: plain text (nothing else may be set). Otherwise TLS:
 * kilnd's certificate is verified against ca_file (PEM), or the system's roots when ca_file is
 * NULL; cert_file and key_file (PEM, both or neither) are the client certificate for mutual
 * TLS. */
typedef struct agent_tls {
    bool insecure;
    const char *ca_file, *cert_file, *key_file;
} agent_tls_t;

/* One metadata entry of a call ("authorization", "Bearer ..."). Keys are lower case. */
typedef struct agent_md {
    const char *key, *value;
} agent_md_t;

/* Creates a channel to target ("127.0.0.1:9090", or several comma-separated) secured as tls says
 * (NULL: insecure); connects lazily, to the first address. The files are read here. Caller owns *out; free with agent_rpc_destroy().
 * Returns 0, KILN_EINVAL (conflicting or incomplete TLS settings, a file that holds no PEM),
 * KILN_ENOTFOUND / KILN_EIO (a file that cannot be read; err names it, never its contents).
 * Thread-safe once created. */
int agent_rpc_create(const char *target, const agent_tls_t *tls, agent_rpc_t **out, kiln_err_t *err);
void agent_rpc_destroy(agent_rpc_t *r);
/* With several addresses (target "a:9090,b:9090": kilnd replicas), moves the channel to the next
 * one, after the calls in flight have ended; returns the address now used (with one address,
 * that one, and nothing changes). Thread-safe. */
const char *agent_rpc_next(agent_rpc_t *r);
/* One server-streaming call held open (WatchWork): sends the request bytes, calls on_msg(ud,
 * bytes, len) for each message as it arrives (on this thread), and returns when the stream ends:
 * kilnd ended it, timeout_ms passed (DEADLINE_EXCEEDED), agent_rpc_watch_cancel, or
 * agent_rpc_next moved the channel (CANCELLED). *grpc_code (OUT) is its status; returns 0 when
 * OK, else the kiln status matching it with kilnd's message in err. One watch at a time per
 * channel; it holds no lock while it waits. */
int agent_rpc_watch(agent_rpc_t *r, const char *method, const agent_md_t *md, size_t n_md, const void *data,
                    size_t len, int timeout_ms, void (*on_msg)(void *ud, const uint8_t *msg, size_t len), void *ud,
                    int *grpc_code, kiln_err_t *err);
/* Ends the watch in progress, or the next one to start if none is (shutdown). Thread-safe. */
void agent_rpc_watch_cancel(agent_rpc_t *r);
/* How many addresses the channel goes round. */
int agent_rpc_ntargets(const agent_rpc_t *r);

/* One unary call with raw bytes: method is the path ("/kiln.AgentService/Heartbeat"), md[0..n_md)
 * the call's metadata (values are sent as they are and never logged). On a reply, *out (heap,
 * caller frees with free()) and *out_len hold the response bytes. *grpc_code (OUT, may be NULL)
 * is the gRPC status code (0 OK, 14 UNAVAILABLE, 16 UNAUTHENTICATED, ...). Returns 0 when the
 * status is OK, else the kiln status matching the gRPC code with the server's message in err. */
int agent_rpc_call_raw(agent_rpc_t *r, const char *method, const agent_md_t *md, size_t n_md,
                        const void *data, size_t len, int timeout_ms, uint8_t **out, size_t *out_len,
                        int *grpc_code, kiln_err_t *err);
/* Same with messages: packs req, unpacks the reply with resp_desc into *resp (caller frees with
 * protobuf_c_message_free_unpacked(*resp, NULL)). A reply that does not decode is KILN_EFORMAT. */
int agent_rpc_call(agent_rpc_t *r, const char *method, const agent_md_t *md, size_t n_md,
                    const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc,
                    int timeout_ms, ProtobufCMessage **resp, int *grpc_code, kiln_err_t *err);
/* Kiln status for a gRPC status code. */
int agent_grpc_status(int grpc_code);

/* ------------------------------------------------------------------------------------------
 * The code cache (code.c): script jobs' code archives (Assignment.code_digest), fetched from
 * kilnd, checked against their SHA-256, and extracted once per digest (with code/'s checks:
 * nothing lands outside the tree) into <dir>/<digest>/, which never changes after: a job's ranks
 * get a working directory of their own holding a copy (agent_code_prepare) or an overlay over
 * it (agent_code_overlay). The cache is bounded by the extracted bytes it holds: past the bound
 * the least recently used trees go, never one a job holds (a tree larger than the bound on its
 * own is kept while it is held). Each tree has a manifest (<dir>/<digest>.manifest: every entry's
 * kind, mode, size and time, written last), so a tree that was damaged or only half written is
 * found (every use compares it) and extracted again. Thread-safe; one cache per agent.
 * ------------------------------------------------------------------------------------------ */
typedef struct agent_code_cache agent_code_cache_t;

/* What a job needs: the archive's digest (64 lower-case hex digits) and size, and the assignment
 * that names it (FetchCode asks for the archive by job and attempt). */
typedef struct agent_code_ref {
    const char *digest;
    int64_t size;                /* bytes of the archive (0: not known beforehand) */
    const char *job_id;
    int attempt;
} agent_code_ref_t;

/* Writes the archive ref names, all of it, to fd (empty, at offset 0). Returns 0 or a status with
 * err. The agent's fetches FetchCode from kilnd (xfer_code_fetch); tests pass their own. */
typedef int (*agent_code_fetch_fn)(void *ud, const agent_code_ref_t *ref, int fd, kiln_err_t *err);

/* Opens the cache in dir (created 0755 when missing; what an earlier agent left there is kept
 * when its manifest holds, removed otherwise), bounded to max_bytes of extracted files
 * (0: 10 GiB); one archive may expand to at most that much (code_limits_default's other limits
 * apply). fetch and ud are borrowed for the cache's lifetime. Caller owns *out
 * (agent_code_cache_destroy). Returns 0, KILN_EIO or KILN_ENOMEM. */
int agent_code_cache_create(const char *dir, int64_t max_bytes, agent_code_fetch_fn fetch, void *ud,
                            agent_code_cache_t **out, kiln_err_t *err);
void agent_code_cache_destroy(agent_code_cache_t *c); /* accepts NULL */
/* Makes ref's tree present (fetching, checking the SHA-256 and size, extracting when it is
 * missing or its manifest does not hold) and holds it until agent_code_release: it is not
 * evicted meanwhile. Several callers wanting one digest wait for one fetch. *tree (OUT, size n):
 * the tree's path, which nobody may change. Returns 0; KILN_ECHECKSUM (kilnd sent other bytes
 * than the digest names: nothing is kept); code_archive_extract_fd's refusals; the fetcher's
 * statuses; KILN_EIO. */
int agent_code_acquire(agent_code_cache_t *c, const agent_code_ref_t *ref, char *tree, size_t n, kiln_err_t *err);
/* Ends a hold of agent_code_acquire (then the tree may be evicted; trees over the bound are). */
void agent_code_release(agent_code_cache_t *c, const char *digest);
/* The job's working directory workdir (which must not exist; its parent must) as a copy of the
 * held tree of digest that the job may change: directories, files (content and execute bits; no
 * hard links) and symbolic links as they are. *bytes (OUT, may be NULL): bytes copied. Returns 0,
 * KILN_ENOTFOUND (digest is not held), KILN_EEXIST or KILN_EIO. */
int agent_code_prepare(agent_code_cache_t *c, const char *digest, const char *workdir, int64_t *bytes,
                       kiln_err_t *err);
/* For a launcher that mounts the working directory as an overlay in the rank's own mount
 * namespace (overlayfs: no copy): lower (OUT, size n) is the held tree of digest (read-only),
 * and upper and work (OUT) are fresh directories under job_dir ("code-upper", "code-work") that
 * take the job's changes. Returns 0, KILN_ENOTFOUND or KILN_EIO. */
int agent_code_overlay(agent_code_cache_t *c, const char *digest, const char *job_dir, char *lower, char *upper,
                       char *work, size_t n, kiln_err_t *err);
/* A script job whose source is a directory in the data roots: workdir (which must not exist) as
 * a copy of src, which must lie inside one of roots[0..nroots) once resolved (the same rule and
 * message as every path a job reads, kiln_path_confine, field "source") and outside every
 * project's area (kiln_path_area_check), and hold at most max_bytes (KILN_ETOOBIG naming the
 * limit). Devices, FIFOs, sockets and the project areas (KILN_AREA_DIR directories) in it are
 * left out.
 * Returns 0, KILN_EPERM, KILN_ENOTFOUND, KILN_ETOOBIG, KILN_EEXIST or KILN_EIO. */
int agent_code_copy_dir(const char *src, const char *const *roots, size_t nroots, int64_t max_bytes,
                        const char *workdir, int64_t *bytes, kiln_err_t *err);

/* ------------------------------------------------------------------------------------------
 * The agent.
 * ------------------------------------------------------------------------------------------ */
#define AGENT_OUTBOX_MB 256          /* default --outbox-mb */
#define AGENT_UPLOAD_CHUNK_KB 1024   /* default --upload-chunk-kb */

typedef struct agent_config {
    const char *server;      /* kilnd gRPC address, "HOST:PORT" */
    int slots;
    const char *slot_type;   /* "cpu" | "gpu" */
    const char *work_dir;
    const char *train_bin;
    const char *address;     /* host address ranks rendezvous on */
    const char *worker_id;   /* id to reuse, or NULL/"" */
    int cores;               /* 0: the --cpus count, else online processors */
    const char *cpus;        /* bind each slot's ranks to its share of these CPUs (agent_launcher_config_t) */
    int stop_grace_ms;       /* grace for the agent's own shutdown, and for the ranks of an
                              * attempt one of whose ranks died (0: 10000) */
    double comm_watchdog_s;  /* the ranks' collective watchdog, KILN_COMM_WATCHDOG_S (0: the
                              * engine's default); see agent_launcher_config_t */
    const char *const *gpus; /* GPU names to report (may be NULL) */
    size_t n_gpus;
    /* --data-root directories as given; agent_create resolves them and refuses to start when one
     * is missing or not a directory. None: jobs may read nothing. */
    const char *const *data_roots;
    size_t n_data_roots;
    const char *join_token;  /* the cluster's join token (a secret; never logged), or NULL */
    agent_tls_t tls;         /* how the channel to kilnd is secured */
    int port_lo, port_hi;    /* rendezvous ports (agent_launcher_config_t; 0, 0: the default range) */
    /* "HOST:PORT" for plain HTTP GET /metrics (Prometheus) and GET /healthz (200 while the agent
     * runs, with whether it is registered), or NULL/"" for none. Keep it on a local or pod
     * address: it needs no token and carries nothing secret. */
    const char *metrics_addr;
    agent_sandbox_config_t sandbox; /* how ranks are confined (agent_launcher_config_t) */
    int64_t code_cache_bytes;  /* --code-cache-mb: the code cache's bound (0: 10 GiB) */
    const char *python;        /* --python: what runs a script job's .py entry point (NULL: python3) */
    int outbox_mb;             /* --outbox-mb: bound of queued log and metric batches (0: AGENT_OUTBOX_MB) */
    int upload_chunk_kb;       /* --upload-chunk-kb: artifact upload chunk (0: AGENT_UPLOAD_CHUNK_KB) */
    int upload_delay_ms;       /* --upload-delay-ms (test builds only): a pause after each upload chunk */
    const char *cuda_lib;      /* --cuda-lib: libkiln_cuda.so's path when not beside kiln-train (NULL) */
} agent_config_t;

typedef struct agent agent_t;

/* Creates the agent and starts its threads (heartbeat, starter, I/O, sender). It registers with
 * kilnd in the background, retrying until kilnd answers: RegisterWorker carries
 * "authorization: Bearer <join token>", and "kiln-worker-credential: <credential>" when it
 * registers again under a worker id it holds a credential for. The credential kilnd answers
 * is kept in <work_dir>/agent-credential (AGENT_CREDENTIAL_FILE) and loaded here, so a restarted
 * agent keeps its worker id (cfg->worker_id, when set and different, wins and the file is not
 * used). Every other call carries "authorization: Bearer <credential>"; an UNAUTHENTICATED answer
 * to a heartbeat or report makes the agent register again. Assignments are started on the
 * starter thread, so heartbeats never wait for a launch. Signals should already be blocked by
 * the caller. cfg strings are copied. Caller owns *out; free with agent_destroy().
 * Returns 0, KILN_EIO, KILN_EINVAL (a bad setting or data root), KILN_ENOTFOUND (a TLS file). */
int agent_create(const agent_config_t *cfg, agent_t **out, kiln_err_t *err);
/* Graceful stop: stops every rank (SIGTERM, SIGKILL after the grace), reports their exits and
 * sends what is queued (giving up after flush_timeout_ms if kilnd does not answer), then stops
 * the threads. Idempotent. */
void agent_shutdown(agent_t *a, int flush_timeout_ms);
/* Shuts down (if not yet) and frees. Accepts NULL. */
void agent_destroy(agent_t *a);
/* Worker id kilnd gave (empty until registered). Copies into buf of size n. */
void agent_worker_id(agent_t *a, char *buf, size_t n);

/* What the agent's /healthz and /metrics report. */
typedef struct agent_stats {
    bool registered, draining;
    char worker_id[128];
    int slots, ranks_running;
    size_t outbox_bytes;
    int64_t heartbeat_loop_age_ms;   /* since the heartbeat thread last went round its loop */
    int heartbeat_interval_ms;
} agent_stats_t;
void agent_stats(agent_t *a, agent_stats_t *out);

/* Resolves --data-root directories: each must exist and be a directory; the result is its
 * realpath. Duplicates are dropped. out receives up to max heap strings (caller frees each);
 * *n_out (OUT) their count. Returns 0, or KILN_EINVAL naming the root that does not exist, is not
 * a directory, holds a comma (roots travel comma-separated in KILN_DATA_ROOTS), or is one too
 * many (nothing is left allocated then). */
int agent_data_roots_resolve(const char *const *roots, size_t n, char **out, size_t max, size_t *n_out,
                              kiln_err_t *err);

/* The credential file: "<work dir>/agent-credential", mode 0600, written atomically, two lines
 * "worker_id <id>" and "credential <secret>". */
#define AGENT_CREDENTIAL_FILE "agent-credential"
/* Writes it. Returns 0 or KILN_EIO (err names the file, never the secret). */
int agent_credential_save(const char *work_dir, const char *worker_id, const char *credential,
                           kiln_err_t *err);
/* Reads it into worker_id (size idn) and credential (size credn). Returns 0, KILN_ENOTFOUND (no
 * file), KILN_EFORMAT (not in the format above; err names the file, never its contents) or
 * KILN_EIO. */
int agent_credential_load(const char *work_dir, char *worker_id, size_t idn, char *credential,
                           size_t credn, kiln_err_t *err);

/* Counts GPUs: libcudart's cudaGetDeviceCount through dlopen, else `nvidia-smi -L`. Fills up to
 * max names (heap strings, caller frees each) when names is non-NULL. Returns the count (0 when
 * none or no driver). */
int agent_gpu_detect(char **names, int max);
/* Picks the host address ranks should rendezvous on for a kilnd at server ("HOST:PORT"):
 * 127.0.0.1 when the server is on loopback, else the local address that routes to it.
 * Writes into buf (>= 64 bytes). */
void agent_pick_address(const char *server, char *buf, size_t n);

#endif /* KILN_AGENT_H */
