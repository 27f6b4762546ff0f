/* base.h - kiln's shared base module: status codes, rich errors, logging, arenas,
 * configuration flags and small time/string helpers.
 * Depends on libc (and pthreads for the log lock), PCRE2 for metric patterns and libsodium for
 * SHA-256 only; every other module may include it.
 * It is not a utility dumping ground: what only one module needs lives in that module. */
#ifndef KILN_BASE_H
#define KILN_BASE_H

#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

/* ------------------------------------------------------------------------------------------
 * Status codes: one table. Functions that can fail return int: 0 (KILN_OK) or a negative code
 * from this table. Each row: NAME, value, api code string, message, HTTP status, gRPC status.
 * ------------------------------------------------------------------------------------------ */
#define KILN_STATUS_MAP(X)                                                                  \
    X(OK,          0,   "ok",                  "ok",                              200, 0)   \
    X(EINVAL,     -1,   "invalid_argument",    "invalid argument",                400, 3)   \
    X(ENOTFOUND,  -2,   "not_found",           "not found",                       404, 5)   \
    X(EEXIST,     -3,   "already_exists",      "already exists",                  409, 6)   \
    X(ESTATE,     -4,   "failed_precondition", "operation not allowed in this state", 409, 9) \
    X(ENOMEM,     -5,   "resource_exhausted",  "out of memory",                   500, 8)   \
    X(EIO,        -6,   "io_error",            "input/output error",              500, 13)  \
    X(EDB,        -7,   "unavailable",         "database error",                  503, 14)  \
    X(EUNAVAIL,   -8,   "unavailable",         "service unavailable",             503, 14)  \
    X(ETIMEDOUT,  -9,   "deadline_exceeded",   "timed out",                       504, 4)   \
    X(ECANCELED,  -10,  "cancelled",           "cancelled",                       499, 1)   \
    X(EINTERNAL,  -11,  "internal",            "internal error",                  500, 13)  \
    X(EUNSUPP,    -12,  "unimplemented",       "not supported",                   501, 12)  \
    X(EPERM,      -13,  "permission_denied",   "permission denied",               403, 7)   \
    X(ETOOBIG,    -14,  "payload_too_large",   "request too large",               413, 3)   \
    X(EUNFIT,     -15,  "unschedulable",       "job can never fit the cluster",   422, 9)   \
    X(ECOMM,      -16,  "communication_error", "communication with a peer failed", 502, 14) \
    X(EDEVICE,    -17,  "device_error",        "device error",                    500, 13)  \
    X(EFORMAT,    -18,  "bad_format",          "malformed data",                  400, 3)   \
    X(EUNAUTH,    -19,  "unauthenticated",     "authentication required",         401, 16)  \
    X(EMEDIA,     -20,  "unsupported_media_type", "unsupported media type",       415, 3)   \
    X(ERANGE,     -21,  "range_not_satisfiable", "range not satisfiable",         416, 11)  \
    X(ECHECKSUM,  -22,  "data_loss",           "checksum mismatch",               422, 15)  \
    X(EREUSED,    -23,  "idempotency_key_reused", "idempotency key reused with a different request", 422, 6) \
    X(ELIMIT,     -24,  "resource_exhausted",  "too many requests",               429, 8)

enum {
#define KILN_STATUS_ENUM(name, val, code, msg, http, grpc) KILN_##name = (val),
    KILN_STATUS_MAP(KILN_STATUS_ENUM)
#undef KILN_STATUS_ENUM
};

/* Message for a status ("invalid argument"); unknown codes give "unknown error". Static storage. */
const char *kiln_strerror(int status);
/* API code string for a status ("invalid_argument"). Static storage. */
const char *kiln_status_code(int status);
/* HTTP status for a kiln status (500 for unknown codes). */
int kiln_status_http(int status);
/* gRPC status code for a kiln status (13 INTERNAL for unknown codes). */
int kiln_status_grpc(int status);
/* True for the gRPC codes that mean "not handled, worth sending again" (UNAVAILABLE,
 * DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, CANCELLED, UNKNOWN, INTERNAL): what kiln-agent
 * retries, and what kilnd answers for a batch's report it did not handle. */
