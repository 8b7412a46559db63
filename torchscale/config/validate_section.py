"""The ``validation:`` section of a benchmark YAML: how long ``torchscale validate --level 2|3``
measures, and the thresholds that turn its figures into PASS / WARN / FAIL.

Torch-free, like the rest of the config: ``torchscale benchmark`` accepts (and ignores) the
section, so one file serves both commands; ``torchscale validate --config FILE`` reads only it.
"""

from __future__ import annotations

from typing import Any

from pydantic import (
    Field,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from torchscale.config.base import StrictModel


class Bar(StrictModel):
    """A ratio below ``warn`` is WARN, below ``fail`` FAIL (1.0 = as expected)."""

    warn: float = Field(gt=0, le=1, description="WARN below this ratio.")
    fail: float = Field(gt=0, le=1, description="FAIL below this ratio.")

    @model_validator(mode="after")
    def _ordered(self) -> Bar:
        if self.fail > self.warn:
            raise ValueError(f"fail ({self.fail:g}) must not be above warn ({self.warn:g})")
        return self


def _ratio(default: float, what: str) -> Any:
    return Field(default, gt=0, le=1, description=f"{what} below this ratio.")


class ExpectedBar(Bar):
    warn: float = _ratio(0.85, "WARN")
    fail: float = _ratio(0.7, "FAIL")


class PeersBar(Bar):
    warn: float = _ratio(0.9, "WARN")
    fail: float = _ratio(0.75, "FAIL")


class DriftBar(Bar):
    warn: float = _ratio(0.9, "WARN")
    fail: float = _ratio(0.8, "FAIL")


class LinksBar(Bar):
    warn: float = _ratio(0.5, "WARN")
    fail: float = _ratio(0.25, "FAIL")


class FleetBar(Bar):
    """Fleet outliers: below a share of the fleet median, or beyond ``mads`` median absolute
    deviations below it."""

    warn: float = _ratio(0.8, "WARN")
    fail: float = _ratio(0.6, "FAIL")
    mads: PositiveFloat = Field(4.0, description="WARN beyond this many scaled MADs.")
    mad_floor: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Smallest MAD counted, as a share of the median: identical figures do not "
        "make every small difference an outlier.",
    )


SECONDS_RANGE = {
    "window_s": (0.01, 60.0),
    "sustained_s": (0.1, 86400.0),
    "sample_interval_s": (0.01, 60.0),
    "link_s": (0.01, 600.0),
}
"""The durations validate accepts, seconds: shorter is below the clock's resolution (a window
of 1e-12 s times nothing), longer never ends in a run anyone waits for (a window of 1e300 s)."""


def _range(key: str) -> str:
    low, high = SECONDS_RANGE[key]
    return f" ({low:g} to {high:g})"


class ValidateSection(StrictModel):
    """How ``torchscale validate`` measures at levels 2 and 3 (docs/validate.md)."""

    window_s: PositiveFloat = Field(
        0.25, description=f"Length of one timed window of a probe, seconds{_range('window_s')}."
    )
    busy_share: float = Field(
        0.25,
        gt=0,
        le=1,
        description="Level 1: WARN when other processes keep more than this share of the node's "
        "cores busy (a busy host: its figures are not judged).",
    )
    repeats: PositiveInt = Field(
        3, description="Timed windows per probe; the best counts (interference only slows)."
    )
    gemm_size: PositiveInt = Field(8192, description="GPU GEMM size n (n x n by n x n).")
    cpu_gemm_size: PositiveInt = Field(512, description="CPU GEMM size n.")
    copy_mib: PositiveInt = Field(1024, description="GPU memory-copy buffer, MiB.")
    cpu_copy_mib: PositiveInt = Field(64, description="CPU memory-copy buffer, MiB.")
    host_copy_mib: PositiveInt = Field(256, description="Pinned host <-> GPU buffer, MiB.")
    p2p_mib: PositiveInt = Field(256, description="GPU-to-GPU (P2P) copy buffer, MiB.")
    max_cpu_devices: PositiveInt = Field(
        8, description="CPU slots probed, at most (on CPU every slot is a device)."
    )
    sustained_s: PositiveFloat = Field(
        60.0,
        description="Level 3: seconds of sustained GEMM and copy load per device"
        f"{_range('sustained_s')}.",
    )
    sample_interval_s: PositiveFloat = Field(
        0.5,
        description="Level 3: seconds between clock/temperature/power samples"
        f"{_range('sample_interval_s')}.",
    )
    link_mib: float = Field(
        4.0, gt=0, description="Fleet: message size of the pairwise send/recv, MiB."
    )
    link_s: PositiveFloat = Field(
        0.5, description=f"Fleet: seconds of ping-pong per link{_range('link_s')}."
    )
    expected: ExpectedBar = Field(
        default_factory=ExpectedBar,
        description="A figure against the SKU's expected figure (hardware/expected_figures.py).",
    )
    peers: PeersBar = Field(
        default_factory=PeersBar,
        description="A device against the median of the node's other devices.",
    )
    drift: DriftBar = Field(
        default_factory=DriftBar,
        description="Level 3: the last third of the run against the first.",
    )
    fleet: FleetBar = Field(
        default_factory=FleetBar,
        description="Fleet: a device's figure against the fleet median of that probe.",
    )
    links: LinksBar = Field(
        default_factory=LinksBar,
        description="Fleet: a link against what its two nodes reach on their best link, and a "
        "node's best link against the fleet median.",
    )

    @field_validator(*SECONDS_RANGE)
    @classmethod
    def _seconds_in_range(cls, value: float, info: ValidationInfo) -> float:
        low, high = SECONDS_RANGE[str(info.field_name)]
        if not low <= value <= high:
            raise ValueError(f"must be between {low:g} and {high:g} seconds")
        return value
