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

The band is +-2 standard errors of the fit and of the reference step time, widened by the fit's
own error (the all-reduce fit's relative RMS error over the points it was fit to, applied to the
predicted communication time); a fit whose error exceeds FIT_ERROR_LIMIT is refused. It does not
cover the model's own error (see the docs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import pandas as pd

from torchscale.analysis.alphabeta import Fabric
from torchscale.analysis.projection_inputs import (
    ADD_ALL_REDUCE,
    ADD_GATHER_SCATTER,
    ADD_INTER_NODE,
    ASSUME_INTER_NODE,
    ProjectionError,
    Reference,
    fabric_from,
    references,
)
from torchscale.hardware.device_noun import count_text
from torchscale.results.schema import ResultBase

__all__ = [  # the model here, and what it reads from projection_inputs
    "ADD_ALL_REDUCE", "ADD_GATHER_SCATTER", "ADD_INTER_NODE", "COMPUTE_DRIFT_LIMIT",
    "CPU_WAIT_LIMIT", "Projection", "ProjectionError", "Reference", "calibrate",
    "expected_max_excess", "exposed_comm_ms", "predict", "project", "strategy_comm_ms",
]  # fmt: skip

BAND_SIGMAS = 2.0
FIT_ERROR_LIMIT = 1.0
"""An all-reduce fit off its own points by more than this (relative RMS: as much as the times
themselves) predicts nothing: they moved more than the model explains (a busy host, say);
``project`` refuses. Below it the band is widened by the error (on the 2-core VM under load ~10
a fit was off by 53%)."""
COMPUTE_DRIFT_LIMIT = 0.10
"""With --holdout: when the held-out cell's own compute-only step differs from the reference's by
more than this, the node itself changed between the runs (a busier machine, shared cores), which
no projection from the smaller count can foresee; the output says so."""
CPU_WAIT_LIMIT = 0.10
"""... and likewise when a rank's training thread waited for a CPU (runnable, not running) for more
than this share of either cell's measured window: the host was oversubscribed while it measured."""


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


def sharded_comm_ms(fabric: Fabric, ranks: int, ref: Reference) -> Dict[str, Any]:
    """FSDP2's collectives against the compute they overlap: the forward's all-gathers under
    forward compute, the backward's all-gathers and reduce-scatters under backward compute, each
    phase's in a row. The first all-gather (nothing computes before it) and the last
    reduce-scatter (nothing computes after it) are exposed, and what a phase's collectives take
    beyond its compute."""
    # per phase: [its collectives' time, its compute, the part nothing can hide]
    phases = {"forward": [0.0, ref.forward_ms, 0.0], "backward": [0.0, ref.backward_ms, 0.0]}
    var, sources = 0.0, set()
    for op, (forward, backward, total) in ref.issued.items():
        calls = forward + backward
        us, sigma, source = fabric.half_us(op, ranks, total / calls if calls else 0.0)
        sources.add(f"{op}: {source}")
        phases["forward"][0] += forward * us / 1e3
        phases["backward"][0] += backward * us / 1e3
        var += calls * (sigma / 1e3) ** 2
        if op == "all_gather" and forward:
            phases["forward"][2] = us / 1e3  # the first gather: nothing computes before it
        if op == "reduce_scatter" and backward:
            phases["backward"][2] = us / 1e3  # the last scatter: nothing computes after it
    comm = sum(c for c, _, _ in phases.values())
    exposed = sum(edge + max(0.0, c - edge - t) for c, t, edge in phases.values())
    return {
        "comm_ms": comm,
        "exposed_ms": exposed,
        "sigma_ms": math.sqrt(var) * (exposed / comm if comm > 0 else 0.0),
        "algorithm": "ring" if comm > 0 else "none",
        "sources": sorted(sources),
    }


