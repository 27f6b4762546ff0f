/* api_test.h - fixture for the REST suite: a fresh database, the service and the REST server
 * in the test process (each Criterion test is its own forked process), and helpers that drive
 * it over real HTTP with libcurl and feed it as an agent would through the service. */
#ifndef KILN_TESTS_API_TEST_H
#define KILN_TESTS_API_TEST_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>

#include "api/api.h"
#include "service/service.h"
#include "tests/common/harness.h"

extern svc_t *at_svc;
extern char at_base[64];          /* "http://127.0.0.1:PORT" */
extern char at_worker[128];       /* id of the worker registered by at_setup */
extern char at_admin_token[128];  /* the bootstrap cluster admin's token (th_http sends it) */

/* Name of the fixture's database (static storage), its connection string, and the fixture's
 * temporary directory (the service's artifact store is its "artifacts"). */
const char *at_db_name(void);
const char *at_db_url(void);
const char *at_dir_path(void);
/* Uploads data as artifact name of the job's attempt through s, as worker's agent does
 * (BeginArtifacts, then chunks of `chunk` bytes from the offset kilnd answers). Returns the
 * first error's status (err filled) or 0. */
int at_upload(svc_t *s, const char *worker, const char *job_id, int attempt, const char *name, const void *data,
              size_t len, size_t chunk, kiln_err_t *err);
/* The first column of the first row of a query of the fixture's database (0 when none); the
 * query is printf-formatted. */
long long at_sql_int(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* SHA-256 of n bytes by sha256sum, a program that is not kiln's, into out (lower-case hex). */
void at_sha256sum(const void *data, size_t n, char out[65]);
/* A file of a job's checkpoint directory as its agent sees it. */
typedef struct at_ck_file {
    const char *name, *text;
} at_ck_file_t;
/* BeginArtifacts of kind CHECKPOINT for files[0..n) (n <= 8) by the fixture's worker: the status;
 * *committed (may be NULL) and, per file, the offset kilnd holds (off, room for n; may be NULL). */
int at_ck_begin(const char *job, int attempt, const at_ck_file_t *files, size_t n, bool *committed, int64_t *off,
                kiln_err_t *err);
/* PutArtifactChunk of kind CHECKPOINT: the whole text of file f in one chunk. */
int at_ck_send(const char *job, int attempt, const at_ck_file_t *f, kiln_err_t *err);
/* Criterion .init/.fini: database, service, REST server, one 4-slot CPU worker. */
void at_setup(void);
/* at_setup with REST options (CORS origins, metrics auth); addr is the fixture's. */
void at_setup_with(const api_http_config_t *cfg);
void at_teardown(void);

/* One request to the server; path is appended to at_base. Returns the parsed reply (caller
 * owns it; an empty JSON object if the body is not JSON) and the status in *status. raw, if
 * non-NULL, receives the body text (caller frees). */
json_t *at_req(const char *method, const char *path, const char *body, const char *const hdrs[],
               long *status, char **raw);
/* at_req as the cluster admin (th_http's token) that asserts the status is want, saying the
 * request and the reply when not. Returns the reply (caller decrefs). */
json_t *at_req_want(const char *method, const char *path, const char *body, long want);
/* POSTs a small valid spec named name with tags_json (an object, or NULL); returns the job id
 * (caller frees). key: Idempotency-Key or NULL. Asserts 201/200. */
char *at_create_job(const char *name, const char *tags_json, const char *key);
/* Creates user name (as the cluster admin) with a token, its secret copied into out (n bytes),
 * and, when project is not NULL, a role in it. */
void at_user_token(const char *name, const char *project, const char *role, char *out, size_t n);
const char *at_good_spec(void);   /* static text of a small valid spec */

/* Heartbeats the fixture's worker until it is assigned job_id (asserts within 10 s), reports
 * its ranks started; returns the attempt. */
int at_run_job(const char *job_id);
/* Ingests n lines "prefix i" for rank 0 of job_id / attempt through svc_agent_logs. */
void at_push_logs(const char *job_id, int attempt, const char *prefix, int first, int n);
/* Reports rank 0 of the job's attempt exited with code. */
void at_rank_exit(const char *job_id, int attempt, int code);

/* A Server-Sent Events client on its own thread. */
typedef struct at_sse {
    pthread_t thread;
    char url[512];
    char last_event_id[32];
    pthread_mutex_t lock;
    char *buf;
    size_t len, cap;
    bool done;
    long status;
    volatile bool stall;  /* while true, the write callback blocks (a slow reader) */
    volatile bool abort;  /* set to drop the connection (a client that vanishes) */
} at_sse_t;
void at_sse_open(at_sse_t *s, const char *path, const char *last_event_id);
/* Waits until the received text contains needle; false after timeout_ms. */
bool at_sse_wait(at_sse_t *s, const char *needle, int timeout_ms);
/* Waits for the stream to end (true) or timeout_ms (false; the request is then abandoned). */
bool at_sse_join(at_sse_t *s, int timeout_ms);
void at_sse_free(at_sse_t *s);

#endif
