/* test_path.c - path confinement (base/path.c) on a real directory tree: "..", symlinks out of a
 * root, a symlinked root, the "/data2" prefix trick, dangling links, loops, and the rule that a
 * path outside the roots gets the same answer whether or not it exists. */
#include "base/base.h"

#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char T[256];        /* the test's tree, resolved */
static char root[300];

static void mk(const char *rel, bool dir)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", T, rel);
    if (dir) {
        cr_assert_eq(mkdir(p, 0755), 0, "mkdir %s", p);
    } else {
        FILE *f = fopen(p, "w");
        cr_assert_not_null(f, "%s", p);
        fputs("secret contents 12345\n", f);
        fclose(f);
    }
}

static void ln(const char *target, const char *rel)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", T, rel);
    cr_assert_eq(symlink(target, p), 0, "symlink %s", p);
}

static void setup(void)
{
    char tmpl[] = "/tmp/kiln-path.XXXXXX";
    cr_assert_not_null(mkdtemp(tmpl));
    char real[PATH_MAX];
    cr_assert_not_null(realpath(tmpl, real));
    cr_assert_lt(strlen(real), sizeof T);
    memcpy(T, real, strlen(real) + 1);
    mk("data", true);
    mk("data/file.txt", false);
    mk("data/sub", true);
    mk("data2", true);
    mk("data2/secret", false);
    mk("outside", true);
    mk("outside/secret", false);
    char t[300];
    snprintf(t, sizeof t, "%s/outside", T);
    ln(t, "data/link_out");                 /* absolute link out of the root */
    ln("../outside", "data/rel_out");       /* relative link out of the root */
    ln("sub", "data/link_in");              /* stays inside */
    snprintf(t, sizeof t, "%s/outside/newdir", T);
    ln(t, "data/dangling");                 /* points outside, at nothing (yet) */
    ln("loop2", "data/loop1");
    ln("loop1", "data/loop2");
    snprintf(t, sizeof t, "%s/data", T);
    ln(t, "rootlink");                      /* a root that is itself a symlink */
    snprintf(root, sizeof root, "%s/data", T);
}

