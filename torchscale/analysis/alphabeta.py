"""The alpha-beta model of all-reduce, fitted to measured all-reduce curves (docs/projection.md).

A message of ``n`` bytes crosses one link in ``alpha + n * beta`` (alpha: per-step latency,
beta: seconds per byte, 1 / link bandwidth). On ``p`` ranks:

* ring: ``T = 2 (p-1) alpha + 2 (p-1)/p * n * beta`` (reduce-scatter then all-gather, ``p-1``
  steps each, every step moving ``n/p`` bytes);
* tree: ``T = 2 ceil(log2 p) alpha + 2 n beta`` (a pipelined reduce up and broadcast down a
  binary tree);
* across ``m`` nodes of ``g`` ranks, the ring's ``2 (p-1)`` steps include ``2 m`` network
  crossings, and the bandwidth term runs at the slower link; the tree runs a chain inside each node
  and a binary tree over the nodes.

``alpha`` and ``beta`` come from a weighted least-squares fit of the ring equation to every
measured all-reduce (time per op at each size and group size): the times DDP's own reducer took
for one bucket (``communication.through_ddp``, what a training step pays) where the records have
them, else those taken right after compute (``communication.after_compute``), else the
back-to-back ones. The weight is ``1 / time``, so small messages (latency) and large ones
(bandwidth) count alike. NCCL (and gloo) choose ring or tree per size; the prediction takes the
faster, as they aim to. Pure numpy: no torch here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

from torchscale.measures.stats import finite_number
from torchscale.results.schema import CollectiveResult, ResultBase

INTRA_NODE = "intra_node"
INTER_NODE = "inter_node"
BACK_TO_BACK = "back to back"
AFTER_COMPUTE = "after compute"
THROUGH_DDP = "through DDP"
Point = Tuple[int, float, float]  # group size, bytes, time us
RING_STEPS = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0}
"""Ring steps per ``p - 1`` of each collective: an all-reduce is a reduce-scatter then an
all-gather, each ``(p-1) alpha + (p-1)/p * n * beta`` (``n``: the larger buffer, nccl-tests'
size: the gathered output, the scattered input)."""


@dataclass(frozen=True)
class AllReduceFit:
    """alpha (us per step) and beta (us per byte) of one fabric, with their covariance."""

    scope: str
    alpha_us: float
    beta_us_per_byte: float
    cov: Tuple[Tuple[float, float], Tuple[float, float]]
    points: int
    group_sizes: Tuple[int, ...]
    sizes: Tuple[int, int]  # smallest and largest message measured, bytes
    rel_rmse: float  # root mean square of (fit - measured) / measured
    timing: str = BACK_TO_BACK  # how the fitted times were taken
    op: str = "all_reduce"  # the collective fitted (RING_STEPS)

    @property
    def busbw_gbps(self) -> float:
        """The link bandwidth the fit implies (1 / beta), in GB/s."""
        return 1e-3 / self.beta_us_per_byte if self.beta_us_per_byte > 0 else math.inf

    def sigma_us(self, steps: float, byte_terms: float) -> float:
        """Standard error of ``steps * alpha + byte_terms * beta`` from the fit's covariance."""
        (aa, ab), (_, bb) = self.cov
        var = steps * steps * aa + 2 * steps * byte_terms * ab + byte_terms * byte_terms * bb
        return math.sqrt(max(var, 0.0))

    def describe(self) -> str:
        groups = ", ".join(str(p) for p in self.group_sizes)
        timing = {
            AFTER_COMPUTE: ", each timed after compute",
            THROUGH_DDP: ", each timed through DDP's reducer",
        }.get(self.timing, "")
        return (
            f"{self.op} {self.scope.replace('_', '-')}{timing}: alpha {self.alpha_us:.1f} us, "
            f"link {self.busbw_gbps:.3g} GB/s (fit to {self.points} points on {groups} ranks, "
            f"{self.sizes[0]:,}-{self.sizes[1]:,} B, error {self.rel_rmse:.0%})"
        )


