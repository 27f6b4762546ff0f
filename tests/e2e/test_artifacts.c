/* test_artifacts.c - a job's output, end to end: real kilnd (TLS, tokens, an artifact store),
 * real agents and real training. The model a rank wrote comes back byte for byte over REST, the
 * CLI and the Python SDK; an upload cut by SIGKILLing kilnd continues after its restart from
 * what the store held; a job started from an earlier job's model (init_from "job:<id>") begins at
 * that model's loss; and `kiln delete` removes an ended job with its files, refusing a running
 * one. */
#include <criterion/criterion.h>
#include <libpq-fe.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "tests/common/harness.h"
#include "tests/e2e/e2e.h"

/* The file rank 0 of the job wrote, from the agent's work dir. Caller frees. */
static char *rank_file(const char *job, const char *name, size_t *len)
{
    int a = e2e_agent_of_job(job);
    cr_assert_geq(a, 0, "no agent ran job %s", job);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/jobs/%s/output/%s", e2e_cl->work_dir[a], job, name);
    char *text = NULL;
    kiln_err_t err;
    cr_assert_eq(kiln_file_read(path, &text, len, &err), 0, "%s", err.message);
    return text;
}

/* GET of an artifact over REST: the bytes (caller frees). */
static char *rest_artifact(const char *job, const char *name, size_t *len)
{
    char url[512];
    snprintf(url, sizeof url, "%s/v1/jobs/%s/artifacts/%s", e2e_cl->url, job, name);
    long st = 0;
    char *out = NULL;
    cr_assert_eq(th_http_bytes("GET", url, NULL, NULL, &st, &out, len, NULL, 30000), 0);
    cr_assert_eq(st, 200, "GET %s: %ld %s", url, st, out);
    return out;
}

/* train_loss of the job by step: first and last values. */
static void losses(const char *job, double *first, double *last, int *n)
{
    char path[200];
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?name=train_loss", job);
    json_t *m = e2e_get(path);
    json_t *pts = json_object_get(json_array_get(json_object_get(m, "metrics"), 0), "points");
    *n = (int)json_array_size(pts);
    cr_assert_gt(*n, 0, "job %s has no train_loss", job);
    *first = json_number_value(json_object_get(json_array_get(pts, 0), "value"));
    *last = json_number_value(json_object_get(json_array_get(pts, (size_t)*n - 1), "value"));
    json_decref(m);
}

