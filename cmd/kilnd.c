/* kilnd.c - the control plane's main: reads flags (or KILN_* environment), connects to
 * PostgreSQL and applies migrations (svc_create), starts the REST and gRPC front ends, then waits
 * for SIGINT/SIGTERM and shuts down in order. All the logic lives in service/, store/ and api/. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "api/api.h"
#include "base/base.h"
#include "cmd/daemon.h"
#include "service/service.h"

static const char *USAGE =
    "--database-url URL (--tls-cert FILE --tls-key FILE | --insecure) [flags]\n"
    "kiln's control plane: REST and gRPC APIs, scheduler, PostgreSQL state.";

/* Reads a PEM file named by a flag into *out (heap). */
static int read_pem(const char *flag, const char *path, char **out)
{
    kiln_err_t err;
    *out = NULL;
    if (!path || !*path)
        return 0;
    if (kiln_file_read(path, out, NULL, &err) != 0) {
        fprintf(stderr, "kilnd: --%s: %s\n", flag, err.message);
        return 2;
    }
    if (!strstr(*out, "-----BEGIN ")) {
        fprintf(stderr, "kilnd: --%s: %s is not a PEM file\n", flag, path);
        free(*out);
        *out = NULL;
        return 2;
    }
    return 0;
}

/* The watchdog's check: kilnd's own REST server answers /healthz. */
static bool kilnd_alive(void *url)
{
    char why[512];
    return daemon_probe(url, NULL, 5000, why, sizeof why) == 0;
}

