/* run_script.c - the script runtime: a rank of a job with an entry_point runs the job's own code.
 * Per attempt the code is put in a working directory the job may write to (<job dir>/code: a
 * copy of the code cache's tree for a code:sha256 source, or of the source directory inside the
 * data roots), and SageMaker's directories are made fresh (<job dir>/model, <job dir>/sm-output
 * with data/ in it). A .py entry point runs with the job's python or the agent's --python, a .sh
 * with /bin/sh, anything else directly; the hyperparameters follow as SageMaker's arguments, and
 * the environment is rank/'s script contract. A failed rank's reason is SageMaker's failure file
 * when the script wrote one, else its last stderr lines. After rank 0 exits, the model and
 * output data directories become artifacts (agent_output_pack_trees, called by the upload). */
#include "agent/agent_int.h"
#include "code/code.h"
#include "rank/rank.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

extern char **environ;

#define SCRIPT_CODE_DIR "code"
#define SCRIPT_MODEL_DIR "model"
#define SCRIPT_SM_OUTPUT_DIR "sm-output"
#define SCRIPT_DATA_DIR "sm-output/data"
#define SCRIPT_COPY_MAX_BYTES (10LL << 30)  /* a source directory copied for one attempt, at most */

typedef struct script_state {
    char code[PATH_MAX + 16];    /* the working directory: the job's copy of its code */
    char model[PATH_MAX + 16];   /* SM_MODEL_DIR */
    char sm_out[PATH_MAX + 16];  /* SM_OUTPUT_DIR */
    char data[PATH_MAX + 32];    /* SM_OUTPUT_DATA_DIR */
    char interp[PATH_MAX];       /* what runs the entry point ("": it runs itself) */
    char entry[PATH_MAX + 32];   /* argv[1] with an interpreter (relative to code), else absolute */
} script_state_t;

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* A fresh empty directory at path (what an earlier attempt left there goes). */
static int fresh_dir(const char *path, kiln_err_t *err)
{
    if (code_tree_remove(path) != 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not remove \"%s\" of an earlier attempt", path);
    return kiln_mkdirs_mode(path, 0700, err);
}

/* The job's code into st->code: a fresh copy per attempt, so that what an earlier attempt
 * wrote there is gone and the cached tree never changes. */
