"""Shared helpers for the profiling tests: where the real traces are, and building rank sets."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Dict, List, Optional

from torchscale.profiling.analyzers.trace_breakdown import BREAKDOWN_COLUMNS

DATA = Path(__file__).parents[1] / "data"
# Real public traces shipped with the repository (MIT, attribution in their README).
REAL_TRACES = DATA / "hta_traces"


def real_traces_dir() -> Path:
    return REAL_TRACES


def hta_reference() -> Dict[str, Dict[str, float]]:
    """The HTA 0.5.0 figures in tests/data/hta_traces/README.md, parsed from its table."""
    rows = {}
    for line in (real_traces_dir() / "README.md").read_text().splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 9 and cells[0].endswith(".json.gz") and re.match(r"^[\d.]+$", cells[5]):
            keys = [*BREAKDOWN_COLUMNS[1:8], "overlap_pct"]  # README's column order
            rows[cells[0]] = dict(zip(keys, map(float, cells[1:])))
    assert rows, "README table not found"
    return rows


def load_trace_json(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as fh:
        return json.load(fh)


def write_ranks(
    doc: dict,
    folder: Path,
    late_rank: Optional[int],
    ranks: int,
    rename_nccl: bool = False,
    late_fraction: float = 0.5,
) -> List[float]:
    """Write ``ranks`` copies of one rank's trace as rank0..N-1 (same clock).

    ``late_rank`` reaches every NCCL collective late: its kernels start ``late_fraction`` of their
    duration later and end at the same moment (a blocking collective ends when the last rank is
    in). Returns the injected delays (us). ``rename_nccl`` renames ncclKernel_* to the newer
    ncclDevKernel_* naming.
    """
    folder.mkdir(parents=True, exist_ok=True)
    delays: List[float] = []
    for rank in range(ranks):
        events = []
        for ev in doc["traceEvents"]:
            ev = dict(ev)
            name = ev.get("name", "")
            if ev.get("cat") == "kernel" and name.startswith("nccl"):
                if rename_nccl:
                    ev["name"] = re.sub(
                        r"^ncclKernel_(\w+?)_RING_LL_Sum_float\(.*",
                        r"ncclDevKernel_\1_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                        name,
                    )
                if rank == late_rank:
                    delay = late_fraction * ev["dur"]
                    ev["ts"] += delay
                    ev["dur"] -= delay
                    delays.append(delay)
            events.append(ev)
        info = dict(doc.get("distributedInfo") or {}, rank=rank, world_size=ranks)
        out = dict(doc, traceEvents=events, distributedInfo=info)
        (folder / f"rank{rank}.json").write_text(json.dumps(out))
    return delays
