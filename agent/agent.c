/* agent.c - kiln-agent's control loop: registration (join token, then the worker's own
 * credential, kept in the work dir) and heartbeats with kilnd (assignments and stop orders come
 * back on heartbeat answers), the starter that launches assignments off the heartbeat thread,
 * and the sender that drains the outbox in order, retrying while kilnd is unreachable. Also the
 * data roots, GPU detection and the rendezvous address. Launching and watching ranks is
 * launch.c's; batching is outbox.c's. */
#include "agent/agent_int.h"
#include "rank/rank.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define AGENT_VERSION "kiln-agent " KILN_VERSION
#define AGENT_RPC_TIMEOUT_MS 10000
#define AGENT_MAX_LIST 1024
#define AGENT_MAX_INTERNAL_TRIES 30  /* INTERNAL/UNKNOWN answers before a report is given up */
#define AGENT_MAX_ROOTS 32
#define GRPC_UNAUTHENTICATED 16
#define GRPC_PERMISSION_DENIED 7
#define GRPC_RESOURCE_EXHAUSTED 8
#define AGENT_LIMITED_MIN_MS 5000    /* first wait after kilnd's registration limit refused us */
#define AGENT_LIMITED_MAX_MS 60000

static const char k_md_auth[] = "authorization";
static const char k_md_cred[] = "kiln-worker-credential";

static const char k_register[] = "/kiln.AgentService/RegisterWorker";
static const char k_heartbeat[] = "/kiln.AgentService/Heartbeat";
static const char k_status[] = "/kiln.AgentService/ReportRankStatus";
static const char k_logs[] = "/kiln.AgentService/PushLogs";
static const char k_metrics[] = "/kiln.AgentService/PushMetrics";
static const char k_exit[] = "/kiln.AgentService/ReportRankExit";

/* An assignment waiting for the starter thread (an owned copy of the message). */
typedef struct start_item {
    struct start_item *next;
    Kiln__Assignment *a;
    bool fetched;                /* its init model is in place (a transfer thread fetched it) */
} start_item_t;

struct agent {
    char *server, *slot_type, *work_dir, *train_bin, *address;
    char **gpus;
    size_t n_gpus;
    char *roots[AGENT_MAX_ROOTS]; /* data roots, resolved */
    size_t n_roots;
    int slots, cores, stop_grace_ms;
    char hostname[256];
    char join_token[AGENT_SECRET_MAX]; /* "" when none was given */
    bool id_from_cfg;            /* the operator named the worker id (--worker-id) */

    agent_rpc_t *rpc;
    agent_launcher_t *launcher;
    xfer_t *xfer;                /* uploads of output directories, fetches of init models */
    agent_code_cache_t *code;    /* script jobs' code, <work_dir>/code-cache (--code-cache-mb) */
    ob_t ob;

    pthread_mutex_t mu;          /* the fields below */
    pthread_cond_t cv;           /* wakes the heartbeat thread for stop */
    char worker_id[128];
    char credential[AGENT_SECRET_MAX]; /* kilnd's answer to the last registration, "" if none */
    bool registered;
    start_item_t *starts;        /* assignments for the starter, in order */
    pthread_cond_t start_cv;     /* wakes the starter */
    bool stop_starter;
    pthread_t start_thread;
    bool start_started;
    int hb_interval_ms;
    bool draining;               /* shutting down: no new assignments */
    bool hb_now;                 /* heartbeat at once (the drain starting), then clear */
    bool drain_acked;            /* kilnd has taken a heartbeat that says draining */
    bool stop_hb, stop_sender, shut_done;
    pthread_t hb_thread, sender_thread;
    bool hb_started, sender_started;
    agent_monitor_t *monitor;    /* --metrics-addr, or NULL */
    int64_t hb_loop_us;          /* kiln_mono_us of the heartbeat loop's last round (under mu) */
};

/* ---- launcher callbacks: everything goes into the outbox ------------------------------------ */

static void cb_started(void *ud, const char *job_id, int attempt, bool ok, const char *reason, int master_port)
{
    agent_t *a = ud;
    ob_add_status(&a->ob, job_id, attempt, ok, reason, false, master_port);
}

static void cb_line(void *ud, const char *job_id, int attempt, int rank, int stream, int64_t time_us,
                    const char *line, size_t len)
{
    agent_t *a = ud;
    ob_add_line(&a->ob, job_id, attempt, rank, stream, time_us, line, len);
}

static void cb_points(void *ud, const char *job_id, int attempt, const agent_point_t *pts, size_t n)
{
    agent_t *a = ud;
    ob_add_points(&a->ob, job_id, attempt, pts, n);
}

static bool agent_flag(agent_t *a, const bool *flag);

