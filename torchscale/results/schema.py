"""The result schema: one JSON object per line of ``results.jsonl``, the source of truth.

Every record carries ``schema_version`` and ``kind``. Readers ignore fields they do not know, so a
newer torchscale can add fields without breaking an older report; removing or changing the meaning
of a field bumps ``SCHEMA_VERSION``. ``torchscale benchmark --schema`` prints the JSON Schema.

All times are in milliseconds unless the field name says otherwise (``_us``, ``_s``); memory is in
bytes; throughput is per second for the whole job (all ranks), not per GPU.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Literal, Optional, Tuple, Type

from pydantic import BaseModel, ConfigDict, Field

from torchscale.kinds.kind_registry import kind_modules, load_kinds
from torchscale.results.layout import FINDINGS_FILE, METRICS_EPOCH

SCHEMA_VERSION = 1

CellStatus = Literal["ok", "oom", "timeout", "failed", "skipped", "invalid"]
"""``ok`` measured; ``oom`` out of memory on some rank; ``timeout`` killed after the cell timeout;
``failed`` a rank crashed or the launch failed; ``skipped`` not run (e.g. more GPUs than the node
has), with the reason in ``error``; ``invalid`` a figure that cannot be true (NaN, infinite, zero
or negative throughput or step time) or a loss that diverged (NaN or infinite), found when the
record was read or made (``torchscale.results.validity``), never compared."""


class _Record(BaseModel):
    # Ignore unknown fields so results written by a newer torchscale still load.
    model_config = ConfigDict(extra="ignore")


class TimeStats(_Record):
    """Distribution of a per-step time in milliseconds."""

    mean: float
    p50: float
    p95: float
    p99: float
    min: float
    max: float
    std: float
    cv: float = Field(description="Coefficient of variation, std / mean.")


class MemoryStats(_Record):
    """Memory of one rank. On GPU ``peak_bytes`` is CUDA's peak allocated; on CPU the peak RSS."""

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_peak_bytes: Optional[int] = Field(
        None, description="Peak minus params, grads and optimizer state (GPU only)."
    )
    peak_bytes: int
    peak_kind: Literal["cuda_allocated", "rss"]


class GradientCheck(_Record):
    """The gradient check run after the measured window (docs/strategies.md): parameters agree
    across ranks, and the first measured batch's gradients equal a reference computed in the same
    process on the whole global batch."""

    passed: bool
    cause: Optional[str] = Field(
        None, description="Why it failed, in one line naming the rank and the factor."
    )
    skipped: Optional[str] = Field(None, description="Why nothing was checked (passed then).")
    relative_error: Optional[float] = Field(
        None, description="|G - R| / |R|: the strategy's gradient against the reference."
    )
    tolerance: Optional[float] = Field(None, description="The precision's allowed error.")
    shares: Optional[List[float]] = Field(
        None, description="Each rank's fitted share of the gradient (1 each when healthy)."
    )
    check_s: Optional[float] = Field(
        None, description="Seconds the check took (slowest rank), outside the measured window."
    )


class IssuedCollective(_Record):
    """One kind of collective a rank's training step issued (one step after the window)."""

    op: str = Field(description="all_reduce, all_gather, reduce_scatter, broadcast, all_to_all.")
    calls: int = Field(description="How many the step issued.")
    bytes: int = Field(
        description="Their bytes in the step: each call's larger buffer (nccl-tests' size)."
    )
    time_s: Optional[float] = Field(
        None, description="Their seconds, each call timed alone from issue to completion."
    )
    algbw_gbps: Optional[float] = Field(None, description="bytes / time_s, GB/s.")
    busbw_gbps: Optional[float] = Field(
        None, description="algbw x the op's bus factor (its process group's size), GB/s."
    )


