/* test_deploy.c - deploy/ checked with tools the project did not write, without a cluster, a
 * Docker engine or a running systemd: `kubectl kustomize deploy/k8s` builds and every object it
 * makes (and every other manifest in deploy/k8s) is valid against the Kubernetes API's schemas
 * (tools/k8s-validate.mjs: kubernetes-models' Ajv validators); the Helm chart's values match its
 * values.schema.json and its templates, rendered by Go's text/template with Sprig and Helm's
 * own functions (tools/chart-render; the Helm binary cannot be installed here), give valid
 * objects with the operator's expectations (2 kilnd replicas, a PodDisruptionBudget, agent
 * probes, GPUs and slots from values, no Secret written by the chart, an artifact volume whose
 * access mode fits the replicas, the database URL as a file, NetworkPolicies both ways, images of
 * the chart's appVersion) and deploy/k8s agrees with them (tests/deploy/k8s_matches_chart.py); a
 * broken manifest or two replicas on a ReadWriteOnce volume are refused; deploy/check.sh passes; the systemd units verify and keep their `systemd-analyze
 * security` scores; every path that runs kiln-agent runs it with the ranks' sandbox on and the
 * least privilege it works with (tests/deploy/sandbox_checks.py, the unit's capabilities); and
 * the images build the engine with the Makefile's compiler flags. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "tests/common/harness.h"

TestSuite(deploy, .timeout = 300);

/* Runs cmdline with bash from the repository root, $T a fresh temporary directory; asserts the
 * exit status; returns the output (caller frees). */
static char *run(const char *what, int want, const char *cmdline)
{
    const char *root = getenv("KILN_ROOT") ? getenv("KILN_ROOT") : ".";
    char dir[] = "/tmp/kiln-deploy.XXXXXX";
    cr_assert(mkdtemp(dir));
    char *cmd = malloc(strlen(cmdline) + 1024);
    char out_file[128];
    snprintf(out_file, sizeof out_file, "%s/out.txt", dir);
    sprintf(cmd, "cd %s && export T=%s BIN=%s && bash -c '%s' > %s 2>&1", root, dir, th_bin_dir(), cmdline, out_file);
    int rc = system(cmd);
    char *report = NULL;
    kiln_err_t err;
    if (kiln_file_read(out_file, &report, NULL, &err) != 0)
        report = strdup("");
    if (!th_rm_tree(dir))
        fprintf(stderr, "could not remove %s\n", dir);
    free(cmd);
    int status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    cr_assert(want >= 0 ? status == want : status != 0, "%s: exit %d (wanted %s%d):\n%.8000s", what, status,
              want >= 0 ? "" : "not ", want >= 0 ? want : 0, report);
    return report;
}

Test(deploy, kustomize_builds_and_every_manifest_is_valid)
{
    char *out = run("kubectl kustomize + k8s-validate", 0,
                    "command -v kubectl >/dev/null || { echo \"kubectl is missing\"; exit 1; }; "
                    "kubectl kustomize deploy/k8s > $T/k.yaml && "
                    "node tools/k8s-validate.mjs $T/k.yaml deploy/k8s/kiln-agent-gpu.yaml deploy/k8s/networkpolicy.yaml "
                    "deploy/k8s/postgres-trial.yaml deploy/k8s/cert-manager.yaml && "
                    "/usr/bin/python3 tests/deploy/sandbox_checks.py $T/k.yaml deploy/k8s/kiln-agent-gpu.yaml && "
                    "echo \"secrets in -k: $(grep -c \"^kind: Secret\" $T/k.yaml)\"");
    cr_assert(strstr(out, "Deployment/kilnd") && strstr(out, "DaemonSet/kiln-agent-cpu"), "%s", out);
    cr_assert(strstr(out, "sandbox ok: 2 agent DaemonSet(s), 1 kilnd"), "%s", out);
    /* kubectl apply -k applies no Secret: no password or token is written in the repository */
    cr_assert(strstr(out, "secrets in -k: 0\n"), "%s", out);
    free(out);
}

