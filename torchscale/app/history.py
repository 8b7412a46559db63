"""Use cases of ``torchscale history`` and the recording of a run at its end.

The history's location is ``--history PATH_OR_URL``, else ``TORCHSCALE_HISTORY``, else the
config's ``history:`` (a file path or ``sqlite:///...``: SQLite; ``postgresql://...``: a server).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from torchscale.app import Notify
from torchscale.errors import TorchscaleError

if TYPE_CHECKING:
    from torchscale.history.database import HistoryStore
    from torchscale.history.series_changes import ChangePoint

HISTORY_ENV = "TORCHSCALE_HISTORY"


def history_location(option: Optional[str], configured: Optional[str] = None) -> Optional[str]:
    """Where the history is: the option, else the environment variable, else the config's."""
    return option or os.environ.get(HISTORY_ENV) or configured or None


def required_location(option: Optional[str]) -> str:
    location = history_location(option)
    if location is None:
        raise TorchscaleError(f"no history given: pass --history PATH_OR_URL or set {HISTORY_ENV}")
    return location


def open_store(location: str) -> HistoryStore:
    from torchscale.history.database import HistoryStore

    return HistoryStore(location)


@dataclass
class IngestOutcome:
    location: str
    added: List[Path] = field(default_factory=list)
    already: List[Path] = field(default_factory=list)


def ingest(history: Optional[str], folders: Sequence[Path]) -> IngestOutcome:
    """Add ``folders`` (experiment folders, folders of them, validate's records folder or the
    output folder that holds it) to the history (``--history``, else TORCHSCALE_HISTORY). Every
    folder is read and checked before anything is written; each run lands in its own
    transaction."""
    from torchscale.history.database import RunEntry
    from torchscale.history.ingest import read_run, read_validate, validate_folder
    from torchscale.results.store import find_experiments

    location = required_location(history)
    entries: List[Tuple[Path, RunEntry]] = []
    for folder in folders:
        records = None if folder.is_symlink() else validate_folder(folder)
        found = [folder] if folder.is_symlink() else find_experiments(folder)
        if not found and records is None:
            found = [folder]  # refused by read_run with the reason
        entries += [(experiment, read_run(experiment)) for experiment in found]
        if records is not None:
            entries += [(Path(run.source), run) for run in read_validate(records)]
    store = open_store(location)
    outcome = IngestOutcome(store.shown)
    try:
        for folder, entry in entries:
            (outcome.added if store.add_run(entry) else outcome.already).append(folder)
    finally:
        store.close()
    return outcome


def record_run(location: Optional[str], experiment: Path, notify: Notify) -> None:
    """At the end of a run: add its folder to the history, when one is configured. A history
    that cannot take it is a warning: the run's own results are already safe."""
    if location is None:
        return
    try:
        outcome = ingest(location, [experiment])
    except TorchscaleError as exc:
        notify(f"> [WARN] not recorded in the history: {exc}")
        return
    notify(f"> Recorded in the history at {outcome.location}")


@dataclass
class ChangesOutcome:
    location: str
    metric: str
    changes: List[ChangePoint]
    series: int

    @property
    def open_regressions(self) -> List[ChangePoint]:
        return [c for c in self.changes if c.open]


def since_date(since: Optional[str]) -> Optional[str]:
    """``30d``, ``12h``, ``2w`` or an ISO date as the ISO timestamp runs are compared with."""
    from datetime import datetime, timedelta, timezone

    if since is None:
        return None
    units = {"h": 3600, "d": 86400, "w": 7 * 86400}
    text = since.strip().lower()
    if text[:-1].isdigit() and text[-1:] in units:
        seconds = int(text[:-1]) * units[text[-1]]
        return (datetime.now(timezone.utc) - timedelta(seconds=seconds)).isoformat()
    try:
        return datetime.fromisoformat(since).isoformat()
    except ValueError:
        raise TorchscaleError(
            f"--since {since!r} is neither a duration (30d, 12h, 2w) nor a date (2026-11-01)"
        ) from None


def changes(
    history: Optional[str], metric: str, since: Optional[str], max_pvalue: Optional[float] = None
) -> ChangesOutcome:
    """Change points in every series of ``metric`` (a run figure, a profile figure or a
    validate probe); refused, one line: an unknown metric, a p-value outside (0, 1)."""
    from torchscale.hardware.expected_figures import PROBES
    from torchscale.history.ingest import METRICS, PROFILE_METRICS
    from torchscale.history.series_changes import find_changes

    if metric not in (*METRICS, *PROFILE_METRICS, *PROBES):
        raise TorchscaleError(
            f"--metric {metric!r} is not one of {', '.join(METRICS)}, "
            f"{', '.join(PROFILE_METRICS)} or a validate probe ({', '.join(PROBES)})"
        )
    if max_pvalue is not None and not 0.0 < max_pvalue < 1.0:
        raise TorchscaleError(f"--max-pvalue {max_pvalue} is not between 0 and 1: give e.g. 0.001")
    store = open_store(required_location(history))
    try:
        found = find_changes(store, metric, since_date(since), max_pvalue)
        return ChangesOutcome(store.shown, metric, found, len(store.series_ids()))
    finally:
        store.close()


