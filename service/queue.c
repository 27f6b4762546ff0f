/* queue.c - queues as the API sees them (/v1/queues, the gRPC queue methods): the one validator
 * of a queue's fields behind REST and gRPC, create/list/get/update/delete (cluster admins manage,
 * every user reads), the check a submitted job's queue passes, and the conversion of the stored
 * queues into the admission core's sched_queue_t (service/admit.c). */
#include "service/svc_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QUEUE_MAX_SLOTS 1000000
/* The most entries a queue's projects list has (each names a project once). */
#define QUEUE_MAX_PROJECTS 1000

static const char *const k_fields[] = {"name", "cohort", "quota", "borrowing_limit", "lending_limit", "weight",
                                       "projects", "fair_sharing", "preemption", NULL};

/* preemption's fields, each with its values (service.h: the admission core's names). */
static const struct {
    const char *key;
    const char *const *names;
} k_policies[] = {{"within_queue", sched_within_names}, {"reclaim_within_cohort", sched_reclaim_names}};
#define NPOLICIES (int)(sizeof k_policies / sizeof k_policies[0])

/* names as words for a message: "a, b or c". */
static void policy_words(const char *const names[], char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; names[i] && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%s", i == 0 ? "" : names[i + 1] ? ", " : " or ", names[i]);
}

/* The preemption policy v (a request's "preemption") over cur (the stored one, or NULL: a new
 * queue's defaults), into *out (new object with both fields): a field v gives replaces cur's, a
 * field v gives as null (or v null) takes its default. KILN_EINVAL naming the field for anything
 * else: not an object, an unknown field, a value not among the field's. */
static int preemption_field(const json_t *v, const json_t *cur, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    if (v && !json_is_null(v) && !json_is_object(v)) {
        kiln_err_set(err, KILN_EINVAL, "preemption", "preemption must be an object (or null for the defaults)");
        kiln_err_hint(err, "for example {\"within_queue\": \"never\", \"reclaim_within_cohort\": \"lower_priority\"}");
        return KILN_EINVAL;
    }
    const char *k;
    json_t *x;
    json_object_foreach(json_is_object(v) ? (json_t *)v : NULL, k, x) {
        bool known = false;
        for (int i = 0; i < NPOLICIES; i++)
            known = known || strcmp(k, k_policies[i].key) == 0;
        if (!known) {
            char f[96];
            snprintf(f, sizeof f, "preemption.%.60s", k);
            kiln_err_set(err, KILN_EINVAL, f, "unknown field \"%s\"", f);
            kiln_err_hint(err, "preemption's fields are within_queue and reclaim_within_cohort");
            return KILN_EINVAL;
        }
    }
    json_t *o = json_object();
    for (int i = 0; i < NPOLICIES; i++) {
        const char *key = k_policies[i].key;
        const json_t *given = json_is_object(v) ? json_object_get(v, key) : NULL;
        const json_t *now = json_is_null(v) ? NULL : json_object_get(cur, key);
        const char *name = k_policies[i].names[0];
        if (given && !json_is_null(given))
            name = json_string_value(given);
        else if (!given && now)
            name = json_string_value(now);
        if (sched_policy_parse(k_policies[i].names, name) < 0) {
            char f[64], words[96];
            snprintf(f, sizeof f, "preemption.%s", key);
            policy_words(k_policies[i].names, words, sizeof words);
            json_decref(o);
            if (json_is_string(given))
                kiln_err_set(err, KILN_EINVAL, f, "%s must be %s (got \"%.60s\")", f, words, name);
            else
                kiln_err_set(err, KILN_EINVAL, f, "%s must be %s", f, words);
            kiln_err_hint(err, "%s defaults to %s", f, k_policies[i].names[0]);
            return KILN_EINVAL;
        }
        json_object_set_new(o, key, json_string(name));
    }
    *out = o;
    return 0;
}

/* A {"cpu": n, "gpu": n} object: slot types cpu and gpu only, whole numbers 0..QUEUE_MAX_SLOTS.
 * With fill, the normalised copy has both slot types (a missing one is 0). *out = new object. */
