/* assign.c - SQL for placements (assignments: which worker runs which ranks of which attempt),
 * their delivery, stop orders and release, and rank exits. */
#include "store/store_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ASSIGN_COLS "a.id, a.job_id::text, a.attempt, a.worker_id, w.hostname, a.node_rank, " \
                    "a.nodes, a.world_size, a.ranks::text, a.master_addr, a.master_port, "    \
                    "a.delivered, a.started, a.stop, a.stop_sent, a.released, a.stop_reason"

static void parse_ranks(const char *s, store_assign_t *a)
{
    a->nranks = 0;
    while (*s && a->nranks < (int)KILN_ARRAY_LEN(a->ranks)) {
        while (*s == '{' || *s == ',' || *s == ' ')
            s++;
        if (*s == '}' || !*s)
            break;
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s)
            break;
        a->ranks[a->nranks++] = (int)v;
        s = end;
    }
}

static void assign_fill(const PGresult *r, int i, void *elem)
{
    store_assign_t *a = elem;
    memset(a, 0, sizeof(*a));
    a->id = store_get_i64(r, i, 0);
    kiln_strlcpy(a->job_id, store_get_str(r, i, 1), sizeof(a->job_id));
    a->attempt = store_get_int(r, i, 2);
    kiln_strlcpy(a->worker_id, store_get_str(r, i, 3), sizeof(a->worker_id));
    kiln_strlcpy(a->worker_host, store_get_str(r, i, 4), sizeof(a->worker_host));
    a->node_rank = store_get_int(r, i, 5);
    a->nodes = store_get_int(r, i, 6);
    a->world_size = store_get_int(r, i, 7);
    parse_ranks(store_get_str(r, i, 8), a);
    kiln_strlcpy(a->master_addr, store_get_str(r, i, 9), sizeof(a->master_addr));
    a->master_port = store_get_int(r, i, 10);
    a->delivered = store_get_bool(r, i, 11);
    a->started = store_get_bool(r, i, 12);
    a->stop = store_get_bool(r, i, 13);
    a->stop_sent = store_get_bool(r, i, 14);
    a->released = store_get_bool(r, i, 15);
    kiln_strlcpy(a->stop_reason, store_get_str(r, i, 16), sizeof(a->stop_reason));
}

static int assign_rows(store_conn_t *c, const char *what, const char *sql, int np,
                       const char *const *p, store_assign_t **out, int *n, kiln_err_t *err)
{
    return store_q_rows(c, what, sql, np, p, sizeof(**out), assign_fill, (void **)out, n, err);
}

static void pairs_literals(const char *const *job_ids, const int *attempts, int n, char **ids_lit,
                           char **att_lit)
{
    size_t cap = (size_t)n * (STORE_ID_LEN + 4) + 4;
    char *a = malloc(cap), *b = malloc((size_t)n * 14 + 4);
    size_t la = 0, lb = 0;
    a[la++] = '{';
    b[lb++] = '{';
    for (int i = 0; i < n; i++) {
        /* Only UUID-shaped ids go in; anything else cannot match an assignment anyway. */
        const char *id = store_is_uuid(job_ids[i]) ? job_ids[i] : "00000000-0000-0000-0000-000000000000";
        la += (size_t)snprintf(a + la, cap - la, "%s%s", i ? "," : "", id);
        lb += (size_t)sprintf(b + lb, "%s%d", i ? "," : "", attempts[i]);
    }
    a[la++] = '}';
    a[la] = '\0';
    b[lb++] = '}';
    b[lb] = '\0';
    *ids_lit = a;
    *att_lit = b;
}

