"""tune_bench.py - the driver of bench/tune_bench.sh: issue 29's tuning benchmark, per seed, on
one search space over tiny GPT jobs on tinyshakespeare and one budget of training steps (all
trials' steps summed):
  random     kiln's `random` strategy, RANDOM_TRIALS trials of MAX_RESOURCE steps (the budget)
  hyperband  kiln's `hyperband` (asynchronous, pause and resume), stopped once it has spent the
             budget; one search for each bracket count of HB_BRACKETS ("hyperband" for 1 bracket,
             "hyperband-b3" for 3, ...)
  optuna     Optuna's TPE sampler and Hyperband pruner driving kiln-train --spec directly, with
             val_loss every MIN_RESOURCE steps reported to the pruner, stopped at the budget
The kiln searches run through a real kilnd and agent (bench/kiln_cluster.sh), all three at once.
Each curve is (steps consumed, best val_loss so far): for kiln from polling the tuning job (the
sum of its trials' steps when a new best was first seen, so a point never counts fewer steps than
were spent); for Optuna from the val_loss lines as they arrive. Also: the steps the same hyperband
run would have spent had promoted trials restarted from step 0 instead of resuming.
With HB_MAX_JOBS, hyperband draws that many trials and runs to its end (no stop at the budget);
with HB_ONLY=1 only hyperband runs. --compare puts a run against kilnd --tune-promoted-restart
(HB_RESTART=1) beside the same run with resume, by seed: the steps each spent, their bests, and
whether each trial reached the same rungs with the same objectives (the same promotions).

    python3 bench/tune_bench.py URL TOKEN CA KILN_TRAIN DATA OUT_JSON
    (environment: SEEDS "1 2 3", RANDOM_TRIALS 4, MIN_RESOURCE 50, MAX_RESOURCE 450, ETA 3,
     PARALLEL 2, WARMUP_MAX 300, HB_BRACKETS "1", HB_SAMPLER "random" (or "tpe"), OPTUNA 1,
     HB_MAX_JOBS 0 (0: 500, stopped at the budget), HB_ONLY 0, HB_RESTART 0 (recorded in OUT_JSON))
    python3 bench/tune_bench.py --compare RESUME_JSON RESTART_JSON
"""
import json
import shutil
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk", "python"))
import kiln  # noqa: E402
import tune_space  # noqa: E402  (bench/, the script's own folder, is on sys.path)



