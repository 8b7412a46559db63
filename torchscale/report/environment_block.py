"""The environment block of a report: versions, GPUs, topology and variables from the manifest."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from torchscale.analysis.report_data import Experiment
from torchscale.report import formatting as fmt

ENVIRONMENT_KEYS = [
    ("host", "Host"),
    ("platform", "Platform"),
    ("python", "Python"),
    ("torch", "PyTorch"),
    ("cuda", "CUDA"),
    ("cudnn", "cuDNN"),
    ("nccl", "NCCL"),
    ("driver", "Driver"),
    ("backend", "Backend"),
    ("device_kind", "Devices"),
    ("device_count", "Device count"),
    ("cpu", "CPU"),
    ("cpu_count", "CPU cores"),
    ("memory_bytes", "Memory"),
    ("torchscale", "torchscale"),
]


@dataclass
class EnvironmentBlock:
    name: str
    facts: List[Tuple[str, str]]
    gpus: List[str]
    env_vars: List[Tuple[str, str]]
    topology: str


def cudnn_version(value: Any) -> str:
    """cuDNN's version number as ``torch.backends.cudnn.version()`` gives it, as a version:
    cuDNN 9 encodes major*10000 + minor*100 + patch (91002 -> 9.10.2), older releases
    major*1000 + minor*100 + patch (8902 -> 8.9.2)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return str(value)
    major = value // 10000 if value >= 90000 else value // 1000
    minor = (value % 10000 if value >= 90000 else value % 1000) // 100
    return f"{major}.{minor}.{value % 100}"


def _no_gpus(env: Dict[str, object]) -> bool:
    return env.get("device_kind") == "cpu" or (
        env.get("device_kind") is None and env.get("gpus") == [] and not env.get("driver")
    )


def _fact(key: str, value: Any, env: Dict[str, object]) -> str:
    if key == "memory_bytes":
        return fmt.human_bytes(value)
    if key == "cudnn":
        return cudnn_version(value)
    if key == "cuda" and _no_gpus(env):
        return "not available"  # the PyTorch row says which CUDA the build was for
    return str(value)


def environment_block(experiment: Experiment) -> EnvironmentBlock:
    env = experiment.manifest.get("environment") or {}
    facts = []
    for key, label in ENVIRONMENT_KEYS:
        value = env.get(key)
        if value is None or value == "":
            if key == "cuda" and _no_gpus(env) and env:
                facts.append((label, "not available"))
            continue
        facts.append((label, _fact(key, value, env)))
    known = {k for k, _ in ENVIRONMENT_KEYS} | {"gpus", "env", "topology"}
    facts += [
        (k, str(v)) for k, v in env.items() if k not in known and isinstance(v, (str, int, float))
    ]
    gpus = gpu_lines([g for g in env.get("gpus") or [] if isinstance(g, dict)])
    topology = topology_text(env.get("topology"))
    env_vars = sorted((str(k), str(v)) for k, v in (env.get("env") or {}).items())
    return EnvironmentBlock(experiment.name, facts, gpus, env_vars, topology or "")


def gpu_lines(gpus: List[Dict[str, object]]) -> List[str]:
    """Identical GPUs on one line: ``GPU 0-7: NVIDIA H100 80GB HBM3, 79.6 GiB``."""
    groups: Dict[str, List[Any]] = {}
    for index, gpu in enumerate(gpus):
        memory = f", {fmt.human_bytes(gpu['memory_bytes'])}" if gpu.get("memory_bytes") else ""
        groups.setdefault(f"{gpu.get('name', '?')}{memory}", []).append(gpu.get("index", index))
    lines = []
    for name, indices in groups.items():
        ids = sorted(indices, key=str)
        contiguous = all(isinstance(i, int) for i in ids) and ids == list(
            range(ids[0], ids[-1] + 1)
        )
        label = (
            f"GPU {ids[0]}–{ids[-1]}"
            if len(ids) > 1 and contiguous
            else ("GPU " + ", ".join(map(str, ids)))
        )
        lines.append(f"{label}: {name}" + (f" ({len(ids)} GPUs)" if len(ids) > 1 else ""))
    return lines


def topology_text(topology: Any) -> str:
    """A GPU x GPU link matrix as ``nvidia-smi topo -m`` prints it; other shapes as JSON."""
    if topology is None or isinstance(topology, str):
        return topology or ""
    rows = topology.items() if isinstance(topology, dict) else []
    if rows and all(isinstance(links, list) for _, links in rows):
        names = [str(name) for name, _ in rows]
        width = max(len(str(cell)) for _, links in rows for cell in [*links, *names]) + 2
        lines = [" " * width + "".join(n.ljust(width) for n in names)]
        lines += [
            str(name).ljust(width) + "".join(str(c).ljust(width) for c in links)
            for name, links in rows
        ]
        return "\n".join(line.rstrip() for line in lines)
    return json.dumps(topology, indent=1)