class GpuTelemetry(_Record):
    """NVML samples taken on this rank's GPU during the measured window."""

    samples: int
    util_pct_mean: Optional[float] = None
    util_pct_max: Optional[float] = None
    power_w_mean: Optional[float] = None
    power_w_max: Optional[float] = None
    memory_used_bytes_max: Optional[int] = None
    memory_total_bytes: Optional[int] = Field(None, description="The GPU's total memory (NVML).")
    sm_clock_mhz_mean: Optional[float] = None
    temperature_c_max: Optional[float] = None
    throttle_reasons: List[str] = Field(
        default_factory=list, description="NVML clocks-event reasons seen (idle excluded)."
    )
    nvml_index: Optional[int] = Field(None, description="The GPU's NVML index (nvidia-smi's).")
    sm_clock_mhz_min: Optional[float] = None
    sm_clock_mhz_limit: Optional[float] = Field(None, description="The GPU's maximum SM clock.")
    mem_clock_mhz_mean: Optional[float] = None
    power_limit_w: Optional[float] = Field(None, description="Enforced power limit.")
    temperature_c_mean: Optional[float] = None
    throttle_share: Dict[str, float] = Field(
        default_factory=dict, description="Per reason: the share of samples that reported it."
    )
    pcie_gen: Optional[int] = None
    pcie_gen_max: Optional[int] = None
    pcie_width: Optional[int] = None
    pcie_width_max: Optional[int] = None
    timeline: List[List[Optional[float]]] = Field(
        default_factory=list,
        description="Samples, at most 120: [seconds into the window, util %, SM MHz, power W, "
        "temperature C, clocks-event reason bits].",
    )


class RankEpoch(_Record):
    """One measured epoch (a whole pass over the data) on one rank."""

    epoch: int
    steps: int
    window_s: float = Field(description="Wall time of the pass on this rank.")


class EpochStats(_Record):
    """One measured epoch of the job (``epochs``): the line of ``metrics_epoch.jsonl``."""

    epoch: int = Field(description="1 for the first measured pass (after the warm-up).")
    steps: int
    samples: int = Field(description="All ranks together: world_size x batch x accum x steps.")
    window_s: float = Field(description="The slowest rank's wall time of the pass.")
    samples_per_s: Optional[float] = None
    throughput: Optional[float] = Field(None, description="In the record's unit per second.")
    step_time_ms: Optional[TimeStats] = Field(
        None, description="The pass's steps, each the slowest rank's time."
    )


class RankResult(_Record):
    """What one rank measured."""

    rank: int
    local_rank: int
    host: str
    device: str
    step_time_ms: TimeStats
    step_times_ms: List[float] = Field(description="Every measured step, in order.")
    measure_steps: int
    window_s: float = Field(description="Wall time of the measured window on this rank.")
    epochs: List[RankEpoch] = Field(
        default_factory=list, description="With epochs: each pass's steps and wall time."
    )
    data_ms: Optional[float] = Field(None, description="Mean wait for input batches per step.")
    forward_ms: float = Field(description="Mean forward time per step (all micro-batches).")
    backward_ms: float = Field(description="Mean backward time per step, sync included.")
    optimizer_ms: float = Field(description="Mean optimizer step time.")
    nosync_step_ms: Optional[float] = Field(
        None, description="Mean step time of the same steps under DDP no_sync(): compute only."
    )
    sync_wait_ms: Optional[float] = Field(
        None, description="Mean exposed gradient-sync time per step: step time minus no_sync time."
    )
    sync_wait_samples_ms: List[float] = Field(
        default_factory=list, description="Exposed sync per measured step (backward minus no_sync)."
    )
    ddp_forward_compute_ms: Optional[float] = Field(None, description="From DDP's logging data.")
    ddp_backward_compute_ms: Optional[float] = Field(None, description="From DDP's logging data.")
    ddp_backward_comm_ms: Optional[float] = Field(None, description="From DDP's logging data.")
    ddp_backward_overlap_ms: Optional[float] = Field(
        None, description="Compute/communication overlap in backward, from DDP's logging data."
    )
    memory: Optional[MemoryStats] = None
    gradient_check: Optional[GradientCheck] = None
    collectives: List[IssuedCollective] = Field(
        default_factory=list, description="The collectives one training step issued."
    )
    last_loss: Optional[float] = Field(
        None,
        description="The loss of this rank's last measured step (its last micro-batch), read "
        "after the timed window. NaN or infinite: the model diverged, and the record is "
        "invalid.",
    )
    gpu: Optional[GpuTelemetry] = None
    timeline_s: Dict[str, float] = Field(
        default_factory=dict, description="Seconds from process start to each worker phase."
    )
    process_started_at: Optional[float] = Field(
        None, description="The worker process's start (Unix time): launch overhead analysis."
    )
    cpu_time_s: Optional[float] = Field(
        None, description="CPU time of the training thread during the measured window."
    )
    cpu_wait_s: Optional[float] = Field(
        None,
        description="Time the training thread was runnable but waiting for a CPU during the "
        "measured window (Linux schedstat): preemption or an oversubscribed host.",
    )
    process_cpu_s: Optional[float] = Field(
        None,
        description="CPU time of the rank's whole process (every thread: training, gloo, DDP) "
        "during the measured window.",
    )
    host_busy_cpu_s: Optional[float] = Field(
        None,
        description="CPU-seconds all of the host's CPUs were busy during the measured window "
        "(Linux /proc/stat): minus the job's processes, what other processes used.",
    )
    host_cpus: Optional[float] = Field(None, description="CPUs the host has (os.cpu_count()).")


