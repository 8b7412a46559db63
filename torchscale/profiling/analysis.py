"""``analyze(paths)``: read the traces, run every analysis, apply the findings rules."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import pandas as pd

from torchscale.analysis.finding import Finding
from torchscale.profiling.analyzers.steps import overlapping_steps
from torchscale.profiling.analyzers.trace_collectives import collective_tables
from torchscale.profiling.finding_rules import find_bottlenecks
from torchscale.profiling.trace_tables import compute_tables
from torchscale.profiling.traces import RankTrace, load_traces
from torchscale.profiling.traces.memory_budget import TraceMemoryError


@dataclass
class ProfileAnalysis:
    traces: List[RankTrace]
    tables: Dict[str, pd.DataFrame]  # trace_tables.TRACE_TABLES, by name
    findings: List[Finding]
    target: str
    warnings: List[str] = field(default_factory=list)  # e.g. traces of another job left out

    @property
    def sync_stall_pct(self) -> float:
        """Mean over ranks of the share of step time spent waiting in collectives."""
        values = self.tables["ranks"]["sync_stall_pct"].to_numpy(dtype=float)
        return float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")


def analyze(
    paths: Sequence[Path],
    target: str = "all",
    workers: Optional[int] = None,
    max_memory: Optional[int] = None,
) -> ProfileAnalysis:
    """``max_memory``: the budget in bytes (default: what the machine has available); the
    analysis is refused with one line before it would pass it (``traces.memory_budget``)."""
    try:
        return _analyze(paths, target, workers, max_memory)
    except MemoryError:  # the projection missed (another process took the memory meanwhile)
        raise TraceMemoryError(
            "the trace analysis ran out of memory; set --max-memory below what this machine "
            "has free, or analyse fewer ranks or a shorter capture"
        ) from None


def _analyze(
    paths: Sequence[Path], target: str, workers: Optional[int], max_memory: Optional[int]
) -> ProfileAnalysis:
    warnings: List[str] = []
    traces = load_traces(paths, workers, warnings, max_memory)
    tables, computed = compute_tables(traces)
    overlaps = overlapping_steps(tables["steps"])
    for trace in traces:
        count = overlaps.get(trace.rank, 0)
        trace.metadata["overlapping_steps"] = count
        if count:
            warnings.append(
                f"rank {trace.rank} ({trace.path.name}): {count} profiler step(s) start before "
                "the step before them ended: their shared time counts twice in the step and "
                "sync-stall figures (an edited trace, or two profilers at once?)"
            )
    findings = find_bottlenecks(
        tables["ranks"], computed.once(collective_tables)["instances"], target
    )
    return ProfileAnalysis(traces, tables, findings, target, warnings)


def _clean(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return None if not np.isfinite(value) else round(float(value), 3)
    return value


JSON_RANK_KEYS = [
    "rank",
    "source",
    "rank_source",
    "device",
    "idle_pct",
    "compute_pct",
    "non_compute_pct",
    "overlap_pct",
    "sync_stall_pct",
    "exposed_comm_us",
    "kernel_time_us",
    "steps",
    "step_mean_us",
    "times_last",
    "last_share",
    "wait_us",
    "dataloader_pct",
    "memory_pct",
]


def to_document(result: ProfileAnalysis) -> Dict[str, object]:
    """The ``--json`` document (also the body of findings.json)."""
    ranks = [
        {k: _clean(row.get(k)) for k in JSON_RANK_KEYS}
        for row in result.tables["ranks"].to_dict("records")
    ]
    return {
        "target": result.target,
        "sync_stall_pct": _clean(result.sync_stall_pct),
        "ranks": ranks,
        "findings": [f.to_dict() for f in result.findings],
        "traces": [
            {
                "rank": t.rank,
                "rank_source": t.metadata.get("rank_source"),
                "source": t.source,
                "path": str(t.path),
                "device": t.metadata.get("device"),
                "pid": t.metadata.get("pid"),
                "events": t.event_count,
                "invalid_events": dict(t.invalid),
                "overlapping_steps": t.metadata.get("overlapping_steps", 0),
            }
            for t in result.traces
        ],
        "warnings": list(result.warnings),
    }
