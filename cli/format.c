/* format.c - how `kiln` shows things: aligned tables of jobs, workers, metrics, users, tokens,
 * projects and members, the describe and whoami pages, log lines, sparklines, durations and API
 * errors. Pure functions over jansson values and a FILE *; no network here. */
#include "cli/cli_int.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- small formatters --------------------------------------------------------------------- */

char *cli_fmt_duration(double seconds, char *buf, size_t n)
{
    if (!(seconds > 0))
        seconds = 0;
    long long s = (long long)(seconds + 0.5);
    if (s < 60)
        snprintf(buf, n, "%llds", s);
    else if (s < 3600)
        snprintf(buf, n, "%lldm%02llds", s / 60, s % 60);
    else if (s < 86400)
        snprintf(buf, n, "%lldh%02lldm", s / 3600, (s % 3600) / 60);
    else
        snprintf(buf, n, "%lldd%02lldh", s / 86400, (s % 86400) / 3600);
    return buf;
}

char *cli_fmt_value(double v, char *buf, size_t n)
{
    double a = fabs(v);
    if (isnan(v))
        snprintf(buf, n, "-");
    else if (a != 0 && (a < 1e-4 || a >= 1e7))
        snprintf(buf, n, "%.3e", v);
    else if (a >= 1000)
        snprintf(buf, n, "%.0f", v);
    else
        snprintf(buf, n, "%.4g", v);
    return buf;
}

char *cli_sparkline(const double *values, size_t count, int width, char *buf, size_t n)
{
    static const char *const bars[8] = {"\u2581", "\u2582", "\u2583", "\u2584",
                                        "\u2585", "\u2586", "\u2587", "\u2588"};
    if (n == 0)
        return buf;
    buf[0] = '\0';
    if (count == 0 || width <= 0)
        return buf;
    size_t cells = KILN_MIN(count, (size_t)width);
    if ((size_t)3 * cells + 1 > n)
        cells = (n - 1) / 3;
    double *b = calloc(cells ? cells : 1, sizeof(double));
    if (!b)
        return buf;
    double lo = INFINITY, hi = -INFINITY;
    for (size_t c = 0; c < cells; c++) {
        /* Cell c averages values [c*count/cells, (c+1)*count/cells). */
        size_t from = c * count / cells, to = (c + 1) * count / cells;
        double sum = 0;
        size_t k = 0;
        for (size_t i = from; i < to; i++)
            if (isfinite(values[i])) {
                sum += values[i];
                k++;
            }
        b[c] = k ? sum / (double)k : NAN;
        if (k) {
            lo = fmin(lo, b[c]);
            hi = fmax(hi, b[c]);
        }
    }
    size_t off = 0;
    for (size_t c = 0; c < cells; c++) {
        int level;
        if (isnan(b[c]))
            level = 0;
        else if (hi - lo <= 0)
            level = 3;
        else
            level = (int)lround((b[c] - lo) / (hi - lo) * 7.0);
        memcpy(buf + off, bars[level], 3);
        off += 3;
    }
    buf[off] = '\0';
    free(b);
    return buf;
}

char *cli_short_id(const char *id, char *buf, size_t n)
{
    snprintf(buf, n, "%.8s", id ? id : "");
    return buf;
}

/* Display width of UTF-8 text: one cell per code point (good enough for names and bars). */
size_t cli_width(const char *s)
{
    size_t w = 0;
    for (; *s; s++)
        if (((unsigned char)*s & 0xC0) != 0x80)
            w++;
    return w;
}

/* Copies s into buf, cut to at most max cells with an ellipsis. */
char *cli_clip(const char *s, size_t max, char *buf, size_t n)
{
    if (cli_width(s) <= max) {
        snprintf(buf, n, "%s", s);
        return buf;
    }
    size_t cells = 0, i = 0;
    while (s[i] && cells < max - 1) {
        i++;
        while (((unsigned char)s[i] & 0xC0) == 0x80)
            i++;
        cells++;
    }
    snprintf(buf, n, "%.*s\u2026", (int)i, s);
    return buf;
}

char *cli_fmt_time(const char *rfc3339, char *buf, size_t n)
{
    int64_t us;
    if (!rfc3339 || !*rfc3339 || kiln_time_parse(rfc3339, &us) != 0) {
        snprintf(buf, n, "-");
        return buf;
    }
    time_t t = (time_t)(us / 1000000);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, n, "%Y-%m-%d %H:%M:%S", &tm);
    return buf;
}

