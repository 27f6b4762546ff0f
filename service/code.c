/* code.c - script jobs' code archives in kilnd's artifact store (service.h says what a project
 * sees): uploads gathered in pieces, checked entry by entry by code/ when whole, kept once per
 * SHA-256, and read back by project members and by the agents running jobs that name them:
 *
 *   DIR/code/<digest>.tgz                   an archive, its bytes as uploaded
 *   DIR/code/uploads/<id>.partial, .meta    an upload under way (the meta file: project, user)
 *
 * The database says which project uploaded which archive (store/code.c). Replicas sharing one
 * directory serve each other's archives; since an archive is named by its bytes, any store that
 * holds the file serves it. */
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
#include <time.h>
#include <unistd.h>

#include "code/code.h"

#define CODE_UPLOAD_TTL_S (24 * 3600)    /* an unfinished upload older than this is removed */

struct svc_code_upload {
    svc_t *s;
    char id[33];
    char project[64];
    char user[64];
    int fd;
    int64_t offset, max;
    char partial[PATH_MAX], meta[PATH_MAX];
};

static int64_t code_max(const svc_t *s)
{
    return s->cfg.code_max_bytes > 0 ? s->cfg.code_max_bytes : (int64_t)CODE_DEFAULT_MAX_MB << 20;
}

static void code_path(const svc_t *s, const char *digest, char *out, size_t n)
{
    snprintf(out, n, "%s/code/%s.tgz", s->artifact_dir, digest);
}

static int too_big(const svc_t *s, int64_t bytes, kiln_err_t *err)
{
    kiln_err_set(err, KILN_ETOOBIG, "archive", "the code archive is larger than this kilnd's limit of %lld MiB "
                 "(kilnd --code-max-mb)", (long long)(code_max(s) >> 20));
    if (bytes > 0)
        kiln_err_detail(err, "it has %lld bytes or more", (long long)bytes);
    kiln_err_hint(err, "leave data, checkpoints and build outputs out of the code with .kilnignore (data belongs in "
                       "data.channels), or ask the operator to raise --code-max-mb");
    return KILN_ETOOBIG;
}

