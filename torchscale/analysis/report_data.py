"""Load what a report shows from a results folder: records, manifests and profiling findings.

Reading is tolerant: a record that does not validate is kept as what identifies it, marked
``invalid``, and a kind this version does not know is read as the fields every record has
(``ResultBase``); never a crash. Records are checked as they are read
(``torchscale.results.validity``): impossible figures make a record ``invalid``; input whose
every record is invalid is an error (exit 2), not an empty report. What the report gets is typed
records only, never the raw objects.

A ``torchscale profile`` run written into the folder of the benchmark it profiles (the seed's Use
Case: ``profile --output-dir`` into the benchmark's ``--output-dir``) is that experiment's profile:
its traces and findings join the experiment's, and its one traced cell is not a second experiment
with a scaling figure of its own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from torchscale.analysis.findings import on_cpu
from torchscale.analysis.training_tables import profiled_config_key
from torchscale.errors import TorchscaleError
from torchscale.results.json_input import read_json
from torchscale.results.layout import (
    CELLS,
    FINDINGS_FILE,
    RESULTS,
    TUNE_SUMMARY,
    is_profile_run,
    is_profile_run_of,
)
from torchscale.results.schema import ResultBase, TrainingResult
from torchscale.results.store import ExperimentStore, find_experiments, read_jsonl
from torchscale.results.validity import INVALID, check_and_parse, latest_runs

log = logging.getLogger("torchscale")
MAX_SUMMARY_BYTES = 64 << 20
"""The largest tuning summary (``TUNE_SUMMARY``) read."""
TITLE_NAMES = 4
"""A report of several experiments names up to this many in its title."""


@dataclass
class TraceAnalysis:
    """One ``findings.json``: the analysis of one traced cell."""

    folder: str  # relative to the experiment's folder
    cell_id: Optional[str]  # the cell whose traces these are (None: traces analysed by hand)
    sync_stall_pct: Optional[float]
    findings: int


@dataclass
class Experiment:
    name: str
    path: Path
    manifest: Dict[str, Any]
    records: List[ResultBase] = field(default_factory=list)
    findings: List[Dict[str, Any]] = field(default_factory=list)  # from findings.json files
    traces: List[TraceAnalysis] = field(default_factory=list)
    profiles: List[Experiment] = field(default_factory=list)  # profile runs of this experiment

    def record(self, cell_id: Optional[str]) -> Optional[ResultBase]:
        return next((r for r in self.records if r.cell_id == cell_id), None)


@dataclass
class ReportData:
    source: Path
    experiments: List[Experiment]
    past_prediction_error: Optional[str] = None
    """How far past predictions for these experiments were off, from the history (one line), when
    a history is configured; the projection section quotes it."""

    @property
    def title(self) -> str:
        """The experiment's name, or every name (up to ``TITLE_NAMES``) for several."""
        names = list(dict.fromkeys(e.name for e in self.experiments))
        if len(names) == 1:
            return names[0]
        if len(names) > TITLE_NAMES:
            return ", ".join(names[: TITLE_NAMES - 1]) + f" and {len(names) - TITLE_NAMES + 1} more"
        return ", ".join(names[:-1]) + " and " + names[-1]

    @property
    def records(self) -> List[ResultBase]:
        """The experiments' records (a profile run's traced cells are not among them)."""
        return [r for e in self.experiments for r in e.records]

    @property
    def on_cpu(self) -> bool:
        """Whether the ranks were CPU processes (gloo), not GPUs: every record that ran says so,
        or, with none, every manifest."""
        ran = [r for r in self.records if r.status == "ok"]
        if ran:
            return all(on_cpu(r) for r in ran)
        kinds = [(e.manifest.get("environment") or {}).get("device_kind") for e in self.experiments]
        return bool(kinds) and all(kind == "cpu" for kind in kinds)


def read_summary(experiment: Experiment) -> Optional[Dict[str, Any]]:
    """The experiment's tuning summary (``TUNE_SUMMARY``), or None (not a tune folder, or
    unreadable: said in the log)."""
    path = experiment.path / TUNE_SUMMARY
    if not path.exists():
        return None
    try:
        document = read_json(path, "tuning summary", MAX_SUMMARY_BYTES)
    except (OSError, ValueError, TorchscaleError) as exc:
        log.warning("%s is unreadable (%s); the Tuning section is left out", path, exc)
        return None
    return document if isinstance(document, dict) else None


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def read_findings(root: Path) -> Tuple[List[Dict[str, Any]], List[TraceAnalysis]]:
    """Every finding in the ``findings.json`` files under ``root``, tagged with its folder
    (``_source``) and cell (``_cell``), and a summary of each file."""
    found: List[Dict[str, Any]] = []
    traces = []
    for path in sorted(root.rglob(FINDINGS_FILE)):
        try:
            document = read_json(path, "findings file")
        except (OSError, ValueError, TorchscaleError) as exc:
            log.warning("%s is unreadable (%s); its findings are left out", path, exc)
            continue
        items = document.get("findings", []) if isinstance(document, dict) else document
        if not isinstance(items, list):
            log.warning("%s is damaged (its findings are not a list); left out", path)
            continue
        items = [item for item in items if isinstance(item, dict)]
        folder = path.parent.relative_to(root)
        source = str(folder) if path.parent != root else "profile"
        parts = folder.parts
        cell = parts[1] if len(parts) > 1 and parts[0] == CELLS else None
        found += [{**item, "_source": source, "_cell": cell} for item in items]
        stall = _number(document.get("sync_stall_pct")) if isinstance(document, dict) else None
        traces.append(TraceAnalysis(source, cell, stall, len(items)))
    return found, traces


