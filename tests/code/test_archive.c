/* test_archive.c - code archives (code/): hostile archives built here with libarchive's writer
 * (absolute paths, "..", links leaving the tree, a file written through a link, hard links to
 * /etc/passwd, device files, FIFOs, set-user-ID bits, 10,001 entries, a gzip bomb, duplicates,
 * what is not a gzip'd tar) refused by the in-memory check and by extraction alike, naming the
 * entry, with nothing written outside the extraction directory; a good archive extracted with its
 * files, modes and links. */
#include "code/code.h"

#include <archive.h>
#include <archive_entry.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- building archives ------------------------------------------------------------------------ */

typedef struct ent {
    const char *path;
    mode_t type;         /* AE_IFREG (default when 0), AE_IFDIR, AE_IFLNK, AE_IFCHR, ... */
    mode_t perm;         /* 0: 0644 */
    const char *data;    /* NULL: size zero bytes */
    int64_t size;
    const char *link;    /* symbolic link target */
    const char *hard;    /* hard link target */
} ent_t;

typedef struct buf {
    char *p;
    size_t n, cap;
} buf_t;

static la_ssize_t buf_write(struct archive *a, void *ud, const void *data, size_t n)
{
    (void)a;
    buf_t *b = ud;
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
        cr_assert(b->p);
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
    return (la_ssize_t)n;
}

/* An archive of es[0..n): gzip'd unless plain. Caller frees out->p. */
static buf_t mk(const ent_t *es, size_t n, bool plain)
{
    buf_t b = {0};
    struct archive *a = archive_write_new();
    cr_assert(a);
    if (!plain)
        cr_assert_eq(archive_write_add_filter_gzip(a), ARCHIVE_OK);
    cr_assert_eq(archive_write_set_format_pax_restricted(a), ARCHIVE_OK);
    archive_write_set_bytes_in_last_block(a, 1); /* no padding after the gzip stream */
    cr_assert_eq(archive_write_open2(a, &b, NULL, buf_write, NULL, NULL), ARCHIVE_OK);
    static char zeros[65536];
    for (size_t i = 0; i < n; i++) {
        const ent_t *e = &es[i];
        struct archive_entry *ae = archive_entry_new();
        archive_entry_set_pathname(ae, e->path);
        int64_t size = e->data ? (int64_t)strlen(e->data) : e->size;
        if (e->hard) {
            archive_entry_set_filetype(ae, AE_IFREG);
            archive_entry_set_hardlink(ae, e->hard);
            size = 0;
        } else {
            archive_entry_set_filetype(ae, e->type ? e->type : AE_IFREG);
        }
        archive_entry_set_perm(ae, e->perm ? e->perm : (e->type == AE_IFDIR ? 0755 : 0644));
        if (e->link)
            archive_entry_set_symlink(ae, e->link);
        if (e->type == AE_IFCHR || e->type == AE_IFBLK)
            archive_entry_set_rdev(ae, makedev(1, 3));
        bool has_data = !e->hard && (!e->type || e->type == AE_IFREG);
        archive_entry_set_size(ae, has_data ? size : 0);
        cr_assert_geq(archive_write_header(a, ae), ARCHIVE_WARN, "%s", archive_error_string(a));
        if (has_data && e->data)
            archive_write_data(a, e->data, (size_t)size);
        for (int64_t left = has_data && !e->data ? size : 0; left > 0;) {
            size_t k = left > (int64_t)sizeof(zeros) ? sizeof(zeros) : (size_t)left;
            archive_write_data(a, zeros, k);
            left -= (int64_t)k;
        }
        archive_entry_free(ae);
    }
    cr_assert_eq(archive_write_close(a), ARCHIVE_OK);
    archive_write_free(a);
    return b;
}

/* ---- extraction into a fresh directory ---------------------------------------------------------- */

static char top[64];       /* a fresh directory per test; dest is top/x */

static void top_init(void)
{
    snprintf(top, sizeof(top), "/tmp/kiln-code-test.XXXXXX");
    cr_assert(mkdtemp(top));
}

static void top_fini(void)
{
    code_tree_remove(top);
}

