"""TensorBoard and MLflow from one real benchmark (1 and 2 gloo processes): TensorBoard's own
EventAccumulator and MLflow's own client read back what torchscale wrote. The benchmark is the
shared healthy run (``tests/support/shared_runs.py``), which writes both sinks live, so its
hostile experiment name reaches them too."""

from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml
from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from typer.testing import CliRunner

from tests.support.shared_runs import (
    HEALTHY_CONFIG,
    SCRIPT_NAME,
    healthy_mlflow_uri,
    healthy_tensorboard,
)
from tests.support.shared_runs import Run as SharedRun
from torchscale.cli.app import app
from torchscale.integrations.sinks import SinkEvents
from torchscale.results.layout import experiment_dirname
from torchscale.results.schema import TrainingResult
from torchscale.results.store import ExperimentStore

runner = CliRunner()
CONFIG = """\
experiment_name: integrations
models: [gpt2-tiny]
batch_sizes: [2]
gpu_counts: [1, 2]
backend: gloo
warmup_steps: 1
measure_steps: 5
sync_probe_steps: 2
cell_timeout_s: 240
"""
"""A config that never launches here: the missing-extra tests stop before any cell."""
_HEALTHY = yaml.safe_load(HEALTHY_CONFIG)
(BATCH,) = _HEALTHY["batch_sizes"]
STEPS = _HEALTHY["measure_steps"]
RUN_PREFIX = f"{experiment_dirname(SCRIPT_NAME)}/gpt2-tiny/batch{BATCH}"


@dataclass
class Run:
    results: Path
    tensorboard: Path
    mlflow_uri: str
    records: Dict[int, TrainingResult]  # by world size
    summary: Any


@pytest.fixture(scope="module")
def run(healthy_run: SharedRun) -> Run:
    folder = healthy_run.experiment_dir
    records = {r.world_size: r for r in ExperimentStore(folder).records()}
    import pandas as pd

    summary = pd.read_csv(folder / "summary.csv").set_index("world_size")
    tensorboard, uri = healthy_tensorboard(healthy_run), healthy_mlflow_uri(healthy_run)
    return Run(folder, tensorboard, uri, records, summary)  # type: ignore[arg-type]


def events(path: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(path), size_guidance={"scalars": 0, "histograms": 0})
    accumulator.Reload()
    return accumulator


def values(accumulator: EventAccumulator, tag: str) -> List[float]:
    return [event.value for event in accumulator.Scalars(tag)]


@pytest.mark.slow
def test_tensorboard_scalars_are_the_records(run: Run) -> None:
    for size, record in run.records.items():
        cell = events(run.tensorboard / RUN_PREFIX / f"gpus{size}")
        assert record.step_time_ms is not None and record.memory is not None
        assert values(cell, "throughput") == [pytest.approx(record.throughput, rel=1e-6)]
        assert values(cell, "step_time_ms_p95") == [
            pytest.approx(record.step_time_ms.p95, rel=1e-6)
        ]
        assert values(cell, "memory/peak_bytes") == [
            pytest.approx(record.memory.peak_bytes, rel=1e-6)
        ]
        steps = cell.Scalars("step_time_ms")
        assert [e.step for e in steps] == list(range(STEPS))
        assert [e.value for e in steps] == pytest.approx(record.step_times_ms, rel=1e-6)
        histogram = cell.Histograms("step_time_ms_hist")[0].histogram_value
        assert histogram.num == STEPS
        assert histogram.max == pytest.approx(max(record.step_times_ms), rel=1e-6)
        for rank in record.per_rank:
            waits = values(cell, f"sync_wait_ms/rank{rank.rank}")
            assert waits == pytest.approx(rank.sync_wait_samples_ms, rel=1e-6)
    two = events(run.tensorboard / RUN_PREFIX / "gpus2")
    two_rate, one_rate = run.records[2].throughput, run.records[1].throughput
    assert two_rate is not None and one_rate is not None
    efficiency = two_rate / (2 * one_rate)
    assert values(two, "scaling_efficiency") == [pytest.approx(efficiency, rel=1e-6)]
    scaling = events(run.tensorboard / RUN_PREFIX / "scaling")
    assert [e.step for e in scaling.Scalars("scaling/throughput")] == [1, 2]
    assert values(scaling, "scaling/efficiency") == pytest.approx([1.0, efficiency], rel=1e-6)


