#!/usr/bin/env python3
"""torch_gpt_cuda.py - the PyTorch side of kiln's CUDA benchmark (bench/RESULTS.md, CUDA section):
GPT-2 124M, T=1024, the same training step as bench/cuda_gpt_bench.c (forward, cross-entropy,
backward, global-norm clipping at 1.0, AdamW with weight decay on 2-D weights, lr 3e-4, betas
0.9/0.95) on random tokens, with bf16 autocast, fp32 master weights, torch.compile, the fused
AdamW and scaled_dot_product_attention (flash attention): what a careful PyTorch user runs.
The batch is the largest that fits unless --B is given. Prints one JSON line.

    python3 bench/torch_gpt_cuda.py [--config 124m|small] [--T 1024] [--B 0] [--steps 20]
                                    [--warmup 5] [--no-compile] [--peak-tflops 0]

Needs a CUDA build of PyTorch (Debian's python3-torch is CPU-only): without a GPU it prints
{"impl": "pytorch-cuda", "skipped": "..."} and exits 0.
"""
import argparse
import json
import math
import statistics
import sys
import time

CONFIGS = {
    "124m": dict(L=12, NH=12, C=768, V=50257, Vp=50304),
    "small": dict(L=4, NH=4, C=256, V=256, Vp=256),
}


def peak_for(name):
    """Dense bf16 tensor-core peak in TFLOP/s (no sparsity)."""
    if "H200" in name:
        return 989.0
    if "H100" in name:
        return 756.0 if "PCIe" in name else 989.0
    if "A100" in name:
        return 312.0
    return 0.0


def build(cfg, T, torch, nn, F):
    L, NH, C, V, Vp = (cfg[k] for k in ("L", "NH", "C", "V", "Vp"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(C)
            self.qkv = nn.Linear(C, 3 * C)
            self.proj = nn.Linear(C, C)
            self.ln2 = nn.LayerNorm(C)
            self.fc = nn.Linear(C, 4 * C)
            self.fcproj = nn.Linear(4 * C, C)

        def forward(self, x):
            B = x.shape[0]
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
            hs = C // NH
            q = q.view(B, T, NH, hs).transpose(1, 2)
            k = k.view(B, T, NH, hs).transpose(1, 2)
            v = v.view(B, T, NH, hs).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

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
            return F.cross_entropy(logits[:, :, :V].reshape(-1, V).float(), tgt.reshape(-1))

    return GPT()


def run(a):
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except ImportError as e:
        return {"impl": "pytorch-cuda", "skipped": "no torch: %s" % e}
    if not torch.cuda.is_available():
        return {"impl": "pytorch-cuda", "torch": torch.__version__,
                "skipped": "no CUDA device (or a CPU-only torch build)"}
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(1337)
    cfg = CONFIGS[a.config]
    T, V = a.T, cfg["V"]
    name = torch.cuda.get_device_name(0)
    peak = a.peak_tflops or peak_for(name)

    def attempt(B, steps, warmup):
        model = build(cfg, T, torch, nn, F).to(dev)
        decay = [p for p in model.parameters() if p.dim() == 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": 0.1},
                  {"params": no_decay, "weight_decay": 0.0}]
        try:
            opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
        except (TypeError, RuntimeError):  # torch without the fused kernel
            opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, foreach=True)
        fwd = torch.compile(model) if a.compile else model
        g = torch.Generator(device=dev).manual_seed(42)
        times, losses = [], []
        torch.cuda.reset_peak_memory_stats()
        for s in range(warmup + steps):
            idx = torch.randint(0, V, (B, T), generator=g, device=dev)
            tgt = torch.randint(0, V, (B, T), generator=g, device=dev)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = fwd(idx, tgt)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(float(loss))  # synchronises, like kiln's loss copy
            dt = time.perf_counter() - t0
            if s >= warmup:
                times.append(dt)
        n_params = sum(p.numel() for p in model.parameters())
        return n_params, times, losses

    tries = [a.B] if a.B > 0 else [128, 96, 64, 48, 32, 24, 16, 12, 8, 6, 4, 3, 2, 1]
    B = None
    for b in tries:
        try:
            attempt(b, 1, 1)  # compiles and proves it fits
            B = b
            break
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            continue
    if B is None:
        return {"impl": "pytorch-cuda", "device": name, "skipped": "no batch fits"}
    torch.cuda.empty_cache()
    n_params, times, losses = attempt(B, a.steps, a.warmup)
    med = statistics.median(times)
    L, C, Vp = cfg["L"], cfg["C"], cfg["Vp"]
    # model FLOPs per token as kiln counts them: 6N (N without wpe and vocab padding) + 6LCT
    n_model = n_params - T * C - (Vp - V) * C
    fpt = 6 * n_model + 6 * L * C * T
    tps = B * T / med
    return {"impl": "pytorch-cuda", "torch": torch.__version__, "device": name,
            "config": a.config, "T": T, "B": B, "compile": a.compile, "params": n_params,
            "ms_per_step": round(med * 1e3, 2), "min_ms": round(min(times) * 1e3, 2),
            "tokens_per_s": round(tps, 1), "achieved_tflops": round(fpt * tps / 1e12, 1),
            "peak_tflops": peak, "mfu": round(fpt * tps / (peak * 1e12), 4) if peak else 0.0,
            "gpu_mem_peak_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1),
            "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="124m", choices=list(CONFIGS))
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--B", type=int, default=0)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--peak-tflops", type=float, default=0.0)
    a = ap.parse_args()
    print(json.dumps(run(a)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
