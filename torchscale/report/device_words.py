"""What the report calls a rank's device while it is built: "GPU", or "CPU process" for a run of
gloo on CPU processes (``ReportData.on_cpu``), so a CPU run never reads as a GPU result.

``build_content`` and ``build_document`` set it for the duration of one report
(:func:`ranks_on_cpu`); the sections ask it for their words instead of writing "GPU".
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator, Optional

from torchscale.hardware.device_noun import device_noun

_ON_CPU: ContextVar[bool] = ContextVar("ranks_on_cpu", default=False)


@contextmanager
def ranks_on_cpu(cpu: bool) -> Iterator[None]:
    token = _ON_CPU.set(cpu)
    try:
        yield
    finally:
        _ON_CPU.reset(token)


def on_cpu() -> bool:
    return _ON_CPU.get()


def device(count: Optional[int] = None, plural: bool = False) -> str:
    """``GPU``, ``4 GPUs``, ``GPUs``; on CPU ``CPU process``, ``4 CPU processes``..."""
    return device_noun(_ON_CPU.get(), count, plural)


def devices() -> str:
    """``GPUs`` / ``CPU processes``."""
    return device(plural=True)


def count_header() -> str:
    """A column of rank counts: ``GPUs``, or ``Ranks`` (CPU processes)."""
    return "Ranks" if _ON_CPU.get() else "GPUs"


def count_axis() -> str:
    """The axis of rank counts: ``GPUs``, or ``ranks (CPU processes)``."""
    return "ranks (CPU processes)" if _ON_CPU.get() else "GPUs"


def per_device() -> str:
    """``per GPU`` / ``per rank``."""
    return "per rank" if _ON_CPU.get() else "per GPU"