static void cb_exit(void *ud, const char *job_id, int attempt, int rank, pid_t pid, int exit_code,
                    int sig, const char *reason)
{
    agent_t *a = ud;
    bool shutdown = agent_flag(a, &a->draining); /* stopped by our own shutdown */
    if (rank == 0 && !shutdown && a->xfer) {
        /* rank 0's output directory goes to kilnd first; the exit follows it */
        log_info("job %s rank 0: exited (%s %d); uploading its output directory", job_id, sig ? "signal" : "code",
                 sig ? sig : exit_code);
        xfer_rank0_exit(a->xfer, job_id, attempt, rank, pid, exit_code, sig, reason);
        return;
    }
    if (a->xfer && !shutdown && xfer_defer_exit(a->xfer, job_id, attempt, rank, pid, exit_code, sig, reason)) {
        log_info("job %s rank %d: exited (%s %d); reported after rank 0's, whose output is uploading", job_id, rank,
                 sig ? "signal" : "code", sig ? sig : exit_code);
        return;
    }
    if (sig)
        log_info("job %s rank %d: killed by signal %d%s", job_id, rank, sig,
                 shutdown ? " (the agent is shutting down)" : "");
    else
        log_info("job %s rank %d: exited with code %d%s%s%s", job_id, rank, exit_code,
                 reason[0] ? ": " : "", reason, shutdown ? " (the agent is shutting down)" : "");
    ob_add_exit(&a->ob, job_id, attempt, rank, pid, exit_code, sig, reason, shutdown);
}

/* ---- small helpers ---------------------------------------------------------------------- */

/* Sleeps up to ms on the agent's condition variable; returns early when *flag, or *wake (when
 * not NULL), turns true. */
static void agent_wait(agent_t *a, int ms, const bool *flag, const bool *wake)
{
    struct timespec ts;
    kiln_deadline_in(&ts, ms);
    pthread_mutex_lock(&a->mu);
    while (!*flag && !(wake && *wake))
        if (pthread_cond_timedwait(&a->cv, &a->mu, &ts) != 0)
            break;
    pthread_mutex_unlock(&a->mu);
}

static bool agent_flag(agent_t *a, const bool *flag)
{
    pthread_mutex_lock(&a->mu);
    bool v = *flag;
    pthread_mutex_unlock(&a->mu);
    return v;
}

/* ---- registration and heartbeats ---------------------------------------------------------- */

/* Whether s can travel as a metadata value: printable ASCII, not empty, bounded. */
static bool secret_ok(const char *s)
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
static size_t agent_auth_md(agent_t *a, char *bearer, agent_md_t *md)
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

static size_t xfer_auth_md(void *ud, char *bearer, agent_md_t *md)
{
    return agent_auth_md(ud, bearer, md);
}

static void agent_unauthenticated(agent_t *a, const char *what, const kiln_err_t *err);

static void xfer_unauthenticated(void *ud, const char *what, const kiln_err_t *err)
{
    agent_unauthenticated(ud, what, err);
}

static bool xfer_draining(void *ud)
{
    agent_t *a = ud;
    return agent_flag(a, &a->draining);
}

static void agent_start_enqueue(agent_t *a, const Kiln__Assignment *as, bool fetched);

static void xfer_start(void *ud, const Kiln__Assignment *as)
{
    agent_start_enqueue(ud, as, true);
}

static void xfer_worker_id(void *ud, char *buf, size_t n)
{
    agent_t *a = ud;
    pthread_mutex_lock(&a->mu);
    kiln_strlcpy(buf, a->worker_id, n);
    pthread_mutex_unlock(&a->mu);
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
    if (new_cred[0] && !secret_ok(new_cred)) {
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
static void agent_unauthenticated(agent_t *a, const char *what, const kiln_err_t *err)
{
    pthread_mutex_lock(&a->mu);
    bool was = a->registered;
    a->registered = false;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    if (was)
        log_warn("kilnd refused the worker credential on a %s: %s; registering again", what, err->message);
}

/* ---- the starter: launches assignments, so heartbeats never wait for one ------------------- */

static bool start_same(const Kiln__Assignment *x, const char *job_id, int attempt)
{
    return !strcmp(x->job_id ? x->job_id : "", job_id ? job_id : "") && (attempt == 0 || x->attempt == attempt);
}

/* Queues a copy of as for the starter, unless the same (job, attempt) already waits. */
static void agent_start_enqueue(agent_t *a, const Kiln__Assignment *as, bool fetched)
{
    pthread_mutex_lock(&a->mu);
    for (start_item_t *it = a->starts; it; it = it->next)
        if (start_same(it->a, as->job_id, as->attempt)) {
            pthread_mutex_unlock(&a->mu);
            return;
        }
    pthread_mutex_unlock(&a->mu);
    size_t len = protobuf_c_message_get_packed_size(&as->base);
    uint8_t *buf = malloc(len ? len : 1);
    start_item_t *it = calloc(1, sizeof(*it));
    if (buf && it) {
        protobuf_c_message_pack(&as->base, buf);
        it->a = kiln__assignment__unpack(NULL, len, buf);
        it->fetched = fetched;
    }
    free(buf);
    if (!it || !it->a) {
        free(it);
        log_error("job %s: out of memory for its assignment; kilnd will deliver it again", as->job_id);
        return;
    }
    pthread_mutex_lock(&a->mu);
    start_item_t **pp = &a->starts;
    while (*pp)
        pp = &(*pp)->next;
    *pp = it;
    pthread_cond_broadcast(&a->start_cv);
    pthread_mutex_unlock(&a->mu);
}

static void start_item_free(start_item_t *it)
{
    if (it)
        kiln__assignment__free_unpacked(it->a, NULL);
    free(it);
}

/* Drops waiting assignments of job_id (attempt 0: any) that a stop order makes moot. */
static void agent_start_cancel(agent_t *a, const char *job_id, int attempt)
{
    pthread_mutex_lock(&a->mu);
    start_item_t **pp = &a->starts;
    while (*pp) {
        start_item_t *it = *pp;
        if (start_same(it->a, job_id, attempt)) {
            *pp = it->next;
            log_info("job %s attempt %d: stopped before it started", it->a->job_id, it->a->attempt);
            start_item_free(it);
            continue;
        }
        pp = &it->next;
    }
    pthread_mutex_unlock(&a->mu);
}

static void *agent_start_main(void *arg)
{
    agent_t *a = arg;
    for (;;) {
        pthread_mutex_lock(&a->mu);
        while (!a->starts && !a->stop_starter)
            pthread_cond_wait(&a->start_cv, &a->mu);
        if (a->stop_starter) {
            pthread_mutex_unlock(&a->mu);
            break;
        }
        start_item_t *it = a->starts;
        a->starts = it->next;
        bool draining = a->draining;
        pthread_mutex_unlock(&a->mu);
        if (draining) {
            ob_add_status(&a->ob, it->a->job_id, it->a->attempt, false, "the agent is shutting down", true, 0);
        } else if (it->a->init_from_job && it->a->init_from_job[0] && !it->fetched) {
            xfer_fetch_and_start(a->xfer, it->a); /* its model first, on a transfer thread */
        } else {
            /* Launched from this long-lived thread: a rank gets SIGKILL when the thread that
             * forked it ends (PR_SET_PDEATHSIG), so never from a transfer thread. */
            kiln_err_t err;
            if (agent_launcher_start(a->launcher, it->a, &err) == KILN_EEXIST)
                log_info("job %s attempt %d is already running here; assignment ignored", it->a->job_id,
                         it->a->attempt);
        }
        start_item_free(it);
    }
    return NULL;
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
            ob_add_status(&a->ob, as->job_id, as->attempt, false, "the agent is shutting down", true, 0);
            continue;
        }
        agent_start_enqueue(a, as, false);
    }
}

