"""``validate --fleet``: every node runs its level, node 0 gathers the reports, names the
outliers, then measures links pairwise to tell a slow node from a slow link (fleet_rules).

One torchscale per node joins a gloo process group of one rank per node, at node 0's address
(``--rdzv-endpoint``, node 0 hosts the store, as a lock-step benchmark does). Control messages
(the reports, the pairs to measure, the link figures) go over gloo; the link figures themselves
are a send/recv ping-pong between two nodes' processes, over NCCL between GPU 0 of each node
when the nodes have GPUs, else over gloo. Pairs of one round run at the same time; every node
waits at a barrier between rounds.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from torchscale.comm.busbw import busbw_gbps
from torchscale.config.validate_section import ValidateSection
from torchscale.errors import TorchscaleError
from torchscale.launch.multinode import split_endpoint
from torchscale.validate.fleet_rules import (
    Link,
    Pair,
    analyse,
    ring_rounds,
    rounds_of,
    suspect_pairs,
)

Notify = Callable[[str], None]
MIB = 1 << 20
JOINED_KEY = "torchscale/fleet/joined/"


@dataclass(frozen=True)
class FleetMember:
    """This node's place in the fleet."""

    nnodes: int
    node_rank: int
    endpoint: str  # node 0's HOST:PORT
    join_timeout_s: float = 600.0


def _ping_pong(
    peer: int, first: bool, nbytes: int, window_s: float, repeats: int, group: Any, device: Any
) -> List[float]:
    """busbw (GB/s) of ``repeats`` windows of send/recv round trips with ``peer``, measured by
    the node that goes ``first`` (the other returns []). The first element of every message
    says whether another round trip follows in this window, so the first node ends a window
    by the clock and the other follows, however slow either of them is."""
    import torch
    import torch.distributed as dist

    buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    rates: List[float] = []
    for _ in range(repeats + 1):  # the first window warms the connection up, not counted
        trips, start = 0, time.perf_counter()
        while True:
            if first:
                last = time.perf_counter() - start >= window_s and trips > 0
                buf[0] = 0.0 if last else 1.0
                dist.send(buf, peer, group=group)
                dist.recv(buf, peer, group=group)
            else:
                dist.recv(buf, peer, group=group)
                last = float(buf[0].item()) == 0.0
                dist.send(buf, peer, group=group)
            trips += 1
            if last:
                break
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        per_transfer = (time.perf_counter() - start) / (2 * trips)
        rates.append(busbw_gbps("send_recv", buf.numel() * 4, per_transfer, 2))
    return rates[1:] if first else []


