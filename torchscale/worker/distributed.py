"""Process-group setup for one rank: NCCL on GPUs, gloo on CPU processes."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from torchscale.hardware.environment import threads_per_cpu_slot


@dataclass(frozen=True)
class RankContext:
    """Who this process is in the job, and on what device it runs."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    backend: str
    host: str

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def device_name(self) -> str:
        if self.is_cuda:
            return torch.cuda.get_device_name(self.device)
        return "cpu"


PROCESS_GROUP_TIMEOUT_CAP_S = 600.0  # NCCL's own default


def process_group_timeout_s(cell_timeout_s: float) -> float:
    """A collective may hang at most half the cell's budget (10 min at most): NCCL's watchdog
    then fails it, names it and dumps the flight recorder while the launcher still waits.
    With the cell's own timeout the launcher always killed the ranks first, and said nothing."""
    return min(cell_timeout_s / 2.0, PROCESS_GROUP_TIMEOUT_CAP_S)


def init_distributed(cell_timeout_s: float) -> RankContext:
    """Join the process group torchrun set up through the environment."""
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ["WORLD_SIZE"])
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if torch.cuda.is_available() and torch.cuda.device_count() > local_rank:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
        torch.set_num_threads(threads_per_cpu_slot())
    dist.init_process_group(
        backend,
        timeout=timedelta(seconds=process_group_timeout_s(cell_timeout_s)),
        device_id=device if device.type == "cuda" else None,
    )
    return RankContext(
        rank, local_rank, world_size, local_world_size, device, backend, socket.gethostname()
    )


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
