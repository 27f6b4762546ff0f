/* test_scripts.c - script jobs end to end: real kilnd and kiln-agents (sandbox on) run a job's own
 * code. Every variable of the torchrun and SageMaker contracts checked from inside a script, and
 * the hyperparameters as SageMaker's arguments; a PyTorch DDP script (Debian's python3-torch,
 * gloo) on 2 nodes x 1 rank and on 1 node x 2 ranks ends with the parameters a single process
 * reaches on the same global batch; SageMaker's failure file as the job's reason; a memory hog's
 * out-of-memory reason; a script that writes no model; managed spot training (an agent killed
 * mid-run, the job resumed on the other from its synced checkpoint directory); examples/torch-script
 * submitted as README.md says (killed mid-run, resumed from its checkpoint, then tuned). The scripts live in a data root (the
 * sandbox shows ranks nothing else) or are uploaded as a code archive. */
#include "tests/e2e/e2e.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SCRIPT_TIMEOUT_MS 180000

/* <cluster dir>/shared-checkpoints/<name>: a data root of both agents, readable by the ranks. */
static const char *script_dir(const char *name)
{
    static char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%.200s/shared-checkpoints/%s", e2e_cl->dir, name);
    cr_assert(mkdir(dir, 0755) == 0 || access(dir, F_OK) == 0, "mkdir %s", dir);
    chmod(dir, 0755);
    return dir;
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert(f, "could not write %s", path);
    fputs(text, f);
    fclose(f);
    chmod(path, 0644);
}

/* Every line rank wrote on stdout that starts with prefix, joined by '\n' (heap). */
static char *rank_lines(const char *id, int rank, const char *prefix)
{
    char path[160];
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?rank=%d&limit=1000", id, rank);
    json_t *logs = e2e_get(path);
    size_t i, cap = 1 << 16, n = 0;
    char *out = calloc(1, cap);
    json_t *e;
    json_array_foreach(json_object_get(logs, "lines"), i, e) {
        const char *line = e2e_jstr(e, "line");
        if (strncmp(line, prefix, strlen(prefix)))
            continue;
        size_t len = strlen(line);
        if (n + len + 2 >= cap)
            break;
        memcpy(out + n, line, len);
        n += len;
        out[n++] = '\n';
    }
    json_decref(logs);
    return out;
}

/* The value the script printed as "ENV NAME=value" ("<unset>" when it was unset), static. */
static const char *env_of(const char *lines, const char *name)
{
    static char buf[4096];
    char key[300];
    snprintf(key, sizeof key, "ENV %s=", name);
    const char *p = strstr(lines, key);
    cr_assert(p, "the script printed no %s:\n%s", name, lines);
    p += strlen(key);
    size_t len = strcspn(p, "\n");
    snprintf(buf, sizeof buf, "%.*s", (int)len, p);
    return buf;
}

#define ENV_EQ(lines, name, want)                                                                        \
    cr_assert_str_eq(env_of(lines, name), want, "%s is \"%s\", not \"%s\"", name, env_of(lines, name), want)

static json_t *finished(const char *id)
{
    return e2e_wait_state(id, TH_JOB_ENDED, SCRIPT_TIMEOUT_MS);
}

/* ---- the contract, variable by variable ------------------------------------------------------ */

static const char k_env_py[] =
    "import json, os, socket, sys\n"
    "names = ['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'GROUP_RANK', 'GROUP_WORLD_SIZE',\n"
    "         'ROLE_RANK', 'ROLE_WORLD_SIZE', 'ROLE_NAME', 'MASTER_ADDR', 'MASTER_PORT',\n"
    "         'TORCHELASTIC_RESTART_COUNT', 'TORCHELASTIC_MAX_RESTARTS', 'TORCHELASTIC_RUN_ID', 'OMP_NUM_THREADS',\n"
    "         'SM_MODEL_DIR', 'SM_OUTPUT_DATA_DIR', 'SM_OUTPUT_DIR', 'SM_CHANNELS', 'SM_CHANNEL_TRAIN',\n"
    "         'SM_CHANNEL_VALIDATION', 'SM_HPS', 'SM_HP_EPOCHS', 'SM_HP_LR', 'SM_HP_MODEL', 'SM_HP_NAME',\n"
    "         'SM_HP_BATCH-SIZE', 'SM_HP_X', 'SM_USER_ARGS', 'SM_CURRENT_HOST', 'SM_HOSTS', 'SM_NUM_CPUS',\n"
    "         'SM_NUM_GPUS', 'SM_TRAINING_ENV', 'SM_CHECKPOINT_DIR', 'CUDA_VISIBLE_DEVICES', 'MY_FLAG',\n"
    "         'KILN_JOB_ID', 'KILN_MASTER_ADDR', 'KILN_MASTER_PORT', 'KILN_THREADS', 'KILN_CHECKPOINT_DIR',\n"
    "         'KILN_RANK', 'LD_PRELOAD']\n"
    "for n in names:\n"
    "    print('ENV %s=%s' % (n, os.environ.get(n, '<unset>')))\n"
    "print('ARGV ' + json.dumps(sys.argv[1:]))\n"
    "print('CWD ' + os.getcwd())\n"
    "open('snapshot.pt', 'w').write('the code directory is the job\\'s to write')\n"
    "print('WROTE cwd')\n"
    "open('/opt/ml/checkpoints/probe', 'w').write('x')\n"
    "print('WROTE optml=' + str(os.path.exists(os.path.join(os.environ['SM_CHECKPOINT_DIR'], 'probe'))))\n"
    "print('CHANNEL ' + open(os.path.join(os.environ['SM_CHANNEL_TRAIN'], 'a.txt')).read().strip())\n"
    "if os.environ['RANK'] == '0':\n"
    "    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "    s.bind(('', int(os.environ['MASTER_PORT']))); s.close()\n"
    "    print('BOUND master port')\n"
    "    os.makedirs(os.path.join(os.environ['SM_MODEL_DIR'], 'sub'))\n"
    "    open(os.path.join(os.environ['SM_MODEL_DIR'], 'sub', 'w.txt'), 'w').write('weights')\n"
    "    open(os.path.join(os.environ['SM_OUTPUT_DATA_DIR'], 'eval.txt'), 'w').write('acc=1')\n"
    "sys.stdout.flush()\n";

