"""What a rank is called, on every surface: a GPU, or a CPU process where the node has no GPU.

On a CPU node every rank is a gloo process on the host's cores, and its figures are not GPU
figures: the console, the report (HTML, PDF, JSON) and ``project`` say "CPU process" / "rank"
where they would say "GPU". The words come from here and nowhere else: from the node's device
kind (``NodeDevices.kind``: ``cuda`` or ``cpu``) when something is planned, from the records
(:func:`records_device_kind`) when something was measured.
"""

from __future__ import annotations

from typing import Iterable, Optional

from torchscale.results.schema import ResultBase

CUDA = "cuda"
CPU = "cpu"
CPU_NOTE = "Measured with gloo on CPU processes: these are not GPU figures"
"""What a surface says once where every figure came from CPU processes."""


def is_cpu(kind: Optional[str]) -> bool:
    return kind == CPU


def rank_noun(kind: Optional[str], n: int = 1) -> str:
    """``GPU`` / ``GPUs``, or ``CPU process`` / ``CPU processes``."""
    if is_cpu(kind):
        return "CPU process" if n == 1 else "CPU processes"
    return "GPU" if n == 1 else "GPUs"


def count_text(n: int, kind: Optional[str]) -> str:
    """``1 GPU``, ``4 GPUs``, ``1 CPU process``, ``2 CPU processes``."""
    return f"{n} {rank_noun(kind, n)}"


def per_rank(kind: Optional[str]) -> str:
    """``per GPU`` or ``per rank`` (``Memory per GPU`` / ``Memory per rank``)."""
    return "per rank" if is_cpu(kind) else "per GPU"


def count_header(kind: Optional[str]) -> str:
    """A table's column of rank counts: ``GPUs`` or ``ranks``."""
    return "ranks" if is_cpu(kind) else "GPUs"


def record_device_kind(record: ResultBase) -> Optional[str]:
    """``cpu`` when the record ran on CPU processes, ``cuda`` on GPUs, None when it does not say
    (a cell that never started)."""
    name = getattr(record, "device_name", None)
    if name:
        return CPU if name == CPU else CUDA
    devices = [rank.device for rank in getattr(record, "per_rank", None) or []]
    if devices:
        return CPU if all(d == CPU for d in devices) else CUDA
    return None


def records_device_kind(records: Iterable[ResultBase]) -> str:
    """``cpu`` when every record that says where it ran ran on CPU processes, else ``cuda``
    (records that do not say, and none at all, read as GPUs: the words torchscale is for)."""
    kinds = {kind for kind in map(record_device_kind, records) if kind is not None}
    return CPU if kinds == {CPU} else CUDA


def device_noun(cpu: bool, count: Optional[int] = None, plural: bool = False) -> str:
    """``GPU`` / ``CPU process``; with ``count``: ``1 GPU``, ``2 CPU processes``; ``plural``
    without a count: ``GPUs`` / ``CPU processes``."""
    kind = CPU if cpu else CUDA
    if count is not None:
        return count_text(count, kind)
    return rank_noun(kind, 2 if plural else 1)


def cpu_run_note(backend: str = "gloo") -> str:
    """The report's first-screen line that says a run's figures are not GPU figures (the
    console's shorter form is :data:`CPU_NOTE`)."""
    return (
        f'This run used {backend} on CPU processes, one per "GPU" of the config: throughput, '
        "step times, sync and scaling here are CPU figures, not GPU figures."
    )
