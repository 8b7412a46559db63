"""GPU telemetry sampling in the worker, against recorded NVML answers (no GPU here)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from tests.support.fakes.fake_pynvml import load
from torchscale.hardware.nvml import decode_clocks_event_reasons
from torchscale.worker.gpu_sampler import GpuSampler, summarize

FIXTURES = Path(__file__).parent / "data" / "nvml"


def test_sampler_reads_the_throttled_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fixture = json.loads((FIXTURES / "h100_thermal.json").read_text())
    monkeypatch.setitem(sys.modules, "pynvml", load(fixture))
    gpu = fixture["devices"][5]
    with GpuSampler(5, interval_s=0.01) as sampler:
        time.sleep(0.15)
    summary = sampler.summary()
    assert summary is not None and summary["samples"] >= 3
    assert summary["temperature_c_max"] == gpu["nvmlDeviceGetTemperature"]["0"]
    assert summary["power_w_mean"] == pytest.approx(gpu["nvmlDeviceGetPowerUsage"] / 1000)
    assert summary["util_pct_max"] == gpu["nvmlDeviceGetUtilizationRates"]["gpu"]
    assert summary["memory_used_bytes_max"] == gpu["nvmlDeviceGetMemoryInfo"]["used"]
    assert summary["sm_clock_mhz_mean"] == gpu["nvmlDeviceGetClockInfo"]["1"]
    expected = set(decode_clocks_event_reasons(gpu["nvmlDeviceGetCurrentClocksEventReasons"]))
    assert set(summary["throttle_reasons"]) == expected - {
        "gpu_idle",
        "applications_clocks_setting",
    }
    assert any("thermal" in reason for reason in summary["throttle_reasons"])


def test_sampler_without_nvml_gives_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    fixture = json.loads((FIXTURES / "not_supported.json").read_text())
    monkeypatch.setitem(sys.modules, "pynvml", load(fixture))
    with GpuSampler(0, interval_s=0.01) as sampler:
        time.sleep(0.05)
    summary = sampler.summary()
    # NVML answers NotSupported for every field: samples exist but every value is unknown.
    assert summary is None or all(
        summary[key] is None for key in ("util_pct_mean", "power_w_mean", "temperature_c_max")
    )


def test_summarize_mixed_samples() -> None:
    samples: List[Dict[str, Optional[float]]] = [
        {
            "gpu_util_pct": 90.0,
            "power_w": 500.0,
            "temperature_c": 70.0,
            "clocks_event_reasons": 1.0,
        },
        {
            "gpu_util_pct": 100.0,
            "power_w": None,
            "temperature_c": 75.0,
            "clocks_event_reasons": 0.0,
        },
    ]
    summary = summarize(samples)
    assert summary is not None
    assert summary["util_pct_mean"] == 95.0 and summary["util_pct_max"] == 100.0
    assert summary["power_w_mean"] == 500.0 and summary["temperature_c_max"] == 75.0
    assert summary["throttle_reasons"] == []  # bit 0 is "GPU idle": benign
    assert summarize([]) is None