static char *spec_with(const char *name, int steps, const char *init_from)
{
    char *s = e2e_spec(name, steps, 1, 1, 8);
    if (!init_from)
        return s;
    json_t *j = json_loads(s, 0, NULL);
    free(s);
    json_object_set_new(json_object_get(j, "model"), "init_from", json_string(init_from));
    s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

static char *run_to_end(const char *spec, const char *want)
{
    json_t *job = e2e_submit(spec);
    char *id = strdup(e2e_jstr(job, "id"));
    json_decref(job);
    job = e2e_wait_state(id, TH_JOB_ENDED, 180000);
    cr_assert_str_eq(e2e_jstr(job, "state"), want, "job %s: %s", id, e2e_jstr(job, "reason"));
    json_decref(job);
    return id;
}

Test(e2e_artifacts, a_trained_model_comes_back_byte_for_byte_over_rest_cli_and_sdk, .init = e2e_setup,
     .fini = e2e_teardown, .timeout = 300)
{
    char *spec = spec_with("keep", 30, NULL);
    char *id = run_to_end(spec, "COMPLETED");
    free(spec);
    size_t want_len = 0, got_len = 0;
    char *want = rank_file(id, "model_llmc.bin", &want_len);
    cr_assert_gt(want_len, 1024, "the rank wrote a model");

    /* REST: listed with its checksum, then the bytes */
    char path[200];
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts", id);
    json_t *list = e2e_get(path);
    char sha[KILN_SHA256_HEX];
    kiln_sha256_hex(want, want_len, sha);
    bool found = false;
    size_t i;
    json_t *a;
    char uploader[128] = "";
    json_array_foreach(json_object_get(list, "artifacts"), i, a)
        if (!strcmp(e2e_jstr(a, "name"), "model_llmc.bin")) {
            found = true;
            cr_assert_eq(json_integer_value(json_object_get(a, "size")), (json_int_t)want_len);
            cr_assert_str_eq(e2e_jstr(a, "sha256"), sha);
            snprintf(uploader, sizeof uploader, "%s", e2e_jstr(a, "worker_id"));
        }
    /* provenance: the worker whose agent ran rank 0 uploaded it */
    cr_assert(!strcmp(uploader, e2e_cl->worker_id[0]) || !strcmp(uploader, e2e_cl->worker_id[1]),
              "the artifact names the worker that uploaded it: \"%s\"", uploader);
    cr_assert(found, "the model is listed");
    json_decref(list);
    char *got = rest_artifact(id, "model_llmc.bin", &got_len);
    cr_assert_eq(got_len, want_len);
    cr_assert(!memcmp(got, want, want_len), "REST: byte for byte");
    free(got);

    /* the CLI */
    char file[PATH_MAX], *out = NULL, *err = NULL;
    snprintf(file, sizeof file, "%s/cli-model.bin", e2e_cl->dir);
    cr_assert_eq(e2e_kiln(&out, &err, "artifacts", id, "--get", "model_llmc.bin", "-o", file, NULL), 0, "%s", err);
    cr_assert(strstr(err, "verified"), "%s", err);
    free(out);
    free(err);
    kiln_err_t kerr;
    cr_assert_eq(kiln_file_read(file, &got, &got_len, &kerr), 0, "%s", kerr.message);
    cr_assert_eq(got_len, want_len);
    cr_assert(!memcmp(got, want, want_len), "CLI: byte for byte");
    free(got);
    cr_assert_eq(e2e_kiln(&out, &err, "artifacts", id, NULL), 0, "%s", err);
    cr_assert(strstr(out, "model_llmc.bin") && strstr(out, sha) == NULL && strstr(out, "NAME"), "%s", out);
    free(out);
    free(err);
    cr_assert_eq(e2e_kiln(&out, &err, "artifacts", id, "-o", "wide", NULL), 0, "%s", err);
    cr_assert(strstr(out, sha) && strstr(out, "BYTES"), "-o wide: the whole SHA-256: %s", out);
    cr_assert(strstr(out, "WORKER") && strstr(out, uploader), "-o wide: the uploading worker: %s", out);
    free(out);
    free(err);
    cr_assert_eq(e2e_kiln(&out, &err, "artifacts", id, "-o", "json", NULL), 0, "%s", err);
    json_t *aj = json_loads(out, 0, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(aj, "artifacts"), 0), "sha256")),
                     sha, "%s", out);
    json_decref(aj);
    free(out);
    free(err);

    /* the SDK: job.model_data, SageMaker-style */
    char py[2048];
    snprintf(py, sizeof py,
             "import sys; sys.path.insert(0, '%s/sdk/python'); import kiln\n"
             "job = kiln.Client().job('%s')\n"
             "m = job.model_data\n"
             "assert m.url.endswith('/v1/jobs/%s/artifacts/model_llmc.bin'), m\n"
             "assert m.sha256 == '%s', m.sha256\n"
             "print(m.download('%s/sdk-model.bin'))\n"
             "assert [a.name for a in job.artifacts()][0] == 'model_llmc.bin'\n",
             e2e_root(), id, id, sha, e2e_cl->dir);
    char *pargv[] = {"/usr/bin/python3", "-c", py, NULL};
    cr_assert_eq(e2e_run(pargv, e2e_client_env(0), &out, &err, 60000), 0, "%s%s", out, err);
    free(out);
    free(err);
    snprintf(file, sizeof file, "%s/sdk-model.bin", e2e_cl->dir);
    cr_assert_eq(kiln_file_read(file, &got, &got_len, &kerr), 0, "%s", kerr.message);
    cr_assert_eq(got_len, want_len);
    cr_assert(!memcmp(got, want, want_len), "SDK: byte for byte");
    free(got);
    free(want);
    free(id);
    e2e_pass();
}

