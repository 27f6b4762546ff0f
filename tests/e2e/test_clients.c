/* test_clients.c - the user-facing clients against a real kilnd and two real agents: the `kiln`
 * CLI (submit, jobs, describe, logs -f, metrics, stop, workers; exit codes and output) and the
 * Python SDK's tests (tests/sdk, run with /usr/bin/python3). */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "tests/common/harness.h"
#include "tests/e2e/e2e.h"

static char *write_spec(const char *name, const char *text)
{
    static char path[2][PATH_MAX];
    static int next;
    char *p = path[next++ % 2];
    snprintf(p, PATH_MAX, "%s/%s.json", e2e_cl->dir, name);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    return p;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

#define CLI_STEPS 20

Test(e2e_clients, kiln_cli, .init = e2e_setup, .fini = e2e_teardown, .timeout = 240)
{
    char *out = NULL, *err = NULL;
    int rc;

    rc = e2e_kiln(&out, &err, "workers", NULL);
    cr_assert_eq(rc, 0, "kiln workers: %s", err);
    cr_assert(strstr(out, "ID") && strstr(out, "SLOTS"), "%s", out);
    cr_assert(strstr(out, e2e_cl->worker_id[0]) && strstr(out, e2e_cl->worker_id[1]), "%s", out);
    cr_assert_eq(count_lines(out), 3, "%s", out);
    free(out);
    free(err);

    /* submit prints the id alone on stdout (scripts take it from there). */
    char *spec = e2e_spec("cli-tiny", CLI_STEPS, 1, 1, 4);
    const char *file = write_spec("good", spec);
    free(spec);
    rc = e2e_kiln(&out, &err, "submit", file, NULL);
    cr_assert_eq(rc, 0, "kiln submit: %s", err);
    char id[64] = "";
    sscanf(out, "%63s", id);
    cr_assert_eq(strlen(id), 36, "submit printed %s", out);
    cr_assert(strstr(err, "submitted job"), "%s", err);
    free(out);
    free(err);
    char short_id[9];
    snprintf(short_id, sizeof short_id, "%.8s", id);

    /* logs -f with a short id: follows to the end; exit 0 for a COMPLETED job. */
    rc = e2e_kiln(&out, &err, "logs", "-f", short_id, NULL);
    cr_assert_eq(rc, 0, "kiln logs -f: rc %d: %s", rc, err);
    cr_assert(strstr(out, "[rank 0] "), "no rank-tagged lines: %s", out);
    cr_assert(strstr(err, "COMPLETED"), "no end notice: %s", err);
    int followed = count_lines(out);
    free(out);
    free(err);

    /* History gives the same lines. */
    rc = e2e_kiln(&out, &err, "logs", id, NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(count_lines(out), followed, "history %d lines vs followed %d", count_lines(out), followed);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "logs", "--since", "1h", id, NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(count_lines(out), followed, "--since 1h: %d lines of %d", count_lines(out), followed);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "logs", "--since", "2099-01-01T00:00:00Z", id, NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_str_eq(out, "");
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "logs", "--since", "yesterday", id, NULL);
    cr_assert_eq(rc, 1, "a bad --since: rc %d", rc);
    cr_assert(strstr(err, "since"), "%s", err);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "logs", "--rank", "1", id, NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_str_eq(out, "");
    free(out);
    free(err);

    rc = e2e_kiln(&out, &err, "jobs", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, short_id) && strstr(out, "cli-tiny") && strstr(out, "COMPLETED"), "%s", out);
    cr_assert(strstr(out, "20/20"), "no step column: %s", out);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "jobs", "--tag", "suite:e2e", "--limit", "5", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, short_id), "tag filter lost the job: %s", out);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "jobs", "--tag", "suite:nope", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_str_eq(out, "no jobs\n");
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "--json", "jobs", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    json_t *listed = json_loads(out, 0, NULL);
    cr_assert_not_null(listed, "--json output is not JSON: %s", out);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(listed, "jobs"), 0), "id")), id);
    json_decref(listed);
    free(out);
    free(err);
    /* -o json is --json; -o yaml is the same reply as YAML (read back with PyYAML); -o wide has
     * more columns */
    char jf[PATH_MAX], yf[PATH_MAX];
    snprintf(jf, sizeof jf, "%s/jobs.json", e2e_cl->dir);
    snprintf(yf, sizeof yf, "%s/jobs.yaml", e2e_cl->dir);
    rc = e2e_kiln(&out, &err, "describe", short_id, "-o", "json", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    FILE *f = fopen(jf, "w");
    fputs(out, f);
    fclose(f);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "-o", "yaml", "describe", short_id, NULL);
    cr_assert_eq(rc, 0, "%s", err);
    f = fopen(yf, "w");
    fputs(out, f);
    fclose(f);
    free(out);
    free(err);
    char *py[] = {"/usr/bin/python3", "-c",
                  "import json, sys, yaml\n"
                  "j = json.load(open(sys.argv[1])); y = yaml.safe_load(open(sys.argv[2]))\n"
                  "assert j == y, 'YAML and JSON differ'\nassert j['job']['id'], j\nprint('same')",
                  jf, yf, NULL};
    rc = e2e_run(py, NULL, &out, &err, 30000);
    cr_assert_eq(rc, 0, "-o yaml is not -o json as YAML: %s %s", out, err);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "jobs", "-o", "wide", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "PROJECT") && strstr(out, "WORKERS") && strstr(out, "admin"), "%s", out);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "jobs", "-o", "xml", NULL);
    cr_assert_eq(rc, 2, "an unknown format is a usage error: %s", err);
    cr_assert(strstr(err, "unknown output format"), "%s", err);
    free(out);
    free(err);
    /* version: both versions when kilnd answers */
    rc = e2e_kiln(&out, &err, "version", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "kiln " KILN_VERSION "\nkilnd " KILN_VERSION " at "), "%s", out);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "jobs", "--status", "running", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_str_eq(out, "no jobs\n");
    free(out);
    free(err);

    rc = e2e_kiln(&out, &err, "describe", short_id, NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, id) && strstr(out, "State:        COMPLETED"), "%s", out);
    cr_assert(strstr(out, "Progress:     20/20 steps"), "%s", out);
    cr_assert(strstr(out, "train_loss") && strstr(out, "Events:") && strstr(out, "RUNNING  \u2192  COMPLETED"),
              "%s", out);
    free(out);
    free(err);

    rc = e2e_kiln(&out, &err, "metrics", short_id, NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "train_loss") && strstr(out, "\u2581"), "%s", out);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "metrics", short_id, "--name", "train_loss", "--raw", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(!strncmp(out, "step,value\n", 11), "%s", out);
    char last[64] = "";
    const char *p = out + strlen(out) - 1;
    while (p > out && p[-1] != '\n')
        p--;
    sscanf(p, "%63[^,]", last);
    cr_assert_str_eq(last, "20", "last raw row: %s", p);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "metrics", short_id, "--name", "no_such_metric", NULL);
    cr_assert_eq(rc, 3, "not found");
    free(out);
    free(err);

    /* Errors: the API's field and message, and an exit status by kind (README, kiln help): 1
     * refused input, 2 usage, 3 not found, 4 unauthenticated or forbidden, 5 conflict or wrong
     * state, 6 unreachable. */
    char *good_text = e2e_spec("cli-bad", 10, 1, 1, 4);
    json_t *bad_json = json_loads(good_text, 0, NULL);
    json_object_set_new(json_object_get(bad_json, "hyperparameters"), "lr", json_integer(-1));
    char *bad_text = json_dumps(bad_json, JSON_COMPACT);
    const char *bad = write_spec("bad", bad_text);
    free(good_text);
    free(bad_text);
    json_decref(bad_json);
    rc = e2e_kiln(&out, &err, "submit", bad, NULL);
    cr_assert_eq(rc, 1, "bad spec: rc %d", rc);
    cr_assert(!strncmp(err, "error: hyperparameters.lr: ", 27), "%s", err);
    cr_assert_str_eq(out, "");
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "stop", id, NULL);
    cr_assert_eq(rc, 5, "stopping a finished job: rc %d", rc);
    cr_assert(!strncmp(err, "error: ", 7), "%s", err);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "describe", "ffffffff", NULL);
    cr_assert_eq(rc, 3, "not found");
    cr_assert(strstr(err, "no job matches"), "%s", err);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "jobs", "--bogus", NULL);
    cr_assert_eq(rc, 2);
    free(out);
    free(err);
    char closed[64];
    snprintf(closed, sizeof closed, "http://127.0.0.1:%d", th_free_port());
    rc = e2e_kiln(&out, &err, "--url", closed, "jobs", NULL);
    cr_assert_eq(rc, 6, "unreachable");
    cr_assert(strstr(err, "could not connect to kilnd at") && strstr(err, "is kilnd running?"), "%s", err);
    free(out);
    free(err);
    /* a token kilnd does not know: 4; a viewer-less admin's projects create twice: 5 */
    char **env = e2e_client_env(0);
    char *bad_env[] = {env[0], "KILN_TOKEN=kiln_not-a-token-kilnd-knows", env[2], NULL};
    char kiln[PATH_MAX];
    snprintf(kiln, sizeof kiln, "%s/kiln", th_bin_dir());
    char *jobs_argv[] = {kiln, "jobs", NULL};
    rc = e2e_run(jobs_argv, bad_env, &out, &err, 60000);
    cr_assert_eq(rc, 4, "unauthenticated: rc %d: %s", rc, err);
    free(out);
    free(err);
    cr_assert_eq(e2e_kiln(&out, &err, "projects", "create", "cli-twice", NULL), 0, "%s", err);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "projects", "create", "cli-twice", NULL);
    cr_assert_eq(rc, 5, "conflict: rc %d: %s", rc, err);
    free(out);
    free(err);

    /* -o name: whole ids, one a line; --no-headers: the table without its heading */
    rc = e2e_kiln(&out, &err, "jobs", "-o", "name", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    char line[80];
    snprintf(line, sizeof line, "%s\n", id);
    cr_assert(strstr(out, line) && !strstr(out, "ID") && !strstr(out, "cli-tiny"), "%s", out);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "workers", "-o", "name", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(count_lines(out), 2, "%s", out);
    cr_assert(strstr(out, e2e_cl->worker_id[0]) && strstr(out, e2e_cl->worker_id[1]), "%s", out);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "--no-headers", "jobs", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(!strstr(out, "STATE") && !strncmp(out, short_id, 8), "%s", out);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "describe", "-o", "name", short_id, NULL);
    cr_assert_eq(rc, 2, "-o name on a command that lists nothing: %s", err);
    free(out);
    free(err);

    /* bash completion of a job id: the script asks kiln (with the --url typed) for candidates */
    cr_assert_eq(e2e_kiln(&out, &err, "queues", "create", "cli-queue", "--quota", "cpu=1", NULL), 0, "%s", err);
    free(out);
    free(err);
    char script[PATH_MAX * 5 + 1024];
    snprintf(script, sizeof script,
             "source <(%s completion bash) && "
             "COMP_WORDS=(%s --url \"$KILN_URL\" logs %.4s); COMP_CWORD=4; _kiln; echo \"1:${COMPREPLY[*]}\"; "
             "COMP_WORDS=(%s describe \"\"); COMP_CWORD=2; _kiln; echo \"2:${COMPREPLY[*]}\"; "
             "COMP_WORDS=(%s workers approve \"\"); COMP_CWORD=3; _kiln; echo \"3:${COMPREPLY[*]}\"; "
             "COMP_WORDS=(%s queues describe \"\"); COMP_CWORD=3; _kiln; echo \"4:${COMPREPLY[*]}\"",
             kiln, kiln, id, kiln, kiln, kiln);
    char *bash_argv[] = {"/bin/bash", "-c", script, NULL};
    rc = e2e_run(bash_argv, e2e_client_env(0), &out, &err, 60000);
    cr_assert_eq(rc, 0, "%s%s", out, err);
    snprintf(line, sizeof line, "1:%s\n", id);
    cr_assert(strstr(out, line), "a job id prefix completes to the job: %s%s", out, err);
    cr_assert(strstr(out, "2:") && strstr(strstr(out, "2:"), id), "%s", out);
    cr_assert(strstr(strstr(out, "3:"), e2e_cl->worker_id[0]), "%s", out);
    cr_assert(strstr(strstr(out, "4:"), "cli-queue"), "%s", out);
    free(out);
    free(err);

    /* kiln queues list, describe, update and delete against the real kilnd, and the pending
     * block kiln describe prints for a job that waits for its queue's quota */
    rc = e2e_kiln(&out, &err, "queues", "list", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "NAME") && strstr(out, "QUOTA") && strstr(out, "PENDING"), "%s", out);
    cr_assert(strstr(out, "\ncli-queue ") && strstr(out, "cpu 1, gpu 0") && strstr(out, "\ndefault "), "%s", out);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "queues", "update", "cli-queue", "--quota", "cpu=4", "--weight", "3", "--projects",
                  "default", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "quota:           cpu 4, gpu 0\n") && strstr(out, "weight:          3\n"), "%s", out);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "queues", "describe", "cli-queue", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "name:            cli-queue\n") && strstr(out, "quota:           cpu 4, gpu 0\n")
              && strstr(out, "weight:          3\n") && strstr(out, "projects:        default\n")
              && strstr(out, "pending:         0 job(s)\n"), "%s", out);
    cr_assert(strstr(out, "admitted:        0 job(s) holding slots\n") && !strstr(out, "(borrowing"), "%s", out);
    cr_assert(strstr(out, "preemption:      within queue lower_priority, reclaim within cohort any\n"), "%s", out);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "queues", "update", "cli-queue", "--preempt-within-queue", "never",
                  "--reclaim-within-cohort", "lower_priority", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "preemption:      within queue never, reclaim within cohort lower_priority\n"), "%s", out);
    free(out);
    free(err);
    /* -o wide lists each queue's preemption policy, weight and admitted jobs */
    rc = e2e_kiln(&out, &err, "-o", "wide", "queues", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, " ADMITTED WEIGHT WITHIN-QUEUE   RECLAIM\n"), "%s", out);
    cr_assert(strstr(out, "\ncli-queue ") && strstr(strstr(out, "\ncli-queue "), " 3      never          lower_priority\n"),
              "%s", out);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "queues", "update", "cli-queue", "--reclaim-within-cohort", "sometimes", NULL);
    cr_assert_eq(rc, 1, "kilnd refuses the value: rc %d: %s", rc, err);
    cr_assert(strstr(err, "preemption.reclaim_within_cohort: must be any, lower_priority or never (got \"sometimes\")"),
              "%s", err);
    free(out);
    free(err);
    /* a queue no project may use says so, where its projects line was empty */
    rc = e2e_kiln(&out, &err, "queues", "update", "cli-queue", "--projects", "", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "projects:        none: no project may submit to it"), "%s", out);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "queues", "update", "cli-queue", "--projects", "default", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "queues", "describe", "no-such-queue", NULL);
    cr_assert_eq(rc, 3, "a queue that does not exist: rc %d: %s", rc, err);
    cr_assert(strstr(err, "queue \"no-such-queue\" does not exist"), "%s", err);
    free(out);
    free(err);
    {
        /* a job within the queue's quota that no worker can hold (4 slots on one; the agents
         * have 2 and 1): it waits, saying why */
        char *qs = e2e_spec("cli-waits", 1000000, 1, 4, 4);
        json_t *qj = json_loads(qs, 0, NULL);
        free(qs);
        json_object_set_new(qj, "queue", json_string("cli-queue"));
        char *qtext = json_dumps(qj, 0);
        json_decref(qj);
        const char *qfile = write_spec("waits", qtext);
        free(qtext);
        rc = e2e_kiln(&out, &err, "submit", qfile, NULL);
        cr_assert_eq(rc, 0, "%s", err);
        char wid[64] = "";
        sscanf(out, "%63s", wid);
        free(out);
        free(err);
        /* the scheduler's next pass writes the job's pending reason */
        bool shown = false;
        for (int i = 0; i < 300 && !shown; i++) {
            rc = e2e_kiln(&out, &err, "describe", wid, NULL);
            cr_assert_eq(rc, 0, "%s", err);
            shown = strstr(out, "Position:") != NULL;
            if (shown) {
                cr_assert(strstr(out, "Position:     1 in queue cli-queue\n"), "%s", out);
                cr_assert(strstr(out, "Missing:      needs 1 worker(s) with 4 cpu slot(s) each, more than the alive "
                                      "workers have (the largest alive cpu worker has 2)\n"), "%s", out);
                cr_assert(strstr(out, "Est. start:   unknown"), "no worker it could run on: %s", out);
                cr_assert(strstr(out, "State:        QUEUED"), "%s", out);
            }
            free(out);
            free(err);
            if (!shown)
                usleep(100 * 1000);
        }
        cr_assert(shown, "kiln describe never showed the waiting job's pending block");
        rc = e2e_kiln(&out, &err, "queues", "list", NULL);
        cr_assert_eq(rc, 0, "%s", err);
        cr_assert(strstr(out, "\ncli-queue ") && strstr(out, "cpu 4, gpu 0"), "%s", out);
        const char *row = strstr(out, "\ncli-queue ");
        cr_assert(row && strchr(row + 1, '\n') && strchr(row + 1, '\n')[-1] == '1', "one job pending: %s", out);
        free(out);
        free(err);
        /* a queue one of whose jobs waits stays; once the job is stopped it goes */
        rc = e2e_kiln(&out, &err, "queues", "delete", "cli-queue", NULL);
        cr_assert_eq(rc, 5, "a busy queue: rc %d: %s", rc, err);
        cr_assert(strstr(err, "queue \"cli-queue\" has 1 job(s) waiting or running"), "%s", err);
        free(out);
        free(err);
        rc = e2e_kiln(&out, &err, "stop", wid, NULL);
        cr_assert_eq(rc, 0, "%s", err);
        free(out);
        free(err);
        /* a project's default queue: only one the project may use; the queue stays while it is */
        rc = e2e_kiln(&out, &err, "projects", "create", "cli-proj", NULL);
        cr_assert_eq(rc, 0, "%s", err);
        cr_assert(strstr(out, "created project cli-proj (default queue default)"), "%s", out);
        free(out);
        free(err);
        rc = e2e_kiln(&out, &err, "projects", "update", "cli-proj", "--default-queue", "cli-queue", NULL);
        cr_assert_eq(rc, 1, "rc %d: %s", rc, err);
        cr_assert(strstr(err, "project \"cli-proj\" may not use queue \"cli-queue\""), "%s", err);
        free(out);
        free(err);
        rc = e2e_kiln(&out, &err, "queues", "update", "cli-queue", "--projects", "default,cli-proj", NULL);
        cr_assert_eq(rc, 0, "%s", err);
        free(out);
        free(err);
        rc = e2e_kiln(&out, &err, "projects", "update", "cli-proj", "--default-queue", "cli-queue", NULL);
        cr_assert_eq(rc, 0, "%s", err);
        cr_assert(strstr(out, "project cli-proj: default queue cli-queue"), "%s", out);
        free(out);
        free(err);
        rc = e2e_kiln(&out, &err, "projects", "list", NULL);
        cr_assert_eq(rc, 0, "%s", err);
        cr_assert(strstr(out, "DEFAULT-QUEUE") && strstr(out, "cli-proj") && strstr(strstr(out, "cli-proj"), "cli-queue"),
                  "%s", out);
        free(out);
        free(err);
        rc = e2e_kiln(&out, &err, "queues", "delete", "cli-queue", NULL);
        cr_assert_eq(rc, 5, "the default queue of a project: rc %d: %s", rc, err);
        cr_assert(strstr(err, "queue \"cli-queue\" is the default queue of project \"cli-proj\""), "%s", err);
        free(out);
        free(err);
        /* nor may it shut that project out */
        rc = e2e_kiln(&out, &err, "queues", "update", "cli-queue", "--projects", "default", NULL);
        cr_assert_eq(rc, 5, "leaving out a project whose default queue it is: rc %d: %s", rc, err);
        cr_assert(strstr(err, "queue \"cli-queue\" is the default queue of project \"cli-proj\", which projects would "
                              "no longer let in")
                  && strstr(err, "kiln projects update cli-proj --default-queue QUEUE"), "%s", err);
        free(out);
        free(err);
        /* an empty name is no queue */
        rc = e2e_kiln(&out, &err, "projects", "update", "cli-proj", "--default-queue", "", NULL);
        cr_assert_eq(rc, 1, "rc %d: %s", rc, err);
        cr_assert(strstr(err, "default_queue: must name a queue") && strstr(err, "the queue \"default\" is the cluster's own"),
                  "%s", err);
        free(out);
        free(err);
        rc = e2e_kiln(&out, &err, "projects", "update", "cli-proj", "--default-queue", "default", NULL);
        cr_assert_eq(rc, 0, "%s", err);
        free(out);
        free(err);
        rc = e2e_kiln(&out, &err, "queues", "delete", "cli-queue", NULL);
        cr_assert_eq(rc, 0, "%s", err);
        cr_assert(strstr(out, "deleted queue cli-queue"), "%s", out);
        free(out);
        free(err);
        rc = e2e_kiln(&out, &err, "queues", "list", "-o", "name", NULL);
        cr_assert_eq(rc, 0, "%s", err);
        cr_assert(!strstr(out, "cli-queue") && strstr(out, "default"), "%s", out);
        free(out);
        free(err);
    }

    /* stop a running job, then submit --follow a job that ends COMPLETED (exit 0). */
    spec = e2e_spec("cli-long", 1000000, 1, 1, 4);
    file = write_spec("long", spec);
    free(spec);
    rc = e2e_kiln(&out, &err, "submit", file, "--idempotency-key", "cli-long-1", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    char long_id[64] = "";
    sscanf(out, "%63s", long_id);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "submit", file, "--idempotency-key", "cli-long-1", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(!strncmp(out, long_id, 36), "idempotent retry gave another job: %s vs %s", out, long_id);
    free(out);
    free(err);
    json_decref(e2e_wait_state(long_id, "RUNNING", 120000));
    rc = e2e_kiln(&out, &err, "stop", long_id, "--reason", "cli stop", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "STOPPING") || strstr(out, "STOPPED"), "%s", out);
    free(out);
    free(err);
    json_decref(e2e_wait_state(long_id, "STOPPED", 60000));

    /* The example job, as a user would submit it from the repository root (its relative data
     * path is sent as an absolute one): followed to COMPLETED, exit 0. */
    rc = e2e_kiln(&out, &err, "submit", "--follow", "examples/gpt-tiny.json", NULL);
    cr_assert_eq(rc, 0, "submit --follow examples/gpt-tiny.json: rc %d: %s", rc, err);
    cr_assert(strstr(out, "[rank 0] "), "%s", out);
    cr_assert(strstr(err, "COMPLETED"), "%s", err);
    free(out);
    free(err);
    /* A job that fails in its rank: submit --follow ends with exit 1 and says why. */
    char *fail_base = e2e_spec("cli-fails", 10, 1, 1, 4);
    json_t *fail_json = json_loads(fail_base, 0, NULL);
    free(fail_base);
    /* inside a data root (so kilnd accepts it) but missing: the rank fails to open it */
    char missing[PATH_MAX + 32];
    snprintf(missing, sizeof missing, "%s/data/no-such-corpus.txt", e2e_root());
    json_object_set_new(json_object_get(fail_json, "data"), "train", json_string(missing));
    char *fail_text = json_dumps(fail_json, JSON_COMPACT);
    file = write_spec("fails", fail_text);
    free(fail_text);
    json_decref(fail_json);
    rc = e2e_kiln(&out, &err, "submit", "-f", file, NULL);
    cr_assert_eq(rc, 1, "submit -f of a failing job: rc %d: %s", rc, err);
    cr_assert(strstr(err, "FAILED") && strstr(err, "no-such-corpus.txt"), "%s", err);
    free(out);
    free(err);

    /* Paging: --limit cuts (and says so), --all follows next_page_token to the end. */
    rc = e2e_kiln(&out, &err, "jobs", "--limit", "1", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(count_lines(out), 2, "%s", out);
    cr_assert(strstr(err, "--all"), "no hint that more jobs exist: %s", err);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "jobs", "--all", "--page-size", "1", NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(count_lines(out), 6, "5 jobs and a header expected: %s", out);
    cr_assert(strstr(out, short_id) && strstr(out, "gpt-tiny") && strstr(out, "cli-long"), "%s", out);
    free(out);
    free(err);
    e2e_pass();
}