Test(e2e_scripts, every_variable_of_the_contract_reaches_a_script_on_two_nodes, .init = e2e_setup,
     .fini = e2e_teardown, .timeout = 300)
{
    const char *code = script_dir("env-code");
    write_file(code, "train.py", k_env_py);
    char train[PATH_MAX], val[PATH_MAX], codedir[PATH_MAX];
    snprintf(codedir, sizeof codedir, "%s", code);
    snprintf(train, sizeof train, "%s", script_dir("env-train"));
    write_file(train, "a.txt", "channel data\n");
    snprintf(val, sizeof val, "%s", script_dir("env-val"));
    char spec[4 * PATH_MAX];
    snprintf(spec, sizeof spec,
             "{\"name\": \"env\", \"entry_point\": \"train.py\", \"source\": \"%s\","
             " \"hyperparameters\": {\"epochs\": 3, \"batch-size\": 64, \"lr\": 0.01, \"model\": {\"depth\": 4},"
             " \"name\": \"run one\", \"x\": true},"
             " \"data\": {\"channels\": {\"train\": \"%s\", \"validation\": \"%s\"}},"
             " \"environment\": {\"MY_FLAG\": \"1\"},"
             " \"resources\": {\"nodes\": 2, \"slots_per_node\": 1, \"slot_type\": \"cpu\"},"
             " \"distribution\": {\"torch_distributed\": {\"enabled\": true, \"nproc_per_node\": 1}},"
             " \"retry\": {\"max_attempts\": 3}}",
             codedir, train, val);
    json_t *sub = e2e_submit(spec);
    char id[64];
    snprintf(id, sizeof id, "%s", e2e_jstr(sub, "id"));
    json_decref(sub);
    json_t *job = finished(id);
    cr_assert_str_eq(e2e_jstr(job, "state"), "COMPLETED", "ended %s: %s", e2e_jstr(job, "state"),
                     e2e_jstr(job, "reason"));
    json_decref(job);

    for (int r = 0; r < 2; r++) {
        char *env = rank_lines(id, r, "ENV ");
        char want[PATH_MAX + 64];
        snprintf(want, sizeof want, "%d", r);
        ENV_EQ(env, "RANK", want);
        ENV_EQ(env, "ROLE_RANK", want);
        ENV_EQ(env, "GROUP_RANK", want); /* one rank a node: rank r is on node r */
        ENV_EQ(env, "KILN_RANK", want);
        ENV_EQ(env, "WORLD_SIZE", "2");
        ENV_EQ(env, "ROLE_WORLD_SIZE", "2");
        ENV_EQ(env, "GROUP_WORLD_SIZE", "2");
        ENV_EQ(env, "LOCAL_RANK", "0");
        ENV_EQ(env, "LOCAL_WORLD_SIZE", "1");
        ENV_EQ(env, "ROLE_NAME", "default");
        char addr[64];
        snprintf(addr, sizeof addr, "%s", env_of(env, "KILN_MASTER_ADDR"));
        ENV_EQ(env, "MASTER_ADDR", addr);
        char port[16];
        snprintf(port, sizeof port, "%s", env_of(env, "KILN_MASTER_PORT"));
        cr_assert(atoi(port) > 0, "KILN_MASTER_PORT %s", port);
        ENV_EQ(env, "MASTER_PORT", port);
        ENV_EQ(env, "TORCHELASTIC_RESTART_COUNT", "0");
        ENV_EQ(env, "TORCHELASTIC_MAX_RESTARTS", "2");
        ENV_EQ(env, "TORCHELASTIC_RUN_ID", id);
        ENV_EQ(env, "KILN_JOB_ID", id);
        char threads[16];
        snprintf(threads, sizeof threads, "%s", env_of(env, "KILN_THREADS"));
        cr_assert(atoi(threads) >= 1, "KILN_THREADS %s", threads);
        ENV_EQ(env, "OMP_NUM_THREADS", threads);
        ENV_EQ(env, "SM_NUM_CPUS", threads);
        ENV_EQ(env, "SM_NUM_GPUS", "0");
        ENV_EQ(env, "CUDA_VISIBLE_DEVICES", "<unset>"); /* cpu slots */
        ENV_EQ(env, "LD_PRELOAD", "<unset>");
        ENV_EQ(env, "MY_FLAG", "1");
        char model[PATH_MAX], out[PATH_MAX];
        snprintf(model, sizeof model, "%s", env_of(env, "SM_MODEL_DIR"));
        snprintf(out, sizeof out, "%s", env_of(env, "SM_OUTPUT_DIR"));
        cr_assert(strstr(model, id) && strstr(out, id) && strcmp(model, out), "%s %s", model, out);
        snprintf(want, sizeof want, "%s/data", out);
        ENV_EQ(env, "SM_OUTPUT_DATA_DIR", want);
        char ckpt[PATH_MAX];
        snprintf(ckpt, sizeof ckpt, "%s", env_of(env, "KILN_CHECKPOINT_DIR"));
        ENV_EQ(env, "SM_CHECKPOINT_DIR", ckpt);
        ENV_EQ(env, "SM_CHANNELS", "[\"train\",\"validation\"]");
        ENV_EQ(env, "SM_CHANNEL_TRAIN", train);
        ENV_EQ(env, "SM_CHANNEL_VALIDATION", val);
        ENV_EQ(env, "SM_HPS", "{\"batch-size\":64,\"epochs\":3,\"lr\":0.01,\"model\":{\"depth\":4},\"name\":\"run one\","
                              "\"x\":true}");
        ENV_EQ(env, "SM_HP_EPOCHS", "3");
        ENV_EQ(env, "SM_HP_BATCH-SIZE", "64");
        ENV_EQ(env, "SM_HP_LR", "0.01");
        ENV_EQ(env, "SM_HP_MODEL", "{\"depth\":4}");
        ENV_EQ(env, "SM_HP_NAME", "run one");
        ENV_EQ(env, "SM_HP_X", "true");
        const char *args = "[\"--batch-size\",\"64\",\"--epochs\",\"3\",\"--lr\",\"0.01\",\"--model\",\"depth=4\","
                           "\"--name\",\"run one\",\"-x\",\"True\"]";
        ENV_EQ(env, "SM_USER_ARGS", args);
        snprintf(want, sizeof want, "algo-%d", r + 1);
        ENV_EQ(env, "SM_CURRENT_HOST", want);
        ENV_EQ(env, "SM_HOSTS", "[\"algo-1\",\"algo-2\"]");
        json_error_t je;
        json_t *tenv = json_loads(env_of(env, "SM_TRAINING_ENV"), 0, &je);
        cr_assert(tenv, "SM_TRAINING_ENV is not JSON: %s", je.text);
        cr_assert_str_eq(e2e_jstr(tenv, "current_host"), want);
        cr_assert_str_eq(e2e_jstr(tenv, "job_name"), id);
        cr_assert_str_eq(e2e_jstr(tenv, "user_entry_point"), "train.py");
        cr_assert_str_eq(e2e_jstr(tenv, "model_dir"), model);
        cr_assert_str_eq(e2e_jstr(json_object_get(tenv, "channel_input_dirs"), "train"), train);
        cr_assert_eq(json_integer_value(json_object_get(json_object_get(tenv, "hyperparameters"), "epochs")), 3);
        cr_assert_eq(json_array_size(json_object_get(tenv, "hosts")), 2);
        json_decref(tenv);
        free(env);

        /* SageMaker's arguments, in sys.argv; the code's directory writable; the channel readable */
        char *argv = rank_lines(id, r, "ARGV ");
        snprintf(want, sizeof want, "ARGV [\"--batch-size\", \"64\", \"--epochs\", \"3\", \"--lr\", \"0.01\", "
                                    "\"--model\", \"depth=4\", \"--name\", \"run one\", \"-x\", \"True\"]\n");
        cr_assert_str_eq(argv, want);
        free(argv);
        char *more = rank_lines(id, r, "WROTE ");
        cr_assert_str_eq(more, "WROTE cwd\nWROTE optml=True\n");
        free(more);
        more = rank_lines(id, r, "CHANNEL ");
        cr_assert_str_eq(more, "CHANNEL channel data\n");
        free(more);
        more = rank_lines(id, r, "BOUND ");
        cr_assert_str_eq(more, r == 0 ? "BOUND master port\n" : "", "rank %d", r);
        free(more);
    }

    /* rank 0's model and output data directories, subdirectories included, as artifacts */
    char path[160];
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts", id);
    json_t *list = e2e_get(path);
    char *names = e2e_dump(list);
    cr_assert(strstr(names, "\"model.tar.gz\"") && strstr(names, "\"output.tar.gz\""), "%s", names);
    json_decref(list);
    e2e_pass();
}