bool cli_state_terminal(const char *state)
{
    if (!state)
        return false;
#define CLI_STATE_ENDED_(name, num, kind)                                                          \
    if (KILN_JOB_KIND_##kind == KILN_JOB_KIND_ENDED && !strcmp(state, #name))                      \
        return true;
    KILN_JOB_STATES(CLI_STATE_ENDED_)
#undef CLI_STATE_ENDED_
    return false;
}

/* ---- tables ------------------------------------------------------------------------------- */

void cli_table_init(cli_table_t *t, const char *spec)
{
    /* spec: "ID NAME >STEP": a leading '>' right-aligns the column. */
    memset(t, 0, sizeof(*t));
    const char *p = spec;
    while (*p && t->ncols < CLI_TABLE_MAXCOLS) {
        while (*p == ' ')
            p++;
        if (!*p)
            break;
        bool right = *p == '>';
        if (right)
            p++;
        size_t k = strcspn(p, " ");
        snprintf(t->names[t->ncols], sizeof(t->names[0]), "%.*s", (int)k, p);
        t->head[t->ncols] = t->names[t->ncols];
        t->right[t->ncols] = right;
        t->ncols++;
        p += k;
    }
}

void cli_table_col(cli_table_t *t, const char *name, bool right)
{
    if (t->ncols == CLI_TABLE_MAXCOLS)
        return;
    snprintf(t->names[t->ncols], sizeof(t->names[0]), "%s", name);
    t->head[t->ncols] = t->names[t->ncols];
    t->right[t->ncols] = right;
    t->ncols++;
}

/* Adds a row; takes copies of the ncols strings (NULL shows as "-"). */
void cli_table_row(cli_table_t *t, const char *const *vals)
{
    if (t->nrows == t->cap) {
        size_t nc = t->cap ? t->cap * 2 : 16;
        char **ncells = realloc(t->cells, nc * (size_t)t->ncols * sizeof(char *));
        if (!ncells)
            return;
        t->cells = ncells;
        t->cap = nc;
    }
    for (int c = 0; c < t->ncols; c++)
        t->cells[t->nrows * (size_t)t->ncols + (size_t)c] = strdup(vals[c] && *vals[c] ? vals[c] : "-");
    t->nrows++;
}

static bool cli_headers = true;

void cli_table_set_headers(bool on)
{
    cli_headers = on;
}

bool cli_table_headers(void)
{
    return cli_headers;
}

void cli_table_print(FILE *out, cli_table_t *t)
{
    size_t w[CLI_TABLE_MAXCOLS];
    for (int c = 0; c < t->ncols; c++) {
        w[c] = strlen(t->head[c]);
        for (size_t r = 0; r < t->nrows; r++) {
            const char *s = t->cells[r * (size_t)t->ncols + (size_t)c];
            w[c] = KILN_MAX(w[c], cli_width(s ? s : ""));
        }
    }
    for (size_t r = cli_headers ? 0 : 1; r <= t->nrows; r++) {
        for (int c = 0; c < t->ncols; c++) {
            const char *s = r == 0 ? t->head[c] : t->cells[(r - 1) * (size_t)t->ncols + (size_t)c];
            if (!s)
                s = "";
            size_t pad = w[c] - cli_width(s);
            bool last = c == t->ncols - 1;
            if (t->right[c])
                fprintf(out, "%*s%s", (int)pad, "", s);
            else if (last)
                fputs(s, out);
            else
                fprintf(out, "%s%*s", s, (int)pad, "");
            fputs(last ? "\n" : "  ", out);
        }
    }
    for (size_t i = 0; i < t->nrows * (size_t)t->ncols; i++)
        free(t->cells[i]);
    free(t->cells);
    t->cells = NULL;
    t->nrows = t->cap = 0;
}

/* Prints the table indented by two spaces (inside a describe-style page). */
void cli_table_print_indented(FILE *out, cli_table_t *t)
{
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem)
        return;
    bool headers = cli_headers; /* a table inside a page keeps its heading */
    cli_headers = true;
    cli_table_print(mem, t);
    cli_headers = headers;
    fclose(mem);
    for (char *line = text; line && *line;) {
        char *nl = strchr(line, '\n');
        fprintf(out, "  %.*s\n", (int)(nl ? nl - line : (long)strlen(line)), line);
        line = nl ? nl + 1 : NULL;
    }
    free(text);
}

/* ---- jobs --------------------------------------------------------------------------------- */

static void cli_job_step(const json_t *job, char *buf, size_t n)
{
    json_t *pr = json_object_get(job, "progress");
    double step = cli_jnum(pr, "step"), total = cli_jnum(pr, "total_steps");
    char st[24], tt[24];
    cli_jint_text(pr, "step", "0", st, sizeof(st));
    if (isnan(step) && isnan(total))
        snprintf(buf, n, "-");
    else if (isnan(total) || total <= 0)
        snprintf(buf, n, "%s", st);
    else
        snprintf(buf, n, "%s/%s", st, cli_jint_text(pr, "total_steps", "0", tt, sizeof(tt)));
}

/* The job's wall time, as the search field `duration` and the UI count it: from its first start to
 * its end, or to now until it ends, the waits between attempts (after a preemption or a lost
 * attempt) included. "-" before it started. */
static void cli_job_duration(const json_t *job, int64_t now_us, char *buf, size_t n)
{
    int64_t st = cli_jtime(job, "started_at"), en = cli_jtime(job, "ended_at");
    if (!st) {
        snprintf(buf, n, "-");
        return;
    }
    cli_fmt_duration((double)((en ? en : now_us) - st) / 1e6, buf, n);
}

void cli_print_jobs(FILE *out, const json_t *jobs, int64_t now_us, bool wide)
{
    cli_table_t t;
    cli_table_init(&t, wide ? "ID NAME STATE >STEP >LOSS >AGE >WALL-TIME PROJECT QUEUE >PRIO >RANKS >ATTEMPT BY WORKERS"
                            : "ID NAME STATE >STEP >LOSS >AGE >WALL-TIME");
    size_t i;
    json_t *job;
    json_array_foreach(jobs, i, job) {
        char sid[16], name[128], step[48], loss[32], age[32], dur[32];
        cli_short_id(cli_jstr(job, "id"), sid, sizeof(sid));
        cli_clip(cli_jstr(job, "name"), 32, name, sizeof(name));
        cli_job_step(job, step, sizeof(step));
        double l = cli_jnum(json_object_get(job, "metrics"), "train_loss");
        if (isnan(l))
            snprintf(loss, sizeof(loss), "-");
        else
            snprintf(loss, sizeof(loss), "%.4f", l);
        int64_t created = cli_jtime(job, "created_at");
        if (created)
            cli_fmt_duration((double)(now_us - created) / 1e6, age, sizeof(age));
        else
            snprintf(age, sizeof(age), "-");
        cli_job_duration(job, now_us, dur, sizeof(dur));
        char prio[16], ranks[16], attempt[16], workers[200] = "";
        cli_jint_text(job, "priority", "nan", prio, sizeof(prio));
        cli_jint_text(job, "world_size", "nan", ranks, sizeof(ranks));
        cli_jint_text(job, "attempt", "nan", attempt, sizeof(attempt));
        size_t k;
        json_t *w;
        json_array_foreach(json_object_get(job, "workers"), k, w) {
            size_t l = strlen(workers);
            snprintf(workers + l, sizeof workers - l, "%s%s", l ? "," : "", json_string_value(w) ? json_string_value(w) : "");
        }
        const char *row[] = {sid, name, cli_jstr(job, "state"), step, loss, age, dur, cli_jstr(job, "project"),
                             cli_jstr(job, "queue"), prio, ranks, attempt, cli_jstr(job, "submitted_by"),
                             workers[0] ? workers : "-"};
        cli_table_row(&t, row);
    }
    if (t.nrows == 0) {
        fprintf(out, "no jobs\n");
        return;
    }
    cli_table_print(out, &t);
}

