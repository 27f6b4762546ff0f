/* grpc_training.c - TrainingService over gRPC: the service speaks JSON shaped like the REST API
 * (docs/contracts.md), and proto field names are the JSON keys, so one generic converter driven
 * by protobuf-c's descriptors (grpc_codec.c) turns JSON into messages (and a JobSpec message
 * into JSON). The server streams (StreamLogs, DownloadArtifact) live in grpc_stream.c. */
#include "api/grpc_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- handlers ---------------------------------------------------------------------------- */

/* Converts the service's JSON answer (a new reference, consumed) into a message of type d. */
static int reply(json_t *j, const ProtobufCMessageDescriptor *d, arena_t *a, ProtobufCMessage **resp)
{
    *resp = api_grpc_json_to_msg(j, d, a);
    json_decref(j);
    return 0;
}

/* A JobSpec message as the JSON the service validates; fields are named under prefix ("spec"):
 * a script job's free-form hyperparameters arrive as JSON text and become the object. */
static int spec_json(const Kiln__JobSpec *m, const char *prefix, json_t **out, kiln_err_t *err)
{
    json_t *spec = NULL;
    *out = NULL;
    int rc = m ? api_grpc_msg_to_json(&m->base, prefix, &spec, err) : 0;
    if (rc)
        return rc;
    if (!spec)
        spec = json_object();
    const json_t *hpj = json_object_get(spec, "hyperparameters_json");
    if (hpj) {
        json_error_t je;
        json_t *hp = json_loads(json_string_value(hpj), JSON_REJECT_DUPLICATES, &je);
        if (!json_is_object(hp) || json_object_get(spec, "hyperparameters")) {
            kiln_err_set(err, KILN_EINVAL, NULL, hp ? "%s.hyperparameters_json must be a JSON object's text, set "
                         "without hyperparameters" : "%s.hyperparameters_json is not JSON: %s", prefix, je.text);
            snprintf(err->field, sizeof err->field, "%s.hyperparameters_json", prefix);
            kiln_err_hint(err, "send a script job's hyperparameters as {\"epochs\": 3, ...} in hyperparameters_json, "
                               "an engine job's in hyperparameters");
            json_decref(hp);
            json_decref(spec);
            return KILN_EINVAL;
        }
        json_object_set_new(spec, "hyperparameters", hp);
        json_object_del(spec, "hyperparameters_json");
    }
    *out = spec;
    return 0;
}

/* A field the service names ("hyperparameters.lr") as the request message's ("spec.hyperparameters.lr"). */
static void field_under(const char *prefix, kiln_err_t *err)
{
    char f[sizeof(err->field)];
    snprintf(f, sizeof(f), "%s.%.*s", prefix, (int)(sizeof(err->field) - strlen(prefix) - 2), err->field);
    kiln_strlcpy(err->field, f, sizeof(err->field));
}

static int h_create(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a, ProtobufCMessage **resp,
                    kiln_err_t *err)
{
    svc_t *s = ctx->svc;
    const Kiln__CreateJobRequest *r = (const Kiln__CreateJobRequest *)req;
    json_t *spec = NULL, *job = NULL;
    int rc = spec_json(r->spec, "spec", &spec, err);
    if (rc)
        return rc;
    bool created = false;
    rc = svc_job_create(s, ctx->who, spec, r->idempotency_key, &job, &created, err);
    json_decref(spec);
    if (rc && err->field[0] && strncmp(err->field, "idempotency_key", 15) != 0)
        field_under("spec", err); /* the spec's fields are named from the request message */
    return rc ? rc : reply(job, &kiln__job__descriptor, a, resp);
}

static int h_get(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a, ProtobufCMessage **resp,
                 kiln_err_t *err)
{
    svc_t *s = ctx->svc;
    const Kiln__GetJobRequest *r = (const Kiln__GetJobRequest *)req;
    json_t *job = NULL;
    int rc = svc_job_get(s, ctx->who, r->id, &job, err);
    return rc ? rc : reply(job, &kiln__job__descriptor, a, resp);
}

static int h_list(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a, ProtobufCMessage **resp,
                  kiln_err_t *err)
{
    svc_t *s = ctx->svc;
    const Kiln__ListJobsRequest *r = (const Kiln__ListJobsRequest *)req;
    svc_job_filter_t f = {
        .status = r->status && r->status[0] ? r->status : NULL,
        .tag = r->tag && r->tag[0] ? r->tag : NULL,
        .page_size = r->page_size ? r->page_size->value : 0,
        .page_size_set = r->page_size != NULL,
        .page_token = r->page_token && r->page_token[0] ? r->page_token : NULL,
    };
    json_t *out = NULL;
    int rc = svc_job_list(s, ctx->who, &f, &out, err);
    return rc ? rc : reply(out, &kiln__list_jobs_response__descriptor, a, resp);
}

