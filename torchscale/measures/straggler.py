"""The straggler rule: which rank the others wait for, if one does. The only place it is decided.

A straggler is the rank the others wait for at gradient sync. In a blocking collective the late
rank waits least (the others are already there), so per-rank waits name it. The rule is used by
the worker's sync warning (per-step waits of every rank), the profiler's findings (waits from
traces, plus who arrived last at each collective) and the report (which reads the worker's
verdict from the record); :func:`find_straggler` gives each the same verdict on the same figures.

Pure Python, no pandas or torch: the worker calls it on every cell.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

if TYPE_CHECKING:
    from torchscale.results.schema import TrainingResult

STRAGGLER_SPREAD = 0.10
"""Per-step waits alone: a rank is named the straggler when per-rank sync waits differ by more
than this share of the step: the others wait for it every step."""

# With traces, who arrived last at each collective is known too. A rank is a straggler when it
# caused most of the waiting in collectives (weighted by wait, so DDP's many small buffer
# broadcasts cannot outvote the all-reduce that stalls). With no straggler each of N ranks causes
# ~1/N of it by chance, so the bar is halfway between chance and certainty, and never below 60%:
# 75% for 2 ranks, 62.5% for 4, 60% from 5 on.
STRAGGLER_MIN_CAUSED_SHARE = 0.6
STRAGGLER_MIN_INSTANCES = 2
"""... at this many significant collectives at least ..."""
STRAGGLER_MIN_STALL_PCT = 2.0
"""... and only worth reporting when the others lose >= 2% of their step waiting for it."""


def straggler_share_threshold(ranks: int) -> float:
    chance = 1.0 / max(ranks, 1)
    return max(STRAGGLER_MIN_CAUSED_SHARE, chance + (1.0 - chance) / 2)


@dataclass(frozen=True)
class RankWait:
    """One rank's figures: its wait in gradient sync per ``step`` (same unit as the step), and,
    from traces, the share of all waiting it caused by arriving last."""

    rank: int
    wait: Optional[float]
    caused_share: Optional[float] = None
    significant_instances: int = 0


@dataclass(frozen=True)
class Straggler:
    rank: int
    spread: float  # longest wait minus shortest, in the unit of the waits
    others_wait: float  # the other ranks' mean wait


def find_straggler(ranks: Sequence[RankWait], step: float) -> Optional[Straggler]:
    """The straggler among ``ranks`` (in rank order), or None.

    From waits alone: the rank that waits least, when the waits differ by more than
    ``STRAGGLER_SPREAD`` of the step. With trace evidence (``caused_share``): the rank that caused
    at least :func:`straggler_share_threshold` of the waiting over ``STRAGGLER_MIN_INSTANCES``
    significant collectives, when the others wait at least ``STRAGGLER_MIN_STALL_PCT`` % of the
    step for it.
    """
    known = [r for r in ranks if r.wait is not None and r.wait == r.wait]  # NaN: not measured
    if len(known) < 2 or not step > 0:
        return None
    waits = [float(r.wait) for r in known if r.wait is not None]
    spread = max(waits) - min(waits)
    if any(r.caused_share is not None for r in ranks):
        for candidate in ranks:
            share = candidate.caused_share
            if not (
                candidate.significant_instances >= STRAGGLER_MIN_INSTANCES
                and share is not None
                and share >= straggler_share_threshold(len(ranks))
            ):
                continue
            others = [w for r, w in zip(known, waits) if r.rank != candidate.rank]
            others_wait = sum(others) / len(others) if others else float("nan")
            if others_wait >= STRAGGLER_MIN_STALL_PCT * step / 100.0:
                return Straggler(candidate.rank, spread, others_wait)
        return None
    if spread > STRAGGLER_SPREAD * step:
        slowest = known[waits.index(min(waits))]
        others = [w for r, w in zip(known, waits) if r is not slowest]
        return Straggler(slowest.rank, spread, sum(others) / len(others))
    return None


def record_straggler(record: TrainingResult) -> Optional[int]:
    """The straggler of a recorded cell: the worker's verdict (it applied :func:`find_straggler`
    to these figures), or the rule applied to the per-rank waits of a record without one."""
    if record.sync is not None:
        return record.sync.slowest_rank
    step = record.step_time_ms.mean if record.step_time_ms else 0.0
    waits = [RankWait(r.rank, r.sync_wait_ms) for r in record.per_rank]
    straggler = find_straggler(waits, step)
    return straggler.rank if straggler else None


# --- what to do about it: one text per finding, for GPUs (NCCL) and for CPU processes (gloo) ---
PROFILE_NEXT = "Then profile the cell with 'torchscale profile --target sync_stalls'."
"""The next step a finding from the worker's figures adds (a profiler finding has traces)."""


def straggler_advice(rank: int, gpu: bool, next_step: str = "") -> str:
    where = (
        "on its host run `nvidia-smi -q -d PERFORMANCE,CLOCK,TEMPERATURE` (throttle reasons, "
        "SM clock below the others, temperature) and compare with a healthy GPU"
        if gpu
        else "on its host check CPU load and frequency (`top`, `cpupower frequency-info`) and "
        "other processes competing for its cores"
    )
    advice = (
        f"Look at what makes rank {rank} slower: {where}; check its data loading (more "
        "DataLoader workers, pinned memory, local copy of the dataset) and any work only it "
        "does (logging, checkpointing, evaluation on rank 0)."
    )
    return f"{advice} {next_step}" if next_step else advice


def sync_variance_advice(gpu: bool, next_step: str = "") -> str:
    advice = (
        "Sync time varies with who arrives last (see any straggler finding) or with a contended "
        "interconnect: run nccl-tests all_reduce_perf on these GPUs and check NCCL_DEBUG=INFO for "
        "the transport (NVLink/IB vs sockets) and other traffic on the network."
        if gpu
        else "Sync time varies with who arrives last (see any straggler finding) or with "
        "contention for the CPU: on a gloo run each rank's compute and its all-reduce share the "
        "host's cores and memory bandwidth, so look for other processes on them (`top`) and give "
        "every rank cores of its own (fewer ranks per host, or TORCHSCALE_CPU_SLOTS)."
    )
    return f"{advice} {next_step}" if next_step else advice