static void cli_kv(FILE *out, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void cli_kv(FILE *out, const char *key, const char *fmt, ...)
{
    char label[160];
    int n = snprintf(label, sizeof(label), "%s:", key);
    /* the longest fixed label ("Submitted by:") and a space; a longer one (a script job's
     * "Channel validation:") still gets its space before the value */
    fprintf(out, n >= 14 ? "%s " : "%-14s", label);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(out, fmt, ap);
    va_end(ap);
    fputc('\n', out);
}

static void cli_print_time_kv(FILE *out, const char *key, const json_t *job, const char *field, int64_t now_us)
{
    const char *s = cli_jstr(job, field);
    int64_t us = cli_jtime(job, field);
    char tb[40], ago[32];
    if (!us) {
        cli_kv(out, key, "-");
        return;
    }
    cli_kv(out, key, "%s (%s ago)", cli_fmt_time(s, tb, sizeof(tb)),
           cli_fmt_duration((double)(now_us - us) / 1e6, ago, sizeof(ago)));
}

/* A waiting job's pending reason (job.pending): its position, what is missing, the jobs it waits
 * for and its estimated start; nothing when the job does not wait. */
static void cli_print_pending(FILE *out, const json_t *job, int64_t now_us)
{
    const json_t *p = json_object_get(job, "pending");
    if (!json_is_object(p))
        return;
    cli_kv(out, "Position", "%.0f in queue %s", cli_jnum(p, "position"), cli_jstr(job, "queue"));
    cli_kv(out, "Missing", "%s", cli_jstr(p, "missing"));
    const json_t *b = json_object_get(p, "blocking_jobs");
    if (json_array_size(b) > 0) {
        char ids[512] = "";
        size_t off = 0;
        for (size_t i = 0; i < json_array_size(b) && off + 40 < sizeof ids; i++)
            off += (size_t)snprintf(ids + off, sizeof ids - off, "%s%s", i ? ", " : "",
                                    json_string_value(json_array_get(b, i)) ? json_string_value(json_array_get(b, i)) : "");
        cli_kv(out, "Waits for", "%s", ids);
    }
    int64_t at = cli_jtime(p, "estimated_start");
    char tb[40], in[32];
    if (at)
        cli_kv(out, "Est. start", "%s (in %s)", cli_fmt_time(cli_jstr(p, "estimated_start"), tb, sizeof tb),
               cli_fmt_duration((double)KILN_MAX(0, at - now_us) / 1e6, in, sizeof in));
    else
        cli_kv(out, "Est. start", "unknown (what it waits for has no predicted end yet)");
}

void cli_print_job(FILE *out, const json_t *job, const json_t *events, int64_t now_us)
{
    const char *state = cli_jstr(job, "state");
    const char *reason = cli_jstr(job, "reason");
    json_t *spec = json_object_get(job, "spec");
    char buf[256];

    cli_kv(out, "ID", "%s", cli_jstr(job, "id"));
    cli_kv(out, "Name", "%s", *cli_jstr(job, "name") ? cli_jstr(job, "name") : "-");
    if (*cli_jstr(spec, "project"))
        cli_kv(out, "Project", "%s", cli_jstr(spec, "project"));
    if (*cli_jstr(job, "submitted_by"))
        cli_kv(out, "Submitted by", "%s", cli_jstr(job, "submitted_by"));
    /* where it waits and in which order: what a team sharing the cluster reads first */
    if (*cli_jstr(job, "queue")) {
        double prio = cli_jnum(job, "priority");
        cli_kv(out, "Queue", "%s (priority %.0f)", cli_jstr(job, "queue"), isnan(prio) ? 0.0 : prio);
    }
    /* a waiting job's reason is "what it waits for: the details", and its pending block below says
     * the details again, line by line: the State line keeps what it waits for */
    int rlen = (int)strlen(reason);
    const char *colon = strchr(reason, ':');
    if (colon && json_is_object(json_object_get(job, "pending")))
        rlen = (int)(colon - reason);
    cli_kv(out, "State", "%s%s%.*s", state, *reason ? "  " : "", rlen, reason);
    cli_print_pending(out, job, now_us);
    double attempt = cli_jnum(job, "attempt");
    if (!isnan(attempt))
        cli_kv(out, "Attempt", "%.0f", attempt);
    cli_print_time_kv(out, "Created", job, "created_at", now_us);
    cli_print_time_kv(out, "Started", job, "started_at", now_us);
    cli_print_time_kv(out, "Ended", job, "ended_at", now_us);
    /* wall time, said as such: a job that waits again after it ran (preempted, restarting) counts
     * its waits too, which a bare "Duration" hid */
    cli_job_duration(job, now_us, buf, sizeof(buf));
    if (cli_jtime(job, "started_at")) {
        bool ended = cli_jtime(job, "ended_at") != 0;
        bool waits = !strcmp(state, "QUEUED") || !strcmp(state, "RESTARTING") || !strcmp(state, "PREEMPTED")
                     || !strcmp(state, "PAUSED");
        cli_kv(out, "Wall time", "%s %s%s%s", buf, ended ? "from its first start to its end" : "since its first start",
               waits || (!isnan(attempt) && attempt > 1) ? ", waits between attempts included" : "",
               waits ? " (it waits now)" : "");
    } else {
        cli_kv(out, "Wall time", "-");
    }

    json_t *pr = json_object_get(job, "progress");
    double step = cli_jnum(pr, "step"), total = cli_jnum(pr, "total_steps"), eta = cli_jnum(pr, "eta_s");
    if (!isnan(total) && total > 0) {
        double s = isnan(step) ? 0 : step;
        double frac = KILN_MIN(1.0, KILN_MAX(0.0, s / total));
        char bar[32 * 3 + 1] = "";
        int filled = (int)lround(frac * 20);
        size_t off = 0;
        for (int i = 0; i < 20; i++) {
            const char *cell = i < filled ? "\u2588" : "\u2591";
            memcpy(bar + off, cell, 3);
            off += 3;
        }
        bar[off] = '\0';
        char etab[32] = "";
        /* only while it runs: a waiting job's (QUEUED, PREEMPTED, PAUSED) would read as when it
         * ends, which is its Est. start plus this at the earliest */
        if (!isnan(eta) && !strcmp(state, "RUNNING") && s < total) {
            char d[24];
            snprintf(etab, sizeof(etab), "  ETA %s", cli_fmt_duration(eta, d, sizeof(d)));
        }
        char st[24], tt[24];
        cli_kv(out, "Progress", "%s/%s steps  %s %5.1f%%%s", cli_jint_text(pr, "step", "0", st, sizeof(st)),
               cli_jint_text(pr, "total_steps", "0", tt, sizeof(tt)), bar, frac * 100.0, etab);
    } else {
        cli_kv(out, "Progress", "-");
    }

    json_t *res = json_object_get(spec, "resources");
    if (res) {
        double nodes = cli_jnum(res, "nodes"), spn = cli_jnum(res, "slots_per_node");
        const char *st = cli_jstr(res, "slot_type");
        cli_kv(out, "Resources", "%.0f node%s x %.0f %s slot%s", isnan(nodes) ? 1 : nodes,
               nodes == 1 ? "" : "s", isnan(spn) ? 1 : spn, *st ? st : "cpu", spn == 1 ? "" : "s");
    }
    json_t *model = json_object_get(spec, "model");
    if (model) {
        char mb[256];
        int off = snprintf(mb, sizeof(mb), "%s", *cli_jstr(model, "type") ? cli_jstr(model, "type") : "?");
        static const char *const keys[] = {"n_layer", "n_head", "n_embd", "seq_len"};
        for (size_t i = 0; i < KILN_ARRAY_LEN(keys) && off < (int)sizeof(mb); i++) {
            double v = cli_jnum(model, keys[i]);
            if (!isnan(v) && v > 0)
                off += snprintf(mb + off, sizeof(mb) - (size_t)off, " %s=%.0f", keys[i], v);
        }
        cli_kv(out, "Model", "%s", mb);
    }
    const char *entry = cli_jstr(spec, "entry_point");
    if (*entry) {
        /* a script job: its program, where the code comes from, its own hyperparameters */
        cli_kv(out, "Entry point", "%s%s%s", entry, *cli_jstr(spec, "python") ? " with " : "", cli_jstr(spec, "python"));
        const char *src = cli_jstr(spec, "source");
        if (!strncmp(src, "code:sha256:", 12))
            cli_kv(out, "Source", "%s (code archive; kiln code get %.12s)", src, src + 12);
        else
            cli_kv(out, "Source", "%s", src);
        /* 15 significant digits, as kilnd writes numbers: 0.1 stays 0.1 */
        char *hps = json_dumps(json_object_get(spec, "hyperparameters"),
                               JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
        if (hps && strcmp(hps, "{}") != 0) {
            char clip[256];
            cli_kv(out, "Hyperparams", "%s", cli_clip(hps, 200, clip, sizeof(clip)));
        }
        free(hps);
        const char *ch;
        json_t *v;
        json_object_foreach(json_object_get(json_object_get(spec, "data"), "channels"), ch, v) {
            char label[80];
            snprintf(label, sizeof(label), "Channel %s", ch);
            cli_kv(out, label, "%s", json_string_value(v) ? json_string_value(v) : "");
        }
    }
    json_t *hp = *entry ? NULL : json_object_get(spec, "hyperparameters");
    if (hp) {
        char lr[24], batch[24], steps[24];
        cli_kv(out, "Training", "lr=%s batch=%s max_steps=%s", cli_fmt_value(cli_jnum(hp, "lr"), lr, sizeof(lr)),
               cli_jint_text(hp, "global_batch_size", "nan", batch, sizeof(batch)),
               cli_jint_text(hp, "max_steps", "nan", steps, sizeof(steps)));
    }
    json_t *tags = json_object_get(spec, "tags");
    if (json_object_size(tags) > 0) {
        char tb[512] = "";
        size_t off = 0;
        const char *k;
        json_t *v;
        json_object_foreach(tags, k, v) {
            if (off < sizeof(tb))
                off += (size_t)snprintf(tb + off, sizeof(tb) - off, "%s%s=%s", off ? " " : "", k,
                                        json_is_string(v) ? json_string_value(v) : "?");
        }
        cli_kv(out, "Tags", "%s", tb);
    }

    json_t *workers = json_object_get(job, "workers");
    if (json_array_size(workers) > 0) {
        char wb[1024] = "";
        size_t off = 0, i;
        json_t *w;
        json_array_foreach(workers, i, w) {
            if (off < sizeof(wb))
                off += (size_t)snprintf(wb + off, sizeof(wb) - off, "%s%s", i ? ", " : "",
                                        json_is_string(w) ? json_string_value(w) : "?");
        }
        cli_kv(out, "Workers", "%s", wb);
    } else {
        cli_kv(out, "Workers", "-");
    }

    json_t *metrics = json_object_get(job, "metrics");
    if (json_object_size(metrics) > 0) {
        fprintf(out, "Metrics:\n");
        const char *k;
        json_t *v;
        json_object_foreach(metrics, k, v) {
            char vb[32];
            fprintf(out, "  %-16s %s\n", k, cli_fmt_value(json_is_number(v) ? json_number_value(v) : NAN, vb, sizeof(vb)));
        }
    }

    json_t *evs = json_object_get(events, "events");
    if (json_array_size(evs) > 0) {
        fprintf(out, "Events:\n");
        cli_table_t t;
        cli_table_init(&t, "TIME >FROM \u2192 TO BY REASON");
        /* The arrow column is a fixed glyph; "FROM" is right-aligned against it. */
        t.head[2] = " ";
        size_t i;
        json_t *e;
        json_array_foreach(evs, i, e) {
            char tb[40];
            const char *from = cli_jstr(e, "from_state");
            const char *to = cli_jstr(e, "to_state");
            const char *by = cli_jstr(e, "actor");
            /* an event that leaves the job where it is (a head preempting others) names its state
             * once, with no arrow: it is no transition (a cell of one space: an empty one reads "-") */
            bool stays = *from && !strcmp(from, to);
            const char *row[] = {cli_fmt_time(cli_jstr(e, "time"), tb, sizeof(tb)), stays ? " " : *from ? from : "-",
                                 stays ? " " : "\u2192", to, *by ? by : "kilnd", cli_jstr(e, "reason")};
            cli_table_row(&t, row);
        }
        cli_table_print_indented(out, &t);
    }
}

/* ---- metrics, workers, logs ----------------------------------------------------------------- */

void cli_print_metrics(FILE *out, const json_t *reply, int spark_width)
{
    cli_table_t t;
    cli_table_init(&t, "NAME >POINTS >STEPS >LAST >MIN >MAX TREND");
    size_t i;
    json_t *series;
    json_array_foreach(json_object_get(reply, "metrics"), i, series) {
        json_t *pts = json_object_get(series, "points");
        size_t n = json_array_size(pts);
        double *vals = calloc(n ? n : 1, sizeof(double));
        if (!vals)
            return;
        double lo = INFINITY, hi = -INFINITY, last = NAN;
        for (size_t k = 0; k < n; k++) {
            json_t *p = json_array_get(pts, k);
            vals[k] = cli_jnum(p, "value");
            if (isfinite(vals[k])) {
                lo = fmin(lo, vals[k]);
                hi = fmax(hi, vals[k]);
            }
            last = vals[k];
        }
        char np[24], steps[48], first_step[24], last_step[24], lb[24], lob[24], hib[24];
        char *spark = malloc((size_t)spark_width * 3 + 1);
        snprintf(np, sizeof(np), "%zu", n);
        if (n)
            snprintf(steps, sizeof(steps), "%s-%s", cli_jint_text(json_array_get(pts, 0), "step", "nan", first_step, sizeof(first_step)),
                     cli_jint_text(json_array_get(pts, n - 1), "step", "nan", last_step, sizeof(last_step)));
        else
            snprintf(steps, sizeof(steps), "-");
        cli_fmt_value(last, lb, sizeof(lb));
        cli_fmt_value(isfinite(lo) ? lo : NAN, lob, sizeof(lob));
        cli_fmt_value(isfinite(hi) ? hi : NAN, hib, sizeof(hib));
        if (spark)
            cli_sparkline(vals, n, spark_width, spark, (size_t)spark_width * 3 + 1);
        const char *row[] = {cli_jstr(series, "name"), np, steps, lb, lob, hib, spark ? spark : ""};
        cli_table_row(&t, row);
        free(spark);
        free(vals);
    }
    if (t.nrows == 0) {
        fprintf(out, "no metrics yet\n");
        return;
    }
    cli_table_print(out, &t);
}

void cli_print_metrics_raw(FILE *out, const json_t *reply)
{
    json_t *all = json_object_get(reply, "metrics");
    bool named = json_array_size(all) > 1;
    fprintf(out, named ? "name,step,value\n" : "step,value\n");
    size_t i, k;
    json_t *series, *p;
    json_array_foreach(all, i, series) {
        json_array_foreach(json_object_get(series, "points"), k, p) {
            if (named)
                fprintf(out, "%s,", cli_jstr(series, "name"));
            char step[24];
            fprintf(out, "%s,%.9g\n", cli_jint_text(p, "step", "nan", step, sizeof(step)), cli_jnum(p, "value"));
        }
    }
}

/* "12s ago" for field of obj, "-" when it has none. */
static char *cli_ago(const json_t *obj, const char *field, int64_t now_us, char *buf, size_t n)
{
    int64_t t_us = cli_jtime(obj, field);
    char d[24];
    if (t_us)
        snprintf(buf, n, "%s ago", cli_fmt_duration((double)(now_us - t_us) / 1e6, d, sizeof(d)));
    else
        snprintf(buf, n, "-");
    return buf;
}

void cli_print_workers(FILE *out, const json_t *reply, int64_t now_us, bool wide)
{
    cli_table_t t;
    cli_table_init(&t, wide ? "ID HOST ADDRESS TYPE >SLOTS >FREE STATE >HEARTBEAT >REGISTERED JOIN-TOKEN FROM CERT-SHA256 >CORES "
                              "VERSION GPUS DATA-ROOTS"
                            : "ID HOST ADDRESS TYPE >SLOTS >FREE STATE >HEARTBEAT >REGISTERED JOIN-TOKEN");
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(reply, "workers"), i, w) {
        char slots[16], freeb[16], hb[40], reg[40];
        cli_jint_text(w, "slots", "nan", slots, sizeof(slots));
        cli_jint_text(w, "slots_free", "nan", freeb, sizeof(freeb));
        cli_ago(w, "last_heartbeat", now_us, hb, sizeof(hb));
        cli_ago(w, "registered_at", now_us, reg, sizeof(reg));
        /* an ALIVE worker whose agent is shutting down takes no new placements; one that waits
         * for a cluster admin's approval takes none yet */
        const char *state = cli_jstr(w, "state");
        if (!strcmp(state, "ALIVE") && json_is_true(json_object_get(w, "draining")))
            state = "DRAINING";
        else if (!strcmp(state, "ALIVE") && !strcmp(cli_jstr(w, "approval"), "PENDING"))
            state = "PENDING";
        char cores[16], gpus[200] = "", roots[300] = "", cert[24];
        cli_jint_text(w, "cpu_cores", "nan", cores, sizeof(cores));
        snprintf(cert, sizeof cert, "%.16s", cli_jstr(w, "cert_sha256"));
        size_t k;
        json_t *s;
        json_array_foreach(json_object_get(w, "gpus"), k, s) {
            size_t l = strlen(gpus);
            snprintf(gpus + l, sizeof gpus - l, "%s%s", l ? "," : "", json_string_value(s) ? json_string_value(s) : "");
        }
        json_array_foreach(json_object_get(w, "data_roots"), k, s) {
            size_t l = strlen(roots);
            snprintf(roots + l, sizeof roots - l, "%s%s", l ? "," : "", json_string_value(s) ? json_string_value(s) : "");
        }
        /* an empty cell shows as "-" */
        const char *row[] = {cli_jstr(w, "id"), cli_jstr(w, "hostname"), cli_jstr(w, "address"),
                             cli_jstr(w, "slot_type"), slots, freeb, state, hb, reg, cli_jstr(w, "join_token"),
                             cli_jstr(w, "registered_from"), cert, cores, cli_jstr(w, "version"), gpus, roots};
        cli_table_row(&t, row);
    }
    if (t.nrows == 0) {
        fprintf(out, "no workers registered\n");
        return;
    }
    cli_table_print(out, &t);
}

char *cli_fmt_bytes(double bytes, char *buf, size_t n)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    if (isnan(bytes) || bytes < 0)
        bytes = 0;
    while (bytes >= 1024 && u < 4) {
        bytes /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, n, "%.0f B", bytes);
    else
        snprintf(buf, n, "%.*f %s", bytes < 10 ? 1 : 0, bytes, units[u]);
    return buf;
}

