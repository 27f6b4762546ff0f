/* test_code.c - code archives over REST against the real server and database: POST /v1/code
 * answers the SHA-256 of the bytes as the source, stores them once however often and by however
 * many projects they are uploaded, and shows them only to those projects (another project's
 * member gets 404, a viewer cannot upload); hostile archives (made here with Python's tarfile)
 * are refused with a 400 naming the entry and nothing kept; the size limit is a 413 naming it,
 * before the body when its length is announced; a job's source must be an archive of its own
 * project, and the example spec of issue 26 goes in and comes back over REST, searchable by its
 * nested hyperparameters. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "code/code.h"
#include "tests/api/api_test.h"

TestSuite(code, .init = at_setup, .fini = at_teardown, .timeout = 120);

static const char *const k_gzip[] = {"Content-Type: application/gzip", NULL};

typedef struct bytes {
    char *p;
    size_t n;
} bytes_t;

static bytes_t file_bytes(const char *path)
{
    bytes_t b = {0};
    kiln_err_t err;
    cr_assert_eq(kiln_file_read(path, &b.p, &b.n, &err), 0, "%s", err.message);
    return b;
}

/* A source directory (train.py saying what) packed by code/. */
static bytes_t packed(const char *what)
{
    char dir[256], p[300];
    snprintf(dir, sizeof(dir), "%s/src-%s", at_dir_path(), what);
    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(p, sizeof(p), "%s/train.py", dir);
    FILE *f = fopen(p, "w");
    fprintf(f, "print('%s')\n", what);
    fclose(f);
    snprintf(p, sizeof(p), "%s/%s.tgz", at_dir_path(), what);
    int fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0600);
    kiln_err_t err;
    cr_assert_eq(code_pack_dir(dir, fd, NULL, 0, NULL, &err), 0, "%s", err.message);
    close(fd);
    return file_bytes(p);
}

static json_t *upload(const bytes_t *b, const char *project, const char *token, long *status)
{
    char url[300], auth[200];
    snprintf(url, sizeof(url), "%s/v1/code%s%s", at_base, project ? "?project=" : "", project ? project : "");
    snprintf(auth, sizeof(auth), "Authorization: Bearer %s", token ? token : at_admin_token);
    const char *hdrs[] = {"Content-Type: application/gzip", auth, NULL};
    char *out = NULL;
    cr_assert_eq(th_http_send("POST", url, b->p, b->n, hdrs, status, &out, NULL, 30000), 0, "no answer from %s", url);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert_not_null(j, "not JSON: %s", out);
    free(out);
    return j;
}

/* Files in the store's code directory (archives) and uploads under way. */
static void store_counts(int *archives, int *uploads)
{
    char d[300];
    *archives = *uploads = 0;
    snprintf(d, sizeof(d), "%s/artifacts/code", at_dir_path());
    DIR *dir = opendir(d);
    struct dirent *de;
    while (dir && (de = readdir(dir)))
        *archives += strlen(de->d_name) == 68 && !strcmp(de->d_name + 64, ".tgz");
    if (dir)
        closedir(dir);
    snprintf(d, sizeof(d), "%s/artifacts/code/uploads", at_dir_path());
    dir = opendir(d);
    while (dir && (de = readdir(dir)))
        *uploads += de->d_name[0] != '.';
    if (dir)
        closedir(dir);
}

/* A request as cluster admin; asserts the status. Returns the reply (caller decrefs). */
static json_t *as_admin(const char *method, const char *path, const char *body, long want)
{
    return at_req_want(method, path, body, want);
}


static long get_code(const char *digest, const char *project, const char *token, char **out, size_t *len)
{
    char url[300], auth[200];
    snprintf(url, sizeof(url), "%s/v1/code/%s%s%s", at_base, digest, project ? "?project=" : "", project ? project : "");
    snprintf(auth, sizeof(auth), "Authorization: Bearer %s", token ? token : at_admin_token);
    const char *hdrs[] = {auth, NULL};
    long st = 0;
    cr_assert_eq(th_http_bytes("GET", url, NULL, hdrs, &st, out, len, NULL, 10000), 0);
    return st;
}

