/* metrics.c - metric points from a rank: its metric records (read with the rank contract's
 * parser, rank/) and the assignment's metric definitions (PCRE2 patterns, bounded per line and
 * per job) applied to its log lines. Parsing only; the launcher decides where lines come from and the agent where points
 * go. */
#include "agent/agent.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct agent_metric_def {
    char name[AGENT_METRIC_NAME];
    pcre2_code *re;
    pcre2_match_data *md;
};

void agent_points_push(agent_points_t *p, const agent_point_t *pt)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 16;
        agent_point_t *nv = realloc(p->v, cap * sizeof(*nv));
        if (!nv) {
            log_error("agent: out of memory for metric points; dropping %s", pt->name);
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
                        agent_points_t *out, size_t *n_nonfinite, agent_point_t *first_nonfinite,
                        kiln_err_t *err)
{
    rank_metric_record_t rec;
    size_t nonfinite = 0;
    int rc = rank_metric_parse(line, len, &rec, err);
    if (rc == 0) {
        int64_t step = rec.has_step ? rec.step : *last_step;
        int64_t time_us = rec.has_time ? (int64_t)llround(rec.time_s * 1e6) : kiln_now_us();
        for (size_t i = 0; i < rec.n; i++) {
            agent_point_t pt = {.rank = rank, .step = step, .value = rec.v[i].value, .time_us = time_us};
            kiln_strlcpy(pt.name, rec.v[i].name, sizeof(pt.name));
            if (!isfinite(pt.value)) {
                if (nonfinite++ == 0 && first_nonfinite)
                    *first_nonfinite = pt;
                continue;
            }
            agent_points_push(out, &pt);
        }
        *last_step = step;
    }
    if (n_nonfinite)
        *n_nonfinite = nonfinite;
    rank_metric_record_deinit(&rec);
    return rc;
}

/* CPU time of the calling thread: what matching costs the agent, whatever else runs. */
static int64_t thread_cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int agent_metric_defs_init(agent_metric_defs_t *d, Kiln__MetricDefinition *const *defs, size_t n,
                            kiln_err_t *err)
{
    memset(d, 0, sizeof(*d));
    d->budget_us = AGENT_MATCH_BUDGET_US;
    d->window_us = AGENT_MATCH_WINDOW_US;
    d->window_start_us = -1;
    if (n == 0)
        return 0;
    if (n > AGENT_MAX_METRIC_DEFS)
        return kiln_err_set(err, KILN_EINVAL, "metric_definitions", "at most %d metric definitions are allowed (got %zu)",
                            AGENT_MAX_METRIC_DEFS, n);
    pcre2_match_context *mc = pcre2_match_context_create(NULL);
    d->v = calloc(n, sizeof(*d->v));
    if (!mc || !d->v) {
        pcre2_match_context_free(mc);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory for metric definitions");
    }
    pcre2_set_match_limit(mc, AGENT_MATCH_LIMIT);
    pcre2_set_depth_limit(mc, AGENT_MATCH_DEPTH_LIMIT);
    pcre2_set_heap_limit(mc, AGENT_MATCH_HEAP_KIB);
    d->match_ctx = mc;
    for (size_t i = 0; i < n; i++) {
        char field[64];
        snprintf(field, sizeof(field), "metric_definitions[%zu].regex", i);
        const char *name = defs[i] && defs[i]->name ? defs[i]->name : "";
        const char *regex = defs[i] && defs[i]->regex ? defs[i]->regex : "";
        if (!name[0] || strlen(name) >= AGENT_METRIC_NAME)
            return kiln_err_set(err, KILN_EINVAL, field, "metric_definitions[%zu].name must be 1 to %d bytes", i,
                                AGENT_METRIC_NAME - 1);
        if (strlen(regex) > AGENT_MAX_REGEX)
            return kiln_err_set(err, KILN_EINVAL, field, "%s is longer than %d bytes", field, AGENT_MAX_REGEX);
        pcre2_code *re = kiln_metric_regex_compile(regex, field, err);
        if (!re)
            return err ? err->status : KILN_EINVAL;
        agent_metric_def_t *m = &d->v[d->n++];
        m->re = re;
        if (!(m->md = pcre2_match_data_create_from_pattern(re, NULL)))
            return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory for metric definitions");
        kiln_strlcpy(m->name, name, sizeof(m->name));
    }
    return 0;
}

void agent_metric_defs_deinit(agent_metric_defs_t *d)
{
    for (size_t i = 0; i < d->n; i++) {
        pcre2_match_data_free(d->v[i].md);
        pcre2_code_free(d->v[i].re);
    }
    free(d->v);
    pcre2_match_context_free(d->match_ctx);
    memset(d, 0, sizeof(*d));
}

size_t agent_metric_defs_match(agent_metric_defs_t *d, const char *line, size_t len, int rank,
                                int64_t step, int64_t time_us, agent_points_t *out)
{
    if (d->off || d->n == 0)
        return 0;
    size_t added = 0;
    int64_t now = kiln_mono_us(), t0 = thread_cpu_us();
    if (d->window_start_us < 0 || now - d->window_start_us >= d->window_us) {
        d->window_start_us = now;
        d->spent_us = 0;
    }
    for (size_t i = 0; i < d->n; i++) {
        agent_metric_def_t *m = &d->v[i];
        /* lines are valid UTF-8 (agent_utf8_sanitize), so PCRE2 need not check them again */
        int rc = pcre2_match(m->re, (PCRE2_SPTR)line, len, 0, PCRE2_NO_UTF_CHECK, m->md, d->match_ctx);
        if (rc < 2) /* no match, a limit hit (PCRE2_ERROR_MATCHLIMIT, ...), or group 1 unset */
            continue;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
        if (ov[2] == PCRE2_UNSET || ov[3] < ov[2])
            continue;
        char num[64];
        size_t nlen = (size_t)(ov[3] - ov[2]);
        if (nlen == 0 || nlen >= sizeof(num))
            continue;
        memcpy(num, line + ov[2], nlen);
        num[nlen] = '\0';
        char *end;
        double v = strtod(num, &end);
        if (end == num || *end != '\0' || !isfinite(v))
            continue;
        agent_point_t pt = {.rank = rank, .step = step, .value = v, .time_us = time_us};
        kiln_strlcpy(pt.name, m->name, sizeof(pt.name));
        agent_points_push(out, &pt);
        added++;
    }
    d->spent_us += thread_cpu_us() - t0;
    if (d->spent_us > d->budget_us)
        d->off = true;
    return added;
}