static int script_code(launch_attempt_t *at, const Kiln__Assignment *a, script_state_t *st, kiln_err_t *err)
{
    if (code_tree_remove(st->code) != 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not remove the code of an earlier attempt");
    int64_t bytes = 0, t0 = kiln_mono_us();
    int rc;
    if (a->code_digest && a->code_digest[0]) {
        if (!at->host->code)
            return kiln_err_set(err, KILN_EUNSUPP, "source", "this agent has no code cache to fetch %s into",
                                a->source ? a->source : "the code");
        agent_code_ref_t ref = {.digest = a->code_digest, .size = a->code_size, .job_id = a->job_id,
                                .attempt = a->attempt};
        char tree[PATH_MAX];
        if ((rc = agent_code_acquire(at->host->code, &ref, tree, sizeof(tree), err)) != 0)
            return rc;
        rc = agent_code_prepare(at->host->code, a->code_digest, st->code, &bytes, err);
        agent_code_release(at->host->code, a->code_digest);
    } else {
        const char *src = a->source ? a->source : "";
        if (!src[0])
            return kiln_err_set(err, KILN_EINVAL, "source", "a script job needs a source");
        rc = agent_code_copy_dir(src, at->host->roots, at->host->nroots, SCRIPT_COPY_MAX_BYTES, st->code, &bytes,
                                 err);
    }
    if (rc == 0)
        log_info("job %s attempt %d: code in place (%lld bytes, %.0f ms)", at->job_id, at->attempt, (long long)bytes,
                 (kiln_mono_us() - t0) / 1e3);
    return rc;
}

/* What runs the entry point, and how argv names it. */
static int script_program(launch_attempt_t *at, const Kiln__Assignment *a, script_state_t *st, kiln_err_t *err)
{
    const char *ep = a->entry_point;
    char path[PATH_MAX + 32];
    struct stat sb;
    snprintf(path, sizeof(path), "%s/%s", st->code, ep);
    if (ep[0] == '/' || strstr(ep, "..") || lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
        return kiln_err_set(err, KILN_ENOTFOUND, "entry_point", "entry_point \"%.200s\" is not a file of the job's code",
                            ep);
    if (ends_with(ep, ".py")) {
        const char *py = a->python && a->python[0] ? a->python : at->host->python;
        if (!py || !py[0])
            return kiln_err_set(err, KILN_EUNSUPP, "python", "this agent has no Python to run \"%.200s\" with (its "
                                "--python is not in PATH) and the job names none", ep);
        if (py == at->host->python && at->host->python_hidden) {
            /* the reason the job gets is the message alone: it says what to do */
            /* named as the operator gave it (--python), then where it was found and where it leads */
            const char *given = at->host->python_given ? at->host->python_given : py;
            char real[PATH_MAX], link[2 * PATH_MAX + 48] = "";
            if (strcmp(given, py) != 0)
                snprintf(link, sizeof(link), ", that is %.60s", py);
            if (realpath(py, real) && strcmp(real, py) != 0)
                snprintf(link + strlen(link), sizeof(link) - strlen(link), ", a link to %.60s", real);
            kiln_err_set(err, KILN_EUNSUPP, "python", "this agent's Python %.60s%s%s lies outside what its sandbox "
                         "shows ranks: start kiln-agent with --python /usr/bin/python3 (or --sandbox-ro-path DIR), or "
                         "name a \"python\" inside the data roots in the job", given, link, link[0] ? "," : "");
            return KILN_EUNSUPP;
        }
        kiln_strlcpy(st->interp, py, sizeof(st->interp));
        kiln_strlcpy(st->entry, ep, sizeof(st->entry));
    } else if (ends_with(ep, ".sh")) {
        kiln_strlcpy(st->interp, "/bin/sh", sizeof(st->interp));
        kiln_strlcpy(st->entry, ep, sizeof(st->entry));
    } else {
        if (!(sb.st_mode & 0100))
            return kiln_err_set(err, KILN_EINVAL, "entry_point", "entry_point \"%.200s\" is neither .py nor .sh and "
                                "not executable", ep);
        kiln_strlcpy(st->entry, path, sizeof(st->entry));
    }
    return 0;
}

static int script_prepare(launch_attempt_t *at, const Kiln__Assignment *a, launch_mounts_t *m, kiln_err_t *err)
{
    script_state_t *st = calloc(1, sizeof(*st));
    if (!st)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    snprintf(st->code, sizeof(st->code), "%s/" SCRIPT_CODE_DIR, at->job_dir);
    snprintf(st->model, sizeof(st->model), "%s/" SCRIPT_MODEL_DIR, at->job_dir);
    snprintf(st->sm_out, sizeof(st->sm_out), "%s/" SCRIPT_SM_OUTPUT_DIR, at->job_dir);
    snprintf(st->data, sizeof(st->data), "%s/" SCRIPT_DATA_DIR, at->job_dir);
    int rc = script_code(at, a, st, err);
    if (rc == 0)
        rc = script_program(at, a, st, err);
    if (rc == 0)
        rc = fresh_dir(st->model, err);
    if (rc == 0)
        rc = fresh_dir(st->sm_out, err);
    if (rc == 0)
        rc = kiln_mkdirs_mode(st->data, 0700, err);
    /* the box: the code and SageMaker's directories writable; the checkpoint directory also
     * where SageMaker's scripts look for it */
    if (rc == 0)
        rc = launch_mounts_add(m, st->code, NULL, SANDBOX_RW, true, err);
    if (rc == 0)
        rc = launch_mounts_add(m, st->model, NULL, SANDBOX_RW, true, err);
    if (rc == 0)
        rc = launch_mounts_add(m, st->sm_out, NULL, SANDBOX_RW, true, err);
    if (rc == 0)
        rc = launch_mounts_add(m, at->ckpt_dir, RANK_SM_CHECKPOINT_PATH, SANDBOX_RW, false, err);
    if (rc) {
        free(st);
        return rc;
    }
    at->state = st;
    return 0;
}

/* The step a script rank pauses at (KILN_PAUSE_AT_STEP): the spec's stopping.max_steps, which
 * kilnd sets on a hyperband trial at its rung (spec_parse kept it within the script's
 * hyperparameters.max_steps); 0 when the spec has none. */
static int64_t script_pause_at(const char *spec_json)
{
    json_t *spec = spec_json ? json_loads(spec_json, 0, NULL) : NULL;
    const json_t *v = json_object_get(json_object_get(spec, "stopping"), "max_steps");
    int64_t at = json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) <= RANK_MAX_STEP
                     ? (int64_t)json_integer_value(v) : 0;
    json_decref(spec);
    return at;
}

static int script_command(launch_attempt_t *at, const Kiln__Assignment *a, const rank_env_t *re, launch_cmd_t *cmd,
                          kiln_err_t *err)
{
    const script_state_t *st = at->state;
    size_t nc = a->n_channels, ne = a->n_environment;
    const char **cn = calloc(nc + 1, sizeof(char *)), **cp = calloc(nc + 1, sizeof(char *));
    const char **en = calloc(ne + 1, sizeof(char *)), **ev = calloc(ne + 1, sizeof(char *));
    char **args = NULL;
    size_t nargs = 0;
    int rc = 0;
    if (!cn || !cp || !en || !ev) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < nc; i++) {
        cn[i] = a->channels[i]->name ? a->channels[i]->name : "";
        cp[i] = a->channels[i]->path ? a->channels[i]->path : "";
    }
    for (size_t i = 0; i < ne; i++) {
        en[i] = a->environment[i]->key ? a->environment[i]->key : "";
        ev[i] = a->environment[i]->value ? a->environment[i]->value : "";
    }
    rank_script_env_t se = {.entry_point = a->entry_point, .hyperparameters_json = a->hyperparameters_json,
                            .channel_names = cn, .channel_paths = cp, .n_channels = nc,
                            .env_names = en, .env_values = ev, .n_env = ne,
                            .model_dir = st->model, .output_dir = st->sm_out, .output_data_dir = st->data,
                            .max_restarts = a->max_attempts > 0 ? a->max_attempts - 1 : 0,
                            .num_gpus = re->device_id >= 0 ? 1 : 0};
    rank_env_t pre = *re;
    pre.pause_at_step = script_pause_at(a->spec_json);
    if ((rc = rank_script_envp(&pre, &se, environ, &cmd->envp, err)) ||
        (rc = rank_script_args(a->hyperparameters_json, &args, &nargs, err)))
        goto out;
    if (!(cmd->argv = calloc(nargs + 3, sizeof(char *)))) {
        rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
        goto out;
    }
    size_t k = 0;
    if (st->interp[0])
        cmd->argv[k++] = strdup(st->interp);
    cmd->argv[k++] = strdup(st->entry);
    for (size_t i = 0; i < nargs; i++) {
        cmd->argv[k++] = args[i];
        args[i] = NULL;
    }
    for (size_t i = 0; i < k; i++)
        if (!cmd->argv[i])
            rc = kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    kiln_strlcpy(cmd->path, st->interp[0] ? st->interp : st->entry, sizeof(cmd->path));
    kiln_strlcpy(cmd->cwd, st->code, sizeof(cmd->cwd));
out:
    for (size_t i = 0; args && i < nargs; i++)
        free(args[i]);
    free(args);
    free(cn);
    free(cp);
    free(en);
    free(ev);
    if (rc)
        launch_cmd_deinit(cmd);
    return rc;
}