@dataclass
class ShowOutcome:
    location: str
    runs: List[Dict[str, Any]]
    software: List[str]
    """Per run: its torch, NCCL and driver versions in words."""


def show(history: Optional[str], since: Optional[str], experiment: Optional[str]) -> ShowOutcome:
    """The runs (oldest first), filtered, each with its points' count."""
    from torchscale.history.series_changes import SOFTWARE_LABELS

    store = open_store(required_location(history))
    try:
        runs = store.runs(since_date(since))
    finally:
        store.close()
    if experiment is not None:
        runs = [r for r in runs if r["experiment"] == experiment]
    software = [
        ", ".join(
            f"{SOFTWARE_LABELS[k]} {r['attributes'].get(k)}"
            for k in ("torch", "nccl", "driver")
            if r["attributes"].get(k)
        )
        for r in runs
    ]
    return ShowOutcome(store.shown, runs, software)


def export(history: Optional[str], layout: str, output: Path, run_id: Optional[int] = None) -> int:
    """Write the history as ``layout`` (``bmf``: one run as Bencher's JSON; ``otava-csv``: every
    run as Otava's CSV) to ``output``, atomically; how many entries were written."""
    if layout not in ("bmf", "otava-csv"):
        raise TorchscaleError(f"--format {layout!r} is not bmf or otava-csv")
    import json

    import pandas as pd

    from torchscale.escaping import csv_text
    from torchscale.history.exports import bmf, otava_rows
    from torchscale.results.files import atomic_write_text

    store = open_store(required_location(history))
    try:
        if layout == "bmf":
            document = bmf(store, run_id)
            atomic_write_text(output, json.dumps(document, indent=2) + "\n")
            return len(document)
        rows = otava_rows(store)
    finally:
        store.close()
    atomic_write_text(output, csv_text(pd.DataFrame(rows)))
    return len(rows)


def history_report(history: Optional[str], output: Path) -> int:
    """Write the history page to ``output`` (atomically); how many charts it has."""
    from torchscale.history.page import history_page
    from torchscale.results.files import atomic_write_text

    store = open_store(required_location(history))
    try:
        page = history_page(store)
    finally:
        store.close()
    atomic_write_text(output, page)
    return page.count("data-figure=")


def record_predictions(
    location: Optional[str], rows: Sequence[Dict[str, Any]], notify: Notify
) -> None:
    """Store ``project``'s predictions (its table's rows) as one run of kind ``project``."""
    from datetime import datetime, timezone

    from torchscale.history.database import PredictionEntry, RunEntry
    from torchscale.history.ingest import digest
    from torchscale.history.predictions import prediction_key

    if location is None:
        return
    entries, described = [], {}
    experiments = sorted({str(r["experiment"]) for r in rows})
    for row in rows:
        experiment, model = str(row["experiment"]), str(row["model"])
        key = prediction_key(experiment, model, row["world_size"], row["nodes"])
        described[key] = {"model": row["model"], "gpus": row["world_size"], "nodes": row["nodes"]}
        entries.append(
            PredictionEntry(
                key, "throughput", row["throughput"], row.get("throughput_low"),
                row.get("throughput_high"),
            )
        )  # fmt: skip
    now = datetime.now(timezone.utc).isoformat()
    run = RunEntry(
        identity=digest(["project", now, described], 64),
        experiment=experiments[0] if experiments else "?",
        kind="project",
        started_at=now,
        hardware="",
        attributes={"predictions": described},
        source="torchscale project",
        predictions=entries,
    )
    try:
        open_store(location).add_run(run)
    except TorchscaleError as exc:
        notify(f"> [WARN] predictions not recorded in the history: {exc}")
        return
    notify(f"> {len(entries)} prediction(s) recorded in the history")


def predictions(history: Optional[str]) -> List[Dict[str, Any]]:
    from torchscale.history.predictions import checked_predictions

    store = open_store(required_location(history))
    try:
        return [c.as_json() for c in checked_predictions(store)]
    finally:
        store.close()


def past_prediction_error(
    experiments: Sequence[str], option: Optional[str] = None
) -> Optional[str]:
    """The line the report's projection section quotes: how far the checked past predictions
    of ``experiments`` were off (from the history given by ``option``, else TORCHSCALE_HISTORY),
    or None."""
    location = history_location(option)
    if location is None:
        return None
    from torchscale.history.database import database_url

    try:
        url = database_url(location)
        if url.startswith("sqlite:///") and not Path(url[len("sqlite:///") :]).is_file():
            return None  # a report never creates a history
        checked = [
            row for row in predictions(location)
            if row["experiment"] in experiments and row["error"] is not None
        ]  # fmt: skip
    except TorchscaleError:
        return None
    if not checked:
        return None
    errors = [abs(row["error"]) for row in checked]
    worst = max(checked, key=lambda row: abs(row["error"]))
    return (
        f"Past predictions (the history, {len(checked)} checked against the runs that measured "
        f"that scale) were off by {100 * sum(errors) / len(errors):.1f}% on average, at most "
        f"{100 * worst['error']:+.1f}% ({worst['model']} at {worst['gpus']}); see "
        "`torchscale history predictions`."
    )
