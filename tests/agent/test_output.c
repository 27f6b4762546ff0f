/* test_output.c - what of rank 0's output directory the agent would upload (agent_output_scan):
 * regular files with one link and a name artifacts may have, hashed, by name; symbolic links
 * (to a secret outside), hard links, directories, FIFOs and odd names are skipped, each with a
 * note; a missing directory is nothing to upload. A script job's model directory is packed first
 * (agent_output_pack_trees). */
#include "agent/agent.h"
#include "agent/agent_int.h"
#include "tests/common/harness.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/kiln-out.XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
    if (!th_rm_tree(dir))
        fprintf(stderr, "could not remove %s\n", dir);
}

TestSuite(output, .init = setup, .fini = teardown);

static void put(const char *name, const char *text)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f, "%s", p);
    fputs(text, f);
    fclose(f);
}

Test(output, only_plain_files_with_good_names_are_taken)
{
    char out[256], p[256], q[256];
    snprintf(out, sizeof out, "%s/output", dir);
    cr_assert_eq(mkdir(out, 0700), 0);
    put("secret", "agent credential\n");                 /* beside the output dir, not in it */
    put("output/model_llmc.bin", "weights");
    put("output/samples.txt", "text");
    put("output/.hidden", "x");
    put("output/a b", "x");
    put("output/evil\r\n[kiln-agent] forged\x1b]0;owned\x07", "x"); /* a name that is a line and a title */
    snprintf(p, sizeof p, "%s/secret", dir);
    snprintf(q, sizeof q, "%s/output/cred", dir);
    cr_assert_eq(symlink(p, q), 0);
    snprintf(q, sizeof q, "%s/output/hard", dir);
    cr_assert_eq(link(p, q), 0);
    snprintf(q, sizeof q, "%s/output/sub", dir);
    cr_assert_eq(mkdir(q, 0700), 0);
    snprintf(q, sizeof q, "%s/output/fifo", dir);
    cr_assert_eq(mkfifo(q, 0600), 0);
    agent_out_file_t *v = NULL;
    size_t n = 0;
    char notes[2048];
    kiln_err_t err;
    cr_assert_eq(agent_output_scan(out, &v, &n, notes, sizeof notes, &err), 0, "%s", err.message);
    cr_assert_eq(n, 2, "%s", notes);
    cr_assert_str_eq(v[0].name, "model_llmc.bin");
    cr_assert_eq(v[0].size, 7);
    char sha[KILN_SHA256_HEX];
    kiln_sha256_hex("weights", 7, sha);
    cr_assert_str_eq(v[0].sha256, sha);
    cr_assert_str_eq(v[1].name, "samples.txt");
    char buf[8] = {0};
    cr_assert_eq(pread(v[0].fd, buf, 7, 0), 7, "the file stays open for the upload");
    cr_assert_str_eq(buf, "weights");
    cr_assert(strstr(notes, "skipped \"cred\": a symbolic link"), "%s", notes);
    cr_assert(strstr(notes, "skipped \"hard\": it has other hard links"), "%s", notes);
    cr_assert(strstr(notes, "skipped \"sub\": a directory"), "%s", notes);
    cr_assert(strstr(notes, "skipped \"fifo\": not a regular file"), "%s", notes);
    cr_assert(strstr(notes, "skipped \".hidden\""), "%s", notes);
    cr_assert(strstr(notes, "skipped \"a b\""), "%s", notes);
    /* each note is one line of the job's log, the job's own name in it escaped */
    cr_assert(strstr(notes, "skipped \"evil\\u000d\\u000a[kiln-agent] forged\\u001b]0;owned\\u0007\": not a name"), "%s",
              notes);
    cr_assert_null(strstr(notes, "\n[kiln-agent] forged"), "%s", notes);
    cr_assert_null(strchr(notes, 0x1b), "%s", notes);
    cr_assert_null(strstr(notes, "agent credential"), "never a file's contents");
    agent_output_free(v, n);
}

Test(output, a_missing_directory_is_nothing_and_a_link_to_one_is_not_followed)
{
    char out[256], p[256];
    snprintf(out, sizeof out, "%s/none", dir);
    agent_out_file_t *v = NULL;
    size_t n = 7;
    char notes[256];
    kiln_err_t err;
    cr_assert_eq(agent_output_scan(out, &v, &n, notes, sizeof notes, &err), 0);
    cr_assert_eq(n, 0);
    agent_output_free(v, n);
    /* an output dir that is itself a link elsewhere (the job replaced it) is refused */
    snprintf(p, sizeof p, "%s/elsewhere", dir);
    cr_assert_eq(mkdir(p, 0700), 0);
    put("elsewhere/x.bin", "x");
    snprintf(out, sizeof out, "%s/output", dir);
    cr_assert_eq(symlink(p, out), 0);
    cr_assert_eq(agent_output_scan(out, &v, &n, notes, sizeof notes, &err), KILN_EIO);
    cr_assert_eq(n, 0);
}

Test(output, at_most_256_files)
{
    char out[256];
    snprintf(out, sizeof out, "%s/output", dir);
    cr_assert_eq(mkdir(out, 0700), 0);
    for (int i = 0; i < 300; i++) {
        char name[64];
        snprintf(name, sizeof name, "output/f%03d.txt", i);
        put(name, "x");
    }
    agent_out_file_t *v = NULL;
    size_t n = 0;
    char notes[512];
    kiln_err_t err;
    cr_assert_eq(agent_output_scan(out, &v, &n, notes, sizeof notes, &err), 0, "%s", err.message);
    cr_assert_eq(n, AGENT_MAX_ARTIFACTS);
    cr_assert_str_eq(v[255].name, "f255.txt");
    cr_assert(strstr(notes, "skipped \"f256.txt\" and the rest"), "%s", notes);
    agent_output_free(v, n);
}

/* A script job's SM_MODEL_DIR (<job dir>/model) becomes output/model.tar.gz when it holds
 * anything; left empty, the note says this attempt has no model (a stopped, preempted or paused
 * attempt's successor may still write one), and an earlier attempt's packed model goes. */
Test(output, a_scripts_model_dir_is_packed_and_an_empty_one_is_told)
{
    char p[256], notes[512];
    const char *sub[] = {"output", "model", "sm-output", "sm-output/data"};
    for (size_t i = 0; i < sizeof sub / sizeof *sub; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, sub[i]);
        cr_assert_eq(mkdir(p, 0700), 0, "%s", p);
    }
    agent_output_pack_trees(dir, notes, sizeof notes);
    cr_assert_str_eq(notes, "the script left SM_MODEL_DIR empty: this attempt has no model");
    put("model/weights.pt", "weights");
    agent_output_pack_trees(dir, notes, sizeof notes);
    cr_assert(strstr(notes, "SM_MODEL_DIR kept as model.tar.gz (1 file(s), "), "%s", notes);
    snprintf(p, sizeof p, "%s/output/model.tar.gz", dir);
    struct stat sb;
    cr_assert_eq(stat(p, &sb), 0, "%s", p);
    snprintf(p, sizeof p, "%s/model/weights.pt", dir);
    cr_assert_eq(unlink(p), 0);
    agent_output_pack_trees(dir, notes, sizeof notes);
    snprintf(p, sizeof p, "%s/output/model.tar.gz", dir);
    cr_assert_neq(stat(p, &sb), 0, "%s is still there", p);
}
