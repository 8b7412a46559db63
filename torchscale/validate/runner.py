"""Run every check in order and assemble the report ``torchscale validate`` prints.

Order: software (imports torch), GPU health and interconnect (one NVML session), the node itself,
then the functional smoke test. On a node without GPUs every NVML check is SKIP ("no GPU") and the
GPUs check says plainly that only CPU (gloo) benchmarking is possible.
"""

from __future__ import annotations

import os
import platform
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from torchscale.config.validate_section import ValidateSection
from torchscale.hardware.nvml import NO_PERMISSION, open_nvml, supported
from torchscale.hardware.topology import bus_id
from torchscale.validate import gpu, interconnect, performance, software, system
from torchscale.validate.result import CheckResult, fail, skip, summarize
from torchscale.validate.smoke import NAME as SMOKE_NAME
from torchscale.validate.smoke import run_smoke_test
from torchscale.version import __version__

GPU_CHECKS = (
    ("MIG mode", gpu.check_mig),
    ("Persistence mode", gpu.check_persistence),
    ("ECC", gpu.check_ecc),
    ("Retired pages / remapped rows", gpu.check_retired_memory),
    ("Clock throttling", performance.check_clocks_events),
    ("Temperature", performance.check_temperature),
    ("Power", performance.check_power),
    ("PCIe link", performance.check_pcie),
)
INTERCONNECT_CHECKS = (
    ("NVLink", interconnect.check_nvlink),
    ("GPU topology", interconnect.check_topology),
)


@dataclass(frozen=True)
class ValidateOptions:
    timeout_s: float = 60.0
    skip_smoke: bool = False
    output_dir: Path = Path("results")
    level: int = 1  # 1: configuration; 2: + measured probes; 3: + sustained load
    settings: ValidateSection = field(default_factory=ValidateSection)
    before_probes: Optional[Callable[[], None]] = None  # the fleet: start probes together


@dataclass(frozen=True)
class GpuHealth:
    """What one NVML session found: driver versions and the GPU check rows."""

    driver: Any  # str, or Unsupported when there is no driver
    cuda_driver: Any  # int (12040 = CUDA 12.4), or Unsupported
    gpus: int
    checks: List[CheckResult]
    bus_ids: List[Optional[str]] = field(default_factory=list)  # PCI bus id per GPU


def gpu_health(torch_count: int) -> GpuHealth:
    """Every NVML check, in one NVML session; all SKIP ("no GPU") when NVML sees none."""
    no_gpu = [gpu.no_gpu_check(name) for name, _ in GPU_CHECKS + INTERCONNECT_CHECKS]
    with open_nvml() as nvml:
        if not supported(nvml):
            return GpuHealth(nvml, nvml, 0, [gpu.check_gpus(None, [], torch_count), *no_gpu])
        handles = nvml.handles()
        handles = handles if supported(handles) else []
        checks = [gpu.check_gpus(nvml, handles, torch_count)]
        if handles:
            checks += [check(nvml, handles) for _, check in GPU_CHECKS]
            net = interconnect.read_interconnect(nvml, handles)
            checks += [check(net) for _, check in INTERCONNECT_CHECKS]
        else:
            checks += no_gpu
        buses = [bus_id(nvml, h) for h in handles]
        return GpuHealth(
            nvml.driver_version(), nvml.cuda_driver_version(), len(handles), checks, buses
        )


def smoke_ranks() -> int:
    """GPUs the smoke test gives a rank each, known before torch is imported: NVML's count, cut
    to CUDA_VISIBLE_DEVICES. 0 means two gloo CPU ranks."""
    with open_nvml() as nvml:
        handles = nvml.handles() if supported(nvml) else []
        # Another job's GPUs (NO_PERMISSION) are not ours to test; a lost GPU is, and fails.
        count = (
            len([h for h in handles if getattr(h, "error", None) != NO_PERMISSION])
            if supported(handles)
            else 0
        )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = min(count, len([d for d in visible.split(",") if d.strip()]))
    return count


def run_validation(
    options: ValidateOptions,
    on_check: Optional[Callable[[str], None]] = None,
) -> Dict[str, Any]:
    """Every check; ``on_check(name)`` announces the slow steps (progress).

    The smoke test's torchrun launch starts first, in a thread, so its workers' start-up overlaps
    with importing torch and the other checks here; Ctrl-C still ends its whole process tree.
    """
    started = time.monotonic()
    notify = on_check or (lambda _name: None)
    cancel = threading.Event()
    with ThreadPoolExecutor(max_workers=1) as pool:
        smoke = None
        if not options.skip_smoke:
            smoke = pool.submit(
                run_smoke_test, smoke_ranks(), options.timeout_s, cancel, options.level >= 2
            )
        try:
            notify("PyTorch")
            facts = software.torch_facts()
            notify("NVML")
            health = gpu_health(facts.device_count)
            checks: List[CheckResult] = [
                software.check_python(),
                software.check_torch(facts),
                software.check_cuda(facts, health.gpus),
                software.check_cuda_driver(facts.cuda_build, health.cuda_driver, health.gpus),
                software.check_driver(health.driver),
                software.check_nccl(facts, health.gpus),
                software.check_nsys(),
                *health.checks,
                system.check_shm(),
                system.check_open_files(),
                system.check_hostname(),
                system.check_master_env(),
                system.check_nccl_env(),
                system.check_disk(options.output_dir),
                system.check_host_load(options.settings.busy_share),
            ]
            notify(SMOKE_NAME)
            checks.append(smoke_check(smoke))
        except BaseException:
            cancel.set()  # the smoke thread kills its torchrun tree and returns
            raise
    extra: Dict[str, Any] = {"level": options.level}
    if options.level >= 2:
        from torchscale.validate.levels import run_levels

        if options.before_probes is not None:
            notify("waiting for the other nodes")
            options.before_probes()
        outcome = run_levels(options.level, options.settings, health.bus_ids, checks[-1], notify)
        checks += outcome.checks
        extra["probes"] = outcome.probes
        if outcome.sustained is not None:
            extra["sustained"] = outcome.sustained
    return {**build_report(checks, facts.cuda_available, time.monotonic() - started), **extra}


def smoke_check(smoke: Optional[Future[CheckResult]]) -> CheckResult:
    if smoke is None:
        return skip(SMOKE_NAME, "skipped (--skip-smoke)", "Run without --skip-smoke.")
    try:
        return smoke.result()
    except Exception as exc:  # e.g. no space for its temp dir: a FAIL row, not a traceback
        return fail(
            SMOKE_NAME,
            f"could not launch: {type(exc).__name__}: {exc}",
            "Check that the temp directory ($TMPDIR) is writable and that "
            "`python -m torch.distributed.run --help` works.",
        )


def build_report(checks: List[CheckResult], cuda: bool, duration_s: float) -> Dict[str, Any]:
    """The JSON document of ``validate --json`` (the table is rendered from it too)."""
    return {
        "torchscale": __version__,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(duration_s, 3),
        "backend": "nccl" if cuda else "gloo",
        "summary": summarize(checks),
        "checks": [c.to_dict() for c in checks],
    }
