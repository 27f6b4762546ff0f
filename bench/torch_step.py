"""torch_step.py - a PyTorch DDP training script for bench/sandbox_cost.sh: an MLP (784-512-512-10)
on synthetic data, gloo backend, BATCH samples per rank a step, STEPS steps. Written for torchrun's
contract (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so it runs unchanged under plain torchrun
and as a kiln script job. Rank 0 prints each step's time and, at the end, the median over the
steps after WARMUP and, from getrusage over those steps (every thread of the process), what one
step costs in counts that a loaded machine does not change: "median_step_ms=X steps=N threads=T
cpu_ms=C sys_ms=S minflt=F majflt=M nvcsw=V nivcsw=I" (CPU time, faults and context switches a
step).
"""
import os
import resource
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
    if step == WARMUP + 1:
        r0 = resource.getrusage(resource.RUSAGE_SELF)
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
r1 = resource.getrusage(resource.RUSAGE_SELF)
if rank == 0:
    n = len(times)
    print("median_step_ms=%.3f steps=%d threads=%d cpu_ms=%.3f sys_ms=%.3f minflt=%.2f majflt=%.2f nvcsw=%.2f "
          "nivcsw=%.2f" % (statistics.median(times), n, torch.get_num_threads(),
                           (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) * 1000 / n,
                           (r1.ru_stime - r0.ru_stime) * 1000 / n, (r1.ru_minflt - r0.ru_minflt) / n,
                           (r1.ru_majflt - r0.ru_majflt) / n, (r1.ru_nvcsw - r0.ru_nvcsw) / n,
                           (r1.ru_nivcsw - r0.ru_nivcsw) / n), flush=True)
dist.destroy_process_group()
