"""The history in other tools' formats: Bencher's metric format (BMF JSON, one run) and Apache
Otava's CSV layout (one row per run: its time, its attributes, one column per series and
metric), so a team already on either can feed it from torchscale."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Dict, List, Optional

from torchscale.history.database import HistoryStore, SeriesEntry
from torchscale.history.ingest import METRICS, SOFTWARE

BMF_MEASURES = {"throughput": "throughput", "p95": "p95-step-time-ms", "busbw": "busbw-gbps"}
"""Each metric's Bencher measure slug."""


def series_label(series: SeriesEntry) -> str:
    """A series in one line: ``gpt2-tiny b8 x2 fp32 [CPU process (x86_64) x2 x1 nodes]``."""
    batch = f" b{series.batch}" if series.batch is not None else ""
    return f"{series.name}{batch} x{series.gpus} {series.precision} [{series.hardware}]"


def bmf(store: HistoryStore, run_id: Optional[int] = None) -> Dict[str, Dict[str, Any]]:
    """One run (the latest unless ``run_id``) as BMF: ``{benchmark: {measure: {"value": v}}}``;
    a benchmark is a series, its measures the run's figures of it."""
    runs = store.runs()
    if not runs:
        return {}
    wanted = runs[-1]["id"] if run_id is None else run_id
    by_id = {s_id: entry for s_id, entry in series_by_id(store).items()}
    document: Dict[str, Dict[str, Any]] = defaultdict(dict)
    for metric in METRICS:
        for point in store.points(metric):
            if point.run_id == wanted:
                document[series_label(by_id[point.series_id])][BMF_MEASURES[metric]] = {
                    "value": point.value
                }
    return dict(document)


def otava_rows(store: HistoryStore) -> List[Dict[str, Any]]:
    """Otava's CSV rows: ``time``, ``run``, ``experiment``, the software attributes, then one
    column per series and metric (``<series> <metric>``), blank where a run lacks it."""
    by_id = series_by_id(store)
    rows: Dict[int, Dict[str, Any]] = {}
    for run in store.runs():
        row: Dict[str, Any] = {
            "time": run["started_at"],
            "run": run["id"],
            "experiment": run["experiment"],
        }
        row.update({name: run["attributes"].get(name) for name in SOFTWARE})
        rows[run["id"]] = row
    for metric in METRICS:
        for point in store.points(metric):
            rows[point.run_id][f"{series_label(by_id[point.series_id])} {metric}"] = point.value
    return list(rows.values())


def series_by_id(store: HistoryStore) -> Dict[int, SeriesEntry]:
    keys = store.series_ids()
    entries = {entry.key: entry for entry in store.all_series()}
    return {s_id: entries[key] for s_id, key in keys.items()}
