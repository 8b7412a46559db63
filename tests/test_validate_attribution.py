"""A straggler named by benchmark or profile is placed on its host and GPU, and a validate
record of that host, where the results folder has one, is quoted for the probe that explains it.

The results are the report fixtures' (per-rank figures drawn from a performance model and
aggregated by the worker's own code) with an injected straggler on the second of two nodes; the
validate record is what ``validate --level 2`` writes, built by the same judging code."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List

import pytest

from tests.support.report_fixtures import MODELS, SCRIPT_NAME, FixtureSpec, write_experiment
from torchscale.analysis.findings import record_findings
from torchscale.analysis.host_attribution import (
    RankPlace,
    attribute_findings,
    attribution,
    health_quote,
    rank_place,
)
from torchscale.analysis.telemetry import telemetry_findings
from torchscale.config.validate_section import ValidateSection
from torchscale.hardware.expected_figures import expected_figure
from torchscale.results.files import atomic_write_json
from torchscale.results.host_records import load_host_records
from torchscale.results.layout import FLEET_REPORT, VALIDATE_DIR, validate_record_path
from torchscale.results.schema import GpuTelemetry, TrainingResult
from torchscale.results.store import ExperimentStore
from torchscale.validate.judging import judge_figures
from torchscale.validate.probe_timing import Figure

H100 = "NVIDIA H100 80GB HBM3"
SPEC = FixtureSpec(
    name="straggler-on-node-b",
    models=MODELS[1:],
    batch_sizes=(32,),
    gpu_counts=(1, 8),
    gpus_per_node=4,  # 8 ranks on node-a (0-3) and node-b (4-7)
    straggler=(SCRIPT_NAME, 8, 5),  # node-b, its GPU 1
    failures=False,
    collectives=False,
    findings=False,
)
SLOW_SHARE = 0.81


def node_b_report(time: str = "2026-11-25T04:00:00+00:00") -> dict:
    """node-b's level-2 report: its GPU 1 runs GEMM at 0.81 of the other three."""
    base = expected_figure(H100, "gemm_bf16")
    assert base is not None
    shares = [0.95, 0.95 * SLOW_SHARE, 0.95, 0.95]
    figures = [Figure("gemm_bf16", f"GPU {i}", base.value * s, H100) for i, s in enumerate(shares)]
    figures.append(Figure("memory_copy", "GPU 1", 3000.0, H100))
    judged = judge_figures(figures, ValidateSection(), cpu=False)
    return {"host": "node-b", "time": time, "level": 2, "probes": [j.to_dict() for j in judged]}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("attribution")
    write_experiment(root, SPEC)
    atomic_write_json(validate_record_path(root, "node-b"), node_b_report())
    return root


def training(root: Path) -> List[TrainingResult]:
    store = ExperimentStore(root / SPEC.name)
    return [r for r in store.records() if isinstance(r, TrainingResult) and r.world_size == 8]


def test_the_worker_names_the_straggler_s_host_and_gpu(results: Path) -> None:
    [record] = training(results)
    assert record.sync is not None and record.sync.slowest_rank == 5
    assert "rank 5 is the straggler (on node-b, GPU 1);" in (record.sync.warning or "")
    place = rank_place(record, 5)
    assert place == RankPlace(5, "node-b", 1, gpu=True)


def test_the_finding_quotes_the_probe_that_explains_it(results: Path) -> None:
    [record] = training(results)
    hosts = load_host_records(results)
    assert set(hosts) == {"node-b"}
    rows = attribute_findings(record_findings([record]), [record], hosts)
    [row] = [r for r in rows if r["ranks"] == [5]]
    slow = hosts["node-b"].probes[1]
    assert slow.vs_peers == pytest.approx(SLOW_SHARE) and slow.status == "WARN"
    source = validate_record_path(results, "node-b")
    assert row["message"].endswith(
        f"Rank 5 is on node-b GPU 1, whose GEMM bf16 on GPU 1 ran at {SLOW_SHARE:.2f} of its "
        f"peers at level 2 (WARN in {source})."
    )
    # a rank on node-a: placed, but no record of node-a to quote
    assert attribution(2, [record], hosts) == "rank 2 is on node-a GPU 2"


