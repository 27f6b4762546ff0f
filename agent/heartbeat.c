/* heartbeat.c - kiln-agent's registration and heartbeats with kilnd: the join token, then the
 * worker's own credential (kept in the work dir) on every call; the heartbeat loop that reports
 * the ranks this agent runs and takes assignments (to the starter) and stop orders back; moving
 * to another kilnd replica when one stops answering. */
#include "agent/agent_int.h"
#include "rank/rank.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char k_md_auth[] = "authorization";
static const char k_md_cred[] = "kiln-worker-credential";
static const char k_register[] = "/kiln.AgentService/RegisterWorker";
static const char k_heartbeat[] = "/kiln.AgentService/Heartbeat";

/* ---- registration and heartbeats ---------------------------------------------------------- */

bool agent_secret_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= AGENT_SECRET_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x21 || s[i] > 0x7e)
            return false;
    return true;
}

/* "authorization: Bearer <credential>" for every call but RegisterWorker; none while the agent
 * holds no credential (a kilnd that issues none). bearer must hold AGENT_SECRET_MAX + 8 bytes. */
size_t agent_auth_md(agent_t *a, char *bearer, agent_md_t *md)
{
    pthread_mutex_lock(&a->mu);
    bool have = a->credential[0] != '\0';
    if (have)
        snprintf(bearer, AGENT_SECRET_MAX + 8, "Bearer %s", a->credential);
    pthread_mutex_unlock(&a->mu);
    if (!have)
        return 0;
    md[0] = (agent_md_t){k_md_auth, bearer};
    return 1;
}


static int agent_register(agent_t *a, kiln_err_t *err, int *code_out)
{
    Kiln__RegisterRequest req = KILN__REGISTER_REQUEST__INIT;
    char id[128], cred[AGENT_SECRET_MAX], bearer[AGENT_SECRET_MAX + 8];
    agent_md_t md[2];
    size_t n_md = 0;
    pthread_mutex_lock(&a->mu);
    kiln_strlcpy(id, a->worker_id, sizeof(id));
    kiln_strlcpy(cred, a->credential, sizeof(cred));
    pthread_mutex_unlock(&a->mu);
    if (a->join_token[0]) {
        snprintf(bearer, sizeof(bearer), "Bearer %s", a->join_token);
        md[n_md++] = (agent_md_t){k_md_auth, bearer};
    }
    /* registering again under a known id proves it is still this worker */
    if (id[0] && cred[0])
        md[n_md++] = (agent_md_t){k_md_cred, cred};
    req.worker_id = id;
    req.hostname = a->hostname;
    req.address = a->address;
    req.slots = a->slots;
    req.slot_type = a->slot_type;
    req.n_gpus = a->n_gpus;
    req.gpus = a->gpus;
    req.version = (char *)AGENT_VERSION;
    req.cpu_cores = a->cores;
    req.n_data_roots = a->n_roots;
    req.data_roots = a->roots;
    ProtobufCMessage *resp = NULL;
    int code = 0;
    int rc = agent_rpc_call(a->rpc, k_register, md, n_md, &req.base, &kiln__register_response__descriptor,
                             AGENT_RPC_TIMEOUT_MS, &resp, &code, err);
    memset(bearer, 0, sizeof(bearer));
    *code_out = code;
    if (rc != 0) {
        if ((code == GRPC_UNAUTHENTICATED || code == GRPC_PERMISSION_DENIED) && id[0] && !a->id_from_cfg) {
            /* kilnd does not take this worker id with the credential we hold (a new cluster, or a
             * credential issued since): join as a new worker rather than not at all */
            log_warn("kilnd refused to register this agent again as %s (gRPC status %d): %s; registering "
                     "as a new worker", id, code, err->message);
            pthread_mutex_lock(&a->mu);
            a->worker_id[0] = '\0';
            a->credential[0] = '\0';
            pthread_mutex_unlock(&a->mu);
        }
        return rc;
    }
    Kiln__RegisterResponse *r = (Kiln__RegisterResponse *)resp;
    if (!r->worker_id || !r->worker_id[0] || strlen(r->worker_id) >= sizeof(a->worker_id)) {
        protobuf_c_message_free_unpacked(resp, NULL);
        return kiln_err_set(err, KILN_EFORMAT, NULL, "kilnd answered the registration without a usable worker id");
    }
    const char *new_cred = r->credential ? r->credential : "";
    if (new_cred[0] && !agent_secret_ok(new_cred)) {
        protobuf_c_message_free_unpacked(resp, NULL);
        return kiln_err_set(err, KILN_EFORMAT, NULL, "kilnd answered a credential that cannot be sent back "
                            "(empty, too long, or not printable ASCII)");
    }
    if (new_cred[0]) {
        /* kept before it is used, so a restart finds the credential kilnd now expects */
        kiln_err_t serr;
        if (agent_credential_save(a->work_dir, r->worker_id, new_cred, &serr) != 0)
            log_error("could not keep the worker credential: %s (a restarted agent will register as a new "
                      "worker)", serr.message);
    }
    pthread_mutex_lock(&a->mu);
    kiln_strlcpy(a->worker_id, r->worker_id, sizeof(a->worker_id));
    kiln_strlcpy(a->credential, new_cred, sizeof(a->credential));
    a->hb_interval_ms = r->heartbeat_interval_ms > 0 ? r->heartbeat_interval_ms : 1000;
    a->registered = true;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    log_info("registered with kilnd at %s as %s (%d %s slot(s), heartbeat every %d ms%s)", a->server,
             r->worker_id, a->slots, a->slot_type, r->heartbeat_interval_ms,
             new_cred[0] ? ", credential kept" : ", kilnd issued no credential");
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}

