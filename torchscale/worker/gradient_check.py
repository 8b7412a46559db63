"""Every run proves its gradients: run on every rank after the measured window, outside it.

1. **Parameters agree.** Each rank's (unsharded) parameters, summarised per tensor (sum, sum of
   squares, a position-weighted sum, in float64), are gathered and compared with rank 0's.
2. **Gradients equal a reference.** The first measured step's micro-batch (each rank kept its own)
   goes through the wrapped model again, forward and backward with gradient synchronisation on, as
   the strategy runs it: that is the gradient ``G`` the strategy gives each rank. An unwrapped copy
   of the model, with the same parameters (built on the meta device, so nothing is initialised
   only to be overwritten), takes the same batch: that is the rank's own gradient ``L_r``. Every
   rank's ``L_r`` is gathered (a collective that moves bytes and adds nothing) and summed here in
   float64: their mean ``R`` is the gradient of the whole global batch's loss, since each rank's
   loss is a mean over an equal micro-batch. ``G`` must equal ``R`` within the precision's
   tolerance. Each rank runs one reference pass, not one per rank, so the check costs about two
   steps at any rank count.
3. **Naming the fault.** ``G`` is fitted as a mix of each rank's own gradient ``L_r`` (least squares
   over a fixed sample of elements): ``G = sum_r c_r L_r / n``. A healthy reduction gives every
   ``c_r = 1``; a reduction that sums instead of averaging gives every ``c_r = n``; a rank that
   scales its gradients before the reduction gives its ``c_r`` that factor; a rank that skipped
   synchronisation gives its own ``c_r = n`` and the others 0. The cause names the rank and factor.

Dropout draws the same masks in both passes (the RNG is seeded alike per batch). Every step of the
check is timed; its cost is the record's ``gradient_check.check_s``.
"""

from __future__ import annotations

import math
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn

from torchscale.config.settings import CellSettings
from torchscale.runtime.process_group import RankContext
from torchscale.worker.strategies import full

TOLERANCES = {"fp32": 1e-3, "bf16": 5e-2, "amp": 2e-2}
"""Relative error ``|G - R| / |R|`` allowed per precision. fp32: the reduction's summation order
(and fused kernels) change the last bits of each element, far below 1e-3; a low precision's
rounding of parameters and activations moves the gradient by a few per cent."""
PARAMETER_TOLERANCE = 1e-5
"""Relative difference allowed between two ranks' parameter summaries (the same model: 0)."""
FACTOR_TOLERANCE = 0.05
"""How far a fitted share ``c_r`` may sit from 1 before a rank is named."""
SAMPLE_ELEMENTS = 1 << 18
"""Gradient elements used to fit the shares (evenly spaced over the whole gradient)."""
GATHER_ELEMENTS = 1 << 22
"""Gradient elements gathered from every rank at a time (bounds the gather's memory)."""
SEED_OFFSET = 7919


def _call(model: Any, inputs: Any) -> Any:
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def _to(value: Any, device: torch.device) -> Any:
    if torch.is_tensor(value):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_to(v, device) for v in value)
    return value


def _flat_grads(params: Sequence[nn.Parameter]) -> torch.Tensor:
    """Every parameter's whole gradient (DTensors gathered), flattened, float32."""
    parts = []
    for p in params:
        if p.grad is None:
            parts.append(torch.zeros(p.numel(), device=full(p.detach()).device))
        else:
            parts.append(full(p.grad.detach()).float().flatten())
    return torch.cat(parts) if parts else torch.zeros(0)


def parameter_summary(params: Sequence[nn.Parameter]) -> torch.Tensor:
    """Per parameter: sum, sum of squares and a position-weighted sum of the whole tensor."""
    rows = []
    for p in params:
        value = full(p.detach()).double().flatten()
        ramp = torch.linspace(1.0, 2.0, value.numel(), dtype=torch.float64, device=value.device)
        rows.append(torch.stack([value.sum(), (value * value).sum(), (value * ramp).sum()]))
    return torch.stack(rows) if rows else torch.zeros((0, 3), dtype=torch.float64)


