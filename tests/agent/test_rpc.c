/* test_rpc.c - the agent's gRPC client on the wire: per-call metadata, TLS with the server
 * verified against --tls-ca, mutual TLS with a client certificate, plain text only when asked,
 * and settings refused without echoing a file's contents. The peer is a bare gRPC server in this
 * test that records the metadata of each call and answers with a chosen status: it checks the
 * transport, it does not stand in for kilnd's AgentService. Certificates are made with openssl. */
#include "agent/agent.h"

#include <criterion/criterion.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/common/harness.h"

static char tdir[128];

/* ---- the peer --------------------------------------------------------------------------- */

typedef struct peer {
    grpc_server *srv;
    grpc_completion_queue *cq;
    pthread_t th;
    char addr[64];
    pthread_mutex_t mu;
    int calls;
    char auth[600], cred[600];  /* metadata of the last call ("" when absent) */
    int answer;                 /* gRPC status to answer with */
    volatile bool stop;
    bool shut;                  /* the server's shutdown completed (under mu) */
} peer_t;

enum { TAG_CALL = 1, TAG_DONE = 2, TAG_SHUTDOWN = 3 };

static void md_copy(const grpc_metadata_array *md, const char *key, char *out, size_t n)
{
    out[0] = '\0';
    for (size_t i = 0; i < md->count; i++) {
        const grpc_slice k = md->metadata[i].key, v = md->metadata[i].value;
        if (GRPC_SLICE_LENGTH(k) == strlen(key) && !memcmp(GRPC_SLICE_START_PTR(k), key, strlen(key)))
            snprintf(out, n, "%.*s", (int)GRPC_SLICE_LENGTH(v), (const char *)GRPC_SLICE_START_PTR(v));
    }
}

static void *peer_main(void *arg)
{
    peer_t *p = arg;
    grpc_call *call = NULL;
    grpc_call_details details;
    grpc_metadata_array md;
    grpc_call_details_init(&details);
    grpc_metadata_array_init(&md);
    grpc_server_request_call(p->srv, &call, &details, &md, p->cq, p->cq, (void *)TAG_CALL);
    grpc_byte_buffer *req = NULL;
    int cancelled = 0;
    grpc_slice status_details = grpc_slice_from_static_string("answered by the test peer");
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(p->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        if (ev.tag == (void *)TAG_SHUTDOWN) {
            pthread_mutex_lock(&p->mu);
            p->shut = true;
            pthread_mutex_unlock(&p->mu);
        } else if (ev.tag == (void *)TAG_CALL && ev.success) {
            pthread_mutex_lock(&p->mu);
            p->calls++;
            md_copy(&md, "authorization", p->auth, sizeof(p->auth));
            md_copy(&md, "kiln-worker-credential", p->cred, sizeof(p->cred));
            int answer = p->answer;
            pthread_mutex_unlock(&p->mu);
            grpc_op ops[4];
            memset(ops, 0, sizeof(ops));
            ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
            ops[1].op = GRPC_OP_RECV_MESSAGE;
            ops[1].data.recv_message.recv_message = &req;
            ops[2].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
            ops[2].data.send_status_from_server.status = (grpc_status_code)answer;
            ops[2].data.send_status_from_server.status_details = &status_details;
            ops[3].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
            ops[3].data.recv_close_on_server.cancelled = &cancelled;
            grpc_call_start_batch(call, ops, 4, (void *)TAG_DONE, NULL);
        } else if (ev.tag == (void *)TAG_DONE) {
            if (req)
                grpc_byte_buffer_destroy(req);
            req = NULL;
            grpc_call_unref(call);
            call = NULL;
            grpc_call_details_destroy(&details);
            grpc_metadata_array_destroy(&md);
            grpc_call_details_init(&details);
            grpc_metadata_array_init(&md);
            if (!p->stop)
                grpc_server_request_call(p->srv, &call, &details, &md, p->cq, p->cq, (void *)TAG_CALL);
        }
    }
    if (call)
        grpc_call_unref(call);
    grpc_call_details_destroy(&details);
    grpc_metadata_array_destroy(&md);
    return NULL;
}

