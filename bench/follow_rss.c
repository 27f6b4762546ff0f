/* follow_rss.c - what live log followers cost kilnd in memory, and whether it comes back: submits
 * a job (a spec file), opens N followers of it at once (GET /v1/jobs/ID/logs?follow=true,
 * Server-Sent Events over TLS with an API token, libcurl's multi interface on one thread), reads
 * every stream to its `event: end`, then waits. kilnd's resident set size (VmRSS of its pid) is
 * sampled every 100 ms: idle (just before the job), peak (while followers are open) and after
 * (once they have all ended and the wait is over). Prints one line per run. Not a test: it
 * asserts nothing.
 * usage: follow_rss --url https://HOST:PORT --ca CA.pem --token-file ADMIN --spec JOB.json
 *                   --pid KILND_PID --followers N [--after-s S] [--timeout-s S] */
#include <curl/curl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct follower {
    CURL *h;
    size_t bytes, lines;
    bool ended;
    char tail[16];                /* the last bytes seen, for a marker split across writes */
} follower_t;

static const char *url, *ca, *token_file, *spec_file;
static int pid, nfollowers = 200;
static double after_s = 10, timeout_s = 600;
static char auth[600];

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
    fprintf(stderr, "follow_rss: %s\n", what);
    exit(1);
}

/* kilnd's resident set size in MB, or -1 when it is gone. */
static double rss_mb(void)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    double mb = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            mb = atof(line + 6) / 1024.0;
    fclose(f);
    return mb;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = calloc(1, (size_t)n + 1);
    if (fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    fclose(f);
    return s;
}

typedef struct buf {
    char *p;
    size_t n;
} buf_t;

static size_t buf_write(char *d, size_t sz, size_t n, void *u)
{
    buf_t *b = u;
    b->p = realloc(b->p, b->n + sz * n + 1);
    memcpy(b->p + b->n, d, sz * n);
    b->n += sz * n;
    b->p[b->n] = '\0';
    return sz * n;
}

/* POST /v1/jobs with the spec; the new job's id into id. */
static void submit(const char *spec, char *id, size_t n)
{
    CURL *h = curl_easy_init();
    char u[512];
    snprintf(u, sizeof u, "%s/v1/jobs", url);
    struct curl_slist *hd = curl_slist_append(NULL, auth);
    hd = curl_slist_append(hd, "Content-Type: application/json");
    buf_t b = {0};
    curl_easy_setopt(h, CURLOPT_URL, u);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(h, CURLOPT_CAINFO, ca);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, spec);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, buf_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    if (curl_easy_perform(h) != CURLE_OK || !b.p)
        die("could not submit the job");
    const char *p = strstr(b.p, "\"id\":\"");
    if (!p)
        die(b.p);
    p += 6;
    snprintf(id, n, "%.*s", (int)strcspn(p, "\""), p);
    free(b.p);
    curl_slist_free_all(hd);
    curl_easy_cleanup(h);
}

static size_t follow_write(char *d, size_t sz, size_t n, void *u)
{
    follower_t *f = u;
    size_t len = sz * n;
    f->bytes += len;
    char look[16 + 4096];
    size_t t = strlen(f->tail), take = len < 4096 ? len : 4096;
    memcpy(look, f->tail, t);
    memcpy(look + t, d + len - take, take);
    look[t + take] = '\0';
    for (size_t i = 0; i < len; i++)
        if (d[i] == '\n' && i + 1 < len && d[i + 1] == '\n')
            f->lines++;
    if (strstr(look, "event: end"))
        f->ended = true;
    size_t keep = t + take < 12 ? t + take : 12;
    memmove(f->tail, look + t + take - keep, keep);
    f->tail[keep] = '\0';
    return len;
}

int main(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--url"))
            url = argv[i + 1];
        else if (!strcmp(argv[i], "--ca"))
            ca = argv[i + 1];
        else if (!strcmp(argv[i], "--token-file"))
            token_file = argv[i + 1];
        else if (!strcmp(argv[i], "--spec"))
            spec_file = argv[i + 1];
        else if (!strcmp(argv[i], "--pid"))
            pid = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--followers"))
            nfollowers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--after-s"))
            after_s = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--timeout-s"))
            timeout_s = atof(argv[i + 1]);
        else
            die("unknown argument (see the usage at the top of bench/follow_rss.c)");
    }
    if (!url || !ca || !token_file || !spec_file || pid <= 0 || nfollowers < 1)
        die("usage: follow_rss --url U --ca CA --token-file F --spec JOB.json --pid PID --followers N");
    char *tok = slurp(token_file), *spec = slurp(spec_file);
    if (!tok || !spec)
        die("cannot read the token file or the spec");
    tok[strcspn(tok, "\r\n")] = '\0';
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", tok);
    curl_global_init(CURL_GLOBAL_DEFAULT);

    double idle = rss_mb();
    char id[64];
    submit(spec, id, sizeof id);
    char u[600];
    snprintf(u, sizeof u, "%s/v1/jobs/%s/logs?follow=true", url, id);
    CURLM *m = curl_multi_init();
    follower_t *fs = calloc((size_t)nfollowers, sizeof *fs);
    struct curl_slist *hd = curl_slist_append(NULL, auth);
    hd = curl_slist_append(hd, "Accept: text/event-stream");
    for (int i = 0; i < nfollowers; i++) {
        CURL *h = fs[i].h = curl_easy_init();
        curl_easy_setopt(h, CURLOPT_URL, u);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
        curl_easy_setopt(h, CURLOPT_CAINFO, ca);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, follow_write);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &fs[i]);
        curl_easy_setopt(h, CURLOPT_PRIVATE, &fs[i]);
        curl_easy_setopt(h, CURLOPT_FORBID_REUSE, 1L);
        curl_multi_add_handle(m, h);
    }
    double t0 = now_s(), peak = idle, next_sample = 0;
    int running = 1, ended = 0, failed = 0;
    while (running && now_s() - t0 < timeout_s) {
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left)))
            if (msg->msg == CURLMSG_DONE) {
                follower_t *f = NULL;
                curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&f);
                if (f && f->ended)
                    ended++;
                else
                    failed++;
            }
        if (now_s() >= next_sample) {
            double r = rss_mb();
            if (r > peak)
                peak = r;
            next_sample = now_s() + 0.1;
        }
        curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    double streamed = now_s() - t0;
    size_t lines = 0;
    for (int i = 0; i < nfollowers; i++) {
        lines += fs[i].lines;
        curl_multi_remove_handle(m, fs[i].h);
        curl_easy_cleanup(fs[i].h);
    }
    double end = now_s();
    while (now_s() - end < after_s) {
        double r = rss_mb();
        if (r > peak)
            peak = r;
        usleep(100000);
    }
    double after = rss_mb();
    printf("followers %d: %d ended, %d failed, %.0f events each, streamed in %.1f s; kilnd RSS idle %.1f MB, "
           "peak %.1f MB, %.0f s after %.1f MB (%.0f%% of idle)\n",
           nfollowers, ended, failed, (double)lines / nfollowers, streamed, idle, peak, after_s, after,
           100.0 * after / idle);
    curl_slist_free_all(hd);
    curl_multi_cleanup(m);
    free(fs);
    free(tok);
    free(spec);
    return failed ? 1 : 0;
}
