/* test_settings.c - the settings tables of kilnd, kiln-agent and kiln-train (cmd/, parsed by
 * base/config.c), checked through the built programs: a bad value of every declared setting, as a
 * flag and as its environment variable, exits 2 naming it before anything starts (the cases come
 * from each program's --print-settings, so a new setting is covered by itself); --help lists every
 * setting; the fault-injection knobs of this test build are marked; README.md's generated tables
 * are up to date. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "tests/common/harness.h"

TestSuite(settings, .timeout = 300);

/* Runs cmdline with bash from the repository root, $BIN the binaries' directory; asserts the exit
 * status; returns stdout and stderr together (caller frees). */
static char *run(int want, const char *cmdline)
{
    const char *root = getenv("KILN_ROOT") ? getenv("KILN_ROOT") : ".";
    char out_file[] = "/tmp/kiln-settings.XXXXXX";
    int fd = mkstemp(out_file);
    cr_assert(fd >= 0);
    close(fd);
    char *cmd = NULL;
    cr_assert(asprintf(&cmd, "cd %s && export BIN=%s && bash -c '%s' > %s 2>&1", root, th_bin_dir(), cmdline,
                       out_file) > 0);
    int rc = system(cmd);
    free(cmd);
    char *out = NULL;
    kiln_err_t err;
    if (kiln_file_read(out_file, &out, NULL, &err) != 0)
        out = strdup("");
    unlink(out_file);
    int status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    cr_assert_eq(status, want, "%s: exit %d (wanted %d):\n%.8000s", cmdline, status, want, out);
    return out;
}

Test(settings, a_bad_value_of_every_setting_exits_2_naming_it)
{
    char *out = run(0, "bash tests/cmd/bad_settings.sh $BIN kilnd kiln-agent kiln-train");
    /* each program has settings with a type, range or choices to check (more as tables grow) */
    long n[3] = {0, 0, 0};
    const char *progs[] = {"kilnd", "kiln-agent", "kiln-train"};
    for (char *line = out; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        long k;
        char prog[32];
        if (sscanf(line, "checked %ld value(s) of %31s", &k, prog) == 2)
            for (int i = 0; i < 3; i++)
                if (!strcmp(prog, progs[i]))
                    n[i] = k;
    }
    cr_assert(n[0] >= 80 && n[1] >= 50 && n[2] >= 4, "too few cases: %ld %ld %ld\n%s", n[0], n[1], n[2], out);
    free(out);
}

Test(settings, help_lists_every_setting)
{
    char *out = run(0, "for p in kilnd kiln-agent kiln-train; do "
                       "  help=$($BIN/$p --help) || exit 1; "
                       "  $BIN/$p --print-settings | cut -f1,2 | while IFS=$(printf \"\\t\") read -r name env; do "
                       "    grep -q -- \"--$name \" <<<\"$help\" || echo \"$p --help lacks --$name\"; "
                       "    [ \"$env\" = - ] || grep -q -- \"env $env\" <<<\"$help\" || echo \"$p --help lacks $env\"; "
                       "  done; "
                       "done");
    cr_assert_eq(out[0], '\0', "%s", out);
    free(out);
}

Test(settings, every_program_reads_its_log_level_from_its_table)
{
    char *out = run(0, "for p in kilnd kiln-agent kiln-train; do "
                       "  $BIN/$p --print-settings | grep -q \"^log-level\tKILN_LOG_LEVEL\tstr\t-\t-\t"
                       "debug|info|warn|error\" || echo \"$p: no log-level setting\"; "
                       "done");
    cr_assert_eq(out[0], '\0', "%s", out);
    free(out);
}

Test(settings, fault_knobs_are_in_test_builds_only)
{
    /* tests run the binaries `make tests` built, with KILN_FAULTS=1 */
    char *out = run(0, "$BIN/kiln-agent --print-settings | grep \"^upload-delay-ms\" | cut -f2,8");
    cr_assert_str_eq(out, "KILN_AGENT_UPLOAD_DELAY_MS\t1\n");
    free(out);
    /* a plain make (make all, the images) builds without them */
    out = run(0, "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s --no-print-directory print-faults 2>/dev/null");
    cr_assert_str_eq(out, "KILN_FAULTS=0\n");
    free(out);
}

Test(settings, readme_tables_are_generated_from_the_programs)
{
    char *out = run(0, "bash scripts/settings-doc.sh $BIN README.md --check");
    free(out);
    /* a stale README fails */
    out = run(1, "t=$(mktemp) && sed \"s/^| \\`--http-threads\\` .*/| \\`--http-threads\\` | old |/\" README.md > $t "
                 "&& bash scripts/settings-doc.sh $BIN $t --check; rc=$?; rm -f $t; exit $rc");
    cr_assert(strstr(out, "stale"), "%s", out);
    free(out);
}
