"""Interconnect checks: NVLink links up per GPU, and the GPU x GPU topology matrix."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Union

from torchscale.hardware.nvml import Nvml, Unsupported, supported
from torchscale.hardware.topology import (
    LEGEND,
    NvLinkPort,
    bus_id,
    nvlink_ports,
    topology_matrix,
)
from torchscale.validate.result import CheckResult, fail, gpu_list, join, passed, skip, warn

NVLINK_FIX = (
    "Inspect with `nvidia-smi nvlink -s` (and `nvidia-smi nvlink -e` for error counters); on "
    "NVSwitch systems (DGX/HGX A100, H100) check the fabric manager "
    "(`systemctl status nvidia-fabricmanager`); reset the GPUs or reboot, then reseat or RMA the "
    "GPU/baseboard if the link stays down."
)


@dataclass(frozen=True)
class Interconnect:
    """NVLink ports of every GPU and the topology matrix built from them."""

    ports: List[Union[List[NvLinkPort], Unsupported]]
    matrix: List[List[str]]
    refused: List[int] = field(default_factory=list)  # GPUs whose handle NVML refused


def read_interconnect(nvml: Nvml, handles: Sequence[Any]) -> Interconnect:
    bus_ids: List[Optional[str]] = [bus_id(nvml, h) for h in handles]
    ports = [nvlink_ports(nvml, h) for h in handles]
    refused = [i for i, h in enumerate(handles) if not supported(h)]
    return Interconnect(ports, topology_matrix(nvml, handles, bus_ids, ports), refused)


def check_nvlink(net: Interconnect) -> CheckResult:
    """Each GPU against its peers: fewer active links than the others is the fault. NVLink-capable
    PCIe cards without a bridge report every port inactive: that is "not connected", not down."""
    name = "NVLink"
    with_links = {i: p for i, p in enumerate(net.ports) if supported(p)}
    if not with_links:
        reason = net.ports[0] if net.ports else "no GPU"
        return skip(
            name,
            f"no NVLink reported ({reason})",
            "Nothing to fix on PCIe-only GPUs; on NVLink GPUs check `nvidia-smi nvlink -s`.",
        )
    active = {i: sum(p.active for p in ports) for i, ports in with_links.items()}
    if not any(active.values()):
        ports_per_gpu = max(len(p) for p in with_links.values())
        return skip(
            name,
            f"not connected: {ports_per_gpu} NVLink ports per GPU, none active (no NVLink bridge)",
            "Nothing to fix unless these cards should have an NVLink bridge: then check that it "
            "is seated (`nvidia-smi nvlink -s`); without one GPUs talk over PCIe.",
        )
    expected = max(active.values())
    problems, per_gpu = [], {}
    for i, ports in enumerate(net.ports):
        if i in net.refused:
            continue  # NVML refused this GPU: the GPUs check says why
        if not supported(ports):
            problems.append(f"GPU {i}: no NVLink reported (peers have {expected})")
            per_gpu[str(i)] = {"up": 0, "links": 0, "down": []}
            continue
        down = [p.link for p in ports if not p.active]
        up = len(ports) - len(down)
        per_gpu[str(i)] = {"up": up, "links": len(ports), "down": down}
        if up < expected:
            detail = f" (link {', '.join(map(str, down))} down)" if down else ""
            problems.append(f"GPU {i}: {up}/{expected} links up{detail}")
    if problems:
        return fail(name, join(problems), NVLINK_FIX, per_gpu=per_gpu)
    checked = [i for i in range(len(net.ports)) if i not in net.refused]
    return passed(
        name,
        f"{expected}/{expected} links up on {gpu_list(checked, len(net.ports))}",
        per_gpu=per_gpu,
    )


def check_topology(net: Interconnect) -> CheckResult:
    """Summarise the matrix; it is printed in full below the table and kept in the JSON."""
    name = "GPU topology"
    n = len(net.matrix)
    details = {"matrix": net.matrix, "legend": LEGEND}
    if n < 2:
        return skip(
            name, "one GPU: no GPU pairs", "Nothing to fix: topology needs 2+ GPUs.", **details
        )
    readable = [i for i in range(n) if i not in net.refused]  # NVML refused: the GPUs row says
    pairs = [net.matrix[i][j] for i in readable for j in readable if j > i]
    kinds = sorted(set(pairs), key=pairs.index)
    shown = "pairs: " + ", ".join(f"{k} x{pairs.count(k)}" for k in kinds)
    if "?" in kinds:
        return skip(
            name,
            shown,
            "NVML could not tell how some GPUs connect; compare with `nvidia-smi topo -m`.",
            **details,
        )
    nvlink = any(k.startswith("NV") for k in kinds)
    if not nvlink and "SYS" in kinds:
        return warn(
            name,
            shown + " (no NVLink; some pairs cross CPU sockets)",
            "GPU-to-GPU traffic crosses the inter-socket link: prefer GPUs on one NUMA node "
            "(CUDA_VISIBLE_DEVICES) for small jobs; see `nvidia-smi topo -m`.",
            **details,
        )
    return passed(name, shown, **details)
