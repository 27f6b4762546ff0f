/* pack.c - a source directory into a gzip'd tar (clients: kiln code push, kiln submit
 * --source-dir): a walk in name order that skips what .kilnignore excludes, refuses what no
 * archive may hold, and writes normalised entries so the same tree gives the same bytes. */
#include "code/code.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define IGNORE_FILE ".kilnignore"
#define IGNORE_MAX_BYTES (1 << 20)
#define COPY_BLOCK (256 * 1024)

typedef struct pack {
    struct archive *a;
    const code_limits_t *lim;
    code_ignore_t *ig;
    code_stats_t st;
    int fd;
    int64_t written, max_bytes;
    bool too_big, write_failed;
    int write_errno;
    char *buf;
    kiln_err_t *err;
} pack_t;

static la_ssize_t pack_write(struct archive *a, void *ud, const void *buf, size_t n)
{
    (void)a;
    pack_t *p = ud;
    if (p->max_bytes > 0 && p->written + (int64_t)n > p->max_bytes) {
        p->too_big = true;
        return -1;
    }
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(p->fd, (const char *)buf + done, n - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            p->write_failed = true;
            p->write_errno = errno;
            return -1;
        }
        done += (size_t)w;
    }
    p->written += (int64_t)n;
    return (la_ssize_t)n;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int pack_fail_write(pack_t *p)
{
    if (p->err->status)
        return p->err->status;
    if (p->too_big) {
        kiln_err_set(p->err, KILN_ETOOBIG, "source", "the packed code passes the limit of %lld MiB",
                     (long long)(p->max_bytes >> 20));
        kiln_err_hint(p->err, "leave large files out with .kilnignore; data belongs in a data channel");
        return KILN_ETOOBIG;
    }
    if (p->write_failed)
        return kiln_err_set(p->err, KILN_EIO, NULL, "could not write the archive: %s", strerror(p->write_errno));
    return kiln_err_set(p->err, KILN_EIO, NULL, "could not write the archive: %s", archive_error_string(p->a));
}

static int refuse_local(pack_t *p, const char *rel, const char *what)
{
    kiln_err_set(p->err, KILN_EINVAL, "source", "\"%.200s\" %s", rel, what);
    kiln_err_hint(p->err, "leave it out with a line in %s", IGNORE_FILE);
    return KILN_EINVAL;
}

static int limit_check(pack_t *p, const char *rel, int64_t size)
{
    if (++p->st.entries > p->lim->max_entries) {
        kiln_err_set(p->err, KILN_EINVAL, "source", "the directory holds more than %lld entries to pack (at \"%.200s\")",
                     (long long)p->lim->max_entries, rel);
        kiln_err_hint(p->err, "leave build outputs and data out with %s", IGNORE_FILE);
        return KILN_EINVAL;
    }
    if (size > p->lim->max_file_bytes || size > p->lim->max_total_bytes - p->st.bytes) {
        kiln_err_set(p->err, KILN_ETOOBIG, "source", "\"%.200s\" (%lld bytes) passes the limit of %lld bytes %s",
                     rel, (long long)size,
                     (long long)(size > p->lim->max_file_bytes ? p->lim->max_file_bytes : p->lim->max_total_bytes),
                     size > p->lim->max_file_bytes ? "for one file" : "uncompressed in all");
        kiln_err_hint(p->err, "leave large files out with %s; data belongs in a data channel", IGNORE_FILE);
        return KILN_ETOOBIG;
    }
    return 0;
}

static int write_header(pack_t *p, const char *rel, mode_t type, mode_t perm, int64_t size, const char *link)
{
    struct archive_entry *e = archive_entry_new();
    if (!e)
        return kiln_err_set(p->err, KILN_ENOMEM, NULL, "out of memory");
    archive_entry_set_pathname_utf8(e, rel);
    archive_entry_set_filetype(e, type);
    archive_entry_set_perm(e, perm);
    archive_entry_set_size(e, size);
    archive_entry_set_mtime(e, 0, 0);
    archive_entry_set_uid(e, 0);
    archive_entry_set_gid(e, 0);
    if (link)
        archive_entry_set_symlink_utf8(e, link);
    int r = archive_write_header(p->a, e);
    archive_entry_free(e);
    return r < ARCHIVE_WARN ? pack_fail_write(p) : 0;
}

