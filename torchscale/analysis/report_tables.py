"""Every table the report draws, computed once, before any drawing (compute, then draw).

``report_tables`` turns loaded results (``ReportData``) into ``ReportTables``: frames and typed
rows only. The report's sections take them as arguments and never call an analysis; a table a
section needs is a field here (``report/section_list.py`` names, per section, the fields it draws).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pandas as pd

from torchscale.analysis import cells as cell_tables
from torchscale.analysis import findings as finding_rules
from torchscale.analysis.comparison import Comparison
from torchscale.analysis.finding import severity_order
from torchscale.analysis.host_attribution import attribute_findings
from torchscale.analysis.iteration_breakdown import comm_compute_table, step_histogram
from torchscale.analysis.layout_findings import channels_last_findings
from torchscale.analysis.lost_efficiency import lost_efficiency_table
from torchscale.analysis.node_scaling import NODE_SCALING_COLUMNS, node_scaling
from torchscale.analysis.profiled_cells import profile_table, trace_findings
from torchscale.analysis.projection import ADD_INTER_NODE, Projection, ProjectionError, project
from torchscale.analysis.report_data import Experiment, ReportData, read_summary
from torchscale.analysis.scaling import (
    efficiency_band,
    label_variants,
    model_summary,
    scaling_curves,
)
from torchscale.analysis.telemetry import cpu_table, gpu_table, gpu_timeline, telemetry_findings
from torchscale.analysis.training_tables import training_table
from torchscale.results.host_records import load_host_records
from torchscale.results.schema import ResultBase, TrainingResult

GPUS_PER_NODE = 8
ACROSS_NODES = [16, 64, 256, 1024]


@dataclass(frozen=True)
class ComparisonTables:
    """A report ``--baseline``: the comparison, its threshold (%) and the baseline's name."""

    result: Comparison
    threshold_pct: float
    baseline: str


@dataclass(frozen=True)
class ScalingAtLargest:
    """Each configuration's mean scaling efficiency at the largest count scaled to, and the
    band of the lowest (configurations are not averaged together)."""

    world_size: int
    efficiencies: pd.Series
    band: str


@dataclass(frozen=True)
class ProjectionTables:
    """The projection at the report's target counts, or why none was made; ``None`` both when
    no training cell ran."""

    projection: Optional[Projection]
    missing: Optional[str]


@dataclass(frozen=True)
class ReportTables:
    """What the report draws: ``data`` (names, folders, manifests) and the tables of it."""

    data: ReportData
    records: List[ResultBase]
    on_cpu: bool  # the ranks were CPU processes: every text says so
    cell_table: pd.DataFrame  # every training cell, efficiency within its experiment, variants
    variants: Dict[str, str]  # cell id -> configuration label (the unlabelled training table's)
    summary: pd.DataFrame  # per model: the fastest cell, efficiency at the largest count
    scaling_at_largest: Optional[ScalingAtLargest]
    curves: pd.DataFrame  # scaling curves, with each row's ``band``
    findings: pd.DataFrame  # records', traces', telemetry's and scaling's, hosts attributed
    severe_findings: bool  # a finding of the two highest severities
    failures: pd.DataFrame
    samples: pd.DataFrame  # step-time samples
    latency: pd.DataFrame
    pooled_latency: pd.DataFrame
    histogram: pd.DataFrame
    memory: pd.DataFrame  # by variant
    ranks: pd.DataFrame
    pooled_ranks: pd.DataFrame
    rank_wait: pd.DataFrame  # one column per rank
    nodes: pd.DataFrame  # node scaling, with each row's ``band``
    profiles: pd.DataFrame  # every traced cell
    lost_efficiency: pd.DataFrame
    comm_compute: pd.DataFrame
    gpu_telemetry: pd.DataFrame
    cpu_telemetry: pd.DataFrame
    gpu_timeline: pd.DataFrame
    projection: Optional[ProjectionTables]
    tuning: List[Tuple[str, Dict[str, Any]]]  # each tune folder's name and its summary
    comparison: Optional[ComparisonTables] = None

    @property
    def experiments(self) -> List[Experiment]:
        return self.data.experiments

    @property
    def past_prediction_error(self) -> Optional[str]:
        return self.data.past_prediction_error