/* ---- failures, told as the script told them -------------------------------------------------- */

/* Submits spec; returns the job's id (free it). */
static char *submitted_id(const char *spec)
{
    json_t *sub = e2e_submit(spec);
    char *id = strdup(e2e_jstr(sub, "id"));
    json_decref(sub);
    return id;
}

static char *submit_script(const char *name, const char *source, const char *extra)
{
    char spec[2 * PATH_MAX];
    snprintf(spec, sizeof spec,
             "{\"name\": \"%s\", \"entry_point\": \"%s.py\", \"source\": \"%s\", \"retry\": {\"max_attempts\": 1},"
             " \"resources\": {\"nodes\": 1, \"slots_per_node\": 1, \"slot_type\": \"cpu\"%s}}",
             name, name, source, extra);
    return submitted_id(spec);
}

Test(e2e_scripts, failures_are_told_as_the_script_told_them, .init = e2e_setup, .fini = e2e_teardown,
     .timeout = 300)
{
    const char *dir = script_dir("fail-code");
    /* SageMaker's failure file: its first 1,024 characters are the job's reason */
    write_file(dir, "failfile.py",
               "import os, sys\n"
               "print('a line on stderr', file=sys.stderr)\n"
               "open(os.path.join(os.environ['SM_OUTPUT_DIR'], 'failure'), 'w').write('bad shard 3: ' + 'x' * 2000)\n"
               "sys.exit(3)\n");
    /* no failure file: the rank, its exit code and its last stderr lines */
    write_file(dir, "tail.py",
               "import sys\n"
               "for w in ['one', 'two', 'three', 'four', 'five', 'six']:\n"
               "    print('stderr line ' + w, file=sys.stderr)\n"
               "sys.exit(1)\n");
    /* more memory than the spec gives it */
    write_file(dir, "hog.py",
               "import sys\n"
               "print('allocating', flush=True)\n"
               "b = b'x' * (400 << 20)\n"
               "print('still alive', len(b), flush=True)\n");
    /* done, without a model */
    write_file(dir, "nomodel.py", "print('trained nothing worth keeping')\n");
    char *ff = submit_script("failfile", dir, ""), *tail = submit_script("tail", dir, "");
    char *hog = submit_script("hog", dir, ", \"memory_limit_mb\": 64");
    char *out = NULL, *err = NULL;
    /* this one from an uploaded code archive, through the agents' code cache */
    cr_assert_eq(e2e_kiln(&out, &err, "code", "push", dir, NULL), 0, "kiln code push: %s", err);
    char source[100] = "";
    sscanf(out, "%99s", source);
    free(out);
    free(err);
    cr_assert(!strncmp(source, "code:sha256:", 12), "%s", source);
    char *nomodel = submit_script("nomodel", source, "");

    json_t *job = finished(ff);
    cr_assert_str_eq(e2e_jstr(job, "state"), "FAILED", "%s", e2e_dump(job));
    const char *reason = e2e_jstr(job, "reason");
    const char *text = strstr(reason, "bad shard 3: x");
    cr_assert(text, "the failure file is not the reason: %s", reason);
    cr_assert_eq(strspn(text + 13, "x"), 1024 - 13, "not the file's first 1,024 characters: %s", reason);
    cr_assert_eq(text[1024], '\0', "%s", reason);
    cr_assert(!strstr(reason, "a line on stderr"), "%s", reason);
    json_decref(job);

    job = finished(tail);
    cr_assert_str_eq(e2e_jstr(job, "state"), "FAILED", "%s", e2e_dump(job));
    reason = e2e_jstr(job, "reason");
    cr_assert(strstr(reason, "rank 0") && strstr(reason, "exited with code 1"), "%s", reason);
    cr_assert(strstr(reason, "stderr line two\nstderr line three\nstderr line four\nstderr line five\nstderr line six"),
              "not its last stderr lines: %s", reason);
    cr_assert(!strstr(reason, "line one"), "more than the last lines: %s", reason);
    json_decref(job);

    job = finished(hog);
    cr_assert_str_eq(e2e_jstr(job, "state"), "FAILED", "%s", e2e_dump(job));
    reason = e2e_jstr(job, "reason");
    cr_assert(strstr(reason, "out of memory (limit 64 MiB)"), "not the memory limit: %s", reason);
    json_decref(job);

    job = finished(nomodel);
    cr_assert_str_eq(e2e_jstr(job, "state"), "COMPLETED", "%s", e2e_dump(job));
    json_decref(job);
    char path[160];
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts", nomodel);
    json_t *list = e2e_get(path);
    cr_assert_eq(json_array_size(json_object_get(list, "artifacts")), 0, "%s", e2e_dump(list));
    json_decref(list);
    char *said = rank_lines(nomodel, 0, "");
    cr_assert(strstr(said, "trained nothing"), "%s", said);
    cr_assert(strstr(said, "the script left SM_MODEL_DIR empty: this attempt has no model"), "%s", said);
    free(said);
    free(ff);
    free(tail);
    free(hog);
    free(nomodel);
    e2e_pass();
}

