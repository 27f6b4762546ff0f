/* cli_int.h - internals shared by the cli/ files: the REST client (over httpc/) and the
 * subcommand entry points. Nothing outside cli/ includes this. */
#ifndef KILN_CLI_INT_H
#define KILN_CLI_INT_H

#include "base/api_names.h" /* the API's names the help and hints list */
#include "base/job_states.h" /* which states are terminal (cli_state_terminal, kiln delete's help) */
#include "cli/cli.h"

typedef struct cli_client {
    cli_settings_t settings; /* url (no trailing slash), the token sent as "Authorization: Bearer"
                                ("" for none), the CA an https kilnd is verified against ("" for
                                the system's), and where each came from */
    long timeout_ms;         /* bound for one non-streaming request */
    bool json;               /* -o json|yaml (or --json): print the API's replies instead of tables */
    cli_output_t output;     /* which of table, wide, json, yaml */
    FILE *data_out;          /* stdout as it is, for bytes that are data (a download to "-"); stdout
                                itself escapes terminal controls (cli_term_open). Borrowed. */
} cli_client_t;


/* Sets up a client with the resolved settings s (copied). */
void cli_client_init(cli_client_t *c, const cli_settings_t *s);

/* One request to kilnd. path starts with "/" and may carry a query string. body may be NULL.
 * headers is NULL or a NULL-terminated list of "Name: value". On a 2xx reply returns 0, sets
 * *http_status (may be NULL) and *out (OUT; caller owns, json_decref; a non-JSON or empty body
 * gives an empty object). On an API error returns the matching KILN_E* with err filled from the
 * reply; when kilnd cannot be reached returns KILN_EUNAVAIL with the "could not connect" message. */
int cli_request(const cli_client_t *c, const char *method, const char *path, const json_t *body,
                const char *const *headers, long *http_status, json_t **out, kiln_err_t *err);

/* POSTs the file in (len bytes from its current offset) to path as the body, of content_type,
 * without a time limit (a transfer that stalls for a minute is given up). Replies as cli_request. */
int cli_upload(const cli_client_t *c, const char *path, FILE *in, int64_t len, const char *content_type,
               long *http_status, json_t **out, kiln_err_t *err);

/* Streams GET path as Server-Sent Events into sse until the server closes the stream or the
 * parser's callback stops it. low_speed_s: a connection that delivers nothing for that long is
 * treated as dropped (kilnd pings every 15 s). Returns 0 when the stream ended (closed by the
 * server or stopped by the callback), KILN_ECOMM when the connection dropped or could not be
 * made (err says why), or the API error for a non-200 reply. */
int cli_stream(const cli_client_t *c, const char *path, const char *const *headers, cli_sse_t *sse,
               long low_speed_s, kiln_err_t *err);

/* Downloads GET path into out as it arrives (never the whole body in memory), hashing what it
 * writes into *sha (initialised by the caller). On 200 returns 0 with *bytes (OUT) written and
 * etag (ETag without its quotes, or ""; 80 bytes) filled; an API error's status with err filled
 * from the reply; KILN_EUNAVAIL / KILN_ECOMM when kilnd cannot be reached or the transfer
 * breaks; KILN_EIO when out cannot be written. */
int cli_download(const cli_client_t *c, const char *path, FILE *out, kiln_sha256_t *sha, int64_t *bytes,
                 char *etag, kiln_err_t *err);

/* Appends "&key=value" (or "?key=value" for the first) to path (a heap string, may be
 * reallocated), URL-escaping value. Returns 0 or KILN_ENOMEM. */
int cli_path_add(char **path, const char *key, const char *value);
/* One page of a paged list (jobs, tuning jobs): the request for up to page_size items after token
 * (NULL: the first page) into *page (caller frees). Returns 0 or a request error. */
typedef int (*cli_page_fn)(const cli_client_t *c, long page_size, const char *token, void *ud, json_t **page,
                           kiln_err_t *err);
/* Collects the items of a paged list (each page's array `key`, its next_page_token) page by page
 * through fetch (page_size each, fewer for the last of limit) until limit items (all: every one)
 * into *out (a JSON array; caller frees); *more: the server has more than limit. Returns 0 or the
 * failed page's error (*out is NULL then). */
int cli_collect_pages(const cli_client_t *c, cli_page_fn fetch, void *ud, const char *key, long page_size, long limit,
                      bool all, json_t **out, bool *more, kiln_err_t *err);
/* URL-escapes s, an argument of command cmd that names something (an id, a name), as one path
 * segment into out. Every command builds its paths' segments here, so an argument that cannot be
 * one (empty, "." or "..", which URLs drop, or too long to fit out) is a usage error before any
 * request. Returns 0, or CLI_EXIT_USAGE after printing the usage error (CLI_EXIT_ERROR: no
 * memory). */
int cli_path_segment(const char *cmd, const char *s, char *out, size_t n);

/* Whether s could be (a prefix of) an id: hex digits, and dashes where a UUID has them. The job and
 * tuning job references read a whole id (36 characters) shaped so as an id, anything else as an id
 * prefix or a name. */