/* Builds tools/chart-render (Go, Debian's Sprig and yaml.v3) into $T/chart-render. */
#define CHART_RENDER                                                                                               \
    "command -v go >/dev/null || { echo \"go is missing (golang-go)\"; exit 1; }; "                             \
    "GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE=${BIN%/bin}/gocache go build -o $T/chart-render "           \
    "./tools/chart-render || exit 1; "

Test(deploy, helm_chart_renders_to_valid_objects)
{
    /* the defaults, and everything switched on with other numbers */
    char *out = run(
        "helm chart", 0,
        CHART_RENDER
        "printf \"kilnd:\\n  replicas: 3\\n  podDisruptionBudget:\\n    minAvailable: 2\\nagents:\\n  gpu:\\n    "
        "enabled: true\\n    gpusPerNode: 4\\n  cpu:\\n    slots: 6\\nserviceMonitor:\\n  enabled: true\\n"
        "networkPolicy:\\n  database:\\n    cidr: 10.20.0.0/16\\n\" > $T/all.yaml && "
        "printf \"kilnd:\\n  replicas: 1\\n  artifacts:\\n    accessMode: ReadWriteOnce\\n\" > $T/rwo.yaml && "
        "$T/chart-render -n kiln deploy/helm/kiln > $T/default.yaml && "
        "$T/chart-render -n ml -f $T/all.yaml deploy/helm/kiln > $T/all-out.yaml && "
        "$T/chart-render -n kiln -f $T/rwo.yaml deploy/helm/kiln > $T/rwo-out.yaml && "
        "node tools/k8s-validate.mjs --values deploy/helm/kiln/values.schema.json deploy/helm/kiln/values.yaml -- "
        "$T/default.yaml && "
        "node tools/k8s-validate.mjs --values deploy/helm/kiln/values.schema.json deploy/helm/kiln/values.yaml "
        "$T/all.yaml -- $T/all-out.yaml && "
        "node tools/k8s-validate.mjs --values deploy/helm/kiln/values.schema.json deploy/helm/kiln/values.yaml "
        "$T/rwo.yaml -- $T/rwo-out.yaml && "
        "/usr/bin/python3 tests/deploy/chart_checks.py $T/default.yaml $T/all-out.yaml $T/rwo-out.yaml && "
        "kubectl kustomize deploy/k8s > $T/k.yaml && "
        "/usr/bin/python3 tests/deploy/k8s_matches_chart.py $T/default.yaml $T/k.yaml deploy/k8s/networkpolicy.yaml && "
        "/usr/bin/python3 tests/deploy/sandbox_checks.py $T/all-out.yaml");
    cr_assert(strstr(out, "chart ok"), "%s", out);
    cr_assert(strstr(out, "k8s matches the chart"), "%s", out);
    cr_assert(strstr(out, "sandbox ok: 2 agent DaemonSet(s), 1 kilnd"), "%s", out);
    free(out);
}

Test(deploy, a_broken_manifest_or_bad_values_are_refused)
{
    /* a port that is not a number: the schema refuses it */
    free(run("k8s-validate on a broken Deployment", 1,
             "sed \"s/containerPort: 8080/containerPort: eighty/\" deploy/k8s/kilnd.yaml > $T/bad.yaml && "
             "node tools/k8s-validate.mjs $T/bad.yaml"));
    /* two replicas on one ReadWriteOnce artifact volume: the chart's own check says what to do */
    char *out = run("chart-render with replicas 2 on ReadWriteOnce", 1,
                    CHART_RENDER
                    "printf \"kilnd:\\n  replicas: 2\\n  artifacts:\\n    accessMode: ReadWriteOnce\\n\" > $T/v.yaml && "
                    "$T/chart-render -n kiln -f $T/v.yaml deploy/helm/kiln");
    cr_assert(strstr(out, "kilnd.replicas is 2 but kilnd.artifacts.accessMode is ReadWriteOnce") &&
                  strstr(out, "ReadWriteMany"),
              "%s", out);
    free(out);
    /* an access mode that is neither */
    free(run("values.schema.json on a bad access mode", 1,
             "printf \"kilnd:\\n  artifacts:\\n    accessMode: ReadOnlyMany\\n\" > $T/v.yaml && "
             "node tools/k8s-validate.mjs --values deploy/helm/kiln/values.schema.json deploy/helm/kiln/values.yaml "
             "$T/v.yaml --"));
    /* replicas: "two" is not an integer for the chart's schema */
    free(run("values.schema.json on bad values", 1,
             "printf \"kilnd:\\n  replicas: two\\n\" > $T/v.yaml && "
             "node tools/k8s-validate.mjs --values deploy/helm/kiln/values.schema.json deploy/helm/kiln/values.yaml "
             "$T/v.yaml --"));
}

