"""Telemetry joined with timing: why a rank was slow, not only which one.

From the per-rank NVML summaries (``RankResult.gpu``) and, on CPU, the training thread's CPU time
and run-queue wait (``cpu_time_s``, ``cpu_wait_s``), with each rank's step, compute-only and sync
times. Functions from records to DataFrames and finding dicts; drawing lives in the report.
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, Iterable, List, Optional, Tuple

import pandas as pd

from torchscale.analysis.cpu_load import (
    CPU_WAIT_SHARE,
    other_processes_cores,
    oversubscribed,
    rank_cpu_wait_share,
)
from torchscale.analysis.device_utilisation import gpu_memory_util_pct
from torchscale.analysis.finding import Finding, Severity
from torchscale.analysis.findings import on_cpu
from torchscale.analysis.training_tables import sync_overhead_pct
from torchscale.hardware.device_noun import device_noun
from torchscale.hardware.nvml import reason_label
from torchscale.measures.straggler import record_straggler
from torchscale.results.schema import GpuTelemetry, RankResult, ResultBase, TrainingResult

CLOCK_DEFICIT = 0.10
"""A GPU whose mean SM clock is this much below its peers' median ran slower."""
LOW_UTILISATION = 70.0
"""Mean GPU utilisation (%) below which the GPU sat idle for a real share of the window ..."""
SYNC_BOUND = 0.20
"""... and the cell is communication-bound when exposed sync is at least this share of the step."""
SLOW_REASONS = ("hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown",
                "sw_power_cap", "hw_slowdown")  # fmt: skip
"""Clocks-event reasons that slow a GPU, most specific first (ties name the first)."""

GPU_COLUMNS = [
    "cell_id", "experiment", "model", "batch_size", "world_size", "rank", "host", "gpu",
    "util_pct_mean", "memory_util_pct", "sm_clock_mhz_mean", "sm_clock_mhz_min",
    "sm_clock_mhz_limit",
    "mem_clock_mhz_mean", "power_w_mean", "power_limit_w", "temperature_c_max",
    "throttle", "pcie", "pcie_degraded", "samples",
]  # fmt: skip
CPU_COLUMNS = [
    "cell_id", "experiment", "model", "batch_size", "world_size", "rank", "host",
    "window_s", "cpu_time_s", "cpu_wait_s", "cpu_share", "cpu_wait_share",
    "other_processes_cores",
    "nosync_step_ms", "sync_wait_ms",
]  # fmt: skip


def _gpu_label(rank: RankResult) -> str:
    gpu = rank.gpu
    if gpu is not None and gpu.nvml_index is not None:
        return f"GPU {gpu.nvml_index}"
    index = rank.device.split(":")[-1] if ":" in rank.device else str(rank.local_rank)
    return f"GPU {index}"


def _throttle(shares: Dict[str, float]) -> str:
    return ", ".join(f"{reason_label(k)} {v:.0%}" for k, v in sorted(shares.items()))


def _pcie(gpu: GpuTelemetry) -> Tuple[Optional[str], bool]:
    if gpu.pcie_gen is None or gpu.pcie_width is None:
        return None, False
    text = f"Gen{gpu.pcie_gen} x{gpu.pcie_width}"
    degraded = (gpu.pcie_gen_max is not None and gpu.pcie_gen < gpu.pcie_gen_max) or (
        gpu.pcie_width_max is not None and gpu.pcie_width < gpu.pcie_width_max
    )
    if degraded:
        text += f" (max Gen{gpu.pcie_gen_max} x{gpu.pcie_width_max})"
    return text, degraded


def _trained(records: Iterable[ResultBase]) -> List[TrainingResult]:
    return [r for r in records if isinstance(r, TrainingResult) and r.status == "ok"]


