"""Step-to-step pace: how steady each phase of the step is, per rank (Nsight Systems'
``nvtx_pace`` recipe, applied to every phase we can name).

Phases: ``step`` (the step range's duration) and ``step_interval`` (start to start: the pace the
loop keeps, idle time between steps included); each category of the critical path (GPU compute,
exposed communication, data loading, ...); and each annotated range found in most steps (NVTX
ranges such as ``forward``, torch.profiler's ``## forward ##`` or ``Optimizer.step``), its time
summed per step. Per rank and phase: mean, std, coefficient of variation, quantiles, the slowest
step and the slowest step over the median (1.0: perfectly steady).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np
import pandas as pd

from torchscale.profiling.analyzers.critical_path import CATEGORIES
from torchscale.profiling.analyzers.steps import STEP_NAME_RE, assign_steps, step_ranges
from torchscale.profiling.traces.model import RankTrace, names_matching

MIN_STEP_SHARE = 0.5  # an annotated phase is reported when it is seen in this share of steps
MAX_ANNOTATED_PHASES = 12
ANNOTATION_CATEGORIES = ("user_annotation", "gpu_user_annotation")
PACE_COLUMNS = [
    "rank", "phase", "steps", "mean_us", "std_us", "cv", "min_us", "p50_us", "p95_us", "max_us",
    "slowest_step", "slowest_over_median",
]  # fmt: skip


def _row(rank: int, phase: str, steps: np.ndarray, values: np.ndarray) -> Tuple[Any, ...]:
    median = float(np.median(values))
    mean = float(values.mean())
    std = float(values.std(ddof=0))
    return (
        rank, phase, len(values), mean, std, std / mean if mean else np.nan,
        float(values.min()), median, float(np.quantile(values, 0.95)), float(values.max()),
        int(steps[int(np.argmax(values))]), float(values.max()) / median if median else np.nan,
    )  # fmt: skip


def _annotated(trace: RankTrace, steps: pd.DataFrame) -> Dict[str, pd.Series]:
    """Per annotated range name seen in most steps: its summed duration per step."""
    cpu = trace.cpu_events()
    ranges = cpu[
        cpu["cat"].isin(ANNOTATION_CATEGORIES).to_numpy()
        & ~names_matching(cpu["name"], STEP_NAME_RE.match)
    ]
    if ranges.empty or steps.empty:
        return {}
    owner = assign_steps(ranges["ts"].to_numpy(), steps)
    frame = pd.DataFrame(
        {
            "name": ranges["name"].astype(str).to_numpy(),
            "step": owner,
            "dur": ranges["dur"].to_numpy(dtype=np.float64),
        }
    )
    frame = frame[frame["step"] >= 0]
    per_step = frame.groupby(["name", "step"])["dur"].sum()
    seen = per_step.groupby(level="name").size()
    common = seen[seen >= MIN_STEP_SHARE * len(steps)].sort_values(ascending=False)
    return {str(name): per_step.loc[name] for name in common.index[:MAX_ANNOTATED_PHASES]}


def step_pace(traces: List[RankTrace], critical: pd.DataFrame) -> pd.DataFrame:
    """Per rank and phase: pace statistics (module docstring). ``critical``: the
    ``critical_path`` table of the same traces."""
    rows = []
    for trace in traces:
        steps = step_ranges(trace)
        if steps.empty:
            continue
        numbers = steps["step"].to_numpy()
        rows.append(
            _row(trace.rank, "step", numbers, (steps["end_us"] - steps["start_us"]).to_numpy())
        )
        by_start = steps.sort_values("start_us")
        if len(by_start) > 1:
            interval = np.diff(by_start["start_us"].to_numpy())
            rows.append(
                _row(trace.rank, "step_interval", by_start["step"].to_numpy()[1:], interval)
            )
        mine = critical[critical["rank"] == trace.rank]
        for category in CATEGORIES:
            values = mine[f"{category}_us"].to_numpy()
            if len(values) and values.any():
                rows.append(_row(trace.rank, category, mine["step"].to_numpy(), values))
        for name, per_step in _annotated(trace, steps).items():
            rows.append(_row(trace.rank, name, per_step.index.to_numpy(), per_step.to_numpy()))
    return pd.DataFrame(rows, columns=PACE_COLUMNS)
