/* checkpoint.c - a job's checkpoint directory kept in kilnd's artifact store while it runs (a job
 * with no checkpoint.path, whose checkpoints live in its agent's work dir), so that its next
 * attempt finds it restored on whichever agent it lands. The agent holding rank 0 sends the
 * directory's manifest (BeginArtifacts, kind CHECKPOINT) and the contents kilnd lacks
 * (PutArtifactChunk); the manifest becomes the job's synced state, all files at once, only when
 * every content it names is whole. Bytes live once per content and job:
 *
 *   DIR/jobs/<job>/checkpoints/<sha256>              a whole content, its SHA-256 checked
 *   DIR/jobs/<job>/checkpoints/.<sha256>.partial     what has arrived of one (fsynced, recorded)
 *
 * It is not the upload of a job's artifacts (artifact.c), whose helpers for the store's files
 * it shares. */
#include "service/svc_int.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void ckpt_dir(const svc_t *s, const char *job_id, char *out, size_t n)
{
    snprintf(out, n, "%s/jobs/%s/checkpoints", s->artifact_dir, job_id);
}

static void ckpt_final(const svc_t *s, const char *job_id, const char *sha, char *out, size_t n)
{
    snprintf(out, n, "%s/jobs/%s/checkpoints/%s", s->artifact_dir, job_id, sha);
}

static void ckpt_partial(const svc_t *s, const char *job_id, const char *sha, char *out, size_t n)
{
    snprintf(out, n, "%s/jobs/%s/checkpoints/.%s.partial", s->artifact_dir, job_id, sha);
}

/* KILN_EINVAL when the job checkpoints to checkpoint.path (shared storage its agents all see):
 * only a checkpoint directory in an agent's work dir is synced. */
static int synced_kind_of_job(store_conn_t *c, const char *job_id, kiln_err_t *err)
{
    json_t *job = NULL;
    int rc = store_job_get_json(c, job_id, &job, err);
    if (rc)
        return rc;
    const char *path = json_string_value(json_object_get(json_object_get(json_object_get(job, "spec"), "checkpoint"),
                                                         "path"));
    if (path && *path) {
        rc = kiln_err_set(err, KILN_EINVAL, "kind", "job %s checkpoints to checkpoint.path, which its agents share; "
                          "kilnd syncs only a checkpoint directory in an agent's work dir", job_id);
        kiln_err_hint(err, "sync checkpoints only for an assignment whose checkpoint_dir is \"\"");
    }
    json_decref(job);
    return rc;
}

/* Removes the bytes of contents pruned from the job (those of this store). */
static void unlink_blobs(svc_t *s, const char *job_id, const store_ckpt_blob_t *b, int n)
{
    for (int i = 0; i < n; i++) {
        if (strcmp(b[i].store_id, s->store_id) != 0 || !kiln_sha256_hex_ok(b[i].sha256))
            continue;
        char path[PATH_MAX];
        ckpt_final(s, job_id, b[i].sha256, path, sizeof(path));
        unlink(path);
        ckpt_partial(s, job_id, b[i].sha256, path, sizeof(path));
        unlink(path);
    }
}

