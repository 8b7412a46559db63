"""NCCL's flight recorder for a cell: where a hung collective's ranks dump what they were doing.

The worker's process group times out well before the launcher kills the cell (see
``worker.distributed.process_group_timeout_s``), so NCCL's watchdog notices a hung collective,
and every rank's flight recorder (the last collectives it issued, with sequence numbers and
states) is written into the cell folder, where ``torchfrtrace`` reads it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict

FLIGHT_RECORDER_DIR = "flight_recorder"
DUMP_PREFIX = "rank_"  # torch appends the rank: flight_recorder/rank_3
RECORDER_ENTRIES = "2000"  # torch >= 2.6's default; older releases record nothing unless set


def flight_recorder_env(cell_dir: Path) -> Dict[str, str]:
    """Environment for the cell's ranks; variables the user set are left as they are."""
    folder = cell_dir / FLIGHT_RECORDER_DIR
    folder.mkdir(parents=True, exist_ok=True)
    prefix = str(folder / DUMP_PREFIX)
    wanted = {
        "TORCH_FR_DUMP_TEMP_FILE": prefix,  # torch 2.15's name
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,  # older releases' name
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    }
    if "TORCH_FR_BUFFER_SIZE" not in os.environ:
        wanted["TORCH_NCCL_TRACE_BUFFER_SIZE"] = RECORDER_ENTRIES
    return {key: value for key, value in wanted.items() if key not in os.environ}


def dump_note(cell_dir: Path) -> str:
    """`` ; NCCL flight recorder ...`` naming the dumps of a failed cell, or ``""``."""
    folder = cell_dir / FLIGHT_RECORDER_DIR
    dumps = [p for p in folder.glob(f"{DUMP_PREFIX}*") if p.is_file()] if folder.is_dir() else []
    if not dumps:
        return ""
    return (
        f"; NCCL flight recorder dumps of {len(dumps)} rank(s) in {folder} "
        f"(read them with `torchfrtrace {folder}`)"
    )
