/* job.c - client-facing job operations: submission (validation, the "can it ever fit" check,
 * idempotency), reads (job with its metric summaries, events, log and metric history, workers)
 * and stop requests. State changes go through state.c; listing and search are search.c's. */
#include "service/svc_int.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec/spec.h"

static int bad_job_id(kiln_err_t *err, const char *id)
{
    if (svc_check_str("id", id, 0, err))
        return KILN_EINVAL;
    kiln_err_set(err, KILN_ENOTFOUND, "id", "job \"%.80s\" not found", id ? id : "");
    kiln_err_hint(err, "job ids are UUIDs, as job submission returns them");
    return KILN_ENOTFOUND;
}

int svc_job_resolve(svc_t *s, const svc_caller_t *who, const char *ref, char out[SVC_JOB_ID_SIZE],
                    kiln_err_t *err)
{
    static const char layout[] = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
    out[0] = '\0';
    size_t n = ref ? strlen(ref) : 0;
    if (n == 0 || n > 36)
        return bad_job_id(err, ref);
    char lo[SVC_JOB_ID_SIZE], hi[SVC_JOB_ID_SIZE];
    for (size_t i = 0; i < 36; i++) {
        char c = i < n ? (char)tolower((unsigned char)ref[i]) : 0;
        if (i < n && (layout[i] == '-' ? c != '-' : !isxdigit((unsigned char)c)))
            return bad_job_id(err, ref);
        lo[i] = i < n ? c : layout[i] == '-' ? '-' : '0';
        hi[i] = i < n ? c : layout[i] == '-' ? '-' : 'f';
    }
    lo[36] = hi[36] = '\0';
    if (n == 36) {
        memcpy(out, lo, SVC_JOB_ID_SIZE);
        return 0;
    }
    if (n < SVC_JOB_PREFIX_MIN) {
        kiln_err_set(err, KILN_EINVAL, "id", "job id prefix \"%s\" is too short", ref);
        kiln_err_hint(err, "give at least %d characters of the id", SVC_JOB_PREFIX_MIN);
        return KILN_EINVAL;
    }
    char *projects = NULL;
    int rc = svc_caller_projects(who, &projects, err);
    if (rc)
        return rc;
    char ids[5][37];
    int found = 0;
    store_conn_t *c = NULL;
    rc = store_conn_get(s->store, &c, err);
    if (rc == 0) {
        rc = store_job_ids_between(c, lo, hi, projects, 5, ids, &found, err);
        store_conn_put(s->store, c);
    }
    free(projects);
    if (rc)
        return rc;
    if (found == 0) {
        kiln_err_set(err, KILN_ENOTFOUND, "id", "no job matches \"%s\"", ref);
        kiln_err_hint(err, "`kiln jobs` (GET /v1/jobs) lists the jobs you can see");
        return KILN_ENOTFOUND;
    }
    if (found > 1) {
        char list[200] = "";
        for (int i = 0; i < found && i < 4; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%.13s", i ? ", " : "", ids[i]);
        kiln_err_set(err, KILN_EINVAL, "id", "job id prefix \"%s\" is ambiguous: it matches %s jobs (%s%s)", ref,
                     found > 4 ? "more than 4" : found == 2 ? "2" : found == 3 ? "3" : "4", list,
                     found > 4 ? ", ..." : "");
        kiln_err_hint(err, "give more characters of the id");
        return KILN_EINVAL;
    }
    memcpy(out, ids[0], SVC_JOB_ID_SIZE);
    return 0;
}

int svc_caller_projects(const svc_caller_t *who, char **out, kiln_err_t *err)
{
    *out = NULL;
    if (who->cluster_admin)
        return 0;
    size_t cap = 3;
    for (int i = 0; i < who->nroles; i++)
        cap += strlen(who->roles[i].project) + 3;
    char *p = malloc(cap);
    if (!p)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    size_t o = 0;
    p[o++] = '{';
    for (int i = 0; i < who->nroles; i++)
        o += (size_t)snprintf(p + o, cap - o, "%s\"%s\"", i ? "," : "", who->roles[i].project);
    p[o++] = '}';
    p[o] = '\0';
    *out = p;
    return 0;
}

static const char *action_name(svc_role_t need)
{
    return need >= SVC_ROLE_ADMIN ? "managing it" : need == SVC_ROLE_EDITOR ? "submitting and stopping jobs"
                                                                           : "reading it";
}

int svc_project_need(const svc_caller_t *who, const char *project, svc_role_t need, kiln_err_t *err)
{
    svc_role_t have = svc_caller_role(who, project);
    if (have >= need)
        return 0;
    if (have == SVC_ROLE_NONE)
        kiln_err_set(err, KILN_EPERM, "project", "you are not a member of project \"%s\"", project);
    else
        kiln_err_set(err, KILN_EPERM, "project", "you are a%s %s of project \"%s\"; %s needs the %s role",
                     have == SVC_ROLE_ADMIN ? "n" : "", svc_role_name(have), project, action_name(need),
                     svc_role_name(need));
    kiln_err_hint(err, "a project admin grants roles with `kiln projects add-member %s USER ROLE`", project);
    return KILN_EPERM;
}

int svc_job_access(store_conn_t *c, const svc_caller_t *who, const char *id, svc_role_t need,
                      kiln_err_t *err)
{
    if (!store_is_uuid(id))
        return bad_job_id(err, id);
    if (who->cluster_admin)
        return 0; /* the operation itself says "not found" when there is no such job */
    char project[64];
    kiln_err_t e2;
    int rc = store_job_project(c, id, project, sizeof(project), &e2);
    if (rc == KILN_ENOTFOUND || (rc == 0 && svc_caller_role(who, project) == SVC_ROLE_NONE))
        return bad_job_id(err, id);
    if (rc) {
        *err = e2;
        return rc;
    }
    return svc_project_need(who, project, need, err);
}

const char *svc_job_name(const svc_caller_t *who, const char *id, const char *project, char *buf, size_t n)
{
    bool readable = svc_caller_role(who, project) != SVC_ROLE_NONE;
    return sched_job_name(readable ? project : NULL, id, project, buf, n);
}

int svc_job_view_conn(svc_t *s, const svc_caller_t *who, const char *id, store_conn_t **c, kiln_err_t *err)
{
    int rc = store_conn_get(s->store, c, err);
    if (rc)
        return rc;
    rc = svc_job_access(*c, who, id, SVC_ROLE_VIEWER, err);
    if (rc == 0)
        rc = store_job_row(*c, id, false, &(store_job_row_t){0}, err);
    if (rc) {
        store_conn_put(s->store, *c);
        *c = NULL;
    }
    return rc;
}

/* Whether path lies inside root (both absolute and normalised), at a component boundary. */
static bool path_within(const char *path, const char *root)
{
    size_t n = strlen(root);
    if (n == 0 || strncmp(path, root, n) != 0)
        return false;
    return root[n - 1] == '/' || path[n] == '/' || path[n] == '\0';
}

bool svc_worker_holds(const store_worker_cap_t *w, const char *path)
{
    for (int k = 0; k < w->nroots; k++)
        if (path_within(path, w->roots_buf + w->roots_off[k]))
            return true;
    return false;
}

int svc_spec_paths(const spec_t *sp, svc_spec_path_t *out)
{
    int n = 0;
#define SPEC_PATH_ADD(f, p, r)                                                                    \
    do {                                                                                          \
        if ((p) && (p)[0]) {                                                                      \
            kiln_strlcpy(out[n].field, (f), sizeof(out[n].field));                                \
            out[n].path = (p);                                                                    \
            out[n].read = (r);                                                                    \
            n++;                                                                                  \
        }                                                                                         \
    } while (0)
    SPEC_PATH_ADD("data.train", strcmp(sp->data.format, "synthetic") ? sp->data.train : "", true);
    SPEC_PATH_ADD("data.val", sp->data.val, true);
    /* "job:<id>" is a model kilnd holds, fetched by the agent: no file of the agents' */
    SPEC_PATH_ADD("model.init_from", svc_init_from_job(sp->model.init_from) ? "" : sp->model.init_from, true);
    for (int i = 0; i < sp->data.n_channels; i++) {
        char f[96];
        snprintf(f, sizeof(f), "data.channels.%s", sp->data.channels[i].name);
        SPEC_PATH_ADD(f, sp->data.channels[i].path, true);
    }
    /* "code:sha256:..." is an archive kilnd holds, fetched by the agent */
    SPEC_PATH_ADD("source", sp->script.source[0] == '/' ? sp->script.source : "", true);
    SPEC_PATH_ADD("python", sp->script.python, true);
    SPEC_PATH_ADD("checkpoint.path", sp->ckpt_path, false);
#undef SPEC_PATH_ADD
    return n;
}

/* Every file a job reads (and where it checkpoints) must be an absolute path that lies inside a
 * data root of some alive worker of its slot type (the agent checks again, after resolving
 * symlinks, when it starts the ranks). With no alive worker of that type yet, nothing can be said:
 * the job waits for one, and the scheduler places it only where the data roots hold its files.
 * A file it reads may not lie in another project's area (KILN_AREA_DIR), and checkpoint.path not
 * in any: kiln adds .kiln/<project>/<job id> to it. These two are questions of the text alone,
 * asked whatever the workers, answered the same whether the file exists or not; the agent asks
 * them again of the resolved path. */
static int check_paths(svc_t *s, const spec_t *sp, kiln_err_t *err)
{
    svc_spec_path_t paths[SVC_SPEC_PATHS];
    int np = svc_spec_paths(sp, paths);
    int rc = 0;
    pthread_mutex_lock(&s->cap_mu);
    for (int i = 0; i < np && rc == 0; i++) {
        const char *p = paths[i].path;
        if (p[0] != '/') {
            rc = kiln_err_set(err, KILN_EINVAL, paths[i].field,
                              "%s must be an absolute path on the agents' machines (got \"%.200s\")",
                              paths[i].field, p);
            kiln_err_hint(err, "use a path such as /data/corpus.txt or file:///data/corpus.txt");
            break;
        }
        if (paths[i].read && (rc = kiln_path_area_check(p, p, paths[i].field, sp->project, err)))
            break;
        if (!paths[i].read && kiln_path_foreign_area(p, NULL)) {
            rc = kiln_err_set(err, KILN_EINVAL, paths[i].field,
                              "%s \"%.200s\" lies inside a " KILN_AREA_DIR " directory, which kiln keeps for "
                              "its project areas", paths[i].field, p);
            kiln_err_hint(err, "name the directory above it: a job checkpoints into <checkpoint.path>/"
                               KILN_AREA_DIR "/<project>/<job id>");
            break;
        }
        bool ok = false, typed = false;
        for (int w = 0; w < s->ncap && !typed; w++)
            typed = strcmp(s->cap[w].slot_type, sp->res.slot_type) == 0;
        if (!typed)
            continue;
        char roots[512] = "";
        size_t rl = 0;
        for (int w = 0; w < s->ncap && !ok; w++) {
            const store_worker_cap_t *cw = &s->cap[w];
            if (strcmp(cw->slot_type, sp->res.slot_type) != 0)
                continue;
            ok = svc_worker_holds(cw, p);
            for (int k = 0; k < cw->nroots; k++) {
                const char *root = cw->roots_buf + cw->roots_off[k];
                if (!strstr(roots, root) && rl + strlen(root) + 3 < sizeof(roots))
                    rl += (size_t)snprintf(roots + rl, sizeof(roots) - rl, "%s%s", rl ? ", " : "", root);
            }
        }
        if (!ok) {
            rc = kiln_err_set(err, KILN_EINVAL, paths[i].field,
                              "%s is not inside a data root of any %s agent", paths[i].field,
                              sp->res.slot_type);
            kiln_err_detail(err, "allowed roots: %s", roots[0] ? roots : "none (no agent was started with --data-root)");
            kiln_err_hint(err, "put the file under one of the allowed roots, or start kiln-agent with "
                               "--data-root DIR for the directory that holds it");
        }
    }
    pthread_mutex_unlock(&s->cap_mu);
    return rc;
}

/* What a new job waits for, from the cached alive workers. A job that does not fit them is not
 * invalid: workers come and go (and the cache may not have seen the newest yet), so it is
 * accepted and waits, and the scheduler keeps its reason current. */
static void initial_reason(svc_t *s, const spec_t *sp, char *out, size_t n)
{
    sched_request_t req = {.nodes = sp->res.nodes, .slots_per_node = sp->res.slots_per_node,
                           .slot_type = sp->res.slot_type};
    snprintf(out, n, "submitted");
    pthread_mutex_lock(&s->cap_mu);
    if (s->ncap == 0) {
        snprintf(out, n, "waiting for workers: no worker is registered yet");
    } else {
        sched_worker_t *w = calloc((size_t)s->ncap, sizeof(*w));
        int max_slots = 0;
        for (int i = 0; i < s->ncap && w; i++) {
            w[i].id = s->cap[i].id;
            w[i].slot_type = s->cap[i].slot_type;
            w[i].slots = s->cap[i].slots;
            w[i].slots_free = s->cap[i].slots_free;
            if (strcmp(w[i].slot_type, req.slot_type) == 0)
                max_slots = KILN_MAX(max_slots, w[i].slots);
        }
        if (w && !sched_fits(w, s->ncap, &req))
            snprintf(out, n, "waiting for workers: needs %d worker(s) with %d %s slot(s) each, more than "
                     "the alive workers have (the largest alive %s worker has %d)", req.nodes,
                     req.slots_per_node, req.slot_type, req.slot_type, max_slots);
        free(w);
    }
    pthread_mutex_unlock(&s->cap_mu);
}

/* model.init_from "job:<id>": the job must be one the submitter can see, hold a complete model
 * artifact, and have trained a model of this spec's shape (what kiln-train would refuse when it
 * loads the file is refused here, at submission). c is the submitter's connection. */
static int check_init_from_job(store_conn_t *c, const svc_caller_t *who, const spec_t *sp, kiln_err_t *err)
{
    const char *src = svc_init_from_job(sp->model.init_from);
    if (!src)
        return 0;
    kiln_err_t e2;
    json_t *job = NULL;
    int rc = svc_job_access(c, who, src, SVC_ROLE_VIEWER, &e2);
    if (rc == 0)
        rc = store_job_get_json(c, src, &job, &e2);
    if (rc == KILN_ENOTFOUND || rc == KILN_EPERM) {
        kiln_err_set(err, KILN_EINVAL, "model.init_from", "model.init_from names job %s, which does not exist or "
                     "is in a project you cannot read", src);
        kiln_err_hint(err, "use the id of a job you can see (kiln jobs lists them)");
        return KILN_EINVAL;
    }
    if (rc) {
        *err = e2;
        return rc;
    }
    const json_t *m = json_object_get(json_object_get(job, "spec"), "model");
    const char *state = json_string_value(json_object_get(job, "state"));
    int64_t size = 0;
    char sha[KILN_SHA256_HEX];
    rc = svc_artifact_model(c, src, &size, sha, &e2);
    if (rc == KILN_ENOTFOUND) {
        kiln_err_set(err, KILN_EINVAL, "model.init_from", "job %s (%s) has no model artifact (%s)", src,
                     state ? state : "", KILN_ARTIFACT_MODEL);
        kiln_err_hint(err, "a GPT job's final model is uploaded when it ends: wait for it to end, or check its "
                           "artifacts (kiln artifacts %s)", src);
        rc = KILN_EINVAL;
    } else if (rc) {
        *err = e2;
    } else {
        struct { const char *key; int want; } dims[] = {
            {"n_layer", sp->model.n_layer}, {"n_head", sp->model.n_head}, {"n_embd", sp->model.n_embd},
            {"seq_len", sp->model.seq_len}, {"vocab_size", sp->model.vocab_size},
        };
        for (size_t i = 0; i < KILN_ARRAY_LEN(dims) && rc == 0; i++) {
            json_int_t got = json_integer_value(json_object_get(m, dims[i].key));
            if (got != dims[i].want) {
                rc = kiln_err_set(err, KILN_EINVAL, "model.init_from", "job %s trained a model with %s %lld; this "
                                  "spec's model has %s %d", src, dims[i].key, (long long)got, dims[i].key, dims[i].want);
                kiln_err_hint(err, "give the model the shape of job %s's (n_layer, n_head, n_embd, seq_len, vocab)",
                              src);
            }
        }
    }
    json_decref(job);
    return rc;
}

/* A script job's source "code:sha256:<digest>" must be an archive the job's project uploaded.
 * The answer is the same whether another project holds that digest or none does. */
static int check_code_source(store_conn_t *c, const spec_t *sp, kiln_err_t *err)
{
    char digest[KILN_SHA256_HEX];
    if (!spec_source_digest(sp->script.source, digest))
        return 0;
    store_code_t row;
    kiln_err_t e2;
    int rc = store_code_get(c, sp->project, digest, &row, &e2);
    if (rc == KILN_ENOTFOUND) {
        kiln_err_set(err, KILN_EINVAL, "source", "source %s is not a code archive of project \"%s\"",
                     sp->script.source, sp->project);
        kiln_err_hint(err, "upload the code into the job's project first: kiln code push DIR --project %s (or "
                           "kiln submit --source-dir DIR)", sp->project);
        return KILN_EINVAL;
    }
    if (rc)
        *err = e2;
    return rc;
}

int svc_job_submit_check(svc_t *s, store_conn_t *c, const svc_caller_t *who, spec_t *sp, kiln_err_t *err)
{
    int rc = check_paths(s, sp, err);
    if (rc == 0)
        rc = svc_queue_resolve_job(c, sp->queue, sp->project, sp->res.slot_type,
                                   sp->res.nodes * sp->res.slots_per_node, err);
    if (rc == 0)
        rc = check_init_from_job(c, who, sp, err);
    if (rc == 0)
        rc = check_code_source(c, sp, err);
    return rc;
}

bool svc_job_submit_same(const spec_t *a, const spec_t *b)
{
    if (strcmp(a->project, b->project) || strcmp(a->queue, b->queue) || strcmp(a->res.slot_type, b->res.slot_type) ||
        a->res.nodes != b->res.nodes || a->res.slots_per_node != b->res.slots_per_node ||
        strcmp(a->model.init_from, b->model.init_from) || strcmp(a->script.source, b->script.source))
        return false;
    /* the shape check_init_from_job compares with the model it starts from */
    if (svc_init_from_job(a->model.init_from) &&
        (a->model.n_layer != b->model.n_layer || a->model.n_head != b->model.n_head ||
         a->model.n_embd != b->model.n_embd || a->model.seq_len != b->model.seq_len ||
         a->model.vocab_size != b->model.vocab_size))
        return false;
    svc_spec_path_t pa[SVC_SPEC_PATHS], pb[SVC_SPEC_PATHS];
    int na = svc_spec_paths(a, pa), nb = svc_spec_paths(b, pb);
    if (na != nb)
        return false;
    for (int i = 0; i < na; i++)
        if (strcmp(pa[i].field, pb[i].field) || strcmp(pa[i].path, pb[i].path))
            return false;
    return true;
}

/* The answer to a submission under an idempotency key that job k of its project holds: that job
 * (into *out) when it was made from the same request; KILN_EREUSED naming it otherwise. */
static int key_held(store_conn_t *c, const store_job_key_t *k, json_t **out, kiln_err_t *err)
{
    if (k->same)
        return store_job_get_json(c, k->id, out, err);
    kiln_err_set(err, KILN_EREUSED, "idempotency_key",
                 "this idempotency key was used for job %s, submitted with a different spec", k->id);
    kiln_err_hint(err, "use a new key for a new job; repeat a request only with the same body");
    return KILN_EREUSED;
}

int svc_job_create(svc_t *s, const svc_caller_t *who, const json_t *spec, const char *idempotency_key,
                   json_t **out, bool *out_created, kiln_err_t *err)
{
    spec_t sp;
    json_t *norm = NULL, *tags = NULL, *hparams = NULL;
    char *spec_text = NULL, *tags_text = NULL, *paths_text = NULL, *hparams_text = NULL;
    store_conn_t *c = NULL;
    bool parsed = false;
    *out = NULL;
    if (out_created)
        *out_created = false;
    if (!spec || !json_is_object(spec))
        return kiln_err_set(err, KILN_EINVAL, NULL, "job spec must be a JSON object");
    int rc = 0;
    if (idempotency_key) {
        /* REST sends the header as it came, gRPC an empty string for none */
        rc = svc_check_str("idempotency_key", idempotency_key, 200, err);
        if (rc)
            return rc;
        if (!*idempotency_key)
            idempotency_key = NULL;
    }
    rc = spec_parse(spec, &sp, err);
    if (rc)
        return rc;
    parsed = true;
    rc = svc_project_need(who, sp.project, SVC_ROLE_EDITOR, err);
    if (rc)
        goto fail;
    norm = spec_to_json(&sp);
    if (!norm) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "could not encode the job spec");
        goto fail;
    }
    rc = store_conn_get(s->store, &c, err);
    if (rc)
        goto fail;
    /* What identifies the request behind an idempotency key: its normalised spec as the client
     * sent it (the same request over REST or gRPC, with defaults written out or left to kilnd, is
     * the same), before the project's default queue fills in a queue it names none of: that is
     * the server's state, which may change between a request and its retry. 15 significant
     * digits: what users type comes back unchanged (0.1, not 0.10000000000000001). The key is
     * looked up before the submission checks, which ask the server's state too: a retry of the
     * same request gets its job whatever that state is now. */
    uint8_t request_hash[STORE_HASH_LEN];
    bool names_queue = sp.queue[0] != '\0';
    if (idempotency_key) {
        spec_text = json_dumps(norm, JSON_COMPACT | SPEC_JSON_REALS);
        if (!spec_text) {
            rc = kiln_err_set(err, KILN_ENOMEM, NULL, "could not encode the job spec");
            goto fail;
        }
        svc_secret_hash(spec_text, request_hash);
        store_job_key_t held;
        rc = store_job_key_get(c, sp.project, idempotency_key, request_hash, &held, err);
        if (rc == 0 && held.found)
            rc = key_held(c, &held, out, err);
        if (rc || held.found)
            goto fail; /* the job it holds, created = false */
    }
    rc = svc_job_submit_check(s, c, who, &sp, err);
    if (rc)
        goto fail;
    if (!names_queue || !spec_text) {
        /* the stored spec names the queue used: encoded again only when it differs from the
         * request's */
        if (!names_queue && json_object_set_new(norm, "queue", json_string(sp.queue))) {
            rc = kiln_err_set(err, KILN_ENOMEM, NULL, "could not encode the job spec");
            goto fail;
        }
        free(spec_text);
        spec_text = json_dumps(norm, JSON_COMPACT | SPEC_JSON_REALS);
    }
    char reason[300];
    initial_reason(s, &sp, reason, sizeof(reason));
    tags = json_object();
    for (int i = 0; i < sp.n_tags; i++)
        json_object_set_new(tags, sp.tag_keys[i], json_string(sp.tag_values[i]));
    tags_text = json_dumps(tags, JSON_COMPACT);
    {
        svc_spec_path_t paths[SVC_SPEC_PATHS];
        int np = svc_spec_paths(&sp, paths);
        json_t *arr = json_array();
        for (int i = 0; i < np; i++)
            json_array_append_new(arr, json_string(paths[i].path));
        paths_text = json_dumps(arr, JSON_COMPACT);
        json_decref(arr);
    }
    /* what search indexes as hp.NAME: numbers, nested keys joined with '.' */
    hparams = spec_hparams_flat(&sp);
    hparams_text = hparams ? json_dumps(hparams, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
    if (!spec_text || !tags_text || !paths_text || !hparams_text) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "could not encode the job spec");
        goto fail;
    }
    store_job_new_t j = {
        .name = sp.name, .project = sp.project, .queue = sp.queue, .slot_type = sp.res.slot_type,
        .spec_json = spec_text, .tags_json = tags_text, .idempotency_key = idempotency_key,
        .reason = reason,
        .priority = sp.priority, .nodes = sp.res.nodes, .slots_per_node = sp.res.slots_per_node,
        .world_size = spec_world_size(&sp), .max_attempts = sp.max_attempts > 0 ? sp.max_attempts : 1,
        .total_steps = sp.hp.max_steps, .submitted_by = who->user, .paths_json = paths_text,
        .request_hash = idempotency_key ? request_hash : NULL, .hparams_json = hparams_text,
    };
    char id[STORE_ID_LEN];
    bool created = false;
    /* A cluster admin may name any project, members only theirs: the insert checks that it
     * exists (in its statement, saving a round trip per job). */
    rc = store_job_insert(c, &j, id, &created, out, err);
    if (rc == KILN_ENOTFOUND && !strcmp(err->field, "project")) {
        rc = kiln_err_set(err, KILN_EINVAL, "project", "project \"%s\" does not exist", sp.project);
        kiln_err_hint(err, "create it first: kiln projects create %s", sp.project);
    }
    if (rc == KILN_EINVAL && !strcmp(err->field, "queue")) {
        /* the queue's projects changed since the check: refused as the check now refuses it */
        kiln_err_t e2;
        if (svc_queue_resolve_job(c, sp.queue, sp.project, sp.res.slot_type, sp.res.nodes * sp.res.slots_per_node,
                                  &e2))
            *err = e2;
    }
    if (rc == KILN_EREUSED) {
        /* the key was taken since it was looked up (a concurrent first try): answered as then */
        store_job_key_t held;
        kiln_err_t e2;
        if (store_job_key_get(c, sp.project, idempotency_key, request_hash, &held, &e2) == 0 && held.found)
            rc = key_held(c, &held, out, err);
    }
    if (rc)
        goto fail;
    if (created)
        log_info("job %s: created \"%s\" in project %s by %s (%d x %d %s ranks, priority %d): QUEUED", id,
                 sp.name, sp.project, who->user[0] ? who->user : "kilnd", sp.res.nodes,
                 sp.res.slots_per_node, sp.res.slot_type, sp.priority);
    if (out_created)
        *out_created = created;
    store_conn_put(s->store, c);
    c = NULL;
    if (created)
        svc_sched_wake(s);