/* What the store holds of the job's model (-1 while no row exists). */
static long long received(PGconn *db, const char *job, long long *size)
{
    char q[300];
    snprintf(q, sizeof q, "SELECT received, size FROM artifacts WHERE job_id = '%s' AND name = 'model_llmc.bin'", job);
    PGresult *r = PQexec(db, q);
    long long v = -1;
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
        v = atoll(PQgetvalue(r, 0, 0));
        *size = atoll(PQgetvalue(r, 0, 1));
    }
    PQclear(r);
    return v;
}

Test(e2e_artifacts, an_upload_cut_by_killing_kilnd_completes_after_its_restart, .init = e2e_setup_slow_uploads,
     .fini = e2e_teardown, .timeout = 300)
{
    PGconn *db = PQconnectdb(e2e_cl->db_url);
    cr_assert_eq(PQstatus(db), CONNECTION_OK, "%s", PQerrorMessage(db));
    char *spec = spec_with("cut", 20, NULL);
    json_t *job = e2e_submit(spec);
    free(spec);
    char *id = strdup(e2e_jstr(job, "id"));
    json_decref(job);
    /* 4 KiB chunks every 150 ms: catch it part-way */
    long long size = 0, before = -1;
    for (int i = 0; i < 1200; i++) {
        before = received(db, id, &size);
        if (before >= 16384)
            break;
        usleep(50000);
    }
    cr_assert(before >= 16384 && before < size, "caught the upload part-way (%lld of %lld)", before, size);
    e2e_kilnd_kill();
    long long after_kill = received(db, id, &size);
    cr_assert_geq(after_kill, before, "what was recorded stays recorded");
    sleep(2); /* the agent retries meanwhile */
    e2e_kilnd_start();
    /* It goes on from there, never from 0, and the job completes once the model is whole. */
    long long low = after_kill;
    for (int i = 0; i < 1200; i++) {
        long long r = received(db, id, &size);
        cr_assert_geq(r, low, "the upload went back from %lld to %lld bytes", low, r);
        low = r;
        if (r == size)
            break;
        usleep(50000);
    }
    cr_assert_eq(low, size, "the upload finished");
    json_t *done = e2e_wait_state(id, TH_JOB_ENDED, 120000);
    cr_assert_str_eq(e2e_jstr(done, "state"), "COMPLETED", "%s", e2e_jstr(done, "reason"));
    json_decref(done);
    size_t want_len = 0, got_len = 0;
    char *want = rank_file(id, "model_llmc.bin", &want_len);
    char *got = rest_artifact(id, "model_llmc.bin", &got_len);
    cr_assert_eq(got_len, want_len);
    cr_assert(!memcmp(got, want, want_len), "the model is whole and right after the restart");
    /* the store kept nothing half-made */
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/artifacts/jobs/%s/1/.model_llmc.bin.partial", e2e_cl->dir, id);
    struct stat sb;
    cr_assert(stat(dir, &sb) != 0, "no partial file is left");
    free(want);
    free(got);
    free(id);
    PQfinish(db);
    e2e_pass();
}