int svc_agent_checkpoint_begin(svc_t *s, const char *wid, const Kiln__ArtifactManifest *m, arena_t *arena,
                               Kiln__ArtifactManifestReply *out, kiln_err_t *err)
{
    svc_tx_t tx;
    store_job_row_t job;
    store_ckpt_file_t *files = NULL;
    store_ckpt_blob_t *pruned = NULL;
    int npruned = 0;
    bool committed = false;
    store_conn_t *c = NULL;
    int rc = store_conn_get(s->store, &c, err);
    if (rc)
        return rc;
    rc = synced_kind_of_job(c, m->job_id, err);
    store_conn_put(s->store, c);
    if (rc)
        return rc;
    char empty_sha[KILN_SHA256_HEX];
    kiln_sha256_hex("", 0, empty_sha);
    for (size_t i = 0; i < m->n_files; i++)
        if (m->files[i]->size == 0 && strcmp(m->files[i]->sha256, empty_sha) != 0)
            return kiln_err_set(err, KILN_ECHECKSUM, "sha256", "checkpoint file \"%s\" is empty, but its SHA-256 is "
                                "not that of no bytes", m->files[i]->name);
    files = calloc(KILN_MAX(m->n_files, 1), sizeof(*files));
    if (!files)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    for (size_t i = 0; i < m->n_files; i++) {
        kiln_strlcpy(files[i].name, m->files[i]->name, sizeof(files[i].name));
        kiln_strlcpy(files[i].sha256, m->files[i]->sha256, sizeof(files[i].sha256));
        files[i].size = m->files[i]->size;
    }
    rc = svc_tx_begin(s, &tx, err);
    if (rc) {
        free(files);
        return rc;
    }
    /* The job's row lock orders this job's syncs; an attempt that is no longer the job's latest
     * (its agent came back after the job moved on) never replaces what a later one synced. */
    rc = store_job_row(tx.c, m->job_id, true, &job, err);
    if (rc == 0 && job.attempt != m->attempt)
        rc = kiln_err_set(err, KILN_ESTATE, "attempt", "attempt %d of job %s is not its latest (%d); its checkpoints "
                          "are not synced", m->attempt, job.id, job.attempt);
    if (rc == 0)
        rc = store_ckpt_pending_set(tx.c, job.id, m->attempt, wid, files, (int)m->n_files, s->store_id, err);
    if (rc)
        goto fail;
    out->files = arena_alloc(arena, sizeof(*out->files) * KILN_MAX(m->n_files, 1));
    bool all = true;
    for (size_t i = 0; i < m->n_files; i++) {
        store_ckpt_blob_t b;
        rc = store_ckpt_blob_get(tx.c, job.id, files[i].sha256, true, &b, err);
        if (rc)
            goto fail;
        if (b.size != files[i].size) {
            rc = kiln_err_set(err, KILN_EINVAL, "size", "checkpoint file \"%s\" has %lld bytes, but the content with "
                              "its SHA-256 has %lld", files[i].name, (long long)files[i].size, (long long)b.size);
            goto fail;
        }
        int64_t offset = b.complete ? b.size : 0;
        if (!b.complete) {
            char partial[PATH_MAX];
            ckpt_partial(s, job.id, b.sha256, partial, sizeof(partial));
            /* begun in another store: from the start, in this one */
            offset = !strcmp(b.store_id, s->store_id) ? svc_store_durable(partial, b.received) : 0;
            if (offset != b.received || strcmp(b.store_id, s->store_id) != 0)
                rc = store_ckpt_blob_progress(tx.c, job.id, b.sha256, offset, false, s->store_id, err);
            if (rc)
                goto fail;
            all = false;
        }
        Kiln__ArtifactOffset *o = arena_alloc(arena, sizeof(*o));
        kiln__artifact_offset__init(o);
        o->name = svc_astr(arena, files[i].name);
        o->offset = offset;
        o->complete = b.complete;
        out->files[out->n_files++] = o;
    }
    if (all) {
        rc = store_ckpt_commit(tx.c, job.id, err);
        if (rc == 0)
            rc = store_ckpt_blobs_prune(tx.c, job.id, &pruned, &npruned, err);
        if (rc)
            goto fail;
        committed = true;
    }
    rc = svc_tx_commit(&tx, err);
    if (rc)
        goto out;
    unlink_blobs(s, job.id, pruned, npruned);
    out->max_chunk_bytes = SVC_ARTIFACT_CHUNK_MAX;
    out->committed = committed;
    if (committed)
        log_info("job %s: checkpoint directory of attempt %d synced (%zu file(s))", job.id, m->attempt, m->n_files);
    goto out;
fail:
    svc_tx_abort(&tx);
out:
    free(files);
    free(pruned);
    return rc;
}

