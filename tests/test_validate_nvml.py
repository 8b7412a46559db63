"""GPU checks against recorded NVML answers of real nodes (tests/data/nvml, served by the fake
pynvml of tests/support/fakes): the verdict and the fix text of every check, for every fixture."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pynvml
import pytest

from tests.support.fakes.fake_pynvml import load
from torchscale.hardware import environment
from torchscale.hardware.nvml import Nvml, Unsupported, open_nvml, read_telemetry, supported
from torchscale.hardware.topology import format_matrix
from torchscale.validate.result import CheckResult
from torchscale.validate.runner import gpu_health
from torchscale.validate.software import check_cuda_driver

DATA = Path(__file__).parent / "data" / "nvml"
FIXTURES = ["h100_healthy", "h100_thermal", "v100_ecc", "a100_nvlink_down", "not_supported"]


def fixture(name: str) -> Dict[str, Any]:
    return json.loads((DATA / f"{name}.json").read_text())


@pytest.fixture
def use_nvml(monkeypatch: pytest.MonkeyPatch):
    """Install the fake pynvml for one fixture; returns the module (its ``replay`` state)."""

    def install(name: str):
        module = load(fixture(name))
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module

    return install


def by_name(checks: List[CheckResult]) -> Dict[str, CheckResult]:
    return {c.name: c for c in checks}


def device_values(name: str, function: str, key: str = "") -> List[Any]:
    values = [d[function] for d in fixture(name)["devices"]]
    return [v[key] for v in values] if key else values


# --- the wrapper itself -----------------------------------------------------------------------


def test_fake_raises_the_real_pynvml_exception_classes(use_nvml):
    module = use_nvml("not_supported")
    module.nvmlInit()
    handle = module.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported) as caught:
        module.nvmlDeviceGetPersistenceMode(handle)
    assert caught.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
    module.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        module.nvmlDeviceGetCount()


def test_call_turns_every_nvml_error_into_unsupported(use_nvml):
    use_nvml("v100_ecc")
    with open_nvml() as nvml:
        assert isinstance(nvml, Nvml)
        handles = nvml.handles()
        assert isinstance(handles, list)
        handle = handles[0]
        not_supported = nvml.call("nvmlDeviceGetRemappedRows", handle)  # Volta: no row remapping
        not_found = nvml.call("nvmlDeviceGetCurrentClocksEventReasons", handle)  # driver 470
        bad_link = nvml.call("nvmlDeviceGetNvLinkState", handle, 30)
    assert not_supported == Unsupported("Not Supported", "NVMLError_NotSupported")
    assert not_found.error == "NVMLError_FunctionNotFound"
    assert bad_link.error == "NVMLError_InvalidArgument"


def test_clocks_event_reasons_fall_back_to_the_throttle_name_on_old_drivers(use_nvml):
    module = use_nvml("v100_ecc")
    with open_nvml() as nvml:
        assert isinstance(nvml, Nvml)
        handles = nvml.handles()
        assert isinstance(handles, list)
        reasons = nvml.clocks_event_reasons(handles[0])
    assert reasons == device_values("v100_ecc", "nvmlDeviceGetCurrentClocksThrottleReasons")[0]
    assert module.replay.calls[-2:] == [
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    ]


def test_nvml_is_shut_down_after_the_checks(use_nvml):
    module = use_nvml("h100_healthy")
    gpu_health(torch_count=8)
    assert module.replay.initialized == 0


def test_driver_init_failure_means_no_gpu_not_a_crash(monkeypatch):
    module = load({"init": {"error": "NVML_ERROR_DRIVER_NOT_LOADED"}})
    monkeypatch.setitem(sys.modules, "pynvml", module)
    health = gpu_health(torch_count=0)
    assert health.gpus == 0
    assert health.driver == Unsupported("Driver Not Loaded", "NVMLError_DriverNotLoaded")
    checks = by_name(health.checks)
    assert checks["GPUs"].status.value == "WARN"
    assert checks["GPUs"].value == "none found — CPU (gloo) benchmarking only"
    assert {c.status.value for n, c in checks.items() if n != "GPUs"} == {"SKIP"}
    assert environment.driver_version() is None


def test_environment_driver_version_uses_the_wrapper(use_nvml):
    use_nvml("a100_nvlink_down")
    assert (
        environment.driver_version()
        == fixture("a100_nvlink_down")["system"]["nvmlSystemGetDriverVersion"]
    )


def test_telemetry_sample_of_a_throttled_gpu(use_nvml):
    use_nvml("h100_thermal")
    gpu = fixture("h100_thermal")["devices"][5]
    with open_nvml() as nvml:
        assert isinstance(nvml, Nvml)
        handles = nvml.handles()
        assert isinstance(handles, list)
        sample = read_telemetry(nvml, handles[5])
    assert sample == {
        "gpu_util_pct": float(gpu["nvmlDeviceGetUtilizationRates"]["gpu"]),
        "mem_util_pct": float(gpu["nvmlDeviceGetUtilizationRates"]["memory"]),
        "power_w": gpu["nvmlDeviceGetPowerUsage"] / 1000,
        "power_limit_w": gpu["nvmlDeviceGetEnforcedPowerLimit"] / 1000,
        "mem_used_bytes": float(gpu["nvmlDeviceGetMemoryInfo"]["used"]),
        "mem_total_bytes": float(gpu["nvmlDeviceGetMemoryInfo"]["total"]),
        "sm_clock_mhz": float(gpu["nvmlDeviceGetClockInfo"]["1"]),
        "mem_clock_mhz": float(gpu["nvmlDeviceGetClockInfo"]["2"]),
        "temperature_c": float(gpu["nvmlDeviceGetTemperature"]["0"]),
        "clocks_event_reasons": float(gpu["nvmlDeviceGetCurrentClocksEventReasons"]),
    }


def test_telemetry_of_a_gpu_that_reports_nothing_is_all_none(use_nvml):
    use_nvml("not_supported")
    with open_nvml() as nvml:
        assert isinstance(nvml, Nvml)
        handles = nvml.handles()
        assert isinstance(handles, list)
        sample = read_telemetry(nvml, handles[1])
    assert sample and set(sample.values()) == {None}


# --- topology ---------------------------------------------------------------------------------

# `nvidia-smi topo -m` of a DGX-1V (hybrid cube-mesh), as published: the reference output.
DGX1_TOPO = """
      GPU0  GPU1  GPU2  GPU3  GPU4  GPU5  GPU6  GPU7
