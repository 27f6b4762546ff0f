/* artifact.c - kilnd's artifact store: a directory (--artifact-dir) holding the files rank 0 of
 * each job left in its output directory, written by resumable uploads from agents and read by
 * downloads. The database says what exists (store/artifact.c); this file puts bytes on disk:
 *
 *   DIR/.kiln-store-id                       the store's id, recorded with every artifact
 *   DIR/jobs/<job>/<attempt>/.<name>.partial what has arrived (fsynced before it is recorded)
 *   DIR/jobs/<job>/<attempt>/<name>          the whole file, its SHA-256 checked, renamed here
 *
 * Several kilnd replicas may share one directory (shared storage): they have the same store id
 * and serve each other's files. A replica with a directory of its own is a different store: it
 * refuses to serve bytes it does not hold (KILN_EUNAVAIL naming the store that does), and an
 * upload that moves to it starts that file again in its own store. */
#include "service/svc_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "code/code.h"

#define STORE_ID_FILE ".kiln-store-id"

/* ---- the directory --------------------------------------------------------------------------- */

static bool store_id_ok(const char *s)
{
    size_t n = strlen(s);
    if (n < 8 || n > 60)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
            return false;
    return true;
}

int svc_artifacts_init(svc_t *s, kiln_err_t *err)
{
    const char *dir = s->cfg.artifact_dir;
    s->artifact_dir[0] = s->store_id[0] = '\0';
    if (!dir || !*dir) {
        log_info("artifacts: no --artifact-dir: this kilnd keeps no artifacts and refuses uploads");
        return 0;
    }
    int rc = kiln_mkdirs_mode(dir, 0700, err);
    if (rc)
        return kiln_err_set(err, rc, "artifact-dir", "could not create the artifact directory \"%s\"", dir);
    char real[PATH_MAX];
    if (!realpath(dir, real) || strlen(real) + 300 >= sizeof(s->artifact_dir))
        return kiln_err_set(err, KILN_EIO, "artifact-dir", "could not resolve the artifact directory \"%s\"", dir);
    kiln_strlcpy(s->artifact_dir, real, sizeof(s->artifact_dir));
    char path[PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/%s", real, STORE_ID_FILE);
    /* The first kilnd to use the directory names it; every other (a replica on the same shared
     * directory, or this one restarted) reads the name. */
    char id[64];
    uint8_t raw[16];
    if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw)) {
        uint64_t t = (uint64_t)kiln_now_us() ^ ((uint64_t)getpid() << 32);
        memcpy(raw, &t, sizeof(t));
        memcpy(raw + 8, &t, sizeof(t));
    }
    int n = snprintf(id, sizeof(id), "st-");
    for (size_t i = 0; i < sizeof(raw); i++)
        n += snprintf(id + n, sizeof(id) - (size_t)n, "%02x", raw[i]);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {
        char line[80];
        int len = snprintf(line, sizeof(line), "%s\n", id);
        bool ok = write(fd, line, (size_t)len) == len && fsync(fd) == 0;
        close(fd);
        int dfd = open(real, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
        if (!ok)
            return kiln_err_set(err, KILN_EIO, "artifact-dir", "could not write %s: %s", path, strerror(errno));
    } else if (errno != EEXIST) {
        return kiln_err_set(err, KILN_EIO, "artifact-dir", "could not create %s: %s", path, strerror(errno));
    }
    /* Read it back (another replica may have won the race to create it). */
    for (int tries = 0; tries < 50; tries++) {
        char *text = NULL;
        kiln_err_t e2;
        if (kiln_file_read(path, &text, NULL, &e2) == 0) {
            text[strcspn(text, "\r\n")] = '\0';
            bool ok = store_id_ok(text);
            if (ok)
                kiln_strlcpy(s->store_id, text, sizeof(s->store_id));
            free(text);
            if (ok)
                break;
        }
        usleep(20000); /* being written by whoever created it */
    }
    if (!s->store_id[0])
        return kiln_err_set(err, KILN_EIO, "artifact-dir", "%s does not hold an artifact store id", path);
    log_info("artifacts: store %s in %s", s->store_id, s->artifact_dir);
    return 0;
}

static void job_dir(const svc_t *s, const char *job_id, char *out, size_t n)
{
    snprintf(out, n, "%s/jobs/%s", s->artifact_dir, job_id);
}

static void attempt_dir(const svc_t *s, const char *job_id, int attempt, char *out, size_t n)
{
    snprintf(out, n, "%s/jobs/%s/%d", s->artifact_dir, job_id, attempt);
}

/* The file of a complete artifact, and where its bytes gather before that ('.' never starts a
 * name, so the two never meet). */
