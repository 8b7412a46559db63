"""A script cell's ``strategy``: where the script wraps its model in DDP, another strategy.

The script calls ``DDP(model, ...)`` as it always does. Under ``replicate`` or ``fsdp2`` the
bootstrap's DDP constructor (``step_hooks``) applies that strategy to ``model`` instead, in place
and by the built-in models' rule (``worker.strategies.blocks``: the children of the model's first
``nn.ModuleList``, else the root's children that hold parameters; then the root), and the call
returns a :class:`StrategyModule`: a module around the wrapped model that the script uses as its
DDP model (``.module``, ``no_sync()``, forward, parameters: the strategy's). DDP's own arguments
(``device_ids``, buckets, ``process_group``) do not apply: the strategy's mesh spans every rank of
the job. The script's precision stays its own (its autocast): FSDP2 casts nothing.

A script that builds its optimizer before its DDP call holds the parameters fully_shard replaced;
such a script runs under ddp only.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, cast

from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from torchscale.script.run_state import NotMeasurable, rank_context
from torchscale.script.script_config import ScriptCellSettings
from torchscale.worker.strategies import apply_strategy, fsdp_no_sync


class StrategyModule(DDP):
    """What a script's ``DDP(model, ...)`` returns under another strategy: the strategy-wrapped
    ``model`` as ``.module``, and the parts of DDP's interface a training loop uses. A subclass of
    DDP, so that ``isinstance(model, DDP)`` in the script still holds; DDP's own machinery (its
    reducer, buckets, logging) is not there."""

    module: nn.Module
    strategy: Dict[str, Any]

    def __init__(self) -> None:  # built by :func:`become_strategy_module` only
        raise TypeError("StrategyModule is made from a DDP call (script_strategy)")

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        with fsdp_no_sync(self.module):
            yield

    @property
    def require_backward_grad_sync(self) -> bool:
        """What ``no_sync()`` sets (the sync probe sets it for a step): gradient reduction."""
        return bool(self.__dict__.get("_grad_sync", True))

    @require_backward_grad_sync.setter
    def require_backward_grad_sync(self, value: bool) -> None:
        self.module.set_requires_gradient_sync(value)  # type: ignore[operator]
        self.__dict__["_grad_sync"] = value

    def _set_ddp_runtime_logging_sample_rate(self, sample_rate: int) -> None:
        raise AttributeError(f"{self.strategy['strategy']} has no DDP runtime logging")


def become_strategy_module(
    ddp: DDP, arguments: Dict[str, Any], settings: ScriptCellSettings
) -> Dict[str, Any]:
    """In place of ``DDP.__init__(ddp, **arguments)``: the cell's strategy applied to the
    script's model, and ``ddp`` made a :class:`StrategyModule` around it; what was applied."""
    model = arguments.get("module")
    if not isinstance(model, nn.Module):
        raise NotMeasurable(
            f"the script's DDP call passed no module to wrap in {settings.strategy}"
        )
    nn.Module.__init__(ddp)
    ctx = rank_context(model)
    applied = apply_strategy(
        model, settings.strategy, ctx, reshard_after_forward=settings.reshard_after_forward
    )
    ddp.module = model
    ddp.__class__ = StrategyModule
    cast(StrategyModule, ddp).strategy = applied
    ignored = sorted(name for name in arguments if name not in ("self", "module"))
    return {**applied, "ddp_arguments_ignored": ignored}
