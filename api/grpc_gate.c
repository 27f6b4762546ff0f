/* grpc_gate.c - the gRPC port's listening socket, which kilnd owns rather than the gRPC core
 * (which has no limit per client address, and stops accepting for good when accept(2) fails with
 * EMFILE). One thread accepts; counts connections per client address and in all, refusing those
 * over a limit at once; waits, up to the handshake deadline, for the client's first flight (a
 * whole TLS ClientHello, whose versions it checks against --tls-min-version; in plain text any
 * byte); then hands the socket, those bytes still unread, to the gRPC core through its
 * external-connection listener, which does the TLS handshake and HTTP/2 exactly as for a socket
 * it accepted itself. Bytes never pass through kilnd. Not the calls themselves (grpc_server.c). */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api/grpc_int.h"
#include "api/net_int.h"

#define GATE_TICK_MS 100
#define GATE_SWEEP_US 1000000        /* handed-over connections are checked for their end each second */
#define GATE_ACCEPT_BURST 256
#define GATE_PEEK 18432              /* room for a ClientHello in one record and its header */

typedef enum { SLOT_FREE = 0, SLOT_PENDING, SLOT_LIVE } slot_state_t;

/* What the gate knows of a socket, by its number: one waiting for its first flight (the gate's
 * own) or one handed to gRPC (then identified by its socket cookie, since gRPC closes it without
 * telling, and the number may come back as another socket). */
typedef struct gate_slot {
    uint8_t state;
    api_addr_key_t key;
    uint64_t cookie;                 /* SLOT_LIVE */
    int64_t deadline_us;             /* SLOT_PENDING: the first flight is due */
} gate_slot_t;

struct grpc_gate {
    int lfd, epfd, wakefd;
    pthread_t thread;
    bool started;
    void *handler;                   /* the gRPC core's grpc_core::TcpServerFdHandler */
    api_net_limits_t limits;
    int max_connections;
    bool tls;
    api_tls_min_t min_version;
    /* the gate thread's alone from start to stop */
    api_addr_counts_t addrs;
    int held, pending;
    gate_slot_t *slots;
    int nslots;
    int64_t next_sweep_us, resume_accept_us, full_recheck_us;
    bool accept_paused;
    int64_t emfile_logged_us;
    struct {
        api_addr_key_t key;
        int64_t at_us;
    } recheck[16];                   /* when an address at its limit was last checked for ended sockets */
    uint8_t peek[GATE_PEEK];
};

/* ---- the gRPC core's external-connection handler ------------------------------------------------
 * "external:NAME" ports of the gRPC core (the listener gRPC's C++ API exposes as
 * ExternalConnectionAcceptor) fill the server argument NAME with a grpc_core::TcpServerFdHandler*,
 * an object whose one method, Handle(listener_fd, fd, pending_read), takes a connected socket as
 * if the core had accepted it. Its class (src/core/lib/iomgr/tcp_server.h, unchanged from gRPC
 * 1.2x to today) has a virtual destructor and then Handle, so under the Itanium C++ ABI its
 * virtual table holds the two destructor entries and then Handle: entry 2. */
typedef void (*gate_handle_fn)(void *self, int listener_fd, int fd, void *pending_read);

static void gate_hand_over(grpc_gate_t *g, int fd)
{
    void **vtable = *(void ***)g->handler;
    gate_handle_fn handle = (gate_handle_fn)vtable[2];
    handle(g->handler, g->lfd, fd, NULL);
}

/* ---- slots and counts ---------------------------------------------------------------------------- */

static uint64_t sock_cookie(int fd)
{
    uint64_t c = 0;
    socklen_t len = sizeof c;
    if (getsockopt(fd, SOL_SOCKET, SO_COOKIE, &c, &len) != 0)
        return 0;
    return c;
}

