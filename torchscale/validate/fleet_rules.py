"""The fleet rules: which node, device or link is the outlier, from every node's figures.

Devices. For each probe, every device's figure of every node against the fleet median of that
probe: FAIL below ``fleet.fail`` of the median, WARN below ``fleet.warn`` or more than
``fleet.mads`` scaled median absolute deviations below it (the MAD scaled by 1.4826, so it
estimates a standard deviation, and never counted below ``fleet.mad_floor`` of the median, so a
fleet of identical figures does not flag every small difference). Only the slow side counts; a
latency is compared as its inverse.

Links. Each pair measured by send/recv ping-pong (busbw, nccl-tests' send/recv factor 1). A
node's network reach is the best bandwidth it reached with anyone. A link is judged against
the lesser reach of its two nodes: a link well below what both its nodes reach elsewhere is a
slow *link* (``links.warn`` / ``links.fail``); a node whose best link is below ``links.warn``
of the fleet's median reach is a slow *node* (its NIC, its CPU). A slow node's links are as fast
as it is, so they are not blamed; a link slower still than that is, even beside a slow node.
The pairs: a ring first (every node twice), then each suspect (an outlier device, or an end of
a link below the median) against healthy nodes it has not met yet.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from torchscale.config.validate_section import FleetBar, ValidateSection
from torchscale.hardware.expected_figures import PROBES
from torchscale.validate.judging import bar_status
from torchscale.validate.result import Status, worst

MAD_SCALE = 1.4826  # MAD x 1.4826 estimates the standard deviation of normal data
Pair = Tuple[int, int]


@dataclass(frozen=True)
class Cell:
    """One device's figure in one probe, against the fleet."""

    host: str
    device: str
    probe: str
    value: float
    vs_fleet: Optional[float]
    status: Status

    def to_dict(self) -> Dict[str, object]:
        meta = PROBES[self.probe]
        return {
            "host": self.host,
            "device": self.device,
            "probe": self.probe,
            "label": meta.label,
            "unit": meta.unit,
            "value": self.value,
            "vs_fleet": self.vs_fleet,
            "status": self.status.value,
        }


def robust_status(score: float, scores: Sequence[float], bar: FleetBar) -> Tuple[Status, float]:
    """``score`` (more is better) against the median of ``scores``: status and ratio."""
    median = statistics.median(scores)
    if median <= 0:
        return Status.PASS, 1.0
    mad = statistics.median(abs(s - median) for s in scores) * MAD_SCALE
    mad = max(mad, bar.mad_floor * median)
    share = score / median
    if share < bar.fail:
        return Status.FAIL, share
    if share < bar.warn or (median - score) > bar.mads * mad:
        return Status.WARN, share
    return Status.PASS, share


def judge_cells(reports: Sequence[Mapping[str, object]], bar: FleetBar) -> List[Cell]:
    """Every probe figure of every node (``report["probes"]``) against the fleet."""
    rows: List[Tuple[str, str, str, float]] = []
    for report in reports:
        figures = report.get("probes") or []
        for figure in figures if isinstance(figures, list) else []:
            host, device, probe = str(report["host"]), str(figure["device"]), str(figure["probe"])
            rows.append((host, device, probe, float(figure["value"])))
    cells = []
    for probe in dict.fromkeys(r[2] for r in rows):
        higher = PROBES[probe].higher_is_better
        mine = [r for r in rows if r[2] == probe and r[3] > 0]
        scores = [r[3] if higher else 1.0 / r[3] for r in mine]
        for row, score in zip(mine, scores):
            status, share = robust_status(score, scores, bar)
            cells.append(Cell(row[0], row[1], probe, row[3], share, status))
    return cells


@dataclass(frozen=True)
class Link:
    """One measured pair of nodes (by node rank) and its send/recv busbw."""

    a: int
    b: int
    gbps: float
    samples: Tuple[float, ...] = ()

    @property
    def pair(self) -> Pair:
        return (min(self.a, self.b), max(self.a, self.b))


@dataclass(frozen=True)
class LinkVerdict:
    link: Link
    expected_gbps: float  # the lesser of its two nodes' best links
    ratio: float
    status: Status


