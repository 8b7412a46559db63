"""Level 3: GEMM and memory copy under sustained load for a set time, while a sampler thread
reads every GPU's clocks, temperature, power and clocks-event reasons (NVML, through
:func:`~torchscale.hardware.nvml.read_telemetry`), and ECC counters are read before and after.

The run is cut into slices (``SLICES``); each slice queues GEMMs and copies on every device at
once and times each device with its own CUDA events, so all GPUs heat up together as in
training. On CPU the slots' share of the cores runs the same loop (no NVML: clocks from
``psutil.cpu_freq`` where the kernel exposes them). ``sustained_judging`` turns the outcome
into verdicts.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from torchscale.config.validate_section import ValidateSection
from torchscale.hardware.nvml import Nvml, open_nvml, read_telemetry, supported

SLICES = 12
"""Slices of a sustained run: the first and last thirds (4 each) are compared."""
SUSTAINED_PROBES = ("gemm", "copy")
ECC_COUNTERS = {"uncorrected": 1, "corrected": 0}  # NVML_MEMORY_ERROR_TYPE_*, volatile counters

Slices = Dict[str, Dict[str, List[float]]]
"""device label -> probe (``gemm``: TFLOP/s, ``copy``: GB/s) -> rate in each slice."""
Load = Callable[[ValidateSection, float], Slices]


class LoadFailed(RuntimeError):
    """A device's load thread raised (out of memory, a CUDA error): which device, and why."""

    def __init__(self, device: str, cause: BaseException) -> None:
        super().__init__(f"{device}: {cause}")
        self.device, self.cause = device, cause


@dataclass
class SustainedRun:
    """What a level-3 run measured: per-slice rates, NVML samples, ECC counters."""

    slices: Slices
    samples: Dict[int, List[Dict[str, Optional[float]]]] = field(default_factory=dict)
    thresholds: Dict[int, Dict[str, Optional[float]]] = field(default_factory=dict)
    ecc_before: Dict[int, Dict[str, Optional[int]]] = field(default_factory=dict)
    ecc_after: Dict[int, Dict[str, Optional[int]]] = field(default_factory=dict)
    duration_s: float = 0.0
    cpu_mhz: List[float] = field(default_factory=list)


def _ecc(nvml: Nvml, handle: Any) -> Dict[str, Optional[int]]:
    counts: Dict[str, Optional[int]] = {}
    for name, kind in ECC_COUNTERS.items():
        answer = nvml.call(
            "nvmlDeviceGetTotalEccErrors",
            handle,
            nvml.const(f"NVML_MEMORY_ERROR_TYPE_{name.upper()}", kind),
            nvml.const("NVML_VOLATILE_ECC", 0),
        )
        counts[name] = int(answer) if supported(answer) else None
    return counts


def _limits(nvml: Nvml, handle: Any) -> Dict[str, Optional[float]]:
    def value(answer: Any) -> Optional[float]:
        return float(answer) if supported(answer) else None

    return {
        "slowdown_c": value(nvml.call("nvmlDeviceGetTemperatureThreshold", handle, 1)),
        "max_operating_c": value(nvml.call("nvmlDeviceGetTemperatureThreshold", handle, 3)),
        "max_sm_clock_mhz": value(
            nvml.call("nvmlDeviceGetMaxClockInfo", handle, nvml.const("NVML_CLOCK_SM", 1))
        ),
    }


def run_sustained(settings: ValidateSection, load: Load) -> SustainedRun:
    """``load(settings, seconds)`` with NVML sampled every ``sample_interval_s`` meanwhile."""
    import psutil

    stop = threading.Event()
    run = SustainedRun(slices={})
    with open_nvml() as nvml:
        handles = nvml.handles() if supported(nvml) else []
        handles = [h for h in handles if supported(h)] if supported(handles) else []
        if supported(nvml):
            for index, handle in enumerate(handles):
                run.ecc_before[index] = _ecc(nvml, handle)
                run.thresholds[index] = _limits(nvml, handle)
                run.samples[index] = []

        def sample() -> None:
            while not stop.wait(settings.sample_interval_s):
                if supported(nvml):
                    for index, handle in enumerate(handles):
                        run.samples[index].append(read_telemetry(nvml, handle))
                frequency = psutil.cpu_freq()
                if frequency is not None and frequency.current:
                    run.cpu_mhz.append(float(frequency.current))

        sampler = threading.Thread(target=sample, name="validate-sampler", daemon=True)
        started = time.monotonic()
        sampler.start()
        try:
            run.slices = load(settings, settings.sustained_s)
        finally:
            stop.set()
            sampler.join()
        run.duration_s = time.monotonic() - started
        if supported(nvml):
            for index, handle in enumerate(handles):
                run.ecc_after[index] = _ecc(nvml, handle)
    return run


def _device_loop(device: Any, settings: ValidateSection, seconds: float) -> Dict[str, List[float]]:
    """One device's slices: GEMM for half a slice, then copy for the other half, each timed on
    the wall clock between two synchronisations of this device only."""
    import torch

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    n = settings.gemm_size if cuda else settings.cpu_gemm_size
    dtype = torch.bfloat16 if cuda else torch.float32
    elements = (settings.copy_mib if cuda else settings.cpu_copy_mib) * (1 << 20) // 4
    a = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty_like(a)
    src = torch.ones(elements, device=device)
    dst = torch.empty_like(src)
    steps = {"gemm": lambda: torch.matmul(a, a, out=out), "copy": lambda: dst.copy_(src)}
    work = {"gemm": 2.0 * n**3 * 1e-12, "copy": 2.0 * elements * 4 * 1e-9}
    rates: Dict[str, List[float]] = {probe: [] for probe in SUSTAINED_PROBES}
    for _ in range(SLICES):
        for probe in SUSTAINED_PROBES:
            start = time.perf_counter()
            end, calls = start + seconds / SLICES / 2, 0
            while calls == 0 or time.perf_counter() < end:
                steps[probe]()
                calls += 1
                if cuda and calls % 4 == 0:  # a short queue: the wall clock follows the GPU
                    torch.cuda.synchronize(device)
            if cuda:
                torch.cuda.synchronize(device)
            rates[probe].append(work[probe] * calls / max(time.perf_counter() - start, 1e-9))
    return rates


def torch_load(settings: ValidateSection, seconds: float) -> Slices:
    """GEMM (bf16 on GPU, fp32 on CPU) and copy on every GPU at once, one thread per GPU (the
    kernels release the GIL), or on the CPU with all its cores, for ``seconds``."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.device_count() > 0):
        return {"CPU": _device_loop(torch.device("cpu"), settings, seconds)}
    slices: Slices = {}
    failures: List[BaseException] = []  # re-raised in the caller's thread below

    def work(index: int) -> None:
        try:
            slices[f"GPU {index}"] = _device_loop(torch.device("cuda", index), settings, seconds)
        except (RuntimeError, MemoryError) as exc:  # the device's own failure: named
            failures.append(LoadFailed(f"GPU {index}", exc))
        except BaseException as exc:  # a bug, not the device: raised as it is
            failures.append(exc)

    threads = [
        threading.Thread(target=work, args=(i,), name=f"validate-load-{i}", daemon=True)
        for i in range(torch.cuda.device_count())
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        first = failures[0]
        raise first from (first.cause if isinstance(first, LoadFailed) else None)
    return {label: slices[label] for label in sorted(slices, key=lambda s: int(s.split()[1]))}
