"""Cells across nodes in lock step: one torchscale per node, every node walking the same plan.

Each multi-node cell is a torchrun with c10d rendezvous under a rendezvous id of its own
(``<run id>-<cell id>``). A node that reaches a cell before the others waits there, in torchrun's
rendezvous, until they arrive: that is the lock step, with no other coordination. Node 0's
torchscale hosts the c10d store for the whole sweep (every torchrun joins it with
``is_host=false``). A store hosted by a cell's own torchrun lives only as long as that cell: a
node that is a cell ahead (restarted, or its cell failed early) would join the next rendezvous on
a store about to close, fail, move on, and the nodes would fall out of step for good.

Single-node cells run on node 0 only. Only node 0 records results; node R keeps its launch logs in
``cells/<cell_id>/node<R>/``, so no two nodes ever write the same file, even on a shared
filesystem.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from torchscale.errors import TorchscaleError
from torchscale.launch.process import KILL_GRACE_S
from torchscale.launch.torchrun import SINGLE_NODE, Rendezvous
from torchscale.plan.planned_cell import Cell
from torchscale.results.layout import node_dir, node_lock
from torchscale.results.store import ExperimentStore

DEFAULT_PORT = 29400
"""torchrun's default c10d port."""
DEFAULT_JOIN_TIMEOUT_S = 600.0
"""How long a node waits at a cell for the others (torchrun's own default join timeout)."""


def split_endpoint(endpoint: str) -> Tuple[str, int]:
    """``host:port`` (IPv6 in brackets) -> (host, port); the port defaults to 29400."""
    text = endpoint.strip()
    host, sep, port = text.rpartition(":")
    if not sep or (text.startswith("[") and not host.endswith("]")):
        host, port = text, str(DEFAULT_PORT)
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise TorchscaleError(
            f"rendezvous endpoint '{endpoint}' is not HOST:PORT: give node 0's address and a "
            f"free port, e.g. --rdzv-endpoint node0:{DEFAULT_PORT}"
        )
    return host, int(port)


@dataclass(frozen=True)
class Launch:
    """This torchscale's place in the run: one node (the default) or node ``node_rank`` of
    ``nnodes`` started by hand (or a job launcher) with the same config."""

    nnodes: int = 1
    node_rank: int = 0
    endpoint: Optional[str] = None  # node 0's HOST:PORT, where its torchscale hosts the store
    run_id: str = "torchscale"
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S

    launcher = "torchrun"

    @property
    def records_results(self) -> bool:
        return self.node_rank == 0

    def visits(self, cell: Cell) -> bool:
        """Whether this node takes part in ``cell`` (node 0 also records the skipped ones)."""
        nnodes = cell.settings.nnodes
        return self.node_rank == 0 or (self.node_rank < nnodes <= self.nnodes)

    def skip_reason(self, cell: Cell) -> Optional[str]:
        nnodes = cell.settings.nnodes
        if nnodes > self.nnodes:
            return f"needs {nnodes} nodes; {self.has_nodes()} ({self.more_nodes_hint(nnodes)})"
        return None

    def has_nodes(self) -> str:
        return f"this launch has {self.nnodes}"

    def more_nodes_hint(self, nnodes: int) -> str:
        return f"run torchscale on {nnodes} nodes with --nnodes {nnodes}"

    def join_waits(self, cells: Sequence[Cell]) -> Dict[str, float]:
        """For each multi-node cell this node runs: how long its torchrun may wait for the others.

        ``cells`` is node 0's order. Node 0 runs every cell, so another node may have to wait, on
        top of the join timeout, for the cells node 0 runs without it in between.
        """
        waits: Dict[str, float] = {}
        between = 0.0
        for cell in cells:
            if self.visits(cell) and cell.settings.nnodes > 1:
                waits[cell.cell_id] = self.join_timeout_s + between
                between = 0.0
            elif not self.visits(cell):
                between += cell.settings.cell_timeout_s + 2 * KILL_GRACE_S
        return waits

    def rendezvous(self, cell: Cell, wait_s: Optional[float] = None) -> Rendezvous:
        if cell.settings.nnodes == 1:
            return SINGLE_NODE
        return Rendezvous(
            nnodes=cell.settings.nnodes,
            node_rank=self.node_rank,
            endpoint=self.endpoint,
            run_id=f"{self.run_id}-{cell.cell_id}",
            join_timeout_s=wait_s if wait_s is not None else self.join_timeout_s,
            is_host=False,
        )

    def worker_command(self, cell: Cell, cell_dir: Path) -> Optional[List[str]]:
        """The whole command that starts the cell's ranks when torchrun does not (``mpirun``)."""
        return None

    def prefix(self, cell: Cell) -> List[str]:
        """What runs torchrun on the cell's nodes: nothing here (each node starts its own)."""
        return []

    @contextlib.contextmanager
    def serve(self) -> Iterator[None]:
        """On node 0 of a multi-node launch, host the c10d store for the whole sweep."""
        if self.nnodes == 1 or self.node_rank != 0 or not self.endpoint:
            yield
            return
        from torch.distributed import TCPStore  # type: ignore[attr-defined]  # torch: no re-export

        host, port = split_endpoint(self.endpoint)
        try:
            store = TCPStore(
                host,
                port,
                is_master=True,
                multi_tenant=True,
                wait_for_workers=False,
                timeout=timedelta(seconds=self.join_timeout_s),
            )
        except RuntimeError as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TorchscaleError(
                f"cannot host the rendezvous store on port {port} ({reason[:160]}): is another "
                "torchscale or torchrun using it? choose another --rdzv-endpoint port"
            ) from None
        try:
            yield
        finally:
            del store

    def describe(self) -> Dict[str, Any]:
        """The launch, for the manifest."""
        return {
            "launcher": self.launcher,
            "nnodes": self.nnodes,
            "node_rank": self.node_rank,
            "endpoint": self.endpoint,
            "run_id": self.run_id,
            "join_timeout_s": self.join_timeout_s,
        }


