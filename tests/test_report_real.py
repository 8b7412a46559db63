"""Reports from a real CPU benchmark (1 and 2 gloo processes): the numbers are the records'."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.html_tables import displayed_close, html_tables
from tests.support.report_fixtures import SCRIPT_NAME, SessionReport
from tests.support.shared_runs import Run
from torchscale.analysis.report_data import load_report_data
from torchscale.cli.app import app
from torchscale.results.schema import TrainingResult

pytestmark = pytest.mark.slow  # every test here reports on a real CPU benchmark (torchrun launches)


@pytest.fixture(scope="module")
def real(healthy_run: Run, session_report: SessionReport):
    results = healthy_run.output_dir
    records = {
        r.world_size: r for r in load_report_data(results).records if isinstance(r, TrainingResult)
    }
    html = session_report(results, "html").read_text(encoding="utf-8")
    return results, records, html, html_tables(html)


def test_real_run_measured_both_cells(real) -> None:
    _, records, _, _ = real
    assert sorted(records) == [1, 2]
    assert all(r.status == "ok" and r.throughput > 0 for r in records.values())


def test_tables_show_the_measured_numbers(real) -> None:
    _, records, _, tables = real
    scaling = {int(row["Ranks"]): row for row in tables["scaling-table"]}
    latency = {int(row["Ranks"]): row for row in tables["latency-table"]}
    for size, record in records.items():
        assert displayed_close(scaling[size][f"Throughput ({record.unit}/s)"], record.throughput)
        for column in ("p50", "p95", "p99"):
            assert displayed_close(latency[size][column], getattr(record.step_time_ms, column))
    efficiency = records[2].throughput / (2 * records[1].throughput)
    assert scaling[2]["Scaling efficiency"] == f"{100 * efficiency:.1f}%"
    (row,) = tables["rank-table"]  # one configuration on 2 CPU processes, a column per rank
    assert row["Ranks"] == "2"
    for rank in records[2].per_rank:
        assert displayed_close(row[f"rank {rank.rank}"], rank.sync_wait_ms)


def test_experiment_name_is_escaped(real) -> None:
    _, _, html, _ = real
    assert SCRIPT_NAME not in html
    assert "<title>torchscale report: &lt;script&gt;alert(1)&lt;/script&gt;</title>" in html


@pytest.mark.skipif(not shutil.which("pdftotext"), reason="poppler-utils is not installed")
def test_pdf_via_the_cli(real, tmp_path: Path) -> None:
    results, records, _, _ = real
    output = tmp_path / "real.pdf"
    result = CliRunner().invoke(
        app, ["report", "--source", str(results), "--format", "pdf", "--output", str(output)]
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    text = subprocess.run(
        ["pdftotext", str(output), "-"], capture_output=True, text=True, check=True
    ).stdout
    assert SCRIPT_NAME in text  # escaped in HTML, so it prints as the literal name
    assert text.count("\f") >= 3
    assert f"{records[2].throughput:,.0f}" in text


def test_compare_a_run_with_itself(real) -> None:
    results = str(real[0])
    result = CliRunner().invoke(app, ["compare", results, results, "--json"])
    document = json.loads(result.stdout)
    assert document["regressions"] == 0
    # A cell measured on a busy host is "not judged", even against itself: the gate says so.
    busy = [c for c in document["cells"] if c["noise_model"] == "busy host"]
    assert {c["verdict"] for c in document["cells"] if c not in busy} <= {"unchanged"}
    assert {c["verdict"] for c in busy} <= {"not judged"}
    assert result.exit_code == (2 if busy else 0), result.stderr
    assert all(c["throughput_change_pct"] == 0 for c in document["cells"])
