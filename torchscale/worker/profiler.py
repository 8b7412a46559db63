"""The profiled window: extra steps traced after the measured window, so tracing never perturbs
the throughput a cell reports.

torch.profiler writes one Kineto trace per rank (``rank<N>.json.gz``) with ``ProfilerStep#N``
ranges and forward/backward/optimizer ranges inside each step. Under nsys (the launcher wraps each
worker in ``nsys profile --capture-range=cudaProfilerApi``) the window is bracketed by
``cudaProfilerStart/Stop`` and annotated with NVTX ranges of the same names.
"""

from __future__ import annotations

import contextlib
import gzip
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, ContextManager, Dict, Optional, Tuple

import torch
import torch.distributed as dist

from torchscale.plan.profile_request import RANK_MARK_FORMAT, ProfileRequest
from torchscale.results.files import open_for_write
from torchscale.results.layout import PROFILE_DIR, kineto_trace, nsys_report
from torchscale.runtime.clock import Clock
from torchscale.runtime.process_group import RankContext
from torchscale.worker.training import TrainingRun


def should_profile(request: ProfileRequest, sync: Optional[Dict[str, Any]]) -> Tuple[bool, str]:
    """The trigger's verdict on the cell's measured gradient sync, with the reason."""
    if request.trigger == "always":
        return True, "profiling enabled for every cell"
    if not sync or sync.get("exposed_fraction") is None:
        return False, "no gradient-sync measurement to trigger on"
    if len(sync.get("per_rank_wait_ms") or []) < 2:
        return False, "one rank: no gradient sync to stall on"
    exposed = sync["exposed_fraction"]
    variation = sync.get("wait_cv_across_steps") or 0.0
    if sync.get("slowest_rank") is not None:
        return True, f"straggler detected (rank {sync['slowest_rank']})"
    if exposed >= request.sync_stall_threshold:
        return True, f"sync overhead {exposed:.1%} >= {request.sync_stall_threshold:.0%}"
    if variation >= request.variance_threshold:
        return True, f"sync wait varies {variation:.0%} >= {request.variance_threshold:.0%}"
    return False, (
        f"sync overhead {exposed:.1%} and variation {variation:.0%} below the trigger thresholds"
    )


def agree_on_window(
    request: ProfileRequest,
    verdict: Tuple[bool, str],
    step_ms: float,
    ctx: RankContext,
    src: int = 0,
) -> Dict[str, Any]:
    """Rank ``src``'s decision, broadcast so every rank runs the same number of profiled steps."""
    steps = request.steps
    if request.seconds is not None and step_ms > 0:
        steps = max(1, math.ceil(request.seconds * 1e3 / step_ms))
    decision = [{"run": verdict[0], "reason": verdict[1], "steps": steps}]
    dist.broadcast_object_list(decision, src=src)
    return decision[0]


TRACE_GZIP_LEVEL = 1
"""torch.profiler's own ``.gz`` export compresses line by line at level 9: 12 s for a 145 MB CPU
trace on this repository's VM, against 0.9 s for the export plus level 1 in 1 MiB blocks, for a
file 40% larger (benchmarks/trace_export_speed.py). The analysis reads each trace once."""


def export_trace(prof: Any, path: Path) -> None:
    """Write ``prof``'s Kineto trace to ``path`` (``.json.gz``): the plain JSON export into a
    new temporary file beside it, then gzip at :data:`TRACE_GZIP_LEVEL` into ``path`` (replacing
    a trace a rerun of the cell left; never opened through a link)."""
    handle, plain = tempfile.mkstemp(prefix=".trace-", suffix=".json", dir=path.parent)
    os.close(handle)
    try:
        prof.export_chrome_trace(plain)
        with open(plain, "rb") as source, os.fdopen(open_for_write(path), "wb") as raw:
            raw.truncate(0)
            with gzip.GzipFile(
                filename=path.name[: -len(".gz")], mode="wb", fileobj=raw,
                compresslevel=TRACE_GZIP_LEVEL,
            ) as zipped:  # fmt: skip
                shutil.copyfileobj(source, zipped, 1 << 20)
    finally:
        os.unlink(plain)


def _torch_window(
    run: TrainingRun, clock: Clock, ctx: RankContext, req: ProfileRequest, steps: int, out: Path
) -> Path:
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    path = out / kineto_trace(ctx.rank)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.is_cuda else [])
    # A schedule is what makes torch.profiler mark steps (ProfilerStep#N): one untraced warm-up
    # step, then the traced ones; the trace is exported when the last one ends.
    with profile(
        activities=activities,
        schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
        on_trace_ready=lambda prof: export_trace(prof, path),
        record_shapes=req.target in ("compute", "all"),
        profile_memory=req.target in ("memory", "all"),
    ) as prof:
        for _ in range(steps + 1):
            run.step(clock, annotate=record_function)
            prof.step()
    clock.synchronize()
    return path


NVTX_WARMUP = "torchscale warm-up"  # not a step name: the analysis does not count it


def _nvtx_window(run: TrainingRun, clock: Clock, steps: int, ctx: RankContext) -> None:
    nvtx: Callable[[str], ContextManager[Any]] = torch.cuda.nvtx.range
    torch.cuda.synchronize()
    torch.cuda.profiler.start()  # opens nsys's cudaProfilerApi capture range
    # Which rank this process is, for an export holding several ranks (nsys_ranks reads it).
    torch.cuda.nvtx.mark(RANK_MARK_FORMAT.format(rank=ctx.rank, world_size=ctx.world_size))
    # The first step after cudaProfilerStart pays for CUPTI's setup: traced, not a step range.
    with nvtx(NVTX_WARMUP):
        run.step(clock, annotate=nvtx)
    for index in range(steps):
        with nvtx(f"step {index}"):
            run.step(clock, annotate=nvtx)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def profile_window(
    run: TrainingRun, ctx: RankContext, request: ProfileRequest, steps: int, cell_dir: Path
) -> Dict[str, Any]:
    """Run ``steps`` traced steps on this rank; returns what was written."""
    out = cell_dir / PROFILE_DIR
    out.mkdir(parents=True, exist_ok=True)
    clock = Clock(ctx.device)
    dist.barrier()
    if request.tool == "nsys":
        if not ctx.is_cuda:
            raise RuntimeError("nsys profiling needs GPUs; use profiling.tool: torch on CPU")
        _nvtx_window(run, clock, steps, ctx)
        trace = out / nsys_report(ctx.rank)
    else:
        trace = _torch_window(run, clock, ctx, request, steps, out)
    with contextlib.suppress(Exception):
        dist.barrier()
    return {"tool": request.tool, "steps": steps, "trace": trace.name}
