/* cli.h - the `kiln` command-line client: subcommands that talk to kilnd's REST API (httpc/ +
 * jansson) and print readable tables, plus what the tests check without a server: the pure
 * formatting helpers (on canned JSON), option parsing, and the config file of saved logins.
 * It is a client only: it never touches the database or the agents; the only state it keeps
 * between runs is that config file ($XDG_CONFIG_HOME/kiln/config.json, written by kiln login). */
#ifndef KILN_CLI_H
#define KILN_CLI_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/base.h"

#define CLI_VERSION KILN_VERSION
/* kilnd serves REST over TLS on 127.0.0.1:8080 unless told otherwise (README). */
#define CLI_DEFAULT_URL "https://127.0.0.1:8080"

/* Exit statuses of `kiln`, by kind of failure, so that a script can tell them apart (the help's
 * "exit status" lines and the README list them; cli_exit_code maps a failure to one). */
enum {
    CLI_EXIT_OK = 0,
    CLI_EXIT_ERROR = 1,       /* anything else: refused input, a server error, a job that FAILED */
    CLI_EXIT_USAGE = 2,       /* the command line is wrong */
    CLI_EXIT_NOT_FOUND = 3,   /* no such job, worker, queue, profile, ... (HTTP 404) */
    CLI_EXIT_AUTH = 4,        /* unauthenticated or forbidden (HTTP 401, 403) */
    CLI_EXIT_CONFLICT = 5,    /* conflict or wrong state: it exists, it has not ended, ... (HTTP 409) */
    CLI_EXIT_UNAVAILABLE = 6  /* kilnd unreachable, unavailable, timed out or asking to wait (429, 502-504) */
};
/* The exit status for a failure of kiln status st (KILN_E*): the one place that maps them. */
int cli_exit_code(int st);

/* Runs `kiln` with argv (argv[0] is the program name): parses the global options (--url,
 * --tls-ca, --profile, --token-file, --json, --help), resolves where kilnd is and which token to
 * send (cli_settings_resolve), dispatches the subcommand, prints to stdout/stderr. Returns the
 * process exit status (CLI_EXIT_*). Not thread-safe (uses stdio and the environment). */
int cli_main(int argc, char **argv);

/* ---- global options, settings and the config file -------------------------------------------- */

/* The global options as given on the command line; NULL / false when absent. The strings point
 * into argv. */
typedef struct cli_globals {
    const char *url;          /* --url URL */
    const char *tls_ca;       /* --tls-ca FILE */
    const char *profile;      /* --profile NAME */
    const char *token_file;   /* --token-file FILE (a token is never taken as an argument) */
    const char *output;       /* -o / --output FORMAT: table (default), wide, json, yaml, name; --json is -o json */
    bool no_headers;          /* --no-headers: tables without their heading line */
} cli_globals_t;

/* How replies are printed: tables, wider tables, or the API's replies as JSON or YAML. */
typedef enum { CLI_OUT_TABLE, CLI_OUT_WIDE, CLI_OUT_JSON, CLI_OUT_YAML, CLI_OUT_NAME } cli_output_t;
/* Parses a -o value; false for an unknown one. */
bool cli_output_parse(const char *s, cli_output_t *out);
/* Prints j as YAML 1.2 (block style; strings double-quoted as JSON writes them). */
void cli_print_yaml(FILE *out, const json_t *j);

/* Takes the global options out of argv[1..argc) (they may stand before or after the command,
 * up to a "--") into *g and copies the other arguments, in order, to args (room for argc
 * entries; OUT) with their count in *nargs. Returns 0, or CLI_EXIT_USAGE after printing the
 * usage error (a missing value, or "--token", which is refused: other users can read a process's
 * arguments). */
int cli_parse_globals(int argc, char **argv, cli_globals_t *g, char **args, int *nargs);

/* Where a setting came from, strongest first. */
typedef enum {
    CLI_FROM_NONE = 0,   /* not set (no token) */
    CLI_FROM_FLAG,       /* --url, --token-file, --tls-ca */
    CLI_FROM_ENV,        /* KILN_URL, KILN_TOKEN, KILN_TLS_CA */
    CLI_FROM_PROFILE,    /* the selected profile of the config file */
    CLI_FROM_DEFAULT     /* CLI_DEFAULT_URL */
} cli_source_t;

/* What the client talks to and with: each of url, token and CA from the first of flags,
 * environment and the selected profile that has it. A profile is bound to its URL: its token
 * and CA are used only for that URL (normalised), never sent to another kilnd named by --url or
 * KILN_URL. */
