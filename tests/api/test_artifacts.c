/* test_artifacts.c - artifacts and the end of a job's life through the real service, REST server
 * and database: uploads as an agent makes them (chunks, checksums, offsets, a restarted or
 * second kilnd, another store), downloads with ranges and ETags over HTTP, names that try to
 * leave the store, the per-job limit, model.init_from "job:<id>" at submission, DELETE of a job
 * and the log retention. Checksums are checked against sha256sum, the database by SQL. */
#include <criterion/criterion.h>
#include <libpq-fe.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/api/api_test.h"

TestSuite(artifacts, .init = at_setup, .fini = at_teardown, .timeout = 120);

/* ---- helpers --------------------------------------------------------------------------------- */

/* Pseudo-random bytes (xorshift), so that every offset holds a different value. */
static uint8_t *test_bytes(size_t n, uint64_t seed)
{
    uint8_t *b = malloc(n);
    uint64_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b[i] = (uint8_t)(x >> 24);
    }
    return b;
}

/* A running job of the fixture's worker; its attempt into *attempt. Caller frees. */
static char *running_job(const char *name, int *attempt)
{
    char *id = at_create_job(name, NULL, NULL);
    *attempt = at_run_job(id);
    return id;
}

/* GET (or HEAD) with one extra header line; the body's bytes, length and headers. */
static char *get(const char *method, const char *path, const char *header, long *status, size_t *len, char **hdrs)
{
    char url[512];
    snprintf(url, sizeof url, "%s%s", at_base, path);
    const char *h[] = {header, NULL};
    char *out = NULL;
    cr_assert_eq(th_http_bytes(method, url, NULL, header ? h : NULL, status, &out, len, hdrs, 10000), 0, "%s %s", method,
                 path);
    return out;
}

static bool has_header(const char *hdrs, const char *line)
{
    return hdrs && strcasestr(hdrs, line) != NULL;
}

/* One manifest of n (name, size, sha) through svc s as worker; returns the status, the offsets in
 * off[] (room for n). */
static int begin(svc_t *s, const char *worker, const char *job, int attempt, size_t n, const char *const *names,
                 const int64_t *sizes, const char *const *shas, int64_t *off, kiln_err_t *err)
{
    Kiln__ArtifactFile *f = calloc(n ? n : 1, sizeof(*f));
    Kiln__ArtifactFile **fp = calloc(n ? n : 1, sizeof(*fp));
    for (size_t i = 0; i < n; i++) {
        kiln__artifact_file__init(&f[i]);
        f[i].name = (char *)names[i];
        f[i].size = sizes[i];
        f[i].sha256 = (char *)shas[i];
        fp[i] = &f[i];
    }
    Kiln__ArtifactManifest m = KILN__ARTIFACT_MANIFEST__INIT;
    m.worker_id = (char *)worker;
    m.job_id = (char *)job;
    m.attempt = attempt;
    m.n_files = n;
    m.files = fp;
    Kiln__ArtifactManifestReply r = KILN__ARTIFACT_MANIFEST_REPLY__INIT;
    arena_t a;
    arena_init(&a, 0);
    kiln_err_clear(err);
    int rc = svc_agent_artifacts_begin(s, worker, &m, &a, &r, err);
    for (size_t i = 0; rc == 0 && off && i < r.n_files; i++)
        off[i] = r.files[i]->offset;
    arena_deinit(&a);
    free(f);
    free(fp);
    return rc;
}

static int chunk(svc_t *s, const char *job, int attempt, const char *name, int64_t off, const void *data, size_t n,
                 const char *sha, int64_t *new_off, kiln_err_t *err)
{
    char csha[KILN_SHA256_HEX];
    kiln_sha256_hex(data, n, csha);
    Kiln__ArtifactChunk c = KILN__ARTIFACT_CHUNK__INIT;
    c.worker_id = at_worker;
    c.job_id = (char *)job;
    c.attempt = attempt;
    c.name = (char *)name;
    c.offset = off;
    c.data.data = (uint8_t *)data;
    c.data.len = n;
    c.sha256 = (char *)(sha ? sha : csha);
    Kiln__ArtifactChunkReply r = KILN__ARTIFACT_CHUNK_REPLY__INIT;
    kiln_err_clear(err);
    int rc = svc_agent_artifact_chunk(s, at_worker, &c, &r, err);
    if (new_off)
        *new_off = r.offset;
    return rc;
}

static int64_t offset_of(svc_t *s, const char *job, int attempt, const char *name, int64_t size, const char *sha)
{
    int64_t off = -1;
    kiln_err_t err;
    cr_assert_eq(begin(s, at_worker, job, attempt, 1, &name, &size, &sha, &off, &err), 0, "%s", err.message);
    return off;
}

/* ---- downloads ------------------------------------------------------------------------------- */