/* kilnd no longer takes our credential: register again (with the join token). */
void agent_unauthenticated(agent_t *a, const char *what, const kiln_err_t *err)
{
    pthread_mutex_lock(&a->mu);
    bool was = a->registered;
    a->registered = false;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    if (was)
        log_warn("kilnd refused the worker credential on a %s: %s; registering again", what, err->message);
}

static void agent_handle_heartbeat(agent_t *a, const Kiln__HeartbeatResponse *r)
{
    for (size_t i = 0; i < r->n_stops; i++) {
        const Kiln__StopOrder *s = r->stops[i];
        agent_start_cancel(a, s->job_id, s->attempt);
        xfer_cancel(a->xfer, s->job_id, s->attempt);
        int grace = s->grace_ms > 0 ? s->grace_ms : 10000;
        int n = agent_launcher_stop(a->launcher, s->job_id, s->attempt, grace);
        log_info("stop order for job %s attempt %d (%s): signalled %d rank(s), grace %d ms", s->job_id,
                 s->attempt, s->reason ? s->reason : "", n, grace);
    }
    for (size_t i = 0; i < r->n_assignments; i++) {
        const Kiln__Assignment *as = r->assignments[i];
        if (agent_flag(a, &a->draining)) {
            ob_add_status(&a->ob, as->job_id, as->attempt, false, "the agent is shutting down", OB_FAULT_SHUTDOWN, 0);
            continue;
        }
        agent_start_enqueue(a, as, false);
    }
}

/* Ranks to report: those running plus those whose exit kilnd has not acknowledged yet. */
size_t agent_running(agent_t *a, agent_rank_info_t *v, size_t max)
{
    size_t n = agent_launcher_list(a->launcher, v, max);
    if (n > max)
        n = max;
    agent_rank_info_t ex[256];
    size_t ne = ob_pending_exits(&a->ob, ex, KILN_ARRAY_LEN(ex));
    if (ne > KILN_ARRAY_LEN(ex))
        ne = KILN_ARRAY_LEN(ex);
    /* and those whose exit waits for an upload, or whose start for a fetch or for the starter */
    size_t nx = xfer_list(a->xfer, ex + ne, KILN_ARRAY_LEN(ex) - ne);
    ne += KILN_MIN(nx, KILN_ARRAY_LEN(ex) - ne);
    nx = agent_start_list(a, ex + ne, KILN_ARRAY_LEN(ex) - ne);
    ne += KILN_MIN(nx, KILN_ARRAY_LEN(ex) - ne);
    for (size_t i = 0; i < ne && n < max; i++) {
        bool dup = false;
        for (size_t j = 0; j < n && !dup; j++)
            dup = v[j].rank == ex[i].rank && v[j].attempt == ex[i].attempt && !strcmp(v[j].job_id, ex[i].job_id);
        if (!dup)
            v[n++] = ex[i];
    }
    return n;
}

/* Another kilnd replica is tried after this many heartbeats or registrations in a row that got no
 * answer (a kilnd that is down, paused or unreachable). */
#define AGENT_FAILOVER_AFTER 2

/* After a call that got no answer: with several kilnd addresses, moves to the next one once
 * enough have failed in a row. */
static void agent_maybe_failover(agent_t *a, int code, int *unanswered)
{
    if (!kiln_grpc_retryable(code) || code == 13 /* INTERNAL: kilnd answered */) {
        *unanswered = 0;
        return;
    }
    if (++*unanswered < AGENT_FAILOVER_AFTER || agent_rpc_ntargets(a->rpc) < 2)
        return;
    *unanswered = 0;
    log_warn("kilnd does not answer; moving to kilnd at %s", agent_rpc_next(a->rpc));
}

