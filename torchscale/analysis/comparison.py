"""Compare two runs cell by cell, and tell real changes from run-to-run noise.

Cells are matched by configuration (``config_key``), GPU count and node count; repeats are pooled.
Per cell: the change in throughput and in p95 step time, each with a bootstrap confidence interval
from the per-step samples (resampling both runs' steps with replacement, seeded, so the answer is
reproducible). A change is *beyond noise* when its interval excludes zero. A cell *regresses* when
throughput drops, or p95 step time rises, by more than the threshold and beyond noise; a change
past the threshold whose interval includes zero is reported as *within noise*. Cells without
per-step samples are judged on the threshold alone.

A cell measured (``ok``) in the baseline that the new run did not measure is *lost*, and fails the
gate like a regression: its verdict is what happened to it in the new run (``failed``,
``timeout``, ``oom``, ``invalid``, ``skipped``) or ``missing`` when the new run has no record of
it. (Runs that share no cell at all are not comparable: that is an error, not a list of losses.)
Records that are invalid (``torchscale.results.validity``) are never compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence, Set, Tuple

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from torchscale.analysis.scaling import label_variants
from torchscale.analysis.training_tables import training_table
from torchscale.results.schema import ResultBase, TrainingResult
from torchscale.results.table_scalars import as_float, as_int

REGRESSION = "regression"
IMPROVEMENT = "improvement"
WITHIN_NOISE = "within noise"
UNCHANGED = "unchanged"
MISSING = "missing"
LOST_ORDER = ("failed", "timeout", "oom", "invalid", "skipped")
"""What a lost cell's verdict says, most serious first, when its repeats ended differently."""

KEY = ["config_key", "world_size", "nnodes"]  # 2 x 4 GPUs is not 1 x 8
FloatArray = NDArray[np.float64]
Statistic = Callable[[FloatArray], FloatArray]  # (resamples, steps) -> (resamples,)
CellKey = Tuple[str, int, int]  # KEY's values


@dataclass(frozen=True)
class CompareOptions:
    threshold_pct: float = 5.0
    resamples: int = 2000
    confidence: float = 0.95
    seed: int = 0


@dataclass
class Comparison:
    cells: pd.DataFrame  # one row per matched cell, lost cells included (``lost`` True)
    only_old: pd.DataFrame  # cells of the baseline with no match in the new run
    only_new: pd.DataFrame
    shared: bool = True  # whether the runs have any cell in common, measured or not

    @property
    def regressions(self) -> pd.DataFrame:
        return self.cells[self.cells["verdict"] == REGRESSION]

    @property
    def lost(self) -> pd.DataFrame:
        """Cells measured in the baseline and not in the new run (failed, timeout, missing...)."""
        if "lost" not in self.cells:
            return self.cells.iloc[0:0]
        return self.cells[self.cells["lost"].fillna(False).astype(bool)]

    @property
    def failed(self) -> bool:
        """Whether the gate fails: a regression beyond noise, or a lost cell."""
        return bool(len(self.regressions) or len(self.lost))


def _mean(samples: FloatArray) -> FloatArray:
    return np.asarray(samples.mean(axis=-1), dtype=np.float64)


def _p95(samples: FloatArray) -> FloatArray:
    return np.asarray(np.percentile(samples, 95, axis=-1), dtype=np.float64)


def bootstrap_ratio(
    old: Sequence[float],
    new: Sequence[float],
    statistic: Statistic,
    options: CompareOptions,
) -> Tuple[float, float, float]:
    """``statistic(new) / statistic(old)`` and its bootstrap percentile interval."""
    old_a, new_a = np.asarray(old, dtype=float), np.asarray(new, dtype=float)
    ratio = float(statistic(new_a) / statistic(old_a))
    rng = np.random.default_rng(options.seed)
    old_draws = statistic(old_a[rng.integers(0, len(old_a), (options.resamples, len(old_a)))])
    new_draws = statistic(new_a[rng.integers(0, len(new_a), (options.resamples, len(new_a)))])
    tail = (1 - options.confidence) / 2 * 100
    low, high = np.percentile(new_draws / old_draws, [tail, 100 - tail])
    return ratio, float(low), float(high)


def throughput_interval(
    old_steps: Sequence[float],
    new_steps: Sequence[float],
    options: CompareOptions,
    work_ratio: float = 1.0,
) -> Tuple[float, float, float]:
    """The change in throughput (%) from ``old`` to ``new`` per-step times, and its bootstrap
    interval. Throughput is work per step over the mean step time; ``work_ratio`` is new's work
    per step over old's (1 for the same cell; 2 when new accumulates two micro-batches)."""
    ratio, low, high = bootstrap_ratio(old_steps, new_steps, _mean, options)
    return _pct(work_ratio / ratio), _pct(work_ratio / high), _pct(work_ratio / low)


