"""Traces built from a real one with a known change planted (standard library only: the script
that records HTA's figures runs it in HTA's own virtualenv, without torchscale).

``plant_slow_kernel``: a copy in which every launch of one kernel takes longer by a fixed factor,
for ``profile diff`` of a run against itself (the planted kernel must come first).
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any, Dict, Tuple

SLOW_FACTOR = 3.0


def read(path: Path) -> Dict[str, Any]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as fh:
        doc: Dict[str, Any] = json.load(fh)
    return doc


def planted_kernel(doc: Dict[str, Any]) -> str:
    """The kernel to slow down: a compute kernel of middling total time (not the largest: the
    diff must find it by its change, not by its size), the same choice every time."""
    totals: Counter = Counter()
    for event in doc["traceEvents"]:
        if event.get("cat") == "kernel" and not str(event.get("name", "")).startswith("nccl"):
            totals[event["name"]] += float(event.get("dur", 0))  # type: ignore[assignment]  # a Counter of float sums
    ranked = [name for name, _ in totals.most_common()]
    return ranked[min(4, len(ranked) - 1)]


def plant_slow_kernel(source: Path, target: Path, factor: float = SLOW_FACTOR) -> Tuple[str, int]:
    """Write ``source`` with every run of one kernel ``factor`` times longer to ``target``
    (a ``.json``); return the kernel's name and how many runs were slowed."""
    doc = read(source)
    name = planted_kernel(doc)
    slowed = 0
    for event in doc["traceEvents"]:
        if event.get("cat") == "kernel" and event.get("name") == name and "dur" in event:
            event["dur"] = round(event["dur"] * factor, 3)
            slowed += 1
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(doc))
    return name, slowed
