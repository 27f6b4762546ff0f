/* net.c - what REST and gRPC share at the front door: listen addresses, client address keys and
 * per-address connection counts, the refused-connection counter of GET /metrics, the TLS policy
 * (one list of versions and suites, written for GnuTLS and for OpenSSL), and a reader of the TLS
 * ClientHello. The front ends' own connection handling is in http_conn.c and grpc_gate.c. */
#include <arpa/inet.h>
#include <assert.h>
#include <netdb.h>
#include <netinet/in.h>
#include <linux/tcp.h> /* glibc's tcp_info lacks tcpi_bytes_received */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "api/net_int.h"

int api_net_parse_addr(const char *addr, const char *flag, struct sockaddr_storage *ss, socklen_t *len,
                       kiln_err_t *err)
{
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    if (!colon || !colon[1])
        goto bad;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535)
        goto bad;
    char host[96];
    size_t hl = (size_t)(colon - addr);
    if (hl >= sizeof host)
        goto bad;
    memcpy(host, addr, hl);
    host[hl] = '\0';
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    if (!host[0])
        strcpy(host, "0.0.0.0");
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, host, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)port);
        if (len)
            *len = sizeof *s4;
        return 0;
    }
    if (inet_pton(AF_INET6, host, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)port);
        if (len)
            *len = sizeof *s6;
        return 0;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, NULL, &hints, &ai) == 0 && ai) {
        memcpy(ss, ai->ai_addr, ai->ai_addrlen);
        if (len)
            *len = ai->ai_addrlen;
        if (ss->ss_family == AF_INET)
            s4->sin_port = htons((uint16_t)port);
        else
            s6->sin6_port = htons((uint16_t)port);
        freeaddrinfo(ai);
        return 0;
    }
bad:
    kiln_err_set(err, KILN_EINVAL, flag, "bad listen address \"%s\"", addr ? addr : "");
    kiln_err_hint(err, "use HOST:PORT, for example 127.0.0.1:8080");
    return KILN_EINVAL;
}

api_net_limits_t api_net_limits_or_default(const api_net_limits_t *limits)
{
    api_net_limits_t l = limits ? *limits : (api_net_limits_t){0};
    if (l.per_address == 0)
        l.per_address = API_NET_PER_ADDRESS;
    if (l.handshake_ms <= 0)
        l.handshake_ms = API_NET_HANDSHAKE_MS;
    if (l.header_ms <= 0)
        l.header_ms = API_NET_HEADER_MS;
    if (l.body_ms <= 0)
        l.body_ms = API_NET_BODY_MS;
    if (l.idle_ms <= 0)
        l.idle_ms = API_NET_IDLE_MS;
    return l;
}

int api_net_max_connections(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return 8192;
    long room = ((long)rl.rlim_cur - 512) / 2;
    return (int)KILN_MAX(16, KILN_MIN(8192, room));
}

/* ---- client addresses ------------------------------------------------------------------------ */

