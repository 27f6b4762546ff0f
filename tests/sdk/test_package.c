/* test_package.c - the Python SDK as a package: `pip install` of sdk/python works offline into
 * a fresh virtual environment (Debian's setuptools as the build backend, no index), the installed
 * package carries py.typed and imports, and the sources pass mypy --strict (Debian's python3-mypy)
 * and pyright in strict mode (tools/, from npm). The SDK's behaviour against a real kilnd is
 * tests/sdk/test_sdk.py, run by the end-to-end suite. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "base/base.h"

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
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
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