Test(code, the_source_is_the_sha256_and_the_bytes_are_kept_once)
{
    bytes_t b = packed("one");
    char sha[KILN_SHA256_HEX], want[100];
    kiln_sha256_hex(b.p, b.n, sha);
    snprintf(want, sizeof(want), "code:sha256:%s", sha);
    long st = 0;
    json_t *j = upload(&b, NULL, NULL, &st);
    cr_assert_eq(st, 201, "%s", json_dumps(j, 0));
    cr_assert_str_eq(json_string_value(json_object_get(j, "source")), want);
    cr_assert_eq(json_integer_value(json_object_get(j, "size")), (json_int_t)b.n);
    cr_assert_eq(json_integer_value(json_object_get(j, "files")), 1);
    cr_assert_str_eq(json_string_value(json_object_get(j, "project")), "default");
    json_decref(j);
    j = upload(&b, "default", NULL, &st);
    cr_assert_eq(st, 200, "uploading again is free: %s", json_dumps(j, 0));
    cr_assert(json_is_false(json_object_get(j, "created")));
    cr_assert_str_eq(json_string_value(json_object_get(j, "source")), want);
    json_decref(j);
    int archives, uploads;
    store_counts(&archives, &uploads);
    cr_assert_eq(archives, 1, "stored once");
    cr_assert_eq(uploads, 0, "nothing left under way");
    char *out = NULL;
    size_t len = 0;
    cr_assert_eq(get_code(sha, NULL, NULL, &out, &len), 200);
    cr_assert_eq(len, b.n);
    cr_assert_eq(memcmp(out, b.p, len), 0, "the bytes come back as uploaded");
    free(out);
    cr_assert_eq(get_code("0123abc", NULL, NULL, &out, &len), 400, "%s", out);
    cr_assert(strstr(out, "\"field\":\"digest\""), "%s", out);
    free(out);
    free(b.p);
}

Test(code, an_archive_is_visible_only_to_the_projects_that_uploaded_it)
{
    json_decref(as_admin("POST", "/v1/projects", "{\"name\": \"other\"}", 201));
    char bob[128], carol[128], dave[128];
    at_user_token("bob", "other", "editor", bob, sizeof(bob));
    at_user_token("carol", "default", "viewer", carol, sizeof(carol));
    at_user_token("dave", NULL, NULL, dave, sizeof(dave));
    bytes_t b = packed("vis");
    char sha[KILN_SHA256_HEX];
    kiln_sha256_hex(b.p, b.n, sha);
    long st = 0;
    json_decref(upload(&b, "default", NULL, &st));
    cr_assert_eq(st, 201);
    char *out = NULL;
    size_t len;
    cr_assert_eq(get_code(sha, "default", bob, &out, &len), 404, "another project's member: %s", out);
    char *not_found = out;
    cr_assert_eq(get_code(sha, "other", bob, &out, &len), 404, "%s", out);
    free(out);
    /* the same 404 for a digest nobody uploaded */
    char none[KILN_SHA256_HEX];
    kiln_sha256_hex("nothing", 7, none);
    cr_assert_eq(get_code(none, "default", bob, &out, &len), 404);
    json_t *a = json_loads(not_found, 0, NULL), *z = json_loads(out, 0, NULL);
    const char *ma = json_string_value(json_object_get(a, "message")), *mz = json_string_value(json_object_get(z, "message"));
    cr_assert(strstr(ma, sha) && strstr(mz, none), "%s / %s", ma, mz);
    cr_assert_eq(strlen(ma), strlen(mz), "the same answer either way: %s / %s", ma, mz);
    json_decref(a);
    json_decref(z);
    free(out);
    free(not_found);
    cr_assert_eq(get_code(sha, "default", carol, &out, &len), 200, "a viewer of the project reads it");
    free(out);
    json_t *j = upload(&b, "default", carol, &st);
    cr_assert_eq(st, 403, "a viewer may not upload: %s", json_dumps(j, 0));
    json_decref(j);
    j = upload(&b, "default", dave, &st);
    cr_assert_eq(st, 403, "a non-member may not upload");
    json_decref(j);
    /* bob sends the same bytes into his project: they are his project's now, and stored once */
    j = upload(&b, "other", bob, &st);
    cr_assert_eq(st, 201, "%s", json_dumps(j, 0));
    cr_assert(json_is_true(json_object_get(j, "created")));
    json_decref(j);
    cr_assert_eq(get_code(sha, "other", bob, &out, &len), 200);
    cr_assert_eq(len, b.n);
    free(out);
    int archives, uploads;
    store_counts(&archives, &uploads);
    cr_assert_eq(archives, 1);
    j = upload(&b, "nosuch", NULL, &st);
    cr_assert_eq(st, 404, "a project that does not exist: %s", json_dumps(j, 0));
    json_decref(j);
    free(b.p);
}