static int h_search(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a, ProtobufCMessage **resp,
                    kiln_err_t *err)
{
    const Kiln__SearchJobsRequest *r = (const Kiln__SearchJobsRequest *)req;
    size_t len = 1;
    for (size_t i = 0; i < r->n_columns; i++)
        len += strlen(r->columns[i] ? r->columns[i] : "") + 1;
    char *cols = arena_alloc(a, len);
    for (size_t i = 0; i < r->n_columns; i++) {
        if (i)
            strcat(cols, ",");
        strcat(cols, r->columns[i] ? r->columns[i] : "");
    }
    svc_job_filter_t f = {
        .status = r->status && r->status[0] ? r->status : NULL,
        .tag = r->tag && r->tag[0] ? r->tag : NULL,
        .filter = r->filter,
        .order_by = r->order_by,
        .columns = cols,
        .page_size = r->page_size,
        .page_size_set = r->page_size != 0, /* 0 is proto3's absent: the default; else 1 to 500 */
        .page_token = r->page_token,
    };
    json_t *out = NULL;
    int rc = svc_job_list(ctx->svc, ctx->who, &f, &out, err);
    if (rc)
        return rc;
    /* a column without a value is left out of the map (proto has no null) */
    size_t i;
    json_t *job;
    json_array_foreach(json_object_get(out, "jobs"), i, job) {
        json_t *colv = json_object_get(job, "columns");
        const char *k;
        json_t *v;
        void *tmp;
        json_object_foreach_safe(colv, tmp, k, v)
            if (json_is_null(v))
                json_object_del(colv, k);
    }
    return reply(out, &kiln__list_jobs_response__descriptor, a, resp);
}

static int h_stop(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a, ProtobufCMessage **resp,
                  kiln_err_t *err)
{
    svc_t *s = ctx->svc;
    const Kiln__StopJobRequest *r = (const Kiln__StopJobRequest *)req;
    json_t *job = NULL;
    int rc = svc_job_stop(s, ctx->who, r->id, r->reason && r->reason[0] ? r->reason : "stopped by a gRPC client", &job, err);
    return rc ? rc : reply(job, &kiln__job__descriptor, a, resp);
}

static int h_events(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a, ProtobufCMessage **resp,
                    kiln_err_t *err)
{
    svc_t *s = ctx->svc;
    const Kiln__ListJobEventsRequest *r = (const Kiln__ListJobEventsRequest *)req;
    json_t *out = NULL;
    char id[SVC_JOB_ID_SIZE];
    int rc = svc_job_resolve(s, ctx->who, r->id, id, err);
    if (rc == 0)
        rc = svc_job_events(s, ctx->who, id, &out, err);
    if (rc)
        return rc;
    size_t i;
    json_t *ev;
    json_array_foreach(json_object_get(out, "events"), i, ev)
        if (!json_object_get(ev, "job_id"))
            json_object_set_new(ev, "job_id", json_string(id));
    return reply(out, &kiln__list_job_events_response__descriptor, a, resp);
}

static int h_metrics(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a, ProtobufCMessage **resp,
                     kiln_err_t *err)
{
    svc_t *s = ctx->svc;
    const Kiln__GetMetricsRequest *r = (const Kiln__GetMetricsRequest *)req;
    json_t *out = NULL;
    svc_metrics_query_t q = {.name = r->name && r->name[0] ? r->name : NULL,
                             .max_points = r->max_points ? r->max_points->value : 0,
                             .max_points_set = r->max_points != NULL, .attempt = r->attempt,
                             .start_step = r->start_step, .end_step = r->end_step};
    int rc = svc_job_metrics(s, ctx->who, r->id, &q, &out, err);
    if (rc)
        return rc;
    return reply(out, &kiln__get_metrics_response__descriptor, a, resp);
}

static int h_workers(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a, ProtobufCMessage **resp,
                     kiln_err_t *err)
{
    svc_t *s = ctx->svc;
    (void)req;
    json_t *out = NULL;
    int rc = svc_workers_list(s, ctx->who, &out, err);
    return rc ? rc : reply(out, &kiln__list_workers_response__descriptor, a, resp);
}

/* ---- identity and tenancy ------------------------------------------------------------------ */

static int h_whoami(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a, ProtobufCMessage **resp,
                    kiln_err_t *err)
{
    (void)req;
    json_t *out = NULL;
    int rc = svc_whoami(ctx->svc, ctx->who, &out, err);
    return rc ? rc : reply(out, &kiln__who_am_iresponse__descriptor, a, resp);
}

static int h_create_user(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                         ProtobufCMessage **resp, kiln_err_t *err)
{
    const Kiln__CreateUserRequest *r = (const Kiln__CreateUserRequest *)req;
    json_t *out = NULL;
    int rc = svc_user_create(ctx->svc, ctx->who, r->name, r->cluster_admin, &out, err);
    return rc ? rc : reply(out, &kiln__user__descriptor, a, resp);
}

static int h_list_users(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                        ProtobufCMessage **resp, kiln_err_t *err)
{
    (void)req;
    json_t *out = NULL;
    int rc = svc_users_list(ctx->svc, ctx->who, &out, err);
    return rc ? rc : reply(out, &kiln__list_users_response__descriptor, a, resp);
}

static int h_create_token(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                          ProtobufCMessage **resp, kiln_err_t *err)
{
    const Kiln__CreateTokenRequest *r = (const Kiln__CreateTokenRequest *)req;
    json_t *out = NULL;
    int rc = svc_token_create(ctx->svc, ctx->who, r->user, r->expires_in_s, r->description, &out, err);
    return rc ? rc : reply(out, &kiln__create_token_response__descriptor, a, resp);
}

