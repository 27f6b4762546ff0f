"""tune_sim.py - issue 29's tuning benchmark replayed: each trial of each seed is trained once with
kiln-train (the bench's search space and tiny GPT, val_loss every MIN_RESOURCE steps), as far as a
search needs it and resumed from its checkpoint when a search needs more, and kiln's own search
(bench/tune_sim.c, which runs tune_decide) is replayed over those curves for random search and for
hyperband with 1 to all brackets, at any budget; Optuna's TPESampler and HyperbandPruner drive the
same curves (optuna_run). A trial's curve is what kiln would see at its rungs: a paused trial is
evaluated at its pause and resumes bit-exactly (e2e_tuning checks both), so its val_loss at a rung
is its curve's.

    python3 bench/tune_sim.py curves CURVES_DIR     train what is missing (SEEDS, TRIALS, JOBS)
    python3 bench/tune_sim.py report CURVES_DIR     rung figures and the searches, per seed
    python3 bench/tune_sim.py tpe CURVES_DIR        random, hyperband, hyperband with sampler tpe,
                                                    bayesian (TPE) and Optuna (TPESampler with
                                                    HyperbandPruner, optuna_run): the best within
                                                    each of BUDGETS
    python3 bench/tune_sim.py steps CURVES_DIR      how well val_loss at each step predicts the final,
                                                    and successive halving with one rung
Environment: SEEDS ("1 2 3"), TRIALS (36 a seed), JOBS (2 kiln-train at once), MIN_RESOURCE (50),
MAX_RESOURCE (450), ETA (3), MAX_RUNGS (hyperband.max_rungs; 0: every rung), WARMUP_MAX (300),
PARALLEL (2), RANDOM_TRIALS ("4 8 16 32"),
BRACKETS (report's hyperband bracket counts, e.g. "1 2"; default 1 to one a rung), BUDGETS
("1800 3600"), SEARCHES (tpe's, by name: "random hyperband hyperband+tpe bayesian optuna", and
hyperband@B or hyperband+tpe@B for B brackets),
TARGET_TRIALS (tpe's: for each k, the steps each searcher took to reach random search's final best of
k trials, as a fraction of its k * MAX_RESOURCE steps; then, over the seeds, on how many each target is
met, with a sign test: target A within a third of those steps, target B no worse than Optuna), SIM (the tune_sim binary; default BUILD's),
OUT (tpe's results as JSON), REUSE (other CURVES_DIRs to read curves from, never written), BUILD
(build). A curve is kept by its trial's parameter values (all it depends on), a partial one with
its checkpoint in CURVES_DIR/ckpt (one process writes a CURVES_DIR at a time; a REUSE dir's checkpoint
of a partial curve is copied there to resume it). Trials 0..TRIALS-1
of a seed are the ones kiln draws (tune_sim draw), so random search and hyperband of one seed share
their first trials, as in the real bench.
"""
import concurrent.futures
import hashlib
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

import tune_space

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
BUILD = os.environ.get("BUILD", "build")
SIM = os.environ.get("SIM") or os.path.join(ROOT, BUILD, "bench", "tune_sim")
TRAIN = os.path.join(ROOT, BUILD, "bin", "kiln-train")
DATA = os.path.join(ROOT, "data", "tinyshakespeare.txt")
SEEDS = [int(s) for s in os.environ.get("SEEDS", "1 2 3").split()]
TRIALS = int(os.environ.get("TRIALS", "36"))
JOBS = int(os.environ.get("JOBS", "2"))
MIN_R = int(os.environ.get("MIN_RESOURCE", "50"))
MAX_R = int(os.environ.get("MAX_RESOURCE", "450"))
ETA = int(os.environ.get("ETA", "3"))
MAX_RUNGS = int(os.environ.get("MAX_RUNGS", "0"))
WARMUP_MAX = int(os.environ.get("WARMUP_MAX", "300"))
PARALLEL = int(os.environ.get("PARALLEL", "2"))
RANDOM_TRIALS = [int(k) for k in os.environ.get("RANDOM_TRIALS", "4 8 16 32").split()]
FULL_K = int(os.environ.get("FULL_K", "8"))
BRACKETS = [int(b) for b in os.environ.get("BRACKETS", "").split()]
BUDGETS = [int(b) for b in os.environ.get("BUDGETS", "1800 3600").split()]
REUSE = os.environ.get("REUSE", "").split()
TARGET_TRIALS = [int(k) for k in os.environ.get("TARGET_TRIALS", "").split()]