static int slot_counts(const json_t *v, const char *field, bool fill, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    if (!json_is_object(v)) {
        kiln_err_set(err, KILN_EINVAL, field, "%s must be an object of slot counts", field);
        kiln_err_hint(err, "for example {\"cpu\": 8, \"gpu\": 0}");
        return KILN_EINVAL;
    }
    json_t *o = json_object();
    const char *k;
    json_t *n;
    json_object_foreach((json_t *)v, k, n) {
        char f[96];
        snprintf(f, sizeof f, "%s.%.40s", field, k);
        if (sched_slot_type(k) < 0) {
            json_decref(o);
            kiln_err_set(err, KILN_EINVAL, f, "%s names slot type \"%.40s\"", field, k);
            kiln_err_hint(err, "slot types are cpu and gpu");
            return KILN_EINVAL;
        }
        if (!json_is_integer(n) || json_integer_value(n) < 0 || json_integer_value(n) > QUEUE_MAX_SLOTS) {
            json_decref(o);
            return kiln_err_set(err, KILN_EINVAL, f, "%s must be a whole number of slots from 0 to %d", f,
                                QUEUE_MAX_SLOTS);
        }
        json_object_set(o, k, n);
    }
    if (fill)
        for (int t = 0; t < SCHED_NTYPES; t++)
            if (!json_object_get(o, sched_slot_type_name(t)))
                json_object_set_new(o, sched_slot_type_name(t), json_integer(0));
    *out = o;
    return 0;
}

/* Validates in (a request body: every field, or with base non-NULL a patch over base, the stored
 * queue) into *out: the queue's full set of fields, normalised. Projects named must exist. */
