/* compare.c - printing experiments side by side: the table of `kiln search` (jobs with the
 * columns they came back with), the comparison of `kiln compare` (spec fields with the
 * differing ones marked, metric summaries) and a compact text chart of several series on shared
 * axes. Formatting only: the requests are cmd_search.c's. */
#include "cli/cli_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The text of a JSON scalar for a table cell ("-" for null or absent). */
static char *cell(const json_t *v, char *buf, size_t n)
{
    if (json_is_number(v))
        return cli_fmt_value(json_number_value(v), buf, n);
    if (json_is_string(v)) {
        snprintf(buf, n, "%s", json_string_value(v));
        return buf;
    }
    if (json_is_boolean(v)) {
        snprintf(buf, n, "%s", json_is_true(v) ? "true" : "false");
        return buf;
    }
    snprintf(buf, n, "-");
    return buf;
}

void cli_print_search(FILE *out, const json_t *jobs, int64_t now_us, bool wide)
{
    /* The columns: every key of the jobs' "columns", in the order they first appear. */
    const char *names[CLI_TABLE_MAXCOLS];
    int ncols = 0;
    size_t i;
    json_t *job;
    json_array_foreach(jobs, i, job) {
        const char *k;
        json_t *v;
        json_object_foreach(json_object_get(job, "columns"), k, v) {
            bool seen = false;
            for (int c = 0; c < ncols && !seen; c++)
                seen = !strcmp(names[c], k);
            if (!seen && ncols < CLI_TABLE_MAXCOLS - (wide ? 7 : 4))
                names[ncols++] = k;
        }
    }
    cli_table_t t;
    cli_table_init(&t, wide ? "ID NAME STATE >AGE PROJECT QUEUE BY" : "ID NAME STATE >AGE");
    int fixed = wide ? 7 : 4;
    for (int c = 0; c < ncols; c++)
        cli_table_col(&t, names[c], true);
    json_array_foreach(jobs, i, job) {
        char sid[40], name[128], age[32], vals[CLI_TABLE_MAXCOLS][64];
        const char *row[CLI_TABLE_MAXCOLS];
        if (wide)
            snprintf(sid, sizeof sid, "%s", cli_jstr(job, "id"));
        else
            cli_short_id(cli_jstr(job, "id"), sid, sizeof sid);
        cli_clip(cli_jstr(job, "name"), 32, name, sizeof name);
        int64_t created = cli_jtime(job, "created_at");
        if (created)
            cli_fmt_duration((double)(now_us - created) / 1e6, age, sizeof age);
        else
            snprintf(age, sizeof age, "-");
        row[0] = sid;
        row[1] = name;
        row[2] = cli_jstr(job, "state");
        row[3] = age;
        if (wide) {
            row[4] = *cli_jstr(job, "project") ? cli_jstr(job, "project") : "-";
            row[5] = *cli_jstr(job, "queue") ? cli_jstr(job, "queue") : "-";
            row[6] = *cli_jstr(job, "submitted_by") ? cli_jstr(job, "submitted_by") : "-";
        }
        for (int c = 0; c < ncols; c++)
            row[fixed + c] = cell(json_object_get(json_object_get(job, "columns"), names[c]), vals[c], sizeof vals[c]);
        cli_table_row(&t, row);
    }
    if (t.nrows == 0) {
        fprintf(out, "no jobs match\n");
        return;
    }
    cli_table_print(out, &t);
}

/* ---- charts ---------------------------------------------------------------------------------- */

/* The mark of series s: 1-9, then a-z. */
static char series_mark(int s)
{
    return s < 9 ? (char)('1' + s) : (char)('a' + (s - 9) % 26);
}

void cli_print_chart(FILE *out, const char *title, const cli_series_t *series, int nseries, int width, int height)
{
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int s = 0; s < nseries; s++)
        for (size_t k = 0; k < series[s].n; k++) {
            if (!isfinite(series[s].values[k]))
                continue;
            x0 = fmin(x0, series[s].steps[k]);
            x1 = fmax(x1, series[s].steps[k]);
            y0 = fmin(y0, series[s].values[k]);
            y1 = fmax(y1, series[s].values[k]);
        }
    if (!isfinite(x0)) {
        fprintf(out, "%s: no points\n", title);
        return;
    }
    width = KILN_MAX(width, 8);
    height = KILN_MAX(height, 3);
    char *grid = malloc((size_t)width * (size_t)height);
    if (!grid)
        return;
    memset(grid, ' ', (size_t)width * (size_t)height);
    for (int s = 0; s < nseries; s++)
        for (size_t k = 0; k < series[s].n; k++) {
            double v = series[s].values[k];
            if (!isfinite(v))
                continue;
            int cx = x1 > x0 ? (int)lround((series[s].steps[k] - x0) / (x1 - x0) * (width - 1)) : 0;
            int cy = y1 > y0 ? (int)lround((v - y0) / (y1 - y0) * (height - 1)) : height / 2;
            char *g = &grid[(size_t)(height - 1 - cy) * (size_t)width + (size_t)cx];
            *g = *g == ' ' || *g == series_mark(s) ? series_mark(s) : '*';
        }
    char hi[24], lo[24];
    cli_fmt_value(y1, hi, sizeof hi);
    cli_fmt_value(y0, lo, sizeof lo);
    int lw = (int)KILN_MAX(strlen(hi), strlen(lo));
    fprintf(out, "%s\n", title);
    for (int r = 0; r < height; r++)
        fprintf(out, "%*s |%.*s\n", lw, r == 0 ? hi : r == height - 1 ? lo : "", width, grid + (size_t)r * (size_t)width);
    fprintf(out, "%*s +", lw, "");
    for (int c = 0; c < width; c++)
        fputc('-', out);
    char a[24], b[24];
    snprintf(a, sizeof a, "%.0f", x0);
    snprintf(b, sizeof b, "%.0f", x1);
    fprintf(out, "\n%*s  %s%*s (step)\n", lw, "", a, (int)(width - strlen(a)), b);
    free(grid);
}

