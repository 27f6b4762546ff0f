#!/usr/bin/python3
"""torch_gpt.py - the PyTorch side of kiln's engine benchmark (bench/RESULTS.md): the same GPT-2
training step as bench/engine_bench.c (forward, cross-entropy, backward, global-norm clipping,
AdamW with weight decay on 2-D weights), same configurations, same thread count, float32.
Prints one JSON line per configuration. --precision bf16 runs the forward under
torch.autocast("cpu", dtype=torch.bfloat16), PyTorch's counterpart of kiln's mixed precision.

    /usr/bin/python3 bench/torch_gpt.py [--config 124m|small|all] [--threads 2] [--steps 10]
                                         [--warmup 3] [--blas openmp|pthread|default]

--blas re-executes the script with Debian's OpenMP or pthreads build of OpenBLAS first on the
library path (PyTorch links libblas.so.3 and libopenblas.so.0); "best" tries both builds, each
with libgomp's default (spinning), passive and bounded (GOMP_SPINCOUNT=5000, kiln-train's
default) wait policies and with OpenBLAS's own kernel choice
and OPENBLAS_CORETYPE=Zen (what kiln-train picks on AMD family 19h), and keeps the fastest per
configuration (all variants are printed on stderr).
"""
import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

CONFIGS = {
    "124m": dict(L=12, NH=12, C=768, V=50257, Vp=50304, T=64, B=4),
    "small": dict(L=4, NH=4, C=256, V=256, Vp=256, T=128, B=8),
}
BLAS_DIRS = {"openmp": "/usr/lib/x86_64-linux-gnu/openblas-openmp",
             "pthread": "/usr/lib/x86_64-linux-gnu/openblas-pthread"}


def run(cfg_name, threads, steps, warmup, precision="fp32"):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    torch.manual_seed(1337)
    c = CONFIGS[cfg_name]
    L, NH, C, V, Vp, T, B = (c[k] for k in ("L", "NH", "C", "V", "Vp", "T", "B"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(C)
            self.qkv = nn.Linear(C, 3 * C)
            self.proj = nn.Linear(C, C)
            self.ln2 = nn.LayerNorm(C)
            self.fc = nn.Linear(C, 4 * C)
            self.fcproj = nn.Linear(4 * C, C)
            mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
            self.register_buffer("mask", mask)

        def forward(self, x):
            h = self.ln1(x)
            q, k, v = self.qkv(h).split(C, dim=-1)
            hs = C // NH
            q = q.view(B, T, NH, hs).transpose(1, 2)
            k = k.view(B, T, NH, hs).transpose(1, 2)
            v = v.view(B, T, NH, hs).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(~self.mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + self.proj(y)
            x = x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
            return x

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(Vp, C)
            self.wpe = nn.Embedding(T, C)
            self.blocks = nn.ModuleList([Block() for _ in range(L)])
            self.lnf = nn.LayerNorm(C)
            for n, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * L) if n.endswith("proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)
                elif n.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, idx, tgt):
            x = self.wte(idx) + self.wpe.weight[:T]
            for blk in self.blocks:
                x = blk(x)
            logits = self.lnf(x) @ self.wte.weight.T  # tied LM head
            return F.cross_entropy(logits[:, :, :V].reshape(-1, V), tgt.reshape(-1))

    model = GPT()
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    n_params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(42)
    times, cpus, losses = [], [], []
    for s in range(warmup + steps):
        idx = torch.randint(0, V, (B, T), generator=g)
        tgt = torch.randint(0, V, (B, T), generator=g)
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        if precision == "bf16":  # autocast: bf16 GEMMs, fp32 master weights (as kiln's bf16)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(idx, tgt)
        else:
            loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        losses.append(float(loss))
        if s >= warmup:
            times.append(dt)
            cpus.append(dc)
    med = statistics.median(times)
    # model FLOPs per token as kiln counts them: 6N (N without wpe and vocab padding) + 6LCT
    n_model = n_params - T * C - (Vp - V) * C
    fpt = 6 * n_model + 6 * L * C * T
    tps = B * T / med
    return {"impl": "pytorch", "torch": torch.__version__, "config": cfg_name,
            "precision": precision, "threads": threads, "params": n_params, "ms_per_step": round(med * 1e3, 2),
            "min_ms": round(min(times) * 1e3, 2),
            "cpu_ms_per_step": round(statistics.median(cpus) * 1e3, 2),
            "tokens_per_s": round(tps, 1),
            "achieved_gflops": round(fpt * tps / 1e9, 1),
            "peak_mem_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="all")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--blas", default="best", choices=["best", "openmp", "pthread", "default"])
    ap.add_argument("--variants", default="",
                    help="comma-separated blas/policy/coretype triples to try instead of all, "
                         "e.g. openmp/PASSIVE/Zen,openmp/spin5000/default,pthread/PASSIVE/default")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                    help="bf16: the forward under torch.autocast(cpu, bfloat16)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    names = list(CONFIGS) if a.config == "all" else [a.config]
    if a.child or a.blas == "default":
        for n in names:
            r = run(n, a.threads, a.steps, a.warmup, a.precision)
            r["blas"] = os.environ.get("KILN_BENCH_BLAS", "default")
            r["omp_wait_policy"] = os.environ.get("OMP_WAIT_POLICY") or (
                "spin" + os.environ["GOMP_SPINCOUNT"] if "GOMP_SPINCOUNT" in os.environ else "default")
            r["openblas_coretype"] = os.environ.get("OPENBLAS_CORETYPE", "default")
            print(json.dumps(r), flush=True)
        return
    blases = ["openmp", "pthread"] if a.blas == "best" else [a.blas]
    variants = [(b, w, c) for b in blases for w in ("default", "PASSIVE", "spin5000")
                for c in ("default", "Zen")]
    if a.variants:
        variants = [tuple(v.split("/")) for v in a.variants.split(",")]
    for n in names:
        results = []
        for v, w, ct in variants:
            env = dict(os.environ, LD_LIBRARY_PATH=BLAS_DIRS[v], KILN_BENCH_BLAS=v,
                       OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads))
            env.pop("OMP_WAIT_POLICY", None)
            env.pop("OPENBLAS_CORETYPE", None)
            env.pop("GOMP_SPINCOUNT", None)
            if w.startswith("spin"):  # libgomp spins this many loops (kiln-train's default: 5000)
                env["GOMP_SPINCOUNT"] = w[4:]
            elif w != "default":
                env["OMP_WAIT_POLICY"] = w
            if ct != "default":
                env["OPENBLAS_CORETYPE"] = ct
            out = subprocess.run([sys.executable, __file__, "--child", "--config", n,
                                  "--threads", str(a.threads), "--steps", str(a.steps),
                                  "--warmup", str(a.warmup), "--precision", a.precision], env=env,
                                 capture_output=True,
                                 text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(json.dumps(r), file=sys.stderr, flush=True)
            results.append(r)
        best = min(results, key=lambda r: r["ms_per_step"])
        best["variants"] = {"/".join((r["blas"], r["omp_wait_policy"], r["openblas_coretype"])):
                            r["ms_per_step"] for r in results}
        print(json.dumps(best), flush=True)


if __name__ == "__main__":
    main()
