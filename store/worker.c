/* worker.c - SQL for workers (agents): registration, heartbeats, expiry of silent workers, the
 * worker list the API shows and the free-slot view the scheduler places jobs on (approved
 * workers only). Approval, removal and bans are trust.c's. */
#include "store/store_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int store_worker_upsert(store_conn_t *c, const store_worker_reg_t *w, bool *was_alive, bool *pending,
                        kiln_err_t *err)
{
    /* A re-registration keeps the worker's approval and, when it names none, its join token. */
    static const char *sql =
        "WITH old AS (SELECT state FROM workers WHERE id = $1)"
        " INSERT INTO workers (id, hostname, address, slots, slot_type, gpus, version, cpu_cores,"
        "  state, state_reason, last_heartbeat, registered_at, data_roots, credential_hash, join_token,"
        "  cert_sha256, registered_from, approval)"
        " VALUES ($1, $2, $3, $4::int, $5, $6::jsonb, $7, $8::int, 'ALIVE', 'registered', now(), now(),"
        "  $9::jsonb, $10::bytea, $11, $12, $13, CASE WHEN $14::bool THEN 'PENDING' ELSE 'APPROVED' END)"
        " ON CONFLICT (id) DO UPDATE SET hostname = EXCLUDED.hostname, address = EXCLUDED.address,"
        "  slots = EXCLUDED.slots, slot_type = EXCLUDED.slot_type, gpus = EXCLUDED.gpus,"
        "  version = EXCLUDED.version, cpu_cores = EXCLUDED.cpu_cores, state = 'ALIVE',"
        "  state_reason = 're-registered', last_heartbeat = now(), registered_at = now(), draining = false,"
        "  data_roots = EXCLUDED.data_roots, credential_hash = EXCLUDED.credential_hash,"
        "  join_token = coalesce(nullif(EXCLUDED.join_token, ''), workers.join_token),"
        "  cert_sha256 = EXCLUDED.cert_sha256, registered_from = EXCLUDED.registered_from,"
        "  removed_at = NULL, removed_by = ''"
        " RETURNING (SELECT state FROM old), approval";
    char slots[16], cores[16], hash[2 * STORE_HASH_LEN + 3];
    snprintf(slots, sizeof(slots), "%d", w->slots);
    snprintf(cores, sizeof(cores), "%d", w->cpu_cores);
    if (w->credential_hash)
        store_hash_param(w->credential_hash, hash);
    const char *p[14] = {w->id, w->hostname ? w->hostname : "", w->address ? w->address : "",
                         slots, w->slot_type, w->gpus_json ? w->gpus_json : "[]",
                         w->version ? w->version : "", cores,
                         w->data_roots_json ? w->data_roots_json : "[]",
                         w->credential_hash ? hash : NULL, w->join_token ? w->join_token : "",
                         w->cert_sha256 && *w->cert_sha256 ? w->cert_sha256 : NULL,
                         w->registered_from ? w->registered_from : "", w->pending ? "true" : "false"};
    PGresult *r = NULL;
    int rc = store_q(c, "register worker", sql, 14, p, &r, err);
    if (rc)
        return rc;
    if (was_alive)
        *was_alive = PQntuples(r) == 1 && strcmp(store_get_str(r, 0, 0), "ALIVE") == 0;
    if (pending)
        *pending = PQntuples(r) == 1 && strcmp(store_get_str(r, 0, 1), "PENDING") == 0;
    PQclear(r);
    return 0;
}

int store_worker_touch(store_conn_t *c, const char *id, bool draining, bool *began_draining, bool *pending,
                       kiln_err_t *err)
{
    const char *p[2] = {id, draining ? "true" : "false"};
    PGresult *r = NULL;
    if (began_draining)
        *began_draining = false;
    if (pending)
        *pending = false;
    int rc = store_qp(c, "record heartbeat",
                      "WITH old AS (SELECT draining FROM workers WHERE id = $1)"
                      " UPDATE workers SET last_heartbeat = now(), draining = draining OR $2::bool"
                      " WHERE id = $1 AND state = 'ALIVE' RETURNING (SELECT draining FROM old), approval",
                      2, p, &r, err);
    if (rc)
        return rc;
    int n = PQntuples(r);
    if (n == 1 && began_draining)
        *began_draining = draining && strcmp(store_get_str(r, 0, 0), "f") == 0;
    if (n == 1 && pending)
        *pending = strcmp(store_get_str(r, 0, 1), "PENDING") == 0;
    PQclear(r);
    if (n == 1)
        return 0;
    rc = store_q(c, "read worker", "SELECT state FROM workers WHERE id = $1", 1, p, &r, err);
    if (rc)
        return rc;
    n = PQntuples(r);
    PQclear(r);
    if (n == 0)
        return kiln_err_set(err, KILN_ENOTFOUND, NULL, "worker \"%s\" is not registered", id);
    return kiln_err_set(err, KILN_ESTATE, NULL, "worker \"%s\" was declared dead; it must register again", id);
}