static int h_list_tokens(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                         ProtobufCMessage **resp, kiln_err_t *err)
{
    const Kiln__ListTokensRequest *r = (const Kiln__ListTokensRequest *)req;
    json_t *out = NULL;
    int rc = svc_tokens_list(ctx->svc, ctx->who, r->user, &out, err);
    return rc ? rc : reply(out, &kiln__list_tokens_response__descriptor, a, resp);
}

static int h_revoke_token(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                          ProtobufCMessage **resp, kiln_err_t *err)
{
    const Kiln__RevokeTokenRequest *r = (const Kiln__RevokeTokenRequest *)req;
    json_t *out = NULL;
    int rc = svc_token_revoke(ctx->svc, ctx->who, r->id, &out, err);
    return rc ? rc : reply(out, &kiln__token__descriptor, a, resp);
}

static int h_create_project(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                            ProtobufCMessage **resp, kiln_err_t *err)
{
    const Kiln__CreateProjectRequest *r = (const Kiln__CreateProjectRequest *)req;
    json_t *out = NULL;
    /* proto3's "" is unset: the queue "default", as REST's null or a body without the field */
    const char *dq = r->default_queue && *r->default_queue ? r->default_queue : NULL;
    int rc = svc_project_create(ctx->svc, ctx->who, r->name, dq, &out, err);
    return rc ? rc : reply(out, &kiln__project__descriptor, a, resp);
}

static int h_update_project(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                            ProtobufCMessage **resp, kiln_err_t *err)
{
    const Kiln__UpdateProjectRequest *r = (const Kiln__UpdateProjectRequest *)req;
    /* proto3's "" is unset: the queue "default" again, as REST's null */
    json_t *out = NULL, *patch = json_pack("{s:s?}", "default_queue",
                                           r->default_queue && *r->default_queue ? r->default_queue : NULL);
    int rc = svc_project_update(ctx->svc, ctx->who, r->project, patch, &out, err);
    json_decref(patch);
    return rc ? rc : reply(out, &kiln__project__descriptor, a, resp);
}

static int h_list_projects(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                           ProtobufCMessage **resp, kiln_err_t *err)
{
    (void)req;
    json_t *out = NULL;
    int rc = svc_projects_list(ctx->svc, ctx->who, &out, err);
    return rc ? rc : reply(out, &kiln__list_projects_response__descriptor, a, resp);
}

static int h_list_members(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                          ProtobufCMessage **resp, kiln_err_t *err)
{
    const Kiln__ListMembersRequest *r = (const Kiln__ListMembersRequest *)req;
    json_t *out = NULL;
    int rc = svc_members_list(ctx->svc, ctx->who, r->project, &out, err);
    return rc ? rc : reply(out, &kiln__list_members_response__descriptor, a, resp);
}

static int h_set_member(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                        ProtobufCMessage **resp, kiln_err_t *err)
{
    const Kiln__SetMemberRequest *r = (const Kiln__SetMemberRequest *)req;
    json_t *out = NULL;
    int rc = svc_member_set(ctx->svc, ctx->who, r->project, r->user, r->role, &out, err);
    return rc ? rc : reply(out, &kiln__member__descriptor, a, resp);
}

static int h_remove_member(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                           ProtobufCMessage **resp, kiln_err_t *err)
{
    const Kiln__RemoveMemberRequest *r = (const Kiln__RemoveMemberRequest *)req;
    int rc = svc_member_remove(ctx->svc, ctx->who, r->project, r->user, err);
    return rc ? rc : reply(json_object(), &kiln__empty__descriptor, a, resp);
}

static int h_list_artifacts(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                            ProtobufCMessage **resp, kiln_err_t *err)
{
    const Kiln__ListArtifactsRequest *r = (const Kiln__ListArtifactsRequest *)req;
    json_t *out = NULL;
    int rc = svc_job_artifacts(ctx->svc, ctx->who, r->id, &out, err);
    return rc ? rc : reply(out, &kiln__list_artifacts_response__descriptor, a, resp);
}

static int h_list_checkpoints(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                              ProtobufCMessage **resp, kiln_err_t *err)
{
    const Kiln__ListCheckpointsRequest *r = (const Kiln__ListCheckpointsRequest *)req;
    json_t *out = NULL;
    int rc = svc_job_checkpoints(ctx->svc, ctx->who, r->id, &out, err);
    return rc ? rc : reply(out, &kiln__list_checkpoints_response__descriptor, a, resp);
}

static int h_delete_job(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                        ProtobufCMessage **resp, kiln_err_t *err)
{
    const Kiln__DeleteJobRequest *r = (const Kiln__DeleteJobRequest *)req;
    json_t *out = NULL;
    int rc = svc_job_delete(ctx->svc, ctx->who, r->id, &out, err);
    return rc ? rc : reply(out, &kiln__delete_job_response__descriptor, a, resp);
}

/* ---- what agents are trusted with ------------------------------------------------------------ */

