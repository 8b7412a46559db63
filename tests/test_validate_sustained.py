"""Level 3's watch on sustained load, from NVML answers of the recorded HGX H100 (the fake
pynvml replays them, as time series where a GPU heats up): the sampler reads them as a real
node answers, and each verdict follows from the figures."""

from __future__ import annotations

import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict

import pytest

from tests.support.fakes.fake_pynvml import load
from torchscale.config.validate_section import ValidateSection
from torchscale.validate.result import Status
from torchscale.validate.sustained_judging import drift, sustained_checks
from torchscale.validate.sustained_load import SLICES, Slices, run_sustained

DATA = Path(__file__).parent / "data" / "nvml"
HOT = 0x40  # nvmlClocksEventReasonHwThermalSlowdown
SW_POWER_CAP = 0x4


def heating_node() -> Dict[str, Any]:
    """Two GPUs of the recorded HGX H100: GPU 0 stays cool and at full clock under load;
    GPU 1 heats past its slowdown threshold (89 C), reports HW thermal slowdown, drops its SM
    clock and counts two uncorrectable ECC errors during the run."""
    fixture = json.loads((DATA / "h100_healthy.json").read_text())
    fixture["devices"] = [copy.deepcopy(d) for d in fixture["devices"][:2]]
    steady, hot = fixture["devices"]
    series = {"series": [1980] * 3 + [1980] * 3 + [1980] * 3}
    steady["nvmlDeviceGetClockInfo"] = {"1": series, "2": 2619}
    steady["nvmlDeviceGetTemperature"] = {"0": {"series": [40, 55, 63, 66, 67, 67, 68, 68, 68]}}
    steady["nvmlDeviceGetPowerUsage"] = {"series": [650000] * 9}
    steady["nvmlDeviceGetCurrentClocksEventReasons"] = {"series": [SW_POWER_CAP] * 9}
    hot["nvmlDeviceGetClockInfo"] = {
        "1": {"series": [1980, 1980, 1980, 1900, 1750, 1600, 1410, 1410, 1410]},
        "2": 2619,
    }
    hot["nvmlDeviceGetTemperature"] = {"0": {"series": [42, 61, 74, 83, 87, 89, 90, 90, 90]}}
    hot["nvmlDeviceGetPowerUsage"] = {"series": [690000] * 9}
    hot["nvmlDeviceGetCurrentClocksEventReasons"] = {
        "series": [SW_POWER_CAP] * 4 + [SW_POWER_CAP | HOT] * 5
    }
    hot["nvmlDeviceGetTotalEccErrors"] = {"1,0": {"series": [0, 2]}, "0,0": {"series": [0, 0]}}
    return fixture


def fake_load(settings: ValidateSection, seconds: float) -> Slices:
    """What the GPUs did meanwhile: GPU 1's GEMM rate falls to 0.6 of its start as it heats."""
    time.sleep(min(seconds, 0.3))  # the sampler reads NVML meanwhile
    steady = [740.0] * SLICES
    falling = [740.0 - 296.0 * i / (SLICES - 1) for i in range(SLICES)]
    copy_rate = [2900.0] * SLICES
    return {
        "GPU 0": {"gemm": steady, "copy": copy_rate},
        "GPU 1": {"gemm": falling, "copy": copy_rate},
    }


@pytest.fixture
def heating(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", load(heating_node()))


def test_a_gpu_that_heats_up_fails_on_rate_clocks_temperature_and_ecc(heating: None) -> None:
    settings = ValidateSection(sustained_s=0.3, sample_interval_s=0.02)
    run = run_sustained(settings, fake_load)
    assert set(run.samples) == {0, 1} and len(run.samples[1]) >= 3
    assert run.thresholds[1]["slowdown_c"] == 89.0
    assert run.ecc_before[1] == {"uncorrected": 0, "corrected": 0}
    assert run.ecc_after[1] == {"uncorrected": 2, "corrected": 0}
    rows = {c.name: c for c in sustained_checks(run, settings)}

    gemm = rows["Sustained GEMM"]
    rates = run.slices["GPU 1"]["gemm"]
    expected = drift(rates)
    assert expected == pytest.approx(statistics.median(rates[-4:]) / statistics.median(rates[:4]))
    assert gemm.status is Status.FAIL  # below validation.drift.fail (0.8)
    assert gemm.value == f"GPU 1: {expected:.2f} of its first-third rate"
    assert rows["Sustained memory copy"].status is Status.PASS

    clocks = rows["Clocks under load"]
    temps = [s["temperature_c"] for s in run.samples[1]]
    hottest = max(t for t in temps if t is not None)
    assert None not in temps
    assert clocks.status is Status.FAIL
    assert clocks.value.startswith("GPU 1: SM clock 1980 -> ")
    assert clocks.value.endswith("MHz, HW thermal slowdown")
    assert "GPU 0" not in clocks.value  # SW power cap at full load is no fault
    heat = rows["Temperature under load"]
    if hottest >= 89:
        assert heat.status is Status.FAIL
        assert heat.value == f"GPU 1: {hottest:.0f} C >= slowdown 89 C"
    else:  # the sampler stopped before GPU 1 got that hot: 87 C is its max operating temperature
        assert heat.status is Status.WARN
    assert rows["ECC during load"].status is Status.FAIL
    assert rows["ECC during load"].value == "GPU 1: +2 uncorrected"
    assert rows["Power under load"].value == "peak 650-690 W of 700 W"


def test_steady_gpus_pass_every_row(monkeypatch: pytest.MonkeyPatch) -> None:
    fixture = heating_node()
    fixture["devices"] = [fixture["devices"][0]] * 2
    monkeypatch.setitem(sys.modules, "pynvml", load(fixture))

    def steady(settings: ValidateSection, seconds: float) -> Slices:
        time.sleep(0.1)
        flat = {"gemm": [740.0] * SLICES, "copy": [2900.0] * SLICES}
        return {"GPU 0": flat, "GPU 1": flat}

    settings = ValidateSection(sustained_s=0.1, sample_interval_s=0.02)
    rows = sustained_checks(run_sustained(settings, steady), settings)
    assert {r.status for r in rows} == {Status.PASS}, rows
    assert rows[0].value.startswith("2 device(s) held 1.00+ of their first-third rate")
