/* query_int.h - internals shared by the query module's files: the tokens the lexer (lex.c) hands
 * the parser (parse.c), and the error reporter that draws the caret. Nothing outside query/
 * includes it. */
#ifndef KILN_QUERY_INT_H
#define KILN_QUERY_INT_H

#include "query/query.h"

typedef enum qtok_kind {
    QK_EOF,
    QK_PATH,      /* a bare word or field path: seg ('.' seg)*; a seg may be quoted or '*' */
    QK_STRING,    /* a quoted string; text is its unescaped content */
    QK_NUMBER,    /* num */
    QK_DURATION,  /* num: seconds, signed */
    QK_TIME,      /* us: an absolute time (2026-11-01, 2026-11-01T06:00:00Z) */
    QK_OP,        /* op; negated for != spelled as such is QO_NE, and !~ sets op_not */
    QK_LPAREN,
    QK_RPAREN,
    QK_COMMA
} qtok_kind_t;

#define QTOK_MAX_SEGS 16

typedef struct qtok {
    qtok_kind_t kind;
    int pos, len;          /* byte span in the text */
    const char *text;      /* QK_STRING: content; QK_PATH: the segments joined by '.'; arena */
    const char *segs[QTOK_MAX_SEGS]; /* QK_PATH: the segments (unquoted), arena */
    int nsegs;
    bool quoted;           /* QK_PATH: some segment was quoted (never a keyword then) */
    double num;
    int64_t us;
    query_op_t op;
    bool op_not;           /* "!~" */
    int unit_pos, unit_len;/* QK_PATH that began as a number ("3x", "0b6c"): where the letters
                              start (0 otherwise), for "unknown unit" */
} qtok_t;

/* The state of one parse: the text, where the lexer is, and where errors go. */
typedef struct qctx {
    const char *text;
    int len;
    int at;                /* next byte the lexer reads */
    const char *what;      /* "filter", "order_by", "columns": the request field */
    arena_t *arena;
    kiln_err_t *err;
    int64_t now_us;
    qtok_t tok;            /* the current token (one token of lookahead) */
    int depth;             /* parentheses and NOTs nested */
    int terms;             /* comparisons so far */
    int table_terms;       /* those on hp.* and metrics.* */
    int values;            /* values in IN lists so far */
    bool built;            /* building in code: no caret detail */
} qctx_t;

/* Starts the lexer on text and reads the first token. Returns 0 or KILN_EINVAL. */
int qlex_init(qctx_t *q, const char *text, const char *what, arena_t *arena, int64_t now_us, kiln_err_t *err);
/* Moves to the next token (q->tok). Returns 0 or KILN_EINVAL (err filled). */
int qlex_next(qctx_t *q);
/* Whether the current token is the keyword kw (case-insensitive, an unquoted one-segment path). */
bool qtok_is_kw(const qtok_t *t, const char *kw);
/* Whether the current token is any keyword of the language (AND OR NOT IN EXISTS). */
bool qtok_is_any_kw(const qtok_t *t);
/* The token's text as the user typed it (arena). */
const char *qtok_raw(const qctx_t *q, const qtok_t *t);
/* A human description of a token for messages: "AND", "\"nlp\"", "the end of the filter". */
const char *qtok_describe(const qctx_t *q, const qtok_t *t);

/* Parses a date ("2026-11-01": midnight UTC) or an RFC 3339 time into Unix microseconds;
 * 0 or KILN_EINVAL. */
int qtime_text(const char *s, int64_t *us);

/* Fails the parse at byte span [pos, pos+len): KILN_EINVAL with err->field = q->what, the
 * formatted message with " at column N" appended, the caret drawing in detail, hint (may be
 * NULL). Returns KILN_EINVAL. */
int qfail(qctx_t *q, int pos, int len, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif /* KILN_QUERY_INT_H */