static int h_create_join_token(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                               ProtobufCMessage **resp, kiln_err_t *err)
{
    const Kiln__CreateJoinTokenRequest *r = (const Kiln__CreateJoinTokenRequest *)req;
    json_t *out = NULL;
    int64_t uses = r->uses ? r->uses->value : 0;
    int rc = svc_join_token_create(ctx->svc, ctx->who, r->uses ? &uses : NULL, r->expires_in, r->description, &out,
                                   err);
    return rc ? rc : reply(out, &kiln__create_join_token_response__descriptor, a, resp);
}

static int h_list_join_tokens(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                              ProtobufCMessage **resp, kiln_err_t *err)
{
    (void)req;
    json_t *out = NULL;
    int rc = svc_join_tokens_list(ctx->svc, ctx->who, &out, err);
    return rc ? rc : reply(out, &kiln__list_join_tokens_response__descriptor, a, resp);
}

static int h_revoke_join_token(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                               ProtobufCMessage **resp, kiln_err_t *err)
{
    const Kiln__RevokeJoinTokenRequest *r = (const Kiln__RevokeJoinTokenRequest *)req;
    json_t *out = NULL;
    int rc = svc_join_token_revoke(ctx->svc, ctx->who, r->id, &out, err);
    return rc ? rc : reply(out, &kiln__join_token__descriptor, a, resp);
}

static int h_approve_worker(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                            ProtobufCMessage **resp, kiln_err_t *err)
{
    const Kiln__ApproveWorkerRequest *r = (const Kiln__ApproveWorkerRequest *)req;
    json_t *out = NULL;
    int rc = svc_worker_approve(ctx->svc, ctx->who, r->id, &out, err);
    return rc ? rc : reply(out, &kiln__worker__descriptor, a, resp);
}

static int h_remove_worker(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                           ProtobufCMessage **resp, kiln_err_t *err)
{
    const Kiln__RemoveWorkerRequest *r = (const Kiln__RemoveWorkerRequest *)req;
    json_t *out = NULL;
    int rc = svc_worker_remove(ctx->svc, ctx->who, r->id, r->ban, r->reason, &out, err);
    return rc ? rc : reply(out, &kiln__remove_worker_response__descriptor, a, resp);
}

static int h_list_worker_bans(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                              ProtobufCMessage **resp, kiln_err_t *err)
{
    (void)req;
    json_t *out = NULL;
    int rc = svc_worker_bans_list(ctx->svc, ctx->who, &out, err);
    return rc ? rc : reply(out, &kiln__list_worker_bans_response__descriptor, a, resp);
}

static int h_delete_worker_ban(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                               ProtobufCMessage **resp, kiln_err_t *err)
{
    const Kiln__DeleteWorkerBanRequest *r = (const Kiln__DeleteWorkerBanRequest *)req;
    char id[24];
    snprintf(id, sizeof(id), "%lld", (long long)r->id);
    json_t *out = NULL;
    int rc = svc_worker_ban_delete(ctx->svc, ctx->who, id, &out, err);
    return rc ? rc : reply(out, &kiln__worker_ban__descriptor, a, resp);
}

/* ---- tuning jobs ------------------------------------------------------------------------------ */

/* The service's tuning job with its free values (a trial's parameters, the best's, the spec's
 * categorical values) as JSON text. */
static int tuning_reply(json_t *tj, arena_t *a, ProtobufCMessage **resp)
{
    const char *name;
    json_t *param;
    json_object_foreach(json_object_get(json_object_get(tj, "spec"), "parameters"), name, param) {
        json_t *vals = json_object_get(param, "values");
        if (!vals)
            continue;
        char *text = json_dumps(vals, JSON_COMPACT | JSON_ENCODE_ANY | SPEC_JSON_REALS);
        json_object_set_new(param, "values_json", json_string(text ? text : "[]"));
        free(text);
    }
    json_t *lists[1] = {json_object_get(tj, "trials")};
    size_t i;
    json_t *tr;
    json_array_foreach(lists[0], i, tr) {
        char *p = json_dumps(json_object_get(tr, "parameters"), JSON_COMPACT | SPEC_JSON_REALS);
        json_object_set_new(tr, "parameters_json", json_string(p ? p : "{}"));
        free(p);
    }
    json_t *best = json_object_get(tj, "best");
    if (json_is_object(best)) {
        char *p = json_dumps(json_object_get(best, "parameters"), JSON_COMPACT | SPEC_JSON_REALS);
        json_object_set_new(best, "parameters_json", json_string(p ? p : "{}"));
        free(p);
    }
    return reply(tj, &kiln__tuning_job__descriptor, a, resp);
}

