/* harness.h - shared helpers for kiln's Criterion suites: throwaway PostgreSQL databases in the
 * cluster tests/run.sh starts, child processes (kilnd, agents), and a small HTTP client.
 * Test-only code; nothing in the product links it. */
#ifndef KILN_TEST_HARNESS_H
#define KILN_TEST_HARNESS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "base/job_states.h"

/* Creates a fresh database named "<prefix>_<pid>_<counter>" in the test cluster (KILN_PG_HOST,
 * KILN_PG_PORT) and returns its libpq connection string. Caller owns the result (free()).
 * Returns NULL (and prints why) when no test cluster is configured or creation fails. */
char *th_pg_create_db(const char *prefix);

/* Ends the test cluster's client backends that match the SQL condition `where` on
 * pg_stat_activity (e.g. "pid = 123", "datname = 'x'"; the caller's own connection is never one)
 * and waits until they are gone, their sockets closed and their locks released: a killed
 * backend exits when it next runs, not when pg_terminate_backend returns. terminate false only
 * waits. false (and a message) when some are left after timeout_ms or the cluster is unreachable. */
bool th_pg_end_backends(const char *where, bool terminate, int timeout_ms);

/* The first column of the first row sql answers on the database at db_url, as a number (0 when
 * it answers no row); the test fails when it cannot connect or sql fails. */
long long th_pg_value(const char *db_url, const char *sql);

/* Directory holding the built binaries (KILN_BIN_DIR, default "build/bin"). Static storage. */
const char *th_bin_dir(void);

/* Picks a TCP port free on 127.0.0.1 now, drawn below the kernel's ephemeral range (where
 * outgoing connections cannot take it before the caller binds it); -1 when none is found. */
int th_free_port(void);

/* The file at path under $KILN_ROOT (the repository; tests/run.sh sets it, "." without), whole and
 * NUL-terminated; NULL when it cannot be read. Caller frees. */
char *th_repo_file(const char *path);

/* Calls fn with the path ("store/job.c") and whole text of each file of the directory dir under
 * $KILN_ROOT whose name ends in suffix, in the order of their names. Returns how many it read; -1
 * when the directory or a file cannot be read. */
int th_repo_dir_each(const char *dir, const char *suffix, void (*fn)(const char *path, const char *text, void *ctx),
                     void *ctx);
/* th_repo_dir_each over the migrations ("migrations/NNNN_x.sql"): the order kilnd applies them in,
 * so that what fn keeps last is what the schema has now. */
int th_migrations_each(void (*fn)(const char *path, const char *text, void *ctx), void *ctx);

/* Removes path and everything under it (links themselves, not what they point to); true when
 * nothing of it is left (also when it did not exist). */
bool th_rm_tree(const char *path);

/* Starts argv[0] (a path) with argv, extra environment entries "K=V" (NULL-terminated, may be
 * NULL) added to the current environment, stdout+stderr appended to log_path (may be NULL for
 * inherited). Returns the child's pid or -1. The child gets its own process group. */
pid_t th_spawn(char *const argv[], char *const env_extra[], const char *log_path);
/* Sends sig to the child's process group and waits up to timeout_ms for it; then SIGKILL.
 * Returns the wait status, or -1. */
int th_stop(pid_t pid, int sig, int timeout_ms);
/* Waits until a TCP connect to 127.0.0.1:port succeeds; false after timeout_ms. */
bool th_wait_port(int port, int timeout_ms);

/* A directory with a test CA and certificates (scripts/make-certs.sh: ca.pem, server.pem/.key
 * for localhost and 127.0.0.1, agent.pem/.key for mutual TLS): KILN_TEST_TLS_DIR when set
 * (tests/run.sh makes one per run), else made once per process. Static storage; NULL (and a
 * message) when openssl fails. */
const char *th_tls_dir(void);

/* The API token th_http sends ("Authorization: Bearer ...") unless a request's own headers carry
 * an Authorization line ("Authorization:" alone sends none), and the CA file it verifies https
 * servers against. Copied; NULL clears. Process-wide (each Criterion test is its own process). */
void th_http_set_token(const char *token);
void th_http_set_ca(const char *ca_file);
const char *th_http_token(void);
const char *th_http_ca(void);

/* One HTTP request with libcurl. body may be NULL; headers is a NULL-terminated list of
 * "Name: value" lines (may be NULL). On success returns 0, sets *status and *out (heap,
 * NUL-terminated; caller frees). timeout_ms bounds the whole request. */
int th_http(const char *method, const char *url, const char *body, const char *const headers[],
            long *status, char **out, long timeout_ms);

/* th_http that also returns the response's header lines in *headers_out (heap; caller frees). */
int th_http_headers(const char *method, const char *url, const char *body, const char *const headers[],
                    long *status, char **out, char **headers_out, long timeout_ms);

/* th_http_headers that also gives the body's length (*out_len, may be NULL): for binary bodies.
 * HEAD asks for the headers alone. */