/* How many entries top holds (what an extraction left beside dest). */
static int top_entries(void)
{
    DIR *d = opendir(top);
    cr_assert(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    closedir(d);
    return n;
}

/* Extracts b into top/x through a file descriptor. */
static int extract(const buf_t *b, const code_limits_t *lim, code_stats_t *st, kiln_err_t *err)
{
    char path[160], dest[128];
    snprintf(path, sizeof(path), "%s.tgz", top);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, b->p, b->n), (ssize_t)b->n);
    lseek(fd, 0, SEEK_SET);
    snprintf(dest, sizeof(dest), "%s/x", top);
    int rc = code_archive_extract_fd(fd, dest, lim, st, err);
    close(fd);
    unlink(path);
    return rc;
}

/* Both readers refuse b with a message holding want, and extraction leaves nothing at all. */
static void refused(const ent_t *es, size_t n, const code_limits_t *lim, const char *want)
{
    buf_t b = mk(es, n, false);
    kiln_err_t err;
    int rc = code_archive_check(b.p, b.n, lim, NULL, &err);
    cr_assert_eq(rc, KILN_EINVAL, "check accepted it (want \"%s\")", want);
    cr_assert(strstr(err.message, want), "check: %s (want \"%s\")", err.message, want);
    cr_assert_str_eq(err.field, "archive");
    rc = extract(&b, lim, NULL, &err);
    cr_assert_eq(rc, KILN_EINVAL, "extraction accepted it (want \"%s\")", want);
    cr_assert(strstr(err.message, want), "extract: %s (want \"%s\")", err.message, want);
    cr_assert_eq(top_entries(), 0, "the refused extraction left something beside its directory");
    free(b.p);
}

#define REFUSED(lim, want, ...)                                                                              \
    do {                                                                                                     \
        const ent_t es_[] = {__VA_ARGS__};                                                                   \
        refused(es_, sizeof(es_) / sizeof(es_[0]), lim, want);                                               \
    } while (0)

TestSuite(archive, .init = top_init, .fini = top_fini);

/* ---- a good archive ------------------------------------------------------------------------------ */

Test(archive, good_archive_extracts_files_modes_and_links)
{
    const ent_t es[] = {
        {.path = "./", .type = AE_IFDIR},
        {.path = "./train.py", .data = "print('hi')\n"},
        {.path = "./run.sh", .data = "#!/bin/sh\necho run\n", .perm = 0775},
        {.path = "./pkg/", .type = AE_IFDIR, .perm = 0700},
        {.path = "./pkg/model.py", .data = "x = 1\n", .perm = 0600},
        {.path = "deep/a/b/c.txt", .data = "c"}, /* parents not listed */
        {.path = "pkg/link.py", .type = AE_IFLNK, .link = "model.py"},
        {.path = "deep/a/b/up", .type = AE_IFLNK, .link = "../../../train.py"},
        {.path = "deep/top", .type = AE_IFLNK, .link = ".."},
        {.path = "same.py", .hard = "pkg/model.py"},
        {.path = "ünïcode.txt", .data = "u"},
    };
    buf_t b = mk(es, KILN_ARRAY_LEN(es), false);
    code_stats_t st;
    kiln_err_t err;
    cr_assert_eq(code_archive_check(b.p, b.n, NULL, &st, &err), 0, "%s", err.message);
    cr_assert_eq(st.files, 6);
    cr_assert_eq(st.bytes, 12 + 19 + 6 + 1 + 1);
    cr_assert_eq(extract(&b, NULL, &st, &err), 0, "%s", err.message);
    cr_assert_eq(st.files, 6);
    cr_assert_eq(top_entries(), 1, "only the extraction directory itself");
    char p[256], text[64];
    struct stat sb, sb2;
    snprintf(p, sizeof(p), "%s/x/run.sh", top);
    cr_assert_eq(stat(p, &sb), 0);
    cr_assert_eq(sb.st_mode & 07777, 0755);
    snprintf(p, sizeof(p), "%s/x/pkg/model.py", top);
    cr_assert_eq(stat(p, &sb), 0);
    cr_assert_eq(sb.st_mode & 07777, 0644);
    snprintf(p, sizeof(p), "%s/x/pkg", top);
    cr_assert_eq(stat(p, &sb2), 0);
    cr_assert_eq(sb2.st_mode & 07777, 0755);
    snprintf(p, sizeof(p), "%s/x", top);
    cr_assert_eq(stat(p, &sb2), 0);
    cr_assert_eq(sb2.st_mode & 07777, 0755, "the extracted tree is readable once it is in place");
    snprintf(p, sizeof(p), "%s/x/same.py", top);
    cr_assert_eq(stat(p, &sb2), 0);
    cr_assert_eq(sb2.st_ino, sb.st_ino, "a hard link inside the tree stays a hard link");
    snprintf(p, sizeof(p), "%s/x/deep/a/b/up", top);
    int fd = open(p, O_RDONLY);
    cr_assert(fd >= 0, "a link that climbs to the top works");
    cr_assert_eq(read(fd, text, sizeof(text)), 12);
    close(fd);
    cr_assert_eq(memcmp(text, "print('hi')\n", 12), 0);
    snprintf(p, sizeof(p), "%s/x/ünïcode.txt", top);
    cr_assert_eq(access(p, F_OK), 0);
    free(b.p);
}

