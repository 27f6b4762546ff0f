/* tune.c - tuning jobs: submission (one validator, spec/tuning.c, behind REST and gRPC), reads,
 * stop requests, and the controller pass the leader runs with the scheduler: it reads each
 * running tuning job and its trials from the database, lets tune_decide (tune_search.c) choose,
 * and submits trials as ordinary jobs (svc_job_create), stops them, or ends the tuning job. All
 * its state is in the database, so a restarted or newly elected kilnd carries on where the last
 * pass stopped; a trial's job is created under an idempotency key made of the tuning job's id and
 * the trial's number, so a pass cut short never submits a trial twice. */
#include "service/svc_int.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/tuning_states.h"
#include "spec/spec.h"

static int bad_tuning_id(kiln_err_t *err, const char *id)
{
    if (svc_check_str("id", id, 0, err))
        return KILN_EINVAL;
    kiln_err_set(err, KILN_ENOTFOUND, "id", "tuning job \"%.80s\" not found", id ? id : "");
    kiln_err_hint(err, "`kiln tune list` (GET /v1/tuning-jobs) lists the tuning jobs you can see");
    return KILN_ENOTFOUND;
}

/* Reads tuning job id (for_update: locked in c's transaction) if the caller has need in its
 * project; KILN_ENOTFOUND when it cannot see it. */
static int tuning_read(store_conn_t *c, const svc_caller_t *who, const char *id, svc_role_t need, bool for_update,
                       json_t **out, kiln_err_t *err)
{
    *out = NULL;
    if (!store_is_uuid(id))
        return bad_tuning_id(err, id);
    int rc = store_tuning_get_json(c, id, for_update, out, err);
    if (rc)
        return rc;
    const char *project = json_string_value(json_object_get(*out, "project"));
    if (svc_caller_role(who, project) == SVC_ROLE_NONE) {
        json_decref(*out);
        *out = NULL;
        return bad_tuning_id(err, id);
    }
    rc = svc_project_need(who, project, need, err);
    if (rc) {
        json_decref(*out);
        *out = NULL;
    }
    return rc;
}

/* A trial's state as the tuning job shows it and as tune_decide sees it. */
static tune_trial_state_t trial_state(const json_t *tr, int nrungs)
{
    const char *st = json_string_value(json_object_get(tr, "job_state"));
    svc_job_state_t js = svc_state_parse(st ? st : "");
    if (js == JOB_STATE_FAILED)
        return TUNE_TRIAL_FAILED;
    if (js == JOB_STATE_STOPPED)
        return TUNE_TRIAL_STOPPED;
    if (js == JOB_STATE_COMPLETED)
        return TUNE_TRIAL_COMPLETED;
    /* a hyperband trial at its rung; one promoted (rung past the rungs it finished) runs again */
    if (js == JOB_STATE_PAUSED)
        return (int)json_integer_value(json_object_get(tr, "rung")) < nrungs + 1 ? TUNE_TRIAL_PAUSED : TUNE_TRIAL_ACTIVE;
    return TUNE_TRIAL_ACTIVE;
}

/* The view of the trials (arrays sized ntrials, strings borrowed from trials or kept in names). */
typedef struct view_buf {
    tune_trial_t *trials;
    char (*reported)[512];
    int64_t **steps;                  /* each trial's curve, when curves were given */
    double **values;
    int n;
} view_buf_t;

/* Trial x's curve from curves (store_tuning_curves_json), into arrays vb keeps at [i]. */
static int curve_build(const json_t *curves, view_buf_t *vb, size_t i, tune_trial_t *x)
{
    char key[64];
    snprintf(key, sizeof key, "%.40s%s%d", x->parent ? x->parent : "", x->parent ? ":" : "", x->trial);
    const json_t *cv = json_object_get(curves, key), *st = json_object_get(cv, "steps"),
                 *va = json_object_get(cv, "values");
    size_t m = KILN_MIN(json_array_size(st), json_array_size(va));
    if (m == 0)
        return 0;
    vb->steps[i] = malloc(sizeof(int64_t) * m);
    vb->values[i] = malloc(sizeof(double) * m);
    if (!vb->steps[i] || !vb->values[i])
        return KILN_ENOMEM;
    for (size_t k = 0; k < m; k++) {
        vb->steps[i][k] = json_integer_value(json_array_get(st, k));
        vb->values[i][k] = json_number_value(json_array_get(va, k));
    }
    x->curve = (tune_curve_t){.steps = vb->steps[i], .values = vb->values[i], .n = (int)m};
    return 0;
}

