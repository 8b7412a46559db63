"""Warm group entry point: ``torchrun ... -m torchscale.worker.warm_group_loop --group group.json``.

One process group runs several cells back to back (see ``torchscale.launch.warm_groups``). Each cell
gets what a launch of its own would give it: a fresh model, DDP wrapper, optimizer and data
stream, its own progress, step and error files in its own folder, its own per-rank logs
(``cells/<id>/torchrun/warm/rank<N>/``), and its memory released and peak counters reset before
the next cell starts. What is shared is what costs the start-up: torchrun's agent, the imports
(torch, ``torch._dynamo`` through DDP) and the process group.

The writer (rank 0) appends ``start`` and ``end`` events to the group's ``progress.jsonl``,
fsynced: the launcher reads them to record each cell as soon as it ends and to time each cell
against its own ``cell_timeout_s``.

An out-of-memory error is contained when every rank hit it at the same place (the same phase and
step: no collective of the cell is left half-issued, so the process group is still in step): the
cell ends ``oom`` and the group goes on. Anything else (a crash, an OOM on some ranks only, peers
that do not arrive within ``AGREE_TIMEOUT_S``) ends the process and so the group launch; the
launcher records the cell from its rank error files and relaunches the group from the next cell.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional

from torch.distributed.elastic.multiprocessing.errors import record

from torchscale.config.settings import CellSettings
from torchscale.results.files import append_jsonl, ensure_dir, open_for_write
from torchscale.results.layout import GROUP_FILE, RANK_STDERR_LOG, RANK_STDOUT_LOG
from torchscale.results.rank_files import RankReporter, is_out_of_memory
from torchscale.runtime.entry import exit_now, rank_reporter, read_cell, watch_parent
from torchscale.runtime.process_group import RankContext, init_distributed, shutdown_distributed
from torchscale.worker.main import measure_cell

AGREE_TIMEOUT_S = 30.0
"""How long a rank whose cell failed waits for its peers to report the same failure. Peers that
hang in a collective the failed rank never joined do not come: the group launch ends."""

WARM_LOGS = ("torchrun", "warm")
"""Each cell's per-rank stdout/stderr, under its own folder."""


def _trim_heap() -> None:
    """Give freed heap back to the OS (glibc), so the next cell's RSS starts near a fresh
    process's: CPU memory figures are RSS."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


def release_memory(ctx: Optional[RankContext]) -> None:
    """What a new process would give the next cell: collected objects, an empty CUDA cache,
    fresh peak counters."""
    gc.collect()
    if ctx is not None and ctx.is_cuda:
        import torch

        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(ctx.device)
    _trim_heap()


class MathDefaults:
    """The process's cuDNN autotuning and TF32 flags as torch started them. A cell with
    ``tf32: null`` means torch's defaults, not what the cell before it set: restored per cell."""

    def __init__(self) -> None:
        import torch

        self.flags = (
            torch.backends.cudnn.benchmark,
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
        )

    def restore(self) -> None:
        import torch

        benchmark, matmul, cudnn = self.flags
        torch.backends.cudnn.benchmark = benchmark
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn


def redirect_output(cell_dir: Path, rank: int) -> None:
    """This rank's stdout and stderr go to the cell's own log files from here on."""
    folder = cell_dir.joinpath(*WARM_LOGS, f"rank{rank}")
    ensure_dir(cell_dir.joinpath(WARM_LOGS[0]), parents=False)  # never re-create a deleted folder
    ensure_dir(cell_dir.joinpath(*WARM_LOGS), parents=False)
    ensure_dir(folder, parents=False)
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, name in ((1, RANK_STDOUT_LOG), (2, RANK_STDERR_LOG)):
        log = open_for_write(folder / name)
        os.ftruncate(log, 0)
        os.dup2(log, fd)
        os.close(log)


def agree(index: int, rank: int, world_size: int, outcome: str) -> None:
    """Every rank says how the cell ended, through the process group's store; raises unless all
    arrive in time with the same outcome."""
    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    prefix = f"torchscale-warm/{index}"
    store.set(f"{prefix}/{rank}", outcome)
    keys = [f"{prefix}/{r}" for r in range(world_size)]
    try:
        store.wait(keys, timedelta(seconds=AGREE_TIMEOUT_S))
    except Exception:
        raise RuntimeError(
            f"rank {rank} ended the cell with {outcome!r} and its peers did not all end it within "
            f"{AGREE_TIMEOUT_S:g} s: the process group is out of step; the group launch ends"
        ) from None
    seen = {store.get(key).decode() for key in keys}
    if seen != {outcome}:
        raise RuntimeError(
            f"ranks ended the cell differently ({sorted(seen)}): the process group may hold "
            "half-issued collectives; the group launch ends"
        )


def _event(path: Path, **fields: Any) -> None:
    append_jsonl(path, {**fields, "time": time.time()})


def run_group(group: Dict[str, Any]) -> None:
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    progress = Path(group["progress"])
    ctx: Optional[RankContext] = None
    defaults = MathDefaults()
    try:
        for index, entry in enumerate(group["cells"]):
            defaults.restore()
            cell = read_cell(Path(entry["cell"]))
            out_path = Path(entry["out"])
            redirect_output(out_path.parent, rank)
            reporter: RankReporter = rank_reporter(out_path)
            if rank == 0:
                _event(progress, cell=cell["cell_id"], event="start")
            outcome = "ok"
            try:
                if ctx is None:
                    reporter.phase("init")
                    settings = CellSettings.model_validate(cell["settings"])
                    ctx = init_distributed(group["timeout_s"], settings.backend)
                measure_cell(cell, out_path, ctx, reporter)
            except Exception as exc:
                reporter.error(exc)
                if ctx is None or not is_out_of_memory(exc):
                    raise
                outcome = f"oom in {reporter.phase_name}, step {reporter.steps.steps}"
            del reporter
            agree(index, rank, world_size, outcome)
            release_memory(ctx)
            if rank == 0:
                _event(progress, cell=cell["cell_id"], event="end", outcome=outcome)
    finally:
        shutdown_distributed()


@record
def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="torchscale.worker.warm_group_loop", description=__doc__)
    parser.add_argument("--group", type=Path, required=True, help=f"{GROUP_FILE} of the launcher")
    args = parser.parse_args(argv)
    watch_parent()
    run_group(json.loads(args.group.read_text(encoding="utf-8")))
    exit_now()


if __name__ == "__main__":
    main()