def compare(resume_path, restart_path):
    """Prints, by seed and hyperband search, the steps the resume and the restart run spent, their
    ratio, each run's best, the restart figure computed from the resume run's rung histories, and
    whether the two made the same decisions (each trial: the same parameters, rungs and objective
    at each, final objective). Exit status 1 when a run's searches did not end COMPLETED."""
    with open(resume_path) as f:
        a = json.load(f)
    with open(restart_path) as f:
        b = json.load(f)
    assert not a.get("restart") and b.get("restart"), "the first run must resume, the second restart"
    print("| seed | search | trials / promotions | steps, resume | steps, restart | restart / resume | saving "
          "| computed from the resume run | best val_loss, resume | best val_loss, restart | same decisions |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ok, ratios = True, []
    for ra, rb in zip(a["seeds"], b["seeds"]):
        for n in [k for k in ra if k.startswith("hyperband")]:
            x, y = ra[n], rb[n]
            ok = ok and x["state"] == "COMPLETED" and y["state"] == "COMPLETED"
            same = len(x["trials"]) == len(y["trials"]) and all(
                p["parameters"] == q["parameters"] and p["rung"] == q["rung"] and p.get("rungs") == q.get("rungs")
                and p.get("objective") == q.get("objective") for p, q in zip(x["trials"], y["trials"]))
            diff = [(p["trial"], [(r["steps"], r["objective"]) for r in p.get("rungs") or []],
                     [(r["steps"], r["objective"]) for r in q.get("rungs") or []])
                    for p, q in zip(x["trials"], y["trials"]) if p.get("rungs") != q.get("rungs")]
            ratios.append(y["steps"] / x["steps"])
            print("| %d | %s | %d / %d | %d | %d | %.3f | %.1f%% | %d (%.3f) | %s | %s | %s |" % (
                ra["seed"], n, len(x["trials"]), x["promotions"], x["steps"], y["steps"], y["steps"] / x["steps"],
                100 * (1 - x["steps"] / y["steps"]), x["restart_steps"], x["restart_steps"] / x["steps"],
                fmt(x["best"], "%.15g"), fmt(y["best"], "%.15g"),
                "yes" if same else "no: %d of %d trials differ %s" % (len(diff), len(x["trials"]), diff[:3])))
    print("== restart / resume steps: %s (median %.3f); both runs COMPLETED: %s"
          % (", ".join("%.3f" % r for r in ratios), statistics.median(ratios), ok), flush=True)
    sys.exit(0 if ok else 1)


def fmt(v, spec="%.4f"):
    return "-" if v is None else spec % v


if sys.argv[1:2] == ["--compare"]:
    compare(sys.argv[2], sys.argv[3])
URL, TOKEN, CA, TRAIN, DATA, OUT = sys.argv[1:7]
SEEDS = [int(s) for s in os.environ.get("SEEDS", "1 2 3").split()]
RANDOM_TRIALS = int(os.environ.get("RANDOM_TRIALS", "4"))
MIN_R = int(os.environ.get("MIN_RESOURCE", "50"))
MAX_R = int(os.environ.get("MAX_RESOURCE", "450"))
ETA = int(os.environ.get("ETA", "3"))
PARALLEL = int(os.environ.get("PARALLEL", "2"))
BUDGET = RANDOM_TRIALS * MAX_R
WARMUP_MAX = int(os.environ.get("WARMUP_MAX", "300"))  # the top of warmup_steps' range
HB_BRACKETS = [int(b) for b in os.environ.get("HB_BRACKETS", "1").split()]
HB_SAMPLER = os.environ.get("HB_SAMPLER", "random")  # hyperband.sampler: random or tpe
HB_NAMES = [("hyperband" if b == 1 else "hyperband-b%d" % b) + ("+tpe" if HB_SAMPLER == "tpe" else "")
            for b in HB_BRACKETS]
HB_ONLY = os.environ.get("HB_ONLY", "0") == "1"
OPTUNA = os.environ.get("OPTUNA", "1") == "1" and not HB_ONLY
HB_MAX_JOBS = int(os.environ.get("HB_MAX_JOBS", "0"))  # > 0: that many trials, run to the end
HB_RESTART = os.environ.get("HB_RESTART", "0") == "1"  # kilnd runs with --tune-promoted-restart
client = kiln.Client(URL, token=TOKEN, ca=CA, timeout=120)

SPACE = tune_space.space(WARMUP_MAX, MAX_R)


def base_job(name, max_steps, eval_every):
    return tune_space.base_job(name, DATA, max_steps, eval_every)


def rungs():
    r, out = MIN_R, []
    while r < MAX_R:
        out.append(r)
        r *= ETA
    return out + [MAX_R]


# ---- kiln: a tuning job through kilnd, polled ------------------------------------------------

def kiln_search(seed, strategy, res, brackets=1):
    label = (strategy if brackets == 1 else "%s-b%d" % (strategy, brackets)) + \
        ("+tpe" if strategy == "hyperband" and HB_SAMPLER == "tpe" else "")
    body = {"name": "bench-%s-%d" % (label.replace("+", "-"), seed), "job": base_job("trial", MAX_R, 0), "parameters": SPACE,
            "objective": {"metric": "val_loss", "goal": "minimize"}, "strategy": strategy,
            "max_parallel_jobs": PARALLEL, "seed": seed}
    if strategy == "hyperband":
        body["hyperband"] = {"min_resource": MIN_R, "max_resource": MAX_R, "reduction_factor": ETA,
                             "brackets": brackets, "sampler": HB_SAMPLER}
        body["max_jobs"] = HB_MAX_JOBS or 500
    else:
        body["max_jobs"] = RANDOM_TRIALS
    _, tj = client._call("POST", "/v1/tuning-jobs", body)
    tid = tj["id"]
    curve, best, stopped, t0 = [], None, False, time.monotonic()
    while True:
        _, t = client._call("GET", "/v1/tuning-jobs/" + tid)
        trials = t.get("trials") or []
        steps = sum(int(x.get("steps") or 0) for x in trials)
        for x in trials:
            o = x.get("objective")
            if isinstance(o, (int, float)) and (best is None or o < best):
                best = o
                curve.append([steps, o])
        if t["state"] not in ("RUNNING", "STOPPING", "QUEUED", "PENDING"):
            break
        if strategy == "hyperband" and not HB_MAX_JOBS and not stopped and steps >= BUDGET:
            client._call("POST", "/v1/tuning-jobs/%s:stop" % tid, {})
            stopped = True
        time.sleep(1.0)
    res.update({"id": tid, "state": t["state"], "reason": t.get("reason"), "curve": curve, "steps": steps,
                "best": best, "trials": trials, "wall_s": round(time.monotonic() - t0, 1)})
    print("-- seed %d %s: %s, %d steps, best %s, %.0f s, curve %s" % (seed, label, t["state"], steps, best,
                                                                   res["wall_s"], curve), flush=True)


def restart_steps(trials):
    """The steps the same hyperband run spends when a promoted trial restarts from step 0: each
    promotion past a rung that reached its next rung costs that rung's steps again (a trial's
    `rungs`: the rungs it finished). A segment the bench's stop cut short is counted at the steps
    it trained (no extra), which understates the saving. In a run with kilnd
    --tune-promoted-restart (HB_RESTART=1) the trials' steps count the restarts already."""
    if HB_RESTART:
        return sum(int(x.get("steps") or 0) for x in trials)
    extra = sum(sum(int(r["steps"]) for r in (x.get("rungs") or [])[:-1]) for x in trials)
    return sum(int(x.get("steps") or 0) for x in trials) + extra


# ---- Optuna: TPE + Hyperband pruner on kiln-train --spec ---------------------------------------

def optuna_search(seed, res):
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    lock = threading.Lock()
    state = {"steps": 0, "best": None, "curve": [], "trials": 0, "pruned": 0}
    work = tempfile.mkdtemp(prefix="kiln-tune-optuna-")

    def objective(trial):
        with lock:
            if state["steps"] >= BUDGET:
                trial.study.stop()
                raise optuna.TrialPruned()
            state["trials"] += 1
        spec = base_job("optuna-%d" % trial.number, MAX_R, MIN_R)
        hp = spec["hyperparameters"]
        hp["lr"] = trial.suggest_float("lr", 1e-4, 3e-2, log=True)
        hp["warmup_steps"] = trial.suggest_int("warmup_steps", 0, SPACE["warmup_steps"]["max"])
        hp["weight_decay"] = trial.suggest_float("weight_decay", 0.0, 0.2)
        spec["model"]["n_embd"] = trial.suggest_categorical("model.n_embd", [64, 128])
        path = os.path.join(work, "t%d.json" % trial.number)
        with open(path, "w") as f:
            json.dump(spec, f)
        p = subprocess.Popen([TRAIN, "--spec", path, "--threads", "1", "--quiet",
                              "--peak-gflops", "1", "--output-dir", os.path.join(work, "o%d" % trial.number)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             errors="replace")  # a printed sample may hold any byte
        last, val = 0, None
        try:
            for line in p.stdout:
                # "step 300 | val loss 2.4815"
                if not line.startswith("step ") or "| val loss " not in line:
                    continue
                step = int(line.split()[1])
                val = float(line.rsplit(" ", 1)[1])
                with lock:
                    state["steps"] += step - last
                    if state["best"] is None or val < state["best"]:
                        state["best"] = val
                        state["curve"].append([state["steps"], val])
                last = step
                trial.report(val, step)
                if trial.should_prune():
                    with lock:
                        state["pruned"] += 1
                    raise optuna.TrialPruned()
                with lock:
                    if state["steps"] >= BUDGET:
                        break
        finally:
            if p.poll() is None:
                p.kill()
            p.wait()
        if val is None:
            raise RuntimeError("kiln-train reported no val loss: exit %s" % p.returncode)
        return val

    t0 = time.monotonic()
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed),
                                pruner=optuna.pruners.HyperbandPruner(min_resource=MIN_R, max_resource=MAX_R,
                                                                      reduction_factor=ETA))
    study.optimize(objective, n_jobs=PARALLEL, n_trials=10000)
    shutil.rmtree(work, ignore_errors=True)
    res.update({"curve": state["curve"], "steps": state["steps"], "best": state["best"], "trials": state["trials"],
                "pruned": state["pruned"], "wall_s": round(time.monotonic() - t0, 1)})
    print("-- seed %d optuna: %d trials (%d pruned), %d steps, best %s, %.0f s, curve %s"
          % (seed, state["trials"], state["pruned"], state["steps"], state["best"], res["wall_s"], state["curve"]),
          flush=True)