/* curves: NULL, or each trial's objective by step (store_tuning_curves_json). */
static int view_build(const spec_tuning_t *t, const json_t *trials, const json_t *curves, view_buf_t *vb,
                      const char **last_failure)
{
    size_t n = json_array_size(trials);
    vb->n = (int)n;
    vb->trials = calloc(n ? n : 1, sizeof *vb->trials);
    vb->reported = calloc(n ? n : 1, sizeof *vb->reported);
    vb->steps = calloc(n ? n : 1, sizeof *vb->steps);
    vb->values = calloc(n ? n : 1, sizeof *vb->values);
    if (!vb->trials || !vb->reported || !vb->steps || !vb->values)
        return KILN_ENOMEM;
    *last_failure = NULL;
    for (size_t i = 0; i < n; i++) {
        const json_t *tr = json_array_get(trials, i);
        tune_trial_t *x = &vb->trials[i];
        x->trial = (int)json_integer_value(json_object_get(tr, "trial"));
        x->job_id = json_string_value(json_object_get(tr, "job_id"));
        const json_t *ro = json_object_get(tr, "rung_objectives");
        x->nrungs = (int)KILN_MIN(json_array_size(ro), SPEC_TUNE_MAX_RUNGS);
        for (int k = 0; k < x->nrungs; k++)
            x->rung_objective[k] = json_number_value(json_array_get(ro, (size_t)k));
        x->parent = json_string_value(json_object_get(tr, "parent"));
        x->values = json_object_get(tr, "parameters");
        x->state = trial_state(tr, x->nrungs);
        /* a warm start parent's trials are history in this job's first bracket (their rung results
         * were mapped onto its rungs) */
        x->bracket = x->parent ? 0 : tune_trial_bracket(t, x->trial);
        if (x->parent && (x->state == TUNE_TRIAL_ACTIVE || x->state == TUNE_TRIAL_PAUSED))
            x->state = TUNE_TRIAL_STOPPED; /* its tuning job has ended: history, never this job's to run */
        const json_t *metrics = json_object_get(tr, "metrics");
        const json_t *v = json_object_get(metrics, t->metric);
        x->has_objective = json_is_number(v);
        x->objective = json_number_value(v);
        const char *key;
        json_t *mv;
        size_t o = 0;
        json_object_foreach((json_t *)metrics, key, mv) {
            (void)mv;
            if (o + strlen(key) + 3 < sizeof vb->reported[i])
                o += (size_t)snprintf(vb->reported[i] + o, sizeof vb->reported[i] - o, "%s%s", o ? ", " : "", key);
        }
        x->reported = vb->reported[i];
        x->total_steps = json_integer_value(json_object_get(tr, "total_steps"));
        if (curves && curve_build(curves, vb, i, x))
            return KILN_ENOMEM;
        if (x->state == TUNE_TRIAL_FAILED && !x->parent)
            *last_failure = json_string_value(json_object_get(tr, "job_reason"));
    }
    return 0;
}

static void view_free(view_buf_t *vb)
{
    for (int i = 0; i < vb->n && vb->steps && vb->values; i++) {
        free(vb->steps[i]);
        free(vb->values[i]);
    }
    free(vb->steps);
    free(vb->values);
    free(vb->trials);
    free(vb->reported);
}

/* Hyperband trial x's finished rungs as the API shows them: [{"rung", "steps", "objective"}]
 * (steps: its bracket's rung; objective: the value it reported there), its last rung too when it
 * completed there (reached: the step it got to); [] for the other strategies. */
static json_t *rungs_json(const spec_tuning_t *t, const tune_trial_t *x, int64_t reached)
{
    int64_t steps[SPEC_TUNE_MAX_RUNGS];
    /* a warm start parent's trial: its results sit on this job's first bracket's rungs */
    int nr = x->parent ? tune_rungs(t, steps) : tune_trial_rungs(t, x->trial, steps), k;
    json_t *a = json_array();
    for (k = 0; k < x->nrungs && k < nr - 1; k++)
        json_array_append_new(a, json_pack("{s:i, s:I, s:f}", "rung", k, "steps", (json_int_t)steps[k], "objective",
                                           x->rung_objective[k]));
    if (nr > 0 && k == nr - 1 && x->state == TUNE_TRIAL_COMPLETED && x->has_objective && reached == steps[k])
        json_array_append_new(a, json_pack("{s:i, s:I, s:f}", "rung", k, "steps", (json_int_t)steps[k], "objective",
                                           x->objective));
    return a;
}

/* Warm start: appends the trials of t's parents to trials, each with "parent": its tuning job's id
 * and its rung objectives at the rungs of t that train to the same steps (the prefix that does),
 * and *tried = every configuration a parent ran (caller owns). With curves (early_stopping), the
 * parents' curves join it keyed "<parent>:<trial>". A parent that no longer exists is skipped. */
static int history_load(store_conn_t *c, const spec_tuning_t *t, json_t *trials, json_t *curves, json_t **tried,
                        kiln_err_t *err)
{
    *tried = json_array();
    if (!*tried)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    int64_t rungs[SPEC_TUNE_MAX_RUNGS];
    int nr = tune_rungs(t, rungs);
    for (int k = 0; k < t->nparents; k++) {
        json_t *row = NULL, *ptrials = NULL, *pcurves = NULL;
        spec_tuning_t pt;
        kiln_err_t e2;
        int rc = store_tuning_get_json(c, t->parents[k], false, &row, err);
        if (rc == KILN_ENOTFOUND) {
            kiln_err_clear(err);
            continue; /* deleted since: its history went with it */
        }
        if (rc)
            return rc;
        int64_t prungs[SPEC_TUNE_MAX_RUNGS];
        int pnr = 0;
        if (spec_tuning_load(json_object_get(row, "spec"), &pt, &e2) == 0) {
            pnr = tune_rungs(&pt, prungs);
            spec_tuning_deinit(&pt);
        }
        json_decref(row);
        if ((rc = store_tuning_trials_json(c, t->parents[k], &ptrials, err)) ||
            (curves && (rc = store_tuning_curves_json(c, t->parents[k], t->metric, &pcurves, err)))) {
            json_decref(ptrials);
            return rc;
        }
        size_t i;
        json_t *tr;
        json_array_foreach(ptrials, i, tr) {
            json_array_append(*tried, json_object_get(tr, "parameters"));
            json_object_set_new(tr, "parent", json_string(t->parents[k]));
            /* its objective at our rung j where it trained to the same steps */
            json_t *ro = json_object_get(tr, "rung_objectives"), *mine = json_array();
            for (int j = 0; j < nr && mine; j++) {
                int m = 0;
                while (m < pnr && prungs[m] != rungs[j])
                    m++;
                if (m == pnr || (size_t)m >= json_array_size(ro))
                    break;
                json_array_append(mine, json_array_get(ro, (size_t)m));
            }
            json_object_set_new(tr, "rung_objectives", mine ? mine : json_array());
            json_array_append(trials, tr);
        }
        const char *key;
        json_t *cv;
        json_object_foreach(pcurves, key, cv) {
            char k2[64];
            snprintf(k2, sizeof k2, "%s:%.16s", t->parents[k], key);
            json_object_set(curves, k2, cv);
        }
        json_decref(ptrials);
        json_decref(pcurves);
    }
    return 0;
}