/* Ranks to report: those running plus those whose exit kilnd has not acknowledged yet. */
static size_t agent_running(agent_t *a, agent_rank_info_t *v, size_t max)
{
    size_t n = agent_launcher_list(a->launcher, v, max);
    if (n > max)
        n = max;
    agent_rank_info_t ex[256];
    size_t ne = ob_pending_exits(&a->ob, ex, KILN_ARRAY_LEN(ex));
    if (ne > KILN_ARRAY_LEN(ex))
        ne = KILN_ARRAY_LEN(ex);
    /* and those whose exit waits for an upload, or whose start for a fetch */
    size_t nx = xfer_list(a->xfer, ex + ne, KILN_ARRAY_LEN(ex) - ne);
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
    if (!agent_grpc_retryable(code) || code == 13 /* INTERNAL: kilnd answered */) {
        *unanswered = 0;
        return;
    }
    if (++*unanswered < AGENT_FAILOVER_AFTER || agent_rpc_ntargets(a->rpc) < 2)
        return;
    *unanswered = 0;
    log_warn("kilnd does not answer; moving to kilnd at %s", agent_rpc_next(a->rpc));
}

static void *agent_hb_main(void *arg)
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

/* ---- the sender -------------------------------------------------------------------------- */

static int agent_send(agent_t *a, ob_item_t *it, char *wid, int *code, kiln_err_t *err)
{
    ProtobufCMessage *resp = NULL;
    int rc = KILN_EINTERNAL;
    const char *method = NULL;
    Kiln__LogBatch lb = KILN__LOG_BATCH__INIT;
    Kiln__MetricBatch mb = KILN__METRIC_BATCH__INIT;
    Kiln__RankStatus rs = KILN__RANK_STATUS__INIT;
    Kiln__RankExit rx = KILN__RANK_EXIT__INIT;
    Kiln__LogLine *lines = NULL, **linesp = NULL;
    Kiln__MetricPoint *pts = NULL, **ptsp = NULL;
    ProtobufCMessage *req = NULL;
    char *stream_names[2] = {"stdout", "stderr"};

    switch (it->kind) {
    case OB_LOGS:
        lines = calloc(it->nlines ? it->nlines : 1, sizeof(*lines));
        linesp = calloc(it->nlines ? it->nlines : 1, sizeof(*linesp));
        if (!lines || !linesp)
            goto oom;
        for (size_t i = 0; i < it->nlines; i++) {
            kiln__log_line__init(&lines[i]);
            lines[i].rank = it->lines[i].rank;
            lines[i].time_us = it->lines[i].time_us;
            lines[i].stream = stream_names[it->lines[i].stream == AGENT_STREAM_STDERR];
            lines[i].line = it->lines[i].line;
            linesp[i] = &lines[i];
        }
        lb.worker_id = wid;
        lb.job_id = it->job_id;
        lb.attempt = it->attempt;
        lb.stream_id = it->stream_id;
        lb.batch_seq = it->batch_seq;
        lb.n_lines = it->nlines;
        lb.lines = linesp;
        req = &lb.base;
        method = k_logs;
        break;
    case OB_METRICS:
        pts = calloc(it->points.n ? it->points.n : 1, sizeof(*pts));
        ptsp = calloc(it->points.n ? it->points.n : 1, sizeof(*ptsp));
        if (!pts || !ptsp)
            goto oom;
        for (size_t i = 0; i < it->points.n; i++) {
            kiln__metric_point__init(&pts[i]);
            pts[i].rank = it->points.v[i].rank;
            pts[i].name = it->points.v[i].name;
            pts[i].step = it->points.v[i].step;
            pts[i].value = it->points.v[i].value;
            pts[i].time_us = it->points.v[i].time_us;
            ptsp[i] = &pts[i];
        }
        mb.worker_id = wid;
        mb.job_id = it->job_id;
        mb.attempt = it->attempt;
        mb.stream_id = it->stream_id;
        mb.batch_seq = it->batch_seq;
        mb.n_points = it->points.n;
        mb.points = ptsp;
        req = &mb.base;
        method = k_metrics;
        break;
    case OB_STATUS:
        rs.worker_id = wid;
        rs.job_id = it->job_id;
        rs.attempt = it->attempt;
        rs.started = it->started;
        rs.reason = it->reason;
        rs.worker_shutdown = it->shutdown;
        rs.master_port = it->port;
        req = &rs.base;
        method = k_status;
        break;
    case OB_EXIT:
        rx.worker_id = wid;
        rx.job_id = it->job_id;
        rx.attempt = it->attempt;
        rx.rank = it->rank;
        rx.exit_code = it->exit_code;
        rx.signal = it->sig;
        rx.reason = it->reason;
        rx.worker_shutdown = it->shutdown;
        req = &rx.base;
        method = k_exit;
        break;
    }
    char bearer[AGENT_SECRET_MAX + 8];
    agent_md_t md[1];
    size_t n_md = agent_auth_md(a, bearer, md);
    rc = agent_rpc_call(a->rpc, method, md, n_md, req, &kiln__ack__descriptor, AGENT_RPC_TIMEOUT_MS, &resp, code,
                        err);
    memset(bearer, 0, sizeof(bearer));
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    goto done;
oom:
    rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    *code = 8;
done:
    free(lines);
    free(linesp);
    free(pts);
    free(ptsp);
    return rc;
}