static int h_create_tuning(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                           ProtobufCMessage **resp, kiln_err_t *err)
{
    const Kiln__CreateTuningJobRequest *r = (const Kiln__CreateTuningJobRequest *)req;
    json_t *body = NULL, *job = NULL, *out = NULL;
    int rc = r->tuning_job ? api_grpc_msg_to_json(&r->tuning_job->base, "tuning_job", &body, err) : 0;
    if (rc == 0 && !body)
        body = json_object();
    if (rc == 0 && r->tuning_job && r->tuning_job->job) {
        rc = spec_json(r->tuning_job->job, "tuning_job.job", &job, err);
        if (rc == 0)
            json_object_set_new(body, "job", job);
    }
    /* categorical values arrive as JSON text */
    const char *name;
    json_t *p;
    json_object_foreach(rc == 0 ? json_object_get(body, "parameters") : NULL, name, p) {
        const char *text = json_string_value(json_object_get(p, "values_json"));
        if (!text)
            continue;
        json_error_t je;
        json_t *vals = json_loads(text, JSON_DECODE_ANY, &je);
        if (!json_is_array(vals)) {
            rc = kiln_err_set(err, KILN_EINVAL, NULL, "tuning_job.parameters.%.80s.values_json is not a JSON array's text",
                              name);
            snprintf(err->field, sizeof err->field, "tuning_job.parameters.%.80s.values_json", name);
            kiln_err_hint(err, "send the values as text such as [64, 128] or [\"adam\", \"sgd\"]");
            json_decref(vals);
            break;
        }
        json_object_set_new(p, "values", vals);
        json_object_del(p, "values_json");
    }
    if (rc == 0) {
        rc = svc_tuning_create(ctx->svc, ctx->who, body, &out, err);
        if (rc && err->field[0] && strncmp(err->field, "tuning_job.", 11) != 0)
            field_under("tuning_job", err);
    }
    json_decref(body);
    return rc ? rc : tuning_reply(out, a, resp);
}

static int h_list_tuning(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                         ProtobufCMessage **resp, kiln_err_t *err)
{
    const Kiln__ListTuningJobsRequest *r = (const Kiln__ListTuningJobsRequest *)req;
    /* page_size is a wrapper, as ListJobs': 0 is refused as REST refuses page_size=0 */
    svc_page_t page = {
        .page_size = r->page_size ? r->page_size->value : 0,
        .page_size_set = r->page_size != NULL,
        .page_token = r->page_token && r->page_token[0] ? r->page_token : NULL,
    };
    json_t *out = NULL;
    int rc = svc_tuning_list(ctx->svc, ctx->who, &page, &out, err);
    return rc ? rc : reply(out, &kiln__list_tuning_jobs_response__descriptor, a, resp);
}

static int h_get_tuning(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                        ProtobufCMessage **resp, kiln_err_t *err)
{
    const Kiln__GetTuningJobRequest *r = (const Kiln__GetTuningJobRequest *)req;
    json_t *out = NULL;
    int rc = svc_tuning_get(ctx->svc, ctx->who, r->id, &out, err);
    return rc ? rc : tuning_reply(out, a, resp);
}

static int h_stop_tuning(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a,
                         ProtobufCMessage **resp, kiln_err_t *err)
{
    const Kiln__StopTuningJobRequest *r = (const Kiln__StopTuningJobRequest *)req;
    json_t *out = NULL;
    int rc = svc_tuning_stop(ctx->svc, ctx->who, r->id, &out, err);
    return rc ? rc : tuning_reply(out, a, resp);
}

/* ---- queues ----------------------------------------------------------------------------------- */

/* The queue message as the JSON the service validates (only what the client set): a quota
 * without entries and unlimited_quota is REST's "quota": null (no quota limit). */
static int queue_json(const Kiln__Queue *q, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    int rc = q ? api_grpc_msg_to_json(&q->base, "queue", out, err) : 0;
    if (rc == 0 && !*out)
        *out = json_object();
    if (rc == 0 && json_object_get(*out, "unlimited_quota")) {
        json_object_del(*out, "unlimited_quota");
        if (q->n_quota > 0) {
            kiln_err_set(err, KILN_EINVAL, "queue.unlimited_quota",
                         "unlimited_quota is set with quota entries: a queue has a quota or none");
            kiln_err_hint(err, "leave quota empty for no quota limit, or unlimited_quota unset for a quota");
            json_decref(*out);
            *out = NULL;
            return KILN_EINVAL;
        }
        json_object_set_new(*out, "quota", json_null());
    }
    return rc;
}

/* An answer's queue (the service's JSON, REST's shape) with unlimited_quota saying what REST's
 * "quota": null does: an empty quota map cannot. */
static void queue_answer(json_t *q)
{
    if (json_is_null(json_object_get(q, "quota")))
        json_object_set_new(q, "unlimited_quota", json_true());
}

/* A queue field the service names ("quota.cpu") as the request message's ("queue.quota.cpu");
 * an update's name is the request's own. */
static int queue_field(int rc, bool update, kiln_err_t *err)
{
    if (rc && err->field[0] && strcmp(err->field, "update_mask") != 0 && !(update && !strcmp(err->field, "name"))) {
        char f[sizeof(err->field)];
        snprintf(f, sizeof(f), "queue.%.*s", (int)sizeof(err->field) - 7, err->field);
        kiln_strlcpy(err->field, f, sizeof(err->field));
    }
    return rc;
}

static int h_create_queue(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a, ProtobufCMessage **resp,
                          kiln_err_t *err)
{
    const Kiln__CreateQueueRequest *r = (const Kiln__CreateQueueRequest *)req;
    json_t *body = NULL, *out = NULL;
    int rc = queue_json(r->queue, &body, err);
    if (rc == 0)
        rc = queue_field(svc_queue_create(ctx->svc, ctx->who, body, &out, err), false, err);
    json_decref(body);
    if (rc == 0)
        queue_answer(out);
    return rc ? rc : reply(out, &kiln__queue__descriptor, a, resp);
}

