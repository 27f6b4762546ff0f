/* api_test.c - the REST suite's fixture and helpers (see api_test.h). */
#include "tests/api/api_test.h"
#include "tests/common/harness.h"

#include <criterion/criterion.h>
#include <curl/curl.h>
#include <libpq-fe.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

svc_t *at_svc;
char at_base[64];
char at_worker[128];
char at_admin_token[128];
static api_http_t *at_http;
static char *at_db;
static char at_dir[64];

void at_setup_with(const api_http_config_t *extra)
{
    kiln_err_t err;
    kiln_err_clear(&err);
    log_init("test_api");
    at_db = th_pg_create_db("api");
    cr_assert(at_db, "no test database (run through tests/run.sh)");
    snprintf(at_dir, sizeof at_dir, "/tmp/kiln-api.XXXXXX");
    cr_assert(mkdtemp(at_dir));
    char token_file[128];
    snprintf(token_file, sizeof token_file, "%s/admin.token", at_dir);
    char art_dir[128];
    snprintf(art_dir, sizeof art_dir, "%s/artifacts", at_dir);
    svc_config_t cfg = {.database_url = at_db, .heartbeat_interval_ms = 1000,
                        .heartbeat_timeout_ms = 60000, .sched_interval_ms = 50, .db_pool_size = 4,
                        .bootstrap_token_file = token_file, .artifact_dir = art_dir,
                        .code_max_bytes = 4 << 20 /* test_code.c: a limit quick to pass */};
    cr_assert_eq(svc_create(&cfg, &at_svc, &err), 0, "svc_create: %s", err.message);
    char *tok = NULL;
    cr_assert_eq(kiln_file_read(token_file, &tok, NULL, &err), 0, "%s", err.message);
    tok[strcspn(tok, "\n")] = '\0';
    kiln_strlcpy(at_admin_token, tok, sizeof at_admin_token);
    free(tok);
    th_http_set_token(at_admin_token);
    int port = th_free_port();
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    snprintf(at_base, sizeof at_base, "http://127.0.0.1:%d", port);
    api_http_config_t hc = {.addr = addr};
    if (extra) {
        hc = *extra;
        hc.addr = addr;
    }
    cr_assert_eq(api_http_start(at_svc, &hc, &at_http, &err), 0, "api_http_start: %s", err.message);

    arena_t a;
    arena_init(&a, 0);
    Kiln__RegisterRequest req = KILN__REGISTER_REQUEST__INIT;
    Kiln__RegisterResponse out = KILN__REGISTER_RESPONSE__INIT;
    req.hostname = "test-host";
    req.address = "127.0.0.1";
    req.slots = 4;
    req.slot_type = "cpu";
    req.cpu_cores = 4;
    req.version = "test";
    char *roots[] = {"/tmp"};
    req.data_roots = roots;
    req.n_data_roots = 1;
    cr_assert_eq(svc_agent_register(at_svc, &req, NULL, &a, &out, &err), 0, "register: %s", err.message);
    kiln_strlcpy(at_worker, out.worker_id, sizeof at_worker);
    arena_deinit(&a);
}

void at_setup(void)
{
    at_setup_with(NULL);
}

const char *at_db_url(void)
{
    return at_db;
}

const char *at_dir_path(void)
{
    return at_dir;
}

