"""One rank's training setup and step: model, data-parallel wrapper, optimizer, precision, data.

The step is the standard data-parallel loop, so what is timed is what users run: forward under
autocast, backward (DDP all-reduces gradient buckets as they become ready; FSDP2 reduce-scatters
each block's), optimizer step, zero_grad. With gradient accumulation, all micro-batches but the
last run under ``no_sync()`` (FSDP2: gradient sync off). The wrapper is the ``strategy`` knob's
(``worker/strategies.py``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, Iterator, Optional, Tuple

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from torchscale.config.settings import CellSettings
from torchscale.hardware.peaks import peak_precision
from torchscale.models import ModelSpec
from torchscale.results.rank_files import StepTracker
from torchscale.runtime.clock import Clock, StepMarks
from torchscale.runtime.process_group import RankContext
from torchscale.worker.batches import batch_stream
from torchscale.worker.comm_hooks import register_comm_hook
from torchscale.worker.strategies import fsdp_no_sync, wrap_fsdp

Annotate = Callable[[str], ContextManager[Any]]


def _unannotated(name: str) -> ContextManager[Any]:
    return contextlib.nullcontext()


AUTOCAST_DTYPES = {"amp": torch.float16, "bf16": torch.bfloat16}
LEARNING_RATES = {"sgd": 0.01, "adamw": 1e-4}


def _call(model: Callable[..., Any], inputs: Any) -> Any:
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def _implementation(impl: str, name: str, device: torch.device) -> Dict[str, Any]:
    """The optimizer's ``foreach``/``fused`` arguments for ``optimizer_impl``."""
    if impl == "auto":
        # Fused AdamW is what fast GPU training uses; elsewhere PyTorch picks.
        return {"fused": True} if name == "adamw" and device.type == "cuda" else {}
    return {"foreach": impl == "foreach", "fused": impl == "fused"}


def _optimizer(
    name: str, model: nn.Module, device: torch.device, impl: str = "auto"
) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    how = _implementation(impl, name, device)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=LEARNING_RATES["adamw"], **how)
    return torch.optim.SGD(params, lr=LEARNING_RATES["sgd"], momentum=0.9, **how)


def _applied_impl(optimizer: torch.optim.Optimizer) -> str:
    """What the optimizer was built with: fused, foreach, forloop, or auto (PyTorch decides)."""
    defaults = optimizer.defaults
    if defaults.get("fused"):
        return "fused"
    if defaults.get("foreach") is None:
        return "auto"
    return "foreach" if defaults["foreach"] else "forloop"