/* ---- PyTorch DDP ------------------------------------------------------------------------------ */

/* Job id has the model its script left in SM_MODEL_DIR, as an artifact. */
static void assert_has_model(const char *id)
{
    char path[160];
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts", id);
    json_t *list = e2e_get(path);
    cr_assert(strstr(e2e_dump(list), "\"model.tar.gz\""), "%s", e2e_dump(list));
    json_decref(list);
}

/* Trains a tiny MLP with DDP (gloo) on data it generates, each rank on its slice of every global
 * batch; then rank 0 trains the same model in one process on the whole batches and prints the
 * largest difference between the two final parameter sets. */
static const char k_ddp_py[] =
    "import argparse, os, torch, torch.distributed as dist\n"
    "from torch.nn.parallel import DistributedDataParallel as DDP\n"
    "p = argparse.ArgumentParser()\n"
    "p.add_argument('--steps', type=int); p.add_argument('--batch', type=int); p.add_argument('--lr', type=float)\n"
    "a = p.parse_args()\n"
    "torch.set_num_threads(1)\n"
    "dist.init_process_group('gloo')\n"
    "rank, world = dist.get_rank(), dist.get_world_size()\n"
    "assert rank == int(os.environ['RANK']) and world == int(os.environ['WORLD_SIZE'])\n"
    "def make():\n"
    "    torch.manual_seed(0)\n"
    "    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))\n"
    "def flat(m): return torch.cat([q.detach().flatten() for q in m.parameters()])\n"
    "g = torch.Generator().manual_seed(1)\n"
    "X = torch.randn(a.steps, a.batch, 8, generator=g)\n"
    "Y = torch.sin(X @ torch.randn(8, 1, generator=g))\n"
    "per = a.batch // world\n"
    "init = flat(make())\n"
    "model = DDP(make())\n"
    "opt = torch.optim.SGD(model.parameters(), lr=a.lr)\n"
    "for s in range(a.steps):\n"
    "    xb, yb = X[s, rank * per:(rank + 1) * per], Y[s, rank * per:(rank + 1) * per]\n"
    "    opt.zero_grad(); loss = ((model(xb) - yb) ** 2).mean(); loss.backward(); opt.step()\n"
    "final = flat(model.module)\n"
    "every = [torch.zeros_like(final) for _ in range(world)]\n"
    "dist.all_gather(every, final)\n"
    "if rank == 0:\n"
    "    ref = make(); ropt = torch.optim.SGD(ref.parameters(), lr=a.lr)\n"
    "    for s in range(a.steps):\n"
    "        ropt.zero_grad(); ((ref(X[s]) - Y[s]) ** 2).mean().backward(); ropt.step()\n"
    "    print('RESULT world=%d maxdiff=%.3e rankdiff=%.3e moved=%.3e' % (world, (final - flat(ref)).abs().max().item(),\n"
    "          max((e - final).abs().max().item() for e in every), (flat(ref) - init).abs().max().item()), flush=True)\n"
    "    torch.save(model.module.state_dict(), os.path.join(os.environ['SM_MODEL_DIR'], 'model.pt'))\n"
    "dist.destroy_process_group()\n";

#define DDP_TOLERANCE 1e-5  /* float32 sums in another order: ~1e-7 expected */

static void ddp_check(const char *id, int world)
{
    json_t *job = finished(id);
    cr_assert_str_eq(e2e_jstr(job, "state"), "COMPLETED", "%d ranks: ended %s: %s", world, e2e_jstr(job, "state"),
                     e2e_jstr(job, "reason"));
    json_decref(job);
    char *res = rank_lines(id, 0, "RESULT ");
    int w = 0;
    double maxdiff = 1, rankdiff = 1, moved = 0;
    cr_assert_eq(sscanf(res, "RESULT world=%d maxdiff=%lf rankdiff=%lf moved=%lf", &w, &maxdiff, &rankdiff, &moved), 4,
                 "%s", res);
    cr_assert_eq(w, world, "%s", res);
    cr_assert_lt(maxdiff, DDP_TOLERANCE, "DDP and one process differ: %s", res);
    cr_assert_lt(rankdiff, DDP_TOLERANCE, "the ranks differ: %s", res);
    cr_assert_gt(moved, 1e-3, "training moved nothing: %s", res);
    free(res);
    assert_has_model(id);
}

Test(e2e_scripts, pytorch_ddp_matches_one_process_on_two_nodes_and_on_one_node_with_two_ranks, .init = e2e_setup,
     .fini = e2e_teardown, .timeout = 400)
{
    if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
        cr_skip_test("python3-torch is not installed for /usr/bin/python3 (scripts/install-deps.sh installs it)");
    const char *dir = script_dir("ddp-code");
    write_file(dir, "ddp.py", k_ddp_py);
    const char *shapes[2] = {"\"nodes\": 2, \"slots_per_node\": 1", "\"nodes\": 1, \"slots_per_node\": 2"};
    int nproc[2] = {1, 2};
    char ids[2][64];
    for (int k = 0; k < 2; k++) {
        char spec[2 * PATH_MAX];
        snprintf(spec, sizeof spec,
                 "{\"name\": \"ddp-%d\", \"entry_point\": \"ddp.py\", \"source\": \"%s\","
                 " \"hyperparameters\": {\"steps\": 20, \"batch\": 16, \"lr\": 0.1},"
                 " \"resources\": {%s, \"slot_type\": \"cpu\"},"
                 " \"distribution\": {\"torch_distributed\": {\"enabled\": true, \"nproc_per_node\": %d}},"
                 " \"retry\": {\"max_attempts\": 1}}",
                 k, dir, shapes[k], nproc[k]);
        json_t *sub = e2e_submit(spec);
        snprintf(ids[k], sizeof ids[k], "%s", e2e_jstr(sub, "id"));
        json_decref(sub);
    }
    ddp_check(ids[0], 2);
    ddp_check(ids[1], 2);
    e2e_pass();
}

