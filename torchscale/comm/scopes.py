"""Which ranks a collective runs over: the whole world, each node's ranks, or one rank per node.

torchrun numbers ranks node by node (``rank = node x nproc_per_node + local_rank``), so rank ``r``
sits on node ``r // nproc_per_node``. Scopes:

* ``world``: every rank, as nccl-tests runs.
* ``intra_node``: one group per node, all nodes at once: the fabric inside a node (NVLink, PCIe),
  with no network in the path.
* ``inter_node``: local rank 0 of every node, while the other ranks wait: the network between the
  nodes alone, as nccl-tests run with one GPU per node.

A scope that would contain the same ranks as the world (``intra_node`` on one node, ``inter_node``
with one rank per node) measures nothing new and is left out of the cell.

No torch here: the planner uses it.
"""

from __future__ import annotations

from typing import List, Sequence, TypeVar

ScopeT = TypeVar("ScopeT", bound=str)

SCOPES = ("world", "intra_node", "inter_node")


def scope_groups(scope: str, world_size: int, nproc_per_node: int) -> List[List[int]]:
    """The groups of global ranks ``scope`` runs (each group runs its own op, at the same time)."""
    if nproc_per_node < 1 or world_size % nproc_per_node:
        raise ValueError(f"{world_size} ranks do not split into nodes of {nproc_per_node}")
    nnodes = world_size // nproc_per_node
    if scope == "world":
        return [list(range(world_size))]
    if scope == "intra_node":
        return [
            list(range(node * nproc_per_node, (node + 1) * nproc_per_node))
            for node in range(nnodes)
        ]
    if scope == "inter_node":
        return [[node * nproc_per_node for node in range(nnodes)]]
    raise ValueError(f"unknown scope {scope!r}: choose one of {', '.join(SCOPES)}")


def distinct_scopes(requested: Sequence[ScopeT], nnodes: int, nproc_per_node: int) -> List[ScopeT]:
    """The requested scopes that measure something the world does not, in the order asked."""
    split = nnodes > 1 and nproc_per_node > 1  # only then is a node a proper, non-trivial subset
    return [scope for scope in requested if scope == "world" or split]
