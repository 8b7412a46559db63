"""What the console says about the cell that runs now, for every command that runs cells
(``benchmark``, ``profile``, ``tune``): its name in the node's words ("on 2 CPU processes"), where
it is (warm-up, measuring step k/N: ``launch/cell_progress.py``), and, for a cell the profiler
traced, the line that names why, where its traces are and what they found.

In a terminal the progress bar carries where the cell is; in a log (stderr not a terminal: CI, a
file) a ``> [PROGRESS]`` line is printed at least every ``PROGRESS_EVERY_S`` instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from torchscale.cli.console import err_console, say
from torchscale.escaping import for_terminal
from torchscale.plan.kind_protocol import get_kind
from torchscale.plan.planned_cell import Cell
from torchscale.results.schema import ResultBase

PROGRESS_EVERY_S = 10.0
"""In a log, a running cell prints where it is at least this often."""


class RunningCell:
    """The cell that runs now: its description, and where it is when asked."""

    def __init__(self) -> None:
        self.cell: Optional[Cell] = None
        self.cell_dir: Optional[Path] = None
        self.described = ""
        self.next_line = PROGRESS_EVERY_S
        self._device_kind: Optional[str] = None

    @property
    def device_kind(self) -> str:
        if self._device_kind is None:  # the sweep has imported torch by now: this is cheap
            from torchscale.hardware.environment import node_devices

            self._device_kind = node_devices().kind
        return self._device_kind

    def start(self, cell: Cell, cell_dir: Path) -> str:
        """Track ``cell``; returns its description, terminal-safe."""
        self.cell, self.cell_dir, self.next_line = cell, cell_dir, PROGRESS_EVERY_S
        self.described = for_terminal(get_kind(cell.kind).describe(cell, self.device_kind))
        return self.described

    def where(self, elapsed_s: float) -> str:
        """``measuring, step 40/120, 25 s``: the window, the step, the time since the start."""
        from torchscale.launch.cell_progress import cell_progress

        found = None
        if self.cell is not None and self.cell_dir is not None:
            found = cell_progress(self.cell_dir, self.cell.settings)
        return (f"{found.describe()}, " if found else "") + f"{elapsed_s:.0f} s"

    def polled(self, elapsed_s: float) -> Optional[str]:
        """In a log, the progress line owed at ``elapsed_s`` (None when none is owed yet); in a
        terminal, None (the progress bar shows :meth:`where`)."""
        if err_console.is_terminal or elapsed_s < self.next_line:
            return None
        self.next_line = PROGRESS_EVERY_S * (int(elapsed_s // PROGRESS_EVERY_S) + 1)
        return f"> [PROGRESS] {self.described}: {self.where(elapsed_s)} elapsed"

    def profile_line(self, record: ResultBase) -> Optional[str]:
        """The line a traced cell ends with: which cell, why it was traced (the trigger's
        reason), where its traces are and the most severe finding."""
        from torchscale.analysis.finding import severity_order, shown_severity
        from torchscale.analysis.report_data import read_findings

        profile = getattr(record, "profile", None)
        if self.cell_dir is None or record.status != "ok" or not profile or not profile.profiled:
            return None
        folder = self.cell_dir / (profile.dir or "")
        findings = read_findings(folder)[0] if folder.is_dir() else []
        if findings:
            top = min(findings, key=lambda f: severity_order(str(f.get("severity"))))
            title = top.get("title") or top.get("message")
            found = f"top finding ({shown_severity(str(top.get('severity')))}): {title}"
        else:
            found = "no finding" if profile.findings == 0 else "no analysis (see the traces)"
        why = f"traced: {profile.reason}" if profile.reason else "traced"
        return f"> [PROFILE] {self.described}: {why}; traces in {folder}; {found}"


def say_progress(running: RunningCell, elapsed_s: float) -> None:
    """Print the progress line a log is owed, if any."""
    line = running.polled(elapsed_s)
    if line:
        say(line)
