"""What every worker entry point shares: its arguments, reporting its failure, and gathering each
rank's figures at rank 0 (the training worker and the communication worker both use it)."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import torch.distributed as dist

from torchscale.launch.liveness import watch_parent as watch_parent  # re-exported for workers
from torchscale.results.layout import CELL_FILE
from torchscale.results.rank_files import RankReporter
from torchscale.runtime.mpi_env import adopt_mpi_environment
from torchscale.runtime.process_group import RankContext, shutdown_distributed


def parse_cell_args(prog: str, description: str, argv: Optional[List[str]]) -> argparse.Namespace:
    """The worker's arguments. Every cell worker starts here, so here it starts its watchdog: it
    dies with its launcher or with torchscale (see ``torchscale.launch.liveness``)."""
    adopt_mpi_environment()  # ranks started by mpirun: RANK etc. from MPI's variables
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--cell", type=Path, required=True, help=f"{CELL_FILE} written by the planner"
    )
    parser.add_argument("--out", type=Path, required=True, help="where rank 0 writes the result")
    args = parser.parse_args(argv)
    watch_parent()
    return args


def read_cell(cell_path: Path) -> Dict[str, Any]:
    cell: Dict[str, Any] = json.loads(cell_path.read_text(encoding="utf-8"))
    return cell


def rank_reporter(out_path: Path) -> RankReporter:
    """This rank's progress and error files, in the cell folder that holds the result."""
    return RankReporter(out_path.parent, int(os.environ.get("RANK", "0")))


@contextlib.contextmanager
def reporting_failures(reporter: RankReporter) -> Iterator[None]:
    """A failure writes this rank's error file (OOM recognised) and re-raises, so torchrun records
    it and stops the other ranks; the process group is shut down either way."""
    try:
        yield
    except BaseException as exc:
        reporter.error(exc)
        raise
    finally:
        shutdown_distributed()


def gather_at(local: Any, ctx: RankContext, writer: int) -> Optional[List[Any]]:
    """Every rank's ``local`` in rank order on ``writer``; None on the other ranks."""
    gathered: Optional[List[Any]] = [None] * ctx.world_size if ctx.rank == writer else None
    dist.gather_object(local, gathered, dst=writer)
    return gathered


def exit_now() -> None:
    """End a worker whose results are written: skip the interpreter's teardown, which with torch
    loaded takes ~0.7 s of every cell. Objects are collected first so DataLoader workers shut
    down, and the output streams are flushed."""
    gc.collect()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