GPU0  X     NV1   NV1   NV2   NV2   SYS   SYS   SYS
GPU1  NV1   X     NV2   NV1   SYS   NV2   SYS   SYS
GPU2  NV1   NV2   X     NV2   SYS   SYS   NV1   SYS
GPU3  NV2   NV1   NV2   X     SYS   SYS   SYS   NV1
GPU4  NV2   SYS   SYS   SYS   X     NV1   NV1   NV2
GPU5  SYS   NV2   SYS   SYS   NV1   X     NV2   NV1
GPU6  SYS   SYS   NV1   SYS   NV1   NV2   X     NV2
GPU7  SYS   SYS   SYS   NV1   NV2   NV1   NV2   X
"""


def matrix_of(name: str) -> List[List[str]]:
    matrix = by_name(gpu_health(8).checks)["GPU topology"].details["matrix"]
    assert isinstance(matrix, list)
    return matrix


def test_topology_matrix_of_direct_nvlinks_matches_nvidia_smi(use_nvml):
    use_nvml("v100_ecc")
    assert format_matrix(matrix_of("v100_ecc")) == DGX1_TOPO.strip("\n")


def links_up(name: str) -> List[int]:
    """Active NVLinks per GPU, counted from the recorded nvmlDeviceGetNvLinkState answers."""
    states = device_values(name, "nvmlDeviceGetNvLinkState")
    return [sum(1 for link, state in s.items() if link.isdigit() and state == 1) for s in states]


def test_topology_through_nvswitches_counts_active_links(use_nvml):
    use_nvml("h100_healthy")
    matrix = matrix_of("h100_healthy")
    assert links_up("h100_healthy") == [18] * 8
    assert {matrix[i][j] for i in range(8) for j in range(8) if i != j} == {"NV18"}
    use_nvml("a100_nvlink_down")
    matrix = matrix_of("a100_nvlink_down")
    up = links_up("a100_nvlink_down")
    assert up[3] == 11 and set(up[:3] + up[4:]) == {12}
    for i in range(8):
        for j in range(8):
            if i != j:
                assert matrix[i][j] == f"NV{min(up[i], up[j])}"


# --- verdict and fix of every check, for every fixture -----------------------------------------

THERMAL_FIX = "nvidia-smi -q -d PERFORMANCE,TEMPERATURE"


Row = Tuple[str, Optional[str], Optional[str]]


def expected(name: str) -> Dict[str, Row]:
    """check name -> (status, value, fix fragment) for one fixture; values computed from it."""
    if name == "not_supported":
        manual = {
            "Persistence mode": "nvidia-smi -q | grep -i persistence",
            "ECC": "nvidia-smi -q -d ECC",
            "Retired pages / remapped rows": "nvidia-smi -q -d ROW_REMAPPER,PAGE_RETIREMENT",
            "Clock throttling": "nvidia-smi -q -d PERFORMANCE",
            "Temperature": "nvidia-smi -q -d TEMPERATURE",
            "Power": "nvidia-smi -q -d POWER",
            "PCIe link": "nvidia-smi -q -d PCIE",
            "NVLink": "nvidia-smi nvlink -s",
            "GPU topology": "nvidia-smi topo -m",
            "MIG mode": "nvidia-smi -q | grep -i -A2 'MIG Mode'",
        }
        table: Dict[str, Row] = {check: ("SKIP", None, fix) for check, fix in manual.items()}
        table["GPUs"] = ("PASS", "2 x GPU (name not reported by NVML)", None)
        return table
    devices = fixture(name)["devices"]
    gpu_name = devices[0]["nvmlDeviceGetName"]
    total = devices[0]["nvmlDeviceGetMemoryInfo"]["total"] / 2**30
    temps = device_values(name, "nvmlDeviceGetTemperature", "0")
    slowdown = devices[0]["nvmlDeviceGetTemperatureThreshold"]["1"]
    watts = [w / 1000 for w in device_values(name, "nvmlDeviceGetPowerUsage")]
    limit = devices[0]["nvmlDeviceGetEnforcedPowerLimit"] // 1000
    gen = devices[0]["nvmlDeviceGetCurrPcieLinkGeneration"]
    width = devices[0]["nvmlDeviceGetCurrPcieLinkWidth"]
    links = max(links_up(name))
    table = {
        "GPUs": ("PASS", f"8 x {gpu_name} ({total:.1f} GiB)", None),
        "Persistence mode": ("PASS", "on for all 8 GPUs", None),
        "ECC": ("PASS", "enabled, 0 volatile uncorrectable errors on 8 GPUs", None),
        "Retired pages / remapped rows": ("PASS", "none pending on 8 GPUs", None),
        "Clock throttling": ("PASS", "no throttling on 8 GPUs", None),
        "Temperature": (
            "PASS",
            f"{min(temps)}-{max(temps)} C (slowdown at {slowdown} C)",
            None,
        ),
        "Power": ("PASS", f"{min(watts):.0f}-{max(watts):.0f} W drawn, limit {limit} W", None),
        "PCIe link": ("PASS", f"gen {gen} x{width}", None),
        "NVLink": ("PASS", f"{links}/{links} links up on all 8 GPUs", None),
        "GPU topology": ("PASS", f"pairs: NV{links} x28", None),
        "MIG mode": ("PASS", "off on all 8 GPUs", None),
    }
    if name == "h100_thermal":
        hot = next(i for i, d in enumerate(devices) if d["nvmlDeviceGetCurrentClocksEventReasons"])
        table["Clock throttling"] = (
            "FAIL",
            f"GPU {hot}: HW slowdown, SW thermal slowdown, HW thermal slowdown",
            THERMAL_FIX,
        )
        table["Temperature"] = (
            "FAIL",
            f"GPU {hot}: {temps[hot]} C >= slowdown {slowdown} C",
            THERMAL_FIX,
        )
    if name == "v100_ecc":
        bad = 2
        errors = devices[bad]["nvmlDeviceGetTotalEccErrors"]["1,0"]
        retired = len(devices[bad]["nvmlDeviceGetRetiredPages"]["1"])
        table["ECC"] = (
            "FAIL",
            f"volatile uncorrectable ECC errors (GPU {bad}: {errors})",
            "Drain the node and inspect with `nvidia-smi -q -d ECC`",
        )
        table["Retired pages / remapped rows"] = (
            "FAIL",
            f"GPU {bad}: page retirement pending ({retired} retired)",
            "reset the GPU (`nvidia-smi -r`) or reboot",
        )
        table["GPU topology"] = ("PASS", "pairs: NV1 x8, NV2 x8, SYS x12", None)
        table["MIG mode"] = ("SKIP", None, "MIG Mode")  # Volta has no MIG
    if name == "a100_nvlink_down":
        table["NVLink"] = (
            "FAIL",
            "GPU 3: 11/12 links up (link 7 down)",
            "`systemctl status nvidia-fabricmanager`",
        )
        table["GPU topology"] = ("PASS", "pairs: NV12 x21, NV11 x7", None)
    return table


@pytest.mark.parametrize("name", FIXTURES)
def test_verdict_and_fix_of_every_gpu_check(use_nvml, name):
    use_nvml(name)
    checks = by_name(gpu_health(torch_count=len(fixture(name)["devices"])).checks)
    want = expected(name)
    assert set(checks) == set(want)
    for check, (status, value, fix) in want.items():
        got = checks[check]
        assert got.status.value == status, (check, got)
        if value is not None:
            assert got.value == value, check
        if status == "PASS":
            assert got.fix is None
        else:
            assert fix is not None and got.fix is not None
            assert fix in got.fix, (check, got.fix)


def test_nvlink_fix_names_the_commands(use_nvml):
    use_nvml("a100_nvlink_down")
    nvlink = by_name(gpu_health(8).checks)["NVLink"]
    assert nvlink.fix is not None and isinstance(nvlink.details["per_gpu"], dict)
    assert "`nvidia-smi nvlink -s`" in nvlink.fix and "reseat" in nvlink.fix
    assert nvlink.details["per_gpu"]["3"] == {"up": 11, "links": 12, "down": [7]}


@pytest.mark.parametrize(
    ("name", "torch_cuda", "status", "fix"),
    [
        ("h100_healthy", "12.4", "PASS", None),
        ("h100_healthy", "12.8", "WARN", "minor-version compatibility"),
        ("a100_nvlink_down", "12.4", "WARN", "upgrade the driver"),
        ("v100_ecc", "12.4", "FAIL", "wheel built for CUDA 11.x"),
        ("not_supported", "12.4", "SKIP", "`nvidia-smi` header"),
    ],
)
def test_cuda_version_against_the_drivers(use_nvml, name, torch_cuda, status, fix):
    use_nvml(name)
    health = gpu_health(8)
    check = check_cuda_driver(torch_cuda, health.cuda_driver, health.gpus)
    assert check.status.value == status
    assert check.fix is None if fix is None else (check.fix is not None and fix in check.fix)
    if supported(health.cuda_driver):
        version = fixture(name)["system"]["nvmlSystemGetCudaDriverVersion"]
        assert f"up to CUDA {version // 1000}.{version % 1000 // 10}" in check.value


def _set(device: int, function: str, answer: Any):
    def mutate(data: Dict[str, Any]) -> None:
        data["devices"][device][function] = answer

    return mutate


@pytest.mark.parametrize(
    ("mutate", "check", "status", "value", "fix"),
    [
        (
            _set(6, "nvmlDeviceGetName", "NVIDIA H100 PCIe"),
            "GPUs",
            "WARN",
            "7 x NVIDIA H100 80GB HBM3 (79.6 GiB), 1 x NVIDIA H100 PCIe (79.6 GiB)",
            "pace of the slowest",
        ),
        (
            _set(4, "nvmlDeviceGetName", {"error": "NVML_ERROR_GPU_IS_LOST"}),
            "GPUs",
            "FAIL",
            "GPU 4 fell off the bus; 7 x NVIDIA H100 80GB HBM3 (79.6 GiB)",
            "Xid 79",
        ),
        (
            _set(1, "nvmlDeviceGetPersistenceMode", 0),
            "Persistence mode",
            "WARN",
            "off on GPU 1",
            "sudo nvidia-smi -pm 1",
        ),
        (
            _set(0, "nvmlDeviceGetEccMode", [0, 0]),
            "ECC",
            "WARN",
            "disabled on GPU 0",
            "sudo nvidia-smi -e 1",
        ),
        (
            _set(7, "nvmlDeviceGetRemappedRows", [0, 1, 0, 1]),
            "Retired pages / remapped rows",
            "FAIL",
            "GPU 7: row remapping failed",
            "RMA",
        ),
        (
            _set(2, "nvmlDeviceGetEnforcedPowerLimit", 500000),
            "Power",
            "WARN",
            "GPU 2: limit 500 W < default 700 W",
            "sudo nvidia-smi -pl",
        ),
        (
            _set(3, "nvmlDeviceGetCurrPcieLinkWidth", 8),
            "PCIe link",
            "WARN",
            "GPU 3: x8 of x16",
            "reseat the GPU",
        ),
        (
            _set(3, "nvmlDeviceGetCurrPcieLinkGeneration", 1),
            "PCIe link",
            "PASS",
            "gen 5 x16, gen 1 x16 (1 idle GPUs in power-saving link speed)",
            None,
        ),
        (
            _set(0, "nvmlDeviceGetCurrentClocksEventReasons", 0x80),
            "Clock throttling",
            "FAIL",
            "GPU 0: HW power brake slowdown",
            "check PSUs and power delivery",
        ),
        (
            _set(0, "nvmlDeviceGetCurrentClocksEventReasons", 0x04),
            "Clock throttling",
            "WARN",
            "GPU 0: SW power cap",
            "nvidia-smi -q -d POWER",
        ),
        (
            _set(5, "nvmlDeviceGetTemperature", {"0": 87}),
            "Temperature",
            "WARN",
            "GPU 5: 87 C >= max operating 87 C",
            THERMAL_FIX,
        ),
    ],
)
def test_faults_injected_into_the_healthy_h100_recording(
    monkeypatch, mutate, check, status, value, fix
):
    data = fixture("h100_healthy")
    mutate(data)
    monkeypatch.setitem(sys.modules, "pynvml", load(data))
    got = by_name(gpu_health(8).checks)[check]
    assert (got.status.value, got.value) == (status, value)
    assert got.fix is None if fix is None else (got.fix is not None and fix in got.fix)
