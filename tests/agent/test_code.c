/* test_code.c - the agent's code cache (agent/code.c), with archives packed here by code/ and a
 * fetcher that serves them from files: one fetch per digest; bytes that do not match the digest
 * refused and nothing kept; a damaged tree found by its manifest and fetched again; eviction least
 * recently used first, never a held tree; the order of use kept across a restart; a hostile
 * archive refused with nothing written outside; working directories as copies the job may change
 * (the cached tree never does), overlay paths, and data-root directories copied within the roots
 * and a bound. */
#include "agent/agent.h"
#include "code/code.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char top[64];

static void top_init(void)
{
    snprintf(top, sizeof(top), "/tmp/kiln-codecache.XXXXXX");
    cr_assert(mkdtemp(top));
}

static void top_fini(void)
{
    code_tree_remove(top);
}

TestSuite(codecache, .init = top_init, .fini = top_fini, .timeout = 120);

/* ---- archives and a fetcher ---------------------------------------------------------------------- */

typedef struct archive {
    char path[PATH_MAX];
    char digest[KILN_SHA256_HEX];
    int64_t size;
} archive_t;

static void put(const char *dir, const char *rel, const char *text, mode_t mode)
{
    char p[PATH_MAX + 64];
    snprintf(p, sizeof(p), "%s/%s", dir, rel);
    char *slash = strrchr(p, '/');
    *slash = '\0';
    kiln_err_t err;
    cr_assert_eq(kiln_mkdirs_mode(p, 0755, &err), 0);
    *slash = '/';
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, mode);
    cr_assert(fd >= 0, "%s", p);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

/* Packs a source tree named name whose train.py says what, and a file of pad bytes. */
static archive_t make_archive(const char *name, const char *what, size_t pad)
{
    archive_t a;
    char src[PATH_MAX];
    snprintf(src, sizeof(src), "%s/src-%s", top, name);
    char text[200];
    snprintf(text, sizeof(text), "print(%s)\n", what);
    put(src, "train.py", text, 0644);
    put(src, "run.sh", "#!/bin/sh\necho run\n", 0755);
    char *padding = malloc(pad + 1);
    for (size_t i = 0; i < pad; i++)
        padding[i] = (char)('a' + (i * 7 + (size_t)name[0]) % 26); /* compresses, but not to nothing */
    padding[pad] = '\0';
    put(src, "pkg/data.txt", padding, 0644);
    free(padding);
    char p[PATH_MAX + 64];
    snprintf(p, sizeof(p), "%s/link.py", src);
    cr_assert_eq(symlink("train.py", p), 0);
    snprintf(a.path, sizeof(a.path), "%s/%s.tgz", top, name);
    int fd = open(a.path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    kiln_err_t err;
    cr_assert_eq(code_pack_dir(src, fd, NULL, 0, NULL, &err), 0, "%s", err.message);
    cr_assert_eq(kiln_sha256_fd(fd, &a.size, a.digest, &err), 0);
    close(fd);
    return a;
}

typedef struct server {
    const archive_t *v;          /* what it serves, by digest */
    int n;
    int fetches;                 /* calls so far */
    const char *lie;             /* serve this file for every digest instead */
} server_t;

static int serve(void *ud, const agent_code_ref_t *ref, int fd, kiln_err_t *err)
{
    server_t *s = ud;
    s->fetches++;
    const char *path = s->lie;
    for (int i = 0; i < s->n && !path; i++)
        if (!strcmp(s->v[i].digest, ref->digest))
            path = s->v[i].path;
    if (!path)
        return kiln_err_set(err, KILN_ENOTFOUND, NULL, "no such archive");
    int in = open(path, O_RDONLY);
    char buf[65536];
    ssize_t k;
    while ((k = read(in, buf, sizeof(buf))) > 0)
        cr_assert_eq(write(fd, buf, (size_t)k), k);
    close(in);
    return 0;
}

static agent_code_cache_t *cache_open(int64_t bound, server_t *srv)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s/cache", top);
    agent_code_cache_t *c = NULL;
    kiln_err_t err;
    cr_assert_eq(agent_code_cache_create(dir, bound, serve, srv, &c, &err), 0, "%s", err.message);
    return c;
}

static int acquire(agent_code_cache_t *c, const archive_t *a, char *tree, kiln_err_t *err)
{
    agent_code_ref_t ref = {.digest = a->digest, .size = a->size, .job_id = "job-1", .attempt = 1};
    return agent_code_acquire(c, &ref, tree, PATH_MAX, err);
}

static bool in_cache(const archive_t *a)
{
    char p[PATH_MAX + 64];
    snprintf(p, sizeof(p), "%s/cache/%s/train.py", top, a->digest);
    return access(p, F_OK) == 0;
}