Test(artifacts, a_model_uploaded_in_chunks_downloads_byte_for_byte_with_ranges)
{
    int attempt;
    char *job = running_job("ranges", &attempt);
    size_t n = 300000;
    uint8_t *data = test_bytes(n, 1);
    kiln_err_t err;
    cr_assert_eq(at_upload(at_svc, at_worker, job, attempt, "model_llmc.bin", data, n, 65536, &err), 0, "%s",
                 err.message);
    char want[65];
    at_sha256sum(data, n, want);

    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts", job);
    long st;
    json_t *list = at_req("GET", path, NULL, NULL, &st, NULL);
    cr_assert_eq(st, 200);
    json_t *a = json_array_get(json_object_get(list, "artifacts"), 0);
    cr_assert_eq(json_array_size(json_object_get(list, "artifacts")), 1);
    cr_assert_str_eq(json_string_value(json_object_get(a, "name")), "model_llmc.bin");
    cr_assert_eq(json_integer_value(json_object_get(a, "size")), (json_int_t)n);
    cr_assert_str_eq(json_string_value(json_object_get(a, "sha256")), want);
    cr_assert_eq(json_integer_value(json_object_get(a, "attempt")), attempt);
    cr_assert(json_string_value(json_object_get(a, "created_at")));
    json_decref(list);

    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts/model_llmc.bin", job);
    char etag[80], *hdrs = NULL;
    snprintf(etag, sizeof etag, "ETag: \"%s\"", want);
    size_t len = 0;
    char *body = get("GET", path, NULL, &st, &len, &hdrs);
    cr_assert_eq(st, 200);
    cr_assert_eq(len, n);
    cr_assert(!memcmp(body, data, n), "the download is the file, byte for byte");
    cr_assert(has_header(hdrs, etag), "%s", hdrs);
    cr_assert(has_header(hdrs, "Accept-Ranges: bytes"));
    cr_assert(has_header(hdrs, "Content-Type: application/octet-stream"));
    free(body);
    free(hdrs);

    struct {
        const char *range;
        long status;
        long first, count;        /* the bytes expected (status 206), or the whole file */
        const char *content_range;
    } cases[] = {
        {"Range: bytes=0-99", 206, 0, 100, "Content-Range: bytes 0-99/300000"},
        {"Range: bytes=299990-", 206, 299990, 10, "Content-Range: bytes 299990-299999/300000"},
        {"Range: bytes=-5", 206, 299995, 5, "Content-Range: bytes 299995-299999/300000"},
        {"Range: bytes=1000-9999999", 206, 1000, 299000, "Content-Range: bytes 1000-299999/300000"},
        {"Range: bytes=-400000", 206, 0, 300000, "Content-Range: bytes 0-299999/300000"},
        {"Range: bytes=100-50", 200, 0, 300000, NULL},         /* malformed: ignored */
        {"Range: bytes=0-1,5-9", 200, 0, 300000, NULL},        /* several: the whole file */
        {"Range: pages=1-2", 200, 0, 300000, NULL},
        {"Range: bytes=300000-", 416, 0, 0, "Content-Range: bytes */300000"},
        {"Range: bytes=-0", 416, 0, 0, "Content-Range: bytes */300000"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        body = get("GET", path, cases[i].range, &st, &len, &hdrs);
        cr_assert_eq(st, cases[i].status, "%s: %ld", cases[i].range, st);
        if (cases[i].content_range)
            cr_assert(has_header(hdrs, cases[i].content_range), "%s: %s", cases[i].range, hdrs);
        if (st == 416) {
            cr_assert(strstr(body, "\"code\":\"range_not_satisfiable\""), "%s", body);
        } else {
            cr_assert_eq((long)len, cases[i].count, "%s: %zu bytes", cases[i].range, len);
            cr_assert(!memcmp(body, data + cases[i].first, len), "%s: the right bytes", cases[i].range);
        }
        free(body);
        free(hdrs);
    }
    /* If-Range with another entity: the Range is ignored. If-None-Match with ours: 304. */
    char hdr[120];
    const char *h2[] = {"Range: bytes=0-9", hdr, NULL};
    snprintf(hdr, sizeof hdr, "If-Range: \"0000\"");
    char url[512], *out = NULL;
    snprintf(url, sizeof url, "%s%s", at_base, path);
    cr_assert_eq(th_http_bytes("GET", url, NULL, h2, &st, &out, &len, NULL, 10000), 0);
    cr_assert_eq(st, 200);
    cr_assert_eq(len, n);
    free(out);
    snprintf(hdr, sizeof hdr, "If-Range: \"%s\"", want);
    cr_assert_eq(th_http_bytes("GET", url, NULL, h2, &st, &out, &len, NULL, 10000), 0);
    cr_assert_eq(st, 206);
    cr_assert_eq(len, 10);
    free(out);
    snprintf(hdr, sizeof hdr, "If-None-Match: \"%s\"", want);
    body = get("GET", path, hdr, &st, &len, &hdrs);
    cr_assert_eq(st, 304);
    cr_assert_eq(len, 0);
    free(body);
    free(hdrs);
    /* HEAD: the headers, no body */
    body = get("HEAD", path, NULL, &st, &len, &hdrs);
    cr_assert_eq(st, 200);
    cr_assert_eq(len, 0);
    cr_assert(has_header(hdrs, "Content-Length: 300000"), "%s", hdrs);
    free(body);
    free(hdrs);
    free(data);
    free(job);
}

Test(artifacts, names_that_leave_the_store_are_refused)
{
    int attempt;
    char *job = running_job("names", &attempt);
    char sha[KILN_SHA256_HEX];
    kiln_sha256_hex("x", 1, sha);
    char long_name[200];
    memset(long_name, 'a', 129);
    long_name[129] = '\0';
    const char *bad[] = {"../x", "../../../../etc/cron.d/evil", "/etc/passwd", "a/b", "..", ".", ".hidden", "",
                         long_name, "x\ny", "a b", "-rf", "model\\x", "caf\xc3\xa9"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kiln_err_t err;
        int64_t size = 1;
        const char *shas[] = {sha};
        int rc = begin(at_svc, at_worker, job, attempt, 1, &bad[i], &size, shas, NULL, &err);
        cr_assert_eq(rc, KILN_EINVAL, "\"%s\": %d", bad[i], rc);
        cr_assert_str_eq(err.field, "files[0].name", "\"%s\"", bad[i]);
        cr_assert(err.hint[0], "the refusal says which names are allowed");
        /* nor through a chunk */
        rc = chunk(at_svc, job, attempt, bad[i], 0, "x", 1, NULL, NULL, &err);
        cr_assert_eq(rc, KILN_EINVAL, "chunk \"%s\"", bad[i]);
    }
    /* the same name twice, too many files */
    {
        const char *names[] = {"a.bin", "a.bin"};
        int64_t sizes[] = {1, 1};
        const char *shas[] = {sha, sha};
        kiln_err_t err;
        cr_assert_eq(begin(at_svc, at_worker, job, attempt, 2, names, sizes, shas, NULL, &err), KILN_EINVAL);
        cr_assert(strstr(err.message, "twice"), "%s", err.message);
    }
    {
        size_t n = 257;
        const char **names = calloc(n, sizeof(*names));
        int64_t *sizes = calloc(n, sizeof(*sizes));
        const char **shas = calloc(n, sizeof(*shas));
        char (*nb)[16] = calloc(n, 16);
        for (size_t i = 0; i < n; i++) {
            snprintf(nb[i], 16, "f%zu", i);
            names[i] = nb[i];
            sizes[i] = 1;
            shas[i] = sha;
        }
        kiln_err_t err;
        cr_assert_eq(begin(at_svc, at_worker, job, attempt, n, names, sizes, shas, NULL, &err), KILN_EINVAL);
        cr_assert_str_eq(err.field, "files");
        free(names);
        free(sizes);
        free(shas);
        free(nb);
    }
    /* Downloads: a name that cannot exist is a 400 naming the field; one with '/' no route. */
    const char *paths[] = {"%2e%2e", ".hidden", "%2Fetc%2Fpasswd", "..%2F..%2Fadmin.token", long_name};
    const long want[] = {400, 400, 404, 404, 400};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        char p[512];
        snprintf(p, sizeof p, "/v1/jobs/%s/artifacts/%s", job, paths[i]);
        long st;
        size_t len;
        char *body = get("GET", p, NULL, &st, &len, NULL);
        cr_assert_eq(st, want[i], "%s: %ld %s", paths[i], st, body);
        cr_assert(!strstr(body, "kiln_"), "no secret comes back");
        free(body);
    }
    /* Nothing was written anywhere. */
    cr_assert_eq(at_sql_int("SELECT count(*) FROM artifacts"), 0);
    char dir[256];
    struct stat sb;
    snprintf(dir, sizeof dir, "%s/artifacts/jobs", at_dir_path());
    cr_assert(stat(dir, &sb) != 0, "no job directory was made in the store");
    free(job);
}

