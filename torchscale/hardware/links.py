"""Peak unidirectional bandwidth of GPU interconnects: the one table busbw is compared against.

nccl-tests' busbw measures what one rank's link carries in one direction, so the peak is the
per-direction figure: NVLink ``links x per-link GB/s``, PCIe ``lanes x per-lane GB/s`` after line
encoding. Vendors quote NVLink totals bidirectionally (H100: 900 GB/s = 2 x 18 x 25 GB/s).

A link is written ``nvlink<generation>[x<links>]`` (``nvlink4x18``) or ``pcie<gen>x<width>``
(``pcie4x16``). Without a link count, NVLink takes the usual count of that generation's SXM parts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

# NVLink generation -> (GB/s per link per direction, links of the generation's SXM GPUs).
NVLINK_PER_LINK_GBPS = {
    1: (20.0, 4),  # P100
    2: (25.0, 6),  # V100
    3: (25.0, 12),  # A100
    4: (25.0, 18),  # H100 / H200
    5: (50.0, 18),  # B200
}

# PCIe generation -> (transfer rate GT/s, encoding efficiency): per-lane GB/s = rate x eff / 8.
PCIE_RATE = {
    1: (2.5, 8 / 10),
    2: (5.0, 8 / 10),
    3: (8.0, 128 / 130),
    4: (16.0, 128 / 130),
    5: (32.0, 128 / 130),
    6: (64.0, 242 / 256),  # PAM4 with FLIT mode: 242 payload bytes per 256-byte FLIT
}

_LINK = re.compile(r"^(nvlink|pcie)(\d+)(?:x(\d+))?$")


@dataclass(frozen=True)
class Link:
    """One GPU's interconnect: NVLink (generation, links) or PCIe (generation, lanes)."""

    kind: str  # "nvlink" or "pcie"
    generation: int
    width: int  # NVLinks per GPU, or PCIe lanes

    def __str__(self) -> str:
        return f"{self.kind}{self.generation}x{self.width}"


def parse_link(text: str) -> Link:
    """``nvlink4x18`` / ``nvlink4`` / ``pcie5x16`` -> :class:`Link` (ValueError when unknown)."""
    match = _LINK.match(text.strip().lower().replace("gen", "").replace(" ", ""))
    if not match:
        raise ValueError(
            f"link {text!r} is not known: write nvlink<gen>[x<links>] (e.g. nvlink4x18) "
            "or pcie<gen>x<lanes> (e.g. pcie4x16)"
        )
    kind, generation = match.group(1), int(match.group(2))
    table = NVLINK_PER_LINK_GBPS if kind == "nvlink" else PCIE_RATE
    if generation not in table:
        raise ValueError(f"{kind} generation {generation} is not known (known: {sorted(table)})")
    if match.group(3):
        width = int(match.group(3))
    elif kind == "nvlink":
        width = NVLINK_PER_LINK_GBPS[generation][1]
    else:
        raise ValueError(f"link {text!r} needs a lane count, e.g. pcie{generation}x16")
    if width <= 0:
        raise ValueError(f"link {text!r} needs a positive link or lane count")
    return Link(kind, generation, width)


def pcie_lane_gbps(generation: int) -> float:
    """Per-lane, per-direction PCIe bandwidth in GB/s after line encoding."""
    rate, efficiency = PCIE_RATE[generation]
    return rate * efficiency / 8


def link_peak_gbps(link: Link) -> float:
    """Peak unidirectional GB/s of ``link``: what a perfect busbw would reach."""
    if link.kind == "nvlink":
        return NVLINK_PER_LINK_GBPS[link.generation][0] * link.width
    return pcie_lane_gbps(link.generation) * link.width


def peak_fraction(busbw_gbps: Optional[float], link: Optional[Link]) -> Optional[float]:
    """busbw as a fraction of the link's peak; None when either is unknown."""
    if busbw_gbps is None or link is None:
        return None
    return busbw_gbps / link_peak_gbps(link)
