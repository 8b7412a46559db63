"""Train a deep MLP with DistributedDataParallel: many 1 MB weights, so DDP's bucket size matters.

A training script written the way people write them: nothing here knows about torchscale. Its
DDP call takes the bucket size from --bucket-cap-mb, as a script tuned by hand once would.

    torchrun --nproc-per-node 2 examples/scripts/train_many_buckets.py --bucket-cap-mb 1
    torchscale tune --script examples/scripts/train_many_buckets.py --gpus 2 --budget 10m \\
        -- --bucket-cap-mb 1

Thirty-two 512x512 layers: at 1 MB buckets DDP all-reduces about 32 buckets a step, at 100 MB
two. Rank 0 prints the job's samples/s every --log-every steps.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps to train")
    parser.add_argument("--batch-size", type=int, default=8, help="samples per rank per step")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=32, help="linear layers")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's bucket size")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--log-every", type=int, default=10, help="print samples/s every N steps")
    return parser.parse_args()


def mlp(width, depth):
    layers = []
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, width))
    return nn.Sequential(*layers)


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
    model = DDP(
        mlp(args.width, args.depth).to(device),
        device_ids=[local_rank] if use_cuda else None,
        bucket_cap_mb=args.bucket_cap_mb,
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    generator = torch.Generator().manual_seed(rank)
    inputs = torch.randn(args.batch_size, args.width, generator=generator).to(device)
    targets = torch.randint(0, args.width, (args.batch_size,), generator=generator).to(device)
    batches = None
    if args.workers:  # the same kind of batches, through worker processes
        count = 16 * args.batch_size
        dataset = TensorDataset(
            torch.randn(count, args.width, generator=generator),
            torch.randint(0, args.width, (count,), generator=generator),
        )
        loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True,
                            num_workers=args.workers, persistent_workers=True)  # fmt: skip
        batches = (batch for _ in iter(int, 1) for batch in loader)

    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        if batches is not None:
            inputs, targets = (t.to(device) for t in next(batches))
        loss = F.cross_entropy(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % args.log_every == 0:
            if use_cuda:
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - started
            if rank == 0:
                rate = world * args.batch_size * args.log_every / elapsed
                print(f"step {step}: loss {loss.item():.3f}, {rate:.1f} samples/s", flush=True)
            started = time.perf_counter()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