int svc_agent_checkpoint_chunk(svc_t *s, const char *wid, const Kiln__ArtifactChunk *ch, Kiln__ArtifactChunkReply *out,
                               kiln_err_t *err)
{
    (void)wid;
    svc_tx_t tx;
    store_ckpt_file_t f;
    store_ckpt_blob_t b;
    int rc = svc_tx_begin(s, &tx, err);
    if (rc)
        return rc;
    rc = store_ckpt_file_get(tx.c, ch->job_id, ch->name, false, &f, err);
    if (rc == KILN_ENOTFOUND)
        kiln_err_hint(err, "announce the checkpoint directory first (BeginArtifacts with kind CHECKPOINT)");
    if (rc == 0 && f.attempt != ch->attempt)
        rc = kiln_err_set(err, KILN_ESTATE, "attempt", "checkpoint file \"%s\" is being synced by attempt %d, not %d",
                          f.name, f.attempt, ch->attempt);
    /* The content's row lock orders every write to its bytes, whichever kilnd takes the chunk. */
    if (rc == 0)
        rc = store_ckpt_blob_get(tx.c, ch->job_id, f.sha256, true, &b, err);
    if (rc)
        goto fail;
    if (b.complete) {
        out->offset = b.size;
        out->complete = true;
        svc_tx_abort(&tx);
        return 0;
    }
    char dir[PATH_MAX], partial[PATH_MAX], final[PATH_MAX];
    ckpt_dir(s, ch->job_id, dir, sizeof(dir));
    ckpt_partial(s, ch->job_id, b.sha256, partial, sizeof(partial));
    ckpt_final(s, ch->job_id, b.sha256, final, sizeof(final));
    svc_store_target_t t = {.dir = dir, .partial = partial, .final = final, .job_id = ch->job_id,
                            .what = "checkpoint file", .name = f.name, .store_id = b.store_id, .size = b.size,
                            .received = b.received, .sha256 = b.sha256};
    int64_t received = 0;
    bool complete = false;
    rc = svc_store_chunk(s, &t, ch->offset, ch->data.data, ch->data.len, &received, &complete, err);
    if (rc == KILN_ECHECKSUM) {
        /* the bytes are gone: record that, so the next try starts at 0 */
        kiln_err_t e2;
        if (store_ckpt_blob_progress(tx.c, ch->job_id, b.sha256, 0, false, s->store_id, &e2) == 0 &&
            svc_tx_commit(&tx, &e2) == 0)
            return rc;
        goto fail;
    }
    if (rc)
        goto fail;
    rc = store_ckpt_blob_progress(tx.c, ch->job_id, b.sha256, received, complete, s->store_id, err);
    if (rc)
        goto fail;
    rc = svc_tx_commit(&tx, err);
    if (rc)
        return rc;
    out->offset = received;
    out->complete = complete;
    return 0;
fail:
    svc_tx_abort(&tx);
    return rc;
}