@dataclass(frozen=True)
class DocumentTables:
    """What the JSON document of one experiment shows (all its cells, or one GPU count's)."""

    experiment: Experiment
    source: Path  # the folder the profiles' paths are relative to
    world_size: Optional[int]  # only the cells of this GPU count (``benchmark_<N>gpu``)
    records: List[ResultBase]
    training: pd.DataFrame
    profiles: pd.DataFrame
    on_cpu: bool


def document_tables(
    experiment: Experiment, source: Optional[Path] = None, world_size: Optional[int] = None
) -> DocumentTables:
    """``source``: the folder the profiles' paths are relative to (the experiment's parent);
    ``world_size``: only the cells of that GPU count (the benchmark's ``benchmark_<N>gpu``)."""
    data = ReportData(source or experiment.path.parent, [experiment])
    records = [r for r in experiment.records if world_size in (None, r.world_size)]
    return DocumentTables(
        experiment=experiment,
        source=data.source,
        world_size=world_size,
        records=records,
        training=training_table(records),
        profiles=profile_table(data),
        on_cpu=data.on_cpu,
    )


def experiments_tables(data: ReportData) -> List[DocumentTables]:
    """The document tables of each experiment of ``data`` (``report --format json``)."""
    return [document_tables(e, data.source) for e in data.experiments]


def gpu_count_tables(experiment: Experiment) -> List[DocumentTables]:
    """The document tables of each GPU count the experiment measured, smallest first."""
    counts = sorted({r.world_size for r in experiment.records})
    return [document_tables(experiment, world_size=count) for count in counts]


def _training(data: ReportData) -> pd.DataFrame:
    # Efficiency is computed within each experiment: cells of different runs are not a baseline.
    frames = [training_table(e.records) for e in data.experiments]
    frames = [f for f in frames if not f.empty]
    table = pd.concat(frames, ignore_index=True) if frames else training_table([])
    return label_variants(table)


