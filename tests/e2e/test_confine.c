/* test_confine.c - what a job may touch on an agent, through a real kilnd and real agents (TLS,
 * tokens, --data-root): paths outside every data root are refused at submission, paths that leave
 * a root through a symbolic link (which kilnd cannot see) are refused by the agent when it
 * launches, with the reason on the job, and no byte of the file reaches a reply, a reason, an
 * event, a log line or a server log; another project's checkpoints in a shared data root are out
 * of reach the same two ways. */
#include "tests/e2e/e2e.h"
#include "base/base.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/common/harness.h"

static char secret_path[128], secret_text[64], outside_dir[128];

/* A 0600 file outside every data root, holding a string that must never come back. */
static void make_secret(void)
{
    snprintf(secret_path, sizeof secret_path, "/tmp/kiln-secret.XXXXXX");
    int fd = mkstemp(secret_path);
    cr_assert_geq(fd, 0);
    snprintf(secret_text, sizeof secret_text, "KILNSECRET%08x%08x", (unsigned)rand(), (unsigned)getpid());
    char body[256];
    int n = snprintf(body, sizeof body, "root:%s:0:0::/root:/bin/bash\n%s\n", secret_text, secret_text);
    cr_assert_eq(write(fd, body, (size_t)n), n);
    fchmod(fd, 0600);
    close(fd);
    snprintf(outside_dir, sizeof outside_dir, "/tmp/kiln-outside.XXXXXX");
    cr_assert_not_null(mkdtemp(outside_dir));
}

static void remove_secret(void)
{
    unlink(secret_path);
    if (!th_rm_tree(outside_dir))
        fprintf(stderr, "could not remove %s\n", outside_dir);
}

static const char *shared_root(void)
{
    static char p[256];
    snprintf(p, sizeof p, "%.200s/shared-checkpoints", e2e_cl->dir);
    return p;
}

/* A tiny job reading train, optionally checkpointing into ckpt, in project (NULL: the default
 * one). Caller frees. */
static char *spec_in(const char *name, const char *train, const char *ckpt, const char *project)
{
    char *text = e2e_spec(name, 20, 1, 1, 4);
    json_t *j = json_loads(text, 0, NULL);
    free(text);
    if (train)
        json_object_set_new(json_object_get(j, "data"), "train", json_string(train));
    if (ckpt)
        json_object_set_new(j, "checkpoint", json_pack("{s:i, s:s}", "every_steps", 5, "path", ckpt));
    if (project)
        json_object_set_new(j, "project", json_string(project));
    text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return text;
}

static char *spec_with(const char *name, const char *train, const char *ckpt)
{
    return spec_in(name, train, ckpt, NULL);
}

/* Submits spec (as the admin) and waits until the job COMPLETED; its id into id (64 bytes). */
static void submit_completes(const char *spec, char *id)
{
    json_t *job = e2e_submit(spec);
    snprintf(id, 64, "%s", e2e_jstr(job, "id"));
    json_decref(job);
    job = e2e_wait_state(id, TH_JOB_ENDED, 120000);
    cr_assert_str_eq(e2e_jstr(job, "state"), "COMPLETED", "%s", e2e_jstr(job, "reason"));
    json_decref(job);
}

static void assert_no_secret(const char *where, const char *text)
{
    cr_assert_null(strstr(text ? text : "", secret_text), "the file's contents appear in %s: %s", where, text);
}

/* POSTs the spec; expects a 400 naming field. */
static void refused_at_submission(const char *what, const char *spec, const char *field)
{
    long st = 0;
    json_t *r = e2e_http("POST", "/v1/jobs", spec, NULL, &st);
    char *text = json_dumps(r, 0);
    cr_assert_eq(st, 400, "%s: want 400, got %ld: %s", what, st, text);
    cr_assert_str_eq(e2e_jstr(r, "field"), field, "%s: %s", what, text);
    cr_assert(strstr(e2e_jstr(r, "detail"), "allowed roots"), "%s: the error names the roots: %s", what, text);
    assert_no_secret(what, text);
    free(text);
    json_decref(r);
}

/* Submits, waits for FAILED; the reason names field; nothing of the secret anywhere. */
static void refused_at_launch(const char *what, const char *spec, const char *field)
{
    json_t *job = e2e_submit(spec);
    char id[64];
    snprintf(id, sizeof id, "%s", e2e_jstr(job, "id"));
    json_decref(job);
    job = e2e_wait_state(id, TH_JOB_ENDED, 60000);
    cr_assert_str_eq(e2e_jstr(job, "state"), "FAILED", "%s: %s", what, e2e_jstr(job, "reason"));
    const char *reason = e2e_jstr(job, "reason");
    cr_assert(strstr(reason, field) && strstr(reason, "not inside an allowed directory"),
              "%s: the reason says which field and why: %s",
              what, reason);
    assert_no_secret("the job's reason", reason);
    char path[160];
    snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
    json_t *ev = e2e_get(path);
    char *text = json_dumps(ev, 0);
    assert_no_secret("the events", text);
    free(text);
    json_decref(ev);
    snprintf(path, sizeof path, "/v1/jobs/%s/logs", id);
    json_t *logs = e2e_get(path);
    cr_assert_eq(json_array_size(json_object_get(logs, "lines")), 0, "%s: no rank ever ran", what);
    json_decref(logs);
    json_decref(job);
}

