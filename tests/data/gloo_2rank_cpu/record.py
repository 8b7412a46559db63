"""How rank0.json / rank1.json were recorded (torch 2.14.1, CPU, gloo, this repo's dev machine):

    torchrun --standalone --nproc_per_node=2 tests/data/gloo_2rank_cpu/record.py

Rank 1 sleeps 50 ms before every step, so it reaches each all-reduce late and rank 0 waits for
it. The profiler schedule records steps 1-3 (HTA's rule then analyses steps 1-2).
"""

import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

SLEEP_S = 0.05
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(
    torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))
schedule = torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1)
handler = torch.profiler.tensorboard_trace_handler(".", worker_name=f"rank{rank}")
with torch.profiler.profile(
    activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule, on_trace_ready=handler
) as prof:
    for _ in range(5):
        if rank == 1:
            time.sleep(SLEEP_S)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        prof.step()
dist.destroy_process_group()
