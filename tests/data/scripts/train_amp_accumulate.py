"""Train an MLP classifier with mixed precision, gradient accumulation and periodic checkpoints.

A training script written the way people write them (nothing here knows about torchscale):
a DataLoader with persistent worker processes and pinned memory, ``torch.compile`` of the model
(``--compile``), autocast with a GradScaler (bfloat16 on a CPU, float16 on a GPU), gradient
accumulation that skips DDP's all-reduce on all but the last micro-batch (``no_sync``), a
one-cycle learning-rate schedule, and a checkpoint saved every --save-every steps by rank 0,
which a detached uploader process (``--uploader``) would push to storage.

    torchrun --nproc-per-node 2 train_amp_accumulate.py --steps 60 --workers 2

Rank 0 prints the job's samples/s over every --log-every optimizer steps.
"""

import argparse
import contextlib
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

UPLOADER = """
import os, sys, time
folder = sys.argv[1]
while True:  # a stand-in for pushing new checkpoints to object storage
    time.sleep(1)
    os.listdir(folder)
"""


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps to train")
    parser.add_argument("--batch-size", type=int, default=16, help="samples per micro-batch")
    parser.add_argument("--accumulate", type=int, default=2, help="micro-batches per step")
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    parser.add_argument("--save-every", type=int, default=25)
    parser.add_argument("--uploader", action="store_true", help="start the checkpoint uploader")
    parser.add_argument("--log-every", type=int, default=10, help="print samples/s every N steps")
    return parser.parse_args()


def start_uploader(folder):
    """Detach the uploader from this job: fork twice, new session, as a daemon does."""
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.execv(sys.executable, [sys.executable, "-c", UPLOADER, folder])
        os._exit(0)
    os.waitpid(pid, 0)


def save_checkpoint(folder, step, model, optimizer, scaler, scheduler):
    state = {
        "step": step,
        "model": model.module.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "scheduler": scheduler.state_dict(),
    }
    path = os.path.join(folder, "last.pt")
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def main():
    args = parse_args()
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    amp_dtype = torch.float16 if use_cuda else torch.bfloat16

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(args.features, args.hidden), nn.GELU(), nn.LayerNorm(args.hidden),
        nn.Linear(args.hidden, args.hidden), nn.GELU(), nn.Linear(args.hidden, 10),
    ).to(device)  # fmt: skip
    if args.compile:
        model = torch.compile(model, backend=args.compile_backend)
    model = DDP(model, device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, args.lr, total_steps=args.steps)
    scaler = torch.amp.GradScaler(device.type)

    generator = torch.Generator().manual_seed(1234)
    count = 64 * args.batch_size
    data = torch.randn(count, args.features, generator=generator)
    labels = torch.randint(0, 10, (count,), generator=generator)
    sampler = DistributedSampler(TensorDataset(data, labels), num_replicas=world, rank=rank)
    loader = DataLoader(
        TensorDataset(data, labels), batch_size=args.batch_size, sampler=sampler,
        drop_last=True, num_workers=args.workers, pin_memory=True,
        persistent_workers=args.workers > 0,
    )  # fmt: skip
    if rank == 0:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        if args.uploader:
            start_uploader(args.checkpoint_dir)

    step, epoch, micro = 0, 0, 0
    started = time.perf_counter()
    while step < args.steps:
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            inputs = inputs.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            micro += 1
            last = micro % args.accumulate == 0
            sync = contextlib.nullcontext() if last else model.no_sync()
            with sync:
                with torch.autocast(device.type, dtype=amp_dtype):
                    loss = F.cross_entropy(model(inputs), targets) / args.accumulate
                scaler.scale(loss).backward()
            if not last:
                continue
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            step += 1
            if rank == 0 and step % args.save_every == 0:
                save_checkpoint(args.checkpoint_dir, step, model, optimizer, scaler, scheduler)
            if step % args.log_every == 0:
                if use_cuda:
                    torch.cuda.synchronize()
                elapsed = time.perf_counter() - started
                if rank == 0:
                    samples = world * args.batch_size * args.accumulate * args.log_every
                    print(
                        f"step {step}: loss {loss.item() * args.accumulate:.3f}, "
                        f"{samples / elapsed:.1f} samples/s over steps "
                        f"{step - args.log_every + 1}-{step}",
                        flush=True,
                    )
                started = time.perf_counter()
            if step == args.steps:
                break
        epoch += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