static void teardown(void)
{
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", T);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(path, .init = setup, .fini = teardown);

/* path relative to T */
static const char *at(const char *rel)
{
    static char buf[4][600];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", T, rel);
    return buf[k];
}

/* Confines T/rel to {T/data}; returns the status, the message in msg (with the path as given
 * replaced by "<P>", so that two answers can be compared) and the resolved path in out. */
static int confine1(const char *rel, char *msg, char *out, bool *exists)
{
    const char *roots[] = {root};
    kiln_err_t err;
    kiln_err_clear(&err);
    const char *p = at(rel);
    int rc = kiln_path_confine(p, "data.train", roots, 1, out, PATH_MAX, exists, &err);
    msg[0] = '\0';
    const char *hit = strstr(err.message, p);
    if (hit)
        snprintf(msg, 512, "%.*s<P>%s", (int)(hit - err.message), err.message, hit + strlen(p));
    else
        snprintf(msg, 512, "%s", err.message);
    if (rc != 0)
        cr_assert_str_eq(err.field, "data.train");
    return rc;
}

Test(path, normalisation_is_lexical_and_never_climbs_above_the_root)
{
    char out[PATH_MAX];
    cr_assert_eq(kiln_path_normalize("//a/./b/../c/", out, sizeof out, NULL), 0);
    cr_assert_str_eq(out, "/a/c");
    cr_assert_eq(kiln_path_normalize("/../../x/..", out, sizeof out, NULL), 0);
    cr_assert_str_eq(out, "/");
    cr_assert_eq(kiln_path_normalize("/a/b/../../../etc/passwd", out, sizeof out, NULL), 0);
    cr_assert_str_eq(out, "/etc/passwd");
    cr_assert_eq(kiln_path_normalize("/", out, sizeof out, NULL), 0);
    cr_assert_str_eq(out, "/");
    cr_assert_eq(kiln_path_normalize("/a..b/.c/...", out, sizeof out, NULL), 0);
    cr_assert_str_eq(out, "/a..b/.c/...");
    cr_assert_eq(kiln_path_normalize("relative/x", out, sizeof out, NULL), KILN_EINVAL);
    cr_assert_eq(kiln_path_normalize("", out, sizeof out, NULL), KILN_EINVAL);
    cr_assert_eq(kiln_path_normalize("/abcdef", out, 4, NULL), KILN_ETOOBIG);
}

Test(path, a_file_inside_the_root_resolves_to_itself)
{
    char msg[512], out[PATH_MAX];
    bool ex = false;
    cr_assert_eq(confine1("data/file.txt", msg, out, &ex), 0, "%s", msg);
    cr_assert(ex);
    cr_assert_str_eq(out, at("data/file.txt"));
    cr_assert_eq(confine1("data//./sub/../file.txt", msg, out, &ex), 0, "%s", msg);
    cr_assert_str_eq(out, at("data/file.txt"));
    cr_assert_eq(confine1("data", msg, out, &ex), 0, "the root itself is inside");
    cr_assert_eq(confine1("data/link_in", msg, out, &ex), 0, "a link that stays inside");
    cr_assert_str_eq(out, at("data/sub"));
}

Test(path, dot_dot_escapes_are_refused)
{
    char msg[512], out[PATH_MAX];
    cr_assert_eq(confine1("data/../outside/secret", msg, out, NULL), KILN_EPERM);
    cr_assert_eq(confine1("data/sub/../../outside/secret", msg, out, NULL), KILN_EPERM);
    cr_assert_eq(confine1("data/missing/../../outside/secret", msg, out, NULL), KILN_EPERM);
    cr_assert(strstr(msg, "data.train") && strstr(msg, root), "names the field and the roots: %s", msg);
    char deep[200];
    snprintf(deep, sizeof deep, "data/%s", "../../../../../../../../../../../../etc/passwd");
    cr_assert_eq(confine1(deep, msg, out, NULL), KILN_EPERM);
}

Test(path, symlinks_out_of_the_root_are_refused)
{
    char msg[512], out[PATH_MAX];
    cr_assert_eq(confine1("data/link_out/secret", msg, out, NULL), KILN_EPERM);
    cr_assert_eq(confine1("data/rel_out/secret", msg, out, NULL), KILN_EPERM);
    cr_assert_eq(confine1("data/link_out", msg, out, NULL), KILN_EPERM);
    /* a dangling link that points outside: creating through it would land outside */
    cr_assert_eq(confine1("data/dangling", msg, out, NULL), KILN_EPERM);
    cr_assert_eq(confine1("data/dangling/ckpt", msg, out, NULL), KILN_EPERM);
    cr_assert_eq(confine1("data/loop1", msg, out, NULL), KILN_EPERM, "a loop cannot be resolved: refused");
    cr_assert(!strstr(msg, "outside"), "the message does not say where a link leads: %s", msg);
    /* ".." after a link applies to where the link led, as the kernel walks it */
    cr_assert_eq(confine1("data/link_out/../data/file.txt", msg, out, NULL), 0, "%s", msg);
    cr_assert_str_eq(out, at("data/file.txt"));
    cr_assert_eq(confine1("data/link_in/../../outside/secret", msg, out, NULL), KILN_EPERM);
}

Test(path, a_symlinked_root_is_resolved_too)
{
    char rl[300];
    snprintf(rl, sizeof rl, "%s", at("rootlink"));
    const char *roots[] = {rl};
    char out[PATH_MAX];
    kiln_err_t err;
    cr_assert_eq(kiln_path_confine(at("data/file.txt"), "data.train", roots, 1, out, sizeof out, NULL, &err), 0,
                 "%s", err.message);
    cr_assert_eq(kiln_path_confine(at("rootlink/file.txt"), "data.train", roots, 1, out, sizeof out, NULL, &err),
                 0, "%s", err.message);
    cr_assert_str_eq(out, at("data/file.txt"), "the resolved path has no link in it");
    cr_assert_eq(kiln_path_confine(at("rootlink/../outside/secret"), "data.train", roots, 1, out, sizeof out,
                                   NULL, &err), KILN_EPERM);
}

Test(path, a_root_is_not_a_prefix_of_its_sibling)
{
    cr_assert(kiln_path_inside("/data/x", "/data"));
    cr_assert(kiln_path_inside("/data", "/data"));
    cr_assert_not(kiln_path_inside("/data2/x", "/data"));
    cr_assert_not(kiln_path_inside("/dat", "/data"));
    cr_assert(kiln_path_inside("/anything", "/"));
    char msg[512], out[PATH_MAX];
    cr_assert_eq(confine1("data2/secret", msg, out, NULL), KILN_EPERM);
    cr_assert_eq(confine1("data2", msg, out, NULL), KILN_EPERM);
    const char *slash[] = {"/"};
    cr_assert_eq(kiln_path_confine("/etc/passwd", "f", slash, 1, out, sizeof out, NULL, NULL), 0,
                 "\"/\" holds everything");
}

Test(path, outside_the_roots_missing_and_existing_answer_alike)
{
    char m1[512], m2[512], m3[512], m4[512], out[PATH_MAX];
    cr_assert_eq(confine1("outside/secret", m1, out, NULL), KILN_EPERM);
    cr_assert_eq(confine1("outside/no-such-file", m2, out, NULL), KILN_EPERM);
    cr_assert_eq(confine1("outside", m3, out, NULL), KILN_EPERM, "a directory too");
    cr_assert_eq(confine1("no-such-dir/x", m4, out, NULL), KILN_EPERM);
    cr_assert_str_eq(m1, m2);
    cr_assert_str_eq(m1, m3);
    cr_assert_str_eq(m1, m4);
    cr_assert(!strstr(m1, "exist") && !strstr(m1, "secret contents"), "%s", m1);
    /* the same for system files */
    const char *roots[] = {root};
    kiln_err_t e1, e2;
    cr_assert_eq(kiln_path_confine("/etc/passwd", "data.train", roots, 1, NULL, 0, NULL, &e1), KILN_EPERM);
    cr_assert_eq(kiln_path_confine("/etc/passwd-kiln-none", "data.train", roots, 1, NULL, 0, NULL, &e2), KILN_EPERM);
    cr_assert_str_eq(strstr(e1.message, "\" is"), strstr(e2.message, "\" is"));
    /* no roots at all: nothing is allowed */
    cr_assert_eq(kiln_path_confine(at("data/file.txt"), "data.train", NULL, 0, NULL, 0, NULL, &e1), KILN_EPERM);
    cr_assert(strstr(e1.message, "none are allowed"), "%s", e1.message);
}

Test(path, inside_a_root_a_missing_path_passes_and_says_it_is_missing)
{
    char msg[512], out[PATH_MAX];
    bool ex = true;
    cr_assert_eq(confine1("data/new/ckpt", msg, out, &ex), 0, "%s", msg);
    cr_assert_not(ex);
    cr_assert_str_eq(out, at("data/new/ckpt"));
    cr_assert_eq(confine1("data/file.txt/x", msg, out, &ex), 0, "below a file: missing, inside");
    cr_assert_not(ex);
}

Test(path, relative_paths_are_refused)
{
    const char *roots[] = {root};
    kiln_err_t err;
    cr_assert_eq(kiln_path_confine("data/file.txt", "data.val", roots, 1, NULL, 0, NULL, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "data.val") && strstr(err.message, "absolute"), "%s", err.message);
}

Test(path, secret_files_and_directories_get_their_modes)
{
    mode_t old = umask(022);
    kiln_err_t err;
    const char *f = at("data/cred");
    cr_assert_eq(kiln_file_write_atomic_mode(f, "x\n", 2, 0600, &err), 0, "%s", err.message);
    struct stat st;
    cr_assert_eq(stat(f, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0600);
    cr_assert_eq(kiln_mkdirs_mode(at("data/a/b"), 0700, &err), 0, "%s", err.message);
    cr_assert_eq(stat(at("data/a"), &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0700);
    cr_assert_eq(stat(at("data/a/b"), &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0700);
    umask(old);
}

Test(path, a_project_area_belongs_to_its_project_only)
{
    /* text only: every ".kiln" component must be followed by the project's own name */
    cr_assert_not(kiln_path_foreign_area("/data/ck/.kiln/proj-a/j/ckpt_00000005.bin", "proj-a"));
    cr_assert(kiln_path_foreign_area("/data/ck/.kiln/proj-a/j/ckpt_00000005.bin", "proj-b"));
    cr_assert(kiln_path_foreign_area("/data/ck/.kiln/proj-a/j", "proj"), "a prefix of the name is another name");
    cr_assert(kiln_path_foreign_area("/data/ck/.kiln/proj/j", "proj-a"));
    cr_assert(kiln_path_foreign_area("/data/ck/.kiln", "proj-a"), "the area directory itself");
    cr_assert(kiln_path_foreign_area("/data/.kiln/proj-a/.kiln/proj-b/x", "proj-a"), "every .kiln counts");
    cr_assert(kiln_path_foreign_area("/data/ck/.kiln/proj-a/x", NULL), "no project: every area is another's");
    cr_assert(kiln_path_foreign_area("/data/ck/.kiln/proj-a/x", ""));
    cr_assert_not(kiln_path_foreign_area("/data/ck/.kilnx/proj-a/x", "proj-b"), "only the exact name");
    cr_assert_not(kiln_path_foreign_area("/data/ck/x.kiln/proj-a/x", "proj-b"));
    cr_assert_not(kiln_path_foreign_area("/data/corpus.txt", NULL));
    kiln_err_t err;
    cr_assert_eq(kiln_path_area_check("/data/ck/.kiln/proj-a/j/c.bin", "/data/link.txt", "data.val", "proj-b", &err),
                 KILN_EPERM);
    cr_assert_str_eq(err.field, "data.val");
    cr_assert(strstr(err.message, "\"/data/link.txt\"") && strstr(err.message, "\"proj-b\""), "%s", err.message);
    cr_assert_null(strstr(err.message, "proj-a"), "where the path led is not told: %s", err.message);
    cr_assert_eq(kiln_path_area_check("/data/ck/.kiln/proj-b/j/c.bin", "/data/link.txt", "data.val", "proj-b", &err),
                 0);
}
