"""validate on nodes that are not all healthy or not all ours: one GPU NVML refuses, NVLink
cards without a bridge, MIG, newer clock-event bits. Faults are injected into the recorded H100
node exactly as NVML reports them (tests/support/fakes/fake_pynvml.py raises the real pynvml errors)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict

import pynvml
import pytest
import torch

from tests.support.fakes.fake_pynvml import load
from torchscale.hardware import environment
from torchscale.hardware.nvml import CLOCKS_EVENT_REASONS, decode_clocks_event_reasons
from torchscale.validate.runner import gpu_health, smoke_ranks

DATA = Path(__file__).parent / "data" / "nvml"
NOT_FOUND = {"error": "NVML_ERROR_NOT_FOUND"}


def h100() -> Dict[str, Any]:
    return json.loads((DATA / "h100_healthy.json").read_text())


def install(monkeypatch: pytest.MonkeyPatch, data: Dict[str, Any]) -> Dict[str, Any]:
    monkeypatch.setitem(sys.modules, "pynvml", load(data))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return {c.name: c for c in gpu_health(torch_count=len(data["devices"])).checks}


def test_a_gpu_of_another_job_does_not_hide_the_others(monkeypatch):
    data = h100()
    data["devices"][3]["nvmlDeviceGetHandleByIndex"] = {"error": "NVML_ERROR_NO_PERMISSION"}
    checks = install(monkeypatch, data)
    gpus = checks["GPUs"]
    assert gpus.status.value == "PASS"
    assert gpus.value.startswith("7 x NVIDIA H100 80GB HBM3")
    assert "GPU 3 not accessible to this process (NVML: Insufficient Permissions" in gpus.value
    assert checks["ECC"].status.value == "PASS"
    assert checks["NVLink"].value == "18/18 links up on GPUs 0, 1, 2, 4, 5, 6, 7"
    assert checks["GPU topology"].value == "pairs: NV18 x21"  # the 7 readable GPUs' pairs
    assert smoke_ranks() == 7  # NCCL ranks on the job's own GPUs, not a gloo fallback


def test_a_lost_gpu_fails_by_name_and_the_rest_are_checked(monkeypatch):
    data = h100()
    data["devices"][5]["nvmlDeviceGetHandleByIndex"] = {"error": "NVML_ERROR_GPU_IS_LOST"}
    checks = install(monkeypatch, data)
    assert checks["GPUs"].status.value == "FAIL"
    assert checks["GPUs"].value.startswith("GPU 5 fell off the bus; 7 x NVIDIA H100")
    assert "Xid 79" in checks["GPUs"].fix
    assert checks["Persistence mode"].status.value == "PASS"
    assert smoke_ranks() == 8  # the smoke test runs on it too, and fails there


def _links(device: Dict[str, Any], active: int) -> None:
    states = device["nvmlDeviceGetNvLinkState"]
    for link in range(18):
        states[str(link)] = 1 if link < active else 0


def test_nvlink_cards_without_a_bridge_are_not_connected_not_down(monkeypatch):
    data = h100()
    for device in data["devices"]:
        _links(device, 0)
    nvlink = install(monkeypatch, data)["NVLink"]
    assert nvlink.status.value == "SKIP"
    assert nvlink.value.startswith("not connected: 18 NVLink ports per GPU, none active")


def test_fewer_active_links_than_the_peers_is_the_fail(monkeypatch):
    data = h100()
    for index, device in enumerate(data["devices"]):
        _links(device, 4 if index == 6 else 12)  # a bridge pairs 12 ports; GPU 6 lost 8
    nvlink = install(monkeypatch, data)["NVLink"]
    assert nvlink.status.value == "FAIL"
    assert nvlink.value.startswith("GPU 6: 4/12 links up")


def test_mig_mode_names_the_mig_devices(monkeypatch):
    data = h100()
    device = data["devices"][0]
    device["nvmlDeviceGetMigMode"] = [1, 1]
    device["nvmlDeviceGetMaxMigDeviceCount"] = 7
    mig = {"nvmlDeviceGetName": "NVIDIA H100 80GB HBM3 MIG 3g.40gb"}
    device["nvmlDeviceGetMigDeviceHandleByIndex"] = {"0": {"mig": mig}, "1": {"mig": mig}}
    device["nvmlDeviceGetMigDeviceHandleByIndex"]["*"] = NOT_FOUND
    check = install(monkeypatch, data)["MIG mode"]
    assert check.status.value == "WARN"
    assert check.value == "GPU 0: MIG on, 2 MIG device(s): 2 x NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert "-mig 0" in check.fix


def test_cuda_device_discovery_counts_and_names_mig_devices(monkeypatch):
    names = ["NVIDIA A100-SXM4-40GB MIG 3g.20gb"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(names))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: names[i])
    devices = environment.node_devices()
    assert devices.count == 1 and devices.mig_devices == names
    assert devices.describe(1) == "1 GPU (MIG device: NVIDIA A100-SXM4-40GB MIG 3g.20gb)"
    names[:] = ["NVIDIA A100-SXM4-40GB"] * 2
    assert environment.node_devices().mig_devices == []
    assert environment.node_devices().describe(2) == "2 GPUs"


@pytest.mark.parametrize(
    ("mask", "value"),
    [(0x200, "GPU 0: Board limit"), (0x400, "GPU 0: Reliability"), (0x600, None)],
)
def test_board_limit_and_reliability_bits_are_decoded(monkeypatch, mask, value):
    # the bits nvidia-ml-py 13 defines only under the old names
    assert CLOCKS_EVENT_REASONS[pynvml.nvmlClocksThrottleReasonBoardLimit] == "board_limit"
    assert CLOCKS_EVENT_REASONS[pynvml.nvmlClocksThrottleReasonReliability] == "reliability"
    data = h100()
    data["devices"][0]["nvmlDeviceGetCurrentClocksEventReasons"] = mask
    check = install(monkeypatch, data)["Clock throttling"]
    assert check.status.value == "WARN"
    assert check.value == (value or "GPU 0: Board limit, Reliability")
    assert "Board limit / reliability" in check.fix


def test_bits_newer_than_pynvml_are_reported_not_dropped():
    assert decode_clocks_event_reasons(0x801) == ["gpu_idle", "reason_bit_0x800"]
