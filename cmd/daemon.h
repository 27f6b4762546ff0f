/* daemon.h - what kilnd's and kiln-agent's mains share as long-running services: the --health
 * probe a container HEALTHCHECK runs, and systemd's readiness and watchdog notifications
 * (sd_notify; without NOTIFY_SOCKET they do nothing). */
#ifndef KILN_CMD_DAEMON_H
#define KILN_CMD_DAEMON_H

#include <stdbool.h>
#include <stddef.h>

/* "http://127.0.0.1:8080" from a listen address ("0.0.0.0:8080", ":8080", "[::]:8080" reach the
 * local host) into out (size n). */
void daemon_local_url(const char *listen_addr, bool tls, const char *path, char *out, size_t n);
/* GET url and check for a 200 within timeout_ms. https: verified against ca_file when given,
 * else not verified (a probe of this machine's port that sends nothing secret). Returns 0, or 1
 * with the reason in why (size n). */
int daemon_probe(const char *url, const char *ca_file, long timeout_ms, char *why, size_t n);

/* Tells systemd the service is ready (Type=notify), with a status line. */
void daemon_ready(const char *status);
/* Tells systemd the service is stopping. */
void daemon_stopping(void);
/* When systemd set a watchdog (WatchdogSec=), starts a thread that pings it at half the
 * interval while alive(ud) says the service works; a hung service stops pinging and systemd
 * restarts it. Does nothing otherwise. alive runs on that thread. */
typedef bool (*daemon_alive_fn)(void *ud);
void daemon_watchdog_start(daemon_alive_fn alive, void *ud);

#endif
