/* listen.c - the store's dedicated connection for one kilnd's conversation with the others:
 * LISTEN for their notifications, send this kilnd's (a few per statement, without waiting for
 * the disk: they are hints, the rows they point at are what is durable), and hold the session
 * advisory lock that makes one kilnd the leader. Not from the pool: LISTEN and the lock belong
 * to a session, and both are released the moment it ends (a killed kilnd's socket closes). */
#include "store/store_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct store_listener {
    PGconn *pg;
};

static void listener_notice(void *arg, const char *message)
{
    (void)arg;
    log_debug("postgres (listener): %s", message);
}

int store_listener_open(const char *url, const char *const *channels, size_t n, store_listener_t **out,
                        kiln_err_t *err)
{
    *out = NULL;
    /* TCP keepalives both ways: libpq's (below) make this kilnd notice a vanished server, and
     * the session's tcp_keepalives_* and tcp_user_timeout (set after connecting) make the SERVER
     * notice a vanished kilnd, so a leader whose host died (no FIN) loses its lock within about
     * 11 s, not at the kernel's two-hour default. They do nothing on a unix socket. */
    const char *keys[] = {"dbname", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
                          "connect_timeout", "application_name", NULL};
    const char *vals[] = {url, "1", "5", "2", "3", "10", "kilnd-listener", NULL};
    PGconn *pg = PQconnectdbParams(keys, vals, 1);
    if (PQstatus(pg) != CONNECTION_OK) {
        int rc = store_pg_conn_fail(pg, "connect to the database", err);
        PQfinish(pg);
        return rc;
    }
    PQsetNoticeProcessor(pg, listener_notice, NULL);
    PGresult *r = PQexec(pg, "SET synchronous_commit = off; SET tcp_keepalives_idle = 5; "
                             "SET tcp_keepalives_interval = 2; SET tcp_keepalives_count = 3; "
                             "SET tcp_user_timeout = 11000");
    bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    for (size_t i = 0; ok && i < n; i++) {
        char *ident = PQescapeIdentifier(pg, channels[i], strlen(channels[i]));
        char sql[160];
        snprintf(sql, sizeof(sql), "LISTEN %s", ident ? ident : "\"\"");
        PQfreemem(ident);
        r = PQexec(pg, sql);
        ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
    }
    if (!ok) {
        int rc = store_pg_conn_fail(pg, "listen for notifications", err);
        PQfinish(pg);
        return rc;
    }
    store_listener_t *l = calloc(1, sizeof(*l));
    if (!l) {
        PQfinish(pg);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    l->pg = pg;
    *out = l;
    return 0;
}

void store_listener_close(store_listener_t *l)
{
    if (!l)
        return;
    PQfinish(l->pg);
    free(l);
}

int store_listener_fd(store_listener_t *l)
{
    return PQsocket(l->pg);
}

int store_listener_drain(store_listener_t *l, store_notify_fn fn, void *ud, kiln_err_t *err)
{
    if (!PQconsumeInput(l->pg) || PQstatus(l->pg) != CONNECTION_OK)
        return store_pg_conn_fail(l->pg, "keep the listening connection", err);
    PGnotify *n;
    while ((n = PQnotifies(l->pg)) != NULL) {
        fn(ud, n->relname, n->extra ? n->extra : "");
        PQfreemem(n);
    }
    return 0;
}

int store_listener_notify(store_listener_t *l, const char *const *channels, const char *const *payloads, size_t n,
                          kiln_err_t *err)
{
    if (n == 0)
        return 0;
    /* Two text arrays: pg_notify once per element, one statement, one (asynchronous) commit. */
    store_buf_t ch = {0}, pl = {0};
    store_buf_text_array(&ch, channels, (int)n);
    store_buf_text_array(&pl, payloads, (int)n);
    const char *p[2] = {ch.p, pl.p};
    PGresult *r = PQexecParams(l->pg, "SELECT count(pg_notify(c, p)) FROM unnest($1::text[], $2::text[]) AS t(c, p)",
                               2, NULL, p, NULL, NULL, 0);
    int rc = 0;
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        rc = store_pg_conn_fail(l->pg, "send notifications", err);
    PQclear(r);
    store_buf_free(&ch);
    store_buf_free(&pl);
    return rc;
}

int store_listener_try_lock(store_listener_t *l, int64_t key, bool *got, kiln_err_t *err)
{
    char k[24];
    snprintf(k, sizeof(k), "%lld", (long long)key);
    const char *p[1] = {k};
    PGresult *r = PQexecParams(l->pg, "SELECT pg_try_advisory_lock($1::bigint)", 1, NULL, p, NULL, NULL, 0);
    *got = false;
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        PQclear(r);
        return store_pg_conn_fail(l->pg, "try the leader lock", err);
    }
    *got = PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    return 0;
}

int store_notify(store_conn_t *c, const char *channel, const char *payload, kiln_err_t *err)
{
    const char *p[2] = {channel, payload};
    return store_q_later(c, "send a notification", "SELECT pg_notify($1, $2)", 2, p, err);
}