static gate_slot_t *gate_slot(grpc_gate_t *g, int fd)
{
    if (fd >= g->nslots) {
        int n = KILN_MAX(fd + 1, KILN_MAX(1024, g->nslots * 2));
        gate_slot_t *ns = realloc(g->slots, (size_t)n * sizeof *ns);
        if (!ns)
            return NULL;
        memset(ns + g->nslots, 0, (size_t)(n - g->nslots) * sizeof *ns);
        g->slots = ns;
        g->nslots = n;
    }
    return &g->slots[fd];
}

static void gate_release(grpc_gate_t *g, gate_slot_t *s)
{
    if (s->state == SLOT_PENDING)
        g->pending--;
    api_addr_give(&g->addrs, &s->key);
    g->held--;
    s->state = SLOT_FREE;
}

/* A socket handed to gRPC is still that connection while its number names a socket with the
 * same cookie; otherwise gRPC has closed it. */
static bool gate_live(int fd, const gate_slot_t *s)
{
    uint64_t c = sock_cookie(fd);
    return c != 0 && c == s->cookie;
}

/* Forgets the ended connections of key (all keys when key is NULL). */
static void gate_sweep(grpc_gate_t *g, const api_addr_key_t *key)
{
    for (int fd = 0; fd < g->nslots; fd++) {
        gate_slot_t *s = &g->slots[fd];
        if (s->state == SLOT_LIVE && (!key || !memcmp(&s->key, key, sizeof *key)) && !gate_live(fd, s))
            gate_release(g, s);
    }
}

/* An address at its limit may have closed some connections since the last sweep: look, at
 * most every 50 ms per address (a flood from it is refused meanwhile without the scan). */
static void gate_recheck(grpc_gate_t *g, const api_addr_key_t *key, int64_t now)
{
    int oldest = 0;
    for (int i = 0; i < (int)KILN_ARRAY_LEN(g->recheck); i++) {
        if (!memcmp(&g->recheck[i].key, key, sizeof *key)) {
            if (now - g->recheck[i].at_us < 50000)
                return;
            oldest = i;
            break;
        }
        if (g->recheck[i].at_us < g->recheck[oldest].at_us)
            oldest = i;
    }
    g->recheck[oldest].key = *key;
    g->recheck[oldest].at_us = now;
    gate_sweep(g, key);
}

/* Closes a socket the gate refuses, with a reset (no TIME_WAIT is kept for a flood). */
static void gate_refuse(int fd, api_net_reason_t why)
{
    api_net_refused("grpc", why); /* before the client can see the reset: it then reads it in /metrics */
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
}

/* ---- the thread ------------------------------------------------------------------------------------ */

static void gate_accept(grpc_gate_t *g)
{
    for (int i = 0; i < GATE_ACCEPT_BURST; i++) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        int fd = accept4(g->lfd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* Out of descriptors: stop accepting for a tick instead of spinning on a
                 * listening socket that stays readable. */
                int64_t now = kiln_mono_us();
                if (now - g->emfile_logged_us > 10000000) {
                    log_warn("grpc: cannot accept connections: %s (raise the file descriptor limit)",
                             strerror(errno));
                    g->emfile_logged_us = now;
                }
                epoll_ctl(g->epfd, EPOLL_CTL_DEL, g->lfd, NULL);
                g->accept_paused = true;
                g->resume_accept_us = now + GATE_TICK_MS * 1000;
            }
            return; /* EAGAIN, or paused */
        }
        api_addr_key_t key;
        api_addr_key((struct sockaddr *)&ss, &key);
        gate_slot_t *s = gate_slot(g, fd);
        if (!s) {
            close(fd);
            continue;
        }
        if (s->state == SLOT_LIVE)
            gate_release(g, s); /* the number came back: gRPC closed that connection */
        if (g->held >= g->max_connections) {
            int64_t now = kiln_mono_us();
            if (now - g->full_recheck_us >= 100000) { /* a flood at the total is refused without the scan */
                g->full_recheck_us = now;
                gate_sweep(g, NULL);
            }
            if (g->held >= g->max_connections) {
                gate_refuse(fd, API_NET_CONNECTION_LIMIT);
                continue;
            }
        }
        if (g->limits.per_address >= 0 && api_addr_held(&g->addrs, &key) >= g->limits.per_address) {
            gate_recheck(g, &key, kiln_mono_us());
            if (api_addr_held(&g->addrs, &key) >= g->limits.per_address) {
                gate_refuse(fd, API_NET_PER_ADDRESS_LIMIT);
                continue;
            }
        }
        if (!api_addr_take(&g->addrs, &key, -1)) {
            gate_refuse(fd, API_NET_CONNECTION_LIMIT);
            continue;
        }
        g->held++;
        g->pending++;
        s->state = SLOT_PENDING;
        s->key = key;
        s->deadline_us = kiln_mono_us() + (int64_t)g->limits.handshake_ms * 1000;
        /* Edge-triggered: bytes left unread (peeked) do not wake the thread again, new ones do. */
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.fd = fd};
        if (epoll_ctl(g->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            gate_release(g, s);
            close(fd);
        }
    }
}

