/* test_checkpoints.c - a job's synced checkpoint directory through the real service, REST server
 * and database, fed as an agent feeds it (BeginArtifacts and PutArtifactChunk of kind
 * CHECKPOINT, FetchCheckpoint): a state becomes the job's all at once and only when whole, files
 * kept and dropped with it, contents stored once, the per-job bound, an attempt that is no longer
 * the latest, and the listing over REST. Checksums are checked against sha256sum. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/api/api_test.h"

TestSuite(checkpoints, .init = at_setup, .fini = at_teardown, .timeout = 120);

/* GET /v1/jobs/{id}/checkpoints; the names joined by ',' into names (room for 256). */
static json_t *listing(const char *job, char *names)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints", job);
    long st = 0;
    json_t *l = at_req("GET", path, NULL, NULL, &st, NULL);
    cr_assert_eq(st, 200, "GET %s: %ld", path, st);
    names[0] = '\0';
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(l, "files"), i, f) {
        size_t n = strlen(names);
        snprintf(names + n, 256 - n, "%s%s", n ? "," : "", json_string_value(json_object_get(f, "name")));
    }
    return l;
}

/* FetchCheckpoint of name, from offset 0: the status and the bytes (caller frees). */
static int ck_fetch(const char *job, int attempt, const char *name, char **text, kiln_err_t *err)
{
    Kiln__CheckpointRequest req = KILN__CHECKPOINT_REQUEST__INIT;
    req.worker_id = at_worker;
    req.job_id = (char *)job;
    req.attempt = attempt;
    req.name = (char *)name;
    Kiln__CheckpointChunk out = KILN__CHECKPOINT_CHUNK__INIT;
    arena_t a;
    arena_init(&a, 0);
    kiln_err_clear(err);
    int rc = svc_agent_checkpoint_fetch(at_svc, at_worker, &req, &a, &out, err);
    *text = rc == 0 ? strndup((const char *)out.data.data, out.data.len) : NULL;
    arena_deinit(&a);
    return rc;
}

Test(checkpoints, a_state_becomes_the_job_s_whole_or_not_at_all)
{
    char *job = at_create_job("ckpt", NULL, NULL);
    int attempt = at_run_job(job);
    kiln_err_t err;
    char names[256];
    bool committed = true;
    int64_t off[3];
    const at_ck_file_t s1[] = {{"ckpt-0005.pt", "weights at step 5"}, {"opt-0005.pt", "optimizer at step 5"},
                               {"zz-empty", ""}};

    /* nothing synced yet */
    json_t *l = listing(job, names);
    cr_assert_str_eq(names, "");
    cr_assert_str_eq(json_string_value(json_object_get(l, "synced_at")), "");
    json_decref(l);

    /* announced, one file sent: not the job's state yet */
    cr_assert_eq(at_ck_begin(job, attempt, s1, 3, &committed, off, &err), 0, "%s", err.message);
    cr_assert(!committed);
    cr_assert(off[0] == 0 && off[1] == 0 && off[2] == 0, "an empty file is whole as soon as it is named");
    cr_assert_eq(at_ck_send(job, attempt, &s1[0], &err), 0, "%s", err.message);
    cr_assert_eq(at_ck_begin(job, attempt, s1, 3, &committed, off, &err), 0, "%s", err.message);
    cr_assert(!committed, "one file of two is whole");
    l = listing(job, names);
    cr_assert_str_eq(names, "", "a state is listed only once it is whole");
    json_decref(l);
    char *text = NULL;
    cr_assert_eq(ck_fetch(job, attempt, "ckpt-0005.pt", &text, &err), KILN_ENOTFOUND, "nor served");

    /* whole: the state is the job's */
    cr_assert_eq(at_ck_send(job, attempt, &s1[1], &err), 0, "%s", err.message);
    cr_assert_eq(at_ck_begin(job, attempt, s1, 3, &committed, off, &err), 0, "%s", err.message);
    cr_assert(committed);
    l = listing(job, names);
    cr_assert_str_eq(names, "ckpt-0005.pt,opt-0005.pt,zz-empty");
    char want[65];
    at_sha256sum(s1[0].text, strlen(s1[0].text), want);
    json_t *f0 = json_array_get(json_object_get(l, "files"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(f0, "sha256")), want);
    cr_assert_eq(json_integer_value(json_object_get(f0, "size")), (json_int_t)strlen(s1[0].text));
    cr_assert_eq(json_integer_value(json_object_get(l, "attempt")), attempt);
    cr_assert_str_neq(json_string_value(json_object_get(l, "synced_at")), "");
    json_decref(l);
    cr_assert_eq(ck_fetch(job, attempt, "ckpt-0005.pt", &text, &err), 0, "%s", err.message);
    cr_assert_str_eq(text, s1[0].text);
    free(text);

    /* the next state: one file kept as it was, one dropped, one new; until the new one is whole
     * the old state stays the job's */
    const at_ck_file_t s2[] = {{"ckpt-0005.pt", "weights at step 5"}, {"ckpt-0010.pt", "weights at step 10"}};
    cr_assert_eq(at_ck_begin(job, attempt, s2, 2, &committed, off, &err), 0, "%s", err.message);
    cr_assert(!committed);
    cr_assert_eq(off[0], (int64_t)strlen(s2[0].text), "a content kilnd holds is not sent again");
    cr_assert_eq(off[1], 0);
    l = listing(job, names);
    cr_assert_str_eq(names, "ckpt-0005.pt,opt-0005.pt,zz-empty");
    json_decref(l);
    cr_assert_eq(at_ck_send(job, attempt, &s2[1], &err), 0, "%s", err.message);
    cr_assert_eq(at_ck_begin(job, attempt, s2, 2, &committed, off, &err), 0, "%s", err.message);
    cr_assert(committed);
    l = listing(job, names);
    cr_assert_str_eq(names, "ckpt-0005.pt,ckpt-0010.pt", "the dropped files went with the state");
    json_decref(l);
    cr_assert_eq(ck_fetch(job, attempt, "opt-0005.pt", &text, &err), KILN_ENOTFOUND);
    cr_assert_eq(at_sql_int("SELECT count(*) FROM checkpoint_blobs"), 2, "the dropped content is gone");
    char path[512];
    at_sha256sum(s1[1].text, strlen(s1[1].text), want);
    snprintf(path, sizeof path, "%s/artifacts/jobs/%s/checkpoints/%s", at_dir_path(), job, want);
    cr_assert_neq(access(path, F_OK), 0, "its bytes too: %s", path);
    at_sha256sum(s2[1].text, strlen(s2[1].text), want);
    snprintf(path, sizeof path, "%s/artifacts/jobs/%s/checkpoints/%s", at_dir_path(), job, want);
    cr_assert_eq(access(path, F_OK), 0, "the new content is in the store: %s", path);

    /* an empty directory is a state too: every file dropped */
    cr_assert_eq(at_ck_begin(job, attempt, NULL, 0, &committed, NULL, &err), 0, "%s", err.message);
    cr_assert(committed);
    l = listing(job, names);
    cr_assert_str_eq(names, "");
    json_decref(l);
    free(job);
}

