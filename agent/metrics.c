/* metrics.c - metric points from a rank: its metric records (read with the rank contract's
 * parser, rank/) and the assignment's metric definitions (PCRE2 patterns, bounded per line and
 * per job) applied to its log lines, each match at the step its line belongs to (a step group,
 * the rank's step marks, or the definition's count). Parsing only; the launcher decides where
 * lines come from and the agent where points go. */
#include "agent/agent.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <stdarg.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct agent_metric_def {
    char name[AGENT_METRIC_NAME];
    pcre2_code *re;
    pcre2_match_data *md;
    int value_group;             /* the group holding the value */
    int step_group;              /* the group named "step", 0: none */
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
                        agent_points_t *out, agent_metric_left_t *left, kiln_err_t *err)
{
    rank_metric_record_t rec;
    agent_metric_left_t none;
    if (!left)
        left = &none;
    memset(left, 0, sizeof(*left));
    int rc = rank_metric_parse(line, len, &rec, err);
    if (rc == 0) {
        int64_t step = rec.has_step ? rec.step : *last_step;
        int64_t time_us = rec.has_time ? (int64_t)llround(rec.time_s * 1e6) : kiln_now_us();
        for (size_t i = 0; i < rec.n; i++) {
            agent_point_t pt = {.rank = rank, .step = step, .value = rec.v[i].value, .time_us = time_us};
            kiln_strlcpy(pt.name, rec.v[i].name, sizeof(pt.name));
            if (!isfinite(pt.value)) {
                if (left->nonfinite++ == 0)
                    left->first_nonfinite = pt;
                continue;
            }
            agent_points_push(out, &pt);
        }
        left->skipped = rec.skipped;
        kiln_strlcpy(left->skipped_first, rec.skipped_first, sizeof(left->skipped_first));
        *last_step = step;
    }
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
        int value_group = 1, step_group = 0;
        pcre2_code *re = kiln_metric_regex_compile(regex, field, &value_group, &step_group, err);
        if (!re)
            return err ? err->status : KILN_EINVAL;
        agent_metric_def_t *m = &d->v[d->n++];
        m->re = re;
        m->value_group = value_group;
        m->step_group = step_group;
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

void agent_metric_cursor_init(agent_metric_cursor_t *c)
{
    memset(c, 0, sizeof(*c));
    c->mark[AGENT_STREAM_STDOUT] = c->mark[AGENT_STREAM_STDERR] = -1;
    for (size_t i = 0; i < AGENT_MAX_METRIC_DEFS; i++)
        c->hi[i] = -1;
}

bool agent_metric_cursor_mark(agent_metric_cursor_t *c, int stream, const char *line, size_t len)
{
    int64_t step;
    if (stream < 0 || stream > 1 || !rank_step_mark_parse(line, len, &step))
        return false;
    c->mark[stream] = step;
    return true;
}

/* Whether definition i already has a point at step (or step lies AGENT_STEP_WINDOW or more below
 * its highest point, too far to tell); if not, records that it has one now. */
static bool step_taken(agent_metric_cursor_t *c, size_t i, int64_t step)
{
    uint64_t *w = c->seen[i];
    int64_t hi = c->hi[i];
    if (hi >= 0 && step <= hi) {
        if (hi - step >= AGENT_STEP_WINDOW)
            return true;
        size_t b = (size_t)(step % AGENT_STEP_WINDOW);
        if (w[b / 64] >> (b % 64) & 1)
            return true;
        w[b / 64] |= 1ULL << (b % 64);
        return false;
    }
    /* a new highest step: the window's slots up to it held steps that now fall out of it */
    if (hi < 0 || step - hi >= AGENT_STEP_WINDOW) {
        memset(c->seen[i], 0, sizeof(c->seen[i]));
    } else {
        for (int64_t s = hi + 1; s <= step; s++) {
            size_t b = (size_t)(s % AGENT_STEP_WINDOW);
            w[b / 64] &= ~(1ULL << (b % 64));
        }
    }
    size_t b = (size_t)(step % AGENT_STEP_WINDOW);
    w[b / 64] |= 1ULL << (b % 64);
    c->hi[i] = step;
    return false;
}

/* A capture as a step: digits only, at most INT64_MAX. */
static bool step_parse(const char *s, size_t n, int64_t *out)
{
    char digits[24];
    if (n == 0 || n >= sizeof(digits) || s[0] < '0' || s[0] > '9')
        return false;
    memcpy(digits, s, n);
    digits[n] = '\0';
    return kiln_parse_int64(digits, out) == 0;
}

/* Says once per definition and kind (bit in *noted) why a match gave no point: into c->note
 * when it is free (else it is said with a later match). */
static void note_once(agent_metric_cursor_t *c, uint32_t *noted, size_t i, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void note_once(agent_metric_cursor_t *c, uint32_t *noted, size_t i, const char *fmt, ...)
{
    if (*noted >> i & 1 || c->note[0])
        return;
    *noted |= 1u << i;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->note, sizeof(c->note), fmt, ap);
    va_end(ap);
}

size_t agent_metric_defs_match(agent_metric_defs_t *d, agent_metric_cursor_t *c, int stream, const char *line,
                               size_t len, int rank, int64_t time_us, agent_points_t *out)
{
    if (d->off || d->n == 0 || stream < 0 || stream > 1)
        return 0;
    size_t added = 0;
    int64_t now = kiln_mono_us(), t0 = thread_cpu_us();
    if (d->window_start_us < 0 || now - d->window_start_us >= d->window_us) {
        d->window_start_us = now;
        d->spent_us = 0;
    }
    for (size_t i = 0; i < d->n; i++) {
        agent_metric_def_t *m = &d->v[i];
        /* lines are valid UTF-8 (kiln_utf8_copy), so PCRE2 need not check them again */
        int rc = pcre2_match(m->re, (PCRE2_SPTR)line, len, 0, PCRE2_NO_UTF_CHECK, m->md, d->match_ctx);
        /* rc: no match or a limit hit (PCRE2_ERROR_MATCHLIMIT, ...) when < 0, else 1 + the highest
         * group set */
        if (rc <= m->value_group)
            continue;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
        PCRE2_SIZE vs = ov[2 * m->value_group], ve = ov[2 * m->value_group + 1];
        if (vs == PCRE2_UNSET || ve < vs)
            continue;
        char num[64];
        size_t nlen = (size_t)(ve - vs);
        if (nlen == 0 || nlen >= sizeof(num))
            continue;
        memcpy(num, line + vs, nlen);
        num[nlen] = '\0';
        char *end;
        double v = strtod(num, &end);
        if (end == num || *end != '\0' || !isfinite(v))
            continue;
        int64_t step;
        int sg = m->step_group;
        if (sg > 0 && rc > sg && ov[2 * sg] != PCRE2_UNSET && ov[2 * sg + 1] >= ov[2 * sg]) {
            size_t sn = (size_t)(ov[2 * sg + 1] - ov[2 * sg]);
            if (!step_parse(line + ov[2 * sg], sn, &step)) {
                note_once(c, &c->noted_step, i, "[kiln-agent] metric_definitions[%zu] (%s): rank %d printed a line "
                          "whose step group holds \"%.*s\", which is not a step (a whole number below 2^63); "
                          "such matches give no point (said once)", i, m->name, rank, (int)KILN_MIN(sn, 40),
                          line + ov[2 * sg]);
                continue;
            }
        } else if (c->mark[stream] >= 0) {
            step = c->mark[stream];
        } else {
            step = c->count[i] + 1;
        }
        if (step_taken(c, i, step)) {
            note_once(c, &c->noted_repeat, i, "[kiln-agent] metric_definitions[%zu] (%s) matched again at step %lld "
                      "on rank %d (or %d or more steps below its latest); kiln keeps one point per step and "
                      "attempt, the first, so such matches are left out (said once)", i, m->name, (long long)step,
                      rank, AGENT_STEP_WINDOW);
            continue;
        }
        c->count[i]++;
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