void cli_print_artifacts(FILE *out, const json_t *reply, bool wide)
{
    cli_table_t t;
    cli_table_init(&t, wide ? "NAME >SIZE >BYTES SHA256 >ATTEMPT CREATED WORKER" : "NAME >SIZE SHA256 >ATTEMPT CREATED");
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(reply, "artifacts"), i, a) {
        char size[24], bytes[32], attempt[16], created[32], sha[KILN_SHA256_HEX];
        cli_fmt_bytes(cli_jnum(a, "size"), size, sizeof(size));
        cli_jint_text(a, "size", "nan", bytes, sizeof(bytes));
        cli_jint_text(a, "attempt", "nan", attempt, sizeof(attempt));
        snprintf(sha, sizeof(sha), wide ? "%.64s" : "%.16s", cli_jstr(a, "sha256"));
        cli_fmt_time(cli_jstr(a, "created_at"), created, sizeof(created));
        const char *narrow[] = {cli_jstr(a, "name"), size, sha, attempt, created};
        const char *full[] = {cli_jstr(a, "name"), size, bytes, sha, attempt, created, cli_jstr(a, "worker_id")};
        cli_table_row(&t, wide ? full : narrow);
    }
    if (t.nrows == 0) {
        fprintf(out, "no artifacts (a job's output directory is kept once it has ended)\n");
        return;
    }
    cli_table_print(out, &t);
}

