/* test_pack.c - .kilnignore patterns (gitignore's syntax: anchoring, "!", directory-only
 * patterns, "**", classes, escapes, comments) and packing a directory: what is excluded stays
 * out (also below an excluded directory), the same tree packs to the same bytes, what no archive
 * may hold is refused before anything is sent, and the result extracts to the same files. */
#include "code/code.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static code_ignore_t *ig_of(const char *text)
{
    code_ignore_t *ig = NULL;
    kiln_err_t err;
    cr_assert_eq(code_ignore_parse(text, strlen(text), &ig, &err), 0, "%s", err.message);
    return ig;
}

#define EXCL(ig, path, dir) cr_assert(code_ignore_match(ig, path, dir), "%s should be excluded", path)
#define INCL(ig, path, dir) cr_assert_not(code_ignore_match(ig, path, dir), "%s should be kept", path)

Test(ignore, names_match_at_any_depth_and_anchored_paths_at_the_top)
{
    code_ignore_t *ig = ig_of("# build outputs\n*.pyc\n/data\ndocs/tmp\n\n");
    EXCL(ig, "a.pyc", false);
    EXCL(ig, "pkg/sub/b.pyc", false);
    INCL(ig, "a.py", false);
    INCL(ig, "pyc", false);
    EXCL(ig, "data", true);
    INCL(ig, "pkg/data", true); /* "/data" is anchored to the top */
    EXCL(ig, "docs/tmp", false);
    INCL(ig, "x/docs/tmp", false); /* a '/' inside anchors too */
    INCL(ig, "# build outputs", false);
    code_ignore_destroy(ig);
}

Test(ignore, negation_and_the_last_line_decides)
{
    code_ignore_t *ig = ig_of("*.log\n!keep.log\nkeep.log.d/\n");
    EXCL(ig, "a.log", false);
    INCL(ig, "keep.log", false);
    INCL(ig, "sub/keep.log", false);
    code_ignore_destroy(ig);
    ig = ig_of("!keep.log\n*.log\n");
    EXCL(ig, "keep.log", false);
    code_ignore_destroy(ig);
}

Test(ignore, directory_only_patterns)
{
    code_ignore_t *ig = ig_of("build/\n");
    EXCL(ig, "build", true);
    EXCL(ig, "sub/build", true);
    INCL(ig, "build", false); /* a file named build stays */
    code_ignore_destroy(ig);
}

Test(ignore, double_star)
{
    code_ignore_t *ig = ig_of("**/cache\nlogs/**\na/**/b\n");
    EXCL(ig, "cache", true);
    EXCL(ig, "x/y/cache", false);
    EXCL(ig, "logs/one", false);
    EXCL(ig, "logs/deep/two", false);
    INCL(ig, "logs", true);
    EXCL(ig, "a/b", false);
    EXCL(ig, "a/x/b", false);
    EXCL(ig, "a/x/y/b", false);
    INCL(ig, "a/xb", false);
    INCL(ig, "z/a/x/b", false);
    code_ignore_destroy(ig);
    /* "**" inside a name is two "*": it does not cross '/' */
    ig = ig_of("foo**bar\n");
    EXCL(ig, "fooXbar", false);
    INCL(ig, "foo/bar", false);
    code_ignore_destroy(ig);
}

Test(ignore, wildcards_classes_and_escapes)
{
    code_ignore_t *ig = ig_of("file?.txt\n[abc]x\n[!0-9]y\n\\#hash\n\\!bang\ntrail\\ \nsp   \n");
    EXCL(ig, "file1.txt", false);
    INCL(ig, "file12.txt", false);
    INCL(ig, "file/.txt", false);
    EXCL(ig, "bx", false);
    INCL(ig, "dx", false);
    EXCL(ig, "zy", false);
    INCL(ig, "5y", false);
    EXCL(ig, "#hash", false);
    EXCL(ig, "!bang", false);
    EXCL(ig, "trail ", false); /* an escaped trailing space stays */
    EXCL(ig, "sp", false);     /* unescaped trailing spaces go */
    code_ignore_destroy(ig);
}

