/* run_train.c - the kiln-train runtime: a rank of one of kiln's own models runs the agent's
 * kiln-train (--train-bin) with the rank contract's environment and nothing else, in its output
 * directory when it is in a box. The box also shows it the program and the CUDA backend it loads
 * from beside it or from the agent's --cuda-lib (KILN_CUDA_LIB), which the rank gets as its own. */
#include "agent/agent_int.h"
#include "rank/rank.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

typedef struct train_state {
    char bin[PATH_MAX];          /* the program as the box sees it ("": the host's --train-bin) */
} train_state_t;

static int train_prepare(launch_attempt_t *at, const Kiln__Assignment *a, launch_mounts_t *m, kiln_err_t *err)
{
    (void)a;
    train_state_t *st = calloc(1, sizeof(*st));
    if (!st)
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    at->state = st;
    if (!at->host->sandboxed)
        return 0;
    char real[PATH_MAX], lib[2][PATH_MAX + 32];
    if (!realpath(at->host->train_bin, real)) { /* as the exec would say */
        int rc = kiln_err_set(err, KILN_ENOTFOUND, NULL, "could not start %s: %s", at->host->train_bin, strerror(errno));
        free(st);
        at->state = NULL;
        return rc;
    }
    kiln_strlcpy(st->bin, real, sizeof(st->bin));
    *strrchr(real, '/') = '\0';
    snprintf(lib[0], sizeof(lib[0]), "%s/libkiln_cuda.so", real);
    snprintf(lib[1], sizeof(lib[1]), "%s/../lib/libkiln_cuda.so", real);
    const char *cuda_lib = at->host->cuda_lib;
    int rc = launch_mounts_add(m, st->bin, NULL, SANDBOX_RO, false, err);
    if (rc == 0)
        rc = launch_mounts_add(m, lib[0], NULL, SANDBOX_RO | SANDBOX_OPTIONAL, false, err);
    if (rc == 0)
        rc = launch_mounts_add(m, lib[1], NULL, SANDBOX_RO | SANDBOX_OPTIONAL, false, err);
    if (rc == 0 && cuda_lib && cuda_lib[0] == '/')
        rc = launch_mounts_add(m, cuda_lib, NULL, SANDBOX_RO | SANDBOX_OPTIONAL, false, err);
    if (rc) {
        free(st);
        at->state = NULL;
    }
    return rc;
}

static int train_command(launch_attempt_t *at, const Kiln__Assignment *a, const rank_env_t *re, launch_cmd_t *cmd,
                         kiln_err_t *err)
{
    (void)a;
    const train_state_t *st = at->state;
    const char *bin = st->bin[0] ? st->bin : at->host->train_bin;
    kiln_strlcpy(cmd->path, bin, sizeof(cmd->path));
    if (at->host->sandboxed)
        kiln_strlcpy(cmd->cwd, at->out_dir, sizeof(cmd->cwd));
    int rc = rank_env_envp(re, environ, &cmd->envp, err);
    if (rc)
        return rc;
    /* the agent's --cuda-lib is the rank's too */
    const char *lib = at->host->cuda_lib;
    if (!(cmd->argv = calloc(3, sizeof(char *))) || !(cmd->argv[0] = strdup(bin)) ||
        (lib && asprintf(&cmd->argv[1], "--cuda-lib=%s", lib) < 0)) {
        if (cmd->argv)
            cmd->argv[1] = NULL;
        launch_cmd_deinit(cmd);
        return kiln_err_set(err, KILN_ENOMEM, NULL, "out of memory");
    }
    return 0;
}

static void train_release(launch_attempt_t *at)
{
    free(at->state);
    at->state = NULL;
}

const launch_runtime_t launch_runtime_train = {
    .name = "kiln-train",
    .prepare = train_prepare,
    .command = train_command,
    .exit_reason = NULL,   /* kilnd shows the last stderr line: kiln-train says why there */
    .release = train_release,
};