int store_assign_insert_many(store_conn_t *c, const store_assign_t *a, int n, kiln_err_t *err)
{
    if (n <= 0)
        return 0;
    /* one array literal per column; each job's ranks go as the text of an int[] (unnest would
     * flatten a two-dimensional array) */
    store_buf_t b[9] = {{0}};
    for (int i = 0; i < n; i++) {
        store_buf_elems(b, 9, i);
        char ranks[256 * 8 + 4];
        size_t l = 0;
        ranks[l++] = '{';
        for (int k = 0; k < a[i].nranks && l < sizeof(ranks) - 16; k++)
            l += (size_t)snprintf(ranks + l, sizeof(ranks) - l, "%s%d", k ? "," : "", a[i].ranks[k]);
        ranks[l++] = '}';
        ranks[l] = '\0';
        store_buf_array_text(&b[0], a[i].job_id);
        store_buf_i64(&b[1], a[i].attempt);
        store_buf_array_text(&b[2], a[i].worker_id);
        store_buf_i64(&b[3], a[i].node_rank);
        store_buf_i64(&b[4], a[i].nodes);
        store_buf_array_text(&b[5], ranks);
        store_buf_i64(&b[6], a[i].world_size);
        store_buf_array_text(&b[7], a[i].master_addr);
        store_buf_i64(&b[8], a[i].master_port);
    }
    store_buf_arrays_end(b, 9, n);
    const char *p[9] = {b[0].p, b[1].p, b[2].p, b[3].p, b[4].p, b[5].p, b[6].p, b[7].p, b[8].p};
    int rc = store_q_later(c, "insert assignments",
                      "INSERT INTO assignments (job_id, attempt, worker_id, node_rank, nodes, ranks,"
                      " world_size, master_addr, master_port)"
                      " SELECT x.job_id, x.attempt, x.worker_id, x.node_rank, x.nodes, x.ranks::int[], x.world_size,"
                      "  x.master_addr, x.master_port"
                      " FROM unnest($1::uuid[], $2::int[], $3::text[], $4::int[], $5::int[], $6::text[], $7::int[],"
                      "  $8::text[], $9::int[]) AS x(job_id, attempt, worker_id, node_rank, nodes, ranks, world_size,"
                      "  master_addr, master_port)", 9, p, err);
    for (int f = 0; f < 9; f++)
        store_buf_free(&b[f]);
    return rc;
}

int store_assign_insert(store_conn_t *c, const store_assign_t *a, kiln_err_t *err)
{
    return store_assign_insert_many(c, a, 1, err);
}

int store_assign_list(store_conn_t *c, const char *job_id, int attempt, store_assign_t **out,
                      int *n, kiln_err_t *err)
{
    char att[16];
    snprintf(att, sizeof(att), "%d", attempt);
    const char *p[2] = {job_id, att};
    return assign_rows(c, "read assignments",
                       "SELECT " ASSIGN_COLS " FROM assignments a JOIN workers w ON w.id = a.worker_id"
                       " WHERE a.job_id = $1::uuid AND a.attempt = $2::int ORDER BY a.node_rank",
                       2, p, out, n, err);
}

int store_assign_ranks_of(store_conn_t *c, const char *job_id, int attempt, const char *worker_id,
                          int *ranks, int *n, kiln_err_t *err)
{
    char att[16];
    snprintf(att, sizeof(att), "%d", attempt);
    const char *p[3] = {job_id, att, worker_id};
    PGresult *r = NULL;
    *n = 0;
    if (!store_is_uuid(job_id))
        return 0;
    int rc = store_qp(c, "read a worker's ranks",
                      "SELECT ranks::text FROM assignments WHERE job_id = $1::uuid AND attempt = $2::int"
                      " AND worker_id = $3", 3, p, &r, err);
    if (rc)
        return rc;
    if (PQntuples(r) == 1) {
        store_assign_t a;
        parse_ranks(store_get_str(r, 0, 0), &a);
        memcpy(ranks, a.ranks, sizeof(int) * (size_t)a.nranks);
        *n = a.nranks;
    }
    PQclear(r);
    return 0;
}

