"""``profile diff OLD NEW``: what moved between two captures of the same job, rank by rank.

Two tables (HTA's ``TraceDiff`` style, beyond it):

* ``ops``: per rank and operation (every kernel, CPU op, annotation and CUDA API call, by device,
  category and name): calls and total time in each capture, per step and their change; ``status``
  says ``new`` (only in NEW), ``vanished`` (only in OLD), ``changed`` or ``same``. Sorted by the
  change of time per step, largest first: the kernel or op that moved most leads.
* ``steps``: per rank and phase (the step, then each category of the critical path): mean time per
  step in each capture and the change, over the steps ``profile analyze`` analyses (a Kineto
  trace's last ``ProfilerStep``, usually cut short, left out).

Counted as HTA's ``TraceDiff.compare_traces`` counts (checked against its recorded totals):
the whole capture (the last ProfilerStep included), events inside a step only when the trace
has steps, a GPU row in the step its launch happened in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import pandas as pd

from torchscale.profiling.analyzers.critical_path import CATEGORIES, critical_path
from torchscale.profiling.analyzers.steps import assign_steps, step_ranges
from torchscale.profiling.traces import RankTrace, load_traces
from torchscale.profiling.traces.kineto_rows import last_step_start

KEY = ["rank", "device", "cat", "name"]
OP_COLUMNS = [
    *KEY, "old_count", "new_count", "old_us", "new_us", "delta_us",
    "old_us_per_step", "new_us_per_step", "delta_us_per_step", "status",
]  # fmt: skip
STEP_COLUMNS = ["rank", "phase", "old_us", "new_us", "delta_us", "delta_pct"]
SAME_SHARE = 0.005  # a change under 0.5% of the op's time (and no change of calls) is "same"


SHARED_WORK_MIN = 0.5
"""Two captures of one job spend most of their time in the same kernels (ops on CPU): under half
of their time in work both ran, and a diff compares unrelated jobs."""


@dataclass
class TraceDiff:
    tables: Dict[str, pd.DataFrame]
    old_steps: Dict[int, int]
    new_steps: Dict[int, int]
    warnings: List[str] = field(default_factory=list)
    # How OLD and NEW differ as jobs (world size, backend, device, kernels); empty: one job.
    job_differences: List[str] = field(default_factory=list)


def _device_of(trace: RankTrace) -> str:
    return "GPU" if len(trace.gpu_events()) else "CPU"


def job_differences(old: RankTrace, new: RankTrace, ops: pd.DataFrame) -> List[str]:
    """What says that ``old`` and ``new`` are not two captures of one job: their declared world
    size or backend, the device they ran on, or too little work in common (``ops``: their
    ``diff_ops`` table)."""
    from torchscale.profiling.traces.discover import job_of

    found: List[str] = []
    a, b = job_of(old), job_of(new)
    if a is not None and b is not None:
        if a[1] != b[1]:
            found.append(f"world size {a[1]} in OLD, {b[1]} in NEW")
        if a[0] and b[0] and a[0] != b[0]:
            found.append(f"backend {a[0]} in OLD, {b[0]} in NEW")
    if _device_of(old) != _device_of(new):
        found.append(f"{_device_of(old)} work in OLD, {_device_of(new)} in NEW")
    device = "gpu" if (ops["device"] == "gpu").any() else "cpu"
    mine = ops[ops["device"] == device]
    time = mine["old_us"].abs() + mine["new_us"].abs()
    total = float(time.sum())
    shared = float(time[~mine["status"].isin(["new", "vanished"])].sum())
    if total > 0 and shared / total < SHARED_WORK_MIN:
        what = "kernels" if device == "gpu" else "operations"
        found.append(f"only {100 * shared / total:.0f}% of the time is in {what} both ran")
    return found


def _in_steps(times: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    return np.ones(len(times), bool) if steps.empty else assign_steps(times, steps) >= 0


def op_totals(trace: RankTrace) -> pd.DataFrame:
    """Calls and total time per (device, category, name), inside the trace's steps."""
    steps = step_ranges(trace)
    frames = []
    gpu = trace.gpu_events()
    anchor = np.where(np.isnan(gpu["launch_ts"].to_numpy()), gpu["ts"], gpu["launch_ts"])
    api = trace.api
    for device, rows, mask in (
        ("gpu", gpu, _in_steps(anchor, steps)),
        ("cpu", trace.cpu_events(), _in_steps(trace.cpu_events()["ts"].to_numpy(), steps)),
        ("cpu", api.assign(cat="cuda_api"), _in_steps(api["ts"].to_numpy(), steps)),
    ):
        kept = rows[mask]
        frames.append(
            pd.DataFrame(
                {
                    "device": device,
                    "cat": kept["cat"].astype(str).to_numpy(),
                    "name": kept["name"].astype(str).to_numpy(),
                    "dur": kept["dur"].to_numpy(dtype=np.float64),
                }
            )
        )
    every = pd.concat(frames, ignore_index=True)
    totals = every.groupby(["device", "cat", "name"], sort=False)["dur"].agg(["count", "sum"])
    return totals.reset_index().rename(columns={"count": "count", "sum": "total_us"})


