"""Communication vs computation, the step-time histogram, the TP GEMM charts and the P2P heatmap,
in the console, the HTML and the PDF, from one real run (training and communication cells)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List

import pytest
from typer.testing import CliRunner

from tests.support.chromium_cdp import Chromium
from tests.support.html_tables import html_tables
from tests.support.shared_runs import Run
from torchscale.analysis.report_data import load_report_data
from torchscale.cli.app import app
from torchscale.report import formatting as fmt
from torchscale.results.schema import CollectiveResult, TpGemmResult, TrainingResult

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def projection(projection_run: Run) -> Run:
    return projection_run


@pytest.fixture(scope="module")
def reports(projection: Run, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    folder = tmp_path_factory.mktemp("breakdown-report")
    out = {}
    for fmt_ in ("html", "pdf"):
        path = folder / f"r.{fmt_}"
        result = CliRunner().invoke(
            app, ["report", "-s", str(projection.experiment_dir), "-f", fmt_, "-o", str(path)]
        )
        assert result.exit_code == 0, result.stderr
        out[fmt_] = path
    return out


def _pdf_text(path: Path) -> str:
    from tests.support.pdf_pages import pages_text

    return " ".join(" ".join(pages_text(path)).split())


def test_console_prints_comm_vs_compute_per_rank(projection: Run) -> None:
    (line,) = [x for x in projection.result.stderr.splitlines() if "Comm vs compute" in x]
    record = next(
        r
        for r in load_report_data(projection.experiment_dir).records
        if isinstance(r, TrainingResult) and r.world_size == 2
    )
    for rank in record.per_rank:
        assert rank.ddp_forward_compute_ms is not None and rank.ddp_backward_compute_ms is not None
        compute = rank.ddp_forward_compute_ms + rank.ddp_backward_compute_ms
        assert f"rank {rank.rank} {compute:.1f} / {rank.ddp_backward_comm_ms:.1f}" in line


def test_html_shows_comm_compute_per_rank(projection: Run, reports: Dict[str, Path]) -> None:
    html = reports["html"].read_text()
    rows = html_tables(html)["comm-compute-table"]
    records = [
        r for r in load_report_data(projection.experiment_dir).records
        if isinstance(r, TrainingResult)
    ]  # fmt: skip
    expected = {(str(r.world_size), str(rank.rank)): rank for r in records for rank in r.per_rank}
    assert {(row["Ranks"], row["Rank"]) for row in rows} == set(expected)
    for row in rows:
        rank = expected[(row["Ranks"], row["Rank"])]
        assert rank.ddp_forward_compute_ms is not None and rank.ddp_backward_compute_ms is not None
        compute = rank.ddp_forward_compute_ms + rank.ddp_backward_compute_ms
        assert row["Compute ms"] == fmt.significant(compute)
        # One rank has no communication (the glossary's none): no figure, though DDP timed one.
        one = row["Ranks"] == "1"
        comm = fmt.MISSING if one else fmt.significant(rank.ddp_backward_comm_ms)
        assert row["Comm ms"] == comm
        if one:
            assert row["Exposed communication ms"] == row["Comm / compute"] == fmt.MISSING
            assert rank.ddp_backward_comm_ms is not None
    assert (
        "Communication vs computation per iteration — gpt2-tiny, batch 16, 2 CPU processes" in html
    )
    assert (
        "Communication vs computation per iteration — gpt2-tiny, batch 16, 1 CPU process"
        not in (html)
    )
    assert "Step-time histogram — gpt2-tiny, batch 16" in html


def test_html_shows_tp_gemm_and_p2p_heatmap(projection: Run, reports: Dict[str, Path]) -> None:
    html = reports["html"].read_text()
    records = load_report_data(projection.experiment_dir).records
    gemm = [r for r in records if isinstance(r, TpGemmResult)]
    # One row per GPU count and case: the 1-GPU cell runs the reference and 1-rank gather path.
    rows = {(row["Ranks"], row["m×n×k"]): row for row in html_tables(html)["tp-gemm-table"]}
    assert set(rows) == {(g, c) for g in ("1", "2") for c in ("256×128×128", "512×128×128")}
    for record in gemm:
        case = (record.world_size, record.m, record.n, record.k)
        row = rows[(str(record.world_size), "×".join(str(v) for v in case[1:]))]
        assert row[f"{record.order} µs"] == fmt.significant(record.time_us)
        references = [g.reference_time_us for g in gemm if (g.world_size, g.m, g.n, g.k) == case]
        known = [r for r in references if r is not None]
        assert len(known) == len(references)
        assert row["Compute only µs"] == fmt.significant(sum(known) / len(known))
    assert "Tensor-parallel GEMM on 2 CPU processes: all-gather before vs after the GEMM" in html
    assert "Tensor-parallel GEMM on 1 CPU process: all-gather before vs after the GEMM" in html

    p2p = [r for r in records if isinstance(r, CollectiveResult) and r.op == "send_recv"]
    largest = max(p2p, key=lambda r: r.size_bytes or 0)
    table = html_tables(html)["p2p-heatmap-2-float32"]
    assert largest.pair_busbw_gbps is not None
    assert [row["src \\ dst (GB/s)"] for row in table] == ["rank 0", "rank 1"]
    assert table[0]["rank 1"] == fmt.significant(largest.pair_busbw_gbps[0][1])
    assert table[1]["rank 0"] == fmt.significant(largest.pair_busbw_gbps[1][0])
    # Cells are shaded: the faster direction gets the darkest level, the diagonal none.
    shades: List[str] = re.findall(r'class="num (heat-[\w]+)"', html)
    assert "heat-9" in shades and "heat-none" in shades


def test_pdf_shows_the_same_sections(reports: Dict[str, Path]) -> None:
    text = _pdf_text(reports["pdf"])
    for title in (
        "Communication vs computation",
        "Step-time histogram",
        "Tensor-parallel GEMM on 2 CPU processes",
        "point-to-point bandwidth",
        "Projected scaling",
    ):
        assert title in text, title


def test_new_charts_draw_in_chromium(reports: Dict[str, Path], chromium: Chromium) -> None:
    from tests.test_report_browser import _check

    charts = _check(chromium, reports["html"], "projection", reports["html"].with_suffix(".png"))
    drawn = {c["id"].split("-")[0] for c in charts}
    assert {"comm", "latency", "tp", "projection"} <= drawn, drawn
