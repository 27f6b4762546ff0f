/* sender.c - kiln-agent's sender: drains the outbox in order (log and metric batches, rank
 * statuses and exits; the statuses and exits at its head in one ReportBatch call, up to
 * AGENT_BATCH_MAX), retrying while kilnd is unreachable and giving a report up only when kilnd
 * refuses it for good. */
#include "agent/agent_int.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char k_status[] = "/kiln.AgentService/ReportRankStatus";
static const char k_logs[] = "/kiln.AgentService/PushLogs";
static const char k_metrics[] = "/kiln.AgentService/PushMetrics";
static const char k_exit[] = "/kiln.AgentService/ReportRankExit";
static const char k_batch[] = "/kiln.AgentService/ReportBatch";

/* ---- messages of one report ------------------------------------------------------------------ */

static void status_msg(const ob_item_t *it, char *wid, Kiln__RankStatus *rs)
{
    kiln__rank_status__init(rs);
    rs->worker_id = wid;
    rs->job_id = (char *)it->job_id;
    rs->attempt = it->attempt;
    rs->started = it->started;
    rs->reason = (char *)it->reason;
    rs->worker_shutdown = it->shutdown;
    rs->host_fault = it->host_fault;
    rs->master_port = it->port;
}

static void exit_msg(const ob_item_t *it, char *wid, Kiln__RankExit *rx)
{
    kiln__rank_exit__init(rx);
    rx->worker_id = wid;
    rx->job_id = (char *)it->job_id;
    rx->attempt = it->attempt;
    rx->rank = it->rank;
    rx->exit_code = it->exit_code;
    rx->signal = it->sig;
    rx->reason = (char *)it->reason;
    rx->worker_shutdown = it->shutdown;
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
        status_msg(it, wid, &rs);
        req = &rs.base;
        method = k_status;
        break;
    case OB_EXIT:
        exit_msg(it, wid, &rx);
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

static bool ob_is_report(const ob_item_t *it)
{
    return it->kind == OB_STATUS || it->kind == OB_EXIT;
}

/* The statuses and exits at the head of the outbox (up to the first log or metric batch, at most
 * AGENT_BATCH_MAX and about AGENT_BATCH_BYTES) in one ReportBatch call. On kilnd's answer
 * returns 0 and applies each report's result in order: done, or refused for good (logged and
 * dropped), are taken off the outbox; the first not handled (a retryable code) stays, with every
 * report after it, and *retry says so (its tries counted, given up after AGENT_MAX_INTERNAL_TRIES
 * INTERNAL/UNKNOWN answers as a single send is). Otherwise the call's rc, *code and err, and
 * the outbox as it was. */
static int agent_send_batch(agent_t *a, char *wid, bool *retry, int *code, kiln_err_t *err)
{
    ob_item_t *items[AGENT_BATCH_MAX];
    size_t n = 0, bytes = 0;
    *retry = false;
    pthread_mutex_lock(&a->ob.mu);   /* pushes link new items behind the tail: walk under the lock */
    for (ob_item_t *it = a->ob.head; it && ob_is_report(it) && n < AGENT_BATCH_MAX; it = it->next) {
        bytes += strlen(it->reason) + strlen(it->job_id) + 64;
        if (n > 0 && bytes > AGENT_BATCH_BYTES)
            break;
        items[n++] = it;   /* only this thread takes items off the head; statuses and exits are never shed */
    }
    pthread_mutex_unlock(&a->ob.mu);
    Kiln__Report *reps = calloc(n, sizeof(*reps)), **repp = calloc(n, sizeof(*repp));
    Kiln__RankStatus *rs = calloc(n, sizeof(*rs));
    Kiln__RankExit *rx = calloc(n, sizeof(*rx));
    if (!reps || !repp || !rs || !rx) {
        free(reps);
        free(repp);
        free(rs);
        free(rx);
        *code = 8;
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        kiln__report__init(&reps[i]);
        if (items[i]->kind == OB_STATUS) {
            status_msg(items[i], wid, &rs[i]);
            reps[i].kind_case = KILN__REPORT__KIND_STATUS;
            reps[i].status = &rs[i];
        } else {
            exit_msg(items[i], wid, &rx[i]);
            reps[i].kind_case = KILN__REPORT__KIND_EXIT;
            reps[i].exit = &rx[i];
        }
        repp[i] = &reps[i];
    }
    Kiln__ReportBatchRequest req = KILN__REPORT_BATCH_REQUEST__INIT;
    req.worker_id = wid;
    req.n_reports = n;
    req.reports = repp;
    ProtobufCMessage *resp = NULL;
    char bearer[AGENT_SECRET_MAX + 8];
    agent_md_t md[1];
    size_t n_md = agent_auth_md(a, bearer, md);
    int rc = agent_rpc_call(a->rpc, k_batch, md, n_md, &req.base, &kiln__report_batch_reply__descriptor,
                            AGENT_RPC_TIMEOUT_MS, &resp, code, err);
    memset(bearer, 0, sizeof(bearer));
    free(reps);
    free(repp);
    free(rs);
    free(rx);
    if (rc)
        return rc;
    const Kiln__ReportBatchReply *rep = (const Kiln__ReportBatchReply *)resp;
    for (size_t i = 0; i < n; i++) {
        ob_item_t *it = items[i];
        /* a reply short of results leaves the rest unhandled: sent again */
        int c = i < rep->n_results ? rep->results[i]->code : GRPC_UNAVAILABLE;
        const char *msg = i < rep->n_results && rep->results[i]->message ? rep->results[i]->message : "no result";
        if (c != 0 && agent_grpc_retryable(c)) {
            if ((c == 13 || c == 2) && ++it->tries >= AGENT_MAX_INTERNAL_TRIES) {
                log_error("kilnd failed a %s of job %s %d times (gRPC status %d): %s; dropping it",
                          ob_kind_name(it->kind), it->job_id, it->tries, c, msg);
            } else {
                if (c != 13 && c != 2)
                    it->tries++;
                log_warn("could not send a %s of job %s to kilnd: %s (will retry)", ob_kind_name(it->kind),
                         it->job_id, msg);
                *retry = true;
                break;
            }
        } else if (c != 0) {
            log_error("kilnd rejected a %s of job %s (gRPC status %d): %s; dropping it", ob_kind_name(it->kind),
                      it->job_id, c, msg);
        }
        pthread_mutex_lock(&a->ob.mu);
        ob_pop_locked(&a->ob);
        pthread_mutex_unlock(&a->ob.mu);
        ob_item_free(it);
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}

void *agent_sender_main(void *arg)
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
        if (ob_is_report(it) && !a->ob.no_batch) {
            bool retry = false;
            int rc = agent_send_batch(a, wid, &retry, &code, &err);
            if (rc == 0 && !retry) {
                if (fails > 0)
                    log_info("kilnd accepts reports again");
                fails = 0;
                backoff = 100;
                continue;
            }
            if (rc != 0 && code == GRPC_UNIMPLEMENTED) {
                log_info("kilnd does not take report batches (it is older than this agent): sending start "
                         "reports and rank exits one at a time");
                a->ob.no_batch = true;
                continue;
            }
            if (rc == 0 || code == GRPC_UNAUTHENTICATED || agent_grpc_retryable(code) || code == 0) {
                if (rc != 0 && code == GRPC_UNAUTHENTICATED) {
                    agent_unauthenticated(a, "report batch", &err);
                    continue;
                }
                if (rc != 0) {
                    it->tries++;
                    if (fails % 20 == 0)
                        log_warn("could not send a report batch to kilnd: %s (will retry)", err.message);
                }
                fails++;
                agent_wait(a, backoff, &a->stop_sender, NULL);
                backoff = KILN_MIN(backoff * 2, 1000);
                continue;
            }
            /* refused as a whole (not for a report's sake): the head goes alone, as a single call */
            log_warn("kilnd refused a report batch (gRPC status %d): %s; sending the first report alone", code,
                     err.message);
        }
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

