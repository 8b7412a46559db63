"""The HTML report of fixture results (1-8 GPUs, failures, collectives, findings): content."""

from __future__ import annotations

import base64
import csv
import io
import json
import re
from html import unescape
from pathlib import Path
from typing import Dict, Set, Tuple

import pytest

from tests.support.html_tables import displayed_close, html_tables, number
from tests.support.report_fixtures import (
    PROFILE_FINDINGS,
    SCRIPT_NAME,
    SessionReport,
    environment,
)
from torchscale.analysis.lost_efficiency import CAUSES, lost_efficiency_table
from torchscale.analysis.report_data import load_report_data
from torchscale.report.lost_efficiency_section import LABELS
from torchscale.results.schema import TrainingResult


@pytest.fixture(scope="module")
def report(fixture_results: Path, session_report: SessionReport):
    html = session_report(fixture_results, "html").read_text(encoding="utf-8")
    return html, html_tables(html), load_report_data(fixture_results)


def _measured(data):
    return [r for r in data.records if isinstance(r, TrainingResult) and r.status == "ok"]


def _row(rows, model: str, batch: int, gpus: int):
    matches = [
        r
        for r in rows
        if r["Model"] == model and r["Configuration"] == f"batch {batch}" and r["GPUs"] == str(gpus)
    ]
    assert len(matches) == 1, (model, batch, gpus)
    return matches[0]


def test_scaling_table_matches_the_records(report) -> None:
    _, tables, data = report
    records = _measured(data)
    single = {(r.model, r.batch_size): r.throughput for r in records if r.world_size == 1}
    assert len(tables["scaling-table"]) == len(records)
    for record in records:
        row = _row(tables["scaling-table"], record.model, record.batch_size, record.world_size)
        efficiency = record.throughput / (
            record.world_size * single[(record.model, record.batch_size)]
        )
        assert displayed_close(row[f"Throughput ({record.unit}/s)"], record.throughput)
        assert row["Scaling efficiency"] == f"{100 * efficiency:.1f}%"
        assert row["Band"] == (
            "excellent" if efficiency > 0.9 else "good" if efficiency > 0.8 else "poor"
        )
        assert row["MFU"] == f"{100 * record.mfu:.1f}%"


def test_latency_table_matches_the_records(report) -> None:
    _, tables, data = report
    for record in _measured(data):
        row = _row(tables["latency-table"], record.model, record.batch_size, record.world_size)
        stats = record.step_time_ms
        for column in ("mean", "p50", "p95", "p99", "min", "max"):
            header = column.capitalize() if column in ("mean", "min", "max") else column
            assert displayed_close(row[header], getattr(stats, column)), (column, row)
        assert row["Steps"] == str(len(record.step_times_ms))


def test_csv_downloads_hold_the_exact_numbers(report) -> None:
    html, _, data = report
    uri = re.search(r'href="data:text/csv;base64,([^"]+)" download="scaling-table.csv"', html)
    assert uri is not None
    rows = list(csv.DictReader(io.StringIO(base64.b64decode(uri.group(1)).decode())))
    expected = sorted(r.throughput for r in _measured(data))
    assert sorted(float(r["throughput"]) for r in rows) == pytest.approx(expected, rel=1e-12)


def test_failed_cells_are_listed_with_reasons(report) -> None:
    _, tables, data = report
    shown = {(row["Status"], row["Reason"]) for row in tables["failures-table"]}
    failed = [r for r in data.records if r.status != "ok"]
    assert len(tables["failures-table"]) == len(failed) == 4
    for record in failed:
        assert (record.status, record.error) in shown


def test_findings_and_recommendations(report) -> None:
    html = unescape(report[0])
    data = report[2]
    for finding in PROFILE_FINDINGS:
        assert isinstance(finding, dict)
        assert finding["recommendation"] in html
        assert (finding.get("title") or finding["message"]) in html
    warned = [r for r in _measured(data) if r.sync and r.sync.warning]
    assert warned
    for record in warned:  # grouped per model and straggler, every cell named
        slowest = record.sync.slowest_rank
        assert f"Rank {slowest} is a straggler: {record.model}" in html
        assert f"batch {record.batch_size} on {record.world_size} GPUs" in html
    worst = max(warned, key=lambda r: r.sync.wait_spread_ms)
    assert worst.sync.warning in html
    top = html.split('id="summary"')[1].split("</section>")[0]
    assert "GPU 3 finishes backward late" in top  # the high-severity finding is summarised