int store_workers_expire(store_conn_t *c, int timeout_ms, int64_t watched_since_us, int *n, kiln_err_t *err)
{
    char ms[16], since[24];
    snprintf(ms, sizeof(ms), "%d", timeout_ms);
    snprintf(since, sizeof(since), "%lld", (long long)watched_since_us);
    const char *p[2] = {ms, since};
    PGresult *r = NULL;
    *n = 0;
    int rc = store_q(c, "expire silent workers",
                     "UPDATE workers SET state = 'DEAD', state_reason = 'stopped heartbeating'"
                     " WHERE state = 'ALIVE' AND greatest(last_heartbeat, to_timestamp($2::bigint / 1e6))"
                     "  < clock_timestamp() - $1::int * interval '1 millisecond' RETURNING id, hostname", 2, p, &r,
                     err);
    if (rc)
        return rc;
    *n = PQntuples(r);
    for (int i = 0; i < *n; i++)
        log_warn("worker %s (%s) stopped heartbeating: marked DEAD", store_get_str(r, i, 0),
                 store_get_str(r, i, 1));
    PQclear(r);
    return 0;
}

int store_now_us(store_conn_t *c, int64_t *out, kiln_err_t *err)
{
    PGresult *r = NULL;
    int rc = store_q(c, "read the database's clock", "SELECT " STORE_US("clock_timestamp()"), 0, NULL, &r, err);
    if (rc)
        return rc;
    *out = store_get_i64(r, 0, 0);
    PQclear(r);
    return 0;
}

#define USED_SLOTS "(SELECT coalesce(sum(cardinality(a.ranks)), 0) FROM assignments a" \
                   " WHERE a.worker_id = w.id AND NOT a.released)"

int store_worker_set_draining(store_conn_t *c, const char *id, bool *changed, kiln_err_t *err)
{
    const char *p[1] = {id};
    PGresult *r = NULL;
    *changed = false;
    int rc = store_q(c, "mark worker draining",
                     "UPDATE workers SET draining = true WHERE id = $1 AND NOT draining RETURNING 1", 1, p,
                     &r, err);
    if (rc)
        return rc;
    *changed = PQntuples(r) == 1;
    PQclear(r);
    return 0;
}

#define WORKER_COLS "w.id, w.hostname, w.address, w.slots, w.slots - " USED_SLOTS ", w.slot_type, w.state, "    \
                    STORE_US("w.last_heartbeat") ", " STORE_US("w.registered_at") ", w.gpus::text, w.cpu_cores,"  \
                    " w.version, w.draining, w.data_roots::text, w.approval, w.approved_by, "                     \
                    STORE_US("w.approved_at") ", w.join_token, coalesce(w.cert_sha256, ''), w.registered_from"

static json_t *worker_json(const PGresult *r, int i)
{
    json_t *o = json_object();
    bool alive = strcmp(store_get_str(r, i, 6), "ALIVE") == 0;
    json_object_set_new(o, "id", json_string(store_get_str(r, i, 0)));
    json_object_set_new(o, "hostname", json_string(store_get_str(r, i, 1)));
    json_object_set_new(o, "address", json_string(store_get_str(r, i, 2)));
    json_object_set_new(o, "slots", json_integer(store_get_int(r, i, 3)));
    json_object_set_new(o, "slots_free", json_integer(alive ? store_get_int(r, i, 4) : 0));
    json_object_set_new(o, "slot_type", json_string(store_get_str(r, i, 5)));
    json_object_set_new(o, "state", json_string(store_get_str(r, i, 6)));
    store_json_set_time(o, "last_heartbeat", r, i, 7);
    store_json_set_time(o, "registered_at", r, i, 8);
    json_object_set_new(o, "gpus", store_get_json(r, i, 9, json_array()));
    json_object_set_new(o, "cpu_cores", json_integer(store_get_int(r, i, 10)));
    json_object_set_new(o, "version", json_string(store_get_str(r, i, 11)));
    json_object_set_new(o, "draining", json_boolean(alive && !strcmp(store_get_str(r, i, 12), "t")));
    json_object_set_new(o, "data_roots", store_get_json(r, i, 13, json_array()));
    json_object_set_new(o, "approval", json_string(store_get_str(r, i, 14)));
    json_object_set_new(o, "approved_by", json_string(store_get_str(r, i, 15)));
    store_json_set_time(o, "approved_at", r, i, 16);
    json_object_set_new(o, "join_token", json_string(store_get_str(r, i, 17)));
    json_object_set_new(o, "cert_sha256", json_string(store_get_str(r, i, 18)));
    json_object_set_new(o, "registered_from", json_string(store_get_str(r, i, 19)));
    return o;
}

int store_workers_list_json(store_conn_t *c, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    PGresult *r = NULL;
    int rc = store_q(c, "list workers",
                     "SELECT " WORKER_COLS " FROM workers w WHERE w.removed_at IS NULL"
                     " ORDER BY w.registered_at, w.id", 0, NULL, &r, err);
    if (rc)
        return rc;
    json_t *arr = json_array();
    for (int i = 0; i < PQntuples(r); i++)
        json_array_append_new(arr, worker_json(r, i));
    PQclear(r);
    *out = arr;
    return 0;
}

