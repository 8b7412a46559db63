"""What a projection rests on: the reference cell of each configuration and the fitted fabric,
read from result records, or a one-line refusal naming the config that would measure what is
missing (see ``projection.py`` for the model)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional

from torchscale.analysis.alphabeta import (
    INTER_NODE,
    INTRA_NODE,
    AllReduceFit,
    Fabric,
    all_reduce_points,
    fit_all_reduce,
)
from torchscale.analysis.cpu_load import cpu_wait_share
from torchscale.analysis.scaling import label_variants
from torchscale.analysis.training_tables import training_table
from torchscale.errors import TorchscaleError
from torchscale.escaping import shown_command
from torchscale.hardware.device_noun import CUDA, count_text, record_device_kind
from torchscale.kinds.kind_registry import SCRIPT_KIND
from torchscale.measures.stats import mean
from torchscale.measures.table_scalars import as_float, as_int
from torchscale.plan.kind_protocol import records_of
from torchscale.results.schema import ResultBase, TrainingResult

if TYPE_CHECKING:
    import pandas as pd

ADD_ALL_REDUCE = (
    "add 'communication: {collectives: [all_reduce], min_bytes: 1K, max_bytes: 64M, "
    "through_ddp: true}' with "
    "gpu_counts of 2 or more to the config and run 'torchscale benchmark --benchmark comm "
    "--resume' into the same results folder"
)
SCRIPT_COMM_SECTION = (
    "{collectives: [all_reduce], p2p: false, min_bytes: 1K, max_bytes: 64M, through_ddp: true}"
)
"""The communication cells a script's experiment needs for ``project`` (docs/own-job.md)."""
ADD_INTER_NODE = (
    "add 'nodes: [2]' and 'communication: {collectives: [all_reduce], scope: [inter_node]}' to a "
    "config, run it on two nodes into the same results folder, or pass --gpus-per-node large "
    "enough to stay on one node"
)
ASSUME_INTER_NODE = (
    "pass --inter-node-gbps with the network's all-reduce bandwidth in GB/s (e.g. "
    "--inter-node-gbps 25: an assumption, stated beside the results), or measure it: add "
    "'nodes: [2]' and 'communication: {collectives: [all_reduce], scope: [inter_node]}' to a "
    "config and run it on two nodes into the same results folder"
)


ADD_GATHER_SCATTER = (
    "add 'communication: {collectives: [all_gather, reduce_scatter], min_bytes: 1K, "
    "max_bytes: 64M}' with gpu_counts of 2 or more to the config and run 'torchscale benchmark "
    "--benchmark comm --resume' into the same results folder"
)
"""The communication cells that measure what FSDP2's steps issue (``project`` takes half a ring
all-reduce for each without them)."""
HALVES = ("all_gather", "reduce_scatter")


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
    measured_comm: Dict[int, float]  # world size -> DDP's all-reduce ms per step, mean of ranks
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
    device_kind: str = CUDA  # what the reference ran on (cpu: gloo processes, not GPUs)
    strategy: str = "ddp"
    forward_ms: float = 0.0  # forward compute per step (fsdp2's all-gathers hide under it)
    issued: Dict[str, List[int]] = field(default_factory=dict)
    """What one step of the strategy issues, per collective: [calls forward, calls backward,
    bytes per call] (fsdp2: all_gather, reduce_scatter; replicate: all_reduce)."""