def parameters_disagree(
    summaries: Sequence[torch.Tensor], tolerance: float = PARAMETER_TOLERANCE
) -> Optional[str]:
    """The first rank whose parameter summary differs from rank 0's, as one line; else None."""
    base = summaries[0]
    for rank, other in enumerate(summaries[1:], 1):
        scale = base.abs().clamp_min(1e-12)
        worst = float(((other - base).abs() / scale).max()) if base.numel() else 0.0
        if worst > tolerance:
            return (
                f"rank {rank}'s parameters differ from rank 0's after the window (max relative "
                f"difference {worst:.2g}): the ranks no longer train the same model"
            )
    return None


NOT_FINITE = "the gradients were not finite (a diverged loss or an overflow): not checked"
"""Why a check fitted nothing: a factor fitted to NaN or infinite gradients means nothing."""


def fit_shares(observed: torch.Tensor, own: torch.Tensor) -> List[float]:
    """Least-squares ``c`` with ``observed = own.T @ c / n`` (``own``: one row per rank)."""
    n = own.shape[0]
    design = (own.double() / n).T
    solution = torch.linalg.lstsq(design.cpu(), observed.double().cpu().unsqueeze(1)).solution
    return [float(v) for v in solution.flatten()]


def _close(value: float, target: float) -> bool:
    return abs(value - target) <= FACTOR_TOLERANCE * max(1.0, abs(target))


def cause(
    rank: int, shares: Sequence[float], relative_error: float, tolerance: float, precision: str
) -> Optional[str]:
    """One line naming what is wrong with rank ``rank``'s gradients, or None when they pass."""
    n = len(shares)
    if relative_error <= tolerance and all(_close(c, 1.0) for c in shares):
        return None
    if (
        n > 1
        and _close(shares[rank], float(n))
        and all(_close(c, 0.0) for r, c in enumerate(shares) if r != rank)
    ):
        return (
            f"rank {rank}'s gradients are its own batch's only ({shares[rank]:.2f}x its share, "
            "the other ranks' 0.00x): gradient synchronisation was skipped"
        )
    off = [r for r, c in enumerate(shares) if not _close(c, 1.0)]
    if off and len(off) == n and all(_close(c, shares[0]) for c in shares):
        factor = shares[0]
        why = (
            "a reduction that sums instead of averaging"
            if n > 1 and _close(factor, float(n))
            else "every rank's gradients scaled alike"
        )
        return f"rank {rank}'s gradients are {factor:.2f}x the reference: {why}"
    if off:
        worst = max(off, key=lambda r: abs(shares[r] - 1.0))
        return (
            f"rank {worst}'s gradients are {shares[worst]:.2f}x the reference in the reduction "
            f"(seen on rank {rank}): a gradient scaled on that rank before it was reduced"
        )
    return (
        f"rank {rank}'s gradients differ from the reference by {relative_error:.2g} (relative), "
        f"beyond the {precision} tolerance {tolerance:g}"
    )


def _empty_build(run: Any, module: nn.Module, device: torch.device) -> Optional[nn.Module]:
    """The model built on the meta device and given uninitialised storage on ``device``, or None
    where that cannot stand in for a real build: a build that fails on meta, a tensor left on
    meta (not a parameter or buffer), or parameters and buffers that ``module``'s do not cover
    (a tie broken by ``to_empty``, a buffer the copy would leave uninitialised)."""
    try:
        with torch.device("meta"):
            built: nn.Module = run.spec.build()
        built = built.to_empty(device=device)
    except Exception:  # a user's build may not run on meta: build it for real
        return None
    left_on_meta = any(
        torch.is_tensor(value) and value.is_meta
        for sub in built.modules()
        for value in vars(sub).values()
    )
    params = {name for name, _ in built.named_parameters()}
    buffers = {name for name, _ in built.named_buffers()}
    if (
        left_on_meta
        or params != {name for name, _ in module.named_parameters()}
        or not buffers <= {name for name, _ in module.named_buffers()}
    ):
        return None
    return built


