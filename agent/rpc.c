/* rpc.c - the agent's gRPC client: one channel to kilnd (TLS, optionally with a client
 * certificate, or plain text when asked) and blocking unary calls with deadlines and per-call
 * metadata over the gRPC C core, messages packed with protobuf-c, and one held server stream
 * (agent_rpc_watch: WatchWork). With several kilnd addresses
 * the channel goes to one of them and moves to the next when the caller says so
 * (agent_rpc_next). Retrying is the caller's business (kiln_grpc_retryable says when it is
 * worth it); which credential a call carries is agent.c's. */
#include "agent/agent.h"

#include <grpc/byte_buffer_reader.h>
#include <pthread.h>
#include <stdatomic.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RPC_MAX_MESSAGE (16 << 20)
#define RPC_MAX_MD 8
/* The machine's trust store (Debian's ca-certificates), used when no --tls-ca is given. */
#define RPC_SYSTEM_ROOTS "/etc/ssl/certs/ca-certificates.crt"

#define RPC_MAX_TARGETS 16

struct agent_rpc {
    /* calls and the keeper use ch under the read lock; moving to another target takes it for
     * writing (after the calls in flight end) */
    pthread_rwlock_t lock;
    grpc_channel *ch;
    grpc_channel_credentials *creds;
    char *targets[RPC_MAX_TARGETS];
    int ntargets, cur;
    /* The keeper: a thread that watches the channel's connectivity on its own completion queue.
     * While the channel reconnects (kilnd restarted), its TCP connect and TLS handshake make
     * progress only while some thread polls for them, and calls fail at once instead of
     * waiting; without the keeper a TLS handshake would stall between the gRPC core's
     * occasional backup polls, and a restarted kilnd stay unreachable for many seconds. */
    grpc_completion_queue *keeper_cq;
    pthread_t keeper;
    bool keeper_started;
    atomic_bool stopping;
    /* The held stream (agent_rpc_watch), cancelled when the channel moves or on request; it
     * holds no lock while it waits (the call keeps the channel it was made on alive). */
    pthread_mutex_t watch_mu;
    grpc_call *watch;
    bool watch_cancel;               /* cancel the watch starting now, too */
};

static void *rpc_keeper_main(void *arg)
{
    agent_rpc_t *r = arg;
    while (!atomic_load(&r->stopping)) {
        pthread_rwlock_rdlock(&r->lock);
        grpc_connectivity_state st = grpc_channel_check_connectivity_state(r->ch, 1);
        gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(200, GPR_TIMESPAN));
        grpc_channel_watch_connectivity_state(r->ch, st, deadline, r->keeper_cq, r);
        grpc_event ev;
        do
            ev = grpc_completion_queue_next(r->keeper_cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        while (ev.type == GRPC_QUEUE_TIMEOUT);
        pthread_rwlock_unlock(&r->lock);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
    }
    return NULL;
}

int agent_grpc_status(int code)
{
    switch (code) {
    case GRPC_STATUS_OK: return KILN_OK;
    case GRPC_STATUS_CANCELLED: return KILN_ECANCELED;
    case GRPC_STATUS_INVALID_ARGUMENT: return KILN_EINVAL;
    case GRPC_STATUS_DEADLINE_EXCEEDED: return KILN_ETIMEDOUT;
    case GRPC_STATUS_NOT_FOUND: return KILN_ENOTFOUND;
    case GRPC_STATUS_ALREADY_EXISTS: return KILN_EEXIST;
    case GRPC_STATUS_PERMISSION_DENIED: return KILN_EPERM;
    case GRPC_STATUS_RESOURCE_EXHAUSTED: return KILN_ENOMEM;
    case GRPC_STATUS_FAILED_PRECONDITION: return KILN_ESTATE;
    case GRPC_STATUS_UNIMPLEMENTED: return KILN_EUNSUPP;
    case GRPC_STATUS_UNAVAILABLE: return KILN_EUNAVAIL;
    case GRPC_STATUS_UNAUTHENTICATED: return KILN_EUNAUTH;
    default: return KILN_EINTERNAL;
    }
}

