"""Idle-time breakdown per rank and stream, with Holistic Trace Analysis's definitions.

HTA 0.5.0 (``BreakdownAnalysis.get_idle_time_breakdown``): on each stream, the kernels (rows of a
kernel, copy or set category) in start order; the idle interval before a kernel is its start
minus the previous kernel's end, 0 when they overlap (HTA sums negative gaps as found), and it
is

* **host wait** when the call that launched the kernel started after the previous kernel ended
  (the host had not enqueued the work yet);
* else **kernel wait** when the interval is under ``consecutive_kernel_delay`` (30 us): the
  overhead of launching kernels back to back;
* else **other** (e.g. a kernel waiting for an event of another stream).

``idle_ratio`` is a category's share of the stream's idle time. Checked against HTA's own output
on the real traces (``tests/data/hta_reference``).
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np
import pandas as pd

from torchscale.profiling.analyzers.intervals import CHUNK_ROWS
from torchscale.profiling.traces.model import RankTrace

HOST_WAIT, KERNEL_WAIT, OTHER_WAIT = "host_wait", "kernel_wait", "other"
IDLE_CATEGORIES = (HOST_WAIT, KERNEL_WAIT, OTHER_WAIT)
CONSECUTIVE_KERNEL_DELAY_US = 30.0
# HTA's kernel categories for this analysis (Kineto's, older spellings, MTIA's device events)
KERNEL_CATEGORIES = (
    "kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy", "mtia_ccp_events",
)  # fmt: skip
IDLE_COLUMNS = ["rank", "stream", "idle_category", "idle_time_us", "idle_ratio", "intervals"]


def _accumulate(
    totals: Dict[int, np.ndarray],
    last_end: Dict[int, float],
    streams: np.ndarray,
    ts: np.ndarray,
    end: np.ndarray,
    launched: np.ndarray,
    delay_us: float,
) -> None:
    """Add one chunk of kernels (start order) to each stream's idle time and interval counts
    (``totals[stream]``: host, kernel and other wait, then their counts)."""
    for stream in np.unique(streams):
        mine = streams == stream
        start, stop, launch = ts[mine], end[mine], launched[mine]
        previous_end = np.r_[last_end.get(int(stream), np.nan), stop[:-1]]
        last_end[int(stream)] = float(stop[-1])
        known = ~np.isnan(previous_end)  # the stream's first kernel has no interval before it
        # Overlapping kernels leave no idle time: a gap is never negative. HTA sums them as found
        # (-2 us on one stream of nccl-16rank), and nsys's nanosecond clock, in microseconds
        # since 2020, rounds back-to-back kernels into -0.03 us overlaps.
        gap = np.maximum(start - previous_end, 0.0)[known]
        with np.errstate(invalid="ignore"):
            host = (launch > previous_end)[known]  # NaN (no launch known) is no host wait
        waiting = ~host & (gap < delay_us)
        other = ~host & ~waiting
        sums = totals.setdefault(int(stream), np.zeros(6))
        for k, mask in enumerate((host, waiting, other)):
            sums[k] += float(gap[mask].sum())
            sums[3 + k] += int(mask.sum())


def idle_time_breakdown(
    traces: List[RankTrace], consecutive_kernel_delay_us: float = CONSECUTIVE_KERNEL_DELAY_US
) -> pd.DataFrame:
    """One row per rank, stream and idle category (see the module docstring). The GPU table is
    read a chunk at a time, each stream carrying its last kernel's end across chunks."""
    rows = []
    for trace in traces:
        gpu = trace.gpu_events()
        is_kernel = gpu["cat"].isin(KERNEL_CATEGORIES).to_numpy()
        columns = [gpu[c].to_numpy() for c in ("stream", "ts", "dur", "launch_ts")]
        totals: Dict[int, np.ndarray] = {}
        last_end: Dict[int, float] = {}
        for lo in range(0, len(gpu), CHUNK_ROWS):
            keep = is_kernel[lo : lo + CHUNK_ROWS]
            streams, ts, dur, launch = (c[lo : lo + CHUNK_ROWS][keep] for c in columns)
            if len(ts):
                end = ts + dur
                _accumulate(totals, last_end, streams, ts, end, launch, consecutive_kernel_delay_us)
        for stream in sorted(totals):
            sums = totals[stream]
            idle = float(sums[:3].sum())
            for k, name in enumerate(IDLE_CATEGORIES):
                ratio = sums[k] / idle if idle else float("nan")
                rows.append((trace.rank, stream, name, float(sums[k]), ratio, int(sums[3 + k])))
    return pd.DataFrame(rows, columns=IDLE_COLUMNS)


def idle_time_by_rank(breakdown: pd.DataFrame) -> pd.DataFrame:
    """Per rank and category, summed over streams, with the share of the rank's idle time."""
    if breakdown.empty:
        return pd.DataFrame(columns=["rank", "idle_category", "idle_time_us", "idle_ratio"])
    by_rank = breakdown.groupby(["rank", "idle_category"])["idle_time_us"].sum().reset_index()
    totals = by_rank.groupby("rank")["idle_time_us"].transform("sum")
    by_rank["idle_ratio"] = np.where(totals > 0, by_rank["idle_time_us"] / totals, np.nan)
    return by_rank