Test(ignore, git_is_excluded_unless_reincluded)
{
    code_ignore_t *ig = ig_of("");
    EXCL(ig, ".git", true);
    INCL(ig, ".gitignore", false);
    code_ignore_destroy(ig);
    ig = ig_of("!.git/\n");
    INCL(ig, ".git", true);
    code_ignore_destroy(ig);
}

Test(ignore, bad_text_is_refused)
{
    code_ignore_t *ig = NULL;
    kiln_err_t err;
    cr_assert_eq(code_ignore_parse("ok\n\xff\xfe\n", 6, &ig, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "line 2"), "%s", err.message);
    cr_assert_null(ig);
}

/* ---- packing ------------------------------------------------------------------------------------ */

static char dir[64];

static void dir_init(void)
{
    snprintf(dir, sizeof(dir), "/tmp/kiln-pack-test.XXXXXX");
    cr_assert(mkdtemp(dir));
}

static void dir_fini(void)
{
    code_tree_remove(dir);
}

static void put(const char *rel, const char *text)
{
    char p[256];
    snprintf(p, sizeof(p), "%s/%s", dir, rel);
    for (char *s = strchr(p + strlen(dir) + 1, '/'); s; s = strchr(s + 1, '/')) {
        *s = '\0';
        mkdir(p, 0755);
        *s = '/';
    }
    FILE *f = fopen(p, "w");
    cr_assert(f, "%s", p);
    fputs(text, f);
    fclose(f);
}

/* Packs dir into a temporary file; returns its descriptor (at the start) or -1 with err. */
static int pack(kiln_err_t *err, code_stats_t *st)
{
    char path[] = "/tmp/kiln-pack-out.XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    unlink(path);
    int rc = code_pack_dir(dir, fd, NULL, 0, st, err);
    if (rc) {
        close(fd);
        return -1;
    }
    lseek(fd, 0, SEEK_SET);
    return fd;
}

static bool exists(const char *root, const char *rel)
{
    char p[256];
    snprintf(p, sizeof(p), "%s/%s", root, rel);
    struct stat sb;
    return lstat(p, &sb) == 0;
}

TestSuite(pack, .init = dir_init, .fini = dir_fini);

Test(pack, kilnignore_is_honoured_and_the_result_extracts)
{
    put("train.py", "print('train')\n");
    put("pkg/model.py", "x = 1\n");
    put("pkg/model.pyc", "junk");
    put("data/big.bin", "0123456789");
    put("data/keep.txt", "re-included? no: its directory is out");
    put("logs/a.log", "log");
    put("notes/keep.log", "kept");
    put(".git/HEAD", "ref: refs/heads/main\n");
    put(".kilnignore", "*.pyc\n/data/\n!data/keep.txt\n*.log\n!notes/keep.log\n");
    char p[256];
    snprintf(p, sizeof(p), "%s/pkg/link.py", dir);
    cr_assert_eq(symlink("model.py", p), 0);
    kiln_err_t err;
    code_stats_t st;
    int fd = pack(&err, &st);
    cr_assert(fd >= 0, "%s", err.message);
    char dest[160];
    snprintf(dest, sizeof(dest), "%s.out", dir);
    code_tree_remove(dest);
    cr_assert_eq(code_archive_extract_fd(fd, dest, NULL, NULL, &err), 0, "%s", err.message);
    close(fd);
    cr_assert(exists(dest, "train.py"));
    cr_assert(exists(dest, "pkg/model.py"));
    cr_assert(exists(dest, "pkg/link.py"));
    cr_assert(exists(dest, ".kilnignore"));
    cr_assert(exists(dest, "notes/keep.log"));
    cr_assert_not(exists(dest, "pkg/model.pyc"));
    cr_assert_not(exists(dest, "data"));
    cr_assert_not(exists(dest, "data/keep.txt"), "a file below an excluded directory stays out");
    cr_assert_not(exists(dest, "logs/a.log"));
    cr_assert_not(exists(dest, ".git"));
    struct stat sb;
    snprintf(p, sizeof(p), "%s/pkg/link.py", dest);
    cr_assert_eq(lstat(p, &sb), 0);
    cr_assert(S_ISLNK(sb.st_mode), "links are packed as links");
    cr_assert_eq(st.files, 4);
    code_tree_remove(dest);
}