/* ---- managed spot training: the checkpoint directory survives the machine --------------------- */

#define SPOT_STEPS 60
#define SPOT_EVERY 5
#define SPOT_STOP 20 /* attempt 1 checkpoints this step, then waits for its machine to go */
#define SPOT_STR_(x) #x
#define SPOT_STR(x) SPOT_STR_(x)

/* Checkpoints every SPOT_EVERY steps into SageMaker's checkpoint directory as a tree, the way
 * Hugging Face's Trainer does (a directory per checkpoint, ckpt-NNNN/state.json and
 * ckpt-NNNN/rng/seed.txt, made under a name that is never synced and renamed into place; the
 * older ones removed but the last two), and resumes from the newest one it finds there. */
static const char k_spot_py[] =
    "import json, os, shutil, sys, time\n"
    "ck = os.environ['SM_CHECKPOINT_DIR']\n"
    "have = sorted(f for f in os.listdir(ck) if f.startswith('ckpt-'))\n"
    "start = json.load(open(os.path.join(ck, have[-1], 'state.json')))['step'] if have else 0\n"
    "seed = open(os.path.join(ck, have[-1], 'rng', 'seed.txt')).read() if have else '-'\n"
    "attempt = int(os.environ['TORCHELASTIC_RESTART_COUNT']) + 1\n"
    "print('RESUMED from %d in attempt %d seed %s' % (start, attempt, seed), flush=True)\n"
    "for step in range(start + 1, " SPOT_STR(SPOT_STEPS) " + 1):\n"
    "    print('step %d loss %.6f' % (step, 1.0 / step), flush=True)\n"
    "    if step % " SPOT_STR(SPOT_EVERY) " == 0:\n"
    "        tmp = os.path.join(ck, '.writing')\n"
    "        os.makedirs(os.path.join(tmp, 'rng'))\n"
    "        with open(os.path.join(tmp, 'state.json'), 'w') as f:\n"
    "            json.dump({'step': step}, f)\n"
    "        with open(os.path.join(tmp, 'rng', 'seed.txt'), 'w') as f:\n"
    "            f.write('s%d' % step)\n"
    "        os.rename(tmp, os.path.join(ck, 'ckpt-%04d' % step))\n"
    "        for old in sorted(f for f in os.listdir(ck) if f.startswith('ckpt-'))[:-2]:\n"
    "            shutil.rmtree(os.path.join(ck, old))\n"
    "    if attempt == 1 and step == " SPOT_STR(SPOT_STOP) ":\n"
    "        while True:\n"
    "            time.sleep(1)\n"
    "    time.sleep(0.02)\n";

/* The names in the job's synced checkpoint state, joined by ',' (static). */
static const char *synced_names(const char *id, json_t **listing)
{
    static char names[512];
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints", id);
    json_t *l = e2e_get(path);
    names[0] = '\0';
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(l, "files"), i, f) {
        size_t n = strlen(names);
        snprintf(names + n, sizeof names - n, "%s%s", n ? "," : "", e2e_jstr(f, "name"));
    }
    if (listing)
        *listing = l;
    else
        json_decref(l);
    return names;
}

