"""The memory budget of a trace analysis (``profile analyze --max-memory``).

A trace's events are held as compact columns (see ``model``); everything the analysis allocates
later (sorting, interval unions, the tables) is a bounded multiple of them. So the peak is
projected from what the readers hold, block by block, while they read: the analysis is refused
with one line *before* the projection passes the budget, never after the machine ran out of
memory (a 100M-event capture on a 24 GB node was the case that asked for it).

Projected peak = the process's memory when the analysis started + bytes held by the readers so
far x ``PEAK_PER_HELD_BYTE`` + ``READ_OVERHEAD_BYTES`` (the blocks being read and decoded).
Both are measured (``benchmarks/trace_analysis_speed.py --memory``, docs/perf-profiling.md): the
readers hold ~21 bytes per kept event and 12 per CUDA API call, and the whole analysis peaked at
2.6-2.9 times what they held, plus ~100 MB whatever the trace.

Without ``--max-memory`` the budget is the memory the system has available when the analysis
starts (``MemAvailable`` on Linux; no budget where that cannot be read).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from torchscale.errors import TorchscaleError

PEAK_PER_HELD_BYTE = 3.0
READ_OVERHEAD_BYTES = 128 << 20  # decoded block's structs, read-ahead blocks, gzip window
MIB = 1 << 20


class TraceMemoryError(TorchscaleError):
    """The analysis would need more memory than its budget."""


def current_rss() -> int:
    """This process's resident memory in bytes (0 where it cannot be read)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def available_memory() -> Optional[int]:
    """``MemAvailable`` from /proc/meminfo, in bytes; None where there is none."""
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def human(n_bytes: float) -> str:
    """``1.5 GiB``, ``640 MiB``."""
    if n_bytes >= 1 << 30:
        return f"{n_bytes / (1 << 30):.1f} GiB"
    return f"{n_bytes / MIB:.0f} MiB"


@dataclass(frozen=True)
class MemoryBudget:
    """A limit in bytes and the memory the process already held when the analysis began.

    Picklable: parse workers check their share of a split file against it.
    """

    limit: int
    base: int
    option: str = "--max-memory"  # how the user sets it (named in the refusal)

    @classmethod
    def start(cls, limit: Optional[int]) -> Optional[MemoryBudget]:
        """The budget for an analysis starting now: ``limit`` bytes, or what is available."""
        base = current_rss()
        if limit is None:
            free = available_memory()
            return None if free is None else cls(free + base, base, "the memory available")
        return cls(int(limit), base)

    def projected(self, held: int) -> int:
        return self.base + int(held * PEAK_PER_HELD_BYTE) + READ_OVERHEAD_BYTES

    def check(self, held: int, path: Path, events: int, fraction: Optional[float] = None) -> None:
        """Refuse (one line) when holding ``held`` bytes of columns projects past the limit.

        ``fraction``: the share of the file read so far, for the estimate of the whole.
        """
        if self.projected(held) <= self.limit:
            return
        whole = ""
        if fraction and 0.01 < fraction < 1:
            whole = f", about {human(self.projected(int(held / fraction)))} for the whole file"
        set_by = (
            f"over --max-memory {human(self.limit)}"
            if self.option == "--max-memory"
            else f"over the {human(self.limit)} this machine has available"
        )
        raise TraceMemoryError(
            f"{path.name}: the analysis would need over {human(self.projected(held))} of memory "
            f"({events:,} events read{whole}), {set_by}; stopped before reading on: raise "
            "--max-memory, free memory, or analyse a shorter capture"
        )


def parse_memory(text: str) -> int:
    """``--max-memory`` text (``4G``, ``512M``, ``1.5GiB``) -> bytes; binary units."""
    from torchscale.config.sizes import parse_size

    try:
        value = parse_size(text)
    except ValueError:
        value = 0
    if value < MIB:
        raise TorchscaleError(
            f"--max-memory {text!r} is not a memory size; write one like 512M, 4G or 1.5G"
        )
    return value
