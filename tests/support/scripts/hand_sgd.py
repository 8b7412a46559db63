"""A DDP script that updates its weights by hand, without torch.optim (steps are marked at DDP
forwards: --step-at forward), whose forward takes a 0-d scale tensor before the batch (samples
cannot be counted: --samples-per-step). It can also leave with sys.exit mid-run.

    --steps N        forwards (default 40)
    --batch-size B   rows per forward (default 5)
    --exit-at K      sys.exit before forward K (1-based; default: never)
    --exit-code C    the exit code (default 3)
"""

import argparse
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, scale: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) * scale


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--batch-size", type=int, default=5)
parser.add_argument("--exit-at", type=int, default=None)
parser.add_argument("--exit-code", type=int, default=3)
args = parser.parse_args()

dist.init_process_group("gloo")
model = DDP(Scaled())
scale = torch.tensor(1.0)
for step in range(1, args.steps + 1):
    if step == args.exit_at:
        sys.exit(args.exit_code)
    x, y = torch.randn(args.batch_size, 16), torch.randn(args.batch_size, 1)
    nn.functional.mse_loss(model(scale, x), y).backward()
    with torch.no_grad():
        for param in model.parameters():
            param -= 0.01 * param.grad
            param.grad = None
dist.destroy_process_group()