class SyncStats(_Record):
    """Gradient synchronisation across the job."""

    exposed_fraction: Optional[float] = Field(
        None, description="1 - t_nosync / t_ddp: share of the step spent waiting on gradient sync."
    )
    per_rank_wait_ms: List[Optional[float]] = Field(default_factory=list)
    wait_cv_across_steps: Optional[float] = None
    wait_spread_ms: Optional[float] = Field(
        None, description="Largest minus smallest per-rank mean wait."
    )
    slowest_rank: Optional[int] = Field(
        None, description="The rank the others wait for (it waits least), when the spread is large."
    )
    high_variance: bool = False
    warning: Optional[str] = None


class ProfileInfo(_Record):
    """Whether this cell was traced after its measured window, and where the traces are."""

    tool: str = Field(description="torch (torch.profiler) or nsys.")
    profiled: bool
    reason: str = Field(description="Why it was (or was not) profiled: the trigger's verdict.")
    steps: Optional[int] = None
    dir: Optional[str] = Field(None, description="Trace folder, relative to the cell folder.")
    trace: Optional[str] = Field(None, description="This rank-0 trace file name.")
    findings: Optional[int] = Field(None, description="How many findings the analysis made.")
    findings_file: Optional[str] = Field(None, description=f"{FINDINGS_FILE}, in ``dir``.")
    note: Optional[str] = Field(
        None,
        description="Said beside the analysis: the script ended inside its traced window, and "
        "the analysis is of the steps captured (``steps``).",
    )


class ResultBase(_Record):
    """Fields every record has, whatever its kind."""

    schema_version: int = SCHEMA_VERSION
    kind: str
    cell_id: str
    experiment: str
    status: CellStatus
    error: Optional[str] = Field(None, description="Human-readable, names the failing rank.")
    world_size: int
    nnodes: int = 1
    nproc_per_node: int
    hosts: List[str] = Field(default_factory=list)
    repeat: int = 0
    settings: Dict[str, Any] = Field(default_factory=dict, description="Resolved cell settings.")
    started_at: Optional[str] = None
    finished_at: Optional[str] = None
    wall_s: Optional[float] = Field(
        None,
        description="Launch to exit, start-up included; in a warm group, from the end of the "
        "cell before it (the first cell: from the launch) to the cell's end.",
    )
    launch: Optional[Dict[str, Any]] = Field(
        None,
        description="How the cell ran: mode per_cell (a launch of its own) or per_group (a warm "
        "group: the group's first cell id and this cell's position in it).",
    )


