"""Software checks: Python, PyTorch, CUDA (and the driver's CUDA), the NVIDIA driver, NCCL, nsys."""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import dataclass
from typing import Optional, Tuple, Union

from torchscale.hardware.nvml import Unsupported, supported
from torchscale.validate.result import CheckResult, fail, passed, skip, warn

MIN_PYTHON = (3, 9)
MIN_TORCH = (2, 0)
CUDA_WHEELS = "https://download.pytorch.org/whl/"
NO_GPU_FIX = "Needs an NVIDIA GPU: nothing to fix on a CPU-only node."


@dataclass(frozen=True)
class TorchFacts:
    """What the installed PyTorch says about itself and the GPUs it can use."""

    version: Optional[str]
    cuda_build: Optional[str]  # torch.version.cuda: None for CPU-only builds
    cuda_available: bool
    device_count: int
    nccl: Optional[str]
    error: Optional[str] = None


def torch_facts() -> TorchFacts:
    """Import torch (seconds) and ask it; an import failure is recorded, not raised."""
    try:
        import torch
        import torch.distributed as dist
    except Exception as exc:  # broken install, missing CUDA libraries...
        return TorchFacts(None, None, False, 0, None, f"{type(exc).__name__}: {exc}")
    available = bool(torch.cuda.is_available())
    nccl = None
    if dist.is_available() and dist.is_nccl_available():
        try:
            version = torch.cuda.nccl.version()
            nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except Exception:  # the NCCL library failed to load
            nccl = None
    return TorchFacts(
        version=str(torch.__version__),
        cuda_build=torch.version.cuda,
        cuda_available=available,
        device_count=torch.cuda.device_count() if available else 0,
        nccl=nccl,
    )


def _major_minor(version: str) -> Tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def check_python(version: Tuple[int, ...] = tuple(sys.version_info[:3])) -> CheckResult:
    shown = ".".join(map(str, version))
    if tuple(version[:2]) < MIN_PYTHON:
        return fail("Python", shown, "torchscale needs Python >= 3.9: install a newer Python.")
    return passed("Python", shown)


def check_torch(facts: TorchFacts) -> CheckResult:
    if facts.version is None:
        return fail(
            "PyTorch",
            f"cannot import torch ({facts.error})",
            'Install PyTorch >= 2.0: `pip install "torch>=2.0"` (CUDA builds: see pytorch.org).',
        )
    build = f"CUDA {facts.cuda_build} build" if facts.cuda_build else "CPU-only build"
    if _major_minor(facts.version) < MIN_TORCH:
        return fail(
            "PyTorch",
            f"{facts.version} ({build}): older than 2.0",
            'Upgrade PyTorch: `pip install -U "torch>=2.0"`.',
        )
    return passed("PyTorch", f"{facts.version} ({build})")


def check_cuda(facts: TorchFacts, nvml_gpus: int) -> CheckResult:
    name = "CUDA"
    if facts.version is None:
        return skip(name, "unknown: torch does not import", "Fix the PyTorch check first.")
    if facts.cuda_available:
        return passed(
            name, f"available: {facts.device_count} devices, torch CUDA {facts.cuda_build}"
        )
    if nvml_gpus == 0:
        return skip(
            name, f"not available: no NVIDIA GPU (torch CUDA {facts.cuda_build})", NO_GPU_FIX
        )
    if facts.cuda_build is None:
        return fail(
            name,
            f"PyTorch is a CPU-only build but NVML sees {nvml_gpus} GPUs",
            f"Install a CUDA build of PyTorch: `pip install torch --index-url {CUDA_WHEELS}cu124` "
            "(pick the cuXY matching your driver).",
        )
    return fail(
        name,
        f"torch cannot use the {nvml_gpus} GPUs NVML sees",
        "Check CUDA_VISIBLE_DEVICES and the 'CUDA driver compatibility' row; "
        "`python -c 'import torch; torch.cuda.init()'` prints the underlying error.",
    )


def check_cuda_driver(
    torch_cuda: Optional[str], driver_cuda: Union[int, Unsupported], gpus: int
) -> CheckResult:
    """torch's CUDA version against the newest CUDA the driver supports (nvidia-smi's header)."""
    name = "CUDA driver compatibility"
    if gpus == 0:
        return skip(name, f"no GPU (torch CUDA {torch_cuda or 'none: CPU-only build'})", NO_GPU_FIX)
    if torch_cuda is None:
        return skip(name, "CPU-only PyTorch build: no CUDA", "See the CUDA row.")
    if not supported(driver_cuda):
        return skip(
            name,
            f"torch CUDA {torch_cuda}; driver CUDA version unknown ({driver_cuda})",
            "Compare with the 'CUDA Version' in the `nvidia-smi` header by hand.",
        )
    driver = (int(driver_cuda) // 1000, (int(driver_cuda) % 1000) // 10)
    needed = _major_minor(torch_cuda)
    shown = f"torch CUDA {torch_cuda}, driver supports up to CUDA {driver[0]}.{driver[1]}"
    if driver[0] < needed[0]:
        return fail(
            name,
            shown,
            f"Upgrade the NVIDIA driver to one supporting CUDA {torch_cuda}, or install a PyTorch "
            f"wheel built for CUDA {driver[0]}.x "
            "(https://pytorch.org/get-started/previous-versions/).",
        )
    if driver < needed:
        return warn(
            name,
            shown + " (minor-version compatibility)",
            f"Runs through CUDA minor-version compatibility, but kernels JIT-compiled from PTX "
            f"fail; upgrade the driver to one supporting CUDA {torch_cuda}.",
        )
    return passed(name, shown)


def check_driver(driver: Union[str, Unsupported]) -> CheckResult:
    name = "NVIDIA driver"
    if not supported(driver):
        return skip(
            name,
            f"unknown (NVML: {driver})",
            "GPU nodes need the NVIDIA datacenter driver: check `nvidia-smi`; in containers run "
            "with the NVIDIA Container Toolkit (`docker run --gpus all`).",
        )
    return passed(name, str(driver))


def check_nccl(facts: TorchFacts, gpus: int) -> CheckResult:
    name = "NCCL"
    if facts.version is None:
        return skip(name, "unknown: torch does not import", "Fix the PyTorch check first.")
    if facts.nccl:
        note = "" if gpus else " (not used here: no GPU, gloo runs the collectives)"
        return passed(name, f"{facts.nccl}{note}")
    if gpus:
        return fail(
            name,
            "this PyTorch build has no NCCL",
            "Install a CUDA build of PyTorch from pytorch.org; it bundles NCCL.",
        )
    return skip(name, "not in this PyTorch build; gloo runs the collectives", NO_GPU_FIX)


def check_nsys(path: Optional[str] = None) -> CheckResult:
    found = path if path is not None else shutil.which("nsys")
    if found:
        return passed("Nsight Systems (nsys)", found)
    return warn(
        "Nsight Systems (nsys)",
        "not on PATH (optional)",
        "Only `torchscale profile --tool nsys` needs it: install the Nsight Systems CLI "
        "(https://developer.nvidia.com/nsight-systems, or apt `nsight-systems-cli` from NVIDIA's "
        "CUDA repository) and put `nsys` on PATH; torch.profiler traces work without it.",
    )