@dataclass
class TrainingRun:
    """Everything one rank needs to run timed steps."""

    spec: ModelSpec
    ddp: Optional[DDP]  # None for the FSDP-based strategies
    model: nn.Module  # the wrapped model: the DDP module, or the model FSDP2 wrapped in place
    forward: Callable[..., Any]  # the wrapped model, or its torch.compile wrapper
    optimizer: torch.optim.Optimizer
    scaler: Optional[Any]
    autocast_dtype: Optional[torch.dtype]
    batches: Iterator[Tuple[Any, Any]]
    accum_steps: int
    device: torch.device
    comm_state: Optional[Any] = None
    tracker: Optional[StepTracker] = None
    applied: Dict[str, Any] = field(default_factory=dict)  # what ran, for the record
    last_loss: Optional[torch.Tensor] = None  # the last micro-batch's loss, on the device
    precision_dtype: Optional[torch.dtype] = None  # the low precision's, whatever casts to it
    keep_next_batch: bool = False  # keep the next step's first micro-batch (gradient check)
    kept_batch: Optional[Tuple[Any, Any]] = None

    @property
    def module(self) -> nn.Module:
        """The user's module (parameters, as the optimizer sees them: local shards with FSDP2)."""
        return self.ddp.module if self.ddp is not None else self.model

    def no_sync(self) -> ContextManager[Any]:
        """Gradient synchronisation off for the steps run inside (compute only)."""
        if self.ddp is not None:
            return self.ddp.no_sync()
        return fsdp_no_sync(self.model)

    def _autocast(self) -> ContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def reference_autocast(self) -> ContextManager[Any]:
        """The precision's autocast, for an unwrapped copy of the model (the gradient check)."""
        if self.precision_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.precision_dtype)

    def step(
        self, clock: Clock, sync: bool = True, annotate: Optional[Annotate] = None
    ) -> StepMarks:
        """One optimizer step; ``sync=False`` runs it all under no_sync (compute only).

        ``annotate(name)`` wraps the forward, backward and optimizer phases (profiler ranges).
        """
        phase = annotate or _unannotated
        tracker = self.tracker
        if tracker:
            tracker.start_step()
        marks = StepMarks(clock)
        for micro in range(self.accum_steps):
            last = micro == self.accum_steps - 1
            inputs, targets = next(self.batches)
            if self.keep_next_batch:  # a reference kept, nothing copied
                self.kept_batch, self.keep_next_batch = (inputs, targets), False
            data_ready = clock.mark()
            if tracker:
                tracker.phase(1)
            skip_sync = not sync or not last
            with self.no_sync() if skip_sync else contextlib.nullcontext():
                with phase("forward"), self._autocast():
                    outputs = _call(self.forward, inputs)
                    loss = self.spec.loss(outputs, targets)
                    self.last_loss = loss.detach()  # no sync: read after the timed window
                    if self.accum_steps > 1:
                        loss = loss / self.accum_steps
                forward_end = clock.mark()
                if tracker:
                    tracker.phase(2)
                with phase("backward"):
                    (self.scaler.scale(loss) if self.scaler else loss).backward()
                backward_end = clock.mark()
            marks.micro.append((data_ready, forward_end, backward_end))
        if tracker:
            tracker.phase(3)
        with phase("optimizer"):
            if self.scaler:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        marks.end = clock.mark()
        return marks


def _tf32_flags() -> Dict[str, Optional[bool]]:
    """Whether fp32 matmuls (cuBLAS) and cuDNN convolutions run in TF32 right now.

    torch refuses the legacy ``allow_tf32`` read once the newer ``fp32_precision`` API set the
    two cuDNN flags apart (a user's model code may): then ask the new API for convolutions.
    """
    flags: Dict[str, Optional[bool]] = {}
    try:
        flags["matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
    except RuntimeError:
        flags["matmul"] = torch.backends.cuda.matmul.fp32_precision == "tf32"
    try:
        flags["cudnn"] = bool(torch.backends.cudnn.allow_tf32)
    except RuntimeError:
        conv = torch.backends.cudnn.conv  # type: ignore[attr-defined]  # newer torch, not stubbed
        flags["cudnn"] = conv.fp32_precision == "tf32"
    return flags


def apply_math_settings(
    settings: CellSettings, ctx: RankContext, model: nn.Module
) -> Dict[str, Any]:
    """cuDNN autotuning and TF32 as the cell asks; returns what is in force, for the record, and
    the peak MFU is scored against (``peak_precision``)."""
    if ctx.is_cuda:
        torch.backends.cudnn.benchmark = settings.cudnn_benchmark
    if settings.tf32 is not None:  # both through the legacy flags: never mix the two APIs
        torch.backends.cuda.matmul.allow_tf32 = settings.tf32
        torch.backends.cudnn.allow_tf32 = settings.tf32
    tf32 = _tf32_flags()
    has_conv = any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())
    return {
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark) if ctx.is_cuda else None,
        "allow_tf32": tf32,
        "peak_precision": peak_precision(
            settings.precision, bool(tf32["matmul"]), bool(tf32["cudnn"]), has_conv
        ),
    }


def _buffer_sync(each_forward: bool) -> Dict[str, Any]:
    """``ddp.broadcast_buffers``: torch 2.15 renamed it ``forward_sync_buffers`` (the old name
    warns in every rank's log). Both mean rank 0's buffers are sent at each forward; the new one
    also syncs them once at construction, which changes nothing here (same seed on every rank)."""
    import inspect

    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:
        return {"forward_sync_buffers": each_forward}
    return {"broadcast_buffers": each_forward}