Test(checkpoints, refusals_say_why_and_leave_the_synced_state_alone)
{
    char *job = at_create_job("ckpt-refused", NULL, NULL);
    int attempt = at_run_job(job);
    kiln_err_t err;
    bool committed = false;
    char names[256];
    const at_ck_file_t s1[] = {{"state.json", "{\"step\": 20}"}};
    cr_assert_eq(at_ck_begin(job, attempt, s1, 1, &committed, NULL, &err), 0, "%s", err.message);
    cr_assert_eq(at_ck_send(job, attempt, &s1[0], &err), 0, "%s", err.message);
    cr_assert_eq(at_ck_begin(job, attempt, s1, 1, &committed, NULL, &err), 0, "%s", err.message);
    cr_assert(committed);

    /* past the per-job bound (10 GiB by default): refused before any byte, with the flag named */
    Kiln__ArtifactFile f = KILN__ARTIFACT_FILE__INIT, *fp = &f;
    char sha[KILN_SHA256_HEX];
    kiln_sha256_hex("x", 1, sha);
    f.name = "huge.pt";
    f.size = (int64_t)11 << 30;
    f.sha256 = sha;
    Kiln__ArtifactManifest m = KILN__ARTIFACT_MANIFEST__INIT;
    m.worker_id = at_worker;
    m.job_id = job;
    m.attempt = attempt;
    m.n_files = 1;
    m.files = &fp;
    m.kind = KILN__ARTIFACT_KIND__ARTIFACT_KIND_CHECKPOINT;
    Kiln__ArtifactManifestReply r = KILN__ARTIFACT_MANIFEST_REPLY__INIT;
    arena_t a;
    arena_init(&a, 0);
    cr_assert_eq(svc_agent_artifacts_begin(at_svc, at_worker, &m, &a, &r, &err), KILN_ETOOBIG);
    cr_assert(strstr(err.message, "checkpoint directory comes to more than"), "%s", err.message);
    cr_assert(strstr(err.hint, "--artifact-max-job-mb"), "%s", err.hint);
    /* a kind kiln does not know */
    m.kind = 7;
    f.size = 1;
    cr_assert_eq(svc_agent_artifacts_begin(at_svc, at_worker, &m, &a, &r, &err), KILN_EINVAL);
    cr_assert_str_eq(err.field, "kind");
    arena_deinit(&a);

    /* a chunk of a file no state being synced names */
    const at_ck_file_t stray = {"stray.pt", "bytes"};
    cr_assert_eq(at_ck_send(job, attempt, &stray, &err), KILN_ENOTFOUND);
    cr_assert(strstr(err.hint, "kind CHECKPOINT"), "%s", err.hint);

    /* an attempt that is no longer the job's latest (its agent came back after the job moved on)
     * replaces nothing */
    at_sql_int("UPDATE jobs SET attempt = attempt + 1 WHERE id = '%s'", job);
    const at_ck_file_t old[] = {{"state.json", "{\"step\": 5}"}};
    cr_assert_eq(at_ck_begin(job, attempt, old, 1, &committed, NULL, &err), KILN_ESTATE);
    cr_assert(strstr(err.message, "not its latest"), "%s", err.message);
    json_decref(listing(job, names));
    cr_assert_str_eq(names, "state.json");
    char *text = NULL;
    cr_assert_eq(ck_fetch(job, attempt, "state.json", &text, &err), 0, "%s", err.message);
    cr_assert_str_eq(text, s1[0].text, "the synced state is the latest attempt's");
    free(text);
    free(job);
}

