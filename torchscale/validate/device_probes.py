"""Level 2's per-device probes, measured with torch in this process (timing: probe_timing).

GPU, each device in turn: dense GEMM (bf16, fp16, tf32: ``n x n`` by ``n x n``, ``2 n^3`` FLOPs,
as cuBLAS runs ``torch.matmul``), device memory copy (``dst.copy_(src)``: each byte read once and
written once, counted twice as STREAM's copy does), pinned host-to-device and device-to-host
copies (nvbandwidth's ``*_memcpy_ce``), kernel-launch cost (back-to-back one-element kernels: the
host's launch time, per launch) and, for every ordered GPU pair, a device-to-device copy (P2P
over NVLink or PCIe; through the host when the pair has no peer access).

CPU (no GPU): every CPU slot (``TORCHSCALE_CPU_SLOTS``, one per core by default, at most
``max_cpu_devices``) is a device, measured in turn with its share of the cores as intra-op
threads: fp32 GEMM, memory copy and per-op dispatch cost. With one thread per slot (the
default) slot i runs on the i-th allowed core, so the slots are the cores.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional

import torch

from torchscale.config.validate_section import ValidateSection
from torchscale.hardware.environment import cpu_slots, threads_per_cpu_slot
from torchscale.hardware.expected_figures import EACH_DEVICE, EACH_GPU, PROBES, probes_measured_on
from torchscale.validate.probe_timing import UNLOADED, Figure, ProbeError, best, timed_rates

MIB = 1 << 20
LAUNCHES_PER_CALL = 100  # kernel-launch probe: one timed call launches this many kernels
GEMM_DTYPES = (("gemm_bf16", torch.bfloat16), ("gemm_fp16", torch.float16))
Notify = Callable[[str], None]


@dataclass
class ProbeRun:
    """Every figure measured, and every probe that could not run (probe, device, why)."""

    figures: List[Figure] = field(default_factory=list)
    errors: List[ProbeError] = field(default_factory=list)
    cpu: bool = False  # the devices were CPU slots


Prepare = Callable[[], Callable[[], object]]
"""Allocates a probe's buffers and returns the call to time: run inside the probe's guard, so
that a device without the memory for them is that probe's FAIL row, not a traceback."""


class Measure:
    """One device's probes: times a call with the device's synchronisation."""

    def __init__(
        self, device: torch.device, label: str, name: str, settings: ValidateSection, run: ProbeRun
    ) -> None:
        self.device, self.label, self.name = device, label, name
        self.settings, self.run = settings, run

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def figure(
        self, probe: str, prepare: Prepare, work: float, scale: float, per: bool = False
    ) -> None:
        """Time the call ``prepare()`` returns (``work`` units per call); the figure is
        ``rate x scale``, or with ``per`` the time per unit, ``scale / rate`` (a latency)."""
        # One thread per CPU slot: the probe's work runs on this thread, so its own CPU time
        # gives the core's rate while it ran the probe (its unloaded capability).
        on_cpu: Optional[List[float]] = (
            [] if self.device.type == "cpu" and threads_per_cpu_slot() == 1 else None
        )
        try:
            call = prepare()
            window, repeats = self.settings.window_s, self.settings.repeats
            queued = self.device.type == "cuda"
            rates = timed_rates(call, work, self.sync, window, repeats, queued, on_cpu)
        except (RuntimeError, MemoryError) as exc:  # out of memory, a CUDA error: that row says
            self.run.errors.append(ProbeError.of(probe, self.label, exc))
            return
        samples = [scale / rate if per else rate * scale for rate in rates]
        higher = PROBES[probe].higher_is_better
        details: Dict[str, object] = {}
        if on_cpu:
            unloaded = [scale / rate if per else rate * scale for rate in on_cpu]
            details[UNLOADED] = best(unloaded, higher)
        self.run.figures.append(
            Figure(
                probe, self.label, best(samples, higher), self.name, tuple(samples),
                details=details,
            )
        )  # fmt: skip


def gemm(m: Measure, probe: str, dtype: torch.dtype, n: int) -> None:
    def prepare() -> Callable[[], object]:
        a = torch.randn(n, n, device=m.device, dtype=dtype)
        b = torch.randn(n, n, device=m.device, dtype=dtype)
        out = torch.empty(n, n, device=m.device, dtype=dtype)
        return lambda: torch.matmul(a, b, out=out)

    m.figure(probe, prepare, 2.0 * n**3, 1e-12)


def memory_copy(m: Measure, mib: int) -> None:
    elements = mib * MIB // 4

    def prepare() -> Callable[[], object]:
        src = torch.ones(elements, device=m.device)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)

    m.figure("memory_copy", prepare, 2.0 * elements * 4, 1e-9)


