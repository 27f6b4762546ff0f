/* harness.c - implementation of the shared test helpers (see harness.h). */
#include "tests/common/harness.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <ftw.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define KILN_TH_MIN(a, b) ((a) < (b) ? (a) : (b))

/* A connection to the test cluster's postgres database, or NULL (and a message). */
static PGconn *pg_admin(void)
{
    const char *host = getenv("KILN_PG_HOST"), *port = getenv("KILN_PG_PORT");
    if (!host) {
        fprintf(stderr, "harness: KILN_PG_HOST is not set; run the tests with tests/run.sh (make test)\n");
        return NULL;
    }
    char admin[1024];
    snprintf(admin, sizeof(admin), "host=%s port=%s user=postgres dbname=postgres", host, port ? port : "5432");
    PGconn *c = PQconnectdb(admin);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "harness: could not connect to the test cluster: %s", PQerrorMessage(c));
        PQfinish(c);
        return NULL;
    }
    return c;
}

char *th_pg_create_db(const char *prefix)
{
    static int counter;
    const char *host = getenv("KILN_PG_HOST");
    const char *port = getenv("KILN_PG_PORT");
    PGconn *c = pg_admin();
    if (!c)
        return NULL;
    char name[128], sql[256];
    snprintf(name, sizeof(name), "%s_%d_%d_%ld", prefix, (int)getpid(), counter++, (long)(time(NULL) % 100000));
    snprintf(sql, sizeof(sql), "CREATE DATABASE \"%s\"", name);
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        fprintf(stderr, "harness: could not create database %s: %s", name, PQerrorMessage(c));
        PQclear(r);
        PQfinish(c);
        return NULL;
    }
    PQclear(r);
    PQfinish(c);
    char *out = malloc(1200);
    snprintf(out, 1200, "host=%s port=%s user=postgres dbname=%s", host, port ? port : "5432", name);
    return out;
}

long long th_pg_value(const char *db_url, const char *sql)
{
    PGconn *pg = PQconnectdb(db_url);
    cr_assert_eq(PQstatus(pg), CONNECTION_OK, "%s", PQerrorMessage(pg));
    PGresult *r = PQexec(pg, sql);
    cr_assert(PQresultStatus(r) == PGRES_TUPLES_OK || PQresultStatus(r) == PGRES_COMMAND_OK, "%s: %s", sql,
              PQerrorMessage(pg));
    long long v = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0 ? atoll(PQgetvalue(r, 0, 0)) : 0;
    PQclear(r);
    PQfinish(pg);
    return v;
}

bool th_pg_end_backends(const char *where, bool terminate, int timeout_ms)
{
    PGconn *c = pg_admin();
    if (!c)
        return false;
    char sql[1024];
    const char *mine = "backend_type = 'client backend' AND pid <> pg_backend_pid()";
    if (terminate) {
        snprintf(sql, sizeof sql, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE %s AND (%s)", mine,
                 where);
        PQclear(PQexec(c, sql));
    }
    /* each poll its own transaction: pg_stat_activity holds still for the length of one */
    snprintf(sql, sizeof sql, "SELECT count(*) FROM pg_stat_activity WHERE %s AND (%s)", mine, where);
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long left = -1;
    for (;;) {
        PGresult *r = PQexec(c, sql);
        left = PQresultStatus(r) == PGRES_TUPLES_OK ? atol(PQgetvalue(r, 0, 0)) : -1;
        PQclear(r);
        clock_gettime(CLOCK_MONOTONIC, &now);
        long ms = (now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
        if (left == 0 || ms >= timeout_ms)
            break;
        usleep(10000);
    }
    if (left != 0)
        fprintf(stderr, "harness: %ld backend(s) where %s still there after %d ms: %s", left, where, timeout_ms,
                PQerrorMessage(c));
    PQfinish(c);
    return left == 0;
}

const char *th_bin_dir(void)
{
    const char *d = getenv("KILN_BIN_DIR");
    return d ? d : "build/bin";
}

/* Whether port is free on loopback now (bound, then let go). */
static bool port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return false;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

/* A port the kernel would hand to bind(0) comes from the ephemeral range, which every outgoing
 * connection on the machine draws from too: between this call and the test's own bind, one of
 * them may take it ("Address already in use"). So the port is drawn below that range, where only
 * explicit binds go, and checked free; the kernel's choice is the fallback. */
int th_free_port(void)
{
    static _Atomic unsigned seq;
    int lo = 32768;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d", &lo) != 1)
            lo = 32768;
        fclose(f);
    }
    if (lo > 12000) {
        unsigned x = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL) ^ (atomic_fetch_add(&seq, 1) * 40503u);
        for (int tries = 0; tries < 200; tries++) {
            x = x * 1103515245u + 12345u;
            int port = 10000 + (int)((x >> 8) % (unsigned)(lo - 10000));
            if (port_free(port))
                return port;
        }
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    socklen_t len = sizeof(a);
    getsockname(fd, (struct sockaddr *)&a, &len);
    int port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return (flag == FTW_DP ? rmdir(path) : unlink(path)) != 0 && errno != ENOENT ? -1 : 0;
}