/* ---- checksums, offsets, limits ----------------------------------------------------------------- */

Test(artifacts, a_damaged_chunk_or_a_wrong_checksum_is_refused)
{
    int attempt;
    char *job = running_job("damaged", &attempt);
    size_t n = 1000;
    uint8_t *data = test_bytes(n, 2);
    char sha[KILN_SHA256_HEX];
    kiln_sha256_hex(data, n, sha);
    const char *name = "model_llmc.bin";
    int64_t size = (int64_t)n, off = -1;
    kiln_err_t err;
    cr_assert_eq(offset_of(at_svc, job, attempt, name, size, sha), 0);

    /* a chunk whose bytes do not match its SHA-256 (one bit flipped on the way) */
    char chunk_sha[KILN_SHA256_HEX];
    kiln_sha256_hex(data, 400, chunk_sha);
    uint8_t *flipped = malloc(400);
    memcpy(flipped, data, 400);
    flipped[123] ^= 0x10;
    cr_assert_eq(chunk(at_svc, job, attempt, name, 0, flipped, 400, chunk_sha, NULL, &err), KILN_ECHECKSUM);
    cr_assert(strstr(err.message, "does not match"), "%s", err.message);
    cr_assert_eq(kiln_status_grpc(KILN_ECHECKSUM), 15, "agents see DATA_LOSS");
    cr_assert_eq(offset_of(at_svc, job, attempt, name, size, sha), 0, "nothing of it was kept");
    cr_assert_eq(at_sql_int("SELECT received FROM artifacts WHERE job_id = '%s'", job), 0);

    /* the right chunk, then one at the wrong offset, then one past the end */
    cr_assert_eq(chunk(at_svc, job, attempt, name, 0, data, 400, NULL, &off, &err), 0, "%s", err.message);
    cr_assert_eq(off, 400);
    cr_assert_eq(chunk(at_svc, job, attempt, name, 0, data, 400, NULL, NULL, &err), KILN_ESTATE);
    cr_assert(strstr(err.message, "400"), "says what kilnd holds: %s", err.message);
    cr_assert_eq(chunk(at_svc, job, attempt, name, 500, data + 500, 100, NULL, NULL, &err), KILN_ESTATE);
    uint8_t big[700] = {0};
    cr_assert_eq(chunk(at_svc, job, attempt, name, 400, big, sizeof big, NULL, NULL, &err), KILN_EINVAL);
    cr_assert_eq(offset_of(at_svc, job, attempt, name, size, sha), 400, "the durable offset is unchanged");

    /* every chunk right, but the whole file is not what the manifest declared */
    char wrong[KILN_SHA256_HEX];
    kiln_sha256_hex("something else", 14, wrong);
    cr_assert_eq(offset_of(at_svc, job, attempt, name, size, wrong), 0, "a new declaration starts over");
    cr_assert_eq(chunk(at_svc, job, attempt, name, 0, data, 600, NULL, &off, &err), 0, "%s", err.message);
    cr_assert_eq(chunk(at_svc, job, attempt, name, 600, data + 600, 400, NULL, NULL, &err), KILN_ECHECKSUM);
    cr_assert_str_eq(err.field, "sha256");
    cr_assert_eq(at_sql_int("SELECT count(*) FROM artifacts WHERE state = 'COMPLETE'"), 0, "never listed");
    cr_assert_eq(offset_of(at_svc, job, attempt, name, size, wrong), 0, "its bytes were dropped");
    char p[256];
    snprintf(p, sizeof p, "/v1/jobs/%s/artifacts/%s", job, name);
    long st;
    size_t len;
    char *body = get("GET", p, NULL, &st, &len, NULL);
    cr_assert_eq(st, 404);
    free(body);

    /* and declared right, it goes through */
    cr_assert_eq(at_upload(at_svc, at_worker, job, attempt, name, data, n, 300, &err), 0, "%s", err.message);
    body = get("GET", p, NULL, &st, &len, NULL);
    cr_assert_eq(st, 200);
    cr_assert_eq(len, n);
    cr_assert(!memcmp(body, data, n));
    free(body);
    free(flipped);
    free(data);
    free(job);
}

