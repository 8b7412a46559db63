"""DDP gradient communication hooks (``ddp.comm_hook``): fp16/bf16 compression and PowerSGD.

PowerSGD on gloo needs one thing torch's hook does not do itself. ``powerSGD_hook`` issues its
second and third all-reduces (the P and Q factors) from future callbacks, and gloo runs those
callbacks on its own threads as each all-reduce completes. With several buckets, one rank may
then issue bucket k's P all-reduce before bucket k+1's first all-reduce while its peer does the
opposite: the collectives no longer match and gloo aborts the process ("op.preamble.length <=
op.nbytes ... Received data size doesn't match expected size"). Seen with torch 2.15 on every
run with ``bucket_cap_mb: 1``; the race is in every version, only its odds change. NCCL runs the
callbacks in issue order, so only gloo is ordered here: each bucket's PowerSGD chain waits for the
previous bucket's chain, which costs some overlap of communication with backward on CPU runs
and changes nothing in the arithmetic.
"""

# No `from __future__ import annotations`: DDP compares the hook's annotations with the real types.
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from torchscale.config.settings import DDPSettings

# Passed to PowerSGDState: full-precision all-reduce for the first steps, then compression.
POWERSGD_START_ITER = 2


@dataclass
class OrderedPowerSGDState:
    """PowerSGD's own state, plus the previous bucket's future that the next bucket waits for."""

    powersgd: Any  # torch's PowerSGDState
    pending: Optional[torch.futures.Future[torch.Tensor]] = None

    # DDP's logging and PowerSGD's helpers read these from the hook state.
    @property
    def process_group(self) -> Any:
        return self.powersgd.process_group


def ordered_powerSGD_hook(
    state: OrderedPowerSGDState,
    bucket: dist.GradBucket,  # type: ignore[name-defined]  # torch's stubs do not export it
) -> torch.futures.Future[torch.Tensor]:
    """torch's ``powerSGD_hook``, with each bucket's collectives issued after the previous one's."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    if state.pending is not None:
        state.pending.wait()
    future = powerSGD_hook.powerSGD_hook(state.powersgd, bucket)
    state.pending = future
    return future


def register_comm_hook(ddp: DDP, settings: DDPSettings) -> Optional[Any]:
    """Install ``settings.comm_hook``; returns hook state that must stay alive (PowerSGD)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if settings.comm_hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif settings.comm_hook == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif settings.comm_hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=settings.powersgd_rank,
            start_powerSGD_iter=POWERSGD_START_ITER,
        )
        if dist.get_backend() == "gloo":
            ordered = OrderedPowerSGDState(state)
            ddp.register_comm_hook(ordered, ordered_powerSGD_hook)
            return ordered
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return state
    return None