/* A peer on a free port: plain text when cert is NULL, else TLS with cert/key (files); with
 * client_ca, clients must present a certificate signed by it. */
static peer_t *peer_start(const char *cert, const char *key, const char *client_ca)
{
    peer_t *p = calloc(1, sizeof(*p));
    pthread_mutex_init(&p->mu, NULL);
    grpc_init();
    p->cq = grpc_completion_queue_create_for_next(NULL);
    p->srv = grpc_server_create(NULL, NULL);
    grpc_server_register_completion_queue(p->srv, p->cq, NULL);
    snprintf(p->addr, sizeof(p->addr), "127.0.0.1:%d", th_free_port());
    grpc_server_credentials *creds;
    char *c = NULL, *k = NULL, *ca = NULL;
    if (cert) {
        cr_assert_eq(kiln_file_read(cert, &c, NULL, NULL), 0);
        cr_assert_eq(kiln_file_read(key, &k, NULL, NULL), 0);
        if (client_ca)
            cr_assert_eq(kiln_file_read(client_ca, &ca, NULL, NULL), 0);
        grpc_ssl_pem_key_cert_pair pair = {.private_key = k, .cert_chain = c};
        creds = grpc_ssl_server_credentials_create_ex(
            ca, &pair, 1, ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            NULL);
    } else {
        creds = grpc_insecure_server_credentials_create();
    }
    cr_assert_gt(grpc_server_add_http2_port(p->srv, p->addr, creds), 0, "could not listen on %s", p->addr);
    grpc_server_credentials_release(creds);
    free(c);
    free(k);
    free(ca);
    grpc_server_start(p->srv);
    cr_assert_eq(pthread_create(&p->th, NULL, peer_main, p), 0);
    return p;
}

static void peer_stop(peer_t *p)
{
    p->stop = true;
    grpc_server_shutdown_and_notify(p->srv, p->cq, (void *)TAG_SHUTDOWN);
    grpc_server_cancel_all_calls(p->srv);
    /* the peer thread takes the shutdown tag among its events */
    for (int i = 0; i < 500; i++) {
        pthread_mutex_lock(&p->mu);
        bool shut = p->shut;
        pthread_mutex_unlock(&p->mu);
        if (shut)
            break;
        usleep(10000);
    }
    grpc_server_destroy(p->srv);
    grpc_completion_queue_shutdown(p->cq);
    pthread_join(p->th, NULL);
    grpc_completion_queue_destroy(p->cq);
    grpc_shutdown();
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* ---- a slow link -------------------------------------------------------------------------
 * A TCP relay in front of a peer that holds whatever arrives LINK_DELAY_MS before passing it on,
 * either way: a kilnd that far away. A connection takes a few such trips to come up (TCP, then
 * HTTP/2's settings each way; TLS adds more). */
#define LINK_DELAY_MS 150

typedef struct link {
    int lfd, to_port;
    char addr[64];                   /* where clients connect */
    pthread_t th;
    atomic_bool stop;
    atomic_int live;                 /* relays still running */
} link_t;

typedef struct link_conn {
    link_t *k;
    int a, b;                        /* the client's socket, and the one to the peer */
} link_conn_t;

static bool write_all(int fd, const char *p, ssize_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, (size_t)n, MSG_NOSIGNAL);
        if (w <= 0)
            return false;
        p += w;
        n -= w;
    }
    return true;
}

static void *link_conn_main(void *arg)
{
    link_conn_t *c = arg;
    char buf[65536];
    for (bool open = true; open && !atomic_load(&c->k->stop);) {
        struct pollfd p[2] = {{.fd = c->a, .events = POLLIN}, {.fd = c->b, .events = POLLIN}};
        if (poll(p, 2, 50) <= 0)
            continue;
        for (int i = 0; i < 2 && open; i++) {
            if (!p[i].revents)
                continue;
            ssize_t n = recv(p[i].fd, buf, sizeof buf, 0);
            usleep(LINK_DELAY_MS * 1000);
            open = n > 0 && write_all(i ? c->a : c->b, buf, n);
        }
    }
    close(c->a);
    close(c->b);
    atomic_fetch_sub(&c->k->live, 1);
    free(c);
    return NULL;
}