/* ---- compare --------------------------------------------------------------------------------- */

/* Adds one row per key of section (an object in each job's spec), marking rows whose values
 * differ between the jobs. */
static void spec_rows(cli_table_t *t, const json_t *jobs, const char *section, const char *prefix)
{
    size_t njobs = json_array_size(jobs);
    /* keys in first-seen order */
    json_t *keys = json_object();
    size_t i;
    json_t *job;
    json_array_foreach(jobs, i, job) {
        const char *k;
        json_t *v;
        json_object_foreach(json_object_get(json_object_get(job, "spec"), section), k, v)
            if (!json_is_object(v) && !json_is_array(v))
                json_object_set_new(keys, k, json_true());
    }
    const char *k;
    json_t *unused;
    json_object_foreach(keys, k, unused) {
        char label[96], vals[CLI_TABLE_MAXCOLS][64];
        const char *row[CLI_TABLE_MAXCOLS];
        bool differ = false;
        const json_t *first = NULL;
        for (size_t j = 0; j < njobs && j + 2 < CLI_TABLE_MAXCOLS; j++) {
            const json_t *v = json_object_get(json_object_get(json_object_get(json_array_get(jobs, j), "spec"), section), k);
            if (j == 0)
                first = v;
            else if (!(first && v && json_equal((json_t *)first, (json_t *)v)) && (first || v))
                differ = true;
            row[2 + j] = cell(v, vals[j], sizeof vals[j]);
        }
        snprintf(label, sizeof label, "%s.%s", prefix, k);
        row[0] = differ ? "*" : " ";
        row[1] = label;
        cli_table_row(t, row);
    }
    json_decref(keys);
}

void cli_print_compare(FILE *out, const json_t *jobs, const char *const *metrics, int nmetrics)
{
    size_t njobs = KILN_MIN(json_array_size(jobs), (size_t)CLI_TABLE_MAXCOLS - 2);
    cli_table_t t;
    cli_table_init(&t, "");
    cli_table_col(&t, " ", false);
    cli_table_col(&t, "FIELD", false);
    char heads[CLI_TABLE_MAXCOLS][32];
    for (size_t j = 0; j < njobs; j++) {
        char sid[16];
        cli_short_id(cli_jstr(json_array_get(jobs, j), "id"), sid, sizeof sid);
        snprintf(heads[j], sizeof heads[j], "%c %s", series_mark((int)j), sid);
        cli_table_col(&t, heads[j], false);
    }
    static const char *const top[] = {"name", "state", "project"};
    for (size_t f = 0; f < KILN_ARRAY_LEN(top); f++) {
        const char *row[CLI_TABLE_MAXCOLS];
        char vals[CLI_TABLE_MAXCOLS][64];
        bool differ = false;
        for (size_t j = 0; j < njobs; j++) {
            cli_clip(cli_jstr(json_array_get(jobs, j), top[f]), 40, vals[j], sizeof vals[j]);
            differ = differ || strcmp(vals[j], vals[0]) != 0;
            row[2 + j] = vals[j];
        }
        row[0] = differ ? "*" : " ";
        row[1] = top[f];
        cli_table_row(&t, row);
    }
    spec_rows(&t, jobs, "hyperparameters", "hp");
    spec_rows(&t, jobs, "model", "model");
    /* metric summaries: the metrics asked for, else every one any job reported */
    json_t *names = json_object();
    for (int m = 0; m < nmetrics; m++)
        json_object_set_new(names, metrics[m], json_true());
    if (nmetrics == 0)
        for (size_t j = 0; j < njobs; j++) {
            const char *k;
            json_t *v;
            json_object_foreach(json_object_get(json_array_get(jobs, j), "summaries"), k, v)
                json_object_set_new(names, k, json_true());
        }
    const char *name;
    json_t *unused;
    json_object_foreach(names, name, unused) {
        static const char *const aggs[] = {"min", "max", "last", "count"};
        for (size_t a = 0; a < KILN_ARRAY_LEN(aggs); a++) {
            const char *row[CLI_TABLE_MAXCOLS];
            char vals[CLI_TABLE_MAXCOLS][64], label[128];
            bool differ = false;
            for (size_t j = 0; j < njobs; j++) {
                const json_t *s = json_object_get(json_object_get(json_array_get(jobs, j), "summaries"), name);
                const json_t *v = json_object_get(s, aggs[a]);
                cell(v, vals[j], sizeof vals[j]);
                if (a < 2 && json_is_number(v)) {
                    /* where the extreme was reached */
                    size_t l = strlen(vals[j]);
                    snprintf(vals[j] + l, sizeof vals[j] - l, " @%lld",
                             (long long)json_integer_value(json_object_get(s, a == 0 ? "min_step" : "max_step")));
                }
                differ = differ || strcmp(vals[j], vals[0]) != 0;
                row[2 + j] = vals[j];
            }
            snprintf(label, sizeof label, "metrics.%s.%s", name, aggs[a]);
            row[0] = differ ? "*" : " ";
            row[1] = label;
            cli_table_row(&t, row);
        }
    }
    json_decref(names);
    cli_table_print(out, &t);
    fprintf(out, "(* marks fields whose values differ)\n");
}