static int pack_file(pack_t *p, int dfd, const char *name, const char *rel, const struct stat *sb)
{
    int rc = limit_check(p, rel, sb->st_size);
    if (rc)
        return rc;
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat now;
    if (fd < 0 || fstat(fd, &now) != 0) {
        rc = kiln_err_set(p->err, KILN_EIO, "source", "could not read \"%.200s\": %s", rel, strerror(errno));
        if (fd >= 0)
            close(fd);
        return rc;
    }
    rc = write_header(p, rel, AE_IFREG, (now.st_mode & 0111) ? 0755 : 0644, now.st_size, NULL);
    int64_t left = now.st_size;
    while (rc == 0 && left > 0) {
        ssize_t n = read(fd, p->buf, (size_t)KILN_MIN(left, (int64_t)COPY_BLOCK));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            rc = kiln_err_set(p->err, KILN_EIO, "source", "\"%.200s\" changed or could not be read while it was packed",
                              rel);
            break;
        }
        if (archive_write_data(p->a, p->buf, (size_t)n) != n)
            rc = pack_fail_write(p);
        left -= n;
    }
    close(fd);
    if (rc == 0) {
        p->st.files++;
        p->st.bytes += now.st_size;
    }
    return rc;
}

static int pack_dir(pack_t *p, int dfd, const char *rel, int depth);

static int pack_entry(pack_t *p, int dfd, const char *name, const char *rel, int depth)
{
    struct stat sb;
    if (fstatat(dfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0)
        return kiln_err_set(p->err, KILN_EIO, "source", "could not read \"%.200s\": %s", rel, strerror(errno));
    bool is_dir = S_ISDIR(sb.st_mode);
    if (code_ignore_match(p->ig, rel, is_dir))
        return 0;
    size_t rl = strlen(rel);
    if (kiln_utf8_check(rel, rl) != rl)
        return refuse_local(p, rel, "has a name that is not UTF-8");
    if (rl > CODE_PATH_MAX)
        return refuse_local(p, rel, "has a path longer than 1024 bytes");
    if (S_ISREG(sb.st_mode)) {
        if (sb.st_mode & (S_ISUID | S_ISGID))
            return refuse_local(p, rel, "is set-user-ID or set-group-ID");
        return pack_file(p, dfd, name, rel, &sb);
    }
    if (S_ISLNK(sb.st_mode)) {
        char target[CODE_PATH_MAX + 1];
        ssize_t n = readlinkat(dfd, name, target, sizeof(target));
        if (n < 0 || n > CODE_PATH_MAX)
            return refuse_local(p, rel, "is a symbolic link that could not be read");
        target[n] = '\0';
        int rc = limit_check(p, rel, 0);
        return rc ? rc : write_header(p, rel, AE_IFLNK, 0777, 0, target);
    }
    if (is_dir) {
        int rc = limit_check(p, rel, 0);
        if (rc == 0)
            rc = write_header(p, rel, AE_IFDIR, 0755, 0, NULL);
        if (rc)
            return rc;
        int sub = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0)
            return kiln_err_set(p->err, KILN_EIO, "source", "could not open \"%.200s\": %s", rel, strerror(errno));
        rc = pack_dir(p, sub, rel, depth + 1);
        close(sub);
        return rc;
    }
    return refuse_local(p, rel, S_ISFIFO(sb.st_mode) ? "is a FIFO" : S_ISSOCK(sb.st_mode) ? "is a socket"
                                                                                          : "is a device file");
}

/* Packs the entries of the open directory dfd (rel: its path, "" at the top), in name order. */
static int pack_dir(pack_t *p, int dfd, const char *rel, int depth)
{
    if (depth > CODE_PATH_MAX / 2)
        return refuse_local(p, rel, "is nested too deep");
    int dup_fd = dup(dfd);
    DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    if (!d) {
        if (dup_fd >= 0)
            close(dup_fd);
        return kiln_err_set(p->err, KILN_EIO, "source", "could not read directory \"%.200s\"", rel[0] ? rel : ".");
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **nv = realloc(names, cap * sizeof(*nv));
            if (!nv) {
                rc = kiln_err_set(p->err, KILN_ENOMEM, NULL, "out of memory");
                break;
            }
            names = nv;
        }
        if (!(names[n] = strdup(de->d_name)))
            rc = kiln_err_set(p->err, KILN_ENOMEM, NULL, "out of memory");
        else
            n++;
    }
    closedir(d);
    if (n)
        qsort(names, n, sizeof(*names), name_cmp);
    for (size_t i = 0; i < n && rc == 0; i++) {
        size_t len = strlen(rel) + strlen(names[i]) + 2;
        char *child = malloc(len);
        if (!child) {
            rc = kiln_err_set(p->err, KILN_ENOMEM, NULL, "out of memory");
            break;
        }
        snprintf(child, len, "%s%s%s", rel, rel[0] ? "/" : "", names[i]);
        rc = pack_entry(p, dfd, names[i], child, depth);
        free(child);
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc;
}

