"""The report's tables -> everything the templates show: summary, sections, findings, environment.

It draws what ``analysis.report_tables`` computed; the sections are ``report/section_list.py``'s."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional, Tuple

import pandas as pd

from torchscale.analysis.report_data import ReportData
from torchscale.analysis.report_tables import ReportTables, ScalingAtLargest
from torchscale.hardware.device_noun import cpu_run_note
from torchscale.measures.figures import FIGURES, GLOSSARY_DOC, SCALING_EFFICIENCY
from torchscale.measures.table_scalars import frame_records
from torchscale.plan.kind_protocol import cell_kinds, record_kinds
from torchscale.report import device_words as words
from torchscale.report import formatting as fmt
from torchscale.report import node_section as nodes
from torchscale.report import sections
from torchscale.report.elements import Card, Chart, Column, Section, Table, make_table
from torchscale.report.environment_block import EnvironmentBlock, environment_block
from torchscale.report.reported_kinds import kind_cards
from torchscale.report.section_list import built_sections
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


def _cards(tables: ReportTables) -> List[Card]:
    table, findings = tables.cell_table, tables.findings
    ok = table[table["status"] == "ok"]
    cards = _cell_cards(tables.records)
    scaling: Optional[ScalingAtLargest] = tables.scaling_at_largest
    if scaling is not None:
        largest, at_largest, band = scaling.world_size, scaling.efficiencies, scaling.band
        # Each configuration's efficiency is the mean of its own repeats; configurations are
        # not averaged together (unrelated models' mean is no one's figure): the lowest is shown.
        worst = float(at_largest.min())
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
    cards += kind_cards(tables.records)
    # findings_table sorts by severity, so counts come out most severe first
    counts = findings["severity"].value_counts(sort=False)
    cards.append(
        Card(
            "Findings",
            str(len(findings)),
            # "2 high · 1 medium": the severities are adjectives (analysis.finding)
            " · ".join(f"{n} {s}" for s, n in counts.items()) or "nothing to report",
            "bad" if tables.severe_findings else "warn" if len(findings) else "good",
        )
    )
    return cards


def _summary_table(summary: pd.DataFrame) -> Optional[Table]:
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


def build_content(tables: ReportTables) -> ReportContent:
    """Every table and chart of the report, drawn from ``tables`` (computed before, once).
    On a CPU run every text says CPU process / rank where it would say GPU."""
    with words.ranks_on_cpu(tables.on_cpu):
        return _content(tables)


def _content(tables: ReportTables) -> ReportContent:
    data = tables.data
    findings = tables.findings
    built = built_sections(tables)
    finding_rows = frame_records(findings)
    if len({e.name for e in data.experiments}) < 2:
        for row in finding_rows:  # one experiment: naming it on every finding says nothing
            row["experiment"] = ""
    return ReportContent(
        title=data.title,
        source=str(data.source),
        generated_at=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        cards=_cards(tables),
        summary=_summary_table(tables.summary),
        top_findings=finding_rows[:TOP_FINDINGS],
        sections=built,
        findings=finding_rows,
        failures=_failures(tables.failures),
        environments=[environment_block(e) for e in data.experiments],
        charts=[chart for section in built for chart in section.charts],
        headlines=[
            line
            for line in [nodes.node_headline(tables.nodes), *changed_settings_notes(data)]
            if line
        ],
        device_note=cpu_run_note() if words.on_cpu() else "",
        glossary=[
            (f.key, f.name, f.definition)
            for f in FIGURES.values()
            if not (f.gpu_only and words.on_cpu())  # none on CPU processes, so none shown
        ],
    )
