"""After a script cell's stepping windows: gather, write ``result.json``, trace, end the script.

Everything here is collective and runs at a step boundary, the same one on every rank (the
start of the step after the windows), or as the script ends or leaves its process group,
whichever comes first. The writer (``runtime.job_nodes.result_writer``) writes the measurement
as soon as it is gathered, then again with the traced window's ``profile`` block.

The end: once its figures are written the script is ended, on every rank: the process group is
left, the process's own children (DataLoader workers) are ended, and the process exits 0 without
running the rest of the script (its remaining steps, ``finally`` blocks, atexit handlers). The
sync probe's steps left each rank with its own weights; nothing the script would do with them
(evaluate, save a checkpoint) happens.
"""

from __future__ import annotations

import contextlib
import gc
import signal
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

from torchscale.plan.profile_request import ProfileRequest
from torchscale.results.files import atomic_write_json
from torchscale.results.rank_files import RankReporter
from torchscale.runtime.entry import exit_now, gather_at
from torchscale.runtime.job_nodes import gather_node_environments, result_writer
from torchscale.runtime.process_group import RankContext, shutdown_distributed
from torchscale.script import output_cap
from torchscale.script.run_state import RunState
from torchscale.script.script_config import ScriptCellSettings
from torchscale.script.script_figures import RankWindows, cell_result, rank_figures
from torchscale.script.script_profile import TracedWindow
from torchscale.worker.gradient_check import check_synchronised
from torchscale.worker.measure import barrier, ddp_report, memory_stats
from torchscale.worker.profiler import agree_on_window, should_profile

SAMPLES_COUNTED = "counted: the batch dimension of the DDP forward's first tensor"
SAMPLES_GIVEN = "given: samples_per_step"


def _shut_down_data_loaders() -> int:
    """Shut every live multi-process DataLoader iterator down the way torch does when one is
    exhausted or collected (``_shutdown_workers``): the pin-memory thread is stopped, each worker
    is told to exit and joined, and its pid leaves torch's SIGCHLD watch list. Ending a worker
    any other way while that watch is installed makes torch's SIGCHLD handler raise
    "DataLoader worker (pid N) is killed by signal" in the rank. Returns how many were shut."""
    try:
        from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter
    except ImportError:
        return 0
    shut = 0
    for obj in gc.get_objects():
        # type(), not isinstance(): a dead weak proxy raises on any attribute, __class__ too
        if issubclass(type(obj), _MultiProcessingDataLoaderIter):
            shutdown = getattr(obj, "_shutdown_workers", None)
            if callable(shutdown):
                with contextlib.suppress(Exception):
                    shutdown()
                    shut += 1
    return shut


def end_children() -> None:
    """End this process's own child processes: the script's DataLoader workers first, through
    torch's own shutdown, then whatever else it started (the process exits without the
    interpreter's teardown, which would have ended them). torch's SIGCHLD handler, which
    raises for a DataLoader worker that ends by a signal, is set back to the default first:
    nothing the script does after this point is watched."""
    import psutil

    _shut_down_data_loaders()
    with contextlib.suppress(ValueError, OSError):  # not the main thread, or no SIGCHLD
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    capper = output_cap.capper_pid()  # ended by output_cap.release, after the last output
    children = [c for c in psutil.Process().children(recursive=True) if c.pid != capper]
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(children, timeout=5)