Test(deploy, check_sh_passes)
{
    free(run("deploy/check.sh", 0, "BUILD=${BIN%/bin} bash deploy/check.sh"));
}

/* The units as systemd 252 reads them: Type=notify with a watchdog, every secret a credential,
 * the agent root with exactly the capabilities its ranks' sandbox uses (agent/sandbox.c; each one
 * found needed by running tests/agent's sandbox suite without it), its cgroup delegated and only
 * mount and PID namespaces allowed, and the exposure `systemd-analyze security` computes no worse
 * than now: kilnd 1.5; the agent 4.3. The agent was 2.0 as the kiln user with the sandbox off,
 * which confined the agent and left its ranks (user code) unconfined as that user; it is now a
 * privileged supervisor (+0.4 root, +1.6 its nine capabilities, +0.6 the mount calls, chown and
 * setuid in its syscall filter, +0.2 mnt and pid namespaces, +0.3 a writable, delegated cgroup
 * tree), and each rank is confined more than any rank was before: its own uid, no capability,
 * no_new_privs, PID and mount namespaces showing only its job's paths, cgroup memory and task
 * limits. */
Test(deploy, systemd_units_notify_use_credentials_and_keep_their_security_score)
{
    char *out = run("systemd units", 0,
                    "command -v systemd-analyze >/dev/null || { echo \"systemd-analyze is missing\"; exit 1; }; "
                    "for u in kilnd kiln-agent; do f=deploy/systemd/$u.service; "
                    "  grep -qx \"Type=notify\" $f && grep -q \"^WatchdogSec=\" $f || { echo \"$u: not Type=notify with WatchdogSec\"; exit 1; }; "
                    "  grep -q \"^EnvironmentFile=\" $f && grep -q \"PASSWORD\\|TOKEN=\\|KEY=/\" deploy/systemd/$u.env && "
                    "    { echo \"$u: a secret in its environment file\"; exit 1; }; "
                    "  cp $f $T/; "
                    "  s=$(cd $T && systemd-analyze security --offline=true --no-pager $u.service 2>&1 | "
                    "      sed -n \"s/.*Overall exposure level for $u.service: \\([0-9.]*\\).*/\\1/p\"); "
                    "  echo \"$u exposure $s\"; "
                    "done; "
                    "grep -q \"^LoadCredential=database.url:\" deploy/systemd/kilnd.service && "
                    "grep -q \"^SystemCallFilter=@system-service\" deploy/systemd/kiln-agent.service || exit 1; "
                    "a=deploy/systemd/kiln-agent.service; "
                    "grep -rn \"KILN_SANDBOX=off\\|--sandbox off\\|--sandbox=off\" deploy --exclude=README.md "
                    "  && { echo \"the sandbox is turned off in deploy/\"; exit 1; }; "
                    "grep -q \"^User=\" $a && { echo \"the agent must run as root for the sandbox\"; exit 1; }; "
                    "grep -qx \"User=kiln\" deploy/systemd/kilnd.service || { echo \"kilnd is not the kiln user\"; exit 1; }; "
                    "grep -qx \"CapabilityBoundingSet=CAP_SYS_ADMIN CAP_SYS_CHROOT CAP_SETUID CAP_SETGID CAP_SETPCAP "
                    "CAP_CHOWN CAP_DAC_READ_SEARCH CAP_KILL CAP_SYS_PTRACE\" $a "
                    "  || { echo \"the capabilities of the agent are not those of the sandbox\"; exit 1; }; "
                    "for l in NoNewPrivileges=yes \"Delegate=memory pids\" \"RestrictNamespaces=mnt pid\" "
                    "  \"StateDirectory=kiln kiln-sandbox\" ProtectSystem=strict; do "
                    "  grep -qx \"$l\" $a || { echo \"kiln-agent.service: no $l\"; exit 1; }; done");
    double kilnd = -1, agent = -1;
    const char *k = strstr(out, "kilnd exposure "), *a = strstr(out, "kiln-agent exposure ");
    if (k)
        kilnd = atof(k + strlen("kilnd exposure "));
    if (a)
        agent = atof(a + strlen("kiln-agent exposure "));
    cr_assert(kilnd > 0 && kilnd <= 1.5, "kilnd.service exposure %.1f (at most 1.5):\n%s", kilnd, out);
    cr_assert(agent > 0 && agent <= 4.3,
              "kiln-agent.service exposure %.1f (at most 4.3: root with the sandbox's capabilities):\n%s", agent, out);
    free(out);
}

