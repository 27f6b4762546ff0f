"""sandbox_cost.py - the driver of bench/sandbox_cost.sh's PyTorch half. Two commands:
    python3 bench/sandbox_cost.py run MODE URL TOKEN CA DATA_ROOT   (environment: RANKS, STEPS, ROUND)
runs bench/torch_step.py once, MODE "on" or "off" as a kiln script job (1 node x RANKS ranks; the
agent's sandbox must be as MODE says: the shell restarts it), "torchrun" under plain torchrun
(torch.distributed.run's main; see TORCHRUN) on the same cores with OMP_NUM_THREADS as kiln gives
each rank, and prints one line: "round R: MODE median_step_ms=... cpu_ms=... ..." (rank 0's
median step time and its per-step counts, bench/torch_step.py).
    python3 bench/sandbox_cost.py summary FILE
reads those lines and prints, per mode, the median over its runs of each figure, then each kiln
mode's difference from torchrun and the sandbox's (on against off).
"""
import os
import re
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULT = re.compile(r"median_step_ms=([0-9.]+) steps=(\d+) threads=(\d+)((?: \w+=[0-9.]+)*)")
FIELDS = ["median_step_ms", "cpu_ms", "sys_ms", "minflt", "majflt", "nvcsw", "nivcsw"]

# torchrun's own main (python3 -m torch.distributed.run). Debian 12's torch 1.13 under Python 3.11
# cannot parse its --redirects/--tee default "0" (Std.from_str looks the value up by iterating the
# IntFlag, which no longer yields the zero member), so every run dies before it starts; the same
# parse is put back, and nothing else changes.
TORCHRUN = ("import sys\n"
            "import torch.distributed.elastic.multiprocessing.api as api\n"
            "def from_str(vm):\n"
            "    if ':' not in vm:\n"
            "        return api.Std(int(vm))\n"
            "    return {int(i): api.Std(int(v)) for i, v in (m.split(':') for m in vm.split(','))}\n"
            "api.Std.from_str = staticmethod(from_str)\n"
            "from torch.distributed.run import main\n"
            "sys.argv[0] = 'torchrun'\n"
            "main()\n")


def figures(text):
    """rank 0's result line in text as {field: value}, or None."""
    m = RESULT.search(text)
    if not m:
        return None
    out = {"median_step_ms": float(m.group(1)), "threads": int(m.group(3))}
    for kv in m.group(4).split():
        k, v = kv.split("=")
        out[k] = float(v)
    return out


def run(mode, url, token, ca, data):
    ranks = int(os.environ.get("RANKS", "2"))
    steps = os.environ.get("STEPS", "60")
    code = os.path.join(data, "torch-step")
    os.makedirs(code, exist_ok=True)
    shutil.copy(os.path.join(HERE, "torch_step.py"), os.path.join(code, "torch_step.py"))
    os.chmod(code, 0o755)
    os.chmod(os.path.join(code, "torch_step.py"), 0o644)
    if mode in ("on", "off"):
        sys.path.insert(0, os.path.join(HERE, "..", "sdk", "python"))
        import kiln
        client = kiln.Client(url, token=token, ca=ca, timeout=120)
        job = client.submit({"name": "sandbox-cost-%s" % mode, "entry_point": "torch_step.py", "source": code,
                             "environment": {"STEPS": steps},
                             "resources": {"nodes": 1, "slots_per_node": ranks, "slot_type": "cpu"},
                             "distribution": {"torch_distributed": {"enabled": True}}})
        job.wait(timeout=1800)
        text = "\n".join(str(line) for line in job.logs())
        if job.state != "COMPLETED" or not figures(text):
            raise SystemExit("kiln job %s ended %s:\n%s" % (job.id, job.state, text[-3000:]))
    elif mode == "torchrun":
        threads = max(1, (os.cpu_count() or 1) // ranks)  # what the agent gives each rank of a full machine
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), STEPS=steps)
        out = subprocess.run(["/usr/bin/python3", "-c", TORCHRUN, "--standalone", "--nproc_per_node", str(ranks),
                              os.path.join(code, "torch_step.py")], env=env, capture_output=True, text=True,
                             timeout=1800)
        text = out.stdout
        if out.returncode != 0 or not figures(text):
            raise SystemExit("torchrun failed (%d):\n%s\n%s" % (out.returncode, out.stdout[-2000:],
                                                                 out.stderr[-2000:]))
    else:
        raise SystemExit("sandbox_cost.py: mode %r is not on, off or torchrun" % mode)
    f = figures(text)
    print("round %s: %s %s threads=%d load=%s" % (
        os.environ.get("ROUND", "1"), mode, " ".join("%s=%s" % (k, f[k]) for k in FIELDS if k in f), f["threads"],
        open("/proc/loadavg").read().split()[0]), flush=True)


def summary(path):
    runs = {}
    for line in open(path):
        m = re.match(r"round \S+: (\S+) (.*)", line)
        if m:
            runs.setdefault(m.group(1), []).append(dict(kv.split("=") for kv in m.group(2).split()))
    med = {}
    for mode, rs in runs.items():
        med[mode] = {k: statistics.median(float(r[k]) for r in rs) for k in FIELDS if all(k in r for r in rs)}
        steps = sorted(float(r["median_step_ms"]) for r in rs)
        print("torch %s: %d runs, medians: step %.2f ms (runs %.2f-%.2f); a step's cost: %s" % (
            mode, len(rs), med[mode]["median_step_ms"], steps[0], steps[-1],
            ", ".join("%s %.2f" % (k, v) for k, v in med[mode].items() if k != "median_step_ms")))

    def diff(a, b, what):
        if a in med and b in med:
            print("torch %s against %s: step %+.1f%%, cpu per step %+.1f%%%s" % (
                a, b, (med[a]["median_step_ms"] / med[b]["median_step_ms"] - 1) * 100,
                (med[a]["cpu_ms"] / med[b]["cpu_ms"] - 1) * 100 if med[b].get("cpu_ms") else float("nan"), what))
    diff("on", "torchrun", " (kiln with its sandbox, the issue's target: within 3%)")
    diff("off", "torchrun", " (kiln's launcher alone)")
    diff("on", "off", " (what the sandbox costs)")


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "run":
        run(*sys.argv[2:7])
    elif len(sys.argv) == 3 and sys.argv[1] == "summary":
        summary(sys.argv[2])
    else:
        raise SystemExit(__doc__)