def paired_rounds_interval(
    old_rounds: Sequence[Sequence[float]],
    new_rounds: Sequence[Sequence[float]],
    options: CompareOptions,
    work_ratio: float = 1.0,
) -> Tuple[float, float, float]:
    """The change in throughput (%) of ``new`` over ``old`` measured in paired rounds (round
    ``r``: one cell of each, run next to each other, per-step times), and its interval.

    The estimate is the geometric mean of the rounds' throughput ratios. The interval is a
    two-stage bootstrap: rounds drawn with replacement, then each drawn round's steps. So it covers
    the drift between runs as well as step-to-step noise, which a bootstrap of pooled steps does
    not see. With one round it reduces to the steps' bootstrap."""
    count = len(old_rounds)
    if count == 0 or count != len(new_rounds):
        raise ValueError("paired rounds need the same number of old and new rounds, at least one")
    rng = np.random.default_rng(options.seed)
    point: List[float] = []
    draws = np.empty((count, options.resamples))
    for index, (old, new) in enumerate(zip(old_rounds, new_rounds)):
        old_a, new_a = np.asarray(old, dtype=float), np.asarray(new, dtype=float)
        point.append(float(np.log(work_ratio * old_a.mean() / new_a.mean())))
        old_means = _mean(old_a[rng.integers(0, len(old_a), (options.resamples, len(old_a)))])
        new_means = _mean(new_a[rng.integers(0, len(new_a), (options.resamples, len(new_a)))])
        draws[index] = np.log(work_ratio * old_means / new_means)
    picks = rng.integers(0, count, (options.resamples, count))
    statistic = draws[picks, np.arange(options.resamples)[:, None]].mean(axis=1)
    tail = (1 - options.confidence) / 2 * 100
    low, high = np.percentile(statistic, [tail, 100 - tail])
    estimate = float(np.exp(np.mean(point)))
    return _pct(estimate), _pct(float(np.exp(low))), _pct(float(np.exp(high)))


def _pooled(
    records: Sequence[ResultBase],
) -> Tuple[pd.DataFrame, Dict[CellKey, List[float]]]:
    """The measured cells' table (repeats averaged) and each cell's pooled step samples."""
    table = label_variants(training_table(records))
    table = table[(table["status"] == "ok") & table["throughput"].notna()]
    samples: Dict[CellKey, List[float]] = {}
    by_id = {r.cell_id: r for r in records if isinstance(r, TrainingResult)}
    for row in table.itertuples():
        key = (str(row.config_key), as_int(row.world_size), as_int(row.nnodes))
        samples.setdefault(key, []).extend(by_id[str(row.cell_id)].step_times_ms
        )
    pooled = table.groupby(KEY, as_index=False).agg(
        model=("model", "first"),
        variant=("variant", "first"),
        batch_size=("batch_size", "first"),
        unit=("unit", "first"),
        throughput=("throughput", "mean"),
        step_ms_p95=("step_ms_p95", "mean"),
        cell_id=("cell_id", "first"),
    )
    return pooled, samples


def _verdict(change: float, beyond_noise: bool, threshold: float) -> str:
    """``change`` is signed so that positive is worse."""
    if abs(change) <= threshold:
        return UNCHANGED
    if not beyond_noise:
        return WITHIN_NOISE
    return REGRESSION if change > 0 else IMPROVEMENT


def _pct(ratio: float) -> float:
    return 100 * (ratio - 1)


def _statuses(records: Sequence[ResultBase]) -> Dict[CellKey, List[str]]:
    """Every training record's status, by the key cells are matched on."""
    table = training_table(records)
    found: Dict[CellKey, List[str]] = {}
    for row in table.itertuples():
        key = (str(row.config_key), as_int(row.world_size), as_int(row.nnodes))
        found.setdefault(key, []).append(str(row.status))
    return found


def _lost_rows(
    old: pd.DataFrame, new_status: Dict[CellKey, List[str]], compared: Set[CellKey]
) -> List[Dict[str, object]]:
    """A row for each cell measured in the baseline that the new run did not measure."""
    rows: List[Dict[str, object]] = []
    for row in old.itertuples():
        key = (str(row.config_key), as_int(row.world_size), as_int(row.nnodes))
        statuses = new_status.get(key, [])
        if key in compared and not any(s in LOST_ORDER[:4] for s in statuses):
            continue  # measured in the new run (no repeat failed): compared above
        bad = [s for s in LOST_ORDER if s in statuses]
        verdict = bad[0] if bad else MISSING
        nan = float("nan")
        rows.append(
            {
                "model": row.model,
                "variant": row.variant,
                "world_size": as_int(row.world_size),
                "nnodes": as_int(row.nnodes),
                "unit": row.unit,
                "throughput_old": row.throughput,
                "throughput_new": nan,
                "throughput_change_pct": nan,
                "throughput_ci_low_pct": nan,
                "throughput_ci_high_pct": nan,
                "p95_old_ms": row.step_ms_p95,
                "p95_new_ms": nan,
                "p95_change_pct": nan,
                "p95_ci_low_pct": nan,
                "p95_ci_high_pct": nan,
                "beyond_noise": False,
                "verdict": verdict,
                "lost": True,
                "new_status": ", ".join(sorted(set(statuses))) or MISSING,
                "cell_id_old": row.cell_id,
                "cell_id_new": None,
                "config_key": row.config_key,
            }
        )
    return rows


