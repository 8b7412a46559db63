"""The per-rank analyses beyond the breakdown, each a table (issue 28): idle time, kernels,
launches, memory, critical path and pace. Each comes from a function of the traces in
``analyzers/`` (HTA's style: data here, plotting elsewhere); this module runs them in order."""

from __future__ import annotations

from typing import Dict, List

import pandas as pd

from torchscale.profiling.analyzers.critical_path import critical_path
from torchscale.profiling.analyzers.idle_time import idle_time_breakdown
from torchscale.profiling.analyzers.kernel_stats import (
    kernel_distribution,
    kernel_type_breakdown,
    top_kernels,
)
from torchscale.profiling.analyzers.launches import launch_stats, queue_tables
from torchscale.profiling.analyzers.memory_timeline import memory_summary, memory_timeline
from torchscale.profiling.analyzers.pace import step_pace
from torchscale.profiling.traces.model import RankTrace

DETAIL_TABLES = (
    "idle_time", "kernel_types", "kernel_distribution", "top_kernels", "launch_stats",
    "queue_length", "queue_timeline", "memory", "memory_timeline", "critical_path", "pace",
)  # fmt: skip


def detail_tables(traces: List[RankTrace]) -> Dict[str, pd.DataFrame]:
    """Every table of ``DETAIL_TABLES``, for the same traces."""
    critical = critical_path(traces)
    queue_length, queue_timeline = queue_tables(traces)
    return {
        "idle_time": idle_time_breakdown(traces),
        "kernel_types": kernel_type_breakdown(traces),
        "kernel_distribution": kernel_distribution(traces),
        "top_kernels": top_kernels(traces),
        "launch_stats": launch_stats(traces),
        "queue_length": queue_length,
        "queue_timeline": queue_timeline,
        "memory": memory_summary(traces),
        "memory_timeline": memory_timeline(traces),
        "critical_path": critical,
        "pace": step_pace(traces, critical),
    }
