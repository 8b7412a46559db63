"""What ``validate --level 2`` and ``--level 3`` add to level 1's checks.

Level 2: the node facts (XID errors since boot, CPU governor, InfiniBand / RoCE ports), the
measured per-device probes (device_probes), the node's all-reduce and all-gather busbw (from the
smoke test's launch, which times both at this level), each figure judged (judging). Level 3:
GEMM and copy under sustained load with NVML watching (sustained_load, sustained_judging).
A level-2 record is kept in the output folder (``validate/host-<host>.json``), where a fleet
report and the straggler findings of benchmark and profile read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from torchscale.config.validate_section import ValidateSection
from torchscale.hardware.kernel_log import parse_xids, read_kernel_log
from torchscale.hardware.node_sysfs import cpu_governors, ib_ports
from torchscale.results.files import atomic_write_json, ensure_dir
from torchscale.results.layout import validate_record_path
from torchscale.validate.node_health import check_governor, check_ib_ports, check_xid
from torchscale.validate.probe_timing import Figure, describe
from torchscale.validate.result import CheckResult, Status, fail

LEVELS = (1, 2, 3)
Notify = Callable[[str], None]


def node_health_checks(bus_ids: Sequence[Optional[str]]) -> List[CheckResult]:
    log = read_kernel_log()
    return [
        check_xid(log, parse_xids(log.lines or []), bus_ids),
        check_governor(cpu_governors()),
        check_ib_ports(ib_ports()),
    ]


def collective_figures(smoke: CheckResult) -> List[Figure]:
    """The node's all-reduce and all-gather busbw, from a passed smoke test's timing."""
    details = smoke.details
    if smoke.status is not Status.PASS or "busbw_gbps" not in details:
        return []
    name, ranks = str(details.get("device", "cpu")), int(str(details["world_size"]))
    found = [Figure("all_reduce", "node", float(str(details["busbw_gbps"])), name, (), ranks)]
    gather = details.get("all_gather")
    if isinstance(gather, dict) and "busbw_gbps" in gather:
        found.append(Figure("all_gather", "node", float(gather["busbw_gbps"]), name, (), ranks))
    return found


@dataclass
class LevelOutcome:
    checks: List[CheckResult] = field(default_factory=list)
    probes: List[Dict[str, object]] = field(default_factory=list)
    sustained: Optional[Dict[str, Any]] = None


def run_levels(
    level: int,
    settings: ValidateSection,
    bus_ids: Sequence[Optional[str]],
    smoke: CheckResult,
    notify: Notify,
) -> LevelOutcome:
    """Levels 2 and 3 on this node (call with ``level`` >= 2; the smoke test has finished, so
    nothing else loads the devices while they are measured)."""
    from torchscale.validate.device_probes import measure_devices
    from torchscale.validate.judging import error_checks, judge_figures, probe_checks

    notify("kernel log, CPU governor, InfiniBand")
    outcome = LevelOutcome(node_health_checks(bus_ids))
    notify("probes")
    measured = measure_devices(settings, notify)
    figures = measured.figures + collective_figures(smoke)
    judged = judge_figures(figures, settings, measured.cpu)
    outcome.checks += probe_checks(judged, measured.cpu) + error_checks(measured.errors)
    outcome.probes = [j.to_dict() for j in judged]
    if level >= 3:
        sustained(settings, outcome, notify)
    return outcome


SUSTAINED = "Sustained load"


def sustained(settings: ValidateSection, outcome: LevelOutcome, notify: Notify) -> None:
    """Level 3's rows; a load that cannot run (out of memory, a CUDA error on any device) is a
    FAIL row with the reason, as a level-2 probe's is."""
    from torchscale.validate.judging import DEVICE_FIX, MEMORY_FIX
    from torchscale.validate.sustained_judging import sustained_checks
    from torchscale.validate.sustained_load import LoadFailed, run_sustained, torch_load

    notify(f"sustained load ({settings.sustained_s:g} s)")
    try:
        run = run_sustained(settings, torch_load)
    except (RuntimeError, MemoryError) as exc:
        device = exc.device if isinstance(exc, LoadFailed) else "CPU"
        reason, memory = describe(exc.cause if isinstance(exc, LoadFailed) else exc)
        fix = MEMORY_FIX if memory else DEVICE_FIX
        outcome.checks.append(fail(SUSTAINED, f"could not run on {device}: {reason}", fix))
        outcome.sustained = {"error": {"device": device, "reason": reason}}
        return
    outcome.checks += sustained_checks(run, settings)
    outcome.sustained = {
        "duration_s": round(run.duration_s, 3),
        "slices": run.slices,
        "samples": {str(k): v for k, v in run.samples.items()},
        "ecc_before": {str(k): v for k, v in run.ecc_before.items()},
        "ecc_after": {str(k): v for k, v in run.ecc_after.items()},
    }


def save_record(report: Dict[str, Any], output_dir: Path) -> Path:
    """Keep a level-2+ report where benchmark, profile and the fleet check find it."""
    path = validate_record_path(output_dir, str(report["host"]))
    ensure_dir(path.parent)
    atomic_write_json(path, report)
    return path