Test(e2e_scripts, a_spot_job_resumes_from_its_synced_checkpoints_on_the_other_agent,
     .init = e2e_setup_fast_heartbeat, .fini = e2e_teardown, .timeout = 300)
{
    const char *dir = script_dir("spot-code");
    write_file(dir, "spot.py", k_spot_py);
    char spec[2 * PATH_MAX];
    snprintf(spec, sizeof spec,
             "{\"name\": \"spot\", \"entry_point\": \"spot.py\", \"source\": \"%s\", \"retry\": {\"max_attempts\": 3},"
             " \"resources\": {\"nodes\": 1, \"slots_per_node\": 1, \"slot_type\": \"cpu\"},"
             " \"metric_definitions\": [{\"name\": \"loss\", \"regex\": \"^step (?<step>[0-9]+) loss ([0-9.]+)\"}]}",
             dir);
    json_t *sub = e2e_submit(spec);
    char id[64];
    snprintf(id, sizeof id, "%s", e2e_jstr(sub, "id"));
    json_decref(sub);

    /* attempt 1 waits at step SPOT_STOP once it checkpointed it: kilnd's synced state comes to
     * that checkpoint and the one before it (the older ones' removal synced too) */
    const char *want = "ckpt-0015/rng/seed.txt,ckpt-0015/state.json,ckpt-0020/rng/seed.txt,ckpt-0020/state.json";
    for (int i = 0; i < 600 && strcmp(synced_names(id, NULL), want) != 0; i++)
        usleep(100000);
    json_t *listing = NULL;
    cr_assert_str_eq(synced_names(id, &listing), want, "kilnd's synced state never came to the checkpoints of "
                     "steps 15 and 20");
    cr_assert_eq(e2e_jint(listing, "attempt"), 1, "%s", e2e_dump(listing));
    cr_assert_str_neq(e2e_jstr(listing, "synced_at"), "", "%s", e2e_dump(listing));
    json_decref(listing);

    /* every point attempt 1 will ever have is stored (the agent's outbox dies with it) */
    char path[200];
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?name=loss&attempt=all&max_points=100000", id);
    bool stored = false;
    for (int i = 0; i < 600 && !stored; i++) {
        json_t *m = e2e_get(path);
        size_t k;
        json_t *p;
        json_array_foreach(json_object_get(json_array_get(json_object_get(m, "metrics"), 0), "points"), k, p)
            stored = stored || e2e_jint(p, "step") == SPOT_STOP;
        json_decref(m);
        if (!stored)
            usleep(100000);
    }
    cr_assert(stored, "the point of step %d never arrived", SPOT_STOP);

    /* the machine goes, with the rank on it */
    int agent = e2e_agent_of_job(id);
    cr_assert_geq(agent, 0);
    e2e_agent_signal(agent, SIGKILL);
    json_t *job = e2e_wait_state(id, TH_JOB_ENDED, SCRIPT_TIMEOUT_MS);
    cr_assert_str_eq(e2e_jstr(job, "state"), "COMPLETED", "%s", e2e_dump(job));
    int final = (int)e2e_jint(job, "attempt");
    cr_assert_eq(final, 2, "the attempt the agent died with was retried once: %s", e2e_dump(job));
    json_decref(job);

    /* attempt 2 ran on the other agent (the only one left) and resumed after the last synced
     * checkpoint */
    char *lines = rank_lines(id, 0, "RESUMED");
    cr_assert(strstr(lines, "RESUMED from 0 in attempt 1 seed -"), "%s", lines);
    cr_assert(strstr(lines, "RESUMED from " SPOT_STR(SPOT_STOP) " in attempt 2 seed s" SPOT_STR(SPOT_STOP)),
              "attempt 2 did not resume from the synced checkpoint tree of step %d:\n%s", SPOT_STOP, lines);
    free(lines);

    /* the metrics: each step once per attempt, and none lost after the restore point */
    json_t *m = e2e_get(path);
    json_t *pts = json_object_get(json_array_get(json_object_get(m, "metrics"), 0), "points");
    static unsigned char seen[3][SPOT_STEPS + 1];
    memset(seen, 0, sizeof seen);
    size_t i;
    json_t *p;
    json_array_foreach(pts, i, p) {
        int a = (int)e2e_jint(p, "attempt");
        json_int_t step = e2e_jint(p, "step");
        cr_assert(a >= 1 && a <= 2 && step >= 1 && step <= SPOT_STEPS, "%s", e2e_dump(p));
        cr_assert_eq(seen[a][step]++, 0, "step %lld of attempt %d is stored twice", (long long)step, a);
    }
    json_decref(m);
    for (int s = 1; s <= SPOT_STEPS; s++) {
        cr_assert_eq(seen[1][s], s <= SPOT_STOP, "attempt 1 and step %d", s);
        cr_assert_eq(seen[2][s], s > SPOT_STOP, "attempt 2 and step %d", s);
    }

    /* the last synced state is attempt 2's last two checkpoints */
    cr_assert_str_eq(synced_names(id, &listing),
                     "ckpt-0055/rng/seed.txt,ckpt-0055/state.json,ckpt-0060/rng/seed.txt,ckpt-0060/state.json", "%s",
                     e2e_dump(listing));
    cr_assert_eq(e2e_jint(listing, "attempt"), 2, "%s", e2e_dump(listing));
    json_decref(listing);
    char *out = NULL, *err = NULL;
    cr_assert_eq(e2e_kiln(&out, &err, "artifacts", id, "--checkpoints", NULL), 0, "%s", err);
    cr_assert(strstr(out, "ckpt-0055/state.json") && strstr(out, "ckpt-0060/rng/seed.txt") && strstr(out, "synced "),
              "%s", out);
    free(out);
    free(err);
    e2e_pass();
}

/* ---- examples/torch-script: the bring-your-own PyTorch example, as README.md runs it ---------- */

