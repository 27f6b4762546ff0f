/* transfer.c - the agent's transfers with kilnd's artifact store, each on a thread of its own so
 * that no transfer holds up another job or the agent's reports: when rank 0 of an attempt exits,
 * its output directory is uploaded (BeginArtifacts, then PutArtifactChunk from the offset kilnd
 * holds durably, so an upload cut by a kilnd restart continues where it stopped; SHA-256 per
 * chunk and per file; retries with backoff while kilnd is unreachable) and only then is the
 * rank's exit queued; and an assignment that starts from another job's model has that model
 * fetched (FetchInitModel) and checked against its SHA-256 before its ranks start. Problems are
 * told in the job's log ("[kiln-agent] ..."). The same upload, of kind CHECKPOINT, syncs a job's
 * checkpoint directory while it runs, as a tree of files named by relative path (xfer_ckpt_sync,
 * called by ckpt_sync.c), and the assignment of a later attempt has the synced tree restored into
 * its checkpoint directory (FetchCheckpoint) before its ranks start. The model, a checkpoint file
 * and a script job's code archive are fetched by one chunked download (download). */
#include "agent/agent_int.h"
#include "code/code.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XFER_MAX_THREADS 8           /* transfers at once; more wait their turn */
#define XFER_RPC_TIMEOUT_MS 30000
#define XFER_CHUNK_DEFAULT (AGENT_UPLOAD_CHUNK_KB << 10)
#define XFER_MAX_RESTARTS 50         /* BeginArtifacts again after an offset mismatch */
#define XFER_MAX_DATA_LOSS 5         /* checksum refusals before an upload gives up */
#define XFER_INTERNAL_TRIES 30       /* INTERNAL/UNKNOWN answers before a call gives up */

static const char k_begin[] = "/kiln.AgentService/BeginArtifacts";
static const char k_chunk[] = "/kiln.AgentService/PutArtifactChunk";
static const char k_fetch[] = "/kiln.AgentService/FetchInitModel";
static const char k_code[] = "/kiln.AgentService/FetchCode";
static const char k_ckpt[] = "/kiln.AgentService/FetchCheckpoint";

typedef enum { TASK_UPLOAD, TASK_FETCH } task_kind_t;

/* An exit queued behind rank 0's upload (xfer_defer_exit). */
typedef struct later_exit {
    struct later_exit *next;
    int rank, exit_code, sig;
    pid_t pid;
    char reason[AGENT_REASON_MAX];
} later_exit_t;

typedef struct task {
    struct task *next;
    task_kind_t kind;
    char job_id[64];
    int attempt;
    int rank, exit_code, sig;    /* TASK_UPLOAD: the exit to report afterwards */
    pid_t pid;
    char reason[AGENT_REASON_MAX];
    Kiln__Assignment *a;         /* TASK_FETCH: owned copy */
    bool cancelled;              /* TASK_FETCH: a stop order came */
    later_exit_t *later;         /* TASK_UPLOAD: other ranks' exits to report after this one's */
    bool reported;               /* TASK_UPLOAD: the exits are queued; nothing more attaches */
} task_t;

struct xfer {
    xfer_env_t env;
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* wakes backoff waits on stop, and the shutdown on thread exit */
    task_t *queue;               /* waiting for a thread */
    task_t *active;              /* being worked on */
    int threads;
    bool stopping, shut;
    int chunk_bytes;             /* env->chunk_bytes, else 1 MiB (capped by kilnd's answer) */
    int delay_ms;                /* env->delay_ms: a pause after each chunk (tests) */
};

void xfer_init_model_path(const char *work_dir, const char *job_id, char *out, size_t n)
{
    snprintf(out, n, "%s/jobs/%s/init/%s", work_dir, job_id, KILN_ARTIFACT_MODEL);
}

/* ---- the output directory ------------------------------------------------------------------- */