/* An archive made by Python's tarfile (kind: the script's hostile part). */
static bytes_t py_archive(const char *kind)
{
    char path[300], cmd[3000];
    snprintf(path, sizeof(path), "%s/py-%s.tgz", at_dir_path(), kind);
    snprintf(cmd, sizeof(cmd),
             "/usr/bin/python3 - '%s' '%s' <<'EOF'\n"
             "import io, sys, tarfile\n"
             "path, kind = sys.argv[1], sys.argv[2]\n"
             "t = tarfile.open(path, 'w:gz')\n"
             "def add(name, data=b'x', **kw):\n"
             "    ti = tarfile.TarInfo(name); ti.size = len(data)\n"
             "    for k, v in kw.items(): setattr(ti, k, v)\n"
             "    t.addfile(ti, io.BytesIO(data) if ti.isreg() else None)\n"
             "add('train.py', b'print(1)\\n')\n"
             "if kind == 'abs': add('/etc/cron.d/evil')\n"
             "if kind == 'dotdot': add('../x')\n"
             "if kind == 'symlink': add('l', type=tarfile.SYMTYPE, linkname='/etc'); add('l/passwd')\n"
             "if kind == 'through': add('d', type=tarfile.DIRTYPE, mode=0o755); "
             "add('l', type=tarfile.SYMTYPE, linkname='d'); add('l/x')\n"
             "if kind == 'hardlink': add('p', type=tarfile.LNKTYPE, linkname='/etc/passwd')\n"
             "if kind == 'device': add('null', type=tarfile.CHRTYPE, devmajor=1, devminor=3)\n"
             "if kind == 'fifo': add('pipe', type=tarfile.FIFOTYPE)\n"
             "if kind == 'setuid': add('tool', mode=0o4755)\n"
             "if kind == 'many':\n"
             "    for i in range(10001): add('f%%05d' %% i, b'')\n"
             "if kind == 'bomb': add('zeros.bin', bytes(48 << 20))\n"
             "t.close()\n"
             "EOF",
             path, kind);
    cr_assert_eq(system(cmd), 0, "python3 could not make the %s archive", kind);
    return file_bytes(path);
}

