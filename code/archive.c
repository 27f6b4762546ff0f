/* archive.c - reading code archives (gzip'd tar, through libarchive) entry by entry: the checks
 * of code.h decided on a model of the tree built as the entries come (so checking in memory and
 * extracting decide alike), and, when extracting, each entry written relative to the descriptor
 * of its parent directory, opened component by component without following links.
 * libarchive only parses; it never writes to the file system here. */
#include "code/code.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define READ_BLOCK (64 * 1024)
#define HEADER_ALLOWANCE (8 * 1024) /* decompressed bytes of headers counted per entry */

void code_limits_default(code_limits_t *l, int64_t archive_max_bytes)
{
    if (archive_max_bytes <= 0)
        archive_max_bytes = (int64_t)CODE_DEFAULT_MAX_MB << 20;
    l->max_entries = CODE_MAX_ENTRIES;
    l->max_total_bytes = 10 * archive_max_bytes;
    l->max_file_bytes = l->max_total_bytes;
}

/* ---- the model of the tree: every path the archive made, with its kind ---------------------- */

enum { NODE_NONE = 0, NODE_DIR, NODE_FILE, NODE_LINK };

typedef struct tree {
    char **key;
    unsigned char *kind;
    size_t cap, n;
} tree_t;

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static size_t tree_slot(const tree_t *t, const char *path)
{
    size_t i = (size_t)hash_str(path) & (t->cap - 1);
    while (t->key[i] && strcmp(t->key[i], path) != 0)
        i = (i + 1) & (t->cap - 1);
    return i;
}

static int tree_kind(const tree_t *t, const char *path)
{
    if (!t->cap)
        return NODE_NONE;
    size_t i = tree_slot(t, path);
    return t->key[i] ? t->kind[i] : NODE_NONE;
}

/* Adds path (absent) with kind. Returns 0 or KILN_ENOMEM. */
static int tree_add(tree_t *t, const char *path, int kind)
{
    if (2 * (t->n + 1) > t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 256;
        tree_t g = {calloc(cap, sizeof(char *)), calloc(cap, 1), cap, t->n};
        if (!g.key || !g.kind) {
            free(g.key);
            free(g.kind);
            return KILN_ENOMEM;
        }
        for (size_t i = 0; i < t->cap; i++)
            if (t->key[i]) {
                size_t k = tree_slot(&g, t->key[i]);
                g.key[k] = t->key[i];
                g.kind[k] = t->kind[i];
            }
        free(t->key);
        free(t->kind);
        *t = g;
    }
    char *k = strdup(path);
    if (!k)
        return KILN_ENOMEM;
    size_t i = tree_slot(t, path);
    t->key[i] = k;
    t->kind[i] = (unsigned char)kind;
    t->n++;
    return 0;
}

static void tree_free(tree_t *t)
{
    for (size_t i = 0; i < t->cap; i++)
        free(t->key[i]);
    free(t->key);
    free(t->kind);
    memset(t, 0, sizeof(*t));
}

/* ---- one pass over an archive ------------------------------------------------------------------ */

typedef struct walk {
    struct archive *a;
    const code_limits_t *lim;
    code_stats_t st;
    tree_t tree;
    int root;                 /* the extraction directory, or -1 (check only) */
    kiln_err_t *err;
    char *buf;                /* data blocks are copied out of libarchive's buffer only to write */
} walk_t;

/* A name for messages: quoted as kiln_text_quote does, at most 120 characters or n bytes. */
static const char *shown(const char *s, char *buf, size_t n)
{
    return s ? kiln_text_quote(buf, n, s, strlen(s), 120) : "?";
}

static int refuse(walk_t *w, const char *entry, const char *hint, const char *fmt, const char *what)
    __attribute__((format(printf, 4, 0)));
/* KILN_EINVAL: archive entry "<entry>" followed by fmt with what as its one %s. */
static int refuse(walk_t *w, const char *entry, const char *hint, const char *fmt, const char *what)
{
    char name[128], rest[192];
    snprintf(rest, sizeof(rest), fmt, what ? what : "");
    kiln_err_set(w->err, KILN_EINVAL, "archive", "archive entry \"%s\"%s", shown(entry, name, sizeof(name)), rest);
    if (hint)
        kiln_err_hint(w->err, "%s", hint);
    return KILN_EINVAL;
}

