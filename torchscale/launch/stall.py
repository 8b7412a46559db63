"""A hung training cell found before its ``cell_timeout_s``: every rank in a stepping window
(warmup, measure, sync_probe) and none of them moved for ``stall_timeout_s``.

The ranks say where they are at no cost to the timed window: the progress file at each window,
the memory-mapped step tracker at each step and step phase (data, forward, backward, optimizer).
A rank stuck in a forward and its peer blocked in the backward's all-reduce both stop moving,
so the watch fires; a slow but healthy rank moves at every step phase, so it does not. Start-up
(imports, joining the process group, building the model) and the windows after the steps
(gather, profile export) are not watched: only ``cell_timeout_s`` covers them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Tuple

from torchscale.plan.planned_cell import Cell
from torchscale.results.rank_files import progress_path, read_json, read_steps, steps_path

STEPPING_WINDOWS = frozenset({"warmup", "measure", "sync_probe"})

_Position = Tuple[str, float, Optional[Tuple[int, str]]]


class Stalled(Exception):
    """No rank of the running cell moved for its ``stall_timeout_s``."""


class StallWatch:
    """Call :meth:`check` at each poll of the launch; it raises :class:`Stalled`."""

    def __init__(self, cell_dir: Path, world_size: int, limit_s: Optional[float]) -> None:
        self.cell_dir, self.world_size, self.limit_s = cell_dir, world_size, limit_s
        self._last: Optional[List[_Position]] = None
        self._since = 0.0

    def _positions(self) -> Optional[List[_Position]]:
        """Each rank's (window, when it entered it, (step, step phase)); None while any rank is
        outside the stepping windows or has not said where it is."""
        positions = []
        for rank in range(self.world_size):
            progress: Dict[str, object] = read_json(progress_path(self.cell_dir, rank)) or {}
            window = progress.get("phase")
            if window not in STEPPING_WINDOWS:
                return None
            entered = progress.get("time")
            since = float(entered) if isinstance(entered, (int, float)) else 0.0
            positions.append((str(window), since, read_steps(steps_path(self.cell_dir, rank))))
        return positions

    def check(self, now: float) -> None:
        if self.limit_s is None:
            return
        positions = self._positions()
        if positions is None or positions != self._last:
            self._last, self._since = positions, now
            return
        if now - self._since > self.limit_s:
            raise Stalled()


def stall_watch(cell: Cell, cell_dir: Path) -> StallWatch:
    """The watch of a cell; only cells that step have a ``stall_timeout_s`` (training cells, a
    script's cells: a communication cell's sizes do not tick the step tracker), so the others
    get one that never fires."""
    return StallWatch(cell_dir, cell.settings.gpus, _limit(cell))


def _limit(cell: Cell) -> Optional[float]:
    limit = getattr(cell.settings, "stall_timeout_s", None)
    return float(limit) if isinstance(limit, (int, float)) else None


def stall_limit(cell: Cell) -> float:
    """The cell's ``stall_timeout_s`` (0 where it has none)."""
    return _limit(cell) or 0.0


def stall_reason(cell: Cell, where: str) -> str:
    return f"hung: no rank moved for {stall_limit(cell):g} s (stall_timeout_s): {where}"
