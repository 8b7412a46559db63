"""A DDP script that raises on one rank after a few steps (the others block in the next
all-reduce): torchscale must record a failure naming that rank, not hang.

    --rank R     the rank that raises (default 1)
    --after N    how many steps it trains first (default 2)
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--rank", type=int, default=1)
parser.add_argument("--after", type=int, default=2)
args = parser.parse_args()

dist.init_process_group("gloo")
model = DDP(nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    if step == args.after and dist.get_rank() == args.rank:
        raise RuntimeError(f"injected failure on rank {args.rank} at step {step}")
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