static void final_path(const svc_t *s, const char *job_id, int attempt, const char *name, char *out, size_t n)
{
    snprintf(out, n, "%s/jobs/%s/%d/%s", s->artifact_dir, job_id, attempt, name);
}

static void partial_path(const svc_t *s, const char *job_id, int attempt, const char *name, char *out, size_t n)
{
    snprintf(out, n, "%s/jobs/%s/%d/.%s.partial", s->artifact_dir, job_id, attempt, name);
}

void svc_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

/* Removes a directory tree of the store (symbolic links are removed, never followed). */
static void rm_tree(const char *path)
{
    if (code_tree_remove(path) != 0)
        log_warn("artifacts: could not remove %s completely: %s", path, strerror(errno));
}

int svc_artifact_sweep(svc_t *s, store_conn_t *c, int limit)
{
    if (!s->store_id[0])
        return 0;
    store_trash_t *t = NULL;
    int n = 0, done = 0;
    kiln_err_t err;
    if (store_artifact_trash_list(c, s->store_id, limit, &t, &n, &err) != 0) {
        log_warn("artifacts: could not read the trash: %s", err.message);
        return 0;
    }
    for (int i = 0; i < n; i++) {
        char path[PATH_MAX];
        if (!store_is_uuid(t[i].job_id))
            continue;
        if (t[i].attempt > 0)
            attempt_dir(s, t[i].job_id, t[i].attempt, path, sizeof(path));
        else
            job_dir(s, t[i].job_id, path, sizeof(path));
        rm_tree(path);
        if (store_artifact_trash_done(c, s->store_id, &t[i], &err) != 0) {
            log_warn("artifacts: could not clear a trash entry: %s", err.message);
            break;
        }
        done++;
    }
    free(t);
    return done;
}

/* ---- upload --------------------------------------------------------------------------------- */

int svc_artifact_no_store(kiln_err_t *err)
{
    kiln_err_set(err, KILN_EUNSUPP, NULL, "this kilnd keeps no artifacts: it runs without --artifact-dir");
    kiln_err_hint(err, "start kilnd with --artifact-dir DIR to keep jobs' output directories");
    return KILN_EUNSUPP;
}

/* The checks of a manifest that need no database. */
static int manifest_check(svc_t *s, const Kiln__ArtifactManifest *m, kiln_err_t *err)
{
    bool ckpt = m->kind == KILN__ARTIFACT_KIND__ARTIFACT_KIND_CHECKPOINT;
    if (m->kind != KILN__ARTIFACT_KIND__ARTIFACT_KIND_OUTPUT && !ckpt)
        return kiln_err_set(err, KILN_EINVAL, "kind", "kind must be ARTIFACT_KIND_OUTPUT or ARTIFACT_KIND_CHECKPOINT, "
                            "got %d", (int)m->kind);
    if (m->attempt < 1)
        return kiln_err_set(err, KILN_EINVAL, "attempt", "attempt must be 1 or more, got %d", m->attempt);
    if (m->n_files > SVC_ARTIFACT_MAX_FILES)
        return kiln_err_set(err, KILN_EINVAL, "files", "at most %d artifacts per job, got %zu", SVC_ARTIFACT_MAX_FILES,
                            m->n_files);
    int64_t max = s->cfg.artifact_max_job_bytes > 0 ? s->cfg.artifact_max_job_bytes : SVC_ARTIFACT_DEFAULT_MAX_JOB_BYTES;
    int64_t total = 0;
    for (size_t i = 0; i < m->n_files; i++) {
        const Kiln__ArtifactFile *f = m->files[i];
        char field[48];
        snprintf(field, sizeof(field), "files[%zu].name", i);
        /* a checkpoint directory is synced as a tree: its files are named by relative paths */
        if (!f || !(ckpt ? kiln_artifact_path_ok(f->name, field, err) : kiln_artifact_name_ok(f->name, field, err)))
            return f ? KILN_EINVAL : kiln_err_set(err, KILN_EINVAL, field, "%s is missing", field);
        for (size_t k = 0; k < i; k++)
            if (!strcmp(m->files[k]->name, f->name))
                return kiln_err_set(err, KILN_EINVAL, field, "artifact \"%s\" is listed twice", f->name);
        if (f->size < 0)
            return kiln_err_set(err, KILN_EINVAL, "size", "artifact \"%s\" has a negative size", f->name);
        if (!kiln_sha256_hex_ok(f->sha256))
            return kiln_err_set(err, KILN_EINVAL, "sha256", "artifact \"%s\": sha256 must be 64 lower-case hex digits",
                                f->name);
        if (f->size > max - total) {
            kiln_err_set(err, KILN_ETOOBIG, "files", "the job's %s come%s to more than this kilnd's limit of "
                         "%lld MiB per job (kilnd --artifact-max-job-mb)",
                         ckpt ? "checkpoint directory" : "artifacts", ckpt ? "s" : "", (long long)(max >> 20));
            kiln_err_detail(err, "with \"%s\" (%lld bytes) they pass %lld bytes", f->name, (long long)f->size,
                            (long long)max);
            kiln_err_hint(err, "the operator raises the limit with kilnd --artifact-max-job-mb");
            return KILN_ETOOBIG;
        }
        total += f->size;
    }
    return 0;
}

