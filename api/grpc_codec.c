/* grpc_codec.c - what the gRPC front end does with the bytes of a request before a handler
 * sees them, and the JSON it speaks with the service: the wire check of text fields, and one
 * generic converter driven by protobuf-c's descriptors between JSON shaped like the REST API
 * and messages. No gRPC calls here; the server and the handlers are grpc_server.c and
 * grpc_training.c. */
#include "api/grpc_int.h"

#include <ctype.h>
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
    /* a script job's free-form hyperparameters travel as JSON text (JobSpec.hyperparameters_json) */
    bool script = d == &kiln__job_spec__descriptor && json_is_string(json_object_get(j, "entry_point"));
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const json_t *v = json_object_get(j, f->name);
        if (script && !strcmp(f->name, "hyperparameters"))
            continue;
        if (script && !strcmp(f->name, "hyperparameters_json")) {
            char *text = json_dumps(json_object_get(j, "hyperparameters"), JSON_COMPACT);
            *(char **)((char *)m + f->offset) = arena_strdup(a, text ? text : "{}");
            free(text);
            continue;
        }
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

ProtobufCMessage *api_grpc_json_to_msg(const json_t *j, const ProtobufCMessageDescriptor *d, arena_t *a)
{
    return msg_from_json(j, d, a);
}

/* ---- message -> JSON (requests: what the client set) ------------------------------------------
 * Plain proto3 scalars and strings count as set when they differ from their default; wrapper
 * fields when present, whatever their value (an explicit zero). Checks what JSON cannot carry
 * the way the client meant it (NaN, Infinity, text that is not UTF-8, an unsigned number past
 * int64), naming the field by its dotted path under prefix. */

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
        return api_grpc_msg_to_json(sub, path, out, err);
    }
    default:
        return 0;
    }
}

int api_grpc_msg_to_json(const ProtobufCMessage *m, const char *prefix, json_t **out, kiln_err_t *err)
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

/* ---- the wire check ------------------------------------------------------------------------ */

/* Reads a varint at *p (below end); false when it is cut short or too long. */
static bool wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return true;
        }
    }
    return false;
}

/* A map's entry names its value by its key, as the JSON the service reads does
 * ("parameters.lr.values_json", not "parameters.value.values_json"): the key (encoders write it
 * first) when it is a plain name, else the field's own name. */
static void wire_path(char *path, size_t n, const char *prefix, const ProtobufCFieldDescriptor *f, bool map_entry,
                      const char *key)
{
    const char *name = map_entry && f->id == 2 && key[0] ? key : f->name;
    snprintf(path, n, "%s%s%s", prefix, prefix[0] ? "." : "", name);
}

static int wire_check_msg(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n, const char *prefix,
                          int depth, bool known_only, kiln_err_t *err)
{
    const uint8_t *end = p + n;
    size_t nl = d ? strlen(d->name) : 0;
    bool map_entry = d && d->n_fields == 2 && nl > 5 && !strcmp(d->name + nl - 5, "Entry") &&
                     d->fields[0].type == PROTOBUF_C_TYPE_STRING;
    char map_key[80] = "";
    while (p < end) {
        uint64_t key = 0, len = 0;
        if (!wire_varint(&p, end, &key))
            return 0; /* malformed: protobuf-c's decoder refuses it */
        unsigned wt = (unsigned)(key & 7);
        const ProtobufCFieldDescriptor *f = d ? protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3)) : NULL;
        switch (wt) {
        case 0:
            if (!wire_varint(&p, end, &len))
                return 0;
            len = 0;
            break;
        case 1:
        case 5:
            if ((size_t)(end - p) < (wt == 1 ? 8u : 4u))
                return 0;
            p += wt == 1 ? 8 : 4;
            len = 0;
            break;
        case 2:
            if (!wire_varint(&p, end, &len) || len > (uint64_t)(end - p))
                return 0;
            break;
        default:
            return 0;
        }
        if (d && !f && known_only) {
            char path[256];
            snprintf(path, sizeof(path), "%s%s%llu", prefix, prefix[0] ? "." : "", (unsigned long long)(key >> 3));
            kiln_err_set(err, KILN_EINVAL, path, "%s: %s has no field number %llu", path, d->name,
                         (unsigned long long)(key >> 3));
            kiln_err_hint(err, "the client's kiln.proto may be newer than this kilnd's; send only the fields "
                               "this kilnd's proto/kiln.proto declares");
            return KILN_EINVAL;
        }
        if (wt != 2)
            continue;
        char path[256];
        if (f)
            wire_path(path, sizeof path, prefix, f, map_entry, map_key);
        if (f && f->type == PROTOBUF_C_TYPE_STRING) {
            int rc = svc_check_text(path, (const char *)p, (size_t)len, 0, err);
            if (rc)
                return rc;
            bool plain = map_entry && f->id == 1 && len < sizeof map_key;
            for (size_t i = 0; plain && i < len; i++)
                plain = p[i] && p[i] < 0x80 && (isalnum(p[i]) || strchr("_.-", p[i]));
            if (plain) {
                memcpy(map_key, p, (size_t)len);
                map_key[len] = '\0';
            }
        } else if (f && f->type == PROTOBUF_C_TYPE_MESSAGE && depth < 16) {
            int rc = wire_check_msg(f->descriptor, p, (size_t)len, path, depth + 1, known_only, err);
            if (rc)
                return rc;
        }
        p += len;
    }
    return 0;
}

int api_grpc_wire_check(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len, bool known_only,
                        kiln_err_t *err)
{
    return wire_check_msg(d, data, len, "", 0, known_only, err);
}
