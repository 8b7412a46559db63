"""Who had the CPUs during a rank's measured window: its training thread, its whole process, the
host.

A training thread that waits for a CPU (runnable, not running) may wait behind other processes
(an oversubscribed host) or behind its own process's threads: gloo's and DDP's, which on a CPU
run do the all-reduce on the same cores as the compute. The thread's wait alone cannot tell
them apart; the host's busy time minus the job's processes' CPU time can (``analysis/cpu_load``
does that sum per host).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

# /proc/stat's aggregate line counts in USER_HZ ticks; idle and iowait are the CPUs not in use.
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_IDLE_FIELDS = (3, 4)  # idle, iowait (0-based among the numbers after "cpu")


def host_busy_s() -> Optional[float]:
    """CPU-seconds all of the host's CPUs spent busy since boot (Linux ``/proc/stat``; steal
    time, another guest on the hypervisor, counts as busy), None elsewhere."""
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            fields = handle.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(v) for v in fields[1:9]]  # user .. steal; guest time is already in user
    busy = sum(t for i, t in enumerate(ticks) if i not in _IDLE_FIELDS)
    return busy / _TICKS_PER_S


def thread_cpu() -> Tuple[float, Optional[float]]:
    """(CPU seconds, seconds runnable but waiting for a CPU) of the calling thread so far.

    Linux's ``/proc/thread-self/schedstat`` has both; elsewhere only the CPU time is known.
    """
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as handle:
            run_ns, wait_ns = (int(v) for v in handle.read().split()[:2])
        return run_ns / 1e9, wait_ns / 1e9
    except (OSError, ValueError):
        return time.thread_time(), None


@dataclass(frozen=True)
class CpuSnapshot:
    thread_cpu_s: float
    thread_wait_s: Optional[float]
    process_cpu_s: float  # every thread of this process (user + system)
    host_busy_s: Optional[float]

    @classmethod
    def now(cls) -> CpuSnapshot:
        thread, wait = thread_cpu()
        return cls(thread, wait, time.process_time(), host_busy_s())

    def since(self, before: CpuSnapshot) -> Dict[str, Optional[float]]:
        """The RankResult fields for the window from ``before`` to this snapshot."""

        def delta(now: Optional[float], then: Optional[float]) -> Optional[float]:
            return now - then if now is not None and then is not None else None

        return {
            "cpu_time_s": self.thread_cpu_s - before.thread_cpu_s,
            "cpu_wait_s": delta(self.thread_wait_s, before.thread_wait_s),
            "process_cpu_s": self.process_cpu_s - before.process_cpu_s,
            "host_busy_cpu_s": delta(self.host_busy_s, before.host_busy_s),
            "host_cpus": float(os.cpu_count() or 0) or None,
        }
