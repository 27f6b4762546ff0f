"""submit_latency.py - the driver of bench/submit_latency.sh: from POST /v1/jobs to the job
RUNNING (kilnd sets RUNNING when every rank of the attempt has started on its agent), for a
script job of 1 node x RANKS ranks, one job at a time on an idle agent.

  warm: the code archive is in the agent's code cache (one job ran it first); JOBS jobs
  cold: a fresh archive of COLD_MB MiB of random bytes (does not compress) each time; COLD jobs

Each job reports two figures: client (the POST sent to the first poll that saw RUNNING, polling
every 20 ms) and server (the job's RUNNING event time minus its submission event time, both
kilnd's clock). Prints every job, then p50/p99 per mode.
    python3 bench/submit_latency.py URL TOKEN CA   (environment: JOBS, COLD, COLD_MB, RANKS)
"""
import datetime
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk", "python"))
import kiln  # noqa: E402

URL, TOKEN, CA = sys.argv[1:4]
JOBS = int(os.environ.get("JOBS", "20"))
COLD = int(os.environ.get("COLD", "3"))
COLD_MB = int(os.environ.get("COLD_MB", "50"))
RANKS = int(os.environ.get("RANKS", "2"))
client = kiln.Client(URL, token=TOKEN, ca=CA, timeout=120)

TRAIN = "import os\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], flush=True)\n"


def code_dir(extra_mb):
    d = tempfile.mkdtemp(prefix="kiln-sublat-")
    with open(os.path.join(d, "train.py"), "w") as f:
        f.write(TRAIN)
    if extra_mb:
        os.makedirs(os.path.join(d, "blobs"))
        for i in range(extra_mb):
            with open(os.path.join(d, "blobs", "b%03d.bin" % i), "wb") as f:
                f.write(os.urandom(1 << 20))
    return d


def ts(s):
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def one(source, name):
    spec = {"name": name, "entry_point": "train.py", "source": source,
            "resources": {"nodes": 1, "slots_per_node": RANKS, "slot_type": "cpu"}}
    t0 = time.monotonic()
    job = client.submit(spec)
    while True:
        st = job.refresh().state
        if st == "RUNNING" or st in kiln.TERMINAL_STATES:
            break
        time.sleep(0.02)
    wall = time.monotonic() - t0
    job.wait(timeout=300)
    if job.state != "COMPLETED":
        raise SystemExit("job %s ended %s: %s" % (job.id, job.state, job.to_dict().get("reason")))
    ev = client.events(job.id)
    sub = ts(ev[0]["time"])
    run = [ts(e["time"]) for e in ev if e["to_state"] == "RUNNING"]
    server = run[0] - sub if run else float("nan")
    # where the time went: each state's entry after the submission, up to RUNNING
    stages = {}
    for e in ev[1:]:
        stages.setdefault(e["to_state"], ts(e["time"]) - sub)
        if e["to_state"] == "RUNNING":
            break
    return wall, server, stages


def stage_text(stages):
    return ", ".join("%s at %.3f" % (k, v) for k, v in stages.items())


def report_stages(mode, rows):
    names = []
    for r in rows:
        for k in r[2]:
            if k not in names:
                names.append(k)
    print("%s stages (median s after the submission): %s" % (mode, ", ".join(
        "%s %.3f" % (k, statistics.median([r[2][k] for r in rows if k in r[2]])) for k in names)), flush=True)


def pct(v, p):
    v = sorted(v)
    k = max(0, min(len(v) - 1, int(round(p / 100.0 * len(v) + 0.5)) - 1))
    return v[k]


def report(mode, rows):
    for i in (0, 1):
        what = ("client", "server")[i]
        xs = [r[i] for r in rows]
        print("%s %s: n=%d p50=%.3f s p99=%.3f s min=%.3f s max=%.3f s" % (
            mode, what, len(xs), statistics.median(xs), pct(xs, 99), min(xs), max(xs)), flush=True)


def main():
    d = code_dir(0)
    source = client.upload_code(d)
    one(source, "sublat-prime")  # fills the agent's code cache
    warm = []
    for i in range(JOBS):
        r = one(source, "sublat-warm-%d" % i)
        print("warm job %d: client %.3f s, server %.3f s (%s; load %s)" % (
            i + 1, r[0], r[1], stage_text(r[2]), open("/proc/loadavg").read().split()[0]), flush=True)
        warm.append(r)
    cold = []
    for i in range(COLD):
        d = code_dir(COLD_MB)
        t0 = time.monotonic()
        source = client.upload_code(d)
        up = time.monotonic() - t0
        r = one(source, "sublat-cold-%d" % i)
        print("cold job %d (%d MiB archive, uploaded in %.1f s before the POST): client %.3f s, server %.3f s "
              "(%s; load %s)" % (i + 1, COLD_MB, up, r[0], r[1], stage_text(r[2]),
                                 open("/proc/loadavg").read().split()[0]), flush=True)
        cold.append(r)
    report("warm", warm)
    report_stages("warm", warm)
    if cold:
        report("cold", cold)
        report_stages("cold", cold)


main()
