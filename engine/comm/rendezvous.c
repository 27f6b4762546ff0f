/* rendezvous.c - how the ranks of a job find each other, and the control connections that stay
 * open afterwards. Rank 0 listens on KILN_MASTER_PORT; every rank connects and says hello (rank,
 * host); rank 0 picks the provider (shm when all ranks share a host, else tcp), every rank opens
 * its fabric endpoint and sends its address, rank 0 answers with the full table. The TCP
 * connections then carry only liveness: a rank that disconnects without saying goodbye is
 * reported by rank 0 to all ("rank 3 (host h) disconnected"), so peers fail fast. */
#include "engine/comm/comm_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define RV_MAGIC 0x4b494c4eu /* "KILN" */

enum { RV_HELLO = 1, RV_PROV = 2, RV_ADDR = 3, RV_TABLE = 4, RV_ERROR = 5 };
enum { CTL_DEAD = 10, CTL_BYE = 11, CTL_ALLBYE = 12 };

struct rv_hello {
    uint32_t magic;
    int32_t rank;
    int32_t world;
    char host[COMM_HOST_MAX];
    char job[64];
    uint64_t shm;       /* which /dev/shm the rank sees (rv_shm_domain) */
};
struct rv_addr {
    uint32_t len;
    uint8_t addr[COMM_ADDR_MAX];
};
struct rv_entry {
    char host[COMM_HOST_MAX];
    uint32_t len;
    uint8_t addr[COMM_ADDR_MAX];
};
struct rv_prov {
    char prov[COMM_PROV_MAX];
    int32_t multi_host; /* ranks span hosts: never bind the fabric to a loopback address */
};
struct rv_error {
    int32_t status;
    char text[COMM_MSG_MAX];
};

/* ---- framing: {u32 type, u32 len} + payload ------------------------------------------------ */

static int rv_send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            poll(&pf, 1, 1000);
            continue;
        }
        if (w <= 0)
            return KILN_EIO;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static int rv_write(int fd, uint32_t type, const void *p, uint32_t len)
{
    uint32_t h[2] = {type, len};
    if (rv_send_all(fd, h, sizeof(h)) != 0)
        return KILN_EIO;
    return len ? rv_send_all(fd, p, len) : 0;
}

