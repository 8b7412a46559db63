"""A script that wraps two models in DistributedDataParallel (a generator and a discriminator,
say): torchscale measures one DDP model, and must say so rather than measure either."""

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
generator = DDP(nn.Linear(8, 8))
discriminator = DDP(nn.Linear(8, 1))
dist.destroy_process_group()