def strategy_comm_ms(fabric: Fabric, ranks: int, ref: Reference) -> Dict[str, Any]:
    """The collectives ``ref``'s strategy issues at ``ranks``, scheduled against its compute:
    DDP's gradient buckets all-reduced during backward; replicate's blocks all-reduced the same
    way, one per block; fsdp2's all-gathers and reduce-scatters (:func:`sharded_comm_ms`)."""
    if ref.strategy.startswith("fsdp2") and ref.issued:
        return sharded_comm_ms(fabric, ranks, ref)
    if ref.strategy == "replicate" and ref.issued.get("all_reduce"):
        _, calls, total = ref.issued["all_reduce"]
        per_block = Reference(**{**ref.__dict__, "buckets": [total // calls] * calls})
        return exposed_comm_ms(fabric, ranks, per_block)
    return exposed_comm_ms(fabric, ranks, ref)


def issued_text(ref: Reference) -> str:
    """What a step of ``ref``'s strategy issues, in words."""
    if not ref.issued:
        return f"{len(ref.buckets)} gradient all-reduce(s)"
    parts = []
    for op, (forward, backward, total) in sorted(ref.issued.items()):
        where = f"{forward} forward + {backward} backward" if forward else f"{backward}"
        parts.append(f"{where} {op} ({total:,} B)")
    return ", ".join(parts)


def predict(ref: Reference, fabric: Fabric, gpus: int) -> Dict[str, Any]:
    """One target size: step time, throughput and efficiency with their band."""
    nodes = math.ceil(gpus / fabric.gpus_per_node)
    if nodes > 1 and fabric.inter is None:
        raise ProjectionError(
            f"{count_text(gpus, ref.device_kind)} span {nodes} nodes of {fabric.gpus_per_node} "
            "(--gpus-per-node) and no "
            f"all-reduce across nodes was measured: {ASSUME_INTER_NODE}"
        )
    comm = strategy_comm_ms(fabric, gpus, ref)
    noise = expected_max_excess(ref.step_noise_ms, gpus)
    step = ref.compute_ms + ref.other_ms + noise + comm["exposed_ms"]
    # The fit's own error on the points it was fit to, on the communication it predicts: a
    # band narrower than the fit's misses says more than the fit knows.
    fit_error = fit_error_of(fabric, nodes)
    sigma = math.hypot(comm["sigma_ms"], ref.step_se_ms, fit_error * comm["comm_ms"] / BAND_SIGMAS)
    low, high = max(step - BAND_SIGMAS * sigma, 1e-9), step + BAND_SIGMAS * sigma
    throughput = gpus * ref.batch_per_gpu / step * 1e3
    base = min(ref.measured)
    ideal_per_gpu = ref.measured[base] / base
    return {
        "experiment": ref.experiment,
        "model": ref.model,
        "variant": ref.variant,
        "strategy": ref.strategy,
        "collectives": issued_text(ref),
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
        "all_reduce_timing": fabric.intra.timing,
        "throughput": throughput,
        "throughput_low": gpus * ref.batch_per_gpu / high * 1e3,
        "throughput_high": gpus * ref.batch_per_gpu / low * 1e3,
        "efficiency": throughput / (gpus * ideal_per_gpu),
        "measured_throughput": ref.measured.get(gpus),
        "measured_compute_ms": ref.measured_compute.get(gpus),
        "cpu_wait_share": ref.cpu_wait.get(gpus),
        "measured_comm_ms": ref.measured_comm.get(gpus),
        "reference_cpu_wait_share": ref.cpu_wait.get(ref.world_size),
        "measured_on": ref.device_kind,
        "fit_error": fit_error,
    }


def fit_error_of(fabric: Fabric, nodes: int) -> float:
    """The relative RMS error of the all-reduce fits a prediction on ``nodes`` nodes uses."""
    errors = [fabric.intra.rel_rmse]
    if nodes > 1 and fabric.inter is not None and fabric.inter.points:
        errors.append(fabric.inter.rel_rmse)
    return max(errors)


def check_fit(fabric: Fabric, experiment: str) -> None:
    """Refuse a fabric whose fit is off its own points by more than :data:`FIT_ERROR_LIMIT`."""
    for fit in [fabric.intra, fabric.inter]:
        if fit is None or not fit.points or fit.rel_rmse <= FIT_ERROR_LIMIT:
            continue
        raise ProjectionError(
            f"{experiment}: the all-reduce fit is off its own {fit.points} points by "
            f"{fit.rel_rmse:.0%} (relative RMS), above the {FIT_ERROR_LIMIT:.0%} a projection can "
            "rest on: the times moved more than the alpha-beta model explains (a busy host?); "
            "rerun the communication cells on a quiet node"
        )


@dataclass
class Projection:
    table: pd.DataFrame
    basis: List[str]
    fabric: Fabric
    references: List[Reference]


def calibrate(ref: Reference, fabric: Fabric) -> Reference:
    """Set ``other_ms`` so that the model reproduces the reference cell's own step time."""
    comm = strategy_comm_ms(fabric, ref.world_size, ref)
    noise = expected_max_excess(ref.step_noise_ms, ref.world_size)
    ref.other_ms = max(0.0, ref.step_ms - ref.compute_ms - noise - comm["exposed_ms"])
    overlap = (
        "not measured (1 rank): the bucket schedule alone"
        if ref.overlap is None
        else f"{ref.overlap:.0%}"
    )
    ref.basis = [
        f"{ref.model} · {ref.variant}: from {count_text(ref.world_size, ref.device_kind)}, "
        f"cell {ref.cell_id}",
        f"compute-only step {ref.compute_ms:.3g} ms (no_sync probe), DDP backward "
        f"{ref.backward_ms:.3g} ms, other {ref.other_ms:.3g} ms",
        f"{len(ref.buckets)} gradient bucket(s), {sum(ref.buckets):,} B; "
        f"measured overlap {overlap}",
    ]
    if ref.issued:
        ref.basis[1] = ref.basis[1].replace("DDP backward", "backward")
        ref.basis[2] = f"{ref.strategy}: a step issues {issued_text(ref)}"
        if ref.strategy.startswith("fsdp2"):
            ref.basis[2] += f" (forward compute {ref.forward_ms:.3g} ms)"
            missing = [op for op in ref.issued if op not in fabric.halves]
            if missing:
                ref.basis.append(
                    f"{' and '.join(missing)}: not measured, taken as half a ring all-reduce of "
                    f"the same bytes; to measure them, {ADD_GATHER_SCATTER}"
                )
    wait = ref.cpu_wait.get(ref.world_size)
    if wait is not None and wait > CPU_WAIT_LIMIT:
        ref.basis.append(
            f"CAUTION: a rank of the reference cell waited for a CPU for {wait:.0%} of its window "
            "(an oversubscribed host): its step time, and every prediction from it, is inflated; "
            "rerun that cell on a quiet node"
        )
    return ref


def project(
    records: Iterable[ResultBase],
    gpus: Sequence[int],
    gpus_per_node: int = 8,
    holdout: bool = False,
    inter_node_gbps: Optional[float] = None,
    folders: Optional[Mapping[str, Path]] = None,
) -> Projection:
    """Every configuration's prediction at each of ``gpus`` (and, with ``holdout``, at the
    held-out count, next to what was measured there). ``folders``: each experiment's folder, for
    the command a refusal names."""
    records = list(records)
    refs = references(records, holdout)
    fabric = fabric_from(records, gpus_per_node, inter_node_gbps, folders=folders)  # or refuses
    # Each experiment's own all-reduce curves where it has them: another experiment's may have
    # run on other hardware.
    fabrics: Dict[str, Fabric] = {}
    for experiment in sorted({ref.experiment for ref in refs}):
        own = [r for r in records if r.experiment == experiment]
        try:
            fabrics[experiment] = fabric_from(own, gpus_per_node, inter_node_gbps)
        except ProjectionError:
            fabrics[experiment] = fabric
    rows = []
    for experiment, used in fabrics.items():
        check_fit(used, experiment)
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
        basis += [prefix + fit.describe() for _, fit in sorted(used.halves.items())]
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
        else ["throughput", "measured_throughput", "measured_compute_ms", "compute_ms", "step_ms"],
    )
    measured = table["measured_throughput"]
    table["error"] = (table["throughput"] - measured) / measured
    table["compute_drift"] = table["measured_compute_ms"] / table["compute_ms"] - 1.0
    # The same prediction with the held-out cell's own compute-only step: what is left is the
    # model's error (communication, noise, DDP's overhead) apart from the node's own drift.
    at_measured = table["step_ms"] - table["compute_ms"] + table["measured_compute_ms"]
    table["error_at_measured_compute"] = (
        table["throughput"] * table["step_ms"] / at_measured - measured
    ) / measured
    return Projection(table, basis, fabric, refs)