/* The tuning job as the API shows it: its row, its request's main fields, trials, best, events. */
static int tuning_json(store_conn_t *c, json_t *row, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    const char *id = json_string_value(json_object_get(row, "id"));
    json_t *trials = NULL, *events = NULL, *tried = NULL, *spec = json_object_get(row, "spec");
    spec_tuning_t t;
    kiln_err_t e2;
    int rc = spec_tuning_load(spec, &t, &e2);
    if (rc)
        return kiln_err_set(err, KILN_EINTERNAL, NULL, "tuning job %s holds a request kilnd cannot read: %s", id,
                            e2.message);
    if ((rc = store_tuning_trials_json(c, id, &trials, err)) || (rc = store_tuning_events_json(c, id, &events, err)) ||
        (rc = history_load(c, &t, trials, NULL, &tried, err)))
        goto out;
    view_buf_t vb = {0};
    const char *last_failure = NULL;
    if (view_build(&t, trials, NULL, &vb, &last_failure)) {
        view_free(&vb);
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto out;
    }
    json_t *list = json_array();
    tune_view_t view = {.t = &t, .trials = vb.trials, .ntrials = vb.n, .tried = tried};
    int best = tune_best(&view);
    for (int i = 0; i < vb.n; i++) {
        const json_t *tr = json_array_get(trials, (size_t)i);
        const tune_trial_t *x = &vb.trials[i];
        const char *job_state = json_string_value(json_object_get(tr, "job_state"));
        /* the steps it trained: where it is, and what it trained before restarting from step 0
         * (--tune-promoted-restart) */
        int64_t reached = json_integer_value(json_object_get(tr, "steps"));
        json_int_t trained = (json_int_t)(reached + json_integer_value(json_object_get(tr, "retrained_steps")));
        json_array_append_new(
            list, json_pack("{s:i, s:O, s:O, s:o, s:I, s:O, s:s}", "trial", x->trial, "job_id",
                            json_object_get(tr, "job_id"), "parameters", json_object_get(tr, "parameters"),
                            "objective", x->has_objective ? json_real(x->objective) : json_null(), "steps",
                            trained, "rung", json_object_get(tr, "rung"), "state", job_state ? job_state : ""));
        json_t *why = json_object_get(tr, "stop_reason");
        why = json_is_string(why) ? why : json_object_get(tr, "job_reason");
        json_t *item = json_array_get(list, json_array_size(list) - 1);
        json_object_set_new(item, "reason", json_string(json_is_string(why) ? json_string_value(why) : ""));
        json_object_set_new(item, "rungs", rungs_json(&t, x, reached));
        if (x->parent)
            json_object_set_new(item, "parent", json_string(x->parent));
    }
    json_t *o = json_deep_copy(row);
    json_object_del(o, "next_trial");
    json_object_set_new(o, "strategy", json_string(spec_tune_strategy_name(t.strategy)));
    json_object_set(o, "objective", json_object_get(spec, "objective"));
    json_object_set_new(o, "max_jobs", json_integer(t.max_jobs));
    json_object_set_new(o, "max_parallel_jobs", json_integer(t.max_parallel_jobs));
    json_object_set_new(o, "seed", json_integer((json_int_t)t.seed));
    json_object_set_new(o, "trials", list);
    json_object_set_new(o, "best", best < 0 ? json_null()
                                            : json_pack("{s:O, s:f, s:O, s:o}", "job_id",
                                                        json_object_get(json_array_get(trials, (size_t)best), "job_id"),
                                                        "objective", vb.trials[best].objective, "parameters",
                                                        json_object_get(json_array_get(trials, (size_t)best),
                                                                        "parameters"),
                                                        "parent", vb.trials[best].parent
                                                                      ? json_string(vb.trials[best].parent)
                                                                      : json_null()));
    json_object_set(o, "warm_start", t.nparents ? json_object_get(spec, "warm_start") : json_null());
    json_object_set(o, "events", events);
    view_free(&vb);
    *out = o;
out:
    spec_tuning_deinit(&t);
    json_decref(trials);
    json_decref(events);
    json_decref(tried);
    return rc;
}

/* Whether a and b name the same parameters. */
static bool same_names(const spec_tuning_t *a, const spec_tuning_t *b)
{
    if (a->nparams != b->nparams)
        return false;
    for (int i = 0; i < a->nparams; i++) {
        bool found = false;
        for (int k = 0; k < b->nparams && !found; k++)
            found = !strcmp(a->params[i].name, b->params[k].name);
        if (!found)
            return false;
    }
    return true;
}

/* The warm start's checks that need the parents (t->nparents > 0): each exists and the caller
 * can see it, is of t's project, has ended with trials, and has t's objective; for
 * identical_data_and_algorithm, its base job has t's data, model and code and its parameters t's
 * names. KILN_EINVAL naming warm_start.parents[i] (or warm_start.type) otherwise. */
