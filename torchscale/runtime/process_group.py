"""Process-group setup for one rank: NCCL on GPUs, gloo on CPU processes."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from torchscale.hardware.environment import threads_per_cpu_slot
from torchscale.launch.backends import backend_env, process_group_backend, resolve_backend
from torchscale.launch.flight_recorder import process_group_timeout_s


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


def init_distributed(cell_timeout_s: float, backend: str = "auto") -> RankContext:
    """Join the process group torchrun (or mpirun) set up through the environment.

    ``backend`` auto: NCCL on a GPU, gloo on a CPU process; else the one named (``ucc/tl/<tl>``:
    UCC with that transport layer, ``launch.backends.backend_env``). The group's
    timeout is shorter than the cell's, so a hung collective is reported by the backend (and
    its flight recorder) before the launcher kills the cell.
    """
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ["WORLD_SIZE"])
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if torch.cuda.is_available() and torch.cuda.device_count() > local_rank:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(threads_per_cpu_slot())
    backend = resolve_backend(backend, device.type == "cuda")
    os.environ.update(backend_env(backend))  # UCC reads its transport selection at init
    dist.init_process_group(
        process_group_backend(backend),
        timeout=timedelta(seconds=process_group_timeout_s(cell_timeout_s)),
        device_id=device if backend == "nccl" else None,
    )
    return RankContext(
        rank, local_rank, world_size, local_world_size, device, backend, socket.gethostname()
    )


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