static int rv_read_all(int fd, void *p, size_t n, int64_t deadline_us)
{
    char *c = p;
    while (n > 0) {
        int64_t left = (deadline_us - kiln_mono_us()) / 1000;
        if (left <= 0)
            return KILN_ETIMEDOUT;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int pr = poll(&pf, 1, left > 1000 ? 1000 : (int)left);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            continue;
        ssize_t r = recv(fd, c, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return KILN_EIO;
        c += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Reads one message into p (capacity cap). Returns 0, KILN_ETIMEDOUT, KILN_EIO, KILN_EFORMAT. */
static int rv_read(int fd, uint32_t *type, void *p, uint32_t cap, uint32_t *len, int64_t deadline_us)
{
    uint32_t h[2];
    int rc = rv_read_all(fd, h, sizeof(h), deadline_us);
    if (rc != 0)
        return rc;
    if (h[1] > cap)
        return KILN_EFORMAT;
    *type = h[0];
    *len = h[1];
    memset(p, 0, cap);
    return h[1] ? rv_read_all(fd, p, h[1], deadline_us) : 0;
}

static void rv_send_error(int fd, int status, const char *text)
{
    struct rv_error m = {.status = status};
    kiln_strlcpy(m.text, text, sizeof(m.text));
    if (fd >= 0)
        rv_write(fd, RV_ERROR, &m, sizeof(m));
}

static void rv_broadcast_error(comm_engine_t *e, int status, const char *text)
{
    for (int r = 1; r < e->world; r++)
        rv_send_error(e->ctl_fds[r], status, text);
}

static void local_ip(int fd, char *buf, size_t n)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    kiln_strlcpy(buf, "127.0.0.1", n);
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0)
        return;
    if (ss.ss_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, buf, (socklen_t)n);
    else if (ss.ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, buf, (socklen_t)n);
}

/* Which /dev/shm this process sees: ranks of one host in different sandboxes (kiln-agent's boxes,
 * containers) have one each, and the shm provider works only between ranks that share one. */
static uint64_t rv_shm_domain(void)
{
    struct stat st;
    if (stat("/dev/shm", &st) != 0)
        return 0;
    return (uint64_t)st.st_dev * 1000003u + (uint64_t)st.st_ino;
}

static const char *rv_peer_host(const comm_engine_t *e, int r)
{
    return e->hosts && e->hosts[r][0] ? e->hosts[r] : "?";
}

/* ---- rank 0 ------------------------------------------------------------------------------- */

static int rv_missing(comm_engine_t *e, double timeout_s, kiln_err_t *err)
{
    char list[200] = "";
    int missing = 0;
    size_t off = 0;
    for (int r = 1; r < e->world; r++) {
        if (e->ctl_fds[r] >= 0)
            continue;
        if (missing < 16 && off < sizeof(list))
            off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%d", missing ? ", " : "", r);
        missing++;
    }
    kiln_err_set(err, KILN_ETIMEDOUT, NULL,
                 "rendezvous timed out after %g s: %d of %d ranks never arrived (missing: rank%s %s%s)",
                 timeout_s, missing, e->world, missing > 1 ? "s" : "", list, missing > 16 ? ", ..." : "");
    kiln_err_hint(err, "check that every rank was started and can reach rank 0's port; "
                       "KILN_COMM_TIMEOUT_S sets the timeout");
    rv_broadcast_error(e, KILN_ETIMEDOUT, err->message);
    return KILN_ETIMEDOUT;
}

static int rv_master(comm_engine_t *e, const comm_config_t *cfg, const char *myhost, kiln_err_t *err)
{
    int lfd = -1, rc = 0;
    struct rv_entry *table = NULL;
    int64_t deadline = kiln_mono_us() + (int64_t)(e->timeout_s * 1e6);
    char prov[COMM_PROV_MAX], node[64];

    kiln_strlcpy(e->hosts[0], myhost, COMM_HOST_MAX);
    uint64_t *shm = calloc((size_t)e->world, sizeof(*shm));
    if (!shm)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    shm[0] = rv_shm_domain();
    if (e->world > 1) {
        lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int one = 1;
        setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)cfg->master_port)};
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(lfd, e->world + 16) != 0) {
            rc = kiln_err_set(err, KILN_EIO, NULL, "could not listen on rendezvous port %d: %s",
                              cfg->master_port, strerror(errno));
            goto done;
        }
    }
    for (int arrived = 1; arrived < e->world;) {
        int64_t left = (deadline - kiln_mono_us()) / 1000;
        if (left <= 0) {
            rc = rv_missing(e, e->timeout_s, err);
            goto done;
        }
        struct pollfd pf = {.fd = lfd, .events = POLLIN};
        if (poll(&pf, 1, left > 1000 ? 1000 : (int)left) <= 0)
            continue;
        int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (cfd < 0)
            continue;
        struct rv_hello h;
        uint32_t type, len;
        int64_t hd = kiln_mono_us() + 5000000;
        if (rv_read(cfd, &type, &h, sizeof(h), &len, hd < deadline ? hd : deadline) != 0 ||
            type != RV_HELLO || len != sizeof(h) || h.magic != RV_MAGIC) {
            log_warn("comm: ignored a rendezvous connection that did not say hello");
            close(cfd);
            continue;
        }
        char why[COMM_MSG_MAX] = "";
        h.host[COMM_HOST_MAX - 1] = h.job[sizeof(h.job) - 1] = '\0';
        if (h.world != e->world)
            snprintf(why, sizeof(why), "rank %d expects a world of %d ranks, rank 0 has %d", h.rank,
                     h.world, e->world);
        else if (h.rank < 1 || h.rank >= e->world)
            snprintf(why, sizeof(why), "rank %d is out of range for a world of %d", h.rank, e->world);
        else if (e->ctl_fds[h.rank] >= 0)
            snprintf(why, sizeof(why), "rank %d arrived twice", h.rank);
        else if (strcmp(h.job, cfg->job_id ? cfg->job_id : "") != 0)
            snprintf(why, sizeof(why), "rank %d belongs to job \"%s\", not \"%s\"", h.rank, h.job,
                     cfg->job_id ? cfg->job_id : "");
        if (why[0]) {
            log_warn("comm: refused a rank at rendezvous: %s", why);
            rv_send_error(cfd, KILN_EINVAL, why);
            close(cfd);
            continue;
        }
        e->ctl_fds[h.rank] = cfd;
        kiln_strlcpy(e->hosts[h.rank], h.host, COMM_HOST_MAX);
        shm[h.rank] = h.shm;
        arrived++;
    }

    /* Provider: rank 0's override, else shm when every rank is on this host, seeing the same
     * /dev/shm (not so for ranks of one host in different sandboxes). */
    bool one_host = true, one_shm = true;
    int other = 0;
    for (int r = 1; r < e->world; r++) {
        if (strcmp(e->hosts[r], e->hosts[0]) != 0 && one_host) {
            one_host = false;
            other = r;
        }
        if (shm[r] != shm[0] && one_shm && one_host) {
            one_shm = false;
            other = r;
        }
    }
    if (cfg->provider && (strcmp(cfg->provider, "shm") == 0 || strcmp(cfg->provider, "tcp") == 0))
        kiln_strlcpy(prov, cfg->provider, sizeof(prov));
    else
        kiln_strlcpy(prov, one_host && one_shm ? "shm" : "tcp", sizeof(prov));
    if (strcmp(prov, "shm") == 0 && !(one_host && one_shm)) {
        if (!one_host)
            rc = kiln_err_set(err, KILN_EINVAL, NULL, "provider shm needs every rank on one host, but rank %d is on "
                              "\"%s\" and rank 0 on \"%s\"", other, e->hosts[other], e->hosts[0]);
        else
            rc = kiln_err_set(err, KILN_EINVAL, NULL, "provider shm needs every rank to share one /dev/shm, but rank "
                              "%d runs in another sandbox than rank 0 on \"%s\"", other, e->hosts[0]);
        rv_broadcast_error(e, KILN_EINVAL, err->message);
        goto done;
    }
    struct rv_prov pm = {.multi_host = !one_host};
    kiln_strlcpy(pm.prov, prov, sizeof(pm.prov));
    for (int r = 1; r < e->world; r++)
        if (rv_write(e->ctl_fds[r], RV_PROV, &pm, sizeof(pm)) != 0) {
            rc = kiln_err_set(err, KILN_ECOMM, NULL, "rank %d (host %s) disconnected during rendezvous",
                              r, rv_peer_host(e, r));
            rv_broadcast_error(e, KILN_ECOMM, err->message);
            goto done;
        }
    kiln_strlcpy(e->provider, prov, sizeof(e->provider));
    if (e->world > 1)
        /* the interface a rank on another host reached us through, if there is one */
        local_ip(e->ctl_fds[one_host ? 1 : other], node, sizeof(node));
    else
        kiln_strlcpy(node, "127.0.0.1", sizeof(node));
    if ((rc = comm_fabric_open(e, prov, node, err)) != 0) {
        rv_broadcast_error(e, rc, err->message);
        goto done;
    }

    table = calloc((size_t)e->world, sizeof(*table));
    if (!table) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto done;
    }
    kiln_strlcpy(table[0].host, myhost, COMM_HOST_MAX);
    table[0].len = (uint32_t)e->fab.namelen;
    memcpy(table[0].addr, e->fab.name, e->fab.namelen);
    deadline = kiln_mono_us() + (int64_t)(e->timeout_s * 1e6);
    for (int r = 1; r < e->world; r++) {
        union {
            struct rv_addr a;
            struct rv_error x;
        } m;
        uint32_t type, len;
        int rr = rv_read(e->ctl_fds[r], &type, &m, sizeof(m), &len, deadline);
        if (rr == 0 && type == RV_ERROR) {
            m.x.text[sizeof(m.x.text) - 1] = '\0';
            rc = kiln_err_set(err, KILN_ECOMM, NULL, "rank %d (host %s) failed to join: %s", r,
                              rv_peer_host(e, r), m.x.text);
            rv_broadcast_error(e, KILN_ECOMM, err->message);
            goto done;
        }
        if (rr != 0 || type != RV_ADDR || m.a.len > COMM_ADDR_MAX) {
            rc = kiln_err_set(err, KILN_ECOMM, NULL, "rank %d (host %s) disconnected during rendezvous",
                              r, rv_peer_host(e, r));
            rv_broadcast_error(e, KILN_ECOMM, err->message);
            goto done;
        }
        kiln_strlcpy(table[r].host, e->hosts[r], COMM_HOST_MAX);
        table[r].len = m.a.len;
        memcpy(table[r].addr, m.a.addr, m.a.len);
    }
    for (int r = 1; r < e->world; r++)
        rv_write(e->ctl_fds[r], RV_TABLE, table, (uint32_t)(sizeof(*table) * (size_t)e->world));

    uint8_t (*addrs)[COMM_ADDR_MAX] = calloc((size_t)e->world, COMM_ADDR_MAX);
    uint32_t *lens = calloc((size_t)e->world, sizeof(uint32_t));
    if (addrs && lens) {
        for (int r = 0; r < e->world; r++) {
            memcpy(addrs[r], table[r].addr, COMM_ADDR_MAX);
            lens[r] = table[r].len;
        }
        rc = comm_fabric_insert(e, (const uint8_t(*)[COMM_ADDR_MAX])addrs, lens, err);
    } else {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    free(addrs);
    free(lens);
done:
    if (lfd >= 0)
        close(lfd);
    free(table);
    free(shm);
    return rc;
}

