"""How a rank's model is wrapped for data parallelism: the ``strategy`` knob.

* ``ddp``: ``DistributedDataParallel`` (gradient buckets all-reduced during backward).
* ``replicate``: torch's FSDP-based ``replicate`` applied per block, then to the root, as
  torchtitan applies it: parameters replicated, each block's gradients all-reduced as its backward
  ends.
* ``fsdp2``: ``fully_shard`` per block, then the root: parameters, gradients and optimizer state
  sharded across the ranks, each block's parameters all-gathered for its forward (and, with
  ``reshard_after_forward``, again for its backward), its gradients reduce-scattered.
* ``fsdp2_hybrid``: the same on a 2-D mesh (nodes x ranks per node): sharded within a node,
  replicated (all-reduced) across nodes.

Blocks are the children of the model's first ``nn.ModuleList`` (a transformer's layers), else the
root's children that hold parameters. Low precision is FSDP2's ``MixedPrecisionPolicy`` derived from
``precision`` (parameters cast for compute, gradients reduced in fp32) instead of autocast.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Tuple

import torch
from torch import nn

from torchscale.config.settings import CellSettings
from torchscale.runtime.process_group import RankContext

LOW_PRECISION = {"amp": torch.float16, "bf16": torch.bfloat16}
SHARDED = ("fsdp2", "fsdp2_hybrid")


def blocks(model: nn.Module) -> List[nn.Module]:
    """The modules wrapped one by one before the root (see the module docstring)."""
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0:
            return list(module)
    return [child for child in model.children() if any(True for _ in child.parameters())]


_MESHES: Dict[Tuple[str, int, int], Any] = {}


def _mesh(ctx: RankContext, nnodes: int, hybrid: bool) -> Any:
    """The device mesh of this job: 1-D over every rank, or (nodes, ranks per node) for hybrid.
    Built once per process: the cells of a warm group share it (and its process groups)."""
    from torch.distributed.device_mesh import init_device_mesh

    key = (ctx.device.type, ctx.world_size, nnodes if hybrid else 1)
    if key not in _MESHES:
        if hybrid:
            shape: Tuple[int, ...] = (nnodes, ctx.world_size // nnodes)
            _MESHES[key] = init_device_mesh(
                ctx.device.type, shape, mesh_dim_names=("replicate", "shard")
            )
        else:
            _MESHES[key] = init_device_mesh(ctx.device.type, (ctx.world_size,))
    return _MESHES[key]


def mixed_precision(precision: str) -> Any:
    """FSDP2's ``MixedPrecisionPolicy`` for ``precision``: compute in the low dtype, reduce
    gradients in fp32 (fp32: torch's defaults, nothing cast)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = LOW_PRECISION.get(precision)
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def _dtype_name(dtype: Any) -> Any:
    return str(dtype).replace("torch.", "") if dtype is not None else None


def wrap_fsdp(model: nn.Module, settings: CellSettings, ctx: RankContext) -> Dict[str, Any]:
    """Apply replicate / fully_shard per block, then to the root, in place; what was applied."""
    return apply_strategy(
        model,
        settings.strategy,
        ctx,
        precision=settings.precision,
        nnodes=settings.nnodes,
        reshard_after_forward=settings.reshard_after_forward,
    )


def apply_strategy(
    model: nn.Module,
    strategy: str,
    ctx: RankContext,
    precision: str = "fp32",
    nnodes: int = 1,
    reshard_after_forward: bool = True,
) -> Dict[str, Any]:
    """``strategy`` (not ddp) applied to ``model`` in place, per block then the root; what was
    applied. A user's script applies it too (``script/script_strategy.py``), at fp32: its
    precision is its own autocast."""
    policy = mixed_precision(precision)
    mesh = _mesh(ctx, nnodes, strategy == "fsdp2_hybrid")
    options: Dict[str, Any] = {"mesh": mesh, "mp_policy": policy}
    apply: Any
    if strategy == "replicate":  # each imported only when used: a torch may have one only
        from torch.distributed._composable.replicate_with_fsdp import replicate as apply
    else:
        from torch.distributed.fsdp import fully_shard as apply
    if strategy in SHARDED:
        options["reshard_after_forward"] = reshard_after_forward
    wrapped = blocks(model)
    for block in wrapped:
        apply(block, **options)
    if strategy in SHARDED:
        options["reshard_after_forward"] = False  # the root's are needed right at backward
    apply(model, **options)
    return {
        "strategy": strategy,
        "blocks": len(wrapped),
        "mesh": list(mesh.shape),
        "param_dtype": _dtype_name(policy.param_dtype),
        "reduce_dtype": _dtype_name(policy.reduce_dtype),
        "reshard_after_forward": reshard_after_forward if strategy in SHARDED else None,
    }


@contextlib.contextmanager
def fsdp_no_sync(model: nn.Module) -> Iterator[None]:
    """FSDP2's ``no_sync``: gradients are neither reduced nor reduce-scattered (they accumulate
    unsharded on each rank) until the context ends."""
    model.set_requires_gradient_sync(False)  # type: ignore[operator]
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)  # type: ignore[operator]


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: a DTensor's local shard, else the tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a DTensor gathered (a collective: every rank calls it in the same order),
    else the tensor itself."""
    full_tensor = getattr(tensor, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else tensor


def unwrapped(model: nn.Module) -> nn.Module:
    """The user's module under a DDP wrapper (FSDP2 and replicate wrap in place)."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, nn.Module) else model