fail:
    if (c)
        store_conn_put(s->store, c);
    if (parsed)
        spec_deinit(&sp);
    json_decref(norm);
    json_decref(tags);
    json_decref(hparams);
    free(spec_text);
    free(tags_text);
    free(paths_text);
    free(hparams_text);
    return rc;
}

int svc_job_get(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    JOB_RESOLVE(s, who, id, err);
    store_conn_t *c = NULL;
    int rc = store_conn_get(s->store, &c, err);
    if (rc)
        return rc;
    rc = store_job_get_json(c, id, out, err);
    if (rc == 0 && svc_caller_role(who, json_string_value(json_object_get(*out, "project"))) == SVC_ROLE_NONE) {
        store_conn_put(s->store, c);
        json_decref(*out);
        *out = NULL;
        return bad_job_id(err, id);
    }
    json_t *sums = NULL;
    if (rc == 0)
        rc = store_job_summaries_json(c, &id, 1, NULL, 0, &sums, err);
    store_conn_put(s->store, c);
    if (rc) {
        json_decref(*out);
        *out = NULL;
        return rc;
    }
    json_t *mine = json_object_get(sums, id);
    json_object_set_new(*out, "summaries", mine ? json_incref(mine) : json_object());
    json_decref(sums);
    return 0;
}

