#!/usr/bin/python3
"""cost_model.py - predicts the step time and scaling efficiency of data-parallel training
(weak scaling: a fixed per-GPU batch) of GPT-2 124M / 350M / 1.5B on 8 to 2,048 GPUs, from
per-GPU compute time (model FLOPs at a stated MFU, checked against published figures) and stated
link bandwidths and latencies: flat ring vs hierarchical all-reduce, gradient buckets overlapped
with backward. Also runs BERT-large on V100 nodes to compare with Herring's published 85%
scaling efficiency at 2,048 V100 GPUs. Every assumption is in bench/COST-MODEL.md.
Standard library only.  Usage: /usr/bin/python3 bench/cost_model.py [--csv]
"""
import math
import sys

# ---- hardware: per-GPU peak, achieved (not line-rate) bandwidths, per-message latencies -----
HW = {
    # AWS p4d.24xlarge: 8 x A100 40GB SXM, NVSwitch; 4 x 100 Gb/s EFA per node.
    "a100-efa": dict(gpus_per_node=8, peak_tflops=312.0, nvlink_GBps=230.0, nvlink_alpha=5e-6,
                     net_GBps=0.8 * 50.0, net_alpha=20e-6),
    # The same node with 8 x 200 Gb/s InfiniBand HDR (DGX A100 SuperPOD style).
    "a100-ib": dict(gpus_per_node=8, peak_tflops=312.0, nvlink_GBps=230.0, nvlink_alpha=5e-6,
                    net_GBps=0.8 * 200.0, net_alpha=5e-6),
    # AWS p3dn.24xlarge: 8 x V100 32GB, NVLink2 hybrid cube mesh; 1 x 100 Gb/s EFA per node.
    "v100-efa": dict(gpus_per_node=8, peak_tflops=125.0, nvlink_GBps=130.0, nvlink_alpha=5e-6,
                     net_GBps=0.8 * 12.5, net_alpha=20e-6),
}

# ---- models: parameters, layers, width, sequence length, per-GPU batch (sequences) ----------
MODELS = {
    "gpt2-124m": dict(params=124.4e6, L=12, C=768, T=1024, batch=64, mfu=0.50),
    "gpt2-350m": dict(params=354.8e6, L=24, C=1024, T=1024, batch=32, mfu=0.45),
    "gpt2-1.5b": dict(params=1557.6e6, L=48, C=1600, T=1024, batch=16, mfu=0.45),
    # BERT-large for the Herring comparison (phase 1: sequence length 128).
    "bert-large": dict(params=340e6, L=24, C=1024, T=128, batch=64, mfu=0.35),
}

GPU_COUNTS = [8, 16, 32, 64, 128, 256, 512, 1024, 2048]


def flops_per_token(m):
    """Training FLOPs per token, 6N + 6LCT (forward + backward; kiln's and llm.c's count)."""
    return 6.0 * m["params"] + 6.0 * m["L"] * m["C"] * m["T"]


def compute_time(m, hw):
    """Seconds of forward + backward + optimizer for one per-GPU batch."""
    tokens = m["batch"] * m["T"]
    return tokens * flops_per_token(m) / (m["mfu"] * hw["peak_tflops"] * 1e12)


