"""What a cell is asked to trace after its measured window (no torch: used at plan time)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional

from torchscale.config.settings import ProfilingSettings

# The NVTX mark each rank's process emits in its nsys window, so that an export holding several
# ranks (``nsys profile torchrun ...``) says which process is which rank (read by nsys_ranks).
RANK_MARK_FORMAT = "torchscale rank={rank} world_size={world_size}"


@dataclass(frozen=True)
class ProfileRequest:
    """What the orchestrator asks a cell to trace (``profiling:`` or ``torchscale profile``)."""

    tool: str  # "torch" or "nsys" (resolved from "auto" before launch)
    target: str = "sync_stalls"
    steps: int = 10
    seconds: Optional[float] = None  # profile for this long instead of ``steps``
    trigger: str = "always"  # or "sync_stall_detection"
    sync_stall_threshold: float = 0.10
    variance_threshold: float = 0.25

    @classmethod
    def from_json(cls, data: Optional[Dict[str, Any]]) -> Optional[ProfileRequest]:
        return cls(**data) if data else None

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_settings(cls, settings: ProfilingSettings, tool: str) -> ProfileRequest:
        """From the config's ``profiling:`` section, ``tool`` already resolved from ``auto``."""
        return cls(
            tool=tool,
            target=settings.target,
            steps=settings.steps,
            seconds=settings.duration_s,
            trigger=settings.trigger,
            sync_stall_threshold=settings.sync_stall_threshold,
            variance_threshold=settings.variance_threshold,
        )