int at_upload(svc_t *s, const char *worker, const char *job_id, int attempt, const char *name, const void *data,
              size_t len, size_t chunk, kiln_err_t *err)
{
    char sha[KILN_SHA256_HEX];
    kiln_sha256_hex(data, len, sha);
    Kiln__ArtifactFile f = KILN__ARTIFACT_FILE__INIT;
    f.name = (char *)name;
    f.size = (int64_t)len;
    f.sha256 = sha;
    Kiln__ArtifactFile *fp[1] = {&f};
    Kiln__ArtifactManifest m = KILN__ARTIFACT_MANIFEST__INIT;
    m.worker_id = (char *)worker;
    m.job_id = (char *)job_id;
    m.attempt = attempt;
    m.n_files = 1;
    m.files = fp;
    Kiln__ArtifactManifestReply r = KILN__ARTIFACT_MANIFEST_REPLY__INIT;
    arena_t a;
    arena_init(&a, 0);
    kiln_err_clear(err);
    int rc = svc_agent_artifacts_begin(s, worker, &m, &a, &r, err);
    int64_t off = rc == 0 && r.n_files == 1 ? r.files[0]->offset : 0;
    arena_deinit(&a);
    while (rc == 0 && (size_t)off < len) {
        size_t n = len - (size_t)off < chunk ? len - (size_t)off : chunk;
        char csha[KILN_SHA256_HEX];
        kiln_sha256_hex((const uint8_t *)data + off, n, csha);
        Kiln__ArtifactChunk c = KILN__ARTIFACT_CHUNK__INIT;
        c.worker_id = (char *)worker;
        c.job_id = (char *)job_id;
        c.attempt = attempt;
        c.name = (char *)name;
        c.offset = off;
        c.data.data = (uint8_t *)data + off;
        c.data.len = n;
        c.sha256 = csha;
        Kiln__ArtifactChunkReply cr = KILN__ARTIFACT_CHUNK_REPLY__INIT;
        rc = svc_agent_artifact_chunk(s, worker, &c, &cr, err);
        off = cr.offset;
    }
    return rc;
}

const char *at_db_name(void)
{
    static char name[128];
    const char *p = at_db ? strstr(at_db, "dbname=") : NULL;
    kiln_strlcpy(name, p ? p + 7 : "", sizeof name);
    char *sp = strchr(name, ' ');
    if (sp)
        *sp = '\0';
    return name;
}

void at_teardown(void)
{
    api_http_stop(at_http);
    at_http = NULL;
    svc_destroy(at_svc);
    at_svc = NULL;
    free(at_db);
    at_db = NULL;
    if (at_dir[0]) {
        if (!th_rm_tree(at_dir))
            fprintf(stderr, "could not remove %s\n", at_dir);
    }
}

json_t *at_req(const char *method, const char *path, const char *body, const char *const hdrs[],
               long *status, char **raw)
{
    char url[1024];
    snprintf(url, sizeof url, "%s%s", at_base, path);
    char *text = NULL;
    *status = 0;
    cr_assert_eq(th_http(method, url, body, hdrs, status, &text, 10000), 0, "%s %s failed", method, url);
    json_error_t jerr;
    json_t *j = json_loads(text, 0, &jerr);
    if (!j)
        j = json_object();
    if (raw)
        *raw = text;
    else
        free(text);
    return j;
}

json_t *at_req_want(const char *method, const char *path, const char *body, long want)
{
    long st;
    char *raw = NULL;
    json_t *j = at_req(method, path, body, NULL, &st, &raw);
    cr_assert_eq(st, want, "%s %s %s: want %ld, got %ld: %s", method, path, body ? body : "", want, st, raw);
    free(raw);
    return j;
}

void at_user_token(const char *name, const char *project, const char *role, char *out, size_t n)
{
    char body[128], path[160];
    snprintf(body, sizeof body, "{\"name\": \"%s\"}", name);
    json_decref(at_req_want("POST", "/v1/users", body, 201));
    if (project) {
        snprintf(body, sizeof body, "{\"role\": \"%s\"}", role);
        snprintf(path, sizeof path, "/v1/projects/%s/members/%s", project, name);
        json_decref(at_req_want("PUT", path, body, 200));
    }
    snprintf(path, sizeof path, "/v1/users/%s/tokens", name);
    json_t *t = at_req_want("POST", path, "{}", 201);
    const char *secret = json_string_value(json_object_get(t, "token"));
    snprintf(out, n, "%s", secret ? secret : "");
    json_decref(t);
}