def compare_runs(
    old_records: Sequence[ResultBase],
    new_records: Sequence[ResultBase],
    options: CompareOptions = CompareOptions(),
) -> Comparison:
    old, old_samples = _pooled(old_records)
    new, new_samples = _pooled(new_records)
    new_status = _statuses(new_records)
    old_keys = set(_statuses(old_records))
    merged = new.merge(old, on=KEY, suffixes=("_new", "_old"), how="outer", indicator=True)
    rows: List[Dict[str, object]] = []
    for row in merged[merged["_merge"] == "both"].itertuples():
        key = (str(row.config_key), as_int(row.world_size), as_int(row.nnodes))
        throughput_change = _pct(as_float(row.throughput_new) / as_float(row.throughput_old))
        p95_change = _pct(as_float(row.step_ms_p95_new) / as_float(row.step_ms_p95_old))
        old_steps, new_steps = old_samples.get(key, []), new_samples.get(key, [])
        if old_steps and new_steps:
            _, tp_low, tp_high = throughput_interval(old_steps, new_steps, options)
            _, p95_low, p95_high = bootstrap_ratio(old_steps, new_steps, _p95, options)
            p95_low, p95_high = _pct(p95_low), _pct(p95_high)
            tp_noise = not (tp_low <= 0 <= tp_high)
            p95_noise = not (p95_low <= 0 <= p95_high)
        else:  # no samples: the threshold alone decides
            tp_low = tp_high = p95_low = p95_high = float("nan")
            tp_noise = p95_noise = True
        verdicts = [
            _verdict(-throughput_change, tp_noise, options.threshold_pct),
            _verdict(p95_change, p95_noise, options.threshold_pct),
        ]
        order = [REGRESSION, IMPROVEMENT, WITHIN_NOISE, UNCHANGED]
        rows.append(
            {
                "model": row.model_new,
                "variant": row.variant_new,
                "world_size": as_int(row.world_size),
                "nnodes": as_int(row.nnodes),
                "unit": row.unit_new,
                "throughput_old": row.throughput_old,
                "throughput_new": row.throughput_new,
                "throughput_change_pct": throughput_change,
                "throughput_ci_low_pct": tp_low,
                "throughput_ci_high_pct": tp_high,
                "p95_old_ms": row.step_ms_p95_old,
                "p95_new_ms": row.step_ms_p95_new,
                "p95_change_pct": p95_change,
                "p95_ci_low_pct": p95_low,
                "p95_ci_high_pct": p95_high,
                "beyond_noise": bool(tp_noise or p95_noise),
                "verdict": min(verdicts, key=order.index),
                "lost": False,
                "new_status": "ok",
                "cell_id_old": row.cell_id_old,
                "cell_id_new": row.cell_id_new,
                "config_key": row.config_key,
            }
        )
    compared = {(str(r["config_key"]), as_int(r["world_size"]), as_int(r["nnodes"])) for r in rows}
    shared = bool(old_keys & set(new_status))
    if shared:
        lost = _lost_rows(old, new_status, compared)
        lost_keys = {(r["config_key"], r["world_size"], r["nnodes"]) for r in lost}
        rows = [r for r in rows if (r["config_key"], r["world_size"], r["nnodes"]) not in lost_keys]
        rows += lost
    cells = pd.DataFrame(rows)
    if cells.empty:
        cells = pd.DataFrame(columns=["model", "variant", "world_size", "verdict", "lost"])
    unmatched_columns = ["model", "variant", "world_size", "cell_id"]
    lost_keys = set()
    if not cells.empty:
        lost_keys = {(r.config_key, r.world_size, r.nnodes) for r in cells.itertuples() if r.lost}

    def unmatched(side: str, frame: pd.DataFrame) -> pd.DataFrame:
        keys = merged[merged["_merge"] == side][KEY]
        kept = [tuple(k) not in lost_keys for k in keys.itertuples(index=False)]
        keys = keys.loc[np.asarray(kept, dtype=bool)]
        return frame.merge(keys, on=KEY)[unmatched_columns]

    return Comparison(cells, unmatched("right_only", old), unmatched("left_only", new), shared)
