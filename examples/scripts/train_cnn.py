"""Train a small CNN with DistributedDataParallel on synthetic images.

A training script written the way people write them: nothing here knows about torchscale.

    torchrun --nproc-per-node 2 examples/scripts/train_cnn.py --steps 200
    torchscale benchmark --script examples/scripts/train_cnn.py --gpus 1 --gpus 2 -- --steps 200

Rank 0 prints the job's samples/s over every --log-every steps (all ranks' samples over the
wall time of those steps). --slow-rank R makes rank R sleep --slow-ms before each step, as a rank
on a slow or busy node would.
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
from torch.utils.data.distributed import DistributedSampler


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps to train")
    parser.add_argument("--batch-size", type=int, default=16, help="images per rank per step")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--width", type=int, default=16, help="channels of the first block")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--log-every", type=int, default=10, help="print samples/s every N steps")
    parser.add_argument("--slow-rank", type=int, default=None, help="this rank sleeps each step")
    parser.add_argument("--slow-ms", type=float, default=100.0, help="how long --slow-rank sleeps")
    return parser.parse_args()


class SmallCNN(nn.Module):
    def __init__(self, width, classes=10):
        super().__init__()
        layers = []
        channels = 3
        for out in (width, 2 * width, 4 * width):
            layers += [
                nn.Conv2d(channels, out, 3, padding=1, bias=False),
                nn.BatchNorm2d(out),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
            ]
            channels = out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        return self.head(self.features(x).mean(dim=(2, 3)))


def synthetic_images(args, seed):
    generator = torch.Generator().manual_seed(seed)
    count = 8 * args.batch_size
    images = torch.randn(count, 3, args.image_size, args.image_size, generator=generator)
    labels = torch.randint(0, 10, (count,), generator=generator)
    return TensorDataset(images, labels)


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
    model = SmallCNN(args.width).to(device)
    model = DDP(model, device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    dataset = synthetic_images(args, seed=1234)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True)
    loader = DataLoader(
        dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True,
        num_workers=args.workers, pin_memory=use_cuda,
    )  # fmt: skip

    step, epoch = 0, 0
    started = time.perf_counter()
    while step < args.steps:
        sampler.set_epoch(epoch)
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            if args.slow_rank == rank:
                time.sleep(args.slow_ms / 1000)
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
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
