"""How the GPUs of a node are wired: NVLink ports per GPU and the GPU x GPU matrix of
``nvidia-smi topo -m`` (``NV#``, ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``), read from NVML.

A pair joined by NVLink shows ``NV<n>``. ``n`` counts the active links from one GPU whose far end is
the other GPU; on NVSwitch systems (DGX/HGX A100, H100) the far end of every link is a switch, so a
pair's bonded set is the smaller of the two GPUs' active switch links (18 on H100 SXM, 12 on A100
SXM). Links whose far end NVML cannot name are taken to be switches, as NCCL does. Pairs without
NVLink show the PCIe path from ``nvmlDeviceGetTopologyCommonAncestor``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

from torchscale.hardware.nvml import Nvml, Unsupported, supported, text

# nvmlGpuTopologyLevel_t -> the nvidia-smi topo -m legend.
PCIE_LEVELS: Dict[int, str] = {
    0: "PIX",  # NVML_TOPOLOGY_INTERNAL: same board
    10: "PIX",  # NVML_TOPOLOGY_SINGLE: at most one PCIe bridge
    20: "PXB",  # NVML_TOPOLOGY_MULTIPLE: several bridges, no host bridge
    30: "PHB",  # NVML_TOPOLOGY_HOSTBRIDGE: through a PCIe host bridge (the CPU)
    40: "NODE",  # NVML_TOPOLOGY_NODE: between host bridges of one NUMA node
    50: "SYS",  # NVML_TOPOLOGY_SYSTEM: across the inter-socket link (QPI/UPI/xGMI)
}
LEGEND = {
    "X": "self",
    "NV#": "a bonded set of # NVLinks",
    "PIX": "at most one PCIe bridge",
    "PXB": "several PCIe bridges, no host bridge",
    "PHB": "a PCIe host bridge (the CPU)",
    "NODE": "PCIe host bridges within one NUMA node",
    "SYS": "the inter-socket link between NUMA nodes (QPI/UPI/xGMI)",
}
NVLINK_DEVICE_TYPE_GPU = 0
NVLINK_DEVICE_TYPE_SWITCH = 2
DEFAULT_MAX_LINKS = 18  # pynvml releases before NVLink 5 do not define NVML_NVLINK_MAX_LINKS


@dataclass(frozen=True)
class NvLinkPort:
    """One NVLink of a GPU: whether it is up and what sits at the other end."""

    link: int
    active: bool
    remote_bus_id: Optional[str]
    remote_is_gpu: Optional[bool]  # None when NVML does not say


def normalize_bus_id(bus_id: str) -> str:
    """``0000:18:00.0`` and ``00000000:18:00.0`` name the same device: compare the 8-digit form."""
    bus_id = text(bus_id).strip().upper()
    domain, _, rest = bus_id.partition(":")
    return f"{int(domain, 16):08X}:{rest}" if rest else bus_id


def bus_id(nvml: Nvml, handle: Any) -> Optional[str]:
    info = nvml.call("nvmlDeviceGetPciInfo", handle)
    return normalize_bus_id(info.busId) if supported(info) else None


def nvlink_ports(nvml: Nvml, handle: Any) -> Union[List[NvLinkPort], Unsupported]:
    """Every NVLink the GPU has; :class:`Unsupported` when NVML reports none (PCIe-only GPU)."""
    ports: List[NvLinkPort] = []
    first_answer: Optional[Unsupported] = None
    for link in range(nvml.const("NVML_NVLINK_MAX_LINKS", DEFAULT_MAX_LINKS)):
        state = nvml.call("nvmlDeviceGetNvLinkState", handle, link)
        if not supported(state):
            # Link numbers past the GPU's last link answer NotSupported / InvalidArgument.
            first_answer = first_answer or state
            continue
        remote = nvml.call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        kind = nvml.call("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        ports.append(
            NvLinkPort(
                link=link,
                active=bool(state),
                remote_bus_id=normalize_bus_id(remote.busId) if supported(remote) else None,
                remote_is_gpu=(int(kind) == NVLINK_DEVICE_TYPE_GPU) if supported(kind) else None,
            )
        )
    if not ports:
        return first_answer or Unsupported("no NVLink reported")
    return ports


def _links_to(ports: Sequence[NvLinkPort], target_bus_id: Optional[str]) -> int:
    return sum(1 for p in ports if p.active and target_bus_id and p.remote_bus_id == target_bus_id)


def _switch_links(ports: Sequence[NvLinkPort], gpu_bus_ids: Sequence[Optional[str]]) -> int:
    """Active links whose far end is not one of the node's GPUs (an NVSwitch, seen or not)."""
    return sum(
        1
        for p in ports
        if p.active and p.remote_is_gpu is not True and p.remote_bus_id not in gpu_bus_ids
    )


def topology_matrix(
    nvml: Nvml,
    handles: Sequence[Any],
    bus_ids: Sequence[Optional[str]],
    ports: Sequence[Union[List[NvLinkPort], Unsupported]],
) -> List[List[str]]:
    """The GPU x GPU matrix as ``nvidia-smi topo -m`` prints it; ``?`` where NVML cannot tell."""
    links = [p if supported(p) else [] for p in ports]
    switch = [_switch_links(p, bus_ids) for p in links]
    n = len(handles)
    matrix = [["X"] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            nv = _links_to(links[i], bus_ids[j]) + min(switch[i], switch[j])
            if nv:
                matrix[i][j] = f"NV{nv}"
                continue
            level = nvml.call("nvmlDeviceGetTopologyCommonAncestor", handles[i], handles[j])
            matrix[i][j] = PCIE_LEVELS.get(int(level), "?") if supported(level) else "?"
    return matrix


def format_matrix(matrix: Sequence[Sequence[str]]) -> str:
    """Plain-text rendering with GPU row and column labels, like ``nvidia-smi topo -m``."""
    labels = [f"GPU{i}" for i in range(len(matrix))]
    width = max([len(label) for label in labels] + [len(c) for row in matrix for c in row]) + 2
    lines = ["".ljust(width) + "".join(label.ljust(width) for label in labels)]
    for label, row in zip(labels, matrix):
        lines.append(label.ljust(width) + "".join(cell.ljust(width) for cell in row))
    return "\n".join(line.rstrip() for line in lines)