Test(archive, extraction_refuses_an_existing_destination)
{
    const ent_t es[] = {{.path = "a.py", .data = "1"}};
    buf_t b = mk(es, 1, false);
    kiln_err_t err;
    char dest[128];
    snprintf(dest, sizeof(dest), "%s/x", top);
    cr_assert_eq(mkdir(dest, 0700), 0);
    cr_assert_eq(extract(&b, NULL, NULL, &err), KILN_EEXIST);
    cr_assert_eq(top_entries(), 1);
    free(b.p);
}

/* ---- paths ----------------------------------------------------------------------------------------- */

Test(archive, absolute_paths_are_refused)
{
    REFUSED(NULL, "archive entry \"/etc/cron.d/x\": an absolute path is not allowed",
            {.path = "a.py", .data = "1"}, {.path = "/etc/cron.d/x", .data = "* * * * * root sh\n"});
}

Test(archive, dotdot_is_refused)
{
    REFUSED(NULL, "archive entry \"../x\": a path must not climb out of the tree with \"..\"",
            {.path = "a.py", .data = "1"}, {.path = "../x", .data = "escaped"});
    REFUSED(NULL, "archive entry \"a/../../x\"", {.path = "a/../../x", .data = "escaped"});
    REFUSED(NULL, "must not climb", {.path = "a/b/..", .type = AE_IFDIR});
}

Test(archive, control_characters_and_long_names_are_refused)
{
    REFUSED(NULL, "a name must be UTF-8 text without control characters", {.path = "a\nb.py", .data = "1"});
    REFUSED(NULL, "a name must be UTF-8 text", {.path = "bad\xff.py", .data = "1"});
    char longname[300];
    memset(longname, 'a', 299);
    longname[299] = '\0';
    REFUSED(NULL, "a name may have at most 255 bytes", {.path = longname, .data = "1"});
}

Test(archive, duplicates_are_refused)
{
    REFUSED(NULL, "archive entry \"a.py\": it appears twice in the archive", {.path = "a.py", .data = "1"},
            {.path = "a.py", .data = "2"});
    /* a directory named twice is fine */
    const ent_t ok[] = {{.path = "d/", .type = AE_IFDIR}, {.path = "d/f", .data = "1"}, {.path = "d/", .type = AE_IFDIR}};
    buf_t b = mk(ok, 3, false);
    kiln_err_t err;
    cr_assert_eq(code_archive_check(b.p, b.n, NULL, NULL, &err), 0, "%s", err.message);
    free(b.p);
}

/* ---- links ------------------------------------------------------------------------------------------ */

Test(archive, symlinks_leaving_the_tree_are_refused)
{
    REFUSED(NULL, "archive entry \"etc\": a symbolic link to an absolute path (\"/etc\") leads out of the tree",
            {.path = "a.py", .data = "1"}, {.path = "etc", .type = AE_IFLNK, .link = "/etc"});
    REFUSED(NULL, "archive entry \"up\": its symbolic link (\"..\") leads out of the tree",
            {.path = "up", .type = AE_IFLNK, .link = ".."});
    REFUSED(NULL, "archive entry \"d/up\": its symbolic link (\"../../x\") leads out of the tree",
            {.path = "d/up", .type = AE_IFLNK, .link = "../../x"});
    /* ".." after a name: where it leads would depend on other links */
    REFUSED(NULL, "archive entry \"l\": its symbolic link (\"d/../..\") leads out of the tree",
            {.path = "d/", .type = AE_IFDIR}, {.path = "l", .type = AE_IFLNK, .link = "d/../.."});
}