Test(code, hostile_archives_are_refused_naming_the_entry)
{
    static const struct {
        const char *kind, *needle;
    } cases[] = {
        {"abs", "archive entry \"/etc/cron.d/evil\": an absolute path is not allowed"},
        {"dotdot", "archive entry \"../x\": a path must not climb out of the tree"},
        {"symlink", "archive entry \"l\": a symbolic link to an absolute path (\"/etc\") leads out of the tree"},
        {"through", "archive entry \"l/x\": it would be written through the symbolic link \"l\""},
        {"hardlink", "archive entry \"p\": its hard link (to \"/etc/passwd\") leads out of the tree"},
        {"device", "archive entry \"null\" is a device file"},
        {"fifo", "archive entry \"pipe\" is a FIFO"},
        {"setuid", "archive entry \"tool\": set-user-ID"},
        /* train.py and 10,001 files: the 10,001st entry is f09999 */
        {"many", "archive entry \"f09999\": the archive holds more than 10000 entries"},
        {"bomb", "archive entry \"zeros.bin\": it passes the limit of 41943040 bytes for one file"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        bytes_t b = py_archive(cases[i].kind);
        cr_assert_lt(b.n, 4 << 20, "%s: small enough to pass the upload limit (%zu bytes)", cases[i].kind, b.n);
        long st = 0;
        json_t *j = upload(&b, NULL, NULL, &st);
        const char *msg = json_string_value(json_object_get(j, "message"));
        cr_assert_eq(st, 400, "%s: %ld %s", cases[i].kind, st, msg);
        cr_assert_str_eq(json_string_value(json_object_get(j, "field")), "archive", "%s", cases[i].kind);
        cr_assert(msg && strstr(msg, cases[i].needle), "%s: %s", cases[i].kind, msg);
        json_decref(j);
        free(b.p);
    }
    int archives, uploads;
    store_counts(&archives, &uploads);
    cr_assert_eq(archives, 0, "nothing refused was kept");
    cr_assert_eq(uploads, 0);
    /* what is not an archive at all */
    bytes_t text = {strdup("print('not an archive')\n"), 24};
    long st = 0;
    json_t *j = upload(&text, NULL, NULL, &st);
    cr_assert_eq(st, 400);
    cr_assert(strstr(json_string_value(json_object_get(j, "message")), "not a gzip'd tar"));
    json_decref(j);
    bytes_t empty = {strdup(""), 0};
    j = upload(&empty, NULL, NULL, &st);
    cr_assert_eq(st, 400, "an empty body");
    json_decref(j);
    free(text.p);
    free(empty.p);
}

Test(code, the_size_limit_and_the_media_type)
{
    /* random bytes past the fixture's 4 MiB limit: refused before the body with a length, after
     * it without one (chunked) */
    size_t n = (4 << 20) + 1000;
    bytes_t big = {malloc(n), n};
    int rnd = open("/dev/urandom", O_RDONLY);
    cr_assert_eq(read(rnd, big.p, n), (ssize_t)n);
    close(rnd);
    long st = 0;
    json_t *j = upload(&big, NULL, NULL, &st);
    cr_assert_eq(st, 413, "%s", json_dumps(j, 0));
    cr_assert(strstr(json_string_value(json_object_get(j, "message")), "4 MiB (kilnd --code-max-mb)"), "%s",
              json_string_value(json_object_get(j, "message")));
    json_decref(j);
    char url[200], auth[200];
    snprintf(url, sizeof(url), "%s/v1/code", at_base);
    snprintf(auth, sizeof(auth), "Authorization: Bearer %s", at_admin_token);
    const char *chunked[] = {"Content-Type: application/gzip", "Transfer-Encoding: chunked", auth, NULL};
    char *out = NULL;
    cr_assert_eq(th_http_send("POST", url, big.p, big.n, chunked, &st, &out, NULL, 30000), 0);
    cr_assert_eq(st, 413, "%s", out);
    cr_assert(strstr(out, "--code-max-mb"), "%s", out);
    free(out);
    int archives, uploads;
    store_counts(&archives, &uploads);
    cr_assert_eq(archives + uploads, 0);
    free(big.p);
    bytes_t b = packed("media");
    const char *json_ct[] = {"Content-Type: application/json", auth, NULL};
    cr_assert_eq(th_http_send("POST", url, b.p, b.n, json_ct, &st, &out, NULL, 10000), 0);
    cr_assert_eq(st, 415, "%s", out);
    free(out);
    snprintf(url, sizeof(url), "%s/v1/code?projekt=default", at_base);
    cr_assert_eq(th_http_send("POST", url, b.p, b.n, k_gzip, &st, &out, NULL, 10000), 0);
    cr_assert_eq(st, 400, "%s", out);
    cr_assert(strstr(out, "\"field\":\"projekt\""), "%s", out);
    free(out);
    free(b.p);
}

Test(code, a_jobs_source_is_an_archive_of_its_project_and_the_issue_example_round_trips)
{
    json_decref(as_admin("POST", "/v1/projects", "{\"name\": \"other\"}", 201));
    bytes_t b = packed("job");
    char sha[KILN_SHA256_HEX];
    kiln_sha256_hex(b.p, b.n, sha);
    long st = 0;
    json_decref(upload(&b, "default", NULL, &st));
    cr_assert_eq(st, 201);
    /* the example of issue 26, with this upload as its source and channels inside /tmp */
    char spec[2048];
    snprintf(spec, sizeof(spec),
             "{\"name\": \"ddp-mnist\", \"entry_point\": \"train.py\", \"source\": \"code:sha256:%s\","
             " \"hyperparameters\": {\"epochs\": 3, \"batch-size\": 64, \"lr\": 0.01, \"model\": {\"depth\": 4}},"
             " \"data\": {\"channels\": {\"train\": \"/tmp/mnist/train\", \"validation\": \"/tmp/mnist/val\"}},"
             " \"environment\": {\"MY_FLAG\": \"1\"},"
             " \"resources\": {\"nodes\": 1, \"slots_per_node\": 1, \"slot_type\": \"cpu\", \"memory_limit_mb\": 4096},"
             " \"distribution\": {\"torch_distributed\": {\"enabled\": true, \"nproc_per_node\": 1}},"
             " \"checkpoint\": {\"every_steps\": 0}, \"retry\": {\"max_attempts\": 3},"
             " \"metric_definitions\": [{\"Name\": \"val_acc\", \"Regex\": \"val_acc=([0-9.]+)\"}]}",
             sha);
    char *raw = NULL;
    json_t *job = at_req("POST", "/v1/jobs", spec, NULL, &st, &raw);
    cr_assert_eq(st, 201, "%s", raw);
    free(raw);
    const char *id = json_string_value(json_object_get(job, "id"));
    char path[200];
    snprintf(path, sizeof(path), "/v1/jobs/%s", id);
    json_t *got = as_admin("GET", path, NULL, 200);
    json_t *s = json_object_get(got, "spec");
    cr_assert_str_eq(json_string_value(json_object_get(s, "entry_point")), "train.py");
    cr_assert_null(json_object_get(s, "model"));
    json_t *hp = json_object_get(s, "hyperparameters");
    cr_assert_eq(json_integer_value(json_object_get(hp, "epochs")), 3);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(hp, "model"), "depth")), 4);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(json_object_get(s, "data"), "channels"),
                                                       "validation")), "/tmp/mnist/val");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(s, "environment"), "MY_FLAG")), "1");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(s, "metric_definitions"), 0),
                                                       "name")), "val_acc");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(s, "resources"), "memory_limit_mb")), 4096);
    json_decref(got);
    /* search by the script's own hyperparameters, nested ones included */
    static const char *const filters[] = {"hp.model.depth%20%3D%204", "hp.epochs%20%3E%3D%203",
                                          "hp.batch-size%20%3D%2064"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof(path), "/v1/jobs?filter=%s", filters[i]);
        json_t *l = as_admin("GET", path, NULL, 200);
        json_t *jobs = json_object_get(l, "jobs");
        cr_assert_eq(json_array_size(jobs), 1, "%s finds the job", filters[i]);
        cr_assert_str_eq(json_string_value(json_object_get(json_array_get(jobs, 0), "id")), id);
        json_decref(l);
    }
    /* and as columns, nested keys by their joined names */
    json_t *cols = as_admin("GET", "/v1/jobs?filter=hp.epochs%20%3D%203&columns=hp.model.depth,hp.*", NULL, 200);
    json_t *c0 = json_object_get(json_array_get(json_object_get(cols, "jobs"), 0), "columns");
    cr_assert_eq(json_integer_value(json_object_get(c0, "hp.model.depth")), 4, "%s", json_dumps(c0, 0));
    cr_assert_eq(json_integer_value(json_object_get(c0, "hp.batch-size")), 64, "hp.* holds the script's numbers");
    json_decref(cols);
    json_decref(job);
    /* the same digest named by a job of another project: as if it did not exist */
    snprintf(spec, sizeof(spec), "{\"project\": \"other\", \"entry_point\": \"t.py\", \"source\": \"code:sha256:%s\"}",
             sha);
    json_t *e1 = at_req("POST", "/v1/jobs", spec, NULL, &st, NULL);
    cr_assert_eq(st, 400);
    cr_assert_str_eq(json_string_value(json_object_get(e1, "field")), "source");
    char none[KILN_SHA256_HEX];
    kiln_sha256_hex("nothing", 7, none);
    snprintf(spec, sizeof(spec), "{\"project\": \"other\", \"entry_point\": \"t.py\", \"source\": \"code:sha256:%s\"}",
             none);
    json_t *e2 = at_req("POST", "/v1/jobs", spec, NULL, &st, NULL);
    cr_assert_eq(st, 400);
    const char *m1 = json_string_value(json_object_get(e1, "message")), *m2 = json_string_value(json_object_get(e2, "message"));
    cr_assert(strstr(m1, "is not a code archive of project \"other\""), "%s", m1);
    cr_assert_eq(strlen(m1), strlen(m2), "one answer whether another project has it or none: %s / %s", m1, m2);
    json_decref(e1);
    json_decref(e2);
    free(b.p);
}