def gpu_table(records: Iterable[ResultBase]) -> pd.DataFrame:
    """One row per rank with NVML telemetry."""
    rows = []
    for record in _trained(records):
        for rank in record.per_rank:
            gpu = rank.gpu
            if gpu is None or not gpu.samples:
                continue
            pcie, degraded = _pcie(gpu)
            rows.append(
                {
                    "cell_id": record.cell_id, "experiment": record.experiment,
                    "model": record.model, "batch_size": record.batch_size,
                    "world_size": record.world_size, "rank": rank.rank, "host": rank.host,
                    "gpu": _gpu_label(rank), "util_pct_mean": gpu.util_pct_mean,
                    "memory_util_pct": gpu_memory_util_pct(gpu),
                    "sm_clock_mhz_mean": gpu.sm_clock_mhz_mean,
                    "sm_clock_mhz_min": gpu.sm_clock_mhz_min,
                    "sm_clock_mhz_limit": gpu.sm_clock_mhz_limit,
                    "mem_clock_mhz_mean": gpu.mem_clock_mhz_mean,
                    "power_w_mean": gpu.power_w_mean, "power_limit_w": gpu.power_limit_w,
                    "temperature_c_max": gpu.temperature_c_max,
                    "throttle": _throttle(gpu.throttle_share) or "none",
                    "pcie": pcie, "pcie_degraded": degraded, "samples": gpu.samples,
                }
            )  # fmt: skip
    return pd.DataFrame(rows, columns=GPU_COLUMNS)


def gpu_timeline(records: Iterable[ResultBase]) -> pd.DataFrame:
    """Long format: every kept NVML sample (``cell_id``, ``gpu``, ``t_s``, SM clock...)."""
    rows = []
    for record in _trained(records):
        for rank in record.per_rank:
            if rank.gpu is None:
                continue
            for t, util, clock, power, temperature, reasons in rank.gpu.timeline:
                rows.append(
                    {"cell_id": record.cell_id, "experiment": record.experiment,
                     "model": record.model,
                     "world_size": record.world_size, "gpu": _gpu_label(rank), "t_s": t,
                     "util_pct": util, "sm_clock_mhz": clock, "power_w": power,
                     "temperature_c": temperature, "reasons": reasons}
                )  # fmt: skip
    return pd.DataFrame(
        rows,
        columns=["cell_id", "experiment", "model", "world_size", "gpu", "t_s", "util_pct",
                 "sm_clock_mhz", "power_w", "temperature_c", "reasons"],
    )  # fmt: skip


def cpu_table(records: Iterable[ResultBase]) -> pd.DataFrame:
    """One row per CPU rank with its training thread's CPU time and run-queue wait."""
    rows = []
    for record in _trained(records):
        others = other_processes_cores(record)
        for rank in record.per_rank:
            if rank.gpu is not None or rank.cpu_time_s is None or rank.window_s <= 0:
                continue
            rows.append(
                {
                    "cell_id": record.cell_id, "experiment": record.experiment,
                    "model": record.model, "batch_size": record.batch_size,
                    "world_size": record.world_size, "rank": rank.rank, "host": rank.host,
                    "window_s": rank.window_s, "cpu_time_s": rank.cpu_time_s,
                    "cpu_wait_s": rank.cpu_wait_s,
                    "cpu_share": rank.cpu_time_s / rank.window_s,
                    "cpu_wait_share": rank_cpu_wait_share(rank),
                    "other_processes_cores": others.get(rank.host),
                    "nosync_step_ms": rank.nosync_step_ms, "sync_wait_ms": rank.sync_wait_ms,
                }
            )  # fmt: skip
    return pd.DataFrame(rows, columns=CPU_COLUMNS)


def _where(record: TrainingResult) -> str:
    return f"{record.model} batch {record.batch_size} on {_ranks(record)}"


def _ranks(record: TrainingResult) -> str:
    """``2 GPUs``, or ``2 CPU processes`` for a gloo run on CPU."""
    return device_noun(on_cpu(record), record.world_size)


def _straggler(record: TrainingResult, rank: int) -> bool:
    """The rank the others wait for, as the worker's sync stats named it (by the one rule)."""
    return record_straggler(record) == rank