def _reference_model(run: Any, module: nn.Module, device: torch.device) -> nn.Module:
    """An unwrapped copy of ``module`` with its current (whole) parameters and buffers."""
    reference = _empty_build(run, module, device) or run.spec.build().to(device)
    if run.applied.get("channels_last"):
        reference = reference.to(memory_format=torch.channels_last)
    own = dict(module.named_parameters())
    with torch.no_grad():
        for name, param in reference.named_parameters():
            param.copy_(full(own[name].detach()))
        buffers = dict(module.named_buffers())
        for name, buffer in reference.named_buffers():
            if name in buffers:
                buffer.copy_(buffers[name])
    reference.train(module.training)
    return reference


def _global_mean(local: torch.Tensor, n: int) -> torch.Tensor:
    """The mean over ranks of every rank's ``local`` (same size everywhere), summed here in
    float64 from gathered chunks: the gather moves bytes only, so no reduction but this one
    enters the reference."""
    total = torch.zeros_like(local, dtype=torch.float64)
    for begin in range(0, local.numel(), GATHER_ELEMENTS):
        chunk = local[begin : begin + GATHER_ELEMENTS].contiguous()
        parts = [torch.empty_like(chunk) for _ in range(n)]
        dist.all_gather(parts, chunk)
        segment = total[begin : begin + GATHER_ELEMENTS]
        for part in parts:
            segment.add_(part)  # float32 into float64, no float64 copy of the part
    return total.div_(n)


def _backward(model: Any, inputs: Any, targets: Any, run: Any, autocast: Any) -> None:
    with autocast():
        loss = run.spec.loss(_call(model, inputs), targets)
    loss.backward()


def check_gradients(
    run: Any, settings: CellSettings, ctx: RankContext, batch: Optional[Tuple[Any, Any]]
) -> Dict[str, Any]:
    """This rank's GradientCheck fields (see the module docstring). Every rank calls it."""
    started = time.perf_counter()
    module: nn.Module = run.module
    params = [p for p in module.parameters() if p.requires_grad]
    precision = settings.precision
    tolerance = TOLERANCES.get(precision, TOLERANCES["bf16"])
    n = ctx.world_size
    # 1. parameters agree across ranks
    summary = parameter_summary(params)
    gathered = [torch.empty_like(summary) for _ in range(n)]
    dist.all_gather(gathered, summary)
    problem = parameters_disagree(gathered)
    # 2. this rank's kept batch through the wrapped model (synchronised), then the reference
    kept: List[Any] = [None] * n
    dist.all_gather_object(kept, batch is not None)
    if not all(kept) or batch is None:
        return {"rank": ctx.rank, "passed": True, "skipped": "no measured batch was kept"}
    inputs, targets = _to(batch, ctx.device)
    run.optimizer.zero_grad(set_to_none=True)
    torch.manual_seed(settings.seed + SEED_OFFSET + ctx.rank)
    _backward(run.forward, inputs, targets, run, run._autocast)
    observed = _flat_grads(params)
    run.optimizer.zero_grad(set_to_none=True)
    reference = _reference_model(run, module, ctx.device)
    torch.manual_seed(settings.seed + SEED_OFFSET + ctx.rank)  # the replay's dropout masks
    _backward(reference, inputs, targets, run, run.reference_autocast)
    local = _flat_grads([p for p in reference.parameters() if p.requires_grad])
    del reference
    expected = _global_mean(local, n)
    error = observed.double().sub_(expected)
    relative = float(error.norm() / expected.norm().clamp_min(1e-30))
    del error
    stride = max(1, math.ceil(observed.numel() / SAMPLE_ELEMENTS))
    sample = local[::stride].contiguous()
    own = [torch.empty_like(sample) for _ in range(n)]
    dist.all_gather(own, sample)
    if not (
        bool(torch.isfinite(observed).all())
        and bool(torch.isfinite(expected).all())
        and all(bool(torch.isfinite(o).all()) for o in own)
    ):
        # A diverged loss (the record is invalid for it already) or an overflow in reduced
        # precision: no factor can be fitted, and none is claimed.
        return {
            "rank": ctx.rank,
            "passed": problem is None,
            "cause": problem,
            "skipped": NOT_FINITE,
            "check_s": time.perf_counter() - started,
        }
    shares = fit_shares(observed[::stride], torch.stack(own))
    problem = problem or cause(ctx.rank, shares, relative, tolerance, precision)
    del local, expected, own
    return {
        "rank": ctx.rank,
        "passed": problem is None,
        "cause": problem,
        "relative_error": relative,
        "tolerance": tolerance,
        "shares": shares,
        "check_s": time.perf_counter() - started,
    }


