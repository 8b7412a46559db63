"""Every traced cell of the experiments, and the findings of every trace, once each.

An experiment's traces are its own profiled cells and the ``torchscale profile`` runs written into
its folder (``Experiment.profiles``, the seed's Use Case). Each traced cell is a row: where its
traces are, the sync overhead of the traced run and the sync stall its trace measured, side by
side with the benchmark's sync overhead of the same configuration. Two traces of one
configuration (the benchmark's cell and a profile run) make the same findings: each finding is
listed once, from the profile run.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

import pandas as pd

from torchscale.analysis import findings as finding_rules
from torchscale.analysis.report_data import Experiment, ReportData, TraceAnalysis
from torchscale.analysis.training_tables import profiled_config_key, sync_overhead_pct
from torchscale.measures.figures import SYNC_STALL
from torchscale.results.schema import TrainingResult

BENCHMARK_CELL = "benchmark cell"
PROFILE_RUN = "torchscale profile"

ConfigurationKey = Tuple[str, int]  # (profiled_config_key, world size)


def _runs(experiment: Experiment) -> List[Tuple[Experiment, str]]:
    """The experiment and its profile runs, each with what traced it."""
    runs = [(profile, PROFILE_RUN) for profile in experiment.profiles]
    return [(experiment, BENCHMARK_CELL), *runs]


def _training(run: Experiment, trace: TraceAnalysis) -> Optional[TrainingResult]:
    record = run.record(trace.cell_id)
    return record if isinstance(record, TrainingResult) else None


def _key(record: Optional[TrainingResult]) -> Optional[ConfigurationKey]:
    return (profiled_config_key(record.settings), record.world_size) if record else None


def _folder(data: ReportData, run: Experiment, trace: TraceAnalysis) -> str:
    path = run.path / trace.folder
    try:
        return str(path.relative_to(data.source))
    except ValueError:
        return str(path)


def profile_table(data: ReportData) -> pd.DataFrame:
    """One row per traced cell of every experiment, its profile runs' cells included."""
    rows: List[Dict[str, Any]] = []
    for experiment in data.experiments:
        measured = {
            _key(r): sync_overhead_pct(r)
            for r in experiment.records
            if isinstance(r, TrainingResult) and r.status == "ok"
        }
        for run, traced_by in _runs(experiment):
            for trace in run.traces:
                record = _training(run, trace)
                profile = record.profile if record else None
                rows.append(
                    {
                        "experiment": experiment.name,
                        "model": record.model if record else None,
                        "batch_size": record.batch_size if record else None,
                        "world_size": record.world_size if record else None,
                        "traced_by": traced_by,
                        "tool": profile.tool if profile else None,
                        "steps": profile.steps if profile else None,
                        "sync_overhead_pct": sync_overhead_pct(record) if record else None,
                        "benchmark_sync_overhead_pct": measured.get(_key(record)),
                        SYNC_STALL.column: trace.sync_stall_pct,
                        "findings": trace.findings,
                        "folder": _folder(data, run, trace),
                    }
                )
    columns = [
        "experiment", "model", "batch_size", "world_size", "traced_by", "tool", "steps",
        "sync_overhead_pct", "benchmark_sync_overhead_pct", SYNC_STALL.column, "findings", "folder",
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _same_finding(row: Dict[str, Any]) -> Tuple[Any, ...]:
    """A finding's rule and ranks, apart from its numbers: two traces of one cell make it twice."""
    return (row["experiment"], row["category"], _NUMBER.sub("#", row["title"]), *row["ranks"])


def trace_findings(data: ReportData) -> List[Dict[str, Any]]:
    """The findings of every trace (the profile runs' before the benchmark's own cells), once per
    configuration and rule: a finding a profile run made again of a benchmark cell is listed
    once, from the profile run, naming both traces."""
    kept: Dict[Tuple[Any, ...], Dict[str, Any]] = {}
    found_in: Dict[Tuple[Any, ...], str] = {}
    for experiment in data.experiments:
        for run, traced_by in reversed(_runs(experiment)):
            by_folder = {trace.folder: trace for trace in run.traces}
            for item in run.findings:
                source = str(item.get("_source", "profile"))
                trace = by_folder.get(source)
                where = _folder(data, run, trace) if trace else source
                row = finding_rules.normalize(item, where, experiment.name)
                if traced_by != BENCHMARK_CELL:
                    row["source"] = f"{traced_by} run: {where}"
                cell = _key(_training(run, trace)) if trace else None
                key = (cell or where, *_same_finding(row))
                if key in kept and found_in[key] != where:  # another trace of the same cell
                    kept[key]["source"] += f"; also {where}"
                    continue
                key = key if key not in kept else (*key, len(kept))
                kept[key], found_in[key] = row, where
    return list(kept.values())