@pytest.mark.slow
def test_report_format_tensorboard_writes_the_same_runs(run: Run, tmp_path: Path) -> None:
    out = tmp_path / "tb"
    result = runner.invoke(
        app, ["report", "-s", str(run.results), "-f", "tensorboard", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert f"tensorboard --logdir {out}" in result.output
    for leaf in ("gpus1", "gpus2", "scaling"):
        live, exported = (
            events(run.tensorboard / RUN_PREFIX / leaf),
            events(out / RUN_PREFIX / leaf),
        )
        assert live.Tags()["scalars"] == exported.Tags()["scalars"]
        for tag in live.Tags()["scalars"]:
            assert values(exported, tag) == values(live, tag)


@pytest.mark.slow
def test_mlflow_has_a_parent_run_and_one_run_per_cell(run: Run) -> None:
    client = MlflowClient(tracking_uri=run.mlflow_uri)
    experiment = client.get_experiment_by_name(SCRIPT_NAME)
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("torchscale.kind") == "experiment"]
    cells = [r for r in runs if r.data.tags.get("torchscale.kind") == "cell"]
    assert len(cells) == 2 and parent.info.status == "FINISHED"
    assert {r.data.tags["mlflow.parentRunId"] for r in cells} == {parent.info.run_id}
    parent_files = {f.path for f in client.list_artifacts(parent.info.run_id)}
    assert {"summary.csv", "manifest.json", "report.json"} <= parent_files
    assert parent.data.metrics["cells_ok"] == 2
    for cell in cells:
        record = next(
            r for r in run.records.values() if r.cell_id == cell.data.tags["torchscale.cell_id"]
        )
        assert cell.info.run_name == f"gpt2-tiny/batch{BATCH}/gpus{record.world_size}"
        assert cell.info.status == "FINISHED"
        assert cell.data.metrics["throughput"] == pytest.approx(record.throughput, rel=1e-12)
        assert record.step_time_ms is not None
        assert cell.data.metrics["step_time_ms_p99"] == pytest.approx(
            record.step_time_ms.p99, rel=1e-12
        )
        assert cell.data.params["backend"] == "gloo"
        assert cell.data.params["batch_size"] == str(BATCH)
        assert cell.data.params["ddp.bucket_cap_mb"] == "25.0"
        history = client.get_metric_history(cell.info.run_id, "step_time_ms")
        assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx(
            record.step_times_ms
        )
        assert {f.path for f in client.list_artifacts(cell.info.run_id)} == {
            "result.json",
            "cell.json",
        }
    two = next(c for c in cells if c.info.run_name.endswith("gpus2"))
    efficiency = run.summary.loc[2, "scaling_efficiency"]
    assert two.data.metrics["scaling_efficiency"] == pytest.approx(efficiency, rel=1e-9)


MISSING = """
import sys
sys.modules[{module!r}] = None  # as if the extra were not installed
from typer.testing import CliRunner
from torchscale.cli.app import app
result = CliRunner().invoke(app, {args!r})
print(result.exit_code)
print(result.output)
"""


@pytest.mark.parametrize(
    ("module", "flag", "message"),
    [
        (
            "tensorboard",
            ["--tensorboard", "TB"],
            "TensorBoard output needs the tensorboard package: pip install 'torchscale[tensorboard]'",
        ),
        (
            "mlflow",
            ["--mlflow", "ML"],
            "--mlflow needs the mlflow package: pip install 'torchscale[mlflow]'",
        ),
    ],
)
def test_a_missing_extra_is_one_line_before_any_launch(
    tmp_path: Path, module: str, flag: List[str], message: str
) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text(CONFIG, encoding="utf-8")
    args = [
        "benchmark",
        "-c",
        str(config),
        "-o",
        str(tmp_path / "out"),
        *[str(tmp_path / a) if a.isupper() else a for a in flag],
    ]
    printed = subprocess.run(
        [sys.executable, "-c", MISSING.format(module=module, args=args)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    code, *lines = printed.strip().splitlines()
    assert code == "2"
    assert message in " ".join(lines) and "Traceback" not in printed
    assert not (tmp_path / "out").exists()


def test_a_failing_sink_costs_no_result(caplog: pytest.LogCaptureFixture) -> None:
    seen: List[str] = []

    class Console:
        def cell_started(self, cell: Any, position: int, total: int, cell_dir: Any) -> None: ...

        def cell_polled(self, elapsed_s: float) -> None: ...

        def cell_finished(self, cell: Any, records: Any, table: Any) -> None:
            seen.append("console")

    class Broken:
        name = "Broken"
        remote = True

        def cell_finished(self, records: Any, table: Any) -> None:
            raise OSError("disk full")

        def close(self, records: Any, table: Any) -> None:
            seen.append("closed")

    sink_events = SinkEvents(Console(), [Broken()])
    with caplog.at_level(logging.WARNING, logger="torchscale"):
        for _ in range(2):
            sink_events.cell_finished(None, [], object())  # type: ignore[arg-type]  # read by none
        sink_events.close([], object())  # type: ignore[arg-type]  # read by none
    assert seen == ["console", "console"]  # the console went on; the broken sink was left alone
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith("Broken logging stopped (OSError: disk full); the results are safe")


def test_an_interrupted_sweep_ends_its_mlflow_parent_run_killed(tmp_path: Path) -> None:
    from torchscale.integrations.mlflow_runs import MlflowSink

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sink = MlflowSink(uri, "interrupted", tmp_path, ["batch_sizes"])
    SinkEvents(object(), [sink]).abort()  # type: ignore[arg-type]
    client = MlflowClient(tracking_uri=uri)
    interrupted = client.get_experiment_by_name("interrupted")
    assert interrupted is not None
    (parent,) = client.search_runs([interrupted.experiment_id])
    assert parent.info.run_id == sink.parent_id and parent.info.status == "KILLED"
    assert parent.data.params["swept"] == "batch_sizes"
    # artifacts beside the database, not in ./mlruns of wherever torchscale ran
    assert parent.info.artifact_uri.startswith((tmp_path / "mlartifacts").resolve().as_uri())