typedef struct cli_settings {
    char url[1024];            /* normalised (cli_url_normalize) */
    char token[512];           /* "" when none; a secret: never printed */
    char ca_file[1024];        /* "" for the system's CAs */
    cli_source_t url_from, token_from, ca_from;
    char token_file[1024];     /* --token-file, when the token came from it */
    char profile[64];          /* the selected profile ("" when the config file was not read) */
    bool profile_chosen;       /* selected by --profile or KILN_PROFILE, not by "current" */
    bool profile_exists;       /* the config file holds it */
    bool profile_other_url;    /* it exists, but for profile_url, not for url: not used */
    char profile_url[1024];
    char config_path[1024];    /* "" when the config file was not needed */
} cli_settings_t;

/* Fills *s (OUT) from g, the environment (KILN_URL, KILN_TOKEN, KILN_TLS_CA, KILN_PROFILE) and,
 * unless flags and environment give all three settings and no profile is named, the config
 * file (cli_config_path, cli_config_load). The profile is --profile, else KILN_PROFILE, else the
 * file's "current", else "default"; a named profile the file lacks is not an error here
 * (s->profile_exists says). Returns 0, or the error of reading --token-file or the config file
 * (err filled; never with a token's text in it). */
int cli_settings_resolve(const cli_globals_t *g, cli_settings_t *s, kiln_err_t *err);

/* Writes url normalised into out: a bare "host:port" gets "https://", trailing slashes go.
 * Returns out ("" for NULL or ""). */
char *cli_url_normalize(const char *url, char *out, size_t n);

/* The config file's path: $XDG_CONFIG_HOME/kiln/config.json when XDG_CONFIG_HOME is an absolute
 * path, else $HOME/.config/kiln/config.json. Returns 0 or KILN_EINVAL when neither is known. */
int cli_config_path(char *out, size_t n, kiln_err_t *err);

/* Reads the config file at path into *out (OUT; caller owns, json_decref): an object with a
 * "profiles" object (added when absent) and optionally "current". A missing file gives
 * {"profiles": {}}. Refused (KILN_EPERM) when group or others have any permission on the file,
 * since it holds tokens; KILN_EINVAL when it is not such JSON (the message gives line and column,
 * never the text); KILN_EIO when it cannot be read. */
int cli_config_load(const char *path, json_t **out, kiln_err_t *err);

/* Writes cfg to path atomically (a temporary file renamed over it) with mode 0600, creating
 * missing directories with mode 0700. Returns 0 or KILN_EIO / KILN_ENOMEM. */
int cli_config_save(const char *path, const json_t *cfg, kiln_err_t *err);

/* Takes a token out of text (what a token file or stdin held): surrounding white space is
 * dropped; what remains must be 1 to 256 printable characters without spaces. what names the
 * source in errors ("stdin", "token file \"F\""), which never quote the text. Returns 0 or
 * KILN_EINVAL. */
int cli_token_parse(const char *text, const char *what, char *out, size_t n, kiln_err_t *err);

/* After a 401 from kilnd: says which token was sent (from --token-file, KILN_TOKEN, a profile, or
 * none) and how to get a valid one (kiln login). Never prints the token. */
void cli_print_auth_note(FILE *out, const cli_settings_t *s);

/* Parses a lifetime: a whole number with an optional unit, s (the default), m, h or d ("30d",
 * "12h", "3600s"). False for anything else, for 0 and for more than 100 years. */
bool cli_parse_duration(const char *s, int64_t *seconds);

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
/* An RFC 3339 time ("2026-11-21T06:04:37.123Z") as "2026-11-21 06:04:37" (UTC); "-" when it is
 * absent or malformed. Returns buf (n >= 24). */
char *cli_fmt_time(const char *rfc3339, char *buf, size_t n);
/* First 8 characters of a job id (the short id shown in tables). Returns buf (n >= 9). */
char *cli_short_id(const char *id, char *buf, size_t n);

/* Prints a table of jobs (the "jobs" array of a GET /v1/jobs reply): ID, NAME, STATE, STEP,
 * LOSS, AGE, DURATION. now_us is the current time (ages are relative to it). */
void cli_print_jobs(FILE *out, const json_t *jobs, int64_t now_us, bool wide);
/* Prints one job (a Job object) and its events ({"events": [...]}; may be NULL) as `describe`
 * shows them. */
