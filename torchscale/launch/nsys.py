"""Nsight Systems around a cell: the per-rank ``nsys profile`` wrapper and the SQLite export.

torchrun starts each worker as ``nsys profile ... python -m torchscale.worker`` (``--no-python``),
so every rank gets its own report, named with the ``RANK`` torchrun sets (``rank%q{RANK}``).
Capture is limited to the profiled window (``--capture-range=cudaProfilerApi``: the worker calls
cudaProfilerStart/Stop around it).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import List

from torchscale.errors import ConfigError

EXPORT_TIMEOUT_S = 600.0
TRACES = {
    "sync_stalls": "cuda,nvtx,osrt",
    "communication": "cuda,nvtx,osrt",
    "compute": "cuda,nvtx,osrt,cublas,cudnn",
    "memory": "cuda,nvtx,osrt",
    "all": "cuda,nvtx,osrt,cublas,cudnn",
}


def resolve_tool(tool: str, device_kind: str) -> str:
    """``auto`` -> nsys when it is on PATH and there are GPUs to trace, else torch.profiler."""
    has_nsys = shutil.which("nsys") is not None
    if tool == "auto":
        return "nsys" if has_nsys and device_kind == "cuda" else "torch"
    if tool == "nsys" and not has_nsys:
        raise ConfigError(
            "profiling tool nsys is not on PATH: install NVIDIA Nsight Systems or use tool torch"
        )
    if tool == "nsys" and device_kind != "cuda":
        raise ConfigError("profiling tool nsys needs GPUs; this node has none: use tool torch")
    return tool


def wrapper(profile_dir: Path, target: str) -> List[str]:
    """The ``nsys profile`` prefix for one worker."""
    args = [
        "nsys", "profile",
        f"--trace={TRACES.get(target, TRACES['all'])}",
        "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
        "--sample=none", "--cpuctxsw=none", "--force-overwrite=true",
        f"--output={profile_dir / 'rank%q{RANK}'}",
    ]  # fmt: skip
    if target in ("memory", "all"):
        args.insert(3, "--cuda-memory-usage=true")
    return args


def export_sqlite(profile_dir: Path) -> List[Path]:
    """``nsys export --type sqlite`` every rank's report; returns the SQLite files."""
    exported = []
    for report in sorted(profile_dir.glob("rank*.nsys-rep")):
        target = report.with_suffix(".sqlite")
        subprocess.run(
            ["nsys", "export", "--type", "sqlite", "--force-overwrite", "true",
             "--output", str(target), str(report)],
            check=True, capture_output=True, timeout=EXPORT_TIMEOUT_S,
        )  # fmt: skip
        exported.append(target)
    return exported
