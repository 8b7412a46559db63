"""The timed windows of one rank, and what this rank reports about them.

1. warm-up: ``warmup_steps``, discarded (allocator, cuDNN autotuning, compile).
2. measured: the throughput window, ranks aligned by a barrier, the host clock read after a device
   synchronize at both ends; per-step times from the device timeline. With ``epochs``, one such
   window per whole pass over the data (each epoch timed on its own); with ``sync_cuda``, the
   device is synchronised after every step too (strict timing).
3. sync probe, DDP logging: DDP's runtime logging at every step (sample rate 1) for per-step
   forward/backward compute, communication and overlap. It synchronises CUDA events each step, so
   it runs in its own window, never in the measured one.
4. sync probe, no_sync: the same steps under ``no_sync()`` give the compute-only step time;
   ``sync overhead = 1 - t_nosync / t_ddp``.
"""

from __future__ import annotations

import contextlib
import math
import resource
import statistics
import time
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from torchscale.config.settings import CellSettings
from torchscale.measures.stats import mean, time_stats
from torchscale.results.rank_files import RankReporter
from torchscale.runtime.clock import Clock
from torchscale.runtime.process_group import RankContext
from torchscale.worker.batches import LoaderBatches
from torchscale.worker.collective_count import count_collectives
from torchscale.worker.cpu_accounting import CpuSnapshot
from torchscale.worker.gpu_sampler import GpuSampler, nvml_index
from torchscale.worker.gradient_check import check_gradients
from torchscale.worker.strategies import local
from torchscale.worker.training import TrainingRun

# DDP logging keys (nanoseconds, for the previous iteration) -> RankResult fields.
DDP_LOGGING_FIELDS = {
    "forward_compute_time": "ddp_forward_compute_ms",
    "backward_compute_time": "ddp_backward_compute_ms",
    "backward_comm_time": "ddp_backward_comm_ms",
    "backward_compute_comm_overlap_time": "ddp_backward_overlap_ms",
}


# What DDP reports about its own configuration (logging data), kept in the record as evidence
# of what actually ran.
DDP_CONFIG_KEYS = (
    "comm_hook", "bucket_cap_bytes", "bucket_sizes", "gradient_as_bucket_view", "static_graph",
    "find_unused_parameters", "broadcast_buffers", "num_parameter_tensors",
    "total_parameter_size_bytes", "has_rebuilt_buckets", "backend_name",
)  # fmt: skip


def ddp_config(run: TrainingRun) -> Dict[str, Any]:
    """DDP's own account of its configuration (nothing for the FSDP-based strategies, whose
    configuration is the record's ``runtime.strategy``)."""
    return ddp_report(run.ddp) if run.ddp is not None else {}


def ddp_report(ddp: DDP) -> Dict[str, Any]:
    """What ``ddp`` reports about its own configuration (a user's script's DDP too)."""
    try:
        data = ddp._get_ddp_logging_data()
    except AttributeError:  # private API: absent in some builds
        data = {}
    config: Dict[str, Any] = {key: data[key] for key in DDP_CONFIG_KEYS if key in data}
    # The logging data keeps the construction-time layout (one bucket until the reducer rebuilds
    # buckets after the first step); the reducer itself knows the buckets in use. Reading them
    # copies the gradients once, so this runs after memory has been measured.
    try:
        buckets = ddp.reducer._get_zeros_like_grad_buckets()
        config["bucket_sizes"] = [b.buffer().numel() * b.buffer().element_size() for b in buckets]
        del buckets
    except (AttributeError, RuntimeError):  # private API, or no memory left for the copy
        config.pop("bucket_sizes", None)
    return config


def barrier(ctx: RankContext) -> None:
    """All ranks of the job here (on GPUs, on this rank's device)."""
    if ctx.is_cuda:
        dist.barrier(device_ids=[ctx.device.index])
    else:
        dist.barrier()


