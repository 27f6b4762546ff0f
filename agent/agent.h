/* agent.h - kiln-agent: registers a machine's slots with kilnd over gRPC, heartbeats, launches
 * the ranks of its assignments as kiln-train processes, forwards their output and metric records
 * in batches and reports their exits. The pieces (line splitter, metric records, the launcher,
 * the gRPC client) are public so they can be tested without a network.
 * It is not the training engine (engine/) and holds no job state beyond the ranks it runs. */
#ifndef KILN_AGENT_H
#define KILN_AGENT_H

#include <regex.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/base.h"
#include "proto/kiln.pb-c.h"

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
/* Rewrites s[0..len) as valid UTF-8 without NUL bytes into out (capacity >= 3 * len + 1),
 * NUL-terminated. Returns the new length. */
size_t agent_utf8_sanitize(const char *s, size_t len, char *out);

/* ------------------------------------------------------------------------------------------
 * Metric points, metric records (docs/contracts.md) and metric definitions (regex on log lines).
 * ------------------------------------------------------------------------------------------ */
#define AGENT_METRIC_NAME 128

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

/* Parses one metric record line ({"step": N, "time": S, "metrics": {"name": value, ...}}) and
 * appends one point per metric to out, tagged with rank. A missing step uses *last_step; a
 * missing time uses now. *last_step (IN/OUT) is updated to the record's step. Non-numeric
 * values are skipped. Returns 0, or KILN_EFORMAT with err saying what is wrong (nothing is
 * appended then). */
int agent_metric_parse(const char *line, size_t len, int rank, int64_t *last_step,
                        agent_points_t *out, kiln_err_t *err);

typedef struct agent_metric_def {
    char name[AGENT_METRIC_NAME];
    regex_t re;
} agent_metric_def_t;

typedef struct agent_metric_defs {
    agent_metric_def_t *v;
    size_t n;
} agent_metric_defs_t;

/* Reads "metric_definitions" from a job spec (JSON text) and compiles each regex (POSIX
 * extended). A spec without definitions gives n = 0. Returns 0, KILN_EFORMAT (spec is not JSON)
 * or KILN_EINVAL (a regex does not compile; err names it). Release with
 * agent_metric_defs_deinit() (also after a failure). */
int agent_metric_defs_init(agent_metric_defs_t *d, const char *spec_json, kiln_err_t *err);
void agent_metric_defs_deinit(agent_metric_defs_t *d);
/* Applies every definition to a log line (NUL-terminated); for each that matches with a first
 * capture group holding a number, appends a point (rank, step, now). Returns points appended. */
size_t agent_metric_defs_match(const agent_metric_defs_t *d, const char *line, int rank,
                                int64_t step, int64_t time_us, agent_points_t *out);

/* ------------------------------------------------------------------------------------------
 * Launcher: starts the ranks of an assignment as child processes (each in its own process group,
 * stdout/stderr/metric records on pipes), reads their output on its own I/O thread and delivers
 * lines, metric points and exits to callbacks, in order per rank: every line and point of a rank
 * comes before its exit. Stop orders send SIGTERM to the rank's process group, then SIGKILL after
 * the grace period.
 * ------------------------------------------------------------------------------------------ */
enum { AGENT_STREAM_STDOUT = 0, AGENT_STREAM_STDERR = 1 };

typedef struct agent_launch_cbs {
    /* All callbacks run on the launcher's I/O thread (on_started: on the caller of
     * agent_launcher_start) with the launcher's lock held: they must not call back into the
     * launcher. Pointers are borrowed for the duration of the call. */
    void (*on_started)(void *ud, const char *job_id, int attempt, bool ok, const char *reason);
    void (*on_line)(void *ud, const char *job_id, int attempt, int rank, int stream,
                    int64_t time_us, const char *line, size_t len);
    void (*on_points)(void *ud, const char *job_id, int attempt, const agent_point_t *pts, size_t n);
    /* exit_code -1 when killed by signal sig. reason: for a non-zero exit code the rank's last
     * stderr line ("" when it wrote none); for a signal its description ("Killed"). */
    void (*on_exit)(void *ud, const char *job_id, int attempt, int rank, pid_t pid, int exit_code,
                    int sig, const char *reason);
    void *ud;
} agent_launch_cbs_t;

/* Appended to a log line the launcher had to cut at max_line bytes. */
#define AGENT_TRUNCATED_MARK " [line truncated]"

typedef struct agent_launcher_config {
    const char *train_bin;   /* program each rank runs (kiln-train) */
    const char *work_dir;    /* jobs/<job_id>/... live under it */
    int slots;               /* ranks this agent may run at once */
    bool gpu;                /* slot type gpu: set KILN_DEVICE_ID / CUDA_VISIBLE_DEVICES */
    int cores;               /* CPU cores to share among ranks (0: online processors) */
    int max_line;            /* log line limit in bytes (0: 16 KiB) */
} agent_launcher_config_t;

typedef struct agent_launcher agent_launcher_t;

/* Starts the I/O thread. cfg strings are copied. Caller owns *out; free with
 * agent_launcher_destroy(). Returns 0 or KILN_EIO. */
int agent_launcher_create(const agent_launcher_config_t *cfg, const agent_launch_cbs_t *cbs,
                           agent_launcher_t **out, kiln_err_t *err);