/* ---- other ranks ---------------------------------------------------------------------------- */

static int rv_connect(const comm_config_t *cfg, int64_t deadline, char *why, size_t whyn)
{
    char port[16];
    snprintf(port, sizeof(port), "%d", cfg->master_port);
    kiln_strlcpy(why, "no answer", whyn);
    while (kiln_mono_us() < deadline) {
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
        int gr = getaddrinfo(cfg->master_addr, port, &hints, &res);
        if (gr != 0) {
            kiln_strlcpy(why, gai_strerror(gr), whyn);
        } else {
            for (struct addrinfo *a = res; a; a = a->ai_next) {
                int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
                if (fd < 0)
                    continue;
                if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
                    freeaddrinfo(res);
                    return fd;
                }
                kiln_strlcpy(why, strerror(errno), whyn);
                close(fd);
            }
            freeaddrinfo(res);
        }
        usleep(100000);
    }
    return -1;
}

/* Reads rank 0's answer of the expected type, turning RV_ERROR into its status and text. */
static int rv_expect(comm_engine_t *e, const comm_config_t *cfg, int fd, uint32_t want, void *p,
                     uint32_t cap, int64_t deadline, const char *waiting_for, kiln_err_t *err)
{
    uint32_t type, len;
    void *buf = malloc(cap > sizeof(struct rv_error) ? cap : sizeof(struct rv_error));
    if (!buf)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    uint32_t bcap = cap > sizeof(struct rv_error) ? cap : (uint32_t)sizeof(struct rv_error);
    int rc = rv_read(fd, &type, buf, bcap, &len, deadline);
    if (rc == KILN_ETIMEDOUT) {
        rc = kiln_err_set(err, KILN_ETIMEDOUT, NULL, "rendezvous timed out after %g s waiting for %s from rank 0 at %s:%d",
                          e->timeout_s, waiting_for, cfg->master_addr, cfg->master_port);
    } else if (rc != 0) {
        rc = kiln_err_set(err, KILN_ECOMM, NULL, "rank 0 (%s:%d) closed the connection during rendezvous",
                          cfg->master_addr, cfg->master_port);
    } else if (type == RV_ERROR) {
        struct rv_error *x = buf;
        x->text[sizeof(x->text) - 1] = '\0';
        rc = kiln_err_set(err, x->status < 0 ? x->status : KILN_ECOMM, NULL, "%s", x->text);
    } else if (type != want || len != cap) {
        rc = kiln_err_set(err, KILN_EFORMAT, NULL, "unexpected rendezvous message %u from rank 0", type);
    } else {
        memcpy(p, buf, cap);
    }
    free(buf);
    return rc;
}