int svc_agent_checkpoint_fetch(svc_t *s, const char *worker_id, const Kiln__CheckpointRequest *req, arena_t *arena,
                               Kiln__CheckpointChunk *out, kiln_err_t *err)
{
    store_conn_t *c = NULL;
    json_t *job = NULL;
    int fd = -1;
    int rc = svc_check_str("name", req->name, 0, err);
    if (rc == 0 && !kiln_artifact_path_ok(req->name, "name", err))
        rc = KILN_EINVAL;
    if (rc == 0 && !s->store_id[0])
        rc = svc_artifact_no_store(err);
    /* only a file of the assigned job's own synced state */
    if (rc == 0)
        rc = svc_agent_fetch_begin(s, worker_id, req->worker_id, req->job_id, req->attempt, req->offset,
                                   req->max_bytes, &c, &job, err);
    if (rc)
        return rc;
    store_ckpt_file_t f;
    store_ckpt_blob_t b;
    rc = store_ckpt_file_get(c, req->job_id, req->name, true, &f, err);
    if (rc == 0)
        rc = store_ckpt_blob_get(c, req->job_id, f.sha256, false, &b, err);
    if (rc == 0 && !b.complete)
        rc = kiln_err_set(err, KILN_EINTERNAL, NULL, "checkpoint file \"%s\" of job %s is synced but its content is "
                          "not whole", f.name, req->job_id);
    char path[PATH_MAX], what[KILN_ARTIFACT_PATH_MAX + 96];
    ckpt_final(s, req->job_id, f.sha256, path, sizeof(path));
    snprintf(what, sizeof(what), "checkpoint file \"%s\" of job %s", f.name, req->job_id);
    if (rc == 0)
        rc = svc_store_open(s, path, b.store_id, b.size, what, &fd, err);
    if (rc == 0)
        rc = svc_read_piece(fd, b.size, req->offset, req->max_bytes, what, arena, &out->data.data, &out->data.len,
                            err);
    if (rc == 0) {
        out->name = svc_astr(arena, f.name);
        out->size = b.size;
        out->sha256 = svc_astr(arena, b.sha256);
        out->offset = req->offset;
    }
    if (fd >= 0)
        close(fd);
    json_decref(job);
    store_conn_put(s->store, c);
    return rc;
}

void svc_assignment_checkpoints(svc_t *s, const char *job_id, arena_t *arena, Kiln__Assignment *msg)
{
    store_conn_t *c = NULL;
    store_ckpt_file_t *files = NULL;
    int n = 0;
    kiln_err_t err;
    if (store_conn_get(s->store, &c, &err) == 0) {
        if (store_ckpt_files(c, job_id, true, &files, &n, &err) != 0)
            log_warn("job %s: could not read its synced checkpoint directory; the attempt starts without it: %s",
                     job_id, err.message);
        store_conn_put(s->store, c);
    }
    msg->checkpoint_files = arena_alloc(arena, sizeof(*msg->checkpoint_files) * (size_t)KILN_MAX(n, 1));
    for (int i = 0; i < n; i++) {
        Kiln__ArtifactFile *f = arena_alloc(arena, sizeof(*f));
        kiln__artifact_file__init(f);
        f->name = svc_astr(arena, files[i].name);
        f->size = files[i].size;
        f->sha256 = svc_astr(arena, files[i].sha256);
        msg->checkpoint_files[msg->n_checkpoint_files++] = f;
        msg->checkpoint_attempt = KILN_MAX(msg->checkpoint_attempt, files[i].attempt);
    }
    free(files);
}

int svc_job_checkpoints(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    JOB_RESOLVE(s, who, id, err);
    store_conn_t *c = NULL;
    store_ckpt_file_t *files = NULL;
    int n = 0;
    int rc = svc_job_view_conn(s, who, id, &c, err);
    if (rc)
        return rc;
    rc = store_ckpt_files(c, id, true, &files, &n, err);
    store_conn_put(s->store, c);
    if (rc)
        return rc;
    json_t *arr = json_array();
    int64_t synced_us = 0;
    int attempt = 0;
    for (int i = 0; i < n; i++) {
        json_array_append_new(arr, json_pack("{s:s, s:I, s:s, s:i, s:s}", "name", files[i].name, "size",
                                             (json_int_t)files[i].size, "sha256", files[i].sha256, "attempt",
                                             files[i].attempt, "worker_id", files[i].worker_id));
        synced_us = KILN_MAX(synced_us, files[i].synced_us);
        attempt = KILN_MAX(attempt, files[i].attempt);
    }
    free(files);
    char t[40] = "";
    if (synced_us)
        kiln_time_format(synced_us, t, sizeof(t));
    *out = json_pack("{s:o, s:s, s:i}", "files", arr, "synced_at", t, "attempt", attempt);
    return 0;
}
