"""The collectives a strategy actually issues in one step, counted after the measured window
(outside it).

One synchronised step runs under a ``TorchDispatchMode`` that sees every ``c10d`` operator the step
dispatches, whoever calls it: DDP's reducer (bucket all-reduces, buffer broadcasts), FSDP2's
all-gathers and reduce-scatters, replicate's all-reduces. Each call's bytes are its larger buffer
(the gathered output, the scattered input, the all-reduced tensors), nccl-tests' size convention.
A dispatch mode costs microseconds per operator, where a profiler's first start costs seconds.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torchscale.runtime.clock import Clock

C10D_OPS = {
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "_allgather_base_": "all_gather",
    "allgather_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "broadcast_": "broadcast",
    "alltoall_base_": "all_to_all",
}
"""The c10d operators a data-parallel step calls, by the collective each is."""


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def _size(args: Any) -> int:
    """The larger of the call's buffers, in bytes (a list of tensors counts as one buffer)."""
    return max(
        (sum(t.numel() * t.element_size() for t in _tensors(arg)) for arg in args), default=0
    )


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch's is unannotated
        self.found: Dict[str, Dict[str, Any]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        packet = func.overloadpacket
        if getattr(packet, "__module__", "").endswith("c10d") or "c10d" in str(packet):
            op = C10D_OPS.get(str(packet).split(".")[-1])
            if op is not None:
                entry = self.found.setdefault(op, {"op": op, "calls": 0, "bytes": 0})
                entry["calls"] += 1
                entry["bytes"] += _size(args)
        return func(*args, **(kwargs or {}))


def count_collectives(run: Any) -> List[Dict[str, Any]]:
    """One synchronised step: per collective, its calls and bytes. Nothing for a compiled model
    (a dispatch mode around compiled code would recompile it)."""
    if run.applied.get("compiled"):
        return []
    clock = Clock(run.device)
    counter = _Counter()
    with counter:
        run.step(clock)
    clock.synchronize()
    return [counter.found[op] for op in sorted(counter.found)]


def collective_counter() -> TorchDispatchMode:
    """A counter to enter around a span that is not one ``run.step`` (a user's script's step,
    entered and left from its hooks); its ``found`` holds, per collective, calls and bytes."""
    return _Counter()