bool cli_id_shaped(const char *s);

/* Resolves a job reference (a full id, a unique id prefix, or a unique job name) to a full id.
 * out must hold 64 bytes. Returns 0, KILN_ENOTFOUND, KILN_EINVAL (ambiguous) or a request error. */
int cli_resolve_job(const cli_client_t *c, const char *ref, char *out, kiln_err_t *err);

/* json helpers tolerant of missing keys: "" / 0 / NAN when absent or of another type. */
const char *cli_jstr(const json_t *obj, const char *key);
double cli_jnum(const json_t *obj, const char *key);
/* A whole number of obj (a step, a count) as decimal text into buf (n bytes): a JSON integer as
 * the integer it is (no trip through a double, which would show INT64_MAX as ...808), a real as
 * %.0f, or dflt when key is absent or not a number. Returns buf. */
const char *cli_jint_text(const json_t *obj, const char *key, const char *dflt, char *buf, size_t n);
/* Parses an RFC 3339 field of obj; 0 when absent or malformed. */
int64_t cli_jtime(const json_t *obj, const char *key);

/* Which subcommand argv names: argv[1] when it is one of names, else the first of names (the
 * listing) when argv[1] is absent or an option. Sets *first to the index of the first argument
 * after it. Returns NULL after a usage error. */
const char *cli_subcommand(const char *cmd, int argc, char **argv, const char *const *names, int *first);
/* Collects the positional arguments argv[first..argc) into pos (at most max, each the caller's
 * count); options other than those the caller handles are usage errors. Returns the count, or -1
 * after a usage error. */
int cli_positional(const char *cmd, int argc, char **argv, int first, const char **pos, int max);
/* One request whose reply is printed raw with --json, else by show (may be NULL: nothing). */
typedef void (*cli_show_fn)(const cli_client_t *c, const json_t *reply);
int cli_call_show(const cli_client_t *c, const char *method, const char *path, const json_t *body, cli_show_fn show);

/* Reads a request file (path; "-": stdin) that must hold one JSON object, what it is in words
 * ("a job spec"), into *out (OUT; caller owns). Returns 0, KILN_ENOTFOUND / KILN_EIO for a file
 * that cannot be read, or KILN_EINVAL naming the file, line and column of a syntax error or of a
 * key given twice (kilnd refuses those too; sent on, the last would win unseen). kiln submit and
 * kiln tune submit read their files here. */
int cli_read_request(const char *path, const char *what, json_t **out, kiln_err_t *err);
/* A relative data.train / data.val of spec that exists here is made absolute (in place), so that
 * an agent finds it whatever its own working directory is; anything else is left as is. */
void cli_absolutize_data(json_t *spec);
/* --source-dir: packs and uploads dir into spec's project (cli_code_push) and sets spec's
 * "source" to it. KILN_EINVAL (field --source-dir) when spec names no entry_point or names a
 * source already; else cli_code_push's status. */
int cli_source_dir(cli_client_t *c, json_t *spec, const char *dir, kiln_err_t *err);

/* Subcommands: argc/argv start at the subcommand name. Return CLI_EXIT_*. */
int cli_cmd_submit(cli_client_t *c, int argc, char **argv);
int cli_cmd_jobs(cli_client_t *c, int argc, char **argv);
int cli_cmd_describe(cli_client_t *c, int argc, char **argv);
int cli_cmd_stop(cli_client_t *c, int argc, char **argv);
int cli_cmd_logs(cli_client_t *c, int argc, char **argv);
int cli_cmd_metrics(cli_client_t *c, int argc, char **argv);
int cli_cmd_workers(cli_client_t *c, int argc, char **argv);
int cli_cmd_join_tokens(cli_client_t *c, int argc, char **argv);
int cli_cmd_version(cli_client_t *c, int argc, char **argv);
int cli_cmd_completion(cli_client_t *c, int argc, char **argv);
int cli_cmd_login(cli_client_t *c, int argc, char **argv);
int cli_cmd_logout(cli_client_t *c, int argc, char **argv);
int cli_cmd_whoami(cli_client_t *c, int argc, char **argv);
int cli_cmd_users(cli_client_t *c, int argc, char **argv);
int cli_cmd_tokens(cli_client_t *c, int argc, char **argv);
int cli_cmd_projects(cli_client_t *c, int argc, char **argv);
int cli_cmd_queues(cli_client_t *c, int argc, char **argv);
int cli_cmd_tune(cli_client_t *c, int argc, char **argv);
int cli_cmd_artifacts(cli_client_t *c, int argc, char **argv);
int cli_cmd_delete(cli_client_t *c, int argc, char **argv);
int cli_cmd_search(cli_client_t *c, int argc, char **argv);
int cli_cmd_compare(cli_client_t *c, int argc, char **argv);
int cli_cmd_ui(cli_client_t *c, int argc, char **argv);
int cli_cmd_code(cli_client_t *c, int argc, char **argv);
int cli_cmd_config(cli_client_t *c, int argc, char **argv);
/* Packs dir (honouring its .kilnignore) and uploads it into project (NULL: "default"); the source
 * a script job names ("code:sha256:...") into source (100 bytes). Prints what was packed and
 * sent on stderr. Returns 0 or a status with err. */
