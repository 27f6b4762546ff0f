/* cli.h - the `kiln` command-line client: subcommands that talk to kilnd's REST API (libcurl +
 * jansson) and print readable tables, plus the pure formatting helpers they use (exposed so the
 * tests can check output on canned JSON). It is a client only: it never touches the database or
 * the agents, and it keeps no state between runs. */
#ifndef KILN_CLI_H
#define KILN_CLI_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/base.h"

#define CLI_VERSION "0.1.0"
#define CLI_DEFAULT_URL "http://127.0.0.1:8080"

/* Exit statuses of `kiln`. */
enum { CLI_EXIT_OK = 0, CLI_EXIT_ERROR = 1, CLI_EXIT_USAGE = 2 };

/* Runs `kiln` with argv (argv[0] is the program name): parses the global options (--url, --json,
 * --help), dispatches the subcommand, prints to stdout/stderr. Returns the process exit status
 * (CLI_EXIT_*). Not thread-safe (uses stdio and libcurl's global init). */
int cli_main(int argc, char **argv);

/* ---- formatting helpers (no I/O besides the FILE * they are given) ------------------------ */

/* Writes a human duration ("45s", "3m12s", "2h05m", "3d04h"); negative counts as 0.
 * Returns buf. n >= 16 is always enough. */
char *cli_fmt_duration(double seconds, char *buf, size_t n);
/* Formats a metric value compactly: 4 significant digits for |v| < 1e5 ("2.413", "0.0003"),
 * scientific beyond, "-" for NaN. Returns buf (n >= 24). */
char *cli_fmt_value(double v, char *buf, size_t n);
/* Renders values as a sparkline of at most width cells (U+2581..U+2588), averaging values into
 * buckets when there are more values than cells. buf receives UTF-8 (3 bytes a cell; n >=
 * 3 * width + 1). Constant series draw at mid height. Returns buf ("" when count is 0). */
char *cli_sparkline(const double *values, size_t count, int width, char *buf, size_t n);
/* First 8 characters of a job id (the short id shown in tables). Returns buf (n >= 9). */
char *cli_short_id(const char *id, char *buf, size_t n);

/* Prints a table of jobs (the "jobs" array of a GET /v1/jobs reply): ID, NAME, STATE, STEP,
 * LOSS, AGE, DURATION. now_us is the current time (ages are relative to it). */
void cli_print_jobs(FILE *out, const json_t *jobs, int64_t now_us);
/* Prints one job (a Job object) and its events ({"events": [...]}; may be NULL) as `describe`
 * shows them. */
void cli_print_job(FILE *out, const json_t *job, const json_t *events, int64_t now_us);
/* Prints the metrics summary table of a GET /v1/jobs/{id}/metrics reply. */
void cli_print_metrics(FILE *out, const json_t *reply, int spark_width);
/* Prints "step,value" rows (with a header) of every series in the reply; with several series a
 * leading name column. */
void cli_print_metrics_raw(FILE *out, const json_t *reply);
/* Prints the workers table of a GET /v1/workers reply. */
void cli_print_workers(FILE *out, const json_t *reply, int64_t now_us);
/* Prints one log line object as "[rank N] line" ("[rank N, attempt A] line" for attempts > 1). */
void cli_print_log_line(FILE *out, const json_t *line);
/* Prints err as "error: FIELD: MESSAGE", then "detail: ..." and "hint: ..." lines when set. */
void cli_print_error(FILE *out, const kiln_err_t *err);
/* Fills err from an API error reply body ({code, message, detail, hint, field}) and an HTTP
 * status; a body that is not JSON becomes "kilnd answered HTTP N: <first line of the body>".
 * Returns the kiln status matching the reply's code (KILN_EINVAL for invalid_argument, ...). */
int cli_error_from_reply(int http_status, const char *body, kiln_err_t *err);

/* ---- Server-Sent Events parsing ------------------------------------------------------------- */

/* Called once per complete event. event is "message" when the stream gave no event name; id is
 * the last id seen ("" when none). Return 0 to continue, non-zero to stop the stream. */
typedef int (*cli_sse_fn)(void *ud, const char *event, const char *data, const char *id);

typedef struct cli_sse {
    char *line;             /* partial line being accumulated (heap) */
    size_t line_len, line_cap;
    char *data;             /* data of the event being built (heap) */
    size_t data_len, data_cap;
    bool has_data;
    bool skip_lf;           /* last byte was '\r': a following '\n' belongs to it */
    char event[64];
    char id[64];
    cli_sse_fn fn;
    void *ud;
    int stopped;            /* the callback's non-zero return, once it stopped the stream */
} cli_sse_t;

void cli_sse_init(cli_sse_t *p, cli_sse_fn fn, void *ud);
void cli_sse_deinit(cli_sse_t *p);
/* Feeds n bytes of the stream (any split). Returns 0, or the callback's non-zero value once it
 * asked to stop (later bytes are ignored), or KILN_ENOMEM. */
int cli_sse_feed(cli_sse_t *p, const char *bytes, size_t n);

#endif /* KILN_CLI_H */
