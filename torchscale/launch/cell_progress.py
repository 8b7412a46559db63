"""Where a running training cell is, for the console: the window (warmup, measure, sync probe,
profile) and its step k of N, read from rank 0's progress file and step tracker, the files the
stall watch (``launch/stall.py``) reads. Reading costs two small files and no message to the
ranks, so it can run at every poll without touching the timed window.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

from torchscale.config.settings import CellSettings
from torchscale.results.rank_files import progress_path, read_json, read_steps, steps_path

WINDOW_NAMES = {
    "init": "starting",
    "build": "building the model",
    "warmup": "warm-up",
    "measure": "measuring",
    "sync_probe": "sync probe",
    "gradient_check": "checking gradients",
    "gather": "gathering results",
    "profile": "profiling",
    "done": "finishing",
}


@dataclass(frozen=True)
class CellProgress:
    """Rank 0's window and, inside a stepping window, its step and the window's step count."""

    window: str
    step: Optional[int] = None
    steps: Optional[int] = None  # None where the window's length is not a step count

    def describe(self) -> str:
        """``measuring, step 40/120``, ``warm-up, step 2/5``, ``building the model``."""
        name = WINDOW_NAMES.get(self.window, self.window)
        if self.step is None:
            return name
        of = f"/{self.steps}" if self.steps and self.step <= self.steps else ""
        return f"{name}, step {self.step}{of}"


def _window_steps(window: str, doc: Dict[str, object], settings: CellSettings) -> Optional[int]:
    if window == "measure":
        steps = doc.get("steps")
        return steps if isinstance(steps, int) else settings.measure_steps
    if window == "warmup" and settings.measure_steps is not None:
        # with measure_seconds, calibration steps follow the warm-up in the same window
        return max(settings.warmup_steps, 1)
    return None


def cell_progress(cell_dir: Path, settings: object) -> Optional[CellProgress]:
    """Rank 0's progress in ``cell_dir``; None before it says anything (and for a cell that is
    not a training cell: its ranks keep no step tracker)."""
    if not isinstance(settings, CellSettings):
        return None
    doc = read_json(progress_path(cell_dir, 0))
    if not doc or not isinstance(doc.get("phase"), str):
        return None
    window = str(doc["phase"])
    tracked = read_steps(steps_path(cell_dir, 0))
    start = doc.get("steps_before")
    if tracked is None or not isinstance(start, int) or window not in ("warmup", "measure"):
        return CellProgress(window)
    step = max(0, tracked[0] - start)
    return CellProgress(window, step, _window_steps(window, doc, settings))