def host_copies(m: Measure, mib: int) -> None:
    """Each direction allocates its own pair (freed when its figure is taken), so that either
    can fail alone; torch's pinned-memory cache hands the second the first one's pages."""
    nbytes = mib * MIB

    def prepare(to_device: bool) -> Callable[[], object]:
        host = torch.ones(nbytes, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(nbytes, dtype=torch.uint8, device=m.device)
        if to_device:
            return lambda: dev.copy_(host, non_blocking=True)
        return lambda: host.copy_(dev, non_blocking=True)

    m.figure("host_to_device", lambda: prepare(True), float(nbytes), 1e-9)
    m.figure("device_to_host", lambda: prepare(False), float(nbytes), 1e-9)


def launch_latency(m: Measure) -> None:
    """Microseconds per launch of a one-element kernel, launched back to back."""

    def prepare() -> Callable[[], object]:
        x = torch.zeros(1, device=m.device)

        def launches() -> None:
            for _ in range(LAUNCHES_PER_CALL):
                x.add_(1)

        return launches

    m.figure("launch_latency", prepare, float(LAUNCHES_PER_CALL), 1e6, per=True)


@contextlib.contextmanager
def _tf32() -> Iterator[None]:
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def p2p_copy(settings: ValidateSection, names: List[str], i: int, j: int, run: ProbeRun) -> None:
    """A copy from GPU i's memory into GPU j's, timed on the wall clock with both devices
    synchronised (the copy engine of one of them moves it)."""
    nbytes = settings.p2p_mib * MIB

    def sync() -> None:
        torch.cuda.synchronize(i)
        torch.cuda.synchronize(j)

    try:
        src = torch.ones(nbytes, dtype=torch.uint8, device=torch.device("cuda", i))
        dst = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", j))
        rates = timed_rates(
            lambda: dst.copy_(src), float(nbytes), sync, settings.window_s, settings.repeats, True
        )
        access: Dict[str, object] = {"peer_access": torch.cuda.can_device_access_peer(i, j)}
    except (RuntimeError, MemoryError) as exc:
        run.errors.append(ProbeError.of("p2p", f"GPU {i}->{j}", exc))
        return
    samples = tuple(rate * 1e-9 for rate in rates)
    run.figures.append(
        Figure("p2p", f"GPU {i}->{j}", max(samples), names[i], samples, None, access)
    )


GPU_PROBES = probes_measured_on(EACH_GPU, EACH_DEVICE)
"""What :func:`gpu_probes` measures on each GPU (a GPU that cannot be made current fails each
of them): from the probes' declarations."""


def _use(run: ProbeRun, index: int) -> bool:
    """Make GPU ``index`` current; a GPU that refuses (a sticky CUDA error, a lost GPU) fails
    each of its probes instead of ending the command."""
    try:
        torch.cuda.set_device(index)
    except RuntimeError as exc:
        run.errors += [ProbeError.of(probe, f"GPU {index}", exc) for probe in GPU_PROBES]
        return False
    return True


def _name(index: int) -> str:
    try:
        return torch.cuda.get_device_name(index)
    except RuntimeError:  # its probes fail with the reason; no SKU figure without a name
        return "unknown GPU"


def gpu_probes(settings: ValidateSection, notify: Notify) -> ProbeRun:
    run = ProbeRun()
    names = [_name(i) for i in range(torch.cuda.device_count())]
    for index, name in enumerate(names):
        m = Measure(torch.device("cuda", index), f"GPU {index}", name, settings, run)
        if not _use(run, index):
            continue
        notify(f"GEMM on GPU {index}")
        for probe, dtype in GEMM_DTYPES:
            gemm(m, probe, dtype, settings.gemm_size)
        with _tf32():
            gemm(m, "gemm_tf32", torch.float32, settings.gemm_size)
        notify(f"memory and host copies on GPU {index}")
        memory_copy(m, settings.copy_mib)
        host_copies(m, settings.host_copy_mib)
        launch_latency(m)
        with contextlib.suppress(RuntimeError):  # a GPU in error: its rows say so already
            torch.cuda.empty_cache()
    for i in range(len(names)):
        for j in range(len(names)):
            if i != j:
                notify(f"P2P GPU {i} -> GPU {j}")
                p2p_copy(settings, names, i, j, run)
    return run


@contextlib.contextmanager
def _on_core(slot: int) -> Iterator[None]:
    """With one thread per slot, run slot i on the i-th CPU this process may use (Linux), so
    that slots are cores and their peers are the other cores; otherwise leave placement be."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if threads_per_cpu_slot() != 1 or slot >= len(allowed):
        yield
        return
    os.sched_setaffinity(0, {allowed[slot]})  # this thread only: it does the work
    try:
        yield
    finally:
        os.sched_setaffinity(0, set(allowed))


def cpu_probes(settings: ValidateSection, notify: Notify) -> ProbeRun:
    run = ProbeRun(cpu=True)
    before = torch.get_num_threads()
    torch.set_num_threads(threads_per_cpu_slot())
    try:
        for slot in range(min(cpu_slots(), settings.max_cpu_devices)):
            m = Measure(torch.device("cpu"), f"CPU {slot}", "cpu", settings, run)
            notify(f"GEMM and memory copy on CPU slot {slot}")
            with _on_core(slot):
                gemm(m, "gemm_fp32", torch.float32, settings.cpu_gemm_size)
                memory_copy(m, settings.cpu_copy_mib)
                launch_latency(m)
    finally:
        torch.set_num_threads(before)
    return run


def measure_devices(settings: ValidateSection, notify: Optional[Notify] = None) -> ProbeRun:
    """Every per-device probe of this node: GPUs when CUDA sees any, else CPU slots."""
    say = notify or (lambda _step: None)
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return gpu_probes(settings, say)
    return cpu_probes(settings, say)
