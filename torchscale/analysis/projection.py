"""Predict step time, throughput and efficiency at GPU counts not measured (docs/projection.md).

Per configuration (model x settings apart from the GPU count), from the largest GPU count measured
(the *reference* cell):

``t_step(N) = t_compute + t_other + t_noise(N) + t_exposed(N)``

* ``t_compute``: the compute-only step time of the no_sync probe, mean of the ranks;
* ``t_other``: what the reference step costs beyond compute, noise and exposed communication
  (DDP's bucket copies and hooks), held constant;
* ``t_noise(N)``: DDP steps end together, so a step costs the slowest of N ranks: the expected
  maximum of N draws from the reference cell's per-step times, minus their mean;
* ``t_exposed(N)``: the gradient buckets (DDP's own layout) all-reduced one after the other as
  backward produces them (at a uniform rate per byte over DDP's backward compute time), with the
  alpha-beta fabric (``alphabeta.py``); what ends after backward is exposed. When the reference
  cell ran on two ranks or more, DDP's measured overlap caps what the schedule may hide.

The band is +-2 standard errors of the fit and of the reference step time; it does not cover the
model's own error (see the docs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import pandas as pd

from torchscale.analysis.alphabeta import (
    INTER_NODE,
    INTRA_NODE,
    AllReduceFit,
    Fabric,
    all_reduce_points,
    fit_all_reduce,
)
from torchscale.analysis.scaling import label_variants
from torchscale.analysis.stats import mean
from torchscale.analysis.tables import training_table
from torchscale.errors import TorchscaleError
from torchscale.results.schema import ResultBase, TrainingResult

BAND_SIGMAS = 2.0
COMPUTE_DRIFT_LIMIT = 0.10
"""With --holdout: when the held-out cell's own compute-only step differs from the reference's by
more than this, the node itself changed between the runs (a busier machine, shared cores), which
no projection from the smaller count can foresee; the output says so."""
CPU_WAIT_LIMIT = 0.10
"""... and likewise when a rank's training thread waited for a CPU (runnable, not running) for more
than this share of either cell's measured window: the host was oversubscribed while it measured."""

ADD_ALL_REDUCE = (
    "add 'communication: {collectives: [all_reduce], min_bytes: 1K, max_bytes: 64M}' with "
    "gpu_counts of 2 or more to the config and run 'torchscale benchmark --benchmark comm' "
    "into the same results folder"
)
ADD_INTER_NODE = (
    "add 'nodes: [2]' and 'communication: {collectives: [all_reduce], scope: [inter_node]}' to a "
    "config, run it on two nodes into the same results folder, or pass --gpus-per-node large "
    "enough to stay on one node"
)


class ProjectionError(TorchscaleError):
    """A measurement the projection rests on is missing: the message names the config to add."""


@dataclass
class Reference:
    """What one configuration's projection rests on."""

    experiment: str
    model: str
    variant: str
    unit: str
    batch_per_gpu: float  # units per GPU per step
    measured: Dict[int, float]  # world size -> measured throughput (mean of repeats)
    measured_compute: Dict[int, float]  # world size -> compute-only step ms measured there
    cpu_wait: Dict[int, float]  # world size -> largest share of the window a rank waited for a CPU
    world_size: int
    cell_id: str
    step_ms: float
    compute_ms: float
    backward_ms: float
    buckets: List[int]
    overlap: Optional[float]
    step_noise_ms: List[float]  # per-step deviations from the mean, all ranks
    step_se_ms: float
    other_ms: float = 0.0
    basis: List[str] = field(default_factory=list)


def expected_max_excess(deviations: Sequence[float], n: int) -> float:
    """E[max of n draws] from the empirical distribution of ``deviations`` (mean-centred)."""
    values = sorted(deviations)
    k = len(values)
    if n <= 1 or k == 0:
        return 0.0
    return sum(v * ((i / k) ** n - ((i - 1) / k) ** n) for i, v in enumerate(values, 1))


