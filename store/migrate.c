/* migrate.c - the migrations runner: applies migrations/NNNN_*.sql in order, each in its own
 * transaction, records them in schema_migrations, and holds an advisory lock meanwhile so that
 * several kilnd starting at once apply each migration exactly once. */
#include "store/store_int.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Advisory lock key: "kiln" "migr" as ASCII. Any fixed 64-bit value works. */
#define MIGRATE_LOCK_KEY "7596502640931793266"

typedef struct mig_list {
    store_migration_t *items;
    char **owned;                 /* heap strings to free (directory mode) */
    int n, nowned;
} mig_list_t;

static void mig_list_free(mig_list_t *l)
{
    for (int i = 0; i < l->nowned; i++)
        free(l->owned[i]);
    free(l->owned);
    free(l->items);
    memset(l, 0, sizeof(*l));
}

static int cmp_mig(const void *a, const void *b)
{
    return strcmp(((const store_migration_t *)a)->version, ((const store_migration_t *)b)->version);
}

/* Loads the migrations from dir (NULL: embedded), sorted by version. */
static int mig_list_load(const char *dir, mig_list_t *l, kiln_err_t *err)
{
    memset(l, 0, sizeof(*l));
    if (!dir) {
        l->items = calloc((size_t)store_migrations_embedded_count + 1, sizeof(*l->items));
        if (!l->items)
            return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        for (int i = 0; i < store_migrations_embedded_count; i++)
            l->items[i] = store_migrations_embedded[i];
        l->n = store_migrations_embedded_count;
        qsort(l->items, (size_t)l->n, sizeof(*l->items), cmp_mig);
        return 0;
    }
    DIR *d = opendir(dir);
    if (!d)
        return kiln_err_set(err, KILN_EIO, "migrations-dir", "could not open migrations directory \"%s\"", dir);
    int cap = 0, rc = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);
        if (len < 5 || strcmp(de->d_name + len - 4, ".sql") != 0 || de->d_name[0] == '.')
            continue;
        if (l->n + 1 >= cap) {
            cap = cap ? cap * 2 : 16;
            l->items = realloc(l->items, (size_t)cap * sizeof(*l->items));
            l->owned = realloc(l->owned, (size_t)cap * 2 * sizeof(char *));
            if (!l->items || !l->owned) {
                rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
                break;
            }
        }
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        char *text = NULL;
        size_t tlen = 0;
        rc = kiln_file_read(path, &text, &tlen, err);
        if (rc)
            break;
        char *version = strndup(de->d_name, len - 4);
        l->owned[l->nowned++] = text;
        l->owned[l->nowned++] = version;
        l->items[l->n].version = version;
        l->items[l->n].sql = text;
        l->n++;
    }
    closedir(d);
    if (rc) {
        mig_list_free(l);
        return rc;
    }
    if (l->n > 0)
        qsort(l->items, (size_t)l->n, sizeof(*l->items), cmp_mig);
    return 0;
}

static const char *SQL_CREATE_TABLE =
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    " version text PRIMARY KEY,"
    " applied_at timestamptz NOT NULL DEFAULT now())";

static bool is_applied(PGresult *applied, const char *version)
{
    for (int i = 0; i < PQntuples(applied); i++)
        if (strcmp(PQgetvalue(applied, i, 0), version) == 0)
            return true;
    return false;
}

int store_migrate(store_conn_t *c, const char *dir, int *applied, kiln_err_t *err)
{
    mig_list_t list;
    PGresult *done = NULL;
    bool locked = false;
    int n_applied = 0;
    if (applied)
        *applied = 0;
    int rc = mig_list_load(dir, &list, err);
    if (rc)
        return rc;

    /* Session-level lock: concurrent appliers queue here; the winner applies, the others then
     * find everything recorded. */
    rc = store_q(c, "take the migrations lock", "SELECT pg_advisory_lock(" MIGRATE_LOCK_KEY ")", 0,
                 NULL, NULL, err);
    if (rc)
        goto fail;
    locked = true;
    rc = store_q(c, "create schema_migrations", SQL_CREATE_TABLE, 0, NULL, NULL, err);
    if (rc)
        goto fail;
    rc = store_q(c, "read schema_migrations", "SELECT version FROM schema_migrations", 0, NULL,
                 &done, err);
    if (rc)
        goto fail;

    for (int i = 0; i < list.n; i++) {
        const store_migration_t *m = &list.items[i];
        if (is_applied(done, m->version))
            continue;
        rc = store_begin(c, err);
        if (rc)
            goto fail;
        char what[300];
        snprintf(what, sizeof(what), "apply migration %s", m->version);
        rc = store_q_script(c, what, m->sql, err);
        if (rc) {
            store_rollback(c);
            goto fail;
        }
        const char *params[1] = {m->version};
        rc = store_q(c, "record a migration", "INSERT INTO schema_migrations (version) VALUES ($1)",
                     1, params, NULL, err);
        if (rc) {
            store_rollback(c);
            goto fail;
        }
        rc = store_commit(c, err);
        if (rc)
            goto fail;
        log_info("store: applied migration %s", m->version);
        n_applied++;
    }
    if (applied)
        *applied = n_applied;
fail:
    PQclear(done);
    if (locked)
        store_unlock(c, MIGRATE_LOCK_KEY);
    mig_list_free(&list);
    return rc;
}

int store_migrations_pending(store_conn_t *c, const char *dir, int *pending, kiln_err_t *err)
{
    mig_list_t list;
    PGresult *done = NULL;
    *pending = 0;
    int rc = mig_list_load(dir, &list, err);
    if (rc)
        return rc;
    rc = store_q(c, "read schema_migrations",
                 "SELECT version FROM schema_migrations", 0, NULL, &done, err);
    if (rc) {
        /* No table yet: everything is pending. */
        *pending = list.n;
        goto out;
    }
    for (int i = 0; i < list.n; i++)
        if (!is_applied(done, list.items[i].version))
            (*pending)++;
out:
    PQclear(done);
    mig_list_free(&list);
    return rc;
}
