"""Other tools' files run for real, tiny, on gloo: DDLB's config.json as written (with small
m/n/k and the backends this machine has, through overrides) and a GPU-Training-Benchmark-Suite-style YAML that
downloads CIFAR-100 from a local server and measures epochs with strict timing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed as dist
from typer.testing import CliRunner

from tests.support.cifar100_files import SAMPLES, cifar100_archive, http_server, md5
from torchscale.cli.app import app
from torchscale.config import dataset_paths
from torchscale.results.layout import METRICS_EPOCH, RUN_SUMMARY
from torchscale.results.schema import TpGemmResult, TrainingResult
from torchscale.results.store import ExperimentStore

runner = CliRunner()
DDLB_CONFIG = Path(__file__).parent / "data" / "ddlb" / "config.json"


@pytest.mark.slow
def test_ddlb_config_runs_with_small_sizes_on_gloo(tmp_path: Path) -> None:
    args = [
        "benchmark", "-c", str(DDLB_CONFIG), "-o", str(tmp_path),
        "--set", "communication.backend=[gloo, ucc/tl/ucp]",
        "--set", "benchmark.m=64", "--set", "benchmark.n=16", "--set", "benchmark.k=32",
        "--set", "benchmark.implementations.compute_only=[{size: [unsharded, sharded]}]",
        "--warmup", "1", "--iters", "3",
    ]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    records = ExperimentStore(tmp_path / "config").records()
    gemms = {(r.settings["backend"], r.order): r for r in records if isinstance(r, TpGemmResult)}
    assert sorted(gemms) == [
        ("gloo", "AG_after"), ("gloo", "AG_before"),
        ("ucc/tl/ucp", "AG_after"), ("ucc/tl/ucp", "AG_before"),
    ]  # fmt: skip
    for order in ("AG_before", "AG_after"):
        gemm = gemms[("gloo", order)]
        assert gemm.status == "ok" and gemm.valid is True and gemm.wrong == 0
        assert (gemm.m, gemm.n, gemm.k, gemm.dtype) == (64, 16, 32, "float32")
        assert (gemm.warmup, gemm.iterations) == (1, 3)
        assert gemm.reference_time_us is not None and gemm.reference_time_us > 0
        assert gemm.sharded_time_us is not None and gemm.sharded_time_us > 0
        expected = 2 * (64 // 2) * 16 * 32 / (gemm.sharded_time_us * 1e-6) / 1e12
        assert gemm.sharded_tflops == pytest.approx(expected)
        assert f"sharded {gemm.sharded_time_us:,.1f} us" in result.output
    ucp = gemms[("ucc/tl/ucp", "AG_before")]
    if not dist.is_ucc_available():
        assert ucp.status == "skipped"
        assert ucp.error is not None and ucp.error.startswith(
            "backend ucc/tl/ucp is not available in this torch"
        )
    header = (tmp_path / "config" / "summary_tp_gemm.csv").read_text().splitlines()[0]
    assert "sharded_time_us" in header.split(",")


GPU_SUITE_YAML = """\
model:
  name: resnet-tiny
  channels_last: false
data:
  source: cifar100
  path: {data}
  batch_size: 4
  num_workers: 0
training:
  epochs: 3
  precision: fp32
  seed: 42
  cudnn_benchmark: true
benchmark:
  warmup_steps: 1
  log_step_times: true
  sync_cuda: true
sync_probe_steps: 0
cell_timeout_s: 180
"""


@pytest.mark.slow
def test_gpu_suite_yaml_downloads_cifar100_and_measures_epochs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = cifar100_archive(tmp_path / "served")
    data = tmp_path / "data"
    config = tmp_path / "cifar100_resnet.yaml"
    config.write_text(GPU_SUITE_YAML.format(data=data))
    with http_server(archive.parent) as base:
        monkeypatch.setattr(dataset_paths, "CIFAR100_URL", f"{base}/{archive.name}")
        monkeypatch.setattr(dataset_paths, "CIFAR100_MD5", md5(archive))
        result = runner.invoke(
            app,
            ["benchmark", "-c", str(config), "-o", str(tmp_path / "out"), "--training.epochs=2"],
        )
    assert result.exit_code == 0, result.output
    assert (data / "cifar-100-python" / "train").is_file()
    (record,) = ExperimentStore(tmp_path / "out" / "cifar100_resnet").records()
    assert isinstance(record, TrainingResult) and record.status == "ok"
    assert record.throughput is not None and record.throughput > 0
    # The cell trained on the CIFAR-100 files (the reader: tests/test_datasets.py), its batches
    # through the DataLoader.
    assert record.runtime["data"] == "cifar100"
    assert record.per_rank[0].data_ms is not None
    steps = SAMPLES // 4  # one rank, batch 4: a pass is every sample once
    assert [(e.epoch, e.steps, e.samples) for e in record.epochs] == [
        (1, steps, SAMPLES),
        (2, steps, SAMPLES),
    ]
    assert record.measure_steps == 2 * steps and len(record.step_times_ms) == 2 * steps
    assert record.runtime["sync_cuda"] is True and record.settings["sync_cuda"] is True
    cell = tmp_path / "out" / "cifar100_resnet" / "cells" / record.cell_id
    lines = [json.loads(line) for line in (cell / METRICS_EPOCH).read_text().splitlines()]
    assert [line["epoch"] for line in lines] == [1, 2]
    for line in lines:
        assert line["samples_per_s"] == pytest.approx(line["samples"] / line["window_s"])
        assert line["unit"] == "images" and line["cell_id"] == record.cell_id
    summary = json.loads((cell / RUN_SUMMARY).read_text())
    assert summary["status"] == "ok" and summary["epochs"] == 2 and summary["sync_cuda"] is True
    assert summary["samples_per_s"] == pytest.approx(record.samples_per_s)
    assert summary["epoch_samples_per_s"] == pytest.approx([e["samples_per_s"] for e in lines])
    assert "GPU Training Benchmark Suite's training.epochs is torchscale's epochs" in " ".join(
        result.output.split()
    )