int64_t svc_store_durable(const char *partial, int64_t received)
{
    int fd = open(partial, O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return 0;
    struct stat st;
    int64_t off = 0;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= received && ftruncate(fd, (off_t)received) == 0)
        off = received;
    close(fd);
    return off;
}

/* What the store holds of an uploading row of its own (svc_store_durable). */
static int64_t durable_offset(svc_t *s, const char *job_id, const store_artifact_t *a)
{
    char path[PATH_MAX];
    partial_path(s, job_id, a->attempt, a->name, path, sizeof(path));
    return svc_store_durable(path, a->received);
}

/* A zero-byte file is whole as soon as it is declared. */
static int empty_file(svc_t *s, const char *job_id, int attempt, const char *name, const char *sha,
                      kiln_err_t *err)
{
    char empty_sha[KILN_SHA256_HEX], dir[PATH_MAX], path[PATH_MAX];
    kiln_sha256_hex("", 0, empty_sha);
    if (strcmp(sha, empty_sha) != 0)
        return kiln_err_set(err, KILN_ECHECKSUM, "sha256", "artifact \"%s\" is empty, but its SHA-256 is not that of "
                            "no bytes", name);
    attempt_dir(s, job_id, attempt, dir, sizeof(dir));
    int rc = kiln_mkdirs_mode(dir, 0700, err);
    if (rc)
        return rc;
    final_path(s, job_id, attempt, name, path, sizeof(path));
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not create artifact \"%s\": %s", name, strerror(errno));
    fsync(fd);
    close(fd);
    svc_fsync_dir(dir);
    return 0;
}

