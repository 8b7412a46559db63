"""The one in-memory shape of a rank's trace, whatever file it came from.

Every reader produces a compact events table with these columns (times in microseconds, like
Kineto and HTA):

========== ========= =============================================================================
column     dtype     meaning
========== ========= =============================================================================
ts         float64   start time (us)
dur        float64   duration (us)
cat        category  Kineto category: kernel, gpu_memcpy, gpu_memset, cuda_runtime, cpu_op,
                     user_annotation, ... (nsys rows are mapped onto the same names)
name       category  kernel / operator / range name (interned once per distinct string)
pid, tid   int64     process and thread; for GPU rows Kineto uses the device and the stream
stream     int64     CUDA stream, -1 for CPU rows
correlation int64    CUDA correlation id linking a launch (CPU) and its kernel (GPU), -1 if none
launch_ts  float64   for GPU rows, the start of the CPU call that launched it (NaN if unknown)
========== ========= =============================================================================

CUDA API calls (``cuda_runtime`` / ``cuda_driver``) only serve to find ``launch_ts`` and are not
kept: they are as many as the kernels and nothing else reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

EVENT_COLUMNS = ("ts", "dur", "cat", "name", "pid", "tid", "stream", "correlation", "launch_ts")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


@dataclass
class RankTrace:
    """One rank's events plus what the file said about itself."""

    rank: int
    path: Path
    source: str  # "kineto" or "nsys"
    events: pd.DataFrame
    metadata: Dict[str, object] = field(default_factory=dict)
    # Kineto only: HTA drops everything launched at or after the start of the last ProfilerStep
    # (that step is usually cut short by the profiler stopping). None: the whole trace counts.
    window_end: Optional[float] = None

    def gpu_events(self) -> pd.DataFrame:
        """GPU activity as HTA counts it: every row with a stream (kernels, memcpy, memset)."""
        ev = self.events
        return ev[ev["stream"] != -1]

    def cpu_events(self) -> pd.DataFrame:
        ev = self.events
        return ev[ev["stream"] == -1]


def _codes(codes: np.ndarray) -> np.ndarray[Tuple[int], np.dtype[np.int32]]:
    return np.asarray(codes, dtype=np.int32).reshape(-1)  # 1-D already: says so to the checker


def build_events(
    ts: np.ndarray,
    dur: np.ndarray,
    cat_codes: np.ndarray,
    cats: Sequence[str],
    name_codes: np.ndarray,
    names: Sequence[str],
    pid: np.ndarray,
    tid: np.ndarray,
    stream: np.ndarray,
    correlation: np.ndarray,
    launch_ts: Optional[np.ndarray] = None,
) -> pd.DataFrame:
    """Assemble the events table from columns; names and categories stay interned."""
    if launch_ts is None:
        launch_ts = np.full(len(ts), np.nan)
    frame = pd.DataFrame(
        {
            "ts": np.asarray(ts, dtype=np.float64),
            "dur": np.asarray(dur, dtype=np.float64),
            "cat": pd.Categorical.from_codes(_codes(cat_codes), pd.Index(list(cats))),
            "name": pd.Categorical.from_codes(_codes(name_codes), pd.Index(list(names))),
            "pid": np.asarray(pid, dtype=np.int64),
            "tid": np.asarray(tid, dtype=np.int64),
            "stream": np.asarray(stream, dtype=np.int64),
            "correlation": np.asarray(correlation, dtype=np.int64),
            "launch_ts": np.asarray(launch_ts, dtype=np.float64),
        }
    )
    return frame.sort_values("ts", kind="stable", ignore_index=True)


def launch_times(
    events: pd.DataFrame,
    api_correlation: Optional[np.ndarray] = None,
    api_ts: Optional[np.ndarray] = None,
) -> np.ndarray:
    """For each GPU row, the start of the earliest CPU row with its correlation id (else NaN).

    CPU rows are the table's own plus API calls given separately (not kept in the table).
    """
    stream = events["stream"].to_numpy()
    corr = events["correlation"].to_numpy()
    ts = events["ts"].to_numpy()
    out = np.full(len(events), np.nan)
    gpu = (stream >= 0) & (corr >= 0)  # HTA's definition of a GPU kernel row
    cpu = ~gpu & (corr >= 0)
    cpu_corr = np.r_[corr[cpu], [] if api_correlation is None else api_correlation].astype(np.int64)
    cpu_ts = np.r_[ts[cpu], [] if api_ts is None else api_ts]
    if not len(cpu_corr) or not gpu.any():
        return out
    order = np.lexsort((cpu_ts, cpu_corr))
    cpu_corr, cpu_ts = cpu_corr[order], cpu_ts[order]
    first = np.r_[True, cpu_corr[1:] != cpu_corr[:-1]]  # earliest CPU row of each correlation
    cpu_corr, cpu_ts = cpu_corr[first], cpu_ts[first]
    gpu_idx = np.flatnonzero(gpu)
    pos = np.minimum(np.searchsorted(cpu_corr, corr[gpu_idx]), len(cpu_corr) - 1)
    hit = cpu_corr[pos] == corr[gpu_idx]
    out[gpu_idx[hit]] = cpu_ts[pos[hit]]
    return out


def names_matching(series: pd.Series, predicate: Any) -> np.ndarray:
    """Rows whose (categorical) name satisfies ``predicate``, tested once per name."""
    cats = series.cat.categories
    hits = np.fromiter((bool(predicate(str(c))) for c in cats), dtype=bool, count=len(cats))
    codes = series.cat.codes.to_numpy()
    mask = np.zeros(len(codes), dtype=bool)
    valid = codes >= 0
    mask[valid] = hits[codes[valid]]
    return mask
