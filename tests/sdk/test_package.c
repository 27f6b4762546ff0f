/* test_package.c - the Python SDK as a package: `pip install` of sdk/python works offline into
 * a fresh virtual environment (Debian's setuptools as the build backend, no index), the installed
 * package carries py.typed and imports, and the sources pass mypy --strict (Debian's python3-mypy)
 * and pyright in strict mode (tools/, from npm), so a script with a misspelled Estimator keyword
 * fails mypy --strict. The SDK's behaviour against a real kilnd is
 * tests/sdk/test_sdk.py, run by the end-to-end suite. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "base/base.h"
#include "tests/common/harness.h"

TestSuite(sdk_package, .timeout = 300);

/* Runs a shell command from the repository root; asserts it exits 0 and shows its output if not. */
static void run(const char *what, const char *cmdline)
{
    const char *root = getenv("KILN_ROOT") ? getenv("KILN_ROOT") : ".";
    char dir[] = "/tmp/kiln-sdkpkg.XXXXXX";
    cr_assert(mkdtemp(dir));
    char cmd[4096], out_file[128];
    snprintf(out_file, sizeof out_file, "%s/out.txt", dir);
    snprintf(cmd, sizeof cmd, "cd %s && export T=%s && { %s ; } > %s 2>&1", root, dir, cmdline, out_file);
    int rc = system(cmd);
    char *report = NULL;
    kiln_err_t err;
    kiln_file_read(out_file, &report, NULL, &err);
    if (!th_rm_tree(dir))
        fprintf(stderr, "could not remove %s\n", dir);
    cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "%s failed:\n%.8000s", what, report ? report : "");
    free(report);
}

Test(sdk_package, pip_installs_offline_into_a_fresh_venv)
{
    /* A copy of the sources, so the build's egg-info stays out of the tree; no index at all. */
    run("pip install ./sdk/python",
        "cp -r sdk/python $T/src && /usr/bin/python3 -m venv --system-site-packages $T/venv && "
        "PIP_FIND_LINKS= $T/venv/bin/pip install --no-index --no-build-isolation --disable-pip-version-check $T/src && "
        "cd / && $T/venv/bin/python -c '"
        "import os, kiln, importlib.metadata as m; "
        "d = os.path.dirname(kiln.__file__); "
        "assert d.startswith(os.environ[\"T\"] + \"/venv/\"), d; "
        "assert os.path.exists(os.path.join(d, \"py.typed\")), \"no py.typed\"; "
        "assert m.version(\"kiln-sdk\") == kiln.__version__, m.version(\"kiln-sdk\"); "
        "assert m.requires(\"kiln-sdk\") is None, m.requires(\"kiln-sdk\"); "
        "print(\"installed\", kiln.__version__, \"at\", d)'");
}

Test(sdk_package, mypy_strict)
{
    run("mypy --strict", "cd sdk/python && /usr/bin/python3 -m mypy --strict --cache-dir $T/mypy kiln");
}

Test(sdk_package, pyright_strict)
{
    run("pyright (strict)", "tools/node_modules/.bin/pyright -p sdk/python/pyrightconfig.json");
}

/* Runs a shell command from the repository root; asserts it exits non-zero and its output holds
 * want. */
static void run_fails(const char *what, const char *cmdline, const char *want)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "out=$( { %s ; } 2>&1 ) && { echo \"$out\"; echo '%s passed'; exit 1; }; "
             "echo \"$out\"; echo \"$out\" | grep -qF '%s'", cmdline, what, want);
    run(what, cmd);
}

/* Every keyword of Estimator is declared: a misspelled one (hyperparameter=, SageMaker's own
 * spelling being hyperparameters=) is a type error, while the same script spelled right passes. */
Test(sdk_package, mypy_strict_flags_a_misspelled_estimator_keyword)
{
    static const char script[] =
        "import kiln\n"
        "est = kiln.Estimator(entry_point=\"train.py\", source_dir=\".\", HP={\"epochs\": 1}, instance_count=2,\n"
        "                     distribution={\"torch_distributed\": {\"enabled\": True}},\n"
        "                     metric_definitions=[{\"Name\": \"acc\", \"Regex\": \"acc=([0-9.]+)\"}])\n"
        "job = est.fit(inputs={\"train\": \"/data/train\", \"validation\": \"/data/val\"}, wait=False)\n"
        "points: list[kiln.MetricPoint] = job.metrics()[\"acc\"]\n"
        "print(points[0].time.isoformat(), points[0].step, job.dataframe())\n"
        "kiln.log_metrics(1, acc=0.5)\n";
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "printf '%%s' '%s' | sed 's/HP=/hyperparameters=/' > $T/ok.py && "
             "MYPYPATH=sdk/python /usr/bin/python3 -m mypy --strict --cache-dir $T/mypy $T/ok.py",
             script);
    run("mypy --strict on an Estimator script", cmd);
    snprintf(cmd, sizeof cmd,
             "printf '%%s' '%s' | sed 's/HP=/hyperparameter=/' > $T/typo.py && "
             "MYPYPATH=sdk/python /usr/bin/python3 -m mypy --strict --cache-dir $T/mypy $T/typo.py",
             script);
    run_fails("mypy --strict on a misspelled keyword", cmd, "Unexpected keyword argument \"hyperparameter\" for \"Estimator\"");
}