# In the order kilnd draws them: trial n's value of a parameter depends on the parameter's place
# among them, and kilnd draws from the spec as PostgreSQL's jsonb keeps it (shorter keys first, then
# bytewise), not in the order the request gave; so tune_sim draw gives the trials kilnd gives.
SPACE = {k: v for k, v in sorted(tune_space.space(WARMUP_MAX, MAX_R).items(),
                                 key=lambda kv: (len(kv[0].encode()), kv[0].encode()))}


def base_job(eval_every):
    return tune_space.base_job("trial", DATA, MAX_R, eval_every)


def request(seed, strategy, brackets=1, max_jobs=500, sampler="random"):
    r = {"name": "sim", "job": base_job(0), "parameters": SPACE,
         "objective": {"metric": "val_loss", "goal": "minimize"}, "strategy": strategy,
         "max_jobs": max_jobs, "max_parallel_jobs": PARALLEL, "seed": seed}
    if strategy == "hyperband":
        r["hyperband"] = {"min_resource": MIN_R, "max_resource": MAX_R, "reduction_factor": ETA,
                          "brackets": brackets, "sampler": sampler}
        if MAX_RUNGS:
            r["hyperband"]["max_rungs"] = MAX_RUNGS
    return r


def rungs():
    r, out = MIN_R, []
    while r < MAX_R and (not MAX_RUNGS or len(out) < MAX_RUNGS - 1):
        out.append(r)
        r *= ETA
    return out + [MAX_R]


def sim(req, *args):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(req, f)
    try:
        out = subprocess.run([SIM, args[0], f.name] + [str(a) for a in args[1:]], check=True,
                             capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    return out


def curves_path(d, seed):
    return os.path.join(d, "curves-s%d-min%d-max%d-w%d.json" % (seed, MIN_R, MAX_R, WARMUP_MAX))


def train_one(values, to=MAX_R, ckpt=None):
    """Trains one trial to step `to` (paused there by stopping.max_steps as kiln pauses a trial at a
    rung, the schedule spanning MAX_RESOURCE); its val_loss every MIN_RESOURCE steps. With ckpt (a
    directory kept between calls) it resumes from the newest checkpoint there, as kiln resumes a
    promoted trial (bit-exact: e2e_tuning), and returns only the steps after it."""
    spec = base_job(MIN_R)
    if to < MAX_R:
        spec["stopping"] = {"max_steps": to}
    spec["checkpoint"] = {"keep_last": 1}
    for k, v in values.items():
        node, path = spec, k.split(".") if "." in k else ["hyperparameters", k]
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = v
    with tempfile.TemporaryDirectory(prefix="kiln-tune-sim-") as work:
        path = os.path.join(work, "spec.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        p = subprocess.run(["nice", "-n", "10", TRAIN, "--spec", path, "--threads", "1", "--quiet",
                            "--peak-gflops", "1", "--output-dir", os.path.join(work, "o"),
                            "--checkpoint-dir", ckpt or os.path.join(work, "c")],
                           capture_output=True, text=True, errors="replace")
        out = p.stdout  # a sample it prints may hold any byte: not UTF-8 always
        if p.returncode:
            print("kiln-train exited %d: %s" % (p.returncode, (p.stdout + p.stderr)[-300:]), file=sys.stderr,
                  flush=True)
    steps, vals = [], []
    for line in out.splitlines():
        if line.startswith("step ") and "| val loss " in line:  # "step 300 | val loss 2.4815"
            steps.append(int(line.split()[1]))
            vals.append(float(line.split("| val loss ")[1].split()[0]))
    return {"parameters": values, "steps": steps, "values": vals}