static void *link_main(void *arg)
{
    link_t *k = arg;
    while (!atomic_load(&k->stop)) {
        struct pollfd p = {.fd = k->lfd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0)
            continue;
        int a = accept(k->lfd, NULL, NULL);
        if (a < 0)
            continue;
        link_conn_t *c = calloc(1, sizeof *c);
        c->k = k;
        c->a = a;
        c->b = th_tcp_connect(NULL, k->to_port, false);
        pthread_t th;
        atomic_fetch_add(&k->live, 1);
        if (c->b < 0 || pthread_create(&th, NULL, link_conn_main, c) != 0) {
            atomic_fetch_sub(&k->live, 1);
            close(a);
            if (c->b >= 0)
                close(c->b);
            free(c);
            continue;
        }
        pthread_detach(th);
    }
    return NULL;
}

static link_t *link_start(const char *to_addr)
{
    link_t *k = calloc(1, sizeof *k);
    k->to_port = atoi(strrchr(to_addr, ':') + 1);
    int port = th_free_port();
    cr_assert_gt(port, 0);
    snprintf(k->addr, sizeof k->addr, "127.0.0.1:%d", port);
    k->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(k->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert(k->lfd >= 0 && bind(k->lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(k->lfd, 16) == 0,
              "could not listen on %s", k->addr);
    cr_assert_eq(pthread_create(&k->th, NULL, link_main, k), 0);
    return k;
}

/* Stops accepting and waits for the relays of open connections, which end at their next poll. */
static void link_stop(link_t *k)
{
    atomic_store(&k->stop, true);
    pthread_join(k->th, NULL);
    close(k->lfd);
    for (int64_t end = kiln_mono_us() + 10000000; atomic_load(&k->live) > 0 && kiln_mono_us() < end;)
        usleep(10000);
    cr_assert_eq(atomic_load(&k->live), 0, "the link's relays did not end");
    free(k);
}

/* ---- certificates ----------------------------------------------------------------------- */

static void make_cert(const char *name, const char *cn)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "openssl req -x509 -newkey rsa:2048 -nodes -keyout %s/%s.key -out %s/%s.pem -days 1 -subj /CN=%s "
             "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 >/dev/null 2>&1",
             tdir, name, tdir, name, cn);
    cr_assert_eq(system(cmd), 0, "openssl failed: %s", cmd);
}

static const char *f(const char *name)
{
    static char buf[8][256];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", tdir, name);
    return buf[k];
}

static void setup(void)
{
    snprintf(tdir, sizeof(tdir), "/tmp/kiln-rpc.XXXXXX");
    cr_assert_not_null(mkdtemp(tdir));
    make_cert("server", "localhost");
    make_cert("other", "localhost");  /* a CA that did not sign the server */
    make_cert("client", "kiln-agent");
}

static void teardown(void)
{
    cr_assert(th_rm_tree(tdir), "could not remove %s", tdir);
}

TestSuite(rpc, .init = setup, .fini = teardown, .timeout = 60);

/* One call; returns the gRPC status code (-1: the call did not complete). */
static kiln_err_t call_err; /* what the last call() said */

static int call(agent_rpc_t *r, const agent_md_t *md, size_t n)
{
    uint8_t *out = NULL;
    size_t len = 0;
    int code = -1;
    kiln_err_clear(&call_err);
    agent_rpc_call_raw(r, "/kiln.AgentService/Heartbeat", md, n, "", 0, 3000, &out, &len, &code, &call_err);
    free(out);
    return code;
}

/* A call that should go through: a connection that did not come up (UNAVAILABLE, which the agent
 * retries) is tried again, for up to 20 s. The first call through a slow link must not need
 * this (a_connection_slower_than_100_ms_to_come_up_gets_the_first_call_through). */
static int call_ok(agent_rpc_t *r, const agent_md_t *md, size_t n)
{
    int64_t deadline = kiln_mono_us() + 20 * 1000000;
    int code;
    while ((code = call(r, md, n)) == 14 && kiln_mono_us() < deadline)
        usleep(50000);
    return code;
}