Test(artifacts, an_upload_continues_where_the_store_left_it_on_another_kilnd)
{
    int attempt;
    char *job = running_job("resume", &attempt);
    size_t n = 200000;
    uint8_t *data = test_bytes(n, 3);
    char sha[KILN_SHA256_HEX];
    kiln_sha256_hex(data, n, sha);
    const char *name = "model_llmc.bin";
    kiln_err_t err;
    cr_assert_eq(offset_of(at_svc, job, attempt, name, (int64_t)n, sha), 0);
    int64_t off = 0;
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(chunk(at_svc, job, attempt, name, off, data + off, 50000, NULL, &off, &err), 0, "%s", err.message);
    }
    cr_assert_eq(off, 150000);
    /* Bytes written after the last recorded offset (a kilnd killed between its write and its
     * commit) must not survive: put some there. */
    char partial[512];
    snprintf(partial, sizeof partial, "%s/artifacts/jobs/%s/%d/.%s.partial", at_dir_path(), job, attempt, name);
    FILE *f = fopen(partial, "ab");
    cr_assert(f, "the partial file is where the store keeps it");
    fputs("GARBAGE NEVER RECORDED", f);
    fclose(f);

    /* A second kilnd on the same database and directory (a restarted one, or a replica). */
    char dir[256];
    snprintf(dir, sizeof dir, "%s/artifacts", at_dir_path());
    svc_config_t cfg = {.database_url = at_db_url(), .heartbeat_timeout_ms = 60000, .db_pool_size = 2,
                        .artifact_dir = dir};
    svc_t *s2 = NULL;
    cr_assert_eq(svc_create(&cfg, &s2, &err), 0, "%s", err.message);
    cr_assert_eq(offset_of(s2, job, attempt, name, (int64_t)n, sha), 150000, "the durable offset, not 0");
    cr_assert_eq(chunk(s2, job, attempt, name, off, data + off, n - (size_t)off, NULL, &off, &err), 0, "%s",
                 err.message);
    cr_assert_eq(off, (int64_t)n);
    svc_destroy(s2);
    char p[256];
    snprintf(p, sizeof p, "/v1/jobs/%s/artifacts/%s", job, name);
    long st;
    size_t len;
    char *body = get("GET", p, NULL, &st, &len, NULL);
    cr_assert_eq(st, 200);
    cr_assert_eq(len, n);
    cr_assert(!memcmp(body, data, n), "whole and in order, without the garbage");
    free(body);

    /* A replica with a store of its own: it does not serve bytes it does not hold, and says
     * where they are; an upload that reaches it starts that file over in its own store. */
    snprintf(dir, sizeof dir, "%s/other-store", at_dir_path());
    cfg.artifact_dir = dir;
    svc_t *s3 = NULL;
    cr_assert_eq(svc_create(&cfg, &s3, &err), 0, "%s", err.message);
    svc_artifact_file_t af;
    cr_assert_eq(svc_job_artifact_open(s3, svc_caller_kilnd(), job, name, &af, &err), KILN_EUNAVAIL);
    cr_assert(strstr(err.message, "artifact store st-"), "names the store: %s", err.message);
    cr_assert(strstr(err.hint, "--artifact-dir"), "%s", err.hint);
    cr_assert_eq(kiln_status_http(KILN_EUNAVAIL), 503);
    char sha2[KILN_SHA256_HEX];
    kiln_sha256_hex(data, 1000, sha2);
    const char *name2 = "samples.txt";
    cr_assert_eq(offset_of(at_svc, job, attempt, name2, 1000, sha2), 0);
    cr_assert_eq(chunk(at_svc, job, attempt, name2, 0, data, 500, NULL, &off, &err), 0, "%s", err.message);
    cr_assert_eq(offset_of(s3, job, attempt, name2, 1000, sha2), 0, "another store holds none of it");
    cr_assert_eq(chunk(at_svc, job, attempt, name2, 500, data + 500, 500, NULL, NULL, &err), KILN_ESTATE,
                 "the first store's upload was taken over");
    cr_assert_eq(chunk(s3, job, attempt, name2, 0, data, 1000, NULL, &off, &err), 0, "%s", err.message);
    cr_assert_eq(svc_job_artifact_open(s3, svc_caller_kilnd(), job, name2, &af, &err), 0, "%s", err.message);
    close(af.fd);
    svc_destroy(s3);
    free(data);
    free(job);
}