def _window(
    run: TrainingRun,
    clock: Clock,
    ctx: RankContext,
    steps: int,
    sync: bool = True,
    strict: bool = False,
) -> Tuple[List[Dict[str, float]], float]:
    """Run ``steps`` steps between aligned, synchronised clock reads: (per-step phases, wall s).
    ``strict`` (``sync_cuda``) also synchronises the device after every step."""
    clock.synchronize()
    barrier(ctx)
    start = time.perf_counter()
    marks = []
    for _ in range(steps):
        marks.append(run.step(clock, sync=sync))
        if strict:
            clock.synchronize()
    clock.synchronize()
    wall = time.perf_counter() - start
    return [m.durations() for m in marks], wall


CALIBRATION_STEPS = 3
"""Steps timed after warm-up to turn ``measure_seconds`` into a step count. The warm-up itself is
no guide: its first steps include compilation and allocator growth."""


def _measure_steps(settings: CellSettings, run: TrainingRun, clock: Clock, ctx: RankContext) -> int:
    if settings.measure_steps is not None:
        return settings.measure_steps
    seconds = settings.measure_seconds
    if seconds is None:  # the config's validation requires one of the two
        raise ValueError("neither measure_steps nor measure_seconds is set")
    calibration, _ = _window(run, clock, ctx, CALIBRATION_STEPS)
    step_ms = statistics.median(d["step"] for d in calibration)
    # All ranks must run the same number of steps: agree on the slowest rank's estimate.
    estimate = torch.tensor([step_ms], device=ctx.device)
    dist.all_reduce(estimate, op=dist.ReduceOp.MAX)
    return max(1, math.ceil(seconds * 1e3 / float(estimate.item())))


def _passes(settings: CellSettings, run: TrainingRun, clock: Clock, ctx: RankContext) -> List[int]:
    """The measured windows' step counts: one window, or with ``epochs`` one per pass over the
    data (a pass's steps, capped by measure_steps or measure_seconds when given; synthetic data
    has no passes: an epoch is measure_steps or measure_seconds)."""
    if settings.epochs is None:
        return [_measure_steps(settings, run, clock, ctx)]
    if not isinstance(run.batches, LoaderBatches):  # synthetic: an epoch is a measured window
        return [_measure_steps(settings, run, clock, ctx)] * settings.epochs
    per_pass = len(run.batches) // run.accum_steps
    if per_pass < 1:
        raise ValueError(
            f"one pass over data.path gives {len(run.batches)} batches per rank, fewer than "
            f"grad_accum_steps ({run.accum_steps}): no whole step per epoch"
        )
    capped = settings.measure_steps is not None or settings.measure_seconds is not None
    steps = min(per_pass, _measure_steps(settings, run, clock, ctx)) if capped else per_pass
    return [steps] * settings.epochs


def _measured(
    run: TrainingRun, settings: CellSettings, clock: Clock, ctx: RankContext, passes: List[int]
) -> Tuple[List[Dict[str, float]], float, List[Dict[str, Any]]]:
    """The measured window(s): (per-step phases, wall s, each epoch's steps and wall s)."""
    if settings.epochs is None:
        measured, wall = _window(run, clock, ctx, passes[0], strict=settings.sync_cuda)
        return measured, wall, []
    measured, wall, epochs = [], 0.0, []
    for number, steps in enumerate(passes, 1):
        if isinstance(run.batches, LoaderBatches):
            run.batches.start_pass()  # an epoch is a whole pass: not the warm-up's leftovers
        phases, seconds = _window(run, clock, ctx, steps, strict=settings.sync_cuda)
        measured += phases
        wall += seconds
        epochs.append({"epoch": number, "steps": steps, "window_s": seconds})
    return measured, wall, epochs


# torch's kDDPRuntimeLoggingSampleRate (c10d/reducer.hpp): DDP's default, restored after the
# probe. At rate 1 every forward records CUDA events and synchronises on the last step's.
DDP_DEFAULT_LOGGING_SAMPLE_RATE = 100