/* `kiln logs -f` keeps following through a kilnd crash and restart: it reconnects with the last
 * sequence number it printed, so no line is lost or shown twice, and it ends with the job. */
Test(e2e_clients, logs_follow_survives_kilnd_restart, .init = e2e_setup, .fini = e2e_teardown, .timeout = 240)
{
    char *spec = e2e_spec("cli-restart", 1500, 1, 1, 4);
    json_t *job = e2e_submit(spec);
    free(spec);
    char id[64];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(job, "id")));
    json_decref(job);
    char out_path[PATH_MAX], err_path[PATH_MAX];
    snprintf(out_path, sizeof out_path, "%s/follow.out", e2e_cl->dir);
    snprintf(err_path, sizeof err_path, "%s/follow.err", e2e_cl->dir);
    pid_t follower = e2e_kiln_bg(out_path, err_path, "logs", "-f", id, NULL);
    cr_assert(follower > 0);

    /* kilnd dies while the job certainly runs (its rank frozen at step 20), and the rank goes
     * on training and logging while kilnd is down: the agent holds those lines until it is back. */
    pid_t ranks[E2E_MAX_RANKS];
    int n_ranks = 0;
    json_decref(e2e_freeze_at_step(id, 20, 120000, ranks, &n_ranks));
    e2e_kilnd_kill();
    e2e_thaw(ranks, n_ranks);
    usleep(500000);
    e2e_kilnd_start();

    int rc = e2e_wait_exit(follower, 180000);
    char *out = e2e_slurp(out_path), *err = e2e_slurp(err_path);
    cr_assert_eq(rc, 0, "kiln logs -f: rc %d; stderr: %s", rc, err);
    cr_assert(strstr(err, "reconnecting"), "the follower did not notice the restart: %s", err);
    cr_assert(strstr(err, "COMPLETED"), "%s", err);
    json_t *final = e2e_wait_state(id, TH_JOB_ENDED, 10000);
    cr_assert_str_eq(json_string_value(json_object_get(final, "state")), "COMPLETED", "%s",
                     json_string_value(json_object_get(final, "reason")));
    json_decref(final);

    /* Exactly the stored lines, in order, once each. */
    char *hist = NULL, *herr = NULL;
    cr_assert_eq(e2e_kiln(&hist, &herr, "logs", id, NULL), 0, "%s", herr);
    cr_assert_gt(count_lines(hist), 1500, "history has %d lines", count_lines(hist));
    if (strcmp(out, hist) != 0) {
        size_t k = 0;
        while (out[k] && out[k] == hist[k])
            k++;
        cr_assert_fail("followed output differs from the history at byte %zu (followed %d lines, history %d):"
                       "\nfollowed: %.200s\nhistory:  %.200s", k, count_lines(out), count_lines(hist), out + k,
                       hist + k);
    }
    free(hist);
    free(herr);
    free(out);
    free(err);
    e2e_pass();
}

