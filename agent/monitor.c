/* monitor.c - kiln-agent's local HTTP port (--metrics-addr): GET /metrics in Prometheus text
 * format (the agent's counters, its state, the machine's CPU, memory and GPU use, process_* and
 * kiln_build_info) and GET /healthz for liveness probes. Plain HTTP through libmicrohttpd, no
 * token: it carries nothing secret and belongs on a local or pod address. Nothing here talks to kilnd. */
#include "agent/agent_int.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

prom_family_t agent_prom_dropped_lines = PROM_FAMILY(
    "kiln_agent_outbox_dropped_lines_total", "Log lines dropped because the outbox was full (kilnd unreachable).",
    PROM_COUNTER);
prom_family_t agent_prom_dropped_points = PROM_FAMILY(
    "kiln_agent_outbox_dropped_points_total", "Metric points dropped because the outbox was full (kilnd unreachable).",
    PROM_COUNTER);

struct agent_monitor {
    struct MHD_Daemon *daemon;
    agent_t *agent;                  /* borrowed */
};

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, const char *type, char *body, size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    agent_monitor_t *m = cls;
    (void)version;
    (void)upload;
    if (!*con_cls) { /* headers only: answer on the next call */
        *con_cls = conn;
        return MHD_YES;
    }
    if (*upload_size) {
        *upload_size = 0; /* a body is ignored */
        return MHD_YES;
    }
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        char *b = strdup("{\"code\":\"method_not_allowed\",\"message\":\"only GET is served here\"}");
        return b ? reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "application/json", b, strlen(b)) : MHD_NO;
    }
    agent_stats_t st;
    agent_stats(m->agent, &st);
    if (!strcmp(url, "/healthz")) {
        json_t *o = json_pack("{s:s, s:s, s:b, s:b, s:s, s:i, s:i}", "status", "ok", "version", KILN_VERSION,
                              "registered", st.registered, "draining", st.draining, "worker_id", st.worker_id,
                              "slots", st.slots, "ranks_running", st.ranks_running);
        char *b = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        return b ? reply(conn, MHD_HTTP_OK, "application/json", b, strlen(b)) : MHD_NO;
    }
    if (!strcmp(url, "/metrics")) {
        prom_buf_t b = {0};
        prom_write(&b, "kiln-agent");
        prom_header(&b, "kiln_agent_registered", "Whether the agent is registered with kilnd.", PROM_GAUGE);
        prom_printf(&b, "kiln_agent_registered %d\n", st.registered ? 1 : 0);
        prom_header(&b, "kiln_agent_draining", "Whether the agent is shutting down (no new assignments).", PROM_GAUGE);
        prom_printf(&b, "kiln_agent_draining %d\n", st.draining ? 1 : 0);
        prom_header(&b, "kiln_agent_slots", "The agent's slots.", PROM_GAUGE);
        prom_printf(&b, "kiln_agent_slots %d\n", st.slots);
        prom_header(&b, "kiln_agent_ranks_running", "Ranks this agent runs now.", PROM_GAUGE);
        prom_printf(&b, "kiln_agent_ranks_running %d\n", st.ranks_running);
        prom_header(&b, "kiln_agent_outbox_bytes", "Reports queued for kilnd, in bytes.", PROM_GAUGE);
        prom_printf(&b, "kiln_agent_outbox_bytes %zu\n", st.outbox_bytes);
        agent_host_prom(&b, NULL);
        if (b.oom) {
            free(b.data);
            return MHD_NO;
        }
        return reply(conn, MHD_HTTP_OK, "text/plain; version=0.0.4", b.data, b.len);
    }
    char *b = strdup("{\"code\":\"not_found\",\"message\":\"this port serves /metrics and /healthz\"}");
    return b ? reply(conn, MHD_HTTP_NOT_FOUND, "application/json", b, strlen(b)) : MHD_NO;
}

int agent_monitor_start(agent_t *a, const char *addr, agent_monitor_t **out, kiln_err_t *err)
{
    *out = NULL;
    prom_register(&agent_prom_dropped_lines);
    prom_register(&agent_prom_dropped_points);
    prom_add(&agent_prom_dropped_lines, "", 0);
    prom_add(&agent_prom_dropped_points, "", 0);
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    char host[64];
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    size_t hl = colon ? (size_t)(colon - addr) : 0;
    struct sockaddr_in sa = {.sin_family = AF_INET};
    if (!colon || !end || *end || port < 0 || port > 65535 || hl >= sizeof host)
        goto bad;
    memcpy(host, addr, hl);
    host[hl] = '\0';
    if (inet_pton(AF_INET, hl ? host : "0.0.0.0", &sa.sin_addr) != 1)
        goto bad;
    sa.sin_port = htons((uint16_t)port);
    agent_monitor_t *m = calloc(1, sizeof(*m));
    if (!m)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    m->agent = a;
    m->daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL, 0, NULL, NULL, on_request, m,
                                 MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_TIMEOUT,
                                 (unsigned)30, MHD_OPTION_CONNECTION_LIMIT, (unsigned)64, MHD_OPTION_END);
    if (!m->daemon) {
        free(m);
        kiln_err_set(err, KILN_EIO, "metrics-addr", "could not listen on %s", addr);
        kiln_err_hint(err, "is another process using the port?");
        return KILN_EIO;
    }
    log_info("metrics and health on http://%s (/metrics, /healthz)", addr);
    *out = m;
    return 0;
bad:
    kiln_err_set(err, KILN_EINVAL, "metrics-addr", "bad --metrics-addr \"%s\"", addr ? addr : "");
    kiln_err_hint(err, "use IPv4-ADDRESS:PORT, for example 127.0.0.1:9102 (or 0.0.0.0:9102 in a pod)");
    return KILN_EINVAL;
}

void agent_monitor_stop(agent_monitor_t *m)
{
    if (!m)
        return;
    if (m->daemon)
        MHD_stop_daemon(m->daemon);
    free(m);
}