Test(e2e_confine, a_job_reads_and_writes_only_inside_the_data_roots, .init = e2e_setup, .fini = e2e_teardown,
     .timeout = 240)
{
    make_secret();
    char path[PATH_MAX], *spec;

    /* outside every root: kilnd refuses, whether the file exists or not, the same way */
    spec = spec_with("shadow", "/etc/shadow", NULL);
    refused_at_submission("/etc/shadow", spec, "data.train");
    free(spec);
    spec = spec_with("secret", secret_path, NULL);
    refused_at_submission("a root-only file", spec, "data.train");
    free(spec);
    snprintf(path, sizeof path, "%s/data/../../../../../../../..%s", e2e_root(), secret_path);
    spec = spec_with("dotdot", path, NULL);
    refused_at_submission("a ../ escape", spec, "data.train");
    free(spec);
    snprintf(path, sizeof path, "%s/../../../../../../../var/tmp/x", shared_root());
    spec = spec_with("ckpt-dotdot", NULL, path);
    refused_at_submission("a checkpoint.path ../ escape", spec, "checkpoint.path");
    free(spec);

    /* inside a root by name, outside by a symbolic link: the agent refuses when it launches */
    char link[PATH_MAX];
    snprintf(link, sizeof link, "%s/leak.txt", shared_root());
    cr_assert_eq(symlink(secret_path, link), 0);
    spec = spec_with("symlink", link, NULL);
    refused_at_launch("a symlink out of the root", spec, "data.train");
    free(spec);
    snprintf(link, sizeof link, "%s/ckpt-link", shared_root());
    cr_assert_eq(symlink(outside_dir, link), 0);
    spec = spec_with("ckpt-symlink", NULL, link);
    refused_at_launch("a checkpoint.path symlink out of the root", spec, "checkpoint.path");
    free(spec);
    cr_assert_eq(e2e_count_files(outside_dir), 0, "nothing was written outside the roots");
    struct stat st;
    cr_assert_eq(stat(outside_dir, &st), 0);

    /* no server log holds the file's contents either */
    static const char *const logs[] = {"kilnd.log", "agent0.log", "agent1.log"};
    for (size_t i = 0; i < sizeof logs / sizeof logs[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", e2e_cl->dir, logs[i]);
        char *text = e2e_slurp(path);
        assert_no_secret(logs[i], text);
        free(text);
    }
    remove_secret();
    e2e_pass();
}

Test(e2e_confine, a_job_inside_the_roots_trains, .init = e2e_setup, .fini = e2e_teardown, .timeout = 240)
{
    /* the same cluster runs what its roots allow: a data file, a checkpoint directory */
    char ckpt[PATH_MAX];
    snprintf(ckpt, sizeof ckpt, "%s/ok", shared_root());
    char *spec = spec_with("inside", NULL, ckpt), id[64];
    submit_completes(spec, id);
    free(spec);
    char dir[PATH_MAX + 128];
    snprintf(dir, sizeof dir, "%s/" KILN_AREA_DIR "/default/%s", ckpt, id);
    cr_assert_gt(e2e_count_files(dir), 0, "checkpoints went to %s", dir);
    e2e_pass();
}

/* An HTTP call that must answer want; returns the reply (caller owns). */
static json_t *call_ok(const char *method, const char *path, const char *body, const char *header, long want)
{
    long st = 0;
    json_t *r = e2e_http(method, path, body, header, &st);
    cr_assert_eq(st, want, "%s %s: want %ld, got %ld: %s", method, path, want, st, e2e_dump(r));
    return r;
}

/* Project boundaries on disk: project A's job checkpoints into a data root (checkpoint.path
 * inside one); bob, an editor of project B only, names A's checkpoint file in his job's spec by
 * its path (refused at submission, 403, the same whether the file exists or not) and through a
 * symbolic link in the data root that kilnd cannot see (refused by the agent before any rank
 * reads it: the job fails with a reason saying why, no rank ran, no artifact came back). */
Test(e2e_confine, another_projects_checkpoints_are_out_of_reach, .init = e2e_setup, .fini = e2e_teardown,
     .timeout = 240)
{
    json_decref(call_ok("POST", "/v1/projects", "{\"name\": \"proj-a\"}", NULL, 201));
    json_decref(call_ok("POST", "/v1/projects", "{\"name\": \"proj-b\"}", NULL, 201));
    json_decref(call_ok("POST", "/v1/users", "{\"name\": \"bob\"}", NULL, 201));
    json_decref(call_ok("PUT", "/v1/projects/proj-b/members/bob", "{\"role\": \"editor\"}", NULL, 200));
    json_t *tok = call_ok("POST", "/v1/users/bob/tokens", "{}", NULL, 201);
    char bob[300];
    snprintf(bob, sizeof bob, "Authorization: Bearer %s", e2e_jstr(tok, "token"));
    json_decref(tok);

    /* project A's job checkpoints into its area of the shared root */
    char ckpt[PATH_MAX];
    snprintf(ckpt, sizeof ckpt, "%s/ck", shared_root());
    char *text = spec_in("a-trains", NULL, ckpt, "proj-a"), a_id[64];
    submit_completes(text, a_id);
    free(text);
    char a_file[PATH_MAX + 128], missing[PATH_MAX + 128], flat[PATH_MAX + 64];
    snprintf(a_file, sizeof a_file, "%s/" KILN_AREA_DIR "/proj-a/%s/ckpt_00000020.bin", ckpt, a_id);
    snprintf(missing, sizeof missing, "%s/" KILN_AREA_DIR "/proj-a/%s/ckpt_00000099.bin", ckpt, a_id);
    snprintf(flat, sizeof flat, "%s/%s", ckpt, a_id);
    cr_assert_eq(access(a_file, R_OK), 0, "project A's checkpoint is in its area: %s", a_file);
    cr_assert_neq(access(flat, F_OK), 0, "nothing at the old place %s", flat);

    /* bob's job names it by its path, as data.train or data.val, or a file that is not there */
    const struct { const char *field, *path; } named[] = {
        {"data.train", a_file}, {"data.val", a_file}, {"data.train", missing}};
    char first[600] = "";
    for (size_t i = 0; i < KILN_ARRAY_LEN(named); i++) {
        text = spec_in("b-reads", NULL, NULL, "proj-b");
        json_t *spec = json_loads(text, 0, NULL);
        free(text);
        json_object_set_new(json_object_get(spec, "data"), named[i].field + 5, json_string(named[i].path));
        json_object_set_new(json_object_get(spec, "data"), "format", json_string("text"));
        text = json_dumps(spec, JSON_COMPACT);
        json_decref(spec);
        json_t *r = call_ok("POST", "/v1/jobs", text, bob, 403);
        free(text);
        cr_assert_str_eq(e2e_jstr(r, "field"), named[i].field, "%s", e2e_dump(r));
        cr_assert(strstr(e2e_jstr(r, "message"), "another project"), "%s", e2e_dump(r));
        char msg[600];
        snprintf(msg, sizeof msg, "%s", e2e_jstr(r, "message"));
        char *hit = strstr(msg, named[i].path);
        cr_assert_not_null(hit, "%s", msg);
        memmove(hit, hit + strlen(named[i].path), strlen(hit + strlen(named[i].path)) + 1);
        if (i == 0)
            snprintf(first, sizeof first, "%s", msg);
        if (!strcmp(named[i].field, "data.train"))
            cr_assert_str_eq(msg, first, "a missing file and a present one answer alike");
        json_decref(r);
    }
    json_t *jobs = call_ok("GET", "/v1/jobs", NULL, bob, 200);
    cr_assert_eq(json_array_size(json_object_get(jobs, "jobs")), 0, "bob's refused jobs do not exist");
    json_decref(jobs);

    /* through a symbolic link someone made inside the data root: kilnd cannot see where it
     * leads, the agent refuses before any rank opens it */
    char link[PATH_MAX];
    snprintf(link, sizeof link, "%s/innocent.txt", shared_root());
    cr_assert_eq(symlink(a_file, link), 0);
    text = spec_in("b-links", link, NULL, "proj-b");
    json_t *job = call_ok("POST", "/v1/jobs", text, bob, 201);
    free(text);
    char b_id[64], path[200];
    snprintf(b_id, sizeof b_id, "%s", e2e_jstr(job, "id"));
    json_decref(job);
    job = e2e_wait_state(b_id, TH_JOB_ENDED, 60000);
    cr_assert_str_eq(e2e_jstr(job, "state"), "FAILED", "bob's job read project A's checkpoint: %s", e2e_dump(job));
    const char *reason = e2e_jstr(job, "reason");
    cr_assert(strstr(reason, "data.train") && strstr(reason, "another project"), "%s", reason);
    cr_assert_null(strstr(reason, "proj-a"), "where the link leads is not told: %s", reason);
    json_decref(job);
    snprintf(path, sizeof path, "/v1/jobs/%s/logs", b_id);
    json_t *logs = call_ok("GET", path, NULL, bob, 200);
    cr_assert_eq(json_array_size(json_object_get(logs, "lines")), 0, "no rank ran: %s", e2e_dump(logs));
    json_decref(logs);
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts", b_id);
    json_t *arts = call_ok("GET", path, NULL, bob, 200);
    cr_assert_eq(json_array_size(json_object_get(arts, "artifacts")), 0, "%s", e2e_dump(arts));
    json_decref(arts);
    e2e_pass();
}
