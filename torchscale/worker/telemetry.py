"""NVML samples of this rank's GPU during the measured window (utilisation, power, clocks).

A background thread reads NVML every ``interval_s``: NVML queries are driver calls that do not
touch the CUDA stream, so sampling does not perturb the timed steps. Throttle reasons seen during
the window are kept, since a thermally throttled GPU is the usual straggler.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional

from torchscale.hardware.nvml import (
    Unsupported,
    decode_clocks_event_reasons,
    open_nvml,
    read_telemetry,
)

# Reasons that mean "not running flat out on purpose" rather than a problem.
BENIGN_REASONS = {"gpu_idle", "applications_clocks_setting"}


def _values(samples: List[Dict[str, Optional[float]]], key: str) -> List[float]:
    return [s[key] for s in samples if s.get(key) is not None]


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
    for mask in _values(samples, "clocks_event_reasons"):
        reasons.update(decode_clocks_event_reasons(int(mask)))
    memory = peak("mem_used_bytes")
    return {
        "samples": len(samples),
        "util_pct_mean": mean("gpu_util_pct"),
        "util_pct_max": peak("gpu_util_pct"),
        "power_w_mean": mean("power_w"),
        "power_w_max": peak("power_w"),
        "memory_used_bytes_max": int(memory) if memory is not None else None,
        "sm_clock_mhz_mean": mean("sm_clock_mhz"),
        "temperature_c_max": peak("temperature_c"),
        "throttle_reasons": sorted(reasons - BENIGN_REASONS),
    }


class GpuSampler:
    """``with GpuSampler(index):`` samples NVML device ``index`` until the block ends."""

    def __init__(self, nvml_index: int, interval_s: float = 0.1) -> None:
        self.nvml_index = nvml_index
        self.interval_s = interval_s
        self.samples: List[Dict[str, Optional[float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torchscale-nvml", daemon=True)

    def _run(self) -> None:
        with open_nvml() as nvml:
            if isinstance(nvml, Unsupported):
                return
            handle = nvml.call("nvmlDeviceGetHandleByIndex", self.nvml_index)
            if isinstance(handle, Unsupported):
                return
            while True:
                self.samples.append(read_telemetry(nvml, handle))
                if self._stop.wait(self.interval_s):
                    return

    def __enter__(self) -> GpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def summary(self) -> Optional[Dict[str, Any]]:
        return summarize(self.samples)


def nvml_index(device_index: int) -> int:
    """The NVML index of CUDA device ``device_index`` (CUDA_VISIBLE_DEVICES can renumber)."""
    import torch

    mapper = getattr(torch.cuda, "_get_nvml_device_index", None)
    try:
        return int(mapper(device_index)) if mapper else device_index
    except Exception:  # an unusual CUDA_VISIBLE_DEVICES form (UUIDs, MIG): assume identity
        return device_index
