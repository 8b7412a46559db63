"""GPU health checks from NVML: inventory, persistence mode, ECC and retired memory. Each check
looks at every GPU and reports the worst one (clocks, temperature, power, PCIe: ``performance``).

Every NVML answer may be :class:`~torchscale.hardware.nvml.Unsupported`: a check whose query no GPU
answers is SKIP (with the ``nvidia-smi`` command to look by hand), never a crash.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from torchscale.hardware.nvml import GPU_IS_LOST, NO_PERMISSION, Nvml, supported, text
from torchscale.validate.result import (
    CheckResult,
    fail,
    gib,
    gpu_list,
    join,
    passed,
    skip,
    unique,
    warn,
)
from torchscale.validate.software import NO_GPU_FIX

NO_GPU = "no GPU"
RETIRED_PAGES_RMA = 60  # NVIDIA's RMA guidance for dynamic page retirement (pre-Ampere GPUs)


def answers(nvml: Nvml, handles: Sequence[Any], function: str, *args: Any) -> List[Any]:
    return [nvml.call(function, handle, *args) for handle in handles]


def not_reported(name: str, answers: Sequence[Any], manual: str) -> Optional[CheckResult]:
    """SKIP when no GPU answered the query."""
    if answers and not any(supported(a) for a in answers):
        return skip(
            name,
            f"not reported by NVML ({answers[0]})",
            f"NVML cannot read this on these GPUs or this driver; check by hand: `{manual}`.",
        )
    return None


def no_gpu_check(name: str) -> CheckResult:
    return skip(name, NO_GPU, NO_GPU_FIX)


def check_gpus(nvml: Optional[Nvml], handles: Sequence[Any], torch_count: int) -> CheckResult:
    name = "GPUs"
    if not handles:
        if torch_count:
            return passed(name, f"{torch_count} CUDA devices (NVML unavailable)", count=torch_count)
        return warn(
            name,
            "none found — CPU (gloo) benchmarking only",
            "To benchmark GPUs run on a node with NVIDIA GPUs and the driver installed (check "
            "`nvidia-smi`); on this node `torchscale benchmark` runs gloo CPU processes.",
            count=0,
        )
    assert nvml is not None
    names = answers(nvml, handles, "nvmlDeviceGetName")
    memory = answers(nvml, handles, "nvmlDeviceGetMemoryInfo")
    gpus = [
        {
            "index": i,
            "name": text(n) if supported(n) else None,
            "memory_bytes": int(m.total) if supported(m) else None,
        }
        for i, (n, m) in enumerate(zip(names, memory))
    ]
    # A GPU NVML refuses (its handle, or its name) is judged on its own; the others still count.
    lost = [i for i, a in enumerate(names) if getattr(a, "error", "") == GPU_IS_LOST]
    barred = [i for i, a in enumerate(names) if getattr(a, "error", "") == NO_PERMISSION]
    kinds = [(g["name"], g["memory_bytes"]) for g in gpus if g["index"] not in lost + barred]
    models = unique(kinds)
    shown = ", ".join(
        f"{kinds.count(model)} x {model[0] or 'GPU (name not reported by NVML)'}"
        + (f" ({gib(model[1])})" if model[1] else "")
        for model in models
    )
    if barred:
        shown = shown or "no GPU this process may use"
        shown += (
            f"; {gpu_list(barred, len(handles))} not accessible to this process (NVML: "
            f"{names[barred[0]]}; another job's GPU under Slurm/cgroups?)"
        )
    if torch_count and torch_count != len(handles) - len(barred):
        shown += f"; torch sees {torch_count} (CUDA_VISIBLE_DEVICES)"
    if lost:
        return fail(
            name,
            f"{gpu_list(lost, len(handles))} fell off the bus; {shown}",
            "Drain the node; look for Xid 79 in `dmesg`; reboot, and RMA the GPU if it repeats.",
            count=len(handles),
            gpus=gpus,
        )
    if len(models) > 1:
        return warn(
            name,
            shown,
            "Mixed GPU models: DDP runs at the pace of the slowest; pick identical GPUs with "
            "CUDA_VISIBLE_DEVICES.",
            count=len(handles),
            gpus=gpus,
        )
    return passed(name, shown, count=len(handles), gpus=gpus)


MIG_FIX = (
    "DDP needs whole GPUs: NCCL cannot run one job across MIG instances and CUDA gives a "
    "process one of them. Disable MIG with `sudo nvidia-smi -i <gpu> -mig 0` and reset the GPU, "
    "or benchmark a single MIG instance (--gpus 1)."
)


def check_mig(nvml: Nvml, handles: Sequence[Any]) -> CheckResult:
    """MIG mode: a GPU split into MIG devices is not a GPU DDP can use whole."""
    name = "MIG mode"
    devices = [nvml.mig_devices(h) for h in handles]
    unknown = not_reported(name, devices, "nvidia-smi -q | grep -i -A2 'MIG Mode'")
    if unknown:
        return unknown
    on = {i: d for i, d in enumerate(devices) if supported(d) and d is not None}
    if not on:
        readable = [i for i, d in enumerate(devices) if supported(d)]
        return passed(name, f"off on {gpu_list(readable, len(handles))}")
    shown = join(
        f"GPU {i}: MIG on, {len(d)} MIG device(s)"
        + (": " + ", ".join(f"{d.count(n)} x {n}" for n in unique(d)) if d else "")
        for i, d in on.items()
    )
    return warn(name, shown, MIG_FIX, mig={str(i): d for i, d in on.items()})


def check_persistence(nvml: Nvml, handles: Sequence[Any]) -> CheckResult:
    name = "Persistence mode"
    modes = answers(nvml, handles, "nvmlDeviceGetPersistenceMode")
    unknown = not_reported(name, modes, "nvidia-smi -q | grep -i persistence")
    if unknown:
        return unknown
    off = [i for i, m in enumerate(modes) if supported(m) and int(m) == 0]
    if off:
        return warn(
            name,
            f"off on {gpu_list(off, len(handles))}",
            "Enable it: `sudo nvidia-smi -pm 1` (or run the nvidia-persistenced service); without "
            "it the driver re-initialises each GPU at every job start.",
        )
    return passed(name, f"on for {gpu_list(range(len(handles)), len(handles))}")


def check_ecc(nvml: Nvml, handles: Sequence[Any]) -> CheckResult:
    name = "ECC"
    modes = answers(nvml, handles, "nvmlDeviceGetEccMode")
    uncorrected = answers(
        nvml,
        handles,
        "nvmlDeviceGetTotalEccErrors",
        nvml.const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
        nvml.const("NVML_VOLATILE_ECC", 0),
    )
    unknown = not_reported(name, modes, "nvidia-smi -q -d ECC")
    if unknown:
        return unknown
    errors = {i: int(n) for i, n in enumerate(uncorrected) if supported(n) and int(n) > 0}
    if errors:
        shown = ", ".join(f"GPU {i}: {n}" for i, n in errors.items())
        return fail(
            name,
            f"volatile uncorrectable ECC errors ({shown})",
            "Drain the node and inspect with `nvidia-smi -q -d ECC`; reset the GPU "
            "(`nvidia-smi -r`) or reboot; RMA the GPU if the errors persist.",
            uncorrectable_volatile=errors,
        )
    disabled = [i for i, m in enumerate(modes) if supported(m) and int(m[0]) == 0]
    pending = [i for i, m in enumerate(modes) if supported(m) and int(m[0]) != int(m[1])]
    if disabled or pending:
        return warn(
            name,
            join(
                [
                    f"disabled on {gpu_list(disabled, len(handles))}" if disabled else "",
                    f"mode change pending on {gpu_list(pending, len(handles))}" if pending else "",
                ]
            ),
            "Enable ECC with `sudo nvidia-smi -e 1` and reboot (or reset the GPUs) to apply it; "
            "check with `nvidia-smi -q -d ECC`.",
        )
    return passed(name, f"enabled, 0 volatile uncorrectable errors on {len(handles)} GPUs")


def check_retired_memory(nvml: Nvml, handles: Sequence[Any]) -> CheckResult:
    """Row remapping (A100 and later) or dynamic page retirement (earlier GPUs)."""
    name = "Retired pages / remapped rows"
    findings: List[str] = []
    status_fail, status_warn, reported = [], [], 0
    for i, handle in enumerate(handles):
        rows = nvml.call("nvmlDeviceGetRemappedRows", handle)
        if supported(rows):
            reported += 1
            _correctable, uncorrectable, pending, failed = (int(v) for v in rows)
            if failed:
                status_fail.append(i)
                findings.append(f"GPU {i}: row remapping failed")
            elif pending:
                status_fail.append(i)
                findings.append(f"GPU {i}: row remap pending ({uncorrectable} uncorrectable)")
            continue
        pending_pages = nvml.call("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        single = nvml.call("nvmlDeviceGetRetiredPages", handle, 0)  # multiple single-bit errors
        double = nvml.call("nvmlDeviceGetRetiredPages", handle, 1)  # double-bit error
        if not (supported(pending_pages) or supported(single) or supported(double)):
            continue
        reported += 1
        n_single = len(single) if supported(single) else 0
        n_double = len(double) if supported(double) else 0
        if supported(pending_pages) and int(pending_pages):
            status_fail.append(i)
            findings.append(f"GPU {i}: page retirement pending ({n_single + n_double} retired)")
        elif n_single + n_double >= RETIRED_PAGES_RMA:
            status_fail.append(i)
            findings.append(f"GPU {i}: {n_single + n_double} retired pages")
        elif n_double:
            status_warn.append(i)
            findings.append(f"GPU {i}: {n_double} pages retired for double-bit errors")
    if not reported:
        return skip(
            name,
            "not reported by NVML",
            "NVML cannot read this on these GPUs; check by hand: "
            "`nvidia-smi -q -d ROW_REMAPPER,PAGE_RETIREMENT`.",
        )
    if status_fail:
        return fail(
            name,
            join(findings),
            "Drain the node; reset the GPU (`nvidia-smi -r`) or reboot so pending rows/pages are "
            "retired; check `nvidia-smi -q -d ROW_REMAPPER,PAGE_RETIREMENT`; RMA if remapping "
            "failed or retirements keep growing.",
        )
    if status_warn:
        return warn(
            name,
            join(findings),
            "Watch the count with `nvidia-smi -q -d PAGE_RETIREMENT`; RMA at "
            f"{RETIRED_PAGES_RMA} retired pages.",
        )
    return passed(name, f"none pending on {reported} GPUs")