Test(artifacts, only_rank_0s_worker_uploads_and_a_job_s_total_is_bounded)
{
    int attempt;
    char *job = running_job("owner", &attempt);
    char sha[KILN_SHA256_HEX];
    kiln_sha256_hex("x", 1, sha);
    /* another worker */
    arena_t a;
    arena_init(&a, 0);
    Kiln__RegisterRequest req = KILN__REGISTER_REQUEST__INIT;
    Kiln__RegisterResponse out = KILN__REGISTER_RESPONSE__INIT;
    req.hostname = "intruder";
    req.slots = 1;
    req.slot_type = "cpu";
    kiln_err_t err;
    cr_assert_eq(svc_agent_register(at_svc, &req, NULL, &a, &out, &err), 0, "%s", err.message);
    char other[128];
    kiln_strlcpy(other, out.worker_id, sizeof other);
    arena_deinit(&a);
    const char *name = "model_llmc.bin";
    int64_t size = 1;
    const char *shas[] = {sha};
    cr_assert_eq(begin(at_svc, other, job, attempt, 1, &name, &size, shas, NULL, &err), KILN_EPERM);
    cr_assert_eq(begin(at_svc, at_worker, job, attempt + 1, 1, &name, &size, shas, NULL, &err), KILN_EPERM,
                 "nor for an attempt it was not given");
    /* more than the per-job limit (10 GiB by default): refused before any byte */
    const char *names[] = {"a.bin", "b.bin"};
    int64_t sizes[] = {(int64_t)6 << 30, (int64_t)5 << 30};
    const char *shas2[] = {sha, sha};
    cr_assert_eq(begin(at_svc, at_worker, job, attempt, 2, names, sizes, shas2, NULL, &err), KILN_ETOOBIG);
    cr_assert(strstr(err.message, "10240 MiB"), "%s", err.message);
    cr_assert(strstr(err.hint, "--artifact-max-job-mb"), "%s", err.hint);
    cr_assert_eq(kiln_status_grpc(KILN_ETOOBIG), 3, "agents do not retry it");
    cr_assert_eq(at_sql_int("SELECT count(*) FROM artifacts"), 0);
    free(job);
}

/* ---- deletion ------------------------------------------------------------------------------------ */

Test(artifacts, delete_removes_everything_of_an_ended_job_and_409s_a_running_one)
{
    int attempt;
    char *job = running_job("doomed", &attempt);
    int a_other;
    char *other = running_job("bystander", &a_other);
    at_push_logs(job, attempt, "line", 0, 7000);
    at_push_logs(other, a_other, "other", 0, 3);
    Kiln__MetricPoint pt = KILN__METRIC_POINT__INIT, *pts[1] = {&pt};
    pt.name = "train_loss";
    pt.step = 1;
    pt.value = 2.5;
    Kiln__MetricBatch mb = KILN__METRIC_BATCH__INIT;
    mb.worker_id = at_worker;
    mb.job_id = job;
    mb.attempt = attempt;
    mb.n_points = 1;
    mb.points = pts;
    kiln_err_t err;
    cr_assert_eq(svc_agent_metrics(at_svc, at_worker, &mb, &err), 0, "%s", err.message);
    uint8_t *data = test_bytes(5000, 4);
    cr_assert_eq(at_upload(at_svc, at_worker, job, attempt, "model_llmc.bin", data, 5000, 4096, &err), 0, "%s",
                 err.message);
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s", job);
    long st;
    char *raw = NULL;
    json_t *j = at_req("DELETE", path, NULL, NULL, &st, &raw);
    cr_assert_eq(st, 409, "a running job: %s", raw);
    cr_assert_str_eq(json_string_value(json_object_get(j, "code")), "failed_precondition");
    cr_assert(strstr(json_string_value(json_object_get(j, "hint")), "kiln stop"), "%s", raw);
    json_decref(j);
    free(raw);

    at_rank_exit(job, attempt, 0);
    j = at_req("DELETE", path, NULL, NULL, &st, &raw);
    cr_assert_eq(st, 200, "%s", raw);
    json_t *rm = json_object_get(j, "removed");
    cr_assert_eq(json_integer_value(json_object_get(rm, "logs")), 7000, "%s", raw);
    cr_assert_eq(json_integer_value(json_object_get(rm, "artifacts")), 1, "%s", raw);
    cr_assert_gt(json_integer_value(json_object_get(rm, "job_events")), 3, "%s", raw);
    cr_assert_eq(json_integer_value(json_object_get(rm, "assignments")), 1, "%s", raw);
    cr_assert_eq(json_integer_value(json_object_get(rm, "rank_exits")), 1, "%s", raw);
    cr_assert_eq(json_integer_value(json_object_get(rm, "metric_chunks")), 1, "%s", raw);
    cr_assert_eq(json_integer_value(json_object_get(j, "artifact_bytes")), 5000);
    json_decref(j);
    free(raw);
    /* nothing of it is left in any table that holds a job id, nor in the store */
    PGconn *c = PQconnectdb(at_db_url());
    PGresult *r = PQexec(c, "SELECT table_name FROM information_schema.columns WHERE column_name = 'job_id'"
                            " AND table_schema = current_schema()");
    cr_assert_eq(PQresultStatus(r), PGRES_TUPLES_OK);
    cr_assert_geq(PQntuples(r), 7);
    for (int i = 0; i < PQntuples(r); i++)
        cr_assert_eq(at_sql_int("SELECT count(*) FROM %s WHERE job_id = '%s'", PQgetvalue(r, i, 0), job), 0,
                     "%s still holds rows of the job", PQgetvalue(r, i, 0));
    PQclear(r);
    PQfinish(c);
    cr_assert_eq(at_sql_int("SELECT count(*) FROM jobs WHERE id = '%s'", job), 0);
    cr_assert_eq(at_sql_int("SELECT count(*) FROM logs WHERE job_id = '%s'", other), 3, "other jobs keep theirs");
    char dir[256];
    struct stat sb;
    snprintf(dir, sizeof dir, "%s/artifacts/jobs/%s", at_dir_path(), job);
    cr_assert(stat(dir, &sb) != 0, "the job's files are gone from the store");
    json_decref(at_req("GET", path, NULL, NULL, &st, NULL));
    cr_assert_eq(st, 404);
    json_decref(at_req("DELETE", path, NULL, NULL, &st, NULL));
    cr_assert_eq(st, 404);
    free(data);
    free(job);
    free(other);
}