/* What kiln-agent.service allows is enough for the sandbox: the sandbox's suite (tests/agent, real
 * boxes and ranks) passes under the unit's capability bounding set, no_new_privs, system-call
 * filter and RestrictNamespaces= (tests/deploy/unit_confine.py builds them from the unit file as
 * systemd 252 would; Criterion itself also needs mincore, which no group of systemd 252 holds).
 * Under main's unit (no capabilities, no mount calls, no namespaces) 8 of its 9 tests failed. */
Test(deploy, the_agent_units_confinement_lets_the_sandbox_work)
{
    if (geteuid() != 0)
        cr_skip_test("the sandbox needs root");
    char *out = run("the sandbox under kiln-agent.service", 0,
                    /* BXFI_MAP: this test's own Criterion worker; the suite inside starts its own */
                    "unset BXFI_MAP; "
                    "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 /usr/bin/python3 tests/deploy/unit_confine.py "
                    "deploy/systemd/kiln-agent.service --allow mincore -- ${BIN%/bin}/tests/test_agent --jobs 2 "
                    "--filter \"sandbox/*\" 2>&1 | grep -E \"unit_confine|FAIL|Synthesis\"");
    /* every test of the sandbox's suite ran and passed (it has 10 now; fewer means some were lost) */
    int tested = 0, passing = 0;
    const char *syn = strstr(out, "Synthesis: Tested: ");
    if (syn)
        sscanf(syn, "Synthesis: Tested: %d | Passing: %d", &tested, &passing);
    cr_assert(strstr(out, "namespaces mnt pid") && tested >= 10 && passing == tested &&
              strstr(out, "Failing: 0 | Crashing: 0"), "%s", out);
    free(out);
}

/* The images, read as text (no Docker engine here): bases pinned to a Debian point release (or
 * a digest), OCI labels, a HEALTHCHECK through the daemons' --health probes, and the CUDA
 * keyring installed only after its checksum and key fingerprint check out. */