def all_reduce_points(
    records: Iterable[ResultBase],
    scope: str,
    exclude_groups: Iterable[int] = (),
    op: str = "all_reduce",
) -> Tuple[List[Point], str]:
    """(group size, bytes, time us) of every measured all-reduce over ``scope``, and how they were
    timed: after compute where any record has those times (only those records), else back to back.

    ``intra_node`` takes world-scope records of one-node cells and intra_node-scope records;
    ``inter_node`` takes inter_node-scope records (one rank per node).
    """
    excluded = set(exclude_groups)
    back_to_back: List[Point] = []
    after_compute: List[Point] = []
    through_ddp: List[Point] = []
    for record in records:
        if not isinstance(record, CollectiveResult) or record.op != op:
            continue
        if record.status != "ok":
            continue
        if scope == INTRA_NODE:
            wanted = record.scope == INTRA_NODE or (
                record.scope == "world" and (record.nnodes or 1) == 1
            )
        else:
            wanted = record.scope == INTER_NODE
        group = int(record.group_size or record.world_size or 0)
        size, time_us = finite_number(record.size_bytes), finite_number(record.time_us)
        if not wanted or group < 2 or group in excluded or not size or not time_us:
            continue
        back_to_back.append((group, size, time_us))
        after = finite_number(record.after_compute_time_us)
        if after:
            after_compute.append((group, size, after))
        ddp = finite_number(record.ddp_time_us)
        if ddp:
            through_ddp.append((group, size, ddp))
    if through_ddp:
        return through_ddp, THROUGH_DDP
    if after_compute:
        return after_compute, AFTER_COMPUTE
    return back_to_back, BACK_TO_BACK


def fit_all_reduce(
    points: List[Point], scope: str, timing: str = BACK_TO_BACK, op: str = "all_reduce"
) -> Optional[AllReduceFit]:
    """Fit the ring equation of ``op`` to ``points``; None with fewer than two message sizes."""
    if len({size for _, size, _ in points}) < 2:
        return None
    k = RING_STEPS[op]
    p = np.array([g for g, _, _ in points], dtype=float)
    n = np.array([s for _, s, _ in points], dtype=float)
    t = np.array([us for _, _, us in points], dtype=float)
    design = np.column_stack([k * (p - 1), k * (p - 1) / p * n])
    weights = 1.0 / t
    theta, *_ = np.linalg.lstsq(design * weights[:, None], t * weights, rcond=None)
    alpha, beta = (max(float(v), 0.0) for v in theta)
    if beta <= 0:  # times did not grow with size: take the slope through the largest message
        big = int(np.argmax(n))
        beta = max(t[big] - design[big, 0] * alpha, 1e-9) / design[big, 1]
    fitted = design @ np.array([alpha, beta])
    rel = (fitted - t) / t
    dof = max(len(t) - 2, 1)
    scale = float(np.sum(rel**2)) / dof
    weighted = design * weights[:, None]
    try:
        cov = np.linalg.inv(weighted.T @ weighted) * scale
    except np.linalg.LinAlgError:
        cov = np.zeros((2, 2))
    return AllReduceFit(
        scope=scope,
        alpha_us=alpha,
        beta_us_per_byte=beta,
        cov=((float(cov[0, 0]), float(cov[0, 1])), (float(cov[1, 0]), float(cov[1, 1]))),
        points=len(t),
        group_sizes=tuple(sorted({int(g) for g in p})),
        sizes=(int(n.min()), int(n.max())),
        rel_rmse=math.sqrt(float(np.mean(rel**2))),
        timing=timing,
        op=op,
    )


