/* net_int.h - the front door both front ends share (net.c): listen addresses, client address
 * keys and per-address connection counts, the count of refused connections for GET /metrics,
 * the TLS policy's strings, and the reading of a TLS ClientHello. No HTTP or gRPC in it.
 * Nothing outside api/ includes this header. */
#ifndef KILN_API_NET_INT_H
#define KILN_API_NET_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "api/api.h"

/* Parses "host:port", "[v6]:port" or ":port" (all addresses) into ss (OUT) and its length (OUT,
 * may be NULL). flag names the setting in the error ("http-addr"). Returns 0 or KILN_EINVAL. */
int api_net_parse_addr(const char *addr, const char *flag, struct sockaddr_storage *ss, socklen_t *len,
                       kiln_err_t *err);

/* limits with every zero field replaced by its default (API_NET_*). */
api_net_limits_t api_net_limits_or_default(const api_net_limits_t *limits);

/* How many connections one front end may hold in all: 8,192, or fewer when the process's
 * RLIMIT_NOFILE does not leave room for both front ends (half of it each, less a reserve for the
 * database, logs and pipes). */
int api_net_max_connections(void);

/* A client address as the per-address limit counts it: an IPv4 address (also when it arrives as
 * ::ffff:a.b.c.d) or the /64 prefix of an IPv6 address. */
typedef struct api_addr_key {
    uint8_t b[16];
} api_addr_key_t;
void api_addr_key(const struct sockaddr *sa, api_addr_key_t *out);
/* The key as text ("127.0.0.2", "2001:db8:1:2::/64") into buf (>= 64 bytes). */
const char *api_addr_key_str(const api_addr_key_t *k, char *buf, size_t n);

/* Connections held per client address (a hash table; an address leaves it at zero). Not locked:
 * the front end that owns it holds its own lock around every call. */
typedef struct api_addr_entry api_addr_entry_t;
typedef struct api_addr_counts {
    api_addr_entry_t **buckets;
    size_t nbuckets;
    size_t naddrs;
} api_addr_counts_t;
int api_addr_counts_init(api_addr_counts_t *t);       /* 0 or KILN_ENOMEM */
void api_addr_counts_deinit(api_addr_counts_t *t);
/* The connections k holds now. */
int api_addr_held(const api_addr_counts_t *t, const api_addr_key_t *k);
/* Counts one more connection of k: true, or false (nothing counted) when k already holds limit
 * (limit < 0: no limit) or memory ran out. */
bool api_addr_take(api_addr_counts_t *t, const api_addr_key_t *k, int limit);
/* Counts one connection of k less (it must hold one). */
void api_addr_give(api_addr_counts_t *t, const api_addr_key_t *k);

/* Why a front end refused or cut off a connection (the reason label of
 * kiln_connections_refused_total). */
typedef enum {
    API_NET_PER_ADDRESS_LIMIT = 0, /* the client address holds its limit already (at accept) */
    API_NET_CONNECTION_LIMIT,      /* the front end holds its total already (at accept) */
    API_NET_HANDSHAKE_DEADLINE,    /* the TLS handshake (gRPC plain text: the first bytes) took too long */
    API_NET_HEADER_DEADLINE,       /* REST: a request's headers took too long */
    API_NET_BODY_DEADLINE,         /* REST: a request's body took too long */
    API_NET_TLS_VERSION,           /* gRPC: the ClientHello offers no TLS version kilnd accepts */
    API_NET_REASONS
} api_net_reason_t;
/* Registers kiln_connections_refused_total with GET /metrics (at each front end's start). */
void api_net_init(void);
/* Counts a refused connection of port ("rest" or "grpc") for GET /metrics. Thread-safe. */
void api_net_refused(const char *port, api_net_reason_t why);
const char *api_net_reason_name(api_net_reason_t why);

/* The TLS policy, written once: GnuTLS's priority string (REST) and OpenSSL's TLS 1.2 cipher
 * list (gRPC; its TLS 1.3 suites are AES-GCM and ChaCha20-Poly1305 already). Static strings. */
const char *api_tls_gnutls_priorities(api_tls_min_t min);
const char *api_tls_openssl_ciphers(void);

/* Reads the TLS ClientHello at the start of a connection's first bytes (p, n). Returns 1 when it
 * is whole, with *max_version the newest version it offers (0x0303 TLS 1.2, 0x0304 TLS 1.3,
 * from supported_versions when present); 0 when more bytes are needed; -1 when the bytes are not
 * a TLS ClientHello. */
int api_tls_client_hello(const uint8_t *p, size_t n, unsigned *max_version);

/* The bytes the kernel received on a TCP socket so far (TCP_INFO), or 0 when it cannot say. */
uint64_t api_net_bytes_received(int fd);

#endif /* KILN_API_NET_INT_H */