int svc_agent_artifacts_begin(svc_t *s, const char *worker_id, const Kiln__ArtifactManifest *m, arena_t *arena,
                              Kiln__ArtifactManifestReply *out, kiln_err_t *err)
{
    const char *wid = NULL;
    svc_tx_t tx;
    store_job_row_t job;
    store_artifact_t *rows = NULL;
    int nrows = 0;
    int rank0 = 0;
    /* names of this attempt's rows the manifest no longer lists, removed after the commit */
    char (*gone)[KILN_ARTIFACT_NAME_MAX + 1] = NULL;
    int ngone = 0;
    bool superseded = false;
    int rc = svc_agent_check_report(worker_id, m->worker_id, m->job_id, &wid, err);
    if (rc == 0 && !s->store_id[0])
        rc = svc_artifact_no_store(err);
    if (rc == 0)
        rc = manifest_check(s, m, err);
    if (rc == 0)
        rc = svc_agent_owns(s, wid, m->job_id, m->attempt, &rank0, 1, err);
    if (rc)
        return rc;
    if (m->kind == KILN__ARTIFACT_KIND__ARTIFACT_KIND_CHECKPOINT)
        return svc_agent_checkpoint_begin(s, wid, m, arena, out, err);
    rc = svc_tx_begin(s, &tx, err);
    if (rc)
        return rc;
    rc = store_job_row(tx.c, m->job_id, true, &job, err);
    if (rc == 0)
        rc = store_artifacts_of(tx.c, m->job_id, true, &rows, &nrows, err);
    if (rc)
        goto fail;
    for (int i = 0; i < nrows; i++)
        if (rows[i].attempt > m->attempt) {
            rc = kiln_err_set(err, KILN_ESTATE, "attempt", "attempt %d of job %s has uploaded its artifacts; those of "
                              "attempt %d do not replace them", rows[i].attempt, job.id, m->attempt);
            goto fail;
        }
    gone = calloc((size_t)KILN_MAX(nrows, 1), sizeof(*gone));
    if (!gone) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto fail;
    }
    /* An earlier attempt's artifacts give way: rows now, files once no one needs them. */
    for (int i = 0; i < nrows && rc == 0; i++) {
        if (rows[i].attempt == m->attempt)
            continue;
        rc = store_artifact_delete(tx.c, job.id, rows[i].name, err);
        if (rc == 0)
            rc = store_artifact_trash_add(tx.c, rows[i].store_id, job.id, rows[i].attempt, err);
        superseded = true;
    }
    if (rc)
        goto fail;
    out->files = arena_alloc(arena, sizeof(*out->files) * KILN_MAX(m->n_files, 1));
    for (size_t i = 0; i < m->n_files; i++) {
        const Kiln__ArtifactFile *f = m->files[i];
        store_artifact_t *have = NULL;
        for (int k = 0; k < nrows && !have; k++)
            if (rows[k].attempt == m->attempt && !strcmp(rows[k].name, f->name))
                have = &rows[k];
        store_artifact_t a;
        memset(&a, 0, sizeof(a));
        kiln_strlcpy(a.name, f->name, sizeof(a.name));
        a.attempt = m->attempt;
        kiln_strlcpy(a.worker_id, wid, sizeof(a.worker_id));
        a.size = f->size;
        kiln_strlcpy(a.sha256, f->sha256, sizeof(a.sha256));
        kiln_strlcpy(a.store_id, s->store_id, sizeof(a.store_id));
        bool same = have && have->size == f->size && !strcmp(have->sha256, f->sha256);
        if (same && have->complete) {
            a = *have; /* already whole (in whichever store holds it) */
        } else if (same && !strcmp(have->store_id, s->store_id)) {
            a.received = durable_offset(s, job.id, have);
            if (a.received > 0)
                log_info("job %s: upload of artifact \"%s\" resumes at byte %lld of %lld", job.id, a.name,
                         (long long)a.received, (long long)a.size);
        } else if (f->size == 0) {
            rc = empty_file(s, job.id, m->attempt, f->name, f->sha256, err);
            a.received = 0;
            a.complete = rc == 0;
        }
        /* else: new, changed, or begun in another store: from the start, in this store */
        if (rc == 0 && !(same && have->complete))
            rc = store_artifact_put(tx.c, job.id, &a, err);
        if (rc)
            goto fail;
        Kiln__ArtifactOffset *o = arena_alloc(arena, sizeof(*o));
        kiln__artifact_offset__init(o);
        o->name = svc_astr(arena, f->name);
        o->offset = a.complete ? a.size : a.received;
        o->complete = a.complete;
        out->files[out->n_files++] = o;
    }
    /* Rows of this attempt the manifest no longer lists. */
    for (int k = 0; k < nrows && rc == 0; k++) {
        if (rows[k].attempt != m->attempt)
            continue;
        bool listed = false;
        for (size_t i = 0; i < m->n_files && !listed; i++)
            listed = !strcmp(rows[k].name, m->files[i]->name);
        if (listed)
            continue;
        rc = store_artifact_delete(tx.c, job.id, rows[k].name, err);
        if (rc == 0 && !strcmp(rows[k].store_id, s->store_id))
            kiln_strlcpy(gone[ngone++], rows[k].name, sizeof(gone[0]));
    }
    if (rc)
        goto fail;
    rc = svc_tx_commit(&tx, err);
    if (rc)
        goto out;
    for (int k = 0; k < ngone; k++) {
        char path[PATH_MAX];
        final_path(s, job.id, m->attempt, gone[k], path, sizeof(path));
        unlink(path);
        partial_path(s, job.id, m->attempt, gone[k], path, sizeof(path));
        unlink(path);
    }
    if (superseded) {
        store_conn_t *c = NULL;
        kiln_err_t e2;
        if (store_conn_get(s->store, &c, &e2) == 0) {
            svc_artifact_sweep(s, c, 100);
            store_conn_put(s->store, c);
        }
    }
    out->max_chunk_bytes = SVC_ARTIFACT_CHUNK_MAX;
    log_info("job %s: worker %s begins uploading %zu artifact(s) of attempt %d", job.id, wid, m->n_files, m->attempt);
    goto out;
fail:
    svc_tx_abort(&tx);
out:
    free(rows);
    free(gone);
    return rc;
}

/* Writes data at offset of partial (creating dir, mode 0700) and makes it durable; KILN_ESTATE
 * when the file holds fewer than offset bytes. */
static int store_write(const char *dir, const char *partial, const char *name, int64_t offset, const uint8_t *data,
                       size_t len, kiln_err_t *err)
{
    int rc = kiln_mkdirs_mode(dir, 0700, err);
    if (rc)
        return rc;
    int flags = O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | (offset == 0 ? O_TRUNC : 0);
    int fd = open(partial, flags, 0600);
    if (fd < 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not open the upload of \"%s\": %s", name, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < offset) {
        rc = kiln_err_set(err, KILN_ESTATE, "offset", "the store holds fewer bytes of \"%s\" than recorded; ask for "
                          "the offset again", name);
    } else {
        size_t done = 0;
        while (done < len && rc == 0) {
            ssize_t w = pwrite(fd, data + done, len - done, (off_t)(offset + (int64_t)done));
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                rc = kiln_err_set(err, KILN_EIO, NULL, "could not write to the artifact store: %s", strerror(errno));
            else
                done += (size_t)w;
        }
        if (rc == 0 && (ftruncate(fd, (off_t)(offset + (int64_t)len)) != 0 || fdatasync(fd) != 0))
            rc = kiln_err_set(err, KILN_EIO, NULL, "could not make an artifact durable: %s", strerror(errno));
    }
    close(fd);
    if (rc == 0)
        svc_prom_artifact_bytes_stored((int64_t)len);
    if (rc == 0 && offset == 0)
        svc_fsync_dir(dir);
    return rc;
}

