"""Idle-time breakdown per rank and stream, with Holistic Trace Analysis's definitions.

HTA 0.5.0 (``BreakdownAnalysis.get_idle_time_breakdown``): on each stream, the kernels (rows of a
kernel, copy or set category) in start order; the idle interval before a kernel is its start
minus the previous kernel's end (not clipped: HTA sums what it finds), and it is

* **host wait** when the call that launched the kernel started after the previous kernel ended
  (the host had not enqueued the work yet);
* else **kernel wait** when the interval is under ``consecutive_kernel_delay`` (30 us): the
  overhead of launching kernels back to back;
* else **other** (e.g. a kernel waiting for an event of another stream).

``idle_ratio`` is a category's share of the stream's idle time. Checked against HTA's own output
on the real traces (``tests/data/hta_reference``).
"""

from __future__ import annotations

from typing import Any, List, Tuple

import numpy as np
import pandas as pd

from torchscale.profiling.traces.model import RankTrace

HOST_WAIT, KERNEL_WAIT, OTHER_WAIT = "host_wait", "kernel_wait", "other"
IDLE_CATEGORIES = (HOST_WAIT, KERNEL_WAIT, OTHER_WAIT)
CONSECUTIVE_KERNEL_DELAY_US = 30.0
# HTA's kernel categories for this analysis (Kineto's, older spellings, MTIA's device events)
KERNEL_CATEGORIES = (
    "kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy", "mtia_ccp_events",
)  # fmt: skip
IDLE_COLUMNS = ["rank", "stream", "idle_category", "idle_time_us", "idle_ratio", "intervals"]


def stream_kernels(trace: RankTrace) -> pd.DataFrame:
    """GPU rows HTA counts as kernels here (not GPU-side annotations)."""
    gpu = trace.gpu_events()
    return gpu[gpu["cat"].isin(KERNEL_CATEGORIES).to_numpy()]


def _stream_breakdown(kernels: pd.DataFrame, delay_us: float) -> List[Tuple[Any, ...]]:
    ts = kernels["ts"].to_numpy()
    end = ts + kernels["dur"].to_numpy()
    previous_end = end[:-1]
    gap = ts[1:] - previous_end
    launched = kernels["launch_ts"].to_numpy()[1:]
    with np.errstate(invalid="ignore"):
        host = launched > previous_end  # NaN (no launch known) is not a host wait
    waiting = ~host & (gap < delay_us)
    other = ~host & ~waiting
    total = float(gap.sum())
    rows = []
    for name, mask in ((HOST_WAIT, host), (KERNEL_WAIT, waiting), (OTHER_WAIT, other)):
        time = float(gap[mask].sum())
        rows.append((name, time, time / total if total else float("nan"), int(mask.sum())))
    return rows


def idle_time_breakdown(
    traces: List[RankTrace], consecutive_kernel_delay_us: float = CONSECUTIVE_KERNEL_DELAY_US
) -> pd.DataFrame:
    """One row per rank, stream and idle category (see the module docstring)."""
    rows = []
    for trace in traces:
        kernels = stream_kernels(trace)
        streams = kernels["stream"].to_numpy()
        for stream in np.unique(streams):
            mine = kernels[streams == stream]  # start order: the table is sorted
            for name, time, ratio, count in _stream_breakdown(mine, consecutive_kernel_delay_us):
                rows.append((trace.rank, int(stream), name, time, ratio, count))
    return pd.DataFrame(rows, columns=IDLE_COLUMNS)


def idle_time_by_rank(breakdown: pd.DataFrame) -> pd.DataFrame:
    """Per rank and category, summed over streams, with the share of the rank's idle time."""
    if breakdown.empty:
        return pd.DataFrame(columns=["rank", "idle_category", "idle_time_us", "idle_ratio"])
    by_rank = breakdown.groupby(["rank", "idle_category"])["idle_time_us"].sum().reset_index()
    totals = by_rank.groupby("rank")["idle_time_us"].transform("sum")
    by_rank["idle_ratio"] = np.where(totals > 0, by_rank["idle_time_us"] / totals, np.nan)
    return by_rank