class Finisher:
    def __init__(
        self,
        settings: ScriptCellSettings,
        request: Optional[ProfileRequest],
        reporter: RankReporter,
        out_path: Path,
        state: RunState,
    ) -> None:
        self.s, self.request, self.reporter = settings, request, reporter
        self.out_path, self.state = out_path, state
        self.ctx: Optional[RankContext] = None
        self.windows = RankWindows()
        self.gpu: Optional[Dict[str, Any]] = None
        self.probe_note: Optional[str] = None
        self.result: Optional[Dict[str, Any]] = None
        self.traced: Optional[TracedWindow] = None
        self.profile_info: Dict[str, Any] = {}
        self.collectives: List[Dict[str, Any]] = []  # counted in the last warm-up step
        # the gradient check's input: sampled gradients, parameter summary, seconds spent so far
        self.check_input: Tuple[Optional[torch.Tensor], Optional[torch.Tensor], float] = (
            None,
            None,
            0.0,
        )

    # --- when -----------------------------------------------------------------------------------
    def at_step_boundary(self) -> None:
        """A step starts after the windows: gather (then trace), or end the script."""
        stage = self.state.stage
        if stage == "gather":
            self._gather(can_trace=True)
            if self.state.stage != "profile":
                self._end()
        elif stage == "profiled":
            self._traced_done()
            self._end()

    def traced_step_ended(self) -> None:
        if self.traced is not None and self.traced.step_ended():
            self.state.enter("profiled")

    def before_exit(self, stepping_done: bool) -> None:
        """The script ends (or leaves its process group): finish what can be finished."""
        state = self.state
        if state.finished or not stepping_done:
            return
        if state.stage == "gather":
            self._gather(can_trace=False)
        elif state.stage == "profile" and self.traced is not None:
            self._traced_short()
        elif state.stage == "profiled":
            self._traced_done()
        state.enter("end")
        state.finished = True

    # --- what -----------------------------------------------------------------------------------
    def _place(self, ctx: RankContext) -> Dict[str, Any]:
        ddp, optimizer = self.state.ddp, self.state.optimizer
        if ddp is not None:
            params: List[torch.Tensor] = list(ddp.module.parameters())
        else:
            params = [p for g in (optimizer.param_groups if optimizer else []) for p in g["params"]]
        # Without DDP's buckets (another strategy) a gradient is held once
        bucket_view = self.s.strategy != "ddp" or bool(
            getattr(ddp, "gradient_as_bucket_view", False)
        )
        return {
            "rank": ctx.rank,
            "local_rank": ctx.local_rank,
            "host": ctx.host,
            "device": str(ctx.device),
            "memory": memory_stats(params, optimizer, ctx, bucket_view),
            "gpu": self.gpu,
            "timeline_s": self.reporter.timeline(),
            "process_started_at": self.reporter.process_started_at(),
            "collectives": self.collectives,
        }

    def _runtime(self, ctx: RankContext) -> Dict[str, Any]:
        s, ddp = self.s, self.state.ddp
        return {
            "script": s.script,
            "args": s.args,
            "step_at": s.step_at,
            "samples_per_step": SAMPLES_GIVEN if s.samples_per_step else SAMPLES_COUNTED,
            "ddp_applied": self.state.applied if s.strategy == "ddp" else {},
            "strategy": {"strategy": "ddp"} if s.strategy == "ddp" else self.state.applied,
            "ddp": ddp_report(ddp) if ddp is not None and s.strategy == "ddp" else {},
            "sync_probe": self.probe_note,
            "intra_op_threads": torch.get_num_threads(),
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark) if ctx.is_cuda else None,
            "env": s.env,
            "after_windows": "ended by torchscale (docs/own-job.md)",
        }

    def _gather(self, can_trace: bool) -> None:
        ctx = self.ctx
        assert ctx is not None
        self.reporter.phase("gather")
        figures = rank_figures(self.windows, self._place(ctx))
        sampled, summary, spent = self.check_input
        figures["gradient_check"] = check_synchronised(
            sampled, summary, ctx, spent, skipped="the script has no DDP model to check"
        )
        writer = result_writer(ctx)
        gathered = gather_at(figures, ctx, writer)
        nodes = gather_node_environments(ctx, writer)
        if ctx.rank == writer:
            result = cell_result(gathered or [], ctx.device_name())
            result.update(
                backend=ctx.backend,
                warmup_steps=max(self.s.warmup_steps, 1),
                runtime=self._runtime(ctx),
                nodes=nodes,
            )
            self.result = result
            atomic_write_json(self.out_path, result)  # the measurement is safe before tracing
        request = self.request
        if request is None:
            return
        if can_trace:
            mine = self.result  # the writer's; None on the other ranks
            verdict = should_profile(request, mine.get("sync")) if mine else (False, "")
            step_ms = (mine.get("step_time_ms") or {}).get("mean", 0.0) if mine else 0.0
            decision = agree_on_window(request, verdict, step_ms, ctx, src=writer)
        else:
            reason = "the script ended after its measured window, before a traced one"
            decision = {"run": False, "reason": reason, "steps": 0}
        self.profile_info = {
            "tool": request.tool,
            "profiled": decision["run"],
            "reason": decision["reason"],
        }
        if not decision["run"]:
            self._write_profile()
            return
        self.reporter.phase("profile")
        self.traced = TracedWindow(request, ctx, int(decision["steps"]), self.out_path.parent)
        self.traced.open()
        self.state.enter("profile")

    def _traced_short(self) -> None:
        """The script ended inside its traced window: the steps it traced are analysed (with a
        note saying so); with none past the warm-up step there is nothing to analyse."""
        traced = self.traced
        assert traced is not None
        captured = traced.close_short()
        window = f"the script ended {traced.seen} step(s) into its traced window of {traced.steps}"
        if captured < 1:
            self.profile_info.update(
                profiled=False, reason=f"{window} (and 1 warm-up step): give it more steps"
            )
            self._write_profile()
            return
        if self.ctx is not None:
            with contextlib.suppress(Exception):
                barrier(self.ctx)  # every rank's trace is written (unless it left the group)
        self.profile_info.update(traced.info())
        self.profile_info.update(
            steps=captured,
            note=f"{window} (after 1 warm-up step): analysed on the {captured} step(s) captured",
        )
        self._write_profile()

    def _traced_done(self) -> None:
        if self.ctx is not None:
            with contextlib.suppress(Exception):
                barrier(self.ctx)  # every rank's trace is written
        if self.traced is not None:
            self.profile_info.update(self.traced.info())
        self._write_profile()

    def _write_profile(self) -> None:
        if self.result is not None:
            self.result["profile"] = self.profile_info
            atomic_write_json(self.out_path, self.result)

    def _end(self) -> None:
        state = self.state
        state.enter("end")
        state.finished = True
        self.reporter.phase("done")
        if self.ctx is not None:
            with contextlib.suppress(Exception):
                barrier(self.ctx)
        shutdown_distributed()
        end_children()
        output_cap.release()
        exit_now()
