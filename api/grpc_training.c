/* grpc_training.c - TrainingService over gRPC: the service speaks JSON shaped like the REST API
 * (docs/contracts.md), and proto field names are the JSON keys, so one generic converter driven
 * by protobuf-c's descriptors turns JSON into messages (and a JobSpec message into JSON).
 * The server streams (StreamLogs, DownloadArtifact) live in grpc_stream.c. */
#include "api/grpc_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- JSON -> message ------------------------------------------------------------------------ */

static size_t elem_size(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
        return 8;
    case PROTOBUF_C_TYPE_DOUBLE:
        return sizeof(double);
    case PROTOBUF_C_TYPE_FLOAT:
        return sizeof(float);
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING: case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    default:
        return 4;
    }
}

static int enum_from_json(const ProtobufCEnumDescriptor *ed, const json_t *v)
{
    if (json_is_integer(v))
        return (int)json_integer_value(v);
    const char *s = json_string_value(v);
    if (!s || !s[0])
        return 0;
    size_t sl = strlen(s);
    for (unsigned i = 0; i < ed->n_values; i++) {
        const char *name = ed->values[i].name;
        size_t nl = strlen(name);
        if (!strcmp(name, s) || (nl > sl && name[nl - sl - 1] == '_' && !strcmp(name + nl - sl, s)))
            return ed->values[i].value;
    }
    return 0;
}

static ProtobufCMessage *msg_from_json(const json_t *j, const ProtobufCMessageDescriptor *d, arena_t *a);

/* google.protobuf's wrappers (Int32Value, DoubleValue, BoolValue, ...): a message with one field
 * "value" that stands for a scalar with explicit presence. */
static bool is_wrapper(const ProtobufCMessageDescriptor *d)
{
    return d && !strncmp(d->name, "google.protobuf.", 16) && d->n_fields == 1 &&
           !strcmp(d->fields[0].name, "value") && d->fields[0].type != PROTOBUF_C_TYPE_MESSAGE;
}

static void value_from_json(void *dst, const ProtobufCFieldDescriptor *f, const json_t *v, arena_t *a);

/* Writes one JSON value into a field slot of type t. */
static void value_from_json(void *dst, const ProtobufCFieldDescriptor *f, const json_t *v, arena_t *a)
{
    if (f->type == PROTOBUF_C_TYPE_MESSAGE && is_wrapper(f->descriptor)) {
        /* JSON carries the scalar itself (or null: absent) */
        if (json_is_null(v) || json_is_object(v) || json_is_array(v))
            return;
        const ProtobufCMessageDescriptor *wd = f->descriptor;
        ProtobufCMessage *w = arena_alloc(a, wd->sizeof_message);
        wd->message_init(w);
        value_from_json((char *)w + wd->fields[0].offset, &wd->fields[0], v, a);
        *(ProtobufCMessage **)dst = w;
        return;
    }
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
        *(int32_t *)dst = (int32_t)json_number_value(v);
        if (json_is_integer(v))
            *(int32_t *)dst = (int32_t)json_integer_value(v);
        break;
    case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
        *(uint32_t *)dst = json_is_integer(v) ? (uint32_t)json_integer_value(v) : (uint32_t)json_number_value(v);
        break;
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
        *(int64_t *)dst = json_is_integer(v) ? (int64_t)json_integer_value(v) : (int64_t)json_number_value(v);
        break;
    case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
        *(uint64_t *)dst = json_is_integer(v) ? (uint64_t)json_integer_value(v) : (uint64_t)json_number_value(v);
        break;
    case PROTOBUF_C_TYPE_DOUBLE:
        *(double *)dst = json_number_value(v);
        break;
    case PROTOBUF_C_TYPE_FLOAT:
        *(float *)dst = (float)json_number_value(v);
        break;
    case PROTOBUF_C_TYPE_BOOL:
        *(protobuf_c_boolean *)dst = json_is_true(v);
        break;
    case PROTOBUF_C_TYPE_ENUM:
        *(int *)dst = enum_from_json(f->descriptor, v);
        break;
    case PROTOBUF_C_TYPE_STRING:
        if (json_is_string(v)) {
            *(char **)dst = arena_strndup(a, json_string_value(v), json_string_length(v));
        } else if (json_is_number(v)) {
            *(char **)dst = arena_sprintf(a, "%.17g", json_number_value(v));
        } else if (json_is_object(v) || json_is_array(v)) {
            /* e.g. a partition plan: REST carries it as an object, proto as JSON text */
            char *text = json_dumps(v, JSON_COMPACT);
            *(char **)dst = arena_strdup(a, text ? text : "");
            free(text);
        }
        break;
    case PROTOBUF_C_TYPE_MESSAGE:
        if (json_is_object(v))
            *(ProtobufCMessage **)dst = msg_from_json(v, f->descriptor, a);
        break;
    case PROTOBUF_C_TYPE_BYTES:
        break;
    }
}