static int warm_start_check(store_conn_t *c, const svc_caller_t *who, const spec_tuning_t *t, kiln_err_t *err)
{
    for (int i = 0; i < t->nparents; i++) {
        char f[48];
        snprintf(f, sizeof f, "warm_start.parents[%d]", i);
        const char *pid = t->parents[i];
        json_t *row = NULL, *trials = NULL;
        spec_tuning_t pt;
        bool parsed = false;
        kiln_err_t e2;
        int rc = store_tuning_get_json(c, pid, false, &row, &e2);
        if (rc && rc != KILN_ENOTFOUND) {
            *err = e2;
            return rc;
        }
        const char *project = json_string_value(json_object_get(row, "project"));
        const char *state = json_string_value(json_object_get(row, "state"));
        if (rc == KILN_ENOTFOUND || svc_caller_role(who, project) == SVC_ROLE_NONE) {
            rc = kiln_err_set(err, KILN_EINVAL, f, "%s: tuning job %s not found", f, pid);
            kiln_err_hint(err, "`kiln tune list` (GET /v1/tuning-jobs) lists the tuning jobs you can see");
        } else if (strcmp(project, t->project)) {
            rc = kiln_err_set(err, KILN_EINVAL, f, "%s: tuning job %s is in project \"%s\", not \"%s\"", f, pid, project,
                              t->project);
            kiln_err_hint(err, "a warm start takes parents of the base job's own project");
        } else if (kiln_tuning_active(state)) {
            rc = kiln_err_set(err, KILN_EINVAL, f, "%s: tuning job %s is %s; a parent must have ended", f, pid, state);
            kiln_err_hint(err, "wait until it is %s, or stop it: kiln tune stop %s", KILN_TUNING_STATE_ENDED_LIST, pid);
        } else if ((rc = store_tuning_trials_json(c, pid, &trials, err))) {
            goto done;
        } else if (json_array_size(trials) == 0) {
            rc = kiln_err_set(err, KILN_EINVAL, f, "%s: tuning job %s ended (%s) without a trial", f, pid, state);
            kiln_err_hint(err, "a parent gives its trials as history: name one that ran trials");
        } else if (spec_tuning_load(json_object_get(row, "spec"), &pt, &e2)) {
            rc = kiln_err_set(err, KILN_EINVAL, f, "%s: tuning job %s holds a request kilnd cannot read: %s", f, pid,
                              e2.message);
        } else {
            parsed = true;
            if (strcmp(pt.metric, t->metric) || pt.maximize != t->maximize) {
                rc = kiln_err_set(err, KILN_EINVAL, f, "%s: tuning job %s's objective is %s (%s), not %s (%s)", f, pid,
                                  pt.metric, pt.maximize ? "maximize" : "minimize", t->metric,
                                  t->maximize ? "maximize" : "minimize");
                kiln_err_hint(err, "a warm start takes parents with the same objective metric and goal");
            } else if (t->warm_type == SPEC_WARM_IDENTICAL && !same_names(&pt, t)) {
                rc = kiln_err_set(err, KILN_EINVAL, "warm_start.type",
                                  "identical_data_and_algorithm needs the parameters of tuning job %s by the same names",
                                  pid);
                kiln_err_hint(err, "tune the same parameters as the parent, or use \"type\": \"transfer_learning\"");
            } else if (t->warm_type == SPEC_WARM_IDENTICAL) {
                static const char *const same[] = {"model", "data", "entry_point", "source"};
                for (size_t k = 0; k < KILN_ARRAY_LEN(same) && !rc; k++)
                    if (!json_equal(json_object_get(pt.job, same[k]), json_object_get(t->job, same[k])) &&
                        (json_object_get(pt.job, same[k]) || json_object_get(t->job, same[k]))) {
                        rc = kiln_err_set(err, KILN_EINVAL, "warm_start.type",
                                          "identical_data_and_algorithm needs the base job's %s of tuning job %s",
                                          same[k], pid);
                        kiln_err_hint(err, "use the parent's base job, or \"type\": \"transfer_learning\"");
                    }
            }
        }
    done:
        if (parsed)
            spec_tuning_deinit(&pt);
        json_decref(row);
        json_decref(trials);
        if (rc)
            return rc;
    }
    return 0;
}

/* The submission checks (svc_job_submit_check) for the submitter of the job of a trial at each
 * point of t's parameters where they could answer otherwise than for the base job: every
 * categorical value and both ends of a range, one parameter at a time (as spec_tuning_parse tries
 * them with the job validator). The controller submits trials as kilnd, so what only the
 * submitter may name (another job's model) is decided here. The check's status (KILN_EINVAL,
 * KILN_EPERM for another project's area, KILN_EUNFIT) naming the point
 * ("parameters.<name>.values[i]", ".min", ".max"), its reason in the message. */
static int trials_check(svc_t *s, store_conn_t *c, const svc_caller_t *who, const spec_tuning_t *t, const spec_t *base,
                        kiln_err_t *err)
{
    json_t *tags = json_object();
    int rc = tags ? 0 : kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    for (int i = 0; i < t->nparams && rc == 0; i++) {
        const spec_tune_param_t *p = &t->params[i];
        size_t n = p->type == SPEC_TUNE_CATEGORICAL ? json_array_size(p->values) : 2;
        for (size_t k = 0; k < n && rc == 0; k++) {
            json_t *v = p->type == SPEC_TUNE_CATEGORICAL ? json_incref(json_array_get(p->values, k))
                        : p->type == SPEC_TUNE_INTEGER   ? json_integer((json_int_t)(k ? p->max : p->min))
                                                         : json_real(k ? p->max : p->min);
            json_t *values = v ? json_pack("{s:o}", p->name, v) : NULL;
            json_t *job = values ? spec_tuning_trial_spec(t, values, t->name, tags) : NULL;
            json_decref(values);
            if (!job) {
                rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
                break;
            }
            spec_t sp;
            kiln_err_t e2;
            rc = spec_parse(job, &sp, err); /* spec_tuning_parse tried this value: it parses */
            json_decref(job);
            if (rc)
                break;
            if (!svc_job_submit_same(&sp, base) && (rc = svc_job_submit_check(s, c, who, &sp, &e2))) {
                if (e2.field[0]) {
                    char field[sizeof err->field], what[32];
                    if (p->type == SPEC_TUNE_CATEGORICAL)
                        snprintf(what, sizeof what, "values[%zu]", k);
                    else
                        snprintf(what, sizeof what, "%s", k ? "max" : "min");
                    snprintf(field, sizeof field, "parameters.%.80s.%s", p->name, what);
                    kiln_err_set(err, rc, field, "parameter \"%s\": a trial's job would be refused: %s", p->name,
                                 e2.message);
                    if (e2.detail[0])
                        kiln_err_detail(err, "%s: %s", e2.field, e2.detail);
                    if (e2.hint[0])
                        kiln_err_hint(err, "%s", e2.hint);
                } else {
                    *err = e2;
                }
            }
            spec_deinit(&sp);
        }
    }
    json_decref(tags);
    return rc;
}

