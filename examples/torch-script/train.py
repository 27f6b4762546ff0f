"""A bring-your-own PyTorch script for kiln: a character-level MLP on tinyshakespeare.

What kiln asks of a script (README.md, "Your own training code"; docs/contracts.md, "What a script
rank gets"), each shown below:
  - hyperparameters arrive as arguments (--lr 0.01 --max_steps 200 ...) and in SM_HPS;
  - data arrives as channels (SM_CHANNEL_TRAIN), read-only;
  - torch.distributed's env:// rendezvous works as under torchrun (RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT): gloo on CPU slots, one rank per slot, data parallel;
  - metrics: lines that the job's metric_definitions read (job.json: train_loss, val_loss), and
    kiln.log_metrics(step, ...) when the SDK's kiln/ travels with the code (checkpoint_step);
  - checkpoints go to SM_CHECKPOINT_DIR, which kiln keeps and restores on every attempt: resume
    from it at start, checkpoint on SIGTERM (a preemption, a stop) and exit, so nothing is lost;
  - a pause (a hyperband trial at its rung): at step KILN_PAUSE_AT_STEP, when set, checkpoint,
    report that step's metrics (the objective) and exit 0 on every rank; kiln marks the job
    PAUSED and, when it promotes the trial, starts it again to resume from that checkpoint;
  - the model goes to SM_MODEL_DIR, which becomes the job's model.tar.gz artifact.
"""
import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, default=0.01)
p.add_argument("--hidden", type=int, default=64)
p.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
p.add_argument("--max_steps", type=int, default=200)  # "max_steps": kiln shows progress and an ETA
p.add_argument("--batch_size", type=int, default=32)
p.add_argument("--context", type=int, default=8)
p.add_argument("--checkpoint_every", type=int, default=20)
p.add_argument("--step_sleep", type=float, default=0.0)  # slows a step down, to watch it live
args, _ = p.parse_known_args()

world = int(os.environ.get("WORLD_SIZE", "1"))
rank = int(os.environ.get("RANK", "0"))
if world > 1:
    dist.init_process_group("gloo")  # env://: kiln sets MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

try:
    import kiln  # the SDK's kiln/ directory, copied next to this file (standard library only)
    log_metrics = kiln.log_metrics
except ImportError:
    log_metrics = None

# --- data: the train channel, a file or a directory holding tinyshakespeare.txt
path = os.environ.get("SM_CHANNEL_TRAIN", "data/tinyshakespeare.txt")
if os.path.isdir(path):
    path = os.path.join(path, "tinyshakespeare.txt")
with open(path, "rb") as f:
    text = torch.tensor(list(f.read()[:200000]), dtype=torch.long)
split = int(len(text) * 0.9)
train, val = text[:split], text[split:]

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Embedding(256, 16), torch.nn.Flatten(),
                          torch.nn.Linear(16 * args.context, args.hidden), torch.nn.Tanh(),
                          torch.nn.Linear(args.hidden, 256))
model = torch.nn.parallel.DistributedDataParallel(net) if world > 1 else net
opt_class = torch.optim.Adam if args.optimizer == "adam" else torch.optim.SGD
opt = opt_class(net.parameters(), lr=args.lr)
loss_fn = torch.nn.CrossEntropyLoss()

# --- resume from the newest checkpoint: kiln restores SM_CHECKPOINT_DIR on every attempt
ckpt_dir = os.environ.get("SM_CHECKPOINT_DIR", "checkpoints")
os.makedirs(ckpt_dir, exist_ok=True)
ckpt = os.path.join(ckpt_dir, "checkpoint.pt")
step = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt)
    net.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    step = state["step"]
    print(f"resumed from step {step}", flush=True)


def save_checkpoint():
    if rank != 0:  # every rank holds the same weights; rank 0's directory is the one kiln keeps
        return
    tmp = os.path.join(ckpt_dir, ".checkpoint.pt.tmp")  # a name starting with "." is never synced
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp)
    os.replace(tmp, ckpt)
    if log_metrics:
        log_metrics(step, checkpoint_step=step)  # how much a preemption would lose: the steps since


# --- the step to pause at (a hyperband rung), or train to the end
pause_at = int(os.environ.get("KILN_PAUSE_AT_STEP") or 0)
end = pause_at if 0 < pause_at < args.max_steps else args.max_steps

stop = False


def on_sigterm(*_):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_sigterm)


def batch(src, seed):
    g = torch.Generator().manual_seed(seed)
    ix = torch.randint(len(src) - args.context - 1, (args.batch_size,), generator=g)
    return (torch.stack([src[i:i + args.context] for i in ix]),
            torch.stack([src[i + args.context] for i in ix]))


while step < end:
    x, y = batch(train, step * world + rank)  # the step picks the batch: a resumed run sees the same data
    loss = loss_fn(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    if rank == 0:
        print(f"step {step}/{args.max_steps} train_loss={loss.item():.4f}", flush=True)
    if step % args.checkpoint_every == 0 or step == end:  # at the end or the pause: metrics, checkpoint
        with torch.no_grad():
            vx, vy = batch(val, 12345)
            val_loss = loss_fn(model(vx), vy).item()
        if rank == 0:
            print(f"step {step} val_loss={val_loss:.4f}", flush=True)
        save_checkpoint()
    if world > 1:  # every rank stops at the same step, or the others would wait in an all-reduce
        flag = torch.tensor([1 if stop else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        stop = bool(flag.item())
    if stop:  # SIGTERM: checkpoint now, then exit (143: stopped after a checkpoint)
        save_checkpoint()
        if rank == 0:
            print(f"SIGTERM: checkpointed step {step}, exiting", flush=True)
        sys.exit(143)
    if args.step_sleep:
        time.sleep(args.step_sleep)

if step < args.max_steps:  # paused at KILN_PAUSE_AT_STEP: checkpointed and reported above; exit 0
    if rank == 0:
        print(f"paused at step {step} of {args.max_steps}", flush=True)
    if world > 1:
        dist.destroy_process_group()
    sys.exit(0)

if rank == 0:
    model_dir = os.environ.get("SM_MODEL_DIR", "model")
    os.makedirs(model_dir, exist_ok=True)
    torch.save(net.state_dict(), os.path.join(model_dir, "model.pt"))
    print(f"saved the model after step {step}", flush=True)
if world > 1:
    dist.destroy_process_group()
