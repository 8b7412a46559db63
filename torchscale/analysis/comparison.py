"""Compare two runs cell by cell, and tell real changes from run-to-run noise.

Cells are matched by configuration (``config_key``), GPU count and node count; repeats are
averaged. Per cell: the change in throughput and in p95 step time, each with an interval from
the between-run noise model of ``analysis.noise`` (repeats where both runs have them, else a
measured, stated or default floor scaled to the cell), never narrower than the bootstrap of the
steps themselves (``analysis.bootstrap``, seeded, so the answer is reproducible). The intervals
are simultaneous over every figure compared. A change is *beyond noise* when its interval
excludes zero. A cell *regresses* when throughput drops, or p95 step time rises, by more than the
threshold and beyond noise; a change past the threshold whose interval includes zero is *within
noise*. So a single run per side is never called regressed or improved within the floor. Cells
without step times have nothing to scale a floor by and are judged on the threshold alone.

A cell measured (``ok``) in the baseline that the new run did not measure is *lost*, and fails the
gate like a regression: its verdict is what happened to it in the new run (``failed``,
``timeout``, ``oom``, ``invalid``, ``skipped``) or ``missing`` when the new run has no record of
it. (Runs that share no cell at all are not comparable: that is an error, not a list of losses.)
Records that are invalid (``torchscale.results.validity``: a non-finite figure, a diverged loss)
are never compared. A cell measured on a busy host (``analysis.busy_host``) is *not judged* unless
the noise is stated; a gate with such cells passes only when the user allows it
(``allow_unjudged``), and says how many cells it judged.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from torchscale.analysis import noise
from torchscale.analysis.bootstrap import MEAN, P95, Statistic, bootstrap_ratio
from torchscale.analysis.busy_host import (
    NOT_JUDGED,
    busy_wait,
    gate_line,
    verdict_allowed,
    wait_words,
)
from torchscale.analysis.lost_cells import CellKey, lost_rows, statuses
from torchscale.analysis.scaling import label_variants
from torchscale.analysis.training_tables import training_table
from torchscale.errors import TorchscaleError
from torchscale.measures.table_scalars import as_float, as_int
from torchscale.results.schema import ResultBase, TrainingResult

REGRESSION = "regression"
IMPROVEMENT = "improvement"
WITHIN_NOISE = "within noise"
UNCHANGED = "unchanged"
FIGURES = ("throughput", "p95")

KEY = ["config_key", "world_size", "nnodes"]  # 2 x 4 GPUs is not 1 x 8
Repeats = Dict[str, List[float]]
"""A cell's throughput, p95 and step-time CV, one per repeat; and the CPU-wait shares of the
repeats that ran on an oversubscribed host (``analysis.cpu_load``)."""


@dataclass(frozen=True)
class CompareOptions:
    threshold_pct: float = 5.0
    resamples: int = 2000
    confidence: float = 0.95  # for the set of figures compared, not each
    seed: int = 0
    noise_floor_pct: Optional[float] = None  # stated: overrides repeats and the default
    allow_unjudged: bool = False  # the gate passes on the judged cells alone (said so)

    def checked(self) -> CompareOptions:
        """These options, or a TorchscaleError naming the one a user gave wrong (every caller:
        ``compare``, ``report --baseline``, ``torchscale.compare``)."""
        if not (math.isfinite(self.threshold_pct) and self.threshold_pct >= 0):
            raise TorchscaleError(f"--threshold {self.threshold_pct:g} must be a number >= 0")
        if self.resamples < 100:
            raise TorchscaleError(f"--resamples {self.resamples} must be at least 100")
        floor = self.noise_floor_pct
        if floor is not None and not (math.isfinite(floor) and 0 <= floor < 1000):
            raise TorchscaleError(
                f"--noise-floor {floor:g} must be a % between 0 and 1000 (leave it out to use "
                "the runs' repeats or the default floor)"
            )
        return self


@dataclass
class Comparison:
    cells: pd.DataFrame  # one row per matched cell, lost cells included (``lost`` True)
    only_old: pd.DataFrame  # cells of the baseline with no match in the new run
    only_new: pd.DataFrame
    shared: bool = True  # whether the runs have any cell in common, measured or not
    spreads: Dict[str, noise.Spread] = field(default_factory=dict)  # per figure
    confidence: float = 0.95
    figures: int = 0  # figures compared (two per matched cell): the intervals' family
    allow_unjudged: bool = False

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
    def judged_nothing(self) -> bool:
        """Whether no matched cell could be judged (each was measured while other processes
        held the cores) and nothing was lost: a gate that measured nothing must not pass."""
        if self.cells.empty or "noise_model" not in self.cells or len(self.lost):
            return False
        return bool((self.cells["noise_model"] == noise.OVERSUBSCRIBED).all())

    @property
    def unjudged(self) -> pd.DataFrame:
        """Matched cells measured on a busy host with no stated noise: verdict "not judged"."""
        if "verdict" not in self.cells or self.cells.empty:
            return self.cells.iloc[0:0]
        return self.cells[self.cells["verdict"] == NOT_JUDGED]

    @property
    def judged_count(self) -> int:
        """Matched cells the gate judged (lost cells count: their loss is the verdict)."""
        return len(self.cells) - len(self.unjudged)

    @property
    def partly_unjudged(self) -> bool:
        """Whether the gate must not pass: some cells were not judged (a regression in one would
        go unseen) and the user did not allow it."""
        return bool(len(self.unjudged)) and not self.allow_unjudged

    @property
    def passed(self) -> bool:
        """Whether the gate passes: nothing regressed or lost, at least one cell judged, and every
        cell judged unless the user allowed otherwise."""
        return not (self.failed or self.judged_nothing or self.partly_unjudged)

    def gate_line(self) -> Optional[str]:
        """How many cells the gate judged, when it did not judge them all; None when it did."""
        if not len(self.unjudged):
            return None
        return gate_line(self.judged_count, len(self.cells), self.allow_unjudged)

    @property
    def failed(self) -> bool:
        """Whether the gate fails: a regression beyond noise, or a lost cell."""
        return bool(len(self.regressions) or len(self.lost))

    @property
    def noise_models(self) -> Dict[str, int]:
        """How many compared cells each noise model decided."""
        if "noise_model" not in self.cells:
            return {}
        return dict(Counter(str(m) for m in self.cells["noise_model"].dropna()))

    def noise(self) -> Dict[str, object]:
        """What decided the verdicts, for ``--json`` and the report."""
        return {
            "models": self.noise_models,
            "throughput": self.spreads["throughput"].describe() if self.spreads else None,
            "p95": self.spreads["p95"].describe() if self.spreads else None,
            "confidence": self.confidence,
            "figures": self.figures,
            "line": self.noise_line(),
            "judged": self.judged_count,
            "not_judged": len(self.unjudged),
            "allow_unjudged": self.allow_unjudged,
            "gate_line": self.gate_line(),
        }

    def noise_line(self) -> str:
        """One sentence: which noise model decided, for the console and the report."""
        models = self.noise_models
        if not models or not self.spreads:
            return "Noise model: none (no cell measured on both sides)."
        counts = ", ".join(f"{name} for {count} cell(s)" for name, count in models.items())
        throughput, p95 = (self.spreads[figure].describe() for figure in FIGURES)
        how = throughput if throughput == p95 else f"throughput: {throughput}; p95: {p95}"
        line = (
            f"Noise model: {counts}. {how[0].upper()}{how[1:]}. Intervals are simultaneous "
            f"{self.confidence:.0%} over the {self.figures} figures compared."
        )
        if noise.OVERSUBSCRIBED in models:
            waited = float(self.cells["cpu_wait_share"].max())
            line += (
                f" {NOT_JUDGED.capitalize()}: {models[noise.OVERSUBSCRIBED]} cell(s) measured on "
                f"a busy host ({wait_words(waited)}); rerun them on a quiet node."
            )
        return line


def _pooled(
    records: Sequence[ResultBase],
) -> Tuple[pd.DataFrame, Dict[CellKey, List[float]], Dict[CellKey, Repeats]]:
    """The measured cells' table (repeats averaged), each cell's pooled step samples and its
    figures repeat by repeat."""
    table = label_variants(training_table(records))
    table = table[(table["status"] == "ok") & table["throughput"].notna()]
    samples: Dict[CellKey, List[float]] = {}
    repeats: Dict[CellKey, Repeats] = {}
    by_id = {r.cell_id: r for r in records if isinstance(r, TrainingResult)}
    for row in table.itertuples():
        key = (str(row.config_key), as_int(row.world_size), as_int(row.nnodes))
        record = by_id[str(row.cell_id)]
        samples.setdefault(key, []).extend(record.step_times_ms)
        figures = repeats.setdefault(key, {"throughput": [], "p95": [], "cv": [], "waited": []})
        figures["throughput"].append(as_float(row.throughput))
        figures["p95"].append(as_float(row.step_ms_p95))
        figures["cv"].append(as_float(row.step_ms_cv))
        waited = busy_wait([record])
        if waited is not None:
            figures["waited"].append(waited)
    pooled = table.groupby(KEY, as_index=False).agg(
        model=("model", "first"),
        variant=("variant", "first"),
        batch_size=("batch_size", "first"),
        unit=("unit", "first"),
        throughput=("throughput", "mean"),
        step_ms_p95=("step_ms_p95", "mean"),
        cell_id=("cell_id", "first"),
    )
    return pooled, samples, repeats


def _spreads(options: CompareOptions, *sides: Dict[CellKey, Repeats]) -> Dict[str, noise.Spread]:
    """Per figure, the noise spread that decides (``analysis.noise.choose``); repeats measured on
    an oversubscribed host measure the other processes, not the node: left out."""
    cells = [cell for side in sides for cell in side.values() if not cell["waited"]]
    return {
        figure: noise.choose(
            options.noise_floor_pct, [(cell[figure], noise.rms(cell["cv"])) for cell in cells]
        )
        for figure in FIGURES
    }


def _verdict(change: float, beyond_noise: bool, threshold: float) -> str:
    """``change`` is signed so that positive is worse."""
    if abs(change) <= threshold:
        return UNCHANGED
    if not beyond_noise:
        return WITHIN_NOISE
    return REGRESSION if change > 0 else IMPROVEMENT


def _pct(ratio: float) -> float:
    return 100 * (ratio - 1)


def _judged(
    ratios: Dict[str, float],
    cells: Tuple[Repeats, Repeats],
    steps: Tuple[List[float], List[float]],
    spreads: Dict[str, noise.Spread],
    options: CompareOptions,
) -> Dict[str, object]:
    """One matched cell's intervals and verdicts (``options.confidence``: each figure's)."""
    old_cell, new_cell = cells
    repeats = (len(old_cell["throughput"]), len(new_cell["throughput"]))
    cv = noise.rms(old_cell["cv"] + new_cell["cv"])
    waited = max(old_cell["waited"] + new_cell["waited"], default=None)
    # measured while other processes held the cores: not judged, unless the user states the
    # noise (a stated floor covers a busy node too)
    stated = spreads["throughput"].kind == noise.STATED_FLOOR
    unjudged = not verdict_allowed(waited is not None, stated)
    judged: Dict[str, object] = {
        "noise_model": (
            noise.OVERSUBSCRIBED
            if unjudged
            else noise.cell_model(spreads["throughput"], *repeats, cv)
        ),
        "repeats_old": repeats[0],
        "repeats_new": repeats[1],
        "step_cv": cv,
        "cpu_wait_share": waited,
    }
    statistics: Dict[str, Statistic] = {"throughput": MEAN, "p95": P95}
    verdicts = []
    for figure in FIGURES:
        spread = spreads[figure]
        bootstrap = None
        if steps[0] and steps[1] and not unjudged:
            point, low, high = bootstrap_ratio(*steps, statistics[figure], options)
            # Throughput is work over the mean step: its ratio is the steps' inverted.
            bootstrap = (1 / point, 1 / high, 1 / low) if figure == "throughput" else (
                point, low, high)  # fmt: skip
        sigma = spread.sigma_for(cv)
        low_ratio, high_ratio = noise.change_interval(
            ratios[figure], spread, cv, repeats, options.confidence, bootstrap
        )
        decided = sigma is not None or bootstrap is not None
        beyond = not (low_ratio <= 1 <= high_ratio) if decided else True
        worse = _pct(ratios[figure]) * (-1 if figure == "throughput" else 1)
        verdict = _verdict(worse, beyond, options.threshold_pct)
        if unjudged:
            # Measured on a busy host: the figures say as much about the other processes as
            # about the change. Shown, with no interval and a verdict of their own.
            decided = beyond = False
            verdict = NOT_JUDGED
        verdicts.append(verdict)
        nan = float("nan")
        judged.update(
            {
                f"{figure}_ci_low_pct": _pct(low_ratio) if decided else nan,
                f"{figure}_ci_high_pct": _pct(high_ratio) if decided else nan,
                f"{figure}_noise_pct": noise.floor_pct(sigma) if sigma is not None else nan,
                f"{figure}_beyond_noise": beyond,
                f"{figure}_verdict": verdict,
            }
        )
    order = [REGRESSION, IMPROVEMENT, NOT_JUDGED, WITHIN_NOISE, UNCHANGED]
    judged["beyond_noise"] = bool(judged["throughput_beyond_noise"] or judged["p95_beyond_noise"])
    judged["verdict"] = min(verdicts, key=order.index)
    return judged


def compare_runs(
    old_records: Sequence[ResultBase],
    new_records: Sequence[ResultBase],
    options: CompareOptions = CompareOptions(),
) -> Comparison:
    old, old_samples, old_repeats = _pooled(old_records)
    new, new_samples, new_repeats = _pooled(new_records)
    new_status = statuses(new_records)
    old_keys = set(statuses(old_records))
    merged = new.merge(old, on=KEY, suffixes=("_new", "_old"), how="outer", indicator=True)
    both = merged[merged["_merge"] == "both"]
    spreads = _spreads(options, old_repeats, new_repeats)
    figures = len(FIGURES) * len(both)
    # Bonferroni: each figure's interval at 1 - alpha/m, so the set holds at the confidence.
    each = replace(options, confidence=1 - (1 - options.confidence) / max(1, figures))
    rows: List[Dict[str, object]] = []
    for row in both.itertuples():
        key = (str(row.config_key), as_int(row.world_size), as_int(row.nnodes))
        ratios = {
            "throughput": as_float(row.throughput_new) / as_float(row.throughput_old),
            "p95": as_float(row.step_ms_p95_new) / as_float(row.step_ms_p95_old),
        }
        judged = _judged(
            ratios,
            (old_repeats[key], new_repeats[key]),
            (old_samples.get(key, []), new_samples.get(key, [])),
            spreads,
            each,
        )
        rows.append(
            {
                "model": row.model_new,
                "variant": row.variant_new,
                "world_size": as_int(row.world_size),
                "nnodes": as_int(row.nnodes),
                "unit": row.unit_new,
                "throughput_old": row.throughput_old,
                "throughput_new": row.throughput_new,
                "throughput_change_pct": _pct(ratios["throughput"]),
                "p95_old_ms": row.step_ms_p95_old,
                "p95_new_ms": row.step_ms_p95_new,
                "p95_change_pct": _pct(ratios["p95"]),
                **judged,
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
        lost = lost_rows(old, new_status, compared)
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

    return Comparison(
        cells,
        unmatched("right_only", old),
        unmatched("left_only", new),
        shared,
        spreads,
        options.confidence,
        figures,
        options.allow_unjudged,
    )