static char *slurp(const char *path)
{
    char *text = NULL;
    kiln_err_t err;
    return kiln_file_read(path, &text, NULL, &err) == 0 ? text : NULL;
}

/* ---- tests ---------------------------------------------------------------------------------------- */

Test(codecache, one_fetch_per_digest_and_the_tree_is_the_archive)
{
    archive_t a = make_archive("a", "'a'", 100);
    server_t srv = {&a, 1, 0, NULL};
    agent_code_cache_t *c = cache_open(0, &srv);
    char tree[PATH_MAX], p[PATH_MAX + 64];
    kiln_err_t err;
    cr_assert_eq(acquire(c, &a, tree, &err), 0, "%s", err.message);
    cr_assert_eq(srv.fetches, 1);
    snprintf(p, sizeof(p), "%s/train.py", tree);
    char *text = slurp(p);
    cr_assert_str_eq(text, "print('a')\n");
    free(text);
    snprintf(p, sizeof(p), "%s/run.sh", tree);
    cr_assert_eq(access(p, X_OK), 0, "execute bits survive");
    cr_assert_eq(acquire(c, &a, tree, &err), 0, "%s", err.message);
    cr_assert_eq(srv.fetches, 1, "a held or cached tree is not fetched again");
    agent_code_release(c, a.digest);
    agent_code_release(c, a.digest);
    cr_assert_eq(acquire(c, &a, tree, &err), 0);
    cr_assert_eq(srv.fetches, 1);
    agent_code_release(c, a.digest);
    agent_code_cache_destroy(c);
}

Test(codecache, bytes_that_are_not_the_digest_are_refused)
{
    archive_t a = make_archive("a", "'a'", 100), b = make_archive("b", "'b'", 100);
    server_t srv = {&a, 1, 0, b.path}; /* serves b's bytes when asked for a */
    agent_code_cache_t *c = cache_open(0, &srv);
    char tree[PATH_MAX];
    kiln_err_t err;
    cr_assert_eq(acquire(c, &a, tree, &err), KILN_ECHECKSUM);
    cr_assert(strstr(err.message, "arrived with SHA-256"), "%s", err.message);
    cr_assert_not(in_cache(&a), "nothing of it was kept");
    cr_assert_not(in_cache(&b));
    srv.lie = NULL;
    cr_assert_eq(acquire(c, &a, tree, &err), 0, "the next try fetches again: %s", err.message);
    cr_assert_eq(srv.fetches, 2);
    agent_code_release(c, a.digest);
    agent_code_cache_destroy(c);
}

Test(codecache, a_damaged_tree_is_fetched_again)
{
    archive_t a = make_archive("a", "'a'", 100);
    server_t srv = {&a, 1, 0, NULL};
    agent_code_cache_t *c = cache_open(0, &srv);
    char tree[PATH_MAX], p[PATH_MAX + 64];
    kiln_err_t err;
    cr_assert_eq(acquire(c, &a, tree, &err), 0, "%s", err.message);
    agent_code_release(c, a.digest);
    /* a file changed behind the cache's back */
    snprintf(p, sizeof(p), "%s/train.py", tree);
    FILE *f = fopen(p, "a");
    fputs("import os; os.system('evil')\n", f);
    fclose(f);
    cr_assert_eq(acquire(c, &a, tree, &err), 0, "%s", err.message);
    cr_assert_eq(srv.fetches, 2, "the damaged tree was fetched again");
    char *text = slurp(p);
    cr_assert_str_eq(text, "print('a')\n");
    free(text);
    agent_code_release(c, a.digest);
    /* a file gone, and a tree whose manifest is gone */
    snprintf(p, sizeof(p), "%s/pkg/data.txt", tree);
    cr_assert_eq(unlink(p), 0);
    cr_assert_eq(acquire(c, &a, tree, &err), 0);
    cr_assert_eq(srv.fetches, 3);
    agent_code_release(c, a.digest);
    agent_code_cache_destroy(c);
    snprintf(p, sizeof(p), "%s/cache/%s.manifest", top, a.digest);
    cr_assert_eq(unlink(p), 0);
    c = cache_open(0, &srv);
    cr_assert_not(in_cache(&a), "a tree without its manifest is removed when the cache opens");
    cr_assert_eq(acquire(c, &a, tree, &err), 0);
    cr_assert_eq(srv.fetches, 4);
    agent_code_release(c, a.digest);
    agent_code_cache_destroy(c);
}

