"""Level 2's node facts outside the GPU's own answers: XID errors in the kernel log since boot,
the CPU frequency governor, and InfiniBand / RoCE port state and rate (hardware/kernel_log.py and
hardware/node_sysfs.py read them; here they are judged)."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from torchscale.hardware.kernel_log import CATALOG, KernelLog, XidEvent
from torchscale.hardware.node_sysfs import IbPort
from torchscale.hardware.topology import normalize_bus_id
from torchscale.validate.result import CheckResult, fail, join, passed, skip, unique, warn

XID_NAME = "XID errors (kernel log)"
GOVERNOR_NAME = "CPU frequency governor"
IB_NAME = "InfiniBand / RoCE ports"


def _gpu_of(event: XidEvent, bus_ids: Sequence[Optional[str]]) -> str:
    """``GPU 3`` when the bus id is one of NVML's GPUs, else the bus id the driver printed."""
    wanted = normalize_bus_id(event.bus_id)
    for index, bus in enumerate(bus_ids):
        if bus and bus.startswith(wanted):
            return f"GPU {index}"
    return f"PCI {event.bus_id}"


def check_xid(
    log: KernelLog, events: List[XidEvent], bus_ids: Sequence[Optional[str]]
) -> CheckResult:
    """Every XID since boot: FAIL on a code whose fix is a GPU reset, a reboot or the vendor;
    WARN when every one is ascribed to an application."""
    if log.lines is None:
        return skip(
            XID_NAME,
            f"kernel log not readable ({log.error})",
            "Run validate as root, or allow it with `sudo sysctl kernel.dmesg_restrict=0`; "
            "check by hand: `sudo dmesg | grep -i xid`.",
        )
    if not events:
        return passed(XID_NAME, f"none since boot ({log.source})")
    counts: Dict[str, int] = {}
    for event in events:
        key = f"{_gpu_of(event, bus_ids)}: Xid {event.code} ({event.meaning})"
        counts[key] = counts.get(key, 0) + 1
    shown = join(f"{key}" + (f" x{n}" if n > 1 else "") for key, n in counts.items())
    details = {
        "events": [
            {"gpu": _gpu_of(e, bus_ids), "bus_id": e.bus_id, "code": e.code, "text": e.text[:200]}
            for e in events[-50:]
        ]
    }
    hardware = [e for e in events if e.hardware]
    if hardware:
        codes = ", ".join(str(c) for c in unique(e.code for e in hardware))
        return fail(
            XID_NAME,
            shown,
            f"Xid {codes} call for a GPU reset, a reboot or the vendor ({CATALOG}): drain the "
            "node, `nvidia-smi -r` the GPU or reboot, run `dcgmi diag -r 3`, and RMA the GPU if "
            "the code returns.",
            **details,
        )
    return warn(
        XID_NAME,
        shown,
        "These codes usually come from an application (an illegal address, a killed job): "
        "check the job that ran then; if they repeat without one, run `dcgmi diag -r 2`.",
        **details,
    )


def check_governor(governors: Dict[int, str]) -> CheckResult:
    """The scaling governor of every CPU: anything but ``performance`` lets clocks drop."""
    if not governors:
        return skip(
            GOVERNOR_NAME,
            "not exposed (no cpufreq in this VM or container)",
            "Nothing to set here; on bare metal check `cpupower frequency-info`.",
        )
    kinds = unique(governors.values())
    shown = ", ".join(
        f"{sum(1 for g in governors.values() if g == kind)} CPUs {kind}" for kind in kinds
    )
    if kinds != ["performance"]:
        return warn(
            GOVERNOR_NAME,
            shown,
            "Set the performance governor: `sudo cpupower frequency-set -g performance` (and "
            "in the BIOS power profile); other governors lower the clocks that launch kernels "
            "and feed the GPUs.",
            governors=dict(sorted({str(k): v for k, v in governors.items()}.items())),
        )
    return passed(GOVERNOR_NAME, shown)


def check_ib_ports(ports: List[IbPort]) -> CheckResult:
    """Every port ACTIVE and at the best rate of its peers (same link layer)."""
    if not ports:
        return skip(
            IB_NAME,
            "no InfiniBand or RoCE device (/sys/class/infiniband is empty)",
            "Nothing to check on a node without RDMA NICs; multi-node NCCL then runs over TCP "
            "sockets.",
        )
    down = [p for p in ports if not p.active]
    slow: List[str] = []
    for layer in unique(p.link_layer for p in ports):
        speeds = [p.rate_gbps for p in ports if p.link_layer == layer and p.active and p.rate_gbps]
        best = max(speeds) if speeds else None
        for port in ports:
            if port.link_layer == layer and port.active and best and (port.rate_gbps or 0) < best:
                slow.append(f"{port.name}: {port.rate_text} (others {best:g} Gb/sec)")
    rates = unique(p.rate_text for p in ports if p.active)
    summary = f"{len(ports) - len(down)} of {len(ports)} ports ACTIVE" + (
        f" at {', '.join(rates)}" if rates else ""
    )
    details = {
        "ports": [
            {
                "port": p.name,
                "state": p.state,
                "phys_state": p.phys_state,
                "rate": p.rate_text,
                "link_layer": p.link_layer,
            }
            for p in ports
        ]
    }
    if down:
        shown = join(f"{p.name} {p.state} ({p.phys_state})" for p in down)
        # A rail down among active ones is a broken node; none active may be no cabling at all.
        status = fail if len(down) < len(ports) else warn
        return status(
            IB_NAME,
            f"{shown}; {summary}",
            "A port that is not ACTIVE carries no NCCL traffic: check the cable and switch port "
            "(`ibstat`, `ibstatus`), that the subnet manager runs (`sminfo`), and for RoCE the "
            "Ethernet link (`ip link`). Ports unused on purpose can be disabled in the NIC.",
            **details,
        )
    if slow:
        return warn(
            IB_NAME,
            join(slow),
            "A port trained below its peers' rate: reseat or replace the cable or transceiver, "
            "check the switch port's speed (`ibstat`, `mlxlink -d <dev> -p <port>`).",
            **details,
        )
    return passed(IB_NAME, summary, **details)