int store_assign_undelivered(store_conn_t *c, const char *worker_id, store_assign_t **out, int *n,
                             kiln_err_t *err)
{
    const char *p[1] = {worker_id};
    return assign_rows(c, "read undelivered assignments",
                       "SELECT " ASSIGN_COLS " FROM assignments a JOIN workers w ON w.id = a.worker_id"
                       " WHERE a.worker_id = $1 AND NOT a.delivered AND NOT a.released AND NOT a.stop"
                       "  AND (a.node_rank = 0 OR a.master_port > 0)"
                       " ORDER BY a.id", 1, p, out, n, err);
}

int store_assign_notify_workers(store_conn_t *c, const char *channel, const char *const *job_ids, const int *attempts,
                                int n, kiln_err_t *err)
{
    if (n <= 0)
        return 0;
    char *ids = NULL, *atts = NULL;
    pairs_literals(job_ids, attempts, n, &ids, &atts);
    const char *p[3] = {channel, ids, atts};
    int rc = store_q_later(c, "notify the workers of attempts",
                           "SELECT count(pg_notify($1, w)) FROM (SELECT DISTINCT a.worker_id AS w FROM assignments a"
                           " JOIN unnest($2::uuid[], $3::int[]) AS r(job_id, attempt)"
                           "  ON a.job_id = r.job_id AND a.attempt = r.attempt) d", 3, p, err);
    free(ids);
    free(atts);
    return rc;
}