void cli_print_checkpoints(FILE *out, const json_t *reply, bool wide)
{
    cli_table_t t;
    cli_table_init(&t, wide ? "NAME >SIZE >BYTES SHA256 >ATTEMPT WORKER" : "NAME >SIZE SHA256 >ATTEMPT");
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(reply, "files"), i, f) {
        char size[24], bytes[32], attempt[16], sha[KILN_SHA256_HEX];
        cli_fmt_bytes(cli_jnum(f, "size"), size, sizeof(size));
        cli_jint_text(f, "size", "nan", bytes, sizeof(bytes));
        cli_jint_text(f, "attempt", "nan", attempt, sizeof(attempt));
        snprintf(sha, sizeof(sha), wide ? "%.64s" : "%.16s", cli_jstr(f, "sha256"));
        const char *narrow[] = {cli_jstr(f, "name"), size, sha, attempt};
        const char *full[] = {cli_jstr(f, "name"), size, bytes, sha, attempt, cli_jstr(f, "worker_id")};
        cli_table_row(&t, wide ? full : narrow);
    }
    if (t.nrows == 0) {
        fprintf(out, "no synced checkpoints (a job without checkpoint.path has its checkpoint directory synced while "
                     "it runs)\n");
        return;
    }
    char when[32];
    cli_fmt_time(cli_jstr(reply, "synced_at"), when, sizeof(when));
    fprintf(out, "synced %s\n", when);
    cli_table_print(out, &t);
}