Test(e2e_artifacts, a_job_from_an_earlier_jobs_model_begins_at_that_models_loss, .init = e2e_setup,
     .fini = e2e_teardown, .timeout = 400)
{
    char *spec = spec_with("first", 60, NULL);
    char *first = run_to_end(spec, "COMPLETED");
    free(spec);
    double a_first, a_last, b_first, b_last, c_first, c_last;
    int na, nb, nc;
    losses(first, &a_first, &a_last, &na);
    cr_assert_gt(a_first - a_last, 1.0, "the first job learned something (%.3f -> %.3f)", a_first, a_last);

    char ref[64];
    snprintf(ref, sizeof ref, "job:%s", first);
    spec = spec_with("second", 5, ref);
    char *second = run_to_end(spec, "COMPLETED");
    free(spec);
    losses(second, &b_first, &b_last, &nb);
    /* and a control: the same spec without init_from starts where the first job started */
    spec = spec_with("control", 5, NULL);
    char *control = run_to_end(spec, "COMPLETED");
    free(spec);
    losses(control, &c_first, &c_last, &nc);
    fprintf(stderr, "e2e: first job %.4f -> %.4f; from its model: %.4f; fresh: %.4f\n", a_first, a_last, b_first,
            c_first);
    cr_assert_lt(fabs(b_first - a_last), 0.3, "the second job begins at the first's final loss (%.4f vs %.4f)",
                 b_first, a_last);
    cr_assert_lt(b_first, a_first - 0.7, "not where a fresh model begins (%.4f vs %.4f)", b_first, a_first);
    cr_assert_lt(fabs(c_first - a_first), 0.05, "a fresh model begins where the first did (%.4f vs %.4f)", c_first,
                 a_first);
    /* it was fetched from kilnd and checked, on the agent that ran it */
    int ag = e2e_agent_of_job(second);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/agent%d.log", e2e_cl->dir, ag);
    char *log = e2e_slurp(path);
    char line[200];
    snprintf(line, sizeof line, "job %s: fetched the model of job %s", second, first);
    cr_assert(strstr(log, line), "agent log says: %s", line);
    free(log);
    size_t want_len, got_len;
    char *want = rest_artifact(first, "model_llmc.bin", &want_len);
    snprintf(path, sizeof path, "%s/jobs/%s/init/model_llmc.bin", e2e_cl->work_dir[ag], second);
    char *got = NULL;
    kiln_err_t err;
    cr_assert_eq(kiln_file_read(path, &got, &got_len, &err), 0, "%s", err.message);
    cr_assert(got_len == want_len && !memcmp(got, want, want_len), "the agent's copy is the model");
    free(want);
    free(got);
    free(first);
    free(second);
    free(control);
    e2e_pass();
}

Test(e2e_artifacts, kiln_delete_removes_an_ended_job_and_its_files_and_refuses_a_running_one, .init = e2e_setup,
     .fini = e2e_teardown, .timeout = 300)
{
    char *spec = spec_with("long", 100000, NULL);
    json_t *job = e2e_submit(spec);
    free(spec);
    char *id = strdup(e2e_jstr(job, "id"));
    json_decref(job);
    pid_t ranks[E2E_MAX_RANKS];
    int nr = 0;
    json_decref(e2e_freeze_at_step(id, 2, 60000, ranks, &nr));
    char *out = NULL, *err = NULL;
    cr_assert_eq(e2e_kiln(&out, &err, "delete", id, NULL), 5, "wrong state: %s", out);
    cr_assert(strstr(err, "RUNNING") && strstr(err, "kiln stop"), "%s", err);
    free(out);
    free(err);
    e2e_thaw(ranks, nr);
    cr_assert_eq(e2e_kiln(&out, &err, "stop", id, NULL), 0, "%s", err);
    free(out);
    free(err);
    json_decref(e2e_wait_state(id, "STOPPED", 120000));
    cr_assert_eq(e2e_kiln(&out, &err, "delete", id, NULL), 0, "%s", err);
    cr_assert(strstr(out, "deleted"), "%s", out);
    free(out);
    free(err);
    /* a completed job, with its model in the store: deleting takes the files too */
    spec = spec_with("short", 10, NULL);
    char *done = run_to_end(spec, "COMPLETED");
    free(spec);
    char store[PATH_MAX];
    struct stat sb;
    snprintf(store, sizeof store, "%s/artifacts/jobs/%s/1/model_llmc.bin", e2e_cl->dir, done);
    cr_assert_eq(stat(store, &sb), 0, "the model is in the store: %s", store);
    cr_assert_eq(e2e_kiln(&out, &err, "delete", done, NULL), 0, "%s", err);
    cr_assert(strstr(out, "1 artifact") || strstr(out, "2 artifact"), "%s", out);
    free(out);
    free(err);
    snprintf(store, sizeof store, "%s/artifacts/jobs/%s", e2e_cl->dir, done);
    cr_assert(stat(store, &sb) != 0, "the job's files left the store");
    free(done);
    char path[200];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    long st;
    json_decref(e2e_http("GET", path, NULL, NULL, &st));
    cr_assert_eq(st, 404);
    snprintf(path, sizeof path, "/v1/jobs/%s/logs", id);
    json_decref(e2e_http("GET", path, NULL, NULL, &st));
    cr_assert_eq(st, 404);
    free(id);
    e2e_pass();
}