def test_the_report_shows_it(results: Path) -> None:
    from torchscale.analysis.report_data import load_report_data
    from torchscale.app.report import report_content

    content = report_content(load_report_data(results / SPEC.name))
    [finding] = [f for f in content.findings if f["ranks"] == [5]]
    assert "Rank 5 is on node-b GPU 1, whose GEMM bf16 on GPU 1 ran at 0.81" in finding["message"]


def test_a_profile_finding_names_host_and_gpu_in_its_title(results: Path) -> None:
    [record] = training(results)
    trace_finding = {"severity": "high", "category": "straggler", "ranks": [5],
                     "title": "NCCL all_reduce: GPU-5 arrives last", "recommendation": "..."}  # fmt: skip
    [done] = attribute_findings([trace_finding], [record], load_host_records(results), "title")
    assert done["title"].startswith(
        "NCCL all_reduce: GPU-5 arrives last; rank 5 is on node-b GPU 1"
    )
    assert done["where"].startswith("rank 5 is on node-b GPU 1, whose GEMM bf16")


def test_the_fleet_report_adds_the_fleet_yardstick_and_the_newest_record_wins(
    results: Path, tmp_path: Path
) -> None:
    folder = tmp_path / VALIDATE_DIR
    folder.mkdir()
    old = {**node_b_report("2026-01-01T00:00:00+00:00"), "level": 2}
    atomic_write_json(validate_record_path(tmp_path, "node-b"), old)
    newer = node_b_report("2026-11-25T05:00:00+00:00")
    for figure in newer["probes"]:
        figure["status"] = "PASS"  # fine on its node; the fleet finds GPU 1's copy slow
    cells = [{"host": "node-b", "device": "GPU 1", "probe": "memory_copy", "vs_fleet": 0.55,
              "status": "FAIL"}]  # fmt: skip
    atomic_write_json(folder / FLEET_REPORT, {"reports": [newer], "cells": cells})
    (folder / "host-broken.json").write_text("{not json")
    hosts = load_host_records(tmp_path)
    assert set(hosts) == {"node-b"} and hosts["node-b"].time == newer["time"]
    quote = health_quote(RankPlace(5, "node-b", 1, True), hosts["node-b"])
    assert quote.startswith("whose Memory copy on GPU 1 ran at 0.55 of the fleet median at level 2")
    # nothing judged slow on the device: said plainly
    calm = hosts["node-b"].model_copy(update={"probes": []})
    assert health_quote(RankPlace(5, "node-b", 1, True), calm).startswith(
        "validate at level 2 found nothing slow there"
    )
    assert json.loads((folder / FLEET_REPORT).read_text())["cells"] == cells


def test_the_benchmark_console_line_quotes_the_probe(results: Path, tmp_path: Path) -> None:
    """The worker's straggler warning, as benchmark prints it when the cell ends, gains the same
    quote as the report's finding; without a record of the host it is the warning alone."""
    from torchscale.cli.benchmark_view import sync_warning_line
    from torchscale.results.layout import cell_dir

    [record] = training(results)
    assert record.sync is not None and record.sync.warning
    folder = cell_dir(results / SPEC.name, record.cell_id)
    source = validate_record_path(results, "node-b")
    assert sync_warning_line(record, folder) == (
        f"> [WARN] {record.sync.warning}. Rank 5 is on node-b GPU 1, whose GEMM bf16 on GPU 1 "
        f"ran at {SLOW_SHARE:.2f} of its peers at level 2 (WARN in {source})."
    )
    elsewhere = cell_dir(tmp_path / SPEC.name, record.cell_id)  # no validate/ beside it
    assert sync_warning_line(record, elsewhere) == f"> [WARN] {record.sync.warning}."
    assert sync_warning_line(record, None) == f"> [WARN] {record.sync.warning}."


