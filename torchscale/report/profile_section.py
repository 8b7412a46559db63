"""The report's "Profiles" section and the findings of every trace, once each.

An experiment's traces are its own profiled cells and the ``torchscale profile`` runs written into
its folder (``Experiment.profiles``, the seed's Use Case). Each traced cell is a row: where its
traces are, the sync overhead of the traced run and the sync stall its trace measured, side by
side with the benchmark's sync overhead of the same configuration, and how the figures relate
(``SYNC_RELATION``). Two traces of one configuration (the benchmark's cell and a profile run)
make the same findings: each finding is listed once, from the profile run.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

import pandas as pd

from torchscale.analysis import findings as finding_rules
from torchscale.analysis.training_tables import profiled_config_key, sync_overhead_pct
from torchscale.measures.figures import SYNC_OVERHEAD, SYNC_RELATION, SYNC_STALL
from torchscale.measures.table_scalars import as_int, frame_records
from torchscale.report import device_words as words
from torchscale.report import formatting as fmt
from torchscale.report.elements import Column, Section, make_table
from torchscale.report.report_data import Experiment, ReportData, TraceAnalysis
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


def relation_lines(table: pd.DataFrame) -> List[str]:
    """For each profile run with both figures: its sync stall beside the sync overhead the
    benchmark measured for the same configuration, and how they relate."""
    lines = []
    runs = table[table["traced_by"] == PROFILE_RUN]
    for row in frame_records(runs):
        stall, own = row[SYNC_STALL.column], row["sync_overhead_pct"]
        benchmark = row["benchmark_sync_overhead_pct"]
        if pd.isna(stall) or (pd.isna(benchmark) and pd.isna(own)):
            continue
        overhead = (
            f"the benchmark measured a {SYNC_OVERHEAD.name} of {fmt.percent(benchmark)} "
            f"(the profile run's own window: {fmt.percent(own)})"
            if not pd.isna(benchmark)
            else f"the profile run measured a {SYNC_OVERHEAD.name} of {fmt.percent(own)}"
        )
        lines.append(
            f"{row['model']} · batch {row['batch_size']} on "
            f"{words.device(as_int(row['world_size']))}: {overhead}; its trace a "
            f"{SYNC_STALL.name} of {fmt.percent(stall)}."
        )
    return lines


def _traced_by(table: pd.DataFrame) -> List[str]:
    """``torchscale profile (torch)``: what traced the cell, and with which tool."""
    return [
        f"{by} ({tool})" if isinstance(tool, str) else str(by)
        for by, tool in zip(table["traced_by"], table["tool"])
    ]


def profile_section(data: ReportData) -> Optional[Section]:
    table = profile_table(data)
    if table.empty:
        return None
    several = table["experiment"].nunique() > 1
    experiment = [Column("experiment", "Experiment", fmt.text, numeric=False)] if several else []
    return Section(
        "profiles",
        "Profiles",
        "Every traced cell: the benchmark's own profiled cells and the `torchscale profile` runs "
        f"written into the experiment's folder (the profile of that experiment). "
        f"{SYNC_STALL.explained()} {SYNC_RELATION}",
        tables=[
            make_table(
                "profile-table",
                table.assign(traced=_traced_by(table)),
                [
                    *experiment,
                    Column("model", "Model", fmt.text, numeric=False),
                    Column("batch_size", "Batch", fmt.integer),
                    Column("world_size", words.count_header(), fmt.integer),
                    Column("traced", "Traced by", fmt.text, numeric=False),
                    Column("steps", "Steps traced", fmt.integer),
                    Column("sync_overhead_pct", f"{SYNC_OVERHEAD.title} %", fmt.percent),
                    Column(SYNC_STALL.column, f"{SYNC_STALL.title} %", fmt.percent),
                    Column("findings", "Findings", fmt.integer),
                    Column("folder", "Traces", fmt.text, numeric=False),
                ],
            )
        ],
        notes=relation_lines(table),
    )


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
