"""Communication worker: ``torchrun ... -m torchscale.comm.worker --cell C.json --out R.json``.

Every rank runs every collective x dtype x size (warmup, timed loop, then one checked op), the P2P
pairs and the TP GEMM cases, in the same order. Rank 0 gathers the per-rank times and wrong counts
and writes the raw figures to ``result.json``; bandwidths and statuses are derived from them by
``torchscale.comm.kind``. A failing rank writes its error file and re-raises, as the training
worker does.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from functools import partial
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from torchscale.comm.busbw import SENDRECV, layout
from torchscale.comm.collectives import (
    RUN,
    Corruption,
    buffers,
    check_collective,
    corruption_from_env,
    torch_dtype,
)
from torchscale.comm.config import ELEMENT_BYTES, CommCellSettings
from torchscale.comm.p2p import measure_pairs
from torchscale.comm.timing import time_op
from torchscale.comm.tp_gemm import run_case
from torchscale.results.store import atomic_write_json
from torchscale.worker.distributed import RankContext, init_distributed, shutdown_distributed
from torchscale.worker.reporting import RankReporter
from torchscale.worker.timing import Clock


def _collectives(
    settings: CommCellSettings,
    ctx: RankContext,
    clock: Clock,
    reporter: RankReporter,
    corruption: Optional[Corruption],
) -> List[Dict[str, Any]]:
    """This rank's time (and wrong count) for every collective x dtype x size."""
    results = []
    for op in settings.collectives:
        for dtype_name in settings.dtypes:
            dtype = torch_dtype(dtype_name)
            for requested in settings.sizes:
                lay = layout(op, requested, ELEMENT_BYTES[dtype_name], ctx.world_size)
                reporter.phase("measure", op=op, dtype=dtype_name, size_bytes=lay.size_bytes)
                step = partial(RUN[op], *buffers(lay, dtype, ctx.device))
                time_us = time_op(clock, step, settings.warmup, settings.iterations)
                del step  # free the buffers before the check allocates its own
                wrong = None
                if settings.check:
                    wrong = check_collective(
                        lay, ctx.rank, ctx.world_size, dtype, ctx.device, corruption
                    )
                results.append(
                    {
                        "op": op,
                        "dtype": dtype_name,
                        "requested_bytes": requested,
                        "size_bytes": lay.size_bytes,
                        "count": lay.count,
                        "time_us": time_us,
                        "wrong": wrong,
                    }
                )
    return results


def _p2p(
    settings: CommCellSettings,
    ctx: RankContext,
    clock: Clock,
    reporter: RankReporter,
    corruption: Optional[Corruption],
) -> List[Dict[str, Any]]:
    results = []
    for dtype_name in settings.dtypes:
        for requested in settings.sizes:
            lay = layout(SENDRECV, requested, ELEMENT_BYTES[dtype_name], ctx.world_size)
            reporter.phase("measure", op=SENDRECV, dtype=dtype_name, size_bytes=lay.size_bytes)
            sides = measure_pairs(
                clock,
                lay,
                ctx.rank,
                ctx.world_size,
                torch_dtype(dtype_name),
                ctx.device,
                settings.warmup,
                settings.iterations,
                settings.check,
                corruption,
            )
            results.append(
                {
                    "dtype": dtype_name,
                    "requested_bytes": requested,
                    "size_bytes": lay.size_bytes,
                    "count": lay.count,
                    **sides,
                }
            )
    return results


def measure(settings: CommCellSettings, ctx: RankContext, reporter: RankReporter) -> dict:
    """Everything this rank measured, in the order every rank runs it."""
    clock = Clock(ctx.device)
    corruption = corruption_from_env()
    mine: Dict[str, Any] = {"rank": ctx.rank, "host": socket.gethostname()}
    mine["collectives"] = _collectives(settings, ctx, clock, reporter, corruption)
    mine["p2p"] = _p2p(settings, ctx, clock, reporter, corruption) if settings.p2p else []
    mine["tp_gemm"] = []
    for case in settings.tp_gemm:
        reporter.phase("measure", op="tp_gemm", **case.model_dump())
        figures = run_case(
            clock,
            case,
            ctx.rank,
            ctx.world_size,
            ctx.device,
            settings.warmup,
            settings.iterations,
            settings.check,
            corruption,
        )
        mine["tp_gemm"].append({**case.model_dump(), **figures})
    return mine


def merge(per_rank: List[dict], ctx: RankContext, settings: CommCellSettings) -> dict:
    """Rank 0's result.json: each measurement with its per-rank values side by side."""
    first = per_rank[0]

    def side_by_side(section: str, index: int, fields: tuple) -> dict:
        entry = dict(first[section][index])
        for field in fields:
            entry[field] = [rank[section][index][field] for rank in per_rank]
        return entry

    tp_fields = ("time_us", "comm_time_us", "gemm_time_us", "reference_time_us")
    tp_checked = ("wrong", "max_abs_error") if settings.check else ()
    return {
        "backend": ctx.backend,
        "device_name": ctx.device_name(),
        "hosts": sorted({rank["host"] for rank in per_rank}),
        "collectives": [
            side_by_side("collectives", i, ("time_us", "wrong"))
            for i in range(len(first["collectives"]))
        ],
        "p2p": [
            {
                **{k: v for k, v in entry.items() if k not in ("send", "recv", "wrong")},
                "per_rank": [rank["p2p"][i] for rank in per_rank],
            }
            for i, entry in enumerate(first["p2p"])
        ],
        "tp_gemm": [
            side_by_side("tp_gemm", i, tp_fields + tp_checked) for i in range(len(first["tp_gemm"]))
        ],
    }


def run_cell(cell_path: Path, out_path: Path) -> None:
    cell = json.loads(cell_path.read_text(encoding="utf-8"))
    settings = CommCellSettings.model_validate(cell["settings"])
    reporter = RankReporter(out_path.parent, int(os.environ.get("RANK", "0")))
    try:
        reporter.phase("init")
        ctx = init_distributed(settings.cell_timeout_s)
        if ctx.is_cuda:
            torch.backends.cuda.matmul.allow_tf32 = False  # fp32 GEMMs stay fp32
        mine = measure(settings, ctx, reporter)
        reporter.phase("gather")
        gathered: Optional[list] = [None] * ctx.world_size if ctx.rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if ctx.rank == 0:
            atomic_write_json(out_path, merge(gathered or [], ctx, settings))
        reporter.phase("done")
    except BaseException as exc:
        reporter.error(exc)
        raise
    finally:
        shutdown_distributed()


@record
def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="torchscale.comm.worker", description=__doc__)
    parser.add_argument("--cell", type=Path, required=True, help="cell.json written by the planner")
    parser.add_argument("--out", type=Path, required=True, help="where rank 0 writes the result")
    args = parser.parse_args(argv)
    run_cell(args.cell, args.out)


if __name__ == "__main__":
    main()
