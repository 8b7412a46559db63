"""How loaded a CPU host was while a cell measured: the one place the oversubscription rule lives.

Two figures per cell, both over the measured window:

* the **CPU-wait share**: the largest share of its window a rank's training thread spent runnable
  but not running (Linux schedstat);
* the **other processes' load**: per host, the CPUs' busy time minus the CPU time of the job's
  rank processes (every thread), in cores.

A rank that waited while other processes used the cores ran on an oversubscribed host: its
figures say as much about them as about the job. A rank that waited while nothing else ran waited
behind its own process's threads (gloo's and DDP's do the all-reduce on the same cores as the
compute): a property of the job on this host, not a disturbance.
"""

from __future__ import annotations

import statistics
from typing import Dict, Iterable, List, Optional

from torchscale.results.schema import RankResult, ResultBase, TrainingResult

CPU_WAIT_SHARE = 0.15
"""A rank whose training thread waited for a CPU this share of the window was preempted ..."""
OTHER_PROCESSES_CORES = 0.25
"""... by other processes when they used at least this many cores meanwhile (below it: by the
rank's own threads)."""


def rank_cpu_wait_share(rank: RankResult) -> Optional[float]:
    """The share of its measured window a rank's training thread spent runnable but waiting for
    a CPU; None where the host does not report it."""
    if rank.cpu_wait_s is None or rank.window_s <= 0:
        return None
    return rank.cpu_wait_s / rank.window_s


def cpu_wait_share(record: TrainingResult) -> Optional[float]:
    """The largest :func:`rank_cpu_wait_share` of a cell's ranks (None where not reported)."""
    shares = [s for s in map(rank_cpu_wait_share, record.per_rank) if s is not None]
    return max(shares) if shares else None


def other_processes_cores(record: TrainingResult) -> Dict[str, Optional[float]]:
    """Per host: the cores other processes kept busy during the cell's measured window (the
    host's busy CPU time minus the rank processes' own, over the window); None where a rank on it
    did not report both."""
    hosts: Dict[str, List[RankResult]] = {}
    for rank in record.per_rank:
        hosts.setdefault(rank.host, []).append(rank)
    load: Dict[str, Optional[float]] = {}
    for host, ranks in hosts.items():
        busy = [r.host_busy_cpu_s for r in ranks]
        own = [r.process_cpu_s for r in ranks]
        window = statistics.mean(r.window_s for r in ranks)
        if any(v is None for v in busy + own) or window <= 0:
            load[host] = None
            continue
        host_busy = statistics.mean(v for v in busy if v is not None)
        load[host] = max(0.0, host_busy - sum(v for v in own if v is not None)) / window
    return load


def oversubscribed(share: Optional[float], others: Optional[float]) -> bool:
    """Whether a rank that waited ``share`` of its window for a CPU (at least
    :data:`CPU_WAIT_SHARE`) was preempted by other processes: they kept ``others`` cores of its
    host busy meanwhile (:func:`other_processes_cores`), at least :data:`OTHER_PROCESSES_CORES`,
    or their load is not known."""
    if share is None or share < CPU_WAIT_SHARE:
        return False
    return others is None or others >= OTHER_PROCESSES_CORES


def oversubscribed_wait(records: Iterable[ResultBase]) -> Optional[float]:
    """The largest CPU-wait share of a rank that :func:`oversubscribed` calls preempted by other
    processes, over ``records``; None when no rank was."""
    shares: List[float] = []
    for record in records:
        if not isinstance(record, TrainingResult):
            continue
        others = other_processes_cores(record)  # once per cell, not per rank
        for rank in record.per_rank:
            share = rank_cpu_wait_share(rank)
            if share is not None and oversubscribed(share, others.get(rank.host)):
                shares.append(share)
    return max(shares) if shares else None