def _with_bands(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(band=frame["scaling_efficiency"].map(efficiency_band))


def scaling_at_largest(table: pd.DataFrame) -> Optional[ScalingAtLargest]:
    ok = table[table["status"] == "ok"]
    scaled = ok[ok["world_size"] > ok["baseline_world_size"]]
    if scaled.empty:
        return None
    largest = int(scaled["world_size"].max())
    at_largest = (
        scaled[scaled["world_size"] == largest]
        .groupby(["experiment", "config_key"])["scaling_efficiency"]
        .mean()
    )
    return ScalingAtLargest(largest, at_largest, efficiency_band(float(at_largest.min())))


def node_rows(table: pd.DataFrame) -> pd.DataFrame:
    """``node_scaling`` of each experiment of the training table, with the report's
    ``experiment`` and ``variant`` labels, in display order."""
    frames = [
        node_scaling(group).assign(experiment=experiment)
        for experiment, group in table.groupby("experiment", sort=True)
    ]
    frames = [frame for frame in frames if not frame.empty]
    if not frames:
        return pd.DataFrame(columns=[*NODE_SCALING_COLUMNS, "experiment", "variant"])
    variants = table[["experiment", "config_key", "variant"]].drop_duplicates(
        ["experiment", "config_key"]
    )
    rows = pd.concat(frames, ignore_index=True).merge(variants, on=["experiment", "config_key"])
    order = ["experiment", "model", "variant", "world_size", "nnodes"]
    return rows.sort_values(order, kind="stable").reset_index(drop=True)


def report_targets(largest: int, inter_node: bool, gpus_per_node: int = GPUS_PER_NODE) -> List[int]:
    """Doublings of the largest measured count up to a node, then the seed's cluster sizes when the
    network was measured."""
    targets, n = [], max(largest, 1) * 2
    while n <= gpus_per_node:
        targets.append(n)
        n *= 2
    if inter_node:
        targets += [t for t in ACROSS_NODES if t > largest]
    return sorted(set(targets))


def report_projection(data: ReportData) -> Optional[ProjectionTables]:
    """``torchscale project`` at the next scales; None without training cells."""
    records = data.records
    if not any(isinstance(r, TrainingResult) and r.status == "ok" for r in records):
        return None
    try:
        folders = {e.name: e.path for e in data.experiments}
        first = project(records, [], GPUS_PER_NODE, folders=folders)
        largest = max(ref.world_size for ref in first.references)
        result = project(records, report_targets(largest, first.fabric.inter is not None))
        if result.table.empty:
            raise ProjectionError(
                "the measured counts already fill a node and no all-reduce across nodes was "
                f"measured: {ADD_INTER_NODE}"
            )
    except ProjectionError as exc:
        return ProjectionTables(None, str(exc))
    return ProjectionTables(result, None)


def _findings(data: ReportData, table: pd.DataFrame) -> pd.DataFrame:
    records = data.records
    hosts = {k: v for e in data.experiments for k, v in load_host_records(e.path.parent).items()}
    return finding_rules.findings_table(
        attribute_findings(
            trace_findings(data)
            + finding_rules.record_findings(records)
            + telemetry_findings(records),
            records,
            hosts,
        )
        + finding_rules.scaling_findings(table, records)
        + channels_last_findings(records)
    )


def cell_variants(records: List[ResultBase]) -> Dict[str, str]:
    """Each training cell's configuration label, by cell id."""
    labelled = training_table(records)
    return dict(zip(labelled["cell_id"], labelled["variant"].astype(str)))


def _with_variant(table: pd.DataFrame, variants: Dict[str, str]) -> pd.DataFrame:
    """Each row's configuration (the training table's ``variant``): a sweep's cells stay apart."""
    return table.assign(variant=table["cell_id"].map(variants).fillna(""))


def report_tables(
    data: ReportData, comparison: Optional[Tuple[Comparison, float, str]] = None
) -> ReportTables:
    """Every table of the report of ``data``; ``comparison`` is (result, threshold %, baseline)."""
    records = data.records
    table = _training(data)
    findings = _findings(data, table)
    samples = cell_tables.step_samples(records)
    ranks = cell_tables.rank_table(records)
    pooled_ranks = cell_tables.pooled_rank_table(table, ranks)
    variants = cell_variants(records)
    severities: Any = findings["severity"].map(lambda s: severity_order(s) <= 1)
    return ReportTables(
        data=data,
        records=records,
        on_cpu=data.on_cpu,
        cell_table=table,
        variants=variants,
        summary=model_summary(table),
        scaling_at_largest=scaling_at_largest(table),
        curves=_with_bands(scaling_curves(table)),
        findings=findings,
        severe_findings=bool(severities.any()),
        failures=cell_tables.failure_table(records),
        samples=samples,
        latency=cell_tables.latency_table(records),
        pooled_latency=cell_tables.pooled_latency_table(table, samples),
        histogram=step_histogram(table, samples),
        memory=cell_tables.memory_by_variant(table, cell_tables.memory_table(records)),
        ranks=ranks,
        pooled_ranks=pooled_ranks,
        rank_wait=cell_tables.rank_wait_matrix(pooled_ranks),
        nodes=_with_bands(node_rows(table)),
        profiles=profile_table(data),
        lost_efficiency=lost_efficiency_table(records),
        comm_compute=comm_compute_table(records, variants),
        gpu_telemetry=_with_variant(gpu_table(records), variants),
        cpu_telemetry=_with_variant(cpu_table(records), variants),
        gpu_timeline=gpu_timeline(records),
        projection=report_projection(data),
        tuning=[(e.name, s) for e in data.experiments if (s := read_summary(e)) is not None],
        comparison=ComparisonTables(*comparison) if comparison else None,
    )