static void note_add(char *notes, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void note_add(char *notes, size_t n, const char *fmt, ...)
{
    size_t len = strlen(notes);
    if (!n || len + 1 >= n)
        return;
    if (len)
        notes[len++] = '\n', notes[len] = '\0';
    /* one note a line: a file name the job chose (with a newline, an escape sequence) is shown
     * escaped, not as a line or a terminal command of its own */
    char note[1024];
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(note, sizeof(note), fmt, ap);
    va_end(ap);
    if (m > 0)
        kiln_text_escape(notes + len, n - len, note, KILN_MIN((size_t)m, sizeof(note) - 1), 0);
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void agent_output_free(agent_out_file_t *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        if (v[i].fd >= 0)
            close(v[i].fd);
    free(v);
}

/* What a scan has found so far. */
typedef struct scan_acc {
    agent_out_file_t *v;
    size_t n, cap;
    bool full;                   /* AGENT_MAX_ARTIFACTS reached and told */
    char *notes;
    size_t notes_n;
} scan_acc_t;

/* The names in the directory dfd, sorted (NULL entries never; *nn their count; caller frees). */
static int read_names(int dfd, char ***out, size_t *nn, kiln_err_t *err)
{
    *out = NULL;
    *nn = 0;
    int fd = dup(dfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return kiln_err_set(err, KILN_EIO, NULL, "could not read a directory to upload: %s", strerror(errno));
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 32;
            char **nv = realloc(names, cap * sizeof(*names));
            if (!nv) {
                rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
                break;
            }
            names = nv;
        }
        if (!(names[n] = strdup(de->d_name))) {
            rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
            break;
        }
        n++;
    }
    closedir(d);
    if (n > 1)
        qsort(names, n, sizeof(*names), name_cmp);
    *out = names;
    *nn = n;
    return rc;
}

/* Adds the qualifying files of the directory dfd, whose path in the tree is prefix ("" at the
 * top), to acc; below it too (tree, at most KILN_ARTIFACT_PATH_DEPTH names deep). Every entry is
 * opened relative to its directory and never through a link, so nothing outside the tree is read. */
static int scan_dir(int dfd, const char *prefix, bool tree, int depth, scan_acc_t *acc, kiln_err_t *err)
{
    char **names = NULL;
    size_t nn = 0;
    int rc = read_names(dfd, &names, &nn, err);
    for (size_t i = 0; rc == 0 && i < nn && !acc->full; i++) {
        const char *name = names[i];
        char path[KILN_ARTIFACT_PATH_MAX + 2];
        int plen = snprintf(path, sizeof(path), "%s%s%s", prefix, *prefix ? "/" : "", name);
        kiln_err_t e2;
        if (!kiln_artifact_name_ok(name, "name", &e2) ||
            (tree && (plen >= (int)sizeof(path) || !kiln_artifact_path_ok(path, "name", &e2)))) {
            note_add(acc->notes, acc->notes_n, "skipped \"%.80s%s%.80s\": not a name %s may have (%s)", prefix,
                     *prefix ? "/" : "", name, tree ? "checkpoint files" : "artifacts", e2.message);
            continue;
        }
        /* No following a link out of the directory, and not blocking on a FIFO a job left. */
        int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        struct stat st;
        if (fd < 0) {
            note_add(acc->notes, acc->notes_n, "skipped \"%s\": %s", path,
                     errno == ELOOP ? "a symbolic link" : strerror(errno));
            continue;
        }
        if (fstat(fd, &st) != 0) {
            note_add(acc->notes, acc->notes_n, "skipped \"%s\": %s", path, strerror(errno));
            close(fd);
            continue;
        }
        if (S_ISDIR(st.st_mode) && tree && depth + 1 < KILN_ARTIFACT_PATH_DEPTH) {
            rc = scan_dir(fd, path, tree, depth + 1, acc, err);
            close(fd);
            continue;
        }
        if (!S_ISREG(st.st_mode) || st.st_nlink != 1) {
            note_add(acc->notes, acc->notes_n, "skipped \"%s\": %s", path,
                     S_ISDIR(st.st_mode) ? (tree ? "a directory too deep" : "a directory (only files at the top are kept)")
                     : S_ISREG(st.st_mode) ? "it has other hard links"
                                           : "not a regular file");
            close(fd);
            continue;
        }
        if (acc->n == AGENT_MAX_ARTIFACTS) {
            note_add(acc->notes, acc->notes_n, "skipped \"%s\" and the rest: at most %d files are kept", path,
                     AGENT_MAX_ARTIFACTS);
            acc->full = true;
            close(fd);
            break;
        }
        if (acc->n == acc->cap) {
            size_t cap = acc->cap ? acc->cap * 2 : 16;
            agent_out_file_t *nv = realloc(acc->v, cap * sizeof(*nv));
            if (!nv) {
                close(fd);
                rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
                break;
            }
            acc->v = nv;
            acc->cap = cap;
        }
        agent_out_file_t *f = &acc->v[acc->n];
        kiln_strlcpy(f->name, path, sizeof(f->name));
        f->fd = fd;
        if ((rc = kiln_sha256_fd(fd, &f->size, f->sha256, err)) != 0) {
            close(fd);
            break;
        }
        acc->n++;
    }
    for (size_t i = 0; i < nn; i++)
        free(names[i]);
    free(names);
    return rc;
}

static int scan(const char *dir, bool tree, agent_out_file_t **out, size_t *n, char *notes, size_t notes_n,
                kiln_err_t *err)
{
    *out = NULL;
    *n = 0;
    if (notes_n)
        notes[0] = '\0';
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return errno == ENOENT ? 0 : kiln_err_set(err, KILN_EIO, NULL, "could not open the %s directory: %s",
                                                  tree ? "checkpoint" : "output", strerror(errno));
    scan_acc_t acc = {.notes = notes, .notes_n = notes_n};
    int rc = scan_dir(dfd, "", tree, 0, &acc, err);
    close(dfd);
    if (rc == 0 && !acc.v && !(acc.v = calloc(1, sizeof(*acc.v))))
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    if (rc) {
        agent_output_free(acc.v, acc.n);
        return rc;
    }
    *out = acc.v;
    *n = acc.n;
    return 0;
}

int agent_output_scan(const char *dir, agent_out_file_t **out, size_t *n, char *notes, size_t notes_n,
                      kiln_err_t *err)
{
    return scan(dir, false, out, n, notes, notes_n, err);
}

int agent_tree_scan(const char *dir, agent_out_file_t **out, size_t *n, char *notes, size_t notes_n, kiln_err_t *err)
{
    return scan(dir, true, out, n, notes, notes_n, err);
}

/* ---- calls ------------------------------------------------------------------------------------ */

static bool xfer_stopping(xfer_t *x)
{
    pthread_mutex_lock(&x->mu);
    bool s = x->stopping;
    pthread_mutex_unlock(&x->mu);
    return s;
}

/* Sleeps ms, or less when the transfers are stopping. */
static void xfer_wait(xfer_t *x, int ms)
{
    struct timespec ts;
    kiln_deadline_in(&ts, ms);
    pthread_mutex_lock(&x->mu);
    while (!x->stopping)
        if (pthread_cond_timedwait(&x->cv, &x->mu, &ts) != 0)
            break;
    pthread_mutex_unlock(&x->mu);
}

/* One call, its worker_id field set to this worker, retried with backoff (100 ms doubling to 5 s) while kilnd is unreachable or
 * restarting and while the agent registers again; KILN_ECANCELED once the transfers stop. */
static int xfer_call(xfer_t *x, const task_t *t, const char *method, ProtobufCMessage *req,
                     const ProtobufCMessageDescriptor *desc, ProtobufCMessage **resp, int *code, kiln_err_t *err)
{
    int backoff = 100, fails = 0;
    for (;;) {
        if (xfer_stopping(x))
            return kiln_err_set(err, KILN_ECANCELED, NULL, "the agent is shutting down");
        char bearer[AGENT_SECRET_MAX + 8];
        agent_md_t md[1];
        size_t n_md = x->env.auth_md(x->env.ud, bearer, md);
        /* every request names the worker (the first field of each message) */
        char wid[128];
        x->env.worker_id(x->env.ud, wid, sizeof(wid));
        const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(req->descriptor,
                                                                                             "worker_id");
        if (f && f->type == PROTOBUF_C_TYPE_STRING)
            *(char **)((char *)req + f->offset) = wid;
        *code = 0;
        int rc = agent_rpc_call(x->env.rpc, method, md, n_md, req, desc, XFER_RPC_TIMEOUT_MS, resp, code, err);
        memset(bearer, 0, sizeof(bearer));
        if (rc == 0)
            return 0;
        if (*code == GRPC_UNAUTHENTICATED)
            x->env.unauthenticated(x->env.ud, "transfer", err);
        else if (!kiln_grpc_retryable(*code) ||
                 ((*code == 13 || *code == 2) && fails >= XFER_INTERNAL_TRIES))
            return rc;
        if (fails++ % 20 == 0)
            log_warn("job %s: %s failed: %s (will retry)", t->job_id, strrchr(method, '/') + 1, err->message);
        xfer_wait(x, backoff);
        backoff = KILN_MIN(backoff * 2, 5000);
    }
}

/* A line of the agent's ("[kiln-agent] " and fmt's text) in the job's log, on rank's stream. */
static void job_note_v(xfer_t *x, const char *job_id, int attempt, int rank, int stream, const char *fmt, va_list ap)
    __attribute__((format(printf, 6, 0)));
static void job_note_v(xfer_t *x, const char *job_id, int attempt, int rank, int stream, const char *fmt, va_list ap)
{
    char line[1200];
    int n = snprintf(line, sizeof(line), "[kiln-agent] ");
    vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    ob_add_line(x->env.ob, job_id, attempt, rank, stream, kiln_now_us(), line, strlen(line));
}

/* A line of the agent's in the job's log, on rank t->rank's stream. */
static void job_note(xfer_t *x, const task_t *t, int stream, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void job_note(xfer_t *x, const task_t *t, int stream, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    job_note_v(x, t->job_id, t->attempt, t->rank, stream, fmt, ap);
    va_end(ap);
}

/* ---- upload ----------------------------------------------------------------------------------- */

typedef struct up_state {
    agent_out_file_t *files;
    size_t n;
    int64_t *offset;             /* per file, as kilnd last said */
    bool *complete;
    int max_chunk;
    Kiln__ArtifactKind kind;     /* OUTPUT: the job's artifacts; CHECKPOINT: its checkpoint directory */
    bool committed;              /* CHECKPOINT: kilnd's last answer made the manifest the synced state */
} up_state_t;

/* BeginArtifacts: records what kilnd holds of each file. */
static int up_begin(xfer_t *x, const task_t *t, up_state_t *u, kiln_err_t *err)
{
    Kiln__ArtifactManifest m = KILN__ARTIFACT_MANIFEST__INIT;
    Kiln__ArtifactFile *files = calloc(KILN_MAX(u->n, 1), sizeof(*files));
    Kiln__ArtifactFile **fp = calloc(KILN_MAX(u->n, 1), sizeof(*fp));
    if (!files || !fp) {
        free(files);
        free(fp);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    for (size_t i = 0; i < u->n; i++) {
        kiln__artifact_file__init(&files[i]);
        files[i].name = u->files[i].name;
        files[i].size = u->files[i].size;
        files[i].sha256 = u->files[i].sha256;
        fp[i] = &files[i];
    }
    m.job_id = (char *)t->job_id;
    m.attempt = t->attempt;
    m.n_files = u->n;
    m.files = fp;
    m.kind = u->kind;
    ProtobufCMessage *resp = NULL;
    int code = 0;
    int rc = xfer_call(x, t, k_begin, &m.base, &kiln__artifact_manifest_reply__descriptor, &resp, &code, err);
    free(files);
    free(fp);
    if (rc)
        return rc;
    Kiln__ArtifactManifestReply *r = (Kiln__ArtifactManifestReply *)resp;
    if (r->n_files != u->n) {
        protobuf_c_message_free_unpacked(resp, NULL);
        return kiln_err_set(err, KILN_EFORMAT, NULL, "kilnd answered the manifest with %zu files, not %zu", r->n_files,
                            u->n);
    }
    for (size_t i = 0; i < u->n; i++) {
        const Kiln__ArtifactOffset *o = r->files[i];
        u->offset[i] = o && o->offset >= 0 && o->offset <= u->files[i].size ? o->offset : 0;
        u->complete[i] = o && o->complete;
    }
    u->max_chunk = r->max_chunk_bytes > 0 ? r->max_chunk_bytes : XFER_CHUNK_DEFAULT;
    u->committed = r->committed;
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}

/* Sends file i from its offset to its end. Returns 0, or the failing call's status with *code
 * its gRPC code (FAILED_PRECONDITION and DATA_LOSS: begin again). */
static int up_file(xfer_t *x, const task_t *t, up_state_t *u, size_t i, uint8_t *buf, int *code, kiln_err_t *err)
{
    agent_out_file_t *f = &u->files[i];
    int chunk = KILN_MIN(x->chunk_bytes, u->max_chunk);
    if (u->offset[i] > 0)
        log_info("job %s: resuming the upload of \"%s\" at byte %lld of %lld", t->job_id, f->name,
                 (long long)u->offset[i], (long long)f->size);
    while (u->offset[i] < f->size) {
        int64_t off = u->offset[i];
        size_t len = (size_t)KILN_MIN((int64_t)chunk, f->size - off);
        size_t got = 0;
        while (got < len) {
            ssize_t r = pread(f->fd, buf + got, len - got, (off_t)(off + (int64_t)got));
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                *code = 0;
                return kiln_err_set(err, KILN_EIO, NULL, "could not read \"%s\": %s", f->name,
                                    r < 0 ? strerror(errno) : "the file got shorter");
            }
            got += (size_t)r;
        }
        char sha[KILN_SHA256_HEX];
        kiln_sha256_hex(buf, len, sha);
        Kiln__ArtifactChunk c = KILN__ARTIFACT_CHUNK__INIT;
        c.job_id = (char *)t->job_id;
        c.attempt = t->attempt;
        c.name = f->name;
        c.offset = off;
        c.data.data = buf;
        c.data.len = len;
        c.sha256 = sha;
        c.kind = u->kind;
        ProtobufCMessage *resp = NULL;
        int rc = xfer_call(x, t, k_chunk, &c.base, &kiln__artifact_chunk_reply__descriptor, &resp, code, err);
        if (rc)
            return rc;
        Kiln__ArtifactChunkReply *r = (Kiln__ArtifactChunkReply *)resp;
        u->offset[i] = r->offset >= off && r->offset <= f->size ? r->offset : off + (int64_t)len;
        u->complete[i] = r->complete;
        protobuf_c_message_free_unpacked(resp, NULL);
        if (x->delay_ms > 0 && u->offset[i] < f->size)
            xfer_wait(x, x->delay_ms);
    }
    return 0;
}

/* Begins the upload and sends every file kilnd does not hold whole, beginning again when kilnd
 * asks for it (offsets moved, a chunk damaged on the way). */
static int up_run(xfer_t *x, const task_t *t, up_state_t *u, uint8_t *buf, kiln_err_t *err)
{
    int restarts = 0, losses = 0, rc = 0, code = 0;
    for (;;) {
        rc = up_begin(x, t, u, err);
        for (size_t i = 0; rc == 0 && i < u->n; i++)
            if (!u->complete[i])
                rc = up_file(x, t, u, i, buf, &code, err);
        if (rc == 0)
            return 0;
        if (code == GRPC_DATA_LOSS && ++losses < XFER_MAX_DATA_LOSS) {
            log_warn("job %s: kilnd refused an upload: %s; sending it again", t->job_id, err->message);
            continue;
        }
        if (code == GRPC_FAILED_PRECONDITION && ++restarts < XFER_MAX_RESTARTS) {
            log_info("job %s: %s; asking kilnd for the offsets again", t->job_id, err->message);
            continue;
        }
        return rc;
    }
}

/* Uploads the output directory; says in the job's log what was kept or why not. */
static void upload(xfer_t *x, const task_t *t)
{
    char dir[PATH_MAX], notes[2048];
    snprintf(dir, sizeof(dir), "%s/jobs/%s/output", x->env.work_dir, t->job_id);
    up_state_t u = {0};
    kiln_err_t err;
    kiln_err_clear(&err);
    uint8_t *buf = NULL;
    char job_dir[PATH_MAX];
    snprintf(job_dir, sizeof(job_dir), "%s/jobs/%s", x->env.work_dir, t->job_id);
    agent_output_pack_trees(job_dir, notes, sizeof(notes));
    for (char *line = notes, *nl; *line; line = nl ? nl + 1 : line + strlen(line)) {
        nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        job_note(x, t, AGENT_STREAM_STDERR, "artifacts: %s", line);
    }
    if (agent_output_scan(dir, &u.files, &u.n, notes, sizeof(notes), &err) != 0) {
        job_note(x, t, AGENT_STREAM_STDERR, "artifacts not kept: %s", err.message);
        return;
    }
    for (char *line = notes, *nl; *line; line = nl ? nl + 1 : line + strlen(line)) {
        nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        job_note(x, t, AGENT_STREAM_STDERR, "artifacts: %s", line);
    }
    if (u.n == 0)
        goto done;
    int64_t total = 0;
    for (size_t i = 0; i < u.n; i++)
        total += u.files[i].size;
    u.offset = calloc(u.n, sizeof(*u.offset));
    u.complete = calloc(u.n, sizeof(*u.complete));
    buf = malloc((size_t)x->chunk_bytes); /* chunks are at most that, whatever kilnd allows */
    if (!u.offset || !u.complete || !buf) {
        job_note(x, t, AGENT_STREAM_STDERR, "artifacts not kept: the agent ran out of memory");
        goto done;
    }
    int64_t t0 = kiln_mono_us();
    int rc = up_run(x, t, &u, buf, &err);
    if (rc == 0) {
        job_note(x, t, AGENT_STREAM_STDOUT, "artifacts: %zu file(s), %lld bytes, kept by kilnd (%.1f s)", u.n,
                 (long long)total, (kiln_mono_us() - t0) / 1e6);
        log_info("job %s: uploaded %zu artifact(s), %lld bytes", t->job_id, u.n, (long long)total);
    } else {
        job_note(x, t, AGENT_STREAM_STDERR, "artifacts not kept: %s%s%s", err.message, err.hint[0] ? "; " : "",
                 err.hint);
        log_warn("job %s: artifacts not uploaded: %s", t->job_id, err.message);
    }
done:
    free(buf);
    free(u.offset);
    free(u.complete);
    agent_output_free(u.files, u.n);
}

void xfer_ckpt_dir(const char *work_dir, const char *job_id, char *out, size_t n)
{
    snprintf(out, n, "%s/jobs/%s/checkpoints", work_dir, job_id);
}

/* <work_dir>/jobs/<job_id>/checkpoints.attempt: the attempt whose rank 0 last ran here, so whose
 * checkpoints the directory holds (beside it, so that no rank sees it and nothing syncs it). */
static void ckpt_attempt_path(const char *work_dir, const char *job_id, char *out, size_t n)
{
    snprintf(out, n, "%s/jobs/%s/checkpoints.attempt", work_dir, job_id);
}

void xfer_ckpt_attempt_set(const char *work_dir, const char *job_id, int attempt)
{
    char path[PATH_MAX], text[32];
    ckpt_attempt_path(work_dir, job_id, path, sizeof(path));
    int len = snprintf(text, sizeof(text), "%d\n", attempt);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, text, (size_t)len) != len)
        log_warn("job %s: could not record that attempt %d checkpoints here: %s", job_id, attempt, strerror(errno));
    if (fd >= 0)
        close(fd);
}

