"""One story across surfaces: one name and definition per figure, experiments as the
user ran them, CPU runs that say so, and charts that fit their data.

The real runs are the session's shared ones (``tests/support/shared_runs.py``) plus one real
``torchscale profile`` launch written into a copy of the healthy benchmark (the seed's Use Case);
the rest reads recorded-style fixtures (``tests/support/report_fixtures.py``).
"""

from __future__ import annotations

import io
import json
import re
import shutil
import xml.etree.ElementTree as ET
from dataclasses import replace
from html import unescape
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from tests.support.html_tables import html_tables
from tests.support.pdf_pages import needs_poppler, pages_text
from tests.support.report_fixtures import (
    MODELS,
    SCRIPT_NAME,
    FixtureSpec,
    SessionReport,
    stall_findings,
    training_record,
    write_cell_findings,
    write_experiment,
    write_profile_run,
)
from tests.support.shared_runs import ProfileRun, Run
from tests.support.step_records import parts_record as _parts
from torchscale.analysis.iteration_breakdown import comm_compute_table
from torchscale.analysis.lost_efficiency import lost_efficiency_table
from torchscale.analysis.report_data import load_report_data
from torchscale.analysis.report_tables import cell_variants, document_tables, experiments_tables
from torchscale.analysis.training_tables import training_table
from torchscale.app.report import report_content
from torchscale.cli.app import app
from torchscale.hardware.device_noun import cpu_run_note
from torchscale.measures.figures import (
    FIGURES,
    GLOSSARY_DOC,
    SCALING_EFFICIENCY,
    SYNC_OVERHEAD,
    SYNC_STALL,
    glossary_markdown,
)
from torchscale.report import formatting as fmt
from torchscale.report.breakdown_sections import comm_compute_section
from torchscale.report.charts import VERDICT_COLORS, comparison_charts
from torchscale.report.document import build_document, render_documents
from torchscale.report.elements import Chart, Series
from torchscale.report.lost_efficiency_section import lost_efficiency_section
from torchscale.report.plotly_charts import figure
from torchscale.report.svg_charts import LABEL_LINE, _Frame, svg, wrap_label
from torchscale.results.files import append_jsonl
from torchscale.results.layout import FINDINGS_FILE
from torchscale.results.schema import TrainingResult
from torchscale.results.store import ExperimentStore

ROOT = Path(__file__).resolve().parents[1]
SVG = "{http://www.w3.org/2000/svg}"
runner = CliRunner()


def _text(html: str) -> str:
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S)
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def _finding_titles(html: str) -> List[str]:
    section = html[html.index('id="findings"') : html.index('id="glossary"')]
    return [unescape(t) for t in re.findall(r"<h4>(.*?)</h4>", section, flags=re.S)]


# --- one name, one definition --------------------------------------------------------------------


def test_the_glossary_is_current_and_every_surface_links_it(
    fixture_results: Path, session_report: SessionReport
) -> None:
    doc = (ROOT / GLOSSARY_DOC).read_text(encoding="utf-8")
    assert doc == glossary_markdown(), (
        "docs/glossary.md is stale: python -m torchscale.measures.figures > docs/glossary.md"
    )
    names = [shown.name for shown in FIGURES.values()]
    assert len(set(names)) == len(names)  # two quantities never share a name
    assert {"sync overhead", "sync stall time", "exposed communication"} <= set(names)
    assert GLOSSARY_DOC in (ROOT / "README.md").read_text(encoding="utf-8")
    for args in (["--help"], ["report", "--help"]):
        assert GLOSSARY_DOC in " ".join(runner.invoke(app, args).output.split())
    html = session_report(fixture_results, "html").read_text("utf-8")
    glossary = html[html.index('id="glossary"') : html.index('id="environment"')]
    for shown in FIGURES.values():
        assert f'id="glossary-{shown.key}"' in glossary
        assert unescape(glossary).count(shown.definition) == 1
    assert 'href="#glossary"' in html[html.index("<footer") :]