void *agent_hb_main(void *arg)
{
    agent_t *a = arg;
    int backoff = 100, fails = 0, unanswered = 0, limited = 0;
    bool waiting = false;        /* kilnd said this worker waits for approval */
    agent_rank_info_t *list = calloc(AGENT_MAX_LIST, sizeof(*list));
    Kiln__RunningRank *rr = calloc(AGENT_MAX_LIST, sizeof(*rr));
    Kiln__RunningRank **rrp = calloc(AGENT_MAX_LIST, sizeof(*rrp));
    if (!list || !rr || !rrp) {
        log_error("agent: out of memory for heartbeats");
        goto done;
    }
    while (!agent_flag(a, &a->stop_hb)) {
        kiln_err_t err;
        pthread_mutex_lock(&a->mu);
        a->hb_loop_us = kiln_mono_us();
        pthread_mutex_unlock(&a->mu);
        if (!agent_flag(a, &a->registered)) {
            int rcode = 0;
            if (agent_register(a, &err, &rcode) != 0) {
                agent_maybe_failover(a, rcode, &unanswered);
                int wait = backoff;
                if (rcode == GRPC_RESOURCE_EXHAUSTED) {
                    /* kilnd limits registrations: come back later, and not in step with the
                     * other agents it refused */
                    limited = KILN_MIN(limited ? limited * 2 : AGENT_LIMITED_MIN_MS, AGENT_LIMITED_MAX_MS);
                    wait = limited / 2 + (int)((uint64_t)kiln_mono_us() % (uint64_t)(limited / 2 + 1));
                }
                if (fails++ % 20 == 0 || rcode == GRPC_RESOURCE_EXHAUSTED)
                    log_warn("could not register with kilnd at %s: %s%s%s (retrying in %.1f s)", a->server,
                             err.message, err.hint[0] ? "; " : "", err.hint, wait / 1000.0);
                agent_wait(a, wait, &a->stop_hb, NULL);
                backoff = KILN_MIN(backoff * 2, 2000);
                continue;
            }
            fails = 0;
            backoff = 100;
            limited = 0;
        }
        Kiln__HeartbeatRequest req = KILN__HEARTBEAT_REQUEST__INIT;
        char id[128];
        pthread_mutex_lock(&a->mu);
        kiln_strlcpy(id, a->worker_id, sizeof(id));
        int interval = a->hb_interval_ms;
        req.draining = a->draining;
        a->hb_now = false;
        pthread_mutex_unlock(&a->mu);
        req.worker_id = id;
        size_t n = agent_running(a, list, AGENT_MAX_LIST);
        for (size_t i = 0; i < n; i++) {
            kiln__running_rank__init(&rr[i]);
            rr[i].job_id = list[i].job_id;
            rr[i].attempt = list[i].attempt;
            rr[i].rank = list[i].rank;
            rr[i].pid = (int32_t)list[i].pid;
            rrp[i] = &rr[i];
        }
        req.n_running = n;
        req.running = rrp;
        ProtobufCMessage *resp = NULL;
        int code = 0;
        int64_t t0 = kiln_mono_us();
        char bearer[AGENT_SECRET_MAX + 8];
        agent_md_t md[1];
        size_t n_md = agent_auth_md(a, bearer, md);
        int rc = agent_rpc_call(a->rpc, k_heartbeat, md, n_md, &req.base, &kiln__heartbeat_response__descriptor,
                                 KILN_MAX(interval * 3, 3000), &resp, &code, &err);
        memset(bearer, 0, sizeof(bearer));
        agent_maybe_failover(a, rc == 0 ? 0 : code, &unanswered);
        if (rc == 0) {
            Kiln__HeartbeatResponse *r = (Kiln__HeartbeatResponse *)resp;
            if (fails > 0)
                log_info("kilnd at %s answers heartbeats again", a->server);
            fails = 0;
            if (r->waiting_for_approval != waiting) {
                waiting = r->waiting_for_approval;
                if (waiting)
                    log_warn("%s", r->message && r->message[0] ? r->message : "kilnd: this worker waits for approval");
                else
                    log_info("kilnd approved worker %s: it takes work now", id);
            }
            if (r->reregister) {
                log_warn("kilnd does not know worker %s; registering again", id);
                pthread_mutex_lock(&a->mu);
                a->registered = false;
                pthread_mutex_unlock(&a->mu);
            }
            agent_handle_heartbeat(a, r);
            bool reregister = r->reregister;
            protobuf_c_message_free_unpacked(resp, NULL);
            if (req.draining && !reregister) {
                pthread_mutex_lock(&a->mu);
                a->drain_acked = true;
                pthread_cond_broadcast(&a->cv);
                pthread_mutex_unlock(&a->mu);
            }
            if (!agent_flag(a, &a->registered))
                continue;
        } else if (code == GRPC_UNAUTHENTICATED) {
            agent_unauthenticated(a, "heartbeat", &err);
        } else {
            if (fails++ % 20 == 0)
                log_warn("heartbeat to kilnd at %s failed: %s", a->server, err.message);
            if (code == 5 /* NOT_FOUND: kilnd lost this worker */) {
                pthread_mutex_lock(&a->mu);
                a->registered = false;
                pthread_mutex_unlock(&a->mu);
            }
        }
        int64_t spent_ms = (kiln_mono_us() - t0) / 1000;
        int wait = rc == 0 ? (int)KILN_MAX(interval - spent_ms, 10) : KILN_MIN(interval, 1000);
        agent_wait(a, wait, &a->stop_hb, &a->hb_now);
    }
done:
    free(list);
    free(rr);
    free(rrp);
    return NULL;
}