void cli_print_log_line(FILE *out, const json_t *line)
{
    double rank = cli_jnum(line, "rank"), attempt = cli_jnum(line, "attempt");
    if (isnan(rank))
        fprintf(out, "%s\n", cli_jstr(line, "line"));
    else if (!isnan(attempt) && attempt > 1) /* a restarted job: say which run wrote it */
        fprintf(out, "[rank %.0f, attempt %.0f] %s\n", rank, attempt, cli_jstr(line, "line"));
    else
        fprintf(out, "[rank %.0f] %s\n", rank, cli_jstr(line, "line"));
}

/* ---- identity: whoami, users, tokens, projects, members -------------------------------------- */

void cli_print_whoami(FILE *out, const json_t *reply, const char *url, const char *login_from)
{
    bool admin = json_is_true(json_object_get(reply, "cluster_admin"));
    const char *token_id = cli_jstr(reply, "token_id"), *expires = cli_jstr(reply, "token_expires_at");
    char tb[40];
    cli_kv(out, "User", "%s%s", cli_jstr(reply, "user"), admin ? " (cluster admin)" : "");
    if (!*token_id)
        cli_kv(out, "Token", "none: this kilnd does not check tokens");
    else if (*expires)
        cli_kv(out, "Token", "%s, expires %s UTC", token_id, cli_fmt_time(expires, tb, sizeof(tb)));
    else
        cli_kv(out, "Token", "%s, does not expire", token_id);
    if (url && *url)
        cli_kv(out, "kilnd", "%s", url);
    if (login_from && *login_from)
        cli_kv(out, "Login", "%s", login_from);
    json_t *projects = json_object_get(reply, "projects");
    if (json_array_size(projects) == 0) {
        cli_kv(out, "Projects", "%s", admin ? "none as a member (a cluster admin reads and manages every project)"
                                            : "none yet (a project admin adds you with kiln projects add-member)");
        return;
    }
    fprintf(out, "Projects:\n");
    cli_table_t t;
    cli_table_init(&t, "PROJECT ROLE");
    size_t i;
    json_t *p;
    json_array_foreach(projects, i, p) {
        const char *row[] = {cli_jstr(p, "project"), cli_jstr(p, "role")};
        cli_table_row(&t, row);
    }
    cli_table_print_indented(out, &t);
}