/* ---- init_from ------------------------------------------------------------------------------------ */

static char *spec_from(const char *name, const char *init_from, int n_layer)
{
    static char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"name\": \"%s\", \"model\": {\"type\": \"gpt\", \"n_layer\": %d, \"n_head\": 2, \"n_embd\": 16,"
             " \"seq_len\": 8, \"init_from\": \"%s\"}, \"data\": {\"train\": \"file:///tmp/kiln-api-test.txt\"},"
             " \"hyperparameters\": {\"lr\": 0.001, \"global_batch_size\": 2, \"max_steps\": 5},"
             " \"resources\": {\"nodes\": 1, \"slots_per_node\": 1, \"slot_type\": \"cpu\"}}",
             name, n_layer, init_from);
    return buf;
}

Test(artifacts, init_from_a_job_is_checked_at_submission_and_travels_in_the_assignment)
{
    int attempt;
    char *src = running_job("source", &attempt);
    char ref[64];
    snprintf(ref, sizeof ref, "job:%s", src);
    long st;
    char *raw = NULL;
    /* no model yet */
    json_t *j = at_req("POST", "/v1/jobs", spec_from("early", ref, 1), NULL, &st, &raw);
    cr_assert_eq(st, 400, "%s", raw);
    cr_assert_str_eq(json_string_value(json_object_get(j, "field")), "model.init_from");
    cr_assert(strstr(raw, "no model artifact"), "%s", raw);
    json_decref(j);
    free(raw);
    uint8_t *data = test_bytes(3000, 5);
    kiln_err_t err;
    cr_assert_eq(at_upload(at_svc, at_worker, src, attempt, KILN_ARTIFACT_MODEL, data, 3000, 1024, &err), 0, "%s",
                 err.message);
    at_rank_exit(src, attempt, 0);
    const struct {
        const char *init_from;
        int n_layer;
        const char *says;
    } bad[] = {
        {"job:00000000-0000-0000-0000-000000000000", 1, "does not exist"},
        {"job:not-a-uuid", 1, "names no job"},
        {"job:", 1, "names no job"},
        {ref, 2, "n_layer"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        j = at_req("POST", "/v1/jobs", spec_from("bad", bad[i].init_from, bad[i].n_layer), NULL, &st, &raw);
        cr_assert_eq(st, 400, "%s: %s", bad[i].init_from, raw);
        cr_assert_str_eq(json_string_value(json_object_get(j, "field")), "model.init_from", "%s", raw);
        cr_assert(strstr(raw, bad[i].says), "%s: %s", bad[i].init_from, raw);
        json_decref(j);
        free(raw);
    }
    j = at_req("POST", "/v1/jobs",
               "{\"model\": {\"type\": \"mlp\", \"n_inputs\": 4, \"n_classes\": 2, \"init_from\": \"/tmp/m.bin\"},"
               " \"data\": {\"train\": \"synthetic\"}}", NULL, &st, &raw);
    cr_assert_eq(st, 400, "an mlp has no llm.c model to start from: %s", raw);
    json_decref(j);
    free(raw);
    /* A user who cannot read the source job's project is told what one who names a missing job
     * is told. */
    json_decref(at_req("POST", "/v1/projects", "{\"name\": \"q\"}", NULL, &st, NULL));
    json_decref(at_req("POST", "/v1/users", "{\"name\": \"outsider\"}", NULL, &st, NULL));
    json_decref(at_req("PUT", "/v1/projects/q/members/outsider", "{\"role\": \"editor\"}", NULL, &st, NULL));
    json_t *t = at_req("POST", "/v1/users/outsider/tokens", "{}", NULL, &st, NULL);
    char auth[200];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", json_string_value(json_object_get(t, "token")));
    json_decref(t);
    const char *hdrs[] = {auth, NULL};
    char spec[1100];
    snprintf(spec, sizeof spec, "%s", spec_from("sneaky", ref, 1));
    memmove(spec + 1 + strlen("\"project\": \"q\", "), spec + 1, strlen(spec));
    memcpy(spec + 1, "\"project\": \"q\", ", strlen("\"project\": \"q\", "));
    j = at_req("POST", "/v1/jobs", spec, hdrs, &st, &raw);
    cr_assert_eq(st, 400, "%s", raw);
    cr_assert(strstr(raw, "does not exist or is in a project you cannot read"), "%s", raw);
    json_decref(j);
    free(raw);

    /* right: accepted, no data root needed for it, and the assignment says what to fetch */
    j = at_req("POST", "/v1/jobs", spec_from("child", ref, 1), NULL, &st, &raw);
    cr_assert_eq(st, 201, "%s", raw);
    char child[64];
    kiln_strlcpy(child, json_string_value(json_object_get(j, "id")), sizeof child);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(json_object_get(j, "spec"), "model"),
                                                       "init_from")), ref);
    json_decref(j);
    free(raw);
    cr_assert_eq(at_sql_int("SELECT count(*) FROM jobs WHERE id = '%s' AND data_paths::text LIKE '%%job:%%'", child), 0,
                 "job:<id> is no file the agents' data roots must hold");
    char want[65];
    at_sha256sum(data, 3000, want);
    arena_t a;
    arena_init(&a, 0);
    const Kiln__Assignment *as = NULL;
    for (int i = 0; i < 200 && !as; i++) {
        Kiln__HeartbeatRequest hb = KILN__HEARTBEAT_REQUEST__INIT;
        Kiln__HeartbeatResponse out = KILN__HEARTBEAT_RESPONSE__INIT;
        hb.worker_id = at_worker;
        cr_assert_eq(svc_agent_heartbeat(at_svc, at_worker, &hb, &a, &out, &err), 0, "%s", err.message);
        for (size_t k = 0; k < out.n_assignments; k++)
            if (!strcmp(out.assignments[k]->job_id, child))
                as = out.assignments[k];
        if (!as)
            usleep(50000);
    }
    cr_assert(as, "the child job was assigned");
    cr_assert_str_eq(as->init_from_job, src);
    cr_assert_eq(as->init_from_size, 3000);
    cr_assert_str_eq(as->init_from_sha256, want);
    for (size_t i = 0; i < as->n_read_paths; i++)
        cr_assert_str_neq(as->read_paths[i]->field, "model.init_from");
    /* the worker fetches it for the job it is assigned: the same bytes */
    Kiln__InitModelRequest mr = KILN__INIT_MODEL_REQUEST__INIT;
    mr.worker_id = at_worker;
    mr.job_id = child;
    mr.attempt = as->attempt;
    mr.offset = 1000;
    mr.max_bytes = 1500;
    Kiln__InitModelChunk mc = KILN__INIT_MODEL_CHUNK__INIT;
    cr_assert_eq(svc_agent_init_model(at_svc, at_worker, &mr, &a, &mc, &err), 0, "%s", err.message);
    cr_assert_eq(mc.data.len, 1500);
    cr_assert(!memcmp(mc.data.data, data + 1000, 1500));
    cr_assert_str_eq(mc.sha256, want);
    /* but not for a job it is not assigned (the source itself, whose attempt it ran, has no
     * init_from; a job of nobody's is refused) */
    mr.job_id = src;
    mr.attempt = attempt;
    cr_assert_eq(svc_agent_init_model(at_svc, at_worker, &mr, &a, &mc, &err), KILN_EINVAL);
    mr.job_id = child;
    mr.attempt = as->attempt + 1;
    cr_assert_eq(svc_agent_init_model(at_svc, at_worker, &mr, &a, &mc, &err), KILN_EPERM);
    arena_deinit(&a);
    /* the source cannot go while its child has not ended */
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", src);
    j = at_req("DELETE", path, NULL, NULL, &st, &raw);
    cr_assert_eq(st, 409, "%s", raw);
    cr_assert(strstr(raw, child), "names the job that needs it: %s", raw);
    json_decref(j);
    free(raw);
    free(data);
    free(src);
}