/* Text kiln accepts in a name: valid UTF-8 without control characters. */
static bool text_ok(const char *s)
{
    size_t n = strlen(s);
    if (kiln_utf8_check(s, n) != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return false;
    return true;
}

/* Normalises an entry's path into out (CODE_PATH_MAX + 1 bytes): "./" and repeated or trailing
 * '/' dropped, "." components dropped. "" is the tree's top. */
static int entry_path(walk_t *w, const char *raw, char *out)
{
    static const char *const hint = "pack paths relative to the source directory (kiln code push DIR does)";
    if (!raw)
        return refuse(w, "?", NULL, ": its name could not be read%s", "");
    if (!text_ok(raw))
        return refuse(w, raw, NULL, ": a name must be UTF-8 text without control characters%s", "");
    if (raw[0] == '/')
        return refuse(w, raw, hint, ": an absolute path is not allowed%s", "");
    size_t o = 0;
    const char *p = raw;
    while (*p) {
        while (*p == '/')
            p++;
        const char *e = strchr(p, '/');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0)
            break;
        if (len == 2 && p[0] == '.' && p[1] == '.')
            return refuse(w, raw, hint, ": a path must not climb out of the tree with \"..\"%s", "");
        if (len > 255)
            return refuse(w, raw, NULL, ": a name may have at most 255 bytes%s", "");
        if (!(len == 1 && p[0] == '.')) {
            if (o + (o ? 1 : 0) + len > CODE_PATH_MAX)
                return refuse(w, raw, NULL, ": a path may have at most %s bytes", "1024");
            if (o)
                out[o++] = '/';
            memcpy(out + o, p, len);
            o += len;
        }
        p += len;
    }
    out[o] = '\0';
    return 0;
}

/* Components of path's parent directory. */
static int parent_depth(const char *path)
{
    int d = 0;
    for (const char *p = path; *p; p++)
        d += *p == '/';
    return d;
}

/* A symbolic link's target: relative, and stays inside the tree (see code.h). */
static int check_link_target(walk_t *w, const char *entry, const char *target)
{
    static const char *const hint = "make the link relative and keep it inside the source directory, or leave it "
                                    "out with .kilnignore";
    char t[64];
    if (!target || !target[0])
        return refuse(w, entry, NULL, ": a symbolic link without a target%s", "");
    if (strlen(target) > CODE_PATH_MAX || !text_ok(target))
        return refuse(w, entry, NULL, ": its symbolic link target is too long or not UTF-8 text%s", "");
    if (target[0] == '/')
        return refuse(w, entry, hint, ": a symbolic link to an absolute path (\"%s\") leads out of the tree",
                      shown(target, t, 48));
    int up = 0, depth = parent_depth(entry);
    bool descended = false;
    for (const char *p = target; *p;) {
        const char *e = strchr(p, '/');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        bool dotdot = len == 2 && p[0] == '.' && p[1] == '.';
        if (dotdot && (descended || ++up > depth))
            return refuse(w, entry, hint, ": its symbolic link (\"%s\") leads out of the tree", shown(target, t, 48));
        if (len > 0 && !dotdot && !(len == 1 && p[0] == '.'))
            descended = true;
        p += len;
        while (*p == '/')
            p++;
    }
    return 0;
}

/* Opens the directory dir ("" for the top) below w->root, component by component, never
 * following a link. Returns a descriptor or -1 (errno set). */