static int rv_worker(comm_engine_t *e, const comm_config_t *cfg, const char *myhost, kiln_err_t *err)
{
    int rc;
    char why[128], node[64];
    struct rv_prov pm;
    struct rv_entry *table = NULL;
    uint8_t (*addrs)[COMM_ADDR_MAX] = NULL;
    uint32_t *lens = NULL;
    int64_t start = kiln_mono_us();
    int64_t deadline = start + (int64_t)(e->timeout_s * 1e6);

    int fd = rv_connect(cfg, deadline, why, sizeof(why));
    if (fd < 0) {
        rc = kiln_err_set(err, KILN_ETIMEDOUT, NULL,
                          "rendezvous timed out after %g s: could not reach rank 0 at %s:%d (%s)",
                          e->timeout_s, cfg->master_addr, cfg->master_port, why);
        return rc;
    }
    e->ctl_fds[0] = fd;
    struct rv_hello h = {.magic = RV_MAGIC, .rank = e->rank, .world = e->world};
    kiln_strlcpy(h.host, myhost, sizeof(h.host));
    h.shm = rv_shm_domain();
    kiln_strlcpy(h.job, cfg->job_id ? cfg->job_id : "", sizeof(h.job));
    if (rv_write(fd, RV_HELLO, &h, sizeof(h)) != 0)
        return kiln_err_set(err, KILN_ECOMM, NULL, "rank 0 (%s:%d) closed the connection during rendezvous",
                            cfg->master_addr, cfg->master_port);
    /* Rank 0 answers when the last rank arrives or gives up at its own deadline: wait a little
     * longer than that so its explanation reaches us. */
    rc = rv_expect(e, cfg, fd, RV_PROV, &pm, sizeof(pm), deadline + 10000000, "the provider", err);
    if (rc != 0)
        return rc;
    pm.prov[sizeof(pm.prov) - 1] = '\0';
    kiln_strlcpy(e->provider, pm.prov, sizeof(e->provider));
    local_ip(fd, node, sizeof(node));
    /* Reached rank 0 over loopback (it shares our host) while other ranks are remote: let the
     * provider pick the first real interface rather than bind where remote peers cannot reach. */
    bool loopback = strncmp(node, "127.", 4) == 0 || strcmp(node, "::1") == 0;
    if ((rc = comm_fabric_open(e, pm.prov, pm.multi_host && loopback ? NULL : node, err)) != 0) {
        rv_send_error(fd, rc, err->message);
        return rc;
    }
    struct rv_addr a = {.len = (uint32_t)e->fab.namelen};
    memcpy(a.addr, e->fab.name, e->fab.namelen);
    if (rv_write(fd, RV_ADDR, &a, sizeof(a)) != 0)
        return kiln_err_set(err, KILN_ECOMM, NULL, "rank 0 (%s:%d) closed the connection during rendezvous",
                            cfg->master_addr, cfg->master_port);
    uint32_t tlen = (uint32_t)(sizeof(*table) * (size_t)e->world);
    table = malloc(tlen);
    addrs = calloc((size_t)e->world, COMM_ADDR_MAX);
    lens = calloc((size_t)e->world, sizeof(uint32_t));
    if (!table || !addrs || !lens) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto done;
    }
    rc = rv_expect(e, cfg, fd, RV_TABLE, table, tlen, kiln_mono_us() + (int64_t)(e->timeout_s * 1e6) + 10000000,
                   "the address table", err);
    if (rc != 0)
        goto done;
    for (int r = 0; r < e->world; r++) {
        table[r].host[COMM_HOST_MAX - 1] = '\0';
        kiln_strlcpy(e->hosts[r], table[r].host, COMM_HOST_MAX);
        memcpy(addrs[r], table[r].addr, COMM_ADDR_MAX);
        lens[r] = table[r].len;
    }
    rc = comm_fabric_insert(e, (const uint8_t(*)[COMM_ADDR_MAX])addrs, lens, err);