static const char *ob_kind_name(ob_kind_t k)
{
    static const char *names[] = {"log batch", "metric batch", "rank status", "rank exit"};
    return names[k];
}

static void *agent_sender_main(void *arg)
{
    agent_t *a = arg;
    int backoff = 100, fails = 0;
    for (;;) {
        pthread_mutex_lock(&a->ob.mu);
        ob_seal_due_locked(&a->ob, false);
        int64_t now_us = kiln_mono_us();
        if (now_us - a->ob.retired_us > 10 * 1000000) { /* a long-lived agent keeps no stream per past job */
            a->ob.retired_us = now_us;
            ob_retire_idle_locked(&a->ob, now_us, OB_STREAM_IDLE_US);
        }
        ob_item_t *it = a->ob.head;
        pthread_mutex_unlock(&a->ob.mu);
        if (agent_flag(a, &a->stop_sender))
            break;
        char wid[128];
        pthread_mutex_lock(&a->mu);
        bool reg = a->registered;
        kiln_strlcpy(wid, a->worker_id, sizeof(wid));
        pthread_mutex_unlock(&a->mu);
        if (!it || !reg) {
            /* Wake when something is sealed, or in time to seal what is filling. */
            struct timespec ts;
            kiln_deadline_in(&ts, 50);
            pthread_mutex_lock(&a->ob.mu);
            if (!a->ob.head || !reg)
                pthread_cond_timedwait(&a->ob.cv, &a->ob.mu, &ts);
            pthread_mutex_unlock(&a->ob.mu);
            continue;
        }
        kiln_err_t err;
        int code = 0;
        int rc = agent_send(a, it, wid, &code, &err);
        bool done = rc == 0;
        if (rc != 0 && code == GRPC_UNAUTHENTICATED) {
            /* not the report's fault: it waits for the new registration */
            agent_unauthenticated(a, ob_kind_name(it->kind), &err);
            continue;
        }
        if (rc != 0 && !agent_grpc_retryable(code) && code != 0) {
            log_error("kilnd rejected a %s of job %s (gRPC status %d): %s; dropping it",
                      ob_kind_name(it->kind), it->job_id, code, err.message);
            done = true;
        } else if (rc != 0 && (code == 13 || code == 2) && it->tries >= AGENT_MAX_INTERNAL_TRIES) {
            /* kilnd keeps failing on this one report (not unreachable: that is UNAVAILABLE);
             * retrying forever would hold up every report behind it */
            log_error("kilnd failed a %s of job %s %d times (gRPC status %d): %s; dropping it",
                      ob_kind_name(it->kind), it->job_id, it->tries + 1, code, err.message);
            done = true;
        }
        if (done) {
            ob_done(&a->ob, it, rc == 0);
            if (rc != 0)
                ob_note_refused(&a->ob, it, err.message);
            pthread_mutex_lock(&a->ob.mu);
            ob_pop_locked(&a->ob);
            pthread_mutex_unlock(&a->ob.mu);
            ob_item_free(it);
            if (fails > 0)
                log_info("kilnd accepts reports again");
            fails = 0;
            backoff = 100;
            continue;
        }
        it->tries++;
        if (fails++ % 20 == 0)
            log_warn("could not send a %s of job %s to kilnd: %s (will retry)", ob_kind_name(it->kind),
                     it->job_id, err.message);
        agent_wait(a, backoff, &a->stop_sender, NULL);
        backoff = KILN_MIN(backoff * 2, 1000);
    }
    return NULL;
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

int agent_create(const agent_config_t *cfg, agent_t **out, kiln_err_t *err)
{
    *out = NULL;
    int rc = 0;
    agent_t *a = calloc(1, sizeof(*a));
    if (!a)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    ob_init(&a->ob);
    a->server = strdup(cfg->server ? cfg->server : "127.0.0.1:9090");
    a->slot_type = strdup(cfg->slot_type ? cfg->slot_type : "cpu");
    a->work_dir = strdup(cfg->work_dir ? cfg->work_dir : "/tmp/kiln-agent");
    a->train_bin = strdup(cfg->train_bin ? cfg->train_bin : "kiln-train");
    a->slots = cfg->slots > 0 ? cfg->slots : 1;
    a->cores = cfg->cores; /* the launcher's count once it exists (agent_launcher_cores) */
    a->stop_grace_ms = cfg->stop_grace_ms > 0 ? cfg->stop_grace_ms : 10000;
    a->hb_interval_ms = 1000;
    pthread_cond_init(&a->start_cv, NULL);
    if (cfg->worker_id && cfg->worker_id[0]) {
        kiln_strlcpy(a->worker_id, cfg->worker_id, sizeof(a->worker_id));
        a->id_from_cfg = true;
    }
    if (cfg->join_token && cfg->join_token[0]) {
        if (!secret_ok(cfg->join_token)) {
            rc = kiln_err_set(err, KILN_EINVAL, "join-token", "the join token must be 1 to %d printable ASCII "
                              "characters without spaces", AGENT_SECRET_MAX - 1);
            goto fail;
        }
        kiln_strlcpy(a->join_token, cfg->join_token, sizeof(a->join_token));
    }
    if (gethostname(a->hostname, sizeof(a->hostname)) != 0)
        kiln_strlcpy(a->hostname, "unknown", sizeof(a->hostname));
    if (cfg->address && cfg->address[0]) {
        a->address = strdup(cfg->address);
    } else {
        char addr[64];
        agent_pick_address(a->server, addr, sizeof(addr));
        a->address = strdup(addr);
    }
    if (cfg->n_gpus) {
        a->gpus = calloc(cfg->n_gpus, sizeof(char *));
        for (size_t i = 0; a->gpus && i < cfg->n_gpus; i++)
            if ((a->gpus[i] = strdup(cfg->gpus[i])))
                a->n_gpus++;
    }
    if (!a->server || !a->slot_type || !a->work_dir || !a->train_bin || !a->address) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto fail;
    }
    if (strcmp(a->slot_type, "cpu") && strcmp(a->slot_type, "gpu")) {
        rc = kiln_err_set(err, KILN_EINVAL, "slot-type", "slot type must be cpu or gpu, not \"%s\"", a->slot_type);
        goto fail;
    }
    if ((rc = kiln_mkdirs(a->work_dir, err)) != 0)
        goto fail;
    if ((rc = agent_data_roots_resolve(cfg->data_roots, cfg->n_data_roots, a->roots, AGENT_MAX_ROOTS, &a->n_roots,
                                       err)) != 0)
        goto fail;
    /* A root over the work dir would let jobs read the agent's credential (and other jobs'
     * directories); over the TLS key, its private key. */
    const char *const own[] = {a->work_dir, cfg->tls.key_file};
    const char *const own_what[] = {"the agent's work dir", "the agent's TLS key"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(own); i++) {
        if (!own[i])
            continue;
        char real[PATH_MAX];
        if (!realpath(own[i], real))
            continue;
        for (size_t k = 0; k < a->n_roots; k++) {
            if (kiln_path_inside(real, a->roots[k])) {
                rc = kiln_err_set(err, KILN_EINVAL, "data-root", "data root \"%s\" holds %s (%s): jobs could read "
                                  "the agent's secrets", a->roots[k], own_what[i], own[i]);
                kiln_err_hint(err, "give --data-root directories that hold only data, and keep --work-dir apart");
                goto fail;
            }
        }
    }
    if (a->n_roots == 0)
        log_warn("no --data-root given: jobs on this agent may read no files (synthetic data only)");
    for (size_t i = 0; i < a->n_roots; i++)
        log_info("data root: %s", a->roots[i]);
    /* The credential of an earlier run, unless the operator named another worker id. */
    char fid[128], fcred[AGENT_SECRET_MAX];
    kiln_err_t cerr;
    int crc = agent_credential_load(a->work_dir, fid, sizeof(fid), fcred, sizeof(fcred), &cerr);
    if (crc == 0 && (!a->id_from_cfg || !strcmp(fid, a->worker_id)) && secret_ok(fcred)) {
        kiln_strlcpy(a->worker_id, fid, sizeof(a->worker_id));
        kiln_strlcpy(a->credential, fcred, sizeof(a->credential));
        log_info("worker id %s and its credential loaded from %s/%s", fid, a->work_dir, AGENT_CREDENTIAL_FILE);
    } else if (crc == 0) {
        log_warn("%s/%s is for worker %s, not %s; it is not used", a->work_dir, AGENT_CREDENTIAL_FILE, fid,
                 a->worker_id);
    } else if (crc != KILN_ENOTFOUND) {
        log_warn("%s; registering as a new worker", cerr.message);
    }
    memset(fcred, 0, sizeof(fcred));
    if (cfg->tls.insecure)
        log_warn("--insecure: the connection to kilnd is plain text; the join token, the worker credential, "
                 "specs and logs cross the network readable by anyone on the path");
    if ((rc = agent_rpc_create(a->server, &cfg->tls, &a->rpc, err)) != 0)
        goto fail;
    /* What a previous agent here took in from its ranks but never had stored, the job's log
     * hears of now (sent once registered); from here on every attempt keeps a ledger. */
    ob_set_ledger_dir(&a->ob, a->work_dir);
    ob_recover(&a->ob);
    agent_launcher_config_t lc = {.train_bin = a->train_bin, .work_dir = a->work_dir, .slots = a->slots,
                                   .gpu = !strcmp(a->slot_type, "gpu"), .cores = a->cores, .cpus = cfg->cpus,
                                   .data_roots = (const char *const *)a->roots, .n_data_roots = a->n_roots,
                                   .port_lo = cfg->port_lo, .port_hi = cfg->port_hi,

                                   .comm_watchdog_s = cfg->comm_watchdog_s,
                                   .sibling_grace_ms = a->stop_grace_ms, .sandbox = cfg->sandbox};
    agent_launch_cbs_t cbs = {.on_started = cb_started, .on_line = cb_line, .on_points = cb_points,
                               .on_exit = cb_exit, .ud = a};
    if ((rc = agent_launcher_create(&lc, &cbs, &a->launcher, err)) != 0)
        goto fail;
    a->cores = agent_launcher_cores(a->launcher);
    xfer_env_t xe = {.rpc = a->rpc, .ob = &a->ob, .work_dir = a->work_dir,
                     .auth_md = xfer_auth_md, .unauthenticated = xfer_unauthenticated, .draining = xfer_draining,
                     .worker_id = xfer_worker_id, .start = xfer_start, .ud = a};
    if ((rc = xfer_create(&xe, &a->xfer, err)) != 0)
        goto fail;
    char code_dir[PATH_MAX];
    snprintf(code_dir, sizeof(code_dir), "%s/code-cache", a->work_dir);
    if ((rc = agent_code_cache_create(code_dir, cfg->code_cache_bytes, xfer_code_fetch, a->xfer, &a->code, err)) != 0)
        goto fail;
    if (pthread_create(&a->sender_thread, NULL, agent_sender_main, a) != 0) {
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not start the sender thread");
        goto fail;
    }
    a->sender_started = true;
    if (pthread_create(&a->start_thread, NULL, agent_start_main, a) != 0) {
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not start the starter thread");
        goto fail;
    }
    a->start_started = true;
    if (pthread_create(&a->hb_thread, NULL, agent_hb_main, a) != 0) {
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not start the heartbeat thread");
        goto fail;
    }
    a->hb_started = true;
    if (cfg->metrics_addr && cfg->metrics_addr[0] &&
        (rc = agent_monitor_start(a, cfg->metrics_addr, &a->monitor, err)) != 0)
        goto fail;
    log_info("agent up: kilnd %s (%s), %d %s slot(s), %d core(s)%s%s%s, work dir %s, rank program %s, address %s",
             a->server, cfg->tls.insecure ? "plain text" : cfg->tls.cert_file ? "mutual TLS" : "TLS", a->slots,
             a->slot_type, a->cores, cfg->cpus && cfg->cpus[0] ? " (ranks bound to their slot's share of CPUs " : "",
             cfg->cpus && cfg->cpus[0] ? cfg->cpus : "", cfg->cpus && cfg->cpus[0] ? ")" : "", a->work_dir,
             a->train_bin, a->address);
    *out = a;
    return 0;
fail:
    agent_destroy(a);
    return rc;
}