/* The attempt ckpt_attempt_path records (0: none). */
static int ckpt_attempt_get(const char *work_dir, const char *job_id)
{
    char path[PATH_MAX], text[32] = "";
    ckpt_attempt_path(work_dir, job_id, path, sizeof(path));
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, text, sizeof(text) - 1);
    close(fd);
    text[n > 0 ? n : 0] = '\0';
    return atoi(text);
}

int xfer_ckpt_sync(xfer_t *x, const char *job_id, int attempt, int64_t *bytes, size_t *files, kiln_err_t *err)
{
    char dir[PATH_MAX], notes[2048];
    xfer_ckpt_dir(x->env.work_dir, job_id, dir, sizeof(dir));
    task_t t = {.kind = TASK_UPLOAD, .attempt = attempt};
    kiln_strlcpy(t.job_id, job_id, sizeof(t.job_id));
    up_state_t u = {.kind = KILN__ARTIFACT_KIND__ARTIFACT_KIND_CHECKPOINT};
    uint8_t *buf = NULL;
    *bytes = 0;
    *files = 0;
    /* a directory that is gone is no empty state: kilnd keeps the one it has */
    struct stat st;
    if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return kiln_err_set(err, KILN_ENOTFOUND, NULL, "the checkpoint directory %s is gone", dir);
    /* the tree; what cannot be synced (a link, a name no checkpoint file may have) stays out */
    int rc = agent_tree_scan(dir, &u.files, &u.n, notes, sizeof(notes), err);
    if (rc)
        return rc;
    u.offset = calloc(KILN_MAX(u.n, 1), sizeof(*u.offset));
    u.complete = calloc(KILN_MAX(u.n, 1), sizeof(*u.complete));
    buf = malloc((size_t)x->chunk_bytes);
    if (!u.offset || !u.complete || !buf)
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    if (rc == 0)
        rc = up_run(x, &t, &u, buf, err);
    /* every content is whole now: beginning once more makes the manifest the synced state */
    if (rc == 0 && !u.committed)
        rc = up_begin(x, &t, &u, err);
    if (rc == 0 && !u.committed)
        rc = kiln_err_set(err, KILN_ESTATE, NULL, "kilnd does not hold every file of the checkpoint directory whole "
                          "after they were sent");
    for (size_t i = 0; rc == 0 && i < u.n; i++)
        *bytes += u.files[i].size;
    if (rc == 0)
        *files = u.n;
    free(buf);
    free(u.offset);
    free(u.complete);
    agent_output_free(u.files, u.n);
    return rc;
}

