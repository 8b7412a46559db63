"""Worker entry point: ``torchrun ... -m torchscale.worker --cell cell.json --out result.json``.

Every rank builds the model and runs the windows; rank 0 gathers the per-rank figures and writes
``result.json`` atomically. A rank that fails writes its error file (OOM is recognised), then
re-raises so torchrun records it and stops the other ranks.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from torch.distributed.elastic.multiprocessing.errors import record

from torchscale.config.schema import CellSettings
from torchscale.models.registry import load_model
from torchscale.results.store import atomic_write_json
from torchscale.worker.aggregate import aggregate
from torchscale.worker.distributed import init_distributed
from torchscale.worker.entry import (
    gather_at_rank0,
    parse_cell_args,
    rank_reporter,
    read_cell,
    reporting_failures,
)
from torchscale.worker.measure import measure_rank
from torchscale.worker.training import build_run


def run_cell(cell_path: Path, out_path: Path) -> None:
    settings = CellSettings.model_validate(read_cell(cell_path)["settings"])
    reporter = rank_reporter(out_path)
    with reporting_failures(reporter):
        reporter.phase("init")
        ctx = init_distributed(settings.cell_timeout_s)
        reporter.phase("build")
        spec = load_model(settings.model, seq_len=settings.seq_len)
        run = build_run(settings, spec, ctx)
        run.tracker = reporter.steps
        rank_result = measure_rank(run, settings, ctx, reporter)
        reporter.phase("gather")
        gathered = gather_at_rank0(rank_result, ctx)
        if gathered is not None:
            result = aggregate(
                gathered,
                batch_size=settings.batch_size,
                grad_accum_steps=settings.grad_accum_steps,
                precision=settings.precision,
                unit=spec.unit,
                units_per_sample=spec.units_per_sample,
                flops_per_sample=spec.flops_per_sample,
                device_name=ctx.device_name(),
            )
            result["backend"] = ctx.backend
            atomic_write_json(out_path, result)
        reporter.phase("done")


@record
def main(argv: Optional[List[str]] = None) -> None:
    args = parse_cell_args("torchscale.worker", __doc__ or "", argv)
    run_cell(args.cell, args.out)