static int h_list_queues(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a, ProtobufCMessage **resp,
                         kiln_err_t *err)
{
    (void)req;
    json_t *out = NULL, *q;
    int rc = svc_queues_list(ctx->svc, ctx->who, &out, err);
    size_t i;
    json_array_foreach(rc == 0 ? json_object_get(out, "queues") : NULL, i, q)
        queue_answer(q);
    return rc ? rc : reply(out, &kiln__list_queues_response__descriptor, a, resp);
}

static int h_get_queue(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a, ProtobufCMessage **resp,
                       kiln_err_t *err)
{
    const Kiln__GetQueueRequest *r = (const Kiln__GetQueueRequest *)req;
    json_t *out = NULL;
    int rc = svc_queue_get(ctx->svc, ctx->who, r->name, &out, err);
    if (rc == 0)
        queue_answer(out);
    return rc ? rc : reply(out, &kiln__queue__descriptor, a, resp);
}

/* A field the update mask names, as REST's JSON carries its value in the message's JSON (set,
 * borrowed; NULL when the message leaves it out): proto3 leaves a zero value out, so a number
 * named is 0, a boolean false, a list []; a text or a map named without a value is REST's null (no
 * cohort, no limit, no quota limit; a preemption value's default). fd: the field's descriptor, or
 * NULL for a name the message lacks (the service refuses it, as REST refuses an unknown field).
 * Caller owns the result. */
static json_t *masked_value(const json_t *set, const char *key, const ProtobufCFieldDescriptor *fd)
{
    json_t *v = json_incref(json_object_get(set, key));
    if (v || !fd)
        return v ? v : json_null();
    if (fd->label == PROTOBUF_C_LABEL_REPEATED && fd->type != PROTOBUF_C_TYPE_MESSAGE)
        return json_array();
    if (fd->label != PROTOBUF_C_LABEL_REPEATED && fd->type == PROTOBUF_C_TYPE_BOOL)
        return json_false();
    if (fd->label != PROTOBUF_C_LABEL_REPEATED && fd->type != PROTOBUF_C_TYPE_STRING &&
        fd->type != PROTOBUF_C_TYPE_MESSAGE)
        return json_integer(0);
    return json_null();
}

/* One update_mask path into patch, REST's PATCH body. A field of Queue ("weight"; "unlimited_quota"
 * is "quota") takes the message's value; a field of one of its message fields (AIP-161's dotted
 * path, "preemption.within_queue") goes into that field's object, which the service merges into
 * the stored one as REST's {"preemption": {"within_queue": ...}} does; the service refuses a
 * name that is not a field as REST does ("queue.preemption.x"). named: the fields named so far,
 * each true when named whole, false when by its fields. KILN_EINVAL naming update_mask for what
 * REST cannot say: a path with an empty name ("", "preemption."), a part of a field that changes
 * whole (a map's entry, "quota.cpu"; a scalar's, "preemption.within_queue.x"), and a message field
 * named both whole and by its fields. */
static int mask_path(const char *path, const json_t *set, json_t *patch, json_t *named, kiln_err_t *err)
{
    /* every name of the path names something: "", ".x", "preemption." and "a..b" do not */
    for (const char *p = path;; p++) {
        if (*p != '\0' && *p != '.')
            continue;
        if (p == path || p[-1] == '.') {
            kiln_err_set(err, KILN_EINVAL, "update_mask", "update_mask path \"%.80s\" has an empty field name", path);
            kiln_err_hint(err, "name each field to change, as in update_mask: [\"weight\", "
                               "\"preemption.within_queue\"]");
            return KILN_EINVAL;
        }
        if (*p == '\0')
            break;
    }
    const char *dot = strchr(path, '.');
    char head[64];
    snprintf(head, sizeof head, "%.*s", dot ? (int)KILN_MIN((size_t)(dot - path), sizeof head - 1) : 63, path);
    const char *f = strcmp(head, "unlimited_quota") ? head : "quota";
    const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field_by_name(&kiln__queue__descriptor, f);
    const json_t *before = json_object_get(named, f);
    if (before && json_is_true(before) != !dot) {
        kiln_err_set(err, KILN_EINVAL, "update_mask", "update_mask names %.60s both whole and by its fields", f);
        kiln_err_hint(err, "name \"%.60s\" for all of it, or each field of it to change (\"%.60s.FIELD\")", f, f);
        return KILN_EINVAL;
    }
    json_object_set_new(named, f, json_boolean(!dot));
    if (!dot) {
        json_object_set_new(patch, f, masked_value(set, f, fd));
        return 0;
    }
    if (fd && (fd->label == PROTOBUF_C_LABEL_REPEATED || fd->type != PROTOBUF_C_TYPE_MESSAGE)) {
        kiln_err_set(err, KILN_EINVAL, "update_mask", "update_mask path \"%.80s\" names a part of %.60s, which "
                     "changes whole", path, f);
        if (fd->label == PROTOBUF_C_LABEL_REPEATED)
            kiln_err_hint(err, "name \"%.60s\" and give all of %.60s in queue, as REST's PATCH does", f, f);
        else
            kiln_err_hint(err, "name \"%.60s\"", f);
        return KILN_EINVAL;
    }
    json_t *part = json_object_get(patch, f);
    if (!part) {
        part = json_object();
        json_object_set_new(patch, f, part);
    }
    const char *sub = dot + 1;
    const ProtobufCFieldDescriptor *sfd =
        fd ? protobuf_c_message_descriptor_get_field_by_name((const ProtobufCMessageDescriptor *)fd->descriptor, sub)
           : NULL;
    /* a path into one of its fields ("preemption.within_queue.x"): each of them changes whole */
    const char *dot2 = strchr(sub, '.');
    char subhead[64];
    snprintf(subhead, sizeof subhead, "%.*s", dot2 ? (int)KILN_MIN((size_t)(dot2 - sub), sizeof subhead - 1) : 63,
             sub);
    if (fd && dot2 &&
        protobuf_c_message_descriptor_get_field_by_name((const ProtobufCMessageDescriptor *)fd->descriptor, subhead)) {
        kiln_err_set(err, KILN_EINVAL, "update_mask", "update_mask path \"%.80s\" names a part of %.60s.%.60s, "
                     "which changes whole", path, f, subhead);
        kiln_err_hint(err, "name \"%.60s.%.60s\"", f, subhead);
        return KILN_EINVAL;
    }
    json_object_set_new(part, sub, masked_value(json_object_get(set, f), sub, sfd));
    return 0;
}