def compile_mode(mode: str, ddp: bool) -> None:
    """Dynamo's settings for ``compile``: ddp_optimizer splits the graph at DDP's buckets;
    compiled_autograd traces the backward too (DDP's gradients then through its Python reducer,
    which compiled autograd can see; the C++ reducer's all-reduce it has been seen to skip).
    Per process: a compiled cell runs in a launch of its own."""
    import torch._dynamo.config as dynamo

    dynamo.compiled_autograd = mode == "compiled_autograd"
    if ddp:
        dynamo.optimize_ddp = "python_reducer" if mode == "compiled_autograd" else "ddp_optimizer"


def build_run(settings: CellSettings, spec: ModelSpec, ctx: RankContext) -> TrainingRun:
    """Build model, data-parallel wrapper, optimizer and data for this rank."""
    torch.manual_seed(settings.seed)  # same initial weights on every rank (DDP checks shapes)
    model = spec.build().to(ctx.device)
    channels_last = settings.channels_last and spec.supports_channels_last
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    ddp: Optional[DDP] = None
    comm_state = None
    wrapped: nn.Module = model
    autocast = AUTOCAST_DTYPES.get(settings.precision)
    strategy: Dict[str, Any] = {"strategy": settings.strategy}
    if settings.strategy == "ddp":
        ddp_settings = settings.ddp
        ddp = DDP(
            model,
            device_ids=[ctx.device.index] if ctx.is_cuda else None,
            bucket_cap_mb=ddp_settings.bucket_cap_mb,
            gradient_as_bucket_view=ddp_settings.gradient_as_bucket_view,
            static_graph=ddp_settings.static_graph,
            find_unused_parameters=ddp_settings.find_unused_parameters,
            **_buffer_sync(ddp_settings.broadcast_buffers),
        )
        comm_state = register_comm_hook(ddp, ddp_settings)
        wrapped = ddp
    else:
        strategy = wrap_fsdp(model, settings, ctx)
        autocast = None  # the MixedPrecisionPolicy casts parameters instead
    forward: Callable[..., Any] = wrapped
    if settings.compile:
        compile_mode(settings.compile, ddp is not None)
        forward = torch.compile(
            wrapped, backend=settings.compile_backend, mode=settings.compile_mode
        )
    optimizer_name = spec.optimizer if settings.optimizer == "auto" else settings.optimizer
    scaler = None
    if settings.precision == "amp":
        scaler = torch.amp.GradScaler(ctx.device.type)
    torch.manual_seed(settings.seed + 1000 + ctx.rank)  # different data on every rank
    batches = batch_stream(spec, settings, ctx, channels_last)
    optimizer = _optimizer(optimizer_name, model, ctx.device, settings.optimizer_impl)
    applied = {
        "strategy": strategy,
        "optimizer": type(optimizer).__name__,
        "optimizer_impl": _applied_impl(optimizer),
        "autocast_dtype": str(autocast).replace("torch.", "") if autocast else None,
        "grad_scaler": scaler is not None,
        "channels_last": channels_last,
        "channels_last_applies": spec.supports_channels_last,  # a layout finding's premise
        "compiled": settings.compile_backend if settings.compile else None,
        "compile": settings.compile or "off",
        "intra_op_threads": torch.get_num_threads(),
        "data": settings.data.source,
        "data_workers": settings.data.num_workers if settings.data.source != "synthetic" else 0,
        "sync_cuda": settings.sync_cuda,  # strict timing: synchronised after every step
        **apply_math_settings(settings, ctx, model),
    }
    return TrainingRun(
        spec=spec,
        ddp=ddp,
        model=wrapped,
        forward=forward,
        optimizer=optimizer,
        scaler=scaler,
        autocast_dtype=autocast,
        batches=batches,
        accum_steps=settings.grad_accum_steps,
        device=ctx.device,
        comm_state=comm_state,
        applied=applied,
        precision_dtype=AUTOCAST_DTYPES.get(settings.precision),
    )