# ---- the comparison --------------------------------------------------------------------------

def best_at(curve, steps):
    """The best val_loss a curve had found by `steps` steps consumed (None: none yet)."""
    b = None
    for s, v in curve:
        if s <= steps:
            b = v
    return b


def steps_to(curve, target):
    """The steps a curve spent to first reach val_loss <= target (None: never)."""
    for s, v in curve:
        if v <= target:
            return s
    return None


def main():
    print("== rungs %s, budget %d steps (random: %d trials x %d), parallel %d, seeds %s, hyperband brackets %s"
          % (rungs(), BUDGET, RANDOM_TRIALS, MAX_R, PARALLEL, SEEDS, HB_BRACKETS), flush=True)
    # every seed's searches at once: they share the CPUs, which slows each but changes no step
    # count (the searches are compared in steps)
    names = ([] if HB_ONLY else ["random"]) + HB_NAMES + (["optuna"] if OPTUNA else [])
    rows, th = [], []
    for seed in SEEDS:
        out = {"seed": seed}
        out.update({n: {} for n in names})
        rows.append(out)
        if not HB_ONLY:
            th.append(threading.Thread(target=kiln_search, args=(seed, "random", out["random"])))
        th += [threading.Thread(target=kiln_search, args=(seed, "hyperband", out[n], b))
               for n, b in zip(HB_NAMES, HB_BRACKETS)]
        if OPTUNA:
            th.append(threading.Thread(target=optuna_search, args=(seed, out["optuna"])))
    for t in th:
        t.start()
    for t in th:
        t.join()
    for out in rows:
        seed, rnd = out["seed"], out.get("random") or {"best": None, "steps": 0, "state": "-", "wall_s": 0}
        line = "seed %d: random best %s (%d steps, %s, %.0f s)" % (seed, fmt(rnd["best"]), rnd["steps"], rnd["state"],
                                                                  rnd["wall_s"])
        for n in HB_NAMES:
            hb = out[n]
            h2r = steps_to(hb["curve"], rnd["best"]) if rnd.get("best") else None
            hb.update({"steps_to_random_best": h2r, "best_at_budget": best_at(hb["curve"], BUDGET),
                       "restart_steps": restart_steps(hb["trials"]),
                       "promotions": sum(int(x.get("rung") or 0) for x in hb["trials"])})
            line += ("; %s best@budget %s, reached random's best at %s steps (%s of random's), %d trials, "
                     "%d promotions, %d steps spent (restart: %d), %s, %.0f s" % (
                         n, fmt(hb["best_at_budget"]), fmt(h2r, "%d"),
                         fmt(h2r / rnd["steps"] if h2r is not None else None, "%.2f"), len(hb["trials"]),
                         hb["promotions"], hb["steps"], hb["restart_steps"], hb["state"], hb["wall_s"]))
        if OPTUNA:
            op = out["optuna"]
            op["best_at_budget"] = best_at(op["curve"], BUDGET)
            line += "; optuna best@budget %s (%d trials, %d pruned, %d steps, %.0f s)" % (
                fmt(op["best_at_budget"]), op["trials"], op["pruned"], op["steps"], op["wall_s"])
        print(line, flush=True)
        for n in names:
            print("  %s curve (steps, best): %s" % (n, out[n]["curve"]), flush=True)
        for n in HB_NAMES:
            print("  %s rungs by trial: %s" % (n, [(x["trial"], [(r["steps"], round(r["objective"], 4))
                                                               for r in x.get("rungs") or []])
                                                  for x in out[n]["trials"]]), flush=True)
    with open(OUT, "w") as f:
        json.dump({"budget": BUDGET, "rungs": rungs(), "restart": HB_RESTART, "max_jobs": HB_MAX_JOBS,
                   "parallel": PARALLEL, "seeds": rows}, f, indent=1)

    def med(vals):
        vals = [v for v in vals if v is not None]
        return statistics.median(vals) if vals else None
    line = "== medians over %d seeds: random best %s" % (len(rows), fmt(med(r["random"]["best"] for r in rows
                                                                           if "random" in r)))
    for n in HB_NAMES:
        line += "; %s best@budget %s, steps to random's best %s (fraction %s; inf: not within its steps), " \
                "restart/resume steps %s" % (
                    n, fmt(med(r[n]["best_at_budget"] for r in rows)),
                    fmt(med(r[n]["steps_to_random_best"] if r[n]["steps_to_random_best"] is not None else float("inf")
                            for r in rows), "%.0f"),
                    fmt(med(r[n]["steps_to_random_best"] / r["random"]["steps"]
                            if r[n]["steps_to_random_best"] is not None else float("inf") for r in rows), "%.2f"),
                    fmt(med(r[n]["restart_steps"] / r[n]["steps"] for r in rows), "%.2f"))
    if OPTUNA:
        line += "; optuna best@budget %s" % fmt(med(r["optuna"]["best_at_budget"] for r in rows))
    print(line, flush=True)


main()