def exposed_comm_ms(fabric: Fabric, ranks: int, ref: Reference) -> Dict[str, Any]:
    """Bucket-by-bucket schedule of the gradient all-reduces against backward compute."""
    total_bytes = sum(ref.buckets)
    ready, end, comm, var = 0.0, 0.0, 0.0, 0.0
    algorithms = set()
    for size in ref.buckets:
        ready += ref.backward_ms * size / total_bytes
        us, sigma, algorithm = fabric.all_reduce_us(ranks, size)
        end = max(end, ready) + us / 1e3
        comm += us / 1e3
        var += (sigma / 1e3) ** 2
        algorithms.add(algorithm)
    exposed = max(0.0, end - ref.backward_ms)
    if ref.overlap is not None:
        exposed = max(exposed, comm * (1.0 - ref.overlap))
    sigma = math.sqrt(var) * (exposed / comm if comm > 0 else 0.0)
    return {
        "comm_ms": comm,
        "exposed_ms": exposed,
        "sigma_ms": sigma,
        "algorithm": "/".join(sorted(algorithms - {"none"})) or "none",
    }


def _rank_mean(record: TrainingResult, name: str) -> Optional[float]:
    return mean([getattr(r, name) for r in record.per_rank if getattr(r, name) is not None])


def _reference(
    row: Mapping[str, Any],
    record: TrainingResult,
    measured: Dict[int, float],
    measured_compute: Dict[int, float],
    cpu_wait: Dict[int, float],
) -> Reference:
    where = f"{record.model} on {record.world_size} GPU(s) ({record.cell_id})"
    compute = _rank_mean(record, "nosync_step_ms")
    if compute is None:
        raise ProjectionError(
            f"{where} has no compute-only step time: set 'sync_probe_steps: 5' in the config "
            "and rerun the training cells"
        )
    backward = _rank_mean(record, "ddp_backward_compute_ms")
    if backward is None:
        backward = mean(
            [max(r.backward_ms - (r.sync_wait_ms or 0.0), 0.0) for r in record.per_rank]
        )
    ddp = record.runtime.get("ddp") or {}
    buckets = [int(b) for b in ddp.get("bucket_sizes") or [] if b]
    grads = record.memory.grads_bytes if record.memory else None
    if not buckets and grads:
        buckets = [grads]
    if not buckets:
        raise ProjectionError(f"{where} records no gradient bytes: rerun its training cells")
    overlap = None
    if record.world_size > 1:
        pairs = [
            (r.ddp_backward_overlap_ms, r.ddp_backward_comm_ms)
            for r in record.per_rank
            if r.ddp_backward_comm_ms and r.ddp_backward_overlap_ms is not None
        ]
        if pairs:
            overlap = min(1.0, max(0.0, mean([o / c for o, c in pairs]) or 0.0))
    steps = record.measure_steps or len(record.step_times_ms) or 1
    step_ms = (record.measured_s or 0.0) * 1e3 / steps or record.step_time_ms.mean
    noise = [t - r.step_time_ms.mean for r in record.per_rank for t in r.step_times_ms]
    std = record.step_time_ms.std if record.step_time_ms else 0.0
    units = record.units_per_sample * record.batch_size * record.grad_accum_steps
    return Reference(
        experiment=record.experiment,
        model=record.model,
        variant=str(row["variant"]),
        unit=record.unit or "samples",
        batch_per_gpu=units,
        measured=measured,
        measured_compute=measured_compute,
        cpu_wait=cpu_wait,
        world_size=record.world_size,
        cell_id=record.cell_id,
        step_ms=step_ms,
        compute_ms=compute,
        backward_ms=backward or 0.0,
        buckets=buckets,
        overlap=overlap,
        step_noise_ms=noise,
        step_se_ms=std / math.sqrt(steps),
    )


def cpu_wait_share(record: TrainingResult) -> Optional[float]:
    """The largest share of the measured window any rank's training thread spent runnable but
    waiting for a CPU (None where the host does not report it)."""
    shares = [
        r.cpu_wait_s / r.window_s
        for r in record.per_rank
        if r.cpu_wait_s is not None and r.window_s > 0
    ]
    return max(shares) if shares else None