static int queue_fields(store_conn_t *c, const json_t *in, const json_t *base, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    if (!json_is_object(in))
        return kiln_err_set(err, KILN_EINVAL, NULL, "a queue must be a JSON object");
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)in, k, v) {
        bool known = false;
        for (int i = 0; k_fields[i]; i++)
            known = known || strcmp(k, k_fields[i]) == 0;
        if (!known) {
            kiln_err_set(err, KILN_EINVAL, k, "unknown field \"%.60s\"", k);
            kiln_err_hint(err, "a queue's fields are name, cohort, quota, borrowing_limit, lending_limit, weight, "
                               "projects, fair_sharing and preemption");
            return KILN_EINVAL;
        }
    }
    json_t *q = json_object();
    for (int i = 0; base && k_fields[i]; i++)
        json_object_set(q, k_fields[i], json_object_get(base, k_fields[i]) ? json_object_get(base, k_fields[i])
                                                                           : json_null());
    int rc = 0;
    const json_t *name = json_object_get(in, "name");
    if (base) {
        if (name && !json_equal(name, json_object_get(base, "name")))
            rc = kiln_err_set(err, KILN_EINVAL, "name", "a queue's name cannot change");
    } else if (!json_is_string(name) || !kiln_ident_ok(json_string_value(name))) {
        kiln_err_set(err, KILN_EINVAL, "name", name ? "queue name \"%.80s\" is not valid" : "a queue needs a name",
                     json_string_value(name) ? json_string_value(name) : "");
        kiln_err_hint(err, "use 1 to 63 characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit");
        rc = KILN_EINVAL;
    } else {
        json_object_set(q, "name", (json_t *)name);
    }
    const json_t *cohort = json_object_get(in, "cohort");
    if (rc == 0 && cohort) {
        if (!json_is_null(cohort) && (!json_is_string(cohort) || !kiln_ident_ok(json_string_value(cohort)))) {
            kiln_err_set(err, KILN_EINVAL, "cohort", "cohort must be a name (or null for none)");
            kiln_err_hint(err, "use 1 to 63 characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit");
            rc = KILN_EINVAL;
        } else {
            json_object_set(q, "cohort", (json_t *)cohort);
        }
    }
    const json_t *quota = json_object_get(in, "quota");
    if (rc == 0 && !base && !quota) {
        kiln_err_set(err, KILN_EINVAL, "quota", "a queue needs a quota");
        kiln_err_hint(err, "for example \"quota\": {\"cpu\": 8, \"gpu\": 0} (null: no limit)");
        rc = KILN_EINVAL;
    }
    if (rc == 0 && quota) {
        json_t *n = NULL;
        if (json_is_null(quota))
            json_object_set_new(q, "quota", json_null());
        else if ((rc = slot_counts(quota, "quota", true, &n, err)) == 0)
            json_object_set_new(q, "quota", n);
    }
    static const char *const limits[] = {"borrowing_limit", "lending_limit"};
    for (int l = 0; l < 2 && rc == 0; l++) {
        const json_t *lv = json_object_get(in, limits[l]);
        json_t *n = NULL;
        if (!lv)
            continue;
        if (json_is_null(lv))
            json_object_set_new(q, limits[l], json_object());
        else if ((rc = slot_counts(lv, limits[l], false, &n, err)) == 0)
            json_object_set_new(q, limits[l], n);
    }
    const json_t *weight = json_object_get(in, "weight");
    if (rc == 0 && weight) {
        double w = json_number_value(weight);
        if (!json_is_number(weight) || !isfinite(w) || w <= 0 || w > 1e6)
            rc = kiln_err_set(err, KILN_EINVAL, "weight", "weight must be a number above 0 and at most 1000000");
        else
            json_object_set_new(q, "weight", json_real(w));
    }
    const json_t *fair = json_object_get(in, "fair_sharing");
    if (rc == 0 && fair) {
        if (!json_is_boolean(fair))
            rc = kiln_err_set(err, KILN_EINVAL, "fair_sharing", "fair_sharing must be true or false");
        else
            json_object_set(q, "fair_sharing", (json_t *)fair);
    }
    const json_t *preemption = json_object_get(in, "preemption");
    if (rc == 0 && (preemption || !base)) {
        json_t *n = NULL;
        if ((rc = preemption_field(preemption, base ? json_object_get(base, "preemption") : NULL, &n, err)) == 0)
            json_object_set_new(q, "preemption", n);
    }
    const json_t *projects = json_object_get(in, "projects");
    if (rc == 0 && projects) {
        if (!json_is_array(projects)) {
            rc = kiln_err_set(err, KILN_EINVAL, "projects", "projects must be an array of project names "
                              "(\"*\": every project)");
        } else if (json_array_size(projects) > QUEUE_MAX_PROJECTS) {
            rc = kiln_err_set(err, KILN_EINVAL, "projects", "projects has %zu entries, more than the %d a queue takes",
                              json_array_size(projects), QUEUE_MAX_PROJECTS);
            kiln_err_hint(err, "\"*\" lets every project use the queue");
        }
        size_t i;
        json_t *p;
        json_array_foreach(projects, i, p) {
            if (rc)
                break;
            char f[32];
            snprintf(f, sizeof f, "projects[%zu]", i);
            const char *name_s = json_string_value(p);
            for (size_t k = 0; k < i && name_s && rc == 0; k++) {
                const char *prev = json_string_value(json_array_get(projects, k));
                if (prev && !strcmp(prev, name_s)) {
                    rc = kiln_err_set(err, KILN_EINVAL, f, "projects names \"%.80s\" twice (projects[%zu] and %s)",
                                      name_s, k, f);
                    kiln_err_hint(err, "name each project once");
                }
            }
            if (rc)
                break;
            bool exists = name_s && strcmp(name_s, "*") == 0;
            if (!exists && name_s && kiln_ident_ok(name_s))
                rc = store_project_exists(c, name_s, &exists, err);
            if (rc == 0 && !exists) {
                kiln_err_set(err, KILN_EINVAL, f, "project \"%.80s\" does not exist",
                             name_s ? name_s : "(not a string)");
                kiln_err_hint(err, "kiln projects list shows the projects; \"*\" lets every project use the queue");
                rc = KILN_EINVAL;
            }
        }
        if (rc == 0)
            json_object_set(q, "projects", (json_t *)projects);
    }
    /* defaults of a new queue */
    if (rc == 0 && !base) {
        if (!json_object_get(q, "cohort"))
            json_object_set_new(q, "cohort", json_null());
        for (int l = 0; l < 2; l++)
            if (!json_object_get(q, limits[l]))
                json_object_set_new(q, limits[l], json_object());
        if (!json_object_get(q, "weight"))
            json_object_set_new(q, "weight", json_real(1));
        if (!json_object_get(q, "projects"))
            json_object_set_new(q, "projects", json_pack("[s]", "*"));
        if (!json_object_get(q, "fair_sharing"))
            json_object_set_new(q, "fair_sharing", json_false());
    }
    /* what composes: limits only within a cohort; a cohort lends quotas, so its queues have one */
    bool in_cohort = rc == 0 && json_is_string(json_object_get(q, "cohort"));
    for (int l = 0; l < 2 && rc == 0; l++)
        if (!in_cohort && json_object_size(json_object_get(q, limits[l])) > 0) {
            kiln_err_set(err, KILN_EINVAL, limits[l], "%s needs a cohort: a queue without one neither borrows nor lends",
                         limits[l]);
            kiln_err_hint(err, "set \"cohort\", or leave %s out", limits[l]);
            rc = KILN_EINVAL;
        }
    if (rc == 0 && in_cohort && json_is_null(json_object_get(q, "quota"))) {
        kiln_err_set(err, KILN_EINVAL, "quota", "a queue in a cohort needs a quota (what it lends and keeps)");
        kiln_err_hint(err, "give it a quota such as {\"cpu\": 8, \"gpu\": 0}, or no cohort");
        rc = KILN_EINVAL;
    }
    if (rc) {
        json_decref(q);
        return rc;
    }
    *out = q;
    return 0;
}