/* A user with the given roles ({project, role} pairs, NULL-ended), and the header line of a token of
 * it into auth (200 bytes). */
static void user_with(const char *name, const char *const *grants, char *auth)
{
    long st;
    char body[128], path[160];
    snprintf(body, sizeof body, "{\"name\": \"%s\"}", name);
    json_decref(at_req("POST", "/v1/users", body, NULL, &st, NULL));
    cr_assert_eq(st, 201);
    for (int i = 0; grants[i]; i += 2) {
        snprintf(path, sizeof path, "/v1/projects/%s/members/%s", grants[i], name);
        snprintf(body, sizeof body, "{\"role\": \"%s\"}", grants[i + 1]);
        json_decref(at_req("PUT", path, body, NULL, &st, NULL));
        cr_assert_lt(st, 300, "%s", path);
    }
    snprintf(path, sizeof path, "/v1/users/%s/tokens", name);
    json_t *t = at_req("POST", path, "{}", NULL, &st, NULL);
    snprintf(auth, 200, "Authorization: Bearer %s", json_string_value(json_object_get(t, "token")));
    json_decref(t);
}

/* The job that keeps another from being deleted (it starts from its model) is named only to who
 * may read it: to a member of the deleted job's project alone it is "a job of another project",
 * in the message and in the hint. */