def ring_allreduce(nbytes, p, GBps, alpha):
    """Bandwidth-optimal ring over p members: 2(p-1) steps of nbytes/p each."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2.0 * (p - 1) / p * nbytes / (GBps * 1e9)


def allreduce_time(nbytes, n_gpus, hw, algo):
    g = min(hw["gpus_per_node"], n_gpus)
    nodes = max(1, n_gpus // g)
    if nodes == 1:
        return ring_allreduce(nbytes, g, hw["nvlink_GBps"], hw["nvlink_alpha"])
    if algo == "ring":
        # One flat ring through every GPU: every node's NICs carry the whole ring stream, and each
        # of the 2(N-1) steps waits for its slowest hop (a network hop).
        return 2 * (n_gpus - 1) * hw["net_alpha"] + \
            2.0 * (n_gpus - 1) / n_gpus * nbytes / (hw["net_GBps"] * 1e9)
    # Hierarchical: reduce-scatter inside the node (NVLink), g parallel rings across nodes on
    # 1/g of the data each (sharing the node's NICs), all-gather inside the node.
    intra = (g - 1) * hw["nvlink_alpha"] + (g - 1.0) / g * nbytes / (hw["nvlink_GBps"] * 1e9)
    # Across nodes the library picks the cheaper of a ring (2(n-1) latency steps) and a
    # pipelined double binary tree (NCCL's: 2 log2(n) latency steps, full bandwidth for large
    # messages), which is what keeps the latency term small at hundreds of nodes.
    bw = 2.0 * (nodes - 1) / nodes * nbytes / (hw["net_GBps"] * 1e9)
    inter_ring = 2 * (nodes - 1) * hw["net_alpha"] + bw
    inter_tree = 2 * math.ceil(math.log2(nodes)) * hw["net_alpha"] + bw
    return 2 * intra + min(inter_ring, inter_tree)


# Fixed global batches (tokens) for strong scaling, GPT-3 paper's sizes for these model sizes.
GLOBAL_TOKENS = {"gpt2-124m": 0.5e6, "gpt2-350m": 0.5e6, "gpt2-1.5b": 1.0e6}


def step(model, hwname, n_gpus, algo="hier", grad_bytes=4, bucket_mb=25.0, overlap=0.8,
         batch=None):
    """Predicted (step seconds, compute seconds, exposed communication seconds, comm seconds).
    batch: per-GPU sequences (default the model's weak-scaling batch; may be fractional)."""
    m, hw = dict(MODELS[model]), HW[hwname]
    if batch is not None:
        m["batch"] = batch
    tc = compute_time(m, hw)
    tb = tc * 2.0 / 3.0                       # backward is ~2/3 of forward + backward
    S = m["params"] * grad_bytes
    bucket = bucket_mb * 1024 * 1024
    k = max(1, math.ceil(S / bucket))
    last = S - (k - 1) * bucket               # the bucket finished at the very end of backward
    t_bucket = allreduce_time(bucket, n_gpus, hw, algo) if k > 1 else 0.0
    t_last = allreduce_time(last, n_gpus, hw, algo)
    comm = (k - 1) * t_bucket + t_last
    # Buckets before the last one run while backward computes earlier layers; at most a fraction
    # `overlap` of backward can hide them; the last bucket is always exposed.
    hidden = min((k - 1) * t_bucket, overlap * tb)
    exposed = comm - hidden
    return tc + exposed, tc, exposed, comm


def table(model, hwname, algo, grad_bytes, overlap, out):
    print(f"\n{model} on {hwname}, {algo} all-reduce, {grad_bytes}-byte gradients, overlap {overlap:.0%}"
          f" (compute {compute_time(MODELS[model], HW[hwname]) * 1e3:.0f} ms/step,"
          f" {MODELS[model]['batch']} x {MODELS[model]['T']} tokens per GPU)", file=out)
    print(f"{'GPUs':>6} {'step ms':>9} {'comm ms':>9} {'exposed':>9} {'efficiency':>11}", file=out)
    for n in GPU_COUNTS:
        t, tc, ex, comm = step(model, hwname, n, algo, grad_bytes, overlap=overlap)
        print(f"{n:>6} {t * 1e3:>9.1f} {comm * 1e3:>9.1f} {ex * 1e3:>9.1f} {tc / t:>10.1%}", file=out)


def main():
    out = sys.stdout
    if "--csv" in sys.argv:
        print("model,hw,algo,grad_bytes,overlap,gpus,step_ms,compute_ms,exposed_ms,comm_ms,efficiency")
        for model in MODELS:
            for hwname in HW:
                for algo in ("ring", "hier"):
                    for gb in (2, 4):
                        for ov in (0.0, 0.8):
                            for n in GPU_COUNTS:
                                t, tc, ex, comm = step(model, hwname, n, algo, gb, overlap=ov)
                                print(f"{model},{hwname},{algo},{gb},{ov},{n},{t*1e3:.2f},"
                                      f"{tc*1e3:.2f},{ex*1e3:.2f},{comm*1e3:.2f},{tc/t:.4f}")
        return
    print("Data-parallel scaling efficiency = compute time / step time (weak scaling).")
    for model in ("gpt2-124m", "gpt2-350m", "gpt2-1.5b"):
        table(model, "a100-efa", "hier", 4, 0.8, out)
    print("\nSummary at 2,048 GPUs (efficiency):", file=out)
    print(f"{'model':<11} {'hw':<9} {'ring/no-ovl':>12} {'ring/ovl':>9} {'hier/no-ovl':>12} "
          f"{'hier/ovl':>9} {'hier/ovl bf16':>14}", file=out)
    for model in ("gpt2-124m", "gpt2-350m", "gpt2-1.5b"):
        for hwname in ("a100-efa", "a100-ib"):
            row = []
            for algo, ov, gb in (("ring", 0, 4), ("ring", .8, 4), ("hier", 0, 4), ("hier", .8, 4),
                                 ("hier", .8, 2)):
                t, tc, _, _ = step(model, hwname, 2048, algo, gb, overlap=ov)
                row.append(tc / t)
            print(f"{model:<11} {hwname:<9} {row[0]:>12.1%} {row[1]:>9.1%} {row[2]:>12.1%} "
                  f"{row[3]:>9.1%} {row[4]:>14.1%}", file=out)
    print("\nStrong scaling: a fixed global batch split over the GPUs (same MFU assumed at every"
          " per-GPU batch, which flatters small batches), hierarchical, 4-byte gradients, overlap 80%:",
          file=out)
    print(f"{'GPUs':>6}" + "".join(f" {m + ' tok/GPU':>18} {'eff':>6}" for m in GLOBAL_TOKENS), file=out)
    for n in GPU_COUNTS:
        line = f"{n:>6}"
        for model, gt in GLOBAL_TOKENS.items():
            per = gt / n
            seqs = per / MODELS[model]["T"]
            if seqs < 1:
                line += f" {per:>18.0f} {'<1 seq':>6}"
                continue
            t, tc, _, _ = step(model, "a100-efa", n, "hier", 4, overlap=0.8, batch=seqs)
            line += f" {per:>18.0f} {tc / t:>6.1%}"
        print(line, file=out)
    print("\nHerring check: BERT-large (340M) on 2,048 V100 (256 p3dn nodes, 100 Gb/s EFA each).", file=out)
    print("Published (Herring, SC20): 85% scaling efficiency.", file=out)
    for gb, ov in ((2, 0.8), (4, 0.8), (2, 0.0), (4, 0.0)):
        t, tc, ex, comm = step("bert-large", "v100-efa", 2048, "hier", gb, overlap=ov)
        print(f"  hierarchical, {gb}-byte gradients, overlap {ov:.0%}: step {t*1e3:.0f} ms "
              f"(compute {tc*1e3:.0f}, all-reduce {comm*1e3:.0f}, exposed {ex*1e3:.0f}) -> "
              f"efficiency {tc/t:.1%}", file=out)
    t, tc, ex, comm = step("bert-large", "v100-efa", 2048, "ring", 2, overlap=0.8)
    print(f"  flat ring, 2-byte gradients, overlap 80%: efficiency {tc/t:.1%}", file=out)


if __name__ == "__main__":
    main()