/* The first RANK_SM_FAILURE_MAX characters of the failure file, trimmed, into out (size n; ""
 * when there is none or it says nothing). Never follows a link the script left there. */
static void failure_text(const char *path, char *out, size_t n)
{
    out[0] = '\0';
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return;
    struct stat sb;
    char buf[4 * RANK_SM_FAILURE_MAX + 1];
    ssize_t got = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) ? read(fd, buf, sizeof(buf) - 1) : -1;
    close(fd);
    if (got <= 0)
        return;
    /* characters, not bytes: stop at the 1,025th UTF-8 lead byte */
    size_t len = 0, chars = 0;
    for (; len < (size_t)got; len++)
        if (((unsigned char)buf[len] & 0xc0) != 0x80 && ++chars > RANK_SM_FAILURE_MAX)
            break;
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' ' || buf[len - 1] == '\t'))
        len--;
    size_t start = 0;
    while (start < len && (buf[start] == '\n' || buf[start] == ' ' || buf[start] == '\t' || buf[start] == '\r'))
        start++;
    if (start < len)
        kiln_utf8_copy(out, n, buf + start, len - start);
}

static void script_exit_reason(const launch_attempt_t *at, int exit_code, int sig, const char *tail, char *reason,
                               size_t n)
{
    const script_state_t *st = at->state;
    char path[PATH_MAX + 64], text[AGENT_REASON_MAX];
    snprintf(path, sizeof(path), "%s/" RANK_SM_FAILURE_FILE, st->sm_out);
    failure_text(path, text, sizeof(text));
    if (text[0])
        kiln_strlcpy(reason, text, n);
    else if (exit_code != 0 && sig == 0 && tail[0])
        kiln_strlcpy(reason, tail, n); /* kilnd names the rank and its exit code before it */
}