class TrainingResult(ResultBase):
    """One cell of the training matrix: model x batch size x GPU count x knobs."""

    kind: Literal["training"] = "training"
    model: str
    batch_size: int = Field(description="Per-GPU micro-batch size.")
    grad_accum_steps: int = 1
    global_batch_size: int
    precision: str
    backend: Optional[str] = None
    device_name: Optional[str] = None
    unit: Optional[str] = Field(None, description="What throughput counts: images, tokens, ...")
    units_per_sample: float = 1.0
    samples_per_s: Optional[float] = None
    throughput: Optional[float] = Field(None, description="In `unit` per second, all ranks.")
    step_time_ms: Optional[TimeStats] = None
    step_times_ms: List[float] = Field(
        default_factory=list, description="Per step, the slowest rank's time."
    )
    measure_steps: Optional[int] = None
    warmup_steps: Optional[int] = None
    measured_s: Optional[float] = Field(None, description="Length of the timed window.")
    epochs: List[EpochStats] = Field(
        default_factory=list,
        description=f"With epochs: per pass over the data, its throughput ({METRICS_EPOCH}).",
    )
    per_rank: List[RankResult] = Field(default_factory=list)
    sync: Optional[SyncStats] = None
    memory: Optional[MemoryStats] = Field(None, description="The rank with the highest peak.")
    last_loss: Optional[float] = Field(
        None,
        description="The mean over ranks of each rank's last measured loss (``per_rank``); "
        "null in records made before torchscale measured it. A diverged (NaN or infinite) loss "
        "on any rank makes the record invalid.",
    )
    collectives: List[IssuedCollective] = Field(
        default_factory=list,
        description="The collectives one training step issued (rank 0's), counted after the "
        "window: what the strategy communicates.",
    )
    gradient_check: Optional[GradientCheck] = Field(
        None,
        description="Whether the cell's gradients were right (failed: the record is invalid); "
        "null in records made before torchscale checked them.",
    )
    flops_per_sample: Optional[float] = None
    tflops_per_gpu: Optional[float] = None
    peak_tflops: Optional[float] = Field(None, description="Device peak for this precision.")
    mfu: Optional[float] = Field(None, description="Model FLOPs utilisation, null if peak unknown.")
    profile: Optional[ProfileInfo] = None
    runtime: Dict[str, Any] = Field(
        default_factory=dict,
        description="What actually ran: optimizer, autocast dtype, GradScaler, channels_last (and "
        "whether the model takes it: channels_last_applies), "
        "compile, threads, data pipeline, sync_cuda (true: the device was synchronised after "
        "every measured step, strict timing), cudnn_benchmark, allow_tf32 (matmul, cudnn), the "
        "peak_precision MFU is scored against, and DDP's own report of its configuration (ddp).",
    )


class CommResultBase(ResultBase):
    """What every communication record says about where it ran."""

    dtype: str
    backend: Optional[str] = None
    device_name: Optional[str] = None
    warmup: Optional[int] = None
    iterations: Optional[int] = Field(None, description="Timed ops per figure, averaged.")
    time_us: Optional[float] = Field(None, description="Time per op, average across ranks.")
    time_us_min: Optional[float] = Field(None, description="Fastest rank's time per op.")
    time_us_max: Optional[float] = Field(None, description="Slowest rank's time per op.")
    per_rank_time_us: List[Optional[float]] = Field(
        default_factory=list, description="By rank; null for a rank that sat the scope out."
    )


class CollectiveResult(CommResultBase):
    """One collective (or send/recv) at one message size on one world size, as nccl-tests reports
    it; bandwidth definitions in ``torchscale.comm.busbw``."""

    kind: Literal["collective"] = "collective"
    op: str = Field(
        description="all_reduce, all_gather, reduce_scatter, broadcast, all_to_all or send_recv."
    )
    scope: str = Field(
        "world",
        description="The ranks it ran over: world, intra_node (each node's ranks, all nodes at "
        "once) or inter_node (one rank per node).",
    )
    group_size: Optional[int] = Field(
        None, description="Ranks per group: the n of the busbw factor (world_size for world)."
    )
    size_bytes: Optional[int] = Field(None, description="nccl-tests' size: max(send, recv) bytes.")
    count: Optional[int] = Field(None, description="Elements per rank, as nccl-tests counts them.")
    requested_bytes: Optional[int] = Field(None, description="The size asked for in the sweep.")
    algbw_gbps: Optional[float] = Field(None, description="size / time, GB/s (1e9 bytes).")
    busbw_gbps: Optional[float] = Field(None, description="algbw x the op's bus factor.")
    busbw_factor: Optional[float] = None
    wrong: Optional[int] = Field(
        None, description="Wrong elements over all ranks; null when checking was off."
    )
    wrong_per_rank: List[int] = Field(default_factory=list)
    link: Optional[str] = Field(None, description="The link busbw is compared with (nvlink4x18).")
    link_peak_gbps: Optional[float] = None
    busbw_peak_fraction: Optional[float] = Field(None, description="busbw / link peak.")
    pair_time_us: Optional[List[List[Optional[float]]]] = Field(
        None,
        description="send_recv only: [src][dst] time per message, diagonal null; time_us and its "
        "min/max are over the pairs.",
    )
    pair_busbw_gbps: Optional[List[List[Optional[float]]]] = Field(
        None, description="send_recv only: [src][dst] bandwidth."
    )
    slowest_pair: Optional[List[int]] = Field(None, description="send_recv only: [src, dst].")
    after_compute_time_us: Optional[float] = Field(
        None,
        description="communication.after_compute: time per op issued right after 10 ms of "
        "compute (as DDP issues a bucket): each rank's median, averaged across ranks.",
    )
    ddp_time_us: Optional[float] = Field(
        None,
        description="communication.through_ddp, all_reduce only: DDP's own backward_comm_time "
        "for one bucket of this size at the end of a backward pass: each rank's median, "
        "averaged across ranks.",
    )


