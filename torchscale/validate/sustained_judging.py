"""Level 3's verdicts: does a device hold its rate under sustained load, and why not.

Drift compares the median of the last third of the slices with the median of the first third
(``validation.drift``: a GPU that heats up and clocks down shows it; a throttled CPU too). The NVML
samples say why: the SM clock's own drift, clocks-event reasons seen under load (HW slowdown,
HW thermal slowdown and HW power brake are FAIL as in level 1; SW thermal slowdown WARN; SW power
cap is what a GPU at full GEMM load normally reports), the hottest temperature against the
slowdown and max-operating thresholds, the power drawn against the limit, and ECC counters that
grew during the run (uncorrected: FAIL, corrected: WARN).
"""

from __future__ import annotations

import statistics
from typing import Dict, List, Optional, Sequence

from torchscale.config.validate_section import ValidateSection
from torchscale.hardware.nvml import decode_clocks_event_reasons, reason_label
from torchscale.validate.judging import bar_status
from torchscale.validate.probe_timing import format_value
from torchscale.validate.result import CheckResult, Status, join, passed, skip, worst
from torchscale.validate.sustained_load import SustainedRun

HARD = {"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
SOFT = {"sw_thermal_slowdown"}
THERMAL_FIX = (
    "The device slows under load: check cooling (fans, airflow, inlet temperature) and power "
    "delivery; `nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER` during load names the reason; "
    "run `dcgmi diag -r 3` and RMA a GPU that keeps throttling."
)
LABELS = {"gemm": ("Sustained GEMM", "TFLOP/s"), "copy": ("Sustained memory copy", "GB/s")}


def drift(values: Sequence[float]) -> Optional[float]:
    """Median of the last third over the median of the first third (None: too few values)."""
    third = len(values) // 3
    if third < 1:
        return None
    first = statistics.median(values[:third])
    return statistics.median(values[-third:]) / first if first > 0 else None


def rate_checks(run: SustainedRun, settings: ValidateSection) -> List[CheckResult]:
    rows = []
    for probe, (name, unit) in LABELS.items():
        found = {d: drift(rates[probe]) for d, rates in run.slices.items() if rates.get(probe)}
        if not found:
            continue
        ends = {d: rates[probe][-1] for d, rates in run.slices.items() if rates.get(probe)}
        shown_rates = f"{format_value(min(ends.values()))}-{format_value(max(ends.values()))}"
        statuses = {d: bar_status(r, settings.drift) for d, r in found.items()}
        status = worst(statuses.values())
        details = {"drift": found, "slices": {d: r[probe] for d, r in run.slices.items()}}
        if status is Status.PASS:
            known = [r for r in found.values() if r is not None]
            low = f"{min(known):.2f}" if known else "-"
            value = (
                f"{len(found)} device(s) held {low}+ of their first-third rate for "
                f"{run.duration_s:.0f} s; {shown_rates} {unit} at the end"
            )
            rows.append(CheckResult(name, status, value, None, details))
            continue
        slow = [d for d, s in statuses.items() if s is status]
        value = join(f"{d}: {found[d]:.2f} of its first-third rate" for d in slow)
        rows.append(CheckResult(name, status, value, THERMAL_FIX, details))
    return rows


def _series(samples: List[Dict[str, Optional[float]]], key: str) -> List[float]:
    return [float(v) for s in samples if (v := s.get(key)) is not None]


def clock_check(run: SustainedRun, settings: ValidateSection) -> CheckResult:
    name = "Clocks under load"
    if not run.samples:
        mhz = run.cpu_mhz
        ratio = drift(mhz)
        if ratio is None:
            return skip(
                name,
                "no clock readings (no NVML; psutil sees no CPU frequency here)",
                "Nothing to read in this VM or container; on bare metal watch "
                "`cpupower monitor` during load.",
            )
        status = bar_status(ratio, settings.drift)
        shown = f"CPU {format_value(mhz[0])} -> {format_value(mhz[-1])} MHz ({ratio:.2f})"
        return CheckResult(name, status, shown, None if status is Status.PASS else THERMAL_FIX)
    findings, statuses, clocks = [], [Status.PASS], []
    for index, samples in run.samples.items():
        sm = _series(samples, "sm_clock_mhz")
        reasons = {
            r for mask in _series(samples, "clocks_event_reasons")
            for r in decode_clocks_event_reasons(int(mask))
        }  # fmt: skip
        ratio = drift(sm)
        if sm:
            clocks.append(sm[-1])
        if reasons & HARD:
            statuses.append(Status.FAIL)
        elif reasons & SOFT or bar_status(ratio, settings.drift) is not Status.PASS:
            statuses.append(worst([bar_status(ratio, settings.drift), Status.WARN]))
        else:
            continue
        seen = ", ".join(reason_label(r) for r in sorted(reasons & (HARD | SOFT)))
        findings.append(
            f"GPU {index}: SM clock {format_value(sm[0])} -> {format_value(sm[-1])} MHz"
            + (f", {seen}" if seen else "")
        )
    status = worst(statuses)
    if status is Status.PASS:
        span = f"{format_value(min(clocks))}-{format_value(max(clocks))} MHz" if clocks else "-"
        return passed(name, f"SM clocks at the end {span}; no HW slowdown under load")
    return CheckResult(name, status, join(findings), THERMAL_FIX)


def temperature_check(run: SustainedRun) -> Optional[CheckResult]:
    if not run.samples:
        return None
    name = "Temperature under load"
    hot, warm, peaks = [], [], []
    for index, samples in run.samples.items():
        temps = _series(samples, "temperature_c")
        if not temps:
            continue
        peak = max(temps)
        peaks.append(peak)
        limits = run.thresholds.get(index, {})
        slowdown, operating = limits.get("slowdown_c"), limits.get("max_operating_c")
        if slowdown is not None and peak >= slowdown:
            hot.append(f"GPU {index}: {peak:.0f} C >= slowdown {slowdown:.0f} C")
        elif operating is not None and peak >= operating:
            warm.append(f"GPU {index}: {peak:.0f} C >= max operating {operating:.0f} C")
    if not peaks:
        return skip(name, "not reported by NVML", "Check by hand: `nvidia-smi -q -d TEMPERATURE`.")
    if hot or warm:
        return CheckResult(name, Status.FAIL if hot else Status.WARN, join(hot + warm), THERMAL_FIX)
    return passed(name, f"hottest {max(peaks):.0f} C over {len(peaks)} GPUs")


def power_check(run: SustainedRun) -> Optional[CheckResult]:
    if not run.samples:
        return None
    draws = {i: _series(s, "power_w") for i, s in run.samples.items()}
    limits = {i: _series(s, "power_limit_w") for i, s in run.samples.items()}
    peaks = [max(v) for v in draws.values() if v]
    if not peaks:
        return skip("Power under load", "not reported by NVML", "`nvidia-smi -q -d POWER`.")
    limit = max((max(v) for v in limits.values() if v), default=None)
    shown = f"peak {min(peaks):.0f}-{max(peaks):.0f} W" + (f" of {limit:.0f} W" if limit else "")
    return passed("Power under load", shown)


def ecc_check(run: SustainedRun) -> Optional[CheckResult]:
    if not run.ecc_before:
        return None
    name = "ECC during load"
    grown: Dict[str, List[str]] = {"uncorrected": [], "corrected": []}
    for index, before in run.ecc_before.items():
        after = run.ecc_after.get(index, {})
        for kind in grown:
            start, end = before.get(kind), after.get(kind)
            if start is not None and end is not None and end > start:
                grown[kind].append(f"GPU {index}: +{end - start} {kind}")
    if grown["uncorrected"]:
        return CheckResult(
            name,
            Status.FAIL,
            join(grown["uncorrected"] + grown["corrected"]),
            "Uncorrectable memory errors under load: drain the node, `nvidia-smi -q -d "
            "ECC,ROW_REMAPPER`, reset the GPU and RMA it if they return.",
        )
    if grown["corrected"]:
        return CheckResult(
            name,
            Status.WARN,
            join(grown["corrected"]),
            "Corrected errors grew under load: watch `nvidia-smi -q -d ECC`; a GPU whose count "
            "keeps rising is on its way to row remapping or an RMA.",
        )
    return passed(name, f"no new ECC errors on {len(run.ecc_before)} GPUs")


def sustained_checks(run: SustainedRun, settings: ValidateSection) -> List[CheckResult]:
    rows = [*rate_checks(run, settings), clock_check(run, settings)]
    for extra in (temperature_check(run), power_check(run), ecc_check(run)):
        if extra is not None:
            rows.append(extra)
    return rows