void cli_print_users(FILE *out, const json_t *reply)
{
    cli_table_t t;
    cli_table_init(&t, "NAME CLUSTER-ADMIN CREATED CREATED-BY");
    size_t i;
    json_t *u;
    json_array_foreach(json_object_get(reply, "users"), i, u) {
        char tb[40];
        const char *row[] = {cli_jstr(u, "name"), json_is_true(json_object_get(u, "cluster_admin")) ? "yes" : "no",
                             cli_fmt_time(cli_jstr(u, "created_at"), tb, sizeof(tb)), cli_jstr(u, "created_by")};
        cli_table_row(&t, row);
    }
    if (t.nrows == 0) {
        fprintf(out, "no users\n");
        return;
    }
    cli_table_print(out, &t);
}

void cli_print_tokens(FILE *out, const json_t *reply, int64_t now_us)
{
    cli_table_t t;
    cli_table_init(&t, "ID USER KIND STATE CREATED EXPIRES LAST-USED CREATED-BY PARENT DESCRIPTION");
    size_t i;
    json_t *k;
    json_array_foreach(json_object_get(reply, "tokens"), i, k) {
        char created[40], expires[40], used[40];
        int64_t exp_us = cli_jtime(k, "expires_at"), used_us = cli_jtime(k, "last_used_at");
        const char *state = cli_jtime(k, "revoked_at") ? "revoked" : exp_us && exp_us <= now_us ? "expired" : "active";
        cli_fmt_time(cli_jstr(k, "created_at"), created, sizeof(created));
        if (exp_us)
            cli_fmt_time(cli_jstr(k, "expires_at"), expires, sizeof(expires));
        else
            snprintf(expires, sizeof(expires), "never");
        if (used_us) {
            char d[24];
            snprintf(used, sizeof(used), "%s ago", cli_fmt_duration((double)(now_us - used_us) / 1e6, d, sizeof(d)));
        } else {
            snprintf(used, sizeof(used), "never");
        }
        /* lineage: who made it, with which token (empty, so "-": the bootstrap token, older tokens) */
        const char *row[] = {cli_jstr(k, "id"), cli_jstr(k, "user"), cli_jstr(k, "kind"), state, created, expires,
                             used, cli_jstr(k, "created_by"), cli_jstr(k, "parent_id"), cli_jstr(k, "description")};
        cli_table_row(&t, row);
    }
    if (t.nrows == 0) {
        fprintf(out, "no tokens\n");
        return;
    }
    cli_table_print(out, &t);
}

void cli_print_also_revoked(FILE *out, const json_t *reply)
{
    json_int_t more = json_integer_value(json_object_get(reply, "descendants_revoked"));
    if (more > 0)
        fprintf(out, "also revoked %lld token%s made with it\n", (long long)more, more == 1 ? "" : "s");
}

/* The caller's role in project according to a whoami reply; "" when it has none. */
static const char *cli_whoami_role(const json_t *whoami, const char *project)
{
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(whoami, "projects"), i, p)
        if (!strcmp(cli_jstr(p, "project"), project))
            return cli_jstr(p, "role");
    return "";
}

void cli_print_projects(FILE *out, const json_t *reply, const json_t *roles)
{
    bool admin = json_is_true(json_object_get(roles, "cluster_admin"));
    cli_table_t t;
    cli_table_init(&t, "NAME ROLE DEFAULT-QUEUE CREATED CREATED-BY");
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(reply, "projects"), i, p) {
        char tb[40];
        const char *name = cli_jstr(p, "name"), *role = cli_jstr(p, "role");
        if (!*role)
            role = cli_whoami_role(roles, name);
        if (!*role && admin)
            role = "(cluster admin)";
        const char *row[] = {name, role, cli_jstr(p, "default_queue"),
                             cli_fmt_time(cli_jstr(p, "created_at"), tb, sizeof(tb)), cli_jstr(p, "created_by")};
        cli_table_row(&t, row);
    }
    if (t.nrows == 0) {
        fprintf(out, "no projects%s\n", admin ? "" : " (a project admin adds you with kiln projects add-member)");
        return;
    }
    cli_table_print(out, &t);
}

void cli_print_members(FILE *out, const json_t *reply)
{
    cli_table_t t;
    cli_table_init(&t, "USER ROLE");
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(reply, "members"), i, m) {
        const char *row[] = {cli_jstr(m, "user"), cli_jstr(m, "role")};
        cli_table_row(&t, row);
    }
    if (t.nrows == 0) {
        fprintf(out, "no members\n");
        return;
    }
    cli_table_print(out, &t);
}

/* ---- errors ------------------------------------------------------------------------------- */

