"""How rank0.json was recorded (torch 2.14.1, CPU, this repo's dev machine):

    python tests/data/memory_cpu/record.py

A small MLP trains 4 steps under torch.profiler with ``profile_memory=True``, so the trace holds
the allocator's ``[memory]`` events (Device Type 0: the host) beside its ops; the second half of
each step keeps an extra 4 MiB buffer alive, so memory grows and falls inside each step.
"""

from pathlib import Path

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
with torch.profiler.profile(
    activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
) as prof:
    for _ in range(4):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        extra = torch.empty(1 << 20)  # 4 MiB held until the step ends
        opt.step()
        del extra
        prof.step()
prof.export_chrome_trace(str(Path(__file__).with_name("rank0.json")))
