"""Every section of the report, declared once: its name, the tables it draws, how, in order.

The HTML (its contents and its sections), the PDF (the same template) and the PNG charts (the
sections' charts) all come from ``SECTIONS``, in this order; the summary, findings, failures,
glossary and environment frame them. A section's ``name`` is its anchor in the HTML; ``tables``
are the fields of ``analysis.report_tables.ReportTables`` it is given, in argument order, so a
section draws and never computes. A test refuses a section built but not declared here, and one
declared with no renderer or a table that does not exist.

Adding a section: write its renderer (a function of the tables, returning a ``Section`` or
``None`` when there is nothing to show) and add one line here. A table it needs that does not
exist yet is a field of ``ReportTables``, computed in ``report_tables``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, fields
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import pandas as pd

from torchscale.analysis.report_tables import ComparisonTables, ReportTables
from torchscale.report import node_section as nodes
from torchscale.report import sections
from torchscale.report.breakdown_sections import comm_compute_section, histogram_charts
from torchscale.report.elements import Section
from torchscale.report.lost_efficiency_section import lost_efficiency_section
from torchscale.report.profile_section import profile_section
from torchscale.report.projection_section import projection_section
from torchscale.report.reported_kinds import kind_sections
from torchscale.report.telemetry_section import telemetry_section
from torchscale.report.tuning import tuning_sections

Drawn = Union[Optional[Section], Sequence[Optional[Section]]]


@dataclass(frozen=True)
class ReportSection:
    name: str  # the section's anchor (``Section.section_id``)
    tables: Tuple[str, ...]  # the ``ReportTables`` fields it draws, in argument order
    draw: Callable[..., Drawn]
    several: bool = False  # several sections (one per tuning run, or each kind's own)

    def sections(self, tables: ReportTables) -> List[Optional[Section]]:
        drawn = self.draw(*(getattr(tables, name) for name in self.tables))
        if drawn is None or isinstance(drawn, Section):
            return [drawn]
        return list(drawn)


def _comparison(comparison: Optional[ComparisonTables]) -> Optional[Section]:
    if comparison is None:
        return None
    return sections.comparison_section(
        comparison.result, comparison.threshold_pct, comparison.baseline
    )


def _latency(
    cell_table: pd.DataFrame,
    latency: pd.DataFrame,
    pooled: pd.DataFrame,
    samples: pd.DataFrame,
    histogram: pd.DataFrame,
) -> Section:
    section = sections.latency_section(cell_table, latency, pooled, samples)
    section.charts += histogram_charts(histogram)
    return section


def _kinds(records: Any) -> List[Optional[Section]]:
    return kind_sections(records)


SECTIONS: Tuple[ReportSection, ...] = (
    ReportSection("comparison", ("comparison",), _comparison),
    ReportSection("tuning", ("tuning",), tuning_sections, several=True),
    ReportSection("scaling", ("curves",), sections.scaling_section),
    ReportSection("nodes", ("nodes",), nodes.node_section),
    ReportSection(
        "latency", ("cell_table", "latency", "pooled_latency", "samples", "histogram"), _latency
    ),
    ReportSection("memory", ("memory",), sections.memory_section),
    ReportSection("utilisation", ("cell_table",), sections.utilisation_section),
    ReportSection(
        "sync", ("cell_table", "pooled_ranks", "ranks", "rank_wait"), sections.sync_section
    ),
    ReportSection("profiles", ("profiles",), profile_section),
    ReportSection("lost-efficiency", ("lost_efficiency",), lost_efficiency_section),
    ReportSection("comm-compute", ("comm_compute",), comm_compute_section),
    ReportSection(
        "telemetry", ("gpu_telemetry", "cpu_telemetry", "gpu_timeline"), telemetry_section
    ),
    ReportSection("kinds", ("records",), _kinds, several=True),  # each kind's own sections
    ReportSection("projection", ("projection", "past_prediction_error"), projection_section),
)


def _table_names() -> List[str]:
    """What a section may draw: the fields of ``ReportTables`` and its properties."""
    properties = [n for n, v in vars(ReportTables).items() if isinstance(v, property)]
    return [f.name for f in fields(ReportTables)] + properties


def section_problems(declared: Iterable[ReportSection]) -> List[str]:
    """What is wrong with a list of sections (nothing: ``[]``): a section without a name or a
    renderer, a table that does not exist, a renderer that takes other arguments than its
    tables, a name declared twice."""
    problems: List[str] = []
    names: Dict[str, int] = {}
    known = set(_table_names())
    for section in declared:
        if not section.name.strip():
            problems.append("a report section has no name")
        if not callable(section.draw):
            problems.append(f"report section {section.name!r}: no renderer draws it")
        else:
            try:
                inspect.signature(section.draw).bind(*section.tables)
            except TypeError:
                problems.append(
                    f"report section {section.name!r}: its renderer does not take its tables "
                    f"{section.tables}"
                )
        for table in section.tables:
            if table not in known:
                problems.append(f"report section {section.name!r}: no table {table!r}")
        names[section.name] = names.get(section.name, 0) + 1
    problems += [f"report section {n!r} declared {k} times" for n, k in names.items() if k > 1]
    return problems


def check_sections(declared: Iterable[ReportSection]) -> None:
    problems = section_problems(declared)
    if problems:
        raise TypeError("; ".join(problems))


check_sections(SECTIONS)  # a broken list fails at import, in every test, not on a user


def built_sections(tables: ReportTables) -> List[Section]:
    """Every declared section that has something to show, in the declared order."""
    return sections.chart_sections(
        *(section for declared in SECTIONS for section in declared.sections(tables))
    )