def ckpt_step(d):
    """The step of the newest checkpoint in directory d (0: none)."""
    best = 0
    for name in os.listdir(d) if os.path.isdir(d) else []:
        if name.startswith("ckpt_") and name.endswith(".bin"):
            best = max(best, int(name[5:-4]))
    return best


def pkey(values):
    """A trial's curve's key: its parameter values (a curve depends on them alone)."""
    return json.dumps(values, sort_keys=True)


class Pool:
    """One seed's curves by parameter values, trained as a search first needs them (to step s)
    and kept; REUSE's curve files of the same seed and scale are read too (never written)."""

    def __init__(self, d, seed):
        self.path, self.seed, self.trained = curves_path(d, seed), seed, 0
        self.have = {}
        for path in [curves_path(r, seed) for r in REUSE] + [self.path]:
            for c in (json.load(open(path)) if os.path.exists(path) else {}).values():
                old = self.have.get(pkey(c["parameters"]))
                if c["steps"] and (not old or old["steps"][-1] < c["steps"][-1]):
                    self.have[pkey(c["parameters"])] = c

    def ensure(self, values, step):
        """Trains the trial of these values to step (when its curve stops short of it): from its
        checkpoint at the curve's last step when CURVES_DIR/ckpt holds one, else from step 0."""
        c = self.have.get(pkey(values))
        if c and c["steps"] and c["steps"][-1] >= step:
            return
        ck = os.path.join(os.path.dirname(self.path), "ckpt",
                          hashlib.sha1(pkey(values).encode()).hexdigest()[:20])
        at = ckpt_step(ck)
        for r in REUSE:  # a REUSE dir's checkpoint at the curve's last step, copied (theirs stay as they are)
            theirs = os.path.join(r, "ckpt", os.path.basename(ck))
            if c and c["steps"] and at != c["steps"][-1] and ckpt_step(theirs) == c["steps"][-1]:
                shutil.rmtree(ck, ignore_errors=True)
                shutil.copytree(theirs, ck)
                at = ckpt_step(ck)
        if not (c and c["steps"] and at == c["steps"][-1]):
            shutil.rmtree(ck, ignore_errors=True)
            c, at = None, 0
        os.makedirs(ck, exist_ok=True)
        for _ in range(3):  # a run killed from outside (a loaded machine) is run again
            got = train_one(values, step, ck)
            if got["steps"] and got["steps"][-1] == step:
                break
        if not got["steps"] or got["steps"][-1] != step:
            sys.exit("tune_sim.py: %s of seed %d did not reach step %d: %s" % (values, self.seed, step, got))
        if c:
            keep = [k for k, st in enumerate(c["steps"]) if st < got["steps"][0]]
            got = {"parameters": values, "steps": [c["steps"][k] for k in keep] + got["steps"],
                   "values": [c["values"][k] for k in keep] + got["values"]}
        if step >= MAX_R:
            shutil.rmtree(ck, ignore_errors=True)
        self.trained += step - at
        self.have[pkey(values)] = got
        mine = json.load(open(self.path)) if os.path.exists(self.path) else {}
        mine[pkey(values)] = got
        with open(self.path + ".tmp", "w") as f:
            json.dump(mine, f)
        os.replace(self.path + ".tmp", self.path)

    def at(self, values, step, train_to):
        """The objective of the trial of these values at step, training it to train_to first when
        its curve stops short of step."""
        c = self.have.get(pkey(values))
        if not (c and c["steps"] and c["steps"][-1] >= step):
            self.ensure(values, train_to)
            c = self.have[pkey(values)]
        return c["values"][c["steps"].index(step)]

    def run(self, req, budget):
        while True:
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump(self.have, f)
            try:
                with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as g:
                    json.dump(req, g)
                p = subprocess.run([SIM, "run", g.name, f.name, str(budget)], capture_output=True, text=True)
            finally:
                os.unlink(f.name)
                os.unlink(g.name)
            out = json.loads(p.stdout)
            if p.returncode == 3:
                self.ensure(out["parameters"], out["need"][1])
                continue
            if p.returncode:
                sys.exit("tune_sim: %s" % p.stderr)
            return out