static void script_release(launch_attempt_t *at)
{
    free(at->state);
    at->state = NULL;
}

const launch_runtime_t launch_runtime_script = {
    .name = "script",
    .prepare = script_prepare,
    .command = script_command,
    .exit_reason = script_exit_reason,
    .release = script_release,
};

/* ---- outputs ---------------------------------------------------------------------------------- */

/* dir (a tree) as a gzip'd tar at out (through out.tmp). Returns 0, or a status with err. */
static int pack_tree(const char *dir, const char *out, code_stats_t *st, kiln_err_t *err)
{
    char tmp[PATH_MAX + 64];
    snprintf(tmp, sizeof(tmp), "%s.tmp", out);
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600); /* read back to be checked */
    if (fd < 0)
        return kiln_err_set(err, KILN_EIO, NULL, "could not create %s: %s", tmp, strerror(errno));
    code_limits_t lim;
    code_limits_default(&lim, SCRIPT_COPY_MAX_BYTES);
    int rc = code_pack_dir(dir, fd, &lim, 0, st, err);
    if (close(fd) != 0 && rc == 0)
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not write %s: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, out) != 0)
        rc = kiln_err_set(err, KILN_EIO, NULL, "could not rename %s: %s", tmp, strerror(errno));
    if (rc)
        unlink(tmp);
    return rc;
}

/* Whether dir holds anything (a missing one does not). */
static bool dir_has_entries(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return false;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return false;
    }
    bool any = false;
    struct dirent *de;
    while (!any && (de = readdir(d)))
        any = strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    closedir(d);
    return any;
}

void agent_output_pack_trees(const char *job_dir, char *notes, size_t n)
{
    static const struct {
        const char *dir, *artifact, *what;
    } k_trees[] = {
        {SCRIPT_MODEL_DIR, "model.tar.gz", "SM_MODEL_DIR"},
        {SCRIPT_DATA_DIR, "output.tar.gz", "SM_OUTPUT_DATA_DIR"},
    };
    if (n)
        notes[0] = '\0';
    char model[PATH_MAX + 16];
    struct stat sb;
    snprintf(model, sizeof(model), "%s/" SCRIPT_MODEL_DIR, job_dir);
    if (lstat(model, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return; /* not a script job's directory */
    size_t off = 0;
    for (size_t i = 0; i < KILN_ARRAY_LEN(k_trees); i++) {
        char dir[PATH_MAX + 32], out[PATH_MAX + 32];
        snprintf(dir, sizeof(dir), "%s/%s", job_dir, k_trees[i].dir);
        snprintf(out, sizeof(out), "%s/output/%s", job_dir, k_trees[i].artifact);
        const char *sep = off ? "\n" : "";
        if (!dir_has_entries(dir)) {
            unlink(out); /* an earlier attempt's is not this one's */
            if (i == 0 && off < n)
                off += (size_t)snprintf(notes + off, n - off, "%sthe script left %s empty: this attempt has no model",
                                        sep, k_trees[i].what);
            continue;
        }
        code_stats_t st = {0};
        kiln_err_t err;
        if (pack_tree(dir, out, &st, &err) != 0) {
            if (off < n)
                off += (size_t)snprintf(notes + off, n - off, "%s%s not kept: %s", sep, k_trees[i].what, err.message);
        } else if (off < n) {
            off += (size_t)snprintf(notes + off, n - off, "%s%s kept as %s (%lld file(s), %lld bytes)", sep,
                                    k_trees[i].what, k_trees[i].artifact, (long long)st.files, (long long)st.bytes);
        }
        if (off >= n)
            off = n ? n - 1 : 0;
    }
}
