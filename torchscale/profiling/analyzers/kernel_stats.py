"""Kernel durations per rank: time by kernel type (HTA's overlap breakdown), the distribution of
durations per class, and the top kernels of each class.

``kernel_type_breakdown`` follows HTA 0.5.0's ``get_gpu_kernel_breakdown`` (first table): every
GPU row is COMPUTATION, COMMUNICATION or MEMORY (HTA's name rules; rows of none of them are
left out), and the time covered by each *combination* of types is counted once, e.g. "COMPUTATION
overlapping COMMUNICATION" is time when both run. Each combination's exclusive time comes from
union lengths only (Moebius inversion over the types: memory of a few arrays, not of the merged
intervals). ``percentage`` is of the rank's total. ``top_kernels`` gives per kernel name what HTA's
second table gives (sum, max, min, mean, sample std) for the ``top`` names of each class by total
time, plus count and share; HTA folds the rest into "others", we leave them out.
"""

from __future__ import annotations

from itertools import combinations
from typing import Dict, List, Tuple

import numpy as np
import pandas as pd

from torchscale.profiling.analyzers import intervals
from torchscale.profiling.analyzers.kernels import COMMUNICATION, COMPUTE, MEMORY, class_mask
from torchscale.profiling.traces.model import RankTrace

# HTA's type names, in its bit order (the order combination names are written in)
HTA_TYPES: Tuple[Tuple[str, str], ...] = (
    ("COMPUTATION", COMPUTE),
    ("COMMUNICATION", COMMUNICATION),
    ("MEMORY", MEMORY),
)
QUANTILES = (0.5, 0.9, 0.99)
DISTRIBUTION_COLUMNS = [
    "rank", "kernel_class", "count", "sum_us", "mean_us", "std_us", "min_us",
    "p50_us", "p90_us", "p99_us", "max_us",
]  # fmt: skip
TOP_COLUMNS = [
    "rank", "kernel_class", "name", "count", "sum_us", "max_us", "min_us", "mean_us", "std_us",
    "share_of_class",
]  # fmt: skip


def kernel_type_breakdown(traces: List[RankTrace]) -> pd.DataFrame:
    """Per rank and combination of kernel types: exclusive time (us) and its percentage."""
    rows = []
    for trace in traces:
        gpu = trace.gpu_events()
        ts, dur = gpu["ts"].to_numpy(), gpu["dur"].to_numpy()
        masks = [class_mask(gpu["name"], cls) for _, cls in HTA_TYPES]
        every = range(len(HTA_TYPES))
        # within[S]: time covered by types of S only = total - union of the types outside S
        total = intervals.union_length(ts, None, np.logical_or.reduce(masks), durations=dur)
        within: Dict[Tuple[int, ...], float] = {(): 0.0}
        for size in range(1, len(HTA_TYPES) + 1):
            for subset in combinations(every, size):
                outside = [masks[i] for i in every if i not in subset]
                rest = np.logical_or.reduce(outside) if outside else None
                within[subset] = total - (
                    intervals.union_length(ts, None, rest, durations=dur)
                    if rest is not None
                    else 0.0
                )
        exact: Dict[Tuple[int, ...], float] = {}
        for subset in within:
            if subset:
                exact[subset] = sum(
                    (-1) ** (len(subset) - size) * within[part]
                    for size in range(len(subset) + 1)
                    for part in combinations(subset, size)
                )
        for subset, time in exact.items():
            if time > 0:
                name = " overlapping ".join(HTA_TYPES[i][0] for i in subset)
                rows.append((trace.rank, name, time, 100.0 * time / total if total else np.nan))
    frame = pd.DataFrame(rows, columns=["rank", "kernel_type", "sum_us", "percentage"])
    return frame.sort_values(["rank", "sum_us"], ascending=[True, False], ignore_index=True)


