"""``torchscale report --format json``: distributed_benchmarks' document per experiment, valid against its
JSON Schema, with the records' own figures."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional

import jsonschema
import pytest
from typer.testing import CliRunner

from tests.support.report_fixtures import FixtureSpec, write_experiment
from tests.support.shared_runs import Run
from torchscale.cli.app import app
from torchscale.report import formatting as fmt
from torchscale.report.document import document_schema
from torchscale.results.schema import CollectiveResult, TpGemmResult, TrainingResult
from torchscale.results.store import ExperimentStore

runner = CliRunner()
SCHEMA_FILE = Path(__file__).resolve().parents[1] / "docs" / "report-json.schema.json"


def report_json(source: Path, output: Path) -> Any:  # a JSON document
    result = runner.invoke(app, ["report", "-s", str(source), "-f", "json", "-o", str(output)])
    assert result.exit_code == 0, result.output
    return json.loads(output.read_text(encoding="utf-8"), parse_constant=pytest.fail)


def test_the_documented_schema_is_the_one_shipped() -> None:
    assert json.loads(SCHEMA_FILE.read_text(encoding="utf-8")) == document_schema()


@pytest.mark.slow
def test_real_run_document_has_the_records_figures(healthy_run: Run, tmp_path: Path) -> None:
    folder = healthy_run.experiment_dir
    document = report_json(folder, tmp_path / "run.json")
    jsonschema.validate(document, document_schema())
    store = ExperimentStore(folder)
    records = {r.world_size: r for r in store.records() if isinstance(r, TrainingResult)}
    assert document["name"] == "<script>alert(1)</script>"
    assert document["world_size"] == 2
    assert document["timestamp"] == store.manifest()["updated_at"]
    assert document["config"]["warmup_iters"] == 2 and document["config"]["benchmark_iters"] == 8
    assert document["config"]["device"] == "cpu"
    assert document["config"]["benchmark"] == store.manifest()["config"]
    training = {entry["world_size"]: entry for entry in document["results"]["training"]}
    for size, record in records.items():
        assert training[size]["throughput"] == record.throughput
        assert record.step_time_ms is not None
        assert training[size]["step_ms_p95"] == record.step_time_ms.p95
    assert records[2].throughput is not None and records[1].throughput is not None
    efficiency = records[2].throughput / (2 * records[1].throughput)
    assert training[2]["scaling_efficiency"] == pytest.approx(efficiency)
    assert records[2].memory is not None and records[1].memory is not None
    memory = {entry["world_size"]: entry for entry in document["results"]["memory"]}
    assert memory[2]["peak_bytes"] == records[2].memory.peak_bytes
    assert memory[1]["params_bytes"] == records[1].memory.params_bytes > 0
    assert document["results"]["communication"] == {}


def test_communication_is_keyed_like_the_seed(fixture_results: Path) -> None:
    folder = fixture_results
    document = report_json(folder, folder.parent / "fixture.json")
    jsonschema.validate(document, document_schema())
    comm = document["results"]["communication"]
    assert sorted(comm) == ["allgather", "allreduce", "broadcast"]
    records = [r for r in ExperimentStore(folder).records() if isinstance(r, CollectiveResult)]
    expected = [r for r in records if r.op == "all_reduce"]
    assert len(comm["allreduce"]) == len(expected)
    for entry, record in zip(comm["allreduce"], expected):
        assert (entry["world_size"], entry["size_bytes"]) == (record.world_size, record.size_bytes)
        assert entry["busbw_gbps"] == record.busbw_gbps
    (failed,) = comm["broadcast"]
    assert failed["status"] == "failed" and failed["time_us"] is None
    # failed and skipped training cells are listed with their status, figures null
    statuses = {entry["status"] for entry in document["results"]["training"]}
    assert {"ok", "oom"} <= statuses
    oom = next(e for e in document["results"]["training"] if e["status"] == "oom")
    assert oom["throughput"] is None and oom["error"]
    assert not any(isinstance(v, float) and math.isnan(v) for v in oom.values())


def test_a_folder_of_experiments_gives_an_array(tmp_path: Path) -> None:
    small = FixtureSpec(batch_sizes=(32,), gpu_counts=(1, 2), failures=False, findings=False)
    for name in ("first", "second"):
        write_experiment(tmp_path / "results", replace(small, name=name, collectives=False))
    documents = report_json(tmp_path / "results", tmp_path / "all.json")
    assert isinstance(documents, list)
    assert [d["name"] for d in documents] == ["first", "second"]
    for document in documents:
        jsonschema.validate(document, document_schema())
        assert len(document["results"]["training"]) == 2 * len(small.models)


def test_unknown_format_names_the_choices(fixture_results: Path) -> None:
    folder = fixture_results
    result = runner.invoke(app, ["report", "-s", str(folder), "-f", "xml"])
    assert result.exit_code == 2
    assert "unknown report format 'xml': use --format html, pdf, json, tensorboard" in result.output


def _tp_gemm(order: str, time_us: float, sharded_us: Optional[float]) -> TpGemmResult:
    m, n, k, world = 64, 16, 32, 2
    return TpGemmResult(
        cell_id=f"comm-g2-{sharded_us is None}", experiment="tp", world_size=world,
        nproc_per_node=world, status="ok", dtype="float32", backend="nccl",
        device_name="NVIDIA H100 80GB HBM3", warmup=1, iterations=3, m=m, n=n, k=k, order=order,
        time_us=time_us, tflops=2 * m * n * k / (time_us * 1e-6) / 1e12, reference_time_us=40.0,
        sharded_time_us=sharded_us,
        sharded_tflops=None if sharded_us is None else 2 * m // world * n * k / sharded_us / 1e6,
    )  # fmt: skip


def test_tp_gemm_entries_and_table_carry_the_sharded_compute_time(tmp_path: Path) -> None:
    """``compute_only: [.., sharded]``: each rank's GEMM alone reaches the document's TP GEMM
    entries and the report's TP GEMM table, not only the console and summary_tp_gemm.csv."""
    from torchscale.analysis.report_data import Experiment, ReportData
    from torchscale.analysis.report_tables import document_tables
    from torchscale.app.report import report_content
    from torchscale.report.document import build_document

    records = [_tp_gemm("AG_before", 90.0, 20.0), _tp_gemm("AG_after", 80.0, 22.0)]
    experiment = Experiment("tp", tmp_path / "tp", {}, list(records))
    document = build_document(document_tables(experiment, tmp_path)).model_dump(mode="json")
    jsonschema.validate(document, document_schema())
    entries = {entry["order"]: entry for entry in document["results"]["tp_gemm"]}
    for record in records:
        assert entries[record.order]["sharded_time_us"] == record.sharded_time_us
        assert entries[record.order]["sharded_tflops"] == pytest.approx(record.sharded_tflops)
    # what the communication cells ran, asked of the kind
    assert document["config"]["iterations"] == {"communication": {"warmup": [1], "measured": [3]}}
    assert (document["config"]["warmup_iters"], document["config"]["benchmark_iters"]) == (1, 3)

    def table(records: List[TpGemmResult]) -> Dict[str, str]:
        data = ReportData(tmp_path, [Experiment("tp", tmp_path / "tp", {}, list(records))])
        shown = [t for s in report_content(data).sections for t in s.tables]
        (gemm,) = [t for t in shown if t.table_id == "tp-gemm-table"]
        (row,) = gemm.rows
        return {header: cell for (header, _), (cell, _) in zip(gemm.headers, row)}

    row = table(records)  # the mean of the two orders' timings of the same GEMM
    assert row["Compute only, sharded µs per GPU"] == "21.0"
    assert records[0].sharded_tflops is not None and records[1].sharded_tflops is not None
    rate = (records[0].sharded_tflops + records[1].sharded_tflops) / 2
    assert row["Compute only, sharded TFLOP/s per GPU"] == fmt.significant(rate)
    unsharded = table([_tp_gemm("AG_before", 90.0, None), _tp_gemm("AG_after", 80.0, None)])
    assert not any("sharded" in header for header in unsharded)  # not measured: no column