/* Queue's fields an answer carries alone (the service takes none of them). */
static const char *const k_queue_output_only[] = {"usage", "pending", "admitted", "created_at", "created_by",
                                                  "updated_at"};

/* Every field queue sets (set, queue_json's) is one update_mask names (named, patch: mask_path's),
 * whole or, for a message field named by its fields, each of its fields it sets: kiln changes
 * every field given or refuses the request, and never ignores one. proto3 leaves a scalar at its
 * zero value out, so only those are not told apart from unset. queue.name may repeat the request's
 * name. KILN_EINVAL naming the field otherwise. */
static int mask_covers(const json_t *set, const json_t *named, const json_t *patch, const char *name,
                       kiln_err_t *err)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)set, k, v) {
        const json_t *how = json_object_get(named, k);
        if (json_is_true(how) || (!how && !strcmp(k, "name") && json_is_string(v) && name &&
                                  !strcmp(json_string_value(v), name)))
            continue;
        char f[96], path[112];
        const char *sub;
        json_t *sv;
        snprintf(f, sizeof f, "%.60s", k);
        if (how && json_is_object(v)) {
            /* named by its fields: each it sets must be one of them */
            const char *missing = NULL;
            json_object_foreach(v, sub, sv) {
                if (!missing && !json_object_get(json_object_get(patch, k), sub))
                    missing = sub;
            }
            if (!missing)
                continue;
            snprintf(f, sizeof f, "%.40s.%.40s", k, missing);
        } else if (!strcmp(k, "quota") && json_is_null(v)) {
            snprintf(f, sizeof f, "unlimited_quota");
        }
        snprintf(path, sizeof path, "queue.%s", f);
        kiln_err_set(err, KILN_EINVAL, path, "%s is set but update_mask does not name it", f);
        bool output = false;
        for (size_t i = 0; i < KILN_ARRAY_LEN(k_queue_output_only); i++)
            output = output || !strcmp(k, k_queue_output_only[i]);
        if (output)
            kiln_err_hint(err, "%s is output only: leave it unset in an update", f);
        else if (!strcmp(k, "name"))
            kiln_err_hint(err, "leave queue.name unset, or give the request's name (the queue it changes)");
        else
            kiln_err_hint(err, "add \"%s\" to update_mask to change it, or leave it unset (an update changes every "
                          "field given or refuses the request)", f);
        return KILN_EINVAL;
    }
    return 0;
}

static int h_update_queue(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a, ProtobufCMessage **resp,
                          kiln_err_t *err)
{
    const Kiln__UpdateQueueRequest *r = (const Kiln__UpdateQueueRequest *)req;
    json_t *set = NULL, *patch = json_object(), *named = json_object(), *out = NULL;
    int rc = queue_json(r->queue, &set, err);
    for (size_t i = 0; rc == 0 && i < r->n_update_mask; i++)
        rc = mask_path(r->update_mask[i], set, patch, named, err);
    if (rc == 0 && r->n_update_mask == 0) {
        kiln_err_set(err, KILN_EINVAL, "update_mask", "update_mask must name the fields to change");
        kiln_err_hint(err, "for example update_mask: [\"weight\", \"quota\", \"preemption.within_queue\"]");
        rc = KILN_EINVAL;
    }
    if (rc == 0)
        rc = mask_covers(set, named, patch, r->name, err);
    if (rc == 0)
        rc = queue_field(svc_queue_update(ctx->svc, ctx->who, r->name, patch, &out, err), true, err);
    if (rc == 0)
        queue_answer(out);
    json_decref(set);
    json_decref(patch);
    json_decref(named);
    return rc ? rc : reply(out, &kiln__queue__descriptor, a, resp);
}

static int h_delete_queue(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a, ProtobufCMessage **resp,
                          kiln_err_t *err)
{
    const Kiln__DeleteQueueRequest *r = (const Kiln__DeleteQueueRequest *)req;
    int rc = svc_queue_delete(ctx->svc, ctx->who, r->name, err);
    return rc ? rc : reply(json_pack("{s:s}", "name", r->name), &kiln__delete_queue_response__descriptor, a, resp);
}

