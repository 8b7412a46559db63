"""Bus bandwidth as nccl-tests defines it: the one place the per-collective factors live.

``algbw = bytes / time``; ``busbw = algbw * factor(n)``, where the factor turns the algorithm
bandwidth into the per-link traffic a ring implementation moves, so figures are comparable across
world sizes and with the link's peak (see nccl-tests' doc/PERFORMANCE.md).
"""

from __future__ import annotations

from typing import Callable, Dict

BUSBW_FACTORS: Dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}


def busbw_factor(op: str, world_size: int) -> float:
    """The factor for ``op`` on ``world_size`` ranks (raises KeyError for an unknown op)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return BUSBW_FACTORS[op](world_size)


def algbw_gbps(size_bytes: int, time_s: float) -> float:
    """Algorithm bandwidth in GB/s (10^9 bytes per second, as nccl-tests prints)."""
    return size_bytes / time_s / 1e9


def busbw_gbps(op: str, size_bytes: int, time_s: float, world_size: int) -> float:
    return algbw_gbps(size_bytes, time_s) * busbw_factor(op, world_size)