/* Reads a PEM file named by a flag. Errors name the flag and the file, never what it holds. */
static int rpc_read_pem(const char *flag, const char *path, char **out, kiln_err_t *err)
{
    size_t len = 0;
    int rc = kiln_file_read(path, out, &len, err);
    if (rc)
        return kiln_err_set(err, rc, flag, "%s: could not read \"%s\"%s", flag, path,
                            rc == KILN_ENOTFOUND ? ": no such file" : "");
    if (!strstr(*out, "-----BEGIN ")) {
        free(*out);
        *out = NULL;
        return kiln_err_set(err, KILN_EINVAL, flag, "%s: \"%s\" holds no PEM data", flag, path);
    }
    return 0;
}

/* Channel credentials for tls (NULL or insecure: plain text). */
static int rpc_creds(const agent_tls_t *tls, grpc_channel_credentials **out, kiln_err_t *err)
{
    *out = NULL;
    if (!tls || tls->insecure) {
        if (tls && (tls->ca_file || tls->cert_file || tls->key_file))
            return kiln_err_set(err, KILN_EINVAL, "insecure",
                                "--insecure (plain text) cannot be combined with --tls-ca, --tls-cert or --tls-key");
        *out = grpc_insecure_credentials_create();
        return 0;
    }
    if (!tls->cert_file != !tls->key_file)
        return kiln_err_set(err, KILN_EINVAL, tls->cert_file ? "tls-key" : "tls-cert",
                            "--tls-cert and --tls-key go together (the client certificate and its key)");
    char *ca = NULL, *cert = NULL, *key = NULL;
    int rc = 0;
    if (tls->ca_file)
        rc = rpc_read_pem("--tls-ca", tls->ca_file, &ca, err);
    else if (access(RPC_SYSTEM_ROOTS, R_OK) == 0)
        rc = rpc_read_pem("system CA roots", RPC_SYSTEM_ROOTS, &ca, err);
    if (rc == 0 && tls->cert_file)
        rc = rpc_read_pem("--tls-cert", tls->cert_file, &cert, err);
    if (rc == 0 && tls->key_file)
        rc = rpc_read_pem("--tls-key", tls->key_file, &key, err);
    if (rc == 0) {
        grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
        /* ca NULL (no trust store on the machine): gRPC's own default roots */
        *out = grpc_ssl_credentials_create(ca, cert ? &pair : NULL, NULL, NULL);
        if (!*out)
            rc = kiln_err_set(err, KILN_EINVAL, NULL, "could not set up TLS with the given certificates");
    }
    if (key) {
        memset(key, 0, strlen(key)); /* the private key does not outlive its use */
        free(key);
    }
    free(cert);
    free(ca);
    return rc;
}

static grpc_channel *rpc_channel(agent_rpc_t *r, const char *target)
{
    grpc_arg args[] = {
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, .value.integer = RPC_MAX_MESSAGE},
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, .value.integer = RPC_MAX_MESSAGE},
        /* kilnd restarting should be noticed within a couple of seconds, not minutes. Not
         * GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: the gRPC core takes it as the least time a connection
         * attempt is given to come up (its default is 20 s), and at 100 ms a kilnd a few tens of
         * milliseconds away, or a loaded machine, saw every attempt cut off before HTTP/2's
         * settings (or TLS) were through, and calls fail at once while the channel has none. */
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, .value.integer = 100},
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, .value.integer = 2000},
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_ENABLE_RETRIES, .value.integer = 0},
    };
    grpc_channel_args ca = {.num_args = KILN_ARRAY_LEN(args), .args = args};
    return grpc_channel_create(target, r->creds, &ca);
}

