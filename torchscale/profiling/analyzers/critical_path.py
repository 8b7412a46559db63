"""A lightweight critical path per step: which kind of work the step's time waited on.

With kernels launched asynchronously, the GPU is on the critical path whenever it runs something,
and the host whenever the GPU has nothing to run. So each step window (the CPU step range) is
split exactly, every microsecond counted once:

=============== ================================================================================
compute         a compute kernel runs
exposed_comm    a communication kernel runs and no compute kernel does
gpu_other       only other GPU work runs (memory copies and sets)
data_loading    the GPU is idle while the host fetches the next batch (``enumerate(DataLoader)``)
host_launch     the GPU is idle and the work that ends the idle gap had not been launched when the
                gap began (the host was late), or the step's tail after the last GPU work
idle            the GPU is idle although the work that ends the gap was launched before the gap
                began (it waited on something else: a stream event, a synchronisation), or the
                launch is unknown
=============== ================================================================================

``bound`` names the largest. Far lighter than HTA's critical-path graph (no dependency graph),
and the same on Kineto and nsys traces.

A rank without GPU rows (gloo on CPU processes) runs its step on the host, so the host's own
ranges split it, in this order of precedence: **data_loading** (a batch fetch), **compute** (a CPU
operator runs: ``kernels.cpu_compute_ops``), **exposed_comm** (a collective's CPU range runs, the
same ranges as the collectives table: ``kernels.cpu_collectives``) and **host_launch** (the rest:
Python and the framework between operators, c10d's enqueueing of collectives); ``gpu_other`` and
``idle`` are 0. A gloo collective spans the wait for the other ranks, so a rank waiting on a late
peer shows it as exposed communication, as an NCCL kernel would.
"""

from __future__ import annotations

from typing import Any, List, Tuple

import numpy as np
import pandas as pd

from torchscale.profiling.analyzers import intervals
from torchscale.profiling.analyzers.kernels import (
    COMMUNICATION,
    COMPUTE,
    class_mask,
    cpu_collectives,
    cpu_compute_ops,
)
from torchscale.profiling.analyzers.steps import DATALOADER_RE, step_ranges
from torchscale.profiling.traces.model import RankTrace, names_matching

CATEGORIES = ("compute", "exposed_comm", "gpu_other", "data_loading", "host_launch", "idle")
COLUMNS = [
    "rank", "step", "start_us", "end_us", "duration_us", *[f"{c}_us" for c in CATEGORIES],
    "bound",
]  # fmt: skip