/* A script's checkpoint directory is a tree (Hugging Face's checkpoint-500/...): its files are
 * named by relative paths, which are checked like artifact names, name by name; deleting the job
 * counts the bytes of its synced contents. */
Test(checkpoints, a_tree_is_synced_by_relative_paths_and_its_bytes_go_with_the_job)
{
    char *job = at_create_job("ckpt-tree", NULL, NULL);
    int attempt = at_run_job(job);
    kiln_err_t err;
    bool committed = false;
    char names[256];
    const at_ck_file_t s1[] = {{"checkpoint-500/model.pt", "weights at step 500"},
                               {"checkpoint-500/rng/state.bin", "rng"},
                               {"trainer_state.json", "{}"}};
    cr_assert_eq(at_ck_begin(job, attempt, s1, 3, &committed, NULL, &err), 0, "%s", err.message);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(at_ck_send(job, attempt, &s1[i], &err), 0, "%s", err.message);
    cr_assert_eq(at_ck_begin(job, attempt, s1, 3, &committed, NULL, &err), 0, "%s", err.message);
    cr_assert(committed);
    json_decref(listing(job, names));
    cr_assert_str_eq(names, "checkpoint-500/model.pt,checkpoint-500/rng/state.bin,trainer_state.json");
    char *text = NULL;
    cr_assert_eq(ck_fetch(job, attempt, "checkpoint-500/rng/state.bin", &text, &err), 0, "%s", err.message);
    cr_assert_str_eq(text, "rng");
    free(text);

    /* a path that leaves the tree or hides a name is refused, naming the field, and the synced
     * state stays */
    const char *bad[] = {"../escape.pt", "/etc/passwd", "a/../../b", "a//b", "a/", "./a", "a/.hidden"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const at_ck_file_t f[] = {{bad[i], "x"}};
        cr_assert_eq(at_ck_begin(job, attempt, f, 1, &committed, NULL, &err), KILN_EINVAL, "%s", bad[i]);
        cr_assert_str_eq(err.field, "files[0].name", "%s", bad[i]);
        cr_assert(err.hint[0], "%s", bad[i]);
        cr_assert_eq(ck_fetch(job, attempt, bad[i], &text, &err), KILN_EINVAL, "%s", bad[i]);
    }
    json_decref(listing(job, names));
    cr_assert_str_eq(names, "checkpoint-500/model.pt,checkpoint-500/rng/state.bin,trainer_state.json");

    /* deleting the job reports the bytes of its checkpoint contents, and they go */
    at_rank_exit(job, attempt, 0);
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s", job);
    long st;
    char *raw = NULL;
    json_t *j = at_req("DELETE", path, NULL, NULL, &st, &raw);
    cr_assert_eq(st, 200, "%s", raw);
    json_int_t want = (json_int_t)(strlen(s1[0].text) + strlen(s1[1].text) + strlen(s1[2].text));
    cr_assert_eq(json_integer_value(json_object_get(j, "artifact_bytes")), want, "%s", raw);
    json_decref(j);
    free(raw);
    cr_assert_eq(at_sql_int("SELECT count(*) FROM checkpoint_blobs"), 0);
    free(job);
}