Test(archive, a_file_written_through_a_symlink_is_refused)
{
    /* the link itself stays inside; what follows may not go through it */
    REFUSED(NULL, "archive entry \"l/x.py\": it would be written through the symbolic link \"l\"",
            {.path = "sub/", .type = AE_IFDIR}, {.path = "l", .type = AE_IFLNK, .link = "sub"},
            {.path = "l/x.py", .data = "through"});
    /* the classic: a link to somewhere, then a file of that name replacing it */
    REFUSED(NULL, "archive entry \"l\": it appears twice", {.path = "a.py", .data = "1"},
            {.path = "l", .type = AE_IFLNK, .link = "a.py"}, {.path = "l", .data = "replaced"});
    /* a file below a file */
    REFUSED(NULL, "archive entry \"a.py/x\": it lies below \"a.py\", which is not a directory",
            {.path = "a.py", .data = "1"}, {.path = "a.py/x", .data = "2"});
}

Test(archive, hard_links_leaving_the_tree_are_refused)
{
    REFUSED(NULL, "archive entry \"passwd\": its hard link (to \"/etc/passwd\") leads out of the tree",
            {.path = "a.py", .data = "1"}, {.path = "passwd", .hard = "/etc/passwd"});
    REFUSED(NULL, "archive entry \"p\": its hard link (to \"../../etc/passwd\") leads out of the tree",
            {.path = "p", .hard = "../../etc/passwd"});
    REFUSED(NULL, "archive entry \"p\": its hard link names \"later.py\", which is not a file earlier in the archive",
            {.path = "p", .hard = "later.py"}, {.path = "later.py", .data = "1"});
    REFUSED(NULL, "its hard link names \"d\", which is not a file", {.path = "d/", .type = AE_IFDIR},
            {.path = "d/f", .data = "1"}, {.path = "p", .hard = "d"});
    REFUSED(NULL, "its hard link names \"l\", which is not a file", {.path = "a.py", .data = "1"},
            {.path = "l", .type = AE_IFLNK, .link = "a.py"}, {.path = "p", .hard = "l"});
    struct stat sb;
    cr_assert_eq(stat("/etc/passwd", &sb), 0);
    cr_assert_eq(sb.st_nlink, 1, "nothing linked to /etc/passwd");
}

/* ---- kinds and bits ------------------------------------------------------------------------------- */

Test(archive, devices_fifos_sockets_and_setuid_are_refused)
{
    REFUSED(NULL, "archive entry \"null\" is a device file", {.path = "a.py", .data = "1"},
            {.path = "null", .type = AE_IFCHR});
    REFUSED(NULL, "archive entry \"sda\" is a device file", {.path = "sda", .type = AE_IFBLK});
    REFUSED(NULL, "archive entry \"pipe\" is a FIFO", {.path = "pipe", .type = AE_IFIFO});
    REFUSED(NULL, "archive entry \"tool\": set-user-ID and set-group-ID files are not allowed",
            {.path = "tool", .data = "\x7f" "ELF", .perm = 04755});
    REFUSED(NULL, "archive entry \"tool\": set-user-ID", {.path = "tool", .data = "x", .perm = 02755});
}

/* ---- limits --------------------------------------------------------------------------------------- */

Test(archive, more_than_10000_entries_are_refused)
{
    ent_t *es = calloc(10001, sizeof(*es));
    char (*names)[16] = calloc(10001, 16);
    for (int i = 0; i < 10001; i++) {
        snprintf(names[i], 16, "f%05d", i);
        es[i].path = names[i];
        es[i].data = "";
    }
    refused(es, 10001, NULL, "archive entry \"f10000\": the archive holds more than 10000 entries");
    buf_t b = mk(es, 10000, false);
    kiln_err_t err;
    code_stats_t st;
    cr_assert_eq(code_archive_check(b.p, b.n, NULL, &st, &err), 0, "10,000 entries pass: %s", err.message);
    cr_assert_eq(st.entries, 10000);
    free(b.p);
    /* implied directories count too */
    code_limits_t lim;
    code_limits_default(&lim, 0);
    lim.max_entries = 3;
    REFUSED(&lim, "archive entry \"a/b/c/d.py\": the archive holds more than 3 entries", {.path = "a/b/c/d.py", .data = "1"});
    free(es);
    free(names);
}

