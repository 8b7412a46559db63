"""The ``script:`` section of a benchmark YAML and the settings of one script cell.

A script cell runs a user's own training script, unmodified, on one GPU count. What torchscale
sets is only what the section says: DDP constructor arguments under ``ddp:`` (each unset one is
the script's own), and process-level settings (threads, cuDNN autotuning, communication
environment). The measured window is the config's top-level ``warmup_steps``,
``measure_steps``/``measure_seconds`` and ``sync_probe_steps``. No torch here (config errors are
reported without it).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Dict, List, Literal, Optional, Tuple

from pydantic import (
    BeforeValidator,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)
from typing_extensions import Annotated

from torchscale.config.base import StrictModel
from torchscale.config.kind_sections import ConfigSection
from torchscale.config.settings import Strategy
from torchscale.plan.kind_base import LaunchSettings

ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_", "UCC_", "TORCH_UCC_", "TORCH_DISTRIBUTED_")
"""Environment variables ``script.env`` may set: the communication libraries' own."""
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")

StepAt = Literal["optimizer", "forward"]


def _text(value: Any) -> Any:
    """``NCCL_BUFFSIZE: 4194304`` in YAML is a number; the environment holds text."""
    if isinstance(value, dict):
        return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}
    return value


class ScriptDDPSettings(StrictModel):
    """DDP constructor arguments applied to the script's own DDP; unset: what the script passes."""

    bucket_cap_mb: Optional[PositiveFloat] = Field(None, description="Gradient bucket size in MiB.")
    gradient_as_bucket_view: Optional[bool] = Field(
        None, description="Gradients alias bucket memory."
    )
    static_graph: Optional[bool] = Field(None, description="Tell DDP the graph never changes.")
    broadcast_buffers: Optional[bool] = Field(None, description="Broadcast buffers every forward.")

    def overrides(self) -> Dict[str, Any]:
        """The arguments set here (the others stay the script's)."""
        return {name: value for name, value in self.model_dump().items() if value is not None}


class ScriptProcessSettings(StrictModel):
    """What the script's processes run with, set before the script starts."""

    samples_per_step: Optional[PositiveInt] = Field(
        None,
        description="Samples one rank trains on per step; default: counted from the batch "
        "dimension of the first tensor the DDP model's forward takes (needed without DDP).",
    )
    step_at: StepAt = Field(
        "optimizer",
        description="What ends a step: optimizer (each torch.optim optimizer step) or forward "
        "(each DDP forward, for a script that updates its weights without torch.optim).",
    )
    ddp: ScriptDDPSettings = Field(default_factory=ScriptDDPSettings)
    threads: Optional[PositiveInt] = Field(
        None, description="torch.set_num_threads in every rank (default: torchrun's)."
    )
    cudnn_benchmark: Optional[bool] = Field(
        None, description="torch.backends.cudnn.benchmark (CUDA; default: the script's)."
    )
    env: Annotated[Dict[str, str], BeforeValidator(_text)] = Field(
        default_factory=dict,
        description="Communication environment for the ranks: NCCL_*, TORCH_NCCL_*, GLOO_*, "
        "UCC_* or TORCH_DISTRIBUTED_* variables.",
    )

    @field_validator("env")
    @classmethod
    def _communication_only(cls, env: Dict[str, str]) -> Dict[str, str]:
        for name in env:
            if not _ENV_NAME.fullmatch(name) or not name.startswith(ENV_PREFIXES):
                raise ValueError(
                    f"{name!r} is not a communication variable: script.env sets "
                    f"{', '.join(p + '*' for p in ENV_PREFIXES)} only"
                )
        return env


class _ScriptPath(StrictModel):
    path: str = Field(
        min_length=1,
        description="The training script, relative to the directory torchscale runs in (also "
        "the script's working directory).",
    )
    args: List[str] = Field(default_factory=list, description="The script's own arguments.")
    gpu_counts: Optional[Annotated[List[PositiveInt], Field(min_length=1)]] = Field(
        None, description="Ranks per cell (default: the config's gpu_counts)."
    )

    @field_validator("args", mode="before")
    @classmethod
    def _args_text(cls, value: Any) -> Any:
        """``args: [--steps, 100]``: YAML reads 100 as a number; a command line holds text."""
        if isinstance(value, list):
            return [v if isinstance(v, str) else str(v) for v in value]
        return value


class ScriptSection(ScriptProcessSettings, _ScriptPath):
    """``script:`` in the benchmark YAML: a training script that joins the matrix like a model
    (its path, arguments and GPU counts first, then its process settings)."""


SECTION = ConfigSection(
    "script",
    ScriptSection,
    "A training script of your own, run unmodified on each GPU count (section; docs/own-job.md).",
    notes={
        "": "not swept: one cell per GPU count, repeat and the config's strategy; see "
        "docs/own-job.md"
    },
)
"""The ``script:`` section, registered by the kind (``script.script_kind``)."""


class ScriptCellSettings(ScriptProcessSettings, LaunchSettings):
    """Everything one script cell (one torchrun launch) runs with: the rank entry's input."""

    script: str = Field(min_length=1, description="The script's path, as given.")
    args: List[str] = Field(default_factory=list)
    warmup_steps: NonNegativeInt = 10
    measure_steps: Optional[PositiveInt] = None
    measure_seconds: Optional[PositiveFloat] = None
    sync_probe_steps: NonNegativeInt = 10
    stall_timeout_s: Optional[PositiveFloat] = 600.0
    backend: Literal["auto"] = Field(
        "auto", description="The script joins its own process group (its own backend)."
    )
    strategy: Strategy = Field(
        "ddp",
        description="The config's strategy: what the script's DDP(model, ...) call applies "
        "instead (docs/strategies.md, 'A script under a strategy').",
    )
    reshard_after_forward: bool = Field(
        True, description="fsdp2, fsdp2_hybrid: the config's reshard_after_forward."
    )

    UNTUNED: ClassVar[Tuple[str, ...]] = ("strategy", "reshard_after_forward")
    """Not tune's knobs for a script: its best settings are written as its DDP call's arguments
    (a strategy is compared by the config's strategy list instead)."""

    @model_validator(mode="after")
    def _one_window(self) -> ScriptCellSettings:
        if self.measure_steps is not None and self.measure_seconds is not None:
            raise ValueError("give measure_steps or measure_seconds, not both")
        if self.measure_steps is None and self.measure_seconds is None:
            self.measure_steps = 50
        return self

    def ddp_overrides(self) -> Dict[str, Any]:
        return self.ddp.overrides()
