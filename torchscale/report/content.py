"""Loaded results -> everything the templates show: summary, sections, findings, environment."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional, Tuple

import pandas as pd

from torchscale.analysis import cells as cell_tables
from torchscale.analysis import findings as finding_rules
from torchscale.analysis.comparison import Comparison
from torchscale.analysis.finding import severity_order
from torchscale.analysis.iteration_breakdown import step_histogram
from torchscale.analysis.scaling import (
    efficiency_band,
    label_variants,
    model_summary,
    scaling_curves,
)
from torchscale.analysis.telemetry import telemetry_findings
from torchscale.analysis.training_tables import training_table
from torchscale.kinds.kind_registry import TRAINING_KIND, record_kinds
from torchscale.report import formatting as fmt
from torchscale.report import node_section as nodes
from torchscale.report import sections
from torchscale.report.breakdown_sections import (
    comm_compute_section,
    histogram_charts,
    parallelism_section,
)
from torchscale.report.elements import Chart, Column, Section, Table, make_table
from torchscale.report.environment_block import EnvironmentBlock, environment_block
from torchscale.report.lost_efficiency_section import lost_efficiency_section
from torchscale.report.projection_section import projection_section
from torchscale.report.report_data import ReportData
from torchscale.report.telemetry_section import telemetry_section
from torchscale.report.tuning import tuning_sections
from torchscale.results.table_scalars import frame_records

TOP_FINDINGS = 5


@dataclass
class Card:
    label: str
    value: str
    detail: str
    tone: str = "neutral"  # good, warn, bad or neutral


@dataclass
class ReportContent:
    title: str
    source: str
    generated_at: str
    cards: List[Card]
    summary: Optional[Table]
    top_findings: List[Dict[str, Any]]
    sections: List[Section]
    findings: List[Dict[str, Any]]
    failures: Optional[Table]
    environments: List[EnvironmentBlock]
    charts: List[Chart] = field(default_factory=list)
    headlines: List[str] = field(default_factory=list)  # lines under the summary cards


def _training(data: ReportData) -> pd.DataFrame:
    # Efficiency is computed within each experiment: cells of different runs are not a baseline.
    frames = [training_table(e.records) for e in data.experiments]
    frames = [f for f in frames if not f.empty]
    table = pd.concat(frames, ignore_index=True) if frames else training_table([])
    return label_variants(table)


def _cards(table: pd.DataFrame, findings: pd.DataFrame, failures: pd.DataFrame) -> List[Card]:
    ok = table[table["status"] == "ok"]
    missed = len(table) - len(ok)
    others = int((~failures["kind"].isin(record_kinds(TRAINING_KIND))).sum())
    invalid = int((table["status"] == "invalid").sum())
    detail = f"{missed} failed, OOM or skipped" if missed else "all cells ran"
    if invalid:
        detail = f"{missed} failed, OOM, skipped or invalid ({invalid} invalid)"
    if others:
        detail += f"; {others} other record(s) failed"
    tone = "bad" if ok.empty and len(table) else "warn" if len(failures) else "good"
    cards = [Card("Training cells measured", f"{len(ok)} / {len(table)}", detail, tone)]
    scaled = ok[ok["world_size"] > ok["baseline_world_size"]]
    if not scaled.empty:
        largest = int(scaled["world_size"].max())
        at_largest = (
            scaled[scaled["world_size"] == largest]
            .groupby(["experiment", "config_key"])["scaling_efficiency"]
            .mean()
        )
        mean = float(at_largest.mean())
        band = efficiency_band(mean)
        detail = f"{band}; mean of {len(at_largest)} configuration(s)"
        if len(at_largest) > 1:
            detail += f", range {fmt.fraction(at_largest.min())} – {fmt.fraction(at_largest.max())}"
        tone = {"excellent": "good", "good": "good", "poor": "bad"}.get(band, "neutral")
        cards.append(
            Card(f"Scaling efficiency at {largest} GPUs", fmt.fraction(mean), detail, tone)
        )
    if not ok.empty:
        best = ok.sort_values("throughput", ascending=False, kind="stable").iloc[0]
        cards.append(
            Card(
                f"Highest throughput ({best['unit'] or 'samples'}/s)",
                fmt.significant(best["throughput"]),
                f"{best['model']} · {best['variant']} · {int(best['world_size'])} GPUs",
            )
        )
    # findings_table sorts by severity, so counts come out most severe first
    counts = findings["severity"].value_counts(sort=False)
    severe = findings["severity"].map(lambda s: severity_order(s) <= 1)
    cards.append(
        Card(
            "Findings",
            str(len(findings)),
            " · ".join(f"{n} {s}" for s, n in counts.items()) or "nothing to report",
            "bad" if severe.any() else "warn" if len(findings) else "good",
        )
    )
    return cards


def _summary_table(table: pd.DataFrame) -> Optional[Table]:
    summary = model_summary(table)
    if summary.empty:
        return None
    efficiency = summary.apply(
        lambda r: (
            fmt.MISSING
            if pd.isna(r["efficiency_best"])
            else fmt.fraction(r["efficiency_best"])
            if r["efficiency_best"] == r["efficiency_worst"]
            else f"{fmt.fraction(r['efficiency_worst'])} – {fmt.fraction(r['efficiency_best'])}"
        ),
        axis=1,
    )
    shown = summary.assign(efficiency=efficiency)
    return make_table(
        "summary-table",
        shown,
        [
            *sections.experiment_columns(shown),
            Column("model", "Model", fmt.text, numeric=False),
            Column("best_variant", "Best configuration", fmt.text, numeric=False),
            Column("best_world_size", "GPUs", fmt.integer),
            *sections.throughput_columns(shown, "best_throughput"),
            Column("best_step_ms_p50", "Step p50 ms", fmt.significant),
            Column("largest_world_size", "Largest GPUs", fmt.integer),
            Column("efficiency", "Efficiency at largest", fmt.text),
            Column("band", "Band", fmt.text, numeric=False),
        ],
        row_class=lambda row: f"band-{row['band']}",
        csv_frame=summary,
    )


def _failures(failures: pd.DataFrame) -> Optional[Table]:
    if failures.empty:
        return None
    return make_table(
        "failures-table",
        failures.sort_values(["status", "model", "world_size"], na_position="last"),
        [
            *sections.experiment_columns(failures),
            Column("status", "Status", fmt.text, numeric=False),
            Column("model", "Model", fmt.text, numeric=False),
            Column("batch_size", "Batch", fmt.integer),
            sections.GPUS,
            Column("reason", "Reason", fmt.text, numeric=False),
            Column("cell_id", "Cell", fmt.text, numeric=False),
        ],
        row_class=lambda row: f"status-{row['status']}",
    )


def changed_settings_notes(data: ReportData) -> List[str]:
    """A line per experiment where ``--resume --force`` recorded cells of changed settings beside
    their old results (the manifest's runs say which)."""
    lines = []
    for experiment in data.experiments:
        changed = [
            change
            for run in experiment.manifest.get("runs") or []
            if isinstance(run, dict)
            for change in run.get("changed_settings") or []
            if isinstance(change, dict)
        ]
        if changed:
            shown = "; ".join(
                f"{c.get('cell_id')} ({', '.join(map(str, c.get('changes') or []))})"
                for c in changed[:3]
            )
            more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
            lines.append(
                f"Note: {experiment.name} holds results of changed settings side by side: "
                f"{len(changed)} cell(s) were run again with --resume --force after their "
                f"settings changed ({shown}{more}); old and new results are both shown, as "
                "different configurations."
            )
    return lines


def build_content(
    data: ReportData,
    comparison: Optional[Tuple[Comparison, float, str]] = None,
) -> ReportContent:
    """Every table and chart of the report; ``comparison`` is (result, threshold %, baseline)."""
    records = data.records
    table = _training(data)
    curves = scaling_curves(table)
    findings = finding_rules.findings_table(
        [
            finding_rules.normalize(f, f.get("_source", "profile"), e.name)
            for e in data.experiments
            for f in e.findings
        ]
        + finding_rules.record_findings(records)
        + telemetry_findings(records)
        + finding_rules.scaling_findings(table)
    )
    failures = cell_tables.failure_table(records)
    samples = cell_tables.step_samples(records)
    ranks = cell_tables.rank_table(records)
    node_rows = nodes.node_rows(table)
    latency = sections.latency_section(
        table,
        cell_tables.latency_table(records),
        cell_tables.pooled_latency_table(table, samples),
        samples,
    )
    latency.charts += histogram_charts(step_histogram(table, samples))
    built = sections.chart_sections(
        sections.comparison_section(*comparison) if comparison else None,
        *tuning_sections(data),
        sections.scaling_section(curves),
        nodes.node_section(node_rows),
        latency,
        sections.memory_section(
            cell_tables.memory_by_variant(table, cell_tables.memory_table(records))
        ),
        sections.utilisation_section(table),
        sections.sync_section(table, cell_tables.pooled_rank_table(table, ranks), ranks),
        lost_efficiency_section(records),
        comm_compute_section(records),
        telemetry_section(records),
        sections.communication_section(records),
        parallelism_section(records),
        projection_section(data),
    )
    finding_rows = frame_records(findings)
    if len({e.name for e in data.experiments}) < 2:
        for row in finding_rows:  # one experiment: naming it on every finding says nothing
            row["experiment"] = ""
    return ReportContent(
        title=data.title,
        source=str(data.source),
        generated_at=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        cards=_cards(table, findings, failures),
        summary=_summary_table(table),
        top_findings=finding_rows[:TOP_FINDINGS],
        sections=built,
        findings=finding_rows,
        failures=_failures(failures),
        environments=[environment_block(e) for e in data.experiments],
        charts=[chart for section in built for chart in section.charts],
        headlines=[
            line for line in [nodes.node_headline(node_rows), *changed_settings_notes(data)] if line
        ],
    )
