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
from torchscale.analysis.host_attribution import attribute_findings
from torchscale.analysis.iteration_breakdown import step_histogram
from torchscale.analysis.layout_findings import channels_last_findings
from torchscale.analysis.scaling import (
    efficiency_band,
    label_variants,
    model_summary,
    scaling_curves,
)
from torchscale.analysis.telemetry import telemetry_findings
from torchscale.analysis.training_tables import training_table
from torchscale.hardware.device_noun import cpu_run_note
from torchscale.measures.figures import FIGURES, GLOSSARY_DOC, SCALING_EFFICIENCY
from torchscale.measures.table_scalars import frame_records
from torchscale.plan.kind_protocol import cell_kinds, record_kinds
from torchscale.report import device_words as words
from torchscale.report import formatting as fmt
from torchscale.report import node_section as nodes
from torchscale.report import sections
from torchscale.report.breakdown_sections import comm_compute_section, histogram_charts
from torchscale.report.elements import Card, Chart, Column, Section, Table, make_table
from torchscale.report.environment_block import EnvironmentBlock, environment_block
from torchscale.report.lost_efficiency_section import lost_efficiency_section
from torchscale.report.profile_section import profile_section, trace_findings
from torchscale.report.projection_section import projection_section
from torchscale.report.report_data import ReportData
from torchscale.report.reported_kinds import kind_cards, kind_sections
from torchscale.report.telemetry_section import telemetry_section
from torchscale.report.tuning import tuning_sections
from torchscale.results.host_records import load_host_records
from torchscale.results.schema import ResultBase

TOP_FINDINGS = 5


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
    device_note: str = ""  # the first screen's line on a CPU run: not GPU figures
    glossary: List[Tuple[str, str, str]] = field(default_factory=list)  # (anchor, name, definition)
    glossary_doc: str = GLOSSARY_DOC


def _training(data: ReportData) -> pd.DataFrame:
    # Efficiency is computed within each experiment: cells of different runs are not a baseline.
    frames = [training_table(e.records) for e in data.experiments]
    frames = [f for f in frames if not f.empty]
    table = pd.concat(frames, ignore_index=True) if frames else training_table([])
    return label_variants(table)


def _status_detail(statuses: pd.Series) -> str:
    """``1 oom · 10 skipped``: what did not measure, by status (or ``all cells ran``)."""
    counts = statuses[statuses != "ok"].value_counts(sort=False)
    return " · ".join(f"{n} {status}" for status, n in counts.items()) or "all cells ran"


def _cells_tone(statuses: pd.Series) -> str:
    if len(statuses) and not (statuses == "ok").any():
        return "bad"
    return "good" if statuses.isin(["ok", "skipped"]).all() else "warn"


def _cell_cards(records: List[ResultBase]) -> List[Card]:
    """Cells measured out of those planned: one card per kind that has records, in plan order
    (the training cells', the communication cells'...)."""
    kinds = [
        (name.capitalize(), [r.status for r in records if r.kind in record_kinds(name)])
        for name in cell_kinds()
    ]
    return [
        Card(
            f"{name} cells measured",
            f"{statuses.count('ok')} / {len(statuses)}",
            _status_detail(pd.Series(statuses, dtype=object)),
            _cells_tone(pd.Series(statuses, dtype=object)),
        )
        for name, statuses in kinds
        if statuses
    ]


def _cards(table: pd.DataFrame, findings: pd.DataFrame, records: List[ResultBase]) -> List[Card]:
    ok = table[table["status"] == "ok"]
    cards = _cell_cards(records)
    scaled = ok[ok["world_size"] > ok["baseline_world_size"]]
    if not scaled.empty:
        largest = int(scaled["world_size"].max())
        at_largest = (
            scaled[scaled["world_size"] == largest]
            .groupby(["experiment", "config_key"])["scaling_efficiency"]
            .mean()
        )
        # Each configuration's efficiency is the mean of its own repeats; configurations are
        # not averaged together (unrelated models' mean is no one's figure): the lowest is shown.
        worst = float(at_largest.min())
        band = efficiency_band(worst)
        if len(at_largest) > 1:
            detail = (
                f"{band}; the lowest of {len(at_largest)} configurations, range "
                f"{fmt.fraction(at_largest.min())} – {fmt.fraction(at_largest.max())}"
            )
        else:
            detail = f"{band}; one configuration"
        tone = {"excellent": "good", "good": "good", "poor": "bad"}.get(band, "neutral")
        cards.append(
            Card(
                f"Scaling efficiency at {words.device(largest)}", fmt.fraction(worst), detail, tone
            )
        )
    # Throughputs compare only within one unit (images, tokens, samples): one card per unit.
    units = ok.assign(unit=ok["unit"].fillna("samples").replace("", "samples"))
    for unit, rows in units.groupby("unit", sort=True):
        best = rows.sort_values("throughput", ascending=False, kind="stable").iloc[0]
        cards.append(
            Card(
                f"Highest throughput ({unit}/s)",
                fmt.significant(best["throughput"]),
                f"{best['model']} · {best['variant']} · {words.device(int(best['world_size']))}",
            )
        )
    cards += kind_cards(records)
    # findings_table sorts by severity, so counts come out most severe first
    counts = findings["severity"].value_counts(sort=False)
    severe = findings["severity"].map(lambda s: severity_order(s) <= 1)
    cards.append(
        Card(
            "Findings",
            str(len(findings)),
            # "2 high · 1 medium": the severities are adjectives (analysis.finding)
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
            Column("best_world_size", words.count_header(), fmt.integer),
            *sections.throughput_columns(shown, "best_throughput"),
            Column("best_step_ms_p50", "Step p50 ms", fmt.significant),
            Column("largest_world_size", f"Largest {words.count_header()}", fmt.integer),
            Column("efficiency", f"{SCALING_EFFICIENCY.title} at largest", fmt.text),
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
            sections.gpus_column(),
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
    """Every table and chart of the report; ``comparison`` is (result, threshold %, baseline).
    On a CPU run every text says CPU process / rank where it would say GPU."""
    with words.ranks_on_cpu(data.on_cpu):
        return _content(data, comparison)


def _content(
    data: ReportData, comparison: Optional[Tuple[Comparison, float, str]]
) -> ReportContent:
    records = data.records
    table = _training(data)
    curves = scaling_curves(table)
    findings = finding_rules.findings_table(
        attribute_findings(
            trace_findings(data)
            + finding_rules.record_findings(records)
            + telemetry_findings(records),
            records,
            {k: v for e in data.experiments for k, v in load_host_records(e.path.parent).items()},
        )
        + finding_rules.scaling_findings(table, records)
        + channels_last_findings(records)
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
        profile_section(data),
        lost_efficiency_section(records),
        comm_compute_section(records),
        telemetry_section(records),
        *kind_sections(records),
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
        cards=_cards(table, findings, records),
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
        device_note=cpu_run_note() if words.on_cpu() else "",
        glossary=[
            (f.key, f.name, f.definition)
            for f in FIGURES.values()
            if not (f.gpu_only and words.on_cpu())  # none on CPU processes, so none shown
        ],
    )
