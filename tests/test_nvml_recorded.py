"""NVML answers recorded on a real GPU node, replayed: torchscale reads them as it did there.

``tests/data/nvml/h100_pcie_recorded.json`` was written on a lent H100 80GB HBM3 (driver
580.159.04, PCIe gen 5 x16, no NVLink peers, 2026-11-22) by ``python tests/support/fakes/fake_pynvml.py
record``; ``h100_pcie_validate.json`` is ``torchscale validate --json`` on the same node. The two
came from two start-ups of the node a few minutes apart, so only the GPU's temperature and power
draw differ between them (idle 34 vs 36 C, 73 W in both).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

from tests.support.fakes.fake_pynvml import load
from torchscale.hardware.nvml import Nvml, open_nvml, read_telemetry
from torchscale.validate.runner import gpu_health

DATA = Path(__file__).parent / "data" / "nvml"
RECORDED = json.loads((DATA / "h100_pcie_recorded.json").read_text())
REAL_VALIDATE = json.loads((DATA / "h100_pcie_validate.json").read_text())
# Read off the GPU at the moment of recording, so they differ from the validate run's.
MOMENTARY = {"Temperature", "Power"}


@pytest.fixture
def recorded_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", load(RECORDED))


def test_replayed_checks_give_what_validate_said_on_the_real_node(recorded_nvml: None) -> None:
    real: Dict[str, Dict[str, Any]] = {c["name"]: c for c in REAL_VALIDATE["checks"]}
    replayed = gpu_health(torch_count=1).checks
    assert len(replayed) >= 10
    for check in replayed:
        assert check.name in real, check.name
        assert check.status.value == real[check.name]["status"], check
        if check.name not in MOMENTARY:
            assert check.value == real[check.name]["value"], check.name
    by_name = {c.name: c for c in replayed}
    # The momentary ones are computed from the recording's own numbers.
    assert by_name["Temperature"].value == "36-36 C (slowdown at 89 C)"
    assert by_name["Power"].value == "73-73 W drawn, limit 700 W"
    # What a real PCIe H100 answers, and a CPU-only fake would never have said:
    assert by_name["GPUs"].value == "1 x NVIDIA H100 80GB HBM3 (79.6 GiB)"
    assert by_name["PCIe link"].value == "gen 5 x16"
    assert by_name["NVLink"].status.value == "SKIP"
    assert by_name["NVLink"].value == "no NVLink reported (Not Supported)"


def test_telemetry_sample_of_the_idle_real_gpu(recorded_nvml: None) -> None:
    with open_nvml() as nvml:
        assert isinstance(nvml, Nvml)
        handles = nvml.handles()
        assert isinstance(handles, list)
        (handle,) = handles
        sample = read_telemetry(nvml, handle)
    assert sample["sm_clock_mhz"] == 345.0  # idle SM clock; 1980 MHz under load (docs/perf-gpu.md)
    assert sample["mem_clock_mhz"] == 2619.0
    assert sample["power_w"] == pytest.approx(73.071)
    assert sample["power_limit_w"] == 700.0
    assert sample["mem_total_bytes"] == 85520809984.0
    assert sample["clocks_event_reasons"] == 1.0  # GPU idle, the only reason set
