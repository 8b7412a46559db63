"""What a rank runs on, in words: a GPU, or on a node without GPUs a CPU process (gloo).

One place for the noun, so the console and the report say "2 CPU processes" where a GPU run says
"2 GPUs". Standard library only.
"""

from __future__ import annotations

from typing import Optional

GPU, CPU_PROCESS = "GPU", "CPU process"


def device_noun(cpu: bool, count: Optional[int] = None, plural: bool = False) -> str:
    """``GPU`` / ``CPU process``; with ``count``: ``1 GPU``, ``2 CPU processes``; ``plural``
    without a count: ``GPUs`` / ``CPU processes``."""
    noun = CPU_PROCESS if cpu else GPU
    many = plural if count is None else count != 1
    word = noun + ("es" if cpu else "s") if many else noun
    return word if count is None else f"{count} {word}"


def cpu_run_note(backend: str = "gloo") -> str:
    """The line that says a run's figures are not GPU figures."""
    return (
        f"This run used {backend} on CPU processes, one per \"GPU\" of the config: throughput, "
        "step times, sync and scaling here are CPU figures, not GPU figures."
    )
