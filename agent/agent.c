/* agent.c - kiln-agent's lifecycle: creating the agent (its work dir, credential, data roots,
 * outbox, transfers, checkpoint sync, code cache and launcher) and its threads (heartbeat.c, starter.c,
 * sender.c, watch.c), the launcher's callbacks (everything a rank says goes into the outbox; rank 0's exit
 * waits for its output's upload), the transfers' callbacks, shutting down in order (drain, stop
 * the ranks, flush), and the agent's numbers for its monitor port. */
#include "agent/agent_int.h"
#include "rank/rank.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- launcher callbacks: everything goes into the outbox ------------------------------------ */

static void cb_started(void *ud, const char *job_id, int attempt, bool ok, bool host_fault, const char *reason,
                       int master_port)
{
    agent_t *a = ud;
    ob_add_status(&a->ob, job_id, attempt, ok, reason, host_fault ? OB_FAULT_HOST : OB_FAULT_JOB,
                  master_port);
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
    if (rank == 0 && shutdown)
        ckpt_sync_final(a->ckpt, job_id, attempt); /* what its SIGTERM checkpoint left, before the exit */
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
void agent_wait(agent_t *a, int ms, const bool *flag, const bool *wake)
{
    struct timespec ts;
    kiln_deadline_in(&ts, ms);
    pthread_mutex_lock(&a->mu);
    while (!*flag && !(wake && *wake))
        if (pthread_cond_timedwait(&a->cv, &a->mu, &ts) != 0)
            break;
    pthread_mutex_unlock(&a->mu);
}

bool agent_flag(agent_t *a, const bool *flag)
{
    pthread_mutex_lock(&a->mu);
    bool v = *flag;
    pthread_mutex_unlock(&a->mu);
    return v;
}

/* ---- the transfers' callbacks ----------------------------------------------------------------- */

static size_t xfer_auth_md(void *ud, char *bearer, agent_md_t *md)
{
    return agent_auth_md(ud, bearer, md);
}

static void xfer_unauthenticated(void *ud, const char *what, const kiln_err_t *err)
{
    agent_unauthenticated(ud, what, err);
}

static bool xfer_draining(void *ud)
{
    agent_t *a = ud;
    return agent_flag(a, &a->draining);
}

static void xfer_start(void *ud, const Kiln__Assignment *as)
{
    agent_start_enqueue(ud, as, true);
}

static void xfer_ckpt_final(void *ud, const char *job_id, int attempt)
{
    agent_t *a = ud;
    ckpt_sync_final(a->ckpt, job_id, attempt);
}

static void xfer_worker_id(void *ud, char *buf, size_t n)
{
    agent_t *a = ud;
    pthread_mutex_lock(&a->mu);
    kiln_strlcpy(buf, a->worker_id, n);
    pthread_mutex_unlock(&a->mu);
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
    ob_init(&a->ob, cfg->outbox_mb);
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
        if (!agent_secret_ok(cfg->join_token)) {
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
    if (crc == 0 && (!a->id_from_cfg || !strcmp(fid, a->worker_id)) && agent_secret_ok(fcred)) {
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
    xfer_env_t xe = {.rpc = a->rpc, .ob = &a->ob, .work_dir = a->work_dir,
                     .auth_md = xfer_auth_md, .unauthenticated = xfer_unauthenticated, .draining = xfer_draining,
                     .worker_id = xfer_worker_id, .start = xfer_start, .ckpt_final = xfer_ckpt_final, .ud = a,
                     .chunk_bytes = cfg->upload_chunk_kb << 10, .delay_ms = cfg->upload_delay_ms};
    if ((rc = xfer_create(&xe, &a->xfer, err)) != 0)
        goto fail;
    if ((rc = ckpt_sync_create(a->xfer, a->work_dir, &a->ckpt, err)) != 0)
        goto fail;
    char code_dir[PATH_MAX];
    snprintf(code_dir, sizeof(code_dir), "%s/code-cache", a->work_dir);
    if ((rc = agent_code_cache_create(code_dir, cfg->code_cache_bytes, xfer_code_fetch, a->xfer, &a->code, err)) != 0)
        goto fail;
    agent_launcher_config_t lc = {.train_bin = a->train_bin, .work_dir = a->work_dir, .slots = a->slots,
                                   .gpu = !strcmp(a->slot_type, "gpu"), .cores = a->cores, .cpus = cfg->cpus,
                                   .data_roots = (const char *const *)a->roots, .n_data_roots = a->n_roots,
                                   .port_lo = cfg->port_lo, .port_hi = cfg->port_hi,
                                   .comm_watchdog_s = cfg->comm_watchdog_s,
                                   .sibling_grace_ms = a->stop_grace_ms, .sandbox = cfg->sandbox,
                                   .python = cfg->python, .code = a->code, .cuda_lib = cfg->cuda_lib};
    agent_launch_cbs_t cbs = {.on_started = cb_started, .on_line = cb_line, .on_points = cb_points,
                               .on_exit = cb_exit, .ud = a};
    if ((rc = agent_launcher_create(&lc, &cbs, &a->launcher, err)) != 0)
        goto fail;
    a->cores = agent_launcher_cores(a->launcher);
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
    if (pthread_create(&a->watch_thread, NULL, agent_watch_main, a) != 0) {
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not start the watch thread");
        goto fail;
    }
    a->watch_started = true;
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
        ob_add_status(&a->ob, it->a->job_id, it->a->attempt, false, "the agent is shutting down", OB_FAULT_SHUTDOWN, 0);
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
    agent_rpc_watch_cancel(a->rpc);
    if (a->watch_started)
        pthread_join(a->watch_thread, NULL);
    if (a->hb_started)
        pthread_join(a->hb_thread, NULL);
    if (a->sender_started)
        pthread_join(a->sender_thread, NULL);
    a->hb_started = a->sender_started = a->watch_started = false;
}

void agent_destroy(agent_t *a)
{
    if (!a)
        return;
    if (a->hb_started || a->sender_started || a->start_started || a->watch_started)
        agent_shutdown(a, 3000);
    agent_monitor_stop(a->monitor);
    xfer_shutdown(a->xfer, 0);
    ckpt_sync_destroy(a->ckpt);
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

