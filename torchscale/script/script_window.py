"""The windows of a script cell, driven by the script's own steps (the bootstrap's listener).

A step ends at each optimizer step of the script's optimizer (the first ``torch.optim`` optimizer
that steps the DDP model's parameters) or, with ``step_at: forward``, at the next DDP forward.
The stages run as the built-in worker's windows do (``worker/measure.py``), at step boundaries,
every rank at the same step:

1. warm-up: ``warmup_steps`` steps (at least one), not timed;
2. measured: ``measure_steps`` (or ``measure_seconds``, calibrated on 3 steps and agreed on the
   slowest rank's estimate), opened by a barrier and a device synchronize, per-step times from
   the device timeline (``runtime.clock``);
3. sync probe (``sync_probe_steps``): DDP's runtime logging at every step, then as many steps
   with the DDP model's gradient sync switched off (what ``no_sync()`` does) for the
   compute-only step time. Those steps leave each rank with its own weights: torchscale ends the
   script after its windows, so nothing the script does later sees them (``ScriptEnd``);
4. at the start of the next step (the script has printed what it prints after a step) or when
   the script ends or destroys its process group: the ranks' figures are gathered and the
   writer writes ``result.json``; then the traced window, if the cell is profiled; then the end:
   every rank leaves the process group and exits, its own child processes ended first.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from torchscale.plan.profile_request import ProfileRequest
from torchscale.results.rank_files import RankReporter
from torchscale.runtime.clock import Clock, StepMarks
from torchscale.runtime.process_group import RankContext
from torchscale.script.run_state import NotMeasurable, RunState, first_batch_size, rank_context
from torchscale.script.script_config import ScriptCellSettings
from torchscale.script.script_figures import RankWindows
from torchscale.script.script_finish import Finisher
from torchscale.worker.collective_count import collective_counter
from torchscale.worker.cpu_accounting import CpuSnapshot
from torchscale.worker.gpu_sampler import GpuSampler, nvml_index
from torchscale.worker.gradient_check import parameter_summary, sample_gradients
from torchscale.worker.measure import (
    CALIBRATION_STEPS,
    DDP_DEFAULT_LOGGING_SAMPLE_RATE,
    DDP_LOGGING_FIELDS,
    barrier,
    reset_peak_memory,
)


class ScriptWindows:
    """Listens to the hooks (``step_hooks.StepListener``) and runs the windows."""

    def __init__(
        self,
        settings: ScriptCellSettings,
        request: Optional[ProfileRequest],
        reporter: RankReporter,
        out_path: Path,
    ) -> None:
        self.s = settings
        self.reporter = reporter
        self.state = RunState(settings)
        self.finisher = Finisher(settings, request, reporter, out_path, self.state)
        self.ctx: Optional[RankContext] = None
        self.clock: Optional[Clock] = None
        self.marks: Optional[StepMarks] = None
        self.stage_marks: List[StepMarks] = []
        self.open_micro: Optional[Tuple[Any, Any]] = None
        self.step_samples = 0
        self.sync_off = False
        self.windows = RankWindows()
        self.measure_steps = 0
        self.t0 = 0.0
        self.sampler: Optional[GpuSampler] = None
        self.cpu_before: Optional[CpuSnapshot] = None
        self.logging: Dict[str, List[float]] = {}
        # the gradient check's: the first measured step's gradients, sampled before its optimizer
        # step, and the parameters' summary after the window (docs/strategies.md)
        self.sampled_grads: Optional[torch.Tensor] = None
        self.check_spent_s = 0.0
        self.counter: Optional[Any] = None
        self.compiled = False

    # --- the hooks ------------------------------------------------------------------------------
    def ddp_built(self, ddp: DDP, applied: Dict[str, Any]) -> None:
        state = self.state
        if state.ddp is not None and not state.finished:
            raise NotMeasurable(
                f"the script built a second DistributedDataParallel model (around "
                f"{type(ddp.module).__name__}, after one around "
                f"{type(state.ddp.module).__name__}): torchscale measures a script that trains "
                "one DDP model"
            )
        state.ddp, state.applied = ddp, applied
        self._context()

    def forward_starts(self, ddp: DDP, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        if ddp is not self.state.ddp or not torch.is_grad_enabled() or self.state.finished:
            return
        self.state.forwards += 1
        if self.s.step_at == "forward" and self.state.in_step:
            self._step_ended()
        if not self.state.in_step:
            self._step_begins()
        if self.state.finished:
            return
        now = self._mark()
        if self.open_micro is not None:
            self._close_micro(now)
        self.open_micro = (now, None)
        self.step_samples += first_batch_size(args, kwargs)
        self.reporter.steps.phase(1)

    def forward_ends(self, ddp: DDP) -> None:
        if ddp is self.state.ddp and self.open_micro is not None and self.open_micro[1] is None:
            self.open_micro = (self.open_micro[0], self._mark())
            self.reporter.steps.phase(2)

    def optimizer_starts(self, optimizer: torch.optim.Optimizer) -> None:
        if self.s.step_at == "forward" or not self.state.tracks(optimizer):
            return
        if not self.state.in_step:
            self._step_begins()
        if self.state.finished or self.marks is None:
            return
        now = self._mark()
        if self.open_micro is not None:
            self._close_micro(now)
        elif not self.marks.micro:  # no DDP forward in this step: forward and backward as one
            self.marks.micro.append((self.marks.start, self.marks.start, now))
        ddp = self.state.ddp
        if self.state.stage == "measure" and self.sampled_grads is None and ddp is not None:
            started = time.perf_counter()  # a copy of a few elements, in the first step
            self.sampled_grads = sample_gradients(list(ddp.module.parameters()))
            self.check_spent_s += time.perf_counter() - started
        self.reporter.steps.phase(3)

    def optimizer_ends(self, optimizer: torch.optim.Optimizer) -> None:
        state = self.state
        if self.s.step_at == "optimizer" and state.in_step and optimizer is state.optimizer:
            self._step_ended()

    def group_ends(self) -> None:
        """The script is leaving its process group: gather while it still can."""
        if self.state.stage == "measured":
            self.state.enter("gather")  # no step left for the probe
            self.finisher.probe_note = "not run: the script ended right after the measured window"
        self.finisher.before_exit(self._stepping_done())

    def compiles(self) -> None:
        """The script compiles: its collectives are not counted (a dispatch mode around compiled
        code would recompile it)."""
        self.compiled = True

    def script_ended(self) -> None:
        """The script returned: finish, or say why it could not be measured."""
        if self.s.step_at == "forward" and self.state.in_step and not self.state.finished:
            self._step_ended()  # the last forward-marked step ends with the script
        if not self._stepping_done():
            raise NotMeasurable(self.state.ended_early_reason())
        self.group_ends()

    # --- steps ----------------------------------------------------------------------------------
    def _context(self) -> None:
        if self.ctx is None:
            self.ctx = rank_context(self.state.ddp)
            self.clock = Clock(self.ctx.device)
            self.finisher.ctx = self.ctx

    def _mark(self) -> Any:
        assert self.clock is not None
        return self.clock.mark()

    def _close_micro(self, backward_end: Any) -> None:
        assert self.marks is not None and self.open_micro is not None
        data_ready, forward_end = self.open_micro
        self.marks.micro.append((data_ready, forward_end or data_ready, backward_end))
        self.open_micro = None

    def _stepping_done(self) -> bool:
        return self.state.stage in ("measured", "gather", "profile", "profiled", "end")

    def _step_begins(self) -> None:
        state = self.state
        if state.stage == "measured":
            # Not at the measured window's last step end: the script reads its own clock after
            # its optimizer step, and the probe's set-up (a progress file) is not its step's.
            self._start_probe()
        if self._stepping_done():
            self.finisher.at_step_boundary()  # gather, trace, or end the script
            if state.finished:
                return
        self._context()
        assert self.clock is not None
        if state.steps == 0:
            self.reporter.phase("warmup")
        state.in_step = True
        self.reporter.steps.start_step()
        self.step_samples = 0
        if self.marks is None:
            self.marks = StepMarks(self.clock)
        ddp = state.ddp
        if state.stage in ("nosync_warm", "nosync") and ddp is not None:
            ddp.require_backward_grad_sync = False  # what no_sync() sets, for this step
            self.sync_off = True
        last_warmup = state.stage == "warmup" and state.steps == max(self.s.warmup_steps, 1) - 1
        if last_warmup and not self.compiled:
            # The collectives a step issues, counted in the last warm-up step (outside the
            # window; a dispatch mode costs microseconds per operator)
            self.counter = collective_counter(self.clock)
            self.counter.__enter__()  # type: ignore[no-untyped-call]  # torch's is unannotated

    def _step_ended(self) -> None:
        state = self.state
        assert self.clock is not None and self.marks is not None
        if self.open_micro is not None:
            self._close_micro(self._mark())
        self.marks.end = self._mark()
        if self.counter is not None:
            self.counter.__exit__(None, None, None)
            self.finisher.collectives = self.counter.issued()
            self.counter = None
        state.in_step = False
        state.steps += 1
        state.stage_steps += 1
        state.last_samples = self.s.samples_per_step or self.step_samples
        if self.sync_off and state.ddp is not None:
            state.ddp.require_backward_grad_sync = True
            self.sync_off = False
        self.stage_marks.append(self.marks)
        self._advance()
        if state.stage == "profile":
            self.finisher.traced_step_ended()
        self.marks = StepMarks(self.clock)  # the next step starts where this one ended

    def _advance(self) -> None:
        state, s = self.state, self.s
        stage = state.stage
        if stage == "warmup" and state.steps >= max(s.warmup_steps, 1):
            state.check_measurable()
            if s.measure_steps is not None:
                self._open("measure", s.measure_steps)
            else:
                self._open("calibrate")
        elif stage == "calibrate" and state.stage_steps >= CALIBRATION_STEPS:
            self._open("measure", self._calibrated_steps())
        elif stage == "measure":
            self.windows.samples += state.last_samples
            if state.stage_steps >= self.measure_steps:
                self._close_measure()
                state.enter("measured")  # the probe starts with the next step (see _step_begins)
        elif stage == "logging":
            self._log_ddp_step()
        elif stage == "nosync_warm":
            self._open("nosync")
        elif stage == "nosync" and state.stage_steps >= s.sync_probe_steps:
            self.windows.nosync = self._durations()
            assert self.ctx is not None
            barrier(self.ctx)
            state.enter("gather")

    def _durations(self) -> List[Dict[str, float]]:
        assert self.clock is not None
        self.clock.synchronize()
        return [marks.durations() for marks in self.stage_marks]

    def _open(self, stage: str, steps: int = 0) -> None:
        """A timed window from here: the ranks aligned, the device idle."""
        ctx, clock = self.ctx, self.clock
        assert ctx is not None and clock is not None
        self.state.enter(stage)
        self.stage_marks = []
        if stage == "measure":
            self.measure_steps = steps
            self.reporter.phase("measure", steps=steps)
            reset_peak_memory(ctx)
            if ctx.is_cuda and ctx.device.index is not None:
                self.sampler = GpuSampler(nvml_index(ctx.device.index)).__enter__()
            self.cpu_before = CpuSnapshot.now()
        clock.synchronize()
        barrier(ctx)
        self.t0 = time.perf_counter()

    def _calibrated_steps(self) -> int:
        assert self.ctx is not None and self.s.measure_seconds is not None
        step_ms = statistics.median(d["step"] for d in self._durations())
        # Every rank must run the same number of steps: the slowest rank's estimate.
        estimate = torch.tensor([step_ms], device=self.ctx.device)
        dist.all_reduce(estimate, op=dist.ReduceOp.MAX)
        return max(1, math.ceil(self.s.measure_seconds * 1e3 / float(estimate.item())))

    def _close_measure(self) -> None:
        self.windows.measured = self._durations()
        self.windows.window_s = time.perf_counter() - self.t0
        if self.sampler is not None:
            self.sampler.__exit__(None, None, None)
            self.finisher.gpu = self.sampler.summary()
        assert self.cpu_before is not None
        self.windows.cpu = CpuSnapshot.now().since(self.cpu_before)
        self.finisher.windows = self.windows
        if self.state.ddp is not None:  # before the probe's no_sync steps part the ranks
            started = time.perf_counter()
            self.finisher.check_input = (
                self.sampled_grads,
                parameter_summary(list(self.state.ddp.module.parameters())),
                self.check_spent_s + time.perf_counter() - started,
            )

    def _start_probe(self) -> None:
        state = self.state
        why_not = state.probe_unsafe()
        if why_not:
            self.finisher.probe_note = f"not run: {why_not}"
            state.enter("gather")
            return
        self.reporter.phase("sync_probe")
        ddp = state.ddp
        assert ddp is not None
        self.finisher.probe_note = "ran after the measured window"
        self.logging = {field: [] for field in DDP_LOGGING_FIELDS.values()}
        if self.s.strategy != "ddp":
            gathered = ", parameters are still gathered" if self.s.strategy != "replicate" else ""
            self.finisher.probe_note = (
                f"no_sync only ({self.s.strategy} has no DDP runtime logging; its no_sync turns "
                f"gradient reduction off{gathered})"
            )
            state.enter("nosync_warm")
            return
        try:
            ddp._set_ddp_runtime_logging_sample_rate(1)
        except AttributeError:  # private API: absent in some builds
            self.finisher.probe_note = "no_sync only (this torch's DDP has no runtime logging)"
            state.enter("nosync_warm")
            return
        state.enter("logging")

    def _log_ddp_step(self) -> None:
        """DDP's logging data read after step k describes step k-1: the first is skipped."""
        state = self.state
        ddp = state.ddp
        assert ddp is not None
        if state.stage_steps > 1:
            data = ddp._get_ddp_logging_data()
            for key, name in DDP_LOGGING_FIELDS.items():
                if isinstance(data.get(key), int) and data[key] > 0:
                    self.logging[name].append(data[key] / 1e6)
        if state.stage_steps > self.s.sync_probe_steps:
            with contextlib.suppress(AttributeError):
                ddp._set_ddp_runtime_logging_sample_rate(DDP_DEFAULT_LOGGING_SAMPLE_RATE)
            self.windows.ddp_timings = {
                name: (sum(v) / len(v) if v else None) for name, v in self.logging.items()
            }
            state.enter("nosync_warm")  # the first no_sync step re-warms the autograd graph