int svc_job_stop(svc_t *s, const svc_caller_t *who, const char *id, const char *reason, json_t **out,
                 kiln_err_t *err)
{
    svc_tx_t tx;
    store_job_row_t job;
    char why[512];
    *out = NULL;
    JOB_RESOLVE(s, who, id, err);
    int rc = svc_check_line("reason", reason, 200, err);
    if (rc)
        return rc;
    if (who->user[0])
        kiln_text_fmt(why, sizeof(why), "stop requested by %s%s%s", who->user, reason && *reason ? ": " : "",
                      reason && *reason ? reason : "");
    else
        kiln_text_fmt(why, sizeof(why), "stop requested%s%s", reason && *reason ? ": " : "",
                      reason && *reason ? reason : "");
    rc = svc_tx_begin(s, &tx, err);
    if (rc)
        return rc;
    tx.actor = who->user;
    rc = svc_job_access(tx.c, who, id, SVC_ROLE_EDITOR, err);
    if (rc == 0)
        rc = store_job_row(tx.c, id, true, &job, err);
    if (rc)
        goto fail;
    svc_job_state_t st = svc_state_parse(job.state);
    switch (st) {
    case JOB_STATE_QUEUED:
    case JOB_STATE_SCHEDULED:
    case JOB_STATE_RESTARTING:
    case JOB_STATE_PAUSED:
    case JOB_STATE_PREEMPTED:
        /* Nothing runs for the current attempt (SCHEDULED: not delivered yet; PAUSED: its
         * ranks exited at stopping.max_steps; PREEMPTED: its ranks were stopped). */
        if (st == JOB_STATE_SCHEDULED)
            rc = store_assign_stop(tx.c, id, job.attempt, why, NULL, err);
        if (rc == 0)
            rc = svc_job_set_state(&tx, &job, JOB_STATE_STOPPED, job.attempt, STORE_TR_STOP_REQ, why, err);
        break;
    case JOB_STATE_STARTING:
    case JOB_STATE_RUNNING:
        rc = store_assign_stop(tx.c, id, job.attempt, why, NULL, err);
        if (rc == 0)
            rc = svc_job_set_state(&tx, &job, JOB_STATE_STOPPING, job.attempt, STORE_TR_STOP_REQ, why, err);
        if (rc == 0)
            rc = svc_job_finish_stopping(&tx, &job, err);
        break;
    case JOB_STATE_STOPPING:
        /* already on its way: asking again is not an error; a job stopping for a preemption
         * ends STOPPED now instead of waiting to resume */
        if (job.preempted_by[0])
            rc = store_job_set_preempted_by(tx.c, id, NULL, err);
        if (rc == 0 && job.preempted_by[0]) {
            job.preempted_by[0] = '\0';
            rc = svc_job_finish_stopping(&tx, &job, err);
        }
        break;
    default:
        rc = kiln_err_set(err, KILN_ESTATE, NULL, "job \"%s\" has already finished (%s)", id, job.state);
        kiln_err_hint(err, "only jobs that have not finished can be stopped");
        break;
    }
    if (rc)
        goto fail;
    rc = svc_tx_commit(&tx, err);
    if (rc)
        return rc;
    return svc_job_get(s, who, id, out, err);
fail:
    svc_tx_abort(&tx);
    return rc;
}