bool th_rm_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT;
    return nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS) == 0;
}

pid_t th_spawn(char *const argv[], char *const env_extra[], const char *log_path)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        setpgid(0, 0);
        if (env_extra)
            for (size_t i = 0; env_extra[i]; i++)
                putenv(env_extra[i]);
        if (log_path) {
            int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
                close(fd);
            }
        }
        execv(argv[0], argv);
        fprintf(stderr, "harness: could not exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid);
    return pid;
}

int th_stop(pid_t pid, int sig, int timeout_ms)
{
    if (pid <= 0)
        return -1;
    kill(-pid, sig);
    kill(pid, sig);
    int status = -1;
    for (int waited = 0; waited < timeout_ms; waited += 20) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return status;
        if (r < 0)
            return -1;
        usleep(20000);
    }
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    if (waitpid(pid, &status, 0) == pid)
        return status;
    return -1;
}

bool th_wait_port(int port, int timeout_ms)
{
    for (int waited = 0; waited < timeout_ms; waited += 50) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        int ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
        close(fd);
        if (ok)
            return true;
        usleep(50000);
    }
    return false;
}

struct th_buf {
    char *p;
    size_t n;
};

static size_t th_write_cb(char *data, size_t size, size_t nmemb, void *ud)
{
    struct th_buf *b = ud;
    size_t len = size * nmemb;
    char *np = realloc(b->p, b->n + len + 1);
    if (!np)
        return 0;
    b->p = np;
    memcpy(b->p + b->n, data, len);
    b->n += len;
    b->p[b->n] = '\0';
    return len;
}

const char *th_tls_dir(void)
{
    static char dir[256];
    if (dir[0])
        return dir;
    const char *env = getenv("KILN_TEST_TLS_DIR");
    if (env && *env) {
        snprintf(dir, sizeof dir, "%s", env);
        return dir;
    }
    const char *root = getenv("KILN_ROOT");
    char cmd[1024];
    snprintf(dir, sizeof dir, "/tmp/kiln-tls-%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "bash %s/scripts/make-certs.sh %s", root && *root ? root : ".", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "harness: could not make test certificates (%s)\n", cmd);
        dir[0] = '\0';
        return NULL;
    }
    return dir;
}

static char th_token[256], th_ca[512];

void th_http_set_token(const char *token)
{
    snprintf(th_token, sizeof th_token, "%s", token ? token : "");
}

void th_http_set_ca(const char *ca_file)
{
    snprintf(th_ca, sizeof th_ca, "%s", ca_file ? ca_file : "");
}

const char *th_http_token(void)
{
    return th_token;
}

const char *th_http_ca(void)
{
    return th_ca;
}

int th_http(const char *method, const char *url, const char *body, const char *const headers[],
            long *status, char **out, long timeout_ms)
{
    return th_http_headers(method, url, body, headers, status, out, NULL, timeout_ms);
}

int th_http_headers(const char *method, const char *url, const char *body, const char *const headers[],
                    long *status, char **out, char **headers_out, long timeout_ms)
{
    return th_http_bytes(method, url, body, headers, status, out, NULL, headers_out, timeout_ms);
}

static int th_http_core(const char *method, const char *url, const char *body, size_t body_len,
                        const char *const headers[], long *status, char **out, size_t *out_len, char **headers_out,
                        long timeout_ms);