int svc_tuning_create(svc_t *s, const svc_caller_t *who, const json_t *body, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    spec_tuning_t t;
    spec_t base;
    bool parsed = false, based = false;
    store_conn_t *c = NULL;
    json_t *norm = NULL, *row = NULL;
    char *text = NULL;
    if (!body || !json_is_object(body))
        return kiln_err_set(err, KILN_EINVAL, NULL, "the tuning job must be a JSON object");
    int rc = spec_tuning_parse(body, &t, err);
    if (rc)
        return rc;
    parsed = true;
    if ((rc = svc_project_need(who, t.project, SVC_ROLE_EDITOR, err)))
        goto fail;
    if (!t.seed_set) {
        /* recorded, so the search can be repeated */
        uint32_t seed;
        randombytes_buf(&seed, sizeof seed);
        t.seed = seed;
        t.seed_set = true;
    }
    if ((rc = spec_parse(t.job, &base, err)))
        goto fail;
    based = true;
    if ((rc = store_conn_get(s->store, &c, err)) || (rc = warm_start_check(c, who, &t, err)))
        goto fail;
    /* the base job meets what a job submitted by this caller meets; the trials' points below */
    rc = svc_job_submit_check(s, c, who, &base, err);
    if (rc) {
        if (err->field[0]) {
            char f[sizeof err->field];
            snprintf(f, sizeof f, "job.%.120s", err->field);
            kiln_strlcpy(err->field, f, sizeof err->field);
        }
        goto fail;
    }
    /* every trial waits in the queue decided now (the project's default when the spec names none) */
    json_object_set_new(t.job, "queue", json_string(base.queue));
    if ((rc = trials_check(s, c, who, &t, &base, err)))
        goto fail;
    norm = spec_tuning_to_json(&t);
    text = norm ? json_dumps(norm, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
    if (!text) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "could not encode the tuning job");
        goto fail;
    }
    char reason[200];
    snprintf(reason, sizeof reason, "submitted: %s search over %d parameter(s), up to %d trial(s), %d at once",
             spec_tune_strategy_name(t.strategy), t.nparams, t.max_jobs, t.max_parallel_jobs);
    rc = store_tuning_insert(c, t.name, t.project, text, who->user, reason, &row, err);
    if (rc == KILN_ENOTFOUND) {
        rc = kiln_err_set(err, KILN_EINVAL, "job.project", "project \"%s\" does not exist", t.project);
        kiln_err_hint(err, "create it first: kiln projects create %s", t.project);
    } else if (rc == KILN_EINVAL && !strcmp(err->field, "queue")) {
        /* the queue's projects changed since the base job's check */
        kiln_strlcpy(err->field, "job.queue", sizeof err->field);
    }
    if (rc)
        goto fail;
    rc = tuning_json(c, row, out, err);
    if (rc == 0) {
        log_info("tuning job %s: created \"%s\" in project %s by %s (%s, %d trial(s), seed %llu)",
                 json_string_value(json_object_get(row, "id")), t.name, t.project,
                 who->user[0] ? who->user : "kilnd", spec_tune_strategy_name(t.strategy), t.max_jobs,
                 (unsigned long long)t.seed);
        svc_sched_wake(s);
    }
fail:
    if (c)
        store_conn_put(s->store, c);
    if (based)
        spec_deinit(&base);
    if (parsed)
        spec_tuning_deinit(&t);
    json_decref(norm);
    json_decref(row);
    free(text);
    return rc;
}

int svc_tuning_get(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    store_conn_t *c = NULL;
    json_t *row = NULL;
    int rc = store_conn_get(s->store, &c, err);
    if (rc)
        return rc;
    rc = tuning_read(c, who, id, SVC_ROLE_VIEWER, false, &row, err);
    if (rc == 0)
        rc = tuning_json(c, row, out, err);
    store_conn_put(s->store, c);
    json_decref(row);
    return rc;
}

int svc_tuning_list(svc_t *s, const svc_caller_t *who, const svc_page_t *page, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    char *projects = NULL, *tok = NULL;
    store_conn_t *c = NULL;
    json_t *cursor = NULL, *list = NULL, *next = NULL;
    uint64_t fp = svc_list_fingerprint("tuning-jobs");
    /* the checks of a job listing's page size and token (check.c, page_token.c) */
    int rc = 0;
    if ((rc = svc_check_str("page_token", page->page_token, 8192, err)) ||
        (page->page_size_set && (rc = svc_check_range("page_size", page->page_size, 1, KILN_PAGE_SIZE_MAX, err))))
        return rc;
    if (page->page_token && *page->page_token && (rc = svc_page_token_decode(page->page_token, fp, &cursor, err)))
        return rc;
    if ((rc = svc_caller_projects(who, &projects, err)) || (rc = store_conn_get(s->store, &c, err)))
        goto fail;
    rc = store_tuning_list_json(c, projects, page->page_size_set ? page->page_size : KILN_PAGE_SIZE_MAX, cursor, &list,
                                &next, err);
    store_conn_put(s->store, c);
    if (rc)
        goto fail;
    if (next && !(tok = svc_page_token_encode(next, fp))) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto fail;
    }
    /* the list shows each tuning job's row and its request's main fields, not its trials */
    size_t i;
    json_t *o;
    json_array_foreach(list, i, o) {
        json_t *spec = json_object_get(o, "spec");
        json_object_set(o, "strategy", json_object_get(spec, "strategy"));
        json_object_set(o, "objective", json_object_get(spec, "objective"));
        json_object_set(o, "max_jobs", json_object_get(spec, "max_jobs"));
        json_object_del(o, "spec");
        json_object_del(o, "next_trial");
    }
    *out = json_pack("{s:O, s:s}", "tuning_jobs", list, "next_page_token", tok ? tok : "");
    if (!*out)
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
fail:
    free(projects);
    free(tok);
    json_decref(cursor);
    json_decref(list);
    json_decref(next);
    return rc;
}