/* *out = the queue called name (new reference). */
static int queue_get(store_conn_t *c, const char *name, json_t **out, kiln_err_t *err)
{
    json_t *arr = NULL;
    int rc = store_queues_json(c, name, &arr, err);
    if (rc == 0) {
        *out = json_incref(json_array_get(arr, 0));
        json_decref(arr);
    }
    return rc;
}

/* The queue q (an answer) as who may read it: its projects only those who can see (a member's
 * own projects and "*"; a cluster admin every one), as GET /v1/projects hides the others. A
 * queue's usage and pending are the cluster's and stay. */
static void queue_for(const svc_caller_t *who, json_t *q)
{
    json_t *projects = json_object_get(q, "projects");
    if (who->cluster_admin || !json_is_array(projects))
        return;
    json_t *seen = json_array();
    size_t i;
    json_t *p;
    json_array_foreach(projects, i, p) {
        const char *name = json_string_value(p);
        if (name && (!strcmp(name, "*") || svc_caller_role(who, name) != SVC_ROLE_NONE))
            json_array_append(seen, p);
    }
    json_object_set_new(q, "projects", seen);
}

int svc_queues_list(svc_t *s, const svc_caller_t *who, json_t **out, kiln_err_t *err)
{
    /* every user reads every queue, each with the projects it can see (queue_for) */
    *out = NULL;
    store_conn_t *c = NULL;
    json_t *arr = NULL;
    int rc = store_conn_get(s->store, &c, err);
    if (rc)
        return rc;
    rc = store_queues_json(c, NULL, &arr, err);
    store_conn_put(s->store, c);
    size_t i;
    json_t *q;
    json_array_foreach(rc == 0 ? arr : NULL, i, q)
        queue_for(who, q);
    if (rc == 0)
        *out = json_pack("{s:o}", "queues", arr);
    return rc;
}

int svc_queue_get(svc_t *s, const svc_caller_t *who, const char *name, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    store_conn_t *c = NULL;
    int rc = store_conn_get(s->store, &c, err);
    if (rc)
        return rc;
    rc = queue_get(c, name ? name : "", out, err);
    store_conn_put(s->store, c);
    if (rc == 0)
        queue_for(who, *out);
    return rc;
}

