"""NCCL's flight recorder for a cell: where a hung collective's ranks dump what they were doing.

The worker's process group times out well before the launcher kills the cell (see
``runtime.process_group.process_group_timeout_s``), so NCCL's watchdog notices a hung collective,
and every rank's flight recorder (the last collectives it issued, with sequence numbers and
states) is written into the cell folder, where ``torchfrtrace`` reads it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, List

from torchscale.results.layout import FLIGHT_RECORDER_DIR

PROCESS_GROUP_TIMEOUT_CAP_S = 600.0  # NCCL's own default
PROCESS_GROUP_TIMEOUT_FLOOR_S = 60.0
# How a rank reports a collective that timed out: gloo ("Timed out waiting 3000ms for recv
# operation to complete"), NCCL's watchdog ("Watchdog caught collective operation timeout").
COLLECTIVE_TIMEOUT = re.compile(r"Timed out waiting|collective operation timeout|timed out", re.I)
DUMP_PREFIX = "rank_"  # torch appends the rank: flight_recorder/rank_3
RECORDER_ENTRIES = "2000"  # torch >= 2.6's default; older releases record nothing unless set
RECORDS_BY_DEFAULT = (2, 6)


def process_group_timeout_s(cell_timeout_s: float) -> float:
    """A collective may hang at most half the cell's budget (10 min at most): NCCL's watchdog
    then fails it and dumps the flight recorder while the launcher still waits. With the cell's
    own timeout the launcher always killed the ranks first, and nothing said where they hung.
    Never under a minute: ranks may reach their first collective far apart on a busy host
    (imports, compilation), and that is not a hang; a cell of a minute or less is ended by the
    launcher's timeout, as before."""
    half = min(cell_timeout_s / 2.0, PROCESS_GROUP_TIMEOUT_CAP_S)
    return max(PROCESS_GROUP_TIMEOUT_FLOOR_S, half)


def dumps(cell_dir: Path) -> List[Path]:
    folder = cell_dir / FLIGHT_RECORDER_DIR
    return (
        sorted(p for p in folder.glob(f"{DUMP_PREFIX}*") if p.is_file()) if folder.is_dir() else []
    )


def collective_timed_out(errors: List[Dict[str, object]], cell_dir: Path) -> bool:
    """Did the process-group timeout end this cell? gloo raises in the waiting ranks (their error
    files say so); NCCL's watchdog aborts the processes, leaving no error file but the
    flight-recorder dumps. A rank error of another kind (OOM, a crash) is the root cause even
    when dumps exist (torch also dumps on other aborts)."""
    texts = [f"{e.get('type')}: {e.get('message')}" for e in errors]
    if texts:
        return all(COLLECTIVE_TIMEOUT.search(t) for t in texts)
    return bool(dumps(cell_dir))


def flight_recorder_env(cell_dir: Path) -> Dict[str, str]:
    """Environment for the cell's ranks; variables the user set are left as they are."""
    folder = cell_dir / FLIGHT_RECORDER_DIR
    folder.mkdir(parents=True, exist_ok=True)
    prefix = str(folder / DUMP_PREFIX)
    wanted = {
        "TORCH_FR_DUMP_TEMP_FILE": prefix,  # the name once the recorder left ProcessGroupNCCL
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,  # older releases' name (read second)
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    }
    # A torch that records by default is left its buffer size: the variable's old name makes a
    # newer torch warn in every rank's log (2.14 already does), and which release renamed it
    # cannot be told without importing torch. An older torch records nothing unless told.
    buffer_sizes = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
    if not any(name in os.environ for name in buffer_sizes) and not _torch_at_least(
        *RECORDS_BY_DEFAULT
    ):
        wanted["TORCH_NCCL_TRACE_BUFFER_SIZE"] = RECORDER_ENTRIES
    return {key: value for key, value in wanted.items() if key not in os.environ}


def _torch_at_least(major: int, minor: int) -> bool:
    """From the installed distribution's metadata: the launcher never imports torch."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = re.match(r"(\d+)\.(\d+)", version("torch"))
    except PackageNotFoundError:
        return True
    return found is None or (int(found[1]), int(found[2])) >= (major, minor)


def dump_note(cell_dir: Path) -> str:
    """`` ; NCCL flight recorder ...`` naming the dumps of a failed cell, or ``""``."""
    folder = cell_dir / FLIGHT_RECORDER_DIR
    found = dumps(cell_dir)
    if not found:
        return ""
    return (
        f"; NCCL flight recorder dumps of {len(found)} rank(s) in {folder} "
        f"(read them with `torchfrtrace {folder}`)"
    )