def diff_ops(old: RankTrace, new: RankTrace, old_steps: int, new_steps: int) -> pd.DataFrame:
    a, b = op_totals(old), op_totals(new)
    both = a.merge(b, on=["device", "cat", "name"], how="outer", suffixes=("_old", "_new"))
    both = both.fillna({"count_old": 0, "count_new": 0, "total_us_old": 0.0, "total_us_new": 0.0})
    out = pd.DataFrame(
        {
            "rank": new.rank,
            "device": both["device"],
            "cat": both["cat"],
            "name": both["name"],
            "old_count": both["count_old"].astype(int),
            "new_count": both["count_new"].astype(int),
            "old_us": both["total_us_old"],
            "new_us": both["total_us_new"],
        }
    )
    out["delta_us"] = out["new_us"] - out["old_us"]
    out["old_us_per_step"] = out["old_us"] / max(old_steps, 1)
    out["new_us_per_step"] = out["new_us"] / max(new_steps, 1)
    out["delta_us_per_step"] = out["new_us_per_step"] - out["old_us_per_step"]
    # HTA's rounding leaves sub-microsecond calls at -1 us: sizes are compared as magnitudes
    size = out[["old_us_per_step", "new_us_per_step"]].abs().max(axis=1)
    moved = out["delta_us_per_step"].abs() > SAME_SHARE * size
    status = np.where(out["old_count"] == 0, "new", np.where(out["new_count"] == 0, "vanished", ""))
    changed = moved | (out["old_count"] != out["new_count"])
    out["status"] = np.where(status != "", status, np.where(changed, "changed", "same"))
    order = out["delta_us_per_step"].abs().sort_values(ascending=False, kind="stable").index
    return out.loc[order, OP_COLUMNS].reset_index(drop=True)


def analysed_steps(trace: RankTrace) -> pd.DataFrame:
    """The critical path of the steps ``profile analyze`` analyses: a Kineto trace read whole
    loses its last ``ProfilerStep`` (usually cut short by the profiler stopping), as on load."""
    table = critical_path([trace])
    end = last_step_start(trace.cpu_events()) if trace.source == "kineto" else None
    return table if end is None else table[table["start_us"] < end]


def diff_steps(old: RankTrace, new: RankTrace) -> pd.DataFrame:
    """Mean per step of the step and each critical-path category, old and new (the steps
    ``analysed_steps`` keeps)."""
    a, b = analysed_steps(old), analysed_steps(new)
    rows = []
    for phase in ("duration", *CATEGORIES):
        column = f"{phase}_us"
        before = float(a[column].mean()) if len(a) else np.nan
        after = float(b[column].mean()) if len(b) else np.nan
        delta = after - before
        pct = 100.0 * delta / before if before else np.nan
        rows.append((new.rank, "step" if phase == "duration" else phase, before, after, delta, pct))
    return pd.DataFrame(rows, columns=STEP_COLUMNS)


def diff_traces(
    old_paths: Sequence[Path], new_paths: Sequence[Path], max_memory: Optional[int] = None
) -> TraceDiff:
    """Read both captures (whole: the last step too) and diff each rank both have."""
    old = {t.rank: t for t in load_traces(old_paths, max_memory=max_memory, trim_last_step=False)}
    new = {t.rank: t for t in load_traces(new_paths, max_memory=max_memory, trim_last_step=False)}
    warnings = [
        f"rank {r}: only in {'OLD' if r in old else 'NEW'}; not compared"
        for r in sorted(set(old) ^ set(new))
    ]
    ranks = sorted(set(old) & set(new))
    old_steps = {r: len(step_ranges(old[r])) for r in ranks}
    new_steps = {r: len(step_ranges(new[r])) for r in ranks}
    ops = [diff_ops(old[r], new[r], old_steps[r], new_steps[r]) for r in ranks]
    steps = [diff_steps(old[r], new[r]) for r in ranks]
    for r in ranks:
        if old_steps[r] != new_steps[r]:
            warnings.append(
                f"rank {r}: {old_steps[r]} steps in OLD, {new_steps[r]} in NEW; compare the "
                "per-step columns"
            )
    differences: List[str] = []
    for r, table in zip(ranks, ops):
        differences += [d for d in job_differences(old[r], new[r], table) if d not in differences]
    if differences:
        warnings.insert(
            0,
            f"OLD and NEW look like two different jobs ({'; '.join(differences)}): the changes "
            "below compare unrelated work; diff two captures of the same job",
        )
    tables = {
        "ops": pd.concat(ops, ignore_index=True) if ops else pd.DataFrame(columns=OP_COLUMNS),
        "steps": pd.concat(steps, ignore_index=True)
        if steps
        else pd.DataFrame(columns=STEP_COLUMNS),
    }
    return TraceDiff(tables, old_steps, new_steps, warnings, differences)