int main(int argc, char **argv)
{
    const char *database_url = NULL, *http_addr = "127.0.0.1:8080", *grpc_addr = "127.0.0.1:9090";
    const char *migrations_dir = NULL, *log_level = "info";
    int64_t hb_interval = 1000, hb_timeout = 10000, sched_interval = 500, pool = 16, grace = 10000;
    int64_t db_wait_s = 30, preempt_protect_after = 3, sched_default_runtime_s = 0;
    int64_t search_timeout_ms = SVC_SEARCH_TIMEOUT_MS;
    const char *artifact_dir = NULL;
    int64_t artifact_max_mb = 10240, log_retention_days = 0, janitor_interval_s = 3600, code_max_mb = 100;
    const char *tls_cert = NULL, *tls_key = NULL, *tls_ca = NULL;
    const char *bootstrap_file = NULL, *join_file = NULL, *database_url_file = NULL;
    bool insecure = false, no_auth = false, metrics_auth = false, health = false, tune_promoted_restart = false;
    bool agent_approval = false, agent_distinct_certs = false;
    int64_t register_per_min_addr = 60, register_per_min = 600;
    const char *tls_min = "1.2";
    int64_t per_address = API_NET_PER_ADDRESS, handshake_ms = API_NET_HANDSHAKE_MS, header_ms = API_NET_HEADER_MS;
    int64_t body_ms = API_NET_BODY_MS, idle_ms = API_NET_IDLE_MS;
    int64_t http_threads = API_HTTP_THREADS, http_ping_ms = API_HTTP_PING_MS;
    config_list_t cors = {0};
    config_flag_t flags[] = {
        {"database-url-file", "KILN_DATABASE_URL_FILE", CONFIG_STR, &database_url_file, CONFIG_ANY,
         "read the database URL from this file (a systemd credential or a Secret: keeps a password out of the "
         "environment)"},
        {"database-url", "KILN_DATABASE_URL", CONFIG_STR, &database_url, CONFIG_ANY,
         "PostgreSQL connection string (libpq), e.g. \"host=/tmp/pg dbname=kiln\" (required)"},
        {"http-addr", "KILN_HTTP_ADDR", CONFIG_STR, &http_addr, CONFIG_ANY, "REST listen address"},
        {"grpc-addr", "KILN_GRPC_ADDR", CONFIG_STR, &grpc_addr, CONFIG_ANY, "gRPC listen address"},
        {"migrations-dir", "KILN_MIGRATIONS_DIR", CONFIG_STR, &migrations_dir, CONFIG_ANY,
         "apply the *.sql migrations of this directory instead of the ones built in"},
        {"heartbeat-interval-ms", "KILN_HEARTBEAT_INTERVAL_MS", CONFIG_INT, &hb_interval, CONFIG_RANGE(10, 3600000),
         "how often agents heartbeat"},
        {"heartbeat-timeout-ms", "KILN_HEARTBEAT_TIMEOUT_MS", CONFIG_INT, &hb_timeout, CONFIG_RANGE(20, 86400000),
         "silence after which a worker is declared dead and its jobs leave RUNNING"},
        {"sched-interval-ms", "KILN_SCHED_INTERVAL_MS", CONFIG_INT, &sched_interval, CONFIG_RANGE(1, 3600000),
         "scheduler tick when nothing wakes it"},
        {"db-pool-size", "KILN_DB_POOL_SIZE", CONFIG_INT, &pool, CONFIG_RANGE(1, 1024), "database connections for requests"},
        {"stop-grace-ms", "KILN_STOP_GRACE_MS", CONFIG_INT, &grace, CONFIG_RANGE(0, 3600000),
         "time ranks get between SIGTERM and SIGKILL when a job is stopped"},
        {"preempt-protect-after", "KILN_PREEMPT_PROTECT_AFTER", CONFIG_INT, &preempt_protect_after,
         CONFIG_RANGE(1, 1000), "a job preempted this many times is no longer preempted by jobs of its priority or "
         "lower until it ends (no job is preempted over and over)"},
        {"sched-default-runtime-s", "KILN_SCHED_DEFAULT_RUNTIME_S", CONFIG_INT, &sched_default_runtime_s,
         CONFIG_RANGE(0, 604800), "the run time the scheduler assumes for a waiting job when nothing of its model has "
         "run yet, so backfill may start it (labelled an estimate in its pending reason; it is preempted if it "
         "outruns it and a job it was backfilled ahead of needs its slots); 0: such a job is never backfilled"},
        {"search-timeout-ms", "KILN_SEARCH_TIMEOUT_MS", CONFIG_INT, &search_timeout_ms, CONFIG_RANGE(100, 3600000),
         "a job search (kiln search, GET /v1/jobs, SearchJobs) is refused (400: narrow the filter) when one of its "
         "database statements runs longer than this, so that no search holds the database"},
        {"db-wait-s", "KILN_DB_WAIT_S", CONFIG_INT, &db_wait_s, CONFIG_RANGE(0, 86400),
         "keep retrying an unreachable database this long at start-up (0: fail at once)"},
        {"log-level", "KILN_LOG_LEVEL", CONFIG_STR, &log_level, CONFIG_ONE_OF(LOG_LEVEL_CHOICES),
         "the least severe log lines written"},
        {"tls-cert", "KILN_TLS_CERT", CONFIG_STR, &tls_cert, CONFIG_ANY, "PEM certificate (chain) REST and gRPC serve TLS with"},
        {"tls-key", "KILN_TLS_KEY", CONFIG_STR, &tls_key, CONFIG_ANY, "PEM private key of --tls-cert"},
        {"tls-ca", "KILN_TLS_CA", CONFIG_STR, &tls_ca, CONFIG_ANY,
         "PEM CA: agents must present a client certificate it signed (mutual TLS)"},
        {"tls-min-version", "KILN_TLS_MIN_VERSION", CONFIG_STR, &tls_min, CONFIG_ONE_OF("1.2|1.3"),
         "the oldest TLS version REST and gRPC accept (both offer only forward-secret AEAD suites)"},
        {"max-connections-per-address", "KILN_MAX_CONNECTIONS_PER_ADDRESS", CONFIG_INT, &per_address, CONFIG_RANGE(0, 1000000),
         "connections one client address (IPv6: its /64) may hold open on each of the REST and gRPC ports; more are "
         "refused at once (0: no limit; raise it when many clients reach kilnd through one proxy)"},
        {"handshake-timeout-ms", "KILN_HANDSHAKE_TIMEOUT_MS", CONFIG_INT, &handshake_ms, CONFIG_RANGE(100, 3600000),
         "a connection's TLS handshake must end this soon after it connects, or it is cut off"},
        {"request-header-timeout-ms", "KILN_REQUEST_HEADER_TIMEOUT_MS", CONFIG_INT, &header_ms, CONFIG_RANGE(100, 3600000),
         "a REST request's headers must be in this soon after its first byte (or after the handshake)"},
        {"request-body-timeout-ms", "KILN_REQUEST_BODY_TIMEOUT_MS", CONFIG_INT, &body_ms, CONFIG_RANGE(100, 3600000),
         "a REST request's body must be in this soon after its headers, a second more for each KiB that arrived"},
        {"idle-timeout-ms", "KILN_IDLE_TIMEOUT_MS", CONFIG_INT, &idle_ms, CONFIG_RANGE(1000, 86400000),
         "a REST connection between requests, or a gRPC connection without calls, is closed after this"},
        {"http-threads", "KILN_HTTP_THREADS", CONFIG_INT, &http_threads, CONFIG_RANGE(1, 64),
         "REST request handler threads (handlers wait on the database, so several keep one slow call from holding "
         "up the others)"},
        {"http-ping-ms", "KILN_HTTP_PING_MS", CONFIG_INT, &http_ping_ms, CONFIG_RANGE(100, 3600000),
         "a followed log stream (SSE) that has been silent this long gets a keep-alive comment, and a vanished "
         "client is noticed"},
        {"insecure", "KILN_INSECURE", CONFIG_BOOL, &insecure, CONFIG_ANY,
         "serve plain text (no TLS): anything on the network path can read and change the traffic"},
        {"bootstrap-token-file", "KILN_BOOTSTRAP_TOKEN_FILE", CONFIG_STR, &bootstrap_file, CONFIG_ANY,
         "first start on an empty database: create the cluster admin \"admin\" with the token in FILE "
         "(read when FILE exists, else created 0600)"},
        {"join-token-file", "KILN_JOIN_TOKEN_FILE", CONFIG_STR, &join_file, CONFIG_ANY,
         "the token agents register with (read when FILE exists, else created 0600); cluster admins also make "
         "join tokens with a number of uses and an expiry (kiln join-tokens create)"},
        {"agent-approval", "KILN_AGENT_APPROVAL", CONFIG_BOOL, &agent_approval, CONFIG_ANY,
         "a newly registered worker gets no work until a cluster admin approves it (kiln workers approve ID)"},
        {"agent-distinct-certs", "KILN_AGENT_DISTINCT_CERTS", CONFIG_BOOL, &agent_distinct_certs, CONFIG_ANY,
         "mutual TLS: refuse to register a worker with a client certificate another live worker is bound to"},
        {"register-per-min-per-addr", "KILN_REGISTER_PER_MIN_PER_ADDR", CONFIG_INT, &register_per_min_addr, CONFIG_RANGE(0, 1000000),
         "worker registrations a minute from one source address, in bursts of up to a sixth of it (0: no limit); "
         "an agent re-registering with its own credential is not counted"},
        {"register-per-min", "KILN_REGISTER_PER_MIN", CONFIG_INT, &register_per_min, CONFIG_RANGE(0, 1000000),
         "worker registrations a minute this kilnd takes in all (0: no limit)"},
        {"cors-origin", "KILN_CORS_ORIGINS", CONFIG_LIST, &cors, CONFIG_ANY,
         "a browser origin (https://ui.example.com) allowed to call the REST API"},
        {"metrics-auth", "KILN_METRICS_AUTH", CONFIG_BOOL, &metrics_auth, CONFIG_ANY, "GET /metrics needs an API token"},
        {"artifact-dir", "KILN_ARTIFACT_DIR", CONFIG_STR, &artifact_dir, CONFIG_ANY,
         "keep the jobs' artifacts (rank 0's output directory: final model, plan, samples) here (created "
         "0700); replicas give the same directory on shared storage to serve each other's artifacts; "
         "without it, no artifacts are kept"},
        {"artifact-max-job-mb", "KILN_ARTIFACT_MAX_JOB_MB", CONFIG_INT, &artifact_max_mb, CONFIG_RANGE(1, 1 << 30),
         "largest total of one job's artifacts; a bigger upload is refused, with the reason in the job's log"},
        {"code-max-mb", "KILN_CODE_MAX_MB", CONFIG_INT, &code_max_mb, CONFIG_RANGE(1, 100000),
         "largest code archive a client may upload for script jobs (POST /v1/code; kept in --artifact-dir); "
         "archives may hold ten times as much uncompressed"},
        {"log-retention-days", "KILN_LOG_RETENTION_DAYS", CONFIG_INT, &log_retention_days, CONFIG_RANGE(0, 100000),
         "drop the logs of jobs that ended more than N days ago (0: keep them)"},
        {"janitor-interval-s", "KILN_JANITOR_INTERVAL_S", CONFIG_INT, &janitor_interval_s, CONFIG_RANGE(1, 604800),
         "how often the clean-up pass (log retention, deleted jobs' artifact files) runs"},
        {"health", NULL, CONFIG_BOOL, &health, CONFIG_ANY,
         "check a running kilnd: GET /healthz at --http-addr (https with --tls-cert), exit 0 when it answers"},
        {"tune-promoted-restart", "KILN_TUNE_PROMOTED_RESTART", CONFIG_BOOL, &tune_promoted_restart, CONFIG_ANY,
         "for measuring what pause and resume saves: a hyperband trial promoted past its rung trains again from "
         "step 0 to its next rung, as stopping-based tuners (Ray Tune, Determined) do, instead of resuming from "
         "its checkpoint (its checkpoints are kept; its steps count every step trained)"},
        {"no-auth", "KILN_NO_AUTH", CONFIG_BOOL, &no_auth, CONFIG_ANY,
         "turn authentication off: every caller is a cluster admin (benchmarks, trusted single-user "
         "machines; needs --insecure)"},
    };
    kiln_err_t err;
    kiln_err_clear(&err);
    log_init("kilnd");
    int rc = config_parse(argc, argv, flags, KILN_ARRAY_LEN(flags), USAGE, NULL, &err);
    if (rc == 1)
        return 0;
    if (rc) {
        fprintf(stderr, "kilnd: %s\n", err.message);
        if (err.hint[0])
            fprintf(stderr, "hint: %s\n", err.hint);
        return 2;
    }
    if (health) {
        /* a container's HEALTHCHECK: the same flags and environment as the kilnd it checks */
        char url[256], why[512];
        daemon_local_url(http_addr, tls_cert && *tls_cert, "/healthz", url, sizeof url);
        int bad = daemon_probe(url, NULL, 5000, why, sizeof why);
        fprintf(bad ? stderr : stdout, "kilnd: %s\n", why);
        return bad;
    }
    log_level_t level = LOG_INFO;
    log_level_parse(log_level, &level); /* one of the table's choices */
    log_set_level(level);
    char *url_from_file = NULL;
    if (database_url_file && *database_url_file) {
        if (database_url && *database_url) {
            fprintf(stderr, "kilnd: the database URL comes from both --database-url and --database-url-file; give it once\n");
            return 2;
        }
        size_t len = 0;
        if (kiln_file_read(database_url_file, &url_from_file, &len, &err) != 0) {
            fprintf(stderr, "kilnd: --database-url-file: %s\n", err.message);
            return 2;
        }
        while (len > 0 && (url_from_file[len - 1] == '\n' || url_from_file[len - 1] == '\r' || url_from_file[len - 1] == ' '))
            url_from_file[--len] = '\0';
        database_url = url_from_file;
    }
    if (!database_url || !*database_url) {
        fprintf(stderr, "kilnd: no database given\nhint: pass --database-url or set "
                        "KILN_DATABASE_URL to a libpq connection string "
                        "(\"postgresql://user@host/db\" or \"host=/tmp/pg dbname=kiln\")\n");
        return 2;
    }
    bool has_cert = tls_cert && *tls_cert, has_key = tls_key && *tls_key;
    if (has_cert != has_key) {
        fprintf(stderr, "kilnd: --tls-cert and --tls-key go together\n");
        return 2;
    }
    if (!has_cert && !insecure) {
        fprintf(stderr, "kilnd: no TLS certificate\nhint: pass --tls-cert FILE --tls-key FILE to serve "
                        "REST and gRPC over TLS, or --insecure to serve plain text\n");
        return 2;
    }
    if (has_cert && insecure) {
        fprintf(stderr, "kilnd: --insecure and --tls-cert contradict each other\n");
        return 2;
    }
    if (tls_ca && *tls_ca && !has_cert) {
        fprintf(stderr, "kilnd: --tls-ca (mutual TLS for agents) needs --tls-cert and --tls-key\n");
        return 2;
    }
    if (no_auth && !insecure) {
        fprintf(stderr, "kilnd: --no-auth is for plain-text test set-ups only: it needs --insecure\n");
        return 2;
    }
    for (int i = 0; i < cors.n; i++)
        if (strncmp(cors.v[i], "http://", 7) != 0 && strncmp(cors.v[i], "https://", 8) != 0) {
            fprintf(stderr, "kilnd: --cors-origin \"%s\" is not an origin (scheme://host[:port])\n", cors.v[i]);
            return 2;
        }
    if (hb_timeout < 2 * hb_interval) {
        fprintf(stderr, "kilnd: --heartbeat-timeout-ms (%lld) must be at least twice --heartbeat-interval-ms (%lld)\n",
                (long long)hb_timeout, (long long)hb_interval);
        return 2;
    }
    if (agent_distinct_certs && !(tls_ca && *tls_ca)) {
        fprintf(stderr, "kilnd: --agent-distinct-certs needs mutual TLS (--tls-ca): without client certificates "
                        "there is nothing to tell workers apart by\n");
        return 2;
    }
    api_tls_min_t tls_min_version = !strcmp(tls_min, "1.3") ? API_TLS_1_3 : API_TLS_1_2;
    api_net_limits_t limits = {.per_address = per_address ? (int)per_address : -1,
                               .handshake_ms = (int)handshake_ms, .header_ms = (int)header_ms,
                               .body_ms = (int)body_ms, .idle_ms = (int)idle_ms};
    /* Every connection is a descriptor: take what the hard limit allows (the front ends size their
     * totals from it). */
    struct rlimit nofile;
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
        nofile.rlim_cur = nofile.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &nofile) != 0)
            log_warn("could not raise the open file limit to %llu", (unsigned long long)nofile.rlim_max);
    }
    char *cert_pem = NULL, *key_pem = NULL, *ca_pem = NULL;
    if (read_pem("tls-cert", tls_cert, &cert_pem) || read_pem("tls-key", tls_key, &key_pem) ||
        read_pem("tls-ca", tls_ca, &ca_pem)) {
        free(cert_pem);
        free(key_pem);
        free(ca_pem);
        return 2;
    }

    /* Signals: block them in every thread (gRPC and libmicrohttpd start their own), take them
     * with sigwait() here. A vanished client must not kill the process. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    svc_config_t cfg = {
        .database_url = database_url,
        .heartbeat_interval_ms = (int)hb_interval,
        .heartbeat_timeout_ms = (int)hb_timeout,
        .sched_interval_ms = (int)sched_interval,
        .db_pool_size = (int)pool,
        .migrations_dir = migrations_dir,
        .stop_grace_ms = (int)grace,
        .preempt_protect_after = (int)preempt_protect_after,
        .sched_default_runtime_s = (int)sched_default_runtime_s,
        .bootstrap_token_file = bootstrap_file,
        .join_token_file = join_file,
        .auth_disabled = no_auth,
        .artifact_dir = artifact_dir && *artifact_dir ? artifact_dir : NULL,
        .artifact_max_job_bytes = artifact_max_mb << 20,
        .log_retention_days = (int)log_retention_days,
        .janitor_interval_ms = (int)(janitor_interval_s * 1000),
        .code_max_bytes = code_max_mb << 20,
        .agent_approval = agent_approval,
        .agent_distinct_certs = agent_distinct_certs,
        .register_per_min_addr = (int)register_per_min_addr,
        .register_per_min = (int)register_per_min,
        .tune_promoted_restart = tune_promoted_restart,
        .search_timeout_ms = (int)search_timeout_ms,
    };
    api_tls_t tls = {.cert_pem = cert_pem, .key_pem = key_pem, .ca_pem = ca_pem, .min_version = tls_min_version};
    if (insecure)
        log_warn("SERVING PLAIN TEXT (--insecure): job specs, logs, tokens and agent credentials cross "
                 "the network unencrypted, and anything on the path can pose as kilnd");
    svc_t *svc = NULL;
    api_http_t *http = NULL;
    api_grpc_t *grpc = NULL;
    int status = 1;
    /* The database may come up after kilnd (containers, boot order): retry while it is
     * unreachable, up to --db-wait-s. SIGINT/SIGTERM are blocked, so check them meanwhile. */
    int64_t give_up = kiln_mono_us() + db_wait_s * 1000000;
    for (;;) {
        kiln_err_clear(&err);
        rc = svc_create(&cfg, &svc, &err);
        if (rc != KILN_EDB || kiln_mono_us() >= give_up)
            break;
        log_warn("%s; retrying for up to %llds", err.message,
                 (long long)((give_up - kiln_mono_us()) / 1000000));
        struct timespec one = {.tv_sec = 1, .tv_nsec = 0};
        int sig = sigtimedwait(&set, NULL, &one);
        if (sig == SIGINT || sig == SIGTERM) {
            log_info("received a signal while waiting for the database: exiting");
            goto out;
        }
    }
    if (rc) {
        log_error("could not start: %s", err.message);
        if (err.hint[0])
            log_error("hint: %s", err.hint);
        goto out;
    }
    kiln_err_clear(&err);
    api_http_config_t hc = {.addr = http_addr, .tls = &tls, .cors_origins = cors.v, .ncors = cors.n,
                            .metrics_auth = metrics_auth, .limits = limits, .threads = (int)http_threads,
                            .ping_ms = (int)http_ping_ms};
    rc = api_http_start(svc, &hc, &http, &err);
    if (rc) {
        log_error("could not start the REST server on %s: %s", http_addr, err.message);
        goto out;
    }
    log_info("REST API listening on %s", http_addr);
    kiln_err_clear(&err);
    api_grpc_config_t gc = {.addr = grpc_addr, .tls = &tls, .limits = limits};
    rc = api_grpc_start_with(svc, &gc, &grpc, &err);
    if (rc == KILN_EUNSUPP) {
        log_warn("gRPC server not started: %s", err.message);
        grpc = NULL;
    } else if (rc) {
        log_error("could not start the gRPC server on %s: %s", grpc_addr, err.message);
        goto out;
    } else {
        log_info("gRPC API listening on %s", grpc_addr);
    }
    log_info("kilnd ready");
    char status_line[300];
    snprintf(status_line, sizeof status_line, "REST on %s, gRPC on %s", http_addr, grpc ? grpc_addr : "(none)");
    daemon_ready(status_line);
    static char self_url[256];
    daemon_local_url(http_addr, has_cert, "/healthz", self_url, sizeof self_url);
    daemon_watchdog_start(kilnd_alive, self_url);

    int sig = 0;
    sigwait(&set, &sig);
    log_info("received %s: shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
    daemon_stopping();
    status = 0;
out:
    api_http_stop(http);
    api_grpc_stop(grpc);
    svc_destroy(svc);
    free(cert_pem);
    if (key_pem) {
        memset(key_pem, 0, strlen(key_pem));
        free(key_pem);
    }
    free(ca_pem);
    if (url_from_file) {
        memset(url_from_file, 0, strlen(url_from_file));
        free(url_from_file);
    }
    if (status == 0)
        log_info("stopped");
    return status;
}
