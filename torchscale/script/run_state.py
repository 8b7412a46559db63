"""Where a script cell's rank is (stage, steps, the DDP model and optimizer it follows), and the
reasons a script cannot be measured, each found at the first point it is known."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Set, Tuple

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from torchscale.runtime.process_group import RankContext
from torchscale.script.script_config import ScriptCellSettings

STAGES = (
    "warmup", "calibrate", "measure", "measured", "logging", "nosync_warm", "nosync", "gather",
    "profile", "profiled", "end",
)  # fmt: skip
SAMPLES_HINT = "pass --samples-per-step N (script.samples_per_step: the samples one rank trains on)"


class NotMeasurable(BaseException):
    """Why the script cannot be measured as it runs (the message says why and what to do).
    Raised in the script's process, it ends the script on every rank: the cell is a recorded
    failure, not a hang. A BaseException, so that a script's ``except Exception`` that logs and
    goes on does not swallow it."""


@dataclass
class RunState:
    settings: ScriptCellSettings
    stage: str = "warmup"
    steps: int = 0  # steps ended so far
    forwards: int = 0  # DDP forwards with gradients, so far
    stage_steps: int = 0  # steps ended in this stage
    in_step: bool = False
    finished: bool = False  # nothing left to do: the hooks only pass through
    ddp: Optional[DDP] = None
    applied: Dict[str, Any] = field(default_factory=dict)
    optimizer: Optional[torch.optim.Optimizer] = None
    last_samples: int = 0  # samples of the last step ended
    _ddp_params: Set[int] = field(default_factory=set)

    def enter(self, stage: str) -> None:
        assert stage in STAGES, stage
        self.stage, self.stage_steps = stage, 0

    def tracks(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer``'s steps are the script's steps: the first optimizer to step
        the DDP model's parameters (without DDP: the first to step)."""
        if self.optimizer is not None:
            return optimizer is self.optimizer
        if self.ddp is not None:
            if not self._ddp_params:
                self._ddp_params = {id(p) for p in self.ddp.module.parameters()}
            params = (p for group in optimizer.param_groups for p in group["params"])
            if not any(id(p) in self._ddp_params for p in params):
                return False
        self.optimizer = optimizer
        return True

    def check_measurable(self) -> None:
        """At the end of the warm-up: samples can be counted."""
        if self.settings.samples_per_step:
            return
        if self.ddp is None:
            raise NotMeasurable(
                "the script built no DistributedDataParallel model, so torchscale cannot count "
                f"its samples: {SAMPLES_HINT}; FSDP, pipeline and tensor-parallel scripts are "
                "measured that way, as steps and samples (docs/own-job.md)"
            )
        if self.last_samples <= 0:
            raise NotMeasurable(
                "the DDP model's forward took no tensor with a batch dimension, so torchscale "
                f"cannot count samples: {SAMPLES_HINT}"
            )

    def probe_unsafe(self) -> Optional[str]:
        """Why the sync probe is not run on this script, or None (it is safe: the script is
        ended after the windows, so the probe's unsynchronised steps are never seen)."""
        if self.settings.sync_probe_steps == 0:
            return "sync_probe_steps is 0"
        if self.ddp is None:
            return "the script has no DDP model, so there is no gradient sync to switch off"
        return None

    def windows_needed(self) -> str:
        s = self.settings
        parts = [f"warm-up {max(s.warmup_steps, 1)}"]
        parts.append(f"measured {s.measure_steps}" if s.measure_steps else "measured (timed)")
        if s.sync_probe_steps and self.ddp is not None:
            parts.append(f"sync probe {2 * s.sync_probe_steps + 2}")
        return " + ".join(parts) + " steps"

    def ended_early_reason(self) -> str:
        hint = "give it more steps with its own arguments, or measure fewer (--steps, or the "
        hint += "config's warmup_steps, measure_steps and sync_probe_steps)"
        if self.steps == 0 and self.ddp is None:
            return (
                "the script ended without building a DistributedDataParallel model or stepping a "
                "torch.optim optimizer: torchscale measures DDP training scripts (docs/own-job.md)"
            )
        if self.steps == 0 and self.forwards > 0 and self.settings.step_at == "optimizer":
            return (
                "the script built DDP but never stepped a torch.optim optimizer on its "
                "parameters: to mark steps at DDP forwards instead, pass --step-at forward "
                "(script.step_at: forward)"
            )
        return (
            f"the script ended after {self.steps} step(s), in the {self.stage} window, before "
            f"torchscale's windows ended ({self.windows_needed()}): {hint}"
        )


def first_batch_size(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> int:
    """The batch dimension of the first tensor a forward takes (0 when it takes none)."""
    stack = [*args, *kwargs.values()]
    while stack:
        item = stack.pop(0)
        if torch.is_tensor(item):
            return int(item.shape[0]) if item.dim() > 0 else 0
        if isinstance(item, (list, tuple)):
            stack[:0] = list(item)
        elif isinstance(item, dict):
            stack[:0] = list(item.values())
    return 0


def rank_context(model: Optional[nn.Module]) -> RankContext:
    """Who this rank is, from the process group the script joined; its device is the (DDP)
    model's (else this process's current CUDA device under NCCL, else the CPU)."""
    if not dist.is_available() or not dist.is_initialized():
        raise NotMeasurable(
            "the script steps an optimizer but never joined a process group "
            "(torch.distributed.init_process_group): torchscale measures distributed scripts"
        )
    backend = str(dist.get_backend())
    param = next(model.parameters(), None) if model is not None else None
    if param is not None:
        device = param.device
    elif backend == "nccl" and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    return RankContext(
        rank=dist.get_rank(),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        world_size=dist.get_world_size(),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        device=device,
        backend=backend,
        host=socket.gethostname(),
    )
