/* metrics.c - metric points from a rank: the JSON records it writes on KILN_METRICS_FD and the
 * spec's metric_definitions (POSIX regexes) applied to its log lines. Parsing only; the launcher
 * decides where lines come from and the agent where points go. */
#include "agent/agent.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void agent_points_push(agent_points_t *p, const agent_point_t *pt)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 16;
        agent_point_t *nv = realloc(p->v, cap * sizeof(*nv));
        if (!nv) {
            log_error("worker: out of memory for metric points; dropping %s", pt->name);
            return;
        }
        p->v = nv;
        p->cap = cap;
    }
    p->v[p->n++] = *pt;
}

void agent_points_clear(agent_points_t *p) { p->n = 0; }

void agent_points_free(agent_points_t *p)
{
    free(p->v);
    memset(p, 0, sizeof(*p));
}

int agent_metric_parse(const char *line, size_t len, int rank, int64_t *last_step,
                        agent_points_t *out, kiln_err_t *err)
{
    json_error_t jerr;
    json_t *rec = json_loadb(line, len, 0, &jerr);
    int rc = 0;
    if (!rec) {
        rc = kiln_err_set(err, KILN_EFORMAT, NULL, "metric record is not JSON: %s (column %d)",
                          jerr.text, jerr.column);
        goto done;
    }
    if (!json_is_object(rec)) {
        rc = kiln_err_set(err, KILN_EFORMAT, NULL, "metric record is not a JSON object");
        goto done;
    }
    json_t *jstep = json_object_get(rec, "step");
    int64_t step = *last_step;
    if (jstep && !json_is_null(jstep)) {
        if (json_is_integer(jstep)) {
            step = (int64_t)json_integer_value(jstep);
        } else if (json_is_real(jstep) && json_real_value(jstep) == floor(json_real_value(jstep))) {
            step = (int64_t)json_real_value(jstep);
        } else {
            rc = kiln_err_set(err, KILN_EFORMAT, "step", "metric record step is not an integer");
            goto done;
        }
    }
    int64_t time_us = kiln_now_us();
    json_t *jtime = json_object_get(rec, "time");
    if (jtime && !json_is_null(jtime)) {
        if (!json_is_number(jtime)) {
            rc = kiln_err_set(err, KILN_EFORMAT, "time", "metric record time is not a number");
            goto done;
        }
        time_us = (int64_t)llround(json_number_value(jtime) * 1e6);
    }
    json_t *metrics = json_object_get(rec, "metrics");
    if (!json_is_object(metrics)) {
        rc = kiln_err_set(err, KILN_EFORMAT, "metrics", "metric record has no \"metrics\" object");
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(metrics, key, val) {
        if (!json_is_number(val) || !key[0] || strlen(key) >= AGENT_METRIC_NAME)
            continue;
        agent_point_t pt = {.rank = rank, .step = step, .value = json_number_value(val),
                             .time_us = time_us};
        kiln_strlcpy(pt.name, key, sizeof(pt.name));
        agent_points_push(out, &pt);
    }
    *last_step = step;
done:
    json_decref(rec);
    return rc;
}

int agent_metric_defs_init(agent_metric_defs_t *d, const char *spec_json, kiln_err_t *err)
{
    memset(d, 0, sizeof(*d));
    json_error_t jerr;
    json_t *spec = json_loads(spec_json ? spec_json : "{}", 0, &jerr);
    int rc = 0;
    if (!spec) {
        rc = kiln_err_set(err, KILN_EFORMAT, NULL, "job spec is not JSON: %s (line %d)", jerr.text, jerr.line);
        goto done;
    }
    json_t *defs = json_object_get(spec, "metric_definitions");
    if (!json_is_array(defs) || json_array_size(defs) == 0)
        goto done;
    d->v = calloc(json_array_size(defs), sizeof(*d->v));
    if (!d->v) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory for metric definitions");
        goto done;
    }
    size_t i;
    json_t *def;
    json_array_foreach(defs, i, def) {
        const char *name = json_string_value(json_object_get(def, "name"));
        const char *regex = json_string_value(json_object_get(def, "regex"));
        if (!name || !regex || !name[0] || strlen(name) >= AGENT_METRIC_NAME)
            continue;
        agent_metric_def_t *m = &d->v[d->n];
        int rrc = regcomp(&m->re, regex, REG_EXTENDED);
        if (rrc != 0) {
            char msg[128];
            regerror(rrc, &m->re, msg, sizeof(msg));
            rc = kiln_err_set(err, KILN_EINVAL, "metric_definitions",
                              "metric definition \"%s\": regex does not compile: %s", name, msg);
            goto done;
        }
        kiln_strlcpy(m->name, name, sizeof(m->name));
        d->n++;
    }
done:
    json_decref(spec);
    return rc;
}

void agent_metric_defs_deinit(agent_metric_defs_t *d)
{
    for (size_t i = 0; i < d->n; i++)
        regfree(&d->v[i].re);
    free(d->v);
    memset(d, 0, sizeof(*d));
}

size_t agent_metric_defs_match(const agent_metric_defs_t *d, const char *line, int rank,
                                int64_t step, int64_t time_us, agent_points_t *out)
{
    size_t added = 0;
    for (size_t i = 0; i < d->n; i++) {
        regmatch_t m[2];
        if (regexec(&d->v[i].re, line, 2, m, 0) != 0 || m[1].rm_so < 0)
            continue;
        char num[64];
        size_t len = (size_t)(m[1].rm_eo - m[1].rm_so);
        if (len == 0 || len >= sizeof(num))
            continue;
        memcpy(num, line + m[1].rm_so, len);
        num[len] = '\0';
        char *end;
        double v = strtod(num, &end);
        if (end == num || *end != '\0' || !isfinite(v))
            continue;
        agent_point_t pt = {.rank = rank, .step = step, .value = v, .time_us = time_us};
        kiln_strlcpy(pt.name, d->v[i].name, sizeof(pt.name));
        agent_points_push(out, &pt);
        added++;
    }
    return added;
}