Test(codecache, least_recently_used_go_first_never_a_held_one)
{
    archive_t v[4] = {make_archive("a", "1", 60000), make_archive("b", "2", 60000), make_archive("c", "3", 60000),
                      make_archive("d", "4", 60000)};
    server_t srv = {v, 4, 0, NULL};
    /* room for three trees of ~60 KB */
    agent_code_cache_t *c = cache_open(200000, &srv);
    char tree[PATH_MAX];
    kiln_err_t err;
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(acquire(c, &v[i], tree, &err), 0, "%s", err.message);
        agent_code_release(c, v[i].digest);
    }
    /* a is used again: b is now the least recently used */
    cr_assert_eq(acquire(c, &v[0], tree, &err), 0);
    agent_code_release(c, v[0].digest);
    cr_assert_eq(acquire(c, &v[3], tree, &err), 0);
    agent_code_release(c, v[3].digest);
    cr_assert(in_cache(&v[0]) && !in_cache(&v[1]) && in_cache(&v[2]) && in_cache(&v[3]),
              "b, the least recently used, went first");
    /* held trees stay even past the bound */
    cr_assert_eq(acquire(c, &v[2], tree, &err), 0);
    cr_assert_eq(acquire(c, &v[3], tree, &err), 0);
    cr_assert_eq(acquire(c, &v[0], tree, &err), 0);
    cr_assert_eq(acquire(c, &v[1], tree, &err), 0, "%s", err.message);
    cr_assert(in_cache(&v[0]) && in_cache(&v[1]) && in_cache(&v[2]) && in_cache(&v[3]), "all four are held");
    agent_code_release(c, v[2].digest); /* c is released first: it goes */
    cr_assert_not(in_cache(&v[2]));
    cr_assert(in_cache(&v[0]) && in_cache(&v[1]) && in_cache(&v[3]));
    agent_code_release(c, v[0].digest);
    agent_code_release(c, v[1].digest);
    agent_code_release(c, v[3].digest);
    agent_code_cache_destroy(c);
}

Test(codecache, the_order_of_use_outlives_a_restart)
{
    archive_t v[3] = {make_archive("a", "1", 60000), make_archive("b", "2", 60000), make_archive("c", "3", 60000)};
    server_t srv = {v, 3, 0, NULL};
    /* room for two trees of ~60 KB */
    agent_code_cache_t *c = cache_open(150000, &srv);
    char tree[PATH_MAX];
    kiln_err_t err;
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(acquire(c, &v[i], tree, &err), 0);
        agent_code_release(c, v[i].digest);
        usleep(20000);
    }
    cr_assert_eq(acquire(c, &v[0], tree, &err), 0); /* a after b */
    agent_code_release(c, v[0].digest);
    agent_code_cache_destroy(c);
    c = cache_open(150000, &srv);
    cr_assert(in_cache(&v[0]) && in_cache(&v[1]), "kept across the restart");
    cr_assert_eq(acquire(c, &v[0], tree, &err), 0);
    cr_assert_eq(srv.fetches, 2, "not fetched again");
    agent_code_release(c, v[0].digest);
    cr_assert_eq(acquire(c, &v[2], tree, &err), 0);
    agent_code_release(c, v[2].digest);
    cr_assert(in_cache(&v[0]) && !in_cache(&v[1]) && in_cache(&v[2]), "b was the least recently used");
    agent_code_cache_destroy(c);
}

Test(codecache, a_hostile_archive_is_refused_with_nothing_outside)
{
    /* a tar with a "../escaped" entry, made with tar's own transform; its digest is what it is */
    char cmd[PATH_MAX * 2];
    snprintf(cmd, sizeof(cmd),
             "cd %s && mkdir -p h && echo x > h/a.py && tar -czf hostile.tgz --transform 's,^h/a.py,../escaped,' "
             "h/a.py 2>/dev/null",
             top);
    cr_assert_eq(system(cmd), 0);
    archive_t h;
    snprintf(h.path, sizeof(h.path), "%s/hostile.tgz", top);
    int fd = open(h.path, O_RDONLY);
    kiln_err_t err;
    cr_assert_eq(kiln_sha256_fd(fd, &h.size, h.digest, &err), 0);
    close(fd);
    server_t srv = {&h, 1, 0, NULL};
    agent_code_cache_t *c = cache_open(0, &srv);
    char tree[PATH_MAX], p[PATH_MAX + 64];
    cr_assert_eq(acquire(c, &h, tree, &err), KILN_EINVAL);
    cr_assert(strstr(err.message, "archive entry \"../escaped\""), "%s", err.message);
    snprintf(p, sizeof(p), "%s/escaped", top);
    cr_assert_neq(access(p, F_OK), 0, "nothing was written outside the cache");
    cr_assert_not(in_cache(&h));
    agent_code_cache_destroy(c);
}