@dataclass(frozen=True)
class Fabric:
    """The fitted links inside a node and (when measured) between nodes."""

    intra: AllReduceFit
    inter: Optional[AllReduceFit]
    gpus_per_node: int
    halves: Dict[str, AllReduceFit] = field(default_factory=dict)
    """all_gather and reduce_scatter fitted inside a node, where communication cells measured
    them (else :meth:`half_us` takes half a ring all-reduce)."""

    def half_us(self, op: str, ranks: int, nbytes: float) -> Tuple[float, float, str]:
        """(time us, standard error us, what it rests on) of one all-gather or reduce-scatter of
        ``nbytes`` (the larger buffer): its own fit inside a node, else half a ring all-reduce
        (a ring all-reduce is a reduce-scatter then an all-gather)."""
        if ranks < 2 or nbytes <= 0:
            return 0.0, 0.0, "none"
        nodes = math.ceil(ranks / self.gpus_per_node)
        fit = self.halves.get(op)
        if fit is not None and nodes == 1:
            steps, byte_terms = ranks - 1, (ranks - 1) / ranks * nbytes
            time = steps * fit.alpha_us + byte_terms * fit.beta_us_per_byte
            return time, fit.sigma_us(steps, byte_terms), "measured"
        if nodes > 1 and self.inter is None:
            raise ValueError(f"{ranks} ranks span {nodes} nodes and no inter-node fit is known")
        ring, sigma = self._ring(ranks, nodes, nbytes)
        return ring / 2, sigma / 2, "half an all-reduce"

    def all_reduce_us(self, ranks: int, nbytes: float) -> Tuple[float, float, str]:
        """(time us, standard error us, "ring" or "tree") of one all-reduce of ``nbytes``."""
        if ranks < 2 or nbytes <= 0:
            return 0.0, 0.0, "none"
        nodes = math.ceil(ranks / self.gpus_per_node)
        if nodes > 1 and self.inter is None:
            raise ValueError(f"{ranks} ranks span {nodes} nodes and no inter-node fit is known")
        ring, ring_sigma = self._ring(ranks, nodes, nbytes)
        tree, tree_sigma = self._tree(ranks, nodes, nbytes)
        return (ring, ring_sigma, "ring") if ring <= tree else (tree, tree_sigma, "tree")

    def _slow_link(self, nodes: int) -> AllReduceFit:
        if nodes > 1 and self.inter is not None:
            inter = self.inter
            return inter if inter.beta_us_per_byte > self.intra.beta_us_per_byte else self.intra
        return self.intra

    def _ring(self, p: int, m: int, n: float) -> Tuple[float, float]:
        link = self._slow_link(m)
        byte_terms = 2 * (p - 1) / p * n
        intra_steps = 2 * (p - m) if m > 1 else 2 * (p - 1)
        inter_steps = 2 * m if m > 1 else 0
        time = intra_steps * self.intra.alpha_us + byte_terms * link.beta_us_per_byte
        sigma2 = self.intra.sigma_us(intra_steps, 0.0) ** 2 + link.sigma_us(0.0, byte_terms) ** 2
        if inter_steps and self.inter is not None:
            time += inter_steps * self.inter.alpha_us
            sigma2 += self.inter.sigma_us(inter_steps, 0.0) ** 2
        return time, math.sqrt(sigma2)

    def _tree(self, p: int, m: int, n: float) -> Tuple[float, float]:
        link = self._slow_link(m)
        if m > 1 and self.inter is not None:
            intra_steps = 2 * (min(p, self.gpus_per_node) - 1)
            inter_steps = 2 * math.ceil(math.log2(m))
        else:
            intra_steps, inter_steps = 2 * math.ceil(math.log2(p)), 0
        time = intra_steps * self.intra.alpha_us + 2 * n * link.beta_us_per_byte
        sigma2 = self.intra.sigma_us(intra_steps, 0.0) ** 2 + link.sigma_us(0.0, 2 * n) ** 2
        if inter_steps and self.inter is not None:
            time += inter_steps * self.inter.alpha_us
            sigma2 += self.inter.sigma_us(inter_steps, 0.0) ** 2
        return time, math.sqrt(sigma2)