class NodeStore(ExperimentStore):
    """What node ``node_rank`` > 0 writes: its own sub-folder of each cell folder, nothing else.

    It reads node 0's results where the folder is shared (so ``--resume`` skips the same cells).
    """

    def __init__(self, root: Path, node_rank: int) -> None:
        super().__init__(root)
        self.node_rank = node_rank

    def cell_dir(self, cell_id: str) -> Path:
        return super().cell_dir(cell_id) / node_dir(self.node_rank)

    @property
    def lock_path(self) -> Path:
        return self.root / node_lock(self.node_rank)

    def write_manifest(self, manifest: Dict[str, Any]) -> None:
        raise RuntimeError(f"node {self.node_rank} must not write the manifest")

    def append(self, record: Any) -> None:
        raise RuntimeError(f"node {self.node_rank} must not record results")


def store_for(launch: Launch, root: Path) -> ExperimentStore:
    return ExperimentStore(root) if launch.records_results else NodeStore(root, launch.node_rank)


def merge_node_environments(
    manifest: Dict[str, Any], reported: Optional[List[Dict[str, Any]]]
) -> bool:
    """Add the nodes a cell ran on to ``manifest["nodes"]`` (one entry per host, sorted).

    Returns whether the manifest changed.
    """
    if not reported:
        return False
    nodes = {node["host"]: node for node in manifest.get("nodes", [])}
    changed = False
    for node in reported:
        if nodes.get(node.get("host")) != node:
            nodes[node.get("host")] = node
            changed = True
    if changed:
        manifest["nodes"] = [nodes[host] for host in sorted(nodes, key=str)]
    return changed


def check_node_zero(launch: Launch, failed: Sequence[Any]) -> None:
    """Stop a node whose cell could not reach node 0's store: node 0 has stopped (or never
    started), and every later cell would wait for it in vain."""
    for record in failed:
        if "RendezvousConnectionError" in (record.error or ""):
            raise TorchscaleError(
                f"node 0's rendezvous store at {launch.endpoint} did not answer: node 0 is not "
                f"running torchscale; node {launch.node_rank} stops ({record.error})"
            )


def _env_int(name: str, environ: Mapping[str, str]) -> Optional[int]:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise TorchscaleError(
            f"{name}={raw!r} is not a whole number: torchscale runs a fixed number of nodes "
            "(no elastic MIN:MAX ranges); set it to the node count"
        )
    return int(raw)


def _master_endpoint(environ: Mapping[str, str]) -> Optional[str]:
    """``MASTER_ADDR:MASTER_PORT``, else torchrun's own ``PET_MASTER_ADDR:PET_MASTER_PORT`` (what
    Kubeflow Trainer's torch plugin sets)."""
    for prefix in ("", "PET_"):
        addr, port = environ.get(f"{prefix}MASTER_ADDR"), environ.get(f"{prefix}MASTER_PORT")
        if addr and port:
            return f"{addr}:{port}"
    return None


def resolve_launch(
    *,
    nnodes: Optional[int],
    node_rank: Optional[int],
    endpoint: Optional[str],
    run_id: Optional[str],
    join_timeout_s: float,
    experiment: str,
    environ: Optional[Mapping[str, str]] = None,
) -> Launch:
    """The launch from the command line, else from the variables torchrun itself reads
    (``PET_NNODES``, ``PET_NODE_RANK``, ``PET_RDZV_ENDPOINT``, ``PET_RDZV_ID``), else from
    ``MASTER_ADDR``/``MASTER_PORT`` for the endpoint."""
    env = os.environ if environ is None else environ
    if nnodes is None:
        nnodes = _env_int("PET_NNODES", env) or 1
    if node_rank is None:
        node_rank = _env_int("PET_NODE_RANK", env) or 0
    if nnodes < 1:
        raise TorchscaleError(f"--nnodes {nnodes}: give the number of nodes, 1 or more")
    if not 0 <= node_rank < nnodes:
        raise TorchscaleError(
            f"--node-rank {node_rank} is out of range for {nnodes} node(s): use 0 to {nnodes - 1}"
        )
    if join_timeout_s <= 0:
        raise TorchscaleError(f"--join-timeout {join_timeout_s:g}: give a positive number of s")
    if nnodes == 1:
        return Launch(join_timeout_s=join_timeout_s)
    endpoint = endpoint or env.get("PET_RDZV_ENDPOINT") or _master_endpoint(env)
    if not endpoint:
        raise TorchscaleError(
            f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT, node 0's address and a free port "
            "(also read from PET_RDZV_ENDPOINT, MASTER_ADDR and MASTER_PORT, or PET_MASTER_ADDR "
            "and PET_MASTER_PORT)"
        )
    host, port = split_endpoint(endpoint)
    host = f"[{host}]" if ":" in host else host
    return Launch(
        nnodes=nnodes,
        node_rank=node_rank,
        endpoint=f"{host}:{port}",
        run_id=run_id or env.get("PET_RDZV_ID") or f"torchscale-{experiment}",
        join_timeout_s=join_timeout_s,
    )
