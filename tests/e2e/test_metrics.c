/* test_metrics.c - what Prometheus scrapes from a real kilnd and real agents after a real job:
 * every family the dashboards use is there and has moved (REST and gRPC latency histograms by
 * route and method, jobs by state and finished by outcome, queue length and wait, scheduling
 * passes, workers and slots, ingested lines and points, the pool, streams, process_* and
 * kiln_build_info), `promtool check metrics` (Debian's prometheus package) finds nothing to
 * say about either exposition, /healthz answers on the agents' --metrics-addr, and the --health
 * probes of both daemons exit 0 against a live server and 1 against a dead port. Every label
 * value of a fixed set is lower case on both, and the agents tell their machine's CPU and memory. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "tests/common/harness.h"
#include "tests/e2e/e2e.h"

/* GET url with no token; asserts 200; returns the body (caller frees). */
static char *scrape(const char *url)
{
    long st = 0;
    char *out = NULL;
    const char *hdrs[] = {"Authorization:", NULL}; /* /metrics and /healthz need no token */
    cr_assert_eq(th_http("GET", url, NULL, hdrs, &st, &out, 10000), 0, "GET %s failed", url);
    cr_assert_eq(st, 200, "GET %s: %ld %s", url, st, out);
    return out;
}

/* The value of the first sample line starting with prefix (name and labels), or -1. */
static double sample(const char *text, const char *prefix)
{
    size_t n = strlen(prefix);
    for (const char *p = text; p && *p;) {
        if (!strncmp(p, prefix, n) && (p[n] == ' ' || p[n] == '{' || p[n - 1] == '}'))
            return atof(strchr(p + n, ' ') ? strchr(p + n, ' ') + 1 : "-1");
        p = strchr(p, '\n');
        p = p ? p + 1 : NULL;
    }
    return -1;
}

/* Asserts that every label value in the exposition is lower case, but for the labels that carry
 * a name as written (a REST route, a gRPC method, a queue, a version) and a histogram bucket's
 * bound (le="+Inf", as the format spells it). */
static void label_values_lower_case(const char *what, const char *text)
{
    static const char *const as_written[] = {"route", "method", "queue", "version", "le"};
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        const char *brace = strchr(line, '{');
        if (line[0] != '#' && brace && (!end || brace < end)) {
            for (const char *p = brace + 1; *p && *p != '}';) {
                const char *eq = strchr(p, '=');
                cr_assert(eq && eq[1] == '"', "%s: a malformed sample: %.200s", what, line);
                bool free_form = false;
                for (size_t i = 0; i < KILN_ARRAY_LEN(as_written); i++)
                    free_form |= (size_t)(eq - p) == strlen(as_written[i]) && !strncmp(p, as_written[i], eq - p);
                const char *v = eq + 2;
                for (; *v && *v != '"'; v++) {
                    if (*v == '\\' && v[1])
                        v++;
                    else
                        cr_assert(free_form || !isupper((unsigned char)*v),
                                  "%s: a label value not in lower case: %.*s", what, (int)(end ? end - line : 200),
                                  line);
                }
                p = *v ? v + 1 : v;
                if (*p == ',')
                    p++;
            }
        }
        line = end ? end + 1 : NULL;
    }
}

/* promtool check metrics reads the exposition on stdin: exit 0 and no complaint. */
static void promtool_clean(const char *what, const char *text)
{
    cr_assert(access("/usr/bin/promtool", X_OK) == 0, "promtool is missing (Debian's prometheus package)");
    char dir[] = "/tmp/kiln-prom.XXXXXX";
    cr_assert(mkdtemp(dir));
    char in[128], out[128], cmd[512];
    snprintf(in, sizeof in, "%s/metrics.txt", dir);
    snprintf(out, sizeof out, "%s/promtool.txt", dir);
    FILE *f = fopen(in, "w");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "/usr/bin/promtool check metrics < %s > %s 2>&1", in, out);
    int rc = system(cmd);
    char *said = e2e_slurp(out);
    cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 0 && !said[0], "promtool check metrics on %s: %s", what, said);
    free(said);
    cr_assert(th_rm_tree(dir), "could not remove %s", dir);
}

