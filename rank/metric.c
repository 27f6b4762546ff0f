/* metric.c - the metric record: the one writer (the engine's training loop writes every record
 * with it) and the one parser (the agent reads every record with it). Not the metric
 * definitions, which match log lines (agent/metrics.c). */
#include "rank/rank.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* JSON has no NaN or infinity: they travel as these strings. */
static const char k_nan[] = "NaN", k_inf[] = "Infinity", k_ninf[] = "-Infinity";

typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf_t;

static void sb_reserve(sbuf_t *b, size_t more)
{
    if (b->oom || b->len + more + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *np = realloc(b->p, cap);
    if (!np) {
        b->oom = true;
        return;
    }
    b->p = np;
    b->cap = cap;
}

static void sb_put(sbuf_t *b, const char *s, size_t n)
{
    sb_reserve(b, n);
    if (b->oom)
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_printf(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n <= 0)
        return;
    sb_reserve(b, (size_t)n);
    if (b->oom)
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* Whether t is a time a record may carry: Unix seconds from 1970 up to the end of year 9999. */
static bool time_ok(double t)
{
    return t >= 0 && t < RANK_METRIC_TIME_MAX; /* false for NaN too */
}

static void sb_json_string(sbuf_t *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            char esc[2] = {'\\', (char)*p};
            sb_put(b, esc, 2);
        } else if (*p < 0x20) {
            sb_printf(b, "\\u%04x", *p);
        } else {
            sb_put(b, (const char *)p, 1);
        }
    }
    sb_put(b, "\"", 1);
}

int rank_metric_format(int64_t step, double time_s, const char *const *names, const double *vals,
                       size_t n, char **out, size_t *len, kiln_err_t *err)
{
    *out = NULL;
    *len = 0;
    if (step < 0)
        return kiln_err_set(err, KILN_EINVAL, "step", "metric record step %lld is negative; steps are 0 or more",
                            (long long)step);
    for (size_t i = 0; i < n; i++) {
        const char *name = names[i] ? names[i] : "";
        size_t nl = strlen(name);
        if (nl == 0 || nl > RANK_METRIC_NAME_MAX)
            return kiln_err_set(err, KILN_EINVAL, "metrics", "metric %zu: a name must be 1 to %d bytes, not %zu (\"%.40s%s\")",
                                i, RANK_METRIC_NAME_MAX, nl, name, nl > 40 ? "..." : "");
        if (kiln_utf8_check(name, nl) < nl)
            return kiln_err_set(err, KILN_EINVAL, "metrics", "metric %zu: the name is not valid UTF-8", i);
        if (kiln_text_control_at(name, nl) < nl)
            return kiln_err_set(err, KILN_EINVAL, "metrics", "metric %zu: the name has a control character", i);
    }
    if (!time_ok(time_s))
        return kiln_err_set(err, KILN_EINVAL, "time", "metric record time %g is not a Unix time in seconds (1970 to 9999)",
                            time_s);
    sbuf_t b = {0};
    sb_printf(&b, "{\"step\": %lld, \"time\": %.6f, \"metrics\": {", (long long)step, time_s);
    for (size_t i = 0; i < n; i++) {
        if (i)
            sb_put(&b, ", ", 2);
        sb_json_string(&b, names[i]);
        sb_put(&b, ": ", 2);
        double v = vals[i];
        if (isnan(v))
            sb_json_string(&b, k_nan);
        else if (isinf(v))
            sb_json_string(&b, v > 0 ? k_inf : k_ninf);
        else
            sb_printf(&b, "%.17g", v);
    }
    sb_put(&b, "}}\n", 3);
    if (b.oom) {
        free(b.p);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory for a metric record");
    }
    if (b.len > RANK_METRIC_RECORD_MAX) {
        free(b.p);
        return kiln_err_set(err, KILN_EINVAL, "metrics", "a metric record of %zu metrics would be longer than %d bytes",
                            n, RANK_METRIC_RECORD_MAX);
    }
    *out = b.p;
    *len = b.len;
    return 0;
}

