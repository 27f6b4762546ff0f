/* code.h - users' training code as kiln ships it: a gzip'd tar archive of a source directory,
 * packed by clients (honouring a .kilnignore), checked by kilnd when it is uploaded and extracted
 * by kiln-agent. Archives are untrusted input: one reader decides, entry by entry, what an archive
 * may hold, for kilnd's check and the agent's extraction alike, and nothing it extracts lands
 * outside the extraction directory. It depends on base/ and libarchive only; it stores, fetches
 * and caches nothing (kilnd's service and the agent do). */
#ifndef KILN_CODE_H
#define KILN_CODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

/* ------------------------------------------------------------------------------------------
 * Reading archives. Every entry is checked before anything is written for it:
 * - its path is relative, valid UTF-8 without control characters, without ".." components,
 *   at most CODE_PATH_MAX bytes with components of at most 255 ("./" prefixes are dropped);
 * - it is a regular file, a directory, a symbolic link or a hard link; devices, FIFOs, sockets
 *   and sparse files are refused, and so are set-user-ID and set-group-ID bits;
 * - a symbolic link's target is relative and stays inside the tree: its leading ".." components
 *   climb no higher than the tree's top and no ".." follows another component (so that what the
 *   link names does not depend on where other links lead);
 * - a hard link names a regular file the archive holds before it;
 * - no entry is written through a symbolic link, over another entry, or below a non-directory;
 * - at most max_entries entries, max_file_bytes per file and max_total_bytes in all (counted as
 *   the archive is decompressed, so a gzip bomb stops at the limit).
 * Refusals are KILN_EINVAL with field "archive" and a message that names the entry:
 *   archive entry "../x": a path must not climb out of the tree with ".."
 * ------------------------------------------------------------------------------------------ */
#define CODE_PATH_MAX 1024                 /* bytes of an entry's path */
#define CODE_MAX_ENTRIES 10000
#define CODE_DEFAULT_MAX_MB 100            /* kilnd --code-max-mb: compressed bytes of an archive */

typedef struct code_limits {
    int64_t max_entries;                   /* entries of every kind */
    int64_t max_file_bytes;                /* uncompressed bytes of one file */
    int64_t max_total_bytes;               /* uncompressed bytes of all files */
} code_limits_t;

/* The limits for archives of at most archive_max_bytes compressed bytes: CODE_MAX_ENTRIES
 * entries, 10 x archive_max_bytes uncompressed in all, and as much for one file. */
void code_limits_default(code_limits_t *l, int64_t archive_max_bytes);

typedef struct code_stats {
    int64_t entries;                       /* entries read (directories and links included) */
    int64_t files;                         /* regular files */
    int64_t bytes;                         /* uncompressed bytes of the regular files */
} code_stats_t;

/* Checks an archive held in memory (data[0..len)), entry by entry, without writing anything.
 * *st (OUT, may be NULL) counts what it holds. Returns 0; KILN_EINVAL naming the first entry at
 * fault (or "the archive is not a gzip'd tar" / is damaged / holds no files); KILN_ENOMEM.
 * Pure: no file system, no global state; thread-safe. */
int code_archive_check(const void *data, size_t len, const code_limits_t *lim, code_stats_t *st, kiln_err_t *err);
/* The same, reading the archive from fd (from its current offset to its end). KILN_EIO when fd
 * cannot be read. */
int code_archive_check_fd(int fd, const code_limits_t *lim, code_stats_t *st, kiln_err_t *err);

/* Extracts the archive read from fd into the directory dest, which must not exist (its parent
 * must): entries go into a fresh directory beside it (dest.tmp-XXXXXX, 0700 while it fills),
 * created relative to that directory's descriptor without following any symbolic link, and the
 * whole tree is renamed to dest once every entry passed; a refusal removes what was written.
 * Directories get mode 0755, files 0644 or 0755 (when the archive gives any execute bit);
 * owners and times are not restored. Returns 0; code_archive_check's refusals; KILN_EEXIST when
 * dest exists; KILN_EIO when writing fails. Thread-safe (no chdir, no umask change). */
int code_archive_extract_fd(int fd, const char *dest, const code_limits_t *lim, code_stats_t *st, kiln_err_t *err);
/* Removes the tree at path (a directory, a file or a link), never following a link. Returns 0
 * (also when path does not exist) or KILN_EIO. */
int code_tree_remove(const char *path);

/* ------------------------------------------------------------------------------------------
 * .kilnignore: which files of a source directory stay out of its archive, in gitignore's
 * syntax (one file, at the directory's top): blank lines and "#" comments; "!" re-includes;
 * a trailing "/" matches directories only; a pattern with a "/" before its end is anchored to
 * the top, one without matches a name at any depth; "*", "?" and "[...]" stop at "/"; "**"
 * matches across directories ("**" + "/x", "a/" + "**", "a/" + "**" + "/b"); "\" escapes. The
 * last matching line decides; a file below an excluded directory stays out (as in git, it
 * cannot be re-included). ".git/" is excluded unless a line re-includes it.
 * ------------------------------------------------------------------------------------------ */
typedef struct code_ignore code_ignore_t;

/* Parses the text of a .kilnignore (text[0..len); NULL and 0 for none: only the defaults).
 * Caller owns *out; free with code_ignore_destroy(). Returns 0, KILN_EINVAL (a line that is
 * not valid UTF-8, or more than 10,000 lines, naming the line) or KILN_ENOMEM. */
int code_ignore_parse(const char *text, size_t len, code_ignore_t **out, kiln_err_t *err);
void code_ignore_destroy(code_ignore_t *ig); /* accepts NULL */
/* Whether path (relative to the top, '/'-separated, no leading "./"; is_dir: it is a directory)
 * is excluded by the patterns themselves; a parent's exclusion is the walker's business
 * (code_pack_dir does not descend into an excluded directory). */
bool code_ignore_match(const code_ignore_t *ig, const char *path, bool is_dir);

/* ------------------------------------------------------------------------------------------
 * Packing (clients): a directory into a gzip'd tar that code_archive_check accepts.
 * ------------------------------------------------------------------------------------------ */

/* Writes the tree under dir, minus what its .kilnignore excludes (dir/.kilnignore, when it
 * exists), as a gzip'd tar to fd: regular files, directories and symbolic links, in name order,
 * with modes normalised (0644, 0755 for executables and directories), owners and times zeroed,
 * so the same tree packs to the same bytes (and so the same source). Symbolic links are kept as
 * links, not followed. The result is checked with code_archive_check's rules against lim (a
 * link leaving the tree, a FIFO or a device file is refused before anything is sent; the hint
 * says to add it to .kilnignore); max_archive_bytes (0: no bound) bounds the compressed size.
 * *st (OUT, may be NULL) counts what was packed. Returns 0, KILN_EINVAL, KILN_ETOOBIG,
 * KILN_ENOTFOUND (dir is missing or not a directory) or KILN_EIO. */
int code_pack_dir(const char *dir, int fd, const code_limits_t *lim, int64_t max_archive_bytes, code_stats_t *st,
                  kiln_err_t *err);

#endif /* KILN_CODE_H */