@dataclass
class FleetVerdict:
    cells: List[Cell]
    links: List[LinkVerdict]
    reach: Dict[int, float]  # node rank -> its best link, GB/s
    reach_status: Dict[int, Tuple[Status, float]]  # vs the fleet median reach
    node_status: Dict[int, Status] = field(default_factory=dict)
    reasons: Dict[int, List[str]] = field(default_factory=dict)

    @property
    def slow_nodes(self) -> List[int]:
        return [n for n, s in self.node_status.items() if s is not Status.PASS]

    @property
    def slow_links(self) -> List[Pair]:
        return [v.link.pair for v in self.links if v.status is not Status.PASS]


def judge_links(links: Sequence[Link], settings: ValidateSection) -> FleetVerdict:
    reach: Dict[int, float] = {}
    for link in links:
        for node in link.pair:
            reach[node] = max(reach.get(node, 0.0), link.gbps)
    median = statistics.median(reach.values()) if reach else 0.0
    reach_status = {
        node: (bar_status(best / median if median else None, settings.links), best / median)
        for node, best in reach.items()
        if median > 0
    }
    verdicts = []
    for link in links:
        a, b = link.pair
        # judged against the slower end's best link: a slow node's links are as fast as it is,
        # so only a link slower than both its ends reach elsewhere is blamed
        expected = min(reach[a], reach[b])
        share = link.gbps / expected if expected > 0 else 1.0
        verdicts.append(LinkVerdict(link, expected, share, bar_status(share, settings.links)))
    return FleetVerdict([], verdicts, reach, reach_status)


def analyse(
    reports: Sequence[Mapping[str, object]], links: Sequence[Link], settings: ValidateSection
) -> FleetVerdict:
    """The whole verdict: device cells, links, and each node's status with its reasons."""
    verdict = judge_links(links, settings)
    verdict.cells = judge_cells(reports, settings.fleet)
    for rank, report in enumerate(reports):
        host = str(report["host"])
        reasons = [
            f"{c.device} {PROBES[c.probe].label} at {c.vs_fleet:.2f} of the fleet median"
            for c in verdict.cells
            if c.host == host and c.status is not Status.PASS and c.vs_fleet is not None
        ]
        statuses = [c.status for c in verdict.cells if c.host == host]
        network = verdict.reach_status.get(rank)
        if network is not None and network[0] is not Status.PASS:
            statuses.append(network[0])
            reasons.append(f"its best link reaches {network[1]:.2f} of the fleet's median")
        verdict.node_status[rank] = worst([Status.PASS, *statuses])
        verdict.reasons[rank] = reasons
    return verdict


def ring_rounds(nodes: int) -> List[List[Pair]]:
    """Every node with its ring neighbour, in rounds of disjoint pairs (each node once a round)."""
    if nodes < 2:
        return []
    edges = [(i, (i + 1) % nodes) for i in range(nodes)] if nodes > 2 else [(0, 1)]
    return rounds_of(edges)


def rounds_of(pairs: Iterable[Pair]) -> List[List[Pair]]:
    """Pairs grouped greedily into rounds in which no node appears twice."""
    rounds: List[List[Pair]] = []
    for pair in pairs:
        for members in rounds:
            if not any(set(pair) & set(p) for p in members):
                members.append(pair)
                break
        else:
            rounds.append([pair])
    return rounds


def suspect_pairs(
    verdict_cells: Sequence[Cell],
    hosts: Sequence[str],
    links: Sequence[Link],
    per_suspect: int = 2,
) -> List[Pair]:
    """Pairs still to measure: each suspect node against up to ``per_suspect`` healthy nodes
    it has not been measured with."""
    suspects: Set[int] = {
        hosts.index(c.host)
        for c in verdict_cells
        if c.status is not Status.PASS and c.host in hosts
    }
    if links:
        median = statistics.median(link.gbps for link in links)
        for link in links:
            if link.gbps < median:
                suspects |= set(link.pair)
    measured = {link.pair for link in links}
    healthy = [n for n in range(len(hosts)) if n not in suspects]
    wanted: List[Pair] = []
    for node in sorted(suspects):
        partners = [h for h in healthy if (min(node, h), max(node, h)) not in measured]
        wanted += [(min(node, h), max(node, h)) for h in partners[:per_suspect]]
    return list(dict.fromkeys(wanted))