def _clock_findings(record: TrainingResult) -> List[Finding]:
    ranks = [r for r in record.per_rank if r.gpu and r.gpu.sm_clock_mhz_mean]
    found = []
    for rank in ranks:
        gpu = rank.gpu
        assert gpu is not None and gpu.sm_clock_mhz_mean is not None
        peers = [
            r.gpu.sm_clock_mhz_mean
            for r in ranks
            if r is not rank and r.gpu and r.gpu.sm_clock_mhz_mean  # all: filtered above
        ]
        slow = {k: v for k, v in gpu.throttle_share.items() if k in SLOW_REASONS}
        reference = statistics.median(peers) if peers else gpu.sm_clock_mhz_limit
        deficit = 1 - gpu.sm_clock_mhz_mean / reference if reference else 0.0
        if not slow or (deficit < CLOCK_DEFICIT and peers):
            continue
        reason = max(slow, key=lambda k: (slow[k], -SLOW_REASONS.index(k)))
        share = slow[reason]
        also = [reason_label(k) for k in SLOW_REASONS if k in slow and k != reason]
        straggler = len(record.per_rank) > 1 and _straggler(record, rank.rank)
        label = _gpu_label(rank)
        evidence = (
            f"{label} (rank {rank.rank}, {rank.host}) ran at {gpu.sm_clock_mhz_mean:,.0f} MHz "
            f"against {reference:,.0f} MHz on {'its peers' if peers else 'its limit'} "
            f"({deficit:.0%} lower): {reason_label(reason)} for {share:.0%} of the measured "
            f"window{' (also ' + ', '.join(also) + ')' if also else ''}, "
            f"{gpu.temperature_c_max:.0f} °C max, "
            f"{gpu.power_w_mean or 0:.0f} W of {gpu.power_limit_w or 0:.0f} W"
        )
        title = f"{label} throttled ({reason_label(reason)})"
        if straggler:
            title = f"{label} is the straggler: {reason_label(reason)}"
            evidence += "; the other ranks wait for it at every gradient sync"
        found.append(
            _finding(
                record, Severity.HIGH if straggler else Severity.MEDIUM,
                f"{title}: {record.model}", f"In {_where(record)}: {evidence}.", f"{evidence}.",
                [rank.rank],
                "Check that GPU's cooling and airflow (thermal), its power cap "
                "(nvidia-smi -q -d POWER) or the board (HW slowdown); drain the node if it "
                "persists.",
            )
        )  # fmt: skip
    return found


def _utilisation_finding(record: TrainingResult) -> Optional[Finding]:
    utils = [r.gpu.util_pct_mean for r in record.per_rank if r.gpu and r.gpu.util_pct_mean]
    if not utils or statistics.mean(utils) >= LOW_UTILISATION:
        return None
    util = statistics.mean(utils)
    overhead = sync_overhead_pct(record)
    sync = overhead / 100 if overhead is not None else None
    data = [r.data_ms for r in record.per_rank if r.data_ms is not None]
    step = record.step_time_ms.mean if record.step_time_ms else None
    data_share = statistics.mean(data) / step if data and step else 0.0
    if sync is not None and sync >= SYNC_BOUND:
        title, detail, advice = (
            "communication-bound",
            f"gradient sync is {sync:.0%} of the step",
            (
                "Overlap or shrink the gradient sync: ddp.bucket_cap_mb, ddp.comm_hook, a larger "
                "per-GPU batch; check the interconnect with the communication cells."
            ),
        )
    else:
        cause = "input-bound" if data_share >= 0.1 else "launch-bound"
        title, detail = (
            cause,
            (
                f"gradient sync is only {(sync or 0):.0%} of the step and waiting for input "
                f"{data_share:.0%}"
            ),
        )
        advice = (
            "Feed the GPU faster: data.num_workers, pinned memory, prefetching."
            if cause == "input-bound"
            else "The GPU waits for the host to launch work: a larger batch, CUDA graphs or "
            "torch.compile, fewer small kernels."
        )
    return _finding(
        record, Severity.MEDIUM, f"GPUs {util:.0f}% utilised, {title}: {record.model}",
        f"In {_where(record)}: mean GPU utilisation {util:.0f}% and {detail}.",
        f"Mean GPU utilisation {util:.0f}% and {detail}.", [], advice,
    )  # fmt: skip