def _classes(trace: RankTrace) -> List[Tuple[str, np.ndarray]]:
    gpu = trace.gpu_events()
    return [(cls, class_mask(gpu["name"], cls)) for _, cls in HTA_TYPES]


def _moments(values: np.ndarray) -> Tuple[float, float]:
    """Mean and sample std in float64, a chunk at a time (no float64 copy of the column)."""
    n = len(values)
    step = intervals.CHUNK_ROWS
    total = sum(float(values[i : i + step].sum(dtype=np.float64)) for i in range(0, n, step))
    mean = total / n
    square = sum(
        float(np.square(values[i : i + step].astype(np.float64) - mean).sum())
        for i in range(0, n, step)
    )
    return mean, float(np.sqrt(square / (n - 1))) if n > 1 else 0.0


def kernel_distribution(traces: List[RankTrace]) -> pd.DataFrame:
    """Per rank and kernel class: how kernel durations are distributed."""
    rows = []
    for trace in traces:
        dur = trace.gpu_events()["dur"].to_numpy()
        for cls, mask in _classes(trace):
            values = dur[mask]  # the column's own type: float32 where it is exact
            if not len(values):
                continue
            mean, std = _moments(values)
            q = np.quantile(values, QUANTILES)
            total = float(values.sum(dtype=np.float64))
            head = (trace.rank, cls, len(values), total, mean, std, float(values.min()))
            rows.append((*head, *map(float, q), float(values.max())))
            del values
    return pd.DataFrame(rows, columns=DISTRIBUTION_COLUMNS)


def _name_stats(codes: np.ndarray, values: np.ndarray, names: int) -> pd.DataFrame:
    """count, sum, max, min, mean, std of ``values`` per name code, a chunk at a time."""
    count, total, square = np.zeros(names), np.zeros(names), np.zeros(names)
    high, low = np.full(names, -np.inf), np.full(names, np.inf)
    step = intervals.CHUNK_ROWS
    for i in range(0, len(codes), step):
        code, value = codes[i : i + step].astype(np.intp), values[i : i + step].astype(np.float64)
        count += np.bincount(code, minlength=names)
        total += np.bincount(code, value, minlength=names)
        square += np.bincount(code, value * value, minlength=names)
        np.maximum.at(high, code, value)
        np.minimum.at(low, code, value)
    seen = count > 0
    mean = np.divide(total, count, out=np.zeros(names), where=seen)
    spread = np.clip(square - count * mean * mean, 0.0, None)
    std = np.sqrt(np.divide(spread, count - 1, out=np.zeros(names), where=count > 1))
    stats = pd.DataFrame(
        {"count": count, "sum": total, "max": high, "min": low, "mean": mean, "std": std}
    )
    return stats[seen]


def top_kernels(traces: List[RankTrace], top: int = 10) -> pd.DataFrame:
    """Per rank and class, the ``top`` kernel names by total time, with their statistics."""
    frames = []
    for trace in traces:
        gpu = trace.gpu_events()
        names = gpu["name"].cat.categories
        codes = gpu["name"].cat.codes.to_numpy()
        for cls, mask in _classes(trace):
            if not mask.any():
                continue
            stats = _name_stats(codes[mask], gpu["dur"].to_numpy()[mask], len(names))
            stats["count"] = stats["count"].astype(int)
            stats["share_of_class"] = stats["sum"] / stats["sum"].sum()
            stats = stats.sort_values("sum", ascending=False).head(top)
            stats.insert(0, "name", [str(names[i]) for i in stats.index])
            stats.insert(0, "kernel_class", cls)
            stats.insert(0, "rank", trace.rank)
            frames.append(stats.reset_index(drop=True))
    if not frames:
        return pd.DataFrame(columns=TOP_COLUMNS)
    out = pd.concat(frames, ignore_index=True)
    out = out.rename(columns={k: f"{k}_us" for k in ("sum", "max", "min", "mean", "std")})
    return out[TOP_COLUMNS]