static int open_dir_at(walk_t *w, const char *dir)
{
    int fd = dup(w->root);
    char comp[256];
    for (const char *p = dir; fd >= 0 && *p;) {
        const char *e = strchr(p, '/');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        memcpy(comp, p, len);
        comp[len] = '\0';
        int next = openat(fd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int saved = errno;
        close(fd);
        errno = saved;
        fd = next;
        p += len + (e ? 1 : 0);
    }
    return fd;
}

static int io_fail(walk_t *w, const char *entry, const char *what)
{
    char name[128];
    int saved = errno;
    return kiln_err_set(w->err, KILN_EIO, NULL, "could not extract \"%s\": %s: %s", shown(entry, name, sizeof(name)),
                        what, strerror(saved));
}

/* Counts one more node against max_entries. */
static int count_entry(walk_t *w, const char *entry)
{
    if (++w->st.entries <= w->lim->max_entries)
        return 0;
    char lim[32];
    snprintf(lim, sizeof(lim), "%lld", (long long)w->lim->max_entries);
    return refuse(w, entry, "pack fewer files (leave build outputs and data out with .kilnignore)",
                  ": the archive holds more than %s entries (directories included)", lim);
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Opens the parent directory of path for writing its last component. */
static int open_parent(walk_t *w, const char *path)
{
    char dir[CODE_PATH_MAX + 1];
    kiln_strlcpy(dir, path, sizeof(dir));
    char *s = strrchr(dir, '/');
    if (s)
        *s = '\0';
    else
        dir[0] = '\0';
    return open_dir_at(w, dir);
}

/* Makes sure every directory above path exists in the model (and on disk): a missing one is
 * made; one that is a file or a link refuses the entry. */
static int ensure_parents(walk_t *w, const char *path)
{
    char pre[CODE_PATH_MAX + 1];
    for (const char *s = strchr(path, '/'); s; s = strchr(s + 1, '/')) {
        size_t len = (size_t)(s - path);
        memcpy(pre, path, len);
        pre[len] = '\0';
        int k = tree_kind(&w->tree, pre);
        if (k == NODE_DIR)
            continue;
        if (k == NODE_LINK)
            return refuse(w, path, NULL, ": it would be written through the symbolic link \"%s\"", pre);
        if (k == NODE_FILE)
            return refuse(w, path, NULL, ": it lies below \"%s\", which is not a directory", pre);
        int rc = count_entry(w, path);
        if (rc)
            return rc;
        if (tree_add(&w->tree, pre, NODE_DIR))
            return kiln_err_set(w->err, KILN_ENOMEM, NULL, "out of memory");
        if (w->root >= 0) {
            int pfd = open_parent(w, pre);
            int r = pfd >= 0 ? mkdirat(pfd, base_name(pre), 0755) : -1;
            if (pfd >= 0)
                close(pfd);
            if (r != 0)
                return io_fail(w, pre, "mkdir");
        }
    }
    return 0;
}

/* Reads (and, when extracting, writes to fd) the data of a regular file entry. */
static int file_data(walk_t *w, const char *path, int fd)
{
    char lim[32];
    for (;;) {
        const void *block;
        size_t size;
        la_int64_t off;
        int r = archive_read_data_block(w->a, &block, &size, &off);
        if (r == ARCHIVE_EOF)
            return 0;
        if (r < ARCHIVE_WARN)
            return refuse(w, path, "pack the directory again (kiln code push)", ": the archive is damaged here: %s",
                          archive_error_string(w->a));
        if (off < 0 || off + (la_int64_t)size > w->lim->max_file_bytes) {
            snprintf(lim, sizeof(lim), "%lld", (long long)w->lim->max_file_bytes);
            return refuse(w, path, "leave large files out with .kilnignore; data belongs in a data channel",
                          ": it passes the limit of %s bytes for one file", lim);
        }
        w->st.bytes += (int64_t)size;
        if (w->st.bytes > w->lim->max_total_bytes) {
            snprintf(lim, sizeof(lim), "%lld", (long long)w->lim->max_total_bytes);
            return refuse(w, path, "leave large files out with .kilnignore; data belongs in a data channel",
                          ": the archive passes the limit of %s bytes uncompressed", lim);
        }
        if (fd >= 0 && size > 0) {
            size_t done = 0;
            while (done < size) {
                ssize_t n = pwrite(fd, (const char *)block + done, size - done, (off_t)(off + (la_int64_t)done));
                if (n < 0 && errno == EINTR)
                    continue;
                if (n <= 0)
                    return io_fail(w, path, "write");
                done += (size_t)n;
            }
        }
    }
}

static int one_entry(walk_t *w, struct archive_entry *e)
{
    char path[CODE_PATH_MAX + 1], target[CODE_PATH_MAX + 1];
    const char *raw = archive_entry_pathname_utf8(e);
    if (!raw)
        raw = archive_entry_pathname(e);
    int rc = entry_path(w, raw, path);
    if (rc)
        return rc;
    const char *hard = archive_entry_hardlink_utf8(e);
    if (!hard)
        hard = archive_entry_hardlink(e);
    mode_t type = archive_entry_filetype(e);
    mode_t perm = archive_entry_perm(e);
    if (!path[0]) {
        /* the tree's top ("./"): nothing to make */
        if (hard || (type && type != AE_IFDIR))
            return refuse(w, raw, NULL, ": the top of the tree must be a directory%s", "");
        return 0;
    }
    if (perm & (S_ISUID | S_ISGID))
        return refuse(w, path, "clear the bit (chmod u-s,g-s) or leave the file out",
                      ": set-user-ID and set-group-ID files are not allowed%s", "");
    if (!hard) {
        const char *kind = type == AE_IFCHR || type == AE_IFBLK ? "a device file"
                           : type == AE_IFIFO                   ? "a FIFO"
                           : type == AE_IFSOCK                  ? "a socket"
                           : (type == AE_IFREG || type == AE_IFDIR || type == AE_IFLNK) ? NULL
                                                                                      : "of an unknown type";
        if (kind)
            return refuse(w, path, "code archives hold files, directories and links; leave it out with .kilnignore",
                          " is %s", kind);
    }
    if (archive_entry_sparse_count(e) > 0)
        return refuse(w, path, NULL, ": sparse files are not allowed%s", "");
    if (archive_entry_is_encrypted(e))
        return refuse(w, path, NULL, ": encrypted entries are not allowed%s", "");
    if ((rc = ensure_parents(w, path)))
        return rc;
    int have = tree_kind(&w->tree, path);
    bool is_dir = !hard && type == AE_IFDIR;
    if (have == NODE_DIR && is_dir)
        return 0; /* a directory named again (or after the files in it): nothing to do */
    if (have != NODE_NONE)
        return refuse(w, path, "pack the directory again (kiln code push)", ": it appears twice in the archive%s", "");
    if ((rc = count_entry(w, path)))
        return rc;

    int kind = is_dir ? NODE_DIR : (!hard && type == AE_IFLNK) ? NODE_LINK : NODE_FILE;
    char tpath[CODE_PATH_MAX + 1];
    if (hard) {
        /* the target is named like any entry, and must be a file made before */
        kiln_err_t keep = *w->err;
        rc = entry_path(w, hard, tpath);
        if (rc) {
            char t[64];
            *w->err = keep;
            return refuse(w, path, NULL, ": its hard link (to \"%s\") leads out of the tree", shown(hard, t, 48));
        }
        if (tree_kind(&w->tree, tpath) != NODE_FILE)
            return refuse(w, path, NULL, ": its hard link names \"%s\", which is not a file earlier in the archive",
                          shown(tpath, target, 48));
    } else if (kind == NODE_LINK) {
        const char *t = archive_entry_symlink_utf8(e);
        if (!t)
            t = archive_entry_symlink(e);
        if ((rc = check_link_target(w, path, t)))
            return rc;
        kiln_strlcpy(target, t, sizeof(target));
    } else if (kind == NODE_FILE) {
        char lim[32];
        int64_t size = archive_entry_size_is_set(e) ? archive_entry_size(e) : 0;
        if (size > w->lim->max_file_bytes) {
            snprintf(lim, sizeof(lim), "%lld", (long long)w->lim->max_file_bytes);
            return refuse(w, path, "leave large files out with .kilnignore; data belongs in a data channel",
                          ": it passes the limit of %s bytes for one file", lim);
        }
        if (size > w->lim->max_total_bytes - w->st.bytes) {
            snprintf(lim, sizeof(lim), "%lld", (long long)w->lim->max_total_bytes);
            return refuse(w, path, "leave large files out with .kilnignore; data belongs in a data channel",
                          ": the archive passes the limit of %s bytes uncompressed", lim);
        }
    }
    if (tree_add(&w->tree, path, kind))
        return kiln_err_set(w->err, KILN_ENOMEM, NULL, "out of memory");
    if (kind == NODE_FILE)
        w->st.files++;

    int pfd = -1, fd = -1;
    rc = 0;
    if (w->root >= 0 && (pfd = open_parent(w, path)) < 0)
        return io_fail(w, path, "open its directory");
    if (kind == NODE_DIR) {
        if (pfd >= 0 && mkdirat(pfd, base_name(path), 0755) != 0)
            rc = io_fail(w, path, "mkdir");
    } else if (kind == NODE_LINK) {
        if (pfd >= 0 && symlinkat(target, pfd, base_name(path)) != 0)
            rc = io_fail(w, path, "symlink");
    } else if (hard) {
        if (pfd >= 0) {
            int tfd = open_parent(w, tpath);
            if (tfd < 0 || linkat(tfd, base_name(tpath), pfd, base_name(path), 0) != 0)
                rc = io_fail(w, path, "link");
            if (tfd >= 0)
                close(tfd);
        }
    } else {
        mode_t mode = (perm & 0111) ? 0755 : 0644;
        if (pfd >= 0) {
            fd = openat(pfd, base_name(path), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
            if (fd < 0)
                rc = io_fail(w, path, "create");
        }
        if (rc == 0)
            rc = file_data(w, path, fd);
        if (rc == 0 && fd >= 0 && fchmod(fd, mode) != 0)
            rc = io_fail(w, path, "chmod");
    }
    if (fd >= 0)
        close(fd);
    if (pfd >= 0)
        close(pfd);
    return rc;
}

/* Reads every entry of the archive w->a was opened on. */
static int walk_all(walk_t *w)
{
    int64_t allowance = w->lim->max_total_bytes + (w->lim->max_entries + 2) * HEADER_ALLOWANCE;
    bool first = true;
    for (;;) {
        struct archive_entry *e = NULL;
        int r = archive_read_next_header(w->a, &e);
        if (r == ARCHIVE_EOF)
            break;
        if (first && (r < ARCHIVE_WARN || archive_filter_code(w->a, 0) != ARCHIVE_FILTER_GZIP)) {
            kiln_err_set(w->err, KILN_EINVAL, "archive", "the upload is not a gzip'd tar archive");
            kiln_err_hint(w->err, "send the output of tar -czf, or use kiln code push DIR");
            return KILN_EINVAL;
        }
        first = false;
        if (r < ARCHIVE_WARN) {
            kiln_err_set(w->err, KILN_EINVAL, "archive", "the archive is damaged after %lld entries: %s",
                         (long long)w->st.entries, archive_error_string(w->a));
            kiln_err_hint(w->err, "pack the directory again (kiln code push)");
            return KILN_EINVAL;
        }
        if (archive_filter_bytes(w->a, 0) > allowance) {
            char lim[32];
            snprintf(lim, sizeof(lim), "%lld", (long long)w->lim->max_total_bytes);
            return refuse(w, archive_entry_pathname(e), NULL, ": the archive passes the limit of %s bytes uncompressed",
                          lim);
        }
        int rc = one_entry(w, e);
        if (rc)
            return rc;
    }
    if (first) {
        /* an empty stream, or one libarchive found nothing in */
        kiln_err_set(w->err, KILN_EINVAL, "archive", "the upload is not a gzip'd tar archive");
        kiln_err_hint(w->err, "send the output of tar -czf, or use kiln code push DIR");
        return KILN_EINVAL;
    }
    if (w->st.files == 0) {
        kiln_err_set(w->err, KILN_EINVAL, "archive", "the archive holds no files");
        kiln_err_hint(w->err, "pack the directory that holds the entry point");
        return KILN_EINVAL;
    }
    return 0;
}

static struct archive *reader_new(void)
{
    struct archive *a = archive_read_new();
    if (!a)
        return NULL;
    if (archive_read_support_filter_gzip(a) != ARCHIVE_OK || archive_read_support_format_tar(a) != ARCHIVE_OK) {
        archive_read_free(a);
        return NULL;
    }
    return a;
}

/* Runs the walk over data (when data) or fd. */
static int walk_run(const void *data, size_t len, int fd, int root, const code_limits_t *lim, code_stats_t *st,
                    kiln_err_t *err)
{
    kiln_err_t local;
    if (!err)
        err = &local;
    kiln_err_clear(err);
    walk_t w = {.lim = lim, .root = root, .err = err};
    code_limits_t def;
    if (!lim) {
        code_limits_default(&def, 0);
        w.lim = &def;
    }
    w.a = reader_new();
    if (!w.a)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    int r = data ? archive_read_open_memory(w.a, data, len) : archive_read_open_fd(w.a, fd, READ_BLOCK);
    int rc;
    if (r != ARCHIVE_OK) {
        /* open reads the first block to choose the format: a failure here is the content's */
        rc = kiln_err_set(err, KILN_EINVAL, "archive", "the upload is not a gzip'd tar archive");
        kiln_err_hint(err, "send the output of tar -czf, or use kiln code push DIR");
    } else {
        rc = walk_all(&w);
    }
    archive_read_free(w.a);
    tree_free(&w.tree);
    if (st)
        *st = w.st;
    return rc;
}

int code_archive_check(const void *data, size_t len, const code_limits_t *lim, code_stats_t *st, kiln_err_t *err)
{
    static const char empty[1];
    return walk_run(len ? data : empty, len, -1, -1, lim, st, err);
}

int code_archive_check_fd(int fd, const code_limits_t *lim, code_stats_t *st, kiln_err_t *err)
{
    return walk_run(NULL, 0, fd, -1, lim, st, err);
}

/* ---- extraction ---------------------------------------------------------------------------------- */

/* Set by rm_one when a file or directory could not be removed (nftw's callback has no argument of
 * its own); the walk goes on so that as much as can be removed is. */
static _Thread_local bool rm_failed;

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)ftw;
    if ((flag == FTW_DP ? rmdir(path) : unlink(path)) != 0 && errno != ENOENT)
        rm_failed = true;
    return 0;
}

int code_tree_remove(const char *path)
{
    /* FTW_PHYS: links are removed, never followed; FTW_DEPTH: contents before their directory */
    rm_failed = false;
    if (nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT)
        return KILN_EIO;
    return rm_failed ? KILN_EIO : 0;
}

int code_archive_extract_fd(int fd, const char *dest, const code_limits_t *lim, code_stats_t *st, kiln_err_t *err)
{
    struct stat sb;
    if (lstat(dest, &sb) == 0)
        return kiln_err_set(err, KILN_EEXIST, NULL, "could not extract into %s: it exists", dest);
    char tmp[PATH_MAX];
    if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp-XXXXXX", dest) >= sizeof(tmp))
        return kiln_err_set(err, KILN_EINVAL, NULL, "the extraction directory's path is too long");
    if (!mkdtemp(tmp))
        return kiln_err_set(err, KILN_EIO, NULL, "could not create a directory beside %s: %s", dest, strerror(errno));
    int root = open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int rc;
    if (root < 0)
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not open %s: %s", tmp, strerror(errno));
    else
        rc = walk_run(NULL, 0, fd, root, lim, st, err);
    if (rc == 0 && fchmod(root, 0755) != 0)
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not chmod %s: %s", tmp, strerror(errno));
    if (root >= 0)
        close(root);
    if (rc == 0 && rename(tmp, dest) != 0)
        rc = errno == EEXIST || errno == ENOTEMPTY
                 ? kiln_err_set(err, KILN_EEXIST, NULL, "could not extract into %s: it exists", dest)
                 : kiln_err_set(err, KILN_EIO, NULL, "could not rename %s into place: %s", tmp, strerror(errno));
    if (rc)
        code_tree_remove(tmp);
    return rc;
}