static bool is_map_entry(const ProtobufCFieldDescriptor *f)
{
    if (f->type != PROTOBUF_C_TYPE_MESSAGE)
        return false;
    const ProtobufCMessageDescriptor *d = f->descriptor;
    size_t nl = strlen(d->name);
    return d->n_fields == 2 && nl > 5 && !strcmp(d->name + nl - 5, "Entry") && !strcmp(d->fields[0].name, "key") &&
           !strcmp(d->fields[1].name, "value");
}

static ProtobufCMessage *msg_from_json(const json_t *j, const ProtobufCMessageDescriptor *d, arena_t *a)
{
    ProtobufCMessage *m = arena_alloc(a, d->sizeof_message);
    d->message_init(m);
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const json_t *v = json_object_get(j, f->name);
        void *slot = (char *)m + f->offset;
        if (!v && f->type == PROTOBUF_C_TYPE_INT64 && !strcmp(f->name, "time_us")) {
            /* log lines and metric points carry RFC 3339 "time" in JSON */
            int64_t us = 0;
            const char *t = json_string_value(json_object_get(j, "time"));
            if (t && kiln_time_parse(t, &us) == 0)
                *(int64_t *)slot = us;
            continue;
        }
        if (!v || json_is_null(v))
            continue;
        if (f->label != PROTOBUF_C_LABEL_REPEATED) {
            value_from_json(slot, f, v, a);
            continue;
        }
        size_t *count = (size_t *)((char *)m + f->quantifier_offset);
        if (is_map_entry(f) && json_is_object(v)) {
            const ProtobufCMessageDescriptor *ed = f->descriptor;
            size_t n = json_object_size(v);
            ProtobufCMessage **arr = arena_alloc(a, (n ? n : 1) * sizeof(*arr));
            const char *key;
            json_t *val;
            size_t k = 0;
            json_object_foreach((json_t *)v, key, val) {
                ProtobufCMessage *e = arena_alloc(a, ed->sizeof_message);
                ed->message_init(e);
                *(char **)((char *)e + ed->fields[0].offset) = arena_strdup(a, key);
                value_from_json((char *)e + ed->fields[1].offset, &ed->fields[1], val, a);
                arr[k++] = e;
            }
            *count = k;
            *(void **)slot = arr;
            continue;
        }
        if (!json_is_array(v))
            continue;
        size_t n = json_array_size(v), es = elem_size(f->type);
        char *arr = arena_alloc(a, (n ? n : 1) * es);
        for (size_t k = 0; k < n; k++)
            value_from_json(arr + k * es, f, json_array_get(v, k), a);
        if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            /* drop entries that were not objects: a NULL in a repeated message field is invalid */
            size_t w = 0;
            for (size_t k = 0; k < n; k++)
                if (((ProtobufCMessage **)arr)[k])
                    ((ProtobufCMessage **)arr)[w++] = ((ProtobufCMessage **)arr)[k];
            n = w;
        } else if (f->type == PROTOBUF_C_TYPE_STRING) {
            for (size_t k = 0; k < n; k++)
                if (!((char **)arr)[k])
                    ((char **)arr)[k] = arena_strdup(a, "");
        }
        *count = n;
        *(void **)slot = arr;
    }
    return m;
}