static const char at_spec[] =
    "{\"name\": \"%s\", \"model\": {\"type\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16,"
    " \"seq_len\": 8}, \"data\": {\"train\": \"file:///tmp/kiln-api-test.txt\"},"
    " \"hyperparameters\": {\"lr\": 0.001, \"global_batch_size\": 2, \"max_steps\": 5},"
    " \"resources\": {\"nodes\": 1, \"slots_per_node\": 1, \"slot_type\": \"cpu\"}%s%s}";

const char *at_good_spec(void)
{
    static char buf[1024];
    snprintf(buf, sizeof buf, at_spec, "good", "", "");
    return buf;
}

char *at_create_job(const char *name, const char *tags_json, const char *key)
{
    char body[2048], hdr[256];
    snprintf(body, sizeof body, at_spec, name, tags_json ? ", \"tags\": " : "", tags_json ? tags_json : "");
    const char *hdrs[] = {hdr, NULL};
    snprintf(hdr, sizeof hdr, "Idempotency-Key: %s", key ? key : "");
    long st;
    char *raw = NULL;
    json_t *j = at_req("POST", "/v1/jobs", body, key ? hdrs : NULL, &st, &raw);
    cr_assert(st == 201 || st == 200, "create %s: %ld %s", name, st, raw);
    const char *id = json_string_value(json_object_get(j, "id"));
    cr_assert(id, "no id in %s", raw);
    char *out = strdup(id);
    json_decref(j);
    free(raw);
    return out;
}

int at_run_job(const char *job_id)
{
    kiln_err_t err;
    arena_t a;
    arena_init(&a, 0);
    int attempt = -1;
    for (int i = 0; i < 200 && attempt < 0; i++) {
        Kiln__HeartbeatRequest hb = KILN__HEARTBEAT_REQUEST__INIT;
        Kiln__HeartbeatResponse out = KILN__HEARTBEAT_RESPONSE__INIT;
        hb.worker_id = at_worker;
        kiln_err_clear(&err);
        cr_assert_eq(svc_agent_heartbeat(at_svc, at_worker, &hb, &a, &out, &err), 0, "heartbeat: %s", err.message);
        for (size_t k = 0; k < out.n_assignments; k++)
            if (!strcmp(out.assignments[k]->job_id, job_id))
                attempt = out.assignments[k]->attempt;
        arena_reset(&a);
        if (attempt < 0)
            usleep(50000);
    }
    arena_deinit(&a);
    cr_assert(attempt >= 0, "job %s was never assigned to the worker", job_id);
    Kiln__RankStatus rs = KILN__RANK_STATUS__INIT;
    rs.worker_id = at_worker;
    rs.job_id = (char *)job_id;
    rs.attempt = attempt;
    rs.started = true;
    kiln_err_clear(&err);
    cr_assert_eq(svc_agent_rank_status(at_svc, at_worker, &rs, &err), 0, "rank status: %s", err.message);
    return attempt;
}

void at_push_logs(const char *job_id, int attempt, const char *prefix, int first, int n)
{
    Kiln__LogLine *lines = calloc((size_t)n, sizeof *lines);
    Kiln__LogLine **ptrs = calloc((size_t)n, sizeof *ptrs);
    char (*text)[64] = calloc((size_t)n, 64);
    for (int i = 0; i < n; i++) {
        Kiln__LogLine l = KILN__LOG_LINE__INIT;
        lines[i] = l;
        lines[i].rank = 0;
        lines[i].time_us = kiln_now_us();
        lines[i].stream = "stdout";
        snprintf(text[i], 64, "%s %d", prefix, first + i);
        lines[i].line = text[i];
        ptrs[i] = &lines[i];
    }
    for (int at = 0; at < n; at += KILN_LOG_BATCH_LINES) { /* in batches kilnd takes */
        Kiln__LogBatch b = KILN__LOG_BATCH__INIT;
        b.worker_id = at_worker;
        b.job_id = (char *)job_id;
        b.attempt = attempt;
        b.n_lines = (size_t)KILN_MIN(n - at, KILN_LOG_BATCH_LINES);
        b.lines = ptrs + at;
        kiln_err_t err;
        kiln_err_clear(&err);
        cr_assert_eq(svc_agent_logs(at_svc, at_worker, &b, &err), 0, "logs: %s", err.message);
    }
    free(text);
    free(ptrs);
    free(lines);
}