int svc_job_events(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    JOB_RESOLVE(s, who, id, err);
    store_conn_t *c = NULL;
    json_t *ev = NULL;
    int rc = store_conn_get(s->store, &c, err);
    if (rc)
        return rc;
    rc = svc_job_access(c, who, id, SVC_ROLE_VIEWER, err);
    if (rc == 0)
        rc = store_job_events_json(c, id, &ev, err);
    store_conn_put(s->store, c);
    if (rc)
        return rc;
    *out = json_pack("{s:o}", "events", ev);
    return 0;
}

int svc_job_logs(svc_t *s, const svc_caller_t *who, const char *id, const svc_log_query_t *q,
                 json_t **out, kiln_err_t *err)
{
    *out = NULL;
    JOB_RESOLVE(s, who, id, err);
    store_log_query_t sq = {.rank = q ? q->rank : -1, .since_us = q ? q->since_us : 0,
                            .after_seq = q ? q->after_seq : 0, .limit = q ? q->limit : 0};
    int rc = 0;
    if ((rc = svc_check_range("rank", sq.rank, -1, 1 << 20, err)) ||
        (rc = svc_check_range("after_seq", sq.after_seq, 0, INT64_MAX, err)) ||
        (rc = svc_check_range("limit", sq.limit, 0, 10000, err)))
        return rc;
    if (sq.since_us < 0 || sq.since_us >= 253402300800000000LL) { /* before 1970, or from the year 10000 */
        kiln_err_set(err, KILN_EINVAL, "since", "since must be a time from 1970 to the end of 9999");
        kiln_err_hint(err, "use RFC 3339 (2026-11-21T06:04:37Z) or Unix seconds; leave since out for every line");
        return KILN_EINVAL;
    }
    if (sq.limit <= 0)
        sq.limit = 1000;
    store_conn_t *c = NULL;
    json_t *lines = NULL;
    int64_t last = 0;
    char state[16];
    rc = store_conn_get(s->store, &c, err);
    if (rc)
        return rc;
    rc = svc_job_access(c, who, id, SVC_ROLE_VIEWER, err);
    if (rc == 0)
        rc = store_job_state(c, id, state, sizeof(state), NULL, 0, err);
    if (rc == 0)
        rc = store_logs_query_json(c, id, &sq, &lines, &last, err);
    store_conn_put(s->store, c);
    if (rc)
        return rc;
    *out = json_pack("{s:o, s:I}", "lines", lines, "next_since_seq", (json_int_t)last);
    return 0;
}