def test_the_console_prints_it_when_the_cell_ends(results: Path, monkeypatch) -> None:
    import torchscale.cli.benchmark_view as view
    from torchscale.plan.kind_protocol import cell_kinds
    from torchscale.results.layout import cell_dir

    [record] = training(results)
    said: List[str] = []
    monkeypatch.setattr(view, "say", said.append)
    events = view.ConsoleEvents(profile_lines=False)
    events.running.cell_dir = cell_dir(results / SPEC.name, record.cell_id)
    events.task = events.progress.add_task("", total=1)
    kind = next(k for k in cell_kinds().values() if TrainingResult in k.record_models)
    events.cell_finished(SimpleNamespace(kind=kind.name), [record], None)  # type: ignore[arg-type]
    [line] = [s for s in said if s.startswith("> [WARN] High variance")]
    assert line.endswith(f"ran at {SLOW_SHARE:.2f} of its peers at level 2 (WARN in "
                         f"{validate_record_path(results, 'node-b')}).")  # fmt: skip


def throttled(record: TrainingResult, ranks: Dict[int, float]) -> TrainingResult:
    """``record`` with NVML telemetry on every rank: 1,980 MHz, except ``ranks`` (rank -> share
    of the window) in HW thermal slowdown at 1,500 MHz and 90 C."""
    per_rank = []
    for row in record.per_rank:
        share = ranks.get(row.rank)
        gpu = GpuTelemetry(
            samples=20, nvml_index=row.local_rank, sm_clock_mhz_limit=1980.0,
            sm_clock_mhz_mean=1500.0 if share else 1980.0, temperature_c_max=90.0 if share else 60.0,
            power_w_mean=600.0, power_limit_w=700.0,
            throttle_share={"hw_thermal_slowdown": share} if share else {},
        )  # fmt: skip
        per_rank.append(row.model_copy(update={"gpu": gpu}))
    return record.model_copy(update={"per_rank": per_rank})


def test_a_telemetry_straggler_finding_is_attributed_as_the_straggler_findings_are(
    results: Path,
) -> None:
    """GPU 1 of node-b (rank 5, the straggler) throttles, and so does rank 2 on node-a, which is
    not the straggler: only the straggler's finding gains the quote."""
    [record] = training(results)
    hot = throttled(record, {5: 0.6, 2: 0.4})
    rows = telemetry_findings([hot])
    [straggler] = [r for r in rows if r["ranks"] == [5]]
    [other] = [r for r in rows if r["ranks"] == [2]]
    assert straggler["category"] == other["category"] == "telemetry"
    assert straggler["title"].startswith("GPU 1 is the straggler: HW thermal slowdown")
    done = attribute_findings(rows, [hot], load_host_records(results))
    [quoted] = [r for r in done if r["ranks"] == [5]]
    source = validate_record_path(results, "node-b")
    assert quoted["message"] == (
        f"{straggler['message']} Rank 5 is on node-b GPU 1, whose GEMM bf16 on GPU 1 ran at "
        f"{SLOW_SHARE:.2f} of its peers at level 2 (WARN in {source})."
    )
    assert [r for r in done if r["ranks"] == [2]] == [other]  # throttled, not the straggler


def test_the_report_quotes_it_under_the_telemetry_finding(results: Path, tmp_path: Path) -> None:
    from torchscale.analysis.report_data import load_report_data
    from torchscale.app.report import report_content

    [record] = training(results)
    folder = tmp_path / "thermal"
    folder.mkdir()
    (folder / "results.jsonl").write_text(throttled(record, {5: 0.6}).model_dump_json() + "\n")
    (folder / "manifest.json").write_text(json.dumps({"experiment": "thermal"}))
    atomic_write_json(validate_record_path(tmp_path, "node-b"), node_b_report())
    content = report_content(load_report_data(folder))
    [finding] = [f for f in content.findings if f["title"].startswith("GPU 1 is the straggler")]
    assert finding["message"].endswith(
        f"Rank 5 is on node-b GPU 1, whose GEMM bf16 on GPU 1 ran at {SLOW_SHARE:.2f} of its "
        f"peers at level 2 (WARN in {validate_record_path(tmp_path, 'node-b')})."
    )