int svc_queue_create(svc_t *s, const svc_caller_t *who, const json_t *body, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    int rc = svc_trust_need_admin(who, "creating queues", err);
    if (rc)
        return rc;
    store_conn_t *c = NULL;
    json_t *q = NULL;
    rc = store_conn_get(s->store, &c, err);
    if (rc)
        return rc;
    rc = queue_fields(c, body, NULL, &q, err);
    if (rc == 0)
        rc = store_queue_insert(c, q, who->user, err);
    if (rc == 0)
        rc = queue_get(c, json_string_value(json_object_get(q, "name")), out, err);
    store_conn_put(s->store, c);
    if (rc == 0) {
        log_info("queue \"%s\" created by %s", json_string_value(json_object_get(q, "name")), who->user);
        svc_sched_wake(s);
    }
    json_decref(q);
    return rc;
}

/* Whether the queue q (JSON) lets project use it. */
static bool queue_allows(const json_t *q, const char *project)
{
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(q, "projects"), i, p)
        if (strcmp(json_string_value(p) ? json_string_value(p) : "", "*") == 0
            || strcmp(json_string_value(p) ? json_string_value(p) : "", project) == 0)
            return true;
    return false;
}

/* The names in arr (strings, or objects whose "project" is one) as words for a message into buf:
 * "a", "b" and, when they do not all fit (with the rest of a message, within kiln_err_t's), the
 * first ones and " and N more". */
static void project_words(const json_t *arr, char *buf, size_t n)
{
    size_t i, shown = 0;
    const json_t *p;
    buf[0] = '\0';
    json_array_foreach((json_t *)arr, i, p) {
        const char *pn = json_is_string(p) ? json_string_value(p) : json_string_value(json_object_get(p, "project"));
        size_t len = strlen(buf);
        if (shown == i && pn && len + strlen(pn) + 4 < n - 16) {
            snprintf(buf + len, n - len, "%s\"%s\"", i ? ", " : "", pn);
            shown++;
        }
    }
    if (json_array_size(arr) > shown) {
        size_t len = strlen(buf);
        snprintf(buf + len, n - len, " and %zu more", json_array_size(arr) - shown);
    }
}

/* KILN_ESTATE (field "projects") when q, a queue's new fields, no longer lets in a project whose
 * default queue it is: that project's jobs that name no queue would all be refused. */
static int queue_keeps_defaults(store_conn_t *c, const json_t *q, kiln_err_t *err)
{
    const char *name = json_string_value(json_object_get(q, "name"));
    json_t *projects = NULL;
    int rc = store_queue_default_of(c, name, &projects, err);
    if (rc)
        return rc;
    json_t *out = json_array();
    size_t i;
    json_t *p;
    json_array_foreach(projects, i, p)
        if (!queue_allows(q, json_string_value(p)))
            json_array_append(out, p);
    size_t n = json_array_size(out);
    const char *first = json_string_value(json_array_get(out, 0));
    char names[112];
    project_words(out, names, sizeof names);
    if (n == 1) {
        kiln_err_set(err, KILN_ESTATE, "projects", "queue \"%.80s\" is the default queue of project %s, which "
                     "projects would no longer let in", name, names);
        kiln_err_hint(err, "give project %s another default queue first (kiln projects update %s --default-queue "
                      "QUEUE), or keep it in projects", first, first);
        rc = KILN_ESTATE;
    } else if (n > 1) {
        kiln_err_set(err, KILN_ESTATE, "projects", "queue \"%.80s\" is the default queue of projects %s, which "
                     "projects would no longer let in", name, names);
        kiln_err_hint(err, "give them another default queue first (kiln projects update PROJECT --default-queue "
                           "QUEUE), or keep them in projects");
        rc = KILN_ESTATE;
    }
    json_decref(out);
    json_decref(projects);
    return rc;
}