void agent_shutdown(agent_t *a, int flush_timeout_ms)
{
    if (!a)
        return;
    pthread_mutex_lock(&a->mu);
    bool done = a->shut_done;
    a->shut_done = true;
    a->draining = true;
    a->hb_now = true;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    if (done)
        return;
    /* No launch from here on: the starter finishes the one it may be in, and what still waits is
     * answered as refused by the shutdown. */
    if (a->start_started) {
        pthread_mutex_lock(&a->mu);
        a->stop_starter = true;
        pthread_cond_broadcast(&a->start_cv);
        pthread_mutex_unlock(&a->mu);
        pthread_join(a->start_thread, NULL);
        a->start_started = false;
    }
    pthread_mutex_lock(&a->mu);
    start_item_t *waiting = a->starts;
    a->starts = NULL;
    pthread_mutex_unlock(&a->mu);
    while (waiting) {
        start_item_t *it = waiting;
        waiting = it->next;
        ob_add_status(&a->ob, it->a->job_id, it->a->attempt, false, "the agent is shutting down", true, 0);
        start_item_free(it);
    }
    /* Tell kilnd first (one heartbeat, at most 3 s), so that the attempts lost below are not
     * placed on this worker again. */
    if (a->hb_started && agent_flag(a, &a->registered)) {
        struct timespec ts;
        kiln_deadline_in(&ts, 3000);
        pthread_mutex_lock(&a->mu);
        while (!a->drain_acked)
            if (pthread_cond_timedwait(&a->cv, &a->mu, &ts) != 0)
                break;
        bool acked = a->drain_acked;
        pthread_mutex_unlock(&a->mu);
        if (!acked)
            log_warn("kilnd did not take the draining heartbeat in 3 s; stopping the ranks anyway");
    }
    if (a->launcher) {
        int n = agent_launcher_stop_all(a->launcher, a->stop_grace_ms);
        if (n)
            log_info("stopping %d rank(s) (grace %d ms)", n, a->stop_grace_ms);
        if (!agent_launcher_wait_idle(a->launcher, a->stop_grace_ms + 5000))
            log_warn("ranks did not finish in time");
    }
    /* Uploads under way finish (their ranks' exits follow them), within the flush time. */
    xfer_shutdown(a->xfer, KILN_MIN(flush_timeout_ms, 10000));
    /* Give the sender time to deliver what is queued, exits included. */
    if (a->sender_started) {
        pthread_mutex_lock(&a->ob.mu);
        ob_seal_due_locked(&a->ob, true);
        pthread_cond_broadcast(&a->ob.cv);
        pthread_mutex_unlock(&a->ob.mu);
        int64_t deadline = kiln_mono_us() + (int64_t)flush_timeout_ms * 1000;
        while (!ob_empty(&a->ob) && kiln_mono_us() < deadline)
            usleep(20000);
        if (!ob_empty(&a->ob))
            log_warn("kilnd did not take every queued report before shutdown; some are lost");
    }
    pthread_mutex_lock(&a->mu);
    a->stop_hb = a->stop_sender = true;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    pthread_mutex_lock(&a->ob.mu);
    pthread_cond_broadcast(&a->ob.cv);
    pthread_mutex_unlock(&a->ob.mu);
    if (a->hb_started)
        pthread_join(a->hb_thread, NULL);
    if (a->sender_started)
        pthread_join(a->sender_thread, NULL);
    a->hb_started = a->sender_started = false;
}