def references(records: Iterable[ResultBase], holdout: bool = False) -> List[Reference]:
    """One reference per configuration: its largest measured GPU count (the one below it when
    ``holdout``), with every measured throughput kept for comparison."""
    trained = [r for r in records if isinstance(r, TrainingResult)]
    table = label_variants(training_table(trained))
    ok = table[(table["status"] == "ok") & table["throughput"].notna()]
    if ok.empty:
        raise ProjectionError(
            "no measured training cell: run 'torchscale benchmark' with models, batch_sizes and "
            "gpu_counts into this results folder first"
        )
    by_id = {r.cell_id: r for r in trained}
    found = []
    for _, group in ok.groupby(["experiment", "config_key"], sort=True):
        one_node = group[group["nnodes"] == 1]
        if one_node.empty:  # measured across nodes only: take those cells as they are
            one_node = group
        measured = one_node.groupby("world_size")["throughput"].mean().to_dict()
        sizes = sorted(measured)
        if holdout:
            if len(sizes) < 2:
                continue
            sizes = sizes[:-1]
        row = one_node[one_node["world_size"] == sizes[-1]].iloc[-1] if sizes else group.iloc[-1]
        compute, waits = {}, {}
        for size in measured:
            cells = [by_id[c] for c in one_node[one_node["world_size"] == size]["cell_id"]]
            values = [_rank_mean(c, "nosync_step_ms") for c in cells]
            known = [v for v in values if v is not None]
            if known:
                compute[int(size)] = sum(known) / len(known)
            shares = [cpu_wait_share(c) for c in cells]
            if any(v is not None for v in shares):
                waits[int(size)] = max(v for v in shares if v is not None)
        measured = {int(k): float(v) for k, v in measured.items()}
        found.append(_reference(row, by_id[row["cell_id"]], measured, compute, waits))
    if not found:
        raise ProjectionError(
            "--holdout needs one configuration measured at two GPU counts or more on one node: "
            "add a count to gpu_counts, e.g. [1, 2]"
        )
    return found


def fabric_from(
    documents: Iterable[Mapping[str, Any]],
    gpus_per_node: int,
    inter_node_gbps: Optional[float] = None,
    inter_node_latency_us: float = 10.0,
) -> Fabric:
    """Fit the fabric; ``inter_node_gbps`` stands in for an unmeasured network (an assumption)."""
    documents = list(documents)
    intra = fit_all_reduce(all_reduce_points(documents, INTRA_NODE), INTRA_NODE)
    if intra is None:
        raise ProjectionError(
            f"no all_reduce measured inside a node at two sizes or more: {ADD_ALL_REDUCE}"
        )
    inter = fit_all_reduce(all_reduce_points(documents, INTER_NODE), INTER_NODE)
    if inter is None and inter_node_gbps:
        inter = AllReduceFit(
            INTER_NODE,
            inter_node_latency_us,
            1e-3 / inter_node_gbps,
            ((0.0, 0.0), (0.0, 0.0)),
            0,
            (),
            (0, 0),
            0.0,
        )
    return Fabric(intra, inter, gpus_per_node)


def predict(ref: Reference, fabric: Fabric, gpus: int) -> Dict[str, Any]:
    """One target size: step time, throughput and efficiency with their band."""
    nodes = math.ceil(gpus / fabric.gpus_per_node)
    if nodes > 1 and fabric.inter is None:
        raise ProjectionError(
            f"{gpus} GPUs span {nodes} nodes of {fabric.gpus_per_node} and no all-reduce across "
            f"nodes was measured: {ADD_INTER_NODE}"
        )
    comm = exposed_comm_ms(fabric, gpus, ref)
    noise = expected_max_excess(ref.step_noise_ms, gpus)
    step = ref.compute_ms + ref.other_ms + noise + comm["exposed_ms"]
    sigma = math.hypot(comm["sigma_ms"], ref.step_se_ms)
    low, high = max(step - BAND_SIGMAS * sigma, 1e-9), step + BAND_SIGMAS * sigma
    throughput = gpus * ref.batch_per_gpu / step * 1e3
    base = min(ref.measured)
    ideal_per_gpu = ref.measured[base] / base
    return {
        "experiment": ref.experiment,
        "model": ref.model,
        "variant": ref.variant,
        "unit": ref.unit,
        "world_size": gpus,
        "nodes": nodes,
        "from_gpus": ref.world_size,
        "step_ms": step,
        "step_ms_low": low,
        "step_ms_high": high,
        "compute_ms": ref.compute_ms,
        "noise_ms": noise,
        "other_ms": ref.other_ms,
        "comm_ms": comm["comm_ms"],
        "exposed_comm_ms": comm["exposed_ms"],
        "algorithm": comm["algorithm"],
        "throughput": throughput,
        "throughput_low": gpus * ref.batch_per_gpu / high * 1e3,
        "throughput_high": gpus * ref.batch_per_gpu / low * 1e3,
        "efficiency": throughput / (gpus * ideal_per_gpu),
        "measured_throughput": ref.measured.get(gpus),
        "measured_compute_ms": ref.measured_compute.get(gpus),
        "cpu_wait_share": ref.cpu_wait.get(gpus),
        "reference_cpu_wait_share": ref.cpu_wait.get(ref.world_size),
    }


