"""From a regression to its traces: the ``profile diff`` command for each regressed cell that
was profiled in both runs (``compare`` prints them under its verdict)."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from torchscale.escaping import UnsafeValue, shell_line
from torchscale.results.layout import cell_dir
from torchscale.results.schema import ResultBase, TrainingResult


def _trace_dirs(experiments: Iterable[Tuple[Path, List[ResultBase]]]) -> Dict[str, Path]:
    """Per cell id, the folder of its traces (profiled cells only)."""
    found: Dict[str, Path] = {}
    for path, records in experiments:
        for record in records:
            info = record.profile if isinstance(record, TrainingResult) else None
            if info is not None and info.profiled and info.dir:
                folder = cell_dir(path, record.cell_id) / info.dir
                if folder.is_dir():
                    found[record.cell_id] = folder
    return found


def diff_commands(
    old: Iterable[Tuple[Path, List[ResultBase]]],
    new: Iterable[Tuple[Path, List[ResultBase]]],
    pairs: Iterable[Tuple[str, Optional[str]]],
) -> List[str]:
    """``torchscale profile diff OLD NEW`` for each (old cell id, new cell id) profiled in both
    runs; the paths quoted for a shell (they come from result folders)."""
    before, after = _trace_dirs(old), _trace_dirs(new)
    lines = []
    for old_id, new_id in pairs:
        if new_id is not None and old_id in before and new_id in after:
            command = ["torchscale", "profile", "diff", str(before[old_id]), str(after[new_id])]
            try:
                lines.append(shell_line(command, "a profile diff command"))
            except UnsafeValue:  # a folder name with a line break: no command to paste
                continue
    return lines
