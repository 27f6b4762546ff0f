/* watch.c - kiln-agent's watch for work: while registered, one thread holds AgentService's
 * WatchWork stream open to kilnd; each WorkNudge kilnd sends (the first when the watch is in
 * place, then one per assignment or stop order committed for this worker) makes the heartbeat
 * thread heartbeat at once, and the heartbeat brings the work. Whenever the watch is down (kilnd
 * unreachable, an older kilnd without WatchWork, a refusal) the heartbeat interval still brings
 * everything, only later; the watch is opened again after a back-off. */
#include "agent/agent_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char k_watch[] = "/kiln.AgentService/WatchWork";

/* A watch lives this long, then is opened again (kilnd also notices a vanished agent by its
 * connection's keepalive; this bounds a watch whose connection went quiet unnoticed). */
#define WATCH_LIFETIME_MS 120000
#define WATCH_BACKOFF_MIN_MS 250
#define WATCH_BACKOFF_MAX_MS 10000
/* kilnd answered UNIMPLEMENTED (it has no WatchWork): heartbeats alone, and ask again this late. */
#define WATCH_UNIMPLEMENTED_MS 60000

static void on_nudge(void *ud, const uint8_t *msg, size_t len)
{
    agent_t *a = ud;
    Kiln__WorkNudge *n = kiln__work_nudge__unpack(NULL, len, msg);
    bool first = n && n->first;
    if (n)
        kiln__work_nudge__free_unpacked(n, NULL);
    pthread_mutex_lock(&a->mu);
    a->hb_now = true;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    log_debug("kilnd %s: heartbeating now", first ? "holds the watch for work" : "has work for this worker");
}

void *agent_watch_main(void *arg)
{
    agent_t *a = arg;
    int backoff = WATCH_BACKOFF_MIN_MS, fails = 0;
    bool told_unimplemented = false;
    while (!agent_flag(a, &a->stop_hb)) {
        if (!agent_flag(a, &a->registered)) {
            agent_wait(a, 200, &a->stop_hb, &a->registered);
            continue;
        }
        Kiln__WatchWorkRequest req = KILN__WATCH_WORK_REQUEST__INIT;
        char id[128];
        pthread_mutex_lock(&a->mu);
        kiln_strlcpy(id, a->worker_id, sizeof(id));
        pthread_mutex_unlock(&a->mu);
        req.worker_id = id;
        uint8_t buf[256];
        size_t len = kiln__watch_work_request__get_packed_size(&req);
        if (len > sizeof(buf))
            break; /* worker ids are shorter; never happens */
        kiln__watch_work_request__pack(&req, buf);
        char bearer[AGENT_SECRET_MAX + 8];
        agent_md_t md[1];
        size_t n_md = agent_auth_md(a, bearer, md);
        kiln_err_t err;
        kiln_err_clear(&err);
        int code = 0;
        int64_t t0 = kiln_mono_us();
        agent_rpc_watch(a->rpc, k_watch, md, n_md, buf, len, WATCH_LIFETIME_MS, on_nudge, a, &code, &err);
        memset(bearer, 0, sizeof(bearer));
        int64_t held_ms = (kiln_mono_us() - t0) / 1000;
        if (agent_flag(a, &a->stop_hb))
            break;
        int wait = 0;
        if (code == GRPC_UNIMPLEMENTED) {
            if (!told_unimplemented)
                log_info("kilnd at %s does not push work (no WatchWork); heartbeats bring it", a->server);
            told_unimplemented = true;
            wait = WATCH_UNIMPLEMENTED_MS;
        } else if ((code == GRPC_DEADLINE_EXCEEDED || code == GRPC_CANCELLED || code == GRPC_ABORTED ||
                    code == 0) && held_ms >= 1000) {
            /* its lifetime passed, the channel moved or kilnd ended it: open it again now */
            backoff = WATCH_BACKOFF_MIN_MS;
            fails = 0;
        } else {
            if (fails++ % 20 == 0)
                log_info("watch for work at kilnd %s ended: %s (heartbeats bring work meanwhile; watching again "
                         "in %.1f s)", a->server, err.message[0] ? err.message : "no reason given", backoff / 1000.0);
            wait = backoff;
            backoff = KILN_MIN(backoff * 2, WATCH_BACKOFF_MAX_MS);
        }
        if (wait > 0)
            agent_wait(a, wait, &a->stop_hb, NULL);
    }
    return NULL;
}
