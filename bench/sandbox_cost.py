"""sandbox_cost.py - the driver of bench/sandbox_cost.sh's PyTorch half: bench/torch_step.py as a
kiln script job (1 node x RANKS ranks, the agent's sandbox on) and under plain torchrun
(torch.distributed.run's main; see TORCHRUN), the same ranks on the same cores, OMP_NUM_THREADS as
kiln gives each rank), in interleaved rounds (the order flips every round). Prints every run's
rank-0 median step time, then the medians of the runs and kiln's difference from torchrun.
    python3 bench/sandbox_cost.py URL TOKEN CA DATA_ROOT   (environment: ROUNDS, RANKS, STEPS)
"""
import os
import re
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk", "python"))
import kiln  # noqa: E402

URL, TOKEN, CA, DATA = sys.argv[1:5]
ROUNDS = int(os.environ.get("ROUNDS", "3"))
RANKS = int(os.environ.get("RANKS", "2"))
STEPS = os.environ.get("STEPS", "60")
HERE = os.path.dirname(os.path.abspath(__file__))
client = kiln.Client(URL, token=TOKEN, ca=CA, timeout=120)
code = os.path.join(DATA, "torch-step")
os.makedirs(code, exist_ok=True)
shutil.copy(os.path.join(HERE, "torch_step.py"), os.path.join(code, "torch_step.py"))
os.chmod(code, 0o755)
os.chmod(os.path.join(code, "torch_step.py"), 0o644)
MEDIAN = re.compile(r"median_step_ms=([0-9.]+) steps=(\d+) threads=(\d+)")
threads = max(1, (os.cpu_count() or 1) // RANKS)  # what the agent gives each rank of a full machine


def under_kiln(i):
    job = client.submit({"name": "sandbox-cost-%d" % i, "entry_point": "torch_step.py", "source": code,
                         "environment": {"STEPS": STEPS},
                         "resources": {"nodes": 1, "slots_per_node": RANKS, "slot_type": "cpu"},
                         "distribution": {"torch_distributed": {"enabled": True}}})
    job.wait(timeout=1800)
    text = "\n".join(str(line) for line in job.logs())
    m = MEDIAN.search(text)
    if job.state != "COMPLETED" or not m:
        raise SystemExit("kiln job %s ended %s:\n%s" % (job.id, job.state, text[-3000:]))
    return float(m.group(1)), m.group(3)


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


def under_torchrun():
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), STEPS=STEPS)
    out = subprocess.run(["/usr/bin/python3", "-c", TORCHRUN, "--standalone",
                          "--nproc_per_node", str(RANKS), os.path.join(code, "torch_step.py")],
                         env=env, capture_output=True, text=True, timeout=1800)
    m = MEDIAN.search(out.stdout)
    if out.returncode != 0 or not m:
        raise SystemExit("torchrun failed (%d):\n%s\n%s" % (out.returncode, out.stdout[-2000:], out.stderr[-2000:]))
    return float(m.group(1)), m.group(3)


runs = {"kiln": [], "torchrun": []}
for r in range(ROUNDS):
    order = ["kiln", "torchrun"] if r % 2 == 0 else ["torchrun", "kiln"]
    for mode in order:
        ms, th = under_kiln(r) if mode == "kiln" else under_torchrun()
        runs[mode].append(ms)
        print("round %d: %s median_step_ms=%.2f (threads %s, load %s)" % (
            r + 1, mode, ms, th, open("/proc/loadavg").read().split()[0]), flush=True)
k, t = statistics.median(runs["kiln"]), statistics.median(runs["torchrun"])
print("torch %d ranks: kiln (sandbox on) median of %d runs %.2f ms (%.2f-%.2f), torchrun %.2f ms (%.2f-%.2f): "
      "kiln %+.1f%%" % (RANKS, ROUNDS, k, min(runs["kiln"]), max(runs["kiln"]), t, min(runs["torchrun"]),
                        max(runs["torchrun"]), (k / t - 1) * 100), flush=True)
