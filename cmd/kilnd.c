/* kilnd.c - the control plane's main: reads flags (or KILN_* environment), connects to
 * PostgreSQL and applies migrations (svc_create), starts the REST and gRPC front ends, then waits
 * for SIGINT/SIGTERM and shuts down in order. All the logic lives in service/, store/ and api/. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "api/api.h"
#include "base/base.h"
#include "service/service.h"

static const char *USAGE =
    "--database-url URL [flags]\n"
    "kiln's control plane: REST and gRPC APIs, scheduler, PostgreSQL state.";

int main(int argc, char **argv)
{
    const char *database_url = NULL, *http_addr = "127.0.0.1:8080", *grpc_addr = "127.0.0.1:9090";
    const char *migrations_dir = NULL, *log_level = NULL;
    int64_t hb_interval = 1000, hb_timeout = 10000, sched_interval = 500, pool = 16, grace = 10000;
    int64_t db_wait_s = 30;
    config_flag_t flags[] = {
        {"database-url", "KILN_DATABASE_URL", CONFIG_STR, &database_url,
         "PostgreSQL connection string (libpq), e.g. \"host=/tmp/pg dbname=kiln\" (required)"},
        {"http-addr", "KILN_HTTP_ADDR", CONFIG_STR, &http_addr, "REST listen address"},
        {"grpc-addr", "KILN_GRPC_ADDR", CONFIG_STR, &grpc_addr, "gRPC listen address"},
        {"migrations-dir", "KILN_MIGRATIONS_DIR", CONFIG_STR, &migrations_dir,
         "apply the *.sql migrations of this directory instead of the ones built in"},
        {"heartbeat-interval-ms", "KILN_HEARTBEAT_INTERVAL_MS", CONFIG_INT, &hb_interval,
         "how often agents heartbeat"},
        {"heartbeat-timeout-ms", "KILN_HEARTBEAT_TIMEOUT_MS", CONFIG_INT, &hb_timeout,
         "silence after which a worker is declared dead and its jobs leave RUNNING"},
        {"sched-interval-ms", "KILN_SCHED_INTERVAL_MS", CONFIG_INT, &sched_interval,
         "scheduler tick when nothing wakes it"},
        {"db-pool-size", "KILN_DB_POOL_SIZE", CONFIG_INT, &pool, "database connections for requests"},
        {"stop-grace-ms", "KILN_STOP_GRACE_MS", CONFIG_INT, &grace,
         "time ranks get between SIGTERM and SIGKILL when a job is stopped"},
        {"db-wait-s", "KILN_DB_WAIT_S", CONFIG_INT, &db_wait_s,
         "keep retrying an unreachable database this long at start-up (0: fail at once)"},
        {"log-level", "KILN_LOG_LEVEL", CONFIG_STR, &log_level, "debug | info | warn | error"},
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
    if (log_level) {
        static const char *const names[] = {"debug", "info", "warn", "error"};
        for (int i = 0; i < 4; i++)
            if (strcmp(log_level, names[i]) == 0)
                log_set_level((log_level_t)i);
    }
    if (!database_url || !*database_url) {
        fprintf(stderr, "kilnd: no database given\nhint: pass --database-url or set "
                        "KILN_DATABASE_URL to a libpq connection string "
                        "(\"postgresql://user@host/db\" or \"host=/tmp/pg dbname=kiln\")\n");
        return 2;
    }
    if (hb_interval < 10 || hb_timeout < 2 * hb_interval || pool < 1 || sched_interval < 1 || grace < 0) {
        fprintf(stderr, "kilnd: invalid timing flags: heartbeat-timeout-ms must be at least twice "
                        "heartbeat-interval-ms (>= 10), pool and intervals positive\n");
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
    };
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
            return 1;
        }
    }
    if (rc) {
        log_error("could not start: %s", err.message);
        if (err.hint[0])
            log_error("hint: %s", err.hint);
        goto out;
    }
    kiln_err_clear(&err);
    rc = api_http_start(svc, http_addr, &http, &err);
    if (rc) {
        log_error("could not start the REST server on %s: %s", http_addr, err.message);
        goto out;
    }
    log_info("REST API listening on %s", http_addr);
    kiln_err_clear(&err);
    rc = api_grpc_start(svc, grpc_addr, &grpc, &err);
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

    int sig = 0;
    sigwait(&set, &sig);
    log_info("received %s: shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
    status = 0;
out:
    api_http_stop(http);
    api_grpc_stop(grpc);
    svc_destroy(svc);
    if (status == 0)
        log_info("stopped");
    return status;
}
