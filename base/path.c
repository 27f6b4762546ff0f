/* path.c - path confinement, one implementation for every program that must keep a job inside
 * its directories: lexical normalisation, resolution the way the kernel opens a path (symlinks
 * and ".."), the check that a resolved path lies inside one of a set of roots, and the rule that
 * keeps a job out of other projects' areas (.kiln/<project>). It decides only; opening files is
 * the caller's business, and it never reads a file's contents. */
#include "base/base.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PATH_MAX_LINKS 40         /* symlinks followed before giving up, as the kernel does */

/* Appends "/" + comp[0..len) to cur (length *clen). Returns false when it does not fit. */
static bool path_push(char *cur, size_t *clen, size_t cap, const char *comp, size_t len)
{
    if (*clen + 1 + len + 1 > cap)
        return false;
    cur[(*clen)++] = '/';
    memcpy(cur + *clen, comp, len);
    *clen += len;
    cur[*clen] = '\0';
    return true;
}

/* Drops the last component of cur; "" (the root) stays "". */
static void path_pop(char *cur, size_t *clen)
{
    while (*clen > 0 && cur[*clen - 1] != '/')
        (*clen)--;
    if (*clen > 0)
        (*clen)--;
    cur[*clen] = '\0';
}

static int path_out(const char *cur, size_t clen, char *out, size_t n, kiln_err_t *err)
{
    const char *s = clen ? cur : "/";
    if (kiln_strlcpy(out, s, n) >= n)
        return kiln_err_set(err, KILN_ETOOBIG, NULL, "path too long");
    return 0;
}

int kiln_path_normalize(const char *path, char *out, size_t n, kiln_err_t *err)
{
    if (!path || path[0] != '/')
        return kiln_err_set(err, KILN_EINVAL, NULL, "not an absolute path");
    char cur[PATH_MAX];
    size_t clen = 0;
    cur[0] = '\0';
    const char *p = path;
    for (;;) {
        while (*p == '/')
            p++;
        if (!*p)
            break;
        const char *q = p;
        while (*q && *q != '/')
            q++;
        size_t len = (size_t)(q - p);
        if (len == 2 && p[0] == '.' && p[1] == '.')
            path_pop(cur, &clen);
        else if (!(len == 1 && p[0] == '.') && !path_push(cur, &clen, sizeof(cur), p, len))
            return kiln_err_set(err, KILN_ETOOBIG, NULL, "path too long");
        p = q;
    }
    return path_out(cur, clen, out, n, err);
}

int kiln_path_resolve(const char *path, char *out, size_t n, bool *exists, kiln_err_t *err)
{
    if (!path || path[0] != '/')
        return kiln_err_set(err, KILN_EINVAL, NULL, "not an absolute path");
    /* todo: what is left to walk; cur: the resolved prefix, free of symlinks ("" is "/") */
    char todo[2 * PATH_MAX], cur[PATH_MAX], target[PATH_MAX];
    size_t clen = 0;
    cur[0] = '\0';
    if (kiln_strlcpy(todo, path, sizeof(todo)) >= sizeof(todo))
        return kiln_err_set(err, KILN_ETOOBIG, NULL, "path too long");
    bool missing = false;
    int links = 0;
    const char *p = todo;
    for (;;) {
        while (*p == '/')
            p++;
        if (!*p)
            break;
        const char *q = p;
        while (*q && *q != '/')
            q++;
        size_t len = (size_t)(q - p);
        if (len == 1 && p[0] == '.') {
            p = q;
            continue;
        }
        if (len == 2 && p[0] == '.' && p[1] == '.') {
            /* cur holds no symlink, so its parent is what the kernel's ".." reaches; below a
             * missing component the kernel would fail, and staying lexical is the stricter */
            path_pop(cur, &clen);
            p = q;
            continue;
        }
        if (!path_push(cur, &clen, sizeof(cur), p, len))
            return kiln_err_set(err, KILN_ETOOBIG, NULL, "path too long");
        p = q;
        if (missing)
            continue;
        struct stat st;
        if (lstat(cur, &st) != 0) {
            if (errno == ENAMETOOLONG)
                return kiln_err_set(err, KILN_ETOOBIG, NULL, "path too long");
            /* ENOENT, ENOTDIR, EACCES: nothing below here can be opened; the rest is lexical */
            missing = true;
            continue;
        }
        if (!S_ISLNK(st.st_mode))
            continue;
        if (++links > PATH_MAX_LINKS)
            return kiln_err_set(err, KILN_EIO, NULL, "too many levels of symbolic links");
        ssize_t tl = readlink(cur, target, sizeof(target) - 1);
        if (tl < 0)
            return kiln_err_set(err, KILN_EIO, NULL, "could not read a symbolic link: %s", strerror(errno));
        target[tl] = '\0';
        path_pop(cur, &clen);
        if (target[0] == '/')
            clen = 0, cur[0] = '\0';
        /* the link's target takes the link's place in what is left to walk */
        size_t rest = strlen(q);
        if ((size_t)tl + 1 + rest + 1 > sizeof(todo))
            return kiln_err_set(err, KILN_ETOOBIG, NULL, "path too long");
        memmove(todo + tl + 1, q, rest + 1);
        memcpy(todo, target, (size_t)tl);
        todo[tl] = '/';
        p = todo;
    }
    if (exists)
        *exists = !missing;
    return path_out(cur, clen, out, n, err);
}