/* The example's own files and the SDK's kiln/ copied into dir, as README.md tells a team to. */
static void example_code(const char *dir)
{
    char cmd[3 * PATH_MAX];
    snprintf(cmd, sizeof cmd, "cp -r '%s/examples/torch-script/.' '%s/' && cp -r '%s/sdk/python/kiln' '%s/'", e2e_root(),
             dir, e2e_root(), dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

/* examples/<name> loaded, changed by edit, written to path. */
static void example_spec(const char *name, const char *path, void (*edit)(json_t *))
{
    char src[PATH_MAX + 64];
    snprintf(src, sizeof src, "%s/examples/torch-script/%s", e2e_root(), name);
    json_error_t je;
    json_t *j = json_load_file(src, 0, &je);
    cr_assert(j, "%s: %s", src, je.text);
    edit(j);
    cr_assert_eq(json_dump_file(j, path, JSON_INDENT(1)), 0, "%s", path);
    json_decref(j);
}

/* `kiln tune submit --source-dir dir tune` as README.md runs it: the tuning job once it has ended
 * (or as it is after wait_s seconds). */
static json_t *tune_submitted(const char *dir, const char *tune, int wait_s)
{
    char *out = NULL, *err = NULL;
    int rc = e2e_kiln(&out, &err, "tune", "submit", "--source-dir", dir, tune, NULL);
    cr_assert_eq(rc, 0, "kiln tune submit --source-dir: rc %d: %s", rc, err);
    const char *idl = strstr(out, "id:");
    cr_assert(idl, "%s", out);
    char path[160], tid[64];
    cr_assert_eq(sscanf(idl + 3, "%63s", tid), 1, "%s", out);
    free(out);
    free(err);
    snprintf(path, sizeof path, "/v1/tuning-jobs/%s", tid);
    json_t *t = NULL;
    for (int i = 0; i < wait_s * 10; i++) {
        json_decref(t);
        t = e2e_get(path);
        const char *st = e2e_jstr(t, "state");
        if (strcmp(st, "RUNNING") && strcmp(st, "STOPPING"))
            break;
        usleep(100 * 1000);
    }
    return t;
}

/* A job slow enough to be killed mid-run, with an attempt to spare. */
static void slow_job(json_t *j)
{
    json_object_set_new(json_object_get(j, "hyperparameters"), "step_sleep", json_real(0.1));
    json_object_set_new(j, "retry", json_pack("{s:i}", "max_attempts", 2));
}

/* A search of two trials, one at a time: CI has 2 cores. */
static void small_search(json_t *j)
{
    json_object_set_new(j, "max_jobs", json_integer(2));
    json_object_set_new(j, "max_parallel_jobs", json_integer(1));
    json_object_del(j, "early_stopping");
}

static bool has_metric(const json_t *job, const char *name)
{
    return json_object_get(json_object_get(job, "summaries"), name) != NULL;
}

Test(e2e_scripts, the_torch_script_example_trains_resumes_after_a_lost_attempt_and_is_tuned, .init = e2e_setup,
     .fini = e2e_teardown, .timeout = 400)
{
    if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
        cr_skip_test("python3-torch is not installed for /usr/bin/python3 (scripts/install-deps.sh installs it)");
    const char *dir = script_dir("torch-example");
    example_code(dir);
    char spec[PATH_MAX + 64], tune[PATH_MAX + 64];
    snprintf(spec, sizeof spec, "%s/../torch-example-job.json", dir);
    snprintf(tune, sizeof tune, "%s/../torch-example-tune.json", dir);
    example_spec("job.json", spec, slow_job);
    example_spec("tune.json", tune, small_search);

    /* job.json as README.md submits it (its channel "data/tinyshakespeare.txt" relative to the
     * repository root, where e2e_kiln runs); its rank killed mid-run: attempt 2 resumes from the
     * checkpoint kiln restored and the job completes with its model */
    char *out = NULL, *err = NULL;
    int rc = e2e_kiln(&out, &err, "submit", "--source-dir", dir, spec, NULL);
    cr_assert_eq(rc, 0, "kiln submit --source-dir: rc %d: %s", rc, err);
    char id[64];
    cr_assert_eq(sscanf(out, "%63s", id), 1, "%s", out);
    free(out);
    free(err);
    json_decref(e2e_wait_step(id, 30, SCRIPT_TIMEOUT_MS));
    pid_t rank = e2e_rank_pid(id, 0);
    cr_assert(rank > 0, "rank 0 of %s not found", id);
    cr_assert_eq(kill(rank, SIGKILL), 0);
    json_t *job = finished(id);
    cr_assert_str_eq(e2e_jstr(job, "state"), "COMPLETED", "%s", e2e_dump(job));
    cr_assert_eq(e2e_jint(job, "attempt"), 2, "the killed attempt was retried: %s", e2e_dump(job));
    cr_assert(has_metric(job, "train_loss") && has_metric(job, "val_loss"), "metric_definitions read the lines: %s",
              e2e_dump(job));
    cr_assert(has_metric(job, "checkpoint_step"), "kiln.log_metrics, travelling with the code, wrote: %s",
              e2e_dump(job));
    json_decref(job);
    char *resumed = rank_lines(id, 0, "resumed from step ");
    cr_assert(!strncmp(resumed, "resumed from step ", 18) && atoi(resumed + 18) >= 20,
              "attempt 2 resumed from a checkpoint: \"%s\"", resumed);
    free(resumed);
    assert_has_model(id);

    /* tune.json, smaller: its trials complete with val_loss from the job's metric_definitions */
    json_t *t = tune_submitted(dir, tune, 180);
    cr_assert_str_eq(e2e_jstr(t, "state"), "COMPLETED", "%s", e2e_dump(t));
    json_t *best = json_object_get(t, "best");
    cr_assert(json_is_number(json_object_get(best, "objective")), "%s", e2e_dump(t));
    json_decref(t);
    e2e_pass();
}

/* ---- hyperband over a script: the pause at KILN_PAUSE_AT_STEP ----------------------------------- */

/* tune-hyperband.json, tiny: rungs at steps 4 and 12, three trials, two at a time. */
static void hyperband_search(json_t *j)
{
    json_t *hp = json_object_get(json_object_get(j, "job"), "hyperparameters");
    json_object_set_new(hp, "max_steps", json_integer(12));
    json_object_set_new(hp, "checkpoint_every", json_integer(100)); /* the pause's checkpoint, and the end's */
    json_object_set_new(j, "strategy", json_string("hyperband"));
    json_object_set_new(j, "hyperband", json_pack("{s:i, s:i, s:i}", "min_resource", 4, "max_resource", 12,
                                                  "reduction_factor", 3));
    json_object_set_new(j, "max_jobs", json_integer(3));
    json_object_set_new(j, "max_parallel_jobs", json_integer(2));
    json_object_del(j, "early_stopping");
}

/* Submits sdir's steps.sh (the pause test's script) as a job called name that trains to step 6 and
 * pauses at 3, with the environment variable env (or none) set to 1, its val_loss read by regex;
 * returns its id (free it). */
static char *submit_pausing(const char *sdir, const char *name, const char *env, const char *regex)
{
    char envs[96] = "", spec[2 * PATH_MAX];
    if (env)
        snprintf(envs, sizeof envs, "\"environment\": {\"%s\": \"1\"},", env);
    snprintf(spec, sizeof spec,
             "{\"name\": \"%s\", \"entry_point\": \"steps.sh\", \"source\": \"%s\", \"retry\": {\"max_attempts\": 1},"
             " \"hyperparameters\": {\"max_steps\": 6}, \"stopping\": {\"max_steps\": 3}, %s"
             " \"metric_definitions\": [{\"Name\": \"val_loss\", \"Regex\": \"%s\"}],"
             " \"resources\": {\"nodes\": 1, \"slots_per_node\": 1, \"slot_type\": \"cpu\"}}",
             name, sdir, envs, regex);
    return submitted_id(spec);
}

/* Waits until job id is paused or ended, and checks it is in state with a reason holding
 * reason_has (and, when FAILED, naming KILN_PAUSE_AT_STEP). */
static void pause_ended_as(const char *id, const char *state, const char *reason_has)
{
    json_t *job = e2e_wait_state(id, "PAUSED" TH_OR_ENDED, SCRIPT_TIMEOUT_MS);
    cr_assert_str_eq(e2e_jstr(job, "state"), state, "%s", e2e_dump(job));
    cr_assert(strstr(e2e_jstr(job, "reason"), reason_has), "%s", e2e_dump(job));
    if (!strcmp(state, "FAILED"))
        cr_assert(strstr(e2e_jstr(job, "reason"), "KILN_PAUSE_AT_STEP"), "%s", e2e_dump(job));
    json_decref(job);
}

/* A script paused by the rank contract: examples/torch-script under a hyperband search pauses each
 * trial at its first rung (KILN_PAUSE_AT_STEP=4: checkpoint, val_loss at step 4, exit 0; the job
 * PAUSED), and the promoted trial resumes from that checkpoint at step 4, not 0, and runs to 12;
 * the search completes. A script that trains past the step it was told to pause at, or ends
 * before it, is not taken as paused: its job fails with a reason naming KILN_PAUSE_AT_STEP. */
Test(e2e_scripts, hyperband_pauses_a_script_trial_at_its_rung_and_the_promoted_one_resumes_there, .init = e2e_setup,
     .fini = e2e_teardown, .timeout = 400)
{
    if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
        cr_skip_test("python3-torch is not installed for /usr/bin/python3 (scripts/install-deps.sh installs it)");
    /* the contract without torch: scripts that honour the pause, train past it, end before it,
     * count their steps by matches and number them from 0 */
    const char *sdir = script_dir("pause-code");
    write_file(sdir, "steps.sh",
               "echo \"ENV KILN_PAUSE_AT_STEP=${KILN_PAUSE_AT_STEP:-<unset>}\"\n"
               "end=6\n"
               "if [ -n \"$KILN_PAUSE_AT_STEP\" ] && [ -z \"$IGNORE_PAUSE\" ]; then end=$KILN_PAUSE_AT_STEP; fi\n"
               "if [ -n \"$STOP_EARLY\" ]; then end=1; fi\n"
               "s=1\n"
               "if [ -n \"$FROM_ZERO\" ]; then s=0; end=$((end - 1)); fi\n"
               "while [ $s -le $end ]; do\n"
               "  echo \"step $s val_loss=1.$s\"; if [ -n \"$TWICE\" ]; then echo \"again val_loss=1.$s\"; fi\n"
               "  s=$((s + 1))\n"
               "done\n");
    static const char stepped[] = "^step (?<step>[0-9]+) val_loss=([0-9.]+)";
    char *honours = submit_pausing(sdir, "honours", NULL, stepped);
    char *ignores = submit_pausing(sdir, "ignores", "IGNORE_PAUSE", stepped);
    char *early = submit_pausing(sdir, "stops-early", "STOP_EARLY", stepped);
    /* a pattern without a step group numbers its points by counting matches: two a step make
     * "step 6" by the pause at 3, which is no step of the script's, so the pause is taken */
    char *counted = submit_pausing(sdir, "counted", "TWICE", "val_loss=([0-9.]+)");
    /* a script that numbers its steps from 0 ends its 3 steps at step 2: paused there */
    char *zero = submit_pausing(sdir, "from-zero", "FROM_ZERO", stepped);
    char spec[2 * PATH_MAX];
    /* free-form hyperparameters: a max_steps that is no whole number is no step count, and the
     * job (no pause) ends as its ranks do */
    snprintf(spec, sizeof spec, "{\"name\": \"fraction\", \"entry_point\": \"steps.sh\", \"source\": \"%s\","
             " \"retry\": {\"max_attempts\": 1}, \"hyperparameters\": {\"max_steps\": 2.5}}", sdir);
    char *fraction = submitted_id(spec);
    pause_ended_as(honours, "PAUSED", "paused at step 3 of 6");
    char *lines = rank_lines(honours, 0, "ENV ");
    ENV_EQ(lines, "KILN_PAUSE_AT_STEP", "3");
    free(lines);
    pause_ended_as(ignores, "FAILED", "reported step 6, past stopping.max_steps 3");
    pause_ended_as(early, "FAILED", "exited with code 0 at step 1, before stopping.max_steps 3");
    pause_ended_as(counted, "PAUSED", "paused at step 3 of 6");
    pause_ended_as(zero, "PAUSED", "paused at step 3 of 6");
    json_t *job = e2e_wait_state(fraction, TH_JOB_ENDED, SCRIPT_TIMEOUT_MS);
    cr_assert_str_eq(e2e_jstr(job, "state"), "COMPLETED", "%s", e2e_dump(job));
    json_decref(job);
    lines = rank_lines(fraction, 0, "ENV ");
    ENV_EQ(lines, "KILN_PAUSE_AT_STEP", "<unset>");
    free(lines);
    free(honours);
    free(ignores);
    free(early);
    free(counted);
    free(zero);
    free(fraction);

    /* examples/torch-script's train.py under hyperband */
    const char *dir = script_dir("torch-hyperband");
    example_code(dir);
    char tune[PATH_MAX + 64];
    snprintf(tune, sizeof tune, "%s/../torch-hyperband-tune.json", dir);
    example_spec("tune-hyperband.json", tune, hyperband_search);
    json_t *t = tune_submitted(dir, tune, 300);
    cr_assert_str_eq(e2e_jstr(t, "state"), "COMPLETED", "%s", e2e_dump(t));
    json_t *trials = json_object_get(t, "trials");
    cr_assert_eq(json_array_size(trials), 3, "%s", e2e_dump(t));
    const char *promoted = NULL;
    for (size_t i = 0; i < 3; i++) {
        json_t *x = json_array_get(trials, i), *rg = json_array_get(json_object_get(x, "rungs"), 0);
        cr_assert(e2e_jint(rg, "steps") == 4 && json_is_number(json_object_get(rg, "objective")),
                  "every trial finished rung 0 at step 4 with its val_loss: %s", e2e_dump(x));
        json_t *ev = e2e_events(e2e_jstr(x, "job_id"));
        char states[512];
        e2e_event_states(ev, states, sizeof states);
        cr_assert(strstr(states, "RUNNING,PAUSED"), "trial %zu paused at its rung: %s", i, states);
        cr_assert(strstr(e2e_dump(ev), "paused at step 4 of 12"), "%s", e2e_dump(ev));
        json_decref(ev);
        if (e2e_jint(x, "rung") == 1) {
            cr_assert_null(promoted, "one trial promoted: %s", e2e_dump(t));
            promoted = e2e_jstr(x, "job_id");
            cr_assert_eq(e2e_jint(x, "steps"), 12, "%s", e2e_dump(x));
        }
    }
    cr_assert_not_null(promoted, "%s", e2e_dump(t));
    char path[160];
    job = e2e_get((snprintf(path, sizeof path, "/v1/jobs/%s", promoted), path));
    cr_assert_str_eq(e2e_jstr(job, "state"), "COMPLETED", "%s", e2e_dump(job));
    json_decref(job);
    char *resumed = rank_lines(promoted, 0, "resumed from step ");
    cr_assert_str_eq(resumed, "resumed from step 4\n", "the promoted attempt resumed at the rung's step, not 0");
    free(resumed);
    char *paused = rank_lines(promoted, 0, "paused at step ");
    cr_assert_str_eq(paused, "paused at step 4 of 12\n", "train.py paused once, at its rung");
    free(paused);
    json_decref(t);
    e2e_pass();
}