@dataclass
class Projection:
    table: pd.DataFrame
    basis: List[str]
    fabric: Fabric
    references: List[Reference]


def calibrate(ref: Reference, fabric: Fabric) -> Reference:
    """Set ``other_ms`` so that the model reproduces the reference cell's own step time."""
    comm = exposed_comm_ms(fabric, ref.world_size, ref)
    noise = expected_max_excess(ref.step_noise_ms, ref.world_size)
    ref.other_ms = max(0.0, ref.step_ms - ref.compute_ms - noise - comm["exposed_ms"])
    overlap = (
        "not measured (1 rank): the bucket schedule alone"
        if ref.overlap is None
        else f"{ref.overlap:.0%}"
    )
    ref.basis = [
        f"{ref.model} · {ref.variant}: from {ref.world_size} GPU(s), cell {ref.cell_id}",
        f"compute-only step {ref.compute_ms:.3g} ms (no_sync probe), DDP backward "
        f"{ref.backward_ms:.3g} ms, other {ref.other_ms:.3g} ms",
        f"{len(ref.buckets)} gradient bucket(s), {sum(ref.buckets):,} B; "
        f"measured overlap {overlap}",
    ]
    return ref


def project(
    records: Iterable[ResultBase],
    documents: Iterable[Mapping[str, Any]],
    gpus: Sequence[int],
    gpus_per_node: int = 8,
    holdout: bool = False,
    inter_node_gbps: Optional[float] = None,
) -> Projection:
    """Every configuration's prediction at each of ``gpus`` (and, with ``holdout``, at the
    held-out count, next to what was measured there)."""
    refs = references(records, holdout)
    documents = list(documents)
    fabric = fabric_from(documents, gpus_per_node, inter_node_gbps)  # refuses when none
    # Each experiment's own all-reduce curves where it has them: another experiment's may have
    # run on other hardware.
    fabrics: Dict[str, Fabric] = {}
    for experiment in sorted({ref.experiment for ref in refs}):
        own = [d for d in documents if d.get("experiment") == experiment]
        try:
            fabrics[experiment] = fabric_from(own, gpus_per_node, inter_node_gbps)
        except ProjectionError:
            fabrics[experiment] = fabric
    rows = []
    for ref in refs:
        calibrate(ref, fabrics[ref.experiment])
        if len(fabrics) > 1:
            ref.basis[0] = f"{ref.experiment}: {ref.basis[0]}"
        targets = sorted(set(gpus))
        if holdout:
            targets = sorted(set(targets) | {max(ref.measured)})
        rows += [predict(ref, fabrics[ref.experiment], n) for n in targets]
    basis = []
    for experiment, used in fabrics.items():
        prefix = f"{experiment}: " if len(fabrics) > 1 else ""
        basis.append(prefix + used.intra.describe())
        if used.inter is not None:
            basis.append(
                prefix
                + (
                    used.inter.describe()
                    if used.inter.points
                    else f"across nodes: ASSUMED {used.inter.busbw_gbps:.3g} GB/s, "
                    f"{used.inter.alpha_us:g} us (--inter-node-gbps), not measured"
                )
            )
    basis += [line for ref in refs for line in ref.basis]
    table = pd.DataFrame(
        rows,
        columns=list(rows[0])
        if rows
        else ["throughput", "measured_throughput", "measured_compute_ms", "compute_ms"],
    )
    measured = table["measured_throughput"]
    table["error"] = (table["throughput"] - measured) / measured
    table["compute_drift"] = table["measured_compute_ms"] / table["compute_ms"] - 1.0
    return Projection(table, basis, fabric, refs)