int rank_metric_write(int fd, int64_t step, double time_s, const char *const *names, const double *vals,
                      size_t n, kiln_err_t *err)
{
    char *line = NULL;
    size_t len = 0;
    int rc = rank_metric_format(step, time_s, names, vals, n, &line, &len, err);
    if (rc)
        return rc;
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, line + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            rc = kiln_err_set(err, KILN_EIO, NULL, "could not write a metric record to fd %d: %s", fd,
                              w < 0 ? strerror(errno) : "nothing written");
            break;
        }
        off += (size_t)w;
    }
    free(line);
    return rc;
}

void rank_metric_record_deinit(rank_metric_record_t *r)
{
    if (!r)
        return;
    free(r->v);
    memset(r, 0, sizeof(*r));
}

/* The value of a metric entry: a number, or one of the non-finite spellings. */
static bool metric_value(const json_t *v, double *out)
{
    if (json_is_number(v)) {
        *out = json_number_value(v);
        return true;
    }
    const char *s = json_string_value(v);
    if (!s)
        return false;
    if (!strcmp(s, k_nan))
        *out = NAN;
    else if (!strcmp(s, k_inf))
        *out = INFINITY;
    else if (!strcmp(s, k_ninf))
        *out = -INFINITY;
    else
        return false;
    return true;
}

int rank_metric_parse(const char *line, size_t len, rank_metric_record_t *out, kiln_err_t *err)
{
    memset(out, 0, sizeof(*out));
    json_error_t jerr;
    json_t *rec = json_loadb(line, len, 0, &jerr);
    int rc = 0;
    if (!rec) {
        rc = kiln_err_set(err, KILN_EFORMAT, NULL, "metric record is not JSON: %s (column %d)", jerr.text,
                          jerr.column);
        goto done;
    }
    if (!json_is_object(rec)) {
        rc = kiln_err_set(err, KILN_EFORMAT, NULL, "metric record is not a JSON object");
        goto done;
    }
    json_t *jstep = json_object_get(rec, "step");
    if (jstep && !json_is_null(jstep)) {
        if (json_is_integer(jstep)) {
            out->step = (int64_t)json_integer_value(jstep);
        } else if (json_is_real(jstep) && json_real_value(jstep) == floor(json_real_value(jstep)) &&
                   fabs(json_real_value(jstep)) < 9e15) {
            out->step = (int64_t)json_real_value(jstep);
        } else {
            rc = kiln_err_set(err, KILN_EFORMAT, "step", "metric record step is not an integer");
            goto done;
        }
        if (out->step < 0) {
            rc = kiln_err_set(err, KILN_EFORMAT, "step", "metric record step %lld is negative; steps are 0 or more",
                              (long long)out->step);
            goto done;
        }
        out->has_step = true;
    }
    json_t *jtime = json_object_get(rec, "time");
    if (jtime && !json_is_null(jtime)) {
        if (!json_is_number(jtime) || !time_ok(json_number_value(jtime))) {
            rc = kiln_err_set(err, KILN_EFORMAT, "time",
                              "metric record time is not a Unix time in seconds (a number from 0 to 253402300799)");
            goto done;
        }
        out->time_s = json_number_value(jtime);
        out->has_time = true;
    }
    json_t *metrics = json_object_get(rec, "metrics");
    if (!json_is_object(metrics)) {
        rc = kiln_err_set(err, KILN_EFORMAT, "metrics", "metric record has no \"metrics\" object");
        goto done;
    }
    size_t cap = json_object_size(metrics);
    if (cap && !(out->v = calloc(cap, sizeof(*out->v)))) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory for a metric record");
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(metrics, key, val) {
        size_t kl = strlen(key);
        double v;
        if (kl == 0 || kl > RANK_METRIC_NAME_MAX || kiln_text_control_at(key, kl) < kl || !metric_value(val, &v)) {
            if (out->skipped++ == 0)
                kiln_utf8_copy(out->skipped_first, sizeof(out->skipped_first), key, kl);
            continue;
        }
        rank_metric_t *m = &out->v[out->n++];
        memcpy(m->name, key, kl + 1);
        m->value = v;
    }
done:
    json_decref(rec);
    return rc;
}
