"""The newcomer's recipes of docs/architecture.md, each proven with a toy registered through its
one declaration and seen by the fast code path (no torchrun):

* a trace analysis: one ``TraceTable`` line (``profiling/trace_tables.py``) -> computed by
  ``profile analyze``, written as its CSV, listed in findings.json and on the console;
* a validate probe: one ``Probe`` entry with its SKU figure (``hardware/expected_figures.py``)
  and its measurement (``Measure.figure``, as ``validate/device_probes.py`` calls it) -> timed on
  this CPU, judged against its SKU figure and its peer, its row with its label, unit and fix;
* a report section: its renderer of the analysis' tables and one ``ReportSection`` line
  (``report/section_list.py``) -> drawn in its place, in the HTML and its contents, its charts
  among the PNG charts.

(A cell kind's recipe is proven by tests/test_kind_plugins.py with tests/support/toy_kind.py.)
"""

from __future__ import annotations

import base64
import csv
import io
import json
from pathlib import Path
from typing import List, Optional

import pandas as pd
import pytest
from typer.testing import CliRunner

from tests.support.profile_helpers import DATA
from torchscale.cli.app import app
from torchscale.profiling import trace_tables
from torchscale.profiling.traces.model import RankTrace
from torchscale.report import formatting as fmt
from torchscale.report.elements import Chart, Column, Section, Series, make_table
from torchscale.results.layout import FINDINGS_FILE

runner = CliRunner()


def toy_events(traces: List[RankTrace]) -> pd.DataFrame:
    """The toy analysis: the events each rank's trace kept."""
    return pd.DataFrame(
        {"rank": [t.rank for t in traces], "events": [t.event_count for t in traces]}
    )


def test_a_trace_analysis_is_one_declaration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    toy = trace_tables.TraceTable("toy_events", trace_tables.of_traces(toy_events))
    declared = (*trace_tables.TRACE_TABLES, toy)
    trace_tables.check_declarations(declared)
    monkeypatch.setattr(trace_tables, "TRACE_TABLES", declared)  # the recipe's one line
    traces = DATA / "gloo_2rank_cpu"
    result = runner.invoke(
        app, ["profile", "analyze", str(traces), "--output-dir", str(tmp_path), "--json"]
    )
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    events = {t["rank"]: t["events"] for t in document["traces"]}
    assert sorted(events) == [0, 1] and all(n > 0 for n in events.values())
    csv_file = tmp_path / "profile_toy_events.csv"  # its CSV, by the layout's rule
    rows = list(csv.DictReader(io.StringIO(csv_file.read_text())))
    assert {int(r["rank"]): int(r["events"]) for r in rows} == events
    written = json.loads((tmp_path / FINDINGS_FILE).read_text())
    assert written["tables"]["toy_events"] == "profile_toy_events.csv"
    assert list(written["tables"]) == [t.name for t in declared]  # every table, none left out
    assert all((tmp_path / name).is_file() for name in written["tables"].values())
    assert "profile_toy_events.csv" in result.stderr  # "Wrote ..." names it