def _groups(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Indices of the rows (sorted by start) that begin each merged group of intervals."""
    running = np.maximum.accumulate(ends)
    return np.flatnonzero(np.r_[True, starts[1:] > running[:-1]])


def _step(
    lo: float,
    hi: float,
    ts: np.ndarray,
    end: np.ndarray,
    launch: np.ndarray,
    comp: np.ndarray,
    comm: np.ndarray,
    loading: intervals.Segments,
) -> List[float]:
    """The step's time per category (``CATEGORIES`` order)."""
    starts, ends = np.maximum(ts, lo), np.minimum(end, hi)
    compute = intervals.union_length(starts, ends, comp)
    comp_or_comm = intervals.union_length(starts, ends, comp | comm)
    busy = intervals.union_length(starts, ends)
    out = [compute, comp_or_comm - compute, busy - comp_or_comm, 0.0, 0.0, 0.0]
    first = _groups(starts, ends) if len(starts) else np.zeros(0, dtype=np.int64)
    group_end = np.maximum.reduceat(ends, first) if len(first) else np.zeros(0)
    gap_lo = np.r_[lo, group_end]
    gap_hi = np.r_[starts[first], hi] if len(first) else np.array([hi])
    fetching = intervals.covered_between(*loading, gap_lo, gap_hi)
    for k, (g0, g1, fetch) in enumerate(zip(gap_lo, gap_hi, fetching)):
        rest = max(0.0, g1 - g0 - fetch)
        out[3] += fetch
        if k == len(first):  # the tail: the host finishes the step
            out[4] += rest
            continue
        launched = launch[first[k]]
        out[4 if np.isfinite(launched) and launched > g0 else 5] += rest
    return out


def _ends(rows: pd.DataFrame) -> np.ndarray:
    ends: np.ndarray = rows["ts"].to_numpy(np.float64) + rows["dur"].to_numpy(np.float64)
    return ends


def _cpu_rank(trace: RankTrace, steps: pd.DataFrame) -> List[Tuple[Any, ...]]:
    """A rank without GPU rows: each step split by the host's ranges (module docstring)."""
    layers = [
        trace.cpu_events()[names_matching(trace.cpu_events()["name"], DATALOADER_RE.match)],
        cpu_compute_ops(trace),
        cpu_collectives(trace),
    ]
    lo, hi = steps["start_us"].to_numpy(float), steps["end_us"].to_numpy(float)
    starts, ends = np.zeros(0), np.zeros(0)
    covered = []  # per step: time under the first layer, the first two, all three
    for rows in layers:
        starts, ends = np.r_[starts, rows["ts"].to_numpy()], np.r_[ends, _ends(rows)]
        covered.append(intervals.covered_between(*intervals.merge(starts, ends), lo, hi))
    loading, with_compute, with_comm = covered
    span = hi - lo
    out = []
    for k, step in enumerate(steps["step"].to_numpy()):
        parts = [
            with_compute[k] - loading[k], with_comm[k] - with_compute[k], 0.0, loading[k],
            max(0.0, span[k] - with_comm[k]), 0.0,
        ]  # fmt: skip
        bound = CATEGORIES[int(np.argmax(parts))]
        out.append((trace.rank, int(step), lo[k], hi[k], span[k], *map(float, parts), bound))
    return out


def critical_path(traces: List[RankTrace]) -> pd.DataFrame:
    """One row per rank and step: the step's time split by category (module docstring)."""
    rows: List[Tuple[Any, ...]] = []
    for trace in traces:
        steps = step_ranges(trace)
        gpu = trace.gpu_events()
        if gpu.empty:
            rows += _cpu_rank(trace, steps)
            continue
        ts, dur = gpu["ts"].to_numpy(), gpu["dur"].to_numpy()
        launch = gpu["launch_ts"].to_numpy()
        comp = class_mask(gpu["name"], COMPUTE)
        comm = class_mask(gpu["name"], COMMUNICATION)
        longest = float(gpu["dur"].max()) if len(gpu) else 0.0
        cpu = trace.cpu_events()
        fetch = cpu[names_matching(cpu["name"], DATALOADER_RE.match)]
        loading = intervals.merge(fetch["ts"].to_numpy(), (fetch["ts"] + fetch["dur"]).to_numpy())
        for step, lo, hi in steps[["step", "start_us", "end_us"]].itertuples(index=False):
            # rows that can overlap the step: started before its end, ended after its start
            first = int(np.searchsorted(ts, lo - longest, side="left"))
            last = int(np.searchsorted(ts, hi, side="left"))
            end = ts[first:last] + dur[first:last]
            inside = end > lo
            parts = _step(
                lo, hi, ts[first:last][inside], end[inside], launch[first:last][inside],
                comp[first:last][inside], comm[first:last][inside], loading,
            )  # fmt: skip
            bound = CATEGORIES[int(np.argmax(parts))]
            rows.append((trace.rank, int(step), lo, hi, hi - lo, *parts, bound))
    return pd.DataFrame(rows, columns=COLUMNS)


def critical_path_by_rank(table: pd.DataFrame) -> pd.DataFrame:
    """Per rank: each category's share of all step time, and the most common bound."""
    if table.empty:
        return pd.DataFrame(columns=["rank", *[f"{c}_pct" for c in CATEGORIES], "bound"])
    sums = table.groupby("rank")[[f"{c}_us" for c in CATEGORIES] + ["duration_us"]].sum()
    out = pd.DataFrame(index=sums.index)
    for c in CATEGORIES:
        out[f"{c}_pct"] = 100.0 * sums[f"{c}_us"] / sums["duration_us"]
    out["bound"] = table.groupby("rank")["bound"].agg(lambda b: b.value_counts().index[0])
    return out.reset_index()
