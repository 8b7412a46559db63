"""The use case of ``torchscale compare OLD NEW``: two result folders, read and compared cell by
cell against the run-to-run noise, with the ``profile diff`` commands of each regressed cell
traced in both runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

from torchscale.app import Notify
from torchscale.errors import TorchscaleError

if TYPE_CHECKING:
    from torchscale.analysis.comparison import Comparison
    from torchscale.analysis.report_data import ReportData


@dataclass(frozen=True)
class CompareRequest:
    old: Path
    new: Path
    threshold_pct: float
    resamples: int
    seed: int
    noise_floor_pct: Optional[float]
    allow_device_change: bool
    allow_unjudged: bool


@dataclass(frozen=True)
class CompareOutcome:
    comparison: Comparison
    device_changes: List[str]
    """Cells that ran on different devices or backends (compared only when allowed)."""
    profile_diff_commands: List[str]
    device_kind: Optional[str]
    """The devices both runs measured, as ``hardware.device_noun`` names them."""


def _diff_commands(result: Comparison, old: ReportData, new: ReportData) -> List[str]:
    """``torchscale profile diff`` for each regressed cell traced in both runs: from the verdict
    to the kernels and ops that moved."""
    if result.regressions.empty:
        return []
    from torchscale.profiling.diff_links import diff_commands

    cells = result.regressions
    return diff_commands(
        [(e.path, e.records) for e in old.experiments],
        [(e.path, e.records) for e in new.experiments],
        zip(cells["cell_id_old"], cells["cell_id_new"]),
    )


def compare_results(request: CompareRequest, warn: Notify) -> CompareOutcome:
    """Compare NEW with OLD. Refused (one line): runs of different devices unless allowed, and
    runs that share no cell. ``warn`` gets one line per cell compared across devices."""
    from torchscale.analysis.comparison import CompareOptions, compare_runs
    from torchscale.analysis.device_change import device_changes
    from torchscale.analysis.report_data import load_report_data
    from torchscale.hardware.device_noun import records_device_kind

    old, new = request.old, request.new
    options = CompareOptions(
        threshold_pct=request.threshold_pct,
        resamples=request.resamples,
        seed=request.seed,
        noise_floor_pct=request.noise_floor_pct,
        allow_unjudged=request.allow_unjudged,
    ).checked()
    old_data, new_data = load_report_data(old, "OLD"), load_report_data(new, "NEW")
    old_records, new_records = old_data.records, new_data.records
    changes = device_changes(old_records, new_records)
    if changes and not request.allow_device_change:
        more = f"; and {len(changes) - 1} more cell(s)" if len(changes) > 1 else ""
        raise TorchscaleError(
            f"{old} and {new} ran on different devices or backends ({changes[0]}{more}): "
            "the change would be the hardware's; compare runs of one device, or pass "
            "--allow-device-change"
        )
    for line in changes:
        warn(f"> [WARN] compared across devices: {line}")
    result = compare_runs(old_records, new_records, options)
    if result.cells.empty or not result.shared:
        raise TorchscaleError(
            f"no cell of {new} matches a cell of {old} (same model, settings and GPU count); "
            "compare runs of the same configuration"
        )
    return CompareOutcome(
        comparison=result,
        device_changes=changes,
        profile_diff_commands=_diff_commands(result, old_data, new_data),
        device_kind=records_device_kind([*old_records, *new_records]),
    )