int th_http_bytes(const char *method, const char *url, const char *body, const char *const headers[],
                  long *status, char **out, size_t *out_len, char **headers_out, long timeout_ms)
{
    return th_http_core(method, url, body, body ? strlen(body) : 0, headers, status, out, out_len, headers_out,
                        timeout_ms);
}

int th_http_send(const char *method, const char *url, const void *data, size_t len, const char *const headers[],
                 long *status, char **out, char **headers_out, long timeout_ms)
{
    return th_http_core(method, url, data ? data : "", len, headers, status, out, NULL, headers_out, timeout_ms);
}

static int th_http_core(const char *method, const char *url, const char *body, size_t body_len,
                        const char *const headers[], long *status, char **out, size_t *out_len, char **headers_out,
                        long timeout_ms)
{
    CURL *c = curl_easy_init();
    if (!c)
        return -1;
    struct th_buf b = {calloc(1, 1), 0};
    struct th_buf hb = {calloc(1, 1), 0};
    if (headers_out) {
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, th_write_cb);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, &hb);
    }
    struct curl_slist *hl = NULL;
    bool own_auth = false, own_ct = false;
    for (size_t i = 0; headers && headers[i]; i++) {
        own_auth |= strncasecmp(headers[i], "Authorization:", 14) == 0;
        own_ct |= strncasecmp(headers[i], "Content-Type:", 13) == 0;
    }
    if (body && !own_ct)
        hl = curl_slist_append(hl, "Content-Type: application/json");
    char auth[300];
    if (th_token[0] && !own_auth) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", th_token);
        hl = curl_slist_append(hl, auth);
    }
    for (size_t i = 0; headers && headers[i]; i++)
        hl = curl_slist_append(hl, headers[i]);
    if (th_ca[0])
        curl_easy_setopt(c, CURLOPT_CAINFO, th_ca);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    }
    if (!strcmp(method, "HEAD"))
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    if (hl)
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, th_write_cb);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK || (rc == CURLE_OPERATION_TIMEDOUT && b.n > 0)) {
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
        *out = b.p;
        if (out_len)
            *out_len = b.n;
    } else {
        free(b.p);
        *out = NULL;
    }
    if (headers_out)
        *headers_out = hb.p;
    else
        free(hb.p);
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    return *out ? 0 : -1;
}

bool th_state_in(const char *state, const char *states)
{
    if (!state || !*state)
        return false;
    size_t sl = strlen(state);
    for (const char *p = states; p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == sl && !strncmp(p, state, len))
            return true;
        p = bar ? bar + 1 : NULL;
    }
    return false;
}

char *th_wait_json_state(const char *url, const char *states, long timeout_ms)
{
    char *last = NULL;
    for (long waited = 0; waited < timeout_ms; waited += 100) {
        long st = 0;
        char *body = NULL;
        if (th_http("GET", url, NULL, NULL, &st, &body, 5000) == 0 && st == 200) {
            json_t *j = json_loads(body, 0, NULL);
            const char *s = j ? json_string_value(json_object_get(j, "state")) : NULL;
            if (th_state_in(s, states)) {
                json_decref(j);
                free(last);
                return body;
            }
            json_decref(j);
            free(last);
            last = body;
        } else {
            free(body);
        }
        usleep(100000);
    }
    if (last)
        fprintf(stderr, "harness: timed out waiting for state %s at %s; last reply: %.500s\n", states, url, last);
    free(last);
    return NULL;
}

char *th_url_escape(const char *s)
{
    char *e = curl_easy_escape(NULL, s ? s : "", 0);
    char *out = strdup(e ? e : "");
    curl_free(e);
    return out;
}

const char *th_grpc_python_missing(void)
{
    if (system("command -v protoc >/dev/null 2>&1") != 0)
        return "protoc is not installed (apt-get install protobuf-compiler)";
    if (system("/usr/bin/python3 -c 'import grpc, google.protobuf' >/dev/null 2>&1") != 0)
        return "/usr/bin/python3 lacks grpc or protobuf (apt-get install python3-grpcio python3-protobuf)";
    return NULL;
}

