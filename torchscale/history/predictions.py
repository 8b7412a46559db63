"""The closed prediction loop: what ``project`` predicted for a scale, against what a run of
that scale measured, with the error, and a rolling error per experiment.

A prediction names its cell by experiment, model, GPU count and nodes (``prediction_key``); the
measurement is the throughput point of a series of that model, GPU count and nodes in a run of
the same experiment: the first run after the prediction, else (``project --holdout`` predicts a
count the folder already measured) the latest one before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from torchscale.history.database import HistoryStore, StoredPoint
from torchscale.history.ingest import digest

ROLLING = 5
"""Past predictions per experiment that the rolling error averages."""


def prediction_key(experiment: str, model: str, gpus: int, nodes: int) -> str:
    return digest(["prediction", experiment, model, int(gpus), int(nodes)], 32)


@dataclass(frozen=True)
class Checked:
    experiment: str
    model: str
    gpus: int
    nodes: int
    made_at: str
    predicted: float
    low: Optional[float]
    high: Optional[float]
    measured: Optional[float]
    measured_at: Optional[str]
    error: Optional[float]  # predicted / measured - 1
    rolling_error: Optional[float]  # mean |error| of the experiment's last ROLLING checked

    def as_json(self) -> Dict[str, Any]:
        return dict(self.__dict__)


def checked_predictions(store: HistoryStore) -> List[Checked]:
    runs = {row["id"]: row for row in store.runs()}
    series = {s.key: s for s in store.all_series()}
    ids = store.series_ids()
    measured: Dict[str, List[StoredPoint]] = {}
    for stored in store.points("throughput"):
        entry = series[ids[stored.series_id]]
        experiment = runs[stored.run_id]["experiment"]
        key = prediction_key(experiment, entry.name, entry.gpus, entry.nnodes)
        measured.setdefault(key, []).append(stored)
    found: List[Checked] = []
    errors: Dict[str, List[float]] = {}
    for row in store.predictions():
        if row["metric"] != "throughput":
            continue
        meta = runs[row["run_id"]]["attributes"].get("predictions", {}).get(row["series_key"], {})
        candidates = measured.get(row["series_key"], [])
        after = [p for p in candidates if p.started_at >= row["started_at"]]
        before = [p for p in candidates if p.started_at < row["started_at"]]
        point: Optional[StoredPoint] = after[0] if after else (before[-1] if before else None)
        error = row["predicted"] / point.value - 1.0 if point is not None else None
        experiment = str(row["experiment"])
        if error is not None:
            errors.setdefault(experiment, []).append(abs(error))
        recent = errors.get(experiment, [])[-ROLLING:]
        found.append(
            Checked(
                experiment=experiment,
                model=str(meta.get("model", "?")),
                gpus=int(meta.get("gpus", 0)),
                nodes=int(meta.get("nodes", 0)),
                made_at=str(row["started_at"]),
                predicted=float(row["predicted"]),
                low=row["low"],
                high=row["high"],
                measured=point.value if point is not None else None,
                measured_at=point.started_at if point is not None else None,
                error=error,
                rolling_error=sum(recent) / len(recent) if recent else None,
            )
        )
    return found