Test(e2e_metrics, kilnd_and_agents_expose_what_prometheus_needs, .init = e2e_setup, .fini = e2e_teardown,
     .timeout = 240)
{
    char *spec = e2e_spec("e2e-metrics", 20, 1, 1, 4);
    json_t *job = e2e_submit(spec);
    free(spec);
    char id[64], path[128];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(job, "id")));
    json_decref(job);
    json_decref(e2e_wait_state(id, "COMPLETED", 120000));
    snprintf(path, sizeof path, "/v1/jobs/%s/logs", id);
    json_decref(e2e_get(path));
    /* the routes search and artifacts added are counted in the same registry */
    long st = 0;
    json_decref(e2e_http("POST", "/v1/jobs:search", "{\"filter\": \"state = COMPLETED\", \"columns\": [\"hp.*\"]}",
                         NULL, &st));
    cr_assert_eq(st, 200);
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts", id);
    json_t *arts = e2e_get(path);
    const char *aname = json_string_value(json_object_get(json_array_get(json_object_get(arts, "artifacts"), 0), "name"));
    cr_assert(aname, "the job left no artifact");
    char apath[256];
    snprintf(apath, sizeof apath, "/v1/jobs/%s/artifacts/%s", id, aname);
    json_decref(e2e_http("GET", apath, NULL, "Range: bytes=0-0", &st));
    cr_assert_eq(st, 206);

    /* a gRPC server stream is counted under its own method */
    json_t *g = e2e_grpc("/kiln.TrainingService/DownloadArtifact",
                         json_pack("{s:s, s:s, s:i}", "id", id, "name", aname, "length", 1));
    cr_assert_str_eq(json_string_value(json_object_get(g, "code")), "OK", "%s",
                     json_string_value(json_object_get(g, "details")));
    json_decref(g);
    json_decref(arts);

    char url[256];
    snprintf(url, sizeof url, "%s/metrics", e2e_cl->url);
    /* the stream counts itself once its status is sent, which the client may see first */
    static const char dl_ok[] = "kiln_grpc_requests_total{method=\"/kiln.TrainingService/DownloadArtifact\",code=\"ok\"}";
    char *k = scrape(url);
    for (int i = 0; i < 200 && sample(k, dl_ok) < 1; i++) {
        free(k);
        usleep(50 * 1000);
        k = scrape(url);
    }
    cr_assert_eq(sample(k, dl_ok), 1, "kilnd's /metrics does not count the DownloadArtifact stream:\n%.3000s", k);
    cr_assert(!strstr(k, "method=\"/kiln.TrainingService/StreamLogs\""),
              "a stream that was not StreamLogs was counted as one");
    promtool_clean("kilnd", k);
    label_values_lower_case("kilnd", k);
    static const char *const kilnd_has[] = {
        "kiln_http_request_duration_seconds_bucket{route=\"POST /v1/jobs\",le=\"+Inf\"}",
        "kiln_http_requests_total{route=\"POST /v1/jobs\",status=\"201\"}",
        "kiln_grpc_request_duration_seconds_count{method=\"/kiln.AgentService/Heartbeat\"}",
        "kiln_grpc_request_duration_seconds_count{method=\"/kiln.AgentService/PushLogs\"}",
        "kiln_grpc_requests_total{method=\"/kiln.AgentService/RegisterWorker\",code=\"ok\"}",
        "kiln_jobs{state=\"completed\"}",
        "kiln_jobs_finished_total{outcome=\"completed\"}",
        "kiln_queue_length{queue=\"default\"}",
        "kiln_job_queue_wait_seconds_count",
        "kiln_scheduler_pass_seconds_count",
        "kiln_workers{state=\"alive\"}",
        "kiln_slots{slot_type=\"cpu\",state=\"free\"}",
        "kiln_ingested_log_lines_total",
        "kiln_ingested_metric_points_total",
        "kiln_db_pool_connections{state=\"in_use\"}",
        "kiln_http_log_streams",
        "kiln_up{component=\"database\"}",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
        "kiln_build_info{program=\"kilnd\",version=\"" KILN_VERSION "\"}",
        "kiln_http_requests_total{route=\"POST /v1/jobs:search\",status=\"200\"}",
        "kiln_http_request_duration_seconds_count{route=\"GET /v1/jobs/{id}/artifacts\"}",
        "kiln_http_requests_total{route=\"GET /v1/jobs/{id}/artifacts/{name}\",status=\"206\"}",
        "kiln_artifact_bytes_total{direction=\"stored\"}",
        "kiln_artifact_bytes_total{direction=\"served\",api=\"rest\"}",
        "kiln_jobs_deleted_total",
        "kiln_leader",
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(kilnd_has); i++)
        cr_assert(sample(k, kilnd_has[i]) >= 0, "kilnd's /metrics lacks %s:\n%.3000s", kilnd_has[i], k);
    cr_assert_geq(sample(k, "kiln_jobs{state=\"completed\"}"), 1);
    cr_assert_geq(sample(k, "kiln_jobs_finished_total{outcome=\"completed\"}"), 1);
    cr_assert_geq(sample(k, "kiln_job_queue_wait_seconds_count"), 1);
    cr_assert_geq(sample(k, "kiln_scheduler_pass_seconds_count"), 1);
    cr_assert_eq(sample(k, "kiln_workers{state=\"alive\"}"), E2E_AGENTS);
    cr_assert_eq(sample(k, "kiln_slots{slot_type=\"cpu\",state=\"free\"}"), 3, "2 + 1 cpu slots, all free");
    cr_assert_gt(sample(k, "kiln_ingested_log_lines_total"), 0);
    cr_assert_gt(sample(k, "kiln_ingested_metric_points_total"), 0);
    cr_assert_gt(sample(k, "kiln_grpc_request_duration_seconds_count{method=\"/kiln.AgentService/PushLogs\"}"), 0);
    cr_assert_eq(sample(k, "kiln_up{component=\"database\"}"), 1);
    cr_assert_eq(sample(k, "kiln_leader"), 1, "the cluster's only kilnd leads (it scheduled the job)");
    cr_assert_gt(sample(k, "kiln_artifact_bytes_total{direction=\"stored\"}"), 0);
    cr_assert_eq(sample(k, "kiln_artifact_bytes_total{direction=\"served\",api=\"rest\"}"), 1, "one byte of a range");
    char *agent0 = NULL;

    for (int i = 0; i < E2E_AGENTS; i++) {
        snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", e2e_cl->metrics_port[i]);
        char *a = scrape(url);
        promtool_clean("kiln-agent", a);
        label_values_lower_case("kiln-agent", a);
        cr_assert_geq(sample(a, "kiln_agent_host_cpus"), 1, "%s", a);
        cr_assert_gt(sample(a, "kiln_agent_host_cpu_seconds_total{mode=\"idle\"}"), 0);
        cr_assert_gt(sample(a, "kiln_agent_host_memory_bytes{state=\"total\"}"), 0);
        cr_assert_gt(sample(a, "kiln_agent_host_memory_bytes{state=\"available\"}"), 0);
        cr_assert_eq(sample(a, "kiln_agent_registered"), 1, "%s", a);
        cr_assert_eq(sample(a, "kiln_agent_slots"), e2e_cl->agent_slots[i]);
        cr_assert_eq(sample(a, "kiln_agent_outbox_dropped_lines_total"), 0);
        cr_assert_geq(sample(a, "kiln_agent_outbox_dropped_points_total"), 0);
        cr_assert_geq(sample(a, "process_resident_memory_bytes"), 1);
        cr_assert_eq(sample(a, "kiln_build_info{program=\"kiln-agent\",version=\"" KILN_VERSION "\"}"), 1);
        if (!agent0)
            agent0 = a;
        else
            free(a);
        snprintf(url, sizeof url, "http://127.0.0.1:%d/healthz", e2e_cl->metrics_port[i]);
        char *h = scrape(url);
        json_t *hj = json_loads(h, 0, NULL);
        cr_assert(json_is_true(json_object_get(hj, "registered")), "%s", h);
        const char *wid = json_string_value(json_object_get(hj, "worker_id"));
        cr_assert(wid && (!strcmp(wid, e2e_cl->worker_id[0]) || !strcmp(wid, e2e_cl->worker_id[1])), "%s", h);
        json_decref(hj);
        free(h);
    }

    /* Every metric the Grafana dashboard queries is one kilnd or an agent exposes. */
    char dash[PATH_MAX];
    snprintf(dash, sizeof dash, "%s/deploy/grafana/kiln-dashboard.json", e2e_root());
    json_error_t jerr;
    json_t *d = json_load_file(dash, 0, &jerr);
    cr_assert(d, "%s: %s", dash, jerr.text);
    size_t i, j, used = 0;
    json_t *panel, *target;
    json_array_foreach(json_object_get(d, "panels"), i, panel) {
        json_array_foreach(json_object_get(panel, "targets"), j, target) {
            const char *e = json_string_value(json_object_get(target, "expr"));
            for (const char *p = e; p && *p; p++) {
                if ((strncmp(p, "kiln_", 5) && strncmp(p, "process_", 8)) || (p > e && (isalnum((unsigned char)p[-1]) || p[-1] == '_')))
                    continue;
                char name[96];
                size_t n = 0;
                while (n < sizeof name - 2 && (isalnum((unsigned char)p[n]) || p[n] == '_'))
                    name[n] = p[n], n++;
                name[n] = '\0';
                char line[100];
                snprintf(line, sizeof line, "\n%s", name);
                cr_assert(strstr(k, line) || strstr(agent0, line), "the dashboard queries %s, which nobody exposes",
                          name);
                used++;
                p += n - 1;
            }
        }
    }
    cr_assert_gt(used, 20);
    json_decref(d);
    free(k);
    free(agent0);

    /* --health: 0 against the live servers, 1 against a port nothing listens on */
    char http_env[64], cert_env[PATH_MAX + 32], maddr_env[64], dead_env[64];
    snprintf(http_env, sizeof http_env, "KILN_HTTP_ADDR=127.0.0.1:%d", e2e_cl->http_port);
    snprintf(cert_env, sizeof cert_env, "KILN_TLS_CERT=%s/server.pem", e2e_cl->tls_dir);
    snprintf(maddr_env, sizeof maddr_env, "KILN_METRICS_ADDR=127.0.0.1:%d", e2e_cl->metrics_port[0]);
    snprintf(dead_env, sizeof dead_env, "KILN_METRICS_ADDR=127.0.0.1:%d", th_free_port());
    char kilnd_bin[PATH_MAX], agent_bin[PATH_MAX];
    snprintf(kilnd_bin, sizeof kilnd_bin, "%s/kilnd", th_bin_dir());
    snprintf(agent_bin, sizeof agent_bin, "%s/kiln-agent", th_bin_dir());
    char *kargv[] = {kilnd_bin, "--health", NULL}, *aargv[] = {agent_bin, "--health", NULL};
    char *kenv[] = {http_env, cert_env, NULL}, *aenv[] = {maddr_env, NULL}, *denv[] = {dead_env, NULL};
    char *out = NULL, *err = NULL;
    cr_assert_eq(e2e_run(kargv, kenv, &out, &err, 20000), 0, "kilnd --health: %s%s", out, err);
    free(out);
    free(err);
    cr_assert_eq(e2e_run(aargv, aenv, &out, &err, 20000), 0, "kiln-agent --health: %s%s", out, err);
    free(out);
    free(err);
    cr_assert_eq(e2e_run(aargv, denv, &out, &err, 20000), 1, "kiln-agent --health on a dead port: %s%s", out, err);
    free(out);
    free(err);
    e2e_pass();
}