void api_addr_key(const struct sockaddr *sa, api_addr_key_t *out)
{
    memset(out, 0, sizeof *out);
    if (sa && sa->sa_family == AF_INET) {
        out->b[10] = out->b[11] = 0xff;
        memcpy(out->b + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    } else if (sa && sa->sa_family == AF_INET6) {
        const uint8_t *a = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
        static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (!memcmp(a, v4mapped, 12))
            memcpy(out->b, a, 16); /* an IPv4 client of a dual-stack socket: the same key as IPv4 */
        else
            memcpy(out->b, a, 8);  /* one IPv6 client is given a /64: count the prefix */
    }
}

const char *api_addr_key_str(const api_addr_key_t *k, char *buf, size_t n)
{
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (!memcmp(k->b, v4mapped, 12)) {
        inet_ntop(AF_INET, k->b + 12, buf, (socklen_t)n);
        return buf;
    }
    char a[INET6_ADDRSTRLEN];
    inet_ntop(AF_INET6, k->b, a, sizeof a);
    snprintf(buf, n, "%s/64", a);
    return buf;
}

struct api_addr_entry {
    api_addr_key_t key;
    int held;
    api_addr_entry_t *next;
};

static size_t addr_hash(const api_addr_key_t *k)
{
    return (size_t)kiln_fnv1a(KILN_FNV1A_START, k->b, sizeof k->b);
}

int api_addr_counts_init(api_addr_counts_t *t)
{
    t->nbuckets = 1024;
    t->naddrs = 0;
    t->buckets = calloc(t->nbuckets, sizeof *t->buckets);
    return t->buckets ? 0 : KILN_ENOMEM;
}

void api_addr_counts_deinit(api_addr_counts_t *t)
{
    for (size_t i = 0; t->buckets && i < t->nbuckets; i++)
        for (api_addr_entry_t *e = t->buckets[i], *next; e; e = next) {
            next = e->next;
            free(e);
        }
    free(t->buckets);
    t->buckets = NULL;
}

static api_addr_entry_t **addr_slot(const api_addr_counts_t *t, const api_addr_key_t *k)
{
    api_addr_entry_t **pp = &t->buckets[addr_hash(k) % t->nbuckets];
    while (*pp && memcmp(&(*pp)->key, k, sizeof *k) != 0)
        pp = &(*pp)->next;
    return pp;
}

int api_addr_held(const api_addr_counts_t *t, const api_addr_key_t *k)
{
    api_addr_entry_t *e = *addr_slot(t, k);
    return e ? e->held : 0;
}

bool api_addr_take(api_addr_counts_t *t, const api_addr_key_t *k, int limit)
{
    api_addr_entry_t **pp = addr_slot(t, k);
    if (!*pp) {
        if (limit == 0)
            return false;
        api_addr_entry_t *e = calloc(1, sizeof *e);
        if (!e)
            return false;
        e->key = *k;
        *pp = e;
        t->naddrs++;
    }
    if (limit >= 0 && (*pp)->held >= limit)
        return false;
    (*pp)->held++;
    return true;
}

void api_addr_give(api_addr_counts_t *t, const api_addr_key_t *k)
{
    api_addr_entry_t **pp = addr_slot(t, k);
    api_addr_entry_t *e = *pp;
    assert(e && e->held > 0);
    if (--e->held == 0) {
        *pp = e->next;
        free(e);
        t->naddrs--;
    }
}

/* ---- refused connections --------------------------------------------------------------------- */

static prom_family_t net_refused = PROM_FAMILY(
    "kiln_connections_refused_total",
    "Connections kilnd refused or cut off before a request was served, by port (rest, grpc) and reason: "
    "per_address_limit and connection_limit at accept, handshake_deadline, header_deadline and "
    "body_deadline for a client too slow to finish, tls_version for a gRPC client offering no TLS version "
    "kilnd accepts.",
    PROM_COUNTER);

const char *api_net_reason_name(api_net_reason_t why)
{
    static const char *const names[API_NET_REASONS] = {"per_address_limit", "connection_limit",
                                                       "handshake_deadline", "header_deadline",
                                                       "body_deadline", "tls_version"};
    return why < API_NET_REASONS ? names[why] : "unknown";
}

void api_net_refused(const char *port, api_net_reason_t why)
{
    char labels[128];
    prom_label(labels, sizeof labels / 2, "port", port);
    size_t l = strlen(labels);
    labels[l++] = ',';
    prom_label(labels + l, sizeof labels - l, "reason", api_net_reason_name(why));
    prom_add(&net_refused, labels, 1);
}

/* ---- the TLS policy -------------------------------------------------------------------------- */

/* TLS 1.2 and 1.3; ECDHE key exchange (no static RSA, no DHE); AES-GCM and ChaCha20-Poly1305
 * (no CBC, so no SHA-1 or SHA-2 MACs either); the server's order of preference. TLS 1.3 suites
 * are all AEAD with ephemeral key exchange. */
#define TLS_SUITES "-KX-ALL:+ECDHE-RSA:+ECDHE-ECDSA:-CIPHER-ALL:+AES-256-GCM:+AES-128-GCM:+CHACHA20-POLY1305:" \
                   "-MAC-ALL:+AEAD:%SERVER_PRECEDENCE"

void api_net_init(void)
{
    prom_register(&net_refused);
}

const char *api_tls_gnutls_priorities(api_tls_min_t min)
{
    if (min == API_TLS_1_3)
        return "NORMAL:-VERS-ALL:+VERS-TLS1.3:" TLS_SUITES;
    return "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2:" TLS_SUITES;
}

const char *api_tls_openssl_ciphers(void)
{
    return "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-AES128-GCM-SHA256:"
           "ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";
}

/* ---- the ClientHello -------------------------------------------------------------------------- */

#define HELLO_MAX 16384          /* a ClientHello longer than one record's worth is not read */

static unsigned get16(const uint8_t *p) { return (unsigned)p[0] << 8 | p[1]; }

int api_tls_client_hello(const uint8_t *p, size_t n, unsigned *max_version)
{
    /* The handshake message may come in several records: gather their payloads. */
    uint8_t msg[HELLO_MAX + 4];
    size_t have = 0, need = 0;
    size_t off = 0;
    for (;;) {
        if (n - off < 5)
            return 0;
        if (p[off] != 22 || p[off + 1] != 3)
            return -1; /* not a TLS handshake record (an SSL 2 hello, plain HTTP, noise) */
        size_t rlen = get16(p + off + 3);
        if (rlen == 0 || rlen > 16384 + 2048)
            return -1;
        if (n - off - 5 < rlen)
            return 0;
        size_t take = KILN_MIN(rlen, sizeof msg - have);
        memcpy(msg + have, p + off + 5, take);
        have += take;
        off += 5 + rlen;
        if (have >= 4 && !need) {
            if (msg[0] != 1)
                return -1; /* the first handshake message is not a ClientHello */
            need = 4 + ((size_t)msg[1] << 16 | (size_t)msg[2] << 8 | msg[3]);
            if (need > sizeof msg)
                return -1;
        }
        if (need && have >= need)
            break;
    }
    const uint8_t *q = msg + 4, *end = msg + need;
    if (end - q < 2 + 32 + 1)
        return -1;
    unsigned best = get16(q);
    q += 2 + 32;
    q += 1 + (size_t)q[0];                                   /* session id */
    if (end - q < 2 || (size_t)(end - q) < 2 + get16(q))
        return -1;
    q += 2 + get16(q);                                       /* cipher suites */
    if (end - q < 1 || (size_t)(end - q) < 1 + (size_t)q[0])
        return -1;
    q += 1 + (size_t)q[0];                                   /* compression methods */
    if (end - q >= 2) {
        const uint8_t *e = q + 2, *eend = e + get16(q);
        if (eend > end)
            return -1;
        while (eend - e >= 4) {
            unsigned type = get16(e), len = get16(e + 2);
            e += 4;
            if ((size_t)(eend - e) < len)
                return -1;
            if (type == 43 && len >= 1 && (size_t)e[0] + 1 <= len) { /* supported_versions */
                best = 0;
                for (unsigned i = 0; i + 1 < e[0]; i += 2) {
                    unsigned v = get16(e + 1 + i);
                    if ((v & 0x0f0f) == 0x0a0a)
                        continue; /* GREASE */
                    if (v > best && v <= 0x0304)
                        best = v;
                }
            }
            e += len;
        }
    }
    *max_version = best;
    return 1;
}

uint64_t api_net_bytes_received(int fd)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
        return 0;
    return ti.tcpi_bytes_received;
}
