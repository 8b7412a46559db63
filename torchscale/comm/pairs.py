"""The P2P pair matrix: which ordered pairs exist, and their per-rank sides -> [src][dst] figures.

No torch here: the launcher derives records from result.json with it.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

Pair = Tuple[int, int]
RankSides = Dict[str, Dict[str, float]]  # {"send"|"recv"|"wrong": {"src,dst": value}}


def ordered_pairs(world_size: int) -> List[Pair]:
    return [(src, dst) for src in range(world_size) for dst in range(world_size) if src != dst]


def pair_key(pair: Pair) -> str:
    return f"{pair[0]},{pair[1]}"


def pair_matrix(per_rank: List[RankSides], n: int) -> List[List[Optional[float]]]:
    """[src][dst] time: the slower of the sender's and the receiver's loop; diagonal None."""
    matrix: List[List[Optional[float]]] = [[None] * n for _ in range(n)]
    for src, dst in ordered_pairs(n):
        key = pair_key((src, dst))
        matrix[src][dst] = max(per_rank[src]["send"][key], per_rank[dst]["recv"][key])
    return matrix


def slowest_pair(matrix: List[List[Optional[float]]]) -> Pair:
    return max(ordered_pairs(len(matrix)), key=lambda pair: matrix[pair[0]][pair[1]] or 0.0)


def pair_wrong(per_rank: List[RankSides]) -> Dict[Pair, int]:
    """Wrong elements per pair, as counted by each receiver."""
    wrong: Dict[Pair, int] = {}
    for sides in per_rank:
        for key, count in sides["wrong"].items():
            src, dst = map(int, key.split(","))
            wrong[(src, dst)] = int(count)
    return wrong
