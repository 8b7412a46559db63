"""Node facts from sysfs: the CPU frequency governor, and InfiniBand / RoCE ports.

Both readers take the sysfs root as an argument, so tests read trees in the kernel's own format
(``tests/data/sysfs``). Formats (Linux ``Documentation/ABI``):

* ``/sys/devices/system/cpu/cpu<N>/cpufreq/scaling_governor``: one word (``performance``,
  ``powersave``, ``schedutil``, ``ondemand``...). Absent in most VMs and containers without a
  cpufreq driver: nothing to judge, not a fault.
* ``/sys/class/infiniband/<device>/ports/<port>/state``: ``4: ACTIVE`` (``1: DOWN``, ``2: INIT``,
  ``3: ARMED``, ``5: ACTIVE_DEFER``); ``phys_state``: ``5: LinkUp`` (``3: Disabled``, ``2:
  Polling``...); ``rate``: ``400 Gb/sec (4X NDR)``, ``100 Gb/sec (4X EDR)``, ``25 Gb/sec (1X
  EDR)`` for RoCE; ``link_layer``: ``InfiniBand`` or ``Ethernet`` (RoCE).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

SYSFS = Path("/sys")
RATE = re.compile(r"^\s*(?P<gbps>\d+(?:\.\d+)?)\s*Gb/sec(?:\s*\((?P<what>[^)]*)\))?")
STATE = re.compile(r"^\s*(?P<number>\d+)\s*:\s*(?P<name>\S+)")


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:  # absent, or a port that vanished while we read it
        return None


def cpu_governors(sysfs: Path = SYSFS) -> Dict[int, str]:
    """CPU index -> scaling governor, for every CPU that exposes one (empty without cpufreq)."""
    governors = {}
    for path in sorted((sysfs / "devices" / "system" / "cpu").glob("cpu[0-9]*")):
        governor = _read(path / "cpufreq" / "scaling_governor")
        if governor:
            governors[int(path.name[3:])] = governor
    return governors


@dataclass(frozen=True)
class IbPort:
    """One InfiniBand or RoCE port, as sysfs describes it."""

    device: str  # mlx5_0
    port: int
    state: str  # ACTIVE, DOWN, INIT, ARMED ... ("unknown" when unreadable)
    phys_state: str  # LinkUp, Disabled, Polling ...
    rate_gbps: Optional[float]
    rate_text: str  # "400 Gb/sec (4X NDR)" as the kernel wrote it
    link_layer: str  # InfiniBand or Ethernet

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def active(self) -> bool:
        return self.state in ("ACTIVE", "ACTIVE_DEFER")


def _state_name(text: Optional[str]) -> str:
    match = STATE.match(text or "")
    return match.group("name") if match else (text or "unknown")


def ib_ports(sysfs: Path = SYSFS) -> List[IbPort]:
    """Every port of every InfiniBand / RoCE device (empty when the node has none)."""
    ports = []
    for device in sorted((sysfs / "class" / "infiniband").glob("*")):
        for port_dir in sorted((device / "ports").glob("*"), key=lambda p: p.name):
            if not port_dir.name.isdigit():
                continue
            rate_text = _read(port_dir / "rate") or ""
            rate = RATE.match(rate_text)
            ports.append(
                IbPort(
                    device=device.name,
                    port=int(port_dir.name),
                    state=_state_name(_read(port_dir / "state")),
                    phys_state=_state_name(_read(port_dir / "phys_state")),
                    rate_gbps=float(rate.group("gbps")) if rate else None,
                    rate_text=rate_text,
                    link_layer=_read(port_dir / "link_layer") or "InfiniBand",
                )
            )
    return ports
