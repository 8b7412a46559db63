"""A cell's GPU utilisation and GPU memory utilisation (%), from its ranks' NVML summaries.

GPU utilisation is NVML's ``utilization.gpu`` (the share of time a kernel ran) averaged over the
measured window, then over the ranks. GPU memory utilisation is the most memory in use on the GPU
during the window (NVML, as ``nvidia-smi`` shows it) over the GPU's total memory, the highest rank
of the cell. Both are None where NVML was not read: CPU processes, shown as "–".
"""

from __future__ import annotations

from typing import List, Optional

from torchscale.results.schema import GpuTelemetry, TrainingResult


def gpu_memory_util_pct(gpu: Optional[GpuTelemetry]) -> Optional[float]:
    """One GPU's highest memory in use over its total memory, in percent."""
    if gpu is None or not gpu.memory_total_bytes or gpu.memory_used_bytes_max is None:
        return None
    return 100.0 * gpu.memory_used_bytes_max / gpu.memory_total_bytes


def cell_gpu_util_pct(record: TrainingResult) -> Optional[float]:
    """Mean GPU utilisation over the cell's ranks."""
    found: List[float] = [
        rank.gpu.util_pct_mean
        for rank in record.per_rank
        if rank.gpu is not None and rank.gpu.util_pct_mean is not None
    ]
    return sum(found) / len(found) if found else None


def cell_gpu_memory_util_pct(record: TrainingResult) -> Optional[float]:
    """The highest GPU memory utilisation among the cell's ranks."""
    found = [pct for rank in record.per_rank if (pct := gpu_memory_util_pct(rank.gpu)) is not None]
    return max(found) if found else None