/* Kills every remaining rank (SIGKILL to its group), reaps it, stops the thread. Accepts NULL.
 * Exits of ranks killed here are not delivered. */
void agent_launcher_destroy(agent_launcher_t *l);

/* Launches one assignment: writes <work_dir>/jobs/<job_id>/spec.json, creates checkpoints/ and
 * output/, starts one rank per a->ranks entry with the environment of docs/contracts.md, then
 * calls on_started(ok=true). If anything fails, ranks already started are killed (their exits
 * are not delivered), on_started(ok=false, reason) is called and the status is returned.
 * An assignment (job_id, attempt) that is already running is ignored (returns KILN_EEXIST, no
 * callback). Thread-safe. */
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
/* Copies up to max running ranks into out; returns how many ranks there are (may be > max). */
size_t agent_launcher_list(agent_launcher_t *l, agent_rank_info_t *out, size_t max);

/* ------------------------------------------------------------------------------------------
 * gRPC client: one channel to kilnd, unary calls with deadlines.
 * ------------------------------------------------------------------------------------------ */
typedef struct agent_rpc agent_rpc_t;

/* Creates an insecure channel to target ("127.0.0.1:9090"); connects lazily. Caller owns *out;
 * free with agent_rpc_destroy(). Returns 0 or KILN_EIO. Thread-safe once created. */
int agent_rpc_create(const char *target, agent_rpc_t **out, kiln_err_t *err);
void agent_rpc_destroy(agent_rpc_t *r);

/* One unary call with raw bytes: method is the path ("/kiln.AgentService/Heartbeat").
 * On a reply, *out (heap, caller frees with free()) and *out_len hold the response bytes.
 * *grpc_code (OUT, may be NULL) is the gRPC status code (0 OK, 14 UNAVAILABLE, ...).
 * Returns 0 when the status is OK, else the kiln status matching the gRPC code with the server's
 * message in err. */
int agent_rpc_call_raw(agent_rpc_t *r, const char *method, const void *data, size_t len,
                        int timeout_ms, uint8_t **out, size_t *out_len, int *grpc_code,
                        kiln_err_t *err);
/* Same with messages: packs req, unpacks the reply with resp_desc into *resp (caller frees with
 * protobuf_c_message_free_unpacked(*resp, NULL)). A reply that does not decode is KILN_EFORMAT. */
int agent_rpc_call(agent_rpc_t *r, const char *method, const ProtobufCMessage *req,
                    const ProtobufCMessageDescriptor *resp_desc, int timeout_ms,
                    ProtobufCMessage **resp, int *grpc_code, kiln_err_t *err);
/* Kiln status for a gRPC status code. */
int agent_grpc_status(int grpc_code);
/* True for gRPC codes worth retrying (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED,
 * ABORTED, CANCELLED, UNKNOWN, INTERNAL). */
bool agent_grpc_retryable(int grpc_code);

/* ------------------------------------------------------------------------------------------
 * The agent.
 * ------------------------------------------------------------------------------------------ */
typedef struct agent_config {
    const char *server;      /* kilnd gRPC address, "HOST:PORT" */
    int slots;
    const char *slot_type;   /* "cpu" | "gpu" */
    const char *work_dir;
    const char *train_bin;
    const char *address;     /* host address ranks rendezvous on */
    const char *worker_id;   /* id to reuse, or NULL/"" */
    int cores;               /* 0: online processors */
    int stop_grace_ms;       /* grace for the agent's own shutdown (0: 10000) */
    const char *const *gpus; /* GPU names to report (may be NULL) */
    size_t n_gpus;
} agent_config_t;

typedef struct agent agent_t;

/* Creates the agent and starts its threads (heartbeat, I/O, sender). It registers with kilnd in
 * the background, retrying until kilnd answers. Signals should already be blocked by the
 * caller. cfg strings are copied. Caller owns *out; free with agent_destroy().
 * Returns 0, KILN_EIO or KILN_EINVAL. */
int agent_create(const agent_config_t *cfg, agent_t **out, kiln_err_t *err);
/* Graceful stop: stops every rank (SIGTERM, SIGKILL after the grace), reports their exits and
 * sends what is queued (giving up after flush_timeout_ms if kilnd does not answer), then stops
 * the threads. Idempotent. */
void agent_shutdown(agent_t *a, int flush_timeout_ms);
/* Shuts down (if not yet) and frees. Accepts NULL. */
void agent_destroy(agent_t *a);
/* Worker id kilnd gave (empty until registered). Copies into buf of size n. */
void agent_worker_id(agent_t *a, char *buf, size_t n);

/* Counts GPUs: libcudart's cudaGetDeviceCount through dlopen, else `nvidia-smi -L`. Fills up to
 * max names (heap strings, caller frees each) when names is non-NULL. Returns the count (0 when
 * none or no driver). */
int agent_gpu_detect(char **names, int max);
/* Picks the host address ranks should rendezvous on for a kilnd at server ("HOST:PORT"):
 * 127.0.0.1 when the server is on loopback, else the local address that routes to it.
 * Writes into buf (>= 64 bytes). */
void agent_pick_address(const char *server, char *buf, size_t n);

#endif /* KILN_AGENT_H */