/* kiln code push / get and kiln submit --source-dir: the directory packed without what its
 * .kilnignore names, uploaded once, named as the job's source; describe shows the script. */
Test(e2e_clients, kiln_code, .init = e2e_setup, .fini = e2e_teardown, .timeout = 240)
{
    char src[PATH_MAX], p[PATH_MAX + 32];
    snprintf(src, sizeof src, "%s/code-src", e2e_cl->dir);
    cr_assert_eq(mkdir(src, 0755), 0);
    static const char *const files[][2] = {{"train.py", "print('hello from a script')\n"},
                                           {"noise.log", "left out"},
                                           {".kilnignore", "*.log\n"}};
    for (size_t i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", src, files[i][0]);
        FILE *f = fopen(p, "w");
        fputs(files[i][1], f);
        fclose(f);
    }
    char *out = NULL, *err = NULL;
    int rc = e2e_kiln(&out, &err, "code", "push", src, NULL);
    cr_assert_eq(rc, 0, "kiln code push: %s", err);
    char source[100] = "";
    sscanf(out, "%99s", source);
    cr_assert(!strncmp(source, "code:sha256:", 12) && strlen(source) == 76, "printed %s", out);
    cr_assert(strstr(err, "packed") && strstr(err, "2 files") && strstr(err, "uploaded"), "%s", err);
    free(out);
    free(err);
    rc = e2e_kiln(&out, &err, "code", "push", src, NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, source), "the same tree, the same source: %s", out);
    cr_assert(strstr(err, "already uploaded"), "%s", err);
    free(out);
    free(err);

    /* a script spec without a source: --source-dir fills it in */
    const char *spec = write_spec("script", "{\"name\": \"cli-script\", \"entry_point\": \"train.py\","
                                            " \"hyperparameters\": {\"epochs\": 2}}");
    rc = e2e_kiln(&out, &err, "submit", "--source-dir", src, spec, NULL);
    cr_assert_eq(rc, 0, "kiln submit --source-dir: %s", err);
    char id[64] = "";
    sscanf(out, "%63s", id);
    free(out);
    free(err);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    json_t *job = e2e_get(path);
    cr_assert_str_eq(e2e_jstr(json_object_get(job, "spec"), "source"), source, "%s", e2e_dump(job));
    json_decref(job);
    rc = e2e_kiln(&out, &err, "describe", id, NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "Entry point:") && strstr(out, "train.py"), "%s", out);
    cr_assert(strstr(out, source), "describe names the source: %s", out);
    cr_assert(strstr(out, "\"epochs\":2"), "and the script's hyperparameters: %s", out);
    free(out);
    free(err);

    /* the archive comes back, checked, and without the .log file */
    snprintf(p, sizeof p, "%s/back.tgz", e2e_cl->dir);
    rc = e2e_kiln(&out, &err, "code", "get", source, "-o", p, NULL);
    cr_assert_eq(rc, 0, "kiln code get: %s", err);
    cr_assert(strstr(err, "verified"), "%s", err);
    free(out);
    free(err);
    char cmd[PATH_MAX * 3];
    snprintf(cmd, sizeof cmd, "tar -tzf %s > %s.list", p, p);
    cr_assert_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s.list", p);
    char *list = e2e_slurp(cmd);
    cr_assert(strstr(list, "train.py") && !strstr(list, "noise.log"), "%s", list);
    free(list);

    /* --source-dir needs a script spec, and only one source */
    spec = write_spec("engine", "{\"model\": {\"type\": \"gpt\"}, \"data\": {\"train\": \"/x\"}}");
    rc = e2e_kiln(&out, &err, "submit", "--source-dir", src, spec, NULL);
    cr_assert_neq(rc, 0);
    cr_assert(strstr(err, "no entry_point"), "%s", err);
    free(out);
    free(err);
    snprintf(path, sizeof path, "/v1/jobs/%s:stop", id);
    long st = 0;
    json_decref(e2e_http("POST", path, "{}", NULL, &st));
    e2e_pass();
}