def _issued(record: TrainingResult) -> Dict[str, List[int]]:
    """The collectives ``record``'s strategy issues in a step: the counted ones
    (``collectives``) where the record has them, else the strategy's own from its blocks and the
    model's bytes (a cell at one rank may issue none)."""
    strategy = str(record.settings.get("strategy", "ddp"))
    if strategy == "ddp":
        return {}
    applied = record.runtime.get("strategy") or {}
    calls = int(applied.get("blocks") or 0) + 1  # every block, then the root
    memory = record.memory
    grads = memory.grads_bytes if memory else 0
    counted = {c.op: c for c in record.collectives}
    if strategy == "replicate":
        ar = counted.get("all_reduce")
        if ar and ar.calls:
            return {"all_reduce": [0, ar.calls, ar.bytes]}
        return {"all_reduce": [0, calls, grads]}
    ag, rs = counted.get("all_gather"), counted.get("reduce_scatter")
    if ag and ag.calls and rs and rs.calls:
        forward = min(calls, ag.calls)
        return {
            "all_gather": [forward, ag.calls - forward, ag.bytes],
            "reduce_scatter": [0, rs.calls, rs.bytes],
        }
    world = max(record.world_size, 1)  # a rank holds 1/N: the model is N shards
    params = (memory.params_bytes if memory else 0) * world
    backward = calls - 1 if applied.get("reshard_after_forward", True) else 0  # not the root
    return {
        "all_gather": [calls, backward, params * (calls + backward) // calls],
        "reduce_scatter": [0, calls, grads * world],
    }


def _rank_mean(record: TrainingResult, name: str) -> Optional[float]:
    return mean([getattr(r, name) for r in record.per_rank if getattr(r, name) is not None])


def _reference(
    row: pd.Series[Any],
    record: TrainingResult,
    measured: Dict[int, float],
    measured_compute: Dict[int, float],
    cpu_wait: Dict[int, float],
    measured_comm: Dict[int, float],
) -> Reference:
    device_kind = record_device_kind(record) or CUDA
    where = f"{record.model} on {count_text(record.world_size, device_kind)} ({record.cell_id})"
    compute = _rank_mean(record, "nosync_step_ms")
    if compute is None:
        raise ProjectionError(
            f"{where} has no compute-only step time: set 'sync_probe_steps: 10' in the config "
            "(any count above 0) and rerun the training cells"
        )
    backward = _rank_mean(record, "ddp_backward_compute_ms")
    if backward is None:
        backward = mean(
            [max(r.backward_ms - (r.sync_wait_ms or 0.0), 0.0) for r in record.per_rank]
        )
    ddp = record.runtime.get("ddp") or {}
    buckets = [int(b) for b in ddp.get("bucket_sizes") or [] if b]
    grads = record.memory.grads_bytes if record.memory else None
    issued = _issued(record)
    if not buckets and issued:  # the strategy's gradient reduction
        buckets = [issued[op][2] for op in ("all_reduce", "reduce_scatter") if op in issued]
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
    mean_step = record.step_time_ms.mean if record.step_time_ms else 0.0
    step_ms = (record.measured_s or 0.0) * 1e3 / steps or mean_step
    noise = [
        t - r.step_time_ms.mean for r in record.per_rank if r.step_time_ms for t in r.step_times_ms
    ]
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
        measured_comm=measured_comm,
        world_size=record.world_size,
        cell_id=record.cell_id,
        step_ms=step_ms,
        compute_ms=compute,
        backward_ms=backward or 0.0,
        buckets=buckets,
        overlap=overlap,
        step_noise_ms=noise,
        step_se_ms=std / math.sqrt(steps),
        device_kind=device_kind,
        strategy=str(record.settings.get("strategy", "ddp")),
        forward_ms=_rank_mean(record, "forward_ms") or 0.0,
        issued=issued,
    )


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
        means = one_node.groupby("world_size")["throughput"].mean()
        measured = {as_int(k): as_float(v) for k, v in means.items()}
        sizes = sorted(measured)
        if holdout:
            if len(sizes) < 2:
                continue
            sizes = sizes[:-1]
        row = one_node[one_node["world_size"] == sizes[-1]].iloc[-1] if sizes else group.iloc[-1]
        compute: Dict[int, float] = {}
        waits: Dict[int, float] = {}
        comms: Dict[int, float] = {}
        for size in measured:
            cells = [by_id[c] for c in one_node[one_node["world_size"] == size]["cell_id"]]
            values = [_rank_mean(c, "nosync_step_ms") for c in cells]
            known = [v for v in values if v is not None]
            if known:
                compute[size] = sum(known) / len(known)
            comm = [_rank_mean(c, "ddp_backward_comm_ms") for c in cells if c.world_size > 1]
            if any(v is not None for v in comm):
                comms[size] = mean([v for v in comm if v is not None]) or 0.0
            shares = [cpu_wait_share(c) for c in cells]
            if any(v is not None for v in shares):
                waits[size] = max(v for v in shares if v is not None)
        found.append(_reference(row, by_id[row["cell_id"]], measured, compute, waits, comms))
    if not found:
        raise ProjectionError(
            "--holdout needs one configuration measured at two GPU counts or more on one node: "
            "add a count to gpu_counts, e.g. [1, 2]"
        )
    return found


def add_all_reduce_to_script(
    records: Iterable[ResultBase], folders: Mapping[str, Path]
) -> Optional[str]:
    """The command that adds all_reduce cells to a script's experiment (run with ``--script``,
    it has no config to add them to), or None when no experiment ran a script. Its script cells
    are kept (``--resume``); ``folders``: where each experiment's folder is."""
    scripts = [r for r in records_of(SCRIPT_KIND, records) if isinstance(r, TrainingResult)]
    if not scripts:
        return None
    first = scripts[0]
    counts = sorted({r.world_size for r in scripts if r.world_size > 1 and r.nnodes == 1}) or [2]
    folder = folders.get(first.experiment)
    words = ["torchscale", "benchmark", "--script", str(first.settings["script"])]
    words += [word for n in counts for word in ("--gpus", str(n))]
    words += ["--benchmark", "comm", "--resume", "-o", str(folder.parent) if folder else "DIR"]
    words += ["--set", f"experiment_name={first.experiment}"]
    words += ["--set", f"communication={SCRIPT_COMM_SECTION}"]
    where = "" if folder else " (DIR: the folder that holds the experiment's folder)"
    return (
        f"experiment {first.experiment!r} ran the script {first.model} without communication "
        f"cells; add them to it, its script cells kept: {shown_command(words)}{where}; next "
        "time, pass -c with a communication: section to benchmark --script (docs/own-job.md)"
    )


def fabric_from(
    records: Iterable[ResultBase],
    gpus_per_node: int,
    inter_node_gbps: Optional[float] = None,
    inter_node_latency_us: float = 10.0,
    folders: Optional[Mapping[str, Path]] = None,
) -> Fabric:
    """Fit the fabric; ``inter_node_gbps`` stands in for an unmeasured network (an assumption).
    ``folders`` (experiment -> its folder) makes a refusal's command exact."""
    records = list(records)
    points, timing = all_reduce_points(records, INTRA_NODE)
    intra = fit_all_reduce(points, INTRA_NODE, timing)
    if intra is None:
        fix = add_all_reduce_to_script(records, folders or {}) or ADD_ALL_REDUCE
        raise ProjectionError(f"no all_reduce measured inside a node at two sizes or more: {fix}")
    points, timing = all_reduce_points(records, INTER_NODE)
    inter = fit_all_reduce(points, INTER_NODE, timing)
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
    halves = {}
    for op in HALVES:
        points, timing = all_reduce_points(records, INTRA_NODE, op=op)
        fit = fit_all_reduce(points, INTRA_NODE, timing, op=op)
        if fit is not None:
            halves[op] = fit
    return Fabric(intra, inter, gpus_per_node, halves)