def load_experiment(path: Path) -> Experiment:
    store = ExperimentStore(path)
    try:
        manifest = store.manifest()
    except (OSError, ValueError, TorchscaleError) as exc:
        log.warning("%s; the environment is left out", exc)
        manifest = {}
    _, records = check_and_parse(read_jsonl(store.results_path), store.results_path)
    records = latest_runs(records, store.results_path)
    name = manifest.get("experiment") or next(
        (r.experiment for r in records if r.experiment), path.name
    )
    findings, traces = read_findings(path)
    return Experiment(
        name=str(name),
        path=path,
        manifest=manifest,
        records=records,
        findings=findings,
        traces=traces,
    )


def _configurations(experiment: Experiment) -> List[str]:
    return [
        profiled_config_key(r.settings) for r in experiment.records if isinstance(r, TrainingResult)
    ]


def _profiled(profile: Experiment, benchmarks: List[Experiment]) -> Optional[Experiment]:
    """The benchmark a profile run profiled: the one holding its configuration (apart from the
    GPU count and the measured window), else the only one, else the one of the same model."""
    wanted = set(_configurations(profile))
    for benchmark in benchmarks:
        if wanted & set(_configurations(benchmark)):
            return benchmark
    if len(benchmarks) == 1:
        return benchmarks[0]
    models = {getattr(r, "model", None) for r in profile.records} - {None}
    return next((b for b in benchmarks if models & {getattr(r, "model", None) for r in b.records}),
                None)  # fmt: skip


def attach_profiles(experiments: List[Experiment]) -> List[Experiment]:
    """The experiments with each ``torchscale profile`` run moved into the benchmark it profiled
    (``Experiment.profiles``); a profile run with no benchmark beside it stays an experiment."""
    benchmarks = [e for e in experiments if not is_profile_run(e.name)]
    kept = list(benchmarks)
    for experiment in experiments:
        if experiment in benchmarks:
            continue
        owner = _profiled(experiment, benchmarks)
        if owner is None:
            kept.append(experiment)
        else:
            owner.profiles.append(experiment)
    return [e for e in experiments if e in kept]


def profiles_beside(source: Path, found: List[Experiment]) -> List[Experiment]:
    """A report of one experiment's folder (``--source DIR/<experiment>``) takes the
    ``torchscale profile`` runs of that experiment beside it: ``profile -o DIR`` writes them
    into ``DIR``, named for the experiment (``results.layout.is_profile_run_of``)."""
    if len(found) != 1 or found[0].path != source or is_profile_run(found[0].name):
        return []
    return [
        load_experiment(path)
        for path in find_experiments(source.parent)
        if path != source and is_profile_run_of(path.name, found[0].name)
    ]


def load_report_data(source: Path, what: str = "--source") -> ReportData:
    """All experiments under ``source``; a clear error when there is nothing to report.

    ``what`` names the argument in error messages (``--source``, ``--baseline``, ``OLD``...).
    """
    source = Path(source)
    if not source.exists():
        raise TorchscaleError(f"{what} {source} does not exist; point it at a results folder")
    found = [load_experiment(path) for path in find_experiments(source)]
    found += profiles_beside(source, found)
    experiments = attach_profiles([e for e in found if e.records])
    for e in experiments:
        log.debug(
            "%s: experiment %r, %d records, %d profile findings",
            e.path, e.name, len(e.records), len(e.findings),
        )  # fmt: skip
    if found and not experiments:
        names = ", ".join(str(e.path / RESULTS) for e in found[:3])
        raise TorchscaleError(
            f"no records under {source}: {names} hold(s) no readable record (empty, missing, or "
            "every line damaged); run 'torchscale benchmark' into it, or point at another folder"
        )
    if not experiments:
        raise TorchscaleError(
            f"no results under {source}: expected <experiment>/{RESULTS} as written by "
            "'torchscale benchmark --output-dir'"
        )
    records = [r for e in experiments for r in e.records]
    if all(r.status == INVALID for r in records):
        first = str(records[0].error or "")[:200]
        raise TorchscaleError(
            f"every record under {source} is invalid ({len(records)} record(s); first: "
            f"{first}); nothing can be reported or compared"
        )
    return ReportData(source=source, experiments=experiments)
