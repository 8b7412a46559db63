"""Which rows of one nsys export belong to which rank.

``nsys profile torchrun ...`` (the usual way to profile a node) writes every rank's process into
one file: several processes, each driving its own CUDA device. Merged, two GPUs look like one rank
whose NCCL kernels overlap the *other* GPU's compute. So the file is split into one unit per
(process, CUDA device) seen on GPU rows; a process's CPU rows (NVTX step ranges) go with each of
its units.

A unit's rank number comes from, in order:

1. ``nvtx``: the process marked its rank in NVTX (torchscale's worker emits
   ``torchscale rank=<RANK> world_size=<WORLD_SIZE>``, from torchrun's environment), when every
   unit of the file has one and they differ;
2. ``device``: the CUDA device id (torchrun's rank = local rank = device on one node), when the
   units' devices differ;
3. ``order``: the units' order (process id, then device).

A file with one unit keeps rank -1 unless NVTX says otherwise: the loader then takes the rank from
the file name (``rank3.sqlite``) or the file's position, as for any per-rank trace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from torchscale.plan.profile_request import RANK_MARK_FORMAT

__all__ = ["RANK_MARK", "RANK_MARK_FORMAT", "Unit", "split_units"]

RANK_MARK = re.compile(r"^(?:torchscale\s+)?rank\s*[=:#_ ]\s*(\d+)\b", re.IGNORECASE)
DEVICE_SPAN = 1 << 20
WORLD_SIZE_MARK = re.compile(r"\bworld_size\s*=\s*(\d+)\b", re.IGNORECASE)


@dataclass
class Unit:
    """One rank's share of an export: its row indices, its rank and where the rank came from."""

    rows: Union[np.ndarray, slice]  # row indices, or every row (a file with one unit)
    rank: int
    metadata: Dict[str, object] = field(default_factory=dict)


def _marked(texts: Sequence[str]) -> Tuple[Optional[int], Optional[int]]:
    """(rank, world size) from a process's NVTX texts, None where none says."""
    rank = world = None
    for text in texts:
        match = RANK_MARK.match(text.strip())
        if match and rank is None:
            rank = int(match.group(1))
            sized = WORLD_SIZE_MARK.search(text)
            world = int(sized.group(1)) if sized else None
    return rank, world


def split_units(
    pid: np.ndarray,
    device: np.ndarray,
    stream: np.ndarray,
    marks: Dict[int, List[str]],
    gpus: List[Tuple[int, str]],
) -> List[Unit]:
    """Split the rows of one export into units (see the module docstring)."""
    pid, device = pid.astype(np.int64), device.astype(np.int64)
    on_gpu = stream != -1
    # pids are 24-bit and device ids small: one int64 per (process, device), unique in numpy
    packed = np.unique(pid[on_gpu] * DEVICE_SPAN + device[on_gpu])
    keys = [(int(k // DEVICE_SPAN), int(k % DEVICE_SPAN)) for k in packed]
    names = dict(gpus)
    if len(keys) <= 1:
        p, d = keys[0] if keys else (None, None)
        rank, world = _marked(marks.get(p, [])) if p is not None else (None, None)
        if rank is None and len(marks) == 1:  # pid unknown on GPU rows: the one marked process
            rank, world = _marked(next(iter(marks.values())))
        meta = _meta(p, d, names, "nvtx" if rank is not None else None, world)
        return [Unit(slice(None), -1 if rank is None else rank, meta)]
    pids_known = any(p for p, _ in keys)
    cpu_pids = set(np.unique(pid[~on_gpu]).tolist())
    units = []
    for p, d in keys:
        rows = on_gpu & (pid == p) & (device == d)
        if pids_known:
            rows |= ~on_gpu & (pid == p)
        elif len(cpu_pids) == 1:  # no process ids on GPU rows: one host process drives them all
            rows |= ~on_gpu
        units.append(Unit(np.flatnonzero(rows), -1, {"pid": p, "device": d}))
    marked = [_marked(marks.get(p, [])) for p, _ in keys]
    ranks = [r for r, _ in marked]
    devices = [d for _, d in keys]
    if None not in ranks and len(set(ranks)) == len(ranks):
        source, numbers = "nvtx", [int(r) for r in ranks if r is not None]
    elif len(set(devices)) == len(devices):
        source, numbers = "device", devices
    else:
        source, numbers = "order", list(range(len(keys)))
    for unit, number, (p, d), (_, world) in zip(units, numbers, keys, marked):
        unit.rank = number
        unit.metadata = _meta(p, d, names, source, world)
    return units


def _meta(
    pid: Optional[int],
    device: Optional[int],
    names: Dict[int, str],
    rank_source: Optional[str],
    world_size: Optional[int],
) -> Dict[str, object]:
    meta: Dict[str, object] = {
        "pid": pid,
        "device": device,
        "gpus": [(device, names[device])] if device in names else [],
    }
    if rank_source:
        meta["rank_source"] = rank_source
    if world_size is not None:
        meta["world_size"] = world_size
    return meta
