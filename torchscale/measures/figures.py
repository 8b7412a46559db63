"""The figures torchscale reports: one name, one one-line definition and one owner each.

Every surface (the console, the HTML and PDF report, the JSON document, ``profile``) calls a
figure by its ``name`` here, and its CSV/JSON field is ``field``. ``docs/glossary.md`` is written
from this module (``python -m torchscale.measures.figures > docs/glossary.md``; a test keeps it
current) and the report's Glossary section shows the same lines. Two different quantities never
share a name: sync overhead (benchmark), sync stall time (profile) and exposed communication (DDP's
logging, or the trace) are three figures, and :data:`SYNC_RELATION` says how they relate.

Standard library only: the console imports it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

from torchscale.results.layout import FINDINGS_FILE, RESULTS

GLOSSARY_DOC = "docs/glossary.md"


@dataclass(frozen=True)
class Figure:
    key: str  # the glossary's anchor
    name: str  # what every surface calls it
    unit: str
    definition: str  # one line
    measured: str  # where the numbers come from
    owner: str  # the module that computes it
    column: str  # its column in summary.csv, the report's CSVs and the JSON document
    record: str  # where results.jsonl holds it
    gpu_only: bool = False  # NVML's: never measured on CPU processes (a CPU run's report omits it)

    @property
    def title(self) -> str:
        """The name at the start of a sentence or a header: ``Sync overhead``."""
        return self.name[:1].upper() + self.name[1:]

    def explained(self) -> str:
        """``Sync overhead: <definition>``: how a report section introduces it."""
        return f"{self.title}: {self.definition}"


THROUGHPUT = Figure(
    "throughput", "throughput", "images, sequences or tokens per second, all ranks",
    "world size x batch x grad accumulation x steps over the slowest rank's measured window, in "
    "the model's unit.",
    "benchmark: the measured window", "torchscale/worker/aggregate.py",
    "throughput", "throughput, samples_per_s",
)  # fmt: skip
STEP_TIME = Figure(
    "step-time", "step time", "ms (mean, p50, p95, p99)",
    "Time per optimizer step, each step counted at its slowest rank; p50, p95 and p99 are "
    "percentiles over the measured steps (the report pools repeats).",
    "benchmark: the measured window", "torchscale/measures/stats.py (time_stats)",
    "step_ms_p50", "step_time_ms.p50, .p95, .p99",
)  # fmt: skip
SCALING_EFFICIENCY = Figure(
    "scaling-efficiency", "scaling efficiency", "% of linear",
    "throughput_N / (N / B x throughput_B), B the smallest rank count measured for the same "
    "configuration; needs two rank counts of it, else none (–).",
    "benchmark: cells that differ only in rank count", "torchscale/analysis/training_tables.py",
    "scaling_efficiency", "(computed from throughput)",
)  # fmt: skip
SYNC_OVERHEAD = Figure(
    "sync-overhead", "sync overhead", "% of step",
    "What gradient synchronisation adds to a step: 1 - t(no_sync) / t(DDP), mean over ranks; "
    "none (–) on one rank, which has no gradient sync.",
    "benchmark: the no_sync probe after the measured window",
    "torchscale/worker/aggregate.py; read by torchscale/analysis/training_tables.py",
    "sync_overhead_pct", "sync.exposed_fraction",
)  # fmt: skip
SYNC_WAIT = Figure(
    "sync-wait", "sync wait", "ms per step, per rank",
    "A rank's step time minus its no_sync step time; the straggler is the rank that waits "
    "least (the others wait for it).",
    "benchmark: the no_sync probe",
    "torchscale/worker/aggregate.py, torchscale/measures/straggler.py",
    "sync_wait_ms", "per_rank[].sync_wait_ms",
)  # fmt: skip
SYNC_STALL = Figure(
    "sync-stall", "sync stall time", "% of step",
    "Profile only: the share of a rank's traced step time it waits inside collectives for the "
    "last rank to arrive (the headline is the mean over ranks).",
    "profile: the traces (torch.profiler or Nsight)",
    "torchscale/profiling/analyzers/trace_collectives.py", "sync_stall_pct",
    f"{FINDINGS_FILE}: sync_stall_pct",
)  # fmt: skip
EXPOSED_COMMUNICATION = Figure(
    "exposed-communication", "exposed communication", "ms per step, per rank",
    "Gradient communication per step that compute did not hide: communication - overlap.",
    "benchmark: DDP's logging probe; profile: the trace's kernels",
    "torchscale/analysis/iteration_breakdown.py, torchscale/profiling/analyzers/trace_breakdown.py",
    "exposed_comm_ms",
    "per_rank[].ddp_backward_comm_ms - ddp_backward_overlap_ms",
)  # fmt: skip
MFU = Figure(
    "mfu", "MFU", "% of peak",
    "Model FLOPs utilisation: the model's training FLOPs per second per rank over its device's "
    "dense peak for the precision used; none where the peak is unknown (CPU).",
    "benchmark: the measured window", "torchscale/hardware/peaks.py", "mfu", "mfu",
)  # fmt: skip
ALGBW = Figure(
    "algbw", "algbw", "GB/s",
    "Algorithm bandwidth of a collective: bytes / time (nccl-tests' definition).",
    "benchmark: communication cells; training cells: each collective of one step after the "
    "window, timed alone", "torchscale/measures/bus_bandwidth.py", "algbw_gbps",
    "algbw_gbps; collectives[].algbw_gbps",
)  # fmt: skip
BUSBW = Figure(
    "busbw", "busbw", "GB/s",
    "Bus bandwidth: algbw x the op's factor (2(n-1)/n for all-reduce, (n-1)/n for all-gather, "
    "reduce-scatter and all-to-all, 1 for broadcast and send/recv), comparable with the link's "
    "peak.",
    "benchmark: communication cells; training cells: each collective of one step after the "
    "window, timed alone", "torchscale/measures/bus_bandwidth.py", "busbw_gbps",
    "busbw_gbps; collectives[].busbw_gbps",
)  # fmt: skip

COMM_TIME = Figure(
    "communication-time", "communication time per step", "ms per step",
    "DDP's gradient communication per step (all-reduce time, hidden or not), mean over ranks; "
    "none (–) on one rank.",
    "benchmark: DDP's logging probe", "torchscale/analysis/iteration_breakdown.py",
    "comm_ms_per_step", "per_rank[].ddp_backward_comm_ms",
)  # fmt: skip
COMM_COMPUTE_RATIO = Figure(
    "comm-compute-ratio", "comm/compute ratio", "ratio",
    "Gradient communication over forward plus backward compute per step, all ranks summed; "
    "none (–) on one rank.",
    "benchmark: DDP's logging probe", "torchscale/analysis/iteration_breakdown.py",
    "comm_compute_ratio", "per_rank[].ddp_backward_comm_ms / ddp_*_compute_ms",
)  # fmt: skip
GPU_UTILISATION = Figure(
    "gpu-utilisation", "GPU utilisation", "% of time",
    "The share of time a kernel ran on the GPU (NVML utilization.gpu), mean over the measured "
    "window and the ranks; none (–) on CPU processes.",
    "benchmark: NVML sampled every 100 ms", "torchscale/analysis/device_utilisation.py",
    "gpu_util_pct", "per_rank[].gpu.util_pct_mean", gpu_only=True,
)  # fmt: skip
GPU_MEMORY_UTILISATION = Figure(
    "gpu-memory-utilisation", "GPU memory utilisation", "% of the GPU's memory",
    "The most memory in use on the GPU during the measured window (NVML, as nvidia-smi shows it) "
    "over its total memory, the highest rank; none (–) on CPU processes.",
    "benchmark: NVML sampled every 100 ms", "torchscale/analysis/device_utilisation.py",
    "gpu_memory_util_pct", "per_rank[].gpu.memory_used_bytes_max / memory_total_bytes",
    gpu_only=True,
)  # fmt: skip

MODEL_STATE = Figure(
    "model-state", "model state per rank", "bytes per rank",
    "Parameters, gradients and optimizer state one rank holds, from the tensors' sizes (under "
    "fsdp2 its shards: about 1/N of ddp's on N ranks); the rest of the peak is activations and "
    "workspace.",
    "benchmark: after the measured window", "torchscale/worker/measure.py (memory_stats)",
    "model_state_bytes", "memory.params_bytes + grads_bytes + optimizer_bytes",
)  # fmt: skip
GRADIENT_ERROR = Figure(
    "gradient-error", "gradient error", "relative",
    "|G - R| / |R|: the gradient the strategy gave a rank for the first measured batch (G) "
    "against an in-process reference on the whole global batch (R); above the precision's "
    "tolerance the cell is invalid (docs/strategies.md).",
    "benchmark: the gradient check after the measured window",
    "torchscale/worker/gradient_check.py", "gradient_error", "gradient_check.relative_error",
)  # fmt: skip
COLLECTIVE_BYTES = Figure(
    "collective-bytes", "collective bytes per step", "bytes per step, per rank",
    "What one training step's collectives move, each call's larger buffer (nccl-tests' size), "
    "all ops together; per op in the record.",
    "benchmark: one step after the measured window", "torchscale/worker/collective_count.py",
    "collective_bytes", "collectives[].bytes",
)  # fmt: skip

FIGURES: Dict[str, Figure] = {
    f.key: f
    for f in (
        THROUGHPUT, STEP_TIME, SCALING_EFFICIENCY, SYNC_OVERHEAD, SYNC_WAIT, SYNC_STALL,
        EXPOSED_COMMUNICATION, COMM_TIME, COMM_COMPUTE_RATIO, MFU, GPU_UTILISATION,
        GPU_MEMORY_UTILISATION, ALGBW, BUSBW, MODEL_STATE, GRADIENT_ERROR, COLLECTIVE_BYTES,
    )
}  # fmt: skip

SYNC_RELATION = (
    "Sync overhead counts everything gradient synchronisation adds to the step. The sync stall "
    "time is the part of it spent waiting for the last rank to arrive at a collective; the rest "
    "is the transfers themselves (their unhidden part is the exposed communication) and DDP's "
    "bucketing. So for one configuration the sync stall time is a fraction of the sync "
    "overhead; both are measured in their own windows, so they differ by a measurement's noise "
    "too."
)
"""How the three sync figures of one cell relate: the report and ``profile`` say it."""

NO_DEVICE_KERNELS = (
    "HTA computes them from a GPU's kernels, and traces of CPU processes (gloo) hold none"
)
"""Why a CPU trace has no idle, compute, overlap or exposed-communication figure."""

STALL_ABOVE_OVERHEAD_PTS = 0.5
"""A sync stall time above the sync overhead by more than this (percentage points) is no longer
"a part of it" within rounding: the two windows disagree, and ``sync_relation`` says so."""


def sync_relation(stall_pct: Optional[float], overhead_pct: float) -> str:
    """The sentence after a cell's sync overhead that places its trace's sync stall time: a part
    of it, or, when the stall is the larger, plainly why the two differ."""
    if stall_pct is None:
        return (
            f"The {SYNC_STALL.name}, from traces of 2 or more ranks, is the part of it spent "
            "waiting for the last rank; the rest is the transfers and DDP's bucketing"
        )
    if stall_pct <= overhead_pct + STALL_ABOVE_OVERHEAD_PTS:
        return (
            f"The {SYNC_STALL.name} ({stall_pct:.1f}%) is the part of it spent waiting for the "
            "last rank; the rest is the transfers and DDP's bucketing"
        )
    return (
        f"The {SYNC_STALL.name} ({stall_pct:.1f}%) is larger here, so it is not a part of "
        "this figure: the two were measured on different steps (the traced window against the "
        "measured window before it) and in different ways (each rank's wait inside the "
        "collectives against the step time beyond the no-sync probe's), and they disagree by "
        "as much as the steps varied between those windows (a busy host, a straggler that came "
        "and went); read each for its own window"
    )


BUSY_HOST = "busy host"
"""The mark of a figure measured while other processes held the cores."""
NOT_JUDGED = "not judged"
"""The verdict on such a figure (never "within noise"): no verdict rests on it."""
BUSY_HOST_RULE = (
    f"A figure is measured on a **{BUSY_HOST}** when a rank of its cell waited for a CPU at least "
    "15% of its window while other processes kept at least a quarter of a core of its host busy "
    "(schedstat's CPU wait per rank, and the host's busy time minus the job's own). Such a figure "
    "says as much about the other processes as about the job: `benchmark` marks it, `validate` "
    f"warns, and its verdict in `compare`, `report --baseline` and `tune` is **{NOT_JUDGED}** "
    '(never "within noise") unless the noise is stated with `--noise-floor`. A gate with cells '
    "it did not judge says how many it judged and exits 2 unless `--allow-unjudged` is given; "
    "`tune` gives no verdict and writes no best settings."
)
"""The busy-host rule in words (the rule itself: ``analysis/busy_host.py``)."""


def glossary_markdown() -> str:
    """docs/glossary.md."""
    lines: List[str] = [
        "# Glossary: the figures torchscale reports",
        "",
        "<!-- Generated from torchscale/measures/figures.py: "
        "python -m torchscale.measures.figures > docs/glossary.md -->",
        "",
        "Each figure has one name, used on the console, in the HTML and PDF report, in the JSON "
        "document and by `torchscale profile`, and one owner in the code. On a node without GPUs "
        'each "GPU" is a CPU process (gloo), and the figures are CPU figures; the report of such a '
        "run leaves out the figures NVML measures on GPUs only.",
        "",
        f"| figure | definition | unit | measured by | column | in {RESULTS} | owner |",
        "|---|---|---|---|---|---|---|",
    ]
    for figure in FIGURES.values():
        lines.append(
            f'| <a id="{figure.key}"></a>**{figure.name}** | {figure.definition} | {figure.unit} '
            f"| {figure.measured} | `{figure.column}` | `{figure.record}` | {figure.owner} |"
        )
    lines += [
        "",
        "## Sync overhead, sync stall time and exposed communication",
        "",
        SYNC_RELATION,
        "",
        '## Busy host and "not judged"',
        "",
        BUSY_HOST_RULE,
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(glossary_markdown(), end="")
