/* cmd_logs.c - `kiln logs`: a job's log history, and with -f the live Server-Sent Events stream
 * until the job ends, reconnecting (with Last-Event-ID) when the connection drops mid-job. */
#include "cli/cli_int.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Turns "30s", "5m", "2h", "1d" into an RFC 3339 time that far back; other text is passed on
 * unchanged (kilnd parses RFC 3339 and Unix seconds). buf >= 40 bytes. */
static const char *cli_since_arg(const char *since, char *buf, size_t n)
{
    char *end;
    double v = strtod(since, &end);
    if (end == since || end[0] == '\0' || end[1] != '\0' || v < 0)
        return since;
    double mul;
    switch (tolower((unsigned char)*end)) {
    case 's': mul = 1; break;
    case 'm': mul = 60; break;
    case 'h': mul = 3600; break;
    case 'd': mul = 86400; break;
    default: return since;
    }
    return kiln_time_format(kiln_now_us() - (int64_t)(v * mul * 1e6), buf, n);
}

/* Prints history lines with seq > *last_seq; pages until a short page. rank -1: all. */
static int cli_logs_history(const cli_client_t *c, const char *id, int rank, const char *since, long limit,
                            int64_t *last_seq, kiln_err_t *err)
{
    long printed = 0;
    for (;;) {
        long want = limit > 0 ? KILN_MIN(1000, limit - printed) : 1000;
        if (want <= 0)
            return 0;
        char path[200], num[32];
        snprintf(path, sizeof(path), "/v1/jobs/%s/logs", id);
        char *p = strdup(path);
        int rc = p ? 0 : KILN_ENOMEM;
        snprintf(num, sizeof(num), "%ld", want);
        if (!rc)
            rc = cli_path_add(&p, "limit", num);
        if (!rc && rank >= 0) {
            snprintf(num, sizeof(num), "%d", rank);
            rc = cli_path_add(&p, "rank", num);
        }
        if (!rc && since && *last_seq == 0)
            rc = cli_path_add(&p, "since", since);
        if (!rc && *last_seq > 0) {
            snprintf(num, sizeof(num), "%lld", (long long)*last_seq);
            rc = cli_path_add(&p, "after_seq", num);
        }
        if (rc) {
            free(p);
            return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        }
        json_t *reply = NULL;
        rc = cli_request(c, "GET", p, NULL, NULL, NULL, &reply, err);
        free(p);
        if (rc)
            return rc;
        json_t *lines = json_object_get(reply, "lines");
        size_t i, fresh = 0;
        json_t *l;
        json_array_foreach(lines, i, l) {
            double seq = cli_jnum(l, "seq");
            if (!isnan(seq) && (int64_t)seq <= *last_seq)
                continue; /* already shown (a server that ignored after_seq) */
            cli_print_log_line(stdout, l);
            fresh++;
            printed++;
            if (!isnan(seq))
                *last_seq = (int64_t)seq;
        }
        size_t got = json_array_size(lines);
        json_decref(reply);
        if (got < (size_t)want || fresh == 0)
            return 0;
    }
}

typedef struct cli_follow {
    int64_t last_seq;
    bool ended;
    char state[32];
    char reason[512];
} cli_follow_t;

static int cli_follow_event(void *ud, const char *event, const char *data, const char *id)
{
    cli_follow_t *f = ud;
    (void)id;
    json_t *j = json_loads(data, 0, NULL);
    if (!strcmp(event, "end")) {
        f->ended = true;
        kiln_strlcpy(f->state, cli_jstr(j, "state"), sizeof(f->state));
        kiln_strlcpy(f->reason, cli_jstr(j, "reason"), sizeof(f->reason));
        json_decref(j);
        return 1;
    }
    if ((!strcmp(event, "log") || !strcmp(event, "message")) && json_is_object(j)) {
        double seq = cli_jnum(j, "seq");
        if (isnan(seq) || (int64_t)seq > f->last_seq) {
            cli_print_log_line(stdout, j);
            fflush(stdout);
            if (!isnan(seq))
                f->last_seq = (int64_t)seq;
        }
    }
    json_decref(j);
    return 0;
}

static int cli_job_state(const cli_client_t *c, const char *id, char *state, size_t n, char *reason, size_t rn,
                         kiln_err_t *err)
{
    char path[160];
    json_t *job = NULL;
    snprintf(path, sizeof(path), "/v1/jobs/%s", id);
    int rc = cli_request(c, "GET", path, NULL, NULL, NULL, &job, err);
    if (rc)
        return rc;
    kiln_strlcpy(state, cli_jstr(job, "state"), n);
    kiln_strlcpy(reason, cli_jstr(job, "reason"), rn);
    json_decref(job);
    return 0;
}