void at_rank_exit(const char *job_id, int attempt, int code)
{
    Kiln__RankExit e = KILN__RANK_EXIT__INIT;
    e.worker_id = at_worker;
    e.job_id = (char *)job_id;
    e.attempt = attempt;
    e.rank = 0;
    e.exit_code = code;
    e.reason = code ? "boom" : "";
    kiln_err_t err;
    kiln_err_clear(&err);
    cr_assert_eq(svc_agent_rank_exit(at_svc, at_worker, &e, &err), 0, "rank exit: %s", err.message);
}

/* ---- SSE client ---------------------------------------------------------------------------- */

static size_t at_sse_write(char *p, size_t sz, size_t n, void *ud)
{
    at_sse_t *s = ud;
    while (s->stall)
        usleep(10000);
    pthread_mutex_lock(&s->lock);
    if (s->len + sz * n + 1 > s->cap) { /* doubling: ASan's realloc always copies */
        size_t cap = s->cap ? s->cap : 65536;
        while (cap < s->len + sz * n + 1)
            cap *= 2;
        char *nb = realloc(s->buf, cap);
        cr_assert(nb);
        s->buf = nb;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, p, sz * n);
    s->len += sz * n;
    s->buf[s->len] = '\0';
    pthread_mutex_unlock(&s->lock);
    return sz * n;
}

static int at_sse_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    at_sse_t *s = ud;
    (void)dt, (void)dn, (void)ut, (void)un;
    return s->abort ? 1 : 0;
}

static void *at_sse_main(void *arg)
{
    at_sse_t *s = arg;
    CURL *c = curl_easy_init();
    struct curl_slist *hl = NULL;
    char hdr[96];
    if (s->last_event_id[0]) {
        snprintf(hdr, sizeof hdr, "Last-Event-ID: %s", s->last_event_id);
        hl = curl_slist_append(hl, hdr);
    }
    hl = curl_slist_append(hl, "Accept: text/event-stream");
    char auth[300];
    if (th_http_token()[0]) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", th_http_token());
        hl = curl_slist_append(hl, auth);
    }
    curl_easy_setopt(c, CURLOPT_URL, s->url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 60000L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, at_sse_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 4096L);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, at_sse_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, s);
    curl_easy_perform(c);
    long st = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &st);
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    pthread_mutex_lock(&s->lock);
    s->status = st;
    s->done = true;
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

void at_sse_open(at_sse_t *s, const char *path, const char *last_event_id)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->lock, NULL);
    snprintf(s->url, sizeof s->url, "%s%s", at_base, path);
    if (last_event_id)
        kiln_strlcpy(s->last_event_id, last_event_id, sizeof s->last_event_id);
    s->buf = calloc(1, 1);
    cr_assert_eq(pthread_create(&s->thread, NULL, at_sse_main, s), 0);
}

bool at_sse_wait(at_sse_t *s, const char *needle, int timeout_ms)
{
    size_t from = 0, nl = strlen(needle); /* only the new text is searched each time */
    for (int waited = 0;; waited += 10) {
        pthread_mutex_lock(&s->lock);
        bool found = strstr(s->buf + from, needle) != NULL;
        if (s->len >= nl)
            from = s->len - nl + 1;
        pthread_mutex_unlock(&s->lock);
        if (found)
            return true;
        if (waited >= timeout_ms)
            return false;
        usleep(10000);
    }
}

