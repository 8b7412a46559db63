"""The collectives a strategy actually issues in one step, counted after the measured window
(outside it).

One synchronised step runs under a ``TorchDispatchMode`` that sees every ``c10d`` operator the step
dispatches, whoever calls it: DDP's reducer (bucket all-reduces, buffer broadcasts), FSDP2's
all-gathers and reduce-scatters, replicate's all-reduces. Each call's bytes are its larger buffer
(the gathered output, the scattered input, the all-reduced tensors), nccl-tests' size convention.
A dispatch mode costs microseconds per operator, where a profiler's first start costs seconds.

Each call is timed from its issue to its completion (the mode waits on the call's ``Work``, and on
a GPU synchronises the device before and after), so in this step the collectives run one at a time
and none overlaps compute: each op's time is its own, from which its algbw and busbw follow as
``torchscale.measures.bus_bandwidth`` defines them (the bus factor of the call's process group
size). This step is outside the measured window, so serialising it changes no figure of the cell.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Iterator, List, Optional

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from torchscale.measures.bus_bandwidth import BYTES_PER_GB, busbw_factor
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


def _script_objects(value: Any) -> Iterator[Any]:
    if isinstance(value, torch.ScriptObject):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _script_objects(item)


def _group_size(args: Any) -> int:
    """The size of the process group the call runs on (its ``ProcessGroup`` argument)."""
    from torch._C._distributed_c10d import ProcessGroup

    for obj in _script_objects(args):
        try:
            return int(ProcessGroup.unbox(obj).size())
        except (RuntimeError, TypeError):
            continue
    return dist.get_world_size() if dist.is_initialized() else 1


def _wait(result: Any) -> bool:
    """Wait for the call's ``Work`` to complete; False where none was found."""
    from torch._C._distributed_c10d import Work

    for obj in _script_objects(result):
        try:
            work = Work.unbox(obj)
        except (RuntimeError, TypeError):
            continue
        work.wait()
        return True
    return False


class _Counter(TorchDispatchMode):
    def __init__(self, clock: Clock) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch's is unannotated
        self.clock = clock
        self.found: Dict[str, Dict[str, Any]] = {}
        self.bus_bytes: Dict[str, float] = {}  # bytes x the bus factor of each call's group
        self.untimed: Dict[str, bool] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        packet = func.overloadpacket
        op: Optional[str] = None
        if getattr(packet, "__module__", "").endswith("c10d") or "c10d" in str(packet):
            op = C10D_OPS.get(str(packet).split(".")[-1])
        if op is None:
            return func(*args, **(kwargs or {}))
        self.clock.synchronize()
        started = time.perf_counter()
        result = func(*args, **(kwargs or {}))
        waited = _wait(result)
        self.clock.synchronize()
        spent = time.perf_counter() - started
        size = _size(args)
        entry = self.found.setdefault(op, {"op": op, "calls": 0, "bytes": 0, "time_s": 0.0})
        entry["calls"] += 1
        entry["bytes"] += size
        entry["time_s"] += spent
        self.bus_bytes[op] = self.bus_bytes.get(op, 0.0) + size * busbw_factor(
            op, _group_size(args)
        )
        self.untimed[op] = self.untimed.get(op, False) or not waited
        return result

    def issued(self) -> List[Dict[str, Any]]:
        """Per op: calls, bytes, seconds, and algbw and busbw in GB/s (none where a call's
        completion could not be waited for, or no time passed)."""
        rows = []
        for op in sorted(self.found):
            entry = dict(self.found[op])
            timed = not self.untimed[op] and entry["time_s"] > 0
            seconds = entry["time_s"]
            entry["algbw_gbps"] = entry["bytes"] / seconds / BYTES_PER_GB if timed else None
            entry["busbw_gbps"] = self.bus_bytes[op] / seconds / BYTES_PER_GB if timed else None
            rows.append(entry)
        return rows


def count_collectives(run: Any) -> List[Dict[str, Any]]:
    """One synchronised step: per collective, its calls, bytes, time and bandwidths. Nothing for a
    compiled model (a dispatch mode around compiled code would recompile it)."""
    if run.applied.get("compiled"):
        return []
    clock = Clock(run.device)
    counter = _Counter(clock)
    with counter:
        run.step(clock)
    clock.synchronize()
    return counter.issued()


def collective_counter(clock: Clock) -> _Counter:
    """A counter to enter around a span that is not one ``run.step`` (a user's script's step,
    entered and left from its hooks); its ``issued()`` gives, per collective, calls, bytes, time
    and bandwidths."""
    return _Counter(clock)
