/* cmd_code.c - `kiln code`: push a source directory (packed by code/, honouring its .kilnignore)
 * to kilnd as a script job's code and print the source to name, or get an uploaded archive back.
 * `kiln submit --source-dir` pushes through cli_code_push too. */
#include "cli/cli_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "code/code.h"

int cli_code_push(cli_client_t *c, const char *dir, const char *project, char *source, kiln_err_t *err)
{
    char tmp[] = "/tmp/kiln-code.XXXXXX";
    int fd = mkstemp(tmp);
    if (fd < 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not make a temporary file: %s", strerror(errno));
    unlink(tmp); /* the descriptor is all it takes */
    code_stats_t st;
    /* kilnd's own limit (--code-max-mb) is its to tell; packing is bounded by the default's
     * uncompressed limits so that a forgotten data directory is refused before it is sent */
    int rc = code_pack_dir(dir, fd, NULL, 0, &st, err);
    FILE *in = rc == 0 ? fdopen(fd, "rb") : NULL;
    if (rc == 0 && !in)
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not read the packed archive: %s", strerror(errno));
    if (!in)
        close(fd);
    char *path = NULL;
    json_t *out = NULL;
    long http = 0;
    if (rc == 0) {
        off_t len = lseek(fd, 0, SEEK_END);
        lseek(fd, 0, SEEK_SET);
        char sz[24], usz[24];
        fprintf(stderr, "packed %s: %lld files, %s (%s uncompressed)\n", dir, (long long)st.files,
                cli_fmt_bytes((double)len, sz, sizeof(sz)), cli_fmt_bytes((double)st.bytes, usz, sizeof(usz)));
        path = strdup("/v1/code");
        if (!path || (project && cli_path_add(&path, "project", project) != 0))
            rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        if (rc == 0)
            rc = cli_upload(c, path, in, (int64_t)len, "application/gzip", &http, &out, err);
    }
    if (rc == 0) {
        snprintf(source, 100, "%s", cli_jstr(out, "source"));
        fprintf(stderr, "%s %s into project %s\n", http == 201 ? "uploaded" : "already uploaded (nothing sent again):",
                source, cli_jstr(out, "project"));
    }
    if (in)
        fclose(in);
    json_decref(out);
    free(path);
    return rc;
}

static int code_push(cli_client_t *c, int argc, char **argv)
{
    const char *dir = NULL, *project = NULL, *v;
    for (int i = 2; i < argc; i++) {
        int m = cli_opt("code", argc, argv, &i, "--project", "-p", &v);
        if (m < 0)
            return CLI_EXIT_USAGE;
        if (m)
            project = v;
        else if (argv[i][0] == '-' && argv[i][1])
            return cli_usage_error("code", "unknown option %s", argv[i]);
        else if (!dir)
            dir = argv[i];
        else
            return cli_usage_error("code", "one directory at a time (got %s and %s)", dir, argv[i]);
    }
    if (!dir)
        return cli_usage_error("code", "missing the directory to push");
    kiln_err_t err;
    kiln_err_clear(&err);
    char source[100];
    if (cli_code_push(c, dir, project, source, &err) != 0)
        return cli_fail(c, &err);
    printf("%s\n", source);
    return CLI_EXIT_OK;
}

static int code_get(cli_client_t *c, int argc, char **argv)
{
    const char *digest = NULL, *project = NULL, *file = NULL, *v;
    for (int i = 2; i < argc; i++) {
        int m;
        if ((m = cli_opt("code", argc, argv, &i, "--project", "-p", &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            project = v;
        } else if ((m = cli_opt("code", argc, argv, &i, "--output", "-o", &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            file = v;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error("code", "unknown option %s", argv[i]);
        } else if (!digest) {
            digest = argv[i];
        } else {
            return cli_usage_error("code", "unexpected argument %s", argv[i]);
        }
    }
    if (!digest)
        return cli_usage_error("code", "missing the digest (or code:sha256:... source) to get");
    if (!strncmp(digest, "code:sha256:", 12))
        digest += 12;
    char seg[200], name[100];
    int src = cli_path_segment("code", digest, seg, sizeof(seg));
    if (src)
        return src;
    snprintf(name, sizeof(name), "%.64s.tgz", digest);
    char *path = malloc(strlen(seg) + 32);
    if (!path)
        return CLI_EXIT_ERROR;
    sprintf(path, "/v1/code/%s", seg);
    if (project && cli_path_add(&path, "project", project) != 0) {
        free(path);
        return CLI_EXIT_ERROR;
    }
    int rc = cli_download_checked(c, path, name, file ? file : name);
    free(path);
    return rc;
}

int cli_cmd_code(cli_client_t *c, int argc, char **argv)
{
    if (argc < 2)
        return cli_usage_error("code", "missing the command: push or get");
    if (!strcmp(argv[1], "push"))
        return code_push(c, argc, argv);
    if (!strcmp(argv[1], "get"))
        return code_get(c, argc, argv);
    return cli_usage_error("code", "unknown command %s (push or get)", argv[1]);
}
