"""What this node is: versions, devices and the environment that changes distributed behaviour.

Recorded in every experiment's ``manifest.json``, so a result can be traced to the software and
hardware that produced it. Imports torch lazily, and only where asking it can tell something: on a
node with no GPU device at all (no ``/dev/nvidia*``, ``/dev/dxg`` or ``/dev/kfd``) CUDA sees none,
so the device count and the versions are read without it, and a ``torchscale`` process that only
launches CPU ranks never imports torch (~2-3 s of CPU per command and per node).
"""

from __future__ import annotations

import ast
import glob
import importlib.util
import os
import platform
import re
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import psutil

from torchscale.hardware.device_noun import count_text
from torchscale.hardware.nvml import open_nvml, supported
from torchscale.version import __version__

MIG_NAME = re.compile(r"\bMIG\b")
CPU_SLOTS_ENV = "TORCHSCALE_CPU_SLOTS"
"""On a node without GPUs, how many CPU worker processes count as "GPUs" (default: CPU cores)."""

ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "GLOO_", "CUDA_", "OMP_", "MASTER_")
ENV_EXACT = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_JOB_ID", "SLURM_JOB_NODELIST")
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia[0-9]*", "/dev/dxg", "/dev/kfd")
"""What a GPU's driver puts in /dev (NVIDIA; WSL's GPU; ROCm's, which torch.cuda also serves):
CUDA cannot see a device without one of them, in a container too."""


@dataclass(frozen=True)
class NodeDevices:
    """The devices one node offers to DDP ranks."""

    kind: str  # "cuda" or "cpu"
    count: int
    names: List[str]

    @property
    def backend(self) -> str:
        return "nccl" if self.kind == "cuda" else "gloo"

    @property
    def mig_devices(self) -> List[str]:
        """The MIG instances CUDA shows as devices (``NVIDIA A100-SXM4-40GB MIG 3g.20gb``): a
        slice of a GPU each, and NCCL cannot run one job across several."""
        return [name for name in self.names if MIG_NAME.search(name)] if self.kind == "cuda" else []

    def describe(self, n: int) -> str:
        """``4 GPUs`` (with the MIG devices, if any) or ``2 CPU processes``."""
        text = count_text(n, self.kind)
        mig = self.mig_devices
        if mig:
            text += f" (MIG device{'s' if len(mig) > 1 else ''}: {', '.join(unique(mig))})"
        return text


def unique(values: List[str]) -> List[str]:
    return list(dict.fromkeys(values))


def usable_cpus() -> int:
    """The CPUs this process may run on (``taskset``, a cgroup's cpuset, Slurm's binding), not
    the host's: under ``taskset -c 0`` that is one, whatever the host has."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def cpu_slots() -> int:
    """CPU worker processes this node runs side by side: one per usable core unless
    overridden."""
    slots = os.environ.get(CPU_SLOTS_ENV, "")
    return int(slots) if slots.isdigit() and int(slots) > 0 else usable_cpus()


def threads_per_cpu_slot() -> int:
    """Intra-op threads for one CPU rank: the same at every world size, like a GPU's resources,
    so that 1-rank and N-rank cells compare like with like."""
    return max(1, usable_cpus() // cpu_slots())


def gpu_device_files() -> List[str]:
    """This node's GPU device files (:data:`GPU_DEVICE_FILES`); none on a node without GPUs."""
    return [found for pattern in GPU_DEVICE_FILES for found in glob.glob(pattern)]


def _worth_asking_torch() -> bool:
    """Whether to ask torch for GPUs: it is loaded already (asking is free), or this node has a
    GPU device file. Otherwise the answer is known without importing it: none."""
    return "torch" in sys.modules or bool(gpu_device_files())


def _cpu_devices() -> NodeDevices:
    count = cpu_slots()
    return NodeDevices("cpu", count, [platform.processor() or platform.machine()] * count)


def node_devices() -> NodeDevices:
    """GPUs when CUDA sees any, else CPU slots (one gloo process per core unless overridden)."""
    if not _worth_asking_torch():
        return _cpu_devices()
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        count = torch.cuda.device_count()
        return NodeDevices("cuda", count, [torch.cuda.get_device_name(i) for i in range(count)])
    return _cpu_devices()


def probe_devices() -> NodeDevices:
    """What :func:`node_devices` would find, without importing torch (for ``--dry-run``): the
    GPUs NVML sees, cut to ``CUDA_VISIBLE_DEVICES``, else CPU slots."""
    with open_nvml() as nvml:
        handles = nvml.handles() if supported(nvml) else []
        count = len(handles) if supported(handles) else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = min(count, len([d for d in visible.split(",") if d.strip()]))
    if count:
        return NodeDevices("cuda", count, ["GPU"] * count)
    return _cpu_devices()


def distributed_env() -> Dict[str, str]:
    """Environment variables that change how NCCL/gloo/torchrun behave, worth recording."""
    return {
        k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES) or k in ENV_EXACT
    }


def driver_version() -> Optional[str]:
    """The NVIDIA driver version from NVML, or None without a driver."""
    with open_nvml() as nvml:
        if not supported(nvml):
            return None
        version = nvml.driver_version()
        return version if supported(version) else None


def _installed_torch_versions() -> Optional[Dict[str, Optional[str]]]:
    """torch's version and the CUDA it was built for, read from the installed ``torch/version.py``
    (the file ``torch.__version__`` and ``torch.version.cuda`` come from) without importing
    torch; None where that file cannot be read as plain assignments."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    values: Dict[str, object] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and value is not None:
            try:
                values[target.id] = ast.literal_eval(value)
            except ValueError:
                continue
    version, cuda = values.get("__version__"), values.get("cuda")
    if not isinstance(version, str) or not (cuda is None or isinstance(cuda, str)):
        return None
    return {"torch": version, "cuda": cuda}


def torch_versions(devices: NodeDevices) -> Dict[str, object]:
    """torch's, CUDA's, cuDNN's and NCCL's versions. cuDNN and NCCL only with GPUs: CPU processes
    never load them. On a node without GPUs, read without importing torch where it is not loaded."""
    if devices.kind == "cpu" and "torch" not in sys.modules:
        installed = _installed_torch_versions()
        if installed is not None:
            return {**installed, "cudnn": None, "nccl": None}
    import torch

    gpus = devices.kind == "cuda"
    return {
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda,
        "cudnn": (
            torch.backends.cudnn.version() if gpus and torch.backends.cudnn.is_available() else None
        ),
        "nccl": _nccl_version() if gpus else None,
    }


def _nccl_version() -> Optional[str]:
    import torch

    try:
        version = torch.cuda.nccl.version()
    except Exception:  # CPU-only builds have no NCCL
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def collect_environment() -> Dict[str, object]:
    """Everything the manifest records about this node and its software."""
    devices = node_devices()
    gpus = []
    if devices.kind == "cuda":
        import torch

        for i in range(devices.count):
            props = torch.cuda.get_device_properties(i)
            gpus.append(
                {
                    "index": i,
                    "name": props.name,
                    "memory_bytes": props.total_memory,
                    "capability": f"{props.major}.{props.minor}",
                    "multiprocessors": props.multi_processor_count,
                    "mig": props.name in devices.mig_devices,
                }
            )
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torchscale": __version__,
        **torch_versions(devices),
        "driver": driver_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "device_kind": devices.kind,
        "device_count": devices.count,
        "mig_devices": devices.mig_devices,
        "backend": devices.backend,
        "gpus": gpus,
        "env": distributed_env(),
    }