def optuna_run(pool, seed, budget):
    """Optuna (Debian's python3-optuna) on the same curves: TPESampler(seed) and HyperbandPruner
    (min_resource, max_resource, reduction_factor as kiln's hyperband) asking for trials of the
    same space, PARALLEL at a time on the same clock of one tick a step; each trial reports its
    val_loss every MIN_RESOURCE steps (the curves' points) to the pruner, which may prune it there.
    Steps are counted as for kiln's searches (every step trained by then, running trials too), and
    a new best is any reported val_loss (Optuna's pruned and running trials' too, as kiln counts a
    paused trial's rung objective), and in at_rungs only those at kiln's rung steps and the end
    (what kiln's searches see). Same output as tune_sim run: curve, steps, trials."""
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="sim-%d" % seed, direction="minimize",
                                sampler=optuna.samplers.TPESampler(seed=seed),
                                pruner=optuna.pruners.HyperbandPruner(min_resource=MIN_R, max_resource=MAX_R,
                                                                      reduction_factor=ETA))
    w = SPACE["warmup_steps"]["max"]

    def ask(now):
        t = study.ask()
        values = {"lr": t.suggest_float("lr", 1e-4, 3e-2, log=True),
                  "model.n_embd": t.suggest_categorical("model.n_embd", [64, 128]),
                  "warmup_steps": t.suggest_int("warmup_steps", 0, w),
                  "weight_decay": t.suggest_float("weight_decay", 0.0, 0.2)}
        return {"trial": t, "values": values, "start": now, "done": 0}

    stops = rungs()
    running = [ask(0) for _ in range(PARALLEL)]
    finished, best, curve, ntrials, pruned = 0, None, [], PARALLEL, 0
    best_r, curve_r = None, []  # counting only the values at kiln's rungs (100, 300, ...) and the end
    while True:
        # the next report: the running trial whose next MIN_RESOURCE step comes first (ties: the first)
        # (the last report is at MAX_R, which need not be a multiple of MIN_RESOURCE)
        k = min(range(len(running)), key=lambda i: running[i]["start"] + min(running[i]["done"] + MIN_R, MAX_R))
        r = running[k]
        step = min(r["done"] + MIN_R, MAX_R)
        now = r["start"] + step
        consumed = finished + sum(now - x["start"] for x in running)
        if consumed > budget:
            break
        v = pool.at(r["values"], step, min(x for x in stops if x >= step))
        r["done"] = step
        if best is None or v < best:
            best = v
            curve.append([consumed, v])
        if step in stops and (best_r is None or v < best_r):
            best_r = v
            curve_r.append([consumed, v])
        r["trial"].report(v, step)
        if step >= MAX_R or r["trial"].should_prune():
            if step >= MAX_R:
                study.tell(r["trial"], v)
            else:
                study.tell(r["trial"], state=optuna.trial.TrialState.PRUNED)
                pruned += 1
            finished += step
            running[k] = ask(now)
            ntrials += 1
    return {"curve": curve, "steps": consumed, "trials": ntrials, "pruned": pruned,
            "at_rungs": {"curve": curve_r, "trials": ntrials}}