int svc_tuning_stop(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    svc_tx_t tx;
    json_t *row = NULL;
    int rc = svc_tx_begin(s, &tx, err);
    if (rc)
        return rc;
    rc = tuning_read(tx.c, who, id, SVC_ROLE_EDITOR, true, &row, err);
    if (rc)
        goto fail;
    const char *st = json_string_value(json_object_get(row, "state"));
    if (strcmp(st, KILN_TUNING_NAME(RUNNING))) {
        rc = kiln_err_set(err, KILN_ESTATE, NULL, "tuning job %s is %s, not %s", id, st, KILN_TUNING_NAME(RUNNING));
        kiln_err_hint(err, "only a running tuning job can be stopped");
        goto fail;
    }
    char reason[200];
    snprintf(reason, sizeof reason, "stop requested by %s", who->user[0] ? who->user : "kilnd");
    rc = store_tuning_set_state(tx.c, id, KILN_TUNING_NAME(RUNNING), KILN_TUNING_NAME(STOPPING), reason, who->user, false, err);
    if (rc)
        goto fail;
    tx.wake_sched = true;
    rc = svc_tx_commit(&tx, err);
    if (rc)
        goto out;
    log_info("tuning job %s: RUNNING -> STOPPING (%s)", id, reason);
    rc = svc_tuning_get(s, who, id, out, err);
    goto out;
fail:
    svc_tx_abort(&tx);
out:
    json_decref(row);
    return rc;
}

/* ---- the controller -------------------------------------------------------------------------- */

/* Stops the trials of view that still run or are paused; reason is theirs. */
static void stop_active(svc_t *s, const char *tuning_id, const view_buf_t *vb, const char *reason)
{
    for (int i = 0; i < vb->n; i++) {
        if ((vb->trials[i].state != TUNE_TRIAL_ACTIVE && vb->trials[i].state != TUNE_TRIAL_PAUSED) || !vb->trials[i].job_id ||
            vb->trials[i].parent)
            continue;
        json_t *j = NULL;
        kiln_err_t e;
        int rc = svc_job_stop(s, svc_caller_kilnd(), vb->trials[i].job_id, reason, &j, &e);
        if (rc && rc != KILN_ESTATE)
            log_warn("tuning job %s: could not stop trial %d (job %s): %s", tuning_id, vb->trials[i].trial,
                     vb->trials[i].job_id, e.message);
        json_decref(j);
    }
}

/* Stops running trial x of tuning job id by the median stopping rule (st); its job's reason and
 * event say so, and it keeps the objective it reported. */
static int stop_early(svc_t *s, svc_tx_t *tx, const char *id, const spec_tuning_t *t, const tune_trial_t *x,
                      const tune_stop_t *st, kiln_err_t *err)
{
    char reason[300];
    snprintf(reason, sizeof reason,
             "stopped early by the median rule: its best %s by step %lld is %.6g, worse than %.6g, the median of "
             "the running averages of %d completed trial(s) up to that step",
             t->metric, (long long)st->step, st->best, st->median, st->history);
    json_t *j = NULL;
    kiln_err_t e;
    int rc = svc_job_stop(s, svc_caller_kilnd(), x->job_id, reason, &j, &e);
    json_decref(j);
    if (rc) {
        if (rc != KILN_ESTATE)
            log_warn("tuning job %s: could not stop trial %d (job %s) early: %s", id, x->trial, x->job_id, e.message);
        return 0; /* ended meanwhile, or judged again next pass */
    }
    log_info("tuning job %s: trial %d (job %s) %s", id, x->trial, x->job_id, reason);
    return store_tuning_trial_stopped(tx->c, id, x->trial, reason, err);
}

/* In tx: the paused trials of view end COMPLETED (never promoted, their tuning job ended). */
static int end_paused(svc_tx_t *tx, const view_buf_t *vb, kiln_err_t *err)
{
    for (int i = 0; i < vb->n; i++) {
        if (vb->trials[i].state != TUNE_TRIAL_PAUSED || vb->trials[i].parent)
            continue;
        store_job_row_t job;
        int rc = store_job_row(tx->c, vb->trials[i].job_id, true, &job, err);
        if (rc == KILN_ENOTFOUND)
            continue;
        if (rc == 0 && svc_state_parse(job.state) == JOB_STATE_PAUSED)
            rc = svc_job_set_state(tx, &job, JOB_STATE_COMPLETED, job.attempt, 0,
                                   "not promoted past its rung; its tuning job ended", err);
        if (rc)
            return rc;
    }
    return 0;
}

/* In tx: trial x of t, paused after its rungs, continues toward its next rung (the last: to its
 * end) as a new attempt that resumes from its checkpoint; under --tune-promoted-restart, one that
 * trains again from step 0 (its checkpoints kept), as stopping-based tuners' promoted trials do. */