/* A waiting socket has bytes (or its end): hand it over once its first flight is whole. */
static void gate_first_flight(grpc_gate_t *g, int fd)
{
    gate_slot_t *s = &g->slots[fd];
    if (s->state != SLOT_PENDING)
        return;
    ssize_t n = recv(fd, g->peek, sizeof g->peek, MSG_PEEK);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0) {
        gate_release(g, s); /* the client went away (or reset) before its first flight */
        epoll_ctl(g->epfd, EPOLL_CTL_DEL, fd, NULL);
        close(fd);
        return;
    }
    if (g->tls) {
        unsigned version = 0;
        int hello = api_tls_client_hello(g->peek, (size_t)n, &version);
        if (hello == 0 && (size_t)n < sizeof g->peek)
            return; /* more to come */
        if (g->min_version == API_TLS_1_3 && (hello != 1 || version < 0x0304)) {
            /* TLS 1.3 only: refuse with the protocol_version alert, after taking the hello in
             * (unread bytes would turn the close into a reset the alert may not survive). */
            static const uint8_t alert[] = {21, 3, 3, 0, 2, 2, 70};
            ssize_t r = recv(fd, g->peek, (size_t)n, 0);
            (void)r;
            api_net_refused("grpc", API_NET_TLS_VERSION); /* counted before the client sees the alert */
            ssize_t w = send(fd, alert, sizeof alert, MSG_NOSIGNAL);
            (void)w;
            shutdown(fd, SHUT_WR);
            gate_release(g, s);
            epoll_ctl(g->epfd, EPOLL_CTL_DEL, fd, NULL);
            close(fd);
            return;
        }
        /* whatever else it is, gRPC's TLS handshake answers it as before */
    }
    epoll_ctl(g->epfd, EPOLL_CTL_DEL, fd, NULL);
    g->pending--;
    s->state = SLOT_LIVE;
    s->cookie = sock_cookie(fd); /* before gRPC may close it and the number be reused */
    gate_hand_over(g, fd);
}

static void gate_deadlines(grpc_gate_t *g, int64_t now)
{
    for (int fd = 0; g->pending > 0 && fd < g->nslots; fd++) {
        gate_slot_t *s = &g->slots[fd];
        if (s->state == SLOT_PENDING && now > s->deadline_us) {
            gate_release(g, s);
            epoll_ctl(g->epfd, EPOLL_CTL_DEL, fd, NULL);
            gate_refuse(fd, API_NET_HANDSHAKE_DEADLINE);
        }
    }
}

