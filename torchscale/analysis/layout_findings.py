"""A convolutional model trained on GPUs in NCHW: the layout finding.

cuDNN's fast convolution kernels on tensor-core GPUs want NHWC (``channels_last``). A vision
model run on CUDA without it leaves most of its speed unused: ResNet-50, bf16, batch 256 on one
H100 went from 2,208 to 3,901 img/s with ``channels_last`` alone (docs/perf-gpu.md), yet the
seed's own config asks for neither. Where the same results hold the configuration with
``channels_last`` on, the gain quoted is the one measured there; otherwise the H100 figure.
CPU processes are left out: oneDNN's own layouts make the answer there a different question.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple

from torchscale.analysis.finding import Finding, Severity
from torchscale.config.row_identity import configuration_key
from torchscale.hardware.device_noun import CUDA, record_device_kind
from torchscale.results.schema import ResultBase, TrainingResult

EXPECTED_GAIN = 3900.5 / 2207.8
"""ResNet-50, bf16, batch 256, one H100 (2026-11-22, docs/perf-gpu.md): channels_last / NCHW."""
EXPECTED_GAIN_SOURCE = "ResNet-50, bf16, batch 256 on one H100: 2,208 -> 3,901 img/s"

ADVICE = (
    "Set channels_last: true (model.channels_last in the GPU Training Benchmark Suite's layout) "
    "for this model, or let "
    "`torchscale tune` try it (its channels_last knob); the math is the same, only the memory "
    "layout of activations and weights changes."
)

Setting = Tuple[str, int, str]
"""What two cells share when they differ only in layout: experiment, ranks, and every other
setting (``config.row_identity``'s configuration without channels_last)."""


def _setting(record: TrainingResult) -> Setting:
    others = {k: v for k, v in (record.settings or {}).items() if k != "channels_last"}
    return (record.experiment, record.world_size, configuration_key(others))


def _nchw_on_cuda(record: ResultBase) -> bool:
    """A training cell that ran on GPUs, whose model takes channels_last, without it."""
    if not isinstance(record, TrainingResult) or record.status != "ok":
        return False
    runtime = record.runtime or {}
    return (
        record_device_kind(record) == CUDA
        and runtime.get("channels_last_applies") is True
        and runtime.get("channels_last") is False
    )


def channels_last_findings(records: Iterable[ResultBase]) -> List[Dict[str, Any]]:
    """One finding per experiment and model that trained a convolutional model on GPUs in NCHW,
    with the gain measured beside it (the same cell with channels_last) or the H100 figure."""
    records = list(records)
    nhwc: Dict[Setting, List[float]] = {}
    for record in records:
        if (
            isinstance(record, TrainingResult)
            and record.status == "ok"
            and (record.runtime or {}).get("channels_last") is True
            and record.samples_per_s
        ):
            nhwc.setdefault(_setting(record), []).append(record.samples_per_s)
    groups: Dict[Tuple[str, str], List[TrainingResult]] = {}
    for record in records:
        if _nchw_on_cuda(record):
            assert isinstance(record, TrainingResult)
            groups.setdefault((record.experiment, record.model), []).append(record)
    found = []
    for (experiment, model), cells in sorted(groups.items()):
        measured = _measured_gain(cells, nhwc)
        if measured is not None and measured < 1.05:
            continue  # measured here: NHWC does not pay for this model on this device
        gain = (
            f"measured here: {measured:.2f}x the throughput with channels_last"
            if measured is not None
            else f"expected about {EXPECTED_GAIN:.2f}x ({EXPECTED_GAIN_SOURCE})"
        )
        finding = Finding(
            severity=Severity.MEDIUM,
            category="layout",
            title=f"{model} trained in NCHW on GPUs (channels_last off)",
            message=f"{len(cells)} cell(s) ran without channels_last; {gain}.",
            recommendation=ADVICE,
            source=cells[0].cell_id + (f" (+{len(cells) - 1} cells)" if len(cells) > 1 else ""),
            experiment=experiment,
        )
        found.append(finding.to_row())
    return found


def _measured_gain(
    cells: List[TrainingResult], nhwc: Dict[Setting, List[float]]
) -> Optional[float]:
    """The best ratio of a channels_last cell's throughput to the same setting's NCHW one."""
    ratios = [
        max(nhwc[_setting(cell)]) / cell.samples_per_s
        for cell in cells
        if _setting(cell) in nhwc and cell.samples_per_s
    ]
    return max(ratios) if ratios else None
