"""Per-step times from ``ProfilerStep#N`` (torch.profiler) or NVTX step ranges (nsys)."""

from __future__ import annotations

import re
from typing import Dict, List, Tuple

import numpy as np
import pandas as pd

from torchscale.profiling.analyzers import intervals
from torchscale.profiling.traces.model import RankTrace, names_matching

# torch.profiler: "ProfilerStep#12". NVTX ranges emitted by a training loop (and by torchscale's
# worker): "step 12", "step#12", "step_12", "train_step 12", "iteration 12".
STEP_NAME_RE = re.compile(
    r"^(?:ProfilerStep\s*#\s*|(?:train[_ ]?)?step[ _#:]*|iteration[ _#:]*)"
    r"(\d+)$",
    re.IGNORECASE,
)
STEP_COLUMNS = ["rank", "step", "start_us", "end_us", "duration_us", "gpu_busy_us", "gpu_idle_pct"]


def step_ranges(trace: RankTrace) -> pd.DataFrame:
    """The rank's steps (number, start, end), earliest range per step number."""
    cpu = trace.cpu_events()
    rows = cpu[names_matching(cpu["name"], STEP_NAME_RE.match)]
    if rows.empty:
        return pd.DataFrame(columns=["step", "start_us", "end_us"])
    numbers = [int(STEP_NAME_RE.match(str(n)).group(1)) for n in rows["name"]]  # type: ignore[union-attr]
    frame = pd.DataFrame(
        {
            "step": numbers,
            "start_us": rows["ts"].to_numpy(),
            "end_us": (rows["ts"] + rows["dur"]).to_numpy(),
        }
    )
    return (
        frame.sort_values("start_us").drop_duplicates("step").sort_values("step", ignore_index=True)
    )


def assign_steps(times: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """Step number whose [start, end) holds each time, -1 when none does."""
    out = np.full(len(times), -1, dtype=np.int64)
    if steps.empty or not len(times):
        return out
    order = np.argsort(steps["start_us"].to_numpy())
    starts = steps["start_us"].to_numpy()[order]
    ends = steps["end_us"].to_numpy()[order]
    numbers = steps["step"].to_numpy()[order]
    pos = np.searchsorted(starts, times, side="right") - 1
    ok = (pos >= 0) & ~np.isnan(times)
    ok[ok] &= times[ok] < ends[pos[ok]]
    out[ok] = numbers[pos[ok]]
    return out


def step_times(traces: List[RankTrace]) -> pd.DataFrame:
    """One row per rank and step: CPU-side step duration and the GPU's busy time within it."""
    rows: List[Tuple[object, ...]] = []
    for trace in traces:
        steps = step_ranges(trace)
        gpu = trace.gpu_events()
        ts = gpu["ts"].to_numpy()
        lo, hi = steps["start_us"].to_numpy(float), steps["end_us"].to_numpy(float)
        inside = (
            intervals.covered_in_windows(ts, gpu["dur"].to_numpy(), lo, hi)
            if len(ts)
            else np.full(len(lo), np.nan)
        )
        span = hi - lo
        with np.errstate(invalid="ignore", divide="ignore"):
            idle = np.where(span > 0, 100.0 * (span - inside) / span, np.nan)
        rows += zip([trace.rank] * len(lo), steps["step"].astype(int), lo, hi, span, inside, idle)
    return pd.DataFrame(rows, columns=STEP_COLUMNS)


def overlapping_steps(steps: pd.DataFrame) -> Dict[int, int]:
    """Per rank, the steps that start before the step before them ended (in start order).
    torch.profiler never writes such ranges: they come from an edited trace or two profilers,
    and every per-step figure (and the sync stall) then counts their shared time twice."""
    out: Dict[int, int] = {}
    for rank in sorted(set(steps["rank"].tolist())):
        ordered = steps[steps["rank"] == rank].sort_values("start_us")
        ends = np.maximum.accumulate(ordered["end_us"].to_numpy(float))
        count = int((ordered["start_us"].to_numpy(float)[1:] < ends[:-1]).sum())
        if count:
            out[int(rank)] = count
    return out


# torch.profiler records each batch fetch as "enumerate(DataLoader)#<iterator class>.__next__".
DATALOADER_RE = re.compile(r"^enumerate\(DataLoader\)#.*__next__$")


def dataloader_time(traces: List[RankTrace]) -> pd.DataFrame:
    """Per rank: time spent waiting for the next batch, and its share of step time."""
    rows = []
    for trace in traces:
        cpu = trace.cpu_events()
        fetch = cpu[names_matching(cpu["name"], DATALOADER_RE.match)]
        steps = step_ranges(trace)
        step_total = float((steps["end_us"] - steps["start_us"]).sum()) if len(steps) else 0.0
        wait = intervals.union_length(
            fetch["ts"].to_numpy(), (fetch["ts"] + fetch["dur"]).to_numpy()
        )
        rows.append(
            (trace.rank, wait, round(100.0 * wait / step_total, 2) if step_total else float("nan"))
        )
    return pd.DataFrame(rows, columns=["rank", "dataloader_us", "dataloader_pct"])
