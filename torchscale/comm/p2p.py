"""Send/recv between every ordered pair of ranks, one pair at a time, so a slow link stands out.

nccl-tests' sendrecv runs a ring (every rank sends to the next at once) and reports one figure, in
which one slow link drags the whole ring. Here pair (src, dst) runs alone while the other ranks
wait at the barrier; its time is the slower of the sender's and the receiver's loop, and the
matrix of pairs shows which GPU or link is slow.
"""

from __future__ import annotations

from functools import partial
from typing import Optional

import torch
import torch.distributed as dist

from torchscale.comm.busbw import Layout
from torchscale.comm.collective_ops import UNWRITTEN, Corruption, count_wrong, pattern
from torchscale.comm.op_timing import idle, time_op
from torchscale.comm.pairs import Pair, RankSides, ordered_pairs, pair_key
from torchscale.runtime.clock import Clock


def _check_pair(
    lay: Layout,
    pair: Pair,
    rank: int,
    n: int,
    dtype: torch.dtype,
    device: torch.device,
    corruption: Optional[Corruption],
) -> Optional[int]:
    """The receiver's wrong elements for one pattern message from src (None on other ranks)."""
    src, dst = pair
    if rank == src:
        dist.send(pattern(src, 0, lay.count, n).to(dtype=dtype, device=device), dst)
    elif rank == dst:
        received = torch.full((lay.count,), UNWRITTEN, dtype=dtype, device=device)
        dist.recv(received, src)
        if corruption and corruption.applies("send_recv", rank, lay.size_bytes):
            corruption.perturb(received)
        return count_wrong(received, pattern(src, 0, lay.count, n))
    return None


def measure_pairs(
    clock: Clock,
    lay: Layout,
    rank: int,
    n: int,
    dtype: torch.dtype,
    device: torch.device,
    warmup: int,
    iterations: int,
    check: bool,
    corruption: Optional[Corruption],
) -> RankSides:
    """This rank's side of every pair: {"send"|"recv": {"src,dst": µs}, "wrong": {...}}."""
    buffer = torch.zeros(lay.count, dtype=dtype, device=device)
    mine: RankSides = {"send": {}, "recv": {}, "wrong": {}}
    for src, dst in ordered_pairs(n):
        key = pair_key((src, dst))
        if rank == src:
            send = partial(dist.send, buffer, dst)
            mine["send"][key] = time_op(clock, send, warmup, iterations)
        elif rank == dst:
            recv = partial(dist.recv, buffer, src)
            mine["recv"][key] = time_op(clock, recv, warmup, iterations)
        else:
            time_op(clock, idle, 0, 1)  # take part in the pair's barrier only
        if check:
            wrong = _check_pair(lay, (src, dst), rank, n, dtype, device, corruption)
            if wrong is not None:
                mine["wrong"][key] = wrong
    return mine
