"""GPU performance-state checks from NVML: clocks-event (throttle) reasons, temperature and power
against their limits, and the PCIe link against its maximum."""

from __future__ import annotations

from typing import Any, List, Sequence

from torchscale.hardware.nvml import (
    UNNAMED_REASON,
    Nvml,
    decode_clocks_event_reasons,
    reason_label,
    supported,
)
from torchscale.validate.gpu import answers, not_reported
from torchscale.validate.result import CheckResult, fail, join, passed, unique, warn

THERMAL_FIX = (
    "Check cooling: fans, airflow, blocked vents, inlet temperature; inspect with "
    "`nvidia-smi -q -d PERFORMANCE,TEMPERATURE`."
)
HOT_MARGIN_C = 5  # WARN this close to the slowdown temperature when NVML has no max-operating one
POWER_CAP_RATIO = 0.95


def check_clocks_events(nvml: Nvml, handles: Sequence[Any]) -> CheckResult:
    """Current clocks-event (throttle) reasons: thermal, power brake, hardware slowdown."""
    name = "Clock throttling"
    masks = [nvml.clocks_event_reasons(h) for h in handles]
    unknown = not_reported(name, masks, "nvidia-smi -q -d PERFORMANCE")
    if unknown:
        return unknown
    hard = {"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
    soft = {"sw_thermal_slowdown", "sw_power_cap", "board_limit", "reliability"}
    per_gpu = {
        i: [
            r
            for r in decode_clocks_event_reasons(int(m))
            if r in hard | soft or r.startswith(UNNAMED_REASON)
        ]
        for i, m in enumerate(masks)
        if supported(m)
    }
    active = {i: reasons for i, reasons in per_gpu.items() if reasons}
    if not active:
        return passed(name, f"no throttling on {len(per_gpu)} GPUs")
    shown = join(f"GPU {i}: {', '.join(map(reason_label, r))}" for i, r in active.items())
    reasons = {r for rs in active.values() for r in rs}
    fixes = []
    if reasons & {"hw_thermal_slowdown", "sw_thermal_slowdown"}:
        fixes.append(THERMAL_FIX)
    if "hw_power_brake_slowdown" in reasons:
        fixes.append("Power brake is asserted by the system: check PSUs and power delivery.")
    if "hw_slowdown" in reasons and len(fixes) == 0:
        fixes.append(THERMAL_FIX + " HW slowdown also follows power-supply faults.")
    if "sw_power_cap" in reasons:
        fixes.append(
            "SW power cap: the GPU is at its power limit (normal under full load, not when idle); "
            "check `nvidia-smi -q -d POWER`."
        )
    if reasons & {"board_limit", "reliability"}:
        fixes.append(
            "Board limit / reliability: the board or the driver's reliability policy caps the "
            "clocks (power delivery, voltage); compare `nvidia-smi -q -d PERFORMANCE` across GPUs "
            "and ask the vendor if one GPU stays capped."
        )
    if any(r.startswith(UNNAMED_REASON) for r in reasons):
        fixes.append("Look the bit up in your driver's nvml.h (nvmlClocksEventReason*).")
    status = fail if reasons & hard else warn
    return status(name, shown, " ".join(fixes), reasons={str(i): r for i, r in active.items()})


def check_temperature(nvml: Nvml, handles: Sequence[Any]) -> CheckResult:
    name = "Temperature"
    temps = answers(
        nvml, handles, "nvmlDeviceGetTemperature", nvml.const("NVML_TEMPERATURE_GPU", 0)
    )
    unknown = not_reported(name, temps, "nvidia-smi -q -d TEMPERATURE")
    if unknown:
        return unknown
    slowdown = answers(nvml, handles, "nvmlDeviceGetTemperatureThreshold", 1)  # SLOWDOWN
    max_operating = answers(nvml, handles, "nvmlDeviceGetTemperatureThreshold", 3)  # GPU_MAX
    hot, warm = [], []
    for i, t in enumerate(temps):
        if not supported(t):
            continue
        limit = int(slowdown[i]) if supported(slowdown[i]) else None
        high = int(max_operating[i]) if supported(max_operating[i]) else None
        if high is None and limit is not None:
            high = limit - HOT_MARGIN_C
        if limit is not None and int(t) >= limit:
            hot.append(f"GPU {i}: {t} C >= slowdown {limit} C")
        elif high is not None and int(t) >= high:
            warm.append(f"GPU {i}: {t} C >= max operating {high} C")
    values = [int(t) for t in temps if supported(t)]
    limits = unique(int(s) for s in slowdown if supported(s))
    summary = f"{min(values)}-{max(values)} C" + (
        f" (slowdown at {'/'.join(map(str, limits))} C)" if limits else ""
    )
    if hot:
        return fail(name, join(hot), THERMAL_FIX)
    if warm:
        return warn(name, join(warm), THERMAL_FIX)
    return passed(name, summary)


def check_power(nvml: Nvml, handles: Sequence[Any]) -> CheckResult:
    name = "Power"
    draw, limit, default = (
        answers(nvml, handles, f)
        for f in (
            "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetEnforcedPowerLimit",
            "nvmlDeviceGetPowerManagementDefaultLimit",
        )
    )
    unknown = not_reported(name, limit, "nvidia-smi -q -d POWER")
    if unknown:
        return unknown
    capped = [
        f"GPU {i}: limit {int(lim) / 1000:.0f} W < default {int(d) / 1000:.0f} W"
        for i, (lim, d) in enumerate(zip(limit, default))
        if supported(lim) and supported(d) and int(lim) < POWER_CAP_RATIO * int(d)
    ]
    watts = [int(w) / 1000 for w in draw if supported(w)]
    limits = unique(f"{int(lim) / 1000:.0f}" for lim in limit if supported(lim))
    summary = (f"{min(watts):.0f}-{max(watts):.0f} W drawn, " if watts else "") + (
        f"limit {'/'.join(limits)} W"
    )
    if capped:
        return warn(
            name,
            join(capped),
            "The power limit was lowered: restore it with `sudo nvidia-smi -pl <default watts>` "
            "(see `nvidia-smi -q -d POWER`), or expect lower throughput.",
        )
    return passed(name, summary)


def check_pcie(nvml: Nvml, handles: Sequence[Any]) -> CheckResult:
    """PCIe link generation and width against the maximum the GPU and slot support."""
    name = "PCIe link"
    gen, max_gen, width, max_width, util = (
        answers(nvml, handles, f"nvmlDeviceGet{what}")
        for what in (
            "CurrPcieLinkGeneration",
            "MaxPcieLinkGeneration",
            "CurrPcieLinkWidth",
            "MaxPcieLinkWidth",
            "UtilizationRates",
        )
    )
    unknown = not_reported(name, gen, "nvidia-smi -q -d PCIE")
    if unknown:
        return unknown
    narrow: List[str] = []
    slow: List[str] = []
    idle_down: List[str] = []
    for i in range(len(handles)):
        if supported(width[i]) and supported(max_width[i]) and int(width[i]) < int(max_width[i]):
            narrow.append(f"GPU {i}: x{width[i]} of x{max_width[i]}")
        if supported(gen[i]) and supported(max_gen[i]) and int(gen[i]) < int(max_gen[i]):
            # Idle GPUs train their link down to save power: only a busy GPU's gen matters.
            busy = supported(util[i]) and int(util[i].gpu) > 0
            (slow if busy else idle_down).append(f"GPU {i}: gen {gen[i]} of {max_gen[i]}")
    shapes = unique(f"gen {g} x{w}" for g, w in zip(gen, width) if supported(g) and supported(w))
    if narrow or slow:
        return warn(
            name,
            join(narrow + slow),
            "Link trained below its maximum: reseat the GPU or riser, check the slot's BIOS "
            "settings; compare `nvidia-smi -q -d PCIE` with `sudo lspci -vv | grep LnkSta`.",
        )
    note = f" ({len(idle_down)} idle GPUs in power-saving link speed)" if idle_down else ""
    return passed(name, ", ".join(shapes) + note)
