"""Change points of every series in a store, each with what changed in the runs' fingerprint.

A change's cause is the difference between the attributes of the last run before it and the
first run after it: a software version (``NCCL 2.27.3 -> 2.28.9``) or a host that joined or
left. A regression is a change for the worse (throughput or busbw down, p95 step time up); it is
*open* while it is the series' latest change (no recovery after it), and it is only reported
once :data:`~torchscale.history.changes.MIN_SIZE` runs after it agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from torchscale.history.changes import WINDOW, change_points
from torchscale.history.database import HistoryStore, SeriesEntry

HIGHER_IS_BETTER = {
    "throughput": True,
    "busbw": True,
    "efficiency": True,
    "p95": False,
    "sync_stall": False,
}
"""Which way each benchmark and profile metric improves (a validate probe's way is its own,
``hardware.expected_figures.PROBES``)."""


def higher_is_better(metric: str) -> bool:
    from torchscale.hardware.expected_figures import PROBES

    if metric in PROBES:
        return PROBES[metric].higher_is_better
    return HIGHER_IS_BETTER.get(metric, True)


SOFTWARE_LABELS = {
    "torch": "torch",
    "cuda": "CUDA",
    "nccl": "NCCL",
    "driver": "driver",
    "torchscale": "torchscale",
    "python": "Python",
}


def fingerprint_changes(before: Dict[str, Any], after: Dict[str, Any]) -> List[str]:
    """What differs between two runs' attributes, in words."""
    found = []
    for key, label in SOFTWARE_LABELS.items():
        old, new = before.get(key), after.get(key)
        if old != new:
            shown = ["none" if value is None else str(value) for value in (old, new)]
            found.append(f"{label} {shown[0]} → {shown[1]}")
    old_hosts, new_hosts = set(before.get("hosts") or []), set(after.get("hosts") or [])
    found += [f"node {host} joined" for host in sorted(new_hosts - old_hosts)]
    found += [f"node {host} left" for host in sorted(old_hosts - new_hosts)]
    return found


@dataclass(frozen=True)
class ChangePoint:
    series: SeriesEntry
    metric: str
    run_id: int
    experiment: str
    started_at: str
    position: int  # the first run after the change, counted from 1 in the series
    runs_after: int
    before: float
    after: float
    before_half_width: float
    after_half_width: float
    magnitude: float  # after / before - 1
    pvalue: float
    regression: bool
    cause: List[str]
    open: bool = False  # a regression that is the series' latest change

    def as_json(self) -> Dict[str, Any]:
        return {
            "series": self.series.key,
            "name": self.series.name,
            "kind": self.series.kind,
            "batch": self.series.batch,
            "gpus": self.series.gpus,
            "nnodes": self.series.nnodes,
            "precision": self.series.precision,
            "hardware": self.series.hardware,
            "metric": self.metric,
            "run": self.run_id,
            "experiment": self.experiment,
            "started_at": self.started_at,
            "position": self.position,
            "runs_after": self.runs_after,
            "before": self.before,
            "before_interval": [
                self.before - self.before_half_width,
                self.before + self.before_half_width,
            ],
            "after": self.after,
            "after_interval": [
                self.after - self.after_half_width,
                self.after + self.after_half_width,
            ],
            "magnitude": self.magnitude,
            "pvalue": self.pvalue,
            "regression": self.regression,
            "open": self.open,
            "cause": self.cause,
        }


def find_changes(
    store: HistoryStore,
    metric: str,
    since: Optional[str] = None,
    max_pvalue: Optional[float] = None,
    window: int = WINDOW,
) -> List[ChangePoint]:
    """Every change point of ``metric`` in every series of ``store`` (runs from ``since`` on).
    The points come in one query; numpy orders them by series and run date (the runs' order,
    oldest first) and cuts them into series."""
    series = {s_id: entry for s_id, entry in zip(*_series_by_id(store))}
    ordered_runs = store.runs(since)
    runs = {row["id"]: row for row in ordered_runs}
    series_col, run_col, value_col = store.point_columns(metric)
    if not len(value_col) or not runs:
        return []
    rank = np.full(max(int(run_col.max()), max(runs)) + 1, -1, dtype=np.int64)
    rank[np.fromiter(runs, dtype=np.int64, count=len(runs))] = np.arange(len(ordered_runs))
    ranks = rank[run_col]
    kept = ranks >= 0  # runs before ``since`` are left out
    order = np.lexsort((ranks[kept], series_col[kept]))
    series_col, run_col = series_col[kept][order], run_col[kept][order]
    value_col = value_col[kept][order]
    cuts = (np.flatnonzero(np.diff(series_col)) + 1).tolist()
    better_up = higher_is_better(metric)
    found: List[ChangePoint] = []
    for start, end in zip([0, *cuts], [*cuts, len(series_col)]):
        series_id = int(series_col[start])
        run_ids: List[int] = run_col[start:end].tolist()
        splits = change_points(value_col[start:end], max_pvalue=max_pvalue, window=window)
        series_found = []
        for split in splits:
            run = runs[run_ids[split.at]]
            worse = split.after < split.before if better_up else split.after > split.before
            series_found.append(
                ChangePoint(
                    series=series[series_id],
                    metric=metric,
                    run_id=run_ids[split.at],
                    experiment=str(run.get("experiment", "")),
                    started_at=str(run["started_at"]),
                    position=split.at + 1,
                    runs_after=len(run_ids) - split.at,
                    before=split.before,
                    after=split.after,
                    before_half_width=split.before_half_width,
                    after_half_width=split.after_half_width,
                    magnitude=split.magnitude,
                    pvalue=split.pvalue,
                    regression=worse,
                    cause=_causes(run_ids, runs, split.at),
                )
            )
        if series_found and series_found[-1].regression:
            last = series_found[-1]
            series_found[-1] = ChangePoint(**{**last.__dict__, "open": True})
        found += series_found
    return found


def _causes(run_ids: Sequence[int], runs: Dict[int, Dict[str, Any]], at: int) -> List[str]:
    """What changed in the fingerprint at the change (between runs ``at - 1`` and ``at``), and
    at the boundaries next to it, which name their run: at the runs' noise a change is placed
    one run early or late about a quarter of the time (docs/history.md)."""

    def attributes(index: int) -> Dict[str, Any]:
        found: Dict[str, Any] = runs.get(run_ids[index], {}).get("attributes", {})
        return found

    found = fingerprint_changes(attributes(at - 1), attributes(at))
    for boundary in (at - 1, at + 1):
        if 1 <= boundary < len(run_ids):
            found += [
                f"{change} (at run {boundary + 1})"
                for change in fingerprint_changes(attributes(boundary - 1), attributes(boundary))
            ]
    return found


def _series_by_id(store: HistoryStore) -> Sequence[Sequence[Any]]:
    ids = {key: s_id for s_id, key in store.series_ids().items()}
    entries = store.all_series()
    return [ids[e.key] for e in entries], entries