static void *gate_main(void *arg)
{
    grpc_gate_t *g = arg;
    struct epoll_event evs[64];
    for (;;) {
        int n = epoll_wait(g->epfd, evs, (int)KILN_ARRAY_LEN(evs), GATE_TICK_MS);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == g->wakefd)
                return NULL;
            if (fd == g->lfd)
                gate_accept(g);
            else
                gate_first_flight(g, fd);
        }
        int64_t now = kiln_mono_us();
        if (g->accept_paused && now >= g->resume_accept_us) {
            struct epoll_event ev = {.events = EPOLLIN, .data.fd = g->lfd};
            if (epoll_ctl(g->epfd, EPOLL_CTL_ADD, g->lfd, &ev) == 0)
                g->accept_paused = false;
        }
        if (g->pending > 0)
            gate_deadlines(g, now);
        if (now >= g->next_sweep_us) {
            gate_sweep(g, NULL);
            g->next_sweep_us = now + GATE_SWEEP_US;
        }
    }
}

/* ---- lifecycle ---------------------------------------------------------------------------------- */

int grpc_gate_open(const char *addr, const api_net_limits_t *limits, const api_tls_t *tls, grpc_gate_t **out,
                   kiln_err_t *err)
{
    *out = NULL;
    struct sockaddr_storage ss;
    socklen_t len = 0;
    int rc = api_net_parse_addr(addr, "grpc-addr", &ss, &len, err);
    if (rc)
        return KILN_EIO;
    grpc_gate_t *g = calloc(1, sizeof *g);
    if (!g)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    g->lfd = g->epfd = g->wakefd = -1;
    g->limits = *limits;
    g->max_connections = api_net_max_connections();
    if (g->limits.per_address > g->max_connections / 8)
        g->limits.per_address = KILN_MAX(1, g->max_connections / 8);
    g->tls = tls && tls->cert_pem && tls->key_pem;
    g->min_version = tls ? tls->min_version : API_TLS_1_2;
    if (api_addr_counts_init(&g->addrs) != 0) {
        free(g);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    g->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (g->lfd >= 0) {
        setsockopt(g->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        /* accepted sockets inherit it; gRPC sets it on the sockets it accepts itself */
        setsockopt(g->lfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    if (g->lfd < 0 || bind(g->lfd, (struct sockaddr *)&ss, len) != 0 || listen(g->lfd, 1024) != 0) {
        kiln_err_set(err, KILN_EIO, "grpc-addr", "could not listen for gRPC on %s: %s", addr, strerror(errno));
        kiln_err_hint(err, "is the address valid and the port free? (--grpc-addr)");
        grpc_gate_close(g);
        return KILN_EIO;
    }
    *out = g;
    return 0;
}

int grpc_gate_start(grpc_gate_t *g, void *fd_handler, kiln_err_t *err)
{
    g->handler = fd_handler;
    g->epfd = epoll_create1(EPOLL_CLOEXEC);
    g->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct epoll_event le = {.events = EPOLLIN, .data.fd = g->lfd};
    struct epoll_event we = {.events = EPOLLIN, .data.fd = g->wakefd};
    if (g->epfd < 0 || g->wakefd < 0 || epoll_ctl(g->epfd, EPOLL_CTL_ADD, g->lfd, &le) != 0 ||
        epoll_ctl(g->epfd, EPOLL_CTL_ADD, g->wakefd, &we) != 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not set up the gRPC listener: %s", strerror(errno));
    g->next_sweep_us = kiln_mono_us() + GATE_SWEEP_US;
    if (pthread_create(&g->thread, NULL, gate_main, g) != 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not start the gRPC listener thread");
    g->started = true;
    return 0;
}

void grpc_gate_close(grpc_gate_t *g)
{
    if (!g)
        return;
    if (g->started) {
        uint64_t one = 1;
        ssize_t w = write(g->wakefd, &one, sizeof one);
        (void)w;
        pthread_join(g->thread, NULL);
    }
    /* sockets still waiting are the gate's; those handed over are gRPC's */
    for (int fd = 0; fd < g->nslots; fd++)
        if (g->slots[fd].state == SLOT_PENDING)
            close(fd);
    if (g->lfd >= 0)
        close(g->lfd);
    if (g->epfd >= 0)
        close(g->epfd);
    if (g->wakefd >= 0)
        close(g->wakefd);
    api_addr_counts_deinit(&g->addrs);
    free(g->slots);
    free(g);
}
