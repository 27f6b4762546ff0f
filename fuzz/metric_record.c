/* metric_record.c - fuzz target: the metric records a rank writes on KILN_METRICS_FD, read as the
 * agent reads them (agent/launch.c's on_rank_line): the pipe's bytes split into lines of at most
 * 1 MiB (agent_linebuf), each whole, non-empty line parsed by agent_metric_parse. A record that
 * parses has only finite points with names of 1..127 bytes, and the record formatted again by
 * the one writer (rank_metric_format) parses back to the same metrics. */
#include <math.h>

#include "agent/agent.h"
#include "fuzz/fuzz.h"
#include "rank/rank.h"

static bool same_value(double a, double b)
{
    return (isnan(a) && isnan(b)) || a == b;
}

/* rank_metric_format(rank_metric_parse(line)) parses to the same metrics. */
static void check_round_trip(const char *line, size_t len)
{
    rank_metric_record_t rec, again;
    kiln_err_t err;
    if (rank_metric_parse(line, len, &rec, &err) != 0) {
        rank_metric_record_deinit(&rec);
        return;
    }
    const char **names = calloc(rec.n + 1, sizeof *names);
    double *vals = calloc(rec.n + 1, sizeof *vals);
    FUZZ_CHECK(names && vals);
    for (size_t i = 0; i < rec.n; i++) {
        names[i] = rec.v[i].name;
        vals[i] = rec.v[i].value;
    }
    char *text = NULL;
    size_t tlen = 0;
    double time_s = rec.has_time && isfinite(rec.time_s) ? rec.time_s : 0;
    int rc = rank_metric_format(rec.has_step ? rec.step : 0, time_s, names, vals, rec.n, &text, &tlen, &err);
    if (rc == 0) {
        FUZZ_CHECK(tlen > 0 && text[tlen - 1] == '\n');
        rc = rank_metric_parse(text, tlen, &again, &err);
        if (rc)
            fprintf(stderr, "fuzz: a formatted record does not parse: %s\n", err.message);
        FUZZ_CHECK(rc == 0);
        FUZZ_CHECK(again.n == rec.n && again.skipped == 0);
        for (size_t i = 0; i < rec.n; i++) {
            FUZZ_CHECK(!strcmp(again.v[i].name, rec.v[i].name));
            FUZZ_CHECK(same_value(again.v[i].value, rec.v[i].value));
        }
        FUZZ_CHECK(again.has_step && again.step == (rec.has_step ? rec.step : 0));
        rank_metric_record_deinit(&again);
    } else {
        FUZZ_CHECK(rc == KILN_EINVAL); /* longer than RANK_METRIC_RECORD_MAX once formatted */
    }
    free(text);
    free(names);
    free(vals);
    rank_metric_record_deinit(&rec);
}

typedef struct ctx {
    int64_t last_step;
    agent_points_t pts;
} ctx_t;

static void on_line(void *ud, const char *line, size_t len, bool truncated)
{
    ctx_t *c = ud;
    if (truncated || len == 0)
        return;
    kiln_err_t err;
    agent_metric_left_t left;
    agent_points_clear(&c->pts);
    int rc = agent_metric_parse(line, len, 3, &c->last_step, &c->pts, &left, &err);
    if (rc) {
        FUZZ_CHECK(rc == KILN_EFORMAT && c->pts.n == 0);
        return;
    }
    for (size_t i = 0; i < c->pts.n; i++) {
        const agent_point_t *p = &c->pts.v[i];
        size_t nl = strlen(p->name);
        FUZZ_CHECK(nl >= 1 && nl <= RANK_METRIC_NAME_MAX);
        FUZZ_CHECK(kiln_utf8_check(p->name, nl) == nl);
        FUZZ_CHECK(kiln_text_control_at(p->name, nl) == nl);
        FUZZ_CHECK(isfinite(p->value) && p->rank == 3 && p->step == c->last_step);
    }
    if (left.nonfinite) {
        /* the note the agent writes into the job's log */
        char note[300];
        const agent_point_t *bad = &left.first_nonfinite;
        snprintf(note, sizeof(note), "rank %d reported %s = %g at step %lld", bad->rank, bad->name, bad->value,
                 (long long)bad->step);
        FUZZ_CHECK(!isfinite(bad->value));
    }
    check_round_trip(line, len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ctx_t c = {.last_step = 0};
    agent_linebuf_t lb;
    agent_linebuf_init(&lb, (size_t)1 << 20);
    agent_linebuf_feed(&lb, (const char *)data, size, on_line, &c);
    agent_linebuf_finish(&lb, on_line, &c);
    agent_linebuf_deinit(&lb);
    agent_points_free(&c.pts);
    return 0;
}
