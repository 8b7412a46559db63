"""Per-rank progress and error files in the cell folder.

The orchestrator reads them after the launch: the error file names the failing rank and what it
raised, and the progress file tells, after a timeout, which rank was stuck where.
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
import time
import traceback
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from torchscale.errors import TorchscaleError
from torchscale.results.files import atomic_write_json, ensure_dir, open_for_write
from torchscale.results.json_input import MAX_LINE_BYTES, read_object
from torchscale.results.layout import RANKS_DIR, rank_file, rank_steps_file

WRITES_RESULT_ENV = "TORCHSCALE_WRITES_RESULT"
"""Set to 0 by a torchscale that does not record results (a lock-step node other than node 0),
so that no rank on its node writes the cell's result."""


STEP_PHASES = ("data", "forward", "backward", "optimizer")
"""Where in a step a rank is; the step tracker stores the index."""
_STEP_FORMAT = "qq"  # (steps started, phase index)


def steps_path(cell_dir: Path, rank: int) -> Path:
    return cell_dir / RANKS_DIR / rank_steps_file(rank)


class StepTracker:
    """This rank's step and phase in a memory-mapped file: a ~100 ns store, no system call,
    so it can run inside the timed window and still tell, after a hang, which rank stopped where.
    """

    def __init__(self, path: Path) -> None:
        size = struct.calcsize(_STEP_FORMAT)
        fd = open_for_write(path, read=True)
        os.ftruncate(fd, 0)
        os.pwrite(fd, b"\0" * size, 0)
        self._file = os.fdopen(fd, "r+b")  # kept open for the mapping's lifetime
        self._map = mmap.mmap(self._file.fileno(), size)
        self.steps = 0

    def start_step(self) -> None:
        self.steps += 1
        struct.pack_into(_STEP_FORMAT, self._map, 0, self.steps, 0)

    def phase(self, index: int) -> None:
        struct.pack_into(_STEP_FORMAT, self._map, 0, self.steps, index)


def read_steps(path: Path) -> Optional[Tuple[int, str]]:
    """(steps started, phase name) of a rank, or None if it never started a step."""
    try:
        steps, phase = struct.unpack(
            _STEP_FORMAT, path.read_bytes()[: struct.calcsize(_STEP_FORMAT)]
        )
    except (OSError, struct.error):
        return None
    return (steps, STEP_PHASES[phase]) if steps else None


def progress_path(cell_dir: Path, rank: int) -> Path:
    return cell_dir / RANKS_DIR / rank_file(rank, "progress")


def error_path(cell_dir: Path, rank: int) -> Path:
    return cell_dir / RANKS_DIR / rank_file(rank, "error")


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA OOM (any torch version) or a CPU allocation failure."""
    if any(cls.__name__ == "OutOfMemoryError" for cls in type(exc).__mro__):
        return True
    if isinstance(exc, MemoryError):
        return True
    text = str(exc)
    return "out of memory" in text.lower() or "DefaultCPUAllocator: can't allocate" in text


class RankReporter:
    """Writes this rank's phase and, if it fails, its error, atomically."""

    def __init__(self, cell_dir: Path, rank: int) -> None:
        self.cell_dir = cell_dir
        self.rank = rank
        self.phase_name = "start"
        self.phase_starts: Dict[str, float] = {}
        ensure_dir(cell_dir / RANKS_DIR, parents=False)  # a deleted results folder stays deleted
        self.steps = StepTracker(steps_path(cell_dir, rank))

    @staticmethod
    def process_started_at() -> float:
        import psutil

        return psutil.Process().create_time()

    def timeline(self) -> Dict[str, float]:
        """Seconds from this process's start to the start of each phase so far."""
        born = self.process_started_at()
        return {name: round(at - born, 4) for name, at in self.phase_starts.items()}

    def phase(self, name: str, **detail: Any) -> None:
        self.phase_name = name
        self.phase_starts[name] = time.time()
        # steps_before: the step tracker's count as the window opens, so that the console can say
        # "step k of N" of this window and a failure "at step k" from the tracker alone.
        doc = {
            "rank": self.rank,
            "phase": name,
            "time": time.time(),
            "pid": os.getpid(),
            "steps_before": self.steps.steps,
            **detail,
        }
        atomic_write_json(progress_path(self.cell_dir, self.rank), doc, make_parents=False)

    def error(self, exc: BaseException, note: Optional[str] = None) -> None:
        text = str(exc).strip()
        doc = {
            "rank": self.rank,
            "host": socket.gethostname(),
            "kind": "oom" if is_out_of_memory(exc) else "error",
            "type": type(exc).__name__,
            "message": text.splitlines()[0][:500] if text else "",
            "phase": self.phase_name,
            "note": note,
            "time": time.time(),
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        }
        atomic_write_json(error_path(self.cell_dir, self.rank), doc, make_parents=False)


def read_json(path: Path) -> Optional[Dict[str, Any]]:
    """The JSON object in a rank's file, or None (missing, damaged, not an object)."""
    try:
        return read_object(path, "rank file", MAX_LINE_BYTES)
    except (OSError, ValueError, TorchscaleError):
        return None
