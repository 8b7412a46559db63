"""Communication worker: ``torchrun ... -m torchscale.comm.worker --cell C.json --out R.json``.

Every rank runs every scope x collective x dtype x size (warmup, timed loop, then one checked op),
the P2P pairs and the TP GEMM cases, in the same order; a rank outside every group of a scope only
takes part in the barriers. Rank 0 gathers the per-rank times and wrong counts
and writes the raw figures to ``result.json``; bandwidths and statuses are derived from them by
``torchscale.comm.kind``. A failing rank writes its error file and re-raises, as the training
worker does.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple, cast

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from torchscale.comm.busbw import SEND_RECV, Layout, layout
from torchscale.comm.collective_ops import (
    RUN,
    Corruption,
    Group,
    buffers,
    check_collective,
    corruption_from_env,
    torch_dtype,
)
from torchscale.comm.config import ELEMENT_BYTES, CommCellSettings
from torchscale.comm.ddp_timing import time_through_ddp
from torchscale.comm.op_timing import compute_stretch, idle, time_after_compute, time_op
from torchscale.comm.p2p import measure_pairs
from torchscale.comm.scopes import scope_groups
from torchscale.comm.tp_gemm import run_case
from torchscale.results.files import atomic_write_json
from torchscale.results.rank_files import RankReporter
from torchscale.runtime import entry as cell_entry
from torchscale.runtime.clock import Clock
from torchscale.runtime.job_nodes import result_writer
from torchscale.runtime.process_group import RankContext, init_distributed


@dataclass(frozen=True)
class RankRun:
    """What every measurement of this rank needs."""

    settings: CommCellSettings
    ctx: RankContext
    clock: Clock
    reporter: RankReporter
    corruption: Optional[Corruption]


def _sizes(
    op: str, run: RankRun, n: int, scope: str = "world"
) -> Iterator[Tuple[str, Layout, Dict[str, Any]]]:
    """(dtype, layout, the entry's identity) for every dtype x size of ``op`` on groups of ``n``
    ranks, in sweep order; the progress file names each one, so a hang says where it stopped."""
    for dtype_name in run.settings.dtypes:
        for requested in run.settings.sizes:
            lay = layout(op, requested, ELEMENT_BYTES[dtype_name], n)
            where = f"{op} {dtype_name} at {lay.size_bytes} B" + (
                f" ({scope})" if scope != "world" else ""
            )
            run.reporter.phase("measure", where=where)
            yield (
                dtype_name,
                lay,
                {
                    "dtype": dtype_name,
                    "requested_bytes": requested,
                    "size_bytes": lay.size_bytes,
                    "count": lay.count,
                },
            )


def scope_group(scope: str, ctx: RankContext) -> Tuple[Optional[Group], int]:
    """This rank's group in ``scope`` (None: it sits the scope out) and the groups' size.

    Every rank creates every group, in the same order, as ``new_group`` requires."""
    if scope == "world":
        return Group(None, tuple(range(ctx.world_size))), ctx.world_size
    mine = None
    groups = scope_groups(scope, ctx.world_size, ctx.local_world_size)
    for members in groups:
        handle = dist.new_group(members)
        if ctx.rank in members:  # a member's handle is its ProcessGroup (not NON_GROUP_MEMBER)
            mine = Group(cast(dist.ProcessGroup, handle), tuple(members))
    return mine, len(groups[0])


def _collectives(run: RankRun) -> List[Dict[str, Any]]:
    """This rank's time (and wrong count) for every scope x collective x dtype x size; None for
    both where the rank sat the scope out."""
    settings, ctx = run.settings, run.ctx
    results = []
    for scope in settings.scopes:
        group, n = scope_group(scope, ctx)
        for op in settings.collectives:
            for dtype_name, lay, entry in _sizes(op, run, n, scope):
                time_us = wrong = after_us = ddp_us = None
                if group is None:
                    time_op(run.clock, idle, 0, 1)  # take part in the timed loop's barrier only
                    if settings.after_compute:
                        time_op(run.clock, idle, 0, 1)
                else:
                    dtype = torch_dtype(dtype_name)
                    tensors = buffers(lay, dtype, ctx.device)
                    step = partial(RUN[op], *tensors, group)
                    time_us = time_op(run.clock, step, settings.warmup, settings.iterations)
                    if settings.after_compute:
                        after_us = time_after_compute(
                            run.clock,
                            compute_stretch(tensors[0]),
                            step,
                            settings.warmup,
                            settings.iterations,
                        )
                    if settings.through_ddp and op == "all_reduce":
                        ddp_us = time_through_ddp(
                            lay.input_elements,
                            dtype,
                            ctx.device,
                            group.handle,
                            settings.warmup,
                            settings.iterations,
                        )
                    del step, tensors  # free the buffers before the check allocates its own
                    if settings.check:
                        wrong = check_collective(
                            lay, ctx.rank, group, dtype, ctx.device, run.corruption
                        )
                entry = {"scope": scope, "group_size": n, **entry}
                timed = {
                    "time_us": time_us,
                    "wrong": wrong,
                    "after_compute_time_us": after_us,
                    "ddp_time_us": ddp_us,
                }
                results.append({"op": op, **entry, **timed})
    return results


def _p2p(run: RankRun) -> List[Dict[str, Any]]:
    """This rank's sides of every ordered pair, for every dtype x size."""
    settings, ctx = run.settings, run.ctx
    results = []
    for dtype_name, lay, entry in _sizes(SEND_RECV, run, ctx.world_size):
        sides = measure_pairs(
            run.clock,
            lay,
            ctx.rank,
            ctx.world_size,
            torch_dtype(dtype_name),
            ctx.device,
            settings.warmup,
            settings.iterations,
            settings.check,
            run.corruption,
        )
        results.append({**entry, **sides})
    return results


def _tp_gemm(run: RankRun) -> List[Dict[str, Any]]:
    settings, ctx = run.settings, run.ctx
    results = []
    for case in settings.tp_gemm:
        where = f"tp_gemm {case.order} {case.m}x{case.n}x{case.k} {case.dtype}"
        run.reporter.phase("measure", where=where)
        figures = run_case(
            run.clock,
            case,
            ctx.rank,
            ctx.world_size,
            ctx.device,
            settings.warmup,
            settings.iterations,
            settings.check,
            run.corruption,
            settings.compute_only,
        )
        results.append({**case.model_dump(), **figures})
    return results


def measure(settings: CommCellSettings, ctx: RankContext, reporter: RankReporter) -> Dict[str, Any]:
    """Everything this rank measured, in the order every rank runs it."""
    run = RankRun(settings, ctx, Clock(ctx.device), reporter, corruption_from_env())
    alone = ctx.world_size == 1  # a 1-rank cell exists for the TP GEMM alone (see comm.plan)
    return {
        "rank": ctx.rank,
        "host": socket.gethostname(),
        "collectives": [] if alone else _collectives(run),
        "p2p": _p2p(run) if settings.p2p and not alone else [],
        "tp_gemm": _tp_gemm(run),
    }


def merge(
    per_rank: List[Dict[str, Any]], ctx: RankContext, settings: CommCellSettings
) -> Dict[str, Any]:
    """Rank 0's result.json: each measurement with its per-rank values side by side."""
    first = per_rank[0]

    def side_by_side(section: str, index: int, fields: Tuple[str, ...]) -> Dict[str, Any]:
        entry = dict(first[section][index])
        for field in fields:
            entry[field] = [rank[section][index][field] for rank in per_rank]
        return entry

    timed = {"unsharded": "reference_time_us", "sharded": "sharded_time_us"}
    compute_only = (timed[size] for size in settings.compute_only)
    tp_fields = ("time_us", "comm_time_us", "gemm_time_us", *compute_only)
    tp_checked = ("wrong", "max_abs_error") if settings.check else ()
    return {
        "backend": ctx.backend,
        "device_name": ctx.device_name(),
        "hosts": sorted({rank["host"] for rank in per_rank}),
        "collectives": [
            side_by_side(
                "collectives", i, ("time_us", "wrong", "after_compute_time_us", "ddp_time_us")
            )
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
    settings = CommCellSettings.model_validate(cell_entry.read_cell(cell_path)["settings"])
    reporter = cell_entry.rank_reporter(out_path)
    with cell_entry.reporting_failures(reporter):
        reporter.phase("init")
        ctx = init_distributed(settings.cell_timeout_s, settings.backend)
        if ctx.is_cuda:
            torch.backends.cuda.matmul.allow_tf32 = False  # fp32 GEMMs stay fp32
        mine = measure(settings, ctx, reporter)
        reporter.phase("gather")
        gathered = cell_entry.gather_at(mine, ctx, result_writer(ctx))
        if gathered is not None:
            atomic_write_json(out_path, merge(gathered, ctx, settings), make_parents=False)
        reporter.phase("done")


@record
def main(argv: Optional[List[str]] = None) -> None:
    args = cell_entry.parse_cell_args("torchscale.comm.worker", __doc__ or "", argv)
    run_cell(args.cell, args.out)
    cell_entry.exit_now()


if __name__ == "__main__":
    main()