Test(e2e_clients, python_sdk, .init = e2e_setup, .fini = e2e_teardown, .timeout = 300)
{
    if (access("/usr/bin/python3", X_OK) != 0)
        cr_assert_fail("/usr/bin/python3 is missing");
    char tests[PATH_MAX + 32];
    snprintf(tests, sizeof tests, "%s/tests/sdk", e2e_root());
    char *argv[] = {"/usr/bin/python3", "-m", "unittest", "discover", "-v", "-s", tests, NULL};
    static char root[PATH_MAX + 16];
    snprintf(root, sizeof root, "KILN_ROOT=%s", e2e_root());
    char **env = e2e_client_env(3);
    int n = 0;
    while (env[n])
        n++;
    env[n++] = root;
    env[n++] = "KILN_SDK_REQUIRE_SERVER=1";
    env[n++] = "PYTHONDONTWRITEBYTECODE=1";
    char *out = NULL, *err = NULL;
    int rc = e2e_run(argv, env, &out, &err, 280000);
    if (rc != 0 || getenv("KILN_E2E_VERBOSE"))
        fprintf(stderr, "---- python SDK tests (rc %d):\n%s%s\n", rc, out, err);
    cr_assert_eq(rc, 0, "python SDK tests failed");
    /* unittest reports on stderr; no case may be skipped here. */
    cr_assert(strstr(err, "\nOK") && !strstr(err, "skipped"), "%s", err);
    free(out);
    free(err);
    e2e_pass();
}
