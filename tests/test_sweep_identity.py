"""Sweeps stay apart everywhere: two values of each swept axis (backend, dtype,
precision, a DDP knob) are two rows in every table, two lines or bars in every chart, two lines of
the console summary and two entries of every JSON document.

One real 2-rank gloo communication run (``--quiet``, two dtypes) plus records built from it (the
same cell under ``backend: auto``) and training cells at fp32/bf16 x two bucket sizes
(``tests/support/sweep_records.py``).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pandas as pd
import pytest
from rich.console import Console

from tests.support.sweep_records import (
    BUCKETS,
    PRECISIONS,
    TWIN_SLOWDOWN,
    SweepRun,
    write_swept_experiment,
)
from torchscale.analysis.iteration_breakdown import tp_gemm_cases
from torchscale.analysis.training_tables import training_table
from torchscale.comm.result_tables import collective_table, tp_gemm_table
from torchscale.report.elements import Table
from torchscale.results.schema import TpGemmResult
from torchscale.results.store import ExperimentStore

BACKENDS = ("backend=auto", "backend=gloo")
DTYPES = ("float32", "float64")
KNOBS = tuple(f"ddp.bucket_cap_mb={b:g}" for b in BUCKETS)
# The columns that name a row (a cell, a rank, a message size) in the report's tables.
AXIS_HEADERS = {"GPUs", "Ranks", "CPU processes", "Rank", "Size", "Batch", "m×n×k"}

pytestmark = pytest.mark.slow  # one real launch, shared by the module


@pytest.fixture(scope="module")
def sweep(comm_sweep_run: SweepRun) -> SweepRun:
    return comm_sweep_run


@pytest.fixture(scope="module")
def swept(sweep: SweepRun, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_swept_experiment(sweep, tmp_path_factory.mktemp("sweep-all"))


def _comm_summary(records: list, title: str) -> object:
    """The communication summary as benchmark prints it (the comm kind's console table)."""
    from torchscale.comm.view import comm_summary_table
    from torchscale.hardware.device_noun import records_device_kind

    console = Console(width=200, file=io.StringIO())
    tables = (collective_table(records), tp_gemm_table(records))
    return comm_summary_table(*tables, title, console, records_device_kind(records))


def _text(renderable: object) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_the_quiet_real_run_prints_only_its_final_table(sweep: SweepRun) -> None:
    """--quiet: no progress, no per-cell nccl-tests tables; the communication summary, line for
    line as the console draws it from the records."""
    records = ExperimentStore(sweep.experiment_dir).records()
    title = (
        f"{ExperimentStore(sweep.experiment_dir).root.name} ({sweep.experiment_dir}): communication"
    )
    summary = _text(_comm_summary(records, title))
    output = sweep.result.stderr
    assert "> Running" not in output and "# all_reduce" not in output
    assert output.splitlines() == summary.splitlines()
    # The dtype sweep inside the one cell: one all_reduce summary row per dtype.
    rows = [line for line in output.splitlines() if line.startswith("│ all_reduce")]
    assert len(rows) == len(DTYPES) and all(any(d in r for r in rows) for d in DTYPES)


def test_the_console_summary_keeps_every_backend_and_dtype(swept: Path) -> None:
    from torchscale.cli.benchmark_view import results_table

    records = ExperimentStore(swept).records()
    text = _text(_comm_summary(records, "t"))
    reduce_rows = [line for line in text.splitlines() if line.startswith("│ all_reduce")]
    assert len(reduce_rows) == len(BACKENDS) * len(DTYPES)
    for backend in BACKENDS:
        for dtype in DTYPES:
            assert sum(backend in r and dtype in r for r in reduce_rows) == 1
    gemm_rows = [line for line in text.splitlines() if line.startswith("│ tp_gemm")]
    assert len(gemm_rows) == len(BACKENDS) * len(DTYPES) * 2  # x AG_before, AG_after
    # The training results table: precision and the knob each have a column.
    training = _text(results_table(training_table(records), "t"))
    rows = [line for line in training.splitlines() if "resnet-synthetic" in line]
    assert len(rows) == len(PRECISIONS) * len(KNOBS) * 2  # x 1 and 2 GPUs
    for precision in PRECISIONS:
        for knob in KNOBS:
            assert sum(precision in r and knob in r for r in rows) == 2


def test_csv_tables_and_tp_gemm_cases_keep_the_twin_apart(swept: Path) -> None:
    records = ExperimentStore(swept).records()
    collectives = collective_table(records)
    assert set(collectives["variant"]) == set(BACKENDS)
    keys = ["variant", "dtype", "size_bytes", "op", "world_size"]
    assert not collectives.duplicated(keys).any()
    cases = tp_gemm_cases(records)
    assert len(cases) == len(BACKENDS) * len(DTYPES)
    gloo = {(r.dtype, r.order): r.time_us for r in records
            if isinstance(r, TpGemmResult) and r.settings["backend"] == "gloo"}  # fmt: skip
    # keyed by (dtype, order); a row's dtype is read as any pandas scalar
    measured: Dict[Any, float] = {k: time_us for k, time_us in gloo.items() if time_us is not None}
    assert measured == gloo
    for row in cases.itertuples():
        factor = TWIN_SLOWDOWN if row.variant == "backend=auto" else 1.0
        assert row.AG_before_us == pytest.approx(measured[(row.dtype, "AG_before")] * factor)
        assert row.AG_after_us == pytest.approx(measured[(row.dtype, "AG_after")] * factor)
    training = training_table(records)
    assert not training.duplicated(["variant", "world_size"]).any()
    assert {k for k in training["knobs"]} == set(KNOBS)


def _identities(table: Table) -> List[Tuple[str, ...]]:
    columns = [i for i, (header, numeric) in enumerate(table.headers)
               if not numeric or header in AXIS_HEADERS]  # fmt: skip
    return [tuple(row[i][0] for i in columns) for row in table.rows]


def test_every_report_table_and_chart_keeps_each_value_apart(swept: Path) -> None:
    from torchscale.analysis.report_data import load_report_data
    from torchscale.app.report import report_content

    content = report_content(load_report_data(swept.parent))
    tables: Dict[str, Table] = {t.table_id: t for s in content.sections for t in s.tables}
    for table_id, table in tables.items():
        identities = _identities(table)
        assert len(identities) == len(set(identities)), f"{table_id}: two rows alike"
    shown = {tid: " ".join(cell for row in t.rows for cell, _ in row) for tid, t in tables.items()}
    for value in (*BACKENDS, *DTYPES):
        assert value in shown["collective-table"] and value in shown["tp-gemm-table"]
    for table_id in ("latency-table", "memory-table", "comm-compute-table", "gpu-telemetry-table"):
        assert all(knob in shown[table_id] for knob in KNOBS), table_id
        assert all(p in shown[table_id] for p in PRECISIONS), table_id
    for chart in content.charts:
        names = [s.name for s in chart.series]
        assert len(names) == len(set(names)), f"{chart.chart_id}: two series alike"
    bandwidth = next(c for c in content.charts if c.chart_id.startswith("bandwidth"))
    busbw = [s.name for s in bandwidth.series if s.name.startswith("busbw")]
    assert len(busbw) == len(BACKENDS) * len(DTYPES)
    assert all(sum(b in n and d in n for n in busbw) == 1 for b in BACKENDS for d in DTYPES)
    gemm = [c for c in content.charts if c.chart_id.startswith("tp-gemm")]
    categories = [x for chart in gemm for x in chart.categories()]
    assert len(categories) == len(set(categories)) == len(BACKENDS) * len(DTYPES)
    efficiency = [c for c in content.charts if c.chart_id.startswith("efficiency")]
    lines = [s.name for c in efficiency for s in c.series if s.name != "ideal"]
    assert len(lines) == len(PRECISIONS) * len(KNOBS)


def test_every_json_document_labels_each_entry(swept: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from torchscale.app.benchmark import write_documents
    from torchscale.cli.app import app
    from torchscale.report.document import document_schema

    jsonschema = pytest.importorskip("jsonschema")
    out = tmp_path / "report.json"
    result = CliRunner().invoke(app, ["report", "-s", str(swept), "-f", "json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    documents = [json.loads(out.read_text(encoding="utf-8"))]
    documents += [json.loads(p.read_text(encoding="utf-8")) for p in write_documents(swept)]
    assert [d["name"] for d in documents] == ["sweep-axes", "benchmark_1gpu", "benchmark_2gpu"]
    for document in documents:
        jsonschema.validate(document, document_schema())
        training = pd.DataFrame(document["results"]["training"])
        assert not training.duplicated(["variant", "world_size"]).any()
        assert all(training["variant"].str.contains(k).any() for k in KNOBS)
        assert all(training["variant"].str.contains(p).any() for p in PRECISIONS)
    two = documents[2]
    reduce = pd.DataFrame(two["results"]["communication"]["allreduce"])
    assert not reduce.duplicated(["variant", "dtype", "size_bytes"]).any()
    assert set(reduce["variant"]) == set(BACKENDS) and set(reduce["dtype"]) == set(DTYPES)
    gemm = pd.DataFrame(two["results"]["tp_gemm"])
    assert len(gemm) == len(BACKENDS) * len(DTYPES) * 2
    assert not gemm.duplicated(["variant", "dtype", "order"]).any()
    assert documents[1]["results"]["communication"] == {}  # 1-GPU cells: training only
