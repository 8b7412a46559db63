"""A vision model trained on GPUs without channels_last carries a finding, with the gain measured
beside it or the H100 figure. The records are built from docs/perf-gpu.md's
H100 run: ResNet-50, bf16, batch 256, 2,207.8 img/s in NCHW and 3,900.5 in channels_last."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

from typer.testing import CliRunner

from tests.support.report_fixtures import _identity, _settings
from tests.support.step_records import rank_parts
from torchscale.analysis.layout_findings import EXPECTED_GAIN, channels_last_findings
from torchscale.app.benchmark_modes import layout_lines
from torchscale.cli.app import app
from torchscale.results.schema import TrainingResult
from torchscale.results.store import ExperimentStore
from torchscale.worker.aggregate import aggregate

H100 = "NVIDIA H100 80GB HBM3"
NCHW_IMG_S, NHWC_IMG_S = 2207.8, 3900.5  # docs/perf-gpu.md, resnet50 bf16 batch 256
BATCH = 256


def record(
    channels_last: bool = False,
    throughput: float = NCHW_IMG_S,
    device: str = H100,
    applies: bool = True,
    model: str = "resnet50",
) -> TrainingResult:
    """One rank's steps at the throughput given, aggregated by the worker's own ``aggregate``."""
    step_ms = BATCH / throughput * 1000
    figures = aggregate(
        [{**rank_parts(0, 0.0, step_ms, 0.0), "device": "cpu" if device == "cpu" else "cuda:0"}],
        batch_size=BATCH, grad_accum_steps=1, precision="bf16", unit="images",
        units_per_sample=1.0, flops_per_sample=None, device_name=device,
    )  # fmt: skip
    settings = _settings(model, BATCH, 1, 0)
    identity: Dict[str, Any] = _identity(settings, "seed_config")
    identity["settings"] = {**identity["settings"], "channels_last": channels_last}
    identity["cell_id"] += "-nhwc" if channels_last else ""
    return TrainingResult(
        **{**identity, **figures}, status="ok", backend="nccl", hosts=["node-a"],
        runtime={"channels_last": channels_last, "channels_last_applies": applies},
    )  # fmt: skip


def test_nchw_on_a_gpu_is_told_the_expected_gain() -> None:
    (finding,) = channels_last_findings([record()])
    assert finding["title"] == "resnet50 trained in NCHW on GPUs (channels_last off)"
    assert f"expected about {EXPECTED_GAIN:.2f}x" in finding["message"]
    assert "1.77x" in finding["message"] and "2,208 -> 3,901 img/s" in finding["message"]
    assert (
        "channels_last: true" in finding["recommendation"] and "tune" in finding["recommendation"]
    )
    assert finding["category"] == "layout" and finding["severity"] == "medium"


def test_the_same_cell_with_channels_last_gives_the_measured_gain() -> None:
    (finding,) = channels_last_findings([record(), record(True, NHWC_IMG_S)])
    assert f"measured here: {NHWC_IMG_S / NCHW_IMG_S:.2f}x" in finding["message"]
    assert "expected" not in finding["message"]
    # measured and not worth it (a model whose convolutions NHWC does not speed up): no finding
    assert channels_last_findings([record(), record(True, NCHW_IMG_S * 1.01)]) == []


def test_no_finding_where_the_layout_does_not_apply() -> None:
    assert channels_last_findings([record(device="cpu")]) == []  # CPU processes
    assert channels_last_findings([record(applies=False, model="bert-large")]) == []
    assert channels_last_findings([record(True, NHWC_IMG_S)]) == []  # already NHWC
    old = record()
    old.runtime.pop("channels_last_applies")  # a record from before the model said
    assert channels_last_findings([old]) == []


def test_the_benchmark_console_and_the_report_carry_it(tmp_path: Path) -> None:
    (line,) = layout_lines([record()])
    assert line.startswith("> [WARN] resnet50 trained in NCHW on GPUs (channels_last off): ")
    assert "expected about 1.77x" in line
    store = ExperimentStore(tmp_path / "seed_config")
    store.write_manifest({"schema_version": 1, "experiment": "seed_config", "config": {}})
    store.append(record())
    html = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["report", "-s", str(store.root), "-o", str(html)])
    assert result.exit_code == 0, result.output
    page = html.read_text(encoding="utf-8")
    assert "resnet50 trained in NCHW on GPUs (channels_last off)" in page
    assert "expected about 1.77x" in page