def test_one_rank_has_no_sync_overhead_and_one_count_no_scaling_efficiency(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torchscale.cli.benchmark_view as view

    scaled = FixtureSpec(name="lone", models=MODELS[:1], batch_sizes=(32,), gpu_counts=(1, 2),
                         failures=False, collectives=False, findings=False)  # fmt: skip
    folder = write_experiment(tmp_path, scaled)
    write_experiment(tmp_path, replace(scaled, batch_sizes=(64,), gpu_counts=(4,), seed=1))
    records = [r for r in ExperimentStore(folder).records() if isinstance(r, TrainingResult)]
    one = next(r for r in records if r.world_size == 1)
    assert one.sync is not None and one.sync.exposed_fraction is not None  # recorded, not shown
    lone = next(r for r in records if r.batch_size == 64)
    table: Any = training_table(records).set_index("cell_id")  # read cell by cell
    assert pd.isna(table.loc[one.cell_id, "sync_overhead_pct"])
    assert pd.isna(table.loc[lone.cell_id, "scaling_efficiency"])
    two = next(r for r in records if r.world_size == 2)
    assert two.samples_per_s is not None and one.samples_per_s is not None
    assert table.loc[two.cell_id, "scaling_efficiency"] == pytest.approx(
        two.samples_per_s / (2 * one.samples_per_s)
    )
    # The console says "-" for both, never 15.6% or 100%.
    cells = {row["GPUs"]: row for row in _console_rows(view, monkeypatch, records)}
    sync, scaling = f"{SYNC_OVERHEAD.name} %", SCALING_EFFICIENCY.name
    assert cells["1"][sync] == "-" and cells["4"][scaling] == "-"
    assert cells["2"][scaling] == f"{two.samples_per_s / (2 * one.samples_per_s):.0%}"
    # The report and the JSON document: "–" and null.
    data = load_report_data(folder)
    rows = html_tables(_render(data))["scaling-table"]
    by_cell = {(r["Configuration"], r["GPUs"]): r for r in rows}
    assert by_cell[("batch 64", "4")]["Scaling efficiency"] == fmt.MISSING
    assert by_cell[("batch 32", "1")][f"{SYNC_OVERHEAD.title} %"] == fmt.MISSING
    entries = {
        e.world_size: e
        for e in build_document(document_tables(data.experiments[0])).results.training
    }
    assert entries[4].scaling_efficiency is None and entries[1].sync_overhead_pct is None


def _console_rows(view, monkeypatch, records) -> List[Dict[str, str]]:
    """The benchmark's final table on a wide console, one dict per row keyed by header."""
    console = Console(file=io.StringIO(), width=200, color_system=None)
    monkeypatch.setattr(view, "err_console", console)
    console.print(view.results_table(training_table(records), "t"))
    assert isinstance(console.file, io.StringIO)
    lines = console.file.getvalue().splitlines()
    header = [c.strip() for c in next(line for line in lines if "┃ model" in line).split("┃")]
    return [
        dict(zip(header, (c.strip() for c in line.split("│"))))
        for line in lines
        if line.startswith("│")
    ]


def _render(data) -> str:
    from torchscale.report.render import render_html

    return render_html(report_content(data))


# --- a profile run in a benchmark's folder is that experiment's profile -------------------------


def test_a_profile_run_beside_its_benchmark_is_that_experiments_profile(tmp_path: Path) -> None:
    root = tmp_path / "scaling_results"
    spec = FixtureSpec(name="scaling_analysis", models=MODELS[:1], batch_sizes=(32,),
                       gpu_counts=(1, 2, 4), straggler=None, failures=False, collectives=False,
                       findings=False)  # fmt: skip
    bench = write_experiment(root, spec)
    records = [r for r in ExperimentStore(bench).records() if isinstance(r, TrainingResult)]
    at_four = next(r for r in records if r.world_size == 4)
    write_cell_findings(bench, at_four.cell_id, stall_findings(6.6, 0.48))  # the cell's own trace
    run = write_profile_run(root, at_four, stall_findings(10.7, 0.82))

    data = load_report_data(root)
    assert data.title == "scaling_analysis" and len(data.experiments) == 1
    assert [p.path for p in data.experiments[0].profiles] == [run]
    content = report_content(data)
    assert content.title == "scaling_analysis"
    assert (content.cards[0].label, content.cards[0].value) == ("Training cells measured", "3 / 3")
    html = _render(data)
    scaling = html_tables(html)["scaling-table"]
    assert sorted(r["GPUs"] for r in scaling) == ["1", "2", "4"]  # not the profile's cell
    # Findings once: the profile run's, naming the benchmark cell's trace of the same rule too.
    titles = _finding_titles(html)
    assert len(titles) == len(set(titles))
    stall = [t for t in titles if t.startswith("Ranks wait")]
    assert stall == ["Ranks wait 10.7% of step time in collectives, with no single straggler"]
    profiles = html_tables(html)["profile-table"]
    assert [r["Traced by"] for r in profiles] == ["benchmark cell", "torchscale profile (torch)"]
    assert [r[f"{SYNC_STALL.title} %"] for r in profiles] == ["6.6%", "10.7%"]
    overhead = (
        training_table(records).set_index("cell_id").loc[at_four.cell_id, "sync_overhead_pct"]
    )
    (relation,) = next(s for s in content.sections if s.section_id == "profiles").notes
    assert f"sync overhead of {fmt.percent(overhead)}" in relation
    assert "sync stall time of 10.7%" in relation
    document = json.loads(render_documents(experiments_tables(data)))
    assert isinstance(document, dict) and document["name"] == "scaling_analysis"
    assert [p["traced_by"] for p in document["profiles"]] == [
        "benchmark cell",
        "torchscale profile",
    ]
    # Reported on its own, a profile run is an experiment with one GPU count: no scaling figure.
    alone = training_table(load_report_data(run).records)
    assert alone["scaling_efficiency"].isna().all()


@pytest.mark.slow
def test_the_use_case_benchmark_then_profile_into_its_folder_then_report(
    healthy_run: Run, use_case_profile: ProfileRun, tmp_path: Path
) -> None:
    """The seed's Use Case on real launches: the shared benchmark (1 and 2 ranks), a real
    ``torchscale profile`` with no model into the same folder (shared), then ``report
    generate``."""
    benchmark = healthy_run
    results = tmp_path / "scaling_results"
    shutil.copytree(use_case_profile.folder, results)
    profiled = use_case_profile.result
    assert profiled.exit_code == 0, profiled.output
    (run,) = [p for p in results.iterdir() if p.name.startswith("profile-")]
    (findings_file,) = run.rglob(FINDINGS_FILE)
    traced = json.loads(findings_file.read_text(encoding="utf-8"))
    (record,) = ExperimentStore(run).records()
    assert isinstance(record, TrainingResult)
    assert record.sync is not None and record.sync.exposed_fraction is not None
    overhead = 100 * record.sync.exposed_fraction
    assert f"[ANALYSIS] Sync overhead of this cell (its measured window): {overhead:.1f}%" in (
        " ".join(profiled.stderr.split())
    )
    out = tmp_path / "report.html"
    built = runner.invoke(app, ["report", "generate", "--source", str(results), "-o", str(out)])
    assert built.exit_code == 0, built.output
    html = out.read_text(encoding="utf-8")
    escaped = SCRIPT_NAME.replace("<", "&lt;").replace(">", "&gt;")
    assert f'<h1 class="report-title">{escaped}</h1>' in html
    assert "profile-" not in html[: html.index("</header>")]  # the title is the experiment's
    tables = html_tables(html)
    assert "2 / 2" in _text(html[: html.index('id="scaling"')])  # the benchmark's cells only
    ones = [r for r in tables["scaling-table"] if r["Ranks"] == "1"]
    twos = [r for r in tables["scaling-table"] if r["Ranks"] == "2"]
    assert len(ones) == 1 and len(twos) == 1  # no lone 2-rank cell at 100%
    cells = {r.world_size: r for r in ExperimentStore(benchmark.experiment_dir).records()}
    two, one = cells[2], cells[1]
    assert isinstance(two, TrainingResult) and isinstance(one, TrainingResult)
    assert two.throughput is not None and one.throughput is not None
    efficiency = two.throughput / (2 * one.throughput)
    assert twos[0]["Scaling efficiency"] == f"{100 * efficiency:.1f}%"
    titles = _finding_titles(html)
    assert len(titles) == len(set(titles))  # findings once
    for finding in traced["findings"]:
        assert titles.count(finding["title"]) == 1
    (row,) = [r for r in tables["profile-table"] if r["Traced by"].startswith("torchscale profile")]
    assert row[f"{SYNC_STALL.title} %"] == fmt.percent(traced["sync_stall_pct"])
    assert row[f"{SYNC_OVERHEAD.title} %"] == fmt.percent(overhead)


# --- a CPU run says so -------------------------------------------------------------------------


GPU_WORD = re.compile(r"\bGPUs?\b")


def _gpu_words(text: str) -> List[str]:
    """Every "GPU" in ``text`` (with its context) outside the note that says these are not GPU
    figures."""
    text = " ".join(text.split()).replace(cpu_run_note(), "")
    return [text[max(0, m.start() - 60) : m.end() + 30] for m in GPU_WORD.finditer(text)]


@pytest.mark.slow
@needs_poppler
def test_a_cpu_runs_first_screen_and_first_pdf_page_say_cpu_processes(
    healthy_run: Run, session_report: SessionReport
) -> None:
    real = healthy_run.output_dir
    html = session_report(real, "html").read_text(encoding="utf-8")
    first_screen = _text(html[: html.index('id="scaling"')])
    assert "used gloo on CPU processes" in first_screen and "not GPU figures" in first_screen
    assert "Scaling efficiency at 2 CPU processes" in first_screen
    first_page = " ".join(pages_text(session_report(real, "pdf"))[0].split())
    assert "gloo on CPU processes" in first_page and "not GPU figures" in first_page
    assert "SCALING EFFICIENCY AT 2 CPU PROCESSES" in first_page
    # Past the first screen too: every section, table, chart and page says CPU process or rank.
    data = load_report_data(healthy_run.experiment_dir)
    content = report_content(data)
    shown = {s.section_id for s in content.sections if not s.is_empty}
    assert {"memory", "lost-efficiency", "scaling", "latency"} <= shown  # the sections scanned
    assert _gpu_words(_text(html)) == []
    drawn = [
        text
        for chart in content.charts
        for text in [chart.title, chart.x_title, chart.y_title, *chart.categories()]
        + [series.name for series in chart.series]
    ]
    assert "batch 4, 2 CPU processes" in drawn  # the lost-efficiency chart's bar
    assert _gpu_words(" | ".join(drawn)) == []  # plotly draws these from its script
    every_page = " ".join(pages_text(session_report(real, "pdf")))
    assert "Memory per rank" in every_page and "batch 4, 2 CPU processes" in every_page
    assert _gpu_words(every_page) == []
    # NVML's figures are never measured on CPU processes: no column of "–", no glossary line.
    memory = html_tables(html)["memory-table"]
    assert memory and not any("utilisation" in header for header in memory[0])
    assert 'id="glossary-gpu-memory-utilisation"' not in html
    lost = html_tables(html)["lost-efficiency-table"]
    assert [row["Ranks"] for row in lost] == ["2"]
    document = build_document(document_tables(data.experiments[0]))
    assert document.config.ranks == "CPU processes" and "not GPU figures" in str(
        document.config.note
    )


def test_glossary_names_are_the_same_on_console_html_and_json_for_one_cell(
    healthy_run: Run, session_report: SessionReport, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torchscale.cli.benchmark_view as view

    folder = healthy_run.experiment_dir
    records = {r.world_size: r for r in ExperimentStore(folder).records()}
    two = records[2]
    assert isinstance(two, TrainingResult) and two.sync and two.sync.exposed_fraction is not None
    overhead = 100 * two.sync.exposed_fraction
    one = records[1]
    assert isinstance(one, TrainingResult)
    assert two.samples_per_s is not None and one.samples_per_s is not None
    efficiency = two.samples_per_s / (2 * one.samples_per_s)
    rows = _console_rows(view, monkeypatch, list(records.values()))
    (row,) = [r for r in rows if r["GPUs"] == "2"]
    assert row[f"{SYNC_OVERHEAD.name} %"] == f"{overhead:.1f}"
    assert row[SCALING_EFFICIENCY.name] == f"{efficiency:.0%}"
    scaling = html_tables(session_report(healthy_run.output_dir, "html").read_text("utf-8"))[
        "scaling-table"
    ]
    (cell,) = [r for r in scaling if r["Ranks"] == "2"]
    assert cell[f"{SYNC_OVERHEAD.title} %"] == fmt.percent(overhead)
    assert cell[SCALING_EFFICIENCY.title] == fmt.fraction(efficiency)
    document = build_document(document_tables(load_report_data(folder).experiments[0])).model_dump(
        mode="json"
    )
    (entry,) = [e for e in document["results"]["training"] if e["world_size"] == 2]
    assert entry[SYNC_OVERHEAD.column] == pytest.approx(overhead)
    assert entry[SCALING_EFFICIENCY.column] == pytest.approx(efficiency)


# --- charts that fit their data ----------------------------------------------------------------

BAR = re.compile(r"M([\d.]+) ([\d.]+)h([\d.]+)V([\d.]+)H[\d.]+Z")
CAUSES_WITH_A_GAIN = [
    _parts([(10.0, 100.0, 0.0)]),
    # 2 ranks: batches come slower, but compute runs faster (interference gives points back)
    _parts([(14.0, 80.0, 30.0), (14.0, 95.0, 15.0)]),
]


def _stacked_charts(fixture_results: Path) -> List[Chart]:
    """Every kind of stacked chart, from fixed inputs: the fixture's memory and lost-efficiency
    charts, a lost-efficiency chart with a negative cause, DDP's comm-vs-compute bars, and the
    parts 60, 55 and -40 whose net total (75) is below the stack's top (115)."""
    content = report_content(load_report_data(fixture_results))
    lost = lost_efficiency_section(lost_efficiency_table(CAUSES_WITH_A_GAIN))
    ddp = {"ddp_forward_compute_ms": 30.0, "ddp_backward_compute_ms": 60.0,
           "ddp_backward_comm_ms": 25.0, "ddp_backward_overlap_ms": 18.0}  # fmt: skip
    record = CAUSES_WITH_A_GAIN[1]
    traced = record.model_copy(
        update={"per_rank": [r.model_copy(update=ddp) for r in record.per_rank]}
    )
    comm = comm_compute_section(comm_compute_table([traced], cell_variants([traced])))
    assert lost is not None and comm is not None
    x = ["batch 4, 2 ranks"]
    parts = [Series(n, x, [v], kind="bar") for n, v in (("a", 60.0), ("b", 55.0), ("c", -40.0))]
    planted = Chart("planted", "Parts 60, 55 and -40", "configuration", "points", parts,
                    pd.DataFrame(), x_type="category", barmode="stack")  # fmt: skip
    charts = [c for c in content.charts if c.barmode == "stack"] + lost.charts + comm.charts
    return [*charts, planted]


def _relative_stacks(chart: Chart) -> List[Tuple[float, float]]:
    """Each bar part's (base, end), positive parts stacked up from zero and negative ones down
    (Plotly's relative barmode), worked out here independently of the renderers."""
    up: Dict[str, float] = {}
    down: Dict[str, float] = {}
    spans = []
    for series in chart.series:
        for x, y in zip(series.x, series.y):
            if series.kind == "bar" and y is not None and y == y:
                side = up if y >= 0 else down
                base = side.get(str(x), 0.0)
                side[str(x)] = base + float(y)
                spans.append((base, base + float(y)))
    return spans


def test_stacked_bars_with_negative_parts_fit_their_axis_in_the_pdf_and_the_html(
    fixture_results: Path,
) -> None:
    charts = _stacked_charts(fixture_results)
    kinds = {c.chart_id.split("-")[0] for c in charts}
    assert kinds == {"memory", "comm", "lost", "planted"}, kinds  # every kind of stacked chart
    negative = [c.chart_id for c in charts if any(lo > hi for lo, hi in _relative_stacks(c))]
    # A lost-efficiency part below zero is noise, drawn as no bar (its chart has a cause that
    # gave points back: CAUSES_WITH_A_GAIN); the other stacked charts keep their negative parts.
    assert "planted" in negative and not any(c.startswith("lost") for c in negative)
    (gain,) = lost_efficiency_table(CAUSES_WITH_A_GAIN)["interference_pts"]
    assert gain < 0
    for chart in charts:
        spans = _relative_stacks(chart)
        frame = _Frame(chart, chart.categories())
        ends = [end for _, end in spans]
        assert frame.y_ticks[0] <= min(0.0, *ends) and frame.y_ticks[-1] >= max(ends)
        # Every part drawn where its unclipped values put it: a part past the axis would be cut.
        expected = sorted(
            (round(min(frame.y(a), frame.y(b)), 1), round(max(frame.y(a), frame.y(b)), 1))
            for a, b in spans
        )
        tree = ET.fromstring(svg(chart))
        drawn = sorted((float(m[1]), float(m[3])) for p in tree.iter(f"{SVG}path")
                       if p.get("fill", "none") != "none" for m in BAR.findall(p.get("d", "")))  # fmt: skip
        flat = [y for span in drawn for y in span]
        assert flat == pytest.approx([y for span in expected for y in span], abs=0.11), (
            chart.chart_id
        )
        title = next(t for t in tree.iter(f"{SVG}text") if t.text == chart.title)
        assert min(top for top, _ in drawn) >= frame.top > float(title.get("y", "0"))
        assert max(bottom for _, bottom in drawn) <= frame.bottom
        # The HTML stacks by the same rule (Plotly's own "stack" hangs a negative part from the
        # running total), from the same values.
        plotted = figure(chart)
        assert plotted["layout"]["barmode"] == "relative"  # type: ignore[index]
        bars = [t for t in plotted["data"] if t["type"] == "bar"]  # type: ignore[attr-defined]
        assert [list(t["y"]) for t in bars] == [
            [None if v != v else v for v in s.y] for s in chart.series if s.kind == "bar"
        ]
    planted = _Frame(charts[-1], charts[-1].categories())
    assert planted.y_ticks[-1] >= 115 and planted.y_ticks[0] <= -40


@needs_poppler
def test_the_pdf_draws_every_stacked_chart_with_its_title(
    fixture_results: Path, session_report: SessionReport
) -> None:
    content = report_content(load_report_data(fixture_results))
    stacked = [c for c in content.charts if c.barmode == "stack"]
    assert stacked
    text = " ".join(" ".join(pages_text(session_report(fixture_results, "pdf"))).split())
    for chart in stacked:
        assert chart.title in text


def test_tune_charts_show_whole_labels_and_the_finalists_intervals(tmp_path: Path) -> None:
    from torchscale.analysis.report_tables import report_tables
    from torchscale.report.tuning import tuning_sections

    folder = _tune_folder(tmp_path)
    (section,) = tuning_sections(report_tables(load_report_data(folder)).tuning)
    effects = next(c for c in section.charts if c.chart_id.startswith("tuning-effects"))
    assert effects.long_categories()
    layout: Any = figure(effects)["layout"]
    assert layout["xaxis"]["tickangle"] == -30 and layout["legend"]["orientation"] == "v"
    drawn = [" ".join(t.itertext()) for t in ET.fromstring(svg(effects)).iter(f"{SVG}text")]
    for label in effects.categories():
        assert label in drawn  # whole, never "bucket_ca…"
    long = "resnet-synthetic · batch 32 · 8 GPUs × 2 nodes"  # wraps onto lines, never cut
    assert " ".join(wrap_label(long)) == long and max(map(len, wrap_label(long))) <= LABEL_LINE
    verdict = next(c for c in section.charts if c.chart_id.startswith("tuning-verdict"))
    finalists = json.loads((folder / "tune.json").read_text())["verdict"]["finalists"]
    for item in finalists:
        series = next(s for s in verdict.series if f"trial {item['trial']}" in
                      [x for x, y in zip(s.x, s.y) if y is not None])  # fmt: skip
        at = series.x.index(f"trial {item['trial']}")
        base = item["baseline_samples_per_s"]
        assert series.low is not None and series.high is not None
        assert series.low[at] == pytest.approx(base * (1 + item["ci_low_pct"] / 100))
        assert series.high[at] == pytest.approx(base * (1 + item["ci_high_pct"] / 100))
        data: Any = figure(verdict)["data"]
        bar = next(t for t in data if t["name"] == series.name)
        assert bar["error_y"]["array"][at] == pytest.approx(series.high[at] - series.y[at])
    whiskers = [p for p in ET.fromstring(svg(verdict)).iter(f"{SVG}path")
                if p.get("stroke") == "#111827" and "V" in p.get("d", "")]  # fmt: skip
    assert sum(p.get("d", "").count("V") for p in whiskers) == len(finalists)


def _tune_folder(tmp_path: Path) -> Path:
    """A tune folder as ``torchscale tune`` leaves it: a trial record and tune.json."""
    store = ExperimentStore(tmp_path / "mlp" / "tune")
    store.write_manifest({"schema_version": 1, "experiment": "mlp", "config": {}})
    rng = np.random.default_rng(0)
    store.append(training_record(MODELS[0], 32, 2, 0, FixtureSpec(name="mlp"), rng))
    knobs = ("ddp.bucket_cap_mb", "ddp.gradient_as_bucket_view", "ddp.static_graph")
    trials = []
    for number in range(8):
        params = dict(zip(knobs, ([1, 25, 100][number % 3], bool(number % 2), number > 3)))
        trials.append(
            {
                "number": number,
                "state": "complete",
                "params": params,
                "samples_per_s": 1000.0 + 20 * number,
                "screen_samples_per_s": None,
            }
        )
    finalists = [
        {"trial": 7, "changed": {"ddp.bucket_cap_mb": 25}, "samples_per_s": 1150.0,
         "baseline_samples_per_s": 1000.0, "gain_pct": 15.0, "ci_low_pct": 9.0,
         "ci_high_pct": 21.0, "significant": True},
        {"trial": 5, "changed": {"ddp.static_graph": True}, "samples_per_s": 1020.0,
         "baseline_samples_per_s": 1000.0, "gain_pct": 2.0, "ci_low_pct": -3.0,
         "ci_high_pct": 7.0, "significant": False},
    ]  # fmt: skip
    summary = {"experiment": "mlp", "line": "> [TUNE] +15.0% with bucket_cap_mb=25",
               "trials": trials, "verdict": {"finalists": finalists}}  # fmt: skip
    (store.root / "tune.json").write_text(json.dumps(summary), encoding="utf-8")
    return store.root


def test_comparison_bars_take_the_colour_of_their_own_metrics_verdict() -> None:
    cells = pd.DataFrame(
        [
            # a p95 regression with throughput inside the threshold (a -2.4% bar drawn red)
            {"model": "m", "variant": "batch 8", "world_size": 2, "nnodes": 1,
             "throughput_change_pct": -2.4, "throughput_ci_low_pct": -4.0,
             "throughput_ci_high_pct": -0.8, "p95_change_pct": 14.2, "p95_ci_low_pct": 2.3,
             "p95_ci_high_pct": 22.1, "verdict": "regression",
             "throughput_verdict": "unchanged", "p95_verdict": "regression"},
            {"model": "m", "variant": "batch 8", "world_size": 4, "nnodes": 1,
             "throughput_change_pct": -5.8, "throughput_ci_low_pct": -12.0,
             "throughput_ci_high_pct": 1.0, "p95_change_pct": 3.0, "p95_ci_low_pct": -2.0,
             "p95_ci_high_pct": 8.0, "verdict": "within noise",
             "throughput_verdict": "within noise", "p95_verdict": "unchanged"},
        ]
    )  # fmt: skip
    throughput, p95 = comparison_charts(cells, 5.0)

    def bar_of(chart, value: float) -> str:
        return next(s.name for s in chart.series if value in s.y)

    assert bar_of(throughput, -2.4) == "unchanged" and bar_of(p95, 14.2) == "regression"
    assert bar_of(throughput, -5.8) == "within noise"
    assert throughput.colors()["unchanged"] == VERDICT_COLORS["unchanged"]
    unchanged = next(s for s in throughput.series if s.name == "unchanged")
    assert unchanged.low is not None
    assert unchanged.low == [-4.0, None] or unchanged.low[0] == -4.0  # its interval is drawn
    assert throughput.hlines == [(-5.0, "-5% threshold")] and p95.hlines == [(5.0, "+5% threshold")]


def test_the_communication_only_reports_first_cards(tmp_path: Path) -> None:
    spec = FixtureSpec(name="comm", models=(), failures=False, findings=False)
    folder = write_experiment(tmp_path, spec)
    for index in range(10):
        append_jsonl(
            ExperimentStore(folder).results_path,
            {"schema_version": 1, "kind": "collective", "experiment": "comm",
             "cell_id": f"comm-all_reduce-g16-{index}", "status": "skipped", "op": "all_reduce",
             "dtype": "float32", "world_size": 16, "nproc_per_node": 16,
             "size_bytes": 1024 << index,
             "error": "needs 16 GPUs; this node has 8"},
        )  # fmt: skip
    records = load_report_data(folder).records
    content = report_content(load_report_data(folder))
    statuses = [r.status for r in records]
    first = content.cards[0]
    assert first.label == "Communication cells measured"
    assert first.value == f"{statuses.count('ok')} / {len(statuses)}"
    assert "10 skipped" in first.detail and "1 failed" in first.detail
    assert not any(card.value == "0 / 0" for card in content.cards)
    best = max((r for r in records if getattr(r, "op", "") == "all_reduce" and r.status == "ok"),
               key=lambda r: r.busbw_gbps)  # type: ignore[attr-defined]  # fmt: skip
    bandwidth = next(c for c in content.cards if c.label.startswith("Peak busbw"))
    assert bandwidth.label == "Peak busbw (all_reduce, GB/s)"
    assert bandwidth.value == fmt.significant(best.busbw_gbps)  # type: ignore[attr-defined]
    assert fmt.fraction(best.busbw_peak_fraction) in bandwidth.detail  # type: ignore[attr-defined]
