"""Level 2's verdicts: each measured figure against what its device should reach and against its
peers on the node, with the thresholds of the config's ``validation:`` section.

* Expected: the SKU's figure (hardware/expected_figures.py, each with its source); on CPU (too
  varied for a table), the core's own unloaded rate: the probe's work per second of its thread's
  CPU time, measured in the same windows (``probe_timing.timed_rates``), so a core that other
  processes share falls short of it even when every core does (a uniformly slowed node); the
  node's own median where that is not measured (several threads per slot). ``vs_expected`` is the
  ratio, inverted for a latency so that below 1 is always worse.
* Peers: the median of the node's other devices in the same probe (``vs_peers``), so one slow
  GPU of eight does not move its own yardstick.

A figure is the worse of its two statuses; a probe's check row is its worst figure, named.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from torchscale.config.validate_section import Bar, ValidateSection
from torchscale.hardware.expected_figures import PROBES, expected_figure
from torchscale.validate.probe_timing import UNLOADED, Figure, ProbeError, format_value
from torchscale.validate.result import CheckResult, Status, worst

NODE_MEDIAN = "the node's own median (no table for CPUs)"
UNLOADED_CORE = (
    "the core's own unloaded rate: the probe's work per second of its thread's CPU time, "
    "so a core shared with other processes falls short of it however the node's others fare"
)

CPU_FIX = (
    "On CPU: look for other processes on the node (`top`), a cgroup CPU quota (`cat "
    "/sys/fs/cgroup/cpu.max` or cpu.cfs_quota_us), and the CPU governor row."
)


def _fix(probe: str, cpu: bool) -> str:
    return CPU_FIX if cpu else PROBES[probe].fix


def ratio(value: float, reference: Optional[float], higher_is_better: bool) -> Optional[float]:
    """``value`` against ``reference``, below 1 when worse whichever way is better."""
    if reference is None or reference <= 0 or value <= 0:
        return None
    return value / reference if higher_is_better else reference / value


def bar_status(value: Optional[float], bar: Bar) -> Status:
    if value is None:
        return Status.PASS
    if value < bar.fail:
        return Status.FAIL
    if value < bar.warn:
        return Status.WARN
    return Status.PASS


@dataclass(frozen=True)
class Judged:
    """A figure with its yardsticks and verdict."""

    figure: Figure
    expected: Optional[float]
    expected_source: Optional[str]
    vs_expected: Optional[float]
    vs_peers: Optional[float]
    status: Status

    def to_dict(self) -> Dict[str, object]:
        return {
            **self.figure.to_dict(),
            "expected": self.expected,
            "expected_source": self.expected_source,
            "vs_expected": self.vs_expected,
            "vs_peers": self.vs_peers,
            "status": self.status.value,
        }

    def ratios(self) -> str:
        parts = []
        if self.vs_expected is not None and self.expected is not None:
            what = {NODE_MEDIAN: "the node's median", UNLOADED_CORE: "its unloaded rate"}.get(
                self.expected_source or "", "expected"
            )
            parts.append(f"{self.vs_expected:.2f} of {what} {format_value(self.expected)}")
        if self.vs_peers is not None:
            parts.append(f"{self.vs_peers:.2f} of its peers")
        return ", ".join(parts)


def judge_figures(figures: Sequence[Figure], settings: ValidateSection, cpu: bool) -> List[Judged]:
    """Every figure against its expected value and its peers."""
    judged = []
    for figure in figures:
        meta = PROBES[figure.probe]
        same = [f.value for f in figures if f.probe == figure.probe]
        others = [f.value for f in figures if f.probe == figure.probe and f is not figure]
        peers = statistics.median(others) if others else None
        expected: Optional[float] = None
        source: Optional[str] = None
        unloaded = figure.details.get(UNLOADED)
        if cpu and isinstance(unloaded, float):
            # The core against itself unloaded: a node slowed uniformly (every core shared)
            # has a median as slow as each core, and only this names it.
            expected, source = unloaded, UNLOADED_CORE
        elif cpu:
            expected, source = statistics.median(same), NODE_MEDIAN
        else:
            known = expected_figure(figure.device_name, figure.probe, figure.ranks)
            if known is not None:
                expected, source = known.value, known.source
        vs_expected = ratio(figure.value, expected, meta.higher_is_better)
        vs_peers = ratio(figure.value, peers, meta.higher_is_better)
        status = worst(
            [bar_status(vs_expected, settings.expected), bar_status(vs_peers, settings.peers)]
        )
        judged.append(Judged(figure, expected, source, vs_expected, vs_peers, status))
    return judged


def probe_checks(judged: Sequence[Judged], cpu: bool) -> List[CheckResult]:
    """One check row per probe: the range over devices when all pass, else the worst device."""
    rows: List[CheckResult] = []
    for probe in dict.fromkeys(j.figure.probe for j in judged):
        mine = [j for j in judged if j.figure.probe == probe]
        meta = PROBES[probe]
        values = [j.figure.value for j in mine]
        low, high = format_value(min(values)), format_value(max(values))
        span = low if low == high else f"{low}-{high}"
        devices = f"{len(mine)} devices" if len(mine) > 1 else mine[0].figure.device
        status = worst(j.status for j in mine)
        details: Dict[str, object] = {
            "figures": [
                {
                    "device": j.figure.device,
                    "value": j.figure.value,
                    "vs_expected": j.vs_expected,
                    "vs_peers": j.vs_peers,
                }
                for j in mine
            ]
        }
        if status is Status.PASS:
            shown = f"{devices}: {span} {meta.unit}"
            known = [(j.vs_expected, j.expected) for j in mine if j.vs_expected is not None]
            if known and not cpu:
                least, expected = min(known)
                shown += f" (>= {least:.2f} of expected {format_value(expected or 0.0)})"
            elif known and all(j.expected_source == UNLOADED_CORE for j in mine):
                shown += f" (>= {min(known)[0]:.2f} of each core's unloaded rate)"
            rows.append(CheckResult(meta.label, status, shown, None, details))
            continue
        bad = [j for j in mine if j.status is status]
        named = "; ".join(
            f"{j.figure.device}: {format_value(j.figure.value)} {meta.unit}, {j.ratios()}"
            for j in bad[:3]
        ) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        rest = f"; all {devices}: {span} {meta.unit}" if len(mine) > 1 else ""
        rows.append(CheckResult(meta.label, status, named + rest, _fix(probe, cpu), details))
    return rows


MEMORY_FIX = (
    "Free the device's memory (other processes: `nvidia-smi`; on CPU `free -g`), or lower the "
    "probe's size in the config's validation: section (gemm_size, copy_mib, host_copy_mib, "
    "p2p_mib; cpu_gemm_size, cpu_copy_mib on CPU), and rerun."
)
DEVICE_FIX = (
    "Not a lack of memory: read the XID errors row (`dmesg | grep -i xid`) and `nvidia-smi -q`; "
    "a CUDA error stays until the process ends, so rerun once, then reset the GPU "
    "(`nvidia-smi -r`) or drain the node if it repeats."
)


def error_checks(errors: Sequence[ProbeError]) -> List[CheckResult]:
    """A probe that could not run is a FAIL row of its own, one per probe: the devices it
    failed on, grouped by reason (each the exception's first line)."""
    rows: List[CheckResult] = []
    for probe in dict.fromkeys(e.probe for e in errors):
        mine = [e for e in errors if e.probe == probe]
        reasons: Dict[str, List[str]] = {}
        for error in mine:
            reasons.setdefault(error.reason, []).append(error.device)
        shown = [f"{_devices(devices)}: {reason}" for reason, devices in reasons.items()]
        value = "could not run on " + "; ".join(shown[:3])
        value += f"; and {len(shown) - 3} more reasons" if len(shown) > 3 else ""
        fix = MEMORY_FIX if all(e.memory for e in mine) else DEVICE_FIX
        details: Dict[str, object] = {"errors": [e.to_dict() for e in mine]}
        name = f"{PROBES[probe].label} (could not run)"
        rows.append(CheckResult(name, Status.FAIL, value, fix, details))
    return rows


def _devices(devices: List[str]) -> str:
    return ", ".join(devices[:4]) + (f" and {len(devices) - 4} more" if len(devices) > 4 else "")