void agent_destroy(agent_t *a)
{
    if (!a)
        return;
    if (a->hb_started || a->sender_started || a->start_started)
        agent_shutdown(a, 3000);
    agent_monitor_stop(a->monitor);
    xfer_destroy(a->xfer);
    agent_code_cache_destroy(a->code);
    agent_launcher_destroy(a->launcher);
    agent_rpc_destroy(a->rpc);
    ob_deinit(&a->ob);
    while (a->starts) {
        start_item_t *it = a->starts;
        a->starts = it->next;
        start_item_free(it);
    }
    for (size_t i = 0; i < a->n_roots; i++)
        free(a->roots[i]);
    memset(a->join_token, 0, sizeof(a->join_token));
    memset(a->credential, 0, sizeof(a->credential));
    pthread_cond_destroy(&a->start_cv);
    for (size_t i = 0; i < a->n_gpus; i++)
        free(a->gpus[i]);
    free(a->gpus);
    free(a->server);
    free(a->slot_type);
    free(a->work_dir);
    free(a->train_bin);
    free(a->address);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a);
}

void agent_worker_id(agent_t *a, char *buf, size_t n)
{
    pthread_mutex_lock(&a->mu);
    kiln_strlcpy(buf, a->registered ? a->worker_id : "", n);
    pthread_mutex_unlock(&a->mu);
}