int th_http_bytes(const char *method, const char *url, const char *body, const char *const headers[],
                  long *status, char **out, size_t *out_len, char **headers_out, long timeout_ms);
/* th_http_headers with a body of bytes, data[0..len) (give its Content-Type in headers; the
 * default is application/json); headers_out may be NULL. */
int th_http_send(const char *method, const char *url, const void *data, size_t len, const char *const headers[],
                 long *status, char **out, char **headers_out, long timeout_ms);
/* s URL-encoded for a query string (NULL counts as ""). Caller frees. */
char *th_url_escape(const char *s);

/* gRPC through Python's grpcio (tests/grpc/grpc_client.py): NULL when protoc and /usr/bin/python3
 * with grpc and protobuf are there, else why not (a test skips with it). */
const char *th_grpc_python_missing(void);
/* Generates kiln_pb2.py from $KILN_ROOT/proto/kiln.proto into dir; the protoc command's status. */
int th_protoc_python(const char *dir);
/* Runs tests/grpc/grpc_client.py (Debian's python3 with grpcio) over plan (taken; see the client for
 * its shape), written first to path: returns its answers, one JSON object a line, as a new array;
 * NULL when the plan could not be written, the client failed or printed a line that is no JSON
 * (said then holds what it printed or why, up to n bytes). */
json_t *th_grpc_client(json_t *plan, const char *path, char *said, size_t n);
/* th_grpc_client over a plaintext channel to target with the generated modules in dir: calls (a JSON
 * array; taken), the plan written to dir/NAME.json. */
json_t *th_grpc_plain(const char *target, const char *dir, json_t *calls, const char *name, char *said, size_t n);
/* The first line of a text file, without its newline (heap), or NULL when it cannot be read. */
char *th_read_line(const char *path);

/* ---- job states, as the waits below take them ---- */

/* A set of job states for the waits: names separated by '|' ("SCHEDULED|RUNNING"); an empty name
 * (a leading '|') matches nothing. TH_JOB_ENDED is the states base/job_states.h says a job ends in,
 * "COMPLETED|FAILED|STOPPED" (a pointer into a literal): wait with it for a job to end, whichever
 * way. TH_OR_ENDED is the same after a '|' (a string literal), to follow other states:
 * "RESTARTING" TH_OR_ENDED. */
#define TH_ENDED_BAR_(name, num, kind) TH_ENDED_BAR_##kind(name)
#define TH_ENDED_BAR_ENDED(name) "|" #name
#define TH_ENDED_BAR_WAITING(name)
#define TH_ENDED_BAR_HOLDING(name)
#define TH_ENDED_BAR_PARKED(name)
#define TH_OR_ENDED KILN_JOB_STATES(TH_ENDED_BAR_)
#define TH_JOB_ENDED (TH_OR_ENDED + 1)

/* Whether state (NULL: none) is one of states (a set as above). */
bool th_state_in(const char *state, const char *states);

/* Polls GET url every 100 ms until the JSON field "state" of the reply is one of states (a set as
 * above, e.g. TH_JOB_ENDED); returns the final reply (caller frees) or NULL after timeout_ms. */
char *th_wait_json_state(const char *url, const char *states, long timeout_ms);

/* ---- raw connections (front-door tests: limits, deadlines, broken framing) ---- */

/* Raises this process's open-file limit to its hard limit; returns the limit now in force. */
long th_nofile_raise(void);
/* A TCP connection from local address from ("127.0.0.2"; NULL: any) to 127.0.0.1:port, blocking
 * or not; the descriptor or -1. A non-blocking one may still be connecting. */
int th_tcp_connect(const char *from, int port, bool nonblock);
/* Waits until fd has bytes or its end; true when it has its end (read gives 0 or an error) within
 * timeout_ms, false when it stays open (or has bytes, which it leaves unread). */
bool th_tcp_closed_within(int fd, int timeout_ms);
/* Sends len bytes of req on a new connection to 127.0.0.1:port and reads until the server closes
 * it or timeout_ms passes. *out (heap, NUL-terminated; caller frees) and *out_len get what came
 * back; *closed whether the server closed the connection. Returns 0, or -1 when no connection. */
int th_raw_exchange(int port, const void *req, size_t len, int timeout_ms, char **out, size_t *out_len,
                    bool *closed);

/* n idle connections opened from one local address to 127.0.0.1:port as fast as the server's
 * listen queue takes them, as a client that holds many would; those the server refuses (closes)
 * are counted and closed here, the others held until th_flood_end. */
typedef struct th_flood {
    int *fds;                 /* the held ones (-1 for refused), n of them */
    int n, held, refused;
    int failed;               /* connect() itself failed (out of ports or descriptors) */
} th_flood_t;
/* Opens the connections and waits until exactly `expect_held` stay open (the rest refused), or
 * timeout_ms passes. Returns 0 when it got there, -1 otherwise (the counts say what it saw). */
int th_flood(th_flood_t *f, const char *from, int port, int n, int expect_held, int timeout_ms);
void th_flood_end(th_flood_t *f);

#endif