/* Reads dir/.kilnignore when it exists. */
static int read_ignore(int dfd, code_ignore_t **out, kiln_err_t *err)
{
    char *text = NULL;
    ssize_t len = 0;
    int fd = openat(dfd, IGNORE_FILE, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        struct stat sb;
        if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size > IGNORE_MAX_BYTES) {
            close(fd);
            return kiln_err_set(err, KILN_EINVAL, IGNORE_FILE, "%s must be a file of at most 1 MiB", IGNORE_FILE);
        }
        text = malloc((size_t)sb.st_size + 1);
        len = text ? read(fd, text, (size_t)sb.st_size) : -1;
        close(fd);
        if (len < 0) {
            free(text);
            return kiln_err_set(err, KILN_EIO, IGNORE_FILE, "could not read %s", IGNORE_FILE);
        }
    }
    int rc = code_ignore_parse(text, (size_t)len, out, err);
    free(text);
    return rc;
}

int code_pack_dir(const char *dir, int fd, const code_limits_t *lim, int64_t max_archive_bytes, code_stats_t *st,
                  kiln_err_t *err)
{
    kiln_err_t local;
    if (!err)
        err = &local;
    kiln_err_clear(err);
    code_limits_t def;
    if (!lim) {
        code_limits_default(&def, max_archive_bytes);
        lim = &def;
    }
    pack_t p = {.lim = lim, .fd = fd, .max_bytes = max_archive_bytes, .err = err};
    off_t start = lseek(fd, 0, SEEK_CUR);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        kiln_err_set(err, KILN_ENOTFOUND, "source", "%s is not a directory that can be read: %s", dir,
                     strerror(errno));
        return KILN_ENOTFOUND;
    }
    int rc = read_ignore(dfd, &p.ig, err);
    if (rc == 0 && !(p.buf = malloc(COPY_BLOCK)))
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    if (rc == 0) {
        p.a = archive_write_new();
        if (!p.a || archive_write_add_filter_gzip(p.a) != ARCHIVE_OK ||
            archive_write_set_format_pax_restricted(p.a) != ARCHIVE_OK)
            rc = kiln_err_set(err, KILN_ENOMEM, NULL, "could not set up the archive writer");
    }
    if (rc == 0) {
        /* no time or name in the gzip header: the same tree packs to the same bytes */
        archive_write_set_options(p.a, "gzip:!timestamp");
        archive_write_set_bytes_in_last_block(p.a, 1);
        if (archive_write_open2(p.a, &p, NULL, pack_write, NULL, NULL) != ARCHIVE_OK)
            rc = pack_fail_write(&p);
    }
    if (rc == 0)
        rc = pack_dir(&p, dfd, "", 0);
    if (p.a) {
        if (archive_write_close(p.a) != ARCHIVE_OK && rc == 0)
            rc = pack_fail_write(&p);
        archive_write_free(p.a);
    }
    close(dfd);
    code_ignore_destroy(p.ig);
    free(p.buf);
    if (rc == 0 && p.st.files == 0) {
        kiln_err_set(err, KILN_EINVAL, "source", "%s holds no files to pack", dir);
        kiln_err_hint(err, "check %s: it may exclude everything", IGNORE_FILE);
        rc = KILN_EINVAL;
    }
    /* the archive must pass the reader kilnd and the agents use (a link leaving the tree, ...) */
    if (rc == 0 && start >= 0 && lseek(fd, start, SEEK_SET) == start) {
        rc = code_archive_check_fd(fd, lim, NULL, err);
        if (rc == KILN_EINVAL)
            kiln_err_hint(err, "leave it out with a line in %s", IGNORE_FILE);
        lseek(fd, 0, SEEK_END);
    }
    if (st)
        *st = p.st;
    return rc;
}
