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
from typing import List, Optional

from torchscale.results.layout import NSYS_EXPORT_SUFFIX, NSYS_REPORT_GLOB

EXPORT_TIMEOUT_S = 600.0
TRACES = {
    "sync_stalls": "cuda,nvtx,osrt",
    "communication": "cuda,nvtx,osrt",
    "compute": "cuda,nvtx,osrt,cublas,cudnn",
    "memory": "cuda,nvtx,osrt",
    "all": "cuda,nvtx,osrt,cublas,cudnn",
}


def nsys_unavailable(device_kind: str) -> Optional[str]:
    """Why nsys cannot trace on this node (None when it can)."""
    if shutil.which("nsys") is None:
        return "nsys is not on PATH"
    if device_kind != "cuda":
        return "this node has no GPUs for nsys to trace"
    return None


def resolve_tool(tool: str, device_kind: str) -> str:
    """``auto`` -> nsys when it is on PATH and there are GPUs to trace, else torch.profiler;
    ``nsys`` where it cannot run -> torch.profiler too (:func:`tool_warning` says so)."""
    if tool in ("auto", "nsys"):
        return "torch" if nsys_unavailable(device_kind) else "nsys"
    return tool


def tool_warning(tool: str, device_kind: str, option: str = "profiling.tool") -> Optional[str]:
    """The one line to show when ``nsys`` was asked for and torch.profiler runs instead."""
    reason = nsys_unavailable(device_kind) if tool == "nsys" else None
    if reason is None:
        return None
    return (
        f"{option} is nsys but {reason}: profiling with torch.profiler instead "
        "(install NVIDIA Nsight Systems on a GPU node for nsys traces)"
    )


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
    for report in sorted(profile_dir.glob(NSYS_REPORT_GLOB)):
        target = report.with_suffix(NSYS_EXPORT_SUFFIX)
        subprocess.run(
            ["nsys", "export", "--type", "sqlite", "--force-overwrite", "true",
             "--output", str(target), str(report)],
            check=True, capture_output=True, timeout=EXPORT_TIMEOUT_S,
        )  # fmt: skip
        exported.append(target)
    return exported