/* ---- message -> JSON (requests: what the client set) ------------------------------------------
 * Plain proto3 scalars and strings count as set when they differ from their default; wrapper
 * fields when present, whatever their value (an explicit zero). Checks what JSON cannot carry
 * the way the client meant it (NaN, Infinity, text that is not UTF-8, an unsigned number past
 * int64), naming the field by its dotted path under prefix. */

static int msg_to_json(const ProtobufCMessage *m, const char *prefix, json_t **out, kiln_err_t *err);

static void field_path(char *buf, size_t n, const char *prefix, const char *name)
{
    snprintf(buf, n, "%s%s%s", prefix, prefix[0] ? "." : "", name);
}

/* *out = the JSON of one value (NULL when it is the default and wrapped is false). */
static int value_to_json(const ProtobufCFieldDescriptor *f, const void *src, const char *path, bool wrapped,
                         json_t **out, kiln_err_t *err)
{
    *out = NULL;
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
        if (wrapped || *(const int32_t *)src)
            *out = json_integer(*(const int32_t *)src);
        return 0;
    case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
        if (wrapped || *(const uint32_t *)src)
            *out = json_integer(*(const uint32_t *)src);
        return 0;
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
        if (wrapped || *(const int64_t *)src)
            *out = json_integer(*(const int64_t *)src);
        return 0;
    case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: {
        uint64_t u = *(const uint64_t *)src;
        if (u > (uint64_t)INT64_MAX) {
            kiln_err_set(err, KILN_EINVAL, path, "%s is too large (at most %lld)", path, (long long)INT64_MAX);
            return KILN_EINVAL;
        }
        if (wrapped || u)
            *out = json_integer((json_int_t)u);
        return 0;
    }
    case PROTOBUF_C_TYPE_DOUBLE: case PROTOBUF_C_TYPE_FLOAT: {
        double d = f->type == PROTOBUF_C_TYPE_DOUBLE ? *(const double *)src : *(const float *)src;
        int rc = svc_check_finite(path, d, err);
        if (rc)
            return rc;
        if (wrapped || d != 0)
            *out = json_real(d);
        return 0;
    }
    case PROTOBUF_C_TYPE_BOOL:
        if (wrapped || *(const protobuf_c_boolean *)src)
            *out = json_boolean(*(const protobuf_c_boolean *)src);
        return 0;
    case PROTOBUF_C_TYPE_ENUM: {
        int v = *(const int *)src;
        const ProtobufCEnumValue *ev = v ? protobuf_c_enum_descriptor_get_value(f->descriptor, v) : NULL;
        if (ev)
            *out = json_string(ev->name);
        return 0;
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)src;
        if (!s || (!s[0] && !wrapped))
            return 0;
        int rc = svc_check_str(path, s, 0, err);
        if (rc)
            return rc;
        if (!strcmp(f->name, "partition_plan")) {
            json_t *plan = json_loads(s, 0, NULL);
            if (plan) {
                *out = plan;
                return 0;
            }
        }
        *out = json_string(s);
        return 0;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)src;
        if (!sub)
            return 0;
        const ProtobufCMessageDescriptor *sd = f->descriptor;
        if (is_wrapper(sd))
            return value_to_json(&sd->fields[0], (const char *)sub + sd->fields[0].offset, path, true, out, err);
        return msg_to_json(sub, path, out, err);
    }
    default:
        return 0;
    }
}