void agent_stats(agent_t *a, agent_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&a->mu);
    out->registered = a->registered;
    out->draining = a->draining;
    kiln_strlcpy(out->worker_id, a->registered ? a->worker_id : "", sizeof(out->worker_id));
    out->heartbeat_loop_age_ms = a->hb_loop_us ? (kiln_mono_us() - a->hb_loop_us) / 1000 : 0;
    out->heartbeat_interval_ms = a->hb_interval_ms;
    pthread_mutex_unlock(&a->mu);
    out->slots = a->slots;
    agent_rank_info_t *list = calloc(AGENT_MAX_LIST, sizeof(*list));
    out->ranks_running = list ? (int)agent_running(a, list, AGENT_MAX_LIST) : 0;
    free(list);
    pthread_mutex_lock(&a->ob.mu);
    out->outbox_bytes = a->ob.queued_bytes;
    pthread_mutex_unlock(&a->ob.mu);
}

/* ---- data roots and the credential file ----------------------------------------------------- */

int agent_data_roots_resolve(const char *const *roots, size_t n, char **out, size_t max, size_t *n_out,
                              kiln_err_t *err)
{
    *n_out = 0;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        const char *r = roots[i] ? roots[i] : "";
        char real[PATH_MAX];
        struct stat st;
        if (!r[0] || !realpath(r, real) || stat(real, &st) != 0) {
            rc = kiln_err_set(err, KILN_EINVAL, "data-root", "data root \"%s\" does not exist", r);
            goto fail;
        }
        if (!S_ISDIR(st.st_mode)) {
            rc = kiln_err_set(err, KILN_EINVAL, "data-root", "data root \"%s\" is not a directory", r);
            goto fail;
        }
        if (strchr(real, ',')) {
            rc = kiln_err_set(err, KILN_EINVAL, "data-root", "data root \"%s\" has a comma in its path, which "
                              RANK_ENV_DATA_ROOTS " cannot carry", r);
            goto fail;
        }
        bool dup = false;
        for (size_t k = 0; k < *n_out && !dup; k++)
            dup = !strcmp(out[k], real);
        if (dup)
            continue;
        if (*n_out >= max) {
            rc = kiln_err_set(err, KILN_EINVAL, "data-root", "more than %zu data roots", max);
            goto fail;
        }
        if (!(out[*n_out] = strdup(real))) {
            rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
            goto fail;
        }
        (*n_out)++;
    }
    return 0;