void cli_print_job(FILE *out, const json_t *job, const json_t *events, int64_t now_us);
/* Prints the metrics summary table of a GET /v1/jobs/{id}/metrics reply. */
void cli_print_metrics(FILE *out, const json_t *reply, int spark_width);
/* Prints "step,value" rows (with a header) of every series in the reply; with several series a
 * leading name column. */
void cli_print_metrics_raw(FILE *out, const json_t *reply);
/* Prints the workers table of a GET /v1/workers reply. */
void cli_print_workers(FILE *out, const json_t *reply, int64_t now_us, bool wide);
/* GET /v1/join-tokens and GET /v1/worker-bans as tables (cmd_trust.c). */
void cli_print_join_tokens(FILE *out, const json_t *reply, int64_t now_us);
void cli_print_worker_bans(FILE *out, const json_t *reply);
/* A byte count for people: "512 B", "1.5 KiB", "137 KiB", "2.0 GiB". Returns buf (n >= 16). */
char *cli_fmt_bytes(double bytes, char *buf, size_t n);
/* Prints the table of a GET /v1/jobs/{id}/artifacts reply: NAME, SIZE, SHA256 (its first 16
 * digits), ATTEMPT, CREATED; wide (-o wide) adds BYTES and shows the whole SHA-256. */
void cli_print_artifacts(FILE *out, const json_t *reply, bool wide);
/* A job's synced checkpoint directory (GET /v1/jobs/{id}/checkpoints): when, then its files. */
void cli_print_checkpoints(FILE *out, const json_t *reply, bool wide);
/* Prints one log line object as "[rank N] line" ("[rank N, attempt A] line" for attempts > 1). */
void cli_print_log_line(FILE *out, const json_t *line);
/* A stream (caller owns; fclose it) that writes what it is given on to dst (borrowed; it must
 * outlive the stream) with every terminal control character (kiln_text_control: ESC, BEL, CR,
 * other C0 and C1 codes, DEL, bidirectional overrides) written as the visible escape \uXXXX and
 * any byte that is not UTF-8 as \xHH; newline and tab pass. Text JSON already escapes stays the
 * same JSON. mode: the stream's buffering (_IOFBF, _IOLBF, _IONBF); each write it passes on is
 * flushed to dst. NULL when out of memory. */
FILE *cli_term_open(FILE *dst, int mode);
/* Identity replies (GET /v1/whoami, /v1/users, /v1/users/{name}/tokens, /v1/projects,
 * /v1/projects/{p}/members). whoami: login_from says where the token came from ("" to leave the
 * line out). tokens: each with its kind, state and lineage (CREATED-BY, PARENT; "-" for none).
 * projects: roles is a whoami reply (may be NULL) giving the caller's role where the list has
 * none (a cluster admin's listing). */
void cli_print_whoami(FILE *out, const json_t *reply, const char *url, const char *login_from);
void cli_print_users(FILE *out, const json_t *reply);
void cli_print_tokens(FILE *out, const json_t *reply, int64_t now_us);
/* After a revocation (a DELETE /v1/tokens/{id} reply): the line saying how many tokens made with
 * it were revoked too; nothing when none were. */
void cli_print_also_revoked(FILE *out, const json_t *reply);
void cli_print_projects(FILE *out, const json_t *reply, const json_t *roles);
void cli_print_members(FILE *out, const json_t *reply);
/* Prints the jobs of a search reply (its "jobs" array): ID, NAME, STATE, AGE, then every key of
 * the jobs' "columns" in the order it first appears ("-" where a job has no value). */
void cli_print_search(FILE *out, const json_t *jobs, int64_t now_us, bool wide);
/* One series of a chart: n points (steps[i], values[i]); non-finite values are skipped. */
typedef struct cli_series {
    const double *steps, *values;
    size_t n;
} cli_series_t;
/* Draws the series on shared axes in a width x height grid of characters: series i is marked
 * '1' + i (then 'a'...), cells two series share '*'; the value range is labelled on the left
 * and the step range below. */
void cli_print_chart(FILE *out, const char *title, const cli_series_t *series, int nseries, int width,
                     int height);
/* Prints jobs (Job objects with "summaries", as GET /v1/jobs/{id} returns them) side by side:
 * name, state, project, every hyperparameter and model field, and the min (@ its step), max,
 * last and count of metrics[0..nmetrics) (every metric any job reported when nmetrics is 0);
 * rows whose values differ are marked with '*'. */
void cli_print_compare(FILE *out, const json_t *jobs, const char *const *metrics, int nmetrics);
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