/* KILN_ESTATE (field "projects") when q, a queue's new fields, no longer lets in a project that
 * has jobs waiting, running or paused in it, or a running tuning job whose next trials go to it:
 * as DELETE refuses a queue its jobs use, the change waits until they end or are stopped, so no
 * job stays in a queue its project may not use and no trial is submitted to one. */
static int queue_keeps_jobs(store_conn_t *c, const json_t *q, kiln_err_t *err)
{
    const char *name = json_string_value(json_object_get(q, "name"));
    json_t *left = NULL;
    int rc = store_queue_jobs_left_out(c, name, json_object_get(q, "projects"), &left, err);
    if (rc || json_array_size(left) == 0) {
        json_decref(left);
        return rc;
    }
    json_int_t waiting = 0, running = 0, paused = 0, tuning = 0;
    size_t i, n = json_array_size(left);
    json_t *p;
    json_array_foreach(left, i, p) {
        waiting += json_integer_value(json_object_get(p, "waiting"));
        running += json_integer_value(json_object_get(p, "running"));
        paused += json_integer_value(json_object_get(p, "paused"));
        tuning += json_integer_value(json_object_get(p, "tuning"));
    }
    char names[112];
    project_words(left, names, sizeof names);
    json_int_t jobs = waiting + running + paused;
    char what[256];
    size_t len = 0;
    if (jobs) {
        len = (size_t)snprintf(what, sizeof what, "%lld job(s) of project%s %s (%lld waiting, %lld running",
                               (long long)jobs, n > 1 ? "s" : "", names, (long long)waiting, (long long)running);
        if (paused)
            len += (size_t)snprintf(what + len, sizeof what - len, ", %lld paused", (long long)paused);
        len += (size_t)snprintf(what + len, sizeof what - len, ")%s", tuning ? " and " : "");
    }
    if (tuning && len < sizeof what)
        snprintf(what + len, sizeof what - len, "%lld running tuning job(s)%s%s%s that submit their next trials to it",
                 (long long)tuning, jobs ? "" : " of project", jobs ? "" : n > 1 ? "s " : " ", jobs ? "" : names);
    const char *first = json_string_value(json_object_get(json_array_get(left, 0), "project"));
    kiln_err_set(err, KILN_ESTATE, "projects", "queue \"%.80s\" has %s, which projects would no longer let in", name,
                 what);
    const char *list = tuning ? "; kiln tune list lists its tuning jobs" : "";
    if (n == 1)
        kiln_err_hint(err, "stop them or let them end, then remove the project (kiln search 'project = \"%s\" AND "
                      "queue = \"%s\"' lists its jobs%s)", first, name, list);
    else
        kiln_err_hint(err, "stop them or let them end, then remove the projects (kiln search 'project = \"%s\" AND "
                      "queue = \"%s\"' lists the first one's jobs%s)", first, name, list);
    if (paused || tuning)
        kiln_err_detail(err, "%s%s%s", paused ? "a paused trial goes back to its queue when its tuning job promotes "
                                                "it: it ends when its tuning job ends it or is stopped" : "",
                        paused && tuning ? "; " : "",
                        tuning ? "a running tuning job submits its next trials to its queue until it ends or is "
                                 "stopped" : "");
    json_decref(left);
    return KILN_ESTATE;
}

int svc_queue_update(svc_t *s, const svc_caller_t *who, const char *name, const json_t *patch, json_t **out,
                     kiln_err_t *err)
{
    *out = NULL;
    int rc = svc_trust_need_admin(who, "changing queues", err);
    if (rc)
        return rc;
    json_t *cur = NULL, *q = NULL;
    svc_tx_t tx;
    rc = svc_tx_begin(s, &tx, err);
    if (rc)
        return rc;
    /* The queue's row stays locked until the change commits: a project that takes it as its
     * default queue meanwhile waits, then sees the new projects (svc_queue_check_default). */
    rc = store_queue_lock(tx.c, name ? name : "", true, err);
    if (rc == 0)
        rc = queue_get(tx.c, name ? name : "", &cur, err);
    if (rc == 0)
        rc = queue_fields(tx.c, patch, cur, &q, err);
    if (rc == 0)
        rc = queue_keeps_defaults(tx.c, q, err);
    if (rc == 0 && json_object_get(patch, "projects"))
        rc = queue_keeps_jobs(tx.c, q, err);
    if (rc == 0)
        rc = store_queue_update(tx.c, q, err);
    if (rc == 0)
        rc = queue_get(tx.c, name, out, err);
    if (rc == 0)
        rc = svc_tx_commit(&tx, err);
    else
        svc_tx_abort(&tx);
    if (rc) {
        json_decref(*out);
        *out = NULL;
    }
    if (rc == 0) {
        log_info("queue \"%s\" changed by %s", name, who->user);
        svc_sched_wake(s);
    }
    json_decref(cur);
    json_decref(q);
    return rc;
}