done:
    free(table);
    free(addrs);
    free(lens);
    return rc;
}

int comm_rendezvous(comm_engine_t *e, const comm_config_t *cfg, kiln_err_t *err)
{
    char myhost[COMM_HOST_MAX] = "";
    if (cfg->hostname && cfg->hostname[0])
        kiln_strlcpy(myhost, cfg->hostname, sizeof(myhost));
    else if (gethostname(myhost, sizeof(myhost) - 1) != 0)
        kiln_strlcpy(myhost, "localhost", sizeof(myhost));
    e->nctl = e->rank == 0 ? e->world : 1;
    e->ctl_fds = malloc(sizeof(int) * (size_t)e->nctl);
    e->ctl_buf = calloc((size_t)e->nctl, 8);
    e->ctl_have = calloc((size_t)e->nctl, sizeof(int));
    e->ctl_bye = calloc((size_t)e->world, sizeof(bool));
    if (!e->ctl_fds || !e->ctl_buf || !e->ctl_have || !e->ctl_bye)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    for (int i = 0; i < e->nctl; i++)
        e->ctl_fds[i] = -1;
    int rc = e->rank == 0 ? rv_master(e, cfg, myhost, err) : rv_worker(e, cfg, myhost, err);
    if (rc != 0)
        return rc;
    for (int i = 0; i < e->nctl; i++) {
        int fd = e->ctl_fds[i];
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    }
    return 0;
}

