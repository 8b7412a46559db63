"""The use case of ``torchscale project``: a results folder's measured cells fitted and
projected to larger GPU counts, the predictions recorded in the history when one is given."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Hashable, List, Mapping, Optional

from torchscale.app import Notify


@dataclass(frozen=True)
class ProjectRequest:
    source: Path
    targets: List[int]
    gpus_per_node: int
    holdout: bool
    inter_node_gbps: Optional[float]
    history: Optional[str]
    """``--history``; else TORCHSCALE_HISTORY; none: the predictions are not recorded."""


@dataclass(frozen=True)
class ProjectOutcome:
    rows: List[Dict[str, Any]]
    """One prediction per cell and target count (NaN as None), as --json prints them."""
    basis: List[str]
    from_cpu: bool
    """Some rows extrapolate cells measured on CPU processes."""
    holdout_lines: List[str]
    """Per held-out cell: predicted against measured, and why they may differ."""


def _clean(row: Mapping[Hashable, Any]) -> Dict[str, Any]:
    return {str(k): None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}


def project_scaling(request: ProjectRequest, notify: Notify) -> ProjectOutcome:
    """Fit the measured cells of ``request.source`` and predict the target counts."""
    from torchscale.analysis.projection import project as run_projection
    from torchscale.analysis.report_data import load_report_data
    from torchscale.app.history import history_location, record_predictions
    from torchscale.hardware.device_noun import is_cpu

    data = load_report_data(request.source)
    folders = {e.name: e.path for e in data.experiments}
    result = run_projection(
        data.records,
        request.targets,
        request.gpus_per_node,
        request.holdout,
        request.inter_node_gbps,
        folders,
    )
    rows = [_clean(r) for r in result.table.to_dict("records")]
    record_predictions(history_location(request.history), rows, notify)
    held_out = [
        line
        for row in rows
        if request.holdout and row.get("measured_throughput") is not None
        for line in _holdout_lines(row)
    ]
    return ProjectOutcome(
        rows=rows,
        basis=list(result.basis),
        from_cpu=any(is_cpu(row.get("measured_on")) for row in rows),
        holdout_lines=held_out,
    )


def _holdout_lines(row: Dict[str, Any]) -> List[str]:
    """What the held-out cell says: predicted against measured, and why they may differ."""
    from torchscale.analysis.alphabeta import BACK_TO_BACK
    from torchscale.analysis.projection import COMPUTE_DRIFT_LIMIT, CPU_WAIT_LIMIT
    from torchscale.hardware.device_noun import count_text

    at = count_text(row["world_size"], row.get("measured_on"))
    lines = [
        f"> [INFO] Holdout {row['model']} · {row['variant']} at {at}: predicted "
        f"{row['throughput']:,.0f}, measured {row['measured_throughput']:,.0f} {row['unit']}/s "
        f"({100 * row['error']:+.1f}%)"
    ]
    waits = [w for w in (row.get("cpu_wait_share"), row.get("reference_cpu_wait_share")) if w]
    if max(waits, default=0.0) > CPU_WAIT_LIMIT:
        lines.append(
            f"> [WARN] A rank waited for a CPU for {max(waits):.0%} of a measured window "
            "(runnable, not running): the host was oversubscribed while these cells ran, so "
            "measured and predicted are not comparable."
        )
    comm = row.get("measured_comm_ms")
    if comm and row["comm_ms"] and comm > 2 * row["comm_ms"]:
        why = (
            "the back-to-back micro-benchmark understates the fabric as DDP uses it: set "
            "'communication: {through_ddp: true}' to time each all-reduce through DDP's own "
            "reducer"
            if row.get("all_reduce_timing") == BACK_TO_BACK
            else f"timed {row.get('all_reduce_timing')}, the communication cells still "
            "understate it"
        )
        lines.append(
            f"> [WARN] DDP's own all-reduce took {comm:.3g} ms per step at {at}, "
            f"{comm / row['comm_ms']:.1f}x the {row['comm_ms']:.3g} ms the communication cells' "
            f"fit gives: {why} (docs/projection.md)."
        )
    drift = row.get("compute_drift")
    if drift is not None and abs(drift) > COMPUTE_DRIFT_LIMIT:
        start = count_text(row["from_gpus"], row.get("measured_on"))
        lines.append(
            f"> [WARN] The compute-only step measured at {at} is {100 * drift:+.0f}% off the "
            f"one on {start} the projection starts from: the node itself ran differently (a "
            "busier machine, shared cores), which no projection foresees; with the held-out "
            "cell's own compute-only step the prediction is "
            f"{100 * row['error_at_measured_compute']:+.1f}% off."
        )
    return lines