int svc_queue_delete(svc_t *s, const svc_caller_t *who, const char *name, kiln_err_t *err)
{
    int rc = svc_trust_need_admin(who, "deleting queues", err);
    if (rc)
        return rc;
    if (name && strcmp(name, "default") == 0) {
        kiln_err_set(err, KILN_ESTATE, "name", "the queue \"default\" cannot be deleted");
        kiln_err_hint(err, "jobs that name no queue use it; change its projects or quota instead");
        return KILN_ESTATE;
    }
    svc_tx_t tx;
    rc = svc_tx_begin(s, &tx, err);
    if (rc)
        return rc;
    /* The queue's row locked first, so that a job or tuning job entering it (whose insert holds
     * the row FOR KEY SHARE) has committed, and is counted, before the delete's own statement
     * reads what the queue holds; one that comes later waits, then finds no queue. */
    rc = store_queue_lock(tx.c, name ? name : "", true, err);
    if (rc == 0)
        rc = store_queue_delete(tx.c, name ? name : "", err);
    if (rc == 0)
        rc = svc_tx_commit(&tx, err);
    else
        svc_tx_abort(&tx);
    if (rc == 0)
        log_info("queue \"%s\" deleted by %s", name, who->user);
    return rc;
}

/* ---- the admission core's view ------------------------------------------------------------- */

static void counts(const json_t *o, int *dst, int dflt)
{
    for (int t = 0; t < SCHED_NTYPES; t++) {
        const json_t *v = json_object_get(o, sched_slot_type_name(t));
        dst[t] = json_is_integer(v) ? (int)json_integer_value(v) : dflt;
    }
}

int svc_queues_to_sched(const json_t *queues, sched_queue_t **out, int *n)
{
    *n = (int)json_array_size(queues);
    *out = calloc((size_t)KILN_MAX(*n, 1), sizeof(**out));
    if (!*out)
        return KILN_ENOMEM;
    for (int i = 0; i < *n; i++) {
        const json_t *j = json_array_get(queues, (size_t)i);
        sched_queue_t *q = &(*out)[i];
        q->name = json_string_value(json_object_get(j, "name"));
        q->cohort = json_string_value(json_object_get(j, "cohort"));
        const json_t *quota = json_object_get(j, "quota");
        counts(quota, q->quota, json_is_object(quota) ? 0 : SCHED_UNLIMITED);
        counts(json_object_get(j, "borrowing_limit"), q->borrowing_limit, SCHED_UNLIMITED);
        counts(json_object_get(j, "lending_limit"), q->lending_limit, SCHED_UNLIMITED);
        q->weight = json_number_value(json_object_get(j, "weight"));
        q->fair_projects = json_is_true(json_object_get(j, "fair_sharing"));
        const json_t *pre = json_object_get(j, "preemption");
        int w = sched_policy_parse(sched_within_names, json_string_value(json_object_get(pre, "within_queue")));
        int r = sched_policy_parse(sched_reclaim_names, json_string_value(json_object_get(pre, "reclaim_within_cohort")));
        q->within = w < 0 ? SCHED_WITHIN_LOWER_PRIORITY : (sched_within_t)w;
        q->reclaim = r < 0 ? SCHED_RECLAIM_ANY : (sched_reclaim_t)r;
    }
    return 0;
}

