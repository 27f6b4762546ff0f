/* daemon.c - the --health probe (over httpc/, the CLI's HTTP client) and systemd notifications
 * (libsystemd's sd_notify) that kilnd and kiln-agent share; see daemon.h. */
#include "cmd/daemon.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "base/base.h"
#include "httpc/httpc.h"

void daemon_local_url(const char *listen_addr, bool tls, const char *path, char *out, size_t n)
{
    const char *colon = listen_addr ? strrchr(listen_addr, ':') : NULL;
    const char *port = colon ? colon + 1 : "80";
    char host[128] = "127.0.0.1";
    size_t hl = colon ? (size_t)(colon - listen_addr) : 0;
    if (hl > 0 && hl < sizeof host) {
        memcpy(host, listen_addr, hl);
        host[hl] = '\0';
        if (!strcmp(host, "0.0.0.0"))
            strcpy(host, "127.0.0.1");
        else if (!strcmp(host, "[::]"))
            strcpy(host, "[::1]");
    }
    snprintf(out, n, "%s://%s:%s%s", tls ? "https" : "http", host, port, path);
}

int daemon_probe(const char *url, const char *ca_file, long timeout_ms, char *why, size_t n)
{
    httpc_req_t req = {.url = url, .ca_file = ca_file, .no_verify = !ca_file || !*ca_file, .timeout_ms = timeout_ms};
    httpc_res_t res;
    httpc_end_t end = httpc_perform(&req, &res);
    long status = res.status;
    if (end != HTTPC_OK)
        snprintf(why, n, "%s: %s", url, res.error);
    else if (status != 200)
        snprintf(why, n, "%s answered HTTP %ld", url, status);
    else
        snprintf(why, n, "%s: ok", url);
    httpc_res_deinit(&res);
    return end == HTTPC_OK && status == 200 ? 0 : 1;
}

void daemon_ready(const char *status)
{
    sd_notifyf(0, "READY=1\nSTATUS=%s\nMAINPID=%lu", status, (unsigned long)getpid());
}

void daemon_stopping(void)
{
    sd_notify(0, "STOPPING=1");
}

typedef struct watchdog {
    daemon_alive_fn alive;
    void *ud;
    uint64_t usec;
} watchdog_t;

static void *watchdog_main(void *arg)
{
    watchdog_t *w = arg;
    bool failing = false;
    for (;;) {
        bool ok = w->alive(w->ud);
        if (ok)
            sd_notify(0, "WATCHDOG=1");
        else if (!failing)
            log_warn("watchdog: the service does not answer its own health check; systemd's watchdog will "
                     "restart it unless it recovers");
        failing = !ok;
        usleep((useconds_t)(w->usec / 2));
    }
    return NULL;
}

void daemon_watchdog_start(daemon_alive_fn alive, void *ud)
{
    static watchdog_t w;
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0)
        return;
    w.alive = alive;
    w.ud = ud;
    w.usec = usec;
    pthread_t t;
    if (pthread_create(&t, NULL, watchdog_main, &w) != 0) {
        log_warn("watchdog: could not start its thread; systemd's watchdog will restart the service");
        return;
    }
    pthread_detach(t);
    log_info("systemd watchdog: pinging every %.1f s", (double)usec / 2e6);
}