/* Receives datagrams on fd until one contains want, for at most timeout_ms; the texts seen go to
 * seen (size n). */
static bool notify_wait(int fd, const char *want, int timeout_ms, char *seen, size_t n)
{
    int64_t end = kiln_mono_us() + (int64_t)timeout_ms * 1000;
    while (kiln_mono_us() < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        char buf[512];
        ssize_t r = recv(fd, buf, sizeof buf - 1, 0);
        if (r <= 0)
            continue;
        buf[r] = '\0';
        size_t l = strlen(seen);
        snprintf(seen + l, n - l, "[%s]", buf);
        if (strstr(buf, want))
            return true;
    }
    return false;
}

/* systemd's Type=notify, without systemd: kilnd and kiln-agent say READY=1 once they serve (kilnd
 * with its database URL read from a credential file, as kilnd.service gives it), ping the
 * watchdog while they work, and say STOPPING=1 on SIGTERM. */
Test(e2e_metrics, daemons_notify_systemd_and_ping_the_watchdog, .timeout = 120)
{
    char dir[] = "/tmp/kiln-notify.XXXXXX";
    cr_assert(mkdtemp(dir));
    char sock_path[128], url_file[128], work[128];
    snprintf(sock_path, sizeof sock_path, "%s/notify", dir);
    snprintf(url_file, sizeof url_file, "%s/database.url", dir);
    snprintf(work, sizeof work, "%s/work", dir);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%.100s", sock_path);
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    char *db = th_pg_create_db("notify");
    cr_assert(db);
    FILE *f = fopen(url_file, "w");
    fprintf(f, "%s\n", db);
    fclose(f);
    chmod(url_file, 0600);
    int hp = th_free_port(), gp = th_free_port();
    char http[64], grpc[64], env_sock[160], env_url[160], log[160];
    snprintf(http, sizeof http, "127.0.0.1:%d", hp);
    snprintf(grpc, sizeof grpc, "127.0.0.1:%d", gp);
    snprintf(env_sock, sizeof env_sock, "NOTIFY_SOCKET=%s", sock_path);
    snprintf(env_url, sizeof env_url, "KILN_DATABASE_URL_FILE=%s", url_file);
    snprintf(log, sizeof log, "%s/kilnd.log", dir);
    char kilnd[PATH_MAX], agent[PATH_MAX];
    snprintf(kilnd, sizeof kilnd, "%s/kilnd", th_bin_dir());
    snprintf(agent, sizeof agent, "%s/kiln-agent", th_bin_dir());
    char *kargv[] = {kilnd, "--http-addr", http, "--grpc-addr", grpc, "--insecure", "--no-auth", NULL};
    char *kenv[] = {env_sock, env_url, "WATCHDOG_USEC=1000000", NULL};
    pid_t k = th_spawn(kargv, kenv, log);
    cr_assert(k > 0);
    char seen[4096] = "";
    cr_assert(notify_wait(fd, "READY=1", 30000, seen, sizeof seen), "kilnd never said READY=1: %s", seen);
    /* ready means serving */
    char url[96], *body = NULL;
    long st = 0;
    snprintf(url, sizeof url, "http://%s/readyz", http);
    cr_assert(th_http("GET", url, NULL, NULL, &st, &body, 5000) == 0 && st == 200, "READY=1 before /readyz: %ld", st);
    free(body);
    seen[0] = '\0';
    cr_assert(notify_wait(fd, "WATCHDOG=1", 5000, seen, sizeof seen), "kilnd never pinged the watchdog: %s", seen);

    snprintf(log, sizeof log, "%s/agent.log", dir);
    char *aargv[] = {agent, "--server", grpc, "--insecure", "--work-dir", work, "--slots", "1", NULL};
    char *aenv[] = {env_sock, "WATCHDOG_USEC=1000000", NULL};
    pid_t a = th_spawn(aargv, aenv, log);
    cr_assert(a > 0);
    seen[0] = '\0';
    cr_assert(notify_wait(fd, "READY=1", 30000, seen, sizeof seen), "kiln-agent never said READY=1: %s", seen);
    seen[0] = '\0';
    cr_assert(notify_wait(fd, "WATCHDOG=1", 5000, seen, sizeof seen), "kiln-agent never pinged: %s", seen);
    th_stop(a, SIGTERM, 10000);
    seen[0] = '\0';
    kill(k, SIGTERM);
    cr_assert(notify_wait(fd, "STOPPING=1", 10000, seen, sizeof seen), "kilnd never said STOPPING=1: %s", seen);
    th_stop(k, SIGTERM, 10000);
    close(fd);
    free(db);
    cr_assert(th_rm_tree(dir), "could not remove %s", dir);
}
