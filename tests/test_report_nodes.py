"""The "Scaling across nodes" section: fixture results on 1, 2 and 4 nodes, in HTML and PDF."""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import replace
from html import unescape
from pathlib import Path

import pandas as pd
import pytest

from tests.support.html_tables import displayed_close, html_tables
from tests.support.pdf_pages import ink, needs_poppler, pages_png, pages_text
from tests.support.report_fixtures import (
    MODELS,
    NODE_SPEC,
    SCRIPT_NAME,
    FixtureSpec,
    SessionReport,
    write_experiment,
)
from torchscale.analysis.node_scaling import node_scaling
from torchscale.analysis.report_data import load_report_data
from torchscale.analysis.report_tables import node_rows
from torchscale.analysis.scaling import label_variants
from torchscale.analysis.training_tables import training_table
from torchscale.app.report import report_content
from torchscale.report.elements import PALETTE
from torchscale.report.plotly_charts import figure
from torchscale.report.svg_charts import svg

G = NODE_SPEC.gpus_per_node
SERIES = {
    "total": "scaling_efficiency",
    "intra-node": "intra_node_efficiency",
    "inter-node": "inter_node_efficiency",
}


def percent(value: float) -> str:
    """How the report shows a fraction: one decimal in percent, a dash when unknown."""
    return "–" if math.isnan(value) else f"{100 * value:.1f}%"


@pytest.fixture(scope="module")
def nodes(node_results: Path, session_report: SessionReport):
    html = session_report(node_results, "html").read_text(encoding="utf-8")
    data = load_report_data(node_results)
    expected = node_scaling(training_table(data.records))
    found = re.search(r'id="report-figures">(.*?)</script>', html, re.S)
    assert found is not None
    figures = json.loads(found.group(1))
    return html, html_tables(html), expected, figures, data


def _node_figures(figures: dict) -> dict:
    """Node charts by configuration title ("model · batch 32")."""
    prefix = "Efficiency across nodes: "
    return {
        unescape(f["layout"]["title"]["text"])[len(prefix) :]: f
        for chart_id, f in figures.items()
        if chart_id.startswith("nodes-")
    }


def test_node_table_shows_node_scalings_figures(nodes) -> None:
    _, tables, expected, _, _ = nodes
    rows = tables["nodes-table"]
    assert len(rows) == len(expected) and (expected["nnodes"] == 4).any()
    shown = {(r["Model"], r["Batch"], r["Nodes × GPUs/node"]): r for r in rows}
    for cell in expected.itertuples():
        row = shown[(cell.model, str(cell.batch_size), f"{cell.nnodes} × {cell.nproc_per_node}")]
        assert row["GPUs"] == str(cell.world_size)
        assert row["Precision"] == cell.precision
        assert displayed_close(row[f"Throughput ({cell.unit}/s)"], cell.throughput)
        assert row["Scaling efficiency"] == percent(cell.scaling_efficiency)
        assert row["Intra-node"] == percent(cell.intra_node_efficiency)
        assert row["Inter-node"] == percent(cell.inter_node_efficiency)
        assert row["Hosts"] == cell.hosts == " ".join(f"node-{c}" for c in "abcd"[: cell.nnodes])
    # total = intra x inter, as the section's intro says
    split = expected.dropna(subset=["inter_node_efficiency"])
    product = split["intra_node_efficiency"] * split["inter_node_efficiency"]
    assert product.to_numpy() == pytest.approx(split["scaling_efficiency"].to_numpy())


def test_a_cell_without_its_one_node_cell_shows_dashes_and_why(nodes) -> None:
    html, tables, expected, figures, _ = nodes
    unsplit = expected[expected["inter_node_efficiency"].isna()]
    assert len(unsplit) == 1 and unsplit.iloc[0]["nnodes"] == 2  # the batch-64 2 x G cell
    cell = unsplit.iloc[0]
    row = next(r for r in tables["nodes-table"] if r["Batch"] == str(cell["batch_size"])
               and r["Nodes × GPUs/node"] == f"2 × {G}")  # fmt: skip
    assert (row["Intra-node"], row["Inter-node"]) == ("–", "–")
    assert row["Scaling efficiency"] == percent(cell["scaling_efficiency"])
    section = unescape(html.split('id="nodes"')[1].split("</section>")[0])
    assert f"the split needs the one-node cell with the same GPUs per node (1 × {G})" in section
    assert f"{cell['model']} · batch {cell['batch_size']}" not in _node_figures(figures)


def test_node_charts_plot_each_factor_of_each_configuration(nodes) -> None:
    _, tables, expected, figures, _ = nodes
    charts = _node_figures(figures)
    split = expected[expected["nproc_per_node"] == G].dropna(subset=["inter_node_efficiency"])
    assert len(charts) == split["config_key"].nunique() == 2
    for (model, batch), rows in split.groupby(["model", "batch_size"]):
        fig = charts[f"{model} · batch {batch}"]
        rows = rows.sort_values("nnodes")
        traces = [t for t in fig["data"] if t["x"] != [None]]  # band legend entries hold no data
        assert [t["name"] for t in traces] == list(SERIES)
        assert [t["name"] for t in fig["data"] if t["x"] == [None]] == [
            "excellent &gt; 90%", "good &gt; 80%"
        ]  # fmt: skip
        for trace in traces:
            assert trace["type"] == "bar"
            assert trace["x"] == [f"{n} × {G}" for n in rows["nnodes"]]
            assert list(rows["nnodes"]) == [1, 2, 4]
            assert trace["y"] == pytest.approx(
                (100 * rows[SERIES[trace["name"]]]).round(2).tolist()
            )
        bands = sorted(s["y0"] for s in fig["layout"]["shapes"] if s["type"] == "rect")
        assert bands == [80, 90]
        chart_id = next(i for i, f in figures.items() if f is fig)
        assert len(tables[f"{chart_id}-data"]) == len(rows)  # the data under the chart