def test_a_validate_probe_is_one_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from torchscale.config.validate_section import ValidateSection
    from torchscale.hardware import expected_figures as figures
    from torchscale.validate.device_probes import Measure, ProbeRun
    from torchscale.validate.judging import error_checks, judge_figures, probe_checks
    from torchscale.validate.probe_timing import Figure, format_value
    from torchscale.validate.result import Status

    fix = "Toy fill below expected: check the toy's memory."
    toy = figures.Probe("Toy fill", "GB/s", 2, figures.EACH_DEVICE, fix)
    sku = (("toy",), {"toy_fill": figures.Expected(1e6, "the toy's datasheet")})
    # the recipe: the probe's entry and its SKU figure, in the one declaration module
    monkeypatch.setitem(figures.PROBES, "toy_fill", toy)
    monkeypatch.setattr(figures, "EXPECTED", (sku, *figures.EXPECTED))
    figures.check_probes(figures.PROBES, figures.EXPECTED)
    assert "toy_fill" in figures.probes_measured_on(figures.EACH_GPU, figures.EACH_DEVICE)

    # ... and its measurement, as device_probes measures every probe (timed here, on this CPU)
    settings = ValidateSection.model_validate({"window_s": 0.02, "repeats": 2})
    run = ProbeRun()
    m = Measure(torch.device("cpu"), "CPU 0", "Toy device", settings, run)
    nbytes = 8 << 20

    def prepare():
        buffer = torch.empty(nbytes // 4)
        return lambda: buffer.fill_(1.0)

    m.figure("toy_fill", prepare, float(nbytes), 1e-9)

    def no_memory():
        raise MemoryError("out of memory for the toy")

    m.figure("toy_fill", no_memory, 1.0, 1.0)
    [measured] = run.figures
    assert measured.probe == "toy_fill" and measured.value > 0
    peer = Figure("toy_fill", "CPU 1", measured.value * 2, "Toy device")
    judged = judge_figures([measured, peer], settings, cpu=False)
    assert judged[0].expected == 1e6 and judged[0].expected_source == "the toy's datasheet"
    assert judged[0].vs_expected == pytest.approx(measured.value / 1e6)
    assert judged[0].vs_peers == pytest.approx(0.5)
    assert judged[0].to_dict()["label"] == "Toy fill" and judged[0].to_dict()["unit"] == "GB/s"
    [row] = probe_checks(judged, cpu=False)
    assert row.name == "Toy fill" and row.status is Status.FAIL and row.fix == fix
    assert row.value.startswith(f"CPU 0: {format_value(measured.value)} GB/s, ")
    assert f"of expected {format_value(1e6)}" in row.value and "0.50 of its peers" in row.value
    [failed] = error_checks(run.errors)
    assert failed.name == "Toy fill (could not run)" and "out of memory for the toy" in failed.value


def toy_section(cell_table: pd.DataFrame) -> Optional[Section]:
    """The toy section: every measured training cell's throughput, as a table and a bar chart
    (drawn from a table the analysis computed: nothing computed here)."""
    ok = cell_table[cell_table["status"] == "ok"]
    if ok.empty:
        return None
    labels = [f"{m} × {w}" for m, w in zip(ok["model"], ok["world_size"])]
    rows = ok.assign(cell=labels)[["cell", "throughput"]]
    chart = Chart(
        "toy-chart", "Toy throughput", "cell", "per s",
        [Series("throughput", labels, rows["throughput"].tolist(), kind="bar")],
        rows, x_type="category",
    )  # fmt: skip
    columns = [Column("cell", "Cell", fmt.text, numeric=False), Column("throughput", "Per s", str)]
    return Section("toy", "Toy throughputs", "Every cell's throughput.", charts=[chart],
                   tables=[make_table("toy-table", rows, columns)])  # fmt: skip


def test_a_report_section_is_one_declaration(
    monkeypatch: pytest.MonkeyPatch, fixture_results: Path
) -> None:
    from torchscale.analysis.report_data import load_report_data
    from torchscale.app.report import report_content
    from torchscale.report import section_list
    from torchscale.report.render import render_html
    from torchscale.results.schema import TrainingResult

    toy = section_list.ReportSection("toy", ("cell_table",), toy_section)
    declared = (*section_list.SECTIONS, toy)
    section_list.check_sections(declared)
    monkeypatch.setattr(section_list, "SECTIONS", declared)  # the recipe's one line
    data = load_report_data(fixture_results)
    content = report_content(data)
    # drawn last, as declared, with the figures of the records (the analysis' table)
    assert content.sections[-1].section_id == "toy"
    # every section drawn comes from the list: a declared name, or a kind's or a tuning run's own
    named = {s.name for s in declared if not s.several}
    assert {"scaling", "latency", "toy"} <= {s.section_id for s in content.sections}
    assert all(
        s.section_id in named or not s.section_id.startswith(tuple(named)) for s in content.sections
    )
    measured = [r for r in data.records if isinstance(r, TrainingResult) and r.status == "ok"]
    table = content.sections[-1].tables[0]
    assert len(table.rows) == len(measured)
    shown = csv.DictReader(io.StringIO(base64.b64decode(table.csv_uri.split(",")[1]).decode()))
    assert all(r.throughput is not None for r in measured)
    assert sorted(float(row["throughput"]) for row in shown) == sorted(
        r.throughput for r in measured if r.throughput is not None
    )
    assert content.charts[-1].chart_id == "toy-chart"  # PNG charts are the sections' charts
    html = render_html(content)  # the HTML (and the PDF, its template) shows it, in its contents
    assert '<section id="toy" class="report-section">' in html and 'href="#toy"' in html
    assert html.index('href="#projection"') < html.index('href="#toy"')
    section_list.check_sections(section_list.SECTIONS)
    with pytest.raises(TypeError, match="report section 'toy' declared 2 times"):
        section_list.check_sections((*declared, toy))
