"""The bootstrap's hooks in a script's process: where torchscale sees the script's training.

Installed before the script runs, removed after it (nothing in the script is edited):

* ``DistributedDataParallel.__init__`` is wrapped: the cell's DDP arguments replace the
  script's own (only those the cell sets), or, under another strategy, that strategy is applied
  in DDP's place (``script_strategy``); then the listener gets the model, and with it a forward
  pre-hook and a forward hook on that module;
* torch.optim's global step hooks (``register_optimizer_step_pre_hook`` / ``_post_hook``) tell
  the listener where each optimizer step starts and ends;
* ``torch.distributed.destroy_process_group`` of the default group (no argument, ``None`` or
  ``group.WORLD``) first lets the listener finish collective work (a script that ends right
  after its last step still gets its figures gathered).

Every hook is invisible to Dynamo: a script that compiles its model or its DDP module
(``torch.compile(DDP(model))``) has the hooks traced otherwise, and Dynamo cannot trace the
listener. Each is wrapped in ``torch.compiler.disable`` (a graph break: it runs eagerly, where it
belongs, around the compiled graph) as soon as Dynamo is loaded: at once when it already is,
else by ``torch.compile`` (wrapped while the hooks are installed) before it compiles anything.
Dynamo is not imported for a script that never compiles (it takes seconds to import).

The hooks only observe and call the listener; what they mean is ``script_window``'s.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from typing import Any, Callable, Dict, Iterator, List, Optional, Protocol, Tuple

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils.hooks import RemovableHandle

BUFFER_SYNC_NAMES = ("forward_sync_buffers", "broadcast_buffers")
"""DDP's per-forward buffer broadcast: torch 2.15 renamed ``broadcast_buffers`` (see
``worker.training._buffer_sync``); the cell's ``broadcast_buffers`` sets whichever it has."""


class StepListener(Protocol):
    """What the hooks report (``script_window.ScriptWindows``)."""

    def ddp_built(self, ddp: DDP, applied: Dict[str, Any]) -> None: ...

    def forward_starts(self, ddp: DDP, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None: ...

    def forward_ends(self, ddp: DDP) -> None: ...

    def optimizer_starts(self, optimizer: torch.optim.Optimizer) -> None: ...

    def optimizer_ends(self, optimizer: torch.optim.Optimizer) -> None: ...

    def group_ends(self) -> None: ...

    def compiles(self) -> None: ...


def applied_arguments(
    parameters: Dict[str, Any], arguments: Dict[str, Any], overrides: Dict[str, Any]
) -> Dict[str, Any]:
    """``overrides`` set in ``arguments`` (a DDP call, bound); returns what was set, as named
    there. ``broadcast_buffers`` goes to the name this torch's DDP takes, and the other
    spelling, if the script used it, is dropped (DDP refuses both)."""
    applied: Dict[str, Any] = {}
    for name, value in overrides.items():
        target = name
        if name == "broadcast_buffers":
            target = next(n for n in BUFFER_SYNC_NAMES if n in parameters or n == name)
            for other in BUFFER_SYNC_NAMES:
                arguments.pop(other, None)
        arguments[target] = value
        applied[target] = value
    return applied


class _Shield:
    """The hooks installed, each hidden from Dynamo once Dynamo is loaded."""

    def __init__(self) -> None:
        self.handles: List[RemovableHandle] = []

    def add(self, handle: RemovableHandle) -> None:
        self.handles.append(handle)
        if "torch._dynamo" in sys.modules:
            self.hide()

    def hide(self) -> None:
        """Wrap each hook not yet wrapped in ``torch.compiler.disable`` (in place, in the dict
        torch calls it from)."""
        for handle in self.handles:
            hooks = handle.hooks_dict_ref()
            hook = None if hooks is None else hooks.get(handle.id)
            if hook is not None and not getattr(hook, "_torchdynamo_disable", False):
                hooks[handle.id] = torch.compiler.disable(hook)  # type: ignore[index]


Instead = Callable[[DDP, Dict[str, Any]], Dict[str, Any]]
"""In place of DDP's constructor: builds the module (another strategy) from the call's bound
arguments; returns what it applied."""


def _wrapped_init(
    listener: StepListener, overrides: Dict[str, Any], shield: _Shield, instead: Optional[Instead]
) -> Callable[..., None]:
    original = DDP.__init__
    parameters = dict(inspect.signature(original).parameters)

    @functools.wraps(original)
    def init(self: DDP, *args: Any, **kwargs: Any) -> None:
        bound = inspect.signature(original).bind(self, *args, **kwargs)
        if instead is not None:
            applied = instead(self, dict(bound.arguments))
        else:
            applied = applied_arguments(parameters, bound.arguments, overrides)
            original(*bound.args, **bound.kwargs)
        shield.add(
            self.register_forward_pre_hook(
                lambda module, a, k: listener.forward_starts(module, a, k), with_kwargs=True
            )
        )
        shield.add(self.register_forward_hook(lambda module, a, out: listener.forward_ends(module)))
        listener.ddp_built(self, applied)

    return init


def _wrapped_compile(shield: _Shield, listener: StepListener) -> Callable[..., Any]:
    original = torch.compile

    @functools.wraps(original)
    def compile(*args: Any, **kwargs: Any) -> Any:
        shield.hide()  # before anything is traced (torch.compile imports Dynamo anyway)
        listener.compiles()
        return original(*args, **kwargs)

    return compile


def destroys_default_group(
    destroy: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]
) -> bool:
    """Whether ``destroy(*args, **kwargs)`` destroys the default group (the job's): no group,
    ``None`` or ``dist.group.WORLD``, positionally or by name, as torch reads them. A call
    torch would refuse is left to torch to refuse."""
    try:
        group = inspect.signature(destroy).bind(*args, **kwargs).arguments.get("group")
    except TypeError:
        return False
    return group is None or group is dist.group.WORLD


@contextlib.contextmanager
def installed(
    listener: StepListener, ddp_overrides: Dict[str, Any], instead: Optional[Instead] = None
) -> Iterator[None]:
    """The hooks, for the duration of the block (the script's run). ``instead``: what a DDP
    call builds in place of DDP (another strategy; ``script_strategy``)."""
    original_init = DDP.__init__
    original_destroy = dist.destroy_process_group
    original_compile = torch.compile
    shield = _Shield()
    DDP.__init__ = _wrapped_init(listener, ddp_overrides, shield, instead)  # type: ignore[method-assign]

    @functools.wraps(original_destroy)
    def destroy(*args: Any, **kwargs: Any) -> Any:
        if destroys_default_group(original_destroy, args, kwargs):
            listener.group_ends()
        return original_destroy(*args, **kwargs)

    handles = [
        register_optimizer_step_pre_hook(lambda opt, a, k: listener.optimizer_starts(opt)),
        register_optimizer_step_post_hook(lambda opt, a, k: listener.optimizer_ends(opt)),
    ]
    for handle in handles:
        shield.add(handle)
    torch.compile = _wrapped_compile(shield, listener)
    modules = (dist, dist.distributed_c10d)
    for module in modules:
        module.destroy_process_group = destroy  # type: ignore[attr-defined]
    try:
        yield
    finally:
        DDP.__init__ = original_init  # type: ignore[method-assign]
        torch.compile = original_compile
        for handle in handles:
            handle.remove()
        for module in modules:
            module.destroy_process_group = original_destroy  # type: ignore[attr-defined]
