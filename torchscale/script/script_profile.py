"""The traced window of a script cell: the script's own steps after its measured window.

As in the worker (``worker.profiler``): torch.profiler with a schedule of one untraced warm-up
step, then the traced steps, each one ``ProfilerStep#N`` (``prof.step()`` at each optimizer
step's end), exported to ``profile/rank<R>.json.gz``; under nsys, ``cudaProfilerStart/Stop``
around the window and an NVTX range per step. The script drives it: the window opens at a step
boundary and moves one step at each step's end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

import torch

from torchscale.plan.profile_request import RANK_MARK_FORMAT, ProfileRequest
from torchscale.results.layout import PROFILE_DIR, kineto_trace, nsys_report
from torchscale.runtime.process_group import RankContext
from torchscale.worker.profiler import NVTX_WARMUP, export_trace


class TracedWindow:
    """``steps`` traced steps of the script, after one untraced warm-up step."""

    def __init__(self, request: ProfileRequest, ctx: RankContext, steps: int, cell_dir: Path):
        self.request, self.ctx, self.steps = request, ctx, steps
        self.out = cell_dir / PROFILE_DIR
        self.seen = 0
        self.prof: Optional[Any] = None

    @property
    def nsys(self) -> bool:
        return self.request.tool == "nsys"

    def open(self) -> None:
        """Start tracing (at a step boundary: the next step is the warm-up one)."""
        self.out.mkdir(parents=True, exist_ok=True)
        if self.nsys:
            if not self.ctx.is_cuda:
                raise RuntimeError("nsys profiling needs GPUs; use profiling.tool: torch on CPU")
            torch.cuda.synchronize()
            torch.cuda.profiler.start()  # opens nsys's cudaProfilerApi capture range
            mark = RANK_MARK_FORMAT.format(rank=self.ctx.rank, world_size=self.ctx.world_size)
            torch.cuda.nvtx.mark(mark)
            torch.cuda.nvtx.range_push(NVTX_WARMUP)
            return
        from torch.profiler import ProfilerActivity, profile, schedule

        path = self.out / kineto_trace(self.ctx.rank)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.ctx.is_cuda else [])
        self.prof = profile(
            activities=activities,
            schedule=schedule(wait=0, warmup=1, active=self.steps, repeat=1),
            on_trace_ready=lambda prof: export_trace(prof, path),
            record_shapes=self.request.target in ("compute", "all"),
            profile_memory=self.request.target in ("memory", "all"),
        )
        self.prof.__enter__()

    def step_ended(self) -> bool:
        """One step of the script ended; True when the window is complete (and closed)."""
        self.seen += 1
        done = self.seen > self.steps
        if self.nsys:
            torch.cuda.nvtx.range_pop()
            if done:
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
            else:
                torch.cuda.nvtx.range_push(f"step {self.seen - 1}")
        elif self.prof is not None:
            self.prof.step()
            if done:
                self.prof.__exit__(None, None, None)
                self.prof = None
        return done

    def close_short(self) -> int:
        """The script ended inside the window: stop tracing, writing what was traced; returns
        the whole steps traced after the warm-up one (the step the script ended in is cut
        short, and the analysis leaves a capture's last step out)."""
        if self.nsys:
            torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
        elif self.prof is not None:
            self.prof.__exit__(None, None, None)  # exports the trace of the steps so far
            self.prof = None
        return max(0, self.seen - 1)

    def info(self) -> Dict[str, Any]:
        """The record's ``profile`` fields of a complete window."""
        name = nsys_report(self.ctx.rank) if self.nsys else kineto_trace(self.ctx.rank)
        return {"steps": self.steps, "trace": name, "dir": PROFILE_DIR}
