"""Where scaling efficiency goes: the gap between ideal and measured scaling, split by cause.

With the per-GPU batch fixed, ideal scaling keeps the step time of the baseline (the smallest GPU
count of the configuration), so the efficiency lost at N GPUs is the step time gained over the
baseline, as a share of the step at N: ``1 - e ~ (T_N - T_B) / T_N``. Every rank's record says
what its step is made of (``RankResult``): the wait for input (``data_ms``), the step under DDP's
``no_sync`` (compute, input included: ``nosync_step_ms``) and the exposed gradient sync
(``sync_wait_ms`` = step - no_sync). So, each a change from the baseline, in ms per step:

* **exposed communication**: the sync wait of the rank that waits least (it arrives last: its
  wait is the collective itself);
* **straggler wait**: the mean sync wait over the ranks minus that least wait (time spent waiting
  for the last rank);
* **input pipeline**: the mean wait for input batches;
* **interference**: the mean compute per step (no_sync step minus input): the same work running
  slower at scale (shared memory bandwidth, CPU, PCIe, clocks).

Each is turned into points of efficiency (``100 x ms / T_N``); **other** is what the measured
efficiency gap leaves (timing noise, probe-window differences, figures a record lacks), so the
columns add up to the gap exactly.

A part below zero (a cause that seems to have given efficiency back) is noise: each part is a
difference of two cells' figures, and between runs each cell's step time moves by
``noise.DEFAULT_FACTOR`` x its step-time CV (``analysis/noise.py``, measured), so the **noise
band** of a row is ``100 x BAND x DEFAULT_FACTOR x sqrt(cv_N^2 + cv_B^2)`` points: the 95% band
of a part that did not change.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from torchscale.analysis.noise import BAND, DEFAULT_FACTOR
from torchscale.analysis.scaling import label_variants
from torchscale.analysis.training_tables import training_table
from torchscale.results.schema import ResultBase, TrainingResult

CAUSES = ("exposed_comm", "straggler_wait", "input_pipeline", "interference")
FIGURES = ("step_ms", "data_ms", "compute_ms", "least_wait_ms", "mean_wait_ms", "cv")
COLUMNS = [
    "experiment", "model", "variant", "world_size", "baseline_world_size",
    "scaling_efficiency", "gap_pts", "step_ms", "baseline_step_ms",
    *[f"{c}_pts" for c in CAUSES], "other_pts", *[f"{c}_ms" for c in CAUSES],
    "cell_id", "config_key", "noise_pts",
]  # fmt: skip
PARTS = (*CAUSES, "other")
"""The parts of the gap, each a ``<part>_pts`` column."""


def noise_pts(cv: float, base_cv: float) -> float:
    """The 95% noise band, in points, of a part of a row whose cell and baseline have these
    step-time CVs (module docstring); NaN where either is unknown."""
    return float(100.0 * BAND * DEFAULT_FACTOR * math.hypot(cv, base_cv))


def _mean(values: Sequence[Optional[float]]) -> float:
    kept = [v for v in values if v is not None and np.isfinite(v)]
    return float(np.mean(kept)) if kept else float("nan")


def rank_figures(record: TrainingResult) -> Dict[str, float]:
    """The step's parts over the record's ranks (NaN where the record lacks them)."""
    ranks = record.per_rank
    waits = [r.sync_wait_ms for r in ranks]
    known = [w for w in waits if w is not None]
    data = [r.data_ms for r in ranks]
    compute = [
        r.nosync_step_ms - (r.data_ms or 0.0) if r.nosync_step_ms is not None else None
        for r in ranks
    ]
    steps = record.step_time_ms
    return {
        "cv": steps.cv if steps is not None else float("nan"),
        "step_ms": _mean([r.step_time_ms.mean for r in ranks]),
        "data_ms": _mean(data),
        "compute_ms": _mean(compute),
        # one rank has no one to wait for: its exposed sync is none
        "least_wait_ms": float(min(known)) if known else (0.0 if len(ranks) == 1 else np.nan),
        "mean_wait_ms": _mean(known) if known else (0.0 if len(ranks) == 1 else np.nan),
    }


def _causes(cell: Mapping[Any, Any], base: Mapping[Any, Any]) -> Dict[str, float]:
    return {
        "exposed_comm": cell["least_wait_ms"] - base["least_wait_ms"],
        "straggler_wait": (cell["mean_wait_ms"] - cell["least_wait_ms"])
        - (base["mean_wait_ms"] - base["least_wait_ms"]),
        "input_pipeline": cell["data_ms"] - base["data_ms"],
        "interference": cell["compute_ms"] - base["compute_ms"],
    }


def lost_efficiency_table(records: Iterable[ResultBase]) -> pd.DataFrame:
    """One row per configuration and GPU count above its baseline (module docstring)."""
    records = list(records)
    table = label_variants(training_table(records))
    figures = {
        r.cell_id: rank_figures(r)
        for r in records
        if isinstance(r, TrainingResult) and r.status == "ok" and r.per_rank
    }
    table = table[table["cell_id"].isin(list(figures)) & table["scaling_efficiency"].notna()]
    if table.empty:
        return pd.DataFrame(columns=COLUMNS)
    parts = pd.DataFrame([{"cell_id": c, **f} for c, f in figures.items()])
    table = table.merge(parts, on="cell_id")
    # repeats of a cell are averaged, as the scaling table averages them
    group: List[str] = ["experiment", "model", "variant", "config_key", "world_size", "nnodes"]
    keep: Dict[str, Tuple[str, str]] = {f: (f, "mean") for f in (*FIGURES, "scaling_efficiency")}
    cells = table.groupby(group, observed=True, sort=True).agg(
        cell_id=("cell_id", "first"), baseline_world_size=("baseline_world_size", "first"), **keep
    )
    cells = cells.reset_index()
    rows = []
    for cell in cells.to_dict("records"):
        same = cells[(cells["config_key"] == cell["config_key"])]
        base_rows = same[same["world_size"] == cell["baseline_world_size"]]
        if cell["world_size"] == cell["baseline_world_size"] or base_rows.empty:
            continue
        base = base_rows.sort_values("nnodes").to_dict("records")[0]
        causes = _causes(cell, base)
        gap = 100.0 * (1.0 - cell["scaling_efficiency"])
        points = {f"{k}_pts": 100.0 * v / cell["step_ms"] for k, v in causes.items()}
        explained = sum(v for v in points.values() if np.isfinite(v))
        rows.append(
            {
                "experiment": cell["experiment"],
                "model": cell["model"],
                "variant": cell["variant"],
                "world_size": int(cell["world_size"]),
                "baseline_world_size": int(cell["baseline_world_size"]),
                "scaling_efficiency": cell["scaling_efficiency"],
                "gap_pts": gap,
                "step_ms": cell["step_ms"],
                "baseline_step_ms": base["step_ms"],
                **points,
                "other_pts": gap - explained,
                **{f"{k}_ms": v for k, v in causes.items()},
                "cell_id": cell["cell_id"],
                "config_key": cell["config_key"],
                "noise_pts": noise_pts(cell["cv"], base["cv"]),
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)
