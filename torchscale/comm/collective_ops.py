"""The collectives on torch.distributed, with data whose every result is known exactly.

Correctness works like nccl-tests' ``-c``: each rank fills its input with values that depend on
its rank and on the element's index in the op's global array, runs the op once, and compares its
output with the expected output computed independently; differing elements are counted.

The values are small integers (``pattern``), so every dtype holds them and every partial sum of
them exactly, whatever order the backend adds them in: the expected result is exact, not
approximate, and one wrong element is one count.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.distributed as dist

from torchscale.comm.busbw import Layout
from torchscale.config.sizes import parse_size

ROOT = 0  # broadcast root, as nccl-tests' default
UNWRITTEN = -100  # outputs start here: an op that writes nothing cannot pass the check
CORRUPT_ENV = "TORCHSCALE_TEST_CORRUPT"
"""Test hook: ``OP:RANK[:SIZE]`` (comma-separated for several) makes RANK change one element of
its OP output (at SIZE bytes, nccl-tests' size, or every size) after the op and before the check.
OP may also be ``send_recv`` (the receiver's buffer) or ``tp_gemm`` (C, every case)."""


@dataclass(frozen=True)
class Group:
    """The ranks one op runs over: torch's process group (None: the default, whole world) and the
    global ranks of its members, in group-rank order."""

    handle: Optional[dist.ProcessGroup]
    members: Tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.members)

    def index(self, rank: int) -> int:
        """``rank``'s rank inside the group."""
        return self.members.index(rank)


Run = Callable[[torch.Tensor, torch.Tensor, Group], object]

# Newer torch releases renamed the single-tensor all-gather and reduce-scatter (the old names warn);
# older ones (down to our floor, 2.2) only have the *_tensor names.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def torch_dtype(name: str) -> torch.dtype:
    dtype: torch.dtype = getattr(torch, name)
    return dtype


def pattern(rank: int, start: int, length: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s value for global elements ``start .. start+length`` (int64).

    Values lie in [-span, span] with span * world_size <= 256, so sums over all ranks stay
    integers that bfloat16 (8 significant bits) represents exactly.
    """
    span = max(1, min(6, 256 // world_size))
    index = torch.arange(start, start + length, dtype=torch.int64)
    return (rank * 7 + index * 3) % (2 * span + 1) - span


def _all_reduce(inp: torch.Tensor, out: torch.Tensor, group: Group) -> object:
    return dist.all_reduce(out, group=group.handle)  # in place: out is inp


def _broadcast(inp: torch.Tensor, out: torch.Tensor, group: Group) -> object:
    return dist.broadcast(out, src=group.members[ROOT], group=group.handle)


def _all_gather(inp: torch.Tensor, out: torch.Tensor, group: Group) -> object:
    return all_gather_single(out, inp, group=group.handle)


def _reduce_scatter(inp: torch.Tensor, out: torch.Tensor, group: Group) -> object:
    return reduce_scatter_single(out, inp, group=group.handle)


def _all_to_all(inp: torch.Tensor, out: torch.Tensor, group: Group) -> object:
    return dist.all_to_all_single(out, inp, group=group.handle)


RUN: Dict[str, Run] = {
    "all_reduce": _all_reduce,
    "broadcast": _broadcast,
    "all_gather": _all_gather,
    "reduce_scatter": _reduce_scatter,
    "all_to_all": _all_to_all,
}
IN_PLACE = {"all_reduce", "broadcast"}


def check_input(lay: Layout, rank: int, n: int) -> torch.Tensor:
    """This rank's input for the check, by op (int64; cast by the caller)."""
    c = lay.count
    if lay.op == "all_gather":
        return pattern(rank, rank * c, c, n)  # this rank's slice of the gathered array
    if lay.op == "broadcast" and rank != ROOT:
        return torch.full((c,), UNWRITTEN, dtype=torch.int64)
    return pattern(rank, 0, lay.input_elements, n)


def expected_output(lay: Layout, rank: int, n: int) -> torch.Tensor:
    """What ``rank``'s output must hold after the op, computed without communicating (int64)."""
    c = lay.count
    if lay.op == "all_reduce":
        return sum((pattern(s, 0, c, n) for s in range(n)), torch.zeros(c, dtype=torch.int64))
    if lay.op == "broadcast":
        return pattern(ROOT, 0, c, n)
    if lay.op == "all_gather":
        return torch.cat([pattern(s, s * c, c, n) for s in range(n)])
    if lay.op == "reduce_scatter":
        return sum(
            (pattern(s, rank * c, c, n) for s in range(n)), torch.zeros(c, dtype=torch.int64)
        )
    if lay.op == "all_to_all":
        return torch.cat([pattern(s, rank * c, c, n) for s in range(n)])
    raise ValueError(f"unknown op {lay.op!r}")


def buffers(
    lay: Layout, dtype: torch.dtype, device: torch.device, inp: Optional[torch.Tensor] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(input, output) for ``lay``; zeros unless ``inp`` is given. In-place ops share one."""
    if inp is None:
        inp = torch.zeros(lay.input_elements, dtype=dtype, device=device)
    else:
        inp = inp.to(dtype=dtype, device=device)
    if lay.op in IN_PLACE:
        return inp, inp
    out = torch.full((lay.output_elements,), UNWRITTEN, dtype=dtype, device=device)
    return inp, out


def count_wrong(output: torch.Tensor, expected: torch.Tensor) -> int:
    """Elements of ``output`` that differ from ``expected`` (NaN counts as wrong)."""
    expected = expected.to(dtype=output.dtype, device=output.device)
    return int((output != expected).sum().item())


@dataclass(frozen=True)
class Corruption:
    """Where the test hook perturbs results (see ``CORRUPT_ENV``): (op, rank, size or None)."""

    targets: Tuple[Tuple[str, int, Optional[int]], ...]

    def applies(self, op: str, rank: int, size_bytes: Optional[int]) -> bool:
        return any(
            op == t_op and rank == t_rank and t_size in (None, size_bytes)
            for t_op, t_rank, t_size in self.targets
        )

    @staticmethod
    def perturb(output: torch.Tensor) -> None:
        """Change one element (the middle one) of a non-empty output."""
        if output.numel():
            flat = output.view(-1)
            flat[flat.numel() // 2] += 1


def corruption_from_env() -> Optional[Corruption]:
    targets = []
    for spec in os.environ.get(CORRUPT_ENV, "").split(","):
        if spec.strip():
            op, rank, *size = spec.strip().split(":")
            targets.append((op, int(rank), parse_size(size[0]) if size else None))
    return Corruption(tuple(targets)) if targets else None


def check_collective(
    lay: Layout,
    rank: int,
    group: Group,
    dtype: torch.dtype,
    device: torch.device,
    corruption: Optional[Corruption],
) -> int:
    """Run ``lay.op`` once on pattern data over ``group``; return the wrong elements of this
    (global) rank's output. Patterns follow the rank inside the group."""
    index, n = group.index(rank), group.size
    inp, out = buffers(lay, dtype, device, check_input(lay, index, n))
    RUN[lay.op](inp, out, group)
    if corruption and corruption.applies(lay.op, rank, lay.size_bytes):
        corruption.perturb(out)
    return count_wrong(out, expected_output(lay, index, n))