def test_node_charts_are_valid_plotly_and_draw_every_series_in_svg(nodes) -> None:
    import plotly.graph_objects as go

    content = report_content(nodes[4])
    charts = [c for c in content.charts if c.chart_id.startswith("nodes-")]
    assert len(charts) == 2
    for chart in charts:
        go.Figure(figure(chart))  # validates every property against Plotly's schema
        root = ET.fromstring(svg(chart))
        fills = {p.get("fill") for p in root.iter("{http://www.w3.org/2000/svg}path")}
        assert set(PALETTE[:3]) <= fills, chart.chart_id  # one bar path per series
        assert "excellent &gt; 90%" in svg(chart)


def test_summary_headline_splits_the_largest_multi_node_count(nodes) -> None:
    html, _, expected, _, _ = nodes
    multi = expected[expected["nnodes"] > 1]
    largest = multi[multi["world_size"] == multi["world_size"].max()]
    worst = largest.loc[largest["inter_node_efficiency"].idxmin()]
    assert len(largest) == 2 and worst["nnodes"] == 4
    line = (
        f"Across nodes: {worst['world_size']} GPUs (4 × {G}) at "
        f"{percent(worst['scaling_efficiency'])} = {percent(worst['intra_node_efficiency'])} "
        f"within the node × {percent(worst['inter_node_efficiency'])} across nodes "
        f"({worst['model']} · batch {worst['batch_size']}, "
        f"the lowest across nodes of 2 at {worst['world_size']} GPUs)."
    )
    summary = unescape(html.split('id="summary"')[1].split("</section>")[0])
    assert f'<p class="headline">{line}</p>' in summary


def test_single_node_results_have_no_node_section(
    fixture_results: Path, session_report: SessionReport
) -> None:
    html = session_report(fixture_results, "html").read_text("utf-8")
    assert 'id="nodes"' not in html and "nodes-table" not in html
    assert "Across nodes" not in html and 'data-figure="nodes-' not in html
    assert 'id="scaling"' in html  # the single-node sections are there


def test_names_stay_text_in_the_node_section(nodes) -> None:
    html, tables, _, figures, _ = nodes
    assert SCRIPT_NAME not in html
    assert len(re.findall(r"<script\b", html)) == 3  # plotly.js, the figures, the loader
    section = html.split('id="nodes"')[1].split("</section>")[0]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in section
    assert any(r["Model"] == SCRIPT_NAME for r in tables["nodes-table"])  # parsed back
    assert f"{SCRIPT_NAME} · batch 32" in _node_figures(figures)  # escaped once for Plotly


def test_node_rows_stay_within_each_experiment(tmp_path: Path) -> None:
    spec = FixtureSpec(
        name="nodes-a", models=MODELS[:1], batch_sizes=(32,), gpu_counts=(1, 8, 16),
        straggler=None, failures=False, collectives=False, findings=False,
    )  # fmt: skip
    slower = replace(spec, name="nodes-b", inter_node_ms=12.0)
    folders = [write_experiment(tmp_path, s) for s in (spec, slower)]
    data = load_report_data(tmp_path)
    table = label_variants(pd.concat([training_table(e.records) for e in data.experiments]))
    rows = node_rows(table)
    for folder in folders:
        own = node_scaling(training_table(load_report_data(folder).records))
        mine = rows[rows["experiment"] == folder.name]
        for column in SERIES.values():
            assert mine[column].to_numpy() == pytest.approx(own[column].to_numpy())
    inter = rows[rows["nnodes"] == 2].set_index("experiment")["inter_node_efficiency"]
    assert inter["nodes-b"] < inter["nodes-a"] < 1.0
    assert "nodes-b, the lowest" in report_content(data).headlines[0]  # names the slower run


@needs_poppler
def test_node_section_in_the_pdf(
    nodes, node_results: Path, fixture_results: Path, session_report: SessionReport
) -> None:
    pdf = session_report(node_results, "pdf")
    texts, pngs = pages_text(pdf), pages_png(pdf)
    assert len(pngs) == len(texts)
    assert [i for i, t in enumerate(texts) if "Scaling across nodes" in t]
    assert f"Across nodes: {4 * G} GPUs (4 × {G}) at" in texts[0]
    for title in _node_figures(nodes[3]):
        pages = [i for i, t in enumerate(texts) if f"Efficiency across nodes: {title}" in t]
        assert len(pages) == 1, (title, pages)  # a chart is never cut across pages
        spread, coloured = ink(pngs[pages[0]])
        assert spread > 12 and coloured > 0.001, pages
    words = [set(t.split()) for t in texts]
    for cell in nodes[2].itertuples():  # each table row whole on one page
        needed = {percent(cell.scaling_efficiency), percent(cell.intra_node_efficiency),
                  percent(cell.inter_node_efficiency), *cell.hosts.split()}  # fmt: skip
        assert any(needed <= page for page in words), cell
    single = pages_text(session_report(fixture_results, "pdf"))
    assert not any("Scaling across nodes" in t or "Across nodes" in t for t in single)
    assert NODE_SPEC.name in texts[0]