static int msg_to_json(const ProtobufCMessage *m, const char *prefix, json_t **out, kiln_err_t *err)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    json_t *o = json_object();
    int rc = 0;
    for (unsigned i = 0; i < d->n_fields && rc == 0; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *slot = (const char *)m + f->offset;
        char path[256];
        field_path(path, sizeof(path), prefix, f->name);
        json_t *v = NULL;
        if (f->label != PROTOBUF_C_LABEL_REPEATED) {
            rc = value_to_json(f, slot, path, false, &v, err);
            if (v)
                json_object_set_new(o, f->name, v);
            continue;
        }
        size_t n = *(const size_t *)((const char *)m + f->quantifier_offset);
        const char *arr = *(char *const *)slot;
        if (n == 0 || !arr)
            continue;
        if (is_map_entry(f)) {
            const ProtobufCMessageDescriptor *ed = f->descriptor;
            json_t *map = json_object();
            json_object_set_new(o, f->name, map);
            for (size_t k = 0; k < n && rc == 0; k++) {
                const ProtobufCMessage *e = ((ProtobufCMessage *const *)arr)[k];
                const char *key = *(char *const *)((const char *)e + ed->fields[0].offset);
                char kpath[320];
                snprintf(kpath, sizeof(kpath), "%s.%s", path, key ? key : "");
                if ((rc = svc_check_str(path, key, 0, err)))
                    break;
                rc = value_to_json(&ed->fields[1], (const char *)e + ed->fields[1].offset, kpath, true, &v, err);
                if (rc == 0)
                    json_object_set_new(map, key ? key : "", v ? v : json_string(""));
            }
            continue;
        }
        json_t *ja = json_array();
        json_object_set_new(o, f->name, ja);
        size_t es = elem_size(f->type);
        for (size_t k = 0; k < n && rc == 0; k++) {
            char ipath[280];
            snprintf(ipath, sizeof(ipath), "%s[%zu]", path, k);
            rc = value_to_json(f, arr + k * es, ipath, true, &v, err);
            if (rc == 0)
                json_array_append_new(ja, v ? v : json_object());
        }
    }
    if (rc) {
        json_decref(o);
        *out = NULL;
        return rc;
    }
    *out = o;
    return 0;
}

/* ---- handlers ---------------------------------------------------------------------------- */

/* Converts the service's JSON answer (a new reference, consumed) into a message of type d. */
static int reply(json_t *j, const ProtobufCMessageDescriptor *d, arena_t *a, ProtobufCMessage **resp)
{
    *resp = msg_from_json(j, d, a);
    json_decref(j);
    return 0;
}

static int h_create(const api_grpc_ctx_t *ctx, const ProtobufCMessage *req, arena_t *a, ProtobufCMessage **resp,
                    kiln_err_t *err)
{
    svc_t *s = ctx->svc;
    const Kiln__CreateJobRequest *r = (const Kiln__CreateJobRequest *)req;
    json_t *spec = NULL, *job = NULL;
    int rc = r->spec ? msg_to_json(&r->spec->base, "spec", &spec, err) : 0;
    if (rc)
        return rc;
    if (!spec)
        spec = json_object();
    bool created = false;
    rc = svc_job_create(s, ctx->who, spec, r->idempotency_key, &job, &created, err);
    json_decref(spec);
    if (rc && err->field[0] && strncmp(err->field, "idempotency_key", 15) != 0) {
        /* the spec's fields are named from the request message: spec.hyperparameters.lr */
        char f[sizeof(err->field)];
        snprintf(f, sizeof(f), "spec.%.*s", (int)sizeof(err->field) - 6, err->field);
        kiln_strlcpy(err->field, f, sizeof(err->field));
    }
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
    int rc = svc_project_create(ctx->svc, ctx->who, r->name, &out, err);
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

ProtobufCMessage *api_grpc_json_to_msg(const json_t *j, const ProtobufCMessageDescriptor *d, arena_t *a)
{
    return msg_from_json(j, d, a);
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
    {"/kiln.TrainingService/ListMembers", &kiln__list_members_request__descriptor, h_list_members, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/SetMember", &kiln__set_member_request__descriptor, h_set_member, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/RemoveMember", &kiln__remove_member_request__descriptor, h_remove_member, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/ListArtifacts", &kiln__list_artifacts_request__descriptor, h_list_artifacts, NULL, API_GRPC_USER},
    {"/kiln.TrainingService/DownloadArtifact", &kiln__download_artifact_request__descriptor, NULL,
     api_grpc_stream_artifact, API_GRPC_USER},
    {"/kiln.TrainingService/DeleteJob", &kiln__delete_job_request__descriptor, h_delete_job, NULL, API_GRPC_USER},
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
};
const size_t api_grpc_training_method_count = KILN_ARRAY_LEN(api_grpc_training_methods);