/* The last byte arrived: checks partial against want_size and want_sha (KILN_ECHECKSUM, the
 * bytes dropped) and renames it to final. */
static int store_finish(const char *dir, const char *partial, const char *final, const char *job_id, const char *what,
                        const char *name, int64_t want_size, const char *want_sha, kiln_err_t *err)
{
    char got[KILN_SHA256_HEX];
    int fd = open(partial, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not reopen the upload of %s \"%s\": %s", what, name,
                            strerror(errno));
    int64_t size = 0;
    int rc = kiln_sha256_fd(fd, &size, got, err);
    close(fd);
    if (rc)
        return rc;
    if (size != want_size || strcmp(got, want_sha) != 0) {
        unlink(partial);
        log_warn("job %s: %s \"%s\" arrived with SHA-256 %s, not the declared %s; dropped", job_id, what, name, got,
                 want_sha);
        kiln_err_set(err, KILN_ECHECKSUM, "sha256", "%s \"%s\" as kilnd received it has SHA-256 %.16s..., not the "
                     "%.16s... its manifest declared; kilnd dropped it", what, name, got, want_sha);
        kiln_err_hint(err, "upload it again from offset 0");
        return KILN_ECHECKSUM;
    }
    if (rename(partial, final) != 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not put %s \"%s\" in place: %s", what, name,
                            strerror(errno));
    svc_fsync_dir(dir);
    return 0;
}

int svc_store_chunk(svc_t *s, const svc_store_target_t *t, int64_t offset, const uint8_t *data, size_t len,
                    int64_t *received, bool *complete, kiln_err_t *err)
{
    *received = t->received;
    *complete = false;
    if (strcmp(t->store_id, s->store_id) != 0)
        return kiln_err_set(err, KILN_ESTATE, "offset", "the upload of %s \"%s\" began in another artifact store "
                            "(%s); ask for the offset again to continue in this one", t->what, t->name, t->store_id);
    if (offset != t->received)
        return kiln_err_set(err, KILN_ESTATE, "offset", "kilnd holds %lld bytes of \"%s\", not %lld; ask for the "
                            "offset again", (long long)t->received, t->name, (long long)offset);
    if ((int64_t)len > t->size - offset)
        return kiln_err_set(err, KILN_EINVAL, "data", "the chunk goes past the %lld bytes declared for \"%s\"",
                            (long long)t->size, t->name);
    int rc = store_write(t->dir, t->partial, t->name, offset, data, len, err);
    if (rc)
        return rc;
    int64_t now = offset + (int64_t)len;
    if (now == t->size &&
        (rc = store_finish(t->dir, t->partial, t->final, t->job_id, t->what, t->name, t->size, t->sha256, err)) != 0)
        return rc;
    *received = now;
    *complete = now == t->size;
    return 0;
}