def curves(d):
    os.makedirs(d, exist_ok=True)
    for seed in SEEDS:
        pool = Pool(d, seed)
        draws = [json.loads(line) for line in sim(request(seed, "random"), "draw", TRIALS).splitlines()]
        todo = [n for n in range(TRIALS) if pool.have.get(pkey(draws[n]), {}).get("steps", [0])[-1] < MAX_R]
        with concurrent.futures.ThreadPoolExecutor(JOBS) as ex:
            for n, c in zip(todo, ex.map(lambda n: train_one(draws[n]), todo)):
                pool.have[pkey(draws[n])] = c
                mine = json.load(open(pool.path)) if os.path.exists(pool.path) else {}
                mine[pkey(draws[n])] = c
                with open(pool.path + ".tmp", "w") as f:
                    json.dump(mine, f)
                os.replace(pool.path + ".tmp", pool.path)
                print("seed %d trial %d: %s -> %s" % (seed, n, draws[n], c["values"][-1:]), flush=True)


def best_at(curve, budget):
    """The best objective found within budget steps (None before the first result)."""
    at = [v for st, v in curve if st <= budget]
    return at[-1] if at else None


TPE_SEARCHES = [("random", lambda seed: request(seed, "random")),
                ("hyperband", lambda seed: request(seed, "hyperband")),
                ("hyperband+tpe", lambda seed: request(seed, "hyperband", sampler="tpe")),
                ("bayesian", lambda seed: request(seed, "bayesian")),
                ("optuna", None)]
TPE_SEARCHES += [(n, lambda seed, b=int(n.split("@")[1]), smp=n.split("@")[0].partition("+")[2] or "random":
                   request(seed, "hyperband", brackets=b, sampler=smp))
                 for n in os.environ.get("SEARCHES", "").split() if re.fullmatch(r"hyperband(\+tpe)?@[1-9]", n)]
TPE_SEARCHES = [(n, mk) for n, mk in TPE_SEARCHES if n in os.environ.get("SEARCHES", n).split()]


