"""Fixes found by reading the GPU paths against the real APIs: device peaks by name, torchvision
models with auxiliary heads, and an nsys cell that was not traced."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch
from torch import nn

from torchscale.config.settings import CellSettings
from torchscale.hardware.peaks import peak_precision, peak_tflops
from torchscale.launch.cell import _only_nsys_failed
from torchscale.models.hub import hub_model
from torchscale.plan.planned_cell import Cell
from torchscale.plan.profile_request import ProfileRequest

# The names torch.cuda.get_device_name() reports (nvidia-smi's product names; ROCm's marketing
# name), and the dense bf16 / plain fp32 peaks each must get.
DEVICES = [
    ("NVIDIA A100-PCIE-40GB", 312.0, 19.5),
    ("NVIDIA A100 80GB PCIe", 312.0, 19.5),
    ("NVIDIA A100-SXM4-40GB", 312.0, 19.5),
    ("NVIDIA A100-SXM4-80GB", 312.0, 19.5),
    ("NVIDIA H100 PCIe", 756.0, 51.0),
    ("NVIDIA H100 80GB HBM3", 989.0, 67.0),
    ("NVIDIA H100 NVL", 835.0, 60.0),
    ("NVIDIA H200", 989.0, 67.0),
    ("NVIDIA H200 NVL", 835.0, 60.0),
    ("NVIDIA GH200 480GB", 989.0, 67.0),
    ("NVIDIA L4", 121.0, 30.3),
    ("NVIDIA L40", 181.0, 90.5),
    ("NVIDIA L40S", 362.0, 91.6),
    ("NVIDIA B200", 2250.0, 80.0),
    ("AMD Instinct MI300X", 1307.4, 163.4),
]


@pytest.mark.parametrize(("name", "bf16", "fp32"), DEVICES)
def test_peaks_match_whole_device_names(name, bf16, fp32):
    assert peak_tflops(name, "bf16") == bf16
    assert peak_tflops(name, "fp32") == fp32


def test_unknown_devices_have_no_peak():
    assert peak_tflops("NVIDIA L4000", "bf16") is None  # not an L4
    assert peak_tflops("NVIDIA RTX A6000", "bf16") is None
    assert peak_tflops("", "bf16") is None


def test_fp32_resnet_on_a100_is_scored_against_tf32():
    """ResNet-50 at 1,400 img/s/GPU (24.6 GFLOP per trained image) is 34.5 TFLOP/s: over the
    19.5 of plain FP32 (MFU > 100%), 22% of the 156 TF32 peak cuDNN actually ran at."""
    key = peak_precision("fp32", tf32_matmul=False, tf32_conv=True, has_conv=True)
    peak = peak_tflops("NVIDIA A100-SXM4-80GB", key)
    assert key == "tf32" and peak == 156.0
    assert 24.6e9 * 1400 / (peak * 1e12) == pytest.approx(0.22, abs=0.01)


class _Inception(nn.Module):
    """Shaped like torchvision's GoogLeNet/Inception3: with aux_logits (their default) the
    training forward returns (logits, aux...) and the aux heads only feed those extra outputs."""

    def __init__(self, aux_logits: bool = True, init_weights: Any = None) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(4, 1000)
        self.aux = nn.Linear(4, 1000) if aux_logits else None

    def forward(self, x: torch.Tensor) -> Any:
        h = self.body(x)
        return (self.fc(h), self.aux(h)) if self.aux is not None and self.training else self.fc(h)


@pytest.fixture
def fake_torchvision(monkeypatch) -> List[Dict[str, Any]]:
    """torchvision is not installed here: its get_model API, recording what it was asked."""
    asked: List[Dict[str, Any]] = []
    models = types.ModuleType("torchvision.models")

    def get_model(name: str, **kwargs: Any) -> nn.Module:
        asked.append({"name": name, **kwargs})
        options = {k: v for k, v in kwargs.items() if k in ("aux_logits", "init_weights")}
        return _Inception(**options)

    models.get_model = get_model  # type: ignore[attr-defined]
    models.list_models = lambda module=None: ["googlenet", "inception_v3", "resnet50"]  # type: ignore[attr-defined]
    package = types.ModuleType("torchvision")
    package.models = models  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torchvision", package)
    monkeypatch.setitem(sys.modules, "torchvision.models", models)
    return asked


@pytest.mark.parametrize("arch", ["googlenet", "inception_v3"])
def test_torchvision_models_with_aux_heads_are_built_without_them(fake_torchvision, arch):
    spec = hub_model(f"torchvision/{arch}")
    model = spec.build()
    assert fake_torchvision[-1]["aux_logits"] is False
    # every parameter takes part in the loss: DDP's second step would fail otherwise
    images, targets = spec.batch(2, torch.device("cpu"))
    spec.loss(model(images), targets).backward()
    assert all(p.grad is not None for p in model.parameters())
    hub_model("torchvision/resnet50")
    assert "aux_logits" not in fake_torchvision[-1]


def _cell_dir(tmp: Path, phases: List[str], error: bool = False) -> Path:
    ranks = tmp / "ranks"
    ranks.mkdir(parents=True)
    for rank, phase in enumerate(phases):
        (ranks / f"rank{rank}.progress.json").write_text(json.dumps({"rank": rank, "phase": phase}))
    if error:
        (ranks / "rank1.error.json").write_text(json.dumps({"rank": 1, "type": "RuntimeError"}))
    return tmp


def test_untraced_nsys_cell_is_not_failed_for_its_missing_report(tmp_path):
    settings = CellSettings(model="resnet-tiny", batch_size=2, gpus=2)
    cell = Cell(0, "c", settings)
    nsys = ProfileRequest(tool="nsys", target="all", trigger="sync_stall_detection")
    untraced = {"profile": {"tool": "nsys", "profiled": False, "reason": "below thresholds"}}
    done = _cell_dir(tmp_path / "a", ["done", "done"])
    assert _only_nsys_failed(done, cell, nsys, untraced)
    # a traced cell needs its report; a rank that failed or stopped early is a failure
    assert not _only_nsys_failed(done, cell, nsys, {"profile": {"profiled": True}})
    assert not _only_nsys_failed(
        _cell_dir(tmp_path / "b", ["done", "measure"]), cell, nsys, untraced
    )
    assert not _only_nsys_failed(
        _cell_dir(tmp_path / "c", ["done"] * 2, True), cell, nsys, untraced
    )
    torch_tool = ProfileRequest(tool="torch", target="all", trigger="always")
    assert not _only_nsys_failed(done, cell, torch_tool, untraced)