bool kiln_path_inside(const char *path, const char *root)
{
    size_t rl = strlen(root);
    if (rl == 1 && root[0] == '/')
        return path[0] == '/';
    return rl > 0 && !strncmp(path, root, rl) && (path[rl] == '\0' || path[rl] == '/');
}

int kiln_path_confine_resolved(const char *resolved, const char *given, const char *field, const char *const *roots,
                               size_t nroots, kiln_err_t *err)
{
    char root[PATH_MAX];
    bool inside = false;
    for (size_t i = 0; resolved && i < nroots && !inside; i++)
        inside = roots[i] && kiln_path_resolve(roots[i], root, sizeof(root), NULL, NULL) == 0 &&
                 kiln_path_inside(resolved, root);
    if (inside)
        return 0;
    char list[200];
    size_t len = 0;
    list[0] = '\0';
    for (size_t i = 0; i < nroots && len < sizeof(list); i++)
        len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%s", i ? ", " : "", roots[i]);
    if (nroots == 0)
        kiln_strlcpy(list, "none are allowed", sizeof(list));
    kiln_err_set(err, KILN_EPERM, field, "%s \"%.120s\" is not inside an allowed directory (%s)",
                 field && field[0] ? field : "path", given, list);
    return KILN_EPERM;
}

int kiln_path_confine(const char *path, const char *field, const char *const *roots, size_t nroots,
                      char *resolved_out, size_t n, bool *exists, kiln_err_t *err)
{
    char res[PATH_MAX];
    bool ex = false;
    const char *f = field && field[0] ? field : "path";
    if (!path || path[0] != '/')
        return kiln_err_set(err, KILN_EINVAL, field, "%s must be an absolute path (got \"%.120s\")", f,
                            path ? path : "");
    /* A path that cannot be resolved (a symlink loop, too long) is refused like one outside, so
     * that the answer tells nothing about what lies outside the roots. */
    bool resolved = kiln_path_resolve(path, res, sizeof(res), &ex, NULL) == 0;
    int rc = kiln_path_confine_resolved(resolved ? res : NULL, path, field, roots, nroots, err);
    if (rc)
        return rc;
    if (resolved_out && kiln_strlcpy(resolved_out, res, n) >= n)
        return kiln_err_set(err, KILN_ETOOBIG, field, "%s: path too long", f);
    if (exists)
        *exists = ex;
    return 0;
}

bool kiln_path_foreign_area(const char *path, const char *project)
{
    const size_t an = sizeof(KILN_AREA_DIR) - 1;
    size_t pn = project ? strlen(project) : 0;
    for (const char *p = path; p && *p;) {
        while (*p == '/')
            p++;
        const char *q = p;
        while (*q && *q != '/')
            q++;
        if ((size_t)(q - p) == an && !memcmp(p, KILN_AREA_DIR, an)) {
            const char *n = q;
            while (*n == '/')
                n++;
            const char *e = n;
            while (*e && *e != '/')
                e++;
            if (pn == 0 || (size_t)(e - n) != pn || memcmp(n, project, pn) != 0)
                return true;
        }
        p = q;
    }
    return false;
}

int kiln_path_area_check(const char *resolved, const char *given, const char *field, const char *project,
                         kiln_err_t *err)
{
    if (!kiln_path_foreign_area(resolved, project))
        return 0;
    const char *f = field && field[0] ? field : "path";
    if (project && project[0])
        kiln_err_set(err, KILN_EPERM, field, "%s \"%.120s\" leads into kiln's area of another project; jobs of "
                     "project \"%s\" may not read there", f, given, project);
    else
        kiln_err_set(err, KILN_EPERM, field, "%s \"%.120s\" leads into kiln's area of a project", f, given);
    kiln_err_detail(err, "inside a data root, kiln keeps each project's files under <dir>/" KILN_AREA_DIR
                    "/<project>/, and only that project's jobs may reach them");
    kiln_err_hint(err, "name a file outside " KILN_AREA_DIR " directories; a job's own checkpoints reach its "
                  "next attempt through checkpoint.path");
    return KILN_EPERM;
}