int store_worker_get_json(store_conn_t *c, const char *id, json_t **out, kiln_err_t *err)
{
    const char *p[1] = {id};
    PGresult *r = NULL;
    *out = NULL;
    int rc = store_q(c, "read worker", "SELECT " WORKER_COLS " FROM workers w WHERE w.id = $1 AND w.removed_at IS NULL",
                     1, p, &r, err);
    if (rc)
        return rc;
    if (PQntuples(r) == 1)
        *out = worker_json(r, 0);
    PQclear(r);
    if (!*out)
        return kiln_err_set(err, KILN_ENOTFOUND, "id", "worker \"%.64s\" not found", id);
    return 0;
}

static void cap_fill(const PGresult *r, int i, void *elem)
{
    store_worker_cap_t *w = elem;
    kiln_strlcpy(w->id, store_get_str(r, i, 0), sizeof(w->id));
    kiln_strlcpy(w->hostname, store_get_str(r, i, 1), sizeof(w->hostname));
    kiln_strlcpy(w->address, store_get_str(r, i, 2), sizeof(w->address));
    kiln_strlcpy(w->slot_type, store_get_str(r, i, 3), sizeof(w->slot_type));
    w->slots = store_get_int(r, i, 4);
    w->slots_free = store_get_int(r, i, 5);
    json_t *roots = store_get_json(r, i, 6, json_array());
    size_t used = 0, k;
    json_t *v;
    w->nroots = 0;
    json_array_foreach(roots, k, v) {
        const char *root = json_string_value(v);
        size_t len = root ? strlen(root) : 0;
        if (!len || w->nroots >= STORE_MAX_ROOTS || used + len + 1 > sizeof(w->roots_buf))
            continue;
        memcpy(w->roots_buf + used, root, len + 1);
        w->roots_off[w->nroots++] = (uint16_t)used;
        used += len + 1;
    }
    json_decref(roots);
}

void store_workers_capacity_stmt(store_stmt_t *s)
{
    *s = (store_stmt_t){.what = "read worker capacity",
                        .sql = "SELECT w.id, w.hostname, w.address, w.slot_type, w.slots,"
                               " CASE WHEN w.draining THEN 0 ELSE w.slots - " USED_SLOTS " END,"
                               " w.data_roots::text"
                               " FROM workers w WHERE w.state = 'ALIVE' AND w.approval = 'APPROVED' ORDER BY w.id"};
}

int store_workers_capacity_take(store_stmt_t *s, store_worker_cap_t **out, int *n, kiln_err_t *err)
{
    return store_stmt_rows(s, sizeof(**out), cap_fill, (void **)out, n, err);
}

int store_workers_capacity(store_conn_t *c, store_worker_cap_t **out, int *n, kiln_err_t *err)
{
    *out = NULL;
    *n = 0;
    store_stmt_t s;
    store_workers_capacity_stmt(&s);
    int rc = store_qp_pipeline(c, &s, 1, err);
    return rc ? rc : store_workers_capacity_take(&s, out, n, err);
}

int store_stats_json(store_conn_t *c, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    PGresult *r = NULL;
    /* One statement: state counts come from the state index, queue lengths from the pending
     * jobs' index, the worker side is small. */
    int rc = store_q(c, "count jobs and workers",
                     "SELECT 'jobs', state, count(*), 0 FROM jobs GROUP BY state"
                     " UNION ALL SELECT 'queues', queue, count(*), 0 FROM jobs WHERE state = " STORE_STATE(QUEUED) " GROUP BY queue"
                     " UNION ALL SELECT 'workers', state, count(*), 0 FROM workers GROUP BY state"
                     " UNION ALL SELECT 'workers', 'draining', count(*), 0 FROM workers WHERE draining AND state = 'ALIVE'"
                     " UNION ALL SELECT 'slots', w.slot_type, sum(w.slots), sum(" USED_SLOTS ")"
                     "  FROM workers w WHERE w.state = 'ALIVE' AND w.approval = 'APPROVED' GROUP BY w.slot_type",
                     0, NULL, &r, err);
    if (rc)
        return rc;
    json_t *o = json_pack("{s:{}, s:{}, s:{s:i, s:i, s:i}, s:{}}", "jobs", "queues", "workers", "ALIVE", 0, "DEAD", 0,
                          "draining", 0, "slots");
    for (int i = 0; o && i < PQntuples(r); i++) {
        const char *kind = store_get_str(r, i, 0), *key = store_get_str(r, i, 1);
        json_t *section = json_object_get(o, kind);
        if (!strcmp(kind, "slots"))
            json_object_set_new(section, key, json_pack("{s:I, s:I}", "total", (json_int_t)store_get_i64(r, i, 2),
                                                        "used", (json_int_t)store_get_i64(r, i, 3)));
        else
            json_object_set_new(section, key, json_integer(store_get_i64(r, i, 2)));
    }
    PQclear(r);
    if (!o)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    *out = o;
    return 0;
}
