"""Capture traces around the benchmark worker (nsys or torch.profiler). Not built yet: the
benchmark engine it wraps is being written; ``torchscale profile analyze`` works on traces
captured by hand meanwhile."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from torchscale.errors import TorchscaleError

TOOLS = ("auto", "nsys", "torch")


class CaptureNotBuiltError(TorchscaleError):
    """Capture is not implemented yet (a planned feature, not a user mistake)."""

    exit_code = 1


def run_capture(
    *,
    gpus: int,
    duration_s: float,
    target: str,
    tool: str,
    output_dir: Path,
    config: Optional[Path] = None,
    model: Optional[str] = None,
    batch_size: Optional[int] = None,
) -> Path:
    """Profile a DDP run and return the folder holding one trace per rank."""
    raise CaptureNotBuiltError(
        "profile capture is not built yet; capture traces with torch.profiler or nsys yourself "
        "and run 'torchscale profile analyze DIR'"
    )