def test_summary_names_the_best_configuration(report) -> None:
    _, tables, data = report
    for row in tables["summary-table"]:
        model_records = [r for r in _measured(data) if r.model == row["Model"]]
        best = max(model_records, key=lambda r: r.throughput)
        assert row["Best configuration"] == f"batch {best.batch_size}"
        assert row["GPUs"] == str(best.world_size)
        assert displayed_close(row[f"Throughput ({best.unit}/s)"], best.throughput)


def test_names_from_the_config_stay_text(report) -> None:
    html, tables, _ = report
    assert SCRIPT_NAME not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert len(re.findall(r"<script\b", html)) == 3  # plotly.js, the figures, the loader
    assert any(row["Model"] == SCRIPT_NAME for row in tables["scaling-table"])  # parsed back


def test_every_chart_has_data_and_plotly_is_embedded_once(report) -> None:
    html, _, _ = report
    found = re.search(r'id="report-figures">(.*?)</script>', html, re.S)
    assert found is not None
    figures = json.loads(found.group(1))
    divs = re.findall(r'data-figure="([^"]+)"', html)
    assert sorted(divs) == sorted(figures) and len(divs) == len(set(divs)) >= 14
    for chart_id, figure in figures.items():
        values = [v for trace in figure["data"] for v in trace["y"] if v is not None]
        assert values, chart_id
    kinds = {c.split("-")[0] for c in divs}
    assert {"efficiency", "throughput", "steps", "memory", "mfu", "rank", "bandwidth"} <= kinds
    assert html.count("plotly.js v") == 1
    assert not re.search(r'<(script|link|img)[^>]+(src|href)="(https?:)?//', html)


def test_environment_is_shown(report) -> None:
    html = unescape(report[0])
    env = environment()
    for value in (
        env["nccl"],
        env["driver"],
        env["cuda"],
        env["torch"],
        "NCCL_IB_DISABLE",
        env["gpus"][0]["name"],
        "NV18",
    ):
        assert value in html


def test_lost_efficiency_section_splits_each_gap_by_cause(report) -> None:
    """ "Where the efficiency goes": per configuration and GPU count above its baseline, the
    measured gap and its causes (docs/report.md), adding up to the gap; the stacked chart names
    every cause."""
    html, tables, data = report
    assert '<section id="lost-efficiency"' in html and "Where the efficiency goes" in html
    expected = lost_efficiency_table(data.records)
    measured = _measured(data)
    counts: Dict[Tuple[str, int], Set[int]] = {(r.model, r.batch_size): set() for r in measured}
    for r in measured:
        counts[(r.model, r.batch_size)].add(r.world_size)
    rows = tables["lost-efficiency-table"]
    assert len(rows) == len(expected) == sum(len(c) - 1 for c in counts.values())
    causes = [f"{LABELS[c].capitalize()} (pts)" for c in (*CAUSES, "other")]
    for want in expected.to_dict("records"):
        row = _row(rows, want["model"], int(want["variant"].split()[-1]), want["world_size"])
        assert displayed_close(row["Gap (pts)"], want["gap_pts"])
        assert row["Efficiency"] == f"{100 * want['scaling_efficiency']:.1f}%"
        # a negative part is shown as noise ("-0.18 (noise)"), never as a bare figure
        cells = [row[c] for c in causes]
        assert all(
            cell.endswith(" (noise)") for cell in cells if cell != "–" and cell.startswith("-")
        ), cells
        shown = [number(cell.removesuffix(" (noise)")) if cell != "–" else 0.0 for cell in cells]
        assert sum(shown) == pytest.approx(number(row["Gap (pts)"]), abs=0.05 * len(causes))
        assert displayed_close(row["Exposed communication (pts)"], want["exposed_comm_pts"])
    for cause in (*CAUSES, "other"):
        assert f'"name":"{LABELS[cause]}"' in html