const api_grpc_method_t api_grpc_training_methods[] = {
    {"/kiln.TrainingService/CreateJob", &kiln__create_job_request__descriptor, h_create, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/GetJob", &kiln__get_job_request__descriptor, h_get, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/ListJobs", &kiln__list_jobs_request__descriptor, h_list, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/SearchJobs", &kiln__search_jobs_request__descriptor, h_search, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/StopJob", &kiln__stop_job_request__descriptor, h_stop, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/ListJobEvents", &kiln__list_job_events_request__descriptor, h_events, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/StreamLogs", &kiln__stream_logs_request__descriptor, NULL, api_grpc_stream_logs, API_GRPC_USER},
    {"/kiln.TrainingService/GetMetrics", &kiln__get_metrics_request__descriptor, h_metrics, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/ListWorkers", &kiln__list_workers_request__descriptor, h_workers, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/WhoAmI", &kiln__who_am_irequest__descriptor, h_whoami, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/CreateUser", &kiln__create_user_request__descriptor, h_create_user, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/ListUsers", &kiln__list_users_request__descriptor, h_list_users, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/CreateToken", &kiln__create_token_request__descriptor, h_create_token, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/ListTokens", &kiln__list_tokens_request__descriptor, h_list_tokens, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/RevokeToken", &kiln__revoke_token_request__descriptor, h_revoke_token, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/CreateProject", &kiln__create_project_request__descriptor, h_create_project, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/ListProjects", &kiln__list_projects_request__descriptor, h_list_projects, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/UpdateProject", &kiln__update_project_request__descriptor, h_update_project, NULL,
     API_GRPC_USER},
    {"/kiln.TrainingService/ListMembers", &kiln__list_members_request__descriptor, h_list_members, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/SetMember", &kiln__set_member_request__descriptor, h_set_member, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/RemoveMember", &kiln__remove_member_request__descriptor, h_remove_member, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/ListArtifacts", &kiln__list_artifacts_request__descriptor, h_list_artifacts, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/ListCheckpoints", &kiln__list_checkpoints_request__descriptor, h_list_checkpoints, NULL,
     API_GRPC_USER},
    {"/kiln.TrainingService/DownloadArtifact", &kiln__download_artifact_request__descriptor, NULL,
     api_grpc_stream_artifact, API_GRPC_USER},
    {"/kiln.TrainingService/DeleteJob", &kiln__delete_job_request__descriptor, h_delete_job, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/UploadCode", &kiln__upload_code_request__descriptor, api_grpc_upload_code, NULL,
     API_GRPC_USER},
    {"/kiln.TrainingService/DownloadCode", &kiln__download_code_request__descriptor, NULL, api_grpc_stream_code,
     API_GRPC_USER},
    {"/kiln.TrainingService/CreateJoinToken", &kiln__create_join_token_request__descriptor, h_create_join_token, NULL,
     API_GRPC_USER},
    {"/kiln.TrainingService/ListJoinTokens", &kiln__list_join_tokens_request__descriptor, h_list_join_tokens, NULL,
     API_GRPC_USER},
    {"/kiln.TrainingService/RevokeJoinToken", &kiln__revoke_join_token_request__descriptor, h_revoke_join_token, NULL,
     API_GRPC_USER},
    {"/kiln.TrainingService/ApproveWorker", &kiln__approve_worker_request__descriptor, h_approve_worker, NULL,
     API_GRPC_USER},
    {"/kiln.TrainingService/RemoveWorker", &kiln__remove_worker_request__descriptor, h_remove_worker, NULL,
     API_GRPC_USER},
    {"/kiln.TrainingService/ListWorkerBans", &kiln__list_worker_bans_request__descriptor, h_list_worker_bans, NULL,
     API_GRPC_USER},
    {"/kiln.TrainingService/DeleteWorkerBan", &kiln__delete_worker_ban_request__descriptor, h_delete_worker_ban, NULL,
     API_GRPC_USER},
    {"/kiln.TrainingService/CreateQueue", &kiln__create_queue_request__descriptor, h_create_queue, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/ListQueues", &kiln__list_queues_request__descriptor, h_list_queues, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/GetQueue", &kiln__get_queue_request__descriptor, h_get_queue, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/UpdateQueue", &kiln__update_queue_request__descriptor, h_update_queue, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/DeleteQueue", &kiln__delete_queue_request__descriptor, h_delete_queue, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/CreateTuningJob", &kiln__create_tuning_job_request__descriptor, h_create_tuning, NULL,
     API_GRPC_USER},
    {"/kiln.TrainingService/ListTuningJobs", &kiln__list_tuning_jobs_request__descriptor, h_list_tuning, NULL,
     API_GRPC_USER},
    {"/kiln.TrainingService/GetTuningJob", &kiln__get_tuning_job_request__descriptor, h_get_tuning, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/StopTuningJob", &kiln__stop_tuning_job_request__descriptor, h_stop_tuning, NULL,
     API_GRPC_USER},
};
const size_t api_grpc_training_method_count = KILN_ARRAY_LEN(api_grpc_training_methods);
