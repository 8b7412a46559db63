"""Time an all_reduce the way DDP issues a gradient bucket: through DDP's own reducer.

Back-to-back ops (``op_timing.time_op``) and even ops issued right after compute
(``time_after_compute``) understate what a bucket costs inside a training step: DDP launches it
from an autograd hook, the backend runs it on its own threads while the backward thread hands
over, and the step waits for it in DDP's finalisation. On gloo over a CPU that path costs about
twice the bare op (docs/projection.md). So each size is measured here as a one-bucket DDP model:
a backward pass of ``BACKWARD_MS`` whose last gradient is the whole bucket, and DDP's own
per-iteration ``backward_comm_time`` is the time (the same figure the training cells report).
"""

from __future__ import annotations

import statistics
import time
from typing import List, Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

BACKWARD_MS = 10.0
"""Host time of each iteration's forward and backward: the ranks' threads go idle and the compute
takes the caches and cores before the bucket is all-reduced, as in a training step."""
WIDTH = 256  # of the square matrices the forward multiplies through


class OneBucketModel(torch.nn.Module):
    """One parameter of ``numel`` elements, the whole bucket. It enters the forward first, so
    backward produces its gradient last, after the matrix products: the bucket becomes ready
    when backward compute ends, as a model's last bucket does."""

    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.bucket = torch.nn.Parameter(torch.zeros(numel, dtype=dtype, device=device))
        # Not a parameter: its gradient would join the bucket and change its size.
        self.register_buffer("matrix", torch.rand(WIDTH, WIDTH, device=device) / WIDTH)

    def forward(self, x: torch.Tensor, layers: int) -> torch.Tensor:
        y = x * (1.0 + self.bucket.sum().float() * 0.0)
        matrix: torch.Tensor = self.matrix  # type: ignore[assignment]
        for _ in range(layers):
            y = torch.tanh(y @ matrix)
        return y.sum()


def _layers_for(
    model: DistributedDataParallel, x: torch.Tensor, group: Optional[dist.ProcessGroup]
) -> int:
    """Matrix products per forward for about ``BACKWARD_MS`` of forward and backward, the same
    on every rank of ``group`` (the fewest any rank asked for)."""
    probe = 8
    with model.no_sync():
        model(x, probe).backward()  # warms the kernels
        start = time.perf_counter()
        model(x, probe).backward()
        seconds = time.perf_counter() - start
    wanted = torch.tensor([max(1, int(BACKWARD_MS / 1e3 / max(seconds / probe, 1e-9)))])
    dist.all_reduce(wanted, op=dist.ReduceOp.MIN, group=group)
    return int(wanted.item())


def time_through_ddp(
    numel: int,
    dtype: torch.dtype,
    device: torch.device,
    group: Optional[dist.ProcessGroup],
    warmup: int,
    iterations: int,
) -> Optional[float]:
    """Median microseconds of DDP's ``backward_comm_time`` for one bucket of ``numel`` elements,
    ranks lined up before each iteration (a late rank's wait is the projection's noise term, not
    the fabric's). None where DDP's runtime logging is not available (a private API) or the dtype
    cannot be a gradient."""
    if not dtype.is_floating_point:
        return None
    module = OneBucketModel(numel, dtype, device)
    cap_mb = numel * module.bucket.element_size() / 2**20 + 1.0  # the whole parameter, one bucket
    device_ids = [device.index] if device.type == "cuda" else None
    model = DistributedDataParallel(
        module, device_ids=device_ids, process_group=group, bucket_cap_mb=cap_mb
    )
    try:
        model._set_ddp_runtime_logging_sample_rate(1)
    except AttributeError:
        return None
    x = torch.randn(64, WIDTH, device=device)
    layers = _layers_for(model, x, group)
    samples: List[float] = []
    for index in range(warmup + iterations + 1):
        dist.barrier(group=group)
        model(x, layers).backward()
        if index <= warmup:  # the logging data read after step k describes step k-1
            continue
        value = model._get_ddp_logging_data().get("backward_comm_time")
        if isinstance(value, int) and value > 0:
            samples.append(value / 1e3)  # ns -> us
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    del model, module
    return statistics.median(samples) if samples else None