static agent_rpc_t *client(const char *addr, agent_tls_t tls)
{
    agent_rpc_t *r = NULL;
    kiln_err_t err;
    cr_assert_eq(agent_rpc_create(addr, &tls, &r, &err), 0, "%s", err.message);
    return r;
}

Test(rpc, metadata_travels_with_each_call)
{
    peer_t *p = peer_start(NULL, NULL, NULL);
    agent_rpc_t *r = client(p->addr, (agent_tls_t){.insecure = true});
    agent_md_t md[] = {{"authorization", "Bearer join-abc"}, {"kiln-worker-credential", "cred-xyz"}};
    cr_assert_eq(call_ok(r, md, 2), 0, "%s", call_err.message);
    pthread_mutex_lock(&p->mu);
    cr_assert_str_eq(p->auth, "Bearer join-abc");
    cr_assert_str_eq(p->cred, "cred-xyz");
    pthread_mutex_unlock(&p->mu);
    cr_assert_eq(call_ok(r, NULL, 0), 0, "%s", call_err.message);
    pthread_mutex_lock(&p->mu);
    cr_assert_str_eq(p->auth, "", "metadata is per call");
    p->answer = 16;
    pthread_mutex_unlock(&p->mu);
    uint8_t *out = NULL;
    size_t len = 0;
    int code = 0;
    kiln_err_t err;
    cr_assert_eq(agent_rpc_call_raw(r, "/kiln.AgentService/Heartbeat", md, 1, "", 0, 3000, &out, &len, &code, &err),
                 KILN_EUNAUTH);
    cr_assert_eq(code, 16, "UNAUTHENTICATED comes back as such");
    cr_assert_not(kiln_grpc_retryable(16));
    agent_rpc_destroy(r);
    peer_stop(p);
}

Test(rpc, tls_verifies_the_server_against_the_given_ca)
{
    peer_t *p = peer_start(f("server.pem"), f("server.key"), NULL);
    agent_rpc_t *ok = client(p->addr, (agent_tls_t){.ca_file = f("server.pem")});
    agent_md_t md[] = {{"authorization", "Bearer over-tls"}};
    cr_assert_eq(call_ok(ok, md, 1), 0, "TLS with the right CA: %s", call_err.message);
    pthread_mutex_lock(&p->mu);
    cr_assert_str_eq(p->auth, "Bearer over-tls");
    int calls = p->calls;
    pthread_mutex_unlock(&p->mu);
    agent_rpc_t *wrong = client(p->addr, (agent_tls_t){.ca_file = f("other.pem")});
    cr_assert_eq(call(wrong, md, 1), 14, "a server the CA did not sign is refused");
    agent_rpc_t *sys = client(p->addr, (agent_tls_t){0});
    cr_assert_eq(call(sys, md, 1), 14, "the system's roots do not vouch for a self-signed server");
    agent_rpc_t *plain = client(p->addr, (agent_tls_t){.insecure = true});
    cr_assert_neq(call(plain, md, 1), 0, "plain text to a TLS server fails");
    pthread_mutex_lock(&p->mu);
    cr_assert_eq(p->calls, calls, "no refused client got a call through");
    pthread_mutex_unlock(&p->mu);
    agent_rpc_destroy(ok);
    agent_rpc_destroy(wrong);
    agent_rpc_destroy(sys);
    agent_rpc_destroy(plain);
    peer_stop(p);

    /* and TLS to a plain-text server does not fall back to plain text */
    p = peer_start(NULL, NULL, NULL);
    agent_rpc_t *tls = client(p->addr, (agent_tls_t){.ca_file = f("server.pem")});
    cr_assert_neq(call(tls, md, 1), 0);
    pthread_mutex_lock(&p->mu);
    cr_assert_eq(p->calls, 0);
    pthread_mutex_unlock(&p->mu);
    agent_rpc_destroy(tls);
    peer_stop(p);
}