int cli_follow_logs(const cli_client_t *c, const char *job_id, int rank, const char *since,
                    char *final_state, kiln_err_t *err)
{
    cli_follow_t f = {0};
    int rc = 0;
    double backoff = 0.2, failing_since = 0;
    final_state[0] = '\0';
    for (;;) {
        char path[256], num[32], hdr[64];
        const char *headers[2] = {NULL, NULL};
        snprintf(path, sizeof(path), "/v1/jobs/%s/logs?follow=true", job_id);
        char *p = strdup(path);
        if (p && rank >= 0) {
            snprintf(num, sizeof(num), "%d", rank);
            cli_path_add(&p, "rank", num);
        }
        if (p && since && f.last_seq == 0)
            cli_path_add(&p, "since", since);
        if (!p)
            return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        if (f.last_seq > 0) {
            snprintf(hdr, sizeof(hdr), "Last-Event-ID: %lld", (long long)f.last_seq);
            headers[0] = hdr;
        }
        cli_sse_t sse;
        cli_sse_init(&sse, cli_follow_event, &f);
        kiln_err_t serr;
        kiln_err_clear(&serr);
        rc = cli_stream(c, p, headers, &sse, 45, &serr);
        cli_sse_deinit(&sse);
        free(p);
        if (f.ended)
            break;
        if (rc != 0 && rc != KILN_ECOMM) {
            *err = serr; /* an API error (unknown job, bad rank): no point retrying */
            return rc;
        }
        /* The stream closed or dropped before the end event: is the job over? */
        char st[32] = "", reason[512] = "";
        kiln_err_t jerr;
        kiln_err_clear(&jerr);
        int jr = cli_job_state(c, job_id, st, sizeof(st), reason, sizeof(reason), &jerr);
        if (jr == 0 && cli_state_terminal(st)) {
            /* Whatever was written after our last line, then the end. */
            if (cli_logs_history(c, job_id, rank, since, 0, &f.last_seq, err) != 0)
                return err->status;
            f.ended = true;
            kiln_strlcpy(f.state, st, sizeof(f.state));
            kiln_strlcpy(f.reason, reason, sizeof(f.reason));
            break;
        }
        if (jr != 0 && jr != KILN_EUNAVAIL && jr != KILN_ETIMEDOUT) {
            *err = jerr;
            return jr;
        }
        double now = kiln_mono_s();
        if (rc == 0)
            failing_since = 0; /* it did connect; only consecutive failures count */
        else if (failing_since == 0)
            failing_since = now;
        if (failing_since > 0 && now - failing_since > 120) {
            *err = rc ? serr : jerr;
            if (!*err->message)
                kiln_err_set(err, KILN_ECOMM, NULL, "lost the log stream of job %s and could not get it back", job_id);
            return KILN_ECOMM;
        }
        fprintf(stderr, "kiln: log stream interrupted (%s); reconnecting\n",
                rc ? serr.message : "closed before the job ended");
        usleep((useconds_t)(backoff * 1e6));
        backoff = KILN_MIN(backoff * 2, 5.0);
    }
    kiln_strlcpy(final_state, f.state, 32);
    fprintf(stderr, "job %.8s %s%s%s\n", job_id, *f.state ? f.state : "ended", *f.reason ? ": " : "", f.reason);
    return 0;
}

int cli_cmd_logs(cli_client_t *c, int argc, char **argv)
{
    const char *ref = NULL, *since = NULL, *v;
    bool follow = false;
    long rank = -1, limit = 0;
    for (int i = 1; i < argc; i++) {
        int m;
        if ((m = cli_opt("logs", argc, argv, &i, "--rank", "-r", &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            if (!cli_parse_int(v, 0, 1 << 20, &rank))
                return cli_usage_error("logs", "--rank must be a rank number from 0 to %d (got \"%s\")", 1 << 20, v);
        } else if ((m = cli_opt("logs", argc, argv, &i, "--since", NULL, &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            since = v;
        } else if ((m = cli_opt("logs", argc, argv, &i, "--limit", "-n", &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            if (!cli_parse_int(v, 1, CLI_LIMIT_MAX, &limit))
                return cli_usage_error("logs", "--limit must be between 1 and %d (got \"%s\")", CLI_LIMIT_MAX, v);
        } else if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--follow")) {
            follow = true;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error("logs", "unknown option %s", argv[i]);
        } else if (!ref) {
            ref = argv[i];
        } else {
            return cli_usage_error("logs", "unexpected argument %s", argv[i]);
        }
    }
    if (!ref)
        return cli_usage_error("logs", "missing the job id");
    char sbuf[48];
    if (since)
        since = cli_since_arg(since, sbuf, sizeof(sbuf));

    kiln_err_t err;
    kiln_err_clear(&err);
    char id[64];
    if (cli_resolve_job(c, ref, id, &err) != 0) {
        return cli_fail(c, &err);
    }
    if (follow) {
        char final_state[32];
        if (cli_follow_logs(c, id, (int)rank, since, final_state, &err) != 0) {
            return cli_fail(c, &err);
        }
        return strcmp(final_state, "FAILED") ? CLI_EXIT_OK : CLI_EXIT_ERROR;
    }
    int64_t last = 0;
    if (cli_logs_history(c, id, (int)rank, since, limit, &last, &err) != 0) {
        return cli_fail(c, &err);
    }
    return CLI_EXIT_OK;
}