int store_assign_deliver_many(store_conn_t *c, const int64_t *ids, int n, char **spec_json, kiln_err_t *err)
{
    for (int i = 0; i < n; i++)
        spec_json[i] = NULL;
    if (n <= 0)
        return 0;
    store_buf_t a = {0};
    store_buf_i64_array(&a, ids, n);
    const char *p[1] = {a.p};
    PGresult *r = NULL;
    int rc = store_qp(c, "mark assignments delivered",
                      "UPDATE assignments a SET delivered = true, delivered_at = now()"
                      " FROM unnest($1::bigint[]) WITH ORDINALITY AS x(id, i), jobs j"
                      " WHERE a.id = x.id AND j.id = a.job_id AND NOT a.delivered"
                      " RETURNING x.i, j.spec::text", 1, p, &r, err);
    store_buf_free(&a);
    if (rc)
        return rc;
    for (int row = 0; row < PQntuples(r) && rc == 0; row++) { /* each row names its id by its place */
        int k = store_get_int(r, row, 0) - 1;
        if (k < 0 || k >= n || spec_json[k])
            continue;
        spec_json[k] = strdup(store_get_str(r, row, 1));
        if (!spec_json[k])
            rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    PQclear(r);
    if (rc)
        for (int i = 0; i < n; i++) {
            free(spec_json[i]);
            spec_json[i] = NULL;
        }
    return rc;
}

int store_assign_set_started(store_conn_t *c, const char *job_id, int attempt, const char *worker_id, int port,
                             bool *found, bool *port_set, kiln_err_t *err)
{
    char att[16], pt[16];
    snprintf(att, sizeof(att), "%d", attempt);
    snprintf(pt, sizeof(pt), "%d", port);
    const char *p[4] = {job_id, att, worker_id, pt};
    PGresult *r = NULL;
    *found = *port_set = false;
    /* o: each row as it was before this statement (its old port, whether it was released) */
    int rc = store_qp(c, "mark assignment started",
                      "WITH z AS (SELECT $4::int > 0 AND EXISTS (SELECT 1 FROM assignments WHERE job_id = $1::uuid"
                      "  AND attempt = $2::int AND worker_id = $3 AND node_rank = 0 AND NOT released) AS port)"
                      " UPDATE assignments a SET started = a.started OR (a.worker_id = $3 AND NOT a.released),"
                      "  master_port = CASE WHEN z.port AND a.master_port = 0 THEN $4::int ELSE a.master_port END"
                      " FROM z, assignments o"
                      " WHERE o.id = a.id AND a.job_id = $1::uuid AND a.attempt = $2::int"
                      "  AND ((a.worker_id = $3 AND NOT a.released) OR (z.port AND a.master_port = 0))"
                      " RETURNING a.worker_id = $3 AND NOT o.released, z.port AND o.master_port = 0",
                      4, p, &r, err);
    if (rc)
        return rc;
    for (int row = 0; row < PQntuples(r); row++) {
        *found = *found || store_get_bool(r, row, 0);
        *port_set = *port_set || store_get_bool(r, row, 1);
    }
    PQclear(r);
    return 0;
}

int store_assign_stop(store_conn_t *c, const char *job_id, int attempt, const char *reason,
                      const char *except_worker, kiln_err_t *err)
{
    char att[16];
    snprintf(att, sizeof(att), "%d", attempt);
    const char *p[4] = {job_id, att, reason ? reason : "", except_worker};
    int rc = store_qp(c, "release undelivered assignments",
                      "UPDATE assignments SET released = true, released_at = now(), stop = true,"
                      " stop_reason = $3 WHERE job_id = $1::uuid AND attempt = $2::int AND NOT released"
                      " AND NOT delivered AND ($4::text IS NULL OR worker_id <> $4)", 4, p, NULL, err);
    if (rc)
        return rc;
    return store_q(c, "order assignments to stop",
                   "UPDATE assignments SET stop = true, stop_reason = $3 WHERE job_id = $1::uuid"
                   " AND attempt = $2::int AND NOT released AND NOT stop"
                   " AND ($4::text IS NULL OR worker_id <> $4)", 4, p, NULL, err);
}

int store_assign_release(store_conn_t *c, const char *job_id, int attempt, const char *worker_id,
                         kiln_err_t *err)
{
    char att[16];
    snprintf(att, sizeof(att), "%d", attempt);
    const char *p[3] = {job_id, att, worker_id};
    return store_qp(c, "release assignments",
                    "UPDATE assignments SET released = true, released_at = now() WHERE job_id = $1::uuid"
                    " AND attempt = $2::int AND NOT released AND ($3::text IS NULL OR worker_id = $3)",
                    3, p, NULL, err);
}

int store_assign_unreleased(store_conn_t *c, const char *job_id, int attempt, int *n,
                            kiln_err_t *err)
{
    char att[16];
    snprintf(att, sizeof(att), "%d", attempt);
    const char *p[2] = {job_id, att};
    PGresult *r = NULL;
    *n = 0;
    int rc = store_q(c, "count assignments",
                     "SELECT count(*) FROM assignments WHERE job_id = $1::uuid AND attempt = $2::int"
                     " AND NOT released", 2, p, &r, err);
    if (rc)
        return rc;
    *n = store_get_int(r, 0, 0);
    PQclear(r);
    return 0;
}

static int stop_rows(PGresult *r, store_stop_order_t **out, int *n, kiln_err_t *err)
{
    int rows = PQntuples(r);
    *out = NULL;
    *n = 0;
    if (rows > 0) {
        *out = calloc((size_t)rows, sizeof(store_stop_order_t));
        if (!*out)
            return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    for (int i = 0; i < rows; i++) {
        kiln_strlcpy((*out)[i].job_id, store_get_str(r, i, 0), STORE_ID_LEN);
        (*out)[i].attempt = store_get_int(r, i, 1);
        if (PQnfields(r) > 2)
            kiln_strlcpy((*out)[i].reason, store_get_str(r, i, 2), sizeof((*out)[i].reason));
        if (PQnfields(r) > 3)
            (*out)[i].grace_s = store_get_int(r, i, 3);
    }
    *n = rows;
    return 0;
}

int store_assign_take_stops(store_conn_t *c, const char *worker_id, int resend_ms,
                            store_stop_order_t **out, int *n, kiln_err_t *err)
{
    char ms[16];
    snprintf(ms, sizeof(ms), "%d", resend_ms);
    const char *p[2] = {worker_id, ms};
    PGresult *r = NULL;
    *out = NULL;
    *n = 0;
    /* A heartbeat's housekeeping of a worker's assignments skips the rows another transaction is
     * changing right now (a rank's exit being recorded, which locks its job, then its assignments):
     * waiting for them, with rows of several jobs locked in no set order, could deadlock with a
     * batch of exits; what it skips, the next heartbeat does. */
    int rc = store_qp(c, "take stop orders",
                      "WITH g AS (SELECT a.id,"
                      "  COALESCE((j.spec -> 'stopping' ->> 'grace_period_s')::int, 0) AS grace_s"
                      "  FROM assignments a JOIN jobs j ON j.id = a.job_id WHERE a.worker_id = $1"
                      "  AND a.stop AND a.delivered AND NOT a.released FOR UPDATE OF a SKIP LOCKED)"
                      " UPDATE assignments a SET stop_sent = true, stop_sent_at = now() FROM g"
                      " WHERE a.id = g.id AND (NOT a.stop_sent"
                      "  OR a.stop_sent_at < now() - GREATEST($2::int, g.grace_s * 1000) * interval '1 millisecond')"
                      " RETURNING a.job_id::text, a.attempt, a.stop_reason, g.grace_s", 2, p, &r, err);
    if (rc)
        return rc;
    rc = stop_rows(r, out, n, err);
    PQclear(r);
    return rc;
}

/* Builds the two array literals for a list of (job id, attempt) pairs. Caller frees. */
int store_assign_stale(store_conn_t *c, const char *worker_id, const char *const *job_ids,
                       const int *attempts, int n, store_stop_order_t **out, int *nout,
                       kiln_err_t *err)
{
    *out = NULL;
    *nout = 0;
    if (n == 0)
        return 0;
    char *ids, *atts;
    pairs_literals(job_ids, attempts, n, &ids, &atts);
    const char *p[3] = {worker_id, ids, atts};
    PGresult *r = NULL;
    int rc = store_qp(c, "check running ranks",
                      "SELECT DISTINCT r.job_id::text, r.attempt FROM unnest($2::uuid[], $3::int[])"
                      " AS r(job_id, attempt) WHERE NOT EXISTS (SELECT 1 FROM assignments a"
                      " WHERE a.worker_id = $1 AND a.job_id = r.job_id AND a.attempt = r.attempt"
                      " AND NOT a.released)", 3, p, &r, err);
    free(ids);
    free(atts);
    if (rc)
        return rc;
    rc = stop_rows(r, out, nout, err);
    PQclear(r);
    return rc;
}

int store_assign_reap(store_conn_t *c, const char *worker_id, const char *const *job_ids,
                      const int *attempts, int n, int grace_ms, store_stop_order_t **released,
                      int *nreleased, kiln_err_t *err)
{
    char *ids, *atts, ms[16];
    pairs_literals(job_ids, attempts, n, &ids, &atts);
    snprintf(ms, sizeof(ms), "%d", grace_ms);
    const char *p[4] = {worker_id, ids, atts, ms};
    PGresult *r = NULL;
    int rc = store_qp(c, "release stopped assignments",
                      "UPDATE assignments a SET released = true, released_at = now()"
                      " FROM (SELECT id FROM assignments a"
                      "  WHERE a.worker_id = $1 AND NOT a.released AND a.stop_sent"
                      "  AND a.stop_sent_at < now() - $4::int * interval '1 millisecond'"
                      "  AND NOT EXISTS (SELECT 1 FROM unnest($2::uuid[], $3::int[]) AS r(job_id, attempt)"
                      "   WHERE r.job_id = a.job_id AND r.attempt = a.attempt)"
                      "  FOR UPDATE SKIP LOCKED) s" /* as take stop orders: skips what another is changing */
                      " WHERE a.id = s.id"
                      " RETURNING a.job_id::text, a.attempt", 4, p, &r, err);
    free(ids);
    free(atts);
    if (rc)
        return rc;
    rc = stop_rows(r, released, nreleased, err);
    PQclear(r);
    return rc;
}

int store_assign_redeliver(store_conn_t *c, const char *worker_id, const char *const *job_ids,
                           const int *attempts, int n, int after_ms, int *nredeliver, kiln_err_t *err)
{
    char *ids, *atts, ms[16];
    pairs_literals(job_ids, attempts, n, &ids, &atts);
    snprintf(ms, sizeof(ms), "%d", after_ms);
    const char *p[4] = {worker_id, ids, atts, ms};
    PGresult *r = NULL;
    *nredeliver = 0;
    int rc = store_qp(c, "mark assignments for redelivery",
                      "UPDATE assignments a SET delivered = false"
                      " FROM (SELECT id FROM assignments a"
                      "  WHERE a.worker_id = $1 AND a.delivered AND NOT a.started AND NOT a.stop"
                      "  AND NOT a.released AND a.delivered_at < now() - $4::int * interval '1 millisecond'"
                      "  AND NOT EXISTS (SELECT 1 FROM unnest($2::uuid[], $3::int[]) AS r(job_id, attempt)"
                      "   WHERE r.job_id = a.job_id AND r.attempt = a.attempt)"
                      "  AND NOT EXISTS (SELECT 1 FROM rank_exits x WHERE x.job_id = a.job_id"
                      "   AND x.attempt = a.attempt AND x.rank = ANY(a.ranks))"
                      "  FOR UPDATE SKIP LOCKED) s" /* as take stop orders: skips what another is changing */
                      " WHERE a.id = s.id"
                      " RETURNING a.job_id::text", 4, p, &r, err);
    free(ids);
    free(atts);
    if (rc)
        return rc;
    *nredeliver = PQntuples(r);
    for (int i = 0; i < *nredeliver; i++)
        log_warn("job %s: worker %s never acknowledged its assignment; delivering it again",
                 store_get_str(r, i, 0), worker_id);
    PQclear(r);
    return 0;
}

static void lost_fill(const PGresult *r, int i, void *elem)
{
    store_lost_t *l = elem;
    kiln_strlcpy(l->job_id, store_get_str(r, i, 0), STORE_ID_LEN);
    l->attempt = store_get_int(r, i, 1);
    kiln_strlcpy(l->worker_id, store_get_str(r, i, 2), STORE_WORKER_ID_LEN);
    kiln_strlcpy(l->hostname, store_get_str(r, i, 3), sizeof(l->hostname));
}

static int lost_rows(store_conn_t *c, const char *what, const char *sql, int np,
                     const char *const *p, store_lost_t **out, int *n, kiln_err_t *err)
{
    return store_q_rows(c, what, sql, np, p, sizeof(**out), lost_fill, (void **)out, n, err);
}

int store_assign_lost(store_conn_t *c, store_lost_t **out, int *n, kiln_err_t *err)
{
    return lost_rows(c, "find assignments on dead workers",
                     "SELECT a.job_id::text, a.attempt, a.worker_id, w.hostname FROM assignments a"
                     " JOIN workers w ON w.id = a.worker_id WHERE NOT a.released AND w.state = 'DEAD'"
                     " ORDER BY a.job_id, a.attempt", 0, NULL, out, n, err);
}

int store_assign_held_by(store_conn_t *c, const char *worker_id, store_lost_t **out, int *n, kiln_err_t *err)
{
    const char *p[1] = {worker_id};
    return lost_rows(c, "find a worker's assignments",
                     "SELECT a.job_id::text, a.attempt, a.worker_id, w.hostname FROM assignments a"
                     " JOIN workers w ON w.id = a.worker_id WHERE a.worker_id = $1 AND NOT a.released"
                     " ORDER BY a.job_id", 1, p, out, n, err);
}

int store_assign_delivered_on(store_conn_t *c, const char *worker_id, store_lost_t **out, int *n,
                              kiln_err_t *err)
{
    const char *p[1] = {worker_id};
    return lost_rows(c, "find delivered assignments",
                     "SELECT a.job_id::text, a.attempt, a.worker_id, w.hostname FROM assignments a"
                     " JOIN workers w ON w.id = a.worker_id WHERE a.worker_id = $1 AND a.delivered"
                     " AND NOT a.released ORDER BY a.job_id", 1, p, out, n, err);
}

int store_rank_exit_record(store_conn_t *c, const Kiln__RankExit *e, store_rank_exit_t *out, kiln_err_t *err)
{
    char att[16], rank[16], code[16], sig[16];
    snprintf(att, sizeof(att), "%d", e->attempt);
    snprintf(rank, sizeof(rank), "%d", e->rank);
    snprintf(code, sizeof(code), "%d", e->exit_code);
    snprintf(sig, sizeof(sig), "%d", e->signal);
    const char *p[7] = {e->job_id, att, rank, e->worker_id ? e->worker_id : "", code, sig,
                        e->reason ? e->reason : ""};
    PGresult *r = NULL;
    memset(out, 0, sizeof(*out));
    /* Every part of the statement reads the same snapshot, which does not hold the row it inserts:
     * the counts are the exits before it (prior) plus the new one (ins). The caller holds the job's
     * row lock, so every earlier exit of the attempt has committed before this statement began. */
    int rc = store_qp(c, "record rank exit",
                      "WITH ins AS (INSERT INTO rank_exits (job_id, attempt, rank, worker_id, exit_code, signal, reason)"
                      "  VALUES ($1::uuid, $2::int, $3::int, $4, $5::int, $6::int, $7)"
                      "  ON CONFLICT DO NOTHING RETURNING rank, exit_code, signal),"
                      " prior AS (SELECT rank, exit_code, signal FROM rank_exits"
                      "  WHERE job_id = $1::uuid AND attempt = $2::int),"
                      " rel AS (UPDATE assignments a SET released = true, released_at = now()"
                      "  WHERE a.job_id = $1::uuid AND a.attempt = $2::int AND a.worker_id = $4"
                      "  AND $3::int = ANY(a.ranks) AND NOT a.released"
                      "  AND (SELECT count(*) FROM (SELECT rank FROM prior UNION ALL SELECT rank FROM ins) x"
                      "   WHERE x.rank = ANY(a.ranks)) >= cardinality(a.ranks) RETURNING 1),"
                      " alle AS (SELECT exit_code, signal FROM prior UNION ALL SELECT exit_code, signal FROM ins)"
                      " SELECT (SELECT count(*) FROM ins), (SELECT count(*) FROM rel), (SELECT count(*) FROM alle),"
                      "  (SELECT count(*) FROM alle WHERE exit_code = 0 AND signal = 0),"
                      "  coalesce((SELECT (spec #>> '{stopping,max_steps}')::bigint FROM jobs WHERE id = $1::uuid), 0),"
                      /* a script's hyperparameters are free-form: only a number is a step count */
                      "  coalesce((SELECT CASE WHEN jsonb_typeof(spec #> '{hyperparameters,max_steps}') = 'number'"
                      "   THEN LEAST(GREATEST((spec #>> '{hyperparameters,max_steps}')::numeric, 0), 1099511627776)::bigint"
                      "   END FROM jobs"
                      "   WHERE id = $1::uuid), 0),"
                      "  coalesce((SELECT progress_step FROM jobs WHERE id = $1::uuid), 0),"
                      /* read only for a job that pauses, the one that compares its steps */
                      "  (SELECT CASE WHEN spec #> '{stopping,max_steps}' IS NOT NULL"
                      "   THEN spec -> 'metric_definitions' END FROM jobs WHERE id = $1::uuid)", 7, p, &r, err);
    if (rc)
        return rc;
    if (PQntuples(r) == 1) {
        out->inserted = store_get_int(r, 0, 0) > 0;
        out->released = store_get_int(r, 0, 1) > 0;
        out->n_exited = store_get_int(r, 0, 2);
        out->n_ok = store_get_int(r, 0, 3);
        out->pause_at = store_get_i64(r, 0, 4);
        out->max_steps = store_get_i64(r, 0, 5);
        out->progress_step = store_get_i64(r, 0, 6);
        if (!PQgetisnull(r, 0, 7))
            out->metric_defs = store_json_parse(PQgetvalue(r, 0, 7));
    }
    PQclear(r);
    return 0;
}