Test(rpc, mutual_tls_presents_the_client_certificate)
{
    peer_t *p = peer_start(f("server.pem"), f("server.key"), f("client.pem"));
    agent_rpc_t *anon = client(p->addr, (agent_tls_t){.ca_file = f("server.pem")});
    cr_assert_neq(call(anon, NULL, 0), 0, "without a client certificate the server refuses");
    agent_rpc_t *other = client(p->addr, (agent_tls_t){.ca_file = f("server.pem"), .cert_file = f("other.pem"),
                                                       .key_file = f("other.key")});
    cr_assert_neq(call(other, NULL, 0), 0, "a certificate the server's CA did not sign is refused");
    agent_rpc_t *mtls = client(p->addr, (agent_tls_t){.ca_file = f("server.pem"), .cert_file = f("client.pem"),
                                                      .key_file = f("client.key")});
    int code = call_ok(mtls, NULL, 0);
    cr_assert_eq(code, 0, "gRPC status %d: %s", code, call_err.message);
    pthread_mutex_lock(&p->mu);
    cr_assert_eq(p->calls, 1);
    pthread_mutex_unlock(&p->mu);
    agent_rpc_destroy(anon);
    agent_rpc_destroy(other);
    agent_rpc_destroy(mtls);
    peer_stop(p);
}

/* A kilnd 150 ms away: its connection takes longer than 100 ms to come up, and the agent's
 * first call waits for it. (The gRPC core took the 100 ms the agent set as its least reconnect
 * back-off for the time a connection attempt is given: each attempt was cut off before the
 * server's HTTP/2 settings came back, and the calls made meanwhile failed UNAVAILABLE at once.) */
Test(rpc, a_connection_slower_than_100_ms_to_come_up_gets_the_first_call_through)
{
    peer_t *p = peer_start(NULL, NULL, NULL);
    link_t *k = link_start(p->addr);
    agent_rpc_t *r = client(k->addr, (agent_tls_t){.insecure = true});
    int64_t t0 = kiln_mono_us();
    uint8_t *out = NULL;
    size_t len = 0;
    int code = -1;
    kiln_err_t err;
    agent_rpc_call_raw(r, "/kiln.AgentService/Heartbeat", NULL, 0, "", 0, 30000, &out, &len, &code, &err);
    free(out);
    cr_assert_eq(code, 0, "the first call through a link %d ms long failed (%d): %s", LINK_DELAY_MS, code, err.message);
    cr_log_info("the first call through a %d ms link took %lld ms", LINK_DELAY_MS,
                (long long)((kiln_mono_us() - t0) / 1000));
    agent_rpc_destroy(r);
    link_stop(k);
    peer_stop(p);
}

Test(rpc, bad_tls_settings_are_refused_without_echoing_files)
{
    agent_rpc_t *r = NULL;
    kiln_err_t err;
    agent_tls_t both = {.insecure = true, .ca_file = f("server.pem")};
    cr_assert_eq(agent_rpc_create("127.0.0.1:1", &both, &r, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "--insecure"), "%s", err.message);
    agent_tls_t half = {.cert_file = f("client.pem")};
    cr_assert_eq(agent_rpc_create("127.0.0.1:1", &half, &r, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "--tls-key"), "%s", err.message);
    agent_tls_t missing = {.ca_file = f("no-such-ca.pem")};
    cr_assert_eq(agent_rpc_create("127.0.0.1:1", &missing, &r, &err), KILN_ENOTFOUND);
    cr_assert(strstr(err.message, "--tls-ca") && strstr(err.message, "no-such-ca.pem"), "%s", err.message);
    FILE *fp = fopen(f("junk.key"), "w");
    fputs("supersecretkeymaterial-not-pem\n", fp);
    fclose(fp);
    agent_tls_t junk = {.cert_file = f("client.pem"), .key_file = f("junk.key")};
    cr_assert_eq(agent_rpc_create("127.0.0.1:1", &junk, &r, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "--tls-key") && strstr(err.message, "no PEM"), "%s", err.message);
    cr_assert_null(strstr(err.message, "supersecret"));
    cr_assert_null(r);
}
