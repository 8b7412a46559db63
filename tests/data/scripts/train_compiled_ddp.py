"""Train a residual MLP compiled as a whole (``torch.compile(DDP(model))``), with two optimizers.

A training script written the way people write them (nothing here knows about torchscale): the
DDP module compiled, as current training code does; activation checkpointing of every block
(``torch.utils.checkpoint``); AdamW on the body with two parameter groups (no weight decay on
biases and norms) and SGD on the head, each with its own learning-rate schedule; a small
dataset, so that epochs roll over and the sampler is re-seeded (``set_epoch``) each time; a
DataLoader whose worker processes start again each epoch.

    torchrun --nproc-per-node 2 train_compiled_ddp.py --steps 60

Rank 0 prints the job's samples/s over every --log-every steps.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="steps to train")
    parser.add_argument("--batch-size", type=int, default=16, help="samples per rank per step")
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--batches-per-epoch", type=int, default=6)
    parser.add_argument("--workers", type=int, default=1, help="DataLoader worker processes")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--log-every", type=int, default=10, help="print samples/s every N steps")
    return parser.parse_args()


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, features, blocks, classes=10):
        super().__init__()
        self.blocks = nn.ModuleList(Block(features) for _ in range(blocks))
        self.head = nn.Linear(features, classes)

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(x)


def main():
    args = parse_args()
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(0)
    net = Net(args.features, args.blocks).to(device)
    model = torch.compile(DDP(net, device_ids=[local_rank] if use_cuda else None),
                          backend=args.compile_backend)  # fmt: skip
    decay = [p for n, p in net.blocks.named_parameters() if p.dim() > 1]
    no_decay = [p for n, p in net.blocks.named_parameters() if p.dim() <= 1]
    body = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-3,
    )
    head = torch.optim.SGD(net.head.parameters(), lr=0.05, momentum=0.9)
    schedules = [
        torch.optim.lr_scheduler.CosineAnnealingLR(body, T_max=args.steps),
        torch.optim.lr_scheduler.StepLR(head, step_size=20, gamma=0.5),
    ]

    generator = torch.Generator().manual_seed(1234)
    count = args.batches_per_epoch * args.batch_size * world
    dataset = TensorDataset(
        torch.randn(count, args.features, generator=generator),
        torch.randint(0, 10, (count,), generator=generator),
    )
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                        num_workers=args.workers)  # fmt: skip

    step, epoch = 0, 0
    started = time.perf_counter()
    while step < args.steps:
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            loss = F.cross_entropy(model(inputs), targets)
            body.zero_grad(set_to_none=True)
            head.zero_grad(set_to_none=True)
            loss.backward()
            body.step()
            head.step()
            for schedule in schedules:
                schedule.step()
            step += 1
            if step % args.log_every == 0:
                if use_cuda:
                    torch.cuda.synchronize()
                elapsed = time.perf_counter() - started
                if rank == 0:
                    rate = world * args.batch_size * args.log_every / elapsed
                    print(
                        f"step {step}: loss {loss.item():.3f}, {rate:.1f} samples/s "
                        f"over steps {step - args.log_every + 1}-{step}",
                        flush=True,
                    )
                started = time.perf_counter()
            if step == args.steps:
                break
        epoch += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