Test(codecache, working_directories_are_copies_the_job_may_change)
{
    archive_t a = make_archive("a", "'a'", 1000);
    server_t srv = {&a, 1, 0, NULL};
    agent_code_cache_t *c = cache_open(0, &srv);
    char tree[PATH_MAX], work[PATH_MAX], p[PATH_MAX + 64];
    kiln_err_t err;
    snprintf(work, sizeof(work), "%s/job1-work", top);
    cr_assert_eq(agent_code_prepare(c, a.digest, work, NULL, &err), KILN_ENOTFOUND, "not held: not prepared");
    cr_assert_eq(acquire(c, &a, tree, &err), 0);
    int64_t bytes = 0;
    cr_assert_eq(agent_code_prepare(c, a.digest, work, &bytes, &err), 0, "%s", err.message);
    cr_assert_eq(bytes, 11 + 19 + 1000);
    snprintf(p, sizeof(p), "%s/run.sh", work);
    cr_assert_eq(access(p, X_OK), 0);
    snprintf(p, sizeof(p), "%s/link.py", work);
    struct stat st;
    cr_assert_eq(lstat(p, &st), 0);
    cr_assert(S_ISLNK(st.st_mode), "links stay links");
    /* the job writes into its copy (snapshot.pt, a changed file): the cache does not change */
    snprintf(p, sizeof(p), "%s/train.py", work);
    FILE *f = fopen(p, "w");
    fputs("changed\n", f);
    fclose(f);
    put(work, "snapshot.pt", "weights", 0644);
    snprintf(p, sizeof(p), "%s/train.py", tree);
    char *text = slurp(p);
    cr_assert_str_eq(text, "print('a')\n");
    free(text);
    agent_code_release(c, a.digest);
    cr_assert_eq(acquire(c, &a, tree, &err), 0);
    cr_assert_eq(srv.fetches, 1, "the tree still matches its manifest");
    cr_assert_eq(agent_code_prepare(c, a.digest, work, NULL, &err), KILN_EEXIST);
    /* overlay paths: the tree below, fresh upper and work directories */
    char lower[PATH_MAX], upper[PATH_MAX], owork[PATH_MAX], job[PATH_MAX];
    snprintf(job, sizeof(job), "%s/job2", top);
    cr_assert_eq(agent_code_overlay(c, a.digest, job, lower, upper, owork, PATH_MAX, &err), 0, "%s", err.message);
    cr_assert_str_eq(lower, tree);
    cr_assert_eq(access(upper, W_OK), 0);
    cr_assert_eq(access(owork, W_OK), 0);
    agent_code_release(c, a.digest);
    agent_code_cache_destroy(c);
}

Test(codecache, a_data_root_directory_is_copied_within_the_roots_and_a_bound)
{
    char root[PATH_MAX], src[PATH_MAX], work[PATH_MAX], outside[PATH_MAX], p[PATH_MAX + 64];
    snprintf(root, sizeof(root), "%s/data", top);
    snprintf(src, sizeof(src), "%s/data/proj", top);
    snprintf(outside, sizeof(outside), "%s/secret", top);
    put(src, "train.py", "print(1)\n", 0644);
    put(outside, "key", "secret", 0600);
    const char *roots[] = {root};
    kiln_err_t err;
    snprintf(work, sizeof(work), "%s/w1", top);
    cr_assert_eq(agent_code_copy_dir(src, roots, 1, 0, work, NULL, &err), 0, "%s", err.message);
    snprintf(p, sizeof(p), "%s/train.py", work);
    cr_assert_eq(access(p, R_OK), 0);
    snprintf(work, sizeof(work), "%s/w2", top);
    cr_assert_eq(agent_code_copy_dir(outside, roots, 1, 0, work, NULL, &err), KILN_EPERM);
    cr_assert_str_eq(err.field, "source");
    cr_assert_neq(access(work, F_OK), 0);
    /* a link out of the roots is resolved before it is checked */
    snprintf(p, sizeof(p), "%s/escape", root);
    cr_assert_eq(symlink(outside, p), 0);
    cr_assert_eq(agent_code_copy_dir(p, roots, 1, 0, work, NULL, &err), KILN_EPERM);
    snprintf(work, sizeof(work), "%s/w3", top);
    put(src, "big.bin", "0123456789012345678901234567890123456789", 0644);
    cr_assert_eq(agent_code_copy_dir(src, roots, 1, 20, work, NULL, &err), KILN_ETOOBIG);
    cr_assert_neq(access(work, F_OK), 0, "a refused copy leaves nothing");
}