int svc_job_metrics(svc_t *s, const svc_caller_t *who, const char *id, const svc_metrics_query_t *q,
                    json_t **out, kiln_err_t *err)
{
    *out = NULL;
    svc_metrics_query_t mq = q ? *q : (svc_metrics_query_t){0};
    int rc = 0;
    if ((mq.max_points_set && (rc = svc_check_range("max_points", mq.max_points, 2, 100000, err))) ||
        (rc = svc_check_str("name", mq.name, 128, err)) ||
        (rc = svc_check_range("attempt", mq.attempt, -1, INT32_MAX, err)))
        return rc;
    if (mq.start_step < 0 || mq.end_step < 0) {
        const char *f = mq.start_step < 0 ? "start_step" : "end_step";
        kiln_err_set(err, KILN_EINVAL, f, "%s must be 0 or more (got %lld)", f,
                     (long long)(mq.start_step < 0 ? mq.start_step : mq.end_step));
        kiln_err_hint(err, "steps count from 1; leave a bound out (or 0) for no bound on that side");
        return KILN_EINVAL;
    }
    if (mq.end_step > 0 && mq.start_step > mq.end_step) {
        kiln_err_set(err, KILN_EINVAL, "end_step", "end_step %lld is before start_step %lld",
                     (long long)mq.end_step, (long long)mq.start_step);
        kiln_err_hint(err, "end_step must be at least start_step");
        return KILN_EINVAL;
    }
    JOB_RESOLVE(s, who, id, err);
    store_metrics_query_t sq = {.name = mq.name && *mq.name ? mq.name : NULL,
                                .max_points = mq.max_points_set ? mq.max_points : 1000,
                                .attempt = mq.attempt, .start_step = mq.start_step, .end_step = mq.end_step};
    store_conn_t *c = NULL;
    json_t *series = NULL;
    char state[16];
    rc = store_conn_get(s->store, &c, err);
    if (rc)
        return rc;
    rc = svc_job_access(c, who, id, SVC_ROLE_VIEWER, err);
    if (rc == 0)
        rc = store_job_state(c, id, state, sizeof(state), NULL, 0, err);
    if (rc == 0)
        rc = store_metrics_query_json(c, id, &sq, &series, err);
    store_conn_put(s->store, c);
    if (rc)
        return rc;
    *out = json_pack("{s:o}", "metrics", series);
    return 0;
}

int svc_workers_list(svc_t *s, const svc_caller_t *who, json_t **out, kiln_err_t *err)
{
    (void)who; /* every authenticated user sees the cluster's workers */
    *out = NULL;
    store_conn_t *c = NULL;
    json_t *w = NULL;
    int rc = store_conn_get(s->store, &c, err);
    if (rc)
        return rc;
    rc = store_workers_list_json(c, &w, err);
    store_conn_put(s->store, c);
    if (rc)
        return rc;
    *out = json_pack("{s:o}", "workers", w);
    return 0;
}