void xfer_job_note(xfer_t *x, const char *job_id, int attempt, int stream, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    job_note_v(x, job_id, attempt, 0, stream, fmt, ap);
    va_end(ap);
}

/* ---- fetch -------------------------------------------------------------------------------------- */

/* Whether the file name under dfd holds exactly size bytes with this SHA-256 (never through a link). */
static bool file_matches_at(int dfd, const char *name, int64_t size, const char *sha)
{
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return false;
    int64_t got = -1;
    char h[KILN_SHA256_HEX];
    kiln_err_t err;
    bool ok = kiln_sha256_fd(fd, &got, h, &err) == 0 && got == size && !strcmp(h, sha);
    close(fd);
    return ok;
}

/* A chunk as FetchInitModel, FetchCheckpoint and FetchCode answer it. */
typedef struct dl_chunk {
    int64_t size, offset;
    const char *sha256;          /* the whole file's (the code archive's digest) */
    ProtobufCBinaryData data;
} dl_chunk_t;

/* One file fetched from kilnd a chunk at a time (download). */
typedef struct dl {
    const char *what;            /* for messages: "the model", "checkpoint file \"x\"" */
    const char *method;
    ProtobufCMessage *req;       /* the request, its offset set through req_offset for each chunk */
    int64_t *req_offset;
    const ProtobufCMessageDescriptor *resp_desc;
    void (*view)(const ProtobufCMessage *resp, dl_chunk_t *out);
    int64_t size;                /* what the file must be; -1: what kilnd's first answer says */
    char sha256[KILN_SHA256_HEX]; /* likewise; "": what kilnd's first answer says */
    bool verify;                 /* fsync what was written and check it against size and sha256 */
} dl_t;