/* ---- control connections after the rendezvous -------------------------------------------- */

static void ctl_send(comm_engine_t *e, int idx, uint32_t type, int32_t rank)
{
    uint32_t f[2] = {type, (uint32_t)rank};
    if (e->ctl_fds[idx] >= 0)
        rv_send_all(e->ctl_fds[idx], f, sizeof(f));
}

static void ctl_check_allbye(comm_engine_t *e)
{
    if (e->rank != 0 || e->allbye || !e->ctl_bye[0])
        return;
    for (int r = 1; r < e->world; r++)
        if (!e->ctl_bye[r])
            return;
    for (int r = 1; r < e->world; r++)
        ctl_send(e, r, CTL_ALLBYE, 0);
    e->allbye = true;
}

static void ctl_disconnected(comm_engine_t *e, int idx)
{
    close(e->ctl_fds[idx]);
    e->ctl_fds[idx] = -1;
    if (e->rank == 0) {
        if (e->ctl_bye[idx])
            return;
        comm_engine_fail(e, "rank %d (host %s) disconnected", idx, rv_peer_host(e, idx));
        for (int r = 1; r < e->world; r++)
            if (r != idx)
                ctl_send(e, r, CTL_DEAD, idx);
    } else if (!e->allbye) {
        comm_engine_fail(e, "rank 0 (host %s) disconnected", rv_peer_host(e, 0));
    }
}

static void ctl_frame(comm_engine_t *e, int idx, uint32_t type, int32_t rank)
{
    if (e->rank == 0 && type == CTL_BYE) {
        e->ctl_bye[idx] = true;
        ctl_check_allbye(e);
    } else if (e->rank != 0 && type == CTL_DEAD && rank >= 0 && rank < e->world) {
        comm_engine_fail(e, "rank %d (host %s) disconnected", rank, rv_peer_host(e, rank));
    } else if (e->rank != 0 && type == CTL_ALLBYE) {
        e->allbye = true;
    }
}

void comm_ctl_poll(comm_engine_t *e)
{
    struct pollfd pf[64];
    for (int base = 0; base < e->nctl; base += 64) {
        unsigned n = (unsigned)(e->nctl - base) < 64u ? (unsigned)(e->nctl - base) : 64u;
        for (unsigned i = 0; i < n; i++)
            pf[i] = (struct pollfd){.fd = e->ctl_fds[base + (int)i], .events = POLLIN};
        if (poll(pf, (nfds_t)n, 0) <= 0)
            continue;
        for (unsigned i = 0; i < n; i++) {
            int idx = base + (int)i;
            if (!pf[i].revents || e->ctl_fds[idx] < 0)
                continue;
            for (;;) {
                ssize_t r = recv(e->ctl_fds[idx], e->ctl_buf[idx] + e->ctl_have[idx],
                                 (size_t)(8 - e->ctl_have[idx]), MSG_DONTWAIT);
                if (r > 0) {
                    e->ctl_have[idx] += (int)r;
                    if (e->ctl_have[idx] == 8) {
                        uint32_t f[2];
                        memcpy(f, e->ctl_buf[idx], 8);
                        e->ctl_have[idx] = 0;
                        ctl_frame(e, idx, f[0], (int32_t)f[1]);
                    }
                    continue;
                }
                if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
                    break;
                ctl_disconnected(e, idx);
                break;
            }
        }
    }
}

void comm_ctl_bye(comm_engine_t *e)
{
    if (e->world == 1) {
        e->allbye = true;
        return;
    }
    if (e->rank == 0) {
        e->ctl_bye[0] = true;
        ctl_check_allbye(e);
    } else {
        ctl_send(e, 0, CTL_BYE, e->rank);
    }
}

void comm_ctl_close(comm_engine_t *e)
{
    for (int i = 0; e->ctl_fds && i < e->nctl; i++)
        if (e->ctl_fds[i] >= 0)
            close(e->ctl_fds[i]);
    free(e->ctl_fds);
    free(e->ctl_buf);
    free(e->ctl_have);
    free(e->ctl_bye);
    e->ctl_fds = NULL;
    e->ctl_buf = NULL;
    e->ctl_have = NULL;
    e->ctl_bye = NULL;
}