int svc_agent_artifact_chunk(svc_t *s, const char *worker_id, const Kiln__ArtifactChunk *ch,
                             Kiln__ArtifactChunkReply *out, kiln_err_t *err)
{
    const char *wid = NULL;
    svc_tx_t tx;
    store_artifact_t a;
    int rank0 = 0;
    int rc = svc_agent_check_report(worker_id, ch->worker_id, ch->job_id, &wid, err);
    if (rc == 0 && !s->store_id[0])
        rc = svc_artifact_no_store(err);
    if (rc == 0)
        rc = svc_check_str("name", ch->name, 0, err);
    if (rc == 0 && !(ch->kind == KILN__ARTIFACT_KIND__ARTIFACT_KIND_CHECKPOINT ? kiln_artifact_path_ok(ch->name, "name", err)
                                                                             : kiln_artifact_name_ok(ch->name, "name", err)))
        rc = KILN_EINVAL;
    if (rc == 0 && ch->offset < 0)
        rc = kiln_err_set(err, KILN_EINVAL, "offset", "offset must not be negative");
    if (rc == 0 && (ch->data.len == 0 || ch->data.len > SVC_ARTIFACT_CHUNK_MAX))
        rc = kiln_err_set(err, KILN_EINVAL, "data", "a chunk holds 1 to %d bytes, got %zu", SVC_ARTIFACT_CHUNK_MAX,
                          ch->data.len);
    if (rc)
        return rc;
    char got[KILN_SHA256_HEX];
    kiln_sha256_hex(ch->data.data, ch->data.len, got);
    if (!ch->sha256 || strcmp(got, ch->sha256) != 0) {
        log_warn("job %s: refused a chunk of artifact \"%s\" at offset %lld from worker %s: its bytes do not match "
                 "its SHA-256", ch->job_id, ch->name, (long long)ch->offset, wid);
        kiln_err_set(err, KILN_ECHECKSUM, "sha256", "the chunk of \"%s\" at offset %lld does not match its SHA-256: "
                     "it was damaged on the way; nothing of it was written", ch->name, (long long)ch->offset);
        kiln_err_hint(err, "send the chunk again");
        return KILN_ECHECKSUM;
    }
    if (ch->kind != KILN__ARTIFACT_KIND__ARTIFACT_KIND_OUTPUT && ch->kind != KILN__ARTIFACT_KIND__ARTIFACT_KIND_CHECKPOINT)
        return kiln_err_set(err, KILN_EINVAL, "kind", "kind must be ARTIFACT_KIND_OUTPUT or ARTIFACT_KIND_CHECKPOINT, "
                            "got %d", (int)ch->kind);
    rc = svc_agent_owns(s, wid, ch->job_id, ch->attempt, &rank0, 1, err);
    if (rc)
        return rc;
    if (ch->kind == KILN__ARTIFACT_KIND__ARTIFACT_KIND_CHECKPOINT)
        return svc_agent_checkpoint_chunk(s, wid, ch, out, err);
    rc = svc_tx_begin(s, &tx, err);
    if (rc)
        return rc;
    /* The row lock orders every write to this file, whichever kilnd takes the chunk. */
    rc = store_artifact_get(tx.c, ch->job_id, ch->name, true, &a, err);
    if (rc == KILN_ENOTFOUND)
        kiln_err_hint(err, "announce the upload first (BeginArtifacts)");
    if (rc)
        goto fail;
    if (a.attempt != ch->attempt) {
        rc = kiln_err_set(err, KILN_ESTATE, "attempt", "artifact \"%s\" is being uploaded by attempt %d, not %d", a.name,
                          a.attempt, ch->attempt);
        goto fail;
    }
    if (a.complete) {
        out->offset = a.size;
        out->complete = true;
        svc_tx_abort(&tx);
        return 0;
    }
    char dir[PATH_MAX], partial[PATH_MAX], final[PATH_MAX];
    attempt_dir(s, ch->job_id, a.attempt, dir, sizeof(dir));
    partial_path(s, ch->job_id, a.attempt, a.name, partial, sizeof(partial));
    final_path(s, ch->job_id, a.attempt, a.name, final, sizeof(final));
    svc_store_target_t t = {.dir = dir, .partial = partial, .final = final, .job_id = ch->job_id, .what = "artifact",
                            .name = a.name, .store_id = a.store_id, .size = a.size, .received = a.received,
                            .sha256 = a.sha256};
    int64_t received = 0;
    bool complete = false;
    rc = svc_store_chunk(s, &t, ch->offset, ch->data.data, ch->data.len, &received, &complete, err);
    if (rc == KILN_ECHECKSUM) {
        /* the bytes are gone: record that, so the next try starts at 0 */
        kiln_err_t e2;
        if (store_artifact_progress(tx.c, ch->job_id, a.name, 0, false, &e2) == 0 && svc_tx_commit(&tx, &e2) == 0)
            return rc;
        goto fail;
    }
    if (rc)
        goto fail;
    rc = store_artifact_progress(tx.c, ch->job_id, a.name, received, complete, err);
    if (rc)
        goto fail;
    rc = svc_tx_commit(&tx, err);
    if (rc)
        return rc;
    out->offset = received;
    out->complete = complete;
    if (complete)
        log_info("job %s: artifact \"%s\" of attempt %d stored (%lld bytes, sha256 %s)", ch->job_id, a.name, a.attempt,
                 (long long)a.size, a.sha256);
    return 0;
fail:
    svc_tx_abort(&tx);
    return rc;
}

/* ---- the model a job starts from --------------------------------------------------------------- */

const char *svc_init_from_job(const char *ref)
{
    if (!ref || strncmp(ref, "job:", 4) != 0 || !store_is_uuid(ref + 4))
        return NULL;
    return ref + 4;
}

int svc_artifact_model(store_conn_t *c, const char *source_id, int64_t *size, char *sha256, kiln_err_t *err)
{
    store_artifact_t a;
    int rc = store_artifact_get(c, source_id, KILN_ARTIFACT_MODEL, false, &a, err);
    if (rc == 0 && !a.complete)
        rc = kiln_err_set(err, KILN_ENOTFOUND, NULL, "the model of job %s is still being uploaded", source_id);
    if (rc)
        return rc;
    *size = a.size;
    kiln_strlcpy(sha256, a.sha256, KILN_SHA256_HEX);
    return 0;
}