static int promote(svc_tx_t *tx, const char *id, const spec_tuning_t *t, const tune_trial_t *x, kiln_err_t *err)
{
    int64_t rungs[SPEC_TUNE_MAX_RUNGS];
    int nr = tune_trial_rungs(t, x->trial, rungs);
    int next = x->nrungs; /* the rung it runs toward now */
    int64_t pause = next < nr - 1 ? rungs[next] : 0;
    store_job_row_t job;
    int rc = store_job_row(tx->c, x->job_id, true, &job, err);
    if (rc)
        return rc;
    if (svc_state_parse(job.state) != JOB_STATE_PAUSED)
        return 0; /* stopped meanwhile */
    bool restart = tx->s->cfg.tune_promoted_restart;
    char reason[200];
    snprintf(reason, sizeof reason, "promoted to rung %d of its tuning job: %s toward step %lld", next,
             restart ? "restarts from step 0 (--tune-promoted-restart)" : "resumes from its checkpoint",
             (long long)(pause ? pause : rungs[nr - 1]));
    if ((rc = store_tuning_trial_rung(tx->c, id, x->trial, next, NULL, err)) ||
        (rc = store_job_pause_set(tx->c, x->job_id, pause, err)) ||
        (restart && (rc = store_job_restart_set(tx->c, x->job_id, job.attempt + 1, err))))
        return rc;
    return svc_job_set_state(tx, &job, JOB_STATE_RESTARTING, job.attempt, 0, reason, err);
}

/* A paused trial that has not had its rung's objective recorded gets it now (into tr, and the
 * database): the value it reported at the pause. */
static int record_rungs(store_conn_t *c, const char *id, const spec_tuning_t *t, json_t *trials, kiln_err_t *err)
{
    size_t i;
    json_t *tr;
    json_array_foreach(trials, i, tr) {
        const char *st = json_string_value(json_object_get(tr, "job_state"));
        json_t *ro = json_object_get(tr, "rung_objectives");
        int rung = (int)json_integer_value(json_object_get(tr, "rung"));
        json_t *v = json_object_get(json_object_get(tr, "metrics"), t->metric);
        if (!st || strcmp(st, "PAUSED") || !json_is_array(ro) || (int)json_array_size(ro) != rung || !json_is_number(v))
            continue;
        json_array_append_new(ro, json_real(json_number_value(v)));
        char *text = json_dumps(ro, JSON_COMPACT | JSON_REAL_PRECISION(17));
        int rc = text ? store_tuning_trial_rung(c, id, (int)json_integer_value(json_object_get(tr, "trial")), rung, text,
                                                err)
                      : kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        free(text);
        if (rc)
            return rc;
    }
    return 0;
}

/* A hyperband trial n of a bracket past the first pauses first at its bracket's first rung
 * (spec_tuning_trial_spec pauses it at min_resource), or, in a bracket of the last rung alone,
 * runs straight to max_resource. Returns 0, or -1 when out of memory. */
static int first_rung(const spec_tuning_t *t, int n, json_t *spec)
{
    int64_t rungs[SPEC_TUNE_MAX_RUNGS];
    int nr = tune_trial_rungs(t, n, rungs);
    json_t *stopping = json_object_get(spec, "stopping");
    if (nr == 0 || tune_trial_bracket(t, n) == 0 || !json_is_object(stopping))
        return 0;
    if (nr == 1) {
        json_object_del(stopping, "max_steps");
        return 0;
    }
    return json_object_set_new(stopping, "max_steps", json_integer((json_int_t)rungs[0]));
}

/* Submits trial n of view's search (tune_next_values: a configuration not in its tried, drawn by
 * TPE over its ended trials when the strategy uses it) as a job (the tuning job's submitter
 * recorded as its submitter), and records it in tx. */
static int start_trial(svc_t *s, svc_tx_t *tx, const char *id, const char *user, const tune_view_t *view, int n,
                       kiln_err_t *err)
{
    const spec_tuning_t *t = view->t;
    json_t *values = tune_next_values(view, n), *spec = NULL, *job = NULL, *tags = NULL;
    char *vtext = NULL;
    int rc = 0;
    if (!values)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "could not draw trial %d's values: out of memory", n);
    char name[160], key[80], num[16];
    snprintf(name, sizeof name, "%.100s-%d", t->name, n);
    snprintf(key, sizeof key, "tuning:%s:%d", id, n);
    snprintf(num, sizeof num, "%d", n);
    tags = json_pack("{s:s, s:s}", "tuning_job", id, "tuning_trial", num);
    spec = tags ? spec_tuning_trial_spec(t, values, name, tags) : NULL;
    vtext = json_dumps(values, JSON_COMPACT | JSON_REAL_PRECISION(17));
    if (!spec || !vtext || first_rung(t, n, spec)) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto out;
    }
    svc_caller_t as = *svc_caller_kilnd();
    as.user = user;
    rc = svc_job_create(s, &as, spec, key, &job, NULL, err);
    if (rc)
        goto out;
    rc = store_tuning_trial_insert(tx->c, id, n, json_string_value(json_object_get(job, "id")), vtext, 0, err);
out:
    json_decref(values);
    json_decref(spec);
    json_decref(job);
    json_decref(tags);
    free(vtext);
    return rc;
}

