"""Message sizes and bandwidths exactly as NVIDIA's nccl-tests define them: the one place.

Size convention (nccl-tests ``src/*.cu``, ``GetCollByteCount`` and ``setupArgs``): a requested size
``S`` becomes ``count = S / sizeof(dtype)`` elements. For all_gather, reduce_scatter and all_to_all
that count is split across the ``n`` ranks: each rank contributes ``count / n`` elements, rounded
down to a multiple of 16 bytes. The reported ``size`` is the larger of the send and receive buffers
(the gathered output of all_gather, the input of reduce_scatter, the whole send buffer of
all_to_all) and the reported ``count`` is the per-rank ``count``.

Bandwidth (nccl-tests ``doc/PERFORMANCE.md`` and ``*GetBw``), with ``t`` the average time per op:

* ``algbw = size / t`` (GB/s, 1 GB = 1e9 bytes; times in seconds here)
* ``busbw = algbw x factor``: all_reduce ``2(n-1)/n``; all_gather, reduce_scatter and all_to_all
  ``(n-1)/n``; broadcast, reduce and send/recv ``1``.

busbw is what each rank's link must carry, so it compares with the link's peak whatever ``n`` is.
No torch here: the planner and the config loader use it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
SEND_RECV = "send_recv"
# Ops whose requested size is split across the ranks (per-rank count = count / n).
SPLIT_OPS = frozenset({"all_gather", "reduce_scatter", "all_to_all"})
ALIGN_BYTES = 16  # nccl-tests rounds the per-rank count of split ops down to 16 bytes
BYTES_PER_GB = 1e9


def size_sweep(min_bytes: int, max_bytes: int, factor: int) -> List[int]:
    """nccl-tests' ``-b min -e max -f factor``: min, min*f, min*f^2, ... while <= max."""
    if min_bytes <= 0 or factor < 2 or min_bytes > max_bytes:
        raise ValueError("need 0 < min_bytes <= max_bytes and factor >= 2")
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes


@dataclass(frozen=True)
class Layout:
    """The buffers of one op at one requested size, in elements, and what nccl-tests reports."""

    op: str
    count: int  # nccl-tests' "count" column: per-rank elements for split ops
    input_elements: int
    output_elements: int
    size_bytes: int  # nccl-tests' "size" column: max(send, receive) bytes


def layout(op: str, requested_bytes: int, element_bytes: int, world_size: int) -> Layout:
    """How nccl-tests lays out ``op`` for a requested size (see the module docstring)."""
    count = requested_bytes // element_bytes
    n = world_size
    if op in SPLIT_OPS:
        align = max(1, ALIGN_BYTES // element_bytes)
        per_rank = (count // n) // align * align
        if op == "all_gather":
            return Layout(op, per_rank, per_rank, per_rank * n, per_rank * n * element_bytes)
        if op == "reduce_scatter":
            return Layout(op, per_rank, per_rank * n, per_rank, per_rank * n * element_bytes)
        total = per_rank * n  # all_to_all: n chunks of per_rank elements each way
        return Layout(op, per_rank, total, total, total * element_bytes)
    if op in ("all_reduce", "broadcast", SEND_RECV):
        return Layout(op, count, count, count, count * element_bytes)
    raise ValueError(f"unknown op {op!r}")


BUSBW_FACTORS: Dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    SEND_RECV: lambda n: 1.0,
}


def busbw_factor(op: str, world_size: int) -> float:
    """nccl-tests' correction from algorithm to bus bandwidth for ``op`` on ``world_size`` ranks."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if op not in BUSBW_FACTORS:
        raise ValueError(f"unknown op {op!r}: known are {', '.join(BUSBW_FACTORS)}")
    return BUSBW_FACTORS[op](world_size)


def algbw_gbps(size_bytes: int, time_s: float) -> float:
    """Algorithm bandwidth in GB/s (10^9 bytes per second, as nccl-tests prints); 0 for no time."""
    return size_bytes / time_s / BYTES_PER_GB if time_s > 0 else 0.0


def busbw_gbps(op: str, size_bytes: int, time_s: float, world_size: int) -> float:
    """Bus bandwidth in GB/s: algbw times the op's factor."""
    return algbw_gbps(size_bytes, time_s) * busbw_factor(op, world_size)