void cli_print_error(FILE *out, const kiln_err_t *err)
{
    const char *msg = *err->message ? err->message : kiln_strerror(err->status);
    size_t fl = strlen(err->field);
    /* "error: FIELD: what is wrong"; a message that starts with the field already
     * ("hyperparameters.lr must be ...") is not made to repeat it. */
    if (fl && !strncmp(msg, err->field, fl) && (msg[fl] == ' ' || msg[fl] == ':')) {
        msg += fl;
        while (*msg == ' ' || *msg == ':')
            msg++;
    }
    if (fl)
        fprintf(out, "error: %s: %s\n", err->field, msg);
    else
        fprintf(out, "error: %s\n", msg);
    if (*err->detail)
        fprintf(out, "detail: %s\n", err->detail);
    if (*err->hint)
        fprintf(out, "hint: %s\n", err->hint);
}

static int cli_status_from_code(const char *code, int http_status)
{
#define CLI_CODE_ROW(name, val, cstr, msg, http, grpc) \
    if (code && !strcmp(code, cstr) && (val) != 0)     \
        return (val);
    KILN_STATUS_MAP(CLI_CODE_ROW)
#undef CLI_CODE_ROW
    switch (http_status) {
    case 400: return KILN_EINVAL;
    case 401: return KILN_EUNAUTH;
    case 403: return KILN_EPERM;
    case 404: return KILN_ENOTFOUND;
    case 409: return KILN_ESTATE;
    case 429: return KILN_ELIMIT;
    case 502: return KILN_ECOMM;
    case 503: return KILN_EUNAVAIL;
    case 504: return KILN_ETIMEDOUT;
    default: return KILN_EINTERNAL;
    }
}

int cli_error_from_reply(int http_status, const char *body, kiln_err_t *err)
{
    json_t *j = body ? json_loads(body, 0, NULL) : NULL;
    if (json_is_object(j) && json_is_string(json_object_get(j, "message"))) {
        int st = cli_status_from_code(cli_jstr(j, "code"), http_status);
        kiln_err_set(err, st, NULL, "%s", cli_jstr(j, "message"));
        if (err) {
            kiln_strlcpy(err->field, cli_jstr(j, "field"), sizeof(err->field));
            kiln_strlcpy(err->detail, cli_jstr(j, "detail"), sizeof(err->detail));
            kiln_strlcpy(err->hint, cli_jstr(j, "hint"), sizeof(err->hint));
        }
        json_decref(j);
        return st;
    }
    json_decref(j);
    int st = cli_status_from_code(NULL, http_status);
    const char *b = body ? body : "";
    int len = (int)strcspn(b, "\r\n");
    if (len > 200)
        len = 200;
    kiln_err_set(err, st, NULL, "kilnd answered HTTP %d%s%.*s", http_status, len ? ": " : "", len, b);
    return st;
}

/* ---- YAML (-o yaml) ------------------------------------------------------------------------ */

/* A key that needs no quotes: letters, digits, '_', '-', '.', not starting with a digit or '-'. */
static bool cli_yaml_plain_key(const char *k)
{
    if (!*k || isdigit((unsigned char)*k) || *k == '-' || *k == '.')
        return false;
    for (const char *p = k; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '_' && *p != '-' && *p != '.')
            return false;
    return true;
}

/* Scalars as JSON writes them, which YAML reads the same (strings double-quoted), except that a
 * real gets a decimal point ("1.0e-08"), which YAML 1.1 readers need to see a number. */
static void cli_yaml_scalar(FILE *out, const json_t *j)
{
    char *s = json_dumps(j, JSON_ENCODE_ANY | JSON_REAL_PRECISION(10));
    const char *e = s && json_is_real(j) && !strchr(s, '.') ? strchr(s, 'e') : NULL;
    if (e)
        fprintf(out, "%.*s.0%s", (int)(e - s), s, e);
    else
        fputs(s ? s : "null", out);
    free(s);
}

static void cli_yaml_key(FILE *out, const char *k)
{
    if (cli_yaml_plain_key(k)) {
        fputs(k, out);
    } else {
        json_t *s = json_string(k);
        cli_yaml_scalar(out, s);
        json_decref(s);
    }
    fputc(':', out);
}

static bool cli_yaml_is_block(const json_t *j)
{
    return (json_is_object(j) && json_object_size(j) > 0) || (json_is_array(j) && json_array_size(j) > 0);
}

/* A value after "key:" or "- ": scalars and empty containers on the same line, blocks below. */
static void cli_yaml_node(FILE *out, const json_t *j, int indent, bool after_dash);

static void cli_yaml_value(FILE *out, const json_t *j, int indent)
{
    if (!cli_yaml_is_block(j)) {
        fputc(' ', out);
        if (json_is_object(j))
            fputs("{}", out);
        else if (json_is_array(j))
            fputs("[]", out);
        else
            cli_yaml_scalar(out, j);
        fputc('\n', out);
        return;
    }
    fputc('\n', out);
    cli_yaml_node(out, j, indent, false);
}

static void cli_yaml_node(FILE *out, const json_t *j, int indent, bool after_dash)
{
    if (json_is_object(j)) {
        const char *k;
        json_t *v;
        bool first = true;
        json_object_foreach((json_t *)j, k, v) {
            if (!(first && after_dash))
                fprintf(out, "%*s", indent, "");
            first = false;
            cli_yaml_key(out, k);
            cli_yaml_value(out, v, indent + 2);
        }
    } else if (json_is_array(j)) {
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) {
            if (!(i == 0 && after_dash))
                fprintf(out, "%*s", indent, "");
            fputc('-', out);
            if (cli_yaml_is_block(v)) {
                fputc(' ', out);
                cli_yaml_node(out, v, indent + 2, true);
            } else {
                cli_yaml_value(out, v, indent + 2);
            }
        }
    } else {
        fprintf(out, "%*s", indent, "");
        cli_yaml_scalar(out, j);
        fputc('\n', out);
    }
}

void cli_print_yaml(FILE *out, const json_t *j)
{
    if (!cli_yaml_is_block(j)) {
        cli_yaml_value(out, j, 0);
        return;
    }
    cli_yaml_node(out, j, 0, false);
}
