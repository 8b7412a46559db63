"""Temporal breakdown and communication/computation overlap, with HTA's exact definitions.

HTA (``BreakdownAnalysis.get_temporal_breakdown``, ``CommunicationAnalysis.get_comm_comp_overlap``):

* kernel_time = end of the last GPU event - start of the first (all rows with a stream);
* idle_time = kernel_time - time covered by at least one GPU event;
* compute_time = time covered by computation kernels (merged);
* non_compute_time = kernel_time - compute_time - idle_time;
* overlap % = time covered by both communication and computation kernels / time covered by
  communication kernels.

We add exposed communication (communication time not hidden under computation).
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np
import pandas as pd

from torchscale.profiling.analyzers import intervals
from torchscale.profiling.analyzers.kernels import COMMUNICATION, COMPUTE, class_mask
from torchscale.profiling.traces.model import RankTrace

BREAKDOWN_COLUMNS = [
    "rank",
    "idle_time_us",
    "compute_time_us",
    "non_compute_time_us",
    "kernel_time_us",
    "idle_pct",
    "compute_pct",
    "non_compute_pct",
    "comm_time_us",
    "overlap_time_us",
    "overlap_pct",
    "exposed_comm_us",
]


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 2) if whole else float("nan")


def last_end(ts: np.ndarray, dur: np.ndarray) -> float:
    """The latest end of the intervals, a chunk at a time (no array of ends)."""
    step = intervals.CHUNK_ROWS
    return max(float((ts[i : i + step] + dur[i : i + step]).max()) for i in range(0, len(ts), step))


def rank_breakdown(trace: RankTrace) -> Dict[str, float]:
    gpu = trace.gpu_events()
    ts, dur = gpu["ts"].to_numpy(), gpu["dur"].to_numpy()
    nan = float("nan")
    if not len(ts):
        return dict.fromkeys(BREAKDOWN_COLUMNS, nan) | {"rank": trace.rank}
    # Lengths of unions only, never the merged intervals themselves: the analysis of a large
    # trace then needs a few arrays of its kernels' length (memory_budget counts on it).
    kernel_time = last_end(ts, dur) - float(ts.min())
    idle = kernel_time - intervals.union_length(ts, durations=dur)
    is_comp = class_mask(gpu["name"], COMPUTE)
    is_comm = class_mask(gpu["name"], COMMUNICATION)
    compute_time = intervals.union_length(ts, None, is_comp, durations=dur)
    comm_time = intervals.union_length(ts, None, is_comm, durations=dur)
    either = intervals.union_length(ts, None, is_comp | is_comm, durations=dur)
    overlap = max(0.0, compute_time + comm_time - either)  # inclusion-exclusion
    return {
        "rank": trace.rank,
        "idle_time_us": idle,
        "compute_time_us": compute_time,
        "non_compute_time_us": kernel_time - compute_time - idle,
        "kernel_time_us": kernel_time,
        "idle_pct": _pct(idle, kernel_time),
        "compute_pct": _pct(compute_time, kernel_time),
        "non_compute_pct": _pct(kernel_time - compute_time - idle, kernel_time),
        "comm_time_us": comm_time,
        "overlap_time_us": overlap,
        "overlap_pct": _pct(overlap, comm_time),
        "exposed_comm_us": comm_time - overlap,
    }


def temporal_breakdown(traces: List[RankTrace]) -> pd.DataFrame:
    """One row per rank: HTA's temporal breakdown plus overlap and exposed communication."""
    return pd.DataFrame([rank_breakdown(t) for t in traces], columns=BREAKDOWN_COLUMNS)


__all__ = ["BREAKDOWN_COLUMNS", "rank_breakdown", "temporal_breakdown"]