def _pcie_findings(record: TrainingResult) -> List[Finding]:
    found = []
    for rank in record.per_rank:
        if rank.gpu is None:
            continue
        text, degraded = _pcie(rank.gpu)
        if not degraded:
            continue
        found.append(
            _finding(
                record, Severity.MEDIUM,
                f"{_gpu_label(rank)} PCIe link below its maximum: {record.model}",
                f"In {_where(record)}: {_gpu_label(rank)} (rank {rank.rank}, "
                f"{rank.host}) trained its link at {text} under load.",
                f"{_gpu_label(rank)} (rank {rank.rank}, {rank.host}) runs its PCIe link at {text}.",
                [rank.rank],
                "Reseat the card or riser, check the slot's BIOS settings "
                "(link speed) and the PCIe AER errors in the kernel log.",
            )
        )  # fmt: skip
    return found


def _cpu_findings(record: TrainingResult) -> List[Finding]:
    found = []
    others = other_processes_cores(record)
    for rank in record.per_rank:
        share = rank_cpu_wait_share(rank)
        if rank.gpu is not None or share is None or share < CPU_WAIT_SHARE:
            continue
        cpu = (rank.cpu_time_s or 0.0) / rank.window_s
        peers = [r.nosync_step_ms for r in record.per_rank if r is not rank and r.nosync_step_ms]
        slower = ""
        if peers and rank.nosync_step_ms:
            ratio = rank.nosync_step_ms / statistics.median(peers) - 1
            slower = f"; its compute-only step is {ratio:+.0%} against the other ranks"
        load = others.get(rank.host)
        meanwhile = (
            ""
            if load is None
            else (
                f" Other processes kept {load:.2f} of the host's "
                f"{rank.host_cpus or 0:.0f} CPUs busy meanwhile."
            )
        )
        straggler = len(record.per_rank) > 1 and _straggler(record, rank.rank)
        evidence = (
            f"Rank {rank.rank}'s training thread on {rank.host} waited for a CPU for {share:.0%} "
            f"of the measured window and ran {cpu:.0%} of it{slower}.{meanwhile}"
        )
        if oversubscribed(share, load):
            title = f"Rank {rank.rank} was preempted (host oversubscribed)"
            advice = (
                "Other processes share this rank's cores: give each rank its own cores "
                "(TORCHSCALE_CPU_SLOTS, taskset/numactl, the scheduler's CPU binding) and keep "
                "other jobs off the node."
            )
        else:
            title = f"Rank {rank.rank} waited for a CPU behind its own threads"
            advice = (
                "Nothing else ran: the rank's compute and its own gloo and DDP threads (the "
                "all-reduce runs on CPU cores too) took turns on its cores. Give each rank more "
                "than one core (fewer ranks per host, or TORCHSCALE_CPU_SLOTS below the core "
                "count), or larger gradient buckets (fewer all-reduces)."
            )
        found.append(
            _finding(
                record, Severity.HIGH if straggler else Severity.MEDIUM,
                title + (", the straggler" if straggler else "")
                + f": {record.model} on {_ranks(record)}",
                f"In {_where(record)}: {evidence}", evidence, [rank.rank], advice,
            )
        )  # fmt: skip
    return found


def _finding(
    record: TrainingResult,
    severity: Severity,
    title: str,
    message: str,
    evidence: str,
    ranks: List[int],
    recommendation: str,
) -> Finding:
    return Finding(
        severity=severity, category="telemetry", title=title, recommendation=recommendation,
        ranks=ranks, evidence={"summary": evidence}, message=message, source=record.cell_id,
    )  # fmt: skip


def telemetry_findings(records: Iterable[ResultBase]) -> List[Dict[str, Any]]:
    """Findings that join telemetry with timing, per measured cell: the report's rows of the one
    ``Finding`` type, with the evidence as one sentence."""
    found: List[Finding] = []
    for record in _trained(records):
        found += _clock_findings(record)
        utilisation = _utilisation_finding(record)
        if utilisation:
            found.append(utilisation)
        found += _pcie_findings(record) + _cpu_findings(record)
    return [{**f.to_row(), "evidence": f.evidence["summary"]} for f in found]


def console_lines(record: TrainingResult) -> List[str]:
    """``> [WARN] ...`` lines for the benchmark's console, one per telemetry finding."""
    return [
        f"> [WARN] {f['title'].rsplit(': ', 1)[0]}. {f.get('evidence') or f['message']}"
        for f in telemetry_findings([record])
    ]