def _ddp_logging_probe(run: TrainingRun, clock: Clock, steps: int) -> Dict[str, Optional[float]]:
    """Mean per-step DDP timings over ``steps`` steps, from DDP's own logging data."""
    if run.ddp is None:
        return {}
    try:
        run.ddp._set_ddp_runtime_logging_sample_rate(1)
    except AttributeError:  # private API: absent in some builds
        return {}
    samples: Dict[str, List[float]] = {field: [] for field in DDP_LOGGING_FIELDS.values()}
    try:
        for index in range(steps + 1):
            run.step(clock)
            if index == 0:
                continue  # the logging data read after step k describes step k-1
            data = run.ddp._get_ddp_logging_data()
            for key, field in DDP_LOGGING_FIELDS.items():
                if isinstance(data.get(key), int) and data[key] > 0:
                    samples[field].append(data[key] / 1e6)
        clock.synchronize()
    finally:  # later windows (the profiled one) must not pay for per-step logging
        run.ddp._set_ddp_runtime_logging_sample_rate(DDP_DEFAULT_LOGGING_SAMPLE_RATE)
    return {field: mean(values) for field, values in samples.items()}


def reset_peak_memory(ctx: RankContext) -> None:
    """Start the peak-memory count at the measured window: warm-up, compilation and cuDNN
    autotuning workspaces are not the training step's footprint. On CPU the process's peak RSS
    (VmHWM) is reset through ``/proc/self/clear_refs``, so a cell run in a warm group reports its
    own peak, not an earlier cell's."""
    if ctx.is_cuda:
        torch.cuda.reset_peak_memory_stats(ctx.device)
        return
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # 5: reset the peak resident set size to the current one


