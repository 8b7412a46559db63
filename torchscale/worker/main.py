"""Worker entry point: ``torchrun ... -m torchscale.worker --cell cell.json --out result.json``.

Every rank builds the model and runs the windows; the writer (rank 0, or the lowest rank on the
node that records results, see ``runtime/job_nodes.py``) gathers the per-rank figures and each
node's environment and writes ``result.json`` atomically. A rank that fails writes its error file
(OOM is recognised), then re-raises so torchrun records it and stops the other ranks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from torch.distributed.elastic.multiprocessing.errors import record

from torchscale.config.settings import CellSettings
from torchscale.models.registry import load_model
from torchscale.plan.profile_request import ProfileRequest
from torchscale.results.files import atomic_write_json
from torchscale.results.layout import PROFILE_DIR
from torchscale.results.rank_files import RankReporter
from torchscale.runtime.entry import (
    exit_now,
    gather_at,
    parse_cell_args,
    rank_reporter,
    read_cell,
    reporting_failures,
)
from torchscale.runtime.job_nodes import gather_node_environments, result_writer
from torchscale.runtime.process_group import RankContext, init_distributed
from torchscale.worker.aggregate import aggregate
from torchscale.worker.measure import ddp_config, measure_rank, warmup_steps
from torchscale.worker.profiler import (
    agree_on_window,
    profile_window,
    should_profile,
)
from torchscale.worker.training import TrainingRun, build_run


def _profile(
    run: TrainingRun,
    ctx: RankContext,
    request: ProfileRequest,
    result: Optional[Dict[str, Any]],
    cell_dir: Path,
    writer: int,
) -> Dict[str, Any]:
    """The traced window after the measured one; the writer decides (trigger) for every rank."""
    verdict = should_profile(request, result.get("sync")) if result else (False, "")
    step_ms = (result.get("step_time_ms") or {}).get("mean", 0.0) if result else 0.0
    decision = agree_on_window(request, verdict, step_ms, ctx, src=writer)
    info = {"tool": request.tool, "profiled": decision["run"], "reason": decision["reason"]}
    if decision["run"]:
        info.update(profile_window(run, ctx, request, decision["steps"], cell_dir))
        info["dir"] = PROFILE_DIR
    return info


def measure_cell(
    cell: Dict[str, Any], out_path: Path, ctx: RankContext, reporter: RankReporter
) -> None:
    """Build this cell's model, DDP wrapper, optimizer and data on a joined process group, run
    its windows and (the writer) write ``result.json``. A warm group calls it once per cell."""
    settings = CellSettings.model_validate(cell["settings"])
    request = ProfileRequest.from_json(cell.get("profile"))
    reporter.phase("build")
    spec = load_model(settings.model, seq_len=settings.seq_len)
    run = build_run(settings, spec, ctx)
    run.tracker = reporter.steps
    rank_result = measure_rank(run, settings, ctx, reporter)
    reporter.phase("gather")
    writer = result_writer(ctx)
    gathered = gather_at(rank_result, ctx, writer)
    nodes = gather_node_environments(ctx, writer)
    result = None
    if ctx.rank == writer:
        result = aggregate(
            gathered or [],
            batch_size=settings.batch_size,
            grad_accum_steps=settings.grad_accum_steps,
            precision=run.applied["peak_precision"],  # fp32 convnets: TF32 by default
            unit=spec.unit,
            units_per_sample=spec.units_per_sample,
            flops_per_sample=spec.flops_per_sample,
            device_name=ctx.device_name(),
        )
        result["backend"] = ctx.backend
        result["warmup_steps"] = warmup_steps(settings)
        result["runtime"] = {**run.applied, "ddp": ddp_config(run)}
        result["nodes"] = nodes
        atomic_write_json(out_path, result, make_parents=False)  # safe before any tracing
    if request is not None:
        reporter.phase("profile")
        info = _profile(run, ctx, request, result, out_path.parent, writer)
        if result is not None:
            result["profile"] = info
            atomic_write_json(out_path, result, make_parents=False)
    reporter.phase("done")


def run_cell(cell_path: Path, out_path: Path) -> None:
    cell = read_cell(cell_path)
    settings = CellSettings.model_validate(cell["settings"])
    reporter = rank_reporter(out_path)
    with reporting_failures(reporter):
        reporter.phase("init")
        ctx = init_distributed(settings.cell_timeout_s, settings.backend)
        measure_cell(cell, out_path, ctx, reporter)


@record
def main(argv: Optional[List[str]] = None) -> None:
    args = parse_cell_args("torchscale.worker", __doc__ or "", argv)
    run_cell(args.cell, args.out)
    exit_now()