char *th_repo_file(const char *path)
{
    const char *root = getenv("KILN_ROOT");
    char full[PATH_MAX];
    snprintf(full, sizeof full, "%s/%s", root && *root ? root : ".", path);
    FILE *f = fopen(full, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0
        && (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n) {
        buf[n] = '\0';
    } else {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

int th_repo_dir_each(const char *dir, const char *suffix, void (*fn)(const char *path, const char *text, void *ctx),
                     void *ctx)
{
    const char *root = getenv("KILN_ROOT");
    char full[PATH_MAX];
    snprintf(full, sizeof full, "%s/%s", root && *root ? root : ".", dir);
    struct dirent **ents = NULL;
    int ne = scandir(full, &ents, NULL, alphasort), nread = 0;
    size_t sl = strlen(suffix);
    for (int f = 0; f < ne; f++) {
        size_t n = strlen(ents[f]->d_name);
        if (n > sl && strcmp(ents[f]->d_name + n - sl, suffix) == 0 && nread >= 0) {
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s/%s", dir, ents[f]->d_name);
            char *t = th_repo_file(path);
            if (t) {
                fn(path, t, ctx);
                nread++;
            } else {
                nread = -1;
            }
            free(t);
        }
        free(ents[f]);
    }
    free(ents);
    return ne < 0 ? -1 : nread;
}

int th_migrations_each(void (*fn)(const char *path, const char *text, void *ctx), void *ctx)
{
    return th_repo_dir_each("migrations", ".sql", fn, ctx);
}

int th_protoc_python(const char *dir)
{
    const char *root = getenv("KILN_ROOT");
    if (!root || !*root)
        root = ".";
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && protoc -I%s/proto --python_out='%s' %s/proto/kiln.proto", dir, root,
             dir, root);
    int rc = system(cmd);
    if (rc != 0)
        fprintf(stderr, "harness: %s failed\n", cmd);
    return rc;
}

json_t *th_grpc_plain(const char *target, const char *dir, json_t *calls, const char *name, char *said, size_t n)
{
    json_t *plan = json_pack("{s:s, s:s, s:s, s:o}", "target", target, "proto_dir", dir, "ca", "", "calls", calls);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s.json", dir, name);
    return th_grpc_client(plan, path, said, n);
}

json_t *th_grpc_client(json_t *plan, const char *path, char *said, size_t n)
{
    said[0] = '\0';
    int w = json_dump_file(plan, path, 0);
    json_decref(plan);
    if (w != 0) {
        snprintf(said, n, "could not write %s", path);
        return NULL;
    }
    const char *root = getenv("KILN_ROOT");
    if (!root || !*root)
        root = ".";
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/grpc/grpc_client.py '%s' 2>&1", root, path);
    FILE *p = popen(cmd, "r");
    if (!p) {
        snprintf(said, n, "could not run %s", cmd);
        return NULL;
    }
    json_t *out = json_array();
    char *line = NULL;
    size_t cap = 0, used = 0;
    ssize_t len;
    bool bad = false;
    while ((len = getline(&line, &cap, p)) >= 0) { /* a streamed download's line can be megabytes */
        json_t *j = bad ? NULL : json_loads(line, JSON_DISABLE_EOF_CHECK, NULL);
        if (j) {
            json_array_append_new(out, j);
            continue;
        }
        bad = true; /* what it printed from here on says why */
        if (used + 1 < n)
            used += (size_t)snprintf(said + used, n - used, "%s", line);
    }
    free(line);
    int st = pclose(p);
    if (!bad && st != 0)
        snprintf(said, n, "%s exited with status %d", cmd, st);
    if (bad || st != 0) {
        json_decref(out);
        return NULL;
    }
    return out;
}

char *th_read_line(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, f);
    fclose(f);
    if (n < 0) {
        free(line);
        return NULL;
    }
    line[strcspn(line, "\n")] = '\0';
    return line;
}

/* ---- raw connections ------------------------------------------------------------------------ */

long th_nofile_raise(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return -1;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    return rl.rlim_cur == RLIM_INFINITY ? 1L << 20 : (long)rl.rlim_cur;
}

int th_tcp_connect(const char *from, int port, bool nonblock)
{
    int fd = socket(AF_INET, SOCK_STREAM | (nonblock ? SOCK_NONBLOCK : 0) | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (from) {
        struct sockaddr_in src = {.sin_family = AF_INET, .sin_port = 0};
        inet_pton(AF_INET, from, &src.sin_addr);
        if (bind(fd, (struct sockaddr *)&src, sizeof src) != 0) {
            int e = errno;
            close(fd);
            errno = e;
            return -1;
        }
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 && !(nonblock && errno == EINPROGRESS)) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

bool th_tcp_closed_within(int fd, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, timeout_ms) <= 0)
        return false;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK); /* bytes stay for the caller */
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

int th_raw_exchange(int port, const void *req, size_t len, int timeout_ms, char **out, size_t *out_len,
                    bool *closed)
{
    *out = NULL;
    *out_len = 0;
    *closed = false;
    int fd = th_tcp_connect(NULL, port, false);
    if (fd < 0)
        return -1;
    const char *p = req;
    for (size_t sent = 0; sent < len;) {
        ssize_t w = send(fd, p + sent, len - sent, MSG_NOSIGNAL);
        if (w <= 0)
            break; /* the server may close before it has read everything: what it answered counts */
        sent += (size_t)w;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long left = timeout_ms - ((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000);
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&pf, 1, (int)left) <= 0)
            break;
        if (n == cap) {
            cap *= 2;
            buf = realloc(buf, cap + 1);
        }
        ssize_t r = recv(fd, buf + n, cap - n, 0);
        if (r <= 0) {
            *closed = true; /* its end, or a reset after it */
            break;
        }
        n += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *out = buf;
    *out_len = n;
    return 0;
}

/* Polls f's first `opened` connections, counting and closing those the server closed, until at most
 * `want` stay open or the deadline (CLOCK_MONOTONIC ms) passes; returns whether it got there. */
static bool flood_settle(th_flood_t *f, int opened, int want, int64_t deadline_ms, struct pollfd *p, int *idx)
{
    for (;;) {
        int np = 0;
        f->held = 0;
        for (int i = 0; i < opened; i++)
            if (f->fds[i] >= 0) {
                p[np] = (struct pollfd){.fd = f->fds[i], .events = POLLIN};
                idx[np++] = i;
                f->held++;
            }
        if (f->held <= want)
            return true;
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        int64_t left = deadline_ms - ((int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000);
        if (left <= 0)
            return false;
        if (poll(p, (nfds_t)np, (int)KILN_TH_MIN(left, 200)) < 0)
            return false;
        for (int k = 0; k < np; k++) {
            if (!(p[k].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            char c;
            ssize_t r = recv(p[k].fd, &c, 1, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
                close(p[k].fd);
                f->fds[idx[k]] = -1;
                f->refused++;
            }
        }
    }
}

/* The connections go out in waves no larger than the server's listen queue (1,024) can take, each
 * once the server has answered the last: a burst past the queue makes the kernel answer with SYN
 * cookies, and a cookie's final ACK dropped on a full queue leaves a connection the client counts as
 * open and the server never saw (CI once counted 259 "held" this way). */
#define FLOOD_WAVE 256

int th_flood(th_flood_t *f, const char *from, int port, int n, int expect_held, int timeout_ms)
{
    memset(f, 0, sizeof *f);
    f->fds = malloc((size_t)n * sizeof *f->fds);
    f->n = n;
    struct pollfd *p = malloc((size_t)n * sizeof *p);
    int *idx = malloc((size_t)n * sizeof *idx);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int64_t deadline_ms = (int64_t)t0.tv_sec * 1000 + t0.tv_nsec / 1000000 + timeout_ms;
    bool ok = true;
    int opened = 0;
    while (ok && opened < n) {
        int wave = KILN_TH_MIN(FLOOD_WAVE, n - opened);
        for (int i = opened; i < opened + wave; i++) {
            f->fds[i] = th_tcp_connect(from, port, true);
            if (f->fds[i] < 0)
                f->failed++;
        }
        opened += wave;
        /* until the limit is passed the server answers nothing, and the queue has room */
        if (opened > expect_held)
            ok = flood_settle(f, opened, expect_held, deadline_ms, p, idx);
    }
    if (ok)
        ok = flood_settle(f, opened, expect_held, deadline_ms, p, idx);
    free(p);
    free(idx);
    return ok && f->held == expect_held ? 0 : -1;
}

void th_flood_end(th_flood_t *f)
{
    for (int i = 0; f->fds && i < f->n; i++)
        if (f->fds[i] >= 0)
            close(f->fds[i]);
    free(f->fds);
    f->fds = NULL;
}