int cli_code_push(cli_client_t *c, const char *dir, const char *project, char *source, kiln_err_t *err);
/* Downloads GET path into file ("-": stdout) through a temporary file beside it, checking the
 * bytes against the ETag kilnd sends (their SHA-256); label names it in messages. Prints what
 * was saved on stderr. Returns a CLI exit status. */
int cli_download_checked(cli_client_t *c, const char *path, const char *label, const char *file);

/* Prints err to stderr (cli_print_error) and, for a 401, which token was sent and how to get a
 * valid one (cli_print_auth_note). Returns CLI_EXIT_ERROR. */
int cli_fail(const cli_client_t *c, const kiln_err_t *err);
/* Says where the token in s came from, for people: "KILN_TOKEN", "--token-file F", "profile
 * \"NAME\" (PATH)" or "none". Returns buf. */
char *cli_token_source(const cli_settings_t *s, char *buf, size_t n);
/* Prints the API reply j on stdout as -o asked: indented JSON, or YAML. */
void cli_print_out(const cli_client_t *c, const json_t *j);
/* Overwrites the string member key of reply (a secret kilnd showed once) once it is printed. */
void cli_secret_forget(json_t *reply, const char *key);

/* Follows a job's logs (history, then live) until the job ends, printing each line to stdout;
 * reconnects with Last-Event-ID when the connection drops while the job runs. rank -1: every
 * rank; since NULL: from the start. On return *final_state holds the job's end state ("" when
 * unknown; 32 bytes). Returns 0 or an error (err filled). */
int cli_follow_logs(const cli_client_t *c, const char *job_id, int rank, const char *since,
                    char *final_state, kiln_err_t *err);

/* Prints a usage error ("kiln CMD: msg" and the usage line) to stderr; returns CLI_EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints the help text of a subcommand (or the overview for NULL / unknown) to out. */
void cli_print_help(FILE *out, const char *cmd);
/* Matches argv[*i] against an option that takes a value: "--name V", "--name=V" or, when shrt is
 * non-NULL, "-n V". Returns 1 with *val set (and *i advanced past the value), 0 when argv[*i] is
 * something else, -1 when the value is missing (the usage error is printed). */
int cli_opt(const char *cmd, int argc, char **argv, int *i, const char *lng, const char *shrt,
            const char **val);
/* The paging options of a command that lists jobs: --limit/-n N, --page-size N (1..500),
 * --all/-a. Returns 1 when argv[*i] was one (its value taken), 0 when it is something else, -1
 * on a usage error (printed). */
int cli_paging_opt(const char *cmd, int argc, char **argv, int *i, long *limit, long *page_size, bool *all);
/* Parses an integer option value; false when it is not a whole number in [lo, hi]. */
bool cli_parse_int(const char *s, long lo, long hi, long *out);
/* The most a --limit takes (kiln jobs, search, logs, ...): its usage error names the range. */
#define CLI_LIMIT_MAX 100000000
/* ---- tables (format.c), for the printers of format.c and compare.c ---- */
#define CLI_TABLE_MAXCOLS 16
typedef struct cli_table {
    int ncols;
    char names[CLI_TABLE_MAXCOLS][64];     /* header texts */
    const char *head[CLI_TABLE_MAXCOLS];   /* what is printed: names[c] unless replaced */
    bool right[CLI_TABLE_MAXCOLS];
    char **cells;          /* nrows * ncols heap strings */
    size_t nrows, cap;
} cli_table_t;
/* spec: "ID NAME >STEP": a leading '>' right-aligns the column. */
void cli_table_init(cli_table_t *t, const char *spec);
/* Adds a column (a header that may hold spaces); at most CLI_TABLE_MAXCOLS. */
void cli_table_col(cli_table_t *t, const char *name, bool right);
/* Adds a row; takes copies of the ncols strings (NULL or "" shows as "-"). */
void cli_table_row(cli_table_t *t, const char *const *vals);
/* Prints the table with its header and frees its rows (plain, or indented by two spaces). */
void cli_table_print(FILE *out, cli_table_t *t);
/* Whether tables print their heading line (--no-headers turns it off for the whole run). Not
 * thread-safe, like the rest of the CLI. */
void cli_table_set_headers(bool on);
bool cli_table_headers(void);
/* With -o name: prints the member key of each object of items (a JSON array), one a line, and
 * returns true; returns false (printing nothing) for every other output format. */
bool cli_print_names(const cli_client_t *c, const json_t *items, const char *key);
void cli_table_print_indented(FILE *out, cli_table_t *t);
/* Display width of UTF-8 text (cells per code point), and s cut to max cells with an ellipsis. */
size_t cli_width(const char *s);
char *cli_clip(const char *s, size_t max, char *buf, size_t n);

/* Whether state names a terminal job state (kind ENDED in base/job_states.h); false for NULL. */
bool cli_state_terminal(const char *state);

#endif /* KILN_CLI_INT_H */