int svc_store_open(svc_t *s, const char *path, const char *store_id, int64_t size, const char *what, int *fd_out,
                   kiln_err_t *err)
{
    *fd_out = -1;
    if (!s->store_id[0])
        return svc_artifact_no_store(err);
    if (strcmp(store_id, s->store_id) != 0) {
        kiln_err_set(err, KILN_EUNAVAIL, NULL, "%s is in artifact store %s, and this kilnd's --artifact-dir is store %s",
                     what, store_id, s->store_id);
        kiln_err_detail(err, "each kilnd serves the artifacts of the store its --artifact-dir holds");
        kiln_err_hint(err, "give every kilnd replica the same --artifact-dir on shared storage (NFS, a ReadWriteMany "
                           "volume), or ask a replica whose --artifact-dir is store %s", store_id);
        return KILN_EUNAVAIL;
    }
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != size) {
        log_error("artifacts: %s is missing or does not have the %lld bytes recorded for it", path, (long long)size);
        if (fd >= 0)
            close(fd);
        kiln_err_set(err, KILN_EUNAVAIL, NULL, "%s is missing from the artifact store", what);
        kiln_err_hint(err, "the operator finds why in kilnd's log");
        return KILN_EUNAVAIL;
    }
    *fd_out = fd;
    return 0;
}

/* Opens the file of a complete artifact row this store holds. */
static int open_artifact(svc_t *s, const char *job_id, const store_artifact_t *a, int *fd_out, kiln_err_t *err)
{
    char path[PATH_MAX], what[256];
    final_path(s, job_id, a->attempt, a->name, path, sizeof(path));
    snprintf(what, sizeof(what), "artifact \"%s\" of job %s", a->name, job_id);
    return svc_store_open(s, path, a->store_id, a->size, what, fd_out, err);
}

int svc_agent_fetch_begin(svc_t *s, const char *worker_id, const char *claimed, const char *job_id, int attempt,
                          int64_t offset, int max_bytes, store_conn_t **c, json_t **job, kiln_err_t *err)
{
    const char *wid = NULL;
    *c = NULL;
    *job = NULL;
    int rc = svc_agent_check_report(worker_id, claimed, job_id, &wid, err);
    if (rc == 0 && offset < 0)
        rc = kiln_err_set(err, KILN_EINVAL, "offset", "offset must not be negative");
    if (rc == 0 && (max_bytes < 0 || max_bytes > SVC_ARTIFACT_CHUNK_MAX))
        rc = kiln_err_set(err, KILN_EINVAL, "max_bytes", "max_bytes must be 0 to %d", SVC_ARTIFACT_CHUNK_MAX);
    if (rc == 0)
        rc = svc_agent_owns(s, wid, job_id, attempt, NULL, 0, err);
    if (rc == 0)
        rc = store_conn_get(s->store, c, err);
    if (rc == 0 && (rc = store_job_get_json(*c, job_id, job, err)) != 0) {
        store_conn_put(s->store, *c);
        *c = NULL;
    }
    return rc;
}