/* One tuning job's pass, in one transaction that holds its row. */
static int tune_one(svc_t *s, const char *id, kiln_err_t *err)
{
    svc_tx_t tx;
    json_t *row = NULL, *trials = NULL, *curves = NULL, *tried = NULL;
    spec_tuning_t t;
    bool parsed = false;
    view_buf_t vb = {0};
    int rc = svc_tx_begin(s, &tx, err);
    if (rc)
        return rc;
    if ((rc = store_tuning_get_json(tx.c, id, true, &row, err)))
        goto fail;
    const char *state = json_string_value(json_object_get(row, "state"));
    if (!kiln_tuning_active(state))
        goto fail; /* ended meanwhile */
    kiln_err_t e2;
    if ((rc = spec_tuning_load(json_object_get(row, "spec"), &t, &e2))) {
        /* a request stored by an older kilnd that this one refuses: end it, saying why */
        char reason[400];
        kiln_text_fmt(reason, sizeof reason, "kilnd cannot read the request: %s", e2.message);
        rc = store_tuning_set_state(tx.c, id, state, KILN_TUNING_NAME(FAILED), reason, NULL, true, err);
        if (rc == 0)
            rc = svc_tx_commit(&tx, err);
        goto out;
    }
    parsed = true;
    const char *last_failure = NULL;
    if ((rc = store_tuning_trials_json(tx.c, id, &trials, err)) || (rc = record_rungs(tx.c, id, &t, trials, err)))
        goto fail;
    if (t.early_stopping && (rc = store_tuning_curves_json(tx.c, id, t.metric, &curves, err)))
        goto fail;
    if ((rc = history_load(tx.c, &t, trials, curves, &tried, err)))
        goto fail;
    if (view_build(&t, trials, curves, &vb, &last_failure)) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto fail;
    }
    int active = 0;
    for (int i = 0; i < vb.n; i++)
        active += vb.trials[i].state == TUNE_TRIAL_ACTIVE;
    if (!strcmp(state, KILN_TUNING_NAME(STOPPING))) {
        stop_active(s, id, &vb, "its tuning job was stopped");
        if (active == 0) {
            rc = store_tuning_set_state(tx.c, id, KILN_TUNING_NAME(STOPPING), KILN_TUNING_NAME(STOPPED), "stopped; every trial has ended", NULL, true,
                                        err);
            if (rc == 0 && (rc = svc_tx_commit(&tx, err)) == 0)
                log_info("tuning job %s: STOPPING -> STOPPED", id);
            goto out;
        }
        goto fail; /* nothing to write yet */
    }
    tune_view_t view = {.t = &t, .trials = vb.trials, .ntrials = vb.n,
                        .next_trial = (int)json_integer_value(json_object_get(row, "next_trial")),
                        .last_failure = last_failure, .tried = tried};
    tune_plan_t plan;
    tune_decide(&view, &plan);
    if (plan.end != TUNE_END_NONE) {
        const char *to = plan.end == TUNE_END_COMPLETED ? KILN_TUNING_NAME(COMPLETED) : KILN_TUNING_NAME(FAILED);
        for (int i = 0; i < vb.n; i++)
            if (vb.trials[i].state == TUNE_TRIAL_PAUSED)
                vb.trials[i].state = TUNE_TRIAL_COMPLETED; /* ended below, not stopped */
        stop_active(s, id, &vb, plan.end == TUNE_END_COMPLETED ? "its tuning job completed" : "its tuning job failed");
        for (int i = 0; i < vb.n; i++)
            if (vb.trials[i].state == TUNE_TRIAL_COMPLETED)
                vb.trials[i].state = TUNE_TRIAL_PAUSED;
        rc = end_paused(&tx, &vb, err);
        if (rc == 0)
            rc = store_tuning_set_state(tx.c, id, KILN_TUNING_NAME(RUNNING), to, plan.reason, NULL, true, err);
        if (rc == 0 && (rc = svc_tx_commit(&tx, err)) == 0)
            log_info("tuning job %s: RUNNING -> %s (%s)", id, to, plan.reason);
        goto out;
    }
    for (int k = 0; k < plan.nstop; k++)
        if ((rc = stop_early(s, &tx, id, &t, &vb.trials[plan.stop[k].index], &plan.stop[k], err)))
            goto fail;
    for (int k = 0; k < plan.npromote; k++)
        if ((rc = promote(&tx, id, &t, &vb.trials[plan.promote[k]], err)))
            goto fail;
    for (int k = 0; k < plan.nnew; k++) {
        int n = view.next_trial + k;
        kiln_err_t e3;
        int r2 = start_trial(s, &tx, id, json_string_value(json_object_get(row, "submitted_by")), &view, n, &e3);
        if (r2 == KILN_EDB || r2 == KILN_ENOMEM || r2 == KILN_EUNAVAIL) {
            rc = r2;
            *err = e3;
            goto fail;
        }
        if (r2) {
            /* the job validator or the cluster refuses the trial: the search cannot go on */
            char reason[400];
            kiln_text_fmt(reason, sizeof reason, "trial %d could not be submitted: %.250s%s%.100s", n, e3.message,
                          e3.field[0] ? " (field " : "", e3.field[0] ? e3.field : "");
            if (e3.field[0])
                kiln_strlcpy(reason + strlen(reason), ")", sizeof reason - strlen(reason));
            stop_active(s, id, &vb, "its tuning job failed");
            rc = store_tuning_set_state(tx.c, id, KILN_TUNING_NAME(RUNNING), KILN_TUNING_NAME(FAILED), reason, NULL, true, err);
            if (rc == 0 && (rc = svc_tx_commit(&tx, err)) == 0)
                log_info("tuning job %s: RUNNING -> FAILED (%s)", id, reason);
            goto out;
        }
    }
    rc = svc_tx_commit(&tx, err);
    goto out;
fail:
    svc_tx_abort(&tx);
out:
    view_free(&vb);
    if (parsed)
        spec_tuning_deinit(&t);
    json_decref(row);
    json_decref(trials);
    json_decref(curves);
    json_decref(tried);
    return rc;
}

void svc_tune_pass(svc_t *s)
{
    kiln_err_t err;
    store_conn_t *c = NULL;
    char(*ids)[STORE_ID_LEN] = NULL;
    int n = 0;
    kiln_err_clear(&err);
    if (store_conn_get(s->store, &c, &err))
        return;
    int rc = store_tuning_active(c, &ids, &n, &err);
    store_conn_put(s->store, c);
    if (rc) {
        log_warn("tuning: %s", err.message);
        return;
    }
    for (int i = 0; i < n; i++) {
        kiln_err_clear(&err);
        if (tune_one(s, ids[i], &err))
            log_warn("tuning job %s: %s", ids[i], err.message);
    }
    free(ids);
}
