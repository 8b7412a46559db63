"""Algorithm and bus bandwidth of a collective, exactly as NVIDIA's nccl-tests define them: the
one definition (``comm`` and the training worker's collective count both read it).

nccl-tests ``doc/PERFORMANCE.md`` and ``*GetBw``, with ``t`` the average time per op and ``size``
the larger of its send and receive buffers:

* ``algbw = size / t`` (GB/s, 1 GB = 1e9 bytes; times in seconds here)
* ``busbw = algbw x factor``: all_reduce ``2(n-1)/n``; all_gather, reduce_scatter and all_to_all
  ``(n-1)/n``; broadcast, reduce and send/recv ``1``.

busbw is what each rank's link must carry, so it compares with the link's peak whatever ``n`` is.
No torch here.
"""

from __future__ import annotations

from typing import Callable, Dict

SEND_RECV = "send_recv"
BYTES_PER_GB = 1e9

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
