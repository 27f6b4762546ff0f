"""torch_step.py - a PyTorch DDP training script for bench/sandbox_cost.sh: an MLP (784-512-512-10)
on synthetic data, gloo backend, BATCH samples per rank a step, STEPS steps. Written for torchrun's
contract (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so it runs unchanged under plain torchrun
and as a kiln script job. Rank 0 prints each step's time and, at the end, the median over the
steps after WARMUP: "median_step_ms=X steps=N threads=T".
"""
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn

STEPS = int(os.environ.get("STEPS", "60"))
WARMUP = int(os.environ.get("WARMUP", "10"))
BATCH = int(os.environ.get("BATCH", "64"))

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(1234 + rank)
model = nn.parallel.DistributedDataParallel(
    nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
x = torch.randn(BATCH, 784)
y = torch.randint(0, 10, (BATCH,))
times = []
for step in range(1, STEPS + 1):
    t0 = time.perf_counter()
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    ms = (time.perf_counter() - t0) * 1000
    if step > WARMUP:
        times.append(ms)
    if rank == 0 and step % 10 == 0:
        print("step %d loss %.4f step_ms %.2f" % (step, loss.item(), ms), flush=True)
if rank == 0:
    print("median_step_ms=%.3f steps=%d threads=%d" % (statistics.median(times), len(times), torch.get_num_threads()),
          flush=True)
dist.destroy_process_group()
