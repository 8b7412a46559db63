"""NVML samples of this rank's GPU during the measured window (utilisation, power, clocks).

A background thread reads NVML every ``interval_s``: NVML queries are driver calls that do not
touch the CUDA stream, so sampling does not perturb the timed steps. Throttle reasons seen during
the window are kept, since a thermally throttled GPU is the usual straggler.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Optional

from torchscale.hardware.nvml import (
    Unsupported,
    decode_clocks_event_reasons,
    open_nvml,
    read_telemetry,
)

# Reasons that mean "not running flat out on purpose" rather than a problem.
BENIGN_REASONS = {"gpu_idle", "applications_clocks_setting"}
TIMELINE_POINTS = 120
"""At most this many samples are kept in the record (evenly thinned) for the report's timeline."""
TIMELINE_FIELDS = ("t_s", "gpu_util_pct", "sm_clock_mhz", "power_w", "temperature_c",
                   "clocks_event_reasons")  # fmt: skip
STATIC_QUERIES = {
    "sm_clock_mhz_limit": ("nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_SM", 1),
    "pcie_gen": ("nvmlDeviceGetCurrPcieLinkGeneration", None, None),
    "pcie_gen_max": ("nvmlDeviceGetMaxPcieLinkGeneration", None, None),
    "pcie_width": ("nvmlDeviceGetCurrPcieLinkWidth", None, None),
    "pcie_width_max": ("nvmlDeviceGetMaxPcieLinkWidth", None, None),
}
"""Read once per window: the GPU's clock limit and its PCIe link (current and maximum)."""


def _values(samples: List[Dict[str, Optional[float]]], key: str) -> List[float]:
    return [value for s in samples if (value := s.get(key)) is not None]


def summarize(samples: List[Dict[str, Optional[float]]]) -> Optional[Dict[str, Any]]:
    """GpuTelemetry fields from raw ``read_telemetry`` samples (None without samples)."""
    if not samples:
        return None

    def mean(key: str) -> Optional[float]:
        values = _values(samples, key)
        return sum(values) / len(values) if values else None

    def peak(key: str) -> Optional[float]:
        return max(_values(samples, key), default=None)

    reasons = set()
    counts: Dict[str, int] = {}
    masks = _values(samples, "clocks_event_reasons")
    for mask in masks:
        decoded = set(decode_clocks_event_reasons(int(mask))) - BENIGN_REASONS
        reasons.update(decoded)
        for name in decoded:
            counts[name] = counts.get(name, 0) + 1
    memory = peak("mem_used_bytes")
    clocks = _values(samples, "sm_clock_mhz")
    step = max(1, -(-len(samples) // TIMELINE_POINTS))
    timeline = [[s.get(key) for key in TIMELINE_FIELDS] for s in samples[::step]]
    return {
        "samples": len(samples),
        "util_pct_mean": mean("gpu_util_pct"),
        "util_pct_max": peak("gpu_util_pct"),
        "power_w_mean": mean("power_w"),
        "power_w_max": peak("power_w"),
        "memory_used_bytes_max": int(memory) if memory is not None else None,
        "memory_total_bytes": int(total) if (total := peak("mem_total_bytes")) else None,
        "sm_clock_mhz_mean": mean("sm_clock_mhz"),
        "temperature_c_max": peak("temperature_c"),
        "throttle_reasons": sorted(reasons - BENIGN_REASONS),
        "sm_clock_mhz_min": min(clocks) if clocks else None,
        "mem_clock_mhz_mean": mean("mem_clock_mhz"),
        "power_limit_w": peak("power_limit_w"),
        "temperature_c_mean": mean("temperature_c"),
        "throttle_share": {name: n / len(masks) for name, n in sorted(counts.items())},
        "timeline": timeline,
    }


def read_static(nvml: Any, handle: Any) -> Dict[str, Optional[int]]:
    """The GPU's SM clock limit and PCIe link generation and width, current and maximum."""
    from torchscale.hardware.nvml import supported

    static: Dict[str, Optional[int]] = {}
    for field, (function, constant, default) in STATIC_QUERIES.items():
        args = (nvml.const(constant, default),) if constant else ()
        answer = nvml.call(function, handle, *args)
        static[field] = int(answer) if supported(answer) else None
    return static


class GpuSampler:
    """``with GpuSampler(index):`` samples NVML device ``index`` until the block ends."""

    def __init__(self, nvml_index: int, interval_s: float = 0.1) -> None:
        self.nvml_index = nvml_index
        self.interval_s = interval_s
        self.samples: List[Dict[str, Optional[float]]] = []
        self.static: Dict[str, Optional[int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torchscale-nvml", daemon=True)

    def _run(self) -> None:
        with open_nvml() as nvml:
            if isinstance(nvml, Unsupported):
                return
            handle = nvml.call("nvmlDeviceGetHandleByIndex", self.nvml_index)
            if isinstance(handle, Unsupported):
                return
            self.static = read_static(nvml, handle)
            start = time.monotonic()
            while True:
                sample = read_telemetry(nvml, handle)
                sample["t_s"] = round(time.monotonic() - start, 3)
                self.samples.append(sample)
                if self._stop.wait(self.interval_s):
                    return

    def __enter__(self) -> GpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def summary(self) -> Optional[Dict[str, Any]]:
        summary = summarize(self.samples)
        if summary is not None:
            summary.update(self.static, nvml_index=self.nvml_index)
        return summary


def nvml_index(device_index: int) -> int:
    """The NVML index of CUDA device ``device_index`` (CUDA_VISIBLE_DEVICES can renumber)."""
    import torch

    mapper = getattr(torch.cuda, "_get_nvml_device_index", None)
    try:
        return int(mapper(device_index)) if mapper else device_index
    except Exception:  # an unusual CUDA_VISIBLE_DEVICES form (UUIDs, MIG): assume identity
        return device_index