int agent_rpc_create(const char *target, const agent_tls_t *tls, agent_rpc_t **out, kiln_err_t *err)
{
    *out = NULL;
    grpc_channel_credentials *creds = NULL;
    int rc = rpc_creds(tls, &creds, err);
    if (rc)
        return rc;
    agent_rpc_t *r = calloc(1, sizeof(*r));
    if (!r) {
        grpc_channel_credentials_release(creds);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    r->creds = creds;
    /* writers first: a move to another kilnd must not wait behind a stream of calls */
    pthread_rwlockattr_t la;
    pthread_rwlockattr_init(&la);
    pthread_rwlockattr_setkind_np(&la, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&r->lock, &la);
    pthread_mutex_init(&r->watch_mu, NULL);
    pthread_rwlockattr_destroy(&la);
    /* "host:port" or a comma-separated list of them (several kilnd replicas) */
    const char *p = target ? target : "";
    while (*p && r->ntargets < RPC_MAX_TARGETS) {
        size_t n = strcspn(p, ",");
        if (n > 0 && (r->targets[r->ntargets] = strndup(p, n)) != NULL)
            r->ntargets++;
        p += n;
        if (*p == ',')
            p++;
    }
    grpc_init();
    if (r->ntargets == 0) {
        rc = kiln_err_set(err, KILN_EINVAL, "server", "no kilnd address given");
        kiln_err_hint(err, "pass --server HOST:PORT (several, comma-separated, for kilnd replicas)");
        agent_rpc_destroy(r);
        return rc;
    }
    r->ch = rpc_channel(r, r->targets[0]);
    if (!r->ch) {
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not create a gRPC channel to %s", r->targets[0]);
        agent_rpc_destroy(r);
        return rc;
    }
    atomic_init(&r->stopping, false);
    r->keeper_cq = grpc_completion_queue_create_for_next(NULL);
    if (r->keeper_cq && pthread_create(&r->keeper, NULL, rpc_keeper_main, r) == 0)
        r->keeper_started = true;
    if (!r->keeper_started) {
        agent_rpc_destroy(r);
        return kiln_err_set(err, KILN_EIO, NULL, "could not start the channel's keeper thread");
    }
    *out = r;
    return 0;
}

const char *agent_rpc_next(agent_rpc_t *r)
{
    if (r->ntargets < 2)
        return r->targets[0];
    pthread_rwlock_wrlock(&r->lock);
    r->cur = (r->cur + 1) % r->ntargets;
    grpc_channel *ch = rpc_channel(r, r->targets[r->cur]);
    if (ch) {
        grpc_channel_destroy(r->ch);
        r->ch = ch;
    }
    const char *t = r->targets[r->cur];
    pthread_rwlock_unlock(&r->lock);
    pthread_mutex_lock(&r->watch_mu);
    if (r->watch) /* it reconnects, to the new target */
        grpc_call_cancel(r->watch, NULL);
    pthread_mutex_unlock(&r->watch_mu);
    return t;
}

int agent_rpc_ntargets(const agent_rpc_t *r)
{
    return r->ntargets;
}

void agent_rpc_destroy(agent_rpc_t *r)
{
    if (!r)
        return;
    if (r->keeper_started) {
        atomic_store(&r->stopping, true);
        pthread_join(r->keeper, NULL); /* it sees the flag within one 200 ms watch */
    }
    if (r->ch)
        grpc_channel_destroy(r->ch);
    if (r->keeper_cq) {
        grpc_completion_queue_shutdown(r->keeper_cq);
        while (grpc_completion_queue_next(r->keeper_cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
               GRPC_QUEUE_SHUTDOWN)
            ;
        grpc_completion_queue_destroy(r->keeper_cq);
    }
    if (r->creds)
        grpc_channel_credentials_release(r->creds);
    for (int i = 0; i < r->ntargets; i++)
        free(r->targets[i]);
    pthread_rwlock_destroy(&r->lock);
    pthread_mutex_destroy(&r->watch_mu);
    free(r);
    grpc_shutdown();
}

/* The call's metadata as the core takes it: static slices point at the caller's strings, which
 * outlive the call. n_md is at most RPC_MAX_MD. */
static void rpc_md(const agent_md_t *md, size_t n_md, grpc_metadata *send_md)
{
    memset(send_md, 0, sizeof(*send_md) * RPC_MAX_MD);
    for (size_t i = 0; i < n_md; i++) {
        send_md[i].key = grpc_slice_from_static_string(md[i].key);
        send_md[i].value = grpc_slice_from_static_string(md[i].value);
    }
}

/* One request message, a copy of data. */
static grpc_byte_buffer *rpc_request_bb(const void *data, size_t len)
{
    grpc_slice req_s = grpc_slice_from_copied_buffer(data ? data : "", len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&req_s, 1);
    grpc_slice_unref(req_s);
    return bb;
}

/* The first four ops of a call: its metadata and one request message out, the end of the client's
 * side, and the server's initial metadata in. */
static void rpc_request_ops(grpc_op *ops, grpc_metadata *send_md, size_t n_md, grpc_byte_buffer *req_bb,
                            grpc_metadata_array *init_md)
{
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = n_md;
    ops[0].data.send_initial_metadata.metadata = n_md ? send_md : NULL;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = req_bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = init_md;
}

/* A status other than OK as the kiln status matching it, with kilnd's message and hint in err. */
static int rpc_status_err(grpc_status_code status, grpc_slice details, const grpc_metadata_array *trail_md,
                          const char *method, kiln_err_t *err)
{
    size_t dl = GRPC_SLICE_LENGTH(details);
    int rc = kiln_err_set(err, agent_grpc_status((int)status), NULL, "%s failed with gRPC status %d", method,
                          (int)status);
    /* kilnd's message as it sent it, its lines (a detail, "hint: ...") kept: kiln_err_set would
     * escape the line breaks, and kilnd escaped any control character a client put in it */
    if (dl > 0 && err)
        snprintf(err->message, sizeof(err->message), "%.*s", (int)KILN_MIN(dl, 250),
                 (const char *)GRPC_SLICE_START_PTR(details));
    /* kilnd's hint (how to fix it, when to retry) rides in the trailing metadata */
    for (size_t i = 0; err && i < trail_md->count; i++)
        if (grpc_slice_str_cmp(trail_md->metadata[i].key, "kiln-hint") == 0) {
            size_t hl = GRPC_SLICE_LENGTH(trail_md->metadata[i].value);
            snprintf(err->hint, sizeof(err->hint), "%.*s", (int)KILN_MIN(hl, sizeof(err->hint) - 1),
                     (const char *)GRPC_SLICE_START_PTR(trail_md->metadata[i].value));
        }
    return rc;
}

int agent_rpc_call_raw(agent_rpc_t *r, const char *method, const agent_md_t *md, size_t n_md,
                        const void *data, size_t len, int timeout_ms, uint8_t **out, size_t *out_len,
                        int *grpc_code, kiln_err_t *err)
{
    *out = NULL;
    *out_len = 0;
    if (grpc_code)
        *grpc_code = GRPC_STATUS_UNKNOWN;
    if (n_md > RPC_MAX_MD)
        return kiln_err_set(err, KILN_EINVAL, NULL, "too many metadata entries for one call");
    int rc = 0;
    grpc_metadata send_md[RPC_MAX_MD];
    rpc_md(md, n_md, send_md);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                                         gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
    grpc_slice method_s = grpc_slice_from_copied_string(method);
    pthread_rwlock_rdlock(&r->lock);
    grpc_call *call = grpc_channel_create_call(r->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method_s,
                                               NULL, deadline, NULL);
    grpc_slice_unref(method_s);
    grpc_byte_buffer *req_bb = rpc_request_bb(data, len);
    grpc_metadata_array init_md, trail_md;
    grpc_metadata_array_init(&init_md);
    grpc_metadata_array_init(&trail_md);
    grpc_byte_buffer *resp_bb = NULL;
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    const char *error_string = NULL;

    bool call_locked = true;
    grpc_op ops[6];
    memset(ops, 0, sizeof(ops));
    rpc_request_ops(ops, send_md, n_md, req_bb, &init_md);
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &resp_bb;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trail_md;
    ops[5].data.recv_status_on_client.status = &status;
    ops[5].data.recv_status_on_client.status_details = &details;
    ops[5].data.recv_status_on_client.error_string = &error_string;
    grpc_call_error ce = grpc_call_start_batch(call, ops, KILN_ARRAY_LEN(ops), (void *)1, NULL);
    if (ce != GRPC_CALL_OK) {
        rc = kiln_err_set(err, KILN_EINTERNAL, NULL, "could not start a gRPC call to %s: %s", method,
                          grpc_call_error_to_string(ce));
        grpc_call_unref(call);
        goto done;
    }
    grpc_event ev = grpc_completion_queue_pluck(cq, (void *)1, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    pthread_rwlock_unlock(&r->lock);
    call_locked = false;
    grpc_call_unref(call);
    if (ev.type != GRPC_OP_COMPLETE || !ev.success) {
        rc = kiln_err_set(err, KILN_EINTERNAL, NULL, "gRPC call to %s did not complete", method);
        goto done;
    }
    if (grpc_code)
        *grpc_code = (int)status;
    if (status != GRPC_STATUS_OK) {
        rc = rpc_status_err(status, details, &trail_md, method, err);
        goto done;
    }
    if (resp_bb) {
        grpc_byte_buffer_reader reader;
        if (!grpc_byte_buffer_reader_init(&reader, resp_bb)) {
            rc = kiln_err_set(err, KILN_EFORMAT, NULL, "could not read the reply of %s", method);
            goto done;
        }
        grpc_slice s = grpc_byte_buffer_reader_readall(&reader);
        grpc_byte_buffer_reader_destroy(&reader);
        *out_len = GRPC_SLICE_LENGTH(s);
        *out = malloc(*out_len + 1);
        if (*out)
            memcpy(*out, GRPC_SLICE_START_PTR(s), *out_len);
        grpc_slice_unref(s);
        if (!*out)
            rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
done:
    if (call_locked)
        pthread_rwlock_unlock(&r->lock);
    if (error_string)
        gpr_free((void *)error_string);
    grpc_slice_unref(details);
    if (resp_bb)
        grpc_byte_buffer_destroy(resp_bb);
    grpc_byte_buffer_destroy(req_bb);
    grpc_metadata_array_destroy(&init_md);
    grpc_metadata_array_destroy(&trail_md);
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_destroy(cq);
    return rc;
}

void agent_rpc_watch_cancel(agent_rpc_t *r)
{
    pthread_mutex_lock(&r->watch_mu);
    if (r->watch)
        grpc_call_cancel(r->watch, NULL);
    else
        r->watch_cancel = true;
    pthread_mutex_unlock(&r->watch_mu);
}

/* Plucks tag from cq; false when the batch failed (the call is over). */
static bool rpc_pluck(grpc_completion_queue *cq, void *tag)
{
    grpc_event ev = grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    return ev.type == GRPC_OP_COMPLETE && ev.success;
}

int agent_rpc_watch(agent_rpc_t *r, const char *method, const agent_md_t *md, size_t n_md, const void *data,
                    size_t len, int timeout_ms, void (*on_msg)(void *ud, const uint8_t *msg, size_t len), void *ud,
                    int *grpc_code, kiln_err_t *err)
{
    *grpc_code = GRPC_STATUS_UNKNOWN;
    if (n_md > RPC_MAX_MD)
        return kiln_err_set(err, KILN_EINVAL, NULL, "too many metadata entries for one call");
    grpc_metadata send_md[RPC_MAX_MD];
    rpc_md(md, n_md, send_md);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
    grpc_slice method_s = grpc_slice_from_copied_string(method);
    pthread_rwlock_rdlock(&r->lock);
    grpc_call *call = grpc_channel_create_call(r->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method_s, NULL, deadline,
                                               NULL);
    pthread_rwlock_unlock(&r->lock);
    grpc_slice_unref(method_s);
    pthread_mutex_lock(&r->watch_mu);
    r->watch = call;
    if (r->watch_cancel)
        grpc_call_cancel(call, NULL);
    r->watch_cancel = false;
    pthread_mutex_unlock(&r->watch_mu);
    grpc_byte_buffer *req_bb = rpc_request_bb(data, len);
    grpc_metadata_array init_md, trail_md;
    grpc_metadata_array_init(&init_md);
    grpc_metadata_array_init(&trail_md);
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    const char *error_string = NULL;
    grpc_op ops[4];
    memset(ops, 0, sizeof(ops));
    rpc_request_ops(ops, send_md, n_md, req_bb, &init_md);
    grpc_op st_op;
    memset(&st_op, 0, sizeof(st_op));
    st_op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    st_op.data.recv_status_on_client.trailing_metadata = &trail_md;
    st_op.data.recv_status_on_client.status = &status;
    st_op.data.recv_status_on_client.status_details = &details;
    st_op.data.recv_status_on_client.error_string = &error_string;
    int rc = 0;
    bool sent = grpc_call_start_batch(call, ops, KILN_ARRAY_LEN(ops), (void *)1, NULL) == GRPC_CALL_OK;
    bool started = grpc_call_start_batch(call, &st_op, 1, (void *)3, NULL) == GRPC_CALL_OK;
    if (!sent || !started) {
        rc = kiln_err_set(err, KILN_EINTERNAL, NULL, "could not start a gRPC call to %s", method);
        grpc_call_cancel(call, NULL);
        if (sent) /* a batch that started still completes */
            rpc_pluck(cq, (void *)1);
        sent = false;
    }
    if (sent && rpc_pluck(cq, (void *)1)) {
        /* one message at a time until the stream ends */
        for (;;) {
            grpc_byte_buffer *bb = NULL;
            grpc_op op;
            memset(&op, 0, sizeof(op));
            op.op = GRPC_OP_RECV_MESSAGE;
            op.data.recv_message.recv_message = &bb;
            if (grpc_call_start_batch(call, &op, 1, (void *)2, NULL) != GRPC_CALL_OK)
                break;
            bool ok = rpc_pluck(cq, (void *)2);
            if (!ok || !bb) {
                if (bb)
                    grpc_byte_buffer_destroy(bb);
                break;
            }
            grpc_byte_buffer_reader reader;
            if (grpc_byte_buffer_reader_init(&reader, bb)) {
                grpc_slice s = grpc_byte_buffer_reader_readall(&reader);
                grpc_byte_buffer_reader_destroy(&reader);
                on_msg(ud, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s));
                grpc_slice_unref(s);
            }
            grpc_byte_buffer_destroy(bb);
        }
    } else if (sent) {
        grpc_call_cancel(call, NULL);
    }
    if (started) {
        rpc_pluck(cq, (void *)3);
        *grpc_code = (int)status;
        if (status != GRPC_STATUS_OK)
            rc = rpc_status_err(status, details, &trail_md, method, err);
    }
    pthread_mutex_lock(&r->watch_mu);
    r->watch = NULL;
    pthread_mutex_unlock(&r->watch_mu);
    grpc_call_unref(call);
    if (error_string)
        gpr_free((void *)error_string);
    grpc_slice_unref(details);
    grpc_byte_buffer_destroy(req_bb);
    grpc_metadata_array_destroy(&init_md);
    grpc_metadata_array_destroy(&trail_md);
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_destroy(cq);
    return rc;
}

int agent_rpc_call(agent_rpc_t *r, const char *method, const agent_md_t *md, size_t n_md,
                    const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc,
                    int timeout_ms, ProtobufCMessage **resp, int *grpc_code, kiln_err_t *err)
{
    *resp = NULL;
    size_t len = protobuf_c_message_get_packed_size(req);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    protobuf_c_message_pack(req, buf);
    uint8_t *out = NULL;
    size_t out_len = 0;
    int rc = agent_rpc_call_raw(r, method, md, n_md, buf, len, timeout_ms, &out, &out_len, grpc_code, err);
    free(buf);
    if (rc != 0)
        return rc;
    *resp = protobuf_c_message_unpack(resp_desc, NULL, out_len, out ? out : (const uint8_t *)"");
    free(out);
    if (!*resp)
        return kiln_err_set(err, KILN_EFORMAT, NULL, "could not decode the reply of %s as %s", method,
                            resp_desc->name);
    return 0;
}