int svc_read_piece(int fd, int64_t size, int64_t offset, int max_bytes, const char *what, arena_t *arena,
                   uint8_t **data, size_t *len, kiln_err_t *err)
{
    *data = NULL;
    *len = 0;
    if (offset > size)
        return kiln_err_set(err, KILN_ERANGE, "offset", "offset %lld is past the %lld bytes of %s", (long long)offset,
                            (long long)size, what);
    size_t want = (size_t)KILN_MIN((int64_t)(max_bytes > 0 ? max_bytes : 1 << 20), size - offset);
    uint8_t *buf = arena_alloc(arena, want ? want : 1);
    size_t got = 0;
    while (got < want) {
        ssize_t n = pread(fd, buf + got, want - got, (off_t)(offset + (int64_t)got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return kiln_err_set(err, KILN_EIO, NULL, "could not read %s", what);
        got += (size_t)n;
    }
    *data = buf;
    *len = got;
    return 0;
}

int svc_agent_init_model(svc_t *s, const char *worker_id, const Kiln__InitModelRequest *req, arena_t *arena,
                         Kiln__InitModelChunk *out, kiln_err_t *err)
{
    store_conn_t *c = NULL;
    json_t *job = NULL;
    int fd = -1;
    /* The source comes from the assigned job's own spec, never from the request. */
    int rc = svc_agent_fetch_begin(s, worker_id, req->worker_id, req->job_id, req->attempt, req->offset,
                                   req->max_bytes, &c, &job, err);
    if (rc)
        return rc;
    const char *ref = json_string_value(json_object_get(json_object_get(json_object_get(job, "spec"), "model"),
                                                       "init_from"));
    const char *src = svc_init_from_job(ref);
    if (!src) {
        rc = kiln_err_set(err, KILN_EINVAL, "job_id", "job %s does not start from another job's model", req->job_id);
        goto out;
    }
    store_artifact_t a;
    rc = store_artifact_get(c, src, KILN_ARTIFACT_MODEL, false, &a, err);
    if (rc == 0 && !a.complete)
        rc = KILN_ENOTFOUND;
    if (rc == KILN_ENOTFOUND)
        kiln_err_set(err, KILN_ENOTFOUND, "model.init_from", "job %s has no model artifact (any more)", src);
    if (rc == 0)
        rc = open_artifact(s, src, &a, &fd, err);
    char what[80];
    snprintf(what, sizeof(what), "the model of job %s", src);
    if (rc == 0)
        rc = svc_read_piece(fd, a.size, req->offset, req->max_bytes, what, arena, &out->data.data, &out->data.len, err);
    if (rc)
        goto out;
    out->source_job_id = svc_astr(arena, src);
    out->name = svc_astr(arena, KILN_ARTIFACT_MODEL);
    out->size = a.size;
    out->sha256 = svc_astr(arena, a.sha256);
    out->offset = req->offset;
out:
    if (fd >= 0)
        close(fd);
    json_decref(job);
    if (c)
        store_conn_put(s->store, c);
    return rc;
}

/* ---- clients ---------------------------------------------------------------------------------- */

int svc_job_artifacts(svc_t *s, const svc_caller_t *who, const char *id, json_t **out, kiln_err_t *err)
{
    *out = NULL;
    JOB_RESOLVE(s, who, id, err);
    store_conn_t *c = NULL;
    store_artifact_t *rows = NULL;
    int n = 0;
    int rc = svc_job_view_conn(s, who, id, &c, err);
    if (rc)
        return rc;
    rc = store_artifacts_of(c, id, false, &rows, &n, err);
    store_conn_put(s->store, c);
    if (rc)
        return rc;
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        if (!rows[i].complete)
            continue;
        char t[40];
        json_array_append_new(arr, json_pack("{s:s, s:I, s:s, s:s, s:i, s:s}", "name", rows[i].name, "size",
                                             (json_int_t)rows[i].size, "sha256", rows[i].sha256, "created_at",
                                             kiln_time_format(rows[i].completed_us, t, sizeof(t)), "attempt",
                                             rows[i].attempt, "worker_id", rows[i].worker_id));
    }
    free(rows);
    *out = json_pack("{s:o}", "artifacts", arr);
    return 0;
}

int svc_job_artifact_open(svc_t *s, const svc_caller_t *who, const char *id, const char *name,
                          svc_artifact_file_t *out, kiln_err_t *err)
{
    memset(out, 0, sizeof(*out));
    out->fd = -1;
    JOB_RESOLVE(s, who, id, err);
    store_conn_t *c = NULL;
    store_artifact_t a;
    int rc = store_conn_get(s->store, &c, err);
    if (rc)
        return rc;
    /* the one validator's UTF-8 and NUL (%00) checks first, as for every request's text; then
     * the caller's access and the artifact name's rules */
    rc = svc_check_str("name", name, 0, err);
    if (rc == 0)
        rc = svc_job_access(c, who, id, SVC_ROLE_VIEWER, err);
    if (rc == 0 && !kiln_artifact_name_ok(name, "name", err))
        rc = KILN_EINVAL;
    if (rc == 0)
        rc = store_job_row(c, id, false, &(store_job_row_t){0}, err);
    if (rc == 0)
        rc = store_artifact_get(c, id, name, false, &a, err);
    store_conn_put(s->store, c);
    if (rc == KILN_ENOTFOUND && !strcmp(err->field, "name"))
        kiln_err_hint(err, "GET /v1/jobs/%s/artifacts lists them (kiln artifacts %s)", id, id);
    if (rc == 0 && !a.complete) {
        rc = kiln_err_set(err, KILN_ENOTFOUND, "name", "artifact \"%s\" of job %s is still being uploaded", name, id);
        kiln_err_hint(err, "a job's artifacts are complete once it has ended");
    }
    if (rc == 0)
        rc = open_artifact(s, id, &a, &out->fd, err);
    if (rc)
        return rc;
    out->size = a.size;
    kiln_strlcpy(out->sha256, a.sha256, sizeof(out->sha256));
    kiln_strlcpy(out->name, a.name, sizeof(out->name));
    out->created_us = a.completed_us;
    out->attempt = a.attempt;
    return 0;
}