Test(pack, the_same_tree_packs_to_the_same_bytes)
{
    put("a.py", "a\n");
    put("b/c.py", "c\n");
    kiln_err_t err;
    int fd1 = pack(&err, NULL), fd2;
    cr_assert(fd1 >= 0, "%s", err.message);
    char h1[KILN_SHA256_HEX], h2[KILN_SHA256_HEX];
    int64_t n1, n2;
    cr_assert_eq(kiln_sha256_fd(fd1, &n1, h1, &err), 0);
    /* touch the files: times are not packed */
    char p[256];
    snprintf(p, sizeof(p), "%s/a.py", dir);
    struct timespec ts[2] = {{1000, 0}, {1000, 0}};
    utimensat(AT_FDCWD, p, ts, 0);
    sleep(1); /* a second later: a gzip header with a time would differ */
    fd2 = pack(&err, NULL);
    cr_assert(fd2 >= 0, "%s", err.message);
    cr_assert_eq(kiln_sha256_fd(fd2, &n2, h2, &err), 0);
    cr_assert_eq(n1, n2);
    cr_assert_str_eq(h1, h2);
    close(fd1);
    close(fd2);
}

Test(pack, what_no_archive_may_hold_is_refused_before_sending)
{
    put("a.py", "a\n");
    char p[256];
    snprintf(p, sizeof(p), "%s/pipe", dir);
    cr_assert_eq(mkfifo(p, 0600), 0);
    kiln_err_t err;
    cr_assert_eq(pack(&err, NULL), -1);
    cr_assert(strstr(err.message, "\"pipe\" is a FIFO"), "%s", err.message);
    cr_assert(strstr(err.hint, ".kilnignore"), "%s", err.hint);
    put(".kilnignore", "pipe\n");
    int fd = pack(&err, NULL);
    cr_assert(fd >= 0, "left out, it packs: %s", err.message);
    close(fd);
    snprintf(p, sizeof(p), "%s/etc", dir);
    cr_assert_eq(symlink("/etc", p), 0);
    cr_assert_eq(pack(&err, NULL), -1);
    cr_assert(strstr(err.message, "archive entry \"etc\": a symbolic link to an absolute path"), "%s", err.message);
    cr_assert(strstr(err.hint, ".kilnignore"), "%s", err.hint);
}

Test(pack, a_missing_directory_and_an_empty_one)
{
    kiln_err_t err;
    char path[] = "/tmp/kiln-pack-out.XXXXXX";
    int fd = mkstemp(path);
    unlink(path);
    cr_assert_eq(code_pack_dir("/nonexistent/kiln", fd, NULL, 0, NULL, &err), KILN_ENOTFOUND);
    cr_assert_eq(code_pack_dir(dir, fd, NULL, 0, NULL, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "holds no files"), "%s", err.message);
    close(fd);
}

Test(pack, the_size_bound_is_the_compressed_size)
{
    /* random bytes do not compress */
    char p[256];
    snprintf(p, sizeof(p), "%s/rand.bin", dir);
    int out = open(p, O_WRONLY | O_CREAT, 0644);
    int rnd = open("/dev/urandom", O_RDONLY);
    char buf[4096];
    for (int i = 0; i < 512; i++) {
        cr_assert_eq(read(rnd, buf, sizeof(buf)), (ssize_t)sizeof(buf));
        cr_assert_eq(write(out, buf, sizeof(buf)), (ssize_t)sizeof(buf));
    }
    close(rnd);
    close(out);
    char path[] = "/tmp/kiln-pack-out.XXXXXX";
    int fd = mkstemp(path);
    unlink(path);
    kiln_err_t err;
    cr_assert_eq(code_pack_dir(dir, fd, NULL, 1 << 20, NULL, &err), KILN_ETOOBIG);
    cr_assert(strstr(err.message, "passes the limit of 1 MiB"), "%s", err.message);
    close(fd);
}
