"""How every level-2 probe is timed, and what one measured figure is.

A probe times back-to-back calls of one operation in ``repeats`` windows of about ``window_s``
seconds each, synchronising the device before and after a window (so queued GPU work counts),
after one warm-up call. Windows last their time at whatever pace the device has, so they span
CPU-quota periods (100 ms in Linux CFS): a throttled node cannot hide its throttling in a
burst. The figure is the best window, since interference (another process, a shared core) only
ever slows a window down; the other windows are kept in ``samples``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from torchscale.hardware.expected_figures import PROBES


def describe(exc: BaseException) -> Tuple[str, bool]:
    """An exception in one line (its type and first line), and whether it is a lack of memory
    (torch's CUDA and CPU allocators say so in words: ``CUDA out of memory``, ``can't allocate
    memory``)."""
    text = str(exc).strip().splitlines()
    reason = f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__
    lowered = reason.lower()
    memory = isinstance(exc, MemoryError) or any(
        words in lowered for words in ("out of memory", "can't allocate memory")
    )
    return reason, memory


@dataclass(frozen=True)
class ProbeError:
    """A probe that could not run on a device: out of memory, a CUDA error, no driver."""

    probe: str
    device: str  # ``GPU 3``, ``GPU 0->1``, ``CPU 0``, ``node``
    reason: str  # the exception's type and first line
    memory: bool  # a lack of memory (lower the sizes), not a fault of the device

    @classmethod
    def of(cls, probe: str, device: str, exc: BaseException) -> ProbeError:
        return cls(probe, device, *describe(exc))

    def to_dict(self) -> Dict[str, object]:
        return {"probe": self.probe, "device": self.device, "reason": self.reason}


@dataclass(frozen=True)
class Figure:
    """One probe's figure on one device (``GPU 3``, ``GPU 0->1``, ``CPU 0``, ``node``)."""

    probe: str
    device: str
    value: float
    device_name: str  # what the device calls itself: "NVIDIA H100 80GB HBM3", or "cpu"
    samples: Tuple[float, ...] = ()
    ranks: Optional[int] = None  # node collectives: how many ranks took part
    details: Dict[str, object] = field(default_factory=dict)

    @property
    def unit(self) -> str:
        return PROBES[self.probe].unit

    def to_dict(self) -> Dict[str, object]:
        return {
            "probe": self.probe,
            "label": PROBES[self.probe].label,
            "unit": self.unit,
            "device": self.device,
            "device_name": self.device_name,
            "value": self.value,
            "samples": list(self.samples),
            "ranks": self.ranks,
            **self.details,
        }


UNLOADED = "unloaded"
"""A CPU figure's detail: the same probe's figure per second of the probe thread's own CPU time
(``timed_rates``' ``on_cpu``), the core's capability with nothing else on it."""


def best(samples: List[float], higher_is_better: bool = True) -> float:
    return max(samples) if higher_is_better else min(samples)


def timed_rates(
    run: Callable[[], object],
    work: float,
    sync: Callable[[], None],
    window_s: float,
    repeats: int,
    queued: bool = False,
    on_cpu: Optional[List[float]] = None,
) -> List[float]:
    """``work`` per second in each of ``repeats`` windows of back-to-back ``run()`` calls.

    A call that returns when its work is done (CPU, ``queued`` False) is repeated until the
    window's time is up, so every window lasts ``window_s`` at whatever pace the device has in
    it. Work that is queued (a GPU) cannot be watched call by call: a calibration window counts
    how many calls, each synchronised, fill ``window_s``, and each timed window runs that many
    back to back and synchronises once.

    ``on_cpu`` (work the calling thread does itself, on one core): each window's work per second
    of this thread's own CPU time is appended to it, i.e. what the core delivers while it runs
    the probe. A window's wall rate below it is time the core gave to other threads.
    """
    run()  # warm-up: allocations, library heuristics, first touch of the pages
    sync()
    calls = 0
    if queued:
        start = time.perf_counter()
        while calls == 0 or time.perf_counter() - start < window_s:
            run()
            sync()
            calls += 1
    rates = []
    for _ in range(repeats):
        sync()
        done, start, cpu_start = 0, time.perf_counter(), time.thread_time()
        while True:
            run()
            done += 1
            if done >= calls if queued else time.perf_counter() - start >= window_s:
                break
        sync()
        rates.append(work * done / max(time.perf_counter() - start, 1e-9))
        if on_cpu is not None:
            on_cpu.append(work * done / max(time.thread_time() - cpu_start, 1e-9))
    return rates


def format_value(value: float) -> str:
    """Three significant digits, without a long tail: 792, 55.6, 0.112."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    digits = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:.{digits}f}"