Test(artifacts, delete_names_a_job_that_needs_its_model_only_to_who_may_read_it)
{
    int attempt;
    char *src = running_job("source", &attempt);
    char ref[64];
    snprintf(ref, sizeof ref, "job:%s", src);
    uint8_t *data = test_bytes(3000, 5);
    kiln_err_t err;
    cr_assert_eq(at_upload(at_svc, at_worker, src, attempt, KILN_ARTIFACT_MODEL, data, 3000, 1024, &err), 0, "%s",
                 err.message);
    at_rank_exit(src, attempt, 0);
    long st;
    char *raw = NULL;
    json_decref(at_req("POST", "/v1/projects", "{\"name\": \"q\"}", NULL, &st, NULL));
    cr_assert_eq(st, 201);
    /* a job of project q starts from it: its submitter (the cluster admin) reads both */
    char spec[1100];
    snprintf(spec, sizeof spec, "{\"project\": \"q\", %s", spec_from("child", ref, 1) + 1);
    json_t *j = at_req("POST", "/v1/jobs", spec, NULL, &st, &raw);
    cr_assert_eq(st, 201, "%s", raw);
    char child[64];
    kiln_strlcpy(child, json_string_value(json_object_get(j, "id")), sizeof child);
    json_decref(j);
    free(raw);
    char mine[200], both[200];
    user_with("mine", (const char *[]){"default", "editor", NULL}, mine);
    user_with("both", (const char *[]){"default", "editor", "q", "viewer", NULL}, both);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", src);
    const struct {
        const char *who, *auth;
        bool named;
    } callers[] = {{"an editor of its project alone", mine, false}, {"a member of both projects", both, true},
                   {"the cluster admin", NULL, true}};
    for (size_t i = 0; i < sizeof callers / sizeof callers[0]; i++) {
        const char *hdrs[] = {callers[i].auth, NULL};
        j = at_req("DELETE", path, NULL, callers[i].auth ? hdrs : NULL, &st, &raw);
        cr_assert_eq(st, 409, "%s: %s", callers[i].who, raw);
        const char *m = json_string_value(json_object_get(j, "message"));
        const char *h = json_string_value(json_object_get(j, "hint"));
        cr_assert(m && h, "%s", raw);
        if (callers[i].named) {
            cr_assert(strstr(m, child) && strstr(h, child), "%s: names the job: %s", callers[i].who, raw);
        } else {
            cr_assert(!strstr(raw, child), "%s: the job of project q is not named: %s", callers[i].who, raw);
            cr_assert_str_eq(m, "a job of another project starts from this job's model (model.init_from) and has "
                                "not ended", "%s", raw);
        }
        json_decref(j);
        free(raw);
    }
    cr_assert_eq(at_sql_int("SELECT count(*) FROM jobs WHERE id = '%s'", src), 1, "nothing was deleted");
    free(data);
    free(src);
}

/* ---- log retention --------------------------------------------------------------------------------- */

Test(artifacts, retention_drops_the_logs_of_long_ended_jobs_only)
{
    int a_old, a_recent, a_running;
    char *old = running_job("old", &a_old);
    char *recent = running_job("recent", &a_recent);
    char *live = running_job("live", &a_running);
    at_push_logs(old, a_old, "old", 0, 12345); /* more than one batch */
    at_push_logs(recent, a_recent, "recent", 0, 40);
    at_push_logs(live, a_running, "live", 0, 30);
    at_rank_exit(old, a_old, 0);
    at_rank_exit(recent, a_recent, 0);
    at_sql_int("UPDATE jobs SET ended_at = now() - interval '10 days' WHERE id = '%s'", old);
    at_sql_int("UPDATE jobs SET ended_at = now() - interval '1 day' WHERE id = '%s'", recent);
    at_sql_int("UPDATE jobs SET started_at = now() - interval '30 days', created_at = now() - interval '30 days'"
            " WHERE id = '%s'", live);
    long long events_old = at_sql_int("SELECT count(*) FROM job_events WHERE job_id = '%s'", old);

    /* A kilnd on the same database with a 5-day retention; its clean-up thread does the work. */
    svc_config_t cfg = {.database_url = at_db_url(), .heartbeat_timeout_ms = 60000, .db_pool_size = 2,
                        .log_retention_days = 5, .janitor_interval_ms = 200};
    svc_t *s2 = NULL;
    kiln_err_t err;
    cr_assert_eq(svc_create(&cfg, &s2, &err), 0, "%s", err.message);
    long long left = -1;
    for (int i = 0; i < 100 && left != 0; i++) {
        usleep(100000);
        left = at_sql_int("SELECT count(*) FROM logs WHERE job_id = '%s'", old);
    }
    svc_destroy(s2);
    cr_assert_eq(left, 0, "the old job's logs are gone");
    cr_assert_eq(at_sql_int("SELECT count(*) FROM logs WHERE job_id = '%s'", recent), 40);
    cr_assert_eq(at_sql_int("SELECT count(*) FROM logs WHERE job_id = '%s'", live), 30);
    cr_assert_eq(at_sql_int("SELECT count(*) FROM jobs WHERE logs_expired_at IS NOT NULL"), 1);
    cr_assert_eq(at_sql_int("SELECT count(*) FROM jobs WHERE id = '%s' AND logs_expired_at IS NOT NULL", old), 1);
    cr_assert_eq(at_sql_int("SELECT count(*) FROM job_events WHERE job_id = '%s'", old), events_old,
                 "only logs go");
    /* the job itself answers, with no lines */
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/logs", old);
    long st;
    json_t *j = at_req("GET", path, NULL, NULL, &st, NULL);
    cr_assert_eq(st, 200);
    cr_assert_eq(json_array_size(json_object_get(j, "lines")), 0);
    json_decref(j);
    /* and a pass with nothing to do changes nothing */
    int64_t dropped = -1;
    cfg.janitor_interval_ms = 3600000;
    cr_assert_eq(svc_create(&cfg, &s2, &err), 0, "%s", err.message);
    cr_assert_eq(svc_janitor_pass(s2, &dropped, &err), 0, "%s", err.message);
    cr_assert_eq(dropped, 0);
    svc_destroy(s2);
    free(old);
    free(recent);
    free(live);
}