bool kiln_grpc_retryable(int grpc_code);

/* A rich error, filled where a failure is first understood and carried up to the API edge, which
 * turns it into {code, message, detail, hint}. Caller's storage; plain fixed buffers, no heap. */
typedef struct kiln_err {
    int status;          /* KILN_E* */
    char field[128];     /* offending field as a dotted path ("hyperparameters.lr"), or "" */
    char message[256];   /* short, lower case, says what failed and why */
    char detail[512];    /* optional longer explanation */
    char hint[256];      /* optional: how to fix it */
} kiln_err_t;

void kiln_err_clear(kiln_err_t *err);
/* Sets status, field (may be NULL) and a printf-formatted message; returns status so callers can
 * write `return kiln_err_set(err, KILN_EINVAL, "model.n_head", "must divide n_embd (%d)", c);`.
 * err may be NULL (then only the status is returned). */
int kiln_err_set(kiln_err_t *err, int status, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void kiln_err_detail(kiln_err_t *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kiln_err_hint(kiln_err_t *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ------------------------------------------------------------------------------------------
 * Logging: one line per call to stderr, "2026-11-21T06:04:37.123Z INFO  kilnd: message".
 * Thread-safe. Level INFO until log_set_level(): each program's settings table has log-level
 * (KILN_LOG_LEVEL) with the choices LOG_LEVEL_CHOICES, and its main passes it to
 * log_level_parse() and log_set_level().
 * ------------------------------------------------------------------------------------------ */
typedef enum { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR } log_level_t;
#define LOG_LEVEL_CHOICES "debug|info|warn|error"

void log_init(const char *program); /* program name shown on each line */
/* "debug" | "info" | "warn" | "error" -> *out; returns 0, or KILN_EINVAL for anything else. */
int log_level_parse(const char *name, log_level_t *out);
void log_set_level(log_level_t level);
bool log_enabled(log_level_t level);
void log_write(log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void log_vwrite(log_level_t level, const char *fmt, va_list ap);
#define log_debug(...) do { if (log_enabled(LOG_DEBUG)) log_write(LOG_DEBUG, __VA_ARGS__); } while (0)
#define log_info(...)  log_write(LOG_INFO, __VA_ARGS__)
#define log_warn(...)  log_write(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_write(LOG_ERROR, __VA_ARGS__)

/* ------------------------------------------------------------------------------------------
 * Arenas: bump allocation for a request, a scheduler tick or a heartbeat. Everything allocated
 * from an arena dies with arena_reset()/arena_deinit(). Not thread-safe; one owner at a time.
 * Allocation failure aborts (an arena is for bounded, per-request memory).
 * ------------------------------------------------------------------------------------------ */
typedef struct arena_block arena_block_t;
typedef struct arena {
    arena_block_t *head;   /* current block */
    size_t block_size;     /* default size of new blocks */
} arena_t;

void arena_init(arena_t *a, size_t block_size); /* block_size 0 means 16 KiB */
void arena_deinit(arena_t *a);                  /* frees every block */
void arena_reset(arena_t *a);                   /* frees all but the first block, rewinds it */
void *arena_alloc(arena_t *a, size_t n);        /* 16-byte aligned, zeroed */
char *arena_strdup(arena_t *a, const char *s);  /* s may be NULL -> NULL */
char *arena_strndup(arena_t *a, const char *s, size_t n);
char *arena_sprintf(arena_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ------------------------------------------------------------------------------------------
 * Configuration: one table of settings per program (flag, environment variable, type, range or
 * choices, default, help), read by one strict parser. Each setting is `--name VALUE` or
 * `--name=VALUE`; when absent, the environment variable (if any) is used, then the default.
 * Booleans accept `--name` alone; lists (CONFIG_LIST) take the flag once per value. A value of
 * the wrong type, out of range or not among the choices is refused naming the flag or the
 * variable it came from. `--help` prints usage and `--print-settings` the table (one setting a
 * line, tab-separated: scripts/settings-doc.sh and tests/cmd read it); both make config_parse
 * return 1.
 * ------------------------------------------------------------------------------------------ */
typedef enum { CONFIG_STR, CONFIG_INT, CONFIG_DOUBLE, CONFIG_BOOL, CONFIG_LIST } config_type_t;

/* The value of a CONFIG_LIST flag: every `--name VALUE` in order, or, when the flag is absent,
 * the environment variable split on commas. */
#define CONFIG_LIST_MAX 32
typedef struct config_list {
    const char *v[CONFIG_LIST_MAX];
    int n;
} config_list_t;

/* What a setting's value must be beyond its type: a range [min, max] for CONFIG_INT and
 * CONFIG_DOUBLE (checked when max > min), or one of choices ("on|off") for CONFIG_STR. A
 * test_only setting is a fault-injection knob: declared only in test builds (KILN_FAULTS),
 * marked in --help and --print-settings, and left out of the README. */
typedef struct config_check {
    double min, max;
    const char *choices;
    bool test_only;
} config_check_t;
#define CONFIG_ANY                    {0, 0, NULL, false}
#define CONFIG_RANGE(lo, hi)          {(lo), (hi), NULL, false}
#define CONFIG_ONE_OF(list)           {0, 0, (list), false}
#define CONFIG_TEST_RANGE(lo, hi)     {(lo), (hi), NULL, true}
#define CONFIG_TEST                   {0, 0, NULL, true}

typedef struct config_flag {
    const char *name;      /* without dashes: "database-url" */
    const char *env;       /* "KILN_DATABASE_URL", or NULL */
    config_type_t type;
    void *value;           /* const char ** | int64_t * | double * | bool * | config_list_t *;
                              holds the default */
    config_check_t check;  /* CONFIG_ANY, CONFIG_RANGE(lo, hi), CONFIG_ONE_OF("a|b") */
    const char *help;
} config_flag_t;

/* Parses argv against flags, then the environment variables of the flags argv did not give.
 * Positional arguments (not starting with "--") are left in order in argv[0..*npos) when npos
 * is non-NULL (OUT); otherwise they are an error.
 * Returns 0, 1 when --help or --print-settings was printed (to stdout), or KILN_EINVAL with the
 * problem in err (err.field is the flag's name; the message names the flag or the variable).
 * String values point into argv or the environment (borrowed for the process lifetime). */
int config_parse(int argc, char **argv, config_flag_t *flags, size_t nflags,
                 const char *usage, int *npos, kiln_err_t *err);
void config_usage(const char *program, const char *usage, const config_flag_t *flags, size_t n);
/* The table, one setting a line: name, env (or -), type (str|int|number|bool|list), min, max
 * (- when unbounded), choices (or -), default (or -), test (1 for a test_only knob) and help,
 * separated by tabs, to out. */
void config_print_settings(FILE *out, const config_flag_t *flags, size_t n);

/* ------------------------------------------------------------------------------------------
 * Time and small helpers.
 * ------------------------------------------------------------------------------------------ */
int64_t kiln_now_us(void);        /* wall clock, microseconds since the Unix epoch */
int64_t kiln_mono_us(void);       /* monotonic clock, microseconds */
double kiln_mono_s(void);         /* monotonic clock, seconds */
struct timespec;
/* The wall-clock time ms milliseconds from now, as pthread_cond_timedwait takes its deadline. */
void kiln_deadline_in(struct timespec *ts, int64_t ms);
/* Formats a Unix time in microseconds as RFC 3339 UTC with milliseconds into buf (>= 32 bytes). */
char *kiln_time_format(int64_t us, char *buf, size_t n);
/* Parses RFC 3339 ("2026-11-21T06:04:37Z", fractional seconds and +hh:mm offsets accepted) or a
 * plain number of Unix seconds. Returns 0 or KILN_EINVAL. */
int kiln_time_parse(const char *s, int64_t *out_us);
/* Text and numbers in text (text.c). */
/* Length of the valid UTF-8 sequence at p (of n bytes left): 1 to 4, or 0 when the bytes there
 * are not one (a stray continuation byte, an overlong form such as C0 80, a surrogate, a code
 * point past U+10FFFF, a sequence cut short) or p[0] is NUL. */
size_t kiln_utf8_seq(const unsigned char *p, size_t n);
/* Offset of the first byte of s[0..n) that does not start a valid UTF-8 sequence (a NUL byte
 * counts as invalid: no text kiln stores may hold one), or n when all of it is valid. */
size_t kiln_utf8_check(const char *s, size_t n);
/* Copies s[0..n) into dst (cap bytes, NUL-terminated) as valid UTF-8 that PostgreSQL's text can
 * hold: a NUL byte becomes '?', any other byte that starts no valid sequence U+FFFD, and the copy
 * stops before a sequence that does not fit whole (with cap >= 3 * n + 1 nothing is left out).
 * Returns the bytes written. The one sanitiser of others' text: ranks' log lines (agent/lines.c),
 * a rank's last error line, a metric's name. */
size_t kiln_utf8_copy(char *dst, size_t cap, const char *src, size_t n);
/* snprintf into buf (n bytes) whose text is valid UTF-8 however it was cut: the bytes of a character
 * that a precision (%.80s) or the end of buf cut short, and any other byte that starts no valid
 * sequence, are left out. Kiln writes every reason and error message it formats from others' text
 * (a client's value, an agent's reason) this way, so that no cut makes text the database, JSON or
 * gRPC refuses. Returns the bytes written. */
size_t kiln_text_fmt(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
size_t kiln_text_vfmt(char *buf, size_t n, const char *fmt, va_list ap);
/* Length of the terminal control character at p (of n bytes left): 1 for a C0 control (tab and
 * newline included) or DEL, 2 for a C1 control (U+0080 to U+009F: 8-bit CSI, OSC, ...), 3 for a
 * bidirectional embedding, override or isolate (U+202A to U+202E, U+2066 to U+2069); 0 when p
 * starts none of them. These are what can rewrite what a terminal shows (ESC [ and ESC ]
 * sequences, BEL, CR overwrites, a window title, the clipboard) or reorder text on screen: kilnd
 * refuses them in names and one-line texts (kiln_text_control_at), and the CLI escapes them in
 * everything it prints. */
size_t kiln_text_control(const unsigned char *p, size_t n);
/* Offset of the first terminal control character (kiln_text_control) in s[0..n), or n. */
size_t kiln_text_control_at(const char *s, size_t n);
/* What kiln_text_escape_char escapes besides terminal controls and bytes that are not UTF-8. */
enum {
    KILN_TEXT_QUOTED = 1u << 0, /* text quoted in a message, between '"': '"' and '\\' as \" and \\, and
                                 * the overlong C0 80 that http.c carries a %00 as as the NUL it
                                 * stands for, \u0000, as gRPC's bytes show it */
    KILN_TEXT_ASCII = 1u << 1,  /* every non-ASCII character too, as \uXXXX (\UXXXXXXXX past U+FFFF):
                                 * for what may hold printable ASCII only (gRPC metadata) */
};
/* How the character at p (n > 0 bytes left) shows safely on a terminal and in a message: *shown
 * (OUT) points at p itself when it starts a valid UTF-8 sequence that is no terminal control
 * character (nor, with the flags above, one they escape), else at esc (12 bytes, filled): \uXXXX
 * for a control character (kiln_text_control), \xHH for a byte that starts no valid sequence;
 * *shown_len (OUT) is its length. Returns the bytes of p it stands for. The one escaping of
 * others' text: the CLI's output (cli/term.c), the daemons' log lines (log.c), bad input quoted in
 * errors (kiln_text_quote), gRPC metadata. */
size_t kiln_text_escape_char(const unsigned char *p, size_t n, unsigned flags, char esc[12], const char **shown,
                             size_t *shown_len);
/* Writes s[0..n) into dst (cap bytes, NUL-terminated) with every character as
 * kiln_text_escape_char shows it with flags, stopping before one that does not fit whole. Returns
 * the bytes written. For others' text quoted on one line (a log record, a note in a job's log). */
size_t kiln_text_escape(char *dst, size_t cap, const char *s, size_t n, unsigned flags);
/* s[0..n) for an error message that quotes it between '"' (a client's bad input, an archive
 * entry's name): as kiln_text_escape with KILN_TEXT_QUOTED, at most max_chars characters of s,
 * then "..." when cut there or at cap. Writes dst (cap bytes, NUL-terminated) and returns it. */
const char *kiln_text_quote(char *dst, size_t cap, const char *s, size_t n, size_t max_chars);
/* Parses a whole string as a decimal integer: an optional '-' and digits only (no '+', no
 * spaces, no hexadecimal), within int64. Returns 0 or KILN_EINVAL. */
int kiln_parse_int64(const char *s, int64_t *out);
/* Parses a duration: a positive whole number with an optional unit s, m, h or d ("90s", "30m",
 * "12h", "7d"; no unit: seconds), at most 100 years. *seconds (OUT). Returns false otherwise. */
bool kiln_duration_parse(const char *s, int64_t *seconds);
/* Whether s is a name kiln accepts for users and projects: 1 to 63 characters of a-z, 0-9,
 * '.', '_' and '-', starting with a letter or digit (the same rule as the database's CHECK). */
bool kiln_ident_ok(const char *s);
/* Levenshtein distance between a and b (insertions, deletions, substitutions of bytes), for
 * "did you mean" hints; strings longer than 63 bytes count as 99 (never a suggestion). */
int kiln_edit_distance(const char *a, const char *b);
/* Copies src into dst of size n, always NUL-terminating; returns strlen(src). */
size_t kiln_strlcpy(char *dst, const char *src, size_t n);
/* FNV-1a over n bytes of data, continuing from h (KILN_FNV1A_START to begin): a hash for tables
 * in memory, not against an adversary who picks the keys. */
#define KILN_FNV1A_START 1469598103934665603ull
uint64_t kiln_fnv1a(uint64_t h, const void *data, size_t n);

/* An index of the caller's names by hash, for a lookup in a loop that would otherwise compare a
 * name with each of hundreds: key i is the stride strings names[i * stride ...] (a queue's name,
 * or a (queue, project) pair), which must outlive the index. */
typedef struct kiln_names {
    const char *const *names;
    int stride;
    int n;      /* keys indexed: names[0 .. n * stride) */
    int *slot;  /* cap slots: a key's index, or -1 */
    size_t cap; /* a power of two, at least twice the most keys */
} kiln_names_t;
/* An empty index for at most most keys (false: out of memory). */
bool kiln_names_init(kiln_names_t *x, const char *const *names, int stride, int most);
/* The index of key (stride strings), or -1 with the slot it would take in *at (when at). */
int kiln_names_find(const kiln_names_t *x, const char *const *key, size_t *at);
/* Indexes keys x->n .. n-1 of the names (of equal keys, the first is the one found). */
void kiln_names_add_all(kiln_names_t *x, int n);
void kiln_names_free(kiln_names_t *x);
/* Reads a whole file into a heap buffer (NUL-terminated). Caller owns *out; free with free().
 * Returns 0, KILN_ENOTFOUND or KILN_EIO (err says which file and why). */
int kiln_file_read(const char *path, char **out, size_t *out_len, kiln_err_t *err);
/* Writes data to path atomically: temporary file in the same directory, fsync, rename, fsync of
 * the directory. Returns 0 or KILN_EIO. */
int kiln_file_write_atomic(const char *path, const void *data, size_t len, kiln_err_t *err);
/* Same with the new file's mode (0600 for secrets): the temporary file is created with it, so the
 * data is never readable by others, even for a moment. */
int kiln_file_write_atomic_mode(const char *path, const void *data, size_t len, unsigned mode,
                                kiln_err_t *err);
/* mkdir -p: directories it creates get mode 0755. Returns 0 or KILN_EIO. */
int kiln_mkdirs(const char *path, kiln_err_t *err);
/* mkdir -p with the mode (before the umask) of the directories it creates; existing ones are left
 * as they are. Returns 0, KILN_EINVAL (path too long) or KILN_EIO. */
int kiln_mkdirs_mode(const char *path, unsigned mode, kiln_err_t *err);

/* ------------------------------------------------------------------------------------------
 * Paths a job may touch (path.c). A job names files in its spec; the agent and kiln-train let it
 * read or write one only when the path, resolved after ".." and symbolic links, lies inside one
 * of a set of roots, at a component boundary ("/data2" is not inside "/data"). Errors name the
 * field and the roots; outside the roots they are the same whether the path exists or not.
 * ------------------------------------------------------------------------------------------ */

/* Lexical normalisation of an absolute path: collapses repeated '/', "." and ".."; ".." never
 * climbs above "/"; no trailing '/' except in "/" itself. Touches no file system. out may be
 * path. Returns 0, KILN_EINVAL (empty or relative) or KILN_ETOOBIG (does not fit out's size n). */
int kiln_path_normalize(const char *path, char *out, size_t n, kiln_err_t *err);

/* Resolves an absolute path as the kernel would walk it: symbolic links are followed (at most 40)
 * and ".." applies to where they led. What exists comes out as realpath(3) gives it; components
 * below the deepest existing ancestor are appended and normalised lexically. *exists (OUT, may
 * be NULL): whether the whole path exists. Returns 0, KILN_EINVAL (relative), KILN_ETOOBIG or
 * KILN_EIO (a symbolic link loop). Thread-safe. */
int kiln_path_resolve(const char *path, char *out, size_t n, bool *exists, kiln_err_t *err);

/* Whether path is root or lies below it, at a component boundary ("/data2" is not inside
 * "/data"; everything absolute is inside "/"). Both must already be normalised or resolved
 * (kiln_path_normalize, kiln_path_resolve): this compares text only. */
bool kiln_path_inside(const char *path, const char *root);

/* Confines path to roots[0..nroots) (resolved here too, so a root may itself be a symbolic
 * link): resolves path (kiln_path_resolve) and succeeds only when the result is one of the roots
 * or lies below one. field names the spec field in messages ("data.train"). On success the
 * resolved path goes to resolved_out (size n; may be NULL) and *exists (OUT, may be NULL) says
 * whether it exists; a missing path inside a root is not an error here. Returns 0, KILN_EINVAL
 * (relative path), KILN_ETOOBIG, or KILN_EPERM: outside every root, or not resolvable - one
 * message for all of these, naming the field, the path as given and the roots, never whether
 * the path exists nor where its links lead. No file is opened. Thread-safe. */
int kiln_path_confine(const char *path, const char *field, const char *const *roots, size_t nroots,
                      char *resolved_out, size_t n, bool *exists, kiln_err_t *err);
/* kiln_path_confine's decision for a path resolved already (resolved; NULL: it could not be):
 * 0 when it is one of roots[0..nroots) (resolved here) or lies below one, else KILN_EPERM with
 * kiln_path_confine's message, which names given (the path as the spec gave it), never resolved.
 * For a path read back from an open file (/proc/self/fd/N). Thread-safe. */
int kiln_path_confine_resolved(const char *resolved, const char *given, const char *field, const char *const *roots,
                               size_t nroots, kiln_err_t *err);

/* Project areas. What kiln writes inside a data root lives in a directory named KILN_AREA_DIR
 * and, below it, one directory per project (a job's checkpoints: <checkpoint.path>/.kiln/
 * <project>/<job id>); only jobs of that project may reach a path there. A data root's other
 * files are shared by every project. */
#define KILN_AREA_DIR ".kiln"

/* Whether path (absolute; normalised or resolved: text only) reaches into a project area that is
 * not project's: one of its components is KILN_AREA_DIR and the next one is missing or another
 * name. project NULL or "": every area is another's (any KILN_AREA_DIR component). */
bool kiln_path_foreign_area(const char *path, const char *project);

/* KILN_EPERM when resolved (the path as kilnd normalised it, or as the agent resolved it) reaches
 * into another project's area (kiln_path_foreign_area); else 0. The message names field, the path
 * as given and the job's project, never where a link leads nor whether the file exists. */
int kiln_path_area_check(const char *resolved, const char *given, const char *field, const char *project,
                         kiln_err_t *err);


/* Compiles a metric definition's pattern the one way kiln runs it (PCRE2, UTF, no \C) and
 * checks it can yield a point: a capture group for the value (the first group that is not the
 * step group), no backreference (they make matching exponential), and at most one group named
 * "step", which, when there is one, gives the point's step and must be able to capture a whole
 * number (refused when kiln can tell it never does: (?<step>[a-z]+); a group that looks around
 * itself or calls other groups passes, and a match that captures no number gives no point).
 * *value_group and *step_group (OUT, may be NULL) are the groups' numbers (step 0: none).
 * Returns the compiled pattern (a pcre2_code * for PCRE2_CODE_UNIT_WIDTH 8; free with
 * pcre2_code_free), or NULL with err set: KILN_EINVAL naming field ("metric_definitions[0].regex")
 * with a hint, or KILN_ENOMEM. */
void *kiln_metric_regex_compile(const char *regex, const char *field, int *value_group, int *step_group,
                                kiln_err_t *err);

/* ------------------------------------------------------------------------------------------
 * Artifacts (artifact.c): the files a job leaves in its output directory, kept by kilnd. Their
 * names travel from agents to kilnd, into kilnd's artifact directory and into URLs, so one rule
 * decides which names exist; SHA-256 (libsodium) is how agent, kilnd and clients agree on bytes.
 * ------------------------------------------------------------------------------------------ */
#define KILN_ARTIFACT_NAME_MAX 128        /* bytes of a name */
#define KILN_ARTIFACT_PATH_MAX 512        /* bytes of a path in a synced checkpoint tree */
#define KILN_ARTIFACT_PATH_DEPTH 16       /* names in such a path */
#define KILN_ARTIFACT_MODEL "model_llmc.bin" /* the final model kiln-train writes (llm.c format) */
#define KILN_SHA256_HEX 65                /* 64 lower-case hex digits and a NUL */

/* Whether name can be an artifact's: 1 to KILN_ARTIFACT_NAME_MAX bytes of A-Z a-z 0-9 . _ -,
 * starting with a letter or digit. So no '/', no "..", no absolute or hidden name, nothing that
 * needs escaping in a URL or a file system. On failure err (may be NULL) says why, naming
 * field, with a hint. */
bool kiln_artifact_name_ok(const char *name, const char *field, kiln_err_t *err);
/* Whether path can name a file of a synced checkpoint tree: 1 to KILN_ARTIFACT_PATH_MAX bytes of
 * at most KILN_ARTIFACT_PATH_DEPTH names joined by '/', each one kiln_artifact_name_ok accepts.
 * So relative, no empty name, no "." or "..", nothing hidden. err as kiln_artifact_name_ok's. */
bool kiln_artifact_path_ok(const char *path, const char *field, kiln_err_t *err);

/* Whether s is 64 lower-case hex digits (a SHA-256 as kiln writes it). */
bool kiln_sha256_hex_ok(const char *s);
/* SHA-256 of data[0..len) as lower-case hex into out (KILN_SHA256_HEX bytes). */
void kiln_sha256_hex(const void *data, size_t len, char out[KILN_SHA256_HEX]);
/* SHA-256 of everything fd holds from offset 0 (read with pread, in 1 MiB pieces, never all at
 * once) into out, its length into *size (OUT, may be NULL). Returns 0 or KILN_EIO. */
int kiln_sha256_fd(int fd, int64_t *size, char out[KILN_SHA256_HEX], kiln_err_t *err);
/* An incremental SHA-256, for bytes that arrive in pieces (a download). Caller's storage. */
typedef struct kiln_sha256 {
    uint64_t state[16];                   /* libsodium's crypto_hash_sha256_state fits */
} kiln_sha256_t;
void kiln_sha256_init(kiln_sha256_t *h);
void kiln_sha256_update(kiln_sha256_t *h, const void *data, size_t len);
void kiln_sha256_final(kiln_sha256_t *h, char out[KILN_SHA256_HEX]);

/* kiln's version, as every program and kilnd's /healthz report it. */
#define KILN_VERSION "0.1.0"

/* ------------------------------------------------------------------------------------------
 * Prometheus metrics (prom.c): families of counters, gauges and histograms a process updates
 * from any thread and writes in the text exposition format (0.0.4) when scraped. Like logging,
 * the registry is process-wide: a family is a static object of the module that updates it and
 * joins the registry with prom_register() (or its first update). Each series of a family is
 * named by its rendered labels ("route=\"GET /v1/jobs\",status=\"200\"", or "" for none);
 * prom_label() renders a value safely.
 * ------------------------------------------------------------------------------------------ */
typedef enum { PROM_COUNTER, PROM_GAUGE, PROM_HISTOGRAM } prom_type_t;
#define PROM_MAX_BUCKETS 16
typedef struct prom_series prom_series_t;
typedef struct prom_family {
    const char *name;                 /* kiln_http_request_duration_seconds */
    const char *help;
    prom_type_t type;
    const double *buckets;            /* histograms: upper bounds, ascending, +Inf implied */
    int nbuckets;                     /* at most PROM_MAX_BUCKETS */
    /* the registry's */
    struct prom_family *next;
    prom_series_t *series;            /* heap array, nseries of them, under the registry lock */
    int nseries, cap;
    bool registered;
} prom_family_t;
#define PROM_FAMILY(name_, help_, type_) {.name = (name_), .help = (help_), .type = (type_)}
#define PROM_HISTOGRAM_FAMILY(name_, help_, buckets_)                                              \
    {.name = (name_), .help = (help_), .type = PROM_HISTOGRAM, .buckets = (buckets_),              \
     .nbuckets = (int)KILN_ARRAY_LEN(buckets_)}
/* Bucket bounds in seconds: request latencies (1 ms .. 10 s) and waits (1 s .. 1 day). */
extern const double prom_latency_buckets[13];
extern const double prom_wait_buckets[11];

/* Adds f to the registry (idempotent), so that it is written even before its first update. */
void prom_register(prom_family_t *f);
/* Counters and gauges add (a counter's v >= 0), histograms observe. Thread-safe. */
void prom_add(prom_family_t *f, const char *labels, double v);
void prom_observe(prom_family_t *f, const char *labels, double v);
/* Renders name="value" (value escaped as the format requires) into out (size n); returns out. */
char *prom_label(char *out, size_t n, const char *name, const char *value);
/* prom_label with value in lower case (its first 127 bytes): how every value of a fixed set
 * (a state, an outcome, a status code) is written, on kilnd and the agent alike. */
char *prom_label_lower(char *out, size_t n, const char *name, const char *value);

/* A growing text buffer for an exposition. oom is set (and text cut short) when memory ran out. */
typedef struct prom_buf {
    char *data;                       /* heap; caller frees */
    size_t len, cap;
    bool oom;
} prom_buf_t;
void prom_printf(prom_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "# HELP name help\n# TYPE name type\n". */
void prom_header(prom_buf_t *b, const char *name, const char *help, prom_type_t type);
/* Every registered family (in name order), then process_* (CPU, memory, file descriptors, start
 * time, from /proc/self) and kiln_build_info{program,version} 1. */
void prom_write(prom_buf_t *b, const char *program);

/* The most metric points one batch from kiln-agent carries (its outbox seals a batch at this many);
 * kilnd refuses a larger one before any work. */
#define KILN_METRIC_BATCH_POINTS 5000
/* The most log lines one batch may carry: kilnd refuses a larger one before any work (kiln-agent
 * seals its batches at a tenth of it, or at 1 MiB). */
#define KILN_LOG_BATCH_LINES 10000

#define KILN_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define KILN_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KILN_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif /* KILN_BASE_H */
