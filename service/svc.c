/* svc.c - the service's lifecycle (connect, migrate, open the artifact store, start and stop the
 * scheduler, liveness and clean-up threads), transactions that announce ended jobs after commit, the cached cluster capacity used
 * at submission, and readiness. */
#include "service/svc_int.h"

#include <stdlib.h>
#include <string.h>

char *svc_astr(arena_t *a, const char *s)
{
    return arena_strdup(a, s ? s : "");
}

int svc_create(const svc_config_t *cfg, svc_t **out, kiln_err_t *err)
{
    *out = NULL;
    svc_prom_init();
    svc_t *s = calloc(1, sizeof(*s));
    if (!s)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    s->cfg = *cfg;
    if (s->cfg.heartbeat_interval_ms <= 0)
        s->cfg.heartbeat_interval_ms = 1000;
    if (s->cfg.heartbeat_timeout_ms <= 0)
        s->cfg.heartbeat_timeout_ms = 10000;
    if (s->cfg.sched_interval_ms <= 0)
        s->cfg.sched_interval_ms = 500;
    if (s->cfg.db_pool_size <= 0)
        s->cfg.db_pool_size = 16;
    if (s->cfg.stop_grace_ms <= 0)
        s->cfg.stop_grace_ms = 10000;
    if (s->cfg.preempt_protect_after <= 0)
        s->cfg.preempt_protect_after = 3;
    s->database_url = cfg->database_url ? strdup(cfg->database_url) : NULL;
    s->migrations_dir = cfg->migrations_dir ? strdup(cfg->migrations_dir) : NULL;
    s->cfg.database_url = s->database_url;
    s->cfg.migrations_dir = s->migrations_dir;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_init(&s->cap_mu, NULL);
    pthread_mutex_init(&s->jobs_mu, NULL);
    pthread_mutex_init(&s->stale_mu, NULL);
    pthread_mutex_init(&s->note_mu, NULL);
    atomic_init(&s->leader, false);
    atomic_init(&s->leader_epoch, 0);
    s->notify_efd = -1;

    store_conn_t *c = NULL;
    int rc = svc_auth_init(s, err);
    if (rc == 0)
        rc = svc_notify_init(s, err);
    if (rc)
        goto fail;
    rc = svc_artifacts_init(s, err);
    s->cfg.artifact_dir = NULL; /* the caller's string; s->artifact_dir holds it resolved */
    if (rc)
        goto fail;
    if (!s->database_url || !*s->database_url) {
        rc = kiln_err_set(err, KILN_EINVAL, "database-url", "no database URL given");
        kiln_err_hint(err, "pass --database-url or set KILN_DATABASE_URL (a libpq connection string)");
        goto fail;
    }
    /* On top of the requests' connections, the scheduler and liveness threads each hold up to
     * two at once (their pass plus one job transaction); the notify thread has its own session
     * and borrows one to read new log lines; the janitor holds one during its clean-up pass. */
    rc = store_open(s->database_url, s->cfg.db_pool_size + 5, &s->store, err);
    if (rc)
        goto fail;
    rc = store_conn_get(s->store, &c, err);
    if (rc)
        goto fail;
    int applied = 0;
    rc = store_migrate(c, s->migrations_dir, &applied, err);
    if (rc)
        goto fail;
    log_info("service: database schema up to date (%d migration(s) applied now)", applied);
    rc = svc_auth_setup(s, c, err);
    if (rc)
        goto fail;
    /* (kilnd's own downtime does not count as the workers' silence: the liveness checker only
     * judges silence it watched, from taking the lead on; liveness.c) */
    rc = svc_cap_refresh(s, c, err);
    if (rc)
        goto fail;
    store_conn_put(s->store, c);
    c = NULL;

    if (pthread_create(&s->sched_thread, NULL, svc_sched_main, s) != 0) {
        rc = kiln_err_set(err, KILN_EINTERNAL, NULL, "could not start the scheduler thread");
        goto fail;
    }
    s->sched_started = true;
    if (pthread_create(&s->live_thread, NULL, svc_live_main, s) != 0) {
        rc = kiln_err_set(err, KILN_EINTERNAL, NULL, "could not start the liveness thread");
        goto fail;
    }
    s->live_started = true;
    if (pthread_create(&s->notify_thread, NULL, svc_notify_main, s) != 0) {
        rc = kiln_err_set(err, KILN_EINTERNAL, NULL, "could not start the notify thread");
        goto fail;
    }
    s->notify_started = true;
    rc = svc_janitor_start(s, err);
    if (rc)
        goto fail;
    *out = s;
    return 0;
fail:
    if (c)
        store_conn_put(s->store, c);
    svc_destroy(s);
    return rc;
}