class Fleet:
    """This node's process group of one rank per node, and the link measurements."""

    def __init__(self, member: FleetMember, settings: ValidateSection) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed import TCPStore  # type: ignore[attr-defined]  # no re-export

        host, port = split_endpoint(member.endpoint)
        self.member, self.settings = member, settings
        timeout = timedelta(seconds=member.join_timeout_s)
        try:
            self.store = TCPStore(
                host, port, member.nnodes, member.node_rank == 0, timeout=timeout,
                wait_for_workers=False,
            )  # fmt: skip
            # Each node says it came, so that node 0 can name the ones that never did.
            self.store.set(f"{JOINED_KEY}{member.node_rank}", "1")
            dist.init_process_group(
                "gloo", store=self.store, rank=member.node_rank, world_size=member.nnodes,
                timeout=timeout,
            )  # fmt: skip
        except (RuntimeError, ValueError) as exc:
            missing = self._missing_nodes() if member.node_rank == 0 else []
            if missing:
                raise TorchscaleError(
                    f"node 0 waited {member.join_timeout_s:g} s at {member.endpoint} and "
                    f"{_nodes_text(missing)} of the fleet of {member.nnodes} never joined: run "
                    f"`torchscale validate --fleet --nnodes {member.nnodes} --node-rank R "
                    f"--rdzv-endpoint {member.endpoint}` on each of them (or give them longer: "
                    "--join-timeout)"
                ) from None
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise TorchscaleError(
                f"node {member.node_rank} could not join the fleet at {member.endpoint} "
                f"({reason}): is node 0 running `torchscale validate --fleet` with the same "
                "--nnodes, and is the port free and reachable?"
            ) from None
        self.cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
        self.device = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        if self.cuda:
            torch.cuda.set_device(self.device)
        self.data_group = dist.new_group(backend="nccl") if self.cuda else None

    def _missing_nodes(self) -> List[int]:
        """The node ranks that never said they came (node 0 holds the store); [] when the
        store itself cannot answer, so that the error is the store's own."""
        store = getattr(self, "store", None)
        if store is None:
            return []
        try:
            return [
                rank
                for rank in range(1, self.member.nnodes)
                if not store.check([f"{JOINED_KEY}{rank}"])
            ]
        except (RuntimeError, ValueError):
            return []

    def gather(self, mine: Any) -> List[Any]:
        import torch.distributed as dist

        everyone: List[Any] = [None] * self.member.nnodes
        dist.all_gather_object(everyone, mine)
        return everyone

    def broadcast(self, value: Any) -> Any:
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def start_together(self, notify: Notify) -> None:
        """Every node waits here for the others, so the probes run at the same time everywhere
        (anything that hits the whole fleet then, hits every node alike)."""
        import torch.distributed as dist

        notify(f"node {self.member.node_rank} ready; probes start when every node is")
        dist.barrier()

    def measure(self, rounds: Sequence[Sequence[Pair]], notify: Notify) -> List[Link]:
        """Run the rounds; every node gets every link measured."""
        import torch.distributed as dist

        me = self.member.node_rank
        found: List[Tuple[int, int, List[float]]] = []
        nbytes = int(self.settings.link_mib * MIB)
        for pairs in rounds:
            for a, b in pairs:
                if me in (a, b):
                    peer = b if me == a else a
                    notify(f"link node {a} <-> node {b}")
                    rates = _ping_pong(
                        peer, me == a, nbytes, self.settings.link_s, self.settings.repeats,
                        self.data_group, self.device,
                    )  # fmt: skip
                    if me == a:
                        found.append((a, b, rates))
            dist.barrier()
        everyone = self.gather(found)
        return [Link(a, b, max(r), tuple(r)) for node in everyone for a, b, r in node]

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _nodes_text(ranks: Sequence[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:10]) + (
        f" and {len(ranks) - 10} more" if len(ranks) > 10 else ""
    )
    return f"node{'s' if len(ranks) > 1 else ''} {shown}"


def node_labels(reports: Sequence[Dict[str, Any]]) -> List[str]:
    """A name per node: its host, made unique with its node rank where two share one."""
    hosts = [str(r.get("host", "?")) for r in reports]
    return [h if hosts.count(h) == 1 else f"{h}#{i}" for i, h in enumerate(hosts)]


@contextlib.contextmanager
def joined(member: FleetMember, settings: ValidateSection, notify: Notify) -> Iterator[Fleet]:
    """This node in the fleet's process group for the ``with`` block."""
    notify(f"joining the fleet at {member.endpoint} as node {member.node_rank}")
    fleet = Fleet(member, settings)
    notify(f"joined as node {member.node_rank} of {member.nnodes}")
    try:
        yield fleet
    finally:
        fleet.close()


def fleet_check(fleet: Fleet, report: Dict[str, Any], notify: Notify) -> Optional[Dict[str, Any]]:
    """Gather the reports, measure the ring and the suspects' links; node 0 returns the fleet
    document, the other nodes None."""
    from torchscale.validate.fleet_document import fleet_document

    member, settings = fleet.member, fleet.settings
    reports = fleet.gather(report)
    labels = node_labels(reports)
    named = [{**r, "host": label} for r, label in zip(reports, labels)]
    links = fleet.measure(ring_rounds(member.nnodes), notify)
    extra: List[Pair] = []
    if member.node_rank == 0:
        extra = suspect_pairs(analyse(named, links, settings).cells, labels, links)
    extra = fleet.broadcast(extra)
    if extra:
        links += fleet.measure(rounds_of(extra), notify)
    if member.node_rank != 0:
        return None
    return fleet_document(named, links, analyse(named, links, settings), settings)