Test(archive, a_gzip_bomb_stops_at_the_limit)
{
    /* 1 MiB archives: 10 MiB uncompressed at most; 64 MiB of zeros compress to about 64 KiB */
    code_limits_t lim;
    code_limits_default(&lim, 1 << 20);
    cr_assert_eq(lim.max_total_bytes, 10 << 20);
    const ent_t bomb[] = {{.path = "a.py", .data = "1"}, {.path = "zeros.bin", .size = 64 << 20}};
    buf_t b = mk(bomb, 2, false);
    cr_assert_lt(b.n, 1 << 20, "the bomb is small (%zu bytes)", b.n);
    free(b.p);
    refused(bomb, 2, &lim, "archive entry \"zeros.bin\": it passes the limit of 10485760 bytes for one file");
    /* many files, each under the per-file limit, together past the total */
    lim.max_file_bytes = 4 << 20;
    REFUSED(&lim, "archive entry \"c.bin\": the archive passes the limit of 10485760 bytes uncompressed",
            {.path = "a.bin", .size = 4 << 20}, {.path = "b.bin", .size = 4 << 20}, {.path = "c.bin", .size = 4 << 20});
}

/* ---- what is not a code archive --------------------------------------------------------------------- */

Test(archive, what_is_not_a_gzipped_tar_is_refused)
{
    kiln_err_t err;
    cr_assert_eq(code_archive_check("", 0, NULL, NULL, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "not a gzip'd tar"), "%s", err.message);
    cr_assert_eq(code_archive_check("hello world, this is text", 25, NULL, NULL, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "not a gzip'd tar"), "%s", err.message);
    const ent_t es[] = {{.path = "a.py", .data = "print(1)\n"}};
    buf_t plain = mk(es, 1, true);
    cr_assert_eq(code_archive_check(plain.p, plain.n, NULL, NULL, &err), KILN_EINVAL, "an uncompressed tar");
    cr_assert(strstr(err.message, "not a gzip'd tar"), "%s", err.message);
    free(plain.p);
    /* a gzip'd tar cut short */
    const ent_t big[] = {{.path = "a.py", .data = "print(1)\n"}, {.path = "b.bin", .size = 1 << 20}};
    buf_t b = mk(big, 2, false);
    int rc = code_archive_check(b.p, b.n / 2, NULL, NULL, &err);
    cr_assert_eq(rc, KILN_EINVAL);
    cr_assert(strstr(err.message, "damaged"), "%s", err.message);
    free(b.p);
    /* no files at all */
    const ent_t dirs[] = {{.path = "d/", .type = AE_IFDIR}};
    buf_t d = mk(dirs, 1, false);
    cr_assert_eq(code_archive_check(d.p, d.n, NULL, NULL, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "holds no files"), "%s", err.message);
    free(d.p);
}

/* A tree that cannot all be removed is reported (KILN_EIO), after removing what could be: here a
 * file in a directory the remover may not write. Root may write any directory, so as root the
 * removal runs in a child that has become nobody (65534); otherwise the directory is made
 * read-only. */
Test(archive, a_tree_that_cannot_all_be_removed_is_reported, .init = top_init, .fini = top_fini)
{
    char sub[128], f[160], g[160];
    snprintf(sub, sizeof sub, "%s/locked", top);
    snprintf(f, sizeof f, "%s/kept", sub);
    snprintf(g, sizeof g, "%s/loose", top);
    cr_assert_eq(mkdir(sub, 0755), 0);
    FILE *fp = fopen(f, "w");
    cr_assert(fp);
    fclose(fp);
    cr_assert(fp = fopen(g, "w"));
    fclose(fp);
    bool root = geteuid() == 0;
    if (root)
        cr_assert_eq(chmod(top, 0777), 0); /* nobody may remove what top holds directly */
    else
        cr_assert_eq(chmod(sub, 0555), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        if (root && (setgid(65534) != 0 || setuid(65534) != 0))
            _exit(3);
        _exit(code_tree_remove(top) == KILN_EIO ? 0 : 1);
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "code_tree_remove did not report the file it could not "
              "remove (child exit %d)", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    struct stat sb;
    cr_assert_eq(stat(f, &sb), 0, "the file that could not be removed is gone");
    cr_assert_neq(stat(g, &sb), 0, "what could be removed was left");
    chmod(sub, 0755);
}