void svc_destroy(svc_t *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    svc_notify_wake(s);
    if (s->sched_started)
        pthread_join(s->sched_thread, NULL);
    if (s->live_started)
        pthread_join(s->live_thread, NULL);
    if (s->notify_started)
        pthread_join(s->notify_thread, NULL);
    svc_notify_free(s);
    svc_janitor_stop(s);
    svc_jobents_free(s);
    svc_auth_free(s);
    pthread_mutex_destroy(&s->auth_mu);
    store_close(s->store);
    svc_sched_known_free(s);
    free(s->cap);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->cap_mu);
    pthread_mutex_destroy(&s->jobs_mu);
    pthread_mutex_destroy(&s->stale_mu);
    pthread_mutex_destroy(&s->note_mu);
    free(s->database_url);
    free(s->migrations_dir);
    free(s);
}

int svc_tx_begin(svc_t *s, svc_tx_t *tx, kiln_err_t *err)
{
    memset(tx, 0, sizeof(*tx));
    tx->s = s;
    int rc = store_conn_get(s->store, &tx->c, err);
    if (rc)
        return rc;
    rc = store_begin(tx->c, err);
    if (rc) {
        store_conn_put(s->store, tx->c);
        tx->c = NULL;
    }
    return rc;
}

int svc_tx_commit(svc_tx_t *tx, kiln_err_t *err)
{
    int rc = store_commit(tx->c, err);
    store_conn_put(tx->s->store, tx->c);
    tx->c = NULL;
    if (rc)
        return rc;
    for (int st = 0; st < JOB_STATE_COUNT_; st++)
        if (tx->ended[st] > 0) {
            char l[64];
            prom_add(&svc_prom_finished, prom_label_lower(l, sizeof l, "outcome", svc_state_name((svc_job_state_t)st)),
                     tx->ended[st]);
        }
    if (tx->wake_sched)
        svc_sched_wake(tx->s);
    return 0;
}

void svc_tx_abort(svc_tx_t *tx)
{
    if (!tx->c)
        return;
    store_rollback(tx->c);
    store_conn_put(tx->s->store, tx->c);
    tx->c = NULL;
}

uint64_t svc_cap_gen(svc_t *s)
{
    pthread_mutex_lock(&s->cap_mu);
    uint64_t g = s->cap_gen;
    pthread_mutex_unlock(&s->cap_mu);
    return g;
}

bool svc_cap_set(svc_t *s, store_worker_cap_t *cap, int n, uint64_t gen)
{
    pthread_mutex_lock(&s->cap_mu);
    bool fresh = s->cap_gen == gen;
    if (fresh) {
        free(s->cap);
        s->cap = cap;
        s->ncap = n;
        s->cap_gen++;
    }
    pthread_mutex_unlock(&s->cap_mu);
    if (!fresh)
        free(cap);
    return fresh;
}

int svc_cap_refresh(svc_t *s, store_conn_t *c, kiln_err_t *err)
{
    /* A concurrent replacement may carry an older read: read again until ours lands. */
    for (int tries = 0; tries < 5; tries++) {
        uint64_t gen = svc_cap_gen(s);
        store_worker_cap_t *cap = NULL;
        int n = 0;
        int rc = store_workers_capacity(c, &cap, &n, err);
        if (rc)
            return rc;
        if (svc_cap_set(s, cap, n, gen))
            return 0;
    }
    return 0;
}

int svc_ready(svc_t *s, kiln_err_t *err)
{
    store_conn_t *c = NULL;
    kiln_err_t e;
    kiln_err_clear(&e);
    int pending = 0;
    int rc = store_conn_get(s->store, &c, &e);
    if (rc == 0) {
        rc = store_ping(c, &e);
        if (rc == 0)
            rc = store_migrations_pending(c, s->migrations_dir, &pending, &e);
        store_conn_put(s->store, c);
    }
    if (rc)
        return kiln_err_set(err, KILN_EUNAVAIL, NULL, "database unavailable: %s", e.message);
    if (pending > 0)
        return kiln_err_set(err, KILN_EUNAVAIL, NULL, "%d database migration(s) not applied", pending);
    return 0;
}