static void view_model(const ProtobufCMessage *m, dl_chunk_t *c)
{
    const Kiln__InitModelChunk *r = (const Kiln__InitModelChunk *)m;
    *c = (dl_chunk_t){.size = r->size, .offset = r->offset, .sha256 = r->sha256, .data = r->data};
}

static void view_ckpt(const ProtobufCMessage *m, dl_chunk_t *c)
{
    const Kiln__CheckpointChunk *r = (const Kiln__CheckpointChunk *)m;
    *c = (dl_chunk_t){.size = r->size, .offset = r->offset, .sha256 = r->sha256, .data = r->data};
}

static void view_code(const ProtobufCMessage *m, dl_chunk_t *c)
{
    const Kiln__CodeChunk *r = (const Kiln__CodeChunk *)m;
    *c = (dl_chunk_t){.size = r->size, .offset = r->offset, .sha256 = r->digest, .data = r->data};
}

/* Writes the file d names into fd from offset 0, chunk by chunk, until a stop order for t. Every
 * answer must agree with the others and with what d expects (a stored file never changes). */
static int download(xfer_t *x, const task_t *t, dl_t *d, int fd, kiln_err_t *err)
{
    int64_t off = 0;
    int rc = 0;
    for (bool first = true; rc == 0 && (d->size < 0 || off < d->size); first = false) {
        pthread_mutex_lock(&x->mu);
        bool cancelled = t->cancelled;
        pthread_mutex_unlock(&x->mu);
        if (cancelled)
            return kiln_err_set(err, KILN_ECANCELED, NULL, "stopped");
        *d->req_offset = off;
        ProtobufCMessage *resp = NULL;
        int code = 0;
        if ((rc = xfer_call(x, t, d->method, d->req, d->resp_desc, &resp, &code, err)))
            break;
        dl_chunk_t c;
        d->view(resp, &c);
        const char *sha = c.sha256 ? c.sha256 : "";
        if (first && d->size < 0)
            d->size = c.size;
        if (first && !d->sha256[0])
            kiln_strlcpy(d->sha256, sha, sizeof(d->sha256));
        if (c.size != d->size || strcmp(sha, d->sha256) != 0 || c.offset != off || (c.data.len == 0 && off < d->size) ||
            (int64_t)c.data.len > d->size - off)
            rc = kiln_err_set(err, KILN_EFORMAT, NULL, "kilnd's answers about %s do not agree with each other or with "
                              "the assignment", d->what);
        else if (pwrite(fd, c.data.data, c.data.len, (off_t)off) != (ssize_t)c.data.len)
            rc = kiln_err_set(err, KILN_EIO, NULL, "could not write %s: %s", d->what, strerror(errno));
        else
            off += (int64_t)c.data.len;
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    if (rc || !d->verify)
        return rc;
    char got[KILN_SHA256_HEX];
    int64_t n = 0;
    rc = fsync(fd) == 0 ? kiln_sha256_fd(fd, &n, got, err) : kiln_err_set(err, KILN_EIO, NULL, "fsync failed");
    if (rc == 0 && (n != d->size || strcmp(got, d->sha256) != 0))
        rc = kiln_err_set(err, KILN_ECHECKSUM, NULL, "%s arrived damaged: its SHA-256 is %.16s..., not %.16s...",
                          d->what, got, d->sha256);
    return rc;
}

/* Downloads d into name under dfd through tmp there (a name nothing syncs or serves), then puts
 * it in place. */
static int download_as(xfer_t *x, const task_t *t, dl_t *d, int dfd, const char *tmp, const char *name,
                       kiln_err_t *err)
{
    int fd = openat(dfd, tmp, O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not write %s: %s", d->what, strerror(errno));
    int rc = download(x, t, d, fd, err);
    close(fd);
    if (rc == 0 && renameat(dfd, tmp, dfd, name) != 0)
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not put %s in place: %s", d->what, strerror(errno));
    if (rc)
        unlinkat(dfd, tmp, 0);
    return rc;
}

static int fetch(xfer_t *x, const task_t *t, kiln_err_t *err)
{
    const Kiln__Assignment *a = t->a;
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s/jobs/%s/init", x->env.work_dir, t->job_id);
    const char *want_sha = a->init_from_sha256 ? a->init_from_sha256 : "";
    bool known = kiln_sha256_hex_ok(want_sha);
    int rc = kiln_mkdirs_mode(dir, 0700, err);
    if (rc)
        return rc;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not open %s: %s", dir, strerror(errno));
    if (known && file_matches_at(dfd, KILN_ARTIFACT_MODEL, a->init_from_size, want_sha)) {
        close(dfd);
        return 0; /* an earlier attempt fetched it */
    }
    Kiln__InitModelRequest req = KILN__INIT_MODEL_REQUEST__INIT;
    req.job_id = (char *)t->job_id;
    req.attempt = t->attempt;
    req.max_bytes = 1 << 20;
    dl_t d = {.what = "the model", .method = k_fetch, .req = &req.base, .req_offset = &req.offset,
              .resp_desc = &kiln__init_model_chunk__descriptor, .view = view_model,
              .size = known ? a->init_from_size : -1, .verify = true};
    if (known)
        kiln_strlcpy(d.sha256, want_sha, sizeof(d.sha256));
    rc = download_as(x, t, &d, dfd, KILN_ARTIFACT_MODEL ".part", KILN_ARTIFACT_MODEL, err);
    close(dfd);
    if (rc == 0)
        log_info("job %s: fetched the model of job %s (%lld bytes, sha256 %s)", t->job_id, a->init_from_job,
                 (long long)d.size, d.sha256);
    return rc;
}

bool xfer_restores(const Kiln__Assignment *a)
{
    return a->n_checkpoint_files > 0 && !(a->checkpoint_dir && a->checkpoint_dir[0]);
}

bool xfer_needs_fetch(const Kiln__Assignment *a)
{
    return (a->init_from_job && a->init_from_job[0]) || xfer_restores(a);
}

/* The directory holding path's last name under root, made where missing, opened one name at a
 * time and never through a link (a link or file in the way of a directory is removed); *leaf is
 * that last name. Returns a descriptor, or -1 with errno set. */
static int open_parent(int root, const char *path, const char **leaf)
{
    int dfd = dup(root);
    for (const char *p = path; dfd >= 0;) {
        const char *slash = strchr(p, '/');
        if (!slash) {
            *leaf = p;
            return dfd;
        }
        char name[KILN_ARTIFACT_NAME_MAX + 1];
        size_t len = KILN_MIN((size_t)(slash - p), sizeof(name) - 1);
        memcpy(name, p, len);
        name[len] = '\0';
        int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0 && (errno == ENOTDIR || errno == ELOOP) && unlinkat(dfd, name, 0) == 0)
            errno = ENOENT;
        if (fd < 0 && errno == ENOENT && (mkdirat(dfd, name, 0700) == 0 || errno == EEXIST))
            fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int e = errno;
        close(dfd);
        errno = e;
        dfd = fd;
        p = slash + 1;
    }
    return -1;
}

/* Fetches file f of the synced checkpoint state to its path under root (through a temporary name
 * that no checkpoint file can have, so nothing syncs it), checked against its size and SHA-256. */
static int restore_file(xfer_t *x, const task_t *t, int root, const Kiln__ArtifactFile *f, kiln_err_t *err)
{
    const char *leaf = NULL;
    int dfd = open_parent(root, f->name, &leaf);
    if (dfd < 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not make the directory of checkpoint file \"%s\": %s", f->name,
                            strerror(errno));
    char what[KILN_ARTIFACT_PATH_MAX + 32], tmp[KILN_ARTIFACT_NAME_MAX + 32];
    snprintf(what, sizeof(what), "checkpoint file \"%s\"", f->name);
    snprintf(tmp, sizeof(tmp), ".%s.kiln-restore", leaf);
    int rc = 0;
    if (!file_matches_at(dfd, leaf, f->size, f->sha256)) { /* else this agent has it already */
        Kiln__CheckpointRequest req = KILN__CHECKPOINT_REQUEST__INIT;
        req.job_id = (char *)t->job_id;
        req.attempt = t->attempt;
        req.name = f->name;
        req.max_bytes = 1 << 20;
        dl_t d = {.what = what, .method = k_ckpt, .req = &req.base, .req_offset = &req.offset,
                  .resp_desc = &kiln__checkpoint_chunk__descriptor, .view = view_ckpt, .size = f->size,
                  .verify = true};
        kiln_strlcpy(d.sha256, f->sha256, sizeof(d.sha256));
        rc = download_as(x, t, &d, dfd, tmp, leaf, err);
    }
    close(dfd);
    return rc;
}

/* Removes from the directory dfd (prefix: its path in the tree, "" at the top) what the state a
 * names not: files and links that are not its files, directories that hold none of them. */
static void prune(const task_t *t, const char *dir, int dfd, const char *prefix, int depth)
{
    const Kiln__Assignment *a = t->a;
    char **names = NULL;
    size_t nn = 0;
    kiln_err_t err;
    if (read_names(dfd, &names, &nn, &err) != 0)
        log_warn("job %s: could not read its checkpoint directory: %s", t->job_id, err.message);
    for (size_t i = 0; i < nn; i++) {
        char path[KILN_ARTIFACT_PATH_MAX + 300];
        snprintf(path, sizeof(path), "%s%s%s", prefix, *prefix ? "/" : "", names[i]);
        size_t plen = strlen(path);
        bool file = false, holds = false;
        for (size_t k = 0; k < a->n_checkpoint_files && !file; k++) {
            const char *n = a->checkpoint_files[k]->name;
            file = !strcmp(n, path);
            holds = holds || (!strncmp(n, path, plen) && n[plen] == '/');
        }
        struct stat st;
        if (fstatat(dfd, names[i], &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (S_ISDIR(st.st_mode) && holds && depth + 1 < KILN_ARTIFACT_PATH_DEPTH) {
            int fd = openat(dfd, names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (fd >= 0) {
                prune(t, dir, fd, path, depth + 1);
                close(fd);
            }
            continue;
        }
        if (file && !S_ISDIR(st.st_mode))
            continue;
        char full[PATH_MAX + KILN_ARTIFACT_PATH_MAX + 300];
        snprintf(full, sizeof(full), "%s/%s", dir, path);
        /* a directory no file of the state is in, or one where a file of the state goes */
        if (S_ISDIR(st.st_mode) ? code_tree_remove(full) != 0 : unlinkat(dfd, names[i], 0) != 0)
            log_warn("job %s: could not remove \"%s\" from its checkpoint directory: %s", t->job_id, path,
                     strerror(errno));
    }
    for (size_t i = 0; i < nn; i++)
        free(names[i]);
    free(names);
}

/* Makes the job's checkpoint directory hold exactly the synced state the assignment names, as a
 * tree: what the state does not name removed first, then its files fetched where this agent
 * lacks them (or holds other bytes), their directories made as needed. Unless rank 0 of the
 * attempt that synced last (or of a later one) ran here: then the directory is as new as the
 * synced state or newer (a sync kilnd refused, one cut short), and stays as it is. */
static int restore(xfer_t *x, const task_t *t, kiln_err_t *err)
{
    const Kiln__Assignment *a = t->a;
    char dir[PATH_MAX];
    xfer_ckpt_dir(x->env.work_dir, t->job_id, dir, sizeof(dir));
    int here = ckpt_attempt_get(x->env.work_dir, t->job_id);
    if (here >= a->checkpoint_attempt) {
        /* this agent ran the attempt that synced last, or a later one: its own directory holds
         * all of that and perhaps more that never reached kilnd */
        log_info("job %s attempt %d: keeps the checkpoint directory attempt %d left here (kilnd's synced state is "
                 "attempt %d's)", t->job_id, t->attempt, here, a->checkpoint_attempt);
        return 0;
    }
    /* kilnd's answers are checked like any other input */
    for (size_t i = 0; i < a->n_checkpoint_files; i++) {
        const Kiln__ArtifactFile *f = a->checkpoint_files[i];
        if (!f)
            return kiln_err_set(err, KILN_EFORMAT, NULL, "the assignment lists an empty checkpoint file");
        if (!kiln_artifact_path_ok(f->name, "checkpoint_files.name", err))
            return KILN_EFORMAT;
        if (!kiln_sha256_hex_ok(f->sha256) || f->size < 0)
            return kiln_err_set(err, KILN_EFORMAT, NULL, "checkpoint file \"%s\": the assignment gives no usable "
                                "size and SHA-256", f->name);
    }
    int rc = kiln_mkdirs_mode(dir, 0700, err);
    if (rc)
        return rc;
    int root = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (root < 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not open %s: %s", dir, strerror(errno));
    prune(t, dir, root, "", 0);
    int64_t bytes = 0;
    for (size_t i = 0; rc == 0 && i < a->n_checkpoint_files; i++) {
        rc = restore_file(x, t, root, a->checkpoint_files[i], err);
        bytes += a->checkpoint_files[i]->size;
    }
    close(root);
    if (rc)
        return rc;
    log_info("job %s attempt %d: restored its synced checkpoint directory (%zu file(s), %lld bytes)", t->job_id,
             t->attempt, a->n_checkpoint_files, (long long)bytes);
    job_note(x, t, AGENT_STREAM_STDOUT, "checkpoints: restored %zu file(s), %lld bytes, as kilnd last synced them",
             a->n_checkpoint_files, (long long)bytes);
    return 0;
}

int xfer_code_fetch(void *ud, const agent_code_ref_t *ref, int fd, kiln_err_t *err)
{
    xfer_t *x = ud;
    task_t t = {.kind = TASK_FETCH, .attempt = ref->attempt};
    kiln_strlcpy(t.job_id, ref->job_id ? ref->job_id : "", sizeof(t.job_id));
    char what[64];
    snprintf(what, sizeof(what), "code archive %.16s...", ref->digest);
    Kiln__CodeRequest req = KILN__CODE_REQUEST__INIT;
    req.job_id = t.job_id;
    req.attempt = ref->attempt;
    req.max_bytes = 1 << 20;
    /* the caller checks the archive's SHA-256 as it extracts it */
    dl_t d = {.what = what, .method = k_code, .req = &req.base, .req_offset = &req.offset,
              .resp_desc = &kiln__code_chunk__descriptor, .view = view_code, .size = -1};
    kiln_strlcpy(d.sha256, ref->digest, sizeof(d.sha256));
    return download(x, &t, &d, fd, err);
}

/* ---- threads ----------------------------------------------------------------------------------- */

static void task_free(task_t *t)
{
    if (!t)
        return;
    if (t->a)
        kiln__assignment__free_unpacked(t->a, NULL);
    while (t->later) {
        later_exit_t *e = t->later;
        t->later = e->next;
        free(e);
    }
    free(t);
}

static void run_task(xfer_t *x, task_t *t)
{
    if (t->kind == TASK_UPLOAD) {
        /* the checkpoint directory's last state first: the next attempt restores it */
        if (x->env.ckpt_final)
            x->env.ckpt_final(x->env.ud, t->job_id, t->attempt);
        upload(x, t);
        /* rank 0's exit, then those that came while it uploaded, in the order they came */
        pthread_mutex_lock(&x->mu);
        ob_add_exit(x->env.ob, t->job_id, t->attempt, t->rank, t->pid, t->exit_code, t->sig, t->reason, false);
        for (const later_exit_t *e = t->later; e; e = e->next)
            ob_add_exit(x->env.ob, t->job_id, t->attempt, e->rank, e->pid, e->exit_code, e->sig, e->reason, false);
        t->reported = true;
        pthread_mutex_unlock(&x->mu);
        return;
    }
    kiln_err_t err;
    kiln_err_clear(&err);
    const char *what = "model.init_from";
    int rc = t->a->init_from_job && t->a->init_from_job[0] ? fetch(x, t, &err) : 0;
    if (rc == 0 && xfer_restores(t->a)) {
        what = "checkpoints";
        rc = restore(x, t, &err);
    }
    pthread_mutex_lock(&x->mu);
    bool cancelled = t->cancelled;
    pthread_mutex_unlock(&x->mu);
    if (cancelled) {
        log_info("job %s attempt %d: stopped before it started", t->job_id, t->attempt);
        return;
    }
    if (rc == KILN_ECANCELED || x->env.draining(x->env.ud)) {
        ob_add_status(x->env.ob, t->job_id, t->attempt, false, "the agent is shutting down", OB_FAULT_SHUTDOWN, 0);
        return;
    }
    if (rc) {
        char reason[AGENT_REASON_MAX];
        if (!strcmp(what, "checkpoints"))
            snprintf(reason, sizeof(reason), "could not restore the checkpoint directory kilnd synced: %s",
                     err.message);
        else
            snprintf(reason, sizeof(reason), "could not fetch model.init_from (the model of job %s): %s",
                     t->a->init_from_job, err.message);
        log_error("job %s attempt %d: not started: %s", t->job_id, t->attempt, reason);
        ob_add_status(x->env.ob, t->job_id, t->attempt, false, reason, OB_FAULT_JOB, 0);
        return;
    }
    x->env.start(x->env.ud, t->a);
}

static void *xfer_main(void *arg)
{
    xfer_t *x = arg;
    pthread_mutex_lock(&x->mu);
    for (;;) {
        task_t *t = x->queue;
        if (!t)
            break;
        x->queue = t->next;
        t->next = x->active;
        x->active = t;
        pthread_mutex_unlock(&x->mu);
        run_task(x, t);
        pthread_mutex_lock(&x->mu);
        for (task_t **pp = &x->active; *pp; pp = &(*pp)->next)
            if (*pp == t) {
                *pp = t->next;
                break;
            }
        task_free(t);
    }
    x->threads--;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

/* Queues t and makes sure a thread will take it. Caller holds x->mu. */
static void enqueue_locked(xfer_t *x, task_t *t)
{
    task_t **pp = &x->queue;
    while (*pp)
        pp = &(*pp)->next;
    *pp = t;
    if (x->threads >= XFER_MAX_THREADS)
        return;
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &attr, xfer_main, x) == 0)
        x->threads++;
    else if (x->threads == 0)
        log_error("could not start a transfer thread; the transfer waits for the next one");
    pthread_attr_destroy(&attr);
}

void xfer_rank0_exit(xfer_t *x, const char *job_id, int attempt, int rank, pid_t pid, int exit_code, int sig,
                     const char *reason)
{
    task_t *t = calloc(1, sizeof(*t));
    pthread_mutex_lock(&x->mu);
    bool shut = x->shut;
    if (t && !shut) {
        t->kind = TASK_UPLOAD;
        kiln_strlcpy(t->job_id, job_id, sizeof(t->job_id));
        t->attempt = attempt;
        t->rank = rank;
        t->pid = pid;
        t->exit_code = exit_code;
        t->sig = sig;
        kiln_strlcpy(t->reason, reason ? reason : "", sizeof(t->reason));
        enqueue_locked(x, t);
    }
    pthread_mutex_unlock(&x->mu);
    if (!t || shut) {
        /* no way to upload: the exit must still be reported */
        free(t);
        ob_add_exit(x->env.ob, job_id, attempt, rank, pid, exit_code, sig, reason, false);
    }
}

bool xfer_defer_exit(xfer_t *x, const char *job_id, int attempt, int rank, pid_t pid, int exit_code, int sig,
                     const char *reason)
{
    later_exit_t *e = calloc(1, sizeof(*e));
    if (!e)
        return false;
    e->rank = rank;
    e->pid = pid;
    e->exit_code = exit_code;
    e->sig = sig;
    kiln_strlcpy(e->reason, reason ? reason : "", sizeof(e->reason));
    bool kept = false;
    pthread_mutex_lock(&x->mu);
    for (int list = 0; list < 2 && !kept; list++)
        for (task_t *t = list ? x->active : x->queue; t; t = t->next) {
            if (t->kind != TASK_UPLOAD || t->reported || t->attempt != attempt || strcmp(t->job_id, job_id))
                continue;
            later_exit_t **pp = &t->later;
            while (*pp)
                pp = &(*pp)->next;
            *pp = e;
            kept = true;
            break;
        }
    pthread_mutex_unlock(&x->mu);
    if (!kept)
        free(e);
    return kept;
}

static bool same_assignment(const task_t *t, const char *job_id, int attempt)
{
    return t->kind == TASK_FETCH && !strcmp(t->job_id, job_id) && (attempt == 0 || t->attempt == attempt);
}

void xfer_fetch_and_start(xfer_t *x, const Kiln__Assignment *a)
{
    pthread_mutex_lock(&x->mu);
    for (int list = 0; list < 2; list++)
        for (task_t *t = list ? x->active : x->queue; t; t = t->next)
            if (same_assignment(t, a->job_id, a->attempt) && !t->cancelled) {
                pthread_mutex_unlock(&x->mu);
                return;
            }
    bool shut = x->shut;
    pthread_mutex_unlock(&x->mu);
    if (shut) {
        ob_add_status(x->env.ob, a->job_id, a->attempt, false, "the agent is shutting down", OB_FAULT_SHUTDOWN, 0);
        return;
    }
    size_t len = protobuf_c_message_get_packed_size(&a->base);
    uint8_t *buf = malloc(len ? len : 1);
    task_t *t = calloc(1, sizeof(*t));
    if (buf && t) {
        protobuf_c_message_pack(&a->base, buf);
        t->a = kiln__assignment__unpack(NULL, len, buf);
    }
    free(buf);
    if (!t || !t->a) {
        task_free(t);
        log_error("job %s: out of memory for its assignment; kilnd will deliver it again", a->job_id);
        return;
    }
    t->kind = TASK_FETCH;
    kiln_strlcpy(t->job_id, a->job_id, sizeof(t->job_id));
    t->attempt = a->attempt;
    t->rank = a->n_ranks ? a->ranks[0] : 0;
    pthread_mutex_lock(&x->mu);
    enqueue_locked(x, t);
    pthread_mutex_unlock(&x->mu);
}

void xfer_cancel(xfer_t *x, const char *job_id, int attempt)
{
    pthread_mutex_lock(&x->mu);
    for (int list = 0; list < 2; list++)
        for (task_t *t = list ? x->active : x->queue; t; t = t->next)
            if (same_assignment(t, job_id, attempt))
                t->cancelled = true;
    pthread_mutex_unlock(&x->mu);
}

size_t xfer_list(xfer_t *x, agent_rank_info_t *out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&x->mu);
    for (int list = 0; list < 2; list++)
        for (task_t *t = list ? x->active : x->queue; t; t = t->next) {
            if (t->kind == TASK_FETCH && t->cancelled)
                continue;
            size_t nr = t->kind == TASK_UPLOAD ? 1 : t->a->n_ranks;
            for (size_t k = 0; k < nr; k++, n++) {
                if (n >= max)
                    continue;
                kiln_strlcpy(out[n].job_id, t->job_id, sizeof(out[n].job_id));
                out[n].attempt = t->attempt;
                out[n].rank = t->kind == TASK_UPLOAD ? t->rank : t->a->ranks[k];
                out[n].pid = t->kind == TASK_UPLOAD ? t->pid : 0;
            }
            /* exits kept behind rank 0's (xfer_defer_exit) are not in the outbox yet either */
            for (const later_exit_t *e = t->kind == TASK_UPLOAD && !t->reported ? t->later : NULL; e; e = e->next, n++) {
                if (n >= max)
                    continue;
                kiln_strlcpy(out[n].job_id, t->job_id, sizeof(out[n].job_id));
                out[n].attempt = t->attempt;
                out[n].rank = e->rank;
                out[n].pid = e->pid;
            }
        }
    pthread_mutex_unlock(&x->mu);
    return n;
}

/* ---- lifecycle ----------------------------------------------------------------------------------- */

int xfer_create(const xfer_env_t *env, xfer_t **out, kiln_err_t *err)
{
    *out = NULL;
    xfer_t *x = calloc(1, sizeof(*x));
    if (!x)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    x->env = *env;
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv, NULL);
    x->chunk_bytes = env->chunk_bytes > 0 ? env->chunk_bytes : XFER_CHUNK_DEFAULT;
    x->delay_ms = env->delay_ms > 0 ? env->delay_ms : 0;
    if (x->delay_ms)
        log_warn("--upload-delay-ms %d: uploads pause after every chunk (a test setting)", x->delay_ms);
    *out = x;
    return 0;
}

void xfer_shutdown(xfer_t *x, int grace_ms)
{
    if (!x)
        return;
    struct timespec ts;
    kiln_deadline_in(&ts, grace_ms);
    pthread_mutex_lock(&x->mu);
    x->shut = true;
    while (x->threads > 0 && grace_ms > 0)
        if (pthread_cond_timedwait(&x->cv, &x->mu, &ts) != 0)
            break;
    if (x->threads > 0)
        log_warn("stopping %d transfer(s) with kilnd that have not finished", x->threads);
    x->stopping = true;
    pthread_cond_broadcast(&x->cv);
    while (x->threads > 0)
        pthread_cond_wait(&x->cv, &x->mu);
    pthread_mutex_unlock(&x->mu);
}

void xfer_destroy(xfer_t *x)
{
    if (!x)
        return;
    xfer_shutdown(x, 0);
    while (x->queue) {
        task_t *t = x->queue;
        x->queue = t->next;
        task_free(t);
    }
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv);
    free(x);
}