SCRIPT_SAMPLE = 4096
"""Gradient elements a script cell keeps per parameter (evenly spaced)."""
SYNCED_TOLERANCE = 1e-5
"""Relative spread allowed between ranks' synchronised gradients (an all-reduce gives every rank
the same result: 0)."""


def sample_gradients(params: Sequence[nn.Parameter]) -> torch.Tensor:
    """Up to :data:`SCRIPT_SAMPLE` evenly spaced elements of each parameter's gradient, float32
    (zeros where a parameter has none): the same positions on every rank."""
    parts = []
    for p in params:
        numel = p.numel()
        step = max(1, numel // SCRIPT_SAMPLE)
        grad = p.grad
        if grad is None:
            kept = min(len(range(0, numel, step)), SCRIPT_SAMPLE)
            parts.append(torch.zeros(kept, device=p.device))
        else:
            # FSDP2's gradient is this rank's shard: gathered (a collective, on every rank)
            parts.append(full(grad.detach()).reshape(-1)[::step][:SCRIPT_SAMPLE].float())
    return torch.cat(parts).clone() if parts else torch.zeros(0)


def check_synchronised(
    sampled: Optional[torch.Tensor],
    summary: Optional[torch.Tensor],
    ctx: RankContext,
    spent_s: float,
    skipped: Optional[str] = None,
) -> Dict[str, Any]:
    """A script cell's check (its loss is the script's own, so there is no reference): the first
    measured step's gradients (sampled before its optimizer step) must be the same on every rank,
    as a synchronised all-reduce leaves them, and the parameters at the window's end must agree.
    A rank whose gradients differ is fitted against every rank's as
    :func:`check_gradients` fits them against each rank's own, naming rank and factor. Every
    rank calls it (collectives)."""
    started = time.perf_counter()
    n = ctx.world_size
    if sampled is None:
        return {"rank": ctx.rank, "passed": True, "skipped": skipped or "no gradient was sampled"}
    gathered = [torch.empty_like(sampled) for _ in range(n)]
    dist.all_gather(gathered, sampled)
    stack = torch.stack(gathered).double()
    if not bool(torch.isfinite(stack).all()):
        return {
            "rank": ctx.rank,
            "passed": True,
            "skipped": NOT_FINITE,
            "check_s": spent_s + time.perf_counter() - started,
        }
    mean = stack.mean(0)
    scale = float(mean.norm().clamp_min(1e-30))
    spread = [float((row - mean).norm()) / scale for row in stack]
    relative = max(spread)
    problem = None
    shares: Optional[List[float]] = None
    if relative > SYNCED_TOLERANCE:
        shares = fit_shares(stack[ctx.rank], stack)
        problem = cause(ctx.rank, shares, relative, SYNCED_TOLERANCE, "synchronised")
        if problem is None:
            worst = max(range(n), key=lambda r: spread[r])
            problem = (
                f"rank {worst}'s gradients differ from the ranks' mean by {spread[worst]:.2g} "
                "(relative): the ranks' gradients were not synchronised"
            )
    if summary is not None:
        summaries = [torch.empty_like(summary) for _ in range(n)]
        dist.all_gather(summaries, summary)
        problem = problem or parameters_disagree(summaries)
    return {
        "rank": ctx.rank,
        "passed": problem is None,
        "cause": problem,
        "relative_error": relative,
        "tolerance": SYNCED_TOLERANCE,
        "shares": shares,
        "check_s": spent_s + time.perf_counter() - started,
    }