bool at_sse_join(at_sse_t *s, int timeout_ms)
{
    for (int waited = 0;; waited += 10) {
        pthread_mutex_lock(&s->lock);
        bool done = s->done;
        pthread_mutex_unlock(&s->lock);
        if (done) {
            pthread_join(s->thread, NULL);
            return true;
        }
        if (waited >= timeout_ms)
            return false;
        usleep(10000);
    }
}

void at_sse_free(at_sse_t *s)
{
    free(s->buf);
    pthread_mutex_destroy(&s->lock);
}

long long at_sql_int(const char *fmt, ...)
{
    char q[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(q, sizeof q, fmt, ap);
    va_end(ap);
    return th_pg_value(at_db_url(), q);
}

void at_sha256sum(const void *data, size_t n, char out[65])
{
    char path[256], cmd[320];
    snprintf(path, sizeof path, "%s/sum.bin", at_dir_path());
    FILE *f = fopen(path, "wb");
    cr_assert(f && fwrite(data, 1, n, f) == n);
    fclose(f);
    snprintf(cmd, sizeof cmd, "sha256sum %s", path);
    FILE *p = popen(cmd, "r");
    cr_assert(p && fscanf(p, "%64s", out) == 1);
    pclose(p);
    unlink(path);
}

int at_ck_begin(const char *job, int attempt, const at_ck_file_t *files, size_t n, bool *committed, int64_t *off,
                    kiln_err_t *err)
{
    Kiln__ArtifactFile f[8], *fp[8];
    char sha[8][KILN_SHA256_HEX];
    cr_assert_leq(n, 8);
    for (size_t i = 0; i < n; i++) {
        kiln__artifact_file__init(&f[i]);
        at_sha256sum(files[i].text, strlen(files[i].text), sha[i]);
        f[i].name = (char *)files[i].name;
        f[i].size = (int64_t)strlen(files[i].text);
        f[i].sha256 = sha[i];
        fp[i] = &f[i];
    }
    Kiln__ArtifactManifest m = KILN__ARTIFACT_MANIFEST__INIT;
    m.worker_id = at_worker;
    m.job_id = (char *)job;
    m.attempt = attempt;
    m.n_files = n;
    m.files = fp;
    m.kind = KILN__ARTIFACT_KIND__ARTIFACT_KIND_CHECKPOINT;
    Kiln__ArtifactManifestReply r = KILN__ARTIFACT_MANIFEST_REPLY__INIT;
    arena_t a;
    arena_init(&a, 0);
    kiln_err_clear(err);
    int rc = svc_agent_artifacts_begin(at_svc, at_worker, &m, &a, &r, err);
    if (committed)
        *committed = r.committed;
    for (size_t i = 0; rc == 0 && off && i < r.n_files; i++)
        off[i] = r.files[i]->offset;
    arena_deinit(&a);
    return rc;
}

/* The whole text of file f of the checkpoint directory, in one chunk. */
int at_ck_send(const char *job, int attempt, const at_ck_file_t *f, kiln_err_t *err)
{
    char csha[KILN_SHA256_HEX];
    kiln_sha256_hex(f->text, strlen(f->text), csha);
    Kiln__ArtifactChunk c = KILN__ARTIFACT_CHUNK__INIT;
    c.worker_id = at_worker;
    c.job_id = (char *)job;
    c.attempt = attempt;
    c.name = (char *)f->name;
    c.data.data = (uint8_t *)f->text;
    c.data.len = strlen(f->text);
    c.sha256 = csha;
    c.kind = KILN__ARTIFACT_KIND__ARTIFACT_KIND_CHECKPOINT;
    Kiln__ArtifactChunkReply r = KILN__ARTIFACT_CHUNK_REPLY__INIT;
    kiln_err_clear(err);
    return svc_agent_artifact_chunk(at_svc, at_worker, &c, &r, err);
}