def peak_rss_bytes() -> int:
    """This process's peak RSS since the last reset (``VmHWM``), else since it started."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def activation_bytes(
    peak: int, params: int, grads: int, optimizer: int, gradient_as_bucket_view: bool
) -> int:
    """What the peak holds besides the model state. Without ``gradient_as_bucket_view`` DDP keeps
    the gradients twice: in ``.grad`` and in its flat communication buckets."""
    gradient_copies = 1 if gradient_as_bucket_view else 2
    return max(0, peak - params - gradient_copies * grads - optimizer)


def _memory(run: TrainingRun, ctx: RankContext) -> Dict[str, Any]:
    # Without DDP's buckets a gradient is held once; FSDP2's are this rank's shards.
    once = run.ddp is None or bool(getattr(run.ddp, "gradient_as_bucket_view", False))
    return memory_stats(list(run.module.parameters()), run.optimizer, ctx, once)


def _window_memory(window: Dict[str, Any], end: Dict[str, Any]) -> Dict[str, Any]:
    """The window's peak (and what of it was activations) with the model state as the run ends.
    State is made lazily (Adam's moments at the first optimizer step taken): a window whose steps
    a GradScaler all skipped has none yet, though the run holds it as soon as a step is taken."""
    peak = ("peak_bytes", "peak_kind", "activations_peak_bytes")
    return {**end, **{key: window[key] for key in peak}}


def memory_stats(
    params: List[torch.Tensor],
    optimizer: Optional[torch.optim.Optimizer],
    ctx: RankContext,
    bucket_view: bool,
) -> Dict[str, Any]:
    """This rank's MemoryStats fields: the model state of ``params`` and ``optimizer``, and the
    peak since :func:`reset_peak_memory`."""
    # A sharded parameter (FSDP2's DTensor) counts what this rank holds: its local shard.
    held = [local(p) for p in params]
    param_bytes = sum(p.numel() * p.element_size() for p in held)
    grad_bytes = sum(h.numel() * h.element_size() for p, h in zip(params, held) if p.requires_grad)
    optimizer_bytes = sum(
        local(t).numel() * local(t).element_size()
        for state in (optimizer.state.values() if optimizer is not None else ())
        for t in state.values()
        if torch.is_tensor(t)
    )
    if ctx.is_cuda:
        peak = torch.cuda.max_memory_allocated(ctx.device)
        activations: Optional[int] = activation_bytes(
            peak, param_bytes, grad_bytes, optimizer_bytes, bucket_view
        )
        kind = "cuda_allocated"
    else:
        peak = peak_rss_bytes()
        activations, kind = None, "rss"
    return {
        "params_bytes": param_bytes,
        "grads_bytes": grad_bytes,
        "optimizer_bytes": optimizer_bytes,
        "activations_peak_bytes": activations,
        "peak_bytes": peak,
        "peak_kind": kind,
    }


def json_float(value: float) -> Union[float, str]:
    """``value``, or ``"NaN"``/``"Infinity"``/``"-Infinity"``: strict JSON has no such numbers
    (torchscale writes them as null), and a diverged loss must reach the launcher as one."""
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"


def last_loss(run: TrainingRun) -> Optional[Union[float, str]]:
    """The loss of this rank's last step (its last micro-batch), as :func:`json_float` writes
    it; None when no step ran."""
    if run.last_loss is None:
        return None
    return json_float(float(run.last_loss.float().item()))


def warmup_steps(settings: CellSettings) -> int:
    """Warm-up steps a rank runs: ``warmup_steps``, at least one (the first step builds state)."""
    return max(settings.warmup_steps, 1)


def measure_rank(
    run: TrainingRun, settings: CellSettings, ctx: RankContext, reporter: RankReporter
) -> Dict[str, Any]:
    """Run every window on this rank and return its RankResult fields."""
    clock = Clock(ctx.device)
    reporter.phase("warmup")
    _window(run, clock, ctx, warmup_steps(settings))
    passes = _passes(settings, run, clock, ctx)
    steps = sum(passes)

    reporter.phase("measure", steps=steps)
    reset_peak_memory(ctx)
    run.keep_next_batch = True  # the gradient check's batch: the first measured step's
    sampler = GpuSampler(nvml_index(ctx.device.index)) if ctx.is_cuda else contextlib.nullcontext()
    cpu_before = CpuSnapshot.now()
    with sampler:
        measured, wall, epochs = _measured(run, settings, clock, ctx, passes)
    cpu = CpuSnapshot.now().since(cpu_before)
    loss = last_loss(run)  # after the window: reading it waits for the device
    window = _memory(run, ctx)  # the window's peak, before the check's reference copy
    # Before the sync probe, whose no_sync steps let the ranks' parameters drift apart.
    reporter.phase("gradient_check")
    check = check_gradients(run, settings, ctx, run.kept_batch)
    run.kept_batch = None

    probe = settings.sync_probe_steps
    ddp_timings: Dict[str, Optional[float]] = {}
    nosync: List[Dict[str, float]] = []
    if probe:
        reporter.phase("sync_probe")
        ddp_timings = _ddp_logging_probe(run, clock, probe)
        run.step(clock, sync=False)  # the first no_sync step re-warms the autograd graph
        nosync, _ = _window(run, clock, ctx, probe, sync=False)
        barrier(ctx)
    if run.ddp is None:  # FSDP2 holds no_sync gradients back: this synced step reduces them
        run.step(clock)
    collectives = count_collectives(run)
    memory = _window_memory(window, _memory(run, ctx))

    step_ms = [d["step"] for d in measured]
    nosync_ms = mean([d["step"] for d in nosync])
    # Per-step waits are clipped at zero for their distribution; the mean wait is taken from the
    # means, so timing noise does not bias it upwards.
    waits = [max(0.0, s - nosync_ms) for s in step_ms] if nosync_ms is not None else []
    step_mean = mean(step_ms)
    mean_wait = (
        max(0.0, step_mean - nosync_ms) if nosync_ms is not None and step_mean is not None else None
    )
    return {
        "rank": ctx.rank,
        "local_rank": ctx.local_rank,
        "host": ctx.host,
        "device": str(ctx.device),
        "measure_steps": steps,
        "window_s": wall,
        "epochs": epochs,
        "step_time_ms": time_stats(step_ms),
        "step_times_ms": step_ms,
        "data_ms": mean([d["data"] for d in measured]),
        "forward_ms": mean([d["forward"] for d in measured]),
        "backward_ms": mean([d["backward"] for d in measured]),
        "optimizer_ms": mean([d["optimizer"] for d in measured]),
        "nosync_step_ms": nosync_ms,
        "sync_wait_ms": mean_wait,
        "sync_wait_samples_ms": waits,
        **ddp_timings,
        "last_loss": loss,
        "memory": memory,
        "gradient_check": check,
        "collectives": collectives,
        "gpu": sampler.summary() if isinstance(sampler, GpuSampler) else None,
        "timeline_s": reporter.timeline(),
        "process_started_at": reporter.process_started_at(),
        **cpu,
    }
