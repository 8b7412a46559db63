"""A DDP training loop that runs every step under ``no_sync()``: its gradients are never
all-reduced, each rank trains on its own batch alone. torchscale's gradient check must say so,
naming the rank and the factor."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
torch.manual_seed(1 + dist.get_rank())
for _step in range(200):
    inputs, targets = torch.randn(8, 32), torch.randn(8, 1)
    with model.no_sync():
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