Test(deploy, dockerfiles_pin_label_and_check_health)
{
    free(run("Dockerfiles", 0,
             "for f in deploy/Dockerfile deploy/Dockerfile.cuda; do "
             "  grep \"^FROM \" $f | grep -vE \"^FROM [a-z/.-]+:[0-9]+\\.[0-9]+[a-z.-]*( |@sha256:)|@sha256:[0-9a-f]{64}\" "
             "    && { echo \"$f: a base image that is not pinned\"; exit 1; }; "
             "  for l in title description version revision created base.name; do "
             "    grep -q \"org.opencontainers.image.$l=\" $f || { echo \"$f: no OCI label $l\"; exit 1; }; done; "
             "  grep -q \"^HEALTHCHECK .*kiln-healthcheck\" $f && grep -q \"COPY deploy/healthcheck.sh\" $f "
             "    || { echo \"$f: no HEALTHCHECK\"; exit 1; }; "
             "  grep -q KILN_SANDBOX $f && { echo \"$f: the image sets KILN_SANDBOX\"; exit 1; }; "
             "  grep -qx \"USER 10001:10001\" $f && grep -q \"mkdir -p /var/lib/kiln/work /var/lib/kiln-sandbox\" $f "
             "    || { echo \"$f: kilnd is not uid 10001, or no directory for the sandbox of the agent\"; exit 1; }; "
             "done; "
             "grep -q \"sha256sum -c\" deploy/Dockerfile.cuda && grep -q \"CUDA_REPO_KEY_FPR\" deploy/Dockerfile.cuda "
             "  || { echo \"the CUDA keyring is not verified\"; exit 1; }; "
             "grep -n \"dpkg -i /tmp/cuda-keyring.deb\" deploy/Dockerfile.cuda | head -1 | cut -d: -f1 > $T/dpkg; "
             "grep -n \"sha256sum -c\" deploy/Dockerfile.cuda | head -1 | cut -d: -f1 > $T/sum; "
             "[ $(cat $T/sum) -lt $(cat $T/dpkg) ] || { echo \"the keyring is installed before it is checked\"; exit 1; }; "
             "sh -n deploy/healthcheck.sh && grep -q -- \"kilnd --health\" deploy/healthcheck.sh && "
             "grep -q -- \"kiln-agent --health\" deploy/healthcheck.sh"));
}

/* The images build the engine with exactly the Makefile's flags but -march: each Dockerfile's
 * make, read by deploy/image-flags.sh with the ARG defaults (no Docker engine here), passes
 * MARCH and gets `make print-engine-flags`'s ENGINE_CFLAGS and NVCCFLAGS; a Dockerfile that
 * sets ENGINE_CFLAGS itself (as both did, dropping -fno-math-errno) is caught. */
Test(deploy, images_build_the_engine_with_the_makefiles_flags)
{
    char *out = run("image flags", 0,
                    "norm() { sed -n \"/^ENGINE_CFLAGS=\\|^NVCCFLAGS=/p\" | sed \"s/ -march=[^ ]* / -march=M /\"; }; "
                    "make -s --no-print-directory print-engine-flags BUILD=build | norm > $T/make.txt; "
                    "grep -q -- \"-fno-math-errno\" $T/make.txt || { echo \"no -fno-math-errno in the Makefile\"; exit 1; }; "
                    "check() { bash deploy/image-flags.sh $1 > $T/img.txt || return 1; "
                    "  grep -q \"^MAKEVARS: .*MARCH=\" $T/img.txt || { echo \"$1 passes no MARCH\"; return 1; }; "
                    "  norm < $T/img.txt > $T/img-flags.txt; "
                    "  diff $T/make.txt $T/img-flags.txt || { echo \"$1: engine flags differ from the Makefile\"; return 1; }; "
                    "  echo \"$1: the engine flags of the Makefile\"; }; "
                    "check deploy/Dockerfile && check deploy/Dockerfile.cuda || exit 1; "
                    "sed \"s/ MARCH=/ ENGINE_CFLAGS=-O3 MARCH=/\" deploy/Dockerfile.cuda > $T/Dockerfile.changed; "
                    "check $T/Dockerfile.changed && { echo \"an ENGINE_CFLAGS of its own went unnoticed\"; exit 1; }; "
                    "echo checked");
    cr_assert(strstr(out, "deploy/Dockerfile: the engine flags of the Makefile") &&
              strstr(out, "deploy/Dockerfile.cuda: the engine flags of the Makefile") && strstr(out, "checked"), "%s", out);
    free(out);
}