fail:
    for (size_t k = 0; k < *n_out; k++) {
        free(out[k]);
        out[k] = NULL;
    }
    *n_out = 0;
    return rc;
}

int agent_credential_save(const char *work_dir, const char *worker_id, const char *credential,
                           kiln_err_t *err)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", work_dir, AGENT_CREDENTIAL_FILE);
    size_t len = strlen(worker_id) + strlen(credential) + 32;
    char *text = malloc(len);
    if (!text)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    int n = snprintf(text, len, "worker_id %s\ncredential %s\n", worker_id, credential);
    int rc = kiln_file_write_atomic_mode(path, text, (size_t)n, 0600, err);
    memset(text, 0, len);
    free(text);
    return rc;
}

int agent_credential_load(const char *work_dir, char *worker_id, size_t idn, char *credential,
                           size_t credn, kiln_err_t *err)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", work_dir, AGENT_CREDENTIAL_FILE);
    char *text = NULL;
    size_t len = 0;
    worker_id[0] = credential[0] = '\0';
    int rc = kiln_file_read(path, &text, &len, err);
    if (rc)
        return rc;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (!strncmp(line, "worker_id ", 10) && strlen(line + 10) < idn)
            kiln_strlcpy(worker_id, line + 10, idn);
        else if (!strncmp(line, "credential ", 11) && strlen(line + 11) < credn)
            kiln_strlcpy(credential, line + 11, credn);
    }
    memset(text, 0, len);
    free(text);
    if (!worker_id[0] || !credential[0]) {
        worker_id[0] = credential[0] = '\0';
        return kiln_err_set(err, KILN_EFORMAT, NULL, "%s is not a kiln-agent credential file", path);
    }
    return 0;
}

/* ---- the machine ------------------------------------------------------------------------- */

int agent_gpu_detect(char **names, int max)
{
    int count = 0;
    static const char *libs[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(libs) && count == 0; i++) {
        void *h = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL);
        if (!h)
            continue;
        int (*get_count)(int *) = (int (*)(int *))dlsym(h, "cudaGetDeviceCount");
        int c = 0; /* left untouched when there is no device */
        if (get_count && get_count(&c) == 0 && c > 0)
            count = c;
        dlclose(h);
        break;
    }
    int listed = 0;
    FILE *p = popen("nvidia-smi -L 2>/dev/null", "r");
    if (p) {
        char line[512];
        while (fgets(line, sizeof(line), p)) {
            if (strncmp(line, "GPU ", 4) != 0)
                continue;
            char *name = strchr(line, ':');
            if (!name)
                continue;
            name++;
            while (*name == ' ')
                name++;
            char *uuid = strstr(name, " (UUID");
            if (uuid)
                *uuid = '\0';
            name[strcspn(name, "\n")] = '\0';
            if (names && listed < max)
                names[listed] = strdup(name);
            listed++;
        }
        pclose(p);
    }
    if (count == 0)
        count = listed;
    if (names)
        for (int i = listed; i < KILN_MIN(count, max); i++)
            names[i] = strdup("GPU");
    return count;
}

void agent_pick_address(const char *server, char *buf, size_t n)
{
    char host[256];
    const char *s = server ? server : "";
    if (!strncmp(s, "dns:///", 7))
        s += 7;
    else if (!strncmp(s, "ipv4:", 5))
        s += 5;
    if (s[0] == '[') {
        const char *end = strchr(s, ']');
        size_t len = end ? (size_t)(end - s - 1) : strlen(s + 1);
        snprintf(host, sizeof(host), "%.*s", (int)KILN_MIN(len, sizeof(host) - 1), s + 1);
    } else {
        const char *colon = strrchr(s, ':');
        size_t len = colon ? (size_t)(colon - s) : strlen(s);
        snprintf(host, sizeof(host), "%.*s", (int)KILN_MIN(len, sizeof(host) - 1), s);
    }
    kiln_strlcpy(buf, "127.0.0.1", n);
    if (!host[0] || !strcmp(host, "localhost") || !strncmp(host, "127.", 4) || !strcmp(host, "::1"))
        return;
    /* The local address the kernel would use to reach the server: connect a UDP socket. */
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM}, *res = NULL;
    if (getaddrinfo(host, "9", &hints, &res) != 0 || !res)
        return;
    int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
            char tmp[INET6_ADDRSTRLEN];
            const void *src = ss.ss_family == AF_INET ? (const void *)&((struct sockaddr_in *)&ss)->sin_addr
                                                      : (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr;
            if (inet_ntop(ss.ss_family, src, tmp, sizeof(tmp)))
                kiln_strlcpy(buf, tmp, n);
        }
    }
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
}