def tpe_report(d):
    """Random search, hyperband (random draws), hyperband with TPE draws and bayesian (TPE),
    each seed run to the largest of BUDGETS steps: the best val_loss within each budget."""
    top = max(BUDGETS)
    os.makedirs(d, exist_ok=True)

    def one(seed):
        pool = Pool(d, seed)
        res = {name: pool.run(mk(seed), top) if mk else optuna_run(pool, seed, top) for name, mk in TPE_SEARCHES}
        if "optuna" in res:
            res["optuna@rungs"] = res["optuna"]["at_rungs"]
        for k in TARGET_TRIALS:  # random search of k trials run to its end: the best to reach
            res["random%d" % k] = pool.run(request(seed, "random", max_jobs=k), k * MAX_R)
        return seed, res, pool.trained

    print("== rungs %s, eta %d, warmup 0..%d, parallel %d, seeds %s, budgets %s; each searcher runs to %d steps "
          "(max_jobs 500) and its best within each budget is read from its curve" % (
              rungs(), ETA, SPACE["warmup_steps"]["max"], PARALLEL, SEEDS, BUDGETS, top), flush=True)
    with concurrent.futures.ThreadPoolExecutor(JOBS) as ex:
        results = list(ex.map(one, SEEDS))
    names = [n for n, _ in TPE_SEARCHES] + (["optuna@rungs"] if "optuna" in dict(TPE_SEARCHES) else [])
    print("| seed | budget | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for seed, res, trained in results:
        for b in BUDGETS:
            print("| %d | %d | %s |" % (seed, b, " | ".join(
                "%.4f" % best_at(res[n]["curve"], b) if best_at(res[n]["curve"], b) else "-" for n in names)))
    for b in BUDGETS:
        med = []
        for n in names:
            vals = [best_at(res[n]["curve"], b) for _, res, _ in results]
            vals = [v for v in vals if v is not None]
            med.append("%.4f" % statistics.median(vals) if vals else "-")
        print("| median | %d | %s |" % (b, " | ".join(med)))
    for k in TARGET_TRIALS:
        print("-- steps to reach the final best of random search of %d trials (%d steps), as a fraction of its "
              "steps (target A: <= 0.33; '-': not within %d)" % (k, k * MAX_R, top))
        for seed, res, _ in results:
            goal = res["random%d" % k]["curve"][-1][1]
            print("   seed %d, %.4f: %s" % (seed, goal, ", ".join("%s %s" % (n, "%.2f" % (s / (k * MAX_R)) if s else "-")
                                                              for n in names for s in [steps_to(res[n]["curve"], goal)])))
    over_seeds(results, names)
    if os.environ.get("OUT"):
        with open(os.environ["OUT"], "w") as f:
            json.dump({str(seed): res for seed, res, _ in results}, f)
    for seed, res, trained in results:
        print("-- seed %d: trials %s; curves %s; (trained %d steps for missing curves)" % (
            seed, {n: res[n]["trials"] for n in names},
            {n: res[n]["curve"] for n in names}, trained), flush=True)


def sign_test(wins, n):
    """One-sided sign test: the chance of at least `wins` of n seeds going one way if each went
    either way with probability 1/2 (small: the searcher does so on more than half of all seeds)."""
    return sum(math.comb(n, i) for i in range(wins, n + 1)) / 2 ** n


def over_seeds(results, names):
    """The targets judged over the seeds, as the scheduler's were: on how many seeds each is met,
    the median, and a sign test. Target A: steps to reach random search's final best of k trials
    within a third of its steps. Target B: a kiln searcher's best no worse than Optuna's at each
    budget."""
    n = len(results)
    for k in TARGET_TRIALS:
        print("== over %d seeds, target A (random search of %d trials: reach its final best within %d steps):" % (
            n, k, k * MAX_R // 3))
        for name in names:
            fr = []
            for _, res, _ in results:
                s = steps_to(res[name]["curve"], res["random%d" % k]["curve"][-1][1])
                fr.append(s / (k * MAX_R) if s else math.inf)
            met = sum(1 for f in fr if f <= 1 / 3)
            print("   %-14s met on %2d of %d seeds (sign test p = %.3f), median fraction %s" % (
                name, met, n, sign_test(met, n), "%.3f" % statistics.median(fr) if statistics.median(fr) < math.inf
                else "not reached"))
    if "optuna" not in names:
        return
    for b in BUDGETS:
        print("== over %d seeds, target B at %d steps (a kiln searcher's best no worse than Optuna's):" % (n, b))
        for name in names:
            if name.startswith("optuna"):
                continue
            d = [best_at(res[name]["curve"], b) - best_at(res["optuna"]["curve"], b) for _, res, _ in results
                 if best_at(res[name]["curve"], b) is not None and best_at(res["optuna"]["curve"], b) is not None]
            if not d:
                continue
            ok = sum(1 for x in d if x <= 1e-12)
            print("   %-14s no worse on %2d of %d seeds (sign test p = %.3f), median difference %+.4f" % (
                name, ok, len(d), sign_test(ok, len(d)), statistics.median(d)))


def spearman(a, b):
    def ranks(x):
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0] * len(x)
        for k, i in enumerate(order):
            r[i] = k
        return r
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((p - q) ** 2 for p, q in zip(ra, rb)) / (n * (n * n - 1)) if n > 2 else None


def restart_steps(hb):
    """What a hyperband run's finished segments would have cost had every promoted trial restarted
    from step 0 instead of resuming: each segment from step r to r' costs r' instead of r' - r."""
    return sum(x["segments_ending"] * x["steps"] - x["segment_steps"] for x in hb["rungs"]) + hb["steps"]


def steps_to(curve, target):
    for s, v in curve:
        if v <= target + 1e-12:
            return s
    return None


def seed_report(d, seed):
    """One seed's rung figures and searches, as lines of text and a row per RANDOM_TRIALS."""
    rs, pool, lines, rows = rungs(), Pool(d, seed), [], {}
    brackets = BRACKETS or range(1, len(rs) + 1)
    # over random search's trials (an unbiased sample of the space), not the ones hyperband chose to train on
    drawn = {pkey(json.loads(x)) for x in sim(request(seed, "random"), "draw", max(RANDOM_TRIALS)).splitlines()}
    full = {n: c for n, c in pool.have.items() if n in drawn and c["steps"] and c["steps"][-1] == MAX_R}
    final = [c["values"][-1] for c in full.values()]
    lines.append("-- seed %d: rung val_loss against the final (%d steps) val_loss over the full curves of %d of its "
                 "first %d trials:" % (seed, MAX_R, len(full), max(RANDOM_TRIALS)))
    if len(full) > 2:
        best_n = min(full, key=lambda n: full[n]["values"][-1])
        for r in rs[:-1]:
            at = [c["values"][c["steps"].index(r)] for c in full.values()]
            order = sorted(full, key=lambda n: full[n]["values"][full[n]["steps"].index(r)])
            top = [full[n]["values"][-1] for n in order[:max(1, len(order) // ETA)]]
            lines.append("   rung %4d: Spearman %.2f; the final best trial ranks #%d of %d there; the best final of "
                         "that rung's top 1/%d %.4f (of all: %.4f)" % (r, spearman(at, final), order.index(best_n) + 1,
                                                                       len(order), ETA, min(top), min(final)))
    for k in RANDOM_TRIALS:
        budget = k * MAX_R
        hb_budget = budget if k <= FULL_K else budget // 3
        rnd = pool.run(request(seed, "random", max_jobs=k), budget)
        rbest = rnd["curve"][-1][1]
        row = {"random": rbest, "full": hb_budget == budget, "random_at": best_at(rnd["curve"], hb_budget)}
        for b in brackets:
            hb = pool.run(request(seed, "hyperband", brackets=b), hb_budget)
            row[b] = (steps_to(hb["curve"], rbest), best_at(hb["curve"], hb_budget), hb)
        rows[k] = row
        lines.append("   random %2d x %d = %5d steps: best %.4f (%.4f by %d steps); hyperband run to %d steps:" % (
            k, MAX_R, budget, rbest, row["random_at"], hb_budget, hb_budget))
        for b in brackets:
            s2, bb, hb = row[b]
            lines.append("     %d bracket(s): reaches random's best at %s steps (%s), best %s, %d trials by bracket %s; "
                         "restarting promoted trials: %d steps for its %d (%.2fx); "
                         "per rung: %s" % (b, s2, "%.2fx" % (s2 / budget) if s2 else "not within %d" % hb_budget,
                                           "%.4f" % bb if bb else "-", hb["trials"], hb["trials_by_bracket"],
                                           restart_steps(hb), hb["steps"], restart_steps(hb) / hb["steps"],
                                           ", ".join("%d: %d segments %d steps" % (
                                               x["steps"], x["segments_ending"], x["segment_steps"])
                                               for x in hb["rungs"])))
    lines.append("   (trained %d steps for this seed's missing curves)" % pool.trained)
    return lines, rows


def report(d):
    rs = rungs()
    print("== rungs %s, eta %d, warmup 0..%d, parallel %d, seeds %s; hyperband runs to random's budget for up to %d "
          "random trials, past that to a third of it" % (rs, ETA, SPACE["warmup_steps"]["max"], PARALLEL, SEEDS,
                                                         FULL_K), flush=True)
    with concurrent.futures.ThreadPoolExecutor(JOBS) as ex:
        results = list(ex.map(lambda seed: seed_report(d, seed), SEEDS))
    for lines, _ in results:
        print("\n".join(lines), flush=True)
    print("== medians over the seeds: steps hyperband took to reach random's best as a fraction of random's "
          "(the target: <= 0.33; inf: not within what it ran), its best at the steps it ran to, on how many seeds "
          "that best beats random's (its final, or its best by those steps when hyperband ran to a third), and "
          "what restarting promoted trials from step 0 would cost against resuming them")
    for k in RANDOM_TRIALS:
        rows = [r[k] for _, r in results]
        line = "   random %2d trials: random best %.4f" % (k, statistics.median(r["random"] for r in rows))
        for b in BRACKETS or range(1, len(rs) + 1):
            fr = [r[b][0] / (k * MAX_R) if r[b][0] else float("inf") for r in rows]
            line += " | %d bracket(s): %s" % (b, "%.2f" % statistics.median(fr))
            bests = [r[b][1] for r in rows if r[b][1]]
            line += ", best %.4f, beats random's %s %d/%d, restart %.2fx" % (
                statistics.median(bests), "final best" if rows[0]["full"] else "best at equal steps", sum(
                    1 for r in rows if r[b][1] is not None and r[b][1] < r["random" if r["full"] else "random_at"]),
                len(rows), statistics.median(restart_steps(r[b][2]) / r[b][2]["steps"] for r in rows))
        print(line, flush=True)


def steps_report(d):
    """Where a rung would predict best, and what one rung can do. Over each seed's first TARGET_TRIALS
    trials (random search's, full curves), at every MIN_RESOURCE steps: the Spearman correlation of
    val_loss there with the final one, and the rank there of the trial with the best final. Then
    successive halving with one rung: the first N of kiln's draws trained to MIN_RESOURCE, the k best
    there trained on to MAX_RESOURCE (N * MIN_RESOURCE + k * (MAX_RESOURCE - MIN_RESOURCE) steps, at
    most BUDGETS[0]), trained when missing: on how many seeds it reaches random search's final best."""
    k_trials, budget = (TARGET_TRIALS or [16])[0], BUDGETS[0]
    rho, rank, met = {}, {}, {}
    for seed in SEEDS:
        pool = Pool(d, seed)
        n_max = (budget - (MAX_R - MIN_R)) // MIN_R
        draws = [json.loads(x) for x in sim(request(seed, "random"), "draw", max(n_max, k_trials)).splitlines()]
        for x in draws[:k_trials]:
            pool.ensure(x, MAX_R)
        cs = [pool.have[pkey(x)] for x in draws[:k_trials]]
        final = [c["values"][-1] for c in cs]
        best = final.index(min(final))
        for st in range(MIN_R, MAX_R, MIN_R):
            at = [c["values"][c["steps"].index(st)] for c in cs]
            rho.setdefault(st, []).append(spearman(at, final))
            rank.setdefault(st, []).append(sorted(range(k_trials), key=lambda i: at[i]).index(best))
        first = []
        for x in draws[:n_max]:
            pool.ensure(x, MIN_R)
            first.append(pool.have[pkey(x)]["values"][0])
        for k in (1, 2, 3):
            for n in range(k, (budget - k * (MAX_R - MIN_R)) // MIN_R + 1):
                top = sorted(range(n), key=lambda i: first[i])[:k]
                for i in top:
                    pool.ensure(draws[i], MAX_R)
                got = min(pool.have[pkey(draws[i])]["values"][-1] for i in top)
                met.setdefault((k, n), []).append(got <= min(final) + 1e-12)
    print("== seeds %s: the first %d trials of random search, val_loss every %d steps against the final (%d)" % (
        SEEDS, k_trials, MIN_R, MAX_R))
    for st in sorted(rho):
        print("   step %4d: Spearman median %.2f (min %.2f); the final best ranks first on %d seeds, in the top 5 on %d, "
              "worst #%d" % (st, statistics.median(rho[st]), min(rho[st]), sum(r == 0 for r in rank[st]),
                             sum(r < 5 for r in rank[st]), max(rank[st]) + 1))
    print("== one rung: N trials to %d steps, the k best there on to %d; seeds (of %d) reaching random's final best "
          "of %d within %d steps" % (MIN_R, MAX_R, len(SEEDS), k_trials, budget))
    for k in (1, 2, 3):
        print("   k %d: %s" % (k, " ".join("N%d:%d" % (n, sum(v)) for (kk, n), v in sorted(met.items()) if kk == k)))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("curves", "report", "tpe", "steps"):
        sys.exit(__doc__)
    {"curves": curves, "report": report, "tpe": tpe_report, "steps": steps_report}[sys.argv[1]](sys.argv[2])
