/* cmd_artifacts.c - `kiln artifacts` (list a job's artifacts, or download one, checked against
 * its SHA-256) and `kiln delete` (remove an ended job and everything it left). */
#include "cli/cli_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cli_download_checked(cli_client_t *c, const char *path, const char *label, const char *file)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    char tmp[4200], etag[80], got[KILN_SHA256_HEX];
    bool to_stdout = !strcmp(file, "-");
    FILE *out = c->data_out ? c->data_out : stdout; /* the bytes as they are, not escaped as text */
    if (!to_stdout) {
        if (snprintf(tmp, sizeof(tmp), "%s.part", file) >= (int)sizeof(tmp)) {
            kiln_err_set(&err, KILN_EINVAL, "-o", "the file name is too long");
            return cli_fail(c, &err);
        }
        if (!(out = fopen(tmp, "wb"))) {
            kiln_err_set(&err, KILN_EIO, "-o", "could not write %s: %s", tmp, strerror(errno));
            return cli_fail(c, &err);
        }
    }
    kiln_sha256_t sha;
    kiln_sha256_init(&sha);
    int64_t bytes = 0;
    int rc = cli_download(c, path, out, &sha, &bytes, etag, &err);
    kiln_sha256_final(&sha, got);
    if (rc == 0 && strcmp(etag, got) != 0)
        rc = kiln_err_set(&err, KILN_ECHECKSUM, NULL, "the download of %s has SHA-256 %s, but kilnd says its SHA-256 "
                          "is %s: it was damaged on the way", label, got, etag[0] ? etag : "(none)");
    if (to_stdout) {
        fflush(out);
    } else {
        if (fclose(out) != 0 && rc == 0)
            rc = kiln_err_set(&err, KILN_EIO, "-o", "could not write %s: %s", tmp, strerror(errno));
        if (rc == 0 && rename(tmp, file) != 0)
            rc = kiln_err_set(&err, KILN_EIO, "-o", "could not rename %s to %s: %s", tmp, file, strerror(errno));
        if (rc)
            unlink(tmp);
    }
    if (rc)
        return cli_fail(c, &err);
    char sz[24];
    fprintf(stderr, "%s: %s (%lld bytes), sha256 %s verified%s%s\n", label, cli_fmt_bytes((double)bytes, sz, sizeof(sz)),
            (long long)bytes, got, to_stdout ? "" : ", saved to ", to_stdout ? "" : file);
    return CLI_EXIT_OK;
}

/* Downloads artifact name of job id into file ("-": stdout); a broken download never leaves a
 * partial file under the name. */
static int artifact_get(cli_client_t *c, const char *id, const char *name, const char *file)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    char seg[KILN_ARTIFACT_NAME_MAX * 3 + 1], path[512], label[KILN_ARTIFACT_NAME_MAX + 16];
    if (!kiln_artifact_name_ok(name, "--get", &err))
        return cli_fail(c, &err);
    int src = cli_path_segment("artifacts", name, seg, sizeof(seg));
    if (src)
        return src;
    snprintf(path, sizeof(path), "/v1/jobs/%s/artifacts/%s", id, seg);
    snprintf(label, sizeof(label), "%s", name);
    return cli_download_checked(c, path, label, file);
}

int cli_cmd_artifacts(cli_client_t *c, int argc, char **argv)
{
    const char *ref = NULL, *extra = NULL, *get = NULL, *file = NULL, *v;
    bool checkpoints = false;
    for (int i = 1; i < argc; i++) {
        int m;
        if (!strcmp(argv[i], "--checkpoints")) {
            checkpoints = true;
        } else if ((m = cli_opt("artifacts", argc, argv, &i, "--get", "-g", &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            get = v;
        } else if ((m = cli_opt("artifacts", argc, argv, &i, "--output", "-o", &v)) != 0) {
            if (m < 0)
                return CLI_EXIT_USAGE;
            file = v;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error("artifacts", "unknown option %s", argv[i]);
        } else if (!ref) {
            ref = argv[i];
        } else if (!extra) {
            extra = argv[i];
        }
    }
    if (extra)
        return cli_usage_error("artifacts", "unexpected argument %s", extra);
    if (!ref)
        return cli_usage_error("artifacts", "missing the job id");
    if (file && !get)
        return cli_usage_error("artifacts", "-o FILE goes with --get NAME");
    if (checkpoints && get)
        return cli_usage_error("artifacts", "--checkpoints lists; it does not go with --get");
    kiln_err_t err;
    kiln_err_clear(&err);
    char id[64], path[160];
    if (cli_resolve_job(c, ref, id, &err) != 0)
        return cli_fail(c, &err);
    if (get)
        return artifact_get(c, id, get, file ? file : get);
    json_t *reply = NULL;
    snprintf(path, sizeof(path), "/v1/jobs/%s/%s", id, checkpoints ? "checkpoints" : "artifacts");
    if (cli_request(c, "GET", path, NULL, NULL, NULL, &reply, &err) != 0)
        return cli_fail(c, &err);
    if (c->json)
        cli_print_out(c, reply);
    else if (checkpoints && !cli_print_names(c, json_object_get(reply, "files"), "name"))
        cli_print_checkpoints(stdout, reply, c->output == CLI_OUT_WIDE);
    else if (!checkpoints && !cli_print_names(c, json_object_get(reply, "artifacts"), "name"))
        cli_print_artifacts(stdout, reply, c->output == CLI_OUT_WIDE);
    json_decref(reply);
    return CLI_EXIT_OK;
}

int cli_cmd_delete(cli_client_t *c, int argc, char **argv)
{
    const char *ref = NULL, *extra = NULL;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-' && argv[i][1])
            return cli_usage_error("delete", "unknown option %s", argv[i]);
        if (!ref)
            ref = argv[i];
        else if (!extra)
            extra = argv[i];
    }
    if (extra)
        return cli_usage_error("delete", "unexpected argument %s", extra);
    if (!ref)
        return cli_usage_error("delete", "missing the job id");
    kiln_err_t err;
    kiln_err_clear(&err);
    char id[64], path[160];
    json_t *reply = NULL;
    if (cli_resolve_job(c, ref, id, &err) != 0)
        return cli_fail(c, &err);
    snprintf(path, sizeof(path), "/v1/jobs/%s", id);
    if (cli_request(c, "DELETE", path, NULL, NULL, NULL, &reply, &err) != 0)
        return cli_fail(c, &err);
    if (c->json) {
        cli_print_out(c, reply);
    } else {
        json_t *removed = json_object_get(reply, "removed");
        char sz[24];
        printf("job %s deleted: %.0f event(s), %.0f log line(s), %.0f metric chunk(s), %.0f artifact(s) (%s)\n", id,
               cli_jnum(removed, "job_events") > 0 ? cli_jnum(removed, "job_events") : 0,
               cli_jnum(removed, "logs") > 0 ? cli_jnum(removed, "logs") : 0,
               cli_jnum(removed, "metric_chunks") > 0 ? cli_jnum(removed, "metric_chunks") : 0,
               cli_jnum(removed, "artifacts") > 0 ? cli_jnum(removed, "artifacts") : 0,
               cli_fmt_bytes(cli_jnum(reply, "artifact_bytes"), sz, sizeof(sz)));
    }
    json_decref(reply);
    return CLI_EXIT_OK;
}
