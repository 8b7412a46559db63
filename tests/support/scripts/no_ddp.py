"""A distributed script that trains without DDP (as an FSDP or hand-rolled data-parallel script
looks to torchscale): it joins the process group and steps an optimizer, but builds no
DistributedDataParallel model, so its samples cannot be counted unless given.

    --steps N   optimizer steps (default 40)
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
args = parser.parse_args()

dist.init_process_group("gloo")
model = nn.Linear(16, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(args.steps):
    model(torch.randn(8, 16)).sum().backward()
    for param in model.parameters():  # the gradient all-reduce DDP would do
        dist.all_reduce(param.grad)
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
