"""Message sizes and bandwidths exactly as NVIDIA's nccl-tests define them: the one place.

Size convention (nccl-tests ``src/*.cu``, ``GetCollByteCount`` and ``setupArgs``): a requested size
``S`` becomes ``count = S / sizeof(dtype)`` elements. For all_gather, reduce_scatter and all_to_all
that count is split across the ``n`` ranks: each rank contributes ``count / n`` elements, rounded
down to a multiple of 16 bytes. The reported ``size`` is the larger of the send and receive buffers
(the gathered output of all_gather, the input of reduce_scatter, the whole send buffer of
all_to_all) and the reported ``count`` is the per-rank ``count``.

Bandwidth (algbw, busbw and each op's bus factor) is defined in
``torchscale.measures.bus_bandwidth``, a leaf the training worker's collective count reads too; it
is re-exported here.
No torch here: the planner and the config loader use it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

# re-exported: comm, validate and the planner read bandwidth from here
from torchscale.measures.bus_bandwidth import BUSBW_FACTORS as BUSBW_FACTORS
from torchscale.measures.bus_bandwidth import BYTES_PER_GB as BYTES_PER_GB
from torchscale.measures.bus_bandwidth import SEND_RECV as SEND_RECV
from torchscale.measures.bus_bandwidth import algbw_gbps as algbw_gbps
from torchscale.measures.bus_bandwidth import busbw_factor as busbw_factor
from torchscale.measures.bus_bandwidth import busbw_gbps as busbw_gbps

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
# Ops whose requested size is split across the ranks (per-rank count = count / n).
SPLIT_OPS = frozenset({"all_gather", "reduce_scatter", "all_to_all"})
ALIGN_BYTES = 16  # nccl-tests rounds the per-rank count of split ops down to 16 bytes


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