/* The index in all (the stored queues) of queue, which project must be allowed to use: -1 with
 * KILN_EINVAL naming field when it does not exist or the project may not use it; what names the
 * queue (a spec, or the project's default) is said by whose. */
static int queue_usable(const json_t *all, const char *queue, const char *project, const char *field,
                        const char *whose, int *qi, kiln_err_t *err)
{
    *qi = -1;
    for (size_t i = 0; i < json_array_size(all); i++)
        if (strcmp(json_string_value(json_object_get(json_array_get(all, i), "name")), queue) == 0)
            *qi = (int)i;
    if (*qi < 0) {
        kiln_err_set(err, KILN_EINVAL, field, "queue \"%.80s\"%s does not exist", queue, whose);
        kiln_err_hint(err, "kiln queues list shows the queues; a job that names no queue uses its project's "
                           "default queue (kiln projects list shows it)");
        return KILN_EINVAL;
    }
    if (!queue_allows(json_array_get(all, (size_t)*qi), project)) {
        kiln_err_set(err, KILN_EINVAL, field, "project \"%.80s\" may not use queue \"%.80s\"%s", project, queue, whose);
        kiln_err_hint(err, "kiln queues describe %s shows which of your projects may; a cluster admin can add yours",
                      queue);
        *qi = -1;
        return KILN_EINVAL;
    }
    return 0;
}

int svc_queue_check_default(store_conn_t *c, const char *queue, const char *project, kiln_err_t *err)
{
    json_t *all = NULL;
    int qi = -1;
    int rc = store_queue_lock(c, queue, false, err);
    if (rc == 0)
        rc = store_queue_defs_json(c, queue, &all, err);
    if (rc == 0)
        rc = queue_usable(all, queue, project, "default_queue", "", &qi, err);
    json_decref(all);
    return rc;
}

int svc_queue_resolve_job(store_conn_t *c, char queue[64], const char *project, const char *slot_type, int slots,
                          kiln_err_t *err)
{
    const char *whose = "";
    int rc = 0;
    if (!queue[0]) {
        rc = store_project_default_queue(c, project, queue, err);
        if (rc)
            return rc;
        whose = " (the project's default queue)";
    }
    json_t *all = NULL;
    rc = store_queue_defs_json(c, queue, &all, err);
    if (rc)
        return rc;
    sched_queue_t *qs = NULL;
    int nq = 0, qi = -1;
    if ((rc = queue_usable(all, queue, project, "queue", whose, &qi, err)) == 0
        && (rc = svc_queues_to_sched(all, &qs, &nq)) == 0) {
        int t = sched_slot_type(slot_type);
        /* what bounds it, in words: the queue's own quota or borrowing limit, or what the other
         * queues of its cohort lend (their quotas and lending limits, not this queue's) */
        const char *which = NULL;
        char bound[256];
        int max = t < 0 ? SCHED_UNLIMITED : sched_quota_bound(qs, nq, qi, t, &which, bound, sizeof bound);
        if (max != SCHED_UNLIMITED && slots > max) {
            const sched_queue_t *Q = &qs[qi];
            kiln_err_set(err, KILN_EUNFIT, "queue", "the job needs %d %s slot(s), more than queue \"%.80s\" can ever "
                         "get: %s", slots, slot_type, queue, bound);
            if (!strcmp(which, "lending_limit")) {
                kiln_err_detail(err, "a queue of a cohort lends its unused quota up to its own lending_limit; what "
                                "queue \"%.80s\" may borrow is what the others lend", queue);
                kiln_err_hint(err, "ask for fewer slots, use another queue, or ask a cluster admin to raise the "
                              "quotas or lending limits of cohort \"%.80s\" (kiln queues lists them)", Q->cohort);
            } else {
                kiln_err_hint(err, "ask for fewer slots, use another queue, or ask a cluster admin to raise the "
                              "queue's %s (kiln queues update %.80s)", which, queue);
            }
            rc = KILN_EUNFIT;
        }
    }
    free(qs);
    json_decref(all);
    return rc;
}
