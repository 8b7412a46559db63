"""Every training knob takes effect in a real 2-rank launch, shown by what the worker recorded.

Two cells cover all knobs between them; the evidence is the record's ``runtime`` block, which
includes DDP's own report of its configuration (its logging data), not our echo of the config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict

import pytest
import torch
from typer.testing import CliRunner

from torchscale.cli.app import app
from torchscale.results.schema import TrainingResult
from torchscale.results.store import ExperimentStore

pytestmark = (
    pytest.mark.slow
)  # every test here reads real cells run with the knobs (torchrun launches)

runner = CliRunner()

CELL_A = """\
experiment_name: knobs-a
models: [resnet-tiny]
batch_sizes: [4]
gpu_counts: [2]
precision: bf16
channels_last: true
grad_accum_steps: 2
compile: true
compile_backend: eager
warmup_steps: 2
measure_seconds: 1.0
sync_probe_steps: 2
ddp:
  comm_hook: bf16
data:
  source: tensor_file
  path: {tensors}
  num_workers: 1
"""

CELL_B = """\
experiment_name: knobs-b
models: [resnet-tiny]
batch_sizes: [4]
gpu_counts: [2]
precision: amp
optimizer: adamw
optimizer_impl: foreach
warmup_steps: 3
measure_steps: 5
sync_probe_steps: 2
ddp:
  comm_hook: powersgd
  powersgd_rank: 2
  static_graph: true
  bucket_cap_mb: 1
  gradient_as_bucket_view: true
data:
  source: image_folder
  path: {images}
  num_workers: 0
"""


def run(tmp: Path, text: str, name: str) -> TrainingResult:
    config = tmp / f"{name}.yaml"
    config.write_text(text)
    result = runner.invoke(app, ["benchmark", "-c", str(config), "-o", str(tmp / "out")])
    assert result.exit_code == 0, result.output
    (record,) = ExperimentStore(tmp / "out" / name).records()
    assert isinstance(record, TrainingResult)
    assert record.status == "ok", record.error
    return record


@pytest.fixture(scope="module")
def knobs(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, TrainingResult]:
    tmp = tmp_path_factory.mktemp("knobs")
    tensors = tmp / "data.pt"
    torch.save(
        {"inputs": torch.randn(64, 3, 32, 32), "targets": torch.randint(0, 10, (64,))}, tensors
    )
    images = tmp / "images"
    from PIL import Image

    for label in ("cat", "dog"):
        (images / label).mkdir(parents=True)
        for index in range(12):
            color = (index * 20, 100 if label == "cat" else 200, 50)
            Image.new("RGB", (40, 40), color).save(images / label / f"{index}.png")
    return {
        "a": run(tmp, CELL_A.format(tensors=tensors), "knobs-a"),
        "b": run(tmp, CELL_B.format(images=images), "knobs-b"),
    }


def test_bf16_channels_last_accumulation_compile_and_data_file(knobs: Dict) -> None:
    record = knobs["a"]
    runtime = record.runtime
    assert record.unit == "images" and record.units_per_sample == 1
    assert runtime["autocast_dtype"] == "bfloat16" and runtime["grad_scaler"] is False
    assert runtime["channels_last"] is True
    assert runtime["compiled"] == "eager"
    # CUDA-only knobs are recorded as not applying on CPU; the math in force is recorded
    assert runtime["cudnn_benchmark"] is None
    assert set(runtime["allow_tf32"]) == {"matmul", "cudnn"}
    assert runtime["peak_precision"] == "bf16"
    assert runtime["optimizer"] == "SGD"  # resnet's usual optimizer under optimizer: auto
    assert runtime["optimizer_impl"] == "auto"  # PyTorch's choice
    ddp = runtime["ddp"]
    assert ddp["comm_hook"] == "bf16_compress_hook"
    assert ddp["bucket_cap_bytes"] == 25 * 1024 * 1024  # the default
    # Two micro-batches of 4 per step on each of 2 ranks.
    assert record.grad_accum_steps == 2 and record.global_batch_size == 16
    # measure_seconds: the window lasts about a second, however many steps that takes.
    assert 0.5 < record.measured_s < 4.0
    assert record.measure_steps >= 1
    # Batches come from the tensor file through a DataLoader with one worker.
    assert runtime["data"] == "tensor_file" and runtime["data_workers"] == 1
    assert all(rank.data_ms is not None and rank.data_ms > 0 for rank in record.per_rank)


def test_amp_powersgd_static_graph_buckets_adamw_and_image_folder(knobs: Dict) -> None:
    record = knobs["b"]
    runtime = record.runtime
    assert record.precision == "amp"
    assert runtime["autocast_dtype"] == "float16" and runtime["grad_scaler"] is True
    assert runtime["optimizer"] == "AdamW" and runtime["optimizer_impl"] == "foreach"
    ddp = runtime["ddp"]
    assert ddp["comm_hook"] == "ordered_powerSGD_hook"  # gloo: buckets in order
    assert ddp["static_graph"] == 1
    assert ddp["bucket_cap_bytes"] == 1024 * 1024
    assert ddp["gradient_as_bucket_view"] == 1
    # ~2 MB of gradients in 1 MiB buckets: several buckets, all parameters covered.
    assert len(ddp["bucket_sizes"]) >= 2
    assert sum(ddp["bucket_sizes"]) == ddp["total_parameter_size_bytes"]
    assert runtime["data"] == "image_folder"
    assert record.measure_steps == 5
    # AdamW keeps two state tensors per parameter: optimizer state is twice the parameters.
    memory = record.per_rank[0].memory
    assert memory.optimizer_bytes >= 2 * memory.params_bytes