/* Removes the uploads nobody continued for a day. */
static void sweep_uploads(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    time_t now = time(NULL);
    struct dirent *de;
    while ((de = readdir(d))) {
        struct stat st;
        if (de->d_name[0] == '.' || fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (now - st.st_mtime > CODE_UPLOAD_TTL_S && unlinkat(dirfd(d), de->d_name, 0) == 0)
            log_info("code: removed %s/%s, an upload left unfinished for a day", dir, de->d_name);
    }
    closedir(d);
}

static bool upload_id_ok(const char *id)
{
    if (!id || strlen(id) != 32)
        return false;
    for (int i = 0; i < 32; i++)
        if (!((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f')))
            return false;
    return true;
}

static int no_upload(const char *id, kiln_err_t *err)
{
    kiln_err_set(err, KILN_ENOTFOUND, "upload_id", "no upload \"%.40s\" of yours into this project", id);
    kiln_err_hint(err, "start the upload again without an upload_id");
    return KILN_ENOTFOUND;
}

int svc_code_upload_open(svc_t *s, const svc_caller_t *who, const char *project, const char *upload_id,
                         int64_t offset, int64_t expect_bytes, svc_code_upload_t **out, kiln_err_t *err)
{
    *out = NULL;
    if (!project || !*project)
        project = "default";
    int rc = svc_check_str("project", project, 63, err);
    if (rc == 0)
        rc = svc_check_str("upload_id", upload_id, 64, err);
    if (rc == 0)
        rc = svc_project_need(who, project, SVC_ROLE_EDITOR, err);
    if (rc == 0 && !s->store_id[0])
        rc = svc_artifact_no_store(err);
    if (rc == 0 && expect_bytes > code_max(s))
        rc = too_big(s, expect_bytes, err);
    if (rc == 0 && offset < 0)
        rc = kiln_err_set(err, KILN_EINVAL, "offset", "offset must not be negative");
    if (rc == 0 && who->cluster_admin) {
        /* a member's project exists; a cluster admin may name any, existing or not */
        store_conn_t *c = NULL;
        bool exists = false;
        if ((rc = store_conn_get(s->store, &c, err)) == 0) {
            rc = store_project_exists(c, project, &exists, err);
            store_conn_put(s->store, c);
        }
        if (rc == 0 && !exists) {
            rc = kiln_err_set(err, KILN_ENOTFOUND, "project", "project \"%s\" does not exist", project);
            kiln_err_hint(err, "create it first: kiln projects create %s", project);
        }
    }
    if (rc)
        return rc;
    svc_code_upload_t *u = calloc(1, sizeof(*u));
    if (!u)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    u->s = s;
    u->fd = -1;
    u->max = code_max(s);
    kiln_strlcpy(u->project, project, sizeof(u->project));
    kiln_strlcpy(u->user, who->user ? who->user : "", sizeof(u->user));
    char dir[sizeof(s->artifact_dir) + 16];
    snprintf(dir, sizeof(dir), "%s/code/uploads", s->artifact_dir);
    if ((rc = kiln_mkdirs_mode(dir, 0700, err)))
        goto fail;
    bool fresh = !upload_id || !*upload_id;
    if (fresh) {
        uint8_t raw[16];
        if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw)) {
            rc = kiln_err_set(err, KILN_EIO, NULL, "could not make an upload id");
            goto fail;
        }
        for (int i = 0; i < 16; i++)
            snprintf(u->id + 2 * i, 3, "%02x", raw[i]);
        sweep_uploads(dir);
    } else if (!upload_id_ok(upload_id)) {
        rc = no_upload(upload_id, err);
        goto fail;
    } else {
        kiln_strlcpy(u->id, upload_id, sizeof(u->id));
    }
    snprintf(u->partial, sizeof(u->partial), "%s/%s.partial", dir, u->id);
    snprintf(u->meta, sizeof(u->meta), "%s/%s.meta", dir, u->id);
    char meta[200];
    snprintf(meta, sizeof(meta), "%s\n%s\n", u->project, u->user);
    if (fresh) {
        if (offset != 0) {
            rc = kiln_err_set(err, KILN_EINVAL, "offset", "a new upload starts at offset 0, not %lld",
                              (long long)offset);
            goto fail;
        }
        u->fd = open(u->partial, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (u->fd < 0 || (rc = kiln_file_write_atomic_mode(u->meta, meta, strlen(meta), 0600, err))) {
            rc = rc ? rc : kiln_err_set(err, KILN_EIO, NULL, "could not start an upload: %s", strerror(errno));
            goto fail;
        }
        *out = u;
        return 0;
    }
    /* a later piece: the upload must be the caller's, into the same project */
    char *have = NULL;
    kiln_err_t e2;
    bool mine = kiln_file_read(u->meta, &have, NULL, &e2) == 0 && !strcmp(have, meta);
    free(have);
    if (!mine) {
        memset(u->meta, 0, sizeof(u->meta)); /* not ours: never removed by close */
        u->partial[0] = '\0';
        rc = no_upload(upload_id, err);
        goto fail;
    }
    u->fd = open(u->partial, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (u->fd < 0 || fstat(u->fd, &st) != 0) {
        rc = no_upload(upload_id, err);
        goto fail;
    }
    u->offset = st.st_size;
    if (offset != u->offset) {
        kiln_err_set(err, KILN_ESTATE, "offset", "kilnd holds %lld bytes of upload %s, not %lld",
                     (long long)u->offset, u->id, (long long)offset);
        kiln_err_hint(err, "send the bytes from offset %lld", (long long)u->offset);
        close(u->fd);
        free(u);
        return KILN_ESTATE;
    }
    *out = u;
    return 0;
fail:
    svc_code_upload_close(u, false);
    return rc;
}

const char *svc_code_upload_id(const svc_code_upload_t *u)
{
    return u->id;
}

int64_t svc_code_upload_offset(const svc_code_upload_t *u)
{
    return u->offset;
}

int svc_code_upload_write(svc_code_upload_t *u, const void *data, size_t n, kiln_err_t *err)
{
    if ((int64_t)n > u->max - u->offset) {
        /* the upload cannot go on: what it holds goes now */
        if (u->partial[0])
            unlink(u->partial);
        if (u->meta[0])
            unlink(u->meta);
        u->partial[0] = u->meta[0] = '\0';
        return too_big(u->s, u->offset + (int64_t)n, err);
    }
    size_t done = 0;
    while (done < n) {
        ssize_t w = pwrite(u->fd, (const char *)data + done, n - done, (off_t)(u->offset + (int64_t)done));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return kiln_err_set(err, KILN_EIO, NULL, "could not write the upload: %s", strerror(errno));
        done += (size_t)w;
    }
    u->offset += (int64_t)n;
    return 0;
}

void svc_code_upload_close(svc_code_upload_t *u, bool keep)
{
    if (!u)
        return;
    if (u->fd >= 0)
        close(u->fd);
    if (!keep) {
        if (u->partial[0])
            unlink(u->partial);
        if (u->meta[0])
            unlink(u->meta);
    }
    free(u);
}

int svc_code_upload_finish(svc_code_upload_t *u, json_t **out, kiln_err_t *err)
{
    svc_t *s = u->s;
    store_conn_t *c = NULL;
    char digest[KILN_SHA256_HEX], final[PATH_MAX], dir[PATH_MAX];
    int64_t size = 0;
    bool created = false;
    int files = 0;
    *out = NULL;
    int rc = fsync(u->fd) == 0 ? kiln_sha256_fd(u->fd, &size, digest, err)
                               : kiln_err_set(err, KILN_EIO, NULL, "could not write the upload: %s", strerror(errno));
    if (rc)
        goto done;
    if (size == 0) {
        rc = kiln_err_set(err, KILN_EINVAL, "archive", "the upload is empty");
        kiln_err_hint(err, "send a gzip'd tar of the source directory (kiln code push DIR)");
        goto done;
    }
    if ((rc = store_conn_get(s->store, &c, err)))
        goto done;
    store_code_t have;
    kiln_err_t e2;
    rc = store_code_get(c, u->project, digest, &have, &e2);
    if (rc == 0) {
        /* the project uploaded these bytes before: nothing to keep or check again */
        files = have.files;
        goto reply;
    }
    if (rc != KILN_ENOTFOUND) {
        *err = e2;
        goto done;
    }
    code_path(s, digest, final, sizeof(final));
    struct stat st;
    store_code_t blob;
    bool kept = store_code_blob(c, digest, &blob, &e2) == 0 && lstat(final, &st) == 0 && S_ISREG(st.st_mode) &&
                st.st_size == size;
    if (kept) {
        files = blob.files; /* the same bytes passed the checks when another project sent them */
    } else {
        code_limits_t lim;
        code_stats_t cs;
        code_limits_default(&lim, u->max);
        if (lseek(u->fd, 0, SEEK_SET) != 0) {
            rc = kiln_err_set(err, KILN_EIO, NULL, "could not read the upload back");
            goto done;
        }
        if ((rc = code_archive_check_fd(u->fd, &lim, &cs, err))) {
            log_info("code: refused an archive uploaded by %s into project %s: %s", u->user[0] ? u->user : "kilnd",
                     u->project, err->message);
            goto done;
        }
        files = (int)cs.files;
        snprintf(dir, sizeof(dir), "%s/code", s->artifact_dir);
        if (rename(u->partial, final) != 0) {
            rc = kiln_err_set(err, KILN_EIO, NULL, "could not keep the archive: %s", strerror(errno));
            goto done;
        }
        u->partial[0] = '\0';
        svc_fsync_dir(dir);
        svc_prom_artifact_bytes_stored(size);
    }
    rc = store_code_put(c, u->project, digest, size, files, s->store_id, u->user, &created, err);
    if (rc)
        goto done;
    log_info("code: project %s %s archive %s (%lld bytes, %d files)%s", u->project,
             created ? "uploaded" : "had already uploaded", digest, (long long)size, files,
             kept ? ", whose bytes the store held already" : "");
reply:
    rc = 0;
    *out = json_pack("{s:s, s:s, s:I, s:i, s:s, s:b}", "source", "", "digest", digest, "size", (json_int_t)size,
                     "files", files, "project", u->project, "created", created);
    if (*out) {
        char src[100];
        snprintf(src, sizeof(src), "%s%s", SPEC_CODE_PREFIX, digest);
        json_object_set_new(*out, "source", json_string(src));
    } else {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
done:
    if (c)
        store_conn_put(s->store, c);
    svc_code_upload_close(u, false);
    return rc;
}

/* Opens the bytes of an archive row from this kilnd's store. */
static int open_code(svc_t *s, const store_code_t *row, int *fd_out, kiln_err_t *err)
{
    *fd_out = -1;
    if (!s->store_id[0])
        return svc_artifact_no_store(err);
    char path[PATH_MAX];
    code_path(s, row->digest, path, sizeof(path));
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == row->size) {
        *fd_out = fd;
        return 0;
    }
    if (fd >= 0)
        close(fd);
    if (strcmp(row->store_id, s->store_id) != 0) {
        kiln_err_set(err, KILN_EUNAVAIL, NULL, "code archive %s is in artifact store %s, and this kilnd's "
                     "--artifact-dir is store %s", row->digest, row->store_id, s->store_id);
        kiln_err_hint(err, "give every kilnd replica the same --artifact-dir on shared storage");
        return KILN_EUNAVAIL;
    }
    log_error("code: %s is missing or does not have the %lld bytes recorded for it", path, (long long)row->size);
    kiln_err_set(err, KILN_EUNAVAIL, NULL, "code archive %s is missing from the artifact store", row->digest);
    kiln_err_hint(err, "upload the code again (kiln code push); the operator finds why in kilnd's log");
    return KILN_EUNAVAIL;
}

/* A digest as a client writes it: 64 hex digits, or the whole source string. */
static int read_digest(const char *text, char digest[KILN_SHA256_HEX], kiln_err_t *err)
{
    int rc = svc_check_str("digest", text, 100, err);
    if (rc)
        return rc;
    char src[100];
    snprintf(src, sizeof(src), "%s%s", SPEC_CODE_PREFIX, text ? text : "");
    if (spec_source_digest(text, digest) || spec_source_digest(src, digest))
        return 0;
    kiln_err_set(err, KILN_EINVAL, "digest", "\"%.80s\" is not a code archive's digest", text ? text : "");
    kiln_err_hint(err, "give the 64 hex digits of the source kiln code push printed (code:sha256:<digest>)");
    return KILN_EINVAL;
}

int svc_code_open(svc_t *s, const svc_caller_t *who, const char *project, const char *digest_text,
                  svc_artifact_file_t *out, kiln_err_t *err)
{
    memset(out, 0, sizeof(*out));
    out->fd = -1;
    if (!project || !*project)
        project = "default";
    char digest[KILN_SHA256_HEX];
    int rc = svc_check_str("project", project, 63, err);
    if (rc == 0)
        rc = read_digest(digest_text, digest, err);
    if (rc)
        return rc;
    store_code_t row;
    if (svc_caller_role(who, project) == SVC_ROLE_NONE) {
        /* a project the caller cannot read has, for it, no archives at all */
        kiln_err_set(err, KILN_ENOTFOUND, "digest", "project \"%.64s\" has no code archive %s", project, digest);
        return KILN_ENOTFOUND;
    }
    store_conn_t *c = NULL;
    if ((rc = store_conn_get(s->store, &c, err)))
        return rc;
    rc = store_code_get(c, project, digest, &row, err);
    store_conn_put(s->store, c);
    if (rc == KILN_ENOTFOUND)
        kiln_err_hint(err, "upload it with kiln code push DIR --project %s", project);
    if (rc == 0)
        rc = open_code(s, &row, &out->fd, err);
    if (rc)
        return rc;
    out->size = row.size;
    kiln_strlcpy(out->sha256, row.digest, sizeof(out->sha256));
    snprintf(out->name, sizeof(out->name), "%s.tgz", row.digest);
    out->created_us = row.created_us;
    return 0;
}

int svc_agent_code(svc_t *s, const char *worker_id, const Kiln__CodeRequest *req, arena_t *arena,
                   Kiln__CodeChunk *out, kiln_err_t *err)
{
    store_conn_t *c = NULL;
    json_t *job = NULL;
    int fd = -1;
    /* the archive comes from the assigned job's own spec, never from the request */
    int rc = svc_agent_fetch_begin(s, worker_id, req->worker_id, req->job_id, req->attempt, req->offset,
                                   req->max_bytes, &c, &job, err);
    if (rc)
        return rc;
    char digest[KILN_SHA256_HEX], what[100];
    const char *src = json_string_value(json_object_get(json_object_get(job, "spec"), "source"));
    if (!spec_source_digest(src, digest)) {
        rc = kiln_err_set(err, KILN_EINVAL, "job_id", "job %s runs no code archive", req->job_id);
        goto out;
    }
    snprintf(what, sizeof(what), "code archive %s", digest);
    store_code_t row;
    if ((rc = store_code_blob(c, digest, &row, err)) || (rc = open_code(s, &row, &fd, err)) ||
        (rc = svc_read_piece(fd, row.size, req->offset, req->max_bytes, what, arena, &out->data.data, &out->data.len,
                             err)))
        goto out;
    out->digest = svc_astr(arena, digest);
    out->size = row.size;
    out->offset = req->offset;
out:
    if (fd >= 0)
        close(fd);
    json_decref(job);
    if (c)
        store_conn_put(s->store, c);
    return rc;
}

void svc_assignment_script(svc_t *s, const spec_t *sp, arena_t *arena, Kiln__Assignment *msg)
{
    msg->memory_limit_mb = sp->res.memory_limit_mb;
    msg->grace_period_s = sp->grace_period_s;
    msg->max_attempts = sp->max_attempts;
    if (!spec_is_script(sp))
        return;
    const spec_script_t *sc = &sp->script;
    msg->entry_point = svc_astr(arena, sc->entry_point);
    msg->source = svc_astr(arena, sc->source);
    msg->python = svc_astr(arena, sc->python);
    msg->torch_distributed = sc->torch_distributed;
    msg->nproc_per_node = sc->nproc_per_node;
    char *hp = json_dumps(sc->hyperparameters ? sc->hyperparameters : json_object(), JSON_COMPACT);
    msg->hyperparameters_json = svc_astr(arena, hp ? hp : "{}");
    free(hp);
    msg->n_channels = (size_t)sp->data.n_channels;
    msg->channels = arena_alloc(arena, sizeof(*msg->channels) * (size_t)KILN_MAX(sp->data.n_channels, 1));
    for (int i = 0; i < sp->data.n_channels; i++) {
        Kiln__Channel *c = arena_alloc(arena, sizeof(*c));
        kiln__channel__init(c);
        c->name = svc_astr(arena, sp->data.channels[i].name);
        c->path = svc_astr(arena, sp->data.channels[i].path);
        msg->channels[i] = c;
    }
    size_t ne = sc->environment ? json_object_size(sc->environment) : 0;
    msg->environment = arena_alloc(arena, sizeof(*msg->environment) * KILN_MAX(ne, 1));
    const char *name;
    json_t *v;
    json_object_foreach(sc->environment, name, v) {
        Kiln__Assignment__EnvironmentEntry *e = arena_alloc(arena, sizeof(*e));
        kiln__assignment__environment_entry__init(e);
        e->key = svc_astr(arena, name);
        e->value = svc_astr(arena, json_string_value(v));
        msg->environment[msg->n_environment++] = e;
    }
    char digest[KILN_SHA256_HEX];
    msg->code_digest = svc_astr(arena, "");
    if (!spec_source_digest(sc->source, digest))
        return;
    /* what the agent checks the fetched archive against */
    msg->code_digest = svc_astr(arena, digest);
    store_conn_t *c = NULL;
    store_code_t row;
    kiln_err_t e2;
    if (store_conn_get(s->store, &c, &e2) == 0) {
        if (store_code_blob(c, digest, &row, &e2) == 0)
            msg->code_size = row.size;
        else
            log_warn("code archive %s of an assignment is not available: %s", digest, e2.message);
        store_conn_put(s->store, c);
    }
}
