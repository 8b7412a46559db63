"""Which rank writes the cell's result, and what each node of the job is.

In a lock-step launch every node runs its own torchscale and only node 0's records results, so the
rank that writes ``result.json`` must run on node 0, wherever c10d's rendezvous put rank 0 (it
orders nodes by address, not by ``--node-rank``). Each torchscale tells its ranks whether it
records results (:data:`~torchscale.results.rank_files.WRITES_RESULT_ENV`); the lowest such rank
writes. Without the variable every rank qualifies, so rank 0 writes.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from torchscale.hardware.environment import collect_environment
from torchscale.results.rank_files import WRITES_RESULT_ENV
from torchscale.runtime.process_group import RankContext


def result_writer(ctx: RankContext) -> int:
    """The lowest rank whose node records results (agreed by every rank)."""
    writes = os.environ.get(WRITES_RESULT_ENV, "1") != "0"
    candidate = torch.tensor([ctx.rank if writes else ctx.world_size], device=ctx.device)
    dist.all_reduce(candidate, op=dist.ReduceOp.MIN)
    writer = int(candidate.item())
    if writer >= ctx.world_size:
        raise RuntimeError(f"no rank runs on a node whose torchscale records results ({writes=})")
    return writer


def gather_node_environments(ctx: RankContext, writer: int) -> Optional[List[Dict[str, Any]]]:
    """Each node's environment (reported by its local rank 0), on the writer; None elsewhere."""
    report = collect_environment() if ctx.local_rank == 0 else None
    gathered: Optional[List[Any]] = [None] * ctx.world_size if ctx.rank == writer else None
    dist.gather_object(report, gathered, dst=writer)
    return [node for node in gathered if node] if gathered is not None else None