class TpGemmResult(CommResultBase):
    """DDLB's tensor-parallel column-wise GEMM C = A @ B with A sharded by rows, one order."""

    kind: Literal["tp_gemm"] = "tp_gemm"
    m: int
    n: int
    k: int
    order: str = Field(description="AG_before (gather A, full GEMM) or AG_after (GEMM, gather C).")
    tflops: Optional[float] = Field(None, description="2mnk / time_us, as DDLB reports it.")
    comm_time_us: Optional[float] = Field(None, description="All-gather part, average of ranks.")
    gemm_time_us: Optional[float] = Field(None, description="GEMM part, average of ranks.")
    comm_share: Optional[float] = Field(None, description="comm_time_us / time_us.")
    comm_bytes: Optional[int] = Field(None, description="Bytes the all-gather produces per rank.")
    comm_busbw_gbps: Optional[float] = None
    reference_time_us: Optional[float] = Field(
        None, description="Compute-only reference: the unsharded GEMM on one device."
    )
    reference_tflops: Optional[float] = None
    sharded_time_us: Optional[float] = Field(
        None,
        description="Compute-only sharded (tp_gemm.compute_only: sharded): the GEMM each rank "
        "does alone on its m / world_size rows, every rank at once, average of ranks.",
    )
    sharded_tflops: Optional[float] = Field(
        None, description="2 (m / world_size) n k / sharded_time_us: one rank's GEMM rate."
    )
    valid: Optional[bool] = Field(None, description="Matches the reference on every rank.")
    wrong: Optional[int] = Field(None, description="Elements outside tolerance, all ranks.")
    max_abs_error: Optional[float] = None
    atol: Optional[float] = None
    rtol: Optional[float] = None


def parse_record(data: Dict[str, Any]) -> ResultBase:
    """Validate one ``results.jsonl`` object into the model for its ``kind``: the built-in ones,
    then those of the registered cell kinds (``CellKind.record_models``), else ``ResultBase``."""
    kind = data.get("kind", "training")
    if not isinstance(kind, str):
        return ResultBase.model_validate(data)
    model = RECORD_KINDS.get(kind) or _registered_models(kind_modules()).get(kind, ResultBase)
    record: ResultBase = model.model_validate(data)
    return record


RECORD_KINDS: Dict[str, Type[ResultBase]] = {
    "training": TrainingResult,
    "collective": CollectiveResult,
    "tp_gemm": TpGemmResult,
}
"""The built-in record models by ``kind`` (what analysis and the report read); a kind's own
record models are found through the registry (``torchscale.kinds.kind_registry``)."""


@functools.cache
def _registered_models(modules: Tuple[str, ...]) -> Dict[str, Type[ResultBase]]:
    found: Dict[str, Type[ResultBase]] = {}
    for kind in load_kinds(modules):
        for model in getattr(kind, "record_models", ()):
            if isinstance(model, type) and issubclass(model, ResultBase):
                found[model.model_fields["kind"].default] = model
    return found
